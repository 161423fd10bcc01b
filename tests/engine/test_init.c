/*
 * test_init.c - seeded initializers: reproducibility, the exact
 * generator and transforms (against an independent splitmix64 written
 * here), ranges and moments of the distributions, dtype rounding, and
 * argument validation.
 */
#include "testutil.h"

/* splitmix64 as published (Vigna): the test's own copy. */
static uint64_t ref_splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static const int64_t shape_2x3[2] = {2, 3};

/* Mean and (population) standard deviation of a tensor's elements. */
static void moments(const topos_tensor *t, double *mean, double *std) {
  int64_t n = topos_tensor_count(t);
  double *v = tt_values(t);
  double s = 0, ss = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
  *std = sqrt(ss / (double)n);
  free(v);
}

START_TEST(test_reference_generator_vector) {
  /* The published first outputs of splitmix64 seeded with 0 (checks the
   * test's reference before it is used to check the engine). */
  uint64_t s = 0;
  ck_assert_uint_eq(ref_splitmix(&s), 0xE220A8397B1DCDAFull);
  ck_assert_uint_eq(ref_splitmix(&s), 0x6E789E6AA1B965F4ull);
  ck_assert_uint_eq(ref_splitmix(&s), 0x06C45D188009454Full);
}
END_TEST

