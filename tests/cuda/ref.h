/*
 * ref.h - numerics.md's reference arithmetic for the tasks of backend.h,
 * as plain loops, for the CUDA suites (tests/cuda/cases.c).
 *
 * The device check builds the cases on the GPU machine with nothing but a
 * C compiler and the CUDA toolkit, so they cannot link the engine; these
 * loops stand in for it.  That they are the reference is itself tested,
 * on every host: tests/backends/test_cuda.c compares them bit for bit
 * with the exact `cpu` backend (which the cpu suites hold to the engine's
 * reference kernels) on the same tasks.
 */
#ifndef TOPOS_TESTS_CUDA_REF_H
#define TOPOS_TESTS_CUDA_REF_H

#include "backend.h"

/* C = the fma chain over k in order from +0.0, per output. */
void ref_gemm(const topos_gemm_task *g);
/* out = the fma chain over kk = (c, a, b), padded positions as 0. */
void ref_window(const topos_window_task *w);
/* y = the striped-16 sum. */
void ref_reduce(const topos_reduce_task *r);
/* The attention chain of backend.h, step by step (f32 and f64). */
void ref_attention(const topos_attention_task *a);
/* y = the reference's element op (libm once per element). */
void ref_map(const topos_map_task *m);

#endif
