/*
 * kernels.c - op_eval, the reference forward kernel of every op.
 *
 * Layout ops (transpose, permute, narrow, broadcast, broadcast_along,
 * unfold, and reshape of a contiguous operand) return views that share
 * their operand's buffer.  Copying ops (pad, concat, gather, reshape of a
 * strided operand) move bits and never round.  Arithmetic ops read their
 * operands as contiguous arrays of the compute type (f32 for f32 and bf16,
 * f64 for f64), run the loops of kernels_real.h, and round once to bf16
 * where the output is bf16.  Run-time failures (an index out of range, an
 * integer overflow) come back as errors; the caller adds the node.
 *
 * Long kernels stop early: given a run's context (op_eval_in), the
 * matmul, the fused convolution and max-pool, the maps and the row ops
 * ask its cancel and deadline between blocks of rows (about STOP_MACS
 * multiply-adds or STOP_ELEMENTS elements, milliseconds here), so a
 * cancelled run leaves even a single huge node within that much work.
 * Blocks are whole rows / whole elements, so the bits never change.
 *
 * op_scratch_bytes says how much pool memory a kernel takes beside its
 * output (compute-type copies, bf16 scratch, work rows), for the plan's
 * memory bounds (plan.c): keep it in step with the kernels.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fma_pinned.h"
#include "internal.h"
#include "transpose16.h"

/* The fma chains' one operation has its NaN fixed: fma_pinned.h. */

/* v rounded once to bf16 and widened back: a bf16 op's stored result,
 * for fused kernels that keep an intermediate of the chain they stand
 * for. */
static inline float bf16_trip(float v) {
  return topos_bf16_to_f32(bf16_from_f64(v));
}

/* The max-pool's 2x2 rows in f32 on AVX-512 (below): false where they
 * do not apply, and the scalar rows of kernels_real.h run. */
#if FMA_PINNED_X86
static bool pool_row_512(const float *r0, const float *r1, float *out,
                         int64_t ow);
static bool pool_grad_row_512(const float *x0, const float *x1, const float *y,
                              const float *gy, float *d0, float *d1,
                              int64_t ow);
static bool fold_rows_512(const float *src, int64_t rs, int64_t cs,
                          int64_t count, int64_t size, int64_t extent,
                          float *out, int64_t nrows);
static bool gather_scalar_512(op_code op, const float *a, int64_t sa, float v,
                              bool v_right, float *y, int64_t n);
static bool transposed_scalar_512(op_code op, const float *a, int64_t sa0,
                                  const float *c, int64_t c1, bool v_right,
                                  float *y, int64_t n1, int64_t n0);
static int64_t binary_512(op_code op, const float *a, const float *b, float *y,
                          int64_t n);
static int64_t scalar_512(op_code op, const float *a, float v, bool v_right,
                          float *y, int64_t n);
static int64_t unary_512(op_code op, const float *x, float *y, int64_t n);
#define POOL_ROW_512 pool_row_512
#define POOL_GRAD_ROW_512 pool_grad_row_512
#define FOLD_ROWS_512 fold_rows_512
#define GATHER_SCALAR_512 gather_scalar_512
#define TRANSPOSED_SCALAR_512 transposed_scalar_512
#define BINARY_512 binary_512
#define SCALAR_512 scalar_512
#define UNARY_512 unary_512
#else
#define POOL_ROW_512(...) false
#define POOL_GRAD_ROW_512(...) false
#define FOLD_ROWS_512(...) false
#define GATHER_SCALAR_512(...) false
#define TRANSPOSED_SCALAR_512(...) false
#define BINARY_512(...) ((int64_t)0)
#define SCALAR_512(...) ((int64_t)0)
#define UNARY_512(...) ((int64_t)0)
#endif

#define R float
#define K(name) name##_f32
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define TANH tanhf
#define ERF erff
#define POW powf
#define FMA fmaf
#include "kernels_real.h"
#undef R
#undef K
#undef EXP
#undef LOG
#undef SQRT
#undef TANH
#undef ERF
#undef POW
#undef FMA

#undef POOL_ROW_512
#undef POOL_GRAD_ROW_512
#undef FOLD_ROWS_512
#undef GATHER_SCALAR_512
#undef TRANSPOSED_SCALAR_512
#undef BINARY_512
#undef SCALAR_512
#undef UNARY_512
#define POOL_ROW_512(...) false
#define POOL_GRAD_ROW_512(...) false
#define FOLD_ROWS_512(...) false
#define GATHER_SCALAR_512(...) false
#define TRANSPOSED_SCALAR_512(...) false
#define BINARY_512(...) ((int64_t)0)
#define SCALAR_512(...) ((int64_t)0)
#define UNARY_512(...) ((int64_t)0)

#define R double
#define K(name) name##_f64
#define EXP exp
#define LOG log
#define SQRT sqrt
#define TANH tanh
#define ERF erf
#define POW pow
#define FMA fma
#include "kernels_real.h"
#undef R
#undef K
#undef EXP
#undef LOG
#undef SQRT
#undef TANH
#undef ERF
#undef POW
#undef FMA

/* ------------------------------------------------------- stopping inside */

#define STOP_MACS ((int64_t)1 << 24)
#define STOP_ELEMENTS ((int64_t)1 << 20)

bool kernel_stop(const exec_env *env, topos_error *err) {
  if (!env || (!env->cancel && env->deadline_ns <= 0)) return false;
  topos_error e = {0};
  if (!exec_stop(env, &e)) return false;
  error_set(err, e.code, "%s inside the node",
            e.code == TOPOS_ERR_DEADLINE ? "the deadline passed" : "cancelled");
  return true;
}

static int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Units of `per`-sized work per block between two looks (at least one). */
static int64_t block_of(int64_t per, int64_t budget) {
  if (per <= 0) return INT64_MAX;
  int64_t b = budget / per;
  return b > 0 ? b : 1;
}

/* Calls name_f64 for f64 and name_f32 for f32/bf16. */
#define DISPATCH(dtype, name, ...) \
  do {                             \
    if ((dtype) == TOPOS_F64)      \
      name##_f64(__VA_ARGS__);     \
    else                           \
      name##_f32(__VA_ARGS__);     \
  } while (0)

