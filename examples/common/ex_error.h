/*
 * ex_error.h - the examples' error setter: one place that fills a
 * topos_error with a code and a printf-style message (engine/error.c's
 * pattern), shared by the data loaders (idx.c, cifar.c) and ex.c.
 */
#ifndef EX_ERROR_H
#define EX_ERROR_H

#include "topos.h"

/* Sets err (when not NULL) to code and the formatted message, truncated
 * to fit; returns code, so a failure reads `return ex_error(err, ...)`. */
__attribute__((format(printf, 3, 4))) int ex_error(topos_error *err, int code,
                                                   const char *fmt, ...);

#endif
