/*
 * test_attention.c - attention as a fusion offer: plans recognise the
 * chain topos_attention records (matmul -> mul -> add -> log_softmax ->
 * exp -> matmul) as one group, offer it to backends as one task, and the
 * `cpu` backend runs it as one kernel.
 *
 * Every check is bit for bit (memcmp):
 *  - the cpu task against the reference rows (kernel_attention) over odd
 *    extents, strided and broadcast operands, with and without the scale
 *    and mask steps, every written row, NaN/Inf/-inf-masked inputs, f32
 *    and f64, threads 1..4;
 *  - forward plans (fused, reference and cpu) against the unfused
 *    interpreter, causal and not, with a KV-cache offset;
 *  - training plans, whose fused kernel also writes what backward reads:
 *    the loss and every gradient against the interpreter's;
 *  - chains that must not fuse (an interior value read elsewhere), and
 *    an observed interior value, which the kernel writes.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static void restore(void) {
  backend_set_threads(0);
  topos_cpu_force_isa(NULL);
}

/* n values of dtype d into a new array: uniform in [-2, 2), or with
 * `special` one in five a NaN, ±Inf, ±0 or huge value. */
static void *values(topos_dtype d, int64_t n, uint64_t seed, bool special) {
  size_t es = d == TOPOS_F64 ? 8 : 4;
  char *p = malloc(es * (size_t)(n > 0 ? n : 1));
  ck_assert_ptr_nonnull(p);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 11;
  const double sp[6] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 1e30};
  for (int64_t i = 0; i < n; i++) {
    double v = tt_uniform(&s, -2, 2);
    uint64_t r = s; /* the state tt_uniform left: picks the special ones */
    if (special && r % 5 == 0) v = sp[(r >> 7) % 6];
    if (d == TOPOS_F64)
      ((double *)p)[i] = v;
    else
      ((float *)p)[i] = (float)v;
  }
  return p;
}

typedef struct shape {
  int64_t batch, t, s, dh, dv;
  bool scale, mask, kstrided, broadcast_scale;
} shape;

