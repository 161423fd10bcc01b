/*
 * plugin.c - the CUDA plugin (libtopos_cuda.so): the `cuda` backend
 * (exact: the reference's bits, kernels.cu) and the `cublas` backend
 * (envelope: cuBLAS, fast posture only), over the devices it was asked
 * to use.
 *
 * Tasks arrive with host pointers (backend.h).  A run binds the calling
 * thread's device (plugin.h, bind_thread; otherwise devices are dealt to
 * threads round robin), takes the device's lock - one task at a time per
 * device, on its own stream - and:
 *
 *  1. puts each operand on the device: the span of elements its strides
 *     touch (span.c), either from the blob cache, when the span lies in
 *     host memory announced with a content hash (blobcache.c: a client's
 *     unchanged parameters cross the bus once), or through the device's
 *     pinned staging buffer into a pool buffer (devpool.c: no cudaMalloc
 *     on the hot path), in chunks that alternate between the buffer's two
 *     halves so the copy into one overlaps the DMA out of the other;
 *  2. runs the kernel;
 *  3. reads back the NaN flag: a GPU writes canonical NaNs where the
 *     reference keeps the payload x86 gives, so a task whose output holds
 *     a NaN is handed back (TOPOS_ERR_RANGE) and the next exact backend
 *     or the reference computes it - the bits stay the reference's;
 *  4. otherwise copies the output back through the staging buffer.
 *
 * A CUDA error of any kind makes run() return non-zero, and the engine
 * falls back: a broken device costs speed, never a result or the process.
 * The plugin is linked with the static CUDA runtime; cuBLAS (hundreds of
 * megabytes to map) is opened with dlopen only once a device is found, so
 * a program on a host without a GPU pays nothing for it, and a host
 * without cuBLAS still gets the exact `cuda` backend.  Only the entry
 * point is exported.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobcache.h"
#include "devpool.h"
#include "exact_math.h"
#include "kernels.h"
#include "plugin.h"
#include "span.h"

_Static_assert(TOPOS_MAP_NEG == 0 && TOPOS_MAP_POW == 5 &&
                   TOPOS_MAP_RELU == 6 && TOPOS_MAP_STEP == 12,
               "kernels.cu numbers the map ops as backend.h does");

#define EXPORT __attribute__((visibility("default")))
/* A CUDA failure: the engine falls back and never shows it to a caller. */
#define ERR_DEVICE TOPOS_ERR_STATE

/* Work (multiply-adds or elements) below which a task stays on the CPU:
 * under it the bus and the launch cost more than the CPU's time. */
#define MIN_PRODUCT_WORK ((int64_t)1 << 24)
#define MIN_ELEMENTS ((int64_t)1 << 20)
/* The pinned staging buffer, two halves. */
#define STAGING_BYTES ((size_t)64 << 20)
/* cuBLAS in f32: k at most 2^16 (the envelope, as the blas backend). */
#define CUBLAS_MAX_K_F32 ((int64_t)1 << 16)

/* The cuBLAS entry points the `cublas` backend calls, from dlopen. */
static struct {
  cublasStatus_t (*create)(cublasHandle_t *);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                          int, int, int, const float *, const float *, int,
                          long long, const float *, int, long long,
                          const float *, float *, int, long long, int);
  cublasStatus_t (*dgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                          int, int, int, const double *, const double *, int,
                          long long, const double *, int, long long,
                          const double *, double *, int, long long, int);
} blas;
static char blas_missing[160]; /* why `cublas` is not offered, or "" */

/* Opens cuBLAS and resolves the entry points; false with the reason in
 * blas_missing. */
static bool blas_open(void) {
  const char *names[] = {"libcublas.so.13", "libcublas.so"};
  void *h = NULL;
  for (int i = 0; i < 2 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(blas_missing, sizeof blas_missing, "%.150s", dlerror());
    return false;
  }
  struct {
    const char *sym;
    void *slot;
  } want[] = {{"cublasCreate_v2", &blas.create},
              {"cublasSetStream_v2", &blas.set_stream},
              {"cublasSetMathMode", &blas.set_math_mode},
              {"cublasSgemmStridedBatched", &blas.sgemm},
              {"cublasDgemmStridedBatched", &blas.dgemm}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    void *f = dlsym(h, want[i].sym);
    if (!f) {
      snprintf(blas_missing, sizeof blas_missing, "cuBLAS lacks %s",
               want[i].sym);
      return false;
    }
    memcpy(want[i].slot, &f, sizeof f);
  }
  return true;
}

typedef struct device {
  int ordinal;
  char name[96];
  int cc_major, cc_minor, sms;
  uint64_t memory_total;
  pthread_mutex_t mu; /* one task at a time */
  cudaStream_t stream;
  cublasHandle_t blas;
  devpool *pool;
  blobcache *cache;
  char *staging; /* pinned, STAGING_BYTES */
  cudaEvent_t half_done[2];
  unsigned *d_flags;         /* device: [0] NaN written, [1] scan: non-finite */
  unsigned long long *d_max; /* device: scan maxima, two */
  unsigned *h_flags;         /* pinned: 2 flags + 2 maxima as 64-bit */
  atomic_ullong tasks, declined, bytes_up, bytes_down;
} device;

static device devs[TOPOS_DEVICES_MAX];
static int ndevs;
static atomic_uint next_bind;
static _Thread_local int bound = -1;

/* Whether exact_math.h's expf, logf, tanhf (index: the map op's) give
 * this process's libm bits: the kernels replay glibc 2.36's algorithms,
 * and a host whose libm computes differently must not be offered them. */
static bool math_ok[TOPOS_MAP_COUNT];

/* Min-work overrides for tests: TOPOS_CUDA_MIN_WORK=0 offers every task. */
static int64_t min_product = MIN_PRODUCT_WORK, min_elements = MIN_ELEMENTS;

/* ------------------------------------------------------------- helpers */

static int fail(topos_error *err, cudaError_t e, const char *what) {
  if (err) {
    err->code = ERR_DEVICE;
    snprintf(err->message, sizeof err->message, "cuda: %s: %s", what,
             cudaGetErrorString(e));
  }
  return ERR_DEVICE;
}

