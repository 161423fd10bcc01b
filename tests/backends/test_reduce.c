/*
 * test_reduce.c - the cpu backend's reduction and map tasks
 * (backends/cpu_reduce.c).
 *
 * Every check is bit for bit (memcmp): reductions against this file's own
 * scalar striped-16 rule (numerics.md) over n in {0, 1, 15, 16, 17, 31,
 * 33, 100, 1000, 4097}, inner 1 and > 1 (whole vectors and ragged tails),
 * several outers, f32 and f64, every ISA this CPU has, thread counts
 * 1..4, NaN/Inf/-0 inputs; maps against a plain per-element loop; then the
 * engine with the chain on against the engine with it off (sum,
 * sum_along on every axis, every elementwise op, f32/f64/bf16).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "cpu_reduce.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static const int64_t ns[10] = {0, 1, 15, 16, 17, 31, 33, 100, 1000, 4097};

static void restore(void) {
  backend_set_threads(0);
  topos_cpu_force_isa(NULL);
}

static uint64_t rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

/* Random values in [-1, 1); `special` sprinkles NaN, +-Inf, -0 and huge
 * values (1 in 61 elements each kind, by position). */
static void fill(void *p, topos_dtype d, int64_t n, uint64_t seed,
                 bool special) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  for (int64_t i = 0; i < n; i++) {
    double v = (double)(rng(&s) >> 11) / 9007199254740992.0 * 2 - 1;
    if (special) {
      uint64_t k = rng(&s) % 61;
      if (k == 0) v = NAN;
      if (k == 1) v = INFINITY;
      if (k == 2) v = -INFINITY;
      if (k == 3 || k == 4) v = -0.0;
      if (k == 5) v = d == TOPOS_F64 ? 1.5e308 : 3e38;
    }
    if (d == TOPOS_F64)
      ((double *)p)[i] = v;
    else
      ((float *)p)[i] = (float)v;
  }
}

/* a + b with a the first operand of the add instruction: where both are
 * NaN the result is a's (x86), as in the reference's acc = acc + x. */
__attribute__((noinline)) static float add_f32(float a, float b) {
  return a + b;
}
__attribute__((noinline)) static double add_f64(double a, double b) {
  return a + b;
}

/* The striped-16 rule, written out again (numerics.md). */
#define STRIPED(T, SUF)                                                      \
  static T striped_##SUF(const T *x, int64_t n, int64_t s) {                 \
    if (n == 0) return (T)0;                                                 \
    if (n <= 16) {                                                           \
      T acc = x[0];                                                          \
      for (int64_t i = 1; i < n; i++) acc = add_##SUF(acc, x[i * s]);        \
      return acc;                                                            \
    }                                                                        \
    T lane[16];                                                              \
    for (int l = 0; l < 16; l++) {                                           \
      lane[l] = x[l * s];                                                    \
      for (int64_t i = l + 16; i < n; i += 16)                               \
        lane[l] = add_##SUF(lane[l], x[i * s]);                              \
    }                                                                        \
    T l8[8], l4[4], l2[2];                                                   \
    for (int l = 0; l < 8; l++)                                              \
      l8[l] = add_##SUF(lane[2 * l], lane[2 * l + 1]);                       \
    for (int l = 0; l < 4; l++) l4[l] = add_##SUF(l8[2 * l], l8[2 * l + 1]); \
    for (int l = 0; l < 2; l++) l2[l] = add_##SUF(l4[2 * l], l4[2 * l + 1]); \
    return add_##SUF(l2[0], l2[1]);                                          \
  }
STRIPED(float, f32)
STRIPED(double, f64)

