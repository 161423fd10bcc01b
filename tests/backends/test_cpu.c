/*
 * test_cpu.c - the `cpu` backend and the backend chain.
 *
 * Every check is bit for bit (memcmp): the backend's GEMM against a plain
 * scalar fma chain per output (numerics.md), over the odd-size sweep
 * {1, 7, 15, 16, 17, 63, 64, 65, 255, 257}, transposed / narrowed /
 * broadcast operands, strided outputs, batches, NaN/Inf/-0 inputs, every
 * microkernel ISA this CPU has and thread counts 1..4; then the engine
 * with the backend on the chain against the engine without it, from one
 * matmul to whole MLP and CNN training steps.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "internal.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static const int64_t sweep[10] = {1, 7, 15, 16, 17, 63, 64, 65, 255, 257};

static bool skip_slow(void) {
  const char *s = getenv("TOPOS_SKIP_SLOW");
  return s && *s && strcmp(s, "0") != 0;
}

/* Puts the process back as it was: every test leaves the chain on, the
 * default thread count and the best ISA. */
static void restore(void) {
  backend_set_threads(0);
  topos_cpu_force_isa(NULL);
}

/* ------------------------------------------------------------ matrices */

/* How a matrix operand lies in its buffer. */
typedef enum layout {
  L_ROW = 0,   /* row-major, contiguous */
  L_TRANS,     /* column-major (a transposed view) */
  L_NARROW,    /* row-major inside a wider, taller matrix, offset */
  L_NARROW_T,  /* column-major inside a larger one, offset */
  L_BROADCAST, /* every row the same (row stride 0) */
  L_STRIDED,   /* both strides > 1 */
  L_COUNT
} layout;

typedef struct mat {
  void *buf;      /* whole allocation */
  size_t bytes;   /* of buf */
  const void *at; /* element (0,0) of batch 0 */
  int64_t rs, cs; /* element strides */
  int64_t bs;     /* batch stride */
} mat;

static size_t esize(topos_dtype d) {
  return d == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

static void fill_random(void *p, topos_dtype d, int64_t count, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < count; i++) {
    double v = (double)(rng_next(&s) >> 11) / 9007199254740992.0 * 2 - 1;
    if (d == TOPOS_F64)
      ((double *)p)[i] = v;
    else
      ((float *)p)[i] = (float)v;
  }
}

/* A rows x cols operand (batch of them) in layout l, random contents.
 * batch_bcast: every batch reads the same matrix (batch stride 0). */
static mat mat_new(topos_dtype d, layout l, int64_t batch, bool batch_bcast,
                   int64_t rows, int64_t cols, uint64_t seed) {
  mat m = {0};
  int64_t R = rows, C = cols, off = 0;
  switch (l) {
    case L_ROW:
      m.rs = cols;
      m.cs = 1;
      break;
    case L_TRANS:
      m.rs = 1;
      m.cs = rows;
      break;
    case L_NARROW:
      R = rows + 3;
      C = cols + 5;
      m.rs = C;
      m.cs = 1;
      off = 2 * C + 3;
      break;
    case L_NARROW_T:
      R = rows + 4;
      C = cols + 2;
      m.rs = 1;
      m.cs = R;
      off = 1 * R + 3;
      break;
    case L_BROADCAST:
      R = 1;
      m.rs = 0;
      m.cs = 1;
      break;
    case L_STRIDED:
      m.rs = 2 * cols + 1;
      m.cs = 2;
      R = rows;
      C = 2 * cols + 1;
      break;
    default:
      break;
  }
  int64_t per = R * C;
  int64_t nb = batch_bcast ? 1 : batch;
  m.bs = batch_bcast ? 0 : per;
  int64_t count = per * nb;
  m.bytes = (size_t)(count > 0 ? count : 1) * esize(d);
  m.buf = malloc(m.bytes);
  ck_assert_ptr_nonnull(m.buf);
  fill_random(m.buf, d, count, seed);
  m.at = (const char *)m.buf + (size_t)off * esize(d);
  return m;
}

/* The output: contiguous, padded rows, or strided columns; the bytes in
 * between are a fixed pattern the GEMM must not touch. */
static mat out_new(topos_dtype d, int kind, int64_t batch, int64_t rows,
                   int64_t cols) {
  mat m = {0};
  int64_t rs = cols, cs = 1;
  if (kind == 1) rs = cols + 3;
  if (kind == 2) {
    cs = 2;
    rs = 2 * cols;
  }
  m.rs = rs;
  m.cs = cs;
  m.bs = rows * rs;
  m.bytes = (size_t)(batch * rows * rs) * esize(d);
  m.buf = malloc(m.bytes ? m.bytes : 1);
  ck_assert_ptr_nonnull(m.buf);
  memset(m.buf, 0xA5, m.bytes);
  m.at = m.buf;
  return m;
}

static topos_gemm_task task_of(topos_dtype d, int64_t batch, int64_t m,
                               int64_t n, int64_t k, const mat *A, const mat *B,
                               mat *C) {
  return (topos_gemm_task){.dtype = d,
                           .batch = batch,
                           .m = m,
                           .n = n,
                           .k = k,
                           .a = A->at,
                           .a_row = A->rs,
                           .a_col = A->cs,
                           .a_batch = A->bs,
                           .b = B->at,
                           .b_row = B->rs,
                           .b_col = B->cs,
                           .b_batch = B->bs,
                           .c = C->buf,
                           .c_row = C->rs,
                           .c_col = C->cs,
                           .c_batch = C->bs};
}

/* fma as numerics.md defines it for NaNs: where an operand is NaN the
 * result is a's NaN, else b's, else acc's (quieted); otherwise fmaf's
 * single rounding.  Written out because a compiler may swap fmaf's two
 * multiplicands (they commute), which changes which NaN a call
 * returns. */
