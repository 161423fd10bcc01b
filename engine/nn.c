/*
 * nn.c - the neural composites: linear layers, activations, embeddings,
 * normalisations, convolution, pooling and losses.
 *
 * Every composite here is an ordinary client of the public API (it
 * includes only topos.h): it records a chain of ops from ops.md and has no
 * adjoint of its own, so its gradient is whatever reverse mode derives
 * from that chain, and every faster backend that reproduces the ops
 * reproduces the composites bit for bit.  Constants are recorded in the
 * tape's dtype as a rank-0 scalar broadcast to the shape needed, because
 * no op broadcasts implicitly.
 *
 * Errors follow the tape's convention: the tape keeps the first error and
 * later calls return an invalid value.  Wrong shapes are left to the op
 * that cannot accept them, so the message names that op, its node and the
 * operand shapes.  Where a composite needs a shape fact before it can
 * record anything (a rank, an extent), and the fact is wrong, it records
 * its own message with topos_tape_fail (see fail_on) and returns
 * TOPOS_NONE; nothing here prints or aborts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "topos.h"

/* A copied shape.  topos_value_shape returns a pointer into the tape's
 * node storage, which moves when the tape grows, so composites copy the
 * extents before recording anything else. */
typedef struct shape_copy {
  int rank;
  int64_t dim[TOPOS_MAX_RANK];
} shape_copy;

/*
 * Makes sure the tape holds an error about `culprit` and returns
 * TOPOS_NONE.  sum_along over axis TOPOS_MAX_RANK is out of range for
 * every rank a value can have, so recording it always fails; when the
 * culprit is itself invalid or foreign the recording fails on that
 * instead.  Either way the message names the operand's shape, and when
 * the tape already has an error it keeps that first one.
 *
 * `why` states the composite's own reason.  The public API has no way to
 * record a caller's message on a tape, so for now it documents the call
 * site; with a topos_tape_fail(tape, code, message) in topos.h it would
 * become the recorded message.
 */
static topos_value fail_on(topos_tape *tape, topos_value culprit,
                           const char *why) {
  (void)culprit;
  return topos_tape_fail(
      tape, strstr(why, "rank") ? TOPOS_ERR_SHAPE : TOPOS_ERR_ARGUMENT, why);
}

/* Copies v's shape into *s.  An invalid or foreign value has no shape: the
 * tape is made to report it and false is returned. */
static bool shape_of(topos_tape *tape, topos_value v, shape_copy *s) {
  int rank = 0;
  const int64_t *shape = topos_value_shape(tape, v, &rank);
  if (shape == NULL) {
    fail_on(tape, v, "an invalid or foreign operand");
    return false;
  }
  s->rank = rank;
  for (int i = 0; i < rank; i++) s->dim[i] = shape[i];
  return true;
}

static int64_t shape_product(const shape_copy *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dim[i];
  return n;
}

/* value broadcast to `shape` (rank 0 needs no broadcast), in the tape's
 * dtype. */
static topos_value filled(topos_tape *tape, double value, int rank,
                          const int64_t *shape) {
  topos_value s = topos_scalar(tape, value);
  if (rank == 0) return s;
  return topos_broadcast(tape, s, rank, shape);
}

static topos_value filled_like(topos_tape *tape, double value,
                               const shape_copy *s) {
  return filled(tape, value, s->rank, s->dim);
}

/* A vector v[d] reshaped to [1,...,1,d] of the given rank and broadcast to
 * `target` (whose last extent is d): how per-feature parameters meet a
 * batch.  A v of the wrong extent fails in reshape or broadcast. */
static topos_value broadcast_last(topos_tape *tape, topos_value v,
                                  const shape_copy *target) {
  int64_t ones[TOPOS_MAX_RANK];
  for (int i = 0; i < target->rank; i++) ones[i] = 1;
  ones[target->rank - 1] = target->dim[target->rank - 1];
  topos_value r = topos_reshape(tape, v, target->rank, ones);
  return topos_broadcast(tape, r, target->rank, target->dim);
}

