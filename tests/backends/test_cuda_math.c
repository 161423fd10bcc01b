/*
 * test_cuda_math.c - backends/cuda/exact_math.h's scalar tp_expf /
 * tp_logf / tp_tanhf, built for the host, against this process's libm.
 *
 * The header redoes glibc 2.36 x86_64's expf (__expf_fma), logf
 * (__logf_fma) and tanhf (+ expm1f) operation by operation so that CUDA
 * kernels give libm's bits; here the same source runs on the CPU.  Every
 * check compares bit patterns with libm called once per element (a NaN
 * result only has to be a NaN): a strided sweep over all 2^32 inputs,
 * specials and every branch threshold of the glibc code with neighbours
 * to 16 ulps, and dense runs of consecutive inputs around 0 and 1 and
 * across expf's working range.  The device build is the same code; that
 * it compiles with nvcc is checked where nvcc is.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/exact_math.h"

enum { FN_EXP, FN_LOG, FN_TANH, FN_COUNT };

static const char *const fn_name[FN_COUNT] = {"expf", "logf", "tanhf"};

static float libm1(int f, float x) {
  return f == FN_EXP ? expf(x) : f == FN_LOG ? logf(x) : tanhf(x);
}

static float exact1(int f, float x) {
  return f == FN_EXP ? tp_expf(x) : f == FN_LOG ? tp_logf(x) : tp_tanhf(x);
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

/* Inputs to compare: a growing list of bit patterns. */
typedef struct list {
  uint32_t *v;
  int64_t n, cap;
} list;

static void push(list *l, uint32_t b) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 4096;
    l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    ck_assert(l->v != NULL);
  }
  l->v[l->n++] = b;
}

/* b and its neighbours out to w ulps, both signs. */
static void near(list *l, uint32_t b, int w) {
  for (int d = -w; d <= w; d++) {
    uint32_t m = (b & 0x7fffffffu) + (uint32_t)d;
    push(l, m);
    push(l, m | 0x80000000u);
  }
}

static void near_f(list *l, float v, int w) {
  near(l, bits(v), w);
}

/* n consecutive patterns from b (wrapping). */
static void run_of(list *l, uint32_t b, int64_t n) {
  for (int64_t i = 0; i < n; i++) push(l, b + (uint32_t)i);
}

/* Whether f(x) gives libm's bits (any NaN for a NaN). */
static bool same(int f, float x, float *want, float *got) {
  *want = libm1(f, x);
  *got = exact1(f, x);
  if (memcmp(want, got, sizeof(float)) == 0) return true;
  return isnan(*want) && isnan(*got);
}

/* Compares f on every input of l; fails on the first difference with the
 * count of differing inputs.  Returns how many were compared. */
static int64_t check_list(int f, const list *l, const char *what) {
  int64_t bad = 0, first = -1;
  float w0 = 0, g0 = 0;
  for (int64_t i = 0; i < l->n; i++) {
    float want, got;
    if (!same(f, fbits(l->v[i]), &want, &got)) {
      if (bad++ == 0) {
        first = i;
        w0 = want;
        g0 = got;
      }
    }
  }
  ck_assert_msg(bad == 0,
                "%s %s: %lld of %lld inputs differ, first x=%08x (%a): libm "
                "%08x (%a), exact_math %08x (%a)",
                fn_name[f], what, (long long)bad, (long long)l->n,
                first < 0 ? 0 : l->v[first],
                first < 0 ? 0.0 : (double)fbits(l->v[first]), bits(w0),
                (double)w0, bits(g0), (double)g0);
  return l->n;
}

static void list_free(list *l) {
  free(l->v);
  *l = (list){0};
}

/* Every 509th bit pattern (every 31049th under TOPOS_SKIP_SLOW, e.g.
 * valgrind), from a start that moves with the function: about 8.4
 * million inputs, every exponent of both signs, NaN payloads. */
