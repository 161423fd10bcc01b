/*
 * test_interp.c - the reference interpreter (engine/interp.c): forward
 * with initial or given parameters and feeds, forward_for and what it
 * leaves unevaluated, argument checking, repeatability, threads sharing
 * one network, purity (runs never modify the network or the parameters),
 * buffer recycling through the pool, and batch invariance.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})

/* ------------------------------------------------------------ helpers */

static void *raw_of(const topos_tensor *t) {
  size_t bytes =
      (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
  void *out = malloc(bytes ? bytes : 1);
  topos_error err = {0};
  ck_assert_int_eq(topos_tensor_read(t, out, bytes, &err), TOPOS_OK);
  return out;
}

/* A deep copy of a parameter set (fresh buffers, same bits). */
static topos_params *deep_copy(const topos_params *p) {
  int n = topos_params_count(p);
  topos_tensor **ts = malloc(sizeof(*ts) * (size_t)(n ? n : 1));
  topos_error err = {0};
  for (int i = 0; i < n; i++) {
    const topos_tensor *x = topos_params_get(p, i);
    void *raw = raw_of(x);
    ts[i] = topos_tensor_from(topos_tensor_dtype(x), topos_tensor_rank(x),
                              topos_tensor_shape(x), raw, &err);
    ck_assert_ptr_nonnull(ts[i]);
    free(raw);
  }
  topos_params *q = topos_params_new(n, ts, &err);
  ck_assert_ptr_nonnull(q);
  for (int i = 0; i < n; i++) topos_tensor_release(ts[i]);
  free(ts);
  return q;
}

static topos_tensor *deep_copy_tensor(const topos_tensor *x) {
  topos_error err = {0};
  void *raw = raw_of(x);
  topos_tensor *t =
      topos_tensor_from(topos_tensor_dtype(x), topos_tensor_rank(x),
                        topos_tensor_shape(x), raw, &err);
  free(raw);
  ck_assert_ptr_nonnull(t);
  return t;
}

/* The fixture network, in f64:
 *   w[2,3], b[1,3] parameters; x[4,2] input
 *   h = x·w; y = tanh(h + broadcast(b)); loss = sum(y)
 *   side = sum(exp(w))  (not an ancestor of loss or h) */
static const double W0[6] = {0.5, -1.0, 0.25, 1.5, 0.75, -0.5};
static const double B0[3] = {0.1, -0.2, 0.3};
static const double X0[8] = {1, 2, -1, 0.5, 0.25, -2, 3, 1};
static const double X1[8] = {0.5, 0.5, 1, -1, 2, 0, -0.25, 0.75};

typedef struct fixture {
  topos_network *net;
  topos_value w, b, x, h, y, loss, side;
} fixture;

static fixture make_fixture(void) {
  fixture f;
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *tw = tt_tensor(TOPOS_F64, 2, S(2, 3), W0);
  topos_tensor *tb = tt_tensor(TOPOS_F64, 2, S(1, 3), B0);
  topos_tensor *tx = tt_tensor(TOPOS_F64, 2, S(4, 2), X0);
  f.w = topos_name(t, topos_parameter(t, tw), "w");
  f.b = topos_name(t, topos_parameter(t, tb), "b");
  f.x = topos_name(t, topos_input(t, tx), "x");
  topos_tensor_release(tw);
  topos_tensor_release(tb);
  topos_tensor_release(tx);
  f.h = topos_matmul(t, f.x, f.w);
  f.y = topos_tanh(t, topos_add(t, f.h, topos_broadcast(t, f.b, 2, S(4, 3))));
  f.loss = topos_name(t, topos_sum(t, f.y), "loss");
  f.side = topos_sum(t, topos_exp(t, f.w));
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "%s", e);
  topos_error err = {0};
  f.net = topos_tape_seal(t, &err);
  ck_assert_msg(f.net != NULL, "%s", err.message);
  return f;
}

/* The fixture's loss computed here (fma chain, left fold of 12). */
static double ref_loss(const double *w, const double *b, const double *x) {
  double y[12];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      double acc = 0.0;
      for (int k = 0; k < 2; k++) acc = fma(x[i * 2 + k], w[k * 3 + j], acc);
      y[i * 3 + j] = tanh(acc + b[j]);
    }
  double s = y[0];
  for (int i = 1; i < 12; i++) s = s + y[i];
  return s;
}

