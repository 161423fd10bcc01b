/*
 * client.c - libtoposclient over gRPC C core (1.51).
 *
 * One channel per client, shared by every thread; each method registered
 * once (grpc_channel_register_call).  A call is one batch of six ops (send
 * initial metadata, send message, send close, receive initial metadata,
 * receive message, receive status: leaving out receive initial metadata
 * makes a call hang until its deadline) on a completion queue of its own,
 * created for the call and plucked, which is what makes the client safe
 * to use from many threads without a lock.  Requests are built with
 * proto/wire.c, packed straight into one gRPC slice, and replies unpacked
 * from the received slice (no copy when it arrives in one piece).
 */
#include "topos_client.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wire.h"

_Static_assert(TOPOS_CLIENT_GRPC_BASE == WIRE_GRPC_BASE,
               "client and wire agree on the base of gRPC codes");

enum method {
  M_RECORD,
  M_DESCRIBE,
  M_LOWER,
  M_EMIT,
  M_FORWARD,
  M_BACKWARD,
  M_STEP,
  M_CONFORMANCE,
  M_PUT_BLOB,
  M_STAT_BLOB,
  M_HEALTH,
  M_STATS,
  M_BACKENDS,
  M_ADMIN_TENANT_ADD,
  M_ADMIN_TENANT_LIST,
  M_ADMIN_TENANT_REMOVE,
  M_ADMIN_TOKEN_CREATE,
  M_ADMIN_TOKEN_LIST,
  M_ADMIN_TOKEN_REVOKE,
  M_ADMIN_QUOTA_SET,
  M_ADMIN_QUOTA_SHOW,
  M_TRAIN,
  M_LIST_SPECS,
  M_GET_BLOB,
  M_ADMIN_SPEC_DELETE,
  M_COUNT
};

static const char *const method_names[M_COUNT] = {
    "Record",
    "Describe",
    "Lower",
    "Emit",
    "Forward",
    "Backward",
    "Step",
    "Conformance",
    "PutBlob",
    "StatBlob",
    "Health",
    "Stats",
    "Backends",
    "AdminTenantAdd",
    "AdminTenantList",
    "AdminTenantRemove",
    "AdminTokenCreate",
    "AdminTokenList",
    "AdminTokenRevoke",
    "AdminQuotaSet",
    "AdminQuotaShow",
    "Train",
    "ListSpecs",
    "GetBlob",
    "AdminSpecDelete",
};

/* The longest token accepted (the daemon's are 68 characters). */
#define TOKEN_MAX 256

/* Specs this client recorded, kept packed so that a replica (or a
 * restarted daemon with a fresh store) that answers "no spec with id"
 * gets them again (topos_client_record, unary).  The newest KEPT_SPECS. */
#define KEPT_SPECS 16
/* How many times a call that finds no spec records it again and is
 * resent (unary_kept). */
#define RERECORD_ROUNDS 8

typedef struct kept_spec {
  char id[65];
  grpc_byte_buffer *packed; /* the Record request, as sent */
  uint64_t used;            /* for eviction: the oldest use goes first */
} kept_spec;

struct topos_client {
  grpc_channel *channel;
  void *methods[M_COUNT]; /* registered-call handles */
  char address[256];      /* as given, for messages */
  _Atomic int64_t deadline_ms;
  _Atomic int64_t retry_ms; /* topos_client_set_retry */
  pthread_mutex_t kept_lock;
  kept_spec kept[KEPT_SPECS];
  uint64_t kept_clock;
  /* "Bearer TOKEN", sent as "authorization" metadata on every call; ""
   * for none.  Under token_lock: a call copies it as it starts. */
  pthread_mutex_t token_lock;
  char authorization[TOKEN_MAX + 8];
};

static int fail(topos_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(topos_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return code;
}

static int err_code(const topos_error *err, int fallback) {
  return err && err->code ? err->code : fallback;
}

/* ------------------------------------------------------------ channel */

/* The largest PEM file read (a CA bundle of a system is ~200 KiB). */
#define PEM_MAX ((size_t)4 << 20)

/* The whole PEM file as a NUL-terminated string (free it), or NULL with
 * err naming the file; `what` says which setting named it. */
static char *read_pem(const char *what, const char *path, topos_error *err) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fail(err, TOPOS_ERR_ARGUMENT, "connect: %s %.300s: cannot read it: %s",
         what, path, strerror(errno));
    return NULL;
  }
  char *text = malloc(PEM_MAX + 1);
  size_t n = text ? fread(text, 1, PEM_MAX + 1, f) : 0;
  bool failed = text == NULL || ferror(f);
  fclose(f);
  if (failed || n > PEM_MAX) {
    fail(err, text ? TOPOS_ERR_ARGUMENT : TOPOS_ERR_MEMORY,
         "connect: %s %.300s: %s", what, path,
         text == NULL ? "out of memory"
         : failed     ? "read error"
                      : "larger than 4 MiB, not a PEM file");
    free(text);
    return NULL;
  }
  text[n] = '\0';
  /* gRPC would only fail the handshake later, with less to say. */
  if (strstr(text, "-----BEGIN ") == NULL) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "connect: %s %.300s: not a PEM file (no '-----BEGIN' line)", what,
         path);
    free(text);
    return NULL;
  }
  return text;
}

/* The channel credentials of tls (NULL: from the environment), or NULL
 * with err.  Plain text when no CA is named. */
static grpc_channel_credentials *channel_credentials(
    const topos_client_tls *tls, topos_error *err) {
  topos_client_tls env = {0};
  const char *what_ca = "tls ca_file", *what_cert = "tls cert_file",
             *what_key = "tls key_file";
  if (tls == NULL) {
    const char *v = getenv("TOPOS_TLS_CA");
    env.ca_file = v && v[0] ? v : NULL;
    v = getenv("TOPOS_TLS_CERT");
    env.cert_file = v && v[0] ? v : NULL;
    v = getenv("TOPOS_TLS_KEY");
    env.key_file = v && v[0] ? v : NULL;
    tls = &env;
    what_ca = "TOPOS_TLS_CA";
    what_cert = "TOPOS_TLS_CERT";
    what_key = "TOPOS_TLS_KEY";
  }
  if ((tls->cert_file != NULL) != (tls->key_file != NULL)) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "connect: a client certificate needs both %s and %s", what_cert,
         what_key);
    return NULL;
  }
  if (tls->ca_file == NULL) {
    if (tls->cert_file != NULL) {
      fail(err, TOPOS_ERR_ARGUMENT,
           "connect: %s is set but %s is not: a client certificate is sent "
           "only over TLS, which needs the CA of the daemon's certificate",
           what_cert, what_ca);
      return NULL;
    }
    return grpc_insecure_credentials_create();
  }
  char *ca = read_pem(what_ca, tls->ca_file, err);
  if (ca == NULL) return NULL;
  char *cert = NULL, *key = NULL;
  if (tls->cert_file != NULL) {
    cert = read_pem(what_cert, tls->cert_file, err);
    key = cert ? read_pem(what_key, tls->key_file, err) : NULL;
    if (key == NULL) {
      free(cert);
      free(ca);
      return NULL;
    }
  }
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  /* gRPC copies the PEM text; the daemon's name is checked against its
   * certificate (the address's host: an IP or DNS subjectAltName). */
  grpc_channel_credentials *creds =
      grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
  if (key != NULL) memset(key, 0, strlen(key));
  free(key);
  free(cert);
  free(ca);
  if (creds == NULL)
    fail(err, TOPOS_ERR_ARGUMENT, "connect: gRPC refused the TLS settings");
  return creds;
}

topos_client *topos_client_connect(const char *address, topos_error *err) {
  return topos_client_connect_tls(address, NULL, err);
}

/* The gRPC target of an address: a gRPC target with a scheme ("dns:",
 * "ipv4:", "unix:", ...) as it is; HOST:PORT as it is (gRPC resolves the
 * host by DNS); a list of IP HOST:PORTs ("127.0.0.1:50051,10.0.0.2:50051",
 * brackets around IPv6) as an ipv4:/ipv6: list, over which the channel
 * balances round-robin.  Without a scheme every entry must end in :PORT
 * (a bare "127.0.0.1" would otherwise be port 0 to gRPC's resolver). */
static int client_target(const char *address, char *target, size_t cap,
                         topos_error *err) {
  size_t n = strlen(address);
  if (n + 8 > cap)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "connect: the address is %zu characters, too long", n);
  static const char *const schemes[] = {
      "dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:"};
  bool scheme = false;
  for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++)
    scheme = scheme || strncmp(address, schemes[i], strlen(schemes[i])) == 0;
  if (scheme) {
    memcpy(target, address, n + 1);
    return TOPOS_OK;
  }
  bool list = strchr(address, ',') != NULL, v6 = false;
  for (const char *p = address; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *last = NULL;
    for (size_t i = 0; i < len; i++)
      if (p[i] == ':') last = p + i;
    bool port =
        last != NULL && last + 1 < p + len && (p[0] != '[' || last[-1] == ']');
    for (const char *q = last ? last + 1 : p + len; port && q < p + len; q++)
      port = *q >= '0' && *q <= '9';
    if (!port)
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "connect: \"%.*s\" needs HOST:PORT (as 127.0.0.1:50051)",
                  (int)(len > 200 ? 200 : len), p);
    v6 = v6 || p[0] == '[';
    p = end ? end + 1 : p + len;
  }
  snprintf(target, cap, "%s%s", list ? (v6 ? "ipv6:" : "ipv4:") : "", address);
  return TOPOS_OK;
}

topos_client *topos_client_connect_tls(const char *address,
                                       const topos_client_tls *tls,
                                       topos_error *err) {
  if (!address || !address[0]) {
    fail(err, TOPOS_ERR_ARGUMENT, "connect: the address is empty");
    return NULL;
  }
  char target[sizeof((topos_client *)0)->address + 8];
  if (client_target(address, target, sizeof target, err) != TOPOS_OK)
    return NULL;
  topos_client *c = calloc(1, sizeof *c);
  if (!c) {
    fail(err, TOPOS_ERR_MEMORY, "connect: out of memory");
    return NULL;
  }
  grpc_init();
  grpc_channel_credentials *creds = channel_credentials(tls, err);
  if (creds == NULL) {
    grpc_shutdown();
    free(c);
    return NULL;
  }
  /* The daemon enforces its own message limit; the client accepts any
   * size (the default is 4 MiB each way).  Several addresses are
   * balanced round-robin (gRPC's own policy: only connected replicas are
   * picked).  A lost connection is retried within 100 ms to 2 s, not
   * gRPC's default of up to 120 s, so a restarted daemon is found again
   * while calls retry (invoke). */
  grpc_arg args[6];
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = -1;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = -1;
  args[2].type = GRPC_ARG_STRING;
  args[2].key = (char *)GRPC_ARG_LB_POLICY_NAME;
  args[2].value.string = (char *)"round_robin";
  args[3].type = GRPC_ARG_INTEGER;
  args[3].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
  args[3].value.integer = 100;
  args[4].type = GRPC_ARG_INTEGER;
  args[4].key = (char *)GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
  args[4].value.integer = 100;
  args[5].type = GRPC_ARG_INTEGER;
  args[5].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
  args[5].value.integer = 2000;
  grpc_channel_args chargs = {6, args};
  c->channel = grpc_channel_create(target, creds, &chargs);
  snprintf(c->address, sizeof c->address, "%s", address);
  grpc_channel_credentials_release(creds);
  if (!c->channel) {
    grpc_shutdown();
    free(c);
    fail(err, TOPOS_ERR_ARGUMENT, "connect: cannot open a channel to %.200s",
         address);
    return NULL;
  }
  for (int m = 0; m < M_COUNT; m++) {
    char path[64];
    snprintf(path, sizeof path, "/topos.v1.Topos/%s", method_names[m]);
    c->methods[m] = grpc_channel_register_call(c->channel, path, NULL, NULL);
  }
  atomic_init(&c->deadline_ms, 60000);
  atomic_init(&c->retry_ms, 30000);
  pthread_mutex_init(&c->token_lock, NULL);
  pthread_mutex_init(&c->kept_lock, NULL);
  /* A shared daemon wants a token (docs/operations.md): programs that
   * never call topos_client_set_token still send $TOPOS_TOKEN.  A value
   * that is not a token is ignored here; the daemon then says what it
   * wants. */
  const char *env = getenv("TOPOS_TOKEN");
  if (env != NULL && env[0] != '\0') topos_client_set_token(c, env, NULL);
  return c;
}

