/*
 * test_backward.c - reverse mode (engine/adjoint.c, topos_backward in
 * engine/interp.c).  Every differentiable op is held to a central
 * finite-difference check in f64 (tt_gradient_error <= 1e-6) at random
 * points away from kinks, on loss = sum(op(p...) * c) with c a fixed
 * random constant so that every output element gets its own cotangent.
 * Exact properties are checked bit for bit: zeros outside the target's
 * ancestors, the seed 1, step's missing gradient, the documented
 * subgradients and tie rules, and the accumulation order of ops.md.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define D(...) ((const double[]){__VA_ARGS__})
#define TOL 1e-6

/* ------------------------------------------------------------ helpers */

static topos_value param_from(topos_tape *t, int rank, const int64_t *shape,
                              const double *v) {
  topos_tensor *x = tt_tensor(TOPOS_F64, rank, shape, v);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return p;
}

static topos_value param_rand(topos_tape *t, int rank, const int64_t *shape,
                              uint64_t seed, double lo, double hi) {
  topos_tensor *x = tt_random(TOPOS_F64, rank, shape, seed, lo, hi);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return p;
}

/* Random values with |x| in [0.3, 2]: away from the kinks at 0. */
static topos_value param_away(topos_tape *t, int rank, const int64_t *shape,
                              uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 5;
  for (int64_t i = 0; i < n; i++) {
    double m = tt_uniform(&s, 0.3, 2.0);
    v[i] = tt_uniform(&s, 0, 1) < 0.5 ? -m : m;
  }
  topos_value p = param_from(t, rank, shape, v);
  free(v);
  return p;
}

static topos_value const_from(topos_tape *t, topos_dtype d, int rank,
                              const int64_t *shape, const double *v) {
  topos_tensor *x = tt_tensor(d, rank, shape, v);
  topos_value c = topos_constant(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(c));
  return c;
}

/* loss = sum(y * c), c random in [-2, 2] shaped like y. */
static topos_value weighted(topos_tape *t, topos_value y, uint64_t seed) {
  const char *e = topos_tape_error(t);
  ck_assert_msg(topos_value_ok(y), "record: %s", e ? e : "(none)");
  int rank = -1;
  const int64_t *shape = topos_value_shape(t, y, &rank);
  ck_assert_ptr_nonnull(shape);
  topos_tensor *c = tt_random(TOPOS_F64, rank, shape, seed, -2, 2);
  topos_value cv = topos_constant(t, c);
  topos_tensor_release(c);
  topos_value loss = topos_sum(t, topos_mul(t, y, cv));
  e = topos_tape_error(t);
  ck_assert_msg(topos_value_ok(loss), "record: %s", e ? e : "(none)");
  return loss;
}

/* Every node's gradient has that node's dtype and shape. */
static void check_field_shapes(const topos_network *net, topos_value loss,
                               const char *what) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s: forward: %s", what, err.message);
  topos_field *f = topos_backward(run, loss, NULL, &err);
  ck_assert_msg(f != NULL, "%s: backward: %s", what, err.message);
  for (int i = 0; i < topos_network_node_count(net); i++) {
    topos_value v = {loss.tape, i};
    const topos_tensor *g = topos_field_of(f, v, &err);
    ck_assert_msg(g != NULL, "%s: node %d: %s", what, i, err.message);
    int rank = -1;
    const int64_t *shape = topos_network_value_shape(net, v, &rank);
    ck_assert_msg(topos_tensor_dtype(g) == topos_network_value_dtype(net, v),
                  "%s: node %d: gradient dtype differs", what, i);
    bool same = topos_tensor_rank(g) == rank;
    for (int d = 0; same && d < rank; d++)
      same = topos_tensor_shape(g)[d] == shape[d];
    ck_assert_msg(same, "%s: node %d: gradient of rank %d, node of rank %d",
                  what, i, topos_tensor_rank(g), rank);
  }
  topos_field_free(f);
  topos_run_free(run);
}

/* Seals the tape and asserts the finite-difference check. */
static void check_grad(topos_tape *t, topos_value loss, const char *what) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s: seal: %s", what, err.message);
  check_field_shapes(net, loss, what);
  double e = tt_gradient_error(net, loss, NULL, 0);
  ck_assert_msg(e <= TOL, "%s: gradient error %g", what, e);
  topos_network_release(net);
}

/* y = op(p) with p random in [lo, hi), checked.  expr may use t and p. */
#define UNARY_CHECK(what, expr, rank, shape, lo, hi, seed)    \
  do {                                                        \
    topos_tape *t = topos_tape_new(TOPOS_F64);                \
    topos_value p = param_rand(t, rank, shape, seed, lo, hi); \
    check_grad(t, weighted(t, (expr), (seed) + 1000), what);  \
  } while (0)

/* Everything backward returns for one network: forward, backward. */
typedef struct grads {
  topos_network *net;
  topos_run *run;
  topos_field *field;
} grads;

