/*
 * http.c - the HTTP/1.1 transport of toposd's gateway (http.h): a libuv
 * loop on its own thread, requests parsed by http-parser.
 *
 * A connection is in one of four states:
 *   IDLE     between requests (keep-alive): closed after
 *            http_idle_timeout_ms, or at once when the daemon drains;
 *   READING  a request has begun: its line and headers must be complete
 *            within http_read_timeout_ms of its first byte, and each gap
 *            in its body must be shorter than that, else 408 and close;
 *   WAITING  the request is complete and being answered (a service call
 *            on a worker, usually).  Reading goes on so that a client
 *            that hangs up cancels the call, but what it sends meanwhile
 *            (a pipelined request) is only buffered, up to PENDING_MAX;
 *   WRITING  the response is being written (a client that stops reading
 *            is closed after http_idle_timeout_ms).
 * Pipelined requests are answered in order, one at a time: on a complete
 * request the parser is paused, and the bytes after it wait in `pending`
 * until the response is written.
 *
 * Limits: the request target (MAX_TARGET, else 414), the line and headers
 * together (http_header_bytes, else 431; at most MAX_HEADERS fields), the
 * body (http_body_bytes: a Content-Length over it is 413 before a byte of
 * body is read, a chunked body is 413 once it passes it).  Anything the
 * parser refuses (a malformed line, a bad chunk size, Content-Length with
 * Transfer-Encoding) is 400.  After any of these the connection closes.
 * At http_max_connections a new connection makes the longest-idle one
 * close; when none is idle, the new one gets 503 and is closed.
 *
 * TLS: when the daemon has a certificate (--tls-cert), every connection
 * speaks TLS through OpenSSL over memory BIOs: what the socket brings is
 * written into the connection's read BIO and the plain text SSL_read
 * gives back goes through the same path as a plain connection's bytes;
 * what goes out (handshake records, responses, alerts) is SSL_written and
 * the write BIO's records handed to uv_write.  The handshake must be done
 * within http_read_timeout_ms of the connection; a client that speaks
 * plain HTTP to the port gets a plain 400 saying so.  With --tls-client-ca
 * a client certificate from one of those CAs is required.
 *
 * Threads: everything here runs on the loop's thread except on_call_done
 * (a worker's), which queues the finished exchange under a lock and wakes
 * the loop with uv_async_send.
 */
#include "http.h"

#include <http_parser.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <uv.h>

#include "config.h"
#include "log.h"
#include "version.h"

#define READ_CHUNK 65536
#define SWEEP_MS 100
#define MAX_TARGET 8192
#define MAX_HEADERS 100
#define PENDING_MAX ((size_t)64 << 10)
#define STOP_FLUSH_MS 1000
/* Descriptors kept out of the HTTP cap for everything else. */
#define FD_HEADROOM 64

typedef enum conn_state { C_IDLE, C_READING, C_WAITING, C_WRITING } conn_state;

typedef struct conn conn;
struct conn {
  uv_tcp_t tcp;
  http_server *h;
  conn *prev, *next;
  http_parser parser;
  conn_state state;
  bool closing;     /* uv_close was called */
  bool close_after; /* close once the response is written */
  bool headers_done;
  int64_t request_start_ns, last_read_ns, write_start_ns;
  char peer[64];
  /* The request being read. */
  text_buf target;
  size_t header_bytes;
  int nheaders;
  int header_state; /* 0: none yet, 1: in a field, 2: in a value */
  char field[24];
  size_t field_len;
  char ctype[128];
  size_t ctype_len;
  char expect[24];
  size_t expect_len;
  /* Authorization: kept whole up to the buffer, counted past it (auth.c
   * reads no value longer than 256 bytes). */
  char authz[300];
  size_t authz_len;
  bool has_authz;
  uint8_t *body;
  size_t body_len, body_cap;
  int error_status; /* a limit a callback hit: 413, 414, 431 */
  /* Bytes after a complete request, not parsed yet. */
  char *pending;
  size_t pending_len;
  http_exchange *x; /* the request being answered */
  /* The response being written. */
  uv_write_t write_req;
  char *out_head, *out_body;
  /* TLS (NULL on a plain connection): the session, over memory BIOs. */
  SSL *ssl;
  bool handshake_done;
  int64_t accept_ns;
};

struct http_server {
  daemon_state *d;
  gateway gw;
  const toposd_config *cfg;
  uv_loop_t loop;
  uv_tcp_t server;
  uv_timer_t sweep;
  uv_async_t wake;
  pthread_t thread;
  bool thread_started;
  conn *conns; /* every open connection */
  int nconns;
  int cap; /* http_max_connections, clamped below the descriptor limit */
  char read_buf[READ_CHUNK]; /* one read at a time on this thread */
  bool read_buf_busy;
  SSL_CTX *tls;               /* NULL: plain HTTP */
  char plain_buf[READ_CHUNK]; /* what SSL_read decrypts, one at a time */
  /* Exchanges the workers finished, for the loop. */
  pthread_mutex_t done_lock;
  http_exchange *done_head, *done_tail;
  _Atomic int stop_requested;
  bool stopping;
  uv_timer_t stop_timer;
  /* Counters (written on the loop's thread, read by /metrics on it too,
   * and by http_server_counts from any thread). */
  _Atomic int64_t accepted, shed, refused, timeouts, bad_requests, tls_failures;
  _Atomic int open;
};

