/*
 * handlers.c - what each RPC of topos.v1.Topos does.
 *
 * Every request is a pure function of its message and the immutable,
 * content-addressed store: Record adds a spec (idempotent), PutBlob adds a
 * blob, and nothing else writes.  Forward/Backward/Step run the spec's
 * plan for the request's entry (plans are bit-identical to the reference
 * interpreter, docs/numerics.md), on the request's parameters (empty =
 * the spec's initials), feeds and optimizer state, so a remote Step is
 * exactly topos_plan_forward + topos_plan_gradients + topos_optimizer_step
 * in-process.
 *
 * Decoded networks, compiled plans and decoded blobs are cached (cache.c)
 * by spec id + entry key, or blob id: the cached values are immutable and
 * shared by all workers.
 *
 * Errors: the engine's topos_error becomes the gRPC status of
 * wire_grpc_status_of, its message the status details and its code the
 * trailing "topos-status".  A request message that does not parse is
 * INVALID_ARGUMENT; a malformed id INVALID_ARGUMENT; an unknown id
 * NOT_FOUND.  The request's message is unpacked into the worker's arena
 * (cx->alloc), so nothing unpacked is freed here.
 */
#include "handlers.h"

#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobs.h"
#include "log.h"
#include "version.h"
#include "wire.h"

/* ---------------------------------------------------------- call status */

static void fail_status(call_ctx *cx, int status, int topos_code,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_status(call_ctx *cx, int status, int topos_code,
                        const char *fmt, ...) {
  if (cx->status != WIRE_GRPC_OK) return; /* the first failure wins */
  cx->status = status;
  cx->topos_code = topos_code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cx->message, sizeof cx->message, fmt, ap);
  va_end(ap);
}

/* An engine error: its code picks the status, its message is the text. */
static void fail_err(call_ctx *cx, const topos_error *err, const char *what) {
  int code = err->code;
  /* A run stopped by call_should_stop: report why (deadline, cancel,
   * drain) rather than the engine's generic "cancelled". */
  if ((code == TOPOS_ERR_CANCELLED || code == TOPOS_ERR_DEADLINE) &&
      !call_continue(cx))
    return;
  if (code == TOPOS_OK) {
    fail_status(cx, WIRE_GRPC_INTERNAL, 0, "%s failed without a message", what);
    return;
  }
  fail_status(cx, wire_grpc_status_of(code), code, "%s",
              err->message[0] ? err->message : topos_status_name(code));
}

bool call_should_stop(void *ctx) {
  call_ctx *cx = ctx;
  return atomic_load(&cx->d->cancel_all) ||
         daemon_now_ns() >= cx->deadline_ns ||
         (cx->cancelled != NULL && atomic_load(cx->cancelled));
}

/* The context a call's engine runs get: the plan's entry (numerics,
 * threads; the defaults without a plan), stopped at a node boundary by
 * call_should_stop (client cancel, deadline, drain). */
static topos_exec call_exec(call_ctx *cx, const topos_plan *plan) {
  topos_exec e = topos_plan_exec(plan);
  e.cancel = call_should_stop;
  e.cancel_ctx = cx;
  return e;
}

bool call_continue(call_ctx *cx) {
  if (cx->status != WIRE_GRPC_OK) return false;
  if (atomic_load(&cx->d->cancel_all)) {
    fail_status(cx, WIRE_GRPC_UNAVAILABLE, 0,
                "toposd is shutting down; the call was cancelled");
    return false;
  }
  bool expired = daemon_now_ns() >= cx->deadline_ns;
  if (expired) {
    fail_status(cx, WIRE_GRPC_DEADLINE_EXCEEDED, 0, "deadline exceeded");
    return false;
  }
  if (cx->cancelled != NULL && atomic_load(cx->cancelled)) {
    fail_status(cx, WIRE_GRPC_CANCELLED, 0, "call cancelled by the client");
    return false;
  }
  return true;
}

/* ----------------------------------------------------- messages in, out */

static void *unpack(call_ctx *cx, const ProtobufCMessageDescriptor *desc,
                    const char *what, bool optional) {
  if (!cx->has_message && !optional) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%s: the request carries no message", what);
    return NULL;
  }
  void *m = protobuf_c_message_unpack(desc, cx->alloc, cx->in_len, cx->in);
  if (m == NULL)
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%s: malformed message (%zu bytes do not parse as %s)", what,
                cx->in_len, desc->name);
  return m;
}

static void reply(call_ctx *cx, const ProtobufCMessage *m) {
  if (cx->status != WIRE_GRPC_OK) return;
  size_t n = protobuf_c_message_get_packed_size(m);
  if ((int64_t)n > cx->d->cfg->max_message_bytes) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "the reply would be %zu bytes, over the daemon's "
                "max-message-bytes %lld",
                n, (long long)cx->d->cfg->max_message_bytes);
    return;
  }
  uint8_t *buf = malloc(n ? n : 1);
  if (buf == NULL) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory packing a %zu-byte reply", n);
    return;
  }
  protobuf_c_message_pack(m, buf);
  cx->out = buf;
  cx->out_len = n;
}

/* Request-lifetime memory (the worker's arena). */
static void *scratch(call_ctx *cx, size_t n) {
  void *p = cx->alloc->alloc(cx->alloc->allocator_data, n);
  if (p == NULL)
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory (%zu bytes)", n);
  return p;
}

/* ----------------------------------------------------- cached networks */

static void destroy_network(void *v) {
  topos_network_release(v);
}
static void destroy_plan(void *v) {
  topos_plan_free(v);
}

/* Checks an id from a request; records it for the log when valid. */
static bool check_id(call_ctx *cx, const char *id, const char *what) {
  if (id == NULL || id[0] == '\0') {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%s is missing", what);
    return false;
  }
  if (!wire_id_valid(id)) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%s '%.80s%s' is not 64 lowercase hex digits", what, id,
                strlen(id) > 80 ? "..." : "");
    return false;
  }
  return true;
}

