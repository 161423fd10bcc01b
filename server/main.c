/*
 * main.c - toposd: configuration, store, cache, gRPC front, signals.
 *
 * Start-up prints exactly one line on stdout, "toposd listening on
 * HOST:PORT" with the port actually bound, and flushes it: scripts and
 * tests wait for that line.  Everything else goes to stderr (log.c).
 * SIGTERM or SIGINT starts the drain (rpc.c); a second one cancels the
 * in-flight work at once.  The exit status is 0 after a drain, 1 when the
 * daemon could not start, 2 on a usage error.
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "backends.h"
#include "cache.h"
#include "config.h"
#include "daemon.h"
#include "http.h"
#include "listener.h"
#include "log.h"
#include "notify.h"
#include "rpc.h"
#include "store.h"
#include "version.h"

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
  (void)sig;
  if (stop_requested < 2) stop_requested++;
}

/* Spec retention's question (store.h, store_in_use_fn): is spec `id` in
 * use?  Its network's cache entry ("net <id>", specs.c) is referenced by
 * every call that uses the spec, from before its plan is made until its
 * run ends, and pinned while it is loaded.  cache_drop answers and, when
 * the spec is not in use, drops the cached network and plans with the
 * check, so a dropped spec is not served from memory afterwards. */
static bool spec_in_use(void *cache_of_daemon, const char *id) {
  char key[80];
  snprintf(key, sizeof key, "net %s", id);
  return !cache_drop(cache_of_daemon, key);
}

/* mkdir -p of the directory part of path.  Folders it creates are 0700:
 * the store holds what clients recorded.  Existing ones keep their mode. */
static int make_parent_dirs(const char *path, char *msg, size_t msglen) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir) return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      snprintf(msg, msglen, "cannot create %.900s: %s", dir, strerror(errno));
      return -1;
    }
    *p = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(msg, msglen, "cannot create %.900s: %s", dir, strerror(errno));
    return -1;
  }
  return 0;
}

/* Whether a --listen or --http address (HOST:PORT, checked by the
 * configuration) names a loopback host. */
static bool listen_is_loopback(const char *address) {
  char host[300];
  int port = 0;
  char msg[256];
  if (config_split_listen(address, host, sizeof host, &port, msg, sizeof msg) !=
      0)
    return false;
  return auth_host_is_loopback(host);
}

