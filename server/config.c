/*
 * config.c - defaults, the JSON configuration file and the flags.
 *
 * Every setting can be given three ways with the same name: a default,
 * a key of the JSON file named by --config (words joined by '_'), and a
 * flag (words joined by '-').  Values are checked here, once, so the rest
 * of the daemon can trust them: a bad value is an error naming the
 * setting, never a silent fallback.
 */
#include "config.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"
#include "version.h"

const char config_usage[] =
    "usage: toposd [options]\n"
    "\n"
    "The topos compile-and-execute daemon (gRPC service topos.v1.Topos).\n"
    "\n"
    "  --config FILE            JSON file with any of the settings below\n"
    "                           (keys use '_': \"max_message_bytes\")\n"
    "  --listen HOST:PORT       address to serve (default 127.0.0.1:50051;\n"
    "                           port 0 picks a free port)\n"
    "  --store PATH             SQLite store (default ./var/topos.db; the\n"
    "                           directory is created)\n"
    "  --workers N              worker threads (default: online cores)\n"
    "  --spin-us N              a worker out of work, and the queue thread\n"
    "                           after an event, poll this long (yielding)\n"
    "                           before they sleep; 0 = sleep at once\n"
    "                           (default 200)\n"
    "  --stream-read-ahead WHEN auto|always|never: read a Train stream's\n"
    "                           next message while a step runs - when the\n"
    "                           client sends ahead (default auto), always,\n"
    "                           or never (with the reply)\n"
    "  --max-message-bytes N    largest request or reply (default 512M)\n"
    "  --queue N                job queue capacity; a full queue answers\n"
    "                           UNAVAILABLE (default 1024)\n"
    "  --deadline-ms N          deadline of calls that set none; 0 = none\n"
    "                           (default 60000)\n"
    "  --log-format text|json   request log format on stderr (default text)\n"
    "  --log-level LEVEL        debug|info|warn|error: lines below it are\n"
    "                           not written (default info; request lines\n"
    "                           are info when OK, warn or error when not)\n"
    "  --log-requests WHICH     all|errors|sample:N|none: every request\n"
    "                           line, those that failed, one OK line in N\n"
    "                           (each marked sample=N) and every failure,\n"
    "                           or none (default all)\n"
    "  --blob-cap-bytes N       bytes of uploaded blobs kept (default 1G)\n"
    "  --blob-pending-bytes N   early acknowledgement: up to N uploaded\n"
    "                           bytes may wait to be written to the store\n"
    "                           after PutBlob answered, and a kill -9 loses\n"
    "                           them; 0 = PutBlob answers once the blob is\n"
    "                           durable (default 0)\n"
    "  --cache-entries N        cached networks, plans and blobs (default\n"
    "                           256)\n"
    "  --cache-bytes N          memory of the cached networks, plans and\n"
    "                           blobs (default 1G)\n"
    "  --grace-ms N             on SIGTERM, how long in-flight work may run\n"
    "                           before it is cancelled (default 5000)\n"
    "  --auth-fail-limit N      failed authentications from one peer address\n"
    "                           within a minute before its calls are refused\n"
    "                           for a while, 1 s doubling to 60 s; 0 = never\n"
    "                           (default 20)\n"
    "  --max-connections N      client connections open at once; past it the\n"
    "                           longest-silent one is shed (default 1024)\n"
    "  --idle-timeout-ms N      a connection silent this long may be shed,\n"
    "                           and one with no call this long is closed\n"
    "                           (default 300000)\n"
    "  --run-bytes N            peak memory one Forward/Backward/Step may\n"
    "                           use; larger runs are RESOURCE_EXHAUSTED\n"
    "                           (default: a quarter of --memory-bytes)\n"
    "  --memory-bytes N         peak memory of all runs in flight together\n"
    "                           (default: half the machine's memory)\n"
    "  --pool-bytes N           freed tensor memory kept for later runs; the\n"
    "                           rest goes back to the system (default 256M)\n"
    "  --spec-bytes N           stored spec bytes kept; past it the least\n"
    "                           recently used unused spec is dropped\n"
    "                           (default 1G)\n"
    "  --store-bytes N          the store file's budget; a write past it is\n"
    "                           RESOURCE_EXHAUSTED (default 16G)\n"
    "  --http HOST:PORT|off      the HTTP JSON gateway's address (default\n"
    "                           127.0.0.1:8080; port 0 picks a free port)\n"
    "  --http-header-bytes N    largest request line and headers (default\n"
    "                           16K); more is 431\n"
    "  --http-body-bytes N      largest request body (default 64M); more is\n"
    "                           413\n"
    "  --http-read-timeout-ms N a request's headers, and every gap in its\n"
    "                           body, must arrive within this (default\n"
    "                           10000); else 408 and the connection closes\n"
    "  --http-idle-timeout-ms N a keep-alive connection idle this long is\n"
    "                           closed (default 60000)\n"
    "  --http-max-connections N HTTP connections open at once; past it the\n"
    "                           longest-idle one is closed (default 1024)\n"
    "  --devices LIST|all|none  the GPUs the CUDA backends use, by ordinal\n"
    "                           (\"0,2\"; default all); none loads no plugin\n"
    "  --device-pool-bytes N    device memory each GPU's buffer pool may\n"
    "                           keep (default: half the device)\n"
    "  --device-cache-bytes N   device memory for parameter blobs cached by\n"
    "                           content hash (default: a quarter)\n"
    "  --tls-cert FILE          serve gRPC over TLS with this certificate\n"
    "                           chain (PEM; needs --tls-key)\n"
    "  --tls-key FILE           the certificate's private key (PEM)\n"
    "  --tls-client-ca FILE     require client certificates signed by a CA\n"
    "                           of this PEM bundle (mTLS; needs --tls-cert)\n"
    "  --insecure               serve a non-loopback address without TLS\n"
    "                           (tokens cross the network in clear); without\n"
    "                           it such a daemon refuses to start\n"
    "  --test-backend NAME      also register a test backend: flip-test\n"
    "                           (claims exact, flips one GEMM bit; used\n"
    "                           only when named) for conformance tests\n"
    "  --help, --version\n"
    "\n"
    "Byte counts take a K, M or G suffix (powers of 1024).  On start the\n"
    "daemon prints 'toposd listening on HOST:PORT' on stdout, then\n"
    "'toposd http on HOST:PORT' unless --http is off.\n";

