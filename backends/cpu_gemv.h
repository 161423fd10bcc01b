/*
 * cpu_gemv.h - private to the `cpu` backend: one-row products read B in
 * place (cpu_gemv.c).
 */
#ifndef TOPOS_CPU_GEMV_H
#define TOPOS_CPU_GEMV_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "fma_pinned.h"

/* A bf16 bit pattern widened exactly to f32. */
static inline float cpu_bf16_widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The portable kernels' fma: the pinned vfmadd231 where the CPU has FMA
 * (the reference's form, fma_pinned.h), else the C library's.  A plain
 * fmaf call would leave the compiler free to swap the multiplicands,
 * which changes which of two NaNs comes out. */
static inline float cpu_fmaf(float a, float b, float acc) {
#if FMA_PINNED_X86
  if (fma_pinned_available()) return fma231_f32(a, b, acc);
#endif
  return fmaf(a, b, acc);
}
static inline double cpu_fma(double a, double b, double acc) {
#if FMA_PINNED_X86
  if (fma_pinned_available()) return fma231_f64(a, b, acc);
#endif
  return fma(a, b, acc);
}

/* The ISA levels, as cpu.c numbers its microkernel families. */
enum { CPU_GEMV_C = 0, CPU_GEMV_AVX2 = 1, CPU_GEMV_AVX512 = 2 };

/* Whether cpu_gemv_run takes g: one row of A (m == 1), f32, f64 or bf16
 * (backend.h's form: bf16 operands, f32 output), B
 * row-major (b_col == 1) or transposed (b_row == 1). */
bool cpu_gemv_applies(const topos_gemm_task *g);
/* Runs g (cpu_gemv_applies) on up to `threads` threads with the kernels
 * of ISA level `isa`: the reference's bits. */
int cpu_gemv_run(const topos_gemm_task *g, int threads, int isa);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* r[0..16) rows -> r[t] = column t (a 16x16 f32 transpose in registers:
 * four stages of sixteen shuffles, every loop unrolled so that the tile
 * never leaves the registers). */
__attribute__((target("avx512f"), always_inline)) static inline void
cpu_transpose16(__m512 *r) {
  __m512 t[16], u[16];
#pragma GCC unroll 16
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* u[4q + c]: rows 4q..4q+3 of columns 4L + c in 128-bit lane L */
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    __m512d x0 = _mm512_castps_pd(t[4 * q]),
            x1 = _mm512_castps_pd(t[4 * q + 1]);
    __m512d x2 = _mm512_castps_pd(t[4 * q + 2]),
            x3 = _mm512_castps_pd(t[4 * q + 3]);
    u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
    u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
    u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
    u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    __m512 va = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    __m512 vb = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    __m512 vc = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    __m512 vd = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(va, vc, 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(va, vc, 0xdd);
    r[c + 4] = _mm512_shuffle_f32x4(vb, vd, 0x88);
    r[c + 12] = _mm512_shuffle_f32x4(vb, vd, 0xdd);
  }
}

/* AVX-512 only: packs columns [0, nc) x k [0, kc) of a transposed B
 * (column j at src + j·cs, contiguous in k) into NR-wide panels
 * dst[(p·kc + k)·NR + j], NR a multiple of 16, columns past nc zero. */
void cpu_pack_bt_512_f32(const float *src, int64_t cs, int64_t kc, int64_t nc,
                         int NR, float *dst);
void cpu_pack_bt_512_bf16(const uint16_t *src, int64_t cs, int64_t kc,
                          int64_t nc, int NR, float *dst);
#endif

#endif /* TOPOS_CPU_GEMV_H */