static int refuse(topos_error *err, int code, const char *why) {
  if (err) {
    err->code = code;
    snprintf(err->message, sizeof err->message, "cuda: %s", why);
  }
  return code;
}

static device *my_device(void) {
  if (bound < 0) bound = (int)(atomic_fetch_add(&next_bind, 1) % ndevs);
  return &devs[bound];
}

static int pool_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  return cudaMalloc(out, bytes) == cudaSuccess ? 0 : -1;
}

static void pool_release(void *ctx, void *ptr) {
  (void)ctx;
  cudaFree(ptr);
}

/* host -> device through the staging halves: the copy into one half
 * overlaps the DMA out of the other. */
static cudaError_t upload(device *d, void *dst, const void *src, size_t bytes) {
  const size_t half = STAGING_BYTES / 2;
  size_t i = 0;
  for (size_t off = 0; off < bytes; off += half, i++) {
    size_t len = bytes - off < half ? bytes - off : half;
    int h = (int)(i & 1);
    cudaError_t e = cudaEventSynchronize(d->half_done[h]);
    if (e != cudaSuccess) return e;
    memcpy(d->staging + h * half, (const char *)src + off, len);
    e = cudaMemcpyAsync((char *)dst + off, d->staging + h * half, len,
                        cudaMemcpyHostToDevice, d->stream);
    if (e != cudaSuccess) return e;
    e = cudaEventRecord(d->half_done[h], d->stream);
    if (e != cudaSuccess) return e;
  }
  atomic_fetch_add(&d->bytes_up, bytes);
  return cudaSuccess;
}

static int cache_upload(void *ctx, void *dev, const void *host, size_t bytes) {
  device *d = ctx;
  if (upload(d, dev, host, bytes) != cudaSuccess) return -1;
  return cudaStreamSynchronize(d->stream) == cudaSuccess ? 0 : -1;
}

/* device -> host, the DMA of chunk i+1 overlapping the copy out of i. */
static cudaError_t download(device *d, void *dst, const void *src,
                            size_t bytes) {
  const size_t half = STAGING_BYTES / 2;
  size_t nchunks = (bytes + half - 1) / half;
  for (size_t i = 0; i <= nchunks; i++) {
    if (i < nchunks) {
      size_t off = i * half, len = bytes - off < half ? bytes - off : half;
      int h = (int)(i & 1);
      cudaError_t e =
          cudaMemcpyAsync(d->staging + h * half, (const char *)src + off, len,
                          cudaMemcpyDeviceToHost, d->stream);
      if (e != cudaSuccess) return e;
      e = cudaEventRecord(d->half_done[h], d->stream);
      if (e != cudaSuccess) return e;
    }
    if (i > 0) {
      size_t j = i - 1, off = j * half;
      size_t len = bytes - off < half ? bytes - off : half;
      int h = (int)(j & 1);
      cudaError_t e = cudaEventSynchronize(d->half_done[h]);
      if (e != cudaSuccess) return e;
      memcpy((char *)dst + off, d->staging + h * half, len);
    }
  }
  atomic_fetch_add(&d->bytes_down, bytes);
  return cudaSuccess;
}

/* ------------------------------------------------------------- operands */

/* One operand on the device: `ptr` addresses element 0 of the host view
 * (so the task's strides apply unchanged); the buffer behind it is a pool
 * block or a cache entry, released by operand_drop. */
typedef struct operand {
  const char *ptr;
  void *block;  /* pool block, or NULL */
  void *cached; /* cache entry, or NULL */
} operand;

static void operand_drop(device *d, operand *o) {
  if (o->block) devpool_put(d->pool, o->block);
  if (o->cached) blobcache_release(d->cache, o->cached);
  memset(o, 0, sizeof *o);
}

/* Puts the elements host + [lo, hi) (element size es) on the device. */
static int operand_put(device *d, const void *host, int64_t lo, int64_t hi,
                       size_t es, operand *o, topos_error *err) {
  memset(o, 0, sizeof *o);
  if (hi <= lo) { /* touches nothing: any device address will do */
    o->block = devpool_get(d->pool, es, NULL);
    o->ptr = o->block;
    return o->block ? 0 : refuse(err, TOPOS_ERR_MEMORY, "device memory");
  }
  const char *first = (const char *)host + lo * (int64_t)es;
  size_t bytes = (size_t)(hi - lo) * es;
  uint8_t hash[32];
  const void *base;
  size_t len;
  if (blobcache_find_range(d->cache, first, bytes, hash, &base, &len)) {
    bool hit;
    char *dev = blobcache_acquire(d->cache, hash, base, len, &hit);
    if (dev) {
      o->cached = dev;
      o->ptr = dev + ((const char *)host - (const char *)base);
      return 0;
    }
    /* No room in the cache: the plain path below. */
  }
  char *dev = devpool_get(d->pool, bytes, NULL);
  if (!dev) return refuse(err, TOPOS_ERR_MEMORY, "device memory exhausted");
  o->block = dev;
  cudaError_t e = upload(d, dev, first, bytes);
  if (e != cudaSuccess) {
    operand_drop(d, o);
    return fail(err, e, "upload");
  }
  o->ptr = dev - lo * (int64_t)es;
  return 0;
}

static int operand_put3(device *d, const void *host, int64_t e0, int64_t s0,
                        int64_t e1, int64_t s1, int64_t e2, int64_t s2,
                        size_t es, operand *o, topos_error *err) {
  int64_t ext[3] = {e0, e1, e2}, str[3] = {s0, s1, s2}, lo, hi;
  if (span_elems(3, ext, str, &lo, &hi) != 0)
    return refuse(err, TOPOS_ERR_RANGE, "operand span overflows");
  return operand_put(d, host, lo, hi, es, o, err);
}

/* The output: a pool block of `bytes`, copied to host after the kernel
 * unless the kernel wrote a NaN.  Returns 0, TOPOS_ERR_RANGE (NaN: hand
 * back) or an error. */
