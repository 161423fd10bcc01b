/*
 * utf8.c - UTF-8 validation (see utf8.h): a byte-at-a-time decoder that
 * reads only the n bytes it is given and names the first fault.
 */
#include "utf8.h"

#include <stdint.h>

static bool fault(size_t i, const char *what, size_t *at, const char **why) {
  if (at) *at = i;
  if (why) *why = what;
  return false;
}

bool topos_utf8_check(const char *s, size_t n, size_t *at, const char **why) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    if (c == 0) return fault(i, "contains NUL", at, why);
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if (c == 0xC0 || c == 0xC1) {
      return fault(i, "not valid UTF-8 (an overlong encoding)", at, why);
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else if (c >= 0xF5 && c <= 0xF7) {
      return fault(i, "not valid UTF-8 (above U+10FFFF)", at, why);
    } else if ((c & 0xC0) == 0x80) {
      return fault(i, "not valid UTF-8 (a stray continuation byte)", at, why);
    } else {
      return fault(i,
                   "not valid UTF-8 (byte 0xf8..0xff cannot start a "
                   "character)",
                   at, why);
    }
    for (size_t k = 1; k < len; k++) {
      if (i + k >= n || (u[i + k] & 0xC0) != 0x80)
        return fault(i, "not valid UTF-8 (a truncated sequence)", at, why);
      cp = cp << 6 | (u[i + k] & 0x3F);
    }
    if (cp < min)
      return fault(i, "not valid UTF-8 (an overlong encoding)", at, why);
    if (cp >= 0xD800 && cp <= 0xDFFF)
      return fault(i, "not valid UTF-8 (a surrogate)", at, why);
    if (cp > 0x10FFFF)
      return fault(i, "not valid UTF-8 (above U+10FFFF)", at, why);
    i += len;
  }
  return true;
}
