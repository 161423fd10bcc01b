/*
 * runs.c - the run resource: Forward, Backward and Step run the spec's
 * plan for the request's entry (plans are bit-identical to the reference
 * interpreter, docs/numerics.md), on the request's parameters (empty =
 * the spec's initials), feeds and optimizer state, under the request's
 * execution options (ExecOptions; absent: the entry's, or exact/auto), so
 * a remote Step is exactly topos_plan_step in-process.  Replies name the
 * backends that ran.  Blob references in any of them are looked up first
 * (blob_rpc.c), then converted by wire.c.
 *
 * Every run is admitted first (admission.h): once the plan is known and
 * before the request's tensors are decoded, its peak bytes - the plan's
 * bounds, the tensors decoded from the request, the tensors encoded
 * into the reply - are reserved against the run and global budgets, and
 * given back when the handler is done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "rooms.h"

/* ---------------------------------------------------------- run inputs */

void run_inputs_clear(run_inputs *in) {
  topos_params_free(in->params);
  wire_feeds_free(in->feeds, in->nfeeds);
  memset(in, 0, sizeof *in);
}

bool run_inputs_read(call_ctx *cx, const topos_network *net,
                     Topos__V1__Tensor *const *params, size_t nparams,
                     Topos__V1__Feed *const *feeds, size_t nfeeds,
                     run_inputs *out) {
  memset(out, 0, sizeof *out);
  if (nfeeds > (size_t)INT32_MAX) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "too many feeds");
    return false;
  }
  /* Blob references first, in the order the conversions read them. */
  blob_refs refs = {0};
  bool ok = blob_refs_add(cx, &refs, params, nparams);
  for (size_t i = 0; ok && feeds != NULL && i < nfeeds; i++)
    if (feeds[i] != NULL) ok = blob_refs_add(cx, &refs, &feeds[i]->tensor, 1);
  const wire_blobs *blobs = blob_refs_table(&refs);
  topos_error err = {0};
  if (ok && wire_params_from_proto(params, nparams, blobs, "parameters",
                                   &out->params, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "parameters");
    ok = false;
  }
  if (ok && wire_feeds_from_proto(net, feeds, nfeeds, blobs, &out->feeds,
                                  &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "feeds");
    run_inputs_clear(out);
    ok = false;
  }
  /* The converted tensors hold references of their own. */
  blob_refs_clear(cx, &refs);
  if (!ok) return false;
  out->nfeeds = (int)nfeeds;
  return call_continue(cx);
}

/* The request's optimizer state (NULL when absent: the caller makes a
 * fresh one), its blob references looked up first. */
static bool read_state(call_ctx *cx, const Topos__V1__OptimizerState *m,
                       topos_opt_state **out) {
  *out = NULL;
  blob_refs refs = {0};
  bool ok = m == NULL || (blob_refs_add(cx, &refs, m->m, m->n_m) &&
                          blob_refs_add(cx, &refs, m->v, m->n_v));
  topos_error err = {0};
  if (ok &&
      wire_state_from_proto(m, blob_refs_table(&refs), out, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "state");
    ok = false;
  }
  blob_refs_clear(cx, &refs);
  return ok;
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
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
    return false;
  }
  topos_error err = {0};
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    ts[i] = (topos_tensor *)topos_run_of(run, values[i], &err);
    if (ts[i] == NULL) {
      call_fail_err(cx, &err, "reading a result");
      ok = false;
    }
  }
  if (ok && wire_tensors_from_array(ts, n, out, nout, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "encoding results");
    ok = false;
  }
  free(ts); /* borrowed from the run: nothing to release */
  return ok;
}

/* ------------------------------------------------------------ admission */

/* The request's parameters and feeds decoded (0 when it sends none: the
 * spec's own tensors are used in place). */
static size_t decoded_inputs(const topos_network *net, const topos_run_bytes *b,
                             size_t nparams, size_t nfeeds) {
  size_t need = 0;
  if (nparams > 0)
    need += admission_decoded(b->parameters,
                              (size_t)topos_network_parameter_count(net));
  if (nfeeds > 0)
    need +=
        admission_decoded(b->inputs, (size_t)topos_network_input_count(net));
  return need;
}

