/*
 * test_tape.c - the recording API (engine/tape.c): leaves and slots, the
 * shape rule of every op with good and bad operands, the first-error rule
 * and its message, names, sealing and describe.  Every check goes through
 * the public header; values are inspected with topos_value_shape/dtype.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* A leaf of this dtype and shape: a parameter for floating dtypes, a
 * constant for i32 (index data). */
static topos_value leaf(topos_tape *t, topos_dtype d, int rank,
                        const int64_t *shape) {
  topos_error err = {0};
  topos_tensor *x = topos_tensor_zeros(d, rank, shape, &err);
  ck_assert_msg(x != NULL, "zeros: %s", err.message);
  topos_value v = d == TOPOS_I32 ? topos_constant(t, x) : topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert_msg(topos_value_ok(v), "leaf: %s",
                topos_tape_error(t) ? topos_tape_error(t) : "(no error)");
  return v;
}

static topos_value leaf64(topos_tape *t, int rank, const int64_t *shape) {
  return leaf(t, TOPOS_F64, rank, shape);
}

static topos_value idx(topos_tape *t, int rank, const int64_t *shape) {
  return leaf(t, TOPOS_I32, rank, shape);
}

/* The value was recorded with dtype d and this shape. */
static void expect_meta(topos_tape *t, topos_value v, topos_dtype d, int rank,
                        const int64_t *shape) {
  const char *e = topos_tape_error(t);
  ck_assert_msg(topos_value_ok(v), "unexpected error: %s", e ? e : "(none)");
  ck_assert_msg(e == NULL, "unexpected tape error: %s", e);
  ck_assert_int_eq(topos_value_dtype(t, v), d);
  int r = -1;
  const int64_t *s = topos_value_shape(t, v, &r);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(r, rank);
  for (int i = 0; i < rank; i++)
    ck_assert_msg(s[i] == shape[i], "axis %d: got %lld want %lld", i,
                  (long long)s[i], (long long)shape[i]);
}

/* The call failed: an invalid value, and the tape's first error names the
 * op and the node index it would have had ("node N"). */
static void expect_fail(topos_tape *t, topos_value v, const char *op) {
  ck_assert_msg(!topos_value_ok(v), "%s: expected an error", op);
  const char *e = topos_tape_error(t);
  ck_assert_msg(e != NULL, "%s: no tape error", op);
  ck_assert_msg(strstr(e, op) != NULL, "message lacks '%s': %s", op, e);
  char node[32];
  snprintf(node, sizeof node, "node %d", topos_tape_node_count(t));
  ck_assert_msg(strstr(e, node) != NULL, "message lacks '%s': %s", node, e);
}

/* Same, then frees the tape. */
static void fail_and_free(topos_tape *t, topos_value v, const char *op) {
  expect_fail(t, v, op);
  topos_tape_free(t);
}

static void expect_contains(const char *text, const char *part) {
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(strstr(text, part) != NULL, "'%s' not in: %s", part, text);
}

/* ------------------------------------------------------------ the tape */

START_TEST(tape_new_and_dtype) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(topos_tape_dtype(t), TOPOS_F32);
  ck_assert_int_eq(topos_tape_node_count(t), 0);
  ck_assert_ptr_null(topos_tape_error(t));
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_F64);
  ck_assert_int_eq(topos_tape_dtype(t), TOPOS_F64);
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_BF16);
  ck_assert_int_eq(topos_tape_dtype(t), TOPOS_BF16);
  topos_tape_free(t);
  ck_assert_ptr_null(topos_tape_new((topos_dtype)99));
  ck_assert_ptr_null(topos_tape_new((topos_dtype)-1));
  topos_tape_free(NULL);
}
END_TEST

START_TEST(tape_leaves_and_slots) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value p0 = leaf64(t, 2, S(2, 3));
  topos_error err = {0};
  topos_tensor *d = topos_tensor_zeros(TOPOS_F32, 1, S(4), &err);
  topos_value i0 = topos_input(t, d);
  topos_tensor_release(d);
  topos_value p1 = leaf64(t, 0, NULL);
  topos_tensor *c = topos_tensor_ones(TOPOS_F64, 1, S(5), &err);
  topos_value k = topos_constant(t, c);
  topos_tensor_release(c);
  d = topos_tensor_zeros(TOPOS_I32, 2, S(2, 2), &err);
  topos_value i1 = topos_input(t, d);
  topos_tensor_release(d);
  topos_value s = topos_scalar(t, 2.5);

  expect_meta(t, p0, TOPOS_F64, 2, S(2, 3));
  expect_meta(t, i0, TOPOS_F32, 1, S(4));
  expect_meta(t, p1, TOPOS_F64, 0, NULL);
  expect_meta(t, k, TOPOS_F64, 1, S(5));
  expect_meta(t, i1, TOPOS_I32, 2, S(2, 2));
  expect_meta(t, s, TOPOS_F64, 0, NULL); /* the tape's dtype */
  ck_assert_int_eq(topos_tape_node_count(t), 6);
  /* Node indices follow recording order. */
  ck_assert_int_eq(p0.index, 0);
  ck_assert_int_eq(i0.index, 1);
  ck_assert_int_eq(s.index, 5);

  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  ck_assert_int_eq(topos_network_node_count(net), 6);
  ck_assert_int_eq(topos_network_parameter_count(net), 2);
  ck_assert_int_eq(topos_network_input_count(net), 2);
  ck_assert_int_eq(topos_network_parameter(net, 0).index, p0.index);
  ck_assert_int_eq(topos_network_parameter(net, 1).index, p1.index);
  ck_assert_int_eq(topos_network_input(net, 0).index, i0.index);
  ck_assert_int_eq(topos_network_input(net, 1).index, i1.index);
  ck_assert_uint_eq(topos_network_parameter(net, 1).tape, p1.tape);
  ck_assert(!topos_value_ok(topos_network_parameter(net, 2)));
  ck_assert(!topos_value_ok(topos_network_parameter(net, -1)));
  ck_assert(!topos_value_ok(topos_network_input(net, 2)));
  ck_assert_int_eq(topos_network_value_dtype(net, i0), TOPOS_F32);
  int r = -1;
  const int64_t *sh = topos_network_value_shape(net, p0, &r);
  ck_assert_ptr_nonnull(sh);
  ck_assert_int_eq(r, 2);
  ck_assert_int_eq(sh[0], 2);
  ck_assert_int_eq(sh[1], 3);
  ck_assert_ptr_null(topos_network_value_shape(net, TOPOS_NONE, &r));
  topos_network_release(net);
}
END_TEST

