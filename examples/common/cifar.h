/*
 * cifar.h - the CIFAR-10 binary format, and a small learnable synthetic set
 * written in it.
 *
 * A batch file is a sequence of 3073-byte records: one label byte (0..9),
 * then a 3x32x32 image, channel-major (the R plane, then G, then B), each
 * plane row-major.  A directory holds data_batch_1.bin .. data_batch_5.bin
 * (the training split) and test_batch.bin (the test split), as the
 * official cifar-10-batches-bin archive unpacks.
 *
 * Every file is treated as hostile: its size must be a positive multiple of
 * 3073, the split's total under a cap (EX_CIFAR_DEFAULT_CAP or the
 * caller's), every label below 10; messages name the file and, for a bad
 * record, its index.  The size comes from the file system, not from the
 * file's contents, so the one allocation is bounded by the cap.
 *
 * Errors: TOPOS_ERR_NOT_FOUND for a missing file, TOPOS_ERR_IO for one that
 * cannot be opened, read or written, TOPOS_ERR_CORRUPT for bad contents,
 * TOPOS_ERR_MEMORY for a failed allocation, TOPOS_ERR_ARGUMENT for bad
 * arguments.  `err` may be NULL.  On failure *out is left empty (all
 * zero), so ex_cifar_free on it is always safe.
 */
#ifndef EX_CIFAR_H
#define EX_CIFAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topos.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EX_CIFAR_CHANNELS 3
#define EX_CIFAR_SIDE 32
#define EX_CIFAR_CLASSES 10
/* Bytes of one image (3 * 32 * 32) and of one record (label + image). */
#define EX_CIFAR_IMAGE_BYTES 3072
#define EX_CIFAR_RECORD_BYTES 3073
/* Training batch files: data_batch_1.bin .. data_batch_<this>.bin. */
#define EX_CIFAR_MAX_TRAIN_FILES 5
/* The default cap on a split's total file bytes: 1 GiB, over six times the
 * real training split (153.65 MB). */
#define EX_CIFAR_DEFAULT_CAP ((uint64_t)1 << 30)

typedef struct ex_cifar {
  uint8_t *images; /* n * 3072: per image the R, G, B planes, row-major */
  uint8_t *labels; /* n, each 0..9 */
  int64_t n;
  int nfiles; /* batch files read: 1..5 for train, 1 for test */
} ex_cifar;

/* Loads a split from dir.  train: data_batch_1.bin, data_batch_2.bin, ...
 * as far as they go consecutively from 1 (at least one, at most five;
 * out->nfiles says how many; a later batch present after a missing one is
 * refused, since a gap means an incomplete copy); test: test_batch.bin.
 * Returns 0, or a topos_status code with err filled in; free with
 * ex_cifar_free. */
int ex_cifar_load(const char *dir, bool train, ex_cifar *out, topos_error *err);
/* The same, refusing a split whose files total more than max_bytes. */
int ex_cifar_load_capped(const char *dir, bool train, uint64_t max_bytes,
                         ex_cifar *out, topos_error *err);
/* Releases both arrays and zeroes *c; NULL and empty values are fine. */
void ex_cifar_free(ex_cifar *c);

/* Writes a synthetic, learnable set in the format above into dir (created
 * if missing, one level): nfiles (1..5) files data_batch_<i>.bin of
 * ntrain_per_file records each and test_batch.bin of ntest records.
 * Each class has its own mean image, a colour (one of five) times soft
 * diagonal stripes in an orientation of its own (classes c and c+5 share
 * the colour and differ in orientation, so colour alone is not enough);
 * every image adds seeded noise, a brightness jitter and a one-pixel
 * stripe shift.  Labels cycle through the classes in a seeded shuffle.
 * Only integer arithmetic is used, so the bytes are the same for a seed on
 * every machine.  Each file is written to a temporary name and renamed into
 * place.  Returns 0, or a topos_status code with err filled in. */
int ex_cifar_generate(const char *dir, int64_t ntrain_per_file, int nfiles,
                      int64_t ntest, uint64_t seed, topos_error *err);

#ifdef __cplusplus
}
#endif

#endif
