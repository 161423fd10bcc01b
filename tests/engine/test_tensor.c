/*
 * test_tensor.c - tensors: constructors for every dtype, argument
 * validation, element access, reference counts, zero-copy views, bitwise
 * equality across layouts, bf16 rounding, compute views and the
 * broadcast-zero tensor of tensor_zeros_like_meta.
 */
#include <float.h>
#include <pthread.h>
#include <stdint.h>

#include "internal.h"
#include "testutil.h"

static const topos_dtype all_dtypes[4] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16,
                                          TOPOS_I32};

static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

static float float_of(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static uint64_t bits_of_double(double d) {
  uint64_t b;
  memcpy(&b, &d, sizeof b);
  return b;
}

/* Expects `call` (which writes &err) to return NULL with code and a
 * message containing `needle`. */
#define EXPECT_NULL_ERR(call, want_code, needle)                               \
  do {                                                                         \
    memset(&err, 0, sizeof err);                                               \
    topos_tensor *bad_ = (call);                                               \
    ck_assert_msg(bad_ == NULL, "%s: expected failure", #call);                \
    ck_assert_msg(err.code == (want_code), "%s: code %d (%s), want %d", #call, \
                  err.code, err.message, (want_code));                         \
    ck_assert_msg(strstr(err.message, (needle)) != NULL,                       \
                  "%s: message '%s' lacks '%s'", #call, err.message,           \
                  (needle));                                                   \
  } while (0)

/* ------------------------------------------------------------- dtypes */

START_TEST(test_dtype_names_and_sizes) {
  ck_assert_str_eq(topos_dtype_name(TOPOS_F32), "f32");
  ck_assert_str_eq(topos_dtype_name(TOPOS_F64), "f64");
  ck_assert_str_eq(topos_dtype_name(TOPOS_BF16), "bf16");
  ck_assert_str_eq(topos_dtype_name(TOPOS_I32), "i32");
  ck_assert_str_eq(topos_dtype_name((topos_dtype)4), "?");
  ck_assert_str_eq(topos_dtype_name((topos_dtype)-1), "?");
  ck_assert_uint_eq(topos_dtype_size(TOPOS_F32), 4);
  ck_assert_uint_eq(topos_dtype_size(TOPOS_F64), 8);
  ck_assert_uint_eq(topos_dtype_size(TOPOS_BF16), 2);
  ck_assert_uint_eq(topos_dtype_size(TOPOS_I32), 4);
  ck_assert_uint_eq(topos_dtype_size((topos_dtype)17), 0);
  for (int i = 0; i < 4; i++) ck_assert(dtype_valid(all_dtypes[i]));
  ck_assert(!dtype_valid((topos_dtype)4));
  ck_assert(!dtype_valid((topos_dtype)-1));
  ck_assert(dtype_is_float(TOPOS_F32));
  ck_assert(dtype_is_float(TOPOS_F64));
  ck_assert(dtype_is_float(TOPOS_BF16));
  ck_assert(!dtype_is_float(TOPOS_I32));
  ck_assert(!dtype_is_float((topos_dtype)9));
}
END_TEST

START_TEST(test_shape_helpers) {
  int64_t s[3] = {2, 3, 4};
  ck_assert_int_eq(shape_count(3, s), 24);
  ck_assert_int_eq(shape_count(0, NULL), 1);
  int64_t z[2] = {5, 0};
  ck_assert_int_eq(shape_count(2, z), 0);
  int64_t neg[2] = {5, -2};
  ck_assert_int_eq(shape_count(2, neg), -1);
  int64_t big[3] = {INT64_MAX / 2, 2, 2};
  ck_assert_int_eq(shape_count(3, big), -1);
  int64_t ok[2] = {INT64_MAX, 1};
  ck_assert_int_eq(shape_count(2, ok), INT64_MAX);
  int64_t t[3] = {2, 3, 4}, u[3] = {2, 3, 5};
  ck_assert(shape_equal(3, s, 3, t));
  ck_assert(!shape_equal(3, s, 3, u));
  ck_assert(!shape_equal(2, s, 3, t));
  ck_assert(shape_equal(0, NULL, 0, s));
  ck_assert(shape_equal(2, s, 2, t));
}
END_TEST

/* -------------------------------------------------------- constructors */

START_TEST(test_from_every_dtype) {
  int64_t shape[2] = {2, 3};
  float f[6] = {1.5f, -2.0f, 0.25f, 3e-5f, -0.0f, 1e30f};
  double d[6] = {1.0 / 3.0, -2.5, 1e300, -1e-300, 0.0, 7.0};
  uint16_t h[6] = {0x3F80, 0xC000, 0x3E80, 0x0001, 0x8000, 0x7F7F};
  int32_t i[6] = {0, -1, INT32_MAX, INT32_MIN, 42, -7};
  const void *data[4] = {f, d, h, i};
  double want[4][6];
  for (int k = 0; k < 6; k++) {
    want[0][k] = f[k];
    want[1][k] = d[k];
    want[2][k] = topos_bf16_to_f32(h[k]);
    want[3][k] = i[k];
  }
  for (int k = 0; k < 4; k++) {
    topos_error err = {0};
    topos_tensor *t = topos_tensor_from(all_dtypes[k], 2, shape, data[k], &err);
    ck_assert_msg(t != NULL, "%s", err.message);
    ck_assert_int_eq(topos_tensor_dtype(t), all_dtypes[k]);
    ck_assert_int_eq(topos_tensor_rank(t), 2);
    ck_assert_int_eq(topos_tensor_shape(t)[0], 2);
    ck_assert_int_eq(topos_tensor_shape(t)[1], 3);
    ck_assert_int_eq(topos_tensor_count(t), 6);
    ck_assert(topos_tensor_is_contiguous(t));
    tt_assert_values(t, want[k], 6);
    /* The data was copied, bit for bit. */
    ck_assert_ptr_ne(tensor_data(t), data[k]);
    ck_assert_int_eq(
        memcmp(tensor_data(t), data[k], 6 * topos_dtype_size(all_dtypes[k])),
        0);
    char out[48];
    ck_assert_int_eq(topos_tensor_read(t, out, sizeof out, &err), TOPOS_OK);
    ck_assert_int_eq(memcmp(out, data[k], 6 * topos_dtype_size(all_dtypes[k])),
                     0);
    /* The buffer is 64-byte aligned for the kernels. */
    ck_assert_uint_eq((uintptr_t)tensor_data(t) % 64, 0);
    topos_tensor_release(t);
  }
  /* -0.0 keeps its sign through get. */
  topos_tensor *t = topos_tensor_from(TOPOS_F32, 2, shape, f, NULL);
  int64_t idx[2] = {1, 1};
  ck_assert(signbit(topos_tensor_get(t, idx, NULL)));
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_filled_zeros_ones_scalar) {
  int64_t shape[3] = {2, 1, 3};
  for (int k = 0; k < 4; k++) {
    topos_dtype dt = all_dtypes[k];
    topos_error err = {0};
    topos_tensor *z = topos_tensor_zeros(dt, 3, shape, &err);
    topos_tensor *o = topos_tensor_ones(dt, 3, shape, &err);
    topos_tensor *f = topos_tensor_filled(dt, 3, shape, -2.75, &err);
    topos_tensor *s = topos_tensor_scalar(dt, 5.0, &err);
    ck_assert_ptr_nonnull(z);
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(s);
    double zeros[6] = {0, 0, 0, 0, 0, 0}, ones[6] = {1, 1, 1, 1, 1, 1};
    double fill = dt == TOPOS_I32 ? -2.0 : -2.75; /* i32 truncates */
    double fills[6] = {fill, fill, fill, fill, fill, fill};
    tt_assert_values(z, zeros, 6);
    tt_assert_values(o, ones, 6);
    tt_assert_values(f, fills, 6);
    /* Zeros are +0 bit patterns, not -0. */
    unsigned char zb[48];
    memset(zb, 0xFF, sizeof zb);
    ck_assert_int_eq(topos_tensor_read(z, zb, sizeof zb, &err), TOPOS_OK);
    for (size_t b = 0; b < 6 * topos_dtype_size(dt); b++)
      ck_assert_int_eq(zb[b], 0);
    ck_assert_int_eq(topos_tensor_rank(s), 0);
    ck_assert_int_eq(topos_tensor_count(s), 1);
    ck_assert_int_eq(topos_tensor_dtype(s), dt);
    ck_assert(topos_tensor_is_contiguous(s));
    ck_assert(topos_tensor_get(s, NULL, &err) == 5.0);
    topos_tensor_release(z);
    topos_tensor_release(o);
    topos_tensor_release(f);
    topos_tensor_release(s);
  }
}
END_TEST

START_TEST(test_filled_rounds_once) {
  /* bf16 from a double rounds once: a value just off a bf16 tie must not
   * be rounded to the tie by an intermediate float. */
  topos_error err = {0};
  double above = 1.0 + ldexp(1, -8) + ldexp(1, -30);     /* above 1+2^-8 */
  double below = 1.0 + 3 * ldexp(1, -8) - ldexp(1, -30); /* below a tie */
  topos_tensor *a = topos_tensor_scalar(TOPOS_BF16, above, &err);
  topos_tensor *b = topos_tensor_scalar(TOPOS_BF16, below, &err);
  topos_tensor *c = topos_tensor_scalar(TOPOS_BF16, 1.0 + ldexp(1, -8), &err);
  uint16_t bits;
  ck_assert_int_eq(topos_tensor_read(a, &bits, 2, &err), TOPOS_OK);
  ck_assert_uint_eq(bits, 0x3F81);
  ck_assert_int_eq(topos_tensor_read(b, &bits, 2, &err), TOPOS_OK);
  ck_assert_uint_eq(bits, 0x3F81);
  ck_assert_int_eq(topos_tensor_read(c, &bits, 2, &err), TOPOS_OK);
  ck_assert_uint_eq(bits, 0x3F80); /* an exact tie goes to even */
  topos_tensor_release(a);
  topos_tensor_release(b);
  topos_tensor_release(c);
  /* Specials through the double path. */
  topos_tensor *n = topos_tensor_scalar(TOPOS_BF16, -NAN, &err);
  topos_tensor *inf = topos_tensor_scalar(TOPOS_BF16, 1e300, &err);
  topos_tensor *tiny = topos_tensor_scalar(TOPOS_BF16, -1e-300, &err);
  ck_assert_int_eq(topos_tensor_read(n, &bits, 2, &err), TOPOS_OK);
  ck_assert(isnan(topos_bf16_to_f32(bits)));
  ck_assert(bits & 0x8000);
  ck_assert_int_eq(topos_tensor_read(inf, &bits, 2, &err), TOPOS_OK);
  ck_assert_uint_eq(bits, 0x7F80);
  ck_assert_int_eq(topos_tensor_read(tiny, &bits, 2, &err), TOPOS_OK);
  ck_assert_uint_eq(bits, 0x8000);
  topos_tensor_release(n);
  topos_tensor_release(inf);
  topos_tensor_release(tiny);
  /* f32 rounds to nearest float; f64 keeps the double. */
  topos_tensor *f = topos_tensor_scalar(TOPOS_F32, 0.1, &err);
  topos_tensor *d = topos_tensor_scalar(TOPOS_F64, 0.1, &err);
  ck_assert(topos_tensor_get(f, NULL, &err) == (double)0.1f);
  ck_assert(topos_tensor_get(d, NULL, &err) == 0.1);
  topos_tensor_release(f);
  topos_tensor_release(d);
}
END_TEST

START_TEST(test_filled_i32_range) {
  topos_error err = {0};
  int64_t shape[1] = {3};
  EXPECT_NULL_ERR(topos_tensor_filled(TOPOS_I32, 1, shape, NAN, &err),
                  TOPOS_ERR_ARGUMENT, "i32");
  EXPECT_NULL_ERR(topos_tensor_filled(TOPOS_I32, 1, shape, 3e9, &err),
                  TOPOS_ERR_ARGUMENT, "i32");
  EXPECT_NULL_ERR(topos_tensor_scalar(TOPOS_I32, -INFINITY, &err),
                  TOPOS_ERR_ARGUMENT, "i32");
  topos_tensor *t = topos_tensor_filled(TOPOS_I32, 1, shape, -2.7, &err);
  double want[3] = {-2, -2, -2};
  tt_assert_values(t, want, 3);
  topos_tensor_release(t);
  t = topos_tensor_scalar(TOPOS_I32, 2147483647.0, &err);
  ck_assert(topos_tensor_get(t, NULL, &err) == 2147483647.0);
  topos_tensor_release(t);
  t = topos_tensor_scalar(TOPOS_I32, -2147483648.0, &err);
  ck_assert(topos_tensor_get(t, NULL, &err) == -2147483648.0);
  topos_tensor_release(t);
  /* Float dtypes take any double, NaN included. */
  t = topos_tensor_scalar(TOPOS_F32, NAN, &err);
  ck_assert(isnan(topos_tensor_get(t, NULL, &err)));
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_constructor_errors) {
  topos_error err = {0};
  int64_t shape[2] = {2, 3};
  float data[6] = {0};
  EXPECT_NULL_ERR(topos_tensor_from((topos_dtype)7, 2, shape, data, &err),
                  TOPOS_ERR_DTYPE, "dtype");
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, -1, shape, data, &err),
                  TOPOS_ERR_ARGUMENT, "rank -1");
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 9, shape, data, &err),
                  TOPOS_ERR_ARGUMENT, "rank 9");
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 2, NULL, data, &err),
                  TOPOS_ERR_ARGUMENT, "shape is NULL");
  int64_t neg[2] = {2, -3};
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 2, neg, data, &err),
                  TOPOS_ERR_SHAPE, "[2,-3]");
  int64_t huge[3] = {INT64_MAX / 2, 3, 1};
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 3, huge, data, &err),
                  TOPOS_ERR_MEMORY, "2^40");
  int64_t over[2] = {(int64_t)1 << 20, (int64_t)1 << 19}; /* 2^41 bytes */
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 2, over, data, &err),
                  TOPOS_ERR_MEMORY, "f32[1048576,524288]");
  int64_t over64[1] = {((int64_t)1 << 37) + 1}; /* f64: just over 2^40 */
  EXPECT_NULL_ERR(topos_tensor_zeros(TOPOS_F64, 1, over64, &err),
                  TOPOS_ERR_MEMORY, "2^40");
  EXPECT_NULL_ERR(topos_tensor_from(TOPOS_F32, 2, shape, NULL, &err),
                  TOPOS_ERR_ARGUMENT, "data is NULL");
  EXPECT_NULL_ERR(topos_tensor_filled((topos_dtype)5, 2, shape, 1.0, &err),
                  TOPOS_ERR_DTYPE, "topos_tensor_filled");
  EXPECT_NULL_ERR(topos_tensor_zeros(TOPOS_F64, 2, neg, &err), TOPOS_ERR_SHAPE,
                  "negative");
  EXPECT_NULL_ERR(topos_tensor_ones(TOPOS_BF16, 11, shape, &err),
                  TOPOS_ERR_ARGUMENT, "rank");
  EXPECT_NULL_ERR(topos_tensor_scalar((topos_dtype)-3, 1.0, &err),
                  TOPOS_ERR_DTYPE, "dtype");
  EXPECT_NULL_ERR(tensor_new(TOPOS_F32, 1, neg + 1, &err), TOPOS_ERR_SHAPE,
                  "tensor_new");
  EXPECT_NULL_ERR(tensor_new_meta(NULL, &err), TOPOS_ERR_ARGUMENT, "NULL");
  /* A NULL err is accepted everywhere. */
  ck_assert_ptr_null(topos_tensor_from(TOPOS_F32, 2, neg, data, NULL));
  ck_assert_ptr_null(topos_tensor_filled((topos_dtype)9, 0, NULL, 0, NULL));
}
END_TEST

