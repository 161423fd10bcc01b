/*
 * listener.c - the accept thread, the connection table and shedding.
 *
 * The table is indexed by descriptor number.  A connection handed to gRPC
 * is gRPC's to close, and the number may then be reused by anything
 * (another connection, a store file), so each entry remembers the
 * socket's inode: an entry whose descriptor no longer names that inode is
 * gone.  The sweep (every second, and before any shedding) drops such
 * entries; a connection is shed with shutdown(2) on a descriptor whose
 * inode still matches, after which gRPC reads EOF and closes it.
 *
 * Calls pin their connection: rpc.c tells us when a call starts and ends
 * (gRPC names a channel made from a descriptor "fd:N"), and a connection
 * with a call in flight is never shed, whatever its silence.
 */
#include "listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"

/* Descriptors kept free for everything but connections (the store and
 * its WAL, the blob writer, gRPC's own, logs): the cap is clamped to the
 * descriptor limit minus this much. */
#define FD_HEADROOM_MIN 32
#define FD_HEADROOM_MAX 256
/* How often the table is swept for closed and idle connections. */
#define SWEEP_MS 1000
/* After running out of descriptors, accepting pauses this long so gRPC
 * can close what was shed (the backlog keeps the waiting clients). */
#define PAUSE_MS 50
/* Handles pack the descriptor in the low bits and the connection's
 * serial number above them. */
#define HANDLE_FD_BITS 24

typedef struct conn {
  bool used;
  bool shed; /* shutdown sent; gRPC has yet to close it */
  int calls; /* calls in flight */
  ino_t ino;
  dev_t dev;
  uint64_t serial;
  int64_t accepted_ns;
  char addr[64]; /* "ipv4:127.0.0.1:40000" */
} conn;

struct listener {
  grpc_server *server;
  grpc_server_credentials *creds;
  bool tls;    /* gRPC listens itself (listener.h): no socket, no thread */
  int fd;      /* the listening socket */
  int reserve; /* /dev/null, spent when descriptors run out */
  int wake[2]; /* listener_stop writes here */
  pthread_t thread;
  bool started;
  int64_t idle_ns;
  int cap;

  pthread_mutex_t lock; /* the table and the counts */
  conn *conns;          /* indexed by descriptor */
  int nconns;           /* entries allocated */
  uint64_t next_serial;
  int64_t open, accepted, shed, refused;
};

static int64_t now_ns(void) {
  return daemon_now_ns();
}

/* ------------------------------------------------------------ addresses */

static void format_addr(const struct sockaddr *sa, char *out, size_t outlen) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    snprintf(out, outlen, "ipv4:%s:%d", host, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    snprintf(out, outlen, "ipv6:[%s]:%d", host, port);
  } else {
    snprintf(out, outlen, "unknown");
  }
}

/* Binds and listens on host:port; the first resolved address that binds
 * wins (IPv4 first, as "localhost" means 127.0.0.1 to most clients). */
/* The local port a bound socket has. */
static int socket_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
  return ss.ss_family == AF_INET
             ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
             : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static int bind_listen(const char *host, int port, int *bound_port, char *msg,
                       size_t msglen) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo *res = NULL;
  int g = getaddrinfo(host[0] ? host : NULL, service, &hints, &res);
  if (g != 0) {
    snprintf(msg, msglen, "cannot resolve '%s': %s", host, gai_strerror(g));
    return -1;
  }
  int fd = -1, last_errno = 0;
  for (int pass = 0; pass < 2 && fd < 0; pass++) {
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
      if ((pass == 0) != (ai->ai_family == AF_INET)) continue;
      int s =
          socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (s < 0) {
        last_errno = errno;
        continue;
      }
      int one = 1, zero = 0;
      setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (ai->ai_family == AF_INET6)
        setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      if (bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s, 1024) != 0) {
        last_errno = errno;
        close(s);
        continue;
      }
      fd = s;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    snprintf(msg, msglen, "cannot listen on %s:%d: %s", host, port,
             strerror(last_errno));
    return -1;
  }
  *bound_port = socket_port(fd);
  return fd;
}

int listener_bind(const toposd_config *cfg, char *msg, size_t msglen) {
  char host[256];
  int port = 0, bound = 0;
  if (config_split_listen(cfg->listen, host, sizeof host, &port, msg, msglen) !=
      0)
    return -1;
  return bind_listen(host, port, &bound, msg, msglen);
}

