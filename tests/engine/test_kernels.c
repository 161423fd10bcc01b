/*
 * test_kernels.c - the reference forward kernels (engine/kernels.c),
 * reached through the public API: record one op on constants, seal, run
 * forward, read the value back.  Hand-computed cases check what each op
 * means; bit comparisons (memcmp) against references written here check
 * numerics.md: libm per element, fma chains for matmul, the striped-16
 * summation rule, f32 compute with one rounding for bf16.
 */
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})

static const topos_dtype float_dtypes[2] = {TOPOS_F64, TOPOS_F32};

/* ------------------------------------------------------------ helpers */

static topos_tensor *raw_tensor(topos_dtype d, int rank, const int64_t *shape,
                                const void *data) {
  topos_error err = {0};
  static const double dummy[1] = {0};
  topos_tensor *t =
      topos_tensor_from(d, rank, shape, data ? data : dummy, &err);
  ck_assert_msg(t != NULL, "tensor_from: %s", err.message);
  return t;
}

/* Records a tensor as a constant (the tape keeps its own reference). */
static topos_value cst(topos_tape *tp, topos_tensor *t) {
  topos_value v = topos_constant(tp, t);
  topos_tensor_release(t);
  ck_assert(topos_value_ok(v));
  return v;
}

static topos_value cvals(topos_tape *tp, topos_dtype d, int rank,
                         const int64_t *shape, const double *vals) {
  return cst(tp, tt_tensor(d, rank, shape, vals));
}

/* Seals the tape, runs it forward with defaults and returns y's value
 * (a new reference; the caller releases it). */
static topos_tensor *eval(topos_tape *tp, topos_value y) {
  const char *e = topos_tape_error(tp);
  ck_assert_msg(topos_value_ok(y) && e == NULL, "record: %s",
                e ? e : "(no message)");
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tp, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  const topos_tensor *v = topos_run_of(run, y, &err);
  ck_assert_msg(v != NULL, "run_of: %s", err.message);
  topos_tensor *r = topos_tensor_retain(v);
  topos_run_free(run);
  topos_network_release(net);
  return r;
}

/* The value's elements row-major in its dtype (new array). */
static void *raw_of(const topos_tensor *t) {
  size_t bytes =
      (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
  void *out = malloc(bytes ? bytes : 1);
  topos_error err = {0};
  ck_assert_int_eq(topos_tensor_read(t, out, bytes, &err), TOPOS_OK);
  return out;
}

static void expect_shape(const topos_tensor *t, topos_dtype d, int rank,
                         const int64_t *shape) {
  ck_assert_int_eq(topos_tensor_dtype(t), d);
  ck_assert_int_eq(topos_tensor_rank(t), rank);
  const int64_t *s = topos_tensor_shape(t);
  for (int i = 0; i < rank; i++)
    ck_assert_msg(s[i] == shape[i], "axis %d: got %lld want %lld", i,
                  (long long)s[i], (long long)shape[i]);
}

/* Compares bit patterns element by element, naming the first mismatch. */
static void expect_bits64(const topos_tensor *t, const double *want, int64_t n,
                          const char *what) {
  ck_assert_int_eq(topos_tensor_dtype(t), TOPOS_F64);
  ck_assert_int_eq(topos_tensor_count(t), n);
  double *got = raw_of(t);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&got[i], &want[i], sizeof(double)) == 0,
                  "%s: element %lld: got %a want %a", what, (long long)i,
                  got[i], want[i]);
  free(got);
}

static void expect_bits32(const topos_tensor *t, const float *want, int64_t n,
                          const char *what) {
  ck_assert_int_eq(topos_tensor_dtype(t), TOPOS_F32);
  ck_assert_int_eq(topos_tensor_count(t), n);
  float *got = raw_of(t);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                  "%s: element %lld: got %a want %a", what, (long long)i,
                  (double)got[i], (double)want[i]);
  free(got);
}

static void expect_bits16(const topos_tensor *t, const uint16_t *want,
                          int64_t n, const char *what) {
  ck_assert_int_eq(topos_tensor_dtype(t), TOPOS_BF16);
  ck_assert_int_eq(topos_tensor_count(t), n);
  uint16_t *got = raw_of(t);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "%s: element %lld: got 0x%04x want 0x%04x",
                  what, (long long)i, got[i], want[i]);
  free(got);
}

/* bf16 written here rather than trusted from the engine: round to nearest
 * even, NaN kept quiet. */
static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float f32_of(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Values spread over many binades, so that summation order shows. */
static double wide(uint64_t *s) {
  double m = tt_uniform(s, 1.0, 2.0);
  int e = (int)tt_uniform(s, -12.0, 12.0);
  double sign = tt_uniform(s, 0.0, 1.0) < 0.5 ? -1.0 : 1.0;
  return sign * ldexp(m, e);
}

static double *wide_array(int64_t n, uint64_t seed) {
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < n; i++) v[i] = wide(&s);
  return v;
}

/* The first element of t widened to double. */
static double first(const topos_tensor *t) {
  double *v = tt_values(t);
  double r = v[0];
  free(v);
  return r;
}

static double *uniform_array(int64_t n, uint64_t seed, double lo, double hi) {
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  for (int64_t i = 0; i < n; i++) v[i] = tt_uniform(&s, lo, hi);
  return v;
}

/* ------------------------------------------------ the references */

/* numerics.md: n == 0 gives +0; n <= 16 a left fold; otherwise 16 striped
 * lane folds combined pairwise (l0+l1),(l2+l3)... down to one. */
static double ref_sum64(const double *x, int64_t n, int64_t stride) {
  if (n == 0) return 0.0;
  if (n <= 16) {
    double acc = x[0];
    for (int64_t i = 1; i < n; i++) acc = acc + x[i * stride];
    return acc;
  }
  double lane[16];
  for (int l = 0; l < 16; l++) {
    lane[l] = x[l * stride];
    for (int64_t i = l + 16; i < n; i += 16) lane[l] = lane[l] + x[i * stride];
  }
  for (int w = 16; w > 1; w /= 2)
    for (int j = 0; j < w / 2; j++) lane[j] = lane[2 * j] + lane[2 * j + 1];
  return lane[0];
}

static float ref_sum32(const float *x, int64_t n, int64_t stride) {
  if (n == 0) return 0.0f;
  if (n <= 16) {
    float acc = x[0];
    for (int64_t i = 1; i < n; i++) acc = acc + x[i * stride];
    return acc;
  }
  float lane[16];
  for (int l = 0; l < 16; l++) {
    lane[l] = x[l * stride];
    for (int64_t i = l + 16; i < n; i += 16) lane[l] = lane[l] + x[i * stride];
  }
  for (int w = 16; w > 1; w /= 2)
    for (int j = 0; j < w / 2; j++) lane[j] = lane[2 * j] + lane[2 * j + 1];
  return lane[0];
}

static double left_fold64(const double *x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += x[i];
  return acc;
}

static float left_fold32(const float *x, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += x[i];
  return acc;
}

/* C[b,i,j] = fma chain over k from +0.0. */
static void ref_matmul64(const double *a, const double *b, double *c,
                         int64_t batch, int64_t m, int64_t k, int64_t n) {
  for (int64_t z = 0; z < batch; z++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double acc = 0.0;
        for (int64_t q = 0; q < k; q++)
          acc = fma(a[z * m * k + i * k + q], b[z * k * n + q * n + j], acc);
        c[z * m * n + i * n + j] = acc;
      }
}

static void ref_matmul32(const float *a, const float *b, float *c,
                         int64_t batch, int64_t m, int64_t k, int64_t n) {
  for (int64_t z = 0; z < batch; z++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int64_t q = 0; q < k; q++)
          acc = fmaf(a[z * m * k + i * k + q], b[z * k * n + q * n + j], acc);
        c[z * m * n + i * n + j] = acc;
      }
}

static float *to_f32(const double *v, int64_t n) {
  float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
  return f;
}

/* ----------------------------------------- elementwise, hand-computed */

START_TEST(elementwise_hand_values) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    const double a[4] = {1, 2, -3, 0.5};
    const double b[4] = {0.5, -2, 4, 0.25};
    struct {
      topos_value (*fn)(topos_tape *, topos_value, topos_value);
      double want[4];
    } cases[] = {
        {topos_add, {1.5, 0, 1, 0.75}},     {topos_sub, {0.5, 4, -7, 0.25}},
        {topos_mul, {0.5, -4, -12, 0.125}}, {topos_div, {2, -1, -0.75, 2}},
        {topos_maximum, {1, 2, 4, 0.5}},    {topos_step, {1, 1, 0, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
      topos_tape *tp = topos_tape_new(d);
      topos_value va = cvals(tp, d, 1, S(4), a);
      topos_value vb = cvals(tp, d, 1, S(4), b);
      topos_tensor *y = eval(tp, cases[c].fn(tp, va, vb));
      expect_shape(y, d, 1, S(4));
      tt_assert_values(y, cases[c].want, 4);
      topos_tensor_release(y);
    }
    struct {
      topos_value (*fn)(topos_tape *, topos_value);
      double want[4];
    } unary[] = {
        {topos_neg, {-1, -2, 3, -0.5}},
        {topos_relu, {1, 2, 0, 0.5}},
    };
    for (size_t c = 0; c < sizeof unary / sizeof *unary; c++) {
      topos_tape *tp = topos_tape_new(d);
      topos_tensor *y = eval(tp, unary[c].fn(tp, cvals(tp, d, 1, S(4), a)));
      tt_assert_values(y, unary[c].want, 4);
      topos_tensor_release(y);
    }
    /* sqrt and pow on exact cases */
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_sqrt(tp, cvals(tp, d, 1, S(3), D(4, 0.25, 0))));
    tt_assert_values(y, D(2, 0.5, 0), 3);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_pow(tp, cvals(tp, d, 1, S(3), D(2, -3, 0.5)), 3.0));
    tt_assert_values(y, D(8, -27, 0.125), 3);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_pow(tp, cvals(tp, d, 1, S(3), D(4, 9, 0.25)), 0.5));
    tt_assert_values(y, D(2, 3, 0.5), 3);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_pow(tp, cvals(tp, d, 1, S(2), D(2, 0.5)), -2.0));
    tt_assert_values(y, D(0.25, 4), 2);
    topos_tensor_release(y);
    /* exp(0) = 1, log(1) = 0, tanh(0) = 0 */
    tp = topos_tape_new(d);
    y = eval(tp, topos_exp(tp, cvals(tp, d, 1, S(1), D(0))));
    tt_assert_values(y, D(1), 1);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_log(tp, cvals(tp, d, 1, S(2), D(1, 0))));
    tt_assert_values(y, D(0, -INFINITY), 2);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(elementwise_scalar_rank0) {
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value a = topos_scalar(tp, 1.5);
  topos_value b = topos_scalar(tp, 2.25);
  topos_tensor *y = eval(tp, topos_mul(tp, a, b));
  expect_shape(y, TOPOS_F64, 0, NULL);
  tt_assert_values(y, D(3.375), 1);
  topos_tensor_release(y);
}
END_TEST

/* maximum: a when a >= b else b; NaN in either gives NaN.  step: 1 when
 * a >= b. The signed zeros tell "a when a >= b" from other maxima. */
START_TEST(maximum_step_edges) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    const double a[6] = {0.0, -0.0, NAN, 1.0, NAN, -INFINITY};
    const double b[6] = {-0.0, 0.0, 1.0, NAN, NAN, -1.0};
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y = eval(tp, topos_maximum(tp, cvals(tp, d, 1, S(6), a),
                                             cvals(tp, d, 1, S(6), b)));
    double *v = tt_values(y);
    ck_assert(v[0] == 0 && !signbit(v[0])); /* +0 >= -0: a */
    ck_assert(v[1] == 0 && signbit(v[1]));  /* -0 >= +0: a */
    ck_assert(isnan(v[2]));
    ck_assert(isnan(v[3]));
    ck_assert(isnan(v[4]));
    ck_assert(v[5] == -1.0);
    free(v);
    topos_tensor_release(y);

    const double sa[5] = {1, 1, 2, -0.0, 5};
    const double sb[5] = {1, 2, 1, 0.0, INFINITY};
    tp = topos_tape_new(d);
    y = eval(tp, topos_step(tp, cvals(tp, d, 1, S(5), sa),
                            cvals(tp, d, 1, S(5), sb)));
    tt_assert_values(y, D(1, 0, 1, 1, 0), 5);
    topos_tensor_release(y);
  }
}
END_TEST