START_TEST(test_zero_extent_tensors) {
  topos_error err = {0};
  int64_t shape[2] = {0, 3};
  topos_tensor *t = topos_tensor_from(TOPOS_F32, 2, shape, NULL, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  ck_assert_int_eq(topos_tensor_count(t), 0);
  ck_assert(topos_tensor_is_contiguous(t));
  ck_assert_int_eq(topos_tensor_read(t, NULL, 0, &err), TOPOS_OK);
  topos_tensor *u = topos_tensor_zeros(TOPOS_F32, 2, shape, &err);
  ck_assert(topos_tensor_bitwise_equal(t, u));
  topos_tensor *tt = topos_tensor_transpose(t, &err);
  ck_assert_ptr_nonnull(tt);
  ck_assert_int_eq(topos_tensor_shape(tt)[0], 3);
  ck_assert_int_eq(topos_tensor_shape(tt)[1], 0);
  /* No element of an empty tensor is addressed, so any layout counts as
   * row-major and contiguous() need not copy. */
  ck_assert(topos_tensor_is_contiguous(tt));
  topos_tensor *n = topos_tensor_narrow(tt, 0, 1, 2, &err);
  ck_assert_ptr_nonnull(n);
  ck_assert_int_eq(topos_tensor_count(n), 0);
  topos_tensor *c = topos_tensor_contiguous(tt, &err);
  ck_assert_ptr_nonnull(c);
  int64_t idx[2] = {0, 0};
  ck_assert(isnan(topos_tensor_get(t, idx, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  /* An extent-1 axis broadcasts to 0. */
  int64_t one[2] = {1, 3};
  topos_tensor *r = topos_tensor_ones(TOPOS_I32, 2, one, &err);
  topos_tensor *b = topos_tensor_broadcast(r, 2, shape, &err);
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(topos_tensor_count(b), 0);
  ck_assert(!topos_tensor_bitwise_equal(b, t)); /* dtypes differ */
  topos_tensor *n0 = topos_tensor_narrow(r, 1, 3, 0, &err);
  ck_assert_ptr_nonnull(n0);
  ck_assert_int_eq(topos_tensor_count(n0), 0);
  topos_tensor *e = topos_tensor_from(TOPOS_BF16, 1, shape, NULL, &err);
  compute_view v;
  ck_assert_int_eq(compute_view_of(e, &v, &err), TOPOS_OK);
  compute_view_done(&v);
  topos_tensor *list[] = {t, u, tt, n, c, r, b, n0, e};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

/* ------------------------------------------------------------ reading */

/* Reading a permuted view walks its source with a stride: 4-byte
 * elements take gathers (rows of 4 or more), others element copies; every
 * element lands where the permutation says, rows long and short, f32,
 * i32 and f64. */
START_TEST(test_read_transposed_views) {
  static const int64_t shapes[3][3] = {{3, 37, 5}, {2, 7, 9}, {1, 3, 40}};
  const topos_dtype dts[3] = {TOPOS_F32, TOPOS_I32, TOPOS_F64};
  static const int perm[3] = {0, 2, 1};
  topos_error err = {0};
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 3; k++) {
      const int64_t *sh = shapes[k];
      int64_t n = sh[0] * sh[1] * sh[2];
      double *v = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < n; i++) v[i] = (double)(i * 7 % 1000) - 300;
      topos_tensor *t = tt_tensor(dts[d], 3, sh, v);
      ck_assert_ptr_nonnull(t);
      topos_tensor *p = topos_tensor_permute(t, perm, &err);
      ck_assert_ptr_nonnull(p);
      size_t es = topos_dtype_size(dts[d]);
      char *got = malloc(es * (size_t)n);
      ck_assert_int_eq(topos_tensor_read(p, got, es * (size_t)n, &err),
                       TOPOS_OK);
      for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t c = 0; c < sh[2]; c++)
          for (int64_t b = 0; b < sh[1]; b++) {
            double want = v[(a * sh[1] + b) * sh[2] + c];
            int64_t at = (a * sh[2] + c) * sh[1] + b;
            double g = dts[d] == TOPOS_F32   ? ((float *)got)[at]
                       : dts[d] == TOPOS_I32 ? ((int32_t *)got)[at]
                                             : ((double *)got)[at];
            ck_assert_msg(g == want, "%s [%lld,%lld,%lld] at (%lld,%lld,%lld)",
                          topos_dtype_name(dts[d]), (long long)sh[0],
                          (long long)sh[1], (long long)sh[2], (long long)a,
                          (long long)c, (long long)b);
          }
      free(got);
      free(v);
      topos_tensor_release(p);
      topos_tensor_release(t);
    }
}
END_TEST

START_TEST(test_get_read_roundtrip) {
  int64_t shape[3] = {3, 4, 5};
  double v[60];
  uint64_t s = 99;
  for (int i = 0; i < 60; i++) v[i] = tt_uniform(&s, -10, 10);
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_F64, 3, shape, v, &err);
  double out[60];
  ck_assert_int_eq(topos_tensor_read(t, out, sizeof out, &err), TOPOS_OK);
  ck_assert_int_eq(memcmp(out, v, sizeof v), 0);
  for (int64_t i = 0; i < 3; i++)
    for (int64_t j = 0; j < 4; j++)
      for (int64_t k = 0; k < 5; k++) {
        int64_t idx[3] = {i, j, k};
        double got = topos_tensor_get(t, idx, &err);
        ck_assert_uint_eq(bits_of_double(got),
                          bits_of_double(v[(i * 4 + j) * 5 + k]));
      }
  /* Larger out buffers are fine; the tail is untouched. */
  double big[61];
  big[60] = 12345.0;
  ck_assert_int_eq(topos_tensor_read(t, big, sizeof big, &err), TOPOS_OK);
  ck_assert(big[60] == 12345.0);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_access_errors) {
  topos_error err = {0};
  int64_t shape[2] = {2, 3};
  topos_tensor *t = topos_tensor_zeros(TOPOS_F32, 2, shape, &err);
  int64_t bad[2] = {2, 0}, neg[2] = {0, -1}, last[2] = {1, 2};
  ck_assert(isnan(topos_tensor_get(t, bad, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  ck_assert_ptr_nonnull(strstr(err.message, "axis 0"));
  ck_assert_ptr_nonnull(strstr(err.message, "[2,3]"));
  ck_assert(isnan(topos_tensor_get(t, neg, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  ck_assert_ptr_nonnull(strstr(err.message, "-1"));
  memset(&err, 0, sizeof err);
  ck_assert(topos_tensor_get(t, last, &err) == 0.0);
  ck_assert_int_eq(err.code, TOPOS_OK);
  ck_assert(isnan(topos_tensor_get(t, NULL, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert(isnan(topos_tensor_get(NULL, last, &err)));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert(isnan(topos_tensor_get(NULL, last, NULL)));
  float out[6];
  ck_assert_int_eq(topos_tensor_read(NULL, out, sizeof out, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "NULL"));
  ck_assert_int_eq(topos_tensor_read(t, NULL, sizeof out, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(topos_tensor_read(t, out, sizeof out - 1, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "24"));
  ck_assert_int_eq(topos_tensor_read(t, out, 0, NULL), TOPOS_ERR_ARGUMENT);
  /* Accessors on NULL answer without crashing. */
  ck_assert_int_eq(topos_tensor_rank(NULL), -1);
  ck_assert_int_eq(topos_tensor_count(NULL), -1);
  ck_assert_ptr_null(topos_tensor_shape(NULL));
  ck_assert(!topos_tensor_is_contiguous(NULL));
  ck_assert(!dtype_valid(topos_tensor_dtype(NULL)));
  ck_assert_str_eq(topos_dtype_name(topos_tensor_dtype(NULL)), "?");
  ck_assert_ptr_null(topos_tensor_retain(NULL));
  topos_tensor_release(NULL);
  ck_assert_ptr_null(tensor_data(NULL));
  tensor_meta m = tensor_meta_of(NULL);
  ck_assert_int_eq(m.rank, 0);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_meta_of) {
  int64_t shape[3] = {4, 1, 2};
  topos_tensor *t = topos_tensor_zeros(TOPOS_BF16, 3, shape, NULL);
  tensor_meta m = tensor_meta_of(t);
  ck_assert_int_eq(m.dtype, TOPOS_BF16);
  ck_assert_int_eq(m.rank, 3);
  ck_assert(shape_equal(m.rank, m.shape, 3, shape));
  topos_tensor *n = tensor_new_meta(&m, NULL);
  ck_assert_ptr_nonnull(n);
  ck_assert_int_eq(topos_tensor_dtype(n), TOPOS_BF16);
  ck_assert(shape_equal(topos_tensor_rank(n), topos_tensor_shape(n), 3, shape));
  ck_assert(topos_tensor_is_contiguous(n));
  ck_assert_int_eq(n->stride[0], 2);
  ck_assert_int_eq(n->stride[2], 1);
  topos_tensor_release(n);
  topos_tensor_release(t);
}
END_TEST

/* ----------------------------------------------------- reference counts */

START_TEST(test_retain_release) {
  int64_t shape[1] = {4};
  double v[4] = {1, 2, 3, 4};
  topos_tensor *t = topos_tensor_from(TOPOS_F64, 1, shape, v, NULL);
  ck_assert_ptr_eq(topos_tensor_retain(t), t);
  ck_assert_int_eq(atomic_load(&t->refs), 2);
  topos_tensor_release(t);
  ck_assert_int_eq(atomic_load(&t->refs), 1);
  /* A view keeps the buffer alive after its base is gone. */
  topos_tensor *n = topos_tensor_narrow(t, 0, 1, 2, NULL);
  ck_assert_int_eq(atomic_load(&t->buf->refs), 2);
  topos_tensor_release(t);
  double want[2] = {2, 3};
  tt_assert_values(n, want, 2);
  ck_assert_int_eq(atomic_load(&n->buf->refs), 1);
  topos_tensor_release(n);
}
END_TEST

typedef struct share_ctx {
  topos_tensor *t;
  int failures;
} share_ctx;

static void *share_thread(void *arg) {
  share_ctx *c = arg;
  for (int i = 0; i < 2000; i++) {
    topos_tensor *r = topos_tensor_retain(c->t);
    topos_tensor *v = topos_tensor_transpose(r, NULL);
    int64_t idx[2] = {1, 0};
    if (v == NULL || topos_tensor_get(v, idx, NULL) != 1.0) c->failures++;
    topos_tensor_release(v);
    topos_tensor_release(r);
  }
  return NULL;
}

START_TEST(test_refcounts_across_threads) {
  int64_t shape[2] = {2, 2};
  double v[4] = {0, 1, 2, 3};
  topos_tensor *t = topos_tensor_from(TOPOS_F64, 2, shape, v, NULL);
  pthread_t th[4];
  share_ctx ctx[4];
  for (int i = 0; i < 4; i++) {
    ctx[i] = (share_ctx){t, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, share_thread, &ctx[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_int_eq(ctx[i].failures, 0);
  }
  ck_assert_int_eq(atomic_load(&t->refs), 1);
  ck_assert_int_eq(atomic_load(&t->buf->refs), 1);
  topos_tensor_release(t);
}
END_TEST

/* ---------------------------------------------------------------- views */

/* A [rows, cols] f32 tensor holding 0, 1, 2, ... row-major. */
static topos_tensor *iota(topos_dtype dt, int rank, const int64_t *shape) {
  int64_t n = shape_count(rank, shape);
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = (double)i;
  topos_tensor *t = tt_tensor(dt, rank, shape, v);
  free(v);
  return t;
}

START_TEST(test_transpose_view) {
  topos_error err = {0};
  int64_t shape[2] = {2, 3};
  topos_tensor *t = iota(TOPOS_F32, 2, shape);
  topos_tensor *v = topos_tensor_transpose(t, &err);
  ck_assert_ptr_nonnull(v);
  ck_assert_ptr_eq(v->buf, t->buf);
  ck_assert_ptr_eq(tensor_data(v), tensor_data(t));
  ck_assert_int_eq(topos_tensor_shape(v)[0], 3);
  ck_assert_int_eq(topos_tensor_shape(v)[1], 2);
  ck_assert_int_eq(v->stride[0], 1);
  ck_assert_int_eq(v->stride[1], 3);
  ck_assert(!topos_tensor_is_contiguous(v));
  double want[6] = {0, 3, 1, 4, 2, 5};
  tt_assert_values(v, want, 6);
  float out[6];
  ck_assert_int_eq(topos_tensor_read(v, out, sizeof out, &err), TOPOS_OK);
  for (int i = 0; i < 6; i++) ck_assert(out[i] == (float)want[i]);
  topos_tensor *back = topos_tensor_transpose(v, &err);
  ck_assert(topos_tensor_is_contiguous(back));
  ck_assert(topos_tensor_bitwise_equal(back, t));
  topos_tensor_release(back);
  topos_tensor_release(v);
  /* Rank other than 2 is a shape error. */
  int64_t s3[3] = {1, 2, 3};
  topos_tensor *r3 = topos_tensor_zeros(TOPOS_F32, 3, s3, &err);
  EXPECT_NULL_ERR(topos_tensor_transpose(r3, &err), TOPOS_ERR_SHAPE, "rank 2");
  EXPECT_NULL_ERR(topos_tensor_transpose(NULL, &err), TOPOS_ERR_ARGUMENT,
                  "NULL");
  topos_tensor_release(r3);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_permute_view) {
  topos_error err = {0};
  int64_t shape[3] = {2, 3, 4};
  topos_tensor *t = iota(TOPOS_I32, 3, shape);
  int perm[3] = {2, 0, 1};
  topos_tensor *p = topos_tensor_permute(t, perm, &err);
  ck_assert_msg(p != NULL, "%s", err.message);
  ck_assert_ptr_eq(p->buf, t->buf);
  ck_assert_ptr_eq(tensor_data(p), tensor_data(t));
  ck_assert_int_eq(p->shape[0], 4);
  ck_assert_int_eq(p->shape[1], 2);
  ck_assert_int_eq(p->shape[2], 3);
  ck_assert_int_eq(p->stride[0], 1);
  ck_assert_int_eq(p->stride[1], 12);
  ck_assert_int_eq(p->stride[2], 4);
  for (int64_t i = 0; i < 4; i++)
    for (int64_t j = 0; j < 2; j++)
      for (int64_t k = 0; k < 3; k++) {
        int64_t idx[3] = {i, j, k};
        ck_assert(topos_tensor_get(p, idx, &err) ==
                  (double)(j * 12 + k * 4 + i));
      }
  int32_t out[24];
  ck_assert_int_eq(topos_tensor_read(p, out, sizeof out, &err), TOPOS_OK);
  ck_assert_int_eq(out[0], 0);
  ck_assert_int_eq(out[1], 4);
  ck_assert_int_eq(out[3], 12);
  ck_assert_int_eq(out[6], 1);
  /* The identity permutation is still contiguous. */
  int ident[3] = {0, 1, 2};
  topos_tensor *id = topos_tensor_permute(t, ident, &err);
  ck_assert(topos_tensor_is_contiguous(id));
  ck_assert(topos_tensor_bitwise_equal(id, t));
  topos_tensor_release(id);
  int repeated[3] = {0, 0, 1}, out_of_range[3] = {0, 1, 3},
      negative[3] = {-1, 0, 1};
  EXPECT_NULL_ERR(topos_tensor_permute(t, repeated, &err), TOPOS_ERR_ARGUMENT,
                  "repeated");
  EXPECT_NULL_ERR(topos_tensor_permute(t, out_of_range, &err),
                  TOPOS_ERR_ARGUMENT, "perm[2] = 3");
  EXPECT_NULL_ERR(topos_tensor_permute(t, negative, &err), TOPOS_ERR_ARGUMENT,
                  "out of range");
  EXPECT_NULL_ERR(topos_tensor_permute(t, NULL, &err), TOPOS_ERR_ARGUMENT,
                  "perm is NULL");
  EXPECT_NULL_ERR(topos_tensor_permute(NULL, perm, &err), TOPOS_ERR_ARGUMENT,
                  "NULL");
  /* Rank 0 permutes with no perm at all. */
  topos_tensor *s = topos_tensor_scalar(TOPOS_F32, 3, &err);
  topos_tensor *ps = topos_tensor_permute(s, NULL, &err);
  ck_assert_ptr_nonnull(ps);
  ck_assert(topos_tensor_bitwise_equal(ps, s));
  topos_tensor_release(ps);
  topos_tensor_release(s);
  topos_tensor_release(p);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_narrow_view) {
  topos_error err = {0};
  int64_t shape[2] = {4, 5};
  topos_tensor *t = iota(TOPOS_F64, 2, shape);
  topos_tensor *cols = topos_tensor_narrow(t, 1, 1, 3, &err);
  ck_assert_ptr_nonnull(cols);
  ck_assert_ptr_eq(cols->buf, t->buf);
  ck_assert_ptr_eq(tensor_data(cols), (double *)tensor_data(t) + 1);
  ck_assert(!topos_tensor_is_contiguous(cols));
  double want_cols[12] = {1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18};
  tt_assert_values(cols, want_cols, 12);
  topos_tensor *rows = topos_tensor_narrow(t, 0, 2, 2, &err);
  ck_assert_ptr_eq(tensor_data(rows), (double *)tensor_data(t) + 10);
  ck_assert(topos_tensor_is_contiguous(rows));
  double want_rows[10] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  tt_assert_values(rows, want_rows, 10);
  /* Reading a contiguous view at an offset starts at the offset. */
  double out_rows[10];
  ck_assert_int_eq(topos_tensor_read(rows, out_rows, sizeof out_rows, &err),
                   TOPOS_OK);
  ck_assert_int_eq(memcmp(out_rows, want_rows, sizeof out_rows), 0);
  /* Narrowing a narrowed view composes offsets. */
  topos_tensor *both = topos_tensor_narrow(rows, 1, 1, 3, &err);
  ck_assert_ptr_eq(tensor_data(both), (double *)tensor_data(t) + 11);
  double want_both[6] = {11, 12, 13, 16, 17, 18};
  tt_assert_values(both, want_both, 6);
  topos_tensor *whole = topos_tensor_narrow(t, 0, 0, 4, &err);
  ck_assert(topos_tensor_bitwise_equal(whole, t));
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 2, 0, 1, &err), TOPOS_ERR_ARGUMENT,
                  "axis 2");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, -1, 0, 1, &err), TOPOS_ERR_ARGUMENT,
                  "axis -1");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 0, -1, 1, &err), TOPOS_ERR_ARGUMENT,
                  ">= 0");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 0, 0, -1, &err), TOPOS_ERR_ARGUMENT,
                  ">= 0");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 1, 3, 3, &err), TOPOS_ERR_SHAPE,
                  "[4,5]");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 1, 6, 0, &err), TOPOS_ERR_SHAPE,
                  "axis 1");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 1, INT64_MAX, INT64_MAX, &err),
                  TOPOS_ERR_SHAPE, "does not fit");
  EXPECT_NULL_ERR(topos_tensor_narrow(t, 1, 1, INT64_MAX, &err),
                  TOPOS_ERR_SHAPE, "does not fit");
  EXPECT_NULL_ERR(topos_tensor_narrow(NULL, 0, 0, 1, &err), TOPOS_ERR_ARGUMENT,
                  "NULL");
  topos_tensor *s = topos_tensor_scalar(TOPOS_F64, 1, &err);
  EXPECT_NULL_ERR(topos_tensor_narrow(s, 0, 0, 1, &err), TOPOS_ERR_ARGUMENT,
                  "rank 0");
  topos_tensor_release(s);
  topos_tensor_release(whole);
  topos_tensor_release(both);
  topos_tensor_release(rows);
  topos_tensor_release(cols);
  topos_tensor_release(t);
}
END_TEST