static grads backward_of(topos_tape *t, topos_value target) {
  grads g = {0};
  topos_error err = {0};
  g.net = topos_tape_seal(t, &err);
  ck_assert_msg(g.net != NULL, "seal: %s", err.message);
  g.run = topos_forward(g.net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(g.run != NULL, "forward: %s", err.message);
  g.field = topos_backward(g.run, target, NULL, &err);
  ck_assert_msg(g.field != NULL, "backward: %s", err.message);
  return g;
}

static void grads_free(grads *g) {
  topos_field_free(g->field);
  topos_run_free(g->run);
  topos_network_release(g->net);
}

/* The gradient at v widened to doubles (new array). */
static double *grad_at(const grads *g, topos_value v) {
  topos_error err = {0};
  const topos_tensor *t = topos_field_of(g->field, v, &err);
  ck_assert_msg(t != NULL, "field_of: %s", err.message);
  int rank = -1;
  const int64_t *shape = topos_network_value_shape(g->net, v, &rank);
  ck_assert_int_eq(topos_tensor_rank(t), rank);
  for (int i = 0; i < rank; i++)
    ck_assert_int_eq(topos_tensor_shape(t)[i], shape[i]);
  ck_assert_int_eq(topos_tensor_dtype(t), topos_network_value_dtype(g->net, v));
  return tt_values(t);
}

/* Every element of the gradient at v is +0.0 (all bits clear). */
static void expect_plus_zero(const grads *g, topos_value v, const char *what) {
  topos_error err = {0};
  const topos_tensor *t = topos_field_of(g->field, v, &err);
  ck_assert_msg(t != NULL, "%s: field_of: %s", what, err.message);
  size_t bytes =
      (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
  unsigned char *b = calloc(1, bytes ? bytes : 1);
  ck_assert_int_eq(topos_tensor_read(t, b, bytes, &err), TOPOS_OK);
  for (size_t i = 0; i < bytes; i++)
    ck_assert_msg(b[i] == 0, "%s: byte %zu of the gradient is 0x%02x", what, i,
                  b[i]);
  free(b);
}

static void expect_grad(const grads *g, topos_value v, const double *want,
                        int64_t n, const char *what) {
  double *got = grad_at(g, v);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "%s: element %lld: got %.17g want %.17g",
                  what, (long long)i, got[i], want[i]);
  free(got);
}

/* ---------------------------------------- finite differences, per op */

START_TEST(fd_elementwise_binary) {
  const int64_t *sh = S(3, 4);
  struct {
    const char *name;
    topos_value (*fn)(topos_tape *, topos_value, topos_value);
    double lo, hi; /* of the second operand */
  } cases[] = {
      {"add", topos_add, -2, 2},         {"sub", topos_sub, -2, 2},
      {"mul", topos_mul, -2, 2},         {"div", topos_div, 0.5, 2},
      {"maximum", topos_maximum, -2, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value a = param_rand(t, 2, sh, 10 + c, -2, 2);
    topos_value b = param_rand(t, 2, sh, 20 + c, cases[c].lo, cases[c].hi);
    check_grad(t, weighted(t, cases[c].fn(t, a, b), 30 + c), cases[c].name);
    /* the same operand on both sides */
    t = topos_tape_new(TOPOS_F64);
    a = param_rand(t, 2, sh, 40 + c, 0.5, 2);
    check_grad(t, weighted(t, cases[c].fn(t, a, a), 50 + c), cases[c].name);
  }
  /* div with a negative denominator */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = param_rand(t, 1, S(5), 60, -2, 2);
  topos_value b = param_rand(t, 1, S(5), 61, -2, -0.5);
  check_grad(t, weighted(t, topos_div(t, a, b), 62), "div negative");
}
END_TEST

START_TEST(fd_elementwise_unary) {
  const int64_t *sh = S(2, 5);
  UNARY_CHECK("neg", topos_neg(t, p), 2, sh, -2, 2, 1);
  UNARY_CHECK("exp", topos_exp(t, p), 2, sh, -2, 2, 2);
  UNARY_CHECK("log", topos_log(t, p), 2, sh, 0.3, 3, 3);
  UNARY_CHECK("sqrt", topos_sqrt(t, p), 2, sh, 0.3, 3, 4);
  UNARY_CHECK("tanh", topos_tanh(t, p), 2, sh, -2, 2, 5);
  UNARY_CHECK("erf", topos_erf(t, p), 2, sh, -2, 2, 13);
  UNARY_CHECK("pow 3", topos_pow(t, p, 3.0), 2, sh, -2, 2, 6);
  UNARY_CHECK("pow 2", topos_pow(t, p, 2.0), 2, sh, -2, 2, 7);
  UNARY_CHECK("pow 0.5", topos_pow(t, p, 0.5), 2, sh, 0.3, 3, 8);
  UNARY_CHECK("pow -1.5", topos_pow(t, p, -1.5), 2, sh, 0.3, 3, 9);
  UNARY_CHECK("pow 2.5", topos_pow(t, p, 2.5), 2, sh, 0.3, 3, 10);
  UNARY_CHECK("scalar exp", topos_exp(t, p), 0, NULL, -1, 1, 11);
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_away(t, 2, sh, 12);
  check_grad(t, weighted(t, topos_relu(t, p), 13), "relu");
}
END_TEST

START_TEST(fd_matmul) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = param_rand(t, 2, S(3, 4), 1, -1, 1);
  topos_value b = param_rand(t, 2, S(4, 2), 2, -1, 1);
  check_grad(t, weighted(t, topos_matmul(t, a, b), 3), "matmul");
  t = topos_tape_new(TOPOS_F64);
  a = param_rand(t, 3, S(2, 3, 4), 4, -1, 1);
  b = param_rand(t, 3, S(2, 4, 5), 5, -1, 1);
  check_grad(t, weighted(t, topos_matmul(t, a, b), 6), "matmul batched");
  /* a·aᵀ: one parameter on both sides through a transpose */
  t = topos_tape_new(TOPOS_F64);
  a = param_rand(t, 2, S(3, 4), 7, -1, 1);
  check_grad(t, weighted(t, topos_matmul(t, a, topos_transpose(t, a)), 8),
             "matmul a aT");
}
END_TEST

START_TEST(fd_layout) {
  UNARY_CHECK("transpose", topos_transpose(t, p), 2, S(3, 4), -1, 1, 1);
  UNARY_CHECK("permute", topos_permute(t, p, (const int[]){2, 0, 1}), 3,
              S(2, 3, 4), -1, 1, 2);
  UNARY_CHECK("permute 2", topos_permute(t, p, (const int[]){1, 2, 0}), 3,
              S(2, 3, 4), -1, 1, 3);
  UNARY_CHECK("reshape", topos_reshape(t, p, 2, S(6, 4)), 3, S(2, 3, 4), -1, 1,
              4);
  UNARY_CHECK("narrow", topos_narrow(t, p, 1, 1, 2), 2, S(3, 5), -1, 1, 5);
  UNARY_CHECK("narrow 0", topos_narrow(t, p, 0, 2, 1), 2, S(3, 5), -1, 1, 6);
  UNARY_CHECK("pad", topos_pad(t, p, 1, 2, 1), 2, S(3, 4), -1, 1, 7);
  UNARY_CHECK("pad 0", topos_pad(t, p, 0, 0, 3), 2, S(3, 4), -1, 1, 8);
  UNARY_CHECK("unfold", topos_unfold(t, p, 1, 3, 2, 1), 2, S(2, 10), -1, 1, 9);
  UNARY_CHECK("unfold dilated", topos_unfold(t, p, 1, 3, 2, 2), 2, S(2, 10), -1,
              1, 10);
  UNARY_CHECK("unfold axis 0", topos_unfold(t, p, 0, 2, 1, 1), 2, S(5, 3), -1,
              1, 11);
  UNARY_CHECK("fold", topos_fold(t, p, 1, 10, 3, 2, 1), 3, S(2, 4, 3), -1, 1,
              12);
  UNARY_CHECK("fold dilated", topos_fold(t, p, 0, 11, 3, 2, 2), 2, S(4, 3), -1,
              1, 13);
  UNARY_CHECK("broadcast scalar", topos_broadcast(t, p, 2, S(2, 3)), 0, NULL,
              -1, 1, 14);
  UNARY_CHECK("broadcast row", topos_broadcast(t, p, 2, S(4, 3)), 2, S(1, 3),
              -1, 1, 15);
  UNARY_CHECK("broadcast 3d", topos_broadcast(t, p, 3, S(2, 3, 4)), 3,
              S(2, 1, 1), -1, 1, 16);
  UNARY_CHECK("broadcast_along 0", topos_broadcast_along(t, p, 0, 3), 2,
              S(2, 3), -1, 1, 17);
  UNARY_CHECK("broadcast_along 1", topos_broadcast_along(t, p, 1, 4), 2,
              S(2, 3), -1, 1, 18);
  UNARY_CHECK("broadcast_along 2", topos_broadcast_along(t, p, 2, 2), 2,
              S(2, 3), -1, 1, 19);
}
END_TEST

START_TEST(fd_concat) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value v[3] = {param_rand(t, 2, S(2, 3), 1, -1, 1),
                      param_rand(t, 2, S(2, 1), 2, -1, 1),
                      param_rand(t, 2, S(2, 2), 3, -1, 1)};
  check_grad(t, weighted(t, topos_concat(t, 3, v, 1), 4), "concat 1");
  t = topos_tape_new(TOPOS_F64);
  topos_value w[3] = {param_rand(t, 2, S(1, 3), 5, -1, 1),
                      param_rand(t, 2, S(3, 3), 6, -1, 1),
                      param_rand(t, 2, S(2, 3), 7, -1, 1)};
  check_grad(t, weighted(t, topos_concat(t, 3, w, 0), 8), "concat 0");
  /* one operand twice */
  t = topos_tape_new(TOPOS_F64);
  topos_value a = param_rand(t, 1, S(3), 9, -1, 1);
  topos_value u[3] = {a, param_rand(t, 1, S(2), 10, -1, 1), a};
  check_grad(t, weighted(t, topos_concat(t, 3, u, 0), 11), "concat repeat");
}
END_TEST

