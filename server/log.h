/*
 * log.h - toposd's structured log on stderr: one line per request, and
 * a few lines for the daemon's own events (start, drain, stop), as
 * logfmt text (key=value) or one JSON object per line.  Every line says
 * its level (level=info); --log-level drops the lines below one, and
 * --log-requests keeps all request lines, the failed ones, a sample of
 * the rest, or none.
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
/* The least level written, and which request lines (config.h). */
void log_set_level(log_level level);
void log_set_requests(log_requests which, int64_t sample);
/* Writes one request line (one write(2), so lines never interleave). */
void log_request(const log_request_line *line);
/* Writes one event line at info: event=<event> msg=<printf text>. */
void log_event(const char *event, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same at a level of its own (a warning, an error). */
void log_event_at(log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* TOPOSD_LOG_H */
