/*
 * idx.c - the IDX loader and the MNIST pair loader (see idx.h for the
 * format and the list of what is refused).
 *
 * Everything is read through zlib's gz* functions, which read a plain file
 * transparently, so one code path serves both.  The reading order is the
 * defence: header first, then every claim in it is checked (magic, rank,
 * extents, byte size against overflow and the cap, and, where the file's
 * size bounds what it can hold, against that), and only then is data read,
 * into a buffer that grows as bytes arrive rather than one sized by the
 * header.  The stream's own status (zlib's gzerror) is consulted before any
 * length verdict, so a corrupt gzip stream is reported as that rather than
 * as the short or long data it happened to produce.
 */
#include "idx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ex_error.h"

/* The first allocation for data; it doubles up to the header's size as
 * bytes actually arrive. */
#define FIRST_CHUNK ((size_t)1 << 20)
/* Deflate cannot expand better than about 1032:1, so a gzip file of S
 * bytes never holds more than this many times S. */
#define DEFLATE_MAX_RATIO 1032u
/* How much past the expected end is inflated, at most, to tell trailing
 * data from a corrupt stream that only its checksum would reveal. */
#define DRAIN_LIMIT ((size_t)1 << 20)

const char *ex_idx_type_name(int type) {
  switch (type) {
    case EX_IDX_U8:
      return "ubyte";
    case EX_IDX_I8:
      return "i8";
    case EX_IDX_I16:
      return "i16";
    case EX_IDX_I32:
      return "i32";
    case EX_IDX_F32:
      return "f32";
    case EX_IDX_F64:
      return "f64";
    default:
      return "unknown";
  }
}

size_t ex_idx_type_size(int type) {
  switch (type) {
    case EX_IDX_U8:
    case EX_IDX_I8:
      return 1;
    case EX_IDX_I16:
      return 2;
    case EX_IDX_I32:
    case EX_IDX_F32:
      return 4;
    case EX_IDX_F64:
      return 8;
    default:
      return 0;
  }
}

void ex_idx_free(ex_idx *idx) {
  if (idx == NULL) return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}

/* ---------------------------------------------------------------- reader */

typedef struct reader {
  gzFile gz;
  const char *path;
  uint64_t file_size; /* bytes on disk (compressed, for a gzip file) */
  bool direct;        /* a plain file, read as is */
  uint64_t pos;       /* uncompressed bytes consumed so far */
} reader;

/* If zlib has recorded a problem with the stream, reports it and returns
 * its code; 0 when the stream is sound.  Z_BUF_ERROR is zlib's "the
 * compressed data ended early", which is truncation, not a bad byte. */
static int stream_status(reader *r, topos_error *err) {
  int zerr = Z_OK;
  const char *what = gzerror(r->gz, &zerr);
  if (zerr == Z_OK) return 0;
  /* zlib prefixes its message with the "<fd:N>" name gzdopen gave it; the
   * message names the file itself. */
  const char *colon = what != NULL ? strstr(what, ": ") : NULL;
  if (colon != NULL && strncmp(what, "<fd:", 4) == 0) what = colon + 2;
  if (what == NULL) what = "zlib error";
  if (zerr == Z_ERRNO)
    return ex_error(err, TOPOS_ERR_IO, "idx: %s: read error: %s", r->path,
                    strerror(errno));
  if (zerr == Z_BUF_ERROR)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "idx: %s: truncated gzip stream (%s) after %llu bytes of "
                    "data",
                    r->path, what, (unsigned long long)r->pos);
  return ex_error(err, TOPOS_ERR_CORRUPT, "idx: %s: corrupt gzip stream (%s)",
                  r->path, what);
}

/* Reads up to n bytes into buf, stopping short only at the end of the
 * stream; *got says how many arrived.  Returns 0, or a status with err
 * filled in when zlib reports a problem (its verdict is checked on every
 * short read, so a truncated or corrupt stream is never mistaken for a
 * clean end). */
static int read_some(reader *r, void *buf, size_t n, size_t *got,
                     topos_error *err) {
  *got = 0;
  while (*got < n) {
    size_t want = n - *got;
    if (want > (size_t)1 << 30) want = (size_t)1 << 30; /* gzread is int */
    int k = gzread(r->gz, (uint8_t *)buf + *got, (unsigned)want);
    if (k < 0) {
      int rc = stream_status(r, err);
      return rc != 0
                 ? rc
                 : ex_error(err, TOPOS_ERR_IO, "idx: %s: read failed", r->path);
    }
    if (k == 0) break;
    *got += (size_t)k;
    r->pos += (uint64_t)k;
  }
  return *got < n ? stream_status(r, err) : 0;
}

