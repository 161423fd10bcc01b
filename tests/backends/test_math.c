/*
 * test_math.c - cpu_math.c's f32 tanhf / expf / logf kernels and the map
 * tasks that use them (backends/cpu_math.c, backends/cpu_reduce.c).
 *
 * Every check compares bit patterns with this process's libm: a strided
 * sweep over all 2^32 inputs (every exponent, both signs, NaN payloads),
 * specials and each branch threshold of glibc's code with neighbours,
 * every length 0..40 at every alignment with guard values, in place; each
 * for every ISA kernel this CPU runs, and for cpu_math_f32 (whatever is
 * live).  Then map tasks at 1..4 threads, and the engine with the chain on
 * against the reference interpreter.
 *
 * The exhaustive check (all 2^32 inputs per function and ISA) is too slow
 * for the suite; docs/backends.md says how it was run.
 */
#include <check.h>
#include <gnu/libc-version.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "cpu_math.h"
#include "cpu_reduce.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static const char *const fn_name[CPU_MATH_COUNT] = {"tanhf", "expf", "logf"};
static const char *const isas[2] = {"avx512", "avx2"};

static float libm1(int f, float x) {
  return f == CPU_MATH_TANH ? tanhf(x) : f == CPU_MATH_EXP ? expf(x) : logf(x);
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float fbits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Index of the first element whose bits differ, or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n) {
  if (memcmp(a, b, (size_t)n * sizeof(float)) == 0) return -1;
  for (int64_t i = 0; i < n; i++)
    if (bits(a[i]) != bits(b[i])) return i;
  return -1;
}

/* y = f(x) by every kernel this CPU has and by cpu_math_f32, each against
 * libm's want. */
static void check_all(int f, const float *x, const float *want, float *got,
                      int64_t n, const char *what) {
  for (int k = 0; k <= 2; k++) {
    const char *isa = k < 2 ? isas[k] : "live";
    memset(got, 0, (size_t)n * sizeof(float));
    if (k < 2) {
      if (!cpu_math_kernel((cpu_math_fn)f, isa, x, got, n)) continue;
    } else {
      cpu_math_f32((cpu_math_fn)f, x, got, n);
    }
    int64_t i = first_diff(want, got, n);
    ck_assert_msg(i < 0, "%s %s %s: x=%08x (%a): libm %08x, got %08x",
                  fn_name[f], isa, what, i < 0 ? 0 : bits(x[i]),
                  i < 0 ? 0.0 : (double)x[i], i < 0 ? 0 : bits(want[i]),
                  i < 0 ? 0 : bits(got[i]));
  }
}

/* On this project's machines (x86-64 with AVX2+FMA or AVX-512, glibc 2.36)
 * every kernel must pass its self-check. */
