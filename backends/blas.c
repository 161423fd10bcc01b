/*
 * blas.c - the `blas` backend (blas.h): OpenBLAS sgemm/dgemm under the
 * fast posture's envelope.
 */
#include "blas.h"

#include <cblas.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* How one operand (rows × cols, element strides rs and cs) is handed to
 * cblas in a given layout: transposed or not, and its leading dimension. */
typedef struct view {
  bool row_major, col_major; /* expressible as either */
  int64_t ld_row, ld_col;    /* the leading dimension for each */
} view;

/* A dimension of extent 1 may carry any stride: it is never stepped. */
static view view_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  view v = {0};
  v.row_major = (cols == 1 || cs == 1) && (rows == 1 || rs >= cols);
  v.ld_row = rows == 1 ? cols : rs;
  v.col_major = (rows == 1 || rs == 1) && (cols == 1 || cs >= rows);
  v.ld_col = cols == 1 ? rows : cs;
  return v;
}

/* The cblas call for one task: layout, transposes, leading dimensions. */
typedef struct call {
  CBLAS_LAYOUT layout;
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb, ldc;
} call;

/* How an operand reads in the chosen layout: as stored (NoTrans) when its
 * own layout matches, else transposed. */
static bool operand(const view *v, bool row_layout, CBLAS_TRANSPOSE *t,
                    int64_t *ld) {
  if (row_layout ? v->row_major : v->col_major) {
    *t = CblasNoTrans;
    *ld = row_layout ? v->ld_row : v->ld_col;
    return true;
  }
  if (row_layout ? v->col_major : v->row_major) {
    *t = CblasTrans;
    *ld = row_layout ? v->ld_col : v->ld_row;
    return true;
  }
  return false;
}

static bool fits_int(int64_t x) {
  return x >= 1 && x <= INT_MAX;
}

static bool plan_call(const topos_gemm_task *g, call *out) {
  view a = view_of(g->m, g->k, g->a_row, g->a_col);
  view b = view_of(g->k, g->n, g->b_row, g->b_col);
  view c = view_of(g->m, g->n, g->c_row, g->c_col);
  bool row_layout;
  if (c.row_major) {
    row_layout = true;
    out->ldc = c.ld_row;
  } else if (c.col_major) {
    row_layout = false;
    out->ldc = c.ld_col;
  } else {
    return false;
  }
  out->layout = row_layout ? CblasRowMajor : CblasColMajor;
  if (!operand(&a, row_layout, &out->ta, &out->lda)) return false;
  if (!operand(&b, row_layout, &out->tb, &out->ldb)) return false;
  return fits_int(out->lda) && fits_int(out->ldb) && fits_int(out->ldc);
}

static bool blas_supports(const topos_backend *self, const topos_task *task) {
  if (!task || task->kind != TOPOS_TASK_GEMM) return false;
  const topos_gemm_task *g = &task->u.gemm;
  if (g->dtype != TOPOS_F32 && g->dtype != TOPOS_F64) return false;
  if (!g->a || !g->b || !g->c || g->batch < 1) return false;
  if (!fits_int(g->m) || !fits_int(g->n) || !fits_int(g->k)) return false;
  /* m, n, k < 2^31 each: the product fits in double exactly enough. */
  if ((double)g->m * (double)g->n * (double)g->k < (double)TOPOS_BLAS_MIN_WORK)
    return false;
  if (g->dtype == TOPOS_F32 && g->k > TOPOS_BLAS_MAX_K_F32) return false;
  call c;
  return plan_call(g, &c);
}

/* Largest |x| over a rows × cols view; *nan set when one is NaN.  The
 * inner loop runs along the unit stride when there is one, in SSE2 where
 * the target has it: this scan is all the backend adds to OpenBLAS, and a
 * scalar max chain would cost as much as a 256³ sgemm on AVX-512. */
#define SCAN(NAME, R, ABS, VEC)                                     \
  static R NAME(const R *x, int64_t rows, int64_t cols, int64_t rs, \
                int64_t cs, bool *nan) {                            \
    if (cs != 1 && rs == 1) {                                       \
      int64_t t = rows;                                             \
      rows = cols;                                                  \
      cols = t;                                                     \
      rs = cs;                                                      \
      cs = 1;                                                       \
    }                                                               \
    R mx = 0;                                                       \
    bool bad = false;                                               \
    for (int64_t i = 0; i < rows; i++) {                            \
      const R *row = x + i * rs;                                    \
      int64_t j = 0;                                                \
      if (cs == 1) j = VEC(row, cols, &mx, &bad);                   \
      for (; j < cols; j++) {                                       \
        R v = row[j * cs];                                          \
        R av = ABS(v);                                              \
        mx = av > mx ? av : mx;                                     \
        bad |= v != v;                                              \
      }                                                             \
    }                                                               \
    *nan |= bad;                                                    \
    return mx;                                                      \
  }

