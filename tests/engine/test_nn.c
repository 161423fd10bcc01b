/*
 * test_nn.c - the neural composites of nn.c: forward values against
 * loops written out in the test (direct convolution, window maxima,
 * softmax as exp/Σexp, ...), finite-difference gradient checks in f64 for
 * every differentiable composite, and bad shapes or arguments reported
 * through the tape's error instead of a crash.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "topos.h"

/* ------------------------------------------------------------- helpers */

/* A parameter of random values in [lo, hi), whose values are also copied
 * to *values (new, free it) when values is non-NULL. */
static topos_value random_param(topos_tape *tape, int rank,
                                const int64_t *shape, uint64_t seed, double lo,
                                double hi, double **values) {
  topos_tensor *t = tt_random(TOPOS_F64, rank, shape, seed, lo, hi);
  if (values) *values = tt_values(t);
  return tt_param(tape, t);
}

static topos_value index_constant(topos_tape *tape, int rank,
                                  const int64_t *shape, const double *idx) {
  return tt_constant(tape, tt_tensor(TOPOS_I32, rank, shape, idx));
}

static topos_network *seal(topos_tape *tape) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

/* Forward with the network's initials and defaults; v's values (new). */
static double *forward_values(const topos_network *net, topos_value v,
                              int64_t *count) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  const topos_tensor *t = topos_run_of(run, v, &err);
  ck_assert_msg(t != NULL, "run_of: %s", err.message);
  if (count) *count = topos_tensor_count(t);
  double *values = tt_values(t);
  topos_run_free(run);
  return values;
}

static void expect_shape(const topos_tape *tape, topos_value v, int rank,
                         const int64_t *shape) {
  int got = -1;
  const int64_t *s = topos_value_shape(tape, v, &got);
  ck_assert_msg(s != NULL, "no shape: %s", topos_tape_error(tape));
  ck_assert_int_eq(got, rank);
  for (int i = 0; i < rank; i++) ck_assert_int_eq(s[i], shape[i]);
}

/* |got − want| ≤ tol·max(1, |want|) element by element. */
static void expect_close(const double *got, const double *want, int64_t n,
                         double tol) {
  for (int64_t i = 0; i < n; i++) {
    double scale = fmax(1.0, fabs(want[i]));
    ck_assert_msg(fabs(got[i] - want[i]) <= tol * scale,
                  "element %lld: got %.17g want %.17g", (long long)i, got[i],
                  want[i]);
  }
}

/* got == want exactly, element by element. */
static void expect_equal(const double *got, const double *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "element %lld: got %.17g want %.17g",
                  (long long)i, got[i], want[i]);
}

/* loss = Σ y·R with R a fixed random tensor of y's shape, so every
 * output element reaches the loss with its own weight. */
static topos_value weighted_sum(topos_tape *tape, topos_value y,
                                uint64_t seed) {
  int rank = 0;
  const int64_t *s = topos_value_shape(tape, y, &rank);
  ck_assert_msg(s != NULL, "weighted_sum: %s", topos_tape_error(tape));
  int64_t shape[TOPOS_MAX_RANK];
  memcpy(shape, s, sizeof(int64_t) * (size_t)rank);
  topos_value r =
      tt_constant(tape, tt_random(TOPOS_F64, rank, shape, seed, -1.0, 1.0));
  return topos_sum(tape, topos_mul(tape, y, r));
}

/* Seals the tape with loss = weighted_sum(y) (or y itself when it is
 * rank 0) and holds every parameter's gradient to finite differences. */
static void expect_gradients(topos_tape *tape, topos_value y) {
  int rank = -1;
  ck_assert_ptr_nonnull(topos_value_shape(tape, y, &rank));
  topos_value loss = rank == 0 ? y : weighted_sum(tape, y, 977);
  topos_network *net = seal(tape);
  ck_assert_int_gt(topos_network_parameter_count(net), 0);
  double e = tt_gradient_error(net, loss, NULL, 0);
  ck_assert_msg(e <= 1e-6, "gradient error %.3g", e);
  topos_network_release(net);
}

/* The tape must hold an error (and refuse to seal); frees the tape. */
static void expect_tape_error(topos_tape *tape, topos_value result) {
  ck_assert_msg(topos_tape_error(tape) != NULL, "no error recorded");
  ck_assert(!topos_value_ok(result) || topos_tape_error(tape) != NULL);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_ptr_null(net);
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_msg(err.message[0] != '\0', "empty error message");
}

/* Activations as the test computes them, straight from their formulas. */
static double ref_act(double x, topos_activation act) {
  switch (act) {
    case TOPOS_ACT_RELU:
      return x > 0 ? x : 0;
    case TOPOS_ACT_TANH:
      return tanh(x);
    case TOPOS_ACT_GELU:
      return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case TOPOS_ACT_SILU:
      return x / (1 + exp(-x));
    default:
      return x;
  }
}

/* y[n,out] = x[n,in]·w[in,out] + b[out] (b may be NULL). */
static void ref_linear(const double *x, const double *w, const double *b, int n,
                       int in, int out, double *y) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < out; j++) {
      double acc = b ? b[j] : 0;
      for (int k = 0; k < in; k++) acc += x[i * in + k] * w[k * out + j];
      y[i * out + j] = acc;
    }
}

/* ---------------------------------------------------------------- linear */

START_TEST(test_linear_forward) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {2, 3}, ws[2] = {3, 2}, bs[1] = {2};
  double x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, -1, 0, 2, 0.5, 0};
  double b[2] = {10, 20};
  topos_value xv = tt_param(tape, tt_tensor(TOPOS_F64, 2, xs, x));
  topos_value wv = tt_param(tape, tt_tensor(TOPOS_F64, 2, ws, w));
  topos_value bv = tt_param(tape, tt_tensor(TOPOS_F64, 1, bs, b));
  topos_value y = topos_linear(tape, xv, wv, bv);
  topos_value y0 = topos_linear(tape, xv, wv, TOPOS_NONE);
  int64_t out[2] = {2, 2};
  expect_shape(tape, y, 2, out);
  topos_network *net = seal(tape);
  /* row 0: [1+0+1.5, -1+4+0] = [2.5, 3]; row 1: [4+0+3, -4+10] = [7, 6] */
  double want[4] = {12.5, 23, 17, 26}, want0[4] = {2.5, 3, 7, 6};
  double *got = forward_values(net, y, NULL);
  expect_equal(got, want, 4);
  free(got);
  got = forward_values(net, y0, NULL);
  expect_equal(got, want0, 4);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_linear_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {4, 3}, ws[2] = {3, 5}, bs[1] = {5};
  topos_value x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  topos_value w = random_param(tape, 2, ws, 2, -1, 1, NULL);
  topos_value b = random_param(tape, 1, bs, 3, -1, 1, NULL);
  expect_gradients(tape, topos_linear(tape, x, w, b));
}
END_TEST

