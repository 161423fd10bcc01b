/*
 * kernels_real.h - the reference kernels' arithmetic, written once and
 * included by kernels.c twice: with R = float (f32 and bf16 compute in
 * f32) and with R = double.  K(name) suffixes each function with the type.
 *
 * Every loop here is the definition of what the op computes (numerics.md):
 * elementwise ops call libm once per element, matmul is an fma chain in k
 * order from +0.0, and every sum uses the striped-16 rule of reduce().
 * Inputs and outputs are contiguous arrays of R; kernels.c converts.
 */

/* The striped-16 reduction of x[0], x[s], ..., x[(n-1)s]. */
static R K(reduce)(const R *x, int64_t n, int64_t s) {
  if (n == 0) return (R)0;
  if (n <= 16) {
    R acc = x[0];
    for (int64_t i = 1; i < n; i++) acc = acc + x[i * s];
    return acc;
  }
  R lane[16];
  for (int l = 0; l < 16; l++) lane[l] = x[l * s];
  for (int64_t i = 16; i < n; i++) lane[i % 16] = lane[i % 16] + x[i * s];
  for (int width = 16; width > 1; width /= 2)
    for (int l = 0; l < width / 2; l++) lane[l] = lane[2 * l] + lane[2 * l + 1];
  return lane[0];
}

/* The elementwise loops also come in AVX2 and AVX-512 builds, chosen at
 * load time: wider lanes, the same IEEE operation per element (nothing is
 * contracted: -ffp-contract=off holds in every clone). */
#define ELEMENTWISE_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))

/* The elementwise loops write y[i] from x[i] (or a[i], b[i]) only: an
 * output is a fresh buffer or exactly an input (in place), never a shifted
 * overlap, so no iteration reads what another wrote; IVDEP says so.  GCC
 * at -O2 still compiles these loops one element per instruction (its
 * "very-cheap" vector cost model), and that is what keeps each add's and
 * multiply's operands in the order written: a vectorised commutative op
 * may swap them, and when both are NaN that changes which NaN comes out.
 * So the f32 add, sub, mul and div run whole vectors through inline asm
 * that pins the order (BINARY_512, SCALAR_512: kernels.c, fma_pinned.h),
 * step, maximum, relu and neg (which compare, select or flip a sign bit,
 * no arithmetic to reorder) through AVX-512 intrinsics (the same macros
 * and UNARY_512), and these loops do the rest (docs/decisions.md). */
#define IVDEP _Pragma("GCC ivdep")

ELEMENTWISE_CLONES static void K(unary)(op_code op, double p, const void *xv,
                                        void *yv, int64_t n) {
  const R *x = xv;
  R *y = yv;
  R pr = (R)p;
  /* Whole vectors of f32 relu and neg (kernels.c); the loops do the rest. */
  int64_t done = UNARY_512(op, x, y, n);
  x += done;
  y += done;
  n -= done;
  switch (op) {
    case OP_NEG:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = -x[i];
      break;
    case OP_EXP:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = EXP(x[i]);
      break;
    case OP_LOG:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = LOG(x[i]);
      break;
    case OP_SQRT:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = SQRT(x[i]);
      break;
    case OP_TANH:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = TANH(x[i]);
      break;
    case OP_ERF:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = ERF(x[i]);
      break;
    case OP_POW:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = POW(x[i], pr);
      break;
    case OP_RELU:
      /* NaN stays NaN; -0 and negatives become +0. */
      IVDEP for (int64_t i = 0; i < n; i++) y[i] =
          isnan(x[i]) ? x[i] : (x[i] > 0 ? x[i] : (R)0);
      break;
    default:
      assert(!"not a unary op");
  }
}

ELEMENTWISE_CLONES static void K(binary)(op_code op, const void *av,
                                         const void *bv, void *yv, int64_t n) {
  const R *a = av, *b = bv;
  R *y = yv;
  /* Whole vectors of f32 add, sub, mul and div with the operand order
   * pinned (kernels.c); this loop does the rest. */
  int64_t done = BINARY_512(op, a, b, y, n);
  a += done;
  b += done;
  y += done;
  n -= done;
  switch (op) {
    case OP_ADD:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
      break;
    case OP_SUB:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i];
      break;
    case OP_MUL:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
      break;
    case OP_DIV:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i];
      break;
    case OP_MAXIMUM:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = isnan(a[i])    ? a[i]
                                                   : isnan(b[i])  ? b[i]
                                                   : a[i] >= b[i] ? a[i]
                                                                  : b[i];
      break;
    case OP_STEP:
      IVDEP for (int64_t i = 0; i < n; i++) y[i] = a[i] >= b[i] ? (R)1 : (R)0;
      break;
    default:
      assert(!"not a binary op");
  }
}

