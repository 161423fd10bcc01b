/*
 * text_buf.h - a growing text buffer for what the daemon writes in pieces
 * (the metrics exposition, the graph page).  Always NUL-terminated; on
 * out of memory it stops growing and says so (`failed`), so a writer
 * checks once at the end.
 */
#ifndef TOPOSD_TEXT_BUF_H
#define TOPOSD_TEXT_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct text_buf {
  char *data;
  size_t len, cap;
  bool failed;
} text_buf;

void text_printf(text_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void text_put(text_buf *b, const char *s, size_t n);

#endif /* TOPOSD_TEXT_BUF_H */
