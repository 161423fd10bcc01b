/*
 * safetensors.c - checkpoints in the safetensors format
 * (https://github.com/huggingface/safetensors), so that parameters and
 * optimizer state written here load in the Python package and back.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON (an
 * object mapping each tensor's name to its dtype, shape and data_offsets,
 * plus an optional "__metadata__" object of strings), then the data: each
 * tensor's elements row-major, little-endian, at [begin, end) of the byte
 * buffer that follows the header.  docs/checkpoints.md lists what is
 * accepted and refused.
 *
 * Loading never trusts the file.  The header length is checked against
 * the file's size and a cap before the header is parsed; every entry's
 * dtype, shape and offsets are checked, and the entries must tile the
 * data buffer exactly (no gap, no overlap, nothing left over), so a file
 * that loads is one this writer could have written, up to order and
 * padding.  Loading reads only the header: the file stays open and each
 * topos_safetensors_get reads its tensor's bytes (pread) straight into
 * the new tensor, so the data is never in memory twice (a 500 MB model
 * peaks at one copy, not two).  A file cut or rewritten after loading is
 * an error from get (a short read, or a size or mtime that moved), never
 * garbage.  Saving writes a temporary file next to the target and renames
 * it over the target only once every byte is written and synced, so a
 * crash leaves either the old file or the new one, never half of one.
 */
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "utf8.h"

/* The data is the in-memory bytes of each tensor: that is the format's
 * little-endian layout only on a little-endian host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors.c assumes a little-endian host");

/* The Python package refuses headers over 100 MB; so do we, before
 * allocating anything for one. */
#define HEADER_CAP (100u * 1000u * 1000u)
/* JSON numbers are doubles; integers above 2^53 are not exact in them. */
#define EXACT_INT_MAX 9007199254740992.0
#define METADATA_KEY "__metadata__"

/* One tensor of a loaded file: where its bytes are and what they hold. */
typedef struct stored {
  char *name;
  topos_dtype dtype;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
  uint64_t offset; /* from the start of the file */
  uint64_t bytes;
} stored;

struct topos_safetensors {
  int fd;              /* open until topos_safetensors_free */
  char *path;          /* for messages */
  struct stat at_load; /* size and mtime, to notice a file that changed */
  int count;
  stored *items; /* in header order */
};

static const struct {
  topos_dtype dtype;
  const char *name;
} DTYPES[] = {{TOPOS_F32, "F32"},
              {TOPOS_F64, "F64"},
              {TOPOS_BF16, "BF16"},
              {TOPOS_I32, "I32"}};

static const char *format_dtype_name(topos_dtype dtype) {
  for (size_t i = 0; i < sizeof DTYPES / sizeof *DTYPES; i++)
    if (DTYPES[i].dtype == dtype) return DTYPES[i].name;
  return NULL;
}

static bool format_dtype_parse(const char *name, topos_dtype *out) {
  for (size_t i = 0; i < sizeof DTYPES / sizeof *DTYPES; i++)
    if (strcmp(DTYPES[i].name, name) == 0) {
      *out = DTYPES[i].dtype;
      return true;
    }
  return false;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts a copy of the n names and reports the first repeated one. */
static const char *first_duplicate(int n, const char *const *names,
                                   bool *failed) {
  *failed = false;
  if (n < 2) return NULL;
  const char **sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) {
    *failed = true;
    return NULL;
  }
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, compare_names);
  const char *dup = NULL;
  for (int i = 1; i < n && !dup; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
  free(sorted);
  return dup;
}

/* ------------------------------------------------------------------ save */

/* A JSON integer printed exactly (cJSON prints large doubles with %g). */
static cJSON *json_integer(int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  return cJSON_CreateRaw(buf);
}

