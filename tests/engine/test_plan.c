/*
 * test_plan.c - plans (engine/plan.c): lowering an entry, dead-node
 * elimination, the keep-set, liveness and free lists, peak bytes, fused
 * convolution and max-pool groups, plan runs and training backward, and
 * the memory bounds of runs (topos_plan_run_bytes), held against what
 * runs take from the buffer pool.
 *
 * The rule every test leans on: a plan run gives the interpreter's bits.
 * So each network is run by topos_forward and by plans (fused, fusion
 * blocked, forward and training postures) and every readable value is
 * compared with topos_tensor_bitwise_equal.  Structural facts (the
 * schedule, the groups, the free lists) are read from internal.h.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "sample_nets.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})
#define MAXV 64

/* ------------------------------------------------------------ helpers */

static topos_value param_rand(topos_tape *t, topos_dtype d, int rank,
                              const int64_t *shape, uint64_t seed, double lo,
                              double hi) {
  topos_tensor *x = tt_random(d, rank, shape, seed, lo, hi);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return p;
}

static topos_value input_rand(topos_tape *t, topos_dtype d, int rank,
                              const int64_t *shape, uint64_t seed, double lo,
                              double hi) {
  topos_tensor *x = tt_random(d, rank, shape, seed, lo, hi);
  topos_value p = topos_input(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return p;
}

static topos_network *seal(topos_tape *t) {
  topos_error err = {0};
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "record: %s", e);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

static topos_plan *lower(const topos_network *net, const topos_value *roots,
                         int nroots, const topos_value *observes, int nobs,
                         topos_posture posture) {
  topos_error err = {0};
  topos_entry e = {roots, nroots,  observes,
                   nobs,  posture, TOPOS_NUMERICS_EXACT};
  topos_plan *p = topos_network_lower(net, &e, &err);
  ck_assert_msg(p != NULL, "lower: %s", err.message);
  return p;
}

static void expect_bits(const topos_tensor *a, const topos_tensor *b,
                        const char *what, int k) {
  ck_assert_msg(a != NULL && b != NULL, "%s: value %d missing", what, k);
  if (topos_tensor_bitwise_equal(a, b)) return;
  double *va = tt_values(a), *vb = tt_values(b);
  int64_t n = topos_tensor_count(a);
  int64_t i = 0;
  if (n == topos_tensor_count(b))
    while (i < n && memcmp(&va[i], &vb[i], sizeof(double)) == 0) i++;
  double x = i < n ? va[i] : 0, y = i < n ? vb[i] : 0;
  free(va);
  free(vb);
  ck_abort_msg("%s: value %d differs at element %lld: %.17g vs %.17g", what, k,
               (long long)i, x, y);
}

/* Runs net with the interpreter and with the plan; every root and observe
 * of the plan must carry the interpreter's bits. */
static void expect_plan_matches(const topos_network *net,
                                const topos_plan *plan,
                                const topos_params *params,
                                const topos_feed *feeds, int nfeeds,
                                const char *what) {
  topos_error err = {0};
  topos_run *ref = topos_forward(net, params, feeds, nfeeds, NULL, &err);
  ck_assert_msg(ref != NULL, "%s: forward: %s", what, err.message);
  topos_run *run = topos_plan_forward(plan, params, feeds, nfeeds, NULL, &err);
  ck_assert_msg(run != NULL, "%s: plan forward: %s", what, err.message);
  for (int k = 0; k < plan->nroots; k++) {
    topos_value v = {net->id, plan->roots[k]};
    expect_bits(topos_run_of(run, v, &err), topos_run_of(ref, v, &err), what,
                k);
  }
  for (int k = 0; k < plan->nobserves; k++) {
    topos_value v = {net->id, plan->observes[k]};
    expect_bits(topos_run_of(run, v, &err), topos_run_of(ref, v, &err), what,
                100 + k);
  }
  topos_run_free(run);
  topos_run_free(ref);
}

/* Every node of `net` with this op, as values. */
static int values_with_op(const topos_network *net, op_code op,
                          topos_value *out, int max) {
  int n = 0;
  for (int i = 0; i < net->n && n < max; i++)
    if (net->nodes[i].op == op) out[n++] = (topos_value){net->id, i};
  return n;
}

static bool in_schedule(const topos_plan *p, int32_t i) {
  for (int s = 0; s < p->nschedule; s++)
    if (p->schedule[s] == i) return true;
  return false;
}

/* Lowers forward plans with fusion offered and with every window chain
 * blocked (each unfold observed), checks both against the interpreter,
 * and returns the fused plan's group count. */
static int check_fused_and_blocked(const topos_network *net,
                                   const topos_value *roots, int nroots,
                                   const topos_feed *feeds, int nfeeds,
                                   const char *what) {
  char buf[128];
  topos_plan *fused = lower(net, roots, nroots, NULL, 0, TOPOS_POSTURE_FORWARD);
  snprintf(buf, sizeof buf, "%s (fused)", what);
  expect_plan_matches(net, fused, NULL, feeds, nfeeds, buf);
  int groups = topos_plan_group_count(fused);
  topos_plan_free(fused);

  topos_value obs[MAXV];
  int nobs = values_with_op(net, OP_UNFOLD, obs, MAXV);
  topos_plan *blocked =
      lower(net, roots, nroots, obs, nobs, TOPOS_POSTURE_FORWARD);
  ck_assert_int_eq(topos_plan_group_count(blocked), 0);
  snprintf(buf, sizeof buf, "%s (blocked)", what);
  expect_plan_matches(net, blocked, NULL, feeds, nfeeds, buf);
  topos_plan_free(blocked);
  return groups;
}

/* ------------------------------------------------------------ networks */

/* makemore-like: embedding of 3 context characters, tanh hidden layer,
 * logits over 27 characters, index cross-entropy. */
typedef struct model {
  topos_network *net;
  topos_value x, y, logits, loss, hidden;
  topos_tensor *xt, *yt; /* feeds */
  topos_feed feeds[2];
  int nfeeds;
} model;

static void model_free(model *m) {
  topos_tensor_release(m->xt);
  topos_tensor_release(m->yt);
  topos_network_release(m->net);
}

static topos_tensor *indices(int rank, const int64_t *shape, int hi,
                             uint64_t seed) {
  topos_tensor *t = tt_random(TOPOS_F64, rank, shape, seed, 0, hi);
  double *v = tt_values(t);
  topos_tensor_release(t);
  for (int64_t i = 0; i < shape_count(rank, shape); i++) v[i] = floor(v[i]);
  topos_tensor *r = tt_tensor(TOPOS_I32, rank, shape, v);
  free(v);
  return r;
}

static model mlp_model(topos_dtype d) {
  model m = {0};
  const int64_t B = 16;
  topos_tape *t = topos_tape_new(d);
  topos_value c = param_rand(t, d, 2, S(27, 10), 1, -1, 1);
  topos_value w1 = param_rand(t, d, 2, S(30, 64), 2, -0.3, 0.3);
  topos_value b1 = param_rand(t, d, 1, S(64), 3, -0.1, 0.1);
  topos_value w2 = param_rand(t, d, 2, S(64, 27), 4, -0.3, 0.3);
  topos_value b2 = param_rand(t, d, 1, S(27), 5, -0.1, 0.1);
  topos_tensor *x0 = topos_tensor_zeros(TOPOS_I32, 2, S(B, 3), NULL);
  topos_tensor *y0 = topos_tensor_zeros(TOPOS_I32, 1, S(B), NULL);
  m.x = topos_input(t, x0);
  m.y = topos_input(t, y0);
  topos_tensor_release(x0);
  topos_tensor_release(y0);
  topos_value emb = topos_reshape(t, topos_embedding(t, c, m.x), 2, S(B, 30));
  m.hidden = topos_tanh(t, topos_linear(t, emb, w1, b1));
  m.logits = topos_linear(t, m.hidden, w2, b2);
  m.loss = topos_cross_entropy(t, m.logits, m.y);
  m.net = seal(t);
  m.xt = indices(2, S(B, 3), 27, 11);
  m.yt = indices(1, S(B), 27, 12);
  m.feeds[0] = (topos_feed){m.x, m.xt};
  m.feeds[1] = (topos_feed){m.y, m.yt};
  m.nfeeds = 2;
  return m;
}

/* LeNet-style: 28x28 input, conv 8 (3x3, pad 1) -> relu -> pool 2 ->
 * conv 16 -> relu -> pool 2 -> linear 10, cross-entropy; batch 4. */
static model cnn_model(topos_dtype d) {
  model m = {0};
  const int64_t B = 4;
  topos_tape *t = topos_tape_new(d);
  topos_value w1 = param_rand(t, d, 4, S(8, 1, 3, 3), 21, -0.5, 0.5);
  topos_value b1 = param_rand(t, d, 1, S(8), 22, -0.1, 0.1);
  topos_value w2 = param_rand(t, d, 4, S(16, 8, 3, 3), 23, -0.2, 0.2);
  topos_value b2 = param_rand(t, d, 1, S(16), 24, -0.1, 0.1);
  topos_value w3 = param_rand(t, d, 2, S(16 * 7 * 7, 10), 25, -0.05, 0.05);
  topos_value b3 = param_rand(t, d, 1, S(10), 26, -0.1, 0.1);
  m.x = input_rand(t, d, 4, S(B, 1, 28, 28), 27, 0, 1);
  topos_tensor *y0 = topos_tensor_zeros(TOPOS_I32, 1, S(B), NULL);
  m.y = topos_input(t, y0);
  topos_tensor_release(y0);
  topos_value h = topos_relu(t, topos_conv2d(t, m.x, w1, b1, 1, 1, 1));
  h = topos_max_pool2d(t, h, 2, 2); /* [B,8,14,14] */
  h = topos_relu(t, topos_conv2d(t, h, w2, b2, 1, 1, 1));
  h = topos_max_pool2d(t, h, 2, 2); /* [B,16,7,7] */
  m.hidden = h;
  h = topos_reshape(t, h, 2, S(B, 16 * 7 * 7));
  m.logits = topos_linear(t, h, w3, b3);
  m.loss = topos_cross_entropy(t, m.logits, m.y);
  m.net = seal(t);
  m.xt = tt_random(d, 4, S(B, 1, 28, 28), 28, -1, 1);
  m.yt = indices(1, S(B), 10, 29);
  m.feeds[0] = (topos_feed){m.x, m.xt};
  m.feeds[1] = (topos_feed){m.y, m.yt};
  m.nfeeds = 2;
  return m;
}

static const topos_dtype float_dtypes[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};

/* ------------------------------------------------- dead nodes, keep-set */

START_TEST(dead_node_elimination) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value p = param_rand(t, TOPOS_F32, 1, S(5), 1, -1, 1); /* 0 */
  topos_value a = topos_exp(t, p);                             /* 1 */
  topos_value dead1 = topos_tanh(t, p);                        /* 2 */
  topos_value c = topos_neg(t, a);                             /* 3 */
  topos_value dead2 = topos_sum(t, dead1);                     /* 4 */
  topos_value q = param_rand(t, TOPOS_F32, 1, S(5), 2, -1, 1); /* 5 */
  topos_value dead3 = topos_mul(t, q, c);                      /* 6 */
  topos_network *net = seal(t);
  topos_plan *plan = lower(net, &c, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  ck_assert_int_eq(plan->nschedule, 3);
  ck_assert(in_schedule(plan, p.index));
  ck_assert(in_schedule(plan, a.index));
  ck_assert(in_schedule(plan, c.index));
  const topos_value dead[4] = {dead1, dead2, q, dead3};
  for (int k = 0; k < 4; k++) {
    ck_assert_msg(!in_schedule(plan, dead[k].index), "dead %d scheduled", k);
    ck_assert(!plan->live[dead[k].index]);
  }
  /* schedule order is increasing node order (operands first) */
  for (int s = 1; s < plan->nschedule; s++)
    ck_assert_int_lt(plan->schedule[s - 1], plan->schedule[s]);
  topos_error err = {0};
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  for (int k = 0; k < 4; k++) {
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(topos_run_of(run, dead[k], &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
    ck_assert_ptr_null(run->vals[dead[k].index]); /* never evaluated */
  }
  expect_plan_matches(net, plan, NULL, NULL, 0, "dead nodes");
  char *text = topos_plan_describe(plan, &err);
  ck_assert_msg(text != NULL, "describe: %s", err.message);
  ck_assert_msg(strstr(text, "3 of 7 nodes live") != NULL, "%s", text);
  ck_assert_msg(strstr(text, "3 scheduled") != NULL, "%s", text);
  ck_assert_msg(strstr(text, "0 fused groups") != NULL, "%s", text);
  char peak[64];
  snprintf(peak, sizeof peak, "peak %zu bytes", topos_plan_peak_bytes(plan));
  ck_assert_msg(strstr(text, peak) != NULL, "%s", text);
  topos_free(text);
  topos_run_free(run);
  topos_plan_free(plan);

  /* an observe that is no ancestor of the roots is live and readable */
  plan = lower(net, &c, 1, &dead2, 1, TOPOS_POSTURE_FORWARD);
  ck_assert_int_eq(plan->nschedule, 5);
  ck_assert(in_schedule(plan, dead1.index));
  expect_plan_matches(net, plan, NULL, NULL, 0, "observe off the roots");
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

START_TEST(keep_set) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_rand(t, TOPOS_F64, 2, S(3, 4), 1, -1, 1);
  topos_value a = topos_exp(t, p);
  topos_value b = topos_tanh(t, a);
  topos_value tr = topos_transpose(t, b); /* a view */
  topos_value c = topos_neg(t, tr);
  /* mul reads both operands: training keeps c and p for backward */
  topos_value loss = topos_sum(t, topos_mul(t, topos_transpose(t, c), p));
  topos_network *net = seal(t);
  topos_error err = {0};
  for (int posture = 0; posture < 2; posture++) {
    topos_plan *plan = lower(net, &loss, 1, &a, 1, (topos_posture)posture);
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    /* roots and observes */
    ck_assert_ptr_nonnull(topos_run_of(run, loss, &err));
    ck_assert_ptr_nonnull(topos_run_of(run, a, &err));
    const topos_value refused[4] = {p, b, tr, c};
    for (int k = 0; k < 4; k++) {
      memset(&err, 0, sizeof err);
      ck_assert_msg(topos_run_of(run, refused[k], &err) == NULL,
                    "posture %d: node %d readable", posture, refused[k].index);
      ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
      ck_assert(err.message[0] != 0);
    }
    if (posture == TOPOS_POSTURE_TRAINING) {
      /* tanh's adjoint reads its output: the buffer survives, and reading
       * it is still an error */
      ck_assert(plan->retain[b.index] && !plan->keep[b.index]);
      ck_assert_ptr_nonnull(run->vals[b.index]);
      /* likewise the parameter that mul reads */
      ck_assert(plan->retain[p.index] && !plan->keep[p.index]);
      ck_assert_ptr_nonnull(run->vals[p.index]);
    } else {
      ck_assert_ptr_null(run->vals[b.index]);
      ck_assert_ptr_null(run->vals[c.index]);
    }
    /* topos_run_scalar goes through the same gate */
    memset(&err, 0, sizeof err);
    ck_assert(isnan(topos_run_scalar(run, p, &err)));
    ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
    ck_assert(!isnan(topos_run_scalar(run, loss, &err)));
    /* invalid and foreign values are argument errors */
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(topos_run_of(run, TOPOS_NONE, &err));
    ck_assert_int_ne(err.code, TOPOS_OK);
    topos_run_free(run);
    topos_plan_free(plan);
  }
  topos_network_release(net);
}
END_TEST

/* -------------------------------------------------- forward plan bits */

START_TEST(forward_mlp) {
  for (int d = 0; d < 3; d++) {
    model m = mlp_model(float_dtypes[d]);
    topos_value roots[3] = {m.loss, m.logits, m.hidden};
    for (int nr = 1; nr <= 3; nr++) {
      topos_plan *plan =
          lower(m.net, roots, nr, NULL, 0, TOPOS_POSTURE_FORWARD);
      expect_plan_matches(m.net, plan, NULL, m.feeds, m.nfeeds, "mlp");
      ck_assert_int_eq(topos_plan_group_count(plan), 0);
      ck_assert_uint_gt(topos_plan_peak_bytes(plan), 0);
      topos_plan_free(plan);
    }
    /* with the network's initials (defaults for the inputs) too */
    topos_plan *plan = lower(m.net, roots, 2, NULL, 0, TOPOS_POSTURE_FORWARD);
    expect_plan_matches(m.net, plan, NULL, NULL, 0, "mlp defaults");
    /* and with other parameters */
    topos_params *ps = topos_network_parameters(m.net);
    topos_tensor *w = tt_random(float_dtypes[d], 2, S(30, 64), 99, -1, 1);
    topos_error err = {0};
    topos_params *ps2 = topos_params_with(ps, 1, w, &err);
    ck_assert_ptr_nonnull(ps2);
    expect_plan_matches(m.net, plan, ps2, m.feeds, m.nfeeds, "mlp params");
    topos_tensor_release(w);
    topos_params_free(ps2);
    topos_params_free(ps);
    topos_plan_free(plan);
    model_free(&m);
  }
}
END_TEST

START_TEST(forward_cnn) {
  for (int d = 0; d < 3; d++) {
    model m = cnn_model(float_dtypes[d]);
    topos_value roots[3] = {m.loss, m.logits, m.hidden};
    int groups = check_fused_and_blocked(m.net, roots, 3, m.feeds, m.nfeeds,
                                         topos_dtype_name(float_dtypes[d]));
    ck_assert_int_eq(groups, 4); /* two convolutions, two pools */
    topos_entry fast = {
        roots, 3, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_FAST};
    topos_error err = {0};
    topos_plan *fp = topos_network_lower(m.net, &fast, &err);
    ck_assert_msg(fp != NULL, "%s", err.message);
    expect_plan_matches(m.net, fp, NULL, m.feeds, m.nfeeds, "cnn fast");
    topos_plan_free(fp);
    model_free(&m);
  }
}
END_TEST

/* conv2d with stride 2, padding 1, dilation 2; pools with stride !=
 * kernel; several geometries, every float dtype. */
START_TEST(forward_conv_pool_geometry) {
  const struct {
    int64_t N, C, H, W, O, kh, kw;
    int stride, pad, dil;
  } convs[] = {
      {2, 3, 11, 10, 4, 3, 2, 2, 1, 2}, {1, 2, 9, 9, 3, 3, 3, 2, 1, 1},
      {2, 1, 8, 7, 2, 2, 3, 1, 0, 2},   {1, 4, 6, 6, 5, 1, 1, 3, 2, 1},
      {3, 2, 5, 5, 2, 5, 5, 1, 0, 1},
  };
  const struct {
    int64_t N, C, H, W;
    int k, s;
  } pools[] = {
      {2, 3, 9, 9, 3, 2}, {1, 2, 7, 8, 2, 1}, {2, 2, 10, 9, 3, 3},
      {1, 1, 5, 5, 1, 2}, {1, 2, 6, 6, 4, 1},
  };
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    for (size_t k = 0; k < sizeof convs / sizeof *convs; k++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value x = param_rand(
          t, dt, 4, S(convs[k].N, convs[k].C, convs[k].H, convs[k].W), k, -1,
          1);
      topos_value w = param_rand(
          t, dt, 4, S(convs[k].O, convs[k].C, convs[k].kh, convs[k].kw), 10 + k,
          -1, 1);
      topos_value b = param_rand(t, dt, 1, S(convs[k].O), 20 + k, -1, 1);
      topos_value y = topos_conv2d(t, x, w, k % 2 ? TOPOS_NONE : b,
                                   convs[k].stride, convs[k].pad, convs[k].dil);
      topos_network *net = seal(t);
      char what[64];
      snprintf(what, sizeof what, "conv %zu %s", k, topos_dtype_name(dt));
      ck_assert_int_eq(check_fused_and_blocked(net, &y, 1, NULL, 0, what), 1);
      topos_network_release(net);
    }
    for (size_t k = 0; k < sizeof pools / sizeof *pools; k++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value x = param_rand(
          t, dt, 4, S(pools[k].N, pools[k].C, pools[k].H, pools[k].W), 30 + k,
          -2, 2);
      topos_value y = topos_max_pool2d(t, x, pools[k].k, pools[k].s);
      topos_network *net = seal(t);
      char what[64];
      snprintf(what, sizeof what, "pool %zu %s", k, topos_dtype_name(dt));
      ck_assert_int_eq(check_fused_and_blocked(net, &y, 1, NULL, 0, what), 1);
      topos_network_release(net);
    }
  }
}
END_TEST

/* ------------------------------------------- structural recognition */

typedef enum variant {
  V_CHAIN,          /* pad H, pad W, unfold 2, unfold 4, permute, reshape,
                       matmul: fuses */
  V_NO_PAD,         /* fuses */
  V_PAD_H_ONLY,     /* fuses */
  V_PAD_W_FIRST,    /* pads in the other order: fuses */
  V_STRIDED,        /* stride 2, dilation 2, asymmetric pads: fuses */
  V_OTHER_PERM,     /* permute [0,4,2,1,3,5]: does not */
  V_EXTRA_CONSUMER, /* the first unfold also feeds a root: does not */
  V_EXTRA_PERMUTE,  /* the permute feeds a second consumer: does not */
  V_OBSERVE_PAD,    /* a pad observed: does not */
  V_OBSERVE_RESHAPE,
  V_OTHER_AXIS,     /* unfold axis 3 then axis 2: does not */
  V_PAD_CHANNEL,    /* a pad on axis 1: does not */
  V_PAD_TWICE,      /* two pads on axis 2: does not */
  V_SPLIT_RESHAPE,  /* reshape [N*oh, ow*C*kh*kw]: does not */
  V_UNFOLD_W_TWICE, /* unfold axis 3, then axis 4 (the window axis) with
                       shapes that still line up: does not */
  V_X_PERMUTED,     /* x is a permuted view (not contiguous): fuses */
  V_X_BROADCAST,    /* x is broadcast over the batch (stride 0): fuses */
  V_W_NARROW,       /* the weight is a narrow of a wider matrix: fuses */
  V_W_TRANSPOSED,   /* the weight is a transpose: fuses */
  V_ASYMMETRIC,     /* steps 2/1 and dilations 1/2 on H/W: fuses */
  V_COUNT
} variant;

static const int variant_groups[V_COUNT] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 1, 1, 1, 1, 1};

typedef struct chain {
  topos_network *net;
  topos_value x; /* the chain's input */
  topos_value roots[2], observes[1];
  int nroots, nobs;
  topos_value loss; /* with chain_with_loss */
} chain;

/* Set by the training tests: hand_conv and hand_pool end with a loss
 * (window_loss) on their first root, kept as ch.loss. */
static bool chain_with_loss;

/* sum(y · c) for a constant c of y's shape with negative entries and
 * zeros: the head's cotangent is c, so the fused adjoints meet both signs
 * and g·0 = -0. */
static topos_value window_loss(topos_tape *t, topos_dtype dt, topos_value y) {
  int rank = 0;
  const int64_t *sp = topos_value_shape(t, y, &rank);
  ck_assert_ptr_nonnull(sp);
  int64_t shape[TOPOS_MAX_RANK];
  memcpy(shape, sp, sizeof(int64_t) * (size_t)rank);
  int64_t n = shape_count(rank, shape);
  double *v = malloc(sizeof(double) * (size_t)n);
  static const double pick[7] = {-1.5, 0.0, 2.0, -0.0, 0.75, -3.0, 1.25};
  for (int64_t i = 0; i < n; i++) v[i] = pick[(i * 5 + i / 7) % 7];
  topos_tensor *ct = tt_tensor(dt, rank, shape, v);
  free(v);
  topos_value c = topos_constant(t, ct);
  topos_tensor_release(ct);
  return topos_sum(t, topos_mul(t, y, c));
}

/* A hand-recorded im2col convolution chain (no topos_conv2d). */
static chain hand_conv(topos_dtype dt, variant v, uint64_t seed) {
  chain ch = {0};
  const int64_t N = 2, C = 3, H = 7, W = 6, O = 4;
  int64_t kh = 3, kw = 2, st = 1, dil = 1;
  int64_t pt = 1, pb = 1, pl = 1, pr = 1;
  if (v == V_STRIDED) {
    st = 2;
    dil = 2;
    pt = 2;
    pb = 1;
    pl = 0;
    pr = 3;
  }
  if (v == V_NO_PAD || v == V_UNFOLD_W_TWICE) pt = pb = pl = pr = 0;
  if (v == V_PAD_H_ONLY) pl = pr = 0;
  topos_tape *t = topos_tape_new(dt);
  if (v == V_UNFOLD_W_TWICE) {
    /* x[N,C,H,5] -> unfold(3, 3) [N,C,H,3,3] -> unfold(4, 2)
     * [N,C,H,3,2,2] -> permute [N,H,2,C,3,2] -> reshape [N*H*2, C*3*2]:
     * the rows and columns a conv with kh = 3, kw = 2, oh = H, ow = 2
     * would have, but not a convolution */
    topos_value x = param_rand(t, dt, 4, S(N, C, H, 5), seed, -1, 1);
    ch.x = x;
    topos_value u = topos_unfold(t, topos_unfold(t, x, 3, 3, 1, 1), 4, 2, 1, 1);
    topos_value pm = topos_permute(t, u, (const int[]){0, 2, 4, 1, 3, 5});
    topos_value r = topos_reshape(t, pm, 2, S(N * H * 2, C * 3 * 2));
    topos_value w = param_rand(t, dt, 2, S(C * 3 * 2, O), seed + 1, -1, 1);
    ch.roots[ch.nroots++] = topos_matmul(t, r, w);
    ch.net = seal(t);
    return ch;
  }
  topos_value x = param_rand(t, dt, 4, S(N, C, H, W), seed, -1, 1);
  if (v == V_X_PERMUTED) {
    topos_value q = param_rand(t, dt, 4, S(C, W, N, H), seed + 5, -1, 1);
    x = topos_permute(t, q, (const int[]){2, 0, 3, 1});
  } else if (v == V_X_BROADCAST) {
    topos_value q = param_rand(t, dt, 4, S(1, C, H, W), seed + 5, -1, 1);
    x = topos_broadcast(t, q, 4, S(N, C, H, W));
  }
  ch.x = x;
  topos_value p = x, pad_node = TOPOS_NONE;
  if (v == V_PAD_W_FIRST) {
    p = topos_pad(t, p, 3, pl, pr);
    pad_node = p;
    p = topos_pad(t, p, 2, pt, pb);
  } else if (v == V_PAD_CHANNEL) {
    p = topos_pad(t, p, 2, pt, pb);
    p = topos_pad(t, p, 1, 0, 0);
    p = topos_pad(t, p, 3, pl, pr);
  } else if (v == V_PAD_TWICE) {
    p = topos_pad(t, p, 2, pt, 0);
    p = topos_pad(t, p, 2, 0, pb);
    p = topos_pad(t, p, 3, pl, pr);
  } else {
    if (pt || pb) p = pad_node = topos_pad(t, p, 2, pt, pb);
    if (pl || pr) p = topos_pad(t, p, 3, pl, pr);
  }
  int64_t sh = st, sw = st, dh = dil, dw = dil;
  if (v == V_ASYMMETRIC) {
    kh = 2;
    kw = 3;
    sh = 2;
    dw = 2;
  }
  const int64_t Hp = H + pt + pb, Wp = W + pl + pr;
  const int64_t oh = (Hp - ((kh - 1) * dh + 1)) / sh + 1;
  const int64_t ow = (Wp - ((kw - 1) * dw + 1)) / sw + 1;
  topos_value u1, u;
  if (v == V_OTHER_AXIS) {
    u1 = topos_unfold(t, p, 3, kw, sw, dw); /* [N,C,Hp,ow,kw] */
    u = topos_unfold(t, u1, 2, kh, sh, dh); /* [N,C,oh,kh,ow,kw] */
  } else {
    u1 = topos_unfold(t, p, 2, kh, sh, dh); /* [N,C,oh,kh,Wp] */
    u = topos_unfold(t, u1, 4, kw, sw, dw); /* [N,C,oh,kh,ow,kw] */
  }
  static const int perm[6] = {0, 2, 4, 1, 3, 5};
  static const int other[6] = {0, 4, 2, 1, 3, 5};
  topos_value pm = topos_permute(t, u, v == V_OTHER_PERM ? other : perm);
  topos_value r, w;
  if (v == V_SPLIT_RESHAPE) {
    r = topos_reshape(t, pm, 2, S(N * oh, ow * C * kh * kw));
    w = param_rand(t, dt, 2, S(ow * C * kh * kw, O), seed + 1, -1, 1);
  } else if (v == V_W_NARROW) {
    r = topos_reshape(t, pm, 2, S(N * oh * ow, C * kh * kw));
    w = param_rand(t, dt, 2, S(C * kh * kw, O + 3), seed + 1, -1, 1);
    w = topos_narrow(t, w, 1, 2, O);
  } else if (v == V_W_TRANSPOSED) {
    r = topos_reshape(t, pm, 2, S(N * oh * ow, C * kh * kw));
    w = param_rand(t, dt, 2, S(O, C * kh * kw), seed + 1, -1, 1);
    w = topos_transpose(t, w);
  } else {
    r = topos_reshape(t, pm, 2, S(N * oh * ow, C * kh * kw));
    w = param_rand(t, dt, 2, S(C * kh * kw, O), seed + 1, -1, 1);
  }
  topos_value y = topos_matmul(t, r, w);
  ch.roots[ch.nroots++] = y;
  if (v == V_EXTRA_CONSUMER) ch.roots[ch.nroots++] = topos_sum(t, u1);
  if (v == V_EXTRA_PERMUTE)
    ch.roots[ch.nroots++] =
        topos_sum(t, topos_reshape(t, pm, 1, S(N * oh * ow * C * kh * kw)));
  if (v == V_OBSERVE_PAD) ch.observes[ch.nobs++] = pad_node;
  if (v == V_OBSERVE_RESHAPE) ch.observes[ch.nobs++] = r;
  if (chain_with_loss) ch.loss = window_loss(t, dt, y);
  ch.net = seal(t);
  return ch;
}

START_TEST(structural_conv) {
  for (int d = 0; d < 3; d++) {
    for (int v = 0; v < V_COUNT; v++) {
      chain ch = hand_conv(float_dtypes[d], (variant)v, 7 + (uint64_t)v);
      topos_plan *plan = lower(ch.net, ch.roots, ch.nroots, ch.observes,
                               ch.nobs, TOPOS_POSTURE_FORWARD);
      char what[64];
      snprintf(what, sizeof what, "hand conv variant %d %s", v,
               topos_dtype_name(float_dtypes[d]));
      ck_assert_msg(topos_plan_group_count(plan) == variant_groups[v],
                    "%s: %d groups", what, topos_plan_group_count(plan));
      if (variant_groups[v]) {
        const plan_group *g = &plan->groups[0];
        ck_assert_int_eq(g->kind, GROUP_CONV);
        ck_assert_int_eq(g->head, ch.roots[0].index);
        ck_assert_int_eq(g->x, ch.x.index);
        /* interior nodes are neither scheduled nor evaluated */
        for (int k = 0; k < g->nmembers; k++) {
          ck_assert(!in_schedule(plan, g->members[k]));
          ck_assert_int_eq(plan->group_of[g->members[k]], 0);
        }
        ck_assert(in_schedule(plan, g->head));
        topos_error err = {0};
        topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
        ck_assert_ptr_nonnull(run);
        for (int k = 0; k < g->nmembers; k++)
          ck_assert_ptr_null(run->vals[g->members[k]]);
        topos_run_free(run);
      }
      expect_plan_matches(ch.net, plan, NULL, NULL, 0, what);
      topos_plan_free(plan);
      topos_network_release(ch.net);
    }
  }
}
END_TEST

/* A hand-recorded max-pool chain; near misses do not fuse. */
typedef enum pool_variant {
  P_CHAIN,     /* fuses */
  P_PADDED,    /* pads first, window reads zeros: fuses */
  P_SUM,       /* sum_along instead of max_along: does not */
  P_FLAT4,     /* reshape [N,C,oh*ow,k*k], max_along 3: does not */
  P_OBSERVE,   /* the permute observed: does not */
  P_CONV_PERM, /* the conv permutation: does not */
  P_DILATED,   /* dilation 2, different steps on H and W: fuses */
  P_COUNT
} pool_variant;

static const int pool_groups[P_COUNT] = {1, 1, 0, 0, 0, 0, 1};

static chain hand_pool(topos_dtype dt, pool_variant v, uint64_t seed) {
  chain ch = {0};
  const int64_t N = 2, C = 3, H = 8, W = 7, k = 3, st = 2;
  topos_tape *t = topos_tape_new(dt);
  topos_value x = param_rand(t, dt, 4, S(N, C, H, W), seed, -2, 2);
  topos_value p = x;
  int64_t Hp = H, Wp = W;
  if (v == P_PADDED) {
    p = topos_pad(t, topos_pad(t, p, 2, 1, 0), 3, 2, 1);
    Hp += 1;
    Wp += 3;
  }
  int64_t sh = st, sw = st, dil = v == P_DILATED ? 2 : 1;
  if (v == P_DILATED) sw = 1;
  int64_t span = (k - 1) * dil + 1;
  int64_t oh = (Hp - span) / sh + 1, ow = (Wp - span) / sw + 1;
  topos_value u = topos_unfold(t, p, 2, k, sh, dil);
  u = topos_unfold(t, u, 4, k, sw, dil);
  static const int perm[6] = {0, 1, 2, 4, 3, 5};
  static const int conv_perm[6] = {0, 2, 4, 1, 3, 5};
  topos_value pm = topos_permute(t, u, v == P_CONV_PERM ? conv_perm : perm);
  topos_value y;
  if (v == P_FLAT4) {
    y = topos_max_along(t, topos_reshape(t, pm, 4, S(N, C, oh * ow, k * k)), 3);
  } else if (v == P_CONV_PERM) {
    y = topos_max_along(t, topos_reshape(t, pm, 5, S(N, oh, ow, C, k * k)), 4);
  } else {
    topos_value r = topos_reshape(t, pm, 5, S(N, C, oh, ow, k * k));
    y = v == P_SUM ? topos_sum_along(t, r, 4) : topos_max_along(t, r, 4);
  }
  ch.roots[ch.nroots++] = y;
  if (v == P_OBSERVE) ch.observes[ch.nobs++] = pm;
  if (chain_with_loss) ch.loss = window_loss(t, dt, y);
  ch.net = seal(t);
  return ch;
}

START_TEST(structural_pool) {
  for (int d = 0; d < 3; d++) {
    for (int v = 0; v < P_COUNT; v++) {
      chain ch = hand_pool(float_dtypes[d], (pool_variant)v, 3 + (uint64_t)v);
      topos_plan *plan = lower(ch.net, ch.roots, ch.nroots, ch.observes,
                               ch.nobs, TOPOS_POSTURE_FORWARD);
      char what[64];
      snprintf(what, sizeof what, "hand pool variant %d %s", v,
               topos_dtype_name(float_dtypes[d]));
      ck_assert_msg(topos_plan_group_count(plan) == pool_groups[v],
                    "%s: %d groups", what, topos_plan_group_count(plan));
      if (pool_groups[v]) ck_assert_int_eq(plan->groups[0].kind, GROUP_POOL);
      expect_plan_matches(ch.net, plan, NULL, NULL, 0, what);
      topos_plan_free(plan);
      topos_network_release(ch.net);
    }
  }
}
END_TEST

/* Two convolutions and a pool over one input, two convolutions sharing
 * a filter: every chain fuses, and x lives until the last group. */
START_TEST(groups_share_inputs) {
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value x = param_rand(t, dt, 4, S(2, 3, 8, 8), 1, -1, 1);
    topos_value w1 = param_rand(t, dt, 4, S(4, 3, 3, 3), 2, -1, 1);
    topos_value w2 = param_rand(t, dt, 4, S(2, 3, 1, 1), 3, -1, 1);
    topos_value a = topos_conv2d(t, x, w1, TOPOS_NONE, 1, 1, 1);
    topos_value b = topos_conv2d(t, x, w2, TOPOS_NONE, 2, 0, 1);
    topos_value c = topos_max_pool2d(t, x, 2, 2);
    topos_value e = topos_conv2d(t, topos_exp(t, x), w1, TOPOS_NONE, 1, 0, 1);
    topos_value roots[4] = {a, b, c, e};
    topos_network *net = seal(t);
    char what[32];
    snprintf(what, sizeof what, "shared %s", topos_dtype_name(dt));
    ck_assert_int_eq(check_fused_and_blocked(net, roots, 4, NULL, 0, what), 4);
    topos_network_release(net);
  }
}
END_TEST