/* The f32 sixteen-lane forms of relu, neg, maximum and step (AVX-512,
 * kernels.c) against the scalar definitions, bit for bit, NaN payloads
 * and zero signs included: 67 elements (four whole vectors and a tail)
 * cycling through the edge values, both operands contiguous, and each
 * side a broadcast scalar. */
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

START_TEST(vector_forms_edges) {
  enum { N = 67 };
  const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x7fc00000u, 0xffc01234u,
                           0x7f800001u, 0x7f800000u, 0xff800000u, 0x3f800000u,
                           0xbf800000u, 0x00000001u, 0x80000001u, 0x7f7fffffu,
                           0x40490fdbu};
  const int ne = (int)(sizeof edge / sizeof *edge);
  float a[N], b[N], want[N];
  for (int i = 0; i < N; i++) {
    a[i] = bits_f32(edge[i % ne]);
    b[i] = bits_f32(edge[(i / ne + 2 * i) % ne]);
  }
  topos_error err = {0};
  /* unary */
  for (int o = 0; o < 2; o++) {
    topos_tape *tp = topos_tape_new(TOPOS_F32);
    topos_value x = cst(tp, topos_tensor_from(TOPOS_F32, 1, S(N), a, &err));
    topos_tensor *y = eval(tp, o ? topos_neg(tp, x) : topos_relu(tp, x));
    for (int i = 0; i < N; i++)
      want[i] = o ? -a[i] : isnan(a[i]) ? a[i] : a[i] > 0 ? a[i] : 0.0f;
    expect_bits32(y, want, N, o ? "neg" : "relu");
    topos_tensor_release(y);
  }
  /* binary: contiguous, then a scalar on the right, then on the left */
  for (int o = 0; o < 2; o++)
    for (int side = 0; side < 3; side++)
      for (int si = 0; si < (side ? ne : 1); si++) {
        topos_tape *tp = topos_tape_new(TOPOS_F32);
        topos_value x = cst(tp, topos_tensor_from(TOPOS_F32, 1, S(N), a, &err));
        float sv = bits_f32(edge[si]);
        topos_value w =
            side == 0
                ? cst(tp, topos_tensor_from(TOPOS_F32, 1, S(N), b, &err))
                : topos_broadcast(
                      tp,
                      cst(tp, topos_tensor_from(TOPOS_F32, 0, NULL, &sv, &err)),
                      1, S(N));
        topos_value l = side == 2 ? w : x, r = side == 2 ? x : w;
        topos_tensor *y =
            eval(tp, o ? topos_step(tp, l, r) : topos_maximum(tp, l, r));
        for (int i = 0; i < N; i++) {
          float wv = side ? sv : b[i];
          float u = side == 2 ? wv : a[i], v = side == 2 ? a[i] : wv;
          want[i] = o          ? (u >= v ? 1.0f : 0.0f)
                    : isnan(u) ? u
                    : isnan(v) ? v
                    : u >= v   ? u
                               : v;
        }
        char what[48];
        snprintf(what, sizeof what, "%s side %d scalar %d",
                 o ? "step" : "maximum", side, si);
        expect_bits32(y, want, N, what);
        topos_tensor_release(y);
      }
}
END_TEST

START_TEST(add_i32) {
  topos_tape *tp = topos_tape_new(TOPOS_F32);
  topos_value a = cvals(tp, TOPOS_I32, 1, S(4), D(1, 2, -7, 100000));
  topos_value b = cvals(tp, TOPOS_I32, 1, S(4), D(3, -5, 7, 23));
  topos_tensor *y = eval(tp, topos_add(tp, a, b));
  expect_shape(y, TOPOS_I32, 1, S(4));
  int32_t *v = raw_of(y);
  ck_assert_int_eq(v[0], 4);
  ck_assert_int_eq(v[1], -3);
  ck_assert_int_eq(v[2], 0);
  ck_assert_int_eq(v[3], 100023);
  free(v);
  topos_tensor_release(y);
}
END_TEST

/* -------------------------------------- elementwise, bits against libm */

typedef topos_value (*unary_fn)(topos_tape *, topos_value);

static topos_value pow_25(topos_tape *t, topos_value a) {
  return topos_pow(t, a, 2.5);
}
static topos_value pow_m15(topos_tape *t, topos_value a) {
  return topos_pow(t, a, -1.5);
}
static topos_value pow_3(topos_tape *t, topos_value a) {
  return topos_pow(t, a, 3.0);
}
static double r_pow25(double x) {
  return pow(x, 2.5);
}
static float r_pow25f(float x) {
  return powf(x, 2.5f);
}
static double r_powm15(double x) {
  return pow(x, -1.5);
}
static float r_powm15f(float x) {
  return powf(x, -1.5f);
}
static double r_pow3(double x) {
  return pow(x, 3.0);
}
static float r_pow3f(float x) {
  return powf(x, 3.0f);
}
static double r_neg(double x) {
  return -x;
}
static float r_negf(float x) {
  return -x;
}

static const struct {
  const char *name;
  unary_fn fn;
  double (*r64)(double);
  float (*r32)(float);
  double lo, hi;
} unary_cases[] = {
    {"exp", topos_exp, exp, expf, -20, 20},
    {"log", topos_log, log, logf, 1e-3, 1e3},
    {"tanh", topos_tanh, tanh, tanhf, -6, 6},
    {"erf", topos_erf, erf, erff, -4, 4},
    {"sqrt", topos_sqrt, sqrt, sqrtf, 0, 1e4},
    {"neg", topos_neg, r_neg, r_negf, -1e3, 1e3},
    {"pow2.5", pow_25, r_pow25, r_pow25f, 0, 30},
    {"pow-1.5", pow_m15, r_powm15, r_powm15f, 0.01, 30},
    {"pow3", pow_3, r_pow3, r_pow3f, -30, 30},
};

START_TEST(unary_bits_libm) {
  const int64_t n = 301;
  for (size_t c = 0; c < sizeof unary_cases / sizeof *unary_cases; c++) {
    double *x = uniform_array(n, 11 + c, unary_cases[c].lo, unary_cases[c].hi);
    /* f64 */
    topos_tape *tp = topos_tape_new(TOPOS_F64);
    topos_value v = cst(tp, raw_tensor(TOPOS_F64, 1, S(n), x));
    topos_tensor *y = eval(tp, unary_cases[c].fn(tp, v));
    double *want = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) want[i] = unary_cases[c].r64(x[i]);
    expect_bits64(y, want, n, unary_cases[c].name);
    topos_tensor_release(y);
    free(want);
    /* f32 */
    float *xf = to_f32(x, n);
    tp = topos_tape_new(TOPOS_F32);
    v = cst(tp, raw_tensor(TOPOS_F32, 1, S(n), xf));
    y = eval(tp, unary_cases[c].fn(tp, v));
    float *wantf = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) wantf[i] = unary_cases[c].r32(xf[i]);
    expect_bits32(y, wantf, n, unary_cases[c].name);
    topos_tensor_release(y);
    /* bf16: to f32, compute, round once */
    uint16_t *xb = malloc(sizeof(uint16_t) * n);
    uint16_t *wantb = malloc(sizeof(uint16_t) * n);
    for (int64_t i = 0; i < n; i++) {
      xb[i] = bf16_of(xf[i]);
      wantb[i] = bf16_of(unary_cases[c].r32(f32_of(xb[i])));
    }
    tp = topos_tape_new(TOPOS_BF16);
    v = cst(tp, raw_tensor(TOPOS_BF16, 1, S(n), xb));
    y = eval(tp, unary_cases[c].fn(tp, v));
    expect_bits16(y, wantb, n, unary_cases[c].name);
    topos_tensor_release(y);
    free(xb);
    free(wantb);
    free(wantf);
    free(xf);
    free(x);
  }
}
END_TEST

typedef topos_value (*binary_fn)(topos_tape *, topos_value, topos_value);

static double b_add(double a, double b) {
  return a + b;
}
static double b_sub(double a, double b) {
  return a - b;
}
static double b_mul(double a, double b) {
  return a * b;
}
static double b_div(double a, double b) {
  return a / b;
}
static float b_addf(float a, float b) {
  return a + b;
}
static float b_subf(float a, float b) {
  return a - b;
}
static float b_mulf(float a, float b) {
  return a * b;
}
static float b_divf(float a, float b) {
  return a / b;
}

static const struct {
  const char *name;
  binary_fn fn;
  double (*r64)(double, double);
  float (*r32)(float, float);
} binary_cases[] = {
    {"add", topos_add, b_add, b_addf},
    {"sub", topos_sub, b_sub, b_subf},
    {"mul", topos_mul, b_mul, b_mulf},
    {"div", topos_div, b_div, b_divf},
};

START_TEST(binary_bits) {
  const int64_t n = 257;
  for (size_t c = 0; c < sizeof binary_cases / sizeof *binary_cases; c++) {
    double *a = wide_array(n, 100 + c), *b = wide_array(n, 200 + c);
    topos_tape *tp = topos_tape_new(TOPOS_F64);
    topos_value va = cst(tp, raw_tensor(TOPOS_F64, 1, S(n), a));
    topos_value vb = cst(tp, raw_tensor(TOPOS_F64, 1, S(n), b));
    topos_tensor *y = eval(tp, binary_cases[c].fn(tp, va, vb));
    double *want = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) want[i] = binary_cases[c].r64(a[i], b[i]);
    expect_bits64(y, want, n, binary_cases[c].name);
    topos_tensor_release(y);

    float *af = to_f32(a, n), *bf = to_f32(b, n);
    tp = topos_tape_new(TOPOS_F32);
    va = cst(tp, raw_tensor(TOPOS_F32, 1, S(n), af));
    vb = cst(tp, raw_tensor(TOPOS_F32, 1, S(n), bf));
    y = eval(tp, binary_cases[c].fn(tp, va, vb));
    float *wantf = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++)
      wantf[i] = binary_cases[c].r32(af[i], bf[i]);
    expect_bits32(y, wantf, n, binary_cases[c].name);
    topos_tensor_release(y);

    uint16_t *ab = malloc(2 * n), *bb = malloc(2 * n), *wantb = malloc(2 * n);
    for (int64_t i = 0; i < n; i++) {
      ab[i] = bf16_of(af[i]);
      bb[i] = bf16_of(bf[i]);
      wantb[i] = bf16_of(binary_cases[c].r32(f32_of(ab[i]), f32_of(bb[i])));
    }
    tp = topos_tape_new(TOPOS_BF16);
    va = cst(tp, raw_tensor(TOPOS_BF16, 1, S(n), ab));
    vb = cst(tp, raw_tensor(TOPOS_BF16, 1, S(n), bb));
    y = eval(tp, binary_cases[c].fn(tp, va, vb));
    expect_bits16(y, wantb, n, binary_cases[c].name);
    topos_tensor_release(y);
    free(ab);
    free(bb);
    free(wantb);
    free(af);
    free(bf);
    free(wantf);
    free(want);
    free(a);
    free(b);
  }
}
END_TEST

/* Binary ops read view operands in place (a transpose, a broadcast along
 * an axis, a narrow, a broadcast scalar): the same bits per element as
 * the op on the elements those views name.  Also maximum and step. */
static double r_max64(double u, double v) {
  return isnan(u) ? u : isnan(v) ? v : u >= v ? u : v;
}
static double r_step64(double u, double v) {
  return u >= v ? 1.0 : 0.0;
}

/* The binary ops with their double-precision definitions. */
static const struct {
  const char *name;
  topos_value (*fn)(topos_tape *, topos_value, topos_value);
  double (*r64)(double, double);
} ops[6] = {
    {"add", topos_add, b_add},           {"sub", topos_sub, b_sub},
    {"mul", topos_mul, b_mul},           {"div", topos_div, b_div},
    {"maximum", topos_maximum, r_max64}, {"step", topos_step, r_step64}};