START_TEST(test_linear_bad_shapes) {
  int64_t xs[2] = {2, 3}, ws[2] = {4, 2}, bs[1] = {3}, w2[2] = {3, 2};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  topos_value w = random_param(tape, 2, ws, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_linear(tape, x, w, TOPOS_NONE));

  /* A bias of the wrong extent. */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  w = random_param(tape, 2, w2, 2, -1, 1, NULL);
  topos_value b = random_param(tape, 1, bs, 3, -1, 1, NULL);
  ck_assert_ptr_null(topos_tape_error(tape));
  expect_tape_error(tape, topos_linear(tape, x, w, b));

  /* A rank-1 input. */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 1, bs, 1, -1, 1, NULL);
  w = random_param(tape, 2, w2, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_linear(tape, x, w, TOPOS_NONE));
}
END_TEST

/* ------------------------------------------------------ mlp, activations */

static void check_mlp(topos_activation act, bool gradients) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int sizes[4] = {4, 5, 6, 3};
  int64_t xs[2] = {3, 4};
  double *xv, *wv[3], *bv[3];
  topos_value x = random_param(tape, 2, xs, 10, -1.5, 1.5, &xv);
  topos_value w[3], b[3];
  for (int l = 0; l < 3; l++) {
    int64_t ws[2] = {sizes[l], sizes[l + 1]}, bs[1] = {sizes[l + 1]};
    w[l] = random_param(tape, 2, ws, 20 + l, -1, 1, &wv[l]);
    b[l] = random_param(tape, 1, bs, 30 + l, -0.5, 0.5, &bv[l]);
  }
  topos_value y = topos_mlp(tape, x, 3, w, b, act);
  int64_t ys[2] = {3, 3};
  expect_shape(tape, y, 2, ys);

  /* The reference: the same layers with the activation between them. */
  double h[3 * 6], h2[3 * 6];
  memcpy(h, xv, sizeof(double) * 12);
  for (int l = 0; l < 3; l++) {
    ref_linear(h, wv[l], bv[l], 3, sizes[l], sizes[l + 1], h2);
    for (int i = 0; i < 3 * sizes[l + 1]; i++)
      h[i] = l < 2 ? ref_act(h2[i], act) : h2[i];
  }
  if (gradients) {
    expect_gradients(tape, y);
  } else {
    topos_network *net = seal(tape);
    double *got = forward_values(net, y, NULL);
    expect_close(got, h, 9, 1e-13);
    free(got);
    topos_network_release(net);
  }
  free(xv);
  for (int l = 0; l < 3; l++) {
    free(wv[l]);
    free(bv[l]);
  }
}

START_TEST(test_mlp_forward) {
  check_mlp(TOPOS_ACT_NONE, false);
  check_mlp(TOPOS_ACT_RELU, false);
  check_mlp(TOPOS_ACT_TANH, false);
  check_mlp(TOPOS_ACT_GELU, false);
  check_mlp(TOPOS_ACT_SILU, false);
}
END_TEST

START_TEST(test_mlp_gradient) {
  check_mlp(TOPOS_ACT_RELU, true);
  check_mlp(TOPOS_ACT_TANH, true);
  check_mlp(TOPOS_ACT_GELU, true);
  check_mlp(TOPOS_ACT_SILU, true);
}
END_TEST

START_TEST(test_mlp_bad_arguments) {
  int64_t xs[2] = {2, 3}, ws[2] = {3, 3};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  topos_value w = random_param(tape, 2, ws, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_mlp(tape, x, 0, &w, NULL, TOPOS_ACT_TANH));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  expect_tape_error(tape, topos_mlp(tape, x, 2, NULL, NULL, TOPOS_ACT_TANH));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  expect_tape_error(tape, topos_activate(tape, x, (topos_activation)99));
}
END_TEST

START_TEST(test_activation_values) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t s[1] = {9};
  double xv[9] = {-6, -2.5, -1, -0.25, 0, 0.3, 1, 2, 7};
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F64, 1, s, xv));
  topos_activation acts[5] = {TOPOS_ACT_NONE, TOPOS_ACT_RELU, TOPOS_ACT_TANH,
                              TOPOS_ACT_GELU, TOPOS_ACT_SILU};
  topos_value y[5];
  for (int a = 0; a < 5; a++) y[a] = topos_activate(tape, x, acts[a]);
  topos_value g = topos_gelu(tape, x), si = topos_silu(tape, x);
  topos_network *net = seal(tape);
  for (int a = 0; a < 5; a++) {
    double want[9];
    for (int i = 0; i < 9; i++) want[i] = ref_act(xv[i], acts[a]);
    double *got = forward_values(net, y[a], NULL);
    expect_close(got, want, 9, 1e-15);
    free(got);
  }
  double wg[9], ws[9];
  for (int i = 0; i < 9; i++) {
    wg[i] = ref_act(xv[i], TOPOS_ACT_GELU);
    ws[i] = ref_act(xv[i], TOPOS_ACT_SILU);
  }
  double *got = forward_values(net, g, NULL);
  expect_close(got, wg, 9, 1e-15);
  free(got);
  got = forward_values(net, si, NULL);
  expect_close(got, ws, 9, 1e-15);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_gelu_silu_gradient) {
  int64_t s[2] = {3, 4};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, s, 5, -3, 3, NULL);
  expect_gradients(tape, topos_gelu(tape, x));
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, s, 6, -3, 3, NULL);
  expect_gradients(tape, topos_silu(tape, x));
}
END_TEST

/* silu through tanh stays finite where 1/(1+exp(−x)) would overflow. */
START_TEST(test_silu_extremes_finite) {
  int64_t s[1] = {4};
  double xv[4] = {-1000, -700, 700, 1000};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F64, 1, s, xv));
  topos_value y = topos_silu(tape, x);
  topos_value loss = topos_sum(tape, y);
  topos_network *net = seal(tape);
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  double *v = tt_values(topos_run_of(run, y, &err));
  double want[4] = {0, 0, 700, 1000};
  expect_close(v, want, 4, 1e-15);
  free(v);
  topos_field *g = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(g != NULL, "%s", err.message);
  double *gv = tt_values(topos_field_of(g, x, &err));
  double wantg[4] = {0, 0, 1, 1};
  for (int i = 0; i < 4; i++) ck_assert(isfinite(gv[i]));
  expect_close(gv, wantg, 4, 1e-15);
  free(gv);
  topos_field_free(g);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------- embedding */