START_TEST(tape_scalar_in_tape_dtype) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value s = topos_scalar(t, 0.1);
  expect_meta(t, s, TOPOS_F32, 0, NULL);
  topos_tape_free(t);
  t = topos_tape_new(TOPOS_BF16);
  s = topos_scalar(t, 3.0);
  expect_meta(t, s, TOPOS_BF16, 0, NULL);
  topos_tape_free(t);
}
END_TEST

START_TEST(tape_leaf_null_tensor) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  fail_and_free(t, topos_parameter(t, NULL), "parameter");
  t = topos_tape_new(TOPOS_F64);
  fail_and_free(t, topos_input(t, NULL), "input");
  t = topos_tape_new(TOPOS_F64);
  fail_and_free(t, topos_constant(t, NULL), "constant");
}
END_TEST

START_TEST(tape_null_tape_never_crashes) {
  topos_error err = {0};
  topos_tensor *x = topos_tensor_zeros(TOPOS_F64, 1, S(2), &err);
  ck_assert(!topos_value_ok(topos_parameter(NULL, x)));
  ck_assert(!topos_value_ok(topos_input(NULL, x)));
  ck_assert(!topos_value_ok(topos_constant(NULL, x)));
  ck_assert(!topos_value_ok(topos_scalar(NULL, 1.0)));
  topos_tensor_release(x);
  topos_value a = {1, 0};
  ck_assert(!topos_value_ok(topos_add(NULL, a, a)));
  ck_assert(!topos_value_ok(topos_exp(NULL, a)));
  ck_assert(!topos_value_ok(topos_matmul(NULL, a, a)));
  ck_assert(!topos_value_ok(topos_permute(NULL, a, (const int[]){0})));
  ck_assert(!topos_value_ok(topos_reshape(NULL, a, 1, S(2))));
  ck_assert(!topos_value_ok(topos_concat(NULL, 1, &a, 0)));
  ck_assert(!topos_value_ok(topos_sum(NULL, a)));
  ck_assert(!topos_value_ok(topos_gather(NULL, a, a)));
  ck_assert(!topos_value_ok(topos_name(NULL, a, "x")));
  (void)topos_tape_error(NULL);
  (void)topos_tape_node_count(NULL);
  int r = -1;
  ck_assert_ptr_null(topos_value_shape(NULL, a, &r));
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_tape_seal(NULL, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert_ptr_null(topos_tape_seal(NULL, NULL));
}
END_TEST

START_TEST(tape_invalid_operand) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 1, S(3));
  fail_and_free(t, topos_add(t, a, TOPOS_NONE), "add");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  fail_and_free(t, topos_exp(t, TOPOS_NONE), "exp");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  /* An index past the end of the tape. */
  topos_value past = {a.tape, 7};
  fail_and_free(t, topos_neg(t, past), "neg");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  topos_value vs[2] = {a, TOPOS_NONE};
  fail_and_free(t, topos_concat(t, 2, vs, 0), "concat");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  fail_and_free(t, topos_concat(t, 1, NULL, 0), "concat");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(3, 2));
  fail_and_free(t, topos_permute(t, a, NULL), "permute");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(3, 2));
  fail_and_free(t, topos_reshape(t, a, 2, NULL), "reshape");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(3, 2));
  fail_and_free(t, topos_broadcast(t, a, 2, NULL), "broadcast");
}
END_TEST

START_TEST(tape_foreign_value) {
  topos_tape *t1 = topos_tape_new(TOPOS_F64);
  topos_tape *t2 = topos_tape_new(TOPOS_F64);
  topos_value a1 = leaf64(t1, 1, S(3));
  topos_value a2 = leaf64(t2, 1, S(3));
  ck_assert_uint_ne(a1.tape, a2.tape);
  ck_assert_int_eq(a1.index, a2.index);
  /* Same index, same shape: only the tape id tells them apart. */
  expect_fail(t1, topos_add(t1, a1, a2), "add");
  ck_assert_ptr_null(topos_tape_error(t2));
  int r = -1;
  ck_assert_ptr_null(topos_value_shape(t1, a2, &r));
  /* t2 is untouched and still records. */
  expect_meta(t2, topos_exp(t2, a2), TOPOS_F64, 1, S(3));
  topos_tape_free(t1);
  t1 = topos_tape_new(TOPOS_F64);
  a1 = leaf64(t1, 1, S(3));
  fail_and_free(t1, topos_tanh(t1, a2), "tanh");
  t1 = topos_tape_new(TOPOS_F64);
  a1 = leaf64(t1, 1, S(3));
  ck_assert(!topos_value_ok(topos_name(t1, a2, "x")));
  ck_assert_ptr_nonnull(topos_tape_error(t1));
  topos_tape_free(t1);
  topos_tape_free(t2);
}
END_TEST

START_TEST(tape_first_error_sticks) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 3));
  topos_value b = leaf64(t, 2, S(4, 5));
  topos_value bad = topos_matmul(t, a, b);
  ck_assert(!topos_value_ok(bad));
  const char *e = topos_tape_error(t);
  ck_assert_ptr_nonnull(e);
  expect_contains(e, "matmul");
  expect_contains(e, "node 2");
  expect_contains(e, "[2,3]");
  expect_contains(e, "[4,5]");
  char first[1024];
  snprintf(first, sizeof first, "%s", e);
  int n = topos_tape_node_count(t);
  ck_assert_int_eq(n, 2);

  /* Later calls, even good ones, fail without changing the message. */
  ck_assert(!topos_value_ok(topos_add(t, a, a)));
  ck_assert(!topos_value_ok(topos_exp(t, b)));
  ck_assert(!topos_value_ok(topos_sum(t, a)));
  ck_assert(!topos_value_ok(topos_reshape(t, a, 1, S(7))));
  topos_error err = {0};
  topos_tensor *x = topos_tensor_zeros(TOPOS_F64, 1, S(2), &err);
  ck_assert(!topos_value_ok(topos_parameter(t, x)));
  topos_tensor_release(x);
  ck_assert_str_eq(topos_tape_error(t), first);
  ck_assert_int_eq(topos_tape_node_count(t), n);

  memset(&err, 0, sizeof err);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_null(net);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_str_eq(err.message, first);
}
END_TEST

