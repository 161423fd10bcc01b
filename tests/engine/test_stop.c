/*
 * test_stop.c - runs stop inside long nodes (kernels.c, exec.c), and the
 * blocks they stop between never change the bits.
 *
 * A cancel callback that counts its calls shows where the engine looks:
 * a run of a few nodes asks once per node at the boundaries, so any call
 * past that count came from inside a node.  The bits of blocked kernels
 * (a matmul, a map, a reduction, a fused convolution and max-pool, each
 * large enough for several blocks) are held against the reference loop
 * computed here, and the reference backend against `auto`; they take a
 * while and are skipped under TOPOS_SKIP_SLOW (valgrind).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* Stops at the `at`-th question (counting from 1); counts every one. */
typedef struct stopper {
  atomic_int calls;
  int at;
} stopper;

static bool stop_at(void *ctx) {
  stopper *s = ctx;
  return atomic_fetch_add(&s->calls, 1) + 1 >= s->at;
}

/* loss = sum(matmul(broadcast(a, [m,k]), broadcast(b, [k,n]))): six
 * nodes, one long. */
static topos_network *matmul_net(int64_t m, int64_t k, int64_t n,
                                 topos_value *loss) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *a0 = topos_tensor_scalar(TOPOS_F32, 0.5, NULL);
  topos_tensor *b0 = topos_tensor_scalar(TOPOS_F32, 0.25, NULL);
  topos_value a = topos_parameter(t, a0), b = topos_parameter(t, b0);
  topos_tensor_release(a0);
  topos_tensor_release(b0);
  topos_value mm = topos_matmul(t, topos_broadcast(t, a, 2, S(m, k)),
                                topos_broadcast(t, b, 2, S(k, n)));
  *loss = topos_sum(t, mm);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  return net;
}

/* A forward of net under backend `backend` that the stopper stops at its
 * 6th question: the 5th is the boundary before the matmul, the next
 * boundary's (before the sum) would not name the matmul, so only a look
 * from inside the matmul stops it there. */
static void expect_stopped_inside(const topos_network *net,
                                  const char *backend) {
  stopper s = {.at = 6};
  topos_exec ex = {.backend = backend, .cancel = stop_at, .cancel_ctx = &s};
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, &ex, &err);
  ck_assert_msg(run == NULL, "%s: the run finished after %d questions", backend,
                atomic_load(&s.calls));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);
  ck_assert_msg(strstr(err.message, "matmul") != NULL &&
                    strstr(err.message, "inside the node") != NULL,
                "%s", err.message);
  /* Without a stop the same context asks many times and finishes. */
  stopper never = {.at = INT32_MAX};
  ex.cancel_ctx = &never;
  run = topos_forward(net, NULL, NULL, 0, &ex, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert_int_gt(atomic_load(&never.calls), 6);
  topos_run_free(run);
}

START_TEST(matmul_stops_inside) {
  topos_backends_register_defaults();
  topos_value loss;
  /* 512 x 512 x 1024: 16 reference blocks of 2^24 multiply-adds, and two
   * GEMM tasks of 2^27 for a backend. */
  topos_network *net = matmul_net(512, 1024, 512, &loss);
  expect_stopped_inside(net, "reference");
  topos_network_release(net);
  net = matmul_net(1024, 1024, 256, &loss);
  expect_stopped_inside(net, NULL); /* auto: the cpu backend's GEMM */
  topos_network_release(net);
}
END_TEST

/* Training runs stop inside the adjoint's matmuls too, and a plan run
 * inside its nodes. */
