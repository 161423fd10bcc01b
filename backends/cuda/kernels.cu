/*
 * kernels.cu - the exact kernels of the `cuda` backend, and the operand
 * scan of the `cublas` one.
 *
 * Built with -fmad=false: nvcc, like GCC without -ffp-contract=off, would
 * otherwise fuse a multiply and an add on its own, and the reference has
 * fma exactly where numerics.md writes it.  Here every fma is an explicit
 * fma()/fmaf(); division and square root are IEEE round-to-nearest
 * (-prec-div and -prec-sqrt, nvcc's defaults), and subnormals are kept
 * (no -ftz).  So each output is the same sequence of IEEE operations on
 * the same operands as the reference kernel's, which is all it takes for
 * the same bits.
 *
 * The products (GEMM and the windowed product) are one tiled kernel: a
 * block owns a BM x BN tile of outputs and walks k in steps of BK through
 * shared memory (double-buffered, the next step's operands fetched into
 * registers while this step computes); each thread owns TM x TN outputs
 * and advances each output's chain by one fma per k, in k order, from
 * +0.0.  k is never split, and a step past the end of k is never taken
 * (fma(0, 0, -0) is +0: a padded k would change a -0 chain), while rows
 * and columns past the edges are computed on zeros and not stored.
 */
#ifdef TOPOS_CUDA_SIM
#include "sim.h" /* tests/cuda/sim.h: these kernels on the CPU, for tests */
#else
#include <cuda_runtime.h>
/* A launch: the kernel (a function or a pointer to one), then its
 * arguments.  The simulator defines its own. */
#define LAUNCH(grid, block, stream, kernel, ...) \
  (kernel)<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#include <stdint.h>
#include <string.h>

#include "exact_math.h"
#include "kernels.h"

/* ------------------------------------------------------------- helpers */

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  return v != v;
}

template <typename T>
__device__ __forceinline__ T fma_t(T a, T b, T c);
template <>
__device__ __forceinline__ float fma_t<float>(float a, float b, float c) {
  return fmaf(a, b, c);
}
template <>
__device__ __forceinline__ double fma_t<double>(double a, double b, double c) {
  return fma(a, b, c);
}

static inline int grid_for(int64_t n, int threads, int cap) {
  int64_t g = (n + threads - 1) / threads;
  return (int)(g < 1 ? 1 : g > cap ? cap : g);
}

/* ------------------------------------------------------------ products */

/* Where a product's A comes from: a strided matrix, or the im2col rows of
 * a window over x (the fused convolution). */
template <typename T>
struct MatA {
  const T *p;
  int64_t row, col, batch;
  __device__ __forceinline__ T at(int64_t b, int64_t r, int64_t kk) const {
    return p[b * batch + r * row + kk * col];
  }
  __device__ __forceinline__ bool k_contiguous() const { return col == 1; }
};

template <typename T>
struct WinA {
  const T *x;
  int64_t c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
  /* row r = (image, oi, oj), kk = (channel, a, b): x at row
   * oi*sh + a*dh - pt, column oj*sw + b*dw - pl, 0 outside. */
  __device__ __forceinline__ T at(int64_t, int64_t r, int64_t kk) const {
    int64_t img = r / (oh * ow), rem = r - img * (oh * ow);
    int64_t oi = rem / ow, oj = rem - oi * ow;
    int64_t ch = kk / (kh * kw), krem = kk - ch * (kh * kw);
    int64_t a = krem / kw, bb = krem - a * kw;
    int64_t ih = oi * sh + a * dh - pt, iw = oj * sw + bb * dw - pl;
    if (ih < 0 || ih >= h || iw < 0 || iw >= w) return (T)0;
    return x[((img * c + ch) * h + ih) * w + iw];
  }
  __device__ __forceinline__ bool k_contiguous() const { return false; }
};

template <typename T>
struct MatB {
  const T *p;
  int64_t row, col, batch;
};