static http_parser_settings settings;

static int64_t now_ns(void) {
  return daemon_now_ns();
}

/* ------------------------------------------------------------ responses */

static const char *reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
  }
  return "Status";
}

static void conn_close(conn *c);
static void next_request(conn *c);
static void start_reading(conn *c);
static void feed(conn *c, const char *data, size_t len);
static void tls_pump(conn *c);

/* ------------------------------------------------------------- writing */

/* Bytes sent as they are, from a copy of their own: TLS records the
 * handshake or a read produced, the 100 Continue line.  With close, the
 * connection closes once they are written (an alert, a refusal). */
typedef struct raw_write {
  uv_write_t req;
  conn *c;
  bool close;
  char data[];
} raw_write;

static void on_raw_written(uv_write_t *req, int status) {
  raw_write *w = (raw_write *)req;
  conn *c = w->c;
  bool close = w->close;
  free(w);
  /* A cancelled write (the connection is closing) runs before on_closed,
   * so c is still there. */
  if ((status < 0 || close) && !c->closing) conn_close(c);
}

static void write_raw(conn *c, const void *data, size_t len, bool close) {
  if (c->closing) return;
  if (len == 0) {
    if (close) conn_close(c);
    return;
  }
  raw_write *w = malloc(sizeof *w + len);
  if (w == NULL) {
    conn_close(c);
    return;
  }
  w->c = c;
  w->close = close;
  memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_raw_written) != 0) {
    free(w);
    conn_close(c);
  }
}

/* The records waiting in the write BIO, taken out: a malloc'd copy (NULL
 * when there are none or out of memory; *len says which). */
static char *tls_take(conn *c, size_t *len) {
  BIO *out = SSL_get_wbio(c->ssl);
  char *p = NULL;
  long n = BIO_get_mem_data(out, &p);
  *len = 0;
  if (n <= 0) return NULL;
  char *copy = malloc((size_t)n);
  if (copy != NULL) {
    memcpy(copy, p, (size_t)n);
    *len = (size_t)n;
  }
  (void)BIO_reset(out);
  return copy;
}

/* Sends what the write BIO holds. */
static void tls_flush(conn *c, bool close) {
  size_t len = 0;
  char *data = tls_take(c, &len);
  write_raw(c, data, len, close);
  free(data);
}

/* Encrypts len bytes into the write BIO (which grows as needed: SSL_write
 * on a memory BIO writes everything).  False on an error. */
static bool tls_put(conn *c, const char *data, size_t len) {
  while (len > 0) {
    int chunk = len > (1u << 20) ? 1 << 20 : (int)len;
    int n = SSL_write(c->ssl, data, chunk);
    if (n <= 0) return false;
    data += n;
    len -= (size_t)n;
  }
  return true;
}

static void on_write(uv_write_t *req, int status) {
  conn *c = req->data;
  free(c->out_head);
  free(c->out_body);
  c->out_head = c->out_body = NULL;
  if (c->closing) return;
  if (status < 0) {
    conn_close(c);
    return;
  }
  next_request(c);
}

/* Writes r (taking its body) and moves c to WRITING. */
static void send_response(conn *c, http_response *r) {
  http_server *h = c->h;
  bool head = c->parser.method == HTTP_HEAD;
  if (atomic_load(&h->d->draining) || h->stopping) c->close_after = true;
  char date[64];
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  char *headers = malloc(1024);
  if (headers == NULL) {
    free(r->body);
    r->body = NULL;
    conn_close(c);
    return;
  }
  int n = snprintf(headers, 1024,
                   "HTTP/1.1 %d %s\r\n"
                   "Server: toposd/%s\r\n"
                   "Date: %s\r\n"
                   "Content-Type: %s\r\n"
                   "Content-Length: %zu\r\n"
                   "X-Content-Type-Options: nosniff\r\n"
                   "%s%s\r\n",
                   r->status, reason(r->status), TOPOSD_VERSION, date,
                   r->content_type ? r->content_type : "application/json",
                   r->body_len, r->headers,
                   c->close_after ? "Connection: close\r\n" : "");
  if (n < 0 || n >= 1024) n = 1023;
  c->out_head = headers;
  c->out_body = r->body;
  r->body = NULL;
  uv_buf_t bufs[2] = {uv_buf_init(headers, (unsigned)n),
                      uv_buf_init(c->out_body ? c->out_body : "",
                                  head ? 0 : (unsigned)r->body_len)};
  if (c->ssl != NULL) {
    /* One buffer of records: the head and body encrypted (and a
     * close_notify after them when the connection closes), the plain
     * text freed at once. */
    bool ok = tls_put(c, bufs[0].base, bufs[0].len) &&
              tls_put(c, bufs[1].base, bufs[1].len);
    if (ok && c->close_after) (void)SSL_shutdown(c->ssl);
    free(c->out_head);
    free(c->out_body);
    c->out_body = NULL;
    size_t len = 0;
    c->out_head = ok ? tls_take(c, &len) : NULL;
    if (c->out_head == NULL) {
      conn_close(c);
      return;
    }
    bufs[0] = uv_buf_init(c->out_head, (unsigned)len);
    bufs[1].len = 0;
  }
  c->state = C_WRITING;
  c->write_start_ns = now_ns();
  c->write_req.data = c;
  if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, bufs, bufs[1].len ? 2 : 1,
               on_write) != 0) {
    free(c->out_head);
    free(c->out_body);
    c->out_head = c->out_body = NULL;
    conn_close(c);
  }
}

