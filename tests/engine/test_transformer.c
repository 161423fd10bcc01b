/*
 * test_transformer.c - the transformer surface of nn.c and the erf op it
 * needs: exact GELU, multi-head attention (causal, with a key/value
 * cache), the self-attention block, rotary embeddings, cross entropy with
 * an ignored target, global-norm clipping and the warmup + cosine
 * schedule.
 *
 * Each composite is held to: its values against a loop written out here
 * in double (the formula, not the op chain); finite differences in f64;
 * bad shapes and arguments reported on the tape, never a crash; and its
 * StableHLO module, both forms emitted and the generic one accepted by
 * mlir-opt (test_emit.c's test_transformer_composites also checks the
 * modules' op shapes and values).  Decoding with a cache must give the
 * bits of full causal attention.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlir_opt.h"
#include "testutil.h"
#include "topos.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ------------------------------------------------------------- helpers */

/* A random f64 parameter (or constant when as_param is false); its values
 * are copied to *values (new) when values is non-NULL. */
static topos_value rand_leaf(topos_tape *tape, bool as_param, int rank,
                             const int64_t *shape, uint64_t seed, double lo,
                             double hi, double **values) {
  topos_tensor *t =
      tt_random(topos_tape_dtype(tape), rank, shape, seed, lo, hi);
  if (values) *values = tt_values(t);
  return as_param ? tt_param(tape, t) : tt_constant(tape, t);
}

static topos_value index_constant(topos_tape *tape, int64_t n,
                                  const int32_t *idx) {
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(TOPOS_I32, 1, &n, idx, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  return tt_constant(tape, t);
}

static topos_network *seal(topos_tape *tape) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

/* Values of n roots from one forward run with NULL context (the auto
 * backend choice, exact numerics); out[i] new. */
static void forward_many(const topos_network *net, const topos_value *v, int n,
                         double **out) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  for (int i = 0; i < n; i++) {
    const topos_tensor *t = topos_run_of(run, v[i], &err);
    ck_assert_msg(t != NULL, "run_of: %s", err.message);
    out[i] = tt_values(t);
  }
  topos_run_free(run);
}

static double *forward_one(const topos_network *net, topos_value v) {
  double *out;
  forward_many(net, &v, 1, &out);
  return out;
}

static void expect_close(const double *got, const double *want, int64_t n,
                         double tol, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double scale = fmax(1.0, fabs(want[i]));
    ck_assert_msg(fabs(got[i] - want[i]) <= tol * scale,
                  "%s element %lld: got %.17g want %.17g", what, (long long)i,
                  got[i], want[i]);
  }
}

/* The bits of a and b agree (as doubles: exact for every float dtype). */
static void expect_same(const double *a, const double *b, int64_t n,
                        const char *what) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&a[i], &b[i], sizeof(double)) == 0,
                  "%s element %lld: %.17g vs %.17g", what, (long long)i, a[i],
                  b[i]);
}

static void expect_shape(const topos_tape *tape, topos_value v, int rank,
                         const int64_t *shape) {
  int got = -1;
  const int64_t *s = topos_value_shape(tape, v, &got);
  ck_assert_msg(s != NULL, "no shape: %s", topos_tape_error(tape));
  ck_assert_int_eq(got, rank);
  for (int i = 0; i < rank; i++) ck_assert_int_eq(s[i], shape[i]);
}

/* loss = Σ y·R with R a fixed random tensor of y's shape. */
static topos_value weighted_sum(topos_tape *tape, topos_value y,
                                uint64_t seed) {
  int rank = 0;
  const int64_t *s = topos_value_shape(tape, y, &rank);
  ck_assert_msg(s != NULL, "weighted_sum: %s", topos_tape_error(tape));
  int64_t shape[TOPOS_MAX_RANK];
  memcpy(shape, s, sizeof(int64_t) * (size_t)rank);
  topos_value r = tt_constant(
      tape, tt_random(topos_tape_dtype(tape), rank, shape, seed, -1.0, 1.0));
  return topos_sum(tape, topos_mul(tape, y, r));
}

/* Seals with loss = weighted_sum(y) (or y when rank 0) and holds every
 * parameter's gradient to central differences. */
static void expect_gradients(topos_tape *tape, topos_value y) {
  int rank = -1;
  ck_assert_msg(topos_value_shape(tape, y, &rank) != NULL, "%s",
                topos_tape_error(tape));
  topos_value loss = rank == 0 ? y : weighted_sum(tape, y, 977);
  topos_network *net = seal(tape);
  ck_assert_int_gt(topos_network_parameter_count(net), 0);
  double e = tt_gradient_error(net, loss, NULL, 0);
  ck_assert_msg(e <= 1e-6, "gradient error %.3g", e);
  topos_network_release(net);
}

/* The tape holds an error whose message contains `needle` (NULL: any),
 * and refuses to seal; frees the tape. */
static void expect_tape_error(topos_tape *tape, topos_value result,
                              const char *needle) {
  const char *msg = topos_tape_error(tape);
  ck_assert_msg(msg != NULL, "no error recorded (wanted '%s')",
                needle ? needle : "any");
  ck_assert(!topos_value_ok(result));
  if (needle)
    ck_assert_msg(strstr(msg, needle) != NULL, "error '%s' lacks '%s'", msg,
                  needle);
  topos_error err = {0};
  ck_assert_ptr_null(topos_tape_seal(tape, &err));
  ck_assert_int_ne(err.code, TOPOS_OK);
}

/* ------------------------------------------------- emission and mlir-opt */

/* Lowers (roots; posture), emits both forms, and checks: the generic form
 * holds `generic_has` and mlir-opt accepts it; the pretty form holds
 * `pretty_has` (NULL: skipped).  Releases net. */
static void expect_emits(topos_network *net, const topos_value *roots,
                         int nroots, topos_posture posture,
                         const char *generic_has, const char *pretty_has) {
  topos_error err = {0};
  topos_entry entry = {roots, nroots, NULL, 0, posture, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &entry, &err);
  ck_assert_msg(plan != NULL, "lower: %s", err.message);
  char *generic = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_msg(generic != NULL, "emit generic: %s", err.message);
  char *pretty = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_PRETTY, &err);
  ck_assert_msg(pretty != NULL, "emit pretty: %s", err.message);
  ck_assert_msg(strstr(generic, generic_has) != NULL, "no '%s' in:\n%.3000s",
                generic_has, generic);
  if (pretty_has)
    ck_assert_msg(strstr(pretty, pretty_has) != NULL, "no '%s' in:\n%.3000s",
                  pretty_has, pretty);
  char diag[512];
  int status = run_mlir_opt(generic, diag, sizeof diag);
  ck_assert_msg(status == 0, "mlir-opt rejected the module (%d): %s\n%.3000s",
                status, diag, generic);
  topos_free(generic);
  topos_free(pretty);
  topos_plan_free(plan);
  topos_network_release(net);
}

