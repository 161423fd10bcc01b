/*
 * status.c - the daemon's own state: Health (serving or draining, the
 * version), Stats (workers, queue, requests, cache, store, tasks per
 * backend) and Backends (the registry and its capabilities).
 */
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "health.pb-c.h"
#include "listener.h"
#include "metrics.h"
#include "rooms.h"
#include "version.h"

/* ---------------------------------------------------------- Health, Stats */

/* The devices the plugins use, into out/ptrs (TOPOS_DEVICES_MAX each);
 * returns how many.  The strings point into info. */
static size_t devices_fill(topos_device_info *info, Topos__V1__DeviceInfo *out,
                           Topos__V1__DeviceInfo **ptrs) {
  int n = topos_devices_list(info, TOPOS_DEVICES_MAX);
  if (n > TOPOS_DEVICES_MAX) n = TOPOS_DEVICES_MAX;
  for (int i = 0; i < n; i++) {
    Topos__V1__DeviceInfo *o = &out[i];
    topos__v1__device_info__init(o);
    o->backend = info[i].backend;
    o->ordinal = info[i].ordinal;
    o->name = info[i].name;
    o->memory_total = (int64_t)info[i].memory_total;
    o->memory_free = (int64_t)info[i].memory_free;
    o->cc_major = info[i].cc_major;
    o->cc_minor = info[i].cc_minor;
    o->multiprocessors = info[i].multiprocessors;
    o->tasks = (int64_t)info[i].tasks;
    o->declined = (int64_t)info[i].declined;
    o->bytes_up = (int64_t)info[i].bytes_up;
    o->bytes_down = (int64_t)info[i].bytes_down;
    o->cache_hits = (int64_t)info[i].cache_hits;
    o->cache_misses = (int64_t)info[i].cache_misses;
    o->cache_bytes = (int64_t)info[i].cache_bytes;
    o->pool_bytes = (int64_t)info[i].pool_bytes;
    ptrs[i] = o;
  }
  return (size_t)n;
}

void handle_health(call_ctx *cx) {
  if (call_unpack(cx, &topos__v1__health_request__descriptor, "Health", true) ==
      NULL)
    return;
  Topos__V1__HealthReply r = TOPOS__V1__HEALTH_REPLY__INIT;
  r.status = atomic_load(&cx->d->draining) ? "draining" : "serving";
  r.version = TOPOSD_VERSION;
  topos_device_info dinfo[TOPOS_DEVICES_MAX];
  Topos__V1__DeviceInfo dev[TOPOS_DEVICES_MAX], *dptrs[TOPOS_DEVICES_MAX];
  r.n_devices = devices_fill(dinfo, dev, dptrs);
  r.devices = dptrs;
  call_reply(cx, &r.base);
}

/* The standard health protocol: "" is the whole server, and the one
 * service it serves is topos.v1.Topos. */
