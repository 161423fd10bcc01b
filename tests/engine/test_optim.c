/*
 * test_optim.c - optimizer steps against hand-computed arithmetic: SGD
 * (plain, momentum, weight decay), Adam and AdamW (first steps, decay
 * selection), the exactness of the bias corrections, state round trips,
 * purity, argument validation, and f32/f64/bf16 parameters.
 *
 * Expected values are written as the arithmetic the optimizer is
 * specified to do (optim.c's header comment), evaluated here in double
 * and rounded once to the dtype, and compared bit for bit.
 */
#include <float.h>

#include "internal.h"
#include "testutil.h"

/* ----------------------------------------------------------------- helpers */

static topos_params *set1(topos_dtype dt, int64_t len, const double *v) {
  topos_error err = {0};
  topos_tensor *t = tt_tensor(dt, 1, (int64_t[]){len}, v);
  topos_params *p = topos_params_new(1, &t, &err);
  ck_assert_msg(p != NULL, "%s", err.message);
  topos_tensor_release(t);
  return p;
}

static topos_params *set_of(int n, topos_tensor **t) {
  topos_error err = {0};
  topos_params *p = topos_params_new(n, t, &err);
  ck_assert_msg(p != NULL, "%s", err.message);
  for (int i = 0; i < n; i++) topos_tensor_release(t[i]);
  return p;
}

/* A double rounded once to bf16, by a route independent of the engine's:
 * scale to an integer grid of 8 significant bits, round to nearest even
 * with nearbyint, scale back (exact), then the exact conversion. */
static double ref_bf16(double x) {
  if (x == 0 || isnan(x) || isinf(x)) return x;
  int e = ilogb(x);
  if (e < -126) e = -126; /* the subnormal grid */
  double y = ldexp(nearbyint(ldexp(x, 7 - e)), e - 7);
  return topos_bf16_to_f32(topos_bf16_from_f32((float)y));
}

static double ref_round(topos_dtype dt, double x) {
  switch (dt) {
    case TOPOS_F32:
      return (double)(float)x;
    case TOPOS_BF16:
      return ref_bf16(x);
    default:
      return x;
  }
}

/* Exact beta^t, correctly rounded: beta = M * 2^E with M a 53-bit
 * integer, so beta^t = M^t * 2^(E t) and M^t is a big integer, computed
 * exactly and rounded to 53 bits by hand (nearest, ties to even). */
typedef struct bigpow {
  uint32_t *limb;
  int n, cap;
  uint64_t mant;
  int exp; /* beta = mant * 2^exp */
  int t;
} bigpow;

static void bigpow_init(bigpow *b, double beta) {
  int e;
  double f = frexp(beta, &e);
  b->mant = (uint64_t)ldexp(f, 53);
  b->exp = e - 53;
  b->cap = 4096;
  b->limb = calloc((size_t)b->cap, sizeof *b->limb);
  b->limb[0] = 1;
  b->n = 1;
  b->t = 0;
}

/* Advances to beta^(t+1) and returns it correctly rounded. */
static double bigpow_next(bigpow *b) {
  unsigned __int128 carry = 0;
  for (int i = 0; i < b->n; i++) {
    carry += (unsigned __int128)b->limb[i] * b->mant;
    b->limb[i] = (uint32_t)carry;
    carry >>= 32;
  }
  while (carry) {
    ck_assert_int_lt(b->n, b->cap);
    b->limb[b->n++] = (uint32_t)carry;
    carry >>= 32;
  }
  b->t++;
  int top = 31;
  while (!(b->limb[b->n - 1] >> top & 1)) top--;
  int64_t bits = (int64_t)(b->n - 1) * 32 + top + 1;
#define BIT(k) ((b->limb[(k) / 32] >> ((k) % 32)) & 1u)
  int64_t shift = bits > 53 ? bits - 53 : 0;
  uint64_t m = 0;
  for (int64_t k = bits - 1; k >= shift; k--) m = m << 1 | BIT(k);
  if (shift > 0 && BIT(shift - 1)) {
    bool sticky = false;
    for (int64_t k = 0; k < shift - 1 && !sticky; k++) {
      if (k % 32 == 0 && k + 32 <= shift - 1) {
        sticky = b->limb[k / 32] != 0;
        k += 31;
      } else {
        sticky = BIT(k);
      }
    }
    if (sticky || (m & 1)) m++;
  }
#undef BIT
  return ldexp((double)m, (int)shift + b->exp * b->t);
}

static void bigpow_free(bigpow *b) {
  free(b->limb);
}

/* The correctly rounded beta^t. */
static double ref_pow(double beta, int t) {
  bigpow b;
  bigpow_init(&b, beta);
  double r = 1;
  for (int i = 0; i < t; i++) r = bigpow_next(&b);
  bigpow_free(&b);
  return r;
}

/* One Adam element, written out as the specification says. */
static double adam_p(double p, double m1, double v1, double lr, double bc1,
                     double bc2, double eps) {
  return p - lr * (m1 / bc1) / (sqrt(v1 / bc2) + eps);
}

/* Steps and asserts success. */
static void step_ok(const topos_optimizer *opt, const topos_params *p,
                    const topos_params *g, const topos_opt_state *s,
                    topos_params **po, topos_opt_state **so) {
  topos_error err = {0};
  int rc = topos_optimizer_step(opt, p, g, s, po, so, &err);
  ck_assert_msg(rc == TOPOS_OK, "step: %s", err.message);
  ck_assert_ptr_nonnull(*po);
  ck_assert_ptr_nonnull(*so);
}

static topos_opt_state *state_ok(const topos_optimizer *opt,
                                 const topos_params *p) {
  topos_error err = {0};
  topos_opt_state *s = topos_opt_state_new(opt, p, &err);
  ck_assert_msg(s != NULL, "state_new: %s", err.message);
  return s;
}

/* -------------------------------------------------------------------- SGD */

START_TEST(test_constructors) {
  topos_optimizer o = topos_sgd(0.1, 0.9);
  ck_assert_int_eq(o.kind, TOPOS_SGD);
  ck_assert(o.lr == 0.1 && o.momentum == 0.9 && o.weight_decay == 0);
  ck_assert_ptr_null(o.decay);
  o = topos_adam(1e-3, 0.9, 0.999, 1e-8);
  ck_assert_int_eq(o.kind, TOPOS_ADAM);
  ck_assert(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 &&
            o.eps == 1e-8 && o.weight_decay == 0);
  o = topos_adamw(1e-3, 0.8, 0.99, 1e-6, 0.01);
  ck_assert_int_eq(o.kind, TOPOS_ADAMW);
  ck_assert(o.lr == 1e-3 && o.beta1 == 0.8 && o.beta2 == 0.99 &&
            o.eps == 1e-6 && o.weight_decay == 0.01);
  ck_assert_ptr_null(o.decay);
  ck_assert_int_eq(topos_opt_state_step(NULL), -1);
  ck_assert_ptr_null(topos_opt_state_moment(NULL, 0));
}
END_TEST

/* Plain f32 SGD over lengths around the vector width (the AVX-512 loop
 * and its tail) and special values: each element is the scalar
 * formula's, (float)((double)p - lr*g'), g' = g + wd*p with L2. */
START_TEST(test_sgd_f32_elements) {
  static const double special[8] = {NAN, INFINITY, -INFINITY, -0.0,
                                    0.0, 1e-42,    3e38,      -7.25};
  for (int l2 = 0; l2 < 2; l2++) {
    topos_optimizer opt = topos_sgd(0.37, 0);
    opt.weight_decay = l2 ? 0.05 : 0;
    for (int64_t n = 1; n <= 41; n += 4) {
      double pv[41], gv[41];
      uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 7 * l2);
      for (int64_t i = 0; i < n; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        pv[i] = r % 5 == 0 ? special[r % 8] : (double)(r % 2001) / 97 - 10;
        gv[i] = r % 7 == 0 ? special[(r >> 9) % 8] : (double)(r % 1999) / 13;
      }
      topos_params *p = set1(TOPOS_F32, n, pv);
      topos_params *g = set1(TOPOS_F32, n, gv);
      topos_opt_state *s = state_ok(&opt, p);
      topos_params *p1;
      topos_opt_state *s1;
      step_ok(&opt, p, g, s, &p1, &s1);
      /* The f32 values, widened exactly. */
      double *pf = tt_values(topos_params_get(p, 0));
      double *gf = tt_values(topos_params_get(g, 0));
      double *got = tt_values(topos_params_get(p1, 0));
      for (int64_t i = 0; i < n; i++) {
        double gd = gf[i];
        if (l2) gd = gd + opt.weight_decay * pf[i];
        float want = (float)(pf[i] - opt.lr * gd), have = (float)got[i];
        ck_assert_msg(memcmp(&want, &have, sizeof want) == 0,
                      "l2 %d n %lld element %lld: got %a want %a", l2,
                      (long long)n, (long long)i, got[i], (double)want);
      }
      free(pf);
      free(gf);
      free(got);
      topos_params_free(p);
      topos_params_free(g);
      topos_params_free(p1);
      topos_opt_state_free(s);
      topos_opt_state_free(s1);
    }
  }
}
END_TEST