START_TEST(binary_on_views) {
  const int64_t R = 7, C = 19;
  double *x = wide_array(C * R, 310), *w = wide_array(C, 311);
  double *z = wide_array(R * (C + 5), 312);
  x[3] = NAN;
  w[2] = -0.0;
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    for (int o = 0; o < 6; o++)
      for (int shape = 0; shape < 4; shape++) {
        topos_tape *tp = topos_tape_new(d);
        /* a: transpose of x [C,R] -> [R,C] (shape 3: x as [R,C] itself);
         * b: w along rows, or a narrow of z, or a scalar broadcast. */
        topos_value a =
            shape == 3
                ? cst(tp, tt_tensor(d, 2, S(R, C), x))
                : topos_transpose(tp, cst(tp, tt_tensor(d, 2, S(C, R), x)));
        topos_value b;
        if (shape == 0 || shape == 3)
          b = topos_broadcast_along(tp, cst(tp, tt_tensor(d, 1, S(C), w)), 0,
                                    R);
        else if (shape == 1)
          b = topos_narrow(tp, cst(tp, tt_tensor(d, 2, S(R, C + 5), z)), 1, 3,
                           C);
        else
          b = topos_broadcast(tp, cst(tp, tt_tensor(d, 0, NULL, w + 1)), 2,
                              S(R, C));
        topos_tensor *y = eval(tp, ops[o].fn(tp, a, b));
        double *got = tt_values(y);
        for (int64_t i = 0; i < R; i++)
          for (int64_t j = 0; j < C; j++) {
            double av = shape == 3 ? x[i * C + j] : x[j * R + i];
            double bv = shape == 0 || shape == 3 ? w[j]
                        : shape == 1             ? z[i * (C + 5) + 3 + j]
                                                 : w[1];
            if (d == TOPOS_F32) {
              av = (float)av;
              bv = (float)bv;
            }
            /* f32 +−×÷ rounded from double are the f32 results. */
            double want = ops[o].r64(av, bv);
            if (d == TOPOS_F32) want = (float)want;
            double g = got[i * C + j];
            ck_assert_msg(
                (isnan(want) && isnan(g)) || (memcmp(&want, &g, sizeof g) == 0),
                "%s %s view %d at (%lld,%lld): got %a want %a", ops[o].name,
                topos_dtype_name(d), shape, (long long)i, (long long)j, g,
                want);
          }
        free(got);
        topos_tensor_release(y);
      }
  }
  free(x);
  free(w);
  free(z);
}
END_TEST

/* f32 add, sub, mul and div along each of their vector paths (sixteen
 * lanes on AVX-512, tails scalar): when both operands are NaN the first's
 * comes out, quieted, as the scalar instruction gives it; one NaN comes
 * out quieted; every other element is the IEEE result.  Payloads mark
 * which operand won. */
static uint32_t quiet_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u | 0x00400000u;
}

/* y[i] against u[i] op w[i], op 0-3 add, sub, mul, div. */
static void expect_first_nan(const topos_tensor *y, const float *u,
                             const float *w, int64_t n, int op,
                             const char *what) {
  size_t bytes;
  const uint32_t *got = topos_tensor_memory(y, &bytes);
  ck_assert_uint_eq(bytes, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++) {
    uint32_t want;
    if (isnan(u[i])) {
      want = quiet_bits(u[i]);
    } else if (isnan(w[i])) {
      want = quiet_bits(w[i]);
    } else {
      float r = op == 0   ? u[i] + w[i]
                : op == 1 ? u[i] - w[i]
                : op == 2 ? u[i] * w[i]
                          : u[i] / w[i];
      memcpy(&want, &r, 4);
    }
    ck_assert_msg(got[i] == want, "%s op %d element %lld: got %08x want %08x",
                  what, op, (long long)i, got[i], want);
  }
}

START_TEST(binary_nan_order) {
  enum { R = 40, C = 70, N = R * C };
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  float *u = malloc(N * sizeof *u), *w = malloc(N * sizeof *w);
  for (int i = 0; i < N; i++) {
    uint32_t ua = 0x7f800001u + (uint32_t)i * 3,     /* signalling */
        ub = 0xffc00000u + 0x100u + (uint32_t)i * 5; /* quiet, negative */
    if (i % 3 == 1) ua = 0x3f800000u + (uint32_t)i;  /* a number */
    if (i % 4 == 2) ub = 0x40000000u + (uint32_t)i;
    memcpy(&a[i], &ua, 4);
    memcpy(&b[i], &ub, 4);
  }
  topos_value (*const fns[4])(topos_tape *, topos_value, topos_value) = {
      topos_add, topos_sub, topos_mul, topos_div};
  for (int o = 0; o < 4; o++)
    for (int path = 0; path < 4; path++)
      for (int left = 0; left < 2; left++) {
        topos_error err = {0};
        topos_tape *tp = topos_tape_new(TOPOS_F32);
        topos_value x, s;
        int64_t n = N;
        if (path == 0) { /* contiguous [37] op [37]: two vectors, a tail */
          n = 37;
          x = cst(tp, topos_tensor_from(TOPOS_F32, 1, S(n), a, &err));
          s = cst(tp, topos_tensor_from(TOPOS_F32, 1, S(n), b, &err));
          memcpy(u, a, n * 4);
          memcpy(w, b, n * 4);
        } else if (path == 3) { /* [R,C] op a [5]-row repeated: the tile */
          n = R * 5;
          x = cst(tp, topos_tensor_from(TOPOS_F32, 2, S(R, 5), a, &err));
          s = topos_broadcast_along(
              tp, cst(tp, topos_tensor_from(TOPOS_F32, 1, S(5), b + 1, &err)),
              0, R);
          for (int64_t i = 0; i < n; i++) {
            u[i] = a[i];
            w[i] = b[1 + i % 5];
          }
        } else { /* [R,C] (path 2: transposed) op a NaN scalar, rows of C */
          x = cst(tp, topos_tensor_from(TOPOS_F32, 2, S(R, C), a, &err));
          if (path == 2)
            x = topos_transpose(
                tp, cst(tp, topos_tensor_from(TOPOS_F32, 2, S(C, R), a, &err)));
          s = topos_broadcast(
              tp, cst(tp, topos_tensor_from(TOPOS_F32, 0, NULL, b + 3, &err)),
              2, S(R, C));
          for (int64_t i = 0; i < n; i++) {
            u[i] = path == 2 ? a[(i % C) * R + i / C] : a[i];
            w[i] = b[3];
          }
        }
        topos_tensor *y = eval(tp, left ? fns[o](tp, s, x) : fns[o](tp, x, s));
        const char *names[4] = {"contiguous", "scalar", "gathered", "tiled"};
        if (left)
          expect_first_nan(y, w, u, n, o, names[path]);
        else
          expect_first_nan(y, u, w, n, o, names[path]);
        topos_tensor_release(y);
      }
  free(a);
  free(b);
  free(u);
  free(w);
}
END_TEST

/* The broadcast fast paths of binary views, on either side: a short row
 * repeated over many rows (tiled, more rows than one tile holds) and a
 * scalar against a contiguous or a transposed operand (rows of 70: long
 * enough for the per-row scalar loop).  Same bits as the op on the named
 * elements. */
START_TEST(binary_broadcast_sides) {
  const int64_t R = 40, C = 70; /* 14 rows a tile: 3 tiles */
  double *x = wide_array(R * C, 330), *w = wide_array(C, 331);
  x[7] = NAN;
  x[8] = -0.0;
  w[1] = -0.0;
  w[3] = NAN;
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    for (int o = 0; o < 6; o++)
      for (int shape = 0; shape < 4; shape++)
        for (int left = 0; left < 2; left++) {
          topos_tape *tp = topos_tape_new(d);
          /* a: x [R,C] (shapes 2 and 3: the transpose of x seen as [C,R]) */
          topos_value a =
              shape >= 2
                  ? topos_transpose(tp, cst(tp, tt_tensor(d, 2, S(C, R), x)))
                  : cst(tp, tt_tensor(d, 2, S(R, C), x));
          /* b: w along rows (shape 0), the scalar w[0] (1, 2), or w[i]
           * for row i (3: a per-channel value, as a bias) */
          topos_value b =
              shape == 0 ? topos_broadcast_along(
                               tp, cst(tp, tt_tensor(d, 1, S(C), w)), 0, R)
              : shape == 3
                  ? topos_broadcast_along(tp, cst(tp, tt_tensor(d, 1, S(R), w)),
                                          1, C)
                  : topos_broadcast(tp, cst(tp, tt_tensor(d, 0, NULL, w)), 2,
                                    S(R, C));
          topos_tensor *y =
              eval(tp, left ? ops[o].fn(tp, b, a) : ops[o].fn(tp, a, b));
          double *got = tt_values(y);
          for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
              double av = shape >= 2 ? x[j * R + i] : x[i * C + j];
              double bv = shape == 0 ? w[j] : shape == 3 ? w[i] : w[0];
              if (d == TOPOS_F32) {
                av = (float)av;
                bv = (float)bv;
              }
              double want = left ? ops[o].r64(bv, av) : ops[o].r64(av, bv);
              if (d == TOPOS_F32) want = (float)want;
              double g = got[i * C + j];
              ck_assert_msg((isnan(want) && isnan(g)) ||
                                (memcmp(&want, &g, sizeof g) == 0),
                            "%s %s shape %d left %d at (%lld,%lld): got %a "
                            "want %a",
                            ops[o].name, topos_dtype_name(d), shape, left,
                            (long long)i, (long long)j, g, want);
            }
          free(got);
          topos_tensor_release(y);
        }
  }
  free(x);
  free(w);
}
END_TEST

/* Binary ops on views large enough to be split over threads (units of
 * whole rows, eval_binary_views): rank 3 (an odometer over blocks), a
 * transposed operand against a per-row value and against a full view,
 * at 1, 2 and 3 threads - each element the op on the elements its views
 * name. */
static topos_tensor *eval_threads(topos_tape *tp, topos_value y, int threads) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tp, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  topos_exec ctx = {.threads = threads};
  topos_run *run = topos_forward(net, NULL, NULL, 0, &ctx, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  topos_tensor *r = topos_tensor_retain(topos_run_of(run, y, &err));
  topos_run_free(run);
  topos_network_release(net);
  return r;
}

START_TEST(binary_views_threads) {
  enum { P = 3, R = 130, C = 97 }; /* 37,830 elements */
  double *x = wide_array(P * R * C, 501), *w = wide_array(P * R * C, 502);
  x[11] = NAN;
  w[5] = -0.0;
  for (int o = 0; o < 6; o++)
    for (int kind = 0; kind < 2; kind++)
      for (int threads = 1; threads <= 3; threads++) {
        topos_tape *tp = topos_tape_new(TOPOS_F32);
        /* a: x [P,C,R] seen as [P,R,C] */
        int perm[3] = {0, 2, 1};
        topos_value a = topos_permute(
            tp, cst(tp, tt_tensor(TOPOS_F32, 3, S(P, C, R), x)), perm);
        /* b: one value per row (kind 0) or w [P,R,C] itself (1) */
        topos_value b =
            kind == 0
                ? topos_broadcast_along(
                      tp, cst(tp, tt_tensor(TOPOS_F32, 2, S(P, R), w)), 2, C)
                : cst(tp, tt_tensor(TOPOS_F32, 3, S(P, R, C), w));
        topos_tensor *y = eval_threads(tp, ops[o].fn(tp, a, b), threads);
        double *got = tt_values(y);
        for (int64_t p = 0; p < P; p++)
          for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
              double av = (float)x[(p * C + j) * R + i];
              double bv =
                  (float)(kind == 0 ? w[p * R + i] : w[(p * R + i) * C + j]);
              double want = (float)ops[o].r64(av, bv);
              double g = got[(p * R + i) * C + j];
              ck_assert_msg(
                  (isnan(want) && isnan(g)) || memcmp(&want, &g, sizeof g) == 0,
                  "%s kind %d threads %d at (%lld,%lld,%lld): got "
                  "%a want %a",
                  ops[o].name, kind, threads, (long long)p, (long long)i,
                  (long long)j, g, want);
            }
        free(got);
        topos_tensor_release(y);
      }
  free(x);
  free(w);
}
END_TEST

