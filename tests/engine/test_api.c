/*
 * test_api.c - the whole public API fed hostile arguments: NULL objects,
 * values of another tape, invalid values, wrong dtypes.  Each call must
 * return an error (NULL, an invalid value, a non-zero status, or a stuck
 * tape error) and never crash; Check runs every test in its own process,
 * so a crash fails the test rather than the suite.
 */
#include <math.h>
#include <stdio.h>

#include "testutil.h"

static topos_error err;

#define EXPECT_NULL(call)                                      \
  do {                                                         \
    err = (topos_error){0};                                    \
    ck_assert_msg((call) == NULL, #call " returned non-NULL"); \
  } while (0)

#define EXPECT_ERR(call)                                             \
  do {                                                               \
    err = (topos_error){0};                                          \
    ck_assert_msg((call) != 0, #call " returned 0");                 \
    ck_assert_msg(err.message[0] != '\0', #call " gave no message"); \
  } while (0)

START_TEST(null_objects) {
  int64_t shape[2] = {2, 2};
  int perm[2] = {1, 0};
  topos_value none = TOPOS_NONE;
  /* Tensors. */
  EXPECT_NULL(topos_tensor_from(TOPOS_F32, 2, NULL, NULL, &err));
  EXPECT_NULL(topos_tensor_from(TOPOS_F32, 2, shape, NULL, &err));
  EXPECT_NULL(topos_tensor_filled((topos_dtype)42, 2, shape, 1, &err));
  EXPECT_NULL(topos_tensor_zeros(TOPOS_F32, 9, shape, &err));
  EXPECT_NULL(topos_tensor_ones(TOPOS_F32, -1, shape, &err));
  EXPECT_NULL(topos_tensor_scalar((topos_dtype)-3, 1, &err));
  ck_assert_ptr_null(topos_tensor_retain(NULL));
  topos_tensor_release(NULL);
  ck_assert_int_eq(topos_tensor_rank(NULL), -1);
  ck_assert_ptr_null(topos_tensor_shape(NULL));
  ck_assert_int_eq(topos_tensor_count(NULL), -1);
  ck_assert_str_eq(topos_dtype_name(topos_tensor_dtype(NULL)), "?");
  err = (topos_error){0};
  ck_assert(isnan(topos_tensor_get(NULL, NULL, &err)));
  char buf[16];
  EXPECT_ERR(topos_tensor_read(NULL, buf, sizeof buf, &err));
  ck_assert(topos_tensor_bitwise_equal(NULL, NULL));
  EXPECT_NULL(topos_tensor_transpose(NULL, &err));
  EXPECT_NULL(topos_tensor_permute(NULL, perm, &err));
  EXPECT_NULL(topos_tensor_narrow(NULL, 0, 0, 1, &err));
  EXPECT_NULL(topos_tensor_broadcast(NULL, 2, shape, &err));
  EXPECT_NULL(topos_tensor_unfold(NULL, 0, 1, 1, 1, &err));
  EXPECT_NULL(topos_tensor_contiguous(NULL, &err));
  ck_assert_str_eq(topos_dtype_name((topos_dtype)99), "?");
  ck_assert_int_eq(topos_dtype_size((topos_dtype)99), 0);

  /* Tapes: every recording call on a NULL tape returns an invalid value. */
  ck_assert_ptr_null(topos_tape_new(TOPOS_I32));
  ck_assert_ptr_null(topos_tape_new((topos_dtype)7));
  topos_tape_free(NULL);
  ck_assert_ptr_nonnull(topos_tape_error(NULL));
  ck_assert_int_eq(topos_tape_node_count(NULL), 0);
  ck_assert(!topos_value_ok(topos_parameter(NULL, NULL)));
  ck_assert(!topos_value_ok(topos_input(NULL, NULL)));
  ck_assert(!topos_value_ok(topos_constant(NULL, NULL)));
  ck_assert(!topos_value_ok(topos_scalar(NULL, 1)));
  ck_assert(!topos_value_ok(topos_name(NULL, none, "x")));
  ck_assert(!topos_value_ok(topos_add(NULL, none, none)));
  ck_assert(!topos_value_ok(topos_matmul(NULL, none, none)));
  ck_assert(!topos_value_ok(topos_permute(NULL, none, perm)));
  ck_assert(!topos_value_ok(topos_reshape(NULL, none, 2, shape)));
  ck_assert(!topos_value_ok(topos_concat(NULL, 1, &none, 0)));
  ck_assert(!topos_value_ok(topos_gather(NULL, none, none)));
  ck_assert(!topos_value_ok(topos_linear(NULL, none, none, none)));
  ck_assert(!topos_value_ok(topos_conv2d(NULL, none, none, none, 1, 0, 1)));
  ck_assert(!topos_value_ok(topos_cross_entropy(NULL, none, none)));
  int rank = -1;
  ck_assert_ptr_null(topos_value_shape(NULL, none, &rank));
  ck_assert_int_eq(rank, 0);
  EXPECT_NULL(topos_tape_seal(NULL, &err));

  /* Networks, runs, fields, params. */
  ck_assert_ptr_null(topos_network_retain(NULL));
  topos_network_release(NULL);
  ck_assert_int_eq(topos_network_node_count(NULL), 0);
  ck_assert(!topos_value_ok(topos_network_parameter(NULL, 0)));
  ck_assert(!topos_value_ok(topos_network_find(NULL, "x")));
  ck_assert_ptr_null(topos_network_name_of(NULL, none));
  EXPECT_NULL(topos_network_describe(NULL, TOPOS_FORMAT_TEXT, &err));
  ck_assert_ptr_null(topos_network_parameters(NULL));
  EXPECT_NULL(topos_forward(NULL, NULL, NULL, 0, NULL, &err));
  EXPECT_NULL(topos_forward_for(NULL, NULL, NULL, 0, NULL, 0, NULL, &err));
  topos_run_free(NULL);
  EXPECT_NULL(topos_run_of(NULL, none, &err));
  err = (topos_error){0};
  ck_assert(isnan(topos_run_scalar(NULL, none, &err)));
  EXPECT_NULL(topos_backward(NULL, none, NULL, &err));
  topos_field_free(NULL);
  EXPECT_NULL(topos_field_of(NULL, none, &err));
  EXPECT_NULL(topos_parameters_of(NULL, &err));
  EXPECT_NULL(topos_field_add(NULL, NULL, &err));
  EXPECT_NULL(topos_field_scale(NULL, 2, &err));
  topos_params_free(NULL);
  ck_assert_int_eq(topos_params_count(NULL), 0);
  ck_assert_ptr_null(topos_params_get(NULL, 0));
  EXPECT_NULL(topos_params_new(2, NULL, &err));
  EXPECT_NULL(topos_params_with(NULL, 0, NULL, &err));
  EXPECT_NULL(topos_params_add(NULL, NULL, &err));
  EXPECT_NULL(topos_params_scale(NULL, 1, &err));
  EXPECT_NULL(topos_params_map(NULL, NULL, NULL, &err));
  EXPECT_NULL(topos_params_zip(NULL, NULL, NULL, NULL, &err));

  /* Optimizers and initializers. */
  topos_optimizer sgd = topos_sgd(0.1, 0);
  EXPECT_NULL(topos_opt_state_new(NULL, NULL, &err));
  EXPECT_NULL(topos_opt_state_new(&sgd, NULL, &err));
  topos_opt_state_free(NULL);
  ck_assert_ptr_null(topos_opt_state_moment(NULL, 0));
  topos_params *po = NULL;
  topos_opt_state *so = NULL;
  EXPECT_ERR(topos_optimizer_step(NULL, NULL, NULL, NULL, &po, &so, &err));
  EXPECT_ERR(topos_optimizer_step(&sgd, NULL, NULL, NULL, &po, &so, &err));
  ck_assert_ptr_null(po);
  ck_assert_ptr_null(so);
  EXPECT_NULL(topos_init_uniform(TOPOS_I32, 2, shape, 0, 1, 1, &err));
  EXPECT_NULL(topos_init_normal(TOPOS_F32, 2, NULL, 0, 1, 1, &err));
  EXPECT_NULL(topos_init_xavier(TOPOS_F32, 2, shape, 0, 2, 1, &err));
  EXPECT_NULL(topos_init_kaiming(TOPOS_F32, 2, shape, -1, 1, &err));
}
END_TEST

/* A small network and a foreign value (from another tape) for the tests
 * below. */
typedef struct fixture {
  topos_network *net;
  topos_value p, loss, foreign;
  topos_tape *other;
} fixture;

static fixture make_fixture(void) {
  fixture f = {0};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *init =
      tt_tensor(TOPOS_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  f.p = topos_parameter(t, init);
  f.loss = topos_sum(t, topos_mul(t, f.p, f.p));
  topos_tensor_release(init);
  f.net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(f.net);
  f.other = topos_tape_new(TOPOS_F64);
  topos_tensor *s = topos_tensor_scalar(TOPOS_F64, 1, &err);
  f.foreign = topos_parameter(f.other, s);
  topos_tensor_release(s);
  return f;
}

static void free_fixture(fixture *f) {
  topos_network_release(f->net);
  topos_tape_free(f->other);
}

START_TEST(foreign_values) {
  fixture f = make_fixture();
  /* A value of another tape, used on this network, is an error. */
  EXPECT_NULL(
      topos_forward_for(f.net, NULL, NULL, 0, &f.foreign, 1, NULL, &err));
  topos_run *run = topos_forward(f.net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  EXPECT_NULL(topos_run_of(run, f.foreign, &err));
  EXPECT_NULL(topos_backward(run, f.foreign, NULL, &err));
  /* A non-rank-0 target is an error too. */
  EXPECT_NULL(topos_backward(run, f.p, NULL, &err));
  topos_field *g = topos_backward(run, f.loss, NULL, &err);
  ck_assert_ptr_nonnull(g);
  EXPECT_NULL(topos_field_of(g, f.foreign, &err));
  ck_assert_ptr_null(topos_network_name_of(f.net, f.foreign));
  int rank = 0;
  ck_assert_ptr_null(topos_network_value_shape(f.net, f.foreign, &rank));
  /* Feeding a parameter or a foreign value as an input is an error. */
  topos_tensor *s = topos_tensor_scalar(TOPOS_F64, 1, &err);
  topos_feed bad[1] = {{f.foreign, s}};
  EXPECT_NULL(topos_forward(f.net, NULL, bad, 1, NULL, &err));
  topos_feed param[1] = {{f.p, s}};
  EXPECT_NULL(topos_forward(f.net, NULL, param, 1, NULL, &err));
  EXPECT_NULL(topos_forward(f.net, NULL, NULL, 3, NULL, &err));
  topos_tensor_release(s);
  /* Recording another tape's value onto this tape sticks an error. */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x = topos_scalar(t, 2);
  ck_assert(!topos_value_ok(topos_add(t, x, f.foreign)));
  ck_assert_ptr_nonnull(strstr(topos_tape_error(t), "another tape"));
  topos_tape_free(t);
  topos_field_free(g);
  topos_run_free(run);
  free_fixture(&f);
}
END_TEST

START_TEST(wrong_dtypes) {
  fixture f = make_fixture();
  /* Parameters of the wrong dtype or shape are refused by forward. */
  topos_tensor *f32 =
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  topos_params *p = topos_params_new(1, &f32, &err);
  ck_assert_ptr_nonnull(p);
  EXPECT_NULL(topos_forward(f.net, p, NULL, 0, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  topos_params_free(p);
  topos_tensor_release(f32);
  /* i32 parameters, i32 arithmetic beyond add, float indices. */
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *i = tt_tensor(TOPOS_I32, 1, (int64_t[]){2}, (double[]){0, 1});
  ck_assert(!topos_value_ok(topos_parameter(t, i)));
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_F32);
  topos_value iv = topos_input(t, i);
  ck_assert(topos_value_ok(topos_add(t, iv, iv)));
  ck_assert(!topos_value_ok(topos_mul(t, iv, iv)));
  ck_assert_ptr_nonnull(strstr(topos_tape_error(t), "i32"));
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_F32);
  topos_tensor *table =
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
  topos_value tv = topos_constant(t, table);
  topos_tensor *fz = topos_tensor_zeros(TOPOS_F32, 1, (int64_t[]){2}, &err);
  topos_value fidx = topos_constant(t, fz);
  topos_tensor_release(fz);
  ck_assert(!topos_value_ok(topos_gather(t, tv, fidx)));
  topos_network *n = topos_tape_seal(t, &err);
  ck_assert_ptr_null(n);
  ck_assert_ptr_nonnull(strstr(err.message, "gather"));
  topos_tensor_release(table);
  topos_tensor_release(i);
  free_fixture(&f);
}
END_TEST

START_TEST(nan_and_huge_sizes) {
  /* A NaN exponent is refused at record time; NaN data flows as IEEE. */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x = topos_scalar(t, 2);
  ck_assert(!topos_value_ok(topos_pow(t, x, NAN)));
  topos_tape_free(t);
  /* Shapes whose element count overflows are refused, never allocated. */
  int64_t huge[3] = {INT64_MAX / 2, 4, 4};
  EXPECT_NULL(topos_tensor_zeros(TOPOS_F32, 3, huge, &err));
  int64_t big[2] = {1 << 30, 1 << 30};
  EXPECT_NULL(topos_tensor_zeros(TOPOS_F64, 2, big, &err));
  t = topos_tape_new(TOPOS_F32);
  x = topos_scalar(t, 1);
  ck_assert(!topos_value_ok(topos_broadcast(t, x, 3, huge)));
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_F32);
  x = topos_scalar(t, 1);
  ck_assert(!topos_value_ok(topos_broadcast_along(t, x, 0, -5)));
  topos_tape_free(t);
  /* Bad hyperparameters. */
  topos_tensor *p0 = topos_tensor_zeros(TOPOS_F32, 1, (int64_t[]){2}, &err);
  topos_params *p = topos_params_new(1, &p0, &err);
  topos_optimizer opt = topos_adam(NAN, 0.9, 0.999, 1e-8);
  topos_opt_state *s = topos_opt_state_new(&opt, p, &err);
  topos_params *po = NULL;
  topos_opt_state *so = NULL;
  if (s) EXPECT_ERR(topos_optimizer_step(&opt, p, p, s, &po, &so, &err));
  ck_assert_ptr_null(po);
  topos_opt_state_free(s);
  topos_params_free(p);
  topos_tensor_release(p0);
}
END_TEST

START_TEST(tape_fail_sticks) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = topos_scalar(t, 1);
  ck_assert(!topos_value_ok(topos_tape_fail(t, TOPOS_ERR_SHAPE, "mine")));
  ck_assert_str_eq(topos_tape_error(t), "mine (at node 1)");
  /* The first error sticks; later recording returns invalid values. */
  topos_tape_fail(t, TOPOS_ERR_ARGUMENT, "second");
  ck_assert(!topos_value_ok(topos_neg(t, x)));
  ck_assert_str_eq(topos_tape_error(t), "mine (at node 1)");
  topos_network *n = topos_tape_seal(t, &err);
  ck_assert_ptr_null(n);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_str_eq(err.message, "mine (at node 1)");
  /* A bogus code becomes an argument error; NULL tape is harmless. */
  t = topos_tape_new(TOPOS_F32);
  topos_tape_fail(t, 0, NULL);
  ck_assert_str_eq(topos_tape_error(t), "failed (at node 0)");
  topos_tape_free(t);
  ck_assert(!topos_value_ok(topos_tape_fail(NULL, 1, "x")));
}
END_TEST

START_TEST(network_accessors_and_many_names) {
  /* 20000 uniquely named nodes record in linear time (a hostile spec with
   * many names must not make replay quadratic), and the index still
   * catches a duplicate and follows a rename. */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x = topos_scalar(t, 1);
  char name[32];
  for (int i = 0; i < 20000; i++) {
    snprintf(name, sizeof name, "n%d", i);
    x = topos_name(t, topos_neg(t, x), name);
    ck_assert(topos_value_ok(x));
  }
  ck_assert(topos_value_ok(topos_name(t, x, "renamed")));
  topos_value y = topos_neg(t, x);
  ck_assert(topos_value_ok(topos_name(t, y, "n19999"))); /* freed by rename */
  ck_assert(!topos_value_ok(topos_name(t, topos_neg(t, y), "n5")));
  ck_assert_ptr_nonnull(strstr(topos_tape_error(t), "already names node 6"));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_BF16);
  x = topos_scalar(t, 2);
  topos_name(t, x, "x");
  topos_network *n = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(n);
  ck_assert_int_eq(topos_network_dtype(n), TOPOS_BF16);
  ck_assert_int_eq(topos_network_value(n, 0).index, 0);
  ck_assert(!topos_value_ok(topos_network_value(n, 1)));
  ck_assert(!topos_value_ok(topos_network_value(n, -1)));
  ck_assert(!topos_value_ok(topos_network_value(NULL, 0)));
  ck_assert_str_eq(topos_network_name_of(n, topos_network_value(n, 0)), "x");
  topos_network_release(n);
}
END_TEST

/* Says stop once it has been asked `limit` times. */
static bool stop_after(void *ctx) {
  int *left = ctx;
  return (*left)-- <= 0;
}

START_TEST(cancel_at_node_boundaries) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *init =
      tt_tensor(TOPOS_F64, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  topos_value p = topos_parameter(t, init);
  topos_tensor_release(init);
  topos_value x = p;
  for (int i = 0; i < 50; i++) x = topos_tanh(t, x);
  topos_value loss = topos_sum(t, x);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);

  /* Forward: stops at the 11th node boundary with CANCELLED. */
  int left = 10;
  topos_exec stop = {.cancel = stop_after, .cancel_ctx = &left};
  err = (topos_error){0};
  ck_assert_ptr_null(topos_forward(net, NULL, NULL, 0, &stop, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);
  ck_assert_int_eq(left, -1); /* asked exactly 11 times: it stopped there */

  /* A plan run stops the same way. */
  topos_entry e = {.roots = &loss, .nroots = 1};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_ptr_nonnull(plan);
  left = 3;
  err = (topos_error){0};
  ck_assert_ptr_null(topos_plan_forward(plan, NULL, NULL, 0, &stop, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);

  /* Backward, from a complete run, stops mid-scan. */
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  left = 5;
  err = (topos_error){0};
  ck_assert_ptr_null(topos_backward(run, loss, &stop, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);
  ck_assert_str_eq(topos_status_name(err.code), "cancelled");

  /* A deadline already past stops a run at its first boundary with
   * DEADLINE; one far ahead lets it finish. */
  topos_exec late = {.deadline_ns = topos_now_ns() - 1};
  err = (topos_error){0};
  ck_assert_ptr_null(topos_forward(net, NULL, NULL, 0, &late, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DEADLINE);
  ck_assert_str_eq(topos_status_name(err.code), "deadline");
  err = (topos_error){0};
  ck_assert_ptr_null(topos_backward(run, loss, &late, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DEADLINE);
  topos_exec ahead = {.deadline_ns = topos_now_ns() + 3600 * 1000000000LL};
  topos_run *done = topos_forward(net, NULL, NULL, 0, &ahead, &err);
  ck_assert_ptr_nonnull(done);
  topos_run_free(done);

  /* Without a check every run completes: the check belongs to the
   * context it was given in, never to the thread. */
  topos_field *g = topos_backward(run, loss, NULL, &err);
  ck_assert_ptr_nonnull(g);
  topos_field_free(g);
  topos_run_free(run);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("hostile");
  tcase_add_test(tc, null_objects);
  tcase_add_test(tc, foreign_values);
  tcase_add_test(tc, wrong_dtypes);
  tcase_add_test(tc, nan_and_huge_sizes);
  tcase_add_test(tc, tape_fail_sticks);
  tcase_add_test(tc, network_accessors_and_many_names);
  tcase_add_test(tc, cancel_at_node_boundaries);
  suite_add_tcase(s, tc);
  return s;
}