START_TEST(test_sgd_plain) {
  topos_optimizer opt = topos_sgd(0.1, 0);
  topos_params *p = set1(TOPOS_F64, 2, (double[]){1, -3});
  topos_params *g = set1(TOPOS_F64, 2, (double[]){0.5, 2});
  topos_opt_state *s = state_ok(&opt, p);
  ck_assert_int_eq(topos_opt_state_step(s), 0);
  ck_assert_ptr_null(topos_opt_state_moment(s, 0));
  ck_assert_ptr_null(topos_opt_state_moment(s, 1));
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  /* 1 - 0.1*0.5 = 0.95 (as doubles), -3 - 0.1*2 = -3.2. */
  tt_assert_values(topos_params_get(p1, 0),
                   ((double[]){1 - 0.1 * 0.5, -3 - 0.1 * 2}), 2);
  ck_assert(fabs(1 - 0.1 * 0.5 - 0.95) < 1e-15);
  ck_assert_int_eq(topos_opt_state_step(s1), 1);
  ck_assert_ptr_null(topos_opt_state_moment(s1, 0));
  ck_assert_ptr_null(topos_opt_state_moment(s1, 1));

  /* f32: computed in double from the widened values, rounded once. */
  topos_params *pf = set1(TOPOS_F32, 2, (double[]){1, 0.3});
  topos_params *gf = set1(TOPOS_F32, 2, (double[]){0.5, 0.7});
  topos_params *pf1;
  topos_opt_state *sf1;
  step_ok(&opt, pf, gf, s, &pf1, &sf1);
  double want[2] = {(double)(float)(1 - 0.1 * 0.5),
                    (double)(float)((double)0.3f - 0.1 * (double)0.7f)};
  tt_assert_values(topos_params_get(pf1, 0), want, 2);
  ck_assert_int_eq(topos_tensor_dtype(topos_params_get(pf1, 0)), TOPOS_F32);

  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(p1);
  topos_params_free(pf);
  topos_params_free(gf);
  topos_params_free(pf1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
  topos_opt_state_free(sf1);
}
END_TEST

START_TEST(test_sgd_momentum_three_steps) {
  const double lr = 0.1, mu = 0.9;
  topos_optimizer opt = topos_sgd(lr, mu);
  topos_params *p = set1(TOPOS_F64, 1, (double[]){1});
  topos_opt_state *s = state_ok(&opt, p);
  ck_assert_ptr_nonnull(topos_opt_state_moment(s, 0));
  ck_assert_ptr_null(topos_opt_state_moment(s, 1));
  tt_assert_values(topos_params_get(topos_opt_state_moment(s, 0), 0),
                   ((double[]){0}), 1);
  const double grads[3] = {0.5, 0.25, -1};
  double pe = 1, ve = 0;
  for (int k = 0; k < 3; k++) {
    topos_params *g = set1(TOPOS_F64, 1, &grads[k]);
    topos_params *p1;
    topos_opt_state *s1;
    step_ok(&opt, p, g, s, &p1, &s1);
    ve = mu * ve + grads[k];
    pe = pe - lr * ve;
    tt_assert_values(topos_params_get(p1, 0), ((double[]){pe}), 1);
    tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 0), 0),
                     ((double[]){ve}), 1);
    ck_assert_int_eq(topos_opt_state_step(s1), k + 1);
    topos_params_free(g);
    topos_params_free(p);
    topos_opt_state_free(s);
    p = p1;
    s = s1;
  }
  /* Written out: v = 0.5, 0.7, -0.37; p = 0.95, 0.88, 0.917. */
  ck_assert(fabs(pe - 0.917) < 1e-12);
  ck_assert(fabs(ve + 0.37) < 1e-12);
  topos_params_free(p);
  topos_opt_state_free(s);
}
END_TEST

START_TEST(test_sgd_weight_decay) {
  topos_optimizer opt = topos_sgd(0.1, 0.5);
  opt.weight_decay = 0.01;
  topos_params *p = set1(TOPOS_F64, 1, (double[]){2});
  topos_params *g = set1(TOPOS_F64, 1, (double[]){0.5});
  topos_opt_state *s = state_ok(&opt, p);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  double gd = 0.5 + 0.01 * 2; /* 0.52 */
  tt_assert_values(topos_params_get(p1, 0), ((double[]){2 - 0.1 * gd}), 1);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 0), 0),
                   ((double[]){gd}), 1);
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(p1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
}
END_TEST

/* ------------------------------------------------------------------- Adam */

START_TEST(test_adam_two_steps_f64) {
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  topos_optimizer opt = topos_adam(lr, b1, b2, eps);
  topos_params *p = set1(TOPOS_F64, 2, (double[]){1, -0.5});
  topos_params *g = set1(TOPOS_F64, 2, (double[]){0.1, -2});
  topos_opt_state *s = state_ok(&opt, p);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s, 1), 0),
                   ((double[]){0, 0}), 2);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  /* Step 1: bc1 = 1 - 0.9, bc2 = 1 - 0.999. */
  double bc1 = 1 - b1, bc2 = 1 - b2;
  double m1[2] = {(1 - b1) * 0.1, (1 - b1) * -2};
  double v1[2] = {(1 - b2) * 0.1 * 0.1, (1 - b2) * -2 * -2};
  double p1e[2] = {adam_p(1, m1[0], v1[0], lr, bc1, bc2, eps),
                   adam_p(-0.5, m1[1], v1[1], lr, bc1, bc2, eps)};
  tt_assert_values(topos_params_get(p1, 0), p1e, 2);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 0), 0), m1, 2);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 1), 0), v1, 2);
  /* The classic first step moves each parameter by about lr against the
   * sign of its gradient. */
  ck_assert(fabs(p1e[0] - (1 - lr)) < 1e-9);
  ck_assert(fabs(p1e[1] - (-0.5 + lr)) < 1e-9);

  /* Step 2 with g = (0.2, 1): bc = 1 - b^2. */
  topos_params *g2 = set1(TOPOS_F64, 2, (double[]){0.2, 1});
  topos_params *p2;
  topos_opt_state *s2;
  step_ok(&opt, p1, g2, s1, &p2, &s2);
  double gg[2] = {0.2, 1};
  double p2e[2], m2[2], v2[2];
  for (int i = 0; i < 2; i++) {
    m2[i] = b1 * m1[i] + (1 - b1) * gg[i];
    v2[i] = b2 * v1[i] + (1 - b2) * gg[i] * gg[i];
    p2e[i] = adam_p(p1e[i], m2[i], v2[i], lr, 1 - b1 * b1, 1 - b2 * b2, eps);
  }
  tt_assert_values(topos_params_get(p2, 0), p2e, 2);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s2, 0), 0), m2, 2);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s2, 1), 0), v2, 2);
  ck_assert_int_eq(topos_opt_state_step(s2), 2);

  topos_params *list[] = {p, g, p1, g2, p2};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++)
    topos_params_free(list[i]);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
  topos_opt_state_free(s2);
}
END_TEST

START_TEST(test_adam_l2_weight_decay) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  topos_optimizer opt = topos_adam(lr, b1, b2, eps);
  opt.weight_decay = wd;
  topos_params *p = set1(TOPOS_F64, 1, (double[]){3});
  topos_params *g = set1(TOPOS_F64, 1, (double[]){0});
  topos_opt_state *s = state_ok(&opt, p);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  double gd = 0 + wd * 3;
  double m1 = (1 - b1) * gd, v1 = (1 - b2) * gd * gd;
  tt_assert_values(topos_params_get(p1, 0),
                   ((double[]){adam_p(3, m1, v1, lr, 1 - b1, 1 - b2, eps)}), 1);
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(p1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
}
END_TEST

