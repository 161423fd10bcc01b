/*
 * http.h - toposd's HTTP/1.1 listener (http.c) and the gateway that
 * routes its requests (gateway.c).
 *
 * http.c is the transport: a libuv loop on a thread of its own accepts
 * connections, parses requests with http-parser, enforces the limits
 * (header and body bytes, read deadline, idle keep-alive, a connection
 * cap), keeps connections alive and answers pipelined requests in order,
 * one at a time.  Each complete request becomes an exchange handed to the
 * gateway, which answers it at once (probes, metrics, errors) or starts a
 * service call on the daemon's workers (rpc.h, rpc_submit) and answers
 * when it comes back, on the loop's thread.
 */
#ifndef TOPOSD_HTTP_H
#define TOPOSD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "metrics.h"
#include "rpc.h"

typedef struct http_server http_server;
typedef struct http_exchange http_exchange;

/* A complete request, as the parser delivered it. */
typedef struct http_request {
  unsigned method;        /* http-parser's enum http_method */
  char *target;           /* the request target, NUL-terminated */
  char content_type[128]; /* "" when absent; cut at 127 bytes */
  uint8_t *body;          /* NUL-terminated (not counted); NULL when empty */
  size_t body_len;
  const char *peer; /* "http:127.0.0.1:5555" */
  int64_t arrival_ns;
  /* The Authorization header: its first sizeof bytes, and its whole
   * length (which may be more). */
  bool has_authorization;
  char authorization[300];
  size_t authorization_len;
} http_request;

/* What goes back.  The gateway fills it; the transport adds the status
 * line, Content-Length, Connection and Date. */
typedef struct http_response {
  int status;
  const char *content_type; /* static text */
  char *body;               /* malloc'd (the transport frees it) */
  size_t body_len;
  char headers[256]; /* extra header lines, each ending "\r\n" */
} http_response;

struct http_exchange {
  http_request req;
  http_response resp;
  /* A service call the gateway started (rpc_submit): its request bytes,
   * and the gateway's continuation that turns the reply into resp, run on
   * the loop's thread. */
  service_call call;
  uint8_t *packed;
  /* True when resp is filled; false when it started another call. */
  bool (*finish)(http_exchange *x);
  int stage;      /* which call of a chain came back */
  char *saved[3]; /* what earlier calls of a chain answered (malloc'd) */
  struct gateway *gw;
  int arg;       /* the route's own value (a format, a form) */
  char name[80]; /* the route's own text */
  /* The transport's. */
  void *conn; /* NULL once the client went away */
  http_server *server;
  http_exchange *next;
};

/* Counters for /metrics. */
typedef struct http_counts {
  int64_t open, accepted, shed, refused, timeouts, bad_requests;
  int64_t tls_failures; /* handshakes refused (TLS only) */
  int cap;
  bool tls; /* the gateway serves HTTPS */
} http_counts;

/* Starts the listener on cfg->http and its loop thread; writes the bound
 * address (the actual port).  NULL with a message on failure. */
http_server *http_server_start(daemon_state *d, rpc_server *rpc, char *bound,
                               size_t boundlen, char *msg, size_t msglen);
/* Answers what the workers finished, closes every connection (waiting up
 * to a second for replies being written) and joins the loop thread.
 * Called once the gRPC side has drained and the workers are joined. */
void http_server_stop(http_server *h);
void http_server_counts(http_server *h, http_counts *out);

/* ---------------------------------------------------------- gateway.c */

typedef struct gateway {
  daemon_state *d;
  rpc_server *rpc;
  http_server *http;
} gateway;

/* Routes a request.  True when x->resp is filled now; false when a service
 * call was queued: the transport then waits for x->call.done and calls
 * x->finish on its thread before sending x->resp. */
bool gateway_route(gateway *g, http_exchange *x);

/* An error response: {"error": {"code": NAME, "message": TEXT}} with the
 * HTTP status of a gRPC status (gateway_http_status). */
void gateway_error(http_response *r, int grpc_status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with an explicit HTTP status (and a code name for it). */
void gateway_http_error(http_response *r, int http_status, const char *code,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int gateway_http_status(int grpc_status);

#endif /* TOPOSD_HTTP_H */
