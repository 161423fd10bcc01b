/*
 * metrics.c - per-method request counters and latency histograms, and
 * per-tenant request counters (metrics.h).  Plain atomics in static
 * arrays: recording is a few relaxed increments, and a scrape reads
 * whatever is there (a histogram read during a record may be off by that
 * one call, as Prometheus clients allow).
 */
#include "metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "log.h"
#include "store.h"
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

/* ------------------------------------------------------------ per tenant */

/* Tenants come from the store, so there are few; but names of removed
 * tenants stay counted, and the table must not grow without bound: at
 * most METRICS_TENANT_CAP rows, then one shared row.  Rows live in a
 * static array, filled in order and never moved or freed; an
 * open-addressing index of pointers into it, twice the cap so that a
 * probe ends soon at an empty slot, finds a name.  The index only ever
 * gains entries, each published with a release store under tenant_lock,
 * so the hot path (a tenant that has its row) is a hash, a probe of
 * acquire loads and one relaxed increment, without a lock. */
#define TENANT_SLOTS (2 * METRICS_TENANT_CAP) /* a power of two */

typedef struct tenant_row {
  char name[STORE_TENANT_NAME_MAX + 1];
  _Atomic uint64_t by_status[STATUS_CODES];
} tenant_row;

static tenant_row tenant_rows[METRICS_TENANT_CAP];
static tenant_row tenant_other; /* every tenant past the cap */
static _Atomic(tenant_row *) tenant_index[TENANT_SLOTS];
/* Rows in use: written under tenant_lock after the row's name. */
static _Atomic int tenant_used;
static pthread_mutex_t tenant_lock = PTHREAD_MUTEX_INITIALIZER;
static bool tenant_overflow; /* under tenant_lock: a tenant found no row */

/* FNV-1a: names are short, and any spread will do at half load. */
static uint32_t tenant_hash(const char *name) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h;
}

/* name's row, or NULL with *slot the empty slot that ends its probe. */
static tenant_row *tenant_find(const char *name, uint32_t *slot) {
  for (uint32_t i = tenant_hash(name) & (TENANT_SLOTS - 1);;
       i = (i + 1) & (TENANT_SLOTS - 1)) {
    tenant_row *r =
        atomic_load_explicit(&tenant_index[i], memory_order_acquire);
    if (r == NULL) {
      *slot = i;
      return NULL;
    }
    if (strcmp(r->name, name) == 0) return r;
  }
}

/* name's row, made when missing; the shared row past the cap. */
static tenant_row *tenant_row_of(const char *name) {
  uint32_t slot;
  tenant_row *r = tenant_find(name, &slot);
  if (r != NULL) return r;
  pthread_mutex_lock(&tenant_lock);
  /* Again under the lock: another thread may have added it meanwhile,
   * and only this lock's holder fills an empty slot. */
  r = tenant_find(name, &slot);
  if (r == NULL) {
    int used = atomic_load_explicit(&tenant_used, memory_order_relaxed);
    if (used < METRICS_TENANT_CAP) {
      r = &tenant_rows[used];
      snprintf(r->name, sizeof r->name, "%s", name);
      atomic_store_explicit(&tenant_used, used + 1, memory_order_release);
      atomic_store_explicit(&tenant_index[slot], r, memory_order_release);
    } else {
      if (!tenant_overflow) {
        /* Said once: the operator learns why a tenant's Stats reads 0. */
        tenant_overflow = true;
        log_event("metrics",
                  "%d tenants have request counts; the calls of tenant %s "
                  "and of any further tenant are counted together, as "
                  "tenant (other), until the daemon restarts",
                  METRICS_TENANT_CAP, name);
      }
      r = &tenant_other;
    }
  }
  pthread_mutex_unlock(&tenant_lock);
  return r;
}

void metrics_observe_tenant(const char *tenant, int status) {
  if (tenant == NULL || tenant[0] == '\0') return;
  if (status < 0 || status >= STATUS_CODES) status = 2; /* UNKNOWN */
  tenant_row *r = tenant_row_of(tenant);
  atomic_fetch_add_explicit(&r->by_status[status], 1, memory_order_relaxed);
}

void metrics_tenant_counts(const char *tenant, int64_t *requests,
                           int64_t *errors) {
  *requests = 0;
  *errors = 0;
  uint32_t slot;
  tenant_row *r = tenant == NULL ? NULL : tenant_find(tenant, &slot);
  if (r == NULL) return;
  for (int c = 0; c < STATUS_CODES; c++) {
    uint64_t n = atomic_load_explicit(&r->by_status[c], memory_order_relaxed);
    *requests += (int64_t)n;
    if (c != 0) *errors += (int64_t)n;
  }
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

/* One tenant's lines: a line per status with calls. */
static void write_tenant(text_buf *b, const char *name, tenant_row *r) {
  for (int c = 0; c < STATUS_CODES; c++) {
    uint64_t n = atomic_load_explicit(&r->by_status[c], memory_order_relaxed);
    if (n == 0) continue;
    /* Tenant names are [a-z0-9_-] (store.h): nothing to escape. */
    text_printf(b,
                "topos_tenant_requests_total{tenant=\"%s\",code=\"%s\"} %llu\n",
                name, wire_grpc_status_name(c), (unsigned long long)n);
  }
}

void metrics_write_tenants(text_buf *b) {
  int used = atomic_load_explicit(&tenant_used, memory_order_acquire);
  if (used == 0) return;
  text_printf(b,
              "# HELP topos_tenant_requests_total Calls answered, by the "
              "caller's tenant and gRPC status (tenant=\"(other)\": every "
              "tenant past the first %d).\n"
              "# TYPE topos_tenant_requests_total counter\n",
              METRICS_TENANT_CAP);
  for (int i = 0; i < used; i++)
    write_tenant(b, tenant_rows[i].name, &tenant_rows[i]);
  write_tenant(b, "(other)", &tenant_other); /* nothing until the cap */
}