/* A response of the transport's own (limits, malformed requests): the
 * connection closes after it. */
static void send_error(conn *c, int status, const char *code,
                       const char *message) {
  http_response r;
  memset(&r, 0, sizeof r);
  gateway_http_error(&r, status, code, "%s", message);
  c->close_after = true;
  atomic_fetch_add(&c->h->bad_requests, 1);
  send_response(c, &r);
}

/* ------------------------------------------------------------ exchanges */

static void exchange_free(http_exchange *x) {
  free(x->req.target);
  free(x->req.body);
  free(x->resp.body);
  free(x->packed);
  free(x->call.out);
  free(x->saved[0]);
  free(x->saved[1]);
  free(x->saved[2]);
  free(x);
}

/* The exchange is answered: send its response. */
static void exchange_complete(http_exchange *x) {
  conn *c = x->conn;
  if (c == NULL) { /* the client went away meanwhile */
    exchange_free(x);
    return;
  }
  c->x = NULL;
  send_response(c, &x->resp);
  exchange_free(x);
}

/* A worker's: the service call is answered. */
static void on_call_done(service_call *call) {
  http_exchange *x = call->user;
  http_server *h = x->server;
  pthread_mutex_lock(&h->done_lock);
  if (h->done_tail)
    h->done_tail->next = x;
  else
    h->done_head = x;
  h->done_tail = x;
  pthread_mutex_unlock(&h->done_lock);
  uv_async_send(&h->wake);
}

/* The exchanges the workers finished, in order, taken off the list. */
static http_exchange *take_done(http_server *h) {
  pthread_mutex_lock(&h->done_lock);
  http_exchange *x = h->done_head;
  h->done_head = h->done_tail = NULL;
  pthread_mutex_unlock(&h->done_lock);
  return x;
}

static void run_done(http_server *h) {
  http_exchange *x = take_done(h);
  while (x) {
    http_exchange *next = x->next;
    x->next = NULL;
    if (x->conn == NULL) /* the client went away: nothing to answer */
      exchange_free(x);
    else if (x->finish(x))
      exchange_complete(x);
    x = next;
  }
}

/* A complete request: hand it to the gateway. */
static void dispatch(conn *c) {
  http_server *h = c->h;
  c->state = C_WAITING;
  if (c->parser.upgrade) c->close_after = true; /* the upgrade is ignored */
  if (!http_should_keep_alive(&c->parser)) c->close_after = true;
  if (c->parser.method == HTTP_CONNECT) {
    send_error(c, 405, "METHOD_NOT_ALLOWED", "CONNECT is not served here");
    return;
  }
  http_exchange *x = calloc(1, sizeof *x);
  if (x == NULL || c->target.failed) {
    free(x);
    send_error(c, 503, "UNAVAILABLE", "out of memory");
    return;
  }
  x->conn = c;
  x->req.method = c->parser.method;
  x->req.target = c->target.data ? c->target.data : strdup("");
  c->target = (text_buf){0};
  memcpy(x->req.content_type, c->ctype, c->ctype_len);
  x->req.content_type[c->ctype_len] = '\0';
  x->req.has_authorization = c->has_authz;
  x->req.authorization_len = c->authz_len;
  memcpy(x->req.authorization, c->authz,
         c->authz_len < sizeof c->authz ? c->authz_len : sizeof c->authz);
  x->req.body = c->body;
  x->req.body_len = c->body_len;
  c->body = NULL;
  c->body_len = c->body_cap = 0;
  x->req.peer = c->peer;
  x->req.arrival_ns = now_ns();
  x->call.user = x;
  x->call.done = on_call_done;
  snprintf(x->call.peer, sizeof x->call.peer, "%s", c->peer);
  c->x = x;
  if (x->req.target == NULL) {
    c->x = NULL;
    exchange_free(x);
    send_error(c, 503, "UNAVAILABLE", "out of memory");
    return;
  }
  x->server = h;
  x->gw = &h->gw;
  if (gateway_route(&h->gw, x)) exchange_complete(x);
}

/* ------------------------------------------------------------- parsing */

static void reset_request(conn *c) {
  free(c->target.data);
  c->target = (text_buf){0};
  c->header_bytes = 0;
  c->nheaders = 0;
  c->header_state = 0;
  c->field_len = c->ctype_len = c->expect_len = c->authz_len = 0;
  c->has_authz = false;
  free(c->body);
  c->body = NULL;
  c->body_len = c->body_cap = 0;
  c->error_status = 0;
  c->headers_done = false;
}

