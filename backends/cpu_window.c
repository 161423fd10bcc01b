/*
 * cpu_window.c - the `cpu` backend's windowed product: the fused
 * convolution of plans (TOPOS_TASK_WINDOW), exact fidelity.
 *
 * The reference (kernels_real.h, conv_window) computes each output
 * out[r, o], r = (n, oi, oj), as one fma chain over kk = (c, a, b) in
 * that order from +0.0: acc = fma(xval(r, kk), w[kk, o], acc), where
 * xval is the input under the window or 0 at a padded position (still
 * fma'd).  That is a GEMM whose A operand is the im2col matrix: row r,
 * column kk.  So this file never materialises im2col; it builds A's
 * micro-panels on the fly, MR rows x KC columns at a time, into the
 * layout cpu.c's packed microkernels read ([k][MR], rows past the last
 * zero), packs the weight once per task into NR-wide zero-padded panels,
 * and runs cpu.c's microkernels over them: lane j of row i's accumulator
 * is output (r_i, o_j)'s own chain.  k blocks of KC are stored and
 * reloaded between blocks (the same chain, since a stored value is the
 * register value); threads split the rows, never one output's chain.
 * The bits therefore equal the reference's for every input, thread count
 * and ISA.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu_window.h"
#include "fma_pinned.h"

/* The smallest product split across threads (smaller runs on the caller). */
#define WIN_MIN_PARALLEL_WORK ((int64_t)128 * 128 * 64)
/* The largest packed weight taken (bytes); bigger goes to the reference. */
#define WIN_MAX_WEIGHT_BYTES ((int64_t)1 << 28)

typedef struct win_job {
  const topos_window_task *t;
  cpu_kernels k;
  size_t es;
  int64_t K;     /* c·kh·kw */
  int64_t rows;  /* n·oh·ow */
  int64_t npan;  /* NR-wide panels over o */
  int64_t units; /* MR-row panels over rows */
  char *bpack;   /* the weight: per k block at p0, panel q: [kc][NR] */
  int64_t *koff; /* per kk: offset of x[c, a·dil_h, b·dil_w] from x[0,0,0] */
  int64_t *kdh;  /* per kk: a·dil_h */
  int64_t *kdw;  /* per kk: b·dil_w */
  char *abufs;   /* per thread: an A micro-panel (MR x KC) and a C tile */
  size_t abytes; /* bytes per thread in abufs */
} win_job;

/* Packs rows [ir, ir + mr) x kk [p0, p0 + kc) of the im2col matrix into
 * dst[k·MR + i]; rows mr..MR are zero. */