static float ref_fmaf(float a, float b, float acc) {
  const float *first = isnan(a) ? &a : isnan(b) ? &b : isnan(acc) ? &acc : NULL;
  if (!first) return fmaf(a, b, acc);
  uint32_t u;
  memcpy(&u, first, sizeof u);
  u |= 0x00400000u;
  float q;
  memcpy(&q, &u, sizeof q);
  return q;
}
static double ref_fma(double a, double b, double acc) {
  const double *first = isnan(a)     ? &a
                        : isnan(b)   ? &b
                        : isnan(acc) ? &acc
                                     : NULL;
  if (!first) return fma(a, b, acc);
  uint64_t u;
  memcpy(&u, first, sizeof u);
  u |= 0x0008000000000000ull;
  double q;
  memcpy(&q, &u, sizeof q);
  return q;
}

/* The definition: one fma chain per output, k in order, from +0.0. */
static void scalar_gemm(const topos_gemm_task *g) {
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        if (g->dtype == TOPOS_F64) {
          const double *a = (const double *)g->a + b * g->a_batch;
          const double *bb = (const double *)g->b + b * g->b_batch;
          double acc = 0.0;
          for (int64_t k = 0; k < g->k; k++)
            acc = ref_fma(a[i * g->a_row + k * g->a_col],
                          bb[k * g->b_row + j * g->b_col], acc);
          ((double *)g->c)[b * g->c_batch + i * g->c_row + j * g->c_col] = acc;
        } else {
          const float *a = (const float *)g->a + b * g->a_batch;
          const float *bb = (const float *)g->b + b * g->b_batch;
          float acc = 0.0f;
          for (int64_t k = 0; k < g->k; k++)
            acc = ref_fmaf(a[i * g->a_row + k * g->a_col],
                           bb[k * g->b_row + j * g->b_col], acc);
          ((float *)g->c)[b * g->c_batch + i * g->c_row + j * g->c_col] = acc;
        }
      }
}

/* Runs the task on the cpu backend (threads) and on scalar_gemm into a
 * copy of C's buffer; the two buffers must be identical byte for byte. */
static void expect_exact(topos_gemm_task g, mat *C, int threads,
                         const char *what) {
  const topos_backend *cpu = topos_cpu_backend();
  void *want = malloc(C->bytes ? C->bytes : 1);
  ck_assert_ptr_nonnull(want);
  memcpy(want, C->buf, C->bytes);
  topos_gemm_task r = g;
  r.c = want;
  scalar_gemm(&r);
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = threads};
  t.u.gemm = g;
  topos_error err = {0};
  ck_assert_msg(cpu->run(cpu, &t, &err) == TOPOS_OK, "%s: run failed", what);
  if (memcmp(want, C->buf, C->bytes) != 0) {
    size_t es = esize(g.dtype), n = C->bytes / es, i = 0;
    while (i < n &&
           memcmp((char *)want + i * es, (char *)C->buf + i * es, es) == 0)
      i++;
    double x =
        g.dtype == TOPOS_F64 ? ((double *)C->buf)[i] : ((float *)C->buf)[i];
    double y = g.dtype == TOPOS_F64 ? ((double *)want)[i] : ((float *)want)[i];
    free(want);
    ck_abort_msg(
        "%s: %s m=%lld n=%lld k=%lld batch=%lld threads=%d isa=%s: element "
        "%zu is %.17g, the fma chain gives %.17g",
        what, topos_dtype_name(g.dtype), (long long)g.m, (long long)g.n,
        (long long)g.k, (long long)g.batch, threads, topos_cpu_isa(), i, x, y);
  }
  free(want);
}

static void check_shape(topos_dtype d, int64_t batch, int64_t m, int64_t n,
                        int64_t k, layout la, layout lb, int ckind,
                        bool a_bcast, int threads, uint64_t seed,
                        const char *what) {
  mat A = mat_new(d, la, batch, a_bcast, m, k, seed);
  mat B = mat_new(d, lb, batch, false, k, n, seed + 1);
  mat C = out_new(d, ckind, batch, m, n);
  topos_gemm_task g = task_of(d, batch, m, n, k, &A, &B, &C);
  expect_exact(g, &C, threads, what);
  free(A.buf);
  free(B.buf);
  free(C.buf);
}

/* ------------------------------------------------------------ registry */

static bool never(const topos_backend *self, const topos_task *task) {
  return false;
}
static int never_run(const topos_backend *self, const topos_task *task,
                     topos_error *err) {
  return TOPOS_ERR_STATE;
}

START_TEST(registry) {
  topos_backends_register_defaults();
  int n = topos_backend_count();
  ck_assert_int_ge(n, 1);
  topos_backends_register_defaults(); /* idempotent */
  ck_assert_int_eq(topos_backend_count(), n);
  const topos_backend *first = topos_backend_at(0);
  ck_assert_ptr_nonnull(first);
  bool found = false;
  for (int i = 0; i < n; i++)
    if (topos_backend_at(i) == topos_cpu_backend()) found = true;
  ck_assert(found);
  ck_assert_str_eq(topos_cpu_backend()->name, "cpu");
  ck_assert_int_eq(topos_cpu_backend()->fidelity, TOPOS_FIDELITY_EXACT);
  ck_assert_ptr_null(topos_backend_at(-1));
  ck_assert_ptr_null(topos_backend_at(n));
  ck_assert_int_eq(topos_backend_register(NULL), TOPOS_ERR_ARGUMENT);
  topos_backend bad = {.name = NULL, .supports = never, .run = never_run};
  ck_assert_int_eq(topos_backend_register(&bad), TOPOS_ERR_ARGUMENT);
  /* the same backend twice is one entry */
  ck_assert_int_eq(topos_backend_register(topos_cpu_backend()), TOPOS_OK);
  ck_assert_int_eq(topos_backend_count(), n);
  ck_assert(strcmp(topos_cpu_isa(), "avx512") == 0 ||
            strcmp(topos_cpu_isa(), "avx2") == 0 ||
            strcmp(topos_cpu_isa(), "c") == 0);
}
END_TEST

