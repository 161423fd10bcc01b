/*
 * kernels.h - the CUDA kernels' launchers (kernels.cu), called by the
 * plugin's host code (plugin.c) with device pointers.
 *
 * Every exact kernel computes numerics.md's arithmetic per output: a
 * product is one fma chain over k in order from +0.0 (threads and tiles
 * split outputs, never k), a sum is the striped-16 order with its
 * pairwise tree, a map is the reference's IEEE operation per element
 * (exp, log, tanh as exact_math.h's replay of the C library).  Each
 * kernel raises *nan_flag when it writes a NaN: NaN payloads are the one
 * thing a GPU does not reproduce (it makes canonical NaNs), so the plugin
 * hands such a task back and the reference computes it.
 *
 * Launchers enqueue on `stream` and return a cudaError_t as int (0: ok).
 */
#ifndef TOPOS_CUDA_KERNELS_H
#define TOPOS_CUDA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_gemm_args {
  bool f64;
  int64_t batch, m, n, k;
  const void *a; /* device; element strides as in topos_gemm_task */
  int64_t a_row, a_col, a_batch;
  const void *b;
  int64_t b_row, b_col, b_batch;
  void *c; /* dense row-major: c_row = n, c_batch = m*n */
} cuda_gemm_args;

typedef struct cuda_window_args {
  bool f64;
  int64_t n, c, h, w; /* x contiguous [n, c, h, w] */
  const void *x;
  int64_t o;
  const void *weight;
  int64_t w_row, w_col;
  int64_t kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
  int64_t oh, ow;
  void *out; /* [n*oh*ow, o] row-major */
} cuda_window_args;

/* backend.h's topos_attention_task with device pointers: q [batch, t, dh],
 * k the transposed keys [batch, dh, s], v [batch, s, dv], scale and mask
 * [batch, t, s] (NULL: no step), each by element strides; out [batch, t,
 * dv] and the optional rows [batch, t, s] dense; `rows` scratch of
 * batch*t*s elements. */
typedef struct cuda_attention_args {
  bool f64;
  int64_t batch, t, s, dh, dv;
  const void *q;
  int64_t q_batch, q_row, q_col;
  const void *k;
  int64_t k_batch, k_row, k_col;
  const void *v;
  int64_t v_batch, v_row, v_col;
  const void *scale;
  int64_t scale_batch, scale_row, scale_col;
  const void *mask;
  int64_t mask_batch, mask_row, mask_col;
  void *out;
  void *raw, *scaled, *masked, *logp, *probs;
  void *rows;
} cuda_attention_args;

/* The map ops, numbered as backend.h's topos_map_op. */
int cuda_gemm_exact(const cuda_gemm_args *g, unsigned *nan_flag, void *stream);
int cuda_window_exact(const cuda_window_args *w, unsigned *nan_flag,
                      void *stream);
int cuda_reduce_exact(bool f64, const void *x, void *y, int64_t outer,
                      int64_t L, int64_t inner, unsigned *nan_flag,
                      void *stream);
int cuda_map_exact(bool f64, int op, const void *a, const void *b, void *y,
                   int64_t n, unsigned *nan_flag, void *stream);
/* f32 only (exp and log are exact_math.h's). */
int cuda_attention_exact(const cuda_attention_args *a, unsigned *nan_flag,
                         void *stream);
/* Whether cuda_map_exact computes op in this dtype (exp, log and tanh in
 * f32 only; pow in neither). */
bool cuda_map_supported(bool f64, int op);

/* For the fast posture: over x[0..count), raises *bad when an element is
 * NaN or infinite and keeps the largest |x| in *max_bits (the float's or
 * double's bit pattern, which orders like the value for |x|). */
int cuda_scan(bool f64, const void *x, int64_t count, unsigned *bad,
              unsigned long long *max_bits, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CUDA_KERNELS_H */
