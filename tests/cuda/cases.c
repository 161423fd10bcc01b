/*
 * cases.c - the CUDA suites (cases.h).
 *
 * Exact cases compare bit patterns with memcmp against ref.c.  A task
 * whose reference output holds a NaN must come back TOPOS_ERR_RANGE (the
 * plugin hands NaN outputs back, because a GPU does not keep NaN
 * payloads); any other task must run and match.  Inputs are the sweep
 * the cpu backend's suite uses, with NaN, ±Inf, ±0, subnormals and
 * values that overflow mid-chain.
 */
#include "cases.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

/* ------------------------------------------------------------- helpers */

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double unif(uint64_t *s) { /* [-1, 1) */
  return (double)(rng(s) >> 11) / 4503599627370496.0 - 1.0;
}

static size_t esize(topos_dtype dt) {
  return dt == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

static void put(topos_dtype dt, void *p, int64_t i, double v) {
  if (dt == TOPOS_F64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

static double get(topos_dtype dt, const void *p, int64_t i) {
  return dt == TOPOS_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static const double specials[] = {NAN,     INFINITY, -INFINITY, -0.0,
                                  0.0,     1e38,     -1e38,     1e-40,
                                  -1e-310, 1e308,    1e-45,     -3e-39};
#define NSPECIAL ((int)(sizeof specials / sizeof specials[0]))

/* n values of dtype: uniform in [-scale, scale), and one in `every` (0:
 * none) a special value. */
static void *fill(topos_dtype dt, int64_t n, uint64_t seed, double scale,
                  int every) {
  void *p = malloc((size_t)(n > 0 ? n : 1) * esize(dt));
  if (!p) abort();
  uint64_t s = seed * 7919 + 17;
  for (int64_t i = 0; i < n; i++) {
    double v = unif(&s) * scale;
    if (every > 0 && rng(&s) % (uint64_t)every == 0)
      v = specials[rng(&s) % NSPECIAL];
    put(dt, p, i, v);
  }
  return p;
}

static bool any_nan(topos_dtype dt, const void *p, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (isnan(get(dt, p, i))) return true;
  return false;
}

static void **out_slot(topos_task *t) {
  switch (t->kind) {
    case TOPOS_TASK_GEMM:
      return &t->u.gemm.c;
    case TOPOS_TASK_WINDOW:
      return &t->u.window.out;
    case TOPOS_TASK_REDUCE:
      return &t->u.reduce.y;
    default:
      return &t->u.map.y;
  }
}

static void run_ref(topos_task *t) {
  switch (t->kind) {
    case TOPOS_TASK_GEMM:
      ref_gemm(&t->u.gemm);
      break;
    case TOPOS_TASK_WINDOW:
      ref_window(&t->u.window);
      break;
    case TOPOS_TASK_REDUCE:
      ref_reduce(&t->u.reduce);
      break;
    default:
      ref_map(&t->u.map);
      break;
  }
}

/*
 * Runs t (its output: n elements of dt, dense) on the exact backend and
 * on the reference; 0 when the backend's bits are the reference's, or it
 * handed back a task whose reference output holds a NaN.
 */
static int expect_exact(const cuda_env *env, topos_task t, topos_dtype dt,
                        int64_t n, const char *what, char *msg, size_t len,
                        long *checks) {
  size_t bytes = (size_t)(n > 0 ? n : 1) * esize(dt);
  void *ref = malloc(bytes), *got = malloc(bytes);
  if (!ref || !got) abort();
  memset(got, 0xa5, bytes);
  topos_task r = t;
  *out_slot(&r) = ref;
  run_ref(&r);
  *out_slot(&t) = got;
  topos_error err = {0};
  t.threads = 1;
  int rc = env->exact->run(env->exact, &t, &err);
  bool nan = any_nan(dt, ref, n);
  int bad = 0;
  (*checks)++;
  bool libm = t.kind == TOPOS_TASK_MAP &&
              (t.u.map.op == TOPOS_MAP_EXP || t.u.map.op == TOPOS_MAP_LOG ||
               t.u.map.op == TOPOS_MAP_TANH);
  if (rc == TOPOS_ERR_RANGE && nan) {
    /* handed back: the reference computes it */
  } else if (rc == TOPOS_ERR_ARGUMENT && libm) {
    /* The plugin's self-check found this host's libm computing otherwise
     * than the glibc the kernels replay: not offered, which is right. */
    fprintf(stderr,
            "note: %s: not offered (this host's libm differs from "
            "glibc 2.36's)\n",
            what);
  } else if (rc != 0) {
    snprintf(msg, len, "%s: run failed (%d): %s%s", what, rc, err.message,
             nan ? "" : " (the reference output has no NaN)");
    bad = 1;
  } else if (nan) {
    snprintf(msg, len, "%s: ran although the reference output holds a NaN",
             what);
    bad = 1;
  } else if (memcmp(ref, got, (size_t)n * esize(dt)) != 0) {
    int64_t i = 0;
    while (memcmp((char *)ref + i * esize(dt), (char *)got + i * esize(dt),
                  esize(dt)) == 0)
      i++;
    snprintf(msg, len, "%s: element %lld of %lld differs: %.17g vs %.17g (%a)",
             what, (long long)i, (long long)n, get(dt, got, i), get(dt, ref, i),
             get(dt, ref, i));
    bad = 1;
  }
  free(ref);
  free(got);
  return bad;
}

typedef enum layout { ROW, TRANS, ROW_PAD, TRANS_PAD, NLAYOUT } layout;

/* A rows x cols operand in layout l: its buffer and strides. */
typedef struct mat {
  void *p;
  int64_t row, col, count;
} mat;

static mat mat_new(topos_dtype dt, layout l, int64_t batch, int64_t rows,
                   int64_t cols, uint64_t seed, double scale, int every) {
  int64_t pad = l == ROW_PAD || l == TRANS_PAD ? 3 : 0;
  mat m;
  if (l == ROW || l == ROW_PAD) {
    m.row = cols + pad;
    m.col = 1;
    m.count = rows * m.row;
  } else {
    m.row = 1;
    m.col = rows + pad;
    m.count = cols * m.col;
  }
  m.p = fill(dt, batch * m.count, seed, scale, every);
  return m;
}

static topos_task gemm_task(topos_dtype dt, int64_t batch, int64_t m, int64_t n,
                            int64_t k, const mat *A, const mat *B,
                            bool shared_b) {
  topos_task t = {.kind = TOPOS_TASK_GEMM};
  t.u.gemm = (topos_gemm_task){.dtype = dt,
                               .batch = batch,
                               .m = m,
                               .n = n,
                               .k = k,
                               .a = A->p,
                               .a_row = A->row,
                               .a_col = A->col,
                               .a_batch = A->count,
                               .b = B->p,
                               .b_row = B->row,
                               .b_col = B->col,
                               .b_batch = shared_b ? 0 : B->count,
                               .c_row = n,
                               .c_col = 1,
                               .c_batch = m * n};
  return t;
}

static int one_gemm(const cuda_env *env, topos_dtype dt, int64_t batch,
                    int64_t m, int64_t n, int64_t k, layout la, layout lb,
                    bool shared_b, uint64_t seed, int every, const char *what,
                    char *msg, size_t len, long *checks) {
  mat A = mat_new(dt, la, batch, m, k, seed, 1.0, every);
  mat B = mat_new(dt, lb, shared_b ? 1 : batch, k, n, seed + 1, 1.0, every);
  topos_task t = gemm_task(dt, batch, m, n, k, &A, &B, shared_b);
  char tag[160];
  snprintf(tag, sizeof tag,
           "%s %s batch %lld m %lld n %lld k %lld layouts %d/%d", what,
           dt == TOPOS_F64 ? "f64" : "f32", (long long)batch, (long long)m,
           (long long)n, (long long)k, (int)la, (int)lb);
  int rc = expect_exact(env, t, dt, batch * m * n, tag, msg, len, checks);
  free(A.p);
  free(B.p);
  return rc;
}

static const int64_t sweep[] = {1, 7, 15, 16, 17, 63, 64, 65, 255, 257};

/* --------------------------------------------------------------- cases */

/* The cpu suite's sweep: every (m, n, k) of {1 .. 257}³, both dtypes,
 * layouts taking turns. */
static int case_gemm_sweep(const cuda_env *env, char *msg, size_t len,
                           long *checks) {
  int c = 0;
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < 10; i++)
      for (int j = 0; j < 10; j++)
        for (int l = 0; l < 10; l++, c++)
          if ((!env->sim || c % 7 == 0) &&
              one_gemm(env, d ? TOPOS_F64 : TOPOS_F32, 1, sweep[i], sweep[j],
                       sweep[l], (layout)(c % NLAYOUT),
                       (layout)((c / NLAYOUT) % NLAYOUT), false, (uint64_t)c, 0,
                       "sweep", msg, len, checks))
            return 1;
  return 0;
}

/* Batches (a shared, stride-0 B among them), k = 0, a vector. */
static int case_gemm_batches(const cuda_env *env, char *msg, size_t len,
                             long *checks) {
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    if (one_gemm(env, dt, 3, 65, 17, 130, ROW, TRANS, false, 1, 0, "batch", msg,
                 len, checks) ||
        one_gemm(env, dt, 5, 64, 7, 255, TRANS_PAD, ROW_PAD, true, 2, 0,
                 "shared B", msg, len, checks) ||
        one_gemm(env, dt, 2, 1, 257, 16, ROW, TRANS, false, 3, 0, "row", msg,
                 len, checks) ||
        one_gemm(env, dt, 1, 9, 11, 0, ROW, ROW, false, 4, 0, "k = 0", msg, len,
                 checks) ||
        one_gemm(env, dt, 1, 300, 1, 333, ROW, ROW, false, 5, 0, "column", msg,
                 len, checks))
      return 1;
  }
  return 0;
}

/* Bigger than one tile in every direction, k many steps long. */
static int case_gemm_large(const cuda_env *env, char *msg, size_t len,
                           long *checks) {
  return one_gemm(env, TOPOS_F32, 1, 640, 576, 520, ROW, ROW, false, 11, 0,
                  "large", msg, len, checks) ||
         one_gemm(env, TOPOS_F32, 1, 333, 515, 777, TRANS, TRANS_PAD, false, 12,
                  0, "large", msg, len, checks) ||
         one_gemm(env, TOPOS_F64, 1, 300, 280, 260, ROW, TRANS, false, 13, 0,
                  "large", msg, len, checks);
}

/* NaN, ±Inf, ±0, overflow, subnormals; chains that end -0. */
static int case_gemm_specials(const cuda_env *env, char *msg, size_t len,
                              long *checks) {
  const int rates[] = {97, 13, 3};
  for (int d = 0; d < 2; d++)
    for (int r = 0; r < 3; r++)
      if (one_gemm(env, d ? TOPOS_F64 : TOPOS_F32, 1, 33, 47, 70, ROW, TRANS,
                   false, 20 + (uint64_t)r, rates[r], "specials", msg, len,
                   checks))
        return 1;
  /* Products that underflow to -0: the chain from +0.0 ends -0 in f32
   * (and tiny negatives in f64); a GPU adding +0 would end +0. */
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    int64_t m = 40, n = 40, k = 21;
    mat A = mat_new(dt, ROW, 1, m, k, 30, 1.0, 0);
    mat B = mat_new(dt, ROW, 1, k, n, 31, 1.0, 0);
    for (int64_t i = 0; i < m * k; i++)
      put(dt, A.p, i, (i % 2 ? -1 : 1) * (d ? 1e-200 : 1e-30));
    for (int64_t i = 0; i < k * n; i++)
      put(dt, B.p, i, (i % 3 ? 1 : -1) * (d ? 1e-200 : 1e-30));
    topos_task t = gemm_task(dt, 1, m, n, k, &A, &B, false);
    int rc = expect_exact(env, t, dt, m * n, "-0 chains", msg, len, checks);
    free(A.p);
    free(B.p);
    if (rc) return 1;
  }
  return 0;
}

static int one_window(const cuda_env *env, topos_dtype dt, int64_t n, int64_t c,
                      int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw,
                      int64_t stride, int64_t dil, int64_t pad, bool wt_trans,
                      int every, uint64_t seed, char *msg, size_t len,
                      long *checks) {
  int64_t oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
  int64_t ow = (w + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
  int64_t K = c * kh * kw;
  void *x = fill(dt, n * c * h * w, seed, 1.0, every);
  void *wt = fill(dt, K * o, seed + 1, 1.0, every);
  topos_task t = {.kind = TOPOS_TASK_WINDOW};
  t.u.window = (topos_window_task){.dtype = dt,
                                   .n = n,
                                   .c = c,
                                   .h = h,
                                   .w = w,
                                   .x = x,
                                   .o = o,
                                   .weight = wt,
                                   .w_row = wt_trans ? 1 : o,
                                   .w_col = wt_trans ? K : 1,
                                   .kh = kh,
                                   .kw = kw,
                                   .stride_h = stride,
                                   .stride_w = stride,
                                   .dil_h = dil,
                                   .dil_w = dil,
                                   .pad_top = pad,
                                   .pad_left = pad,
                                   .oh = oh,
                                   .ow = ow};
  char tag[160];
  snprintf(tag, sizeof tag,
           "window %s n %lld c %lld %lldx%lld o %lld k %lldx%lld s %lld d "
           "%lld p %lld",
           dt == TOPOS_F64 ? "f64" : "f32", (long long)n, (long long)c,
           (long long)h, (long long)w, (long long)o, (long long)kh,
           (long long)kw, (long long)stride, (long long)dil, (long long)pad);
  int rc = expect_exact(env, t, dt, n * oh * ow * o, tag, msg, len, checks);
  free(x);
  free(wt);
  return rc;
}

static int case_window(const cuda_env *env, char *msg, size_t len,
                       long *checks) {
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    if (one_window(env, dt, 8, 1, 28, 28, 8, 3, 3, 1, 1, 1, false, 0, 1, msg,
                   len, checks) || /* LeNet conv1 */
        one_window(env, dt, 4, 8, 14, 14, 16, 3, 3, 1, 1, 1, true, 0, 2, msg,
                   len, checks) || /* conv2 */
        one_window(env, dt, 2, 3, 17, 13, 17, 3, 3, 2, 1, 1, false, 0, 3, msg,
                   len, checks) ||
        one_window(env, dt, 1, 6, 20, 20, 33, 5, 5, 3, 1, 2, true, 0, 4, msg,
                   len, checks) ||
        one_window(env, dt, 2, 2, 15, 15, 3, 3, 3, 1, 2, 2, false, 0, 5, msg,
                   len, checks) || /* dilation */
        one_window(env, dt, 3, 16, 9, 9, 7, 1, 1, 1, 1, 0, false, 0, 6, msg,
                   len, checks) || /* 1 x 1 */
        one_window(env, dt, 1, 64, 8, 8, 20, 3, 3, 1, 1, 1, true, 0, 7, msg,
                   len, checks) || /* K = 576 */
        one_window(env, dt, 2, 3, 10, 10, 9, 3, 3, 1, 1, 1, false, 5, 8, msg,
                   len, checks) || /* specials */
        one_window(env, dt, 2, 3, 10, 10, 1, 3, 3, 1, 1, 2, true, 0, 9, msg,
                   len, checks))
      return 1;
  }
  /* Tiny products whose chains end -0 unless a padded position (fma with
   * +0) comes last: border outputs +0, interior ones -0. */
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
    int64_t c = 2, h = 6, w = 6, o = 2, K = c * 9;
    void *x = fill(dt, c * h * w, 40, 1.0, 0), *wt = fill(dt, K * o, 41, 1, 0);
    for (int64_t i = 0; i < c * h * w; i++) put(dt, x, i, d ? 1e-200 : 1e-30);
    for (int64_t i = 0; i < K * o; i++) put(dt, wt, i, d ? -1e-200 : -1e-30);
    topos_task t = {.kind = TOPOS_TASK_WINDOW};
    t.u.window = (topos_window_task){.dtype = dt,
                                     .n = 1,
                                     .c = c,
                                     .h = h,
                                     .w = w,
                                     .x = x,
                                     .o = o,
                                     .weight = wt,
                                     .w_row = o,
                                     .w_col = 1,
                                     .kh = 3,
                                     .kw = 3,
                                     .stride_h = 1,
                                     .stride_w = 1,
                                     .dil_h = 1,
                                     .dil_w = 1,
                                     .pad_top = 1,
                                     .pad_left = 1,
                                     .oh = h,
                                     .ow = w};
    int rc = expect_exact(env, t, dt, h * w * o, "window -0", msg, len, checks);
    free(x);
    free(wt);
    if (rc) return 1;
  }
  return 0;
}

