/*
 * gateway.c - the HTTP JSON gateway's routes (http.h): each one a thin
 * adapter over the service's methods (handlers.h).  A route builds the
 * method's request message from the path, the query and the body (JSON
 * through pbjson.h, or protobuf bytes), submits it to the daemon's workers
 * (rpc_submit) like a gRPC call, and turns the reply message into JSON, or
 * into the text it carries.  Lookup, validation and error text are the
 * handlers', so both transports say the same thing; gRPC statuses map to
 * HTTP statuses in one table (gateway_http_status).
 *
 *   GET  /healthz                      Health (a probe: never queued)
 *   GET  /readyz                       grpc.health.v1 Check: 200 or 503
 *   GET  /metrics                      Prometheus text (Stats + metrics.c);
 *                                      admin tenants only (403 for others)
 *   GET  /openapi.json                 this gateway, as OpenAPI 3
 *   GET  /v1/backends                  Backends
 *   GET  /v1/specs                     ListSpecs (page_size, page_token)
 *   POST /v1/specs                     Record (protobuf or JSON Spec)
 *   GET  /v1/specs/{id}                Describe (format=text|json|dot|svg)
 *   POST /v1/specs/{id}/lower          Lower (body: an Entry)
 *   POST /v1/specs/{id}/emit           Emit (form=pretty|generic; body: an
 *                                      Entry)
 *   POST /v1/specs/{id}/conformance    Conformance (body: the request
 *                                      without its id)
 *   GET  /specs/{id}                   the graph page (page.c)
 */
#include <cJSON.h>
#include <http_parser.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "handlers.h"
#include "health.pb-c.h"
#include "http.h"
#include "listener.h"
#include "log.h"
#include "page.h"
#include "pbjson.h"
#include "topos.pb-c.h"
#include "utf8.h"
#include "version.h"
#include "wire.h"

/* The OpenAPI document (server/openapi.json), built into the binary. */
extern const char gateway_openapi_json[];
extern const char gateway_openapi_json_end[];
__asm__(
    ".section .rodata\n"
    ".global gateway_openapi_json\n"
    ".global gateway_openapi_json_end\n"
    "gateway_openapi_json:\n"
    ".incbin \"server/openapi.json\"\n"
    "gateway_openapi_json_end:\n"
    ".byte 0\n"
    ".previous\n");

#define MAX_QUERY_PARAMS 32
#define MAX_SEGMENTS 8

/* ---------------------------------------------------------------- errors */

int gateway_http_status(int grpc_status) {
  switch (grpc_status) {
    case WIRE_GRPC_OK:
      return 200;
    case 1:
      return 499; /* CANCELLED */
    case 2:
      return 500; /* UNKNOWN */
    case 3:
      return 400; /* INVALID_ARGUMENT */
    case 4:
      return 504; /* DEADLINE_EXCEEDED */
    case 5:
      return 404; /* NOT_FOUND */
    case 6:
      return 409; /* ALREADY_EXISTS */
    case 7:
      return 403; /* PERMISSION_DENIED */
    case 8:
      return 429; /* RESOURCE_EXHAUSTED */
    case 9:
      return 400; /* FAILED_PRECONDITION */
    case 10:
      return 409; /* ABORTED */
    case 11:
      return 400; /* OUT_OF_RANGE */
    case 12:
      return 501; /* UNIMPLEMENTED */
    case 13:
      return 500; /* INTERNAL */
    case 14:
      return 503; /* UNAVAILABLE */
    case 15:
      return 500; /* DATA_LOSS */
    case 16:
      return 401; /* UNAUTHENTICATED */
  }
  return 500;
}

/* Makes text valid UTF-8 in place: a message may quote client bytes (or
 * cut a character in two), and JSON must be UTF-8.  Each byte that does
 * not begin a valid sequence becomes '?'. */
static void utf8_scrub(char *text) {
  size_t n = strlen(text);
  for (size_t i = 0; i < n;) {
    size_t at = 0;
    const char *why = NULL;
    if (topos_utf8_check(text + i, n - i, &at, &why)) break;
    text[i + at] = '?';
    i += at + 1;
  }
}

static void verror(http_response *r, int http_status, const char *code,
                   const char *fmt, va_list ap) {
  char text[1200];
  vsnprintf(text, sizeof text, fmt, ap);
  utf8_scrub(text);
  cJSON *doc = cJSON_CreateObject();
  cJSON *e = cJSON_AddObjectToObject(doc, "error");
  cJSON_AddStringToObject(e, "code", code);
  cJSON_AddStringToObject(e, "message", text);
  free(r->body);
  r->body = cJSON_PrintUnformatted(doc);
  cJSON_Delete(doc);
  r->status = http_status;
  r->content_type = "application/json";
  r->body_len = r->body ? strlen(r->body) : 0;
}

void gateway_http_error(http_response *r, int http_status, const char *code,
                        const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(r, http_status, code, fmt, ap);
  va_end(ap);
}

void gateway_error(http_response *r, int grpc_status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(r, gateway_http_status(grpc_status),
         wire_grpc_status_name(grpc_status), fmt, ap);
  va_end(ap);
}