int topos_client_set_token(topos_client *c, const char *token,
                           topos_error *err) {
  if (!c) return fail(err, TOPOS_ERR_ARGUMENT, "set_token: the client is NULL");
  size_t n = token ? strlen(token) : 0;
  if (n > TOKEN_MAX)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "set_token: the token is %zu characters, more than %d", n,
                TOKEN_MAX);
  for (size_t i = 0; i < n; i++)
    if (token[i] <= ' ' || token[i] > '~')
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "set_token: character %zu of the token is not printable "
                  "ASCII (a space or newline copied with it?)",
                  i);
  pthread_mutex_lock(&c->token_lock);
  if (n == 0)
    c->authorization[0] = '\0';
  else
    snprintf(c->authorization, sizeof c->authorization, "Bearer %s", token);
  pthread_mutex_unlock(&c->token_lock);
  return TOPOS_OK;
}

void topos_client_close(topos_client *c) {
  if (!c) return;
  grpc_channel_destroy(c->channel);
  for (int i = 0; i < KEPT_SPECS; i++)
    if (c->kept[i].packed) grpc_byte_buffer_destroy(c->kept[i].packed);
  pthread_mutex_destroy(&c->kept_lock);
  pthread_mutex_destroy(&c->token_lock);
  memset(c->authorization, 0, sizeof c->authorization);
  free(c);
  grpc_shutdown();
}

void topos_client_set_deadline(topos_client *c, double seconds) {
  if (!c || !(seconds > 0)) return;
  double ms = seconds * 1e3;
  if (ms > 1e12) ms = 1e12;
  atomic_store(&c->deadline_ms, ms < 1 ? 1 : (int64_t)ms);
}

void topos_client_set_retry(topos_client *c, double seconds) {
  if (!c || !(seconds >= 0)) return;
  double ms = seconds * 1e3;
  if (ms > 1e12) ms = 1e12;
  atomic_store(&c->retry_ms, (int64_t)ms);
}

int topos_client_grpc_status(int code) {
  return wire_grpc_status_of(code);
}

/* ------------------------------------------------------------ one call */

/* The status's code: the daemon's exact topos_status from the trailing
 * metadata when it sent a valid one, else the mapping of wire.h. */
static int status_code(grpc_status_code status, const grpc_metadata_array *md) {
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, WIRE_STATUS_KEY) != 0) continue;
    const grpc_slice v = md->metadata[i].value;
    size_t len = GRPC_SLICE_LENGTH(v);
    if (len == 0 || len > 3) break;
    int code = 0;
    for (size_t k = 0; k < len; k++) {
      char ch = (char)GRPC_SLICE_START_PTR(v)[k];
      if (ch < '0' || ch > '9') return wire_topos_code_of((int)status);
      code = code * 10 + (ch - '0');
    }
    /* Only a code that maps back to this status is believed. */
    if (code > TOPOS_OK && wire_grpc_status_of(code) == (int)status)
      return code;
    break;
  }
  return wire_topos_code_of((int)status);
}

/* Runs one unary call: sends `send` (consumed) to registered method
 * `method`, or to `path` when method < 0, and on OK returns the reply in
 * *reply (a slice the caller unrefs).  *status_out (may be NULL) gets the
 * gRPC status. */
static int invoke_once(topos_client *c, int method, const char *path,
                       grpc_byte_buffer *send, gpr_timespec deadline,
                       grpc_slice *reply, int *status_out, topos_error *err) {
  const char *name = method >= 0 ? method_names[method] : path;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call;
  if (method >= 0) {
    call = grpc_channel_create_registered_call(
        c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, c->methods[method],
        deadline, NULL);
  } else {
    grpc_slice ps = grpc_slice_from_copied_string(path);
    call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS,
                                    cq, ps, NULL, deadline, NULL);
    grpc_slice_unref(ps);
  }

  grpc_metadata_array initial_md, trailing_md;
  grpc_metadata_array_init(&initial_md);
  grpc_metadata_array_init(&trailing_md);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  /* The token, if any, as "authorization" metadata (ours to unref once
   * the batch is done). */
  grpc_metadata auth_md;
  memset(&auth_md, 0, sizeof auth_md);
  auth_md.key = grpc_slice_from_static_string("authorization");
  pthread_mutex_lock(&c->token_lock);
  bool with_token = c->authorization[0] != '\0';
  auth_md.value = with_token ? grpc_slice_from_copied_string(c->authorization)
                             : grpc_empty_slice();
  pthread_mutex_unlock(&c->token_lock);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = with_token ? 1 : 0;
  ops[0].data.send_initial_metadata.metadata = with_token ? &auth_md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  ops[5].data.recv_status_on_client.error_string = &error_string;

  int rc = TOPOS_OK;
  void *tag = (void *)call;
  grpc_call_error ce = grpc_call_start_batch(call, ops, 6, tag, NULL);
  if (ce != GRPC_CALL_OK) {
    /* No completion is posted for a batch that did not start. */
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "%s: the call could not start (grpc_call_error %d)", name,
              (int)ce);
  } else {
    grpc_event ev = grpc_completion_queue_pluck(
        cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
      rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "%s: the call did not complete", name);
    } else if (status != GRPC_STATUS_OK) {
      const char *sname = wire_grpc_status_name((int)status);
      size_t dlen = GRPC_SLICE_LENGTH(details);
      rc = fail(err, status_code(status, &trailing_md), "%s: %.*s%s%s", sname,
                (int)(dlen > 480 ? 480 : dlen),
                (const char *)GRPC_SLICE_START_PTR(details), dlen ? "" : name,
                dlen ? "" : " failed");
    } else if (!recv) {
      rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "%s: the daemon answered OK without a message", name);
    } else if (reply) {
      if (recv->type == GRPC_BB_RAW &&
          recv->data.raw.compression == GRPC_COMPRESS_NONE &&
          recv->data.raw.slice_buffer.count == 1) {
        *reply = grpc_slice_ref(recv->data.raw.slice_buffer.slices[0]);
      } else {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, recv)) {
          rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                    "%s: the reply cannot be read", name);
        } else {
          *reply = grpc_byte_buffer_reader_readall(&reader);
          grpc_byte_buffer_reader_destroy(&reader);
        }
      }
    }
  }
  if (status_out) *status_out = ce == GRPC_CALL_OK ? (int)status : -1;
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_byte_buffer_destroy(send);
  grpc_slice_unref(details);
  grpc_slice_unref(auth_md.value);
  if (error_string) gpr_free((void *)error_string);
  grpc_metadata_array_destroy(&initial_md);
  grpc_metadata_array_destroy(&trailing_md);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
  return rc;
}

/* Whether a method may be sent again after UNAVAILABLE: every call but
 * administration is a pure function of its request (specs and blobs are
 * content-addressed, state is the caller's), so a second delivery
 * changes nothing; an admin call might have taken effect. */
static bool idempotent(int method) {
  return method >= 0 && method != M_TRAIN &&
         strncmp(method_names[method], "Admin", 5) != 0;
}

static int64_t mono_ms(void) {
  gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* An UNAVAILABLE that says the daemon could not be reached, in words:
 * "cannot reach toposd at 127.0.0.1:50051: connection refused".  gRPC's
 * own text varies by attempt ("failed to connect to all addresses",
 * "connections to all backends failing; last error: ..."), so `refused`
 * says whether any attempt of the call saw the connection refused. */
static void reach_message(const topos_client *c, bool refused,
                          topos_error *err) {
  if (!err) return;
  const char *m = err->message;
  const char *why =
      refused                              ? "connection refused"
      : strstr(m, "DNS resolution failed") ? "the name does not resolve"
      : strstr(m, "failed to connect") || strstr(m, "backends failing") ||
              strstr(m, "handshaker shutdown")
          ? "no connection"
      : strstr(m, "Socket closed") || strstr(m, "Broken pipe") ||
              strstr(m, "Connection reset")
          ? "the connection closed"
          : NULL;
  if (why == NULL) return;
  snprintf(err->message, sizeof err->message, "cannot reach toposd at %s: %s",
           c->address, why);
}

/* One unary call as the caller sees it: sent once, or again after
 * UNAVAILABLE (a daemon restarting or draining, a replica gone, a full
 * queue) for idempotent methods, with exponential backoff from 50 ms to
 * 2 s plus jitter, for up to the client's retry time and never past the
 * call's deadline (set once, here).  send is consumed. */
static int invoke(topos_client *c, int method, const char *path,
                  grpc_byte_buffer *send, double deadline_s, grpc_slice *reply,
                  int *status_out, topos_error *err) {
  int64_t ms = deadline_s > 0 ? (int64_t)(deadline_s * 1e3)
                              : atomic_load(&c->deadline_ms);
  if (ms < 1) ms = 1;
  int64_t start = mono_ms();
  gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(ms, GPR_TIMESPAN));
  int64_t retry = idempotent(method) ? atomic_load(&c->retry_ms) : 0;
  int64_t retry_end = start + (retry < ms ? retry : ms);
  int64_t backoff = 50;
  uint64_t jitter = (uint64_t)start * 0x9E3779B97F4A7C15ull ^ (uintptr_t)c;
  int status = -1, rc;
  bool refused = false;
  for (;;) {
    grpc_byte_buffer *again = retry > 0 ? grpc_byte_buffer_copy(send) : NULL;
    rc = invoke_once(c, method, path, send, deadline, reply, &status, err);
    send = again;
    if (rc != TOPOS_OK && status == GRPC_STATUS_UNAVAILABLE && err)
      refused = refused || strstr(err->message, "Connection refused") != NULL;
    /* A failed TLS handshake does not heal by waiting. */
    bool tls = rc != TOPOS_OK && err &&
               (strstr(err->message, "Handshake failed") != NULL ||
                strstr(err->message, "Ssl handshake") != NULL ||
                strstr(err->message, "SSL_ERROR") != NULL ||
                strstr(err->message, "certificate") != NULL);
    if (rc == TOPOS_OK || status != GRPC_STATUS_UNAVAILABLE || !again || tls)
      break;
    jitter ^= jitter << 13, jitter ^= jitter >> 7, jitter ^= jitter << 17;
    int64_t wait = backoff + (int64_t)(jitter % (uint64_t)(backoff / 2 + 1));
    if (mono_ms() + wait >= retry_end) break;
    struct timespec ts = {wait / 1000, (wait % 1000) * 1000000};
    nanosleep(&ts, NULL);
    backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
  }
  if (send) grpc_byte_buffer_destroy(send);
  if (status_out) *status_out = status;
  if (rc != TOPOS_OK && status == GRPC_STATUS_UNAVAILABLE)
    reach_message(c, refused, err);
  return rc;
}

