/*
 * exec.c - the dispatch: where a run's node goes to a backend.
 *
 * The reference kernels (kernels.c) compute every op and know nothing of
 * backends.  Between them and the interpreter sits this file: for the ops
 * a backend task can express (matmul as a GEMM, the elementwise ops as a
 * map, sum and sum_along as a striped reduction, a fused convolution as a
 * windowed product, a fused attention chain as an attention task) it
 * builds the task over the operands' memory and offers it down the run's
 * resolved chain (backend.c); when no backend takes it, or the chain is
 * empty (the `reference` backend), op_eval or group_eval runs.
 * Everything else goes straight to the reference.
 *
 * Each task's contract (backend.h) is the reference kernel's arithmetic,
 * so an exact backend that takes a task returns the reference's bits.
 *
 * A large task is offered in blocks - a GEMM by rows (and matrices of a
 * batch), a map by elements, a reduction by whole rows, a convolution by
 * images, attention by query rows - of about TASK_BLOCK multiply-adds or
 * elements, and the run's cancel and deadline are asked between blocks,
 * so a cancelled run stops within one block even inside one huge node.
 * Every output of a task depends only on its own chain, so a block gives
 * the bits the whole task would; each block counts as one task in the
 * reports.  The first block's answer decides: declined, the whole node
 * goes to the reference kernel (which stops between blocks too); a later
 * block a backend declines is computed by the reference loop on the same
 * arrays.
 */
#include <string.h>

#include "internal.h"

/* Work per block of a split task: ~5 ms on the exact cpu backend here
 * for a GEMM, a few ms of map or reduction. */
#define TASK_BLOCK ((int64_t)1 << 27)
#define MAP_BLOCK ((int64_t)1 << 22)
/* A chain whose first backend asks for larger tasks (backend.h,
 * task_block: a GPU, whose every task crosses the bus) gets them. */
static int64_t task_block(const exec_env *env) {
  return env && env->task_block > TASK_BLOCK ? env->task_block : TASK_BLOCK;
}
static int64_t map_block(const exec_env *env) {
  return env && env->task_block > MAP_BLOCK ? env->task_block : MAP_BLOCK;
}
/* A GEMM block keeps at least this many rows, so its B panel's packing
 * stays a small part of the block's work. */
#define GEMM_MIN_ROWS 32

