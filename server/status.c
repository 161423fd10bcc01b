/*
 * status.c - the daemon's own state: Health (serving or draining, the
 * version) and Stats (workers, queue, requests, cache, store).
 */
#include "rooms.h"
#include "version.h"

/* ---------------------------------------------------------- Health, Stats */

void handle_health(call_ctx *cx) {
  if (call_unpack(cx, &topos__v1__health_request__descriptor, "Health", true) ==
      NULL)
    return;
  Topos__V1__HealthReply r = TOPOS__V1__HEALTH_REPLY__INIT;
  r.status = atomic_load(&cx->d->draining) ? "draining" : "serving";
  r.version = TOPOSD_VERSION;
  call_reply(cx, &r.base);
}

void handle_stats(call_ctx *cx) {
  if (call_unpack(cx, &topos__v1__stats_request__descriptor, "Stats", true) ==
      NULL)
    return;
  daemon_state *d = cx->d;
  cache_counters cc;
  cache_stats(d->cache, &cc);
  store_stats_info si;
  topos_error err = {0};
  if (store_stats(d->store, &si, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "store");
    return;
  }
  Topos__V1__StatsReply r = TOPOS__V1__STATS_REPLY__INIT;
  r.workers = d->workers;
  r.queue_depth = atomic_load(&d->queue_depth);
  r.queue_capacity = d->queue_capacity;
  r.requests = atomic_load(&d->requests);
  r.errors = atomic_load(&d->errors);
  r.cache_entries = cc.entries;
  r.cache_hits = cc.hits;
  r.cache_misses = cc.misses;
  r.specs = si.spec_count;
  r.spec_bytes = si.spec_bytes;
  r.blobs = si.blob_count;
  r.blob_bytes = si.blob_bytes;
  call_reply(cx, &r.base);
}