static int case_reduce(const cuda_env *env, char *msg, size_t len,
                       long *checks) {
  const int64_t shapes[][3] = {{1, 0, 1},      {3, 1, 5},      {7, 16, 3},
                               {7, 17, 3},     {2, 100, 1},    {1, 5000, 1},
                               {3, 70001, 1},  {64, 33, 129},  {5, 4097, 2},
                               {40000, 20, 1}, {1, 1 << 20, 1}};
  int c = 0;
  for (int d = 0; d < 2; d++)
    for (int every = 0; every <= 41; every += 41)
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++, c++) {
        topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
        int64_t outer = shapes[s][0], L = shapes[s][1], inner = shapes[s][2];
        void *x = fill(dt, outer * L * inner, (uint64_t)c, 100.0, every);
        topos_task t = {.kind = TOPOS_TASK_REDUCE};
        t.u.reduce = (topos_reduce_task){
            .dtype = dt, .outer = outer, .L = L, .inner = inner, .x = x};
        char tag[128];
        snprintf(tag, sizeof tag, "reduce %s %lld x %lld x %lld%s",
                 d ? "f64" : "f32", (long long)outer, (long long)L,
                 (long long)inner, every ? " specials" : "");
        int rc = expect_exact(env, t, dt, outer * inner, tag, msg, len, checks);
        free(x);
        if (rc) return 1;
      }
  return 0;
}