#define DEFINE_PACK_A(T, SUF)                                                  \
  static void pack_a_##SUF(const win_job *j, int64_t ir, int64_t mr,           \
                           int64_t p0, int64_t kc, T *dst) {                   \
    const topos_window_task *t = j->t;                                         \
    const int MR = j->k.mr;                                                    \
    const T *x = t->x;                                                         \
    const int64_t ohw = t->oh * t->ow, chw = t->c * t->h * t->w;               \
    const int64_t *koff = j->koff + p0, *kdh = j->kdh + p0,                    \
                  *kdw = j->kdw + p0;                                          \
    const int64_t W = t->w, sw = t->stride_w;                                  \
    /* Runs of rows in one output row (same n, oi): consecutive oj, so         \
     * for each kk their inputs lie on one strided line of x. */               \
    int64_t rs[16], re[16], rbase[16], rh0[16], rv0[16];                       \
    int nruns = 0;                                                             \
    for (int64_t i = 0; i < mr;) {                                             \
      int64_t r = ir + i, n = r / ohw, rem = r % ohw;                          \
      int64_t oi = rem / t->ow, oj = rem % t->ow;                              \
      int64_t len = t->ow - oj < mr - i ? t->ow - oj : mr - i;                 \
      rs[nruns] = i;                                                           \
      re[nruns] = i + len;                                                     \
      rh0[nruns] = oi * t->stride_h - t->pad_top;                              \
      rv0[nruns] = oj * sw - t->pad_left;                                      \
      rbase[nruns] = n * chw + rh0[nruns] * W + rv0[nruns];                    \
      nruns++;                                                                 \
      i += len;                                                                \
    }                                                                          \
    for (int64_t k = 0; k < kc; k++) {                                         \
      T *d = dst + k * MR;                                                     \
      for (int q = 0; q < nruns; q++) {                                        \
        int64_t len = re[q] - rs[q];                                           \
        T *dq = d + rs[q];                                                     \
        int64_t h = rh0[q] + kdh[k];                                           \
        if ((uint64_t)h >= (uint64_t)t->h) {                                   \
          for (int64_t u = 0; u < len; u++) dq[u] = (T)0;                      \
          continue;                                                            \
        }                                                                      \
        /* Row u reads column v + u·sw: valid for lo <= u < hi. */            \
        int64_t v = rv0[q] + kdw[k];                                           \
        int64_t lo, hi;                                                        \
        if (sw == 1) {                                                         \
          lo = v >= 0 ? 0 : -v;                                                \
          hi = W - v;                                                          \
        } else {                                                               \
          lo = v >= 0 ? 0 : (-v + sw - 1) / sw;                                \
          hi = v < W ? (W - 1 - v) / sw + 1 : 0;                               \
        }                                                                      \
        if (hi > len) hi = len;                                                \
        if (lo > hi) lo = hi;                                                  \
        int64_t s0 = rbase[q] + koff[k];                                       \
        int64_t u = 0;                                                         \
        for (; u < lo; u++) dq[u] = (T)0;                                      \
        if (sw == 1)                                                           \
          for (; u < hi; u++) dq[u] = x[s0 + u];                               \
        else                                                                   \
          for (; u < hi; u++) dq[u] = x[s0 + u * sw];                          \
        for (; u < len; u++) dq[u] = (T)0;                                     \
      }                                                                        \
    }                                                                          \
    for (int64_t i = mr; i < MR; i++)                                          \
      for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = (T)0;                 \
  }                                                                            \
  /* The weight's rows [p0, p0 + kc) into NR-wide panels, columns past o       \
   * zero. */                                                                  \
  static void pack_w_##SUF(const win_job *j, int64_t p0, int64_t kc, T *dst) { \
    const topos_window_task *t = j->t;                                         \
    const int NR = j->k.nr;                                                    \
    const T *w = t->weight;                                                    \
    for (int64_t q = 0; q < j->npan; q++) {                                    \
      int64_t c0 = q * NR;                                                     \
      int64_t nr = t->o - c0 < NR ? t->o - c0 : NR;                            \
      T *d = dst + q * kc * NR;                                                \
      for (int64_t k = 0; k < kc; k++) {                                       \
        const T *s = w + (p0 + k) * t->w_row + c0 * t->w_col;                  \
        int64_t jx = 0;                                                        \
        for (; jx < nr; jx++) d[k * NR + jx] = s[jx * t->w_col];               \
        for (; jx < NR; jx++) d[k * NR + jx] = (T)0;                           \
      }                                                                        \
    }                                                                          \
  }
DEFINE_PACK_A(float, f32)
DEFINE_PACK_A(double, f64)