static size_t compute_size(topos_dtype dtype) {
  return dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

/* Scratch of n compute-type values (at least one). */
typedef struct scratch {
  void *p;
  size_t cap;
} scratch;

static void *scratch_get(scratch *s, int64_t n, size_t es, topos_error *err) {
  s->p = pool_alloc((size_t)(n > 0 ? n : 1) * es, &s->cap);
  if (!s->p) error_set(err, TOPOS_ERR_MEMORY, "out of memory");
  return s->p;
}

static void scratch_done(scratch *s) {
  if (s->p) pool_free(s->p, s->cap);
  s->p = NULL;
}

static void row_major_strides(int rank, const int64_t *shape, int64_t *stride) {
  int64_t s = 1; /* saturates: see tensor.c's row_major_strides */
  for (int a = rank - 1; a >= 0; a--) {
    stride[a] = s;
    if (__builtin_mul_overflow(s, shape[a], &s)) s = INT64_MAX;
  }
}

/* Copies src into the region of a contiguous tensor `dst` that starts at
 * `offset` along `axis` (pad and concat). */
static void copy_into_axis(const topos_tensor *src, topos_tensor *dst, int axis,
                           int64_t offset) {
  int64_t stride[TOPOS_MAX_RANK];
  row_major_strides(dst->rank, dst->shape, stride);
  size_t es = topos_dtype_size(dst->dtype);
  char *base = (char *)tensor_data(dst) + offset * stride[axis] * (int64_t)es;
  tensor_copy_strided(src, base, stride);
}

/* --------------------------------------------------------- op families */

void around_axis(const topos_tensor *t, int axis, int64_t *outer, int64_t *L,
                 int64_t *inner) {
  *outer = shape_count(axis, t->shape);
  *L = t->shape[axis];
  *inner = shape_count(t->rank - axis - 1, t->shape + axis + 1);
}

static topos_tensor *eval_int_add(topos_tensor *const *in,
                                  const tensor_meta *out, topos_error *err) {
  compute_view a, b;
  if (compute_view_of(in[0], &a, err)) return NULL;
  if (compute_view_of(in[1], &b, err)) {
    compute_view_done(&a);
    return NULL;
  }
  topos_tensor *t = tensor_new_meta(out, err);
  int64_t n = shape_count(out->rank, out->shape);
  const int32_t *x = a.data, *y = b.data;
  int32_t *z = t ? tensor_data(t) : NULL;
  for (int64_t i = 0; t && i < n; i++) {
    if (__builtin_add_overflow(x[i], y[i], &z[i])) {
      error_set(err, TOPOS_ERR_RANGE, "i32 overflow at element %lld (%d + %d)",
                (long long)i, x[i], y[i]);
      topos_tensor_release(t);
      t = NULL;
    }
  }
  compute_view_done(&a);
  compute_view_done(&b);
  return t;
}

/*
 * A binary f32/f64 op whose operands are views (a broadcast, a narrow, a
 * permute): the output's axes are walked with each operand's own strides,
 * so nothing is copied contiguous first.  Axes of extent 1 are dropped
 * and neighbours that both operands step through as one are merged; the
 * innermost axis is a row for K(binary_strided).
 */
/* Elements from which a binary op on views is split over the threads,
 * and about how many elements make one unit (whole rows, a multiple of
 * sixteen of them: the transposed tiles' height). */
#define VIEWS_PARALLEL_MIN ((int64_t)1 << 15)
#define VIEWS_UNIT_ELEMENTS ((int64_t)1 << 14)

/* eval_binary_views' walk as units of whole rows of the output: rows are
 * the blocks' n1 rows of n0 elements, block after block (the odometer's
 * outer positions), numbered from 0 in the output's order. */
typedef struct views_job {
  op_code op;
  bool f64;
  const char *A, *B;
  char *Y;
  int r;
  const int64_t *shape, *sa, *sb; /* the coalesced axes */
  int64_t n1, n0, a1, a0, b1, b0;
  int64_t rows, rows_per_unit;
} views_job;

static void views_rows(const views_job *j, int64_t q0, int64_t q1) {
  while (q0 < q1) {
    int64_t pos = q0 / j->n1, i1 = q0 % j->n1;
    int64_t take = j->n1 - i1 < q1 - q0 ? j->n1 - i1 : q1 - q0;
    int64_t pa = i1 * j->a1, pb = i1 * j->b1, rem = pos;
    for (int d = j->r - 3; d >= 0; d--) {
      int64_t ix = rem % j->shape[d];
      rem /= j->shape[d];
      pa += ix * j->sa[d];
      pb += ix * j->sb[d];
    }
    int64_t py = q0 * j->n0;
    if (j->f64)
      binary_block_f64(j->op, (const double *)j->A + pa, j->a1, j->a0,
                       (const double *)j->B + pb, j->b1, j->b0,
                       (double *)j->Y + py, take, j->n0);
    else
      binary_block_f32(j->op, (const float *)j->A + pa, j->a1, j->a0,
                       (const float *)j->B + pb, j->b1, j->b0,
                       (float *)j->Y + py, take, j->n0);
    q0 += take;
  }
}

static void views_unit(void *arg, int64_t unit, int slot) {
  (void)slot;
  const views_job *j = arg;
  int64_t q0 = unit * j->rows_per_unit;
  int64_t q1 =
      q0 + j->rows_per_unit < j->rows ? q0 + j->rows_per_unit : j->rows;
  views_rows(j, q0, q1);
}

static topos_tensor *eval_binary_views(const exec_env *env, op_code op,
                                       topos_tensor *const *in,
                                       const tensor_meta *out,
                                       topos_error *err) {
  int64_t shape[TOPOS_MAX_RANK], sa[TOPOS_MAX_RANK], sb[TOPOS_MAX_RANK];
  int r = strided_coalesce2(out->rank, out->shape, in[0]->stride, in[1]->stride,
                            shape, sa, sb);
  out_buf ob;
  if (out_begin(&ob, out, err)) return NULL;
  /* The two innermost axes are one kernel call; an odometer walks the
   * rest. */
  int64_t n0 = r ? shape[r - 1] : 1, a0 = r ? sa[r - 1] : 0,
          b0 = r ? sb[r - 1] : 0;
  int64_t n1 = r > 1 ? shape[r - 2] : 1, a1 = r > 1 ? sa[r - 2] : 0,
          b1 = r > 1 ? sb[r - 2] : 0;
  int64_t idx[TOPOS_MAX_RANK] = {0}, pa = 0, pb = 0, py = 0;
  bool f64 = out->dtype == TOPOS_F64;
  const char *A = tensor_data(in[0]), *B = tensor_data(in[1]);
  /* Large enough for the threads: units of whole rows, each element's
   * operation its own (the same bits on any split). */
  int64_t total = shape_count(out->rank, out->shape);
  if (exec_unit_slots(env) > 1 && total >= VIEWS_PARALLEL_MIN && n0 > 0) {
    int64_t per = (VIEWS_UNIT_ELEMENTS / n0 + 15) / 16 * 16;
    views_job j = {.op = op,
                   .f64 = f64,
                   .A = A,
                   .B = B,
                   .Y = ob.data,
                   .r = r,
                   .shape = shape,
                   .sa = sa,
                   .sb = sb,
                   .n1 = n1,
                   .n0 = n0,
                   .a1 = a1,
                   .a0 = a0,
                   .b1 = b1,
                   .b0 = b0,
                   .rows = total / n0,
                   .rows_per_unit = per > 0 ? per : 16};
    if (exec_units(env, views_unit, &j,
                   (j.rows + j.rows_per_unit - 1) / j.rows_per_unit, err)) {
      out_abort(&ob);
      return NULL;
    }
    return out_end(&ob);
  }
  int64_t since = 0; /* elements since the last look at env */
  if (shape_count(out->rank, out->shape) > 0)
    for (;;) {
      if (since >= STOP_ELEMENTS) {
        since = 0;
        if (kernel_stop(env, err)) {
          out_abort(&ob);
          return NULL;
        }
      }
      since += n1 * n0;
      if (f64)
        binary_block_f64(op, (const double *)A + pa, a1, a0,
                         (const double *)B + pb, b1, b0, (double *)ob.data + py,
                         n1, n0);
      else
        binary_block_f32(op, (const float *)A + pa, a1, a0,
                         (const float *)B + pb, b1, b0, (float *)ob.data + py,
                         n1, n0);
      py += n1 * n0;
      int d = r - 3;
      for (; d >= 0; d--) {
        pa += sa[d];
        pb += sb[d];
        if (++idx[d] < shape[d]) break;
        pa -= sa[d] * shape[d];
        pb -= sb[d] * shape[d];
        idx[d] = 0;
      }
      if (d < 0) break;
    }
  return out_end(&ob);
}

int kernel_elementwise(const exec_env *env, op_code op, double p,
                       topos_dtype dtype, int nin, const void *a, const void *b,
                       void *y, int64_t n, topos_error *err) {
  size_t es = compute_size(dtype);
  for (int64_t i = 0; i < n; i += STOP_ELEMENTS) {
    if (i > 0 && kernel_stop(env, err)) return -1;
    int64_t len = n - i < STOP_ELEMENTS ? n - i : STOP_ELEMENTS;
    const char *ai = (const char *)a + i * (int64_t)es;
    char *yi = (char *)y + i * (int64_t)es;
    if (nin == 1)
      DISPATCH(dtype, unary, op, p, ai, yi, len);
    else
      DISPATCH(dtype, binary, op, ai, (const char *)b + i * (int64_t)es, yi,
               len);
  }
  return 0;
}

/* The row ops over blocks of whole rows (outer indices): x is [outer, L,
 * inner], y [outer, y_row] with y_row the output's elements per outer
 * index. */
typedef enum rows_kind {
  ROWS_SUM,
  ROWS_MAX,
  ROWS_LSE,
  ROWS_LOG_SOFTMAX
} rows_kind;

static int rows_blocks(const exec_env *env, rows_kind kind, topos_dtype dtype,
                       const void *x, void *y, int64_t outer, int64_t L,
                       int64_t inner, void *tmp, topos_error *err) {
  size_t es = compute_size(dtype);
  int64_t row = L * inner, y_row = kind == ROWS_LOG_SOFTMAX ? row : inner;
  int64_t step = block_of(row, STOP_ELEMENTS);
  for (int64_t o = 0; o < outer; o += step) {
    if (o > 0 && kernel_stop(env, err)) return -1;
    int64_t nb = outer - o < step ? outer - o : step;
    const char *xo = (const char *)x + o * row * (int64_t)es;
    char *yo = (char *)y + o * y_row * (int64_t)es;
    switch (kind) {
      case ROWS_SUM:
        DISPATCH(dtype, sum_rows, xo, yo, nb, L, inner);
        break;
      case ROWS_MAX:
        DISPATCH(dtype, max_rows, xo, yo, nb, L, inner);
        break;
      default:
        DISPATCH(dtype, lse_rows, xo, yo, nb, L, inner,
                 kind == ROWS_LOG_SOFTMAX, tmp);
    }
  }
  return 0;
}

int kernel_sum_rows(const exec_env *env, topos_dtype dtype, const void *x,
                    void *y, int64_t outer, int64_t L, int64_t inner,
                    topos_error *err) {
  return rows_blocks(env, ROWS_SUM, dtype, x, y, outer, L, inner, NULL, err);
}

int kernel_matmul(const exec_env *env, topos_dtype dtype, const void *a,
                  int64_t as0, int64_t as1, const void *b, int64_t bs0,
                  int64_t bs1, void *c, int64_t m, int64_t k, int64_t n,
                  topos_error *err) {
  size_t es = compute_size(dtype);
  int64_t step = block_of(mul_sat(k, n), STOP_MACS);
  for (int64_t i = 0; i < m; i += step) {
    if (i > 0 && kernel_stop(env, err)) return -1;
    int64_t rows = m - i < step ? m - i : step;
    DISPATCH(dtype, matmul, (const char *)a + i * as0 * (int64_t)es, as0, as1,
             b, bs0, bs1, (char *)c + i * n * (int64_t)es, rows, k, n);
  }
  return 0;
}

static topos_tensor *eval_elementwise(const exec_env *env, op_code op,
                                      const node_attrs *at, int nin,
                                      topos_tensor *const *in,
                                      const tensor_meta *out,
                                      topos_error *err) {
  if (op == OP_ADD && out->dtype == TOPOS_I32)
    return eval_int_add(in, out, err);
  if (nin == 2 && (out->dtype == TOPOS_F32 || out->dtype == TOPOS_F64) &&
      (!topos_tensor_is_contiguous(in[0]) ||
       !topos_tensor_is_contiguous(in[1])))
    return eval_binary_views(env, op, in, out, err);
  compute_view v[2];
  int got = 0;
  out_buf ob;
  for (; got < nin; got++)
    if (compute_view_of(in[got], &v[got], err)) goto fail;
  if (out_begin(&ob, out, err)) goto fail;
  int64_t n = shape_count(out->rank, out->shape);
  int rc = kernel_elementwise(env, op, at->p, out->dtype, nin, v[0].data,
                              nin > 1 ? v[1].data : NULL, ob.data, n, err);
  for (int i = 0; i < nin; i++) compute_view_done(&v[i]);
  if (rc == 0) return out_end(&ob);
  out_abort(&ob);
  return NULL;
fail:
  for (int i = 0; i < got; i++) compute_view_done(&v[i]);
  return NULL;
}

/* A matmul operand: compute-type data addressed by (batch, row, col)
 * strides.  f32/f64 views are read in place, whatever their strides;
 * bf16 is converted to a contiguous f32 copy. */
typedef struct mm_operand {
  compute_view view;
  const char *data;
  int64_t s[3];
} mm_operand;

static int mm_operand_of(const topos_tensor *t, mm_operand *o,
                         topos_error *err) {
  memset(o, 0, sizeof *o);
  int r = t->rank;
  if (t->dtype != TOPOS_BF16) {
    o->data = tensor_data(t);
    for (int i = 0; i < r; i++) o->s[3 - r + i] = t->stride[i];
    return 0;
  }
  if (compute_view_of(t, &o->view, err)) return -1;
  o->data = o->view.data;
  int64_t st[3];
  row_major_strides(r, t->shape, st);
  for (int i = 0; i < r; i++) o->s[3 - r + i] = st[i];
  return 0;
}

static topos_tensor *eval_matmul(const exec_env *env, topos_tensor *const *in,
                                 const tensor_meta *out, topos_error *err) {
  const topos_tensor *a = in[0], *b = in[1];
  int r = a->rank;
  int64_t batch = r == 3 ? a->shape[0] : 1;
  int64_t m = a->shape[r - 2], k = a->shape[r - 1], n = b->shape[r - 1];
  mm_operand A, B;
  out_buf ob;
  if (mm_operand_of(a, &A, err)) return NULL;
  if (mm_operand_of(b, &B, err)) goto fail_a;
  if (out_begin(&ob, out, err)) goto fail_b;
  size_t es = compute_size(out->dtype);
  int rc = 0;
  for (int64_t bi = 0; bi < batch && rc == 0; bi++) {
    if (bi > 0 && kernel_stop(env, err)) rc = -1;
    if (rc == 0)
      rc = kernel_matmul(
          env, out->dtype, A.data + bi * A.s[0] * (int64_t)es, A.s[1], A.s[2],
          B.data + bi * B.s[0] * (int64_t)es, B.s[1], B.s[2],
          (char *)ob.data + bi * m * n * (int64_t)es, m, k, n, err);
  }
  compute_view_done(&A.view);
  compute_view_done(&B.view);
  if (rc == 0) return out_end(&ob);
  out_abort(&ob);
  return NULL;
fail_b:
  compute_view_done(&B.view);
fail_a:
  compute_view_done(&A.view);
  return NULL;
}

/* sum, sum_along, max_along, logsumexp, log_softmax. */
static topos_tensor *eval_rows(const exec_env *env, op_code op,
                               const node_attrs *at, const topos_tensor *a,
                               const tensor_meta *out, topos_error *err) {
  int64_t outer = 1, L = shape_count(a->rank, a->shape), inner = 1;
  if (op != OP_SUM) around_axis(a, at->axis, &outer, &L, &inner);
  compute_view v;
  out_buf ob;
  scratch tmp = {0};
  if (compute_view_of(a, &v, err)) return NULL;
  if (out_begin(&ob, out, err)) goto fail_v;
  /* Only the softmax rows need a row of exponentials. */
  bool rows_of_exp = op == OP_LOGSUMEXP || op == OP_LOG_SOFTMAX;
  if (rows_of_exp && !scratch_get(&tmp, L, compute_size(a->dtype), err))
    goto fail_out;
  rows_kind kind = op == OP_SUM || op == OP_SUM_ALONG ? ROWS_SUM
                   : op == OP_MAX_ALONG               ? ROWS_MAX
                   : op == OP_LOG_SOFTMAX             ? ROWS_LOG_SOFTMAX
                                                      : ROWS_LSE;
  int rc = rows_blocks(env, kind, a->dtype, v.data, ob.data, outer, L, inner,
                       tmp.p, err);
  scratch_done(&tmp);
  compute_view_done(&v);
  if (rc == 0) return out_end(&ob);
  out_abort(&ob);
  return NULL;
fail_out:
  out_abort(&ob);
fail_v:
  compute_view_done(&v);
  return NULL;
}

static topos_tensor *eval_fold(const node_attrs *at, const topos_tensor *a,
                               const tensor_meta *out, topos_error *err) {
  int64_t outer = shape_count(at->axis, a->shape);
  int64_t count = a->shape[at->axis], size = a->shape[at->axis + 1];
  int64_t inner = shape_count(a->rank - at->axis - 2, a->shape + at->axis + 2);
  compute_view v;
  out_buf ob;
  scratch tmp = {0}, seen = {0};
  if (compute_view_of(a, &v, err)) return NULL;
  if (out_begin(&ob, out, err)) goto fail_v;
  if (!scratch_get(&tmp, count, compute_size(a->dtype), err) ||
      !scratch_get(&seen, at->extent, 1, err)) {
    scratch_done(&seen);
    scratch_done(&tmp);
    goto fail_out;
  }
  DISPATCH(a->dtype, fold, v.data, ob.data, outer, count, size, inner,
           at->extent, at->step, at->dilation, tmp.p, seen.p);
  scratch_done(&seen);
  scratch_done(&tmp);
  compute_view_done(&v);
  return out_end(&ob);
fail_out:
  out_abort(&ob);
fail_v:
  compute_view_done(&v);
  return NULL;
}

/* Reads the index operand, checking every index against [0, limit). */
static const int32_t *indices_of(const topos_tensor *idx, int64_t limit,
                                 compute_view *v, topos_error *err) {
  if (compute_view_of(idx, v, err)) return NULL;
  const int32_t *ix = v->data;
  int64_t n = idx->shape[0];
  for (int64_t i = 0; i < n; i++) {
    if (ix[i] < 0 || ix[i] >= limit) {
      error_set(err, TOPOS_ERR_RANGE,
                "index %d at position %lld is outside [0, %lld)", ix[i],
                (long long)i, (long long)limit);
      compute_view_done(v);
      return NULL;
    }
  }
  return ix;
}

static topos_tensor *eval_gather(topos_tensor *const *in,
                                 const tensor_meta *out, topos_error *err) {
  const topos_tensor *table = in[0];
  compute_view iv;
  const int32_t *ix = indices_of(in[1], table->shape[0], &iv, err);
  if (!ix) return NULL;
  topos_tensor *t = tensor_new_meta(out, err);
  if (t) {
    /* Rows are copied bit for bit from the table, whatever its strides. */
    int64_t n = out->shape[0], d = out->shape[1];
    int64_t s0 = table->stride[0], s1 = table->stride[1];
    size_t es = topos_dtype_size(out->dtype);
    const char *src = tensor_data(table);
    char *dst = tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
      const char *row = src + ix[i] * s0 * (int64_t)es;
      char *to = dst + i * d * (int64_t)es;
      if (s1 == 1)
        memcpy(to, row, (size_t)d * es);
      else
        for (int64_t j = 0; j < d; j++)
          memcpy(to + j * (int64_t)es, row + j * s1 * (int64_t)es, es);
    }
  }
  compute_view_done(&iv);
  return t;
}

