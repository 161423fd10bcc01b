/*
 * quota.c - in-flight counts and token buckets per tenant (quota.h).
 *
 * A small array under one mutex: a daemon serves a handful of tenants,
 * and the critical section is a few arithmetic operations, so a lookup by
 * name beats anything cleverer.  Entries are never removed (a removed
 * tenant's calls are refused at authentication anyway); a tenant's
 * bucket starts full.
 */
#include "quota.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tenant_state {
  char name[STORE_TENANT_NAME_MAX + 1];
  int64_t inflight;
  int64_t uploading; /* bytes of uploads admitted, not yet answered */
  double tokens;     /* in the bucket at last_ns */
  int64_t last_ns;   /* 0: the bucket has not been used yet (full) */
} tenant_state;

struct quota_table {
  pthread_mutex_t lock;
  /* Serialises the stored_bytes checks (quota_upload_lock): held across
   * a store read, so never taken under `lock`. */
  pthread_mutex_t upload_lock;
  tenant_state *rows;
  int n, capacity;
};

quota_table *quota_table_new(void) {
  quota_table *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->upload_lock, NULL);
  return t;
}

void quota_table_free(quota_table *t) {
  if (t == NULL) return;
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->upload_lock);
  free(t->rows);
  free(t);
}

/* tenant's row, added when missing; NULL when out of memory.  Under
 * t->lock. */
static tenant_state *row_of(quota_table *t, const char *tenant) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->rows[i].name, tenant) == 0) return &t->rows[i];
  if (t->n == t->capacity) {
    int grown = t->capacity ? t->capacity * 2 : 8;
    tenant_state *more = realloc(t->rows, (size_t)grown * sizeof *more);
    if (more == NULL) return NULL;
    t->rows = more;
    t->capacity = grown;
  }
  tenant_state *r = &t->rows[t->n++];
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", tenant);
  return r;
}

bool quota_admit(quota_table *t, const char *tenant, const store_quota *q,
                 const char *method, int64_t now_ns, char *message,
                 size_t len) {
  pthread_mutex_lock(&t->lock);
  tenant_state *r = row_of(t, tenant);
  if (r == NULL) {
    pthread_mutex_unlock(&t->lock);
    snprintf(message, len, "%s: daemon out of memory", method);
    return false;
  }
  if (q->inflight >= 0 && r->inflight + 1 > q->inflight) {
    snprintf(message, len,
             "%s: quota inflight: limit %lld calls in flight, the tenant has "
             "%lld, this call adds 1",
             method, (long long)q->inflight, (long long)r->inflight);
    pthread_mutex_unlock(&t->lock);
    return false;
  }
  double tokens = 0;
  bool bucket = q->rate_per_s > 0 && q->burst >= 1;
  if (bucket) {
    /* Refill since the last call, up to the burst; a quota lowered since
     * then clamps what was there. */
    double cap = (double)q->burst;
    tokens = r->last_ns == 0 ? cap
                             : r->tokens + (double)(now_ns - r->last_ns) / 1e9 *
                                               q->rate_per_s;
    if (tokens > cap) tokens = cap;
    if (tokens < 1.0) {
      double wait_ms = ceil((1.0 - tokens) / q->rate_per_s * 1000.0);
      snprintf(message, len,
               "%s: quota rate: limit %g calls per second (burst %lld), the "
               "tenant's bucket is empty, this call asks 1; retry after %.0f "
               "ms",
               method, q->rate_per_s, (long long)q->burst, wait_ms);
      /* Keep what accrued: a refused call takes nothing. */
      r->tokens = tokens;
      r->last_ns = now_ns;
      pthread_mutex_unlock(&t->lock);
      return false;
    }
    r->tokens = tokens - 1.0;
    r->last_ns = now_ns;
  }
  r->inflight++;
  pthread_mutex_unlock(&t->lock);
  return true;
}

void quota_upload_lock(quota_table *t) {
  pthread_mutex_lock(&t->upload_lock);
}

void quota_upload_unlock(quota_table *t) {
  pthread_mutex_unlock(&t->upload_lock);
}

int64_t quota_uploading(quota_table *t, const char *tenant) {
  int64_t bytes = 0;
  pthread_mutex_lock(&t->lock);
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->rows[i].name, tenant) == 0) bytes = t->rows[i].uploading;
  pthread_mutex_unlock(&t->lock);
  return bytes;
}

bool quota_upload_add(quota_table *t, const char *tenant, int64_t bytes) {
  pthread_mutex_lock(&t->lock);
  tenant_state *r = row_of(t, tenant);
  if (r != NULL) {
    r->uploading += bytes;
    if (r->uploading < 0) r->uploading = 0;
  }
  pthread_mutex_unlock(&t->lock);
  return r != NULL;
}

void quota_upload_done(quota_table *t, const char *tenant, int64_t bytes) {
  pthread_mutex_lock(&t->upload_lock);
  quota_upload_add(t, tenant, -bytes);
  pthread_mutex_unlock(&t->upload_lock);
}

void quota_release(quota_table *t, const char *tenant) {
  pthread_mutex_lock(&t->lock);
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->rows[i].name, tenant) == 0 && t->rows[i].inflight > 0) {
      t->rows[i].inflight--;
      break;
    }
  pthread_mutex_unlock(&t->lock);
}

int64_t quota_deadline(const store_quota *q, int64_t arrival_ns,
                       int64_t deadline_ns) {
  if (q->run_ms < 0) return deadline_ns;
  int64_t cap = arrival_ns + q->run_ms * 1000000;
  return cap < deadline_ns ? cap : deadline_ns;
}