static int on_message_begin(http_parser *p) {
  conn *c = p->data;
  reset_request(c);
  c->state = C_READING;
  c->request_start_ns = now_ns();
  return 0;
}

static bool count_header_bytes(conn *c, size_t len) {
  c->header_bytes += len;
  if (c->header_bytes > (size_t)c->h->cfg->http_header_bytes) {
    c->error_status = 431;
    return false;
  }
  return true;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  conn *c = p->data;
  if (c->target.len + len > MAX_TARGET) {
    c->error_status = 414;
    return 1;
  }
  if (!count_header_bytes(c, len)) return 1;
  text_put(&c->target, at, len);
  return 0;
}

/* RFC 9110's tchar: http-parser, built lenient, lets a space into a field
 * name ("Content-Length : 5"), which a proxy in front may read another
 * way; such names are refused here. */
static bool is_tchar(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || (ch != 0 && strchr("!#$%&'*+-.^_`|~", ch));
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  conn *c = p->data;
  if (!count_header_bytes(c, len)) return 1;
  for (size_t i = 0; i < len; i++)
    if (!is_tchar((unsigned char)at[i])) {
      c->error_status = 400;
      return 1;
    }
  if (c->header_state != 1) {
    if (++c->nheaders > MAX_HEADERS) {
      c->error_status = 431;
      return 1;
    }
    c->field_len = 0;
    c->header_state = 1;
  }
  for (size_t i = 0; i < len && c->field_len < sizeof c->field - 1; i++)
    c->field[c->field_len++] = at[i];
  if (c->field_len >= sizeof c->field - 1) c->field_len = sizeof c->field - 1;
  c->field[c->field_len] = '\0';
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  conn *c = p->data;
  if (!count_header_bytes(c, len)) return 1;
  bool first = c->header_state != 2;
  c->header_state = 2;
  if (strcasecmp(c->field, "content-type") == 0) {
    if (first) c->ctype_len = 0;
    for (size_t i = 0; i < len && c->ctype_len < sizeof c->ctype - 1; i++)
      c->ctype[c->ctype_len++] = at[i];
  } else if (strcasecmp(c->field, "authorization") == 0) {
    if (first) c->authz_len = 0;
    c->has_authz = true;
    for (size_t i = 0; i < len; i++, c->authz_len++)
      if (c->authz_len < sizeof c->authz) c->authz[c->authz_len] = at[i];
  } else if (strcasecmp(c->field, "expect") == 0) {
    if (first) c->expect_len = 0;
    for (size_t i = 0; i < len && c->expect_len < sizeof c->expect - 1; i++)
      c->expect[c->expect_len++] = at[i];
    c->expect[c->expect_len] = '\0';
  }
  return 0;
}

