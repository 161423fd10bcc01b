/*
 * blas.h - the `blas` backend: OpenBLAS sgemm/dgemm for dense f32/f64
 * products, fidelity ENVELOPE (numerics.md, "Fast posture").  Only a
 * `fast` request is ever offered to it; an `exact` one never is.
 *
 * supports() takes a GEMM task when its dtype is f32 or f64, each matrix
 * of the batch has at least TOPOS_BLAS_MIN_WORK multiply-adds, k is at
 * most TOPOS_BLAS_MAX_K_F32 (f32), and every operand's strides are ones
 * cblas can express: row-major with unit column stride, or a transposed
 * view with unit row stride, leading dimension no smaller than the row
 * (broadcast and negative strides are declined; the batch is looped).
 *
 * run() declines (returns TOPOS_ERR_RANGE, so the engine runs the
 * reference) when an operand holds a NaN or an infinity, or when
 * max|A|·max|B|·k could reach the dtype's overflow: only then can NaN and
 * Inf appear in a product, and where they appear depends on the order of
 * summation (3e38 + 3e38 − Inf is NaN in k order, −Inf in another), so
 * the envelope's "NaN/Inf exactly where the reference has them" can only
 * be kept by letting the reference compute those tasks.  The check reads
 * the operands once, O(mk + kn) against the product's O(mnk).
 *
 * Threads: each matrix of the batch is split into at most 4 blocks of
 * rows of C (columns when n > m; at least 64 per block), a split that
 * depends on the shape only; each block is one single-threaded cblas
 * call, and up to the task's `threads` threads take blocks.  So the bits
 * never depend on the thread count, which OpenBLAS's own threading does
 * not promise (its sgemm bits change with its thread count on the
 * Prescott and Haswell kernels).  OpenBLAS's process-global thread count
 * is set to 1 under a lock held for the call and restored afterwards;
 * OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are never touched here
 * (docs/architecture.md, "Platform facts").
 */
#ifndef TOPOS_BLAS_H
#define TOPOS_BLAS_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Smallest m·n·k (per matrix of the batch) the backend takes. */
#define TOPOS_BLAS_MIN_WORK ((int64_t)64 * 64 * 64)
/* Largest k the backend takes in f32: beyond it the reference's own
 * rounding error (an fma chain, growing like sqrt(k)) alone approaches
 * the 1e-5 envelope on random inputs. */
#define TOPOS_BLAS_MAX_K_F32 ((int64_t)1 << 16)

/* The backend (a static struct: register it with topos_backend_register;
 * it is always the same pointer). */
const topos_backend *topos_blas_backend(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_BLAS_H */
