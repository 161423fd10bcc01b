/*
 * fma_pinned.h - fma(a, b, acc) = a·b + acc rounded once, with the NaN it
 * returns fixed.
 *
 * Where more than one operand is NaN the result is one of them, and which
 * one depends on the instruction form (vfmadd132/213/231) a compiler
 * picks, which changes with optimisation flags: GCC's -O2 and -O1 builds
 * of the same loop returned different NaNs.  On FMA hardware these pin
 * vfmadd231 with a as its first multiplicand, which returns a's NaN, else
 * b's, else acc's - the order libm's fmaf and fma give, which portable
 * builds call.  The reference kernels (kernels_real.h) and the exact
 * backends that run fma chains use them.  FMA_PINNED_X86 says whether
 * they exist; call them only from target("fma") code where
 * fma_pinned_available() is true.
 */
#ifndef TOPOS_FMA_PINNED_H
#define TOPOS_FMA_PINNED_H

#include <stdbool.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FMA_PINNED_X86 1
__attribute__((target("fma"))) static inline float fma231_f32(float a, float b,
                                                              float acc) {
  __asm__("vfmadd231ss %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b));
  return acc;
}
__attribute__((target("fma"))) static inline double fma231_f64(double a,
                                                               double b,
                                                               double acc) {
  __asm__("vfmadd231sd %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b));
  return acc;
}
static inline bool fma_pinned_available(void) {
  return __builtin_cpu_supports("fma");
}
#else
#define FMA_PINNED_X86 0
static inline bool fma_pinned_available(void) {
  return false;
}
#endif

#endif /* TOPOS_FMA_PINNED_H */