START_TEST(fd_reductions) {
  UNARY_CHECK("sum", topos_sum(t, p), 2, S(3, 4), -1, 1, 1);
  UNARY_CHECK("sum big", topos_sum(t, p), 1, S(40), -1, 1, 2);
  UNARY_CHECK("sum_along 0", topos_sum_along(t, p, 0), 2, S(3, 4), -1, 1, 3);
  UNARY_CHECK("sum_along 1", topos_sum_along(t, p, 1), 2, S(3, 4), -1, 1, 4);
  UNARY_CHECK("sum_along 1 of 3", topos_sum_along(t, p, 1), 3, S(2, 20, 2), -1,
              1, 5);
  /* random values are distinct with probability one */
  UNARY_CHECK("max_along 1", topos_max_along(t, p, 1), 2, S(3, 5), -2, 2, 6);
  UNARY_CHECK("max_along 0", topos_max_along(t, p, 0), 2, S(4, 3), -2, 2, 7);
  UNARY_CHECK("log_softmax 1", topos_log_softmax(t, p, 1), 2, S(3, 5), -3, 3,
              8);
  UNARY_CHECK("log_softmax 0", topos_log_softmax(t, p, 0), 2, S(4, 3), -3, 3,
              9);
  UNARY_CHECK("log_softmax 20", topos_log_softmax(t, p, 1), 2, S(2, 20), -3, 3,
              10);
  UNARY_CHECK("logsumexp 1", topos_logsumexp(t, p, 1), 2, S(3, 5), -3, 3, 11);
  UNARY_CHECK("logsumexp 0", topos_logsumexp(t, p, 0), 2, S(4, 3), -3, 3, 12);
  UNARY_CHECK("logsumexp vector", topos_logsumexp(t, p, 0), 1, S(6), -3, 3, 13);
}
END_TEST

