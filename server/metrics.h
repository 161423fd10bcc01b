/*
 * metrics.h - request counts and latency histograms per method and
 * transport, and request counts per tenant, for the Prometheus exposition
 * the HTTP gateway serves at /metrics (gateway.c writes the rest: queue,
 * workers, cache, store, backends, connections) and for a tenant's own
 * Stats.  One set per process; every thread records.
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

/* One answered call of tenant with a gRPC status, for that tenant's
 * Stats and topos_tenant_requests_total.  tenant NULL or "" (auth off, a
 * probe, a call refused before its token was accepted) counts nothing.
 * The first METRICS_TENANT_CAP tenants seen get a row each; the calls of
 * any further tenant are counted together, as tenant "(other)".  No lock
 * once the tenant has its row (a tenant's first call takes one mutex). */
#define METRICS_TENANT_CAP 1024
void metrics_observe_tenant(const char *tenant, int status);

/* tenant's calls answered so far, all statuses (*requests) and those
 * other than OK (*errors); 0 and 0 for a tenant with no row (no call
 * counted yet, or past the cap). */
void metrics_tenant_counts(const char *tenant, int64_t *requests,
                           int64_t *errors);

/* Appends topos_requests_total{method,transport,code} and
 * topos_request_duration_seconds{method,transport} (a histogram) for every
 * method that has answered a call. */
void metrics_write_requests(text_buf *b);

/* Appends topos_tenant_requests_total{tenant,code} for every tenant with a
 * row, and tenant="(other)" once a call was counted there; nothing while
 * no tenant's call was counted (auth off). */
void metrics_write_tenants(text_buf *b);

#endif /* TOPOSD_METRICS_H */