/* Large strided views made contiguous on the threads (contiguous_in:
 * slices of the outermost axis side by side): a reshape of a permuted
 * view, and relu and mul on one (the map offer's inputs, with the
 * default backends registered), at 1, 2 and 3 threads - each element
 * the one its view names. */
START_TEST(contiguous_views_threads) {
  topos_backends_register_defaults();
  enum { P = 41, A = 30, B = 37 }; /* 45,510 elements */
  double *x = wide_array(P * A * B, 601);
  x[17] = NAN;
  x[18] = -0.0;
  for (int what = 0; what < 3; what++)
    for (int threads = 1; threads <= 3; threads++) {
      topos_tape *tp = topos_tape_new(TOPOS_F32);
      int perm[3] = {0, 2, 1};
      /* v: x [P,A,B] seen as [P,B,A] */
      topos_value v = topos_permute(
          tp, cst(tp, tt_tensor(TOPOS_F32, 3, S(P, A, B), x)), perm);
      topos_value y = what == 0   ? topos_reshape(tp, v, 2, S(P, B * A))
                      : what == 1 ? topos_relu(tp, v)
                                  : topos_mul(tp, v, v);
      topos_tensor *t = eval_threads(tp, y, threads);
      double *got = tt_values(t);
      for (int64_t p = 0; p < P; p++)
        for (int64_t b = 0; b < B; b++)
          for (int64_t a = 0; a < A; a++) {
            double e = (float)x[(p * A + a) * B + b];
            double want = what == 0   ? e
                          : what == 1 ? (isnan(e) ? e
                                         : e > 0  ? e
                                                  : 0.0)
                                      : (double)((float)e * (float)e);
            double g = got[(p * B + b) * A + a];
            ck_assert_msg(
                (isnan(want) && isnan(g)) || memcmp(&want, &g, sizeof g) == 0,
                "op %d threads %d at (%lld,%lld,%lld): got %a want %a", what,
                threads, (long long)p, (long long)b, (long long)a, g, want);
          }
      free(got);
      topos_tensor_release(t);
    }
  free(x);
}
END_TEST

/* Rank 4: the two innermost axes go to one kernel call and an odometer
 * walks the other two.  a is x [2,3,4,5] permuted to [3,2,5,4]; b is w
 * [3,5] broadcast along axes 1 and 3 (to [3,2,5,4]). */
START_TEST(binary_on_views_rank4) {
  double *x = wide_array(120, 320), *w = wide_array(15, 321);
  static const int perm[4] = {1, 0, 3, 2};
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value a =
        topos_permute(tp, cst(tp, tt_tensor(d, 4, S(2, 3, 4, 5), x)), perm);
    topos_value b = topos_broadcast_along(
        tp,
        topos_broadcast_along(tp, cst(tp, tt_tensor(d, 2, S(3, 5), w)), 1, 2),
        3, 4);
    topos_tensor *y = eval(tp, topos_sub(tp, a, b));
    double *got = tt_values(y);
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++)
        for (int p = 0; p < 5; p++)
          for (int q = 0; q < 4; q++) {
            double av = x[((j * 3 + i) * 4 + q) * 5 + p], bv = w[i * 5 + p];
            double want =
                d == TOPOS_F32 ? (double)((float)av - (float)bv) : av - bv;
            double g = got[((i * 2 + j) * 5 + p) * 4 + q];
            ck_assert_msg(memcmp(&want, &g, sizeof g) == 0,
                          "%s at (%d,%d,%d,%d): got %a want %a",
                          topos_dtype_name(d), i, j, p, q, g, want);
          }
    free(got);
    topos_tensor_release(y);
  }
  free(x);
  free(w);
}
END_TEST

/* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and rounds to even (1);
 * 1 + 3*2^-8 ties up to 1 + 2^-6. */
START_TEST(bf16_round_once_ties) {
  topos_tape *tp = topos_tape_new(TOPOS_BF16);
  uint16_t a[3] = {bf16_of(1.0f), bf16_of(1.0f + 0x1p-7f), bf16_of(65280.0f)};
  uint16_t b[3] = {bf16_of(0x1p-8f), bf16_of(0x1p-8f), bf16_of(65280.0f)};
  topos_value va = cst(tp, raw_tensor(TOPOS_BF16, 1, S(3), a));
  topos_value vb = cst(tp, raw_tensor(TOPOS_BF16, 1, S(3), b));
  topos_tensor *y = eval(tp, topos_add(tp, va, vb));
  double *v = tt_values(y);
  ck_assert(v[0] == 1.0);
  ck_assert(v[1] == 1.0 + 0x1p-6);
  ck_assert(v[2] == 130560.0); /* finite in bf16 (range of f32) */
  free(v);
  topos_tensor_release(y);
}
END_TEST

/* --------------------------------------------------------------- matmul */

static void matmul_bits_case(int64_t batch, int64_t m, int64_t k, int64_t n,
                             bool transposed_a, uint64_t seed) {
  int64_t na = batch * m * k, nb = batch * k * n, nc = batch * m * n;
  double *a = uniform_array(na, seed, -2, 2);
  double *b = uniform_array(nb, seed + 1, -2, 2);
  double *c = malloc(sizeof(double) * nc);
  ref_matmul64(a, b, c, batch, m, k, n);
  int rank = batch > 1 ? 3 : 2;
  const int64_t *sa = batch > 1 ? S(batch, m, k) : S(m, k);
  const int64_t *sb = batch > 1 ? S(batch, k, n) : S(k, n);

  /* f64 */
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value va;
  if (transposed_a) {
    /* record a as aᵀ stored row-major, transposed back by the op: the
     * kernel then reads a strided view */
    double *at = malloc(sizeof(double) * na);
    for (int64_t i = 0; i < m; i++)
      for (int64_t q = 0; q < k; q++) at[q * m + i] = a[i * k + q];
    va = topos_transpose(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(k, m), at)));
    free(at);
  } else {
    va = cst(tp, raw_tensor(TOPOS_F64, rank, sa, a));
  }
  topos_value vb = cst(tp, raw_tensor(TOPOS_F64, rank, sb, b));
  topos_tensor *y = eval(tp, topos_matmul(tp, va, vb));
  expect_shape(y, TOPOS_F64, rank, batch > 1 ? S(batch, m, n) : S(m, n));
  expect_bits64(y, c, nc, "matmul f64");
  topos_tensor_release(y);

  /* f32 */
  float *af = to_f32(a, na), *bf = to_f32(b, nb);
  float *cf = malloc(sizeof(float) * nc);
  ref_matmul32(af, bf, cf, batch, m, k, n);
  tp = topos_tape_new(TOPOS_F32);
  va = cst(tp, raw_tensor(TOPOS_F32, rank, sa, af));
  vb = cst(tp, raw_tensor(TOPOS_F32, rank, sb, bf));
  y = eval(tp, topos_matmul(tp, va, vb));
  expect_bits32(y, cf, nc, "matmul f32");
  topos_tensor_release(y);

  /* bf16: f32 fma chain, one rounding at the end */
  uint16_t *ab = malloc(2 * na), *bb = malloc(2 * nb), *cb = malloc(2 * nc);
  for (int64_t i = 0; i < na; i++) {
    ab[i] = bf16_of(af[i]);
    af[i] = f32_of(ab[i]);
  }
  for (int64_t i = 0; i < nb; i++) {
    bb[i] = bf16_of(bf[i]);
    bf[i] = f32_of(bb[i]);
  }
  ref_matmul32(af, bf, cf, batch, m, k, n);
  for (int64_t i = 0; i < nc; i++) cb[i] = bf16_of(cf[i]);
  tp = topos_tape_new(TOPOS_BF16);
  va = cst(tp, raw_tensor(TOPOS_BF16, rank, sa, ab));
  vb = cst(tp, raw_tensor(TOPOS_BF16, rank, sb, bb));
  y = eval(tp, topos_matmul(tp, va, vb));
  expect_bits16(y, cb, nc, "matmul bf16");
  topos_tensor_release(y);
  free(ab);
  free(bb);
  free(cb);
  free(af);
  free(bf);
  free(cf);
  free(a);
  free(b);
  free(c);
}

START_TEST(matmul_hand) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value a = cvals(tp, d, 2, S(2, 3), D(1, 2, 3, 4, 5, 6));
    topos_value b = cvals(tp, d, 2, S(3, 2), D(7, 8, 9, 10, 11, 12));
    topos_tensor *y = eval(tp, topos_matmul(tp, a, b));
    expect_shape(y, d, 2, S(2, 2));
    tt_assert_values(y, D(58, 64, 139, 154), 4);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(matmul_bits) {
  matmul_bits_case(1, 7, 33, 5, false, 1);
  matmul_bits_case(3, 7, 33, 5, false, 2);
  matmul_bits_case(1, 1, 1, 1, false, 3);
  matmul_bits_case(1, 16, 100, 17, false, 4);
  matmul_bits_case(1, 7, 33, 5, true, 5);
}
END_TEST

/* The chain starts at +0.0: (-1)·0 added to +0 is +0, not -0. */
START_TEST(matmul_starts_at_plus_zero) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value a = cvals(tp, d, 2, S(1, 2), D(-1, -0.0));
    topos_value b = cvals(tp, d, 2, S(2, 1), D(0, 3));
    topos_tensor *y = eval(tp, topos_matmul(tp, a, b));
    double *v = tt_values(y);
    ck_assert(v[0] == 0 && !signbit(v[0]));
    free(v);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(matmul_empty_k) {
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value a = cst(tp, raw_tensor(TOPOS_F64, 2, S(2, 0), NULL));
  topos_value b = cst(tp, raw_tensor(TOPOS_F64, 2, S(0, 3), NULL));
  topos_tensor *y = eval(tp, topos_matmul(tp, a, b));
  expect_shape(y, TOPOS_F64, 2, S(2, 3));
  const double z[6] = {0, 0, 0, 0, 0, 0};
  expect_bits64(y, z, 6, "matmul k=0");
  topos_tensor_release(y);
}
END_TEST

/* ------------------------------------------------------------ reductions */

static const int64_t sum_sizes[] = {0, 1, 15, 16, 17, 33, 100, 1000};
#define NSIZES ((int)(sizeof sum_sizes / sizeof *sum_sizes))

START_TEST(sum_striped_bits) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = sum_sizes[s];
    double *x = wide_array(n, 300 + s);
    topos_tape *tp = topos_tape_new(TOPOS_F64);
    topos_tensor *y =
        eval(tp, topos_sum(tp, cst(tp, raw_tensor(TOPOS_F64, 1, S(n), x))));
    expect_shape(y, TOPOS_F64, 0, NULL);
    double want = ref_sum64(x, n, 1);
    char what[64];
    snprintf(what, sizeof what, "sum f64 n=%lld", (long long)n);
    expect_bits64(y, &want, 1, what);
    topos_tensor_release(y);

    float *xf = to_f32(x, n);
    tp = topos_tape_new(TOPOS_F32);
    y = eval(tp, topos_sum(tp, cst(tp, raw_tensor(TOPOS_F32, 1, S(n), xf))));
    float wantf = ref_sum32(xf, n, 1);
    snprintf(what, sizeof what, "sum f32 n=%lld", (long long)n);
    expect_bits32(y, &wantf, 1, what);
    topos_tensor_release(y);

    /* bf16: f32 accumulation, one rounding */
    uint16_t *xb = malloc(2 * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
      xb[i] = bf16_of(xf[i]);
      xf[i] = f32_of(xb[i]);
    }
    uint16_t wantb = bf16_of(ref_sum32(xf, n, 1));
    tp = topos_tape_new(TOPOS_BF16);
    y = eval(tp, topos_sum(tp, cst(tp, raw_tensor(TOPOS_BF16, 1, S(n), xb))));
    snprintf(what, sizeof what, "sum bf16 n=%lld", (long long)n);
    expect_bits16(y, &wantb, 1, what);
    topos_tensor_release(y);
    free(xb);
    free(xf);
    free(x);
  }
  /* The data is order-sensitive: the test would see a plain left fold. */
  double *x = wide_array(1000, 300 + NSIZES - 1);
  float *xf = to_f32(x, 1000);
  double s64 = ref_sum64(x, 1000, 1), l64 = left_fold64(x, 1000);
  float s32 = ref_sum32(xf, 1000, 1), l32 = left_fold32(xf, 1000);
  ck_assert(s64 != l64 || s32 != l32);
  free(x);
  free(xf);
}
END_TEST

