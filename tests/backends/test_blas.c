/*
 * test_blas.c - the `blas` backend (backends/blas.h) against the fast
 * posture's envelope (numerics.md): its run() is called directly on
 * random operands of many shapes and layouts and compared with this
 * file's own reference, an fma chain over k in order from +0.0:
 * ‖out − ref‖₂/‖ref‖₂ ≤ 1e-5 (f32), ≤ 1e-12 (f64) per matrix, NaN and
 * Inf exactly where the reference has them, padding never written.
 * supports() must decline what cblas cannot express, and an `exact` plan
 * must never reach the backend.
 *
 * TOPOS_BLAS_REPORT=1 prints the worst relative error of each case.
 */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "topos.h"

#define ENVELOPE_F32 1e-5
#define ENVELOPE_F64 1e-12
#define SENTINEL 7777.0

/* ------------------------------------------------------------ operands */

static double uniform(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return (double)(x >> 11) / 9007199254740992.0;
}

typedef enum fill_kind {
  FILL_SIGNED = 0, /* uniform [-1, 1): cancellation */
  FILL_POSITIVE,   /* uniform [0, 1) */
  FILL_WIDE        /* signed, magnitudes spread over 2^-12 .. 2^12 */
} fill_kind;

static double draw(uint64_t *s, fill_kind kind) {
  double u = uniform(s);
  switch (kind) {
    case FILL_SIGNED:
      return 2 * u - 1;
    case FILL_POSITIVE:
      return u;
    case FILL_WIDE:
      return (uniform(s) < 0.5 ? -1 : 1) *
             ldexp(0.5 + u / 2, (int)(uniform(s) * 25) - 12);
  }
  return 0;
}

/* One GEMM case: each operand either stored as its logical layout
 * (row-major, unit column stride) or transposed (unit row stride), with
 * `pad` extra elements per leading dimension and between batches. */
typedef struct gcase {
  topos_dtype dtype;
  int64_t batch, m, n, k;
  bool ta, tb, tc;
  int64_t pad;
  fill_kind fill;
} gcase;

/* An operand's storage: strides and the element count to allocate. */
typedef struct store {
  int64_t row, col, batch, size;
} store;

static store store_of(int64_t rows, int64_t cols, bool trans, int64_t pad,
                      int64_t batch) {
  store s;
  if (!trans) {
    s.row = cols + pad;
    s.col = 1;
    s.batch = rows * s.row + 3 * pad;
  } else {
    s.row = 1;
    s.col = rows + pad;
    s.batch = cols * s.col + 3 * pad;
  }
  s.size = batch * s.batch;
  return s;
}

typedef struct gemm_buf {
  topos_task task;
  void *a, *b, *c;
  double *ref; /* batch × m × n, the reference, widened */
  size_t es;
  store sc;
} gemm_buf;

static double get(const void *p, topos_dtype dt, int64_t i) {
  return dt == TOPOS_F32 ? (double)((const float *)p)[i]
                         : ((const double *)p)[i];
}

static void set(void *p, topos_dtype dt, int64_t i, double v) {
  if (dt == TOPOS_F32)
    ((float *)p)[i] = (float)v;
  else
    ((double *)p)[i] = v;
}

/* The reference: per output, an fma chain over k in order from +0.0. */
static void reference(gemm_buf *g) {
  const topos_gemm_task *t = &g->task.u.gemm;
  for (int64_t bi = 0; bi < t->batch; bi++)
    for (int64_t i = 0; i < t->m; i++)
      for (int64_t j = 0; j < t->n; j++) {
        int64_t ia = bi * t->a_batch + i * t->a_row;
        int64_t ib = bi * t->b_batch + j * t->b_col;
        double out;
        if (t->dtype == TOPOS_F32) {
          const float *a = t->a, *b = t->b;
          float acc = 0.0f;
          for (int64_t p = 0; p < t->k; p++)
            acc = fmaf(a[ia + p * t->a_col], b[ib + p * t->b_row], acc);
          out = acc;
        } else {
          const double *a = t->a, *b = t->b;
          double acc = 0.0;
          for (int64_t p = 0; p < t->k; p++)
            acc = fma(a[ia + p * t->a_col], b[ib + p * t->b_row], acc);
          out = acc;
        }
        g->ref[(bi * t->m + i) * t->n + j] = out;
      }
}