static int case_map(const cuda_env *env, char *msg, size_t len, long *checks) {
  const int64_t n = 100003;
  for (int d = 0; d < 2; d++)
    for (int op = TOPOS_MAP_NEG; op < TOPOS_MAP_COUNT; op++)
      for (int every = 0; every <= 7; every += 7) {
        topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
        bool binary = op >= TOPOS_MAP_ADD;
        double scale = op == TOPOS_MAP_EXP ? 100 : 30;
        void *a = fill(dt, n, (uint64_t)(op * 10 + every + d), scale, every);
        void *b = binary ? fill(dt, n, (uint64_t)(op * 10 + every + d + 500),
                                scale, every)
                         : NULL;
        if (!every && (op == TOPOS_MAP_LOG || op == TOPOS_MAP_SQRT))
          for (int64_t i = 0; i < n; i++)
            put(dt, a, i, fabs(get(dt, a, i)) * (i % 5 ? 1 : 1e-36));
        topos_task t = {.kind = TOPOS_TASK_MAP};
        t.u.map = (topos_map_task){.dtype = dt,
                                   .op = (topos_map_op)op,
                                   .p = 2.0,
                                   .n = n,
                                   .a = a,
                                   .b = b};
        char tag[96];
        snprintf(tag, sizeof tag, "map op %d %s%s", op, d ? "f64" : "f32",
                 every ? " specials" : "");
        bool want = op != TOPOS_MAP_POW &&
                    !(d && (op == TOPOS_MAP_EXP || op == TOPOS_MAP_LOG ||
                            op == TOPOS_MAP_TANH));
        int rc = 0;
        if (want) {
          rc = expect_exact(env, t, dt, n, tag, msg, len, checks);
        } else {
          /* Not computed on the device: declined, never guessed. */
          void *y = malloc((size_t)n * esize(dt));
          t.u.map.y = y;
          topos_error err = {0};
          (*checks)++;
          if (env->exact->supports(env->exact, &t) ||
              env->exact->run(env->exact, &t, &err) == 0) {
            snprintf(msg, len,
                     "%s: taken, but the device has no exact "
                     "kernel for it",
                     tag);
            rc = 1;
          }
          free(y);
        }
        free(a);
        free(b);
        if (rc) return 1;
      }
  return 0;
}