static int on_headers_complete(http_parser *p) {
  conn *c = p->data;
  c->headers_done = true;
  c->last_read_ns = now_ns();
  if (p->http_major != 1) { /* HTTP/0.9 (no version), or not HTTP/1 */
    c->error_status = 505;
    return -1;
  }
  uint64_t limit = (uint64_t)c->h->cfg->http_body_bytes;
  if (p->content_length != ULLONG_MAX && p->content_length > limit) {
    c->error_status = 413;
    return -1;
  }
  bool has_body = (p->flags & F_CHUNKED) ||
                  (p->content_length != ULLONG_MAX && p->content_length > 0);
  if (has_body && c->expect_len > 0 &&
      strcasecmp(c->expect, "100-continue") == 0) {
    static const char continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (c->ssl == NULL)
      write_raw(c, continue_line, sizeof continue_line - 1, false);
    else if (tls_put(c, continue_line, sizeof continue_line - 1))
      tls_flush(c, false);
    else
      return -1;
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  conn *c = p->data;
  size_t limit = (size_t)c->h->cfg->http_body_bytes;
  if (c->body_len + len > limit) {
    c->error_status = 413;
    return 1;
  }
  if (c->body_len + len + 1 > c->body_cap) {
    size_t cap = c->body_cap ? c->body_cap : 4096;
    while (cap < c->body_len + len + 1) cap *= 2;
    if (cap > limit + 1) cap = limit + 1;
    uint8_t *grown = realloc(c->body, cap);
    if (grown == NULL) {
      c->error_status = 503;
      return 1;
    }
    c->body = grown;
    c->body_cap = cap;
  }
  memcpy(c->body + c->body_len, at, len);
  c->body_len += len;
  c->body[c->body_len] = '\0';
  return 0;
}

static int on_message_complete(http_parser *p) {
  http_parser_pause(p, 1);
  return 0;
}

/* Parses len bytes: a complete request is dispatched (the rest waits in
 * pending), a malformed one answered and the connection closed. */
static void feed(conn *c, const char *data, size_t len) {
  size_t n = http_parser_execute(&c->parser, &settings, data, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (e == HPE_PAUSED) {
    if (n < len) {
      char *rest = malloc(len - n);
      if (rest == NULL) {
        conn_close(c);
        return;
      }
      memcpy(rest, data + n, len - n);
      free(c->pending);
      c->pending = rest;
      c->pending_len = len - n;
    }
    dispatch(c);
    return;
  }
  if (e == HPE_OK) return;
  switch (c->error_status) {
    case 413: {
      char text[160];
      snprintf(text, sizeof text,
               "the request body is over %lld bytes (--http-body-bytes)",
               (long long)c->h->cfg->http_body_bytes);
      send_error(c, 413, "RESOURCE_EXHAUSTED", text);
      break;
    }
    case 414:
      send_error(c, 414, "INVALID_ARGUMENT",
                 "the request target is over 8192 bytes");
      break;
    case 431: {
      char text[160];
      snprintf(text, sizeof text,
               "the request line and headers are over %lld bytes or %d "
               "fields (--http-header-bytes)",
               (long long)c->h->cfg->http_header_bytes, MAX_HEADERS);
      send_error(c, 431, "RESOURCE_EXHAUSTED", text);
      break;
    }
    case 503:
      send_error(c, 503, "UNAVAILABLE", "out of memory");
      break;
    case 505:
      send_error(c, 505, "UNIMPLEMENTED",
                 "only HTTP/1.0 and HTTP/1.1 are served here");
      break;
    default: {
      char text[200];
      snprintf(text, sizeof text, "malformed HTTP request: %s",
               c->error_status == 400 ? "a header name that is not a token"
                                      : http_errno_description(e));
      send_error(c, 400, "INVALID_ARGUMENT", text);
    }
  }
}

/* The response is written: on to the next request, pipelined or not. */
static void next_request(conn *c) {
  if (c->close_after || c->h->stopping) {
    conn_close(c);
    return;
  }
  reset_request(c);
  c->state = C_IDLE;
  c->last_read_ns = now_ns();
  http_parser_pause(&c->parser, 0);
  if (c->pending_len > 0) {
    char *data = c->pending;
    size_t len = c->pending_len;
    c->pending = NULL;
    c->pending_len = 0;
    feed(c, data, len);
    free(data);
  }
  /* Plain text OpenSSL decrypted but held back (pipelining). */
  if (!c->closing && c->ssl != NULL) tls_pump(c);
  if (!c->closing) start_reading(c);
}

/* ---------------------------------------------------------- connections */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = handle->data;
  http_server *h = c->h;
  if (h->read_buf_busy) {
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  h->read_buf_busy = true;
  buf->base = h->read_buf;
  buf->len = sizeof h->read_buf;
}

/* Bytes of the request stream (as read, or as decrypted). */
static void on_plain(conn *c, const char *data, size_t len) {
  if (c->state == C_WAITING || c->state == C_WRITING) {
    /* A pipelined request: kept for later, up to PENDING_MAX, then the
     * socket is left unread until this response is out. */
    char *grown = realloc(c->pending, c->pending_len + len);
    if (grown == NULL) {
      conn_close(c);
      return;
    }
    memcpy(grown + c->pending_len, data, len);
    c->pending = grown;
    c->pending_len += len;
    if (c->pending_len >= PENDING_MAX) uv_read_stop((uv_stream_t *)&c->tcp);
    return;
  }
  feed(c, data, len);
}

/* OpenSSL's reason for the last error on this thread ("" when none). */
static const char *tls_reason(void) {
  unsigned long e = ERR_peek_last_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;
  return r ? r : "";
}

/* The handshake failed: the client gets the alert OpenSSL made (or, when
 * it spoke plain HTTP to this port, a plain 400 saying so), and the
 * connection closes. */
static void tls_refuse(conn *c) {
  http_server *h = c->h;
  atomic_fetch_add(&h->tls_failures, 1);
  unsigned long e = ERR_peek_last_error();
  bool plain_http = ERR_GET_LIB(e) == ERR_LIB_SSL &&
                    (ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST ||
                     ERR_GET_REASON(e) == SSL_R_HTTPS_PROXY_REQUEST);
  log_event_at(LOG_WARN, "tls", "refused the handshake of %s: %s", c->peer,
               plain_http ? "plain HTTP on the HTTPS port" : tls_reason());
  ERR_clear_error();
  c->state = C_WRITING;
  c->write_start_ns = now_ns();
  if (plain_http) {
    SSL_free(c->ssl);
    c->ssl = NULL;
    send_error(c, 400, "INVALID_ARGUMENT",
               "this port serves HTTPS: connect with TLS (https://)");
    return;
  }
  tls_flush(c, true);
}

/* Runs the handshake and reads what the read BIO holds, as far as it can:
 * the plain text goes to on_plain.  What OpenSSL has to send meanwhile
 * (handshake records, session tickets, alerts) is sent. */
static void tls_pump(conn *c) {
  http_server *h = c->h;
  if (!c->handshake_done) {
    ERR_clear_error();
    int rc = SSL_do_handshake(c->ssl);
    if (rc != 1) {
      if (SSL_get_error(c->ssl, rc) == SSL_ERROR_WANT_READ) {
        tls_flush(c, false);
        return;
      }
      tls_refuse(c);
      return;
    }
    c->handshake_done = true;
  }
  while (!c->closing && c->ssl != NULL) {
    /* A response is being made and the pipelined bytes are at their cap:
     * the rest stays in OpenSSL's buffers until next_request. */
    if ((c->state == C_WAITING || c->state == C_WRITING) &&
        c->pending_len >= PENDING_MAX)
      break;
    ERR_clear_error();
    int n = SSL_read(c->ssl, h->plain_buf, sizeof h->plain_buf);
    if (n > 0) {
      on_plain(c, h->plain_buf, (size_t)n);
      continue;
    }
    int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_WANT_READ) break;
    /* close_notify (the client is done: like EOF) or a broken record. */
    if (e != SSL_ERROR_ZERO_RETURN)
      log_event_at(LOG_WARN, "tls", "closing %s: %s", c->peer, tls_reason());
    ERR_clear_error();
    conn_close(c);
    return;
  }
  if (!c->closing && c->ssl != NULL) tls_flush(c, false);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  conn *c = stream->data;
  http_server *h = c->h;
  if (buf->base == h->read_buf) h->read_buf_busy = false;
  if (nread == 0 || c->closing) return;
  if (nread < 0) {
    /* EOF or an error: a call in flight is cancelled (the client left). */
    conn_close(c);
    return;
  }
  c->last_read_ns = now_ns();
  if (c->ssl == NULL) {
    on_plain(c, buf->base, (size_t)nread);
    return;
  }
  /* Records for OpenSSL (a memory BIO takes them all), then the plain
   * text they make; records waiting behind the pipelining cap stop the
   * reads like plain bytes do. */
  BIO *in = SSL_get_rbio(c->ssl);
  if (BIO_write(in, buf->base, (int)nread) != (int)nread) {
    conn_close(c);
    return;
  }
  tls_pump(c);
  if (!c->closing && c->ssl != NULL &&
      BIO_ctrl_pending(SSL_get_rbio(c->ssl)) >= PENDING_MAX)
    uv_read_stop(stream);
}

/* Idempotent: a stream already reading is left as it is. */
static void start_reading(conn *c) {
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void maybe_finish_stop(http_server *h);

static void on_closed(uv_handle_t *handle) {
  conn *c = handle->data;
  http_server *h = c->h;
  if (c->prev)
    c->prev->next = c->next;
  else
    h->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  h->nconns--;
  atomic_store(&h->open, h->nconns);
  reset_request(c);
  free(c->pending);
  free(c->out_head);
  free(c->out_body);
  SSL_free(c->ssl);
  free(c);
  maybe_finish_stop(h);
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  if (c->x != NULL) {
    /* The call goes on until its next check; its completion finds no
     * connection and is dropped. */
    atomic_store(&c->x->call.cancelled, 1);
    c->x->conn = NULL;
    c->x = NULL;
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* At the cap: the connection idle longest, or NULL. */
static conn *longest_idle(http_server *h) {
  conn *best = NULL;
  for (conn *c = h->conns; c; c = c->next)
    if (!c->closing && c->state == C_IDLE && c->pending_len == 0 &&
        (best == NULL || c->last_read_ns < best->last_read_ns))
      best = c;
  return best;
}

static void on_connection(uv_stream_t *server, int status) {
  http_server *h = server->data;
  if (status < 0 || h->stopping) return;
  conn *c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->h = h;
  uv_tcp_init(&h->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
    /* Nothing to keep: close the handle (it is not in the list yet). */
    c->closing = true;
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    uv_close((uv_handle_t *)&c->tcp, on_closed);
    return;
  }
  atomic_fetch_add(&h->accepted, 1);
  c->next = h->conns;
  if (h->conns) h->conns->prev = c;
  h->conns = c;
  h->nconns++;
  atomic_store(&h->open, h->nconns);
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage addr;
  int len = sizeof addr;
  char ip[64] = "?";
  int port = 0;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&addr, &len) == 0) {
    if (addr.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&addr, ip, sizeof ip);
      port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&addr, ip, sizeof ip);
      port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    }
  }
  snprintf(c->peer, sizeof c->peer, "%s:%.45s:%d", h->tls ? "https" : "http",
           ip, port);
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  c->state = C_IDLE;
  c->accept_ns = c->last_read_ns = now_ns();
  if (h->tls != NULL) {
    c->ssl = SSL_new(h->tls);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    if (c->ssl == NULL || in == NULL || out == NULL) {
      BIO_free(in);
      BIO_free(out);
      conn_close(c);
      return;
    }
    SSL_set_bio(c->ssl, in, out);
    SSL_set_accept_state(c->ssl);
  }
  if (h->nconns > h->cap) {
    conn *idle = longest_idle(h);
    if (idle != NULL && idle != c) {
      atomic_fetch_add(&h->shed, 1);
      conn_close(idle);
    } else {
      atomic_fetch_add(&h->refused, 1);
      c->state = C_WAITING;
      if (c->ssl != NULL) { /* no handshake yet: nothing can be said */
        conn_close(c);
        return;
      }
      send_error(c, 503, "UNAVAILABLE",
                 "too many HTTP connections (--http-max-connections)");
      return;
    }
  }
  start_reading(c);
}

