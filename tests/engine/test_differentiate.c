/*
 * test_differentiate.c - reverse mode as recording (engine/differentiate.c).
 *
 * For every differentiable op (the cases of test_backward.c, plus the nn
 * composites) in f64, f32 and bf16: loss = sum(op(p...) * c) is recorded,
 * topos_tape_differentiate appends the gradient of every parameter (and of
 * the op's output), and each gradient value is held bit for bit to
 * topos_backward's field: read from the interpreter's forward run, and
 * from plans over [loss, grads...] in the forward and training postures.
 * Gradients are differentiated again and checked against central finite
 * differences of the first gradient in f64.  Exact zeros outside the
 * loss's ancestors, the seed 1, argument errors, and the new nodes being
 * ordinary (describe, encode/decode) are checked too.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})
#define TOL 1e-6
#define MAXW 12

/* ------------------------------------------------------------ helpers */

/* What a case records: the tape, the values to differentiate for. */
typedef struct cx {
  topos_tape *t;
  topos_value w[MAXW];
  int n;
} cx;

static topos_value add_wrt(cx *c, topos_value v) {
  ck_assert_int_lt(c->n, MAXW);
  c->w[c->n++] = v;
  return v;
}

/* A parameter in the tape's dtype, random in [lo, hi). */
static topos_value P(cx *c, int rank, const int64_t *shape, uint64_t seed,
                     double lo, double hi) {
  topos_tensor *x =
      tt_random(topos_tape_dtype(c->t), rank, shape, seed, lo, hi);
  topos_value p = topos_parameter(c->t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return add_wrt(c, p);
}

/* A parameter from literal values. */
static topos_value PV(cx *c, int rank, const int64_t *shape, const double *v) {
  topos_tensor *x = tt_tensor(topos_tape_dtype(c->t), rank, shape, v);
  topos_value p = topos_parameter(c->t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return add_wrt(c, p);
}

/* Random values with |x| in [0.3, 2]: away from the kinks at 0. */
static topos_value P_away(cx *c, int rank, const int64_t *shape,
                          uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 5;
  for (int64_t i = 0; i < n; i++) {
    double m = tt_uniform(&s, 0.3, 2.0);
    v[i] = tt_uniform(&s, 0, 1) < 0.5 ? -m : m;
  }
  topos_value p = PV(c, rank, shape, v);
  free(v);
  return p;
}

static topos_value K(cx *c, topos_dtype d, int rank, const int64_t *shape,
                     const double *v) {
  topos_tensor *x = tt_tensor(d, rank, shape, v);
  topos_value k = topos_constant(c->t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(k));
  return k;
}

static topos_value KR(cx *c, int rank, const int64_t *shape, uint64_t seed,
                      double lo, double hi) {
  topos_tensor *x =
      tt_random(topos_tape_dtype(c->t), rank, shape, seed, lo, hi);
  topos_value k = topos_constant(c->t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(k));
  return k;
}

/* loss = sum(y * c), c random in [-2, 2] shaped like y, in y's dtype. */
static topos_value weighted(topos_tape *t, topos_value y, uint64_t seed) {
  const char *e = topos_tape_error(t);
  ck_assert_msg(topos_value_ok(y), "record: %s", e ? e : "(none)");
  int rank = -1;
  const int64_t *shape = topos_value_shape(t, y, &rank);
  ck_assert_ptr_nonnull(shape);
  int64_t copy[TOPOS_MAX_RANK];
  memcpy(copy, shape, sizeof(int64_t) * (size_t)rank);
  topos_tensor *c = tt_random(topos_value_dtype(t, y), rank, copy, seed, -2, 2);
  topos_value cv = topos_constant(t, c);
  topos_tensor_release(c);
  topos_value loss = topos_sum(t, topos_mul(t, y, cv));
  e = topos_tape_error(t);
  ck_assert_msg(topos_value_ok(loss), "record: %s", e ? e : "(none)");
  return loss;
}

static topos_run *plan_run(const topos_network *net, const topos_value *roots,
                           int nroots, topos_posture posture,
                           topos_plan **plan_out, const char *what) {
  topos_error err = {0};
  topos_entry e = {roots, nroots, NULL, 0, posture, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_msg(plan != NULL, "%s: lower: %s", what, err.message);
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s: plan forward: %s", what, err.message);
  *plan_out = plan;
  return run;
}

static void expect_same(const topos_tensor *a, const topos_tensor *b,
                        const char *what, const char *where, int k) {
  ck_assert_msg(a != NULL && b != NULL, "%s: %s %d: a tensor is missing", what,
                where, k);
  if (topos_tensor_bitwise_equal(a, b)) return;
  double *va = tt_values(a), *vb = tt_values(b);
  int64_t n = topos_tensor_count(a) < topos_tensor_count(b)
                  ? topos_tensor_count(a)
                  : topos_tensor_count(b);
  int64_t i = 0;
  while (i < n && (va[i] == vb[i] || (isnan(va[i]) && isnan(vb[i])))) i++;
  char msg[256];
  snprintf(msg, sizeof msg,
           "%s: %s %d differs (dtypes %s/%s, counts %lld/%lld, first "
           "element %lld: %.17g vs %.17g)",
           what, where, k, topos_dtype_name(topos_tensor_dtype(a)),
           topos_dtype_name(topos_tensor_dtype(b)),
           (long long)topos_tensor_count(a), (long long)topos_tensor_count(b),
           (long long)i, i < n ? va[i] : 0.0, i < n ? vb[i] : 0.0);
  free(va);
  free(vb);
  ck_abort_msg("%s", msg);
}

/* Every parameter slot of `got` holds the field's tensor for that
 * parameter, bit for bit (topos_gradients against topos_backward). */
static void expect_params_of(const topos_params *got, const topos_field *field,
                             const topos_network *net, const char *what,
                             const char *where) {
  topos_error err = {0};
  topos_params *want = topos_parameters_of(field, &err);
  ck_assert_msg(want != NULL, "%s: parameters_of: %s", what, err.message);
  int n = topos_network_parameter_count(net);
  ck_assert_int_eq(topos_params_count(got), n);
  for (int s = 0; s < n; s++)
    expect_same(topos_params_get(got, s), topos_params_get(want, s), what,
                where, s);
  topos_params_free(want);
}

/*
 * The heart of the suite: differentiates `loss` for every value in c->w,
 * seals, and holds every gradient value to topos_backward's field bit for
 * bit, through the interpreter and through forward and training plans.
 */
static void check_recorded(cx *c, topos_value loss, const char *what) {
  topos_value g[MAXW];
  int rc = topos_tape_differentiate(c->t, loss, c->w, c->n, g);
  const char *te = topos_tape_error(c->t);
  ck_assert_msg(rc == TOPOS_OK, "%s: differentiate: %d %s", what, rc,
                te ? te : "(none)");
  for (int k = 0; k < c->n; k++) {
    ck_assert_msg(topos_value_ok(g[k]), "%s: grad %d invalid", what, k);
    ck_assert_int_eq(topos_value_dtype(c->t, g[k]),
                     topos_value_dtype(c->t, c->w[k]));
    int rg = -1, rw = -2;
    const int64_t *sg = topos_value_shape(c->t, g[k], &rg);
    int64_t sgc[TOPOS_MAX_RANK];
    memcpy(sgc, sg, sizeof(int64_t) * (size_t)rg);
    const int64_t *sw = topos_value_shape(c->t, c->w[k], &rw);
    ck_assert_int_eq(rg, rw);
    for (int d = 0; d < rg; d++) ck_assert_int_eq(sgc[d], sw[d]);
  }
  topos_error err = {0};
  topos_network *net = topos_tape_seal(c->t, &err);
  c->t = NULL;
  ck_assert_msg(net != NULL, "%s: seal: %s", what, err.message);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s: forward: %s", what, err.message);
  topos_field *field = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(field != NULL, "%s: backward: %s", what, err.message);

  topos_params *ig = topos_gradients(run, loss, NULL, &err);
  ck_assert_msg(ig != NULL, "%s: gradients: %s", what, err.message);
  expect_params_of(ig, field, net, what, "interpreter gradients slot");
  topos_params_free(ig);

  /* The interpreter's forward values of the gradient nodes. */
  for (int k = 0; k < c->n; k++)
    expect_same(topos_run_of(run, g[k], &err),
                topos_field_of(field, c->w[k], &err), what, "interpreter grad",
                k);

  /* Plans over [loss, grads...], both postures. */
  topos_value roots[MAXW + 1];
  roots[0] = loss;
  for (int k = 0; k < c->n; k++) roots[k + 1] = g[k];
  for (int posture = 0; posture < 2; posture++) {
    topos_plan *plan = NULL;
    topos_run *pr =
        plan_run(net, roots, c->n + 1, (topos_posture)posture, &plan, what);
    expect_same(topos_run_of(pr, loss, &err), topos_run_of(run, loss, &err),
                what, posture ? "training loss" : "forward loss", 0);
    for (int k = 0; k < c->n; k++)
      expect_same(topos_run_of(pr, g[k], &err),
                  topos_field_of(field, c->w[k], &err), what,
                  posture ? "training-plan grad" : "forward-plan grad", k);
    if (posture == TOPOS_POSTURE_TRAINING) {
      /* The plan's own backward over the extended network equals the
       * interpreter's, node by node. */
      topos_field *pf = topos_plan_backward(plan, pr, NULL, &err);
      ck_assert_msg(pf != NULL, "%s: plan backward: %s", what, err.message);
      for (int i = 0; i < topos_network_node_count(net); i++) {
        topos_value v = {loss.tape, i};
        expect_same(topos_field_of(pf, v, &err), topos_field_of(field, v, &err),
                    what, "plan backward node", i);
      }
      topos_field_free(pf);
      /* Parameters-only gradients: the same bits as the field's. */
      topos_params *pg = topos_plan_gradients(plan, pr, NULL, &err);
      ck_assert_msg(pg != NULL, "%s: plan gradients: %s", what, err.message);
      expect_params_of(pg, field, net, what, "plan gradients slot");
      topos_params_free(pg);
    }
    topos_run_free(pr);
    topos_plan_free(plan);
  }
  topos_field_free(field);
  topos_run_free(run);
  topos_network_release(net);
}

/* ------------------------------------------------------------ the cases */

/* Each case records y = op(params...) on c->t, registering the parameters
 * (and anything else to differentiate for) in c->w. */
typedef topos_value (*case_fn)(cx *c);

#define SH2 S(3, 4)

#define BINARY_CASE(name, fn, lo, hi)            \
  static topos_value case_##name(cx *c) {        \
    topos_value a = P(c, 2, SH2, 10, -2, 2);     \
    topos_value b = P(c, 2, SH2, 20, lo, hi);    \
    return fn(c->t, a, b);                       \
  }                                              \
  static topos_value case_##name##_same(cx *c) { \
    topos_value a = P(c, 2, SH2, 40, 0.5, 2);    \
    return fn(c->t, a, a);                       \
  }

BINARY_CASE(add, topos_add, -2, 2)
BINARY_CASE(sub, topos_sub, -2, 2)
BINARY_CASE(mul, topos_mul, -2, 2)
BINARY_CASE(div, topos_div, 0.5, 2)
BINARY_CASE(maximum, topos_maximum, -2, 2)

static topos_value case_div_negative(cx *c) {
  topos_value a = P(c, 1, S(5), 60, -2, 2);
  topos_value b = P(c, 1, S(5), 61, -2, -0.5);
  return topos_div(c->t, a, b);
}

#define UNARY_CASE(name, expr, rank, shape, lo, hi, seed) \
  static topos_value case_##name(cx *c) {                 \
    topos_tape *t = c->t;                                 \
    topos_value p = P(c, rank, shape, seed, lo, hi);      \
    (void)t;                                              \
    return (expr);                                        \
  }