static size_t esize(topos_dtype d) {
  return d == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

/* One reduction through the cpu backend's run() against the rule. */
static void check_reduce(topos_dtype d, int64_t outer, int64_t L, int64_t inner,
                         int threads, uint64_t seed, bool special,
                         const char *what) {
  size_t es = esize(d);
  int64_t nx = outer * L * inner, ny = outer * inner;
  void *x = malloc((size_t)(nx > 0 ? nx : 1) * es);
  void *want = malloc((size_t)(ny > 0 ? ny : 1) * es);
  void *got = malloc((size_t)(ny > 0 ? ny : 1) * es + 64);
  ck_assert(x && want && got);
  fill(x, d, nx, seed, special);
  memset(got, 0x5a, (size_t)ny * es + 64);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      if (d == TOPOS_F64)
        ((double *)want)[o * inner + i] =
            striped_f64((const double *)x + o * L * inner + i, L, inner);
      else
        ((float *)want)[o * inner + i] =
            striped_f32((const float *)x + o * L * inner + i, L, inner);
    }
  const topos_backend *cpu = topos_cpu_backend();
  topos_task t = {.kind = TOPOS_TASK_REDUCE, .threads = threads};
  t.u.reduce = (topos_reduce_task){
      .dtype = d, .outer = outer, .L = L, .inner = inner, .x = x, .y = got};
  topos_error err = {0};
  unsigned long long before = topos_cpu_reduce_tasks_run();
  ck_assert_int_eq(cpu->run(cpu, &t, &err), TOPOS_OK);
  ck_assert_int_eq(topos_cpu_reduce_tasks_run(), before + 1);
  for (int64_t i = 0; i < ny && getenv("TOPOS_REDUCE_DEBUG"); i++)
    if (memcmp((char *)want + i * es, (char *)got + i * es, es)) {
      uint64_t w = 0, g = 0;
      memcpy(&w, (char *)want + i * es, es);
      memcpy(&g, (char *)got + i * es, es);
      fprintf(stderr,
              "  %s L %lld inner %lld outer %lld y[%lld] want %llx got %llx\n",
              what, (long long)L, (long long)inner, (long long)outer,
              (long long)i, (unsigned long long)w, (unsigned long long)g);
    }
  ck_assert_msg(memcmp(want, got, (size_t)ny * es) == 0,
                "%s: %s outer %lld L %lld inner %lld threads %d: bits differ",
                what, topos_dtype_name(d), (long long)outer, (long long)L,
                (long long)inner, threads);
  /* nothing written past y */
  unsigned char *tail = (unsigned char *)got + (size_t)ny * es;
  for (int i = 0; i < 64; i++) ck_assert_int_eq(tail[i], 0x5a);
  free(x);
  free(want);
  free(got);
}

/* Every n of the sweep, inner 1 and ragged/whole vectors, for dtype _i/2
 * and every ISA the CPU has; thread counts cycle 1..4. */
START_TEST(reduce_sweep) {
  topos_dtype d = _i ? TOPOS_F64 : TOPOS_F32;
  const char *isas[] = {"avx512", "avx2", "c"};
  const int64_t inners[] = {1, 2, 7, 8, 16, 17, 40};
  const int64_t outers[] = {1, 3, 6};
  int ran = 0, c = 0;
  for (int k = 0; k < 3; k++) {
    if (topos_cpu_force_isa(isas[k]) != 0) continue;
    ran++;
    for (int ni = 0; ni < 10; ni++)
      for (int ii = 0; ii < 7; ii++)
        for (int oi = 0; oi < 3; oi++, c++)
          check_reduce(d, outers[oi], ns[ni], inners[ii], 1 + c % 4,
                       (uint64_t)c, c % 5 == 0, isas[k]);
  }
  ck_assert_int_ge(ran, 1);
  restore();
}
END_TEST

