/*
 * http_client.h - a raw HTTP/1.1 client for the gateway's tests: plain
 * sockets, so a test controls every byte (malformed lines, slow senders,
 * pipelining) and sees every byte that comes back; or the same over TLS
 * (https_open: OpenSSL on a blocking socket) for a gateway with a
 * certificate.  Static functions, for suites that include harness.h
 * first.
 */
#ifndef TOPOS_TESTS_DAEMON_HTTP_CLIENT_H
#define TOPOS_TESTS_DAEMON_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>

#include <cJSON.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "harness.h"

/* A connected socket to 127.0.0.1:port (blocking), or -1. */
static int http_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void http_send_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0) return; /* the server may close first: the reply says */
    p += n;
    len -= (size_t)n;
  }
}

typedef struct http_reply {
  int status; /* 0: no response (closed, or timed out) */
  char headers[4096];
  char *body; /* NUL-terminated */
  size_t body_len;
  bool closed; /* the server closed after this response */
} http_reply;

static void http_reply_clear(http_reply *r) {
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* A header's value ("" when absent) into out. */
static const char *http_header(const http_reply *r, const char *name, char *out,
                               size_t outlen) {
  out[0] = '\0';
  size_t n = strlen(name);
  for (const char *p = r->headers; (p = strchr(p, '\n')) != NULL;) {
    p++;
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      const char *v = p + n + 1;
      while (*v == ' ') v++;
      size_t len = strcspn(v, "\r\n");
      if (len >= outlen) len = outlen - 1;
      memcpy(out, v, len);
      out[len] = '\0';
      break;
    }
  }
  return out;
}

/* Buffered reads on one connection, so pipelined responses split right. */
typedef struct http_conn {
  int fd;
  char buf[1 << 16];
  size_t len;
  SSL *ssl; /* NULL: plain text */
  SSL_CTX *ctx;
} http_conn;

/* Up to len bytes before `until`: > 0 bytes, 0 closed (or a TLS error),
 * -1 timed out. */
static ssize_t http_conn_recv(http_conn *c, void *buf, size_t len,
                              double until) {
  for (;;) {
    if (c->ssl == NULL || SSL_pending(c->ssl) == 0) {
      struct pollfd p = {c->fd, POLLIN, 0};
      double left = until - now_s();
      if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) return -1;
    }
    if (c->ssl == NULL) {
      ssize_t n = recv(c->fd, buf, len, 0);
      return n < 0 ? 0 : n;
    }
    int n = SSL_read(c->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
    if (n > 0) return n;
    /* A record split across reads is not an answer yet. */
    if (SSL_get_error(c->ssl, n) != SSL_ERROR_WANT_READ) return 0;
  }
}

static void http_conn_send(http_conn *c, const void *data, size_t len) {
  if (c->ssl == NULL) {
    http_send_all(c->fd, data, len);
    return;
  }
  const char *p = data;
  while (len > 0) {
    int n = SSL_write(c->ssl, p, len > (1u << 20) ? 1 << 20 : (int)len);
    if (n <= 0) return; /* the server may close first: the reply says */
    p += n;
    len -= (size_t)n;
  }
}

/* A TLS connection to 127.0.0.1:port that verifies the daemon's
 * certificate against the CAs in ca for the name `host` (an IP address or
 * a DNS name), presenting cert and key when given.  NULL with OpenSSL's
 * reason in err when the handshake fails.  (With TLS 1.3 a missing client
 * certificate is only seen at the first read: the server's alert.) */
static http_conn *https_open(int port, const char *ca, const char *host,
                             const char *cert, const char *key, char *err,
                             size_t errlen) {
  http_conn *c = calloc(1, sizeof *c);
  ck_assert_ptr_nonnull(c);
  c->fd = http_connect(port);
  ck_assert_int_ge(c->fd, 0);
  c->ctx = SSL_CTX_new(TLS_client_method());
  ck_assert_ptr_nonnull(c->ctx);
  ck_assert_int_eq(SSL_CTX_load_verify_locations(c->ctx, ca, NULL), 1);
  SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
  if (cert != NULL) {
    ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(c->ctx, cert), 1);
    ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(c->ctx, key, SSL_FILETYPE_PEM),
                     1);
  }
  c->ssl = SSL_new(c->ctx);
  ck_assert_ptr_nonnull(c->ssl);
  X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);
  if (X509_VERIFY_PARAM_set1_ip_asc(param, host) != 1) {
    ck_assert_int_eq(SSL_set1_host(c->ssl, host), 1);
    SSL_set_tlsext_host_name(c->ssl, host);
  }
  SSL_set_fd(c->ssl, c->fd);
  ERR_clear_error();
  if (SSL_connect(c->ssl) != 1) {
    unsigned long e = ERR_peek_last_error();
    snprintf(err, errlen, "%s",
             e ? ERR_reason_error_string(e) : "the connection closed");
    SSL_free(c->ssl);
    SSL_CTX_free(c->ctx);
    close(c->fd);
    free(c);
    return NULL;
  }
  return c;
}