/* The vector part of a contiguous row: returns how many elements it
 * covered (a multiple of the vector block; the caller does the rest). */
#if defined(__SSE2__)
static int64_t vec_f32(const float *x, int64_t n, float *mx, bool *nan) {
  const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 m0 = _mm_set1_ps(*mx), m1 = m0, bad = _mm_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + 4);
    bad =
        _mm_or_ps(bad, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
    m0 = _mm_max_ps(m0, _mm_and_ps(a, abs));
    m1 = _mm_max_ps(m1, _mm_and_ps(b, abs));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(m0, m1));
  for (int l = 0; l < 4; l++) *mx = lanes[l] > *mx ? lanes[l] : *mx;
  *nan |= _mm_movemask_ps(bad) != 0;
  return j;
}

static int64_t vec_f64(const double *x, int64_t n, double *mx, bool *nan) {
  const __m128d abs = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffLL));
  __m128d m0 = _mm_set1_pd(*mx), m1 = m0, bad = _mm_setzero_pd();
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    __m128d a = _mm_loadu_pd(x + j), b = _mm_loadu_pd(x + j + 2);
    bad =
        _mm_or_pd(bad, _mm_or_pd(_mm_cmpunord_pd(a, a), _mm_cmpunord_pd(b, b)));
    m0 = _mm_max_pd(m0, _mm_and_pd(a, abs));
    m1 = _mm_max_pd(m1, _mm_and_pd(b, abs));
  }
  double lanes[2];
  _mm_storeu_pd(lanes, _mm_max_pd(m0, m1));
  for (int l = 0; l < 2; l++) *mx = lanes[l] > *mx ? lanes[l] : *mx;
  *nan |= _mm_movemask_pd(bad) != 0;
  return j;
}
#else
static int64_t vec_f32(const float *x, int64_t n, float *mx, bool *nan) {
  return 0;
}
static int64_t vec_f64(const double *x, int64_t n, double *mx, bool *nan) {
  return 0;
}
#endif

SCAN(scan_f32, float, fabsf, vec_f32)
SCAN(scan_f64, double, fabs, vec_f64)
#undef SCAN

/* Whether every product and every partial sum, in any order, stays finite:
 * no NaN, and max|A|·max|B|·k well below the overflow threshold (the
 * factor 4 covers the rounding of k partial sums, k < 2^31). */
static bool values_ok(const topos_gemm_task *g) {
  bool nan = false;
  double ma = 0, mb = 0;
  for (int64_t bi = 0; bi < g->batch; bi++) {
    if (g->dtype == TOPOS_F32) {
      const float *a = (const float *)g->a + bi * g->a_batch;
      const float *b = (const float *)g->b + bi * g->b_batch;
      ma = fmax(ma, scan_f32(a, g->m, g->k, g->a_row, g->a_col, &nan));
      mb = fmax(mb, scan_f32(b, g->k, g->n, g->b_row, g->b_col, &nan));
    } else {
      const double *a = (const double *)g->a + bi * g->a_batch;
      const double *b = (const double *)g->b + bi * g->b_batch;
      ma = fmax(ma, scan_f64(a, g->m, g->k, g->a_row, g->a_col, &nan));
      mb = fmax(mb, scan_f64(b, g->k, g->n, g->b_row, g->b_col, &nan));
    }
  }
  if (nan) return false;
  double limit = (g->dtype == TOPOS_F32 ? (double)FLT_MAX : DBL_MAX) / 4;
  double bound = ma * mb * (double)g->k; /* Inf (never NaN) past DBL_MAX */
  return bound <= limit;
}

/* One matrix product, single-threaded in OpenBLAS (the caller holds the
 * lock and has set OpenBLAS to one thread). */
static void gemm_one(const topos_gemm_task *g) {
  call c;
  plan_call(g, &c); /* a block of an expressible task is expressible */
  int m = (int)g->m, n = (int)g->n, k = (int)g->k;
  int lda = (int)c.lda, ldb = (int)c.ldb, ldc = (int)c.ldc;
  if (g->dtype == TOPOS_F32)
    cblas_sgemm(c.layout, c.ta, c.tb, m, n, k, 1.0f, g->a, lda, g->b, ldb, 0.0f,
                g->c, ldc);
  else
    cblas_dgemm(c.layout, c.ta, c.tb, m, n, k, 1.0, g->a, lda, g->b, ldb, 0.0,
                g->c, ldc);
}

/* The work of one task: (batch, block) items, a block being a run of
 * rows of C (of columns when n > m): a quarter of them rounded up to a
 * multiple of 16, at least 64, so at most 4 blocks per matrix (each block
 * repacks the other operand, which costs more than it gains past that on
 * this 2-core machine).  The split depends on the shape only, and each
 * item is one single-threaded cblas call, so the bits do not depend on how
 * many threads take items: OpenBLAS's own threading does not have that
 * property (its sgemm's bits change with its thread count on the Prescott
 * and Haswell kernels). */