START_TEST(test_adam_f32_and_bf16) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-6;
  topos_optimizer opt = topos_adam(lr, b1, b2, eps);
  const double pv[3] = {0.3, -1.7, 2.5}, gv[3] = {0.11, -0.03, 7};
  topos_dtype dts[2] = {TOPOS_F32, TOPOS_BF16};
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = dts[d];
    topos_params *p = set1(dt, 3, pv);
    topos_params *g = set1(dt, 3, gv);
    topos_opt_state *s = state_ok(&opt, p);
    /* Moments are f32 for both f32 and bf16 parameters. */
    const topos_tensor *m0 = topos_params_get(topos_opt_state_moment(s, 0), 0);
    ck_assert_int_eq(topos_tensor_dtype(m0), TOPOS_F32);
    double *pw = tt_values(topos_params_get(p, 0));
    double *gw = tt_values(topos_params_get(g, 0));
    double pe[3], me[3], ve[3], p2e[3];
    for (int i = 0; i < 3; i++) {
      double m1 = (1 - b1) * gw[i], v1 = (1 - b2) * gw[i] * gw[i];
      pe[i] = ref_round(dt, adam_p(pw[i], m1, v1, lr, 1 - b1, 1 - b2, eps));
      me[i] = (double)(float)m1;
      ve[i] = (double)(float)v1;
      /* Step 2 (same gradient) starts from the rounded values. */
      double m2 = b1 * me[i] + (1 - b1) * gw[i];
      double v2 = b2 * ve[i] + (1 - b2) * gw[i] * gw[i];
      p2e[i] = ref_round(
          dt, adam_p(pe[i], m2, v2, lr, 1 - b1 * b1, 1 - b2 * b2, eps));
    }
    topos_params *p1, *p2;
    topos_opt_state *s1, *s2;
    step_ok(&opt, p, g, s, &p1, &s1);
    ck_assert_int_eq(topos_tensor_dtype(topos_params_get(p1, 0)), dt);
    tt_assert_values(topos_params_get(p1, 0), pe, 3);
    tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 0), 0), me, 3);
    tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 1), 0), ve, 3);
    step_ok(&opt, p1, g, s1, &p2, &s2);
    tt_assert_values(topos_params_get(p2, 0), p2e, 3);
    free(pw);
    free(gw);
    topos_params *list[] = {p, g, p1, p2};
    for (size_t i = 0; i < 4; i++) topos_params_free(list[i]);
    topos_opt_state_free(s);
    topos_opt_state_free(s1);
    topos_opt_state_free(s2);
  }
}
END_TEST

START_TEST(test_sgd_bf16_rounds_once) {
  /* bf16 parameters with momentum: the velocity is kept in f32, the
   * parameter rounded once from the double update. */
  topos_optimizer opt = topos_sgd(0.1, 0.9);
  const double pv[2] = {1, 0.75}, gv[2] = {0.5, -0.3};
  topos_params *p = set1(TOPOS_BF16, 2, pv);
  topos_params *g = set1(TOPOS_BF16, 2, gv);
  topos_opt_state *s = state_ok(&opt, p);
  ck_assert_int_eq(
      topos_tensor_dtype(topos_params_get(topos_opt_state_moment(s, 0), 0)),
      TOPOS_F32);
  double *gw = tt_values(topos_params_get(g, 0));
  double pe[2], ve[2];
  for (int i = 0; i < 2; i++) {
    double vel = 0.9 * 0 + gw[i];
    pe[i] = ref_bf16(pv[i] - 0.1 * vel);
    ve[i] = (double)(float)vel;
  }
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  tt_assert_values(topos_params_get(p1, 0), pe, 2);
  tt_assert_values(topos_params_get(topos_opt_state_moment(s1, 0), 0), ve, 2);
  free(gw);
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(p1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);

  /* Once, straight from double: p = 1, g = -1, lr = 2^-8 + 2^-30 gives
   * p' = 1 + 2^-8 + 2^-30, just above the bf16 tie at 1 + 2^-8, so it
   * rounds up to 1 + 2^-7.  Rounding to f32 first would land on the tie
   * (2^-30 is below half an f32 ulp) and round to even, 1. */
  topos_optimizer plain = topos_sgd(0x1p-8 + 0x1p-30, 0);
  p = set1(TOPOS_BF16, 1, (double[]){1});
  topos_params *gb = set1(TOPOS_BF16, 1, (double[]){-1});
  s = state_ok(&plain, p);
  step_ok(&plain, p, gb, s, &p1, &s1);
  tt_assert_values(topos_params_get(p1, 0), ((double[]){1 + 0x1p-7}), 1);
  topos_params_free(p1);
  topos_opt_state_free(s1);
  /* Exactly on the tie (lr = 2^-8): round to even, 1. */
  plain.lr = 0x1p-8;
  step_ok(&plain, p, gb, s, &p1, &s1);
  tt_assert_values(topos_params_get(p1, 0), ((double[]){1}), 1);
  topos_params_free(p1);
  topos_opt_state_free(s1);
  topos_params_free(gb);
  topos_params_free(p);
  topos_opt_state_free(s);
}
END_TEST

/* ------------------------------------------------------------------ AdamW */

typedef struct decay_probe {
  int calls;
  int slots[4];
  const topos_tensor *params[4];
  int choose; /* the slot to decay */
} decay_probe;

static bool decay_only(int slot, const topos_tensor *param, void *ctx) {
  decay_probe *d = ctx;
  if (d->calls < 4) {
    d->slots[d->calls] = slot;
    d->params[d->calls] = param;
  }
  d->calls++;
  return slot == d->choose;
}

START_TEST(test_adamw_decay_selection) {
  const double lr = 0.1, wd = 0.2;
  topos_optimizer opt = topos_adamw(lr, 0.9, 0.999, 1e-8, wd);
  /* W [2,2] and b [2]; zero gradients isolate the decoupled decay (the
   * Adam term is 0 / (0 + eps) = 0). */
  topos_tensor *t[2] = {
      tt_tensor(TOPOS_F64, 2, (int64_t[]){2, 2}, (double[]){1, -2, 3, 0.5}),
      tt_tensor(TOPOS_F64, 1, (int64_t[]){2}, (double[]){4, -1})};
  topos_params *p = set_of(2, t);
  topos_tensor *z[2] = {
      tt_tensor(TOPOS_F64, 2, (int64_t[]){2, 2}, (double[]){0, 0, 0, 0}),
      tt_tensor(TOPOS_F64, 1, (int64_t[]){2}, (double[]){0, 0})};
  topos_params *g = set_of(2, z);
  topos_opt_state *s = state_ok(&opt, p);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  const double W[4] = {1, -2, 3, 0.5};
  double We[4];
  for (int i = 0; i < 4; i++) We[i] = W[i] - lr * wd * W[i];
  tt_assert_values(topos_params_get(p1, 0), We, 4); /* rank 2: decayed */
  tt_assert_values(topos_params_get(p1, 1), ((double[]){4, -1}), 2);
  topos_params_free(p1);
  topos_opt_state_free(s1);

  /* A caller predicate overrides the rank rule. */
  decay_probe d = {.choose = 1};
  opt.decay = decay_only;
  opt.decay_ctx = &d;
  step_ok(&opt, p, g, s, &p1, &s1);
  ck_assert_int_eq(d.calls, 2);
  ck_assert_int_eq(d.slots[0], 0);
  ck_assert_int_eq(d.slots[1], 1);
  ck_assert_ptr_eq(d.params[0], topos_params_get(p, 0));
  ck_assert_ptr_eq(d.params[1], topos_params_get(p, 1));
  tt_assert_values(topos_params_get(p1, 0), W, 4);
  tt_assert_values(topos_params_get(p1, 1),
                   ((double[]){4 - lr * wd * 4, -1 - lr * wd * -1}), 2);
  topos_params_free(p1);
  topos_opt_state_free(s1);

  /* Decoupled, not L2: a gradient-carrying AdamW step decays p and then
   * takes the Adam step computed from g alone. */
  opt.decay = NULL;
  topos_tensor *gt[2] = {
      tt_tensor(TOPOS_F64, 2, (int64_t[]){2, 2},
                (double[]){0.5, 0.5, 0.5, 0.5}),
      tt_tensor(TOPOS_F64, 1, (int64_t[]){2}, (double[]){-1, 2})};
  topos_params *g2 = set_of(2, gt);
  step_ok(&opt, p, g2, s, &p1, &s1);
  double m1 = (1 - 0.9) * 0.5, v1 = (1 - 0.999) * 0.5 * 0.5;
  for (int i = 0; i < 4; i++)
    We[i] = adam_p(W[i] - lr * wd * W[i], m1, v1, lr, 1 - 0.9, 1 - 0.999, 1e-8);
  tt_assert_values(topos_params_get(p1, 0), We, 4);
  double be[2] = {adam_p(4, (1 - 0.9) * -1, (1 - 0.999) * -1 * -1, lr, 1 - 0.9,
                         1 - 0.999, 1e-8),
                  adam_p(-1, (1 - 0.9) * 2, (1 - 0.999) * 2 * 2, lr, 1 - 0.9,
                         1 - 0.999, 1e-8)};
  tt_assert_values(topos_params_get(p1, 1), be, 2);
  topos_params_free(p1);
  topos_opt_state_free(s1);

  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(g2);
  topos_opt_state_free(s);
}
END_TEST

/* f32 Adam over a long tensor (AVX-512 steps 8 elements at once where the
 * CPU has it, the scalar loop the rest): every element's parameter and
 * moments, bits compared with the specified arithmetic, special values
 * among them; a bad moment inside the wide part and one in the tail are
 * named by element. */