static const shape shapes[] = {
    {1, 1, 1, 1, 1, true, true, false, true},
    {2, 7, 7, 5, 5, true, true, false, true},
    {3, 4, 9, 16, 16, true, true, false, true},
    {1, 5, 37, 3, 9, false, true, true, false},
    {2, 9, 17, 8, 3, true, false, false, false},
    {1, 6, 6, 19, 1, false, false, true, false},
    {4, 16, 16, 16, 16, true, true, false, true},
    {1, 1, 300, 64, 64, true, true, false, true}, /* one query, a long cache */
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* One task on the cpu backend at threads 1..4 against the reference rows:
 * the output and all five written rows. */
static void check_task(topos_dtype d, shape sh, bool special, uint64_t seed) {
  size_t es = d == TOPOS_F64 ? 8 : 4;
  int64_t rows = sh.batch * sh.t, cells = rows * sh.s;
  void *q = values(d, rows * sh.dh, seed, special);
  void *k = values(d, sh.batch * sh.dh * sh.s, seed + 1, special);
  void *v = values(d, sh.batch * sh.s * sh.dv, seed + 2, special);
  void *scale = values(d, sh.broadcast_scale ? 1 : cells, seed + 3, special);
  void *mask = values(d, cells, seed + 4, special);
  /* A causal-style mask: -inf above the diagonal, except key 0. */
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 1; j < sh.s; j++)
      if (j > r % sh.t + (sh.s - sh.t)) {
        if (d == TOPOS_F64)
          ((double *)mask)[r * sh.s + j] = -INFINITY;
        else
          ((float *)mask)[r * sh.s + j] = -INFINITY;
      }
  topos_attention_task t = {
      .dtype = d,
      .batch = sh.batch,
      .t = sh.t,
      .s = sh.s,
      .dh = sh.dh,
      .dv = sh.dv,
      .q = q,
      .q_batch = sh.t * sh.dh,
      .q_row = sh.dh,
      .q_col = 1,
      .k = k,
      .v = v,
      .v_batch = sh.s * sh.dv,
      .v_row = sh.dv,
      .v_col = 1,
  };
  /* k is [batch, dh, s], or read transposed from [batch, s, dh]. */
  t.k_batch = sh.dh * sh.s;
  t.k_row = sh.kstrided ? 1 : sh.s;
  t.k_col = sh.kstrided ? sh.dh : 1;
  if (sh.scale) {
    t.scale = scale;
    if (!sh.broadcast_scale) {
      t.scale_batch = sh.t * sh.s;
      t.scale_row = sh.s;
      t.scale_col = 1;
    }
  }
  if (sh.mask) {
    t.mask = mask;
    t.mask_batch = sh.t * sh.s;
    t.mask_row = sh.s;
    t.mask_col = 1;
  }
  size_t out_bytes = es * (size_t)(rows * sh.dv),
         row_bytes = es * (size_t)cells;
  char *want = malloc(out_bytes + 5 * row_bytes);
  char *got = malloc(out_bytes + 5 * row_bytes);
  ck_assert(want && got);
  topos_attention_task ref = t;
  ref.out = want;
  void **slots[5] = {&ref.raw, &ref.scaled, &ref.masked, &ref.logp, &ref.probs};
  for (int j = 0; j < 5; j++)
    *slots[j] = want + out_bytes + (size_t)j * row_bytes;
  topos_error err = {0};
  ck_assert_int_eq(kernel_attention(&ref, 0, rows, &err), 0);
  const topos_backend *be = topos_cpu_backend();
  for (int th = 1; th <= 4; th++) {
    memset(got, 0xA5, out_bytes + 5 * row_bytes);
    topos_task task = {.kind = TOPOS_TASK_ATTENTION, .threads = th};
    task.u.attention = t;
    topos_attention_task *u = &task.u.attention;
    u->out = got;
    void **mine[5] = {&u->raw, &u->scaled, &u->masked, &u->logp, &u->probs};
    for (int j = 0; j < 5; j++)
      *mine[j] = got + out_bytes + (size_t)j * row_bytes;
    ck_assert(be->supports(be, &task));
    ck_assert_int_eq(be->run(be, &task, &err), TOPOS_OK);
    const char *what[6] = {"out", "raw", "scaled", "masked", "logp", "probs"};
    for (int j = 0; j < 6; j++) {
      if ((j == 2 && !sh.scale) || (j == 3 && !sh.mask)) continue;
      size_t at = j == 0 ? 0 : out_bytes + (size_t)(j - 1) * row_bytes;
      size_t len = j == 0 ? out_bytes : row_bytes;
      ck_assert_msg(memcmp(want + at, got + at, len) == 0,
                    "%s b%lld t%lld s%lld dh%lld dv%lld special %d threads "
                    "%d: %s differs",
                    topos_dtype_name(d), (long long)sh.batch, (long long)sh.t,
                    (long long)sh.s, (long long)sh.dh, (long long)sh.dv,
                    special, th, what[j]);
    }
  }
  free(want);
  free(got);
  free(q);
  free(k);
  free(v);
  free(scale);
  free(mask);
}

START_TEST(task_bits) {
  shape sh = shapes[_i];
  for (int d = 0; d < 2; d++)
    for (int sp = 0; sp < 2; sp++)
      check_task(d ? TOPOS_F64 : TOPOS_F32, sh, sp, 100 + (uint64_t)_i * 7);
  restore();
}
END_TEST

/* The portable build (libm's fma, no vectors) as well. */
START_TEST(portable_bits) {
  ck_assert_int_eq(topos_cpu_force_isa("c"), 0);
  for (int k = 0; k < NSHAPES; k += 2)
    for (int d = 0; d < 2; d++)
      check_task(d ? TOPOS_F64 : TOPOS_F32, shapes[k], true, 300 + (uint64_t)k);
  restore();
}
END_TEST