/* ------------------------------------------------------------ packing */

/* Requests are packed into a list of slices without copying large tensor
 * bytes twice: the tensor data buffers the request owns (filled once from
 * the engine's tensors by wire.c) are handed to gRPC as slices of their
 * own, and freed by gRPC when it is done with them; only the small parts
 * in between are copied.  First touch of fresh memory is the expensive
 * part of a large upload here (docs/architecture.md, "Platform facts"), so
 * every copy saved counts. */
#define BIG_BYTES ((size_t)64 << 10)

typedef struct sink {
  ProtobufCBuffer base;
  grpc_slice *slices;
  size_t n, cap;
  uint8_t *pending; /* small pieces, collected until a big one or 1 MiB */
  size_t plen, pcap;
  ProtobufCBinaryData **big; /* the request's large bytes fields */
  size_t nbig, bigcap;
  bool oom;
} sink;

static void sink_push(sink *s, grpc_slice slice) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    grpc_slice *v = realloc(s->slices, sizeof *v * cap);
    if (!v) {
      grpc_slice_unref(slice);
      s->oom = true;
      return;
    }
    s->slices = v;
    s->cap = cap;
  }
  s->slices[s->n++] = slice;
}

static void sink_flush(sink *s) {
  if (s->plen == 0) return;
  sink_push(s, grpc_slice_new(s->pending, s->plen, free));
  s->pending = NULL;
  s->plen = s->pcap = 0;
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
  sink *s = (sink *)b;
  if (s->oom || len == 0) return;
  if (len >= BIG_BYTES) {
    for (size_t i = 0; i < s->nbig; i++) {
      ProtobufCBinaryData *f = s->big[i];
      if (f->data != data || f->len != len) continue;
      /* The request gives this buffer up: gRPC frees it. */
      sink_flush(s);
      sink_push(s, grpc_slice_new(f->data, len, free));
      f->data = NULL;
      return;
    }
  }
  if (s->plen + len > s->pcap) {
    if (s->plen >= (1u << 20)) sink_flush(s);
    size_t cap = s->pcap ? s->pcap : 4096;
    while (cap < s->plen + len) cap *= 2;
    uint8_t *p = realloc(s->pending, cap);
    if (!p) {
      s->oom = true;
      return;
    }
    s->pending = p;
    s->pcap = cap;
  }
  memcpy(s->pending + s->plen, data, len);
  s->plen += len;
}

/* Finds the large bytes fields of m and its sub-messages. */
static void collect_big(sink *s, ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  char *base = (char *)m;
  for (unsigned i = 0; i < d->n_fields && !s->oom; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(uint32_t *)(base + f->quantifier_offset) != f->id)
      continue;
    if (f->type == PROTOBUF_C_TYPE_BYTES &&
        f->label != PROTOBUF_C_LABEL_REPEATED) {
      ProtobufCBinaryData *bd = (ProtobufCBinaryData *)(base + f->offset);
      if (bd->len < BIG_BYTES || !bd->data) continue;
      if (s->nbig == s->bigcap) {
        size_t cap = s->bigcap ? s->bigcap * 2 : 8;
        ProtobufCBinaryData **v = realloc(s->big, sizeof *v * cap);
        if (!v) {
          s->oom = true;
          return;
        }
        s->big = v;
        s->bigcap = cap;
      }
      s->big[s->nbig++] = bd;
    } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
      if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n = *(size_t *)(base + f->quantifier_offset);
        ProtobufCMessage **v = *(ProtobufCMessage ***)(base + f->offset);
        for (size_t k = 0; k < n && v; k++)
          if (v[k]) collect_big(s, v[k]);
      } else {
        ProtobufCMessage *sub = *(ProtobufCMessage **)(base + f->offset);
        if (sub) collect_big(s, sub);
      }
    }
  }
}

/* Packs req into a new byte buffer.  req's large bytes fields are moved
 * into the buffer (their data pointers become NULL), so req must be
 * cleared afterwards as usual but not packed again. */
static int pack_request(ProtobufCMessage *req, const char *name,
                        grpc_byte_buffer **out, topos_error *err) {
  sink s;
  memset(&s, 0, sizeof s);
  s.base.append = sink_append;
  collect_big(&s, req);
  size_t want = protobuf_c_message_get_packed_size(req);
  size_t got = s.oom ? 0 : protobuf_c_message_pack_to_buffer(req, &s.base);
  sink_flush(&s);
  if (s.n == 0 && !s.oom) sink_push(&s, grpc_empty_slice());
  int rc = TOPOS_OK;
  if (s.oom) {
    rc = fail(err, TOPOS_ERR_MEMORY, "%s: out of memory packing the request",
              name);
  } else if (got != want) {
    rc = fail(err, TOPOS_ERR_ARGUMENT, "%s: the request did not pack", name);
  } else {
    *out = grpc_raw_byte_buffer_create(s.slices, s.n);
  }
  for (size_t i = 0; i < s.n; i++) grpc_slice_unref(s.slices[i]);
  free(s.slices);
  free(s.pending);
  free(s.big);
  return rc;
}

/* Packs req, calls `method`, unpacks the reply as reply_desc (new message,
 * free with wire_message_free). */
/* The kept Record request of spec id (a new reference), or NULL. */
static grpc_byte_buffer *kept_find(topos_client *c, const char *id) {
  grpc_byte_buffer *b = NULL;
  pthread_mutex_lock(&c->kept_lock);
  for (int i = 0; i < KEPT_SPECS && !b; i++)
    if (c->kept[i].packed && strcmp(c->kept[i].id, id) == 0) {
      b = grpc_byte_buffer_copy(c->kept[i].packed);
      c->kept[i].used = ++c->kept_clock;
    }
  pthread_mutex_unlock(&c->kept_lock);
  return b;
}

/* Keeps spec id's Record request (consumed), replacing the least recently
 * used entry when all are taken. */
static void kept_put(topos_client *c, const char *id, grpc_byte_buffer *b) {
  pthread_mutex_lock(&c->kept_lock);
  int slot = 0;
  for (int i = 0; i < KEPT_SPECS; i++) {
    if (c->kept[i].packed && strcmp(c->kept[i].id, id) == 0) {
      slot = i;
      break;
    }
    if (!c->kept[i].packed ||
        (c->kept[slot].packed && c->kept[i].used < c->kept[slot].used))
      slot = i;
  }
  if (c->kept[slot].packed) grpc_byte_buffer_destroy(c->kept[slot].packed);
  memcpy(c->kept[slot].id, id, 65);
  c->kept[slot].packed = b;
  c->kept[slot].used = ++c->kept_clock;
  pthread_mutex_unlock(&c->kept_lock);
}

/* The spec id a request names: its `id` field, for the methods that run
 * or read a stored spec; NULL for the others. */
static const char *request_spec_id(int method, const ProtobufCMessage *req) {
  if (method != M_DESCRIBE && method != M_LOWER && method != M_EMIT &&
      method != M_FORWARD && method != M_BACKWARD && method != M_STEP &&
      method != M_CONFORMANCE)
    return NULL;
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "id");
  if (!f || f->type != PROTOBUF_C_TYPE_STRING) return NULL;
  const char *id = *(char *const *)((const char *)req + f->offset);
  return wire_id_valid(id) ? id : NULL;
}

/* Packs req, calls `method`, unpacks the reply as reply_desc (new message,
 * free with wire_message_free).  *keep (when keep is not NULL) gets a
 * reference to the packed request.  A daemon that answers "no spec with
 * id" for a spec this client recorded (a replica that never saw it, a
 * daemon restarted on a fresh store) gets the spec again, and the call is
 * sent once more. */
static int unary_kept(topos_client *c, int method, ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *reply_desc,
                      ProtobufCMessage **reply, double deadline_s,
                      grpc_byte_buffer **keep, topos_error *err) {
  *reply = NULL;
  if (!c) return fail(err, TOPOS_ERR_ARGUMENT, "client is NULL");
  grpc_byte_buffer *send = NULL;
  char spec_id[65] = "";
  const char *named = request_spec_id(method, req);
  if (named) memcpy(spec_id, named, 65);
  int rc = pack_request(req, method_names[method], &send, err);
  if (rc != TOPOS_OK) return rc;
  if (keep) *keep = grpc_byte_buffer_copy(send);
  grpc_byte_buffer *again = spec_id[0] ? grpc_byte_buffer_copy(send) : NULL;
  grpc_slice r = grpc_empty_slice();
  int status = -1;
  rc = invoke(c, method, NULL, send, deadline_s, &r, &status, err);
  /* Over several replicas the Record and the call may land on different
   * ones (round-robin picks each call's replica in turn; with two, one
   * Record and one call would alternate forever).  So round r sends r + 1
   * Records just before the call: they reach r + 1 consecutive replicas,
   * and once r + 1 is the number of replicas the call's own has it. */
  for (int round = 0; round < RERECORD_ROUNDS && rc != TOPOS_OK &&
                      status == GRPC_STATUS_NOT_FOUND && again && err &&
                      strstr(err->message, "no spec with id") != NULL;
       round++) {
    bool recorded = true;
    for (int k = 0; k <= round && recorded; k++) {
      grpc_byte_buffer *spec = kept_find(c, spec_id);
      topos_error rerr = {0};
      grpc_slice rr = grpc_empty_slice();
      recorded = spec != NULL && invoke(c, M_RECORD, NULL, spec, deadline_s,
                                        &rr, NULL, &rerr) == TOPOS_OK;
      grpc_slice_unref(rr);
    }
    if (!recorded) break;
    grpc_byte_buffer *next = grpc_byte_buffer_copy(again);
    rc = invoke(c, method, NULL, again, deadline_s, &r, &status, err);
    again = next;
  }
  if (again) grpc_byte_buffer_destroy(again);
  if (rc != TOPOS_OK) {
    grpc_slice_unref(r);
    return rc;
  }
  *reply = protobuf_c_message_unpack(reply_desc, NULL, GRPC_SLICE_LENGTH(r),
                                     GRPC_SLICE_START_PTR(r));
  grpc_slice_unref(r);
  if (!*reply)
    return fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "%s: the reply is not a valid %s", method_names[method],
                reply_desc->name);
  return TOPOS_OK;
}

static int unary(topos_client *c, int method, ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc,
                 ProtobufCMessage **reply, double deadline_s,
                 topos_error *err) {
  return unary_kept(c, method, req, reply_desc, reply, deadline_s, NULL, err);
}

