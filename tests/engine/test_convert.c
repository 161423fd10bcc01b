/*
 * test_convert.c - topos_tensor_convert among f32, f64 and bf16: widening
 * is exact, narrowing rounds once to nearest even (checked against an
 * independent rounding written here with frexp and ldexp, not the
 * engine's bit tricks), NaN stays a quiet NaN with its sign, overflow
 * goes to infinity, any layout converts to a row-major tensor, the same
 * dtype is the tensor itself, and i32 is refused.
 */
#include <float.h>
#include <stdint.h>

#include "testutil.h"

/* x rounded once to nearest even with `bits` significand bits (8 for
 * bf16, 24 for f32) and the f32/bf16 exponent range (subnormals below
 * 2^-126, infinity past the largest finite value). */
static double ref_round(double x, int bits) {
  if (isnan(x) || isinf(x) || x == 0) return x;
  double a = fabs(x);
  int e;
  frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  if (e < -125) e = -125;
  double ulp = ldexp(1.0, e - bits);
  double q = a / ulp, lo = floor(q), frac = q - lo;
  if (frac > 0.5 || (frac == 0.5 && fmod(lo, 2.0) != 0)) lo += 1;
  double r = lo * ulp;
  double max = ldexp(2.0 - ldexp(1.0, 1 - bits), 127);
  if (r > max) r = INFINITY;
  return x < 0 ? -r : r;
}

static uint16_t ref_bf16(double x) {
  /* The rounded value is a bf16, so its f32 is exact and its high half
   * is the bf16 pattern. */
  float f = (float)ref_round(x, 8);
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return (uint16_t)(b >> 16);
}

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

static topos_tensor *convert_ok(const topos_tensor *t, topos_dtype to) {
  topos_error err = {0};
  topos_tensor *c = topos_tensor_convert(t, to, &err);
  ck_assert_msg(c != NULL, "convert: %s", err.message);
  ck_assert_int_eq(topos_tensor_dtype(c), to);
  ck_assert_int_eq(topos_tensor_rank(c), topos_tensor_rank(t));
  for (int i = 0; i < topos_tensor_rank(t); i++)
    ck_assert_int_eq(topos_tensor_shape(c)[i], topos_tensor_shape(t)[i]);
  ck_assert(topos_tensor_is_contiguous(c));
  return c;
}

/* Doubles near bf16 ties and f32 ties, over the whole exponent range:
 * a bf16 value, plus a multiple of a quarter of its ulp, plus a nudge
 * far below f32's precision (the case double rounding gets wrong). */
static double near_tie(uint64_t *s) {
  double m = 1.0 + floor(tt_uniform(s, 0, 128)) / 128.0; /* 8 bits */
  int e = (int)floor(tt_uniform(s, -140, 130));
  double quarter = ldexp(1.0, e - 9);
  double k = floor(tt_uniform(s, 0, 5));
  double nudge = ldexp(tt_uniform(s, -1, 1), e - 40);
  double v =
      ldexp(m, e) + k * quarter + (tt_uniform(s, 0, 1) < 0.5 ? 0 : nudge);
  return tt_uniform(s, 0, 1) < 0.5 ? -v : v;
}

START_TEST(f64_to_bf16_rounds_once) {
  enum { N = 20000 };
  double *x = malloc(sizeof(double) * N);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < N; i++) x[i] = near_tie(&s);
  /* The classic: 1 + 2^-8 + 2^-30 is above the bf16 tie 1 + 2^-8, but
   * through f32 it lands on the tie and rounds down to 1. */
  x[0] = 1.0 + ldexp(1, -8) + ldexp(1, -30);
  int64_t shape[1] = {N};
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_F64, 1, shape, x, &err);
  topos_tensor *c = convert_ok(t, TOPOS_BF16);
  uint16_t *got = malloc(sizeof(uint16_t) * N);
  ck_assert_int_eq(topos_tensor_read(c, got, sizeof(uint16_t) * N, &err),
                   TOPOS_OK);
  ck_assert_uint_eq(got[0], 0x3F81); /* 1 + 2^-7 */
  for (int i = 0; i < N; i++)
    ck_assert_msg(got[i] == ref_bf16(x[i]), "%a: got %04x, want %04x", x[i],
                  got[i], ref_bf16(x[i]));
  free(got);
  free(x);
  topos_tensor_release(c);
  topos_tensor_release(t);
}
END_TEST