START_TEST(tape_seal_errored_null_err) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 1, S(2));
  topos_value b = leaf64(t, 1, S(3));
  ck_assert(!topos_value_ok(topos_sub(t, a, b)));
  ck_assert_ptr_null(topos_tape_seal(t, NULL)); /* consumes, no crash */
}
END_TEST

START_TEST(tape_error_message_shapes) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 3));
  topos_value b = leaf64(t, 2, S(3, 2));
  topos_value c = leaf64(t, 1, S(6));
  ck_assert(topos_value_ok(topos_exp(t, c)));
  fail_and_free(t, topos_mul(t, a, b), "mul");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  b = leaf64(t, 2, S(3, 2));
  ck_assert(!topos_value_ok(topos_add(t, a, b)));
  expect_contains(topos_tape_error(t), "[2,3]");
  expect_contains(topos_tape_error(t), "[3,2]");
  expect_contains(topos_tape_error(t), "node 2");
  topos_tape_free(t);
}
END_TEST

/* ---------------------------------------------------------- elementwise */

typedef topos_value (*binary_fn)(topos_tape *, topos_value, topos_value);
typedef topos_value (*unary_fn)(topos_tape *, topos_value);

static const struct {
  const char *name;
  binary_fn fn;
} binaries[] = {{"add", topos_add},         {"sub", topos_sub},
                {"mul", topos_mul},         {"div", topos_div},
                {"maximum", topos_maximum}, {"step", topos_step}};

static topos_value pow3(topos_tape *t, topos_value a) {
  return topos_pow(t, a, 3.0);
}

static const struct {
  const char *name;
  unary_fn fn;
} unaries[] = {{"neg", topos_neg},   {"exp", topos_exp},   {"log", topos_log},
               {"sqrt", topos_sqrt}, {"tanh", topos_tanh}, {"pow", pow3},
               {"relu", topos_relu}, {"erf", topos_erf}};

START_TEST(shape_binary_good) {
  const topos_dtype dts[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  for (size_t i = 0; i < sizeof binaries / sizeof *binaries; i++)
    for (int k = 0; k < 3; k++) {
      topos_tape *t = topos_tape_new(TOPOS_F64);
      topos_value a = leaf(t, dts[k], 2, S(2, 3));
      topos_value b = leaf(t, dts[k], 2, S(2, 3));
      expect_meta(t, binaries[i].fn(t, a, b), dts[k], 2, S(2, 3));
      a = leaf(t, dts[k], 0, NULL);
      b = leaf(t, dts[k], 0, NULL);
      expect_meta(t, binaries[i].fn(t, a, b), dts[k], 0, NULL);
      a = leaf(t, dts[k], 3, S(2, 0, 4));
      b = leaf(t, dts[k], 3, S(2, 0, 4));
      expect_meta(t, binaries[i].fn(t, a, b), dts[k], 3, S(2, 0, 4));
      topos_tape_free(t);
    }
}
END_TEST

START_TEST(shape_binary_bad) {
  for (size_t i = 0; i < sizeof binaries / sizeof *binaries; i++) {
    const char *op = binaries[i].name;
    binary_fn fn = binaries[i].fn;
    /* transposed shapes */
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value a = leaf64(t, 2, S(2, 3)), b = leaf64(t, 2, S(3, 2));
    fail_and_free(t, fn(t, a, b), op);
    /* no implicit broadcasting: [2,3] with [3], [2,3] with a scalar */
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(2, 3));
    b = leaf64(t, 1, S(3));
    fail_and_free(t, fn(t, a, b), op);
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(2, 3));
    b = leaf64(t, 0, NULL);
    fail_and_free(t, fn(t, a, b), op);
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(1, 3));
    b = leaf64(t, 2, S(2, 3));
    fail_and_free(t, fn(t, a, b), op);
    /* dtype mismatch */
    t = topos_tape_new(TOPOS_F64);
    a = leaf(t, TOPOS_F32, 2, S(2, 3));
    b = leaf(t, TOPOS_F64, 2, S(2, 3));
    fail_and_free(t, fn(t, a, b), op);
    t = topos_tape_new(TOPOS_F64);
    a = leaf(t, TOPOS_BF16, 1, S(3));
    b = leaf(t, TOPOS_F32, 1, S(3));
    fail_and_free(t, fn(t, a, b), op);
    t = topos_tape_new(TOPOS_F64);
    a = leaf(t, TOPOS_F64, 1, S(3));
    b = idx(t, 1, S(3));
    fail_and_free(t, fn(t, a, b), op);
  }
}
END_TEST

START_TEST(shape_add_i32) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = idx(t, 1, S(4)), b = idx(t, 1, S(4));
  expect_meta(t, topos_add(t, a, b), TOPOS_I32, 1, S(4));
  topos_tape_free(t);
  /* Only add does index arithmetic. */
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 1, S(4));
  b = idx(t, 1, S(4));
  fail_and_free(t, topos_mul(t, a, b), "mul");
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 1, S(4));
  b = idx(t, 1, S(4));
  fail_and_free(t, topos_div(t, a, b), "div");
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 1, S(4));
  b = idx(t, 1, S(3));
  fail_and_free(t, topos_add(t, a, b), "add");
}
END_TEST

START_TEST(shape_unary) {
  for (size_t i = 0; i < sizeof unaries / sizeof *unaries; i++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value a = leaf(t, TOPOS_F32, 3, S(2, 3, 4));
    expect_meta(t, unaries[i].fn(t, a), TOPOS_F32, 3, S(2, 3, 4));
    a = leaf(t, TOPOS_F64, 0, NULL);
    expect_meta(t, unaries[i].fn(t, a), TOPOS_F64, 0, NULL);
    a = leaf(t, TOPOS_BF16, 1, S(5));
    expect_meta(t, unaries[i].fn(t, a), TOPOS_BF16, 1, S(5));
    topos_tape_free(t);
    /* index data is not differentiable arithmetic */
    t = topos_tape_new(TOPOS_F64);
    a = idx(t, 1, S(3));
    fail_and_free(t, unaries[i].fn(t, a), unaries[i].name);
  }
}
END_TEST

/* --------------------------------------------------- linear algebra */