static topos_tensor *eval_scatter(const node_attrs *at, topos_tensor *const *in,
                                  const tensor_meta *out, topos_error *err) {
  const topos_tensor *rows = in[0];
  int64_t n = rows->shape[0], d = rows->shape[1], V = at->extent;
  compute_view iv, rv;
  const int32_t *ix = indices_of(in[1], V, &iv, err);
  if (!ix) return NULL;
  topos_tensor *t = NULL;
  out_buf ob;
  scratch order = {0}, start = {0}, tmp = {0};
  if (compute_view_of(rows, &rv, err)) goto done_iv;
  if (!scratch_get(&order, n, sizeof(int64_t), err) ||
      !scratch_get(&start, V + 1, sizeof(int64_t), err) ||
      !scratch_get(&tmp, n, compute_size(rows->dtype), err))
    goto done_rv;
  /* A stable counting sort of row numbers by target keeps each target's
   * rows in increasing order: the reduction order numerics.md fixes. */
  int64_t *ord = order.p, *st = start.p;
  memset(st, 0, sizeof(int64_t) * (size_t)(V + 1));
  for (int64_t i = 0; i < n; i++) st[ix[i] + 1]++;
  for (int64_t v = 0; v < V; v++) st[v + 1] += st[v];
  for (int64_t i = 0; i < n; i++) ord[st[ix[i]]++] = i;
  for (int64_t v = V; v > 0; v--) st[v] = st[v - 1];
  st[0] = 0;
  if (out_begin(&ob, out, err)) goto done_rv;
  DISPATCH(rows->dtype, scatter, rv.data, ob.data, d, V, ord, st, tmp.p);
  t = out_end(&ob);
done_rv:
  scratch_done(&order);
  scratch_done(&start);
  scratch_done(&tmp);
  compute_view_done(&rv);
done_iv:
  compute_view_done(&iv);
  return t;
}