void config_defaults(toposd_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:50051");
  snprintf(cfg->store, sizeof cfg->store, "./var/topos.db");
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cfg->workers = cores > 0 ? (int)(cores < 256 ? cores : 256) : 2;
  cfg->spin_us = 200;
  cfg->max_message_bytes = (int64_t)512 << 20;
  cfg->queue = 1024;
  cfg->deadline_ms = 60000;
  cfg->log_format = LOG_TEXT;
  cfg->log_level = LOG_INFO;
  cfg->log_requests = LOG_REQUESTS_ALL;
  cfg->log_sample = 1;
  cfg->blob_cap_bytes = STORE_DEFAULT_BLOB_CAP;
  cfg->blob_pending_bytes = 0; /* durable PutBlob; > 0 opts into early acks */
  cfg->cache_entries = 256;
  cfg->cache_bytes = (int64_t)1 << 30;
  cfg->grace_ms = 5000;
  cfg->auth_fail_limit = 20;
  cfg->max_connections = 1024;
  cfg->idle_timeout_ms = 300000;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t ram =
      pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
  cfg->memory_bytes = ram / 2;
  cfg->run_bytes = 0; /* resolved by config_parse: memory_bytes / 4 */
  cfg->pool_bytes = (int64_t)256 << 20;
  cfg->spec_bytes = (int64_t)1 << 30;
  cfg->store_bytes = (int64_t)16 << 30;
  snprintf(cfg->http, sizeof cfg->http, "127.0.0.1:8080");
  cfg->http_header_bytes = (int64_t)16 << 10;
  cfg->http_body_bytes = (int64_t)64 << 20;
  cfg->http_read_timeout_ms = 10000;
  cfg->http_idle_timeout_ms = 60000;
  cfg->http_max_connections = 1024;
}