UNARY_CASE(neg, topos_neg(t, p), 2, S(2, 5), -2, 2, 1)
UNARY_CASE(exp, topos_exp(t, p), 2, S(2, 5), -2, 2, 2)
UNARY_CASE(log, topos_log(t, p), 2, S(2, 5), 0.3, 3, 3)
UNARY_CASE(sqrt, topos_sqrt(t, p), 2, S(2, 5), 0.3, 3, 4)
UNARY_CASE(tanh, topos_tanh(t, p), 2, S(2, 5), -2, 2, 5)
UNARY_CASE(erf, topos_erf(t, p), 2, S(2, 5), -2, 2, 14)
UNARY_CASE(pow3, topos_pow(t, p, 3.0), 2, S(2, 5), -2, 2, 6)
UNARY_CASE(pow2, topos_pow(t, p, 2.0), 2, S(2, 5), -2, 2, 7)
UNARY_CASE(pow_half, topos_pow(t, p, 0.5), 2, S(2, 5), 0.3, 3, 8)
UNARY_CASE(pow_neg, topos_pow(t, p, -1.5), 2, S(2, 5), 0.3, 3, 9)
UNARY_CASE(pow_2_5, topos_pow(t, p, 2.5), 2, S(2, 5), 0.3, 3, 10)
UNARY_CASE(pow0, topos_pow(t, p, 0.0), 1, S(3), -2, 2, 11)
UNARY_CASE(scalar_exp, topos_exp(t, p), 0, NULL, -1, 1, 12)
UNARY_CASE(step_self, topos_step(t, p, topos_neg(t, p)), 1, S(4), -1, 1, 13)

static topos_value case_relu(cx *c) {
  return topos_relu(c->t, P_away(c, 2, S(2, 5), 12));
}

/* The documented subgradients and tie rules, exactly. */
static topos_value case_relu_zero(cx *c) {
  return topos_relu(c->t, PV(c, 1, S(4), D(0, 1.5, -1.5, -0.0)));
}

static topos_value case_maximum_ties(cx *c) {
  topos_value a = PV(c, 1, S(3), D(1, 2, 3));
  topos_value b = PV(c, 1, S(3), D(1, 0, 5));
  return topos_maximum(c->t, a, b);
}

static topos_value case_max_along_ties(cx *c) {
  topos_value p = PV(c, 2, S(2, 4), D(3, 1, 3, 2, 0, 5, 5, 5));
  return topos_max_along(c->t, p, 1);
}

static topos_value case_max_along_ties0(cx *c) {
  topos_value p = PV(c, 2, S(2, 3), D(1, 7, 2, 1, 7, 4));
  return topos_max_along(c->t, p, 0);
}

static topos_value case_step(cx *c) {
  topos_value p = P(c, 1, S(4), 1, -1, 1);
  topos_value q = P(c, 1, S(4), 2, -1, 1);
  /* step has no gradient; a second path through p still flows */
  return topos_add(c->t, topos_step(c->t, p, q), topos_mul(c->t, p, p));
}

static topos_value case_matmul(cx *c) {
  topos_value a = P(c, 2, S(3, 4), 1, -1, 1);
  topos_value b = P(c, 2, S(4, 2), 2, -1, 1);
  return topos_matmul(c->t, a, b);
}