START_TEST(test_embedding_forward) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t ts[2] = {5, 2};
  double table[10] = {0, 1, 10, 11, 20, 21, 30, 31, 40, 41};
  topos_value t = tt_param(tape, tt_tensor(TOPOS_F64, 2, ts, table));
  int64_t is2[2] = {2, 3}, is1[1] = {3};
  double idx2[6] = {0, 4, 2, 1, 1, 3}, idx1[3] = {3, 0, 3}, idx0[1] = {2};
  topos_value e2 = topos_embedding(tape, t, index_constant(tape, 2, is2, idx2));
  topos_value e1 = topos_embedding(tape, t, index_constant(tape, 1, is1, idx1));
  topos_value e0 =
      topos_embedding(tape, t, index_constant(tape, 0, NULL, idx0));
  int64_t s2[3] = {2, 3, 2}, s1[2] = {3, 2}, s0[1] = {2};
  expect_shape(tape, e2, 3, s2);
  expect_shape(tape, e1, 2, s1);
  expect_shape(tape, e0, 1, s0);
  topos_network *net = seal(tape);
  double w2[12] = {0, 1, 40, 41, 20, 21, 10, 11, 10, 11, 30, 31};
  double w1[6] = {30, 31, 0, 1, 30, 31}, w0[2] = {20, 21};
  double *got = forward_values(net, e2, NULL);
  expect_equal(got, w2, 12);
  free(got);
  got = forward_values(net, e1, NULL);
  expect_equal(got, w1, 6);
  free(got);
  got = forward_values(net, e0, NULL);
  expect_equal(got, w0, 2);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_embedding_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t ts[2] = {6, 3}, is[2] = {2, 4};
  double idx[8] = {0, 5, 5, 2, 3, 0, 1, 5}; /* repeats accumulate */
  topos_value t = random_param(tape, 2, ts, 7, -1, 1, NULL);
  expect_gradients(tape,
                   topos_embedding(tape, t, index_constant(tape, 2, is, idx)));
}
END_TEST

START_TEST(test_embedding_bad) {
  int64_t ts[2] = {5, 2}, is[1] = {3};
  double idx[3] = {0, 1, 2};
  /* f64 indices */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value t = random_param(tape, 2, ts, 7, -1, 1, NULL);
  topos_value bad = tt_constant(tape, tt_tensor(TOPOS_F64, 1, is, idx));
  expect_tape_error(tape, topos_embedding(tape, t, bad));
  /* an index outside the table fails at run time, naming it */
  tape = topos_tape_new(TOPOS_F64);
  t = random_param(tape, 2, ts, 7, -1, 1, NULL);
  double far[3] = {0, 5, 1};
  topos_value e = topos_embedding(tape, t, index_constant(tape, 1, is, far));
  topos_network *net = seal(tape);
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_null(run);
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  (void)e;
  topos_network_release(net);
}
END_TEST

/* --------------------------------------------------------- normalisation */

START_TEST(test_layer_norm_forward) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[3] = {2, 3, 8}, gs[1] = {8};
  double *xv, *gv, *bv;
  topos_value x = random_param(tape, 3, xs, 11, -2, 5, &xv);
  topos_value g = random_param(tape, 1, gs, 12, 0.5, 1.5, &gv);
  topos_value b = random_param(tape, 1, gs, 13, -1, 1, &bv);
  const double eps = 1e-5;
  topos_value plain = topos_layer_norm(tape, x, TOPOS_NONE, TOPOS_NONE, eps);
  topos_value y = topos_layer_norm(tape, x, g, b, eps);
  expect_shape(tape, y, 3, xs);
  topos_network *net = seal(tape);
  double *p = forward_values(net, plain, NULL);
  double *got = forward_values(net, y, NULL);
  double want[48];
  for (int r = 0; r < 6; r++) {
    double mean = 0, var = 0, pm = 0, pv = 0;
    for (int i = 0; i < 8; i++) mean += xv[r * 8 + i] / 8;
    for (int i = 0; i < 8; i++)
      var += (xv[r * 8 + i] - mean) * (xv[r * 8 + i] - mean) / 8;
    for (int i = 0; i < 8; i++) {
      want[r * 8 + i] =
          (xv[r * 8 + i] - mean) / sqrt(var + eps) * gv[i] + bv[i];
      pm += p[r * 8 + i] / 8;
    }
    for (int i = 0; i < 8; i++)
      pv += (p[r * 8 + i] - pm) * (p[r * 8 + i] - pm) / 8;
    /* normalised rows: mean 0, variance var/(var+eps) ≈ 1 */
    ck_assert_msg(fabs(pm) < 1e-12, "row %d mean %g", r, pm);
    ck_assert_msg(fabs(pv - 1) < 1e-4, "row %d variance %g", r, pv);
  }
  expect_close(got, want, 48, 1e-12);
  free(p);
  free(got);
  free(xv);
  free(gv);
  free(bv);
  topos_network_release(net);
}
END_TEST

START_TEST(test_layer_norm_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {3, 5}, gs[1] = {5};
  topos_value x = random_param(tape, 2, xs, 14, -2, 2, NULL);
  topos_value g = random_param(tape, 1, gs, 15, 0.5, 1.5, NULL);
  topos_value b = random_param(tape, 1, gs, 16, -1, 1, NULL);
  expect_gradients(tape, topos_layer_norm(tape, x, g, b, 1e-5));
  /* rank 1, no affine part */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 1, gs, 17, -2, 2, NULL);
  expect_gradients(tape,
                   topos_layer_norm(tape, x, TOPOS_NONE, TOPOS_NONE, 0.1));
}
END_TEST

START_TEST(test_rms_norm) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {4, 6}, gs[1] = {6};
  double *xv, *gv;
  topos_value x = random_param(tape, 2, xs, 18, -2, 2, &xv);
  topos_value g = random_param(tape, 1, gs, 19, 0.5, 1.5, &gv);
  topos_value y = topos_rms_norm(tape, x, g, 1e-6);
  topos_value y0 = topos_rms_norm(tape, x, TOPOS_NONE, 1e-6);
  expect_shape(tape, y, 2, xs);
  topos_network *net = seal(tape);
  double want[24], want0[24];
  for (int r = 0; r < 4; r++) {
    double ms = 0;
    for (int i = 0; i < 6; i++) ms += xv[r * 6 + i] * xv[r * 6 + i] / 6;
    for (int i = 0; i < 6; i++) {
      want0[r * 6 + i] = xv[r * 6 + i] / sqrt(ms + 1e-6);
      want[r * 6 + i] = want0[r * 6 + i] * gv[i];
    }
  }
  double *got = forward_values(net, y, NULL);
  expect_close(got, want, 24, 1e-13);
  free(got);
  got = forward_values(net, y0, NULL);
  expect_close(got, want0, 24, 1e-13);
  free(got);
  topos_network_release(net);
  free(xv);
  free(gv);

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 20, -2, 2, NULL);
  g = random_param(tape, 1, gs, 21, 0.5, 1.5, NULL);
  expect_gradients(tape, topos_rms_norm(tape, x, g, 1e-6));
}
END_TEST

