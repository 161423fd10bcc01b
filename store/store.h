/*
 * store.h - the daemon's content-addressed store: specs and parameter
 * blobs in one SQLite file (docs/store.md).
 *
 * Specs and blobs are named by their id, the lowercase hex SHA-256 of
 * their bytes (topos_sha256_hex).  The store knows bytes and ids, never
 * ops: encoding a network into spec bytes is the engine's job.
 *
 * Conventions, for every function here:
 *  - A function that can fail takes a `topos_error *err` (which may be
 *    NULL) and returns a topos_status (or NULL); errors never abort and
 *    never print.
 *  - Ids are 64 lowercase hex characters, NUL-terminated.  Any other
 *    string (short, long, uppercase, NULL) is TOPOS_ERR_ARGUMENT and never
 *    reaches SQL.
 *  - Unknown ids are TOPOS_ERR_NOT_FOUND; stored bytes that no longer hash
 *    to their id are TOPOS_ERR_CORRUPT and are never returned; a file or
 *    SQLite failure (including a store busy past its timeout) is
 *    TOPOS_ERR_IO.
 *  - A handle is safe to use from several threads at once (calls on one
 *    handle are serialised by its mutex), and several handles, in one
 *    process or many, may open the same file.
 */
#ifndef TOPOS_STORE_H
#define TOPOS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topos.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The schema version this code writes; store_open migrates older stores
 * forward and refuses newer ones. */
#define STORE_SCHEMA_VERSION 7
/* SQLite's header application_id of a topos store ("Topo"). */
#define STORE_APPLICATION_ID 0x546F706F
/* The blob cap of a freshly opened handle: 1 GiB. */
#define STORE_DEFAULT_BLOB_CAP ((int64_t)1 << 30)

typedef struct topos_store topos_store;

/* One row of store_list_specs. */
typedef struct store_spec_info {
  char id[65];          /* lowercase hex SHA-256, NUL-terminated */
  int64_t size;         /* bytes */
  int64_t created_ms;   /* wall clock at the first put, ms since the epoch */
  int64_t last_used_ms; /* wall clock of the last recorded use (put or
                         * store_touch_spec), as far as it is written */
} store_spec_info;

/* What store_stats reports. */
typedef struct store_stats_info {
  int64_t spec_count;
  int64_t spec_bytes; /* sum of the specs' sizes */
  int64_t blob_count;
  int64_t blob_bytes;   /* sum of the blobs' sizes, at most blob_cap */
  int64_t blob_cap;     /* this handle's cap */
  int64_t file_bytes;   /* the database's size in pages (WAL included) */
  int64_t spec_budget;  /* this handle's spec budget; 0 = none */
  int64_t store_budget; /* the file's size budget; 0 = none */
  int schema_version;
} store_stats_info;

/* Opens the store at `path`, creating the file when it is missing or
 * empty (a file it creates is mode 0600, and so are the -wal and -shm
 * files SQLite creates beside it, which copy the database's mode; an
 * existing file keeps its mode).  A file that is not a topos store (not SQLite
 * at all, or another application's SQLite database) or whose schema is newer
 * than STORE_SCHEMA_VERSION is refused with TOPOS_ERR_IO and a message saying
 * which, and the file is not modified.  An older schema is migrated
 * forward.  New handle (store_close), or NULL with err. */
topos_store *store_open(const char *path, topos_error *err);
/* Closes the handle; NULL is a no-op.  No call on it may be in flight. */
void store_close(topos_store *st);

/* Sets this handle's blob cap (bytes > 0) and evicts least recently used
 * blobs until the stored blobs fit under it.  Returns a topos_status. */
int store_set_blob_cap(topos_store *st, int64_t bytes, topos_error *err);

/* ------------------------------------------------------ retention, budgets */

/* Whether spec `id` is in use and must not be dropped (called with the
 * handle's lock held, from inside a write transaction: it must not call
 * back into the store). */
typedef bool (*store_in_use_fn)(void *ctx, const char *id);

/* Spec retention for this handle: after every spec put, while the stored
 * specs' sizes sum to more than `bytes`, the least recently used spec is
 * deleted, skipping the one just put and every spec in_use(ctx, id) says
 * is in use (in_use may be NULL: none is).  A new spec that cannot be
 * made to fit that way is refused with TOPOS_ERR_MEMORY and nothing is
 * deleted; a spec larger than the budget is refused before anything is
 * written.  Setting the budget applies it at once.  bytes 0 turns
 * retention off (the default). */
int store_set_spec_budget(topos_store *st, int64_t bytes,
                          store_in_use_fn in_use, void *ctx, topos_error *err);
