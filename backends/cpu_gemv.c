/*
 * cpu_gemv.c - the `cpu` backend's one-row products: C[0, j] = fma chain
 * over k of A[0, k]·B[k, j], k in order from +0.0 (numerics.md), for
 * every j, without packing B.
 *
 * A one-token decoding step multiplies one row by every weight matrix of
 * the model once: the product is a read of B and nothing else.  The
 * packed GEMM (cpu.c) would copy all of B into panels before reading
 * them, twice B's traffic through the caches and most of the time.  Two
 * layouts read B where it lies:
 *
 *  - B row-major (b_col == 1, a weight stored [in, out]): the output row
 *    is kept in a block of at most GEMV_BLOCK accumulators (L1-resident:
 *    C itself when C is contiguous) and k advances over B's rows four at
 *    a time, each step streaming four row segments: per output the same
 *    chain acc = fma(a[k], b[k, j], acc), k = 0, 1, 2, ...;
 *  - B transposed (b_row == 1, a weight stored [out, in], or a tied
 *    embedding read as its transpose): output j's chain reads one
 *    contiguous row of B's storage.  On AVX-512 sixteen such rows are
 *    loaded sixteen k at a time, transposed in registers, and each column
 *    of the tile is one vector fma into sixteen outputs' chains - k still
 *    in order, one chain per lane; elsewhere scalar chains run four rows
 *    side by side.
 *
 * Threads split the outputs (column ranges, whole multiples of 16),
 * never one output's k range.  Every vector fma is vfmadd231 with the
 * broadcast A element first, the form fma_pinned.h pins: where several
 * operands are NaN the result is A's NaN, else B's, else acc's, as the
 * reference's.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_gemv.h"
#include "cpu_window.h"
#include "fma_pinned.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMV_X86 1
#include <immintrin.h>
#else
#define GEMV_X86 0
#endif

/* Accumulators per column block (8 KiB of f32: stays in L1). */
#define GEMV_BLOCK 2048

/* The smallest product (n·k per matrix) worth a second thread. */
#define GEMV_MIN_PARALLEL ((int64_t)1 << 20)

/* --------------------------------------------------- portable kernels */

static inline float f32_id(float x) {
  return x;
}
static inline double f64_id(double x) {
  return x;
}

/* acc[0..nb) = chains over k of a[k·acs]·b[k·ldb + j]; TI is the
 * operands' element type, widened exactly by SA to the compute type T. */
#define DEFINE_ROWS_C(T, TI, SA, FMA, SUF)                                     \
  static void rows_c_##SUF(int64_t K, const TI *a, int64_t acs, const TI *b,   \
                           int64_t ldb, T *acc, int64_t nb) {                  \
    for (int64_t j = 0; j < nb; j++) acc[j] = (T)0;                            \
    for (int64_t k = 0; k < K; k++) {                                          \
      T ak = SA(a[k * acs]);                                                   \
      const TI *bk = b + k * ldb;                                              \
      for (int64_t j = 0; j < nb; j++) acc[j] = FMA(ak, SA(bk[j]), acc[j]);    \
    }                                                                          \
  }                                                                            \
  /* c[r·ccs] = chain over k of a[k·acs]·bt[r·ldb + k], r in [0, nr). */   \
  static void trans_c_##SUF(int64_t K, const TI *a, int64_t acs, const TI *bt, \
                            int64_t ldb, T *c, int64_t ccs, int64_t nr) {      \
    for (int64_t r = 0; r < nr; r++) {                                         \
      const TI *row = bt + r * ldb;                                            \
      T acc = (T)0;                                                            \
      for (int64_t k = 0; k < K; k++)                                          \
        acc = FMA(SA(a[k * acs]), SA(row[k]), acc);                            \
      c[r * ccs] = acc;                                                        \
    }                                                                          \
  }
DEFINE_ROWS_C(float, float, f32_id, cpu_fmaf, f32)
DEFINE_ROWS_C(double, double, f64_id, cpu_fma, f64)
DEFINE_ROWS_C(float, uint16_t, cpu_bf16_widen, cpu_fmaf, bf16)

#if GEMV_X86

/* ------------------------------------------------------ SIMD kernels */