START_TEST(shape_matmul) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value a = leaf(t, TOPOS_F32, 2, S(2, 3));
  topos_value b = leaf(t, TOPOS_F32, 2, S(3, 4));
  expect_meta(t, topos_matmul(t, a, b), TOPOS_F32, 2, S(2, 4));
  a = leaf(t, TOPOS_F64, 3, S(5, 2, 3));
  b = leaf(t, TOPOS_F64, 3, S(5, 3, 7));
  expect_meta(t, topos_matmul(t, a, b), TOPOS_F64, 3, S(5, 2, 7));
  a = leaf(t, TOPOS_BF16, 2, S(1, 1));
  b = leaf(t, TOPOS_BF16, 2, S(1, 9));
  expect_meta(t, topos_matmul(t, a, b), TOPOS_BF16, 2, S(1, 9));
  topos_tape_free(t);

  /* inner mismatch */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  b = leaf64(t, 2, S(4, 5));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  /* batched inner mismatch */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 3, S(5, 2, 3));
  b = leaf64(t, 3, S(5, 4, 7));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  /* batch mismatch */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 3, S(5, 2, 3));
  b = leaf64(t, 3, S(4, 3, 7));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  /* rank mismatch, rank 1, rank 4 */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 3, S(5, 2, 3));
  b = leaf64(t, 2, S(3, 7));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  b = leaf64(t, 1, S(3));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 4, S(1, 1, 2, 3));
  b = leaf64(t, 4, S(1, 1, 3, 2));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  /* dtype mismatch and i32 */
  t = topos_tape_new(TOPOS_F64);
  a = leaf(t, TOPOS_F32, 2, S(2, 3));
  b = leaf(t, TOPOS_F64, 2, S(3, 2));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 2, S(2, 3));
  b = idx(t, 2, S(3, 2));
  fail_and_free(t, topos_matmul(t, a, b), "matmul");
}
END_TEST

START_TEST(shape_transpose_permute) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 3));
  expect_meta(t, topos_transpose(t, a), TOPOS_F64, 2, S(3, 2));
  topos_value c = leaf64(t, 3, S(2, 3, 4));
  expect_meta(t, topos_permute(t, c, (const int[]){2, 0, 1}), TOPOS_F64, 3,
              S(4, 2, 3));
  expect_meta(t, topos_permute(t, c, (const int[]){0, 1, 2}), TOPOS_F64, 3,
              S(2, 3, 4));
  expect_meta(t, topos_permute(t, c, (const int[]){1, 2, 0}), TOPOS_F64, 3,
              S(3, 4, 2));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 3, S(2, 3, 4));
  fail_and_free(t, topos_transpose(t, a), "transpose");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(2));
  fail_and_free(t, topos_transpose(t, a), "transpose");
  const int bad[][3] = {{0, 0, 1}, {0, 1, 3}, {-1, 0, 1}, {2, 2, 2}};
  for (int i = 0; i < 4; i++) {
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 3, S(2, 3, 4));
    fail_and_free(t, topos_permute(t, a, bad[i]), "permute");
  }
}
END_TEST

START_TEST(shape_reshape) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 3, S(2, 3, 4));
  expect_meta(t, topos_reshape(t, a, 2, S(6, 4)), TOPOS_F64, 2, S(6, 4));
  expect_meta(t, topos_reshape(t, a, 1, S(24)), TOPOS_F64, 1, S(24));
  expect_meta(t, topos_reshape(t, a, 4, S(1, 24, 1, 1)), TOPOS_F64, 4,
              S(1, 24, 1, 1));
  topos_value one = leaf64(t, 2, S(1, 1));
  expect_meta(t, topos_reshape(t, one, 0, NULL), TOPOS_F64, 0, NULL);
  topos_value s = leaf64(t, 0, NULL);
  expect_meta(t, topos_reshape(t, s, 1, S(1)), TOPOS_F64, 1, S(1));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_reshape(t, a, 2, S(5, 5)), "reshape");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_reshape(t, a, 1, S(7)), "reshape");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_reshape(t, a, 2, S(-2, -3)), "reshape");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_reshape(t, a, 9, S(1, 1, 1, 1, 1, 1, 2, 3, 1)),
                "reshape");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_reshape(t, a, -1, S(6)), "reshape");
}
END_TEST

START_TEST(shape_narrow) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(5, 3));
  expect_meta(t, topos_narrow(t, a, 0, 1, 3), TOPOS_F64, 2, S(3, 3));
  expect_meta(t, topos_narrow(t, a, 1, 2, 1), TOPOS_F64, 2, S(5, 1));
  expect_meta(t, topos_narrow(t, a, 0, 0, 5), TOPOS_F64, 2, S(5, 3));
  topos_tape_free(t);

  const struct {
    int axis;
    int64_t start, length;
  } bad[] = {{0, 3, 3}, {0, 5, 1}, {0, -1, 2}, {0, 0, -1},
             {1, 2, 2}, {2, 0, 1}, {-1, 0, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(5, 3));
    fail_and_free(t,
                  topos_narrow(t, a, bad[i].axis, bad[i].start, bad[i].length),
                  "narrow");
  }
}
END_TEST

START_TEST(shape_pad) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(5, 3));
  expect_meta(t, topos_pad(t, a, 1, 2, 1), TOPOS_F64, 2, S(5, 6));
  expect_meta(t, topos_pad(t, a, 0, 0, 4), TOPOS_F64, 2, S(9, 3));
  expect_meta(t, topos_pad(t, a, 0, 0, 0), TOPOS_F64, 2, S(5, 3));
  topos_tape_free(t);

  const struct {
    int axis;
    int64_t before, after;
  } bad[] = {{0, -1, 0}, {0, 0, -2}, {2, 1, 1}, {-1, 1, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(5, 3));
    fail_and_free(t, topos_pad(t, a, bad[i].axis, bad[i].before, bad[i].after),
                  "pad");
  }
}
END_TEST

