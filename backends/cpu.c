/*
 * cpu.c - the `cpu` backend: exact fidelity, fast GEMM on the host CPU.
 *
 * Every output C[i,j] is the reference's chain acc = fma(A[i,k], B[k,j],
 * acc) over k = 0..K-1 in order from +0.0 (numerics.md).  The kernels
 * here only choose *which* chains run side by side, never the order
 * inside one:
 *
 *  - a microkernel keeps an MR x NR tile of C in vector registers, and
 *    for each k broadcasts A[i,k] for its MR rows and loads NR columns of
 *    B[k, j..j+NR): one vector fma per (row, vector of columns), each
 *    lane one output's own chain;
 *  - k is blocked by KC: after a block the partial C is stored, and the
 *    next block reloads it and continues the same chain (the first block
 *    starts from +0.0);
 *  - A and B are packed from whatever strides the task has (transposed,
 *    narrowed, broadcast views) into contiguous panels, zero-padded to
 *    whole tiles; padding lanes are computed and thrown away;
 *  - threads split the *outputs* (tiles of rows x columns, batches),
 *    never one output's k range, so the bits do not depend on the count.
 *
 * Microkernels: AVX-512 (MR 14, NR 32 f32 / 16 f64), AVX2+FMA (MR 6,
 * NR 16 f32 / 8 f64), chosen once by __builtin_cpu_supports, and a
 * portable C one (cpu_fmaf: the pinned fma where the CPU has one, else
 * fmaf).  Threads come from a persistent pool
 * created on first use; the caller's thread works too.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu_attention.h"
#include "cpu_gemv.h"
#include "cpu_reduce.h"
#include "cpu_window.h"

#if defined(__x86_64__) || defined(__i386__)
#define CPU_X86 1
#include <immintrin.h>
#else
#define CPU_X86 0
#endif

/* The smallest product (m·n·k per matrix) worth packing for. */
#define CPU_MIN_WORK 4096
/* The smallest product split across threads (smaller runs on the caller). */
#define CPU_MIN_PARALLEL_WORK ((int64_t)128 * 128 * 64)

/* Units of work (row panel x column group) per thread that a product's
 * column panels are grouped to give, where its row panels are fewer. */
#define CPU_UNITS_PER_THREAD 6

/* Products of at most this many row panels read a row-major B in place,
 * its rows at most CPU_DIRECT_B_ROW_BYTES apart. */
#define CPU_DIRECT_B_ROWPANELS 16
#define CPU_DIRECT_B_ROW_BYTES 2048

/* Products with at most this many NR-wide column panels read A in place. */
#define CPU_DIRECT_A_PANELS 4

/* The most bytes of packed A shared by one row block's column blocks. */
#define CPU_ABLOCK_BYTES ((size_t)8 << 20)

#define MR_MAX 14
#define NR_MAX 32

typedef enum isa { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 } isa;

/* kern(kc, a, b, c, ldc, first): C[0..mr) x [0..NR) (+)= a·b for one
 * micro-panel pair; `first` starts every chain from +0.0 instead of
 * loading C.  One function per row count mr = 1..MR. */
typedef void (*kern_fn)(int64_t kc, const void *a, const void *b, void *c,
                        int64_t ldc, int first);

/* The same micro-tile reading A in place: element (i, k) at a[i·ars +
 * k·acs].  For products with few column panels, where packing A would
 * cost as much as the arithmetic it feeds. */
typedef void (*kern_s_fn)(int64_t kc, const void *a, int64_t ars, int64_t acs,
                          const void *b, void *c, int64_t ldc, int first);

/* The micro-tile with A packed and a row-major B read in place, its k
 * rows ldb elements apart: for products of few row panels, where each B
 * panel would be packed for the few units that read it. */
typedef void (*kern_b_fn)(int64_t kc, const void *a, const void *b, int64_t ldb,
                          void *c, int64_t ldc, int first);

typedef struct gemm_impl {
  int mr, nr, kc;
  int64_t nc; /* columns per work item (a multiple of nr) */
  kern_fn kern[MR_MAX + 1];
  kern_s_fn kern_s[MR_MAX + 1]; /* NULL: always pack A */
  kern_b_fn kern_b[MR_MAX + 1]; /* NULL: always pack B */
} gemm_impl;

/* ------------------------------------------------------- C microkernels */

#define C_MR 4
#define C_NR 8

#define DEFINE_C_KERNEL(T, FMA, SUF)                                     \
  static void kc_##SUF(int mr, int64_t kc, const T *a, const T *b, T *c, \
                       int64_t ldc, int first) {                         \
    T acc[C_MR][C_NR];                                                   \
    for (int i = 0; i < mr; i++)                                         \
      for (int j = 0; j < C_NR; j++)                                     \
        acc[i][j] = first ? (T)0 : c[i * ldc + j];                       \
    for (int64_t k = 0; k < kc; k++) {                                   \
      for (int i = 0; i < mr; i++) {                                     \
        T ai = a[k * C_MR + i];                                          \
        for (int j = 0; j < C_NR; j++)                                   \
          acc[i][j] = FMA(ai, b[k * C_NR + j], acc[i][j]);               \
      }                                                                  \
    }                                                                    \
    for (int i = 0; i < mr; i++)                                         \
      for (int j = 0; j < C_NR; j++) c[i * ldc + j] = acc[i][j];         \
  }
DEFINE_C_KERNEL(float, cpu_fmaf, f32)
DEFINE_C_KERNEL(double, cpu_fma, f64)

#define C_WRAP(SUF, T, MRV)                                              \
  static void kc_##SUF##_##MRV(int64_t kc, const void *a, const void *b, \
                               void *c, int64_t ldc, int first) {        \
    kc_##SUF(MRV, kc, a, b, c, ldc, first);                              \
  }
C_WRAP(f32, float, 1)
C_WRAP(f32, float, 2)
C_WRAP(f32, float, 3)
C_WRAP(f32, float, 4)
C_WRAP(f64, double, 1)
C_WRAP(f64, double, 2)
C_WRAP(f64, double, 3)
C_WRAP(f64, double, 4)

static const gemm_impl impl_c_f32 = {
    C_MR, C_NR, 256, 512, {NULL, kc_f32_1, kc_f32_2, kc_f32_3, kc_f32_4}};
static const gemm_impl impl_c_f64 = {
    C_MR, C_NR, 256, 512, {NULL, kc_f64_1, kc_f64_2, kc_f64_3, kc_f64_4}};

/* ----------------------------------------------------- x86 microkernels */

#if CPU_X86

/* Rows 0..13 of a tile, each a macro call X(i). */
#define ROWS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

/*
 * One body per ISA and dtype, instantiated per row count MRV (a
 * compile-time constant, so rows >= MRV vanish and the accumulators stay
 * in registers).  V: vector type; W: lanes; LD/ST: unaligned load/store;
 * SET1: broadcast; FMADD(a, b, c) = a·b + c, fused.
 */
#define DEFINE_SIMD_KERNEL(NAME, TARGET, T, V, W, MR, ZERO, LD, ST, SET1,      \
                           FMADD)                                              \
  static inline __attribute__((always_inline, target(TARGET))) void NAME(      \
      const int MRV, int64_t kc, const T *a, const int64_t ars,                \
      const int64_t acs, const T *b, const int64_t ldb, T *c, int64_t ldc,     \
      int first) {                                                             \
    V acc0[MR_MAX], acc1[MR_MAX];                                              \
    if (first) {                                                               \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV) { \
        acc0[i] = ZERO();                                                      \
        acc1[i] = ZERO();                                                      \
      }                                                                        \
    } else {                                                                   \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV) { \
        acc0[i] = LD(c + i * ldc);                                             \
        acc1[i] = LD(c + i * ldc + W);                                         \
      }                                                                        \
    }                                                                          \
    for (int64_t k = 0; k < kc; k++) {                                         \
      V b0 = LD(b), b1 = LD(b + W);                                            \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV) { \
        V ai = SET1(a[i * ars]);                                               \
        acc0[i] = FMADD(ai, b0, acc0[i]);                                      \
        acc1[i] = FMADD(ai, b1, acc1[i]);                                      \
      }                                                                        \
      a += acs;                                                                \
      b += ldb;                                                                \
    }                                                                          \
    _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV) {   \
      ST(c + i * ldc, acc0[i]);                                                \
      ST(c + i * ldc + W, acc1[i]);                                            \
    }                                                                          \
  }

