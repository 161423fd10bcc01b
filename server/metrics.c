/*
 * metrics.c - per-method request counters and latency histograms
 * (metrics.h).  Plain atomics in static arrays: recording is a few
 * relaxed increments, and a scrape reads whatever is there (a histogram
 * read during a record may be off by that one call, as Prometheus
 * clients allow).
 */
#include "metrics.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "wire.h"

#define MAX_METHODS 32
#define STATUS_CODES 17 /* gRPC's OK .. UNAUTHENTICATED */

/* Upper bounds in microseconds: 0.5 ms .. 60 s, then +Inf. */
static const int64_t bucket_us[] = {
    500,    1000,   2500,    5000,    10000,   25000,    50000,    100000,
    250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000};
#define NBUCKETS ((int)(sizeof bucket_us / sizeof bucket_us[0]))

typedef struct method_metrics {
  _Atomic uint64_t by_status[STATUS_CODES];
  _Atomic uint64_t buckets[NBUCKETS + 1]; /* the last: above every bound */
  _Atomic uint64_t sum_us;
} method_metrics;

static method_metrics table[MAX_METHODS][TRANSPORT_COUNT];

void metrics_observe(int method, int transport, int status,
                     int64_t duration_us) {
  if (method < 0 || method >= MAX_METHODS || transport < 0 ||
      transport >= TRANSPORT_COUNT)
    return;
  method_metrics *m = &table[method][transport];
  if (status < 0 || status >= STATUS_CODES) status = 2; /* UNKNOWN */
  if (duration_us < 0) duration_us = 0;
  int b = 0;
  while (b < NBUCKETS && duration_us > bucket_us[b]) b++;
  atomic_fetch_add_explicit(&m->by_status[status], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->sum_us, (uint64_t)duration_us,
                            memory_order_relaxed);
}

/* ------------------------------------------------------------ exposition */

static const char *transport_names[TRANSPORT_COUNT] = {"grpc", "http"};

void metrics_write_requests(text_buf *b) {
  int methods =
      handler_method_count < MAX_METHODS ? handler_method_count : MAX_METHODS;
  text_printf(b,
              "# HELP topos_requests_total Calls answered, by method, "
              "transport and gRPC status.\n"
              "# TYPE topos_requests_total counter\n");
  for (int i = 0; i < methods; i++)
    for (int t = 0; t < TRANSPORT_COUNT; t++)
      for (int c = 0; c < STATUS_CODES; c++) {
        uint64_t n = atomic_load_explicit(&table[i][t].by_status[c],
                                          memory_order_relaxed);
        if (n == 0) continue;
        text_printf(b,
                    "topos_requests_total{method=\"%s\",transport=\"%s\","
                    "code=\"%s\"} %llu\n",
                    handler_methods[i].name, transport_names[t],
                    wire_grpc_status_name(c), (unsigned long long)n);
      }
  text_printf(b,
              "# HELP topos_request_duration_seconds Time from a call's "
              "arrival to its reply, by method and transport.\n"
              "# TYPE topos_request_duration_seconds histogram\n");
  for (int i = 0; i < methods; i++)
    for (int t = 0; t < TRANSPORT_COUNT; t++) {
      method_metrics *m = &table[i][t];
      uint64_t counts[NBUCKETS + 1], total = 0;
      for (int k = 0; k <= NBUCKETS; k++) {
        counts[k] = atomic_load_explicit(&m->buckets[k], memory_order_relaxed);
        total += counts[k];
      }
      if (total == 0) continue;
      const char *name = handler_methods[i].name;
      uint64_t cumulative = 0;
      for (int k = 0; k < NBUCKETS; k++) {
        cumulative += counts[k];
        text_printf(b,
                    "topos_request_duration_seconds_bucket{method=\"%s\","
                    "transport=\"%s\",le=\"%g\"} %llu\n",
                    name, transport_names[t], (double)bucket_us[k] / 1e6,
                    (unsigned long long)cumulative);
      }
      text_printf(b,
                  "topos_request_duration_seconds_bucket{method=\"%s\","
                  "transport=\"%s\",le=\"+Inf\"} %llu\n",
                  name, transport_names[t], (unsigned long long)total);
      text_printf(
          b,
          "topos_request_duration_seconds_sum{method=\"%s\",transport=\"%s\"} "
          "%.6f\n",
          name, transport_names[t],
          (double)atomic_load_explicit(&m->sum_us, memory_order_relaxed) / 1e6);
      text_printf(b,
                  "topos_request_duration_seconds_count{method=\"%s\","
                  "transport=\"%s\"} %llu\n",
                  name, transport_names[t], (unsigned long long)total);
    }
}