int listener_probe(const char *address, char *msg, size_t msglen) {
  char host[256];
  int port = 0, bound = 0;
  if (config_split_listen(address, host, sizeof host, &port, msg, msglen) != 0)
    return -1;
  if (port == 0) return 0;
  int fd = bind_listen(host, port, &bound, msg, msglen);
  if (fd < 0) return -1;
  close(fd); /* never accepted on: no TIME_WAIT is left behind */
  return 0;
}

/* ---------------------------------------------------------------- table */

static bool conn_alive(const conn *c, int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_ino == c->ino && st.st_dev == c->dev;
}

/* Milliseconds since the connection last carried data either way. */
static int64_t silence_ms(int fd, const conn *c) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
    return (now_ns() - c->accepted_ns) / 1000000;
  uint32_t quiet = ti.tcpi_last_data_recv < ti.tcpi_last_data_sent
                       ? ti.tcpi_last_data_recv
                       : ti.tcpi_last_data_sent;
  return quiet;
}

static void conn_shed(listener *l, int fd, const char *why) {
  conn *c = &l->conns[fd];
  shutdown(fd, SHUT_RDWR);
  c->shed = true;
  l->shed++;
  log_event_at(LOG_WARN, "shed", "connection %s: %s", c->addr, why);
}

/* Drops entries gRPC has closed; sheds connections silent past the idle
 * timeout.  Caller holds the lock. */
static void sweep(listener *l) {
  for (int fd = 0; fd < l->nconns; fd++) {
    conn *c = &l->conns[fd];
    if (!c->used) continue;
    if (!conn_alive(c, fd)) {
      c->used = false;
      l->open--;
      continue;
    }
    if (!c->shed && c->calls == 0 && silence_ms(fd, c) * 1000000 >= l->idle_ns)
      conn_shed(l, fd, "idle past the timeout");
  }
}

/* Connections counted against the cap: open and not being shed. */
static int64_t live(listener *l) {
  int64_t n = 0;
  for (int fd = 0; fd < l->nconns; fd++)
    if (l->conns[fd].used && !l->conns[fd].shed) n++;
  return n;
}

typedef struct candidate {
  int fd;
  int64_t silence_ms;
} candidate;

static int by_silence_desc(const void *a, const void *b) {
  int64_t x = ((const candidate *)a)->silence_ms;
  int64_t y = ((const candidate *)b)->silence_ms;
  return (x < y) - (x > y);
}

/* Sheds up to `want` of the longest-silent connections without a call in
 * flight (one TCP_INFO read each); returns how many.  Caller holds the
 * lock. */
static int shed_silent(listener *l, int want, const char *why) {
  candidate *cand = malloc((size_t)(l->nconns ? l->nconns : 1) * sizeof *cand);
  if (cand == NULL) return 0;
  int n = 0;
  for (int fd = 0; fd < l->nconns; fd++) {
    conn *c = &l->conns[fd];
    if (!c->used || c->shed || c->calls > 0) continue;
    cand[n++] = (candidate){fd, silence_ms(fd, c)};
  }
  qsort(cand, (size_t)n, sizeof *cand, by_silence_desc);
  int done = n < want ? n : want;
  for (int i = 0; i < done; i++) conn_shed(l, cand[i].fd, why);
  free(cand);
  return done;
}

static bool table_fit(listener *l, int fd) {
  if (fd < l->nconns) return true;
  if (fd >= (1 << HANDLE_FD_BITS)) return false;
  int n = l->nconns ? l->nconns : 256;
  while (n <= fd) n *= 2;
  conn *grown = realloc(l->conns, (size_t)n * sizeof *grown);
  if (grown == NULL) return false;
  memset(grown + l->nconns, 0, (size_t)(n - l->nconns) * sizeof *grown);
  l->conns = grown;
  l->nconns = n;
  return true;
}

/* ---------------------------------------------------------------- accept */

static void refuse(listener *l, int fd, const char *why) {
  close(fd);
  pthread_mutex_lock(&l->lock);
  l->refused++;
  pthread_mutex_unlock(&l->lock);
  log_event_at(LOG_WARN, "shed", "connection refused: %s", why);
}