START_TEST(f32_to_bf16_and_f64_to_f32_round_to_nearest_even) {
  enum { N = 20000 };
  float *f = malloc(sizeof(float) * N);
  double *d = malloc(sizeof(double) * N);
  uint64_t s = 12345;
  for (int i = 0; i < N; i++) {
    d[i] = near_tie(&s);
    f[i] = (float)ref_round(d[i], 24); /* an f32 near a bf16 tie */
  }
  int64_t shape[2] = {100, N / 100};
  topos_error err = {0};
  topos_tensor *tf = topos_tensor_from(TOPOS_F32, 2, shape, f, &err);
  topos_tensor *td = topos_tensor_from(TOPOS_F64, 2, shape, d, &err);
  topos_tensor *cb = convert_ok(tf, TOPOS_BF16);
  topos_tensor *cf = convert_ok(td, TOPOS_F32);
  uint16_t *b = malloc(sizeof(uint16_t) * N);
  float *g = malloc(sizeof(float) * N);
  ck_assert_int_eq(topos_tensor_read(cb, b, sizeof(uint16_t) * N, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(cf, g, sizeof(float) * N, &err), TOPOS_OK);
  for (int i = 0; i < N; i++) {
    ck_assert_msg(b[i] == ref_bf16(f[i]), "%a: got %04x, want %04x",
                  (double)f[i], b[i], ref_bf16(f[i]));
    /* The public scalar conversion agrees. */
    ck_assert_uint_eq(b[i], topos_bf16_from_f32(f[i]));
    float want = (float)ref_round(d[i], 24);
    ck_assert_msg(f32_bits(g[i]) == f32_bits(want), "%a: got %a, want %a", d[i],
                  (double)g[i], (double)want);
  }
  free(b);
  free(g);
  free(f);
  free(d);
  topos_tensor_release(cb);
  topos_tensor_release(cf);
  topos_tensor_release(tf);
  topos_tensor_release(td);
}
END_TEST

START_TEST(specials) {
  const double v[] = {0.0,
                      -0.0,
                      INFINITY,
                      -INFINITY,
                      NAN,
                      -NAN,
                      FLT_MAX,
                      -FLT_MAX,
                      1e300,
                      -1e300,
                      3.3895313892515355e38, /* bf16's largest */
                      3.3962e38,             /* past half its ulp */
                      FLT_MIN,
                      ldexp(1, -133), /* bf16's smallest subnormal */
                      ldexp(1, -135), /* a quarter of it: to +0 */
                      ldexp(3, -135), /* three quarters: up */
                      1e-300};
  enum { N = sizeof v / sizeof v[0] };
  int64_t shape[1] = {N};
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_F64, 1, shape, v, &err);
  topos_tensor *b = convert_ok(t, TOPOS_BF16);
  topos_tensor *f = convert_ok(t, TOPOS_F32);
  topos_tensor *fb = convert_ok(f, TOPOS_BF16);
  uint16_t got[N], via[N];
  float gf[N];
  ck_assert_int_eq(topos_tensor_read(b, got, sizeof got, &err), TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(f, gf, sizeof gf, &err), TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(fb, via, sizeof via, &err), TOPOS_OK);
  for (int i = 0; i < N; i++) {
    if (isnan(v[i])) {
      /* NaN: a quiet NaN with the sign, in every target. */
      ck_assert((got[i] & 0x7F80) == 0x7F80 && (got[i] & 0x0040));
      ck_assert_int_eq(got[i] >> 15, signbit(v[i]) ? 1 : 0);
      ck_assert(isnan(gf[i]) && !!signbit(gf[i]) == !!signbit(v[i]));
      ck_assert((f32_bits(gf[i]) & 0x00400000u) != 0);
      continue;
    }
    ck_assert_msg(got[i] == ref_bf16(v[i]), "%a: got %04x, want %04x", v[i],
                  got[i], ref_bf16(v[i]));
  }
  ck_assert_uint_eq(got[1], 0x8000);          /* -0 keeps its sign */
  ck_assert_uint_eq(got[8], 0x7F80);          /* 1e300: +inf */
  ck_assert_uint_eq(got[9], 0xFF80);          /* -1e300: -inf */
  ck_assert_uint_eq(got[10], 0x7F7F);         /* bf16's largest, exact */
  ck_assert_uint_eq(got[11], 0x7F80);         /* past it: inf */
  ck_assert_uint_eq(got[13], 0x0001);         /* smallest subnormal */
  ck_assert_uint_eq(got[14], 0x0000);         /* below half of it: +0 */
  ck_assert_uint_eq(got[15], 0x0001);         /* above half: up */
  ck_assert(isinf(gf[8]) && gf[8] > 0);       /* 1e300 to f32: +inf */
  ck_assert(gf[16] == 0 && !signbit(gf[16])); /* 1e-300: +0 */
  topos_tensor_release(fb);
  topos_tensor_release(f);
  topos_tensor_release(b);
  topos_tensor_release(t);
}
END_TEST

