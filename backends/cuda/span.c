/*
 * span.c - the element range a strided operand touches (span.h).
 *
 * Each dim adds (extent - 1) * stride to the highest offset when the
 * stride is positive, to the lowest when it is negative; every step is
 * checked for int64 overflow with the compiler's checked arithmetic.
 */
#include "span.h"

/* Whether any extent is negative (-1), zero (1), or neither (0). */
static int scan_extents(int rank, const int64_t *extent) {
  int empty = 0;
  for (int d = 0; d < rank; d++) {
    if (extent[d] < 0) return -1;
    if (extent[d] == 0) empty = 1;
  }
  return empty;
}

int span_elems(int rank, const int64_t *extent, const int64_t *stride,
               int64_t *lo, int64_t *hi) {
  if (rank < 0) return -1;
  int ext = scan_extents(rank, extent);
  if (ext < 0) return -1;
  int64_t min = 0, max = 0;
  if (ext == 0) {
    for (int d = 0; d < rank; d++) {
      int64_t reach;
      if (__builtin_mul_overflow(extent[d] - 1, stride[d], &reach)) return -1;
      int64_t *end = reach > 0 ? &max : &min;
      if (__builtin_add_overflow(*end, reach, end)) return -1;
    }
    if (__builtin_add_overflow(max, 1, &max)) return -1;
  }
  *lo = min;
  *hi = max;
  return 0;
}

bool span_is_contiguous(int rank, const int64_t *extent,
                        const int64_t *stride) {
  if (rank < 0) return false;
  int ext = scan_extents(rank, extent);
  if (ext != 0) return ext > 0;
  int64_t want = 1;
  for (int d = rank - 1; d >= 0; d--) {
    if (extent[d] == 1) continue;
    if (stride[d] != want) return false;
    if (__builtin_mul_overflow(want, extent[d], &want)) return false;
  }
  return true;
}