static void *alloc_filled(int64_t count, size_t es) {
  void *p = malloc((size_t)(count > 0 ? count : 1) * es);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void gemm_make(gemm_buf *g, const gcase *gc, uint64_t seed) {
  memset(g, 0, sizeof *g);
  g->es = topos_dtype_size(gc->dtype);
  store sa = store_of(gc->m, gc->k, gc->ta, gc->pad, gc->batch);
  store sb = store_of(gc->k, gc->n, gc->tb, gc->pad, gc->batch);
  g->sc = store_of(gc->m, gc->n, gc->tc, gc->pad, gc->batch);
  g->a = alloc_filled(sa.size, g->es);
  g->b = alloc_filled(sb.size, g->es);
  g->c = alloc_filled(g->sc.size, g->es);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  /* Padding gets values too: reading it by mistake shows as error. */
  for (int64_t i = 0; i < sa.size; i++)
    set(g->a, gc->dtype, i, draw(&s, gc->fill));
  for (int64_t i = 0; i < sb.size; i++)
    set(g->b, gc->dtype, i, draw(&s, gc->fill));
  for (int64_t i = 0; i < g->sc.size; i++) set(g->c, gc->dtype, i, SENTINEL);
  g->ref = malloc(sizeof(double) * (size_t)(gc->batch * gc->m * gc->n));
  ck_assert_ptr_nonnull(g->ref);
  g->task.kind = TOPOS_TASK_GEMM;
  g->task.threads = 2;
  topos_gemm_task *t = &g->task.u.gemm;
  *t = (topos_gemm_task){.dtype = gc->dtype,
                         .batch = gc->batch,
                         .m = gc->m,
                         .n = gc->n,
                         .k = gc->k,
                         .a = g->a,
                         .a_row = sa.row,
                         .a_col = sa.col,
                         .a_batch = sa.batch,
                         .b = g->b,
                         .b_row = sb.row,
                         .b_col = sb.col,
                         .b_batch = sb.batch,
                         .c = g->c,
                         .c_row = g->sc.row,
                         .c_col = g->sc.col,
                         .c_batch = g->sc.batch};
}

static void gemm_free(gemm_buf *g) {
  free(g->a);
  free(g->b);
  free(g->c);
  free(g->ref);
}

static int classify(double v) {
  if (isnan(v)) return 1;
  if (isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}

/* Checks C against the reference: NaN/Inf positions identical, the
 * relative L2 error of the finite part of each matrix within `envelope`,
 * every element outside the logical matrices still the sentinel.
 * Returns the worst relative error seen. */
static double check_against_reference(const gemm_buf *g, double envelope,
                                      const char *what) {
  const topos_gemm_task *t = &g->task.u.gemm;
  char *logical = calloc((size_t)(g->sc.size > 0 ? g->sc.size : 1), 1);
  ck_assert_ptr_nonnull(logical);
  double worst = 0;
  for (int64_t bi = 0; bi < t->batch; bi++) {
    long double num = 0, den = 0; /* f64 squares past DBL_MAX */
    for (int64_t i = 0; i < t->m; i++)
      for (int64_t j = 0; j < t->n; j++) {
        int64_t at = bi * t->c_batch + i * t->c_row + j * t->c_col;
        logical[at] = 1;
        double out = get(t->c, t->dtype, at);
        double ref = g->ref[(bi * t->m + i) * t->n + j];
        ck_assert_msg(classify(out) == classify(ref),
                      "%s: batch %lld (%lld,%lld): got %g, reference %g", what,
                      (long long)bi, (long long)i, (long long)j, out, ref);
        if (classify(ref) != 0) continue;
        num += ((long double)out - ref) * ((long double)out - ref);
        den += (long double)ref * ref;
      }
    double rel =
        den > 0 ? (double)(sqrtl(num) / sqrtl(den)) : (num > 0 ? INFINITY : 0);
    ck_assert_msg(rel <= envelope,
                  "%s: batch %lld relative L2 error %.3g > envelope %.3g", what,
                  (long long)bi, rel, envelope);
    if (rel > worst) worst = rel;
  }
  for (int64_t i = 0; i < g->sc.size; i++)
    if (!logical[i])
      ck_assert_msg(get(t->c, t->dtype, i) == SENTINEL,
                    "%s: padding element %lld of C was written", what,
                    (long long)i);
  free(logical);
  return worst;
}

static const topos_backend *B(void) {
  return topos_blas_backend();
}

static bool report(void) {
  return getenv("TOPOS_BLAS_REPORT") != NULL;
}

/* TOPOS_SKIP_SLOW (set by `make test-valgrind`): one fill per shape and
 * no product above 2^22 multiply-adds. */
static bool quick(void) {
  return getenv("TOPOS_SKIP_SLOW") != NULL;
}

static bool too_slow(const gcase *gc) {
  return quick() && gc->batch * gc->m * gc->n * gc->k > ((int64_t)1 << 22);
}

static void describe(char *buf, size_t len, const gcase *gc) {
  snprintf(buf, len,
           "%s batch=%lld m=%lld n=%lld k=%lld ta=%d tb=%d tc=%d "
           "pad=%lld fill=%d",
           topos_dtype_name(gc->dtype), (long long)gc->batch, (long long)gc->m,
           (long long)gc->n, (long long)gc->k, gc->ta, gc->tb, gc->tc,
           (long long)gc->pad, (int)gc->fill);
}

/* Runs one case through supports() and run() and holds it to the
 * envelope; returns the worst relative error. */
static double run_case(const gcase *gc, uint64_t seed) {
  char what[160];
  describe(what, sizeof what, gc);
  gemm_buf g;
  gemm_make(&g, gc, seed);
  reference(&g);
  ck_assert_msg(B()->supports(B(), &g.task), "%s: declined", what);
  topos_error err = {0};
  int rc = B()->run(B(), &g.task, &err);
  ck_assert_msg(rc == TOPOS_OK, "%s: run failed: %s", what, err.message);
  double env = gc->dtype == TOPOS_F32 ? ENVELOPE_F32 : ENVELOPE_F64;
  double worst = check_against_reference(&g, env, what);
  if (report()) fprintf(stderr, "blas envelope %s: %.3g\n", what, worst);
  gemm_free(&g);
  return worst;
}

/* ------------------------------------------------------------- the cases */

static const int64_t shapes[][4] = {
    /* batch, m, n, k */
    {1, 64, 64, 64},   {1, 65, 63, 67},   {1, 1, 300, 1000},  {1, 300, 1, 1000},
    {1, 1000, 300, 1}, {1, 257, 129, 33}, {1, 128, 256, 512}, {3, 70, 80, 90},
    {2, 33, 65, 257},  {1, 17, 16, 2049}, {4, 64, 64, 64},    {1, 255, 257, 63},
};

static void sweep(topos_dtype dtype) {
  int cases = 0;
  double worst = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int fill = FILL_SIGNED; fill <= (quick() ? FILL_SIGNED : FILL_WIDE);
         fill++) {
      gcase gc = {dtype,          shapes[s][0], shapes[s][1],
                  shapes[s][2],   shapes[s][3], false,
                  false,          false,        0,
                  (fill_kind)fill};
      if (too_slow(&gc)) continue;
      worst = fmax(worst, run_case(&gc, (uint64_t)(s * 7 + fill)));
      cases++;
    }
  }
  if (report())
    fprintf(stderr, "blas %s sweep: %d cases, worst %.3g\n",
            topos_dtype_name(dtype), cases, worst);
}