static topos_value case_matmul_batched(cx *c) {
  topos_value a = P(c, 3, S(2, 3, 4), 4, -1, 1);
  topos_value b = P(c, 3, S(2, 4, 5), 5, -1, 1);
  return topos_matmul(c->t, a, b);
}

static topos_value case_matmul_aat(cx *c) {
  topos_value a = P(c, 2, S(3, 4), 7, -1, 1);
  return topos_matmul(c->t, a, topos_transpose(c->t, a));
}

UNARY_CASE(transpose, topos_transpose(t, p), 2, S(3, 4), -1, 1, 1)
UNARY_CASE(permute, topos_permute(t, p, (const int[]){2, 0, 1}), 3, S(2, 3, 4),
           -1, 1, 2)
UNARY_CASE(permute2, topos_permute(t, p, (const int[]){1, 2, 0}), 3, S(2, 3, 4),
           -1, 1, 3)
UNARY_CASE(permute4, topos_permute(t, p, (const int[]){3, 1, 0, 2}), 4,
           S(2, 3, 1, 2), -1, 1, 23)
UNARY_CASE(reshape, topos_reshape(t, p, 2, S(6, 4)), 3, S(2, 3, 4), -1, 1, 4)
UNARY_CASE(reshape_of_transpose,
           topos_reshape(t, topos_transpose(t, p), 1, S(12)), 2, S(3, 4), -1, 1,
           24)
UNARY_CASE(narrow, topos_narrow(t, p, 1, 1, 2), 2, S(3, 5), -1, 1, 5)
UNARY_CASE(narrow0, topos_narrow(t, p, 0, 2, 1), 2, S(3, 5), -1, 1, 6)
UNARY_CASE(pad, topos_pad(t, p, 1, 2, 1), 2, S(3, 4), -1, 1, 7)
UNARY_CASE(pad0, topos_pad(t, p, 0, 0, 3), 2, S(3, 4), -1, 1, 8)
UNARY_CASE(unfold, topos_unfold(t, p, 1, 3, 2, 1), 2, S(2, 10), -1, 1, 9)
UNARY_CASE(unfold_dilated, topos_unfold(t, p, 1, 3, 2, 2), 2, S(2, 10), -1, 1,
           10)
UNARY_CASE(unfold_axis0, topos_unfold(t, p, 0, 2, 1, 1), 2, S(5, 3), -1, 1, 11)
UNARY_CASE(unfold_middle, topos_unfold(t, p, 1, 2, 2, 1), 3, S(2, 5, 2), -1, 1,
           21)
UNARY_CASE(fold, topos_fold(t, p, 1, 10, 3, 2, 1), 3, S(2, 4, 3), -1, 1, 12)
UNARY_CASE(fold_dilated, topos_fold(t, p, 0, 11, 3, 2, 2), 2, S(4, 3), -1, 1,
           13)
UNARY_CASE(fold_middle, topos_fold(t, p, 1, 5, 2, 2, 1), 4, S(2, 2, 2, 2), -1,
           1, 22)
UNARY_CASE(broadcast_scalar, topos_broadcast(t, p, 2, S(2, 3)), 0, NULL, -1, 1,
           14)
UNARY_CASE(broadcast_row, topos_broadcast(t, p, 2, S(4, 3)), 2, S(1, 3), -1, 1,
           15)
UNARY_CASE(broadcast_3d, topos_broadcast(t, p, 3, S(2, 3, 4)), 3, S(2, 1, 1),
           -1, 1, 16)
UNARY_CASE(broadcast_along0, topos_broadcast_along(t, p, 0, 3), 2, S(2, 3), -1,
           1, 17)
UNARY_CASE(broadcast_along1, topos_broadcast_along(t, p, 1, 4), 2, S(2, 3), -1,
           1, 18)
UNARY_CASE(broadcast_along2, topos_broadcast_along(t, p, 2, 2), 2, S(2, 3), -1,
           1, 19)
UNARY_CASE(sum, topos_sum(t, p), 2, S(3, 4), -1, 1, 1)
UNARY_CASE(sum_big, topos_sum(t, p), 1, S(40), -1, 1, 2)
UNARY_CASE(sum_along0, topos_sum_along(t, p, 0), 2, S(3, 4), -1, 1, 3)
UNARY_CASE(sum_along1, topos_sum_along(t, p, 1), 2, S(3, 4), -1, 1, 4)
UNARY_CASE(sum_along_long, topos_sum_along(t, p, 1), 3, S(2, 20, 2), -1, 1, 5)
UNARY_CASE(max_along1, topos_max_along(t, p, 1), 2, S(3, 5), -2, 2, 6)
UNARY_CASE(max_along0, topos_max_along(t, p, 0), 2, S(4, 3), -2, 2, 7)
UNARY_CASE(max_along_long, topos_max_along(t, p, 1), 2, S(2, 19), -2, 2, 77)
UNARY_CASE(log_softmax1, topos_log_softmax(t, p, 1), 2, S(3, 5), -3, 3, 8)
UNARY_CASE(log_softmax0, topos_log_softmax(t, p, 0), 2, S(4, 3), -3, 3, 9)
UNARY_CASE(log_softmax20, topos_log_softmax(t, p, 1), 2, S(2, 20), -3, 3, 10)
UNARY_CASE(logsumexp1, topos_logsumexp(t, p, 1), 2, S(3, 5), -3, 3, 11)
UNARY_CASE(logsumexp0, topos_logsumexp(t, p, 0), 2, S(4, 3), -3, 3, 12)
UNARY_CASE(logsumexp_vector, topos_logsumexp(t, p, 0), 1, S(6), -3, 3, 13)

static topos_value case_concat1(cx *c) {
  topos_value v[3];
  v[0] = P(c, 2, S(2, 3), 1, -1, 1);
  v[1] = P(c, 2, S(2, 1), 2, -1, 1);
  v[2] = P(c, 2, S(2, 2), 3, -1, 1);
  return topos_concat(c->t, 3, v, 1);
}

static topos_value case_concat0(cx *c) {
  topos_value v[3];
  v[0] = P(c, 2, S(1, 3), 5, -1, 1);
  v[1] = P(c, 2, S(3, 3), 6, -1, 1);
  v[2] = P(c, 2, S(2, 3), 7, -1, 1);
  return topos_concat(c->t, 3, v, 0);
}

static topos_value case_concat_repeat(cx *c) {
  topos_value a = P(c, 1, S(3), 9, -1, 1);
  topos_value b = P(c, 1, S(2), 10, -1, 1);
  topos_value u[3] = {a, b, a};
  return topos_concat(c->t, 3, u, 0);
}

static topos_value case_concat7(cx *c) {
  topos_value v[7];
  for (int i = 0; i < 7; i++) v[i] = P(c, 1, S(2), 30 + i, -1, 1);
  return topos_concat(c->t, 7, v, 0);
}

static topos_value case_gather(cx *c) {
  topos_value table = P(c, 2, S(5, 3), 1, -1, 1);
  topos_value idx = K(c, TOPOS_I32, 1, S(6), D(1, 3, 1, 4, 1, 0));
  add_wrt(c, idx); /* an index: an exact i32 zero, as backward's field */
  return topos_gather(c->t, table, idx);
}

static topos_value case_scatter(cx *c) {
  topos_value rows = P(c, 2, S(4, 3), 3, -1, 1);
  topos_value idx = K(c, TOPOS_I32, 1, S(4), D(2, 0, 2, 2));
  return topos_scatter(c->t, rows, idx, 4);
}