START_TEST(test_norm_bad_shapes) {
  int64_t xs[2] = {3, 5}, gs[1] = {4};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  topos_value g = random_param(tape, 1, gs, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_layer_norm(tape, x, g, TOPOS_NONE, 1e-5));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  g = random_param(tape, 1, gs, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_layer_norm(tape, x, TOPOS_NONE, g, 1e-5));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 1, -1, 1, NULL);
  g = random_param(tape, 1, gs, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_rms_norm(tape, x, g, 1e-5));

  /* rank 0 has no axis to normalise over */
  tape = topos_tape_new(TOPOS_F64);
  x = tt_param(tape, topos_tensor_scalar(TOPOS_F64, 1.0, NULL));
  expect_tape_error(tape, topos_layer_norm(tape, x, TOPOS_NONE, TOPOS_NONE, 1));
  tape = topos_tape_new(TOPOS_F64);
  x = tt_param(tape, topos_tensor_scalar(TOPOS_F64, 1.0, NULL));
  expect_tape_error(tape, topos_rms_norm(tape, x, TOPOS_NONE, 1));
}
END_TEST

/* Per-channel reference over x[N,C,H,W] (H = W = 1 for rank 2). */
static void ref_batch_norm(const double *x, const double *g, const double *b,
                           int n, int c, int hw, double eps, double *y,
                           double *mean, double *var) {
  for (int ch = 0; ch < c; ch++) {
    double m = 0, v = 0;
    int count = n * hw;
    for (int i = 0; i < n; i++)
      for (int p = 0; p < hw; p++) m += x[(i * c + ch) * hw + p];
    m /= count;
    for (int i = 0; i < n; i++)
      for (int p = 0; p < hw; p++) {
        double d = x[(i * c + ch) * hw + p] - m;
        v += d * d;
      }
    v /= count;
    mean[ch] = m;
    var[ch] = v;
    for (int i = 0; i < n; i++)
      for (int p = 0; p < hw; p++) {
        int k = (i * c + ch) * hw + p;
        y[k] = (x[k] - m) / sqrt(v + eps) * (g ? g[ch] : 1) + (b ? b[ch] : 0);
      }
  }
}

static void check_batch_norm(int rank) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {3, 4, 2, 3}, cs[1] = {4};
  int hw = rank == 4 ? 6 : 1, count = 12 * hw;
  double *xv, *gv, *bv;
  topos_value x = random_param(tape, rank, xs, 22, -3, 4, &xv);
  topos_value g = random_param(tape, 1, cs, 23, 0.5, 1.5, &gv);
  topos_value b = random_param(tape, 1, cs, 24, -1, 1, &bv);
  topos_value mean, var;
  topos_value y = topos_batch_norm(tape, x, g, b, 1e-5, &mean, &var);
  expect_shape(tape, y, rank, xs);
  expect_shape(tape, mean, 1, cs);
  expect_shape(tape, var, 1, cs);
  /* The inference form with the batch's own statistics gives the same. */
  topos_value yi = topos_batch_norm_inference(tape, x, g, b, mean, var, 1e-5);
  topos_network *net = seal(tape);
  double want[72], wm[4], wv[4];
  ref_batch_norm(xv, gv, bv, 3, 4, hw, 1e-5, want, wm, wv);
  double *got = forward_values(net, y, NULL);
  expect_close(got, want, count, 1e-12);
  free(got);
  got = forward_values(net, yi, NULL);
  expect_close(got, want, count, 1e-12);
  free(got);
  got = forward_values(net, mean, NULL);
  expect_close(got, wm, 4, 1e-13);
  free(got);
  got = forward_values(net, var, NULL);
  expect_close(got, wv, 4, 1e-13);
  free(got);
  topos_network_release(net);
  free(xv);
  free(gv);
  free(bv);
}

START_TEST(test_batch_norm_forward) {
  check_batch_norm(2);
  check_batch_norm(4);
}
END_TEST

START_TEST(test_batch_norm_gradient) {
  for (int rank = 2; rank <= 4; rank += 2) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    int64_t xs[4] = {3, 2, 2, 2}, cs[1] = {2};
    topos_value x = random_param(tape, rank, xs, 25, -2, 2, NULL);
    topos_value g = random_param(tape, 1, cs, 26, 0.5, 1.5, NULL);
    topos_value b = random_param(tape, 1, cs, 27, -1, 1, NULL);
    topos_value mean, var;
    topos_value y = topos_batch_norm(tape, x, g, b, 1e-3, &mean, &var);
    /* The statistics reach the loss too, so their gradients are checked. */
    topos_value loss = topos_add(tape, weighted_sum(tape, y, 5),
                                 topos_add(tape, weighted_sum(tape, mean, 6),
                                           weighted_sum(tape, var, 7)));
    expect_gradients(tape, loss);
  }
}
END_TEST

START_TEST(test_batch_norm_inference) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {2, 3, 2, 2}, cs[1] = {3};
  double *xv, *gv, *bv, *mv, *vv;
  topos_value x = random_param(tape, 4, xs, 28, -2, 2, &xv);
  topos_value g = random_param(tape, 1, cs, 29, 0.5, 1.5, &gv);
  topos_value b = random_param(tape, 1, cs, 30, -1, 1, &bv);
  topos_value m = random_param(tape, 1, cs, 31, -1, 1, &mv);
  topos_value v = random_param(tape, 1, cs, 32, 0.5, 2, &vv);
  topos_value y = topos_batch_norm_inference(tape, x, g, b, m, v, 1e-5);
  expect_shape(tape, y, 4, xs);
  topos_network *net = seal(tape);
  double want[24];
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 3; c++)
      for (int p = 0; p < 4; p++) {
        int k = (i * 3 + c) * 4 + p;
        want[k] = (xv[k] - mv[c]) / sqrt(vv[c] + 1e-5) * gv[c] + bv[c];
      }
  double *got = forward_values(net, y, NULL);
  expect_close(got, want, 24, 1e-13);
  free(got);
  topos_network_release(net);
  free(xv);
  free(gv);
  free(bv);
  free(mv);
  free(vv);

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 4, xs, 33, -2, 2, NULL);
  g = random_param(tape, 1, cs, 34, 0.5, 1.5, NULL);
  b = random_param(tape, 1, cs, 35, -1, 1, NULL);
  m = random_param(tape, 1, cs, 36, -1, 1, NULL);
  v = random_param(tape, 1, cs, 37, 0.5, 2, NULL);
  expect_gradients(tape, topos_batch_norm_inference(tape, x, g, b, m, v, 1e-5));
}
END_TEST

