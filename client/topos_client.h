/*
 * topos_client.h - libtoposclient: the C client of toposd, the topos
 * compile-and-execute daemon (proto/topos.proto, service topos.v1.Topos).
 *
 * One function per RPC, taking and returning the engine's own types
 * (networks, entries, parameter sets, feeds, optimizers, optimizer state,
 * tensors), so moving a training loop from in-process to remote is one
 * call: topos_plan_step becomes topos_client_step, with bit-identical
 * results (the daemon runs the same engine, and state travels with each
 * request).  A loop written against topos_trainer_step (topos.h) moves by
 * swapping topos_trainer_local for topos_client_trainer.
 *
 * Conventions (those of topos.h, plus):
 *  - Every call is a blocking unary gRPC call with a deadline: the
 *    client's default (60 s unless set with topos_client_set_deadline) or
 *    the `deadline_s` of a topos_client_args.
 *  - Values in entries, feeds and the loss are sent as node indices: use
 *    the values of the network you recorded (the daemon's replay of a spec
 *    has the same node indices).
 *  - Errors.  err->message holds the daemon's message (the engine's, for
 *    engine errors) prefixed with the gRPC status name, e.g.
 *    "NOT_FOUND: spec 3f2a... is not stored".  err->code is a topos_status
 *    when one fits: the daemon's exact code when it sends one (trailing
 *    metadata "topos-status"), else INVALID_ARGUMENT -> TOPOS_ERR_ARGUMENT,
 *    NOT_FOUND -> TOPOS_ERR_NOT_FOUND, RESOURCE_EXHAUSTED ->
 *    TOPOS_ERR_MEMORY, DATA_LOSS -> TOPOS_ERR_CORRUPT.  Any other status s
 *    (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNIMPLEMENTED, INTERNAL,
 *    ...) gives code TOPOS_CLIENT_GRPC_BASE + s.  topos_client_grpc_status
 *    recovers the gRPC status of any error code.  Errors found before
 *    anything is sent (NULL arguments, a bad id) have topos codes.
 *  - Thread safety: a topos_client may be used by any number of threads at
 *    once (each call has its own completion queue; the channel is shared).
 *    Close it only after every call has returned.
 *  - Strings returned are new: free them with topos_free.
 */
#ifndef TOPOS_CLIENT_H
#define TOPOS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topos.h"

