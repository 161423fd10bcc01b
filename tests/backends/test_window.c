/*
 * test_window.c - the `cpu` backend's windowed product (the fused
 * convolution of plans, TOPOS_TASK_WINDOW).
 *
 * Every check is bit for bit (memcmp): group_eval with the backend chain
 * on against group_eval with it off (the reference K(conv_window)), over
 * LeNet-like shapes and odd geometries (stride 2, pad 1, dilation 2, 1x1
 * kernels, O = 1, 7, 16, 17, C = 1, 3), f32 and f64, transposed weights,
 * thread counts 1..4, every microkernel ISA this CPU has, NaN/Inf/-0
 * inputs and tiny products whose accumulators are -0 (so a padded
 * position's fma with 0 matters); then whole CNN forward plans with and
 * without the backend.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static void restore(void) {
  backend_set_threads(0);
  topos_cpu_force_isa(NULL);
}

typedef enum values {
  V_RANDOM = 0, /* uniform in [-1, 1) */
  V_SPECIAL,    /* NaN, ±Inf, ±0, subnormals, huge, mixed with ordinary */
  V_TINY,       /* products that underflow: accumulators stay -0 */
} values;

typedef struct geom {
  int64_t N, C, H, W, O, kh, kw, stride, pad, dil;
} geom;

static uint64_t rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* A tensor of `count` values of kind v (weight = true picks the weight's
 * tiny sign pattern). */
static topos_tensor *make_values(topos_dtype d, int rank, const int64_t *shape,
                                 values v, bool weight, uint64_t seed) {
  if (v == V_RANDOM) return tt_random(d, rank, shape, seed, -1, 1);
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *vals = malloc(sizeof(double) * (size_t)n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  const double tiny = d == TOPOS_F32 ? 1e-30 : 1e-200;
  const double special[10] = {NAN,  INFINITY, -INFINITY, -0.0, 0.0,
                              tiny, -tiny,    1e300,     -3.0, 0.5};
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rng(&s);
    if (v == V_SPECIAL)
      vals[i] = r % 4 == 0 ? special[(r >> 8) % 10]
                           : (double)((int64_t)(r >> 20) % 1000) / 250.0;
    else /* x negative tiny, weight positive tiny: every product -0 */
      vals[i] =
          weight ? tiny * (1 + (double)(r % 7)) : -tiny * (1 + (double)(r % 5));
  }
  topos_tensor *t = tt_tensor(d, rank, shape, vals);
  free(vals);
  return t;
}

/* One geometry: group_eval with the chain off (the reference) against
 * the chain on, at threads 1..4; the weight [C·kh·kw, O] row-major or a
 * transposed view of [O, C·kh·kw]. */
static void check_geom(topos_dtype d, geom ge, bool wtrans, values v,
                       uint64_t seed) {
  topos_backends_register_defaults();
  int64_t K = ge.C * ge.kh * ge.kw;
  plan_group g = {.kind = GROUP_CONV,
                  .head = -1,
                  .x = -1,
                  .weight = -1,
                  .N = ge.N,
                  .C = ge.C,
                  .H = ge.H,
                  .W = ge.W,
                  .kh = ge.kh,
                  .kw = ge.kw,
                  .nout = ge.O,
                  .stride_h = ge.stride,
                  .stride_w = ge.stride,
                  .dil_h = ge.dil,
                  .dil_w = ge.dil,
                  .pad_top = ge.pad,
                  .pad_bottom = ge.pad,
                  .pad_left = ge.pad,
                  .pad_right = ge.pad};
  g.oh = (ge.H + 2 * ge.pad - ge.dil * (ge.kh - 1) - 1) / ge.stride + 1;
  g.ow = (ge.W + 2 * ge.pad - ge.dil * (ge.kw - 1) - 1) / ge.stride + 1;
  ck_assert_int_ge(g.oh, 1);
  ck_assert_int_ge(g.ow, 1);
  topos_tensor *x =
      make_values(d, 4, S(ge.N, ge.C, ge.H, ge.W), v, false, seed);
  topos_tensor *w = NULL, *wbase = NULL;
  topos_error err = {0};
  if (wtrans) {
    wbase = make_values(d, 2, S(ge.O, K), v, true, seed + 1);
    w = topos_tensor_transpose(wbase, &err);
    ck_assert_ptr_nonnull(w);
  } else {
    w = make_values(d, 2, S(K, ge.O), v, true, seed + 1);
  }
  tensor_meta out = {.dtype = d, .rank = 2};
  out.shape[0] = ge.N * g.oh * g.ow;
  out.shape[1] = ge.O;
  unsigned long long before = topos_cpu_tasks_run();
  const topos_tensor *ins[2] = {x, w};
  topos_tensor *ref = group_eval(&g, &out, ins, NULL, &err);
  ck_assert_msg(ref != NULL, "%s", err.message);
  ck_assert_int_eq(topos_cpu_tasks_run(), before);
  for (int th = 1; th <= 4; th++) {
    backend_set_threads(th);
    before = topos_cpu_tasks_run();
    exec_env env;
    ck_assert_int_eq(exec_resolve(NULL, &env, &err), TOPOS_OK);
    topos_tensor *got = exec_group(&env, &g, &out, ins, NULL, &err);
    ck_assert_msg(got != NULL, "%s", err.message);
    ck_assert_int_eq(topos_cpu_tasks_run(), before + 1);
    ck_assert_msg(topos_tensor_bitwise_equal(ref, got),
                  "%s N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld p%lld d%lld "
                  "wtrans %d values %d threads %d isa %s: bits differ",
                  topos_dtype_name(d), (long long)ge.N, (long long)ge.C,
                  (long long)ge.H, (long long)ge.W, (long long)ge.O,
                  (long long)ge.kh, (long long)ge.kw, (long long)ge.stride,
                  (long long)ge.pad, (long long)ge.dil, wtrans, (int)v, th,
                  topos_cpu_isa());
    topos_tensor_release(got);
  }
  backend_set_threads(0);
  topos_tensor_release(ref);
  topos_tensor_release(x);
  topos_tensor_release(w);
  topos_tensor_release(wbase);
}