/* ----------------------------------------------------------- linear, mlp */

topos_value topos_linear(topos_tape *tape, topos_value x, topos_value w,
                         topos_value b) {
  topos_value y = topos_matmul(tape, x, w);
  if (!topos_value_ok(b) || !topos_value_ok(y)) return y;
  shape_copy ys;
  if (!shape_of(tape, y, &ys)) return TOPOS_NONE;
  /* The bias is one row; broadcasting it over the batch is written out. */
  return topos_add(tape, y, broadcast_last(tape, b, &ys));
}

topos_value topos_mlp(topos_tape *tape, topos_value x, int nlayers,
                      const topos_value *weights, const topos_value *biases,
                      topos_activation act) {
  if (nlayers < 1 || weights == NULL)
    return fail_on(tape, x, "mlp: needs nlayers >= 1 and weights");
  topos_value h = x;
  for (int i = 0; i < nlayers; i++) {
    h = topos_linear(tape, h, weights[i], biases ? biases[i] : TOPOS_NONE);
    if (i + 1 < nlayers) h = topos_activate(tape, h, act);
  }
  return h;
}

topos_value topos_activate(topos_tape *tape, topos_value x,
                           topos_activation act) {
  switch (act) {
    case TOPOS_ACT_NONE:
      return x;
    case TOPOS_ACT_RELU:
      return topos_relu(tape, x);
    case TOPOS_ACT_TANH:
      return topos_tanh(tape, x);
    case TOPOS_ACT_GELU:
      return topos_gelu(tape, x);
    case TOPOS_ACT_SILU:
      return topos_silu(tape, x);
  }
  return fail_on(tape, x, "activate: unknown activation");
}

/* ------------------------------------------------------------- embedding */

topos_value topos_embedding(topos_tape *tape, topos_value table,
                            topos_value idx) {
  shape_copy is;
  if (!shape_of(tape, idx, &is)) return TOPOS_NONE;
  if (is.rank == 1) return topos_gather(tape, table, idx);
  /* gather takes a vector of indices: flatten, gather rows, and give the
   * rows back the index shape with the feature axis appended. */
  int64_t n = shape_product(&is);
  topos_value flat = topos_reshape(tape, idx, 1, &n);
  topos_value rows = topos_gather(tape, table, flat);
  shape_copy rs;
  if (!shape_of(tape, rows, &rs)) return TOPOS_NONE;
  if (is.rank + 1 > TOPOS_MAX_RANK) {
    /* The result would have one axis too many: let reshape say so. */
    int64_t too_many[TOPOS_MAX_RANK + 1] = {0};
    return topos_reshape(tape, rows, TOPOS_MAX_RANK + 1, too_many);
  }
  int64_t out[TOPOS_MAX_RANK];
  for (int i = 0; i < is.rank; i++) out[i] = is.dim[i];
  out[is.rank] = rs.dim[1];
  return topos_reshape(tape, rows, is.rank + 1, out);
}

/* -------------------------------------------------------- normalisations */

/* Mean of x over its last axis (that axis removed), as sum · (1/d). */
static topos_value mean_last(topos_tape *tape, topos_value x,
                             const shape_copy *xs) {
  int axis = xs->rank - 1;
  topos_value sum = topos_sum_along(tape, x, axis);
  double inv = 1.0 / (double)xs->dim[axis];
  return topos_mul(tape, sum, filled(tape, inv, axis, xs->dim));
}

/* sqrt(var + eps), the divisor of the normalisations.  eps keeps it away
 * from zero for constant rows, where var is exactly 0. */
static topos_value sqrt_eps(topos_tape *tape, topos_value var, double eps,
                            int rank, const int64_t *shape) {
  return topos_sqrt(tape, topos_add(tape, var, filled(tape, eps, rank, shape)));
}

