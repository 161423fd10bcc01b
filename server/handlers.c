/*
 * handlers.c - the call plumbing of topos.v1.Topos's handlers: statuses,
 * unpacking requests, packing replies, the engine context of a call, and
 * the method table the front (rpc.c) serves.  What each RPC does lives in
 * the rooms by resource (rooms.h: specs.c, runs.c, blob_rpc.c,
 * conformance.c, status.c) and, for the Admin* RPCs, admin.c (admin.h).
 *
 * Every request is a pure function of its message and the immutable,
 * content-addressed store: Record adds a spec (idempotent), PutBlob adds a
 * blob, and nothing else writes.
 *
 * Errors: the engine's topos_error becomes the gRPC status of
 * wire_grpc_status_of, its message the status details and its code the
 * trailing "topos-status".  A request message that does not parse is
 * INVALID_ARGUMENT, and so is one with a string field that is not UTF-8
 * or holds a NUL; a malformed id INVALID_ARGUMENT; an unknown id
 * NOT_FOUND.  The request's message is unpacked into the worker's arena
 * (cx->alloc), so nothing unpacked is freed by a handler.
 */
#include "handlers.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "backends.h"
#include "quota.h"
#include "rooms.h"

/* ---------------------------------------------------------- call status */

void call_fail(call_ctx *cx, int status, int topos_code, const char *fmt, ...) {
  if (cx->status != WIRE_GRPC_OK) return; /* the first failure wins */
  cx->status = status;
  cx->topos_code = topos_code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cx->message, sizeof cx->message, fmt, ap);
  va_end(ap);
}

/* An engine error: its code picks the status, its message is the text. */
void call_fail_err(call_ctx *cx, const topos_error *err, const char *what) {
  int code = err->code;
  /* A run stopped by call_should_stop: report why (deadline, cancel,
   * drain) rather than the engine's generic "cancelled". */
  if ((code == TOPOS_ERR_CANCELLED || code == TOPOS_ERR_DEADLINE) &&
      !call_continue(cx))
    return;
  if (code == TOPOS_OK) {
    call_fail(cx, WIRE_GRPC_INTERNAL, 0, "%s failed without a message", what);
    return;
  }
  call_fail(cx, wire_grpc_status_of(code), code, "%s",
            err->message[0] ? err->message : topos_status_name(code));
}

bool call_should_stop(void *ctx) {
  call_ctx *cx = ctx;
  return atomic_load(&cx->d->cancel_all) ||
         daemon_now_ns() >= cx->deadline_ns ||
         (cx->cancelled != NULL && atomic_load(cx->cancelled));
}

/* The context a call's engine runs get: the plan's entry (numerics,
 * threads; the defaults without a plan), stopped at a node boundary by
 * call_should_stop (client cancel, deadline, drain). */
topos_exec call_exec(call_ctx *cx, const topos_plan *plan) {
  topos_exec e = topos_plan_exec(plan);
  e.cancel = call_should_stop;
  e.cancel_ctx = cx;
  e.report = &cx->report;
  return e;
}

bool call_exec_of(call_ctx *cx, const Topos__V1__ExecOptions *opts,
                  const topos_plan *plan, const char *entry_backend,
                  topos_exec *out) {
  *out = call_exec(cx, plan);
  if (opts) {
    /* The proto numbers numerics as the engine does; the engine's check
     * below refuses any other value and threads out of range. */
    out->numerics = (topos_numerics)opts->numerics;
    out->threads = opts->threads > INT_MAX ? INT_MAX : (int)opts->threads;
    out->backend = opts->backend;
  } else {
    out->backend = entry_backend;
  }
  topos_error err = {0};
  if (topos_exec_check(out, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "exec");
    return false;
  }
  return call_device_quota(cx, plan, out->backend);
}