START_TEST(test_envelope_f32) {
  sweep(TOPOS_F32);
}
END_TEST

START_TEST(test_envelope_f64) {
  sweep(TOPOS_F64);
}
END_TEST

/* Every combination of transposed A, B and C, with and without padding,
 * unbatched and batched, both dtypes. */
START_TEST(test_layouts) {
  static const int64_t sh[][4] = {{1, 67, 71, 73}, {3, 40, 90, 100}};
  for (int dt = 0; dt < 2; dt++)
    for (size_t s = 0; s < 2; s++)
      for (int mask = 0; mask < 8; mask++)
        for (int64_t pad = 0; pad <= 5; pad += 5) {
          gcase gc = {dt ? TOPOS_F64 : TOPOS_F32,
                      sh[s][0],
                      sh[s][1],
                      sh[s][2],
                      sh[s][3],
                      mask & 1,
                      (mask >> 1) & 1,
                      (mask >> 2) & 1,
                      pad,
                      FILL_SIGNED};
          run_case(&gc, (uint64_t)(mask + 8 * s + 100 * dt + pad));
        }
}
END_TEST

/* A batch whose A is shared (batch stride 0), as a broadcast weight. */
START_TEST(test_shared_operand) {
  for (int dt = 0; dt < 2; dt++) {
    gcase gc = {dt ? TOPOS_F64 : TOPOS_F32,
                3,
                64,
                80,
                72,
                false,
                false,
                false,
                0,
                FILL_SIGNED};
    gemm_buf g;
    gemm_make(&g, &gc, 9);
    g.task.u.gemm.a_batch = 0;
    reference(&g);
    ck_assert(B()->supports(B(), &g.task));
    topos_error err = {0};
    ck_assert_int_eq(B()->run(B(), &g.task, &err), TOPOS_OK);
    check_against_reference(&g, dt ? ENVELOPE_F64 : ENVELOPE_F32, "shared A");
    gemm_free(&g);
  }
}
END_TEST

