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
#include "transpose16.h"

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

/* AVX-512 only: packs columns [0, nc) x k [0, kc) of a transposed B
 * (column j at src + j·cs, contiguous in k) into NR-wide panels
 * dst[(p·kc + k)·NR + j], NR a multiple of 16, columns past nc zero. */
void cpu_pack_bt_512_f32(const float *src, int64_t cs, int64_t kc, int64_t nc,
                         int NR, float *dst);
void cpu_pack_bt_512_bf16(const uint16_t *src, int64_t cs, int64_t kc,
                          int64_t nc, int NR, float *dst);
#endif

#endif /* TOPOS_CPU_GEMV_H */
