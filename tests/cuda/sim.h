/*
 * sim.h - enough of CUDA to run backends/cuda/kernels.cu on the CPU.
 *
 * This machine has nvcc but no GPU, so the kernels' logic - the tiling,
 * the k order, the edges, the lanes of the striped sum, the window's
 * im2col addressing, the NaN flag - would otherwise go untested until a
 * device is lent.  Compiled as C++ with TOPOS_CUDA_SIM, kernels.cu runs
 * here: each block's threads are fibers on one OS thread (sim.cc), run
 * in turn up to each __syncthreads, so a block's shared memory is one
 * static array and a barrier is a pass of the scheduler.  A kernel whose
 * threads disagree about a barrier is reported, not left to hang.
 *
 * What it cannot show is what nvcc makes of the code: contraction
 * (-fmad=false), IEEE division and square root, subnormals.  The device
 * check (tests/cuda/device-check.sh) is for that; here the same
 * operations run as host IEEE arithmetic (-ffp-contract=off).
 */
#ifndef TOPOS_TESTS_CUDA_SIM_H
#define TOPOS_TESTS_CUDA_SIM_H

#include <cmath>
#include <cstdint>
#include <cstring>

using std::fabs;
using std::isfinite;
using std::isinf;

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
struct sim_index {
  unsigned x, y, z;
};

/* The running fiber's indices, and the launch's shape. */
extern sim_index threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

typedef int cudaError_t;
typedef void *cudaStream_t;
enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719
};

/* The last launch's error (a barrier disagreement is a launch failure). */
cudaError_t cudaGetLastError(void);
void __syncthreads(void);

/* Runs body once per thread of every block of grid, blocks in order. */
void sim_launch(dim3 grid, dim3 block, void (*body)(void *), void *ctx);

template <typename F>
static void sim_trampoline(void *f) {
  (*static_cast<F *>(f))();
}

#define LAUNCH(grid, block, stream, kernel, ...)                            \
  do {                                                                      \
    (void)(stream);                                                         \
    auto sim_body = [&]() { (kernel)(__VA_ARGS__); };                       \
    sim_launch(dim3(grid), dim3(block), sim_trampoline<decltype(sim_body)>, \
               &sim_body);                                                  \
  } while (0)

/* One OS thread runs every fiber: plain read-modify-writes are atomic. */
static inline unsigned atomicOr(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old | v;
  return old;
}
static inline unsigned long long atomicMax(unsigned long long *p,
                                           unsigned long long v) {
  unsigned long long old = *p;
  if (v > old) *p = v;
  return old;
}

static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline double __longlong_as_double(long long u) {
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline long long __double_as_longlong(double f) {
  long long u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float __fadd_rn(float a, float b) {
  return a + b;
}
static inline double __dadd_rn(double a, double b) {
  return a + b;
}
static inline float __fsub_rn(float a, float b) {
  return a - b;
}
static inline double __dsub_rn(double a, double b) {
  return a - b;
}
static inline float __fmul_rn(float a, float b) {
  return a * b;
}
static inline double __dmul_rn(double a, double b) {
  return a * b;
}
static inline float __fdiv_rn(float a, float b) {
  return a / b;
}
static inline double __ddiv_rn(double a, double b) {
  return a / b;
}
static inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
static inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}

#endif