START_TEST(supports_thresholds) {
  const topos_backend *cpu = topos_cpu_backend();
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = 1};
  t.u.gemm = (topos_gemm_task){
      .dtype = TOPOS_F32, .batch = 1, .m = 16, .n = 16, .k = 16};
  ck_assert(cpu->supports(cpu, &t));
  t.u.gemm.dtype = TOPOS_F64;
  ck_assert(cpu->supports(cpu, &t));
  t.u.gemm.dtype = TOPOS_BF16; /* bf16 operands, f32 output (backend.h) */
  ck_assert(cpu->supports(cpu, &t));
  t.u.gemm.dtype = TOPOS_I32;
  ck_assert(!cpu->supports(cpu, &t));
  t.u.gemm.dtype = TOPOS_F32;
  t.u.gemm.k = 2; /* 512 multiply-adds: not worth packing */
  ck_assert(!cpu->supports(cpu, &t));
  t.u.gemm.k = 0;
  ck_assert(!cpu->supports(cpu, &t));
}
END_TEST

START_TEST(threads_setting) {
  int def = backend_threads();
  ck_assert_int_ge(def, 1);
  backend_set_threads(3);
  ck_assert_int_eq(backend_threads(), 3);
  backend_set_threads(0);
  ck_assert_int_eq(backend_threads(), def);
}
END_TEST

/* --------------------------------------------------- direct GEMM sweeps */

/* Every (m, n, k) of the sweep for one m (the loop index) and one dtype;
 * the thread count cycles through 1..4.  TOPOS_SKIP_SLOW keeps a subset. */
static void sweep_m(topos_dtype d, int mi) {
  bool slow_ok = !skip_slow();
  if (!slow_ok && mi % 3 != 0) return;
  int c = 0;
  for (int ni = 0; ni < 10; ni++)
    for (int ki = 0; ki < 10; ki++, c++) {
      if (!slow_ok && (ni + ki) % 3 != 0) continue;
      char what[64];
      snprintf(what, sizeof what, "sweep %d/%d/%d", mi, ni, ki);
      check_shape(d, 1, sweep[mi], sweep[ni], sweep[ki], L_ROW, L_ROW, 0, false,
                  1 + (mi + ni + ki) % 4, (uint64_t)(mi * 100 + c), what);
    }
}

START_TEST(sweep_f32) {
  sweep_m(TOPOS_F32, _i);
}
END_TEST

START_TEST(sweep_f64) {
  sweep_m(TOPOS_F64, _i);
}
END_TEST

/* Square sizes, every thread count 1..4, both dtypes. */
START_TEST(square_threads) {
  for (int d = 0; d < 2; d++)
    for (int s = 0; s < 10; s++)
      for (int th = 1; th <= 4; th++)
        check_shape(d ? TOPOS_F64 : TOPOS_F32, 1, sweep[s], sweep[s], sweep[s],
                    L_ROW, L_ROW, 0, false, th, (uint64_t)(s * 7 + th),
                    "square");
  /* beyond one k block and one column item */
  check_shape(TOPOS_F32, 1, 300, 1100, 600, L_ROW, L_ROW, 0, false, 2, 5,
              "large f32");
  check_shape(TOPOS_F64, 1, 300, 600, 530, L_ROW, L_ROW, 0, false, 3, 6,
              "large f64");
}
END_TEST

/* The blocked path: products wider than one column block share one
 * packed A per row block and k block across their column blocks.  Row
 * blocks made small through the hook so that modest sizes cross every
 * edge: m a multiple of the row block or not, m below one block, below
 * one micro-panel, several k blocks with a tail, n over several column
 * blocks with a partial last panel; row-major A (the transposing pack),
 * other layouts, padded and strided C, batches (shared A too), both
 * dtypes, on every ISA this CPU has, at 1..3 threads. */
START_TEST(row_blocks) {
  /* Caps of one and two f32 micro-panels' A at KC 512 (14 rows on
   * AVX-512; one and more on the others), so small m crosses row blocks
   * and the products stay cheap to check under the sanitizers. */
  const int64_t shapes[][3] = {
      {31, 1100, 600}, /* three row blocks, the last short */
      {28, 1030, 530}, /* whole row blocks */
      {13, 1050, 700}, /* one partial micro-panel */
      {43, 600, 17},   /* one short k block */
      {71, 520, 300},  /* many row blocks, two column blocks */
  };
  const size_t caps[] = {14 * 512 * 4, 2 * 14 * 512 * 4, 0};
  const char *isas[] = {"avx512", "avx2", "c"};
#if defined(__SANITIZE_ADDRESS__)
  const int every = 3; /* the reference checks run ~20x slower: a third of
                          the products, rotating through the cases */
#else
  const int every = 1;
#endif
  int c = 0;
  for (int i = 0; i < 3; i++) {
    if (topos_cpu_force_isa(isas[i]) != 0) continue;
    for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++) {
      /* Every cap on the best ISA; the others (the portable C kernels are
       * slow under the sanitizers) at the smallest cap only. */
      if (i > 0 && ci > 0) continue;
      topos_cpu_test_ablock_bytes(caps[ci]);
      for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++, c++) {
          if ((skip_slow() && c % 4 != 0) || c % every != 0) continue;
          topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
          char what[80];
          snprintf(what, sizeof what, "row blocks %s cap %zu shape %zu",
                   isas[i], caps[ci], s);
          layout la = c % 3 == 2 ? (layout)(c % L_COUNT) : L_ROW;
          layout lb = c % 5 == 4 ? L_TRANS : L_ROW;
          check_shape(dt, 1, shapes[s][0], shapes[s][1], shapes[s][2], la, lb,
                      c % 3, false, 1 + c % 3, (uint64_t)c, what);
        }
      /* batches: own A, then one A shared by every batch (at the
       * smallest cap) */
      for (int bc = 0; bc < 2 && ci == 0; bc++, c++)
        check_shape(c % 2 ? TOPOS_F64 : TOPOS_F32, 3, 45, 700, 300, L_ROW,
                    L_ROW, c % 3, bc, 1 + c % 3, (uint64_t)c,
                    "row blocks batch");
    }
  }
  topos_cpu_test_ablock_bytes(0);
  restore();
}
END_TEST