/* One attention task: q [batch, t, dh], k given as [batch, dh, s] or as
 * the transposed view of [batch, s, dh], v [batch, s, dv], a scale
 * broadcast over the row (stride 0) and a causal mask when asked, every
 * optional row output when `rows`. */
static int one_attention(const cuda_env *env, topos_dtype dt, int64_t batch,
                         int64_t t, int64_t s, int64_t dh, int64_t dv,
                         bool k_view, bool scale, bool causal, bool rows,
                         int every, uint64_t seed, char *msg, size_t len,
                         long *checks) {
  size_t es = esize(dt);
  void *q = fill(dt, batch * t * dh, seed, 1.0, every);
  void *k = fill(dt, batch * dh * s, seed + 1, 1.0, every);
  void *v = fill(dt, batch * s * dv, seed + 2, 1.0, every);
  void *sc = fill(dt, batch * t, seed + 3, 0.5, 0);
  void *mk = fill(dt, batch * t * s, seed + 4, 0.0, 0);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < t; i++)
      for (int64_t j = 0; j < s; j++)
        put(dt, mk, (b * t + i) * s + j, j > i + (s - t) ? -INFINITY : 0.0);
  topos_task tk = {.kind = TOPOS_TASK_ATTENTION};
  topos_attention_task *a = &tk.u.attention;
  *a = (topos_attention_task){.dtype = dt,
                              .batch = batch,
                              .t = t,
                              .s = s,
                              .dh = dh,
                              .dv = dv,
                              .q = q,
                              .q_batch = t * dh,
                              .q_row = dh,
                              .q_col = 1,
                              .k = k,
                              .k_batch = dh * s,
                              .k_row = k_view ? 1 : s,
                              .k_col = k_view ? dh : 1,
                              .v = v,
                              .v_batch = s * dv,
                              .v_row = dv,
                              .v_col = 1,
                              .scale = scale ? sc : NULL,
                              .scale_batch = t,
                              .scale_row = 1,
                              .scale_col = 0,
                              .mask = causal ? mk : NULL,
                              .mask_batch = t * s,
                              .mask_row = s,
                              .mask_col = 1};
  size_t ob = (size_t)(batch * t * dv) * es, rb = (size_t)(batch * t * s) * es;
  void *ref[6], *got[6];
  for (int o = 0; o < 6; o++) {
    ref[o] = (o == 0 || rows) ? malloc(o ? rb : ob) : NULL;
    got[o] = (o == 0 || rows) ? malloc(o ? rb : ob) : NULL;
    if (got[o]) memset(got[o], 0xa5, o ? rb : ob);
  }
  /* Rows the task has no step for stay unwritten: make them equal. */
  if (rows) {
    memset(ref[2], 0xa5, rb);
    memset(ref[3], 0xa5, rb);
  }
  topos_task r = tk;
  topos_attention_task *ra = &r.u.attention;
  ra->out = ref[0];
  ra->raw = ref[1];
  ra->scaled = ref[2];
  ra->masked = ref[3];
  ra->logp = ref[4];
  ra->probs = ref[5];
  ref_attention(ra);
  a->out = got[0];
  a->raw = got[1];
  a->scaled = got[2];
  a->masked = got[3];
  a->logp = got[4];
  a->probs = got[5];
  topos_error err = {0};
  tk.threads = 1;
  int rc = env->exact->run(env->exact, &tk, &err);
  bool nan = any_nan(dt, ref[0], batch * t * dv);
  for (int o = 1; o < 6 && rows; o++)
    if ((o != 2 || scale) && (o != 3 || causal))
      nan |= any_nan(dt, ref[o], batch * t * s);
  char tag[160];
  snprintf(tag, sizeof tag,
           "attention %s batch %lld t %lld s %lld dh %lld dv %lld%s%s%s%s",
           dt == TOPOS_F64 ? "f64" : "f32", (long long)batch, (long long)t,
           (long long)s, (long long)dh, (long long)dv, k_view ? " k-view" : "",
           scale ? " scale" : "", causal ? " causal" : "",
           every ? " specials" : "");
  int bad = 0;
  (*checks)++;
  if (dt == TOPOS_F64) {
    if (rc == 0) {
      snprintf(msg, len, "%s: ran, but the device has no exact f64 exp", tag);
      bad = 1;
    }
  } else if (rc == TOPOS_ERR_RANGE && nan) {
    /* handed back */
  } else if (rc == TOPOS_ERR_ARGUMENT) {
    fprintf(stderr, "note: %s: not offered (this host's libm differs)\n", tag);
  } else if (rc != 0) {
    snprintf(msg, len, "%s: run failed (%d): %s", tag, rc, err.message);
    bad = 1;
  } else if (nan) {
    snprintf(msg, len, "%s: ran although the reference holds a NaN", tag);
    bad = 1;
  } else {
    const char *names[6] = {"out", "raw", "scaled", "masked", "logp", "probs"};
    for (int o = 0; o < 6 && !bad; o++) {
      if (!ref[o]) continue;
      size_t n = o ? rb : ob;
      if (memcmp(ref[o], got[o], n) != 0) {
        size_t i = 0;
        while (memcmp((char *)ref[o] + i * es, (char *)got[o] + i * es, es) ==
               0)
          i++;
        snprintf(msg, len, "%s: %s element %zu differs: %.17g vs %.17g", tag,
                 names[o], i, get(dt, got[o], (int64_t)i),
                 get(dt, ref[o], (int64_t)i));
        bad = 1;
      }
    }
  }
  for (int o = 0; o < 6; o++) {
    free(ref[o]);
    free(got[o]);
  }
  free(q);
  free(k);
  free(v);
  free(sc);
  free(mk);
  return bad;
}