/* The sum of nothing is +0, and a sum of one -0 stays -0 (a left fold
 * starts with x0, it does not add x0 to +0). */
START_TEST(sum_zero_signs) {
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_tensor *y =
      eval(tp, topos_sum(tp, cst(tp, raw_tensor(TOPOS_F64, 1, S(0), NULL))));
  double *z = tt_values(y);
  ck_assert(z[0] == 0 && !signbit(z[0]));
  free(z);
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_F64);
  y = eval(tp, topos_sum(tp, cvals(tp, TOPOS_F64, 1, S(2), D(-0.0, -0.0))));
  double *w = tt_values(y);
  ck_assert(w[0] == 0 && signbit(w[0]));
  free(w);
  topos_tensor_release(y);
}
END_TEST

/* sum_along over axis 1 of [r,n], axis 0 of [n,r], axis 1 of [2,n,3]. */
START_TEST(sum_along_striped_bits) {
  for (int s = 0; s < NSIZES - 1; s++) {
    int64_t n = sum_sizes[s];
    const int64_t r = 3;
    double *x = wide_array(r * n * 2, 400 + s);
    float *xf = to_f32(x, r * n * 2);
    char what[64];
    for (int form = 0; form < 3; form++) {
      int rank = form == 2 ? 3 : 2;
      const int64_t *shape = form == 0   ? S(r, n)
                             : form == 1 ? S(n, r)
                                         : S(2, n, r);
      int axis = form == 0 ? 1 : form == 1 ? 0 : 1;
      int64_t outer = form == 0 ? r : form == 1 ? 1 : 2;
      int64_t inner = form == 0 ? 1 : r;
      int64_t nout = outer * inner;
      double *want = malloc(sizeof(double) * nout);
      float *wantf = malloc(sizeof(float) * nout);
      for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
          want[o * inner + i] = ref_sum64(x + o * n * inner + i, n, inner);
          wantf[o * inner + i] = ref_sum32(xf + o * n * inner + i, n, inner);
        }
      snprintf(what, sizeof what, "sum_along form %d n=%lld", form,
               (long long)n);
      topos_tape *tp = topos_tape_new(TOPOS_F64);
      topos_tensor *y = eval(
          tp, topos_sum_along(
                  tp, cst(tp, raw_tensor(TOPOS_F64, rank, shape, x)), axis));
      expect_bits64(y, want, nout, what);
      topos_tensor_release(y);
      tp = topos_tape_new(TOPOS_F32);
      y = eval(tp,
               topos_sum_along(
                   tp, cst(tp, raw_tensor(TOPOS_F32, rank, shape, xf)), axis));
      expect_bits32(y, wantf, nout, what);
      topos_tensor_release(y);
      free(want);
      free(wantf);
    }
    free(x);
    free(xf);
  }
}
END_TEST

START_TEST(sum_along_hand) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value a = cvals(tp, d, 2, S(2, 3), D(1, 2, 3, 4, 5, 6));
    topos_tensor *y0 = eval(tp, topos_sum_along(tp, a, 0));
    expect_shape(y0, d, 1, S(3));
    tt_assert_values(y0, D(5, 7, 9), 3);
    topos_tensor_release(y0);
    tp = topos_tape_new(d);
    a = cvals(tp, d, 2, S(2, 3), D(1, 2, 3, 4, 5, 6));
    topos_tensor *y1 = eval(tp, topos_sum_along(tp, a, 1));
    expect_shape(y1, d, 1, S(2));
    tt_assert_values(y1, D(6, 15), 2);
    topos_tensor_release(y1);
    tp = topos_tape_new(d);
    a = cvals(tp, d, 2, S(2, 3), D(1, 2, 3, 4, 5, 6));
    topos_tensor *y2 = eval(tp, topos_sum(tp, a));
    tt_assert_values(y2, D(21), 1);
    topos_tensor_release(y2);
  }
}
END_TEST

/* m = first maximum; s = striped sum of exp(x - m); lse = m + log(s);
 * log_softmax = (x - m) - log(s). */
static void ref_rows64(const double *x, int64_t n, int64_t stride, double *lse,
                       double *ls, int64_t ls_stride) {
  double m = x[0];
  for (int64_t i = 1; i < n; i++)
    if (x[i * stride] > m) m = x[i * stride];
  double *e = calloc((size_t)n + 1, sizeof(double));
  for (int64_t i = 0; i < n; i++) e[i] = exp(x[i * stride] - m);
  double s = ref_sum64(e, n, 1);
  double l = log(s);
  *lse = m + l;
  for (int64_t i = 0; i < n; i++) ls[i * ls_stride] = (x[i * stride] - m) - l;
  free(e);
}

static void ref_rows32(const float *x, int64_t n, int64_t stride, float *lse,
                       float *ls, int64_t ls_stride) {
  float m = x[0];
  for (int64_t i = 1; i < n; i++)
    if (x[i * stride] > m) m = x[i * stride];
  float *e = calloc((size_t)n + 1, sizeof(float));
  for (int64_t i = 0; i < n; i++) e[i] = expf(x[i * stride] - m);
  float s = ref_sum32(e, n, 1);
  float l = logf(s);
  *lse = m + l;
  for (int64_t i = 0; i < n; i++) ls[i * ls_stride] = (x[i * stride] - m) - l;
  free(e);
}

START_TEST(softmax_rows_bits) {
  const int64_t sizes[] = {1, 5, 16, 17, 40};
  const int64_t r = 3;
  for (int s = 0; s < 5; s++) {
    int64_t n = sizes[s];
    double *x = uniform_array(r * n, 500 + s, -6, 6);
    float *xf = to_f32(x, r * n);
    for (int axis = 0; axis < 2; axis++) {
      /* axis 1: x is [r,n]; axis 0: x is [n,r] (the same buffer) */
      const int64_t *shape = axis == 1 ? S(r, n) : S(n, r);
      int64_t stride = axis == 1 ? 1 : r;
      int64_t step = axis == 1 ? n : 1;
      double *lse = malloc(sizeof(double) * r), *ls = malloc(8 * r * n);
      float *lsef = malloc(sizeof(float) * r), *lsf = malloc(4 * r * n);
      for (int64_t o = 0; o < r; o++) {
        ref_rows64(x + o * step, n, stride, &lse[o], ls + o * step, stride);
        ref_rows32(xf + o * step, n, stride, &lsef[o], lsf + o * step, stride);
      }
      char what[64];
      snprintf(what, sizeof what, "n=%lld axis %d", (long long)n, axis);
      topos_tape *tp = topos_tape_new(TOPOS_F64);
      topos_tensor *y =
          eval(tp, topos_logsumexp(
                       tp, cst(tp, raw_tensor(TOPOS_F64, 2, shape, x)), axis));
      expect_bits64(y, lse, r, what);
      topos_tensor_release(y);
      tp = topos_tape_new(TOPOS_F64);
      y = eval(tp, topos_log_softmax(
                       tp, cst(tp, raw_tensor(TOPOS_F64, 2, shape, x)), axis));
      expect_shape(y, TOPOS_F64, 2, shape);
      expect_bits64(y, ls, r * n, what);
      topos_tensor_release(y);
      tp = topos_tape_new(TOPOS_F32);
      y = eval(tp, topos_logsumexp(
                       tp, cst(tp, raw_tensor(TOPOS_F32, 2, shape, xf)), axis));
      expect_bits32(y, lsef, r, what);
      topos_tensor_release(y);
      tp = topos_tape_new(TOPOS_F32);
      y = eval(tp, topos_log_softmax(
                       tp, cst(tp, raw_tensor(TOPOS_F32, 2, shape, xf)), axis));
      expect_bits32(y, lsf, r * n, what);
      topos_tensor_release(y);
      free(lse);
      free(ls);
      free(lsef);
      free(lsf);
    }
    free(x);
    free(xf);
  }
}
END_TEST

/* Subtracting the maximum keeps both finite for huge inputs. */
START_TEST(softmax_rows_huge_inputs) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    const double x[3] = {1000, -1000, 999};
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_logsumexp(tp, cvals(tp, d, 1, S(3), x), 0));
    double v = first(y);
    double want = 1000 + log1p(exp(-1.0));
    ck_assert_msg(isfinite(v) && fabs(v - want) < 1e-3, "lse %g", v);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_log_softmax(tp, cvals(tp, d, 1, S(3), x), 0));
    double *w = tt_values(y);
    double l = log1p(exp(-1.0));
    const double expect[3] = {-l, -2000 - l, -1 - l};
    for (int i = 0; i < 3; i++)
      ck_assert_msg(isfinite(w[i]) && fabs(w[i] - expect[i]) < 1e-3,
                    "log_softmax[%d] = %g", i, w[i]);
    free(w);
    topos_tensor_release(y);
    /* all very negative */
    tp = topos_tape_new(d);
    y = eval(tp,
             topos_logsumexp(tp, cvals(tp, d, 1, S(2), D(-1000, -1000)), 0));
    v = first(y);
    ck_assert_msg(fabs(v - (-1000 + log(2.0))) < 1e-3, "lse %g", v);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(max_along_values) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    const double x[12] = {1, 3, 2, 3, NAN, 0, 5, 1, -0.0, 0.0, -1, -2};
    /* rows of 4: [1,3,2,3] [NaN,0,5,1] [-0,+0,-1,-2] */
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_max_along(tp, cvals(tp, d, 2, S(3, 4), x), 1));
    expect_shape(y, d, 1, S(3));
    double *v = tt_values(y);
    ck_assert(v[0] == 3);
    ck_assert(isnan(v[1]));
    ck_assert(v[2] == 0 && signbit(v[2])); /* the first maximal value */
    free(v);
    topos_tensor_release(y);
    /* NaN later in the row propagates too */
    tp = topos_tape_new(d);
    y = eval(tp,
             topos_max_along(tp, cvals(tp, d, 1, S(4), D(1, 7, NAN, 2)), 0));
    ck_assert(isnan(first(y)));
    topos_tensor_release(y);
    /* axis 0 of [3,2] */
    tp = topos_tape_new(d);
    y = eval(tp, topos_max_along(
                     tp, cvals(tp, d, 2, S(3, 2), D(1, -5, 4, -7, 2, -6)), 0));
    tt_assert_values(y, D(4, -5), 2);
    topos_tensor_release(y);
  }
}
END_TEST

/* ------------------------------------------------------------- indexing */

START_TEST(gather_values) {
  const topos_dtype dts[3] = {TOPOS_F64, TOPOS_F32, TOPOS_BF16};
  double table[12];
  for (int i = 0; i < 12; i++) table[i] = 10 * (i / 3) + i % 3;
  for (int k = 0; k < 3; k++) {
    topos_tape *tp = topos_tape_new(dts[k]);
    topos_value t = cvals(tp, dts[k], 2, S(4, 3), table);
    topos_value i = cvals(tp, TOPOS_I32, 1, S(4), D(2, 0, 2, 3));
    topos_tensor *y = eval(tp, topos_gather(tp, t, i));
    expect_shape(y, dts[k], 2, S(4, 3));
    tt_assert_values(y, D(20, 21, 22, 0, 1, 2, 20, 21, 22, 30, 31, 32), 12);
    topos_tensor_release(y);
  }
}
END_TEST