START_TEST(shape_unfold) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 10));
  /* span 3, count (10-3)/2+1 = 4 */
  expect_meta(t, topos_unfold(t, a, 1, 3, 2, 1), TOPOS_F64, 3, S(2, 4, 3));
  /* span (3-1)*2+1 = 5, count (10-5)/2+1 = 3 */
  expect_meta(t, topos_unfold(t, a, 1, 3, 2, 2), TOPOS_F64, 3, S(2, 3, 3));
  /* span 10 = extent: one window */
  expect_meta(t, topos_unfold(t, a, 1, 10, 1, 1), TOPOS_F64, 3, S(2, 1, 10));
  /* axis 0 of extent 2, size 1 step 1 */
  expect_meta(t, topos_unfold(t, a, 0, 1, 1, 1), TOPOS_F64, 3, S(2, 1, 10));
  /* size 2 step 3 on extent 10: count (10-2)/3+1 = 3 */
  expect_meta(t, topos_unfold(t, a, 1, 2, 3, 1), TOPOS_F64, 3, S(2, 3, 2));
  topos_tape_free(t);

  const struct {
    int axis;
    int64_t size, step, dilation;
  } bad[] = {{1, 11, 1, 1}, {1, 6, 1, 2}, /* span 11 > 10 */
             {1, 3, 0, 1},  {1, 3, -1, 1}, {1, 3, 1, 0},
             {1, 0, 1, 1},  {2, 2, 1, 1},  {-1, 2, 1, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 2, S(2, 10));
    fail_and_free(t,
                  topos_unfold(t, a, bad[i].axis, bad[i].size, bad[i].step,
                               bad[i].dilation),
                  "unfold");
  }
}
END_TEST

START_TEST(shape_fold) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 3, S(2, 4, 3));
  expect_meta(t, topos_fold(t, a, 1, 10, 3, 2, 1), TOPOS_F64, 2, S(2, 10));
  /* extent 9 also gives 4 windows of span 3 at step 2 */
  expect_meta(t, topos_fold(t, a, 1, 9, 3, 2, 1), TOPOS_F64, 2, S(2, 9));
  /* dilation 2: span 5, (11-5)/2+1 = 4 */
  expect_meta(t, topos_fold(t, a, 1, 11, 3, 2, 2), TOPOS_F64, 2, S(2, 11));
  topos_value b = leaf64(t, 2, S(4, 3));
  expect_meta(t, topos_fold(t, b, 0, 6, 3, 1, 1), TOPOS_F64, 1, S(6));
  topos_tape_free(t);

  const struct {
    int axis;
    int64_t extent, size, step, dilation;
  } bad[] = {
      {1, 12, 3, 2, 1}, /* 5 windows, not 4 */
      {1, 8, 3, 2, 1},  /* 3 windows */
      {1, 10, 2, 2, 1}, /* size 2 but the window axis has 3 */
      {1, 10, 3, 0, 1}, /* step 0 */
      {1, 10, 3, 2, 0}, /* dilation 0 */
      {1, 2, 3, 2, 1},  /* span > extent */
      {2, 10, 3, 2, 1}, /* axis+1 out of range */
      {-1, 10, 3, 2, 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 3, S(2, 4, 3));
    fail_and_free(t,
                  topos_fold(t, a, bad[i].axis, bad[i].extent, bad[i].size,
                             bad[i].step, bad[i].dilation),
                  "fold");
  }
}
END_TEST

START_TEST(shape_concat) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value v[3] = {leaf64(t, 2, S(2, 3)), leaf64(t, 2, S(2, 1)),
                      leaf64(t, 2, S(2, 2))};
  expect_meta(t, topos_concat(t, 3, v, 1), TOPOS_F64, 2, S(2, 6));
  topos_value w[3] = {leaf64(t, 2, S(1, 3)), leaf64(t, 2, S(4, 3)),
                      leaf64(t, 2, S(2, 3))};
  expect_meta(t, topos_concat(t, 3, w, 0), TOPOS_F64, 2, S(7, 3));
  expect_meta(t, topos_concat(t, 1, w, 0), TOPOS_F64, 2, S(1, 3));
  topos_tape_free(t);

  /* a non-axis extent differs */
  t = topos_tape_new(TOPOS_F64);
  topos_value x[3] = {leaf64(t, 2, S(2, 3)), leaf64(t, 2, S(3, 1)),
                      leaf64(t, 2, S(2, 2))};
  fail_and_free(t, topos_concat(t, 3, x, 1), "concat");
  /* ranks differ */
  t = topos_tape_new(TOPOS_F64);
  topos_value y[2] = {leaf64(t, 2, S(2, 3)), leaf64(t, 1, S(3))};
  fail_and_free(t, topos_concat(t, 2, y, 0), "concat");
  /* dtypes differ */
  t = topos_tape_new(TOPOS_F64);
  topos_value z[2] = {leaf(t, TOPOS_F64, 1, S(3)), leaf(t, TOPOS_F32, 1, S(3))};
  fail_and_free(t, topos_concat(t, 2, z, 0), "concat");
  /* axis out of range */
  t = topos_tape_new(TOPOS_F64);
  topos_value u[2] = {leaf64(t, 2, S(2, 3)), leaf64(t, 2, S(2, 3))};
  fail_and_free(t, topos_concat(t, 2, u, 2), "concat");
  t = topos_tape_new(TOPOS_F64);
  u[0] = leaf64(t, 2, S(2, 3));
  u[1] = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_concat(t, 2, u, -1), "concat");
  /* no operands */
  t = topos_tape_new(TOPOS_F64);
  u[0] = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_concat(t, 0, u, 0), "concat");
  /* rank 0 has no axis */
  t = topos_tape_new(TOPOS_F64);
  u[0] = leaf64(t, 0, NULL);
  u[1] = leaf64(t, 0, NULL);
  fail_and_free(t, topos_concat(t, 2, u, 0), "concat");
}
END_TEST

START_TEST(shape_broadcast) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value s = leaf64(t, 0, NULL);
  expect_meta(t, topos_broadcast(t, s, 2, S(2, 3)), TOPOS_F64, 2, S(2, 3));
  expect_meta(t, topos_broadcast(t, s, 0, NULL), TOPOS_F64, 0, NULL);
  topos_value r = leaf64(t, 2, S(1, 3));
  expect_meta(t, topos_broadcast(t, r, 2, S(4, 3)), TOPOS_F64, 2, S(4, 3));
  topos_value c = leaf64(t, 3, S(2, 1, 1));
  expect_meta(t, topos_broadcast(t, c, 3, S(2, 5, 6)), TOPOS_F64, 3,
              S(2, 5, 6));
  topos_value same = leaf64(t, 2, S(2, 3));
  expect_meta(t, topos_broadcast(t, same, 2, S(2, 3)), TOPOS_F64, 2, S(2, 3));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_broadcast(t, a, 2, S(4, 3)), "broadcast");
  /* equal rank required: no implicit leading axes */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(3));
  fail_and_free(t, topos_broadcast(t, a, 2, S(2, 3)), "broadcast");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(1, 3));
  fail_and_free(t, topos_broadcast(t, a, 1, S(3)), "broadcast");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 0, NULL);
  fail_and_free(t, topos_broadcast(t, a, 2, S(2, -3)), "broadcast");
}
END_TEST