int topos_client_call_raw(topos_client *c, const char *method,
                          const uint8_t *request, size_t request_len,
                          double deadline_s, uint8_t **reply, size_t *reply_len,
                          int *status, topos_error *err) {
  if (status) *status = -1;
  if (!c || !method || (request_len && !request))
    return fail(err, TOPOS_ERR_ARGUMENT, "call: a NULL argument");
  int m = -1;
  const char *prefix = "/topos.v1.Topos/";
  const char *short_name = strncmp(method, prefix, strlen(prefix)) == 0
                               ? method + strlen(prefix)
                               : method;
  for (int i = 0; i < M_COUNT; i++)
    if (strcmp(short_name, method_names[i]) == 0) m = i;
  if (m < 0 && method[0] != '/')
    return fail(err, TOPOS_ERR_ARGUMENT,
                "call: unknown method \"%.100s\" (give a full path to send "
                "it anyway)",
                method);
  grpc_slice s =
      grpc_slice_from_copied_buffer((const char *)request, request_len);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_slice r = grpc_empty_slice();
  int rc = invoke(c, m, method, send, deadline_s, &r, status, err);
  if (rc == TOPOS_OK && reply) {
    size_t n = GRPC_SLICE_LENGTH(r);
    *reply = malloc(n ? n : 1);
    if (!*reply) {
      rc = fail(err, TOPOS_ERR_MEMORY, "call: out of memory");
    } else {
      memcpy(*reply, GRPC_SLICE_START_PTR(r), n);
      if (reply_len) *reply_len = n;
    }
  }
  grpc_slice_unref(r);
  return rc;
}

/* ------------------------------------------------------------ helpers */

static char *dup_string(const char *s) {
  size_t n = strlen(s);
  char *c = malloc(n + 1);
  if (c) memcpy(c, s, n + 1);
  return c;
}

/* Checks an id and copies it into a request's string field (heap). */
static int set_id(char **field, const char *id, topos_error *err) {
  if (!wire_id_valid(id))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "the id \"%.80s\" is not 64 lowercase hex digits",
                id ? id : "(null)");
  *field = dup_string(id);
  if (!*field) return fail(err, TOPOS_ERR_MEMORY, "out of memory");
  return TOPOS_OK;
}

/* A heap copy of a reply string (topos_free). */
static int take_text(const char *s, char **text, topos_error *err) {
  if (!text) return TOPOS_OK;
  *text = dup_string(s ? s : "");
  return *text ? TOPOS_OK : fail(err, TOPOS_ERR_MEMORY, "out of memory");
}

/* Parameters (inline or blob references) and feeds of args into a
 * request's repeated fields (heap, freed by clearing the request). */
static int put_inputs(const topos_client_args *a, Topos__V1__Tensor ***params,
                      size_t *nparams, Topos__V1__Feed ***feeds, size_t *nfeeds,
                      topos_error *err) {
  if (!a) return TOPOS_OK;
  int rc = TOPOS_OK;
  if (a->params_blob) {
    if (a->params)
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "give either parameters or a parameter blob, not both");
    if (a->nparams_blob < 0)
      return fail(err, TOPOS_ERR_ARGUMENT, "nparams_blob %d is negative",
                  a->nparams_blob);
    rc =
        wire_tensor_refs(a->params_blob, a->nparams_blob, params, nparams, err);
  } else if (a->params) {
    rc = wire_tensors_from_params(a->params, params, nparams, err);
  }
  if (rc == TOPOS_OK && a->nfeeds > 0)
    rc = wire_feeds_to_proto(a->feeds, a->nfeeds, feeds, nfeeds, err);
  return rc;
}

static double args_deadline(const topos_client_args *a) {
  return a ? a->deadline_s : 0;
}

/* ExecOptions of one context (heap, freed by clearing the request). */
static Topos__V1__ExecOptions *exec_new(const topos_exec *x, topos_error *err) {
  if (x->threads < 0) {
    fail(err, TOPOS_ERR_ARGUMENT, "exec: threads %d is negative", x->threads);
    return NULL;
  }
  Topos__V1__ExecOptions *o = malloc(sizeof *o);
  char *name = dup_string(x->backend ? x->backend : "");
  if (!o || !name) {
    free(o);
    free(name);
    fail(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  topos__v1__exec_options__init(o);
  o->numerics = x->numerics == TOPOS_NUMERICS_FAST ? TOPOS__V1__NUMERICS__FAST
                                                   : TOPOS__V1__NUMERICS__EXACT;
  o->threads = (uint32_t)x->threads;
  o->backend = name;
  return o;
}

/* The request's ExecOptions from args->exec (NULL stays absent). */
static int put_exec(const topos_client_args *a, Topos__V1__ExecOptions **out,
                    topos_error *err) {
  if (!a || !a->exec) return TOPOS_OK;
  *out = exec_new(a->exec, err);
  return *out ? TOPOS_OK : err_code(err, TOPOS_ERR_MEMORY);
}

/* A reply's repeated backend names, comma-separated, into buf. */
static void join_names(char *const *names, size_t n, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "," : "",
                           names[i] ? names[i] : "");
}

/* Writes a reply's `backends` into args->ran. */
static void take_ran(const topos_client_args *a, char **names, size_t n) {
  if (a && a->ran && a->ran_len > 0) join_names(names, n, a->ran, a->ran_len);
}

/* ------------------------------------------------------------ specs */

int topos_client_record(topos_client *c, const topos_network *net, char id[65],
                        topos_error *err) {
  if (!net || !id)
    return fail(err, TOPOS_ERR_ARGUMENT, "record: %s is NULL",
                net ? "id" : "network");
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  int rc = wire_spec_from_network(net, &spec, err);
  if (rc != TOPOS_OK) return rc;
  ProtobufCMessage *r = NULL;
  grpc_byte_buffer *packed = NULL;
  rc = unary_kept(c, M_RECORD, &spec.base, &topos__v1__record_reply__descriptor,
                  &r, 0, &packed, err);
  wire_message_clear(&spec.base);
  if (rc != TOPOS_OK) {
    if (packed) grpc_byte_buffer_destroy(packed);
    return rc;
  }
  Topos__V1__RecordReply *reply = (Topos__V1__RecordReply *)r;
  if (!wire_id_valid(reply->id)) {
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "record: the daemon answered a malformed id");
    grpc_byte_buffer_destroy(packed);
  } else {
    memcpy(id, reply->id, 65);
    /* Kept for replicas that have not seen it (unary_kept). */
    kept_put(c, id, packed);
  }
  wire_message_free(r);
  return rc;
}

int topos_client_describe(topos_client *c, const char *id, topos_format format,
                          char **text, topos_error *err) {
  if (!text) return fail(err, TOPOS_ERR_ARGUMENT, "describe: text is NULL");
  *text = NULL;
  if ((int)format < TOPOS_FORMAT_TEXT ||
      (int)format > (int)TOPOS_CLIENT_FORMAT_SVG)
    return fail(err, TOPOS_ERR_ARGUMENT, "describe: unknown format %d",
                (int)format);
  Topos__V1__DescribeRequest req = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  /* The engine's formats and SVG are the wire's numbers. */
  _Static_assert(TOPOS_CLIENT_FORMAT_SVG == (int)TOPOS__V1__FORMAT__SVG &&
                     TOPOS_FORMAT_DOT == (int)TOPOS__V1__FORMAT__DOT,
                 "Format numbers");
  req.format = (Topos__V1__Format)format;
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_DESCRIBE, &req.base, &topos__v1__text_reply__descriptor, &r,
               0, err);
  wire_message_clear(&req.base);
  if (rc == TOPOS_OK)
    rc = take_text(((Topos__V1__TextReply *)r)->text, text, err);
  wire_message_free(r);
  return rc;
}

int topos_client_lower(topos_client *c, const char *id,
                       const topos_entry *entry, char **text,
                       int64_t *peak_bytes, int *groups, topos_error *err) {
  if (text) *text = NULL;
  Topos__V1__LowerRequest req = TOPOS__V1__LOWER_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.entry = wire_entry_new(entry, NULL, err);
    if (!req.entry) rc = err_code(err, TOPOS_ERR_ARGUMENT);
  }
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_LOWER, &req.base, &topos__v1__lower_reply__descriptor, &r,
               0, err);
  wire_message_clear(&req.base);
  if (rc == TOPOS_OK) {
    Topos__V1__LowerReply *reply = (Topos__V1__LowerReply *)r;
    if (peak_bytes) *peak_bytes = reply->peak_bytes;
    if (groups) *groups = reply->groups;
    rc = take_text(reply->text, text, err);
  }
  wire_message_free(r);
  return rc;
}

int topos_client_emit(topos_client *c, const char *id, const topos_entry *entry,
                      topos_emit_form form, char **text, topos_error *err) {
  if (!text) return fail(err, TOPOS_ERR_ARGUMENT, "emit: text is NULL");
  *text = NULL;
  if ((int)form != TOPOS_EMIT_PRETTY && (int)form != TOPOS_EMIT_GENERIC)
    return fail(err, TOPOS_ERR_ARGUMENT, "emit: unknown form %d", (int)form);
  Topos__V1__EmitRequest req = TOPOS__V1__EMIT_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.entry = wire_entry_new(entry, NULL, err);
    if (!req.entry) rc = err_code(err, TOPOS_ERR_ARGUMENT);
  }
  req.form = (Topos__V1__Form)form;
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_EMIT, &req.base, &topos__v1__text_reply__descriptor, &r, 0,
               err);
  wire_message_clear(&req.base);
  if (rc == TOPOS_OK)
    rc = take_text(((Topos__V1__TextReply *)r)->text, text, err);
  wire_message_free(r);
  return rc;
}

/* ------------------------------------------------------------ execution */

void topos_client_tensors_free(topos_tensor **v, int n) {
  wire_tensor_array_free(v, n);
}

int topos_client_forward_with(topos_client *c, const char *id,
                              const topos_entry *entry,
                              const topos_client_args *args,
                              topos_tensor ***roots, topos_tensor ***observes,
                              topos_error *err) {
  if (roots) *roots = NULL;
  if (observes) *observes = NULL;
  if (!entry) return fail(err, TOPOS_ERR_ARGUMENT, "forward: entry is NULL");
  Topos__V1__ForwardRequest req = TOPOS__V1__FORWARD_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.entry = wire_entry_new(entry, NULL, err);
    if (!req.entry) rc = err_code(err, TOPOS_ERR_ARGUMENT);
  }
  if (rc == TOPOS_OK)
    rc = put_inputs(args, &req.parameters, &req.n_parameters, &req.feeds,
                    &req.n_feeds, err);
  if (rc == TOPOS_OK) rc = put_exec(args, &req.exec, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_FORWARD, &req.base, &topos__v1__forward_reply__descriptor,
               &r, args_deadline(args), err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__ForwardReply *reply = (Topos__V1__ForwardReply *)r;
  take_ran(args, reply->backends, reply->n_backends);
  if (reply->n_roots != (size_t)entry->nroots ||
      reply->n_observes != (size_t)entry->nobserves) {
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "forward: the daemon answered %zu roots and %zu observes for "
              "%d and %d",
              reply->n_roots, reply->n_observes, entry->nroots,
              entry->nobserves);
  }
  topos_tensor **rv = NULL, **ov = NULL;
  if (rc == TOPOS_OK && roots)
    rc = wire_tensor_array_from_proto(reply->roots, reply->n_roots, NULL,
                                      "roots", &rv, err);
  if (rc == TOPOS_OK && observes)
    rc = wire_tensor_array_from_proto(reply->observes, reply->n_observes, NULL,
                                      "observes", &ov, err);
  if (rc == TOPOS_OK) {
    if (roots) *roots = rv;
    if (observes) *observes = ov;
  } else {
    wire_tensor_array_free(rv, (int)reply->n_roots);
    wire_tensor_array_free(ov, (int)reply->n_observes);
  }
  wire_message_free(r);
  return rc;
}

