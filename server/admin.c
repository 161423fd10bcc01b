/*
 * admin.c - the Admin* RPCs (admin.h): tenants, tokens and quotas through
 * the daemon, on the daemon's own store handle, with the store functions
 * the CLI uses on the file (store.h), so both refuse the same things with
 * the same words.
 *
 * Decisions (docs/operations.md, "Tenants and tokens"):
 *  - A caller with a tenant must be an admin: PERMISSION_DENIED otherwise,
 *    before the request is even read.  A caller without one (auth off: the
 *    store has no tenants and the daemon serves loopback only) may
 *    administer, as it may edit the store file.  Since the first tenant
 *    turns auth on, that first AdminTenantAdd must add an admin with a
 *    token in the same call (admin, with_token): FAILED_PRECONDITION
 *    otherwise, so no one is locked out of the daemon's administration.
 *  - No change through the daemon leaves the store without an admin tenant
 *    holding a live token: removing the tenant that holds the last ones, or
 *    revoking the last one, is FAILED_PRECONDITION (the store file can
 *    still do it).  An admin may remove its own tenant or revoke its own
 *    token while another admin token lives; its token then stops working
 *    from the next call.  The checks and the change run under one lock, so
 *    two admins cannot each remove the other; the CLI on the file is not
 *    under it (SQLite serialises the writes, not the checks).
 *  - A taken name is ALREADY_EXISTS, an unknown tenant or token NOT_FOUND,
 *    a malformed name, id or quota INVALID_ARGUMENT (the store's message).
 *  - Every call writes one audit line (event=audit): the action, what it
 *    names, the caller's tenant ("-" without auth), its peer, the status.
 *    Secrets are never logged; they are in the creating reply only.
 */
#include "admin.h"

#include <grpc/status.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rooms.h"

/* The daemon's admin changes, one at a time: the last-admin checks read
 * the store and then write it. */
static pthread_mutex_t admin_lock = PTHREAD_MUTEX_INITIALIZER;

/* One admin call: what its audit line says. */
typedef struct admin_call {
  call_ctx *cx;
  const char *method; /* "AdminTenantAdd" */
  const char *action; /* "tenant.add" */
  char fields[640];   /* "tenant=alice admin=1": validated values only */
} admin_call;

static bool auth_off(const call_ctx *cx) {
  return cx->tenant == NULL || cx->tenant[0] == '\0';
}

static void add_field(admin_call *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void add_field(admin_call *a, const char *fmt, ...) {
  size_t len = strlen(a->fields);
  if (len + 1 >= sizeof a->fields) return;
  if (len > 0) a->fields[len++] = ' ';
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->fields + len, sizeof a->fields - len, fmt, ap);
  va_end(ap);
}

/* The audit line of the call, whatever its outcome. */
static void admin_end(admin_call *a) {
  call_ctx *cx = a->cx;
  log_event_at(LOG_WARN, "audit", "action=%s%s%s by=%s peer=%s status=%s",
               a->action, a->fields[0] ? " " : "", a->fields,
               auth_off(cx) ? "-" : cx->tenant,
               cx->peer && cx->peer[0] ? cx->peer : "-",
               wire_grpc_status_name(cx->status));
}

/* What a request names, for the audit line (valid names and ids only). */
typedef void (*describe_fn)(admin_call *a, const ProtobufCMessage *m);

/* Starts an admin call: the request (unpacked into the call's arena, its
 * fields named in the audit line by `describe`) when the caller may
 * administer; otherwise NULL, with the call failed (PERMISSION_DENIED
 * first of all, or the request's own error) and audited. */
static void *admin_begin(call_ctx *cx, admin_call *a, const char *method,
                         const char *action,
                         const ProtobufCMessageDescriptor *desc,
                         describe_fn describe, bool optional) {
  memset(a, 0, sizeof *a);
  a->cx = cx;
  a->method = method;
  a->action = action;
  if (!auth_off(cx) && !cx->admin) {
    /* What was asked, for the audit line only: describe writes only names
     * and ids of the valid forms, so the bytes need no other check. */
    ProtobufCMessage *m =
        describe && cx->has_message
            ? protobuf_c_message_unpack(desc, cx->alloc, cx->in_len, cx->in)
            : NULL;
    if (m != NULL) describe(a, m);
    call_fail(cx, GRPC_STATUS_PERMISSION_DENIED, 0,
              "%s: tenant %s is not an admin; administration needs an admin "
              "tenant's token (the operator makes one: topos tenant add NAME "
              "--admin --with-token)",
              method, cx->tenant);
    admin_end(a);
    return NULL;
  }
  ProtobufCMessage *m = call_unpack(cx, desc, method, optional);
  if (m == NULL) {
    admin_end(a);
    return NULL;
  }
  if (describe) describe(a, m);
  return m;
}

