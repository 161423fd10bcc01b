/*
 * auth.h - who is calling: the bearer token of a call, checked against
 * the tenants and tokens in the store (docs/operations.md).
 *
 * Auth is on when the store holds at least one tenant, or always when the
 * daemon serves a non-loopback address (so removing the last tenant never
 * opens a public daemon).  When it is on, every call but the health probes
 * must carry "authorization: Bearer TOKEN" (gRPC metadata or the HTTP
 * header) naming a live token.  The check is one indexed read on the
 * checker's own store handle (store_token_lookup), so a token revoked by
 * the CLI is refused on the very next call: nothing is cached.
 */
#ifndef TOPOSD_AUTH_H
#define TOPOSD_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "store.h"

typedef struct auth auth;

/* What a check found. */
typedef struct auth_result {
  int status; /* GRPC_STATUS_OK, UNAUTHENTICATED, or UNAVAILABLE (store) */
  char tenant[STORE_TENANT_NAME_MAX + 1]; /* "" when auth is off */
  bool admin;
  char token_id[STORE_TOKEN_ID_LEN + 1]; /* "" when none */
  char reason[32];                       /* for the audit line: "missing" ... */
  char message[512]; /* the status message, never the secret */
} auth_result;

/* A checker with its own handle on the store at path.  `always`: auth is
 * on even without tenants (a non-loopback address).  NULL with err. */
auth *auth_open(const char *store_path, bool always, topos_error *err);
/* NULL is a no-op. */
void auth_close(auth *a);
/* Checks the authorization value (value/len, not NUL-terminated; NULL when
 * the call carries none) of a call of `method`.  Thread-safe. */
void auth_check(auth *a, const char *method, const char *value, size_t len,
                auth_result *out);
/* tenant's quotas (store_quota_get on the checker's handle: one indexed
 * read), for the quotas of a call that passed auth_check.  Thread-safe. */
int auth_quota(auth *a, const char *tenant, store_quota *q, bool *any,
               topos_error *err);
/* Repeated failures from one peer address: after `limit` failed checks
 * (UNAUTHENTICATED) within a minute, every call from that address is
 * refused for a while - 1 s, doubling with each further block up to 60
 * s - before its token is even looked at.  0 turns it off; the default
 * is 20. */
void auth_set_fail_limit(auth *a, int limit);
/* Whether calls from peer (gRPC's "ipv4:HOST:PORT" / "ipv6:[HOST]:PORT",
 * or "HOST:PORT") are being refused at now_ms: true with out filled
 * (RESOURCE_EXHAUSTED, reason "throttled", the retry time). */
bool auth_peer_throttled(auth *a, const char *peer, int64_t now_ms,
                         auth_result *out);
/* Counts one failed check from peer at now_ms (blocks it at the limit). */
void auth_peer_failed(auth *a, const char *peer, int64_t now_ms);
/* Whether the daemon may serve `host` (a --listen or --http host) without
 * tenants: 127.0.0.0/8, ::1 and "localhost". */
bool auth_host_is_loopback(const char *host);

#endif /* TOPOSD_AUTH_H */
