/*
 * adjoint.c - every op's adjoint (vector-Jacobian product), written once in
 * the op set itself, and the reverse scan that drives them.
 *
 * A rule emits ordinary ops through a builder (internal.h).  backward()
 * passes a builder that evaluates each op at once with the reference
 * kernels; differentiate passes one that records them as tape nodes.  So
 * the gradient a plan computes from recorded adjoints and the gradient
 * backward() returns come from the same rule, op for op.
 *
 * A rule may read only the values its op declares in op_table[].reads;
 * the evaluating builder refuses any other read, so the declaration that
 * plan liveness relies on is checked every time backward runs.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------- builder helpers */

static int32_t emit(builder *b, op_code op, const int32_t *in, int nin,
                    const node_attrs *at) {
  for (int i = 0; i < nin; i++)
    if (in[i] < 0) return -1;
  return b->emit(b, op, in, nin, at);
}

int32_t b_unary(builder *b, op_code op, int32_t a) {
  return emit(b, op, &a, 1, NULL);
}

int32_t b_binary(builder *b, op_code op, int32_t a, int32_t c) {
  int32_t in[2] = {a, c};
  return emit(b, op, in, 2, NULL);
}

static int32_t b_attr(builder *b, op_code op, int32_t a, const node_attrs *at) {
  return emit(b, op, &a, 1, at);
}

static int32_t b_broadcast(builder *b, int32_t a, int rank,
                           const int64_t *shape) {
  node_attrs at = {0};
  at.rank = rank;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)rank);
  return b_attr(b, OP_BROADCAST, a, &at);
}

static int32_t b_reshape(builder *b, int32_t a, const tensor_meta *m) {
  node_attrs at = {0};
  at.rank = m->rank;
  memcpy(at.shape, m->shape, sizeof(int64_t) * (size_t)m->rank);
  return b_attr(b, OP_RESHAPE, a, &at);
}

int32_t b_fill_like(builder *b, int32_t h, double value) {
  if (h < 0) return -1;
  const tensor_meta *m = b->meta(b, h);
  tensor_meta copy = *m; /* meta() may move when the builder grows */
  int32_t s = b->scalar(b, copy.dtype, value);
  return b_broadcast(b, s, copy.rank, copy.shape);
}

static int32_t b_axis(builder *b, op_code op, int32_t a, int axis) {
  node_attrs at = {0};
  at.axis = axis;
  return b_attr(b, op, a, &at);
}

static int32_t b_along(builder *b, int32_t a, int axis, int64_t extent) {
  node_attrs at = {0};
  at.axis = axis;
  at.extent = extent;
  return b_attr(b, OP_BROADCAST_ALONG, a, &at);
}

static int32_t b_narrow(builder *b, int32_t a, int axis, int64_t start,
                        int64_t length) {
  node_attrs at = {0};
  at.axis = axis;
  at.start = start;
  at.length = length;
  return b_attr(b, OP_NARROW, a, &at);
}

static int32_t b_pad(builder *b, int32_t a, int axis, int64_t before,
                     int64_t after) {
  node_attrs at = {0};
  at.axis = axis;
  at.before = before;
  at.after = after;
  return b_attr(b, OP_PAD, a, &at);
}

/* Swaps the last two axes (transpose for rank 2, permute for batches). */
static int32_t b_swap_last(builder *b, int32_t a, int rank) {
  if (rank == 2) return b_unary(b, OP_TRANSPOSE, a);
  node_attrs at = {0};
  at.perm[0] = 0;
  at.perm[1] = 2;
  at.perm[2] = 1;
  return b_attr(b, OP_PERMUTE, a, &at);
}

/* --------------------------------------------------------- the adjoints */

/* Routes g to the first maximal position along the axis.  The mask of
 * maxima m = step(a, y) is 1 at every tie; an inclusive prefix count of m
 * (by doubling: s += shift(s, 1), shift(s, 2), ...) is 1 exactly at the
 * first of them, so first = m · step(1, count). */
static int32_t max_along_adjoint(builder *b, const node *n, int32_t g,
                                 int32_t y, int32_t a, int64_t L) {
  int axis = n->at.axis;
  int32_t m = b_binary(b, OP_STEP, a, b_along(b, y, axis, L));
  int32_t count = m;
  for (int64_t k = 1; k < L; k *= 2) {
    int32_t shifted = b_pad(b, b_narrow(b, count, axis, 0, L - k), axis, k, 0);
    count = b_binary(b, OP_ADD, count, shifted);
  }
  int32_t first = b_binary(
      b, OP_MUL, m, b_binary(b, OP_STEP, b_fill_like(b, count, 1.0), count));
  return b_binary(b, OP_MUL, b_along(b, g, axis, L), first);
}