START_TEST(test_batch_norm_bad_shapes) {
  int64_t x3[3] = {2, 3, 4}, x2[2] = {4, 3}, c2[1] = {2};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 3, x3, 1, -1, 1, NULL);
  topos_value mean = {0, 0}, var = {0, 0};
  topos_value y =
      topos_batch_norm(tape, x, TOPOS_NONE, TOPOS_NONE, 1e-5, &mean, &var);
  ck_assert(!topos_value_ok(mean) && !topos_value_ok(var));
  expect_tape_error(tape, y);

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, x2, 1, -1, 1, NULL);
  topos_value g = random_param(tape, 1, c2, 2, -1, 1, NULL);
  expect_tape_error(tape,
                    topos_batch_norm(tape, x, g, TOPOS_NONE, 1e-5, NULL, NULL));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, x2, 1, -1, 1, NULL);
  topos_value m = random_param(tape, 1, c2, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_batch_norm_inference(tape, x, TOPOS_NONE,
                                                     TOPOS_NONE, m, m, 1e-5));

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 3, x3, 1, -1, 1, NULL);
  m = random_param(tape, 1, c2, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_batch_norm_inference(tape, x, TOPOS_NONE,
                                                     TOPOS_NONE, m, m, 1e-5));
}
END_TEST

/* --------------------------------------------------------------- conv2d */

/* Direct convolution: every output as its own sum over the window. */
static void ref_conv2d(const double *x, const double *w, const double *b, int n,
                       int c, int h, int wd, int o, int kh, int kw, int stride,
                       int pad, int dil, double *y, int *oh_out, int *ow_out) {
  int oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
  int ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
  for (int ni = 0; ni < n; ni++)
    for (int oi = 0; oi < o; oi++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++) {
          double acc = b ? b[oi] : 0;
          for (int ci = 0; ci < c; ci++)
            for (int p = 0; p < kh; p++)
              for (int q = 0; q < kw; q++) {
                int r = i * stride - pad + p * dil;
                int s = j * stride - pad + q * dil;
                if (r < 0 || r >= h || s < 0 || s >= wd) continue;
                acc += x[((ni * c + ci) * h + r) * wd + s] *
                       w[((oi * c + ci) * kh + p) * kw + q];
              }
          y[((ni * o + oi) * oh + i) * ow + j] = acc;
        }
  *oh_out = oh;
  *ow_out = ow;
}

static void check_conv2d(int stride, int pad, int dil, bool bias) {
  const int n = 2, c = 3, h = 7, wd = 6, o = 4, kh = 3, kw = 2;
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {n, c, h, wd}, ws[4] = {o, c, kh, kw}, bs[1] = {o};
  double *xv, *wv, *bv = NULL;
  topos_value x = random_param(tape, 4, xs, 40, -1, 1, &xv);
  topos_value w = random_param(tape, 4, ws, 41, -1, 1, &wv);
  topos_value b = bias ? random_param(tape, 1, bs, 42, -1, 1, &bv) : TOPOS_NONE;
  topos_value y = topos_conv2d(tape, x, w, b, stride, pad, dil);
  double want[2 * 4 * 8 * 8];
  int oh, ow;
  ref_conv2d(xv, wv, bv, n, c, h, wd, o, kh, kw, stride, pad, dil, want, &oh,
             &ow);
  int64_t ys[4] = {n, o, oh, ow};
  expect_shape(tape, y, 4, ys);
  topos_network *net = seal(tape);
  int64_t count = 0;
  double *got = forward_values(net, y, &count);
  ck_assert_int_eq(count, n * o * oh * ow);
  expect_close(got, want, count, 1e-13);
  free(got);
  free(xv);
  free(wv);
  free(bv);
  topos_network_release(net);
}

START_TEST(test_conv2d_forward) {
  check_conv2d(1, 0, 1, true);
  check_conv2d(1, 0, 1, false);
  check_conv2d(2, 1, 1, true);
  check_conv2d(1, 1, 2, true);
  check_conv2d(2, 1, 2, true);
  check_conv2d(2, 0, 2, false);
  check_conv2d(3, 2, 1, true);
}
END_TEST

START_TEST(test_conv2d_gradient) {
  int cases[3][3] = {{1, 0, 1}, {2, 1, 1}, {2, 1, 2}};
  for (int k = 0; k < 3; k++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    int64_t xs[4] = {2, 2, 5, 5}, ws[4] = {3, 2, 3, 2}, bs[1] = {3};
    topos_value x = random_param(tape, 4, xs, 43, -1, 1, NULL);
    topos_value w = random_param(tape, 4, ws, 44, -1, 1, NULL);
    topos_value b = random_param(tape, 1, bs, 45, -1, 1, NULL);
    expect_gradients(tape, topos_conv2d(tape, x, w, b, cases[k][0], cases[k][1],
                                        cases[k][2]));
  }
}
END_TEST

START_TEST(test_conv2d_bad_shapes) {
  int64_t xs[4] = {1, 3, 5, 5}, ws[4] = {2, 2, 3, 3}, x3[3] = {3, 5, 5};
  int64_t big[4] = {2, 3, 7, 7}, bs[1] = {3};
  /* channel mismatch */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 4, xs, 1, -1, 1, NULL);
  topos_value w = random_param(tape, 4, ws, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_conv2d(tape, x, w, TOPOS_NONE, 1, 0, 1));
  /* rank-3 input */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 3, x3, 1, -1, 1, NULL);
  w = random_param(tape, 4, ws, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_conv2d(tape, x, w, TOPOS_NONE, 1, 0, 1));
  /* kernel larger than the padded input */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 4, xs, 1, -1, 1, NULL);
  w = random_param(tape, 4, big, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_conv2d(tape, x, w, TOPOS_NONE, 1, 0, 1));
  /* bias of the wrong extent (3 for 2 filters) */
  tape = topos_tape_new(TOPOS_F64);
  int64_t w3[4] = {2, 3, 3, 3};
  x = random_param(tape, 4, xs, 1, -1, 1, NULL);
  w = random_param(tape, 4, w3, 2, -1, 1, NULL);
  topos_value b = random_param(tape, 1, bs, 3, -1, 1, NULL);
  expect_tape_error(tape, topos_conv2d(tape, x, w, b, 1, 0, 1));
  /* zero stride */
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 4, xs, 1, -1, 1, NULL);
  w = random_param(tape, 4, w3, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_conv2d(tape, x, w, TOPOS_NONE, 0, 0, 1));
}
END_TEST

/* ------------------------------------------------------------ max_pool2d */

