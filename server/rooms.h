/*
 * rooms.h - what the handler files share (private to server/; the front
 * sees only handlers.h).
 *
 * The handlers live in rooms by resource (docs/daemon.md):
 *   handlers.c     call plumbing: statuses, unpacking, replies, the
 *                  engine context of a call, the method table
 *   specs.c        Record, Describe, Lower, Emit; cached networks, plans
 *   runs.c         Forward, Backward, Step; the inputs of a run
 *   blob_rpc.c     PutBlob, StatBlob; cached blobs, references to them
 *   conformance.c  Conformance
 *   status.c       Health, Stats
 * Each section below is implemented by the file it names.
 */
#ifndef TOPOSD_ROOMS_H
#define TOPOSD_ROOMS_H

#include <stdbool.h>
#include <stddef.h>

#include "cache.h"
#include "handlers.h"
#include "wire.h"

/* ------------------------------------------------ call plumbing: handlers.c */

/* Fails the call with a gRPC status, the engine's code (0 if none) and a
 * message; the first failure of a call wins. */
void call_fail(call_ctx *cx, int status, int topos_code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Fails the call with an engine error: its code picks the status, its
 * message is the text.  `what` names the step for an error without one. */
void call_fail_err(call_ctx *cx, const topos_error *err, const char *what);
/* The request unpacked as `desc` into the call's arena, or NULL with the
 * call failed.  `optional`: a call without a message unpacks as empty. */
void *call_unpack(call_ctx *cx, const ProtobufCMessageDescriptor *desc,
                  const char *what, bool optional);
/* Packs m as the call's reply (unless the call already failed). */
void call_reply(call_ctx *cx, const ProtobufCMessage *m);
/* n bytes of request-lifetime memory (the worker's arena), or NULL with the
 * call failed. */
void *call_scratch(call_ctx *cx, size_t n);
/* The context a call's engine runs get: the plan's entry (numerics,
 * threads; the defaults without a plan), stopped at a node boundary by
 * call_should_stop, reporting into cx->report. */
topos_exec call_exec(call_ctx *cx, const topos_plan *plan);
/* The context of a request with execution options: opts when present
 * (numerics, threads, backend), else the plan's entry with the entry's
 * backend hint (entry_backend, "" or NULL for auto).  False with the call
 * failed INVALID_ARGUMENT when it cannot run (threads out of range, an
 * unknown backend or an envelope one under exact: the message names the
 * known backends), or RESOURCE_EXHAUSTED when the run would go over the
 * tenant's device_bytes quota (call_device_quota).  The backend string
 * is borrowed from opts/entry. */
bool call_exec_of(call_ctx *cx, const Topos__V1__ExecOptions *opts,
                  const topos_plan *plan, const char *entry_backend,
                  topos_exec *out);
/* The tenant's device_bytes quota (docs/operations.md, "Quotas"): when
 * the run's tasks may go to a device (backend NULL/""/auto on a host with
 * a device, or a device backend named), its device bound
 * (topos_plan_device_bytes) must be within the quota; false with the call
 * failed RESOURCE_EXHAUSTED otherwise, naming the quota, the limit and
 * the ask. */
bool call_device_quota(call_ctx *cx, const topos_plan *plan,
                       const char *backend);
/* The names of the backends that ran tasks of the call (cx->report), as a
 * reply's repeated string (call-lifetime memory).  False with the call
 * failed when out of memory. */
bool call_backends(call_ctx *cx, char ***names, size_t *n);
/* "cpu,blas" as a repeated string in call memory (false with the call
 * failed when out of memory). */
bool call_split_names(call_ctx *cx, const char *list, char ***out, size_t *n);
/* Checks a spec or blob id from a request (`what` names it). */
bool call_check_id(call_ctx *cx, const char *id, const char *what);
/* The caller's stored_bytes quota (docs/operations.md, "Quotas"): true
 * when its tenant may add `adds` bytes (a spec or blob it does not own
 * yet) to what it owns; otherwise fails the call RESOURCE_EXHAUSTED,
 * naming the quota, the limit, the holding and the ask, and false. */
bool call_quota_stored(call_ctx *cx, const char *method, int64_t adds);

/* ------------------------------------------------- specs and plans: specs.c */

/* The stored spec `id` as a network (borrowed until *ref is released);
 * records the id for the request log. */
topos_network *spec_network(call_ctx *cx, const char *id, cache_entry **ref);
/* The plan of `entry` over net, the spec of the call (borrowed until *ref
 * is released). */
topos_plan *spec_plan(call_ctx *cx, const topos_network *net,
                      const topos_entry *entry, cache_entry **ref);

/* The network and the plan of a request's entry; release both refs. */
typedef struct planned {
  topos_network *net;
  cache_entry *net_ref;
  wire_entry entry;
  topos_plan *plan;
  cache_entry *plan_ref;
} planned;

/* Plans the request's entry over the stored spec `id`. */
bool plan_request(call_ctx *cx, const char *id, const Topos__V1__Entry *entry,
                  planned *p);
void planned_clear(call_ctx *cx, planned *p);

/* ---------------------------------------------- blob references: blob_rpc.c */

/* The blobs a request's tensors refer to, looked up (cache, pending
 * writes, store) before the tensors are converted, so wire.c converts
 * from a table and never reaches into the daemon.  Zero-initialise, add
 * the tensor fields in the order the conversion reads them, convert with
 * blob_refs_table, then clear (the converted tensors hold their own
 * references).  Lookups stop at the first that fails: the conversion
 * stops at that reference too (wire.h, wire_blobs). */
typedef struct blob_refs {
  wire_blob *v;
  cache_entry **refs; /* one per entry of v, in no particular order */
  size_t n, cap;
  const char *last; /* the id looked up last: a run of refs to it is one */
  wire_blobs table;
} blob_refs;

/* Looks up the blobs that n tensor messages refer to.  False only when out
 * of memory (the call is failed); a blob that is not there is the
 * conversion's error. */
bool blob_refs_add(call_ctx *cx, blob_refs *b, Topos__V1__Tensor *const *v,
                   size_t n);
/* The table for wire's converters (never NULL: references are allowed). */
const wire_blobs *blob_refs_table(blob_refs *b);
void blob_refs_clear(call_ctx *cx, blob_refs *b);

/* ------------------------------------------------------- run inputs: runs.c */

/* What Forward/Backward/Step/Conformance read from a request. */
typedef struct run_inputs {
  topos_params *params; /* NULL = the spec's initials */
  topos_feed *feeds;
  int nfeeds;
} run_inputs;

/* The request's parameters and feeds over net, blob references resolved. */
bool run_inputs_read(call_ctx *cx, const topos_network *net,
                     Topos__V1__Tensor *const *params, size_t nparams,
                     Topos__V1__Feed *const *feeds, size_t nfeeds,
                     run_inputs *out);
void run_inputs_clear(run_inputs *in);

/* -------------------------------- the handlers, for the table in handlers.c */

void handle_backends(call_ctx *cx);
void handle_record(call_ctx *cx);
void handle_describe(call_ctx *cx);
void handle_list_specs(call_ctx *cx);
void handle_lower(call_ctx *cx);
void handle_emit(call_ctx *cx);
void handle_forward(call_ctx *cx);
void handle_backward(call_ctx *cx);
void handle_step(call_ctx *cx);
void handle_train(call_ctx *cx); /* a stream's message (cx->train) */
void handle_conformance(call_ctx *cx);
void handle_put_blob(call_ctx *cx);
void handle_stat_blob(call_ctx *cx);
void handle_get_blob(call_ctx *cx);
void handle_health(call_ctx *cx);
void handle_health_check(call_ctx *cx); /* grpc.health.v1.Health/Check */
void handle_stats(call_ctx *cx);

#endif /* TOPOSD_ROOMS_H */
