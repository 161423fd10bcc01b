/*
 * test_step.c - the training step as one call (engine/step.c):
 * topos_plan_step, its result, and trainers.
 *
 * The rule: a plan step is topos_plan_forward + topos_plan_gradients +
 * topos_optimizer_step, bit for bit, and so is the interpreter's step
 * under the pure reference.  Each network, dtype and optimizer is stepped
 * four times three ways and the parameters, the optimizer state, the loss
 * and the observes compared after every step.  Errors must fail cleanly
 * (a code, a message, every output zero) and, for bad optimizer settings
 * or state, before any node runs.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "sample_nets.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
enum { STEPS = 4, BATCH = 6, IN = 4, HID = 5, CLASSES = 3 };

/* ------------------------------------------------------------ helpers */

/* An MLP with cross entropy in one dtype: inputs x[BATCH,IN] (float) and
 * y[BATCH] (i32), observe `hidden` (the tanh layer). */
typedef struct mlp {
  topos_network *net;
  topos_value x, y, hidden, loss;
} mlp;

static topos_value rand_leaf(topos_tape *t, bool param, topos_dtype d, int rank,
                             const int64_t *shape, uint64_t seed) {
  topos_tensor *v = tt_random(d, rank, shape, seed, -0.8, 0.8);
  topos_value out = param ? topos_parameter(t, v) : topos_input(t, v);
  topos_tensor_release(v);
  return out;
}

static mlp mlp_build(topos_dtype d) {
  mlp m;
  topos_tape *t = topos_tape_new(d);
  m.x = rand_leaf(t, false, d, 2, S(BATCH, IN), 1);
  topos_tensor *y0 = topos_tensor_zeros(TOPOS_I32, 1, S(BATCH), NULL);
  m.y = topos_input(t, y0);
  topos_tensor_release(y0);
  topos_value w1 = rand_leaf(t, true, d, 2, S(IN, HID), 2);
  topos_value b1 = rand_leaf(t, true, d, 1, S(HID), 3);
  topos_value w2 = rand_leaf(t, true, d, 2, S(HID, CLASSES), 4);
  topos_value b2 = rand_leaf(t, true, d, 1, S(CLASSES), 5);
  m.hidden = topos_tanh(t, topos_linear(t, m.x, w1, b1));
  m.loss = topos_cross_entropy(t, topos_linear(t, m.hidden, w2, b2), m.y);
  topos_error err = {0};
  m.net = topos_tape_seal(t, &err);
  ck_assert_msg(m.net != NULL, "%s", err.message);
  return m;
}

/* Step k's minibatch: fresh x values and targets. */
typedef struct batch {
  topos_tensor *x, *y;
  topos_feed feeds[2];
} batch;

static batch batch_make(const mlp *m, topos_dtype d, int k) {
  batch b;
  b.x = tt_random(d, 2, S(BATCH, IN), 100 + (uint64_t)k, -1, 1);
  double y[BATCH];
  for (int i = 0; i < BATCH; i++) y[i] = (double)((i * 7 + k) % CLASSES);
  b.y = tt_tensor(TOPOS_I32, 1, S(BATCH), y);
  b.feeds[0] = (topos_feed){m->x, b.x};
  b.feeds[1] = (topos_feed){m->y, b.y};
  return b;
}

static void batch_free(batch *b) {
  topos_tensor_release(b->x);
  topos_tensor_release(b->y);
}

static topos_plan *lower_training(const topos_network *net, topos_value loss,
                                  const topos_value *observes, int nobserves) {
  topos_error err = {0};
  topos_entry e = {&loss,
                   1,
                   observes,
                   nobserves,
                   TOPOS_POSTURE_TRAINING,
                   TOPOS_NUMERICS_EXACT};
  topos_plan *p = topos_network_lower(net, &e, &err);
  ck_assert_msg(p != NULL, "lower: %s", err.message);
  return p;
}

static bool moments_equal(const topos_params *a, const topos_params *b) {
  if (!a || !b) return a == b;
  return topos_params_bitwise_equal(a, b);
}

static void expect_state_equal(const topos_opt_state *a,
                               const topos_opt_state *b, const char *what) {
  ck_assert_msg(a && b, "%s: a state is missing", what);
  ck_assert_msg(topos_opt_state_step(a) == topos_opt_state_step(b),
                "%s: step %lld vs %lld", what,
                (long long)topos_opt_state_step(a),
                (long long)topos_opt_state_step(b));
  for (int k = 0; k < 2; k++)
    ck_assert_msg(moments_equal(topos_opt_state_moment(a, k),
                                topos_opt_state_moment(b, k)),
                  "%s: moment %d differs", what, k);
}

static void expect_bits(double a, double b, const char *what) {
  ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "%s: %.17g vs %.17g", what, a,
                b);
}

/* Moves a step result's parameters and state into *p and *s (freeing
 * what they held) and clears the rest of it. */
static void take_result(topos_step_result *r, topos_params **p,
                        topos_opt_state **s) {
  topos_params_free(*p);
  topos_opt_state_free(*s);
  *p = r->params;
  *s = r->state;
  r->params = NULL;
  r->state = NULL;
  topos_step_result_clear(r);
}

