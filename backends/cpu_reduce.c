/*
 * cpu_reduce.c - the cpu backend's reductions (TOPOS_TASK_REDUCE) and
 * elementwise maps (TOPOS_TASK_MAP), exact: the reference's bits for every
 * input and thread count.
 *
 * Reductions follow numerics.md's striped-16 rule: n == 0 gives +0.0;
 * n <= 16 is the left fold from x0; n > 16 keeps 16 lanes, lane l the left
 * fold of x[l], x[l+16], ..., then combines them pairwise in the fixed tree
 * (l0+l1), (l2+l3), ... -> 8 -> 4 -> 2 -> 1.
 *
 *  - inner == 1 (each output a contiguous row): native vectors hold the
 *    16 lanes (f32: one zmm under AVX-512, two ymm under AVX2; f64: two
 *    zmm / four ymm), advanced by one vector add per 16 elements; the
 *    last n % 16 elements go to lanes 0.. one by one, then the tree runs
 *    on the stored lanes.  Two rows run side by side to hide the add
 *    latency.
 *  - inner > 1: the lanes of a vector are adjacent *outputs* (columns),
 *    each vector lane running that output's own fold (n <= 16) or its own
 *    16 striped accumulators (16 vectors) and tree.  Columns past the last
 *    whole vector use the scalar rule.
 *
 * Vector adds are independent IEEE operations per lane, so every output
 * sees the same additions in the same order as the reference.  Threads
 * split outputs (rows, or (outer, column block) units), never one
 * output's sum.
 *
 * Maps call the same per-element expressions as the reference's
 * K(unary)/K(binary) (libm once per element) over contiguous element
 * ranges, one per thread.  f32 exp/tanh/log go through cpu_math.c, whose
 * vector kernels give libm's bits (self-checked at first use, libm per
 * element otherwise); while those kernels are live such maps are taken
 * from 16 elements at any thread count.
 *
 * Threads come from cpu.c's persistent pool (cpu_parallel; the caller
 * runs the first share); the thresholds below keep tasks large enough
 * that waking them is noise.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "cpu_math.h"
#include "cpu_reduce.h"
#include "cpu_window.h"
#include "fma_pinned.h"

/* Reductions of fewer elements stay on the reference (a task costs little,
 * but so do they). */
#define REDUCE_MIN_ELEMS 256
/* Elements per thread below which a reduction uses fewer threads. */
#define REDUCE_PER_THREAD ((int64_t)1 << 16)
/* Maps: libm calls are worth threads from this many elements; the cheap
 * arithmetic ops (memory bound) only from MAP_MIN_CHEAP. */
#define MAP_MIN_LIBM ((int64_t)1 << 16)
#define MAP_MIN_CHEAP ((int64_t)1 << 20)
/* ... and from MAP_MIN_CHEAP_512 where they run on sixteen lanes (f32 on
 * AVX-512, map_f32_512): a pass of a few hundred kilobytes, which one
 * core streams in tens of microseconds, the other core halves. */
#define MAP_MIN_CHEAP_512 ((int64_t)1 << 15)
/* f32 exp/tanh/log on cpu_math.c's vector kernels: taken from this many
 * elements at any thread count, threads from MAP_VEC_PER_THREAD each. */
#define MAP_MIN_VEC 16
#define MAP_VEC_PER_THREAD ((int64_t)1 << 15)
#define MAX_THREADS 64

/* -------------------------------------------------------------- threads */

typedef void (*range_fn)(void *ctx, int64_t a, int64_t b);

typedef struct par_job {
  range_fn fn;
  void *ctx;
  int64_t n, align, units;
} par_job;

/* Thread tid of T: its contiguous share of the units. */
static void par_share(void *arg, int tid, int T) {
  const par_job *j = arg;
  int64_t a = j->units * tid / T * j->align;
  int64_t b = j->units * (tid + 1) / T * j->align;
  if (a > j->n) a = j->n;
  if (b > j->n) b = j->n;
  if (a < b) j->fn(j->ctx, a, b);
}

