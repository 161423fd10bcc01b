/*
 * exec.c - the dispatch: where a run's node goes to a backend.
 *
 * The reference kernels (kernels.c) compute every op and know nothing of
 * backends.  Between them and the interpreter sits this file: for the ops
 * a backend task can express (matmul as a GEMM, the elementwise ops as a
 * map, sum and sum_along as a striped reduction, a fused convolution as a
 * windowed product) it builds the task over the operands' memory and
 * offers it down the run's resolved chain (backend.c); when no backend
 * takes it, or the chain is empty (the `reference` backend), op_eval or
 * group_eval runs.  Everything else goes straight to the reference.
 *
 * Each task's contract (backend.h) is the reference kernel's arithmetic,
 * so an exact backend that takes a task returns the reference's bits.
 */
#include <string.h>

#include "internal.h"

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
 * maps and sums travel as their f32 compute arrays, bf16 products stay
 * on the reference (its f32 scratch is the exact computation), and a
 * binary op over strided f32/f64 views runs the reference's in-place
 * view kernel rather than copying its operands for a map. */
static int task_kind_of(op_code op, int nin, topos_tensor *const *in,
                        const tensor_meta *out) {
  if (op == OP_MATMUL) return is_real(out->dtype) ? TOPOS_TASK_GEMM : -1;
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

static int offer_gemm(const exec_env *env, topos_tensor *const *in,
                      const tensor_meta *out, topos_tensor **res,
                      topos_error *err) {
  const topos_tensor *a = in[0], *b = in[1];
  int r = a->rank;
  int64_t m = a->shape[r - 2], k = a->shape[r - 1], n = b->shape[r - 1];
  topos_tensor *c = tensor_new_meta(out, err);
  if (!c) return -1;
  int64_t sa[3], sb[3];
  strides3(a, sa);
  strides3(b, sb);
  topos_task task = {.kind = TOPOS_TASK_GEMM};
  task.u.gemm = (topos_gemm_task){
      .dtype = out->dtype,
      .batch = r == 3 ? a->shape[0] : 1,
      .m = m,
      .n = n,
      .k = k,
      .a = tensor_data(a),
      .a_row = sa[1],
      .a_col = sa[2],
      .a_batch = sa[0],
      .b = tensor_data(b),
      .b_row = sb[1],
      .b_col = sb[2],
      .b_batch = sb[0],
      .c = tensor_data(c),
      .c_row = n,
      .c_col = 1,
      .c_batch = m * n,
  };
  if (exec_offer(env, &task) != 0) {
    topos_tensor_release(c);
    return 0;
  }
  *res = c;
  return 1;
}

static int offer_map(const exec_env *env, op_code op, const node_attrs *at,
                     int nin, topos_tensor *const *in, const tensor_meta *out,
                     topos_tensor **res, topos_error *err) {
  compute_view v[2];
  int got = 0;
  out_buf ob;
  int rc = -1;
  for (; got < nin; got++)
    if (compute_view_of(in[got], &v[got], err)) goto done;
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
  /* Declined: the reference loop on the arrays already prepared. */
  if (exec_offer(env, &task) != 0)
    kernel_elementwise(op, at->p, out->dtype, nin, v[0].data,
                       nin > 1 ? v[1].data : NULL, ob.data, task.u.map.n);
  *res = out_end(&ob);
  rc = 1;
done:
  for (int i = 0; i < got; i++) compute_view_done(&v[i]);
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
  /* Declined: the reference loop on the arrays already prepared. */
  if (exec_offer(env, &task) != 0)
    kernel_sum_rows(a->dtype, v.data, ob.data, outer, L, inner);
  *res = out_end(&ob);
  compute_view_done(&v);
  return 1;
}

topos_tensor *exec_eval(const exec_env *env, op_code op, const node_attrs *at,
                        int nin, topos_tensor *const *in,
                        const tensor_meta *out, topos_error *err) {
  int kind = task_kind_of(op, nin, in, out);
  if (kind < 0) return op_eval(op, at, nin, in, out, err);
  if (env->nchain == 0) {
    exec_reference_ran(env);
    return op_eval(op, at, nin, in, out, err);
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
  return op_eval(op, at, nin, in, out, err);
}

topos_tensor *exec_group(const exec_env *env, const plan_group *g,
                         const tensor_meta *out, const topos_tensor *x,
                         const topos_tensor *weight, topos_error *err) {
  if (g->kind != GROUP_CONV || !is_real(out->dtype))
    return group_eval(g, out, x, weight, err);
  if (env->nchain == 0) {
    exec_reference_ran(env);
    return group_eval(g, out, x, weight, err);
  }
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
  int rc = exec_offer(env, &task);
  compute_view_done(&xv);
  if (rc == 0) return y;
  topos_tensor_release(y);
  return group_eval(g, out, x, weight, err);
}