/* ================================================================== erf */

/* The op: the C library's erf / erff once per element, bf16 through f32. */
START_TEST(test_erf_op_bits) {
  const double xs[9] = {-4, -1.5, -0.5, -0.0, 0.0, 1e-3, 0.75, 2, 6};
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = d == 0 ? TOPOS_F64 : d == 1 ? TOPOS_F32 : TOPOS_BF16;
    topos_tape *tape = topos_tape_new(dt);
    topos_tensor *xt = tt_tensor(dt, 1, S(9), xs);
    double *xv = tt_values(xt);
    topos_value x = tt_constant(tape, xt);
    topos_value y = topos_erf(tape, x);
    topos_network *net = seal(tape);
    double *got = forward_one(net, y);
    for (int i = 0; i < 9; i++) {
      double want = dt == TOPOS_F64 ? erf(xv[i])
                    : dt == TOPOS_F32
                        ? (double)erff((float)xv[i])
                        : (double)topos_bf16_to_f32(
                              topos_bf16_from_f32(erff((float)xv[i])));
      ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0,
                    "%s erf(%g): %.17g want %.17g", topos_dtype_name(dt), xv[i],
                    got[i], want);
    }
    free(got);
    free(xv);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_erf_op_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value p = rand_leaf(tape, true, 2, S(3, 4), 3, -2.5, 2.5, NULL);
  expect_gradients(tape, topos_erf(tape, p));
}
END_TEST

START_TEST(test_erf_op_emits) {
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = d == 0 ? TOPOS_F32 : d == 1 ? TOPOS_F64 : TOPOS_BF16;
    topos_tape *tape = topos_tape_new(dt);
    topos_value x = rand_leaf(tape, true, 2, S(2, 3), 4, -2, 2, NULL);
    topos_value y = topos_erf(tape, x);
    topos_network *net = seal(tape);
    /* bf16 is widened to f32 around the erf, like every bf16 arithmetic
     * op. */
    const char *g = dt == TOPOS_F64   ? "\"chlo.erf\"(%arg0) : "
                                        "(tensor<2x3xf64>) -> tensor<2x3xf64>"
                    : dt == TOPOS_F32 ? "\"chlo.erf\"(%arg0) : "
                                        "(tensor<2x3xf32>) -> tensor<2x3xf32>"
                                      : "\"chlo.erf\"(%0) : "
                                        "(tensor<2x3xf32>) -> tensor<2x3xf32>";
    const char *p = dt == TOPOS_F64   ? "chlo.erf %arg0 : tensor<2x3xf64> -> "
                                        "tensor<2x3xf64>"
                    : dt == TOPOS_F32 ? "chlo.erf %arg0 : tensor<2x3xf32> -> "
                                        "tensor<2x3xf32>"
                                      : "chlo.erf %0 : tensor<2x3xf32> -> "
                                        "tensor<2x3xf32>";
    expect_emits(net, &y, 1, TOPOS_POSTURE_FORWARD, g, p);
  }
}
END_TEST

/* ================================================================= gelu */

START_TEST(test_gelu_exact_values) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  double *xv;
  topos_value x = rand_leaf(tape, false, 1, S(41), 5, -6, 6, &xv);
  topos_value y = topos_gelu_exact(tape, x);
  topos_value a = topos_gelu(tape, x);
  topos_network *net = seal(tape);
  topos_value roots[2] = {y, a};
  double *got[2];
  forward_many(net, roots, 2, got);
  double want[41];
  for (int i = 0; i < 41; i++)
    want[i] = 0.5 * xv[i] * (1 + erf(xv[i] / sqrt(2.0)));
  expect_close(got[0], want, 41, 1e-15, "gelu_exact");
  /* The tanh form is an approximation of it: close, not equal. */
  for (int i = 0; i < 41; i++)
    ck_assert_msg(fabs(got[1][i] - got[0][i]) < 1e-3, "gelu forms at %g",
                  xv[i]);
  free(got[0]);
  free(got[1]);
  free(xv);
  topos_network_release(net);
}
END_TEST

START_TEST(test_gelu_exact_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value p = rand_leaf(tape, true, 2, S(3, 5), 6, -3, 3, NULL);
  expect_gradients(tape, topos_gelu_exact(tape, p));
}
END_TEST

START_TEST(test_gelu_exact_bad) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  expect_tape_error(tape, topos_gelu_exact(tape, TOPOS_NONE), NULL);
}
END_TEST

START_TEST(test_gelu_exact_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value x = rand_leaf(tape, true, 2, S(2, 3), 7, -2, 2, NULL);
  topos_value y = topos_gelu_exact(tape, x);
  expect_emits(seal(tape), &y, 1, TOPOS_POSTURE_FORWARD, "\"chlo.erf\"",
               "chlo.erf");
}
END_TEST

/* ============================================================ attention */

/* out[B,T,D] = per head softmax(q·kᵀ·scale + mask)·v, in double. */
static void ref_attention(const double *q, const double *k, const double *v,
                          int B, int T, int Ss, int D, int H, bool causal,
                          int past, double scale, double *out) {
  int dh = D / H;
  if (scale == 0) scale = 1 / sqrt((double)dh);
  double *s = malloc(sizeof(double) * (size_t)Ss);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        int last = causal ? past + i : Ss - 1;
        double mx = -INFINITY;
        for (int j = 0; j <= last; j++) {
          double acc = 0;
          for (int c = 0; c < dh; c++)
            acc += q[(b * T + i) * D + h * dh + c] *
                   k[(b * Ss + j) * D + h * dh + c];
          s[j] = acc * scale;
          if (s[j] > mx) mx = s[j];
        }
        double z = 0;
        for (int j = 0; j <= last; j++) z += (s[j] = exp(s[j] - mx));
        for (int c = 0; c < dh; c++) {
          double acc = 0;
          for (int j = 0; j <= last; j++)
            acc += s[j] / z * v[(b * Ss + j) * D + h * dh + c];
          out[(b * T + i) * D + h * dh + c] = acc;
        }
      }
  free(s);
}

