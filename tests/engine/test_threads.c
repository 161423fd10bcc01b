/*
 * test_threads.c - an entry's thread count (topos_entry.threads).
 *
 * The rule (docs/decisions.md): every backend task offered during a plan
 * run (forward, backward, gradients) gets threads = entry.threads when it
 * is not 0, else the process default (backend_set_threads, TOPOS_THREADS, the
 * online cores); an entry may ask for more than the default, up to
 * TOPOS_THREADS_MAX, and the backends cap it at their pools.  The value is
 * per thread, installed for the run and restored after it, nested runs
 * included.  Results never depend on it.
 *
 * The checks: a network big enough that the cpu backend splits its work
 * (300x300x300 products, maps and a sum over 2^20 elements) gives the same
 * bits, forward, backward and topos_plan_gradients, at entry threads 0..4
 * as the interpreter; a hook on backend_offer sees every task carry the
 * entry's count; bad counts are rejected at lowering; describe names the
 * count.
 */
#include <check.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static void restore(void) {
  backend_set_offer_hook(NULL, NULL);
  backend_set_threads(0);
}

/* ------------------------------------------------------------ the net */

typedef struct big_net {
  topos_network *net;
  topos_value loss, y, s;
} big_net;

/* loss = sum(tanh(x·w)) + sum(exp(v) * u): two 300x300x300 products
 * forward (three more backward), tanh over 90000 elements, exp and a
 * multiply over 2^20, and sums over 90000 and 2^20 elements. */
static big_net big(void) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *x = tt_random(TOPOS_F32, 2, S(300, 300), 11, -1, 1);
  topos_tensor *w = tt_random(TOPOS_F32, 2, S(300, 300), 12, -0.1, 0.1);
  topos_tensor *v = tt_random(TOPOS_F32, 1, S(1 << 20), 13, -2, 2);
  topos_tensor *u = tt_random(TOPOS_F32, 1, S(1 << 20), 14, -1, 1);
  topos_value xv = topos_input(t, x);
  topos_value wv = topos_parameter(t, w);
  topos_value vv = topos_parameter(t, v);
  topos_value uv = topos_input(t, u);
  topos_tensor_release(x);
  topos_tensor_release(w);
  topos_tensor_release(v);
  topos_tensor_release(u);
  big_net b = {0};
  b.y = topos_tanh(t, topos_matmul(t, xv, wv));
  b.s = topos_sum(t, topos_mul(t, topos_exp(t, vv), uv));
  b.loss = topos_add(t, topos_sum(t, b.y), b.s);
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "record: %s", e);
  topos_error err = {0};
  b.net = topos_tape_seal(t, &err);
  ck_assert_msg(b.net != NULL, "seal: %s", err.message);
  return b;
}

static topos_entry entry_of(const big_net *b, const topos_value *roots,
                            int threads) {
  (void)b;
  topos_entry e = {.roots = roots,
                   .nroots = 3,
                   .posture = TOPOS_POSTURE_TRAINING,
                   .numerics = TOPOS_NUMERICS_EXACT,
                   .threads = threads};
  return e;
}

/* ------------------------------------------------------------ the spy */

typedef struct spy {
  atomic_int offers;
  atomic_int wrong; /* tasks whose threads was not `want` */
  atomic_int last;  /* the last task's threads */
  int want;
} spy;

static void spy_hook(const topos_task *t, void *ctx) {
  spy *s = ctx;
  atomic_fetch_add(&s->offers, 1);
  atomic_store(&s->last, t->threads);
  if (t->threads != s->want) atomic_fetch_add(&s->wrong, 1);
}

static void spy_reset(spy *s, int want) {
  atomic_store(&s->offers, 0);
  atomic_store(&s->wrong, 0);
  atomic_store(&s->last, -1);
  s->want = want;
}

/* One training pass of `plan`: the run and the parameter gradients. */
static void pass(const topos_plan *plan, topos_run **run, topos_params **g) {
  topos_error err = {0};
  *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(*run != NULL, "forward: %s", err.message);
  topos_field *f = topos_plan_backward(plan, *run, NULL, &err);
  ck_assert_msg(f != NULL, "backward: %s", err.message);
  *g = topos_parameters_of(f, &err);
  ck_assert_msg(*g != NULL, "gradients: %s", err.message);
  topos_field_free(f);
}