int topos_client_forward(topos_client *c, const char *id,
                         const topos_entry *entry, const topos_params *params,
                         const topos_feed *feeds, int nfeeds,
                         topos_tensor ***roots, topos_tensor ***observes,
                         topos_error *err) {
  topos_client_args a = {.params = params, .feeds = feeds, .nfeeds = nfeeds};
  return topos_client_forward_with(c, id, entry, &a, roots, observes, err);
}

int topos_client_backward_with(topos_client *c, const char *id,
                               topos_value loss, const topos_client_args *args,
                               double *loss_out, topos_params **grads,
                               topos_error *err) {
  if (grads) *grads = NULL;
  if (loss.index < 0)
    return fail(err, TOPOS_ERR_ARGUMENT, "backward: the loss is not a value");
  Topos__V1__BackwardRequest req = TOPOS__V1__BACKWARD_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.loss = wire_value_new_index(loss.index);
    if (!req.loss) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  if (rc == TOPOS_OK)
    rc = put_inputs(args, &req.parameters, &req.n_parameters, &req.feeds,
                    &req.n_feeds, err);
  if (rc == TOPOS_OK) rc = put_exec(args, &req.exec, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_BACKWARD, &req.base, &topos__v1__backward_reply__descriptor,
               &r, args_deadline(args), err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__BackwardReply *reply = (Topos__V1__BackwardReply *)r;
  take_ran(args, reply->backends, reply->n_backends);
  if (loss_out) *loss_out = reply->loss;
  if (grads)
    rc = wire_params_from_proto(reply->gradients, reply->n_gradients, NULL,
                                "gradients", grads, err);
  wire_message_free(r);
  return rc;
}

int topos_client_backward(topos_client *c, const char *id, topos_value loss,
                          const topos_params *params, const topos_feed *feeds,
                          int nfeeds, double *loss_out, topos_params **grads,
                          topos_error *err) {
  topos_client_args a = {.params = params, .feeds = feeds, .nfeeds = nfeeds};
  return topos_client_backward_with(c, id, loss, &a, loss_out, grads, err);
}

int topos_client_step_with(topos_client *c, const char *id, topos_value loss,
                           const topos_client_args *args,
                           const topos_optimizer *opt,
                           const topos_opt_state *state,
                           topos_params **params_out,
                           topos_opt_state **state_out, double *loss_out,
                           topos_error *err) {
  if (params_out) *params_out = NULL;
  if (state_out) *state_out = NULL;
  if (loss.index < 0)
    return fail(err, TOPOS_ERR_ARGUMENT, "step: the loss is not a value");
  if (!opt) return fail(err, TOPOS_ERR_ARGUMENT, "step: optimizer is NULL");
  Topos__V1__StepRequest req = TOPOS__V1__STEP_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.loss = wire_value_new_index(loss.index);
    if (!req.loss) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  if (rc == TOPOS_OK)
    rc = put_inputs(args, &req.parameters, &req.n_parameters, &req.feeds,
                    &req.n_feeds, err);
  if (rc == TOPOS_OK) {
    req.optimizer = malloc(sizeof *req.optimizer);
    if (!req.optimizer) {
      rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
    } else {
      topos__v1__optimizer__init(req.optimizer);
      rc = wire_optimizer_to_proto(opt, args ? args->params : NULL,
                                   req.optimizer, err);
    }
  }
  if (rc == TOPOS_OK && state) {
    req.state = wire_state_new(state, err);
    if (!req.state) rc = err_code(err, TOPOS_ERR_MEMORY);
  }
  if (rc == TOPOS_OK) rc = put_exec(args, &req.exec, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_STEP, &req.base, &topos__v1__step_reply__descriptor, &r,
               args_deadline(args), err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__StepReply *reply = (Topos__V1__StepReply *)r;
  take_ran(args, reply->backends, reply->n_backends);
  if (loss_out) *loss_out = reply->loss;
  topos_params *p = NULL;
  topos_opt_state *s = NULL;
  if (params_out)
    rc = wire_params_from_proto(reply->parameters, reply->n_parameters, NULL,
                                "parameters", &p, err);
  if (rc == TOPOS_OK && state_out) {
    if (!reply->state)
      rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "step: the daemon answered no optimizer state");
    else
      rc = wire_state_from_proto(reply->state, NULL, &s, err);
  }
  if (rc == TOPOS_OK) {
    if (params_out) *params_out = p;
    if (state_out) *state_out = s;
  } else {
    topos_params_free(p);
    topos_opt_state_free(s);
  }
  wire_message_free(r);
  return rc;
}

int topos_client_step(topos_client *c, const char *id, topos_value loss,
                      const topos_params *params, const topos_feed *feeds,
                      int nfeeds, const topos_optimizer *opt,
                      const topos_opt_state *state, topos_params **params_out,
                      topos_opt_state **state_out, double *loss_out,
                      topos_error *err) {
  topos_client_args a = {.params = params, .feeds = feeds, .nfeeds = nfeeds};
  return topos_client_step_with(c, id, loss, &a, opt, state, params_out,
                                state_out, loss_out, err);
}

/* Fills a row from the reply's BackendResult (strings copied). */
static int row_from_proto(const Topos__V1__BackendResult *b,
                          topos_conformance_row *row) {
  snprintf(row->backend, sizeof row->backend, "%s",
           b->backend ? b->backend : "");
  row->numerics = b->numerics == TOPOS__V1__NUMERICS__FAST
                      ? TOPOS_NUMERICS_FAST
                      : TOPOS_NUMERICS_EXACT;
  row->fidelity = b->fidelity && strcmp(b->fidelity, "envelope") == 0
                      ? "envelope"
                      : "exact";
  row->holds = b->holds;
  row->bit_identical = b->bit_identical;
  row->max_ulp = b->max_ulp;
  row->max_relative = b->max_relative;
  row->rel_l2 = b->rel_l2;
  join_names(b->ran, b->n_ran, row->ran, sizeof row->ran);
  snprintf(row->note, sizeof row->note, "%s", b->note ? b->note : "");
  row->outputs = calloc(b->n_outputs + 1, sizeof *row->outputs);
  if (!row->outputs) return TOPOS_ERR_MEMORY;
  row->noutputs = (int)b->n_outputs;
  for (size_t i = 0; i < b->n_outputs; i++) {
    const Topos__V1__OutputResult *o = b->outputs[i];
    topos_conformance_output *d = &row->outputs[i];
    snprintf(d->what, sizeof d->what, "%s", o->what ? o->what : "");
    d->holds = o->holds;
    d->bit_identical = o->bit_identical;
    d->max_ulp = o->max_ulp;
    d->max_relative = o->max_relative;
    d->rel_l2 = o->rel_l2;
    d->envelope = o->envelope;
  }
  return TOPOS_OK;
}

int topos_client_conformance(topos_client *c, const char *id,
                             const topos_entry *entry,
                             const topos_client_args *args,
                             topos_conformance **out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "conformance: out is NULL");
  *out = NULL;
  if (!entry)
    return fail(err, TOPOS_ERR_ARGUMENT, "conformance: entry is NULL");
  Topos__V1__ConformanceRequest req = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  if (rc == TOPOS_OK) {
    req.entry = wire_entry_new(entry, NULL, err);
    if (!req.entry) rc = err_code(err, TOPOS_ERR_ARGUMENT);
  }
  if (rc == TOPOS_OK)
    rc = put_inputs(args, &req.parameters, &req.n_parameters, &req.feeds,
                    &req.n_feeds, err);
  int ncand = args && args->exec ? (args->nexec > 0 ? args->nexec : 1) : 0;
  if (rc == TOPOS_OK && ncand > 0) {
    req.candidates = calloc((size_t)ncand, sizeof *req.candidates);
    if (!req.candidates) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
    for (int i = 0; rc == TOPOS_OK && i < ncand; i++) {
      req.candidates[i] = exec_new(&args->exec[i], err);
      if (!req.candidates[i])
        rc = err_code(err, TOPOS_ERR_MEMORY);
      else
        req.n_candidates++;
    }
  }
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_CONFORMANCE, &req.base,
               &topos__v1__conformance_reply__descriptor, &r,
               args_deadline(args), err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__ConformanceReply *reply = (Topos__V1__ConformanceReply *)r;
  size_t n = reply->n_results;
  topos_conformance *v = calloc(1, sizeof *v);
  if (v) v->rows = calloc(n + 1, sizeof *v->rows);
  if (!v || !v->rows) {
    free(v);
    wire_message_free(r);
    return fail(err, TOPOS_ERR_MEMORY, "conformance: out of memory");
  }
  snprintf(v->reference_ran, sizeof v->reference_ran, "reference");
  v->nrows = (int)n;
  for (size_t i = 0; i < n && rc == TOPOS_OK; i++)
    if (row_from_proto(reply->results[i], &v->rows[i]) != TOPOS_OK)
      rc = fail(err, TOPOS_ERR_MEMORY, "conformance: out of memory");
  wire_message_free(r);
  if (rc != TOPOS_OK) {
    topos_conformance_free(v);
    return rc;
  }
  *out = v;
  return TOPOS_OK;
}

int topos_client_backends(topos_client *c, topos_backend_info **out, int *count,
                          topos_error *err) {
  if (!out || !count)
    return fail(err, TOPOS_ERR_ARGUMENT, "backends: out is NULL");
  *out = NULL;
  *count = 0;
  Topos__V1__BackendsRequest req = TOPOS__V1__BACKENDS_REQUEST__INIT;
  ProtobufCMessage *r = NULL;
  int rc = unary(c, M_BACKENDS, &req.base,
                 &topos__v1__backends_reply__descriptor, &r, 0, err);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__BackendsReply *reply = (Topos__V1__BackendsReply *)r;
  size_t n = reply->n_backends;
  topos_backend_info *v = calloc(n + 1, sizeof *v);
  if (!v) {
    wire_message_free(r);
    return fail(err, TOPOS_ERR_MEMORY, "backends: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    const Topos__V1__BackendInfo *b = reply->backends[i];
    v[i].index = (int)i;
    snprintf(v[i].name, sizeof v[i].name, "%s", b->name ? b->name : "");
    snprintf(v[i].fidelity, sizeof v[i].fidelity, "%s",
             b->fidelity ? b->fidelity : "");
    /* ops travel as the task kinds' op lists; map them back to kinds. */
    for (size_t k = 0; k < b->n_ops; k++)
      for (int kind = 0; kind < 4; kind++)
        if (b->ops[k] && strcmp(b->ops[k], topos_task_ops(kind)) == 0)
          v[i].tasks |= 1u << kind;
    for (size_t k = 0; k < b->n_dtypes; k++)
      if (b->dtypes[k] >= 0 && b->dtypes[k] < 32)
        v[i].dtypes |= 1u << b->dtypes[k];
    snprintf(v[i].device, sizeof v[i].device, "%s", b->device ? b->device : "");
    v[i].threads = b->threads;
    v[i].tasks_run = b->tasks_run > 0 ? (uint64_t)b->tasks_run : 0;
  }
  *out = v;
  *count = (int)n;
  wire_message_free(r);
  return TOPOS_OK;
}

/* ------------------------------------------------------------ blobs */

int topos_client_put_blob(topos_client *c, const topos_params *p, char id[65],
                          int64_t *bytes, topos_error *err) {
  if (!p || !id)
    return fail(err, TOPOS_ERR_ARGUMENT, "put_blob: %s is NULL",
                p ? "id" : "the parameter set");
  Topos__V1__PutBlobRequest req = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  int rc = wire_tensors_from_params(p, &req.tensors, &req.n_tensors, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_PUT_BLOB, &req.base, &topos__v1__put_blob_reply__descriptor,
               &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__PutBlobReply *reply = (Topos__V1__PutBlobReply *)r;
  if (!wire_id_valid(reply->id)) {
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "put_blob: the daemon answered a malformed id");
  } else {
    memcpy(id, reply->id, 65);
    if (bytes) *bytes = reply->bytes;
  }
  wire_message_free(r);
  return rc;
}

int topos_client_get_blob(topos_client *c, const char *id,
                          topos_tensor ***tensors, int *n, topos_error *err) {
  if (!tensors || !n)
    return fail(err, TOPOS_ERR_ARGUMENT, "get_blob: an out pointer is NULL");
  *tensors = NULL;
  *n = 0;
  Topos__V1__GetBlobRequest req = TOPOS__V1__GET_BLOB_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_GET_BLOB, &req.base, &topos__v1__get_blob_reply__descriptor,
               &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__GetBlobReply *reply = (Topos__V1__GetBlobReply *)r;
  if (reply->n_tensors > INT32_MAX)
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "get_blob: the daemon answered too many tensors");
  else
    rc = wire_tensor_array_from_proto(reply->tensors, reply->n_tensors, NULL,
                                      "blob.tensors", tensors, err);
  if (rc == TOPOS_OK) *n = (int)reply->n_tensors;
  wire_message_free(r);
  return rc;
}