static topos_value case_gather_computed(cx *c) {
  topos_value table = P(c, 2, S(3, 2), 1, -1, 1);
  topos_value i1 = K(c, TOPOS_I32, 1, S(3), D(0, 1, 1));
  topos_value i2 = K(c, TOPOS_I32, 1, S(3), D(2, 0, 1));
  topos_value idx = add_wrt(c, topos_add(c->t, i1, i2));
  return topos_gather(c->t, table, idx);
}

/* The accumulation order of ops.md: 1, 1e16, -1e16 from three consumers. */
static topos_value case_accumulation(cx *c) {
  topos_tape *t = c->t;
  topos_value p = PV(c, 0, NULL, D(0.5));
  topos_value y1 = topos_mul(t, p, topos_scalar(t, 1.0));
  topos_value y2 = topos_mul(t, p, topos_scalar(t, 1e16));
  topos_value y3 = topos_mul(t, p, topos_scalar(t, -1e16));
  return topos_add(t, topos_add(t, y1, y2), y3);
}

static topos_value case_network(cx *c) {
  topos_tape *t = c->t;
  topos_value x = K(c, topos_tape_dtype(t), 2, S(4, 3),
                    D(0.5, -1, 2, 1, 0.25, -0.5, -2, 1, 0, 0.3, 0.2, -0.1));
  topos_value w1 = P(c, 2, S(3, 5), 1, -1, 1);
  topos_value b1 = P(c, 2, S(1, 5), 2, -1, 1);
  topos_value w2 = P(c, 2, S(5, 3), 3, -1, 1);
  topos_value h = topos_tanh(t, topos_add(t, topos_matmul(t, x, w1),
                                          topos_broadcast(t, b1, 2, S(4, 5))));
  add_wrt(c, h); /* an interior value */
  topos_value z = topos_matmul(t, h, w2);
  topos_value ls = topos_log_softmax(t, z, 1);
  topos_value reg = topos_sum(t, topos_mul(t, w1, w1));
  return topos_add(t, topos_broadcast(t, reg, 2, S(4, 3)), ls);
}

/* nn composites: whatever chain they record differentiates as well. */
static topos_value case_conv2d(cx *c) {
  topos_value x = P(c, 4, S(2, 2, 7, 6), 1, -1, 1);
  topos_value w = P(c, 4, S(3, 2, 3, 2), 2, -1, 1);
  topos_value b = P(c, 1, S(3), 3, -1, 1);
  return topos_conv2d(c->t, x, w, b, 2, 1, 2);
}

static topos_value case_conv2d_plain(cx *c) {
  topos_value x = P(c, 4, S(1, 3, 5, 5), 4, -1, 1);
  topos_value w = P(c, 4, S(2, 3, 3, 3), 5, -1, 1);
  return topos_conv2d(c->t, x, w, TOPOS_NONE, 1, 0, 1);
}

static topos_value case_max_pool(cx *c) {
  topos_value x = P(c, 4, S(2, 2, 7, 7), 6, -2, 2);
  return topos_max_pool2d(c->t, x, 3, 2);
}

static topos_value case_max_pool_ties(cx *c) {
  topos_value x = PV(c, 4, S(1, 1, 4, 4),
                     D(1, 1, 2, 2, 1, 1, 2, 2, 3, 0, -1, -1, 0, 3, -1, -1));
  return topos_max_pool2d(c->t, x, 2, 2);
}

static topos_value case_cross_entropy(cx *c) {
  topos_value logits = P(c, 2, S(4, 5), 7, -2, 2);
  topos_value y = K(c, TOPOS_I32, 1, S(4), D(0, 4, 2, 2));
  return topos_cross_entropy(c->t, logits, y);
}

static topos_value case_layer_norm(cx *c) {
  topos_value x = P(c, 2, S(3, 6), 8, -2, 2);
  topos_value g = P(c, 1, S(6), 9, 0.5, 1.5);
  topos_value b = P(c, 1, S(6), 10, -1, 1);
  return topos_layer_norm(c->t, x, g, b, 1e-5);
}

static topos_value case_batch_norm(cx *c) {
  topos_value x = P(c, 4, S(3, 2, 2, 2), 11, -2, 2);
  topos_value g = P(c, 1, S(2), 12, 0.5, 1.5);
  topos_value b = P(c, 1, S(2), 13, -1, 1);
  return topos_batch_norm(c->t, x, g, b, 1e-5, NULL, NULL);
}

static topos_value case_gelu_silu(cx *c) {
  topos_value x = P(c, 2, S(2, 5), 14, -3, 3);
  return topos_add(c->t, topos_gelu(c->t, x), topos_silu(c->t, x));
}

static topos_value case_softmax_mse(cx *c) {
  topos_value x = P(c, 2, S(3, 4), 15, -2, 2);
  topos_value y = KR(c, 2, S(3, 4), 16, 0, 1);
  return topos_add(c->t, topos_sum(c->t, topos_softmax(c->t, x, 1)),
                   topos_mse(c->t, x, y));
}