/* ---------------------------------------------------------------- tests */

/* Entry threads 0..4 (the default pinned at 2, so 3 and 4 ask for more)
 * give the interpreter's bits forward and backward, and every task of a
 * run, forward and backward, carries the entry's count. */
START_TEST(bits_and_tasks) {
  topos_backends_register_defaults();
  backend_set_threads(2);
  big_net b = big();
  topos_value roots[3] = {b.loss, b.y, b.s};
  topos_error err = {0};
  topos_run *ref = topos_forward(b.net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(ref != NULL, "%s", err.message);
  topos_field *rf = topos_backward(ref, b.loss, NULL, &err);
  ck_assert_ptr_nonnull(rf);
  topos_params *rg = topos_parameters_of(rf, &err);
  ck_assert_ptr_nonnull(rg);
  static spy sp;
  backend_set_offer_hook(spy_hook, &sp);
  const int counts[5] = {1, 2, 3, 4, 0};
  for (int i = 0; i < 5; i++) {
    int th = counts[i];
    topos_entry e = entry_of(&b, roots, th);
    topos_plan *plan = topos_network_lower(b.net, &e, &err);
    ck_assert_msg(plan != NULL, "lower: %s", err.message);
    ck_assert_int_eq(topos_plan_threads(plan), th);
    int want = th ? th : 2;
    spy_reset(&sp, want);
    topos_error e2 = {0};
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &e2);
    ck_assert_msg(run != NULL, "%s", e2.message);
    int fwd = atomic_load(&sp.offers);
    topos_field *f = topos_plan_backward(plan, run, NULL, &e2);
    ck_assert_ptr_nonnull(f);
    int bwd = atomic_load(&sp.offers) - fwd;
    /* matmul, tanh, exp, mul, three sums forward; more backward */
    ck_assert_int_ge(fwd, 5);
    ck_assert_int_ge(bwd, 3);
    ck_assert_msg(atomic_load(&sp.wrong) == 0,
                  "threads %d: %d of %d tasks did not get %d", th,
                  atomic_load(&sp.wrong), atomic_load(&sp.offers), want);
    /* restored after each run */
    ck_assert_int_eq(backend_threads(), 2);
    for (int k = 0; k < 3; k++) {
      const topos_tensor *a = topos_run_of(ref, roots[k], &err);
      const topos_tensor *c = topos_run_of(run, roots[k], &err);
      ck_assert_ptr_nonnull(a);
      ck_assert_ptr_nonnull(c);
      ck_assert_msg(topos_tensor_bitwise_equal(a, c),
                    "threads %d: root %d differs", th, k);
    }
    topos_params *g = topos_parameters_of(f, &err);
    ck_assert_ptr_nonnull(g);
    ck_assert_msg(topos_params_bitwise_equal(g, rg),
                  "threads %d: gradients differ", th);
    topos_params_free(g);
    /* The parameters-only backward is a plan entry point too. */
    int before = atomic_load(&sp.offers);
    g = topos_plan_gradients(plan, run, NULL, &e2);
    ck_assert_msg(g != NULL, "%s", e2.message);
    ck_assert_int_gt(atomic_load(&sp.offers), before);
    ck_assert_int_eq(atomic_load(&sp.wrong), 0);
    ck_assert_msg(topos_params_bitwise_equal(g, rg),
                  "threads %d: plan gradients differ", th);
    topos_params_free(g);
    topos_field_free(f);
    topos_run_free(run);
    topos_plan_free(plan);
  }
  topos_params_free(rg);
  topos_field_free(rf);
  topos_run_free(ref);
  topos_network_release(b.net);
  restore();
}
END_TEST

/* Under the process default (no override) a threads-0 entry's tasks get
 * backend_threads(); the override changes threads-0 plans only. */