int topos_client_delete_spec(topos_client *c, const char *id, int64_t *bytes,
                             topos_error *err) {
  Topos__V1__AdminSpecDeleteRequest req =
      TOPOS__V1__ADMIN_SPEC_DELETE_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_SPEC_DELETE, &req.base,
               &topos__v1__admin_spec_delete_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  if (bytes) *bytes = ((Topos__V1__AdminSpecDeleteReply *)r)->bytes;
  wire_message_free(r);
  /* A spec deleted on purpose is not recorded again behind the caller's
   * back. */
  pthread_mutex_lock(&c->kept_lock);
  for (int i = 0; i < KEPT_SPECS; i++)
    if (c->kept[i].packed && strcmp(c->kept[i].id, id) == 0) {
      grpc_byte_buffer_destroy(c->kept[i].packed);
      c->kept[i].packed = NULL;
    }
  pthread_mutex_unlock(&c->kept_lock);
  return TOPOS_OK;
}

int topos_client_stat_blob(topos_client *c, const char *id, bool *present,
                           int64_t *bytes, topos_error *err) {
  Topos__V1__StatBlobRequest req = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
  int rc = set_id(&req.id, id, err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_STAT_BLOB, &req.base,
               &topos__v1__stat_blob_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__StatBlobReply *reply = (Topos__V1__StatBlobReply *)r;
  if (present) *present = reply->present;
  if (bytes) *bytes = reply->bytes;
  wire_message_free(r);
  return TOPOS_OK;
}

/* ------------------------------------------------------------ health */

int topos_client_health(topos_client *c, char status[32], char version[64],
                        topos_error *err) {
  Topos__V1__HealthRequest req = TOPOS__V1__HEALTH_REQUEST__INIT;
  ProtobufCMessage *r = NULL;
  int rc = unary(c, M_HEALTH, &req.base, &topos__v1__health_reply__descriptor,
                 &r, 0, err);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__HealthReply *reply = (Topos__V1__HealthReply *)r;
  if (status) snprintf(status, 32, "%s", reply->status ? reply->status : "");
  if (version)
    snprintf(version, 64, "%s", reply->version ? reply->version : "");
  wire_message_free(r);
  return TOPOS_OK;
}

int topos_client_stats(topos_client *c, topos_client_stats_info *out,
                       topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "stats: out is NULL");
  Topos__V1__StatsRequest req = TOPOS__V1__STATS_REQUEST__INIT;
  ProtobufCMessage *r = NULL;
  int rc = unary(c, M_STATS, &req.base, &topos__v1__stats_reply__descriptor, &r,
                 0, err);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__StatsReply *s = (Topos__V1__StatsReply *)r;
  *out = (topos_client_stats_info){
      .workers = s->workers,
      .queue_depth = s->queue_depth,
      .queue_capacity = s->queue_capacity,
      .requests = s->requests,
      .errors = s->errors,
      .cache_entries = s->cache_entries,
      .cache_hits = s->cache_hits,
      .cache_misses = s->cache_misses,
      .specs = s->specs,
      .spec_bytes = s->spec_bytes,
      .blobs = s->blobs,
      .blob_bytes = s->blob_bytes,
      .connections = s->connections,
      .connections_shed = s->connections_shed,
      .connections_refused = s->connections_refused,
      .connection_cap = s->connection_cap,
  };
  for (size_t i = 0; i < s->n_backend_tasks && i < TOPOS_BACKENDS_MAX; i++) {
    const Topos__V1__BackendCount *b = s->backend_tasks[i];
    snprintf(out->backend_names[i], sizeof out->backend_names[i], "%s",
             b->backend ? b->backend : "");
    out->backend_tasks[i] = b->tasks;
    out->nbackends++;
  }
  wire_message_free(r);
  return TOPOS_OK;
}

/* ------------------------------------------------------- administration */

/* A request's tenant name or token id (heap, freed with the request); the
 * daemon checks its form and answers INVALID_ARGUMENT. */
static int set_name(char **field, const char *name, const char *what,
                    topos_error *err) {
  if (!name) return fail(err, TOPOS_ERR_ARGUMENT, "%s is NULL", what);
  *field = dup_string(name);
  if (!*field) return fail(err, TOPOS_ERR_MEMORY, "out of memory");
  return TOPOS_OK;
}

static void tenant_from(const Topos__V1__AdminTenant *m,
                        topos_client_tenant *out) {
  memset(out, 0, sizeof *out);
  if (!m) return;
  snprintf(out->name, sizeof out->name, "%s", m->name ? m->name : "");
  out->admin = m->admin;
  out->created_ms = m->created_ms;
  out->live_tokens = m->live_tokens;
}

static void token_from(const Topos__V1__AdminToken *m,
                       topos_client_token *out) {
  memset(out, 0, sizeof *out);
  if (!m) return;
  snprintf(out->id, sizeof out->id, "%s", m->id ? m->id : "");
  snprintf(out->tenant, sizeof out->tenant, "%s", m->tenant ? m->tenant : "");
  out->created_ms = m->created_ms;
  out->revoked_ms = m->revoked_ms;
}

/* The secret of a reply into secret (TOPOS_CLIENT_SECRET_LEN + 1), and the
 * reply's copy wiped. */
static int take_secret(char *s, char *secret, const char *what,
                       topos_error *err) {
  size_t n = s ? strlen(s) : 0;
  int rc = TOPOS_OK;
  if (n != TOPOS_CLIENT_SECRET_LEN)
    rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
              "%s: the daemon answered a secret of %zu characters, not %d",
              what, n, TOPOS_CLIENT_SECRET_LEN);
  else
    memcpy(secret, s, n + 1);
  if (s) memset(s, 0, n);
  return rc;
}

int topos_client_tenant_add(topos_client *c, const char *name, bool admin,
                            topos_client_tenant *out, topos_client_token *token,
                            char *secret, topos_error *err) {
  if ((token != NULL) != (secret != NULL))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "tenant_add: token and secret go together (both to create a "
                "token, or neither)");
  Topos__V1__AdminTenantAddRequest req =
      TOPOS__V1__ADMIN_TENANT_ADD_REQUEST__INIT;
  int rc = set_name(&req.name, name, "tenant_add: name", err);
  req.admin = admin;
  req.with_token = secret != NULL;
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_TENANT_ADD, &req.base,
               &topos__v1__admin_tenant_add_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__AdminTenantAddReply *reply = (Topos__V1__AdminTenantAddReply *)r;
  if (out) tenant_from(reply->tenant, out);
  if (secret) {
    token_from(reply->token, token);
    rc = take_secret(reply->secret, secret, "tenant_add", err);
  }
  wire_message_free(r);
  return rc;
}