/* Thread counts 1..4 on shapes big enough to split, special values. */
START_TEST(reduce_threads) {
  const char *slow = getenv("TOPOS_SKIP_SLOW");
  int64_t big = slow && *slow && strcmp(slow, "0") != 0 ? 1 << 14 : 1 << 20;
  for (int di = 0; di < 2; di++) {
    topos_dtype d = di ? TOPOS_F64 : TOPOS_F32;
    for (int th = 1; th <= 4; th++) {
      check_reduce(d, 1, big, 1, th, 11, false, "one long row");
      check_reduce(d, 1, big, 1, th, 12, true, "one long row, special");
      check_reduce(d, 67, 4097, 1, th, 13, true, "rows");
      check_reduce(d, 9, 1000, 129, th, 14, true, "columns");
      check_reduce(d, 300, 33, 17, th, 15, false, "ragged columns");
      check_reduce(d, 4097, 17, 1, th, 16, true, "short rows");
    }
  }
  restore();
}
END_TEST

/* All -0 sums to -0; Inf - Inf is NaN; overflow gives Inf, in the lanes
 * the rule says. */
START_TEST(reduce_special) {
  for (int di = 0; di < 2; di++) {
    topos_dtype d = di ? TOPOS_F64 : TOPOS_F32;
    for (int ni = 0; ni < 10; ni++) {
      int64_t n = ns[ni];
      for (int inner = 1; inner <= 17; inner += 16) {
        int64_t cnt = n * inner;
        void *x = malloc((size_t)(cnt > 0 ? cnt : 1) * esize(d));
        void *y = malloc((size_t)inner * esize(d));
        void *w = malloc((size_t)inner * esize(d));
        for (int pat = 0; pat < 3; pat++) {
          for (int64_t i = 0; i < cnt; i++) {
            double v = pat == 0   ? -0.0
                       : pat == 1 ? (i % 33 == 5    ? INFINITY
                                     : i % 33 == 20 ? -INFINITY
                                                    : 1.0)
                                  : (d == TOPOS_F64 ? 1e308 : 3e38);
            if (d == TOPOS_F64)
              ((double *)x)[i] = v;
            else
              ((float *)x)[i] = (float)v;
          }
          for (int64_t i = 0; i < inner; i++) {
            if (d == TOPOS_F64)
              ((double *)w)[i] = striped_f64((const double *)x + i, n, inner);
            else
              ((float *)w)[i] = striped_f32((const float *)x + i, n, inner);
          }
          topos_task t = {.kind = TOPOS_TASK_REDUCE, .threads = 2};
          t.u.reduce = (topos_reduce_task){
              .dtype = d, .outer = 1, .L = n, .inner = inner, .x = x, .y = y};
          const topos_backend *cpu = topos_cpu_backend();
          topos_error err = {0};
          ck_assert_int_eq(cpu->run(cpu, &t, &err), TOPOS_OK);
          ck_assert_msg(memcmp(w, y, (size_t)inner * esize(d)) == 0,
                        "pattern %d n %lld inner %d", pat, (long long)n, inner);
          if (pat == 0 && n > 0) { /* -0 stays -0 */
            double v = d == TOPOS_F64 ? ((double *)y)[0] : ((float *)y)[0];
            ck_assert(v == 0 && signbit(v));
          }
        }
        free(x);
        free(y);
        free(w);
      }
    }
  }
}
END_TEST