START_TEST(math_live) {
  const char *v = gnu_get_libc_version();
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool vec = __builtin_cpu_supports("avx512f") ||
             (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
#else
  bool vec = false;
#endif
  const char *env = getenv("TOPOS_CPU_MATH");
  bool off = env && strcmp(env, "libm") == 0;
  for (int f = 0; f < CPU_MATH_COUNT; f++) {
    bool live = cpu_math_live((cpu_math_fn)f);
    if (vec && !off && strcmp(v, "2.36") == 0)
      ck_assert_msg(live, "%s: self-check failed on glibc %s", fn_name[f], v);
    if (!vec || off) ck_assert(!live);
  }
  ck_assert(!cpu_math_live(CPU_MATH_COUNT));
  ck_assert(!cpu_math_kernel(CPU_MATH_TANH, "sse9", NULL, NULL, 0));
  ck_assert(!cpu_math_kernel(CPU_MATH_COUNT, "avx2", NULL, NULL, 0));
}
END_TEST

/* Every 509th bit pattern from a start that moves with the loop index:
 * over 8 million inputs per function, at least 16000 in each binade
 * (every 31049th under TOPOS_SKIP_SLOW, e.g. valgrind). */
START_TEST(math_sweep) {
  int f = _i;
  const int64_t C = 1 << 20;
  const uint64_t stride = getenv("TOPOS_SKIP_SLOW") ? 509 * 61 : 509;
  float *x = malloc((size_t)C * sizeof(float));
  float *want = malloc((size_t)C * sizeof(float));
  float *got = malloc((size_t)C * sizeof(float));
  uint64_t b = (uint64_t)f * 97;
  while (b < ((uint64_t)1 << 32)) {
    int64_t n = 0;
    for (; n < C && b < ((uint64_t)1 << 32); n++, b += stride)
      x[n] = fbits((uint32_t)b);
    for (int64_t i = 0; i < n; i++) want[i] = libm1(f, x[i]);
    check_all(f, x, want, got, n, "sweep");
  }
  free(x);
  free(want);
  free(got);
}
END_TEST

static void push(float *v, int64_t *n, int64_t cap, uint32_t b) {
  if (*n < cap) v[(*n)++] = fbits(b);
}

/* b and its neighbours out to w ulps, both signs. */
static void near(float *v, int64_t *n, int64_t cap, uint32_t b, int w) {
  for (int d = -w; d <= w; d++) {
    uint32_t m = (b & 0x7fffffffu) + (uint32_t)d;
    push(v, n, cap, m);
    push(v, n, cap, m | 0x80000000u);
  }
}

START_TEST(math_special) {
  int f = _i;
  const int64_t cap = 1 << 16;
  float *x = malloc((size_t)cap * sizeof(float));
  float *want = malloc((size_t)cap * sizeof(float));
  float *got = malloc((size_t)cap * sizeof(float));
  int64_t n = 0;
  static const uint32_t sp[] = {
      0x00000000, 0x7f800000, 0x7fc00000, 0x7f800001, 0x7fa12345, 0x7fbfffff,
      0x7fffffff, 0x7fd00001, 0x00000001, 0x007fffff, 0x00800000, 0x7f7fffff,
      0x3f800000, 0x3f000000, 0x40000000, 0x33800000, 0x0c000000,
  };
  for (size_t i = 0; i < sizeof sp / sizeof *sp; i++)
    near(x, &n, cap, sp[i], 8);
  /* each threshold of the libm code (s_tanhf.c + s_expm1f.c at u = 2|x|,
   * e_expf.c, e_logf.c), neighbours to 16 ulps */
  static const uint32_t th_tanh[] = {0x41b00000, 0x24000000, 0x3f800000,
                                     0x4115b844, 0x3e317218, 0x3f051592,
                                     0x32800000, 0x42317218};
  static const uint32_t th_exp[] = {0x42b00000, 0x42b17217, 0x42b17218,
                                    0x42cff1b4, 0x42ce8ecf, 0x42aeac50,
                                    0x3f317218, 0x33000000};
  static const uint32_t th_log[] = {0x3f800000, 0x00800000, 0x7f800000,
                                    0x3f330000, 0x3fb30000, 0x3eb30000};
  const uint32_t *th = f == CPU_MATH_TANH  ? th_tanh
                       : f == CPU_MATH_EXP ? th_exp
                                           : th_log;
  size_t nth = f == CPU_MATH_TANH  ? sizeof th_tanh / sizeof *th_tanh
               : f == CPU_MATH_EXP ? sizeof th_exp / sizeof *th_exp
                                   : sizeof th_log / sizeof *th_log;
  for (size_t i = 0; i < nth; i++) near(x, &n, cap, th[i], 16);
  /* inputs that separate a fused from an unfused operation (found by the
   * exhaustive comparison): tanhf with an FMA-contracted expm1f
   * polynomial; expf with r = x·32/ln2 - kd unfused */
  static const uint32_t hard[] = {
      0x3df46db4, 0x3dff3a9e, 0x3e12dd9a, 0x3e332a19, 0x3dc2562e,
      0x3deec581, 0x3e0aa71e, 0x3e0f77f8, 0x3df7ab22, 0x3dfb025c,
      0x3e1b8854, 0x3e1ea89e, 0x4202422f, 0xc27c65d9};
  for (size_t i = 0; i < sizeof hard / sizeof *hard; i++)
    near(x, &n, cap, hard[i], 0);
  if (f == CPU_MATH_TANH) {
    /* expm1f's k = round(2|x|/ln2) steps, 1..64, and |x| near 1 */
    for (int k = 1; k <= 64; k++)
      near(x, &n, cap, bits((float)((k - 0.5) * 0.34657359027997264)), 6);
  } else if (f == CPU_MATH_EXP) {
    /* the rounding of x·32/ln2 to an integer: near halves */
    for (int k = -150 * 32; k <= 128 * 32; k += 37)
      near(x, &n, cap, bits((float)((k + 0.5) * 0.021660849392498290)), 1);
  } else {
    /* each table subinterval's edge across the exponent range */
    for (uint32_t j = 0; j < 16; j++)
      for (int e = -126; e <= 127; e += 9)
        near(x, &n, cap, 0x3f330000u + (j << 19) + (uint32_t)(e * (1 << 23)),
             1);
  }
  for (int64_t i = 0; i < n; i++) want[i] = libm1(f, x[i]);
  check_all(f, x, want, got, n, "special");
  free(x);
  free(want);
  free(got);
}
END_TEST

/* Lengths 0..40 from every start 0..16; nothing written past the end;
 * in place. */
START_TEST(math_tails) {
  int f = _i;
  enum { N = 64 };
  float x[N], want[N], got[N + 16], buf[N];
  uint64_t s = 11 + (uint64_t)f;
  for (int i = 0; i < N; i++) {
    /* mostly the main path, some specials */
    double v = tt_uniform(&s, f == CPU_MATH_LOG ? 0 : -30, 30);
    if (i % 13 == 5) v = i % 2 ? 100.0 : -1e-40;
    if (i % 17 == 3) v = NAN;
    x[i] = (float)v;
    want[i] = libm1(f, x[i]);
  }
  for (int k = 0; k <= 2; k++) {
    for (int off = 0; off <= 16; off++) {
      for (int len = 0; len <= 40; len++) {
        for (int i = 0; i < N + 16; i++)
          got[i] = fbits(0x7fbad000u + (uint32_t)i);
        bool ran = true;
        if (k < 2)
          ran = cpu_math_kernel((cpu_math_fn)f, isas[k], x + off, got, len);
        else
          cpu_math_f32((cpu_math_fn)f, x + off, got, len);
        if (!ran) continue;
        ck_assert_msg(first_diff(want + off, got, len) < 0,
                      "%s kernel %d off %d len %d", fn_name[f], k, off, len);
        for (int i = len; i < N + 16; i++)
          ck_assert_msg(bits(got[i]) == 0x7fbad000u + (uint32_t)i,
                        "%s kernel %d off %d len %d: wrote past the end",
                        fn_name[f], k, off, len);
        memcpy(buf, x, sizeof buf);
        if (k < 2)
          cpu_math_kernel((cpu_math_fn)f, isas[k], buf + off, buf + off, len);
        else
          cpu_math_f32((cpu_math_fn)f, buf + off, buf + off, len);
        ck_assert_msg(first_diff(want + off, buf + off, len) < 0,
                      "%s kernel %d off %d len %d: in place", fn_name[f], k,
                      off, len);
      }
    }
  }
}
END_TEST

static void restore(void) {
  backend_set_threads(0);
}

/* Map tasks: which the backend takes, and their bits at 1..4 threads. */
START_TEST(math_map_tasks) {
  const topos_backend *cpu = topos_cpu_backend();
  static const topos_map_op ops[3] = {TOPOS_MAP_TANH, TOPOS_MAP_EXP,
                                      TOPOS_MAP_LOG};
  float dummy = 0;
  for (int f = 0; f < 3; f++) {
    bool live = cpu_math_live((cpu_math_fn)f);
    topos_task m = {.kind = TOPOS_TASK_MAP, .threads = 1};
    m.u.map = (topos_map_task){
        .dtype = TOPOS_F32, .op = ops[f], .n = 16, .a = &dummy, .y = &dummy};
    ck_assert(cpu->supports(cpu, &m) == live);
    m.threads = 0;
    ck_assert(cpu->supports(cpu, &m) == live);
    m.u.map.n = 15;
    ck_assert(!cpu->supports(cpu, &m));
    m.u.map.n = 1 << 20;
    m.threads = 1;
    ck_assert(cpu->supports(cpu, &m) == live);
    m.u.map.dtype = TOPOS_F64; /* libm per element: threads only */
    ck_assert(!cpu->supports(cpu, &m));
    m.threads = 2;
    ck_assert(cpu->supports(cpu, &m));
  }
  /* sqrt and pow keep the old rule */
  topos_task q = {.kind = TOPOS_TASK_MAP, .threads = 1};
  q.u.map = (topos_map_task){.dtype = TOPOS_F32,
                             .op = TOPOS_MAP_POW,
                             .n = 1 << 20,
                             .a = &dummy,
                             .y = &dummy};
  ck_assert(!cpu->supports(cpu, &q));

  static const int64_t ns[] = {16, 17, 100, 6400, 100003, 300001};
  for (int f = 0; f < 3; f++) {
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
      int64_t n = ns[ni];
      float *x = malloc((size_t)n * sizeof(float));
      float *want = malloc((size_t)n * sizeof(float));
      float *y = malloc((size_t)n * sizeof(float));
      uint64_t s = 7 + (uint64_t)ni;
      for (int64_t i = 0; i < n; i++) {
        x[i] = (float)tt_uniform(&s, f == CPU_MATH_LOG ? 0 : -12, 12);
        if (i % 97 == 3) x[i] = NAN;
        if (i % 89 == 5) x[i] = -INFINITY;
        if (i % 83 == 7) x[i] = 95.0f;
        want[i] = libm1(f, x[i]);
      }
      for (int th = 1; th <= 4; th++) {
        memset(y, 0, (size_t)n * sizeof(float));
        topos_task t = {.kind = TOPOS_TASK_MAP, .threads = th};
        t.u.map = (topos_map_task){
            .dtype = TOPOS_F32, .op = ops[f], .n = n, .a = x, .y = y};
        topos_error err = {0};
        ck_assert_int_eq(cpu->run(cpu, &t, &err), TOPOS_OK);
        ck_assert_msg(first_diff(want, y, n) < 0, "%s n %lld threads %d",
                      fn_name[f], (long long)n, th);
      }
      free(x);
      free(want);
      free(y);
    }
  }
}
END_TEST