START_TEST(test_broadcast_view) {
  topos_error err = {0};
  int64_t target[2] = {4, 3};
  topos_tensor *s = topos_tensor_scalar(TOPOS_BF16, 1.5, &err);
  topos_tensor *bs = topos_tensor_broadcast(s, 2, target, &err);
  ck_assert_ptr_nonnull(bs);
  ck_assert_ptr_eq(bs->buf, s->buf);
  ck_assert_int_eq(bs->stride[0], 0);
  ck_assert_int_eq(bs->stride[1], 0);
  ck_assert_int_eq(topos_tensor_count(bs), 12);
  ck_assert(!topos_tensor_is_contiguous(bs));
  topos_tensor *filled = topos_tensor_filled(TOPOS_BF16, 2, target, 1.5, &err);
  ck_assert(topos_tensor_bitwise_equal(bs, filled));
  topos_tensor_release(filled);

  int64_t row_shape[2] = {1, 3};
  topos_tensor *row = iota(TOPOS_F32, 2, row_shape);
  topos_tensor *br = topos_tensor_broadcast(row, 2, target, &err);
  ck_assert_ptr_nonnull(br);
  ck_assert_ptr_eq(tensor_data(br), tensor_data(row));
  ck_assert_int_eq(br->stride[0], 0);
  ck_assert_int_eq(br->stride[1], 1);
  double want_r[12] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2};
  tt_assert_values(br, want_r, 12);

  int64_t col_shape[2] = {4, 1};
  topos_tensor *col = iota(TOPOS_F32, 2, col_shape);
  topos_tensor *bc = topos_tensor_broadcast(col, 2, target, &err);
  ck_assert_int_eq(bc->stride[1], 0);
  double want_c[12] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3};
  tt_assert_values(bc, want_c, 12);
  /* Broadcast to the same shape is an identity view. */
  topos_tensor *same = topos_tensor_broadcast(col, 2, col_shape, &err);
  ck_assert(topos_tensor_is_contiguous(same));
  topos_tensor_release(same);

  int64_t wrong[2] = {4, 2}, rank3[3] = {1, 4, 3}, neg[2] = {-4, 3};
  EXPECT_NULL_ERR(topos_tensor_broadcast(row, 2, wrong, &err), TOPOS_ERR_SHAPE,
                  "[1,3] to [4,2]");
  EXPECT_NULL_ERR(topos_tensor_broadcast(row, 3, rank3, &err), TOPOS_ERR_SHAPE,
                  "cannot broadcast");
  EXPECT_NULL_ERR(topos_tensor_broadcast(row, 2, neg, &err), TOPOS_ERR_SHAPE,
                  "negative");
  EXPECT_NULL_ERR(topos_tensor_broadcast(row, 9, target, &err),
                  TOPOS_ERR_ARGUMENT, "rank 9");
  EXPECT_NULL_ERR(topos_tensor_broadcast(row, 2, NULL, &err),
                  TOPOS_ERR_ARGUMENT, "NULL");
  EXPECT_NULL_ERR(topos_tensor_broadcast(NULL, 2, target, &err),
                  TOPOS_ERR_ARGUMENT, "NULL");
  int64_t huge[2] = {INT64_MAX, 4};
  EXPECT_NULL_ERR(topos_tensor_broadcast(s, 2, huge, &err), TOPOS_ERR_MEMORY,
                  "2^40");
  topos_tensor *list[] = {s, bs, row, br, col, bc};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