/* Forward: the plan's run, the inputs, the roots and observes encoded. */
static bool admit_forward(call_ctx *cx, const planned *p, size_t nparams,
                          size_t nfeeds, admission *adm) {
  topos_run_bytes b;
  topos_plan_run_bytes(p->plan, &b);
  const topos_entry *e = &p->entry.entry;
  size_t need =
      b.forward + decoded_inputs(p->net, &b, nparams, nfeeds) +
      admission_encoded(b.outputs, (size_t)(e->nroots + e->nobserves));
  return admission_take(cx, "Forward", need, b.outputs, adm);
}

/* --------------------------------------------------------------- Forward */

void handle_forward(call_ctx *cx) {
  Topos__V1__ForwardRequest *req = call_unpack(
      cx, &topos__v1__forward_request__descriptor, "Forward", false);
  planned p;
  if (req == NULL || !plan_request(cx, req->id, req->entry, &p)) return;
  admission adm = {0};
  run_inputs in;
  if (admit_forward(cx, &p, req->n_parameters, req->n_feeds, &adm) &&
      run_inputs_read(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                      req->n_feeds, &in)) {
    topos_error err = {0};
    topos_exec ex;
    topos_run *run = NULL;
    if (call_exec_of(cx, req->exec, p.plan, p.entry.backend, &ex)) {
      run =
          topos_plan_forward(p.plan, in.params, in.feeds, in.nfeeds, &ex, &err);
      if (run == NULL) call_fail_err(cx, &err, "forward");
    }
    Topos__V1__ForwardReply r = TOPOS__V1__FORWARD_REPLY__INIT;
    const topos_entry *e = &p.entry.entry;
    if (run != NULL && call_continue(cx) &&
        tensors_of_run(cx, run, e->roots, e->nroots, &r.roots, &r.n_roots) &&
        tensors_of_run(cx, run, e->observes, e->nobserves, &r.observes,
                       &r.n_observes) &&
        call_backends(cx, &r.backends, &r.n_backends))
      call_reply(cx, &r.base);
    wire_tensors_free(r.roots, r.n_roots);
    wire_tensors_free(r.observes, r.n_observes);
    topos_run_free(run);
    run_inputs_clear(&in);
  }
  admission_give(cx, &adm);
  planned_clear(cx, &p);
}

/* ------------------------------------------------------- Backward, Step */