static topos_tensor *eval_pad(const node_attrs *at, const topos_tensor *a,
                              const tensor_meta *out, topos_error *err) {
  topos_tensor *t = tensor_new_meta(out, err);
  if (!t) return NULL;
  int64_t n = shape_count(out->rank, out->shape);
  memset(tensor_data(t), 0, (size_t)n * topos_dtype_size(out->dtype));
  copy_into_axis(a, t, at->axis, at->before);
  return t;
}

static topos_tensor *eval_concat(const node_attrs *at, int nin,
                                 topos_tensor *const *in,
                                 const tensor_meta *out, topos_error *err) {
  topos_tensor *t = tensor_new_meta(out, err);
  if (!t) return NULL;
  int64_t offset = 0;
  for (int i = 0; i < nin; i++) {
    copy_into_axis(in[i], t, at->axis, offset);
    offset += in[i]->shape[at->axis];
  }
  return t;
}

/* contiguous_in's units: whole indices of the outermost axis, each slice
 * copied into its place in the row-major output. */
#define COPY_PARALLEL_MIN ((int64_t)1 << 15)
#define COPY_UNIT_ELEMENTS ((int64_t)1 << 14)

typedef struct copy_job {
  const topos_tensor *src;
  char *dst;
  int64_t stride[TOPOS_MAX_RANK]; /* the output's row-major strides */
  int64_t per;                    /* outer indices per unit */
  atomic_bool failed;             /* a slice view could not be made */
} copy_job;

static void copy_unit(void *arg, int64_t unit, int slot) {
  (void)slot;
  copy_job *j = arg;
  int64_t i0 = unit * j->per, outer = j->src->shape[0];
  int64_t len = outer - i0 < j->per ? outer - i0 : j->per;
  topos_tensor *slice = topos_tensor_narrow(j->src, 0, i0, len, NULL);
  if (!slice) {
    atomic_store(&j->failed, true);
    return;
  }
  size_t es = topos_dtype_size(j->src->dtype);
  tensor_copy_strided(slice, j->dst + (size_t)(i0 * j->stride[0]) * es,
                      j->stride);
  topos_tensor_release(slice);
}

topos_tensor *contiguous_in(const exec_env *env, const topos_tensor *t,
                            topos_error *err) {
  if (!t || topos_tensor_is_contiguous(t) || exec_unit_slots(env) < 2 ||
      t->rank < 2 || t->shape[0] < 2 ||
      shape_count(t->rank, t->shape) < COPY_PARALLEL_MIN)
    return topos_tensor_contiguous(t, err);
  topos_tensor *out = tensor_new(t->dtype, t->rank, t->shape, err);
  if (!out) return NULL;
  copy_job j = {.src = t, .dst = tensor_data(out)};
  row_major_strides(t->rank, t->shape, j.stride);
  int64_t inner = j.stride[0] > 0 ? j.stride[0] : 1;
  j.per = (COPY_UNIT_ELEMENTS + inner - 1) / inner;
  atomic_init(&j.failed, false);
  int64_t units = (t->shape[0] + j.per - 1) / j.per;
  if (exec_units(env, copy_unit, &j, units, err)) {
    topos_tensor_release(out);
    return NULL;
  }
  if (atomic_load(&j.failed)) {
    topos_tensor_release(out);
    error_set(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  return out;
}

static topos_tensor *eval_reshape(const exec_env *env, const topos_tensor *a,
                                  const tensor_meta *out, topos_error *err) {
  topos_tensor *c = contiguous_in(env, a, err);
  if (!c) return NULL;
  int64_t stride[TOPOS_MAX_RANK];
  row_major_strides(out->rank, out->shape, stride);
  topos_tensor *t = tensor_view(c, out->rank, out->shape, stride, c->offset);
  topos_tensor_release(c);
  if (!t) error_set(err, TOPOS_ERR_MEMORY, "out of memory");
  return t;
}

static topos_tensor *eval_broadcast_along(const node_attrs *at,
                                          const topos_tensor *a,
                                          const tensor_meta *out,
                                          topos_error *err) {
  int64_t stride[TOPOS_MAX_RANK];
  for (int i = 0, j = 0; i <= a->rank; i++) {
    if (i == at->axis) stride[j++] = 0;
    if (i < a->rank) stride[j++] = a->stride[i];
  }
  topos_tensor *t = tensor_view(a, out->rank, out->shape, stride, a->offset);
  if (!t) error_set(err, TOPOS_ERR_MEMORY, "out of memory");
  return t;
}

topos_tensor *op_eval(op_code op, const node_attrs *at, int nin,
                      topos_tensor *const *in, const tensor_meta *out,
                      topos_error *err) {
  return op_eval_in(NULL, op, at, nin, in, out, err);
}

topos_tensor *op_eval_in(const exec_env *env, op_code op, const node_attrs *at,
                         int nin, topos_tensor *const *in,
                         const tensor_meta *out, topos_error *err) {
  switch (op) {
    case OP_CONSTANT:
    case OP_PARAMETER:
    case OP_INPUT:
      return topos_tensor_retain(at->tensor);
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_MAXIMUM:
    case OP_STEP:
    case OP_NEG:
    case OP_EXP:
    case OP_LOG:
    case OP_SQRT:
    case OP_TANH:
    case OP_ERF:
    case OP_POW:
    case OP_RELU:
      return eval_elementwise(env, op, at, nin, in, out, err);
    case OP_MATMUL:
      return eval_matmul(env, in, out, err);
    case OP_TRANSPOSE:
      return topos_tensor_transpose(in[0], err);
    case OP_PERMUTE:
      return topos_tensor_permute(in[0], at->perm, err);
    case OP_RESHAPE:
      return eval_reshape(env, in[0], out, err);
    case OP_NARROW:
      return topos_tensor_narrow(in[0], at->axis, at->start, at->length, err);
    case OP_PAD:
      return eval_pad(at, in[0], out, err);
    case OP_UNFOLD:
      return topos_tensor_unfold(in[0], at->axis, at->size, at->step,
                                 at->dilation, err);
    case OP_FOLD:
      return eval_fold(at, in[0], out, err);
    case OP_CONCAT:
      return eval_concat(at, nin, in, out, err);
    case OP_BROADCAST:
      return topos_tensor_broadcast(in[0], out->rank, out->shape, err);
    case OP_BROADCAST_ALONG:
      return eval_broadcast_along(at, in[0], out, err);
    case OP_SUM:
    case OP_SUM_ALONG:
    case OP_MAX_ALONG:
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      return eval_rows(env, op, at, in[0], out, err);
    case OP_GATHER:
      return eval_gather(in, out, err);
    case OP_SCATTER:
      return eval_scatter(at, in, out, err);
    case OP_COUNT:
      break;
  }
  error_set(err, TOPOS_ERR_ARGUMENT, "unknown op %d", op);
  return NULL;
}

topos_tensor *group_eval(const plan_group *g, const tensor_meta *out,
                         const topos_tensor *const *ins, topos_tensor **exports,
                         topos_error *err) {
  return group_eval_in(NULL, g, out, ins, exports, err);
}

/* A max-pool's images as units on the threads (kernel_window): each
 * image's windows are its own, so the split changes no bits. */
#define POOL_UNIT_ELEMENTS ((int64_t)1 << 15)

typedef struct pool_job {
  const plan_group *g;
  topos_dtype dtype;
  const char *x;
  char *y;
  int64_t image, oimage, per; /* elements in and out per image; images
                                 per unit */
} pool_job;

static void pool_unit(void *arg, int64_t unit, int slot) {
  (void)slot;
  const pool_job *j = arg;
  size_t es = compute_size(j->dtype);
  int64_t n = unit * j->per;
  plan_group sub = *j->g;
  sub.N = j->g->N - n < j->per ? j->g->N - n : j->per;
  DISPATCH(j->dtype, pool_window, &sub, j->x + n * j->image * (int64_t)es,
           j->y + n * j->oimage * (int64_t)es);
}

/* The window walks over blocks: a convolution by output rows (n, oi) -
 * a block's geometry is the group's with oh cut and pad_top shifted, so
 * every output keeps its chain - and a max-pool by whole images (units
 * of them on the threads, for a batch large enough). */
int kernel_window(const exec_env *env, const plan_group *g, topos_dtype dtype,
                  const void *x, const void *w, int64_t ws0, int64_t ws1,
                  void *y, topos_error *err) {
  size_t es = compute_size(dtype);
  int64_t image = g->C * g->H * g->W;
  if (g->kind == GROUP_POOL && exec_unit_slots(env) > 1 && g->N > 1 &&
      mul_sat(g->N, image) >= 2 * POOL_UNIT_ELEMENTS) {
    pool_job j = {
        .g = g,
        .dtype = dtype,
        .x = x,
        .y = y,
        .image = image,
        .oimage = g->C * g->oh * g->ow,
        .per = image > 0 ? (POOL_UNIT_ELEMENTS + image - 1) / image : g->N};
    return exec_units(env, pool_unit, &j, (g->N + j.per - 1) / j.per, err);
  }
  if (g->kind == GROUP_POOL) {
    int64_t per = mul_sat(mul_sat(g->C * g->oh, g->ow), g->kh * g->kw);
    int64_t step = block_of(per, STOP_ELEMENTS);
    for (int64_t n = 0; n < g->N; n += step) {
      if (n > 0 && kernel_stop(env, err)) return -1;
      plan_group sub = *g;
      sub.N = g->N - n < step ? g->N - n : step;
      DISPATCH(dtype, pool_window, &sub,
               (const char *)x + n * image * (int64_t)es,
               (char *)y + n * g->C * g->oh * g->ow * (int64_t)es);
    }
    return 0;
  }
  int64_t per = mul_sat(mul_sat(g->ow, g->nout), g->C * g->kh * g->kw);
  int64_t step = block_of(per, STOP_MACS);
  bool first = true;
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t oi = 0; oi < g->oh; oi += step) {
      if (!first && kernel_stop(env, err)) return -1;
      first = false;
      plan_group sub = *g;
      sub.N = 1;
      sub.oh = g->oh - oi < step ? g->oh - oi : step;
      sub.pad_top = g->pad_top - oi * g->stride_h;
      DISPATCH(dtype, conv_window, &sub,
               (const char *)x + n * image * (int64_t)es, w, ws0, ws1,
               (char *)y + (n * g->oh + oi) * g->ow * g->nout * (int64_t)es);
    }
  return 0;
}

/* ---------------------------------------------- fused window adjoints */

#if FMA_PINNED_X86

/* Whether the AVX-512 kernels below (pinned fmas included) may run. */
static bool avx512_available(void) {
  static int known = -1;
  if (known < 0)
    known = fma_pinned_available() && __builtin_cpu_supports("avx512f");
  return known;
}

/* A mask of the first n lanes of 16 (n clamped to [0, 16]). */
static inline __mmask16 first_lanes(int64_t n) {
  return n >= 16  ? (__mmask16)0xffff
         : n <= 0 ? (__mmask16)0
                  : (__mmask16)((1u << n) - 1);
}

/* K(window_dw) for f32, 16 outputs o at once: lane l of acc[q] is
 * output (k0 + q, o0 + l)'s chain, the same fmas in the same order. */
__attribute__((target("avx512f"))) static void window_dw_512(
    const plan_group *g, const float *xp, int64_t Hp, int64_t Wp,
    const int64_t *koff, const float *gy, float *dw, int64_t k0, int64_t k1) {
  int64_t O = g->nout;
  for (int64_t o0 = 0; o0 < O; o0 += 16) {
    __mmask16 m = first_lanes(O - o0);
    for (int64_t q0 = k0; q0 < k1; q0 += 8) {
      int nq = k1 - q0 < 8 ? (int)(k1 - q0) : 8;
      int64_t off[8];
      for (int q = 0; q < 8; q++) off[q] = koff[q0 + (q < nq ? q : 0)];
      /* Eight named accumulators: an array would live in memory. */
      __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0,
             c5 = c0, c6 = c0, c7 = c0;
      const int64_t f0 = off[0], f1 = off[1], f2 = off[2], f3 = off[3],
                    f4 = off[4], f5 = off[5], f6 = off[6], f7 = off[7];
      for (int64_t n = 0; n < g->N; n++)
        for (int64_t oi = 0; oi < g->oh; oi++) {
          const float *xr = xp + (n * g->C * Hp + oi * g->stride_h) * Wp;
          const float *gr = gy + ((n * g->oh + oi) * g->ow) * O + o0;
          for (int64_t oj = 0; oj < g->ow; oj++, gr += O) {
            const float *xb = xr + oj * g->stride_w;
            __m512 gv = _mm512_maskz_loadu_ps(m, gr);
            c0 = fma231_ps512(_mm512_set1_ps(xb[f0]), gv, c0);
            c1 = fma231_ps512(_mm512_set1_ps(xb[f1]), gv, c1);
            c2 = fma231_ps512(_mm512_set1_ps(xb[f2]), gv, c2);
            c3 = fma231_ps512(_mm512_set1_ps(xb[f3]), gv, c3);
            c4 = fma231_ps512(_mm512_set1_ps(xb[f4]), gv, c4);
            c5 = fma231_ps512(_mm512_set1_ps(xb[f5]), gv, c5);
            c6 = fma231_ps512(_mm512_set1_ps(xb[f6]), gv, c6);
            c7 = fma231_ps512(_mm512_set1_ps(xb[f7]), gv, c7);
          }
        }
      const __m512 acc[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
      for (int q = 0; q < nq; q++)
        _mm512_mask_storeu_ps(dw + (q0 + q) * O + o0, m, acc[q]);
    }
  }
}

/* The even and odd lanes of the 32 floats at p (n of them valid, the
 * rest read as 0). */
__attribute__((target("avx512f"))) static inline void pairs512(const float *p,
                                                               int64_t n,
                                                               __m512 *even,
                                                               __m512 *odd) {
  __m512 a = _mm512_maskz_loadu_ps(first_lanes(n), p);
  __m512 b = _mm512_maskz_loadu_ps(first_lanes(n - 16), p + 16);
  const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12,
                                      10, 8, 6, 4, 2, 0);
  const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13,
                                      11, 9, 7, 5, 3, 1);
  *even = _mm512_permutex2var_ps(a, ie, b);
  *odd = _mm512_permutex2var_ps(a, io, b);
}

