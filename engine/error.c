/*
 * error.c - the engine's one error convention and the small text helpers
 * its messages are built from.
 *
 * Guarantees: error_set never allocates, never prints and accepts a NULL
 * error (callers that do not care pass NULL); a message that does not fit
 * in topos_error.message is truncated, always NUL-terminated.  shape_text
 * and meta_text write into caller buffers of SHAPE_TEXT bytes, which hold
 * any rank-8 shape with int64 extents, so they never truncate.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "internal.h"

int error_set(topos_error *err, int code, const char *fmt, ...) {
  if (err == NULL) return code;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  /* vsnprintf only fails on an encoding error; an empty message is still
   * better than whatever the buffer held before. */
  if (n < 0) err->message[0] = '\0';
  return code;
}

/* Appends formatted text at *pos without running past size. */
static void append(char *buf, size_t size, size_t *pos, const char *fmt,
                   long long value, bool with_value) {
  if (*pos >= size) return;
  int n = with_value ? snprintf(buf + *pos, size - *pos, fmt, value)
                     : snprintf(buf + *pos, size - *pos, "%s", fmt);
  if (n < 0) return;
  *pos += (size_t)n;
  if (*pos >= size) *pos = size - 1;
}

static const char *shape_text_into(char *buf, size_t size, size_t pos, int rank,
                                   const int64_t *shape) {
  append(buf, size, &pos, "[", 0, false);
  if (rank > TOPOS_MAX_RANK) rank = TOPOS_MAX_RANK;
  for (int i = 0; i < rank && shape != NULL; i++) {
    if (i > 0) append(buf, size, &pos, ",", 0, false);
    append(buf, size, &pos, "%lld", (long long)shape[i], true);
  }
  append(buf, size, &pos, "]", 0, false);
  return buf;
}

const char *shape_text(char *buf, int rank, const int64_t *shape) {
  buf[0] = '\0';
  return shape_text_into(buf, SHAPE_TEXT, 0, rank, shape);
}

const char *meta_text(char *buf, const tensor_meta *m) {
  buf[0] = '\0';
  if (m == NULL) {
    snprintf(buf, SHAPE_TEXT, "(none)");
    return buf;
  }
  size_t pos = 0;
  append(buf, SHAPE_TEXT, &pos, topos_dtype_name(m->dtype), 0, false);
  return shape_text_into(buf, SHAPE_TEXT, pos, m->rank, m->shape);
}

const char *topos_version(void) {
  return TOPOS_VERSION;
}

const char *topos_status_name(int code) {
  switch (code) {
    case TOPOS_OK:
      return "ok";
    case TOPOS_ERR_ARGUMENT:
      return "argument";
    case TOPOS_ERR_SHAPE:
      return "shape";
    case TOPOS_ERR_DTYPE:
      return "dtype";
    case TOPOS_ERR_RANGE:
      return "range";
    case TOPOS_ERR_MEMORY:
      return "memory";
    case TOPOS_ERR_STATE:
      return "state";
    case TOPOS_ERR_NOT_FOUND:
      return "not found";
    case TOPOS_ERR_CORRUPT:
      return "corrupt";
    case TOPOS_ERR_IO:
      return "io";
    case TOPOS_ERR_CANCELLED:
      return "cancelled";
    case TOPOS_ERR_DEADLINE:
      return "deadline";
    default:
      return "unknown";
  }
}

void topos_free(void *p) {
  free(p);
}