static int check_save_args(int n, const char *const *names,
                           topos_tensor *const *tensors, topos_error *err) {
  const char *what = "topos_safetensors_save";
  if (n < 0 || (n > 0 && (!names || !tensors)))
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: %d tensors with names %p and tensors %p", what, n,
                     (const void *)names, (const void *)tensors);
  for (int i = 0; i < n; i++) {
    if (!names[i] || !tensors[i])
      return error_set(err, TOPOS_ERR_ARGUMENT, "%s: entry %d has a NULL %s",
                       what, i, names[i] ? "tensor" : "name");
    size_t at = 0;
    const char *why = "";
    if (!topos_utf8_check(names[i], strlen(names[i]), &at, &why))
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "%s: name of entry %d %s at byte %zu", what, i, why, at);
    if (strcmp(names[i], METADATA_KEY) == 0)
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "%s: entry %d: the name \"%s\" is reserved", what, i,
                       METADATA_KEY);
    if (!format_dtype_name(topos_tensor_dtype(tensors[i])))
      return error_set(err, TOPOS_ERR_DTYPE, "%s: entry %d has a bad dtype",
                       what, i);
  }
  bool failed = false;
  const char *dup = first_duplicate(n, names, &failed);
  if (failed)
    return error_set(err, TOPOS_ERR_MEMORY, "%s: no memory for names", what);
  if (dup)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: duplicate name \"%s\"", what,
                     dup);
  return TOPOS_OK;
}

/* The header JSON (caller frees) with offsets in entry order. */
static char *build_header(int n, const char *const *names,
                          topos_tensor *const *tensors) {
  cJSON *root = cJSON_CreateObject();
  int64_t offset = 0;
  for (int i = 0; root && i < n; i++) {
    const topos_tensor *t = tensors[i];
    int64_t bytes = topos_tensor_count(t) *
                    (int64_t)topos_dtype_size(topos_tensor_dtype(t));
    cJSON *entry = cJSON_AddObjectToObject(root, names[i]);
    cJSON *shape = cJSON_CreateArray();
    cJSON *offsets = cJSON_CreateArray();
    bool ok = entry && shape && offsets &&
              cJSON_AddStringToObject(entry, "dtype",
                                      format_dtype_name(topos_tensor_dtype(t)));
    if (ok)
      cJSON_AddItemToObject(entry, "shape", shape);
    else
      cJSON_Delete(shape);
    if (ok)
      cJSON_AddItemToObject(entry, "data_offsets", offsets);
    else
      cJSON_Delete(offsets);
    for (int d = 0; ok && d < topos_tensor_rank(t); d++)
      ok = cJSON_AddItemToArray(shape, json_integer(topos_tensor_shape(t)[d]));
    ok = ok && cJSON_AddItemToArray(offsets, json_integer(offset)) &&
         cJSON_AddItemToArray(offsets, json_integer(offset + bytes));
    if (!ok) {
      cJSON_Delete(root);
      root = NULL;
    }
    offset += bytes;
  }
  char *json = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return json;
}

static int write_all(FILE *f, const void *p, size_t n) {
  return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_file(FILE *f, const char *json, int n,
                      topos_tensor *const *tensors, topos_error *err) {
  /* Spaces pad the header so the data starts 8-byte aligned, as the
   * Python package writes it. */
  size_t len = strlen(json);
  size_t padded = (len + 7) / 8 * 8;
  uint8_t prefix[8];
  for (int i = 0; i < 8; i++)
    prefix[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  if (write_all(f, prefix, 8) || write_all(f, json, len) ||
      write_all(f, "       ", padded - len))
    return error_set(err, TOPOS_ERR_IO, "topos_safetensors_save: write: %s",
                     strerror(errno));
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)topos_tensor_count(tensors[i]) *
                   topos_dtype_size(topos_tensor_dtype(tensors[i]));
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
      return error_set(err, TOPOS_ERR_MEMORY,
                       "topos_safetensors_save: no memory for %zu bytes",
                       bytes);
    int rc = topos_tensor_read(tensors[i], buf, bytes, err);
    if (rc == TOPOS_OK && write_all(f, buf, bytes))
      rc = error_set(err, TOPOS_ERR_IO, "topos_safetensors_save: write: %s",
                     strerror(errno));
    free(buf);
    if (rc != TOPOS_OK) return rc;
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0)
    return error_set(err, TOPOS_ERR_IO, "topos_safetensors_save: sync: %s",
                     strerror(errno));
  return TOPOS_OK;
}