static void win_work(void *arg, int tid, int T) {
  win_job *j = arg;
  const topos_window_task *t = j->t;
  const size_t es = j->es;
  const int MR = j->k.mr, NR = j->k.nr;
  const int64_t KC = j->k.kc, O = t->o;
  char *apack = j->abufs + (size_t)tid * j->abytes;
  char *tile = apack + (size_t)(MR * KC) * es;
  char *out = t->out;
  /* A contiguous share of the row panels: neighbouring rows read
   * neighbouring input. */
  int64_t ua = j->units * tid / T, ub = j->units * (tid + 1) / T;
  for (int64_t u = ua; u < ub; u++) {
    int64_t ir = u * MR;
    int64_t mr = j->rows - ir < MR ? j->rows - ir : MR;
    cpu_kern_fn kern = j->k.kern[mr];
    for (int64_t p0 = 0; p0 < j->K; p0 += KC) {
      int64_t kc = j->K - p0 < KC ? j->K - p0 : KC;
      int first = p0 == 0;
      if (t->dtype == TOPOS_F64)
        pack_a_f64(j, ir, mr, p0, kc, (double *)apack);
      else
        pack_a_f32(j, ir, mr, p0, kc, (float *)apack);
      const char *bblock = j->bpack + (size_t)(p0 * j->npan * NR) * es;
      for (int64_t q = 0; q < j->npan; q++) {
        int64_t jj = q * NR;
        int64_t nr = O - jj < NR ? O - jj : NR;
        const char *bp = bblock + (size_t)(q * kc * NR) * es;
        char *cp = out + (size_t)(ir * O + jj) * es;
        if (nr == NR) {
          kern(kc, apack, bp, cp, O, first);
          continue;
        }
        /* A partial tile goes through a contiguous one. */
        if (!first)
          for (int64_t i = 0; i < mr; i++)
            memcpy(tile + (size_t)(i * NR) * es, cp + (size_t)(i * O) * es,
                   (size_t)nr * es);
        kern(kc, apack, bp, tile, NR, first);
        for (int64_t i = 0; i < mr; i++)
          memcpy(cp + (size_t)(i * O) * es, tile + (size_t)(i * NR) * es,
                 (size_t)nr * es);
      }
    }
  }
}

/* ------------------------------------------- the direct path, small O */

/*
 * With few outputs per row (o <= 16: a LeNet's first layers) packing
 * im2col panels costs more than the product.  For f32 with unit column
 * stride on AVX-512 the rows are vectorised instead: 16 neighbouring
 * output columns (oj) of one output row (n, oi) are the lanes, one
 * accumulator per o, and for each kk = (c, a, b) in order one masked
 * load of x's row (lanes outside x read 0, as the reference's padding)
 * and one vfmadd231 per o with the x lanes first: lane l of acc[o] is
 * output (n, oi, oj0 + l, o)'s chain, the same fmas in the same order.
 */
#if FMA_PINNED_X86
#define WIN_DIRECT 1
#define DIRECT_MAX_O 16

typedef struct direct_job {
  const topos_window_task *t;
  const float *wp; /* [K][no]: the weight, columns past o zero */
  int no;
  int64_t K, units;            /* units: output rows (n, oi) */
  const int64_t *kc, *ka, *kb; /* per kk: c, a·dil_h, b·dil_w */
} direct_job;

__attribute__((target("avx512f"), always_inline)) static inline void direct_row(
    const direct_job *j, const int NO, int64_t u) {
  const topos_window_task *t = j->t;
  const float *x = t->x;
  float *out = t->out;
  int64_t n = u / t->oh, oi = u % t->oh, O = t->o, W = t->w;
  for (int64_t oj0 = 0; oj0 < t->ow; oj0 += 16) {
    __m512 acc[DIRECT_MAX_O];
#pragma GCC unroll 16
    for (int o = 0; o < NO; o++) acc[o] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < j->K; kk++) {
      int64_t h = oi * t->stride_h + j->ka[kk] - t->pad_top;
      int64_t v0 = oj0 + j->kb[kk] - t->pad_left;
      __mmask16 m = 0;
      if (h >= 0 && h < t->h) {
        int64_t lo = v0 < 0 ? -v0 : 0, hi = W - v0;
        if (hi > 16) hi = 16;
        if (lo < hi) m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
      }
      const float *row = x + ((n * t->c + j->kc[kk]) * t->h + h) * W;
      __m512 xv = m ? _mm512_maskz_loadu_ps(m, row + v0) : _mm512_setzero_ps();
      const float *w = j->wp + kk * NO;
#pragma GCC unroll 16
      for (int o = 0; o < NO; o++)
        acc[o] = fma231_ps512(xv, _mm512_set1_ps(w[o]), acc[o]);
    }
    float tile[DIRECT_MAX_O][16];
#pragma GCC unroll 16
    for (int o = 0; o < NO; o++) _mm512_storeu_ps(tile[o], acc[o]);
    int64_t lanes = t->ow - oj0 < 16 ? t->ow - oj0 : 16;
    float *dst = out + (u * t->ow + oj0) * O;
    for (int64_t l = 0; l < lanes; l++)
      for (int64_t o = 0; o < O; o++) dst[l * O + o] = tile[o][l];
  }
}