/* max_step per lane: m takes v unless m is NaN, or v is no NaN and not
 * greater (the comparisons are quiet, as the scalar step's). */
__attribute__((target("avx512f"))) static inline __m512 max_step512(__m512 m,
                                                                    __m512 v) {
  __mmask16 take = _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q) &
                   (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) |
                    _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ));
  return _mm512_mask_blend_ps(take, m, v);
}

/* K(pool_row2x2) for f32, 16 windows at once. */
__attribute__((target("avx512f"))) static void pool_row_512_run(const float *r0,
                                                                const float *r1,
                                                                float *out,
                                                                int64_t ow) {
  for (int64_t j = 0; j < ow; j += 16) {
    int64_t n = ow - j < 16 ? ow - j : 16;
    __m512 e0, o0, e1, o1;
    pairs512(r0 + 2 * j, 2 * n, &e0, &o0);
    pairs512(r1 + 2 * j, 2 * n, &e1, &o1);
    __m512 m = max_step512(max_step512(max_step512(e0, o0), e1), o1);
    _mm512_mask_storeu_ps(out + j, first_lanes(n), m);
  }
}

/* Lanes a (even) and b (odd) interleaved into the 2n floats at p. */
__attribute__((target("avx512f"))) static inline void store_pairs512(float *p,
                                                                     int64_t n,
                                                                     __m512 a,
                                                                     __m512 b) {
  const __m512i il =
      _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i ih = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11,
                                      26, 10, 25, 9, 24, 8);
  _mm512_mask_storeu_ps(p, first_lanes(2 * n),
                        _mm512_permutex2var_ps(a, il, b));
  _mm512_mask_storeu_ps(p + 16, first_lanes(2 * n - 16),
                        _mm512_permutex2var_ps(a, ih, b));
}

/* K(pool_grad_row2x2) for f32, 16 windows at once: the same products
 * gy·1 and gy·0 and the same first position. */
__attribute__((target("avx512f"))) static void pool_grad_row_512_run(
    const float *x0, const float *x1, const float *y, const float *gy,
    float *d0, float *d1, int64_t ow) {
  for (int64_t j = 0; j < ow; j += 16) {
    int64_t n = ow - j < 16 ? ow - j : 16;
    __mmask16 k = first_lanes(n);
    __m512 e0, o0, e1, o1;
    pairs512(x0 + 2 * j, 2 * n, &e0, &o0);
    pairs512(x1 + 2 * j, 2 * n, &e1, &o1);
    __m512 yv = _mm512_maskz_loadu_ps(k, y + j);
    __m512 g = _mm512_maskz_loadu_ps(k, gy + j);
    __m512 one = _mm512_mul_ps(g, _mm512_set1_ps(1.0f));
    __m512 zero = _mm512_mul_ps(g, _mm512_setzero_ps());
    __mmask16 m0 = _mm512_cmp_ps_mask(e0, yv, _CMP_GE_OQ);
    __mmask16 m1 = _mm512_cmp_ps_mask(o0, yv, _CMP_GE_OQ) & ~m0;
    __mmask16 m2 = _mm512_cmp_ps_mask(e1, yv, _CMP_GE_OQ) & ~(m0 | m1);
    __mmask16 m3 = _mm512_cmp_ps_mask(o1, yv, _CMP_GE_OQ) & ~(m0 | m1 | m2);
    store_pairs512(d0 + 2 * j, n, _mm512_mask_blend_ps(m0, zero, one),
                   _mm512_mask_blend_ps(m1, zero, one));
    store_pairs512(d1 + 2 * j, n, _mm512_mask_blend_ps(m2, zero, one),
                   _mm512_mask_blend_ps(m3, zero, one));
  }
}

/* K(fold_rows) at step 1, dilation 1, size <= 16 for nrows rows (row k
 * at src + k·rs into out + k·extent), 16 positions at once on AVX-512:
 * window c's size contiguous values land at lanes [c, c + size) of a
 * block by one masked load, each lane's first contribution is copied
 * and the later ones added in window order (a left fold, as the scalar
 * path), and lanes no window reaches are +0.  Four rows run together,
 * so four add chains overlap. */