static int config_error(char *msg, size_t msglen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --devices: "all", "none", or distinct ordinals 0..63, comma-separated,
 * at most 16. */
static int parse_devices(toposd_config *cfg, const char *value, char *msg,
                         size_t msglen) {
  cfg->devices_off = false;
  cfg->ndevices = 0;
  if (strcmp(value, "all") == 0) return 0;
  if (strcmp(value, "none") == 0) {
    cfg->devices_off = true;
    return 0;
  }
  const char *p = value;
  for (;;) {
    if (*p < '0' || *p > '9')
      return config_error(msg, msglen,
                          "devices: '%s' is not all, none or a list of "
                          "device ordinals like 0,1",
                          value);
    long d = 0;
    while (*p >= '0' && *p <= '9' && d < 1000) d = d * 10 + (*p++ - '0');
    if (d > 63)
      return config_error(msg, msglen, "devices: ordinal %ld is not in 0..63",
                          d);
    for (int i = 0; i < cfg->ndevices; i++)
      if (cfg->devices[i] == d)
        return config_error(msg, msglen, "devices: %ld is listed twice", d);
    if (cfg->ndevices == 16)
      return config_error(msg, msglen, "devices: more than 16 devices");
    cfg->devices[cfg->ndevices++] = (int)d;
    if (*p == 0) return 0;
    if (*p++ != ',' || *p == 0)
      return config_error(msg, msglen,
                          "devices: '%s' is not a comma-separated list", value);
  }
}

static int config_error(char *msg, size_t msglen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, msglen, fmt, ap);
  va_end(ap);
  return -1;
}

/* A non-negative integer, optionally with a K/M/G suffix when `bytes`. */
static bool parse_int64(const char *s, bool bytes, int64_t *out) {
  if (s == NULL || *s == '\0' || *s == '-' || *s == '+') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return false;
  int shift = 0;
  if (bytes && *end != '\0' && end[1] == '\0') {
    switch (*end) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        return false;
    }
    end++;
  }
  if (*end != '\0') return false;
  if (v > (unsigned long long)(INT64_MAX >> shift)) return false;
  *out = (int64_t)(v << shift);
  return true;
}

int config_split_listen(const char *text, char *host, size_t hostlen, int *port,
                        char *msg, size_t msglen) {
  const char *colon = strrchr(text, ':');
  if (colon == NULL)
    return config_error(msg, msglen, "listen: '%s' is not HOST:PORT", text);
  const char *h = text;
  size_t hl = (size_t)(colon - text);
  if (hl > 0 && text[0] == '[') {
    if (text[hl - 1] != ']' || hl < 3)
      return config_error(msg, msglen,
                          "listen: '%s': an IPv6 host is written [ADDR]:PORT",
                          text);
    h = text + 1;
    hl -= 2;
    for (size_t i = 0; i < hl; i++)
      if (!(isxdigit((unsigned char)h[i]) || h[i] == ':' || h[i] == '.'))
        return config_error(
            msg, msglen, "listen: '%s': '%c' in an IPv6 address", text, h[i]);
  } else {
    if (hl == 0)
      return config_error(msg, msglen,
                          "listen: '%s' has no host (0.0.0.0 or [::] serve "
                          "every interface)",
                          text);
    for (size_t i = 0; i < hl; i++)
      if (!(isalnum((unsigned char)h[i]) || h[i] == '.' || h[i] == '-' ||
            h[i] == '_'))
        return config_error(msg, msglen,
                            "listen: '%s': '%c' in the host (IPv6 hosts go "
                            "in brackets; only TCP addresses are served)",
                            text, h[i]);
  }
  const char *p = colon + 1;
  size_t pl = strlen(p);
  bool digits = pl >= 1 && pl <= 5;
  for (size_t i = 0; digits && i < pl; i++)
    digits = isdigit((unsigned char)p[i]) != 0;
  long v = digits ? strtol(p, NULL, 10) : -1;
  if (v < 0 || v > 65535)
    return config_error(
        msg, msglen, "listen: '%s': the port '%s' is not in 0..65535", text, p);
  if (hl + 1 > hostlen)
    return config_error(msg, msglen, "listen: '%s': the host is too long",
                        text);
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = (int)v;
  return 0;
}

