/*
 * cpu_gemv.h - private to the `cpu` backend: one-row products read B in
 * place (cpu_gemv.c).
 */
#ifndef TOPOS_CPU_GEMV_H
#define TOPOS_CPU_GEMV_H

#include <stdbool.h>

#include "backend.h"

/* The ISA levels, as cpu.c numbers its microkernel families. */
enum { CPU_GEMV_C = 0, CPU_GEMV_AVX2 = 1, CPU_GEMV_AVX512 = 2 };

/* Whether cpu_gemv_run takes g: one row of A (m == 1), f32 or f64, B
 * row-major (b_col == 1) or transposed (b_row == 1). */
bool cpu_gemv_applies(const topos_gemm_task *g);
/* Runs g (cpu_gemv_applies) on up to `threads` threads with the kernels
 * of ISA level `isa`: the reference's bits. */
int cpu_gemv_run(const topos_gemm_task *g, int threads, int isa);

#endif /* TOPOS_CPU_GEMV_H */
