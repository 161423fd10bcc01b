/*
 * rpc.h - toposd's gRPC front: the server, its completion queue thread,
 * the bounded job queue and the worker pool.
 */
#ifndef TOPOSD_RPC_H
#define TOPOSD_RPC_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

typedef struct rpc_server rpc_server;

/* Creates the gRPC server on cfg->listen (grpc_init must have run) and
 * writes the bound address (with the actual port) to bound.  NULL with a
 * message on failure (the address cannot be bound, out of memory). */
rpc_server *rpc_server_start(daemon_state *d, char *bound, size_t boundlen,
                             char *msg, size_t msglen);

/* Runs the completion-queue loop on the calling thread until *stop is set
 * (by a signal handler) and the shutdown sequence has finished: stop
 * accepting, let in-flight work finish for the grace period, cancel what
 * is left, join the workers.  Returns 0 after a clean drain, 1 when jobs
 * had to be abandoned (a worker stuck in one engine call past the grace
 * period and a further hard limit). */
int rpc_server_run(rpc_server *s, volatile sig_atomic_t *stop);

/* A call from another transport (the HTTP gateway, http.c): the same
 * method table, job queue, workers, request log, counters and metrics as a
 * gRPC call.  The caller owns the struct and keeps it (and `in`) alive
 * until `done` runs. */
typedef struct service_call service_call;
struct service_call {
  /* In: set before rpc_submit. */
  int method;        /* index into handler_methods */
  const uint8_t *in; /* the request message (protobuf bytes) */
  size_t in_len;
  bool has_message;
  int64_t arrival_ns, deadline_ns; /* daemon_now_ns() clock */
  char peer[64];                   /* "http:127.0.0.1:5555" */
  _Atomic int cancelled;           /* the caller sets it when its client goes */
  bool inline_call; /* run on the caller's thread, as a probe is */
  char tenant[65];  /* the caller's tenant (auth.h); "" when auth is off */
  bool admin;
  /* Set by rpc_submit: the tenant's quotas (quota.h) and whether the call
   * is counted in flight. */
  store_quota quota;
  bool has_quota, quota_counted;
  /* Out: valid in done.  On OK, out/out_len is the packed reply (malloc'd;
   * the caller frees it); otherwise out is NULL. */
  int status, topos_code;
  char message[1024];
  uint8_t *out;
  size_t out_len;
  /* Runs on the worker's thread once the call is answered: the worker's
   * last touch of the struct. */
  void (*done)(service_call *c);
  void *user;
};

/* Queues c for a worker, or answers it at once: a probe method (or a call
 * marked inline_call) runs on the caller's thread; a full queue, a drain or a
 * shutdown fills the status (UNAVAILABLE) without queueing.  Returns true when
 * c was queued (done will run on a worker), false when it was answered here
 * (done is not called; read the result now). */
bool rpc_submit(rpc_server *s, service_call *c);

/* The handler_methods index of a method name ("Describe"), or -1. */
int rpc_method_index(const char *name);

/* Destroys the server and the completion queue (after rpc_server_run). */
void rpc_server_destroy(rpc_server *s);

#endif /* TOPOSD_RPC_H */