static int finish(device *d, void *host_out, void *dev_out, size_t bytes,
                  topos_error *err) {
  cudaError_t e = cudaMemcpyAsync(d->h_flags, d->d_flags, sizeof(unsigned),
                                  cudaMemcpyDeviceToHost, d->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
  if (e != cudaSuccess) return fail(err, e, "kernel");
  if (d->h_flags[0]) {
    atomic_fetch_add(&d->declined, 1);
    return refuse(err, TOPOS_ERR_RANGE,
                  "the output holds a NaN: the reference computes it (a GPU "
                  "does not keep NaN payloads)");
  }
  e = download(d, host_out, dev_out, bytes);
  if (e != cudaSuccess) return fail(err, e, "download");
  return 0;
}

static size_t dtype_size(topos_dtype t) {
  return t == TOPOS_F64 ? sizeof(double) : sizeof(float);
}

static bool real(topos_dtype t) {
  return t == TOPOS_F32 || t == TOPOS_F64;
}

static int64_t mul_sat(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > INT64_MAX / b ? INT64_MAX : a * b;
}

/* A GEMM's C must be dense row-major (the output is copied back whole). */
static bool c_dense(const topos_gemm_task *g) {
  return g->c_col == 1 && (g->m <= 1 || g->c_row == g->n) &&
         (g->batch <= 1 || g->c_batch == g->m * g->n);
}

/* ------------------------------------------------------- exact: `cuda` */

/*
 * The device runs the same source (exact_math.h) as this host code, so
 * the host build compared with libm says whether the device's results
 * are libm's: every 4093rd bit pattern, and the ends of each branch,
 * about a million inputs per function (milliseconds).  A NaN result may
 * be any NaN (the plugin hands NaN outputs back).
 */
static bool math_check(int op) {
  for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 4093) {
    for (int d = 0; d < 3; d++) { /* and a neighbour each side */
      uint32_t b = (uint32_t)(u + (uint64_t)d * 2047);
      float x, want, got;
      memcpy(&x, &b, sizeof x);
      switch (op) {
        case TOPOS_MAP_EXP:
          want = expf(x);
          got = tp_expf(x);
          break;
        case TOPOS_MAP_LOG:
          want = logf(x);
          got = tp_logf(x);
          break;
        default:
          want = tanhf(x);
          got = tp_tanhf(x);
          break;
      }
      if (isnan(want) && isnan(got)) continue;
      if (memcmp(&want, &got, sizeof want) != 0) return false;
    }
  }
  return true;
}

/* Whether run() can compute the task at all (dtype, layout, op). */
static bool cuda_valid(const topos_task *t) {
  switch (t->kind) {
    case TOPOS_TASK_GEMM:
      return real(t->u.gemm.dtype) && c_dense(&t->u.gemm);
    case TOPOS_TASK_WINDOW:
      return real(t->u.window.dtype);
    case TOPOS_TASK_REDUCE:
      return real(t->u.reduce.dtype);
    case TOPOS_TASK_MAP: {
      const topos_map_task *m = &t->u.map;
      bool libm = m->op == TOPOS_MAP_EXP || m->op == TOPOS_MAP_LOG ||
                  m->op == TOPOS_MAP_TANH;
      return real(m->dtype) &&
             cuda_map_supported(m->dtype == TOPOS_F64, (int)m->op) &&
             (!libm || math_ok[m->op]);
    }
    case TOPOS_TASK_ATTENTION: /* exp and log: f32 exact_math.h */
      return t->u.attention.dtype == TOPOS_F32 && math_ok[TOPOS_MAP_EXP] &&
             math_ok[TOPOS_MAP_LOG];
    default:
      return false;
  }
}

/* The work a task carries: multiply-adds or elements. */
static int64_t task_work(const topos_task *t) {
  switch (t->kind) {
    case TOPOS_TASK_GEMM: {
      const topos_gemm_task *g = &t->u.gemm;
      return mul_sat(mul_sat(mul_sat(g->batch, g->m), g->n), g->k);
    }
    case TOPOS_TASK_WINDOW: {
      const topos_window_task *w = &t->u.window;
      int64_t rows = mul_sat(mul_sat(w->n, w->oh), w->ow);
      return mul_sat(mul_sat(rows, w->o), mul_sat(mul_sat(w->c, w->kh), w->kw));
    }
    case TOPOS_TASK_REDUCE: {
      const topos_reduce_task *r = &t->u.reduce;
      return mul_sat(mul_sat(r->outer, r->L), r->inner);
    }
    case TOPOS_TASK_MAP:
      return t->u.map.n;
    case TOPOS_TASK_ATTENTION: {
      const topos_attention_task *a = &t->u.attention;
      return mul_sat(mul_sat(mul_sat(a->batch, a->t), a->s), a->dh + a->dv);
    }
    default:
      return 0;
  }
}

/* Offered: valid and worth the bus. */
static bool cuda_supports(const topos_backend *self, const topos_task *t) {
  (void)self;
  bool product = t->kind == TOPOS_TASK_GEMM || t->kind == TOPOS_TASK_WINDOW ||
                 t->kind == TOPOS_TASK_ATTENTION;
  return cuda_valid(t) &&
         task_work(t) >= (product ? min_product : min_elements);
}

/* Launches one task's kernel into `out` (its output block), with the
 * operands already on the device. */
typedef cudaError_t (*launch_fn)(device *d, const void *task, const operand *in,
                                 void *out);

/* Drops n operands, passing rc through. */
static int drop_all(device *d, operand *in, int n, int rc) {
  for (int i = 0; i < n; i++) operand_drop(d, &in[i]);
  return rc;
}

/* The rest of every task but attention: an output block of `bytes`, the
 * NaN flag cleared, the kernel, and finish(); the operands dropped. */
static int compute(device *d, const void *task, operand *in, int nin,
                   void *host_out, size_t bytes, launch_fn launch,
                   const char *what, topos_error *err) {
  int rc;
  void *out = devpool_get(d->pool, bytes ? bytes : 1, NULL);
  if (!out) {
    rc = refuse(err, TOPOS_ERR_MEMORY, "device memory exhausted");
  } else {
    cudaError_t e = cudaMemsetAsync(d->d_flags, 0, sizeof(unsigned), d->stream);
    if (e == cudaSuccess) e = launch(d, task, in, out);
    rc = e != cudaSuccess ? fail(err, e, what)
                          : finish(d, host_out, out, bytes, err);
    devpool_put(d->pool, out);
  }
  return drop_all(d, in, nin, rc);
}