/* The stored spec `id` as a network (borrowed until *ref is released). */
static topos_network *get_network(call_ctx *cx, const char *id,
                                  cache_entry **ref) {
  *ref = NULL;
  if (!check_id(cx, id, "id")) return NULL;
  memcpy(cx->spec_id, id, 65);
  char key[80];
  snprintf(key, sizeof key, "net %s", id);
  topos_network *net = cache_get(cx->d->cache, key, ref);
  if (net != NULL) return net;
  topos_error err = {0};
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (store_get_spec(cx->d->store, id, &bytes, &len, &err) != TOPOS_OK) {
    if (err.code == TOPOS_ERR_NOT_FOUND)
      fail_status(cx, WIRE_GRPC_NOT_FOUND, TOPOS_ERR_NOT_FOUND,
                  "no spec with id %s", id);
    else
      fail_err(cx, &err, "reading the spec");
    return NULL;
  }
  net = topos_network_decode(bytes, len, &err);
  free(bytes);
  if (net == NULL) {
    /* The store verified the hash, so this is a bug or a format change. */
    fail_status(cx, WIRE_GRPC_INTERNAL, 0, "stored spec %s does not decode: %s",
                id, err.message);
    return NULL;
  }
  return cache_put(cx->d->cache, key, net, destroy_network, (int64_t)len, ref);
}

/* The plan of `entry` over net (borrowed until *ref is released).  The
 * key holds everything a plan remembers of its entry, threads included,
 * so entries that differ only in threads get plans of their own. */
static topos_plan *get_plan(call_ctx *cx, const topos_network *net,
                            const topos_entry *entry, cache_entry **ref) {
  *ref = NULL;
  char *entry_key = wire_entry_key(entry);
  size_t klen = entry_key ? strlen(entry_key) + 80 : 0;
  char *key = entry_key ? malloc(klen) : NULL;
  if (key == NULL) {
    free(entry_key);
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory");
    return NULL;
  }
  snprintf(key, klen, "plan %s %s", cx->spec_id, entry_key);
  free(entry_key);
  topos_plan *plan = cache_get(cx->d->cache, key, ref);
  if (plan == NULL) {
    topos_error err = {0};
    plan = topos_network_lower(net, entry, &err);
    if (plan == NULL) {
      fail_err(cx, &err, "lower");
    } else {
      plan = cache_put(cx->d->cache, key, plan, destroy_plan, 0, ref);
    }
  }
  free(key);
  return plan;
}

/* ------------------------------------------------------- cached blobs */

typedef struct blob_set {
  int n;
  topos_tensor **tensors;
} blob_set;

static void destroy_blob_set(void *v) {
  blob_set *b = v;
  wire_tensor_array_free(b->tensors, b->n);
  free(b);
}

static int64_t tensor_bytes(const topos_tensor *t) {
  return topos_tensor_count(t) *
         (int64_t)topos_dtype_size(topos_tensor_dtype(t));
}

/* Caches a set of tensors under "blob <id>" (takes ownership of them). */
static blob_set *cache_blob_set(call_ctx *cx, const char *id,
                                topos_tensor **tensors, int n,
                                cache_entry **ref) {
  blob_set *b = malloc(sizeof *b);
  if (b == NULL) {
    wire_tensor_array_free(tensors, n);
    return NULL;
  }
  b->n = n;
  b->tensors = tensors;
  int64_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += tensor_bytes(tensors[i]);
  char key[80];
  snprintf(key, sizeof key, "blob %s", id);
  return cache_put(cx->d->cache, key, b, destroy_blob_set, bytes, ref);
}

/* The blob `id` decoded (borrowed until *ref is released), or NULL with
 * err filled (NOT_FOUND when the store has no such blob). */
static blob_set *get_blob(call_ctx *cx, const char *id, cache_entry **ref,
                          topos_error *err) {
  char key[80];
  snprintf(key, sizeof key, "blob %s", id);
  blob_set *b = cache_get(cx->d->cache, key, ref);
  if (b != NULL) return b;
  /* Not decoded yet: from the write-behind queue, else from the store. */
  uint8_t *bytes = NULL;
  size_t len = 0;
  blob_pending *pending = NULL;
  const uint8_t *data = blob_writer_lookup(cx->d->blobs, id, &len, &pending);
  if (data == NULL) {
    if (store_get_blob(cx->d->store, id, &bytes, &len, err) != TOPOS_OK) {
      if (err->code == TOPOS_ERR_NOT_FOUND)
        snprintf(err->message, sizeof err->message, "no blob with id %s", id);
      return NULL;
    }
    data = bytes;
  }
  Topos__V1__PutBlobRequest *m =
      topos__v1__put_blob_request__unpack(cx->alloc, len, data);
  topos_tensor **tensors = NULL;
  int rc = TOPOS_OK;
  if (m == NULL) {
    rc = TOPOS_ERR_CORRUPT;
    err->code = rc;
    snprintf(err->message, sizeof err->message, "stored blob %s does not parse",
             id);
  } else if (m->n_tensors > INT32_MAX) {
    rc = TOPOS_ERR_CORRUPT;
    err->code = rc;
    snprintf(err->message, sizeof err->message, "stored blob %s is too long",
             id);
  } else {
    rc = wire_tensor_array_from_proto(m->tensors, m->n_tensors, NULL,
                                      "blob.tensors", &tensors, err);
  }
  free(bytes);
  blob_writer_release(cx->d->blobs, pending);
  if (rc != TOPOS_OK) return NULL;
  b = cache_blob_set(cx, id, tensors, (int)m->n_tensors, ref);
  if (b == NULL) {
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "out of memory");
  }
  return b;
}

static topos_tensor *resolve_blob(void *ctx, const char *blob_id, int index,
                                  topos_error *err) {
  call_ctx *cx = ctx;
  cache_entry *ref = NULL;
  blob_set *b = get_blob(cx, blob_id, &ref, err);
  if (b == NULL) return NULL;
  topos_tensor *t = NULL;
  if (index < 0 || index >= b->n) {
    err->code = TOPOS_ERR_RANGE;
    snprintf(err->message, sizeof err->message,
             "blob %s holds %d tensors; index %d is out of range", blob_id,
             b->n, index);
  } else {
    t = topos_tensor_retain(b->tensors[index]);
  }
  cache_release(cx->d->cache, ref);
  return t;
}

/* ---------------------------------------------------------- run inputs */

/* What Forward/Backward/Step/Conformance read from a request. */
typedef struct run_inputs {
  topos_params *params; /* NULL = the spec's initials */
  topos_feed *feeds;
  int nfeeds;
} run_inputs;

static void run_inputs_clear(run_inputs *in) {
  topos_params_free(in->params);
  wire_feeds_free(in->feeds, in->nfeeds);
  memset(in, 0, sizeof *in);
}