START_TEST(test_unfold_view) {
  topos_error err = {0};
  /* [10], windows of 3 taps, step 2, dilation 2: span 5, count 3. */
  int64_t s10[1] = {10};
  topos_tensor *x = iota(TOPOS_F64, 1, s10);
  topos_tensor *u = topos_tensor_unfold(x, 0, 3, 2, 2, &err);
  ck_assert_msg(u != NULL, "%s", err.message);
  ck_assert_ptr_eq(u->buf, x->buf);
  ck_assert_int_eq(topos_tensor_rank(u), 2);
  ck_assert_int_eq(u->shape[0], 3);
  ck_assert_int_eq(u->shape[1], 3);
  ck_assert_int_eq(u->stride[0], 2);
  ck_assert_int_eq(u->stride[1], 2);
  double want[9] = {0, 2, 4, 2, 4, 6, 4, 6, 8};
  tt_assert_values(u, want, 9);

  /* [2,7] along axis 1, size 2, step 3: count 2 -> [2,2,2]. */
  int64_t s27[2] = {2, 7};
  topos_tensor *y = iota(TOPOS_F32, 2, s27);
  topos_tensor *w = topos_tensor_unfold(y, 1, 2, 3, 1, &err);
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->shape[0], 2);
  ck_assert_int_eq(w->shape[1], 2);
  ck_assert_int_eq(w->shape[2], 2);
  ck_assert_int_eq(w->stride[0], 7);
  ck_assert_int_eq(w->stride[1], 3);
  ck_assert_int_eq(w->stride[2], 1);
  double want_w[8] = {0, 1, 3, 4, 7, 8, 10, 11};
  tt_assert_values(w, want_w, 8);

  /* Unfold of a transposed view composes strides: yt is [7,2]. */
  topos_tensor *yt = topos_tensor_transpose(y, &err);
  topos_tensor *wt = topos_tensor_unfold(yt, 0, 3, 2, 1, &err);
  ck_assert_int_eq(wt->shape[0], 3);
  ck_assert_int_eq(wt->shape[1], 3);
  ck_assert_int_eq(wt->shape[2], 2);
  ck_assert_int_eq(wt->stride[0], 2);
  ck_assert_int_eq(wt->stride[1], 1);
  ck_assert_int_eq(wt->stride[2], 7);
  int64_t idx[3] = {2, 1, 1}; /* yt[2*2+1, 1] = y[1, 5] = 12 */
  ck_assert(topos_tensor_get(wt, idx, &err) == 12.0);

  /* A window exactly as wide as the axis gives one window; a step past
   * the end still gives one. */
  topos_tensor *one = topos_tensor_unfold(x, 0, 4, 1000000, 3, &err);
  ck_assert_int_eq(one->shape[0], 1);
  ck_assert_int_eq(one->shape[1], 4);
  double want_one[4] = {0, 3, 6, 9};
  tt_assert_values(one, want_one, 4);
  topos_tensor *huge_step = topos_tensor_unfold(x, 0, 1, INT64_MAX, 1, &err);
  ck_assert_ptr_nonnull(huge_step);
  ck_assert_int_eq(huge_step->shape[0], 10 / INT64_MAX + 1);
  topos_tensor *single = topos_tensor_unfold(x, 0, 1, 1, INT64_MAX, &err);
  ck_assert_ptr_nonnull(single);
  ck_assert_int_eq(single->shape[0], 10);
  ck_assert_int_eq(single->shape[1], 1);
  double want_single[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  tt_assert_values(single, want_single, 10);

  EXPECT_NULL_ERR(topos_tensor_unfold(x, 1, 2, 1, 1, &err), TOPOS_ERR_ARGUMENT,
                  "axis 1");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, 0, 1, 1, &err), TOPOS_ERR_ARGUMENT,
                  "size 0");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, 2, 0, 1, &err), TOPOS_ERR_ARGUMENT,
                  "step 0");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, 2, 1, 0, &err), TOPOS_ERR_ARGUMENT,
                  "dilation 0");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, 4, 1, 4, &err), TOPOS_ERR_SHAPE,
                  "does not fit");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, 11, 1, 1, &err), TOPOS_ERR_SHAPE,
                  "[10]");
  EXPECT_NULL_ERR(topos_tensor_unfold(x, 0, INT64_MAX, 1, INT64_MAX, &err),
                  TOPOS_ERR_SHAPE, "does not fit");
  EXPECT_NULL_ERR(topos_tensor_unfold(NULL, 0, 1, 1, 1, &err),
                  TOPOS_ERR_ARGUMENT, "NULL");
  int64_t s8[8] = {1, 1, 1, 1, 1, 1, 1, 4};
  topos_tensor *r8 = topos_tensor_zeros(TOPOS_F32, 8, s8, &err);
  EXPECT_NULL_ERR(topos_tensor_unfold(r8, 7, 2, 1, 1, &err), TOPOS_ERR_SHAPE,
                  "rank 8");
  int64_t s0[1] = {0};
  topos_tensor *empty = topos_tensor_zeros(TOPOS_F32, 1, s0, &err);
  EXPECT_NULL_ERR(topos_tensor_unfold(empty, 0, 1, 1, 1, &err), TOPOS_ERR_SHAPE,
                  "does not fit");
  topos_tensor *list[] = {x,   u,         y,      w,  yt,   wt,
                          one, huge_step, single, r8, empty};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

