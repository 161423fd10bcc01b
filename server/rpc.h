/*
 * rpc.h - toposd's gRPC front: the server, its completion queue thread,
 * the bounded job queue and the worker pool.
 */
#ifndef TOPOSD_RPC_H
#define TOPOSD_RPC_H

#include <signal.h>

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

/* Destroys the server and the completion queue (after rpc_server_run). */
void rpc_server_destroy(rpc_server *s);

#endif /* TOPOSD_RPC_H */
