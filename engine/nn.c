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

/* ------------------------------------------------------------ transformer */

/*
 * The transformer surface: exact GELU, multi-head scaled dot-product
 * attention (causal, with a key/value cache), a GPT-2 style self-attention
 * block, rotary position embeddings, cross entropy with an ignored target,
 * global-norm gradient clipping and a warmup + cosine learning-rate
 * schedule.  Like everything above, each records ordinary ops and has no
 * adjoint of its own; the constants they need (masks, rotation tables,
 * index offsets) are computed here in double and recorded in the tape's
 * dtype.
 */

/* 0.5·x·(1 + erf(x/√2)), the GELU of the original paper (PyTorch's
 * approximate='none'); topos_gelu is the tanh approximation.  x/√2 is a
 * product with the rounded constant 1/√2, like every other scalar here. */
topos_value topos_gelu_exact(topos_tape *tape, topos_value x) {
  shape_copy xs;
  if (!shape_of(tape, x, &xs)) return TOPOS_NONE;
  const double r = 0.70710678118654752440; /* 1/sqrt(2) */
  topos_value e =
      topos_erf(tape, topos_mul(tape, filled_like(tape, r, &xs), x));
  topos_value half_x = topos_mul(tape, filled_like(tape, 0.5, &xs), x);
  return topos_mul(tape, half_x,
                   topos_add(tape, filled_like(tape, 1.0, &xs), e));
}

/* A double rounded to bf16 once: round to odd into f32 (a sticky last bit
 * keeps what the f32 rounding dropped), then to nearest even into bf16, so
 * no value is rounded twice (tensor.c's bf16_from_f64, which nn.c, a
 * client of the public API, cannot call). */
static uint16_t bf16_of(double v) {
  float f = (float)v;
  if (isnan(v) || isinf(f) || (double)f == v) return topos_bf16_from_f32(f);
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  if (fabs((double)f) > fabs(v)) b -= 1;
  b |= 1u;
  memcpy(&f, &b, sizeof f);
  return topos_bf16_from_f32(f);
}

/* A constant of the tape's dtype from n doubles, each rounded once.
 * NULL data (an allocation that failed) fails the tape. */
static topos_value constant_of(topos_tape *tape, int rank, const int64_t *shape,
                               const double *data, int64_t n) {
  if (data == NULL)
    return topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
  topos_dtype dt = topos_tape_dtype(tape);
  void *buf = malloc((size_t)(n > 0 ? n : 1) * topos_dtype_size(dt));
  if (buf == NULL)
    return topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
  for (int64_t i = 0; i < n; i++) {
    if (dt == TOPOS_F64)
      ((double *)buf)[i] = data[i];
    else if (dt == TOPOS_F32)
      ((float *)buf)[i] = (float)data[i];
    else
      ((uint16_t *)buf)[i] = bf16_of(data[i]);
  }
  topos_tensor *t = topos_tensor_from(dt, rank, shape, buf, NULL);
  free(buf);
  topos_value c = t ? topos_constant(tape, t)
                    : topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
  topos_tensor_release(t);
  return c;
}

/* An i32 constant vector [n]; NULL data fails the tape. */
static topos_value index_constant(topos_tape *tape, int64_t n,
                                  const int32_t *data) {
  if (data == NULL)
    return topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
  topos_tensor *t = topos_tensor_from(TOPOS_I32, 1, &n, data, NULL);
  topos_value c = t ? topos_constant(tape, t)
                    : topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
  topos_tensor_release(t);
  return c;
}

/* The rank-3 shape of an attention operand, or false with the tape's
 * error. */
static bool rank3_of(topos_tape *tape, topos_value v, const char *why,
                     shape_copy *s) {
  if (!shape_of(tape, v, s)) return false;
  if (s->rank != 3) {
    fail_on(tape, v, why);
    return false;
  }
  return true;
}

/* [B,L,H·Dh] -> [B·H,L,Dh] (perm {0,2,1,3}), or -> [B·H,Dh,L]
 * (perm {0,2,3,1}, the keys already transposed for the score matmul). */