START_TEST(fd_indexing) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value table = param_rand(t, 2, S(5, 3), 1, -1, 1);
  topos_value idx = const_from(t, TOPOS_I32, 1, S(6), D(1, 3, 1, 4, 1, 0));
  check_grad(t, weighted(t, topos_gather(t, table, idx), 2), "gather");
  t = topos_tape_new(TOPOS_F64);
  topos_value rows = param_rand(t, 2, S(4, 3), 3, -1, 1);
  idx = const_from(t, TOPOS_I32, 1, S(4), D(2, 0, 2, 2));
  check_grad(t, weighted(t, topos_scatter(t, rows, idx, 4), 4), "scatter");
}
END_TEST

/* A small network using many ops at once, parameters used twice. */
START_TEST(fd_network) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x =
      const_from(t, TOPOS_F64, 2, S(4, 3),
                 D(0.5, -1, 2, 1, 0.25, -0.5, -2, 1, 0, 0.3, 0.2, -0.1));
  topos_value w1 = param_rand(t, 2, S(3, 5), 1, -1, 1);
  topos_value b1 = param_rand(t, 2, S(1, 5), 2, -1, 1);
  topos_value w2 = param_rand(t, 2, S(5, 3), 3, -1, 1);
  topos_value h = topos_tanh(t, topos_add(t, topos_matmul(t, x, w1),
                                          topos_broadcast(t, b1, 2, S(4, 5))));
  topos_value z = topos_matmul(t, h, w2);
  topos_value ls = topos_log_softmax(t, z, 1);
  topos_value reg = topos_sum(t, topos_mul(t, w1, w1));
  topos_value loss = topos_add(t, weighted(t, ls, 4), reg);
  check_grad(t, loss, "network");
}
END_TEST

/* ------------------------------------------------------ exact properties */

START_TEST(zero_outside_ancestors) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p1 = param_rand(t, 1, S(3), 1, -1, 1);
  topos_value p2 = param_rand(t, 2, S(2, 2), 2, -1, 1);
  topos_value y1 = topos_exp(t, p1);
  topos_value side = topos_tanh(t, p1); /* a descendant of p1, not used */
  topos_value y2 = topos_mul(t, p2, p2);
  topos_value loss = weighted(t, y1, 3);
  topos_value other = topos_sum(t, y2);
  topos_value after = topos_neg(t, loss); /* recorded after the target */
  grads g = backward_of(t, loss);
  expect_plus_zero(&g, p2, "p2");
  expect_plus_zero(&g, y2, "y2");
  expect_plus_zero(&g, side, "side");
  expect_plus_zero(&g, other, "other");
  expect_plus_zero(&g, after, "after");
  expect_grad(&g, loss, D(1.0), 1, "seed");
  /* p1 gets exp(p1) * c, nonzero */
  double *gp1 = grad_at(&g, p1);
  for (int i = 0; i < 3; i++) ck_assert(gp1[i] != 0);
  free(gp1);
  grads_free(&g);
}
END_TEST