topos_value topos_layer_norm(topos_tape *tape, topos_value x, topos_value gamma,
                             topos_value beta, double eps) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  if (xs.rank < 1) return fail_on(tape, x, "layer_norm: x needs rank >= 1");
  int axis = xs.rank - 1;
  int64_t d = xs.dim[axis];
  topos_value mean = mean_last(tape, x, &xs);
  topos_value xc =
      topos_sub(tape, x, topos_broadcast_along(tape, mean, axis, d));
  /* The variance is the mean of squared deviations from the mean already
   * subtracted (two passes), not E[x²] − E[x]², which cancels badly. */
  topos_value var = mean_last(tape, topos_mul(tape, xc, xc), &xs);
  topos_value den = sqrt_eps(tape, var, eps, axis, xs.dim);
  topos_value y =
      topos_div(tape, xc, topos_broadcast_along(tape, den, axis, d));
  if (topos_value_ok(gamma))
    y = topos_mul(tape, y, broadcast_last(tape, gamma, &xs));
  if (topos_value_ok(beta))
    y = topos_add(tape, y, broadcast_last(tape, beta, &xs));
  return y;
}

topos_value topos_rms_norm(topos_tape *tape, topos_value x, topos_value gamma,
                           double eps) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  if (xs.rank < 1) return fail_on(tape, x, "rms_norm: x needs rank >= 1");
  int axis = xs.rank - 1;
  topos_value ms = mean_last(tape, topos_mul(tape, x, x), &xs);
  topos_value den = sqrt_eps(tape, ms, eps, axis, xs.dim);
  topos_value y =
      topos_div(tape, x, topos_broadcast_along(tape, den, axis, xs.dim[axis]));
  if (topos_value_ok(gamma))
    y = topos_mul(tape, y, broadcast_last(tape, gamma, &xs));
  return y;
}

/*
 * Batch norm works on a matrix [M, C] of M samples per channel.  x[N,C]
 * already is one; x[N,C,H,W] becomes one by moving C last and merging the
 * rest, so that every channel's statistics are a single sum_along over
 * axis 0 (one reduction, in the fixed order numerics.md gives it).
 * to_rows records that, from_rows undoes it.  Other ranks fail.
 */
static topos_value to_rows(topos_tape *tape, topos_value x,
                           const shape_copy *xs) {
  if (xs->rank == 2) return x;
  if (xs->rank != 4) return fail_on(tape, x, "batch_norm: x needs rank 2 or 4");
  static const int nhwc[4] = {0, 2, 3, 1};
  topos_value p = topos_permute(tape, x, nhwc);
  int64_t rows[2] = {xs->dim[0] * xs->dim[2] * xs->dim[3], xs->dim[1]};
  return topos_reshape(tape, p, 2, rows);
}

static topos_value from_rows(topos_tape *tape, topos_value y,
                             const shape_copy *xs) {
  if (xs->rank == 2) return y;
  static const int nchw[4] = {0, 3, 1, 2};
  int64_t nhwc[4] = {xs->dim[0], xs->dim[2], xs->dim[3], xs->dim[1]};
  return topos_permute(tape, topos_reshape(tape, y, 4, nhwc), nchw);
}

/* y[M,C] · gamma[C] + beta[C], each optional, broadcast over the rows. */
static topos_value scale_shift_rows(topos_tape *tape, topos_value y,
                                    topos_value gamma, topos_value beta,
                                    int64_t m) {
  if (topos_value_ok(gamma))
    y = topos_mul(tape, y, topos_broadcast_along(tape, gamma, 0, m));
  if (topos_value_ok(beta))
    y = topos_add(tape, y, topos_broadcast_along(tape, beta, 0, m));
  return y;
}