/* Takes a freshly accepted connection: into the table, then to gRPC. */
static void admit(listener *l, int fd, const struct sockaddr *peer) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    refuse(l, fd, "fstat failed");
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pthread_mutex_lock(&l->lock);
  if (live(l) >= l->cap) {
    sweep(l);
    if (live(l) >= l->cap) shed_silent(l, 1 + l->cap / 32, "connection cap");
  }
  bool room = live(l) < l->cap && table_fit(l, fd);
  if (room) {
    conn *c = &l->conns[fd];
    if (c->used) l->open--; /* the number was reused: the old one closed */
    memset(c, 0, sizeof *c);
    c->used = true;
    c->ino = st.st_ino;
    c->dev = st.st_dev;
    c->serial = ++l->next_serial;
    c->accepted_ns = now_ns();
    format_addr(peer, c->addr, sizeof c->addr);
    l->open++;
    l->accepted++;
  }
  pthread_mutex_unlock(&l->lock);
  if (!room) {
    refuse(l, fd, "connection cap reached with every connection busy");
    return;
  }
  grpc_server_add_channel_from_fd(l->server, fd, l->creds);
}

/* Out of descriptors: shed, and spend the reserve to take the waiting
 * connection off the backlog (closing it at once) so the clients behind
 * it are not stuck; the reserve is reopened once a descriptor is free. */
static void out_of_descriptors(listener *l) {
  pthread_mutex_lock(&l->lock);
  sweep(l);
  int n = shed_silent(l, 1 + l->cap / 32, "out of descriptors");
  pthread_mutex_unlock(&l->lock);
  if (n > 0) return; /* gRPC closes them; the client is taken next round */
  if (l->reserve >= 0) {
    close(l->reserve);
    l->reserve = -1;
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) refuse(l, fd, "out of descriptors, every connection busy");
  }
}

static void *accept_main(void *arg) {
  listener *l = arg;
  int64_t next_sweep = now_ns() + (int64_t)SWEEP_MS * 1000000;
  int64_t paused_until = 0;
  for (;;) {
    if (l->reserve < 0) l->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int64_t now = now_ns();
    bool paused = now < paused_until;
    struct pollfd p[2] = {{l->wake[0], POLLIN, 0}, {l->fd, POLLIN, 0}};
    int wait_ms = paused ? PAUSE_MS : SWEEP_MS;
    if (poll(p, paused ? 1 : 2, wait_ms) < 0 && errno != EINTR) break;
    if (p[0].revents) break;
    now = now_ns();
    if (now >= next_sweep) {
      pthread_mutex_lock(&l->lock);
      sweep(l);
      pthread_mutex_unlock(&l->lock);
      next_sweep = now + (int64_t)SWEEP_MS * 1000000;
    }
    if (paused || !(p[1].revents & POLLIN)) continue;
    for (int i = 0; i < 64; i++) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      int fd = accept4(l->fd, (struct sockaddr *)&ss, &sl,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(l, fd, (struct sockaddr *)&ss);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        log_event_at(LOG_WARN, "shed", "accept: %s", strerror(errno));
        out_of_descriptors(l);
        paused_until = now_ns() + (int64_t)PAUSE_MS * 1000000;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        log_event_at(LOG_ERROR, "error", "accept: %s", strerror(errno));
        paused_until = now_ns() + (int64_t)PAUSE_MS * 1000000;
      }
      break;
    }
  }
  return NULL;
}

/* ------------------------------------------------------------ lifecycle */

/* The cap: the configured one, clamped below the descriptor limit. */
static int connection_cap(int configured) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return configured;
  int64_t limit = (int64_t)rl.rlim_cur;
  int64_t headroom = limit / 8;
  if (headroom < FD_HEADROOM_MIN) headroom = FD_HEADROOM_MIN;
  if (headroom > FD_HEADROOM_MAX) headroom = FD_HEADROOM_MAX;
  int64_t room = limit - headroom;
  if (room < 1) room = 1;
  return room < configured ? (int)room : configured;
}

/* ------------------------------------------------------------------ TLS */

/* Largest PEM file read: a chain or a CA bundle is a few KiB; the system's
 * whole bundle is about 200 KiB. */
#define TLS_FILE_MAX ((size_t)4 << 20)