template <typename T, int BM, int BN, int BK, int TM, int TN>
struct Tile {
  static constexpr int NT = (BM / TM) * (BN / TN);
  static constexpr int A_PER = BM * BK / NT;
  static constexpr int B_PER = BK * BN / NT;
};

/*
 * C[b] (m x n, dense row-major) = A[b] . B[b] over k.  Thread (tx, ty)
 * owns rows {ty*TM/2 + i, BM/2 + ty*TM/2 + i} and columns likewise, so a
 * warp reads shared memory in contiguous runs.
 */
template <typename T, typename AL, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    product_kernel(AL A, MatB<T> B, T *C, int64_t m, int64_t n, int64_t k,
                   int64_t batch0, unsigned *nan_flag) {
  typedef Tile<T, BM, BN, BK, TM, TN> tile;
  __shared__ __align__(16) T As[2][BK][BM];
  __shared__ __align__(16) T Bs[2][BK][BN];
  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int64_t b = batch0 + blockIdx.z;
  const int64_t row0 = (int64_t)blockIdx.y * BM,
                col0 = (int64_t)blockIdx.x * BN;
  const bool a_kc = A.k_contiguous(), b_nc = B.col == 1;

  T ra[tile::A_PER], rb[tile::B_PER];
  /* Fetch k step [k0, k0+BK) into registers: zeros outside. */
  auto fetch = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < tile::A_PER; i++) {
      int e = tid + i * tile::NT;
      int r = a_kc ? e / BK : e % BM, kk = a_kc ? e % BK : e / BM;
      int64_t gr = row0 + r, gk = k0 + kk;
      ra[i] = gr < m && gk < k ? A.at(b, gr, gk) : (T)0;
    }
#pragma unroll
    for (int i = 0; i < tile::B_PER; i++) {
      int e = tid + i * tile::NT;
      int cc = b_nc ? e % BN : e / BK, kk = b_nc ? e / BN : e % BK;
      int64_t gc = col0 + cc, gk = k0 + kk;
      rb[i] =
          gc < n && gk < k ? B.p[b * B.batch + gk * B.row + gc * B.col] : (T)0;
    }
  };
  auto stash = [&](int s) {
#pragma unroll
    for (int i = 0; i < tile::A_PER; i++) {
      int e = tid + i * tile::NT;
      int r = a_kc ? e / BK : e % BM, kk = a_kc ? e % BK : e / BM;
      As[s][kk][r] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < tile::B_PER; i++) {
      int e = tid + i * tile::NT;
      int cc = b_nc ? e % BN : e / BK, kk = b_nc ? e / BN : e % BK;
      Bs[s][kk][cc] = rb[i];
    }
  };

  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) acc[i][j] = (T)0; /* +0.0 */

  const int64_t steps = (k + BK - 1) / BK;
  if (steps > 0) {
    fetch(0);
    stash(0);
  }
  __syncthreads();
  for (int64_t s = 0; s < steps; s++) {
    const int cur = (int)(s & 1);
    if (s + 1 < steps) fetch((s + 1) * BK);
    const int64_t left = k - s * BK;
    const int kmax = left < BK ? (int)left : BK;
    /* One k: every owned output's chain advances by one fma. */
    auto advance = [&](int kk) {
      T av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM / 2; i++) {
        av[i] = As[cur][kk][ty * (TM / 2) + i];
        av[TM / 2 + i] = As[cur][kk][BM / 2 + ty * (TM / 2) + i];
      }
#pragma unroll
      for (int j = 0; j < TN / 2; j++) {
        bv[j] = Bs[cur][kk][tx * (TN / 2) + j];
        bv[TN / 2 + j] = Bs[cur][kk][BN / 2 + tx * (TN / 2) + j];
      }
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = fma_t(av[i], bv[j], acc[i][j]);
    };
    if (kmax == BK) { /* a whole step, unrolled */
#pragma unroll
      for (int kk = 0; kk < BK; kk++) advance(kk);
    } else { /* the last, short step: k order, never past k */
      for (int kk = 0; kk < kmax; kk++) advance(kk);
    }
    if (s + 1 < steps) stash(cur ^ 1);
    __syncthreads();
  }

  bool nan = false;