/* K(binary) with one operand a single value repeated: y[i] = a[i·sa] op
 * v (v_right) or v op a[i·sa] - the loops of K(binary) with a
 * loop-invariant operand, so they vectorise (a broadcast scalar: ReLU's
 * adjoint steps x, often a permuted view, against a filled 0). */
ELEMENTWISE_CLONES static void K(binary_scalar)(op_code op, const R *a,
                                                int64_t sa, R v, bool v_right,
                                                R *y, int64_t n) {
#define SCALAR_LOOP_1(EXPR, U, W, AT)     \
  IVDEP for (int64_t i = 0; i < n; i++) { \
    R U = a[AT], W = v;                   \
    y[i] = EXPR;                          \
  }
#define SCALAR_LOOP(EXPR)            \
  if (v_right && sa == 1)            \
    SCALAR_LOOP_1(EXPR, u, w, i)     \
  else if (v_right)                  \
    SCALAR_LOOP_1(EXPR, u, w, i *sa) \
  else if (sa == 1)                  \
    SCALAR_LOOP_1(EXPR, w, u, i)     \
  else                               \
    SCALAR_LOOP_1(EXPR, w, u, i *sa)
  if (sa == 1) { /* whole vectors pinned, as in K(binary) */
    int64_t done = SCALAR_512(op, a, v, v_right, y, n);
    a += done;
    y += done;
    n -= done;
  }
  switch (op) {
    case OP_ADD:
      SCALAR_LOOP(u + w)
      break;
    case OP_SUB:
      SCALAR_LOOP(u - w)
      break;
    case OP_MUL:
      SCALAR_LOOP(u * w)
      break;
    case OP_DIV:
      SCALAR_LOOP(u / w)
      break;
    case OP_MAXIMUM:
      SCALAR_LOOP(isnan(u) ? u : isnan(w) ? w : u >= w ? u : w)
      break;
    case OP_STEP:
      SCALAR_LOOP(u >= w ? (R)1 : (R)0)
      break;
    default:
      assert(!"not a binary op");
  }
#undef SCALAR_LOOP
#undef SCALAR_LOOP_1
}

/* K(binary) on strided operands over an n1 x n0 block: y[i1·n0 + i0] =
 * a[i1·sa1 + i0·sa0] op b[i1·sb1 + i0·sb0] (a stride 0 repeats one
 * element: a broadcast).  The same per-element arithmetic. */
#define BLOCK_LOOP(EXPR)                                           \
  for (int64_t i1 = 0; i1 < n1; i1++, a += sa1, b += sb1, y += n0) \
    for (int64_t i0 = 0; i0 < n0; i0++) {                          \
      R u = a[i0 * sa0], v = b[i0 * sb0];                          \
      y[i0] = EXPR;                                                \
    }
static void K(binary_block)(op_code op, const R *a, int64_t sa1, int64_t sa0,
                            const R *b, int64_t sb1, int64_t sb0, R *y,
                            int64_t n1, int64_t n0) {
  if (sa0 == 1 && sb0 == 1) {
    /* Short rows of a contiguous operand against one repeated row (a bias
     * added to [rows, features]): the repeated row tiled into a buffer,
     * so one K(binary) call covers many rows (the same element pairs). */
    enum { TILE = 1024 };
    bool rep_b = sb1 == 0 && sa1 == n0, rep_a = sa1 == 0 && sb1 == n0;
    if ((rep_a || rep_b) && n0 > 0 && n0 <= TILE / 8 && n1 > 1) {
      R tile[TILE];
      int64_t per = TILE / n0; /* rows per call */
      const R *row = rep_b ? b : a;
      for (int64_t r = 0; r < per; r++)
        memcpy(tile + r * n0, row, sizeof(R) * (size_t)n0);
      for (int64_t i1 = 0; i1 < n1; i1 += per) {
        int64_t rows = n1 - i1 < per ? n1 - i1 : per;
        const R *full = (rep_b ? a : b) + i1 * n0;
        K(binary)
        (op, rep_b ? full : tile, rep_b ? tile : full, y + i1 * n0, rows * n0);
      }
      return;
    }
    for (int64_t i1 = 0; i1 < n1; i1++, a += sa1, b += sb1, y += n0)
      K(binary)(op, a, b, y, n0);
    return;
  }
  /* One call per row: worth it for long rows only (short ones stay in
   * the inline loop below, without a call per row). */
  if ((sb0 == 0 || sa0 == 0) && n0 >= 64) {
    bool v_right = sb0 == 0;
    const R *s = v_right ? a : b;
    int64_t ss = v_right ? sa0 : sb0, s1 = v_right ? sa1 : sb1;
    const R *c = v_right ? b : a;
    int64_t c1 = v_right ? sb1 : sa1;
    /* rows that run contiguous across: tiles through a transpose */
    if (s1 == 1 && TRANSPOSED_SCALAR_512(op, s, ss, c, c1, v_right, y, n1, n0))
      return;
    for (int64_t i1 = 0; i1 < n1; i1++, s += s1, c += c1, y += n0)
      if (ss == 1 || !GATHER_SCALAR_512(op, s, ss, *c, v_right, y, n0))
        K(binary_scalar)(op, s, ss, *c, v_right, y, n0);
    return;
  }
  switch (op) {
    case OP_ADD:
      BLOCK_LOOP(u + v)
      break;
    case OP_SUB:
      BLOCK_LOOP(u - v)
      break;
    case OP_MUL:
      BLOCK_LOOP(u * v)
      break;
    case OP_DIV:
      BLOCK_LOOP(u / v)
      break;
    case OP_MAXIMUM:
      BLOCK_LOOP(isnan(u) ? u : isnan(v) ? v : u >= v ? u : v)
      break;
    case OP_STEP:
      BLOCK_LOOP(u >= v ? (R)1 : (R)0)
      break;
    default:
      assert(!"not a binary op");
  }
}
#undef BLOCK_LOOP

