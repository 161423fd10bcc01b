/*
 * metrics.h - request counts and latency histograms per method and
 * transport, for the Prometheus exposition the HTTP gateway serves at
 * /metrics (gateway.c writes the rest: queue, workers, cache, store,
 * backends, connections).  One set per process; every thread records.
 */
#ifndef TOPOSD_METRICS_H
#define TOPOSD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text_buf.h"

typedef enum transport_kind {
  TRANSPORT_GRPC,
  TRANSPORT_HTTP,
  TRANSPORT_COUNT
} transport_kind;

/* One answered call of handler_methods[method] with a gRPC status, from
 * arrival to the reply handed to the transport.  Lock-free. */
void metrics_observe(int method, int transport, int status,
                     int64_t duration_us);

/* Appends topos_requests_total{method,transport,code} and
 * topos_request_duration_seconds{method,transport} (a histogram) for every
 * method that has answered a call. */
void metrics_write_requests(text_buf *b);

#endif /* TOPOSD_METRICS_H */