/* The cancel check runs once per node the reverse scan visits. */
static topos_value param_d(topos_tape *t, topos_dtype d, int rank,
                           const int64_t *shape, uint64_t seed) {
  topos_tensor *x = tt_random(d, rank, shape, seed, -1, 1);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(p));
  return p;
}

static bool count_visit(void *ctx) {
  (*(int *)ctx)++;
  return false;
}

/* topos_gradients: the parameters' bits of topos_backward, with no work
 * on branches that reach only inputs and constants (a conv over an input,
 * a matmul whose left operand is data, a gather from a constant table). */
START_TEST(gradients_skip_data_branches) {
  for (int k = 0; k < 2; k++) {
    topos_dtype d = k ? TOPOS_F32 : TOPOS_F64;
    topos_tape *t = topos_tape_new(d);
    topos_tensor *xt = tt_random(d, 4, S(2, 1, 6, 6), 11, -1, 1);
    topos_value x = topos_input(t, xt);
    topos_tensor_release(xt);
    topos_value w = param_d(t, d, 4, S(3, 1, 3, 3), 12);
    topos_value cb = param_d(t, d, 1, S(3), 13);
    topos_value h = topos_relu(t, topos_conv2d(t, x, w, cb, 1, 1, 1));
    int64_t flat[2] = {2, 3 * 6 * 6};
    topos_value f = topos_reshape(t, h, 2, flat);
    topos_value w2 = param_d(t, d, 2, S(108, 4), 14);
    topos_value logits = topos_matmul(t, f, w2);
    topos_tensor *tgt = tt_tensor(TOPOS_I32, 1, S(2), D(1, 3));
    topos_value y = topos_input(t, tgt);
    topos_tensor_release(tgt);
    topos_value unused = param_d(t, d, 1, S(2), 15);
    (void)unused;
    topos_value loss = topos_cross_entropy(t, logits, y);
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_msg(net != NULL, "seal: %s", err.message);
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert_msg(run != NULL, "forward: %s", err.message);
    int all = 0, some = 0;
    topos_exec visit_all = {.cancel = count_visit, .cancel_ctx = &all};
    topos_exec visit_some = {.cancel = count_visit, .cancel_ctx = &some};
    topos_field *field = topos_backward(run, loss, &visit_all, &err);
    topos_params *g = topos_gradients(run, loss, &visit_some, &err);
    ck_assert_msg(field && g, "backward/gradients: %s", err.message);
    topos_params *want = topos_parameters_of(field, &err);
    ck_assert_int_eq(topos_params_count(g), 4);
    for (int s = 0; s < 4; s++)
      ck_assert_msg(topos_tensor_bitwise_equal(topos_params_get(g, s),
                                               topos_params_get(want, s)),
                    "slot %d differs", s);
    /* The unused parameter's gradient is +0 everywhere. */
    double *z = tt_values(topos_params_get(g, 3));
    ck_assert(z[0] == 0 && !signbit(z[0]) && z[1] == 0 && !signbit(z[1]));
    free(z);
    /* The input branch (pad, unfolds, permute, the patches' cotangent)
     * and the constant column's gather are skipped. */
    ck_assert_msg(some > 0 && some + 5 <= all,
                  "visited %d nodes for gradients, %d for backward", some, all);
    topos_params_free(want);
    topos_params_free(g);
    topos_field_free(field);
    topos_run_free(run);
    topos_network_release(net);
  }
}
END_TEST

/* Backward from a target that is not the last node: its own gradient is
 * exactly 1, and p2's is exactly p2 + p2. */
START_TEST(seed_is_one) {
  const double v[4] = {0.5, -1.25, 3, 0.1};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p1 = param_rand(t, 1, S(3), 1, -1, 1);
  topos_value p2 = param_from(t, 2, S(2, 2), v);
  topos_value y2 = topos_mul(t, p2, p2);
  topos_value other = topos_sum(t, y2);
  topos_value loss = weighted(t, topos_exp(t, p1), 3);
  (void)loss;
  grads g = backward_of(t, other);
  expect_grad(&g, other, D(1.0), 1, "seed");
  expect_grad(&g, y2, D(1, 1, 1, 1), 4, "y2");
  double twice[4];
  for (int i = 0; i < 4; i++) twice[i] = v[i] + v[i];
  expect_grad(&g, p2, twice, 4, "p2");
  expect_plus_zero(&g, p1, "p1");
  expect_plus_zero(&g, loss, "loss");
  grads_free(&g);
}
END_TEST

START_TEST(exact_simple_gradients) {
  /* loss = sum(x * w): dx = w, dw = x, exactly */
  const double xv[3] = {0.5, -2, 3.25}, wv[3] = {1.5, 0.125, -4};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value x = param_from(t, 1, S(3), xv);
  topos_value w = param_from(t, 1, S(3), wv);
  topos_value loss = topos_sum(t, topos_mul(t, x, w));
  grads g = backward_of(t, loss);
  expect_grad(&g, x, wv, 3, "dx");
  expect_grad(&g, w, xv, 3, "dw");
  grads_free(&g);
}
END_TEST