/* c[m,n] = a[m,k]·b[k,n] with a and b addressed by (row, column) strides.
 * Each output is its own chain acc = fma(a[i,kk], b[kk,j], acc) for kk in
 * order, acc from +0.0; the i-k-j loop keeps a row of accumulators.  The
 * body is written once and built twice (kernels.c): with the FMA
 * instruction in its pinned form where the CPU has it, else with libm's
 * fma; both give the same bits, NaNs included. */
__attribute__((always_inline)) static inline void K(matmul_with)(
    R (*fma_op)(R, R, R), const void *av, int64_t as0, int64_t as1,
    const void *bv, int64_t bs0, int64_t bs1, void *cv, int64_t m, int64_t k,
    int64_t n) {
  const R *a = av, *b = bv;
  R *c = cv;
  for (int64_t i = 0; i < m; i++) {
    R *row = c + i * n;
    for (int64_t j = 0; j < n; j++) row[j] = (R)0;
    for (int64_t kk = 0; kk < k; kk++) {
      R aik = a[i * as0 + kk * as1];
      const R *brow = b + kk * bs0;
      if (bs1 == 1) {
        for (int64_t j = 0; j < n; j++) row[j] = fma_op(aik, brow[j], row[j]);
      } else {
        for (int64_t j = 0; j < n; j++)
          row[j] = fma_op(aik, brow[j * bs1], row[j]);
      }
    }
  }
}

#if FMA_PINNED_X86
__attribute__((target("fma"))) static void K(matmul_fma)(
    const void *a, int64_t as0, int64_t as1, const void *b, int64_t bs0,
    int64_t bs1, void *c, int64_t m, int64_t k, int64_t n) {
  K(matmul_with)(K(fma231), a, as0, as1, b, bs0, bs1, c, m, k, n);
}
#endif

static void K(matmul)(const void *a, int64_t as0, int64_t as1, const void *b,
                      int64_t bs0, int64_t bs1, void *c, int64_t m, int64_t k,
                      int64_t n) {
#if FMA_PINNED_X86
  if (fma_pinned_available()) {
    K(matmul_fma)(a, as0, as1, b, bs0, bs1, c, m, k, n);
    return;
  }
#endif
  K(matmul_with)(FMA, a, as0, as1, b, bs0, bs1, c, m, k, n);
}

/* x is [outer, L, inner]; y[outer, inner] = reduce over L. */
static void K(sum_rows)(const void *xv, void *yv, int64_t outer, int64_t L,
                        int64_t inner) {
  const R *x = xv;
  R *y = yv;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++)
      y[o * inner + i] = K(reduce)(x + o * L * inner + i, L, inner);
}

/* The first maximal element along L; the first NaN if there is one. */
static void K(max_rows)(const void *xv, void *yv, int64_t outer, int64_t L,
                        int64_t inner) {
  const R *x = xv;
  R *y = yv;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const R *row = x + o * L * inner + i;
      R m = row[0];
      for (int64_t l = 0; l < L && !isnan(m); l++) {
        R v = row[l * inner];
        if (isnan(v) || v > m) m = v;
      }
      y[o * inner + i] = m;
    }
}