/* --------------------------------------------------------------- header */

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

/* Reads and checks the header, filling out's type, rank, dims, count,
 * elem_size and nbytes.  Nothing is allocated. */
static int read_header(reader *r, uint64_t max_bytes, ex_idx *out,
                       topos_error *err) {
  uint8_t head[4 + 4 * EX_IDX_MAX_RANK];
  size_t got = 0;
  int rc = read_some(r, head, 4, &got, err);
  if (rc != 0) return rc;
  if (got == 0)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "idx: %s: empty (no IDX header; truncated file?)", r->path);
  if (got < 4)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: truncated header: the data ends after %lld bytes, "
        "an IDX header needs at least 4",
        r->path, (long long)got);
  size_t esize = ex_idx_type_size(head[2]);
  if (head[0] != 0 || head[1] != 0 || esize == 0)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: bad magic %02x %02x %02x %02x: not an IDX file (it "
        "must start 00 00 then a type: 08 ubyte, 09 i8, 0b i16, 0c "
        "i32, 0d f32, 0e f64)",
        r->path, head[0], head[1], head[2], head[3]);
  int rank = head[3];
  if (rank == 0)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: rank 0 in the header: a data set needs at least one "
        "dimension",
        r->path);
  if (rank > EX_IDX_MAX_RANK)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "idx: %s: rank %d in the header exceeds the maximum of %d",
                    r->path, rank, EX_IDX_MAX_RANK);
  size_t dims_bytes = 4 * (size_t)rank;
  rc = read_some(r, head + 4, dims_bytes, &got, err);
  if (rc != 0) return rc;
  if (got < dims_bytes)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: truncated header: the data ends after %lld bytes, "
        "the rank-%d header needs %zu",
        r->path, (long long)(4 + got), rank, 4 + dims_bytes);

  /* The byte size is built up with an overflow check at every step; the
   * extents are u32, so four of them can overflow even 64 bits. */
  uint64_t nbytes = esize;
  bool overflow = false;
  for (int i = 0; i < rank; i++) {
    uint32_t d = be32(head + 4 + 4 * i);
    if (d == 0)
      return ex_error(err, TOPOS_ERR_CORRUPT,
                      "idx: %s: extent %d of %d is 0: an empty data set is "
                      "refused",
                      r->path, i, rank);
    out->dims[i] = d;
    if (nbytes > UINT64_MAX / d) overflow = true;
    if (!overflow) nbytes *= d;
  }
  if (overflow)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: the header's extents overflow a 64-bit byte count "
        "(a lying header)",
        r->path);
  if (nbytes > max_bytes || nbytes > (uint64_t)SIZE_MAX / 2)
    return ex_error(
        err, TOPOS_ERR_CORRUPT,
        "idx: %s: the header claims %llu data bytes, over the cap of "
        "%llu bytes (too large, or a lying header)",
        r->path, (unsigned long long)nbytes, (unsigned long long)max_bytes);

  /* The file's own size bounds what it can hold: exactly, for a plain
   * file; by deflate's best ratio, for a gzip file. */
  uint64_t header_bytes = 4 + dims_bytes;
  if (r->direct) {
    uint64_t have =
        r->file_size > header_bytes ? r->file_size - header_bytes : 0;
    if (have < nbytes)
      return ex_error(err, TOPOS_ERR_CORRUPT,
                      "idx: %s: truncated: the header says %llu data bytes but "
                      "the file holds only %llu after its %llu-byte header",
                      r->path, (unsigned long long)nbytes,
                      (unsigned long long)have,
                      (unsigned long long)header_bytes);
    if (have > nbytes)
      return ex_error(err, TOPOS_ERR_CORRUPT,
                      "idx: %s: %llu trailing bytes after the %llu data bytes "
                      "the header declares",
                      r->path, (unsigned long long)(have - nbytes),
                      (unsigned long long)nbytes);
  } else if (r->file_size <= UINT64_MAX / DEFLATE_MAX_RATIO &&
             nbytes + header_bytes > r->file_size * DEFLATE_MAX_RATIO) {
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "idx: %s: truncated or lying header: it claims %llu data "
                    "bytes, more than a %llu-byte gzip file can hold",
                    r->path, (unsigned long long)nbytes,
                    (unsigned long long)r->file_size);
  }

  out->type = head[2];
  out->rank = rank;
  out->elem_size = esize;
  out->nbytes = (size_t)nbytes;
  out->count = (int64_t)(nbytes / esize);
  return 0;
}