/* In a training plan every window chain fuses - off the loss's path, and
 * on it with its adjoint fused - and the loss's gradient is still the
 * interpreter's. */
START_TEST(training_fuses_off_the_loss) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = param_rand(t, TOPOS_F32, 4, S(2, 2, 6, 6), 1, -1, 1);
  topos_value w = param_rand(t, TOPOS_F32, 4, S(3, 2, 3, 3), 2, -1, 1);
  topos_value side =
      topos_max_pool2d(t, topos_conv2d(t, x, w, TOPOS_NONE, 1, 1, 1), 2, 2);
  topos_value onpath = topos_conv2d(t, x, w, TOPOS_NONE, 1, 0, 1);
  topos_value loss = topos_sum(t, topos_tanh(t, onpath));
  topos_network *net = seal(t);
  topos_value roots[2] = {loss, side};
  topos_plan *plan = lower(net, roots, 2, NULL, 0, TOPOS_POSTURE_TRAINING);
  /* the side conv and pool, and the conv on the loss's path, whose
   * adjoint runs fused */
  ck_assert_int_eq(topos_plan_group_count(plan), 3);
  for (int g = 0; g < plan->ngroups; g++) ck_assert(plan->groups[g].fused_grad);
  expect_plan_matches(net, plan, NULL, NULL, 0, "training with groups");
  topos_error err = {0};
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  topos_field *pf = topos_plan_backward(plan, run, NULL, &err);
  ck_assert_msg(pf != NULL, "%s", err.message);
  topos_run *ref = topos_forward(net, NULL, NULL, 0, NULL, &err);
  topos_field *rf = topos_backward(ref, loss, NULL, &err);
  ck_assert_ptr_nonnull(rf);
  for (int i = 0; i < net->n; i++) {
    topos_value v = {net->id, i};
    expect_bits(topos_field_of(pf, v, &err), topos_field_of(rf, v, &err),
                "training with groups", i);
  }
  topos_field_free(rf);
  topos_run_free(ref);
  topos_field_free(pf);
  topos_run_free(run);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* A kept interior value of topos_conv2d's own chain blocks its group,
 * whichever interior node it is; the other groups stay. */