START_TEST(supports) {
  const topos_backend *be = topos_cpu_backend();
  float q[4] = {1, 2, 3, 4}, k[4] = {1, 0, 0, 1}, v[4] = {5, 6, 7, 8}, o[4];
  topos_task task = {.kind = TOPOS_TASK_ATTENTION, .threads = 1};
  task.u.attention = (topos_attention_task){.dtype = TOPOS_F32,
                                            .batch = 1,
                                            .t = 2,
                                            .s = 2,
                                            .dh = 2,
                                            .dv = 2,
                                            .q = q,
                                            .q_row = 2,
                                            .q_col = 1,
                                            .k = k,
                                            .k_row = 2,
                                            .k_col = 1,
                                            .v = v,
                                            .v_row = 2,
                                            .v_col = 1,
                                            .out = o};
  ck_assert(be->supports(be, &task));
  topos_error err = {0};
  ck_assert_int_eq(be->run(be, &task, &err), TOPOS_OK);
  /* Row 0 attends to keys with scores 1, 2: p = softmax; o = p·v. */
  double p1 = 1 / (1 + exp(-1.0));
  ck_assert(fabs(o[0] - ((1 - p1) * 5 + p1 * 7)) < 1e-5);
  topos_attention_task *t = &task.u.attention;
  t->dtype = TOPOS_BF16;
  ck_assert(!be->supports(be, &task));
  t->dtype = TOPOS_F32;
  t->s = 0;
  ck_assert(!be->supports(be, &task));
  t->s = 2;
  t->batch = INT64_MAX / 2;
  ck_assert(!be->supports(be, &task));
  t->batch = 1;
  t->v = NULL;
  ck_assert(!be->supports(be, &task));
}
END_TEST

/* ------------------------------------------------------------ plans */

static topos_value leaf(topos_tape *tape, topos_dtype d, bool param, int rank,
                        const int64_t *shape, uint64_t seed) {
  topos_tensor *x = tt_random(d, rank, shape, seed, -1.5, 1.5);
  topos_value v = param ? topos_parameter(tape, x) : topos_input(tape, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(v));
  return v;
}

typedef struct model {
  topos_network *net;
  topos_value y, loss, probs;
} model;

/* y = attention(q, k, v) over [B,T,D] (k, v [B,past+T,D]) and a scalar
 * loss sum(y·w); q, k, v, w parameters.  With `spy`, the mask's add
 * also feeds a second consumer, so the chain must not fuse. */
static model build(topos_dtype d, int64_t B, int64_t T, int64_t D, int H,
                   bool causal, int64_t past, bool spy) {
  topos_tape *tape = topos_tape_new(d);
  int64_t Sk = past + T;
  topos_value q = leaf(tape, d, true, 3, S(B, T, D), 1);
  topos_value k = leaf(tape, d, true, 3, S(B, Sk, D), 2);
  topos_value v = leaf(tape, d, true, 3, S(B, Sk, D), 3);
  topos_value w = leaf(tape, d, true, 3, S(B, T, D), 4);
  topos_attention_opts o = {.heads = H, .causal = causal, .past = past};
  model m = {0};
  m.y = topos_attention(tape, q, k, v, &o);
  topos_value loss = topos_sum(tape, topos_mul(tape, m.y, w));
  if (spy) {
    /* Read a score-shaped interior value twice: find it from the tape by
     * rebuilding it is not possible, so add a second attention whose
     * probabilities are also summed into the loss. */
    topos_value sc =
        topos_matmul(tape, topos_reshape(tape, q, 3, S(B * T, 1, D)),
                     topos_reshape(tape, k, 3, S(B * T, D, 1)));
    topos_value p = topos_softmax(tape, sc, 2);
    topos_value o2 =
        topos_matmul(tape, p, topos_reshape(tape, v, 3, S(B * T, 1, D)));
    loss = topos_add(tape, loss, topos_sum(tape, o2));
    loss = topos_add(tape, loss, topos_sum(tape, p)); /* p read twice */
  }
  m.loss = loss;
  const char *e = topos_tape_error(tape);
  ck_assert_msg(e == NULL, "record: %s", e);
  topos_error err = {0};
  m.net = topos_tape_seal(tape, &err);
  ck_assert_msg(m.net != NULL, "seal: %s", err.message);
  return m;
}

static topos_plan *lower(const model *m, topos_posture posture,
                         const topos_value *observes, int nobserves) {
  topos_value roots[2] = {m->loss, m->y};
  topos_entry en = {roots,    posture == TOPOS_POSTURE_TRAINING ? 1 : 2,
                    observes, nobserves,
                    posture,  TOPOS_NUMERICS_EXACT};
  topos_error err = {0};
  topos_plan *p = topos_network_lower(m->net, &en, &err);
  ck_assert_msg(p != NULL, "lower: %s", err.message);
  return p;
}

/* The unfused interpreter's run of the whole network, on the reference. */
static topos_run *interpret(const model *m) {
  topos_error err = {0};
  topos_run *r = topos_forward(m->net, NULL, NULL, 0, &TEST_REFERENCE, &err);
  ck_assert_msg(r != NULL, "interpreter: %s", err.message);
  return r;
}