START_TEST(plan_and_backward_stop_inside) {
  topos_backends_register_defaults();
  topos_value loss;
  topos_network *net = matmul_net(512, 1024, 512, &loss);
  topos_entry e = {
      &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_EXACT};
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  stopper s = {.at = 6};
  topos_exec ex = {.backend = "reference", .cancel = stop_at, .cancel_ctx = &s};
  ck_assert_ptr_null(topos_plan_forward(plan, NULL, NULL, 0, &ex, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);
  ck_assert_msg(strstr(err.message, "inside the node") != NULL, "%s",
                err.message);
  /* The gradients: the scan asks before the sum's and the matmul's
   * adjoints, then inside the adjoint's first matmul. */
  topos_exec plain = {.backend = "reference"};
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, &plain, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  stopper g = {.at = 4};
  ex.cancel_ctx = &g;
  ck_assert_ptr_null(topos_plan_gradients(plan, run, &ex, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_CANCELLED);
  ck_assert_msg(strstr(err.message, "inside the node") != NULL, "%s",
                err.message);
  topos_run_free(run);
  /* A step stops too. */
  stopper st = {.at = 6};
  ex.cancel_ctx = &st;
  topos_optimizer sgd = topos_sgd(0.01, 0);
  topos_step_result res;
  ck_assert_int_eq(
      topos_plan_step(plan, NULL, NULL, 0, &sgd, NULL, &ex, &res, &err),
      TOPOS_ERR_CANCELLED);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* A step asks before its update too: once more than its forward and its
 * gradients together, and stopped there it returns nothing. */
START_TEST(step_asks_before_the_update) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *w0 = topos_tensor_scalar(TOPOS_F64, 0.5, NULL);
  topos_tensor *x0 = topos_tensor_scalar(TOPOS_F64, 2.0, NULL);
  topos_value w = topos_parameter(t, w0), x = topos_input(t, x0);
  topos_tensor_release(w0);
  topos_tensor_release(x0);
  topos_value r = topos_sub(t, topos_mul(t, w, x), topos_scalar(t, 1.0));
  topos_value loss = topos_mul(t, r, r);
  topos_network *net = topos_tape_seal(t, NULL);
  topos_entry e = {
      &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_EXACT};
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_ptr_nonnull(plan);
  stopper f = {.at = INT32_MAX}, g = {.at = INT32_MAX}, s = {.at = INT32_MAX};
  topos_exec ex = {.cancel = stop_at, .cancel_ctx = &f};
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, &ex, &err);
  ck_assert_ptr_nonnull(run);
  ex.cancel_ctx = &g;
  topos_params *grads = topos_plan_gradients(plan, run, &ex, &err);
  ck_assert_ptr_nonnull(grads);
  topos_params_free(grads);
  topos_run_free(run);
  topos_optimizer sgd = topos_sgd(0.1, 0);
  topos_step_result res;
  ex.cancel_ctx = &s;
  ck_assert_int_eq(
      topos_plan_step(plan, NULL, NULL, 0, &sgd, NULL, &ex, &res, &err),
      TOPOS_OK);
  topos_step_result_clear(&res);
  int asked = atomic_load(&s.calls);
  ck_assert_int_eq(asked, atomic_load(&f.calls) + atomic_load(&g.calls) + 1);
  stopper last = {.at = asked};
  ex.cancel_ctx = &last;
  ck_assert_int_eq(
      topos_plan_step(plan, NULL, NULL, 0, &sgd, NULL, &ex, &res, &err),
      TOPOS_ERR_CANCELLED);
  ck_assert_ptr_null(res.params);
  ck_assert_ptr_null(res.run);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------ the bits */

/* v's value from the interpreter under `backend`; *asked is how often it
 * asked to stop (NULL: not wanted). */
static topos_tensor *run_value_asked(const topos_network *net, topos_value v,
                                     const char *backend, int *asked) {
  stopper never = {.at = INT32_MAX};
  topos_exec ex = {.backend = backend, .cancel = stop_at, .cancel_ctx = &never};
  topos_error err = {0};
  topos_run *run = topos_forward_for(net, NULL, NULL, 0, &v, 1, &ex, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  topos_tensor *t = topos_tensor_retain(topos_run_of(run, v, &err));
  topos_run_free(run);
  if (asked) *asked = atomic_load(&never.calls);
  return t;
}

static topos_tensor *run_value(const topos_network *net, topos_value v,
                               const char *backend) {
  return run_value_asked(net, v, backend, NULL);
}

/* A blocked matmul (and its blocked GEMM tasks) gives each output's own
 * fma chain, checked at the rows where blocks begin and end. */
START_TEST(blocked_matmul_bits) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  topos_backends_register_defaults();
  const int64_t m = 300, k = 257, n = 300; /* 23M multiply-adds: 2 blocks */
  topos_tensor *at = tt_random(TOPOS_F32, 2, S(m, k), 1, -1, 1);
  topos_tensor *bt = tt_random(TOPOS_F32, 2, S(k, n), 2, -1, 1);
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value a = topos_input(t, at), b = topos_input(t, bt);
  topos_value mm = topos_matmul(t, a, b);
  topos_network *net = topos_tape_seal(t, NULL);
  int asked = 0;
  topos_tensor *ref = run_value_asked(net, mm, "reference", &asked);
  ck_assert_int_gt(asked, 3); /* three node boundaries, then blocks */
  const float *A = tensor_data(at), *B = tensor_data(bt);
  const float *C = tensor_data(ref);
  int64_t step = ((int64_t)1 << 24) / (k * n);
  const int64_t rows[] = {0, step - 1, step, step + 1, m - 1};
  for (int r = 0; r < 5; r++) {
    int64_t i = rows[r];
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      for (int64_t kk = 0; kk < k; kk++)
        acc = fmaf(A[i * k + kk], B[kk * n + j], acc);
      ck_assert_msg(memcmp(&acc, &C[i * n + j], sizeof acc) == 0,
                    "row %lld col %lld", (long long)i, (long long)j);
    }
  }
  /* The exact backends agree bit for bit, in blocks of their own. */
  topos_tensor *got = run_value(net, mm, NULL);
  ck_assert(topos_tensor_bitwise_equal(ref, got));
  topos_tensor_release(got);
  topos_tensor_release(ref);
  topos_tensor_release(at);
  topos_tensor_release(bt);
  topos_network_release(net);
}
END_TEST

/* Maps and reductions over several blocks: the reference and auto agree,
 * and the map's elements are libm's. */
START_TEST(blocked_map_and_rows_bits) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  topos_backends_register_defaults();
  const int64_t rows = 1024, cols = 4100; /* 4.2M elements: 5 map blocks */
  topos_tensor *xt = tt_random(TOPOS_F32, 2, S(rows, cols), 3, -2, 2);
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = topos_input(t, xt);
  topos_value th = topos_tanh(t, x);
  topos_value sa = topos_sum_along(t, th, 1);
  topos_value ls = topos_log_softmax(t, x, 1);
  topos_value mx = topos_max_along(t, topos_transpose(t, x), 1);
  topos_network *net = topos_tape_seal(t, NULL);
  int asked = 0;
  topos_tensor *r1 = run_value_asked(net, th, "reference", &asked);
  ck_assert_int_ge(asked, 2 + 4); /* two boundaries, five map blocks */
  const float *X = tensor_data(xt), *Y = tensor_data(r1);
  for (int64_t i = 0; i < rows * cols; i += 997) {
    float want = tanhf(X[i]);
    ck_assert_msg(memcmp(&want, &Y[i], sizeof want) == 0, "element %lld",
                  (long long)i);
  }
  const topos_value vs[4] = {th, sa, ls, mx};
  for (int k = 0; k < 4; k++) {
    topos_tensor *a = run_value(net, vs[k], "reference");
    topos_tensor *b = run_value(net, vs[k], NULL);
    ck_assert_msg(topos_tensor_bitwise_equal(a, b), "value %d", k);
    topos_tensor_release(a);
    topos_tensor_release(b);
  }
  topos_tensor_release(r1);
  topos_tensor_release(xt);
  topos_network_release(net);
}
END_TEST

