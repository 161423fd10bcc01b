/*
 * fma_pinned.h - fma(a, b, acc) = a·b + acc rounded once, with the NaN it
 * returns fixed; and vector adds, subtracts, multiplies and divides with
 * their operand order fixed (below).
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
/* The same, lane by lane, for the vector kernels (AVX-512 and AVX2). */
#include <immintrin.h>
__attribute__((target("avx512f"))) static inline __m512 fma231_ps512(
    __m512 a, __m512 b, __m512 acc) {
  __asm__("vfmadd231ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
__attribute__((target("avx512f"))) static inline __m512d fma231_pd512(
    __m512d a, __m512d b, __m512d acc) {
  __asm__("vfmadd231pd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
__attribute__((target("avx2,fma"))) static inline __m256 fma231_ps256(
    __m256 a, __m256 b, __m256 acc) {
  __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
  return acc;
}
__attribute__((target("avx2,fma"))) static inline __m256d fma231_pd256(
    __m256d a, __m256d b, __m256d acc) {
  __asm__("vfmadd231pd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
  return acc;
}
static inline bool fma_pinned_available(void) {
  return __builtin_cpu_supports("fma");
}

/* u op w on sixteen f32 lanes with u the first source.  Written as C or
 * as intrinsics (plain vector operations to the compiler) a commutative
 * add or multiply may be emitted with its operands swapped, and when both
 * are NaN x86 returns the first source's, quieted: these keep a scalar
 * loop's `u op w` NaN for NaN.  Call them from target("avx512f") code. */
#define PINNED_512(NAME, V, INSN)                                     \
  __attribute__((target("avx512f"))) static inline V NAME(V u, V w) { \
    V r;                                                              \
    __asm__(INSN " %2, %1, %0" : "=v"(r) : "v"(u), "v"(w));           \
    return r;                                                         \
  }
PINNED_512(add_ps512, __m512, "vaddps")
PINNED_512(sub_ps512, __m512, "vsubps")
PINNED_512(mul_ps512, __m512, "vmulps")
PINNED_512(div_ps512, __m512, "vdivps")
/* ... and eight f64 lanes (the GELU passes'). */
PINNED_512(add_pd512, __m512d, "vaddpd")
PINNED_512(sub_pd512, __m512d, "vsubpd")
PINNED_512(mul_pd512, __m512d, "vmulpd")
#undef PINNED_512
/* The compare-and-select ops on sixteen f32 lanes, each lane the scalar
 * loop's expression (kernels_real.h), NaN cases included: no arithmetic,
 * so nothing to pin.  step: u >= w ? 1 : 0 (false for NaN); maximum:
 * isnan(u) ? u : isnan(w) ? w : u >= w ? u : w; relu: x where x > 0 or x
 * is NaN, else +0 (-0 included); neg: the sign bit flipped (NaN too). */
__attribute__((target("avx512f"))) static inline __m512 step_ps512(__m512 u,
                                                                   __m512 w) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, w, _CMP_GE_OQ),
                             _mm512_set1_ps(1.0f));
}
__attribute__((target("avx512f"))) static inline __m512 maximum_ps512(
    __m512 u, __m512 w) {
  __mmask16 take_u = _mm512_cmp_ps_mask(u, u, _CMP_UNORD_Q) |
                     _mm512_cmp_ps_mask(u, w, _CMP_GE_OQ);
  return _mm512_mask_mov_ps(w, take_u, u);
}
__attribute__((target("avx512f"))) static inline __m512 relu_ps512(__m512 x) {
  return _mm512_maskz_mov_ps(
      _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ) |
          _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
      x);
}
__attribute__((target("avx512f"))) static inline __m512 neg_ps512(__m512 x) {
  return _mm512_castsi512_ps(_mm512_xor_si512(
      _mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}
/* The scalar forms (SSE, in every x86-64): a scalar loop with many
 * temporaries may have its operands swapped too. */
#define PINNED_SCALAR(NAME, T, INSN)            \
  static inline T NAME(T u, T w) {              \
    __asm__(INSN " %1, %0" : "+x"(u) : "x"(w)); \
    return u;                                   \
  }
PINNED_SCALAR(add_f32, float, "addss")
PINNED_SCALAR(sub_f32, float, "subss")
PINNED_SCALAR(mul_f32, float, "mulss")
PINNED_SCALAR(add_f64, double, "addsd")
PINNED_SCALAR(sub_f64, double, "subsd")
PINNED_SCALAR(mul_f64, double, "mulsd")
#undef PINNED_SCALAR
#else
#define FMA_PINNED_X86 0
static inline bool fma_pinned_available(void) {
  return false;
}
#endif

#endif /* TOPOS_FMA_PINNED_H */