/* The whole file as a NUL-terminated string, or NULL with msg. */
static char *read_tls_file(const char *what, const char *path, char *msg,
                           size_t msglen) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(msg, msglen, "%s %s: cannot read it: %s", what, path,
             strerror(errno));
    return NULL;
  }
  char *text = malloc(TLS_FILE_MAX + 1);
  size_t n = text ? fread(text, 1, TLS_FILE_MAX + 1, f) : 0;
  bool failed = text == NULL || ferror(f);
  fclose(f);
  if (failed || n > TLS_FILE_MAX) {
    snprintf(msg, msglen, "%s %s: %s", what, path,
             text == NULL ? "out of memory"
             : failed     ? "read error"
                          : "larger than 4 MiB, not a PEM file");
    free(text);
    return NULL;
  }
  text[n] = '\0';
  return text;
}

/* OpenSSL's reason for the last error, for a message. */
static const char *ssl_reason(void) {
  unsigned long e = ERR_peek_last_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;
  return r ? r : "no PEM data";
}

/* The certificates of a PEM text: how many (0 with msg when none or one
 * is damaged); *first gets the first one when asked (X509_free it). */
static int parse_certs(const char *what, const char *path, const char *pem,
                       X509 **first, char *msg, size_t msglen) {
  ERR_clear_error();
  BIO *bio = BIO_new_mem_buf(pem, -1);
  if (bio == NULL) {
    snprintf(msg, msglen, "%s %s: out of memory", what, path);
    return 0;
  }
  int n = 0;
  for (X509 *x; (x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL;) {
    if (n == 0 && first != NULL)
      *first = x;
    else
      X509_free(x);
    n++;
  }
  /* The loop ends on "no start line" after the last certificate; any
   * other error means a damaged block. */
  unsigned long e = ERR_peek_last_error();
  bool clean =
      ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
  if (n == 0 || !clean) {
    snprintf(msg, msglen,
             "%s %s: %s (%s); expected PEM ('-----BEGIN CERTIFICATE-----')",
             what, path,
             n == 0 ? "no certificate in it" : "a damaged certificate in it",
             ssl_reason());
    if (n > 0 && first != NULL) {
      X509_free(*first);
      *first = NULL;
    }
    n = 0;
  }
  BIO_free(bio);
  ERR_clear_error();
  return n;
}

/* OpenSSL asks for a passphrase for an encrypted key: there is none. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
  (void)buf;
  (void)size;
  (void)rwflag;
  (void)u;
  return -1;
}

/* When the certificate is not valid now, a message saying so. */
static bool cert_time_ok(X509 *cert, const char *path, char *msg,
                         size_t msglen) {
  const ASN1_TIME *before = X509_get0_notBefore(cert);
  const ASN1_TIME *after = X509_get0_notAfter(cert);
  bool early = X509_cmp_current_time(before) > 0;
  bool late = X509_cmp_current_time(after) < 0;
  if (!early && !late) return true;
  char when[64] = "?";
  BIO *b = BIO_new(BIO_s_mem());
  if (b != NULL) {
    ASN1_TIME_print(b, early ? before : after);
    int n = BIO_read(b, when, (int)sizeof when - 1);
    when[n > 0 ? n : 0] = '\0';
    BIO_free(b);
  }
  snprintf(msg, msglen,
           "tls-cert %s: the certificate %s %s; every handshake would fail",
           path, early ? "is not valid before" : "expired on", when);
  return false;
}

void listener_tls_free(listener_tls *tls) {
  if (tls == NULL) return;
  /* The key is a secret: wipe it before it goes back to the heap. */
  if (tls->key != NULL) OPENSSL_cleanse(tls->key, strlen(tls->key));
  free(tls->cert_chain);
  free(tls->key);
  free(tls->client_ca);
  memset(tls, 0, sizeof *tls);
}

int listener_tls_load(const toposd_config *cfg, listener_tls *out, char *msg,
                      size_t msglen) {
  memset(out, 0, sizeof *out);
  if (cfg->tls_cert[0] == '\0') return 0;
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  int rc = -1;
  out->cert_chain = read_tls_file("tls-cert", cfg->tls_cert, msg, msglen);
  if (out->cert_chain == NULL) goto done;
  if (parse_certs("tls-cert", cfg->tls_cert, out->cert_chain, &cert, msg,
                  msglen) == 0)
    goto done;
  if (!cert_time_ok(cert, cfg->tls_cert, msg, msglen)) goto done;
  out->key = read_tls_file("tls-key", cfg->tls_key, msg, msglen);
  if (out->key == NULL) goto done;
  ERR_clear_error();
  BIO *bio = BIO_new_mem_buf(out->key, -1);
  key = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL) : NULL;
  BIO_free(bio);
  if (key == NULL) {
    snprintf(msg, msglen,
             "tls-key %s: no private key in it (%s); expected an unencrypted "
             "PEM key ('-----BEGIN PRIVATE KEY-----' or '-----BEGIN EC "
             "PRIVATE KEY-----')",
             cfg->tls_key, ssl_reason());
    goto done;
  }
  if (X509_check_private_key(cert, key) != 1) {
    snprintf(msg, msglen,
             "tls-key %s does not match the certificate in tls-cert %s (a key "
             "of another certificate?)",
             cfg->tls_key, cfg->tls_cert);
    goto done;
  }
  if (cfg->tls_client_ca[0] != '\0') {
    out->client_ca =
        read_tls_file("tls-client-ca", cfg->tls_client_ca, msg, msglen);
    if (out->client_ca == NULL) goto done;
    if (parse_certs("tls-client-ca", cfg->tls_client_ca, out->client_ca, NULL,
                    msg, msglen) == 0)
      goto done;
  }
  rc = 0;
done:
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (rc != 0) listener_tls_free(out);
  return rc;
}