START_TEST(shape_broadcast_along) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 2, S(2, 3));
  expect_meta(t, topos_broadcast_along(t, a, 0, 4), TOPOS_F64, 3, S(4, 2, 3));
  expect_meta(t, topos_broadcast_along(t, a, 1, 4), TOPOS_F64, 3, S(2, 4, 3));
  expect_meta(t, topos_broadcast_along(t, a, 2, 4), TOPOS_F64, 3, S(2, 3, 4));
  topos_value s = leaf64(t, 0, NULL);
  expect_meta(t, topos_broadcast_along(t, s, 0, 5), TOPOS_F64, 1, S(5));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_broadcast_along(t, a, 3, 4), "broadcast_along");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_broadcast_along(t, a, -1, 4), "broadcast_along");
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 2, S(2, 3));
  fail_and_free(t, topos_broadcast_along(t, a, 0, -4), "broadcast_along");
  /* rank 8 + 1 exceeds TOPOS_MAX_RANK */
  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 8, S(1, 1, 1, 1, 1, 1, 1, 1));
  fail_and_free(t, topos_broadcast_along(t, a, 0, 2), "broadcast_along");
}
END_TEST

/* ----------------------------------------------------------- reductions */

START_TEST(shape_reductions) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf(t, TOPOS_F32, 3, S(2, 3, 4));
  expect_meta(t, topos_sum(t, a), TOPOS_F32, 0, NULL);
  expect_meta(t, topos_sum_along(t, a, 0), TOPOS_F32, 2, S(3, 4));
  expect_meta(t, topos_sum_along(t, a, 1), TOPOS_F32, 2, S(2, 4));
  expect_meta(t, topos_sum_along(t, a, 2), TOPOS_F32, 2, S(2, 3));
  expect_meta(t, topos_max_along(t, a, 1), TOPOS_F32, 2, S(2, 4));
  expect_meta(t, topos_logsumexp(t, a, 2), TOPOS_F32, 2, S(2, 3));
  expect_meta(t, topos_log_softmax(t, a, 1), TOPOS_F32, 3, S(2, 3, 4));
  topos_value s = leaf64(t, 0, NULL);
  expect_meta(t, topos_sum(t, s), TOPOS_F64, 0, NULL);
  topos_value v = leaf64(t, 1, S(7));
  expect_meta(t, topos_sum_along(t, v, 0), TOPOS_F64, 0, NULL);
  expect_meta(t, topos_max_along(t, v, 0), TOPOS_F64, 0, NULL);
  expect_meta(t, topos_logsumexp(t, v, 0), TOPOS_F64, 0, NULL);
  topos_tape_free(t);

  const char *names[4] = {"sum_along", "max_along", "logsumexp", "log_softmax"};
  for (int k = 0; k < 4; k++) {
    for (int axis = -1; axis <= 3; axis += 4) {
      t = topos_tape_new(TOPOS_F64);
      a = leaf64(t, 3, S(2, 3, 4));
      topos_value r = k == 0   ? topos_sum_along(t, a, axis)
                      : k == 1 ? topos_max_along(t, a, axis)
                      : k == 2 ? topos_logsumexp(t, a, axis)
                               : topos_log_softmax(t, a, axis);
      fail_and_free(t, r, names[k]);
    }
    /* a scalar has no axis 0 */
    t = topos_tape_new(TOPOS_F64);
    a = leaf64(t, 0, NULL);
    topos_value r = k == 0   ? topos_sum_along(t, a, 0)
                    : k == 1 ? topos_max_along(t, a, 0)
                    : k == 2 ? topos_logsumexp(t, a, 0)
                             : topos_log_softmax(t, a, 0);
    fail_and_free(t, r, names[k]);
  }
  /* softmax rows and max_along are floating ops */
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 2, S(2, 3));
  fail_and_free(t, topos_log_softmax(t, a, 1), "log_softmax");
  t = topos_tape_new(TOPOS_F64);
  a = idx(t, 2, S(2, 3));
  fail_and_free(t, topos_logsumexp(t, a, 1), "logsumexp");
}
END_TEST

/* ------------------------------------------------------------- indexing */

START_TEST(shape_gather) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value table = leaf(t, TOPOS_F32, 2, S(5, 3));
  topos_value i = idx(t, 1, S(4));
  expect_meta(t, topos_gather(t, table, i), TOPOS_F32, 2, S(4, 3));
  topos_value t64 = leaf64(t, 2, S(2, 7));
  topos_value i1 = idx(t, 1, S(1));
  expect_meta(t, topos_gather(t, t64, i1), TOPOS_F64, 2, S(1, 7));
  topos_tape_free(t);

  /* idx not i32 */
  t = topos_tape_new(TOPOS_F64);
  table = leaf64(t, 2, S(5, 3));
  i = leaf64(t, 1, S(4));
  fail_and_free(t, topos_gather(t, table, i), "gather");
  /* idx rank 2, rank 0 */
  t = topos_tape_new(TOPOS_F64);
  table = leaf64(t, 2, S(5, 3));
  i = idx(t, 2, S(2, 2));
  fail_and_free(t, topos_gather(t, table, i), "gather");
  t = topos_tape_new(TOPOS_F64);
  table = leaf64(t, 2, S(5, 3));
  i = idx(t, 0, NULL);
  fail_and_free(t, topos_gather(t, table, i), "gather");
  /* table rank 1, rank 3 */
  t = topos_tape_new(TOPOS_F64);
  table = leaf64(t, 1, S(5));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_gather(t, table, i), "gather");
  t = topos_tape_new(TOPOS_F64);
  table = leaf64(t, 3, S(5, 3, 2));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_gather(t, table, i), "gather");
  /* table i32 */
  t = topos_tape_new(TOPOS_F64);
  table = idx(t, 2, S(5, 3));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_gather(t, table, i), "gather");
}
END_TEST