static void check_max_pool(int kernel, int stride) {
  const int n = 2, c = 3, h = 7, wd = 6;
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {n, c, h, wd};
  double *xv;
  topos_value x = random_param(tape, 4, xs, 50 + kernel, -5, 5, &xv);
  topos_value y = topos_max_pool2d(tape, x, kernel, stride);
  int oh = (h - kernel) / stride + 1, ow = (wd - kernel) / stride + 1;
  int64_t ys[4] = {n, c, oh, ow};
  expect_shape(tape, y, 4, ys);
  double want[2 * 3 * 7 * 6];
  for (int p = 0; p < n * c; p++)
    for (int i = 0; i < oh; i++)
      for (int j = 0; j < ow; j++) {
        double m = -INFINITY;
        for (int a = 0; a < kernel; a++)
          for (int b = 0; b < kernel; b++)
            m = fmax(m, xv[(p * h + i * stride + a) * wd + j * stride + b]);
        want[(p * oh + i) * ow + j] = m;
      }
  topos_network *net = seal(tape);
  double *got = forward_values(net, y, NULL);
  expect_equal(got, want, n * c * oh * ow);
  free(got);
  free(xv);
  topos_network_release(net);
}

START_TEST(test_max_pool2d_forward) {
  check_max_pool(2, 2);
  check_max_pool(3, 1);
  check_max_pool(3, 2);
  check_max_pool(1, 1);
}
END_TEST

START_TEST(test_max_pool2d_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {2, 2, 5, 4};
  topos_value x = random_param(tape, 4, xs, 55, -1, 1, NULL);
  expect_gradients(tape, topos_max_pool2d(tape, x, 2, 1));
}
END_TEST

/* Ties route the whole gradient to the first maximal lane, row-major. */
START_TEST(test_max_pool2d_tie) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[4] = {1, 1, 2, 2};
  double xv[4] = {1, 3, 3, 3};
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F64, 4, xs, xv));
  topos_value loss = topos_sum(tape, topos_max_pool2d(tape, x, 2, 2));
  topos_network *net = seal(tape);
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert(topos_run_scalar(run, loss, &err) == 3.0);
  topos_field *g = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(g != NULL, "%s", err.message);
  double *gv = tt_values(topos_field_of(g, x, &err));
  double want[4] = {0, 1, 0, 0};
  expect_equal(gv, want, 4);
  free(gv);
  topos_field_free(g);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

START_TEST(test_max_pool2d_bad_shapes) {
  int64_t x3[3] = {2, 4, 4}, x4[4] = {1, 1, 3, 3};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 3, x3, 1, -1, 1, NULL);
  expect_tape_error(tape, topos_max_pool2d(tape, x, 2, 2));
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 4, x4, 1, -1, 1, NULL);
  expect_tape_error(tape, topos_max_pool2d(tape, x, 4, 1));
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 4, x4, 1, -1, 1, NULL);
  expect_tape_error(tape, topos_max_pool2d(tape, x, 0, 1));
}
END_TEST

/* --------------------------------------------------------------- softmax */

START_TEST(test_softmax_forward) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {3, 5};
  double *xv;
  topos_value x = random_param(tape, 2, xs, 60, -4, 4, &xv);
  topos_value s1 = topos_softmax(tape, x, 1);
  topos_value s0 = topos_softmax(tape, x, 0);
  expect_shape(tape, s1, 2, xs);
  topos_network *net = seal(tape);
  double w1[15], w0[15];
  for (int r = 0; r < 3; r++) {
    double z = 0;
    for (int j = 0; j < 5; j++) z += exp(xv[r * 5 + j]);
    for (int j = 0; j < 5; j++) w1[r * 5 + j] = exp(xv[r * 5 + j]) / z;
  }
  for (int j = 0; j < 5; j++) {
    double z = 0;
    for (int r = 0; r < 3; r++) z += exp(xv[r * 5 + j]);
    for (int r = 0; r < 3; r++) w0[r * 5 + j] = exp(xv[r * 5 + j]) / z;
  }
  double *got = forward_values(net, s1, NULL);
  expect_close(got, w1, 15, 1e-14);
  for (int r = 0; r < 3; r++) {
    double sum = 0;
    for (int j = 0; j < 5; j++) {
      ck_assert(got[r * 5 + j] > 0);
      sum += got[r * 5 + j];
    }
    ck_assert_msg(fabs(sum - 1) < 1e-14, "row %d sums to %.17g", r, sum);
  }
  free(got);
  got = forward_values(net, s0, NULL);
  expect_close(got, w0, 15, 1e-14);
  free(got);
  free(xv);
  topos_network_release(net);
}
END_TEST

/* Huge logits stay finite: the max is subtracted inside log_softmax. */
START_TEST(test_softmax_large) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[1] = {3};
  double xv[3] = {1000, 1000, -1000};
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F64, 1, xs, xv));
  topos_value s = topos_softmax(tape, x, 0);
  topos_network *net = seal(tape);
  double *got = forward_values(net, s, NULL);
  double want[3] = {0.5, 0.5, 0};
  expect_close(got, want, 3, 1e-15);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_softmax_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t xs[2] = {3, 4};
  topos_value x = random_param(tape, 2, xs, 61, -2, 2, NULL);
  expect_gradients(tape, topos_softmax(tape, x, 1));
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 62, -2, 2, NULL);
  expect_gradients(tape, topos_softmax(tape, x, 0));
}
END_TEST

START_TEST(test_softmax_bad_axis) {
  int64_t xs[2] = {3, 4};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, xs, 61, -2, 2, NULL);
  expect_tape_error(tape, topos_softmax(tape, x, 2));
  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 2, xs, 61, -2, 2, NULL);
  expect_tape_error(tape, topos_softmax(tape, x, -1));
}
END_TEST

/* ---------------------------------------------------------------- losses */

START_TEST(test_cross_entropy_forward) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t ls[2] = {4, 5}, ts[1] = {4};
  double *lv;
  double tv[4] = {2, 0, 4, 2};
  topos_value logits = random_param(tape, 2, ls, 70, -3, 3, &lv);
  topos_value targets = index_constant(tape, 1, ts, tv);
  double onehot[20] = {0};
  for (int i = 0; i < 4; i++) onehot[i * 5 + (int)tv[i]] = 1;
  topos_value oh = tt_constant(tape, tt_tensor(TOPOS_F64, 2, ls, onehot));
  topos_value ce = topos_cross_entropy(tape, logits, targets);
  topos_value ce1 = topos_cross_entropy_onehot(tape, logits, oh);
  expect_shape(tape, ce, 0, NULL);
  expect_shape(tape, ce1, 0, NULL);
  topos_network *net = seal(tape);
  double want = 0;
  for (int i = 0; i < 4; i++) {
    double z = 0;
    for (int j = 0; j < 5; j++) z += exp(lv[i * 5 + j]);
    want += -log(exp(lv[i * 5 + (int)tv[i]]) / z) / 4;
  }
  double *got = forward_values(net, ce, NULL);
  expect_close(got, &want, 1, 1e-14);
  free(got);
  got = forward_values(net, ce1, NULL);
  expect_close(got, &want, 1, 1e-14);
  free(got);
  free(lv);
  topos_network_release(net);
}
END_TEST