static const struct {
  const char *name;
  case_fn fn;
  bool f64_only; /* values whose low-precision rounding makes no sense */
} cases[] = {
#define C(n) \
  { #n, case_##n, false }
    C(add),
    C(add_same),
    C(sub),
    C(sub_same),
    C(mul),
    C(mul_same),
    C(div),
    C(div_same),
    C(maximum),
    C(maximum_same),
    C(div_negative),
    C(neg),
    C(exp),
    C(log),
    C(sqrt),
    C(tanh),
    C(erf),
    C(pow3),
    C(pow2),
    C(pow_half),
    C(pow_neg),
    C(pow_2_5),
    C(pow0),
    C(scalar_exp),
    C(step_self),
    C(relu),
    C(relu_zero),
    C(maximum_ties),
    C(max_along_ties),
    C(max_along_ties0),
    C(step),
    C(matmul),
    C(matmul_batched),
    C(matmul_aat),
    C(transpose),
    C(permute),
    C(permute2),
    C(permute4),
    C(reshape),
    C(reshape_of_transpose),
    C(narrow),
    C(narrow0),
    C(pad),
    C(pad0),
    C(unfold),
    C(unfold_dilated),
    C(unfold_axis0),
    C(unfold_middle),
    C(fold),
    C(fold_dilated),
    C(fold_middle),
    C(broadcast_scalar),
    C(broadcast_row),
    C(broadcast_3d),
    C(broadcast_along0),
    C(broadcast_along1),
    C(broadcast_along2),
    C(sum),
    C(sum_big),
    C(sum_along0),
    C(sum_along1),
    C(sum_along_long),
    C(max_along1),
    C(max_along0),
    C(max_along_long),
    C(log_softmax1),
    C(log_softmax0),
    C(log_softmax20),
    C(logsumexp1),
    C(logsumexp0),
    C(logsumexp_vector),
    C(concat1),
    C(concat0),
    C(concat_repeat),
    C(concat7),
    C(gather),
    C(scatter),
    C(gather_computed),
    {"accumulation", case_accumulation, true},
    C(network),
    C(conv2d),
    C(conv2d_plain),
    C(max_pool),
    C(max_pool_ties),
    C(cross_entropy),
    C(layer_norm),
    C(batch_norm),
    C(gelu_silu),
    C(softmax_mse),
#undef C
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static const topos_dtype dtypes[3] = {TOPOS_F64, TOPOS_F32, TOPOS_BF16};

/* One test per case; each runs in f64, f32 and bf16. */
START_TEST(recorded_matches_backward) {
  for (int d = 0; d < 3; d++) {
    if (cases[_i].f64_only && dtypes[d] != TOPOS_F64) continue;
    char what[96];
    snprintf(what, sizeof what, "%s (%s)", cases[_i].name,
             topos_dtype_name(dtypes[d]));
    cx c = {.t = topos_tape_new(dtypes[d])};
    ck_assert_ptr_nonnull(c.t);
    topos_value y = cases[_i].fn(&c);
    const char *e = topos_tape_error(c.t);
    ck_assert_msg(topos_value_ok(y), "%s: record: %s", what, e ? e : "-");
    /* The op's output gets its gradient too (an interior value). */
    if (topos_value_dtype(c.t, y) != TOPOS_I32) add_wrt(&c, y);
    topos_value loss = weighted(c.t, y, 1000 + (uint64_t)_i);
    check_recorded(&c, loss, what);
  }
}
END_TEST

/* Every case, all parameters at once on one tape, summed into one loss:
 * gradients from many consumers accumulate like backward's. */
START_TEST(recorded_many_ops_one_tape) {
  cx c = {.t = topos_tape_new(TOPOS_F64)};
  topos_value total = TOPOS_NONE;
  topos_value keep[MAXW];
  int nkeep = 0;
  for (int i = 0; i < NCASES; i++) {
    cx sub = {.t = c.t};
    topos_value y = cases[i].fn(&sub);
    topos_value l = weighted(c.t, y, 5000 + (uint64_t)i);
    total = topos_value_ok(total) ? topos_add(c.t, total, l) : l;
    if (nkeep < MAXW && sub.n > 0 &&
        topos_value_dtype(c.t, sub.w[0]) != TOPOS_I32)
      keep[nkeep++] = sub.w[0];
  }
  memcpy(c.w, keep, sizeof(topos_value) * (size_t)nkeep);
  c.n = nkeep;
  check_recorded(&c, total, "all ops on one tape");
}
END_TEST

/* ---------------------------------------------- second derivatives */

/* Central differences of F(p) over every element of parameter slot `slot`,
 * against the recorded gradient value h; relative error as in testutil. */
static double fd_error(const topos_network *net, topos_value F, int slot,
                       topos_value h) {
  topos_error err = {0};
  topos_params *p = topos_network_parameters(net);
  topos_run *run = topos_forward(net, p, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  const topos_tensor *ht = topos_run_of(run, h, &err);
  ck_assert_msg(ht != NULL, "run_of h: %s", err.message);
  double *an = tt_values(ht);
  const topos_tensor *base = topos_params_get(p, slot);
  int64_t n = topos_tensor_count(base);
  ck_assert_int_eq(n, topos_tensor_count(ht));
  double *v = tt_values(base);
  const double step = 1e-5;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double f[2];
    for (int side = 0; side < 2; side++) {
      double keep = v[i];
      v[i] = keep + (side ? -step : step);
      topos_tensor *t = topos_tensor_from(TOPOS_F64, topos_tensor_rank(base),
                                          topos_tensor_shape(base), v, &err);
      v[i] = keep;
      topos_params *q = topos_params_with(p, slot, t, &err);
      topos_tensor_release(t);
      ck_assert_ptr_nonnull(q);
      topos_run *r2 = topos_forward(net, q, NULL, 0, NULL, &err);
      ck_assert_msg(r2 != NULL, "forward: %s", err.message);
      f[side] = topos_run_scalar(r2, F, &err);
      topos_run_free(r2);
      topos_params_free(q);
    }
    double fd = (f[0] - f[1]) / (2 * step);
    double scale = fmax(1.0, fmax(fabs(fd), fabs(an[i])));
    double e = fabs(fd - an[i]) / scale;
    if (e > worst) worst = e;
  }
  free(v);
  free(an);
  topos_run_free(run);
  topos_params_free(p);
  return worst;
}

/* F = sum(g_k * v) over the first gradients g, then h = dF/dwrt.  The
 * recorded h is checked against finite differences of F and bit for bit
 * against topos_backward(F) and a plan over [F, h...]. */
typedef struct second {
  cx c; /* tape and wrt */
  int nfirst;
  topos_value g[MAXW], h[MAXW], F;
} second;

static void second_differentiate(second *s, topos_value loss, uint64_t seed) {
  cx *c = &s->c;
  ck_assert_int_eq(topos_tape_differentiate(c->t, loss, c->w, c->n, s->g),
                   TOPOS_OK);
  s->F = TOPOS_NONE;
  for (int k = 0; k < c->n; k++) {
    topos_value term = weighted(c->t, s->g[k], seed + (uint64_t)k);
    s->F = k ? topos_add(c->t, s->F, term) : term;
  }
  int rc = topos_tape_differentiate(c->t, s->F, c->w, c->n, s->h);
  const char *e = topos_tape_error(c->t);
  ck_assert_msg(rc == TOPOS_OK, "second differentiate: %s", e ? e : "-");
}

static void second_check(second *s, const char *what) {
  cx *c = &s->c;
  topos_error err = {0};
  topos_network *net = topos_tape_seal(c->t, &err);
  ck_assert_msg(net != NULL, "%s: seal: %s", what, err.message);
  /* wrt are the parameters, slot k = wrt k */
  for (int k = 0; k < c->n; k++) {
    topos_value pk = topos_network_parameter(net, k);
    ck_assert_int_eq(pk.index, c->w[k].index);
    double e = fd_error(net, s->F, k, s->h[k]);
    ck_assert_msg(e <= TOL, "%s: wrt %d: second-derivative error %g", what, k,
                  e);
  }
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  topos_field *f = topos_backward(run, s->F, NULL, &err);
  ck_assert_msg(f != NULL, "%s: backward: %s", what, err.message);
  topos_value roots[MAXW + 1];
  roots[0] = s->F;
  for (int k = 0; k < c->n; k++) roots[k + 1] = s->h[k];
  topos_plan *plan = NULL;
  topos_run *pr =
      plan_run(net, roots, c->n + 1, TOPOS_POSTURE_FORWARD, &plan, what);
  for (int k = 0; k < c->n; k++) {
    expect_same(topos_run_of(run, s->h[k], &err),
                topos_field_of(f, c->w[k], &err), what,
                "second grad (interpreter)", k);
    expect_same(topos_run_of(pr, s->h[k], &err),
                topos_field_of(f, c->w[k], &err), what, "second grad (plan)",
                k);
  }
  topos_run_free(pr);
  topos_plan_free(plan);
  topos_field_free(f);
  topos_run_free(run);
  topos_network_release(net);
}

START_TEST(second_tanh) {
  second s = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  topos_value x = P(&s.c, 1, S(6), 1, -1.5, 1.5);
  second_differentiate(&s, topos_sum(s.c.t, topos_tanh(s.c.t, x)), 10);
  second_check(&s, "d2 sum(tanh(x))");
}
END_TEST

START_TEST(second_tanh_chain) {
  second s = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  topos_tape *t = s.c.t;
  topos_value x = P(&s.c, 2, S(2, 3), 2, -1, 1);
  topos_value w = P(&s.c, 2, S(3, 2), 3, -1, 1);
  topos_value h = topos_tanh(t, topos_matmul(t, topos_tanh(t, x), w));
  topos_value y = topos_tanh(t, topos_mul(t, h, h));
  second_differentiate(&s, weighted(t, y, 4), 20);
  second_check(&s, "d2 tanh chain");
}
END_TEST

START_TEST(second_mul_chains) {
  /* x*x*x: g = 3x^2, h = 6x v */
  second s = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  topos_tape *t = s.c.t;
  topos_value x = P(&s.c, 1, S(5), 5, -2, 2);
  second_differentiate(&s, topos_sum(t, topos_mul(t, topos_mul(t, x, x), x)),
                       30);
  second_check(&s, "d2 x*x*x");

  /* x*y: g_x = y (exactly), g_y = x; the mixed second derivatives */
  second s2 = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  t = s2.c.t;
  const double xv[4] = {0.5, -1.25, 2, 0.75}, yv[4] = {1.5, 0.25, -3, -0.5};
  topos_value a = PV(&s2.c, 1, S(4), xv);
  topos_value b = PV(&s2.c, 1, S(4), yv);
  second_differentiate(&s2, topos_sum(t, topos_mul(t, a, b)), 40);
  second_check(&s2, "d2 x*y");

  /* and the first gradients are exact: d/dx sum(x*y) = y */
  topos_tape *t3 = topos_tape_new(TOPOS_F64);
  cx c = {.t = t3};
  a = PV(&c, 1, S(4), xv);
  b = PV(&c, 1, S(4), yv);
  topos_value g[2];
  ck_assert_int_eq(topos_tape_differentiate(
                       t3, topos_sum(t3, topos_mul(t3, a, b)), c.w, 2, g),
                   TOPOS_OK);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t3, &err);
  ck_assert_ptr_nonnull(net);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  tt_assert_values(topos_run_of(run, g[0], &err), yv, 4);
  tt_assert_values(topos_run_of(run, g[1], &err), xv, 4);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

START_TEST(second_exp_log) {
  second s = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  topos_tape *t = s.c.t;
  topos_value x = P(&s.c, 1, S(5), 6, -1, 1);
  second_differentiate(&s, weighted(t, topos_exp(t, x), 7), 50);
  second_check(&s, "d2 exp");

  second s2 = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  t = s2.c.t;
  x = P(&s2.c, 1, S(5), 8, 0.5, 3);
  second_differentiate(&s2, weighted(t, topos_log(t, x), 9), 60);
  second_check(&s2, "d2 log");

  /* log(exp(x) * y): mixed */
  second s3 = {.c = {.t = topos_tape_new(TOPOS_F64)}};
  t = s3.c.t;
  x = P(&s3.c, 1, S(4), 10, -1, 1);
  topos_value y = P(&s3.c, 1, S(4), 11, 0.5, 2);
  second_differentiate(
      &s3, weighted(t, topos_log(t, topos_mul(t, topos_exp(t, x), y)), 12), 70);
  second_check(&s3, "d2 log(exp(x) y)");
}
END_TEST

/* Third derivative of sum(x^4) recorded three times: 24 x (times the
 * constants the weights bring), against finite differences too. */
START_TEST(third_derivative) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  cx c = {.t = t};
  const double xv[3] = {0.5, -1.5, 2};
  topos_value x = PV(&c, 1, S(3), xv);
  topos_value x2 = topos_mul(t, x, x);
  topos_value loss = topos_sum(t, topos_mul(t, x2, x2));
  topos_value g1, g2, g3;
  ck_assert_int_eq(topos_tape_differentiate(t, loss, &x, 1, &g1), TOPOS_OK);
  topos_value l2 = topos_sum(t, g1);
  ck_assert_int_eq(topos_tape_differentiate(t, l2, &x, 1, &g2), TOPOS_OK);
  topos_value l3 = topos_sum(t, g2);
  ck_assert_int_eq(topos_tape_differentiate(t, l3, &x, 1, &g3), TOPOS_OK);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  /* small integers times exact inputs: exact in f64 */
  double want1[3], want2[3], want3[3];
  for (int i = 0; i < 3; i++) {
    want1[i] = 4 * xv[i] * xv[i] * xv[i];
    want2[i] = 12 * xv[i] * xv[i];
    want3[i] = 24 * xv[i];
  }
  tt_assert_values(topos_run_of(run, g1, &err), want1, 3);
  tt_assert_values(topos_run_of(run, g2, &err), want2, 3);
  tt_assert_values(topos_run_of(run, g3, &err), want3, 3);
  ck_assert_double_le(fd_error(net, l3, 0, g3), TOL);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------- exact properties */

static void expect_all_zero_bits(const topos_tensor *t, const char *what) {
  ck_assert_ptr_nonnull(t);
  topos_error err = {0};
  size_t bytes =
      (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
  unsigned char *b = calloc(1, bytes ? bytes : 1);
  ck_assert_int_eq(topos_tensor_read(t, b, bytes, &err), TOPOS_OK);
  for (size_t i = 0; i < bytes; i++)
    ck_assert_msg(b[i] == 0, "%s: byte %zu is 0x%02x", what, i, b[i]);
  free(b);
}

static void expect_shape(const topos_tensor *t, topos_dtype d, int rank,
                         const int64_t *shape, const char *what) {
  ck_assert_ptr_nonnull(t);
  ck_assert_msg(topos_tensor_dtype(t) == d, "%s: dtype %s", what,
                topos_dtype_name(topos_tensor_dtype(t)));
  ck_assert_int_eq(topos_tensor_rank(t), rank);
  for (int i = 0; i < rank; i++)
    ck_assert_int_eq(topos_tensor_shape(t)[i], shape[i]);
}

START_TEST(zero_outside_ancestors) {
  for (int d = 0; d < 3; d++) {
    topos_tape *t = topos_tape_new(dtypes[d]);
    cx c = {.t = t};
    topos_value p1 = P(&c, 1, S(3), 1, -1, 1);
    topos_value p2 = P(&c, 2, S(2, 2), 2, -1, 1);
    topos_value side = topos_tanh(t, p1); /* a descendant of p1, unused */
    topos_value y2 = topos_mul(t, p2, p2);
    topos_value loss = weighted(t, topos_exp(t, p1), 3);
    topos_value idx = K(&c, TOPOS_I32, 2, S(2, 2), D(1, 2, 3, 4));
    topos_value after = topos_neg(t, loss); /* recorded after the loss */
    topos_tensor *pt = tt_random(dtypes[d], 3, S(1, 2, 3), 7, -1, 1);
    topos_value late = topos_parameter(t, pt); /* a parameter after it */
    topos_tensor_release(pt);
    topos_value wrt[9] = {p2, y2, side, after, late, idx, loss, p1, p1};
    topos_value g[9];
    ck_assert_int_eq(topos_tape_differentiate(t, loss, wrt, 9, g), TOPOS_OK);
    int n_before = topos_tape_node_count(t);
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_ptr_nonnull(net);
    ck_assert_int_eq(topos_network_node_count(net), n_before);
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    topos_field *f = topos_backward(run, loss, NULL, &err);
    ck_assert_ptr_nonnull(f);
    const char *names[6] = {"p2", "y2", "side", "after", "late", "idx"};
    for (int k = 0; k < 6; k++) {
      const topos_tensor *gv = topos_run_of(run, g[k], &err);
      int rank = -1;
      const int64_t *shape = topos_network_value_shape(net, wrt[k], &rank);
      expect_shape(gv, topos_network_value_dtype(net, wrt[k]), rank, shape,
                   names[k]);
      expect_all_zero_bits(gv, names[k]);
      expect_same(gv, topos_field_of(f, wrt[k], &err), names[k], "zero", k);
    }
    /* wrt = loss: exactly 1 */
    tt_assert_values(topos_run_of(run, g[6], &err), D(1.0), 1);
    /* p1 twice: the same value both times, nonzero */
    ck_assert(topos_tensor_bitwise_equal(topos_run_of(run, g[7], &err),
                                         topos_run_of(run, g[8], &err)));
    expect_same(topos_run_of(run, g[7], &err), topos_field_of(f, p1, &err),
                "p1", "grad", 7);
    double *v = tt_values(topos_run_of(run, g[7], &err));
    for (int i = 0; i < 3; i++) ck_assert(v[i] != 0);
    free(v);
    topos_field_free(f);
    topos_run_free(run);
    topos_network_release(net);
  }
}
END_TEST

/* The loss may be a leaf, and may be differentiated for itself only. */
START_TEST(leaf_loss) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  cx c = {.t = t};
  topos_value p = PV(&c, 0, NULL, D(2.5));
  topos_value q = PV(&c, 1, S(2), D(1, 2));
  topos_value g[2];
  topos_value wrt[2] = {p, q};
  ck_assert_int_eq(topos_tape_differentiate(t, p, wrt, 2, g), TOPOS_OK);
  /* n = 0 with NULL arrays is a no-op that succeeds */
  int before = topos_tape_node_count(t);
  ck_assert_int_eq(topos_tape_differentiate(t, p, NULL, 0, NULL), TOPOS_OK);
  ck_assert_ptr_null(topos_tape_error(t));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  ck_assert_int_ge(topos_network_node_count(net), before);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  tt_assert_values(topos_run_of(run, g[0], &err), D(1.0), 1);
  expect_all_zero_bits(topos_run_of(run, g[1], &err), "q");
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

/* The gradients are values like any other: they can be named, used in
 * further computation, and a second differentiate appends after them. */
START_TEST(gradients_are_ordinary) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  cx c = {.t = t};
  topos_value w = P(&c, 2, S(3, 2), 1, -1, 1);
  topos_value x = K(&c, TOPOS_F64, 2, S(2, 3), D(1, 2, 3, -1, 0.5, 0.25));
  topos_value loss = weighted(t, topos_tanh(t, topos_matmul(t, x, w)), 2);
  topos_name(t, loss, "loss");
  int before = topos_tape_node_count(t);
  topos_value g;
  ck_assert_int_eq(topos_tape_differentiate(t, loss, &w, 1, &g), TOPOS_OK);
  int after = topos_tape_node_count(t);
  ck_assert_int_gt(after, before);
  ck_assert_int_ge(g.index, before);
  ck_assert(topos_value_ok(topos_name(t, g, "dloss/dw")));
  /* an SGD step recorded from the gradient */
  topos_value w2 = topos_sub(
      t, w,
      topos_mul(t, g, topos_broadcast(t, topos_scalar(t, 0.1), 2, S(3, 2))));
  ck_assert(topos_value_ok(w2));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  ck_assert_int_eq(topos_network_find(net, "dloss/dw").index, g.index);

  /* describe lists every node, the new ones included */
  char *text = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
  ck_assert_msg(text != NULL, "describe: %s", err.message);
  int lines = 0;
  for (const char *s = text; *s; s++) lines += *s == '\n';
  ck_assert_int_eq(lines, topos_network_node_count(net));
  ck_assert_ptr_nonnull(strstr(text, "dloss/dw"));
  /* the line of the gradient node starts with its index */
  char key[32];
  snprintf(key, sizeof key, "\n%4d ", g.index);
  ck_assert_msg(strstr(text, key) != NULL, "no line for node %d", g.index);
  /* the transpose and fold-free matmul adjoint appear as plain ops */
  ck_assert_ptr_nonnull(strstr(text, "transpose("));
  topos_free(text);
  char *json = topos_network_describe(net, TOPOS_FORMAT_JSON, &err);
  ck_assert_msg(json != NULL, "describe json: %s", err.message);
  ck_assert_ptr_nonnull(strstr(json, "dloss/dw"));
  topos_free(json);

  /* encode / decode keep the gradient nodes */
  uint8_t *bytes = NULL;
  size_t len = 0;
  memset(&err, 0, sizeof err);
  int rc = topos_network_encode(net, &bytes, &len, &err);
  ck_assert_msg(rc == TOPOS_OK, "encode: %s", err.message);
  topos_network *back = topos_network_decode(bytes, len, &err);
  ck_assert_msg(back != NULL, "decode: %s", err.message);
  ck_assert_int_eq(topos_network_node_count(back),
                   topos_network_node_count(net));
  char id1[65], id2[65];
  ck_assert_int_eq(topos_network_id(net, id1, &err), TOPOS_OK);
  ck_assert_int_eq(topos_network_id(back, id2, &err), TOPOS_OK);
  ck_assert_str_eq(id1, id2);
  topos_value bg = topos_network_find(back, "dloss/dw");
  ck_assert_int_eq(bg.index, g.index);
  topos_run *r1 = topos_forward(net, NULL, NULL, 0, NULL, &err);
  topos_run *r2 = topos_forward(back, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(r1);
  ck_assert_ptr_nonnull(r2);
  ck_assert(topos_tensor_bitwise_equal(topos_run_of(r1, g, &err),
                                       topos_run_of(r2, bg, &err)));
  topos_run_free(r1);
  topos_run_free(r2);
  topos_free(bytes);
  topos_network_release(back);
  topos_network_release(net);
}
END_TEST

/* A differentiated tape's gradient with respect to its inputs, with
 * feeds: the plan and the interpreter agree with backward on fed data. */
START_TEST(inputs_and_feeds) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *d = tt_random(TOPOS_F32, 2, S(4, 3), 1, -1, 1);
  topos_value x = topos_input(t, d);
  topos_tensor_release(d);
  cx c = {.t = t};
  topos_value w = P(&c, 2, S(3, 2), 2, -1, 1);
  add_wrt(&c, x);
  topos_value loss =
      weighted(t, topos_log_softmax(t, topos_matmul(t, x, w), 1), 3);
  topos_value g[2];
  ck_assert_int_eq(topos_tape_differentiate(t, loss, c.w, 2, g), TOPOS_OK);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_tensor *fx = tt_random(TOPOS_F32, 2, S(4, 3), 9, -2, 2);
  topos_feed feed = {x, fx};
  topos_run *run = topos_forward(net, NULL, &feed, 1, NULL, &err);
  ck_assert_ptr_nonnull(run);
  topos_field *f = topos_backward(run, loss, NULL, &err);
  ck_assert_ptr_nonnull(f);
  topos_value roots[3] = {loss, g[0], g[1]};
  topos_entry e = {
      roots, 3, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_ptr_nonnull(plan);
  topos_run *pr = topos_plan_forward(plan, NULL, &feed, 1, NULL, &err);
  ck_assert_msg(pr != NULL, "%s", err.message);
  for (int k = 0; k < 2; k++) {
    expect_same(topos_run_of(run, g[k], &err), topos_field_of(f, c.w[k], &err),
                "feeds", "interpreter", k);
    expect_same(topos_run_of(pr, g[k], &err), topos_field_of(f, c.w[k], &err),
                "feeds", "plan", k);
  }
  topos_run_free(pr);
  topos_plan_free(plan);
  topos_field_free(f);
  topos_run_free(run);
  topos_tensor_release(fx);
  topos_network_release(net);
}
END_TEST

/* grads_out may be the wrt array itself (values replaced by their
 * gradients in place): nothing in the contract forbids the overlap, and
 * every wrt value is valid when the call is made. */
START_TEST(grads_in_place) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  cx c = {.t = t};
  const double av[3] = {0.5, -2, 3.25}, bv[3] = {1.5, 0.125, -4};
  topos_value a = PV(&c, 1, S(3), av);
  topos_value b = PV(&c, 1, S(3), bv);
  topos_value loss = topos_sum(t, topos_mul(t, a, b));
  topos_value v[2] = {a, b};
  int rc = topos_tape_differentiate(t, loss, v, 2, v);
  if (rc != TOPOS_OK) {
    char msg[512];
    const char *e = topos_tape_error(t);
    snprintf(msg, sizeof msg, "%s", e ? e : "-");
    topos_tape_free(t);
    ck_abort_msg("in-place differentiate: %d %s", rc, msg);
  }
  /* and shifted by one: grads_out overlaps the wrt still to be read */
  topos_value u[3] = {a, b, TOPOS_NONE};
  ck_assert_int_eq(topos_tape_differentiate(t, loss, u, 2, u + 1), TOPOS_OK);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  tt_assert_values(topos_run_of(run, v[0], &err), bv, 3);
  tt_assert_values(topos_run_of(run, v[1], &err), av, 3);
  ck_assert_int_eq(u[0].index, a.index);
  tt_assert_values(topos_run_of(run, u[1], &err), bv, 3);
  tt_assert_values(topos_run_of(run, u[2], &err), av, 3);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------ errors */

/* Expects differentiate to fail with a non-zero status, a tape error
 * message, and every grads_out entry invalid; the tape stays errored. */
static void expect_fails(topos_tape *t, topos_value loss,
                         const topos_value *wrt, int n, topos_value *out,
                         int want_code, const char *what) {
  int rc = topos_tape_differentiate(t, loss, wrt, n, out);
  ck_assert_msg(rc != TOPOS_OK, "%s: differentiate succeeded", what);
  if (want_code) ck_assert_msg(rc == want_code, "%s: code %d", what, rc);
  const char *e = topos_tape_error(t);
  ck_assert_msg(e != NULL && e[0] != 0, "%s: no tape error", what);
  if (out)
    for (int k = 0; k < n; k++)
      ck_assert_msg(!topos_value_ok(out[k]), "%s: grad %d is valid", what, k);
  /* and the tape refuses to seal, with that message */
  topos_error err = {0};
  ck_assert_ptr_null(topos_tape_seal(t, &err));
  ck_assert_int_eq(err.code, rc);
  ck_assert(err.message[0] != 0);
}

/* A fresh tape with a parameter p[3], a vector v = exp(p) and a loss. */
typedef struct small {
  topos_tape *t;
  topos_value p, v, loss;
} small;

static small small_new(void) {
  small s;
  s.t = topos_tape_new(TOPOS_F64);
  cx c = {.t = s.t};
  s.p = P(&c, 1, S(3), 1, -1, 1);
  s.v = topos_exp(s.t, s.p);
  s.loss = topos_sum(s.t, s.v);
  return s;
}

START_TEST(errors) {
  topos_value g[2] = {{7, 7}, {7, 7}};
  /* NULL tape */
  ck_assert_int_ne(topos_tape_differentiate(NULL, TOPOS_NONE, NULL, 0, NULL),
                   TOPOS_OK);

  /* a non-rank-0 loss */
  small s = small_new();
  expect_fails(s.t, s.v, &s.p, 1, g, TOPOS_ERR_SHAPE, "rank-1 loss");

  /* an i32 rank-0 loss */
  s = small_new();
  {
    cx c = {.t = s.t};
    topos_value i = K(&c, TOPOS_I32, 0, NULL, D(3));
    expect_fails(s.t, i, &s.p, 1, g, 0, "i32 loss");
  }

  /* invalid loss, invalid wrt */
  s = small_new();
  expect_fails(s.t, TOPOS_NONE, &s.p, 1, g, TOPOS_ERR_ARGUMENT, "invalid loss");
  s = small_new();
  topos_value bad[2] = {s.p, TOPOS_NONE};
  expect_fails(s.t, s.loss, bad, 2, g, TOPOS_ERR_ARGUMENT, "invalid wrt");

  /* values of another tape, and past the end of this one */
  small o = small_new();
  s = small_new();
  ck_assert_uint_ne(o.p.tape, s.p.tape);
  expect_fails(s.t, o.loss, &s.p, 1, g, TOPOS_ERR_ARGUMENT, "foreign loss");
  s = small_new();
  expect_fails(s.t, s.loss, &o.p, 1, g, TOPOS_ERR_ARGUMENT, "foreign wrt");
  s = small_new();
  topos_value past = {s.p.tape, 100000};
  expect_fails(s.t, past, &s.p, 1, g, TOPOS_ERR_ARGUMENT, "loss past end");
  s = small_new();
  expect_fails(s.t, s.loss, &past, 1, g, TOPOS_ERR_ARGUMENT, "wrt past end");
  topos_tape_free(o.t);

  /* NULL arrays with n > 0, negative n */
  s = small_new();
  expect_fails(s.t, s.loss, NULL, 1, g, TOPOS_ERR_ARGUMENT, "NULL wrt");
  s = small_new();
  expect_fails(s.t, s.loss, &s.p, 1, NULL, TOPOS_ERR_ARGUMENT,
               "NULL grads_out");
  s = small_new();
  expect_fails(s.t, s.loss, &s.p, -1, g, TOPOS_ERR_ARGUMENT, "n < 0");

  /* an already-errored tape returns its code and keeps its first message */
  s = small_new();
  topos_value bad_add = topos_add(s.t, s.p, s.loss); /* shape error */
  ck_assert(!topos_value_ok(bad_add));
  const char *first = topos_tape_error(s.t);
  ck_assert_ptr_nonnull(first);
  char copy[512];
  snprintf(copy, sizeof copy, "%s", first);
  g[0] = s.p;
  int rc = topos_tape_differentiate(s.t, s.loss, &s.p, 1, g);
  ck_assert_int_eq(rc, TOPOS_ERR_SHAPE);
  ck_assert(!topos_value_ok(g[0]));
  ck_assert_str_eq(topos_tape_error(s.t), copy);
  topos_tape_free(s.t);

  /* a failed differentiate leaves the tape's earlier nodes intact */
  s = small_new();
  int before = topos_tape_node_count(s.t);
  ck_assert_int_ne(topos_tape_differentiate(s.t, s.v, &s.p, 1, g), TOPOS_OK);
  ck_assert_int_eq(topos_tape_node_count(s.t), before);
  topos_tape_free(s.t);
}
END_TEST

Suite *differentiate_suite(void) {
  Suite *s = suite_create("differentiate");
  TCase *tc = tcase_create("per_op");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, recorded_matches_backward, 0, NCASES);
  tcase_add_test(tc, recorded_many_ops_one_tape);
  suite_add_tcase(s, tc);

  tc = tcase_create("higher_order");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, second_tanh);
  tcase_add_test(tc, second_tanh_chain);
  tcase_add_test(tc, second_mul_chains);
  tcase_add_test(tc, second_exp_log);
  tcase_add_test(tc, third_derivative);
  suite_add_tcase(s, tc);

  tc = tcase_create("properties");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, zero_outside_ancestors);
  tcase_add_test(tc, leaf_loss);
  tcase_add_test(tc, gradients_are_ordinary);
  tcase_add_test(tc, inputs_and_feeds);
  tcase_add_test(tc, errors);
  tcase_add_test(tc, grads_in_place);
  suite_add_tcase(s, tc);
  return s;
}