/* logsumexp (softmax = false: y[outer,inner] = shift + log(s)) or
 * log_softmax (softmax = true: y[outer,L,inner] = (x - shift) - log(s)),
 * where shift is the row maximum (0 when it is infinite, so an all -inf row
 * stays -inf instead of NaN) and s = reduce(exp(x - shift)).  tmp holds L
 * values. */
static void K(lse_rows)(const void *xv, void *yv, int64_t outer, int64_t L,
                        int64_t inner, bool softmax, R *tmp) {
  const R *x = xv;
  R *y = yv;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const R *row = x + o * L * inner + i;
      R m = row[0];
      for (int64_t l = 0; l < L && !isnan(m); l++) {
        R v = row[l * inner];
        if (isnan(v) || v > m) m = v;
      }
      R shift = isinf(m) ? (R)0 : m;
      for (int64_t l = 0; l < L; l++) tmp[l] = EXP(row[l * inner] - shift);
      R lse = LOG(K(reduce)(tmp, L, 1));
      if (!softmax) {
        y[o * inner + i] = shift + lse;
      } else {
        R *out = y + o * L * inner + i;
        for (int64_t l = 0; l < L; l++)
          out[l * inner] = (row[l * inner] - shift) - lse;
      }
    }
}

/* One fold (numerics.md's reduction of the contributions in window
 * order) of rows: out[e·inner + i] for e < extent sums src[(c·cs + s·ss)
 * + i] over windows c < count and s < size with c·step + s·dil = e.
 * Where no position is covered by more than 16 windows that is a left
 * fold, streamed window by window (the first contribution copied, later
 * ones added, as K(fold)); otherwise each position gathers its windows
 * into tmp and reduces them.  seen holds extent flags. */
static void K(fold_rows)(const R *src, int64_t cs, int64_t ss, int64_t count,
                         int64_t size, int64_t inner, int64_t extent,
                         int64_t step, int64_t dil, R *out, char *seen,
                         R *tmp) {
  int64_t reach = (size - 1) * dil;
  if (inner == 1 && dil == 1 && reach / step + 1 <= 16) {
    /* Windows are runs: window c's positions from the end of window c−1
     * on are new to it (K(fold)'s first path, on a strided source). */
    int64_t covered = 0;
    for (int64_t c = 0; c < count; c++) {
      int64_t e0 = c * step;
      const R *xs = src + c * cs;
      for (int64_t e = covered; e < e0; e++) out[e] = (R)0;
      int64_t old = covered > e0 ? covered - e0 : 0;
      if (old > size) old = size;
      for (int64_t s = 0; s < old; s++) out[e0 + s] = out[e0 + s] + xs[s * ss];
      for (int64_t s = old; s < size; s++) out[e0 + s] = xs[s * ss];
      if (e0 + size > covered) covered = e0 + size;
    }
    for (int64_t e = covered; e < extent; e++) out[e] = (R)0;
    return;
  }
  if (reach / step + 1 <= 16) {
    memset(seen, 0, (size_t)extent);
    for (int64_t c = 0; c < count; c++)
      for (int64_t s = 0; s < size; s++) {
        int64_t e = c * step + s * dil;
        const R *xs = src + c * cs + s * ss;
        R *ye = out + e * inner;
        if (!seen[e]) {
          seen[e] = 1;
          for (int64_t i = 0; i < inner; i++) ye[i] = xs[i];
        } else {
          for (int64_t i = 0; i < inner; i++) ye[i] = ye[i] + xs[i];
        }
      }
    for (int64_t e = 0; e < extent; e++)
      if (!seen[e])
        for (int64_t i = 0; i < inner; i++) out[e * inner + i] = (R)0;
    return;
  }
  for (int64_t e = 0; e < extent; e++) {
    /* c·step <= e and e − c·step <= (size−1)·dilation. */
    int64_t c0 = e > reach ? (e - reach + step - 1) / step : 0;
    int64_t c1 = e / step;
    if (c1 > count - 1) c1 = count - 1;
    for (int64_t i = 0; i < inner; i++) {
      int64_t n = 0;
      for (int64_t c = c0; c <= c1; c++) {
        int64_t d = e - c * step;
        if (d % dil == 0) tmp[n++] = src[c * cs + (d / dil) * ss + i];
      }
      out[e * inner + i] = K(reduce)(tmp, n, 1);
    }
  }
}

/* x is [outer, count, size, inner] -> y[outer, extent, inner]; window c's
 * element s lands at c·step + s·dilation, and contributions to one output
 * are reduced in window order: K(fold_rows) per outer index.  tmp holds
 * count values, seen extent flags. */