START_TEST(test_attention_values) {
  static const struct {
    int B, T, S, D, H;
    bool causal;
    int past;
    double scale;
  } cases[] = {
      {2, 3, 4, 4, 1, false, 0, 0},   /* one head, S != T */
      {1, 4, 4, 6, 2, true, 0, 0},    /* causal, two heads */
      {2, 2, 5, 8, 4, true, 3, 0},    /* causal over a cache of 3 */
      {1, 3, 3, 6, 3, false, 0, 0.7}, /* a given scale */
      {2, 1, 6, 4, 2, true, 5, 0},    /* one new position, decoding */
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int B = cases[c].B, T = cases[c].T, Ss = cases[c].S, D = cases[c].D;
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    double *qv, *kv, *vv;
    topos_value q =
        rand_leaf(tape, false, 3, S(B, T, D), 10 + c, -1.5, 1.5, &qv);
    topos_value k =
        rand_leaf(tape, false, 3, S(B, Ss, D), 20 + c, -1.5, 1.5, &kv);
    topos_value v = rand_leaf(tape, false, 3, S(B, Ss, D), 30 + c, -1, 1, &vv);
    topos_attention_opts o = {cases[c].H, cases[c].causal, cases[c].past,
                              cases[c].scale};
    topos_value y = topos_attention(tape, q, k, v, &o);
    expect_shape(tape, y, 3, S(B, T, D));
    topos_network *net = seal(tape);
    double *got = forward_one(net, y);
    double *want = malloc(sizeof(double) * (size_t)(B * T * D));
    ref_attention(qv, kv, vv, B, T, Ss, D, cases[c].H, cases[c].causal,
                  cases[c].past, cases[c].scale, want);
    char what[32];
    snprintf(what, sizeof what, "attention case %zu", c);
    expect_close(got, want, B * T * D, 1e-13, what);
    free(got);
    free(want);
    free(qv);
    free(kv);
    free(vv);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_attention_gradient) {
  for (int causal = 0; causal < 2; causal++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value q = rand_leaf(tape, true, 3, S(2, 3, 4), 40, -1, 1, NULL);
    topos_value k = rand_leaf(tape, true, 3, S(2, 5, 4), 41, -1, 1, NULL);
    topos_value v = rand_leaf(tape, true, 3, S(2, 5, 4), 42, -1, 1, NULL);
    topos_attention_opts o = {.heads = 2, .causal = causal, .past = 2};
    expect_gradients(tape, topos_attention(tape, q, k, v, &o));
  }
}
END_TEST

START_TEST(test_attention_bad) {
  static const char *why[] = {
      "NULL options", "heads 0",  "heads 3 of D 4", "q rank 2",  "k other D",
      "v other S",    "causal S", "negative past",  "NaN scale", "k other B"};
  for (int c = 0; c < 10; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value q = rand_leaf(tape, false, 3, S(2, 3, 4), 1, -1, 1, NULL);
    topos_value k = rand_leaf(tape, false, 3, S(2, 3, 4), 2, -1, 1, NULL);
    topos_value v = rand_leaf(tape, false, 3, S(2, 3, 4), 3, -1, 1, NULL);
    topos_attention_opts o = {.heads = 2};
    const topos_attention_opts *op = &o;
    const char *needle = "attention:";
    switch (c) {
      case 0:
        op = NULL;
        break;
      case 1:
        o.heads = 0;
        break;
      case 2:
        o.heads = 3;
        break;
      case 3:
        q = rand_leaf(tape, false, 2, S(3, 4), 4, -1, 1, NULL);
        break;
      case 4:
        k = rand_leaf(tape, false, 3, S(2, 3, 6), 4, -1, 1, NULL);
        break;
      case 5:
        v = rand_leaf(tape, false, 3, S(2, 4, 4), 4, -1, 1, NULL);
        break;
      case 6:
        o.causal = true;
        o.past = 1; /* S = 3 is not 1 + 3 */
        break;
      case 7:
        o.past = -1;
        break;
      case 8:
        o.scale = NAN;
        break;
      case 9:
        k = rand_leaf(tape, false, 3, S(1, 3, 4), 4, -1, 1, NULL);
        break;
    }
    topos_value y = topos_attention(tape, q, k, v, op);
    ck_assert_msg(topos_tape_error(tape) != NULL, "case %s: no error", why[c]);
    expect_tape_error(tape, y, needle);
  }
  /* An invalid operand is reported, not dereferenced. */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_attention_opts o = {.heads = 1};
  expect_tape_error(
      tape, topos_attention(tape, TOPOS_NONE, TOPOS_NONE, TOPOS_NONE, &o),
      NULL);
}
END_TEST

/*
 * Decoding: attention of the new queries over [cache ‖ new keys] gives the
 * bits of the last rows of causal attention over the whole sequence, for
 * topos_attention itself and for the self-attention block fed the cache
 * its previous step returned.  Run with the default context (auto
 * backends, exact numerics), in f32 and f64.
 */
START_TEST(test_attention_cache_bits) {
  const int B = 2, N = 7, P = 4, D = 8, T = N - P;
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d == 0 ? TOPOS_F32 : TOPOS_F64;
    topos_tape *tape = topos_tape_new(dt);
    /* topos_attention: q, k, v of the whole sequence as constants. */
    topos_value q = rand_leaf(tape, false, 3, S(B, N, D), 50, -2, 2, NULL);
    topos_value k = rand_leaf(tape, false, 3, S(B, N, D), 51, -2, 2, NULL);
    topos_value v = rand_leaf(tape, false, 3, S(B, N, D), 52, -2, 2, NULL);
    topos_attention_opts full = {.heads = 2, .causal = true};
    topos_value y_full = topos_attention(tape, q, k, v, &full);
    topos_attention_opts step = {.heads = 2, .causal = true, .past = P};
    topos_value y_step =
        topos_attention(tape, topos_narrow(tape, q, 1, P, T), k, v, &step);
    /* the block: prefix, then the rest with the prefix's cache */
    topos_value x = rand_leaf(tape, false, 3, S(B, N, D), 53, -1, 1, NULL);
    topos_value w = rand_leaf(tape, false, 2, S(D, 3 * D), 54, -0.5, 0.5, NULL);
    topos_value bq = rand_leaf(tape, false, 1, S(3 * D), 55, -0.1, 0.1, NULL);
    topos_value wo = rand_leaf(tape, false, 2, S(D, D), 56, -0.5, 0.5, NULL);
    topos_value bo = rand_leaf(tape, false, 1, S(D), 57, -0.1, 0.1, NULL);
    topos_value b_full = topos_self_attention(
        tape, x, w, bq, wo, bo, &full, TOPOS_NONE, TOPOS_NONE, NULL, NULL);
    topos_value kc, vc, k_all, v_all;
    topos_value b_pre =
        topos_self_attention(tape, topos_narrow(tape, x, 1, 0, P), w, bq, wo,
                             bo, &full, TOPOS_NONE, TOPOS_NONE, &kc, &vc);
    topos_value b_new =
        topos_self_attention(tape, topos_narrow(tape, x, 1, P, T), w, bq, wo,
                             bo, &step, kc, vc, &k_all, &v_all);
    expect_shape(tape, kc, 3, S(B, P, D));
    expect_shape(tape, k_all, 3, S(B, N, D));
    expect_shape(tape, v_all, 3, S(B, N, D));
    topos_value tail = topos_narrow(tape, y_full, 1, P, T);
    topos_value btail = topos_narrow(tape, b_full, 1, P, T);
    topos_value bhead = topos_narrow(tape, b_full, 1, 0, P);
    topos_network *net = seal(tape);
    topos_value roots[6] = {tail, y_step, btail, b_new, bhead, b_pre};
    double *got[6];
    forward_many(net, roots, 6, got);
    expect_same(got[0], got[1], B * T * D, "attention with a cache");
    expect_same(got[2], got[3], B * T * D, "self-attention with a cache");
    expect_same(got[4], got[5], B * P * D, "self-attention prefix");
    for (int i = 0; i < 6; i++) free(got[i]);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_attention_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value q = rand_leaf(tape, true, 3, S(1, 2, 4), 60, -1, 1, NULL);
  topos_value k = rand_leaf(tape, true, 3, S(1, 3, 4), 61, -1, 1, NULL);
  topos_value v = rand_leaf(tape, true, 3, S(1, 3, 4), 62, -1, 1, NULL);
  topos_attention_opts o = {.heads = 2, .causal = true, .past = 1};
  topos_value y = topos_attention(tape, q, k, v, &o);
  /* The mask's −∞ prints as its bits. */
  expect_emits(seal(tape), &y, 1, TOPOS_POSTURE_FORWARD, "0xFF800000",
               "stablehlo.dot_general");
}
END_TEST

/* ======================================================= self-attention */

/* y = attention(x·Wq+bq, [kc ‖ x·Wk+bk], [vc ‖ x·Wv+bv])·Wo + bo. */
static void ref_self_attention(const double *x, const double *w,
                               const double *bq, const double *wo,
                               const double *bo, const double *kc,
                               const double *vc, int B, int T, int P, int D,
                               int H, double *y) {
  int Ss = P + T;
  double *q = calloc((size_t)(B * T * D), sizeof(double));
  double *k = calloc((size_t)(B * Ss * D), sizeof(double));
  double *v = calloc((size_t)(B * Ss * D), sizeof(double));
  double *a = calloc((size_t)(B * T * D), sizeof(double));
  for (int b = 0; b < B; b++) {
    for (int j = 0; j < P; j++)
      for (int c = 0; c < D; c++) {
        k[(b * Ss + j) * D + c] = kc[(b * P + j) * D + c];
        v[(b * Ss + j) * D + c] = vc[(b * P + j) * D + c];
      }
    for (int i = 0; i < T; i++)
      for (int c = 0; c < 3 * D; c++) {
        double acc = bq ? bq[c] : 0;
        for (int e = 0; e < D; e++)
          acc += x[(b * T + i) * D + e] * w[e * 3 * D + c];
        if (c < D)
          q[(b * T + i) * D + c] = acc;
        else if (c < 2 * D)
          k[(b * Ss + P + i) * D + c - D] = acc;
        else
          v[(b * Ss + P + i) * D + c - 2 * D] = acc;
      }
  }
  ref_attention(q, k, v, B, T, Ss, D, H, true, P, 0, a);
  for (int r = 0; r < B * T; r++)
    for (int c = 0; c < D; c++) {
      double acc = bo ? bo[c] : 0;
      for (int e = 0; e < D; e++) acc += a[r * D + e] * wo[e * D + c];
      y[r * D + c] = acc;
    }
  free(q);
  free(k);
  free(v);
  free(a);
}

START_TEST(test_self_attention_values) {
  const int B = 2, T = 3, D = 6, H = 3;
  for (int P = 0; P <= 2; P += 2) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    double *xv, *wv, *bv, *wov, *bov, *kcv = NULL, *vcv = NULL;
    topos_value x = rand_leaf(tape, false, 3, S(B, T, D), 70, -1, 1, &xv);
    topos_value w = rand_leaf(tape, false, 2, S(D, 3 * D), 71, -0.5, 0.5, &wv);
    topos_value b = rand_leaf(tape, false, 1, S(3 * D), 72, -0.2, 0.2, &bv);
    topos_value wo = rand_leaf(tape, false, 2, S(D, D), 73, -0.5, 0.5, &wov);
    topos_value bo = rand_leaf(tape, false, 1, S(D), 74, -0.2, 0.2, &bov);
    topos_value kc = TOPOS_NONE, vc = TOPOS_NONE;
    if (P) {
      kc = rand_leaf(tape, false, 3, S(B, P, D), 75, -1, 1, &kcv);
      vc = rand_leaf(tape, false, 3, S(B, P, D), 76, -1, 1, &vcv);
    }
    topos_attention_opts o = {.heads = H, .causal = true, .past = P};
    topos_value y =
        topos_self_attention(tape, x, w, b, wo, bo, &o, kc, vc, NULL, NULL);
    expect_shape(tape, y, 3, S(B, T, D));
    topos_network *net = seal(tape);
    double *got = forward_one(net, y);
    double want[2 * 3 * 6];
    ref_self_attention(xv, wv, bv, wov, bov, kcv, vcv, B, T, P, D, H, want);
    expect_close(got, want, B * T * D, 1e-13, "self_attention");
    free(got);
    free(xv);
    free(wv);
    free(bv);
    free(wov);
    free(bov);
    free(kcv);
    free(vcv);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_self_attention_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = rand_leaf(tape, false, 3, S(1, 2, 4), 80, -1, 1, NULL);
  topos_value w = rand_leaf(tape, true, 2, S(4, 12), 81, -0.5, 0.5, NULL);
  topos_value b = rand_leaf(tape, true, 1, S(12), 82, -0.2, 0.2, NULL);
  topos_value wo = rand_leaf(tape, true, 2, S(4, 4), 83, -0.5, 0.5, NULL);
  topos_value bo = rand_leaf(tape, true, 1, S(4), 84, -0.2, 0.2, NULL);
  topos_value kc = rand_leaf(tape, true, 3, S(1, 2, 4), 85, -1, 1, NULL);
  topos_value vc = rand_leaf(tape, true, 3, S(1, 2, 4), 86, -1, 1, NULL);
  topos_attention_opts o = {.heads = 2, .causal = true, .past = 2};
  expect_gradients(tape, topos_self_attention(tape, x, w, b, wo, bo, &o, kc, vc,
                                              NULL, NULL));
}
END_TEST

START_TEST(test_self_attention_bad) {
  for (int c = 0; c < 7; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value x = rand_leaf(tape, false, 3, S(1, 2, 4), 1, -1, 1, NULL);
    topos_value w = rand_leaf(tape, false, 2, S(4, 12), 2, -1, 1, NULL);
    topos_value wo = rand_leaf(tape, false, 2, S(4, 4), 3, -1, 1, NULL);
    topos_value kc = rand_leaf(tape, false, 3, S(1, 3, 4), 4, -1, 1, NULL);
    topos_value vc = rand_leaf(tape, false, 3, S(1, 3, 4), 5, -1, 1, NULL);
    topos_attention_opts o = {.heads = 2, .causal = true, .past = 3};
    const topos_attention_opts *op = &o;
    topos_value ka = x, va = x; /* must come back TOPOS_NONE */
    const char *needle = NULL;
    switch (c) {
      case 0: /* past 3 but no cache */
        kc = vc = TOPOS_NONE;
        needle = "opts->past";
        break;
      case 1: /* a cache of 3 but past 2 */
        o.past = 2;
        needle = "opts->past";
        break;
      case 2:
        vc = TOPOS_NONE;
        needle = "neither";
        break;
      case 3:
        w = rand_leaf(tape, false, 2, S(4, 8), 6, -1, 1, NULL);
        needle = "w_qkv";
        break;
      case 4:
        x = rand_leaf(tape, false, 2, S(2, 4), 6, -1, 1, NULL);
        needle = "rank 3";
        break;
      case 5:
        op = NULL;
        needle = "options";
        break;
      case 6: /* a cache of another D fails in concat */
        kc = rand_leaf(tape, false, 3, S(1, 3, 6), 6, -1, 1, NULL);
        vc = rand_leaf(tape, false, 3, S(1, 3, 6), 7, -1, 1, NULL);
        needle = "concat";
        break;
    }
    topos_value y = topos_self_attention(tape, x, w, TOPOS_NONE, wo, TOPOS_NONE,
                                         op, kc, vc, &ka, &va);
    ck_assert_msg(!topos_value_ok(ka) && !topos_value_ok(va), "case %d", c);
    expect_tape_error(tape, y, needle);
  }
}
END_TEST

START_TEST(test_self_attention_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = rand_leaf(tape, false, 3, S(1, 2, 4), 90, -1, 1, NULL);
  topos_value w = rand_leaf(tape, true, 2, S(4, 12), 91, -0.5, 0.5, NULL);
  topos_value wo = rand_leaf(tape, true, 2, S(4, 4), 92, -0.5, 0.5, NULL);
  topos_value kc = rand_leaf(tape, false, 3, S(1, 1, 4), 93, -1, 1, NULL);
  topos_value vc = rand_leaf(tape, false, 3, S(1, 1, 4), 94, -1, 1, NULL);
  topos_attention_opts o = {.heads = 2, .causal = true, .past = 1};
  topos_value ka, va;
  topos_value y = topos_self_attention(tape, x, w, TOPOS_NONE, wo, TOPOS_NONE,
                                       &o, kc, vc, &ka, &va);
  topos_value loss = topos_sum(tape, topos_mul(tape, y, y));
  topos_value wrt[2] = {w, wo}, g[2];
  ck_assert_int_eq(topos_tape_differentiate(tape, loss, wrt, 2, g), TOPOS_OK);
  topos_value roots[5] = {loss, g[0], g[1], ka, va};
  expect_emits(seal(tape), roots, 5, TOPOS_POSTURE_TRAINING,
               "\"stablehlo.concatenate\"", "stablehlo.concatenate");
}
END_TEST

/* ================================================================= rope */

/* Hugging Face Llama's apply_rotary_pos_emb, in double. */
static void ref_rope(const double *x, int B, int T, int D, int H,
                     int64_t offset, double base, double *y) {
  int dh = D / H, half = dh / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < dh; i++) {
          double theta = 1.0 / pow(base, 2.0 * (i % half) / dh);
          double ang = (double)(offset + t) * theta;
          const double *row = x + (b * T + t) * D + h * dh;
          double rot = i < half ? -row[i + half] : row[i - half];
          y[(b * T + t) * D + h * dh + i] = row[i] * cos(ang) + rot * sin(ang);
        }
}

