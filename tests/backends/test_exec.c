/*
 * test_exec.c - execution contexts, the backend registry and conformance.
 *
 * A context names its backend: `reference` runs no backend at all, `auto`
 * the chain the numerics allows, a name that backend first with exact
 * fallbacks.  Unknown names and envelope backends under exact numerics
 * are argument errors naming the known backends.  The conformance call
 * compares candidates with the reference and must turn red when a
 * backend lies (flip-test flips one low bit of one GEMM output).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "blas.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* A GEMM-heavy MLP: x[128,256]·w1[256,128] -> tanh -> ·w2[128,64] ->
 * sum of squares.  Both products are above blas's threshold. */
typedef struct mlp {
  topos_network *net;
  topos_value loss, h, y;
  topos_tensor *xt;
  topos_feed feed;
} mlp;

static mlp make_mlp(topos_dtype dt) {
  mlp m = {0};
  topos_tape *t = topos_tape_new(dt);
  topos_tensor *w1 = tt_random(dt, 2, S(256, 128), 11, -0.1, 0.1);
  topos_tensor *w2 = tt_random(dt, 2, S(128, 64), 12, -0.1, 0.1);
  m.xt = tt_random(dt, 2, S(128, 256), 13, -1, 1);
  topos_value x = topos_input(t, m.xt);
  topos_value p1 = topos_parameter(t, w1);
  topos_value p2 = topos_parameter(t, w2);
  topos_tensor_release(w1);
  topos_tensor_release(w2);
  m.h = topos_tanh(t, topos_matmul(t, x, p1));
  m.y = topos_matmul(t, m.h, p2);
  m.loss = topos_name(t, topos_sum(t, topos_mul(t, m.y, m.y)), "loss");
  topos_error err = {0};
  m.net = topos_tape_seal(t, &err);
  ck_assert_msg(m.net != NULL, "%s", err.message);
  m.feed = (topos_feed){x, m.xt};
  return m;
}

static void free_mlp(mlp *m) {
  topos_tensor_release(m->xt);
  topos_network_release(m->net);
}

static uint64_t tasks_of(const char *name) {
  topos_backend_info info[TOPOS_BACKENDS_MAX];
  int n = topos_backends_list(info, TOPOS_BACKENDS_MAX);
  for (int i = 0; i < n && i < TOPOS_BACKENDS_MAX; i++)
    if (strcmp(info[i].name, name) == 0) return info[i].tasks_run;
  ck_abort_msg("backend %s is not listed", name);
  return 0;
}

