/*
 * text.c - a growing string for the engine's text outputs (describe,
 * plan describe, emission).  Appends are printf-style; an allocation
 * failure marks the text failed and later appends do nothing, so callers
 * check once at the end.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "internal.h"

void text_add(text *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(t->s ? t->s + t->len : NULL,
                         t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (need < 0) {
      t->failed = true;
      return;
    }
    if (t->s && t->len + (size_t)need < t->cap) {
      t->len += (size_t)need;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 256;
    while (cap < t->len + (size_t)need + 1) cap *= 2;
    char *s = realloc(t->s, cap);
    if (!s) {
      t->failed = true;
      return;
    }
    t->s = s;
    t->cap = cap;
  }
}

char *text_finish(text *t, const char *what, topos_error *err) {
  if (t->failed || !t->s) {
    free(t->s);
    t->s = NULL;
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", what);
    return NULL;
  }
  char *s = t->s;
  t->s = NULL;
  return s;
}