static bool read_inputs(call_ctx *cx, const topos_network *net,
                        Topos__V1__Tensor *const *params, size_t nparams,
                        Topos__V1__Feed *const *feeds, size_t nfeeds,
                        run_inputs *out) {
  memset(out, 0, sizeof *out);
  if (nfeeds > (size_t)INT32_MAX) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "too many feeds");
    return false;
  }
  wire_resolver res = {resolve_blob, cx};
  topos_error err = {0};
  if (wire_params_from_proto(params, nparams, &res, "parameters", &out->params,
                             &err) != TOPOS_OK) {
    fail_err(cx, &err, "parameters");
    return false;
  }
  if (wire_feeds_from_proto(net, feeds, nfeeds, &res, &out->feeds, &err) !=
      TOPOS_OK) {
    fail_err(cx, &err, "feeds");
    run_inputs_clear(out);
    return false;
  }
  out->nfeeds = (int)nfeeds;
  return call_continue(cx);
}

/* n tensors of a run as new heap messages (wire_tensors_free). */
static bool tensors_of_run(call_ctx *cx, const topos_run *run,
                           const topos_value *values, int n,
                           Topos__V1__Tensor ***out, size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (n == 0) return true;
  topos_tensor **ts = calloc((size_t)n, sizeof *ts);
  if (ts == NULL) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory");
    return false;
  }
  topos_error err = {0};
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    ts[i] = (topos_tensor *)topos_run_of(run, values[i], &err);
    if (ts[i] == NULL) {
      fail_err(cx, &err, "reading a result");
      ok = false;
    }
  }
  if (ok && wire_tensors_from_array(ts, n, out, nout, &err) != TOPOS_OK) {
    fail_err(cx, &err, "encoding results");
    ok = false;
  }
  free(ts); /* borrowed from the run: nothing to release */
  return ok;
}

/* --------------------------------------------------------------- Record */

/* One line about a network: dtype, counts, parameter elements, outputs. */
static void summarize(const topos_network *net, topos_dtype dtype, char *out,
                      size_t outlen) {
  int n = topos_network_node_count(net);
  int np = topos_network_parameter_count(net);
  int64_t elements = 0;
  for (int s = 0; s < np; s++) {
    int rank = 0;
    const int64_t *shape =
        topos_network_value_shape(net, topos_network_parameter(net, s), &rank);
    int64_t c = 1;
    for (int k = 0; shape && k < rank; k++) c *= shape[k];
    elements += c;
  }
  bool *used = calloc((size_t)n + 1, sizeof(bool));
  size_t len = (size_t)snprintf(
      out, outlen,
      "%s network: %d nodes, %d parameters (%lld elements), %d "
      "inputs; outputs:",
      topos_dtype_name(dtype), n, np, (long long)elements,
      topos_network_input_count(net));
  if (used == NULL || len >= outlen) {
    free(used);
    return;
  }
  topos_node_info info;
  for (int i = 0; i < n; i++)
    if (topos_network_node(net, i, &info, NULL) == TOPOS_OK)
      for (int k = 0; k < info.nin; k++) used[info.operands[k]] = true;
  int shown = 0, outputs = 0;
  for (int i = 0; i < n; i++) {
    if (used[i]) continue;
    outputs++;
    if (shown == 8 || len + 40 >= outlen) continue;
    if (topos_network_node(net, i, &info, NULL) != TOPOS_OK) continue;
    int w = info.name ? snprintf(out + len, outlen - len, " %.32s", info.name)
                      : snprintf(out + len, outlen - len, " %%%d", i);
    if (w > 0) len += (size_t)w < outlen - len ? (size_t)w : outlen - len - 1;
    shown++;
  }
  if (outputs > shown && len + 24 < outlen)
    snprintf(out + len, outlen - len, " (+%d more)", outputs - shown);
  free(used);
}

static void handle_record(call_ctx *cx) {
  Topos__V1__Spec *spec =
      unpack(cx, &topos__v1__spec__descriptor, "Record", false);
  if (spec == NULL) return;
  topos_error err = {0};
  topos_network *net = wire_spec_to_network(spec, &err);
  if (net == NULL) {
    fail_err(cx, &err, "spec");
    return;
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  char id[65] = {0};
  if (!call_continue(cx)) {
  } else if (topos_network_encode(net, &bytes, &len, &err) != TOPOS_OK) {
    fail_err(cx, &err, "encode");
  } else if (store_put_spec(cx->d->store, bytes, len, id, &err) != TOPOS_OK) {
    fail_err(cx, &err, "store");
  }
  topos_free(bytes);
  if (cx->status != WIRE_GRPC_OK) {
    topos_network_release(net);
    return;
  }
  memcpy(cx->spec_id, id, sizeof id);
  char summary[512];
  summarize(net, (topos_dtype)spec->dtype, summary, sizeof summary);
  Topos__V1__RecordReply r = TOPOS__V1__RECORD_REPLY__INIT;
  r.id = id;
  r.nodes = topos_network_node_count(net);
  r.parameters = topos_network_parameter_count(net);
  r.inputs = topos_network_input_count(net);
  r.summary = summary;
  /* The next request on this spec will want it decoded. */
  char key[80];
  snprintf(key, sizeof key, "net %s", id);
  cache_entry *ref = NULL;
  cache_put(cx->d->cache, key, net, destroy_network, (int64_t)len, &ref);
  cache_release(cx->d->cache, ref);
  reply(cx, &r.base);
}

/* -------------------------------------------------------------- Describe */

static void handle_describe(call_ctx *cx) {
  Topos__V1__DescribeRequest *req =
      unpack(cx, &topos__v1__describe_request__descriptor, "Describe", false);
  if (req == NULL) return;
  if (req->format < TOPOS__V1__FORMAT__TEXT ||
      req->format > TOPOS__V1__FORMAT__DOT) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "format %d is not TEXT, JSON or DOT", (int)req->format);
    return;
  }
  cache_entry *ref = NULL;
  topos_network *net = get_network(cx, req->id, &ref);
  if (net == NULL) return;
  topos_error err = {0};
  char *text = topos_network_describe(net, (topos_format)req->format, &err);
  cache_release(cx->d->cache, ref);
  if (text == NULL) {
    fail_err(cx, &err, "describe");
    return;
  }
  Topos__V1__TextReply r = TOPOS__V1__TEXT_REPLY__INIT;
  r.text = text;
  reply(cx, &r.base);
  topos_free(text);
}