static bool bad_request(http_exchange *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static bool bad_request(http_exchange *x, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(&x->resp, 400, "INVALID_ARGUMENT", fmt, ap);
  va_end(ap);
  return true;
}

/* ------------------------------------------------------------- responses */

static bool reply_text(http_exchange *x, int status, const char *type,
                       char *body, size_t len) {
  free(x->resp.body);
  x->resp.status = status;
  x->resp.content_type = type;
  x->resp.body = body;
  x->resp.body_len = len;
  if (body == NULL && len > 0) gateway_error(&x->resp, 14, "out of memory");
  return true;
}

static bool reply_json(http_exchange *x, int status, cJSON *doc) {
  char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
  cJSON_Delete(doc);
  if (text == NULL) {
    gateway_error(&x->resp, 14, "out of memory");
    return true;
  }
  return reply_text(x, status, "application/json", text, strlen(text));
}

/* The call's reply unpacked as desc (free with
 * protobuf_c_message_free_unpacked(m, NULL)), or NULL with x->resp the
 * call's error. */
static ProtobufCMessage *call_result(http_exchange *x,
                                     const ProtobufCMessageDescriptor *desc) {
  service_call *c = &x->call;
  if (c->status != WIRE_GRPC_OK) {
    gateway_error(&x->resp, c->status, "%s", c->message);
    return NULL;
  }
  ProtobufCMessage *m =
      protobuf_c_message_unpack(desc, NULL, c->out_len, c->out);
  free(c->out);
  c->out = NULL;
  c->out_len = 0;
  if (m == NULL)
    gateway_error(&x->resp, 13, "%s: reply does not unpack", desc->name);
  return m;
}

static bool reply_message_json(http_exchange *x,
                               const ProtobufCMessageDescriptor *desc) {
  ProtobufCMessage *m = call_result(x, desc);
  if (m == NULL) return true;
  cJSON *doc = pbjson_from_message(m);
  protobuf_c_message_free_unpacked(m, NULL);
  return reply_json(x, 200, doc);
}

/* The `text` of a TextReply as the body, of a content type. */
static bool reply_text_field(http_exchange *x, const char *type) {
  Topos__V1__TextReply *m = (Topos__V1__TextReply *)call_result(
      x, &topos__v1__text_reply__descriptor);
  if (m == NULL) return true;
  char *text = strdup(m->text ? m->text : "");
  protobuf_c_message_free_unpacked(&m->base, NULL);
  return reply_text(x, 200, type, text, text ? strlen(text) : 1);
}

/* ----------------------------------------------------------------- calls */

/* Submits request bytes to `method`, with the daemon's deadline from the
 * request's arrival.  True when x->resp is filled now. */
static bool submit(gateway *g, http_exchange *x, const char *method,
                   const uint8_t *in, size_t len,
                   bool (*finish)(http_exchange *)) {
  int index = rpc_method_index(method);
  if (index < 0) {
    gateway_error(&x->resp, 13, "no method %s", method);
    return true;
  }
  x->call.method = index;
  x->call.in = in;
  x->call.in_len = len;
  x->call.has_message = true;
  x->call.arrival_ns = x->req.arrival_ns;
  int64_t ms = g->d->cfg->deadline_ms;
  x->call.deadline_ns = ms > 0 ? x->req.arrival_ns + ms * 1000000 : INT64_MAX;
  x->finish = finish;
  if (rpc_submit(g->rpc, &x->call)) return false;
  return finish(x);
}

/* Packs m as the request of `method` and submits it.  True when x->resp is
 * filled now (answered at once: a probe, a refusal), false when a worker
 * has it and `finish` runs when it comes back. */
static bool start_call(gateway *g, http_exchange *x, const char *method,
                       const ProtobufCMessage *m,
                       bool (*finish)(http_exchange *), bool inline_call) {
  free(x->packed);
  free(x->call.out);
  x->call.out = NULL;
  size_t n = protobuf_c_message_get_packed_size(m);
  x->packed = malloc(n ? n : 1);
  if (x->packed == NULL) {
    gateway_error(&x->resp, 8, "%s: out of memory packing the request", method);
    return true;
  }
  protobuf_c_message_pack(m, x->packed);
  x->call.inline_call = inline_call;
  return submit(g, x, method, x->packed, n, finish);
}

/* Raw request bytes (POST /v1/specs with a protobuf body). */
static bool start_raw_call(gateway *g, http_exchange *x, const char *method,
                           bool (*finish)(http_exchange *)) {
  return submit(g, x, method, x->req.body ? x->req.body : (const uint8_t *)"",
                x->req.body_len, finish);
}

/* ------------------------------------------------------------ the query */

typedef struct query {
  char *keys[MAX_QUERY_PARAMS];
  char *values[MAX_QUERY_PARAMS];
  int n;
  char *storage;
} query;

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decodes s in place ('+' is a space when plus); false on a bad
 * escape or an encoded NUL. */
static bool percent_decode(char *s, bool plus) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (*r == '%') {
      int hi = hex_digit(r[1]), lo = hi >= 0 ? hex_digit(r[2]) : -1;
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
      *w++ = (char)(hi * 16 + lo);
      r += 2;
    } else if (plus && *r == '+') {
      *w++ = ' ';
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
  return true;
}

/* Splits and decodes a query string; false with x->resp a 400. */
static bool parse_query(http_exchange *x, const char *text, size_t len,
                        query *q) {
  memset(q, 0, sizeof *q);
  if (len == 0) return true;
  q->storage = strndup(text, len);
  if (q->storage == NULL) {
    gateway_error(&x->resp, 8, "out of memory");
    return false;
  }
  char *save = NULL;
  for (char *part = strtok_r(q->storage, "&", &save); part;
       part = strtok_r(NULL, "&", &save)) {
    if (q->n == MAX_QUERY_PARAMS) {
      bad_request(x, "more than %d query parameters", MAX_QUERY_PARAMS);
      return false;
    }
    char *eq = strchr(part, '=');
    if (eq) *eq = '\0';
    char *value = eq ? eq + 1 : part + strlen(part);
    if (!percent_decode(part, true) || !percent_decode(value, true)) {
      bad_request(x, "query parameter '%.60s': bad percent-encoding", part);
      return false;
    }
    q->keys[q->n] = part;
    q->values[q->n] = value;
    q->n++;
  }
  return true;
}

/* Every parameter must be one of `known` (NULL-terminated): a typo is an
 * error, not a silent default. */
static bool query_check(http_exchange *x, const query *q,
                        const char *const *known) {
  for (int i = 0; i < q->n; i++) {
    bool ok = false;
    for (int k = 0; known[k] && !ok; k++)
      ok = strcmp(q->keys[i], known[k]) == 0;
    if (!ok) {
      char list[200] = "";
      size_t len = 0;
      for (int k = 0; known[k] && len < sizeof list; k++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                k ? ", " : "", known[k]);
      bad_request(x, "unknown query parameter '%.60s' (known: %s)", q->keys[i],
                  known[0] ? list : "none");
      return false;
    }
  }
  return true;
}

static const char *query_get(const query *q, const char *key) {
  const char *v = NULL;
  for (int i = 0; i < q->n; i++)
    if (strcmp(q->keys[i], key) == 0) v = q->values[i];
  return v;
}

/* --------------------------------------------------------------- bodies */

static bool is_json_type(const char *ct) {
  return strncasecmp(ct, "application/json", 16) == 0 &&
         (ct[16] == '\0' || ct[16] == ';' || ct[16] == ' ');
}

/* The body as a message of desc (NULL json = empty body = the empty
 * message); NULL with x->resp the error. */
static ProtobufCMessage *body_message(http_exchange *x,
                                      const ProtobufCMessageDescriptor *desc) {
  const char *ct = x->req.content_type;
  if (x->req.body_len > 0 && ct[0] != '\0' && !is_json_type(ct)) {
    gateway_http_error(&x->resp, 415, "INVALID_ARGUMENT",
                       "the body must be application/json (a %s), not %.80s",
                       desc->name, ct);
    return NULL;
  }
  cJSON *doc = NULL;
  if (x->req.body_len > 0) {
    doc = cJSON_ParseWithLength((const char *)x->req.body, x->req.body_len);
    if (doc == NULL) {
      const char *at = cJSON_GetErrorPtr();
      size_t off = at && at >= (const char *)x->req.body
                       ? (size_t)(at - (const char *)x->req.body)
                       : 0;
      bad_request(x, "the body is not JSON (near byte %zu)", off);
      return NULL;
    }
  }
  char msg[600];
  ProtobufCMessage *m = pbjson_to_message(desc, doc, msg, sizeof msg);
  cJSON_Delete(doc);
  if (m == NULL) bad_request(x, "%s: %s", desc->name, msg);
  return m;
}

/* ---------------------------------------------------------------- routes */

static bool finish_json_backends(http_exchange *x) {
  return reply_message_json(x, &topos__v1__backends_reply__descriptor);
}
static bool finish_json_list(http_exchange *x) {
  return reply_message_json(x, &topos__v1__list_specs_reply__descriptor);
}
static bool finish_json_record(http_exchange *x) {
  return reply_message_json(x, &topos__v1__record_reply__descriptor);
}
static bool finish_json_lower(http_exchange *x) {
  return reply_message_json(x, &topos__v1__lower_reply__descriptor);
}
static bool finish_json_conformance(http_exchange *x) {
  return reply_message_json(x, &topos__v1__conformance_reply__descriptor);
}
static bool finish_text(http_exchange *x) {
  return reply_text_field(x, "text/plain; charset=utf-8");
}

static const char *const describe_types[] = {
    "text/plain; charset=utf-8", "application/json",
    "text/vnd.graphviz; charset=utf-8", "image/svg+xml"};

static bool finish_describe(http_exchange *x) {
  return reply_text_field(x, describe_types[x->arg]);
}

static bool finish_health(http_exchange *x) {
  return reply_message_json(x, &topos__v1__health_reply__descriptor);
}

static bool finish_ready(http_exchange *x) {
  Grpc__Health__V1__HealthCheckResponse *m =
      (Grpc__Health__V1__HealthCheckResponse *)call_result(
          x, &grpc__health__v1__health_check_response__descriptor);
  if (m == NULL) return true;
  bool serving =
      m->status ==
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  protobuf_c_message_free_unpacked(&m->base, NULL);
  if (!serving) {
    gateway_error(&x->resp, 14, "not ready: toposd is draining");
    return true;
  }
  cJSON *doc = cJSON_CreateObject();
  cJSON_AddStringToObject(doc, "status", "ready");
  return reply_json(x, 200, doc);
}

/* /metrics: Stats, the request metrics, the HTTP side's counters. */
static bool finish_metrics(http_exchange *x) {
  Topos__V1__StatsReply *s = (Topos__V1__StatsReply *)call_result(
      x, &topos__v1__stats_reply__descriptor);
  if (s == NULL) return true;
  http_server *h = x->server;
  http_counts hc;
  http_server_counts(h, &hc);
  text_buf b = {0};
#define GAUGE(name, help, value)                                              \
  text_printf(                                                                \
      &b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " %lld\n", \
      (long long)(value))
#define COUNTER(name, help, value)                                       \
  text_printf(&b,                                                        \
              "# HELP " name " " help "\n# TYPE " name " counter\n" name \
              " %lld\n",                                                 \
              (long long)(value))
  text_printf(&b,
              "# HELP topos_build_info The daemon's version.\n"
              "# TYPE topos_build_info gauge\n"
              "topos_build_info{version=\"%s\"} 1\n",
              TOPOSD_VERSION);
  GAUGE("topos_workers", "Worker threads.", s->workers);
  GAUGE("topos_workers_busy", "Workers running a call now.", x->arg);
  GAUGE("topos_queue_depth", "Calls waiting for a worker.", s->queue_depth);
  GAUGE("topos_queue_capacity", "The job queue's capacity.", s->queue_capacity);
  COUNTER("topos_calls_total", "Calls answered, any status, any transport.",
          s->requests);
  COUNTER("topos_call_errors_total",
          "Calls answered with a status other than OK.", s->errors);
  GAUGE("topos_cache_entries", "Cached networks, plans and blobs.",
        s->cache_entries);
  GAUGE("topos_cache_bytes", "Memory the cached entries keep.", s->cache_bytes);
  COUNTER("topos_cache_hits_total", "Cache lookups that hit.", s->cache_hits);
  COUNTER("topos_cache_misses_total", "Cache lookups that missed.",
          s->cache_misses);
  GAUGE("topos_store_specs", "Specs in the store.", s->specs);
  GAUGE("topos_store_spec_bytes", "Bytes of the stored specs.", s->spec_bytes);
  GAUGE("topos_store_blobs", "Blobs acknowledged and kept.", s->blobs);
  GAUGE("topos_store_blob_bytes", "Bytes of the kept blobs.", s->blob_bytes);
  GAUGE("topos_memory_reserved_bytes",
        "Peak bytes reserved by the runs in flight.", s->reserved_bytes);
  GAUGE("topos_memory_budget_bytes", "The runs' memory budget.",
        s->memory_budget);
  GAUGE("topos_grpc_connections", "gRPC connections open.", s->connections);
  COUNTER("topos_grpc_connections_shed_total",
          "gRPC connections the daemon closed (cap, idle, descriptors).",
          s->connections_shed);
  COUNTER("topos_grpc_connections_refused_total",
          "gRPC connections refused at once.", s->connections_refused);
  GAUGE("topos_http_connections", "HTTP connections open.", hc.open);
  GAUGE("topos_http_connection_cap", "HTTP connections allowed at once.",
        hc.cap);
  COUNTER("topos_http_connections_accepted_total", "HTTP connections accepted.",
          hc.accepted);
  COUNTER("topos_http_connections_shed_total",
          "Idle HTTP connections closed to make room at the cap.", hc.shed);
  COUNTER("topos_http_connections_refused_total",
          "HTTP connections answered 503 at the cap.", hc.refused);
  COUNTER("topos_http_timeouts_total",
          "HTTP requests or responses past their deadline.", hc.timeouts);
  COUNTER("topos_http_bad_requests_total",
          "HTTP requests refused by the transport (malformed, over a "
          "limit).",
          hc.bad_requests);
  if (hc.tls)
    COUNTER("topos_http_tls_handshake_failures_total",
            "HTTPS handshakes the gateway refused (no or a wrong client "
            "certificate, plain HTTP, a client that gave up).",
            hc.tls_failures);
  text_printf(&b,
              "# HELP topos_backend_tasks_total Tasks each backend ran.\n"
              "# TYPE topos_backend_tasks_total counter\n");
  for (size_t i = 0; i < s->n_backend_tasks; i++)
    text_printf(&b, "topos_backend_tasks_total{backend=\"%s\"} %lld\n",
                s->backend_tasks[i]->backend,
                (long long)s->backend_tasks[i]->tasks);
  /* Per device: what it ran and what crossed the bus. */
  static const struct {
    const char *name, *type, *help;
  } dm[] = {
      {"topos_device_tasks_total", "counter", "Tasks a device ran."},
      {"topos_device_declined_total", "counter",
       "Tasks a device handed back to the reference (a NaN output)."},
      {"topos_device_bytes_up_total", "counter", "Bytes sent to a device."},
      {"topos_device_bytes_down_total", "counter",
       "Bytes read back from a device."},
      {"topos_device_blob_cache_hits_total", "counter",
       "Parameter blobs found resident on a device."},
      {"topos_device_blob_cache_bytes", "gauge",
       "Parameter blob bytes resident on a device."},
      {"topos_device_memory_free_bytes", "gauge", "A device's free memory."},
  };
  for (size_t m = 0; m < sizeof dm / sizeof dm[0] && s->n_devices > 0; m++) {
    text_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", dm[m].name, dm[m].help,
                dm[m].name, dm[m].type);
    for (size_t i = 0; i < s->n_devices; i++) {
      const Topos__V1__DeviceInfo *d = s->devices[i];
      int64_t v = m == 0   ? d->tasks
                  : m == 1 ? d->declined
                  : m == 2 ? d->bytes_up
                  : m == 3 ? d->bytes_down
                  : m == 4 ? d->cache_hits
                  : m == 5 ? d->cache_bytes
                           : d->memory_free;
      text_printf(&b, "%s{device=\"%s:%d\"} %lld\n", dm[m].name, d->backend,
                  (int)d->ordinal, (long long)v);
    }
  }
#undef GAUGE
#undef COUNTER
  protobuf_c_message_free_unpacked(&s->base, NULL);
  metrics_write_requests(&b);
  metrics_write_tenants(&b);
  if (b.failed) {
    free(b.data);
    gateway_error(&x->resp, 8, "out of memory writing the metrics");
    return true;
  }
  return reply_text(x, 200, "text/plain; version=0.0.4; charset=utf-8", b.data,
                    b.len);
}