static float wide_value(uint64_t *s, double scale) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(((double)(*s >> 11) / 9007199254740992.0 - 0.5) * scale);
}

static topos_tensor *f32_tensor(int rank, const int64_t *shape,
                                const float *v) {
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_F32, rank, shape, v, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  return t;
}

static void assert_f32_bits(const topos_tensor *t, const float *want, int64_t n,
                            const char *what) {
  size_t bytes = 0;
  const uint32_t *got = topos_tensor_memory(t, &bytes);
  ck_assert_uint_eq(bytes, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++) {
    uint32_t w;
    memcpy(&w, &want[i], 4);
    ck_assert_msg(got[i] == w, "%s element %lld: got %08x want %08x", what,
                  (long long)i, got[i], w);
  }
}

START_TEST(test_adam_f32_wide) {
  enum { R = 37, C = 28, N = R * C }; /* 1036: 129 groups of 8, 4 left */
  float p[N], g[N], m[N], v[N];
  uint64_t seed = 7;
  for (int i = 0; i < N; i++) {
    p[i] = wide_value(&seed, 4);
    g[i] = wide_value(&seed, 0.2);
    m[i] = wide_value(&seed, 0.05);
    v[i] = fabsf(wide_value(&seed, 0.002));
  }
  const float spec_p[] = {0.0f, -0.0f, FLT_MAX, 1e-40f, -3e38f};
  const float spec_g[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, 1e-40f};
  const float spec_m[] = {FLT_MAX, -FLT_MAX, -0.0f, 0.0f, 1e-40f};
  const float spec_v[] = {-0.0f, INFINITY, 0.0f, FLT_MAX, 1e-40f};
  for (int i = 0; i < 5; i++) p[100 + i] = spec_p[i], p[N - 1 - i] = spec_p[i];
  for (int i = 0; i < 7; i++) g[200 + i] = spec_g[i], g[N - 1 - i] = spec_g[i];
  for (int i = 0; i < 5; i++)
    m[300 + i] = spec_m[i], m[N - 3 + i % 3] = spec_m[i];
  for (int i = 0; i < 5; i++) v[400 + i] = spec_v[i], v[N - 5 + i] = spec_v[i];
  const double lr = 0.003, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.01;
  const int64_t step = 4; /* the step taken is the fifth */
  const double bc1 = 1 - ref_pow(b1, 5), bc2 = 1 - ref_pow(b2, 5);
  const int64_t shape[2] = {R, C}, flat[1] = {N};
  for (int kind = 0; kind < 4; kind++) {
    /* Adam, Adam with L2 decay, AdamW decaying [R, C], AdamW on [N] (rank
     * 1: not decayed). */
    topos_optimizer opt = kind < 2 ? topos_adam(lr, b1, b2, eps)
                                   : topos_adamw(lr, b1, b2, eps, wd);
    if (kind == 1) opt.weight_decay = wd;
    bool l2 = kind == 1, decoupled = kind == 2;
    int rank = kind == 3 ? 1 : 2;
    const int64_t *sh = kind == 3 ? flat : shape;
    float pe[N], me[N], ve[N];
    for (int i = 0; i < N; i++) {
      double pv = p[i], gv = g[i];
      if (l2) gv = gv + wd * pv;
      if (decoupled) pv = pv - lr * wd * pv;
      double m1 = b1 * m[i] + (1 - b1) * gv;
      double v1 = b2 * v[i] + (1 - b2) * gv * gv;
      me[i] = (float)m1;
      ve[i] = (float)v1;
      pe[i] = (float)(pv - lr * (m1 / bc1) / (sqrt(v1 / bc2) + eps));
    }
    topos_tensor *tp = f32_tensor(rank, sh, p), *tg = f32_tensor(rank, sh, g);
    topos_tensor *tm = f32_tensor(rank, sh, m), *tv = f32_tensor(rank, sh, v);
    topos_params *pp = set_of(1, &tp), *gp = set_of(1, &tg);
    topos_params *mp = set_of(1, &tm), *vp = set_of(1, &tv);
    topos_opt_state *s = topos_opt_state_from(step, mp, vp, NULL);
    ck_assert_ptr_nonnull(s);
    topos_params *p1;
    topos_opt_state *s1;
    step_ok(&opt, pp, gp, s, &p1, &s1);
    assert_f32_bits(topos_params_get(p1, 0), pe, N, "p");
    assert_f32_bits(topos_params_get(topos_opt_state_moment(s1, 0), 0), me, N,
                    "m");
    assert_f32_bits(topos_params_get(topos_opt_state_moment(s1, 1), 0), ve, N,
                    "v");
    topos_params_free(p1);
    topos_opt_state_free(s1);
    topos_opt_state_free(s);
    topos_params_free(pp);
    topos_params_free(gp);
    topos_params_free(mp);
    topos_params_free(vp);
  }
  /* A NaN first moment in the wide part, a negative second moment in the
   * tail: refused by element. */
  const struct {
    int at;
    bool second;
    float x;
    const char *expect;
  } bad[] = {{517, false, NAN, "first moment (m) slot 0 element 517 is nan"},
             {1034, true, -1.0f, "second moment (v) slot 0 element 1034 is -1"},
             {8, false, INFINITY, "first moment (m) slot 0 element 8 is inf"}};
  topos_optimizer adam = topos_adam(lr, b1, b2, eps);
  for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
    float mb[N], vb[N];
    memcpy(mb, m, sizeof mb);
    memcpy(vb, v, sizeof vb);
    (bad[b].second ? vb : mb)[bad[b].at] = bad[b].x;
    topos_tensor *tp = f32_tensor(1, flat, p), *tg = f32_tensor(1, flat, g);
    topos_tensor *tm = f32_tensor(1, flat, mb), *tv = f32_tensor(1, flat, vb);
    topos_params *pp = set_of(1, &tp), *gp = set_of(1, &tg);
    topos_params *mp = set_of(1, &tm), *vp = set_of(1, &tv);
    topos_opt_state *s = topos_opt_state_from(step, mp, vp, NULL);
    topos_error err = {0};
    topos_params *po = NULL;
    topos_opt_state *so = NULL;
    ck_assert_int_eq(topos_optimizer_step(&adam, pp, gp, s, &po, &so, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(err.message, bad[b].expect) != NULL, "%s",
                  err.message);
    ck_assert_ptr_null(po);
    topos_opt_state_free(s);
    topos_params_free(pp);
    topos_params_free(gp);
    topos_params_free(mp);
    topos_params_free(vp);
  }
}
END_TEST

/* -------------------------------------------------------- bias correction */

START_TEST(test_reference_pow_sanity) {
  /* The test's own reference must be right for the exactness test to
   * mean anything: powers of two and small exact powers, and agreement
   * with long double within one ulp. */
  ck_assert(ref_pow(0.5, 1) == 0.5);
  ck_assert(ref_pow(0.5, 100) == 0x1p-100);
  ck_assert(ref_pow(0.75, 3) == 27.0 / 64);
  ck_assert(ref_pow(0.9, 2) == 0.9 * 0.9); /* one product rounds once */
  bigpow b;
  bigpow_init(&b, 0.999);
  for (int t = 1; t <= 300; t++) {
    double r = bigpow_next(&b);
    long double l = powl((long double)0.999, t);
    ck_assert_msg(
        fabsl((long double)r - l) <= (long double)(nextafter(r, 2) - r), "t=%d",
        t);
  }
  bigpow_free(&b);
}
END_TEST

START_TEST(test_bias_correction_exact) {
  /* State at step t-1 with zero moments, g = 1, p = 0: the update reads
   * only the bias corrections of step t, which must be 1 - beta^t with
   * beta^t correctly rounded.  Checked for t = 1..1000. */
  const double lr = 1e-3, eps = 1e-8;
  const double betas[2][2] = {{0.9, 0.999}, {0.95, 0.9999}};
  topos_params *p = set1(TOPOS_F64, 1, (double[]){0});
  topos_params *g = set1(TOPOS_F64, 1, (double[]){1});
  topos_params *zero = set1(TOPOS_F64, 1, (double[]){0});
  for (int k = 0; k < 2; k++) {
    double b1 = betas[k][0], b2 = betas[k][1];
    topos_optimizer opt = topos_adam(lr, b1, b2, eps);
    bigpow r1, r2;
    bigpow_init(&r1, b1);
    bigpow_init(&r2, b2);
    double running = 1;
    int running_differs = 0;
    for (int t = 1; t <= 1000; t++) {
      double e1 = bigpow_next(&r1), e2 = bigpow_next(&r2);
      running *= b1;
      if (running != e1) running_differs++;
      topos_error err = {0};
      topos_opt_state *s = topos_opt_state_from(t - 1, zero, zero, &err);
      ck_assert_msg(s != NULL, "%s", err.message);
      topos_params *p1;
      topos_opt_state *s1;
      step_ok(&opt, p, g, s, &p1, &s1);
      double want =
          adam_p(0, (1 - b1) * 1, (1 - b2) * 1 * 1, lr, 1 - e1, 1 - e2, eps);
      double *got = tt_values(topos_params_get(p1, 0));
      ck_assert_msg(got[0] == want, "beta (%g, %g) t=%d: got %.17g want %.17g",
                    b1, b2, t, got[0], want);
      free(got);
      topos_params_free(p1);
      topos_opt_state_free(s);
      topos_opt_state_free(s1);
    }
    /* A running product would have drifted from the exact powers: this
     * test can tell the two apart. */
    ck_assert_int_gt(running_differs, 0);
    bigpow_free(&r1);
    bigpow_free(&r2);
  }
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(zero);
}
END_TEST