/* Uniform logits: the loss is log V whatever the targets. */
START_TEST(test_cross_entropy_uniform) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t ls[2] = {3, 27}, ts[1] = {3};
  double tv[3] = {0, 26, 13};
  topos_value logits =
      tt_param(tape, topos_tensor_filled(TOPOS_F64, 2, ls, 0.25, NULL));
  topos_value ce =
      topos_cross_entropy(tape, logits, index_constant(tape, 1, ts, tv));
  topos_network *net = seal(tape);
  double *got = forward_values(net, ce, NULL);
  double want = log(27.0);
  expect_close(got, &want, 1, 1e-15);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_cross_entropy_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t ls[2] = {5, 4}, ts[1] = {5};
  double tv[5] = {3, 0, 1, 3, 2};
  topos_value logits = random_param(tape, 2, ls, 71, -2, 2, NULL);
  expect_gradients(
      tape, topos_cross_entropy(tape, logits, index_constant(tape, 1, ts, tv)));

  /* soft targets for the one-hot form */
  tape = topos_tape_new(TOPOS_F64);
  logits = random_param(tape, 2, ls, 72, -2, 2, NULL);
  topos_value soft = tt_constant(tape, tt_random(TOPOS_F64, 2, ls, 73, 0, 0.5));
  expect_gradients(tape, topos_cross_entropy_onehot(tape, logits, soft));
}
END_TEST

START_TEST(test_cross_entropy_bad) {
  int64_t ls[2] = {3, 4}, ts[1] = {3}, t2[1] = {2};
  double tv[3] = {0, 1, 2};
  /* f64 targets */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value logits = random_param(tape, 2, ls, 1, -1, 1, NULL);
  topos_value bad = tt_constant(tape, tt_tensor(TOPOS_F64, 1, ts, tv));
  expect_tape_error(tape, topos_cross_entropy(tape, logits, bad));
  /* too few targets */
  tape = topos_tape_new(TOPOS_F64);
  logits = random_param(tape, 2, ls, 1, -1, 1, NULL);
  expect_tape_error(
      tape, topos_cross_entropy(tape, logits, index_constant(tape, 1, t2, tv)));
  /* rank-1 logits */
  tape = topos_tape_new(TOPOS_F64);
  logits = random_param(tape, 1, ls, 1, -1, 1, NULL);
  expect_tape_error(
      tape, topos_cross_entropy(tape, logits, index_constant(tape, 1, ts, tv)));
  /* one-hot targets of another shape */
  tape = topos_tape_new(TOPOS_F64);
  logits = random_param(tape, 2, ls, 1, -1, 1, NULL);
  int64_t ws[2] = {3, 5};
  topos_value oh = tt_constant(tape, tt_random(TOPOS_F64, 2, ws, 2, 0, 1));
  expect_tape_error(tape, topos_cross_entropy_onehot(tape, logits, oh));
}
END_TEST

/* A target of V (one past the row) must not silently read the next row's
 * logit: the forward run fails with a range error. */
START_TEST(test_cross_entropy_target_out_of_range) {
  int64_t ls[2] = {3, 4}, ts[1] = {3};
  double cases[3][3] = {{4, 0, 1}, {0, -1, 1}, {0, 1, 7}};
  for (int k = 0; k < 3; k++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value logits = random_param(tape, 2, ls, 1, -1, 1, NULL);
    topos_value ce = topos_cross_entropy(tape, logits,
                                         index_constant(tape, 1, ts, cases[k]));
    topos_network *net = seal(tape);
    topos_error err = {0};
    topos_run *run = topos_forward_for(net, NULL, NULL, 0, &ce, 1, NULL, &err);
    ck_assert_msg(run == NULL, "case %d: no error", k);
    ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_mse) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t s[2] = {2, 3};
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 3, 1, 5, 7};
  topos_value av = tt_param(tape, tt_tensor(TOPOS_F64, 2, s, a));
  topos_value bv = tt_param(tape, tt_tensor(TOPOS_F64, 2, s, b));
  topos_value m = topos_mse(tape, av, bv);
  expect_shape(tape, m, 0, NULL);
  topos_network *net = seal(tape);
  double *got = forward_values(net, m, NULL);
  double want = (0 + 4 + 0 + 9 + 0 + 1) / 6.0;
  expect_close(got, &want, 1, 1e-15);
  free(got);
  topos_network_release(net);

  tape = topos_tape_new(TOPOS_F64);
  av = random_param(tape, 2, s, 80, -1, 1, NULL);
  bv = random_param(tape, 2, s, 81, -1, 1, NULL);
  expect_gradients(tape, topos_mse(tape, av, bv));

  tape = topos_tape_new(TOPOS_F64);
  int64_t s2[2] = {3, 2};
  av = random_param(tape, 2, s, 80, -1, 1, NULL);
  bv = random_param(tape, 2, s2, 81, -1, 1, NULL);
  expect_tape_error(tape, topos_mse(tape, av, bv));
}
END_TEST

/* --------------------------------------------------------------- dropout */

START_TEST(test_dropout) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  int64_t s[1] = {5};
  double xv[5] = {1, -2, 3, 4, 5}, mv[5] = {1, 0, 1, 0, 1};
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F64, 1, s, xv));
  topos_tensor *mt = tt_tensor(TOPOS_F64, 1, s, mv);
  topos_value mask = topos_input(tape, mt);
  topos_tensor_release(mt);
  topos_value y = topos_dropout(tape, x, mask, 0.75);
  topos_value y0 = topos_dropout(tape, x, mask, 0.0);
  topos_network *net = seal(tape);
  double want[5] = {4, 0, 12, 0, 20}, want0[5] = {1, 0, 3, 0, 5};
  double *got = forward_values(net, y, NULL);
  expect_equal(got, want, 5);
  free(got);
  got = forward_values(net, y0, NULL);
  expect_equal(got, want0, 5);
  free(got);

  /* A fed mask replaces the default. */
  double fed[5] = {0, 1, 0, 1, 0};
  topos_tensor *ft = tt_tensor(TOPOS_F64, 1, s, fed);
  topos_feed feed = {topos_network_input(net, 0), ft};
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, &feed, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  double *v = tt_values(topos_run_of(run, y, &err));
  double wantf[5] = {0, -8, 0, 16, 0};
  expect_equal(v, wantf, 5);
  free(v);
  topos_run_free(run);
  topos_tensor_release(ft);
  topos_network_release(net);

  tape = topos_tape_new(TOPOS_F64);
  x = random_param(tape, 1, s, 90, -1, 1, NULL);
  mask = tt_constant(tape, tt_tensor(TOPOS_F64, 1, s, mv));
  expect_gradients(tape, topos_dropout(tape, x, mask, 0.3));
}
END_TEST