/* A training plan of (loss; observes) for Backward and Step. */
static bool plan_training(call_ctx *cx, const char *id,
                          const Topos__V1__Value *loss,
                          Topos__V1__Value *const *observes, size_t nobserves,
                          planned *p) {
  memset(p, 0, sizeof *p);
  p->net = spec_network(cx, id, &p->net_ref);
  if (p->net == NULL) return false;
  if (nobserves > 4096) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%zu observes (at most 4096)", nobserves);
    planned_clear(cx, p);
    return false;
  }
  p->entry.values = calloc(nobserves + 1, sizeof(topos_value));
  if (p->entry.values == NULL) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
    planned_clear(cx, p);
    return false;
  }
  topos_error err = {0};
  if (wire_value_resolve(p->net, loss, "loss", &p->entry.values[0], &err) !=
      TOPOS_OK) {
    call_fail_err(cx, &err, "loss");
    planned_clear(cx, p);
    return false;
  }
  for (size_t i = 0; i < nobserves; i++) {
    char what[32];
    snprintf(what, sizeof what, "observes[%zu]", i);
    if (wire_value_resolve(p->net, observes[i], what, &p->entry.values[i + 1],
                           &err) != TOPOS_OK) {
      call_fail_err(cx, &err, what);
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
  p->plan = spec_plan(cx, p->net, e, &p->plan_ref);
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
                       const topos_exec *ex, trained *t) {
  memset(t, 0, sizeof *t);
  topos_error err = {0};
  t->run =
      topos_plan_forward(p->plan, in->params, in->feeds, in->nfeeds, ex, &err);
  if (t->run == NULL) {
    call_fail_err(cx, &err, "forward");
    return false;
  }
  if (!call_continue(cx)) return false;
  t->loss = topos_run_scalar(t->run, p->entry.entry.roots[0], &err);
  if (err.code != TOPOS_OK) {
    call_fail_err(cx, &err, "loss");
    return false;
  }
  /* The parameters' gradients only (topos_plan_gradients skips the
   * branches that reach no parameter; same bits). */
  t->grads = topos_plan_gradients(p->plan, t->run, ex, &err);
  if (t->grads == NULL) {
    call_fail_err(cx, &err, "backward");
    return false;
  }
  return true;
}

/* Backward: the forward, the gradients on top of its run, and the
 * gradients encoded. */
static bool admit_backward(call_ctx *cx, const planned *p, size_t nparams,
                           size_t nfeeds, admission *adm) {
  topos_run_bytes b;
  topos_plan_run_bytes(p->plan, &b);
  size_t run = b.retained + b.gradients;
  if (b.forward > run) run = b.forward;
  size_t need =
      run + decoded_inputs(p->net, &b, nparams, nfeeds) +
      admission_encoded(b.parameters,
                        (size_t)topos_network_parameter_count(p->net));
  return admission_take(cx, "Backward", need, b.parameters, adm);
}

void handle_backward(call_ctx *cx) {
  Topos__V1__BackwardRequest *req = call_unpack(
      cx, &topos__v1__backward_request__descriptor, "Backward", false);
  planned p;
  if (req == NULL || !plan_training(cx, req->id, req->loss, NULL, 0, &p))
    return;
  admission adm = {0};
  run_inputs in;
  if (admit_backward(cx, &p, req->n_parameters, req->n_feeds, &adm) &&
      run_inputs_read(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                      req->n_feeds, &in)) {
    trained t = {0};
    Topos__V1__BackwardReply r = TOPOS__V1__BACKWARD_REPLY__INIT;
    topos_error err = {0};
    topos_exec ex;
    if (call_exec_of(cx, req->exec, p.plan, NULL, &ex) &&
        train_pass(cx, &p, &in, &ex, &t)) {
      r.loss = t.loss;
      if (wire_tensors_from_params(t.grads, &r.gradients, &r.n_gradients,
                                   &err) != TOPOS_OK)
        call_fail_err(cx, &err, "encoding gradients");
      else if (call_backends(cx, &r.backends, &r.n_backends))
        call_reply(cx, &r.base);
    }
    wire_tensors_free(r.gradients, r.n_gradients);
    trained_clear(&t);
    run_inputs_clear(&in);
  }
  admission_give(cx, &adm);
  planned_clear(cx, &p);
}

/* Step: topos_plan_step's bound, the inputs and the state decoded, the
 * new parameters, state and observes encoded. */
static bool admit_step(call_ctx *cx, const planned *p,
                       const Topos__V1__StepRequest *req,
                       const topos_optimizer *opt, admission *adm) {
  topos_run_bytes b;
  topos_plan_run_bytes(p->plan, &b);
  int np = topos_network_parameter_count(p->net);
  size_t moments = opt->kind != TOPOS_SGD ? 2 : opt->momentum != 0 ? 1 : 0;
  size_t need = topos_plan_step_bytes(p->plan, opt, req->n_parameters > 0,
                                      req->state != NULL) +
                decoded_inputs(p->net, &b, req->n_parameters, req->n_feeds);
  if (req->state != NULL) {
    size_t sets = (req->state->n_m > 0) + (req->state->n_v > 0);
    need += admission_decoded(sets * b.moments, sets * (size_t)np);
  }
  size_t reply = b.parameters + moments * b.moments + b.outputs;
  need += admission_encoded(
      reply, (moments + 1) * (size_t)np + (size_t)p->entry.entry.nobserves);
  return admission_take(cx, "Step", need, reply, adm);
}

void handle_step(call_ctx *cx) {
  Topos__V1__StepRequest *req =
      call_unpack(cx, &topos__v1__step_request__descriptor, "Step", false);
  planned p;
  if (req == NULL || !plan_training(cx, req->id, req->loss, req->observes,
                                    req->n_observes, &p))
    return;
  wire_optimizer opt;
  topos_error err = {0};
  if (wire_optimizer_from_proto(req->optimizer,
                                topos_network_parameter_count(p.net), &opt,
                                &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "optimizer");
    planned_clear(cx, &p);
    return;
  }
  admission adm = {0};
  run_inputs in;
  if (!admit_step(cx, &p, req, &opt.opt, &adm) ||
      !run_inputs_read(cx, p.net, req->parameters, req->n_parameters,
                       req->feeds, req->n_feeds, &in)) {
    admission_give(cx, &adm);
    planned_clear(cx, &p);
    wire_optimizer_clear(&opt);
    return;
  }
  topos_opt_state *state = NULL;
  if (cx->status == WIRE_GRPC_OK) read_state(cx, req->state, &state);
  /* One engine call: forward, parameters' gradients and the optimizer
   * (empty parameters are the initials, an absent state a fresh one). */
  topos_step_result res = {0};
  topos_exec ex;
  Topos__V1__StepReply r = TOPOS__V1__STEP_REPLY__INIT;
  if (cx->status == WIRE_GRPC_OK &&
      call_exec_of(cx, req->exec, p.plan, NULL, &ex)) {
    if (topos_plan_step(p.plan, in.params, in.feeds, in.nfeeds, &opt.opt, state,
                        &ex, &res, &err) != TOPOS_OK) {
      call_fail_err(cx, &err, "step");
    } else if (call_continue(cx)) {
      r.loss = res.loss;
      const topos_entry *e = &p.entry.entry;
      if (wire_tensors_from_params(res.params, &r.parameters, &r.n_parameters,
                                   &err) != TOPOS_OK) {
        call_fail_err(cx, &err, "encoding parameters");
      } else if ((r.state = wire_state_new(res.state, &err)) == NULL) {
        call_fail_err(cx, &err, "encoding the state");
      } else if (tensors_of_run(cx, res.run, e->observes, e->nobserves,
                                &r.observes, &r.n_observes) &&
                 call_backends(cx, &r.backends, &r.n_backends)) {
        call_reply(cx, &r.base);
      }
    }
  }
  wire_tensors_free(r.parameters, r.n_parameters);
  wire_tensors_free(r.observes, r.n_observes);
  if (r.state) wire_message_free(&r.state->base);
  topos_step_result_clear(&res);
  topos_opt_state_free(state);
  run_inputs_clear(&in);
  admission_give(cx, &adm);
  planned_clear(cx, &p);
  wire_optimizer_clear(&opt);
}

/* ----------------------------------------------------------------- Train */

/* A Train stream's session (handlers.h): what Step would take from each
 * request, held between the stream's messages.  Only one message of a
 * stream runs at a time (rpc.c), so nothing here is shared. */
struct train_session {
  bool open;  /* p and opt are held (train_session_free clears them) */
  bool ready; /* the open message was taken: steps may run */
  planned p;
  wire_optimizer opt;           /* filled in place: its decay points in */
  Topos__V1__ExecOptions *exec; /* a heap copy; NULL: absent */
  topos_params *params;         /* NULL: the spec's initials */
  topos_opt_state *state;       /* NULL: a fresh state */
  int64_t steps;
  size_t moments; /* moment sets the optimizer keeps */
  char id[65];    /* the spec's, for the request log */
  admission held; /* the session's parameters and state */
};

train_session *train_session_new(void) {
  return calloc(1, sizeof(train_session));
}

void train_session_free(daemon_state *d, train_session *ts) {
  if (ts == NULL) return;
  call_ctx cx;
  memset(&cx, 0, sizeof cx);
  cx.d = d;
  if (ts->open) {
    planned_clear(&cx, &ts->p);
    wire_optimizer_clear(&ts->opt);
  }
  admission_give(&cx, &ts->held);
  if (ts->exec) protobuf_c_message_free_unpacked(&ts->exec->base, NULL);
  topos_params_free(ts->params);
  topos_opt_state_free(ts->state);
  free(ts);
}

/* The session's parameters (the spec's initials before the first step)
 * and state (a fresh one before the first step) into r (heap messages,
 * freed by train_reply_clear). */
static bool train_put_state(call_ctx *cx, const train_session *ts,
                            Topos__V1__TrainReply *r) {
  topos_error err = {0};
  topos_params *initial = NULL;
  const topos_params *params = ts->params;
  if (params == NULL) params = initial = topos_network_parameters(ts->p.net);
  topos_opt_state *fresh = NULL;
  const topos_opt_state *state = ts->state;
  if (state == NULL && params != NULL)
    state = fresh = topos_opt_state_new(&ts->opt.opt, params, &err);
  bool ok = params != NULL && state != NULL;
  if (!ok)
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
  if (ok && wire_tensors_from_params(params, &r->parameters, &r->n_parameters,
                                     &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "encoding parameters");
    ok = false;
  }
  if (ok && (r->state = wire_state_new(state, &err)) == NULL) {
    call_fail_err(cx, &err, "encoding the state");
    ok = false;
  }
  topos_params_free(initial);
  topos_opt_state_free(fresh);
  return ok;
}

static void train_reply_clear(Topos__V1__TrainReply *r) {
  wire_tensors_free(r->parameters, r->n_parameters);
  wire_tensors_free(r->observes, r->n_observes);
  if (r->state) wire_message_free(&r->state->base);
}

bool train_session_last(daemon_state *d, const train_session *ts, uint8_t **out,
                        size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (ts == NULL || !ts->ready) return false;
  call_ctx cx;
  memset(&cx, 0, sizeof cx);
  cx.d = d;
  cx.status = WIRE_GRPC_OK;
  Topos__V1__TrainReply r = TOPOS__V1__TRAIN_REPLY__INIT;
  r.steps = ts->steps;
  r.last = true;
  if (train_put_state(&cx, ts, &r)) call_reply(&cx, &r.base);
  train_reply_clear(&r);
  if (cx.status != WIRE_GRPC_OK || cx.out == NULL) {
    free(cx.out);
    return false;
  }
  *out = cx.out;
  *out_len = cx.out_len;
  return true;
}

/* The first message: the session's spec, plan, optimizer, options,
 * parameters and state, and its resident bytes reserved. */
static bool train_open(call_ctx *cx, train_session *ts,
                       const Topos__V1__StepRequest *o) {
  if (!plan_training(cx, o->id, o->loss, o->observes, o->n_observes, &ts->p))
    return false;
  ts->open = true;
  snprintf(ts->id, sizeof ts->id, "%s", o->id);
  topos_error err = {0};
  int np = topos_network_parameter_count(ts->p.net);
  if (wire_optimizer_from_proto(o->optimizer, np, &ts->opt, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "optimizer");
    planned_clear(cx, &ts->p);
    ts->open = false;
    return false;
  }
  const topos_optimizer *opt = &ts->opt.opt;
  ts->moments = opt->kind != TOPOS_SGD ? 2 : opt->momentum != 0 ? 1 : 0;
  if (o->exec != NULL) {
    /* A copy of its own: the request's memory is the message's. */
    uint8_t buf[512];
    size_t n = topos__v1__exec_options__get_packed_size(o->exec);
    if (n > sizeof buf) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "exec: %zu bytes (at most %zu)", n, sizeof buf);
      return false;
    }
    topos__v1__exec_options__pack(o->exec, buf);
    ts->exec = topos__v1__exec_options__unpack(NULL, n, buf);
    if (ts->exec == NULL) {
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory");
      return false;
    }
  }
  /* The parameters and moments the session keeps between messages, for
   * the stream's life. */
  topos_run_bytes b;
  topos_plan_run_bytes(ts->p.plan, &b);
  size_t resident = admission_decoded(b.parameters + ts->moments * b.moments,
                                      (ts->moments + 1) * (size_t)np);
  if (!admission_take(cx, "Train", resident, 0, &ts->held)) return false;
  run_inputs in;
  if (!run_inputs_read(cx, ts->p.net, o->parameters, o->n_parameters, NULL, 0,
                       &in))
    return false;
  ts->params = in.params; /* moved */
  in.params = NULL;
  run_inputs_clear(&in);
  if (!read_state(cx, o->state, &ts->state)) return false;
  /* Refused now rather than at the first step: parameters that do not fit
   * the spec, settings or a state the optimizer cannot take. */
  topos_params *initial = NULL;
  const topos_params *params = ts->params;
  if (params == NULL) params = initial = topos_network_parameters(ts->p.net);
  int rc = params == NULL ? TOPOS_ERR_MEMORY
                          : topos_network_check_params(ts->p.net, params, &err);
  if (rc == TOPOS_OK) rc = topos_optimizer_check(opt, params, ts->state, &err);
  topos_params_free(initial);
  if (rc != TOPOS_OK) {
    if (err.code == TOPOS_OK) {
      err.code = rc;
      snprintf(err.message, sizeof err.message, "out of memory");
    }
    call_fail_err(cx, &err, "Train");
    return false;
  }
  ts->ready = true;
  return true;
}