static void describe_tenant_add(admin_call *a, const ProtobufCMessage *m) {
  const Topos__V1__AdminTenantAddRequest *r = (const void *)m;
  if (store_tenant_name_valid(r->name))
    add_field(a, "tenant=%s admin=%d", r->name, r->admin ? 1 : 0);
}

static void describe_tenant_remove(admin_call *a, const ProtobufCMessage *m) {
  const Topos__V1__AdminTenantRemoveRequest *r = (const void *)m;
  if (store_tenant_name_valid(r->name)) add_field(a, "tenant=%s", r->name);
}

/* The requests that name a tenant in their `string tenant = 1`. */
static void describe_tenant(admin_call *a, const ProtobufCMessage *m) {
  const char *tenant = NULL;
  if (m->descriptor == &topos__v1__admin_token_create_request__descriptor)
    tenant =
        ((const Topos__V1__AdminTokenCreateRequest *)(const void *)m)->tenant;
  else if (m->descriptor == &topos__v1__admin_token_list_request__descriptor)
    tenant =
        ((const Topos__V1__AdminTokenListRequest *)(const void *)m)->tenant;
  else if (m->descriptor == &topos__v1__admin_quota_set_request__descriptor)
    tenant = ((const Topos__V1__AdminQuotaSetRequest *)(const void *)m)->tenant;
  else if (m->descriptor == &topos__v1__admin_quota_show_request__descriptor)
    tenant =
        ((const Topos__V1__AdminQuotaShowRequest *)(const void *)m)->tenant;
  if (store_tenant_name_valid(tenant)) add_field(a, "tenant=%s", tenant);
}

static void describe_token_revoke(admin_call *a, const ProtobufCMessage *m) {
  const Topos__V1__AdminTokenRevokeRequest *r = (const void *)m;
  if (store_token_id_valid(r->id)) add_field(a, "token=%s", r->id);
}

/* A store error: its code picks the status (argument: INVALID_ARGUMENT,
 * not found: NOT_FOUND, io: UNAVAILABLE, ...), its message the text,
 * without the store's "store: " prefix. */
static const char *store_text(const topos_error *err) {
  const char *m = err->message[0] ? err->message : "the store failed";
  return strncmp(m, "store: ", 7) == 0 ? m + 7 : m;
}

static void admin_fail_store(admin_call *a, const topos_error *err) {
  call_fail(a->cx, wire_grpc_status_of(err->code), err->code, "%s: %s",
            a->method, store_text(err));
}

/* Sum of the live tokens of admin tenants, leaving out tenant `except`
 * (NULL: none).  False with the call failed when the store fails. */
static bool admin_live_tokens(admin_call *a, const char *except,
                              int64_t *count) {
  store_tenant_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  if (store_tenant_list(a->cx->d->store, &rows, &n, &err) != TOPOS_OK) {
    admin_fail_store(a, &err);
    return false;
  }
  *count = 0;
  for (int i = 0; i < n; i++)
    if (rows[i].admin && (except == NULL || strcmp(rows[i].name, except) != 0))
      *count += rows[i].live_tokens;
  free(rows);
  return true;
}

static void tenant_msg(Topos__V1__AdminTenant *m, const store_tenant_info *t) {
  topos__v1__admin_tenant__init(m);
  m->name = (char *)t->name;
  m->admin = t->admin;
  m->created_ms = t->created_ms;
  m->live_tokens = t->live_tokens;
}

static void token_msg(Topos__V1__AdminToken *m, const store_token_info *t) {
  topos__v1__admin_token__init(m);
  m->id = (char *)t->id;
  m->tenant = (char *)t->tenant;
  m->created_ms = t->created_ms;
  m->revoked_ms = t->revoked_ms;
}

static void quota_msg(Topos__V1__AdminQuota *m, const store_quota *q) {
  topos__v1__admin_quota__init(m);
  m->stored_bytes = q->stored_bytes;
  m->inflight = q->inflight;
  m->rate_per_s = q->rate_per_s > 0 ? q->rate_per_s : STORE_QUOTA_NONE;
  m->burst = q->burst;
  m->nodes_per_spec = q->nodes_per_spec;
  m->run_ms = q->run_ms;
  m->run_bytes = q->run_bytes;
  m->weight = q->weight;
  m->device_bytes = q->device_bytes;
}