/* ------------------------------------------------------------ the page */

/* GET /specs/{id}: Describe (svg), then Lower and Emit of the chosen
 * entry (query: root, observe, posture, numerics), then the page.  With
 * no root, the spec's outputs are the roots: Describe (json) first.
 * saved[0] is the svg, saved[1] the describe json, saved[2] the plan. */
enum { PAGE_SVG, PAGE_ROOTS, PAGE_LOWER, PAGE_EMIT };

static bool page_next(http_exchange *x);
static Topos__V1__Entry *page_entry(http_exchange *x, const char *roots_json);

static bool percent_decode(char *s, bool plus);

static bool page_reply(http_exchange *x, const char *hlo) {
  size_t len = 0;
  /* The entry as the query gave it, decoded for reading. */
  const char *query = strchr(x->req.target, '?');
  char label[512];
  snprintf(label, sizeof label, "%s", query ? query + 1 : "");
  if (!percent_decode(label, true) || label[0] == '\0')
    snprintf(label, sizeof label, "%s",
             query ? query + 1 : "the spec's outputs");
  char *html = page_html(x->name, x->saved[0], x->saved[2], label, hlo, &len);
  return reply_text(x, 200, "text/html; charset=utf-8", html, len);
}

static bool finish_page(http_exchange *x) {
  if (x->call.status != WIRE_GRPC_OK) {
    if (x->stage < PAGE_LOWER) {
      gateway_error(&x->resp, x->call.status, "%s", x->call.message);
      return true;
    }
    /* The graph is shown even when the entry cannot be planned. */
    char why[1100];
    snprintf(why, sizeof why, "(not available: %s)", x->call.message);
    if (x->stage == PAGE_LOWER) {
      free(x->saved[2]);
      x->saved[2] = strdup(why);
    }
    return page_reply(x, why);
  }
  ProtobufCMessage *m = NULL;
  char *text = NULL;
  if (x->stage == PAGE_LOWER) {
    Topos__V1__LowerReply *r = (Topos__V1__LowerReply *)call_result(
        x, &topos__v1__lower_reply__descriptor);
    if (r == NULL) return true;
    text = strdup(r->text ? r->text : "");
    m = &r->base;
  } else {
    Topos__V1__TextReply *r = (Topos__V1__TextReply *)call_result(
        x, &topos__v1__text_reply__descriptor);
    if (r == NULL) return true;
    text = strdup(r->text ? r->text : "");
    m = &r->base;
  }
  protobuf_c_message_free_unpacked(m, NULL);
  if (text == NULL) {
    gateway_error(&x->resp, 8, "out of memory");
    return true;
  }
  if (x->stage == PAGE_EMIT) {
    bool done = page_reply(x, text);
    free(text);
    return done;
  }
  x->saved[x->stage] = text;
  x->stage++;
  return page_next(x);
}

