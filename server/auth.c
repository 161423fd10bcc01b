/*
 * auth.c - bearer tokens against the store's tenants (auth.h).
 *
 * Why no cache: a lookup is one prepared, indexed SELECT on a handle of
 * its own (WAL readers never wait for writers), measured at a few
 * microseconds (docs/operations.md), against a round trip of 55 us or
 * more; a cache would need invalidation across processes (the CLI revokes
 * on the file while the daemon runs) for no visible gain.  The check every
 * call without a token makes (is there any tenant?) keeps its statement
 * prepared on a read-only connection of its own: on the daemon's Step
 * path the per-call prepare was most of the check's cost.
 */
#include "auth.h"

#include <grpc/status.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The longest authorization value looked at; a longer one is malformed. */
#define AUTH_VALUE_MAX 256

/* Peers remembered for throttling (the least recently failed is
 * replaced when the table is full). */
#define AUTH_PEERS 256
#define AUTH_WINDOW_MS 60000
#define AUTH_BLOCK_MAX_MS 60000

typedef struct peer_slot {
  char host[64];     /* "" when free */
  int64_t window_ms; /* start of the current minute's count */
  int failures;      /* in that minute */
  int64_t last_ms;   /* the latest failure */
  int64_t blocked_until_ms;
  int64_t block_ms; /* the latest block's length (doubles) */
} peer_slot;

struct auth {
  topos_store *store;
  bool always;
  int fail_limit;
  pthread_mutex_t peers_lock;
  peer_slot peers[AUTH_PEERS];
  /* Whether any tenant exists is asked on every call without a token: a
   * read-only connection of the checker's own with the statement
   * prepared once (store_tenant_count prepares it on each call, several
   * times the cost).  Still a read of the file on every call, so a tenant
   * the CLI adds counts from the next call.  NULL when it could not be
   * opened: the store's count is used. */
  pthread_mutex_t any_lock;
  sqlite3 *any_db;
  sqlite3_stmt *any_stmt;
};

