/*
 * listener.h - toposd's own TCP listener in front of gRPC.
 *
 * Why not gRPC's: gRPC C core 1.51 stops accepting for good after one
 * accept4 fails with EMFILE, while the connections it has keep working,
 * so a flood of idle connections leaves a daemon that looks healthy and
 * serves nobody new.  Here one thread accepts, hands each connection to
 * the server (grpc_server_add_channel_from_fd), and keeps the descriptor
 * budget: a connection cap clamped below the descriptor limit, a reserve
 * descriptor spent to drain the backlog when the process runs out anyway,
 * and shedding of the longest-silent connection that has no call in
 * flight when the cap is reached or a connection has been silent for the
 * idle timeout.  docs/daemon.md ("Hostile load") has the rules.
 *
 * TLS (--tls-cert, docs/operations.md "TLS") is the exception: gRPC 1.51
 * hands a descriptor only to insecure credentials
 * (grpc_server_add_channel_from_fd refuses every other kind), so with TLS
 * gRPC listens on the port itself with its SSL credentials, and the
 * connection cap, shedding and descriptor reserve above do not apply;
 * gRPC's idle timeout (GRPC_ARG_MAX_CONNECTION_IDLE_MS) still does.
 */
#ifndef TOPOSD_LISTENER_H
#define TOPOSD_LISTENER_H

#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct listener listener;

/* TLS material read from the files cfg names, NUL-terminated PEM text
 * (NULL where not configured). */
typedef struct listener_tls {
  char *cert_chain;
  char *key;
  char *client_ca;
} listener_tls;

/* Reads the files of --tls-cert, --tls-key and --tls-client-ca and checks
 * them with OpenSSL, so that a bad file stops the daemon at start rather
 * than failing every handshake: each must be readable PEM, the key must
 * not be encrypted and must match the first certificate, the certificate
 * must be valid now, the CA bundle must hold at least one certificate.
 * Returns 0 (all NULL when TLS is off), or -1 with msg naming the file
 * and what is wrong.  Free with listener_tls_free. */
int listener_tls_load(const toposd_config *cfg, listener_tls *out, char *msg,
                      size_t msglen);
void listener_tls_free(listener_tls *tls);

/* Binds before anything else is touched (main calls these before the
 * store is opened, so an address in use stops the daemon with one clear
 * line and no store file).  listener_bind: cfg->listen without TLS, bound
 * and listening; the descriptor goes to listener_start.  listener_probe:
 * an address something else binds later (gRPC's TLS port, the gateway):
 * a bind is tried and released; port 0 always passes.  -1 with msg
 * ("cannot listen on 127.0.0.1:50051: Address already in use"). */
int listener_bind(const toposd_config *cfg, char *msg, size_t msglen);
int listener_probe(const char *address, char *msg, size_t msglen);

/* Starts `server` (created, its methods registered, not started) on
 * cfg->listen (strictly parsed: config_split_listen): without TLS, takes
 * listener_bind's descriptor fd (or binds the address when fd is -1) and
 * starts the accept thread; with TLS, adds the address to
 * gRPC with SSL server credentials (client certificates required and
 * verified with --tls-client-ca).  The server is started whatever the
 * outcome, so the caller shuts it down the same way on failure.  bound
 * gets HOST:PORT with the actual port.  NULL with a message when the
 * address does not resolve or cannot be bound, or a TLS file is bad. */
listener *listener_start(grpc_server *server, const toposd_config *cfg, int fd,
                         char *bound, size_t boundlen, char *msg,
                         size_t msglen);
/* Stops accepting: joins the thread and closes the listening socket (a
 * no-op the second time).  The connections handed over stay the
 * server's, and calls may still begin and end. */
void listener_stop(listener *l);
/* Frees a stopped listener (after the last call ended). */
void listener_free(listener *l);

/* A call arrived on the connection gRPC names `peer` ("fd:N" for the
 * channels made here): while it is in flight the connection is never
 * shed.  Returns a handle for listener_call_end (0 when unknown).  addr
 * gets the connection's remote address for the request log ("" when
 * unknown). */
uint64_t listener_call_begin(listener *l, const char *peer, char *addr,
                             size_t addrlen);
void listener_call_end(listener *l, uint64_t handle);

typedef struct listener_counts {
  int64_t open;     /* connections handed to gRPC and not yet closed */
  int64_t accepted; /* since start */
  int64_t shed;     /* closed by the daemon: cap, idle, descriptors */
  int64_t refused;  /* closed at once: no descriptor or room left */
  int cap;          /* the connection cap in force */
} listener_counts;

void listener_get_counts(listener *l, listener_counts *out);

#endif /* TOPOSD_LISTENER_H */