static int case_attention(const cuda_env *env, char *msg, size_t len,
                          long *checks) {
  return one_attention(env, TOPOS_F32, 2, 5, 7, 8, 8, false, false, false, true,
                       0, 1, msg, len, checks) ||
         one_attention(env, TOPOS_F32, 3, 17, 17, 16, 16, true, true, true,
                       true, 0, 2, msg, len, checks) ||
         one_attention(env, TOPOS_F32, 1, 64, 300, 32, 24, false, true, true,
                       false, 0, 3, msg, len, checks) ||
         one_attention(env, TOPOS_F32, 4, 1, 1, 4, 4, false, false, false, true,
                       0, 4, msg, len, checks) ||
         one_attention(env, TOPOS_F32, 2, 20, 40, 8, 130, true, true, false,
                       true, 0, 5, msg, len, checks) || /* dv past a block */
         one_attention(env, TOPOS_F32, 2, 9, 33, 8, 8, false, true, true, true,
                       9, 6, msg, len, checks) || /* specials */
         one_attention(env, TOPOS_F64, 1, 4, 4, 4, 4, false, false, false,
                       false, 0, 7, msg, len, checks);
}

/* expf, logf, tanhf over every 509th bit pattern whose libm result is not
 * NaN (8.4M inputs each): exact_math.h against this host's libm. */