#ifdef __cplusplus
extern "C" {
#endif

/* err->code of a gRPC status with no topos_status: this base + status. */
#define TOPOS_CLIENT_GRPC_BASE 100
/* Where the CLI and the examples connect unless told otherwise. */
#define TOPOS_CLIENT_DEFAULT_ADDRESS "127.0.0.1:50051"

typedef struct topos_client topos_client;

/* A new client of the daemon at `address`: "host:port"; a list of IP
 * addresses "10.0.0.1:50051,10.0.0.2:50051" (replicas, balanced
 * round-robin); or any gRPC target with its scheme ("dns:///name:port",
 * whose every address is used, as for a Kubernetes headless Service;
 * "unix:/path").  An address without its port is refused ("needs
 * HOST:PORT").  The channel connects lazily: an unreachable daemon shows
 * up on the first call, after its retries, as "cannot reach toposd at
 * ADDRESS: connection refused" (use topos_client_health to check).
 * Replicas are interchangeable: a spec this client recorded is recorded
 * again on a replica that answers "no spec with id" (the newest 16 are
 * kept), and the call is sent once more.  Messages of any size are allowed in
 * both directions (the daemon enforces its own limit).  NULL with err on
 * a bad address or out of memory.  Close with topos_client_close.
 * $TOPOS_TOKEN and $TOPOS_TLS_CA/_CERT/_KEY apply (below). */
TOPOS_API topos_client *topos_client_connect(const char *address,
                                             topos_error *err);

/* TLS settings of a connection (docs/operations.md "TLS"): PEM files,
 * read at connect. */
typedef struct topos_client_tls {
  const char *ca_file;   /* CA bundle that signed the daemon's certificate;
                          * NULL: plain text */
  const char *cert_file; /* this client's certificate chain, for a daemon
                          * that asks for one (mTLS); NULL: none */
  const char *key_file;  /* its private key; with cert_file */
} topos_client_tls;

/* As topos_client_connect, with TLS when tls->ca_file is set: the daemon
 * must present a certificate signed by a CA of ca_file that names the
 * address's host (an IP or DNS subjectAltName); verification is never
 * off.  tls NULL takes the settings from the environment, which is what
 * topos_client_connect does: $TOPOS_TLS_CA (set: TLS on),
 * $TOPOS_TLS_CERT and $TOPOS_TLS_KEY.  A file that cannot be read or
 * holds no PEM, a certificate without its key, or a certificate without
 * a CA is TOPOS_ERR_ARGUMENT naming the file or the setting.  A daemon
 * that refuses the handshake (wrong CA, no or a refused client
 * certificate, plain text against TLS) shows up as UNAVAILABLE on the
 * first call, like an unreachable one. */
TOPOS_API topos_client *topos_client_connect_tls(const char *address,
                                                 const topos_client_tls *tls,
                                                 topos_error *err);
/* Closes the channel and releases gRPC (balanced grpc_init/shutdown).
 * NULL is a no-op. */
TOPOS_API void topos_client_close(topos_client *c);
/* The default deadline of later calls, in seconds (> 0; default 60). */
TOPOS_API void topos_client_set_deadline(topos_client *c, double seconds);
/* How long a call may be sent again after UNAVAILABLE (a daemon restarting
 * or draining, a replica gone, a full queue), within its deadline:
 * backoff from 50 ms doubling to 2 s, with jitter.  Every method but the
 * Admin* ones is retried (each is a pure function of its request).  0
 * turns retries off; default 30 s. */
TOPOS_API void topos_client_set_retry(topos_client *c, double seconds);
/* The bearer token sent with every later call as the gRPC metadata
 * "authorization: Bearer TOKEN" (docs/protocol.md, docs/operations.md);
 * NULL or "" sends none.  topos_client_connect sets $TOPOS_TOKEN when it
 * is set, so programs that never call this still authenticate.  A token
 * longer than 256 characters, or with a character that is not printable
 * ASCII, is TOPOS_ERR_ARGUMENT and changes nothing.  Safe while other
 * threads call. */
TOPOS_API int topos_client_set_token(topos_client *c, const char *token,
                                     topos_error *err);

/* The gRPC status (grpc_status_code) an error code stands for: 0 for
 * TOPOS_OK, code - TOPOS_CLIENT_GRPC_BASE for client codes, and the
 * status the daemon maps a topos_status to otherwise (INVALID_ARGUMENT
 * for argument/shape/dtype/range/state, NOT_FOUND, RESOURCE_EXHAUSTED,
 * DATA_LOSS, UNAVAILABLE for io). */
TOPOS_API int topos_client_grpc_status(int code);

/* --------------------------------------------------------------- specs */

/* Record: sends net as a structured spec; the daemon replays and stores
 * it and answers its id (the SHA-256 of the canonical encoding, equal to
 * topos_network_id(net)), written to id (65 bytes, NUL-terminated).
 * Idempotent.  Returns a topos_status. */
TOPOS_API int topos_client_record(topos_client *c, const topos_network *net,
                                  char id[65], topos_error *err);
/* Describe's SVG format: the daemon lays the DOT listing out with
 * Graphviz and answers an SVG document (the engine's topos_format has no
 * SVG: it renders nothing).  Networks over the daemon's size caps are
 * RESOURCE_EXHAUSTED (TOPOS_ERR_MEMORY): ask for DOT and render it. */
#define TOPOS_CLIENT_FORMAT_SVG ((topos_format)3)

/* Describe: the stored spec as text, JSON or DOT (topos_network_describe
 * on the daemon), or SVG (TOPOS_CLIENT_FORMAT_SVG).  *text is new
 * (topos_free). */
TOPOS_API int topos_client_describe(topos_client *c, const char *id,
                                    topos_format format, char **text,
                                    topos_error *err);
/* Every call that takes an entry sends all of it: roots, observes,
 * posture, numerics and threads (Entry.threads: 0 = the daemon's default;
 * a negative count is TOPOS_ERR_ARGUMENT here, above TOPOS_THREADS_MAX the
 * daemon's INVALID_ARGUMENT).
 *
 * Lower: the plan the daemon compiles for `entry` (values are node indices
 * of the recorded network), as topos_plan_describe text.  peak_bytes and
 * groups may be NULL.  *text is new (topos_free). */
TOPOS_API int topos_client_lower(topos_client *c, const char *id,
                                 const topos_entry *entry, char **text,
                                 int64_t *peak_bytes, int *groups,
                                 topos_error *err);
/* Emit: the plan as a StableHLO module.  *text is new (topos_free). */
TOPOS_API int topos_client_emit(topos_client *c, const char *id,
                                const topos_entry *entry, topos_emit_form form,
                                char **text, topos_error *err);

/* ----------------------------------------------------------- execution */

/* The inputs of an execution call.  Zero-initialise and set what you
 * need: {0} means the spec's initial parameters, no feeds (every input
 * takes its default), the client's deadline. */
typedef struct topos_client_args {
  const topos_params *params; /* slot order; NULL: the spec's initials */
  /* Instead of params: a blob uploaded with topos_client_put_blob whose
   * tensors 0..nparams_blob-1 are the parameter slots.  Nothing but the
   * reference crosses the wire. */
  const char *params_blob;
  int nparams_blob;
  const topos_feed *feeds; /* inputs of the recorded network */
  int nfeeds;
  double deadline_s; /* > 0: this call's deadline; 0: the client's */
  /* How the daemon runs the call: numerics, threads and backend by name
   * (sent as ExecOptions; cancel, deadline_ns and report stay here).
   * NULL: the entry's (Forward, Conformance's default candidates) or the
   * daemon's default (exact, auto).  Conformance takes nexec candidates
   * from exec (nexec 0 with exec set means one). */
  const topos_exec *exec;
  int nexec;
  /* Out, when ran is not NULL: the backends the daemon says ran a task of
   * the call, comma-separated ("cpu,reference"). */
  char *ran;
  size_t ran_len;
} topos_client_args;

/* Forward: evaluates `entry` (roots and observes) on the daemon.
 * *roots is a new array of entry->nroots new tensors, *observes of
 * entry->nobserves (either out pointer may be NULL when not wanted);
 * free each with topos_client_tensors_free.  Bits equal topos_forward's. */
TOPOS_API int topos_client_forward(topos_client *c, const char *id,
                                   const topos_entry *entry,
                                   const topos_params *params,
                                   const topos_feed *feeds, int nfeeds,
                                   topos_tensor ***roots,
                                   topos_tensor ***observes, topos_error *err);
TOPOS_API int topos_client_forward_with(topos_client *c, const char *id,
                                        const topos_entry *entry,
                                        const topos_client_args *args,
                                        topos_tensor ***roots,
                                        topos_tensor ***observes,
                                        topos_error *err);
/* Releases n tensors and frees the array (NULL is a no-op). */
TOPOS_API void topos_client_tensors_free(topos_tensor **v, int n);

/* Backward: the rank-0 `loss` and its gradient with respect to every
 * parameter slot (*grads new, topos_params_free).  loss_out and grads may
 * be NULL when not wanted.  Bits equal topos_forward + topos_backward +
 * topos_parameters_of. */
TOPOS_API int topos_client_backward(topos_client *c, const char *id,
                                    topos_value loss,
                                    const topos_params *params,
                                    const topos_feed *feeds, int nfeeds,
                                    double *loss_out, topos_params **grads,
                                    topos_error *err);
TOPOS_API int topos_client_backward_with(topos_client *c, const char *id,
                                         topos_value loss,
                                         const topos_client_args *args,
                                         double *loss_out, topos_params **grads,
                                         topos_error *err);

/* Step: one training step on the daemon: forward, backward of `loss`,
 * and `opt` applied to (params, grads, state) exactly as
 * topos_optimizer_step does.  state NULL means a fresh state
 * (topos_opt_state_new).  A custom AdamW decay predicate cannot cross the
 * wire: it is evaluated here on the parameters and sent as the slots it
 * selects, so it needs params (not NULL, not a blob).  Outputs: *params_out and
 * *state_out new (either pointer may be NULL when not wanted), *loss_out the
 * loss before the step. */
TOPOS_API int topos_client_step(topos_client *c, const char *id,
                                topos_value loss, const topos_params *params,
                                const topos_feed *feeds, int nfeeds,
                                const topos_optimizer *opt,
                                const topos_opt_state *state,
                                topos_params **params_out,
                                topos_opt_state **state_out, double *loss_out,
                                topos_error *err);
TOPOS_API int topos_client_step_with(
    topos_client *c, const char *id, topos_value loss,
    const topos_client_args *args, const topos_optimizer *opt,
    const topos_opt_state *state, topos_params **params_out,
    topos_opt_state **state_out, double *loss_out, topos_error *err);

/* A remote trainer (topos.h, topos_trainer): each topos_trainer_step is one
 * topos_client_step_with on spec `id` for `loss`, with bits identical to
 * topos_trainer_local's on the same network.  exec (copied; NULL: the
 * daemon's default, exact) travels as the Step's ExecOptions; its
 * deadline_ns becomes each call's deadline and its cancel predicate is
 * asked before each call (neither crosses the wire), its report is not
 * filled.  Results have no run and no observes.  The client is borrowed
 * and must outlive the trainer.  New trainer (topos_trainer_free), or NULL
 * with err (NULL client, malformed id, a loss that is no value). */
TOPOS_API topos_trainer *topos_client_trainer(topos_client *c, const char *id,
                                              topos_value loss,
                                              const topos_exec *exec,
                                              topos_error *err);

/* ------------------------------------------------------- Train streams */

/* A training session as one gRPC stream (rpc Train; docs/daemon.md, "Train
 * streams"): the parameters and optimizer state stay on the daemon between
 * steps, so a step sends only its feeds and gets back its loss.  After k
 * steps the session's parameters and state are bit for bit those of k
 * topos_client_step calls (and of topos_plan_step in-process); a step
 * sent with return_state, and topos_client_train_close, hand them back.
 * Up to any number of steps may be sent before their replies are read
 * (the daemon runs them in order, one at a time): a loop that sends step
 * k+1 before reading step k's loss keeps the daemon busy while the client
 * encodes.  A step the daemon refuses (bad feeds, a drain) changes
 * nothing and ends the stream: its reply has `last` set and the
 * parameters and state of the last step that ran, and the error is the
 * stream's status.  A stream is used by one thread at a time. */
typedef struct topos_client_train topos_client_train;

typedef struct topos_client_train_reply {
  int64_t steps; /* steps the session has run */
  double loss;   /* this step's loss, before its update (0 for none) */
  /* New when the reply carries them (return_state, close, last), else
   * NULL; topos_client_train_reply_clear frees them. */
  topos_params *params;
  topos_opt_state *state;
  bool last; /* the daemon ended the stream after this reply */
  /* Each step's loss, for topos_client_train_send_steps (new, or NULL). */
  double *losses;
  int nlosses;
} topos_client_train_reply;

/* Opens a session on spec `id` for `loss`: it starts from args->params
 * (or args->params_blob; NULL: the spec's initials) and `state` (NULL: a
 * fresh one), and every step runs `opt` under args->exec.  args->feeds
 * must be empty (each step sends its own); args->deadline_s, when > 0,
 * bounds the whole stream (otherwise it has none).  Waits for the daemon
 * to take the session: NULL with err when it refuses (unknown spec, a bad
 * optimizer or parameter set, auth, a drain). */
TOPOS_API topos_client_train *topos_client_train_open(
    topos_client *c, const char *id, topos_value loss,
    const topos_client_args *args, const topos_optimizer *opt,
    const topos_opt_state *state, topos_error *err);
/* Sends one step's feeds without waiting for its reply. */
TOPOS_API int topos_client_train_send(topos_client_train *t,
                                      const topos_feed *feeds, int nfeeds,
                                      bool return_state, topos_error *err);
/* Sends nsteps steps as one message: step i's feeds are
 * feeds[i * nfeeds .. i * nfeeds + nfeeds - 1].  The daemon runs them in
 * order and answers once, with every step's loss (Keras's steps per
 * execution: the round trip is paid once).  All run, or when one is
 * refused none does. */
TOPOS_API int topos_client_train_send_steps(topos_client_train *t,
                                            const topos_feed *feeds, int nfeeds,
                                            int nsteps, bool return_state,
                                            topos_error *err);
/* Reads the oldest reply not read yet (out may be NULL: dropped). */
TOPOS_API int topos_client_train_recv(topos_client_train *t,
                                      topos_client_train_reply *out,
                                      topos_error *err);
/* send, then recv. */
TOPOS_API int topos_client_train_step(topos_client_train *t,
                                      const topos_feed *feeds, int nfeeds,
                                      bool return_state,
                                      topos_client_train_reply *out,
                                      topos_error *err);
TOPOS_API void topos_client_train_reply_clear(topos_client_train_reply *r);
/* Ends the session: reads the replies still owed, asks for the final
 * parameters and state when params_out or state_out is not NULL (new),
 * closes the client's side and reads the status. */
TOPOS_API int topos_client_train_close(topos_client_train *t,
                                       topos_params **params_out,
                                       topos_opt_state **state_out,
                                       topos_error *err);
/* Frees the stream, cancelling it when it was not closed. */
TOPOS_API void topos_client_train_free(topos_client_train *t);

/* Conformance: runs `entry`'s plan on the daemon under each candidate of
 * args->exec (none: the reference backend and every exact backend the
 * daemon has) and compares it with the reference interpreter, as
 * topos_conformance_run does in-process.  *out is new, the same struct
 * (topos_conformance_free). */
TOPOS_API int topos_client_conformance(topos_client *c, const char *id,
                                       const topos_entry *entry,
                                       const topos_client_args *args,
                                       topos_conformance **out,
                                       topos_error *err);

/* Backends: the daemon's registry (the reference first), as
 * topos_backends_list gives it in-process.  *out is a new array of *count
 * entries (topos_free). */
TOPOS_API int topos_client_backends(topos_client *c, topos_backend_info **out,
                                    int *count, topos_error *err);

/* --------------------------------------------------------------- blobs */

/* PutBlob: uploads a parameter set once; its id (64 hex digits: the
 * SHA-256 the daemon takes of the canonically packed tensors, so the same
 * tensors give the same id) goes to id, the stored size to *bytes (may be
 * NULL).
 * Later calls pass it as topos_client_args.params_blob. */
TOPOS_API int topos_client_put_blob(topos_client *c, const topos_params *p,
                                    char id[65], int64_t *bytes,
                                    topos_error *err);
/* GetBlob: the tensors of blob `id`, in the order PutBlob took them:
 * *tensors a new array of *n new tensors (topos_client_tensors_free).
 * NOT_FOUND for an unknown id (or another tenant's blob). */
TOPOS_API int topos_client_get_blob(topos_client *c, const char *id,
                                    topos_tensor ***tensors, int *n,
                                    topos_error *err);
/* AdminSpecDelete: removes stored spec `id` and what the daemon cached
 * from it (an admin tenant's token when the daemon has tenants); *bytes
 * (may be NULL) gets the size removed.  NOT_FOUND when there is none,
 * FAILED_PRECONDITION while a call runs it.  Not retried, and this client
 * no longer records it again on its own (topos_client_connect). */
TOPOS_API int topos_client_delete_spec(topos_client *c, const char *id,
                                       int64_t *bytes, topos_error *err);
/* StatBlob: whether the daemon holds blob `id`, and its size. */
TOPOS_API int topos_client_stat_blob(topos_client *c, const char *id,
                                     bool *present, int64_t *bytes,
                                     topos_error *err);

/* -------------------------------------------------------------- health */

/* Health: "serving" or "draining", and the daemon's version (either
 * buffer may be NULL). */
TOPOS_API int topos_client_health(topos_client *c, char status[32],
                                  char version[64], topos_error *err);

typedef struct topos_client_stats_info {
  int workers, queue_depth, queue_capacity;
  int64_t requests, errors;
  int64_t cache_entries, cache_hits, cache_misses;
  int64_t specs, spec_bytes, blobs, blob_bytes;
  /* Client connections: open, shed and refused since start, the cap. */
  int64_t connections, connections_shed, connections_refused;
  int connection_cap;
  /* Tasks each backend ran since the daemon started, registry order
   * (the reference first: the tasks no backend took). */
  int nbackends;
  char backend_names[TOPOS_BACKENDS_MAX][32];
  int64_t backend_tasks[TOPOS_BACKENDS_MAX];
} topos_client_stats_info;

/* Stats: worker pool, queue, cache and store counters. */
TOPOS_API int topos_client_stats(topos_client *c, topos_client_stats_info *out,
                                 topos_error *err);

/* ------------------------------------------------------ administration */

/* Tenants, tokens and quotas through the daemon (docs/operations.md,
 * "Tenants and tokens"; the Admin* RPCs): what `topos --store PATH tenant
 * ...` does on the store file.  Every call needs an admin tenant's token
 * (topos_client_set_token, $TOPOS_TOKEN): another tenant's call fails
 * with gRPC status PERMISSION_DENIED (topos_client_grpc_status(code) ==
 * 7) and changes nothing.  An unknown tenant or token is
 * TOPOS_ERR_NOT_FOUND, a malformed name or id TOPOS_ERR_ARGUMENT, a taken
 * name ALREADY_EXISTS (6), a change that would leave no admin tenant with
 * a live token FAILED_PRECONDITION (9).  Tenant names are 1..64 of a-z,
 * 0-9, '_' and '-'. */
#define TOPOS_CLIENT_TENANT_NAME_MAX 64
#define TOPOS_CLIENT_TOKEN_ID_LEN 16
/* A token's secret: "tps_" and 64 hex digits. */
#define TOPOS_CLIENT_SECRET_LEN 68

typedef struct topos_client_tenant {
  char name[TOPOS_CLIENT_TENANT_NAME_MAX + 1];
  bool admin;
  int64_t created_ms;  /* ms since the epoch */
  int64_t live_tokens; /* tokens not revoked */
} topos_client_tenant;

typedef struct topos_client_token {
  char id[TOPOS_CLIENT_TOKEN_ID_LEN + 1];
  char tenant[TOPOS_CLIENT_TENANT_NAME_MAX + 1];
  int64_t created_ms;
  int64_t revoked_ms; /* 0 while live */
} topos_client_token;

/* Adds a tenant (admin or not).  out (may be NULL) gets it.  With token
 * and secret (TOPOS_CLIENT_SECRET_LEN + 1 bytes) both set, the same call
 * also creates a token for it: its secret is in this answer only.  A
 * daemon without tenants takes only an admin with a token this way (its
 * first tenant turns tokens on). */
TOPOS_API int topos_client_tenant_add(topos_client *c, const char *name,
                                      bool admin, topos_client_tenant *out,
                                      topos_client_token *token, char *secret,
                                      topos_error *err);
/* Every tenant, by name: *out a new array of *n (free()). */
TOPOS_API int topos_client_tenant_list(topos_client *c,
                                       topos_client_tenant **out, int *n,
                                       topos_error *err);
/* Removes the tenant with its tokens, quotas and ownership; out (may be
 * NULL) gets it as it was. */
TOPOS_API int topos_client_tenant_remove(topos_client *c, const char *name,
                                         topos_client_tenant *out,
                                         topos_error *err);
/* A new token for tenant: its secret (TOPOS_CLIENT_SECRET_LEN + 1 bytes)
 * is shown only now; token (may be NULL) gets its id. */
TOPOS_API int topos_client_token_create(topos_client *c, const char *tenant,
                                        topos_client_token *token, char *secret,
                                        topos_error *err);
/* The tenant's tokens, newest first, revoked ones included: *out a new
 * array of *n (free()). */
TOPOS_API int topos_client_token_list(topos_client *c, const char *tenant,
                                      topos_client_token **out, int *n,
                                      topos_error *err);
/* Revokes a token by id (again: no change); out (may be NULL) gets it. */
TOPOS_API int topos_client_token_revoke(topos_client *c, const char *id,
                                        topos_client_token *out,
                                        topos_error *err);

/* A tenant's quotas (docs/operations.md, "Quotas"): -1 is none (for
 * weight: the default, 1).  rate_per_s and burst go together. */
typedef struct topos_client_quota {
  int64_t stored_bytes;
  int64_t inflight;
  double rate_per_s;
  int64_t burst;
  int64_t nodes_per_spec;
  int64_t run_ms;
  int64_t run_bytes;
  int64_t weight;       /* 1..1000: a share of the workers, not a limit */
  int64_t device_bytes; /* a run's device memory (its largest task) */
} topos_client_quota;
/* Which fields topos_client_quota_set sends (the store's STORE_QUOTA_*
 * bits). */
enum {
  TOPOS_CLIENT_QUOTA_STORED_BYTES = 1 << 0,
  TOPOS_CLIENT_QUOTA_INFLIGHT = 1 << 1,
  TOPOS_CLIENT_QUOTA_RATE = 1 << 2, /* rate_per_s and burst */
  TOPOS_CLIENT_QUOTA_NODES = 1 << 3,
  TOPOS_CLIENT_QUOTA_RUN_MS = 1 << 4,
  TOPOS_CLIENT_QUOTA_RUN_BYTES = 1 << 5,
  TOPOS_CLIENT_QUOTA_WEIGHT = 1 << 6,
  TOPOS_CLIENT_QUOTA_DEVICE_BYTES = 1 << 7,
};
/* Every field -1. */
TOPOS_API topos_client_quota topos_client_quota_none(void);
/* Sets the fields of q named in mask for tenant, leaving the others as
 * they are; the daemon applies them from the tenant's next call.  now
 * (may be NULL) gets the quotas after the change. */
TOPOS_API int topos_client_quota_set(topos_client *c, const char *tenant,
                                     const topos_client_quota *q, unsigned mask,
                                     topos_client_quota *now, topos_error *err);
/* The tenant's quotas. */
TOPOS_API int topos_client_quota_show(topos_client *c, const char *tenant,
                                      topos_client_quota *out,
                                      topos_error *err);

/* ------------------------------------------------------------- raw calls */

/* One unary call with an already-serialised request: `method` is the RPC
 * name ("Forward") or a full path ("/topos.v1.Topos/Forward"); any other
 * path is sent as is (the daemon answers UNIMPLEMENTED).  On success
 * *reply is a new buffer of *reply_len bytes (free()); on a non-OK status
 * the error is filled as above and, when status is not NULL, *status is
 * the gRPC status.  For tools (the CLI) and tests (hostile bytes). */
TOPOS_API int topos_client_call_raw(topos_client *c, const char *method,
                                    const uint8_t *request, size_t request_len,
                                    double deadline_s, uint8_t **reply,
                                    size_t *reply_len, int *status,
                                    topos_error *err);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CLIENT_H */