/* ------------------------------------------------------- timers, wakeup */

static void on_sweep(uv_timer_t *t) {
  http_server *h = t->data;
  int64_t now = now_ns();
  int64_t read_ns = h->cfg->http_read_timeout_ms * 1000000;
  int64_t idle_ns = h->cfg->http_idle_timeout_ms * 1000000;
  bool draining = atomic_load(&h->d->draining);
  for (conn *c = h->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing) continue;
    switch (c->state) {
      case C_IDLE:
        if (c->ssl != NULL && !c->handshake_done &&
            now - c->accept_ns > read_ns) {
          /* A handshake gets the time a request line gets. */
          atomic_fetch_add(&h->timeouts, 1);
          conn_close(c);
        } else if (draining || now - c->last_read_ns > idle_ns) {
          conn_close(c);
        }
        break;
      case C_READING:
        if ((!c->headers_done && now - c->request_start_ns > read_ns) ||
            (c->headers_done && now - c->last_read_ns > read_ns)) {
          atomic_fetch_add(&h->timeouts, 1);
          uv_read_stop((uv_stream_t *)&c->tcp);
          c->state = C_WAITING;
          char text[160];
          snprintf(text, sizeof text,
                   "the request did not arrive within %lld ms "
                   "(--http-read-timeout-ms)",
                   (long long)h->cfg->http_read_timeout_ms);
          send_error(c, 408, "DEADLINE_EXCEEDED", text);
        }
        break;
      case C_WRITING:
        if (now - c->write_start_ns > idle_ns) {
          atomic_fetch_add(&h->timeouts, 1);
          conn_close(c);
        }
        break;
      case C_WAITING:
        break;
    }
  }
}

