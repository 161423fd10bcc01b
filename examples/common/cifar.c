/*
 * cifar.c - the CIFAR-10 binary loader and the synthetic set generator
 * (see cifar.h for the format and the checks).
 *
 * The loader checks every file's size before reading a byte: the size is
 * the file system's, not a claim inside the file, so a multiple-of-3073
 * check plus a cap on the total bounds the single allocation.  Records are
 * then read straight into the output arrays and their labels checked one
 * by one, so a bad record is named by index.  A file that changes size
 * while being read (shorter, or longer) is refused too.
 */
#include "cifar.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ex_error.h"

void ex_cifar_free(ex_cifar *c) {
  if (c == NULL) return;
  free(c->images);
  free(c->labels);
  memset(c, 0, sizeof *c);
}

/* dir/name into path, refusing a name that does not fit. */
static int join(char *path, size_t size, const char *dir, const char *name,
                topos_error *err) {
  int n = snprintf(path, size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= size)
    return ex_error(err, TOPOS_ERR_ARGUMENT,
                    "cifar: directory name too long: %s", dir);
  return 0;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---------------------------------------------------------------- loader */

/* The size of one batch file, checked: a regular file, a positive multiple
 * of the record size. */
static int batch_size(const char *path, uint64_t *size, topos_error *err) {
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    if (e == ENOENT)
      return ex_error(err, TOPOS_ERR_NOT_FOUND, "cifar: %s: no such file",
                      path);
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode))
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: not a regular file", path);
  uint64_t n = (uint64_t)st.st_size;
  if (n == 0)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "cifar: %s: empty file (no records)", path);
  if (n % EX_CIFAR_RECORD_BYTES != 0)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "cifar: %s: size %llu is not a multiple of the %d-byte record "
        "(truncated or not a CIFAR-10 batch: %llu whole records and "
        "%llu bytes over)",
        path, (unsigned long long)n, EX_CIFAR_RECORD_BYTES,
        (unsigned long long)(n / EX_CIFAR_RECORD_BYTES),
        (unsigned long long)(n % EX_CIFAR_RECORD_BYTES));
  *size = n;
  return 0;
}

/* Reads the records of one file into images/labels from index `first`;
 * `count` records were promised by its size. */
static int read_batch(const char *path, int64_t first, int64_t count,
                      uint8_t *images, uint8_t *labels, topos_error *err) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    return ex_error(err, e == ENOENT ? TOPOS_ERR_NOT_FOUND : TOPOS_ERR_IO,
                    "cifar: %s: cannot open: %s", path, strerror(e));
  }
  int rc = 0;
  for (int64_t r = 0; r < count && rc == 0; r++) {
    uint8_t *label = labels + first + r;
    uint8_t *image = images + (first + r) * EX_CIFAR_IMAGE_BYTES;
    if (fread(label, 1, 1, f) != 1 ||
        fread(image, 1, EX_CIFAR_IMAGE_BYTES, f) != EX_CIFAR_IMAGE_BYTES) {
      rc = ferror(f) ? ex_error(err, TOPOS_ERR_IO,
                                "cifar: %s: read error at record %lld: %s",
                                path, (long long)r, strerror(errno))
                     : ex_error(err, TOPOS_ERR_CORRUPT,
                                "cifar: %s: truncated record %lld (the file "
                                "shrank while being read)",
                                path, (long long)r);
    } else if (*label >= EX_CIFAR_CLASSES) {
      rc = ex_error(err, TOPOS_ERR_CORRUPT,
                    "cifar: %s: record %lld has label %u, out of range (labels "
                    "are 0..9)",
                    path, (long long)r, *label);
    }
  }
  if (rc == 0 && fgetc(f) != EOF)
    rc = ex_error(err, TOPOS_ERR_CORRUPT,
                  "cifar: %s: trailing data after %lld records (the file grew "
                  "while being read)",
                  path, (long long)count);
  fclose(f);
  return rc;
}