START_TEST(reduce_supports) {
  const topos_backend *cpu = topos_cpu_backend();
  topos_task t = {.kind = TOPOS_TASK_REDUCE, .threads = 1};
  t.u.reduce = (topos_reduce_task){
      .dtype = TOPOS_F32, .outer = 1, .L = 1000, .inner = 1};
  ck_assert(cpu->supports(cpu, &t));
  t.u.reduce.dtype = TOPOS_F64;
  ck_assert(cpu->supports(cpu, &t));
  t.u.reduce.dtype = TOPOS_BF16;
  ck_assert(!cpu->supports(cpu, &t));
  t.u.reduce.dtype = TOPOS_I32;
  ck_assert(!cpu->supports(cpu, &t));
  t.u.reduce.dtype = TOPOS_F32;
  t.u.reduce.L = 10; /* too small to bother */
  ck_assert(!cpu->supports(cpu, &t));
  t.u.reduce.L = -1;
  ck_assert(!cpu->supports(cpu, &t));
  t.u.reduce.L = INT64_MAX / 2;
  t.u.reduce.outer = 4; /* overflow */
  ck_assert(!cpu->supports(cpu, &t));
  /* maps: threads and size */
  topos_task m = {.kind = TOPOS_TASK_MAP, .threads = 2};
  float dummy = 0;
  m.u.map = (topos_map_task){.dtype = TOPOS_F32,
                             .op = TOPOS_MAP_TANH,
                             .n = 1 << 16,
                             .a = &dummy,
                             .y = &dummy};
  ck_assert(cpu->supports(cpu, &m));
  /* f32 tanh/exp/log on cpu_math.c's vector kernels go at any thread
   * count and size (test_math.c); the libm-per-element rule is f64's */
  m.u.map.dtype = TOPOS_F64;
  ck_assert(cpu->supports(cpu, &m));
  m.threads = 1;
  ck_assert(!cpu->supports(cpu, &m));
  m.threads = 2;
  m.u.map.n = 1000;
  ck_assert(!cpu->supports(cpu, &m));
  m.u.map.n = 1 << 16;
  m.u.map.op = TOPOS_MAP_ADD; /* cheap ops need more, and b */
  ck_assert(!cpu->supports(cpu, &m));
  m.u.map.n = 1 << 20;
  ck_assert(!cpu->supports(cpu, &m));
  m.u.map.b = &dummy;
  ck_assert(cpu->supports(cpu, &m));
  /* on sixteen lanes (f32 on AVX-512) from 32K elements */
  m.u.map.dtype = TOPOS_F32;
  m.u.map.n = 1 << 15;
  ck_assert_int_eq(cpu->supports(cpu, &m),
                   strcmp(topos_cpu_isa(), "avx512") == 0);
  m.u.map.n = (1 << 15) - 1;
  ck_assert(!cpu->supports(cpu, &m));
  if (topos_cpu_force_isa("avx2") == 0) {
    m.u.map.n = 1 << 15;
    ck_assert(!cpu->supports(cpu, &m));
    topos_cpu_force_isa(NULL);
  }
  m.u.map.n = 1 << 20;
  m.u.map.op = TOPOS_MAP_COUNT;
  ck_assert(!cpu->supports(cpu, &m));
}
END_TEST

/* ----------------------------------------------------------------- maps */

#define MAP_REF(T, SUF, EXP, LOG, SQRT, TANH, POW)           \
  static T map1_##SUF(topos_map_op op, T x, T b, T p) {      \
    switch (op) {                                            \
      case TOPOS_MAP_NEG:                                    \
        return -x;                                           \
      case TOPOS_MAP_EXP:                                    \
        return EXP(x);                                       \
      case TOPOS_MAP_LOG:                                    \
        return LOG(x);                                       \
      case TOPOS_MAP_SQRT:                                   \
        return SQRT(x);                                      \
      case TOPOS_MAP_TANH:                                   \
        return TANH(x);                                      \
      case TOPOS_MAP_POW:                                    \
        return POW(x, p);                                    \
      case TOPOS_MAP_RELU:                                   \
        return isnan(x) ? x : (x > 0 ? x : (T)0);            \
      case TOPOS_MAP_ADD:                                    \
        return x + b;                                        \
      case TOPOS_MAP_SUB:                                    \
        return x - b;                                        \
      case TOPOS_MAP_MUL:                                    \
        return x * b;                                        \
      case TOPOS_MAP_DIV:                                    \
        return x / b;                                        \
      case TOPOS_MAP_MAXIMUM:                                \
        return isnan(x) ? x : isnan(b) ? b : x >= b ? x : b; \
      case TOPOS_MAP_STEP:                                   \
        return x >= b ? (T)1 : (T)0;                         \
      default:                                               \
        return (T)0;                                         \
    }                                                        \
  }