int topos_client_tenant_list(topos_client *c, topos_client_tenant **out, int *n,
                             topos_error *err) {
  if (!out || !n)
    return fail(err, TOPOS_ERR_ARGUMENT, "tenant_list: out or n is NULL");
  *out = NULL;
  *n = 0;
  Topos__V1__AdminTenantListRequest req =
      TOPOS__V1__ADMIN_TENANT_LIST_REQUEST__INIT;
  ProtobufCMessage *r = NULL;
  int rc = unary(c, M_ADMIN_TENANT_LIST, &req.base,
                 &topos__v1__admin_tenant_list_reply__descriptor, &r, 0, err);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__AdminTenantListReply *reply = (Topos__V1__AdminTenantListReply *)r;
  if (reply->n_tenants > 0) {
    *out = calloc(reply->n_tenants, sizeof **out);
    if (!*out) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  for (size_t i = 0; rc == TOPOS_OK && i < reply->n_tenants; i++)
    tenant_from(reply->tenants[i], &(*out)[i]);
  if (rc == TOPOS_OK) *n = (int)reply->n_tenants;
  wire_message_free(r);
  return rc;
}

int topos_client_tenant_remove(topos_client *c, const char *name,
                               topos_client_tenant *out, topos_error *err) {
  Topos__V1__AdminTenantRemoveRequest req =
      TOPOS__V1__ADMIN_TENANT_REMOVE_REQUEST__INIT;
  int rc = set_name(&req.name, name, "tenant_remove: name", err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_TENANT_REMOVE, &req.base,
               &topos__v1__admin_tenant_remove_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  if (out) tenant_from(((Topos__V1__AdminTenantRemoveReply *)r)->tenant, out);
  wire_message_free(r);
  return TOPOS_OK;
}

int topos_client_token_create(topos_client *c, const char *tenant,
                              topos_client_token *token, char *secret,
                              topos_error *err) {
  if (!secret)
    return fail(err, TOPOS_ERR_ARGUMENT, "token_create: secret is NULL");
  Topos__V1__AdminTokenCreateRequest req =
      TOPOS__V1__ADMIN_TOKEN_CREATE_REQUEST__INIT;
  int rc = set_name(&req.tenant, tenant, "token_create: tenant", err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_TOKEN_CREATE, &req.base,
               &topos__v1__admin_token_create_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__AdminTokenCreateReply *reply =
      (Topos__V1__AdminTokenCreateReply *)r;
  if (token) token_from(reply->token, token);
  rc = take_secret(reply->secret, secret, "token_create", err);
  wire_message_free(r);
  return rc;
}

int topos_client_token_list(topos_client *c, const char *tenant,
                            topos_client_token **out, int *n,
                            topos_error *err) {
  if (!out || !n)
    return fail(err, TOPOS_ERR_ARGUMENT, "token_list: out or n is NULL");
  *out = NULL;
  *n = 0;
  Topos__V1__AdminTokenListRequest req =
      TOPOS__V1__ADMIN_TOKEN_LIST_REQUEST__INIT;
  int rc = set_name(&req.tenant, tenant, "token_list: tenant", err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_TOKEN_LIST, &req.base,
               &topos__v1__admin_token_list_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  Topos__V1__AdminTokenListReply *reply = (Topos__V1__AdminTokenListReply *)r;
  if (reply->n_tokens > 0) {
    *out = calloc(reply->n_tokens, sizeof **out);
    if (!*out) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  for (size_t i = 0; rc == TOPOS_OK && i < reply->n_tokens; i++)
    token_from(reply->tokens[i], &(*out)[i]);
  if (rc == TOPOS_OK) *n = (int)reply->n_tokens;
  wire_message_free(r);
  return rc;
}

int topos_client_token_revoke(topos_client *c, const char *id,
                              topos_client_token *out, topos_error *err) {
  Topos__V1__AdminTokenRevokeRequest req =
      TOPOS__V1__ADMIN_TOKEN_REVOKE_REQUEST__INIT;
  int rc = set_name(&req.id, id, "token_revoke: id", err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_TOKEN_REVOKE, &req.base,
               &topos__v1__admin_token_revoke_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  if (out) token_from(((Topos__V1__AdminTokenRevokeReply *)r)->token, out);
  wire_message_free(r);
  return TOPOS_OK;
}

topos_client_quota topos_client_quota_none(void) {
  return (topos_client_quota){-1, -1, -1, -1, -1, -1, -1, -1, -1};
}

/* An AdminQuotaReply into out. */
static int quota_from(ProtobufCMessage *r, topos_client_quota *out) {
  const Topos__V1__AdminQuota *q = ((Topos__V1__AdminQuotaReply *)r)->quota;
  *out = topos_client_quota_none();
  if (q) {
    out->stored_bytes = q->stored_bytes;
    out->inflight = q->inflight;
    out->rate_per_s = q->rate_per_s;
    out->burst = q->burst;
    out->nodes_per_spec = q->nodes_per_spec;
    out->run_ms = q->run_ms;
    out->run_bytes = q->run_bytes;
    out->weight = q->weight;
    out->device_bytes = q->device_bytes;
  }
  wire_message_free(r);
  return TOPOS_OK;
}

int topos_client_quota_set(topos_client *c, const char *tenant,
                           const topos_client_quota *q, unsigned mask,
                           topos_client_quota *now, topos_error *err) {
  if (!q) return fail(err, TOPOS_ERR_ARGUMENT, "quota_set: q is NULL");
  Topos__V1__AdminQuotaSetRequest req =
      TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__INIT;
  int rc = set_name(&req.tenant, tenant, "quota_set: tenant", err);
  if (mask & TOPOS_CLIENT_QUOTA_STORED_BYTES) {
    req.stored_bytes_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__STORED_BYTES_GIVEN_STORED_BYTES;
    req.stored_bytes = q->stored_bytes;
  }
  if (mask & TOPOS_CLIENT_QUOTA_INFLIGHT) {
    req.inflight_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__INFLIGHT_GIVEN_INFLIGHT;
    req.inflight = q->inflight;
  }
  if (mask & TOPOS_CLIENT_QUOTA_RATE) {
    /* Together: a rate with its burst, or none for both. */
    req.rate_per_s_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__RATE_PER_S_GIVEN_RATE_PER_S;
    req.rate_per_s = q->rate_per_s;
    req.burst_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__BURST_GIVEN_BURST;
    req.burst = q->burst;
  }
  if (mask & TOPOS_CLIENT_QUOTA_NODES) {
    req.nodes_per_spec_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__NODES_PER_SPEC_GIVEN_NODES_PER_SPEC;
    req.nodes_per_spec = q->nodes_per_spec;
  }
  if (mask & TOPOS_CLIENT_QUOTA_RUN_MS) {
    req.run_ms_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__RUN_MS_GIVEN_RUN_MS;
    req.run_ms = q->run_ms;
  }
  if (mask & TOPOS_CLIENT_QUOTA_RUN_BYTES) {
    req.run_bytes_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__RUN_BYTES_GIVEN_RUN_BYTES;
    req.run_bytes = q->run_bytes;
  }
  if (mask & TOPOS_CLIENT_QUOTA_WEIGHT) {
    req.weight_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__WEIGHT_GIVEN_WEIGHT;
    req.weight = q->weight;
  }
  if (mask & TOPOS_CLIENT_QUOTA_DEVICE_BYTES) {
    req.device_bytes_given_case =
        TOPOS__V1__ADMIN_QUOTA_SET_REQUEST__DEVICE_BYTES_GIVEN_DEVICE_BYTES;
    req.device_bytes = q->device_bytes;
  }
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_QUOTA_SET, &req.base,
               &topos__v1__admin_quota_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  topos_client_quota local;
  return quota_from(r, now ? now : &local);
}

int topos_client_quota_show(topos_client *c, const char *tenant,
                            topos_client_quota *out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "quota_show: out is NULL");
  Topos__V1__AdminQuotaShowRequest req =
      TOPOS__V1__ADMIN_QUOTA_SHOW_REQUEST__INIT;
  int rc = set_name(&req.tenant, tenant, "quota_show: tenant", err);
  ProtobufCMessage *r = NULL;
  if (rc == TOPOS_OK)
    rc = unary(c, M_ADMIN_QUOTA_SHOW, &req.base,
               &topos__v1__admin_quota_reply__descriptor, &r, 0, err);
  wire_message_clear(&req.base);
  if (rc != TOPOS_OK) return rc;
  return quota_from(r, out);
}

/* ------------------------------------------------------- Train streams */

struct topos_client_train {
  topos_client *client; /* borrowed */
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_slice auth; /* the "authorization" value sent (or empty) */
  grpc_metadata auth_md;
  /* The status batch, started at open and read once the stream ends. */
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  bool status_started, status_read;
  int outstanding; /* steps sent whose replies are not read */
  bool broken;     /* the stream ended or failed: nothing more goes */
  bool closed;     /* the client's side is closed */
  int rc;          /* the error that ended it (TOPOS_OK while it runs) */
  char message[sizeof(((topos_error *)0)->message)];
  /* Replies read ahead when a send found the stream over (its status
   * comes after them), handed out by recv in order. */
  grpc_byte_buffer **held;
  size_t nheld, next_held;
};

enum { TRAIN_TAG_STATUS = 1, TRAIN_TAG_IO = 2 };

/* Runs one batch on the stream and waits for it. */
static bool train_batch(topos_client_train *t, grpc_op *ops, size_t n) {
  void *tag = (void *)(intptr_t)TRAIN_TAG_IO;
  if (grpc_call_start_batch(t->call, ops, n, tag, NULL) != GRPC_CALL_OK)
    return false;
  grpc_event ev = grpc_completion_queue_pluck(
      t->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* The stream is over: its status, as this client's error (TOPOS_OK for a
 * clean end).  Kept, so every later call returns the same. */
static int train_status(topos_client_train *t, topos_error *err) {
  if (!t->status_read) {
    void *tag = (void *)(intptr_t)TRAIN_TAG_STATUS;
    grpc_event ev = {.type = GRPC_QUEUE_TIMEOUT};
    if (t->status_started)
      ev = grpc_completion_queue_pluck(
          t->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    t->status_read = true;
    t->broken = true;
    if (ev.type != GRPC_OP_COMPLETE) {
      topos_error e = {0};
      t->rc = fail(&e, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                   "Train: the stream's status did not arrive");
      snprintf(t->message, sizeof t->message, "%s", e.message);
    } else if (t->status != GRPC_STATUS_OK) {
      size_t dlen = GRPC_SLICE_LENGTH(t->details);
      topos_error e = {0};
      t->rc = fail(&e, status_code(t->status, &t->trailing_md), "%s: %.*s",
                   wire_grpc_status_name((int)t->status),
                   (int)(dlen > 480 ? 480 : dlen),
                   (const char *)GRPC_SLICE_START_PTR(t->details));
      snprintf(t->message, sizeof t->message, "%s", e.message);
    }
  }
  if (t->rc != TOPOS_OK && err) {
    err->code = t->rc;
    snprintf(err->message, sizeof err->message, "%s", t->message);
  }
  return t->rc;
}

/* A send found the stream over: the replies still in it are read (and
 * kept for recv) so that its status can arrive after them. */
static void train_drain(topos_client_train *t) {
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!train_batch(t, &op, 1) || bb == NULL) return;
    grpc_byte_buffer **v = realloc(t->held, (t->nheld + 1) * sizeof *v);
    if (v == NULL) {
      grpc_byte_buffer_destroy(bb);
      continue; /* dropped: the status still comes */
    }
    t->held = v;
    t->held[t->nheld++] = bb;
  }
}

/* Sends one TrainRequest (consumed: cleared here). */
static int train_send_msg(topos_client_train *t, Topos__V1__TrainRequest *req,
                          topos_error *err) {
  grpc_byte_buffer *bb = NULL;
  int rc = pack_request(&req->base, "Train", &bb, err);
  wire_message_clear(&req->base);
  if (rc != TOPOS_OK) return rc;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  bool ok = train_batch(t, &op, 1);
  grpc_byte_buffer_destroy(bb);
  if (!ok) {
    /* The daemon ended the stream: its status says why. */
    t->broken = true;
    if (!t->status_read) train_drain(t);
    rc = train_status(t, err);
    return rc != TOPOS_OK
               ? rc
               : fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_UNAVAILABLE,
                      "Train: the stream is closed");
  }
  t->outstanding++;
  return TOPOS_OK;
}

void topos_client_train_reply_clear(topos_client_train_reply *r) {
  if (!r) return;
  topos_params_free(r->params);
  topos_opt_state_free(r->state);
  free(r->losses);
  memset(r, 0, sizeof *r);
}

int topos_client_train_recv(topos_client_train *t,
                            topos_client_train_reply *out, topos_error *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!t) return fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is NULL");
  if (t->outstanding == 0)
    return t->broken ? train_status(t, err)
                     : fail(err, TOPOS_ERR_ARGUMENT,
                            "Train: no step is waiting for its reply");
  grpc_byte_buffer *bb = NULL;
  bool ok = true;
  if (t->next_held < t->nheld) {
    bb = t->held[t->next_held];
    t->held[t->next_held++] = NULL;
  } else {
    if (t->broken && t->status_read) return train_status(t, err);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    ok = train_batch(t, &op, 1);
  }
  if (!ok || bb == NULL) {
    if (bb) grpc_byte_buffer_destroy(bb);
    t->broken = true;
    int rc = train_status(t, err);
    return rc != TOPOS_OK
               ? rc
               : fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                      "Train: the stream ended before the reply");
  }
  t->outstanding--;
  grpc_byte_buffer_reader reader;
  grpc_slice all = grpc_empty_slice();
  if (grpc_byte_buffer_reader_init(&reader, bb)) {
    all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
  }
  grpc_byte_buffer_destroy(bb);
  Topos__V1__TrainReply *r = topos__v1__train_reply__unpack(
      NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  grpc_slice_unref(all);
  if (!r)
    return fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "Train: the reply is not a valid TrainReply");
  topos_client_train_reply got = {
      .steps = r->steps, .loss = r->loss, .last = r->last};
  int rc = TOPOS_OK;
  if (r->n_parameters > 0)
    rc = wire_params_from_proto(r->parameters, r->n_parameters, NULL,
                                "parameters", &got.params, err);
  if (rc == TOPOS_OK && r->state)
    rc = wire_state_from_proto(r->state, NULL, &got.state, err);
  if (rc == TOPOS_OK && r->n_losses > 0) {
    got.losses = malloc(r->n_losses * sizeof *got.losses);
    if (!got.losses) {
      rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
    } else {
      memcpy(got.losses, r->losses, r->n_losses * sizeof *got.losses);
      got.nlosses = (int)r->n_losses;
    }
  }
  topos__v1__train_reply__free_unpacked(r, NULL);
  if (rc == TOPOS_OK && got.last) {
    /* The daemon refused a step: the stream ends with its status, and
     * this reply holds where the session stood. */
    t->broken = true;
    t->outstanding = 0;
    rc = train_status(t, err);
    if (rc == TOPOS_OK)
      rc = fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
                "Train: a last reply with an OK status");
  }
  if (out)
    *out = got;
  else
    topos_client_train_reply_clear(&got);
  return rc;
}

int topos_client_train_send(topos_client_train *t, const topos_feed *feeds,
                            int nfeeds, bool return_state, topos_error *err) {
  if (!t) return fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is NULL");
  if (nfeeds < 0 || (nfeeds > 0 && !feeds))
    return fail(err, TOPOS_ERR_ARGUMENT, "Train: bad feeds (%d)", nfeeds);
  if (t->broken) {
    int rc = train_status(t, err);
    return rc != TOPOS_OK
               ? rc
               : fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is closed");
  }
  if (t->closed)
    return fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is closed");
  Topos__V1__TrainRequest req = TOPOS__V1__TRAIN_REQUEST__INIT;
  req.return_state = return_state;
  int rc = nfeeds > 0 ? wire_feeds_to_proto(feeds, nfeeds, &req.feeds,
                                            &req.n_feeds, err)
                      : TOPOS_OK;
  if (rc != TOPOS_OK) {
    wire_message_clear(&req.base);
    return rc;
  }
  return train_send_msg(t, &req, err);
}

int topos_client_train_send_steps(topos_client_train *t,
                                  const topos_feed *feeds, int nfeeds,
                                  int nsteps, bool return_state,
                                  topos_error *err) {
  if (!t) return fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is NULL");
  if (nsteps < 1 || nsteps > 4096 || nfeeds < 0 || (nfeeds > 0 && !feeds))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "Train: bad steps (%d steps of %d feeds; 1..4096 steps)",
                nsteps, nfeeds);
  if (t->broken || t->closed)
    return topos_client_train_send(t, NULL, 0, false, err);
  Topos__V1__TrainRequest req = TOPOS__V1__TRAIN_REQUEST__INIT;
  req.return_state = return_state;
  req.steps = calloc((size_t)nsteps, sizeof *req.steps);
  int rc = req.steps ? TOPOS_OK : fail(err, TOPOS_ERR_MEMORY, "out of memory");
  for (int i = 0; rc == TOPOS_OK && i < nsteps; i++) {
    Topos__V1__TrainBatch *b = malloc(sizeof *b);
    if (!b) {
      rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
      break;
    }
    topos__v1__train_batch__init(b);
    req.steps[i] = b;
    req.n_steps = (size_t)i + 1;
    if (nfeeds > 0)
      rc = wire_feeds_to_proto(feeds + (size_t)i * (size_t)nfeeds, nfeeds,
                               &b->feeds, &b->n_feeds, err);
  }
  if (rc != TOPOS_OK) {
    wire_message_clear(&req.base);
    return rc;
  }
  return train_send_msg(t, &req, err);
}