/* A row-major B read in place (few row panels, whole column panels,
 * rows at most 2 KB apart): one and several k blocks, partial row
 * panels, padded and strided C (the tile path), batches, both dtypes, 1-3
 * threads, on every ISA this CPU has - and B layouts that must still be
 * packed (a transposed B, a row too wide, a partial last panel). */
START_TEST(direct_b) {
  const int64_t shapes[][3] = {{29, 192, 70},  {128, 256, 600}, {13, 320, 33},
                               {1, 224, 513},  {100, 160, 1},   {57, 512, 40},
                               {128, 1024, 9}, {20, 250, 30}};
  const char *isas[] = {"avx512", "avx2"};
  int c = 0;
  for (int i = 0; i < 2; i++) {
    if (topos_cpu_force_isa(isas[i]) != 0) continue;
    for (int d = 0; d < 2; d++)
      for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++, c++) {
        if (skip_slow() && c % 3 != 0) continue;
        char what[64];
        snprintf(what, sizeof what, "direct b %s shape %zu", isas[i], sh);
        check_shape(d ? TOPOS_F64 : TOPOS_F32, 1 + (c % 4 == 3), shapes[sh][0],
                    shapes[sh][1], shapes[sh][2], L_ROW,
                    c % 7 == 6 ? L_TRANS : L_ROW, c % 3, false, 1 + c % 3,
                    (uint64_t)(900 + c), what);
      }
  }
  restore();
}
END_TEST

/* Transposed, narrowed, broadcast and strided operands; padded and
 * strided outputs. */
START_TEST(layouts) {
  /* {29, 200, 70}: enough column panels that A is packed (rows 14, 14
   * and 1 of a micro-panel), from every layout */
  const int64_t shapes[][3] = {{17, 65, 63}, {64, 64, 64}, {255, 7, 257},
                               {1, 257, 16}, {65, 1, 255}, {15, 33, 300},
                               {29, 200, 70}};
  int c = 0;
  for (int d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      for (int la = 0; la < L_COUNT; la++)
        for (int lb = 0; lb < L_COUNT; lb++, c++) {
          if (lb == L_BROADCAST)
            continue; /* a k x n with equal rows: ok but
                         covered by A */
          check_shape(d ? TOPOS_F64 : TOPOS_F32, 1, shapes[s][0], shapes[s][1],
                      shapes[s][2], (layout)la, (layout)lb, c % 3, false,
                      1 + c % 4, (uint64_t)c, "layouts");
        }
}
END_TEST

START_TEST(batched) {
  int c = 0;
  for (int d = 0; d < 2; d++)
    for (int th = 1; th <= 4; th++)
      for (int bc = 0; bc < 2; bc++, c++) {
        topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
        check_shape(dt, 3, 17, 65, 63, L_ROW, L_ROW, 0, bc, th, (uint64_t)c,
                    "batched");
        check_shape(dt, 5, 64, 7, 255, L_TRANS, L_NARROW, 1, bc, th,
                    (uint64_t)c + 50, "batched strided");
        check_shape(dt, 2, 1, 257, 16, L_NARROW_T, L_TRANS, 2, bc, th,
                    (uint64_t)c + 90, "batched row");
      }
}
END_TEST

/* NaN, ±Inf, ±0, huge values that overflow mid-chain, subnormals. */
START_TEST(special_values) {
  const double specials[] = {NAN,  INFINITY, -INFINITY, -0.0,    0.0,
                             1e38, -1e38,    1e-40,     -1e-310, 1e308};
  for (int d = 0; d < 2; d++)
    for (int rate = 0; rate < 3; rate++) {
      topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
      int64_t m = 33, n = 47, k = 70;
      mat A = mat_new(dt, L_ROW, 1, false, m, k, 3 + rate);
      mat B = mat_new(dt, L_TRANS, 1, false, k, n, 4 + rate);
      uint64_t s = 99 + rate;
      int every = rate == 0 ? 97 : rate == 1 ? 13 : 3;
      for (int side = 0; side < 2; side++) {
        mat *M = side ? &B : &A;
        int64_t cnt = side ? k * n : m * k;
        for (int64_t i = 0; i < cnt; i++) {
          if (rng_next(&s) % (uint64_t)every != 0) continue;
          double v = specials[rng_next(&s) % 10];
          if (dt == TOPOS_F64)
            ((double *)M->buf)[i] = v;
          else
            ((float *)M->buf)[i] = (float)v;
        }
      }
      /* a row of -0 times positives: the chain stays +0 from +0.0 */
      for (int64_t kk = 0; kk < k; kk++) {
        if (dt == TOPOS_F64)
          ((double *)A.buf)[kk] = -0.0;
        else
          ((float *)A.buf)[kk] = -0.0f;
      }
      mat C = out_new(dt, 0, 1, m, n);
      topos_gemm_task g = task_of(dt, 1, m, n, k, &A, &B, &C);
      for (int th = 1; th <= 2; th++) expect_exact(g, &C, th, "specials");
      free(A.buf);
      free(B.buf);
      free(C.buf);
    }
}
END_TEST

/* Each microkernel family this CPU can run. */
START_TEST(every_isa) {
  const char *isas[] = {"avx512", "avx2", "c"};
  int ran = 0;
  for (int i = 0; i < 3; i++) {
    if (topos_cpu_force_isa(isas[i]) != 0) continue;
    ck_assert_str_eq(topos_cpu_isa(), isas[i]);
    ran++;
    int c = 0;
    for (int d = 0; d < 2; d++)
      for (int s = 0; s < 10; s += 1, c++) {
        topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
        check_shape(dt, 1, sweep[s], sweep[(s + 3) % 10], sweep[(s + 7) % 10],
                    (layout)(c % L_COUNT), (layout)((c + 1) % 4), c % 3, false,
                    1 + c % 4, (uint64_t)c, isas[i]);
      }
    check_shape(TOPOS_F32, 2, 70, 70, 600, L_ROW, L_TRANS, 0, false, 2, 1,
                isas[i]);
  }
  ck_assert_int_ge(ran, 1);
  ck_assert_int_eq(topos_cpu_force_isa("sse9"), -1);
  restore();
}
END_TEST

/* One-row products (cpu_gemv.c): B row-major or transposed, read in
 * place, on every ISA this CPU has; sizes around the 16-wide tiles, the
 * four-row k steps and the 2048-column blocks. */
START_TEST(gemv_one_row) {
  const int64_t ns[] = {1, 7, 16, 17, 33, 257, 2100};
  const int64_t ks[] = {1, 3, 4, 5, 16, 17, 63, 300};
  const layout lbs[] = {L_ROW, L_TRANS, L_NARROW, L_NARROW_T, L_STRIDED};
  const layout las[] = {L_ROW, L_TRANS, L_STRIDED};
  const char *isas[] = {"avx512", "avx2", "c"};
  int c = 0, ran = 0;
  for (int is = 0; is < 3; is++) {
    if (topos_cpu_force_isa(isas[is]) != 0) continue;
    ran++;
    for (int d = 0; d < 2; d++)
      for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++, c++) {
          topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
          check_shape(dt, 1 + c % 3 / 2 * 2, 1, ns[ni], ks[ki], las[c % 3],
                      lbs[c % 5], c % 3, c % 4 == 0, 1 + c % 4, (uint64_t)c,
                      isas[is]);
        }
  }
  ck_assert_int_ge(ran, 1);
  restore();
  /* a tied GPT-2 head's shape: [1, 768] x wte^T, 50257 outputs */
  check_shape(TOPOS_F32, 1, 1, 50257, 768, L_ROW, L_TRANS, 0, false, 2, 77,
              "gemv head");
  check_shape(TOPOS_F32, 1, 1, 3072, 768, L_ROW, L_ROW, 0, false, 2, 78,
              "gemv mlp");
}
END_TEST