static void expect_same(const topos_tensor *a, const topos_tensor *b,
                        const char *what) {
  ck_assert_msg(a && b && topos_tensor_bitwise_equal(a, b), "%s differs", what);
}

/* Forward plans: one attention group; the reference's fused rows and the
 * cpu kernel (threads 1..4) give the interpreter's bits for y. */
START_TEST(forward_plan_bits) {
  topos_backends_register_defaults();
  const struct {
    int64_t B, T, D;
    int H;
    bool causal;
    int64_t past;
  } cases[] = {{2, 7, 12, 3, true, 0},
               {1, 5, 8, 2, false, 0},
               {2, 3, 16, 4, true, 6},
               {1, 1, 32, 2, true, 40}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int dd = 0; dd < 2; dd++) {
      topos_dtype d = dd ? TOPOS_F64 : TOPOS_F32;
      model m = build(d, cases[c].B, cases[c].T, cases[c].D, cases[c].H,
                      cases[c].causal, cases[c].past, false);
      topos_error err = {0};
      topos_run *interp = interpret(&m);
      topos_plan *plan = lower(&m, TOPOS_POSTURE_FORWARD, NULL, 0);
      ck_assert_int_eq(topos_plan_group_count(plan), 1);
      char *text = topos_plan_describe(plan, &err);
      ck_assert_ptr_nonnull(text);
      ck_assert_msg(strstr(text, "fused-attention") != NULL, "%s", text);
      ck_assert_msg(strstr(text, "(written)") == NULL, "%s", text);
      topos_free(text);
      topos_run *ref =
          topos_plan_forward(plan, NULL, NULL, 0, &TEST_REFERENCE, &err);
      ck_assert_msg(ref != NULL, "%s", err.message);
      expect_same(topos_run_of(interp, m.y, &err), topos_run_of(ref, m.y, &err),
                  "reference fused y");
      for (int th = 1; th <= 4; th++) {
        backend_set_threads(th);
        unsigned long long before = topos_cpu_attention_tasks_run();
        topos_run *got = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
        ck_assert_msg(got != NULL, "%s", err.message);
        ck_assert_uint_gt(topos_cpu_attention_tasks_run(), before);
        expect_same(topos_run_of(interp, m.y, &err),
                    topos_run_of(got, m.y, &err), "cpu fused y");
        expect_same(topos_run_of(interp, m.loss, &err),
                    topos_run_of(got, m.loss, &err), "cpu fused loss");
        topos_run_free(got);
      }
      topos_run_free(ref);
      topos_run_free(interp);
      topos_plan_free(plan);
      topos_network_release(m.net);
    }
  restore();
}
END_TEST

/* A group past TASK_BLOCK multiply-adds is offered in blocks of query
 * rows (here one block of whole rows, then the rest of the matrix): two
 * tasks, the interpreter's bits. */
START_TEST(blocks) {
  topos_backends_register_defaults();
  model m = build(TOPOS_F32, 1, 1100, 64, 1, true, 0, false);
  topos_error err = {0};
  topos_run *interp = interpret(&m);
  topos_plan *plan = lower(&m, TOPOS_POSTURE_FORWARD, NULL, 0);
  ck_assert_int_eq(topos_plan_group_count(plan), 1);
  unsigned long long before = topos_cpu_attention_tasks_run();
  topos_run *got = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(got != NULL, "%s", err.message);
  ck_assert_uint_eq(topos_cpu_attention_tasks_run(), before + 2);
  expect_same(topos_run_of(interp, m.y, &err), topos_run_of(got, m.y, &err),
              "blocked task y");
  topos_run_free(got);
  topos_run_free(interp);
  topos_plan_free(plan);
  topos_network_release(m.net);
}
END_TEST

/* Training plans fuse too: the kernel writes the raw scores (the scale's
 * mul reads them), the log-probabilities and the probabilities (their
 * adjoints read them); the loss and every gradient are the
 * interpreter's bits. */