/* One step's run: topos_plan_step's bound over the session's parameters
 * and state, the feeds decoded, the observes (and with return_state the
 * parameters and state) encoded. */
static bool admit_train_step(call_ctx *cx, const train_session *ts,
                             size_t nfeeds, bool with_state, admission *adm) {
  topos_run_bytes b;
  topos_plan_run_bytes(ts->p.plan, &b);
  int np = topos_network_parameter_count(ts->p.net);
  size_t need = topos_plan_step_bytes(ts->p.plan, &ts->opt.opt, true, true) +
                decoded_inputs(ts->p.net, &b, 0, nfeeds);
  size_t reply = b.outputs;
  size_t tensors = (size_t)ts->p.entry.entry.nobserves;
  if (with_state) {
    reply += b.parameters + ts->moments * b.moments;
    tensors += (ts->moments + 1) * (size_t)np;
  }
  need += admission_encoded(reply, tensors);
  return admission_take(cx, "Train", need, reply, adm);
}

/* One step from (params, state) - the session's, or a multi-step
 * message's so far - on `feeds`: true with *params_out and *state_out new
 * and r's loss and observes set.  The session is not changed. */
static bool train_run(call_ctx *cx, const train_session *ts,
                      const topos_params *params, const topos_opt_state *state,
                      Topos__V1__Feed *const *feeds, size_t nfeeds,
                      bool with_state, Topos__V1__TrainReply *r,
                      topos_params **params_out, topos_opt_state **state_out) {
  admission adm = {0};
  run_inputs in;
  if (!admit_train_step(cx, ts, nfeeds, with_state, &adm) ||
      !run_inputs_read(cx, ts->p.net, NULL, 0, feeds, nfeeds, &in)) {
    admission_give(cx, &adm);
    return false;
  }
  bool ok = false;
  topos_error err = {0};
  topos_step_result res = {0};
  topos_exec ex;
  if (call_exec_of(cx, ts->exec, ts->p.plan, NULL, &ex)) {
    if (topos_plan_step(ts->p.plan, params, in.feeds, in.nfeeds, &ts->opt.opt,
                        state, &ex, &res, &err) != TOPOS_OK) {
      call_fail_err(cx, &err, "step");
    } else if (call_continue(cx)) {
      const topos_entry *e = &ts->p.entry.entry;
      if (tensors_of_run(cx, res.run, e->observes, e->nobserves, &r->observes,
                         &r->n_observes)) {
        *params_out = res.params;
        *state_out = res.state;
        res.params = NULL;
        res.state = NULL;
        r->loss = res.loss;
        ok = true;
      }
    }
  }
  topos_step_result_clear(&res);
  run_inputs_clear(&in);
  admission_give(cx, &adm);
  return ok;
}