/* The narrow form: one vector per row (NR = W), for products whose n fits
 * in one vector, where the two-vector tile would compute half or more of
 * its columns as padding.  Each lane's chain is the same FMADD(ai, b, acc)
 * as in the wide form. */
#define DEFINE_SIMD_KERNEL1(NAME, TARGET, T, V, W, ZERO, LD, ST, SET1, FMADD)  \
  static inline __attribute__((always_inline, target(TARGET))) void NAME(      \
      const int MRV, int64_t kc, const T *a, const int64_t ars,                \
      const int64_t acs, const T *b, const int64_t ldb, T *c, int64_t ldc,     \
      int first) {                                                             \
    V acc0[MR_MAX];                                                            \
    if (first) {                                                               \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV)   \
          acc0[i] = ZERO();                                                    \
    } else {                                                                   \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV)   \
          acc0[i] = LD(c + i * ldc);                                           \
    }                                                                          \
    for (int64_t k = 0; k < kc; k++) {                                         \
      V b0 = LD(b);                                                            \
      _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV) { \
        V ai = SET1(a[i * ars]);                                               \
        acc0[i] = FMADD(ai, b0, acc0[i]);                                      \
      }                                                                        \
      a += acs;                                                                \
      b += ldb;                                                                \
    }                                                                          \
    _Pragma("GCC unroll 14") for (int i = 0; i < MR_MAX; i++) if (i < MRV)     \
        ST(c + i * ldc, acc0[i]);                                              \
  }

DEFINE_SIMD_KERNEL1(k512n_f32, "avx512f", float, __m512, 16, _mm512_setzero_ps,
                    _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
                    _mm512_fmadd_ps)
DEFINE_SIMD_KERNEL1(k512n_f64, "avx512f", double, __m512d, 8, _mm512_setzero_pd,
                    _mm512_loadu_pd, _mm512_storeu_pd, _mm512_set1_pd,
                    _mm512_fmadd_pd)

DEFINE_SIMD_KERNEL(k512_f32, "avx512f", float, __m512, 16, 14,
                   _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                   _mm512_set1_ps, _mm512_fmadd_ps)
DEFINE_SIMD_KERNEL(k512_f64, "avx512f", double, __m512d, 8, 14,
                   _mm512_setzero_pd, _mm512_loadu_pd, _mm512_storeu_pd,
                   _mm512_set1_pd, _mm512_fmadd_pd)
DEFINE_SIMD_KERNEL(k256_f32, "avx2,fma", float, __m256, 8, 6, _mm256_setzero_ps,
                   _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
                   _mm256_fmadd_ps)
DEFINE_SIMD_KERNEL(k256_f64, "avx2,fma", double, __m256d, 4, 6,
                   _mm256_setzero_pd, _mm256_loadu_pd, _mm256_storeu_pd,
                   _mm256_set1_pd, _mm256_fmadd_pd)

/* Packed A and B (ars 1, acs MR, ldb NR: constants, so the loop is the
 * packed one), A in place (runtime strides), and B in place (a row-major
 * B's rows ldb apart, A packed). */