START_TEST(test_rope_values) {
  static const struct {
    int B, T, D, H;
    int64_t offset;
    double base;
  } cases[] = {
      {2, 3, 8, 2, 0, 0}, {1, 4, 12, 3, 7, 500}, {1, 1, 4, 1, 1000, 0}};
  for (size_t c = 0; c < 3; c++) {
    int B = cases[c].B, T = cases[c].T, D = cases[c].D;
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    double *xv;
    topos_value x = rand_leaf(tape, false, 3, S(B, T, D), 100 + c, -1, 1, &xv);
    topos_value y =
        topos_rope(tape, x, cases[c].H, cases[c].offset, cases[c].base);
    expect_shape(tape, y, 3, S(B, T, D));
    topos_network *net = seal(tape);
    double *got = forward_one(net, y);
    double *want = malloc(sizeof(double) * (size_t)(B * T * D));
    ref_rope(xv, B, T, D, cases[c].H, cases[c].offset,
             cases[c].base == 0 ? 10000 : cases[c].base, want);
    expect_close(got, want, B * T * D, 1e-14, "rope");
    free(got);
    free(want);
    free(xv);
    topos_network_release(net);
  }
}
END_TEST

/* The f32 tables are the double tables rounded once: rope of a one-hot x
 * reads cos and sin back exactly. */