static bool page_next(http_exchange *x) {
  gateway *g = x->gw;
  if (x->stage == PAGE_ROOTS && x->arg) x->stage = PAGE_LOWER; /* given */
  if (x->stage == PAGE_SVG || x->stage == PAGE_ROOTS) {
    Topos__V1__DescribeRequest r = TOPOS__V1__DESCRIBE_REQUEST__INIT;
    r.id = x->name;
    r.format =
        x->stage == PAGE_SVG ? TOPOS__V1__FORMAT__SVG : TOPOS__V1__FORMAT__JSON;
    return start_call(g, x, "Describe", &r.base, finish_page, false);
  }
  Topos__V1__Entry *e = page_entry(x, x->saved[1]);
  if (e == NULL) return true;
  bool done;
  if (x->stage == PAGE_LOWER) {
    Topos__V1__LowerRequest r = TOPOS__V1__LOWER_REQUEST__INIT;
    r.id = x->name;
    r.entry = e;
    done = start_call(g, x, "Lower", &r.base, finish_page, false);
  } else {
    Topos__V1__EmitRequest r = TOPOS__V1__EMIT_REQUEST__INIT;
    r.id = x->name;
    r.entry = e;
    done = start_call(g, x, "Emit", &r.base, finish_page, false);
  }
  protobuf_c_message_free_unpacked(&e->base, NULL);
  return done;
}