/* Marks a spec used now.  Cheap: kept in memory and written in a batch
 * with the next spec put on this handle, when 1024 specs are waiting, or
 * at store_close (a crash loses what is waiting, which only makes those
 * specs look older to retention).  An unknown id is not an error. */
int store_touch_spec(topos_store *st, const char *id, topos_error *err);
/* Writes the waiting touches now. */
int store_flush_touches(topos_store *st, topos_error *err);

/* The file's size budget (bytes >= one page), kept in the file so every
 * handle on it (other threads' and processes') enforces the same one: a
 * write that would make the database file (page_count * page_size) pass
 * it is refused with TOPOS_ERR_MEMORY, a message naming the budget, what
 * is used and what was asked ("store full: ..."), and changes nothing.
 * Pages freed by deletes are reused first.  Lowering the budget below the
 * file's size deletes nothing; writes that need new pages are refused
 * until enough is deleted. */
int store_set_store_budget(topos_store *st, int64_t bytes, topos_error *err);

/* ------------------------------------------------------------------ specs */

/* Stores len bytes (bytes may be NULL when len is 0) and writes their id to
 * id_out.  Idempotent: the same bytes again give the same id, add no row
 * and keep the first put's created time (and rewrite the stored bytes if
 * they had been corrupted); every put marks the spec used.  Applies the
 * spec budget (store_set_spec_budget) and the store budget.  Durable once
 * it returns TOPOS_OK. */
int store_put_spec(topos_store *st, const void *bytes, size_t len,
                   char id_out[65], topos_error *err);
/* The spec's bytes, re-hashed and checked against the id on every read.
 * *bytes is new (free()); on error *bytes is NULL and *len 0. */
int store_get_spec(topos_store *st, const char *id, uint8_t **bytes,
                   size_t *len, topos_error *err);
/* Sets *present (without reading or verifying the bytes). */
int store_has_spec(topos_store *st, const char *id, bool *present,
                   topos_error *err);
/* Removes the spec; an unknown id is TOPOS_ERR_NOT_FOUND. */
/* A stored spec's size in bytes, without reading it; NOT_FOUND when
 * there is none. */
int store_stat_spec(topos_store *st, const char *id, int64_t *size,
                    topos_error *err);
int store_delete_spec(topos_store *st, const char *id, topos_error *err);
/* At most `limit` specs, newest first (by order of first put), skipping
 * the first `offset`.  *out is new (free(); NULL when *n is 0). */
int store_list_specs(topos_store *st, int64_t offset, int limit,
                     store_spec_info **out, int *n, topos_error *err);
/* Counts and sizes (one consistent snapshot). */
int store_stats(topos_store *st, store_stats_info *out, topos_error *err);

/* ------------------------------------------------------------------ blobs */

/* Stores a blob (a parameter set uploaded once), evicting least recently
 * used blobs until it fits under the cap.  A blob larger than the cap, or
 * than SQLite's largest value, is TOPOS_ERR_MEMORY and evicts nothing.
 * Putting a stored blob again only marks it used.  Writes the id. */
int store_put_blob(topos_store *st, const void *bytes, size_t len,
                   char id_out[65], topos_error *err);
/* The blob's bytes, verified like a spec's, and marks it used.  *bytes is
 * new (free()); on error *bytes is NULL and *len 0. */
int store_get_blob(topos_store *st, const char *id, uint8_t **bytes,
                   size_t *len, topos_error *err);
/* The blob's size, without reading it or marking it used. */
int store_stat_blob(topos_store *st, const char *id, int64_t *size,
                    topos_error *err);
/* Removes the blob; an unknown id is TOPOS_ERR_NOT_FOUND. */
int store_delete_blob(topos_store *st, const char *id, topos_error *err);

/* -------------------------------------------------------------- owners */

/* Who owns what (docs/store.md, "Ownership"): a spec or blob belongs to
 * every tenant that put it.  The bytes are stored once (content
 * addressing stays a dedup); ownership is a row per (id, tenant).  Rows
 * put without a tenant (and every row stored before schema version 4)
 * belong to no one.  Deleting a spec or blob, by any path, drops its
 * owners.  `tenant` NULL or "" is no tenant; otherwise it must be a valid
 * tenant name (TOPOS_ERR_ARGUMENT), existing or not. */

/* store_put_spec / store_put_blob for a tenant: the same, and the tenant
 * owns the id afterwards (whether the bytes were new or not), in the
 * put's transaction.  With a tenant, retention and eviction only drop
 * specs and blobs no other tenant owns (no owner, or this one alone); a
 * blob that cannot be made to fit that way is TOPOS_ERR_MEMORY ("blob cap
 * full: ...") and nothing changes.  No tenant: exactly the plain calls. */
