/*
 * backend.h - the seam between the engine and execution backends.
 *
 * Backends never see graph structure.  The engine's dispatch (exec.c)
 * offers them *tasks* (a GEMM with strides, an elementwise map, a
 * reduction, a windowed product, an attention chain) down the chain a
 * run's context resolves to (topos.h, topos_exec): an `exact` run is
 * offered only to backends of exact fidelity, which promise the
 * reference's bits (numerics.md); a `fast` run also to `envelope`
 * backends, which promise the declared error envelope.  Whatever every
 * backend declines runs on the reference kernels (kernels.c), which know
 * nothing of backends.  A backend is a small struct of function pointers,
 * like ggml-backend's; registering one never changes a result under
 * `exact`.
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

typedef enum topos_task_kind {
  TOPOS_TASK_GEMM = 0,
  TOPOS_TASK_WINDOW,    /* topos_window_task: the fused convolution */
  TOPOS_TASK_REDUCE,    /* topos_reduce_task: sums in the striped-16 order */
  TOPOS_TASK_MAP,       /* topos_map_task: an elementwise map */
  TOPOS_TASK_ATTENTION, /* topos_attention_task: the fused attention chain */
  TOPOS_TASK_UNITS,     /* topos_units_task: independent units of a kernel */
  TOPOS_TASK_COUNT
} topos_task_kind;

/*
 * C[b] = A[b]·B[b] for b < batch: A is m×k, B is k×n, C is m×n, each
 * addressed by element strides (row, column; batch), so transposed and
 * narrowed views arrive as they are.  dtype is f32, f64 or bf16; the
 * exact contract per output is the fma chain over k in order from +0.0.
 * C is written, never read.  bf16: A and B hold bf16 bit patterns
 * (uint16_t elements, the strides in those), C is float - each operand
 * widened exactly to f32, the chain in f32, and the engine rounds C once
 * to bf16 (numerics.md).  A backend that does not know this form must
 * decline bf16 products.
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

/*
 * The fused convolution's direct windowed product: x is contiguous
 * [n, c, h, w]; the weight is addressed by element strides (w_row over
 * kk = (c, a, b) in that order, c·kh·kw of them; w_col over the o
 * outputs); out is [n·oh·ow, o] row-major, written, never read.  Output
 * (ni, oi, oj) reads x at row oi·stride_h + a·dil_h - pad_top, column
 * oj·stride_w + b·dil_w - pad_left, 0 outside.  dtype is f32 or f64; the
 * exact contract per output is the fma chain over kk in order from +0.0,
 * padded positions included (as fma with 0).
 */
typedef struct topos_window_task {
  topos_dtype dtype;
  int64_t n, c, h, w;
  const void *x;
  int64_t o;
  const void *weight;
  int64_t w_row, w_col;
  int64_t kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left;
  int64_t oh, ow;
  void *out;
} topos_window_task;

/*
 * y[o, i] = the striped-16 sum (numerics.md) of x[o, 0..L), i] for
 * o < outer, i < inner: x is contiguous [outer, L, inner], y contiguous
 * [outer, inner], written, never read.  dtype is f32 or f64.  L == 0
 * gives +0.0.
 */
typedef struct topos_reduce_task {
  topos_dtype dtype;
  int64_t outer, L, inner;
  const void *x;
  void *y;
} topos_reduce_task;

/* The elementwise ops of a map task; each element's arithmetic is the
 * reference's (numerics.md: libm once per element for exp, log, tanh,
 * pow). */
typedef enum topos_map_op {
  TOPOS_MAP_NEG = 0,
  TOPOS_MAP_EXP,
  TOPOS_MAP_LOG,
  TOPOS_MAP_SQRT,
  TOPOS_MAP_TANH,
  TOPOS_MAP_POW, /* x^p */
  TOPOS_MAP_RELU,
  TOPOS_MAP_ADD, /* binary from here on: y = a op b */
  TOPOS_MAP_SUB,
  TOPOS_MAP_MUL,
  TOPOS_MAP_DIV,
  TOPOS_MAP_MAXIMUM,
  TOPOS_MAP_STEP,
  TOPOS_MAP_COUNT
} topos_map_op;

/* y[i] = op(a[i]) (unary) or op(a[i], b[i]) (binary) for i < n; a, b and
 * y contiguous arrays of dtype (f32 or f64), y written, never read. */
typedef struct topos_map_task {
  topos_dtype dtype;
  topos_map_op op;
  double p; /* the exponent of TOPOS_MAP_POW */
  int64_t n;
  const void *a, *b;
  void *y;
} topos_map_task;