START_TEST(training_plan_bits) {
  topos_backends_register_defaults();
  for (int dd = 0; dd < 2; dd++) {
    topos_dtype d = dd ? TOPOS_F64 : TOPOS_F32;
    model m = build(d, 2, 6, 12, 3, true, 0, false);
    topos_error err = {0};
    topos_run *interp = interpret(&m);
    topos_params *want = topos_gradients(interp, m.loss, &TEST_REFERENCE, &err);
    ck_assert_msg(want != NULL, "%s", err.message);
    topos_plan *plan = lower(&m, TOPOS_POSTURE_TRAINING, NULL, 0);
    ck_assert_int_eq(topos_plan_group_count(plan), 1);
    char *text = topos_plan_describe(plan, &err);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(strstr(text, "(written)") != NULL, "%s", text);
    topos_free(text);
    const topos_exec *ctxs[2] = {&TEST_REFERENCE, NULL};
    for (int c = 0; c < 2; c++)
      for (int th = 1; th <= (c ? 3 : 1); th++) {
        backend_set_threads(th);
        topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, ctxs[c], &err);
        ck_assert_msg(run != NULL, "%s", err.message);
        expect_same(topos_run_of(interp, m.loss, &err),
                    topos_run_of(run, m.loss, &err), "training loss");
        topos_params *got = topos_plan_gradients(plan, run, ctxs[c], &err);
        ck_assert_msg(got != NULL, "%s", err.message);
        ck_assert_int_eq(topos_params_count(got), topos_params_count(want));
        for (int k = 0; k < topos_params_count(want); k++)
          expect_same(topos_params_get(want, k), topos_params_get(got, k),
                      "gradient");
        topos_params_free(got);
        topos_run_free(run);
      }
    topos_params_free(want);
    topos_run_free(interp);
    topos_plan_free(plan);
    topos_network_release(m.net);
  }
  restore();
}
END_TEST

/* An interior value read by another node keeps the chain unfused (the
 * second, spied-on softmax); the first attention still fuses, and the
 * results are the interpreter's. */
START_TEST(shared_interior_not_fused) {
  topos_backends_register_defaults();
  model m = build(TOPOS_F32, 1, 4, 8, 2, true, 0, true);
  topos_error err = {0};
  topos_run *interp = interpret(&m);
  for (int posture = 0; posture < 2; posture++) {
    topos_plan *plan = lower(
        &m, posture ? TOPOS_POSTURE_TRAINING : TOPOS_POSTURE_FORWARD, NULL, 0);
    ck_assert_int_eq(topos_plan_group_count(plan), 1);
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
    ck_assert_msg(run != NULL, "%s", err.message);
    expect_same(topos_run_of(interp, m.loss, &err),
                topos_run_of(run, m.loss, &err), "loss");
    topos_run_free(run);
    topos_plan_free(plan);
  }
  topos_run_free(interp);
  topos_network_release(m.net);
}
END_TEST

/* The probabilities observed from a forward plan: the group writes them,
 * and they are the interpreter's. */
START_TEST(observed_interior_written) {
  topos_backends_register_defaults();
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value q = leaf(tape, TOPOS_F32, true, 3, S(2, 3, 4), 5);
  topos_value kt = leaf(tape, TOPOS_F32, true, 3, S(2, 4, 3), 6);
  topos_value v = leaf(tape, TOPOS_F32, false, 3, S(2, 3, 5), 7);
  topos_value p = topos_softmax(tape, topos_matmul(tape, q, kt), 2);
  topos_value y = topos_matmul(tape, p, v);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_entry en = {&y, 1, &p, 1, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &en, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  ck_assert_int_eq(topos_plan_group_count(plan), 1);
  topos_run *interp = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
  for (int c = 0; c < 2; c++) {
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0,
                                        c ? NULL : &TEST_REFERENCE, &err);
    ck_assert_msg(run != NULL, "%s", err.message);
    expect_same(topos_run_of(interp, y, &err), topos_run_of(run, y, &err), "y");
    expect_same(topos_run_of(interp, p, &err), topos_run_of(run, p, &err),
                "observed probabilities");
    topos_run_free(run);
  }
  topos_run_free(interp);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

Suite *attention_suite(void) {
  Suite *s = suite_create("attention");
  TCase *tc = tcase_create("attention");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, supports);
  tcase_add_loop_test(tc, task_bits, 0, NSHAPES);
  tcase_add_test(tc, portable_bits);
  tcase_add_test(tc, forward_plan_bits);
  tcase_add_test(tc, blocks);
  tcase_add_test(tc, training_plan_bits);
  tcase_add_test(tc, shared_interior_not_fused);
  tcase_add_test(tc, observed_interior_written);
  suite_add_tcase(s, tc);
  return s;
}