/* The tenant check's own connection; leaves it NULL on any failure. */
static void any_open(auth *a, const char *store_path) {
  sqlite3 *db = NULL;
  sqlite3_stmt *stmt = NULL;
  if (sqlite3_open_v2(store_path, &db,
                      SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK ||
      sqlite3_busy_timeout(db, 10000) != SQLITE_OK ||
      sqlite3_prepare_v3(db, "SELECT EXISTS (SELECT 1 FROM tenants)", -1,
                         SQLITE_PREPARE_PERSISTENT, &stmt, NULL) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return;
  }
  a->any_db = db;
  a->any_stmt = stmt;
}

/* 1 when the store holds a tenant, 0 when not, -1 when the own
 * connection is missing or failed (the caller asks the store). */
static int any_tenant(auth *a) {
  if (a->any_stmt == NULL) return -1;
  pthread_mutex_lock(&a->any_lock);
  int any = -1;
  if (sqlite3_step(a->any_stmt) == SQLITE_ROW)
    any = sqlite3_column_int(a->any_stmt, 0) != 0;
  sqlite3_reset(a->any_stmt); /* ends the read transaction */
  pthread_mutex_unlock(&a->any_lock);
  return any;
}

auth *auth_open(const char *store_path, bool always, topos_error *err) {
  auth *a = calloc(1, sizeof *a);
  if (a == NULL) {
    if (err) {
      err->code = TOPOS_ERR_MEMORY;
      snprintf(err->message, sizeof err->message, "auth: out of memory");
    }
    return NULL;
  }
  a->store = store_open(store_path, err);
  if (a->store == NULL) {
    free(a);
    return NULL;
  }
  a->always = always;
  a->fail_limit = 20;
  pthread_mutex_init(&a->peers_lock, NULL);
  pthread_mutex_init(&a->any_lock, NULL);
  any_open(a, store_path);
  return a;
}

void auth_set_fail_limit(auth *a, int limit) {
  if (a) a->fail_limit = limit < 0 ? 0 : limit;
}

/* The address of a peer string, without transport prefix or port. */
static void peer_host(const char *peer, char *out, size_t len) {
  out[0] = '\0';
  if (peer == NULL) return;
  /* gRPC's "ipv4:" and "ipv6:", the gateway's "http:" and "https:" */
  if (strncmp(peer, "ipv4:", 5) == 0 || strncmp(peer, "ipv6:", 5) == 0 ||
      strncmp(peer, "http:", 5) == 0)
    peer += 5;
  else if (strncmp(peer, "https:", 6) == 0)
    peer += 6;
  snprintf(out, len, "%s", peer);
  char *colon = strrchr(out, ':');
  /* "HOST:PORT" or "[V6]:PORT"; a bare IPv6 address keeps its colons */
  if (colon != NULL &&
      (out[0] == '[' ? colon > strchr(out, ']') : strchr(out, ':') == colon))
    *colon = '\0';
}

/* The slot of host (locked), made when missing. */
static peer_slot *peer_slot_of(auth *a, const char *host, bool make) {
  peer_slot *oldest = &a->peers[0];
  for (int i = 0; i < AUTH_PEERS; i++) {
    peer_slot *p = &a->peers[i];
    if (p->host[0] != '\0' && strcmp(p->host, host) == 0) return p;
    if (p->host[0] == '\0' || p->last_ms < oldest->last_ms) oldest = p;
  }
  if (!make) return NULL;
  memset(oldest, 0, sizeof *oldest);
  snprintf(oldest->host, sizeof oldest->host, "%s", host);
  return oldest;
}

bool auth_peer_throttled(auth *a, const char *peer, int64_t now_ms,
                         auth_result *out) {
  if (a == NULL || a->fail_limit <= 0) return false;
  char host[64];
  peer_host(peer, host, sizeof host);
  pthread_mutex_lock(&a->peers_lock);
  peer_slot *p = peer_slot_of(a, host, false);
  int64_t left = p != NULL ? p->blocked_until_ms - now_ms : 0;
  pthread_mutex_unlock(&a->peers_lock);
  if (left <= 0) return false;
  memset(out, 0, sizeof *out);
  out->status = GRPC_STATUS_RESOURCE_EXHAUSTED;
  snprintf(out->reason, sizeof out->reason, "throttled");
  snprintf(out->message, sizeof out->message,
           "too many failed authentications from %s: calls from it are "
           "refused for %lld ms more (retry after that with a valid token)",
           host, (long long)left);
  return true;
}

void auth_peer_failed(auth *a, const char *peer, int64_t now_ms) {
  if (a == NULL || a->fail_limit <= 0) return;
  char host[64];
  peer_host(peer, host, sizeof host);
  pthread_mutex_lock(&a->peers_lock);
  peer_slot *p = peer_slot_of(a, host, true);
  if (now_ms - p->window_ms >= AUTH_WINDOW_MS) {
    p->window_ms = now_ms;
    p->failures = 0;
  }
  p->failures++;
  p->last_ms = now_ms;
  if (p->failures >= a->fail_limit) {
    /* Blocked: 1 s, doubling with each block inside a quiet period. */
    bool recent = now_ms - p->blocked_until_ms < AUTH_WINDOW_MS;
    p->block_ms = recent && p->block_ms > 0 ? p->block_ms * 2 : 1000;
    if (p->block_ms > AUTH_BLOCK_MAX_MS) p->block_ms = AUTH_BLOCK_MAX_MS;
    p->blocked_until_ms = now_ms + p->block_ms;
    p->failures = 0;
    p->window_ms = now_ms;
  }
  pthread_mutex_unlock(&a->peers_lock);
}

void auth_close(auth *a) {
  if (a == NULL) return;
  pthread_mutex_destroy(&a->peers_lock);
  sqlite3_finalize(a->any_stmt);
  sqlite3_close(a->any_db);
  pthread_mutex_destroy(&a->any_lock);
  store_close(a->store);
  free(a);
}

int auth_quota(auth *a, const char *tenant, store_quota *q, bool *any,
               topos_error *err) {
  return store_quota_get(a->store, tenant, q, any, err);
}

bool auth_host_is_loopback(const char *host) {
  if (host == NULL) return false;
  if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
      strcmp(host, "[::1]") == 0)
    return true;
  /* 127.0.0.0/8, written as a dotted quad. */
  unsigned a, b, c, d;
  char tail;
  return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 &&
         a == 127 && b < 256 && c < 256 && d < 256;
}