topos_value topos_batch_norm(topos_tape *tape, topos_value x, topos_value gamma,
                             topos_value beta, double eps,
                             topos_value *mean_out, topos_value *var_out) {
  if (mean_out) *mean_out = TOPOS_NONE;
  if (var_out) *var_out = TOPOS_NONE;
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  topos_value rows = to_rows(tape, x, &xs);
  shape_copy rs;
  if (!topos_value_ok(rows) || !shape_of(tape, rows, &rs)) return TOPOS_NONE;
  int64_t m = rs.dim[0], c = rs.dim[1];
  double inv = 1.0 / (double)m;
  topos_value mean =
      topos_mul(tape, topos_sum_along(tape, rows, 0), filled(tape, inv, 1, &c));
  topos_value xc =
      topos_sub(tape, rows, topos_broadcast_along(tape, mean, 0, m));
  /* Biased (population) variance: the statistics of this batch, as the
   * training form normalises with; callers wanting running estimates
   * combine the returned values themselves. */
  topos_value var =
      topos_mul(tape, topos_sum_along(tape, topos_mul(tape, xc, xc), 0),
                filled(tape, inv, 1, &c));
  topos_value den = sqrt_eps(tape, var, eps, 1, &c);
  topos_value y = topos_div(tape, xc, topos_broadcast_along(tape, den, 0, m));
  y = scale_shift_rows(tape, y, gamma, beta, m);
  if (mean_out) *mean_out = mean;
  if (var_out) *var_out = var;
  return from_rows(tape, y, &xs);
}

topos_value topos_batch_norm_inference(topos_tape *tape, topos_value x,
                                       topos_value gamma, topos_value beta,
                                       topos_value mean, topos_value var,
                                       double eps) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  topos_value rows = to_rows(tape, x, &xs);
  shape_copy rs;
  if (!topos_value_ok(rows) || !shape_of(tape, rows, &rs)) return TOPOS_NONE;
  int64_t m = rs.dim[0], c = rs.dim[1];
  topos_value xc =
      topos_sub(tape, rows, topos_broadcast_along(tape, mean, 0, m));
  topos_value den = sqrt_eps(tape, var, eps, 1, &c);
  topos_value y = topos_div(tape, xc, topos_broadcast_along(tape, den, 0, m));
  y = scale_shift_rows(tape, y, gamma, beta, m);
  return from_rows(tape, y, &xs);
}

/* ------------------------------------------------------ conv2d, pooling */

/*
 * Convolution as the im2col chain of ops.md: zero-pad H and W, cut
 * windows with two unfolds (the window axes land next to their output
 * axes), move the channel and window axes last, flatten to one row per
 * output pixel, and multiply by the flattened filters.  Being a chain of
 * layout ops and one matmul, its gradient is fold + matmul, exactly.
 */
topos_value topos_conv2d(topos_tape *tape, topos_value x, topos_value w,
                         topos_value b, int stride, int padding, int dilation) {
  shape_copy xs, ws;
  if (!shape_of(tape, x, &xs) || !shape_of(tape, w, &ws)) return TOPOS_NONE;
  if (xs.rank != 4) return fail_on(tape, x, "conv2d: x needs rank 4");
  if (ws.rank != 4) return fail_on(tape, w, "conv2d: w needs rank 4");
  int64_t n = xs.dim[0], o = ws.dim[0], c = ws.dim[1];
  int64_t kh = ws.dim[2], kw = ws.dim[3];
  topos_value p = x;
  if (padding != 0) {
    p = topos_pad(tape, p, 2, padding, padding);
    p = topos_pad(tape, p, 3, padding, padding);
  }
  /* [N,C,Hp,Wp] -> [N,C,oh,kh,Wp] -> [N,C,oh,kh,ow,kw] */
  topos_value u = topos_unfold(tape, p, 2, kh, stride, dilation);
  u = topos_unfold(tape, u, 4, kw, stride, dilation);
  shape_copy us;
  if (!topos_value_ok(u) || !shape_of(tape, u, &us)) return TOPOS_NONE;
  int64_t oh = us.dim[2], ow = us.dim[4];
  static const int to_patches[6] = {0, 2, 4, 1, 3, 5};
  topos_value patches = topos_permute(tape, u, to_patches);
  /* The patch row uses x's channel count, so a filter with another one
   * fails in the matmul with both shapes in the message. */
  int64_t prow[2] = {n * oh * ow, xs.dim[1] * kh * kw};
  patches = topos_reshape(tape, patches, 2, prow);
  int64_t wrow[2] = {o, c * kh * kw};
  topos_value wt = topos_transpose(tape, topos_reshape(tape, w, 2, wrow));
  topos_value y = topos_linear(tape, patches, wt, b);
  int64_t nhwo[4] = {n, oh, ow, o};
  static const int to_nchw[4] = {0, 3, 1, 2};
  return topos_permute(tape, topos_reshape(tape, y, 4, nhwo), to_nchw);
}