/* The failure contract: a code, a message, every output zero. */
static void expect_failed(int rc, const topos_error *err,
                          const topos_step_result *r, int code,
                          const char *needle) {
  ck_assert_msg(rc != TOPOS_OK, "%s: succeeded", needle);
  if (code)
    ck_assert_msg(rc == code, "%s: code %d want %d (%s)", needle, rc, code,
                  err->message);
  ck_assert_int_eq(err->code, rc);
  ck_assert_msg(strstr(err->message, needle) != NULL, "'%s' not in '%s'",
                needle, err->message);
  ck_assert_ptr_null(r->params);
  ck_assert_ptr_null(r->state);
  ck_assert_ptr_null(r->run);
  ck_assert_ptr_null(r->observes);
  ck_assert_int_eq(r->nobserves, 0);
  double zero = 0;
  ck_assert(memcmp(&r->loss, &zero, sizeof zero) == 0);
}

/* Fills a result with junk, so a test sees whether a failure zeroed it. */
static void junk(topos_step_result *r) {
  memset(r, 0, sizeof *r);
  r->params = (topos_params *)(uintptr_t)1;
  r->state = (topos_opt_state *)(uintptr_t)1;
  r->run = (topos_run *)(uintptr_t)1;
  r->nobserves = 3;
  r->loss = 7;
}

static bool decay_first(int slot, const topos_tensor *param, void *ctx) {
  (void)param;
  (void)ctx;
  return slot == 0;
}

/* Every optimizer kind, with the variants that read other state paths. */
static int optimizers(topos_optimizer *out) {
  int n = 0;
  out[n++] = topos_sgd(0.1, 0.0);
  out[n] = topos_sgd(0.05, 0.9);
  out[n++].weight_decay = 1e-3;
  out[n++] = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  out[n++] = topos_adamw(1e-2, 0.9, 0.999, 1e-8, 0.05);
  out[n] = topos_adamw(1e-2, 0.8, 0.99, 1e-6, 0.1);
  out[n++].decay = decay_first;
  return n;
}

/* ------------------------------------------------------------ bits */

/* STEPS steps three ways: topos_plan_step (from NULL params and state),
 * the plan calls composed, and the interpreter under the pure reference;
 * everything compared after each step. */
static void three_ways(const mlp *m, topos_dtype d, const topos_optimizer *opt,
                       const char *what) {
  topos_error err = {0};
  topos_plan *plan = lower_training(m->net, m->loss, &m->hidden, 1);
  const topos_exec ref = {.backend = "reference"};
  topos_step_result cur = {0};
  topos_params *pb = topos_network_parameters(m->net);
  topos_params *pc = topos_network_parameters(m->net);
  topos_opt_state *sb = topos_opt_state_new(opt, pb, &err);
  topos_opt_state *sc = topos_opt_state_new(opt, pc, &err);
  ck_assert_msg(sb && sc, "%s: %s", what, err.message);
  for (int k = 0; k < STEPS; k++) {
    char at[96];
    snprintf(at, sizeof at, "%s, step %d", what, k);
    batch b = batch_make(m, d, k);

    topos_step_result next;
    int rc = topos_plan_step(plan, cur.params, b.feeds, 2, opt, cur.state, NULL,
                             &next, &err);
    ck_assert_msg(rc == TOPOS_OK, "%s: %s", at, err.message);

    topos_run *rb = topos_plan_forward(plan, pb, b.feeds, 2, NULL, &err);
    ck_assert_msg(rb != NULL, "%s: %s", at, err.message);
    topos_params *gb = topos_plan_gradients(plan, rb, NULL, &err);
    ck_assert_msg(gb != NULL, "%s: %s", at, err.message);
    topos_params *nb = NULL;
    topos_opt_state *nsb = NULL;
    ck_assert_int_eq(topos_optimizer_step(opt, pb, gb, sb, &nb, &nsb, &err),
                     TOPOS_OK);

    topos_run *rc2 = topos_forward(m->net, pc, b.feeds, 2, &ref, &err);
    ck_assert_msg(rc2 != NULL, "%s: %s", at, err.message);
    topos_params *gc = topos_gradients(rc2, m->loss, &ref, &err);
    ck_assert_msg(gc != NULL, "%s: %s", at, err.message);
    topos_params *nc = NULL;
    topos_opt_state *nsc = NULL;
    ck_assert_int_eq(topos_optimizer_step(opt, pc, gc, sc, &nc, &nsc, &err),
                     TOPOS_OK);

    ck_assert_msg(topos_params_bitwise_equal(next.params, nb),
                  "%s: params differ from the composed plan calls", at);
    ck_assert_msg(topos_params_bitwise_equal(next.params, nc),
                  "%s: params differ from the reference interpreter", at);
    expect_state_equal(next.state, nsb, at);
    expect_state_equal(next.state, nsc, at);
    ck_assert_int_eq(topos_opt_state_step(next.state), k + 1);
    expect_bits(next.loss, topos_run_scalar(rb, m->loss, NULL), at);
    expect_bits(next.loss, topos_run_scalar(rc2, m->loss, NULL), at);
    /* The observe, and the run it came from. */
    ck_assert_int_eq(next.nobserves, 1);
    ck_assert(topos_tensor_bitwise_equal(next.observes[0],
                                         topos_run_of(rc2, m->hidden, NULL)));
    ck_assert(topos_tensor_bitwise_equal(
        next.observes[0], topos_run_of(next.run, m->hidden, NULL)));
    expect_bits(next.loss, topos_run_scalar(next.run, m->loss, NULL), at);

    topos_step_result_clear(&cur);
    cur = next;
    topos_params_free(pb);
    topos_params_free(pc);
    topos_opt_state_free(sb);
    topos_opt_state_free(sc);
    pb = nb;
    pc = nc;
    sb = nsb;
    sc = nsc;
    topos_params_free(gb);
    topos_params_free(gc);
    topos_run_free(rb);
    topos_run_free(rc2);
    batch_free(&b);
  }
  /* The steps moved the parameters (a no-op would compare equal too). */
  topos_params *p0 = topos_network_parameters(m->net);
  ck_assert_msg(!topos_params_bitwise_equal(p0, cur.params),
                "%s: nothing moved", what);
  topos_params_free(p0);
  topos_step_result_clear(&cur);
  ck_assert_ptr_null(cur.params); /* cleared means zeroed */
  topos_step_result_clear(&cur);  /* and clearing twice is harmless */
  topos_step_result_clear(NULL);
  topos_params_free(pb);
  topos_params_free(pc);
  topos_opt_state_free(sb);
  topos_opt_state_free(sc);
  topos_plan_free(plan);
}