#pragma unroll
  for (int i = 0; i < TM; i++) {
    int64_t r = row0 + (i < TM / 2 ? ty * (TM / 2) + i
                                   : BM / 2 + ty * (TM / 2) + (i - TM / 2));
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < TN; j++) {
      int64_t cc = col0 + (j < TN / 2 ? tx * (TN / 2) + j
                                      : BN / 2 + tx * (TN / 2) + (j - TN / 2));
      if (cc >= n) continue;
      C[b * m * n + r * n + cc] = acc[i][j];
      nan |= is_nan(acc[i][j]);
    }
  }
  if (nan) atomicOr(nan_flag, 1u);
}

/* f32: 128 x 128 tiles, 8 x 8 outputs a thread (256 threads); f64: 64 x 64,
 * 4 x 4. */
template <typename T>
struct Shape;
template <>
struct Shape<float> {
  enum { BM = 128, BN = 128, BK = 8, TM = 8, TN = 8 };
};
template <>
struct Shape<double> {
  enum { BM = 64, BN = 64, BK = 8, TM = 4, TN = 4 };
};

template <typename T, typename AL>
static int launch_product(AL A, MatB<T> B, T *C, int64_t batch, int64_t m,
                          int64_t n, int64_t k, unsigned *nan_flag,
                          cudaStream_t st) {
  typedef Shape<T> S;
  constexpr int nt = (S::BM / S::TM) * (S::BN / S::TN);
  int64_t gx = (n + S::BN - 1) / S::BN, gy = (m + S::BM - 1) / S::BM;
  if (gx > INT32_MAX || gy > 65535) return (int)cudaErrorInvalidConfiguration;
  if (m == 0 || n == 0) return 0;
  for (int64_t b0 = 0; b0 < batch; b0 += 65535) {
    int64_t nb = batch - b0 < 65535 ? batch - b0 : 65535;
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)nb);
    auto kernel = product_kernel<T, AL, S::BM, S::BN, S::BK, S::TM, S::TN>;
    LAUNCH(grid, nt, st, kernel, A, B, C, m, n, k, b0, nan_flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
  }
  return 0;
}

template <typename T>
static int gemm_t(const cuda_gemm_args *g, unsigned *flag, cudaStream_t st) {
  MatA<T> A = {(const T *)g->a, g->a_row, g->a_col, g->a_batch};
  MatB<T> B = {(const T *)g->b, g->b_row, g->b_col, g->b_batch};
  return launch_product<T>(A, B, (T *)g->c, g->batch, g->m, g->n, g->k, flag,
                           st);
}

extern "C" int cuda_gemm_exact(const cuda_gemm_args *g, unsigned *nan_flag,
                               void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return g->f64 ? gemm_t<double>(g, nan_flag, st)
                : gemm_t<float>(g, nan_flag, st);
}

template <typename T>
static int window_t(const cuda_window_args *w, unsigned *flag,
                    cudaStream_t st) {
  WinA<T> A = {(const T *)w->x, w->c,        w->h,        w->w,     w->kh,
               w->kw,           w->stride_h, w->stride_w, w->dil_h, w->dil_w,
               w->pad_top,      w->pad_left, w->oh,       w->ow};
  MatB<T> B = {(const T *)w->weight, w->w_row, w->w_col, 0};
  return launch_product<T>(A, B, (T *)w->out, 1, w->n * w->oh * w->ow, w->o,
                           w->c * w->kh * w->kw, flag, st);
}

extern "C" int cuda_window_exact(const cuda_window_args *w, unsigned *nan_flag,
                                 void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return w->f64 ? window_t<double>(w, nan_flag, st)
                : window_t<float>(w, nan_flag, st);
}