START_TEST(input_gradient) {
  const double xv[3] = {0.5, -2, 3.25}, wv[3] = {1.5, 0.125, -4};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *d = tt_tensor(TOPOS_F64, 1, S(3), xv);
  topos_value x = topos_input(t, d);
  topos_tensor_release(d);
  topos_value w = param_from(t, 1, S(3), wv);
  topos_value loss = topos_sum(t, topos_mul(t, x, w));
  grads g = backward_of(t, loss);
  expect_grad(&g, x, wv, 3, "d input");
  expect_grad(&g, w, xv, 3, "dw");
  topos_error err = {0};
  topos_params *gp = topos_parameters_of(g.field, &err);
  ck_assert_ptr_nonnull(gp);
  ck_assert_int_eq(topos_params_count(gp), 1);
  tt_assert_values(topos_params_get(gp, 0), xv, 3);
  topos_params_free(gp);
  grads_free(&g);
}
END_TEST

START_TEST(step_has_no_gradient) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_rand(t, 1, S(4), 1, -1, 1);
  topos_value q = param_rand(t, 1, S(4), 2, -1, 1);
  topos_value loss = weighted(t, topos_step(t, p, q), 3);
  grads g = backward_of(t, loss);
  expect_grad(&g, p, D(0, 0, 0, 0), 4, "p");
  expect_grad(&g, q, D(0, 0, 0, 0), 4, "q");
  grads_free(&g);

  /* another path still flows */
  const double c2[4] = {1.5, -0.5, 2, 0.25};
  t = topos_tape_new(TOPOS_F64);
  p = param_rand(t, 1, S(4), 1, -1, 1);
  q = param_rand(t, 1, S(4), 2, -1, 1);
  topos_value s = weighted(t, topos_step(t, p, q), 3);
  topos_value l2 =
      topos_sum(t, topos_mul(t, p, const_from(t, TOPOS_F64, 1, S(4), c2)));
  loss = topos_add(t, s, l2);
  g = backward_of(t, loss);
  expect_grad(&g, p, c2, 4, "p with a second path");
  grads_free(&g);
}
END_TEST

/* relu'(0) = 1: g·step(a, 0). */
START_TEST(relu_subgradient_at_zero) {
  const double pv[4] = {0, 1.5, -1.5, -0.0};
  const double cv[4] = {0.75, -2, 3, 1.25};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_from(t, 1, S(4), pv);
  topos_value c = const_from(t, TOPOS_F64, 1, S(4), cv);
  topos_value loss = topos_sum(t, topos_mul(t, topos_relu(t, p), c));
  grads g = backward_of(t, loss);
  expect_grad(&g, p, D(0.75, -2, 0, 1.25), 4, "relu");
  grads_free(&g);
}
END_TEST

/* max_along routes the whole gradient to the first maximal position. */
START_TEST(max_along_ties_lowest_index) {
  const double pv[8] = {3, 1, 3, 2, 0, 5, 5, 5};
  const double cv[2] = {1.5, -2};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_from(t, 2, S(2, 4), pv);
  topos_value c = const_from(t, TOPOS_F64, 1, S(2), cv);
  topos_value loss = topos_sum(t, topos_mul(t, topos_max_along(t, p, 1), c));
  grads g = backward_of(t, loss);
  expect_grad(&g, p, D(1.5, 0, 0, 0, 0, -2, 0, 0), 8, "max_along rows");
  grads_free(&g);
  /* along axis 0 */
  const double qv[6] = {1, 7, 2, 1, 7, 4};
  t = topos_tape_new(TOPOS_F64);
  p = param_from(t, 2, S(2, 3), qv);
  c = const_from(t, TOPOS_F64, 1, S(3), D(2, 3, 4));
  loss = topos_sum(t, topos_mul(t, topos_max_along(t, p, 0), c));
  g = backward_of(t, loss);
  expect_grad(&g, p, D(2, 3, 0, 0, 0, 4), 6, "max_along columns");
  grads_free(&g);
}
END_TEST

/* maximum ties go to a. */
START_TEST(maximum_ties_to_a) {
  const double av[3] = {1, 2, 3}, bv[3] = {1, 0, 5}, cv[3] = {0.5, -1, 2};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = param_from(t, 1, S(3), av);
  topos_value b = param_from(t, 1, S(3), bv);
  topos_value c = const_from(t, TOPOS_F64, 1, S(3), cv);
  topos_value loss = topos_sum(t, topos_mul(t, topos_maximum(t, a, b), c));
  grads g = backward_of(t, loss);
  expect_grad(&g, a, D(0.5, -1, 0), 3, "a");
  expect_grad(&g, b, D(0, 0, 2), 3, "b");
  grads_free(&g);
}
END_TEST