START_TEST(step_bits_mlp) {
  topos_backends_register_defaults();
  const topos_dtype dtypes[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  topos_optimizer opts[8];
  int nopts = optimizers(opts);
  for (int d = 0; d < 3; d++) {
    mlp m = mlp_build(dtypes[d]);
    for (int o = 0; o < nopts; o++) {
      char what[64];
      snprintf(what, sizeof what, "%s, optimizer %d",
               topos_dtype_name(dtypes[d]), o);
      three_ways(&m, dtypes[d], &opts[o], what);
    }
    topos_network_release(m.net);
  }
}
END_TEST

/* A plan with fused convolution and pool groups: its step is the
 * interpreter's too (inputs take their defaults). */
START_TEST(step_bits_conv) {
  topos_backends_register_defaults();
  topos_network *net = sn_conv();
  ck_assert_ptr_nonnull(net);
  topos_value loss = topos_network_find(net, "loss");
  topos_plan *plan = lower_training(net, loss, NULL, 0);
  topos_optimizer opts[8];
  int nopts = optimizers(opts);
  const topos_exec ref = {.backend = "reference"};
  topos_error err = {0};
  for (int o = 0; o < nopts; o++) {
    topos_step_result cur = {0};
    topos_params *p = topos_network_parameters(net);
    topos_opt_state *s = topos_opt_state_new(&opts[o], p, &err);
    for (int k = 0; k < STEPS; k++) {
      topos_step_result next;
      ck_assert_msg(topos_plan_step(plan, cur.params, NULL, 0, &opts[o],
                                    cur.state, NULL, &next, &err) == TOPOS_OK,
                    "%s", err.message);
      ck_assert_int_eq(next.nobserves, 0);
      ck_assert_ptr_null(next.observes);
      topos_run *run = topos_forward(net, p, NULL, 0, &ref, &err);
      topos_params *g = topos_gradients(run, loss, &ref, &err);
      topos_params *np = NULL;
      topos_opt_state *ns = NULL;
      ck_assert_int_eq(topos_optimizer_step(&opts[o], p, g, s, &np, &ns, &err),
                       TOPOS_OK);
      ck_assert_msg(topos_params_bitwise_equal(next.params, np),
                    "optimizer %d step %d: params differ", o, k);
      expect_state_equal(next.state, ns, "conv");
      expect_bits(next.loss, topos_run_scalar(run, loss, NULL), "conv loss");
      topos_step_result_clear(&cur);
      cur = next;
      topos_params_free(p);
      topos_opt_state_free(s);
      p = np;
      s = ns;
      topos_params_free(g);
      topos_run_free(run);
    }
    topos_step_result_clear(&cur);
    topos_params_free(p);
    topos_opt_state_free(s);
  }
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------ contexts */

/* Donated steps (topos_plan_step_donated) give topos_plan_step's bits
 * for every optimizer, from the initials on; plain SGD reuses the
 * donated tensors nothing else holds (the same tensor comes back), and
 * one the caller still holds keeps its values; a failed donated step
 * consumes and changes nothing. */
START_TEST(step_donated) {
  topos_backends_register_defaults();
  mlp m = mlp_build(TOPOS_F32);
  topos_plan *plan = lower_training(m.net, m.loss, &m.hidden, 1);
  topos_optimizer opts[8];
  int nopts = optimizers(opts);
  opts[nopts] = topos_sgd(0.1, 0.0);
  opts[nopts++].weight_decay = 1e-2; /* plain SGD with L2 */
  topos_error err = {0};
  for (int o = 0; o < nopts; o++) {
    bool plain = opts[o].kind == TOPOS_SGD && opts[o].momentum == 0;
    topos_params *rp = NULL, *dp = NULL;
    topos_opt_state *rs = NULL, *ds = NULL;
    for (int k = 0; k < STEPS; k++) {
      batch b = batch_make(&m, TOPOS_F32, k);
      topos_step_result r, d;
      ck_assert_int_eq(
          topos_plan_step(plan, rp, b.feeds, 2, &opts[o], rs, NULL, &r, &err),
          TOPOS_OK);
      /* step 2: the caller still holds slot 0; it must not change */
      topos_tensor *held = NULL;
      float before[IN * HID], after[IN * HID];
      if (k == 2) {
        held = topos_tensor_retain(topos_params_get(dp, 0));
        ck_assert_int_eq(topos_tensor_read(held, before, sizeof before, &err),
                         TOPOS_OK);
      }
      const topos_tensor *slot1 = dp ? topos_params_get(dp, 1) : NULL;
      ck_assert_msg(topos_plan_step_donated(plan, &dp, b.feeds, 2, &opts[o],
                                            &ds, NULL, &d, &err) == TOPOS_OK,
                    "%s", err.message);
      ck_assert_ptr_null(dp);
      ck_assert_ptr_null(ds);
      ck_assert_ptr_null(d.run);
      ck_assert_msg(topos_params_bitwise_equal(d.params, r.params),
                    "optimizer %d step %d: params differ", o, k);
      expect_state_equal(d.state, r.state, "donated");
      expect_bits(d.loss, r.loss, "donated loss");
      ck_assert_int_eq(d.nobserves, 1);
      if (slot1) /* reused exactly when the update can run in place */
        ck_assert_int_eq(topos_params_get(d.params, 1) == slot1, plain);
      if (held) {
        ck_assert_ptr_ne(topos_params_get(d.params, 0), held);
        ck_assert_int_eq(topos_tensor_read(held, after, sizeof after, &err),
                         TOPOS_OK);
        ck_assert(memcmp(before, after, sizeof before) == 0);
        topos_tensor_release(held);
      }
      take_result(&r, &rp, &rs);
      take_result(&d, &dp, &ds);
      batch_free(&b);
    }
    /* A failure (a feed of the wrong shape) consumes nothing. */
    topos_tensor *bad = tt_random(TOPOS_F32, 2, S(BATCH, IN + 1), 9, -1, 1);
    topos_feed feeds[1] = {{m.x, bad}};
    topos_params *keep = dp;
    topos_opt_state *keep_s = ds;
    topos_step_result d;
    junk(&d);
    int rc = topos_plan_step_donated(plan, &dp, feeds, 1, &opts[o], &ds, NULL,
                                     &d, &err);
    expect_failed(rc, &err, &d, 0, "x");
    ck_assert_ptr_eq(dp, keep);
    ck_assert_ptr_eq(ds, keep_s);
    ck_assert(topos_params_bitwise_equal(dp, rp));
    topos_tensor_release(bad);
    topos_params_free(rp);
    topos_opt_state_free(rs);
    topos_params_free(dp);
    topos_opt_state_free(ds);
  }
  /* The donated pointers themselves are required. */
  topos_params *none = NULL;
  topos_step_result d;
  junk(&d);
  int rc = topos_plan_step_donated(plan, NULL, NULL, 0, &opts[0], NULL, NULL,
                                   &d, &err);
  expect_failed(rc, &err, &d, TOPOS_ERR_ARGUMENT, "donated params");
  junk(&d);
  rc = topos_plan_step_donated(plan, &none, NULL, 0, &opts[0], NULL, NULL, &d,
                               &err);
  expect_failed(rc, &err, &d, TOPOS_ERR_ARGUMENT, "donated state");
  topos_plan_free(plan);
  topos_network_release(m.net);
}
END_TEST

static int cancel_calls;
static bool count_cancel(void *ctx) {
  (void)ctx;
  cancel_calls++;
  return false;
}
static bool always_cancel(void *ctx) {
  (void)ctx;
  return true;
}

/* A given context governs the forward and the gradients: what ran is
 * what the composed calls under the same context ran, and the bits are
 * those of the plan's default. */
/* A donated SGD pass large enough to be split into units over the
 * threads (a [321,257] weight: five units of 16K elements and a partial
 * sixth, a tail of one past the vector width; slots of one unit and
 * less beside it): at 1, 2 and 3 threads the same bits as the
 * undonated step. */
START_TEST(step_donated_units) {
  topos_backends_register_defaults();
  enum { N = 3, WIN = 321, WOUT = 257 };
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = rand_leaf(t, false, TOPOS_F32, 2, S(N, WIN), 11);
  topos_value w = rand_leaf(t, true, TOPOS_F32, 2, S(WIN, WOUT), 12);
  topos_value b = rand_leaf(t, true, TOPOS_F32, 1, S(WOUT), 13);
  topos_value w2 = rand_leaf(t, true, TOPOS_F32, 2, S(WOUT, 5), 14);
  topos_tensor *y0 = topos_tensor_zeros(TOPOS_I32, 1, S(N), NULL);
  topos_value y = topos_input(t, y0);
  topos_tensor_release(y0);
  topos_value h = topos_tanh(t, topos_linear(t, x, w, b));
  topos_value loss = topos_cross_entropy(t, topos_matmul(t, h, w2), y);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_plan *plan = lower_training(net, loss, NULL, 0);
  topos_optimizer opt = topos_sgd(0.05, 0.0);
  for (int threads = 1; threads <= 3; threads++) {
    topos_exec ctx = {.threads = threads};
    topos_params *rp = NULL, *dp = NULL;
    topos_opt_state *rs = NULL, *ds = NULL;
    for (int k = 0; k < 3; k++) {
      topos_tensor *xv = tt_random(TOPOS_F32, 2, S(N, WIN), 50 + k, -1, 1);
      double yv[N] = {(double)k, 2, 4};
      topos_tensor *yt = tt_tensor(TOPOS_I32, 1, S(N), yv);
      topos_feed feeds[2] = {{x, xv}, {y, yt}};
      topos_step_result r, d;
      ck_assert_int_eq(
          topos_plan_step(plan, rp, feeds, 2, &opt, rs, &ctx, &r, &err),
          TOPOS_OK);
      ck_assert_msg(topos_plan_step_donated(plan, &dp, feeds, 2, &opt, &ds,
                                            &ctx, &d, &err) == TOPOS_OK,
                    "%s", err.message);
      ck_assert_msg(topos_params_bitwise_equal(d.params, r.params),
                    "threads %d step %d: params differ", threads, k);
      take_result(&r, &rp, &rs);
      take_result(&d, &dp, &ds);
      topos_tensor_release(xv);
      topos_tensor_release(yt);
    }
    /* the weight moved */
    topos_params *p0 = topos_network_parameters(net);
    ck_assert(!topos_params_bitwise_equal(p0, dp));
    topos_params_free(p0);
    topos_params_free(rp);
    topos_opt_state_free(rs);
    topos_params_free(dp);
    topos_opt_state_free(ds);
  }
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

START_TEST(step_context) {
  topos_backends_register_defaults();
  mlp m = mlp_build(TOPOS_F64);
  topos_plan *plan = lower_training(m.net, m.loss, NULL, 0);
  batch b = batch_make(&m, TOPOS_F64, 0);
  topos_optimizer opt = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  topos_error err = {0};
  const char *backends[2] = {"reference", "cpu"};
  topos_step_result dflt;
  ck_assert_int_eq(
      topos_plan_step(plan, NULL, b.feeds, 2, &opt, NULL, NULL, &dflt, &err),
      TOPOS_OK);
  for (int k = 0; k < 2; k++) {
    topos_exec_report got = {{0}}, want = {{0}};
    topos_exec ctx = {.backend = backends[k], .report = &got};
    topos_step_result r;
    ck_assert_msg(topos_plan_step(plan, NULL, b.feeds, 2, &opt, NULL, &ctx, &r,
                                  &err) == TOPOS_OK,
                  "%s: %s", backends[k], err.message);
    ctx.report = &want;
    topos_run *run = topos_plan_forward(plan, NULL, b.feeds, 2, &ctx, &err);
    topos_params *g = topos_plan_gradients(plan, run, &ctx, &err);
    ck_assert_ptr_nonnull(g);
    uint64_t total = 0;
    for (int i = 0; i < TOPOS_BACKENDS_MAX; i++) {
      ck_assert_msg(got.tasks[i] == want.tasks[i],
                    "%s: backend %d ran %llu tasks, composed %llu", backends[k],
                    i, (unsigned long long)got.tasks[i],
                    (unsigned long long)want.tasks[i]);
      total += got.tasks[i];
    }
    ck_assert_msg(total > 0, "%s: nothing reported", backends[k]);
    ck_assert(topos_params_bitwise_equal(r.params, dflt.params));
    expect_state_equal(r.state, dflt.state, backends[k]);
    topos_params_free(g);
    topos_run_free(run);
    topos_step_result_clear(&r);
  }

  /* Cancellation and deadlines stop the step cleanly. */
  topos_step_result r;
  junk(&r);
  topos_exec stop = {.cancel = always_cancel};
  int rc = topos_plan_step(plan, NULL, b.feeds, 2, &opt, NULL, &stop, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_CANCELLED, "");
  junk(&r);
  topos_exec late = {.deadline_ns = 1};
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &opt, NULL, &late, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_DEADLINE, "");
  junk(&r);
  topos_exec nope = {.backend = "nope"};
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &opt, NULL, &nope, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "nope");

  topos_step_result_clear(&dflt);
  batch_free(&b);
  topos_plan_free(plan);
  topos_network_release(m.net);
}
END_TEST

/* ------------------------------------------------------------ errors */

START_TEST(step_errors) {
  mlp m = mlp_build(TOPOS_F64);
  topos_plan *plan = lower_training(m.net, m.loss, NULL, 0);
  topos_entry fe = {
      &m.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_plan *fwd = topos_network_lower(m.net, &fe, NULL);
  ck_assert_ptr_nonnull(fwd);
  batch b = batch_make(&m, TOPOS_F64, 0);
  topos_optimizer sgd = topos_sgd(0.1, 0);
  topos_optimizer adam = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  topos_error err = {0};
  topos_step_result r;
  int rc;

  ck_assert_int_eq(
      topos_plan_step(plan, NULL, b.feeds, 2, &sgd, NULL, NULL, NULL, &err),
      TOPOS_ERR_ARGUMENT);
  junk(&r);
  rc = topos_plan_step(NULL, NULL, b.feeds, 2, &sgd, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "plan is NULL");
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, NULL, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "optimizer is NULL");
  junk(&r);
  rc = topos_plan_step(fwd, NULL, b.feeds, 2, &sgd, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_STATE, "forward-only");

  /* Wrong parameters: too few slots, a slot of the wrong shape. */
  topos_params *init = topos_network_parameters(m.net);
  topos_tensor *one = topos_tensor_zeros(TOPOS_F64, 2, S(2, 2), NULL);
  topos_params *few = topos_params_new(1, &one, NULL);
  topos_params *misshaped = topos_params_with(init, 0, one, NULL);
  junk(&r);
  rc = topos_plan_step(plan, few, b.feeds, 2, &sgd, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, 0, "");
  junk(&r);
  rc = topos_plan_step(plan, misshaped, b.feeds, 2, &sgd, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, 0, "");
  /* A feed of the wrong shape. */
  topos_feed bad_feed[1] = {{m.x, one}};
  junk(&r);
  rc = topos_plan_step(plan, NULL, bad_feed, 1, &sgd, NULL, NULL, &r, &err);
  expect_failed(rc, &err, &r, 0, "");
  /* No err: the code still says it failed. */
  junk(&r);
  ck_assert_int_ne(
      topos_plan_step(plan, NULL, bad_feed, 1, &sgd, NULL, NULL, &r, NULL),
      TOPOS_OK);
  ck_assert_ptr_null(r.params);
  ck_assert_int_eq(
      topos_plan_step(fwd, NULL, b.feeds, 2, &sgd, NULL, NULL, &r, NULL),
      TOPOS_ERR_STATE);

  /* Bad settings and a state that does not fit fail before any node runs
   * (the cancel predicate is asked at every node boundary). */
  topos_exec counting = {.cancel = count_cancel};
  topos_optimizer neg = topos_sgd(-1, 0);
  cancel_calls = 0;
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &neg, NULL, &counting, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "lr");
  ck_assert_int_eq(cancel_calls, 0);
  topos_opt_state *sgd_state = topos_opt_state_new(&sgd, init, &err);
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &adam, sgd_state, &counting, &r,
                       &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "first moment");
  ck_assert_int_eq(cancel_calls, 0);
  topos_network *other = sn_gradient_descent();
  topos_params *other_p = topos_network_parameters(other);
  topos_opt_state *other_state = topos_opt_state_new(&adam, other_p, &err);
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &adam, other_state, &counting,
                       &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "slots");
  ck_assert_int_eq(cancel_calls, 0);
  /* A state whose second moment holds a negative element (slot 1, the
   * last element), or a setting the kind does not read. */
  topos_opt_state *fresh = topos_opt_state_new(&adam, init, &err);
  const topos_params *v0 = topos_opt_state_moment(fresh, 1);
  const topos_tensor *v1 = topos_params_get(v0, 1);
  int64_t n1 = topos_tensor_count(v1);
  double *vals = calloc((size_t)n1, sizeof *vals);
  vals[n1 - 1] = -0.5;
  topos_tensor *neg_v = topos_tensor_from(TOPOS_F64, topos_tensor_rank(v1),
                                          topos_tensor_shape(v1), vals, &err);
  free(vals);
  topos_params *vbad = topos_params_with(v0, 1, neg_v, &err);
  topos_opt_state *bad_state =
      topos_opt_state_from(3, topos_opt_state_moment(fresh, 0), vbad, &err);
  ck_assert_ptr_nonnull(bad_state);
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &adam, bad_state, &counting, &r,
                       &err);
  char expect[96];
  snprintf(expect, sizeof expect,
           "second moment (v) slot 1 element %lld is -0.5",
           (long long)(n1 - 1));
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, expect);
  ck_assert_int_eq(cancel_calls, 0);
  topos_optimizer adam_mu = adam;
  adam_mu.momentum = 0.9;
  junk(&r);
  rc = topos_plan_step(plan, NULL, b.feeds, 2, &adam_mu, NULL, &counting, &r,
                       &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "does not read momentum");
  ck_assert_int_eq(cancel_calls, 0);
  topos_opt_state_free(bad_state);
  topos_params_free(vbad);
  topos_tensor_release(neg_v);
  topos_opt_state_free(fresh);
  /* The counter does count when the step runs. */
  ck_assert_int_eq(
      topos_plan_step(plan, NULL, b.feeds, 2, &sgd, NULL, &counting, &r, &err),
      TOPOS_OK);
  ck_assert_int_gt(cancel_calls, 0);
  topos_step_result_clear(&r);

  topos_opt_state_free(other_state);
  topos_params_free(other_p);
  topos_network_release(other);
  topos_opt_state_free(sgd_state);
  topos_params_free(few);
  topos_params_free(misshaped);
  topos_params_free(init);
  topos_tensor_release(one);
  batch_free(&b);
  topos_plan_free(fwd);
  topos_plan_free(plan);
  topos_network_release(m.net);
}
END_TEST