static void expect_same_bits(double got, double want, const char *what) {
  ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s: got %a want %a",
                what, got, want);
}

/* ----------------------------------------------------------- forward */

START_TEST(forward_uses_initials) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_run *run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "loss");
  const topos_tensor *w = topos_run_of(run, f.w, &err);
  ck_assert_ptr_nonnull(w);
  tt_assert_values(w, W0, 6);
  tt_assert_values(topos_run_of(run, f.x, &err), X0, 8);
  /* forward evaluates every node, the side branch included */
  const topos_tensor *side = topos_run_of(run, f.side, &err);
  ck_assert_ptr_nonnull(side);
  double want = 0;
  {
    double e[6];
    for (int i = 0; i < 6; i++) e[i] = exp(W0[i]);
    want = e[0];
    for (int i = 1; i < 6; i++) want = want + e[i];
  }
  expect_same_bits(topos_run_scalar(run, f.side, &err), want, "side");
  topos_run_free(run);

  /* explicit initials give the same bits */
  topos_params *p = topos_network_parameters(f.net);
  ck_assert_int_eq(topos_params_count(p), 2);
  run = topos_forward(f.net, p, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "loss with initials");
  topos_run_free(run);

  /* other parameters */
  const double w2[6] = {-0.5, 0.125, 2, 1, -1, 0.5};
  topos_tensor *tw = tt_tensor(TOPOS_F64, 2, S(2, 3), w2);
  topos_params *q = topos_params_with(p, 0, tw, &err);
  ck_assert_ptr_nonnull(q);
  run = topos_forward(f.net, q, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(w2, B0, X0),
                   "loss with w2");
  /* the parameter node holds the given tensor's values */
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(run, f.w, &err), tw));
  topos_run_free(run);
  topos_tensor_release(tw);
  topos_params_free(q);
  topos_params_free(p);
  topos_network_release(f.net);
}
END_TEST

START_TEST(forward_feeds_override_defaults) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_tensor *x1 = tt_tensor(TOPOS_F64, 2, S(4, 2), X1);
  topos_feed feed = {f.x, x1};
  topos_run *run = topos_forward(f.net, NULL, &feed, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X1),
                   "fed loss");
  tt_assert_values(topos_run_of(run, f.x, &err), X1, 8);
  topos_run_free(run);
  /* the default is back without the feed */
  run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "default loss");
  topos_run_free(run);
  /* a feed found by name */
  topos_value xn = topos_network_find(f.net, "x");
  topos_feed feed2 = {xn, x1};
  run = topos_forward(f.net, NULL, &feed2, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(
      topos_run_scalar(run, topos_network_find(f.net, "loss"), &err),
      ref_loss(W0, B0, X1), "fed by name");
  topos_run_free(run);
  topos_tensor_release(x1);
  topos_network_release(f.net);
}
END_TEST

/* A strided (non-contiguous) feed is read by its logical layout. */
START_TEST(forward_feed_view) {
  fixture f = make_fixture();
  topos_error err = {0};
  double xt[8];
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 2; k++) xt[k * 4 + i] = X1[i * 2 + k];
  topos_tensor *base = tt_tensor(TOPOS_F64, 2, S(2, 4), xt);
  topos_tensor *view = topos_tensor_transpose(base, &err);
  ck_assert_ptr_nonnull(view);
  topos_feed feed = {f.x, view};
  topos_run *run = topos_forward(f.net, NULL, &feed, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X1),
                   "loss of a transposed feed");
  topos_run_free(run);
  topos_tensor_release(view);
  topos_tensor_release(base);
  topos_network_release(f.net);
}
END_TEST