/* A copy of a set through bytes, as if it had crossed the wire. */
static topos_params *wire_copy(const topos_params *p) {
  int n = topos_params_count(p);
  topos_tensor **t = calloc((size_t)n + 1, sizeof *t);
  for (int i = 0; i < n; i++) {
    const topos_tensor *x = topos_params_get(p, i);
    int64_t c = topos_tensor_count(x);
    size_t bytes = (size_t)c * topos_dtype_size(topos_tensor_dtype(x));
    void *buf = malloc(bytes + 1);
    topos_error err = {0};
    ck_assert_int_eq(topos_tensor_read(x, buf, bytes, &err), TOPOS_OK);
    t[i] = topos_tensor_from(topos_tensor_dtype(x), topos_tensor_rank(x),
                             topos_tensor_shape(x), buf, &err);
    ck_assert_ptr_nonnull(t[i]);
    free(buf);
  }
  topos_params *q = set_of(n, t);
  free(t);
  return q;
}

START_TEST(test_state_round_trip_50_steps) {
  topos_optimizer opts[3] = {topos_adamw(3e-3, 0.9, 0.999, 1e-8, 0.05),
                             topos_adam(1e-2, 0.8, 0.99, 1e-6),
                             topos_sgd(0.05, 0.9)};
  topos_dtype dts[3] = {TOPOS_F32, TOPOS_BF16, TOPOS_F64};
  for (int o = 0; o < 3; o++) {
    topos_tensor *t[3] = {
        tt_random(dts[0], 2, (int64_t[]){3, 4}, 1 + o, -1, 1),
        tt_random(dts[1], 1, (int64_t[]){5}, 2 + o, -1, 1),
        tt_random(dts[2], 2, (int64_t[]){2, 2}, 3 + o, -1, 1)};
    topos_params *pa = set_of(3, t);
    topos_params *pb = wire_copy(pa);
    topos_opt_state *sa = state_ok(&opts[o], pa);
    topos_opt_state *sb = state_ok(&opts[o], pb);
    for (int k = 0; k < 50; k++) {
      topos_tensor *gt[3] = {
          tt_random(dts[0], 2, (int64_t[]){3, 4}, 100 + k, -2, 2),
          tt_random(dts[1], 1, (int64_t[]){5}, 200 + k, -2, 2),
          tt_random(dts[2], 2, (int64_t[]){2, 2}, 300 + k, -2, 2)};
      topos_params *g = set_of(3, gt);
      /* Path a keeps its state; path b rebuilds its state from copies of
       * its parts every step. */
      topos_params *m = topos_opt_state_moment(sb, 0)
                            ? wire_copy(topos_opt_state_moment(sb, 0))
                            : NULL;
      topos_params *v = topos_opt_state_moment(sb, 1)
                            ? wire_copy(topos_opt_state_moment(sb, 1))
                            : NULL;
      topos_error err = {0};
      topos_opt_state *rebuilt =
          topos_opt_state_from(topos_opt_state_step(sb), m, v, &err);
      ck_assert_msg(rebuilt != NULL, "%s", err.message);
      topos_params_free(m);
      topos_params_free(v);
      topos_params *pa1, *pb1;
      topos_opt_state *sa1, *sb1;
      step_ok(&opts[o], pa, g, sa, &pa1, &sa1);
      step_ok(&opts[o], pb, g, rebuilt, &pb1, &sb1);
      ck_assert_msg(topos_params_bitwise_equal(pa1, pb1), "opt %d step %d", o,
                    k);
      for (int w = 0; w < 2; w++)
        ck_assert(topos_params_bitwise_equal(topos_opt_state_moment(sa1, w),
                                             topos_opt_state_moment(sb1, w)));
      ck_assert_int_eq(topos_opt_state_step(sa1), k + 1);
      ck_assert_int_eq(topos_opt_state_step(sb1), k + 1);
      topos_params_free(g);
      topos_params_free(pa);
      topos_params_free(pb);
      topos_opt_state_free(sa);
      topos_opt_state_free(sb);
      topos_opt_state_free(rebuilt);
      pa = pa1;
      pb = pb1;
      sa = sa1;
      sb = sb1;
    }
    /* The parameters did move. */
    topos_params *first =
        set_of(1, (topos_tensor *[]){
                      tt_random(dts[0], 2, (int64_t[]){3, 4}, 1 + o, -1, 1)});
    ck_assert(!topos_tensor_bitwise_equal(topos_params_get(first, 0),
                                          topos_params_get(pa, 0)));
    topos_params_free(first);
    topos_params_free(pa);
    topos_params_free(pb);
    topos_opt_state_free(sa);
    topos_opt_state_free(sb);
  }
}
END_TEST

/* ----------------------------------------------------------------- purity */

START_TEST(test_step_is_pure) {
  topos_optimizer opts[3] = {topos_adamw(0.1, 0.9, 0.999, 1e-8, 0.1),
                             topos_adam(0.1, 0.9, 0.999, 1e-8),
                             topos_sgd(0.1, 0.9)};
  for (int o = 0; o < 3; o++) {
    topos_tensor *t[2] = {tt_random(TOPOS_F32, 2, (int64_t[]){2, 3}, 7, -1, 1),
                          tt_random(TOPOS_BF16, 1, (int64_t[]){4}, 8, -1, 1)};
    topos_params *p = set_of(2, t);
    topos_tensor *gt[2] = {tt_random(TOPOS_F32, 2, (int64_t[]){2, 3}, 9, -1, 1),
                           tt_random(TOPOS_BF16, 1, (int64_t[]){4}, 10, -1, 1)};
    topos_params *g = set_of(2, gt);
    topos_opt_state *s0 = state_ok(&opts[o], p);
    /* A state with non-zero moments: one step in. */
    topos_params *p1;
    topos_opt_state *s;
    step_ok(&opts[o], p, g, s0, &p1, &s);
    topos_params *pc = wire_copy(p1), *gc = wire_copy(g);
    topos_params *mc = wire_copy(topos_opt_state_moment(s, 0));
    topos_params *vc = topos_opt_state_moment(s, 1)
                           ? wire_copy(topos_opt_state_moment(s, 1))
                           : NULL;
    topos_params *p2;
    topos_opt_state *s2;
    step_ok(&opts[o], p1, g, s, &p2, &s2);
    ck_assert(topos_params_bitwise_equal(p1, pc));
    ck_assert(topos_params_bitwise_equal(g, gc));
    ck_assert(topos_params_bitwise_equal(topos_opt_state_moment(s, 0), mc));
    ck_assert(topos_params_bitwise_equal(topos_opt_state_moment(s, 1), vc));
    ck_assert_int_eq(topos_opt_state_step(s), 1);
    ck_assert_int_eq(topos_opt_state_step(s2), 2);
    ck_assert(!topos_params_bitwise_equal(p1, p2));
    /* Same inputs, same bits. */
    topos_params *p3;
    topos_opt_state *s3;
    step_ok(&opts[o], p1, g, s, &p3, &s3);
    ck_assert(topos_params_bitwise_equal(p2, p3));
    topos_params *list[] = {p, g, p1, pc, gc, mc, vc, p2, p3};
    for (size_t i = 0; i < sizeof list / sizeof *list; i++)
      topos_params_free(list[i]);
    topos_opt_state_free(s0);
    topos_opt_state_free(s);
    topos_opt_state_free(s2);
    topos_opt_state_free(s3);
  }
}
END_TEST