MAP_REF(float, f32, expf, logf, sqrtf, tanhf, powf)
MAP_REF(double, f64, exp, log, sqrt, tanh, pow)

START_TEST(map_direct) {
  const int64_t n = 100003;
  for (int di = 0; di < 2; di++) {
    topos_dtype d = di ? TOPOS_F64 : TOPOS_F32;
    size_t es = esize(d);
    void *a = malloc((size_t)n * es), *b = malloc((size_t)n * es);
    void *w = malloc((size_t)n * es), *y = malloc((size_t)n * es);
    fill(a, d, n, 21, true);
    fill(b, d, n, 22, true);
    for (int op = 0; op < TOPOS_MAP_COUNT; op++) {
      double p = 2.5;
      for (int64_t i = 0; i < n; i++) {
        if (d == TOPOS_F64)
          ((double *)w)[i] =
              map1_f64((topos_map_op)op, ((double *)a)[i], ((double *)b)[i], p);
        else
          ((float *)w)[i] = map1_f32((topos_map_op)op, ((float *)a)[i],
                                     ((float *)b)[i], (float)p);
      }
      for (int th = 1; th <= 4; th++) {
        memset(y, 0, (size_t)n * es);
        topos_task t = {.kind = TOPOS_TASK_MAP, .threads = th};
        t.u.map = (topos_map_task){.dtype = d,
                                   .op = (topos_map_op)op,
                                   .p = p,
                                   .n = n,
                                   .a = a,
                                   .b = op >= TOPOS_MAP_ADD ? b : NULL,
                                   .y = y};
        const topos_backend *cpu = topos_cpu_backend();
        topos_error err = {0};
        ck_assert_int_eq(cpu->run(cpu, &t, &err), TOPOS_OK);
        ck_assert_msg(memcmp(w, y, (size_t)n * es) == 0,
                      "%s op %d threads %d: bits differ", topos_dtype_name(d),
                      op, th);
      }
    }
    free(a);
    free(b);
    free(w);
    free(y);
  }
  restore();
}
END_TEST

/* ------------------------------------------------------ through the engine */

static topos_value input_special(topos_tape *t, topos_dtype d, int rank,
                                 const int64_t *shape, uint64_t seed, double lo,
                                 double hi, bool special) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 5;
  for (int64_t i = 0; i < n; i++) {
    v[i] = tt_uniform(&s, lo, hi);
    if (special) {
      int64_t k = i % 97;
      if (k == 3) v[i] = NAN;
      if (k == 10) v[i] = INFINITY;
      if (k == 50) v[i] = -INFINITY;
      if (k == 70) v[i] = -0.0;
    }
  }
  topos_tensor *x = tt_tensor(d, rank, shape, v);
  free(v);
  topos_value r = topos_input(t, x);
  topos_tensor_release(x);
  return r;
}

static topos_network *seal(topos_tape *t) {
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "record: %s", e);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

/* Forward with the chain off and on at 1..4 threads; every root's bits
 * equal.  Returns how many reduce + map tasks the cpu backend ran. */
static unsigned long long compare_runs(topos_network *net,
                                       const topos_value *roots, int nroots,
                                       const char *what) {
  unsigned long long ran = 0;
  topos_error err = {0};
  topos_run *ref = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
  ck_assert_msg(ref != NULL, "%s", err.message);
  for (int th = 1; th <= 4; th++) {
    backend_set_threads(th);
    unsigned long long before =
        topos_cpu_reduce_tasks_run() + topos_cpu_map_tasks_run();
    topos_run *got = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert_msg(got != NULL, "%s", err.message);
    ran += topos_cpu_reduce_tasks_run() + topos_cpu_map_tasks_run() - before;
    for (int r = 0; r < nroots; r++) {
      const topos_tensor *x = topos_run_of(ref, roots[r], &err);
      const topos_tensor *y = topos_run_of(got, roots[r], &err);
      ck_assert_msg(x && y, "%s root %d: missing", what, r);
      ck_assert_msg(topos_tensor_bitwise_equal(x, y),
                    "%s root %d threads %d: bits differ", what, r, th);
    }
    topos_run_free(got);
  }
  topos_run_free(ref);
  backend_set_threads(0);
  return ran;
}