START_TEST(test_dropout_bad) {
  int64_t s[1] = {5}, s4[1] = {4};
  double ps[4] = {1.0, -0.1, 2.0, NAN};
  for (int k = 0; k < 4; k++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value x = random_param(tape, 1, s, 90, -1, 1, NULL);
    topos_value mask =
        tt_constant(tape, topos_tensor_ones(TOPOS_F64, 1, s, NULL));
    ck_assert_ptr_null(topos_tape_error(tape));
    expect_tape_error(tape, topos_dropout(tape, x, mask, ps[k]));
  }
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 1, s, 90, -1, 1, NULL);
  topos_value mask =
      tt_constant(tape, topos_tensor_ones(TOPOS_F64, 1, s4, NULL));
  expect_tape_error(tape, topos_dropout(tape, x, mask, 0.5));
}
END_TEST

/* -------------------------------------------------- invalid and foreign */

/* Every composite fed an invalid value reports it on the tape. */
START_TEST(test_invalid_operands) {
  const topos_value none = TOPOS_NONE;
  for (int k = 0; k < 20; k++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value r = TOPOS_NONE, m = TOPOS_NONE, v = TOPOS_NONE;
    switch (k) {
      case 0:
        r = topos_linear(tape, none, none, none);
        break;
      case 1:
        r = topos_mlp(tape, none, 1, &none, NULL, TOPOS_ACT_TANH);
        break;
      case 2:
        r = topos_activate(tape, none, TOPOS_ACT_RELU);
        break;
      case 3:
        r = topos_embedding(tape, none, none);
        break;
      case 4:
        r = topos_layer_norm(tape, none, none, none, 1e-5);
        break;
      case 5:
        r = topos_rms_norm(tape, none, none, 1e-5);
        break;
      case 6:
        r = topos_batch_norm(tape, none, none, none, 1e-5, &m, &v);
        break;
      case 7:
        r = topos_batch_norm_inference(tape, none, none, none, none, none, 1);
        break;
      case 8:
        r = topos_conv2d(tape, none, none, none, 1, 0, 1);
        break;
      case 9:
        r = topos_max_pool2d(tape, none, 2, 2);
        break;
      case 10:
        r = topos_softmax(tape, none, 0);
        break;
      case 11:
        r = topos_cross_entropy(tape, none, none);
        break;
      case 12:
        r = topos_cross_entropy_onehot(tape, none, none);
        break;
      case 13:
        r = topos_mse(tape, none, none);
        break;
      case 14:
        r = topos_gelu(tape, none);
        break;
      case 15:
        r = topos_silu(tape, none);
        break;
      case 16:
        r = topos_dropout(tape, none, none, 0.5);
        break;
      case 17:
        r = topos_activate(tape, none, TOPOS_ACT_GELU);
        break;
      case 18:
        r = topos_activate(tape, none, TOPOS_ACT_SILU);
        break;
      case 19:
        r = topos_activate(tape, none, TOPOS_ACT_TANH);
        break;
    }
    ck_assert_msg(!topos_value_ok(r), "case %d gave a value", k);
    ck_assert_msg(topos_tape_error(tape) != NULL, "case %d: no error", k);
    topos_tape_free(tape);
  }
}
END_TEST

START_TEST(test_foreign_operands) {
  int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
  topos_tape *other = topos_tape_new(TOPOS_F64);
  topos_value w = random_param(other, 2, ws, 1, -1, 1, NULL);
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = random_param(tape, 2, xs, 2, -1, 1, NULL);
  expect_tape_error(tape, topos_linear(tape, x, w, TOPOS_NONE));
  tape = topos_tape_new(TOPOS_F64);
  expect_tape_error(tape, topos_layer_norm(tape, w, TOPOS_NONE, TOPOS_NONE, 1));
  topos_tape_free(other);
}
END_TEST

/* A composite on an f32 tape records f32 constants and agrees with f64. */
START_TEST(test_f32_tape) {
  int64_t xs[2] = {2, 4};
  double v[8] = {0.5, -1, 2, 3, 1, 1, -2, 0.25};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value x = tt_param(tape, tt_tensor(TOPOS_F32, 2, xs, v));
  topos_value y =
      topos_gelu(tape, topos_layer_norm(tape, x, TOPOS_NONE, TOPOS_NONE, 1e-5));
  topos_value s = topos_softmax(tape, y, 1);
  ck_assert_int_eq(topos_value_dtype(tape, s), TOPOS_F32);
  topos_network *net = seal(tape);
  double *got = forward_values(net, s, NULL);
  for (int r = 0; r < 2; r++) {
    double sum = 0;
    for (int j = 0; j < 4; j++) sum += got[r * 4 + j];
    ck_assert_msg(fabs(sum - 1) < 1e-6, "row %d sums to %g", r, sum);
  }
  free(got);
  topos_network_release(net);
}
END_TEST

Suite *nn_suite(void) {
  Suite *s = suite_create("nn");
  const tt_case cases[] = {
      {"linear", test_linear_forward},
      {"linear", test_linear_gradient},
      {"linear", test_linear_bad_shapes},
      {"mlp", test_mlp_forward},
      {"mlp", test_mlp_gradient},
      {"mlp", test_mlp_bad_arguments},
      {"activations", test_activation_values},
      {"activations", test_gelu_silu_gradient},
      {"activations", test_silu_extremes_finite},
      {"embedding", test_embedding_forward},
      {"embedding", test_embedding_gradient},
      {"embedding", test_embedding_bad},
      {"norms", test_layer_norm_forward},
      {"norms", test_layer_norm_gradient},
      {"norms", test_rms_norm},
      {"norms", test_norm_bad_shapes},
      {"batch_norm", test_batch_norm_forward},
      {"batch_norm", test_batch_norm_gradient},
      {"batch_norm", test_batch_norm_inference},
      {"batch_norm", test_batch_norm_bad_shapes},
      {"conv2d", test_conv2d_forward},
      {"conv2d", test_conv2d_gradient},
      {"conv2d", test_conv2d_bad_shapes},
      {"max_pool2d", test_max_pool2d_forward},
      {"max_pool2d", test_max_pool2d_gradient},
      {"max_pool2d", test_max_pool2d_tie},
      {"max_pool2d", test_max_pool2d_bad_shapes},
      {"softmax", test_softmax_forward},
      {"softmax", test_softmax_large},
      {"softmax", test_softmax_gradient},
      {"softmax", test_softmax_bad_axis},
      {"losses", test_cross_entropy_forward},
      {"losses", test_cross_entropy_uniform},
      {"losses", test_cross_entropy_gradient},
      {"losses", test_cross_entropy_bad},
      {"losses", test_cross_entropy_target_out_of_range},
      {"losses", test_mse},
      {"dropout", test_dropout},
      {"dropout", test_dropout_bad},
      {"errors", test_invalid_operands},
      {"errors", test_foreign_operands},
      {"dtypes", test_f32_tape},
  };
  tt_add_cases(s, cases, sizeof cases / sizeof cases[0], 60);
  return s;
}