START_TEST(kept_interior_blocks) {
  model m = cnn_model(TOPOS_F32);
  topos_plan *full = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  ck_assert_int_eq(topos_plan_group_count(full), 4);
  for (int g = 0; g < 4; g++) {
    const plan_group grp = full->groups[g];
    for (int k = 0; k < grp.nmembers; k++) {
      topos_value obs = {m.net->id, grp.members[k]};
      topos_plan *p = lower(m.net, &m.loss, 1, &obs, 1, TOPOS_POSTURE_FORWARD);
      ck_assert_int_eq(topos_plan_group_count(p), 3);
      for (int j = 0; j < p->ngroups; j++)
        ck_assert_int_ne(p->groups[j].head, grp.head);
      expect_plan_matches(m.net, p, NULL, m.feeds, m.nfeeds, "kept interior");
      topos_plan_free(p);
      /* the same value as a root */
      topos_value roots[2] = {m.loss, obs};
      p = lower(m.net, roots, 2, NULL, 0, TOPOS_POSTURE_FORWARD);
      ck_assert_int_eq(topos_plan_group_count(p), 3);
      topos_plan_free(p);
    }
  }
  /* describe names the groups */
  topos_error err = {0};
  char *text = topos_plan_describe(full, &err);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "4 fused groups"));
  ck_assert_ptr_nonnull(strstr(text, "fused-conv"));
  ck_assert_ptr_nonnull(strstr(text, "fused-pool"));
  ck_assert_ptr_nonnull(strstr(text, "group 3:"));
  topos_free(text);
  topos_plan_free(full);
  model_free(&m);
}
END_TEST