__attribute__((target("avx512f"))) static void direct_work(void *arg, int tid,
                                                           int T) {
  const direct_job *j = arg;
  int64_t ua = j->units * tid / T, ub = j->units * (tid + 1) / T;
  for (int64_t u = ua; u < ub; u++) {
    if (j->no == 4)
      direct_row(j, 4, u);
    else if (j->no == 8)
      direct_row(j, 8, u);
    else
      direct_row(j, 16, u);
  }
}

static bool direct_applies(const topos_window_task *t) {
  return t->dtype == TOPOS_F32 && t->o <= DIRECT_MAX_O && t->stride_w == 1 &&
         strcmp(topos_cpu_isa(), "avx512") == 0;
}

static int direct_run(const topos_window_task *t, int64_t K, int64_t work,
                      int threads) {
  direct_job j = {.t = t, .K = K, .units = t->n * t->oh};
  j.no = t->o <= 4 ? 4 : t->o <= 8 ? 8 : 16;
  float *wp = calloc((size_t)(K * j.no), sizeof(float));
  int64_t *tabs = malloc(sizeof(int64_t) * (size_t)(3 * K));
  if (!wp || !tabs) {
    free(wp);
    free(tabs);
    return TOPOS_ERR_MEMORY;
  }
  const float *w = t->weight;
  for (int64_t kk = 0; kk < K; kk++)
    for (int64_t o = 0; o < t->o; o++)
      wp[kk * j.no + o] = w[kk * t->w_row + o * t->w_col];
  int64_t kk = 0;
  for (int64_t c = 0; c < t->c; c++)
    for (int64_t a = 0; a < t->kh; a++)
      for (int64_t b = 0; b < t->kw; b++, kk++) {
        tabs[kk] = c;
        tabs[K + kk] = a * t->dil_h;
        tabs[2 * K + kk] = b * t->dil_w;
      }
  j.wp = wp;
  j.kc = tabs;
  j.ka = tabs + K;
  j.kb = tabs + 2 * K;
  if (threads < 1 || work < WIN_MIN_PARALLEL_WORK) threads = 1;
  if (threads > j.units) threads = (int)j.units;
  cpu_parallel(threads, direct_work, &j);
  free(wp);
  free(tabs);
  return TOPOS_OK;
}
#else
#define WIN_DIRECT 0
#endif

/* Sizes that fit: every extent positive, products within int64, the
 * packed weight within WIN_MAX_WEIGHT_BYTES. */
static bool win_sizes(const topos_window_task *t, int64_t *rows, int64_t *K,
                      int64_t *work) {
  if (t->n < 1 || t->c < 1 || t->h < 1 || t->w < 1 || t->o < 1 || t->kh < 1 ||
      t->kw < 1 || t->oh < 1 || t->ow < 1 || t->stride_h < 1 ||
      t->stride_w < 1 || t->dil_h < 1 || t->dil_w < 1)
    return false;
  if (!t->x || !t->weight || !t->out) return false;
  int64_t a, b, chw;
  if (__builtin_mul_overflow(t->n, t->oh, &a) ||
      __builtin_mul_overflow(a, t->ow, rows))
    return false;
  if (__builtin_mul_overflow(t->c, t->kh, &a) ||
      __builtin_mul_overflow(a, t->kw, K))
    return false;
  if (__builtin_mul_overflow(t->c, t->h, &a) ||
      __builtin_mul_overflow(a, t->w, &chw) ||
      __builtin_mul_overflow(chw, t->n, &b))
    return false;
  if (__builtin_mul_overflow(*rows, *K, &a) ||
      __builtin_mul_overflow(a, t->o, work) ||
      __builtin_mul_overflow(*rows, t->o, &b))
    return false;
  int64_t wbytes;
  if (__builtin_mul_overflow(*K, t->o + 64, &a) ||
      __builtin_mul_overflow(a, (int64_t)sizeof(double), &wbytes) ||
      wbytes > WIN_MAX_WEIGHT_BYTES)
    return false;
  return true;
}