static void K(fold)(const void *xv, void *yv, int64_t outer, int64_t count,
                    int64_t size, int64_t inner, int64_t extent, int64_t step,
                    int64_t dilation, R *tmp, char *seen) {
  const R *x = xv;
  R *y = yv;
  for (int64_t o = 0; o < outer; o++) K(fold_rows)
  (x + o * count * size * inner, size * inner, inner, count, size, inner,
   extent, step, dilation, y + o * extent * inner, seen, tmp);
}

/* rows[n,d] scattered by idx into y[V,d]; `order` lists row numbers grouped
 * by target (start[v]..start[v+1]) in increasing row order. */
static void K(scatter)(const void *rv, void *yv, int64_t d, int64_t V,
                       const int64_t *order, const int64_t *start, R *tmp) {
  const R *rows = rv;
  R *y = yv;
  for (int64_t v = 0; v < V; v++)
    for (int64_t j = 0; j < d; j++) {
      int64_t nt = 0;
      for (int64_t r = start[v]; r < start[v + 1]; r++)
        tmp[nt++] = rows[order[r] * d + j];
      y[v * d + j] = K(reduce)(tmp, nt, 1);
    }
}

/* The fused convolution (plan.c's GROUP_CONV): out[r, o] for rows
 * r = (n, oi, oj) and columns o is the fma chain over kk = (c, a, b) in
 * order of x_padded[n, c, oi·sh + a·dh, oj·sw + b·dw] times w[kk, o] —
 * exactly the chain the unfused matmul runs on the im2col matrix, padding
 * zeros included (fma with 0 can still turn an accumulated -0 into +0).
 * x is contiguous [N,C,H,W]; w is addressed by strides. */
__attribute__((always_inline)) static inline void K(conv_window_with)(
    R (*fma_op)(R, R, R), const plan_group *g, const void *xv, const void *wv,
    int64_t ws0, int64_t ws1, void *outv) {
  const R *x = xv, *w = wv;
  R *out = outv;
  int64_t O = g->nout;
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t oi = 0; oi < g->oh; oi++)
      for (int64_t oj = 0; oj < g->ow; oj++) {
        R *row = out + ((n * g->oh + oi) * g->ow + oj) * O;
        for (int64_t o = 0; o < O; o++) row[o] = (R)0;
        int64_t kk = 0;
        for (int64_t c = 0; c < g->C; c++)
          for (int64_t a = 0; a < g->kh; a++) {
            int64_t h = oi * g->stride_h + a * g->dil_h - g->pad_top;
            for (int64_t b = 0; b < g->kw; b++, kk++) {
              int64_t v = oj * g->stride_w + b * g->dil_w - g->pad_left;
              R xval = (h >= 0 && h < g->H && v >= 0 && v < g->W)
                           ? x[((n * g->C + c) * g->H + h) * g->W + v]
                           : (R)0;
              const R *wrow = w + kk * ws0;
              if (ws1 == 1) {
                for (int64_t o = 0; o < O; o++)
                  row[o] = fma_op(xval, wrow[o], row[o]);
              } else {
                for (int64_t o = 0; o < O; o++)
                  row[o] = fma_op(xval, wrow[o * ws1], row[o]);
              }
            }
          }
      }
}

#if FMA_PINNED_X86
__attribute__((target("fma"))) static void K(conv_window_fma)(
    const plan_group *g, const void *x, const void *w, int64_t ws0, int64_t ws1,
    void *out) {
  K(conv_window_with)(K(fma231), g, x, w, ws0, ws1, out);
}
#endif

/* Built as matmul is (the FMA instruction pinned, or libm's fma). */
static void K(conv_window)(const plan_group *g, const void *x, const void *w,
                           int64_t ws0, int64_t ws1, void *out) {
#if FMA_PINNED_X86
  if (fma_pinned_available()) {
    K(conv_window_fma)(g, x, w, ws0, ws1, out);
    return;
  }
#endif
  K(conv_window_with)(FMA, g, x, w, ws0, ws1, out);
}

/* ------------------------------------------- fused window adjoints */

/* The weight gradient of a fused convolution in a training plan:
 * dw[kk, o] for kk in [k0, k1) is the chain matmul(transpose(im2col), gy)
 * runs - fma over r = (n, oi, oj) in order from +0.0, the im2col element
 * first - read from xp, x zero-padded to [N, C, Hp, Wp] (a padded
 * position is a 0 that is still fma'd).  koff[kk] is x[c, a·dh, b·dw]'s
 * offset in an image of xp; acc holds (k1 − k0)·O values. */