/* -------------------------------------------------------------- tenants */

void handle_admin_tenant_add(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminTenantAddRequest *req =
      admin_begin(cx, &a, "AdminTenantAdd", "tenant.add",
                  &topos__v1__admin_tenant_add_request__descriptor,
                  describe_tenant_add, false);
  if (req == NULL) return;
  const char *name = req->name;
  topos_store *st = cx->d->store;
  topos_error err = {0};
  store_tenant_info t;
  char id[STORE_TOKEN_ID_LEN + 1] = "", secret[STORE_TOKEN_SECRET_LEN + 1] = "";
  store_token_info tok;
  memset(&tok, 0, sizeof tok);
  pthread_mutex_lock(&admin_lock);
  int64_t tenants = 0;
  if (auth_off(cx) && store_tenant_count(st, &tenants, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  } else if (auth_off(cx) && tenants == 0 && !(req->admin && req->with_token)) {
    /* The first tenant turns auth on: without an admin token in hand the
     * caller could not administer the daemon any more. */
    call_fail(cx, GRPC_STATUS_FAILED_PRECONDITION, 0,
              "AdminTenantAdd: this daemon has no tenants yet, and the first "
              "one turns its tokens on from the next call: add an admin "
              "tenant with its token in the same call (admin and "
              "with_token; topos tenant add NAME --admin --with-token) and "
              "use that token from then on, or add tenants on the store "
              "file (topos --store PATH tenant add ...)");
  } else if (store_tenant_get(st, name, &t, &err) == TOPOS_OK) {
    call_fail(cx, GRPC_STATUS_ALREADY_EXISTS, 0,
              "AdminTenantAdd: tenant %s already exists", name);
  } else if (err.code != TOPOS_ERR_NOT_FOUND) {
    admin_fail_store(&a, &err);
  } else if (store_tenant_add(st, name, req->admin, &err) != TOPOS_OK) {
    /* The name was checked, so an argument error here is a name taken
     * meanwhile (the CLI on the file). */
    if (err.code == TOPOS_ERR_ARGUMENT)
      call_fail(cx, GRPC_STATUS_ALREADY_EXISTS, 0,
                "AdminTenantAdd: tenant %s already exists", name);
    else
      admin_fail_store(&a, &err);
  } else if (req->with_token &&
             (store_token_create(st, name, id, secret, &err) != TOPOS_OK ||
              store_token_get(st, id, &tok, &err) != TOPOS_OK)) {
    call_fail(cx, wire_grpc_status_of(err.code), err.code,
              "AdminTenantAdd: tenant %s was added, but its token was not "
              "created (%s); create one with AdminTokenCreate",
              name, store_text(&err));
  } else if (store_tenant_get(st, name, &t, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  }
  pthread_mutex_unlock(&admin_lock);
  if (id[0] != '\0') add_field(&a, "token=%s", id);
  if (cx->status == WIRE_GRPC_OK) {
    Topos__V1__AdminTenantAddReply r = TOPOS__V1__ADMIN_TENANT_ADD_REPLY__INIT;
    Topos__V1__AdminTenant tm;
    Topos__V1__AdminToken km;
    tenant_msg(&tm, &t);
    r.tenant = &tm;
    if (req->with_token) {
      token_msg(&km, &tok);
      r.token = &km;
      r.secret = secret;
    }
    call_reply(cx, &r.base);
  }
  memset(secret, 0, sizeof secret);
  admin_end(&a);
}

void handle_admin_tenant_list(call_ctx *cx) {
  admin_call a;
  if (admin_begin(cx, &a, "AdminTenantList", "tenant.list",
                  &topos__v1__admin_tenant_list_request__descriptor, NULL,
                  true) == NULL)
    return;
  store_tenant_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  if (store_tenant_list(cx->d->store, &rows, &n, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
    admin_end(&a);
    return;
  }
  size_t k = n > 0 ? (size_t)n : 1;
  Topos__V1__AdminTenant *msgs = call_scratch(cx, k * sizeof *msgs);
  Topos__V1__AdminTenant **ptrs = call_scratch(cx, k * sizeof *ptrs);
  if (msgs != NULL && ptrs != NULL) {
    for (int i = 0; i < n; i++) {
      tenant_msg(&msgs[i], &rows[i]);
      ptrs[i] = &msgs[i];
    }
    Topos__V1__AdminTenantListReply r =
        TOPOS__V1__ADMIN_TENANT_LIST_REPLY__INIT;
    r.n_tenants = (size_t)n;
    r.tenants = ptrs;
    call_reply(cx, &r.base);
  }
  free(rows);
  add_field(&a, "tenants=%d", n);
  admin_end(&a);
}

void handle_admin_tenant_remove(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminTenantRemoveRequest *req =
      admin_begin(cx, &a, "AdminTenantRemove", "tenant.remove",
                  &topos__v1__admin_tenant_remove_request__descriptor,
                  describe_tenant_remove, false);
  if (req == NULL) return;
  const char *name = req->name;
  topos_store *st = cx->d->store;
  topos_error err = {0};
  store_tenant_info t;
  int64_t others = 0;
  pthread_mutex_lock(&admin_lock);
  if (store_tenant_get(st, name, &t, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  } else if (t.admin && t.live_tokens > 0 &&
             admin_live_tokens(&a, name, &others) && others == 0) {
    call_fail(cx, GRPC_STATUS_FAILED_PRECONDITION, 0,
              "AdminTenantRemove: tenant %s holds the last live admin "
              "tokens of this daemon; removing it would leave no one able "
              "to administer the daemon through it: create another admin "
              "tenant's token first (topos tenant add NAME --admin "
              "--with-token), or remove it on the store file (topos --store "
              "PATH tenant remove %s)",
              name, name);
  } else if (cx->status == WIRE_GRPC_OK &&
             store_tenant_remove(st, name, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  }
  pthread_mutex_unlock(&admin_lock);
  if (cx->status == WIRE_GRPC_OK) {
    Topos__V1__AdminTenantRemoveReply r =
        TOPOS__V1__ADMIN_TENANT_REMOVE_REPLY__INIT;
    Topos__V1__AdminTenant tm;
    tenant_msg(&tm, &t);
    r.tenant = &tm;
    call_reply(cx, &r.base);
  }
  admin_end(&a);
}

/* --------------------------------------------------------------- tokens */

void handle_admin_token_create(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminTokenCreateRequest *req =
      admin_begin(cx, &a, "AdminTokenCreate", "token.create",
                  &topos__v1__admin_token_create_request__descriptor,
                  describe_tenant, false);
  if (req == NULL) return;
  const char *tenant = req->tenant;
  topos_store *st = cx->d->store;
  topos_error err = {0};
  char id[STORE_TOKEN_ID_LEN + 1] = "", secret[STORE_TOKEN_SECRET_LEN + 1] = "";
  store_token_info tok;
  pthread_mutex_lock(&admin_lock);
  if (store_token_create(st, tenant, id, secret, &err) != TOPOS_OK ||
      store_token_get(st, id, &tok, &err) != TOPOS_OK)
    admin_fail_store(&a, &err);
  pthread_mutex_unlock(&admin_lock);
  if (id[0] != '\0') add_field(&a, "token=%s", id);
  if (cx->status == WIRE_GRPC_OK) {
    Topos__V1__AdminTokenCreateReply r =
        TOPOS__V1__ADMIN_TOKEN_CREATE_REPLY__INIT;
    Topos__V1__AdminToken km;
    token_msg(&km, &tok);
    r.token = &km;
    r.secret = secret;
    call_reply(cx, &r.base);
  }
  memset(secret, 0, sizeof secret);
  admin_end(&a);
}

void handle_admin_token_list(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminTokenListRequest *req = admin_begin(
      cx, &a, "AdminTokenList", "token.list",
      &topos__v1__admin_token_list_request__descriptor, describe_tenant, false);
  if (req == NULL) return;
  store_token_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  if (store_token_list(cx->d->store, req->tenant, &rows, &n, &err) !=
      TOPOS_OK) {
    admin_fail_store(&a, &err);
    admin_end(&a);
    return;
  }
  size_t k = n > 0 ? (size_t)n : 1;
  Topos__V1__AdminToken *msgs = call_scratch(cx, k * sizeof *msgs);
  Topos__V1__AdminToken **ptrs = call_scratch(cx, k * sizeof *ptrs);
  if (msgs != NULL && ptrs != NULL) {
    for (int i = 0; i < n; i++) {
      token_msg(&msgs[i], &rows[i]);
      ptrs[i] = &msgs[i];
    }
    Topos__V1__AdminTokenListReply r = TOPOS__V1__ADMIN_TOKEN_LIST_REPLY__INIT;
    r.n_tokens = (size_t)n;
    r.tokens = ptrs;
    call_reply(cx, &r.base);
  }
  free(rows);
  add_field(&a, "tokens=%d", n);
  admin_end(&a);
}

void handle_admin_token_revoke(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminTokenRevokeRequest *req =
      admin_begin(cx, &a, "AdminTokenRevoke", "token.revoke",
                  &topos__v1__admin_token_revoke_request__descriptor,
                  describe_token_revoke, false);
  if (req == NULL) return;
  topos_store *st = cx->d->store;
  topos_error err = {0};
  store_token_info tok;
  int64_t live = 0;
  pthread_mutex_lock(&admin_lock);
  /* store_token_get checks the id's form (INVALID_ARGUMENT). */
  if (store_token_get(st, req->id, &tok, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  } else {
    add_field(&a, "tenant=%s", tok.tenant);
    if (tok.revoked_ms == 0 && tok.admin &&
        admin_live_tokens(&a, NULL, &live) && live <= 1) {
      call_fail(cx, GRPC_STATUS_FAILED_PRECONDITION, 0,
                "AdminTokenRevoke: token %s (tenant %s) is the last live "
                "admin token of this daemon; revoking it would leave no one "
                "able to administer the daemon through it: create another "
                "admin token first (topos token create %s), or revoke it on "
                "the store file (topos --store PATH token revoke %s)",
                tok.id, tok.tenant, tok.tenant, tok.id);
    } else if (cx->status == WIRE_GRPC_OK &&
               (store_token_revoke(st, tok.id, &err) != TOPOS_OK ||
                store_token_get(st, req->id, &tok, &err) != TOPOS_OK)) {
      admin_fail_store(&a, &err);
    }
  }
  pthread_mutex_unlock(&admin_lock);
  if (cx->status == WIRE_GRPC_OK) {
    Topos__V1__AdminTokenRevokeReply r =
        TOPOS__V1__ADMIN_TOKEN_REVOKE_REPLY__INIT;
    Topos__V1__AdminToken km;
    token_msg(&km, &tok);
    r.token = &km;
    call_reply(cx, &r.base);
  }
  admin_end(&a);
}

/* --------------------------------------------------------------- quotas */

/* The reply of AdminQuotaSet and AdminQuotaShow: tenant's quotas now. */
static void quota_reply(call_ctx *cx, const char *tenant,
                        const store_quota *q) {
  Topos__V1__AdminQuotaReply r = TOPOS__V1__ADMIN_QUOTA_REPLY__INIT;
  Topos__V1__AdminQuota qm;
  quota_msg(&qm, q);
  r.tenant = (char *)tenant;
  r.quota = &qm;
  call_reply(cx, &r.base);
}

void handle_admin_quota_set(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminQuotaSetRequest *req = admin_begin(
      cx, &a, "AdminQuotaSet", "quota.set",
      &topos__v1__admin_quota_set_request__descriptor, describe_tenant, false);
  if (req == NULL) return;
  const char *tenant = req->tenant;
  /* The fields given, as `topos quota set` gives them. */
  store_quota q = store_quota_unlimited();
  unsigned mask = 0;
  if (req->stored_bytes_given_case) {
    q.stored_bytes = req->stored_bytes;
    mask |= STORE_QUOTA_STORED_BYTES;
  }
  if (req->inflight_given_case) {
    q.inflight = req->inflight;
    mask |= STORE_QUOTA_INFLIGHT;
  }
  if (req->rate_per_s_given_case) q.rate_per_s = req->rate_per_s;
  if (req->burst_given_case) q.burst = req->burst;
  if (req->rate_per_s_given_case || req->burst_given_case)
    mask |= STORE_QUOTA_RATE;
  /* A rate cleared alone clears its burst too. */
  if (req->rate_per_s_given_case && !req->burst_given_case &&
      req->rate_per_s == STORE_QUOTA_NONE)
    q.burst = STORE_QUOTA_NONE;
  if (req->nodes_per_spec_given_case) {
    q.nodes_per_spec = req->nodes_per_spec;
    mask |= STORE_QUOTA_NODES;
  }
  if (req->run_ms_given_case) {
    q.run_ms = req->run_ms;
    mask |= STORE_QUOTA_RUN_MS;
  }
  if (req->run_bytes_given_case) {
    q.run_bytes = req->run_bytes;
    mask |= STORE_QUOTA_RUN_BYTES;
  }
  if (req->weight_given_case) {
    q.weight = req->weight;
    mask |= STORE_QUOTA_WEIGHT;
  }
  if (req->device_bytes_given_case) {
    q.device_bytes = req->device_bytes;
    mask |= STORE_QUOTA_DEVICE_BYTES;
  }
  topos_store *st = cx->d->store;
  topos_error err = {0};
  store_quota now;
  if (mask == 0) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "AdminQuotaSet: no quota is given; give at least one "
              "(stored_bytes, inflight, rate_per_s and burst, "
              "nodes_per_spec, run_ms, run_bytes, device_bytes, weight)");
  } else if (store_quota_check(&q, mask, &err) != TOPOS_OK) {
    admin_fail_store(&a, &err);
  } else {
    pthread_mutex_lock(&admin_lock);
    if (store_quota_set(st, tenant, &q, mask, &err) != TOPOS_OK ||
        store_quota_get(st, tenant, &now, NULL, &err) != TOPOS_OK)
      admin_fail_store(&a, &err);
    pthread_mutex_unlock(&admin_lock);
  }
  if (cx->status == WIRE_GRPC_OK) {
    char line[400];
    store_quota_format(&now, line, sizeof line);
    add_field(&a, "%s", line);
    quota_reply(cx, tenant, &now);
  }
  admin_end(&a);
}

void handle_admin_quota_show(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminQuotaShowRequest *req = admin_begin(
      cx, &a, "AdminQuotaShow", "quota.show",
      &topos__v1__admin_quota_show_request__descriptor, describe_tenant, false);
  if (req == NULL) return;
  const char *tenant = req->tenant;
  topos_store *st = cx->d->store;
  topos_error err = {0};
  store_tenant_info t;
  store_quota now;
  /* An unknown tenant is NOT_FOUND, not a tenant without quotas. */
  if (store_tenant_get(st, tenant, &t, &err) != TOPOS_OK ||
      store_quota_get(st, tenant, &now, NULL, &err) != TOPOS_OK)
    admin_fail_store(&a, &err);
  else
    quota_reply(cx, tenant, &now);
  admin_end(&a);
}

/* ------------------------------------------------------- AdminSpecDelete */

static void describe_spec(admin_call *a, const ProtobufCMessage *m) {
  const Topos__V1__AdminSpecDeleteRequest *r = (const void *)m;
  if (wire_id_valid(r->id)) add_field(a, "spec=%s", r->id);
}

void handle_admin_spec_delete(call_ctx *cx) {
  admin_call a;
  Topos__V1__AdminSpecDeleteRequest *req = admin_begin(
      cx, &a, "AdminSpecDelete", "spec.delete",
      &topos__v1__admin_spec_delete_request__descriptor, describe_spec, false);
  if (req == NULL) return;
  if (!call_check_id(cx, req->id, "id")) {
    admin_end(&a);
    return;
  }
  topos_error err = {0};
  char key[80];
  snprintf(key, sizeof key, "net %s", req->id);
  int64_t len = 0;
  if (store_stat_spec(cx->d->store, req->id, &len, &err) != TOPOS_OK) {
    if (err.code == TOPOS_ERR_NOT_FOUND)
      call_fail(cx, WIRE_GRPC_NOT_FOUND, TOPOS_ERR_NOT_FOUND,
                "AdminSpecDelete: no spec with id %s", req->id);
    else
      admin_fail_store(&a, &err);
  } else if (cache_in_use(cx->d->cache, key)) {
    /* A running call holds its network or a plan of it. */
    call_fail(cx, WIRE_GRPC_FAILED_PRECONDITION, 0,
              "AdminSpecDelete: spec %s is in use by a running call; try "
              "again when it is done",
              req->id);
  } else {
    /* The cached network (and its plans, its children), its describes,
     * then the stored bytes: a call that starts after this finds none. */
    cache_drop(cx->d->cache, key);
    for (int f = 0; f <= 3; f++) {
      snprintf(key, sizeof key, "describe %d %s", f, req->id);
      cache_drop(cx->d->cache, key);
    }
    if (store_delete_spec(cx->d->store, req->id, &err) != TOPOS_OK)
      admin_fail_store(&a, &err);
  }
  if (cx->status == WIRE_GRPC_OK) {
    add_field(&a, "bytes=%lld", (long long)len);
    Topos__V1__AdminSpecDeleteReply r =
        TOPOS__V1__ADMIN_SPEC_DELETE_REPLY__INIT;
    r.bytes = len;
    call_reply(cx, &r.base);
  }
  admin_end(&a);
}
