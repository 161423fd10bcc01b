/*
 * test_train_bench.c - a smoke test of bench/train's models
 * (bench/models.h): each builds, lowers to an exact training plan with
 * the backends registered, and one training step (forward + backward +
 * SGD) gives bit-identical parameters at 1 and at 2 threads, the check
 * bench/train makes after more steps.  LeNet's step is skipped under
 * TOPOS_SKIP_SLOW (valgrind).
 */
#include <check.h>
#include <stdlib.h>

#include "../../bench/models.h"
#include "backends.h"
#include "internal.h"

/* One step from the initial parameters at `threads`; returns the new
 * parameters. */
static topos_params *one_step(const model *m, const topos_plan *plan,
                              const batch *b, int threads) {
  topos_optimizer opt = topos_sgd(0.01, 0.0);
  trainer t;
  trainer_init(&t, m->net, plan, m->loss, &opt);
  backend_set_threads(threads);
  train_block(&t, &opt, b, 1, m->x, m->y, 1);
  backend_set_threads(0);
  topos_params *p = t.params;
  t.params = NULL;
  topos_opt_state_free(t.state);
  return p;
}

static void check_model(model m, int64_t batch_n, int rank,
                        const int64_t *x_shape, bool index_x, uint64_t bound) {
  topos_backends_register_defaults();
  topos_error err = {0};
  uint64_t rng = 7;
  int64_t count = 1;
  for (int i = 0; i < rank; i++) count *= x_shape[i];
  int64_t y_shape[1] = {batch_n};
  batch b;
  b.x = index_x
            ? random_indices(rank, x_shape, count, VOCAB, &rng)
            : topos_init_uniform(TOPOS_F32, rank, x_shape, 0.0, 1.0, 8, &err);
  ck_assert_ptr_nonnull(b.x);
  b.y = random_indices(1, y_shape, batch_n, bound, &rng);
  topos_plan *plan = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                           TOPOS_NUMERICS_EXACT, "lower train");
  topos_params *p1 = one_step(&m, plan, &b, 1);
  topos_params *p2 = one_step(&m, plan, &b, 2);
  topos_params *p0 = topos_network_parameters(m.net);
  ck_assert(topos_params_bitwise_equal(p1, p2));
  ck_assert(!topos_params_bitwise_equal(p0, p1)); /* the step moved them */
  topos_params_free(p0);
  topos_params_free(p1);
  topos_params_free(p2);
  topos_plan_free(plan);
  topos_tensor_release(b.x);
  topos_tensor_release(b.y);
  topos_network_release(m.net);
}

START_TEST(makemore_threads) {
  int64_t xs[2] = {BATCH, CONTEXT};
  check_model(makemore_build(), BATCH, 2, xs, true, VOCAB);
}
END_TEST

START_TEST(mlp784_threads) {
  int64_t xs[2] = {MLP_BATCH, MLP_IN};
  check_model(mlp784_build(), MLP_BATCH, 2, xs, false, MLP_CLASSES);
}
END_TEST

START_TEST(lenet_threads) {
  if (getenv("TOPOS_SKIP_SLOW")) return;
  int64_t xs[4] = {LENET_BATCH, 1, 28, 28};
  check_model(lenet_build(), LENET_BATCH, 4, xs, false, LENET_CLASSES);
}
END_TEST

Suite *train_bench_suite(void) {
  Suite *s = suite_create("train_bench");
  TCase *tc = tcase_create("models");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, makemore_threads);
  tcase_add_test(tc, mlp784_threads);
  tcase_add_test(tc, lenet_threads);
  suite_add_tcase(s, tc);
  return s;
}