static void gather_bad_index(int bad, const char *text) {
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value t =
      cvals(tp, TOPOS_F64, 2, S(4, 3), D(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  topos_tensor *def = tt_tensor(TOPOS_I32, 1, S(2), D(0, 1));
  topos_value in = topos_input(tp, def);
  topos_tensor_release(def);
  topos_value g = topos_gather(tp, t, in);
  topos_value s = topos_sum(tp, g);
  ck_assert(topos_value_ok(s));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tp, &err);
  ck_assert_ptr_nonnull(net);
  topos_tensor *feed_t = tt_tensor(TOPOS_I32, 1, S(2), D(0, bad));
  topos_feed feed = {in, feed_t};
  memset(&err, 0, sizeof err);
  topos_run *run = topos_forward(net, NULL, &feed, 1, NULL, &err);
  ck_assert_ptr_null(run);
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  ck_assert_msg(strstr(err.message, text) != NULL, "no '%s' in: %s", text,
                err.message);
  ck_assert_msg(strstr(err.message, "node") != NULL, "no node in: %s",
                err.message);
  char node[32];
  snprintf(node, sizeof node, "node %d", g.index);
  ck_assert_msg(strstr(err.message, node) != NULL, "no '%s' in: %s", node,
                err.message);
  /* the network is still fine with a good feed */
  memset(&err, 0, sizeof err);
  run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert(topos_run_scalar(run, s, &err) == 0 + 1 + 2 + 3 + 4 + 5);
  topos_run_free(run);
  topos_tensor_release(feed_t);
  topos_network_release(net);
}

START_TEST(gather_index_out_of_range) {
  gather_bad_index(7, "7");
  gather_bad_index(4, "4");
  gather_bad_index(-1, "-1");
  gather_bad_index(-2147483647 - 1, "-2147483648");
}
END_TEST

START_TEST(scatter_values) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value rows = cvals(tp, d, 2, S(4, 2), D(1, 2, 3, 4, 5, 6, 7, 8));
    topos_value i = cvals(tp, TOPOS_I32, 1, S(4), D(1, 3, 1, 0));
    topos_tensor *y = eval(tp, topos_scatter(tp, rows, i, 5));
    expect_shape(y, d, 2, S(5, 2));
    tt_assert_values(y, D(7, 8, 6, 8, 0, 0, 3, 4, 0, 0), 10);
    /* untouched rows are +0 */
    double *v = tt_values(y);
    ck_assert(!signbit(v[4]) && !signbit(v[9]));
    free(v);
    topos_tensor_release(y);
  }
}
END_TEST

/* Rows for one index add in row order: in f32, ((1e8 + 1) - 1e8) + 1 = 1,
 * while the reverse order gives 0. */
START_TEST(scatter_accumulates_in_order) {
  topos_tape *tp = topos_tape_new(TOPOS_F32);
  topos_value rows = cvals(tp, TOPOS_F32, 2, S(4, 1), D(1e8, 1, -1e8, 1));
  topos_value i = cvals(tp, TOPOS_I32, 1, S(4), D(0, 0, 0, 0));
  topos_tensor *y = eval(tp, topos_scatter(tp, rows, i, 2));
  tt_assert_values(y, D(1, 0), 2);
  topos_tensor_release(y);
}
END_TEST

/* More than 16 rows into one index: the striped rule over those rows. */
START_TEST(scatter_striped_bits) {
  const int64_t n = 45, d = 3, V = 4;
  double *rows = wide_array(n * d, 600);
  double idx[45];
  for (int i = 0; i < n; i++) idx[i] = i % 5 == 4 ? 2 : (i % 7 == 6 ? 3 : 0);
  float *rf = to_f32(rows, n * d);
  double want[12];
  float wantf[12];
  for (int v = 0; v < V; v++)
    for (int c = 0; c < d; c++) {
      double sel[45];
      float self[45];
      int m = 0;
      for (int i = 0; i < n; i++)
        if ((int)idx[i] == v) {
          sel[m] = rows[i * d + c];
          self[m] = rf[i * d + c];
          m++;
        }
      want[v * d + c] = ref_sum64(sel, m, 1);
      wantf[v * d + c] = ref_sum32(self, m, 1);
    }
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value r = cst(tp, raw_tensor(TOPOS_F64, 2, S(n, d), rows));
  topos_value i = cvals(tp, TOPOS_I32, 1, S(n), idx);
  topos_tensor *y = eval(tp, topos_scatter(tp, r, i, V));
  expect_bits64(y, want, V * d, "scatter f64");
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_F32);
  r = cst(tp, raw_tensor(TOPOS_F32, 2, S(n, d), rf));
  i = cvals(tp, TOPOS_I32, 1, S(n), idx);
  y = eval(tp, topos_scatter(tp, r, i, V));
  expect_bits32(y, wantf, V * d, "scatter f32");
  topos_tensor_release(y);
  free(rows);
  free(rf);
}
END_TEST

/* --------------------------------------------------------------- layout */

START_TEST(layout_transpose_permute_reshape) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value a = cvals(tp, d, 2, S(2, 3), D(0, 1, 2, 3, 4, 5));
    topos_tensor *y = eval(tp, topos_transpose(tp, a));
    expect_shape(y, d, 2, S(3, 2));
    tt_assert_values(y, D(0, 3, 1, 4, 2, 5), 6);
    topos_tensor_release(y);

    /* reshape reads the logical (row-major) order of a strided value */
    tp = topos_tape_new(d);
    a = cvals(tp, d, 2, S(2, 3), D(0, 1, 2, 3, 4, 5));
    y = eval(tp, topos_reshape(tp, topos_transpose(tp, a), 1, S(6)));
    tt_assert_values(y, D(0, 3, 1, 4, 2, 5), 6);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    a = cvals(tp, d, 2, S(2, 3), D(0, 1, 2, 3, 4, 5));
    y = eval(tp, topos_reshape(tp, a, 3, S(3, 1, 2)));
    expect_shape(y, d, 3, S(3, 1, 2));
    tt_assert_values(y, D(0, 1, 2, 3, 4, 5), 6);
    topos_tensor_release(y);

    double x[24], want[24];
    for (int i = 0; i < 24; i++) x[i] = i;
    /* perm {2,0,1}: out[c][a][b] = in[a][b][c], out shape [4,2,3] */
    for (int c = 0; c < 4; c++)
      for (int a2 = 0; a2 < 2; a2++)
        for (int b = 0; b < 3; b++)
          want[c * 6 + a2 * 3 + b] = x[a2 * 12 + b * 4 + c];
    tp = topos_tape_new(d);
    a = cvals(tp, d, 3, S(2, 3, 4), x);
    y = eval(tp, topos_permute(tp, a, (const int[]){2, 0, 1}));
    expect_shape(y, d, 3, S(4, 2, 3));
    tt_assert_values(y, want, 24);
    topos_tensor_release(y);
    /* perm {1,2,0}: out[b][c][a] = in[a][b][c], shape [3,4,2] */
    for (int a2 = 0; a2 < 2; a2++)
      for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++)
          want[b * 8 + c * 2 + a2] = x[a2 * 12 + b * 4 + c];
    tp = topos_tape_new(d);
    a = cvals(tp, d, 3, S(2, 3, 4), x);
    y = eval(tp, topos_permute(tp, a, (const int[]){1, 2, 0}));
    expect_shape(y, d, 3, S(3, 4, 2));
    tt_assert_values(y, want, 24);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(layout_narrow_pad) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    double x[12];
    for (int i = 0; i < 12; i++) x[i] = i;
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_narrow(tp, cvals(tp, d, 2, S(3, 4), x), 1, 1, 2));
    expect_shape(y, d, 2, S(3, 2));
    tt_assert_values(y, D(1, 2, 5, 6, 9, 10), 6);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_narrow(tp, cvals(tp, d, 2, S(3, 4), x), 0, 2, 1));
    tt_assert_values(y, D(8, 9, 10, 11), 4);
    topos_tensor_release(y);

    tp = topos_tape_new(d);
    y = eval(tp,
             topos_pad(tp, cvals(tp, d, 2, S(2, 2), D(1, 2, 3, 4)), 1, 1, 2));
    expect_shape(y, d, 2, S(2, 5));
    tt_assert_values(y, D(0, 1, 2, 0, 0, 0, 3, 4, 0, 0), 10);
    double *v = tt_values(y);
    ck_assert(!signbit(v[0]) && !signbit(v[4]) && !signbit(v[5]));
    free(v);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp,
             topos_pad(tp, cvals(tp, d, 2, S(2, 2), D(1, 2, 3, 4)), 0, 1, 0));
    expect_shape(y, d, 2, S(3, 2));
    tt_assert_values(y, D(0, 0, 1, 2, 3, 4), 6);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(layout_unfold) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    double x[10];
    for (int i = 0; i < 10; i++) x[i] = i;
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_unfold(tp, cvals(tp, d, 1, S(10), x), 0, 3, 2, 1));
    expect_shape(y, d, 2, S(4, 3));
    tt_assert_values(y, D(0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 8), 12);
    topos_tensor_release(y);
    /* dilation 2: span 5, step 3: windows at 0 and 3 */
    tp = topos_tape_new(d);
    y = eval(tp, topos_unfold(tp, cvals(tp, d, 1, S(10), x), 0, 3, 3, 2));
    expect_shape(y, d, 2, S(2, 3));
    tt_assert_values(y, D(0, 2, 4, 3, 5, 7), 6);
    topos_tensor_release(y);
    /* axis 1 of [2,7], size 2 step 2 dilation 3: span 4, 2 windows */
    double x2[14];
    for (int i = 0; i < 14; i++) x2[i] = 10 * (i / 7) + i % 7;
    tp = topos_tape_new(d);
    y = eval(tp, topos_unfold(tp, cvals(tp, d, 2, S(2, 7), x2), 1, 2, 2, 3));
    expect_shape(y, d, 3, S(2, 2, 2));
    tt_assert_values(y, D(0, 3, 2, 5, 10, 13, 12, 15), 8);
    topos_tensor_release(y);
    /* axis 0 of [5,2]: out[w][j][c] = in[w + j][c] */
    tp = topos_tape_new(d);
    y = eval(tp, topos_unfold(tp, cvals(tp, d, 2, S(5, 2), x), 0, 2, 2, 1));
    expect_shape(y, d, 3, S(2, 2, 2));
    tt_assert_values(y, D(0, 1, 2, 3, 4, 5, 6, 7), 8);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(layout_fold) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    double x[12];
    for (int i = 0; i < 12; i++) x[i] = 10 * (i / 3) + i % 3;
    /* [4 windows, 3] step 2 -> extent 9: overlaps add */
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_fold(tp, cvals(tp, d, 2, S(4, 3), x), 0, 9, 3, 2, 1));
    expect_shape(y, d, 1, S(9));
    tt_assert_values(y, D(0, 1, 12, 11, 32, 21, 52, 31, 32), 9);
    topos_tensor_release(y);
    /* extent 10: one trailing position nobody writes */
    tp = topos_tape_new(d);
    y = eval(tp, topos_fold(tp, cvals(tp, d, 2, S(4, 3), x), 0, 10, 3, 2, 1));
    tt_assert_values(y, D(0, 1, 12, 11, 32, 21, 52, 31, 32, 0), 10);
    topos_tensor_release(y);
    /* dilation 2, size 2, step 1, extent 5: 3 windows at w, w+2 */
    double z[6] = {1, 2, 10, 20, 100, 200};
    tp = topos_tape_new(d);
    y = eval(tp, topos_fold(tp, cvals(tp, d, 2, S(3, 2), z), 0, 5, 2, 1, 2));
    tt_assert_values(y, D(1, 10, 102, 20, 200), 5);
    topos_tensor_release(y);
    /* fold of unfold of ones counts the windows over each position */
    double ones[2 * 7];
    for (int i = 0; i < 14; i++) ones[i] = 1;
    tp = topos_tape_new(d);
    topos_value u =
        topos_unfold(tp, cvals(tp, d, 2, S(2, 7), ones), 1, 3, 2, 1);
    y = eval(tp, topos_fold(tp, u, 1, 7, 3, 2, 1));
    expect_shape(y, d, 2, S(2, 7));
    tt_assert_values(y, D(1, 1, 2, 1, 2, 1, 1, 1, 1, 2, 1, 2, 1, 1), 14);
    topos_tensor_release(y);
  }
}
END_TEST