#define SIMD_WRAP(NAME, TARGET, T, MRV)                                   \
  static __attribute__((target(TARGET))) void NAME##_##MRV(               \
      int64_t kc, const void *a, const void *b, void *c, int64_t ldc,     \
      int first) {                                                        \
    NAME(MRV, kc, a, 1, NAME##_MR, b, NAME##_NR, c, ldc, first);          \
  }                                                                       \
  static __attribute__((target(TARGET))) void NAME##_s##MRV(              \
      int64_t kc, const void *a, int64_t ars, int64_t acs, const void *b, \
      void *c, int64_t ldc, int first) {                                  \
    NAME(MRV, kc, a, ars, acs, b, NAME##_NR, c, ldc, first);              \
  }                                                                       \
  static __attribute__((target(TARGET))) void NAME##_b##MRV(              \
      int64_t kc, const void *a, const void *b, int64_t ldb, void *c,     \
      int64_t ldc, int first) {                                           \
    NAME(MRV, kc, a, 1, NAME##_MR, b, ldb, c, ldc, first);                \
  }
#define SIMD_WRAP14(NAME, TARGET, T) \
  SIMD_WRAP(NAME, TARGET, T, 1)      \
  SIMD_WRAP(NAME, TARGET, T, 2)      \
  SIMD_WRAP(NAME, TARGET, T, 3)      \
  SIMD_WRAP(NAME, TARGET, T, 4)      \
  SIMD_WRAP(NAME, TARGET, T, 5)      \
  SIMD_WRAP(NAME, TARGET, T, 6)      \
  SIMD_WRAP(NAME, TARGET, T, 7)      \
  SIMD_WRAP(NAME, TARGET, T, 8)      \
  SIMD_WRAP(NAME, TARGET, T, 9)      \
  SIMD_WRAP(NAME, TARGET, T, 10)     \
  SIMD_WRAP(NAME, TARGET, T, 11)     \
  SIMD_WRAP(NAME, TARGET, T, 12)     \
  SIMD_WRAP(NAME, TARGET, T, 13)     \
  SIMD_WRAP(NAME, TARGET, T, 14)
#define SIMD_WRAP6(NAME, TARGET, T) \
  SIMD_WRAP(NAME, TARGET, T, 1)     \
  SIMD_WRAP(NAME, TARGET, T, 2)     \
  SIMD_WRAP(NAME, TARGET, T, 3)     \
  SIMD_WRAP(NAME, TARGET, T, 4)     \
  SIMD_WRAP(NAME, TARGET, T, 5)     \
  SIMD_WRAP(NAME, TARGET, T, 6)

enum {
  k512_f32_MR = 14,
  k512_f64_MR = 14,
  k256_f32_MR = 6,
  k256_f64_MR = 6,
  k512n_f32_MR = 14,
  k512n_f64_MR = 14,
  k512_f32_NR = 32,
  k512_f64_NR = 16,
  k256_f32_NR = 16,
  k256_f64_NR = 8,
  k512n_f32_NR = 16,
  k512n_f64_NR = 8
};
SIMD_WRAP14(k512_f32, "avx512f", float)
SIMD_WRAP14(k512_f64, "avx512f", double)
SIMD_WRAP14(k512n_f32, "avx512f", float)
SIMD_WRAP14(k512n_f64, "avx512f", double)
SIMD_WRAP6(k256_f32, "avx2,fma", float)
SIMD_WRAP6(k256_f64, "avx2,fma", double)

#define LIST14(NAME)                                                   \
  {                                                                    \
    NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6,  \
        NAME##_7, NAME##_8, NAME##_9, NAME##_10, NAME##_11, NAME##_12, \
        NAME##_13, NAME##_14                                           \
  }
#define LIST6(NAME) \
  { NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6 }

#define LIST14S(NAME)                                                        \
  {                                                                          \
    NULL, NAME##_s1, NAME##_s2, NAME##_s3, NAME##_s4, NAME##_s5, NAME##_s6,  \
        NAME##_s7, NAME##_s8, NAME##_s9, NAME##_s10, NAME##_s11, NAME##_s12, \
        NAME##_s13, NAME##_s14                                               \
  }
#define LIST6S(NAME) \
  { NULL, NAME##_s1, NAME##_s2, NAME##_s3, NAME##_s4, NAME##_s5, NAME##_s6 }

#define LIST14B(NAME)                                                        \
  {                                                                          \
    NULL, NAME##_b1, NAME##_b2, NAME##_b3, NAME##_b4, NAME##_b5, NAME##_b6,  \
        NAME##_b7, NAME##_b8, NAME##_b9, NAME##_b10, NAME##_b11, NAME##_b12, \
        NAME##_b13, NAME##_b14                                               \
  }
#define LIST6B(NAME) \
  { NULL, NAME##_b1, NAME##_b2, NAME##_b3, NAME##_b4, NAME##_b5, NAME##_b6 }

static const gemm_impl impl_512_f32 = {
    14, 32, 512, 512, LIST14(k512_f32), LIST14S(k512_f32), LIST14B(k512_f32)};
static const gemm_impl impl_512_f64 = {
    14, 16, 256, 512, LIST14(k512_f64), LIST14S(k512_f64), LIST14B(k512_f64)};
static const gemm_impl impl_512n_f32 = {14,
                                        16,
                                        512,
                                        512,
                                        LIST14(k512n_f32),
                                        LIST14S(k512n_f32),
                                        LIST14B(k512n_f32)};
static const gemm_impl impl_512n_f64 = {
    14, 8, 256, 512, LIST14(k512n_f64), LIST14S(k512n_f64), LIST14B(k512n_f64)};
static const gemm_impl impl_256_f32 = {
    6, 16, 256, 512, LIST6(k256_f32), LIST6S(k256_f32), LIST6B(k256_f32)};
static const gemm_impl impl_256_f64 = {
    6, 8, 256, 256, LIST6(k256_f64), LIST6S(k256_f64), LIST6B(k256_f64)};

#endif /* CPU_X86 */

/* ------------------------------------------------------------- the ISA */

static atomic_int chosen_isa = -1;

static isa best_isa(void) {
#if CPU_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return ISA_AVX2;
#endif
  return ISA_C;
}

static isa current_isa(void) {
  int v = atomic_load_explicit(&chosen_isa, memory_order_relaxed);
  if (v < 0) {
    v = (int)best_isa();
    atomic_store(&chosen_isa, v);
  }
  return (isa)v;
}

const char *topos_cpu_isa(void) {
  switch (current_isa()) {
    case ISA_AVX512:
      return "avx512";
    case ISA_AVX2:
      return "avx2";
    default:
      return "c";
  }
}

int topos_cpu_force_isa(const char *name) {
  isa best = best_isa();
  isa want = best;
  if (name) {
    if (strcmp(name, "avx512") == 0)
      want = ISA_AVX512;
    else if (strcmp(name, "avx2") == 0)
      want = ISA_AVX2;
    else if (strcmp(name, "c") == 0)
      want = ISA_C;
    else
      return -1;
  }
  if (want > best) return -1;
  atomic_store(&chosen_isa, (int)want);
  return 0;
}

static const gemm_impl *impl_for(topos_dtype dtype) {
  bool f64 = dtype == TOPOS_F64;
  switch (current_isa()) {
#if CPU_X86
    case ISA_AVX512:
      return f64 ? &impl_512_f64 : &impl_512_f32;
    case ISA_AVX2:
      return f64 ? &impl_256_f64 : &impl_256_f32;
#endif
    default:
      return f64 ? &impl_c_f64 : &impl_c_f32;
  }
}

/* The implementation for a product n columns wide: on AVX-512 one that
 * fits n ≤ one vector runs the narrow kernels. */
static const gemm_impl *impl_for_n(topos_dtype dtype, int64_t n) {
#if CPU_X86
  if (current_isa() == ISA_AVX512 && n <= (dtype == TOPOS_F64 ? 8 : 16))
    return dtype == TOPOS_F64 ? &impl_512n_f64 : &impl_512n_f32;
#endif
  return impl_for(dtype);
}

/* --------------------------------------------------------------- packing */

/*
 * pack_a: rows [0, mr) x k [0, kc) of A (element strides rs, cs) into
 * dst[k·MR + i], rows mr..MR zero.  pack_b: k [0, kc) x columns [0, nc) of
 * B into NR-wide panels dst[(p·kc + k)·NR + j], columns past nc zero.
 */
#define DEFINE_PACK(T, SUF)                                                    \
  static void pack_a_##SUF(const T *src, int64_t rs, int64_t cs, int64_t mr,   \
                           int64_t kc, int MR, T *dst) {                       \
    if (rs == 1) {                                                             \
      for (int64_t k = 0; k < kc; k++) {                                       \
        const T *s = src + k * cs;                                             \
        T *d = dst + k * MR;                                                   \
        int64_t i = 0;                                                         \
        for (; i < mr; i++) d[i] = s[i];                                       \
        for (; i < MR; i++) d[i] = (T)0;                                       \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    for (int64_t i = 0; i < mr; i++) {                                         \
      const T *s = src + i * rs;                                               \
      if (cs == 1)                                                             \
        for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = s[k];               \
      else                                                                     \
        for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = s[k * cs];          \
    }                                                                          \
    for (int64_t i = mr; i < MR; i++)                                          \
      for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = (T)0;                 \
  }                                                                            \
  static void pack_b_##SUF(const T *src, int64_t rs, int64_t cs, int64_t kc,   \
                           int64_t nc, int NR, T *dst) {                       \
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {                                  \
      int64_t nr = nc - j0 < NR ? nc - j0 : NR;                                \
      T *d = dst + j0 * kc;                                                    \
      const T *s = src + j0 * cs;                                              \
      if (cs == 1) {                                                           \
        for (int64_t k = 0; k < kc; k++) {                                     \
          memcpy(d + k * NR, s + k * rs, sizeof(T) * (size_t)nr);              \
          for (int64_t j = nr; j < NR; j++) d[k * NR + j] = (T)0;              \
        }                                                                      \
      } else if (rs == 1) {                                                    \
        for (int64_t j = 0; j < nr; j++)                                       \
          for (int64_t k = 0; k < kc; k++) d[k * NR + j] = s[j * cs + k];      \
        for (int64_t j = nr; j < NR; j++)                                      \
          for (int64_t k = 0; k < kc; k++) d[k * NR + j] = (T)0;               \
      } else {                                                                 \
        for (int64_t k = 0; k < kc; k++) {                                     \
          for (int64_t j = 0; j < nr; j++) d[k * NR + j] = s[k * rs + j * cs]; \
          for (int64_t j = nr; j < NR; j++) d[k * NR + j] = (T)0;              \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }
DEFINE_PACK(float, f32)
DEFINE_PACK(double, f64)

/* The same panels from bf16 operands, widened exactly to f32 on the way
 * (backend.h's bf16 products): the kernels then run the f32 chain. */
static void pack_a_bf16(const uint16_t *src, int64_t rs, int64_t cs, int64_t mr,
                        int64_t kc, int MR, float *dst) {
  for (int64_t k = 0; k < kc; k++) {
    float *d = dst + k * MR;
    int64_t i = 0;
    for (; i < mr; i++) d[i] = cpu_bf16_widen(src[i * rs + k * cs]);
    for (; i < MR; i++) d[i] = 0.0f;
  }
}
static void pack_b_bf16(const uint16_t *src, int64_t rs, int64_t cs, int64_t kc,
                        int64_t nc, int NR, float *dst) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    int64_t nr = nc - j0 < NR ? nc - j0 : NR;
    float *d = dst + j0 * kc;
    const uint16_t *s = src + j0 * cs;
    if (rs == 1 && cs != 1) {
      for (int64_t j = 0; j < nr; j++)
        for (int64_t k = 0; k < kc; k++)
          d[k * NR + j] = cpu_bf16_widen(s[j * cs + k]);
    } else {
      for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < nr; j++)
          d[k * NR + j] = cpu_bf16_widen(s[k * rs + j * cs]);
    }
    for (int64_t j = nr; j < NR; j++)
      for (int64_t k = 0; k < kc; k++) d[k * NR + j] = 0.0f;
  }
}

#if CPU_X86

/* Eight rows of eight f64 transposed in registers: r[i][c] -> r[c][i]. */
static inline __attribute__((always_inline, target("avx512f"))) void tr8_f64(
    __m512d *r) {
  __m512d t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);     /* even k */
    t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]); /* odd k */
  }
#pragma GCC unroll 2
  for (int o = 0; o < 2; o++) {
    u[4 * o] = _mm512_shuffle_f64x2(t[o], t[2 + o], 0x88);
    u[4 * o + 1] = _mm512_shuffle_f64x2(t[4 + o], t[6 + o], 0x88);
    u[4 * o + 2] = _mm512_shuffle_f64x2(t[o], t[2 + o], 0xdd);
    u[4 * o + 3] = _mm512_shuffle_f64x2(t[4 + o], t[6 + o], 0xdd);
    r[o] = _mm512_shuffle_f64x2(u[4 * o], u[4 * o + 1], 0x88);
    r[o + 4] = _mm512_shuffle_f64x2(u[4 * o], u[4 * o + 1], 0xdd);
    r[o + 2] = _mm512_shuffle_f64x2(u[4 * o + 2], u[4 * o + 3], 0x88);
    r[o + 6] = _mm512_shuffle_f64x2(u[4 * o + 2], u[4 * o + 3], 0xdd);
  }
}