/* ------------------------------------------------------ through the engine */

static topos_value input(topos_tape *t, topos_dtype d, int rank,
                         const int64_t *shape, uint64_t seed, double lo,
                         double hi) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 5;
  for (int64_t i = 0; i < n; i++) {
    v[i] = tt_uniform(&s, lo, hi);
    int64_t k = i % 97;
    if (k == 3) v[i] = NAN;
    if (k == 10) v[i] = INFINITY;
    if (k == 50) v[i] = -INFINITY;
    if (k == 70) v[i] = -0.0;
    if (k == 80) v[i] = 1e-30;
  }
  topos_tensor *x = tt_tensor(d, rank, shape, v);
  free(v);
  topos_value r = topos_input(t, x);
  topos_tensor_release(x);
  return r;
}

/* The engine's tanh/exp/log with the chain off (the reference
 * interpreter) against the chain on at 1..4 threads, bit for bit. */
START_TEST(math_engine) {
  topos_backends_register_defaults();
  const topos_dtype dts[2] = {TOPOS_F32, TOPOS_BF16};
  for (int di = 0; di < 2; di++) {
    topos_dtype d = dts[di];
    topos_tape *t = topos_tape_new(d);
    topos_value a = input(t, d, 2, S(64, 100), 1, -4, 4);
    topos_value b = input(t, d, 2, S(3, 7), 2, -100, 100);
    topos_value c = input(t, d, 1, S(70001), 3, -90, 90);
    topos_value roots[9];
    int r = 0;
    roots[r++] = topos_tanh(t, a);
    roots[r++] = topos_exp(t, a);
    roots[r++] = topos_log(t, a);
    roots[r++] = topos_tanh(t, b);
    roots[r++] = topos_exp(t, b);
    roots[r++] = topos_log(t, b);
    roots[r++] = topos_tanh(t, c);
    roots[r++] = topos_exp(t, c);
    roots[r++] = topos_log(t, c);
    const char *e = topos_tape_error(t);
    ck_assert_msg(e == NULL, "record: %s", e);
    topos_error err = {0};
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_msg(net != NULL, "seal: %s", err.message);

    topos_run *ref = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
    ck_assert_msg(ref != NULL, "%s", err.message);
    for (int th = 1; th <= 4; th++) {
      backend_set_threads(th);
      unsigned long long before = topos_cpu_map_tasks_run();
      topos_run *got = topos_forward(net, NULL, NULL, 0, NULL, &err);
      ck_assert_msg(got != NULL, "%s", err.message);
      unsigned long long ran = topos_cpu_map_tasks_run() - before;
      if (cpu_math_live(CPU_MATH_TANH) && cpu_math_live(CPU_MATH_EXP) &&
          cpu_math_live(CPU_MATH_LOG))
        ck_assert_uint_ge(ran, 9);
      for (int i = 0; i < r; i++) {
        const topos_tensor *x = topos_run_of(ref, roots[i], &err);
        const topos_tensor *y = topos_run_of(got, roots[i], &err);
        ck_assert_msg(x && y, "root %d: missing", i);
        ck_assert_msg(topos_tensor_bitwise_equal(x, y),
                      "%s root %d threads %d: bits differ", topos_dtype_name(d),
                      i, th);
      }
      topos_run_free(got);
    }
    topos_run_free(ref);
    topos_network_release(net);
  }
  restore();
}
END_TEST

Suite *math_suite(void) {
  Suite *s = suite_create("math");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, math_live);
  tcase_add_loop_test(tc, math_sweep, 0, CPU_MATH_COUNT);
  tcase_add_loop_test(tc, math_special, 0, CPU_MATH_COUNT);
  tcase_add_loop_test(tc, math_tails, 0, CPU_MATH_COUNT);
  suite_add_tcase(s, tc);
  TCase *e = tcase_create("tasks");
  tcase_set_timeout(e, 120);
  tcase_add_test(e, math_map_tasks);
  tcase_add_test(e, math_engine);
  suite_add_tcase(s, e);
  return s;
}