bool cpu_window_supports(const topos_window_task *t) {
  if (t->dtype != TOPOS_F32 && t->dtype != TOPOS_F64) return false;
  int64_t rows, K, work;
  return win_sizes(t, &rows, &K, &work);
}

int cpu_window_run(const topos_window_task *t, int threads) {
  if (t->dtype != TOPOS_F32 && t->dtype != TOPOS_F64) return TOPOS_ERR_DTYPE;
  int64_t rows, K, work;
  if (!win_sizes(t, &rows, &K, &work)) return TOPOS_ERR_ARGUMENT;
#if WIN_DIRECT
  if (direct_applies(t)) return direct_run(t, K, work, threads);
#endif
  win_job j = {.t = t, .K = K, .rows = rows};
  cpu_gemm_kernels(t->dtype, &j.k);
  j.es = t->dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  const int MR = j.k.mr, NR = j.k.nr;
  const int64_t KC = j.k.kc;
  j.npan = (t->o + NR - 1) / NR;
  j.units = (rows + MR - 1) / MR;
  if (threads < 1 || work < WIN_MIN_PARALLEL_WORK) threads = 1;
  if (threads > j.units) threads = (int)j.units;
  size_t bbytes = (size_t)(K * j.npan * NR) * j.es;
  bbytes = (bbytes + 63) / 64 * 64;
  size_t tbytes = (size_t)(3 * K) * sizeof(int64_t);
  tbytes = (tbytes + 63) / 64 * 64;
  j.abytes = (size_t)(MR * KC + MR * NR) * j.es;
  j.abytes = (j.abytes + 63) / 64 * 64;
  void *buf = NULL;
  if (posix_memalign(&buf, 64, bbytes + tbytes + j.abytes * (size_t)threads))
    return TOPOS_ERR_MEMORY;
  j.bpack = buf;
  j.koff = (int64_t *)((char *)buf + bbytes);
  j.kdh = j.koff + K;
  j.kdw = j.kdh + K;
  j.abufs = (char *)buf + bbytes + tbytes;
  /* kk = (c, a, b) in the reference's order. */
  int64_t kk = 0;
  for (int64_t c = 0; c < t->c; c++)
    for (int64_t a = 0; a < t->kh; a++)
      for (int64_t b = 0; b < t->kw; b++, kk++) {
        j.kdh[kk] = a * t->dil_h;
        j.kdw[kk] = b * t->dil_w;
        j.koff[kk] = (c * t->h + j.kdh[kk]) * t->w + j.kdw[kk];
      }
  for (int64_t p0 = 0; p0 < K; p0 += KC) {
    int64_t kc = K - p0 < KC ? K - p0 : KC;
    char *dst = j.bpack + (size_t)(p0 * j.npan * NR) * j.es;
    if (t->dtype == TOPOS_F64)
      pack_w_f64(&j, p0, kc, (double *)dst);
    else
      pack_w_f32(&j, p0, kc, (float *)dst);
  }
  cpu_parallel(threads, win_work, &j);
  free(buf);
  return TOPOS_OK;
}

/* ------------------------------------------------- units of engine work */

typedef struct units_job {
  const topos_units_task *t;
  atomic_llong next;
} units_job;

/* Each thread takes the next unit until none is left: units differ in
 * size (a last short block), so they are handed out, not split. */
static void units_work(void *arg, int tid, int T) {
  (void)T;
  units_job *j = arg;
  for (;;) {
    int64_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (u >= j->t->units) return;
    j->t->fn(j->t->arg, u, tid);
  }
}

void cpu_units_run(const topos_units_task *t, int threads) {
  units_job j = {.t = t};
  atomic_init(&j.next, 0);
  int T = threads < t->units ? threads : (int)t->units;
  cpu_parallel(T > 0 ? T : 1, units_work, &j);
}