static topos_value split_heads(topos_tape *tape, topos_value x, int64_t b,
                               int64_t l, int64_t h, int64_t dh,
                               bool transposed) {
  static const int to_heads[4] = {0, 2, 1, 3};
  static const int to_heads_t[4] = {0, 2, 3, 1};
  int64_t four[4] = {b, l, h, dh};
  topos_value r = topos_reshape(tape, x, 4, four);
  r = topos_permute(tape, r, transposed ? to_heads_t : to_heads);
  int64_t three[3] = {b * h, transposed ? dh : l, transposed ? l : dh};
  return topos_reshape(tape, r, 3, three);
}

/*
 * Multi-head scaled dot-product attention.  The recorded chain, in order
 * (a later plan-level fusion looks for exactly this):
 *
 *   qh = reshape(permute(reshape(q, [B,T,H,Dh]), {0,2,1,3}), [B·H,T,Dh])
 *   kt = reshape(permute(reshape(k, [B,S,H,Dh]), {0,2,3,1}), [B·H,Dh,S])
 *   vh = reshape(permute(reshape(v, [B,S,H,Dh]), {0,2,1,3}), [B·H,S,Dh])
 *   s  = matmul(qh, kt)                                  [B·H,T,S]
 *   s  = mul(s, broadcast(scalar(scale), [B·H,T,S]))
 *   s  = add(s, broadcast_along(constant mask[T,S], 0, B·H))   causal only
 *   p  = exp(log_softmax(s, 2))                          (topos_softmax)
 *   o  = matmul(p, vh)                                   [B·H,T,Dh]
 *   y  = reshape(permute(reshape(o, [B,H,T,Dh]), {0,2,1,3}), [B,T,D])
 *
 * The mask is 0 where key j may be seen by query i (j <= past + i) and
 * −∞ elsewhere; every row keeps at least key 0, so no row is all −∞ and
 * softmax gives exact zeros (and zero gradients) at masked keys.  The
 * scale is applied to the scores (not folded into q) so the chain reads
 * like the formula softmax(q·kᵀ·scale + mask)·v.
 *
 * Every score and output element is computed from its own row alone (an
 * fma chain per matmul output, one log_softmax row), so attention over
 * [cache ‖ new keys] for the new queries gives the bits of the last rows
 * of causal attention over the whole sequence.
 */
topos_value topos_attention(topos_tape *tape, topos_value q, topos_value k,
                            topos_value v, const topos_attention_opts *opts) {
  shape_copy qs, ks, vs;
  if (!rank3_of(tape, q, "attention: q needs rank 3 [B,T,D]", &qs) ||
      !rank3_of(tape, k, "attention: k needs rank 3 [B,S,D]", &ks) ||
      !rank3_of(tape, v, "attention: v needs rank 3 [B,S,D]", &vs))
    return TOPOS_NONE;
  if (opts == NULL)
    return fail_on(tape, q, "attention: needs options (heads, causal, ...)");
  int64_t b = qs.dim[0], t = qs.dim[1], d = qs.dim[2], s = ks.dim[1];
  int64_t h = opts->heads;
  if (h < 1 || d % h != 0)
    return fail_on(tape, q,
                   "attention: heads must be >= 1 and divide D (q's last "
                   "extent)");
  if (ks.dim[0] != b || vs.dim[0] != b || ks.dim[2] != d || vs.dim[2] != d ||
      vs.dim[1] != s)
    return fail_on(tape, k,
                   "attention: k and v must both be [B,S,D] with q's B and D");
  if (opts->past < 0) return fail_on(tape, q, "attention: past must be >= 0");
  if (opts->causal && opts->past + t != s)
    return fail_on(tape, k,
                   "attention: causal attention needs S = past + T keys");
  if (!isfinite(opts->scale))
    return fail_on(tape, q, "attention: scale must be finite (0: 1/sqrt(Dh))");
  int64_t dh = d / h, bh = b * h;
  double scale = opts->scale != 0 ? opts->scale : 1.0 / sqrt((double)dh);

  topos_value qh = split_heads(tape, q, b, t, h, dh, false);
  topos_value kt = split_heads(tape, k, b, s, h, dh, true);
  topos_value vh = split_heads(tape, v, b, s, h, dh, false);
  topos_value sc = topos_matmul(tape, qh, kt);
  int64_t sshape[3] = {bh, t, s};
  sc = topos_mul(tape, sc, filled(tape, scale, 3, sshape));
  if (opts->causal) {
    if (t > 0 && s > INT64_MAX / (int64_t)sizeof(double) / t)
      return fail_on(tape, q, "attention: the [T,S] mask is too large");
    double *mask = malloc(sizeof(double) * (size_t)(t * s > 0 ? t * s : 1));
    if (mask)
      for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < s; j++)
          mask[i * s + j] = j <= opts->past + i ? 0.0 : -INFINITY;
    int64_t mshape[2] = {t, s};
    topos_value m = constant_of(tape, 2, mshape, mask, t * s);
    free(mask);
    sc = topos_add(tape, sc, topos_broadcast_along(tape, m, 0, bh));
  }
  topos_value p = topos_softmax(tape, sc, 2);
  topos_value o = topos_matmul(tape, p, vh);
  static const int merge[4] = {0, 2, 1, 3};
  int64_t four[4] = {b, h, t, dh};
  o = topos_permute(tape, topos_reshape(tape, o, 4, four), merge);
  int64_t out[3] = {b, t, d};
  return topos_reshape(tape, o, 3, out);
}

