/*
 * handlers.h - the semantics of the service topos.v1.Topos: one handler
 * per RPC, each a function from request bytes to reply bytes or a status.
 *
 * Handlers know nothing of gRPC: the front (rpc.c) hands them the request
 * message's bytes and a way to tell whether the call should stop
 * (deadline, cancellation, shutdown), and sends whatever they leave in
 * the call context.  Every handler treats the request as hostile; a
 * handler never crashes the daemon, leaks, or writes anything but new
 * content-addressed rows to the store.
 */
#ifndef TOPOSD_HANDLERS_H
#define TOPOSD_HANDLERS_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "topos.h"

/* A Train stream's session (runs.c): held by the front for the stream's
 * life, handed to the handler with each message. */
typedef struct train_session train_session;

typedef struct call_ctx {
  daemon_state *d;
  /* The request message (NULL/0 when the client sent none). */
  const uint8_t *in;
  size_t in_len;
  bool has_message;
  int64_t deadline_ns;          /* daemon_now_ns() clock; INT64_MAX: none */
  const _Atomic int *cancelled; /* set when the client cancels the call */
  ProtobufCAllocator *alloc;    /* request-lifetime memory for unpacking */
  uint64_t request_id;
  /* Who is calling (auth.h): the token's tenant, "" when auth is off or
   * for a probe; admin is the tenant's flag.  Isolation and quotas (later
   * slices of issue 15) key on these. */
  const char *tenant;
  bool admin;
  /* The client's address as the request log shows it (NULL: unknown);
   * the admin RPCs' audit lines name it. */
  const char *peer;
  const char *method; /* handler_methods[...].name: "Forward" */
  /* The tenant's quotas (docs/operations.md, "Quotas"), read at
   * admission; NULL when it has none or auth is off. */
  const store_quota *quota;
  /* The daemon's per-tenant quota state (quota.h), and the bytes of this
   * call's upload counted in it (call_quota_stored; the front takes them
   * back once the call is answered). */
  struct quota_table *quotas;
  int64_t upload_counted;
  /* What the call's engine runs ran: every context a handler builds
   * (call_exec_of) reports here, and replies name the backends. */
  topos_exec_report report;
  /* A Train stream's session (NULL for every other call). */
  train_session *train;

  /* Results.  On OK, out/out_len is the packed reply (malloc'd; the front
   * frees it), possibly empty.  Otherwise status is a grpc_status_code,
   * message says why and topos_code is the engine's code (0 if none). */
  uint8_t *out;
  size_t out_len;
  int status;
  int topos_code;
  char message[1024];
  char spec_id[65]; /* for the request log; "" when none */
} call_ctx;

typedef void (*handler_fn)(call_ctx *cx);

typedef struct method_def {
  const char *name; /* "Forward" */
  const char *path; /* "/topos.v1.Topos/Forward" */
  handler_fn handler;
  /* A health probe: answered on the front's own thread (never queued
   * behind work), and still answered while the daemon drains. */
  bool probe;
  /* A bidirectional stream (Train): the front reads its messages one by
   * one and runs each as a job on the stream's session. */
  bool stream;
} method_def;

extern const method_def handler_methods[];
extern const int handler_method_count;

/* A Train stream's session: new (NULL when out of memory), and freed
 * with everything it holds once the stream is over. */
train_session *train_session_new(void);
void train_session_free(daemon_state *d, train_session *ts);
/* The reply that ends a stream the daemon refuses to go on with: the
 * steps run and the parameters and state after the last of them
 * (`last`).  False when the session never opened (nothing to return) or
 * out of memory; otherwise *out (malloc'd) is the packed reply. */
bool train_session_last(daemon_state *d, const train_session *ts, uint8_t **out,
                        size_t *out_len);

/* True when the call may go on; otherwise sets the status
 * (DEADLINE_EXCEEDED, CANCELLED) and returns false.  Handlers call it
 * before starting work and after every engine call. */
bool call_continue(call_ctx *cx);
/* The engine's cancel check for a call (ctx is the call_ctx): true once the
 * call is cancelled, past its deadline, or the daemon is cancelling all.
 * It only reads; call_continue then sets the matching status. */
bool call_should_stop(void *ctx);

#endif /* TOPOSD_HANDLERS_H */