/* f32 at the largest k taken: the reference's own rounding grows with k,
 * and the envelope must still hold there. */
START_TEST(test_long_k_f32) {
  for (int fill = FILL_SIGNED; fill <= FILL_POSITIVE; fill++) {
    gcase gc = {TOPOS_F32, 1,    8,     8, TOPOS_BLAS_MAX_K_F32,
                false,     true, false, 0, (fill_kind)fill};
    run_case(&gc, 77 + (uint64_t)fill);
  }
}
END_TEST

/* ------------------------------------------------------------ non-finite */

/* What the engine would produce: the backend's result when it takes and
 * runs the task, else the reference's (the fallback). */
static bool offer(gemm_buf *g) {
  topos_error err = {0};
  if (B()->supports(B(), &g->task) && B()->run(B(), &g->task, &err) == TOPOS_OK)
    return true;
  const topos_gemm_task *t = &g->task.u.gemm;
  for (int64_t bi = 0; bi < t->batch; bi++)
    for (int64_t i = 0; i < t->m; i++)
      for (int64_t j = 0; j < t->n; j++)
        set(g->task.u.gemm.c, t->dtype,
            bi * t->c_batch + i * t->c_row + j * t->c_col,
            g->ref[(bi * t->m + i) * t->n + j]);
  return false;
}

/* NaN, +Inf and -Inf sprinkled into A and B (and a zero row of A against
 * an Inf in B, giving Inf·0): the combined result must have NaN/Inf
 * exactly where the reference does, and the backend must have declined. */
START_TEST(test_nonfinite_inputs) {
  for (int dt = 0; dt < 2; dt++)
    for (int variant = 0; variant < 4; variant++) {
      gcase gc = {dt ? TOPOS_F64 : TOPOS_F32,
                  2,
                  70,
                  66,
                  80,
                  variant & 1,
                  false,
                  false,
                  0,
                  FILL_SIGNED};
      gemm_buf g;
      gemm_make(&g, &gc, 31 + (uint64_t)variant);
      topos_gemm_task *t = &g.task.u.gemm;
      uint64_t s = 99 + (uint64_t)variant;
      const double specials[] = {NAN, INFINITY, -INFINITY};
      int count = variant == 3 ? 1 : 6;
      for (int q = 0; q < count; q++) {
        int64_t bi = (int64_t)(uniform(&s) * (double)t->batch);
        int64_t i = (int64_t)(uniform(&s) * (double)t->m);
        int64_t p = (int64_t)(uniform(&s) * (double)t->k);
        int64_t j = (int64_t)(uniform(&s) * (double)t->n);
        double v = specials[(q + variant) % 3];
        if (variant == 2)
          set(g.b, t->dtype, bi * t->b_batch + p * t->b_row + j * t->b_col, v);
        else
          set(g.a, t->dtype, bi * t->a_batch + i * t->a_row + p * t->a_col, v);
      }
      if (variant == 3) {
        /* Row 5 of A is zero and B(7, 9) = Inf: the reference gives NaN
         * at (5, 9) from Inf·0. */
        for (int64_t p = 0; p < t->k; p++)
          set(g.a, t->dtype, 5 * t->a_row + p * t->a_col, 0.0);
        set(g.b, t->dtype, 7 * t->b_row + 9 * t->b_col, INFINITY);
      }
      reference(&g);
      bool nonfinite = false;
      for (int64_t i = 0; i < t->batch * t->m * t->n; i++)
        nonfinite |= classify(g.ref[i]) != 0;
      ck_assert_msg(nonfinite, "variant %d: no NaN/Inf in the reference",
                    variant);
      if (variant == 3) ck_assert(isnan(g.ref[5 * t->n + 9]));
      bool ran = offer(&g);
      ck_assert_msg(!ran, "variant %d: the backend took non-finite operands",
                    variant);
      check_against_reference(&g, dt ? ENVELOPE_F64 : ENVELOPE_F32,
                              "non-finite inputs");
      gemm_free(&g);
    }
}
END_TEST