/* x[B,T,D]·w[D,N] + b[N] over the B·T rows: matmul takes rank 2 (or equal
 * batches), so the rows are flattened and given back their shape. */
static topos_value linear3(topos_tape *tape, topos_value x, topos_value w,
                           topos_value bias, int64_t b, int64_t t, int64_t d) {
  int64_t rows[2] = {b * t, d};
  topos_value y = topos_linear(tape, topos_reshape(tape, x, 2, rows), w, bias);
  shape_copy ys;
  if (!topos_value_ok(y) || !shape_of(tape, y, &ys)) return TOPOS_NONE;
  int64_t back[3] = {b, t, ys.dim[1]};
  return topos_reshape(tape, y, 3, back);
}

topos_value topos_self_attention(topos_tape *tape, topos_value x,
                                 topos_value w_qkv, topos_value b_qkv,
                                 topos_value w_o, topos_value b_o,
                                 const topos_attention_opts *opts,
                                 topos_value k_cache, topos_value v_cache,
                                 topos_value *k_all, topos_value *v_all) {
  if (k_all) *k_all = TOPOS_NONE;
  if (v_all) *v_all = TOPOS_NONE;
  shape_copy xs;
  if (!rank3_of(tape, x, "self_attention: x needs rank 3 [B,T,D]", &xs))
    return TOPOS_NONE;
  if (opts == NULL)
    return fail_on(tape, x, "self_attention: needs options (heads, ...)");
  int64_t b = xs.dim[0], t = xs.dim[1], d = xs.dim[2];
  bool cached = topos_value_ok(k_cache);
  if (cached != topos_value_ok(v_cache))
    return fail_on(tape, x,
                   "self_attention: give both k_cache and v_cache, or neither");
  int64_t past = 0;
  if (cached) {
    shape_copy cs;
    if (!rank3_of(tape, k_cache, "self_attention: k_cache needs rank 3 [B,P,D]",
                  &cs))
      return TOPOS_NONE;
    past = cs.dim[1];
  }
  if (opts->past != past)
    return fail_on(tape, x,
                   "self_attention: opts->past must equal the cache's length "
                   "P (0 without a cache)");
  /* The q|k|v projection in one matmul (GPT-2's c_attn), then the three
   * column blocks. */
  topos_value qkv = linear3(tape, x, w_qkv, b_qkv, b, t, d);
  shape_copy qs;
  if (!topos_value_ok(qkv) || !shape_of(tape, qkv, &qs)) return TOPOS_NONE;
  if (qs.dim[2] != 3 * d)
    return fail_on(tape, w_qkv, "self_attention: w_qkv must be [D,3D]");
  topos_value q = topos_narrow(tape, qkv, 2, 0, d);
  topos_value k = topos_narrow(tape, qkv, 2, d, d);
  topos_value v = topos_narrow(tape, qkv, 2, 2 * d, d);
  if (cached) {
    /* Concat fails, naming both shapes, on a cache of another B or D. */
    topos_value ks[2] = {k_cache, k}, vs[2] = {v_cache, v};
    k = topos_concat(tape, 2, ks, 1);
    v = topos_concat(tape, 2, vs, 1);
  }
  topos_value y = topos_attention(tape, q, k, v, opts);
  if (!topos_value_ok(y)) return TOPOS_NONE;
  y = linear3(tape, y, w_o, b_o, b, t, d);
  if (!topos_value_ok(y)) return TOPOS_NONE;
  if (k_all) *k_all = k;
  if (v_all) *v_all = v;
  return y;
}

