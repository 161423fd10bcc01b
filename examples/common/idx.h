/*
 * idx.h - IDX files (the MNIST / Fashion-MNIST format) and the MNIST
 * image/label pair on top of them.
 *
 * An IDX file is: two zero bytes, a type byte, a rank byte, `rank`
 * big-endian u32 extents, then the elements row-major, big-endian.  Files
 * may be plain or gzip-compressed; zlib tells the two apart by content, so
 * the name does not matter.
 *
 * Every file is treated as hostile.  The loader refuses, with a message
 * naming the file and the fault:
 *  - a magic that is not 00 00 <known type>, a rank of 0 or above
 *    EX_IDX_MAX_RANK, a zero extent (an empty data set is never what a
 *    training example wants, so it is refused rather than passed on);
 *  - an element count whose byte size overflows or exceeds the cap
 *    (EX_IDX_DEFAULT_CAP, or the caller's in ex_idx_load_capped), checked
 *    from the header alone, before anything is allocated;
 *  - a file shorter than its header says (at any length, header included),
 *    bytes after the data, a corrupt or truncated gzip stream.
 * The loader never allocates what a header claims up front: a plain file's
 * size is checked against the header first, and data is read into a buffer
 * that grows as bytes actually arrive, so a lying header costs at most
 * about twice what the file really holds.  Decompression stops one byte
 * past the expected size (plus a bounded drain to tell trailing data from
 * a corrupt stream), so a zip bomb is never inflated.
 *
 * Errors: TOPOS_ERR_NOT_FOUND for a missing file, TOPOS_ERR_IO for a file
 * that cannot be opened or read, TOPOS_ERR_CORRUPT for bad contents,
 * TOPOS_ERR_MEMORY for a failed allocation, TOPOS_ERR_ARGUMENT for NULL
 * arguments.  `err` may be NULL.  On failure *out is left empty (all zero),
 * so ex_idx_free / ex_mnist_free on it is always safe.
 */
#ifndef EX_IDX_H
#define EX_IDX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topos.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The IDX type byte.  All six are accepted; multi-byte elements are
 * converted from big-endian to host order on load. */
typedef enum ex_idx_type {
  EX_IDX_U8 = 0x08,
  EX_IDX_I8 = 0x09,
  EX_IDX_I16 = 0x0B,
  EX_IDX_I32 = 0x0C,
  EX_IDX_F32 = 0x0D,
  EX_IDX_F64 = 0x0E
} ex_idx_type;

/* The largest rank accepted (MNIST uses 1 and 3). */
#define EX_IDX_MAX_RANK 4
/* The default cap on a file's data bytes: 1 GiB, about 20 times the
 * largest MNIST-family file (47 MB of train images). */
#define EX_IDX_DEFAULT_CAP ((uint64_t)1 << 30)

typedef struct ex_idx {
  int type;                      /* an ex_idx_type */
  int rank;                      /* 1..EX_IDX_MAX_RANK */
  int64_t dims[EX_IDX_MAX_RANK]; /* extents, outermost first; unused = 0 */
  int64_t count;                 /* elements: the product of dims */
  size_t elem_size;              /* bytes per element */
  size_t nbytes;                 /* count * elem_size */
  void *data;                    /* nbytes, row-major, host byte order */
} ex_idx;

/* Loads the IDX file at path (plain or gzip) with the default cap.
 * Returns 0, or a topos_status code with err filled in.  Free with
 * ex_idx_free. */
int ex_idx_load(const char *path, ex_idx *out, topos_error *err);
/* The same, refusing files whose data exceeds max_bytes. */
int ex_idx_load_capped(const char *path, uint64_t max_bytes, ex_idx *out,
                       topos_error *err);
/* Releases idx->data and zeroes *idx; NULL and empty values are fine. */
void ex_idx_free(ex_idx *idx);
/* "ubyte", "i8", "i16", "i32", "f32", "f64", or "unknown". */
const char *ex_idx_type_name(int type);
/* Bytes per element of a type, 0 for an unknown one. */
size_t ex_idx_type_size(int type);

/* ------------------------------------------------------------ MNIST pair */

/* An MNIST-family split: n images of rows x cols bytes and n labels. */
typedef struct ex_mnist {
  uint8_t *images; /* n * rows * cols, image-major then row-major */
  uint8_t *labels; /* n, each 0..9 */
  int64_t n;
  int64_t rows;
  int64_t cols;
} ex_mnist;

/* Loads {train,t10k}-images-idx3-ubyte[.gz] and the matching
 * -labels-idx1-ubyte[.gz] from dir (the .gz name is tried first).  The
 * images must be a rank-3 ubyte [N, rows, cols] file, the labels a rank-1
 * ubyte [N] file with the same N, every label below 10.  Returns 0, or a
 * topos_status code with err filled in; free with ex_mnist_free. */
int ex_mnist_load(const char *dir, bool train, ex_mnist *out, topos_error *err);
/* Releases both arrays and zeroes *m; NULL and empty values are fine. */
void ex_mnist_free(ex_mnist *m);

#ifdef __cplusplus
}
#endif

#endif