static cudaError_t launch_gemm(device *d, const void *task, const operand *in,
                               void *out) {
  const topos_gemm_task *g = task;
  cuda_gemm_args a = {.f64 = g->dtype == TOPOS_F64,
                      .batch = g->batch,
                      .m = g->m,
                      .n = g->n,
                      .k = g->k,
                      .a = in[0].ptr,
                      .a_row = g->a_row,
                      .a_col = g->a_col,
                      .a_batch = g->a_batch,
                      .b = in[1].ptr,
                      .b_row = g->b_row,
                      .b_col = g->b_col,
                      .b_batch = g->b_batch,
                      .c = out};
  return (cudaError_t)cuda_gemm_exact(&a, d->d_flags, d->stream);
}

static int run_gemm(device *d, const topos_gemm_task *g, topos_error *err) {
  size_t es = dtype_size(g->dtype);
  operand in[2] = {{0}};
  int rc = operand_put3(d, g->a, g->batch, g->a_batch, g->m, g->a_row, g->k,
                        g->a_col, es, &in[0], err);
  if (!rc)
    rc = operand_put3(d, g->b, g->batch, g->b_batch, g->k, g->b_row, g->n,
                      g->b_col, es, &in[1], err);
  if (rc) return drop_all(d, in, 2, rc);
  return compute(d, g, in, 2, g->c, (size_t)(g->batch * g->m * g->n) * es,
                 launch_gemm, "gemm", err);
}

static cudaError_t launch_window(device *d, const void *task, const operand *in,
                                 void *out) {
  const topos_window_task *w = task;
  cuda_window_args a = {.f64 = w->dtype == TOPOS_F64,
                        .n = w->n,
                        .c = w->c,
                        .h = w->h,
                        .w = w->w,
                        .x = in[0].ptr,
                        .o = w->o,
                        .weight = in[1].ptr,
                        .w_row = w->w_row,
                        .w_col = w->w_col,
                        .kh = w->kh,
                        .kw = w->kw,
                        .stride_h = w->stride_h,
                        .stride_w = w->stride_w,
                        .dil_h = w->dil_h,
                        .dil_w = w->dil_w,
                        .pad_top = w->pad_top,
                        .pad_left = w->pad_left,
                        .oh = w->oh,
                        .ow = w->ow,
                        .out = out};
  return (cudaError_t)cuda_window_exact(&a, d->d_flags, d->stream);
}

static int run_window(device *d, const topos_window_task *w, topos_error *err) {
  size_t es = dtype_size(w->dtype);
  operand in[2] = {{0}};
  int rc = operand_put(d, w->x, 0, w->n * w->c * w->h * w->w, es, &in[0], err);
  if (!rc)
    rc = operand_put3(d, w->weight, 1, 0, w->c * w->kh * w->kw, w->w_row, w->o,
                      w->w_col, es, &in[1], err);
  if (rc) return drop_all(d, in, 2, rc);
  return compute(d, w, in, 2, w->out,
                 (size_t)(w->n * w->oh * w->ow * w->o) * es, launch_window,
                 "window", err);
}

static cudaError_t launch_reduce(device *d, const void *task, const operand *in,
                                 void *out) {
  const topos_reduce_task *r = task;
  return (cudaError_t)cuda_reduce_exact(r->dtype == TOPOS_F64, in[0].ptr, out,
                                        r->outer, r->L, r->inner, d->d_flags,
                                        d->stream);
}

static int run_reduce(device *d, const topos_reduce_task *r, topos_error *err) {
  size_t es = dtype_size(r->dtype);
  operand in[1] = {{0}};
  int rc = operand_put(d, r->x, 0, r->outer * r->L * r->inner, es, &in[0], err);
  if (rc) return rc;
  return compute(d, r, in, 1, r->y, (size_t)(r->outer * r->inner) * es,
                 launch_reduce, "reduce", err);
}

static cudaError_t launch_map(device *d, const void *task, const operand *in,
                              void *out) {
  const topos_map_task *m = task;
  return (cudaError_t)cuda_map_exact(m->dtype == TOPOS_F64, (int)m->op,
                                     in[0].ptr,
                                     m->op >= TOPOS_MAP_ADD ? in[1].ptr : NULL,
                                     out, m->n, d->d_flags, d->stream);
}

static int run_map(device *d, const topos_map_task *m, topos_error *err) {
  size_t es = dtype_size(m->dtype);
  operand in[2] = {{0}};
  int rc = operand_put(d, m->a, 0, m->n, es, &in[0], err);
  if (!rc && m->op >= TOPOS_MAP_ADD)
    rc = operand_put(d, m->b, 0, m->n, es, &in[1], err);
  if (rc) return drop_all(d, in, 2, rc);
  return compute(d, m, in, 2, m->y, (size_t)m->n * es, launch_map, "map", err);
}

/* The attention chain: q, k, v, scale and mask by their spans; out and
 * each row output asked for in pool blocks, copied back only when no
 * NaN was written. */