START_TEST(test_bitwise_equal) {
  topos_error err = {0};
  int64_t shape[2] = {3, 4};
  topos_tensor *a = tt_random(TOPOS_F32, 2, shape, 7, -1, 1);
  topos_tensor *at = topos_tensor_transpose(a, &err);
  topos_tensor *atc = topos_tensor_contiguous(at, &err);
  ck_assert_ptr_ne(atc, at);
  ck_assert(topos_tensor_is_contiguous(atc));
  ck_assert_ptr_ne(atc->buf, a->buf);
  ck_assert(topos_tensor_bitwise_equal(at, atc));
  ck_assert(topos_tensor_bitwise_equal(atc, at));
  ck_assert(topos_tensor_bitwise_equal(at, at));
  ck_assert(!topos_tensor_bitwise_equal(a, atc)); /* [3,4] vs [4,3] */
  /* The same values written out by hand agree too. */
  float buf[12];
  ck_assert_int_eq(topos_tensor_read(at, buf, sizeof buf, &err), TOPOS_OK);
  int64_t tshape[2] = {4, 3};
  topos_tensor *manual = topos_tensor_from(TOPOS_F32, 2, tshape, buf, &err);
  ck_assert(topos_tensor_bitwise_equal(manual, at));
  /* One changed element is noticed, in either layout. */
  buf[7] = nextafterf(buf[7], 2.0f);
  topos_tensor *changed = topos_tensor_from(TOPOS_F32, 2, tshape, buf, &err);
  ck_assert(!topos_tensor_bitwise_equal(changed, at));
  ck_assert(!topos_tensor_bitwise_equal(changed, atc));
  /* Same count, different shape. */
  int64_t flat[1] = {12};
  topos_tensor *f = topos_tensor_from(TOPOS_F32, 1, flat, buf, &err);
  ck_assert(!topos_tensor_bitwise_equal(f, changed));
  /* Same bits, different dtype. */
  int64_t one[1] = {1};
  int32_t ibits = 0x3F800000;
  float fone = 1.0f;
  topos_tensor *ti = topos_tensor_from(TOPOS_I32, 1, one, &ibits, &err);
  topos_tensor *tf = topos_tensor_from(TOPOS_F32, 1, one, &fone, &err);
  ck_assert(!topos_tensor_bitwise_equal(ti, tf));
  /* -0 and +0 differ; NaNs compare by payload. */
  topos_tensor *pz = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  topos_tensor *nz = topos_tensor_scalar(TOPOS_F64, -0.0, &err);
  ck_assert(!topos_tensor_bitwise_equal(pz, nz));
  float nan1 = float_of(0x7FC00001), nan1b = float_of(0x7FC00001),
        nan2 = float_of(0x7FC00002);
  topos_tensor *n1 = topos_tensor_from(TOPOS_F32, 1, one, &nan1, &err);
  topos_tensor *n1b = topos_tensor_from(TOPOS_F32, 1, one, &nan1b, &err);
  topos_tensor *n2 = topos_tensor_from(TOPOS_F32, 1, one, &nan2, &err);
  ck_assert(topos_tensor_bitwise_equal(n1, n1b));
  ck_assert(!topos_tensor_bitwise_equal(n1, n2));
  /* NULL equals only NULL. */
  ck_assert(topos_tensor_bitwise_equal(NULL, NULL));
  ck_assert(!topos_tensor_bitwise_equal(a, NULL));
  ck_assert(!topos_tensor_bitwise_equal(NULL, a));
  /* A broadcast view equals the materialised tensor. */
  topos_tensor *b = topos_tensor_broadcast(nz, 2, shape, &err);
  topos_tensor *bf = topos_tensor_filled(TOPOS_F64, 2, shape, -0.0, &err);
  topos_tensor *bp = topos_tensor_zeros(TOPOS_F64, 2, shape, &err);
  ck_assert(topos_tensor_bitwise_equal(b, bf));
  ck_assert(!topos_tensor_bitwise_equal(b, bp));
  topos_tensor *list[] = {a,  at, atc, manual, changed, f, ti, tf,
                          pz, nz, n1,  n1b,    n2,      b, bf, bp};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

/* Transposing copies (a source contiguous along the outer axis of the
 * block: tensor.c's tiled transpose on AVX-512): a conv layout's
 * [N,HW,C] seen as [N,C,HW] and the reverse, channel counts below, at
 * and past one vector, positions not a multiple of 16, and a narrowed
 * view inside a wider buffer; each element as its view names it. */
START_TEST(test_contiguous_transposing) {
  const int64_t cases[][3] = {{2, 784, 6}, {3, 100, 16}, {2, 37, 5},
                              {1, 17, 33}, {2, 5, 40},   {1, 300, 3}};
  topos_error err = {0};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
    for (int dir = 0; dir < 3; dir++) {
      int64_t shape[3] = {cases[c][0], cases[c][1], cases[c][2]};
      topos_tensor *t = iota(TOPOS_F32, 3, shape);
      int perm[3] = {0, 2, 1};
      topos_tensor *v = topos_tensor_permute(t, perm, &err);
      if (dir == 1) { /* back again: [N,C,HW] contiguous, read as [N,HW,C] */
        topos_tensor *m = topos_tensor_contiguous(v, &err);
        topos_tensor_release(v);
        v = topos_tensor_permute(m, perm, &err);
        topos_tensor_release(m);
      } else if (dir == 2) { /* a narrowed channel range */
        topos_tensor *n = topos_tensor_narrow(v, 1, 1, shape[2] - 1, &err);
        topos_tensor_release(v);
        v = n;
      }
      ck_assert_ptr_nonnull(v);
      topos_tensor *cv = topos_tensor_contiguous(v, &err);
      ck_assert(topos_tensor_is_contiguous(cv));
      ck_assert_msg(topos_tensor_bitwise_equal(cv, v),
                    "case %zu dir %d: the copy differs from its view", c, dir);
      /* and against the elements by index */
      int64_t n = topos_tensor_count(cv);
      const float *got = tensor_data(cv);
      for (int64_t i = 0; i < n; i++) {
        int64_t idx[3], r = i;
        for (int a = 2; a >= 0; a--) {
          idx[a] = r % v->shape[a];
          r /= v->shape[a];
        }
        const float *src = (const float *)tensor_data(v) +
                           idx[0] * v->stride[0] + idx[1] * v->stride[1] +
                           idx[2] * v->stride[2];
        ck_assert_msg(memcmp(&got[i], src, 4) == 0,
                      "case %zu dir %d element %lld", c, dir, (long long)i);
      }
      topos_tensor_release(cv);
      topos_tensor_release(v);
      topos_tensor_release(t);
    }
}
END_TEST

START_TEST(test_contiguous) {
  topos_error err = {0};
  int64_t shape[2] = {3, 4};
  topos_tensor *t = iota(TOPOS_BF16, 2, shape);
  topos_tensor *same = topos_tensor_contiguous(t, &err);
  ck_assert_ptr_eq(same, t);
  ck_assert_int_eq(atomic_load(&t->refs), 2);
  topos_tensor_release(same);
  /* Whole rows are contiguous whatever the offset: retained, not copied. */
  topos_tensor *rows = topos_tensor_narrow(t, 0, 1, 2, &err);
  topos_tensor *rc = topos_tensor_contiguous(rows, &err);
  ck_assert_ptr_eq(rc, rows);
  topos_tensor_release(rc);
  /* Columns are not: copied into a fresh row-major buffer. */
  topos_tensor *cols = topos_tensor_narrow(t, 1, 1, 2, &err);
  topos_tensor *cc = topos_tensor_contiguous(cols, &err);
  ck_assert_ptr_ne(cc, cols);
  ck_assert_ptr_ne(cc->buf, t->buf);
  ck_assert(topos_tensor_is_contiguous(cc));
  ck_assert_int_eq(cc->offset, 0);
  ck_assert_int_eq(cc->stride[0], 2);
  ck_assert_int_eq(cc->stride[1], 1);
  double want[6] = {1, 2, 5, 6, 9, 10};
  tt_assert_values(cc, want, 6);
  ck_assert(topos_tensor_bitwise_equal(cc, cols));
  uint16_t raw[6];
  memcpy(raw, tensor_data(cc), sizeof raw);
  for (int i = 0; i < 6; i++)
    ck_assert_uint_eq(raw[i], topos_bf16_from_f32((float)want[i]));
  /* Extent-1 axes do not break contiguity, whatever their stride. */
  int64_t s[3] = {3, 1, 4};
  topos_tensor *u = iota(TOPOS_F32, 3, s);
  int perm[3] = {1, 0, 2};
  topos_tensor *up = topos_tensor_permute(u, perm, &err);
  ck_assert(topos_tensor_is_contiguous(up));
  EXPECT_NULL_ERR(topos_tensor_contiguous(NULL, &err), TOPOS_ERR_ARGUMENT,
                  "NULL");
  topos_tensor *list[] = {t, rows, cols, cc, u, up};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

/* ----------------------------------------------------------------- bf16 */

static void expect_bf16(uint32_t f32bits, uint16_t want) {
  uint16_t got = topos_bf16_from_f32(float_of(f32bits));
  ck_assert_msg(got == want, "bf16(0x%08X) = 0x%04X, want 0x%04X",
                (unsigned)f32bits, (unsigned)got, (unsigned)want);
}

START_TEST(test_bf16_ties_to_even) {
  expect_bf16(0x3F808000, 0x3F80); /* 1 + 2^-8: tie, down to even */
  expect_bf16(0x3F818000, 0x3F82); /* 1 + 3*2^-8: tie, up to even */
  expect_bf16(0xBF808000, 0xBF80); /* negative ties mirror */
  expect_bf16(0xBF818000, 0xBF82);
  expect_bf16(0x3F808001, 0x3F81); /* just above a tie rounds up */
  expect_bf16(0x3F807FFF, 0x3F80); /* just below rounds down */
  expect_bf16(0x3F817FFF, 0x3F81);
  expect_bf16(0x3F818001, 0x3F82);
  expect_bf16(0x3FFF8000, 0x4000); /* carry into the exponent */
  expect_bf16(0x3F800000, 0x3F80); /* exact values are kept */
  ck_assert_uint_eq(topos_bf16_from_f32(1.0f), 0x3F80);
  ck_assert_uint_eq(topos_bf16_from_f32(-2.0f), 0xC000);
  ck_assert(topos_bf16_to_f32(0x3F81) == 1.0f + 0.0078125f);
}
END_TEST

START_TEST(test_bf16_specials) {
  /* NaNs stay NaN, quiet, with their sign, even when rounding their bits
   * would carry into Inf. */
  uint32_t nans[6] = {0x7FC00000, 0x7F800001, 0x7FFFFFFF,
                      0xFFC00000, 0xFF800001, 0x7F80FFFF};
  for (int i = 0; i < 6; i++) {
    uint16_t b = topos_bf16_from_f32(float_of(nans[i]));
    float back = topos_bf16_to_f32(b);
    ck_assert_msg(isnan(back), "0x%08X -> 0x%04X is not NaN", nans[i], b);
    ck_assert_uint_eq(b & 0x0040, 0x0040); /* quiet */
    ck_assert_uint_eq(b & 0x8000, (nans[i] >> 16) & 0x8000);
  }
  ck_assert_uint_eq(topos_bf16_from_f32(float_of(0x7FC00000)), 0x7FC0);
  ck_assert_uint_eq(topos_bf16_from_f32(float_of(0xFFC00000)), 0xFFC0);
  ck_assert_uint_eq(topos_bf16_from_f32(float_of(0x7FFFFFFF)), 0x7FFF);
  /* Infinities and overflow. */
  ck_assert_uint_eq(topos_bf16_from_f32(INFINITY), 0x7F80);
  ck_assert_uint_eq(topos_bf16_from_f32(-INFINITY), 0xFF80);
  ck_assert_uint_eq(topos_bf16_from_f32(3.4e38f), 0x7F80);
  ck_assert_uint_eq(topos_bf16_from_f32(FLT_MAX), 0x7F80);
  ck_assert_uint_eq(topos_bf16_from_f32(-FLT_MAX), 0xFF80);
  /* The largest finite bf16 survives; the tie above it overflows (0x7F7F
   * is odd); just under the tie does not. */
  float maxbf = topos_bf16_to_f32(0x7F7F);
  ck_assert(maxbf == 0x1.FEp127f);
  ck_assert_uint_eq(topos_bf16_from_f32(maxbf), 0x7F7F);
  expect_bf16(0x7F7F7FFF, 0x7F7F);
  expect_bf16(0x7F7F8000, 0x7F80);
  expect_bf16(0xFF7F7FFF, 0xFF7F);
  /* Subnormals round like everything else. */
  expect_bf16(0x00010000, 0x0001); /* the smallest bf16 subnormal */
  ck_assert(topos_bf16_to_f32(0x0001) == ldexpf(1.0f, -133));
  expect_bf16(0x00008000, 0x0000); /* tie between 0 and it: even is 0 */
  expect_bf16(0x00008001, 0x0001);
  expect_bf16(0x00018000, 0x0002); /* tie between 1 and 2 ulps: 2 */
  expect_bf16(0x00000001, 0x0000); /* the smallest f32 subnormal */
  expect_bf16(0x80008001, 0x8001);
  expect_bf16(0x007FFFFF, 0x0080); /* rounds up into the normals */
  /* Signed zeros keep their sign. */
  ck_assert_uint_eq(topos_bf16_from_f32(-0.0f), 0x8000);
  ck_assert_uint_eq(topos_bf16_from_f32(0.0f), 0x0000);
  ck_assert(signbit(topos_bf16_to_f32(0x8000)));
  ck_assert(topos_bf16_to_f32(0x8000) == 0.0f);
}
END_TEST

START_TEST(test_bf16_roundtrip_all) {
  for (uint32_t b = 0; b <= 0xFFFF; b++) {
    float f = topos_bf16_to_f32((uint16_t)b);
    ck_assert_uint_eq(bits_of(f), b << 16);
    uint16_t back = topos_bf16_from_f32(f);
    if (isnan(f))
      ck_assert(isnan(topos_bf16_to_f32(back)) &&
                (back & 0x8000) == (b & 0x8000));
    else
      ck_assert_uint_eq(back, b);
  }
}
END_TEST

START_TEST(test_bf16_round_array) {
  enum { N = 1000 };
  float src[N];
  uint16_t dst[N];
  uint64_t s = 5;
  for (int i = 0; i < N; i++) {
    /* Random bit patterns cover every class: normals, subnormals, NaN. */
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    src[i] = float_of((uint32_t)s);
  }
  src[0] = float_of(0x3F808000);
  src[1] = float_of(0x3F818000);
  src[2] = float_of(0x7FFFFFFF);
  bf16_round_array(src, dst, N);
  for (int i = 0; i < N; i++)
    ck_assert_uint_eq(dst[i], topos_bf16_from_f32(src[i]));
  ck_assert_uint_eq(dst[0], 0x3F80);
  ck_assert_uint_eq(dst[1], 0x3F82);
  ck_assert_uint_eq(dst[2], 0x7FFF);
  dst[0] = 0xABCD;
  bf16_round_array(src, dst, 0); /* n = 0 writes nothing */
  ck_assert_uint_eq(dst[0], 0xABCD);
}
END_TEST

START_TEST(test_bf16_tensor_get_widens_exactly) {
  int64_t shape[1] = {3};
  uint16_t bits[3] = {0x3F81, 0x0001, 0xFF7F};
  topos_tensor *t = topos_tensor_from(TOPOS_BF16, 1, shape, bits, NULL);
  double want[3] = {1.0078125, ldexp(1, -133), -0x1.FEp127};
  tt_assert_values(t, want, 3);
  topos_tensor_release(t);
}
END_TEST

/* -------------------------------------------------------- compute views */

START_TEST(test_compute_view_borrows) {
  topos_error err = {0};
  int64_t shape[2] = {3, 4};
  topos_dtype borrowing[3] = {TOPOS_F32, TOPOS_F64, TOPOS_I32};
  for (int k = 0; k < 3; k++) {
    topos_tensor *t = iota(borrowing[k], 2, shape);
    compute_view v;
    ck_assert_int_eq(compute_view_of(t, &v, &err), TOPOS_OK);
    ck_assert_ptr_eq(v.data, tensor_data(t));
    ck_assert_ptr_null(v.owned);
    compute_view_done(&v);
    ck_assert_ptr_null(v.data);
    /* Whole rows at an offset still borrow, at the offset. */
    topos_tensor *rows = topos_tensor_narrow(t, 0, 1, 2, &err);
    ck_assert_int_eq(compute_view_of(rows, &v, &err), TOPOS_OK);
    ck_assert_ptr_eq(v.data, tensor_data(rows));
    ck_assert_ptr_ne(v.data, tensor_data(t));
    ck_assert_ptr_null(v.owned);
    compute_view_done(&v);
    topos_tensor_release(rows);
    topos_tensor_release(t);
  }
}
END_TEST

START_TEST(test_compute_view_converts) {
  topos_error err = {0};
  int64_t shape[2] = {3, 4};
  /* bf16 always converts to float, even when contiguous. */
  topos_tensor *h = iota(TOPOS_BF16, 2, shape);
  compute_view v;
  ck_assert_int_eq(compute_view_of(h, &v, &err), TOPOS_OK);
  ck_assert_ptr_nonnull(v.owned);
  ck_assert_ptr_eq(v.data, v.owned);
  ck_assert_uint_ge(v.capacity, 12 * sizeof(float));
  for (int i = 0; i < 12; i++) ck_assert(((const float *)v.data)[i] == i);
  compute_view_done(&v);
  ck_assert_ptr_null(v.owned);
  ck_assert_uint_eq(v.capacity, 0);
  /* A transposed bf16 view converts in row-major order. */
  topos_tensor *ht = topos_tensor_transpose(h, &err);
  ck_assert_int_eq(compute_view_of(ht, &v, &err), TOPOS_OK);
  const float *fv = v.data;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) ck_assert(fv[i * 3 + j] == j * 4 + i);
  compute_view_done(&v);
  /* Non-contiguous f32 / f64 / i32 copy in their own types. */
  topos_tensor *d = iota(TOPOS_F64, 2, shape);
  topos_tensor *dt = topos_tensor_transpose(d, &err);
  ck_assert_int_eq(compute_view_of(dt, &v, &err), TOPOS_OK);
  ck_assert_ptr_nonnull(v.owned);
  const double *dv = v.data;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) ck_assert(dv[i * 3 + j] == j * 4 + i);
  compute_view_done(&v);
  topos_tensor *i32 = iota(TOPOS_I32, 2, shape);
  topos_tensor *cols = topos_tensor_narrow(i32, 1, 2, 2, &err);
  ck_assert_int_eq(compute_view_of(cols, &v, &err), TOPOS_OK);
  ck_assert_ptr_nonnull(v.owned);
  const int32_t *iv = v.data;
  int32_t want_i[6] = {2, 3, 6, 7, 10, 11};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(iv[i], want_i[i]);
  compute_view_done(&v);
  /* A broadcast scalar materialises every element. */
  topos_tensor *s = topos_tensor_scalar(TOPOS_F32, -3.5, &err);
  topos_tensor *bs = topos_tensor_broadcast(s, 2, shape, &err);
  ck_assert_int_eq(compute_view_of(bs, &v, &err), TOPOS_OK);
  ck_assert_ptr_nonnull(v.owned);
  for (int i = 0; i < 12; i++) ck_assert(((const float *)v.data)[i] == -3.5f);
  compute_view_done(&v);
  /* Long non-contiguous bf16 (the in-place widening path) stays exact. */
  int64_t big[2] = {37, 53};
  topos_tensor *r = tt_random(TOPOS_BF16, 2, big, 3, -100, 100);
  topos_tensor *rt = topos_tensor_transpose(r, &err);
  ck_assert_int_eq(compute_view_of(rt, &v, &err), TOPOS_OK);
  for (int64_t i = 0; i < 53; i++)
    for (int64_t j = 0; j < 37; j++) {
      int64_t idx[2] = {i, j};
      ck_assert(((const float *)v.data)[i * 37 + j] ==
                topos_tensor_get(rt, idx, &err));
    }
  compute_view_done(&v);
  /* Errors. */
  ck_assert_int_eq(compute_view_of(NULL, &v, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(v.data);
  ck_assert_int_eq(compute_view_of(h, NULL, &err), TOPOS_ERR_ARGUMENT);
  compute_view_done(NULL);
  topos_tensor *list[] = {h, ht, d, dt, i32, cols, s, bs, r, rt};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    topos_tensor_release(list[i]);
}
END_TEST

/* ------------------------------------------------- tensor_zeros_like_meta */

START_TEST(test_zeros_like_meta) {
  topos_error err = {0};
  for (int k = 0; k < 4; k++) {
    tensor_meta m = {.dtype = all_dtypes[k], .rank = 3, .shape = {64, 32, 16}};
    topos_tensor *z = tensor_zeros_like_meta(&m, &err);
    ck_assert_msg(z != NULL, "%s", err.message);
    ck_assert_int_eq(topos_tensor_dtype(z), all_dtypes[k]);
    ck_assert_int_eq(topos_tensor_count(z), 64 * 32 * 16);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(z->stride[i], 0);
    /* One element of storage, not 32768. */
    ck_assert_uint_le(z->buf->capacity, 64);
    topos_tensor *full = topos_tensor_zeros(all_dtypes[k], 3, m.shape, &err);
    ck_assert(topos_tensor_bitwise_equal(z, full));
    int64_t idx[3] = {63, 31, 15};
    double v = topos_tensor_get(z, idx, &err);
    ck_assert(v == 0.0 && !signbit(v));
    topos_tensor_release(full);
    topos_tensor_release(z);
  }
  tensor_meta scalar = {.dtype = TOPOS_F64, .rank = 0};
  topos_tensor *s = tensor_zeros_like_meta(&scalar, &err);
  ck_assert_int_eq(topos_tensor_rank(s), 0);
  ck_assert(topos_tensor_get(s, NULL, &err) == 0.0);
  topos_tensor_release(s);
  tensor_meta empty = {.dtype = TOPOS_F32, .rank = 2, .shape = {0, 5}};
  topos_tensor *e = tensor_zeros_like_meta(&empty, &err);
  ck_assert_int_eq(topos_tensor_count(e), 0);
  topos_tensor_release(e);
  tensor_meta bad = {.dtype = (topos_dtype)6, .rank = 1, .shape = {2}};
  EXPECT_NULL_ERR(tensor_zeros_like_meta(&bad, &err), TOPOS_ERR_DTYPE, "dtype");
  tensor_meta neg = {.dtype = TOPOS_F32, .rank = 1, .shape = {-2}};
  EXPECT_NULL_ERR(tensor_zeros_like_meta(&neg, &err), TOPOS_ERR_SHAPE,
                  "negative");
  tensor_meta deep = {.dtype = TOPOS_F32, .rank = 9};
  EXPECT_NULL_ERR(tensor_zeros_like_meta(&deep, &err), TOPOS_ERR_ARGUMENT,
                  "rank 9");
  EXPECT_NULL_ERR(tensor_zeros_like_meta(NULL, &err), TOPOS_ERR_ARGUMENT,
                  "NULL");
}
END_TEST

START_TEST(test_tensor_view_internal) {
  int64_t shape[1] = {6};
  topos_tensor *t = iota(TOPOS_F32, 1, shape);
  int64_t vs[2] = {2, 2}, st[2] = {3, 1};
  topos_tensor *v = tensor_view(t, 2, vs, st, 1);
  ck_assert_ptr_nonnull(v);
  ck_assert_ptr_eq(v->buf, t->buf);
  ck_assert_ptr_eq(tensor_data(v), (float *)tensor_data(t) + 1);
  double want[4] = {1, 2, 4, 5};
  tt_assert_values(v, want, 4);
  float out[4];
  tensor_copy_out(v, out);
  for (int i = 0; i < 4; i++) ck_assert(out[i] == (float)want[i]);
  topos_tensor_release(t);
  tt_assert_values(v, want, 4); /* the view holds the buffer */
  topos_tensor_release(v);
  /* tensor_new hands out uninitialised but usable, aligned memory. */
  int64_t s2[2] = {5, 7};
  topos_tensor *n = tensor_new(TOPOS_F64, 2, s2, NULL);
  ck_assert_ptr_nonnull(n);
  ck_assert_uint_eq((uintptr_t)tensor_data(n) % 64, 0);
  ck_assert_uint_ge(n->buf->capacity, 35 * sizeof(double));
  memset(tensor_data(n), 0, 35 * sizeof(double));
  topos_tensor_release(n);
}
END_TEST

Suite *tensor_suite(void) {
  Suite *s = suite_create("tensor");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_dtype_names_and_sizes);
  tcase_add_test(tc, test_shape_helpers);
  tcase_add_test(tc, test_from_every_dtype);
  tcase_add_test(tc, test_filled_zeros_ones_scalar);
  tcase_add_test(tc, test_filled_rounds_once);
  tcase_add_test(tc, test_filled_i32_range);
  tcase_add_test(tc, test_constructor_errors);
  tcase_add_test(tc, test_zero_extent_tensors);
  tcase_add_test(tc, test_get_read_roundtrip);
  tcase_add_test(tc, test_read_transposed_views);
  tcase_add_test(tc, test_access_errors);
  tcase_add_test(tc, test_meta_of);
  tcase_add_test(tc, test_retain_release);
  tcase_add_test(tc, test_refcounts_across_threads);
  tcase_add_test(tc, test_transpose_view);
  tcase_add_test(tc, test_permute_view);
  tcase_add_test(tc, test_narrow_view);
  tcase_add_test(tc, test_broadcast_view);
  tcase_add_test(tc, test_unfold_view);
  tcase_add_test(tc, test_bitwise_equal);
  tcase_add_test(tc, test_contiguous);
  tcase_add_test(tc, test_contiguous_transposing);
  tcase_add_test(tc, test_bf16_ties_to_even);
  tcase_add_test(tc, test_bf16_specials);
  tcase_add_test(tc, test_bf16_roundtrip_all);
  tcase_add_test(tc, test_bf16_round_array);
  tcase_add_test(tc, test_bf16_tensor_get_widens_exactly);
  tcase_add_test(tc, test_compute_view_borrows);
  tcase_add_test(tc, test_compute_view_converts);
  tcase_add_test(tc, test_zeros_like_meta);
  tcase_add_test(tc, test_tensor_view_internal);
  suite_add_tcase(s, tc);
  return s;
}
