/*
 * defaults.c - the default backend registry of programs that link the
 * backends library, and the loader of backend plugins (plugin.h).
 *
 * It names every built-in backend directly, so linking this file pulls
 * each backend's object out of the archive: a weak reference would not
 * (an archive member is only loaded for a strong undefined symbol), which
 * is how toposd once ran without `blas` while believing it had it.
 *
 * Plugins (libtopos_cuda.so) are found at run time: $TOPOS_CUDA_PLUGIN
 * if set, else next to the executable, else in ../lib from it (the build
 * tree's layout: build/bin, build/tests -> build/lib), else in
 * ../lib/topos (where `make install` puts it: sbin/ -> lib/topos).
 * TOPOS_CUDA=off skips the search.  A plugin that is missing, fails to load
 * (its own libraries absent) or finds no device is reported, never fatal.  A
 * plugin's backends are registered before `cpu`: a GPU that is there is
 * preferred for the tasks it takes (its `supports` leaves small ones to
 * the CPU), and under exact numerics either gives the same bits.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "blas.h"

typedef struct plugin_slot {
  const char *name; /* "cuda" */
  const topos_plugin *plugin;
  char report[256];
} plugin_slot;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool registered;
static plugin_slot slots[] = {{.name = "cuda"}};
#define NSLOTS ((int)(sizeof slots / sizeof slots[0]))

/* The directory of this executable, with a trailing '/', or "". */
static void exe_dir(char *buf, size_t len) {
  buf[0] = 0;
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = 0;
  char *slash = strrchr(path, '/');
  if (!slash) return;
  slash[1] = 0;
  snprintf(buf, len, "%s", path);
}

int topos_plugin_load(const char *path, const topos_plugin_options *opt,
                      const topos_plugin **out, char *err, size_t errlen) {
  *out = NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "%s", dlerror());
    return -1;
  }
  topos_plugin_init_fn init;
  void *sym = dlsym(h, TOPOS_PLUGIN_ENTRY);
  memcpy(&init, &sym, sizeof init);
  if (!sym) {
    snprintf(err, errlen, "%s: no %s: not a topos plugin", path,
             TOPOS_PLUGIN_ENTRY);
    dlclose(h);
    return -1;
  }
  topos_plugin_options dflt = {.abi = TOPOS_PLUGIN_ABI};
  const topos_plugin *p = NULL;
  char why[192] = "";
  /* The handle stays open even when init refuses: a CUDA runtime that
   * looked for a device has registered process-exit work. */
  if (init(opt ? opt : &dflt, &p, why, sizeof why) != 0 || !p) {
    snprintf(err, errlen, "%s", why[0] ? why : "the plugin refused to start");
    return -1;
  }
  if (p->abi != TOPOS_PLUGIN_ABI) {
    snprintf(err, errlen, "%s: plugin ABI %d, this program speaks %d", path,
             p->abi, TOPOS_PLUGIN_ABI);
    return -1;
  }
  for (int i = 0; i < p->nbackends; i++) {
    int rc = topos_backend_register(p->backends[i]);
    if (rc != TOPOS_OK) {
      snprintf(err, errlen, "%s: registering '%s' failed (%s)", path,
               p->backends[i]->name, topos_status_name(rc));
      return -1;
    }
  }
  *out = p;
  return 0;
}