static int run_attention(device *d, const topos_attention_task *t,
                         topos_error *err) {
  const size_t es = sizeof(float);
  operand in[5] = {{0}};
  void *outs[6] = {0}, *rows = NULL;
  void *host[6] = {
      t->out,  t->raw,  t->scale ? t->scaled : NULL, t->mask ? t->masked : NULL,
      t->logp, t->probs};
  size_t obytes = (size_t)(t->batch * t->t * t->dv) * es;
  size_t rbytes = (size_t)(t->batch * t->t * t->s) * es;
  int rc = operand_put3(d, t->q, t->batch, t->q_batch, t->t, t->q_row, t->dh,
                        t->q_col, es, &in[0], err);
  if (!rc)
    rc = operand_put3(d, t->k, t->batch, t->k_batch, t->dh, t->k_row, t->s,
                      t->k_col, es, &in[1], err);
  if (!rc)
    rc = operand_put3(d, t->v, t->batch, t->v_batch, t->s, t->v_row, t->dv,
                      t->v_col, es, &in[2], err);
  if (!rc && t->scale)
    rc = operand_put3(d, t->scale, t->batch, t->scale_batch, t->t, t->scale_row,
                      t->s, t->scale_col, es, &in[3], err);
  if (!rc && t->mask)
    rc = operand_put3(d, t->mask, t->batch, t->mask_batch, t->t, t->mask_row,
                      t->s, t->mask_col, es, &in[4], err);
  for (int o = 0; o < 6 && !rc; o++)
    if (host[o] && !(outs[o] = devpool_get(d->pool, o ? rbytes : obytes, NULL)))
      rc = refuse(err, TOPOS_ERR_MEMORY, "device memory exhausted");
  if (!rc && !(rows = devpool_get(d->pool, rbytes, NULL)))
    rc = refuse(err, TOPOS_ERR_MEMORY, "device memory exhausted");
  if (!rc) {
    cuda_attention_args a = {.batch = t->batch,
                             .t = t->t,
                             .s = t->s,
                             .dh = t->dh,
                             .dv = t->dv,
                             .q = in[0].ptr,
                             .q_batch = t->q_batch,
                             .q_row = t->q_row,
                             .q_col = t->q_col,
                             .k = in[1].ptr,
                             .k_batch = t->k_batch,
                             .k_row = t->k_row,
                             .k_col = t->k_col,
                             .v = in[2].ptr,
                             .v_batch = t->v_batch,
                             .v_row = t->v_row,
                             .v_col = t->v_col,
                             .scale = t->scale ? in[3].ptr : NULL,
                             .scale_batch = t->scale_batch,
                             .scale_row = t->scale_row,
                             .scale_col = t->scale_col,
                             .mask = t->mask ? in[4].ptr : NULL,
                             .mask_batch = t->mask_batch,
                             .mask_row = t->mask_row,
                             .mask_col = t->mask_col,
                             .out = outs[0],
                             .raw = outs[1],
                             .scaled = outs[2],
                             .masked = outs[3],
                             .logp = outs[4],
                             .probs = outs[5],
                             .rows = rows};
    cudaError_t e = cudaMemsetAsync(d->d_flags, 0, sizeof(unsigned), d->stream);
    if (e == cudaSuccess)
      e = (cudaError_t)cuda_attention_exact(&a, d->d_flags, d->stream);
    rc = e != cudaSuccess ? fail(err, e, "attention")
                          : finish(d, host[0], outs[0], obytes, err);
    for (int o = 1; o < 6 && !rc; o++) {
      if (!host[o]) continue;
      e = download(d, host[o], outs[o], rbytes);
      if (e != cudaSuccess) rc = fail(err, e, "download");
    }
  }
  for (int o = 0; o < 6; o++)
    if (outs[o]) devpool_put(d->pool, outs[o]);
  if (rows) devpool_put(d->pool, rows);
  for (int i = 0; i < 5; i++) operand_drop(d, &in[i]);
  return rc;
}

static int cuda_run(const topos_backend *self, const topos_task *t,
                    topos_error *err) {
  (void)self;
  if (!cuda_valid(t))
    return refuse(err, TOPOS_ERR_ARGUMENT, "task not supported");
  device *d = my_device();
  pthread_mutex_lock(&d->mu);
  int rc;
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e != cudaSuccess) {
    rc = fail(err, e, "set device");
  } else {
    switch (t->kind) {
      case TOPOS_TASK_GEMM:
        rc = run_gemm(d, &t->u.gemm, err);
        break;
      case TOPOS_TASK_WINDOW:
        rc = run_window(d, &t->u.window, err);
        break;
      case TOPOS_TASK_REDUCE:
        rc = run_reduce(d, &t->u.reduce, err);
        break;
      case TOPOS_TASK_MAP:
        rc = run_map(d, &t->u.map, err);
        break;
      case TOPOS_TASK_ATTENTION:
        rc = run_attention(d, &t->u.attention, err);
        break;
      default:
        rc = refuse(err, TOPOS_ERR_ARGUMENT, "task kind not supported");
    }
  }
  if (rc == 0) atomic_fetch_add(&d->tasks, 1);
  pthread_mutex_unlock(&d->mu);
  return rc;
}

/* ---------------------------------------------------- fast: `cublas` */

/* A (rows x cols, strides row/col) as cuBLAS sees it in column-major:
 * row-major storage is the transpose (op N on Aᵀ), column-major storage
 * is A itself (op T).  False when neither unit stride fits. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t row, int64_t col,
                        cublasOperation_t *op, int64_t *ld) {
  if (col == 1 && (rows <= 1 || row >= cols)) {
    *op = CUBLAS_OP_N;
    *ld = rows <= 1 ? (cols > 0 ? cols : 1) : row;
    return true;
  }
  if (row == 1 && (cols <= 1 || col >= rows)) {
    *op = CUBLAS_OP_T;
    *ld = cols <= 1 ? (rows > 0 ? rows : 1) : col;
    return true;
  }
  return false;
}

static bool cublas_valid(const topos_task *t) {
  if (t->kind != TOPOS_TASK_GEMM) return false;
  const topos_gemm_task *g = &t->u.gemm;
  cublasOperation_t op;
  int64_t ld;
  if (!real(g->dtype) || !c_dense(g) || g->m < 1 || g->n < 1 || g->k < 1)
    return false;
  if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX ||
      g->batch > INT32_MAX)
    return false;
  if (g->dtype == TOPOS_F32 && g->k > CUBLAS_MAX_K_F32) return false;
  if (!blas_layout(g->m, g->k, g->a_row, g->a_col, &op, &ld) || ld > INT32_MAX)
    return false;
  if (!blas_layout(g->k, g->n, g->b_row, g->b_col, &op, &ld) || ld > INT32_MAX)
    return false;
  return true;
}

static bool cublas_supports(const topos_backend *self, const topos_task *t) {
  (void)self;
  return cublas_valid(t) && task_work(t) >= min_product;
}

/* numerics.md's envelope wants NaN and Inf exactly where the reference
 * has them; summed in another order they can move once a partial sum can
 * overflow.  So, as the blas backend does: decline when an operand holds
 * a NaN or an infinity, or max|A|·max|B|·k could overflow. */