START_TEST(test_rope_tables_rounded) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  double xv[8] = {1, 0, 0, 0, 0, 0, 0, 0}; /* lane 0 only */
  topos_value x = tt_constant(tape, tt_tensor(TOPOS_F32, 3, S(1, 1, 8), xv));
  topos_value y = topos_rope(tape, x, 1, 3, 0);
  topos_network *net = seal(tape);
  double *got = forward_one(net, y);
  /* y[0] = cos(3·θ0) = cos(3), y[4] = x0·sin(3) (rotate_half's lane 4 is
   * +x0). */
  ck_assert_msg(got[0] == (double)(float)cos(3.0), "%.9g", got[0]);
  ck_assert_msg(got[4] == (double)(float)sin(3.0), "%.9g", got[4]);
  free(got);
  topos_network_release(net);
}
END_TEST

START_TEST(test_rope_gradient) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = rand_leaf(tape, true, 3, S(2, 3, 8), 110, -1, 1, NULL);
  expect_gradients(tape, topos_rope(tape, x, 2, 4, 0));
}
END_TEST

START_TEST(test_rope_bad) {
  static const struct {
    int rank;
    int64_t d;
    int heads;
    int64_t offset;
    double base;
  } cases[] = {{3, 6, 2, 0, 0},  /* Dh = 3 is odd */
               {3, 8, 3, 0, 0},  /* 3 does not divide 8 */
               {3, 8, 0, 0, 0},  /* no heads */
               {2, 8, 2, 0, 0},  /* rank 2 */
               {3, 8, 2, -1, 0}, /* negative offset */
               {3, 8, 2, 0, -5}, /* negative base */
               {3, 8, 2, 0, INFINITY}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value x =
        cases[c].rank == 3
            ? rand_leaf(tape, false, 3, S(1, 2, cases[c].d), 1, -1, 1, NULL)
            : rand_leaf(tape, false, 2, S(2, cases[c].d), 1, -1, 1, NULL);
    topos_value y =
        topos_rope(tape, x, cases[c].heads, cases[c].offset, cases[c].base);
    expect_tape_error(tape, y, "rope:");
  }
}
END_TEST

