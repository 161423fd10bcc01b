/*
 * quota.h - the per-tenant quotas a daemon enforces in memory
 * (docs/operations.md, "Quotas"): in-flight calls and the request rate,
 * both at admission, before a call is queued; and the texts of every
 * quota's RESOURCE_EXHAUSTED, so they read the same wherever a quota is
 * checked (stored bytes and nodes in Record/PutBlob, run bytes at memory
 * admission).
 *
 * The quotas themselves live in the store (store_quota_get) and are read
 * once per call, at admission, next to the token (auth_quota): a change
 * with `topos quota set` applies from the next call.  What lives here is
 * only the state that cannot be in the store: how many calls each tenant
 * has in flight, and each tenant's token bucket.
 */
#ifndef TOPOSD_QUOTA_H
#define TOPOSD_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct quota_table quota_table;

/* An empty table; NULL when out of memory.  Free with quota_table_free. */
quota_table *quota_table_new(void);
/* NULL is a no-op. */
void quota_table_free(quota_table *t);

/* Admits one call of `tenant` under its quotas q at now_ns: in-flight
 * below q->inflight and a token in its bucket (rate_per_s, burst).  True:
 * the call is counted in flight and took a token (quota_release it once
 * answered).  False: nothing changed, and message says which quota, its
 * limit and the ask (RESOURCE_EXHAUSTED).  Thread-safe. */
bool quota_admit(quota_table *t, const char *tenant, const store_quota *q,
                 const char *method, int64_t now_ns, char *message, size_t len);
/* Ends the count of one admitted call of tenant. */
void quota_release(quota_table *t, const char *tenant);

/* The stored_bytes quota without a race between a tenant's concurrent
 * uploads (Record, PutBlob): under quota_upload_lock the caller reads
 * what the store says the tenant holds, adds quota_uploading (uploads
 * admitted and not answered yet), and when the new upload fits, counts it
 * with quota_upload_add(+bytes) before unlocking; once the call is
 * answered (the store has it, or it failed) quota_upload_done takes it
 * back, under the same lock.  So a check sees another upload either in
 * flight or, once that one is done (committed first), in the store;
 * never in neither.  (Were the release outside the lock, a check could
 * read the holding before an upload's commit and the in-flight bytes
 * after its release, and miss it: the quotas suite caught that under
 * ASan, once in twenty runs.)  quota_upload_add is false when out of
 * memory (nothing counted). */
void quota_upload_lock(quota_table *t);
void quota_upload_unlock(quota_table *t);
int64_t quota_uploading(quota_table *t, const char *tenant);
bool quota_upload_add(quota_table *t, const char *tenant, int64_t bytes);
void quota_upload_done(quota_table *t, const char *tenant, int64_t bytes);

/* A call's deadline under q's run_ms: the earlier of deadline_ns and
 * arrival_ns + run_ms (INT64_MAX is no deadline). */
int64_t quota_deadline(const store_quota *q, int64_t arrival_ns,
                       int64_t deadline_ns);

#endif /* TOPOSD_QUOTA_H */