START_TEST(test_uniform_exact_values) {
  topos_error err = {0};
  const double low = -2, high = 3;
  topos_tensor *t =
      topos_init_uniform(TOPOS_F64, 2, shape_2x3, low, high, 42, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  ck_assert(topos_tensor_is_contiguous(t));
  ck_assert_int_eq(topos_tensor_dtype(t), TOPOS_F64);
  uint64_t s = 42;
  double want[6];
  for (int i = 0; i < 6; i++)
    want[i] = low + (high - low) * ((double)(ref_splitmix(&s) >> 11) * 0x1p-53);
  tt_assert_values(t, want, 6);
  /* The same draws rounded to f32 and bf16. */
  topos_tensor *f =
      topos_init_uniform(TOPOS_F32, 2, shape_2x3, low, high, 42, &err);
  topos_tensor *b =
      topos_init_uniform(TOPOS_BF16, 2, shape_2x3, low, high, 42, &err);
  ck_assert(f && b);
  double wf[6], wb[6];
  for (int i = 0; i < 6; i++) {
    wf[i] = (double)(float)want[i];
    wb[i] = topos_bf16_to_f32(topos_bf16_from_f32((float)want[i]));
  }
  tt_assert_values(f, wf, 6);
  tt_assert_values(b, wb, 6);
  topos_tensor_release(t);
  topos_tensor_release(f);
  topos_tensor_release(b);
}
END_TEST

START_TEST(test_normal_exact_values) {
  topos_error err = {0};
  const double mean = 0.5, std = 2;
  /* 5 elements: two full Box-Muller pairs and half of a third. */
  topos_tensor *t =
      topos_init_normal(TOPOS_F64, 1, (int64_t[]){5}, mean, std, 7, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  uint64_t s = 7;
  double want[6];
  for (int i = 0; i < 6; i += 2) {
    double u1 = (double)((ref_splitmix(&s) >> 11) + 1) * 0x1p-53;
    double u2 = (double)(ref_splitmix(&s) >> 11) * 0x1p-53;
    double r = sqrt(-2.0 * log(u1));
    want[i] = mean + std * (r * cos(6.283185307179586 * u2));
    want[i + 1] = mean + std * (r * sin(6.283185307179586 * u2));
  }
  tt_assert_values(t, want, 5);
  /* A longer tensor starts with the same elements (the stream depends on
   * the seed only). */
  topos_tensor *longer =
      topos_init_normal(TOPOS_F64, 1, (int64_t[]){6}, mean, std, 7, &err);
  tt_assert_values(longer, want, 6);
  topos_tensor_release(t);
  topos_tensor_release(longer);
}
END_TEST

START_TEST(test_same_seed_same_bits) {
  topos_error err = {0};
  topos_dtype dts[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  int64_t shape[3] = {4, 5, 6};
  for (int d = 0; d < 3; d++) {
    topos_tensor *a[4], *b[4], *c[4];
    for (int k = 0; k < 3; k++) {
      uint64_t seed = k == 2 ? 1235 : 1234;
      topos_tensor **out = k == 0 ? a : k == 1 ? b : c;
      out[0] = topos_init_uniform(dts[d], 3, shape, -1, 1, seed, &err);
      out[1] = topos_init_normal(dts[d], 3, shape, 0, 1, seed, &err);
      out[2] = topos_init_xavier(dts[d], 3, shape, 30, 20, seed, &err);
      out[3] = topos_init_kaiming(dts[d], 3, shape, 30, seed, &err);
      for (int i = 0; i < 4; i++) ck_assert_ptr_nonnull(out[i]);
    }
    for (int i = 0; i < 4; i++) {
      ck_assert_msg(topos_tensor_bitwise_equal(a[i], b[i]), "dtype %d init %d",
                    d, i);
      ck_assert_msg(!topos_tensor_bitwise_equal(a[i], c[i]),
                    "dtype %d init %d: seeds 1234 and 1235 agree", d, i);
      topos_tensor_release(a[i]);
      topos_tensor_release(b[i]);
      topos_tensor_release(c[i]);
    }
  }
}
END_TEST

START_TEST(test_uniform_range_and_mean) {
  topos_error err = {0};
  const int64_t n = 100000;
  topos_tensor *t =
      topos_init_uniform(TOPOS_F64, 1, (int64_t[]){n}, 3, 5, 99, &err);
  ck_assert_ptr_nonnull(t);
  double *v = tt_values(t);
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    ck_assert(v[i] >= 3 && v[i] < 5);
    lo = fmin(lo, v[i]);
    hi = fmax(hi, v[i]);
  }
  ck_assert(lo < 3.001 && hi > 4.999); /* it spans the range */
  free(v);
  double mean, std;
  moments(t, &mean, &std);
  /* Mean 4, std 2/sqrt(12) = 0.577; the mean's error is ~0.0018. */
  ck_assert_msg(fabs(mean - 4) < 0.01, "mean %g", mean);
  ck_assert_msg(fabs(std - 2 / sqrt(12)) < 0.01, "std %g", std);
  topos_tensor_release(t);

  /* f32 and bf16 stay within [low, high] after rounding. */
  topos_dtype dts[2] = {TOPOS_F32, TOPOS_BF16};
  for (int d = 0; d < 2; d++) {
    t = topos_init_uniform(dts[d], 1, (int64_t[]){10000}, -0.25, 0.75, 5, &err);
    v = tt_values(t);
    for (int64_t i = 0; i < 10000; i++)
      ck_assert(v[i] >= -0.25 && v[i] <= 0.75);
    free(v);
    topos_tensor_release(t);
  }
}
END_TEST

START_TEST(test_normal_statistics) {
  topos_error err = {0};
  const int64_t n = 100000;
  topos_tensor *t =
      topos_init_normal(TOPOS_F64, 1, (int64_t[]){n}, 2, 3, 2024, &err);
  ck_assert_ptr_nonnull(t);
  double mean, std;
  moments(t, &mean, &std);
  /* Standard errors: 3/sqrt(n) = 0.0095 for the mean, ~0.0067 for the
   * std; allow five of them. */
  ck_assert_msg(fabs(mean - 2) < 0.05, "mean %g", mean);
  ck_assert_msg(fabs(std - 3) < 0.035, "std %g", std);
  /* Roughly 68% within one std. */
  double *v = tt_values(t);
  int64_t inside = 0;
  for (int64_t i = 0; i < n; i++) inside += fabs(v[i] - 2) < 3;
  ck_assert_msg(fabs((double)inside / (double)n - 0.6827) < 0.01, "%lld",
                (long long)inside);
  free(v);
  topos_tensor_release(t);

  /* std 0 gives the mean everywhere. */
  t = topos_init_normal(TOPOS_F32, 2, shape_2x3, -1.5, 0, 1, &err);
  ck_assert_ptr_nonnull(t);
  tt_assert_values(t, ((double[]){-1.5, -1.5, -1.5, -1.5, -1.5, -1.5}), 6);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_normal_rounding_per_dtype) {
  topos_error err = {0};
  int64_t shape[1] = {101};
  topos_tensor *d = topos_init_normal(TOPOS_F64, 1, shape, 0.1, 1.3, 77, &err);
  topos_tensor *f = topos_init_normal(TOPOS_F32, 1, shape, 0.1, 1.3, 77, &err);
  topos_tensor *b = topos_init_normal(TOPOS_BF16, 1, shape, 0.1, 1.3, 77, &err);
  ck_assert(d && f && b);
  ck_assert_int_eq(topos_tensor_dtype(b), TOPOS_BF16);
  double *v = tt_values(d);
  double wf[101], wb[101];
  for (int i = 0; i < 101; i++) {
    wf[i] = (double)(float)v[i];
    wb[i] = topos_bf16_to_f32(topos_bf16_from_f32((float)v[i]));
  }
  tt_assert_values(f, wf, 101);
  tt_assert_values(b, wb, 101);
  free(v);
  topos_tensor_release(d);
  topos_tensor_release(f);
  topos_tensor_release(b);
}
END_TEST

START_TEST(test_xavier_bound) {
  topos_error err = {0};
  const int64_t fan_in = 50, fan_out = 30;
  int64_t shape[2] = {fan_in, fan_out * 100};
  topos_tensor *t =
      topos_init_xavier(TOPOS_F64, 2, shape, fan_in, fan_out, 3, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  const double a = sqrt(6.0 / (double)(fan_in + fan_out));
  int64_t n = topos_tensor_count(t);
  double *v = tt_values(t);
  double top = 0;
  for (int64_t i = 0; i < n; i++) {
    ck_assert(v[i] >= -a && v[i] < a);
    top = fmax(top, fabs(v[i]));
  }
  ck_assert(top > 0.999 * a);
  free(v);
  double mean, std;
  moments(t, &mean, &std);
  ck_assert_msg(fabs(mean) < 0.01 * a, "mean %g", mean);
  ck_assert_msg(fabs(std - a / sqrt(3)) < 0.01 * a, "std %g", std);
  /* Exactly uniform(-a, a) with the same seed. */
  topos_tensor *u = topos_init_uniform(TOPOS_F64, 2, shape, -a, a, 3, &err);
  ck_assert(topos_tensor_bitwise_equal(t, u));
  topos_tensor_release(u);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_kaiming_std) {
  topos_error err = {0};
  const int64_t fan_in = 128;
  int64_t shape[2] = {fan_in, 800};
  topos_tensor *t = topos_init_kaiming(TOPOS_F64, 2, shape, fan_in, 11, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  double mean, std;
  moments(t, &mean, &std);
  const double want = sqrt(2.0 / fan_in); /* 0.125 */
  ck_assert_msg(fabs(mean) < 0.005 * 1.0, "mean %g", mean);
  ck_assert_msg(fabs(std - want) < 0.02 * want, "std %g want %g", std, want);
  topos_tensor *nrm =
      topos_init_normal(TOPOS_F64, 2, shape, 0, sqrt(2.0 / fan_in), 11, &err);
  ck_assert(topos_tensor_bitwise_equal(t, nrm));
  topos_tensor_release(nrm);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_scalar_and_empty) {
  topos_error err = {0};
  topos_tensor *s = topos_init_uniform(TOPOS_F32, 0, NULL, 0, 1, 5, &err);
  ck_assert_msg(s != NULL, "%s", err.message);
  ck_assert_int_eq(topos_tensor_rank(s), 0);
  ck_assert_int_eq(topos_tensor_count(s), 1);
  topos_tensor_release(s);
  topos_tensor *e =
      topos_init_normal(TOPOS_F64, 2, (int64_t[]){3, 0}, 0, 1, 5, &err);
  ck_assert_msg(e != NULL, "%s", err.message);
  ck_assert_int_eq(topos_tensor_count(e), 0);
  topos_tensor_release(e);
}
END_TEST

/* Expects NULL and `code`. */
static void fails(topos_tensor *t, topos_error *err, int code,
                  const char *what) {
  ck_assert_msg(t == NULL, "%s: succeeded", what);
  ck_assert_msg(err->code == code, "%s: code %d want %d (%s)", what, err->code,
                code, err->message);
  ck_assert_msg(err->message[0] != 0, "%s: no message", what);
  *err = (topos_error){0};
}

START_TEST(test_bad_arguments) {
  topos_error err = {0};
  const int64_t *sh = shape_2x3;
  fails(topos_init_uniform(TOPOS_I32, 2, sh, 0, 1, 1, &err), &err,
        TOPOS_ERR_DTYPE, "i32");
  fails(topos_init_normal((topos_dtype)9, 2, sh, 0, 1, 1, &err), &err,
        TOPOS_ERR_DTYPE, "bad dtype");
  fails(topos_init_uniform(TOPOS_F32, -1, sh, 0, 1, 1, &err), &err,
        TOPOS_ERR_SHAPE, "rank -1");
  fails(topos_init_uniform(TOPOS_F32, TOPOS_MAX_RANK + 1, sh, 0, 1, 1, &err),
        &err, TOPOS_ERR_SHAPE, "rank 9");
  fails(topos_init_uniform(TOPOS_F32, 2, NULL, 0, 1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "NULL shape");
  fails(topos_init_uniform(TOPOS_F32, 2, (int64_t[]){2, -3}, 0, 1, 1, &err),
        &err, TOPOS_ERR_SHAPE, "negative extent");
  fails(topos_init_uniform(TOPOS_F32, 2, sh, 1, 1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "low == high");
  fails(topos_init_uniform(TOPOS_F32, 2, sh, 2, 1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "low > high");
  fails(topos_init_uniform(TOPOS_F32, 2, sh, NAN, 1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "low nan");
  fails(topos_init_uniform(TOPOS_F32, 2, sh, 0, INFINITY, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "high inf");
  fails(topos_init_uniform(TOPOS_F64, 2, sh, -1e308, 1e308, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "width overflows");
  fails(topos_init_normal(TOPOS_F32, 2, sh, 0, -1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "std < 0");
  fails(topos_init_normal(TOPOS_F32, 2, sh, 0, NAN, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "std nan");
  fails(topos_init_normal(TOPOS_F32, 2, sh, 0, INFINITY, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "std inf");
  fails(topos_init_normal(TOPOS_F32, 2, sh, NAN, 1, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "mean nan");
  fails(topos_init_xavier(TOPOS_F32, 2, sh, 0, 3, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "fan_in 0");
  fails(topos_init_xavier(TOPOS_F32, 2, sh, 2, -3, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "fan_out < 0");
  fails(topos_init_xavier(TOPOS_I32, 2, sh, 2, 3, 1, &err), &err,
        TOPOS_ERR_DTYPE, "xavier i32");
  fails(topos_init_kaiming(TOPOS_F32, 2, sh, 0, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "kaiming fan 0");
  fails(topos_init_kaiming(TOPOS_BF16, 2, sh, -5, 1, &err), &err,
        TOPOS_ERR_ARGUMENT, "kaiming fan < 0");
  fails(topos_init_kaiming(TOPOS_I32, 2, sh, 5, 1, &err), &err, TOPOS_ERR_DTYPE,
        "kaiming i32");
  /* err may be NULL. */
  ck_assert_ptr_null(topos_init_normal(TOPOS_F32, 2, sh, 0, -1, 1, NULL));
}
END_TEST

Suite *init_suite(void) {
  Suite *s = suite_create("init");
  TCase *tc = tcase_create("exact");
  tcase_add_test(tc, test_reference_generator_vector);
  tcase_add_test(tc, test_uniform_exact_values);
  tcase_add_test(tc, test_normal_exact_values);
  tcase_add_test(tc, test_same_seed_same_bits);
  tcase_add_test(tc, test_normal_rounding_per_dtype);
  tcase_add_test(tc, test_scalar_and_empty);
  suite_add_tcase(s, tc);
  tc = tcase_create("distributions");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_uniform_range_and_mean);
  tcase_add_test(tc, test_normal_statistics);
  tcase_add_test(tc, test_xavier_bound);
  tcase_add_test(tc, test_kaiming_std);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_add_test(tc, test_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}
