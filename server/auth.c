/*
 * auth.c - bearer tokens against the store's tenants (auth.h).
 *
 * Why no cache: a lookup is one prepared, indexed SELECT on a handle of
 * its own (WAL readers never wait for writers), measured at a few
 * microseconds (docs/operations.md), against a round trip of 55 us or
 * more; a cache would need invalidation across processes (the CLI revokes
 * on the file while the daemon runs) for no visible gain.
 */
#include "auth.h"

#include <grpc/status.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The longest authorization value looked at; a longer one is malformed. */
#define AUTH_VALUE_MAX 256

struct auth {
  topos_store *store;
  bool always;
};

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
  return a;
}

void auth_close(auth *a) {
  if (a == NULL) return;
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
