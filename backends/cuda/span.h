/*
 * span.h - the bytes a strided operand touches.
 *
 * The cuda backend copies a task's operands to the device; an operand
 * given by a base pointer, extents and element strides (a transposed,
 * narrowed or broadcast view) touches a range of elements around its
 * base that these functions bound, so that the range, not the whole
 * tensor it came from, is what is looked up, uploaded or compared.
 * Plain C, no CUDA header.
 */
#ifndef TOPOS_CUDA_SPAN_H
#define TOPOS_CUDA_SPAN_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The elements at sum_d i_d*stride[d] for 0 <= i_d < extent[d] (rank
 * dims; strides may be 0 or negative) span element offsets [*lo, *hi)
 * relative to the base (hi exclusive; lo <= 0 < hi when anything is
 * touched).  Returns 0, or -1 when rank or an extent is < 0 or the
 * arithmetic would overflow int64.  An extent of 0 gives lo = hi = 0
 * (nothing touched); rank 0 is one element, [0, 1). */
int span_elems(int rank, const int64_t *extent, const int64_t *stride,
               int64_t *lo, int64_t *hi);

/* Whether the layout is dense row-major contiguous (strides equal to the
 * row-major strides of extent, ignoring dims of extent 1).  A layout with
 * an extent of 0 touches nothing and counts as contiguous; one with a
 * negative extent does not. */
bool span_is_contiguous(int rank, const int64_t *extent, const int64_t *stride);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CUDA_SPAN_H */
