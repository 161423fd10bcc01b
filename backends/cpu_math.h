/*
 * cpu_math.h - f32 tanhf / expf / logf over arrays, bit for bit the C
 * library's (cpu_math.c).
 *
 * The vector kernels redo the arithmetic of glibc 2.36's x86_64 libm
 * (tanhf + expm1f in plain float ops; expf and logf as the FMA ifunc
 * variants) lane by lane.  At first use a self-check compares each kernel
 * with this process's libm on inputs that reach every branch; a kernel
 * that differs anywhere is switched off for the process, and its function
 * then calls libm once per element.  Either way the bits are libm's.
 */
#ifndef TOPOS_CPU_MATH_H
#define TOPOS_CPU_MATH_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cpu_math_fn {
  CPU_MATH_TANH,
  CPU_MATH_EXP,
  CPU_MATH_LOG,
  CPU_MATH_COUNT
} cpu_math_fn;

/* y[i] = f(x[i]) for i in [0, n) with libm's bits (x == y allowed, no
 * other overlap).  The vector kernel when live, else libm per element. */
void cpu_math_f32(cpu_math_fn f, const float *x, float *y, int64_t n);

/* Whether f runs on a vector kernel (its self-check passed); runs the
 * self-check on first use.  TOPOS_CPU_MATH=libm in the environment turns
 * every kernel off. */
bool cpu_math_live(cpu_math_fn f);

/* The ISA the live kernels use: "avx512", "avx2" or "none". */
const char *cpu_math_isa(void);

/* Tests: run f's kernel for `isa` ("avx512" or "avx2") directly, without
 * the self-check; false (y untouched) when this CPU or build lacks it. */
bool cpu_math_kernel(cpu_math_fn f, const char *isa, const float *x, float *y,
                     int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CPU_MATH_H */