static void expect_forward_fails(const topos_network *net,
                                 const topos_params *p, const topos_feed *fd,
                                 int n, int code, const char *what) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, p, fd, n, NULL, &err);
  ck_assert_msg(run == NULL, "%s: forward succeeded", what);
  ck_assert_msg(err.code != TOPOS_OK, "%s: no error code", what);
  ck_assert_msg(err.message[0] != 0, "%s: empty message", what);
  if (code != TOPOS_OK)
    ck_assert_msg(err.code == code, "%s: code %d (%s) want %d: %s", what,
                  err.code, topos_status_name(err.code), code, err.message);
  /* forward_for checks the same way */
  if (net) {
    topos_value target = topos_network_find(net, "loss");
    memset(&err, 0, sizeof err);
    run = topos_forward_for(net, p, fd, n, &target, 1, NULL, &err);
    ck_assert_msg(run == NULL, "%s: forward_for succeeded", what);
    ck_assert_msg(err.code != TOPOS_OK, "%s: forward_for no code", what);
  }
  /* err NULL is allowed */
  ck_assert_ptr_null(topos_forward(net, p, fd, n, NULL, NULL));
}

START_TEST(forward_bad_feeds) {
  fixture f = make_fixture();
  topos_tensor *f32 = tt_tensor(TOPOS_F32, 2, S(4, 2), X1);
  const double twelve[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  topos_tensor *wrong = tt_tensor(TOPOS_F64, 2, S(4, 3), twelve);
  topos_tensor *flat = tt_tensor(TOPOS_F64, 1, S(8), X1);
  topos_tensor *good = tt_tensor(TOPOS_F64, 2, S(4, 2), X1);
  topos_tensor *w_like = tt_tensor(TOPOS_F64, 2, S(2, 3), W0);

  topos_feed fd = {f.x, f32};
  expect_forward_fails(f.net, NULL, &fd, 1, TOPOS_ERR_DTYPE, "f32 feed");
  fd.tensor = wrong;
  expect_forward_fails(f.net, NULL, &fd, 1, TOPOS_ERR_SHAPE, "[4,3] feed");
  fd.tensor = flat;
  expect_forward_fails(f.net, NULL, &fd, 1, TOPOS_ERR_SHAPE, "[8] feed");
  fd.tensor = NULL;
  expect_forward_fails(f.net, NULL, &fd, 1, TOPOS_OK, "NULL tensor");
  /* feeding a parameter or a computed node */
  topos_feed fw = {f.w, w_like};
  expect_forward_fails(f.net, NULL, &fw, 1, TOPOS_ERR_ARGUMENT,
                       "feeding a parameter");
  topos_feed fh = {f.h, wrong};
  expect_forward_fails(f.net, NULL, &fh, 1, TOPOS_ERR_ARGUMENT,
                       "feeding a matmul");
  topos_feed fn = {TOPOS_NONE, good};
  expect_forward_fails(f.net, NULL, &fn, 1, TOPOS_ERR_ARGUMENT,
                       "invalid value");
  /* an input of another network with the same index and shape */
  fixture g = make_fixture();
  ck_assert_int_eq(g.x.index, f.x.index);
  topos_feed ff = {g.x, good};
  expect_forward_fails(f.net, NULL, &ff, 1, TOPOS_ERR_ARGUMENT,
                       "foreign input");
  /* feeds NULL with a count, negative count */
  expect_forward_fails(f.net, NULL, NULL, 1, TOPOS_OK, "NULL feeds");
  topos_feed ok = {f.x, good};
  expect_forward_fails(f.net, NULL, &ok, -1, TOPOS_OK, "negative count");
  /* NULL network */
  expect_forward_fails(NULL, NULL, NULL, 0, TOPOS_OK, "NULL network");
  /* the good feed works */
  topos_error err = {0};
  topos_run *run = topos_forward(f.net, NULL, &ok, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  topos_run_free(run);

  topos_tensor_release(f32);
  topos_tensor_release(wrong);
  topos_tensor_release(flat);
  topos_tensor_release(good);
  topos_tensor_release(w_like);
  topos_network_release(g.net);
  topos_network_release(f.net);
}
END_TEST

START_TEST(forward_bad_params) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_tensor *w = tt_tensor(TOPOS_F64, 2, S(2, 3), W0);
  topos_tensor *b = tt_tensor(TOPOS_F64, 2, S(1, 3), B0);
  topos_tensor *w32 = tt_tensor(TOPOS_F32, 2, S(2, 3), W0);
  topos_tensor *wT = tt_tensor(TOPOS_F64, 2, S(3, 2), W0);
  topos_tensor *b3 = tt_tensor(TOPOS_F64, 1, S(3), B0);

  topos_params *one = topos_params_new(1, (topos_tensor *[]){w}, &err);
  expect_forward_fails(f.net, one, NULL, 0, TOPOS_OK, "one parameter of two");
  topos_params *three = topos_params_new(3, (topos_tensor *[]){w, b, b}, &err);
  expect_forward_fails(f.net, three, NULL, 0, TOPOS_OK, "three parameters");
  topos_params *dt = topos_params_new(2, (topos_tensor *[]){w32, b}, &err);
  expect_forward_fails(f.net, dt, NULL, 0, TOPOS_ERR_DTYPE, "f32 parameter");
  topos_params *sh = topos_params_new(2, (topos_tensor *[]){wT, b}, &err);
  expect_forward_fails(f.net, sh, NULL, 0, TOPOS_ERR_SHAPE, "[3,2] for [2,3]");
  topos_params *rk = topos_params_new(2, (topos_tensor *[]){w, b3}, &err);
  expect_forward_fails(f.net, rk, NULL, 0, TOPOS_ERR_SHAPE, "[3] for [1,3]");
  topos_params *sw = topos_params_new(2, (topos_tensor *[]){b, w}, &err);
  expect_forward_fails(f.net, sw, NULL, 0, TOPOS_ERR_SHAPE, "swapped slots");
  topos_params *good = topos_params_new(2, (topos_tensor *[]){w, b}, &err);
  topos_run *run = topos_forward(f.net, good, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  topos_run_free(run);

  topos_params_free(one);
  topos_params_free(three);
  topos_params_free(dt);
  topos_params_free(sh);
  topos_params_free(rk);
  topos_params_free(sw);
  topos_params_free(good);
  topos_tensor_release(w);
  topos_tensor_release(b);
  topos_tensor_release(w32);
  topos_tensor_release(wT);
  topos_tensor_release(b3);
  topos_network_release(f.net);
}
END_TEST

/* ------------------------------------------------------- forward_for */

START_TEST(forward_for_only_ancestors) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_run *run = topos_forward_for(f.net, NULL, NULL, 0, &f.h, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert_ptr_nonnull(topos_run_of(run, f.h, &err));
  ck_assert_ptr_nonnull(topos_run_of(run, f.x, &err));
  ck_assert_ptr_nonnull(topos_run_of(run, f.w, &err));
  /* not ancestors of h */
  topos_value skip[3] = {f.b, f.loss, f.side};
  for (int i = 0; i < 3; i++) {
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(topos_run_of(run, skip[i], &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
    ck_assert(err.message[0] != 0);
  }
  memset(&err, 0, sizeof err);
  ck_assert(isnan(topos_run_scalar(run, f.loss, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
  /* values equal those of a full forward */
  topos_run *full = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(run, f.h, &err),
                                       topos_run_of(full, f.h, &err)));
  topos_run_free(full);
  topos_run_free(run);

  /* two targets */
  topos_value two[2] = {f.loss, f.side};
  run = topos_forward_for(f.net, NULL, NULL, 0, two, 2, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "loss via forward_for");
  ck_assert_ptr_nonnull(topos_run_of(run, f.side, &err));
  ck_assert_ptr_nonnull(topos_run_of(run, f.b, &err));
  topos_run_free(run);

  /* bad targets */
  topos_value bad = TOPOS_NONE;
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(
      topos_forward_for(f.net, NULL, NULL, 0, &bad, 1, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  fixture g = make_fixture();
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(
      topos_forward_for(f.net, NULL, NULL, 0, &g.loss, 1, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(
      topos_forward_for(f.net, NULL, NULL, 0, NULL, 1, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_network_release(g.net);
  topos_network_release(f.net);
}
END_TEST

/* ------------------------------------------------- reading a run */

START_TEST(run_reading_errors) {
  fixture f = make_fixture();
  fixture g = make_fixture();
  topos_error err = {0};
  topos_run *run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_run_of(run, g.loss, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_run_of(run, TOPOS_NONE, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_value past = {f.loss.tape, 999};
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_run_of(run, past, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_run_of(NULL, f.loss, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_ptr_null(topos_run_of(NULL, f.loss, NULL));
  /* run_scalar needs rank 0 */
  memset(&err, 0, sizeof err);
  ck_assert(isnan(topos_run_scalar(run, f.h, &err)));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert(isnan(topos_run_scalar(NULL, f.loss, &err)));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert(isnan(topos_run_scalar(run, g.loss, &err)));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_run_free(run);
  topos_run_free(NULL);
  topos_network_release(g.net);
  topos_network_release(f.net);
}
END_TEST

/* A run keeps its network alive. */
START_TEST(run_outlives_network_reference) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_run *run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  topos_network_release(f.net);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "loss after release");
  topos_field *g = topos_backward(run, f.loss, NULL, &err);
  ck_assert_msg(g != NULL, "%s", err.message);
  topos_run_free(run);
  /* and a field keeps it too */
  ck_assert_ptr_nonnull(topos_field_of(g, f.w, &err));
  topos_field_free(g);
}
END_TEST

/* ------------------------------------------------------ determinism */

START_TEST(repeat_runs_bit_identical) {
  fixture f = make_fixture();
  topos_error err = {0};
  int n = topos_network_node_count(f.net);
  topos_run *first = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  topos_field *gfirst = topos_backward(first, f.loss, NULL, &err);
  ck_assert_ptr_nonnull(gfirst);
  for (int rep = 0; rep < 3; rep++) {
    topos_run *run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    topos_field *g = topos_backward(run, f.loss, NULL, &err);
    ck_assert_ptr_nonnull(g);
    for (int i = 0; i < n; i++) {
      topos_value v = {f.loss.tape, i};
      ck_assert_msg(topos_tensor_bitwise_equal(topos_run_of(first, v, &err),
                                               topos_run_of(run, v, &err)),
                    "node %d value differs", i);
      ck_assert_msg(topos_tensor_bitwise_equal(topos_field_of(gfirst, v, &err),
                                               topos_field_of(g, v, &err)),
                    "node %d gradient differs", i);
    }
    topos_field_free(g);
    topos_run_free(run);
  }
  topos_field_free(gfirst);
  topos_run_free(first);
  topos_network_release(f.net);
}
END_TEST

/* A bigger f32 network for threads and purity: an MLP with log_softmax
 * and a gather of the rows' targets. */
typedef struct mlp {
  topos_network *net;
  topos_value x, loss, logits;
  topos_tensor *xin;
} mlp;

static mlp make_mlp(topos_dtype d) {
  mlp m;
  topos_tape *t = topos_tape_new(d);
  topos_tensor *w1 = tt_random(d, 2, S(32, 24), 1, -0.3, 0.3);
  topos_tensor *b1 = tt_random(d, 2, S(1, 24), 2, -0.1, 0.1);
  topos_tensor *w2 = tt_random(d, 2, S(24, 10), 3, -0.3, 0.3);
  topos_tensor *x = tt_random(d, 2, S(16, 32), 4, -1, 1);
  topos_tensor *c = tt_random(d, 2, S(16, 10), 5, -1, 1);
  topos_value vw1 = topos_parameter(t, w1);
  topos_value vb1 = topos_parameter(t, b1);
  topos_value vw2 = topos_parameter(t, w2);
  m.x = topos_input(t, x);
  topos_value h =
      topos_tanh(t, topos_add(t, topos_matmul(t, m.x, vw1),
                              topos_broadcast(t, vb1, 2, S(16, 24))));
  m.logits = topos_matmul(t, h, vw2);
  topos_value ls = topos_log_softmax(t, m.logits, 1);
  m.loss = topos_sum(t, topos_mul(t, ls, topos_constant(t, c)));
  topos_tensor_release(w1);
  topos_tensor_release(b1);
  topos_tensor_release(w2);
  topos_tensor_release(c);
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "%s", e);
  topos_error err = {0};
  m.net = topos_tape_seal(t, &err);
  ck_assert_msg(m.net != NULL, "%s", err.message);
  m.xin = tt_random(d, 2, S(16, 32), 6, -1, 1); /* a feed */
  topos_tensor_release(x);
  return m;
}

static void free_mlp(mlp *m) {
  topos_tensor_release(m->xin);
  topos_network_release(m->net);
}

typedef struct thread_job {
  const mlp *m;
  const topos_params *params;
  const topos_tensor *want_loss;
  const topos_params *want_grads;
  atomic_int *failures;
} thread_job;

static void *thread_main(void *arg) {
  thread_job *j = arg;
  for (int it = 0; it < 20; it++) {
    topos_error err = {0};
    topos_feed fd = {j->m->x, j->m->xin};
    topos_run *run = topos_forward(j->m->net, j->params, &fd, 1, NULL, &err);
    if (!run) {
      atomic_fetch_add(j->failures, 1);
      continue;
    }
    topos_field *g = topos_backward(run, j->m->loss, NULL, &err);
    topos_params *gp = g ? topos_parameters_of(g, &err) : NULL;
    if (!gp ||
        !topos_tensor_bitwise_equal(topos_run_of(run, j->m->loss, &err),
                                    j->want_loss) ||
        !topos_params_bitwise_equal(gp, j->want_grads))
      atomic_fetch_add(j->failures, 1);
    topos_params_free(gp);
    topos_field_free(g);
    topos_run_free(run);
  }
  return NULL;
}

START_TEST(threads_share_one_network) {
  const topos_dtype dts[2] = {TOPOS_F32, TOPOS_F64};
  for (int k = 0; k < 2; k++) {
    mlp m = make_mlp(dts[k]);
    topos_params *p = topos_network_parameters(m.net);
    topos_error err = {0};
    topos_feed fd = {m.x, m.xin};
    topos_run *run = topos_forward(m.net, p, &fd, 1, NULL, &err);
    ck_assert_msg(run != NULL, "%s", err.message);
    topos_field *g = topos_backward(run, m.loss, NULL, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    topos_params *want_grads = topos_parameters_of(g, &err);
    ck_assert_ptr_nonnull(want_grads);
    topos_tensor *want_loss =
        topos_tensor_retain(topos_run_of(run, m.loss, &err));
    topos_field_free(g);
    topos_run_free(run);

    atomic_int failures = 0;
    pthread_t th[4];
    thread_job job = {&m, p, want_loss, want_grads, &failures};
    for (int i = 0; i < 4; i++)
      ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &job), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    ck_assert_msg(atomic_load(&failures) == 0,
                  "%d of 80 threaded runs differ or failed",
                  atomic_load(&failures));
    topos_tensor_release(want_loss);
    topos_params_free(want_grads);
    topos_params_free(p);
    free_mlp(&m);
  }
}
END_TEST

/* -------------------------------------------------------------- purity */

START_TEST(runs_modify_nothing) {
  mlp m = make_mlp(TOPOS_F32);
  topos_error err = {0};
  topos_params *p = topos_network_parameters(m.net);
  topos_params *p_copy = deep_copy(p);
  topos_params *init_before = topos_network_parameters(m.net);
  topos_params *init_copy = deep_copy(init_before);
  topos_tensor *feed_copy = deep_copy_tensor(m.xin);
  char *desc_before = topos_network_describe(m.net, TOPOS_FORMAT_TEXT, &err);
  ck_assert_ptr_nonnull(desc_before);
  /* the default run, before anything */
  topos_run *r0 = topos_forward(m.net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(r0);
  topos_tensor *default_loss =
      topos_tensor_retain(topos_run_of(r0, m.loss, &err));
  topos_run_free(r0);

  for (int rep = 0; rep < 3; rep++) {
    topos_feed fd = {m.x, m.xin};
    topos_run *run = topos_forward(m.net, p, &fd, 1, NULL, &err);
    ck_assert_ptr_nonnull(run);
    topos_field *g = topos_backward(run, m.loss, NULL, &err);
    ck_assert_ptr_nonnull(g);
    topos_field_free(g);
    topos_run_free(run);
    run = topos_forward(m.net, NULL, NULL, 0, NULL, &err);
    topos_run_free(run);
  }
  ck_assert(topos_params_bitwise_equal(p, p_copy));
  topos_params *init_after = topos_network_parameters(m.net);
  ck_assert(topos_params_bitwise_equal(init_after, init_copy));
  ck_assert(topos_tensor_bitwise_equal(m.xin, feed_copy));
  char *desc_after = topos_network_describe(m.net, TOPOS_FORMAT_TEXT, &err);
  ck_assert_str_eq(desc_after, desc_before);
  r0 = topos_forward(m.net, NULL, NULL, 0, NULL, &err);
  ck_assert(
      topos_tensor_bitwise_equal(topos_run_of(r0, m.loss, &err), default_loss));
  topos_run_free(r0);

  topos_tensor_release(default_loss);
  topos_free(desc_before);
  topos_free(desc_after);
  topos_params_free(init_after);
  topos_params_free(init_before);
  topos_params_free(init_copy);
  topos_params_free(p);
  topos_params_free(p_copy);
  topos_tensor_release(feed_copy);
  free_mlp(&m);
}
END_TEST

/* A run's parameter values are the caller's: a later change of the
 * caller's set (a new set, tensors are immutable) does not reach an
 * earlier run, and freeing the set does not invalidate the run. */
START_TEST(run_holds_its_values) {
  fixture f = make_fixture();
  topos_error err = {0};
  topos_params *p = topos_network_parameters(f.net);
  topos_run *run = topos_forward(f.net, p, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  topos_params_free(p);
  tt_assert_values(topos_run_of(run, f.w, &err), W0, 6);
  expect_same_bits(topos_run_scalar(run, f.loss, &err), ref_loss(W0, B0, X0),
                   "loss after params freed");
  topos_run_free(run);
  topos_network_release(f.net);
}
END_TEST

/* ------------------------------------------------------------ the pool */

START_TEST(pool_recycles_run_buffers) {
  /* big enough values that every buffer comes from the pool */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *a = tt_random(TOPOS_F64, 2, S(64, 64), 1, -1, 1);
  topos_tensor *b = tt_random(TOPOS_F64, 2, S(64, 64), 2, -1, 1);
  topos_value va = topos_parameter(t, a);
  topos_value vb = topos_parameter(t, b);
  topos_value h = topos_tanh(t, topos_matmul(t, va, vb));
  topos_value loss = topos_sum(t, topos_mul(t, h, h));
  topos_tensor_release(a);
  topos_tensor_release(b);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_params *p = topos_network_parameters(net);

  /* warm-up */
  for (int i = 0; i < 2; i++) {
    topos_run *run = topos_forward(net, p, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    topos_field *g = topos_backward(run, loss, NULL, &err);
    ck_assert_ptr_nonnull(g);
    topos_field_free(g);
    topos_run_free(run);
  }
  size_t idle1 = pool_idle_bytes();
  ck_assert_msg(idle1 >= 4 * 64 * 64 * sizeof(double),
                "only %zu bytes idle after freeing runs", idle1);

  topos_run *run = topos_forward(net, p, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  size_t idle_during = pool_idle_bytes();
  ck_assert_msg(
      idle_during < idle1,
      "a run took nothing from the pool (%zu idle before, %zu during)", idle1,
      idle_during);
  topos_field *g = topos_backward(run, loss, NULL, &err);
  ck_assert_ptr_nonnull(g);
  topos_field_free(g);
  topos_run_free(run);
  size_t idle2 = pool_idle_bytes();
  ck_assert_msg(idle2 == idle1, "idle bytes %zu after the first free, %zu now",
                idle1, idle2);

  /* many more runs: still no growth */
  for (int i = 0; i < 10; i++) {
    run = topos_forward(net, p, NULL, 0, NULL, &err);
    g = topos_backward(run, loss, NULL, &err);
    topos_field_free(g);
    topos_run_free(run);
  }
  ck_assert_uint_eq(pool_idle_bytes(), idle1);
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
  topos_params_free(p);
  topos_network_release(net);
}
END_TEST

/* ----------------------------------------------------- batch invariance */

/* y = tanh(x·W + b) for x[n,8]: rows are independent. Returns y's
 * elements (new array, in d's C type). */
static void *row_net(topos_dtype d, int64_t n, const double *x) {
  topos_tape *t = topos_tape_new(d);
  topos_tensor *w = tt_random(d, 2, S(8, 5), 11, -1, 1);
  topos_tensor *b = tt_random(d, 2, S(1, 5), 12, -1, 1);
  topos_tensor *xt = tt_tensor(d, 2, S(n, 8), x);
  topos_value vw = topos_parameter(t, w);
  topos_value vb = topos_parameter(t, b);
  topos_value vx = topos_input(t, xt);
  topos_value y = topos_tanh(t, topos_add(t, topos_matmul(t, vx, vw),
                                          topos_broadcast(t, vb, 2, S(n, 5))));
  topos_tensor_release(w);
  topos_tensor_release(b);
  topos_tensor_release(xt);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  void *out = raw_of(topos_run_of(run, y, &err));
  topos_run_free(run);
  topos_network_release(net);
  return out;
}

START_TEST(batch_invariance) {
  const topos_dtype dts[2] = {TOPOS_F32, TOPOS_F64};
  double row[8];
  uint64_t s = 99;
  for (int i = 0; i < 8; i++) row[i] = tt_uniform(&s, -2, 2);
  for (int k = 0; k < 2; k++) {
    size_t es = topos_dtype_size(dts[k]);
    void *alone = row_net(dts[k], 1, row);
    const int64_t sizes[3] = {2, 17, 64};
    for (int z = 0; z < 3; z++) {
      int64_t n = sizes[z];
      const int64_t pos[3] = {0, n / 2, n - 1};
      for (int q = 0; q < 3; q++) {
        double *x = malloc(sizeof(double) * n * 8);
        for (int64_t i = 0; i < n * 8; i++) x[i] = tt_uniform(&s, -2, 2);
        memcpy(x + pos[q] * 8, row, sizeof row);
        unsigned char *out = row_net(dts[k], n, x);
        ck_assert_msg(memcmp(out + pos[q] * 5 * es, alone, 5 * es) == 0,
                      "%s: row at %lld of a batch of %lld differs from alone",
                      topos_dtype_name(dts[k]), (long long)pos[q],
                      (long long)n);
        free(out);
        free(x);
      }
    }
    free(alone);
  }
}
END_TEST

/* A value too large to hold fails the run with an error, never a crash. */
START_TEST(forward_huge_value_fails_cleanly) {
  const int64_t big[2] = {(int64_t)1 << 31, (int64_t)1 << 31};
  for (int op = 0; op < 3; op++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value b = topos_broadcast(t, topos_scalar(t, 1.0), 2, big);
    topos_value y = op == 0   ? topos_sum(t, b)
                    : op == 1 ? topos_sum(t, topos_exp(t, b))
                              : topos_sum(t, topos_pad(t, b, 0, 1, 0));
    ck_assert(topos_value_ok(y));
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_ptr_nonnull(net);
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_null(run);
    ck_assert_int_ne(err.code, TOPOS_OK);
    ck_assert_msg(strstr(err.message, "node") != NULL, "%s", err.message);
    topos_network_release(net);
  }
}
END_TEST

Suite *interp_suite(void) {
  Suite *s = suite_create("interp");
  TCase *tc = tcase_create("forward");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, forward_uses_initials);
  tcase_add_test(tc, forward_feeds_override_defaults);
  tcase_add_test(tc, forward_feed_view);
  tcase_add_test(tc, forward_bad_feeds);
  tcase_add_test(tc, forward_bad_params);
  tcase_add_test(tc, forward_for_only_ancestors);
  tcase_add_test(tc, run_reading_errors);
  tcase_add_test(tc, run_outlives_network_reference);
  tcase_add_test(tc, run_holds_its_values);
  tcase_add_test(tc, forward_huge_value_fails_cleanly);
  suite_add_tcase(s, tc);

  tc = tcase_create("determinism");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, repeat_runs_bit_identical);
  tcase_add_test(tc, threads_share_one_network);
  tcase_add_test(tc, runs_modify_nothing);
  tcase_add_test(tc, pool_recycles_run_buffers);
  tcase_add_test(tc, batch_invariance);
  suite_add_tcase(s, tc);
  return s;
}