__attribute__((always_inline)) static inline void K(window_dw_with)(
    R (*fma_op)(R, R, R), const plan_group *g, const R *xp, int64_t Hp,
    int64_t Wp, const int64_t *koff, const R *gy, R *dw, int64_t k0, int64_t k1,
    R *acc) {
  int64_t O = g->nout, nk = k1 - k0;
  for (int64_t q = 0; q < nk * O; q++) acc[q] = (R)0;
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t oi = 0; oi < g->oh; oi++)
      for (int64_t oj = 0; oj < g->ow; oj++) {
        const R *xb =
            xp + ((n * g->C * Hp) + oi * g->stride_h) * Wp + oj * g->stride_w;
        const R *gr = gy + ((n * g->oh + oi) * g->ow + oj) * O;
        for (int64_t q = 0; q < nk; q++) {
          R xval = xb[koff[k0 + q]];
          R *ac = acc + q * O;
          for (int64_t o = 0; o < O; o++) ac[o] = fma_op(xval, gr[o], ac[o]);
        }
      }
  memcpy(dw + k0 * O, acc, sizeof(R) * (size_t)(nk * O));
}

#if FMA_PINNED_X86
__attribute__((target("fma"))) static void K(window_dw_fma)(
    const plan_group *g, const R *xp, int64_t Hp, int64_t Wp,
    const int64_t *koff, const R *gy, R *dw, int64_t k0, int64_t k1, R *acc) {
  K(window_dw_with)(K(fma231), g, xp, Hp, Wp, koff, gy, dw, k0, k1, acc);
}
#endif

static void K(window_dw)(const plan_group *g, const R *xp, int64_t Hp,
                         int64_t Wp, const int64_t *koff, const R *gy, R *dw,
                         int64_t k0, int64_t k1, R *acc) {
#if FMA_PINNED_X86
  if (fma_pinned_available()) {
    K(window_dw_fma)(g, xp, Hp, Wp, koff, gy, dw, k0, k1, acc);
    return;
  }
#endif
  K(window_dw_with)(FMA, g, xp, Hp, Wp, koff, gy, dw, k0, k1, acc);
}

/* The unfused chain's adjoint below a window group's head: the
 * cotangent of the windows, v(n, c, i, a, j, b) = src[n·sn + c·sc + i·si
 * + a·sa + j·sj + b·sb], goes back through the permute (a view), the
 * fold along axis 4 (over (j, b) into t1[n, c, i, a, Wp], rounded to bf16
 * where the dtype is bf16) and the fold along axis 2 (over (i, a) into
 * [Hp, Wp]), then the pads' narrows into dx [N, C, H, W].  Every fold
 * keeps its order, so the bits are the unfused chain's.  t1 holds oh·kh·Wp
 * values, t2 Hp·Wp, tmp max(oh, ow), seen max(Hp, Wp). */
static void K(window_fold)(const plan_group *g, const R *src,
                           const int64_t st[6], bool bf16, R *dx, R *t1, R *t2,
                           R *tmp, char *seen) {
  int64_t Hp = g->H + g->pad_top + g->pad_bottom;
  int64_t Wp = g->W + g->pad_left + g->pad_right;
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t c = 0; c < g->C; c++) {
      const R *sb = src + n * st[0] + c * st[1];
      for (int64_t i = 0; i < g->oh; i++) {
        /* The kh rows (a) of window row i: at once where a vector path
         * takes them, else one by one. */
        R *rows = t1 + i * g->kh * Wp;
        const R *s0 = sb + i * st[2];
        if (g->stride_w == 1 && g->dil_w == 1 && st[5] == 1 &&
            FOLD_ROWS_512(s0, st[3], st[4], g->ow, g->kw, Wp, rows, g->kh))
          continue;
        for (int64_t a = 0; a < g->kh; a++) K(fold_rows)
        (s0 + a * st[3], st[4], st[5], g->ow, g->kw, 1, Wp, g->stride_w,
         g->dil_w, rows + a * Wp, seen, tmp);
      }
      if (bf16)
        for (int64_t k = 0; k < g->oh * g->kh * Wp; k++)
          t1[k] = bf16_trip(t1[k]);
      K(fold_rows)
      (t1, g->kh * Wp, Wp, g->oh, g->kh, Wp, Hp, g->stride_h, g->dil_h, t2,
       seen, tmp);
      R *d = dx + (n * g->C + c) * g->H * g->W;
      for (int64_t h = 0; h < g->H; h++)
        memcpy(d + h * g->W, t2 + (h + g->pad_top) * Wp + g->pad_left,
               sizeof(R) * (size_t)g->W);
    }
}

/* One output row of 2x2 windows at column stride 2 (as K(pool_row2x2)):
 * the cotangent to the first position >= the window's maximum. */