int topos_safetensors_save(const char *path, int n, const char *const *names,
                           topos_tensor *const *tensors, topos_error *err) {
  if (!path)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "topos_safetensors_save: path is NULL");
  int rc = check_save_args(n, names, tensors, err);
  if (rc != TOPOS_OK) return rc;
  char *json = build_header(n, names, tensors);
  if (!json)
    return error_set(err, TOPOS_ERR_MEMORY,
                     "topos_safetensors_save: no memory for the header");
  size_t tmp_len = strlen(path) + sizeof ".tmp.XXXXXX";
  char *tmp = malloc(tmp_len);
  if (!tmp) {
    free(json);
    return error_set(err, TOPOS_ERR_MEMORY,
                     "topos_safetensors_save: no memory for a path");
  }
  snprintf(tmp, tmp_len, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!f) {
    rc = error_set(err, TOPOS_ERR_IO, "topos_safetensors_save: %s: %s", tmp,
                   strerror(errno));
    if (fd >= 0) {
      close(fd);
      unlink(tmp);
    }
  } else {
    rc = write_file(f, json, n, tensors, err);
    if (fclose(f) != 0 && rc == TOPOS_OK)
      rc = error_set(err, TOPOS_ERR_IO, "topos_safetensors_save: close: %s",
                     strerror(errno));
    if (rc == TOPOS_OK && rename(tmp, path) != 0)
      rc = error_set(err, TOPOS_ERR_IO,
                     "topos_safetensors_save: rename to %s: %s", path,
                     strerror(errno));
    if (rc != TOPOS_OK) unlink(tmp);
  }
  free(tmp);
  free(json);
  return rc;
}

/* ------------------------------------------------------------------ load */

/* One header entry as checked, before its tensor is built. */
typedef struct entry {
  const char *name; /* borrowed from the parsed JSON */
  topos_dtype dtype;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
  uint64_t begin, end;
} entry;