/* Fused convolution (blocks of output rows, shifted padding) and max-pool
 * (blocks of images) against the interpreter's unfused chain. */
START_TEST(blocked_windows_bits) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d == 0 ? TOPOS_F32 : TOPOS_F64;
    /* conv: a 2.4M multiply-add output row, so 7 rows a block; pool: 10
     * images of 262k window reads, 4 a block. */
    topos_tensor *xt = tt_random(dt, 4, S(2, 64, 40, 64), 4, -1, 1);
    topos_tensor *wt = tt_random(dt, 4, S(64, 64, 3, 3), 5, -0.1, 0.1);
    topos_tensor *pt = tt_random(dt, 4, S(10, 16, 128, 128), 6, -1, 1);
    topos_tape *t = topos_tape_new(dt);
    topos_value x = topos_input(t, xt), w = topos_parameter(t, wt);
    topos_value p = topos_input(t, pt);
    topos_value conv = topos_conv2d(t, x, w, TOPOS_NONE, 1, 1, 1);
    topos_value pool = topos_max_pool2d(t, p, 2, 2);
    topos_network *net = topos_tape_seal(t, NULL);
    const topos_value outs[2] = {conv, pool};
    topos_entry e = {
        outs, 2, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
    topos_error err = {0};
    topos_plan *plan = topos_network_lower(net, &e, &err);
    ck_assert_msg(plan != NULL, "%s", err.message);
    ck_assert_int_eq(topos_plan_group_count(plan), 2);
    for (int b = 0; b < 2; b++) {
      stopper never = {.at = INT32_MAX};
      topos_exec ex = {.backend = b == 0 ? "reference" : NULL,
                       .cancel = stop_at,
                       .cancel_ctx = &never};
      topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, &ex, &err);
      ck_assert_msg(run != NULL, "%s", err.message);
      /* Five steps; the reference convolution has 12 blocks and the
       * max-pool 3. */
      if (b == 0) ck_assert_int_ge(atomic_load(&never.calls), 5 + 11 + 2);
      for (int k = 0; k < 2; k++) {
        topos_tensor *ref = run_value(net, outs[k], "reference");
        ck_assert_msg(
            topos_tensor_bitwise_equal(ref, topos_run_of(run, outs[k], &err)),
            "dtype %d backend %d output %d", d, b, k);
        topos_tensor_release(ref);
      }
      topos_run_free(run);
    }
    topos_plan_free(plan);
    topos_network_release(net);
    topos_tensor_release(xt);
    topos_tensor_release(wt);
    topos_tensor_release(pt);
  }
}
END_TEST

Suite *stop_suite(void) {
  Suite *s = suite_create("stop");
  TCase *tc = tcase_create("inside");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, matmul_stops_inside);
  tcase_add_test(tc, plan_and_backward_stop_inside);
  tcase_add_test(tc, step_asks_before_the_update);
  suite_add_tcase(s, tc);
  tc = tcase_create("bits");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, blocked_matmul_bits);
  tcase_add_test(tc, blocked_map_and_rows_bits);
  tcase_add_test(tc, blocked_windows_bits);
  suite_add_tcase(s, tc);
  return s;
}
