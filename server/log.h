/*
 * log.h - toposd's structured log on stderr: one line per request, and
 * a few lines for the daemon's own events (start, drain, stop), as
 * logfmt text (key=value) or one JSON object per line.
 */
#ifndef TOPOSD_LOG_H
#define TOPOSD_LOG_H

#include <stdint.h>

#include "config.h"

/* What one request's line says. */
typedef struct log_request_line {
  uint64_t request_id; /* the daemon's counter, also in INTERNAL replies */
  const char *method;  /* "Forward" */
  const char *spec_id; /* "" when the request names none */
  const char *peer;    /* gRPC's peer string, may be NULL */
  int status;          /* a grpc_status_code */
  const char *message; /* the status message, "" on OK */
  int64_t bytes_in;    /* request message bytes */
  int64_t bytes_out;   /* reply message bytes */
  int64_t queue_us;    /* from arrival to a worker picking it up */
  int64_t duration_us; /* from arrival to the reply being sent */
  int64_t cpu_us;      /* the worker's CPU time on it; -1: none */
} log_request_line;

void log_set_format(log_format format);
/* Writes one request line (one write(2), so lines never interleave). */
void log_request(const log_request_line *line);
/* Writes one event line: event=<event> msg=<printf text>. */
void log_event(const char *event, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* TOPOSD_LOG_H */
