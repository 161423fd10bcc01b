/*
 * cpu_window.h - private to the `cpu` backend: what cpu.c shares with
 * cpu_window.c (its microkernels and its thread pool), and the windowed
 * product's entry points.
 */
#ifndef TOPOS_CPU_WINDOW_H
#define TOPOS_CPU_WINDOW_H

#include "backend.h"

/* kern(kc, a, b, c, ldc, first): one GEMM micro-tile (cpu.c): C[0..mr) x
 * [0..nr) (+)= a·b, a packed [kc][mr_max], b packed [kc][nr]; `first`
 * starts every chain from +0.0 instead of loading C. */
typedef void (*cpu_kern_fn)(int64_t kc, const void *a, const void *b, void *c,
                            int64_t ldc, int first);

typedef struct cpu_kernels {
  int mr, nr, kc;
  cpu_kern_fn kern[15]; /* by row count 1..mr */
} cpu_kernels;

/* The microkernels cpu.c runs for dtype (f32/f64) on the chosen ISA. */
int cpu_gemm_kernels(topos_dtype dtype, cpu_kernels *out);
/* Runs fn(arg, tid, T) on T <= threads threads (the caller is tid 0, the
 * rest from the persistent pool); returns when all are done. */
void cpu_parallel(int threads, void (*fn)(void *arg, int tid, int T),
                  void *arg);

/* Runs every unit of t on up to `threads` threads of the pool
 * (cpu_window.c). */
void cpu_units_run(const topos_units_task *t, int threads);

/* The windowed product (cpu_window.c). */
bool cpu_window_supports(const topos_window_task *t);
int cpu_window_run(const topos_window_task *t, int threads);

#endif /* TOPOS_CPU_WINDOW_H */