/* Finds and loads slot s's plugin; fills its report either way. */
static void load_slot(plugin_slot *s, const topos_plugin_options *opt) {
  char env[32];
  snprintf(env, sizeof env, "TOPOS_%s", s->name);
  for (char *c = env; *c; c++)
    if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
  const char *mode = getenv(env);
  if (mode && (!strcmp(mode, "off") || !strcmp(mode, "0"))) {
    snprintf(s->report, sizeof s->report, "%s: off (%s=%s)", s->name, env,
             mode);
    return;
  }
  if (opt && opt->off) {
    snprintf(s->report, sizeof s->report, "%s: off (no devices asked for)",
             s->name);
    return;
  }
  char var[48], dir[PATH_MAX], cand[3][PATH_MAX + 64];
  snprintf(var, sizeof var, "%s_PLUGIN", env);
  int ncand = 0;
  const char *given = getenv(var);
  if (given && *given) {
    snprintf(cand[ncand++], sizeof cand[0], "%s", given);
  } else {
    exe_dir(dir, sizeof dir);
    snprintf(cand[ncand++], sizeof cand[0], "%slibtopos_%s.so", dir, s->name);
    snprintf(cand[ncand++], sizeof cand[0], "%s../lib/libtopos_%s.so", dir,
             s->name);
    snprintf(cand[ncand++], sizeof cand[0], "%s../lib/topos/libtopos_%s.so",
             dir, s->name);
  }
  for (int i = 0; i < ncand; i++) {
    if (access(cand[i], F_OK) != 0) continue;
    char why[200];
    if (topos_plugin_load(cand[i], opt, &s->plugin, why, sizeof why) == 0) {
      topos_device_info dev[TOPOS_DEVICES_MAX];
      int n =
          s->plugin->devices ? s->plugin->devices(dev, TOPOS_DEVICES_MAX) : 0;
      snprintf(s->report, sizeof s->report, "%s: %d device%s%s%s%s", s->name, n,
               n == 1 ? "" : "s", n > 0 ? " (" : "", n > 0 ? dev[0].name : "",
               n > 0 ? (n > 1 ? ", ...)" : ")") : "");
    } else {
      snprintf(s->report, sizeof s->report, "%s: not loaded: %s", s->name, why);
    }
    return;
  }
  snprintf(s->report, sizeof s->report, "%s: not built (no %s)", s->name,
           given && *given
               ? given
               : "libtopos_cuda.so beside, in ../lib or ../lib/topos");
}

void topos_backends_register_with(const topos_plugin_options *opt) {
  pthread_mutex_lock(&mu);
  if (!registered) {
    registered = true;
    for (int i = 0; i < NSLOTS; i++) load_slot(&slots[i], opt);
    topos_backend_register(topos_cpu_backend());
    topos_backend_register(topos_blas_backend());
  }
  pthread_mutex_unlock(&mu);
}

void topos_backends_register_defaults(void) {
  topos_backends_register_with(NULL);
}

/* The plugins, once registration has happened (NULL before). */
static const topos_plugin *plugin_at(int i) {
  pthread_mutex_lock(&mu);
  const topos_plugin *p = registered ? slots[i].plugin : NULL;
  pthread_mutex_unlock(&mu);
  return p;
}

void topos_backends_plugin_report(char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < NSLOTS && used < len; i++) {
    const char *r = slots[i].report[0] ? slots[i].report : "not tried";
    int w = snprintf(buf + used, len - used, "%s%s", i ? "; " : "", r);
    if (w < 0) break;
    used += (size_t)w;
  }
  pthread_mutex_unlock(&mu);
}

int topos_devices_list(topos_device_info *out, int max) {
  int total = 0;
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (!p || !p->devices) continue;
    int room = max - total > 0 ? max - total : 0;
    topos_device_info tmp[TOPOS_DEVICES_MAX];
    int n = p->devices(tmp, TOPOS_DEVICES_MAX);
    for (int j = 0; j < n && j < room; j++) out[total + j] = tmp[j];
    total += n;
  }
  return total;
}

bool topos_backend_uses_device(const char *backend) {
  bool any =
      backend == NULL || backend[0] == '\0' || strcmp(backend, "auto") == 0;
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (!p || !p->devices) continue;
    topos_device_info tmp[TOPOS_DEVICES_MAX];
    if (p->devices(tmp, TOPOS_DEVICES_MAX) <= 0) continue;
    if (any) return true;
    for (int k = 0; k < p->nbackends; k++)
      if (strcmp(p->backends[k]->name, backend) == 0) return true;
  }
  return false;
}

int topos_devices_bind_thread(int slot) {
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (p && p->bind_thread) return p->bind_thread(slot);
  }
  return -1;
}

bool topos_blob_announce_wanted(void) {
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (p && p->announce) return true;
  }
  return false;
}

int topos_blob_announce(const void *host, size_t bytes,
                        const uint8_t hash[32]) {
  int rc = 0;
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (p && p->announce && p->announce(host, bytes, hash) != 0) rc = -1;
  }
  return rc;
}

void topos_blob_retract(const void *host) {
  for (int i = 0; i < NSLOTS; i++) {
    const topos_plugin *p = plugin_at(i);
    if (p && p->retract) p->retract(host);
  }
}