/* NaN payloads, ±Inf, ±0, overflow and subnormals through the one-row
 * kernels: which NaN comes out is the reference's (A's, else B's, else
 * the accumulator's). */
START_TEST(gemv_special_values) {
  const double specials[] = {NAN,  INFINITY, -INFINITY, -0.0,    0.0,
                             1e38, -1e38,    1e-40,     -1e-310, 1e308};
  const char *isas[] = {"avx512", "avx2", "c"};
  for (int is = 0; is < 3; is++) {
    if (topos_cpu_force_isa(isas[is]) != 0) continue;
    for (int d = 0; d < 2; d++)
      for (int lb = 0; lb < 2; lb++)
        for (int rate = 0; rate < 3; rate++) {
          topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
          int64_t n = 70, k = 45;
          mat A = mat_new(dt, L_ROW, 1, false, 1, k, 3 + rate);
          mat B = mat_new(dt, lb ? L_TRANS : L_ROW, 1, false, k, n, 4 + rate);
          uint64_t s = 99 + rate;
          int every = rate == 0 ? 17 : rate == 1 ? 5 : 2;
          for (int side = 0; side < 2; side++) {
            mat *M = side ? &B : &A;
            int64_t cnt = side ? k * n : k;
            for (int64_t i = 0; i < cnt; i++) {
              if (rng_next(&s) % (uint64_t)every != 0) continue;
              double v = specials[rng_next(&s) % 10];
              /* NaNs with payloads, so that which one survives shows */
              if (isnan(v)) {
                if (dt == TOPOS_F64) {
                  uint64_t bits =
                      0x7FF8000000000000ull | (uint64_t)(i + 1 + side * 7);
                  memcpy((double *)M->buf + i, &bits, 8);
                } else {
                  uint32_t bits = 0x7FC00000u | (uint32_t)(i + 1 + side * 7);
                  memcpy((float *)M->buf + i, &bits, 4);
                }
                continue;
              }
              if (dt == TOPOS_F64)
                ((double *)M->buf)[i] = v;
              else
                ((float *)M->buf)[i] = (float)v;
            }
          }
          mat C = out_new(dt, lb, 1, 1, n);
          topos_gemm_task g = task_of(dt, 1, 1, n, k, &A, &B, &C);
          for (int th = 1; th <= 2; th++)
            expect_exact(g, &C, th, "gemv specials");
          free(A.buf);
          free(B.buf);
          free(C.buf);
        }
  }
  restore();
}
END_TEST

/* bf16 products (backend.h's form: bf16 operands in place, an f32
 * output): each operand widened exactly, the f32 chain.  One-row and
 * packed paths, B row-major, transposed and strided, every ISA, 1..3
 * threads, NaN payloads and infinities among the bf16 patterns. */