#define MIN_BLOCK 64
#define MAX_BLOCKS 4

static int64_t block_of(int64_t extent) {
  int64_t b = (extent + MAX_BLOCKS - 1) / MAX_BLOCKS;
  b = (b + 15) / 16 * 16;
  return b < MIN_BLOCK ? MIN_BLOCK : b;
}

typedef struct work {
  const topos_gemm_task *g;
  bool split_m;
  int64_t block, blocks, items;
  atomic_llong next;
} work;

static void do_item(const work *w, int64_t item) {
  const topos_gemm_task *g = w->g;
  size_t es = g->dtype == TOPOS_F32 ? sizeof(float) : sizeof(double);
  int64_t bi = item / w->blocks, start = (item % w->blocks) * w->block;
  int64_t extent = w->split_m ? g->m : g->n;
  int64_t len = extent - start < w->block ? extent - start : w->block;
  topos_gemm_task s = *g;
  s.batch = 1;
  s.a = (const char *)g->a + (ptrdiff_t)(bi * g->a_batch) * (ptrdiff_t)es;
  s.b = (const char *)g->b + (ptrdiff_t)(bi * g->b_batch) * (ptrdiff_t)es;
  s.c = (char *)g->c + (ptrdiff_t)(bi * g->c_batch) * (ptrdiff_t)es;
  if (w->split_m) {
    s.m = len;
    s.a = (const char *)s.a + (ptrdiff_t)(start * g->a_row) * (ptrdiff_t)es;
    s.c = (char *)s.c + (ptrdiff_t)(start * g->c_row) * (ptrdiff_t)es;
  } else {
    s.n = len;
    s.b = (const char *)s.b + (ptrdiff_t)(start * g->b_col) * (ptrdiff_t)es;
    s.c = (char *)s.c + (ptrdiff_t)(start * g->c_col) * (ptrdiff_t)es;
  }
  gemm_one(&s);
}

static void *worker(void *arg) {
  work *w = arg;
  for (;;) {
    int64_t item = atomic_fetch_add(&w->next, 1);
    if (item >= w->items) return NULL;
    do_item(w, item);
  }
}

#define MAX_THREADS 64

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

static int fail(topos_error *err, int code, const char *msg) {
  if (err) {
    err->code = code;
    snprintf(err->message, sizeof err->message, "blas: %s", msg);
  }
  return code;
}

static int blas_run(const topos_backend *self, const topos_task *task,
                    topos_error *err) {
  if (!blas_supports(self, task))
    return fail(err, TOPOS_ERR_ARGUMENT, "task not supported");
  const topos_gemm_task *g = &task->u.gemm;
  if (!values_ok(g))
    return fail(err, TOPOS_ERR_RANGE,
                "operands hold NaN/Inf or could overflow; the reference "
                "computes this task");
  work w = {.g = g, .split_m = g->m >= g->n};
  int64_t extent = w.split_m ? g->m : g->n;
  w.block = block_of(extent);
  w.blocks = (extent + w.block - 1) / w.block;
  w.items = g->batch * w.blocks;
  atomic_init(&w.next, 0);
  int64_t want = task->threads < 1 ? 1 : task->threads;
  if (want > w.items) want = w.items;
  if (want > MAX_THREADS) want = MAX_THREADS;

  pthread_mutex_lock(&blas_lock);
  int saved = openblas_get_num_threads();
  if (saved != 1) openblas_set_num_threads(1);
  pthread_t tid[MAX_THREADS];
  int started = 0;
  for (int64_t t = 1; t < want; t++) {
    if (pthread_create(&tid[started], NULL, worker, &w) != 0) break;
    started++;
  }
  worker(&w); /* the caller takes items too (all of them if none started) */
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  if (saved != 1) openblas_set_num_threads(saved);
  pthread_mutex_unlock(&blas_lock);
  return TOPOS_OK;
}

static void blas_device(const topos_backend *self, char *buf, size_t len) {
  (void)self;
  const char *core = openblas_get_corename();
  snprintf(buf, len, "host CPU, OpenBLAS (%s kernels)", core ? core : "?");
}

static int blas_max_threads(const topos_backend *self) {
  (void)self;
  return MAX_THREADS;
}

static const topos_backend blas_backend = {
    .name = "blas",
    .fidelity = TOPOS_FIDELITY_ENVELOPE,
    .supports = blas_supports,
    .run = blas_run,
    .ctx = NULL,
    .tasks = 1u << TOPOS_TASK_GEMM,
    .dtypes = (1u << TOPOS_F32) | (1u << TOPOS_F64),
    .device = blas_device,
    .max_threads = blas_max_threads,
};

const topos_backend *topos_blas_backend(void) {
  return &blas_backend;
}