static int scan_operands(device *d, const topos_gemm_task *g, const operand *a,
                         const operand *b, int64_t span_a, int64_t span_b,
                         const char *a_first, const char *b_first,
                         topos_error *err) {
  bool f64 = g->dtype == TOPOS_F64;
  cudaError_t e =
      cudaMemsetAsync(d->d_flags, 0, 2 * sizeof(unsigned), d->stream);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(d->d_max, 0, 2 * sizeof(unsigned long long), d->stream);
  if (e == cudaSuccess)
    e = (cudaError_t)cuda_scan(f64, a_first, span_a, d->d_flags + 1, d->d_max,
                               d->stream);
  if (e == cudaSuccess)
    e = (cudaError_t)cuda_scan(f64, b_first, span_b, d->d_flags + 1,
                               d->d_max + 1, d->stream);
  unsigned long long *hmax = (unsigned long long *)(d->h_flags + 2);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d->h_flags, d->d_flags, 2 * sizeof(unsigned),
                        cudaMemcpyDeviceToHost, d->stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(hmax, d->d_max, 2 * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, d->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
  if (e != cudaSuccess) return fail(err, e, "scan");
  (void)a;
  (void)b;
  if (d->h_flags[1])
    return refuse(err, TOPOS_ERR_RANGE, "an operand holds NaN or Inf");
  double ma, mb;
  if (f64) {
    memcpy(&ma, &hmax[0], sizeof ma);
    memcpy(&mb, &hmax[1], sizeof mb);
  } else {
    uint32_t ua = (uint32_t)hmax[0], ub = (uint32_t)hmax[1];
    float fa, fb;
    memcpy(&fa, &ua, sizeof fa);
    memcpy(&fb, &ub, sizeof fb);
    ma = fa;
    mb = fb;
  }
  double limit = f64 ? 1.7976931348623157e308 / 4 : 3.4028234663852886e38 / 4;
  if (ma * mb * (double)g->k > limit)
    return refuse(err, TOPOS_ERR_RANGE, "the product could overflow");
  return 0;
}

static int cublas_run(const topos_backend *self, const topos_task *t,
                      topos_error *err) {
  (void)self;
  if (!cublas_valid(t))
    return refuse(err, TOPOS_ERR_ARGUMENT, "task not supported");
  const topos_gemm_task *g = &t->u.gemm;
  size_t es = dtype_size(g->dtype);
  device *d = my_device();
  pthread_mutex_lock(&d->mu);
  int rc = 0;
  operand a = {0}, b = {0};
  void *c = NULL;
  cudaError_t e = cudaSetDevice(d->ordinal);
  int64_t alo, ahi, blo, bhi;
  int64_t ae[3] = {g->batch, g->m, g->k},
          as[3] = {g->a_batch, g->a_row, g->a_col};
  int64_t be[3] = {g->batch, g->k, g->n},
          bs[3] = {g->b_batch, g->b_row, g->b_col};
  if (e != cudaSuccess) {
    rc = fail(err, e, "set device");
    goto out;
  }
  if (span_elems(3, ae, as, &alo, &ahi) || span_elems(3, be, bs, &blo, &bhi)) {
    rc = refuse(err, TOPOS_ERR_RANGE, "operand span overflows");
    goto out;
  }
  if ((rc = operand_put(d, g->a, alo, ahi, es, &a, err)) != 0 ||
      (rc = operand_put(d, g->b, blo, bhi, es, &b, err)) != 0)
    goto out;
  rc = scan_operands(d, g, &a, &b, ahi - alo, bhi - blo,
                     a.ptr + alo * (int64_t)es, b.ptr + blo * (int64_t)es, err);
  if (rc) goto out;
  size_t cbytes = (size_t)(g->batch * g->m * g->n) * es;
  c = devpool_get(d->pool, cbytes, NULL);
  if (!c) {
    rc = refuse(err, TOPOS_ERR_MEMORY, "device memory exhausted");
    goto out;
  }
  /* Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ. */
  cublasOperation_t opa, opb;
  int64_t lda, ldb;
  blas_layout(g->m, g->k, g->a_row, g->a_col, &opa, &lda);
  blas_layout(g->k, g->n, g->b_row, g->b_col, &opb, &ldb);
  cublasStatus_t s;
  if (g->dtype == TOPOS_F64) {
    const double one = 1, zero = 0;
    s = blas.dgemm(d->blas, opb, opa, (int)g->n, (int)g->m, (int)g->k, &one,
                   (const double *)b.ptr, (int)ldb, g->b_batch,
                   (const double *)a.ptr, (int)lda, g->a_batch, &zero, c,
                   (int)g->n, g->m * g->n, (int)g->batch);
  } else {
    const float one = 1, zero = 0;
    s = blas.sgemm(d->blas, opb, opa, (int)g->n, (int)g->m, (int)g->k, &one,
                   (const float *)b.ptr, (int)ldb, g->b_batch,
                   (const float *)a.ptr, (int)lda, g->a_batch, &zero, c,
                   (int)g->n, g->m * g->n, (int)g->batch);
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    if (err) {
      err->code = ERR_DEVICE;
      snprintf(err->message, sizeof err->message, "cublas: gemm: status %d",
               (int)s);
    }
    rc = ERR_DEVICE;
    goto out;
  }
  e = download(d, g->c, c, cbytes);
  if (e != cudaSuccess) rc = fail(err, e, "download");
out:
  if (c) devpool_put(d->pool, c);
  operand_drop(d, &a);
  operand_drop(d, &b);
  if (rc == 0) atomic_fetch_add(&d->tasks, 1);
  pthread_mutex_unlock(&d->mu);
  return rc;
}

/* ----------------------------------------------------------- listing */

static void cuda_device(const topos_backend *self, char *buf, size_t len) {
  (void)self;
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < ndevs && used < len; i++) {
    int w = snprintf(buf + used, len - used, "%s%d: %s (sm_%d%d)",
                     i ? ", " : "", devs[i].ordinal, devs[i].name,
                     devs[i].cc_major, devs[i].cc_minor);
    if (w < 0) break;
    used += (size_t)w;
  }
}

static int one_thread(const topos_backend *self) {
  (void)self;
  return 1;
}