/* fn over [0, n) in at most T contiguous shares (boundaries multiples of
 * align except the last), on cpu.c's persistent pool (cpu_parallel: the
 * caller runs share 0; with the pool busy or T == 1 the caller runs it
 * all).  Where the shares fall never changes a result. */
static void par_for(int T, int64_t n, int64_t align, range_fn fn, void *ctx) {
  if (T > MAX_THREADS) T = MAX_THREADS;
  if (T < 1) T = 1;
  if (n <= 0) return;
  par_job j = {fn, ctx, n, align, (n + align - 1) / align};
  if (T > j.units) T = (int)j.units;
  if (T == 1) {
    fn(ctx, 0, n);
    return;
  }
  cpu_parallel(T, par_share, &j);
}

/* ------------------------------------------------------ the add order */

/*
 * Every add here is a + b with a (the accumulator, or the left lane of the
 * tree) as the instruction's first source.  That only matters when both
 * are NaN: x86 returns the first source's NaN, so -NaN (from Inf - Inf)
 * plus +NaN gives -NaN one way and +NaN the other, and C's + lets the
 * compiler swap the operands of a commutative add.  The reference's
 * compiled loops keep the accumulator first (tests compare the bits); the
 * adds below pin that order with inline assembly on x86.
 */
#if defined(__x86_64__)
#define REDUCE_X86 1
static inline float sadd_f32(float a, float b) {
  __asm__("addss %1, %0" : "+x"(a) : "xm"(b));
  return a;
}
static inline double sadd_f64(double a, double b) {
  __asm__("addsd %1, %0" : "+x"(a) : "xm"(b));
  return a;
}
#else
#define REDUCE_X86 0
static inline float sadd_f32(float a, float b) {
  return a + b;
}
static inline double sadd_f64(double a, double b) {
  return a + b;
}
#endif

/* -------------------------------------------------------- scalar rule */

/* The reference's reduce() (kernels_real.h), for tails and the C path. */
#define DEFINE_SCALAR(T, SUF)                                          \
  static T reduce1_##SUF(const T *x, int64_t n, int64_t s) {           \
    if (n == 0) return (T)0;                                           \
    if (n <= 16) {                                                     \
      T acc = x[0];                                                    \
      for (int64_t i = 1; i < n; i++) acc = sadd_##SUF(acc, x[i * s]); \
      return acc;                                                      \
    }                                                                  \
    T lane[16];                                                        \
    for (int l = 0; l < 16; l++) lane[l] = x[l * s];                   \
    for (int64_t i = 16; i < n; i++)                                   \
      lane[i % 16] = sadd_##SUF(lane[i % 16], x[i * s]);               \
    for (int width = 16; width > 1; width /= 2)                        \
      for (int l = 0; l < width / 2; l++)                              \
        lane[l] = sadd_##SUF(lane[2 * l], lane[2 * l + 1]);            \
    return lane[0];                                                    \
  }
DEFINE_SCALAR(float, f32)
DEFINE_SCALAR(double, f64)

/* ------------------------------------------------------ vector kernels */

#if REDUCE_X86

/*
 * One native vector V of W = VB / sizeof(T) lanes; NV = 16 / W of them
 * hold a row's 16 striped lanes (vector k: lanes k·W ..).  VADD(a, b) is
 * the vector add with a as first source.
 *
 * rows: y[r] for r in [r0, r1), row r = x[r·L, (r+1)·L), L > 16; two rows
 * side by side.  cols: whole W-wide column blocks [b0, b1) of one outer
 * slice x [L, inner] -> y[b·W ..].
 */