/*
 * Max pooling cuts the same windows as conv2d and reduces each with
 * max_along, which routes the gradient to the first maximal lane, the
 * same answer as folding the lanes with maximum in lane order (ties go to
 * the earlier operand) but one node instead of k·k−1.
 */
topos_value topos_max_pool2d(topos_tape *tape, topos_value x, int kernel,
                             int stride) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  if (xs.rank != 4) return fail_on(tape, x, "max_pool2d: x needs rank 4");
  topos_value u = topos_unfold(tape, x, 2, kernel, stride, 1);
  u = topos_unfold(tape, u, 4, kernel, stride, 1);
  shape_copy us;
  if (!topos_value_ok(u) || !shape_of(tape, u, &us)) return TOPOS_NONE;
  static const int to_windows[6] = {0, 1, 2, 4, 3, 5};
  topos_value win = topos_permute(tape, u, to_windows);
  int64_t flat[5] = {us.dim[0], us.dim[1], us.dim[2], us.dim[4],
                     (int64_t)kernel * kernel};
  win = topos_reshape(tape, win, 5, flat);
  return topos_max_along(tape, win, 4);
}

/* ------------------------------------------------------- softmax, losses */

/* exp of log_softmax: the stable op does the max subtraction once. */
topos_value topos_softmax(topos_tape *tape, topos_value x, int axis) {
  return topos_exp(tape, topos_log_softmax(tape, x, axis));
}

/*
 * Cross entropy with index targets: logsumexp(row) − row[target], averaged.
 * The target logits are picked with one gather from the logits viewed as
 * a column [n·V, 1] at flat indices target + V·row, computed with i32 add
 * on the tape.  A target outside [0, V) could still land inside that flat
 * range (in a neighbouring row), so the targets are also gathered from a
 * [V,1] zero column whose (exactly zero) rows are added to the picked
 * logits: that gather is an ancestor of the loss and fails at run time,
 * naming the bad index, whenever a target is out of range.
 */
topos_value topos_cross_entropy(topos_tape *tape, topos_value logits,
                                topos_value targets) {
  shape_copy ls;
  if (!shape_of(tape, logits, &ls)) return TOPOS_NONE;
  if (ls.rank != 2)
    return fail_on(tape, logits, "cross_entropy: logits need rank 2");
  int64_t n = ls.dim[0], v = ls.dim[1];
  /* The flat indices are i32, as every index on the tape is. */
  if (v > 0 && n > INT32_MAX / v)
    return fail_on(tape, logits, "cross_entropy: n·V exceeds the i32 range");

  int32_t *off = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (off == NULL)
    return fail_on(tape, TOPOS_NONE, "cross_entropy: out of memory");
  for (int64_t i = 0; i < n; i++) off[i] = (int32_t)(i * v);
  topos_tensor *off_t = topos_tensor_from(TOPOS_I32, 1, &n, off, NULL);
  free(off);
  topos_value offsets = topos_constant(tape, off_t); /* NULL fails here */
  topos_tensor_release(off_t);

  int64_t zshape[2] = {v, 1};
  topos_tensor *zero_t =
      topos_tensor_zeros(topos_tape_dtype(tape), 2, zshape, NULL);
  topos_value zero_col = topos_constant(tape, zero_t);
  topos_tensor_release(zero_t);

  topos_value flat = topos_add(tape, targets, offsets);
  int64_t col[2] = {n * v, 1};
  topos_value picked =
      topos_gather(tape, topos_reshape(tape, logits, 2, col), flat);
  picked = topos_add(tape, picked, topos_gather(tape, zero_col, targets));
  picked = topos_reshape(tape, picked, 1, &n);

  topos_value lse = topos_logsumexp(tape, logits, 1);
  topos_value total = topos_sum(tape, topos_sub(tape, lse, picked));
  return topos_mul(tape, total, topos_scalar(tape, 1.0 / (double)n));
}