/* ------------------------------------------------------------ Lower, Emit */

/* The network and the plan of a request's entry; release both refs. */
typedef struct planned {
  topos_network *net;
  cache_entry *net_ref;
  wire_entry entry;
  topos_plan *plan;
  cache_entry *plan_ref;
} planned;

static void planned_clear(call_ctx *cx, planned *p) {
  cache_release(cx->d->cache, p->plan_ref);
  wire_entry_clear(&p->entry);
  cache_release(cx->d->cache, p->net_ref);
  memset(p, 0, sizeof *p);
}

static bool plan_request(call_ctx *cx, const char *id,
                         const Topos__V1__Entry *entry, planned *p) {
  memset(p, 0, sizeof *p);
  p->net = get_network(cx, id, &p->net_ref);
  if (p->net == NULL) return false;
  topos_error err = {0};
  if (wire_entry_from_proto(p->net, entry, &p->entry, &err) != TOPOS_OK) {
    fail_err(cx, &err, "entry");
    planned_clear(cx, p);
    return false;
  }
  p->plan = get_plan(cx, p->net, &p->entry.entry, &p->plan_ref);
  if (p->plan == NULL || !call_continue(cx)) {
    planned_clear(cx, p);
    return false;
  }
  return true;
}

static void handle_lower(call_ctx *cx) {
  Topos__V1__LowerRequest *req =
      unpack(cx, &topos__v1__lower_request__descriptor, "Lower", false);
  planned p;
  if (req == NULL || !plan_request(cx, req->id, req->entry, &p)) return;
  topos_error err = {0};
  char *text = topos_plan_describe(p.plan, &err);
  if (text == NULL) {
    fail_err(cx, &err, "plan describe");
  } else {
    Topos__V1__LowerReply r = TOPOS__V1__LOWER_REPLY__INIT;
    r.text = text;
    r.peak_bytes = (int64_t)topos_plan_peak_bytes(p.plan);
    r.groups = topos_plan_group_count(p.plan);
    reply(cx, &r.base);
    topos_free(text);
  }
  planned_clear(cx, &p);
}

static void handle_emit(call_ctx *cx) {
  Topos__V1__EmitRequest *req =
      unpack(cx, &topos__v1__emit_request__descriptor, "Emit", false);
  if (req == NULL) return;
  if (req->form != TOPOS__V1__FORM__PRETTY &&
      req->form != TOPOS__V1__FORM__GENERIC) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "form %d is not PRETTY or GENERIC", (int)req->form);
    return;
  }
  planned p;
  if (!plan_request(cx, req->id, req->entry, &p)) return;
  topos_error err = {0};
  char *text = topos_plan_emit_stablehlo(p.plan,
                                         req->form == TOPOS__V1__FORM__GENERIC
                                             ? TOPOS_EMIT_GENERIC
                                             : TOPOS_EMIT_PRETTY,
                                         &err);
  if (text == NULL) {
    fail_err(cx, &err, "emit");
  } else {
    Topos__V1__TextReply r = TOPOS__V1__TEXT_REPLY__INIT;
    r.text = text;
    reply(cx, &r.base);
    topos_free(text);
  }
  planned_clear(cx, &p);
}

/* --------------------------------------------------------------- Forward */

static void handle_forward(call_ctx *cx) {
  Topos__V1__ForwardRequest *req =
      unpack(cx, &topos__v1__forward_request__descriptor, "Forward", false);
  planned p;
  if (req == NULL || !plan_request(cx, req->id, req->entry, &p)) return;
  run_inputs in;
  if (read_inputs(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                  req->n_feeds, &in)) {
    topos_error err = {0};
    topos_exec ex = call_exec(cx, p.plan);
    topos_run *run =
        topos_plan_forward(p.plan, in.params, in.feeds, in.nfeeds, &ex, &err);
    if (run == NULL) fail_err(cx, &err, "forward");
    Topos__V1__ForwardReply r = TOPOS__V1__FORWARD_REPLY__INIT;
    const topos_entry *e = &p.entry.entry;
    if (run != NULL && call_continue(cx) &&
        tensors_of_run(cx, run, e->roots, e->nroots, &r.roots, &r.n_roots) &&
        tensors_of_run(cx, run, e->observes, e->nobserves, &r.observes,
                       &r.n_observes))
      reply(cx, &r.base);
    wire_tensors_free(r.roots, r.n_roots);
    wire_tensors_free(r.observes, r.n_observes);
    topos_run_free(run);
    run_inputs_clear(&in);
  }
  planned_clear(cx, &p);
}

/* ------------------------------------------------------- Backward, Step */

/* A training plan of (loss; observes) for Backward and Step. */
static bool plan_training(call_ctx *cx, const char *id,
                          const Topos__V1__Value *loss,
                          Topos__V1__Value *const *observes, size_t nobserves,
                          planned *p) {
  memset(p, 0, sizeof *p);
  p->net = get_network(cx, id, &p->net_ref);
  if (p->net == NULL) return false;
  if (nobserves > 4096) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%zu observes (at most 4096)", nobserves);
    planned_clear(cx, p);
    return false;
  }
  p->entry.values = calloc(nobserves + 1, sizeof(topos_value));
  if (p->entry.values == NULL) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory");
    planned_clear(cx, p);
    return false;
  }
  topos_error err = {0};
  if (wire_value_resolve(p->net, loss, "loss", &p->entry.values[0], &err) !=
      TOPOS_OK) {
    fail_err(cx, &err, "loss");
    planned_clear(cx, p);
    return false;
  }
  for (size_t i = 0; i < nobserves; i++) {
    char what[32];
    snprintf(what, sizeof what, "observes[%zu]", i);
    if (wire_value_resolve(p->net, observes[i], what, &p->entry.values[i + 1],
                           &err) != TOPOS_OK) {
      fail_err(cx, &err, what);
      planned_clear(cx, p);
      return false;
    }
  }
  topos_entry *e = &p->entry.entry;
  e->roots = p->entry.values;
  e->nroots = 1;
  e->observes = p->entry.values + 1;
  e->nobserves = (int)nobserves;
  e->posture = TOPOS_POSTURE_TRAINING;
  e->numerics = TOPOS_NUMERICS_EXACT;
  p->plan = get_plan(cx, p->net, e, &p->plan_ref);
  if (p->plan == NULL || !call_continue(cx)) {
    planned_clear(cx, p);
    return false;
  }
  return true;
}