static int corrupt(topos_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int corrupt(topos_error *err, const char *path, const char *fmt, ...) {
  char why[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return error_set(err, TOPOS_ERR_CORRUPT, "topos_safetensors_load: %s: %s",
                   path, why);
}

/* A JSON number that is an integer in [0, max]. */
static bool json_uint(const cJSON *item, double max, uint64_t *out) {
  if (!cJSON_IsNumber(item)) return false;
  double v = item->valuedouble;
  if (!(v >= 0 && v <= max) || v != (double)(uint64_t)v) return false;
  *out = (uint64_t)v;
  return true;
}

static int check_entry(const cJSON *item, uint64_t data_len, entry *e,
                       const char *path, topos_error *err) {
  const char *name = item->string;
  size_t at = 0;
  const char *why = "";
  if (!topos_utf8_check(name, strlen(name), &at, &why))
    return corrupt(err, path, "a tensor name %s at byte %zu", why, at);
  if (!cJSON_IsObject(item))
    return corrupt(err, path, "\"%s\" is not an object", name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  e->name = name;
  if (!cJSON_IsString(dtype))
    return corrupt(err, path, "\"%s\" has no dtype string", name);
  if (!format_dtype_parse(dtype->valuestring, &e->dtype))
    return corrupt(err, path,
                   "\"%s\" has dtype \"%.40s\"; known: F32, F64, BF16, I32",
                   name, dtype->valuestring);
  if (!cJSON_IsArray(shape))
    return corrupt(err, path, "\"%s\" has no shape array", name);
  int rank = cJSON_GetArraySize(shape);
  if (rank > TOPOS_MAX_RANK)
    return corrupt(err, path, "\"%s\" has rank %d, over the maximum %d", name,
                   rank, TOPOS_MAX_RANK);
  e->rank = rank;
  uint64_t count = 1;
  int d = 0;
  for (const cJSON *x = shape->child; x; x = x->next, d++) {
    uint64_t extent = 0;
    if (!json_uint(x, EXACT_INT_MAX, &extent))
      return corrupt(err, path,
                     "\"%s\" has extent %d not an integer in [0, 2^53]", name,
                     d);
    e->shape[d] = (int64_t)extent;
    if (extent != 0 && count > (uint64_t)INT64_MAX / extent)
      return corrupt(err, path, "\"%s\" has an element count that overflows",
                     name);
    count *= extent;
  }
  if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
      !json_uint(offsets->child, EXACT_INT_MAX, &e->begin) ||
      !json_uint(offsets->child->next, EXACT_INT_MAX, &e->end))
    return corrupt(err, path,
                   "\"%s\" has no data_offsets pair of integers in [0, 2^53]",
                   name);
  if (e->begin > e->end || e->end > data_len)
    return corrupt(err, path,
                   "\"%s\" has data_offsets [%" PRIu64 ", %" PRIu64
                   "] outside the %" PRIu64 " data bytes",
                   name, e->begin, e->end, data_len);
  uint64_t es = topos_dtype_size(e->dtype);
  if (count > UINT64_MAX / es || count * es != e->end - e->begin)
    return corrupt(err, path,
                   "\"%s\" holds %" PRIu64 " bytes but %s of %" PRIu64
                   " elements needs %" PRIu64,
                   name, e->end - e->begin, dtype->valuestring, count,
                   count > UINT64_MAX / es ? UINT64_MAX : count * es);
  return TOPOS_OK;
}

static int compare_offsets(const void *a, const void *b) {
  const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* The entries must tile [0, data_len) exactly, in some order. */
static int check_tiling(int n, entry *entries, uint64_t data_len,
                        const char *path, topos_error *err) {
  entry **order = malloc((size_t)(n ? n : 1) * sizeof *order);
  if (!order)
    return error_set(err, TOPOS_ERR_MEMORY,
                     "topos_safetensors_load: no memory for %d entries", n);
  for (int i = 0; i < n; i++) order[i] = &entries[i];
  qsort(order, (size_t)n, sizeof *order, compare_offsets);
  int rc = TOPOS_OK;
  uint64_t at = 0;
  for (int i = 0; i < n && rc == TOPOS_OK; i++) {
    if (order[i]->begin < at)
      rc = corrupt(err, path, "\"%s\" overlaps \"%s\"", order[i]->name,
                   order[i - 1]->name);
    else if (order[i]->begin > at)
      rc = corrupt(err, path,
                   "data bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor",
                   at, order[i]->begin);
    at = order[i]->end;
  }
  if (rc == TOPOS_OK && at != data_len)
    rc = corrupt(err, path,
                 "data bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor",
                 at, data_len);
  free(order);
  return rc;
}

static int check_metadata(const cJSON *item, const char *path,
                          topos_error *err) {
  if (!cJSON_IsObject(item))
    return corrupt(err, path, "%s is not an object", METADATA_KEY);
  for (const cJSON *x = item->child; x; x = x->next)
    if (!cJSON_IsString(x))
      return corrupt(err, path, "%s value \"%s\" is not a string", METADATA_KEY,
                     x->string);
  return TOPOS_OK;
}

/* Reads n bytes at offset, retrying short reads and EINTR: n, fewer at
 * the end of the file, or -1 with errno. */
static int64_t read_at(int fd, void *buf, uint64_t n, uint64_t offset) {
  uint64_t done = 0;
  while (done < n) {
    uint64_t want = n - done;
    if (want > (1u << 30)) want = 1u << 30; /* pread's limit is SSIZE_MAX */
    ssize_t got =
        pread(fd, (uint8_t *)buf + done, (size_t)want, (off_t)(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += (uint64_t)got;
  }
  return (int64_t)done;
}

void topos_safetensors_free(topos_safetensors *st) {
  if (!st) return;
  for (int i = 0; i < st->count; i++) free(st->items[i].name);
  free(st->items);
  if (st->fd >= 0) close(st->fd);
  free(st->path);
  free(st);
}

/* The set over checked entries, taking over fd (closed on failure);
 * data_start is the data buffer's offset in the file. */
static topos_safetensors *build_set(int n, const entry *entries,
                                    uint64_t data_start, int fd,
                                    const struct stat *at_load,
                                    const char *path, topos_error *err) {
  topos_safetensors *st = calloc(1, sizeof *st);
  if (!st) {
    close(fd);
    error_set(err, TOPOS_ERR_MEMORY, "topos_safetensors_load: no memory");
    return NULL;
  }
  st->fd = fd;
  st->at_load = *at_load;
  st->path = strdup(path);
  st->items = calloc((size_t)(n ? n : 1), sizeof *st->items);
  if (!st->path || !st->items) {
    topos_safetensors_free(st);
    error_set(err, TOPOS_ERR_MEMORY, "topos_safetensors_load: no memory");
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    const entry *e = &entries[i];
    stored *s = &st->items[i];
    st->count = i + 1;
    if (!(s->name = strdup(e->name))) {
      topos_safetensors_free(st);
      error_set(err, TOPOS_ERR_MEMORY, "topos_safetensors_load: no memory");
      return NULL;
    }
    s->dtype = e->dtype;
    s->rank = e->rank;
    memcpy(s->shape, e->shape, sizeof s->shape);
    s->offset = data_start + e->begin;
    s->bytes = e->end - e->begin;
  }
  return st;
}

/* Checks the header's JSON (header_len bytes at json) against the file's
 * size and builds the set over fd (closed on failure). */
static topos_safetensors *parse(const char *json, uint64_t header_len, int fd,
                                const struct stat *at_load, const char *path,
                                topos_error *err) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)header_len, &end, 0);
  /* After the object, only the spaces the format allows as padding. */
  bool trailing_ok = root != NULL;
  for (const char *p = end; trailing_ok && p < json + header_len; p++)
    trailing_ok = *p == ' ';
  if (!trailing_ok || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    close(fd);
    corrupt(err, path, "the header is not a JSON object");
    return NULL;
  }
  uint64_t data_len = (uint64_t)at_load->st_size - 8 - header_len;
  int n = 0;
  for (const cJSON *x = root->child; x; x = x->next) n++;
  entry *entries = malloc((size_t)(n ? n : 1) * sizeof *entries);
  const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
  topos_safetensors *st = NULL;
  int rc = entries && names ? TOPOS_OK
                            : error_set(err, TOPOS_ERR_MEMORY,
                                        "topos_safetensors_load: no memory");
  int count = 0;
  bool seen_metadata = false;
  for (const cJSON *x = root->child; x && rc == TOPOS_OK; x = x->next) {
    if (strcmp(x->string, METADATA_KEY) == 0) {
      rc = seen_metadata ? corrupt(err, path, "duplicate %s", METADATA_KEY)
                         : check_metadata(x, path, err);
      seen_metadata = true;
      continue;
    }
    rc = check_entry(x, data_len, &entries[count], path, err);
    names[count] = x->string;
    count++;
  }
  bool failed = false;
  const char *dup =
      rc == TOPOS_OK ? first_duplicate(count, names, &failed) : NULL;
  if (failed)
    rc = error_set(err, TOPOS_ERR_MEMORY, "topos_safetensors_load: no memory");
  else if (dup)
    rc = corrupt(err, path, "duplicate tensor name \"%s\"", dup);
  if (rc == TOPOS_OK) rc = check_tiling(count, entries, data_len, path, err);
  if (rc == TOPOS_OK)
    st = build_set(count, entries, 8 + header_len, fd, at_load, path, err);
  else
    close(fd);
  free(names);
  free(entries);
  cJSON_Delete(root);
  return st;
}

/* Opens the file, checks the header length against its size and reads
 * the header: the JSON bytes (caller frees), or NULL with err. */
static char *read_header(const char *path, int *fd_out, struct stat *sb,
                         uint64_t *header_len, topos_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error_set(err, errno == ENOENT ? TOPOS_ERR_NOT_FOUND : TOPOS_ERR_IO,
              "topos_safetensors_load: %s: %s", path, strerror(errno));
    return NULL;
  }
  uint8_t prefix[8];
  char *json = NULL;
  uint64_t len = 0, hl = 0;
  if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
    error_set(err, TOPOS_ERR_IO, "topos_safetensors_load: %s: not a file",
              path);
    goto fail;
  }
  len = (uint64_t)sb->st_size;
  if (len < 8) {
    corrupt(err, path, "truncated: %" PRIu64 " bytes, no header length", len);
    goto fail;
  }
  errno = 0;
  if (read_at(fd, prefix, 8, 0) != 8) goto short_read;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)prefix[i] << (8 * i);
  if (hl > HEADER_CAP) {
    corrupt(err, path, "header length %" PRIu64 " is over the cap of %u", hl,
            HEADER_CAP);
    goto fail;
  }
  if (hl > len - 8) {
    corrupt(err, path,
            "truncated: header length %" PRIu64 " is beyond the file's %" PRIu64
            " bytes",
            hl, len - 8);
    goto fail;
  }
  if (!(json = malloc((size_t)hl + 1))) {
    error_set(err, TOPOS_ERR_MEMORY,
              "topos_safetensors_load: %s: no memory for a %" PRIu64
              "-byte header",
              path, hl);
    goto fail;
  }
  errno = 0;
  if (read_at(fd, json, hl, 8) != (int64_t)hl) goto short_read;
  json[hl] = '\0';
  *fd_out = fd;
  *header_len = hl;
  return json;