/* Finite operands whose products overflow: the reference has Inf (and
 * NaN from Inf − Inf), and the order of summation decides which, so the
 * backend declines; moderately large operands are still taken. */
START_TEST(test_overflow_declined) {
  for (int dt = 0; dt < 2; dt++) {
    double big = dt ? 1e160 : 1e20;
    gcase gc = {dt ? TOPOS_F64 : TOPOS_F32,
                1,
                64,
                64,
                64,
                false,
                false,
                false,
                0,
                FILL_SIGNED};
    gemm_buf g;
    gemm_make(&g, &gc, 5);
    topos_gemm_task *t = &g.task.u.gemm;
    for (int64_t i = 0; i < t->m * t->k; i++)
      set(g.a, t->dtype, i, get(g.a, t->dtype, i) * big);
    for (int64_t i = 0; i < t->k * t->n; i++)
      set(g.b, t->dtype, i, get(g.b, t->dtype, i) * big);
    reference(&g);
    bool inf = false;
    for (int64_t i = 0; i < t->m * t->n; i++) inf |= classify(g.ref[i]) != 0;
    ck_assert_msg(inf, "the reference did not overflow");
    topos_error err = {0};
    ck_assert(B()->supports(B(), &g.task)); /* by shape it would */
    ck_assert_int_eq(B()->run(B(), &g.task, &err), TOPOS_ERR_RANGE);
    ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
    ck_assert(get(g.c, t->dtype, 0) == SENTINEL); /* nothing written */
    gemm_free(&g);

    /* Large but safe: max|A|·max|B|·k far below the overflow. */
    double safe = dt ? 1e100 : 1e12;
    gemm_make(&g, &gc, 6);
    t = &g.task.u.gemm;
    for (int64_t i = 0; i < t->m * t->k; i++)
      set(g.a, t->dtype, i, get(g.a, t->dtype, i) * safe);
    for (int64_t i = 0; i < t->k * t->n; i++)
      set(g.b, t->dtype, i, get(g.b, t->dtype, i) * safe);
    reference(&g);
    ck_assert_int_eq(B()->run(B(), &g.task, &err), TOPOS_OK);
    check_against_reference(&g, dt ? ENVELOPE_F64 : ENVELOPE_F32, "large");
    gemm_free(&g);
  }
}
END_TEST

/* ------------------------------------------------------------- declines */

static topos_task base_task(topos_dtype dt, const void *a, const void *b,
                            void *c, int64_t m, int64_t n, int64_t k) {
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = 1};
  t.u.gemm = (topos_gemm_task){.dtype = dt,
                               .batch = 1,
                               .m = m,
                               .n = n,
                               .k = k,
                               .a = a,
                               .a_row = k,
                               .a_col = 1,
                               .a_batch = m * k,
                               .b = b,
                               .b_row = n,
                               .b_col = 1,
                               .b_batch = k * n,
                               .c = c,
                               .c_row = n,
                               .c_col = 1,
                               .c_batch = m * n};
  return t;
}

