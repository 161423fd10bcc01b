/*
 * backends.h - the execution backends shipped with topos (backends/), and
 * the one call a program makes to put them on the engine's chain.
 */
#ifndef TOPOS_BACKENDS_H
#define TOPOS_BACKENDS_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the default chain: `cpu` (exact) first, then `blas`
 * (envelope, fast posture only) where it is built.  Idempotent and
 * thread-safe. */
void topos_backends_register_defaults(void);

/* The `cpu` backend (cpu.c): exact, packed and register-blocked GEMM with
 * AVX-512 / AVX2+FMA microkernels chosen at run time. */
const topos_backend *topos_cpu_backend(void);
/* Which microkernels the cpu backend runs: "avx512", "avx2" or "c". */
const char *topos_cpu_isa(void);
/* Tests: forces an ISA ("avx512", "avx2", "c"; NULL = the best this CPU
 * has).  Returns 0, or -1 when the CPU lacks it. */
int topos_cpu_force_isa(const char *isa);
/* Tests: how many tasks the cpu backend has run in this process. */
unsigned long long topos_cpu_tasks_run(void);
/* Tests: how many of them were attention tasks (cpu_attention.c). */
unsigned long long topos_cpu_attention_tasks_run(void);

/* `flip-test` (testflip.c): claims exact fidelity, computes every f32/f64
 * GEMM exactly and flips the lowest bit of one output, so conformance can
 * be seen to fail.  Test only: never registered by default. */
const topos_backend *topos_flip_test_backend(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_BACKENDS_H */