/* ----------------------------------------------------------------- data */

/* Converts big-endian elements of esize bytes to host order, in place. */
static void to_host(uint8_t *p, size_t count, size_t esize) {
  if (esize == 1) return;
  for (size_t i = 0; i < count; i++, p += esize) {
    uint64_t v = 0;
    for (size_t b = 0; b < esize; b++) v = v << 8 | p[b];
    if (esize == 2) {
      uint16_t w = (uint16_t)v;
      memcpy(p, &w, 2);
    } else if (esize == 4) {
      uint32_t w = (uint32_t)v;
      memcpy(p, &w, 4);
    } else {
      memcpy(p, &v, 8);
    }
  }
}

/* After the declared data: the stream must end here, soundly.  Reads one
 * byte to find out; if there is one, inflates a bounded amount more, since
 * a corrupted stream can produce extra bytes before its checksum fails,
 * and that is the better diagnosis. */
static int expect_end(reader *r, uint64_t nbytes, topos_error *err) {
  uint8_t probe[4096];
  size_t got = 0;
  int rc = read_some(r, probe, 1, &got, err);
  if (rc != 0 || got == 0) return rc;
  uint64_t extra = 1;
  while (!r->direct && extra < DRAIN_LIMIT) {
    if ((rc = read_some(r, probe, sizeof probe, &got, err)) != 0) return rc;
    if (got == 0) break;
    extra += got;
  }
  if ((rc = stream_status(r, err)) != 0) return rc;
  return ex_error(err, TOPOS_ERR_CORRUPT,
                  "idx: %s: trailing data: %s%llu bytes after the %llu data "
                  "bytes the header declares",
                  r->path, extra >= DRAIN_LIMIT ? "at least " : "",
                  (unsigned long long)extra, (unsigned long long)nbytes);
}

/* Reads out->nbytes of data into a buffer that grows with what arrives. */
static int read_data(reader *r, ex_idx *out, topos_error *err) {
  size_t want = out->nbytes;
  size_t cap = want < FIRST_CHUNK ? want : FIRST_CHUNK;
  uint8_t *buf = malloc(cap);
  if (buf == NULL)
    return ex_error(err, TOPOS_ERR_MEMORY, "idx: %s: out of memory (%zu bytes)",
                    r->path, cap);
  size_t have = 0;
  int rc = 0;
  for (;;) {
    size_t got = 0;
    if ((rc = read_some(r, buf + have, cap - have, &got, err)) != 0) break;
    have += got;
    if (have < cap || have == want) break; /* end of stream, or done */
    size_t next = cap > want / 2 ? want : cap * 2;
    uint8_t *grown = realloc(buf, next);
    if (grown == NULL) {
      rc = ex_error(err, TOPOS_ERR_MEMORY, "idx: %s: out of memory (%zu bytes)",
                    r->path, next);
      break;
    }
    buf = grown;
    cap = next;
  }
  if (rc == 0 && have < want)
    rc = ex_error(err, TOPOS_ERR_CORRUPT,
                  "idx: %s: truncated: the header says %zu data bytes but the "
                  "data ends after %zu",
                  r->path, want, have);
  if (rc == 0) rc = expect_end(r, want, err);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  to_host(buf, (size_t)out->count, out->elem_size);
  out->data = buf;
  return 0;
}

int ex_idx_load_capped(const char *path, uint64_t max_bytes, ex_idx *out,
                       topos_error *err) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (path == NULL || out == NULL)
    return ex_error(err, TOPOS_ERR_ARGUMENT, "idx: NULL path or output");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return ex_error(err, TOPOS_ERR_NOT_FOUND, "idx: %s: no such file", path);
    return ex_error(err, TOPOS_ERR_IO, "idx: %s: cannot open: %s", path,
                    strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ex_error(err, TOPOS_ERR_IO, "idx: %s: not a regular file", path);
  }
  gzFile gz = gzdopen(fd, "rb");
  if (gz == NULL) {
    close(fd);
    return ex_error(err, TOPOS_ERR_MEMORY, "idx: %s: cannot start zlib", path);
  }
  reader r = {.gz = gz, .path = path, .file_size = (uint64_t)st.st_size};
  /* gzdirect looks at the first bytes: no gzip magic means a plain file. */
  r.direct = gzdirect(gz) != 0;
  int rc = read_header(&r, max_bytes, out, err);
  if (rc == 0) rc = read_data(&r, out, err);
  gzclose_r(gz); /* closes fd too */
  if (rc != 0) memset(out, 0, sizeof *out);
  return rc;
}