/* Sixteen (eight) bf16 bit patterns widened exactly to f32 lanes. */
__attribute__((target("avx512f"))) static inline __m512 ld512_bf16(
    const uint16_t *p) {
  __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2"))) static inline __m256 ld256_bf16(
    const uint16_t *p) {
  __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/*
 * The row-major kernel per ISA and operand type: four rows of B per pass
 * over the block (each output's four fmas in k order), whole vectors,
 * then the columns past the last whole vector with the pinned scalar
 * fma.  TI: the operands' element type, LDB its vector load (widening),
 * SA its scalar widening; T and V the compute type.
 */
#define DEFINE_ROWS_SIMD(NAME, TARGET, T, TI, V, W, ZERO, LD, ST, SET1, LDB,  \
                         SA, FMAV, FMAS)                                      \
  __attribute__((target(TARGET))) static void NAME(                           \
      int64_t K, const TI *a, int64_t acs, const TI *b, int64_t ldb, T *acc,  \
      int64_t nb) {                                                           \
    int64_t nv = nb / W * W;                                                  \
    for (int64_t j = 0; j < nv; j += W) ST(acc + j, ZERO());                  \
    for (int64_t j = nv; j < nb; j++) acc[j] = (T)0;                          \
    int64_t k = 0;                                                            \
    for (; k + 4 <= K; k += 4) {                                              \
      const TI *b0 = b + k * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb,             \
               *b3 = b2 + ldb;                                                \
      T s0 = SA(a[k * acs]), s1 = SA(a[(k + 1) * acs]),                       \
        s2 = SA(a[(k + 2) * acs]), s3 = SA(a[(k + 3) * acs]);                 \
      V a0 = SET1(s0), a1 = SET1(s1), a2 = SET1(s2), a3 = SET1(s3);           \
      for (int64_t j = 0; j < nv; j += W) {                                   \
        V v = LD(acc + j);                                                    \
        v = FMAV(a0, LDB(b0 + j), v);                                         \
        v = FMAV(a1, LDB(b1 + j), v);                                         \
        v = FMAV(a2, LDB(b2 + j), v);                                         \
        v = FMAV(a3, LDB(b3 + j), v);                                         \
        ST(acc + j, v);                                                       \
      }                                                                       \
      for (int64_t j = nv; j < nb; j++) {                                     \
        T v = acc[j];                                                         \
        v = FMAS(s0, SA(b0[j]), v);                                           \
        v = FMAS(s1, SA(b1[j]), v);                                           \
        v = FMAS(s2, SA(b2[j]), v);                                           \
        v = FMAS(s3, SA(b3[j]), v);                                           \
        acc[j] = v;                                                           \
      }                                                                       \
    }                                                                         \
    for (; k < K; k++) {                                                      \
      const TI *b0 = b + k * ldb;                                             \
      T s0 = SA(a[k * acs]);                                                  \
      V a0 = SET1(s0);                                                        \
      for (int64_t j = 0; j < nv; j += W)                                     \
        ST(acc + j, FMAV(a0, LDB(b0 + j), LD(acc + j)));                      \
      for (int64_t j = nv; j < nb; j++) acc[j] = FMAS(s0, SA(b0[j]), acc[j]); \
    }                                                                         \
  }

DEFINE_ROWS_SIMD(rows_512_f32, "avx512f,fma", float, float, __m512, 16,
                 _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                 _mm512_set1_ps, _mm512_loadu_ps, f32_id, fma231_ps512,
                 fma231_f32)
DEFINE_ROWS_SIMD(rows_512_f64, "avx512f,fma", double, double, __m512d, 8,
                 _mm512_setzero_pd, _mm512_loadu_pd, _mm512_storeu_pd,
                 _mm512_set1_pd, _mm512_loadu_pd, f64_id, fma231_pd512,
                 fma231_f64)
DEFINE_ROWS_SIMD(rows_512_bf16, "avx512f,fma", float, uint16_t, __m512, 16,
                 _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                 _mm512_set1_ps, ld512_bf16, cpu_bf16_widen, fma231_ps512,
                 fma231_f32)
DEFINE_ROWS_SIMD(rows_256_f32, "avx2,fma", float, float, __m256, 8,
                 _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                 _mm256_set1_ps, _mm256_loadu_ps, f32_id, fma231_ps256,
                 fma231_f32)
DEFINE_ROWS_SIMD(rows_256_f64, "avx2,fma", double, double, __m256d, 4,
                 _mm256_setzero_pd, _mm256_loadu_pd, _mm256_storeu_pd,
                 _mm256_set1_pd, _mm256_loadu_pd, f64_id, fma231_pd256,
                 fma231_f64)
DEFINE_ROWS_SIMD(rows_256_bf16, "avx2,fma", float, uint16_t, __m256, 8,
                 _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                 _mm256_set1_ps, ld256_bf16, cpu_bf16_widen, fma231_ps256,
                 fma231_f32)

