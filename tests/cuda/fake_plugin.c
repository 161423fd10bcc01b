/*
 * fake_plugin.c - libtopos_fakegpu.so, a plugin with a pretend device and
 * no backends, for the daemon's tests on hosts without a GPU
 * (tests/daemon/test_devices.c): toposd loads it through
 * TOPOS_CUDA_PLUGIN, so the loader, the device listings and the blob
 * announcements of real runs are exercised end to end.
 *
 * The device's counters report what the host announced:
 *   cache_hits   - announce calls,
 *   cache_misses - retract calls that found their range,
 *   cache_bytes  - bytes announced now (0 once every run has retracted),
 *   name         - "fake " + the hex of the last hash announced.
 * bind_thread counts its calls in `tasks` (one per daemon worker).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "plugin.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_RANGES 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const void *host;
  size_t bytes;
} ranges[MAX_RANGES];
static int nranges;
static unsigned long long announces, retracts, binds;
static uint64_t live_bytes;
static char last_hash[65];

static int devices(topos_device_info *out, int max) {
  if (max < 1) return 1;
  pthread_mutex_lock(&mu);
  memset(out, 0, sizeof *out);
  snprintf(out->backend, sizeof out->backend, "fake");
  snprintf(out->name, sizeof out->name, "fake %s", last_hash);
  out->memory_total = (uint64_t)1 << 30;
  out->memory_free = (uint64_t)1 << 30;
  out->cc_major = 9;
  out->multiprocessors = 1;
  out->tasks = binds;
  out->cache_hits = announces;
  out->cache_misses = retracts;
  out->cache_bytes = live_bytes;
  pthread_mutex_unlock(&mu);
  return 1;
}

static int bind_thread(int slot) {
  (void)slot;
  pthread_mutex_lock(&mu);
  binds++;
  pthread_mutex_unlock(&mu);
  return 0;
}

static int announce(const void *host, size_t bytes, const uint8_t hash[32]) {
  pthread_mutex_lock(&mu);
  announces++;
  for (int i = 0; i < 32; i++) snprintf(last_hash + 2 * i, 3, "%02x", hash[i]);
  int rc = -1;
  if (nranges < MAX_RANGES) {
    ranges[nranges].host = host;
    ranges[nranges].bytes = bytes;
    nranges++;
    live_bytes += bytes;
    rc = 0;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

static void retract(const void *host) {
  pthread_mutex_lock(&mu);
  for (int i = nranges - 1; i >= 0; i--)
    if (ranges[i].host == host) {
      live_bytes -= ranges[i].bytes;
      ranges[i] = ranges[--nranges];
      retracts++;
      break;
    }
  pthread_mutex_unlock(&mu);
}

static const topos_plugin plugin = {
    .abi = TOPOS_PLUGIN_ABI,
    .name = "fake",
    .nbackends = 0,
    .backends = NULL,
    .devices = devices,
    .bind_thread = bind_thread,
    .announce = announce,
    .retract = retract,
};

EXPORT int topos_plugin_init(const topos_plugin_options *opt,
                             const topos_plugin **out, char *err,
                             size_t errlen) {
  if (opt && opt->abi != TOPOS_PLUGIN_ABI) {
    snprintf(err, errlen, "fake: ABI %d", opt->abi);
    return -1;
  }
  *out = &plugin;
  return 0;
}