/*
 * Rotary position embedding, Hugging Face Llama's rotate-half form: within
 * each head, lane i < Dh/2 pairs with lane i + Dh/2, and
 *
 *   y = x·cos + rotate_half(x)·sin,  rotate_half(x) = [−x₂ ‖ x₁]
 *
 * with cos/sin[t, i] = cos/sin((offset + t)·θ_{i mod Dh/2}) and
 * θ_j = 1 / base^(2j/Dh).  The tables are computed in double and rounded
 * once to the tape's dtype, shaped [1,T,1,Dh] and broadcast over batch and
 * heads.  Recorded as reshape to [B,T,H,Dh], two narrows, neg, concat,
 * two products with the tables, an add, and reshape back.
 */
topos_value topos_rope(topos_tape *tape, topos_value x, int heads,
                       int64_t offset, double base) {
  shape_copy xs;
  if (!rank3_of(tape, x, "rope: x needs rank 3 [B,T,D]", &xs))
    return TOPOS_NONE;
  int64_t b = xs.dim[0], t = xs.dim[1], d = xs.dim[2];
  if (heads < 1 || d % heads != 0 || (d / heads) % 2 != 0)
    return fail_on(tape, x,
                   "rope: heads must be >= 1 and D = heads·Dh with Dh even");
  if (offset < 0) return fail_on(tape, x, "rope: offset must be >= 0");
  if (base == 0) base = 10000.0;
  if (!(base > 0) || !isfinite(base))
    return fail_on(tape, x, "rope: base must be > 0 and finite (0: 10000)");
  int64_t dh = d / heads, half = dh / 2;
  if (t > 0 && dh > INT64_MAX / (int64_t)sizeof(double) / t)
    return fail_on(tape, x, "rope: the [T,Dh] tables are too large");
  size_t n = (size_t)(t * dh > 0 ? t * dh : 1);
  double *c = malloc(sizeof(double) * n), *sn = malloc(sizeof(double) * n);
  if (c && sn)
    for (int64_t p = 0; p < t; p++)
      for (int64_t i = 0; i < dh; i++) {
        double theta = 1.0 / pow(base, (double)(2 * (i % half)) / (double)dh);
        double angle = (double)(offset + p) * theta;
        c[p * dh + i] = cos(angle);
        sn[p * dh + i] = sin(angle);
      }
  int64_t tshape[4] = {1, t, 1, dh};
  bool ok = c != NULL && sn != NULL;
  topos_value cos_t = constant_of(tape, 4, tshape, ok ? c : NULL, t * dh);
  topos_value sin_t = constant_of(tape, 4, tshape, ok ? sn : NULL, t * dh);
  free(c);
  free(sn);
  int64_t four[4] = {b, t, heads, dh};
  topos_value x4 = topos_reshape(tape, x, 4, four);
  topos_value x1 = topos_narrow(tape, x4, 3, 0, half);
  topos_value x2 = topos_narrow(tape, x4, 3, half, half);
  topos_value parts[2] = {topos_neg(tape, x2), x1};
  topos_value rot = topos_concat(tape, 2, parts, 3);
  topos_value y = topos_add(
      tape, topos_mul(tape, x4, topos_broadcast(tape, cos_t, 4, four)),
      topos_mul(tape, rot, topos_broadcast(tape, sin_t, 4, four)));
  int64_t back[3] = {b, t, d};
  return topos_reshape(tape, y, 3, back);
}

/* How far ignore_index may lie outside [0, V): the tables below span the
 * gap, one row per value. */
#define CE_IGNORE_GAP_MAX ((int64_t)1 << 20)