START_TEST(test_nan_gradient_propagates) {
  topos_optimizer opt = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_params *p = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_params *g = set1(TOPOS_F32, 2, (double[]){NAN, 1});
  topos_opt_state *s = state_ok(&opt, p);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  double *v = tt_values(topos_params_get(p1, 0));
  ck_assert(isnan(v[0]));
  ck_assert(isfinite(v[1]));
  free(v);
  v = tt_values(topos_params_get(topos_opt_state_moment(s1, 0), 0));
  ck_assert(isnan(v[0]));
  free(v);
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(p1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
}
END_TEST

/* ---------------------------------------------------------- bad arguments */

static bool decay_all(int slot, const topos_tensor *param, void *ctx) {
  return true;
}

/* Steps expecting failure with `code`; the outputs must stay untouched. */
static void step_fails(const topos_optimizer *opt, const topos_params *p,
                       const topos_params *g, const topos_opt_state *s,
                       int code, const char *what) {
  static int sentinel_p, sentinel_s;
  topos_params *po = (topos_params *)&sentinel_p;
  topos_opt_state *so = (topos_opt_state *)&sentinel_s;
  topos_error err = {0};
  int rc = topos_optimizer_step(opt, p, g, s, &po, &so, &err);
  ck_assert_msg(rc == code, "%s: rc %d, want %d (%s)", what, rc, code,
                err.message);
  ck_assert_int_eq(err.code, code);
  ck_assert_msg(err.message[0] != 0, "%s: no message", what);
  ck_assert_ptr_eq(po, (topos_params *)&sentinel_p);
  ck_assert_ptr_eq(so, (topos_opt_state *)&sentinel_s);
  /* err is optional. */
  ck_assert_int_eq(topos_optimizer_step(opt, p, g, s, &po, &so, NULL), code);
}

START_TEST(test_step_bad_arguments) {
  topos_optimizer adam = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_optimizer sgdm = topos_sgd(0.1, 0.9), sgd = topos_sgd(0.1, 0);
  topos_params *p = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_params *g = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_params *g64 = set1(TOPOS_F64, 2, (double[]){1, 2});
  topos_params *g3 = set1(TOPOS_F32, 3, (double[]){1, 2, 3});
  topos_tensor *two[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){2}, (double[]){1, 2}),
      tt_tensor(TOPOS_F32, 1, (int64_t[]){2}, (double[]){1, 2})};
  topos_params *g2slots = set_of(2, two);
  topos_params *pi = set1(TOPOS_I32, 2, (double[]){1, 2});
  topos_params *pb = set1(TOPOS_BF16, 2, (double[]){1, 2});
  topos_params *bf_moment = set1(TOPOS_BF16, 2, (double[]){0, 0});
  topos_opt_state *s = state_ok(&adam, p);
  topos_opt_state *splain = state_ok(&sgd, p);
  topos_opt_state *s2 = state_ok(&adam, g2slots);
  topos_error err = {0};
  topos_opt_state *sbad = topos_opt_state_from(0, bf_moment, bf_moment, &err);
  ck_assert_ptr_nonnull(sbad);

  step_fails(NULL, p, g, s, TOPOS_ERR_ARGUMENT, "NULL opt");
  step_fails(&adam, NULL, g, s, TOPOS_ERR_ARGUMENT, "NULL params");
  step_fails(&adam, p, NULL, s, TOPOS_ERR_ARGUMENT, "NULL grads");
  step_fails(&adam, p, g, NULL, TOPOS_ERR_ARGUMENT, "NULL state");
  step_fails(&adam, p, g2slots, s, TOPOS_ERR_ARGUMENT, "grad count");
  step_fails(&adam, p, g, s2, TOPOS_ERR_ARGUMENT, "moment count");
  step_fails(&sgdm, p, g, splain, TOPOS_ERR_ARGUMENT, "missing momentum");
  step_fails(&adam, p, g64, s, TOPOS_ERR_DTYPE, "grad dtype");
  step_fails(&adam, p, g3, s, TOPOS_ERR_SHAPE, "grad shape");
  step_fails(&adam, pi, pi, s, TOPOS_ERR_DTYPE, "i32 params");
  step_fails(&adam, pb, pb, sbad, TOPOS_ERR_DTYPE, "bf16 moments");

  /* A step count that cannot advance. */
  topos_opt_state *send =
      topos_opt_state_from(INT64_MAX, topos_opt_state_moment(s, 0),
                           topos_opt_state_moment(s, 1), &err);
  ck_assert_ptr_nonnull(send);
  step_fails(&adam, p, g, send, TOPOS_ERR_RANGE, "step INT64_MAX");
  topos_opt_state_free(send);

  struct {
    const char *what;
    topos_optimizer opt;
  } bad[] = {
      {"lr nan", topos_adam(NAN, 0.9, 0.999, 1e-8)},
      {"lr inf", topos_adam(INFINITY, 0.9, 0.999, 1e-8)},
      {"lr negative", topos_adam(-0.1, 0.9, 0.999, 1e-8)},
      {"sgd lr nan", topos_sgd(NAN, 0)},
      {"beta1 = 1", topos_adam(0.1, 1, 0.999, 1e-8)},
      {"beta1 < 0", topos_adam(0.1, -0.1, 0.999, 1e-8)},
      {"beta1 nan", topos_adam(0.1, NAN, 0.999, 1e-8)},
      {"beta2 = 1", topos_adamw(0.1, 0.9, 1, 1e-8, 0)},
      {"beta2 nan", topos_adamw(0.1, 0.9, NAN, 1e-8, 0)},
      {"eps 0", topos_adam(0.1, 0.9, 0.999, 0)},
      {"eps < 0", topos_adam(0.1, 0.9, 0.999, -1e-8)},
      {"eps inf", topos_adam(0.1, 0.9, 0.999, INFINITY)},
      {"eps nan", topos_adam(0.1, 0.9, 0.999, NAN)},
      {"momentum nan", topos_sgd(0.1, NAN)},
      {"momentum < 0", topos_sgd(0.1, -0.5)},
      {"adamw wd nan", topos_adamw(0.1, 0.9, 0.999, 1e-8, NAN)},
      {"adamw wd inf", topos_adamw(0.1, 0.9, 0.999, 1e-8, INFINITY)},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    step_fails(&bad[i].opt, p, g, s, TOPOS_ERR_ARGUMENT, bad[i].what);
  topos_optimizer o = sgd;
  o.weight_decay = NAN;
  step_fails(&o, p, g, splain, TOPOS_ERR_ARGUMENT, "sgd wd nan");
  o = adam;
  o.weight_decay = NAN;
  step_fails(&o, p, g, s, TOPOS_ERR_ARGUMENT, "adam wd nan");
  o = adam;
  o.kind = (topos_optimizer_kind)7;
  step_fails(&o, p, g, s, TOPOS_ERR_ARGUMENT, "bad kind");

  /* NULL output pointers. */
  topos_params *po = NULL;
  topos_opt_state *so = NULL;
  err = (topos_error){0};
  ck_assert_int_eq(topos_optimizer_step(&adam, p, g, s, NULL, &so, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(so);
  ck_assert_int_eq(topos_optimizer_step(&adam, p, g, s, &po, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(po);

  topos_params *list[] = {p, g, g64, g3, g2slots, pi, pb, bf_moment};
  for (size_t i = 0; i < sizeof list / sizeof *list; i++)
    topos_params_free(list[i]);
  topos_opt_state_free(s);
  topos_opt_state_free(splain);
  topos_opt_state_free(s2);
  topos_opt_state_free(sbad);
}
END_TEST

/* Settings that would silently do nothing, or diverge, are refused like
 * out-of-range ones: numbers the kind does not read, a decay predicate
 * on a kind without decoupled decay, momentum >= 1, negative decay. */
START_TEST(test_settings_refused) {
  topos_params *p = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_params *g = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_optimizer adam0 = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_opt_state *s = state_ok(&adam0, p);
  struct {
    const char *what, *expect;
    topos_optimizer opt;
  } bad[] = {
      {"sgd beta1", "sgd does not read beta1 (0.9)", topos_sgd(0.1, 0.5)},
      {"sgd beta2", "sgd does not read beta2", topos_sgd(0.1, 0)},
      {"sgd eps", "sgd does not read eps", topos_sgd(0.1, 0)},
      {"adam momentum", "adam does not read momentum (0.9)",
       topos_adam(0.1, 0.9, 0.999, 1e-8)},
      {"adamw momentum nan", "adamw does not read momentum",
       topos_adamw(0.1, 0.9, 0.999, 1e-8, 0)},
      {"sgd decay", "sgd does not read a decay predicate", topos_sgd(0.1, 0.5)},
      {"adam decay", "adam does not read a decay predicate",
       topos_adam(0.1, 0.9, 0.999, 1e-8)},
      {"momentum 1", "momentum 1 is not in [0,1)", topos_sgd(0.1, 1)},
      {"momentum 1.5", "momentum 1.5 is not in [0,1)", topos_sgd(0.1, 1.5)},
      {"momentum inf", "not in [0,1)", topos_sgd(0.1, INFINITY)},
      {"sgd wd < 0", "weight_decay -0.1 must be finite and >= 0",
       topos_sgd(0.1, 0)},
      {"adamw wd < 0", "weight_decay -0.01 must be finite and >= 0",
       topos_adamw(0.1, 0.9, 0.999, 1e-8, -0.01)},
  };
  bad[0].opt.beta1 = 0.9;
  bad[1].opt.beta2 = 0.999;
  bad[2].opt.eps = 1e-8;
  bad[3].opt.momentum = 0.9;
  bad[4].opt.momentum = NAN;
  bad[5].opt.decay = decay_all;
  bad[6].opt.decay = decay_all;
  bad[10].opt.weight_decay = -0.1;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    topos_error err = {0};
    ck_assert_int_eq(topos_optimizer_check(&bad[i].opt, p, NULL, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(err.message, bad[i].expect) != NULL,
                  "%s: '%s' lacks '%s'", bad[i].what, err.message,
                  bad[i].expect);
    topos_opt_state *fresh = topos_opt_state_new(&bad[i].opt, p, &err);
    ck_assert_ptr_null(fresh);
    step_fails(&bad[i].opt, p, g, s, TOPOS_ERR_ARGUMENT, bad[i].what);
  }
  /* Accepted at the edges: lr 0 (a warm-up's first step holds the
   * parameters), momentum just below 1, beta 0, decay 0, -0 anywhere. */
  topos_optimizer ok[] = {topos_sgd(0, 0), topos_sgd(0.1, nextafter(1, 0)),
                          topos_adam(0.1, 0, 0, 1e-8),
                          topos_adamw(0.1, 0.9, 0.999, 1e-8, 0),
                          topos_sgd(0.1, -0.0)};
  ok[3].decay = decay_all;
  ok[4].beta1 = -0.0;
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    topos_opt_state *si = state_ok(&ok[i], p);
    topos_params *p1;
    topos_opt_state *s1;
    step_ok(&ok[i], p, g, si, &p1, &s1);
    if (i == 0) ck_assert(topos_params_bitwise_equal(p, p1));
    topos_params_free(p1);
    topos_opt_state_free(s1);
    topos_opt_state_free(si);
  }
  topos_params_free(p);
  topos_params_free(g);
  topos_opt_state_free(s);
}
END_TEST

/* The same judgement over a slot of 70 elements, so the sixteen-lane
 * check (AVX-512) sees the fault inside a whole vector: refused at any
 * element, the first fault named; -0 and +inf second moments and
 * FLT_MAX first moments accepted anywhere. */
START_TEST(test_state_values_refused_wide) {
  enum { N = 70 };
  double pv[N], ones[N], zeros[N];
  for (int i = 0; i < N; i++) {
    pv[i] = 0.01 * i;
    ones[i] = 1;
    zeros[i] = 0;
  }
  topos_tensor *pt = tt_tensor(TOPOS_F32, 1, (int64_t[]){N}, pv);
  topos_params *p = set_of(1, &pt);
  topos_optimizer adam = topos_adam(0.1, 0.9, 0.999, 1e-8);
  const struct {
    int at;
    double m, v;
    const char *expect;
  } bad[] = {{37, 0, -1, "second moment (v) slot 0 element 37 is -1"},
             {16, NAN, 1, "first moment (m) slot 0 element 16 is nan"},
             {5, INFINITY, 1, "first moment (m) slot 0 element 5 is inf"},
             {63, 0, NAN, "second moment (v) slot 0 element 63 is nan"},
             {69, -INFINITY, 1, "first moment (m) slot 0 element 69 is -inf"}};
  for (size_t b = 0; b <= sizeof bad / sizeof *bad; b++) {
    double mv[N], vv[N];
    memcpy(mv, zeros, sizeof mv);
    memcpy(vv, ones, sizeof vv);
    bool ok = b == sizeof bad / sizeof *bad;
    if (ok) { /* the accepted extremes, spread over the vectors */
      mv[3] = FLT_MAX;
      mv[40] = -FLT_MAX;
      vv[20] = -0.0;
      vv[50] = INFINITY;
    } else {
      mv[bad[b].at] = bad[b].m;
      vv[bad[b].at] = bad[b].v;
    }
    topos_tensor *m = tt_tensor(TOPOS_F32, 1, (int64_t[]){N}, mv);
    topos_tensor *v = tt_tensor(TOPOS_F32, 1, (int64_t[]){N}, vv);
    topos_params *mp = set_of(1, &m), *vp = set_of(1, &v);
    topos_error err = {0};
    topos_opt_state *st = topos_opt_state_from(2, mp, vp, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    int rc = topos_optimizer_check(&adam, p, st, &err);
    if (ok) {
      ck_assert_msg(rc == TOPOS_OK, "accepted extremes: %s", err.message);
    } else {
      ck_assert_int_eq(rc, TOPOS_ERR_ARGUMENT);
      ck_assert_msg(strstr(err.message, bad[b].expect) != NULL, "%s",
                    err.message);
    }
    topos_params_free(mp);
    topos_params_free(vp);
    topos_opt_state_free(st);
  }
  topos_params_free(p);
}
END_TEST

/* Adam over a slot large enough to run in units on a context's threads
 * (optimizer_step_in, as plan steps call it): at 1, 2 and 3 threads the
 * bits of the serial step; and with faulty moments in two units, the
 * first fault named, whichever unit meets its own first. */
START_TEST(test_adam_units) {
  enum { N = 100003 };
  float *pv = malloc(N * sizeof *pv), *gv = malloc(N * sizeof *gv);
  float *mv = malloc(N * sizeof *mv), *vv = malloc(N * sizeof *vv);
  for (int i = 0; i < N; i++) {
    pv[i] = 0.001f * (float)(i % 997) - 0.4f;
    gv[i] = 0.01f * (float)((i * 7) % 101) - 0.5f;
    mv[i] = 0.001f * (float)(i % 13);
    vv[i] = 0.0001f * (float)(i % 17);
  }
  const int64_t shape[1] = {N};
  topos_optimizer opts[2] = {topos_adam(1e-3, 0.9, 0.99, 1e-8),
                             topos_adamw(1e-3, 0.9, 0.99, 1e-8, 0.01)};
  for (int o = 0; o < 2; o++)
    for (int fault = 0; fault < 2; fault++) {
      /* faults in the fourth unit and the third (named) */
      mv[70001] = fault ? NAN : 0.001f * (float)(70001 % 13);
      vv[40000] = fault ? -1.0f : 0.0001f * (float)(40000 % 17);
      topos_tensor *tp = f32_tensor(1, shape, pv),
                   *tg = f32_tensor(1, shape, gv);
      topos_tensor *tm = f32_tensor(1, shape, mv),
                   *tv = f32_tensor(1, shape, vv);
      topos_params *pp = set_of(1, &tp), *gp = set_of(1, &tg);
      topos_params *mp = set_of(1, &tm), *vp = set_of(1, &tv);
      topos_opt_state *st = topos_opt_state_from(3, mp, vp, NULL);
      ck_assert_ptr_nonnull(st);
      topos_params *ref = NULL;
      topos_opt_state *ref_s = NULL;
      topos_error err = {0};
      int want = topos_optimizer_step(&opts[o], pp, gp, st, &ref, &ref_s, &err);
      ck_assert_msg(want == (fault ? TOPOS_ERR_ARGUMENT : TOPOS_OK), "%s",
                    err.message);
      if (fault)
        ck_assert_msg(
            strstr(err.message, "second moment (v) slot 0 element 40000 is -1"),
            "%s", err.message);
      for (int threads = 1; threads <= 3; threads++) {
        topos_exec ctx = {.threads = threads};
        exec_env env;
        ck_assert_int_eq(exec_resolve(&ctx, &env, &err), TOPOS_OK);
        topos_params *got = NULL;
        topos_opt_state *got_s = NULL;
        topos_error e2 = {0};
        int rc =
            optimizer_step_in(&env, &opts[o], pp, gp, st, &got, &got_s, &e2);
        ck_assert_int_eq(rc, want);
        if (fault) {
          ck_assert_str_eq(e2.message, err.message);
          ck_assert_ptr_null(got);
          continue;
        }
        ck_assert_msg(topos_params_bitwise_equal(got, ref),
                      "optimizer %d threads %d: params differ", o, threads);
        for (int mi = 0; mi < 2; mi++)
          ck_assert(
              topos_params_bitwise_equal(topos_opt_state_moment(got_s, mi),
                                         topos_opt_state_moment(ref_s, mi)));
        topos_params_free(got);
        topos_opt_state_free(got_s);
      }
      topos_params_free(ref);
      topos_opt_state_free(ref_s);
      topos_opt_state_free(st);
      topos_params_free(pp);
      topos_params_free(gp);
      topos_params_free(mp);
      topos_params_free(vp);
    }
  free(pv);
  free(gv);
  free(mv);
  free(vv);
}
END_TEST

/* A state no valid step could have made (a negative or NaN second moment,
 * a non-finite first moment) is refused, naming the slot and element,
 * by topos_optimizer_check before any work and by the step itself, with
 * the outputs untouched. */
START_TEST(test_state_values_refused) {
  topos_tensor *two[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3}),
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4})};
  topos_params *p = set_of(2, two);
  topos_tensor *gt[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){1, 1, 1}),
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, (double[]){1, 1, 1, 1})};
  topos_params *g = set_of(2, gt);
  topos_optimizer adam = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_optimizer sgdm = topos_sgd(0.1, 0.9), sgd = topos_sgd(0.1, 0);
  struct {
    const char *what;
    double m, v; /* slot 1, element 2 */
    const char *expect;
  } bad[] = {
      {"v negative", 0, -1, "second moment (v) slot 1 element 2 is -1"},
      {"v tiny negative", 0, -1e-30, "slot 1 element 2 is -1e-30"},
      {"v nan", 0, NAN, "second moment (v) slot 1 element 2 is nan"},
      {"m nan", NAN, 0, "first moment (m) slot 1 element 2 is nan"},
      {"m inf", INFINITY, 0, "first moment (m) slot 1 element 2 is inf"},
      {"m -inf", -INFINITY, 1, "first moment (m) slot 1 element 2 is -inf"},
      /* The first moment is read first at an element. */
      {"both", NAN, -1, "first moment (m) slot 1 element 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    double mv[4] = {0, 0, bad[i].m, 0}, vv[4] = {1, 1, bad[i].v, 1};
    topos_tensor *m[2] = {
        tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){0, 0, 0}),
        tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, mv)};
    topos_tensor *v[2] = {
        tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){0, 0, 0}),
        tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, vv)};
    topos_params *mp = set_of(2, m), *vp = set_of(2, v);
    topos_error err = {0};
    topos_opt_state *s = topos_opt_state_from(4, mp, vp, &err);
    ck_assert_msg(s != NULL, "%s", err.message); /* parts are not judged */
    ck_assert_int_eq(topos_optimizer_check(&adam, p, s, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(err.message, "optimizer_check: state ") &&
                      strstr(err.message, bad[i].expect),
                  "%s: %s", bad[i].what, err.message);
    step_fails(&adam, p, g, s, TOPOS_ERR_ARGUMENT, bad[i].what);
    err = (topos_error){0};
    topos_params *po = NULL;
    topos_opt_state *so = NULL;
    topos_optimizer_step(&adam, p, g, s, &po, &so, &err);
    ck_assert_msg(strstr(err.message, "optimizer_step: state ") &&
                      strstr(err.message, bad[i].expect),
                  "%s: %s", bad[i].what, err.message);
    /* SGD with momentum reads m only; plain SGD reads neither. */
    bool m_bad = !isfinite(bad[i].m);
    ck_assert_int_eq(topos_optimizer_check(&sgdm, p, s, &err),
                     m_bad ? TOPOS_ERR_ARGUMENT : TOPOS_OK);
    if (m_bad) step_fails(&sgdm, p, g, s, TOPOS_ERR_ARGUMENT, bad[i].what);
    ck_assert_int_eq(topos_optimizer_check(&sgd, p, s, &err), TOPOS_OK);
    topos_params_free(mp);
    topos_params_free(vp);
    topos_opt_state_free(s);
  }
  /* Accepted: -0 and +inf second moments, huge finite first moments. */
  topos_tensor *m[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){FLT_MAX, 0, 0}),
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, (double[]){0, 0, 0, 0})};
  topos_tensor *v[2] = {
      tt_tensor(TOPOS_F32, 1, (int64_t[]){3}, (double[]){-0.0, INFINITY, 0}),
      tt_tensor(TOPOS_F32, 2, (int64_t[]){2, 2}, (double[]){0, 0, 0, 0})};
  topos_params *mp = set_of(2, m), *vp = set_of(2, v);
  topos_opt_state *s = topos_opt_state_from(1, mp, vp, NULL);
  ck_assert_int_eq(topos_optimizer_check(&adam, p, s, NULL), TOPOS_OK);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&adam, p, g, s, &p1, &s1);
  topos_params_free(p1);
  topos_opt_state_free(s1);
  topos_opt_state_free(s);
  topos_params_free(mp);
  topos_params_free(vp);
  topos_params_free(p);
  topos_params_free(g);
}
END_TEST