/* size 20 step 1: up to 20 windows cover one position, so the striped
 * rule applies to the overlaps (window order). */
START_TEST(fold_striped_bits) {
  const int64_t count = 30, size = 20, extent = count + size - 1;
  double *x = wide_array(count * size, 700);
  float *xf = to_f32(x, count * size);
  double *want = malloc(sizeof(double) * extent);
  float *wantf = malloc(sizeof(float) * extent);
  for (int64_t p = 0; p < extent; p++) {
    double sel[32];
    float self[32];
    int m = 0;
    for (int64_t w = 0; w < count; w++) {
      int64_t j = p - w;
      if (j >= 0 && j < size) {
        sel[m] = x[w * size + j];
        self[m] = xf[w * size + j];
        m++;
      }
    }
    want[p] = ref_sum64(sel, m, 1);
    wantf[p] = ref_sum32(self, m, 1);
  }
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_tensor *y = eval(
      tp, topos_fold(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(count, size), x)),
                     0, extent, size, 1, 1));
  expect_bits64(y, want, extent, "fold f64");
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_F32);
  y = eval(tp,
           topos_fold(tp, cst(tp, raw_tensor(TOPOS_F32, 2, S(count, size), xf)),
                      0, extent, size, 1, 1));
  expect_bits32(y, wantf, extent, "fold f32");
  topos_tensor_release(y);
  free(x);
  free(xf);
  free(want);
  free(wantf);
}
END_TEST

/* The fold kernel finds each position's windows from a range and folds
 * whole inner rows at a time; this checks it against the plain search
 * over every window, per element, over steps, dilations, gaps (step >
 * size), inner rows, outer blocks and overlaps past 16 (striped). */
START_TEST(fold_matches_naive) {
  static const int64_t cases[][6] = {
      /* count, size, step, dilation, inner, extra extent */
      {5, 3, 2, 1, 7, 1},
      {6, 4, 1, 2, 3, 0},
      {3, 5, 7, 1, 33, 6},
      {25, 20, 1, 1, 5, 0},
      {4, 2, 2, 3, 1, 1},
      {1, 1, 1, 1, 17, 0},
      {9, 5, 1, 1, 64, 0},
      {7, 3, 3, 2, 2, 2},
      /* inner 1, dilation 1: contiguous windows, overlapping or with gaps */
      {6, 5, 1, 1, 1, 0},
      {4, 3, 5, 1, 1, 4},
      {7, 4, 2, 1, 1, 1},
      {28, 5, 1, 1, 1, 0},
  };
  const int64_t outer = 3;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int64_t count = cases[k][0], size = cases[k][1], step = cases[k][2];
    int64_t dil = cases[k][3], inner = cases[k][4];
    /* The extra tail must stay shorter than a step (no window fits). */
    int64_t extra = cases[k][5] < step ? cases[k][5] : step - 1;
    int64_t extent = (count - 1) * step + (size - 1) * dil + 1 + extra;
    int64_t n = outer * count * size * inner, m = outer * extent * inner;
    double *x = wide_array(n, 900 + k);
    x[n / 2] = -0.0; /* -0 alone stays -0; a sum with it keeps the rule */
    float *xf = to_f32(x, n);
    double *want = malloc(sizeof(double) * (size_t)m);
    float *wantf = malloc(sizeof(float) * (size_t)m);
    double sel[64];
    float self[64];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t e = 0; e < extent; e++)
        for (int64_t i = 0; i < inner; i++) {
          int nt = 0;
          for (int64_t c = 0; c < count; c++) {
            int64_t d = e - c * step;
            if (d < 0 || d % dil != 0 || d / dil >= size) continue;
            int64_t at = ((o * count + c) * size + d / dil) * inner + i;
            sel[nt] = x[at];
            self[nt] = xf[at];
            nt++;
          }
          want[(o * extent + e) * inner + i] = ref_sum64(sel, nt, 1);
          wantf[(o * extent + e) * inner + i] = ref_sum32(self, nt, 1);
        }
    int64_t xs[4] = {outer, count, size, inner};
    topos_tape *tp = topos_tape_new(TOPOS_F64);
    topos_tensor *y =
        eval(tp, topos_fold(tp, cst(tp, raw_tensor(TOPOS_F64, 4, xs, x)), 1,
                            extent, size, step, dil));
    expect_bits64(y, want, m, "fold f64");
    topos_tensor_release(y);
    tp = topos_tape_new(TOPOS_F32);
    y = eval(tp, topos_fold(tp, cst(tp, raw_tensor(TOPOS_F32, 4, xs, xf)), 1,
                            extent, size, step, dil));
    expect_bits32(y, wantf, m, "fold f32");
    topos_tensor_release(y);
    free(x);
    free(xf);
    free(want);
    free(wantf);
  }
}
END_TEST

START_TEST(layout_concat) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_value v[3] = {cvals(tp, d, 2, S(2, 1), D(1, 2)),
                        cvals(tp, d, 2, S(2, 2), D(3, 4, 5, 6)),
                        cvals(tp, d, 2, S(2, 3), D(7, 8, 9, 10, 11, 12))};
    topos_tensor *y = eval(tp, topos_concat(tp, 3, v, 1));
    expect_shape(y, d, 2, S(2, 6));
    tt_assert_values(y, D(1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12), 12);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    topos_value w[3] = {cvals(tp, d, 2, S(1, 2), D(1, 2)),
                        cvals(tp, d, 2, S(2, 2), D(3, 4, 5, 6)),
                        cvals(tp, d, 2, S(1, 2), D(7, 8))};
    y = eval(tp, topos_concat(tp, 3, w, 0));
    expect_shape(y, d, 2, S(4, 2));
    tt_assert_values(y, D(1, 2, 3, 4, 5, 6, 7, 8), 8);
    topos_tensor_release(y);
  }
}
END_TEST

START_TEST(layout_broadcast) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_broadcast(tp, topos_scalar(tp, 2.5), 2, S(2, 3)));
    expect_shape(y, d, 2, S(2, 3));
    tt_assert_values(y, D(2.5, 2.5, 2.5, 2.5, 2.5, 2.5), 6);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_broadcast(tp, cvals(tp, d, 2, S(1, 3), D(1, 2, 3)), 2,
                                 S(2, 3)));
    tt_assert_values(y, D(1, 2, 3, 1, 2, 3), 6);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(
        tp, topos_broadcast(tp, cvals(tp, d, 2, S(2, 1), D(5, 6)), 2, S(2, 3)));
    tt_assert_values(y, D(5, 5, 5, 6, 6, 6), 6);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_broadcast(tp, cvals(tp, d, 3, S(2, 1, 1), D(5, 6)), 3,
                                 S(2, 2, 2)));
    tt_assert_values(y, D(5, 5, 5, 5, 6, 6, 6, 6), 8);
    topos_tensor_release(y);

    double x[6] = {0, 1, 2, 3, 4, 5};
    tp = topos_tape_new(d);
    y = eval(tp, topos_broadcast_along(tp, cvals(tp, d, 2, S(2, 3), x), 0, 2));
    expect_shape(y, d, 3, S(2, 2, 3));
    tt_assert_values(y, D(0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5), 12);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_broadcast_along(tp, cvals(tp, d, 2, S(2, 3), x), 1, 2));
    expect_shape(y, d, 3, S(2, 2, 3));
    tt_assert_values(y, D(0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5), 12);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp, topos_broadcast_along(tp, cvals(tp, d, 2, S(2, 3), x), 2, 2));
    expect_shape(y, d, 3, S(2, 3, 2));
    tt_assert_values(y, D(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5), 12);
    topos_tensor_release(y);
  }
}
END_TEST

/* Compute kernels fed with views (transposed, broadcast, narrowed,
 * unfolded) give the same bits as on the same values made contiguous. */
START_TEST(kernels_on_views) {
  const int64_t m = 5, n = 19;
  double *x = wide_array(m * n, 800);
  /* xt[j][i] = x[i][j] stored contiguously */
  double *xt = malloc(sizeof(double) * m * n);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) xt[j * m + i] = x[i * n + j];
  /* sum_along axis 1 of transpose(xt) == rows of x */
  double want[5];
  for (int64_t i = 0; i < m; i++) want[i] = ref_sum64(x + i * n, n, 1);
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value v =
      topos_transpose(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(n, m), xt)));
  topos_tensor *y = eval(tp, topos_sum_along(tp, v, 1));
  expect_bits64(y, want, m, "sum_along of a transposed view");
  topos_tensor_release(y);
  /* mul of a narrowed view */
  tp = topos_tape_new(TOPOS_F64);
  v = topos_narrow(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(m, n), x)), 1, 3, 4);
  y = eval(tp, topos_mul(tp, v, v));
  double sq[20];
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < 4; j++)
      sq[i * 4 + j] = x[i * n + 3 + j] * x[i * n + 3 + j];
  expect_bits64(y, sq, m * 4, "mul of a narrowed view");
  topos_tensor_release(y);
  /* add of a broadcast scalar */
  tp = topos_tape_new(TOPOS_F64);
  v = cst(tp, raw_tensor(TOPOS_F64, 2, S(m, n), x));
  topos_value b = topos_broadcast(tp, topos_scalar(tp, 0.75), 2, S(m, n));
  y = eval(tp, topos_add(tp, v, b));
  double *ad = malloc(sizeof(double) * m * n);
  for (int64_t i = 0; i < m * n; i++) ad[i] = x[i] + 0.75;
  expect_bits64(y, ad, m * n, "add of a broadcast");
  topos_tensor_release(y);
  /* sum_along of an unfolded view */
  tp = topos_tape_new(TOPOS_F64);
  v = topos_unfold(tp, cst(tp, raw_tensor(TOPOS_F64, 1, S(m * n), x)), 0, 18, 3,
                   1);
  int64_t cnt = (m * n - 18) / 3 + 1;
  y = eval(tp, topos_sum_along(tp, v, 1));
  double *us = malloc(sizeof(double) * cnt);
  for (int64_t w = 0; w < cnt; w++) us[w] = ref_sum64(x + 3 * w, 18, 1);
  expect_bits64(y, us, cnt, "sum_along of an unfolded view");
  topos_tensor_release(y);
  free(us);
  free(ad);
  free(x);
  free(xt);
}
END_TEST

/* A few ops in bf16 beyond the elementwise ones: layout ops move bits
 * unchanged; sum_along rounds once. */
START_TEST(bf16_layout_and_rows) {
  const int64_t r = 3, n = 40;
  double *x = wide_array(r * n, 900);
  uint16_t *xb = malloc(2 * r * n);
  float *xf = malloc(4 * r * n);
  for (int64_t i = 0; i < r * n; i++) {
    xb[i] = bf16_of((float)x[i]);
    xf[i] = f32_of(xb[i]);
  }
  topos_tape *tp = topos_tape_new(TOPOS_BF16);
  topos_value v = cst(tp, raw_tensor(TOPOS_BF16, 2, S(r, n), xb));
  topos_tensor *y = eval(tp, topos_transpose(tp, v));
  uint16_t *tb = malloc(2 * r * n);
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < n; j++) tb[j * r + i] = xb[i * n + j];
  expect_bits16(y, tb, r * n, "bf16 transpose");
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_BF16);
  v = cst(tp, raw_tensor(TOPOS_BF16, 2, S(r, n), xb));
  y = eval(tp, topos_sum_along(tp, v, 1));
  uint16_t want[3];
  for (int64_t i = 0; i < r; i++)
    want[i] = bf16_of(ref_sum32(xf + i * n, n, 1));
  expect_bits16(y, want, r, "bf16 sum_along");
  topos_tensor_release(y);
  /* log_softmax and logsumexp: the f32 rows, rounded once */
  float lse[3], *ls = malloc(4 * r * n);
  uint16_t *lsb = malloc(2 * r * n);
  for (int64_t i = 0; i < r; i++) {
    for (int64_t j = 0; j < n; j++) xf[i * n + j] = xf[i * n + j] / 1024;
    ref_rows32(xf + i * n, n, 1, &lse[i], ls + i * n, 1);
    want[i] = bf16_of(lse[i]);
  }
  for (int64_t i = 0; i < r * n; i++) {
    lsb[i] = bf16_of(ls[i]);
    xb[i] = bf16_of(xf[i]); /* x / 1024 is exact in bf16 */
  }
  tp = topos_tape_new(TOPOS_BF16);
  v = cst(tp, raw_tensor(TOPOS_BF16, 2, S(r, n), xb));
  y = eval(tp, topos_logsumexp(tp, v, 1));
  expect_bits16(y, want, r, "bf16 logsumexp");
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_BF16);
  v = cst(tp, raw_tensor(TOPOS_BF16, 2, S(r, n), xb));
  y = eval(tp, topos_log_softmax(tp, v, 1));
  expect_bits16(y, lsb, r * n, "bf16 log_softmax");
  topos_tensor_release(y);
  free(ls);
  free(lsb);
  free(tb);
  free(xb);
  free(xf);
  free(x);
}
END_TEST