START_TEST(test_rope_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_BF16);
  topos_value x = rand_leaf(tape, true, 3, S(1, 2, 4), 120, -1, 1, NULL);
  topos_value y = topos_rope(tape, x, 1, 2, 0);
  expect_emits(seal(tape), &y, 1, TOPOS_POSTURE_FORWARD,
               "\"stablehlo.concatenate\"", "stablehlo.negate");
}
END_TEST

/* ==================================================== cross entropy */

/* Σ over kept rows of logsumexp − logit[target], / kept (NaN for 0). */
static double ref_ce_ignore(const double *l, const int32_t *t, int n, int v,
                            int32_t ignore) {
  double total = 0;
  int kept = 0;
  for (int i = 0; i < n; i++) {
    if (t[i] == ignore) continue;
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < v; j++) mx = fmax(mx, l[i * v + j]);
    for (int j = 0; j < v; j++) z += exp(l[i * v + j] - mx);
    total += mx + log(z) - l[i * v + t[i]];
    kept++;
  }
  return total / kept;
}

static double ce_ignore_value(const int32_t *targets, int n, int v,
                              int32_t ignore, double *want) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  double *lv;
  topos_value l = rand_leaf(tape, false, 2, S(n, v), 130, -3, 3, &lv);
  topos_value y = topos_cross_entropy_ignore(
      tape, l, index_constant(tape, n, targets), ignore);
  topos_network *net = seal(tape);
  double *got = forward_one(net, y);
  double r = got[0];
  *want = ref_ce_ignore(lv, targets, n, v, ignore);
  free(got);
  free(lv);
  topos_network_release(net);
  return r;
}

START_TEST(test_ce_ignore_values) {
  const int n = 6, v = 5;
  static const struct {
    int32_t t[6];
    int32_t ignore;
  } cases[] = {
      {{1, -100, 4, 0, -100, 2}, -100}, /* PyTorch's default */
      {{1, 0, 4, 0, 3, 2}, 0},          /* a pad class inside [0, V) */
      {{1, 9, 4, 0, 9, 2}, 9},          /* beyond V */
      {{1, 3, 4, 0, 3, 2}, -1},         /* nothing ignored */
      {{-7, -7, -7, -7, -7, -7}, -7},   /* everything ignored: NaN */
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    double want,
        got = ce_ignore_value(cases[c].t, n, v, cases[c].ignore, &want);
    if (isnan(want))
      ck_assert_msg(isnan(got), "case %zu: %.17g, want NaN", c, got);
    else
      ck_assert_msg(fabs(got - want) <= 1e-14 * fmax(1, fabs(want)),
                    "case %zu: %.17g want %.17g", c, got, want);
  }
}
END_TEST

/* With nothing ignored it is topos_cross_entropy (up to the rounding of
 * sum/n against sum·(1/n)). */
START_TEST(test_ce_ignore_matches_plain) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value l = rand_leaf(tape, false, 2, S(4, 3), 131, -2, 2, NULL);
  const int32_t t[4] = {2, 0, 1, 1};
  topos_value idx = index_constant(tape, 4, t);
  topos_value a = topos_cross_entropy_ignore(tape, l, idx, -100);
  topos_value b = topos_cross_entropy(tape, l, idx);
  topos_network *net = seal(tape);
  topos_value roots[2] = {a, b};
  double *got[2];
  forward_many(net, roots, 2, got);
  expect_close(got[0], got[1], 1, 1e-15, "ce_ignore vs cross_entropy");
  free(got[0]);
  free(got[1]);
  topos_network_release(net);
}
END_TEST

START_TEST(test_ce_ignore_gradient) {
  static const int32_t ignores[3] = {-100, 1, 7};
  for (int c = 0; c < 3; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value l = rand_leaf(tape, true, 2, S(5, 4), 140 + c, -2, 2, NULL);
    int32_t t[5] = {3, ignores[c], 0, ignores[c], 2};
    expect_gradients(
        tape, topos_cross_entropy_ignore(tape, l, index_constant(tape, 5, t),
                                         ignores[c]));
  }
}
END_TEST

/* Run-time faults: a target outside [min(0, ignore), max(V−1, ignore)]
 * is a range error; one in the gap between ignore and [0, V) is NaN. */