/* Transposed B without the 16x16 tile: four outputs' scalar chains side
 * by side (four row streams), then one at a time. */
#define DEFINE_TRANS_SCALAR(NAME, TARGET, T, TI, SA, FMAS)                  \
  __attribute__((target(TARGET))) static void NAME(                         \
      int64_t K, const TI *a, int64_t acs, const TI *bt, int64_t ldb, T *c, \
      int64_t ccs, int64_t nr) {                                            \
    int64_t r = 0;                                                          \
    for (; r + 4 <= nr; r += 4) {                                           \
      const TI *p0 = bt + r * ldb, *p1 = p0 + ldb, *p2 = p1 + ldb,          \
               *p3 = p2 + ldb;                                              \
      T c0 = (T)0, c1 = (T)0, c2 = (T)0, c3 = (T)0;                         \
      for (int64_t k = 0; k < K; k++) {                                     \
        T ak = SA(a[k * acs]);                                              \
        c0 = FMAS(ak, SA(p0[k]), c0);                                       \
        c1 = FMAS(ak, SA(p1[k]), c1);                                       \
        c2 = FMAS(ak, SA(p2[k]), c2);                                       \
        c3 = FMAS(ak, SA(p3[k]), c3);                                       \
      }                                                                     \
      c[r * ccs] = c0;                                                      \
      c[(r + 1) * ccs] = c1;                                                \
      c[(r + 2) * ccs] = c2;                                                \
      c[(r + 3) * ccs] = c3;                                                \
    }                                                                       \
    for (; r < nr; r++) {                                                   \
      const TI *p0 = bt + r * ldb;                                          \
      T c0 = (T)0;                                                          \
      for (int64_t k = 0; k < K; k++)                                       \
        c0 = FMAS(SA(a[k * acs]), SA(p0[k]), c0);                           \
      c[r * ccs] = c0;                                                      \
    }                                                                       \
  }
DEFINE_TRANS_SCALAR(trans_fma_f32, "fma", float, float, f32_id, fma231_f32)
DEFINE_TRANS_SCALAR(trans_fma_f64, "fma", double, double, f64_id, fma231_f64)
DEFINE_TRANS_SCALAR(trans_fma_bf16, "fma", float, uint16_t, cpu_bf16_widen,
                    fma231_f32)

/* One row's sixteen elements from k0 (kt of them, the rest zero), as f32
 * lanes: the partial step of the tile loop. */
__attribute__((target("avx512f"))) static inline __m512 part_f32(const float *p,
                                                                 int kt) {
  return _mm512_maskz_loadu_ps((__mmask16)((1u << kt) - 1u), p);
}
__attribute__((target("avx512f"))) static inline __m512 part_bf16(
    const uint16_t *p, int kt) {
  uint16_t h[16] = {0};
  memcpy(h, p, (size_t)kt * sizeof *h);
  return ld512_bf16(h);
}

/* Transposed B, AVX-512: sixteen outputs per tile, sixteen k per step;
 * rows past nr load as zeros (their lanes are thrown away) and so do k
 * past K (they never reach an fma).  Whole tiles take the unrolled
 * path. */
/* How far ahead (elements) each row of a transposed tile is prefetched:
 * sixteen rows stream at once, more than the hardware prefetchers
 * follow. */
#define GEMV_PF 256
#define DEFINE_TRANS_512(NAME, TI, LDB, PART, SA)                             \
  __attribute__((target("avx512f,fma"))) static void NAME(                    \
      int64_t K, const TI *a, int64_t acs, const TI *bt, int64_t ldb,         \
      float *c, int64_t ccs, int64_t nr) {                                    \
    int64_t kfull = K / 16 * 16;                                              \
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {                                 \
      int rows = nr - r0 < 16 ? (int)(nr - r0) : 16;                          \
      const TI *base = bt + r0 * ldb;                                         \
      __m512 acc = _mm512_setzero_ps();                                       \
      __m512 r[16];                                                           \
      int64_t k0 = 0;                                                         \
      if (rows == 16)                                                         \
        for (; k0 < kfull; k0 += 16) {                                        \
          _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {             \
            _mm_prefetch((const char *)(base + i * ldb + k0 + GEMV_PF),       \
                         _MM_HINT_T0);                                        \
            r[i] = LDB(base + i * ldb + k0);                                  \
          }                                                                   \
          transpose16_ps(r);                                                  \
          _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) acc =         \
              fma231_ps512(_mm512_set1_ps(SA(a[(k0 + t) * acs])), r[t], acc); \
        }                                                                     \
      for (; k0 < K; k0 += 16) {                                              \
        int kt = K - k0 < 16 ? (int)(K - k0) : 16;                            \
        for (int i = 0; i < 16; i++)                                          \
          r[i] =                                                              \
              i < rows ? PART(base + i * ldb + k0, kt) : _mm512_setzero_ps(); \
        transpose16_ps(r);                                                    \
        for (int t = 0; t < kt; t++)                                          \
          acc =                                                               \
              fma231_ps512(_mm512_set1_ps(SA(a[(k0 + t) * acs])), r[t], acc); \
      }                                                                       \
      float out[16];                                                          \
      _mm512_storeu_ps(out, acc);                                             \
      for (int i = 0; i < rows; i++) c[(r0 + i) * ccs] = out[i];              \
    }                                                                         \
  }