/* ------------------------------------------------------------ trainers */

START_TEST(trainer_local_bits) {
  topos_backends_register_defaults();
  mlp m = mlp_build(TOPOS_F32);
  topos_error err = {0};
  /* The context's backend name is copied: the caller's buffer may go. */
  char name[16] = "reference";
  topos_exec_report report = {{0}};
  topos_exec ctx = {.backend = name, .report = &report};
  topos_trainer *tr =
      topos_trainer_local(m.net, m.loss, &m.hidden, 1, &ctx, &err);
  ck_assert_msg(tr != NULL, "%s", err.message);
  strcpy(name, "bogus");
  ck_assert_str_eq(topos_trainer_kind(tr), "local");
  topos_plan *plan = lower_training(m.net, m.loss, &m.hidden, 1);
  topos_optimizer opt = topos_adamw(1e-2, 0.9, 0.999, 1e-8, 0.05);
  topos_step_result a = {0}, b = {0};
  for (int k = 0; k < STEPS; k++) {
    batch bt = batch_make(&m, TOPOS_F32, k);
    topos_step_result na, nb;
    ck_assert_msg(topos_trainer_step(tr, a.params, bt.feeds, 2, &opt, a.state,
                                     &na, &err) == TOPOS_OK,
                  "%s", err.message);
    ck_assert_int_eq(topos_plan_step(plan, b.params, bt.feeds, 2, &opt, b.state,
                                     NULL, &nb, &err),
                     TOPOS_OK);
    ck_assert(topos_params_bitwise_equal(na.params, nb.params));
    expect_state_equal(na.state, nb.state, "trainer");
    expect_bits(na.loss, nb.loss, "trainer loss");
    ck_assert_int_eq(na.nobserves, 1);
    ck_assert(topos_tensor_bitwise_equal(na.observes[0], nb.observes[0]));
    topos_step_result_clear(&a);
    topos_step_result_clear(&b);
    a = na;
    b = nb;
    batch_free(&bt);
  }
  /* Every task ran under the copied context: on the reference alone. */
  ck_assert_uint_gt(report.tasks[0], 0);
  for (int i = 1; i < TOPOS_BACKENDS_MAX; i++)
    ck_assert_uint_eq(report.tasks[i], 0);
  topos_step_result_clear(&a);
  topos_step_result_clear(&b);
  topos_plan_free(plan);
  topos_trainer_free(tr);
  topos_network_release(m.net);
}
END_TEST