/* ---------------------------------------------------------- reductions */

/* The striped-16 sum of p[0], p[s], ..., p[(L-1)s] (numerics.md): a left
 * fold up to 16 elements; beyond, lane l folds p[l], p[l+16], ... in
 * order and the lanes combine pairwise: (l0+l1), (l2+l3), ... */
template <typename T>
__device__ T striped_sum(const T *p, int64_t L, int64_t s) {
  if (L == 0) return (T)0;
  if (L <= 16) {
    T acc = p[0];
    for (int64_t i = 1; i < L; i++) acc = acc + p[i * s];
    return acc;
  }
  T lane[16];
#pragma unroll
  for (int l = 0; l < 16; l++) lane[l] = p[l * s];
  int64_t j = 16;
  for (; j + 16 <= L; j += 16)
#pragma unroll
    for (int l = 0; l < 16; l++) lane[l] = lane[l] + p[(j + l) * s];
#pragma unroll
  for (int l = 0; l < 16; l++)
    if (j + l < L) lane[l] = lane[l] + p[(j + l) * s];
#pragma unroll
  for (int width = 16; width > 1; width /= 2)
#pragma unroll
    for (int l = 0; l < width / 2; l++) lane[l] = lane[2 * l] + lane[2 * l + 1];
  return lane[0];
}

/* One thread per output y[o, i]. */
template <typename T>
__global__ void reduce_kernel(const T *x, T *y, int64_t outer, int64_t L,
                              int64_t inner, unsigned *nan_flag) {
  int64_t total = outer * inner;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
       idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = idx / inner, i = idx - o * inner;
    T v = striped_sum(x + o * L * inner + i, L, inner);
    y[idx] = v;
    if (is_nan(v)) atomicOr(nan_flag, 1u);
  }
}

/* Long rows with inner == 1: sixteen threads per output, thread l folding
 * lane l (the same order, each lane's chain on its own thread), thread 0
 * combining the lanes in the fixed tree. */
