/*
 * ex_error.c - the examples' error setter (see ex_error.h).
 */
#include "ex_error.h"

#include <stdarg.h>
#include <stdio.h>

int ex_error(topos_error *err, int code, const char *fmt, ...) {
  if (err == NULL) return code;
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  if (n < 0) err->message[0] = '\0';
  return code;
}