static int case_math_sweep(const cuda_env *env, char *msg, size_t len,
                           long *checks) {
  if (env->sim) { /* millions of fibers; the cuda_math suite has it */
    snprintf(msg, len,
             "too slow on the simulator (exact_math.h is swept "
             "against libm by the cuda_math suite)");
    return CUDA_SKIP;
  }
  const int ops[] = {TOPOS_MAP_EXP, TOPOS_MAP_LOG, TOPOS_MAP_TANH};
  int64_t cap = ((int64_t)1 << 32) / 509 + 1;
  float *x = malloc((size_t)cap * sizeof(float));
  if (!x) abort();
  for (int o = 0; o < 3; o++) {
    int64_t n = 0;
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 509) {
      uint32_t b = (uint32_t)u;
      float v;
      memcpy(&v, &b, sizeof v);
      float r = ops[o] == TOPOS_MAP_EXP   ? expf(v)
                : ops[o] == TOPOS_MAP_LOG ? logf(v)
                                          : tanhf(v);
      if (!isnan(r)) x[n++] = v;
    }
    topos_task t = {.kind = TOPOS_TASK_MAP};
    t.u.map = (topos_map_task){
        .dtype = TOPOS_F32, .op = (topos_map_op)ops[o], .n = n, .a = x};
    const char *names[] = {"expf sweep", "logf sweep", "tanhf sweep"};
    if (expect_exact(env, t, TOPOS_F32, n, names[o], msg, len, checks)) {
      free(x);
      return 1;
    }
  }
  free(x);
  return 0;
}