/*
 * Cross entropy with an ignored target value, the mean over the rows whose
 * target is not ignore_index:
 *
 *   loss = Σₙ mₙ·(logsumexp(logitsₙ) − logitsₙ[tₙ]) / Σₙ mₙ
 *
 * The engine has no i32 comparison and no dtype conversion; i32 values
 * reach floats only as gather indices, and only in range.  So the values
 * a target may take, [lo, hi] = [min(0, ignore), max(V−1, ignore)], are
 * shifted to [0, R) by an i32 add of −lo, and the mask m is gathered from
 * a constant column of R rows: 1 for a class, 0 for ignore_index, NaN for
 * the values in between that are neither (a NaN loss, since no op could
 * raise an error for them).  A target outside [lo, hi] leaves that gather
 * out of range, a run-time error naming the shifted index; an add that
 * overflows i32 is one too.
 *
 * The target logit is gathered from the logits viewed as a column
 * [N·V, 1] at n·V + t, as in topos_cross_entropy; the column is
 * zero-padded by −lo rows before and ignore − (V−1) rows after (when
 * ignore lies outside [0, V)) so that an ignored row's index stays in
 * range.  What it picks there is some finite logit or a pad zero,
 * multiplied by m = 0.  A batch whose every target is ignored gives
 * 0/0 = NaN, as PyTorch does.  ignore_index may lie at most 2^20 outside
 * [0, V) (the tables grow with the gap; PyTorch's −100 costs 100 rows).
 */
topos_value topos_cross_entropy_ignore(topos_tape *tape, topos_value logits,
                                       topos_value targets,
                                       int32_t ignore_index) {
  shape_copy ls, ts;
  if (!shape_of(tape, logits, &ls) || !shape_of(tape, targets, &ts))
    return TOPOS_NONE;
  if (ls.rank != 2)
    return fail_on(tape, logits, "cross_entropy_ignore: logits need rank 2");
  if (ts.rank != 1 || ts.dim[0] != ls.dim[0] ||
      topos_value_dtype(tape, targets) != TOPOS_I32)
    return fail_on(tape, targets,
                   "cross_entropy_ignore: targets must be i32 [N] for logits "
                   "[N,V]");
  int64_t n = ls.dim[0], v = ls.dim[1];
  if (v < 1)
    return fail_on(tape, logits, "cross_entropy_ignore: V must be >= 1");
  int64_t ig = ignore_index;
  int64_t lo = ig < 0 ? ig : 0, hi = ig > v - 1 ? ig : v - 1;
  int64_t r = hi - lo + 1;
  if (r - v > CE_IGNORE_GAP_MAX)
    return fail_on(tape, targets,
                   "cross_entropy_ignore: ignore_index lies more than 2^20 "
                   "outside [0, V)");
  int64_t before = -lo, after = ig > v - 1 ? ig - (v - 1) : 0;
  /* The flat indices are i32, as every index on the tape is. */
  if (n > (INT32_MAX - before - after) / v)
    return fail_on(tape, logits,
                   "cross_entropy_ignore: N·V exceeds the i32 range");

  double *mask = malloc(sizeof(double) * (size_t)r);
  if (mask)
    for (int64_t i = 0; i < r; i++) {
      int64_t value = i + lo;
      mask[i] = value == ig ? 0.0 : (value >= 0 && value < v ? 1.0 : NAN);
    }
  int64_t mshape[2] = {r, 1};
  topos_value mask_col = constant_of(tape, 2, mshape, mask, r);
  free(mask);

  int32_t *shift = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  int32_t *off = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (shift && off)
    for (int64_t i = 0; i < n; i++) {
      shift[i] = (int32_t)-lo;
      off[i] = (int32_t)(i * v + before);
    }
  topos_value shift_c = index_constant(tape, n, shift && off ? shift : NULL);
  topos_value off_c = index_constant(tape, n, shift && off ? off : NULL);
  free(shift);
  free(off);

  topos_value m =
      topos_gather(tape, mask_col, topos_add(tape, targets, shift_c));
  m = topos_reshape(tape, m, 1, &n);

  int64_t col[2] = {n * v, 1};
  topos_value column = topos_reshape(tape, logits, 2, col);
  if (before > 0 || after > 0)
    column = topos_pad(tape, column, 0, before, after);
  topos_value picked =
      topos_gather(tape, column, topos_add(tape, targets, off_c));
  picked = topos_reshape(tape, picked, 1, &n);

  topos_value lse = topos_logsumexp(tape, logits, 1);
  topos_value per = topos_mul(tape, m, topos_sub(tape, lse, picked));
  return topos_div(tape, topos_sum(tape, per), topos_sum(tape, m));
}

/*
 * Global-norm clipping: norm = sqrt(Σᵢ sum(gᵢ·gᵢ)), the per-value sums
 * added in the order given; scale = max_norm / maximum(norm, max_norm),
 * which is exactly 1 when norm <= max_norm and never divides by zero;
 * clippedᵢ = gᵢ·scale.  A NaN norm gives NaN everywhere (maximum keeps
 * NaN), so a broken step shows instead of being clipped into range.
 * clipped may be grads itself.
 */