topos_value topos_cross_entropy_onehot(topos_tape *tape, topos_value logits,
                                       topos_value targets) {
  shape_copy ls;
  if (!shape_of(tape, logits, &ls)) return TOPOS_NONE;
  if (ls.rank != 2)
    return fail_on(tape, logits, "cross_entropy_onehot: logits need rank 2");
  topos_value logp = topos_log_softmax(tape, logits, 1);
  topos_value total = topos_sum(tape, topos_mul(tape, targets, logp));
  return topos_mul(tape, topos_neg(tape, total),
                   topos_scalar(tape, 1.0 / (double)ls.dim[0]));
}

topos_value topos_mse(topos_tape *tape, topos_value a, topos_value b) {
  shape_copy as;
  if (!shape_of(tape, a, &as)) return TOPOS_NONE;
  topos_value d = topos_sub(tape, a, b);
  topos_value total = topos_sum(tape, topos_mul(tape, d, d));
  return topos_mul(tape, total,
                   topos_scalar(tape, 1.0 / (double)shape_product(&as)));
}

/* ------------------------------------------------------------ activations */

/* 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).  x³ is two products rather
 * than pow(x, 3): correctly rounded multiplications, independent of the C
 * library's pow, with the cheapest adjoints. */
topos_value topos_gelu(topos_tape *tape, topos_value x) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  const double k = 0.79788456080286535588; /* sqrt(2/pi) */
  topos_value x3 = topos_mul(tape, x, topos_mul(tape, x, x));
  topos_value inner =
      topos_add(tape, x, topos_mul(tape, filled_like(tape, 0.044715, &xs), x3));
  topos_value t =
      topos_tanh(tape, topos_mul(tape, filled_like(tape, k, &xs), inner));
  topos_value half_x = topos_mul(tape, filled_like(tape, 0.5, &xs), x);
  return topos_mul(tape, half_x,
                   topos_add(tape, filled_like(tape, 1.0, &xs), t));
}

/* x·sigmoid(x) with sigmoid(x) = 0.5·(1 + tanh(x/2)): the same function as
 * 1/(1+exp(−x)) but exp never overflows, so value and gradient stay
 * finite for every finite x. */
topos_value topos_silu(topos_tape *tape, topos_value x) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  topos_value half = filled_like(tape, 0.5, &xs);
  topos_value t = topos_tanh(tape, topos_mul(tape, half, x));
  topos_value sig =
      topos_mul(tape, half, topos_add(tape, filled_like(tape, 1.0, &xs), t));
  return topos_mul(tape, x, sig);
}

/* The mask is data (an input or constant), never drawn here: the graph
 * stays a pure function of its parameters and inputs. */
topos_value topos_dropout(topos_tape *tape, topos_value x, topos_value mask,
                          double p) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  if (!(p >= 0.0 && p < 1.0))
    return fail_on(tape, x, "dropout: p must be in [0, 1)");
  topos_value kept = topos_mul(tape, x, mask);
  return topos_mul(tape, kept, filled_like(tape, 1.0 / (1.0 - p), &xs));
}