/* LeNet-like layers and odd geometries. */
static const geom geoms[] = {
    {4, 1, 28, 28, 8, 3, 3, 1, 1, 1},   /* LeNet conv1 */
    {4, 8, 14, 14, 16, 3, 3, 1, 1, 1},  /* LeNet conv2 */
    {2, 1, 28, 28, 6, 5, 5, 1, 0, 1},   /* classic LeNet-5 conv1 */
    {2, 6, 12, 12, 16, 5, 5, 1, 0, 1},  /* classic LeNet-5 conv2 */
    {3, 3, 11, 9, 7, 3, 3, 2, 1, 1},    /* stride 2, pad 1 */
    {2, 3, 13, 12, 17, 3, 3, 1, 2, 2},  /* dilation 2, pad 2 */
    {2, 3, 10, 11, 1, 3, 2, 1, 1, 1},   /* O = 1, rectangular kernel */
    {3, 1, 7, 7, 16, 1, 1, 1, 0, 1},    /* 1x1 */
    {2, 3, 9, 8, 17, 1, 1, 2, 1, 1},    /* 1x1, stride 2, pad 1 */
    {1, 3, 5, 5, 33, 3, 3, 1, 1, 1},    /* O past two panels */
    {2, 2, 6, 7, 7, 4, 4, 3, 2, 2},     /* stride 3, dilation 2 */
    {1, 1, 1, 1, 1, 1, 1, 1, 0, 1},     /* one output */
    {1, 1, 2, 2, 3, 3, 3, 1, 1, 1},     /* every output padded */
    {2, 64, 6, 6, 20, 3, 3, 1, 1, 1},   /* K = 576 > KC: k blocks */
    {1, 300, 4, 4, 9, 3, 3, 1, 1, 1},   /* K = 2700: several k blocks */
    {8, 16, 16, 16, 32, 3, 3, 1, 1, 1}, /* big enough to thread */
};
#define NGEOMS ((int)(sizeof geoms / sizeof geoms[0]))

START_TEST(geometries) {
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    check_geom(dt, geoms[_i], false, V_RANDOM, 100 + (uint64_t)_i);
    check_geom(dt, geoms[_i], true, V_RANDOM, 200 + (uint64_t)_i);
  }
  restore();
}
END_TEST

START_TEST(special_values) {
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    for (int i = 0; i < NGEOMS; i++) {
      check_geom(dt, geoms[i], i % 2, V_SPECIAL, 300 + (uint64_t)i);
      check_geom(dt, geoms[i], i % 2, V_TINY, 400 + (uint64_t)i);
    }
  }
  restore();
}
END_TEST

/* The tiny-product case really does depend on fma'ing padded positions:
 * an interior output is -0 and a padded one +0. */