START_TEST(test_supports_declines) {
  static float buf[4];
  const void *a = buf, *b = buf;
  void *c = buf;
  const topos_backend *be = B();
  topos_task t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  ck_assert(be->supports(be, &t)); /* the baseline is taken */
  t = base_task(TOPOS_F64, a, b, c, 64, 64, 64);
  ck_assert(be->supports(be, &t));

  /* The threshold: 64³ taken, one k short of it declined. */
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 63);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 4096, 64, 1);
  ck_assert(be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 4096, 63, 1);
  ck_assert(!be->supports(be, &t));

  /* dtypes */
  t = base_task(TOPOS_BF16, a, b, c, 64, 64, 64);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_I32, a, b, c, 64, 64, 64);
  ck_assert(!be->supports(be, &t));
  t = base_task((topos_dtype)42, a, b, c, 64, 64, 64);
  ck_assert(!be->supports(be, &t));

  /* empty or absent */
  ck_assert(!be->supports(be, NULL));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.kind = (topos_task_kind)7;
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.batch = 0;
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 0, 64, 64);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 0);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, NULL, b, c, 64, 64, 64);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, NULL, 64, 64, 64);
  ck_assert(!be->supports(be, &t));

  /* k past the f32 cap; the same k in f64 is taken. */
  t = base_task(TOPOS_F32, a, b, c, 8, 8, TOPOS_BLAS_MAX_K_F32 + 1);
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F64, a, b, c, 8, 8, TOPOS_BLAS_MAX_K_F32 + 1);
  ck_assert(be->supports(be, &t));

  /* Dimensions cblas's int cannot hold. */
  t = base_task(TOPOS_F64, a, b, c, (int64_t)1 << 31, 64, 64);
  ck_assert(!be->supports(be, &t));

  /* Strides cblas cannot express. */
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.a_row = 0; /* broadcast rows of A */
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.b_col = 0; /* broadcast columns of B */
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.a_col = 2; /* every other column: neither unit stride */
  t.u.gemm.a_row = 128;
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.b_row = -64; /* rows reversed */
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.a_row = 32; /* rows overlap: leading dimension < k */
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.c_row = 63; /* C's rows would overlap */
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.c_row = 2; /* neither unit stride for C */
  t.u.gemm.c_col = 128;
  ck_assert(!be->supports(be, &t));
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.a_row = (int64_t)1 << 32; /* leading dimension past int */
  ck_assert(!be->supports(be, &t));

  /* Transposed views are expressible. */
  t = base_task(TOPOS_F32, a, b, c, 64, 64, 64);
  t.u.gemm.a_row = 1;
  t.u.gemm.a_col = 64;
  t.u.gemm.c_row = 1;
  t.u.gemm.c_col = 70;
  ck_assert(be->supports(be, &t));
  /* A dimension of extent 1 may carry any stride. */
  t = base_task(TOPOS_F32, a, b, c, 1, 512, 512);
  t.u.gemm.a_row = 0;
  t.u.gemm.c_row = 0;
  ck_assert(be->supports(be, &t));
}
END_TEST

/* run() on a task supports() declines fails without touching C. */
START_TEST(test_run_declines) {
  int64_t m = 64, n = 64, k = 64;
  float *a = calloc((size_t)(m * k), sizeof(float));
  float *b = calloc((size_t)(k * n), sizeof(float));
  float *c = malloc(sizeof(float) * (size_t)(m * n));
  for (int64_t i = 0; i < m * n; i++) c[i] = (float)SENTINEL;
  topos_task t = base_task(TOPOS_F32, a, b, c, m, n, k);
  t.u.gemm.a_row = 0;
  topos_error err = {0};
  ck_assert_int_ne(B()->run(B(), &t, &err), TOPOS_OK);
  ck_assert_int_ne(err.code, TOPOS_OK);
  ck_assert(strstr(err.message, "blas") != NULL);
  for (int64_t i = 0; i < m * n; i++) ck_assert(c[i] == (float)SENTINEL);
  /* With the stride fixed it runs: zeros times zeros. */
  t.u.gemm.a_row = k;
  ck_assert_int_eq(B()->run(B(), &t, NULL), TOPOS_OK);
  for (int64_t i = 0; i < m * n; i++) ck_assert(c[i] == 0.0f);
  free(a);
  free(b);
  free(c);
}
END_TEST

/* ------------------------------------------------------ identity, threads */

START_TEST(test_identity) {
  const topos_backend *be = topos_blas_backend();
  ck_assert_ptr_nonnull(be);
  ck_assert_ptr_eq(be, topos_blas_backend());
  ck_assert_str_eq(be->name, "blas");
  ck_assert_int_eq(be->fidelity, TOPOS_FIDELITY_ENVELOPE);
  ck_assert_ptr_nonnull(be->supports);
  ck_assert_ptr_nonnull(be->run);
}
END_TEST

/* The task's thread count never changes the bits (OpenBLAS's own
 * threading would: its sgemm on this machine's kernels), and OpenBLAS's
 * own thread setting is restored after each run. */
START_TEST(test_threads) {
  static const gcase cases[] = {
      {TOPOS_F32, 2, 300, 200, 250, false, true, false, 0, FILL_SIGNED},
      {TOPOS_F64, 2, 300, 200, 250, false, true, false, 0, FILL_SIGNED},
      {TOPOS_F32, 1, 70, 700, 128, true, false, true, 3, FILL_SIGNED},
      {TOPOS_F64, 1, 70, 700, 128, true, false, true, 3, FILL_SIGNED},
      {TOPOS_F32, 1, 512, 512, 512, false, false, false, 0, FILL_POSITIVE},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    if (too_slow(&cases[ci])) continue;
    char what[160];
    describe(what, sizeof what, &cases[ci]);
    gemm_buf g;
    gemm_make(&g, &cases[ci], 17 + ci);
    size_t bytes = (size_t)g.sc.size * g.es;
    void *first = malloc(bytes);
    int before = openblas_get_num_threads();
    static const int counts[] = {1, 2, 3, 4, 8};
    for (int ti = 0; ti < 5; ti++) {
      g.task.threads = counts[ti];
      ck_assert_int_eq(B()->run(B(), &g.task, NULL), TOPOS_OK);
      ck_assert_int_eq(openblas_get_num_threads(), before);
      if (ti == 0)
        memcpy(first, g.c, bytes);
      else
        ck_assert_msg(memcmp(first, g.c, bytes) == 0,
                      "%s: threads=%d changed the bits", what, counts[ti]);
    }
    free(first);
    gemm_free(&g);
  }
}
END_TEST