/* Forward and backward of a training plan: the run, the loss and the
 * gradients in slot order (new). */
typedef struct trained {
  topos_run *run;
  topos_params *grads;
  double loss;
} trained;

static void trained_clear(trained *t) {
  topos_params_free(t->grads);
  topos_run_free(t->run);
  memset(t, 0, sizeof *t);
}

static bool train_pass(call_ctx *cx, const planned *p, const run_inputs *in,
                       trained *t) {
  memset(t, 0, sizeof *t);
  topos_error err = {0};
  topos_exec ex = call_exec(cx, p->plan);
  t->run =
      topos_plan_forward(p->plan, in->params, in->feeds, in->nfeeds, &ex, &err);
  if (t->run == NULL) {
    fail_err(cx, &err, "forward");
    return false;
  }
  if (!call_continue(cx)) return false;
  t->loss = topos_run_scalar(t->run, p->entry.entry.roots[0], &err);
  if (err.code != TOPOS_OK) {
    fail_err(cx, &err, "loss");
    return false;
  }
  /* The parameters' gradients only (topos_plan_gradients skips the
   * branches that reach no parameter; same bits). */
  t->grads = topos_plan_gradients(p->plan, t->run, &ex, &err);
  if (t->grads == NULL) {
    fail_err(cx, &err, "backward");
    return false;
  }
  return true;
}

static void handle_backward(call_ctx *cx) {
  Topos__V1__BackwardRequest *req =
      unpack(cx, &topos__v1__backward_request__descriptor, "Backward", false);
  planned p;
  if (req == NULL || !plan_training(cx, req->id, req->loss, NULL, 0, &p))
    return;
  run_inputs in;
  if (read_inputs(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                  req->n_feeds, &in)) {
    trained t;
    Topos__V1__BackwardReply r = TOPOS__V1__BACKWARD_REPLY__INIT;
    topos_error err = {0};
    if (train_pass(cx, &p, &in, &t)) {
      r.loss = t.loss;
      if (wire_tensors_from_params(t.grads, &r.gradients, &r.n_gradients,
                                   &err) != TOPOS_OK)
        fail_err(cx, &err, "encoding gradients");
      else
        reply(cx, &r.base);
    }
    wire_tensors_free(r.gradients, r.n_gradients);
    trained_clear(&t);
    run_inputs_clear(&in);
  }
  planned_clear(cx, &p);
}

static void handle_step(call_ctx *cx) {
  Topos__V1__StepRequest *req =
      unpack(cx, &topos__v1__step_request__descriptor, "Step", false);
  planned p;
  if (req == NULL || !plan_training(cx, req->id, req->loss, req->observes,
                                    req->n_observes, &p))
    return;
  wire_optimizer opt;
  topos_error err = {0};
  if (wire_optimizer_from_proto(req->optimizer, &opt, &err) != TOPOS_OK) {
    fail_err(cx, &err, "optimizer");
    planned_clear(cx, &p);
    return;
  }
  run_inputs in;
  if (!read_inputs(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                   req->n_feeds, &in)) {
    planned_clear(cx, &p);
    wire_optimizer_clear(&opt);
    return;
  }
  /* The optimizer needs the parameters themselves: empty = initials. */
  if (in.params == NULL) {
    in.params = topos_network_parameters(p.net);
    if (in.params == NULL)
      fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                  "out of memory copying the initial parameters");
  }
  wire_resolver res = {resolve_blob, cx};
  topos_opt_state *state = NULL;
  if (cx->status == WIRE_GRPC_OK &&
      wire_state_from_proto(req->state, &res, &state, &err) != TOPOS_OK)
    fail_err(cx, &err, "state");
  if (cx->status == WIRE_GRPC_OK && state == NULL) {
    state = topos_opt_state_new(&opt.opt, in.params, &err);
    if (state == NULL) fail_err(cx, &err, "state");
  }
  trained t = {0};
  topos_params *next = NULL;
  topos_opt_state *next_state = NULL;
  Topos__V1__StepReply r = TOPOS__V1__STEP_REPLY__INIT;
  if (cx->status == WIRE_GRPC_OK && train_pass(cx, &p, &in, &t)) {
    if (topos_optimizer_step(&opt.opt, in.params, t.grads, state, &next,
                             &next_state, &err) != TOPOS_OK) {
      fail_err(cx, &err, "optimizer step");
    } else if (call_continue(cx)) {
      r.loss = t.loss;
      const topos_entry *e = &p.entry.entry;
      if (wire_tensors_from_params(next, &r.parameters, &r.n_parameters,
                                   &err) != TOPOS_OK) {
        fail_err(cx, &err, "encoding parameters");
      } else if ((r.state = wire_state_new(next_state, &err)) == NULL) {
        fail_err(cx, &err, "encoding the state");
      } else if (tensors_of_run(cx, t.run, e->observes, e->nobserves,
                                &r.observes, &r.n_observes)) {
        reply(cx, &r.base);
      }
    }
  }
  wire_tensors_free(r.parameters, r.n_parameters);
  wire_tensors_free(r.observes, r.n_observes);
  if (r.state) wire_message_free(&r.state->base);
  topos_params_free(next);
  topos_opt_state_free(next_state);
  topos_opt_state_free(state);
  trained_clear(&t);
  run_inputs_clear(&in);
  planned_clear(cx, &p);
  wire_optimizer_clear(&opt);
}

/* ----------------------------------------------------------- Conformance */

/* Distance between two finite or non-finite numbers in units in the last
 * place of the dtype: equal bits (and NaN vs NaN) are 0, one NaN is inf. */
static double ulp_distance(topos_dtype dtype, double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : INFINITY;
  if (a == b) return 0;
  if (dtype == TOPOS_I32) return fabs(a - b);
  int64_t ia, ib;
  if (dtype == TOPOS_F64) {
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    ia = ia < 0 ? INT64_MIN - ia : ia;
    ib = ib < 0 ? INT64_MIN - ib : ib;
    double d = (double)ia - (double)ib;
    return fabs(d);
  }
  float fa = (float)a, fb = (float)b;
  int32_t xa, xb;
  memcpy(&xa, &fa, 4);
  memcpy(&xb, &fb, 4);
  int64_t oa = xa < 0 ? (int64_t)INT32_MIN - xa : xa;
  int64_t ob = xb < 0 ? (int64_t)INT32_MIN - xb : xb;
  double d = fabs((double)(oa - ob));
  /* bf16 values are f32 values with 16 zero low bits: count bf16 steps. */
  return dtype == TOPOS_BF16 ? d / 65536.0 : d;
}

