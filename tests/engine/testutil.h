/*
 * testutil.h - helpers shared by the engine's Check suites: tensors from
 * literals, seeded random tensors, and the finite-difference gradient
 * check every differentiable op is held to.
 */
#ifndef TOPOS_TESTUTIL_H
#define TOPOS_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "topos.h"

#define TT_UNUSED __attribute__((unused))

/* A tensor from doubles, converted to dtype (bf16 rounded, i32 truncated). */
static TT_UNUSED topos_tensor *tt_tensor(topos_dtype dtype, int rank,
                                         const int64_t *shape,
                                         const double *values) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  size_t es = topos_dtype_size(dtype);
  void *buf = malloc((size_t)(n > 0 ? n : 1) * es);
  for (int64_t i = 0; i < n; i++) {
    switch (dtype) {
      case TOPOS_F32:
        ((float *)buf)[i] = (float)values[i];
        break;
      case TOPOS_F64:
        ((double *)buf)[i] = values[i];
        break;
      case TOPOS_BF16:
        ((uint16_t *)buf)[i] = topos_bf16_from_f32((float)values[i]);
        break;
      case TOPOS_I32:
        ((int32_t *)buf)[i] = (int32_t)values[i];
        break;
    }
  }
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(dtype, rank, shape, buf, &err);
  free(buf);
  ck_assert_msg(t != NULL, "tt_tensor: %s", err.message);
  return t;
}

/* xorshift-based uniform doubles in [lo, hi), independent of the engine's
 * initializers so tests do not trust what they test. */
static TT_UNUSED double tt_uniform(uint64_t *state, double lo, double hi) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
}

static TT_UNUSED topos_tensor *tt_random(topos_dtype dtype, int rank,
                                         const int64_t *shape, uint64_t seed,
                                         double lo, double hi) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) v[i] = tt_uniform(&s, lo, hi);
  topos_tensor *t = tt_tensor(dtype, rank, shape, v);
  free(v);
  return t;
}