START_TEST(cuda_math_sweep) {
  int f = _i;
  const uint64_t stride = getenv("TOPOS_SKIP_SLOW") ? 509 * 61 : 509;
  int64_t bad = 0, n = 0;
  uint32_t first = 0;
  float w0 = 0, g0 = 0;
  for (uint64_t b = (uint64_t)f * 97; b < ((uint64_t)1 << 32); b += stride) {
    float want, got;
    n++;
    if (!same(f, fbits((uint32_t)b), &want, &got) && bad++ == 0) {
      first = (uint32_t)b;
      w0 = want;
      g0 = got;
    }
  }
  ck_assert_msg(bad == 0,
                "%s sweep: %lld of %lld inputs differ, first x=%08x: libm "
                "%08x, exact_math %08x",
                fn_name[f], (long long)bad, (long long)n, first, bits(w0),
                bits(g0));
  ck_assert_int_ge(n, ((int64_t)1 << 32) / (int64_t)stride);
}
END_TEST

/* Specials and each branch threshold of the glibc code (s_tanhf.c with
 * s_expm1f.c at |u| = 2|x|, e_expf.c, e_logf.c) with neighbours. */
START_TEST(cuda_math_special) {
  int f = _i;
  list l = {0};
  static const uint32_t sp[] = {
      0x00000000, /* +-0 */
      0x7f800000, /* +-Inf */
      0x7fc00000, 0x7f800001, 0x7fa12345, 0x7fbfffff,
      0x7fffffff, 0x7fd00001, /* NaNs, quiet and signalling */
      0x00000001, 0x00000002, /* smallest subnormals */
      0x007fffff, 0x007ffffe, /* largest subnormals */
      0x00800000, 0x00800001, /* smallest normals */
      0x7f7fffff,             /* FLT_MAX */
      0x3f800000,             /* 1 */
      0x3f000000, 0x40000000, 0x33800000, 0x0c000000,
  };
  for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) near(&l, sp[i], 8);
  near_f(&l, FLT_MIN, 0);
  near_f(&l, FLT_MAX, 0);
  near_f(&l, FLT_TRUE_MIN, 0);
  /* every threshold of f's code, neighbours to 16 ulps */
  if (f == FN_EXP) {
    static const uint32_t th[] = {
        0x42b00000, /* |x| >= 88: special path */
        0x42b17217, /* 0x1.62e42ep6f: +inf above */
        0x42b17218, /* log(2^128) */
        0x42cff1b4, /* 0x1.9fe368p6f: +0 below its negative */
        0x42ce8ecf, /* 0x1.9d1d9ep6f: may_uflow */
        0x42aeac50, /* log(2^-126): subnormal results below -x */
        0x3f317218, /* ln 2 */
        0x33000000, /* 2^-25 */
    };
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) near(&l, th[i], 16);
    /* the only inputs where r = x·32/ln2 - kd unfused differs */
    near(&l, 0x4202422f, 0);
    near(&l, 0xc27c65d9, 0);
    /* where k = round(x·32/ln2) steps: near halves, all k */
    for (int k = -150 * 32; k <= 128 * 32; k++)
      near_f(&l, (float)((k + 0.5) * 0.021660849392498290), 1);
  } else if (f == FN_LOG) {
    static const uint32_t th[] = {
        0x3f800000, /* 1: +0 */
        0x00800000, /* smallest normal: the subnormal path below */
        0x7f800000, /* Inf, NaN above */
        0x3f330000, /* OFF: k steps */
        0x3fb30000, 0x3eb30000, 0x7f7fffff, 0x00000001,
    };
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) near(&l, th[i], 16);
    /* each table subinterval's edge across the exponent range, and in
     * the subnormals (scaled by 2^23 there) */
    for (uint32_t j = 0; j < 16; j++) {
      for (int e = -126; e <= 127; e++)
        near(&l, 0x3f330000u + (j << 19) + (uint32_t)(e * (1 << 23)), 1);
      for (int e = 1; e <= 23; e++) near(&l, (0x3f330000u + (j << 19)) >> e, 1);
    }
  } else {
    static const uint32_t th[] = {
        0x41b00000, /* |x| >= 22: +-(1 - tiny) */
        0x24000000, /* |x| < 2^-55: x·(1 + x) */
        0x3f800000, /* |x| >= 1: 1 - 2/(t + 2) */
        /* expm1f's at |u| = 2|x|: 0x33000000 (2^-25), 0x3eb17218
         * (ln2/2), 0x3f851592 (1.5·ln2), 0x4195b844 (27·ln2) */
        0x32800000,
        0x3e317218,
        0x3f051592,
        0x4115b844,
    };
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) near(&l, th[i], 16);
    /* where expm1f's k = (int)(2|x|/ln2 + 1/2) steps, 1..64 (its
     * branches change at k = 2, 23 and 57) */
    for (int k = 1; k <= 64; k++)
      near_f(&l, (float)((k - 0.5) * 0.34657359027997264), 16);
    /* inputs where an FMA-contracted expm1f polynomial differs */
    static const uint32_t hard[] = {
        0x3df46db4, 0x3dff3a9e, 0x3e12dd9a, 0x3e332a19, 0x3dc2562e, 0x3deec581,
        0x3e0aa71e, 0x3e0f77f8, 0x3df7ab22, 0x3dfb025c, 0x3e1b8854, 0x3e1ea89e};
    for (size_t i = 0; i < sizeof hard / sizeof *hard; i++)
      near(&l, hard[i], 0);
  }
  int64_t n = check_list(f, &l, "special");
  ck_assert_int_ge(n, 1000);
  list_free(&l);
}
END_TEST