static float widen_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void check_bf16(int64_t batch, int64_t m, int64_t n, int64_t k,
                       bool b_trans, bool b_strided, int threads,
                       uint64_t seed) {
  int64_t bstride = b_strided ? 3 : 1;
  size_t na = (size_t)(batch * m * k), nb = (size_t)(batch * k * n) * bstride;
  uint16_t *A = malloc(na * 2), *B = malloc(nb * 2);
  float *C = malloc((size_t)(batch * m * n) * 4);
  float *W = malloc((size_t)(batch * m * n) * 4);
  ck_assert(A && B && C && W);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < na; i++) {
    uint64_t r = rng_next(&s);
    A[i] = r % 61 == 0   ? (uint16_t)(0x7FC0 | (r >> 8 & 0x3F))
           : r % 97 == 0 ? 0xFF80
                         : (uint16_t)(0x3C00 + (r >> 16) % 0x0600) |
                               (uint16_t)((r >> 40 & 1) << 15);
  }
  for (size_t i = 0; i < nb; i++) {
    uint64_t r = rng_next(&s);
    B[i] = r % 53 == 0 ? (uint16_t)(0xFFC0 | (r >> 8 & 0x3F))
                       : (uint16_t)(0x3C00 + (r >> 16) % 0x0600) |
                             (uint16_t)((r >> 40 & 1) << 15);
  }
  topos_gemm_task g = {.dtype = TOPOS_BF16,
                       .batch = batch,
                       .m = m,
                       .n = n,
                       .k = k,
                       .a = A,
                       .a_row = k,
                       .a_col = 1,
                       .a_batch = m * k,
                       .b = B,
                       .b_row = b_trans ? bstride : n * bstride,
                       .b_col = b_trans ? k * bstride : bstride,
                       .b_batch = k * n * bstride,
                       .c = C,
                       .c_row = n,
                       .c_col = 1,
                       .c_batch = m * n};
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int64_t p = 0; p < k; p++)
          acc = ref_fmaf(
              widen_bf16(A[b * m * k + i * k + p]),
              widen_bf16(B[b * g.b_batch + p * g.b_row + j * g.b_col]), acc);
        W[b * m * n + i * n + j] = acc;
      }
  const topos_backend *cpu = topos_cpu_backend();
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = threads};
  t.u.gemm = g;
  ck_assert(cpu->supports(cpu, &t) || m * n * k < 4096);
  topos_error err = {0};
  ck_assert_int_eq(cpu->run(cpu, &t, &err), TOPOS_OK);
  size_t at = 0, total = (size_t)(batch * m * n);
  while (at < total && memcmp(C + at, W + at, 4) == 0) at++;
  uint32_t got = 0, want = 0;
  if (at < total) {
    memcpy(&got, C + at, 4);
    memcpy(&want, W + at, 4);
  }
  ck_assert_msg(at == total,
                "bf16 m=%lld n=%lld k=%lld trans=%d strided=%d threads=%d "
                "isa=%s: element %zu is 0x%08x, the widened f32 chain gives "
                "0x%08x",
                (long long)m, (long long)n, (long long)k, b_trans, b_strided,
                threads, topos_cpu_isa(), at, got, want);
  free(A);
  free(B);
  free(C);
  free(W);
}

START_TEST(bf16_products) {
  const char *isas[] = {"avx512", "avx2", "c"};
  const int64_t shapes[][3] = {{1, 257, 63},  {1, 2100, 17}, {1, 33, 300},
                               {5, 100, 70},  {17, 65, 63},  {1, 16, 16},
                               {64, 64, 600}, {2, 7, 1}};
  int c = 0;
  for (int is = 0; is < 3; is++) {
    if (topos_cpu_force_isa(isas[is]) != 0) continue;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
      for (int lay = 0; lay < 3; lay++, c++)
        check_bf16(1 + c % 2, shapes[i][0], shapes[i][1], shapes[i][2],
                   lay == 1, lay == 2, 1 + c % 3, (uint64_t)c);
  }
  restore();
  /* the tied head of a bf16 GPT-2 decode step */
  check_bf16(1, 1, 50257, 768, true, false, 2, 99);
}
END_TEST

/* ------------------------------------------------------ through the engine */

static topos_value input_of(topos_tape *t, topos_dtype d, int rank,
                            const int64_t *shape, uint64_t seed) {
  topos_tensor *x = tt_random(d, rank, shape, seed, -1, 1);
  topos_value v = topos_input(t, x);
  topos_tensor_release(x);
  return v;
}

static topos_value param_of(topos_tape *t, topos_dtype d, int rank,
                            const int64_t *shape, uint64_t seed, double lo,
                            double hi) {
  topos_tensor *x = tt_random(d, rank, shape, seed, lo, hi);
  topos_value v = topos_parameter(t, x);
  topos_tensor_release(x);
  ck_assert(topos_value_ok(v));
  return v;
}