int store_put_spec_as(topos_store *st, const char *tenant, const void *bytes,
                      size_t len, char id_out[65], topos_error *err);
int store_put_blob_as(topos_store *st, const char *tenant, const void *bytes,
                      size_t len, char id_out[65], topos_error *err);
/* Records that tenant owns blob id, stored or not yet (the daemon's early
 * acknowledgement records a second uploader before the writer commits the
 * bytes).  Idempotent. */
int store_blob_own(topos_store *st, const char *id, const char *tenant,
                   topos_error *err);
/* Whether tenant owns the spec / blob: an ownership row (whether the
 * bytes are stored is store_has_spec's / store_stat_blob's question). */
int store_spec_owned(topos_store *st, const char *id, const char *tenant,
                     bool *owned, topos_error *err);
int store_blob_owned(topos_store *st, const char *id, const char *tenant,
                     bool *owned, topos_error *err);
/* store_list_specs limited to the specs tenant owns (NULL or "": all). */
int store_list_specs_of(topos_store *st, const char *tenant, int64_t offset,
                        int limit, store_spec_info **out, int *n,
                        topos_error *err);

/* What one tenant owns (a shared spec or blob counts for each owner). */
typedef struct store_usage {
  int64_t spec_count, spec_bytes;
  int64_t blob_count, blob_bytes;
} store_usage;
/* One consistent snapshot of tenant's usage (tenant required). */
int store_tenant_usage(topos_store *st, const char *tenant, store_usage *out,
                       topos_error *err);

/* ------------------------------------------------------- tenants, tokens */

/* Who may call a shared daemon (docs/store.md, docs/operations.md).  A
 * tenant is a name (1..64 of [a-z0-9_-]) with an admin flag; a token
 * belongs to one tenant.  The store keeps a token's SHA-256 (of the whole
 * secret text), never the secret: store_token_create hands the secret out
 * once.  A token id (16 hex digits, random, unrelated to the secret)
 * names it for listing and revocation. */
#define STORE_TENANT_NAME_MAX 64
#define STORE_TOKEN_ID_LEN 16
/* "tps_" and 64 hex digits (32 random bytes). */
#define STORE_TOKEN_SECRET_LEN 68

typedef struct store_tenant_info {
  char name[STORE_TENANT_NAME_MAX + 1];
  int64_t created_ms;
  bool admin;
  int64_t live_tokens; /* tokens not revoked */
} store_tenant_info;

typedef struct store_token_info {
  char id[STORE_TOKEN_ID_LEN + 1];
  char tenant[STORE_TENANT_NAME_MAX + 1];
  int64_t created_ms;
  int64_t revoked_ms; /* 0 while the token is live */
  bool admin;         /* the tenant's flag (store_token_lookup) */
} store_token_info;

/* True when name is 1..64 characters of [a-z0-9_-]. */
bool store_tenant_name_valid(const char *name);
/* True when id is STORE_TOKEN_ID_LEN lowercase hex digits. */
bool store_token_id_valid(const char *id);
/* Adds a tenant.  A bad name is TOPOS_ERR_ARGUMENT, and so is a name that
 * is taken (the message says which). */
int store_tenant_add(topos_store *st, const char *name, bool admin,
                     topos_error *err);
/* Removes a tenant and deletes its tokens and its ownership of specs and
 * blobs (the bytes stay: what no one owns any more is visible only
 * without auth and is the first any tenant's put may evict), in one
 * transaction; unknown: TOPOS_ERR_NOT_FOUND. */
int store_tenant_remove(topos_store *st, const char *name, topos_error *err);
/* Every tenant, by name.  *out is new (free(); NULL when *n is 0). */
int store_tenant_list(topos_store *st, store_tenant_info **out, int *n,
                      topos_error *err);
/* How many tenants there are. */
int store_tenant_count(topos_store *st, int64_t *n, topos_error *err);
/* One tenant, as store_tenant_list lists it (unknown:
 * TOPOS_ERR_NOT_FOUND). */
int store_tenant_get(topos_store *st, const char *name, store_tenant_info *out,
                     topos_error *err);
/* A new token for tenant (unknown: TOPOS_ERR_NOT_FOUND): writes its id and
 * its secret ("tps_" + 64 hex digits from the system's random source).
 * Only the secret's SHA-256 is stored; the caller shows the secret once
 * and forgets it. */
int store_token_create(topos_store *st, const char *tenant,
                       char id_out[STORE_TOKEN_ID_LEN + 1],
                       char secret_out[STORE_TOKEN_SECRET_LEN + 1],
                       topos_error *err);
/* The tenant's tokens, newest first, revoked ones included.  Unknown
 * tenant: TOPOS_ERR_NOT_FOUND.  *out is new (free(); NULL when *n is 0). */