START_TEST(widening_is_exact) {
  /* Every bf16 pattern widens to f32 and f64 exactly, and back to bf16
   * unchanged (NaNs: a quiet NaN of the same sign). */
  enum { N = 65536 };
  uint16_t *all = malloc(sizeof(uint16_t) * N);
  for (int i = 0; i < N; i++) all[i] = (uint16_t)i;
  int64_t shape[1] = {N};
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_BF16, 1, shape, all, &err);
  topos_tensor *f = convert_ok(t, TOPOS_F32);
  topos_tensor *d = convert_ok(t, TOPOS_F64);
  topos_tensor *fd = convert_ok(f, TOPOS_F64);
  topos_tensor *back = convert_ok(d, TOPOS_BF16);
  topos_tensor *back32 = convert_ok(f, TOPOS_BF16);
  float *gf = malloc(sizeof(float) * N);
  double *gd = malloc(sizeof(double) * N);
  uint16_t *gb = malloc(sizeof(uint16_t) * N);
  ck_assert_int_eq(topos_tensor_read(f, gf, sizeof(float) * N, &err), TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(d, gd, sizeof(double) * N, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(back, gb, sizeof(uint16_t) * N, &err),
                   TOPOS_OK);
  ck_assert(topos_tensor_bitwise_equal(d, fd));
  ck_assert(topos_tensor_bitwise_equal(back, back32));
  for (int i = 0; i < N; i++) {
    uint32_t want = (uint32_t)i << 16;
    bool nan = (i & 0x7F80) == 0x7F80 && (i & 0x7F);
    if (!nan) {
      ck_assert_uint_eq(f32_bits(gf[i]), want);
      ck_assert(gd[i] == (double)gf[i]);
      ck_assert_uint_eq(gb[i], (uint16_t)i);
    } else {
      ck_assert(isnan(gf[i]) && isnan(gd[i]));
      ck_assert_uint_eq(gb[i], (uint16_t)(i | 0x0040));
    }
  }
  free(all);
  free(gf);
  free(gd);
  free(gb);
  topos_tensor_release(back32);
  topos_tensor_release(back);
  topos_tensor_release(fd);
  topos_tensor_release(d);
  topos_tensor_release(f);
  topos_tensor_release(t);
}
END_TEST