static void refuse(auth_result *out, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse(auth_result *out, const char *reason, const char *fmt, ...) {
  out->status = GRPC_STATUS_UNAUTHENTICATED;
  snprintf(out->reason, sizeof out->reason, "%s", reason);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->message, sizeof out->message, fmt, ap);
  va_end(ap);
}

/* Whether auth is on now; false with out filled when the store failed. */
static bool auth_required(auth *a, auth_result *out, bool *required) {
  if (a->always) {
    *required = true;
    return true;
  }
  int any = any_tenant(a);
  if (any >= 0) {
    *required = any != 0;
    return true;
  }
  int64_t n = 0;
  topos_error err = {0};
  if (store_tenant_count(a->store, &n, &err) != TOPOS_OK) {
    out->status = GRPC_STATUS_UNAVAILABLE;
    snprintf(out->reason, sizeof out->reason, "store");
    snprintf(out->message, sizeof out->message,
             "cannot check the caller's token: %.400s", err.message);
    return false;
  }
  *required = n > 0;
  return true;
}

void auth_check(auth *a, const char *method, const char *value, size_t len,
                auth_result *out) {
  memset(out, 0, sizeof *out);
  out->status = GRPC_STATUS_OK;
  /* "Bearer TOKEN": the scheme is case-insensitive (RFC 7235), the token
   * printable ASCII without spaces. */
  char text[AUTH_VALUE_MAX + 1];
  const char *secret = NULL;
  bool malformed = false;
  if (value != NULL) {
    malformed = len > AUTH_VALUE_MAX || len < 8;
    if (!malformed) {
      memcpy(text, value, len);
      text[len] = '\0';
      malformed = strncasecmp(text, "bearer ", 7) != 0;
    }
    if (!malformed) {
      char *t = text + 7;
      while (*t == ' ') t++;
      char *end = t + strlen(t);
      while (end > t && end[-1] == ' ') *--end = '\0';
      for (char *p = t; *p && !malformed; p++)
        malformed = *p <= ' ' || *p > '~';
      malformed = malformed || *t == '\0';
      secret = t;
    }
  }
  if (secret != NULL && !malformed) {
    store_token_info info;
    topos_error err = {0};
    int rc = store_token_lookup(a->store, secret, &info, &err);
    if (rc == TOPOS_OK && info.revoked_ms == 0) {
      snprintf(out->tenant, sizeof out->tenant, "%s", info.tenant);
      snprintf(out->token_id, sizeof out->token_id, "%s", info.id);
      out->admin = info.admin;
      return;
    }
    if (rc == TOPOS_OK) {
      snprintf(out->token_id, sizeof out->token_id, "%s", info.id);
      snprintf(out->tenant, sizeof out->tenant, "%s", info.tenant);
      refuse(out, "revoked",
             "%s: token %s (tenant %s) was revoked; ask the operator for a "
             "new one (topos token create)",
             method, info.id, info.tenant);
      out->tenant[0] = '\0';
      return;
    }
    if (rc != TOPOS_ERR_NOT_FOUND) {
      out->status = GRPC_STATUS_UNAVAILABLE;
      snprintf(out->reason, sizeof out->reason, "store");
      snprintf(out->message, sizeof out->message,
               "%s: cannot check the caller's token: %.400s", method,
               err.message);
      return;
    }
  }
  bool required = false;
  if (!auth_required(a, out, &required) || !required) return;
  if (value == NULL)
    refuse(out, "missing",
           "%s: this daemon requires a token: send the metadata "
           "'authorization: Bearer TOKEN' (topos --token or TOPOS_TOKEN; the "
           "operator creates one with 'topos token create TENANT')",
           method);
  else if (malformed)
    refuse(out, "malformed",
           "%s: the authorization value is not 'Bearer TOKEN'", method);
  else
    refuse(out, "unknown",
           "%s: the token is not one this daemon knows (mistyped, for another "
           "daemon, or its tenant was removed)",
           method);
}