int ex_cifar_load_capped(const char *dir, bool train, uint64_t max_bytes,
                         ex_cifar *out, topos_error *err) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (dir == NULL || out == NULL)
    return ex_error(err, TOPOS_ERR_ARGUMENT, "cifar: NULL directory or output");
  char paths[EX_CIFAR_MAX_TRAIN_FILES][PATH_MAX];
  uint64_t sizes[EX_CIFAR_MAX_TRAIN_FILES];
  int nfiles = 0, rc;

  if (train) {
    /* data_batch_1.bin onwards, as far as they go. */
    for (int i = 1; i <= EX_CIFAR_MAX_TRAIN_FILES; i++) {
      char name[32];
      snprintf(name, sizeof name, "data_batch_%d.bin", i);
      if ((rc = join(paths[nfiles], PATH_MAX, dir, name, err))) return rc;
      if (!exists(paths[nfiles])) break;
      nfiles++;
    }
    if (nfiles == 0)
      return ex_error(err, TOPOS_ERR_NOT_FOUND,
                      "cifar: %s/data_batch_1.bin: no such file (no training "
                      "batches in %s)",
                      dir, dir);
    /* A later batch after a missing one is an incomplete copy; loading
     * the part before the gap silently would hide that. */
    for (int i = nfiles + 2; i <= EX_CIFAR_MAX_TRAIN_FILES; i++) {
      char name[32], later[PATH_MAX];
      snprintf(name, sizeof name, "data_batch_%d.bin", i);
      if ((rc = join(later, sizeof later, dir, name, err))) return rc;
      if (exists(later))
        return ex_error(err, TOPOS_ERR_NOT_FOUND,
                        "cifar: %s/data_batch_%d.bin: no such file, but "
                        "data_batch_%d.bin is present (an incomplete copy?)",
                        dir, nfiles + 1, i);
    }
  } else {
    if ((rc = join(paths[0], PATH_MAX, dir, "test_batch.bin", err))) return rc;
    nfiles = 1;
  }

  uint64_t total = 0;
  for (int i = 0; i < nfiles; i++) {
    if ((rc = batch_size(paths[i], &sizes[i], err))) return rc;
    total += sizes[i]; /* each is under off_t's range: no overflow in 5 */
    if (total > max_bytes)
      return ex_error(err, TOPOS_ERR_CORRUPT,
                      "cifar: %s: the split reaches %llu bytes with this file, "
                      "over the cap of %llu bytes",
                      paths[i], (unsigned long long)total,
                      (unsigned long long)max_bytes);
  }
  if (total > SIZE_MAX / 2)
    return ex_error(err, TOPOS_ERR_MEMORY,
                    "cifar: %s: split too large (%llu B)", dir,
                    (unsigned long long)total);

  int64_t n = (int64_t)(total / EX_CIFAR_RECORD_BYTES);
  uint8_t *images = malloc((size_t)n * EX_CIFAR_IMAGE_BYTES);
  uint8_t *labels = malloc((size_t)n);
  if (images == NULL || labels == NULL) {
    free(images);
    free(labels);
    return ex_error(err, TOPOS_ERR_MEMORY,
                    "cifar: %s: out of memory for %lld records", dir,
                    (long long)n);
  }
  int64_t first = 0;
  for (int i = 0; i < nfiles; i++) {
    int64_t count = (int64_t)(sizes[i] / EX_CIFAR_RECORD_BYTES);
    if ((rc = read_batch(paths[i], first, count, images, labels, err))) {
      free(images);
      free(labels);
      return rc;
    }
    first += count;
  }
  out->images = images;
  out->labels = labels;
  out->n = n;
  out->nfiles = nfiles;
  return 0;
}

int ex_cifar_load(const char *dir, bool train, ex_cifar *out,
                  topos_error *err) {
  return ex_cifar_load_capped(dir, train, EX_CIFAR_DEFAULT_CAP, out, err);
}

/* ------------------------------------------------------------- generator */

/* splitmix64: a small, well-mixed generator; the state is the seed. */
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* A value in [lo, hi]; the modulo bias is irrelevant at these ranges. */
static int uniform(uint64_t *state, int lo, int hi) {
  return lo + (int)(next_u64(state) % (uint64_t)(hi - lo + 1));
}

/* Five colours; classes c and c + 5 share one. */
static const uint8_t k_palette[5][3] = {{230, 50, 50},
                                        {50, 210, 70},
                                        {60, 80, 235},
                                        {225, 205, 40},
                                        {50, 205, 215}};
/* A stripe direction per class: the intensity varies along x*dx + y*dy.
 * Classes c and c + 5 are perpendicular. */
static const int k_dir[EX_CIFAR_CLASSES][2] = {
    {1, 0}, {1, 1},  {2, 1},  {1, 2},  {3, 1},
    {0, 1}, {1, -1}, {1, -2}, {2, -1}, {1, -3}};

/* One image of class c into img (3 planes of 32x32). */
static void synth_image(int c, uint64_t *rng, uint8_t *img) {
  const int period = 8;
  int shift = uniform(rng, -1, 1);        /* stripes move by a pixel */
  int brightness = uniform(rng, -20, 20); /* the whole image lighter/darker */
  for (int y = 0; y < EX_CIFAR_SIDE; y++) {
    for (int x = 0; x < EX_CIFAR_SIDE; x++) {
      int t = x * k_dir[c][0] + y * k_dir[c][1] + shift;
      t = ((t % period) + period) % period;
      int wave = abs(t - period / 2); /* a triangle wave, 0..4 */
      int level = 64 + 48 * wave;     /* 64..256, out of 256 */
      for (int ch = 0; ch < EX_CIFAR_CHANNELS; ch++) {
        int v = k_palette[c % 5][ch] * level / 256 + brightness +
                uniform(rng, -24, 24);
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        img[(ch * EX_CIFAR_SIDE + y) * EX_CIFAR_SIDE + x] = (uint8_t)v;
      }
    }
  }
}