static const topos_backend cuda_backend = {
    .name = "cuda",
    .fidelity = TOPOS_FIDELITY_EXACT,
    .supports = cuda_supports,
    .run = cuda_run,
    .tasks = 1u << TOPOS_TASK_GEMM | 1u << TOPOS_TASK_WINDOW |
             1u << TOPOS_TASK_REDUCE | 1u << TOPOS_TASK_MAP |
             1u << TOPOS_TASK_ATTENTION,
    .dtypes = 1u << TOPOS_F32 | 1u << TOPOS_F64,
    .device = cuda_device,
    .max_threads = one_thread,
    .task_block = (int64_t)1 << 36,
};

static const topos_backend cublas_backend = {
    .name = "cublas",
    .fidelity = TOPOS_FIDELITY_ENVELOPE,
    .supports = cublas_supports,
    .run = cublas_run,
    .tasks = 1u << TOPOS_TASK_GEMM,
    .dtypes = 1u << TOPOS_F32 | 1u << TOPOS_F64,
    .device = cuda_device,
    .max_threads = one_thread,
    .task_block = (int64_t)1 << 36,
};

static const topos_backend *const backends[] = {&cuda_backend, &cublas_backend};

static int list_devices(topos_device_info *out, int max) {
  for (int i = 0; i < ndevs && i < max; i++) {
    device *d = &devs[i];
    topos_device_info *o = &out[i];
    memset(o, 0, sizeof *o);
    snprintf(o->backend, sizeof o->backend, "cuda");
    o->ordinal = d->ordinal;
    snprintf(o->name, sizeof o->name, "%s", d->name);
    o->memory_total = d->memory_total;
    o->cc_major = d->cc_major;
    o->cc_minor = d->cc_minor;
    o->multiprocessors = d->sms;
    o->tasks = atomic_load(&d->tasks);
    o->declined = atomic_load(&d->declined);
    o->bytes_up = atomic_load(&d->bytes_up);
    o->bytes_down = atomic_load(&d->bytes_down);
    /* Without the device's lock: a listing (a health probe) must not wait
     * for a task.  The runtime's calls are thread-safe, and the pool and
     * the cache have locks of their own. */
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d->ordinal) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      o->memory_free = free_b;
    blobcache_stats cs;
    blobcache_get_stats(d->cache, &cs);
    devpool_stats ps;
    devpool_get_stats(d->pool, &ps);
    o->cache_hits = cs.hits;
    o->cache_misses = cs.misses;
    o->cache_bytes = cs.bytes;
    o->pool_bytes = ps.bytes_in_use + ps.bytes_cached;
  }
  return ndevs;
}

static int bind_thread(int slot) {
  if (slot < 0) slot = -slot;
  bound = slot % ndevs;
  return devs[bound].ordinal;
}

static int announce(const void *host, size_t bytes, const uint8_t hash[32]) {
  int rc = 0;
  for (int i = 0; i < ndevs; i++)
    if (blobcache_announce(devs[i].cache, host, bytes, hash) != 0) rc = -1;
  return rc;
}

static void retract(const void *host) {
  for (int i = 0; i < ndevs; i++) blobcache_retract(devs[i].cache, host);
}

static int bench_gemm(int n, bool f64, bool use_blas, int reps, double *seconds,
                      char *err, size_t errlen) {
  if (n < 1 || n > 65536 || reps < 1) {
    snprintf(err, errlen, "bench: n %d or reps %d out of range", n, reps);
    return -1;
  }
  if (use_blas && blas_missing[0]) {
    snprintf(err, errlen, "bench: no cuBLAS: %s", blas_missing);
    return -1;
  }
  device *d = my_device();
  pthread_mutex_lock(&d->mu);
  size_t es = f64 ? sizeof(double) : sizeof(float);
  size_t bytes = (size_t)n * (size_t)n * es;
  void *a = NULL, *b = NULL, *c = NULL, *host = NULL;
  cudaEvent_t t0 = NULL, t1 = NULL;
  const char *what = "set device";
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess) {
    what = "allocate";
    e = cudaMalloc(&a, bytes);
  }
  if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&c, bytes);
  if (e == cudaSuccess && !(host = malloc(bytes)))
    e = cudaErrorMemoryAllocation;
  if (e == cudaSuccess) { /* values in [-1, 1): no NaN, no overflow */
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      double v = (double)(r >> 11) / 4503599627370496.0 - 1.0;
      if (f64)
        ((double *)host)[i] = v;
      else
        ((float *)host)[i] = (float)v;
    }
    what = "upload";
    e = cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice);
  }
  if (e == cudaSuccess) e = cudaMemcpy(b, host, bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaEventCreate(&t0);
  if (e == cudaSuccess) e = cudaEventCreate(&t1);
  cuda_gemm_args g = {.f64 = f64,
                      .batch = 1,
                      .m = n,
                      .n = n,
                      .k = n,
                      .a = a,
                      .a_row = n,
                      .a_col = 1,
                      .b = b,
                      .b_row = n,
                      .b_col = 1,
                      .c = c};
  const float one32 = 1, zero32 = 0;
  const double one64 = 1, zero64 = 0;
  what = "product";
  for (int i = -1; i < reps && e == cudaSuccess; i++) { /* -1: warm-up */
    if (i == 0) e = cudaEventRecord(t0, d->stream);
    if (e != cudaSuccess) break;
    if (!use_blas) {
      e = (cudaError_t)cuda_gemm_exact(&g, d->d_flags, d->stream);
    } else {
      cublasStatus_t s =
          f64 ? blas.dgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one64,
                           b, n, 0, a, n, 0, &zero64, c, n, 0, 1)
              : blas.sgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one32,
                           b, n, 0, a, n, 0, &zero32, c, n, 0, 1);
      if (s != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    }
  }
  if (e == cudaSuccess) e = cudaEventRecord(t1, d->stream);
  if (e == cudaSuccess) e = cudaEventSynchronize(t1);
  float ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t0, t1);
  if (e == cudaSuccess)
    *seconds = ms / 1000.0 / reps;
  else
    snprintf(err, errlen, "bench: %s: %s", what, cudaGetErrorString(e));
  if (t0) cudaEventDestroy(t0);
  if (t1) cudaEventDestroy(t1);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  free(host);
  pthread_mutex_unlock(&d->mu);
  return e == cudaSuccess ? 0 : -1;
}

