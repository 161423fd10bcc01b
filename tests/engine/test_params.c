/*
 * test_params.c - parameter sets and fields: construction, the algebra
 * (values, rounding per dtype, strided inputs, mismatches), bitwise
 * equality, and the network-facing functions (initial parameters, fields
 * from backward, parameters_of).
 */
#include "testutil.h"

/* A one-slot-per-tensor set; the tensors are released (the set keeps
 * them). */
static topos_params *set_of(int n, topos_tensor **t) {
  topos_error err = {0};
  topos_params *p = topos_params_new(n, t, &err);
  ck_assert_msg(p != NULL, "params_new: %s", err.message);
  for (int i = 0; i < n; i++) topos_tensor_release(t[i]);
  return p;
}

static topos_params *set1(topos_dtype dt, int64_t len, const double *v) {
  topos_tensor *t = tt_tensor(dt, 1, (int64_t[]){len}, v);
  return set_of(1, &t);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The bf16 bit pattern element i of a bf16 tensor holds. */
static uint16_t bf16_at(const topos_tensor *t, int64_t i) {
  int64_t idx[1] = {i};
  topos_error err = {0};
  return topos_bf16_from_f32((float)topos_tensor_get(t, idx, &err));
}

/* ------------------------------------------------------------ construction */

START_TEST(test_new_get_count_with) {
  topos_error err = {0};
  topos_tensor *a = tt_tensor(TOPOS_F32, 1, (int64_t[]){2}, (double[]){1, 2});
  topos_tensor *b = tt_tensor(TOPOS_F64, 0, NULL, (double[]){3});
  topos_tensor *c = tt_tensor(TOPOS_F64, 0, NULL, (double[]){4});
  topos_tensor *both[2] = {a, b};
  topos_params *p = topos_params_new(2, both, &err);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(topos_params_count(p), 2);
  /* Retained, not copied. */
  ck_assert_ptr_eq(topos_params_get(p, 0), a);
  ck_assert_ptr_eq(topos_params_get(p, 1), b);
  ck_assert_ptr_null(topos_params_get(p, -1));
  ck_assert_ptr_null(topos_params_get(p, 2));
  ck_assert_ptr_null(topos_params_get(NULL, 0));
  ck_assert_int_eq(topos_params_count(NULL), 0);

  topos_params *q = topos_params_with(p, 1, c, &err);
  ck_assert_ptr_nonnull(q);
  ck_assert_int_eq(topos_params_count(q), 2);
  ck_assert_ptr_eq(topos_params_get(q, 0), a);
  ck_assert_ptr_eq(topos_params_get(q, 1), c);
  ck_assert_ptr_eq(topos_params_get(p, 1), b); /* p is unchanged */

  ck_assert_ptr_null(topos_params_with(p, 2, c, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_with(p, -1, c, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_with(p, 0, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_with(NULL, 0, c, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);

  /* The sets keep the tensors alive after the caller lets go. */
  topos_tensor_release(a);
  topos_tensor_release(b);
  topos_tensor_release(c);
  tt_assert_values(topos_params_get(q, 0), ((double[]){1, 2}), 2);
  tt_assert_values(topos_params_get(p, 1), ((double[]){3}), 1);
  topos_params_free(p);
  tt_assert_values(topos_params_get(q, 1), ((double[]){4}), 1);
  topos_params_free(q);
  topos_params_free(NULL);
}
END_TEST

START_TEST(test_new_bad_args) {
  topos_error err = {0};
  topos_tensor *a = tt_tensor(TOPOS_F32, 0, NULL, (double[]){1});
  topos_tensor *with_null[2] = {a, NULL};
  ck_assert_ptr_null(topos_params_new(2, with_null, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "slot 1"));
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_new(-1, with_null, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_new(1, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  /* err may be NULL. */
  ck_assert_ptr_null(topos_params_new(1, NULL, NULL));
  /* An empty set is a set. */
  topos_params *e = topos_params_new(0, NULL, &err);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(topos_params_count(e), 0);
  topos_params_free(e);
  topos_tensor_release(a);
}
END_TEST

/* ----------------------------------------------------------------- algebra */

START_TEST(test_add_values) {
  topos_error err = {0};
  /* f64 adds in double: 0.1 + 0.2 is the double sum, not 0.3. */
  topos_params *a = set1(TOPOS_F64, 3, (double[]){0.1, 1e300, -2});
  topos_params *b = set1(TOPOS_F64, 3, (double[]){0.2, 1e300, 2});
  topos_params *s = topos_params_add(a, b, &err);
  ck_assert_msg(s != NULL, "%s", err.message);
  tt_assert_values(topos_params_get(s, 0), ((double[]){0.1 + 0.2, 2e300, 0}),
                   3);
  ck_assert_int_eq(topos_tensor_dtype(topos_params_get(s, 0)), TOPOS_F64);
  topos_params_free(a);
  topos_params_free(b);
  topos_params_free(s);

  /* f32 adds in float: 1 + 2^-24 is a tie that rounds to 1, and 3e38 +
   * 3e38 overflows to infinity (it would not in double). */
  a = set1(TOPOS_F32, 3, (double[]){1, 3e38, 0.1});
  b = set1(TOPOS_F32, 3, (double[]){0x1p-24, 3e38, 0.2});
  s = topos_params_add(a, b, &err);
  ck_assert_ptr_nonnull(s);
  const topos_tensor *r = topos_params_get(s, 0);
  ck_assert_int_eq(topos_tensor_dtype(r), TOPOS_F32);
  tt_assert_values(r, ((double[]){1, INFINITY, (double)(0.1f + 0.2f)}), 3);
  topos_params_free(a);
  topos_params_free(b);
  topos_params_free(s);
}
END_TEST

START_TEST(test_add_bf16_rounds) {
  topos_error err = {0};
  /* bf16 has 8 significant bits: 1 + 2^-8 is a tie (rounds to even, 1);
   * 1 + 2^-7 + 2^-8 is a tie that rounds up to 1 + 2^-6; 1 + 2^-8 +
   * 2^-15 is above the tie and rounds to 1 + 2^-7. */
  topos_params *a = set1(TOPOS_BF16, 3, (double[]){1, 1 + 0x1p-7, 1});
  topos_params *b =
      set1(TOPOS_BF16, 3, (double[]){0x1p-8, 0x1p-8, 0x1p-8 + 0x1p-15});
  topos_params *s = topos_params_add(a, b, &err);
  ck_assert_msg(s != NULL, "%s", err.message);
  const topos_tensor *r = topos_params_get(s, 0);
  ck_assert_int_eq(topos_tensor_dtype(r), TOPOS_BF16);
  tt_assert_values(r, ((double[]){1, 1 + 0x1p-6, 1 + 0x1p-7}), 3);
  topos_params_free(a);
  topos_params_free(b);
  topos_params_free(s);
}
END_TEST

START_TEST(test_scale_rounds_s_first) {
  topos_error err = {0};
  /* f32: s is rounded to float before the float product.  Brute-force
   * a value where that differs from rounding the double product. */
  float x = 0;
  const double s = 0.1;
  for (int k = 1; k < 100000; k++) {
    float c = 1.0f + (float)k * 0x1p-20f;
    if ((float)((double)c * s) != c * (float)s) {
      x = c;
      break;
    }
  }
  ck_assert_msg(x != 0, "no discriminating f32 value found");
  topos_params *a = set1(TOPOS_F32, 2, (double[]){x, -3});
  topos_params *r = topos_params_scale(a, s, &err);
  ck_assert_msg(r != NULL, "%s", err.message);
  tt_assert_values(topos_params_get(r, 0),
                   ((double[]){(double)(x * (float)s), (double)(-3.0f * 0.1f)}),
                   2);
  topos_params_free(a);
  topos_params_free(r);

  /* f64: plain double product. */
  a = set1(TOPOS_F64, 2, (double[]){3, 1e-300});
  r = topos_params_scale(a, 1.0 / 3, &err);
  ck_assert_ptr_nonnull(r);
  tt_assert_values(topos_params_get(r, 0),
                   ((double[]){3 * (1.0 / 3), 1e-300 / 3}), 2);
  topos_params_free(a);
  topos_params_free(r);

  /* bf16: s rounds to bf16, the product is taken in f32 and rounded to
   * bf16.  Search for a pair where rounding the exact double product
   * instead would give other bits. */
  float bx = 0;
  double bs = 0;
  for (int k = 0; k < 256 && bx == 0; k++) {
    float c = topos_bf16_to_f32(topos_bf16_from_f32(1.0f + (float)k / 128));
    for (int j = 1; j < 200; j++) {
      double sj = 1 + j * 0x1p-12;
      float sr = topos_bf16_to_f32(topos_bf16_from_f32((float)sj));
      uint16_t want = topos_bf16_from_f32(c * sr);
      uint16_t naive = topos_bf16_from_f32((float)((double)c * sj));
      if (want != naive && (double)sr != sj) {
        bx = c;
        bs = sj;
        break;
      }
    }
  }
  ck_assert_msg(bx != 0, "no discriminating bf16 value found");
  a = set1(TOPOS_BF16, 1, (double[]){bx});
  r = topos_params_scale(a, bs, &err);
  ck_assert_ptr_nonnull(r);
  float sr = topos_bf16_to_f32(topos_bf16_from_f32((float)bs));
  ck_assert_uint_eq(bf16_at(topos_params_get(r, 0), 0),
                    topos_bf16_from_f32(bx * sr));
  topos_params_free(a);
  topos_params_free(r);
}
END_TEST

typedef struct probe {
  int calls;
  double seen_a[4], seen_b[4];
  double result;
} probe;

static double map_const(double x, void *ctx) {
  probe *p = ctx;
  if (p->calls < 4) p->seen_a[p->calls] = x;
  p->calls++;
  return p->result;
}

static double map_square_plus_third(double x, void *ctx) {
  (void)ctx;
  return x * x + 1.0 / 3;
}

static double zip_record_diff(double a, double b, void *ctx) {
  probe *p = ctx;
  if (p->calls < 4) {
    p->seen_a[p->calls] = a;
    p->seen_b[p->calls] = b;
  }
  p->calls++;
  return a - b;
}

START_TEST(test_map_zip_widen_and_round_once) {
  topos_error err = {0};
  /* f32 elements reach fn widened exactly. */
  topos_params *a = set1(TOPOS_F32, 2, (double[]){0.1, 0.2});
  probe pr = {.result = 1 + 0x1p-8 + 0x1p-30};
  topos_params *r = topos_params_map(a, map_const, &pr, &err);
  ck_assert_msg(r != NULL, "%s", err.message);
  ck_assert_int_eq(pr.calls, 2);
  ck_assert(pr.seen_a[0] == (double)0.1f);
  ck_assert(pr.seen_a[1] == (double)0.2f);
  tt_assert_values(
      topos_params_get(r, 0),
      ((double[]){(double)(float)pr.result, (double)(float)pr.result}), 2);
  topos_params_free(r);
  topos_params_free(a);

  /* bf16: fn's result rounds once, straight from double.  1 + 2^-8 +
   * 2^-30 is just above a bf16 tie and rounds up to 1 + 2^-7; rounding
   * to f32 first would land on the tie and round to even, 1. */
  a = set1(TOPOS_BF16, 1, (double[]){5});
  pr = (probe){.result = 1 + 0x1p-8 + 0x1p-30};
  r = topos_params_map(a, map_const, &pr, &err);
  ck_assert_ptr_nonnull(r);
  ck_assert(pr.seen_a[0] == 5);
  tt_assert_values(topos_params_get(r, 0), ((double[]){1 + 0x1p-7}), 1);
  topos_params_free(r);
  topos_params_free(a);

  /* f64 map computes in double. */
  a = set1(TOPOS_F64, 2, (double[]){0.1, -3});
  r = topos_params_map(a, map_square_plus_third, NULL, &err);
  ck_assert_ptr_nonnull(r);
  tt_assert_values(topos_params_get(r, 0),
                   ((double[]){0.1 * 0.1 + 1.0 / 3, 9 + 1.0 / 3}), 2);
  topos_params_free(r);
  topos_params_free(a);

  /* zip pairs elements in order and rounds the double difference. */
  a = set1(TOPOS_F32, 2, (double[]){1, 0.1});
  topos_params *b = set1(TOPOS_F32, 2, (double[]){0x1p-30, 0.3});
  pr = (probe){0};
  r = topos_params_zip(a, b, zip_record_diff, &pr, &err);
  ck_assert_msg(r != NULL, "%s", err.message);
  ck_assert_int_eq(pr.calls, 2);
  ck_assert(pr.seen_a[0] == 1 && pr.seen_b[0] == 0x1p-30);
  ck_assert(pr.seen_a[1] == (double)0.1f && pr.seen_b[1] == (double)0.3f);
  tt_assert_values(topos_params_get(r, 0),
                   ((double[]){(double)(float)(1 - 0x1p-30),
                               (double)(float)((double)0.1f - (double)0.3f)}),
                   2);
  /* 1 - 2^-30 rounds back to 1 in f32. */
  ck_assert_uint_eq(f32_bits((float)(1 - 0x1p-30)), f32_bits(1.0f));
  topos_params_free(r);
  topos_params_free(a);
  topos_params_free(b);
}
END_TEST

START_TEST(test_algebra_multi_slot_and_strided) {
  topos_error err = {0};
  /* slot 0: a transposed f32 view; slot 1: a broadcast bf16 scalar. */
  topos_tensor *m =
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6});
  topos_tensor *mt = topos_tensor_transpose(m, &err);
  ck_assert_ptr_nonnull(mt);
  topos_tensor *ten = tt_tensor(TOPOS_F32, 0, NULL, (double[]){10});
  topos_tensor *tenb = topos_tensor_broadcast(ten, 2, (int64_t[]){3, 2}, &err);
  ck_assert_ptr_nonnull(tenb);
  topos_tensor *h = tt_tensor(TOPOS_BF16, 0, NULL, (double[]){0.5});
  topos_tensor *hb = topos_tensor_broadcast(h, 1, (int64_t[]){4}, &err);
  ck_assert_ptr_nonnull(hb);
  topos_tensor *bv =
      tt_tensor(TOPOS_BF16, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  topos_tensor *ta[2] = {mt, hb}, *tb[2] = {tenb, topos_tensor_retain(bv)};
  topos_params *a = set_of(2, ta);
  topos_params *b = set_of(2, tb);
  topos_params *s = topos_params_add(a, b, &err);
  ck_assert_msg(s != NULL, "%s", err.message);
  ck_assert_int_eq(topos_params_count(s), 2);
  const topos_tensor *s0 = topos_params_get(s, 0), *s1 = topos_params_get(s, 1);
  ck_assert(topos_tensor_is_contiguous(s0));
  ck_assert(topos_tensor_is_contiguous(s1));
  ck_assert_int_eq(topos_tensor_rank(s0), 2);
  ck_assert_int_eq(topos_tensor_shape(s0)[0], 3);
  tt_assert_values(s0, ((double[]){11, 14, 12, 15, 13, 16}), 6);
  tt_assert_values(s1, ((double[]){1.5, 2.5, 3.5, 4.5}), 4);

  topos_params *sc = topos_params_scale(a, -2, &err);
  ck_assert_ptr_nonnull(sc);
  tt_assert_values(topos_params_get(sc, 0),
                   ((double[]){-2, -8, -4, -10, -6, -12}), 6);
  tt_assert_values(topos_params_get(sc, 1), ((double[]){-1, -1, -1, -1}), 4);
  topos_params_free(sc);
  topos_params_free(s);
  topos_params_free(a);
  topos_params_free(b);
  topos_tensor_release(m);
  topos_tensor_release(ten);
  topos_tensor_release(h);
  topos_tensor_release(bv);
}
END_TEST

START_TEST(test_algebra_mismatches) {
  topos_error err = {0};
  topos_tensor *f2 = tt_tensor(TOPOS_F32, 1, (int64_t[]){2}, (double[]){1, 2});
  topos_tensor *f3 =
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  topos_tensor *d2 = tt_tensor(TOPOS_F64, 1, (int64_t[]){2}, (double[]){1, 2});
  topos_tensor *i2 = tt_tensor(TOPOS_I32, 1, (int64_t[]){2}, (double[]){1, 2});
  topos_tensor *f2x2 =
      tt_tensor(TOPOS_F32, 2, (int64_t[]){1, 2}, (double[]){1, 2});
  topos_params *a = topos_params_new(2, (topos_tensor *[]){f2, f2}, &err);
  topos_params *one = topos_params_new(1, (topos_tensor *[]){f2}, &err);
  topos_params *shape = topos_params_new(2, (topos_tensor *[]){f2, f3}, &err);
  topos_params *rank = topos_params_new(2, (topos_tensor *[]){f2, f2x2}, &err);
  topos_params *dtype = topos_params_new(2, (topos_tensor *[]){f2, d2}, &err);
  topos_params *ints = topos_params_new(2, (topos_tensor *[]){f2, i2}, &err);
  ck_assert(a && one && shape && rank && dtype && ints);

  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(a, one, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(a, shape, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.message, "slot 1"));
  err = (topos_error){0};
  ck_assert_ptr_null(
      topos_params_zip(a, rank, zip_record_diff, &(probe){0}, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(a, dtype, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  ck_assert_ptr_nonnull(strstr(err.message, "slot 1"));
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_scale(ints, 2, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  ck_assert_ptr_nonnull(strstr(err.message, "slot 1"));
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(ints, ints, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  err = (topos_error){0};
  probe pr = {0};
  ck_assert_ptr_null(topos_params_map(ints, map_const, &pr, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  ck_assert_int_eq(pr.calls, 0); /* checked before anything is computed */
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_map(a, NULL, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_zip(a, a, NULL, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(NULL, a, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_add(a, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_scale(NULL, 1, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(topos_params_scale(NULL, 1, NULL)); /* err optional */

  topos_params *list[] = {a, one, shape, rank, dtype, ints};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++)
    topos_params_free(list[i]);
  topos_tensor *ts[] = {f2, f3, d2, i2, f2x2};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
    topos_tensor_release(ts[i]);
}
END_TEST

START_TEST(test_bitwise_equal) {
  topos_params *a = set1(TOPOS_F32, 3, (double[]){1, -0.0, NAN});
  topos_params *same = set1(TOPOS_F32, 3, (double[]){1, -0.0, NAN});
  topos_params *pos0 = set1(TOPOS_F32, 3, (double[]){1, 0.0, NAN});
  topos_params *f64 = set1(TOPOS_F64, 3, (double[]){1, -0.0, NAN});
  topos_tensor *t[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){1, -0.0, NAN}),
      tt_tensor(TOPOS_F32, 0, NULL, (double[]){1})};
  topos_params *two = set_of(2, t);
  ck_assert(topos_params_bitwise_equal(a, a));
  ck_assert(topos_params_bitwise_equal(a, same)); /* NaN bits equal too */
  ck_assert(!topos_params_bitwise_equal(a, pos0));
  ck_assert(!topos_params_bitwise_equal(a, f64));
  ck_assert(!topos_params_bitwise_equal(a, two));
  ck_assert(!topos_params_bitwise_equal(a, NULL));
  ck_assert(!topos_params_bitwise_equal(NULL, a));
  ck_assert(topos_params_bitwise_equal(NULL, NULL));
  topos_params *list[] = {a, same, pos0, f64, two};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++)
    topos_params_free(list[i]);
}
END_TEST

/* ------------------------------------------------------- networks / fields */

/* loss = sum(w * w) + sum(b * x), with an unused parameter u: f64.
 * Gradients: 2w, x, and exact zeros for u. */
typedef struct toy {
  topos_network *net;
  topos_value w, b, u, x, loss;
} toy;

static toy toy_new(void) {
  toy t;
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  ck_assert_ptr_nonnull(tape);
  topos_tensor *w0 =
      tt_tensor(TOPOS_F64, 1, (int64_t[]){3}, (double[]){1, -2, 0.5});
  /* b's initial is a transposed view: its copy must be contiguous. */
  topos_tensor *bm =
      tt_tensor(TOPOS_F64, 2, (int64_t[]){2, 1}, (double[]){3, 4});
  topos_tensor *b0 = topos_tensor_transpose(bm, &err);
  topos_tensor *u0 =
      tt_tensor(TOPOS_F64, 2, (int64_t[]){2, 2}, (double[]){7, 7, 7, 7});
  topos_tensor *x0 =
      tt_tensor(TOPOS_F64, 2, (int64_t[]){1, 2}, (double[]){5, 6});
  t.w = topos_parameter(tape, w0);
  t.b = topos_parameter(tape, b0);
  t.u = topos_parameter(tape, u0);
  t.x = topos_input(tape, x0);
  topos_value ww = topos_sum(tape, topos_mul(tape, t.w, t.w));
  topos_value bx = topos_sum(tape, topos_mul(tape, t.b, t.x));
  t.loss = topos_add(tape, ww, bx);
  topos_tensor_release(w0);
  topos_tensor_release(bm);
  topos_tensor_release(b0);
  topos_tensor_release(u0);
  topos_tensor_release(x0);
  t.net = topos_tape_seal(tape, &err);
  ck_assert_msg(t.net != NULL, "seal: %s", err.message);
  return t;
}

static topos_field *toy_grad(const toy *t) {
  topos_error err = {0};
  topos_run *run = topos_forward(t->net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  topos_field *g = topos_backward(run, t->loss, NULL, &err);
  ck_assert_msg(g != NULL, "backward: %s", err.message);
  topos_run_free(run);
  return g;
}

START_TEST(test_network_parameters) {
  toy t = toy_new();
  topos_params *p = topos_network_parameters(t.net);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(topos_params_count(p), 3);
  tt_assert_values(topos_params_get(p, 0), ((double[]){1, -2, 0.5}), 3);
  tt_assert_values(topos_params_get(p, 1), ((double[]){3, 4}), 2);
  tt_assert_values(topos_params_get(p, 2), ((double[]){7, 7, 7, 7}), 4);
  for (int s = 0; s < 3; s++) {
    const topos_tensor *c = topos_params_get(p, s);
    ck_assert(topos_tensor_is_contiguous(c));
    ck_assert_int_eq(topos_tensor_dtype(c), TOPOS_F64);
  }
  ck_assert_int_eq(topos_tensor_rank(topos_params_get(p, 1)), 2);
  ck_assert_int_eq(topos_tensor_shape(topos_params_get(p, 1))[1], 2);
  /* Fresh copies every time, with equal bits. */
  topos_params *q = topos_network_parameters(t.net);
  ck_assert(topos_params_bitwise_equal(p, q));
  ck_assert_ptr_ne(topos_params_get(p, 0), topos_params_get(q, 0));
  ck_assert_ptr_null(topos_network_parameters(NULL));
  topos_params_free(p);
  topos_params_free(q);
  topos_network_release(t.net);
}
END_TEST

START_TEST(test_field_of_and_parameters_of) {
  topos_error err = {0};
  toy t = toy_new();
  topos_field *g = toy_grad(&t);
  const topos_tensor *gl = topos_field_of(g, t.loss, &err);
  ck_assert_msg(gl != NULL, "%s", err.message);
  tt_assert_values(gl, ((double[]){1}), 1);
  tt_assert_values(topos_field_of(g, t.x, &err), ((double[]){3, 4}), 2);

  topos_params *gp = topos_parameters_of(g, &err);
  ck_assert_msg(gp != NULL, "%s", err.message);
  ck_assert_int_eq(topos_params_count(gp), 3);
  tt_assert_values(topos_params_get(gp, 0), ((double[]){2, -4, 1}), 3);
  tt_assert_values(topos_params_get(gp, 1), ((double[]){5, 6}), 2);
  tt_assert_values(topos_params_get(gp, 2), ((double[]){0, 0, 0, 0}), 4);
  /* The field's own tensors, retained, in slot order. */
  ck_assert_ptr_eq(topos_params_get(gp, 0), topos_field_of(g, t.w, &err));
  ck_assert_ptr_eq(topos_params_get(gp, 2), topos_field_of(g, t.u, &err));

  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_of(g, TOPOS_NONE, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_of(NULL, t.w, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_parameters_of(NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  /* A value of another network is foreign. */
  toy other = toy_new();
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_of(g, other.loss, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);

  topos_params_free(gp);
  topos_field_free(g);
  topos_field_free(NULL);
  topos_network_release(t.net);
  topos_network_release(other.net);
}
END_TEST

static double plus_one(double x, void *ctx) {
  (void)ctx;
  return x + 1;
}

static double times(double a, double b, void *ctx) {
  (void)ctx;
  return a * b;
}

START_TEST(test_field_algebra) {
  topos_error err = {0};
  toy t = toy_new();
  topos_field *g = toy_grad(&t);
  topos_field *g2 = topos_field_add(g, g, &err);
  ck_assert_msg(g2 != NULL, "%s", err.message);
  tt_assert_values(topos_field_of(g2, t.w, &err), ((double[]){4, -8, 2}), 3);
  tt_assert_values(topos_field_of(g2, t.u, &err), ((double[]){0, 0, 0, 0}), 4);
  tt_assert_values(topos_field_of(g2, t.loss, &err), ((double[]){2}), 1);

  topos_field *h = topos_field_scale(g, 0.5, &err);
  ck_assert_ptr_nonnull(h);
  tt_assert_values(topos_field_of(h, t.w, &err), ((double[]){1, -2, 0.5}), 3);
  ck_assert(topos_tensor_is_contiguous(topos_field_of(h, t.u, &err)));

  topos_field *m = topos_field_map(g, plus_one, NULL, &err);
  ck_assert_ptr_nonnull(m);
  tt_assert_values(topos_field_of(m, t.u, &err), ((double[]){1, 1, 1, 1}), 4);
  tt_assert_values(topos_field_of(m, t.b, &err), ((double[]){6, 7}), 2);

  topos_field *z = topos_field_zip(g, m, times, NULL, &err);
  ck_assert_ptr_nonnull(z);
  tt_assert_values(topos_field_of(z, t.w, &err), ((double[]){6, 12, 2}), 3);
  tt_assert_values(topos_field_of(z, t.u, &err), ((double[]){0, 0, 0, 0}), 4);

  /* Fields of two networks do not mix. */
  toy other = toy_new();
  topos_field *go = toy_grad(&other);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_add(g, go, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_zip(g, go, times, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_add(g, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_map(g, NULL, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_field_scale(NULL, 2, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);

  topos_field *fs[] = {g, g2, h, m, z, go};
  for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) topos_field_free(fs[i]);
  topos_network_release(t.net);
  topos_network_release(other.net);
}
END_TEST

static double count_calls(double x, void *ctx) {
  (*(int *)ctx)++;
  return x * 3;
}

/* A network with index data: loss = sum(gather(table, idx)).  backward
 * gives the i32 node exact i32 zeros; the field algebra passes them
 * through instead of refusing the whole field. */
START_TEST(test_field_algebra_passes_index_nodes) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *table0 =
      tt_tensor(TOPOS_F32, 2, (int64_t[]){3, 2}, (double[]){1, 2, 3, 4, 5, 6});
  topos_tensor *idx0 =
      tt_tensor(TOPOS_I32, 1, (int64_t[]){4}, (double[]){2, 0, 2, 1});
  topos_value table = topos_parameter(tape, table0);
  topos_value idx = topos_input(tape, idx0);
  topos_value loss = topos_sum(tape, topos_gather(tape, table, idx));
  topos_tensor_release(table0);
  topos_tensor_release(idx0);
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  topos_field *g = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(g != NULL, "%s", err.message);
  topos_run_free(run);
  const topos_tensor *gi = topos_field_of(g, idx, &err);
  ck_assert_int_eq(topos_tensor_dtype(gi), TOPOS_I32);

  topos_field *s = topos_field_add(g, g, &err);
  ck_assert_msg(s != NULL, "field_add: %s", err.message);
  /* table's gradient counts how often each row was gathered: 1, 1, 2. */
  tt_assert_values(topos_field_of(s, table, &err),
                   ((double[]){2, 2, 2, 2, 4, 4}), 6);
  const topos_tensor *si = topos_field_of(s, idx, &err);
  ck_assert_int_eq(topos_tensor_dtype(si), TOPOS_I32);
  tt_assert_values(si, ((double[]){0, 0, 0, 0}), 4);

  int calls = 0;
  topos_field *m = topos_field_map(g, count_calls, &calls, &err);
  ck_assert_msg(m != NULL, "field_map: %s", err.message);
  tt_assert_values(topos_field_of(m, idx, &err), ((double[]){0, 0, 0, 0}), 4);
  tt_assert_values(topos_field_of(m, table, &err),
                   ((double[]){3, 3, 3, 3, 6, 6}), 6);
  /* fn saw float elements only: none of the 4 index elements. */
  int floats = 0;
  for (int i = 0; i < topos_network_node_count(net); i++) {
    topos_value v = {.tape = loss.tape, .index = i};
    const topos_tensor *t = topos_field_of(g, v, &err);
    if (topos_tensor_dtype(t) != TOPOS_I32)
      floats += (int)topos_tensor_count(t);
  }
  ck_assert_int_eq(calls, floats);

  /* A parameter set still refuses i32. */
  topos_params *gp = topos_parameters_of(g, &err);
  ck_assert_ptr_nonnull(gp);
  topos_params *withi = topos_params_with(gp, 0, gi, &err);
  ck_assert_ptr_nonnull(withi);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_params_scale(withi, 2, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  topos_params_free(withi);
  topos_params_free(gp);
  topos_field_free(s);
  topos_field_free(m);
  topos_field_free(g);
  topos_network_release(net);
}
END_TEST

Suite *params_suite(void) {
  Suite *s = suite_create("params");
  TCase *tc = tcase_create("sets");
  tcase_add_test(tc, test_new_get_count_with);
  tcase_add_test(tc, test_new_bad_args);
  tcase_add_test(tc, test_bitwise_equal);
  suite_add_tcase(s, tc);
  tc = tcase_create("algebra");
  tcase_add_test(tc, test_add_values);
  tcase_add_test(tc, test_add_bf16_rounds);
  tcase_add_test(tc, test_scale_rounds_s_first);
  tcase_add_test(tc, test_map_zip_widen_and_round_once);
  tcase_add_test(tc, test_algebra_multi_slot_and_strided);
  tcase_add_test(tc, test_algebra_mismatches);
  suite_add_tcase(s, tc);
  tc = tcase_create("network");
  tcase_add_test(tc, test_network_parameters);
  tcase_add_test(tc, test_field_of_and_parameters_of);
  tcase_add_test(tc, test_field_algebra);
  tcase_add_test(tc, test_field_algebra_passes_index_nodes);
  suite_add_tcase(s, tc);
  return s;
}