START_TEST(shape_scatter) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value rows = leaf64(t, 2, S(4, 3));
  topos_value i = idx(t, 1, S(4));
  expect_meta(t, topos_scatter(t, rows, i, 5), TOPOS_F64, 2, S(5, 3));
  expect_meta(t, topos_scatter(t, rows, i, 1), TOPOS_F64, 2, S(1, 3));
  topos_value r32 = leaf(t, TOPOS_F32, 2, S(4, 2));
  expect_meta(t, topos_scatter(t, r32, i, 9), TOPOS_F32, 2, S(9, 2));
  topos_tape_free(t);

  /* idx length differs from the row count */
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 2, S(4, 3));
  i = idx(t, 1, S(3));
  fail_and_free(t, topos_scatter(t, rows, i, 5), "scatter");
  /* idx not i32 */
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 2, S(4, 3));
  i = leaf64(t, 1, S(4));
  fail_and_free(t, topos_scatter(t, rows, i, 5), "scatter");
  /* idx rank 2 */
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 2, S(4, 3));
  i = idx(t, 2, S(4, 1));
  fail_and_free(t, topos_scatter(t, rows, i, 5), "scatter");
  /* rows rank 1 and rank 3 */
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 1, S(4));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_scatter(t, rows, i, 5), "scatter");
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 3, S(4, 3, 1));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_scatter(t, rows, i, 5), "scatter");
  /* negative extent */
  t = topos_tape_new(TOPOS_F64);
  rows = leaf64(t, 2, S(4, 3));
  i = idx(t, 1, S(4));
  fail_and_free(t, topos_scatter(t, rows, i, -1), "scatter");
}
END_TEST

/* ---------------------------------------------------------------- names */

START_TEST(names_find_and_name_of) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value w = leaf64(t, 2, S(2, 2));
  topos_value w2 = topos_name(t, w, "w");
  ck_assert_int_eq(w2.index, w.index);
  ck_assert_uint_eq(w2.tape, w.tape);
  topos_value y = topos_exp(t, w);
  topos_value loss = topos_name(t, topos_sum(t, y), "loss");
  ck_assert(topos_value_ok(loss));
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_value f = topos_network_find(net, "loss");
  ck_assert_int_eq(f.index, loss.index);
  ck_assert_uint_eq(f.tape, loss.tape);
  ck_assert_int_eq(topos_network_find(net, "w").index, w.index);
  ck_assert(!topos_value_ok(topos_network_find(net, "nope")));
  ck_assert(!topos_value_ok(topos_network_find(net, "")));
  ck_assert(!topos_value_ok(topos_network_find(net, NULL)));
  ck_assert(!topos_value_ok(topos_network_find(NULL, "w")));
  ck_assert_str_eq(topos_network_name_of(net, w), "w");
  ck_assert_str_eq(topos_network_name_of(net, loss), "loss");
  ck_assert_ptr_null(topos_network_name_of(net, y));
  ck_assert_ptr_null(topos_network_name_of(net, TOPOS_NONE));
  ck_assert_ptr_null(topos_network_name_of(NULL, w));
  topos_network_release(net);
}
END_TEST

START_TEST(names_duplicate_is_error) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t, 1, S(2));
  topos_value b = leaf64(t, 1, S(2));
  ck_assert(topos_value_ok(topos_name(t, a, "x")));
  topos_value r = topos_name(t, b, "x");
  ck_assert(!topos_value_ok(r));
  const char *e = topos_tape_error(t);
  ck_assert_ptr_nonnull(e);
  expect_contains(e, "x");
  topos_error err = {0};
  ck_assert_ptr_null(topos_tape_seal(t, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);

  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(2));
  ck_assert(!topos_value_ok(topos_name(t, TOPOS_NONE, "x")));
  ck_assert_ptr_nonnull(topos_tape_error(t));
  topos_tape_free(t);

  t = topos_tape_new(TOPOS_F64);
  a = leaf64(t, 1, S(2));
  ck_assert(!topos_value_ok(topos_name(t, a, NULL)));
  ck_assert_ptr_nonnull(topos_tape_error(t));
  topos_tape_free(t);
}
END_TEST

/* A name is UTF-8 (proto3 strings carry it out): multi-byte names are
 * kept byte for byte; malformed ones fail with the byte named. */