/*
 * pack_a for an A whose k runs contiguous (cs 1, rows rs apart) on
 * AVX-512, MR <= 16: sixteen (f32) or eight (f64) k at a time through one
 * register transpose, each k's MR values one masked store, instead of MR
 * scalar stores a panel row apart per k.  Rows mr..MR are zero.  A copy:
 * no bits change.
 */
static __attribute__((target("avx512f"))) void pack_a_rows_512_f32(
    const float *src, int64_t rs, int64_t mr, int64_t kc, int MR, float *dst) {
  const __mmask16 mo = (__mmask16)((1u << MR) - 1u);
  __m512 r[16];
  int64_t k0 = 0;
  for (; k0 + 16 <= kc; k0 += 16) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
      r[i] = i < mr ? _mm512_loadu_ps(src + i * rs + k0) : _mm512_setzero_ps();
    transpose16_ps(r);
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++)
      _mm512_mask_storeu_ps(dst + (k0 + t) * MR, mo, r[t]);
  }
  if (k0 < kc) {
    int kt = (int)(kc - k0);
    const __mmask16 mk = (__mmask16)((1u << kt) - 1u);
    for (int i = 0; i < 16; i++)
      r[i] = i < mr ? _mm512_maskz_loadu_ps(mk, src + i * rs + k0)
                    : _mm512_setzero_ps();
    transpose16_ps(r);
    for (int t = 0; t < kt; t++)
      _mm512_mask_storeu_ps(dst + (k0 + t) * MR, mo, r[t]);
  }
}

static __attribute__((target("avx512f"))) void pack_a_rows_512_f64(
    const double *src, int64_t rs, int64_t mr, int64_t kc, int MR,
    double *dst) {
  /* rows 0..7 and 8..15, each through its own 8 x 8 transpose */
  const __mmask8 m0 = (__mmask8)(MR >= 8 ? 0xffu : (1u << MR) - 1u);
  const __mmask8 m1 = (__mmask8)(MR > 8 ? (1u << (MR - 8)) - 1u : 0u);
  const int groups = MR > 8 ? 2 : 1;
  __m512d r[8];
  for (int64_t k0 = 0; k0 < kc; k0 += 8) {
    int kt = kc - k0 < 8 ? (int)(kc - k0) : 8;
    const __mmask8 mk = (__mmask8)((1u << kt) - 1u);
    for (int gi = 0; gi < groups; gi++) {
      const __mmask8 mo = gi ? m1 : m0;
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) {
        int64_t row = 8 * gi + i;
        r[i] = row < mr ? _mm512_maskz_loadu_pd(mk, src + row * rs + k0)
                        : _mm512_setzero_pd();
      }
      tr8_f64(r);
      for (int t = 0; t < kt; t++)
        _mm512_mask_storeu_pd(dst + (k0 + t) * MR + 8 * gi, mo, r[t]);
    }
  }
}

/*
 * pack_a for an A whose rows run contiguous (rs 1, k cs apart: a
 * transposed operand, as in the weight gradient X^T·dY) on AVX-512: each
 * k's mr values one masked load and one masked store (rows mr..MR zero),
 * instead of a scalar copy per value.  The source walks down a column of
 * the stored matrix, a row apart per k, so the rows a few k ahead are
 * asked for early.  A copy: no bits change.
 */
#define PACK_A_AHEAD 8
static __attribute__((target("avx512f"))) void pack_a_cols_512_f32(
    const float *src, int64_t cs, int64_t mr, int64_t kc, int MR, float *dst) {
  const __mmask16 mi = (__mmask16)((1u << mr) - 1u);
  const __mmask16 mo = (__mmask16)((1u << MR) - 1u);
  for (int64_t k = 0; k < kc; k++) {
    if (k + PACK_A_AHEAD < kc) {
      const char *ahead = (const char *)(src + (k + PACK_A_AHEAD) * cs);
      __builtin_prefetch(ahead, 0, 3);
      __builtin_prefetch(ahead + (size_t)(mr - 1) * sizeof(float), 0, 3);
    }
    _mm512_mask_storeu_ps(dst + k * MR, mo,
                          _mm512_maskz_loadu_ps(mi, src + k * cs));
  }
}

static __attribute__((target("avx512f"))) void pack_a_cols_512_f64(
    const double *src, int64_t cs, int64_t mr, int64_t kc, int MR,
    double *dst) {
  /* rows 0..7 and 8..MR, a masked vector each */
  const int64_t mr1 = mr > 8 ? mr - 8 : 0;
  const __mmask8 mi0 = (__mmask8)(mr >= 8 ? 0xffu : (1u << mr) - 1u);
  const __mmask8 mi1 = (__mmask8)((1u << mr1) - 1u);
  const __mmask8 mo0 = (__mmask8)(MR >= 8 ? 0xffu : (1u << MR) - 1u);
  const __mmask8 mo1 = (__mmask8)(MR > 8 ? (1u << (MR - 8)) - 1u : 0u);
  for (int64_t k = 0; k < kc; k++) {
    const double *s = src + k * cs;
    if (k + PACK_A_AHEAD < kc) {
      const char *ahead = (const char *)(s + PACK_A_AHEAD * cs);
      __builtin_prefetch(ahead, 0, 3);
      __builtin_prefetch(ahead + (size_t)(mr - 1) * sizeof(double), 0, 3);
    }
    _mm512_mask_storeu_pd(dst + k * MR, mo0, _mm512_maskz_loadu_pd(mi0, s));
    if (mo1)
      _mm512_mask_storeu_pd(dst + k * MR + 8, mo1,
                            _mm512_maskz_loadu_pd(mi1, s + 8));
  }
}

/* pack_b for a row-major B (cs 1) on AVX-512, a panel (NR elements) a
 * multiple of 64 bytes: each k's panel as whole-vector loads and stores,
 * the last panel's columns past nc zero through masked loads (instead of
 * a memcpy call and a zeroing loop per k).  A copy, so it walks 4-byte
 * words (an f64 is two) and serves both dtypes: rs, nc and NR are in
 * words here.  No bits change. */
static __attribute__((target("avx512f"))) void pack_b_rows_512(
    const uint32_t *src, int64_t rs, int64_t kc, int64_t nc, int NR,
    uint32_t *dst) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    uint32_t *d = dst + j0 * kc;
    const uint32_t *s = src + j0;
    if (nc - j0 >= NR && NR == 32) {
      for (int64_t k = 0; k < kc; k++) {
        __m512i x0 = _mm512_loadu_si512(s + k * rs);
        __m512i x1 = _mm512_loadu_si512(s + k * rs + 16);
        _mm512_storeu_si512(d + k * 32, x0);
        _mm512_storeu_si512(d + k * 32 + 16, x1);
      }
      continue;
    }
    for (int jv = 0; jv < NR; jv += 16) {
      int64_t left = nc - j0 - jv;
      int w = left <= 0 ? 0 : left < 16 ? (int)left : 16;
      const __mmask16 mk = (__mmask16)((1u << w) - 1u);
      for (int64_t k = 0; k < kc; k++)
        _mm512_storeu_si512(d + k * NR + jv,
                            _mm512_maskz_loadu_epi32(mk, s + k * rs + jv));
    }
  }
}
#endif /* CPU_X86 */

/* --------------------------------------------------- per-thread scratch */

typedef struct scratch {
  void *p;
  size_t cap;
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *v) {
  scratch *s = v;
  if (s) free(s->p);
  free(s);
}

static void scratch_init(void) {
  pthread_key_create(&scratch_key, scratch_free);
}

/* The calling thread's packing buffer, at least `bytes` (64-byte aligned),
 * kept for the thread's life so steps reuse the same pages. */