bool call_device_quota(call_ctx *cx, const topos_plan *plan,
                       const char *backend) {
  if (cx->quota == NULL || cx->quota->device_bytes < 0) return true;
  /* Only a run whose tasks may go to a device holds device memory: on a
   * host without one, or with a host backend named, there is nothing to
   * bound. */
  if (!topos_backend_uses_device(backend)) return true;
  size_t need = topos_plan_device_bytes(plan);
  if (need <= (size_t)cx->quota->device_bytes) return true;
  call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
            "%s: quota device_bytes: limit %lld bytes, this run's largest "
            "device task needs %zu bytes",
            cx->method ? cx->method : "run", (long long)cx->quota->device_bytes,
            need);
  return false;
}

bool call_split_names(call_ctx *cx, const char *list, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t len = strlen(list);
  if (len == 0) return true;
  char *copy = call_scratch(cx, len + 1);
  char **v = call_scratch(cx, sizeof *v * (len / 2 + 2));
  if (copy == NULL || v == NULL) return false;
  memcpy(copy, list, len + 1);
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save))
    v[(*n)++] = tok;
  *out = v;
  return true;
}

bool call_backends(call_ctx *cx, char ***names, size_t *n) {
  char list[TOPOS_BACKENDS_MAX * 33];
  topos_exec_report_names(&cx->report, list, sizeof list);
  return call_split_names(cx, list, names, n);
}

bool call_continue(call_ctx *cx) {
  if (cx->status != WIRE_GRPC_OK) return false;
  if (atomic_load(&cx->d->cancel_all)) {
    call_fail(cx, WIRE_GRPC_UNAVAILABLE, 0,
              "toposd is shutting down; the call was cancelled");
    return false;
  }
  bool expired = daemon_now_ns() >= cx->deadline_ns;
  if (expired && cx->quota != NULL && cx->quota->run_ms >= 0) {
    /* The deadline may be the tenant's cap (rpc.c, admit_quota). */
    call_fail(cx, WIRE_GRPC_DEADLINE_EXCEEDED, 0,
              "deadline exceeded (quota run_ms: limit %lld ms per call)",
              (long long)cx->quota->run_ms);
    return false;
  }
  if (expired) {
    call_fail(cx, WIRE_GRPC_DEADLINE_EXCEEDED, 0, "deadline exceeded");
    return false;
  }
  if (cx->cancelled != NULL && atomic_load(cx->cancelled)) {
    call_fail(cx, WIRE_GRPC_CANCELLED, 0, "call cancelled by the client");
    return false;
  }
  return true;
}

bool call_quota_stored(call_ctx *cx, const char *method, int64_t adds) {
  if (cx->quota == NULL || cx->quota->stored_bytes < 0 || adds <= 0 ||
      cx->tenant == NULL || cx->tenant[0] == '\0')
    return true;
  /* What the tenant owns now, as Stats shows it: a spec or blob shared
   * with another tenant counts in full for each owner; and what its other
   * uploads add while they are written (quota.h says why the read and the
   * count go under one lock).  Eviction is not asked to make room: the
   * quota is a hard cap. */
  quota_table *qt = cx->quotas;
  if (qt) quota_upload_lock(qt);
  store_usage u;
  topos_error err = {0};
  bool ok = false;
  if (store_tenant_usage(cx->d->store, cx->tenant, &u, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "store");
  } else {
    int64_t held = u.spec_bytes + u.blob_bytes;
    int64_t uploading = qt ? quota_uploading(qt, cx->tenant) : 0;
    char more[64] = "";
    if (uploading > 0)
      snprintf(more, sizeof more, " and is uploading %lld",
               (long long)uploading);
    if (held > cx->quota->stored_bytes - adds - uploading) {
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "%s: quota stored_bytes: limit %lld bytes, the tenant holds "
                "%lld%s, this upload adds %lld",
                method, (long long)cx->quota->stored_bytes, (long long)held,
                more, (long long)adds);
    } else if (qt && !quota_upload_add(qt, cx->tenant, adds)) {
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "%s: daemon out of memory", method);
    } else {
      if (qt) cx->upload_counted = adds;
      ok = true;
    }
  }
  if (qt) quota_upload_unlock(qt);
  return ok;
}

/* ----------------------------------------------------- messages in, out */