/* cuBLAS: numerics.md's envelope on random inputs; NaN, Inf and inputs
 * that could overflow are declined (the exact chain computes them). */
static int case_cublas(const cuda_env *env, char *msg, size_t len,
                       long *checks) {
  if (!env->fast) {
    snprintf(msg, len, "no cublas backend (%s)",
             env->sim ? "the simulator runs the exact kernels only"
                      : "cuBLAS missing on this host");
    return env->sim ? CUDA_SKIP : CUDA_FAIL;
  }
  const int64_t shapes[][4] = {{1, 64, 64, 64},
                               {1, 200, 300, 100},
                               {1, 1000, 1000, 1000},
                               {1, 17, 257, 65},
                               {4, 128, 96, 200}};
  int c = 0;
  for (int d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int l = 0; l < NLAYOUT; l++, c++) {
        topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
        int64_t batch = shapes[s][0], m = shapes[s][1], n = shapes[s][2],
                k = shapes[s][3];
        mat A = mat_new(dt, (layout)l, batch, m, k, (uint64_t)c, 1.0, 0);
        mat B = mat_new(dt, (layout)((l + 1) % NLAYOUT), batch, k, n,
                        (uint64_t)c + 1, 1.0, 0);
        topos_task t = gemm_task(dt, batch, m, n, k, &A, &B, false);
        size_t bytes = (size_t)(batch * m * n) * esize(dt);
        void *ref = malloc(bytes), *got = malloc(bytes);
        topos_task r = t;
        r.u.gemm.c = ref;
        ref_gemm(&r.u.gemm);
        t.u.gemm.c = got;
        topos_error err = {0};
        int rc = env->fast->run(env->fast, &t, &err);
        double num = 0, den = 0;
        for (int64_t i = 0; i < batch * m * n; i++) {
          double e = get(dt, got, i) - get(dt, ref, i);
          num += e * e;
          den += get(dt, ref, i) * get(dt, ref, i);
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        double limit = d ? 1e-12 : 1e-5;
        (*checks)++;
        int bad = 0;
        if (rc != 0) {
          snprintf(msg, len, "cublas %lldx%lldx%lld: run failed: %s",
                   (long long)m, (long long)n, (long long)k, err.message);
          bad = 1;
        } else if (!(rel <= limit)) {
          snprintf(msg, len,
                   "cublas %s %lldx%lldx%lld layout %d: relative "
                   "L2 %.3g over %.0e",
                   d ? "f64" : "f32", (long long)m, (long long)n, (long long)k,
                   l, rel, limit);
          bad = 1;
        }
        /* A NaN operand: declined. */
        if (!bad) {
          put(dt, A.p, 0, NAN);
          (*checks)++;
          if (env->fast->run(env->fast, &t, &err) != TOPOS_ERR_RANGE) {
            snprintf(msg, len, "cublas took a NaN operand");
            bad = 1;
          }
          put(dt, A.p, 0, d ? 1e300 : 1e30);
          put(dt, B.p, 0, d ? 1e300 : 1e30);
          (*checks)++;
          if (!bad && env->fast->run(env->fast, &t, &err) != TOPOS_ERR_RANGE) {
            snprintf(msg, len, "cublas took operands that may overflow");
            bad = 1;
          }
        }
        free(A.p);
        free(B.p);
        free(ref);
        free(got);
        if (bad) return 1;
      }
  return 0;
}

/* An announced blob crosses the bus once: the second product finds B in
 * the device cache. */
static int case_blob_cache(const cuda_env *env, char *msg, size_t len,
                           long *checks) {
  if (!env->announce) {
    snprintf(msg, len, "no device memory to cache blobs in");
    return CUDA_SKIP;
  }
  topos_dtype dt = TOPOS_F32;
  int64_t m = 64, n = 256, k = 512;
  mat A = mat_new(dt, ROW, 1, m, k, 60, 1.0, 0);
  mat B = mat_new(dt, ROW, 1, k, n, 61, 1.0, 0);
  size_t bbytes = (size_t)(k * n) * sizeof(float);
  uint8_t hash[32];
  for (int i = 0; i < 32; i++) hash[i] = (uint8_t)(i * 37 + 11);
  if (env->announce(B.p, bbytes, hash) != 0) {
    snprintf(msg, len, "announce failed");
    return 1;
  }
  topos_device_info d0[TOPOS_DEVICES_MAX], d1[TOPOS_DEVICES_MAX],
      d2[TOPOS_DEVICES_MAX];
  int rc = 0;
  env->devices(d0, TOPOS_DEVICES_MAX);
  topos_task t = gemm_task(dt, 1, m, n, k, &A, &B, false);
  rc |= expect_exact(env, t, dt, m * n, "cached B, first", msg, len, checks);
  env->devices(d1, TOPOS_DEVICES_MAX);
  rc |= expect_exact(env, t, dt, m * n, "cached B, second", msg, len, checks);
  env->devices(d2, TOPOS_DEVICES_MAX);
  env->retract(B.p);
  (*checks)++;
  uint64_t up1 = d1[0].bytes_up - d0[0].bytes_up;
  uint64_t up2 = d2[0].bytes_up - d1[0].bytes_up;
  if (!rc && (d2[0].cache_hits <= d1[0].cache_hits ||
              up2 != (uint64_t)(m * k) * sizeof(float) || up1 < up2 + bbytes)) {
    snprintf(msg, len,
             "blob cache: hits %llu -> %llu, bytes up %llu then %llu (A is "
             "%llu, B %zu)",
             (unsigned long long)d1[0].cache_hits,
             (unsigned long long)d2[0].cache_hits, (unsigned long long)up1,
             (unsigned long long)up2,
             (unsigned long long)(m * k * sizeof(float)), bbytes);
    rc = 1;
  }
  free(A.p);
  free(B.p);
  return rc;
}

typedef struct thread_job {
  const cuda_env *env;
  int id, bad;
  long checks;
  char msg[256];
} thread_job;

static void *thread_main(void *arg) {
  thread_job *j = arg;
  for (int r = 0; r < 6 && !j->bad; r++)
    j->bad = one_gemm(j->env, r % 2 ? TOPOS_F64 : TOPOS_F32, 1 + r % 2,
                      100 + 13 * j->id, 90 + 7 * r, 150 + r, (layout)(r % 4),
                      (layout)(j->id % 4), false, (uint64_t)(j->id * 100 + r),
                      0, "threads", j->msg, sizeof j->msg, &j->checks);
  return NULL;
}

/* Four threads at once: each gets its own bits. */
static int case_threads(const cuda_env *env, char *msg, size_t len,
                        long *checks) {
  thread_job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (thread_job){.env = env, .id = i};
    pthread_create(&th[i], NULL, thread_main, &jobs[i]);
  }
  int bad = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    *checks += jobs[i].checks;
    if (jobs[i].bad && !bad) {
      snprintf(msg, len, "%s", jobs[i].msg);
      bad = 1;
    }
  }
  return bad;
}