/* ---------------------------------------------- NaN, -0 and ties */

static topos_tensor *tensor_f(topos_dtype dt, int rank, const int64_t *shape,
                              const double *v) {
  return tt_tensor(dt, rank, shape, v);
}

static bool has_negative_zero(const topos_tensor *t) {
  double *v = tt_values(t);
  bool found = false;
  for (int64_t i = 0; i < topos_tensor_count(t); i++)
    found |= v[i] == 0 && signbit(v[i]);
  free(v);
  return found;
}

/* Fused vs blocked vs interpreter for a conv net on given x and w. */
static void conv_edge(topos_dtype dt, const topos_tensor *xt,
                      const topos_tensor *wt, int stride, int pad, int dil,
                      bool want_neg_zero, const char *what) {
  topos_tape *t = topos_tape_new(dt);
  topos_value x = topos_parameter(t, xt);
  topos_value w = topos_parameter(t, wt);
  topos_value y = topos_conv2d(t, x, w, TOPOS_NONE, stride, pad, dil);
  topos_network *net = seal(t);
  ck_assert_int_eq(check_fused_and_blocked(net, &y, 1, NULL, 0, what), 1);
  if (want_neg_zero && tt_fma_rounds_once(dt)) {
    topos_error err = {0};
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert(has_negative_zero(topos_run_of(run, y, &err)));
    topos_run_free(run);
  }
  topos_network_release(net);
}

START_TEST(fused_conv_signed_zero_nan) {
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    /* products far below the smallest subnormal: each fma rounds to -0,
     * so interior accumulators stay -0 while the padding's 0·w turns a
     * border accumulator into +0 */
    double tiny = dt == TOPOS_F64 ? 1e-200 : 1e-30;
    double xv[2 * 4 * 4], wv[3 * 2 * 2 * 2];
    for (int i = 0; i < 32; i++) xv[i] = i % 5 == 0 ? -0.0 : tiny;
    for (int i = 0; i < 24; i++) wv[i] = i % 7 == 3 ? 0.0 : -tiny;
    topos_tensor *xt = tensor_f(dt, 4, S(1, 2, 4, 4), xv);
    topos_tensor *wt = tensor_f(dt, 4, S(3, 2, 2, 2), wv);
    conv_edge(dt, xt, wt, 1, 1, 1, true, "tiny, padded");
    conv_edge(dt, xt, wt, 1, 0, 1, true, "tiny, unpadded");
    conv_edge(dt, xt, wt, 2, 1, 2, false, "tiny, strided");
    topos_tensor_release(xt);
    topos_tensor_release(wt);

    /* exact zero products: a filter of -0 over positive x gives -0
     * products only, which an accumulator started at +0 absorbs to +0;
     * a filter of +0, and a mixed one, over signed zeros */
    for (int i = 0; i < 32; i++) {
      static const double pick[4] = {-0.0, 0.0, 1.5, -2.0};
      xv[i] = i < 16 ? (i % 2 ? 1.5 : 0.25) : pick[i % 4];
    }
    for (int i = 0; i < 24; i++)
      wv[i] = i < 8 ? -0.0 : i < 16 ? 0.0 : (i % 2 ? -tiny : 0.5);
    xt = tensor_f(dt, 4, S(2, 2, 2, 4), xv);
    wt = tensor_f(dt, 4, S(3, 2, 2, 2), wv);
    conv_edge(dt, xt, wt, 1, 0, 1, false, "zeros, unpadded");
    conv_edge(dt, xt, wt, 1, 1, 1, false, "zeros, padded");
    conv_edge(dt, xt, wt, 2, 1, 1, false, "zeros, strided");
    topos_tensor_release(xt);
    topos_tensor_release(wt);

    /* NaN and infinities: 0·inf from the padding makes NaN too */
    for (int i = 0; i < 32; i++) {
      static const double pick[8] = {1.5, -0.0, 0.0, -2.25, 1e-3, 3, -1, 0.5};
      xv[i] = pick[(i * 3) % 8];
    }
    xv[5] = NAN;
    xv[18] = INFINITY;
    xv[27] = -INFINITY;
    xv[31] = -NAN;
    for (int i = 0; i < 24; i++) wv[i] = (i % 3 == 0 ? -0.5 : 0.25) * (i + 1);
    wv[4] = INFINITY;
    wv[10] = -0.0;
    wv[17] = NAN;
    xt = tensor_f(dt, 4, S(1, 2, 4, 4), xv);
    wt = tensor_f(dt, 4, S(3, 2, 2, 2), wv);
    conv_edge(dt, xt, wt, 1, 1, 1, false, "nan, padded");
    conv_edge(dt, xt, wt, 1, 0, 1, false, "nan, unpadded");
    conv_edge(dt, xt, wt, 2, 2, 1, false, "nan, strided");
    topos_tensor_release(xt);
    topos_tensor_release(wt);
  }
}
END_TEST

START_TEST(fused_pool_nan_ties) {
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    double xv[2 * 6 * 6];
    for (int i = 0; i < 72; i++) {
      static const double pick[6] = {1, 1, -0.0, 0.0, -3, 2};
      xv[i] = pick[i % 6];
    }
    xv[3] = NAN;
    xv[14] = NAN;
    xv[15] = -NAN;
    xv[40] = INFINITY;
    xv[41] = -INFINITY;
    xv[50] = -0.0;
    xv[51] = 0.0;
    /* one channel all -0 / +0 ties and negatives */
    for (int i = 36; i < 48; i++) xv[i] = i % 2 ? 0.0 : -0.0;
    for (int i = 60; i < 72; i++) xv[i] = -1 - (i % 3);
    topos_tensor *xt = tensor_f(dt, 4, S(1, 2, 6, 6), xv);
    const int ks[][2] = {{2, 2}, {3, 2}, {2, 1}, {3, 3}, {4, 1}};
    for (int k = 0; k < 5; k++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value x = topos_parameter(t, xt);
      topos_value y = topos_max_pool2d(t, x, ks[k][0], ks[k][1]);
      topos_network *net = seal(t);
      char what[64];
      snprintf(what, sizeof what, "pool k%d s%d %s", ks[k][0], ks[k][1],
               topos_dtype_name(dt));
      ck_assert_int_eq(check_fused_and_blocked(net, &y, 1, NULL, 0, what), 1);
      topos_network_release(net);
    }
    /* padded hand chain over all-negative values: the zeros win */
    for (int v = 0; v < 2; v++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value x = topos_parameter(t, xt);
      topos_value p = topos_pad(t, topos_pad(t, x, 2, 1, 1), 3, 1, 1);
      topos_value u =
          topos_unfold(t, topos_unfold(t, p, 2, 3, 2, 1), 4, 3, 2, 1);
      topos_value pm = topos_permute(t, u, (const int[]){0, 1, 2, 4, 3, 5});
      topos_value y =
          topos_max_along(t, topos_reshape(t, pm, 5, S(1, 2, 3, 3, 9)), 4);
      topos_network *net = seal(t);
      ck_assert_int_eq(
          check_fused_and_blocked(net, &y, 1, NULL, 0, "padded pool edge"), 1);
      topos_network_release(net);
    }
    topos_tensor_release(xt);
  }
}
END_TEST

/* ------------------------------------------------------------ liveness */

/* loss = sum(tanh^N(x)) over x[1000] f32. */
static topos_network *tanh_chain(int N, topos_value *loss, topos_value *mid) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value y = param_rand(t, TOPOS_F32, 1, S(1000), 1, -1, 1);
  for (int i = 0; i < N; i++) {
    y = topos_tanh(t, y);
    if (mid) mid[i] = y;
  }
  *loss = topos_sum(t, y);
  return seal(t);
}