/* Dense runs of consecutive patterns: 2^20 from +-0 up, 2^20 either side
 * of 1 and of -1; for expf also a stride-257 sweep of every pattern in
 * [-104, 89] and 2^20 values evenly spaced over it. */
START_TEST(cuda_math_dense) {
  int f = _i;
  const int64_t R = getenv("TOPOS_SKIP_SLOW") ? 1 << 14 : 1 << 20;
  list l = {0};
  run_of(&l, 0x00000000u, R);
  run_of(&l, 0x80000000u, R);
  run_of(&l, 0x3f800000u - (uint32_t)R, 2 * R);
  run_of(&l, 0xbf800000u - (uint32_t)R, 2 * R);
  if (f == FN_EXP) {
    const uint32_t stride = getenv("TOPOS_SKIP_SLOW") ? 257 * 61 : 257;
    for (uint32_t b = 0; b <= bits(89.0f); b += stride) push(&l, b);
    for (uint32_t b = 0x80000000u; b <= bits(-104.0f); b += stride) push(&l, b);
    for (int64_t i = 0; i <= R; i++)
      push(&l, bits((float)(-104.0 + 193.0 * (double)i / (double)R)));
  } else if (f == FN_TANH) {
    /* 2^20 evenly spaced over [-23, 23]: every k of expm1f */
    for (int64_t i = 0; i <= R; i++)
      push(&l, bits((float)(-23.0 + 46.0 * (double)i / (double)R)));
  } else {
    /* 2^20 evenly spaced over [0.5, 2]: every table subinterval */
    for (int64_t i = 0; i <= R; i++)
      push(&l, bits((float)(0.5 + 1.5 * (double)i / (double)R)));
  }
  check_list(f, &l, "dense");
  list_free(&l);
}
END_TEST

Suite *cuda_math_suite(void) {
  Suite *s = suite_create("cuda_math");
  TCase *tc = tcase_create("exact");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, cuda_math_sweep, 0, FN_COUNT);
  tcase_add_loop_test(tc, cuda_math_special, 0, FN_COUNT);
  tcase_add_loop_test(tc, cuda_math_dense, 0, FN_COUNT);
  suite_add_tcase(s, tc);
  return s;
}