__attribute__((target("avx512f"))) static void fold_rows_512_run(
    const float *src, int64_t rs, int64_t cs, int64_t count, int64_t size,
    int64_t extent, float *out, int64_t nrows) {
  for (int64_t e0 = 0; e0 < extent; e0 += 16) {
    int64_t lanes = extent - e0 < 16 ? extent - e0 : 16;
    __mmask16 keep = first_lanes(lanes);
    /* Windows c reach positions [c, c + size): those meeting the block. */
    int64_t c0 = e0 - size + 1 > 0 ? e0 - size + 1 : 0;
    int64_t c1 = e0 + lanes < count ? e0 + lanes : count;
    for (int64_t r = 0; r < nrows; r += 4) {
      int nr = nrows - r < 4 ? (int)(nrows - r) : 4;
      const float *sr[4];
      for (int k = 0; k < 4; k++) sr[k] = src + (r + (k < nr ? k : 0)) * rs;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      __mmask16 started = 0;
      for (int64_t c = c0; c < c1; c++) {
        int64_t off = c - e0; /* lane of the window's first value */
        int64_t lo = off > 0 ? off : 0, hi = off + size < 16 ? off + size : 16;
        __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        __mmask16 add = m & started, copy = m & ~started;
        int64_t at = c * cs - off;
        __m512 v0 = _mm512_maskz_loadu_ps(m, sr[0] + at);
        __m512 v1 = _mm512_maskz_loadu_ps(m, sr[1] + at);
        __m512 v2 = _mm512_maskz_loadu_ps(m, sr[2] + at);
        __m512 v3 = _mm512_maskz_loadu_ps(m, sr[3] + at);
        a0 = _mm512_mask_add_ps(_mm512_mask_mov_ps(a0, copy, v0), add, a0, v0);
        a1 = _mm512_mask_add_ps(_mm512_mask_mov_ps(a1, copy, v1), add, a1, v1);
        a2 = _mm512_mask_add_ps(_mm512_mask_mov_ps(a2, copy, v2), add, a2, v2);
        a3 = _mm512_mask_add_ps(_mm512_mask_mov_ps(a3, copy, v3), add, a3, v3);
        started |= m;
      }
      const __m512 acc[4] = {a0, a1, a2, a3};
      for (int k = 0; k < nr; k++)
        _mm512_mask_storeu_ps(out + (r + k) * extent + e0, keep,
                              _mm512_maskz_mov_ps(started, acc[k]));
    }
  }
}

static bool fold_rows_512(const float *src, int64_t rs, int64_t cs,
                          int64_t count, int64_t size, int64_t extent,
                          float *out, int64_t nrows) {
  if (size > 16 || !avx512_available()) return false;
  fold_rows_512_run(src, rs, cs, count, size, extent, out, nrows);
  return true;
}

/* The binary ops with a sixteen-lane form: the arithmetic ones pinned
 * (fma_pinned.h), and step and maximum, which only compare and select
 * (kernels_real.h's expressions, NaN cases included, lane by lane). */
static bool vector_op(op_code op) {
  return op == OP_ADD || op == OP_SUB || op == OP_MUL || op == OP_DIV ||
         op == OP_STEP || op == OP_MAXIMUM;
}

__attribute__((target("avx512f"), always_inline)) static inline __m512 op_ps(
    op_code op, __m512 u, __m512 w) {
  switch (op) {
    case OP_ADD:
      return add_ps512(u, w);
    case OP_SUB:
      return sub_ps512(u, w);
    case OP_MUL:
      return mul_ps512(u, w);
    case OP_STEP:
      return step_ps512(u, w);
    case OP_MAXIMUM:
      return maximum_ps512(u, w);
    default: /* OP_DIV */
      return div_ps512(u, w);
  }
}

/* K(binary_scalar)'s strided f32 rows, sixteen elements a gather: the
 * same IEEE operation per element, operands in the same order. */
__attribute__((target("avx512f"))) static void gather_scalar_512_run(
    op_code op, const float *a, int64_t sa, float v, bool v_right, float *y,
    int64_t n) {
  const __m512i idx = gather16_index(sa);
  const __m512 vv = _mm512_set1_ps(v);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = first_lanes(n - i);
    __m512 x =
        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, a + i * sa, 4);
    __m512 u = v_right ? x : vv, w = v_right ? vv : x;
    _mm512_mask_storeu_ps(y + i, m, op_ps(op, u, w));
  }
}

static bool gather_scalar_512(op_code op, const float *a, int64_t sa, float v,
                              bool v_right, float *y, int64_t n) {
  bool fits = sa > 0 && sa <= GATHER16_STRIDE_MAX;
  if (!fits || !avx512_available() || !vector_op(op)) return false;
  gather_scalar_512_run(op, a, sa, v, v_right, y, n);
  return true;
}

/* K(binary_block)'s rows of a strided operand against one value per row
 * (a scalar, or a per-channel value such as a bias), where the operand
 * runs contiguous across rows (sa1 = 1, elements of a row sa0 apart: a
 * conv's [positions, channels] output read as [channels, positions]):
 * sixteen rows by sixteen columns a tile, each of sixteen columns loaded
 * as one vector across the rows, transposed in registers, the op applied
 * to each row's vector and its value, each row's sixteen results stored
 * at once.  The same IEEE operation per element, operands in the same
 * order, as K(binary_scalar) - instead of a gather per sixteen. */
__attribute__((target("avx512f"))) static void transposed_scalar_512_run(
    op_code op, const float *a, int64_t sa0, const float *c, int64_t c1,
    bool v_right, float *y, int64_t n1, int64_t n0) {
  for (int64_t i1 = 0; i1 < n1; i1 += 16) {
    int64_t w1 = n1 - i1 < 16 ? n1 - i1 : 16;
    __mmask16 m1 = first_lanes(w1);
    for (int64_t i0 = 0; i0 < n0; i0 += 16) {
      int64_t w0 = n0 - i0 < 16 ? n0 - i0 : 16;
      __mmask16 m0 = first_lanes(w0);
      __m512 r[16];
      transpose16_load_ps(a + i0 * sa0 + i1, sa0, w0, m1, r);
      for (int t = 0; t < w1; t++) {
        __m512 vv = _mm512_set1_ps(c[(i1 + t) * c1]);
        __m512 out = v_right ? op_ps(op, r[t], vv) : op_ps(op, vv, r[t]);
        _mm512_mask_storeu_ps(y + (i1 + t) * n0 + i0, m0, out);
      }
    }
  }
}

static bool transposed_scalar_512(op_code op, const float *a, int64_t sa0,
                                  const float *c, int64_t c1, bool v_right,
                                  float *y, int64_t n1, int64_t n0) {
  if (!avx512_available() || !vector_op(op) || sa0 < 2 || n1 < 4 || n0 < 4)
    return false;
  transposed_scalar_512_run(op, a, sa0, c, c1, v_right, y, n1, n0);
  return true;
}

/* K(binary)'s contiguous f32 vector ops over whole vectors
 * (n a multiple of 16).  y may be a or b: each vector is read before it
 * is written. */
__attribute__((target("avx512f"))) static void binary_512_run(
    op_code op, const float *a, const float *b, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(y + i,
                     op_ps(op, _mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
}

/* How many leading elements of n the vector loops take: the whole
 * vectors, none where op has no vector form or the CPU lacks AVX-512.
 * The caller's scalar loop does the rest. */
static int64_t pinned_whole(op_code op, int64_t n) {
  int64_t whole = n & ~(int64_t)15;
  return whole > 0 && vector_op(op) && avx512_available() ? whole : 0;
}

static int64_t binary_512(op_code op, const float *a, const float *b, float *y,
                          int64_t n) {
  int64_t whole = pinned_whole(op, n);
  if (whole) binary_512_run(op, a, b, y, whole);
  return whole;
}

/* K(binary_scalar)'s contiguous f32 vector ops: a[i] op v
 * (v_right) or v op a[i], over whole vectors, as binary_512_run. */
__attribute__((target("avx512f"))) static void scalar_512_run(
    op_code op, const float *a, float v, bool v_right, float *y, int64_t n) {
  const __m512 vv = _mm512_set1_ps(v);
  if (v_right)
    for (int64_t i = 0; i < n; i += 16)
      _mm512_storeu_ps(y + i, op_ps(op, _mm512_loadu_ps(a + i), vv));
  else
    for (int64_t i = 0; i < n; i += 16)
      _mm512_storeu_ps(y + i, op_ps(op, vv, _mm512_loadu_ps(a + i)));
}

static int64_t scalar_512(op_code op, const float *a, float v, bool v_right,
                          float *y, int64_t n) {
  int64_t whole = pinned_whole(op, n);
  if (whole) scalar_512_run(op, a, v, v_right, y, whole);
  return whole;
}

/* K(unary)'s f32 relu and neg over whole vectors: relu keeps x where x >
 * 0 or x is NaN and is +0 elsewhere (-0 included), neg flips the sign bit
 * (NaN too, as the scalar negation does). */
__attribute__((target("avx512f"))) static void unary_512_run(op_code op,
                                                             const float *x,
                                                             float *y,
                                                             int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, op == OP_RELU ? relu_ps512(v) : neg_ps512(v));
  }
}

static int64_t unary_512(op_code op, const float *x, float *y, int64_t n) {
  int64_t whole = n & ~(int64_t)15;
  if (whole <= 0 || (op != OP_RELU && op != OP_NEG) || !avx512_available())
    return 0;
  unary_512_run(op, x, y, whole);
  return whole;
}

static bool pool_row_512(const float *r0, const float *r1, float *out,
                         int64_t ow) {
  if (!avx512_available()) return false;
  pool_row_512_run(r0, r1, out, ow);
  return true;
}

static bool pool_grad_row_512(const float *x0, const float *x1, const float *y,
                              const float *gy, float *d0, float *d1,
                              int64_t ow) {
  if (!avx512_available()) return false;
  pool_grad_row_512_run(x0, x1, y, gy, d0, d1, ow);
  return true;
}
#endif