template <typename T>
__global__ void reduce_lanes_kernel(const T *x, T *y, int64_t outer, int64_t L,
                                    unsigned *nan_flag) {
  __shared__ T part[256];
  const int l = threadIdx.x % 16, slot = threadIdx.x / 16;
  const int64_t o = (int64_t)blockIdx.x * 16 + slot;
  T acc = (T)0;
  if (o < outer) { /* L > 16 here */
    const T *p = x + o * L;
    acc = p[l];
    for (int64_t j = 16 + l; j < L; j += 16) acc = acc + p[j];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (l == 0 && o < outer) {
    T lane[16];
#pragma unroll
    for (int q = 0; q < 16; q++) lane[q] = part[slot * 16 + q];
#pragma unroll
    for (int width = 16; width > 1; width /= 2)
#pragma unroll
      for (int q = 0; q < width / 2; q++)
        lane[q] = lane[2 * q] + lane[2 * q + 1];
    y[o] = lane[0];
    if (is_nan(lane[0])) atomicOr(nan_flag, 1u);
  }
}

template <typename T>
static int reduce_t(const void *x, void *y, int64_t outer, int64_t L,
                    int64_t inner, unsigned *flag, cudaStream_t st) {
  if (outer == 0 || inner == 0) return 0;
  if (inner == 1 && L > 4096 && outer < (int64_t)1 << 16) {
    int64_t blocks = (outer + 15) / 16;
    LAUNCH((unsigned)blocks, 256, st, reduce_lanes_kernel<T>, (const T *)x,
           (T *)y, outer, L, flag);
  } else {
    LAUNCH(grid_for(outer * inner, 256, 1 << 16), 256, st, reduce_kernel<T>,
           (const T *)x, (T *)y, outer, L, inner, flag);
  }
  return (int)cudaGetLastError();
}

extern "C" int cuda_reduce_exact(bool f64, const void *x, void *y,
                                 int64_t outer, int64_t L, int64_t inner,
                                 unsigned *nan_flag, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  return f64 ? reduce_t<double>(x, y, outer, L, inner, nan_flag, st)
             : reduce_t<float>(x, y, outer, L, inner, nan_flag, st);
}

/* ------------------------------------------------------------ attention */

/*
 * One block per query row (b, i), the reference's steps in its order
 * (backend.h, cpu_attention_real.h):
 *   raw[j] = fma chain over c of q[c]·k[c, j] from +0.0; scaled = raw *
 *   scale; masked = scaled + mask; shift = the row's first NaN or first
 *   largest value (0 when infinite); sum = the striped-16 sum of
 *   exp(masked - shift); logp = (masked - shift) - log(sum); probs =
 *   exp(logp); out[c] = fma chain over j of probs[j]·v[j, c] from +0.0.
 * Threads split j (and then c), never one chain; the maximum and the
 * lane tree are one thread's, in order.
 */
#define ATT_THREADS 128
__global__ void __launch_bounds__(ATT_THREADS)
    attention_kernel(cuda_attention_args a, unsigned *nan_flag) {
  __shared__ float part[16];
  __shared__ float shift_lse[2];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x; /* b * t + i */
  const int64_t b = row / a.t, i = row - b * a.t, S = a.s;
  const float *q = (const float *)a.q + b * a.q_batch + i * a.q_row;
  const float *k = (const float *)a.k + b * a.k_batch;
  const float *v = (const float *)a.v + b * a.v_batch;
  const float *sc =
      a.scale ? (const float *)a.scale + b * a.scale_batch + i * a.scale_row
              : NULL;
  const float *mk =
      a.mask ? (const float *)a.mask + b * a.mask_batch + i * a.mask_row : NULL;
  float *buf = (float *)a.rows + row * S;
  const int64_t at = row * S;
  bool nan = false;
  for (int64_t j = tid; j < S; j += ATT_THREADS) {
    float acc = 0.0f;
    for (int64_t c = 0; c < a.dh; c++)
      acc = fmaf(q[c * a.q_col], k[c * a.k_row + j * a.k_col], acc);
    if (a.raw) ((float *)a.raw)[at + j] = acc;
    if (sc) {
      acc = __fmul_rn(acc, sc[j * a.scale_col]);
      if (a.scaled) ((float *)a.scaled)[at + j] = acc;
    }
    if (mk) {
      acc = __fadd_rn(acc, mk[j * a.mask_col]);
      if (a.masked) ((float *)a.masked)[at + j] = acc;
    }
    buf[j] = acc;
    nan |= is_nan(acc);
  }
  __syncthreads();
  if (tid == 0) { /* the reference's row maximum */
    float m = buf[0];
    for (int64_t l = 0; l < S && !is_nan(m); l++) {
      float x = buf[l];
      if (is_nan(x) || x > m) m = x;
    }
    shift_lse[0] = isinf(m) ? 0.0f : m;
  }
  __syncthreads();
  const float shift = shift_lse[0];
  if (S > 16) { /* lane l of the striped sum on thread l */
    if (tid < 16) {
      float lane = tp_expf(__fsub_rn(buf[tid], shift));
      for (int64_t j = 16 + tid; j < S; j += 16)
        lane = __fadd_rn(lane, tp_expf(__fsub_rn(buf[j], shift)));
      part[tid] = lane;
    }
    __syncthreads();
    if (tid == 0) {
      float lane[16];
#pragma unroll
      for (int l = 0; l < 16; l++) lane[l] = part[l];
#pragma unroll
      for (int width = 16; width > 1; width /= 2)
#pragma unroll
        for (int l = 0; l < width / 2; l++)
          lane[l] = __fadd_rn(lane[2 * l], lane[2 * l + 1]);
      shift_lse[1] = tp_logf(lane[0]);
    }
  } else if (tid == 0) { /* a left fold */
    float sum = tp_expf(__fsub_rn(buf[0], shift));
    for (int64_t j = 1; j < S; j++)
      sum = __fadd_rn(sum, tp_expf(__fsub_rn(buf[j], shift)));
    shift_lse[1] = tp_logf(sum);
  }
  __syncthreads();
  const float lse = shift_lse[1];
  for (int64_t j = tid; j < S; j += ATT_THREADS) {
    float lp = __fsub_rn(__fsub_rn(buf[j], shift), lse);
    if (a.logp) ((float *)a.logp)[at + j] = lp;
    float p = tp_expf(lp);
    if (a.probs) ((float *)a.probs)[at + j] = p;
    buf[j] = p;
    nan |= is_nan(lp) || is_nan(p);
  }
  __syncthreads();
  float *out = (float *)a.out + row * a.dv;
  for (int64_t c = tid; c < a.dv; c += ATT_THREADS) {
    float acc = 0.0f;
    for (int64_t j = 0; j < S; j++)
      acc = fmaf(buf[j], v[j * a.v_row + c * a.v_col], acc);
    out[c] = acc;
    nan |= is_nan(acc);
  }
  if (nan) atomicOr(nan_flag, 1u);
}

extern "C" int cuda_attention_exact(const cuda_attention_args *a,
                                    unsigned *nan_flag, void *stream) {
  if (a->f64) return (int)cudaErrorInvalidValue;
  int64_t rows = a->batch * a->t;
  if (rows == 0) return 0;
  if (rows > INT32_MAX || a->s < 1) return (int)cudaErrorInvalidValue;
  LAUNCH((unsigned)rows, ATT_THREADS, (cudaStream_t)stream, attention_kernel,
         *a, nan_flag);
  return (int)cudaGetLastError();
}

/* ----------------------------------------------------------------- maps */

/* backend.h's topos_map_op, by number (kept in step by plugin.c's
 * static assertions). */
enum {
  M_NEG = 0,
  M_EXP,
  M_LOG,
  M_SQRT,
  M_TANH,
  M_POW,
  M_RELU,
  M_ADD,
  M_SUB,
  M_MUL,
  M_DIV,
  M_MAXIMUM,
  M_STEP
};

__device__ __forceinline__ float neg_bits(float v) {
  return __uint_as_float(__float_as_uint(v) ^ 0x80000000u);
}
__device__ __forceinline__ double neg_bits(double v) {
  return __longlong_as_double(__double_as_longlong(v) ^
                              (long long)0x8000000000000000ull);
}
__device__ __forceinline__ float f_sqrt(float v) {
  return __fsqrt_rn(v);
}
__device__ __forceinline__ double f_sqrt(double v) {
  return __dsqrt_rn(v);
}
__device__ __forceinline__ float f_add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double f_add(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float f_sub(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ double f_sub(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ float f_mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double f_mul(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float f_div(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double f_div(double a, double b) {
  return __ddiv_rn(a, b);
}
/* exp, log and tanh in f32 only (cuda_map_supported). */
__device__ __forceinline__ float f_exp(float v) {
  return tp_expf(v);
}
__device__ __forceinline__ float f_log(float v) {
  return tp_logf(v);
}
__device__ __forceinline__ float f_tanh(float v) {
  return tp_tanhf(v);
}
__device__ __forceinline__ double f_exp(double v) {
  return v;
}
__device__ __forceinline__ double f_log(double v) {
  return v;
}
__device__ __forceinline__ double f_tanh(double v) {
  return v;
}

/* The reference's element (kernels_real.h), op by op. */
template <typename T>
__device__ __forceinline__ T map_one(int op, T u, T v) {
  switch (op) {
    case M_NEG:
      return neg_bits(u);
    case M_EXP:
      return f_exp(u);
    case M_LOG:
      return f_log(u);
    case M_SQRT:
      return f_sqrt(u);
    case M_TANH:
      return f_tanh(u);
    case M_RELU:
      return is_nan(u) ? u : (u > (T)0 ? u : (T)0);
    case M_ADD:
      return f_add(u, v);
    case M_SUB:
      return f_sub(u, v);
    case M_MUL:
      return f_mul(u, v);
    case M_DIV:
      return f_div(u, v);
    case M_MAXIMUM:
      return is_nan(u) ? u : is_nan(v) ? v : u >= v ? u : v;
    case M_STEP:
      return u >= v ? (T)1 : (T)0;
  }
  return u;
}

template <typename T, int OP>
__global__ void map_kernel(const T *a, const T *b, T *y, int64_t n,
                           unsigned *nan_flag) {
  bool nan = false;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    T r = map_one<T>(OP, a[i], b ? b[i] : (T)0);
    y[i] = r;
    nan |= is_nan(r);
  }
  if (nan) atomicOr(nan_flag, 1u);
}

extern "C" bool cuda_map_supported(bool f64, int op) {
  if (op < M_NEG || op > M_STEP || op == M_POW) return false;
  if (f64 && (op == M_EXP || op == M_LOG || op == M_TANH)) return false;
  return true;
}

template <typename T>
static int map_t(int op, const void *a, const void *b, void *y, int64_t n,
                 unsigned *flag, cudaStream_t st) {
  const T *pa = (const T *)a, *pb = (const T *)b;
  T *py = (T *)y;
  int grid = grid_for(n, 256, 1 << 15);
  switch (op) {
#define MAP_CASE(K)                                                 \
  case K:                                                           \
    LAUNCH(grid, 256, st, (map_kernel<T, K>), pa, pb, py, n, flag); \
    break;
    MAP_CASE(M_NEG)
    MAP_CASE(M_EXP)
    MAP_CASE(M_LOG)
    MAP_CASE(M_SQRT)
    MAP_CASE(M_TANH)
    MAP_CASE(M_RELU)
    MAP_CASE(M_ADD)
    MAP_CASE(M_SUB)
    MAP_CASE(M_MUL)
    MAP_CASE(M_DIV)
    MAP_CASE(M_MAXIMUM)
    MAP_CASE(M_STEP)
#undef MAP_CASE
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}

extern "C" int cuda_map_exact(bool f64, int op, const void *a, const void *b,
                              void *y, int64_t n, unsigned *nan_flag,
                              void *stream) {
  if (!cuda_map_supported(f64, op)) return (int)cudaErrorInvalidValue;
  if (n == 0) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  return f64 ? map_t<double>(op, a, b, y, n, nan_flag, st)
             : map_t<float>(op, a, b, y, n, nan_flag, st);
}

/* ----------------------------------------------------------------- scan */

template <typename T, typename U>
__global__ void scan_kernel(const T *x, int64_t count, unsigned *bad,
                            unsigned long long *max_bits) {
  U best = 0;
  bool nonfinite = false;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    T v = x[i];
    T a = fabs(v);
    if (!isfinite(v)) nonfinite = true; /* NaN or infinite */
    U bits;
    memcpy(&bits, &a, sizeof bits);
    if (bits > best) best = bits;
  }
  if (nonfinite) atomicOr(bad, 1u);
  atomicMax(max_bits, (unsigned long long)best);
}

extern "C" int cuda_scan(bool f64, const void *x, int64_t count, unsigned *bad,
                         unsigned long long *max_bits, void *stream) {
  if (count == 0) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  int grid = grid_for(count, 256, 1024);
  if (f64) {
    auto kernel = scan_kernel<double, unsigned long long>;
    LAUNCH(grid, 256, st, kernel, (const double *)x, count, bad, max_bits);
  } else {
    auto kernel = scan_kernel<float, unsigned>;
    LAUNCH(grid, 256, st, kernel, (const float *)x, count, bad, max_bits);
  }
  return (int)cudaGetLastError();
}