bool config_known(const char *name) {
  /* The usage text is the list: an option is known when a line of it
   * starts with "  --NAME" followed by a space, a comma or the line's end,
   * so --help and the parser cannot disagree. */
  size_t n = strlen(name);
  if (n == 0) return false;
  for (const char *p = strstr(config_usage, "\n  --"); p != NULL;
       p = strstr(p + 1, "\n  --")) {
    const char *opt = p + 5;
    if (strncmp(opt, name, n) == 0 &&
        (opt[n] == ' ' || opt[n] == ',' || opt[n] == '\n'))
      return true;
  }
  return false;
}

/* Applies one setting given by name (flag spelling, '-' or '_' alike). */
static int apply(toposd_config *cfg, const char *key, const char *value,
                 char *msg, size_t msglen) {
  char name[64];
  size_t n = strlen(key);
  if (n >= sizeof name)
    return config_error(msg, msglen, "unknown setting '%s'", key);
  for (size_t i = 0; i <= n; i++) name[i] = key[i] == '_' ? '-' : key[i];
  int64_t v = 0;
  if (strcmp(name, "listen") == 0) {
    char host[sizeof cfg->listen];
    int port = 0;
    if (strlen(value) >= sizeof cfg->listen)
      return config_error(msg, msglen, "listen: the address is too long");
    if (config_split_listen(value, host, sizeof host, &port, msg, msglen) != 0)
      return -1;
    snprintf(cfg->listen, sizeof cfg->listen, "%s", value);
  } else if (strcmp(name, "store") == 0) {
    if (value[0] == '\0' || strlen(value) >= sizeof cfg->store)
      return config_error(msg, msglen, "store: bad path '%s'", value);
    snprintf(cfg->store, sizeof cfg->store, "%s", value);
  } else if (strcmp(name, "workers") == 0) {
    if (!parse_int64(value, false, &v) || v < 1 || v > 1024)
      return config_error(msg, msglen, "workers: '%s' is not in 1..1024",
                          value);
    cfg->workers = (int)v;
  } else if (strcmp(name, "spin-us") == 0) {
    if (!parse_int64(value, false, &v) || v > 100000)
      return config_error(msg, msglen, "spin-us: '%s' is not in 0..100000",
                          value);
    cfg->spin_us = v;
  } else if (strcmp(name, "stream-read-ahead") == 0) {
    if (strcmp(value, "auto") == 0)
      cfg->read_ahead = READ_AHEAD_AUTO;
    else if (strcmp(value, "always") == 0)
      cfg->read_ahead = READ_AHEAD_ALWAYS;
    else if (strcmp(value, "never") == 0)
      cfg->read_ahead = READ_AHEAD_NEVER;
    else
      return config_error(
          msg, msglen, "stream-read-ahead: '%s' is not auto, always or never",
          value);
  } else if (strcmp(name, "max-message-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 1024 || v > INT32_MAX)
      return config_error(msg, msglen,
                          "max-message-bytes: '%s' is not in 1K..2147483647",
                          value);
    cfg->max_message_bytes = v;
  } else if (strcmp(name, "queue") == 0) {
    if (!parse_int64(value, false, &v) || v < 1 || v > 1000000)
      return config_error(msg, msglen, "queue: '%s' is not in 1..1000000",
                          value);
    cfg->queue = (int)v;
  } else if (strcmp(name, "deadline-ms") == 0) {
    if (!parse_int64(value, false, &v) || v > (int64_t)1 << 40)
      return config_error(msg, msglen, "deadline-ms: '%s' is not a duration",
                          value);
    cfg->deadline_ms = v;
  } else if (strcmp(name, "log-level") == 0) {
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    int found = -1;
    for (int i = 0; i < 4; i++)
      if (strcmp(value, levels[i]) == 0) found = i;
    if (found < 0)
      return config_error(msg, msglen,
                          "log-level: '%s' is not debug, info, warn or error",
                          value);
    cfg->log_level = (log_level)found;
  } else if (strcmp(name, "log-requests") == 0) {
    if (strcmp(value, "all") == 0) {
      cfg->log_requests = LOG_REQUESTS_ALL;
    } else if (strcmp(value, "errors") == 0) {
      cfg->log_requests = LOG_REQUESTS_ERRORS;
    } else if (strcmp(value, "none") == 0) {
      cfg->log_requests = LOG_REQUESTS_NONE;
    } else if (strncmp(value, "sample:", 7) == 0 &&
               parse_int64(value + 7, false, &v) && v >= 1 && v <= 1000000000) {
      cfg->log_requests = LOG_REQUESTS_SAMPLE;
      cfg->log_sample = v;
    } else {
      return config_error(msg, msglen,
                          "log-requests: '%s' is not all, errors, "
                          "sample:N (N in 1..1e9) or none",
                          value);
    }
  } else if (strcmp(name, "log-format") == 0) {
    if (strcmp(value, "text") == 0) {
      cfg->log_format = LOG_TEXT;
    } else if (strcmp(value, "json") == 0) {
      cfg->log_format = LOG_JSON;
    } else {
      return config_error(msg, msglen, "log-format: '%s' is not text or json",
                          value);
    }
  } else if (strcmp(name, "blob-cap-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 1)
      return config_error(msg, msglen, "blob-cap-bytes: '%s' is not a size",
                          value);
    cfg->blob_cap_bytes = v;
  } else if (strcmp(name, "blob-pending-bytes") == 0) {
    if (!parse_int64(value, true, &v))
      return config_error(msg, msglen, "blob-pending-bytes: '%s' is not a size",
                          value);
    cfg->blob_pending_bytes = v;
  } else if (strcmp(name, "cache-entries") == 0) {
    if (!parse_int64(value, false, &v) || v < 1 || v > 1000000)
      return config_error(msg, msglen,
                          "cache-entries: '%s' is not in 1..1000000", value);
    cfg->cache_entries = (int)v;
  } else if (strcmp(name, "cache-bytes") == 0) {
    if (!parse_int64(value, true, &v))
      return config_error(msg, msglen, "cache-bytes: '%s' is not a size",
                          value);
    cfg->cache_bytes = v;
  } else if (strcmp(name, "auth-fail-limit") == 0) {
    if (!parse_int64(value, false, &v) || v > 1000000)
      return config_error(msg, msglen,
                          "auth-fail-limit: '%s' is not in 0..1000000", value);
    cfg->auth_fail_limit = v;
  } else if (strcmp(name, "grace-ms") == 0) {
    if (!parse_int64(value, false, &v) || v > 3600000)
      return config_error(msg, msglen, "grace-ms: '%s' is not in 0..3600000",
                          value);
    cfg->grace_ms = v;
  } else if (strcmp(name, "max-connections") == 0) {
    if (!parse_int64(value, false, &v) || v < 1 || v > 1000000)
      return config_error(msg, msglen,
                          "max-connections: '%s' is not in 1..1000000", value);
    cfg->max_connections = (int)v;
  } else if (strcmp(name, "idle-timeout-ms") == 0) {
    if (!parse_int64(value, false, &v) || v < 100 || v > (int64_t)1 << 40)
      return config_error(msg, msglen,
                          "idle-timeout-ms: '%s' is not a duration of at "
                          "least 100",
                          value);
    cfg->idle_timeout_ms = v;
  } else if (strcmp(name, "pool-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 0)
      return config_error(msg, msglen, "pool-bytes: '%s' is not a size", value);
    cfg->pool_bytes = v;
  } else if (strcmp(name, "run-bytes") == 0 ||
             strcmp(name, "memory-bytes") == 0 ||
             strcmp(name, "spec-bytes") == 0 ||
             strcmp(name, "store-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 1024)
      return config_error(msg, msglen, "%s: '%s' is not a size of at least 1K",
                          name, value);
    if (strcmp(name, "run-bytes") == 0)
      cfg->run_bytes = v;
    else if (strcmp(name, "memory-bytes") == 0)
      cfg->memory_bytes = v;
    else if (strcmp(name, "spec-bytes") == 0)
      cfg->spec_bytes = v;
    else
      cfg->store_bytes = v;
  } else if (strcmp(name, "http") == 0) {
    char host[sizeof cfg->http];
    int port = 0;
    if (strlen(value) >= sizeof cfg->http)
      return config_error(msg, msglen, "http: the address is too long");
    if (strcmp(value, "off") == 0) {
      cfg->http[0] = '\0';
      return 0;
    }
    if (config_split_listen(value, host, sizeof host, &port, msg, msglen) != 0)
      return -1;
    snprintf(cfg->http, sizeof cfg->http, "%s", value);
  } else if (strcmp(name, "http-header-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 1024 || v > (1 << 20))
      return config_error(msg, msglen,
                          "http-header-bytes: '%s' is not in 1K..1M", value);
    cfg->http_header_bytes = v;
  } else if (strcmp(name, "http-body-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < 1024 || v > INT32_MAX)
      return config_error(
          msg, msglen, "http-body-bytes: '%s' is not in 1K..2147483647", value);
    cfg->http_body_bytes = v;
  } else if (strcmp(name, "http-read-timeout-ms") == 0 ||
             strcmp(name, "http-idle-timeout-ms") == 0) {
    if (!parse_int64(value, false, &v) || v < 100 || v > (int64_t)1 << 40)
      return config_error(msg, msglen,
                          "%s: '%s' is not a duration of at least 100", name,
                          value);
    if (name[5] == 'r')
      cfg->http_read_timeout_ms = v;
    else
      cfg->http_idle_timeout_ms = v;
  } else if (strcmp(name, "http-max-connections") == 0) {
    if (!parse_int64(value, false, &v) || v < 1 || v > 1000000)
      return config_error(msg, msglen,
                          "http-max-connections: '%s' is not in 1..1000000",
                          value);
    cfg->http_max_connections = (int)v;
  } else if (strcmp(name, "devices") == 0) {
    return parse_devices(cfg, value, msg, msglen);
  } else if (strcmp(name, "device-pool-bytes") == 0 ||
             strcmp(name, "device-cache-bytes") == 0) {
    if (!parse_int64(value, true, &v) || v < (int64_t)1 << 20)
      return config_error(msg, msglen, "%s: '%s' is not a size of at least 1M",
                          name, value);
    if (strcmp(name, "device-pool-bytes") == 0)
      cfg->device_pool_bytes = v;
    else
      cfg->device_cache_bytes = v;
  } else if (strcmp(name, "tls-cert") == 0 || strcmp(name, "tls-key") == 0 ||
             strcmp(name, "tls-client-ca") == 0) {
    char *field = strcmp(name, "tls-cert") == 0  ? cfg->tls_cert
                  : strcmp(name, "tls-key") == 0 ? cfg->tls_key
                                                 : cfg->tls_client_ca;
    if (value[0] == '\0' || strlen(value) >= sizeof cfg->tls_cert)
      return config_error(msg, msglen, "%s: bad path '%s'", name, value);
    snprintf(field, sizeof cfg->tls_cert, "%s", value);
  } else if (strcmp(name, "insecure") == 0) {
    if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
      cfg->insecure = true;
    else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
      cfg->insecure = false;
    else
      return config_error(msg, msglen, "insecure: '%s' is not true or false",
                          value);
  } else if (strcmp(name, "test-backend") == 0) {
    if (strcmp(value, "flip-test") != 0)
      return config_error(msg, msglen,
                          "test-backend: '%s' is not a test backend "
                          "(flip-test)",
                          value);
    snprintf(cfg->test_backend, sizeof cfg->test_backend, "%s", value);
  } else {
    return config_error(msg, msglen, "unknown setting '%s'", key);
  }
  return 0;
}

int config_load_json(toposd_config *cfg, const char *path, char *msg,
                     size_t msglen) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return config_error(msg, msglen, "config %s: %s", path, strerror(errno));
  char *text = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      if (cap > ((size_t)16 << 20)) {
        rc = config_error(msg, msglen, "config %s: larger than 16 MiB", path);
        break;
      }
      char *grown = realloc(text, cap);
      if (grown == NULL) {
        rc = config_error(msg, msglen, "config %s: out of memory", path);
        break;
      }
      text = grown;
    }
    size_t got = fread(text + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  if (rc == 0 && ferror(f))
    rc = config_error(msg, msglen, "config %s: read error", path);
  fclose(f);
  if (rc != 0) {
    free(text);
    return rc;
  }
  text[len] = '\0';
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (root == NULL || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return config_error(msg, msglen, "config %s: not a JSON object", path);
  }
  for (cJSON *it = root->child; it != NULL && rc == 0; it = it->next) {
    char value[4096];
    if (cJSON_IsString(it)) {
      snprintf(value, sizeof value, "%s", it->valuestring);
    } else if (cJSON_IsBool(it)) {
      snprintf(value, sizeof value, "%s", cJSON_IsTrue(it) ? "true" : "false");
    } else if (cJSON_IsNumber(it)) {
      double d = it->valuedouble;
      if (!(d >= 0 && d <= 9.2e18) || d != (double)(int64_t)d) {
        rc = config_error(msg, msglen, "config %s: %s must be a whole number",
                          path, it->string);
        break;
      }
      snprintf(value, sizeof value, "%lld", (long long)d);
    } else {
      rc = config_error(msg, msglen,
                        "config %s: %s must be a string, a number or a "
                        "boolean",
                        path, it->string ? it->string : "?");
      break;
    }
    if (strcmp(it->string, "config") == 0) {
      rc = config_error(msg, msglen, "config %s: 'config' cannot nest", path);
      break;
    }
    char inner[512];
    if (apply(cfg, it->string, value, inner, sizeof inner) != 0)
      rc = config_error(msg, msglen, "config %s: %s", path, inner);
  }
  cJSON_Delete(root);
  return rc;
}

int config_parse(toposd_config *cfg, int argc, char **argv, char *msg,
                 size_t msglen) {
  /* --help and --version win over everything; --config is read before
   * the other flags so that flags override the file. */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(config_usage, stdout);
      return 1;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf("toposd %s\n", TOPOSD_VERSION);
      return 1;
    }
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *eq = strncmp(arg, "--config", 8) == 0 ? arg + 8 : NULL;
    if (eq == NULL || (*eq != '\0' && *eq != '=')) continue;
    const char *path = *eq == '=' ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (path == NULL) return config_error(msg, msglen, "--config needs a FILE");
    if (config_load_json(cfg, path, msg, msglen) != 0) return -1;
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0)
      return config_error(msg, msglen, "unexpected argument '%s' (see --help)",
                          arg);
    char key[64];
    const char *value = NULL;
    const char *eq = strchr(arg, '=');
    size_t klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (klen == 0 || klen >= sizeof key)
      return config_error(msg, msglen, "unknown option '%s' (see --help)", arg);
    memcpy(key, arg + 2, klen);
    key[klen] = '\0';
    if (strchr(key, '_') != NULL || !config_known(key) ||
        strcmp(key, "help") == 0 || strcmp(key, "version") == 0)
      return config_error(msg, msglen, "unknown option '--%s' (see --help)",
                          key);
    if (eq != NULL) {
      value = eq + 1;
    } else if (strcmp(key, "insecure") == 0) {
      value = "true"; /* a switch: --insecure alone, or --insecure=false */
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return config_error(msg, msglen, "--%s needs a value", key);
    }
    if (strcmp(key, "config") == 0) continue;
    char inner[512];
    if (apply(cfg, key, value, inner, sizeof inner) != 0)
      return config_error(msg, msglen, "--%s", inner);
  }
  if ((cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0'))
    return config_error(msg, msglen,
                        "tls-cert and tls-key go together: %s is given "
                        "without %s",
                        cfg->tls_cert[0] ? "--tls-cert" : "--tls-key",
                        cfg->tls_cert[0] ? "--tls-key" : "--tls-cert");
  if (cfg->tls_client_ca[0] != '\0' && cfg->tls_cert[0] == '\0')
    return config_error(msg, msglen,
                        "tls-client-ca needs --tls-cert and --tls-key: client "
                        "certificates are checked only over TLS");
  if (cfg->run_bytes == 0) cfg->run_bytes = cfg->memory_bytes / 4;
  if (cfg->run_bytes > cfg->memory_bytes)
    return config_error(
        msg, msglen, "run-bytes (%lld) is over memory-bytes (%lld)",
        (long long)cfg->run_bytes, (long long)cfg->memory_bytes);
  return 0;
}
