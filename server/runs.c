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