static void *scratch_get(size_t bytes) {
  pthread_once(&scratch_once, scratch_init);
  scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_setspecific(scratch_key, s)) {
      free(s);
      return NULL;
    }
  }
  if (s->cap < bytes) {
    void *p = NULL;
    size_t cap = bytes + bytes / 4;
    if (posix_memalign(&p, 64, cap)) return NULL;
    free(s->p);
    s->p = p;
    s->cap = cap;
  }
  return s->p;
}

/* ----------------------------------------------------------- the driver */

/*
 * One job is one task run by T threads together.  For each matrix of the
 * batch and each block of at most im->nc columns, k advances in blocks of
 * KC: the threads pack the block's B panel together (each a share of its
 * NR-wide panels) into one shared buffer, meet at a barrier, then split
 * the outputs - units of (MR rows, a group of column panels), dealt round
 * robin - each packing its own A micro-panel and running the microkernel
 * over its panels, and meet again before the next k block overwrites B.
 * Which thread computes an output never changes its chain.
 */
typedef struct gemm_job {
  const topos_gemm_task *g;
  const gemm_impl *im;
  size_t es;       /* bytes per C element and packed element (compute type) */
  size_t ies;      /* bytes per A and B element (2 for bf16 operands) */
  int T;           /* threads taking part */
  int64_t nc;      /* columns per block (a multiple of nr) */
  int64_t nblocks; /* column blocks per matrix */
  char *bpack;     /* two shared B panel buffers: nc x KC each */
  size_t bbytes;   /* bytes per B panel buffer */
  char *abufs;     /* per thread: A micro-panel (MR x KC) + a C tile */
  char *ablock;    /* shared packed A of one row block (mc x KC), or NULL */
  int64_t mc;      /* rows per row block (a multiple of mr) */
  int64_t kc;      /* k per block */
  size_t abytes;   /* bytes per thread in abufs */
  bool direct_a;   /* the kernels read A in place (kern_s), no packing */
  bool direct_b;   /* the kernels read B in place (kern_b), no packing */
  /* Other task kinds (cpu_window.c): when set, each thread runs
   * fn(arg, tid, T) instead of the GEMM. */
  void (*fn)(void *arg, int tid, int T);
  void *arg;
  /* Work is claimed, not assigned: B panels and output units carry
   * tickets that only grow over the job (phase after phase), so a thread
   * that is late or descheduled holds up at most the item it claimed.
   * Each counter has its own cache line, away from the read-only fields
   * above, which claims from one core would otherwise take from the
   * other's cache. */
  _Alignas(64) atomic_llong pack_next;
  _Alignas(64) atomic_llong pack_done;
  _Alignas(64) atomic_llong unit_next;
  _Alignas(64) atomic_llong unit_done;
} gemm_job;

static inline void cpu_relax(void) {
#if CPU_X86
  _mm_pause();
#endif
}

/* Waiting: spin a little, then give the core away (the machine may have
 * fewer free cores than the job has threads). */
static inline void backoff(int spins) {
  if (spins < 256)
    cpu_relax();
  else
    sched_yield();
}

/* Claims the next ticket below `end` (false when none is left). */
static bool claim(atomic_llong *next, int64_t end, int64_t *ticket) {
  long long v = atomic_load_explicit(next, memory_order_relaxed);
  while (v < end)
    if (atomic_compare_exchange_weak_explicit(
            next, &v, v + 1, memory_order_relaxed, memory_order_relaxed)) {
      *ticket = v;
      return true;
    }
  return false;
}

/* Marks a claimed item finished (its writes published). */
static void finish(atomic_llong *done) {
  atomic_fetch_add_explicit(done, 1, memory_order_release);
}

/* Waits until every item below `end` is finished (their writes seen). */
static void wait_done(atomic_llong *done, int64_t end) {
  for (int spins = 0; atomic_load_explicit(done, memory_order_acquire) < end;
       spins++)
    backoff(spins);
}

static void pack_a(const gemm_job *j, const char *src, int64_t mr, int64_t kc,
                   char *dst) {
  const topos_gemm_task *g = j->g;
#if CPU_X86
  /* f32 or f64 panels of at most 16 rows on AVX-512: an A with one
   * contiguous axis packs by vectors. */
  if (j->im->mr <= 16 && current_isa() == ISA_AVX512 &&
      g->dtype != TOPOS_BF16) {
    /* k contiguous in A, rows apart: through register transposes; rows
     * contiguous, k apart (a transposed A): masked loads. */
    bool rows = g->a_col == 1 && g->a_row != 1;
    bool cols = g->a_row == 1 && g->a_col != 1;
    if (rows || cols) {
      int64_t ld = rows ? g->a_row : g->a_col;
      if (g->dtype == TOPOS_F64)
        (rows ? pack_a_rows_512_f64 : pack_a_cols_512_f64)(
            (const double *)src, ld, mr, kc, j->im->mr, (double *)dst);
      else
        (rows ? pack_a_rows_512_f32 : pack_a_cols_512_f32)(
            (const float *)src, ld, mr, kc, j->im->mr, (float *)dst);
      return;
    }
  }
#endif
  if (g->dtype == TOPOS_F64)
    pack_a_f64((const double *)src, g->a_row, g->a_col, mr, kc, j->im->mr,
               (double *)dst);
  else if (g->dtype == TOPOS_BF16)
    pack_a_bf16((const uint16_t *)src, g->a_row, g->a_col, mr, kc, j->im->mr,
                (float *)dst);
  else
    pack_a_f32((const float *)src, g->a_row, g->a_col, mr, kc, j->im->mr,
               (float *)dst);
}

static void pack_b(const gemm_job *j, const char *src, int64_t kc, int64_t nc,
                   char *dst) {
  const topos_gemm_task *g = j->g;
#if CPU_X86
  /* A transposed B on AVX-512: through register transposes. */
  if (g->b_row == 1 && g->b_col != 1 && j->im->nr % 16 == 0 &&
      current_isa() == ISA_AVX512 && g->dtype != TOPOS_F64) {
    if (g->dtype == TOPOS_BF16)
      cpu_pack_bt_512_bf16((const uint16_t *)src, g->b_col, kc, nc, j->im->nr,
                           (float *)dst);
    else
      cpu_pack_bt_512_f32((const float *)src, g->b_col, kc, nc, j->im->nr,
                          (float *)dst);
    return;
  }
  /* A row-major B on AVX-512: whole-vector copies. */
  if (g->b_col == 1 && current_isa() == ISA_AVX512 && g->dtype != TOPOS_BF16 &&
      j->im->nr % (g->dtype == TOPOS_F64 ? 8 : 16) == 0) {
    int words = g->dtype == TOPOS_F64 ? 2 : 1; /* 4-byte words an element */
    pack_b_rows_512((const uint32_t *)src, g->b_row * words, kc, nc * words,
                    j->im->nr * words, (uint32_t *)dst);
    return;
  }
#endif
  if (g->dtype == TOPOS_F64)
    pack_b_f64((const double *)src, g->b_row, g->b_col, kc, nc, j->im->nr,
               (double *)dst);
  else if (g->dtype == TOPOS_BF16)
    pack_b_bf16((const uint16_t *)src, g->b_row, g->b_col, kc, nc, j->im->nr,
                (float *)dst);
  else
    pack_b_f32((const float *)src, g->b_row, g->b_col, kc, nc, j->im->nr,
               (float *)dst);
}

/* dst[i·drow + j·dcol] = src[i·srow + j·scol] for an mr x nr tile of
 * es-byte elements (a copy: no arithmetic, so no bits change). */
static void tile_copy(char *dst, int64_t drow, int64_t dcol, const char *src,
                      int64_t srow, int64_t scol, int64_t mr, int64_t nr,
                      size_t es) {
  if (es == sizeof(double)) {
    double *d = (double *)dst;
    const double *s = (const double *)src;
    for (int64_t i = 0; i < mr; i++)
      for (int64_t x = 0; x < nr; x++)
        d[i * drow + x * dcol] = s[i * srow + x * scol];
  } else {
    float *d = (float *)dst;
    const float *s = (const float *)src;
    for (int64_t i = 0; i < mr; i++)
      for (int64_t x = 0; x < nr; x++)
        d[i * drow + x * dcol] = s[i * srow + x * scol];
  }
}

/* Asks for rows [0, mr) of a C tile, `bytes` wide, rows `row` bytes
 * apart, with intent to write (a hint: no bits change). */