/* scatter with an index outside [0, V) is a run-time error too. */
START_TEST(scatter_index_out_of_range) {
  const int bad[3] = {4, -1, 100};
  for (int k = 0; k < 3; k++) {
    topos_tape *tp = topos_tape_new(TOPOS_F64);
    topos_value rows = cvals(tp, TOPOS_F64, 2, S(2, 2), D(1, 2, 3, 4));
    topos_tensor *def = tt_tensor(TOPOS_I32, 1, S(2), D(0, 3));
    topos_value in = topos_input(tp, def);
    topos_tensor_release(def);
    topos_value sc = topos_scatter(tp, rows, in, 4);
    ck_assert(topos_value_ok(sc));
    topos_error err = {0};
    topos_network *net = topos_tape_seal(tp, &err);
    ck_assert_ptr_nonnull(net);
    topos_tensor *ft = tt_tensor(TOPOS_I32, 1, S(2), D(bad[k], 0));
    topos_feed feed = {in, ft};
    topos_run *run = topos_forward(net, NULL, &feed, 1, NULL, &err);
    ck_assert_ptr_null(run);
    ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
    char num[32], node[32];
    snprintf(num, sizeof num, "%d", bad[k]);
    snprintf(node, sizeof node, "node %d", sc.index);
    ck_assert_msg(strstr(err.message, num) && strstr(err.message, node),
                  "want '%s' and '%s' in: %s", num, node, err.message);
    topos_tensor_release(ft);
    topos_network_release(net);
  }
}
END_TEST

/* Rows with a -inf: the maximum subtraction must not make NaN. */
START_TEST(softmax_rows_infinite) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = float_dtypes[k];
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y = eval(
        tp, topos_logsumexp(tp, cvals(tp, d, 1, S(2), D(-INFINITY, 0)), 0));
    tt_assert_values(y, D(0), 1);
    topos_tensor_release(y);
    tp = topos_tape_new(d);
    y = eval(tp,
             topos_log_softmax(tp, cvals(tp, d, 1, S(2), D(-INFINITY, 0)), 0));
    tt_assert_values(y, D(-INFINITY, 0), 2);
    topos_tensor_release(y);
    /* an all -inf row: log(0) = -inf, not NaN */
    tp = topos_tape_new(d);
    y = eval(tp, topos_logsumexp(
                     tp, cvals(tp, d, 1, S(2), D(-INFINITY, -INFINITY)), 0));
    tt_assert_values(y, D(-INFINITY), 1);
    topos_tensor_release(y);
  }
}
END_TEST

/* More operands than a small fixed array holds. */
START_TEST(concat_many_operands) {
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value v[7];
  double want[14];
  for (int i = 0; i < 7; i++) {
    v[i] = cvals(tp, TOPOS_F64, 2, S(1, 2), D(i, 10 + i));
    want[2 * i] = i;
    want[2 * i + 1] = 10 + i;
  }
  topos_tensor *y = eval(tp, topos_concat(tp, 7, v, 0));
  expect_shape(y, TOPOS_F64, 2, S(7, 2));
  tt_assert_values(y, want, 14);
  topos_tensor_release(y);
}
END_TEST

/* Copying and indexing ops fed with strided views: matmul with a
 * transposed and a broadcast operand, gather from a transposed table,
 * concat and pad of a transposed value, sum of a broadcast scalar. */
START_TEST(views_into_copying_ops) {
  const int64_t m = 4, k = 19, n = 3;
  double *a = wide_array(m * k, 1001);
  double *at = malloc(sizeof(double) * m * k);
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = 0; q < k; q++) at[q * m + i] = a[i * k + q];
  double *brow = wide_array(n, 1002);
  double *b = malloc(sizeof(double) * k * n);
  for (int64_t q = 0; q < k; q++)
    for (int64_t j = 0; j < n; j++) b[q * n + j] = brow[j];
  double c[12];
  ref_matmul64(a, b, c, 1, m, k, n);
  topos_tape *tp = topos_tape_new(TOPOS_F64);
  topos_value va =
      topos_transpose(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(k, m), at)));
  topos_value vb = topos_broadcast(
      tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(1, n), brow)), 2, S(k, n));
  topos_tensor *y = eval(tp, topos_matmul(tp, va, vb));
  expect_bits64(y, c, m * n, "matmul of a transposed and a broadcast view");
  topos_tensor_release(y);

  /* gather rows of transpose(at) = a */
  tp = topos_tape_new(TOPOS_F64);
  va = topos_transpose(tp, cst(tp, raw_tensor(TOPOS_F64, 2, S(k, m), at)));
  topos_value idx = cvals(tp, TOPOS_I32, 1, S(3), D(3, 0, 3));
  y = eval(tp, topos_gather(tp, va, idx));
  double g[3 * 19];
  for (int64_t q = 0; q < k; q++) {
    g[q] = a[3 * k + q];
    g[k + q] = a[q];
    g[2 * k + q] = a[3 * k + q];
  }
  expect_bits64(y, g, 3 * k, "gather from a transposed table");
  topos_tensor_release(y);

  /* concat [transpose(x), x] along 1 and pad of a transpose */
  tp = topos_tape_new(TOPOS_F64);
  topos_value x = cvals(tp, TOPOS_F64, 2, S(2, 2), D(1, 2, 3, 4));
  topos_value parts[2] = {topos_transpose(tp, x), x};
  y = eval(tp, topos_concat(tp, 2, parts, 1));
  tt_assert_values(y, D(1, 3, 1, 2, 2, 4, 3, 4), 8);
  topos_tensor_release(y);
  tp = topos_tape_new(TOPOS_F64);
  x = cvals(tp, TOPOS_F64, 2, S(2, 2), D(1, 2, 3, 4));
  y = eval(tp, topos_pad(tp, topos_transpose(tp, x), 0, 1, 1));
  tt_assert_values(y, D(0, 0, 1, 3, 2, 4, 0, 0), 8);
  topos_tensor_release(y);

  /* sum of 1000 copies of 0.1 follows the striped rule too */
  tp = topos_tape_new(TOPOS_F64);
  y = eval(tp, topos_sum(
                   tp, topos_broadcast(tp, topos_scalar(tp, 0.1), 1, S(1000))));
  double tenth[1000];
  for (int i = 0; i < 1000; i++) tenth[i] = 0.1;
  double want = ref_sum64(tenth, 1000, 1);
  expect_bits64(y, &want, 1, "sum of a broadcast");
  ck_assert(want != left_fold64(tenth, 1000));
  topos_tensor_release(y);
  free(a);
  free(at);
  free(b);
  free(brow);
}
END_TEST

/* unfold and fold on a middle axis (outer and inner extents both > 1). */
START_TEST(unfold_fold_middle_axis) {
  for (int kd = 0; kd < 2; kd++) {
    topos_dtype d = float_dtypes[kd];
    double x[2 * 5 * 2];
    for (int i = 0; i < 20; i++) x[i] = i;
    /* x[o][l][c] = o*10 + l*2 + c; unfold axis 1 size 2 step 2 dil 1:
     * windows at l = 0, 2 -> out[o][w][j][c] = x[o][2w + j][c] */
    topos_tape *tp = topos_tape_new(d);
    topos_tensor *y =
        eval(tp, topos_unfold(tp, cvals(tp, d, 3, S(2, 5, 2), x), 1, 2, 2, 1));
    expect_shape(y, d, 4, S(2, 2, 2, 2));
    double want[16];
    for (int o = 0; o < 2; o++)
      for (int w = 0; w < 2; w++)
        for (int j = 0; j < 2; j++)
          for (int c = 0; c < 2; c++)
            want[o * 8 + w * 4 + j * 2 + c] = o * 10 + (2 * w + j) * 2 + c;
    tt_assert_values(y, want, 16);
    topos_tensor_release(y);
    /* fold it back into extent 5: position 4 gets nothing */
    tp = topos_tape_new(d);
    y = eval(tp, topos_fold(tp, cvals(tp, d, 4, S(2, 2, 2, 2), want), 1, 5, 2,
                            2, 1));
    expect_shape(y, d, 3, S(2, 5, 2));
    double back[20];
    for (int i = 0; i < 20; i++) back[i] = (i % 10) >= 8 ? 0 : x[i];
    tt_assert_values(y, back, 20);
    topos_tensor_release(y);
  }
}
END_TEST

Suite *kernels_suite(void) {
  Suite *s = suite_create("kernels");
  TCase *tc = tcase_create("elementwise");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, elementwise_hand_values);
  tcase_add_test(tc, elementwise_scalar_rank0);
  tcase_add_test(tc, maximum_step_edges);
  tcase_add_test(tc, vector_forms_edges);
  tcase_add_test(tc, add_i32);
  tcase_add_test(tc, unary_bits_libm);
  tcase_add_test(tc, binary_bits);
  tcase_add_test(tc, bf16_round_once_ties);
  suite_add_tcase(s, tc);

  tc = tcase_create("matmul");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, matmul_hand);
  tcase_add_test(tc, matmul_bits);
  tcase_add_test(tc, matmul_starts_at_plus_zero);
  tcase_add_test(tc, matmul_empty_k);
  suite_add_tcase(s, tc);

  tc = tcase_create("reductions");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, sum_striped_bits);
  tcase_add_test(tc, sum_zero_signs);
  tcase_add_test(tc, sum_along_striped_bits);
  tcase_add_test(tc, sum_along_hand);
  tcase_add_test(tc, softmax_rows_bits);
  tcase_add_test(tc, softmax_rows_huge_inputs);
  tcase_add_test(tc, max_along_values);
  tcase_add_test(tc, softmax_rows_infinite);
  suite_add_tcase(s, tc);

  tc = tcase_create("indexing");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, gather_values);
  tcase_add_test(tc, gather_index_out_of_range);
  tcase_add_test(tc, scatter_values);
  tcase_add_test(tc, scatter_accumulates_in_order);
  tcase_add_test(tc, scatter_striped_bits);
  tcase_add_test(tc, scatter_index_out_of_range);
  suite_add_tcase(s, tc);

  tc = tcase_create("layout");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, layout_transpose_permute_reshape);
  tcase_add_test(tc, layout_narrow_pad);
  tcase_add_test(tc, layout_unfold);
  tcase_add_test(tc, layout_fold);
  tcase_add_test(tc, binary_on_views);
  tcase_add_test(tc, binary_on_views_rank4);
  tcase_add_test(tc, binary_broadcast_sides);
  tcase_add_test(tc, binary_views_threads);
  tcase_add_test(tc, contiguous_views_threads);
  tcase_add_test(tc, binary_nan_order);
  tcase_add_test(tc, fold_matches_naive);
  tcase_add_test(tc, fold_striped_bits);
  tcase_add_test(tc, layout_concat);
  tcase_add_test(tc, layout_broadcast);
  tcase_add_test(tc, kernels_on_views);
  tcase_add_test(tc, bf16_layout_and_rows);
  tcase_add_test(tc, concat_many_operands);
  tcase_add_test(tc, views_into_copying_ops);
  tcase_add_test(tc, unfold_fold_middle_axis);
  suite_add_tcase(s, tc);
  return s;
}