int main(int argc, char **argv) {
  toposd_config cfg;
  config_defaults(&cfg);
  char msg[1024] = {0};
  int parsed = config_parse(&cfg, argc, argv, msg, sizeof msg);
  if (parsed == 1) return 0;
  if (parsed != 0) {
    fprintf(stderr, "toposd: %s\n", msg);
    return 2;
  }
  log_set_format(cfg.log_format);
  log_set_level(cfg.log_level);
  log_set_requests(cfg.log_requests, cfg.log_sample);
  /* TLS files are read and checked first: a bad one stops the daemon now,
   * naming the file, not at every client's handshake.  listener_start
   * reads them again when it makes gRPC's credentials. */
  {
    listener_tls tls;
    if (listener_tls_load(&cfg, &tls, msg, sizeof msg) != 0) {
      fprintf(stderr, "toposd: %s\n", msg);
      return 1;
    }
    listener_tls_free(&tls);
  }

  /* The addresses are bound (or tried) before the store is touched: a
   * port in use stops the daemon here, with no store file made. */
  int listen_fd = -1;
  if (cfg.tls_cert[0] == '\0') {
    listen_fd = listener_bind(&cfg, msg, sizeof msg);
    if (listen_fd < 0) {
      fprintf(stderr, "toposd: %s\n", msg);
      return 1;
    }
  } else if (listener_probe(cfg.listen, msg, sizeof msg) != 0) {
    fprintf(stderr, "toposd: %s\n", msg);
    return 1;
  }
  if (cfg.http[0] != '\0' && listener_probe(cfg.http, msg, sizeof msg) != 0) {
    fprintf(stderr, "toposd: http: %s\n", msg);
    return 1;
  }

  /* Exact backends reproduce the reference's bits, so registering them
   * changes no reply; envelope ones serve only `fast` entries. */
  topos_plugin_options popt = {.abi = TOPOS_PLUGIN_ABI,
                               .off = cfg.devices_off,
                               .ndevices = cfg.ndevices,
                               .pool_bytes = (uint64_t)cfg.device_pool_bytes,
                               .cache_bytes = (uint64_t)cfg.device_cache_bytes};
  memcpy(popt.devices, cfg.devices, sizeof popt.devices);
  topos_backends_register_with(&popt);
  {
    char plugins[512];
    topos_backends_plugin_report(plugins, sizeof plugins);
    log_event("backends", "%s", plugins);
  }
  /* What runs free stays in the engine's pool only up to pool_bytes. */
  topos_pool_set_cap((size_t)cfg.pool_bytes);
  if (strcmp(cfg.test_backend, "flip-test") == 0)
    topos_backend_register(topos_flip_test_backend());

  /* Signals: a flag the completion-queue loop polls.  SIGPIPE would kill
   * the daemon when a log reader goes away. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (make_parent_dirs(cfg.store, msg, sizeof msg) != 0) {
    fprintf(stderr, "toposd: %s\n", msg);
    return 1;
  }
  topos_error err = {0};
  topos_store *store = store_open(cfg.store, &err);
  if (store == NULL) {
    fprintf(stderr, "toposd: store %s: %s\n", cfg.store, err.message);
    return 1;
  }
  if (store_set_blob_cap(store, cfg.blob_cap_bytes, &err) != TOPOS_OK) {
    fprintf(stderr, "toposd: blob cap: %s\n", err.message);
    store_close(store);
    return 1;
  }
  /* Before the blob writer opens its handle: the budget is kept in the
   * file, where every handle reads it. */
  if (store_set_store_budget(store, cfg.store_bytes, &err) != TOPOS_OK) {
    fprintf(stderr, "toposd: store budget: %s\n", err.message);
    store_close(store);
    return 1;
  }
  /* Safe defaults (docs/operations.md): without tenants the daemon takes
   * every call, so it serves loopback addresses only.  A non-loopback
   * address turns auth on for good, even if the last tenant goes later. */
  const char *exposed = NULL;
  if (!listen_is_loopback(cfg.listen))
    exposed = cfg.listen;
  else if (cfg.http[0] != '\0' && !listen_is_loopback(cfg.http))
    exposed = cfg.http;
  int64_t tenants = 0;
  if (store_tenant_count(store, &tenants, &err) != TOPOS_OK) {
    fprintf(stderr, "toposd: store %s: %s\n", cfg.store, err.message);
    store_close(store);
    return 1;
  }
  if (exposed != NULL && tenants == 0) {
    fprintf(stderr,
            "toposd: refusing to serve %s: it is not a loopback address and "
            "the store %s has no tenants, so anyone who can reach it could "
            "use this daemon.  Create a tenant and a token first ('topos "
            "tenant add NAME --store %s', then 'topos token create NAME "
            "--store %s') and give clients the token (TOPOS_TOKEN), or listen "
            "on 127.0.0.1 (docs/operations.md)\n",
            exposed, cfg.store, cfg.store, cfg.store);
    store_close(store);
    return 1;
  }
  /* Tokens are secrets: on a network they travel inside TLS, or in the
   * clear only when the operator says so (--insecure).  The gateway
   * serves TLS with the same certificate as gRPC. */
  const char *clear[2] = {NULL, NULL}; /* gRPC's, the gateway's */
  if (!listen_is_loopback(cfg.listen) && cfg.tls_cert[0] == '\0')
    clear[0] = cfg.listen;
  if (cfg.http[0] != '\0' && !listen_is_loopback(cfg.http) &&
      cfg.tls_cert[0] == '\0')
    clear[1] = cfg.http;
  for (int i = 0; i < 2; i++) {
    if (clear[i] == NULL) continue;
    if (cfg.insecure) {
      log_event("start",
                "serving %s without TLS (--insecure): tokens cross the "
                "network in clear text",
                clear[i]);
      continue;
    }
    fprintf(stderr,
            "toposd: refusing to serve %s without TLS: it is not a loopback "
            "address, and the bearer tokens of every call would cross the "
            "network in clear text.  %s, or pass --insecure to serve it in "
            "clear anyway (on a network you trust) (docs/operations.md)\n",
            clear[i],
            i == 0 ? "Give the daemon a certificate (--tls-cert FILE "
                     "--tls-key FILE)"
                   : "Give the daemon a certificate (--tls-cert FILE "
                     "--tls-key FILE: the gateway then serves HTTPS), keep "
                     "--http on 127.0.0.1, or set --http off");
    store_close(store);
    return 1;
  }
  auth *authn = auth_open(cfg.store, exposed != NULL, &err);
  if (authn != NULL) auth_set_fail_limit(authn, (int)cfg.auth_fail_limit);
  if (authn == NULL) {
    fprintf(stderr, "toposd: store %s: %s\n", cfg.store, err.message);
    store_close(store);
    return 1;
  }
  log_event("start", "auth: %lld tenant%s%s", (long long)tenants,
            tenants == 1 ? "" : "s",
            exposed != NULL ? "; a token is required on every call"
            : tenants > 0   ? "; a token is required on every call"
                            : "; no token required (loopback only)");
  cache *c = cache_new(cfg.cache_entries, cfg.cache_bytes);
  if (c == NULL) {
    fprintf(stderr, "toposd: out of memory\n");
    auth_close(authn);
    store_close(store);
    return 1;
  }
  if (store_set_spec_budget(store, cfg.spec_bytes, spec_in_use, c, &err) !=
      TOPOS_OK) {
    fprintf(stderr, "toposd: spec budget: %s\n", err.message);
    cache_free(c);
    auth_close(authn);
    store_close(store);
    return 1;
  }
  blob_writer *blobs = blob_writer_start(cfg.store, cfg.blob_cap_bytes,
                                         cfg.blob_pending_bytes, &err);
  if (blobs == NULL) {
    fprintf(stderr, "toposd: store %s: %s\n", cfg.store, err.message);
    cache_free(c);
    auth_close(authn);
    store_close(store);
    return 1;
  }
  daemon_state d;
  memset(&d, 0, sizeof d);
  d.cfg = &cfg;
  d.store = store;
  d.cache = c;
  d.blobs = blobs;
  d.auth = authn;
  d.listen_fd = listen_fd;

  grpc_init();
  char bound[300];
  rpc_server *server =
      rpc_server_start(&d, bound, sizeof bound, msg, sizeof msg);
  if (server == NULL) {
    fprintf(stderr, "toposd: %s\n", msg);
    grpc_shutdown();
    blob_writer_stop(blobs);
    cache_free(c);
    auth_close(authn);
    store_close(store);
    return 1;
  }
  char http_bound[300] = "";
  http_server *http = NULL;
  if (cfg.http[0] != '\0') {
    http = http_server_start(&d, server, http_bound, sizeof http_bound, msg,
                             sizeof msg);
    if (http == NULL) {
      fprintf(stderr, "toposd: %s\n", msg);
      volatile sig_atomic_t stop = 2;
      rpc_server_run(server, &stop);
      rpc_server_destroy(server);
      grpc_shutdown();
      blob_writer_stop(blobs);
      cache_free(c);
      auth_close(authn);
      store_close(store);
      return 1;
    }
  }
  /* One write, so a reader waiting for the first line has both. */
  if (http != NULL)
    printf("toposd listening on %s\ntoposd http on %s\n", bound, http_bound);
  else
    printf("toposd listening on %s\n", bound);
  fflush(stdout);
  log_event("start",
            "toposd %s on %s: store %s, %d workers, queue %d, max message %lld "
            "bytes",
            TOPOSD_VERSION, bound, cfg.store, cfg.workers, cfg.queue,
            (long long)cfg.max_message_bytes);
  if (http != NULL)
    log_event("start", "http gateway on %s%s%s", http_bound,
              cfg.tls_cert[0] ? " over TLS (https)" : "",
              cfg.tls_client_ca[0] ? ", client certificates required" : "");
  {
    char status[700];
    snprintf(status, sizeof status, "serving on %s%s%s", bound,
             http != NULL ? ", http on " : "", http != NULL ? http_bound : "");
    notify_ready(status);
  }

  int rc = rpc_server_run(server, &stop_requested);
  if (rc != 0) {
    /* A worker is stuck inside one engine call: leave without touching
     * what it may still use.  Every acknowledged write is already durable
     * (the store commits with synchronous=FULL). */
    log_event("stop", "exiting with work abandoned");
    _exit(0);
  }
  /* The workers are joined: every HTTP call is answered; the loop sends
   * the last responses and closes. */
  http_server_stop(http);
  rpc_server_destroy(server);
  grpc_shutdown();
  blob_writer_stop(blobs); /* writes what is pending */
  cache_free(c);
  auth_close(authn);
  store_close(store);
  log_event("stop", "drained; store closed");
  return 0;
}