/* x [N, C, H, W] zero-padded to [N, C, Hp, Wp]: x itself when the group
 * pads nothing, else a copy in *owned (NULL and err set when out of
 * memory). */
static const void *padded_x(const plan_group *g, const void *x, size_t es,
                            void **owned, topos_error *err) {
  *owned = NULL;
  if (!g->pad_top && !g->pad_bottom && !g->pad_left && !g->pad_right) return x;
  int64_t Hp = g->H + g->pad_top + g->pad_bottom;
  int64_t Wp = g->W + g->pad_left + g->pad_right;
  char *xp = calloc((size_t)(g->N * g->C * Hp * Wp), es);
  if (!xp) {
    error_set(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  for (int64_t nc = 0; nc < g->N * g->C; nc++)
    for (int64_t h = 0; h < g->H; h++)
      memcpy(xp + ((nc * Hp + h + g->pad_top) * Wp + g->pad_left) * (int64_t)es,
             (const char *)x + ((nc * g->H + h) * g->W) * (int64_t)es,
             (size_t)g->W * es);
  *owned = xp;
  return xp;
}

/* The weight's cotangent in units of DW_BLOCK rows (kk): each unit reads
 * all of x and gy and writes its own rows, so units may run anywhere. */
enum { DW_BLOCK = 8 };

typedef struct dw_job {
  const plan_group *g;
  topos_dtype dtype;
  const void *xp, *gy;
  void *dw;
  int64_t Hp, Wp, K;
  const int64_t *koff;
  char *acc; /* per slot: DW_BLOCK·O values */
  size_t acc_bytes;
} dw_job;

static void dw_unit(void *arg, int64_t unit, int slot) {
  const dw_job *d = arg;
  int64_t k0 = unit * DW_BLOCK;
  int64_t k1 = d->K - k0 < DW_BLOCK ? d->K : k0 + DW_BLOCK;
#if FMA_PINNED_X86
  if (d->dtype != TOPOS_F64 && avx512_available()) {
    window_dw_512(d->g, d->xp, d->Hp, d->Wp, d->koff, d->gy, d->dw, k0, k1);
    return;
  }
#endif
  void *acc = d->acc + (size_t)slot * d->acc_bytes;
  DISPATCH(d->dtype, window_dw, d->g, d->xp, d->Hp, d->Wp, d->koff, d->gy,
           d->dw, k0, k1, acc);
}

int kernel_window_dw(const exec_env *env, const plan_group *g,
                     topos_dtype dtype, const void *x, const void *gy, void *dw,
                     topos_error *err) {
  size_t es = compute_size(dtype);
  int64_t K = g->C * g->kh * g->kw, O = g->nout;
  int slots = exec_unit_slots(env);
  dw_job d = {.g = g,
              .dtype = dtype,
              .gy = gy,
              .dw = dw,
              .Hp = g->H + g->pad_top + g->pad_bottom,
              .Wp = g->W + g->pad_left + g->pad_right,
              .K = K,
              .acc_bytes = es * (size_t)(DW_BLOCK * (O > 0 ? O : 1))};
  void *owned;
  d.xp = padded_x(g, x, es, &owned, err);
  if (!d.xp) return -1;
  int64_t *koff = malloc(sizeof(int64_t) * (size_t)(K > 0 ? K : 1));
  d.acc = malloc(d.acc_bytes * (size_t)slots);
  int rc = 0;
  if (!koff || !d.acc) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "out of memory");
    goto done;
  }
  for (int64_t kk = 0; kk < K; kk++) {
    int64_t c = kk / (g->kh * g->kw), a = kk / g->kw % g->kh, b = kk % g->kw;
    koff[kk] = (c * d.Hp + a * g->dil_h) * d.Wp + b * g->dil_w;
  }
  d.koff = koff;
  if (exec_units(env, dw_unit, &d, (K + DW_BLOCK - 1) / DW_BLOCK, err)) rc = -1;
done:
  free(koff);
  free(d.acc);
  free(owned);
  return rc;
}

/* x's cotangent one image per unit, each with its slot's scratch. */
typedef struct dx_job {
  const plan_group *g;
  plan_group one; /* g for one image */
  topos_dtype dtype;
  size_t es;
  const void *da, *x, *y, *gy;
  void *dx;
  int64_t st[6], per_image, image;
  bool pool_only; /* a max-pool whose windows do not overlap */
  /* per slot: t1 oh·kh·Wp, t2 Hp·Wp, tmp max(oh, ow) values, seen
   * max(Hp, Wp) bytes, v per_image values (a max-pool's) */
  char *t1, *t2, *tmp, *seen, *v;
  size_t t1_bytes, t2_bytes, tmp_bytes, seen_bytes, v_bytes;
} dx_job;

static void dx_unit(void *arg, int64_t n, int slot) {
  const dx_job *d = arg;
  size_t es = d->es;
  char *dxn = (char *)d->dx + n * d->image * (int64_t)es;
  const char *xn = (const char *)d->x + n * d->image * (int64_t)es;
  int64_t pooled = d->g->C * d->g->oh * d->g->ow * (int64_t)es;
  if (d->pool_only) {
    memset(dxn, 0, (size_t)d->image * es);
    DISPATCH(d->dtype, pool_grad, &d->one, (const void *)xn,
             (const void *)((const char *)d->y + n * pooled),
             (const void *)((const char *)d->gy + n * pooled), NULL,
             (void *)dxn);
    return;
  }
  const char *src = (const char *)d->da + n * d->per_image * (int64_t)es;
  if (d->g->kind == GROUP_POOL) {
    void *v = d->v + (size_t)slot * d->v_bytes;
    DISPATCH(d->dtype, pool_grad, &d->one, (const void *)xn,
             (const void *)((const char *)d->y + n * pooled),
             (const void *)((const char *)d->gy + n * pooled), v, NULL);
    src = v;
  }
  DISPATCH(d->dtype, window_fold, &d->one, (const void *)src, d->st,
           d->dtype == TOPOS_BF16, (void *)dxn,
           (void *)(d->t1 + (size_t)slot * d->t1_bytes),
           (void *)(d->t2 + (size_t)slot * d->t2_bytes),
           (void *)(d->tmp + (size_t)slot * d->tmp_bytes),
           d->seen + (size_t)slot * d->seen_bytes);
}

int kernel_window_dx(const exec_env *env, const plan_group *g,
                     topos_dtype dtype, const void *da, const void *x,
                     const void *y, const void *gy, void *dx,
                     topos_error *err) {
  size_t es = compute_size(dtype);
  int64_t Hp = g->H + g->pad_top + g->pad_bottom;
  int64_t Wp = g->W + g->pad_left + g->pad_right;
  int64_t L = g->kh * g->kw;
  bool overlap = (g->kh - 1) * g->dil_h >= g->stride_h ||
                 (g->kw - 1) * g->dil_w >= g->stride_w;
  dx_job d = {.g = g,
              .one = *g,
              .dtype = dtype,
              .es = es,
              .da = da,
              .x = x,
              .y = y,
              .gy = gy,
              .dx = dx,
              .image = g->C * g->H * g->W,
              .pool_only = g->kind == GROUP_POOL && !overlap};
  d.one.N = 1;
  int slots = exec_unit_slots(env);
  int rc = 0;
  if (!d.pool_only) {
    int64_t most = g->oh > g->ow ? g->oh : g->ow;
    int64_t reach = Hp > Wp ? Hp : Wp;
    if (g->kind == GROUP_CONV) {
      int64_t K = g->C * L; /* da: [N, oh, ow, C, kh, kw] */
      int64_t s[6] = {g->oh * g->ow * K, L, g->ow * K, g->kw, K, 1};
      memcpy(d.st, s, sizeof d.st);
      d.per_image = g->oh * g->ow * K;
    } else { /* v: [N, C, oh, ow, kh, kw] */
      int64_t s[6] = {
          g->C * g->oh * g->ow * L, g->oh * g->ow * L, g->ow * L, g->kw, L, 1};
      memcpy(d.st, s, sizeof d.st);
      d.per_image = g->C * g->oh * g->ow * L;
      d.v_bytes = es * (size_t)d.per_image;
      d.v = malloc(d.v_bytes * (size_t)slots);
    }
    d.t1_bytes = es * (size_t)(g->oh * g->kh * Wp);
    d.t2_bytes = es * (size_t)(Hp * Wp);
    d.tmp_bytes = es * (size_t)most;
    d.seen_bytes = (size_t)reach;
    d.t1 = malloc(d.t1_bytes * (size_t)slots);
    d.t2 = malloc(d.t2_bytes * (size_t)slots);
    d.tmp = malloc(d.tmp_bytes * (size_t)slots);
    d.seen = malloc(d.seen_bytes * (size_t)slots);
    if (!d.t1 || !d.t2 || !d.tmp || !d.seen ||
        (g->kind == GROUP_POOL && !d.v)) {
      rc = error_set(err, TOPOS_ERR_MEMORY, "out of memory");
      goto done;
    }
  }
  if (exec_units(env, dx_unit, &d, g->N, err)) rc = -1;
done:
  free(d.t1);
  free(d.t2);
  free(d.tmp);
  free(d.seen);
  free(d.v);
  return rc;
}

/* (batch, row, col) element strides of an operand of rank 2 or 3. */
static void strides3_of(const topos_tensor *t, int64_t s[3]) {
  s[0] = s[1] = s[2] = 0;
  for (int i = 0; i < t->rank; i++) s[3 - t->rank + i] = t->stride[i];
}