/* The page's entry from its query; roots_json is Describe's JSON when the
 * query names no root (the spec's outputs become the roots). */
static Topos__V1__Entry *page_entry(http_exchange *x, const char *roots_json) {
  struct http_parser_url u;
  http_parser_url_init(&u);
  http_parser_parse_url(x->req.target, strlen(x->req.target), 0, &u);
  query q = {0};
  if ((u.field_set & (1 << UF_QUERY)) &&
      !parse_query(x, x->req.target + u.field_data[UF_QUERY].off,
                   u.field_data[UF_QUERY].len, &q))
    return NULL;
  cJSON *doc = cJSON_CreateObject();
  cJSON *roots = cJSON_AddArrayToObject(doc, "roots");
  cJSON *observes = cJSON_AddArrayToObject(doc, "observes");
  for (int i = 0; i < q.n; i++) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", q.values[i]);
    if (strcmp(q.keys[i], "root") == 0)
      cJSON_AddItemToArray(roots, v);
    else if (strcmp(q.keys[i], "observe") == 0)
      cJSON_AddItemToArray(observes, v);
    else
      cJSON_Delete(v);
  }
  const char *posture = query_get(&q, "posture");
  const char *numerics = query_get(&q, "numerics");
  if (posture) cJSON_AddStringToObject(doc, "posture", posture);
  if (numerics) cJSON_AddStringToObject(doc, "numerics", numerics);
  if (cJSON_GetArraySize(roots) == 0 && roots_json != NULL) {
    cJSON *desc = cJSON_Parse(roots_json);
    const cJSON *node;
    cJSON_ArrayForEach(node, cJSON_GetObjectItemCaseSensitive(desc, "nodes")) {
      const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
      const cJSON *index = cJSON_GetObjectItemCaseSensitive(node, "index");
      if (cJSON_IsString(role) && strcmp(role->valuestring, "output") == 0 &&
          cJSON_IsNumber(index)) {
        cJSON *v = cJSON_CreateObject();
        cJSON_AddNumberToObject(v, "index", index->valuedouble);
        cJSON_AddItemToArray(roots, v);
      }
    }
    cJSON_Delete(desc);
  }
  /* posture and numerics are the enum names, in any case. */
  for (const char *key = "posture"; key;
       key = key[0] == 'p' ? "numerics" : NULL) {
    cJSON *item = cJSON_GetObjectItemCaseSensitive(doc, key);
    if (item && cJSON_IsString(item))
      for (char *p = item->valuestring; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  }
  char msg[600];
  ProtobufCMessage *m =
      pbjson_to_message(&topos__v1__entry__descriptor, doc, msg, sizeof msg);
  cJSON_Delete(doc);
  free(q.storage);
  if (m == NULL) bad_request(x, "the page's entry: %s", msg);
  return (Topos__V1__Entry *)m;
}

