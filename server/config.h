/*
 * config.h - toposd's configuration: defaults, an optional JSON file
 * (cJSON) and command-line flags, in that order of precedence (a flag
 * overrides the file, the file overrides the default).
 */
#ifndef TOPOSD_CONFIG_H
#define TOPOSD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum log_format { LOG_TEXT = 0, LOG_JSON = 1 } log_format;
/* Lines below the level are not written (--log-level). */
typedef enum log_level {
  LOG_DEBUG = 0,
  LOG_INFO = 1,
  LOG_WARN = 2,
  LOG_ERROR = 3
} log_level;
/* Which request lines are written (--log-requests): all, only those with
 * a status other than OK, one OK line in N (every error line), none. */
typedef enum log_requests {
  LOG_REQUESTS_ALL = 0,
  LOG_REQUESTS_ERRORS = 1,
  LOG_REQUESTS_SAMPLE = 2,
  LOG_REQUESTS_NONE = 3
} log_requests;

typedef struct toposd_config {
  char listen[256]; /* HOST:PORT; port 0 picks an ephemeral one */
  char store[4096]; /* SQLite file; its directory is created */
  int workers;      /* worker threads; default: online cores */
  int64_t spin_us;  /* idle workers and the queue thread poll this long */
  /* Train streams: when a stream's next message is read (rpc.c). */
  enum { READ_AHEAD_AUTO, READ_AHEAD_ALWAYS, READ_AHEAD_NEVER } read_ahead;
  int64_t max_message_bytes; /* both directions; at most INT32_MAX */
  int queue;                 /* job queue capacity */
  int64_t deadline_ms;       /* applied when a client sets none; 0 = none */
  log_format log_format;
  log_level log_level;
  log_requests log_requests;
  int64_t log_sample;         /* N of sample:N */
  int64_t blob_cap_bytes;     /* the store's blob cap */
  int64_t blob_pending_bytes; /* uploads not yet in the store; 0 = sync */
  int cache_entries;          /* networks, plans and decoded blobs */
  int64_t cache_bytes;        /* memory the cached entries keep */
  int64_t grace_ms;           /* shutdown: in-flight work gets this long */
  int64_t auth_fail_limit;    /* failed authentications per peer per minute
                                 before it is throttled; 0 = never */
  char test_backend[32];      /* a test backend to register ("" = none) */
  /* Connections (rpc.c, docs/daemon.md "Hostile load"). */
  int max_connections;     /* open client connections at once */
  int64_t idle_timeout_ms; /* a connection that sent nothing this long is
                            * shed when descriptors or the cap run short;
                            * gRPC also closes connections idle (no call)
                            * this long */
  /* Memory admission (runs.c): the peak bytes of one run, and of all runs
   * in flight together. */
  int64_t run_bytes;
  int64_t memory_bytes;
  /* Freed tensor buffers the engine's pool keeps for later runs (the
   * rest go back to the system). */
  int64_t pool_bytes;
  /* Retention (specs.c, store.c): stored spec bytes kept before the least
   * recently used unreferenced spec is dropped, and the whole store file. */
  int64_t spec_bytes;
  int64_t store_bytes;
  /* The HTTP gateway (http.c, gateway.c): its address ("" = off), and
   * the limits of one connection. */
  char http[256];
  int64_t http_header_bytes;    /* request line and headers */
  int64_t http_body_bytes;      /* one request's body */
  int64_t http_read_timeout_ms; /* a request's headers, and each gap in
                                 * its body, must arrive within this */
  int64_t http_idle_timeout_ms; /* a keep-alive connection idle this long
                                 * is closed */
  int http_max_connections;     /* open HTTP connections at once */
  /* Accelerators (backends/plugin.h): which devices the plugins use
   * (ndevices 0 = all; devices_off: none, the plugins are not loaded),
   * and the device bytes for each one's buffer pool and blob cache (0 =
   * the plugin's defaults). */
  bool devices_off;
  int ndevices;
  int devices[16];
  int64_t device_pool_bytes;
  int64_t device_cache_bytes;
  /* TLS on the gRPC port (listener.c, docs/operations.md "TLS"): the
   * server's certificate chain and key (PEM, both or neither; "" = no
   * TLS), and a CA bundle that client certificates must chain to ("" =
   * no client certificate asked).  The files are read at start. */
  char tls_cert[4096];
  char tls_key[4096];
  char tls_client_ca[4096];
  /* Serve a non-loopback address in plain text anyway (main.c's rule). */
  bool insecure;
} toposd_config;

/* Whether NAME (flag spelling, without the dashes) is a setting. */
bool config_known(const char *name);

/* Fills *cfg with the defaults. */
void config_defaults(toposd_config *cfg);

/* Parses argv (a --config FILE is read first, wherever it appears, then
 * every other flag).  Returns 0 to run, 1 when --help or --version was
 * answered on stdout (exit 0), -1 on an error written to msg (exit 2). */
int config_parse(toposd_config *cfg, int argc, char **argv, char *msg,
                 size_t msglen);

/* Reads a JSON object of the same settings (keys as the flags, with '_'
 * for '-': "listen", "max_message_bytes", ...).  Unknown keys are errors,
 * so a typo never silently falls back to a default.  Returns 0 or -1. */
int config_load_json(toposd_config *cfg, const char *path, char *msg,
                     size_t msglen);

/* Splits a listen address strictly: HOST:PORT with HOST a name or an
 * IPv4 literal, or [IPV6]:PORT, and PORT decimal in 0..65535 (0 picks a
 * free port).  host gets HOST without brackets.  Returns 0, or -1 with
 * msg saying what is wrong. */
int config_split_listen(const char *text, char *host, size_t hostlen, int *port,
                        char *msg, size_t msglen);

/* The usage text printed by --help. */
extern const char config_usage[];

#endif /* TOPOSD_CONFIG_H */