static void K(pool_grad_row2x2)(const R *restrict x0, const R *restrict x1,
                                const R *restrict y, const R *restrict gy,
                                R *restrict d0, R *restrict d1, int64_t ow) {
  for (int64_t oj = 0; oj < ow; oj++) {
    R yv = y[oj], one = gy[oj] * (R)1, zero = gy[oj] * (R)0;
    bool m0 = isgreaterequal(x0[2 * oj], yv),
         m1 = isgreaterequal(x0[2 * oj + 1], yv),
         m2 = isgreaterequal(x1[2 * oj], yv),
         m3 = isgreaterequal(x1[2 * oj + 1], yv);
    d0[2 * oj] = m0 ? one : zero;
    d0[2 * oj + 1] = m1 & !m0 ? one : zero;
    d1[2 * oj] = m2 & !(m0 | m1) ? one : zero;
    d1[2 * oj + 1] = m3 & !(m0 | m1 | m2) ? one : zero;
  }
}

static void K(pool_grad_row2x2_best)(const R *x0, const R *x1, const R *y,
                                     const R *gy, R *d0, R *d1, int64_t ow) {
  if (!POOL_GRAD_ROW_512(x0, x1, y, gy, d0, d1, ow))
    K(pool_grad_row2x2)(x0, x1, y, gy, d0, d1, ow);
}

/* The max-pool adjoint's window cotangents, v = g·first: first is 1 at
 * the first window position (a, b) whose value (0 at a pad) is >= y, the
 * pooled maximum, and 0 elsewhere - max_along's adjoint, whose mask is
 * step(window, y) and whose prefix count picks its first 1 (none when y
 * is NaN).  Either v goes to vout [N, C, oh, ow, kh, kw] (vout non-NULL),
 * or, when windows overlap along neither axis (each x position in at
 * most one, so both folds copy it or give +0), straight to dx [N, C, H,
 * W], which the caller has zeroed. */
static void K(pool_grad)(const plan_group *g, const R *x, const R *y,
                         const R *gy, R *vout, R *dx) {
  if (!vout && !g->pad_top && !g->pad_left && !g->pad_bottom && !g->pad_right &&
      g->kh == 2 && g->kw == 2 && g->dil_h == 1 && g->dil_w == 1 &&
      g->stride_w == 2) {
    for (int64_t nc = 0; nc < g->N * g->C; nc++)
      for (int64_t oi = 0; oi < g->oh; oi++) {
        int64_t r = (nc * g->oh + oi) * g->ow;
        int64_t at = nc * g->H * g->W + oi * g->stride_h * g->W;
        K(pool_grad_row2x2_best)
        (x + at, x + at + g->W, y + r, gy + r, dx + at, dx + at + g->W, g->ow);
      }
    return;
  }
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t c = 0; c < g->C; c++) {
      const R *xc = x + (n * g->C + c) * g->H * g->W;
      R *dc = dx ? dx + (n * g->C + c) * g->H * g->W : NULL;
      for (int64_t oi = 0; oi < g->oh; oi++)
        for (int64_t oj = 0; oj < g->ow; oj++) {
          int64_t r = ((n * g->C + c) * g->oh + oi) * g->ow + oj;
          R yv = y[r], gv = gy[r];
          bool found = false;
          for (int64_t a = 0; a < g->kh; a++) {
            int64_t h = oi * g->stride_h + a * g->dil_h - g->pad_top;
            bool hin = h >= 0 && h < g->H;
            for (int64_t b = 0; b < g->kw; b++) {
              int64_t w = oj * g->stride_w + b * g->dil_w - g->pad_left;
              bool in = hin && w >= 0 && w < g->W;
              R val = in ? xc[h * g->W + w] : (R)0;
              bool first = !found && val >= yv;
              found |= first;
              R v = gv * (first ? (R)1 : (R)0);
              if (vout)
                *vout++ = v;
              else if (in)
                dc[h * g->W + w] = v;
            }
          }
        }
    }
}

/* The fused max-pool (GROUP_POOL): out[n, c, oi, oj] is the first maximal
 * window element in lane order (a, b), the first NaN if any — what
 * max_along computes over the flattened window.  Padding reads 0. */
/* max_rows' step: m takes val unless m is NaN, or val is no NaN and not
 * greater. */
static inline R K(max_step)(R m, R val) {
  bool take = !isnan(m) && (isnan(val) || isgreater(val, m));
  return take ? val : m;
}

/* One output row of 2x2 windows at column stride 2, unrolled (f32 on
 * AVX-512: pool_row2x2_512 in kernels.c, 16 windows at once). */