void handle_health_check(call_ctx *cx) {
  Grpc__Health__V1__HealthCheckRequest *req =
      call_unpack(cx, &grpc__health__v1__health_check_request__descriptor,
                  "HealthCheckRequest", true);
  if (req == NULL) return;
  if (req->service[0] != '\0' && strcmp(req->service, "topos.v1.Topos") != 0) {
    call_fail(cx, WIRE_GRPC_NOT_FOUND, 0,
              "HealthCheckRequest.service: '%s' is not served here (\"\" "
              "and \"topos.v1.Topos\" are)",
              req->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse r =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status =
      atomic_load(&cx->d->draining)
          ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
          : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  call_reply(cx, &r.base);
}

void handle_stats(call_ctx *cx) {
  if (call_unpack(cx, &topos__v1__stats_request__descriptor, "Stats", true) ==
      NULL)
    return;
  daemon_state *d = cx->d;
  cache_counters cc;
  cache_stats(d->cache, &cc);
  /* Blobs count what was acknowledged: with blobs pending (early
   * acknowledgement) the writer's counts, else the store's, read after
   * that check so that a blob written meanwhile is in them. */
  int64_t blobs = 0, blob_bytes = 0;
  bool pending = blob_writer_acknowledged(d->blobs, &blobs, &blob_bytes);
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
  r.cache_bytes = cc.bytes;
  r.reserved_bytes = atomic_load(&d->reserved_bytes);
  r.memory_budget = d->cfg->memory_bytes;
  r.specs = si.spec_count;
  r.spec_bytes = si.spec_bytes;
  r.blobs = pending ? blobs : si.blob_count;
  r.blob_bytes = pending ? blob_bytes : si.blob_bytes;
  /* A tenant that is not an admin sees its own calls, specs and blobs;
   * the daemon's counts and the store's totals are the admins'
   * (docs/operations.md, "Isolation").  Its calls are counted once
   * answered, so this one is not in requests yet, as in the daemon's. */
  if (cx->tenant != NULL && cx->tenant[0] != '\0' && !cx->admin) {
    metrics_tenant_counts(cx->tenant, &r.requests, &r.errors);
    store_usage u;
    if (store_tenant_usage(d->store, cx->tenant, &u, &err) != TOPOS_OK) {
      call_fail_err(cx, &err, "store");
      return;
    }
    r.specs = u.spec_count;
    r.spec_bytes = u.spec_bytes;
    r.blobs = u.blob_count;
    r.blob_bytes = u.blob_bytes;
  }
  topos_backend_info info[TOPOS_BACKENDS_MAX];
  int n = topos_backends_list(info, TOPOS_BACKENDS_MAX);
  if (n > TOPOS_BACKENDS_MAX) n = TOPOS_BACKENDS_MAX;
  Topos__V1__BackendCount counts[TOPOS_BACKENDS_MAX];
  Topos__V1__BackendCount *ptrs[TOPOS_BACKENDS_MAX];
  for (int i = 0; i < n; i++) {
    topos__v1__backend_count__init(&counts[i]);
    counts[i].backend = info[i].name;
    counts[i].tasks = (int64_t)info[i].tasks_run;
    ptrs[i] = &counts[i];
  }
  listener_counts lc;
  listener_get_counts(d->listener, &lc);
  r.connections = lc.open;
  r.connections_shed = lc.shed;
  r.connections_refused = lc.refused;
  r.connection_cap = lc.cap;
  r.n_backend_tasks = (size_t)n;
  r.backend_tasks = ptrs;
  topos_device_info dinfo[TOPOS_DEVICES_MAX];
  Topos__V1__DeviceInfo dev[TOPOS_DEVICES_MAX], *dptrs[TOPOS_DEVICES_MAX];
  r.n_devices = devices_fill(dinfo, dev, dptrs);
  r.devices = dptrs;
  call_reply(cx, &r.base);
}

/* ------------------------------------------------------------- Backends */

void handle_backends(call_ctx *cx) {
  if (call_unpack(cx, &topos__v1__backends_request__descriptor, "Backends",
                  true) == NULL)
    return;
  topos_backend_info info[TOPOS_BACKENDS_MAX];
  int n = topos_backends_list(info, TOPOS_BACKENDS_MAX);
  if (n > TOPOS_BACKENDS_MAX) n = TOPOS_BACKENDS_MAX;
  Topos__V1__BackendInfo b[TOPOS_BACKENDS_MAX];
  Topos__V1__BackendInfo *ptrs[TOPOS_BACKENDS_MAX];
  char *ops[TOPOS_BACKENDS_MAX][TOPOS_TASK_COUNT];
  Topos__V1__DType dtypes[TOPOS_BACKENDS_MAX][4];
  for (int i = 0; i < n; i++) {
    topos__v1__backend_info__init(&b[i]);
    b[i].name = info[i].name;
    b[i].fidelity = info[i].fidelity;
    b[i].device = info[i].device;
    b[i].threads = info[i].threads;
    b[i].tasks_run = (int64_t)info[i].tasks_run;
    /* ops: the op lists of its task kinds (the reference: every op, and
     * listed as the kinds it runs when no backend takes them). */
    for (int k = 0; k < TOPOS_TASK_COUNT; k++)
      if (info[i].tasks & (1u << k))
        ops[i][b[i].n_ops++] = (char *)topos_task_ops(k);
    b[i].ops = ops[i];
    for (int d = 0; d < 4; d++)
      if (info[i].dtypes & (1u << d))
        dtypes[i][b[i].n_dtypes++] = (Topos__V1__DType)d;
    b[i].dtypes = dtypes[i];
    ptrs[i] = &b[i];
  }
  Topos__V1__BackendsReply r = TOPOS__V1__BACKENDS_REPLY__INIT;
  r.n_backends = (size_t)n;
  r.backends = ptrs;
  topos_device_info dinfo[TOPOS_DEVICES_MAX];
  Topos__V1__DeviceInfo dev[TOPOS_DEVICES_MAX], *dptrs[TOPOS_DEVICES_MAX];
  r.n_devices = devices_fill(dinfo, dev, dptrs);
  r.devices = dptrs;
  char plugins[512];
  topos_backends_plugin_report(plugins, sizeof plugins);
  r.plugins = plugins;
  call_reply(cx, &r.base);
}