START_TEST(negative_zero_accumulators) {
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    plan_group g = {.kind = GROUP_CONV,
                    .N = 1,
                    .C = 1,
                    .H = 5,
                    .W = 5,
                    .kh = 3,
                    .kw = 3,
                    .oh = 5,
                    .ow = 5,
                    .nout = 3,
                    .stride_h = 1,
                    .stride_w = 1,
                    .dil_h = 1,
                    .dil_w = 1,
                    .pad_top = 1,
                    .pad_bottom = 1,
                    .pad_left = 1,
                    .pad_right = 1};
    topos_tensor *x = make_values(dt, 4, S(1, 1, 5, 5), V_TINY, false, 5);
    topos_tensor *w = make_values(dt, 2, S(9, 3), V_TINY, true, 6);
    tensor_meta out = {.dtype = dt, .rank = 2, .shape = {25, 3}};
    topos_error err = {0};
    for (int th = 1; th <= 2; th++) {
      backend_set_threads(th);
      const topos_tensor *ins[2] = {x, w};
      topos_tensor *got = group_eval(&g, &out, ins, NULL, &err);
      ck_assert_ptr_nonnull(got);
      double corner = topos_tensor_get(got, S(24, 0), &err);
      double centre = topos_tensor_get(got, S(12, 1), &err);
      ck_assert(corner == 0.0 && !signbit(corner)); /* padding last: +0 */
      /* interior: -0, where fma rounds the tiny product once (not under
       * valgrind's emulation, which gives +0 in both paths) */
      ck_assert(centre == 0.0 &&
                (signbit(centre) != 0) == tt_fma_rounds_once(dt));
      topos_tensor_release(got);
    }
    topos_tensor_release(x);
    topos_tensor_release(w);
  }
  restore();
}
END_TEST

/* Each microkernel family this CPU can run. */
START_TEST(every_isa) {
  const char *isas[] = {"avx512", "avx2", "c"};
  int ran = 0;
  for (int i = 0; i < 3; i++) {
    if (topos_cpu_force_isa(isas[i]) != 0) continue;
    ran++;
    for (int k = 0; k < NGEOMS; k++) {
      topos_dtype dt = k % 2 ? TOPOS_F64 : TOPOS_F32;
      check_geom(dt, geoms[k], k % 3 == 0, (values)(k % 3), 500 + (uint64_t)k);
    }
  }
  ck_assert_int_ge(ran, 1);
  restore();
}
END_TEST

/* A max-pool over a batch large enough for units of images on the
 * threads (kernel_window): at 2 and 3 threads the bits of one thread,
 * special values included, for the common 2x2 window and a general one
 * (3x3, stride 2, padded), both dtypes. */
START_TEST(pool_threads) {
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++)
    for (int shape = 0; shape < 2; shape++) {
      topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
      plan_group g = {.kind = GROUP_POOL,
                      .head = -1,
                      .x = -1,
                      .weight = -1,
                      .N = 17,
                      .C = 6,
                      .H = 28,
                      .W = 28,
                      .kh = 2,
                      .kw = 2,
                      .stride_h = 2,
                      .stride_w = 2,
                      .dil_h = 1,
                      .dil_w = 1};
      if (shape == 1) {
        g.kh = g.kw = 3;
        g.pad_top = g.pad_left = g.pad_bottom = g.pad_right = 1;
      }
      g.oh = (g.H + g.pad_top + g.pad_bottom - g.kh) / g.stride_h + 1;
      g.ow = (g.W + g.pad_left + g.pad_right - g.kw) / g.stride_w + 1;
      topos_tensor *x =
          make_values(dt, 4, S(g.N, g.C, g.H, g.W), V_SPECIAL, false, 77 + d);
      size_t es = d ? sizeof(double) : sizeof(float);
      size_t out_bytes = (size_t)(g.N * g.C * g.oh * g.ow) * es;
      char *want = malloc(out_bytes), *got = malloc(out_bytes);
      for (int threads = 1; threads <= 3; threads++) {
        topos_exec ctx = {.threads = threads};
        exec_env env;
        topos_error err = {0};
        ck_assert_int_eq(exec_resolve(&ctx, &env, &err), TOPOS_OK);
        memset(got, 0x5a, out_bytes);
        ck_assert_int_eq(
            kernel_window(&env, &g, dt, tensor_data(x), NULL, 0, 0, got, &err),
            0);
        if (threads == 1)
          memcpy(want, got, out_bytes);
        else
          ck_assert_msg(memcmp(want, got, out_bytes) == 0,
                        "%s shape %d threads %d: bits differ",
                        topos_dtype_name(dt), shape, threads);
      }
      free(want);
      free(got);
      topos_tensor_release(x);
    }
  restore();
}
END_TEST

START_TEST(supports) {
  const topos_backend *be = topos_cpu_backend();
  float xs[16] = {0}, ws[4] = {0}, os[16];
  topos_task t = {.kind = TOPOS_TASK_WINDOW, .threads = 1};
  t.u.window = (topos_window_task){.dtype = TOPOS_F32,
                                   .n = 1,
                                   .c = 1,
                                   .h = 4,
                                   .w = 4,
                                   .x = xs,
                                   .o = 1,
                                   .weight = ws,
                                   .w_row = 1,
                                   .w_col = 1,
                                   .kh = 2,
                                   .kw = 2,
                                   .stride_h = 1,
                                   .stride_w = 1,
                                   .dil_h = 1,
                                   .dil_w = 1,
                                   .oh = 3,
                                   .ow = 3,
                                   .out = os};
  ck_assert(be->supports(be, &t));
  topos_error err = {0};
  ck_assert_int_eq(be->run(be, &t, &err), TOPOS_OK);
  t.u.window.dtype = TOPOS_BF16;
  ck_assert(!be->supports(be, &t));
  t.u.window.dtype = TOPOS_F32;
  t.u.window.o = 0;
  ck_assert(!be->supports(be, &t));
  t.u.window.o = 1;
  t.u.window.stride_h = 0;
  ck_assert(!be->supports(be, &t));
  t.u.window.stride_h = 1;
  t.u.window.n = INT64_MAX / 2;
  ck_assert(!be->supports(be, &t));
}
END_TEST