START_TEST(engine_sums) {
  topos_backends_register_defaults();
  const topos_dtype dts[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  for (int di = 0; di < 3; di++) {
    topos_dtype d = dts[di];
    topos_tape *t = topos_tape_new(d);
    topos_value a = input_special(t, d, 3, S(7, 1000, 33), 1, -1, 1, false);
    topos_value b = input_special(t, d, 2, S(1, 1 << 18), 2, -1, 1, true);
    topos_value c = input_special(t, d, 2, S(4097, 17), 3, -1, 1, true);
    topos_value roots[8];
    roots[0] = topos_sum(t, a);
    roots[1] = topos_sum_along(t, a, 0);
    roots[2] = topos_sum_along(t, a, 1);
    roots[3] = topos_sum_along(t, a, 2);
    roots[4] = topos_sum(t, b);
    roots[5] = topos_sum_along(t, c, 0);
    roots[6] = topos_sum_along(t, c, 1);
    roots[7] = topos_sum_along(t, b, 1);
    topos_network *net = seal(t);
    unsigned long long ran = compare_runs(net, roots, 8, topos_dtype_name(d));
    ck_assert_uint_ge(ran, 4 * 8);
    topos_network_release(net);
  }
  restore();
}
END_TEST

START_TEST(engine_maps) {
  topos_backends_register_defaults();
  const topos_dtype dts[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  for (int di = 0; di < 3; di++) {
    topos_dtype d = dts[di];
    topos_tape *t = topos_tape_new(d);
    /* libm ops: 120000 elements; cheap ops: a little over 2^20 */
    topos_value a = input_special(t, d, 2, S(300, 400), 4, -3, 3, true);
    topos_value x = input_special(t, d, 2, S(1025, 1024), 5, -3, 3, true);
    topos_value y = input_special(t, d, 2, S(1025, 1024), 6, -3, 3, true);
    topos_value roots[14];
    int r = 0;
    roots[r++] = topos_exp(t, a);
    roots[r++] = topos_log(t, a);
    roots[r++] = topos_sqrt(t, a);
    roots[r++] = topos_tanh(t, a);
    roots[r++] = topos_pow(t, a, 1.7);
    roots[r++] = topos_neg(t, x);
    roots[r++] = topos_relu(t, x);
    roots[r++] = topos_add(t, x, y);
    roots[r++] = topos_sub(t, x, y);
    roots[r++] = topos_mul(t, x, y);
    roots[r++] = topos_div(t, x, y);
    roots[r++] = topos_maximum(t, x, y);
    roots[r++] = topos_step(t, x, y);
    roots[r++] = topos_sum(t, topos_tanh(t, x));
    topos_network *net = seal(t);
    unsigned long long ran = compare_runs(net, roots, r, topos_dtype_name(d));
    /* threads 2..4: the 3 libm maps over 120000 (sqrt is cheap), the 8
     * cheap maps and tanh over 2^20 elements, and the sum */
    ck_assert_uint_ge(ran, 3 * 13);
    topos_network_release(net);
  }
  restore();
}
END_TEST

Suite *reduce_suite(void) {
  Suite *s = suite_create("reduce");
  TCase *tc = tcase_create("direct");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, reduce_supports);
  tcase_add_loop_test(tc, reduce_sweep, 0, 2);
  tcase_add_test(tc, reduce_threads);
  tcase_add_test(tc, reduce_special);
  tcase_add_test(tc, map_direct);
  suite_add_tcase(s, tc);
  TCase *e = tcase_create("engine");
  tcase_set_timeout(e, 120);
  tcase_add_test(e, engine_sums);
  tcase_add_test(e, engine_maps);
  suite_add_tcase(s, e);
  return s;
}