#define DEFINE_VECTOR(T, SUF, ISA, TGT, VB, INSN, SINSN)                    \
  typedef T v_##SUF##_##ISA __attribute__((vector_size(VB)));               \
  typedef T vu_##SUF##_##ISA                                                \
      __attribute__((vector_size(VB), aligned(sizeof(T)), may_alias));      \
  enum {                                                                    \
    W_##SUF##_##ISA = VB / sizeof(T),                                       \
    NV_##SUF##_##ISA = 16 / (VB / sizeof(T))                                \
  };                                                                        \
  __attribute__((target(TGT), always_inline)) static inline v_##SUF##_##ISA \
      vadd_##SUF##_##ISA(v_##SUF##_##ISA a, const T *p) {                   \
    v_##SUF##_##ISA r;                                                      \
    __asm__(INSN " %2, %1, %0"                                              \
            : "=v"(r)                                                       \
            : "v"(a), "m"(*(const vu_##SUF##_##ISA *)p));                   \
    return r;                                                               \
  }                                                                         \
  __attribute__((target(TGT), always_inline)) static inline v_##SUF##_##ISA \
      vadd2_##SUF##_##ISA(v_##SUF##_##ISA a, v_##SUF##_##ISA b) {           \
    v_##SUF##_##ISA r;                                                      \
    __asm__(INSN " %2, %1, %0" : "=v"(r) : "v"(a), "v"(b));                 \
    return r;                                                               \
  }                                                                         \
  /* The scalar adds of the tail and the tree, VEX-encoded (legacy SSE      \
   * after 512/256-bit code would pay for the transition). */               \
  __attribute__((target(TGT),                                               \
                 always_inline)) static inline T sadd_##SUF##_##ISA(T a,    \
                                                                    T b) {  \
    T r;                                                                    \
    __asm__(SINSN " %2, %1, %0" : "=v"(r) : "v"(a), "vm"(b));               \
    return r;                                                               \
  }                                                                         \
  __attribute__((target(TGT))) static T finish_##SUF##_##ISA(               \
      T *lane, const T *x, int64_t i, int64_t n) {                          \
    for (int64_t j = 0; i + j < n; j++)                                     \
      lane[j] = sadd_##SUF##_##ISA(lane[j], x[i + j]);                      \
    for (int width = 16; width > 1; width /= 2)                             \
      for (int l = 0; l < width / 2; l++)                                   \
        lane[l] = sadd_##SUF##_##ISA(lane[2 * l], lane[2 * l + 1]);         \
    return lane[0];                                                         \
  }                                                                         \
  __attribute__((target(TGT))) static void rows_##SUF##_##ISA(              \
      const T *x, T *y, int64_t r0, int64_t r1, int64_t L) {                \
    enum { W = W_##SUF##_##ISA, NV = NV_##SUF##_##ISA };                    \
    T lane[16];                                                             \
    int64_t r = r0;                                                         \
    for (; r + 2 <= r1; r += 2) {                                           \
      const T *p0 = x + r * L, *p1 = p0 + L;                                \
      v_##SUF##_##ISA a0[NV], a1[NV];                                       \
      _Pragma("GCC unroll 16") for (int k = 0; k < NV; k++) {               \
        a0[k] = *(const vu_##SUF##_##ISA *)(p0 + k * W);                    \
        a1[k] = *(const vu_##SUF##_##ISA *)(p1 + k * W);                    \
      }                                                                     \
      int64_t i = 16;                                                       \
      for (; i + 16 <= L; i += 16) {                                        \
        _Pragma("GCC unroll 16") for (int k = 0; k < NV; k++) {             \
          a0[k] = vadd_##SUF##_##ISA(a0[k], p0 + i + k * W);                \
          a1[k] = vadd_##SUF##_##ISA(a1[k], p1 + i + k * W);                \
        }                                                                   \
      }                                                                     \
      memcpy(lane, a0, sizeof lane);                                        \
      y[r] = finish_##SUF##_##ISA(lane, p0, i, L);                          \
      memcpy(lane, a1, sizeof lane);                                        \
      y[r + 1] = finish_##SUF##_##ISA(lane, p1, i, L);                      \
    }                                                                       \
    for (; r < r1; r++) {                                                   \
      const T *p = x + r * L;                                               \
      v_##SUF##_##ISA a[NV];                                                \
      _Pragma("GCC unroll 16") for (int k = 0; k < NV; k++) a[k] =          \
          *(const vu_##SUF##_##ISA *)(p + k * W);                           \
      int64_t i = 16;                                                       \
      for (; i + 16 <= L; i += 16)                                          \
        _Pragma("GCC unroll 16") for (int k = 0; k < NV; k++) a[k] =        \
            vadd_##SUF##_##ISA(a[k], p + i + k * W);                        \
      memcpy(lane, a, sizeof lane);                                         \
      y[r] = finish_##SUF##_##ISA(lane, p, i, L);                           \
    }                                                                       \
  }                                                                         \
  __attribute__((target(TGT))) static void cols_##SUF##_##ISA(              \
      const T *x, T *y, int64_t L, int64_t inner, int64_t b0, int64_t b1) { \
    enum { W = W_##SUF##_##ISA };                                           \
    for (int64_t b = b0; b < b1; b++) {                                     \
      const T *p = x + b * W;                                               \
      v_##SUF##_##ISA r;                                                    \
      if (L <= 16) {                                                        \
        r = *(const vu_##SUF##_##ISA *)p;                                   \
        for (int64_t l = 1; l < L; l++)                                     \
          r = vadd_##SUF##_##ISA(r, p + l * inner);                         \
      } else {                                                              \
        v_##SUF##_##ISA acc[16];                                            \
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) acc[j] =      \
            *(const vu_##SUF##_##ISA *)(p + j * inner);                     \
        int64_t l = 16;                                                     \
        for (; l + 16 <= L; l += 16)                                        \
          _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) acc[j] =    \
              vadd_##SUF##_##ISA(acc[j], p + (l + j) * inner);              \
        for (int j = 0; l + j < L; j++)                                     \
          acc[j] = vadd_##SUF##_##ISA(acc[j], p + (l + j) * inner);         \
        _Pragma("GCC unroll 16") for (int k = 0; k < 8; k++) acc[k] =       \
            vadd2_##SUF##_##ISA(acc[2 * k], acc[2 * k + 1]);                \
        _Pragma("GCC unroll 16") for (int k = 0; k < 4; k++) acc[k] =       \
            vadd2_##SUF##_##ISA(acc[2 * k], acc[2 * k + 1]);                \
        acc[0] = vadd2_##SUF##_##ISA(acc[0], acc[1]);                       \
        acc[1] = vadd2_##SUF##_##ISA(acc[2], acc[3]);                       \
        r = vadd2_##SUF##_##ISA(acc[0], acc[1]);                            \
      }                                                                     \
      *(vu_##SUF##_##ISA *)(y + b * W) = r;                                 \
    }                                                                       \
  }

DEFINE_VECTOR(float, f32, avx512, "avx512f", 64, "vaddps", "vaddss")
DEFINE_VECTOR(double, f64, avx512, "avx512f", 64, "vaddpd", "vaddsd")
DEFINE_VECTOR(float, f32, avx2, "avx2", 32, "vaddps", "vaddss")
DEFINE_VECTOR(double, f64, avx2, "avx2", 32, "vaddpd", "vaddsd")

#endif /* REDUCE_X86 */

/* ---------------------------------------------------------- reductions */

typedef struct reduce_job {
  const topos_reduce_task *r;
  size_t es;
  int64_t wc;   /* columns per vector (1 on the C path) */
  int64_t nblk; /* column blocks per outer slice (the last may be partial) */
  int isa;      /* 2 avx512, 1 avx2, 0 c */
} reduce_job;

static void reduce_rows_range(void *ctx, int64_t r0, int64_t r1) {
  reduce_job *j = ctx;
  const topos_reduce_task *r = j->r;
  bool f64 = r->dtype == TOPOS_F64;
  int64_t L = r->L;
#if REDUCE_X86
  if (L > 16 && j->isa == 2) {
    if (f64)
      rows_f64_avx512(r->x, r->y, r0, r1, L);
    else
      rows_f32_avx512(r->x, r->y, r0, r1, L);
    return;
  }
  if (L > 16 && j->isa == 1) {
    if (f64)
      rows_f64_avx2(r->x, r->y, r0, r1, L);
    else
      rows_f32_avx2(r->x, r->y, r0, r1, L);
    return;
  }
#endif
  for (int64_t o = r0; o < r1; o++) {
    if (f64)
      ((double *)r->y)[o] = reduce1_f64((const double *)r->x + o * L, L, 1);
    else
      ((float *)r->y)[o] = reduce1_f32((const float *)r->x + o * L, L, 1);
  }
}

/* Units u = o·nblk + b: column block b of outer slice o. */
#if FMA_PINNED_X86
/* The scalar rule for up to sixteen adjacent columns [c0, c1) of one
 * slice x [L, inner] at once (the columns a whole-vector block leaves,
 * all of them where inner < 16: a conv bias's gradient over [positions,
 * channels]): acc[l] holds lane l of every column's striped sum, rows
 * one masked load each, the tree lane by lane - each column's adds those
 * of reduce1_f32, in its order (add_ps512 pins the first source). */
__attribute__((target("avx512f"))) static void cols_narrow_f32_512(
    const float *x, float *y, int64_t L, int64_t inner, int64_t c0,
    int64_t c1) {
  const __mmask16 m = (__mmask16)((1u << (c1 - c0)) - 1u);
  const float *p = x + c0;
  if (L <= 16) {
    __m512 r = _mm512_maskz_loadu_ps(m, p);
    for (int64_t l = 1; l < L; l++)
      r = add_ps512(r, _mm512_maskz_loadu_ps(m, p + l * inner));
    _mm512_mask_storeu_ps(y + c0, m, r);
    return;
  }
  __m512 acc[16];
#pragma GCC unroll 16
  for (int l = 0; l < 16; l++) acc[l] = _mm512_maskz_loadu_ps(m, p + l * inner);
  int64_t i = 16;
  for (; i + 16 <= L; i += 16)
#pragma GCC unroll 16
    for (int l = 0; l < 16; l++)
      acc[l] = add_ps512(acc[l], _mm512_maskz_loadu_ps(m, p + (i + l) * inner));
  for (int l = 0; i + l < L; l++)
    acc[l] = add_ps512(acc[l], _mm512_maskz_loadu_ps(m, p + (i + l) * inner));
  for (int width = 16; width > 1; width /= 2)
    for (int l = 0; l < width / 2; l++)
      acc[l] = add_ps512(acc[2 * l], acc[2 * l + 1]);
  _mm512_mask_storeu_ps(y + c0, m, acc[0]);
}
#endif

static void reduce_cols_range(void *ctx, int64_t u0, int64_t u1) {
  reduce_job *j = ctx;
  const topos_reduce_task *r = j->r;
  bool f64 = r->dtype == TOPOS_F64;
  int64_t L = r->L, inner = r->inner, wc = j->wc, nblk = j->nblk;
  int64_t full = j->isa ? inner / wc : 0;
  for (int64_t u = u0; u < u1;) {
    int64_t o = u / nblk, b = u % nblk;
    int64_t bend = nblk;
    if (u1 - u < bend - b) bend = b + (u1 - u);
    const char *x = (const char *)r->x + (size_t)(o * L * inner) * j->es;
    char *y = (char *)r->y + (size_t)(o * inner) * j->es;
    int64_t fb = bend < full ? bend : full; /* whole blocks [b, fb) */
#if REDUCE_X86
    if (fb > b) {
      if (j->isa == 2) {
        if (f64)
          cols_f64_avx512((const double *)x, (double *)y, L, inner, b, fb);
        else
          cols_f32_avx512((const float *)x, (float *)y, L, inner, b, fb);
      } else {
        if (f64)
          cols_f64_avx2((const double *)x, (double *)y, L, inner, b, fb);
        else
          cols_f32_avx2((const float *)x, (float *)y, L, inner, b, fb);
      }
    }
#endif
    /* Columns outside whole vector blocks: the scalar rule per column. */
    int64_t c0 = (fb > b ? fb : b) * wc, c1 = bend * wc;
    if (c1 > inner) c1 = inner;
#if FMA_PINNED_X86
    if (j->isa == 2 && !f64)
      for (; c0 < c1; c0 += 16)
        cols_narrow_f32_512((const float *)x, (float *)y, L, inner, c0,
                            c1 - c0 < 16 ? c1 : c0 + 16);
#endif
    for (int64_t c = c0; c < c1; c++) {
      if (f64)
        ((double *)y)[c] = reduce1_f64((const double *)x + c, L, inner);
      else
        ((float *)y)[c] = reduce1_f32((const float *)x + c, L, inner);
    }
    u += bend - b;
  }
}

static atomic_ullong reduce_tasks, map_tasks;

unsigned long long topos_cpu_reduce_tasks_run(void) {
  return atomic_load(&reduce_tasks);
}

unsigned long long topos_cpu_map_tasks_run(void) {
  return atomic_load(&map_tasks);
}

static bool reduce_shape_ok(const topos_reduce_task *r, int64_t *total) {
  if (r->dtype != TOPOS_F32 && r->dtype != TOPOS_F64) return false;
  if (r->outer < 0 || r->L < 0 || r->inner < 0) return false;
  int64_t oi;
  if (__builtin_mul_overflow(r->outer, r->inner, &oi)) return false;
  if (__builtin_mul_overflow(oi, r->L, total)) return false;
  return true;
}

bool cpu_reduce_supports(const topos_task *task) {
  if (!task || task->kind != TOPOS_TASK_REDUCE) return false;
  int64_t total;
  if (!reduce_shape_ok(&task->u.reduce, &total)) return false;
  return total >= REDUCE_MIN_ELEMS;
}

static int isa_code(void) {
  const char *s = topos_cpu_isa();
  if (REDUCE_X86 && strcmp(s, "avx512") == 0) return 2;
  if (REDUCE_X86 && strcmp(s, "avx2") == 0) return 1;
  return 0;
}

/* One contiguous row: the vector row kernel of this ISA past 16 values. */
float cpu_reduce_sum_f32(const float *x, int64_t n) {
  float y = 0;
#if REDUCE_X86
  int isa = n > 16 ? isa_code() : 0;
  if (isa == 2) rows_f32_avx512(x, &y, 0, 1, n);
  if (isa == 1) rows_f32_avx2(x, &y, 0, 1, n);
  if (isa) return y;
#endif
  return reduce1_f32(x, n, 1);
}

double cpu_reduce_sum_f64(const double *x, int64_t n) {
  double y = 0;
#if REDUCE_X86
  int isa = n > 16 ? isa_code() : 0;
  if (isa == 2) rows_f64_avx512(x, &y, 0, 1, n);
  if (isa == 1) rows_f64_avx2(x, &y, 0, 1, n);
  if (isa) return y;
#endif
  return reduce1_f64(x, n, 1);
}

int cpu_reduce_run(const topos_task *task) {
  const topos_reduce_task *r = &task->u.reduce;
  int64_t total;
  if (!reduce_shape_ok(r, &total)) return TOPOS_ERR_ARGUMENT;
  reduce_job j = {.r = r};
  j.es = r->dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  j.isa = isa_code();
  /* columns per vector: 64 bytes under AVX-512, 32 under AVX2 */
  j.wc = j.isa == 2   ? (int64_t)(64 / j.es)
         : j.isa == 1 ? (int64_t)(32 / j.es)
                      : 16;
  int64_t outs = r->outer * r->inner;
  if (outs == 0) goto done;
  if (r->L == 0) { /* every sum is empty: +0.0 */
    for (int64_t i = 0; i < outs; i++) {
      if (r->dtype == TOPOS_F64)
        ((double *)r->y)[i] = 0.0;
      else
        ((float *)r->y)[i] = 0.0f;
    }
    goto done;
  }
  int64_t want = total / REDUCE_PER_THREAD;
  int T = task->threads > 0 ? task->threads : 1;
  if (want < T) T = want > 1 ? (int)want : 1;
  if (r->inner == 1) {
    par_for(T, r->outer, 4, reduce_rows_range, &j);
  } else {
    j.nblk = (r->inner + j.wc - 1) / j.wc;
    par_for(T, r->outer * j.nblk, 1, reduce_cols_range, &j);
  }
done:
  atomic_fetch_add_explicit(&reduce_tasks, 1, memory_order_relaxed);
  return TOPOS_OK;
}

/* ----------------------------------------------------------------- maps */

/* The reference's K(unary)/K(binary) loops over [i0, i1).  y is a fresh
 * buffer or exactly x (in place), never a shifted overlap (IVDEP); like
 * the reference's, the loops stay scalar at -O2, which keeps a
 * commutative op's operands in order (kernels_real.h). */
#define IVDEP _Pragma("GCC ivdep")
#define DEFINE_MAP(T, SUF, EXP, LOG, SQRT, TANH, POW)                         \
  static void map_##SUF(const topos_map_task *m, int64_t i0, int64_t i1) {    \
    const T *x = m->a, *b = m->b;                                             \
    T *y = m->y;                                                              \
    T pr = (T)m->p;                                                           \
    switch (m->op) {                                                          \
      case TOPOS_MAP_NEG:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = -x[i];                 \
        break;                                                                \
      case TOPOS_MAP_EXP:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = EXP(x[i]);             \
        break;                                                                \
      case TOPOS_MAP_LOG:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = LOG(x[i]);             \
        break;                                                                \
      case TOPOS_MAP_SQRT:                                                    \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = SQRT(x[i]);            \
        break;                                                                \
      case TOPOS_MAP_TANH:                                                    \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = TANH(x[i]);            \
        break;                                                                \
      case TOPOS_MAP_POW:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = POW(x[i], pr);         \
        break;                                                                \
      case TOPOS_MAP_RELU:                                                    \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] =                        \
            isnan(x[i]) ? x[i] : (x[i] > 0 ? x[i] : (T)0);                    \
        break;                                                                \
      case TOPOS_MAP_ADD:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = x[i] + b[i];           \
        break;                                                                \
      case TOPOS_MAP_SUB:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = x[i] - b[i];           \
        break;                                                                \
      case TOPOS_MAP_MUL:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = x[i] * b[i];           \
        break;                                                                \
      case TOPOS_MAP_DIV:                                                     \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = x[i] / b[i];           \
        break;                                                                \
      case TOPOS_MAP_MAXIMUM:                                                 \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] = isnan(x[i])    ? x[i]  \
                                                       : isnan(b[i])  ? b[i]  \
                                                       : x[i] >= b[i] ? x[i]  \
                                                                      : b[i]; \
        break;                                                                \
      case TOPOS_MAP_STEP:                                                    \
        IVDEP for (int64_t i = i0; i < i1; i++) y[i] =                        \
            x[i] >= b[i] ? (T)1 : (T)0;                                       \
        break;                                                                \
      default:                                                                \
        break;                                                                \
    }                                                                         \
  }
DEFINE_MAP(float, f32, expf, logf, sqrtf, tanhf, powf)
DEFINE_MAP(double, f64, exp, log, sqrt, tanh, pow)

/* The f32 map ops cpu_math.c computes (libm's bits, vector or not). */
static int map_math_fn(const topos_map_task *m) {
  if (m->dtype != TOPOS_F32) return -1;
  switch (m->op) {
    case TOPOS_MAP_EXP:
      return CPU_MATH_EXP;
    case TOPOS_MAP_TANH:
      return CPU_MATH_TANH;
    case TOPOS_MAP_LOG:
      return CPU_MATH_LOG;
    default:
      return -1;
  }
}

#if FMA_PINNED_X86
/* The f32 ops map_f32 runs on sixteen lanes: the arithmetic ones with the
 * operand order pinned (fma_pinned.h), as the reference's vector loops,
 * and the compare-and-select ones lane by lane. */
static bool map_has_512(const topos_map_task *m) {
  /* the backend's ISA, as forced for tests (topos_cpu_force_isa) */
  if (m->dtype != TOPOS_F32 || strcmp(topos_cpu_isa(), "avx512") != 0)
    return false;
  switch (m->op) {
    case TOPOS_MAP_NEG:
    case TOPOS_MAP_RELU:
    case TOPOS_MAP_ADD:
    case TOPOS_MAP_SUB:
    case TOPOS_MAP_MUL:
    case TOPOS_MAP_DIV:
    case TOPOS_MAP_MAXIMUM:
    case TOPOS_MAP_STEP:
      return true;
    default:
      return false;
  }
}

/* Whole vectors of [i0, i1) (map_has_512's ops); returns where it
 * stopped, map_f32 doing the rest. */
__attribute__((target("avx512f"))) static int64_t map_f32_512(
    const topos_map_task *m, int64_t i0, int64_t i1) {
  const float *x = m->a, *b = m->b;
  float *y = m->y;
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 u = _mm512_loadu_ps(x + i), r;
    if (m->op == TOPOS_MAP_NEG)
      r = neg_ps512(u);
    else if (m->op == TOPOS_MAP_RELU)
      r = relu_ps512(u);
    else {
      __m512 w = _mm512_loadu_ps(b + i);
      switch (m->op) {
        case TOPOS_MAP_ADD:
          r = add_ps512(u, w);
          break;
        case TOPOS_MAP_SUB:
          r = sub_ps512(u, w);
          break;
        case TOPOS_MAP_MUL:
          r = mul_ps512(u, w);
          break;
        case TOPOS_MAP_DIV:
          r = div_ps512(u, w);
          break;
        case TOPOS_MAP_MAXIMUM:
          r = maximum_ps512(u, w);
          break;
        default: /* TOPOS_MAP_STEP */
          r = step_ps512(u, w);
          break;
      }
    }
    _mm512_storeu_ps(y + i, r);
  }
  return i;
}
#else
static bool map_has_512(const topos_map_task *m) {
  (void)m;
  return false;
}
static int64_t map_f32_512(const topos_map_task *m, int64_t i0, int64_t i1) {
  (void)m;
  (void)i1;
  return i0;
}
#endif

static void map_range(void *ctx, int64_t i0, int64_t i1) {
  const topos_map_task *m = ctx;
  if (map_has_512(m)) i0 = map_f32_512(m, i0, i1);
  int mf = map_math_fn(m);
  if (mf >= 0) {
    cpu_math_f32((cpu_math_fn)mf, (const float *)m->a + i0, (float *)m->y + i0,
                 i1 - i0);
    return;
  }
  if (m->dtype == TOPOS_F64)
    map_f64(m, i0, i1);
  else
    map_f32(m, i0, i1);
}

static bool map_ok(const topos_map_task *m) {
  if (m->dtype != TOPOS_F32 && m->dtype != TOPOS_F64) return false;
  if (m->op < TOPOS_MAP_NEG || m->op >= TOPOS_MAP_COUNT) return false;
  if (m->n < 0 || !m->a || (m->op >= TOPOS_MAP_ADD && !m->b)) return false;
  return true;
}

static bool map_is_libm(topos_map_op op) {
  return op == TOPOS_MAP_EXP || op == TOPOS_MAP_LOG || op == TOPOS_MAP_TANH ||
         op == TOPOS_MAP_POW;
}

/* Whether m runs on a live vector kernel of cpu_math.c. */
static bool map_is_vec(const topos_map_task *m) {
  int mf = map_math_fn(m);
  return mf >= 0 && cpu_math_live((cpu_math_fn)mf);
}

bool cpu_map_supports(const topos_task *task) {
  if (!task || task->kind != TOPOS_TASK_MAP) return false;
  const topos_map_task *m = &task->u.map;
  if (!map_ok(m)) return false;
  /* vector exp/tanh/log pay at any thread count */
  if (map_is_vec(m)) return m->n >= MAP_MIN_VEC;
  if (task->threads < 2) return false;
  if (map_has_512(m)) return m->n >= MAP_MIN_CHEAP_512;
  return m->n >= (map_is_libm(m->op) ? MAP_MIN_LIBM : MAP_MIN_CHEAP);
}

int cpu_map_run(const topos_task *task) {
  const topos_map_task *m = &task->u.map;
  if (!map_ok(m)) return TOPOS_ERR_ARGUMENT;
  int64_t per = map_is_vec(m)        ? MAP_VEC_PER_THREAD
                : map_has_512(m)     ? MAP_MIN_CHEAP_512 / 2
                : map_is_libm(m->op) ? MAP_MIN_LIBM / 4
                                     : MAP_MIN_CHEAP / 4;
  int64_t want = m->n / per;
  int T = task->threads > 0 ? task->threads : 1;
  if (want < T) T = want > 1 ? (int)want : 1;
  par_for(T, m->n, 16, map_range, (void *)m);
  atomic_fetch_add_explicit(&map_tasks, 1, memory_order_relaxed);
  return TOPOS_OK;
}