START_TEST(unknown_and_disallowed_backends) {
  topos_backends_register_defaults();
  mlp m = make_mlp(TOPOS_F32);
  topos_error err = {0};
  topos_exec bad = {.backend = "foo"};
  ck_assert_ptr_null(topos_forward(m.net, NULL, &m.feed, 1, &bad, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_msg(strstr(err.message, "unknown backend 'foo'") &&
                    strstr(err.message, "reference, ") &&
                    strstr(err.message, "cpu") && strstr(err.message, "blas"),
                "%s", err.message);
  /* blas is envelope: an exact context may not choose it. */
  topos_exec exact_blas = {.backend = "blas"};
  err = (topos_error){0};
  ck_assert_int_eq(topos_exec_check(&exact_blas, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_msg(strstr(err.message, "envelope"), "%s", err.message);
  topos_exec threads = {.threads = TOPOS_THREADS_MAX + 1};
  ck_assert_int_eq(topos_exec_check(&threads, &err), TOPOS_ERR_ARGUMENT);
  topos_exec numerics = {.numerics = (topos_numerics)7};
  ck_assert_int_eq(topos_exec_check(&numerics, &err), TOPOS_ERR_ARGUMENT);
  /* Backward and plan runs refuse the same way. */
  topos_run *run = topos_forward(m.net, NULL, &m.feed, 1, NULL, &err);
  ck_assert_ptr_nonnull(run);
  ck_assert_ptr_null(topos_gradients(run, m.loss, &bad, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  topos_run_free(run);
  topos_entry e = {.roots = &m.loss, .nroots = 1};
  topos_plan *plan = topos_network_lower(m.net, &e, &err);
  ck_assert_ptr_null(topos_plan_forward(plan, NULL, &m.feed, 1, &bad, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  /* Names the registry keeps for itself cannot be registered. */
  topos_backend fake = *topos_cpu_backend();
  fake.name = "reference";
  ck_assert_int_eq(topos_backend_register(&fake), TOPOS_ERR_ARGUMENT);
  fake.name = "cpu"; /* a second struct with a taken name */
  ck_assert_int_eq(topos_backend_register(&fake), TOPOS_ERR_ARGUMENT);
  topos_plan_free(plan);
  free_mlp(&m);
}
END_TEST

/* reference runs no backend; auto and cpu run cpu; all three give the
 * same bits, and the report says who ran. */
START_TEST(reference_auto_and_named) {
  topos_backends_register_defaults();
  mlp m = make_mlp(TOPOS_F32);
  topos_error err = {0};
  topos_exec_report r0 = {0}, r1 = {0}, r2 = {0};
  topos_exec ref = {.backend = "reference", .report = &r0};
  topos_exec aut = {.report = &r1};
  topos_exec cpu = {.backend = "cpu", .report = &r2};
  unsigned long long before = topos_cpu_tasks_run();
  uint64_t blas_before = tasks_of("blas");
  topos_run *a = topos_forward(m.net, NULL, &m.feed, 1, &ref, &err);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(topos_cpu_tasks_run(), before);
  topos_params *ga = topos_gradients(a, m.loss, &ref, &err);
  ck_assert_int_eq(topos_cpu_tasks_run(), before);
  topos_run *b = topos_forward(m.net, NULL, &m.feed, 1, &aut, &err);
  topos_params *gb = topos_gradients(b, m.loss, &aut, &err);
  topos_run *c = topos_forward(m.net, NULL, &m.feed, 1, &cpu, &err);
  topos_params *gc = topos_gradients(c, m.loss, &cpu, &err);
  ck_assert_msg(ga && gb && gc, "%s", err.message);
  ck_assert_uint_gt(topos_cpu_tasks_run(), before);
  ck_assert_uint_eq(tasks_of("blas"), blas_before); /* exact never */
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(a, m.loss, &err),
                                       topos_run_of(b, m.loss, &err)));
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(a, m.loss, &err),
                                       topos_run_of(c, m.loss, &err)));
  ck_assert(topos_params_bitwise_equal(ga, gb));
  ck_assert(topos_params_bitwise_equal(ga, gc));
  char names[128];
  ck_assert_str_eq(topos_exec_report_names(&r0, names, sizeof names),
                   "reference");
  ck_assert_uint_gt(r0.tasks[0], 0); /* counted, and nothing else */
  for (int i = 1; i < TOPOS_BACKENDS_MAX; i++)
    ck_assert_uint_eq(r0.tasks[i], 0);
  ck_assert_ptr_nonnull(
      strstr(topos_exec_report_names(&r1, names, sizeof names), "cpu"));
  ck_assert_ptr_nonnull(
      strstr(topos_exec_report_names(&r2, names, sizeof names), "cpu"));
  topos_params_free(ga);
  topos_params_free(gb);
  topos_params_free(gc);
  topos_run_free(a);
  topos_run_free(b);
  topos_run_free(c);
  free_mlp(&m);
}
END_TEST

/* fast + blas reaches blas, stays in the envelope; what blas declines (a
 * small product) falls back to an exact backend, never to another
 * envelope one. */
START_TEST(fast_blas_and_fallback) {
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    mlp m = make_mlp(dt);
    topos_error err = {0};
    topos_exec_report rep = {0};
    topos_exec fast = {
        .numerics = TOPOS_NUMERICS_FAST, .backend = "blas", .report = &rep};
    uint64_t before = tasks_of("blas");
    topos_run *ref =
        topos_forward(m.net, NULL, &m.feed, 1, &TEST_REFERENCE, &err);
    topos_run *got = topos_forward(m.net, NULL, &m.feed, 1, &fast, &err);
    ck_assert_msg(ref && got, "%s", err.message);
    ck_assert_uint_ge(tasks_of("blas"), before + 2);
    char names[128];
    topos_exec_report_names(&rep, names, sizeof names);
    ck_assert_msg(strstr(names, "blas") != NULL, "%s", names);
    double a = topos_run_scalar(ref, m.loss, &err);
    double b = topos_run_scalar(got, m.loss, &err);
    ck_assert_msg(fabs(a - b) <= fabs(a) * (d ? 1e-12 : 1e-5), "%g vs %g", a,
                  b);
    topos_run_free(ref);
    topos_run_free(got);
    free_mlp(&m);
  }
  /* A 2x3·3x2 product: too small for blas and for cpu; the reference
   * takes it, and the report says so. */
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *x = tt_random(TOPOS_F32, 2, S(2, 3), 1, -1, 1);
  topos_tensor *w = tt_random(TOPOS_F32, 2, S(3, 2), 2, -1, 1);
  topos_value loss = topos_sum(
      t, topos_matmul(t, topos_parameter(t, x), topos_parameter(t, w)));
  topos_tensor_release(x);
  topos_tensor_release(w);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  topos_exec_report rep = {0};
  topos_exec fast = {
      .numerics = TOPOS_NUMERICS_FAST, .backend = "blas", .report = &rep};
  uint64_t before = tasks_of("blas");
  topos_run *run = topos_forward(net, NULL, NULL, 0, &fast, &err);
  ck_assert_ptr_nonnull(run);
  ck_assert_uint_eq(tasks_of("blas"), before);
  ck_assert_uint_gt(rep.tasks[0], 0);
  topos_run *ref = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(run, loss, &err),
                                       topos_run_of(ref, loss, &err)));
  topos_run_free(run);
  topos_run_free(ref);
  topos_network_release(net);
}
END_TEST

START_TEST(registry_lists_capabilities) {
  topos_backends_register_defaults();
  topos_backend_info info[TOPOS_BACKENDS_MAX];
  int n = topos_backends_list(info, TOPOS_BACKENDS_MAX);
  ck_assert_int_ge(n, 3);
  ck_assert_str_eq(info[0].name, "reference");
  ck_assert_str_eq(info[0].fidelity, "exact");
  ck_assert_uint_eq(info[0].dtypes & (1u << TOPOS_I32), 1u << TOPOS_I32);
  const topos_backend_info *cpu = NULL, *blas = NULL;
  for (int i = 1; i < n; i++) {
    ck_assert_int_eq(info[i].index, i);
    if (strcmp(info[i].name, "cpu") == 0) cpu = &info[i];
    if (strcmp(info[i].name, "blas") == 0) blas = &info[i];
  }
  ck_assert(cpu && blas);
  ck_assert_str_eq(cpu->fidelity, "exact");
  /* GEMM, WINDOW, REDUCE, MAP, ATTENTION, UNITS */
  ck_assert_uint_eq(cpu->tasks, 0x3F);
  ck_assert_uint_eq(info[0].tasks, 0x3F);
  ck_assert_ptr_nonnull(strstr(topos_task_ops(TOPOS_TASK_UNITS), "units"));
  ck_assert_ptr_nonnull(
      strstr(topos_task_ops(TOPOS_TASK_ATTENTION), "attention"));
  ck_assert_ptr_nonnull(strstr(cpu->device, topos_cpu_isa()));
  ck_assert_int_gt(cpu->threads, 1);
  ck_assert_str_eq(blas->fidelity, "envelope");
  ck_assert_uint_eq(blas->tasks, 1u << TOPOS_TASK_GEMM);
  ck_assert_ptr_nonnull(strstr(blas->device, "OpenBLAS"));
  ck_assert_str_eq(topos_task_ops(TOPOS_TASK_GEMM), "matmul");
  /* max smaller than the registry: the count is still the whole. */
  ck_assert_int_eq(topos_backends_list(info, 1), n);
  ck_assert_ptr_eq(topos_backend_find("blas"), topos_blas_backend());
  ck_assert_ptr_null(topos_backend_find("reference"));
}
END_TEST

/* Conformance rows: exact backends bit-identical, blas within the
 * envelope with measured errors, flip-test red; training plans compare
 * the gradients too. */
START_TEST(conformance_rows) {
  topos_backends_register_defaults();
  ck_assert_int_eq(topos_backend_register(topos_flip_test_backend()), TOPOS_OK);
  mlp m = make_mlp(TOPOS_F32);
  topos_error err = {0};
  topos_value obs[1] = {m.h};
  topos_entry e = {.roots = &m.loss,
                   .nroots = 1,
                   .observes = obs,
                   .nobserves = 1,
                   .posture = TOPOS_POSTURE_TRAINING};
  topos_plan *plan = topos_network_lower(m.net, &e, &err);
  ck_assert_ptr_nonnull(plan);
  topos_exec cands[5] = {
      {.backend = "reference"},
      {0},
      {.backend = "cpu"},
      {.numerics = TOPOS_NUMERICS_FAST, .backend = "blas"},
      {.backend = "flip-test"},
  };
  topos_conformance *c =
      topos_conformance_run(plan, NULL, &m.feed, 1, cands, 5, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ck_assert_int_eq(c->nrows, 5);
  ck_assert_str_eq(c->reference_ran, "reference");
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(c->rows[i].holds && c->rows[i].bit_identical, "row %d: %s", i,
                  c->rows[i].note);
    ck_assert_int_eq(c->rows[i].noutputs, 4); /* loss, h, 2 gradients */
    ck_assert_str_eq(c->rows[i].fidelity, "exact");
  }
  ck_assert_str_eq(c->rows[1].backend, "auto");
  ck_assert_ptr_nonnull(strstr(c->rows[2].ran, "cpu"));
  const topos_conformance_row *blas = &c->rows[3];
  ck_assert_msg(blas->holds, "blas: %s", blas->note);
  ck_assert_str_eq(blas->fidelity, "envelope");
  ck_assert_ptr_nonnull(strstr(blas->ran, "blas"));
  ck_assert(blas->rel_l2 <= 1e-5);
  for (int k = 0; k < blas->noutputs; k++)
    ck_assert(blas->outputs[k].envelope == 1e-5);
  ck_assert_str_eq(blas->outputs[0].what, "root 0 (loss)");
  ck_assert_ptr_nonnull(strstr(blas->outputs[3].what, "gradient 1"));
  const topos_conformance_row *flip = &c->rows[4];
  ck_assert(!flip->holds);
  ck_assert(!flip->bit_identical);
  ck_assert(flip->max_ulp >= 1);
  ck_assert_ptr_nonnull(strstr(flip->ran, "flip-test"));
  ck_assert_ptr_nonnull(strstr(flip->note, "bits differ"));
  topos_conformance_free(c);

  /* Registered, flip-test still never joins auto. */
  unsigned long long before = topos_cpu_tasks_run();
  c = topos_conformance_run(plan, NULL, &m.feed, 1, &cands[1], 1, &err);
  ck_assert(c && c->rows[0].holds);
  ck_assert_ptr_null(strstr(c->rows[0].ran, "flip"));
  ck_assert_uint_gt(topos_cpu_tasks_run(), before);
  topos_conformance_free(c);

  /* Bad candidates: nothing runs, the error names the candidate. */
  topos_exec bad[2] = {{0}, {.backend = "nope"}};
  err = (topos_error){0};
  ck_assert_ptr_null(
      topos_conformance_run(plan, NULL, &m.feed, 1, bad, 2, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_msg(
      strstr(err.message, "candidate 1") && strstr(err.message, "nope"), "%s",
      err.message);
  ck_assert_ptr_null(topos_conformance_run(NULL, NULL, NULL, 0, NULL, 0, &err));
  ck_assert_ptr_null(topos_conformance_run(plan, NULL, NULL, 0, NULL, 1, &err));
  /* A wrong feed: the reference fails, the call returns the error. */
  topos_tensor *wrong = tt_random(TOPOS_F32, 2, S(3, 3), 1, -1, 1);
  topos_feed wf = {m.feed.input, wrong};
  ck_assert_ptr_null(topos_conformance_run(plan, NULL, &wf, 1, cands, 1, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  topos_tensor_release(wrong);
  topos_plan_free(plan);
  free_mlp(&m);
}
END_TEST

/* A deadline in a candidate stops the whole call with DEADLINE. */
START_TEST(conformance_deadline) {
  topos_backends_register_defaults();
  mlp m = make_mlp(TOPOS_F32);
  topos_error err = {0};
  topos_entry e = {.roots = &m.loss, .nroots = 1};
  topos_plan *plan = topos_network_lower(m.net, &e, &err);
  topos_exec late = {.deadline_ns = topos_now_ns() - 1};
  ck_assert_ptr_null(
      topos_conformance_run(plan, NULL, &m.feed, 1, &late, 1, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DEADLINE);
  topos_plan_free(plan);
  free_mlp(&m);
}
END_TEST

/* Maps and sums the chain declines (small, bf16, strided operands) run
 * the reference loop on the arrays the dispatch prepared: the same bits as
 * the reference backend, in every dtype, at 1 and 2 threads. */
START_TEST(declined_tasks_same_bits) {
  topos_backends_register_defaults();
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = d == 0 ? TOPOS_F32 : d == 1 ? TOPOS_F64 : TOPOS_BF16;
    for (int big = 0; big < 2; big++) {
      int64_t r = big ? 300 : 3, c = big ? 70 : 5;
      topos_tape *t = topos_tape_new(dt);
      topos_tensor *xt = tt_random(dt, 2, S(r, c), 7 + d, -2, 2);
      topos_value x = topos_parameter(t, xt);
      topos_tensor_release(xt);
      topos_value xT = topos_transpose(t, x); /* a strided operand */
      topos_value e = topos_exp(t, xT);
      topos_value th = topos_tanh(t, topos_mul(t, e, e));
      topos_value s1 = topos_sum_along(t, th, 1);
      topos_value loss = topos_sum(t, topos_mul(t, s1, s1));
      topos_error err = {0};
      topos_network *net = topos_tape_seal(t, &err);
      ck_assert_msg(net != NULL, "%s", err.message);
      topos_run *ref = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
      topos_params *gr = topos_gradients(ref, loss, &TEST_REFERENCE, &err);
      ck_assert_msg(ref && gr, "%s", err.message);
      for (int th_n = 1; th_n <= 2; th_n++) {
        topos_exec ctx = {.threads = th_n};
        topos_run *got = topos_forward(net, NULL, NULL, 0, &ctx, &err);
        topos_params *gg = topos_gradients(got, loss, &ctx, &err);
        ck_assert_msg(got && gg, "%s", err.message);
        for (int i = 0; i < topos_network_node_count(net); i++) {
          topos_value v = topos_network_value(net, i);
          ck_assert_msg(topos_tensor_bitwise_equal(topos_run_of(ref, v, &err),
                                                   topos_run_of(got, v, &err)),
                        "%s %s node %d threads %d", topos_dtype_name(dt),
                        big ? "big" : "small", i, th_n);
        }
        ck_assert(topos_params_bitwise_equal(gr, gg));
        topos_params_free(gg);
        topos_run_free(got);
      }
      topos_params_free(gr);
      topos_run_free(ref);
      topos_network_release(net);
    }
  }
}
END_TEST

Suite *exec_suite(void) {
  Suite *s = suite_create("exec");
  TCase *tc = tcase_create("contexts");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, unknown_and_disallowed_backends);
  tcase_add_test(tc, reference_auto_and_named);
  tcase_add_test(tc, fast_blas_and_fallback);
  tcase_add_test(tc, registry_lists_capabilities);
  tcase_add_test(tc, conformance_rows);
  tcase_add_test(tc, conformance_deadline);
  tcase_add_test(tc, declined_tasks_same_bits);
  suite_add_tcase(s, tc);
  return s;
}