static void attention_task_of(const plan_group *g,
                              const topos_tensor *const *ins, topos_tensor *out,
                              topos_tensor *const *exports,
                              topos_attention_task *t) {
  memset(t, 0, sizeof *t);
  t->dtype = out->dtype;
  t->batch = g->batch;
  t->t = g->t;
  t->s = g->s;
  t->dh = g->dh;
  t->dv = g->dv;
  int64_t st[3];
  const void **data[5] = {&t->q, &t->k, &t->v, &t->scale, &t->mask};
  int64_t *strides[5] = {&t->q_batch, &t->k_batch, &t->v_batch, &t->scale_batch,
                         &t->mask_batch};
  int k = 0;
  for (int slot = 0; slot < 5; slot++) {
    if (slot == 3 && g->scaled < 0) continue;
    if (slot == 4 && g->masked < 0) continue;
    strides3_of(ins[k], st);
    *data[slot] = tensor_data(ins[k]);
    memcpy(strides[slot], st, sizeof st); /* batch, row, col in order */
    k++;
  }
  t->out = tensor_data(out);
  void **rows[5] = {&t->raw, &t->scaled, &t->masked, &t->logp, &t->probs};
  const int32_t step[5] = {g->raw, g->scaled, g->masked, g->logp, g->probs};
  for (int m = 0; m < g->nmembers; m++) {
    if (!exports[m]) continue;
    for (int j = 0; j < 5; j++)
      if (step[j] == g->members[m]) *rows[j] = tensor_data(exports[m]);
  }
}

topos_tensor *attention_begin(const plan_group *g, const tensor_meta *out,
                              const topos_tensor *const *ins,
                              topos_tensor **exports, topos_attention_task *t,
                              topos_error *err) {
  for (int k = 0; k < g->nmembers; k++) exports[k] = NULL;
  topos_tensor *y = tensor_new_meta(out, err);
  if (!y) return NULL;
  tensor_meta m = *out; /* each written row array: [..., t, s] */
  m.shape[m.rank - 1] = g->s;
  for (int k = 0; k < g->nmembers; k++) {
    if (!g->exported[k]) continue;
    exports[k] = tensor_new_meta(&m, err);
    if (!exports[k]) {
      attention_abort(g, y, exports);
      return NULL;
    }
  }
  attention_task_of(g, ins, y, exports, t);
  return y;
}

void attention_abort(const plan_group *g, topos_tensor *y,
                     topos_tensor **exports) {
  for (int k = 0; k < g->nmembers; k++) {
    topos_tensor_release(exports[k]);
    exports[k] = NULL;
  }
  topos_tensor_release(y);
}

int kernel_attention(const topos_attention_task *t, int64_t r0, int64_t r1,
                     topos_error *err) {
  scratch row = {0}, tmp = {0};
  size_t es = compute_size(t->dtype);
  if (!scratch_get(&row, t->s, es, err) || !scratch_get(&tmp, t->s, es, err)) {
    scratch_done(&row);
    return -1;
  }
  DISPATCH(t->dtype, attention_rows, t, r0, r1, row.p, tmp.p);
  scratch_done(&tmp);
  scratch_done(&row);
  return 0;
}

static topos_tensor *attention_eval(const exec_env *env, const plan_group *g,
                                    const tensor_meta *out,
                                    const topos_tensor *const *ins,
                                    topos_tensor **exports, topos_error *err) {
  topos_attention_task t;
  topos_tensor *y = attention_begin(g, out, ins, exports, &t, err);
  if (!y) return NULL;
  /* Rows per block: about STOP_MACS multiply-adds of the two products. */
  int64_t rows = t.batch * t.t;
  int64_t step = block_of(mul_sat(t.s, t.dh + t.dv), STOP_MACS);
  for (int64_t r = 0; r < rows; r += step) {
    if ((r > 0 && kernel_stop(env, err)) ||
        kernel_attention(&t, r, rows - r < step ? rows : r + step, err)) {
      attention_abort(g, y, exports);
      return NULL;
    }
  }
  return y;
}

topos_tensor *group_eval_in(const exec_env *env, const plan_group *g,
                            const tensor_meta *out,
                            const topos_tensor *const *ins,
                            topos_tensor **exports, topos_error *err) {
  if (g->kind == GROUP_ATTENTION)
    return attention_eval(env, g, out, ins, exports, err);
  if (g->kind == GROUP_GELU)
    return gelu_forward(env, g, out, ins, exports, err);
  compute_view xv;
  mm_operand W = {0};
  out_buf ob;
  if (compute_view_of(ins[0], &xv, err)) return NULL;
  if (g->kind == GROUP_CONV && mm_operand_of(ins[1], &W, err)) goto fail_x;
  if (out_begin(&ob, out, err)) goto fail_w;
  int rc = kernel_window(env, g, out->dtype, xv.data, W.data, W.s[1], W.s[2],
                         ob.data, err);
  compute_view_done(&W.view);
  compute_view_done(&xv);
  if (rc == 0) return out_end(&ob);
  out_abort(&ob);
  return NULL;
fail_w:
  compute_view_done(&W.view);
fail_x:
  compute_view_done(&xv);
  return NULL;
}

/* ------------------------------------------------------ scratch estimates */

size_t pool_bytes_of(int64_t count, size_t es) {
  if (count < 0) return SIZE_MAX;
  size_t n = (size_t)count;
  if (es != 0 && n > SIZE_MAX / es) return SIZE_MAX;
  return pool_capacity_of(n * es);
}

/* A compute view of an operand: a copy when it is bf16 or strided. */
static size_t view_bytes(const tensor_meta *m, bool contig) {
  if (m->dtype != TOPOS_BF16 && contig) return 0;
  return pool_bytes_of(shape_count(m->rank, m->shape), compute_size(m->dtype));
}

/* The f32 scratch a bf16 output is computed in. */
static size_t out_scratch_bytes(const tensor_meta *m) {
  if (m->dtype != TOPOS_BF16) return 0;
  return pool_bytes_of(shape_count(m->rank, m->shape), sizeof(float));
}

size_t op_scratch_bytes(op_code op, const node_attrs *at, int nin,
                        const tensor_meta *in, const bool *contig,
                        const tensor_meta *out) {
  size_t s = 0;
  switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_MAXIMUM:
    case OP_STEP:
    case OP_NEG:
    case OP_EXP:
    case OP_LOG:
    case OP_SQRT:
    case OP_TANH:
    case OP_ERF:
    case OP_POW:
    case OP_RELU: {
      bool real = out->dtype == TOPOS_F32 || out->dtype == TOPOS_F64;
      /* Strided real operands are walked in place (eval_binary_views). */
      if (nin == 2 && real && (!contig[0] || !contig[1])) return 0;
      for (int j = 0; j < nin; j++)
        s = size_add(s, view_bytes(&in[j], contig[j]));
      return size_add(s, out_scratch_bytes(out));
    }
    case OP_MATMUL: /* bf16 operands are widened; f32/f64 read in place */
      if (out->dtype != TOPOS_BF16) return 0;
      s = size_add(view_bytes(&in[0], false), view_bytes(&in[1], false));
      return size_add(s, out_scratch_bytes(out));
    case OP_SUM:
    case OP_SUM_ALONG:
    case OP_MAX_ALONG:
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      s = size_add(view_bytes(&in[0], contig[0]), out_scratch_bytes(out));
      if (op == OP_LOG_SOFTMAX || op == OP_LOGSUMEXP)
        s = size_add(
            s,
            pool_bytes_of(in[0].shape[at->axis] > 0 ? in[0].shape[at->axis] : 1,
                          compute_size(in[0].dtype)));
      return s;
    case OP_FOLD: {
      int64_t count = in[0].shape[at->axis];
      s = size_add(view_bytes(&in[0], contig[0]), out_scratch_bytes(out));
      s = size_add(
          s, pool_bytes_of(count > 0 ? count : 1, compute_size(in[0].dtype)));
      return size_add(s, pool_bytes_of(at->extent > 0 ? at->extent : 1, 1));
    }
    case OP_GATHER:
      return view_bytes(&in[1], contig[1]);
    case OP_SCATTER: {
      int64_t n = in[0].shape[0];
      s = size_add(view_bytes(&in[1], contig[1]),
                   view_bytes(&in[0], contig[0]));
      s = size_add(s, pool_bytes_of(n > 0 ? n : 1, sizeof(int64_t)));
      s = size_add(s, pool_bytes_of(at->extent + 1, sizeof(int64_t)));
      s = size_add(s, pool_bytes_of(n > 0 ? n : 1, compute_size(in[0].dtype)));
      return size_add(s, out_scratch_bytes(out));
    }
    default: /* leaves, views, copies into the output */
      return 0;
  }
}

size_t group_scratch_bytes(const plan_group *g, const tensor_meta *ins,
                           const bool *contig, const tensor_meta *out) {
  if (g->kind == GROUP_ATTENTION) /* a row of scores and one of exps */
    return size_mul(pool_bytes_of(g->s, compute_size(out->dtype)), 2);
  if (g->kind == GROUP_GELU) /* u and t where the plan keeps neither */
    return size_add(view_bytes(&ins[0], contig[0]),
                    size_mul(pool_bytes_of(shape_count(out->rank, out->shape),
                                           compute_size(out->dtype)),
                             2));
  size_t s = size_add(view_bytes(&ins[0], contig[0]), out_scratch_bytes(out));
  if (g->kind == GROUP_CONV && ins[1].dtype == TOPOS_BF16)
    s = size_add(s, view_bytes(&ins[1], false));
  return s;
}