int ex_idx_load(const char *path, ex_idx *out, topos_error *err) {
  return ex_idx_load_capped(path, EX_IDX_DEFAULT_CAP, out, err);
}

/* ---------------------------------------------------------------- MNIST */

void ex_mnist_free(ex_mnist *m) {
  if (m == NULL) return;
  free(m->images);
  free(m->labels);
  memset(m, 0, sizeof *m);
}

/* Finds dir/<name>.gz or dir/<name> into path. */
static int find_file(const char *dir, const char *name, char *path, size_t size,
                     topos_error *err) {
  int n = snprintf(path, size, "%s/%s.gz", dir, name);
  if (n < 0 || (size_t)n >= size)
    return ex_error(err, TOPOS_ERR_ARGUMENT,
                    "mnist: directory name too long: %s", dir);
  if (access(path, F_OK) == 0) return 0;
  snprintf(path, size, "%s/%s", dir, name);
  if (access(path, F_OK) == 0) return 0;
  return ex_error(err, TOPOS_ERR_NOT_FOUND,
                  "mnist: %s/%s(.gz): no such file (expected the MNIST-format "
                  "files in %s)",
                  dir, name, dir);
}

int ex_mnist_load(const char *dir, bool train, ex_mnist *out,
                  topos_error *err) {
  if (out != NULL) memset(out, 0, sizeof *out);
  if (dir == NULL || out == NULL)
    return ex_error(err, TOPOS_ERR_ARGUMENT, "mnist: NULL directory or output");
  const char *split = train ? "train" : "t10k";
  char name[64], images_path[PATH_MAX], labels_path[PATH_MAX];
  ex_idx images = {0}, labels = {0};
  int rc;

  snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
  if ((rc = find_file(dir, name, images_path, sizeof images_path, err)))
    return rc;
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
  if ((rc = find_file(dir, name, labels_path, sizeof labels_path, err)))
    return rc;

  if ((rc = ex_idx_load(images_path, &images, err))) goto done;
  if (images.type != EX_IDX_U8 || images.rank != 3) {
    rc = ex_error(err, TOPOS_ERR_CORRUPT,
                  "mnist: %s: images must be a rank-3 ubyte file [N, rows, "
                  "cols], this one is rank %d %s",
                  images_path, images.rank, ex_idx_type_name(images.type));
    goto done;
  }
  if ((rc = ex_idx_load(labels_path, &labels, err))) goto done;
  if (labels.type != EX_IDX_U8 || labels.rank != 1) {
    rc = ex_error(err, TOPOS_ERR_CORRUPT,
                  "mnist: %s: labels must be a rank-1 ubyte file [N], this one "
                  "is rank %d %s",
                  labels_path, labels.rank, ex_idx_type_name(labels.type));
    goto done;
  }
  if (images.dims[0] != labels.dims[0]) {
    rc = ex_error(
        err, TOPOS_ERR_CORRUPT,
        "mnist: count mismatch: %lld images in %s but %lld labels in %s",
        (long long)images.dims[0], images_path, (long long)labels.dims[0],
        labels_path);
    goto done;
  }
  const uint8_t *lab = labels.data;
  for (int64_t i = 0; i < labels.count; i++) {
    if (lab[i] >= 10) {
      rc = ex_error(err, TOPOS_ERR_CORRUPT,
                    "mnist: %s: label %u at index %lld is out of range (labels "
                    "are 0..9)",
                    labels_path, lab[i], (long long)i);
      goto done;
    }
  }
  out->images = images.data;
  out->labels = labels.data;
  out->n = images.dims[0];
  out->rows = images.dims[1];
  out->cols = images.dims[2];
  images.data = labels.data = NULL;
done:
  ex_idx_free(&images);
  ex_idx_free(&labels);
  return rc;
}