/* The session moves on to (params, state), taken. */
static void train_advance(train_session *ts, topos_params *params,
                          topos_opt_state *state, int64_t steps) {
  topos_params_free(ts->params);
  topos_opt_state_free(ts->state);
  ts->params = params;
  ts->state = state;
  ts->steps += steps;
}

/* The steps of a multi-step message, in order: all of them, or none
 * (the session stays where it stood when one is refused). */
static void train_steps(call_ctx *cx, train_session *ts,
                        Topos__V1__TrainBatch *const *steps, size_t n,
                        bool with_state, Topos__V1__TrainReply *r) {
  if (n > 4096) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "Train: %zu steps in one message (at most 4096)", n);
    return;
  }
  r->losses = call_scratch(cx, n * sizeof *r->losses);
  if (r->losses == NULL) return;
  topos_params *params = NULL; /* NULL: still the session's */
  topos_opt_state *state = NULL;
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    if (steps[i] == NULL) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "Train: steps[%zu] is empty", i);
      ok = false;
      break;
    }
    bool final = i + 1 == n;
    /* Only the last step's observes are answered. */
    Topos__V1__TrainReply one = TOPOS__V1__TRAIN_REPLY__INIT;
    topos_params *next = NULL;
    topos_opt_state *next_state = NULL;
    ok =
        train_run(cx, ts, params ? params : ts->params,
                  state ? state : ts->state, steps[i]->feeds, steps[i]->n_feeds,
                  with_state && final, &one, &next, &next_state);
    if (ok) {
      topos_params_free(params);
      topos_opt_state_free(state);
      params = next;
      state = next_state;
      r->losses[i] = one.loss;
      r->loss = one.loss;
    }
    if (ok && final) {
      r->observes = one.observes;
      r->n_observes = one.n_observes;
    } else {
      train_reply_clear(&one);
    }
  }
  if (!ok) {
    topos_params_free(params);
    topos_opt_state_free(state);
    return;
  }
  r->n_losses = n;
  train_advance(ts, params, state, (int64_t)n);
}