short_read:
  error_set(err, TOPOS_ERR_IO, "topos_safetensors_load: %s: short read%s%s",
            path, errno ? ": " : "", errno ? strerror(errno) : "");
fail:
  free(json);
  close(fd);
  return NULL;
}

topos_safetensors *topos_safetensors_load(const char *path, topos_error *err) {
  if (!path) {
    error_set(err, TOPOS_ERR_ARGUMENT, "topos_safetensors_load: path is NULL");
    return NULL;
  }
  int fd = -1;
  struct stat at_load;
  uint64_t header_len = 0;
  char *json = read_header(path, &fd, &at_load, &header_len, err);
  if (!json) return NULL;
  topos_safetensors *st = parse(json, header_len, fd, &at_load, path, err);
  free(json);
  return st;
}

int topos_safetensors_count(const topos_safetensors *st) {
  return st ? st->count : -1;
}

const char *topos_safetensors_name(const topos_safetensors *st, int i) {
  return st && i >= 0 && i < st->count ? st->items[i].name : NULL;
}

/* Whether the file was modified or resized since it was loaded. */
static bool changed_since_load(const topos_safetensors *st, struct stat *now) {
  if (fstat(st->fd, now) != 0) {
    now->st_size = -1;
    return true;
  }
  return now->st_size != st->at_load.st_size ||
         now->st_mtim.tv_sec != st->at_load.st_mtim.tv_sec ||
         now->st_mtim.tv_nsec != st->at_load.st_mtim.tv_nsec;
}