/* With TLS: gRPC listens on cfg->listen itself (listener.h says why). */
static listener *listen_tls(grpc_server *server, const toposd_config *cfg,
                            const char *host, char *bound, size_t boundlen,
                            char *msg, size_t msglen) {
  listener_tls tls;
  if (listener_tls_load(cfg, &tls, msg, msglen) != 0) return NULL;
  grpc_ssl_pem_key_cert_pair pair = {tls.key, tls.cert_chain};
  /* gRPC copies the PEM text. */
  grpc_server_credentials *creds = grpc_ssl_server_credentials_create_ex(
      tls.client_ca, &pair, 1,
      tls.client_ca != NULL
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  listener_tls_free(&tls);
  if (creds == NULL) {
    snprintf(msg, msglen, "gRPC refused the TLS certificate or key");
    return NULL;
  }
  int port = grpc_server_add_http2_port(server, cfg->listen, creds);
  if (port <= 0) {
    grpc_server_credentials_release(creds);
    snprintf(msg, msglen,
             "cannot serve %s with TLS: the address does not resolve or "
             "cannot be bound (in use?)",
             cfg->listen);
    return NULL;
  }
  listener *l = calloc(1, sizeof *l);
  if (l == NULL) {
    grpc_server_credentials_release(creds);
    snprintf(msg, msglen, "out of memory");
    return NULL;
  }
  l->server = server;
  l->creds = creds;
  l->tls = true;
  l->fd = l->reserve = l->wake[0] = l->wake[1] = -1;
  pthread_mutex_init(&l->lock, NULL);
  if (strchr(host, ':') != NULL)
    snprintf(bound, boundlen, "[%s]:%d", host, port);
  else
    snprintf(bound, boundlen, "%s:%d", host, port);
  log_event("start",
            "grpc on %s over TLS%s%s; the connection cap and "
            "shedding do not apply to TLS connections (docs/operations.md)",
            bound,
            cfg->tls_client_ca[0] ? ", client certificates required "
                                    "from CAs in "
                                  : "",
            cfg->tls_client_ca);
  return l;
}

/* Without TLS: binds cfg->listen; the accept thread starts later. */
static listener *listen_plain(grpc_server *server, const toposd_config *cfg,
                              int fd, const char *host, int port, char *bound,
                              size_t boundlen, char *msg, size_t msglen) {
  listener *l = calloc(1, sizeof *l);
  if (l == NULL) {
    snprintf(msg, msglen, "out of memory");
    if (fd >= 0) close(fd);
    return NULL;
  }
  int bound_port = 0;
  if (fd >= 0) {
    l->fd = fd;
    bound_port = socket_port(fd);
  } else {
    l->fd = bind_listen(host, port, &bound_port, msg, msglen);
  }
  if (l->fd < 0) {
    free(l);
    return NULL;
  }
  if (pipe2(l->wake, O_CLOEXEC) != 0) {
    snprintf(msg, msglen, "pipe: %s", strerror(errno));
    close(l->fd);
    free(l);
    return NULL;
  }
  l->server = server;
  l->creds = grpc_insecure_server_credentials_create();
  l->reserve = -1;
  l->idle_ns = cfg->idle_timeout_ms * 1000000;
  l->cap = connection_cap(cfg->max_connections);
  pthread_mutex_init(&l->lock, NULL);
  if (strchr(host, ':') != NULL)
    snprintf(bound, boundlen, "[%s]:%d", host, bound_port);
  else
    snprintf(bound, boundlen, "%s:%d", host, bound_port);
  if (l->cap < cfg->max_connections)
    log_event("start",
              "connection cap %d (the descriptor limit allows no "
              "more than --max-connections %d)",
              l->cap, cfg->max_connections);
  return l;
}

listener *listener_start(grpc_server *server, const toposd_config *cfg, int fd,
                         char *bound, size_t boundlen, char *msg,
                         size_t msglen) {
  char host[256];
  int port = 0;
  listener *l = NULL;
  if (config_split_listen(cfg->listen, host, sizeof host, &port, msg, msglen) ==
      0)
    l = cfg->tls_cert[0] != '\0'
            ? listen_tls(server, cfg, host, bound, boundlen, msg, msglen)
            : listen_plain(server, cfg, fd, host, port, bound, boundlen, msg,
                           msglen);
  /* Ports are added before the start (gRPC's rule); connections are
   * handed over only after it. */
  grpc_server_start(server);
  if (l == NULL || l->tls) return l;
  l->started = pthread_create(&l->thread, NULL, accept_main, l) == 0;
  if (!l->started) {
    snprintf(msg, msglen, "cannot start the accept thread");
    listener_free(l);
    return NULL;
  }
  return l;
}

void listener_stop(listener *l) {
  if (l == NULL || l->fd < 0) return;
  if (l->started) {
    ssize_t w = write(l->wake[1], "x", 1);
    (void)w;
    pthread_join(l->thread, NULL);
    l->started = false;
  }
  close(l->fd);
  close(l->wake[0]);
  close(l->wake[1]);
  l->fd = l->wake[0] = l->wake[1] = -1;
  if (l->reserve >= 0) close(l->reserve);
  l->reserve = -1;
}

void listener_free(listener *l) {
  if (l == NULL) return;
  listener_stop(l);
  grpc_server_credentials_release(l->creds);
  pthread_mutex_destroy(&l->lock);
  free(l->conns);
  free(l);
}

/* ----------------------------------------------------------------- calls */

uint64_t listener_call_begin(listener *l, const char *peer, char *addr,
                             size_t addrlen) {
  if (addrlen) addr[0] = '\0';
  if (l == NULL || peer == NULL || strncmp(peer, "fd:", 3) != 0) return 0;
  char *end = NULL;
  long fd = strtol(peer + 3, &end, 10);
  if (end == peer + 3 || *end != '\0' || fd < 0) return 0;
  uint64_t handle = 0;
  pthread_mutex_lock(&l->lock);
  if (fd < l->nconns && l->conns[fd].used) {
    conn *c = &l->conns[fd];
    c->calls++;
    handle = (c->serial << HANDLE_FD_BITS) | (uint64_t)fd;
    if (addrlen) snprintf(addr, addrlen, "%s", c->addr);
  }
  pthread_mutex_unlock(&l->lock);
  return handle;
}

void listener_call_end(listener *l, uint64_t handle) {
  if (l == NULL || handle == 0) return;
  int fd = (int)(handle & ((1u << HANDLE_FD_BITS) - 1));
  uint64_t serial = handle >> HANDLE_FD_BITS;
  pthread_mutex_lock(&l->lock);
  if (fd < l->nconns && l->conns[fd].used && l->conns[fd].serial == serial &&
      l->conns[fd].calls > 0)
    l->conns[fd].calls--;
  pthread_mutex_unlock(&l->lock);
}

void listener_get_counts(listener *l, listener_counts *out) {
  memset(out, 0, sizeof *out);
  if (l == NULL) return;
  pthread_mutex_lock(&l->lock);
  out->open = l->open;
  out->accepted = l->accepted;
  out->shed = l->shed;
  out->refused = l->refused;
  out->cap = l->cap;
  pthread_mutex_unlock(&l->lock);
}