/* ------------------------------------------------------- through plans */

/* A probe in the chain: the blas backend behind a counter, taking nothing
 * until armed (so it never changes another test's results when suites
 * share a process). */
static atomic_int probe_runs;
static atomic_bool probe_armed;

static bool probe_supports(const topos_backend *self, const topos_task *t) {
  return atomic_load(&probe_armed) && B()->supports(B(), t);
}

static int probe_run(const topos_backend *self, const topos_task *t,
                     topos_error *err) {
  atomic_fetch_add(&probe_runs, 1);
  return B()->run(B(), t, err);
}

static const topos_backend probe = {
    .name = "blas-probe",
    .fidelity = TOPOS_FIDELITY_ENVELOPE,
    .supports = probe_supports,
    .run = probe_run,
};

/* Two products above the threshold: x[96,80]·transpose(w[72,80]) (a
 * transposed operand) and a batched p[3,64,70]·q[3,70,66]. */
typedef struct net2 {
  topos_network *net;
  topos_value roots[2];
  int64_t counts[2];
} net2;

static topos_tensor *random_tensor(topos_dtype dt, int rank,
                                   const int64_t *shape, uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  void *buf = alloc_filled(n, topos_dtype_size(dt));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < n; i++) set(buf, dt, i, draw(&s, FILL_SIGNED));
  topos_error err = {0};
  topos_tensor *t = topos_tensor_from(dt, rank, shape, buf, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  free(buf);
  return t;
}

static net2 net2_make(topos_dtype dt) {
  topos_tape *tape = topos_tape_new(dt);
  ck_assert_ptr_nonnull(tape);
  const int64_t sx[2] = {96, 80}, sw[2] = {72, 80};
  const int64_t sp[3] = {3, 64, 70}, sq[3] = {3, 70, 66};
  topos_tensor *tx = random_tensor(dt, 2, sx, 1);
  topos_tensor *tw = random_tensor(dt, 2, sw, 2);
  topos_tensor *tp = random_tensor(dt, 3, sp, 3);
  topos_tensor *tq = random_tensor(dt, 3, sq, 4);
  topos_value x = topos_input(tape, tx), w = topos_parameter(tape, tw);
  topos_value p = topos_input(tape, tp), q = topos_parameter(tape, tq);
  net2 r;
  r.roots[0] = topos_matmul(tape, x, topos_transpose(tape, w));
  r.roots[1] = topos_matmul(tape, p, q);
  r.counts[0] = 96 * 72;
  r.counts[1] = 3 * 64 * 66;
  topos_tensor_release(tx);
  topos_tensor_release(tw);
  topos_tensor_release(tp);
  topos_tensor_release(tq);
  topos_error err = {0};
  r.net = topos_tape_seal(tape, &err);
  ck_assert_msg(r.net != NULL, "%s", err.message);
  return r;
}

