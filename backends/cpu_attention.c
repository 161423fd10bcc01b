/*
 * cpu_attention.c - the `cpu` backend's attention chain (plans' fused
 * attention groups, TOPOS_TASK_ATTENTION), exact fidelity.
 *
 * backend.h states the contract: per query row, one row of scores (an
 * fma chain over the head features per key, from +0.0), the scale and
 * the mask applied elementwise, the row's log_softmax, its exp, and one
 * row of output (an fma chain over the keys per feature, from +0.0).
 * The reference runs those as separate nodes, materialising [B·H, T, S]
 * three to five times; here a query row's scores never leave a thread's
 * scratch unless the plan keeps them for backward.
 *
 * Bits: every output and every written row element is computed by the
 * same IEEE operations in the same order as the reference kernels:
 *  - the two products keep one accumulator per output and run its chain
 *    in order; four query rows share each key/value load, with eight (or
 *    four) accumulators per row in registers (cpu_attention_real.h),
 *    vectorised across outputs, never within one chain, and the fused
 *    multiply-add's form pinned so NaNs propagate as the reference's do;
 *  - scale and mask are one multiply / one add per element, row first;
 *  - log_softmax is lse_rows' sequence: the first-NaN maximum, the
 *    subtraction, exp, the striped-16 sum with its adds pinned (cpu_reduce
 *    .c), log, and the two subtractions;
 *  - exp and log are libm's: f32 exp through cpu_math (bit-identical to
 *    libm by its self-check, else libm itself), f64 by libm per element.
 * Threads split whole query rows, so the bits do not depend on the count.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "cpu_attention.h"
#include "cpu_math.h"
#include "cpu_reduce.h"
#include "cpu_window.h"
#include "fma_pinned.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATT_X86 1
#include <immintrin.h>
#else
#define ATT_X86 0
#endif

/* Rows per thread below which one thread does the whole task. */
#define ATT_MIN_PARALLEL_MACS ((int64_t)1 << 18)
/* The largest key count taken: a thread's scratch is 5·S values. */
#define ATT_MAX_KEYS ((int64_t)1 << 24)
/* Query rows that share each key and value load. */
#define ATT_ROWS 4

static void exp_f32(float *x, int64_t n) {
  cpu_math_f32(CPU_MATH_EXP, x, x, n);
}

static void exp_f64(double *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = exp(x[i]);
}

/* Portable builds: libm's fma. */
#define ATT_TARGET
#define R float
#define A(name) name##_f32_c
#define AFMA fmaf
#define AEXP exp_f32
#define ALOG logf
#define ASUM cpu_reduce_sum_f32
#include "cpu_attention_real.h"

#define ATT_TARGET
#define R double
#define A(name) name##_f64_c
#define AFMA fma
#define AEXP exp_f64
#define ALOG log
#define ASUM cpu_reduce_sum_f64
#include "cpu_attention_real.h"

#if ATT_X86
/*
 * FMA builds.  A fused multiply-add that meets NaNs returns one of them,
 * and which one depends on the instruction form: pinned to vfmadd231
 * (acc = a·b + acc) it is a's, else b's, else acc's, as the reference's
 * (fma_pinned.h; the tests' NaN inputs check it).  The template derives the
 * vector operations from AP, the intrinsics' suffix, and APS, the
 * instructions'.
 */
#define ATT_TARGET __attribute__((target("fma")))
#define ATT_VEC 1
#define R float
#define A(name) name##_f32_fma
#define AFMA fma231_f32
#define AEXP exp_f32
#define ALOG logf
#define ASUM cpu_reduce_sum_f32
#define AW 8
#define AV __m256
#define AP ps
#define APS "ps"
#include "cpu_attention_real.h"

#define ATT_TARGET __attribute__((target("fma")))
#define ATT_VEC 1
#define R double
#define A(name) name##_f64_fma
#define AFMA fma231_f64
#define AEXP exp_f64
#define ALOG log
#define ASUM cpu_reduce_sum_f64
#define AW 4
#define AV __m256d
#define AP pd
#define APS "pd"
#include "cpu_attention_real.h"
#endif

/* The FMA build when the CPU has FMA and the backend's microkernels are
 * not forced to portable C (topos_cpu_force_isa("c"), for tests). */