static void K(pool_row2x2)(const R *restrict r0, const R *restrict r1,
                           R *restrict out, int64_t ow) {
  for (int64_t oj = 0; oj < ow; oj++) {
    R m = K(max_step)(r0[2 * oj], r0[2 * oj + 1]);
    m = K(max_step)(m, r1[2 * oj]);
    out[oj] = K(max_step)(m, r1[2 * oj + 1]);
  }
}

static void K(pool_row2x2_best)(const R *r0, const R *r1, R *out, int64_t ow) {
  if (!POOL_ROW_512(r0, r1, out, ow)) K(pool_row2x2)(r0, r1, out, ow);
}

static void K(pool_window)(const plan_group *g, const void *xv, void *outv) {
  const R *x = xv;
  R *out = outv;
  if (g->kh == 2 && g->kw == 2 && g->dil_h == 1 && g->dil_w == 1 &&
      g->stride_w == 2 && !g->pad_top && !g->pad_left && !g->pad_bottom &&
      !g->pad_right) {
    /* The common 2x2 window inside x. */
    int64_t W = g->W;
    for (int64_t nc = 0; nc < g->N * g->C; nc++) {
      const R *xc = x + nc * g->H * W;
      for (int64_t oi = 0; oi < g->oh; oi++, out += g->ow) {
        const R *r0 = xc + oi * g->stride_h * W;
        K(pool_row2x2_best)(r0, r0 + W, out, g->ow);
      }
    }
    return;
  }
  for (int64_t n = 0; n < g->N; n++)
    for (int64_t c = 0; c < g->C; c++)
      for (int64_t oi = 0; oi < g->oh; oi++)
        for (int64_t oj = 0; oj < g->ow; oj++) {
          R m = (R)0;
          bool first = true;
          for (int64_t a = 0; a < g->kh; a++) {
            int64_t h = oi * g->stride_h + a * g->dil_h - g->pad_top;
            for (int64_t b = 0; b < g->kw; b++) {
              int64_t v = oj * g->stride_w + b * g->dil_w - g->pad_left;
              R val = (h >= 0 && h < g->H && v >= 0 && v < g->W)
                          ? x[((n * g->C + c) * g->H + h) * g->W + v]
                          : (R)0;
              /* As max_rows: once m is NaN it stays. */
              if (first || (!isnan(m) && (isnan(val) || val > m))) m = val;
              first = false;
            }
          }
          *out++ = m;
        }
}

/* The fused attention chain (plan.c's GROUP_ATTENTION, backend.h's
 * topos_attention_task) over query rows [r0, r1) of batch·t: each row
 * runs the very kernels the unfused nodes run, in their order - matmul
 * for one row of scores, binary_block for the scale and the mask,
 * lse_rows for the row's log_softmax, unary exp, matmul for one row of
 * the output - so the bits are the chain's by construction.  row and tmp
 * hold s values each. */
static void K(attention_rows)(const topos_attention_task *t, int64_t r0,
                              int64_t r1, R *row, R *tmp) {
  const R *q = t->q, *k = t->k, *v = t->v, *sc = t->scale, *mk = t->mask;
  R *out = t->out;
  R *const rows[5] = {t->raw, t->scaled, t->masked, t->logp, t->probs};
  int64_t S = t->s;
  size_t bytes = sizeof(R) * (size_t)S;
  for (int64_t r = r0; r < r1; r++) {
    int64_t b = r / t->t, i = r % t->t;
    K(matmul)
    (q + b * t->q_batch + i * t->q_row, 0, t->q_col, k + b * t->k_batch,
     t->k_row, t->k_col, row, 1, t->dh, S);
    if (rows[0]) memcpy(rows[0] + r * S, row, bytes);
    if (sc) {
      K(binary_block)
      (OP_MUL, row, 0, 1, sc + b * t->scale_batch + i * t->scale_row, 0,
       t->scale_col, row, 1, S);
      if (rows[1]) memcpy(rows[1] + r * S, row, bytes);
    }
    if (mk) {
      K(binary_block)
      (OP_ADD, row, 0, 1, mk + b * t->mask_batch + i * t->mask_row, 0,
       t->mask_col, row, 1, S);
      if (rows[2]) memcpy(rows[2] + r * S, row, bytes);
    }
    K(lse_rows)(row, row, 1, S, 1, true, tmp);
    if (rows[3]) memcpy(rows[3] + r * S, row, bytes);
    K(unary)(OP_EXP, 0, row, row, S);
    if (rows[4]) memcpy(rows[4] + r * S, row, bytes);
    K(matmul)
    (row, 0, 1, v + b * t->v_batch, t->v_row, t->v_col, out + r * t->dv, 1, S,
     t->dv);
  }
}