/* Writes n records to dir/name through a temporary file renamed into
 * place, so a reader never sees half a file.  stream picks the file's own
 * random stream from the seed. */
static int write_batch(const char *dir, const char *name, int64_t n,
                       uint64_t seed, uint64_t stream, topos_error *err) {
  char path[PATH_MAX], tmp[PATH_MAX];
  int rc;
  if ((rc = join(path, sizeof path, dir, name, err))) return rc;
  int len = snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name);
  if (len < 0 || (size_t)len >= sizeof tmp)
    return ex_error(err, TOPOS_ERR_ARGUMENT,
                    "cifar: directory name too long: %s", dir);
  int fd = mkstemp(tmp);
  if (fd < 0)
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: cannot create: %s", tmp,
                    strerror(errno));
  FILE *f = fdopen(fd, "wb");
  if (f == NULL) {
    close(fd);
    unlink(tmp);
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: %s", tmp, strerror(errno));
  }
  uint64_t rng = seed ^ (stream * 0xD1B54A32D192ED03ull);
  uint8_t record[EX_CIFAR_RECORD_BYTES];
  /* Labels cycle 0..9, shuffled within each run of ten, so every class is
   * (nearly) equally common in any prefix. */
  int order[EX_CIFAR_CLASSES];
  bool ok = true;
  for (int64_t i = 0; i < n && ok; i++) {
    if (i % EX_CIFAR_CLASSES == 0) {
      for (int k = 0; k < EX_CIFAR_CLASSES; k++) order[k] = k;
      for (int k = EX_CIFAR_CLASSES - 1; k > 0; k--) {
        int j = uniform(&rng, 0, k);
        int t = order[k];
        order[k] = order[j];
        order[j] = t;
      }
    }
    int c = order[i % EX_CIFAR_CLASSES];
    record[0] = (uint8_t)c;
    synth_image(c, &rng, record + 1);
    ok = fwrite(record, 1, sizeof record, f) == sizeof record;
  }
  int e = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok) e = errno;
    unlink(tmp);
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: cannot write: %s", path,
                    strerror(e));
  }
  return 0;
}

int ex_cifar_generate(const char *dir, int64_t ntrain_per_file, int nfiles,
                      int64_t ntest, uint64_t seed, topos_error *err) {
  if (dir == NULL)
    return ex_error(err, TOPOS_ERR_ARGUMENT, "cifar: NULL directory");
  const int64_t max_records =
      (int64_t)(EX_CIFAR_DEFAULT_CAP / EX_CIFAR_RECORD_BYTES);
  if (nfiles < 1 || nfiles > EX_CIFAR_MAX_TRAIN_FILES)
    return ex_error(err, TOPOS_ERR_ARGUMENT,
                    "cifar: %d training files asked for, 1..%d are possible",
                    nfiles, EX_CIFAR_MAX_TRAIN_FILES);
  if (ntrain_per_file < 1 || ntest < 1 ||
      ntrain_per_file > max_records / nfiles || ntest > max_records)
    return ex_error(
        err, TOPOS_ERR_ARGUMENT,
        "cifar: %lld records per training file and %lld test records "
        "asked for; each split must hold 1..%lld",
        (long long)ntrain_per_file, (long long)ntest, (long long)max_records);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return ex_error(err, TOPOS_ERR_IO, "cifar: %s: cannot create: %s", dir,
                    strerror(errno));
  int rc;
  for (int i = 1; i <= nfiles; i++) {
    char name[32];
    snprintf(name, sizeof name, "data_batch_%d.bin", i);
    if ((rc = write_batch(dir, name, ntrain_per_file, seed, (uint64_t)i, err)))
      return rc;
  }
  /* Batches beyond nfiles left by an earlier, larger run would be loaded
   * with these; they go. */
  for (int i = nfiles + 1; i <= EX_CIFAR_MAX_TRAIN_FILES; i++) {
    char name[32], path[PATH_MAX];
    snprintf(name, sizeof name, "data_batch_%d.bin", i);
    if ((rc = join(path, sizeof path, dir, name, err))) return rc;
    if (unlink(path) != 0 && errno != ENOENT)
      return ex_error(err, TOPOS_ERR_IO,
                      "cifar: %s: cannot remove a stale batch: %s", path,
                      strerror(errno));
  }
  return write_batch(dir, "test_batch.bin", ntest, seed, 0, err);
}