int topos_clip_global_norm(topos_tape *tape, int n, const topos_value *grads,
                           double max_norm, topos_value *clipped,
                           topos_value *norm_out) {
  if (norm_out) *norm_out = TOPOS_NONE;
  if (tape == NULL) return TOPOS_ERR_ARGUMENT;
  if (topos_tape_error(tape) != NULL) {
    if (clipped)
      for (int i = 0; i < n; i++) clipped[i] = TOPOS_NONE;
    return TOPOS_ERR_STATE;
  }
  if (n < 1 || grads == NULL || clipped == NULL) {
    topos_tape_fail(tape, TOPOS_ERR_ARGUMENT,
                    "clip_global_norm: needs n >= 1 values and an output "
                    "array");
    return TOPOS_ERR_ARGUMENT;
  }
  if (!(max_norm > 0) || !isfinite(max_norm)) {
    topos_tape_fail(tape, TOPOS_ERR_ARGUMENT,
                    "clip_global_norm: max_norm must be > 0 and finite");
    for (int i = 0; i < n; i++) clipped[i] = TOPOS_NONE;
    return TOPOS_ERR_ARGUMENT;
  }
  topos_dtype dt = topos_tape_dtype(tape);
  shape_copy *shapes = malloc(sizeof(shape_copy) * (size_t)n);
  if (shapes == NULL) {
    topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) clipped[i] = TOPOS_NONE;
    return TOPOS_ERR_MEMORY;
  }
  int status = TOPOS_OK;
  for (int i = 0; i < n && status == TOPOS_OK; i++) {
    if (!shape_of(tape, grads[i], &shapes[i])) {
      status = TOPOS_ERR_ARGUMENT;
    } else if (topos_value_dtype(tape, grads[i]) != dt) {
      topos_tape_fail(tape, TOPOS_ERR_DTYPE,
                      "clip_global_norm: every value must have the tape's "
                      "dtype");
      status = TOPOS_ERR_DTYPE;
    }
  }
  topos_value total = TOPOS_NONE;
  for (int i = 0; i < n && status == TOPOS_OK; i++) {
    topos_value sq = topos_sum(tape, topos_mul(tape, grads[i], grads[i]));
    total = i == 0 ? sq : topos_add(tape, total, sq);
  }
  topos_value norm = TOPOS_NONE, scale = TOPOS_NONE;
  if (status == TOPOS_OK) {
    norm = topos_sqrt(tape, total);
    topos_value cap = topos_scalar(tape, max_norm);
    scale = topos_div(tape, cap, topos_maximum(tape, norm, cap));
  }
  /* Outputs after every input was read: clipped may alias grads. */
  topos_value *out = malloc(sizeof(topos_value) * (size_t)n);
  if (status == TOPOS_OK && out == NULL) {
    topos_tape_fail(tape, TOPOS_ERR_MEMORY, "out of memory");
    status = TOPOS_ERR_MEMORY;
  }
  for (int i = 0; i < n && status == TOPOS_OK; i++) {
    topos_value s =
        shapes[i].rank == 0
            ? scale
            : topos_broadcast(tape, scale, shapes[i].rank, shapes[i].dim);
    out[i] = topos_mul(tape, grads[i], s);
  }
  /* Every operand was checked above, so only memory can fail here. */
  if (status == TOPOS_OK && topos_tape_error(tape) != NULL)
    status = TOPOS_ERR_MEMORY;
  for (int i = 0; i < n; i++)
    clipped[i] = status == TOPOS_OK ? out[i] : TOPOS_NONE;
  if (norm_out && status == TOPOS_OK) *norm_out = norm;
  free(out);
  free(shapes);
  return status;
}

double topos_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total,
                              double peak, double floor) {
  if (step < 0 || warmup < 0 || total < 1 || warmup > total ||
      !isfinite(peak) || !isfinite(floor) || !(peak >= 0) || !(floor >= 0) ||
      floor > peak)
    return NAN;
  if (step < warmup) return peak * (double)(step + 1) / (double)warmup;
  if (step >= total) return floor;
  int64_t span = total - 1 - warmup;
  double p = span > 0 ? (double)(step - warmup) / (double)span : 1.0;
  return floor + (peak - floor) * 0.5 * (1.0 + cos(3.14159265358979323846 * p));
}