int op_adjoint(builder *b, const node *n, int32_t g, int32_t y,
               const int32_t *x, int32_t *dx, const bool *want) {
  const node_attrs *at = &n->at;
  for (int i = 0; i < n->nin; i++) dx[i] = -1;
#define W(j) (want == NULL || want[j])
  /* Operand shapes, copied: builder storage may move while emitting. */
  tensor_meta a = n->nin > 0 ? *b->meta(b, x[0]) : n->meta;
  switch (n->op) {
    case OP_CONSTANT:
    case OP_PARAMETER:
    case OP_INPUT:
    case OP_STEP:
      return 0; /* leaves, and step is locally constant */
    case OP_ADD:
      if (W(0)) dx[0] = g;
      if (W(1)) dx[1] = g;
      break;
    case OP_SUB:
      if (W(0)) dx[0] = g;
      if (W(1)) dx[1] = b_unary(b, OP_NEG, g);
      break;
    case OP_MUL:
      if (W(0)) dx[0] = b_binary(b, OP_MUL, g, x[1]);
      if (W(1)) dx[1] = b_binary(b, OP_MUL, g, x[0]);
      break;
    case OP_DIV: /* g/b and -g·y/b */
      if (W(0)) dx[0] = b_binary(b, OP_DIV, g, x[1]);
      if (W(1))
        dx[1] = b_unary(b, OP_NEG,
                        b_binary(b, OP_DIV, b_binary(b, OP_MUL, g, y), x[1]));
      break;
    case OP_NEG:
      dx[0] = b_unary(b, OP_NEG, g);
      break;
    case OP_EXP:
      dx[0] = b_binary(b, OP_MUL, g, y);
      break;
    case OP_LOG:
      dx[0] = b_binary(b, OP_DIV, g, x[0]);
      break;
    case OP_SQRT: /* g/(2y), with 2y written y+y (exact) */
      dx[0] = b_binary(b, OP_DIV, g, b_binary(b, OP_ADD, y, y));
      break;
    case OP_TANH: /* g·(1 - y²) */
      dx[0] = b_binary(b, OP_MUL, g,
                       b_binary(b, OP_SUB, b_fill_like(b, y, 1.0),
                                b_binary(b, OP_MUL, y, y)));
      break;
    case OP_ERF: /* g·(2/√π)·exp(−a²) */
      dx[0] = b_binary(
          b, OP_MUL, g,
          b_binary(
              b, OP_MUL, b_fill_like(b, x[0], 1.12837916709551257390),
              b_unary(b, OP_EXP,
                      b_unary(b, OP_NEG, b_binary(b, OP_MUL, x[0], x[0])))));
      break;
    case OP_POW: { /* g·p·a^(p-1); exactly zero for p = 0 */
      if (at->p == 0) break;
      node_attrs pm = {0};
      pm.p = at->p - 1;
      dx[0] = b_binary(b, OP_MUL, g,
                       b_binary(b, OP_MUL, b_fill_like(b, x[0], at->p),
                                b_attr(b, OP_POW, x[0], &pm)));
      break;
    }
    case OP_MAXIMUM: { /* ties go to a */
      int32_t m = b_binary(b, OP_STEP, x[0], x[1]);
      if (W(0)) dx[0] = b_binary(b, OP_MUL, g, m);
      if (W(1))
        dx[1] = b_binary(b, OP_MUL, g,
                         b_binary(b, OP_SUB, b_fill_like(b, m, 1.0), m));
      break;
    }
    case OP_RELU: /* g·step(a, 0): the subgradient at 0 is 1 */
      dx[0] = b_binary(b, OP_MUL, g,
                       b_binary(b, OP_STEP, x[0], b_fill_like(b, x[0], 0.0)));
      break;
    case OP_MATMUL:
      if (W(0)) dx[0] = b_binary(b, OP_MATMUL, g, b_swap_last(b, x[1], a.rank));
      if (W(1)) dx[1] = b_binary(b, OP_MATMUL, b_swap_last(b, x[0], a.rank), g);
      break;
    case OP_TRANSPOSE:
      dx[0] = b_unary(b, OP_TRANSPOSE, g);
      break;
    case OP_PERMUTE: {
      node_attrs inv = {0};
      for (int i = 0; i < a.rank; i++) inv.perm[at->perm[i]] = i;
      dx[0] = b_attr(b, OP_PERMUTE, g, &inv);
      break;
    }
    case OP_RESHAPE:
      dx[0] = b_reshape(b, g, &a);
      break;
    case OP_NARROW:
      dx[0] = b_pad(b, g, at->axis, at->start,
                    a.shape[at->axis] - at->start - at->length);
      break;
    case OP_PAD:
      dx[0] = b_narrow(b, g, at->axis, at->before, a.shape[at->axis]);
      break;
    case OP_UNFOLD: {
      node_attrs f = *at;
      f.extent = a.shape[at->axis];
      dx[0] = b_attr(b, OP_FOLD, g, &f);
      break;
    }
    case OP_FOLD:
      dx[0] = b_attr(b, OP_UNFOLD, g, at);
      break;
    case OP_CONCAT: {
      int64_t offset = 0;
      for (int i = 0; i < n->nin; i++) {
        int64_t len = b->meta(b, x[i])->shape[at->axis];
        if (W(i)) dx[i] = b_narrow(b, g, at->axis, offset, len);
        offset += len;
      }
      break;
    }
    case OP_BROADCAST: {
      if (a.rank == 0) {
        dx[0] = b_unary(b, OP_SUM, g);
        break;
      }
      /* Sum the broadcast axes away, highest first, then restore the 1s. */
      int32_t h = g;
      bool reduced = false;
      for (int d = a.rank - 1; d >= 0; d--) {
        if (a.shape[d] == 1 && n->meta.shape[d] != 1) {
          h = b_axis(b, OP_SUM_ALONG, h, d);
          reduced = true;
        }
      }
      dx[0] = reduced ? b_reshape(b, h, &a) : h;
      break;
    }
    case OP_BROADCAST_ALONG:
      dx[0] = b_axis(b, OP_SUM_ALONG, g, at->axis);
      break;
    case OP_SUM:
      dx[0] = b_broadcast(b, g, a.rank, a.shape);
      break;
    case OP_SUM_ALONG:
      dx[0] = b_along(b, g, at->axis, a.shape[at->axis]);
      break;
    case OP_MAX_ALONG:
      dx[0] = max_along_adjoint(b, n, g, y, x[0], a.shape[at->axis]);
      break;
    case OP_LOG_SOFTMAX: { /* g - exp(y)·sum_along(g) */
      int64_t L = a.shape[at->axis];
      int32_t total =
          b_along(b, b_axis(b, OP_SUM_ALONG, g, at->axis), at->axis, L);
      dx[0] = b_binary(b, OP_SUB, g,
                       b_binary(b, OP_MUL, b_unary(b, OP_EXP, y), total));
      break;
    }
    case OP_LOGSUMEXP: { /* g·exp(a - y), both broadcast back */
      int64_t L = a.shape[at->axis];
      int32_t e = b_unary(
          b, OP_EXP, b_binary(b, OP_SUB, x[0], b_along(b, y, at->axis, L)));
      dx[0] = b_binary(b, OP_MUL, b_along(b, g, at->axis, L), e);
      break;
    }
    case OP_GATHER: {
      node_attrs s = {0};
      s.extent = a.shape[0];
      int32_t in[2] = {g, x[1]};
      if (W(0)) dx[0] = emit(b, OP_SCATTER, in, 2, &s);
      break;
    }
    case OP_SCATTER:
      if (W(0)) dx[0] = b_binary(b, OP_GATHER, g, x[1]);
      break;
    case OP_COUNT:
      return -1;
  }
  for (int i = 0; i < n->nin; i++) {
    /* Integer operands (indices) take no gradient. */
    if (dx[i] >= 0 && !dtype_is_float(b->meta(b, x[i])->dtype)) dx[i] = -1;
  }
  /* Every float operand gets a cotangent (pow with p = 0 gets an exact
   * zero by having none); a missing one means an emitted op failed. */
  if (n->op == OP_POW && at->p == 0) return 0;
  for (int i = 0; i < n->nin; i++)
    if (W(i) && dx[i] < 0 && dtype_is_float(b->meta(b, x[i])->dtype)) return -1;
  return 0;
#undef W
}