START_TEST(views_convert_row_major) {
  topos_error err = {0};
  int64_t shape[2] = {5, 7};
  topos_tensor *a = tt_random(TOPOS_F32, 2, shape, 7, -3, 3);
  topos_tensor *tr = topos_tensor_transpose(a, &err);
  topos_tensor *nr = topos_tensor_narrow(a, 1, 2, 3, &err);
  int64_t bs[3] = {2, 5, 7}, ashape3[3] = {1, 5, 7};
  double vals[35];
  for (int i = 0; i < 35; i++) {
    int64_t idx[2] = {i / 7, i % 7};
    vals[i] = topos_tensor_get(a, idx, &err);
  }
  topos_tensor *a3 = tt_tensor(TOPOS_F32, 3, ashape3, vals);
  topos_tensor *br = topos_tensor_broadcast(a3, 3, bs, &err);
  const topos_tensor *views[3] = {tr, nr, br};
  for (int v = 0; v < 3; v++) {
    ck_assert_ptr_nonnull(views[v]);
    for (int d = 0; d < 2; d++) {
      topos_dtype to = d ? TOPOS_F64 : TOPOS_BF16;
      topos_tensor *c = convert_ok(views[v], to);
      topos_tensor *copy = topos_tensor_contiguous(views[v], &err);
      topos_tensor *want = convert_ok(copy, to);
      ck_assert(topos_tensor_bitwise_equal(c, want));
      /* Element by element: the view's value, rounded. */
      int r = topos_tensor_rank(views[v]);
      const int64_t *sh = topos_tensor_shape(views[v]);
      int64_t idx[3] = {0, 0, 0};
      for (int64_t i = 0; i < topos_tensor_count(c); i++) {
        int64_t rem = i;
        for (int k = r - 1; k >= 0; k--) {
          idx[k] = rem % sh[k];
          rem /= sh[k];
        }
        double x = topos_tensor_get(views[v], idx, &err);
        double y = topos_tensor_get(c, idx, &err);
        ck_assert(y == (d ? x : (double)topos_bf16_to_f32(ref_bf16(x))));
      }
      topos_tensor_release(want);
      topos_tensor_release(copy);
      topos_tensor_release(c);
    }
  }
  topos_tensor_release(br);
  topos_tensor_release(a3);
  topos_tensor_release(nr);
  topos_tensor_release(tr);
  topos_tensor_release(a);
}
END_TEST

START_TEST(same_dtype_scalars_and_empty) {
  topos_error err = {0};
  topos_tensor *s = topos_tensor_scalar(TOPOS_F32, 1.0 / 3.0, &err);
  /* The same dtype: the tensor itself. */
  topos_tensor *same = topos_tensor_convert(s, TOPOS_F32, &err);
  ck_assert_ptr_eq(same, s);
  topos_tensor_release(same);
  topos_tensor *b = convert_ok(s, TOPOS_BF16);
  ck_assert_int_eq(topos_tensor_rank(b), 0);
  ck_assert(topos_tensor_get(b, NULL, &err) ==
            (double)topos_bf16_to_f32(topos_bf16_from_f32((float)(1.0 / 3.0))));
  int64_t zs[2] = {3, 0};
  topos_tensor *z = topos_tensor_zeros(TOPOS_F64, 2, zs, &err);
  topos_tensor *zb = convert_ok(z, TOPOS_BF16);
  ck_assert_int_eq(topos_tensor_count(zb), 0);
  topos_tensor_release(zb);
  topos_tensor_release(z);
  topos_tensor_release(b);
  topos_tensor_release(s);
}
END_TEST

START_TEST(errors) {
  topos_error err = {0};
  ck_assert_ptr_null(topos_tensor_convert(NULL, TOPOS_F32, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(topos_tensor_convert(NULL, TOPOS_F32, NULL));
  int64_t shape[1] = {3};
  topos_tensor *i = topos_tensor_zeros(TOPOS_I32, 1, shape, &err);
  topos_tensor *f = topos_tensor_zeros(TOPOS_F32, 1, shape, &err);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_tensor_convert(i, TOPOS_F32, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  ck_assert_ptr_nonnull(strstr(err.message, "i32"));
  err = (topos_error){0};
  ck_assert_ptr_null(topos_tensor_convert(i, TOPOS_I32, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_tensor_convert(f, TOPOS_I32, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_tensor_convert(f, (topos_dtype)9, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  topos_tensor_release(f);
  topos_tensor_release(i);
}
END_TEST

Suite *convert_suite(void) {
  Suite *s = suite_create("convert");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, f64_to_bf16_rounds_once);
  tcase_add_test(tc, f32_to_bf16_and_f64_to_f32_round_to_nearest_even);
  tcase_add_test(tc, specials);
  tcase_add_test(tc, widening_is_exact);
  tcase_add_test(tc, views_convert_row_major);
  tcase_add_test(tc, same_dtype_scalars_and_empty);
  tcase_add_test(tc, errors);
  suite_add_tcase(s, tc);
  return s;
}