/* Reads every element of t widened to double into a new array. */
static TT_UNUSED double *tt_values(const topos_tensor *t) {
  int64_t n = topos_tensor_count(t);
  int rank = topos_tensor_rank(t);
  const int64_t *shape = topos_tensor_shape(t);
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  int64_t idx[TOPOS_MAX_RANK] = {0};
  for (int64_t i = 0; i < n; i++) {
    topos_error err = {0};
    v[i] = topos_tensor_get(t, idx, &err);
    for (int a = rank - 1; a >= 0; a--) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
  return v;
}

/* Asserts that a tensor's elements equal `expect` (exactly, as doubles). */
#define tt_assert_values(t, expect, n)                                      \
  do {                                                                      \
    double *tt_v_ = tt_values(t);                                           \
    ck_assert_int_eq(topos_tensor_count(t), (n));                           \
    for (int64_t tt_i_ = 0; tt_i_ < (n); tt_i_++)                           \
      ck_assert_msg(tt_v_[tt_i_] == (expect)[tt_i_] ||                      \
                        (isnan(tt_v_[tt_i_]) && isnan((expect)[tt_i_])),    \
                    "element %lld: got %.17g want %.17g", (long long)tt_i_, \
                    tt_v_[tt_i_], (expect)[tt_i_]);                         \
    free(tt_v_);                                                            \
  } while (0)

/*
 * Finite-difference check of topos_backward on an f64 network: for every
 * parameter element, the central difference (f(p+h) - f(p-h)) / 2h of the
 * rank-0 value `loss` is compared with the analytic gradient.  Returns the
 * largest error, measured as |fd - an| / max(1, |fd|, |an|).
 */
static TT_UNUSED double tt_gradient_error(const topos_network *net,
                                          topos_value loss,
                                          const topos_feed *feeds, int nfeeds) {
  topos_error err = {0};
  topos_params *p = topos_network_parameters(net);
  ck_assert_ptr_nonnull(p);
  topos_run *run = topos_forward(net, p, feeds, nfeeds, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  topos_field *grad = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(grad != NULL, "backward: %s", err.message);
  topos_params *g = topos_parameters_of(grad, &err);
  ck_assert_ptr_nonnull(g);
  double worst = 0;
  const double h = 1e-6;
  for (int s = 0; s < topos_params_count(p); s++) {
    const topos_tensor *base = topos_params_get(p, s);
    if (topos_tensor_dtype(base) != TOPOS_F64) continue;
    int64_t n = topos_tensor_count(base);
    double *v = tt_values(base);
    double *an = tt_values(topos_params_get(g, s));
    for (int64_t i = 0; i < n; i++) {
      double f[2];
      for (int side = 0; side < 2; side++) {
        double keep = v[i];
        v[i] = keep + (side ? -h : h);
        topos_tensor *t = topos_tensor_from(TOPOS_F64, topos_tensor_rank(base),
                                            topos_tensor_shape(base), v, &err);
        v[i] = keep;
        topos_params *q = topos_params_with(p, s, t, &err);
        topos_tensor_release(t);
        ck_assert_ptr_nonnull(q);
        topos_run *r2 = topos_forward(net, q, feeds, nfeeds, NULL, &err);
        ck_assert_msg(r2 != NULL, "forward: %s", err.message);
        f[side] = topos_run_scalar(r2, loss, &err);
        topos_run_free(r2);
        topos_params_free(q);
      }
      double fd = (f[0] - f[1]) / (2 * h);
      double scale = fmax(1.0, fmax(fabs(fd), fabs(an[i])));
      double e = fabs(fd - an[i]) / scale;
      if (e > worst) worst = e;
    }
    free(v);
    free(an);
  }
  topos_params_free(g);
  topos_field_free(grad);
  topos_run_free(run);
  topos_params_free(p);
  return worst;
}

/* Whether this machine's fma rounds a product below the smallest
 * subnormal once, with its sign (valgrind's emulation rounds the product
 * first and adds +0 after, giving +0): tests that expect a -0 accumulator
 * ask this first. */
static TT_UNUSED bool tt_fma_rounds_once(topos_dtype dt) {
  if (dt != TOPOS_F64) {
    volatile float a = -1e-30f, b = 1e-30f, c = 0.0f;
    return signbit(fmaf(a, b, c));
  }
  volatile double a = -1e-200, b = 1e-200, c = 0.0;
  return signbit(fma(a, b, c));
}

/* The reference context: no backend at all, the reference kernels only
 * (what every faster path is compared with). */
static const topos_exec TEST_REFERENCE = {.backend = "reference"};

/* A parameter (or constant) from a new tensor, which the tape retains. */
static TT_UNUSED topos_value tt_param(topos_tape *tape, topos_tensor *t) {
  topos_value v = topos_parameter(tape, t);
  topos_tensor_release(t);
  ck_assert_msg(topos_value_ok(v), "parameter: %s", topos_tape_error(tape));
  return v;
}

static TT_UNUSED topos_value tt_constant(topos_tape *tape, topos_tensor *t) {
  topos_value v = topos_constant(tape, t);
  topos_tensor_release(t);
  ck_assert_msg(topos_value_ok(v), "constant: %s", topos_tape_error(tape));
  return v;
}

/* A suite's tests grouped into test cases by name: consecutive entries
 * with the same name share one TCase with the given timeout (seconds). */
typedef struct tt_case {
  const char *name;
  const TTest *test;
} tt_case;

static TT_UNUSED void tt_add_cases(Suite *s, const tt_case *cases, size_t n,
                                   double timeout) {
  TCase *tc = NULL;
  const char *current = NULL;
  for (size_t i = 0; i < n; i++) {
    if (current == NULL || strcmp(current, cases[i].name) != 0) {
      tc = tcase_create(cases[i].name);
      tcase_set_timeout(tc, timeout);
      suite_add_tcase(s, tc);
      current = cases[i].name;
    }
    tcase_add_test(tc, cases[i].test);
  }
}

#endif /* TOPOS_TESTUTIL_H */