/* Repeated gather indices accumulate into the table row. */
START_TEST(gather_repeated_indices) {
  double tv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const double cv[8] = {0.5, 1, 2, 4, 8, 16, 32, 64};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value table = param_from(t, 2, S(4, 2), tv);
  topos_value idx = const_from(t, TOPOS_I32, 1, S(4), D(1, 3, 1, 1));
  topos_value c = const_from(t, TOPOS_F64, 2, S(4, 2), cv);
  topos_value loss = topos_sum(t, topos_mul(t, topos_gather(t, table, idx), c));
  grads g = backward_of(t, loss);
  expect_grad(&g, table, D(0, 0, 0.5 + 8 + 32, 1 + 16 + 64, 0, 0, 2, 4), 8,
              "table");
  grads_free(&g);
}
END_TEST

/* ops.md: the engine adds each consumer's cotangent into the operand's
 * gradient visiting consumers in decreasing index.  With contributions
 * 1, 1e16, -1e16 from consumers 1 < 2 < 3, that order gives
 * (-1e16 + 1e16) + 1 = 1; increasing order would give 0. */
START_TEST(accumulation_order) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_from(t, 0, NULL, D(0.5));
  topos_value y1 = topos_mul(t, p, topos_scalar(t, 1.0));
  topos_value y2 = topos_mul(t, p, topos_scalar(t, 1e16));
  topos_value y3 = topos_mul(t, p, topos_scalar(t, -1e16));
  topos_value loss = topos_add(t, topos_add(t, y1, y2), y3);
  grads g = backward_of(t, loss);
  expect_grad(&g, p, D(1.0), 1, "p");
  grads_free(&g);
}
END_TEST

START_TEST(backward_f32) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *x = tt_tensor(TOPOS_F32, 1, S(3), D(0.5, -1.25, 3));
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  topos_value loss = topos_sum(t, topos_mul(t, p, p));
  grads g = backward_of(t, loss);
  expect_grad(&g, p, D(1, -2.5, 6), 3, "2p");
  expect_grad(&g, loss, D(1), 1, "seed");
  grads_free(&g);
}
END_TEST

/* Backward twice on one run gives the same bits and leaves the run's
 * values alone. */
START_TEST(backward_repeatable) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = param_rand(t, 2, S(3, 4), 1, -1, 1);
  topos_value b = param_rand(t, 2, S(4, 2), 2, -1, 1);
  topos_value y = topos_log_softmax(t, topos_matmul(t, a, b), 1);
  topos_value loss = weighted(t, y, 3);
  grads g = backward_of(t, loss);
  topos_error err = {0};
  topos_tensor *ybefore = topos_tensor_retain(topos_run_of(g.run, y, &err));
  topos_field *f2 = topos_backward(g.run, loss, NULL, &err);
  ck_assert_ptr_nonnull(f2);
  for (int i = 0; i < topos_network_node_count(g.net); i++) {
    topos_value v = {a.tape, i};
    ck_assert(topos_tensor_bitwise_equal(topos_field_of(g.field, v, &err),
                                         topos_field_of(f2, v, &err)));
  }
  ck_assert(topos_tensor_bitwise_equal(ybefore, topos_run_of(g.run, y, &err)));
  topos_tensor_release(ybefore);
  topos_field_free(f2);
  grads_free(&g);
}
END_TEST