START_TEST(liveness_peak_bytes) {
  const int N = 40;
  topos_value loss, mid[40];
  topos_network *net = tanh_chain(N, &loss, mid);
  topos_plan *fwd = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  topos_plan *trn = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  size_t pf = topos_plan_peak_bytes(fwd), pt = topos_plan_peak_bytes(trn);
  ck_assert_uint_gt(pf, 0);
  /* two [1000] f32 buffers at a time (operand and result), plus the loss */
  ck_assert_msg(pf <= 3 * 4000, "forward peak %zu", pf);
  /* exactly: a tanh's operand and result are both alive at its step */
  ck_assert_uint_eq(pf, 2 * 4000);
  ck_assert_msg(pf < (size_t)N * 4000 / 4, "forward peak %zu", pf);
  /* training keeps every tanh output for backward */
  ck_assert_msg(pt > pf, "training peak %zu, forward %zu", pt, pf);
  ck_assert_msg(pt >= (size_t)N * 4000, "training peak %zu", pt);
  ck_assert_uint_eq(pt, (size_t)N * 4000 + 4); /* and the f32 loss */
  ck_assert_uint_eq(topos_plan_peak_bytes(NULL), 0);

  /* the run frees what it said it would: no interior value survives */
  topos_error err = {0};
  topos_run *run = topos_plan_forward(fwd, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  for (int i = 0; i < N; i++) ck_assert_ptr_null(run->vals[mid[i].index]);
  topos_run_free(run);
  run = topos_plan_forward(trn, NULL, NULL, 0, NULL, &err);
  for (int i = 0; i < N; i++) ck_assert_ptr_nonnull(run->vals[mid[i].index]);
  topos_run_free(run);
  expect_plan_matches(net, fwd, NULL, NULL, 0, "tanh chain forward");
  expect_plan_matches(net, trn, NULL, NULL, 0, "tanh chain training");
  topos_plan_free(fwd);
  topos_plan_free(trn);
  topos_network_release(net);
}
END_TEST

/* Observes along the chain: the free lists never free a kept value. */
START_TEST(liveness_keeps_observes) {
  const int N = 30;
  topos_value loss, mid[30];
  topos_network *net = tanh_chain(N, &loss, mid);
  topos_value obs[6] = {mid[0], mid[5], mid[11], mid[17], mid[29], mid[5]};
  topos_value roots[2] = {loss, mid[20]};
  for (int posture = 0; posture < 2; posture++) {
    topos_plan *plan = lower(net, roots, 2, obs, 6, (topos_posture)posture);
    for (int s = 0; s < plan->nschedule; s++)
      for (int k = plan->free_start[s]; k < plan->free_start[s + 1]; k++) {
        int32_t v = plan->free_after[k];
        ck_assert_msg(!plan->keep[v] && !plan->retain[v],
                      "step %d frees kept node %d", s, v);
        /* freed no earlier than its last use */
        ck_assert_int_ge(s, plan->last_use[v]);
      }
    expect_plan_matches(net, plan, NULL, NULL, 0, "observed chain");
    topos_plan *bigger = lower(net, roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
    if (posture == TOPOS_POSTURE_FORWARD)
      ck_assert_uint_gt(topos_plan_peak_bytes(plan),
                        topos_plan_peak_bytes(bigger));
    topos_plan_free(bigger);
    topos_plan_free(plan);
  }
  topos_network_release(net);
}
END_TEST

/* Views (transpose, narrow, broadcast, reshape) keep their buffer alive
 * after the value they view is freed. */
START_TEST(liveness_views) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x = param_rand(t, TOPOS_F64, 2, S(20, 30), 1, -1, 1);
  topos_value e = topos_exp(t, x);
  topos_value tr = topos_transpose(t, e);         /* [30,20] view */
  topos_value nr = topos_narrow(t, tr, 0, 5, 10); /* [10,20] view */
  topos_value a = topos_tanh(t, x);               /* e's buffer still viewed */
  topos_value b = topos_add(
      t, topos_reshape(t, nr, 2, S(20, 10)),
      topos_narrow(t, topos_narrow(t, topos_transpose(t, a), 0, 0, 20), 1, 0,
                   10));
  topos_value u = topos_unfold(t, b, 1, 3, 2, 1); /* [20,4,3] view */
  topos_value sum = topos_sum(t, topos_mul(t, u, u));
  topos_value bc = topos_broadcast(t, sum, 2, S(3, 3));
  topos_value loss = topos_sum(t, topos_mul(t, bc, bc));
  topos_network *net = seal(t);
  for (int posture = 0; posture < 2; posture++) {
    topos_plan *plan = lower(net, &loss, 1, NULL, 0, (topos_posture)posture);
    expect_plan_matches(net, plan, NULL, NULL, 0, "views");
    topos_plan_free(plan);
    topos_value roots[2] = {loss, nr};
    plan = lower(net, roots, 2, &u, 1, (topos_posture)posture);
    expect_plan_matches(net, plan, NULL, NULL, 0, "views kept");
    topos_plan_free(plan);
  }
  topos_network_release(net);
}
END_TEST

/* Peak bytes count owning buffers only: a contiguous reshape and a
 * transpose are views; a reshape of the transpose is a copy. */
START_TEST(peak_bytes_views) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = param_rand(t, TOPOS_F32, 1, S(100), 1, -1, 1);
  topos_value e = topos_exp(t, x);                    /* 400 bytes */
  topos_value sq = topos_reshape(t, e, 2, S(10, 10)); /* view */
  topos_value tr = topos_transpose(t, sq);            /* view */
  topos_value flat = topos_reshape(t, tr, 1, S(100)); /* copy: 400 */
  topos_value n = topos_neg(t, flat);                 /* 400 */
  topos_network *net = seal(t);
  topos_plan *plan = lower(net, &n, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  /* e lives until flat copies it; flat until n is made */
  ck_assert_uint_eq(topos_plan_peak_bytes(plan), 800);
  expect_plan_matches(net, plan, NULL, NULL, 0, "view peak");
  topos_plan_free(plan);
  /* observing the transpose keeps e's buffer to the end */
  plan = lower(net, &n, 1, &tr, 1, TOPOS_POSTURE_FORWARD);
  ck_assert_uint_eq(topos_plan_peak_bytes(plan), 1200);
  expect_plan_matches(net, plan, NULL, NULL, 0, "view peak kept");
  topos_plan_free(plan);
  /* a plan of leaves only owns nothing */
  plan = lower(net, &x, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  ck_assert_uint_eq(topos_plan_peak_bytes(plan), 0);
  ck_assert_int_eq(plan->nschedule, 1);
  expect_plan_matches(net, plan, NULL, NULL, 0, "leaf root");
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------- training */

static void expect_same_fields(const topos_network *net, const topos_field *a,
                               const topos_field *b, const char *what) {
  topos_error err = {0};
  for (int i = 0; i < net->n; i++) {
    topos_value v = {net->id, i};
    expect_bits(topos_field_of(a, v, &err), topos_field_of(b, v, &err), what,
                i);
  }
}

static void training_matches(model *m, const char *what) {
  topos_error err = {0};
  topos_value roots[2] = {m->loss, m->logits};
  for (int nr = 1; nr <= 2; nr++) {
    topos_plan *plan =
        lower(m->net, roots, nr, NULL, 0, TOPOS_POSTURE_TRAINING);
    topos_run *run =
        topos_plan_forward(plan, NULL, m->feeds, m->nfeeds, NULL, &err);
    ck_assert_msg(run != NULL, "%s: plan forward: %s", what, err.message);
    topos_field *pf = topos_plan_backward(plan, run, NULL, &err);
    ck_assert_msg(pf != NULL, "%s: plan backward: %s", what, err.message);
    topos_run *ref =
        topos_forward(m->net, NULL, m->feeds, m->nfeeds, NULL, &err);
    ck_assert_ptr_nonnull(ref);
    topos_field *rf = topos_backward(ref, m->loss, NULL, &err);
    ck_assert_ptr_nonnull(rf);
    expect_same_fields(m->net, pf, rf, what);
    /* topos_backward on a training plan's run works and agrees */
    topos_field *bf = topos_backward(run, m->loss, NULL, &err);
    ck_assert_msg(bf != NULL, "%s: backward on plan run: %s", what,
                  err.message);
    expect_same_fields(m->net, bf, rf, what);
    /* parameters_of the plan's field = the interpreter's */
    topos_params *pg = topos_parameters_of(pf, &err);
    topos_params *rg = topos_parameters_of(rf, &err);
    ck_assert(topos_params_bitwise_equal(pg, rg));
    topos_params_free(pg);
    topos_params_free(rg);
    expect_plan_matches(m->net, plan, NULL, m->feeds, m->nfeeds, what);
    topos_field_free(bf);
    topos_field_free(rf);
    topos_run_free(ref);
    topos_field_free(pf);
    topos_run_free(run);
    topos_plan_free(plan);
  }
}

START_TEST(training_mlp_cnn) {
  for (int d = 0; d < 3; d++) {
    model m = mlp_model(float_dtypes[d]);
    training_matches(&m, "mlp training");
    model_free(&m);
    m = cnn_model(float_dtypes[d]);
    training_matches(&m, "cnn training");
    model_free(&m);
  }
}
END_TEST

/* A training plan's fused window adjoints against the interpreter: the
 * parameters' gradients (the fused path, topos_plan_gradients) and the
 * full field (the unfused adjoints on recomputed interiors), bit for bit.
 * Returns the number of groups whose adjoint ran fused. */
static int expect_fused_training(const topos_network *net, topos_value loss,
                                 const topos_feed *feeds, int nfeeds,
                                 const char *what) {
  topos_error err = {0};
  topos_plan *plan = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  int fused = 0;
  for (int g = 0; g < plan->ngroups; g++) {
    const plan_group *grp = &plan->groups[g];
    if (!grp->fused_grad) continue;
    fused++;
    /* the interior is neither kept nor evaluated */
    for (int k = 0; k < grp->nmembers; k++)
      ck_assert(!plan->retain[grp->members[k]]);
  }
  topos_run *ref = topos_forward(net, NULL, feeds, nfeeds, NULL, &err);
  ck_assert_msg(ref != NULL, "%s: %s", what, err.message);
  topos_params *rg = topos_gradients(ref, loss, NULL, &err);
  ck_assert_msg(rg != NULL, "%s: %s", what, err.message);
  topos_field *rf = topos_backward(ref, loss, NULL, &err);
  ck_assert_msg(rf != NULL, "%s: %s", what, err.message);
  for (int threads = 1; threads <= 3; threads++) {
    topos_exec ctx = topos_plan_exec(plan);
    ctx.threads = threads;
    topos_run *run = topos_plan_forward(plan, NULL, feeds, nfeeds, &ctx, &err);
    ck_assert_msg(run != NULL, "%s: %s", what, err.message);
    topos_params *pg = topos_plan_gradients(plan, run, &ctx, &err);
    ck_assert_msg(pg != NULL, "%s: gradients: %s", what, err.message);
    for (int k = 0; k < net->nparams; k++)
      expect_bits(pg->t[k], rg->t[k], what, 1000 + k);
    topos_field *pf = topos_plan_backward(plan, run, &ctx, &err);
    ck_assert_msg(pf != NULL, "%s: backward: %s", what, err.message);
    expect_same_fields(net, pf, rf, what);
    topos_field_free(pf);
    topos_params_free(pg);
    topos_run_free(run);
  }
  topos_field_free(rf);
  topos_params_free(rg);
  topos_run_free(ref);
  topos_plan_free(plan);
  return fused;
}

/* Counts the TOPOS_TASK_UNITS tasks offered (the fused adjoints' pieces). */
static void units_spy(const topos_task *t, void *ctx) {
  if (t->kind == TOPOS_TASK_UNITS) atomic_fetch_add((atomic_int *)ctx, 1);
}

static void fused_window_adjoint_cases(void) {
  chain_with_loss = true;
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    char what[64];
    for (int v = 0; v < V_COUNT; v++) {
      if (!variant_groups[v]) continue;
      chain ch = hand_conv(dt, (variant)v, 40 + (uint64_t)v);
      snprintf(what, sizeof what, "training conv variant %d %s", v,
               topos_dtype_name(dt));
      ck_assert_int_eq(expect_fused_training(ch.net, ch.loss, NULL, 0, what),
                       1);
      topos_network_release(ch.net);
    }
    for (int v = 0; v < P_COUNT; v++) {
      if (!pool_groups[v]) continue;
      chain ch = hand_pool(dt, (pool_variant)v, 60 + (uint64_t)v);
      snprintf(what, sizeof what, "training pool variant %d %s", v,
               topos_dtype_name(dt));
      ck_assert_int_eq(expect_fused_training(ch.net, ch.loss, NULL, 0, what),
                       1);
      topos_network_release(ch.net);
    }
    /* the CNN: conv over an input (only the weight's gradient), pools
     * that do not overlap */
    model m = cnn_model(dt);
    snprintf(what, sizeof what, "training cnn %s", topos_dtype_name(dt));
    ck_assert_int_eq(
        expect_fused_training(m.net, m.loss, m.feeds, m.nfeeds, what), 4);
    model_free(&m);
  }
  chain_with_loss = false;
}

START_TEST(training_fused_window_adjoints) {
  fused_window_adjoint_cases();
}
END_TEST

/* The same with the default backends: the fused adjoints' units (weight
 * rows, images) then run on the cpu backend's threads, and every bit is
 * still the reference's at 1, 2 and 3 threads. */
START_TEST(training_fused_adjoints_threads) {
  topos_backends_register_defaults();
  static atomic_int units;
  atomic_store(&units, 0);
  backend_set_offer_hook(units_spy, &units);
  fused_window_adjoint_cases();
  backend_set_offer_hook(NULL, NULL);
  ck_assert_int_gt(atomic_load(&units), 0);
}
END_TEST

/* x in [-4, 4) and r in [-1, 1), n of each, from a seeded LCG. */
static void gelu_inputs(double *xv, double *rv, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    xv[i] = ((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 8;
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    rv[i] = ((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 2;
  }
}

/* The tanh GELU's adjoint in one pass (engine/gelu.c): gradients, from the
 * interpreter and from training plans at 1-3 threads, carry the bits of
 * the unfused adjoints (the full field of topos_backward, which never
 * fuses), f32 and f64 (bf16 is not fused, and checked too), with zeros,
 * infinities, NaN, subnormals and values whose cube overflows among x; x's
 * consumers outside the pattern (`shared`) keep the unfused adjoints. */
static void gelu_case(topos_dtype dt, bool shared, int *units_seen) {
  enum { R = 131, C = 130 }; /* 17030 elements: two units of 16384 */
  static double xv[R * C], rv[R * C];
  gelu_inputs(xv, rv, R * C, 99 + (uint64_t)dt);
  const double special[] = {0.0,    -0.0,   NAN,   INFINITY, -INFINITY,
                            30,     -30,    1e20,  -1e20,    1e-39,
                            -1e-39, 5e-324, 1e300, 0.5};
  const int ns = (int)(sizeof special / sizeof *special);
  for (int i = 0; i < ns; i++) {
    xv[7 * i + 3] = special[i];         /* the first unit */
    xv[R * C - 1 - 5 * i] = special[i]; /* the tail unit */
    rv[R * C - 2 - 5 * i] = special[ns - 1 - i];
  }
  /* Two NaNs meeting in one op: x's and the cotangent's, with different
   * payloads (which of them an op returns shows in the bits), over whole
   * vectors of both units and in the tail. */
  const uint64_t nan_bits[2] = {0x7ff9234560000000ull, 0xfffc0abc00000000ull};
  double nan_x, nan_g;
  memcpy(&nan_x, &nan_bits[0], 8);
  memcpy(&nan_g, &nan_bits[1], 8);
  const int64_t at[] = {320, 16400, R * C - 3};
  for (size_t b = 0; b < sizeof at / sizeof *at; b++)
    for (int i = 0; i < 32 && at[b] + i < R * C; i++) {
      xv[at[b] + i] = i % 4 == 3 ? INFINITY : i % 4 == 2 ? -0.0 : nan_x;
      rv[at[b] + i] = i % 3 == 2 ? 1.5 : nan_g;
    }
  topos_tape *t = topos_tape_new(dt);
  topos_tensor *x0 = tt_tensor(dt, 2, S(R, C), xv);
  topos_tensor *b0 = tt_tensor(dt, 2, S(R, C), rv);
  topos_tensor *r0 = tt_tensor(dt, 2, S(R, C), rv);
  topos_value p = topos_parameter(t, x0), q = topos_parameter(t, b0);
  topos_value x = topos_add(t, p, q);
  topos_value y = topos_gelu(t, x);
  topos_value loss = topos_sum(t, topos_mul(t, y, topos_input(t, r0)));
  if (shared) loss = topos_add(t, loss, topos_sum(t, x));
  topos_tensor_release(x0);
  topos_tensor_release(b0);
  topos_tensor_release(r0);
  topos_network *net = seal(t);
  char what[64];
  snprintf(what, sizeof what, "gelu %s%s", topos_dtype_name(dt),
           shared ? " shared" : "");
  topos_error err = {0};
  topos_run *ref = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(ref != NULL, "%s: %s", what, err.message);
  topos_field *rf = topos_backward(ref, loss, NULL, &err); /* unfused */
  ck_assert_msg(rf != NULL, "%s: %s", what, err.message);
  topos_params *rg = topos_gradients(ref, loss, NULL, &err);
  ck_assert_msg(rg != NULL, "%s: %s", what, err.message);
  for (int k = 0; k < net->nparams; k++)
    expect_bits(rg->t[k], rf->t[net->param_nodes[k]], what, k);
  topos_plan *plan = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  for (int threads = 1; threads <= 3; threads++) {
    static atomic_int units;
    atomic_store(&units, 0);
    backend_set_offer_hook(units_spy, &units);
    topos_exec ctx = topos_plan_exec(plan);
    ctx.threads = threads;
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, &ctx, &err);
    ck_assert_msg(run != NULL, "%s: %s", what, err.message);
    topos_params *pg = topos_plan_gradients(plan, run, &ctx, &err);
    backend_set_offer_hook(NULL, NULL);
    ck_assert_msg(pg != NULL, "%s: gradients: %s", what, err.message);
    for (int k = 0; k < net->nparams; k++)
      expect_bits(pg->t[k], rf->t[net->param_nodes[k]], what, 100 + k);
    *units_seen += atomic_load(&units);
    topos_params_free(pg);
    topos_run_free(run);
  }
  topos_plan_free(plan);
  topos_params_free(rg);
  topos_field_free(rf);
  topos_run_free(ref);
  topos_network_release(net);
}

START_TEST(training_fused_gelu) {
  topos_backends_register_defaults();
  for (int d = 0; d < 3; d++) {
    int fused_units = 0, shared_units = 0;
    gelu_case(float_dtypes[d], false, &fused_units);
    gelu_case(float_dtypes[d], true, &shared_units);
    /* Only a multi-thread run offers units: the one pass ran there (f32
     * and f64; bf16 keeps the unfused adjoints), and never where x has
     * another consumer. */
    if (float_dtypes[d] == TOPOS_BF16)
      ck_assert_int_eq(fused_units, 0);
    else
      ck_assert_int_gt(fused_units, 0);
    ck_assert_int_eq(shared_units, 0);
  }
}
END_TEST

/* topos_gelu's nodes recorded by hand, each binary node's operands in the
 * order the flip bits say (gelu.c's GELU_FLIP_*). */
static topos_value gelu_flipped(topos_tape *t, topos_value x, int rank,
                                const int64_t *shape, unsigned flip) {
#define FB(F, fn, a, b) ((flip & (F)) ? fn(t, b, a) : fn(t, a, b))
#define FILL(v) topos_broadcast(t, topos_scalar(t, v), rank, shape)
  topos_value x2 = topos_mul(t, x, x);
  topos_value x3 = FB(GELU_FLIP_X3, topos_mul, x, x2);
  topos_value cx3 = FB(GELU_FLIP_CX3, topos_mul, FILL(0.044715), x3);
  topos_value inner = FB(GELU_FLIP_INNER, topos_add, x, cx3);
  topos_value u = FB(GELU_FLIP_U, topos_mul, FILL(0.7978845608028654), inner);
  topos_value th = topos_tanh(t, u);
  topos_value half = FB(GELU_FLIP_HALF, topos_mul, FILL(0.5), x);
  topos_value s = FB(GELU_FLIP_S, topos_add, FILL(1.0), th);
  return FB(GELU_FLIP_Y, topos_mul, half, s);
#undef FILL
#undef FB
}

/* The tanh GELU's forward as one fused group (GROUP_GELU: three passes):
 * y, and every member a run keeps, carry the interpreter's unfused bits -
 * inference plans (y a root, t and x2 observed) and training plans (the
 * loss, and gradients read the members the group wrote) - at 1-3 threads,
 * f32 and f64, for topos_gelu and for hand-recorded patterns with operands
 * the other way round; specials and NaN payloads among x. */
START_TEST(forward_fused_gelu) {
  topos_backends_register_defaults();
  enum { R = 131, C = 130 }; /* 17030 elements: two units and a tail */
  static double xv[R * C], rv[R * C];
  gelu_inputs(xv, rv, R * C, 7);
  const double special[] = {0.0,    -0.0,   NAN,   INFINITY, -INFINITY,
                            30,     -30,    1e20,  -1e20,    1e-39,
                            -1e-39, 5e-324, 1e300, -1e300};
  const uint64_t nan_bits = 0xfffc0abc00000000ull;
  double nan_p;
  memcpy(&nan_p, &nan_bits, 8);
  for (int i = 0; i < 14; i++) {
    xv[11 * i + 5] = special[i];
    xv[R * C - 1 - i] = special[i];
    rv[R * C - 30 - 3 * i] = i % 2 ? nan_p : special[i];
  }
  const unsigned flips[] = {0, 0x7f, 0x55, 0x2a};
  for (int d = 0; d < 2; d++)
    for (int f = 0; f < 4; f++) {
      topos_dtype dt = float_dtypes[d];
      char what[64];
      snprintf(what, sizeof what, "gelu %s flip %x", topos_dtype_name(dt),
               flips[f]);
      topos_tape *t = topos_tape_new(dt);
      topos_tensor *x0 = tt_tensor(dt, 2, S(R, C), xv);
      topos_tensor *b0 = tt_tensor(dt, 2, S(R, C), rv);
      topos_value x =
          topos_add(t, topos_parameter(t, x0), topos_parameter(t, b0));
      topos_value y =
          f == 0 ? topos_gelu(t, x) : gelu_flipped(t, x, 2, S(R, C), flips[f]);
      topos_value loss = topos_sum(t, topos_mul(t, y, topos_input(t, b0)));
      topos_tensor_release(x0);
      topos_tensor_release(b0);
      topos_network *net = seal(t);
      /* the members: x2 and t by their recorded positions */
      topos_value x2 = {x.tape, x.index + 1}, th = x;
      for (int i = 0; i < net->n; i++)
        if (net->nodes[i].op == OP_TANH) th.index = i;
      topos_error err = {0};
      topos_run *ref = topos_forward(net, NULL, NULL, 0, NULL, &err);
      ck_assert_msg(ref != NULL, "%s: %s", what, err.message);
      topos_params *rg = topos_gradients(ref, loss, NULL, &err);
      ck_assert_msg(rg != NULL, "%s: %s", what, err.message);
      const topos_value obs[2] = {x2, th};
      topos_plan *inf = lower(net, &y, 1, obs, 2, TOPOS_POSTURE_FORWARD);
      topos_plan *tr = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
      for (int p = 0; p < 2; p++) {
        topos_plan *plan = p ? tr : inf;
        char *desc = topos_plan_describe(plan, &err);
        ck_assert_msg(desc && strstr(desc, "gelu (tanh; three passes)"),
                      "%s: no GELU group in\n%s", what, desc ? desc : "");
        free(desc);
        for (int threads = 1; threads <= 3; threads++) {
          topos_exec ctx = topos_plan_exec(plan);
          ctx.threads = threads;
          topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, &ctx, &err);
          ck_assert_msg(run != NULL, "%s: %s", what, err.message);
          if (p == 0) {
            expect_bits(topos_run_of(run, y, &err), topos_run_of(ref, y, &err),
                        what, 0);
            expect_bits(topos_run_of(run, x2, &err),
                        topos_run_of(ref, x2, &err), what, 1);
            expect_bits(topos_run_of(run, th, &err),
                        topos_run_of(ref, th, &err), what, 2);
          } else {
            expect_bits(topos_run_of(run, loss, &err),
                        topos_run_of(ref, loss, &err), what, 3);
            topos_params *pg = topos_plan_gradients(plan, run, &ctx, &err);
            ck_assert_msg(pg != NULL, "%s: gradients: %s", what, err.message);
            for (int k = 0; k < net->nparams; k++)
              expect_bits(pg->t[k], rg->t[k], what, 10 + k);
            topos_params_free(pg);
          }
          topos_run_free(run);
        }
      }
      topos_plan_free(inf);
      topos_plan_free(tr);
      topos_params_free(rg);
      topos_run_free(ref);
      topos_network_release(net);
    }
}
END_TEST

/* Two conv chains on one x, the second recorded inside the first (its
 * links between the first's unfold and matmul), and a third reader of x:
 * fusing the outer chain would move its contribution to x's cotangent past
 * the inner one's, so only the inner chain's adjoint runs fused, and the
 * gradients are still the interpreter's. */
START_TEST(training_fused_interleaved) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = param_rand(t, TOPOS_F32, 4, S(2, 3, 8, 8), 81, -1, 1);
  topos_value wa = param_rand(t, TOPOS_F32, 2, S(3 * 3 * 3, 4), 82, -1, 1);
  topos_value wb = param_rand(t, TOPOS_F32, 4, S(5, 3, 3, 3), 83, -1, 1);
  topos_value u = topos_unfold(t, x, 2, 3, 1, 1); /* the outer chain */
  topos_value inner = topos_conv2d(t, x, wb, TOPOS_NONE, 1, 1, 1);
  u = topos_unfold(t, u, 4, 3, 1, 1);
  u = topos_permute(t, u, (const int[]){0, 2, 4, 1, 3, 5});
  topos_value outer =
      topos_matmul(t, topos_reshape(t, u, 2, S(2 * 6 * 6, 27)), wa);
  topos_value loss = topos_add(t,
                               topos_add(t, window_loss(t, TOPOS_F32, outer),
                                         window_loss(t, TOPOS_F32, inner)),
                               window_loss(t, TOPOS_F32, topos_tanh(t, x)));
  topos_network *net = seal(t);
  ck_assert_int_eq(
      expect_fused_training(net, loss, NULL, 0, "interleaved chains"), 1);
  topos_network_release(net);
}
END_TEST

/* Ties, NaN, infinities and signed zeros through the fused adjoints: the
 * max-pool's cotangent goes to the first maximum (none where the window
 * holds a NaN), and zeros of either sign survive the folds. */
START_TEST(training_fused_edges) {
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    double xv[2 * 2 * 6 * 6];
    for (int i = 0; i < 144; i++) {
      static const double pick[7] = {1, 1, -0.0, 0.0, -3, 2, 2};
      xv[i] = pick[i % 7];
    }
    xv[3] = NAN;
    xv[14] = NAN;
    xv[15] = -NAN;
    xv[40] = INFINITY;
    xv[41] = -INFINITY;
    for (int i = 72; i < 90; i++) xv[i] = i % 2 ? 0.0 : -0.0;
    topos_tensor *xt = tensor_f(dt, 4, S(2, 2, 6, 6), xv);
    double wv[3 * 2 * 3 * 3];
    for (int i = 0; i < 54; i++) wv[i] = (i % 3 == 0 ? -0.5 : 0.25) * (i % 5);
    wv[7] = -0.0;
    topos_tensor *wt = tensor_f(dt, 4, S(3, 2, 3, 3), wv);
    const int ks[][2] = {{2, 2}, {3, 2}, {2, 1}, {3, 3}, {4, 1}};
    for (int k = 0; k < 6; k++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value x = topos_parameter(t, xt);
      topos_value y;
      char what[64];
      if (k < 5) {
        y = topos_max_pool2d(t, x, ks[k][0], ks[k][1]);
        snprintf(what, sizeof what, "edges pool k%d s%d %s", ks[k][0], ks[k][1],
                 topos_dtype_name(dt));
      } else {
        /* padded, over windows that overlap */
        topos_value p = topos_pad(t, topos_pad(t, x, 2, 1, 1), 3, 1, 1);
        topos_value u =
            topos_unfold(t, topos_unfold(t, p, 2, 3, 2, 1), 4, 3, 2, 1);
        topos_value pm = topos_permute(t, u, (const int[]){0, 1, 2, 4, 3, 5});
        y = topos_max_along(t, topos_reshape(t, pm, 5, S(2, 2, 3, 3, 9)), 4);
        snprintf(what, sizeof what, "edges padded pool %s",
                 topos_dtype_name(dt));
      }
      topos_value loss = window_loss(t, dt, y);
      topos_network *net = seal(t);
      ck_assert_int_eq(expect_fused_training(net, loss, NULL, 0, what), 1);
      topos_network_release(net);
    }
    for (int k = 0; k < 3; k++) {
      static const int geo[3][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 2}};
      topos_tape *t = topos_tape_new(dt);
      topos_value x = topos_parameter(t, xt);
      topos_value w = topos_parameter(t, wt);
      topos_value y =
          topos_conv2d(t, x, w, TOPOS_NONE, geo[k][0], geo[k][1], geo[k][2]);
      topos_value loss = window_loss(t, dt, y);
      topos_network *net = seal(t);
      char what[64];
      snprintf(what, sizeof what, "edges conv s%d p%d d%d %s", geo[k][0],
               geo[k][1], geo[k][2], topos_dtype_name(dt));
      ck_assert_int_eq(expect_fused_training(net, loss, NULL, 0, what), 1);
      topos_network_release(net);
    }
    topos_tensor_release(xt);
    topos_tensor_release(wt);
  }
}
END_TEST