/* One step of the session on `feeds`. */
static void train_step(call_ctx *cx, train_session *ts,
                       Topos__V1__Feed *const *feeds, size_t nfeeds,
                       bool with_state, Topos__V1__TrainReply *r) {
  topos_params *params = NULL;
  topos_opt_state *state = NULL;
  if (train_run(cx, ts, ts->params, ts->state, feeds, nfeeds, with_state, r,
                &params, &state))
    train_advance(ts, params, state, 1);
}

void handle_train(call_ctx *cx) {
  train_session *ts = cx->train;
  if (ts == NULL) {
    call_fail(cx, WIRE_GRPC_UNIMPLEMENTED, TOPOS_ERR_ARGUMENT,
              "Train is a gRPC bidirectional stream; it has no unary form");
    return;
  }
  Topos__V1__TrainRequest *req =
      call_unpack(cx, &topos__v1__train_request__descriptor, "Train", false);
  if (req == NULL) return;
  Topos__V1__Feed *const *feeds = req->feeds;
  size_t nfeeds = req->n_feeds;
  if (!ts->ready) {
    if (req->open == NULL) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "Train: the first message must open the session (`open`)");
      return;
    }
    if (nfeeds > 0) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "Train: the first message's feeds go in open.feeds");
      return;
    }
    if (!train_open(cx, ts, req->open)) return;
    feeds = req->open->feeds;
    nfeeds = req->open->n_feeds;
  } else if (req->open != NULL) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "Train: only the first message opens the session (step %lld "
              "sent `open` again)",
              (long long)ts->steps + 1);
    return;
  }
  snprintf(cx->spec_id, sizeof cx->spec_id, "%s", ts->id);
  Topos__V1__TrainReply r = TOPOS__V1__TRAIN_REPLY__INIT;
  if (req->no_step && (nfeeds > 0 || req->n_steps > 0))
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "Train: a no_step message carries no feeds or steps");
  else if (req->n_steps > 0 && nfeeds > 0)
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "Train: give one step's feeds or several steps, not both");
  else if (req->n_steps > 0)
    train_steps(cx, ts, req->steps, req->n_steps, req->return_state, &r);
  else if (!req->no_step)
    train_step(cx, ts, feeds, nfeeds, req->return_state, &r);
  r.steps = ts->steps;
  if (cx->status == WIRE_GRPC_OK &&
      (!req->return_state || train_put_state(cx, ts, &r)) &&
      call_backends(cx, &r.backends, &r.n_backends))
    call_reply(cx, &r.base);
  train_reply_clear(&r);
}