DEFINE_TRANS_512(trans_512_f32, float, _mm512_loadu_ps, part_f32, f32_id)
DEFINE_TRANS_512(trans_512_bf16, uint16_t, ld512_bf16, part_bf16,
                 cpu_bf16_widen)

/* Packing a transposed B (each column contiguous in k) into the packed
 * GEMM's NR-wide panels, dst[(p·kc + k)·NR + j] (cpu.c): sixteen columns
 * by sixteen k through one register transpose instead of sixteen scalar
 * stores a cache line apart.  Columns past nc are zero; a copy, so no
 * bits change. */
#define DEFINE_PACK_BT_512(NAME, TI, LDB, PART)                                \
  __attribute__((target("avx512f"))) void NAME(                                \
      const TI *src, int64_t cs, int64_t kc, int64_t nc, int NR, float *dst) { \
    int64_t kfull = kc / 16 * 16;                                              \
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {                                  \
      float *d = dst + j0 * kc;                                                \
      for (int jj = 0; jj < NR; jj += 16) {                                    \
        int64_t left = nc - j0 - jj;                                           \
        int rows = left <= 0 ? 0 : left < 16 ? (int)left : 16;                 \
        const TI *s = src + (j0 + jj) * cs;                                    \
        __m512 r[16];                                                          \
        int64_t k0 = 0;                                                        \
        if (rows == 16)                                                        \
          for (; k0 < kfull; k0 += 16) {                                       \
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) r[i] =       \
                LDB(s + i * cs + k0);                                          \
            transpose16_ps(r);                                                 \
            _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++)              \
                _mm512_storeu_ps(d + (k0 + t) * NR + jj, r[t]);                \
          }                                                                    \
        for (; k0 < kc; k0 += 16) {                                            \
          int kt = kc - k0 < 16 ? (int)(kc - k0) : 16;                         \
          for (int i = 0; i < 16; i++)                                         \
            r[i] = i < rows ? PART(s + i * cs + k0, kt) : _mm512_setzero_ps(); \
          transpose16_ps(r);                                                   \
          for (int t = 0; t < kt; t++)                                         \
            _mm512_storeu_ps(d + (k0 + t) * NR + jj, r[t]);                    \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }
DEFINE_PACK_BT_512(cpu_pack_bt_512_f32, float, _mm512_loadu_ps, part_f32)
DEFINE_PACK_BT_512(cpu_pack_bt_512_bf16, uint16_t, ld512_bf16, part_bf16)

#endif /* GEMV_X86 */

/* ------------------------------------------------------------- driver */

typedef void (*rows_fn)(int64_t K, const void *a, int64_t acs, const void *b,
                        int64_t ldb, void *acc, int64_t nb);
typedef void (*trans_fn)(int64_t K, const void *a, int64_t acs, const void *bt,
                         int64_t ldb, void *c, int64_t ccs, int64_t nr);

typedef struct gemv_job {
  const topos_gemm_task *g;
  size_t ies;     /* bytes per A and B element (2 for bf16) */
  size_t es;      /* bytes per C element (the compute type) */
  rows_fn rows;   /* b_col == 1 */
  trans_fn trans; /* otherwise (b_row == 1) */
} gemv_job;

/* Thread tid's share of n outputs: whole multiples of 16. */
static void share(int64_t n, int tid, int T, int64_t *j0, int64_t *j1) {
  int64_t units = (n + 15) / 16;
  int64_t u0 = units * tid / T, u1 = units * (tid + 1) / T;
  *j0 = u0 * 16 < n ? u0 * 16 : n;
  *j1 = u1 * 16 < n ? u1 * 16 : n;
}

static void gemv_work(void *arg, int tid, int T) {
  const gemv_job *j = arg;
  const topos_gemm_task *g = j->g;
  const size_t es = j->es, ies = j->ies;
  int64_t j0, j1;
  share(g->n, tid, T, &j0, &j1);
  if (j0 >= j1) return;
  /* C's block when C is strided: 16 KiB covers GEMV_BLOCK of either
   * compute type. */
  double tmp[GEMV_BLOCK];
  for (int64_t bi = 0; bi < g->batch; bi++) {
    const char *A = (const char *)g->a + (size_t)(bi * g->a_batch) * ies;
    const char *B = (const char *)g->b + (size_t)(bi * g->b_batch) * ies;
    char *C = (char *)g->c + (size_t)(bi * g->c_batch) * es;
    if (!j->rows) {
      j->trans(g->k, A, g->a_col, B + (size_t)(j0 * g->b_col) * ies, g->b_col,
               C + (size_t)(j0 * g->c_col) * es, g->c_col, j1 - j0);
      continue;
    }
    for (int64_t x0 = j0; x0 < j1; x0 += GEMV_BLOCK) {
      int64_t nb = j1 - x0 < GEMV_BLOCK ? j1 - x0 : GEMV_BLOCK;
      char *cx = C + (size_t)(x0 * g->c_col) * es;
      void *acc = g->c_col == 1 ? (void *)cx : (void *)tmp;
      j->rows(g->k, A, g->a_col, B + (size_t)x0 * ies, g->b_row, acc, nb);
      if (g->c_col != 1)
        for (int64_t x = 0; x < nb; x++)
          memcpy(cx + (size_t)(x * g->c_col) * es, (char *)tmp + (size_t)x * es,
                 es);
    }
  }
}

bool cpu_gemv_applies(const topos_gemm_task *g) {
  return g->m == 1 && g->k >= 1 && g->n >= 1 &&
         (g->dtype == TOPOS_F32 || g->dtype == TOPOS_F64 ||
          g->dtype == TOPOS_BF16) &&
         (g->b_col == 1 || g->b_row == 1);
}

int cpu_gemv_run(const topos_gemm_task *g, int threads, int isa) {
  int d = g->dtype == TOPOS_F64 ? 1 : g->dtype == TOPOS_BF16 ? 2 : 0;
  static const rows_fn rows_c[3] = {(rows_fn)rows_c_f32, (rows_fn)rows_c_f64,
                                    (rows_fn)rows_c_bf16};
  static const trans_fn trans_c[3] = {
      (trans_fn)trans_c_f32, (trans_fn)trans_c_f64, (trans_fn)trans_c_bf16};
  gemv_job job = {.g = g,
                  .ies = d == 1   ? sizeof(double)
                         : d == 2 ? sizeof(uint16_t)
                                  : sizeof(float),
                  .es = d == 1 ? sizeof(double) : sizeof(float),
                  .rows = rows_c[d],
                  .trans = trans_c[d]};
#if GEMV_X86
  static const rows_fn rows_256[3] = {
      (rows_fn)rows_256_f32, (rows_fn)rows_256_f64, (rows_fn)rows_256_bf16};
  static const rows_fn rows_512[3] = {
      (rows_fn)rows_512_f32, (rows_fn)rows_512_f64, (rows_fn)rows_512_bf16};
  static const trans_fn trans_fma[3] = {(trans_fn)trans_fma_f32,
                                        (trans_fn)trans_fma_f64,
                                        (trans_fn)trans_fma_bf16};
  static const trans_fn trans_512[3] = {(trans_fn)trans_512_f32,
                                        (trans_fn)trans_fma_f64,
                                        (trans_fn)trans_512_bf16};
  if (isa >= CPU_GEMV_AVX2 && fma_pinned_available()) {
    job.rows = rows_256[d];
    job.trans = trans_fma[d];
  }
  if (isa >= CPU_GEMV_AVX512 && fma_pinned_available()) {
    job.rows = rows_512[d];
    job.trans = trans_512[d];
  }
#else
  (void)isa;
#endif
  if (g->b_col != 1) job.rows = NULL;
  double work = (double)g->n * (double)g->k * (double)g->batch;
  if (work < (double)GEMV_MIN_PARALLEL) threads = 1;
  if (threads > 1 && g->n > 16)
    cpu_parallel(threads, gemv_work, &job);
  else
    gemv_work(&job, 0, 1);
  return TOPOS_OK;
}
