/*
 * transpose16.h - a 16 x 16 f32 transpose in AVX-512 registers, shared by
 * the engine's transposing copies (tensor.c) and the cpu backend's
 * packing (cpu.c, cpu_gemv.c).  A copy: no bits change.
 */
#ifndef TOPOS_TRANSPOSE16_H
#define TOPOS_TRANSPOSE16_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>

/* r[0..16) rows -> r[t] = column t (four stages of sixteen shuffles,
 * every loop unrolled so that the tile never leaves the registers). */
__attribute__((target("avx512f"), always_inline)) static inline void
transpose16_ps(__m512 *r) {
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

/* A tile: rows t < w (of 16) at src + t·s, the lanes of m each (zeros
 * elsewhere), transposed, so r[u] holds lane u of every row - the walk
 * of the transposing copies and ops over a view whose rows run across. */
__attribute__((target("avx512f"), always_inline)) static inline void
transpose16_load_ps(const float *src, int64_t s, int64_t w, __mmask16 m,
                    __m512 *r) {
#pragma GCC unroll 16
  for (int t = 0; t < 16; t++)
    r[t] = t < w ? _mm512_maskz_loadu_ps(m, src + t * s) : _mm512_setzero_ps();
  transpose16_ps(r);
}
#endif

#endif /* TOPOS_TRANSPOSE16_H */