START_TEST(backward_errors) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = param_rand(t, 2, S(3, 4), 1, -1, 1);
  topos_value e = topos_exp(t, a);
  topos_value s = topos_sum(t, e);
  topos_value other = topos_sum(t, topos_tanh(t, a));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);

  /* non-rank-0 target */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(run, e, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert(err.message[0] != 0);
  /* invalid and foreign targets, NULL run */
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(run, TOPOS_NONE, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_tape *t2 = topos_tape_new(TOPOS_F64);
  topos_value f = topos_sum(t2, param_rand(t2, 1, S(2), 9, -1, 1));
  topos_tape_free(t2);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(run, f, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  topos_value past = {s.tape, 1000};
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(run, past, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(NULL, s, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_ptr_null(topos_backward(NULL, s, NULL, NULL));
  topos_run_free(run);

  /* a target the run did not evaluate */
  run = topos_forward_for(net, NULL, NULL, 0, &s, 1, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_backward(run, other, NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  /* the evaluated one works */
  topos_field *fld = topos_backward(run, s, NULL, &err);
  ck_assert_msg(fld != NULL, "%s", err.message);
  topos_field_free(fld);
  topos_run_free(run);
  topos_network_release(net);
}
END_TEST

START_TEST(fd_more_layouts) {
  UNARY_CHECK("unfold middle", topos_unfold(t, p, 1, 2, 2, 1), 3, S(2, 5, 2),
              -1, 1, 21);
  UNARY_CHECK("fold middle", topos_fold(t, p, 1, 5, 2, 2, 1), 4, S(2, 2, 2, 2),
              -1, 1, 22);
  UNARY_CHECK("permute 4d", topos_permute(t, p, (const int[]){3, 1, 0, 2}), 4,
              S(2, 3, 1, 2), -1, 1, 23);
  UNARY_CHECK("reshape of transpose",
              topos_reshape(t, topos_transpose(t, p), 1, S(12)), 2, S(3, 4), -1,
              1, 24);
  /* seven operands */
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value v[7];
  for (int i = 0; i < 7; i++) v[i] = param_rand(t, 1, S(2), 30 + i, -1, 1);
  check_grad(t, weighted(t, topos_concat(t, 7, v, 0), 40), "concat of 7");
}
END_TEST

/* pow with exponent 0 is constant 1: its gradient is exactly zero. */
START_TEST(pow_zero_exponent) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_from(t, 1, S(3), D(0, 2, -3));
  topos_value y = topos_pow(t, p, 0.0);
  topos_value loss = weighted(t, y, 1);
  grads g = backward_of(t, loss);
  double *v = tt_values(topos_run_of(g.run, y, NULL));
  for (int i = 0; i < 3; i++) ck_assert(v[i] == 1.0);
  free(v);
  expect_grad(&g, p, D(0, 0, 0), 3, "pow 0");
  grads_free(&g);
}
END_TEST

/* Index arithmetic (i32 add) on the way to gather takes no gradient and
 * does not disturb the table's. */
START_TEST(gather_computed_indices) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value table = param_from(t, 2, S(3, 2), D(1, 2, 3, 4, 5, 6));
  topos_value i1 = const_from(t, TOPOS_I32, 1, S(3), D(0, 1, 1));
  topos_value i2 = const_from(t, TOPOS_I32, 1, S(3), D(2, 0, 1));
  topos_value idx = topos_add(t, i1, i2); /* 2, 1, 2 */
  topos_value c = const_from(t, TOPOS_F64, 2, S(3, 2), D(1, 2, 4, 8, 16, 32));
  topos_value loss = topos_sum(t, topos_mul(t, topos_gather(t, table, idx), c));
  grads g = backward_of(t, loss);
  expect_grad(&g, table, D(0, 0, 4, 8, 17, 34), 6, "table");
  topos_error err = {0};
  const topos_tensor *gi = topos_field_of(g.field, idx, &err);
  ck_assert_ptr_nonnull(gi);
  ck_assert_int_eq(topos_tensor_dtype(gi), TOPOS_I32);
  expect_grad(&g, idx, D(0, 0, 0), 3, "idx");
  grads_free(&g);
}
END_TEST

START_TEST(backward_bf16) {
  topos_tape *t = topos_tape_new(TOPOS_BF16);
  topos_tensor *x = tt_tensor(TOPOS_BF16, 1, S(3), D(0.5, -1.25, 3));
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  topos_value loss = topos_sum(t, topos_mul(t, p, p));
  grads g = backward_of(t, loss);
  topos_error err = {0};
  ck_assert_int_eq(topos_tensor_dtype(topos_field_of(g.field, p, &err)),
                   TOPOS_BF16);
  expect_grad(&g, p, D(1, -2.5, 6), 3, "2p");
  grads_free(&g);
}
END_TEST

/* The target may be a leaf: its gradient is 1 and nothing else gets any. */
START_TEST(backward_leaf_target) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p = param_from(t, 0, NULL, D(2.5));
  topos_value q = param_from(t, 0, NULL, D(-1));
  topos_value y = topos_mul(t, p, q);
  grads g = backward_of(t, q);
  expect_grad(&g, q, D(1), 1, "q");
  expect_plus_zero(&g, p, "p");
  expect_plus_zero(&g, y, "y");
  grads_free(&g);
}
END_TEST

Suite *backward_suite(void) {
  Suite *s = suite_create("backward");
  TCase *tc = tcase_create("finite_differences");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, fd_elementwise_binary);
  tcase_add_test(tc, fd_elementwise_unary);
  tcase_add_test(tc, fd_matmul);
  tcase_add_test(tc, fd_layout);
  tcase_add_test(tc, fd_concat);
  tcase_add_test(tc, fd_reductions);
  tcase_add_test(tc, fd_indexing);
  tcase_add_test(tc, fd_network);
  tcase_add_test(tc, fd_more_layouts);
  suite_add_tcase(s, tc);

  tc = tcase_create("exact");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, zero_outside_ancestors);
  tcase_add_test(tc, gradients_skip_data_branches);
  tcase_add_test(tc, seed_is_one);
  tcase_add_test(tc, exact_simple_gradients);
  tcase_add_test(tc, input_gradient);
  tcase_add_test(tc, step_has_no_gradient);
  tcase_add_test(tc, relu_subgradient_at_zero);
  tcase_add_test(tc, max_along_ties_lowest_index);
  tcase_add_test(tc, maximum_ties_to_a);
  tcase_add_test(tc, gather_repeated_indices);
  tcase_add_test(tc, accumulation_order);
  tcase_add_test(tc, backward_f32);
  tcase_add_test(tc, backward_repeatable);
  tcase_add_test(tc, backward_errors);
  tcase_add_test(tc, pow_zero_exponent);
  tcase_add_test(tc, gather_computed_indices);
  tcase_add_test(tc, backward_bf16);
  tcase_add_test(tc, backward_leaf_target);
  suite_add_tcase(s, tc);
  return s;
}