void *call_unpack(call_ctx *cx, const ProtobufCMessageDescriptor *desc,
                  const char *what, bool optional) {
  if (!cx->has_message && !optional) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%s: the request carries no message", what);
    return NULL;
  }
  void *m = protobuf_c_message_unpack(desc, cx->alloc, cx->in_len, cx->in);
  if (m == NULL) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%s: malformed message (%zu bytes do not parse as %s)", what,
              cx->in_len, desc->name);
    return NULL;
  }
  /* Every string field of every request is UTF-8 without NUL before
   * anything is stored or run (so whatever a reply echoes parses in any
   * proto3 client); the raw bytes are read, as unpacking has already cut
   * a string at its first NUL. */
  topos_error err = {0};
  if (wire_check_strings(desc, cx->in, cx->in_len, &err) != TOPOS_OK) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, err.code, "%s: %s", what,
              err.message);
    return NULL;
  }
  return m;
}

void call_reply(call_ctx *cx, const ProtobufCMessage *m) {
  if (cx->status != WIRE_GRPC_OK) return;
  size_t n = protobuf_c_message_get_packed_size(m);
  if ((int64_t)n > cx->d->cfg->max_message_bytes) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "the reply would be %zu bytes, over the daemon's "
              "max-message-bytes %lld",
              n, (long long)cx->d->cfg->max_message_bytes);
    return;
  }
  uint8_t *buf = malloc(n ? n : 1);
  if (buf == NULL) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory packing a %zu-byte reply", n);
    return;
  }
  protobuf_c_message_pack(m, buf);
  cx->out = buf;
  cx->out_len = n;
}

/* Request-lifetime memory (the worker's arena). */
void *call_scratch(call_ctx *cx, size_t n) {
  void *p = cx->alloc->alloc(cx->alloc->allocator_data, n);
  if (p == NULL)
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory (%zu bytes)", n);
  return p;
}

/* An id from a request: present and 64 lowercase hex digits. */
bool call_check_id(call_ctx *cx, const char *id, const char *what) {
  if (id == NULL || id[0] == '\0') {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%s is missing", what);
    return false;
  }
  if (!wire_id_valid(id)) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%s '%.80s%s' is not 64 lowercase hex digits", what, id,
              strlen(id) > 80 ? "..." : "");
    return false;
  }
  return true;
}

/* ------------------------------------------------------------ the table */

#define METHOD(name, fn) \
  { name, "/topos.v1.Topos/" name, fn, false, false }

const method_def handler_methods[] = {
    METHOD("Record", handle_record),
    METHOD("Describe", handle_describe),
    METHOD("Lower", handle_lower),
    METHOD("Emit", handle_emit),
    METHOD("Forward", handle_forward),
    METHOD("Backward", handle_backward),
    METHOD("Step", handle_step),
    {"Train", "/topos.v1.Topos/Train", handle_train, false, true},
    METHOD("Conformance", handle_conformance),
    METHOD("PutBlob", handle_put_blob),
    METHOD("StatBlob", handle_stat_blob),
    METHOD("GetBlob", handle_get_blob),
    {"Health", "/topos.v1.Topos/Health", handle_health, true, false},
    METHOD("Stats", handle_stats),
    METHOD("Backends", handle_backends),
    METHOD("ListSpecs", handle_list_specs),
    METHOD("AdminTenantAdd", handle_admin_tenant_add),
    METHOD("AdminTenantList", handle_admin_tenant_list),
    METHOD("AdminTenantRemove", handle_admin_tenant_remove),
    METHOD("AdminTokenCreate", handle_admin_token_create),
    METHOD("AdminTokenList", handle_admin_token_list),
    METHOD("AdminTokenRevoke", handle_admin_token_revoke),
    METHOD("AdminQuotaSet", handle_admin_quota_set),
    METHOD("AdminQuotaShow", handle_admin_quota_show),
    METHOD("AdminSpecDelete", handle_admin_spec_delete),
    {"grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Check",
     handle_health_check, true, false},
};

const int handler_method_count =
    (int)(sizeof handler_methods / sizeof handler_methods[0]);