/* A NaN gradient still propagates into the state a step returns (data,
 * not an error), and the next step refuses that state by element. */
START_TEST(test_nan_state_refused_next_step) {
  topos_optimizer opt = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_params *p = set1(TOPOS_F64, 3, (double[]){1, 2, 3});
  topos_params *g = set1(TOPOS_F64, 3, (double[]){1, NAN, 1});
  topos_params *g2 = set1(TOPOS_F64, 3, (double[]){1, 1, 1});
  topos_opt_state *s = state_ok(&opt, p);
  topos_params *p1;
  topos_opt_state *s1;
  step_ok(&opt, p, g, s, &p1, &s1);
  topos_error err = {0};
  ck_assert_int_eq(topos_optimizer_check(&opt, p1, s1, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(
      strstr(err.message, "first moment (m) slot 0 element 1 is nan"));
  step_fails(&opt, p1, g2, s1, TOPOS_ERR_ARGUMENT, "nan state");
  topos_params_free(p);
  topos_params_free(g);
  topos_params_free(g2);
  topos_params_free(p1);
  topos_opt_state_free(s);
  topos_opt_state_free(s1);
}
END_TEST

START_TEST(test_state_bad_arguments) {
  topos_error err = {0};
  topos_optimizer adam = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_params *p = set1(TOPOS_F32, 2, (double[]){1, 2});
  topos_params *p3 = set1(TOPOS_F32, 3, (double[]){1, 2, 3});
  topos_params *pi = set1(TOPOS_I32, 2, (double[]){1, 2});

  ck_assert_ptr_null(topos_opt_state_new(NULL, p, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_opt_state_new(&adam, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_opt_state_new(&adam, pi, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  err = (topos_error){0};
  topos_optimizer bad = topos_adam(0.1, 1.5, 0.999, 1e-8);
  ck_assert_ptr_null(topos_opt_state_new(&bad, p, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);

  err = (topos_error){0};
  ck_assert_ptr_null(topos_opt_state_from(-1, p, p, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_opt_state_from(3, p, p3, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  err = (topos_error){0};
  ck_assert_ptr_null(topos_opt_state_from(3, pi, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);

  /* Accepted: no moments (plain SGD), one moment, both. */
  topos_opt_state *s = topos_opt_state_from(5, NULL, NULL, &err);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(topos_opt_state_step(s), 5);
  ck_assert_ptr_null(topos_opt_state_moment(s, 0));
  topos_opt_state_free(s);
  s = topos_opt_state_from(7, p, p, &err);
  ck_assert_ptr_nonnull(s);
  /* Moments are shared (retained), not copied; the set is the state's. */
  ck_assert_ptr_eq(topos_params_get(topos_opt_state_moment(s, 0), 0),
                   topos_params_get(p, 0));
  ck_assert_ptr_ne(topos_opt_state_moment(s, 0), p);
  ck_assert_ptr_null(topos_opt_state_moment(s, 2));
  ck_assert_ptr_null(topos_opt_state_moment(s, -1));
  topos_params_free(p); /* the state keeps its tensors */
  tt_assert_values(topos_params_get(topos_opt_state_moment(s, 1), 0),
                   ((double[]){1, 2}), 2);
  topos_opt_state_free(s);
  topos_opt_state_free(NULL);
  topos_params_free(p3);
  topos_params_free(pi);
}
END_TEST

Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("sgd");
  tcase_add_test(tc, test_constructors);
  tcase_add_test(tc, test_sgd_plain);
  tcase_add_test(tc, test_sgd_f32_elements);
  tcase_add_test(tc, test_sgd_momentum_three_steps);
  tcase_add_test(tc, test_sgd_weight_decay);
  tcase_add_test(tc, test_sgd_bf16_rounds_once);
  suite_add_tcase(s, tc);
  tc = tcase_create("adam");
  tcase_add_test(tc, test_adam_two_steps_f64);
  tcase_add_test(tc, test_adam_l2_weight_decay);
  tcase_add_test(tc, test_adam_f32_and_bf16);
  tcase_add_test(tc, test_adamw_decay_selection);
  tcase_add_test(tc, test_adam_f32_wide);
  suite_add_tcase(s, tc);
  tc = tcase_create("exactness");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_reference_pow_sanity);
  tcase_add_test(tc, test_bias_correction_exact);
  tcase_add_test(tc, test_state_round_trip_50_steps);
  tcase_add_test(tc, test_step_is_pure);
  tcase_add_test(tc, test_nan_gradient_propagates);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_add_test(tc, test_step_bad_arguments);
  tcase_add_test(tc, test_state_bad_arguments);
  tcase_add_test(tc, test_settings_refused);
  tcase_add_test(tc, test_state_values_refused);
  tcase_add_test(tc, test_state_values_refused_wide);
  tcase_add_test(tc, test_adam_units);
  tcase_add_test(tc, test_nan_state_refused_next_step);
  suite_add_tcase(s, tc);
  return s;
}