/* The roots' values from a run, widened to double. */
static double *read_root(const topos_run *run, const net2 *n, int i) {
  topos_error err = {0};
  const topos_tensor *t = topos_run_of(run, n->roots[i], &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  topos_dtype dt = topos_tensor_dtype(t);
  size_t bytes = (size_t)n->counts[i] * topos_dtype_size(dt);
  void *raw = malloc(bytes);
  ck_assert_int_eq(topos_tensor_read(t, raw, bytes, &err), TOPOS_OK);
  double *v = malloc(sizeof(double) * (size_t)n->counts[i]);
  for (int64_t j = 0; j < n->counts[i]; j++) v[j] = get(raw, dt, j);
  free(raw);
  return v;
}

/* Runs the network as a plan with `numerics`; returns the probe's runs
 * and compares each root with the interpreter's (the reference): bit for
 * bit when `exact`, else within the envelope. */
static int plan_against_interpreter(topos_dtype dt, topos_numerics numerics) {
  net2 n = net2_make(dt);
  topos_error err = {0};
  topos_run *ref = topos_forward(n.net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(ref != NULL, "%s", err.message);
  topos_entry e = {n.roots, 2, NULL, 0, TOPOS_POSTURE_FORWARD, numerics};
  topos_plan *plan = topos_network_lower(n.net, &e, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  ck_assert_int_eq(topos_backend_register(&probe), TOPOS_OK);
  atomic_store(&probe_runs, 0);
  atomic_store(&probe_armed, true);
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  atomic_store(&probe_armed, false);
  ck_assert_msg(run != NULL, "%s", err.message);
  int runs = atomic_load(&probe_runs);
  for (int i = 0; i < 2; i++) {
    double *want = read_root(ref, &n, i), *got = read_root(run, &n, i);
    double num = 0, den = 0;
    for (int64_t j = 0; j < n.counts[i]; j++) {
      if (numerics == TOPOS_NUMERICS_EXACT)
        ck_assert_msg(memcmp(&got[j], &want[j], sizeof(double)) == 0,
                      "%s exact root %d element %lld: %.17g, reference %.17g",
                      topos_dtype_name(dt), i, (long long)j, got[j], want[j]);
      num += (got[j] - want[j]) * (got[j] - want[j]);
      den += want[j] * want[j];
    }
    double rel = sqrt(num) / sqrt(den);
    double env = dt == TOPOS_F32 ? ENVELOPE_F32 : ENVELOPE_F64;
    ck_assert_msg(rel <= env, "%s root %d: relative error %.3g > %.3g",
                  topos_dtype_name(dt), i, rel, env);
    if (report())
      fprintf(stderr, "blas plan %s %s root %d: relative error %.3g\n",
              topos_dtype_name(dt),
              numerics == TOPOS_NUMERICS_EXACT ? "exact" : "fast", i, rel);
    free(want);
    free(got);
  }
  topos_run_free(run);
  topos_run_free(ref);
  topos_plan_free(plan);
  topos_network_release(n.net);
  return runs;
}

/* Whether a backend ahead of the probe in the chain takes `numerics`
 * tasks of this network (another suite may have registered one when
 * suites share a process); then the probe cannot count. */
static bool probe_shadowed(void) {
  for (int i = 0; i < topos_backend_count(); i++) {
    const topos_backend *b = topos_backend_at(i);
    if (b == &probe) return false;
    if (strcmp(b->name, "blas") == 0 || b->fidelity == TOPOS_FIDELITY_EXACT)
      return true;
  }
  return false;
}

/* An exact plan never reaches the envelope backend, even armed, and keeps
 * the reference's bits. */
START_TEST(test_plan_exact_never_reaches) {
  for (int dt = 0; dt < 2; dt++) {
    int runs = plan_against_interpreter(dt ? TOPOS_F64 : TOPOS_F32,
                                        TOPOS_NUMERICS_EXACT);
    ck_assert_msg(runs == 0, "an exact plan reached blas %d times", runs);
  }
}
END_TEST

/* A fast plan does reach it (both products), within the envelope. */
START_TEST(test_plan_fast_within_envelope) {
  for (int dt = 0; dt < 2; dt++) {
    int runs = plan_against_interpreter(dt ? TOPOS_F64 : TOPOS_F32,
                                        TOPOS_NUMERICS_FAST);
    if (!probe_shadowed())
      ck_assert_msg(runs == 2, "a fast plan reached blas %d times, not 2",
                    runs);
  }
}
END_TEST

Suite *blas_suite(void) {
  Suite *s = suite_create("blas");
  TCase *tc = tcase_create("blas");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_identity);
  tcase_add_test(tc, test_envelope_f32);
  tcase_add_test(tc, test_envelope_f64);
  tcase_add_test(tc, test_layouts);
  tcase_add_test(tc, test_shared_operand);
  tcase_add_test(tc, test_long_k_f32);
  tcase_add_test(tc, test_nonfinite_inputs);
  tcase_add_test(tc, test_overflow_declined);
  tcase_add_test(tc, test_supports_declines);
  tcase_add_test(tc, test_run_declines);
  tcase_add_test(tc, test_threads);
  tcase_add_test(tc, test_plan_exact_never_reaches);
  tcase_add_test(tc, test_plan_fast_within_envelope);
  suite_add_tcase(s, tc);
  return s;
}