static int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static size_t compute_size(topos_dtype dtype) {
  return dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

/* The map-task op of an elementwise op, or -1. */
static int map_op_of(op_code op) {
  switch (op) {
    case OP_NEG:
      return TOPOS_MAP_NEG;
    case OP_EXP:
      return TOPOS_MAP_EXP;
    case OP_LOG:
      return TOPOS_MAP_LOG;
    case OP_SQRT:
      return TOPOS_MAP_SQRT;
    case OP_TANH:
      return TOPOS_MAP_TANH;
    case OP_POW:
      return TOPOS_MAP_POW;
    case OP_RELU:
      return TOPOS_MAP_RELU;
    case OP_ADD:
      return TOPOS_MAP_ADD;
    case OP_SUB:
      return TOPOS_MAP_SUB;
    case OP_MUL:
      return TOPOS_MAP_MUL;
    case OP_DIV:
      return TOPOS_MAP_DIV;
    case OP_MAXIMUM:
      return TOPOS_MAP_MAXIMUM;
    case OP_STEP:
      return TOPOS_MAP_STEP;
    default:
      return -1;
  }
}

static bool is_real(topos_dtype d) {
  return d == TOPOS_F32 || d == TOPOS_F64;
}

/* The kind of task node `op` can become with these operands, or -1 when
 * only the reference computes it.  The rules follow the kernels: bf16
 * maps and sums travel as their f32 compute arrays, bf16 products as
 * their bf16 operands in place with an f32 output (backend.h), and a
 * binary op over strided f32/f64 views runs the reference's in-place
 * view kernel rather than copying its operands for a map. */
static int task_kind_of(op_code op, int nin, topos_tensor *const *in,
                        const tensor_meta *out) {
  if (op == OP_MATMUL)
    return is_real(out->dtype) || out->dtype == TOPOS_BF16 ? TOPOS_TASK_GEMM
                                                           : -1;
  if (op == OP_SUM || op == OP_SUM_ALONG)
    return dtype_is_float(in[0]->dtype) ? TOPOS_TASK_REDUCE : -1;
  if (map_op_of(op) < 0 || !dtype_is_float(out->dtype)) return -1;
  if (nin == 2 && is_real(out->dtype) &&
      (!topos_tensor_is_contiguous(in[0]) ||
       !topos_tensor_is_contiguous(in[1])))
    return -1;
  return TOPOS_TASK_MAP;
}

/* An f32/f64 operand read in place: (batch, row, col) element strides. */
static void strides3(const topos_tensor *t, int64_t s[3]) {
  s[0] = s[1] = s[2] = 0;
  for (int i = 0; i < t->rank; i++) s[3 - t->rank + i] = t->stride[i];
}

/* Each offer returns 1 and *res when the node is computed (by a backend,
 * or for maps and sums by the reference loop on the arrays the offer
 * prepared), 0 when op_eval must compute it, -1 with err when memory ran
 * out. */

/* A later block of a bf16 product that a backend declined: the
 * reference loop on the widened operands (made once, on first need). */
static int gemm_block_reference(const exec_env *env, const topos_tensor *a,
                                const topos_tensor *b, compute_view *va,
                                compute_view *vb, int64_t bi, int64_t i,
                                int64_t mr, int64_t m, int64_t k, int64_t n,
                                float *c, topos_error *err) {
  if (!va->data && compute_view_of(a, va, err)) return -1;
  if (!vb->data && compute_view_of(b, vb, err)) return -1;
  const float *A = (const float *)va->data + (bi * m + i) * k;
  const float *B = (const float *)vb->data + (b->rank == 3 ? bi * k * n : 0);
  return kernel_matmul(env, TOPOS_F32, A, k, 1, B, n, 1, c, mr, k, n, err);
}

static int offer_gemm(const exec_env *env, topos_tensor *const *in,
                      const tensor_meta *out, topos_tensor **res,
                      topos_error *err) {
  const topos_tensor *a = in[0], *b = in[1];
  int r = a->rank;
  int64_t m = a->shape[r - 2], k = a->shape[r - 1], n = b->shape[r - 1];
  int64_t batch = r == 3 ? a->shape[0] : 1;
  /* bf16: the operands go in place (2-byte elements), the output is the
   * f32 scratch out_end rounds once. */
  bool bf16 = out->dtype == TOPOS_BF16;
  out_buf ob;
  if (out_begin(&ob, out, err)) return -1;
  int64_t sa[3], sb[3];
  strides3(a, sa);
  strides3(b, sb);
  size_t es = bf16 ? sizeof(uint16_t) : compute_size(out->dtype);
  size_t ces = compute_size(out->dtype);
  compute_view va = {0}, vb = {0};
  /* Rows per block: the whole task when it is small. */
  int64_t per_row = mul_sat(k, n);
  int64_t rows = m;
  int64_t block = task_block(env);
  if (mul_sat(mul_sat(batch, m), per_row) > block) {
    rows = per_row > 0 ? block / per_row : m;
    if (rows < GEMM_MIN_ROWS) rows = GEMM_MIN_ROWS;
    if (rows > m) rows = m;
  }
  bool whole = rows == m;
  const char *A = tensor_data(a), *B = tensor_data(b);
  char *C = ob.data;
  bool first = true;
  int rc = 1;
  /* A small batch goes as one task; a large one matrix by matrix. */
  int64_t nb =
      whole && mul_sat(mul_sat(batch, m), per_row) <= block ? batch : 1;
  for (int64_t bi = 0; bi < batch && rc == 1; bi += nb)
    for (int64_t i = 0; i < m; i += rows) {
      int64_t mr = m - i < rows ? m - i : rows;
      if (!first && kernel_stop(env, err)) {
        rc = -1;
        break;
      }
      topos_task task = {.kind = TOPOS_TASK_GEMM};
      task.u.gemm = (topos_gemm_task){
          .dtype = out->dtype,
          .batch = nb,
          .m = mr,
          .n = n,
          .k = k,
          .a = A + (bi * sa[0] + i * sa[1]) * (int64_t)es,
          .a_row = sa[1],
          .a_col = sa[2],
          .a_batch = sa[0],
          .b = B + bi * sb[0] * (int64_t)es,
          .b_row = sb[1],
          .b_col = sb[2],
          .b_batch = sb[0],
          .c = C + (bi * m * n + i * n) * (int64_t)ces,
          .c_row = n,
          .c_col = 1,
          .c_batch = m * n,
      };
      if (exec_offer(env, &task) == 0) {
        first = false;
        continue;
      }
      if (first) { /* declined: the reference computes the whole node */
        rc = 0;
        break;
      }
      /* A later block declined: the reference loop on this block. */
      int brc = bf16 ? gemm_block_reference(env, a, b, &va, &vb, bi, i, mr, m,
                                            k, n, task.u.gemm.c, err)
                     : kernel_matmul(env, out->dtype, task.u.gemm.a, sa[1],
                                     sa[2], task.u.gemm.b, sb[1], sb[2],
                                     task.u.gemm.c, mr, k, n, err);
      if (brc) {
        rc = -1;
        break;
      }
    }
  compute_view_done(&va);
  compute_view_done(&vb);
  if (rc == 1)
    *res = out_end(&ob);
  else
    out_abort(&ob);
  return rc;
}

static int offer_map(const exec_env *env, op_code op, const node_attrs *at,
                     int nin, topos_tensor *const *in, const tensor_meta *out,
                     topos_tensor **res, topos_error *err) {
  compute_view v[2];
  topos_tensor *held[2] = {NULL, NULL}; /* strided inputs made contiguous */
  int got = 0;
  out_buf ob;
  int rc = -1;
  for (; got < nin; got++) {
    const topos_tensor *src = in[got];
    if (src->dtype != TOPOS_BF16 && !topos_tensor_is_contiguous(src)) {
      if (!(held[got] = contiguous_in(env, src, err))) goto done;
      src = held[got];
    }
    if (compute_view_of(src, &v[got], err)) goto done;
  }
  if (out_begin(&ob, out, err)) goto done;
  topos_task task = {.kind = TOPOS_TASK_MAP};
  task.u.map = (topos_map_task){
      .dtype = out->dtype == TOPOS_F64 ? TOPOS_F64 : TOPOS_F32,
      .op = (topos_map_op)map_op_of(op),
      .p = at->p,
      .n = shape_count(out->rank, out->shape),
      .a = v[0].data,
      .b = nin > 1 ? v[1].data : NULL,
      .y = ob.data,
  };
  /* In blocks of MAP_BLOCK elements; a declined block runs the reference
   * loop on the arrays already prepared. */
  int64_t total = task.u.map.n;
  size_t es = task.u.map.dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  int64_t block = map_block(env);
  for (int64_t i = 0; i < total || i == 0; i += block) {
    int64_t len = total - i < block ? total - i : block;
    if (i > 0 && kernel_stop(env, err)) {
      out_abort(&ob);
      goto done;
    }
    topos_task blk = task;
    blk.u.map.n = len;
    blk.u.map.a = (const char *)v[0].data + i * (int64_t)es;
    blk.u.map.b = nin > 1 ? (const char *)v[1].data + i * (int64_t)es : NULL;
    blk.u.map.y = (char *)ob.data + i * (int64_t)es;
    if (exec_offer(env, &blk) != 0 &&
        kernel_elementwise(env, op, at->p, out->dtype, nin, blk.u.map.a,
                           blk.u.map.b, blk.u.map.y, len, err)) {
      out_abort(&ob);
      goto done;
    }
    if (len <= 0) break;
  }
  *res = out_end(&ob);
  rc = 1;
done:
  for (int i = 0; i < got; i++) compute_view_done(&v[i]);
  for (int i = 0; i < nin; i++) topos_tensor_release(held[i]);
  return rc;
}

static int offer_reduce(const exec_env *env, op_code op, const node_attrs *at,
                        const topos_tensor *a, const tensor_meta *out,
                        topos_tensor **res, topos_error *err) {
  int64_t outer = 1, L = shape_count(a->rank, a->shape), inner = 1;
  if (op == OP_SUM_ALONG) around_axis(a, at->axis, &outer, &L, &inner);
  compute_view v;
  out_buf ob;
  if (compute_view_of(a, &v, err)) return -1;
  if (out_begin(&ob, out, err)) {
    compute_view_done(&v);
    return -1;
  }
  topos_task task = {.kind = TOPOS_TASK_REDUCE};
  task.u.reduce = (topos_reduce_task){
      .dtype = a->dtype == TOPOS_F64 ? TOPOS_F64 : TOPOS_F32,
      .outer = outer,
      .L = L,
      .inner = inner,
      .x = v.data,
      .y = ob.data,
  };
  /* In blocks of whole rows; a declined block runs the reference loop on
   * the arrays already prepared. */
  size_t es = compute_size(a->dtype);
  int64_t row = mul_sat(L, inner);
  int64_t step = outer;
  if (mul_sat(outer, row) > task_block(env)) {
    step = row > 0 ? task_block(env) / row : outer;
    if (step < 1) step = 1;
  }
  for (int64_t o = 0; o < outer || o == 0; o += step) {
    int64_t nb = outer - o < step ? outer - o : step;
    if (o > 0 && kernel_stop(env, err)) {
      out_abort(&ob);
      compute_view_done(&v);
      return -1;
    }
    topos_task blk = task;
    blk.u.reduce.outer = nb;
    blk.u.reduce.x = (const char *)v.data + o * row * (int64_t)es;
    blk.u.reduce.y = (char *)ob.data + o * inner * (int64_t)es;
    if (exec_offer(env, &blk) != 0 &&
        kernel_sum_rows(env, a->dtype, blk.u.reduce.x, blk.u.reduce.y, nb, L,
                        inner, err)) {
      out_abort(&ob);
      compute_view_done(&v);
      return -1;
    }
    if (nb <= 0) break;
  }
  *res = out_end(&ob);
  compute_view_done(&v);
  return 1;
}

topos_tensor *exec_eval(const exec_env *env, op_code op, const node_attrs *at,
                        int nin, topos_tensor *const *in,
                        const tensor_meta *out, topos_error *err) {
  int kind = task_kind_of(op, nin, in, out);
  if (kind < 0) return op_eval_in(env, op, at, nin, in, out, err);
  if (env->nchain == 0) {
    exec_reference_ran(env);
    return op_eval_in(env, op, at, nin, in, out, err);
  }
  topos_tensor *res = NULL;
  int rc;
  if (kind == TOPOS_TASK_GEMM)
    rc = offer_gemm(env, in, out, &res, err);
  else if (kind == TOPOS_TASK_REDUCE)
    rc = offer_reduce(env, op, at, in[0], out, &res, err);
  else
    rc = offer_map(env, op, at, nin, in, out, &res, err);
  if (rc > 0) return res;
  if (rc < 0) return NULL;
  return op_eval_in(env, op, at, nin, in, out, err);
}

/* An attention group: its task over the inputs in place, offered in
 * blocks of whole query rows. */
static topos_tensor *offer_attention(const exec_env *env, const plan_group *g,
                                     const tensor_meta *out,
                                     const topos_tensor *const *ins,
                                     topos_tensor **exports, topos_error *err) {
  topos_task task = {.kind = TOPOS_TASK_ATTENTION};
  topos_tensor *y =
      attention_begin(g, out, ins, exports, &task.u.attention, err);
  if (!y) return NULL;
  const topos_attention_task *t = &task.u.attention;
  int64_t rows = t->batch * t->t;
  int64_t per = mul_sat(t->s, t->dh + t->dv);
  int64_t step = rows;
  if (mul_sat(rows, per) > task_block(env)) {
    step = per > 0 ? task_block(env) / per : rows;
    if (step < 1) step = 1;
  }
  size_t es = compute_size(out->dtype);
  int rc = 0;
  for (int64_t r = 0; r < rows;) {
    if (r > 0 && kernel_stop(env, err)) {
      rc = -1;
      break;
    }
    /* A block is whole matrices when it starts on one and the step covers
     * one, else rows of a single matrix. */
    int64_t b0 = r / t->t, i0 = r % t->t, nr;
    topos_task blk = task;
    topos_attention_task *u = &blk.u.attention;
    if (i0 == 0 && step >= t->t) {
      u->batch = step / t->t < t->batch - b0 ? step / t->t : t->batch - b0;
      nr = u->batch * t->t;
    } else {
      nr = step < t->t - i0 ? step : t->t - i0;
      u->batch = 1;
      u->t = nr;
    }
    u->q = (const char *)t->q + (b0 * t->q_batch + i0 * t->q_row) * (int64_t)es;
    u->k = (const char *)t->k + b0 * t->k_batch * (int64_t)es;
    u->v = (const char *)t->v + b0 * t->v_batch * (int64_t)es;
    if (t->scale)
      u->scale = (const char *)t->scale +
                 (b0 * t->scale_batch + i0 * t->scale_row) * (int64_t)es;
    if (t->mask)
      u->mask = (const char *)t->mask +
                (b0 * t->mask_batch + i0 * t->mask_row) * (int64_t)es;
    u->out = (char *)t->out + r * t->dv * (int64_t)es;
    void **row_out[5] = {&u->raw, &u->scaled, &u->masked, &u->logp, &u->probs};
    for (int j = 0; j < 5; j++)
      if (*row_out[j])
        *row_out[j] = (char *)*row_out[j] + r * t->s * (int64_t)es;
    if (exec_offer(env, &blk) != 0) {
      if (r == 0) { /* declined: the reference computes the whole group */
        rc = 1;
        break;
      }
      /* A later block declined: the reference rows on the same arrays. */
      if (kernel_attention(t, r, r + nr, err)) {
        rc = -1;
        break;
      }
    }
    r += nr;
  }
  if (rc == 0) return y;
  attention_abort(g, y, exports);
  return rc > 0 ? group_eval_in(env, g, out, ins, exports, err) : NULL;
}

/* The convolution's x cotangent starts as the unfused adjoint does: da =
 * gy·weightᵀ through exec_eval (the same operands, so the same backend
 * and bits); the folds below it, and the weight's and the max-pool's
 * cotangents, are the reference kernels'. */
int exec_group_grad(const exec_env *env, const plan_group *g,
                    const topos_tensor *gy, const topos_tensor *x,
                    const topos_tensor *other, bool want_x, bool want_w,
                    topos_tensor **dx, topos_tensor **dw, topos_error *err) {
  *dx = *dw = NULL;
  topos_dtype dt = gy->dtype;
  compute_view xv = {0}, gv = {0}, yv = {0}, av = {0};
  topos_tensor *da = NULL;
  out_buf ob;
  int rc = -1;
  if (compute_view_of(x, &xv, err) || compute_view_of(gy, &gv, err)) goto done;
  if (g->kind == GROUP_CONV && want_w) {
    tensor_meta m = {.dtype = dt, .rank = 2};
    m.shape[0] = g->C * g->kh * g->kw;
    m.shape[1] = g->nout;
    if (out_begin(&ob, &m, err)) goto done;
    if (kernel_window_dw(env, g, dt, xv.data, gv.data, ob.data, err)) {
      out_abort(&ob);
      goto done;
    }
    *dw = out_end(&ob);
  }
  if (want_x) {
    const void *src = NULL;
    if (g->kind == GROUP_CONV) {
      topos_tensor *wt = topos_tensor_transpose(other, err);
      if (!wt) goto done;
      tensor_meta m = {.dtype = dt, .rank = 2};
      m.shape[0] = g->N * g->oh * g->ow;
      m.shape[1] = g->C * g->kh * g->kw;
      topos_tensor *in[2] = {(topos_tensor *)gy, wt};
      node_attrs none = {0};
      da = exec_eval(env, OP_MATMUL, &none, 2, in, &m, err);
      topos_tensor_release(wt);
      if (!da || compute_view_of(da, &av, err)) goto done;
      src = av.data;
    } else if (compute_view_of(other, &yv, err)) {
      goto done;
    }
    tensor_meta m = {.dtype = dt, .rank = 4};
    m.shape[0] = g->N;
    m.shape[1] = g->C;
    m.shape[2] = g->H;
    m.shape[3] = g->W;
    if (out_begin(&ob, &m, err)) goto done;
    if (kernel_window_dx(env, g, dt, src, xv.data, yv.data, gv.data, ob.data,
                         err)) {
      out_abort(&ob);
      goto done;
    }
    *dx = out_end(&ob);
  }
  rc = 0;
done:
  compute_view_done(&xv);
  compute_view_done(&gv);
  compute_view_done(&yv);
  compute_view_done(&av);
  topos_tensor_release(da);
  if (rc) {
    topos_tensor_release(*dx);
    topos_tensor_release(*dw);
    *dx = *dw = NULL;
  }
  return rc;
}

topos_tensor *exec_group(const exec_env *env, const plan_group *g,
                         const tensor_meta *out, const topos_tensor *const *ins,
                         topos_tensor **exports, topos_error *err) {
  if (g->kind == GROUP_GELU) /* offers its tanh, runs its passes as units */
    return gelu_forward(env, g, out, ins, exports, err);
  if (!is_real(out->dtype) || g->kind == GROUP_POOL)
    return group_eval_in(env, g, out, ins, exports, err);
  if (env->nchain == 0) {
    exec_reference_ran(env);
    return group_eval_in(env, g, out, ins, exports, err);
  }
  if (g->kind == GROUP_ATTENTION)
    return offer_attention(env, g, out, ins, exports, err);
  const topos_tensor *x = ins[0], *weight = ins[1];
  compute_view xv;
  if (compute_view_of(x, &xv, err)) return NULL;
  topos_tensor *y = tensor_new_meta(out, err);
  if (!y) {
    compute_view_done(&xv);
    return NULL;
  }
  int64_t sw[3];
  strides3(weight, sw);
  topos_task task = {.kind = TOPOS_TASK_WINDOW};
  task.u.window = (topos_window_task){
      .dtype = out->dtype,
      .n = g->N,
      .c = g->C,
      .h = g->H,
      .w = g->W,
      .x = xv.data,
      .o = g->nout,
      .weight = tensor_data(weight),
      .w_row = sw[1],
      .w_col = sw[2],
      .kh = g->kh,
      .kw = g->kw,
      .stride_h = g->stride_h,
      .stride_w = g->stride_w,
      .dil_h = g->dil_h,
      .dil_w = g->dil_w,
      .pad_top = g->pad_top,
      .pad_left = g->pad_left,
      .oh = g->oh,
      .ow = g->ow,
      .out = tensor_data(y),
  };
  /* In blocks of whole images. */
  size_t es = compute_size(out->dtype);
  int64_t image = g->C * g->H * g->W, image_out = g->oh * g->ow * g->nout;
  int64_t per = mul_sat(image_out, g->C * g->kh * g->kw);
  int64_t step = g->N;
  if (mul_sat(g->N, per) > task_block(env)) {
    step = per > 0 ? task_block(env) / per : g->N;
    if (step < 1) step = 1;
  }
  int rc = 0;
  for (int64_t n = 0; n < g->N || n == 0; n += step) {
    int64_t nb = g->N - n < step ? g->N - n : step;
    if (n > 0 && kernel_stop(env, err)) {
      rc = -1;
      break;
    }
    topos_task blk = task;
    blk.u.window.n = nb;
    blk.u.window.x = (const char *)xv.data + n * image * (int64_t)es;
    blk.u.window.out = (char *)tensor_data(y) + n * image_out * (int64_t)es;
    if (exec_offer(env, &blk) != 0) {
      if (n == 0) { /* declined: the reference computes the whole group */
        rc = 1;
        break;
      }
      plan_group sub = *g;
      sub.N = nb;
      if (kernel_window(env, &sub, out->dtype, blk.u.window.x,
                        blk.u.window.weight, sw[1], sw[2], blk.u.window.out,
                        err)) {
        rc = -1;
        break;
      }
    }
    if (nb <= 0) break;
  }
  compute_view_done(&xv);
  if (rc == 0) return y;
  topos_tensor_release(y);
  return rc > 0 ? group_eval_in(env, g, out, ins, exports, err) : NULL;
}