static void close_if_open(uv_handle_t *handle) {
  if (!uv_is_closing(handle)) uv_close(handle, NULL);
}

static void maybe_finish_stop(http_server *h) {
  if (!h->stopping || h->nconns > 0) return;
  close_if_open((uv_handle_t *)&h->stop_timer);
  close_if_open((uv_handle_t *)&h->wake);
}

static void on_stop_timer(uv_timer_t *t) {
  http_server *h = t->data;
  for (conn *c = h->conns, *next; c; c = next) {
    next = c->next;
    conn_close(c);
  }
  maybe_finish_stop(h);
}

static void on_wake(uv_async_t *a) {
  http_server *h = a->data;
  run_done(h);
  if (atomic_load(&h->stop_requested) && !h->stopping) {
    h->stopping = true;
    close_if_open((uv_handle_t *)&h->server);
    close_if_open((uv_handle_t *)&h->sweep);
    for (conn *c = h->conns, *next; c; c = next) {
      next = c->next;
      if (c->state == C_WRITING)
        c->close_after = true;
      else
        conn_close(c);
    }
    uv_timer_init(&h->loop, &h->stop_timer);
    h->stop_timer.data = h;
    uv_timer_start(&h->stop_timer, on_stop_timer, STOP_FLUSH_MS, 0);
    maybe_finish_stop(h);
  }
}