static topos_network *seal(topos_tape *t) {
  const char *e = topos_tape_error(t);
  ck_assert_msg(e == NULL, "record: %s", e);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

static void expect_same(const topos_tensor *a, const topos_tensor *b,
                        const char *what) {
  ck_assert_msg(a && b, "%s: missing value", what);
  ck_assert_msg(topos_tensor_bitwise_equal(a, b), "%s: bits differ", what);
}

/* Matmuls of plain, transposed, narrowed and batched operands: the engine
 * with the chain on gives the bits it gives with the chain off, and the
 * cpu backend did run. */
START_TEST(engine_matmul) {
  topos_backends_register_defaults();
  const topos_dtype dts[3] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = dts[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value a = input_of(t, dt, 2, S(65, 63), 1);
    topos_value b = input_of(t, dt, 2, S(63, 17), 2);
    topos_value bt = input_of(t, dt, 2, S(17, 63), 3);
    topos_value big = input_of(t, dt, 2, S(80, 90), 4);
    topos_value a3 = input_of(t, dt, 3, S(3, 16, 64), 5);
    topos_value b3 = input_of(t, dt, 3, S(3, 64, 255), 6);
    topos_value roots[5];
    roots[0] = topos_matmul(t, a, b);
    roots[1] = topos_matmul(t, a, topos_transpose(t, bt));
    roots[2] =
        topos_matmul(t, topos_transpose(t, topos_narrow(t, big, 0, 7, 63)),
                     topos_narrow(t, topos_narrow(t, big, 0, 3, 63), 1, 5, 70));
    roots[3] = topos_matmul(t, a3, b3);
    roots[4] = topos_matmul(t, topos_transpose(t, b), topos_transpose(t, a));
    topos_network *net = seal(t);
    for (int th = 1; th <= 4; th++) {
      backend_set_threads(th);
      topos_error err = {0};
      unsigned long long before = topos_cpu_tasks_run();
      topos_run *ref = topos_forward(net, NULL, NULL, 0, &TEST_REFERENCE, &err);
      ck_assert_msg(ref != NULL, "%s", err.message);
      ck_assert_int_eq(topos_cpu_tasks_run(), before);
      topos_run *got = topos_forward(net, NULL, NULL, 0, NULL, &err);
      ck_assert_msg(got != NULL, "%s", err.message);
      /* bf16 products too: bf16 operands in place, f32 out (backend.h) */
      ck_assert_int_ge(topos_cpu_tasks_run(), before + 5);
      for (int r = 0; r < 5; r++) {
        const topos_tensor *x = topos_run_of(ref, roots[r], &err);
        const topos_tensor *y = topos_run_of(got, roots[r], &err);
        char what[64];
        snprintf(what, sizeof what, "%s root %d threads %d",
                 topos_dtype_name(dt), r, th);
        expect_same(x, y, what);
      }
      topos_run_free(ref);
      topos_run_free(got);
    }
    topos_network_release(net);
  }
  restore();
}
END_TEST

/* ----------------------------------------------- whole training steps */

typedef struct model {
  topos_network *net;
  topos_value loss;
  topos_tensor *xt, *yt;
  topos_feed feeds[2];
} model;

static topos_tensor *labels(int64_t n, int classes, uint64_t seed) {
  double *v = malloc(sizeof(double) * (size_t)n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  for (int64_t i = 0; i < n; i++) v[i] = (double)(rng_next(&s) % classes);
  topos_tensor *t = tt_tensor(TOPOS_I32, 1, S(n), v);
  free(v);
  return t;
}

/* 100-96-64-10 MLP, batch 48, tanh, cross-entropy. */
static model mlp(topos_dtype d) {
  model m = {0};
  const int64_t B = 48;
  topos_tape *t = topos_tape_new(d);
  topos_value w[3], b[3];
  const int64_t dims[4] = {100, 96, 64, 10};
  for (int l = 0; l < 3; l++) {
    w[l] = param_of(t, d, 2, S(dims[l], dims[l + 1]), 10 + l, -0.2, 0.2);
    b[l] = param_of(t, d, 1, S(dims[l + 1]), 20 + l, -0.1, 0.1);
  }
  m.xt = tt_random(d, 2, S(B, 100), 31, -1, 1);
  m.yt = labels(B, 10, 32);
  topos_value x = topos_input(t, m.xt);
  topos_value y = topos_input(t, m.yt);
  topos_value logits = topos_mlp(t, x, 3, w, b, TOPOS_ACT_TANH);
  m.loss = topos_cross_entropy(t, logits, y);
  m.net = seal(t);
  m.feeds[0] = (topos_feed){x, m.xt};
  m.feeds[1] = (topos_feed){y, m.yt};
  return m;
}

/* conv 8 (3x3, pad 1) -> relu -> pool 2 -> conv 16 -> relu -> pool 2 ->
 * linear 10 on 16x16 images, batch 6. */
static model cnn(topos_dtype d) {
  model m = {0};
  const int64_t B = 6;
  topos_tape *t = topos_tape_new(d);
  topos_value w1 = param_of(t, d, 4, S(8, 1, 3, 3), 41, -0.5, 0.5);
  topos_value b1 = param_of(t, d, 1, S(8), 42, -0.1, 0.1);
  topos_value w2 = param_of(t, d, 4, S(16, 8, 3, 3), 43, -0.2, 0.2);
  topos_value b2 = param_of(t, d, 1, S(16), 44, -0.1, 0.1);
  topos_value w3 = param_of(t, d, 2, S(16 * 4 * 4, 10), 45, -0.1, 0.1);
  topos_value b3 = param_of(t, d, 1, S(10), 46, -0.1, 0.1);
  m.xt = tt_random(d, 4, S(B, 1, 16, 16), 47, -1, 1);
  m.yt = labels(B, 10, 48);
  topos_value x = topos_input(t, m.xt);
  topos_value y = topos_input(t, m.yt);
  topos_value h = topos_relu(t, topos_conv2d(t, x, w1, b1, 1, 1, 1));
  h = topos_max_pool2d(t, h, 2, 2);
  h = topos_relu(t, topos_conv2d(t, h, w2, b2, 1, 1, 1));
  h = topos_max_pool2d(t, h, 2, 2);
  h = topos_reshape(t, h, 2, S(B, 16 * 4 * 4));
  m.loss = topos_cross_entropy(t, topos_linear(t, h, w3, TOPOS_NONE), y);
  (void)b3;
  m.net = seal(t);
  m.feeds[0] = (topos_feed){x, m.xt};
  m.feeds[1] = (topos_feed){y, m.yt};
  return m;
}

static void model_free(model *m) {
  topos_tensor_release(m->xt);
  topos_tensor_release(m->yt);
  topos_network_release(m->net);
}

/* Three SGD steps (momentum) through the interpreter (plan = false) or a
 * training plan; returns the final parameters and the last loss. */
static topos_params *train(const model *m, bool use_plan, const topos_exec *ctx,
                           double *loss_out) {
  topos_error err = {0};
  topos_optimizer opt = topos_sgd(0.05, 0.9);
  topos_params *p = topos_network_parameters(m->net);
  topos_opt_state *st = topos_opt_state_new(&opt, p, &err);
  ck_assert_ptr_nonnull(st);
  topos_plan *plan = NULL;
  if (use_plan) {
    topos_entry e = {
        &m->loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_EXACT};
    plan = topos_network_lower(m->net, &e, &err);
    ck_assert_msg(plan != NULL, "lower: %s", err.message);
  }
  for (int step = 0; step < 3; step++) {
    topos_run *run = plan ? topos_plan_forward(plan, p, m->feeds, 2, ctx, &err)
                          : topos_forward(m->net, p, m->feeds, 2, ctx, &err);
    ck_assert_msg(run != NULL, "forward: %s", err.message);
    *loss_out = topos_run_scalar(run, m->loss, &err);
    topos_field *g = plan ? topos_plan_backward(plan, run, ctx, &err)
                          : topos_backward(run, m->loss, ctx, &err);
    ck_assert_msg(g != NULL, "backward: %s", err.message);
    topos_params *gp = topos_parameters_of(g, &err);
    ck_assert_ptr_nonnull(gp);
    topos_params *p2 = NULL;
    topos_opt_state *st2 = NULL;
    ck_assert_int_eq(topos_optimizer_step(&opt, p, gp, st, &p2, &st2, &err),
                     TOPOS_OK);
    topos_params_free(gp);
    topos_field_free(g);
    topos_run_free(run);
    topos_params_free(p);
    topos_opt_state_free(st);
    p = p2;
    st = st2;
  }
  topos_opt_state_free(st);
  topos_plan_free(plan);
  return p;
}

static void expect_training_identical(model (*make)(topos_dtype),
                                      const char *name) {
  topos_backends_register_defaults();
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    model m = make(dt);
    for (int use_plan = 0; use_plan < 2; use_plan++) {
      double l0, l1;
      topos_params *ref = train(&m, use_plan, &TEST_REFERENCE, &l0);
      for (int th = 1; th <= 3; th += 2) {
        backend_set_threads(th);
        unsigned long long before = topos_cpu_tasks_run();
        topos_params *got = train(&m, use_plan, NULL, &l1);
        ck_assert_msg(topos_cpu_tasks_run() > before,
                      "%s: the cpu backend never ran", name);
        ck_assert_msg(memcmp(&l0, &l1, sizeof l0) == 0,
                      "%s %s plan=%d threads=%d: loss %.17g vs %.17g", name,
                      topos_dtype_name(dt), use_plan, th, l0, l1);
        ck_assert_int_eq(topos_params_count(got), topos_params_count(ref));
        for (int s = 0; s < topos_params_count(ref); s++) {
          char what[96];
          snprintf(what, sizeof what, "%s %s plan=%d threads=%d param %d", name,
                   topos_dtype_name(dt), use_plan, th, s);
          expect_same(topos_params_get(ref, s), topos_params_get(got, s), what);
        }
        topos_params_free(got);
      }
      topos_params_free(ref);
    }
    model_free(&m);
  }
  restore();
}

START_TEST(mlp_training_identical) {
  expect_training_identical(mlp, "mlp");
}
END_TEST

START_TEST(cnn_training_identical) {
  expect_training_identical(cnn, "cnn");
}
END_TEST

/* ------------------------------------------------- numerics routing */

static atomic_int spy_offers;

static bool spy_supports(const topos_backend *self, const topos_task *task) {
  atomic_fetch_add(&spy_offers, 1);
  return false; /* declines: the result never changes */
}

static const topos_backend spy = {.name = "test-envelope-spy",
                                  .fidelity = TOPOS_FIDELITY_ENVELOPE,
                                  .supports = spy_supports,
                                  .run = never_run};

/* Envelope backends are offered tasks only under a fast plan (forward and
 * its backward); the interpreter and exact plans never reach them, and a
 * fast run leaves the thread exact again. */
START_TEST(numerics_routing) {
  topos_backends_register_defaults();
  ck_assert_int_eq(topos_backend_register(&spy), TOPOS_OK);
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value w = param_of(t, TOPOS_F32, 2, S(3, 2), 1, -1, 1);
  topos_value x = input_of(t, TOPOS_F32, 2, S(2, 3), 2);
  topos_value loss =
      topos_sum(t, topos_matmul(t, x, w)); /* too small for cpu */
  topos_network *net = seal(t);
  topos_error err = {0};
  for (int fast = 0; fast < 2; fast++) {
    topos_entry e = {&loss,
                     1,
                     NULL,
                     0,
                     TOPOS_POSTURE_TRAINING,
                     fast ? TOPOS_NUMERICS_FAST : TOPOS_NUMERICS_EXACT};
    topos_plan *plan = topos_network_lower(net, &e, &err);
    ck_assert_ptr_nonnull(plan);
    atomic_store(&spy_offers, 0);
    topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    int fwd = atomic_load(&spy_offers);
    topos_field *g = topos_plan_backward(plan, run, NULL, &err);
    ck_assert_ptr_nonnull(g);
    int bwd = atomic_load(&spy_offers) - fwd;
    if (fast) {
      ck_assert_int_ge(fwd, 1);
      ck_assert_int_ge(bwd, 1);
    } else {
      ck_assert_int_eq(fwd + bwd, 0);
    }
    topos_field_free(g);
    topos_run_free(run);
    topos_plan_free(plan);
    /* the interpreter stays exact */
    atomic_store(&spy_offers, 0);
    run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    ck_assert_ptr_nonnull(run);
    g = topos_backward(run, loss, NULL, &err);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(atomic_load(&spy_offers), 0);
    topos_field_free(g);
    topos_run_free(run);
  }
  topos_network_release(net);
  restore();
}
END_TEST

Suite *cpu_suite(void) {
  Suite *s = suite_create("cpu");
  TCase *tc = tcase_create("registry");
  tcase_add_test(tc, registry);
  tcase_add_test(tc, supports_thresholds);
  tcase_add_test(tc, threads_setting);
  tcase_add_test(tc, numerics_routing);
  suite_add_tcase(s, tc);
  TCase *g = tcase_create("gemm");
  tcase_set_timeout(g, 120);
  tcase_add_loop_test(g, sweep_f32, 0, 10);
  tcase_add_loop_test(g, sweep_f64, 0, 10);
  tcase_add_test(g, square_threads);
  tcase_add_test(g, layouts);
  tcase_add_test(g, direct_b);
  tcase_add_test(g, batched);
  tcase_add_test(g, special_values);
  tcase_add_test(g, every_isa);
  tcase_add_test(g, gemv_one_row);
  tcase_add_test(g, gemv_special_values);
  tcase_add_test(g, bf16_products);
  suite_add_tcase(s, g);
  /* Large products checked against a scalar reference: a longer hang
   * guard (stretched again under the sanitizers). */
  TCase *rb = tcase_create("row blocks");
  tcase_set_timeout(rb, 400);
  tcase_add_test(rb, row_blocks);
  suite_add_tcase(s, rb);
  TCase *e = tcase_create("engine");
  tcase_set_timeout(e, 120);
  tcase_add_test(e, engine_matmul);
  tcase_add_test(e, mlp_training_identical);
  tcase_add_test(e, cnn_training_identical);
  suite_add_tcase(s, e);
  return s;
}