/*
 * The attention chain of plans (plan.c): for each matrix b < batch and
 * query row i < t, with j < s over keys and c over head features,
 *
 *   raw[j]    = the fma chain over c < dh of q[b,i,c]·k[b,c,j], from +0.0
 *   scaled[j] = raw[j] * scale[b,i,j]          (scale NULL: raw)
 *   masked[j] = scaled[j] + mask[b,i,j]         (mask NULL: scaled)
 *   logp[j]   = log_softmax of the row masked[0..s): shift = the row's
 *               maximum (its first NaN if any; 0 when infinite), sum =
 *               the striped-16 sum of exp(masked[j] - shift), logp[j] =
 *               (masked[j] - shift) - log(sum)
 *   probs[j]  = exp(logp[j])
 *   out[b,i,c] = the fma chain over j < s of probs[j]·v[b,j,c], from +0.0
 *
 * each step the reference kernel's arithmetic (numerics.md: libm once per
 * exp and log).  Operands are addressed by element strides (batch, row,
 * column); k is the transposed keys [batch, dh, s], v is [batch, s, dv],
 * scale and mask [batch, t, s] (stride 0 repeats: a broadcast).  out is
 * [batch, t, dv] row-major, written, never read.  The five row arrays are
 * optional outputs [batch, t, s] row-major, written when not NULL: the
 * values a training plan keeps for backward (or a caller observes).
 * dtype is f32 or f64; every extent is >= 1.
 */
typedef struct topos_attention_task {
  topos_dtype dtype;
  int64_t batch, t, s, dh, dv;
  const void *q;
  int64_t q_batch, q_row, q_col;
  const void *k;
  int64_t k_batch, k_row, k_col;
  const void *v;
  int64_t v_batch, v_row, v_col;
  const void *scale; /* NULL: no scaling step */
  int64_t scale_batch, scale_row, scale_col;
  const void *mask; /* NULL: no mask step */
  int64_t mask_batch, mask_row, mask_col;
  void *out;
  void *raw, *scaled, *masked, *logp, *probs; /* each NULL or written */
} topos_attention_task;

/*
 * Units of one reference kernel's work (the fused conv and max-pool
 * adjoints: blocks of the weight's cotangent rows, images of x's), with
 * no arithmetic of their own to promise: fn(arg, unit, slot) for every
 * unit < units, each exactly once, in any order, on any threads.  slot <
 * the task's threads names the caller's scratch: no two calls running at
 * once share a slot.  The engine splits work so that no unit's result
 * depends on which others ran or where, so the bits are the same on one
 * thread or many; a backend that takes the task runs every unit before
 * returning TOPOS_OK (and must not fail after running any).
 */
typedef struct topos_units_task {
  void (*fn)(void *arg, int64_t unit, int slot);
  void *arg;
  int64_t units;
} topos_units_task;

typedef struct topos_task {
  topos_task_kind kind;
  int threads; /* the most threads the task may use (>= 1) */
  union {
    topos_gemm_task gemm;
    topos_window_task window;
    topos_reduce_task reduce;
    topos_map_task map;
    topos_attention_task attention;
    topos_units_task units;
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
  /* Capabilities, for the registry's listing (topos_backends_list): bit
   * 1 << kind for each task kind run() may take, 1 << dtype for each
   * dtype; the ISA or device it runs on (optional); the most threads one
   * task uses (optional: 1). */
  unsigned tasks;
  unsigned dtypes;
  void (*device)(const topos_backend *self, char *buf, size_t len);
  int (*max_threads)(const topos_backend *self);
  /* Offered tasks only by a context that names it: never part of the
   * `auto` chain or of another backend's fallback (test and experimental
   * backends). */
  bool named_only;
  /* The work (multiply-adds or elements) per offered task this backend
   * prefers when it heads a run's chain; 0: the engine's blocks (about
   * 2^27, so a cancelled run stops within milliseconds).  A GPU asks for
   * more: each task's operands cross the bus, and a split product would
   * send its B operand once per block. */
  int64_t task_block;
};

/* Appends a backend to the registry (the struct must outlive the
 * process's use of the engine).  Names are unique, and "reference" and
 * "auto" are taken.  Idempotent for the same struct; thread-safe; returns
 * a topos_status. */
TOPOS_API int topos_backend_register(const topos_backend *backend);
/* The registered backends in registration order (the reference is not
 * one of them): the count, one by index, one by name (NULL if none). */
TOPOS_API int topos_backend_count(void);
TOPOS_API const topos_backend *topos_backend_at(int index);
TOPOS_API const topos_backend *topos_backend_find(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_BACKEND_H */