/* --------------------------------------------------- whole CNN forward */

static topos_value param_of(topos_tape *t, topos_dtype d, int rank,
                            const int64_t *shape, uint64_t seed, double lo,
                            double hi) {
  topos_tensor *x = tt_random(d, rank, shape, seed, lo, hi);
  topos_value v = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(v));
  return v;
}

/* LeNet-like: conv 8 (3x3, pad 1) -> relu -> pool 2 -> conv 16 (3x3,
 * pad 1) -> relu -> pool 2 -> conv 7 (1x1, stride 2, dilation 1) ->
 * linear 10 on 28x28 images; a forward plan (fused groups) with the chain
 * off and on, threads 1..4. */
START_TEST(cnn_forward_plan) {
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    const int64_t B = 16;
    topos_tape *t = topos_tape_new(dt);
    topos_value w1 = param_of(t, dt, 4, S(8, 1, 3, 3), 41, -0.5, 0.5);
    topos_value b1 = param_of(t, dt, 1, S(8), 42, -0.1, 0.1);
    topos_value w2 = param_of(t, dt, 4, S(16, 8, 3, 3), 43, -0.2, 0.2);
    topos_value b2 = param_of(t, dt, 1, S(16), 44, -0.1, 0.1);
    topos_value w3 = param_of(t, dt, 4, S(7, 16, 1, 1), 45, -0.2, 0.2);
    topos_value w4 = param_of(t, dt, 2, S(7 * 5 * 5, 10), 46, -0.1, 0.1);
    topos_tensor *xt = tt_random(dt, 4, S(B, 1, 28, 28), 47, 0, 1);
    topos_value x = topos_input(t, xt);
    topos_value h = topos_relu(t, topos_conv2d(t, x, w1, b1, 1, 1, 1));
    h = topos_max_pool2d(t, h, 2, 2);
    h = topos_relu(t, topos_conv2d(t, h, w2, b2, 1, 1, 1));
    h = topos_max_pool2d(t, h, 2, 2);
    h = topos_conv2d(t, h, w3, TOPOS_NONE, 2, 1, 1);
    h = topos_reshape(t, h, 2, S(B, 7 * 5 * 5));
    topos_value logits = topos_linear(t, h, w4, TOPOS_NONE);
    const char *e = topos_tape_error(t);
    ck_assert_msg(e == NULL, "record: %s", e);
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_msg(net != NULL, "seal: %s", err.message);
    topos_entry en = {
        &logits, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
    topos_plan *plan = topos_network_lower(net, &en, &err);
    ck_assert_msg(plan != NULL, "lower: %s", err.message);
    ck_assert_int_ge(topos_plan_group_count(plan), 3);
    topos_run *ref =
        topos_plan_forward(plan, NULL, NULL, 0, &TEST_REFERENCE, &err);
    ck_assert_msg(ref != NULL, "%s", err.message);
    for (int th = 1; th <= 4; th++) {
      backend_set_threads(th);
      unsigned long long before = topos_cpu_tasks_run();
      topos_run *got = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
      ck_assert_msg(got != NULL, "%s", err.message);
      ck_assert_int_ge(topos_cpu_tasks_run(), before + 3);
      const topos_tensor *a = topos_run_of(ref, logits, &err);
      const topos_tensor *b = topos_run_of(got, logits, &err);
      ck_assert_msg(a && b && topos_tensor_bitwise_equal(a, b),
                    "%s threads %d: logits differ", topos_dtype_name(dt), th);
      topos_run_free(got);
    }
    topos_run_free(ref);
    topos_plan_free(plan);
    topos_network_release(net);
    topos_tensor_release(xt);
  }
  restore();
}
END_TEST

Suite *window_suite(void) {
  Suite *s = suite_create("window");
  TCase *tc = tcase_create("window");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, supports);
  tcase_add_test(tc, pool_threads);
  tcase_add_loop_test(tc, geometries, 0, NGEOMS);
  tcase_add_test(tc, special_values);
  tcase_add_test(tc, negative_zero_accumulators);
  tcase_add_test(tc, every_isa);
  tcase_add_test(tc, cnn_forward_plan);
  suite_add_tcase(s, tc);
  return s;
}