/* Compares two tensors element by element into the running maxima. */
static bool compare_tensors(const topos_tensor *ref, const topos_tensor *got,
                            double *max_ulp, double *max_rel, char *note,
                            size_t notelen) {
  if (topos_tensor_dtype(ref) != topos_tensor_dtype(got) ||
      topos_tensor_rank(ref) != topos_tensor_rank(got) ||
      topos_tensor_count(ref) != topos_tensor_count(got)) {
    snprintf(note, notelen, "dtype or shape differs from the interpreter");
    *max_ulp = INFINITY;
    *max_rel = INFINITY;
    return false;
  }
  if (topos_tensor_bitwise_equal(ref, got)) return true;
  topos_dtype dt = topos_tensor_dtype(ref);
  int rank = topos_tensor_rank(ref);
  const int64_t *shape = topos_tensor_shape(ref);
  int64_t n = topos_tensor_count(ref);
  int64_t index[TOPOS_MAX_RANK] = {0};
  topos_error err = {0};
  for (int64_t i = 0; i < n; i++) {
    double a = topos_tensor_get(ref, index, &err);
    double b = topos_tensor_get(got, index, &err);
    double u = ulp_distance(dt, a, b);
    if (u > *max_ulp) *max_ulp = u;
    double scale = fmax(fabs(a), fabs(b));
    double rel = u == 0 ? 0 : (scale > 0 ? fabs(a - b) / scale : INFINITY);
    if (isnan(rel)) rel = INFINITY;
    if (rel > *max_rel) *max_rel = rel;
    for (int k = rank - 1; k >= 0; k--) {
      if (++index[k] < shape[k]) break;
      index[k] = 0;
    }
  }
  return false;
}

typedef struct backend_row {
  const char *name;
  const char *note;
  bool identical;
  double max_ulp, max_rel;
  char text[256];
} backend_row;

/* Lowers `lowered`, runs it over the request and compares the roots and
 * observes of `entry` and (in training) the parameter gradients with the
 * interpreter's. */
static void conform_plan(call_ctx *cx, const topos_network *net,
                         const topos_entry *lowered, const topos_entry *entry,
                         const run_inputs *in, const topos_run *ref_run,
                         const topos_params *ref_grad, backend_row *row) {
  row->identical = true;
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(net, lowered, &err);
  topos_run *run =
      plan ? topos_plan_forward(plan, in->params, in->feeds, in->nfeeds, NULL, &err)
           : NULL;
  topos_field *field = NULL;
  topos_params *grads = NULL;
  if (run != NULL && ref_grad != NULL) {
    field = topos_plan_backward(plan, run, NULL, &err);
    grads = field ? topos_parameters_of(field, &err) : NULL;
  }
  if (run == NULL || (ref_grad != NULL && grads == NULL)) {
    row->identical = false;
    row->max_ulp = row->max_rel = INFINITY;
    snprintf(row->text, sizeof row->text, "failed: %.200s", err.message);
  } else {
    int groups = topos_plan_group_count(plan);
    int n = entry->nroots + entry->nobserves;
    for (int i = 0; i < n; i++) {
      topos_value v = i < entry->nroots ? entry->roots[i]
                                        : entry->observes[i - entry->nroots];
      const topos_tensor *a = topos_run_of(ref_run, v, &err);
      const topos_tensor *b = topos_run_of(run, v, &err);
      if (a == NULL || b == NULL) {
        row->identical = false;
        row->max_ulp = row->max_rel = INFINITY;
        snprintf(row->text, sizeof row->text, "value %d unreadable: %.200s",
                 v.index, err.message);
        break;
      }
      if (!compare_tensors(a, b, &row->max_ulp, &row->max_rel, row->text,
                           sizeof row->text))
        row->identical = false;
    }
    for (int s = 0; ref_grad && s < topos_params_count(ref_grad); s++) {
      if (!compare_tensors(topos_params_get(ref_grad, s),
                           topos_params_get(grads, s), &row->max_ulp,
                           &row->max_rel, row->text, sizeof row->text))
        row->identical = false;
    }
    if (row->text[0] == '\0')
      snprintf(row->text, sizeof row->text, "%d fused groups%s%s", groups,
               ref_grad ? "; gradients compared" : "",
               row->note ? row->note : "");
  }
  topos_params_free(grads);
  topos_field_free(field);
  topos_run_free(run);
  topos_plan_free(plan);
  (void)cx;
}