static topos_plugin plugin = {
    .abi = TOPOS_PLUGIN_ABI,
    .name = "cuda",
    .nbackends = 2, /* 1 when cuBLAS is missing: topos_plugin_init */
    .backends = backends,
    .devices = list_devices,
    .bind_thread = bind_thread,
    .announce = announce,
    .retract = retract,
    .bench_gemm = bench_gemm,
};

/* ---------------------------------------------------------------- init */

static int device_open(device *d, int ordinal, const topos_plugin_options *o,
                       char *err, size_t errlen) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, ordinal);
  if (e == cudaSuccess) e = cudaSetDevice(ordinal);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "device %d: %s", ordinal, cudaGetErrorString(e));
    return -1;
  }
  d->ordinal = ordinal;
  snprintf(d->name, sizeof d->name, "%.95s", p.name);
  d->cc_major = p.major;
  d->cc_minor = p.minor;
  d->sms = p.multiProcessorCount;
  d->memory_total = p.totalGlobalMem;
  pthread_mutex_init(&d->mu, NULL);
  const char *what = "stream";
  e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    what = "pinned staging buffer";
    e = cudaHostAlloc((void **)&d->staging, STAGING_BYTES,
                      cudaHostAllocDefault);
  }
  if (e == cudaSuccess) {
    what = "pinned flags";
    e = cudaHostAlloc((void **)&d->h_flags, 64, cudaHostAllocDefault);
  }
  if (e == cudaSuccess) {
    what = "device flags";
    e = cudaMalloc((void **)&d->d_flags, 64);
  }
  if (e == cudaSuccess) e = cudaMalloc((void **)&d->d_max, 64);
  for (int h = 0; h < 2 && e == cudaSuccess; h++) {
    what = "events";
    e = cudaEventCreateWithFlags(&d->half_done[h], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    snprintf(err, errlen, "device %d: %s: %s", ordinal, what,
             cudaGetErrorString(e));
    return -1;
  }
  if (!blas_missing[0]) {
    cublasStatus_t s = blas.create(&d->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = blas.set_stream(d->blas, d->stream);
    /* FP32 stays FP32: no TF32 tensor cores unless a caller asks. */
    if (s == CUBLAS_STATUS_SUCCESS)
      s = blas.set_math_mode(d->blas, CUBLAS_PEDANTIC_MATH);
    if (s != CUBLAS_STATUS_SUCCESS)
      snprintf(blas_missing, sizeof blas_missing,
               "device %d: cublasCreate: status %d", ordinal, (int)s);
  }
  uint64_t pool = o->pool_bytes ? o->pool_bytes : d->memory_total / 2;
  uint64_t cache = o->cache_bytes ? o->cache_bytes : d->memory_total / 4;
  devpool_allocator al = {
      .ctx = d, .alloc = pool_alloc, .release = pool_release};
  d->pool = devpool_new(al, (size_t)(pool + cache));
  d->cache =
      d->pool ? blobcache_new(d->pool, (size_t)cache, cache_upload, d) : NULL;
  if (!d->cache) {
    snprintf(err, errlen, "device %d: out of host memory", ordinal);
    return -1;
  }
  return 0;
}

EXPORT int topos_plugin_init(const topos_plugin_options *opt,
                             const topos_plugin **out, char *err,
                             size_t errlen) {
  static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
  static int state; /* 0 not tried, 1 ok, -1 failed */
  static char why[192];
  pthread_mutex_lock(&init_mu);
  if (state == 0) {
    state = -1;
    const char *mw = getenv("TOPOS_CUDA_MIN_WORK");
    if (mw && *mw) {
      min_product = strtoll(mw, NULL, 10);
      min_elements = min_product;
    }
    int count = 0;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaError_t e = cudaGetDeviceCount(&count);
    if (opt && opt->abi != TOPOS_PLUGIN_ABI) {
      snprintf(why, sizeof why, "cuda: plugin ABI %d, the program speaks %d",
               TOPOS_PLUGIN_ABI, opt->abi);
    } else if (driver == 0) {
      snprintf(why, sizeof why,
               "no CUDA driver on this host (libcuda.so.1; the plugin's "
               "runtime is %d.%d)",
               runtime / 1000, runtime % 1000 / 10);
    } else if (e != cudaSuccess || count == 0) {
      snprintf(why, sizeof why, "no CUDA device (%s; driver %d.%d)",
               e != cudaSuccess ? cudaGetErrorString(e) : "none found",
               driver / 1000, driver % 1000 / 10);
    } else {
      blas_open();
      math_ok[TOPOS_MAP_EXP] = math_check(TOPOS_MAP_EXP);
      math_ok[TOPOS_MAP_LOG] = math_check(TOPOS_MAP_LOG);
      math_ok[TOPOS_MAP_TANH] = math_check(TOPOS_MAP_TANH);
      int want[TOPOS_DEVICES_MAX], nwant = 0;
      if (opt && opt->ndevices > 0) {
        for (int i = 0; i < opt->ndevices && i < TOPOS_DEVICES_MAX; i++)
          want[nwant++] = opt->devices[i];
      } else {
        for (int i = 0; i < count && i < TOPOS_DEVICES_MAX; i++)
          want[nwant++] = i;
      }
      state = 1;
      for (int i = 0; i < nwant && state == 1; i++) {
        if (want[i] < 0 || want[i] >= count) {
          snprintf(why, sizeof why, "device %d does not exist (%d found)",
                   want[i], count);
          state = -1;
        } else if (device_open(&devs[ndevs], want[i], opt, why, sizeof why) !=
                   0) {
          state = -1;
        } else {
          ndevs++;
        }
      }
    }
  }
  int rc = state == 1 ? 0 : -1;
  if (rc == 0) {
    plugin.nbackends = blas_missing[0] ? 1 : 2;
    *out = &plugin;
  } else
    snprintf(err, errlen, "%s", why);
  pthread_mutex_unlock(&init_mu);
  return rc;
}
