/*
 * daemon.h - what toposd's parts share: the configuration, the store, the
 * cache, the run state (serving, draining, cancelling) and the counters
 * Stats reports.  One instance lives in main(); the gRPC front (rpc.c)
 * and the handlers (handlers.h, rooms.h) read it from every thread.
 */
#ifndef TOPOSD_DAEMON_H
#define TOPOSD_DAEMON_H

#include <stdatomic.h>
#include <stdint.h>

#include "blobs.h"
#include "cache.h"
#include "config.h"
#include "store.h"

typedef struct daemon_state {
  const toposd_config *cfg;
  topos_store *store;
  cache *cache;
  blob_writer *blobs;        /* uploaded blobs on their way into the store */
  struct listener *listener; /* the front's connections (Stats reads) */
  /* The gRPC address bound before the store opened (listener_bind); -1
   * with TLS, where gRPC binds it. */
  int listen_fd;
  /* Bearer tokens against the store's tenants (auth.h); every transport
   * checks each call but the health probes with it. */
  struct auth *auth;
  /* Set once SIGTERM/SIGINT arrived: Health says "draining". */
  _Atomic int draining;
  /* Set when the grace period ran out: workers abandon their jobs at the
   * next check and answer CANCELLED. */
  _Atomic int cancel_all;
  /* Counters for Stats. */
  _Atomic int64_t requests; /* calls answered, any status */
  _Atomic int64_t errors;   /* calls answered with a status other than OK */
  _Atomic int queue_depth;  /* jobs waiting for a worker */
  _Atomic int busy_workers; /* workers running a job */
  /* Memory admission (admission.c): the peak bytes reserved by the runs
   * in flight, at most cfg->memory_bytes. */
  _Atomic int64_t reserved_bytes;
  int queue_capacity;
  int workers;
} daemon_state;

/* Nanoseconds on CLOCK_MONOTONIC. */
int64_t daemon_now_ns(void);

#endif /* TOPOSD_DAEMON_H */