/* A new tensor holding item s's bytes, read from the file, or NULL. */
static topos_tensor *read_tensor(const topos_safetensors *st, const stored *s,
                                 topos_error *err) {
  topos_tensor *t =
      tensor_new(s->dtype, s->rank, s->rank ? s->shape : NULL, err);
  if (!t || s->bytes == 0) return t;
  errno = 0;
  int64_t got = read_at(st->fd, tensor_data(t), s->bytes, s->offset);
  int read_errno = errno;
  struct stat now = {0};
  if (got >= 0 && (uint64_t)got == s->bytes && !changed_since_load(st, &now))
    return t;
  topos_tensor_release(t);
  if (got < 0) {
    error_set(err, TOPOS_ERR_IO, "topos_safetensors_get: %s: \"%s\": read: %s",
              st->path, s->name, strerror(read_errno));
  } else if ((uint64_t)got != s->bytes) {
    error_set(err, TOPOS_ERR_IO,
              "topos_safetensors_get: %s: \"%s\": short read, %" PRId64
              " of %" PRIu64 " bytes at offset %" PRIu64
              ": the file changed since it was loaded",
              st->path, s->name, got, s->bytes, s->offset);
  } else {
    error_set(err, TOPOS_ERR_IO,
              "topos_safetensors_get: %s: \"%s\": the file changed since it "
              "was loaded (%lld bytes then, %lld now, or modified)",
              st->path, s->name, (long long)st->at_load.st_size,
              (long long)now.st_size);
  }
  return NULL;
}

topos_tensor *topos_safetensors_get(const topos_safetensors *st,
                                    const char *name, topos_error *err) {
  if (!st || !name) {
    error_set(err, TOPOS_ERR_ARGUMENT, "topos_safetensors_get: %s is NULL",
              st ? "name" : "set");
    return NULL;
  }
  for (int i = 0; i < st->count; i++)
    if (strcmp(st->items[i].name, name) == 0)
      return read_tensor(st, &st->items[i], err);
  error_set(err, TOPOS_ERR_NOT_FOUND, "topos_safetensors_get: no tensor \"%s\"",
            name);
  return NULL;
}