static void *loop_main(void *arg) {
  http_server *h = arg;
  uv_run(&h->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* ------------------------------------------------------------ lifecycle */

/* The gateway's TLS context, from the files main.c checked at start
 * (listener_tls_load: readable, PEM, key matching, not expired): TLS 1.2
 * or 1.3 with OpenSSL's default ciphers, the certificate chain of
 * --tls-cert, and with --tls-client-ca a client certificate required. */
static SSL_CTX *tls_context(const toposd_config *cfg, char *msg,
                            size_t msglen) {
  ERR_clear_error();
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  const char *what = "cannot make a TLS context";
  if (ctx == NULL) goto fail;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* Resumption across connections is not worth a cache here; tickets
   * stay on (stateless), under the context's id. */
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  static const unsigned char sid[] = "toposd-http";
  SSL_CTX_set_session_id_context(ctx, sid, sizeof sid - 1);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  what = "tls-cert";
  if (SSL_CTX_use_certificate_chain_file(ctx, cfg->tls_cert) != 1) goto fail;
  what = "tls-key";
  if (SSL_CTX_use_PrivateKey_file(ctx, cfg->tls_key, SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1)
    goto fail;
  if (cfg->tls_client_ca[0] != '\0') {
    what = "tls-client-ca";
    if (SSL_CTX_load_verify_locations(ctx, cfg->tls_client_ca, NULL) != 1)
      goto fail;
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(cfg->tls_client_ca);
    if (names == NULL) goto fail;
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       NULL);
  }
  ERR_clear_error();
  return ctx;
fail:
  snprintf(msg, msglen, "http: %s: %s", what, tls_reason());
  ERR_clear_error();
  SSL_CTX_free(ctx);
  return NULL;
}

http_server *http_server_start(daemon_state *d, rpc_server *rpc, char *bound,
                               size_t boundlen, char *msg, size_t msglen) {
  const toposd_config *cfg = d->cfg;
  char host[256];
  int port = 0;
  if (config_split_listen(cfg->http, host, sizeof host, &port, msg, msglen) !=
      0)
    return NULL;
  settings = (http_parser_settings){
      .on_message_begin = on_message_begin,
      .on_url = on_url,
      .on_header_field = on_header_field,
      .on_header_value = on_header_value,
      .on_headers_complete = on_headers_complete,
      .on_body = on_body,
      .on_message_complete = on_message_complete,
  };
  http_server *h = calloc(1, sizeof *h);
  if (h == NULL) {
    snprintf(msg, msglen, "out of memory");
    return NULL;
  }
  h->d = d;
  h->cfg = cfg;
  /* The cap, clamped below the descriptor limit with room for the store,
   * gRPC and its connections (listener.c keeps its own share). */
  h->cap = cfg->http_max_connections;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      (int64_t)rl.rlim_cur - FD_HEADROOM < h->cap)
    h->cap = rl.rlim_cur > 2 * FD_HEADROOM ? (int)rl.rlim_cur - FD_HEADROOM
                                           : (int)rl.rlim_cur / 2;
  h->gw = (gateway){.d = d, .rpc = rpc, .http = h};
  if (cfg->tls_cert[0] != '\0') {
    h->tls = tls_context(cfg, msg, msglen);
    if (h->tls == NULL) {
      free(h);
      return NULL;
    }
  }
  pthread_mutex_init(&h->done_lock, NULL);
  uv_loop_init(&h->loop);
  uv_tcp_init(&h->loop, &h->server);
  h->server.data = h;
  /* A host name is resolved once, here (the loop is not running yet). */
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE};
  struct addrinfo *ai = NULL;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int rc = getaddrinfo(host, portstr, &hints, &ai);
  if (rc != 0 || ai == NULL) {
    snprintf(msg, msglen, "http: cannot resolve %s: %s", host,
             gai_strerror(rc));
    goto fail;
  }
  rc = uv_tcp_bind(&h->server, ai->ai_addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&h->server, 1024, on_connection);
  freeaddrinfo(ai);
  if (rc != 0) {
    snprintf(msg, msglen, "http: cannot serve %s: %s", cfg->http,
             uv_strerror(rc));
    goto fail;
  }
  struct sockaddr_storage addr;
  int len = sizeof addr;
  uv_tcp_getsockname(&h->server, (struct sockaddr *)&addr, &len);
  char ip[64] = "?";
  int bound_port = 0;
  if (addr.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *)&addr, ip, sizeof ip);
    bound_port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    snprintf(bound, boundlen, "[%s]:%d", ip, bound_port);
  } else {
    uv_ip4_name((struct sockaddr_in *)&addr, ip, sizeof ip);
    bound_port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    snprintf(bound, boundlen, "%s:%d", ip, bound_port);
  }
  uv_timer_init(&h->loop, &h->sweep);
  h->sweep.data = h;
  uv_timer_start(&h->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
  uv_async_init(&h->loop, &h->wake, on_wake);
  h->wake.data = h;
  if (pthread_create(&h->thread, NULL, loop_main, h) != 0) {
    snprintf(msg, msglen, "http: cannot start its thread");
    uv_close((uv_handle_t *)&h->sweep, NULL);
    uv_close((uv_handle_t *)&h->wake, NULL);
    goto fail;
  }
  h->thread_started = true;
  return h;
fail:
  uv_close((uv_handle_t *)&h->server, NULL);
  uv_run(&h->loop, UV_RUN_DEFAULT);
  uv_loop_close(&h->loop);
  pthread_mutex_destroy(&h->done_lock);
  SSL_CTX_free(h->tls);
  free(h);
  return NULL;
}

void http_server_stop(http_server *h) {
  if (h == NULL) return;
  atomic_store(&h->stop_requested, 1);
  uv_async_send(&h->wake);
  if (h->thread_started) pthread_join(h->thread, NULL);
  /* Exchanges finished after the loop ended (none once the workers are
   * joined, but a stop without that leaves nothing behind either). */
  http_exchange *x = take_done(h);
  while (x) {
    http_exchange *next = x->next;
    exchange_free(x);
    x = next;
  }
  uv_loop_close(&h->loop);
  pthread_mutex_destroy(&h->done_lock);
  SSL_CTX_free(h->tls);
  free(h);
}

void http_server_counts(http_server *h, http_counts *out) {
  memset(out, 0, sizeof *out);
  if (h == NULL) return;
  out->open = atomic_load(&h->open);
  out->accepted = atomic_load(&h->accepted);
  out->shed = atomic_load(&h->shed);
  out->refused = atomic_load(&h->refused);
  out->timeouts = atomic_load(&h->timeouts);
  out->bad_requests = atomic_load(&h->bad_requests);
  out->tls_failures = atomic_load(&h->tls_failures);
  out->tls = h->tls != NULL;
  out->cap = h->cap;
}