static bool vector_ok(void) {
#if ATT_X86
  return fma_pinned_available() && strcmp(topos_cpu_isa(), "c") != 0;
#else
  return false;
#endif
}

static void rows_f32(const topos_attention_task *t, int64_t b, int64_t i0,
                     int nr, void *acc, void *tmp) {
#if ATT_X86
  if (vector_ok()) {
    rows_f32_fma(t, b, i0, nr, acc, tmp);
    return;
  }
#endif
  rows_f32_c(t, b, i0, nr, acc, tmp);
}

static void rows_f64(const topos_attention_task *t, int64_t b, int64_t i0,
                     int nr, void *acc, void *tmp) {
#if ATT_X86
  if (vector_ok()) {
    rows_f64_fma(t, b, i0, nr, acc, tmp);
    return;
  }
#endif
  rows_f64_c(t, b, i0, nr, acc, tmp);
}

static atomic_ullong attention_tasks;

unsigned long long topos_cpu_attention_tasks_run(void) {
  return atomic_load(&attention_tasks);
}

static bool mul_ok(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_mul_overflow(a, b, r);
}

bool cpu_attention_supports(const topos_attention_task *t) {
  if (t->dtype != TOPOS_F32 && t->dtype != TOPOS_F64) return false;
  if (t->batch < 1 || t->t < 1 || t->s < 1 || t->dh < 1 || t->dv < 1)
    return false;
  if (!t->q || !t->k || !t->v || !t->out) return false;
  int64_t rows, cells;
  return t->s <= ATT_MAX_KEYS && mul_ok(t->batch, t->t, &rows) &&
         mul_ok(rows, t->s, &cells) && mul_ok(rows, t->dv, &cells);
}

typedef struct att_job {
  const topos_attention_task *t;
  int64_t blocks_per_matrix, blocks;
  atomic_bool failed;
} att_job;

static void att_share(void *arg, int tid, int T) {
  att_job *j = arg;
  const topos_attention_task *t = j->t;
  int64_t u0 = j->blocks * tid / T, u1 = j->blocks * (tid + 1) / T;
  if (u0 >= u1) return;
  size_t es = t->dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  void *scratch = malloc(es * (size_t)t->s * (ATT_ROWS + 1));
  if (!scratch) {
    atomic_store(&j->failed, true);
    return;
  }
  for (int64_t u = u0; u < u1; u++) {
    int64_t b = u / j->blocks_per_matrix;
    int64_t i0 = u % j->blocks_per_matrix * ATT_ROWS;
    int nr = (int)(t->t - i0 < ATT_ROWS ? t->t - i0 : ATT_ROWS);
    if (t->dtype == TOPOS_F64) {
      double *acc = scratch;
      rows_f64(t, b, i0, nr, acc, acc + ATT_ROWS * t->s);
    } else {
      float *acc = scratch;
      rows_f32(t, b, i0, nr, acc, acc + ATT_ROWS * t->s);
    }
  }
  free(scratch);
}

int cpu_attention_run(const topos_attention_task *t, int threads) {
  if (!cpu_attention_supports(t)) return TOPOS_ERR_ARGUMENT;
  att_job j = {.t = t};
  j.blocks_per_matrix = (t->t + ATT_ROWS - 1) / ATT_ROWS;
  j.blocks = t->batch * j.blocks_per_matrix;
  atomic_init(&j.failed, false);
  double macs =
      (double)t->batch * (double)t->t * (double)t->s * (double)(t->dh + t->dv);
  int T = threads > 0 ? threads : 1;
  if (macs < (double)ATT_MIN_PARALLEL_MACS * T)
    T = (int)(macs / (double)ATT_MIN_PARALLEL_MACS) + 1;
  if (T > j.blocks) T = (int)j.blocks;
  if (T > threads) T = threads > 0 ? threads : 1;
  if (T <= 1)
    att_share(&j, 0, 1);
  else
    cpu_parallel(T, att_share, &j);
  if (atomic_load(&j.failed)) return TOPOS_ERR_MEMORY;
  atomic_fetch_add_explicit(&attention_tasks, 1, memory_order_relaxed);
  return TOPOS_OK;
}