START_TEST(test_ce_ignore_bad_targets) {
  static const struct {
    int32_t target, ignore;
    bool range_error;
  } cases[] = {{5, -100, true},        {-101, -100, true}, {-50, -100, false},
               {12, 9, true},          {7, 9, false},      {-1, 0, true},
               {INT32_MAX, -100, true}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value l = rand_leaf(tape, false, 2, S(3, 5), 150, -2, 2, NULL);
    int32_t t[3] = {1, cases[c].target, 2};
    topos_value y = topos_cross_entropy_ignore(
        tape, l, index_constant(tape, 3, t), cases[c].ignore);
    topos_network *net = seal(tape);
    topos_error err = {0};
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    if (cases[c].range_error) {
      ck_assert_msg(run == NULL, "case %zu ran", c);
      ck_assert_msg(err.code == TOPOS_ERR_RANGE, "case %zu: %s", c,
                    err.message);
    } else {
      ck_assert_msg(run != NULL, "case %zu: %s", c, err.message);
      ck_assert(isnan(topos_run_scalar(run, y, &err)));
      topos_run_free(run);
    }
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_ce_ignore_bad) {
  for (int c = 0; c < 6; c++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value l = rand_leaf(tape, false, 2, S(3, 5), 1, -1, 1, NULL);
    const int32_t tv[3] = {0, 1, 2};
    topos_value t = index_constant(tape, 3, tv);
    int32_t ignore = -100;
    switch (c) {
      case 0:
        l = rand_leaf(tape, false, 3, S(1, 3, 5), 2, -1, 1, NULL);
        break;
      case 1:
        t = index_constant(tape, 2, tv);
        break;
      case 2:
        t = rand_leaf(tape, false, 1, S(3), 2, 0, 3, NULL); /* f64 */
        break;
      case 3:
        ignore = INT32_MIN; /* too far outside [0, V) */
        break;
      case 4:
        l = TOPOS_NONE;
        break;
      case 5:
        l = rand_leaf(tape, false, 2, S(3, 0), 2, -1, 1, NULL);
        break;
    }
    expect_tape_error(tape, topos_cross_entropy_ignore(tape, l, t, ignore),
                      c == 4 ? NULL : "cross_entropy_ignore:");
  }
}
END_TEST

START_TEST(test_ce_ignore_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value l = rand_leaf(tape, true, 2, S(3, 4), 160, -1, 1, NULL);
  const int32_t t[3] = {1, -100, 3};
  topos_value loss =
      topos_cross_entropy_ignore(tape, l, index_constant(tape, 3, t), -100);
  topos_value g;
  ck_assert_int_eq(topos_tape_differentiate(tape, loss, &l, 1, &g), TOPOS_OK);
  topos_value roots[2] = {loss, g};
  expect_emits(seal(tape), roots, 2, TOPOS_POSTURE_TRAINING,
               "\"stablehlo.gather\"", "stablehlo.pad");
}
END_TEST

/* ============================================================= clipping */

START_TEST(test_clip_values) {
  for (int big = 0; big < 2; big++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    double *av, *bv;
    topos_value a = rand_leaf(tape, false, 2, S(3, 4), 170, -1, 1, &av);
    topos_value b = rand_leaf(tape, false, 1, S(5), 171, -1, 1, &bv);
    topos_value g[3] = {a, b, topos_scalar(tape, 0.5)};
    double sq = 0.25;
    for (int i = 0; i < 12; i++) sq += av[i] * av[i];
    for (int i = 0; i < 5; i++) sq += bv[i] * bv[i];
    double norm = sqrt(sq), max_norm = big ? norm / 3 : norm * 2;
    topos_value c[3], nv;
    ck_assert_int_eq(topos_clip_global_norm(tape, 3, g, max_norm, c, &nv),
                     TOPOS_OK);
    expect_shape(tape, c[0], 2, S(3, 4));
    expect_shape(tape, c[2], 0, NULL);
    topos_network *net = seal(tape);
    topos_value roots[5] = {c[0], c[1], c[2], nv, a};
    double *got[5];
    forward_many(net, roots, 5, got);
    expect_close(got[3], &norm, 1, 1e-15, "norm");
    double s = big ? max_norm / norm : 1.0;
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = av[i] * s;
    expect_close(got[0], want, 12, 1e-15, "clipped a");
    for (int i = 0; i < 5; i++) want[i] = bv[i] * s;
    expect_close(got[1], want, 5, 1e-15, "clipped b");
    want[0] = 0.5 * s;
    expect_close(got[2], want, 1, 1e-15, "clipped scalar");
    /* Under the cap the scale is exactly 1: the bits are kept. */
    if (!big) expect_same(got[0], got[4], 12, "unclipped");
    for (int i = 0; i < 5; i++) free(got[i]);
    free(av);
    free(bv);
    topos_network_release(net);
  }
}
END_TEST

/* Zero gradients: norm 0, scale 1, no division by zero. */
START_TEST(test_clip_zero_norm) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value z =
      tt_constant(tape, topos_tensor_zeros(TOPOS_F32, 1, S(4), NULL));
  topos_value c, nv;
  ck_assert_int_eq(topos_clip_global_norm(tape, 1, &z, 1.0, &c, &nv), TOPOS_OK);
  topos_network *net = seal(tape);
  topos_value roots[2] = {c, nv};
  double *got[2];
  forward_many(net, roots, 2, got);
  const double zeros[4] = {0};
  expect_same(got[0], zeros, 4, "clipped zeros");
  ck_assert(got[1][0] == 0);
  free(got[0]);
  free(got[1]);
  topos_network_release(net);
}
END_TEST

/* Clipping the gradients topos_tape_differentiate records, in place. */
START_TEST(test_clip_recorded_gradients) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  double *wv;
  topos_value w = rand_leaf(tape, true, 1, S(6), 180, -2, 2, &wv);
  topos_value loss = topos_sum(tape, topos_mul(tape, w, w)); /* grad 2w */
  topos_value g;
  ck_assert_int_eq(topos_tape_differentiate(tape, loss, &w, 1, &g), TOPOS_OK);
  ck_assert_int_eq(topos_clip_global_norm(tape, 1, &g, 1.0, &g, NULL),
                   TOPOS_OK);
  topos_network *net = seal(tape);
  double *got = forward_one(net, g);
  double n2 = 0;
  for (int i = 0; i < 6; i++) n2 += 4 * wv[i] * wv[i];
  double want[6];
  for (int i = 0; i < 6; i++) want[i] = 2 * wv[i] / sqrt(n2);
  expect_close(got, want, 6, 1e-15, "clipped gradient");
  free(got);
  free(wv);
  topos_network_release(net);
}
END_TEST

START_TEST(test_clip_gradient) {
  for (int big = 0; big < 2; big++) {
    topos_tape *tape = topos_tape_new(TOPOS_F64);
    topos_value a = rand_leaf(tape, true, 2, S(2, 3), 190, -1, 1, NULL);
    topos_value b = rand_leaf(tape, true, 1, S(4), 191, -1, 1, NULL);
    topos_value g[2] = {a, b}, c[2];
    ck_assert_int_eq(
        topos_clip_global_norm(tape, 2, g, big ? 0.3 : 100, c, NULL), TOPOS_OK);
    topos_value l0 = weighted_sum(tape, c[0], 5);
    expect_gradients(tape, topos_add(tape, l0, weighted_sum(tape, c[1], 6)));
  }
}
END_TEST

START_TEST(test_clip_bad) {
  topos_value c[2] = {{0, 0}, {0, 0}};
  for (int k = 0; k < 6; k++) {
    topos_tape *tape = topos_tape_new(TOPOS_F32);
    topos_value a = rand_leaf(tape, false, 1, S(3), 1, -1, 1, NULL);
    topos_value g[2] = {a, a};
    int n = 2, want = TOPOS_ERR_ARGUMENT;
    double max_norm = 1.0;
    switch (k) {
      case 0:
        n = 0;
        break;
      case 1:
        max_norm = 0;
        break;
      case 2:
        max_norm = NAN;
        break;
      case 3:
        g[1] = TOPOS_NONE;
        break;
      case 4: { /* a bf16 value on an f32 tape */
        topos_tensor *h = tt_tensor(TOPOS_BF16, 1, S(3), (double[]){1, 2, 3});
        g[1] = tt_constant(tape, h);
        want = TOPOS_ERR_DTYPE;
        break;
      }
      case 5: /* the tape has already failed */
        topos_tape_fail(tape, TOPOS_ERR_SHAPE, "earlier");
        want = TOPOS_ERR_STATE;
        break;
    }
    int rc = topos_clip_global_norm(tape, n, g, max_norm, c, NULL);
    ck_assert_msg(rc == want, "case %d: %d", k, rc);
    if (n > 0) ck_assert(!topos_value_ok(c[0]) && !topos_value_ok(c[1]));
    expect_tape_error(tape, TOPOS_NONE, k == 5 ? "earlier" : NULL);
  }
  ck_assert_int_eq(topos_clip_global_norm(NULL, 1, c, 1, c, NULL),
                   TOPOS_ERR_ARGUMENT);
}
END_TEST