static void handle_conformance(call_ctx *cx) {
  Topos__V1__ConformanceRequest *req = unpack(
      cx, &topos__v1__conformance_request__descriptor, "Conformance", false);
  if (req == NULL) return;
  cache_entry *net_ref = NULL;
  topos_network *net = get_network(cx, req->id, &net_ref);
  if (net == NULL) return;
  topos_error err = {0};
  wire_entry we;
  if (wire_entry_from_proto(net, req->entry, &we, &err) != TOPOS_OK) {
    fail_err(cx, &err, "entry");
    cache_release(cx->d->cache, net_ref);
    return;
  }
  const topos_entry *e = &we.entry;
  run_inputs in;
  if (!read_inputs(cx, net, req->parameters, req->n_parameters, req->feeds,
                   req->n_feeds, &in)) {
    wire_entry_clear(&we);
    cache_release(cx->d->cache, net_ref);
    return;
  }
  /* The reference: the interpreter over the entry's values. */
  int nt = e->nroots + e->nobserves;
  topos_value *targets = calloc((size_t)nt, sizeof *targets);
  topos_run *ref = NULL;
  topos_field *ref_field = NULL;
  topos_params *ref_grad = NULL;
  if (targets == NULL) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory");
  } else {
    memcpy(targets, e->roots, sizeof *targets * (size_t)e->nroots);
    memcpy(targets + e->nroots, e->observes,
           sizeof *targets * (size_t)e->nobserves);
    ref = topos_forward_for(net, in.params, in.feeds, in.nfeeds, targets, nt,
                            NULL, &err);
    if (ref == NULL) fail_err(cx, &err, "interpreter");
  }
  if (ref != NULL && e->posture == TOPOS_POSTURE_TRAINING) {
    ref_field = topos_backward(ref, e->roots[0], NULL, &err);
    ref_grad = ref_field ? topos_parameters_of(ref_field, &err) : NULL;
    if (ref_grad == NULL) fail_err(cx, &err, "interpreter backward");
  }
  if (call_continue(cx)) {
    /* The entry's own plan (fusion where elected), and the same values
     * with every node observed, which keeps every buffer and so elects no
     * group: the unfused schedule. */
    backend_row rows[3];
    memset(rows, 0, sizeof rows);
    rows[0] = (backend_row){.name = "interpreter", .identical = true};
    snprintf(rows[0].text, sizeof rows[0].text, "reference");
    rows[1].name = "plan";
    rows[2].name = "plan-unfused";
    rows[2].note = "; every node kept";
    conform_plan(cx, net, e, e, &in, ref, ref_grad, &rows[1]);
    int n = topos_network_node_count(net);
    topos_value *all =
        call_continue(cx)
            ? calloc((size_t)n + (size_t)e->nobserves, sizeof *all)
            : NULL;
    if (all != NULL) {
      memcpy(all, e->observes, sizeof *all * (size_t)e->nobserves);
      int na = e->nobserves;
      topos_value base = e->roots[0];
      for (int i = 0; i < n; i++) {
        topos_value v = base;
        v.index = i;
        all[na++] = v;
      }
      topos_entry unfused = *e;
      unfused.observes = all;
      unfused.nobserves = na;
      conform_plan(cx, net, &unfused, e, &in, ref, ref_grad, &rows[2]);
      free(all);
    }
    if (call_continue(cx)) {
      Topos__V1__BackendResult results[3];
      Topos__V1__BackendResult *ptrs[3];
      for (int i = 0; i < 3; i++) {
        topos__v1__backend_result__init(&results[i]);
        results[i].backend = (char *)rows[i].name;
        results[i].fidelity = "exact";
        results[i].bit_identical = rows[i].identical;
        results[i].max_ulp = rows[i].max_ulp;
        results[i].max_relative = rows[i].max_rel;
        results[i].note = rows[i].text;
        ptrs[i] = &results[i];
      }
      Topos__V1__ConformanceReply r = TOPOS__V1__CONFORMANCE_REPLY__INIT;
      r.n_results = 3;
      r.results = ptrs;
      reply(cx, &r.base);
    }
  }
  topos_params_free(ref_grad);
  topos_field_free(ref_field);
  topos_run_free(ref);
  free(targets);
  run_inputs_clear(&in);
  wire_entry_clear(&we);
  cache_release(cx->d->cache, net_ref);
}

/* ------------------------------------------------------- PutBlob, StatBlob */

/*
 * A blob is a PutBlobRequest re-packed canonically: each tensor as dtype,
 * shape and data only, in order, packed by protobuf-c (fields in number
 * order, packed shapes, nothing unknown).  Its id is the SHA-256 of those
 * bytes, so the same tensors give the same id whichever client encoded
 * them, and the daemon decodes a stored blob with the same message.
 *
 * Speed (a 100 MB upload; SHA-256 runs at ~1.1 GB/s here, a warm copy at
 * ~6 GB/s): the hash is the largest cost, so for a large request it
 * starts at once on a helper thread over the bytes as received, while
 * this thread unpacks, validates and packs the canonical form into a
 * reused buffer, comparing it with the received bytes as it goes.  A
 * client that sent the canonical form (protobuf-c does; so do the other
 * protobuf libraries for these messages) gets the helper's hash; any
 * other encoding is hashed again from the packed bytes.  The blob then
 * goes to the write-behind (blobs.h); its tensors are decoded on first
 * use.
 */
#define PARALLEL_HASH_BYTES ((size_t)4 << 20)

typedef struct parallel_hash {
  pthread_t thread;
  bool started, ok;
  const uint8_t *bytes;
  size_t len;
  unsigned char md[32];
} parallel_hash;

static bool sha256(const void *bytes, size_t len, unsigned char md[32]) {
  unsigned int mdlen = 0;
  return EVP_Digest(bytes, len, md, &mdlen, EVP_sha256(), NULL) && mdlen == 32;
}

static void *parallel_hash_main(void *arg) {
  parallel_hash *h = arg;
  h->ok = sha256(h->bytes, h->len, h->md);
  return NULL;
}

static void parallel_hash_join(parallel_hash *h) {
  if (h->started) pthread_join(h->thread, NULL);
  h->started = false;
}

typedef struct canonical_buffer {
  ProtobufCBuffer base;
  uint8_t *out;
  size_t len;
  const uint8_t *received; /* compared with what is packed, when set */
  size_t received_len;
  bool same; /* so far, what is packed equals what was received */
} canonical_buffer;

static void canonical_append(ProtobufCBuffer *buffer, size_t len,
                             const uint8_t *data) {
  canonical_buffer *c = (canonical_buffer *)buffer;
  if (c->same && (c->received == NULL || c->len + len > c->received_len ||
                  memcmp(c->received + c->len, data, len) != 0))
    c->same = false;
  memcpy(c->out + c->len, data, len);
  c->len += len;
}