static inline void prefetch_tile(const char *c, int64_t row, int64_t mr,
                                 size_t bytes) {
  for (int64_t i = 0; i < mr; i++)
    for (size_t o = 0; o < bytes; o += 64)
      __builtin_prefetch(c + i * row + o, 1, 3);
}

/* Claims and packs the B panels of phase (bi, p0, jb) - tickets [base,
 * base + its panel count) - into buf. */
static void pack_panels(gemm_job *j, int64_t bi, int64_t p0, int64_t jb,
                        int64_t base, char *buf) {
  const topos_gemm_task *g = j->g;
  const int64_t NR = j->im->nr;
  const char *B = (const char *)g->b + (size_t)(bi * g->b_batch) * j->ies;
  int64_t kc = g->k - p0 < j->kc ? g->k - p0 : j->kc;
  int64_t j0 = jb * j->nc;
  int64_t j1 = j0 + j->nc < g->n ? j0 + j->nc : g->n;
  int64_t npan = (j1 - j0 + NR - 1) / NR, t;
  while (claim(&j->pack_next, base + npan, &t)) {
    int64_t q = t - base;
    int64_t c0 = j0 + q * NR;
    int64_t c1 = c0 + NR < j1 ? c0 + NR : j1;
    pack_b(j, B + (size_t)(p0 * g->b_row + c0 * g->b_col) * j->ies, kc, c1 - c0,
           buf + (size_t)(q * kc * NR) * j->es);
    finish(&j->pack_done);
  }
}

static void job_work(gemm_job *j, int tid) {
  if (j->fn) {
    j->fn(j->arg, tid, j->T);
    return;
  }
  const topos_gemm_task *g = j->g;
  const gemm_impl *im = j->im;
  const size_t es = j->es, ies = j->ies;
  const int MR = im->mr, NR = im->nr, T = j->T;
  const int64_t KC = j->kc;
  char *apack = j->abufs + (size_t)tid * j->abytes;
  char *tile = apack + (size_t)(MR * KC) * es;
  /* Every thread walks the same phases (batch, row block, k block, column
   * block) and keeps the same running ticket bases, so tickets name the
   * same item for all of them.  A phase's units start after all of its B
   * panels are packed; the next phase's units start after all of this
   * one's are done (they extend C's chains - for one output the k blocks
   * still come in order, p0 being the outer loop - and read the A block
   * the first column block packs).  B panels alternate between two
   * buffers, phase ph in buffer ph % 2. */
  int64_t pbase = 0, ubase = 0, ph = 0, t;
  for (int64_t bi = 0; bi < g->batch; bi++) {
    const char *A = (const char *)g->a + (size_t)(bi * g->a_batch) * ies;
    char *C = (char *)g->c + (size_t)(bi * g->c_batch) * es;
    for (int64_t i0 = 0; i0 < g->m; i0 += j->mc) {
      int64_t i1 = i0 + j->mc < g->m ? i0 + j->mc : g->m;
      int64_t rowpanels = (i1 - i0 + MR - 1) / MR;
      /* Column groups: enough units for every thread to have a few
       * (CPU_UNITS_PER_THREAD), so that a short last row panel - 128 rows
       * are nine of 14 and a part - leaves no thread idle for most of a
       * unit while another finishes; one thread alone takes two. */
      int64_t want = T > 1 ? CPU_UNITS_PER_THREAD * (int64_t)T : 2;
      int64_t groups0 = 1;
      if (rowpanels < want) groups0 = (want + rowpanels - 1) / rowpanels;
      /* With one unit per row panel, the first column block packs each A
       * micro-panel into the shared A block and the others read it. */
      bool shared_a = j->ablock && groups0 == 1;
      for (int64_t p0 = 0; p0 < g->k; p0 += KC) {
        int64_t kc = g->k - p0 < KC ? g->k - p0 : KC;
        int first = p0 == 0;
        for (int64_t jb = 0; jb < j->nblocks; jb++) {
          int64_t j0 = jb * j->nc;
          int64_t j1 = j0 + j->nc < g->n ? j0 + j->nc : g->n;
          int64_t npan = (j1 - j0 + NR - 1) / NR;
          int64_t groups = groups0 > npan ? npan : groups0;
          int64_t units = rowpanels * groups;
          char *bpack = j->bpack + (size_t)(ph % 2) * j->bbytes;
          /* B in place: its panel q's row p0 (f32/f64, as C's) */
          const char *bsrc =
              (const char *)g->b +
              (size_t)(bi * g->b_batch + p0 * g->b_row + j0) * es;
          if (!j->direct_b) {
            pack_panels(j, bi, p0, jb, pbase, bpack);
            pbase += npan;
            wait_done(&j->pack_done, pbase);
          }
          while (claim(&j->unit_next, ubase + units, &t)) {
            int64_t u = t - ubase;
            int64_t rp = u / groups, cg = u % groups;
            int64_t ir = i0 + rp * MR;
            int64_t mr = i1 - ir < MR ? i1 - ir : MR;
            const char *asrc =
                A + (size_t)(ir * g->a_row + p0 * g->a_col) * ies;
            kern_fn kern = im->kern[mr];
            kern_s_fn kern_s = j->direct_a ? im->kern_s[mr] : NULL;
            kern_b_fn kern_b = j->direct_b ? im->kern_b[mr] : NULL;
            const char *ap = apack;
            if (shared_a) {
              char *dst = j->ablock + (size_t)(rp * MR * kc) * es;
              if (jb == 0) pack_a(j, asrc, mr, kc, dst);
              ap = dst;
            } else if (!kern_s) {
              pack_a(j, asrc, mr, kc, apack);
            }
            int64_t qa = npan * cg / groups, qb = npan * (cg + 1) / groups;
            for (int64_t q = qa; q < qb; q++) {
              int64_t jj = j0 + q * NR;
              int64_t nr = j1 - jj < NR ? j1 - jj : NR;
              const char *bp = kern_b ? bsrc + (size_t)(q * NR) * es
                                      : bpack + (size_t)(q * kc * NR) * es;
              char *cp = C + (size_t)(ir * g->c_row + jj * g->c_col) * es;
              /* The next tile of C (this row panel's next, or the next
               * row panel's first) on its way while this one runs (a
               * short k block has too little time to hide it in). */
              if (g->c_col == 1 && kc >= 128) {
                if (q + 1 < qb)
                  prefetch_tile(cp + (size_t)NR * es, g->c_row * (int64_t)es,
                                mr, NR * es);
                else if (ir + MR < i1)
                  prefetch_tile(
                      C + (size_t)((ir + MR) * g->c_row + j0 + qa * NR) * es,
                      g->c_row * (int64_t)es,
                      i1 - ir - MR < MR ? i1 - ir - MR : MR, NR * es);
              }
              if (nr == NR && g->c_col == 1) {
                if (kern_s)
                  kern_s(kc, asrc, g->a_row, g->a_col, bp, cp, g->c_row, first);
                else if (kern_b)
                  kern_b(kc, ap, bp, g->b_row, cp, g->c_row, first);
                else
                  kern(kc, ap, bp, cp, g->c_row, first);
                continue;
              }
              /* A partial or strided tile goes through a contiguous one. */
              if (!first)
                tile_copy(tile, NR, 1, cp, g->c_row, g->c_col, mr, nr, es);
              if (kern_s)
                kern_s(kc, asrc, g->a_row, g->a_col, bp, tile, NR, first);
              else if (kern_b)
                kern_b(kc, ap, bp, g->b_row, tile, NR, first);
              else
                kern(kc, ap, bp, tile, NR, first);
              tile_copy(cp, g->c_row, g->c_col, tile, NR, 1, mr, nr, es);
            }
            finish(&j->unit_done);
          }
          /* No unit left to claim: pack the next phase's panels into the
           * other buffer (its last readers, the phase before this one, are
           * done) while the last units here finish. */
          int64_t nbi = bi, ni0 = i0, np0 = p0, njb = jb + 1;
          if (njb == j->nblocks) {
            njb = 0;
            np0 += KC;
            if (np0 >= g->k) {
              np0 = 0;
              ni0 += j->mc;
              if (ni0 >= g->m) {
                ni0 = 0;
                nbi++;
              }
            }
          }
          if (nbi < g->batch && !j->direct_b)
            pack_panels(j, nbi, np0, njb, pbase,
                        j->bpack + (size_t)((ph + 1) % 2) * j->bbytes);
          ph++;
          ubase += units;
          wait_done(&j->unit_done, ubase);
        }
      }
    }
  }
}