START_TEST(test_clip_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value a = rand_leaf(tape, true, 2, S(2, 2), 200, -1, 1, NULL);
  topos_value loss = topos_sum(tape, topos_mul(tape, a, a));
  topos_value g, c, nv;
  ck_assert_int_eq(topos_tape_differentiate(tape, loss, &a, 1, &g), TOPOS_OK);
  ck_assert_int_eq(topos_clip_global_norm(tape, 1, &g, 0.1, &c, &nv), TOPOS_OK);
  topos_value roots[3] = {loss, c, nv};
  expect_emits(seal(tape), roots, 3, TOPOS_POSTURE_TRAINING,
               "\"stablehlo.sqrt\"", "stablehlo.sqrt");
}
END_TEST

/* ============================================================ schedule */

START_TEST(test_lr_schedule) {
  const double peak = 1e-3, fl = 1e-5;
  /* warmup: peak·(step+1)/warmup, reaching peak at warmup−1 */
  ck_assert(topos_lr_warmup_cosine(0, 10, 110, peak, fl) == peak * 1 / 10);
  ck_assert(topos_lr_warmup_cosine(4, 10, 110, peak, fl) == peak * 5 / 10);
  ck_assert(topos_lr_warmup_cosine(9, 10, 110, peak, fl) == peak);
  /* cosine from peak at `warmup` to floor at total−1 */
  ck_assert(topos_lr_warmup_cosine(10, 10, 110, peak, fl) == peak);
  double mid = topos_lr_warmup_cosine(10 + 99 / 2, 10, 110, peak, fl);
  double want = fl + (peak - fl) * 0.5 * (1 + cos(M_PI * 49.0 / 99.0));
  ck_assert_msg(fabs(mid - want) <= 1e-18, "%.17g vs %.17g", mid, want);
  ck_assert(topos_lr_warmup_cosine(109, 10, 110, peak, fl) == fl);
  ck_assert(topos_lr_warmup_cosine(110, 10, 110, peak, fl) == fl);
  ck_assert(topos_lr_warmup_cosine(1000000, 10, 110, peak, fl) == fl);
  /* non-increasing after warmup */
  double prev = INFINITY;
  for (int64_t s = 10; s < 120; s++) {
    double lr = topos_lr_warmup_cosine(s, 10, 110, peak, fl);
    ck_assert_msg(lr <= prev && lr >= fl, "step %lld", (long long)s);
    prev = lr;
  }
  /* no warmup: peak at step 0 */
  ck_assert(topos_lr_warmup_cosine(0, 0, 50, peak, 0) == peak);
  ck_assert(topos_lr_warmup_cosine(49, 0, 50, peak, 0) == 0);
  /* a one-step decay phase lands on floor; warmup == total never decays */
  ck_assert(topos_lr_warmup_cosine(9, 9, 10, peak, fl) == fl);
  ck_assert(topos_lr_warmup_cosine(9, 10, 10, peak, fl) == peak);
  ck_assert(topos_lr_warmup_cosine(10, 10, 10, peak, fl) == fl);
  /* nonsense is NaN */
  ck_assert(isnan(topos_lr_warmup_cosine(-1, 10, 110, peak, fl)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, -1, 110, peak, fl)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 10, 0, peak, fl)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 11, 10, peak, fl)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 1, 10, -1, 0)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 1, 10, peak, 2 * peak)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 1, 10, NAN, 0)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 1, 10, INFINITY, 0)));
  ck_assert(isnan(topos_lr_warmup_cosine(0, 1, 10, peak, -1e-9)));
}
END_TEST

/* ============================================================ embedding */

/* nn.c's embedding (test_nn.c has its values and finite differences)
 * through emission: a rank-2 index becomes reshape -> gather -> reshape,
 * and its gradient a scatter. */
START_TEST(test_embedding_emits) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value table = rand_leaf(tape, true, 2, S(5, 3), 210, -1, 1, NULL);
  const int32_t ix[4] = {4, 0, 0, 2};
  topos_tensor *it = topos_tensor_from(TOPOS_I32, 2, S(2, 2), ix, NULL);
  topos_value idx = topos_input(tape, it);
  topos_tensor_release(it);
  topos_value e = topos_embedding(tape, table, idx);
  topos_value loss = weighted_sum(tape, e, 3);
  topos_value g;
  ck_assert_int_eq(topos_tape_differentiate(tape, loss, &table, 1, &g),
                   TOPOS_OK);
  topos_value roots[3] = {loss, g, e};
  expect_emits(seal(tape), roots, 3, TOPOS_POSTURE_TRAINING,
               "\"stablehlo.scatter\"", "\"stablehlo.gather\"");
}
END_TEST

Suite *transformer_suite(void) {
  Suite *s = suite_create("transformer");
  const tt_case cases[] = {
      {"erf", test_erf_op_bits},
      {"erf", test_erf_op_gradient},
      {"erf", test_erf_op_emits},
      {"gelu_exact", test_gelu_exact_values},
      {"gelu_exact", test_gelu_exact_gradient},
      {"gelu_exact", test_gelu_exact_bad},
      {"gelu_exact", test_gelu_exact_emits},
      {"attention", test_attention_values},
      {"attention", test_attention_gradient},
      {"attention", test_attention_bad},
      {"attention", test_attention_cache_bits},
      {"attention", test_attention_emits},
      {"self_attention", test_self_attention_values},
      {"self_attention", test_self_attention_gradient},
      {"self_attention", test_self_attention_bad},
      {"self_attention", test_self_attention_emits},
      {"rope", test_rope_values},
      {"rope", test_rope_tables_rounded},
      {"rope", test_rope_gradient},
      {"rope", test_rope_bad},
      {"rope", test_rope_emits},
      {"cross_entropy_ignore", test_ce_ignore_values},
      {"cross_entropy_ignore", test_ce_ignore_matches_plain},
      {"cross_entropy_ignore", test_ce_ignore_gradient},
      {"cross_entropy_ignore", test_ce_ignore_bad_targets},
      {"cross_entropy_ignore", test_ce_ignore_bad},
      {"cross_entropy_ignore", test_ce_ignore_emits},
      {"clip_global_norm", test_clip_values},
      {"clip_global_norm", test_clip_zero_norm},
      {"clip_global_norm", test_clip_recorded_gradients},
      {"clip_global_norm", test_clip_gradient},
      {"clip_global_norm", test_clip_bad},
      {"clip_global_norm", test_clip_emits},
      {"schedule", test_lr_schedule},
      {"embedding", test_embedding_emits},
  };
  tt_add_cases(s, cases, sizeof cases / sizeof cases[0], 120);
  return s;
}