int store_token_list(topos_store *st, const char *tenant,
                     store_token_info **out, int *n, topos_error *err);
/* Revokes a token by id (idempotent: the first revocation's time stays).
 * Unknown id: TOPOS_ERR_NOT_FOUND. */
int store_token_revoke(topos_store *st, const char *id, topos_error *err);
/* One token by id, revoked or not, with its tenant's admin flag (a
 * malformed id: TOPOS_ERR_ARGUMENT; unknown: TOPOS_ERR_NOT_FOUND). */
int store_token_get(topos_store *st, const char *id, store_token_info *out,
                    topos_error *err);
/* The token whose secret is `secret` (hashed here; one indexed read, no
 * write, no transaction held), revoked or not: the caller decides.  An
 * unknown secret is TOPOS_ERR_NOT_FOUND. */
int store_token_lookup(topos_store *st, const char *secret,
                       store_token_info *out, topos_error *err);

/* ---------------------------------------------------------------- quotas */

/* A tenant's quotas (docs/operations.md, "Quotas"); STORE_QUOTA_NONE in a
 * field means unlimited.  rate_per_s and burst are the token bucket of the
 * request rate: both set or both none. */
#define STORE_QUOTA_NONE (-1)
typedef struct store_quota {
  int64_t stored_bytes;   /* bytes of specs and blobs the tenant owns */
  int64_t inflight;       /* calls admitted and not yet answered */
  double rate_per_s;      /* refill of the bucket, > 0 (or NONE) */
  int64_t burst;          /* the bucket's capacity, >= 1 (or NONE) */
  int64_t nodes_per_spec; /* nodes of one recorded spec */
  int64_t run_ms;         /* the cap on a call's deadline, >= 1 */
  int64_t run_bytes;      /* a run's peak bytes (the admission bound) */
  int64_t device_bytes;   /* a run's device bytes (its largest task) */
  /* Not a limit: the tenant's share of the workers under contention
   * (docs/operations.md, "Fair scheduling"), 1..STORE_WEIGHT_MAX; NONE
   * is the default, 1.  Not counted in store_quota_get's *any. */
  int64_t weight;
} store_quota;
#define STORE_WEIGHT_MAX 1000
/* Which fields store_quota_set changes. */
enum {
  STORE_QUOTA_STORED_BYTES = 1 << 0,
  STORE_QUOTA_INFLIGHT = 1 << 1,
  STORE_QUOTA_RATE = 1 << 2, /* rate_per_s and burst together */
  STORE_QUOTA_NODES = 1 << 3,
  STORE_QUOTA_RUN_MS = 1 << 4,
  STORE_QUOTA_RUN_BYTES = 1 << 5,
  STORE_QUOTA_WEIGHT = 1 << 6,
  STORE_QUOTA_DEVICE_BYTES = 1 << 7,
};
/* Every field STORE_QUOTA_NONE. */
store_quota store_quota_unlimited(void);
/* Whether the fields of `q` named in `mask` may be stored: a count
 * (stored_bytes, inflight, nodes_per_spec, run_bytes, device_bytes) >= 0 or
 * STORE_QUOTA_NONE; run_ms >= 1 or NONE; weight 1..STORE_WEIGHT_MAX or
 * NONE; rate_per_s (> 0, at most 1e9) and burst (>= 1) both set, or both
 * NONE.  TOPOS_ERR_ARGUMENT with a message naming the field otherwise.
 * store_quota_set applies it; the CLI and the daemon's AdminQuotaSet ask
 * it first, so both refuse the same values with the same words. */
int store_quota_check(const store_quota *q, unsigned mask, topos_error *err);
/* Sets the fields of `q` named in `mask` for tenant (unknown tenant:
 * TOPOS_ERR_NOT_FOUND; a value out of range: TOPOS_ERR_ARGUMENT), leaving
 * the others as they are, in one transaction. */
int store_quota_set(topos_store *st, const char *tenant, const store_quota *q,
                    unsigned mask, topos_error *err);
/* The quotas as one line, "stored_bytes=N inflight=none rate=R burst=B
 * nodes_per_spec=N run_ms=N run_bytes=N device_bytes=N weight=W" (none
 * for a quota not
 * set; weight 1 when not set): what `topos quota show` prints and the
 * audit lines of a change carry, from the store file or the daemon. */
void store_quota_format(const store_quota *q, char *out, size_t len);
/* Tenant's quotas (one indexed read); a tenant without any, or unknown,
 * gets store_quota_unlimited().  *any says whether one limit is set (the
 * weight is not a limit). */
int store_quota_get(topos_store *st, const char *tenant, store_quota *out,
                    bool *any, topos_error *err);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_STORE_H */