int topos_client_train_step(topos_client_train *t, const topos_feed *feeds,
                            int nfeeds, bool return_state,
                            topos_client_train_reply *out, topos_error *err) {
  if (out) memset(out, 0, sizeof *out);
  int rc = topos_client_train_send(t, feeds, nfeeds, return_state, err);
  return rc != TOPOS_OK ? rc : topos_client_train_recv(t, out, err);
}

topos_client_train *topos_client_train_open(topos_client *c, const char *id,
                                            topos_value loss,
                                            const topos_client_args *args,
                                            const topos_optimizer *opt,
                                            const topos_opt_state *state,
                                            topos_error *err) {
  if (!c) {
    fail(err, TOPOS_ERR_ARGUMENT, "Train: client is NULL");
    return NULL;
  }
  if (loss.index < 0) {
    fail(err, TOPOS_ERR_ARGUMENT, "Train: the loss is not a value");
    return NULL;
  }
  if (!opt) {
    fail(err, TOPOS_ERR_ARGUMENT, "Train: optimizer is NULL");
    return NULL;
  }
  if (args && args->nfeeds > 0) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "Train: open takes no feeds (each step sends its own)");
    return NULL;
  }
  /* The session's first message: a StepRequest without feeds, no step. */
  Topos__V1__StepRequest *o = malloc(sizeof *o);
  Topos__V1__TrainRequest req = TOPOS__V1__TRAIN_REQUEST__INIT;
  int rc = o ? TOPOS_OK : fail(err, TOPOS_ERR_MEMORY, "out of memory");
  if (rc == TOPOS_OK) {
    topos__v1__step_request__init(o);
    req.open = o;
    req.no_step = true;
    rc = set_id(&o->id, id, err);
  }
  if (rc == TOPOS_OK) {
    o->loss = wire_value_new_index(loss.index);
    if (!o->loss) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  }
  if (rc == TOPOS_OK)
    rc = put_inputs(args, &o->parameters, &o->n_parameters, &o->feeds,
                    &o->n_feeds, err);
  if (rc == TOPOS_OK) {
    o->optimizer = malloc(sizeof *o->optimizer);
    if (!o->optimizer) {
      rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
    } else {
      topos__v1__optimizer__init(o->optimizer);
      rc = wire_optimizer_to_proto(opt, args ? args->params : NULL,
                                   o->optimizer, err);
    }
  }
  if (rc == TOPOS_OK && state) {
    o->state = wire_state_new(state, err);
    if (!o->state) rc = err_code(err, TOPOS_ERR_MEMORY);
  }
  if (rc == TOPOS_OK) rc = put_exec(args, &o->exec, err);
  topos_client_train *t = rc == TOPOS_OK ? calloc(1, sizeof *t) : NULL;
  if (rc == TOPOS_OK && !t) rc = fail(err, TOPOS_ERR_MEMORY, "out of memory");
  if (rc != TOPOS_OK) {
    if (o)
      wire_message_clear(&req.base);
    else
      free(o);
    free(t);
    return NULL;
  }
  t->client = c;
  t->cq = grpc_completion_queue_create_for_pluck(NULL);
  /* The stream lives as long as the session: only a deadline the caller
   * gives bounds it. */
  gpr_timespec deadline =
      args && args->deadline_s > 0
          ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                         gpr_time_from_millis((int64_t)(args->deadline_s * 1e3),
                                              GPR_TIMESPAN))
          : gpr_inf_future(GPR_CLOCK_MONOTONIC);
  t->call = grpc_channel_create_registered_call(
      c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, t->cq, c->methods[M_TRAIN],
      deadline, NULL);
  grpc_metadata_array_init(&t->initial_md);
  grpc_metadata_array_init(&t->trailing_md);
  t->details = grpc_empty_slice();
  t->status = GRPC_STATUS_UNKNOWN;
  pthread_mutex_lock(&c->token_lock);
  bool with_token = c->authorization[0] != '\0';
  t->auth = with_token ? grpc_slice_from_copied_string(c->authorization)
                       : grpc_empty_slice();
  pthread_mutex_unlock(&c->token_lock);
  t->auth_md.key = grpc_slice_from_static_string("authorization");
  t->auth_md.value = t->auth;
  grpc_op st[2];
  memset(st, 0, sizeof st);
  st[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  st[0].data.recv_status_on_client.trailing_metadata = &t->trailing_md;
  st[0].data.recv_status_on_client.status = &t->status;
  st[0].data.recv_status_on_client.status_details = &t->details;
  st[0].data.recv_status_on_client.error_string = &t->error_string;
  grpc_op md[2];
  memset(md, 0, sizeof md);
  md[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  md[0].data.send_initial_metadata.count = with_token ? 1 : 0;
  md[0].data.send_initial_metadata.metadata = with_token ? &t->auth_md : NULL;
  md[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  md[1].data.recv_initial_metadata.recv_initial_metadata = &t->initial_md;
  t->status_started =
      grpc_call_start_batch(t->call, st, 1, (void *)(intptr_t)TRAIN_TAG_STATUS,
                            NULL) == GRPC_CALL_OK;
  if (!t->status_started || !train_batch(t, md, 2)) {
    t->broken = true;
    wire_message_clear(&req.base);
    fail(err, TOPOS_CLIENT_GRPC_BASE + GRPC_STATUS_INTERNAL,
         "Train: the stream could not start");
    topos_client_train_free(t);
    return NULL;
  }
  rc = train_send_msg(t, &req, err);
  if (rc == TOPOS_OK) {
    /* The open's reply: the daemon took the session (or says why not). */
    topos_client_train_reply r;
    rc = topos_client_train_recv(t, &r, err);
    topos_client_train_reply_clear(&r);
  }
  if (rc != TOPOS_OK) {
    topos_client_train_free(t);
    return NULL;
  }
  return t;
}

int topos_client_train_close(topos_client_train *t, topos_params **params_out,
                             topos_opt_state **state_out, topos_error *err) {
  if (params_out) *params_out = NULL;
  if (state_out) *state_out = NULL;
  if (!t) return fail(err, TOPOS_ERR_ARGUMENT, "Train: the stream is NULL");
  int rc = TOPOS_OK;
  /* Replies still owed are read (and dropped) first. */
  while (rc == TOPOS_OK && t->outstanding > 0 && !t->broken)
    rc = topos_client_train_recv(t, NULL, err);
  if (rc == TOPOS_OK && !t->broken && (params_out || state_out)) {
    Topos__V1__TrainRequest req = TOPOS__V1__TRAIN_REQUEST__INIT;
    req.no_step = true;
    req.return_state = true;
    topos_client_train_reply r;
    rc = train_send_msg(t, &req, err);
    if (rc == TOPOS_OK) rc = topos_client_train_recv(t, &r, err);
    if (rc == TOPOS_OK) {
      if (params_out) *params_out = r.params;
      if (state_out) *state_out = r.state;
      if (params_out) r.params = NULL;
      if (state_out) r.state = NULL;
      topos_client_train_reply_clear(&r);
    }
  }
  if (rc == TOPOS_OK && !t->broken && !t->closed) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    t->closed = true;
    if (!train_batch(t, &op, 1)) t->broken = true;
    rc = train_status(t, err);
  } else if (rc == TOPOS_OK && t->broken) {
    rc = train_status(t, err);
  }
  if (rc != TOPOS_OK) {
    if (params_out) {
      topos_params_free(*params_out);
      *params_out = NULL;
    }
    if (state_out) {
      topos_opt_state_free(*state_out);
      *state_out = NULL;
    }
  }
  return rc;
}

void topos_client_train_free(topos_client_train *t) {
  if (!t) return;
  if (t->call) {
    if (t->status_started && !t->status_read) {
      /* Still running: cancel it and wait for its status batch. */
      grpc_call_cancel(t->call, NULL);
      grpc_completion_queue_pluck(t->cq, (void *)(intptr_t)TRAIN_TAG_STATUS,
                                  gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    grpc_call_unref(t->call);
  }
  /* Every batch started was waited for: nothing is left to drain. */
  grpc_completion_queue_shutdown(t->cq);
  grpc_completion_queue_destroy(t->cq);
  grpc_metadata_array_destroy(&t->initial_md);
  grpc_metadata_array_destroy(&t->trailing_md);
  for (size_t i = t->next_held; i < t->nheld; i++)
    grpc_byte_buffer_destroy(t->held[i]);
  free(t->held);
  grpc_slice_unref(t->details);
  grpc_slice_unref(t->auth);
  if (t->error_string) gpr_free((void *)t->error_string);
  free(t);
}