START_TEST(names_must_be_utf8) {
  const char *good[] = {"\xce\xbb_\xe6\x8d\x9f\xe5\xa4\xb1", /* λ_损失 */
                        "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "a"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value v = topos_name(t, leaf64(t, 1, S(2)), good[i]);
    ck_assert_msg(topos_value_ok(v), "%zu: %s", i, topos_tape_error(t));
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_ptr_nonnull(net);
    ck_assert_str_eq(topos_network_name_of(net, v), good[i]);
    ck_assert_int_eq(topos_network_find(net, good[i]).index, v.index);
    topos_network_release(net);
  }
  struct {
    const char *name, *expect;
  } bad[] = {
      {"ab\xc0\x80", "overlong encoding) at byte 2"},
      {"\xe0\x80\xaf", "overlong"},
      {"x\xed\xa0\x80", "surrogate) at byte 1"},
      {"\xf4\x90\x80\x80", "above U+10FFFF"},
      {"loss\xe6\x8d", "truncated sequence) at byte 4"},
      {"\x80", "stray continuation byte) at byte 0"},
      {"\xff", "cannot start a character"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value a = leaf64(t, 1, S(2));
    ck_assert(!topos_value_ok(topos_name(t, a, bad[i].name)));
    const char *e = topos_tape_error(t);
    ck_assert_ptr_nonnull(e);
    expect_contains(e, "name (node 0): not valid UTF-8");
    expect_contains(e, bad[i].expect);
    topos_error err = {0};
    ck_assert_ptr_null(topos_tape_seal(t, &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  }
}
END_TEST

/* Names are per tape: two tapes may use the same name. */
START_TEST(names_per_tape) {
  topos_tape *t1 = topos_tape_new(TOPOS_F64);
  topos_tape *t2 = topos_tape_new(TOPOS_F64);
  ck_assert(topos_value_ok(topos_name(t1, leaf64(t1, 1, S(2)), "x")));
  ck_assert(topos_value_ok(topos_name(t2, leaf64(t2, 1, S(2)), "x")));
  ck_assert_ptr_null(topos_tape_error(t1));
  ck_assert_ptr_null(topos_tape_error(t2));
  topos_tape_free(t1);
  topos_tape_free(t2);
}
END_TEST

/* ---------------------------------------------------- seal and describe */

START_TEST(seal_describe) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = topos_name(t, leaf(t, TOPOS_F32, 2, S(4, 3)), "x");
  topos_value w = topos_name(t, leaf(t, TOPOS_F32, 2, S(3, 2)), "w1");
  topos_value h = topos_matmul(t, x, w);
  topos_value loss = topos_name(t, topos_sum(t, topos_tanh(t, h)), "loss");
  ck_assert(topos_value_ok(loss));
  int n = topos_tape_node_count(t);
  ck_assert_int_eq(n, 5);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  ck_assert_int_eq(topos_network_node_count(net), n);
  /* values of the tape stay valid for the network */
  int r = -1;
  const int64_t *s = topos_network_value_shape(net, h, &r);
  ck_assert_int_eq(r, 2);
  ck_assert_int_eq(s[0], 4);
  ck_assert_int_eq(s[1], 2);
  ck_assert_int_eq(topos_network_value_dtype(net, loss), TOPOS_F32);
  s = topos_network_value_shape(net, loss, &r);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(r, 0);

  char *d = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
  ck_assert_msg(d != NULL, "%s", err.message);
  int lines = 0;
  for (const char *p = d; *p; p++) lines += *p == '\n';
  if (d[0] && d[strlen(d) - 1] != '\n') lines++;
  ck_assert_msg(lines == n, "describe has %d lines for %d nodes:\n%s", lines, n,
                d);
  expect_contains(d, "matmul");
  expect_contains(d, "tanh");
  expect_contains(d, "sum");
  expect_contains(d, "parameter");
  expect_contains(d, "loss");
  expect_contains(d, "w1");
  expect_contains(d, "f32");
  expect_contains(d, "[4,2]");
  expect_contains(d, "[3,2]");
  topos_free(d);

  /* A retained network outlives the release of the first reference. */
  topos_network *again = topos_network_retain(net);
  ck_assert_ptr_eq(again, net);
  topos_network_release(net);
  ck_assert_int_eq(topos_network_node_count(again), n);
  topos_network_release(again);
  ck_assert_ptr_null(topos_network_retain(NULL));
  topos_network_release(NULL);
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_network_describe(NULL, TOPOS_FORMAT_TEXT, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
}
END_TEST

/* The network keeps the tensors it was recorded with: releasing the
 * caller's reference after recording is fine. */
START_TEST(seal_keeps_leaf_tensors) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  double vals[3] = {1.5, -2.0, 4.25};
  topos_tensor *x = tt_tensor(TOPOS_F64, 1, S(3), vals);
  topos_value p = topos_parameter(t, x);
  topos_tensor_release(x);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_params *ps = topos_network_parameters(net);
  ck_assert_ptr_nonnull(ps);
  ck_assert_int_eq(topos_params_count(ps), 1);
  tt_assert_values(topos_params_get(ps, 0), vals, 3);
  (void)p;
  topos_params_free(ps);
  topos_network_release(net);
}
END_TEST

/* Values from the network in network queries: foreign and invalid values
 * give NULL/none, never a crash. */
START_TEST(network_queries_foreign) {
  topos_tape *t1 = topos_tape_new(TOPOS_F64);
  topos_tape *t2 = topos_tape_new(TOPOS_F64);
  topos_value a = leaf64(t1, 1, S(2));
  topos_value b = leaf64(t2, 1, S(2));
  topos_error err = {0};
  topos_network *n1 = topos_tape_seal(t1, &err);
  topos_network *n2 = topos_tape_seal(t2, &err);
  ck_assert_ptr_nonnull(n1);
  ck_assert_ptr_nonnull(n2);
  int r = -1;
  ck_assert_ptr_nonnull(topos_network_value_shape(n1, a, &r));
  ck_assert_ptr_null(topos_network_value_shape(n1, b, &r));
  ck_assert_ptr_null(topos_network_value_shape(n2, a, &r));
  ck_assert_ptr_null(topos_network_value_shape(NULL, a, &r));
  ck_assert_ptr_null(topos_network_name_of(n1, b));
  (void)topos_network_node_count(NULL);
  (void)topos_network_parameter_count(NULL);
  ck_assert(!topos_value_ok(topos_network_parameter(NULL, 0)));
  topos_network_release(n1);
  topos_network_release(n2);
}
END_TEST

Suite *tape_suite(void) {
  Suite *s = suite_create("tape");
  TCase *tc = tcase_create("recording");
  tcase_add_test(tc, tape_new_and_dtype);
  tcase_add_test(tc, tape_leaves_and_slots);
  tcase_add_test(tc, tape_scalar_in_tape_dtype);
  tcase_add_test(tc, tape_leaf_null_tensor);
  tcase_add_test(tc, tape_null_tape_never_crashes);
  tcase_add_test(tc, tape_invalid_operand);
  tcase_add_test(tc, tape_foreign_value);
  tcase_add_test(tc, tape_first_error_sticks);
  tcase_add_test(tc, tape_seal_errored_null_err);
  tcase_add_test(tc, tape_error_message_shapes);
  suite_add_tcase(s, tc);

  tc = tcase_create("shapes");
  tcase_add_test(tc, shape_binary_good);
  tcase_add_test(tc, shape_binary_bad);
  tcase_add_test(tc, shape_add_i32);
  tcase_add_test(tc, shape_unary);
  tcase_add_test(tc, shape_matmul);
  tcase_add_test(tc, shape_transpose_permute);
  tcase_add_test(tc, shape_reshape);
  tcase_add_test(tc, shape_narrow);
  tcase_add_test(tc, shape_pad);
  tcase_add_test(tc, shape_unfold);
  tcase_add_test(tc, shape_fold);
  tcase_add_test(tc, shape_concat);
  tcase_add_test(tc, shape_broadcast);
  tcase_add_test(tc, shape_broadcast_along);
  tcase_add_test(tc, shape_reductions);
  tcase_add_test(tc, shape_gather);
  tcase_add_test(tc, shape_scatter);
  suite_add_tcase(s, tc);

  tc = tcase_create("network");
  tcase_add_test(tc, names_find_and_name_of);
  tcase_add_test(tc, names_duplicate_is_error);
  tcase_add_test(tc, names_must_be_utf8);
  tcase_add_test(tc, names_per_tape);
  tcase_add_test(tc, seal_describe);
  tcase_add_test(tc, seal_keeps_leaf_tensors);
  tcase_add_test(tc, network_queries_foreign);
  suite_add_tcase(s, tc);
  return s;
}