/* A NaN output is handed back and counted. */
static int case_declines(const cuda_env *env, char *msg, size_t len,
                         long *checks) {
  if (!env->devices) {
    snprintf(msg, len, "no device counters");
    return CUDA_SKIP;
  }
  topos_device_info a[TOPOS_DEVICES_MAX], b[TOPOS_DEVICES_MAX];
  env->devices(a, TOPOS_DEVICES_MAX);
  mat A = mat_new(TOPOS_F32, ROW, 1, 8, 8, 70, 1.0, 0);
  mat B = mat_new(TOPOS_F32, ROW, 1, 8, 8, 71, 1.0, 0);
  ((float *)A.p)[3] = NAN;
  float C[64];
  topos_task t = gemm_task(TOPOS_F32, 1, 8, 8, 8, &A, &B, false);
  t.u.gemm.c = C;
  topos_error err = {0};
  int rc = env->exact->run(env->exact, &t, &err);
  env->devices(b, TOPOS_DEVICES_MAX);
  free(A.p);
  free(B.p);
  (*checks)++;
  if (rc != TOPOS_ERR_RANGE || b[0].declined != a[0].declined + 1) {
    snprintf(msg, len, "NaN output: rc %d, declined %llu -> %llu", rc,
             (unsigned long long)a[0].declined,
             (unsigned long long)b[0].declined);
    return 1;
  }
  return 0;
}

const cuda_case cuda_cases[] = {
    {"gemm_sweep", case_gemm_sweep},
    {"gemm_batches", case_gemm_batches},
    {"gemm_large", case_gemm_large},
    {"gemm_specials", case_gemm_specials},
    {"window", case_window},
    {"reduce", case_reduce},
    {"map", case_map},
    {"math_sweep", case_math_sweep},
    {"attention", case_attention},
    {"cublas_envelope", case_cublas},
    {"blob_cache", case_blob_cache},
    {"threads", case_threads},
    {"declines", case_declines},
};
const int cuda_ncases = (int)(sizeof cuda_cases / sizeof cuda_cases[0]);