/* ------------------------------------------------------ the thread pool */

/*
 * Workers are created once (growing to the most threads ever asked for)
 * and wait for a generation number to change.  One job runs at a time; a
 * caller that finds the pool busy runs its task on its own thread (the
 * bits are the same either way).  Workers spin briefly before sleeping so
 * that back-to-back products of a training step do not pay a wake-up.
 */
#define POOL_MAX 64
#define POOL_SPINS 2048

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static int pool_workers;        /* threads created */
static atomic_uint pool_gen;    /* bumped for each job */
static gemm_job *pool_job;      /* the job of the current generation */
static int pool_want;           /* workers [0, want) take part */
static atomic_int pool_pending; /* workers still running the job */
static int pool_sleepers;       /* workers waiting on pool_cv (pool_mu) */
static unsigned pool_start_gen[POOL_MAX]; /* the generation a worker
                                             started after */

static void *pool_main(void *arg) {
  int id = (int)(intptr_t)arg;
  /* Its own name, not its creator's (ps -L, top -H, perf). */
  char name[16];
  snprintf(name, sizeof name, "topos-cpu%u", (unsigned)id % 100000u);
  pthread_setname_np(pthread_self(), name);
  unsigned seen = pool_start_gen[id];
  for (;;) {
    unsigned gen;
    int spins = 0;
    /* A short spin (tens of microseconds: the gap between the products
     * of one training step) before sleeping, yielding now and then: on a
     * box whose cores are all busy, a spinning worker would otherwise
     * take the core the caller needs to produce the next job. */
    while ((gen = atomic_load_explicit(&pool_gen, memory_order_acquire)) ==
               seen &&
           spins < POOL_SPINS) {
      if (++spins % 256 == 0)
        sched_yield();
      else
        cpu_relax();
    }
    pthread_mutex_lock(&pool_mu);
    while ((gen = atomic_load(&pool_gen)) == seen) {
      pool_sleepers++;
      pthread_cond_wait(&pool_cv, &pool_mu);
      pool_sleepers--;
    }
    gemm_job *job = pool_job;
    bool mine = id < pool_want;
    pthread_mutex_unlock(&pool_mu);
    seen = gen;
    if (!mine) continue;
    job_work(job, id + 1);
    atomic_fetch_sub_explicit(&pool_pending, 1, memory_order_release);
  }
  return NULL;
}

/* A forked child has none of the parent's workers: start over. */
static void pool_after_fork(void) {
  pthread_mutex_init(&pool_mu, NULL);
  pthread_mutex_init(&pool_busy, NULL);
  pthread_cond_init(&pool_cv, NULL);
  pool_workers = 0;
  pool_want = 0;
  pool_sleepers = 0;
  atomic_store(&pool_pending, 0);
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) {
  pthread_atfork(NULL, NULL, pool_after_fork);
}

/* Makes sure `n` workers exist; returns how many do. */
static int pool_grow(int n) {
  pthread_once(&pool_once, pool_init);
  if (n > POOL_MAX) n = POOL_MAX;
  while (pool_workers < n) {
    pthread_t t;
    pthread_attr_t at;
    pool_start_gen[pool_workers] = atomic_load(&pool_gen);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, pool_main, (void *)(intptr_t)pool_workers);
    pthread_attr_destroy(&at);
    if (rc) break;
    pool_workers++;
  }
  return pool_workers;
}

/* Hands job to workers [0, helpers), runs the caller's share (thread 0),
 * waits for theirs and releases the pool (held by the caller).  The
 * condition variable is signalled only when a worker sleeps on it: a
 * worker still spinning sees the new generation on its own, and a
 * training step's back-to-back products then pay no wake-up call. */
static void pool_run(gemm_job *job, int helpers) {
  pthread_mutex_lock(&pool_mu);
  pool_job = job;
  pool_want = helpers;
  atomic_store(&pool_pending, helpers);
  atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
  if (pool_sleepers > 0) pthread_cond_broadcast(&pool_cv);
  pthread_mutex_unlock(&pool_mu);
  job_work(job, 0);
  for (int spins = 0;
       atomic_load_explicit(&pool_pending, memory_order_acquire) > 0; spins++)
    backoff(spins);
  pthread_mutex_unlock(&pool_busy);
}

/* Runs the job on the caller plus up to threads-1 workers; the caller's
 * scratch holds the shared B panel and every thread's A buffer. */
static int run_job(gemm_job *job, int threads) {
  bool pooled = threads > 1 && pthread_mutex_trylock(&pool_busy) == 0;
  int helpers = 0;
  if (pooled) {
    helpers = pool_grow(threads - 1);
    if (helpers > threads - 1) helpers = threads - 1;
  }
  job->T = 1 + helpers;
  const gemm_impl *im = job->im;
  job->abytes = (size_t)(im->mr * job->kc + im->mr * im->nr) * job->es;
  job->abytes = (job->abytes + 63) / 64 * 64;
  size_t bbytes = (size_t)((job->nc + im->nr) * job->kc) * job->es;
  bbytes = job->direct_b ? 0 : (bbytes + 63) / 64 * 64;
  /* The shared A block pays off when A would otherwise be packed again
   * for every column block. */
  size_t ablock_bytes = 0;
  if (job->nblocks > 1 && !job->direct_a)
    ablock_bytes = (size_t)(job->mc * job->kc) * job->es;
  char *buf =
      scratch_get(2 * bbytes + ablock_bytes + job->abytes * (size_t)job->T);
  if (!buf) {
    if (pooled) pthread_mutex_unlock(&pool_busy);
    return TOPOS_ERR_MEMORY;
  }
  job->bpack = buf;
  job->bbytes = bbytes;
  job->ablock = ablock_bytes ? buf + 2 * bbytes : NULL;
  job->abufs = buf + 2 * bbytes + ablock_bytes;
  if (helpers == 0) {
    job_work(job, 0);
    if (pooled) pthread_mutex_unlock(&pool_busy);
    return TOPOS_OK;
  }
  pool_run(job, helpers);
  return TOPOS_OK;
}

/* A parallel section on the pool for cpu_window.c (cpu_window.h). */
void cpu_parallel(int threads, void (*fn)(void *arg, int tid, int T),
                  void *arg) {
  gemm_job job = {.fn = fn, .arg = arg};
  bool pooled = threads > 1 && pthread_mutex_trylock(&pool_busy) == 0;
  int helpers = 0;
  if (pooled) {
    helpers = pool_grow(threads - 1);
    if (helpers > threads - 1) helpers = threads - 1;
  }
  job.T = 1 + helpers;
  if (helpers == 0) {
    fn(arg, 0, 1);
    if (pooled) pthread_mutex_unlock(&pool_busy);
    return;
  }
  pool_run(&job, helpers);
}

int cpu_gemm_kernels(topos_dtype dtype, cpu_kernels *out) {
  const gemm_impl *im = impl_for(dtype);
  out->mr = im->mr;
  out->nr = im->nr;
  out->kc = im->kc;
  for (int i = 0; i <= MR_MAX; i++)
    out->kern[i] = i <= im->mr ? im->kern[i] : NULL;
  return 0;
}

/* -------------------------------------------------------------- backend */

static atomic_ullong tasks_run;

unsigned long long topos_cpu_tasks_run(void) {
  return atomic_load(&tasks_run);
}

/* backends.h: the shared packed-A block's cap, for tests. */
static atomic_size_t ablock_cap;
void topos_cpu_test_ablock_bytes(size_t bytes) {
  atomic_store(&ablock_cap, bytes);
}