START_TEST(trainer_local_errors) {
  mlp m = mlp_build(TOPOS_F64);
  topos_error err = {0};
  ck_assert_ptr_null(topos_trainer_local(NULL, m.loss, NULL, 0, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  /* The loss must be a rank-0 float. */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_trainer_local(m.net, m.hidden, NULL, 0, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(
      topos_trainer_local(m.net, TOPOS_NONE, NULL, 0, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_exec nope = {.backend = "nope"};
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_trainer_local(m.net, m.loss, NULL, 0, &nope, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "nope"));

  topos_trainer *tr = topos_trainer_local(m.net, m.loss, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(tr);
  /* The trainer retains the network. */
  topos_network_release(m.net);
  batch b = batch_make(&m, TOPOS_F64, 0);
  topos_optimizer opt = topos_sgd(0.1, 0);
  topos_step_result r;
  ck_assert_int_eq(
      topos_trainer_step(tr, NULL, b.feeds, 2, &opt, NULL, NULL, &err),
      TOPOS_ERR_ARGUMENT);
  junk(&r);
  int rc = topos_trainer_step(NULL, NULL, b.feeds, 2, &opt, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "trainer is NULL");
  topos_optimizer neg = topos_sgd(-1, 0);
  junk(&r);
  rc = topos_trainer_step(tr, NULL, b.feeds, 2, &neg, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_ARGUMENT, "lr");
  ck_assert_int_eq(
      topos_trainer_step(tr, NULL, b.feeds, 2, &opt, NULL, &r, &err), TOPOS_OK);
  ck_assert_ptr_nonnull(r.params);
  topos_step_result_clear(&r);
  ck_assert_str_eq(topos_trainer_kind(NULL), "");
  topos_trainer_free(NULL);
  batch_free(&b);
  topos_trainer_free(tr);
}
END_TEST

/* A trainer of the caller's own: the vtable's contract. */
static int custom_frees;
static void custom_free(void *self) {
  free(self);
  custom_frees++;
}
/* Leaves a half-built result behind and fails, as a careless
 * implementation might: topos_trainer_step must still hand back zeros
 * (and nothing may leak, which the sanitizer and valgrind runs check). */
static int custom_step(void *self, const topos_params *params,
                       const topos_feed *feeds, int nfeeds,
                       const topos_optimizer *opt, const topos_opt_state *state,
                       topos_step_result *out, topos_error *err) {
  const topos_network *net = *(const topos_network **)self;
  out->params = topos_network_parameters(net);
  out->loss = 1;
  if (opt->lr > 1) {
    err->code = TOPOS_ERR_RANGE;
    snprintf(err->message, sizeof err->message, "custom: lr too large");
    return TOPOS_ERR_RANGE;
  }
  out->state = topos_opt_state_new(opt, out->params, err);
  return TOPOS_OK;
}

START_TEST(trainer_custom) {
  static const topos_trainer_ops ops = {"custom", custom_step, custom_free};
  static const topos_trainer_ops no_step = {"broken", NULL, custom_free};
  topos_network *net = sn_gradient_descent();
  topos_error err = {0};
  custom_frees = 0;
  const topos_network **self = malloc(sizeof *self);
  *self = net;
  ck_assert_ptr_null(topos_trainer_new(&no_step, self, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(custom_frees, 1); /* owned even when it fails */
  ck_assert_ptr_null(topos_trainer_new(NULL, NULL, &err));

  self = malloc(sizeof *self);
  *self = net;
  topos_trainer *tr = topos_trainer_new(&ops, self, &err);
  ck_assert_ptr_nonnull(tr);
  ck_assert_str_eq(topos_trainer_kind(tr), "custom");
  topos_optimizer opt = topos_sgd(0.5, 0);
  topos_step_result r;
  ck_assert_int_eq(topos_trainer_step(tr, NULL, NULL, 0, &opt, NULL, &r, &err),
                   TOPOS_OK);
  ck_assert_ptr_nonnull(r.params);
  ck_assert_ptr_nonnull(r.state);
  topos_step_result_clear(&r);
  opt.lr = 2;
  junk(&r);
  int rc = topos_trainer_step(tr, NULL, NULL, 0, &opt, NULL, &r, &err);
  expect_failed(rc, &err, &r, TOPOS_ERR_RANGE, "too large");
  topos_trainer_free(tr);
  ck_assert_int_eq(custom_frees, 2);
  topos_network_release(net);
}
END_TEST

/* One local trainer stepped from several threads at once gives each the
 * bits a lone step gives. */
enum { NTHREADS = 4 };
typedef struct job {
  topos_trainer *tr;
  const topos_feed *feeds;
  topos_step_result r;
  int rc;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  topos_optimizer opt = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  topos_step_result prev = {0};
  j->rc = TOPOS_OK;
  for (int k = 0; k < STEPS && j->rc == TOPOS_OK; k++) {
    j->rc = topos_trainer_step(j->tr, prev.params, j->feeds, 2, &opt,
                               prev.state, &j->r, NULL);
    topos_step_result_clear(&prev);
    if (k + 1 < STEPS) {
      prev = j->r;
      memset(&j->r, 0, sizeof j->r);
    }
  }
  return NULL;
}

START_TEST(trainer_threads) {
  topos_backends_register_defaults();
  mlp m = mlp_build(TOPOS_F64);
  topos_error err = {0};
  topos_trainer *tr = topos_trainer_local(m.net, m.loss, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(tr);
  batch b = batch_make(&m, TOPOS_F64, 1);
  job lone = {tr, b.feeds, {0}, 0};
  job_main(&lone);
  ck_assert_int_eq(lone.rc, TOPOS_OK);
  job jobs[NTHREADS];
  pthread_t th[NTHREADS];
  for (int t = 0; t < NTHREADS; t++) {
    jobs[t] = (job){tr, b.feeds, {0}, -1};
    ck_assert_int_eq(pthread_create(&th[t], NULL, job_main, &jobs[t]), 0);
  }
  for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < NTHREADS; t++) {
    ck_assert_int_eq(jobs[t].rc, TOPOS_OK);
    ck_assert(topos_params_bitwise_equal(jobs[t].r.params, lone.r.params));
    expect_state_equal(jobs[t].r.state, lone.r.state, "thread");
    topos_step_result_clear(&jobs[t].r);
  }
  topos_step_result_clear(&lone.r);
  batch_free(&b);
  topos_trainer_free(tr);
  topos_network_release(m.net);
}
END_TEST

Suite *step_suite(void) {
  Suite *s = suite_create("step");
  TCase *bits = tcase_create("bits");
  tcase_set_timeout(bits, 120);
  tcase_add_test(bits, step_bits_mlp);
  tcase_add_test(bits, step_bits_conv);
  tcase_add_test(bits, step_context);
  tcase_add_test(bits, step_donated);
  tcase_add_test(bits, step_donated_units);
  suite_add_tcase(s, bits);
  TCase *errors = tcase_create("errors");
  tcase_add_test(errors, step_errors);
  suite_add_tcase(s, errors);
  TCase *trainers = tcase_create("trainers");
  tcase_set_timeout(trainers, 60);
  tcase_add_test(trainers, trainer_local_bits);
  tcase_add_test(trainers, trainer_local_errors);
  tcase_add_test(trainers, trainer_custom);
  tcase_add_test(trainers, trainer_threads);
  suite_add_tcase(s, trainers);
  return s;
}