/* ------------------------------------------------------------ the scan */

/* The builder has put the failing op's message in err; name the node. */
static int prefix_error(topos_error *err, const node *n, int index) {
  char inner[sizeof err->message];
  snprintf(inner, sizeof inner, "%s",
           err->code ? err->message : "an emitted op failed");
  return error_set(err, err->code ? err->code : TOPOS_ERR_STATE,
                   "backward through %s (node %d): %s", op_table[n->op].name,
                   index, inner);
}

int backward_scan(builder *b, int target, int32_t *grads, bool params_only,
                  const exec_env *env, topos_error *err) {
  bool *ancestor = calloc((size_t)target + 1, sizeof(bool));
  /* params_only: wanted[i] says a parameter is node i or one of its
   * ancestors; cotangents flow only into wanted nodes.  Every consumer of
   * a wanted node is wanted, so a wanted node still receives every
   * contribution, in the same order, and its bits are unchanged. */
  bool *wanted = params_only ? calloc((size_t)target + 1, sizeof(bool)) : NULL;
  if (!ancestor || (params_only && !wanted)) {
    free(ancestor);
    free(wanted);
    return error_set(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  ancestor[target] = true;
  for (int i = target; i >= 0; i--) {
    grads[i] = -1;
    if (!ancestor[i]) continue;
    const node *n = b->node_at(b, i);
    for (int j = 0; j < n->nin; j++) ancestor[n->in[j]] = true;
  }
  if (wanted) {
    for (int i = 0; i <= target; i++) {
      const node *n = b->node_at(b, i);
      bool w = n->op == OP_PARAMETER;
      for (int j = 0; j < n->nin && !w; j++) w = wanted[n->in[j]];
      wanted[i] = w;
    }
  }
  int rc = 0;
  grads[target] = b->scalar(b, b->node_at(b, target)->meta.dtype, 1.0);
  b->settle(b, &grads[target], 1);
  for (int i = target; i >= 0 && rc == 0; i--) {
    /* A copy: recording adjoints may move the node array.  Its operand
     * list is a separate allocation and stays put. */
    const node copy = *b->node_at(b, i);
    const node *n = &copy;
    if (!ancestor[i] || grads[i] < 0 || op_table[n->op].arity == 0) continue;
    if (wanted && !wanted[i]) continue;
    topos_error stop = {0};
    if (env && exec_stop(env, &stop)) {
      rc = error_set(err, stop.code, "%s", stop.message);
      break;
    }
    if (b->group_adjoint) {
      /* A fused group's adjoint: its inputs' cotangents at once. */
      int32_t to[2], gdx[2], keep[2];
      int ng = 0, nkeep = 0;
      int r = b->group_adjoint(b, i, grads[i], wanted, to, gdx, &ng);
      if (r < 0) {
        rc = prefix_error(err, n, i);
        break;
      }
      if (r > 0) {
        for (int k = 0; k < ng && rc == 0; k++) {
          int32_t *acc = &grads[to[k]];
          *acc = *acc < 0 ? gdx[k] : b_binary(b, OP_ADD, *acc, gdx[k]);
          if (*acc < 0) rc = prefix_error(err, n, i);
          keep[nkeep++] = *acc;
        }
        b->settle(b, keep, nkeep);
        continue;
      }
    }
    unsigned reads = op_table[n->op].reads;
    int32_t x[n->nin > 0 ? n->nin : 1], dx[n->nin > 0 ? n->nin : 1];
    bool want[n->nin > 0 ? n->nin : 1];
    int32_t y = b->value(b, i, reads & READS_OUTPUT);
    for (int j = 0; j < n->nin; j++) {
      x[j] = b->value(b, n->in[j], reads & READS_OPERAND(j));
      want[j] = !wanted || wanted[n->in[j]];
    }
    if (op_adjoint(b, n, grads[i], y, x, dx, want) != 0) {
      rc = prefix_error(err, n, i);
      break;
    }
    int32_t keep[n->nin > 0 ? n->nin : 1];
    int nkeep = 0;
    for (int j = 0; j < n->nin; j++) {
      if (dx[j] < 0) continue;
      int32_t *acc = &grads[n->in[j]];
      *acc = *acc < 0 ? dx[j] : b_binary(b, OP_ADD, *acc, dx[j]);
      if (*acc < 0) {
        rc = prefix_error(err, n, i);
        break;
      }
      keep[nkeep++] = *acc;
    }
    b->settle(b, keep, nkeep);
  }
  free(ancestor);
  free(wanted);
  return rc;
}