static bool cpu_supports(const topos_backend *self, const topos_task *task) {
  (void)self;
  if (task && task->kind == TOPOS_TASK_REDUCE) return cpu_reduce_supports(task);
  if (task && task->kind == TOPOS_TASK_MAP) return cpu_map_supports(task);
  if (task && task->kind == TOPOS_TASK_WINDOW)
    return cpu_window_supports(&task->u.window);
  if (task && task->kind == TOPOS_TASK_ATTENTION)
    return cpu_attention_supports(&task->u.attention);
  if (task && task->kind == TOPOS_TASK_UNITS)
    return task->threads > 1 && task->u.units.units > 1;
  if (!task || task->kind != TOPOS_TASK_GEMM) return false;
  const topos_gemm_task *g = &task->u.gemm;
  if (g->dtype != TOPOS_F32 && g->dtype != TOPOS_F64 && g->dtype != TOPOS_BF16)
    return false;
  if (g->batch < 1 || g->m < 1 || g->n < 1 || g->k < 1) return false;
  int64_t mn;
  if (__builtin_mul_overflow(g->m, g->n, &mn)) return true;
  int64_t mnk;
  if (__builtin_mul_overflow(mn, g->k, &mnk)) return true;
  return mnk >= CPU_MIN_WORK;
}

static int cpu_run(const topos_backend *self, const topos_task *task,
                   topos_error *err) {
  (void)self;
  (void)err;
  if (task->kind == TOPOS_TASK_REDUCE) return cpu_reduce_run(task);
  if (task->kind == TOPOS_TASK_MAP) return cpu_map_run(task);
  if (task->kind == TOPOS_TASK_ATTENTION) {
    int arc = cpu_attention_run(&task->u.attention, task->threads);
    if (arc == TOPOS_OK)
      atomic_fetch_add_explicit(&tasks_run, 1, memory_order_relaxed);
    return arc;
  }
  if (task->kind == TOPOS_TASK_UNITS) {
    cpu_units_run(&task->u.units, task->threads);
    atomic_fetch_add_explicit(&tasks_run, 1, memory_order_relaxed);
    return TOPOS_OK;
  }
  if (task->kind == TOPOS_TASK_WINDOW) {
    int wrc = cpu_window_run(&task->u.window, task->threads);
    if (wrc == TOPOS_OK)
      atomic_fetch_add_explicit(&tasks_run, 1, memory_order_relaxed);
    return wrc;
  }
  const topos_gemm_task *g = &task->u.gemm;
  if (g->dtype != TOPOS_F32 && g->dtype != TOPOS_F64 && g->dtype != TOPOS_BF16)
    return TOPOS_ERR_DTYPE;
  if (g->batch < 1 || g->m < 1 || g->n < 1) return TOPOS_OK;
  if (g->k < 1) { /* every chain is empty: +0.0 */
    for (int64_t b = 0; b < g->batch; b++)
      for (int64_t i = 0; i < g->m; i++)
        for (int64_t jx = 0; jx < g->n; jx++) {
          int64_t at = b * g->c_batch + i * g->c_row + jx * g->c_col;
          if (g->dtype == TOPOS_F64)
            ((double *)g->c)[at] = 0.0;
          else
            ((float *)g->c)[at] = 0.0f;
        }
    return TOPOS_OK;
  }
  if (cpu_gemv_applies(g)) {
    int vrc = cpu_gemv_run(g, task->threads > 0 ? task->threads : 1,
                           (int)current_isa());
    if (vrc == TOPOS_OK)
      atomic_fetch_add_explicit(&tasks_run, 1, memory_order_relaxed);
    return vrc;
  }
  const gemm_impl *im = impl_for_n(g->dtype, g->n);
  gemm_job job = {.g = g, .im = im};
  job.es = g->dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  job.ies = g->dtype == TOPOS_BF16 ? sizeof(uint16_t) : job.es;
  int threads = task->threads > 0 ? task->threads : 1;
  double work = (double)g->m * (double)g->n * (double)g->k * (double)g->batch;
  if (work < (double)CPU_MIN_PARALLEL_WORK) threads = 1;
  job.kc = im->kc;
  /* Column blocks of at most im->nc (twice that for several threads on
   * AVX-512: half the phases, so half the barriers and B handovers, for
   * a B block still about one core's L2), evened out, whole panels. */
  int64_t ncmax = im->nc;
  if (threads > 1 && current_isa() == ISA_AVX512) ncmax *= 2;
  int64_t nb = (g->n + ncmax - 1) / ncmax;
  int64_t nc = (g->n + nb - 1) / nb;
  nc = (nc + im->nr - 1) / im->nr * im->nr;
  job.nc = nc;
  job.nblocks = (g->n + nc - 1) / nc;
  /* Packing A pays for itself across a row's column panels; with a few of
   * them the kernel reads A in place (the same fmas in the same order). */
  /* A unit's panels: its row panel's, or one column group's where the
   * row panels are few (job_work's grouping on one row block: a 128-row
   * product on two threads runs units of half its panels, each of which
   * would otherwise pack the same A micro-panel again). */
  int64_t npan_all = (nc + im->nr - 1) / im->nr;
  int64_t rowpanels = (g->m + im->mr - 1) / im->mr;
  int64_t want = threads > 1 ? CPU_UNITS_PER_THREAD * (int64_t)threads : 2;
  int64_t groups = rowpanels < want ? (want + rowpanels - 1) / rowpanels : 1;
  if (groups > npan_all) groups = npan_all;
  int64_t unit_panels = (npan_all + groups - 1) / groups;
  job.direct_a = job.nblocks == 1 && unit_panels <= CPU_DIRECT_A_PANELS &&
                 g->dtype != TOPOS_BF16;
  /* A row-major B that few row panels read (a training batch's forward
   * through a weight): packing each panel would cost about what the few
   * units reading it save.  Whole panels only, rows at most
   * CPU_DIRECT_B_ROW_BYTES apart (so that a panel's rows do not pile
   * into a few cache sets). */
  job.direct_b = !job.direct_a && im->kern_b[1] && g->b_col == 1 &&
                 g->dtype != TOPOS_BF16 && g->n % im->nr == 0 &&
                 rowpanels <= CPU_DIRECT_B_ROWPANELS &&
                 g->b_row * (int64_t)job.es <= CPU_DIRECT_B_ROW_BYTES;
  /* Row blocks: the shared packed A of one (at most CPU_ABLOCK_BYTES),
   * evened out, whole micro-panels. */
  size_t ab = atomic_load_explicit(&ablock_cap, memory_order_relaxed);
  int64_t mc_cap =
      (int64_t)((ab ? ab : CPU_ABLOCK_BYTES) / ((size_t)job.kc * job.es));
  mc_cap = mc_cap / im->mr * im->mr;
  if (mc_cap < im->mr) mc_cap = im->mr;
  int64_t mb = (g->m + mc_cap - 1) / mc_cap;
  int64_t mc = (g->m + mb - 1) / mb;
  job.mc = (mc + im->mr - 1) / im->mr * im->mr;
  atomic_init(&job.pack_next, 0);
  atomic_init(&job.pack_done, 0);
  atomic_init(&job.unit_next, 0);
  atomic_init(&job.unit_done, 0);
  int rc = run_job(&job, threads);
  if (rc == TOPOS_OK)
    atomic_fetch_add_explicit(&tasks_run, 1, memory_order_relaxed);
  return rc;
}

static void cpu_device(const topos_backend *self, char *buf, size_t len) {
  (void)self;
  snprintf(buf, len, "host CPU, %s microkernels", topos_cpu_isa());
}

static int cpu_max_threads(const topos_backend *self) {
  (void)self;
  return POOL_MAX + 1; /* the pool's workers and the calling thread */
}

static const topos_backend cpu_backend = {
    .name = "cpu",
    .fidelity = TOPOS_FIDELITY_EXACT,
    .supports = cpu_supports,
    .run = cpu_run,
    .ctx = NULL,
    .tasks = (1u << TOPOS_TASK_GEMM) | (1u << TOPOS_TASK_WINDOW) |
             (1u << TOPOS_TASK_REDUCE) | (1u << TOPOS_TASK_MAP) |
             (1u << TOPOS_TASK_ATTENTION) | (1u << TOPOS_TASK_UNITS),
    .dtypes = (1u << TOPOS_F32) | (1u << TOPOS_F64) | (1u << TOPOS_BF16),
    .device = cpu_device,
    .max_threads = cpu_max_threads,
};

const topos_backend *topos_cpu_backend(void) {
  return &cpu_backend;
}