static void http_conn_close(http_conn *c) {
  if (c == NULL) return;
  SSL_free(c->ssl);
  SSL_CTX_free(c->ctx);
  close(c->fd);
  free(c);
}

/* Reads one response within timeout_s. */
static void http_read(http_conn *c, double timeout_s, http_reply *r) {
  memset(r, 0, sizeof *r);
  double until = now_s() + timeout_s;
  size_t head_end = 0;
  for (;;) {
    char *end = c->len ? memmem(c->buf, c->len, "\r\n\r\n", 4) : NULL;
    if (end) {
      head_end = (size_t)(end - c->buf) + 4;
      break;
    }
    ssize_t n =
        http_conn_recv(c, c->buf + c->len, sizeof c->buf - c->len, until);
    if (n < 0) return;
    if (n == 0) {
      r->closed = true;
      return;
    }
    c->len += (size_t)n;
  }
  size_t hl = head_end < sizeof r->headers ? head_end : sizeof r->headers - 1;
  memcpy(r->headers, c->buf, hl);
  r->headers[hl] = '\0';
  sscanf(r->headers, "HTTP/1.1 %d", &r->status);
  char v[64];
  size_t want =
      (size_t)strtoull(http_header(r, "Content-Length", v, sizeof v), NULL, 10);
  r->closed =
      strcasecmp(http_header(r, "Connection", v, sizeof v), "close") == 0;
  r->body = malloc(want + 1);
  size_t have = c->len - head_end;
  size_t take = have < want ? have : want;
  memcpy(r->body, c->buf + head_end, take);
  memmove(c->buf, c->buf + head_end + take, c->len - head_end - take);
  c->len -= head_end + take;
  while (take < want) {
    ssize_t n = http_conn_recv(c, r->body + take, want - take, until);
    if (n <= 0) break;
    take += (size_t)n;
  }
  r->body[take] = '\0';
  r->body_len = take;
  if (take < want) r->status = 0; /* cut short */
}

/* True when the server closes the connection within timeout_s (reads and
 * drops anything else it sends). */
static bool http_closed(int fd, double timeout_s) {
  double until = now_s() + timeout_s;
  char buf[4096];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    double left = until - now_s();
    if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

/* One request on a fresh connection: method, path, a body (NULL: none)
 * of a content type. */
static void http_do(int port, const char *method, const char *path,
                    const char *content_type, const void *body, size_t len,
                    http_reply *r) {
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(port);
  ck_assert_int_ge(c->fd, 0);
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s"
                   "Content-Length: %zu\r\n\r\n",
                   method, path, content_type ? "Content-Type: " : "",
                   content_type ? content_type : "", content_type ? "\r\n" : "",
                   body ? len : 0);
  http_send_all(c->fd, head, (size_t)n);
  if (body && len) http_send_all(c->fd, body, len);
  http_read(c, 60, r);
  close(c->fd);
  free(c);
}

static void http_get(int port, const char *path, http_reply *r) {
  http_do(port, "GET", path, NULL, NULL, 0, r);
}

/* The error code of a JSON error body ("" when it is not one). */
static void http_error_code(const http_reply *r, char *out, size_t outlen) {
  out[0] = '\0';
  cJSON *doc = cJSON_Parse(r->body ? r->body : "");
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(doc, "error");
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
  if (cJSON_IsString(code) && cJSON_IsString(msg))
    snprintf(out, outlen, "%s", code->valuestring);
  cJSON_Delete(doc);
}

#define HTTP_ASSERT_ERROR(r, want_status, want_code)                       \
  do {                                                                     \
    char code_[64];                                                        \
    http_error_code((r), code_, sizeof code_);                             \
    ck_assert_msg(                                                         \
        (r)->status == (want_status) && strcmp(code_, (want_code)) == 0,   \
        "want %d %s, got %d: %s", (want_status), (want_code), (r)->status, \
        (r)->body ? (r)->body : "(no body)");                              \
  } while (0)

#endif /* TOPOS_TESTS_DAEMON_HTTP_CLIENT_H */
