/*
 * backend.h - the seam between the engine and execution backends.
 *
 * Backends never see graph structure.  The engine offers them *tasks* (a
 * GEMM with strides; later an elementwise map, a reduction, a windowed
 * product), down a chain of registered backends that the request's
 * numerics allows: an `exact` request is offered only to backends of
 * exact fidelity, which promise the reference's bits (numerics.md); a
 * `fast` request also to `envelope` backends, which promise the declared
 * error envelope.  Whatever every backend declines runs on the reference
 * kernels.  A backend is a small struct of function pointers, like
 * ggml-backend's; registering one never changes a result under `exact`.
 */
#ifndef TOPOS_BACKEND_H
#define TOPOS_BACKEND_H

#include "topos.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum topos_fidelity {
  TOPOS_FIDELITY_EXACT = 0,   /* the reference's bits, for every input */
  TOPOS_FIDELITY_ENVELOPE = 1 /* within numerics.md's fast-posture envelope */
} topos_fidelity;

typedef enum topos_task_kind { TOPOS_TASK_GEMM = 0 } topos_task_kind;

/*
 * C[b] = A[b]·B[b] for b < batch: A is m×k, B is k×n, C is m×n, each
 * addressed by element strides (row, column; batch), so transposed and
 * narrowed views arrive as they are.  dtype is f32 or f64; the exact
 * contract per output is the fma chain over k in order from +0.0.  C is
 * written, never read.
 */
typedef struct topos_gemm_task {
  topos_dtype dtype;
  int64_t batch, m, n, k;
  const void *a;
  int64_t a_row, a_col, a_batch;
  const void *b;
  int64_t b_row, b_col, b_batch;
  void *c;
  int64_t c_row, c_col, c_batch;
} topos_gemm_task;

typedef struct topos_task {
  topos_task_kind kind;
  int threads; /* the most threads the task may use (>= 1) */
  union {
    topos_gemm_task gemm;
  } u;
} topos_task;

typedef struct topos_backend topos_backend;
struct topos_backend {
  const char *name;
  topos_fidelity fidelity;
  /* Whether run() will take this task (shape, dtype, size thresholds). */
  bool (*supports)(const topos_backend *self, const topos_task *task);
  /* Runs the task; a non-zero topos_status makes the engine fall back to
   * the reference kernel (and is never seen by the caller). */
  int (*run)(const topos_backend *self, const topos_task *task,
             topos_error *err);
  void *ctx;
};

/* Appends a backend to the chain (the struct must outlive the process's
 * use of the engine).  Thread-safe; returns a topos_status. */
int topos_backend_register(const topos_backend *backend);
/* The registered backends in chain order: the count, and one by index. */
int topos_backend_count(void);
const topos_backend *topos_backend_at(int index);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_BACKEND_H */