START_TEST(default_and_override) {
  topos_backends_register_defaults();
  big_net b = big();
  topos_value roots[3] = {b.loss, b.y, b.s};
  topos_error err = {0};
  static spy sp;
  backend_set_offer_hook(spy_hook, &sp);
  topos_entry e0 = entry_of(&b, roots, 0), e3 = entry_of(&b, roots, 3);
  topos_plan *p0 = topos_network_lower(b.net, &e0, &err);
  topos_plan *p3 = topos_network_lower(b.net, &e3, &err);
  ck_assert_ptr_nonnull(p0);
  ck_assert_ptr_nonnull(p3);
  int def = backend_threads();
  ck_assert_int_ge(def, 1);
  for (int round = 0; round < 2; round++) {
    if (round == 1) {
      backend_set_threads(1);
      def = 1;
    }
    topos_run *run;
    topos_params *g;
    spy_reset(&sp, def);
    pass(p0, &run, &g);
    ck_assert_int_gt(atomic_load(&sp.offers), 0);
    ck_assert_int_eq(atomic_load(&sp.wrong), 0);
    topos_params_free(g);
    topos_run_free(run);
    spy_reset(&sp, 3);
    pass(p3, &run, &g);
    ck_assert_int_gt(atomic_load(&sp.offers), 0);
    ck_assert_int_eq(atomic_load(&sp.wrong), 0);
    topos_params_free(g);
    topos_run_free(run);
    /* the interpreter uses the default */
    spy_reset(&sp, def);
    run = topos_forward(b.net, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    ck_assert_int_gt(atomic_load(&sp.offers), 0);
    ck_assert_int_eq(atomic_load(&sp.wrong), 0);
    topos_run_free(run);
  }
  topos_plan_free(p0);
  topos_plan_free(p3);
  topos_network_release(b.net);
  restore();
}
END_TEST

/* A plan run started inside another's task (here from the hook) runs
 * with its own count, and the outer run's later tasks keep theirs: each
 * run carries its context, nothing is installed on the thread. */
typedef struct nest {
  const topos_plan *inner;
  int depth, inner_wrong, inner_offers, outer_wrong, outer_offers;
  int after_inner; /* backend_threads() right after the inner run: the
                      process default, untouched */
  bool ran;
} nest;

static void nest_hook(const topos_task *t, void *ctx) {
  nest *n = ctx;
  if (n->depth > 0) {
    n->inner_offers++;
    n->inner_wrong += t->threads != 1;
    return;
  }
  n->outer_offers++;
  n->outer_wrong += t->threads != 3;
  if (n->ran) return;
  n->ran = true;
  n->depth++;
  topos_error err = {0};
  topos_run *run = topos_plan_forward(n->inner, NULL, NULL, 0, NULL, &err);
  topos_field *f = run ? topos_plan_backward(n->inner, run, NULL, &err) : NULL;
  topos_field_free(f);
  topos_run_free(run);
  n->depth--;
  n->after_inner = backend_threads();
}

START_TEST(nested_and_failed_runs) {
  topos_backends_register_defaults();
  backend_set_threads(2);
  big_net b = big();
  topos_value roots[3] = {b.loss, b.y, b.s};
  topos_error err = {0};
  topos_entry eo = entry_of(&b, roots, 3), ei = entry_of(&b, roots, 1);
  topos_plan *outer = topos_network_lower(b.net, &eo, &err);
  topos_plan *inner = topos_network_lower(b.net, &ei, &err);
  ck_assert_ptr_nonnull(outer);
  ck_assert_ptr_nonnull(inner);
  nest n = {.inner = inner};
  backend_set_offer_hook(nest_hook, &n);
  topos_run *run;
  topos_params *g;
  pass(outer, &run, &g);
  backend_set_offer_hook(NULL, NULL);
  ck_assert(n.ran);
  ck_assert_int_gt(n.inner_offers, 0);
  ck_assert_int_eq(n.inner_wrong, 0);
  ck_assert_int_gt(n.outer_offers, 1);
  ck_assert_int_eq(n.outer_wrong, 0);
  ck_assert_int_eq(n.after_inner, 2);
  ck_assert_int_eq(backend_threads(), 2);
  topos_params_free(g);
  topos_run_free(run);

  /* A run that fails (a feed of the wrong shape) restores too. */
  topos_tensor *bad = tt_random(TOPOS_F32, 1, S(3), 1, -1, 1);
  topos_feed f = {topos_network_input(b.net, 0), bad};
  run = topos_plan_forward(outer, NULL, &f, 1, NULL, &err);
  ck_assert_ptr_null(run);
  ck_assert_int_eq(backend_threads(), 2);
  topos_tensor_release(bad);
  topos_plan_free(inner);
  topos_plan_free(outer);
  topos_network_release(b.net);
  restore();
}
END_TEST

/* -1, 1025 and INT_MIN are TOPOS_ERR_ARGUMENT naming the field; 1024 (above
 * any default) and 0 lower; a rejected entry changes nothing. */
START_TEST(bad_counts) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *x = tt_random(TOPOS_F32, 1, S(4), 1, -1, 1);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  topos_value loss = topos_sum(t, topos_exp(t, p));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  int def = backend_threads();
  const int bad[3] = {-1, TOPOS_THREADS_MAX + 1, INT_MIN};
  for (int i = 0; i < 3; i++) {
    topos_entry e = {.roots = &loss,
                     .nroots = 1,
                     .posture = TOPOS_POSTURE_TRAINING,
                     .threads = bad[i]};
    topos_error e2 = {0};
    ck_assert_ptr_null(topos_network_lower(net, &e, &e2));
    ck_assert_int_eq(e2.code, TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(e2.message, "threads") != NULL, "%s", e2.message);
    char num[16];
    snprintf(num, sizeof num, "%d", bad[i]);
    ck_assert_msg(strstr(e2.message, num) != NULL, "%s", e2.message);
    ck_assert_int_eq(backend_threads(), def);
  }
  /* The message, once in full. */
  topos_entry e = {.roots = &loss, .nroots = 1, .threads = 1025};
  topos_error e3 = {0};
  ck_assert_ptr_null(topos_network_lower(net, &e, &e3));
  ck_assert_str_eq(e3.message,
                   "lower: entry threads 1025 is out of range (0 = the "
                   "process default, else 1..1024)");
  const int good[3] = {0, 1, TOPOS_THREADS_MAX};
  for (int i = 0; i < 3; i++) {
    e.threads = good[i];
    topos_plan *plan = topos_network_lower(net, &e, &err);
    ck_assert_msg(plan != NULL, "%s", err.message);
    ck_assert_int_eq(topos_plan_threads(plan), good[i]);
    topos_plan_free(plan);
  }
  /* A positional initialiser that stops at numerics means threads 0. */
  topos_entry pos = {
      &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  ck_assert_int_eq(pos.threads, 0);
  topos_network_release(net);
}
END_TEST

/* Describe names a non-zero count on its first line and says nothing
 * about 0 (the text of existing plans is unchanged). */
START_TEST(describe_names_threads) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *x = tt_random(TOPOS_F32, 1, S(4), 1, -1, 1);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  topos_value y = topos_exp(t, p);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_entry e = {.roots = &y, .nroots = 1};
  topos_plan *p0 = topos_network_lower(net, &e, &err);
  e.threads = 4;
  topos_plan *p4 = topos_network_lower(net, &e, &err);
  ck_assert_ptr_nonnull(p0);
  ck_assert_ptr_nonnull(p4);
  char *d0 = topos_plan_describe(p0, &err);
  char *d4 = topos_plan_describe(p4, &err);
  ck_assert_ptr_nonnull(d0);
  ck_assert_ptr_nonnull(d4);
  ck_assert_msg(strncmp(d0, "plan: posture forward, numerics exact; ", 39) == 0,
                "%s", d0);
  ck_assert_ptr_null(strstr(d0, "threads"));
  ck_assert_msg(
      strncmp(d4, "plan: posture forward, numerics exact, threads 4; ", 50) ==
          0,
      "%s", d4);
  /* Otherwise the same text. */
  ck_assert_str_eq(d0 + 39, d4 + 50);
  topos_free(d0);
  topos_free(d4);
  topos_plan_free(p0);
  topos_plan_free(p4);
  topos_network_release(net);
}
END_TEST

Suite *threads_suite(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("entry");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, bad_counts);
  tcase_add_test(tc, describe_names_threads);
  suite_add_tcase(s, tc);
  tc = tcase_create("runs");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, bits_and_tasks);
  tcase_add_test(tc, default_and_override);
  tcase_add_test(tc, nested_and_failed_runs);
  suite_add_tcase(s, tc);
  return s;
}