/* --------------------------------------------------------------- routing */

static bool method_not_allowed(http_exchange *x, const char *allow) {
  gateway_http_error(&x->resp, 405, "METHOD_NOT_ALLOWED",
                     "this resource takes %s", allow);
  snprintf(x->resp.headers, sizeof x->resp.headers, "Allow: %s\r\n", allow);
  return true;
}

static bool is_get(const http_exchange *x) {
  return x->req.method == HTTP_GET || x->req.method == HTTP_HEAD;
}

static bool route(gateway *g, http_exchange *x, char **seg, int nseg,
                  query *q) {
  bool get = is_get(x), post = x->req.method == HTTP_POST;
  static const char *const none[] = {NULL};

  if (nseg == 1 &&
      (strcmp(seg[0], "healthz") == 0 || strcmp(seg[0], "readyz") == 0 ||
       strcmp(seg[0], "metrics") == 0 || strcmp(seg[0], "openapi.json") == 0)) {
    if (!get) return method_not_allowed(x, "GET, HEAD");
    if (!query_check(x, q, none)) return true;
    if (seg[0][0] == 'h') {
      Topos__V1__HealthRequest r = TOPOS__V1__HEALTH_REQUEST__INIT;
      return start_call(g, x, "Health", &r.base, finish_health, true);
    }
    if (seg[0][0] == 'r') {
      Grpc__Health__V1__HealthCheckRequest r =
          GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
      return start_call(g, x, "grpc.health.v1.Health/Check", &r.base,
                        finish_ready, true);
    }
    if (seg[0][0] == 'm') {
      /* The daemon-wide view (every tenant's calls, the store's totals)
       * is the admins': a tenant's own counts are its Stats. */
      if (x->call.tenant[0] != '\0' && !x->call.admin) {
        log_event("auth",
                  "refused /metrics from %s (http): tenant %s is not an admin",
                  x->req.peer ? x->req.peer : "", x->call.tenant);
        gateway_error(&x->resp, 7, /* PERMISSION_DENIED */
                      "/metrics: the daemon-wide metrics are for admin "
                      "tenants, and tenant %s is not one; give Prometheus an "
                      "admin tenant's token (topos tenant add NAME --admin; "
                      "topos token create NAME); a tenant's own request "
                      "counts are in its Stats",
                      x->call.tenant);
        return true;
      }
      x->arg = atomic_load(&g->d->busy_workers);
      Topos__V1__StatsRequest r = TOPOS__V1__STATS_REQUEST__INIT;
      return start_call(g, x, "Stats", &r.base, finish_metrics, true);
    }
    size_t len = (size_t)(gateway_openapi_json_end - gateway_openapi_json);
    char *doc = malloc(len + 1);
    if (doc) memcpy(doc, gateway_openapi_json, len);
    return reply_text(x, 200, "application/json", doc, len);
  }

  if (nseg == 2 && strcmp(seg[0], "v1") == 0 &&
      strcmp(seg[1], "backends") == 0) {
    if (!get) return method_not_allowed(x, "GET, HEAD");
    if (!query_check(x, q, none)) return true;
    Topos__V1__BackendsRequest r = TOPOS__V1__BACKENDS_REQUEST__INIT;
    return start_call(g, x, "Backends", &r.base, finish_json_backends, false);
  }

  if (nseg == 2 && strcmp(seg[0], "v1") == 0 && strcmp(seg[1], "specs") == 0) {
    if (get) {
      static const char *const known[] = {"page_size", "page_token", NULL};
      if (!query_check(x, q, known)) return true;
      Topos__V1__ListSpecsRequest r = TOPOS__V1__LIST_SPECS_REQUEST__INIT;
      const char *size = query_get(q, "page_size");
      if (size) {
        char *end = NULL;
        long v = strtol(size, &end, 10);
        if (size[0] == '\0' || *end != '\0' || v < 0 || v > 1000000)
          return bad_request(x, "page_size '%.40s' is not a count", size);
        r.page_size = (int32_t)v;
      }
      const char *token = query_get(q, "page_token");
      if (token) r.page_token = (char *)token;
      return start_call(g, x, "ListSpecs", &r.base, finish_json_list, false);
    }
    if (!post) return method_not_allowed(x, "GET, HEAD, POST");
    if (!query_check(x, q, none)) return true;
    const char *ct = x->req.content_type;
    if (is_json_type(ct)) {
      ProtobufCMessage *m = body_message(x, &topos__v1__spec__descriptor);
      if (m == NULL) return true;
      bool done = start_call(g, x, "Record", m, finish_json_record, false);
      protobuf_c_message_free_unpacked(m, NULL);
      return done;
    }
    if (ct[0] != '\0' && strncasecmp(ct, "application/octet-stream", 24) != 0 &&
        strncasecmp(ct, "application/x-protobuf", 22) != 0 &&
        strncasecmp(ct, "application/protobuf", 20) != 0) {
      gateway_http_error(&x->resp, 415, "INVALID_ARGUMENT",
                         "a spec is application/octet-stream (an encoded "
                         "topos.v1.Spec) or application/json, not %.80s",
                         ct);
      return true;
    }
    return start_raw_call(g, x, "Record", finish_json_record);
  }

  if (nseg >= 3 && nseg <= 4 && strcmp(seg[0], "v1") == 0 &&
      strcmp(seg[1], "specs") == 0) {
    char *id = seg[2];
    if (nseg == 3) {
      if (!get) return method_not_allowed(x, "GET, HEAD");
      static const char *const known[] = {"format", NULL};
      if (!query_check(x, q, known)) return true;
      const char *format = query_get(q, "format");
      static const char *const formats[] = {"text", "json", "dot", "svg"};
      int f = 0;
      if (format) {
        for (f = 0; f < 4 && strcmp(format, formats[f]) != 0; f++) {
        }
        if (f == 4)
          return bad_request(x, "format '%.40s' is not text, json, dot or svg",
                             format);
      }
      x->arg = f;
      Topos__V1__DescribeRequest r = TOPOS__V1__DESCRIBE_REQUEST__INIT;
      r.id = id;
      r.format = (Topos__V1__Format)f;
      return start_call(g, x, "Describe", &r.base, finish_describe, false);
    }
    const char *verb = seg[3];
    if (strcmp(verb, "lower") != 0 && strcmp(verb, "emit") != 0 &&
        strcmp(verb, "conformance") != 0) {
      gateway_http_error(&x->resp, 404, "NOT_FOUND",
                         "no resource %.40s under a spec (lower, emit, "
                         "conformance)",
                         verb);
      return true;
    }
    if (!post) return method_not_allowed(x, "POST");
    if (verb[0] == 'l') {
      if (!query_check(x, q, none)) return true;
      Topos__V1__Entry *e =
          (Topos__V1__Entry *)body_message(x, &topos__v1__entry__descriptor);
      if (e == NULL) return true;
      Topos__V1__LowerRequest r = TOPOS__V1__LOWER_REQUEST__INIT;
      r.id = id;
      r.entry = e;
      bool done = start_call(g, x, "Lower", &r.base, finish_json_lower, false);
      protobuf_c_message_free_unpacked(&e->base, NULL);
      return done;
    }
    if (verb[0] == 'e') {
      static const char *const known[] = {"form", NULL};
      if (!query_check(x, q, known)) return true;
      const char *form = query_get(q, "form");
      Topos__V1__Form fm = TOPOS__V1__FORM__PRETTY;
      if (form && strcmp(form, "generic") == 0)
        fm = TOPOS__V1__FORM__GENERIC;
      else if (form && strcmp(form, "pretty") != 0)
        return bad_request(x, "form '%.40s' is not pretty or generic", form);
      Topos__V1__Entry *e =
          (Topos__V1__Entry *)body_message(x, &topos__v1__entry__descriptor);
      if (e == NULL) return true;
      Topos__V1__EmitRequest r = TOPOS__V1__EMIT_REQUEST__INIT;
      r.id = id;
      r.entry = e;
      r.form = fm;
      bool done = start_call(g, x, "Emit", &r.base, finish_text, false);
      protobuf_c_message_free_unpacked(&e->base, NULL);
      return done;
    }
    if (!query_check(x, q, none)) return true;
    Topos__V1__ConformanceRequest *r =
        (Topos__V1__ConformanceRequest *)body_message(
            x, &topos__v1__conformance_request__descriptor);
    if (r == NULL) return true;
    bool done;
    if (r->id[0] != '\0' && strcmp(r->id, id) != 0) {
      done = bad_request(x, "the body's id is not the path's (leave it out)");
    } else {
      /* pbjson strdup'd any id it read, "" included. */
      if (r->id != NULL && r->id != (char *)protobuf_c_empty_string)
        free(r->id);
      r->id = strdup(id);
      done = r->id == NULL ? (gateway_error(&x->resp, 8, "out of memory"), true)
                           : start_call(g, x, "Conformance", &r->base,
                                        finish_json_conformance, false);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return done;
  }

  if (nseg == 2 && strcmp(seg[0], "specs") == 0) {
    if (!get) return method_not_allowed(x, "GET, HEAD");
    static const char *const known[] = {"root", "observe", "posture",
                                        "numerics", NULL};
    if (!query_check(x, q, known)) return true;
    if (strlen(seg[1]) >= sizeof x->name)
      return bad_request(x, "'%.40s...' is not a spec id", seg[1]);
    snprintf(x->name, sizeof x->name, "%s", seg[1]);
    x->stage = PAGE_SVG;
    x->arg = query_get(q, "root") != NULL;
    return page_next(x);
  }

  gateway_http_error(&x->resp, 404, "NOT_FOUND",
                     "no resource at this path (GET /openapi.json lists "
                     "them)");
  return true;
}

/* The bearer check of auth.h, for every path but the probes and the API
 * description: true when the call may go on (x->call carries the
 * tenant), false with a 401 (or 503 when the store failed) in x->resp. */
static bool authenticate(gateway *g, http_exchange *x, const char *path) {
  if (g->d->auth == NULL || strcmp(path, "/healthz") == 0 ||
      strcmp(path, "/readyz") == 0 || strcmp(path, "/openapi.json") == 0)
    return true;
  auth_result r;
  int64_t now_ms = daemon_now_ns() / 1000000;
  const char *peer = x->req.peer ? x->req.peer : "";
  if (!auth_peer_throttled(g->d->auth, peer, now_ms, &r)) {
    auth_check(g->d->auth, path,
               x->req.has_authorization ? x->req.authorization : NULL,
               x->req.authorization_len, &r);
    if (r.status == WIRE_GRPC_OK) {
      snprintf(x->call.tenant, sizeof x->call.tenant, "%s", r.tenant);
      x->call.admin = r.admin;
      return true;
    }
    if (r.status == 16) /* UNAUTHENTICATED */
      auth_peer_failed(g->d->auth, peer, now_ms);
  }
  log_event_at(LOG_WARN, "auth", "refused %.200s from %s (http): %s%s%s", path,
               x->req.peer ? x->req.peer : "", r.reason,
               r.token_id[0] ? " token " : "", r.token_id);
  if (r.status == 16) { /* UNAUTHENTICATED */
    gateway_http_error(&x->resp, 401, "UNAUTHENTICATED", "%s", r.message);
    snprintf(x->resp.headers, sizeof x->resp.headers,
             "WWW-Authenticate: Bearer realm=\"toposd\"\r\n");
  } else {
    gateway_error(&x->resp, r.status, "%s", r.message);
  }
  return false;
}

bool gateway_route(gateway *g, http_exchange *x) {
  const char *target = x->req.target;
  struct http_parser_url u;
  http_parser_url_init(&u);
  if (http_parser_parse_url(target, strlen(target), 0, &u) != 0 ||
      !(u.field_set & (1 << UF_PATH)))
    return bad_request(x, "the request target is not a path");
  char *path =
      strndup(target + u.field_data[UF_PATH].off, u.field_data[UF_PATH].len);
  if (path == NULL) {
    gateway_error(&x->resp, 8, "out of memory");
    return true;
  }
  if (!authenticate(g, x, path)) {
    free(path);
    return true;
  }
  query q = {0};
  bool done = true;
  char *seg[MAX_SEGMENTS];
  int nseg = 0;
  /* Segments split first, then decoded: an encoded '/' stays inside its
   * segment (and an id with one is refused by the method). */
  bool ok = path[0] == '/';
  for (char *p = path + 1; ok && nseg < MAX_SEGMENTS;) {
    char *slash = strchr(p, '/');
    if (slash) *slash = '\0';
    seg[nseg++] = p;
    if (!slash) break;
    p = slash + 1;
    if (nseg == MAX_SEGMENTS) ok = false;
  }
  for (int i = 0; ok && i < nseg; i++) ok = percent_decode(seg[i], false);
  if (!ok) {
    done = bad_request(x,
                       "the path is not a resource path (bad "
                       "percent-encoding, or too many segments)");
  } else if ((u.field_set & (1 << UF_QUERY)) &&
             !parse_query(x, target + u.field_data[UF_QUERY].off,
                          u.field_data[UF_QUERY].len, &q)) {
    done = true;
  } else {
    done = route(g, x, seg, nseg, &q);
  }
  free(q.storage);
  free(path);
  return done;
}