static void put_blob(call_ctx *cx, parallel_hash *ph) {
  Topos__V1__PutBlobRequest *req =
      unpack(cx, &topos__v1__put_blob_request__descriptor, "PutBlob", false);
  if (req == NULL) return;
  if (req->n_tensors > (size_t)INT32_MAX) {
    fail_status(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "too many tensors");
    return;
  }
  /* Validate every tensor as the engine would take it (one at a time, so
   * the engine's pool recycles one buffer). */
  topos_error err = {0};
  int n = (int)req->n_tensors;
  for (int i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "tensors[%d]", i);
    topos_tensor *t = wire_tensor_from_proto(req->tensors[i], NULL, what, &err);
    if (t == NULL) {
      fail_err(cx, &err, what);
      return;
    }
    topos_tensor_release(t);
  }
  if (!call_continue(cx)) return;
  Topos__V1__Tensor *canon = n ? scratch(cx, sizeof *canon * (size_t)n) : NULL;
  Topos__V1__Tensor **ptrs = n ? scratch(cx, sizeof *ptrs * (size_t)n) : NULL;
  if (n && (canon == NULL || ptrs == NULL)) return;
  for (int i = 0; i < n; i++) {
    topos__v1__tensor__init(&canon[i]);
    canon[i].dtype = req->tensors[i]->dtype;
    canon[i].n_shape = req->tensors[i]->n_shape;
    canon[i].shape = req->tensors[i]->shape;
    canon[i].data = req->tensors[i]->data;
    ptrs[i] = &canon[i];
  }
  Topos__V1__PutBlobRequest blob = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  blob.n_tensors = (size_t)n;
  blob.tensors = ptrs;
  size_t len = topos__v1__put_blob_request__get_packed_size(&blob);
  if ((int64_t)len > cx->d->cfg->blob_cap_bytes) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "a blob of %zu bytes is larger than the daemon's blob cap "
                "(%lld bytes)",
                len, (long long)cx->d->cfg->blob_cap_bytes);
    return;
  }
  size_t cap = 0;
  canonical_buffer c = {{canonical_append},
                        blob_writer_buffer(cx->d->blobs, len, &cap),
                        0,
                        ph->started ? cx->in : NULL,
                        cx->in_len,
                        true};
  if (c.out == NULL) {
    fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory for a %zu-byte blob", len);
    return;
  }
  topos__v1__put_blob_request__pack_to_buffer(&blob, &c.base);
  if (c.len != len) {
    free(c.out);
    fail_status(cx, WIRE_GRPC_INTERNAL, 0, "blob packed to %zu of %zu bytes",
                c.len, len);
    return;
  }
  /* The received bytes were canonical: their hash is the id. */
  unsigned char md[32];
  bool hashed = false;
  if (ph->started && c.same && c.len == cx->in_len) {
    parallel_hash_join(ph);
    if (ph->ok) {
      memcpy(md, ph->md, sizeof md);
      hashed = true;
    }
  }
  if (!hashed && !sha256(c.out, len, md)) {
    free(c.out);
    fail_status(cx, WIRE_GRPC_INTERNAL, 0, "SHA-256 failed");
    return;
  }
  char id[65];
  for (int i = 0; i < 32; i++) snprintf(id + 2 * i, 3, "%02x", md[i]);
  if (blob_writer_put(cx->d->blobs, id, c.out, len, cap, &err) != TOPOS_OK) {
    if (err.code == TOPOS_ERR_MEMORY)
      fail_status(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY, "%s",
                  err.message);
    else
      fail_err(cx, &err, "store");
    return;
  }
  Topos__V1__PutBlobReply r = TOPOS__V1__PUT_BLOB_REPLY__INIT;
  r.id = id;
  r.bytes = (int64_t)len;
  reply(cx, &r.base);
}

static void handle_put_blob(call_ctx *cx) {
  parallel_hash ph = {.bytes = cx->in, .len = cx->in_len};
  if (cx->in_len >= PARALLEL_HASH_BYTES)
    ph.started = pthread_create(&ph.thread, NULL, parallel_hash_main, &ph) == 0;
  put_blob(cx, &ph);
  parallel_hash_join(&ph); /* on every path: it reads the request */
}

static void handle_stat_blob(call_ctx *cx) {
  Topos__V1__StatBlobRequest *req =
      unpack(cx, &topos__v1__stat_blob_request__descriptor, "StatBlob", false);
  if (req == NULL || !check_id(cx, req->id, "id")) return;
  topos_error err = {0};
  int64_t size = 0;
  Topos__V1__StatBlobReply r = TOPOS__V1__STAT_BLOB_REPLY__INIT;
  blob_pending *pending = NULL;
  size_t pending_len = 0;
  if (blob_writer_lookup(cx->d->blobs, req->id, &pending_len, &pending)) {
    blob_writer_release(cx->d->blobs, pending);
    r.present = true;
    r.bytes = (int64_t)pending_len;
  } else if (store_stat_blob(cx->d->store, req->id, &size, &err) == TOPOS_OK) {
    r.present = true;
    r.bytes = size;
  } else if (err.code != TOPOS_ERR_NOT_FOUND) {
    fail_err(cx, &err, "store");
    return;
  }
  reply(cx, &r.base);
}

/* ---------------------------------------------------------- Health, Stats */

static void handle_health(call_ctx *cx) {
  if (unpack(cx, &topos__v1__health_request__descriptor, "Health", true) ==
      NULL)
    return;
  Topos__V1__HealthReply r = TOPOS__V1__HEALTH_REPLY__INIT;
  r.status = atomic_load(&cx->d->draining) ? "draining" : "serving";
  r.version = TOPOSD_VERSION;
  reply(cx, &r.base);
}

static void handle_stats(call_ctx *cx) {
  if (unpack(cx, &topos__v1__stats_request__descriptor, "Stats", true) == NULL)
    return;
  daemon_state *d = cx->d;
  cache_counters cc;
  cache_stats(d->cache, &cc);
  store_stats_info si;
  topos_error err = {0};
  if (store_stats(d->store, &si, &err) != TOPOS_OK) {
    fail_err(cx, &err, "store");
    return;
  }
  Topos__V1__StatsReply r = TOPOS__V1__STATS_REPLY__INIT;
  r.workers = d->workers;
  r.queue_depth = atomic_load(&d->queue_depth);
  r.queue_capacity = d->queue_capacity;
  r.requests = atomic_load(&d->requests);
  r.errors = atomic_load(&d->errors);
  r.cache_entries = cc.entries;
  r.cache_hits = cc.hits;
  r.cache_misses = cc.misses;
  r.specs = si.spec_count;
  r.spec_bytes = si.spec_bytes;
  r.blobs = si.blob_count;
  r.blob_bytes = si.blob_bytes;
  reply(cx, &r.base);
}

/* ------------------------------------------------------------ the table */

#define METHOD(name, fn) \
  { name, "/topos.v1.Topos/" name, fn }

const method_def handler_methods[] = {
    METHOD("Record", handle_record),
    METHOD("Describe", handle_describe),
    METHOD("Lower", handle_lower),
    METHOD("Emit", handle_emit),
    METHOD("Forward", handle_forward),
    METHOD("Backward", handle_backward),
    METHOD("Step", handle_step),
    METHOD("Conformance", handle_conformance),
    METHOD("PutBlob", handle_put_blob),
    METHOD("StatBlob", handle_stat_blob),
    METHOD("Health", handle_health),
    METHOD("Stats", handle_stats),
};

const int handler_method_count =
    (int)(sizeof handler_methods / sizeof handler_methods[0]);