START_TEST(training_errors) {
  model m = mlp_model(TOPOS_F32);
  topos_error err = {0};
  topos_plan *fwd = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  topos_plan *trn = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  topos_plan *trn2 = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  topos_run *rf = topos_plan_forward(fwd, NULL, m.feeds, 2, NULL, &err);
  topos_run *rt = topos_plan_forward(trn, NULL, m.feeds, 2, NULL, &err);
  topos_run *ri = topos_forward(m.net, NULL, m.feeds, 2, NULL, &err);
  ck_assert(rf && rt && ri);

  /* plan backward on a forward plan */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(fwd, rf, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert(err.message[0] != 0);
  /* on a run of another plan (same network), an interpreter run, NULLs */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(trn2, rt, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(trn, rf, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(trn, ri, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(NULL, rt, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_backward(trn, NULL, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_ptr_null(topos_plan_backward(trn, NULL, NULL, NULL));
  /* the right pairing works */
  topos_field *f = topos_plan_backward(trn, rt, NULL, &err);
  ck_assert_msg(f != NULL, "%s", err.message);
  topos_field_free(f);

  /* topos_backward on a forward plan's run */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(rf, m.loss, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
  ck_assert(err.message[0] != 0);
  /* even where no adjoint reads anything the plan freed */
  {
    topos_tape *t = topos_tape_new(TOPOS_F32);
    topos_value p = param_rand(t, TOPOS_F32, 1, S(3), 1, -1, 1);
    topos_value l = topos_sum(t, topos_neg(t, p));
    topos_network *net = seal(t);
    topos_plan *pl = lower(net, &l, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
    topos_run *run = topos_plan_forward(pl, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(topos_backward(run, l, NULL, &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
    topos_run_free(run);
    topos_plan_free(pl);
    topos_network_release(net);
  }

  /* topos_backward on a training run for a root other than the loss:
   * what its adjoints read was freed, so it is an error, not a guess */
  {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value p = param_rand(t, TOPOS_F64, 1, S(4), 1, -1, 1);
    topos_value q = param_rand(t, TOPOS_F64, 1, S(4), 2, -1, 1);
    topos_value l1 = topos_sum(t, topos_neg(t, p));
    topos_value l2 = topos_sum(t, topos_tanh(t, topos_tanh(t, q)));
    topos_network *net = seal(t);
    topos_value r2[2] = {l1, l2};
    topos_plan *pl = lower(net, r2, 2, NULL, 0, TOPOS_POSTURE_TRAINING);
    topos_run *run = topos_plan_forward(pl, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(topos_backward(run, l2, NULL, &err));
    ck_assert_int_ne(err.code, TOPOS_OK);
    ck_assert(err.message[0] != 0);
    topos_field *ok1 = topos_backward(run, l1, NULL, &err);
    ck_assert_msg(ok1 != NULL, "%s", err.message);
    topos_field_free(ok1);
    topos_run_free(run);
    topos_plan_free(pl);
    topos_network_release(net);
  }

  /* a training entry whose first root is not rank 0 (or not a float) */
  topos_value roots[2] = {m.logits, m.loss};
  topos_entry e = {
      roots, 2, NULL, 0, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_EXACT};
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_network_lower(m.net, &e, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert(err.message[0] != 0);
  roots[0] = m.y; /* i32 */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_network_lower(m.net, &e, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  /* the same entry is fine in the forward posture */
  e.posture = TOPOS_POSTURE_FORWARD;
  topos_plan *ok = topos_network_lower(m.net, &e, &err);
  ck_assert_ptr_nonnull(ok);
  topos_plan_free(ok);

  topos_run_free(rf);
  topos_run_free(rt);
  topos_run_free(ri);
  topos_plan_free(fwd);
  topos_plan_free(trn);
  topos_plan_free(trn2);
  model_free(&m);
}
END_TEST

/* ------------------------------------------------- entry validation */

static void expect_lower_fails(const topos_network *net, const topos_entry *e,
                               const char *what) {
  topos_error err = {0};
  ck_assert_msg(topos_network_lower(net, e, &err) == NULL, "%s: lowered", what);
  ck_assert_msg(err.code != TOPOS_OK, "%s: no code", what);
  ck_assert_msg(err.message[0] != 0, "%s: no message", what);
  ck_assert_ptr_null(topos_network_lower(net, e, NULL));
}

START_TEST(entry_validation) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_rand(t, TOPOS_F64, 1, S(4), 1, -1, 1);
  topos_value loss = topos_sum(t, topos_exp(t, p));
  topos_network *net = seal(t);
  topos_tape *t2 = topos_tape_new(TOPOS_F64);
  topos_value other =
      topos_sum(t2, param_rand(t2, TOPOS_F64, 1, S(2), 2, -1, 1));
  topos_network *net2 = seal(t2);

  topos_entry good = {
      &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  expect_lower_fails(NULL, &good, "NULL network");
  expect_lower_fails(net, NULL, "NULL entry");
  topos_entry e = good;
  e.nroots = 0;
  expect_lower_fails(net, &e, "no roots");
  e.nroots = -1;
  expect_lower_fails(net, &e, "negative roots");
  e = good;
  e.roots = NULL;
  expect_lower_fails(net, &e, "NULL roots");
  e = good;
  e.roots = &other;
  expect_lower_fails(net, &e, "foreign root");
  topos_value none = TOPOS_NONE;
  e.roots = &none;
  expect_lower_fails(net, &e, "invalid root");
  topos_value past = {loss.tape, 500};
  e.roots = &past;
  expect_lower_fails(net, &e, "root past the end");
  e = good;
  e.nobserves = -2;
  expect_lower_fails(net, &e, "negative observes");
  e.nobserves = 1;
  e.observes = NULL;
  expect_lower_fails(net, &e, "NULL observes");
  e.observes = &other;
  expect_lower_fails(net, &e, "foreign observe");
  e = good;
  e.posture = (topos_posture)2;
  expect_lower_fails(net, &e, "posture 2");
  e.posture = (topos_posture)-1;
  expect_lower_fails(net, &e, "posture -1");
  e = good;
  e.numerics = (topos_numerics)7;
  expect_lower_fails(net, &e, "numerics 7");
  e.numerics = (topos_numerics)-1;
  expect_lower_fails(net, &e, "numerics -1");

  /* numerics fast: the same bits (no fast backend yet) */
  e = good;
  e.numerics = TOPOS_NUMERICS_FAST;
  topos_error err = {0};
  topos_plan *fast = topos_network_lower(net, &e, &err);
  ck_assert_msg(fast != NULL, "%s", err.message);
  expect_plan_matches(net, fast, NULL, NULL, 0, "fast");
  char *text = topos_plan_describe(fast, &err);
  ck_assert_ptr_nonnull(strstr(text, "fast"));
  topos_free(text);
  topos_plan_free(fast);

  /* plan forward / describe / counts on bad arguments */
  topos_plan *plan = topos_network_lower(net, &good, &err);
  ck_assert_ptr_nonnull(plan);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_forward(NULL, NULL, NULL, 0, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_forward(plan, NULL, NULL, -1, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_forward(plan, NULL, NULL, 1, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_params *wrong = topos_network_parameters(net2);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_forward(plan, wrong, NULL, 0, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_params_free(wrong);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_describe(NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_int_eq(topos_plan_group_count(NULL), 0);
  topos_plan_free(NULL);
  /* the plan retains its network */
  topos_network_release(net);
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert(!isnan(topos_run_scalar(run, loss, &err)));
  topos_run_free(run);
  topos_plan_free(plan);
  topos_network_release(net2);
}
END_TEST

/* ------------------------------------------------------------ threads */

typedef struct worker {
  const topos_plan *plan;
  const model *m;
  const topos_tensor *want[3];
  int mismatches, failures;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  for (int it = 0; it < 20; it++) {
    topos_error err = {0};
    topos_run *run = topos_plan_forward(w->plan, NULL, w->m->feeds,
                                        w->m->nfeeds, NULL, &err);
    if (!run) {
      w->failures++;
      continue;
    }
    topos_value vals[3] = {w->m->loss, w->m->logits, w->m->hidden};
    for (int k = 0; k < 3; k++)
      if (!topos_tensor_bitwise_equal(topos_run_of(run, vals[k], &err),
                                      w->want[k]))
        w->mismatches++;
    topos_run_free(run);
  }
  return NULL;
}

START_TEST(threads_share_a_plan) {
  model m = cnn_model(TOPOS_F32);
  topos_value roots[3] = {m.loss, m.logits, m.hidden};
  topos_plan *plan = lower(m.net, roots, 3, NULL, 0, TOPOS_POSTURE_FORWARD);
  ck_assert_int_eq(topos_plan_group_count(plan), 4);
  topos_error err = {0};
  topos_run *ref = topos_forward(m.net, NULL, m.feeds, m.nfeeds, NULL, &err);
  ck_assert_ptr_nonnull(ref);
  worker w[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){plan, &m, {NULL, NULL, NULL}, 0, 0};
    for (int k = 0; k < 3; k++)
      w[i].want[k] = topos_run_of(ref, roots[k], &err);
    ck_assert_int_eq(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(w[i].failures, 0);
    ck_assert_int_eq(w[i].mismatches, 0);
  }
  topos_run_free(ref);
  topos_plan_free(plan);
  model_free(&m);
}
END_TEST

typedef struct trainer {
  const topos_plan *plan;
  const model *m;
  const topos_params *want;
  int mismatches, failures;
} trainer;

static void *train_work(void *arg) {
  trainer *w = arg;
  for (int it = 0; it < 20; it++) {
    topos_error err = {0};
    topos_run *run = topos_plan_forward(w->plan, NULL, w->m->feeds,
                                        w->m->nfeeds, NULL, &err);
    topos_field *f = run ? topos_plan_backward(w->plan, run, NULL, &err) : NULL;
    topos_params *g = f ? topos_parameters_of(f, &err) : NULL;
    if (!g)
      w->failures++;
    else if (!topos_params_bitwise_equal(g, w->want))
      w->mismatches++;
    topos_params_free(g);
    topos_field_free(f);
    topos_run_free(run);
  }
  return NULL;
}

START_TEST(threads_share_a_training_plan) {
  model m = mlp_model(TOPOS_F32);
  topos_plan *plan = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  topos_error err = {0};
  topos_run *ref = topos_forward(m.net, NULL, m.feeds, m.nfeeds, NULL, &err);
  topos_field *rf = topos_backward(ref, m.loss, NULL, &err);
  topos_params *want = topos_parameters_of(rf, &err);
  ck_assert_ptr_nonnull(want);
  trainer w[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (trainer){plan, &m, want, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, train_work, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(w[i].failures, 0);
    ck_assert_int_eq(w[i].mismatches, 0);
  }
  topos_params_free(want);
  topos_field_free(rf);
  topos_run_free(ref);
  topos_plan_free(plan);
  model_free(&m);
}
END_TEST

/* ------------------------------------------------------ memory bounds */

/* What a call takes from the pool: its high-water mark above what was
 * handed out before it, and what it still holds after. */
static size_t pool_base;
static void measure_begin(void) {
  pool_peak_reset();
  pool_base = pool_used_bytes();
}
static size_t measured_peak(void) {
  return pool_peak_bytes() - pool_base;
}
static size_t measured_held(void) {
  size_t used = pool_used_bytes();
  return used > pool_base ? used - pool_base : 0;
}

/* bound holds measured, and is not loose beyond 4x plus 256 KiB (the
 * structs and tables the pool does not see). */
static void expect_bound(const char *what, const char *phase, size_t bound,
                         size_t measured) {
  if (getenv("TOPOS_BOUNDS_VERBOSE"))
    fprintf(stderr, "bounds: %-22s %-12s measured %10zu bound %10zu (%.2fx)\n",
            what, phase, measured, bound,
            measured ? (double)bound / (double)measured : 0.0);
  ck_assert_msg(measured <= bound,
                "%s %s: the run took %zu pool bytes, over its bound %zu", what,
                phase, measured, bound);
  ck_assert_msg(bound <= 4 * measured + (256 << 10),
                "%s %s: bound %zu for %zu pool bytes", what, phase, bound,
                measured);
}

/* Every kind of run of plan under each backend choice, measured. */
static void bounds_hold(const char *what, const topos_network *net,
                        const topos_plan *plan, const topos_feed *feeds,
                        int nfeeds) {
  topos_run_bytes b;
  topos_plan_run_bytes(plan, &b);
  bool training = plan->posture == TOPOS_POSTURE_TRAINING;
  const char *backends[2] = {"reference", NULL};
  for (int k = 0; k < 2; k++) {
    topos_exec ex = {.backend = backends[k]};
    topos_error err = {0};
    measure_begin();
    topos_run *run = topos_plan_forward(plan, NULL, feeds, nfeeds, &ex, &err);
    ck_assert_msg(run != NULL, "%s: %s", what, err.message);
    expect_bound(what, "forward", b.forward, measured_peak());
    ck_assert_uint_le(measured_held(), b.retained);
    if (training) {
      measure_begin();
      topos_params *g = topos_plan_gradients(plan, run, &ex, &err);
      ck_assert_msg(g != NULL, "%s: %s", what, err.message);
      expect_bound(what, "gradients", b.gradients, measured_peak());
      ck_assert_uint_le(measured_held(), b.gradients_held);
      topos_params_free(g);
      measure_begin();
      topos_field *f = topos_plan_backward(plan, run, &ex, &err);
      ck_assert_msg(f != NULL, "%s: %s", what, err.message);
      expect_bound(what, "backward", b.backward, measured_peak());
      topos_field_free(f);
    }
    topos_run_free(run);
    if (training) {
      const topos_optimizer opts[3] = {topos_sgd(0.01, 0), topos_sgd(0.01, 0.9),
                                       topos_adam(0.01, 0.9, 0.999, 1e-8)};
      for (int o = 0; o < 3; o++) {
        topos_step_result res;
        measure_begin();
        ck_assert_int_eq(topos_plan_step(plan, NULL, feeds, nfeeds, &opts[o],
                                         NULL, &ex, &res, &err),
                         TOPOS_OK);
        expect_bound(what, o == 2 ? "step adam" : "step sgd",
                     topos_plan_step_bytes(plan, &opts[o], false, false),
                     measured_peak());
        /* Given parameters and state, the step needs less. */
        ck_assert_uint_le(topos_plan_step_bytes(plan, &opts[o], true, true),
                          topos_plan_step_bytes(plan, &opts[o], false, false));
        topos_step_result_clear(&res);
      }
    }
  }
  topos_exec cands[2] = {{.backend = "reference"}, {.backend = NULL}};
  topos_error err = {0};
  measure_begin();
  topos_conformance *c =
      topos_conformance_run(plan, NULL, feeds, nfeeds, cands, 2, &err);
  ck_assert_msg(c != NULL, "%s: %s", what, err.message);
  expect_bound(what, "conformance", b.conformance, measured_peak());
  topos_conformance_free(c);
  (void)net;
}

START_TEST(memory_bounds_models) {
  topos_backends_register_defaults();
  for (int d = 0; d < 3; d++) {
    model ms[2] = {mlp_model(float_dtypes[d]), cnn_model(float_dtypes[d])};
    for (int k = 0; k < 2; k++) {
      model *m = &ms[k];
      char what[64];
      snprintf(what, sizeof what, "%s %s", k ? "cnn" : "mlp",
               topos_dtype_name(float_dtypes[d]));
      topos_plan *trn =
          lower(m->net, &m->loss, 1, &m->hidden, 1, TOPOS_POSTURE_TRAINING);
      bounds_hold(what, m->net, trn, m->feeds, m->nfeeds);
      topos_plan *fwd =
          lower(m->net, &m->logits, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
      bounds_hold(what, m->net, fwd, m->feeds, m->nfeeds);
      topos_plan_free(trn);
      topos_plan_free(fwd);
      model_free(m);
    }
  }
}
END_TEST

START_TEST(memory_bounds_samples) {
  topos_backends_register_defaults();
  for (int k = 0; k < SN_NSAMPLES; k++) {
    topos_network *net = sn_samples[k].build();
    ck_assert_ptr_nonnull(net);
    int n = topos_network_node_count(net);
    topos_value out = topos_network_value(net, n - 1);
    topos_plan *fwd = lower(net, &out, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
    bounds_hold(sn_samples[k].name, net, fwd, NULL, 0);
    topos_plan_free(fwd);
    if (topos_network_value_dtype(net, out) != TOPOS_I32) {
      int rank = 0;
      topos_network_value_shape(net, out, &rank);
      if (rank == 0) {
        topos_plan *trn = lower(net, &out, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
        bounds_hold(sn_samples[k].name, net, trn, NULL, 0);
        topos_plan_free(trn);
      }
    }
    topos_network_release(net);
  }
}
END_TEST

/* A scalar broadcast to a large shape costs nothing until an op reads
 * it: then the op's output and its operand's compute copy.  The bound
 * says so before anything runs (the daemon's 76-byte Forward), and it is
 * what the run takes. */
static topos_network *broadcast_net(int64_t rows, int64_t cols,
                                    topos_value *loss) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *s0 = topos_tensor_scalar(TOPOS_F32, 0.5, NULL);
  topos_value s = topos_parameter(t, s0);
  topos_tensor_release(s0);
  topos_value e = topos_exp(t, topos_broadcast(t, s, 2, S(rows, cols)));
  *loss = topos_sum(t, e);
  return seal(t);
}

START_TEST(memory_bounds_broadcast) {
  topos_backends_register_defaults();
  topos_value loss;
  /* 2^30 bytes at f32: lowered only. */
  topos_network *huge = broadcast_net(16384, 16384, &loss);
  topos_plan *p = lower(huge, &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  topos_run_bytes b;
  topos_plan_run_bytes(p, &b);
  ck_assert_msg(b.forward >= ((size_t)2 << 30), "forward %zu", b.forward);
  ck_assert_msg(b.forward < ((size_t)2 << 30) + (1 << 20), "forward %zu",
                b.forward);
  ck_assert_uint_eq(b.outputs, 4);
  ck_assert_uint_eq(b.parameters, 4);
  topos_plan_free(p);
  p = lower(huge, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  topos_plan_run_bytes(p, &b);
  /* exp's output is kept for backward (the forward holds it and the
   * operand's compute copy at once); its adjoint multiplies the
   * broadcast cotangent by it in place: one more 2^30-byte buffer. */
  ck_assert_msg(b.forward >= ((size_t)2 << 30), "forward %zu", b.forward);
  ck_assert_msg(b.retained >= ((size_t)1 << 30), "retained %zu", b.retained);
  ck_assert_msg(b.gradients >= ((size_t)1 << 30) &&
                    b.gradients < ((size_t)1 << 30) + (1 << 20),
                "gradients %zu", b.gradients);
  ck_assert_msg(b.conformance > b.forward, "conformance %zu", b.conformance);
  topos_plan_free(p);
  topos_network_release(huge);
  /* 4 MiB at f32, run and measured. */
  topos_network *net = broadcast_net(1024, 1024, &loss);
  p = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  bounds_hold("broadcast", net, p, NULL, 0);
  topos_plan_free(p);
  p = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  bounds_hold("broadcast", net, p, NULL, 0);
  topos_plan_free(p);
  topos_network_release(net);
  ck_assert_uint_eq(topos_plan_step_bytes(NULL, NULL, false, false), 0);
  topos_run_bytes zero;
  topos_plan_run_bytes(NULL, &zero);
  ck_assert_uint_eq(zero.forward, 0);
}
END_TEST

/* The device bound: the largest task's operands and output (and, for
 * training, the operands' gradients). */
START_TEST(device_bytes_largest_task) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value a = param_rand(t, TOPOS_F32, 2, S(64, 32), 1, -1, 1);
  topos_value b = param_rand(t, TOPOS_F32, 2, S(32, 16), 2, -1, 1);
  topos_value y = topos_tanh(t, topos_matmul(t, a, b)); /* [64, 16] */
  topos_value loss = topos_sum(t, y);
  topos_network *net = seal(t);
  topos_plan *p = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD);
  /* the matmul: 64x32 + 32x16 in, 64x16 out, f32 */
  ck_assert_uint_eq(topos_plan_device_bytes(p),
                    (64 * 32 + 32 * 16 + 64 * 16) * 4);
  topos_plan_free(p);
  p = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  ck_assert_uint_eq(topos_plan_device_bytes(p),
                    (2 * (64 * 32 + 32 * 16) + 64 * 16) * 4);
  topos_plan_free(p);
  topos_network_release(net);
  ck_assert_uint_eq(topos_plan_device_bytes(NULL), 0);
}
END_TEST

/* A training chain: the scan's cotangents stay to its end (the
 * evaluating builder keeps every settled handle), and the bound knows. */
START_TEST(memory_bounds_chain) {
  topos_value loss, mid[40];
  topos_network *net = tanh_chain(40, &loss, mid);
  topos_plan *p = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING);
  bounds_hold("tanh chain", net, p, NULL, 0);
  topos_plan_free(p);
  topos_network_release(net);
}
END_TEST

Suite *plan_suite(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("lowering");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, dead_node_elimination);
  tcase_add_test(tc, keep_set);
  tcase_add_test(tc, entry_validation);
  suite_add_tcase(s, tc);

  tc = tcase_create("forward_bits");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, forward_mlp);
  tcase_add_test(tc, forward_cnn);
  tcase_add_test(tc, forward_conv_pool_geometry);
  suite_add_tcase(s, tc);

  tc = tcase_create("fusion");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, structural_conv);
  tcase_add_test(tc, structural_pool);
  tcase_add_test(tc, kept_interior_blocks);
  tcase_add_test(tc, groups_share_inputs);
  tcase_add_test(tc, training_fuses_off_the_loss);
  tcase_add_test(tc, fused_conv_signed_zero_nan);
  tcase_add_test(tc, fused_pool_nan_ties);
  suite_add_tcase(s, tc);

  tc = tcase_create("liveness");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, liveness_peak_bytes);
  tcase_add_test(tc, liveness_keeps_observes);
  tcase_add_test(tc, liveness_views);
  tcase_add_test(tc, peak_bytes_views);
  suite_add_tcase(s, tc);

  tc = tcase_create("memory_bounds");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, memory_bounds_models);
  tcase_add_test(tc, memory_bounds_samples);
  tcase_add_test(tc, memory_bounds_broadcast);
  tcase_add_test(tc, device_bytes_largest_task);
  tcase_add_test(tc, memory_bounds_chain);
  suite_add_tcase(s, tc);

  tc = tcase_create("training");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, training_mlp_cnn);
  tcase_add_test(tc, training_fused_window_adjoints);
  tcase_add_test(tc, training_fused_adjoints_threads);
  tcase_add_test(tc, training_fused_edges);
  tcase_add_test(tc, training_fused_interleaved);
  tcase_add_test(tc, training_fused_gelu);
  tcase_add_test(tc, forward_fused_gelu);
  tcase_add_test(tc, training_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("threads");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, threads_share_a_plan);
  tcase_add_test(tc, threads_share_a_training_plan);
  suite_add_tcase(s, tc);
  return s;
}
