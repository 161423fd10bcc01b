/*
 * conformance.c - Conformance: the request's entry, planned as Forward
 * plans it, run under each candidate execution context and compared with
 * the reference interpreter by the engine (topos_conformance_run): bits
 * under exact numerics, numerics.md's envelope under fast, per output.
 *
 * Candidates are the request's ExecOptions; without any, the reference
 * backend (the plan itself, fusion and all, on the reference kernels),
 * then every exact backend by name, and under an entry of fast numerics
 * also every envelope backend; an entry naming a backend makes that one
 * the only candidate.  The run is admitted first (admission.h) with the
 * plan's conformance bound: the reference interpreter's run, which frees
 * nothing, beside one candidate's at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "backend.h"
#include "rooms.h"

#define MAX_CANDIDATES 16

/* The default candidates (see above) into c; returns how many. */
static int default_candidates(call_ctx *cx, const planned *p, topos_exec *c) {
  topos_exec base = call_exec(cx, p->plan);
  int n = 0;
  if (p->entry.backend[0] != '\0') {
    c[n] = base;
    c[n++].backend = p->entry.backend;
    return n;
  }
  c[n] = base;
  c[n].numerics = TOPOS_NUMERICS_EXACT;
  c[n++].backend = "reference";
  int count = topos_backend_count();
  for (int i = 0; i < count && n < MAX_CANDIDATES; i++) {
    const topos_backend *b = topos_backend_at(i);
    if (b->named_only) continue;
    bool envelope = b->fidelity != TOPOS_FIDELITY_EXACT;
    if (envelope && base.numerics != TOPOS_NUMERICS_FAST) continue;
    c[n] = base;
    c[n].numerics = envelope ? TOPOS_NUMERICS_FAST : TOPOS_NUMERICS_EXACT;
    c[n++].backend = b->name;
  }
  return n;
}

/* The reply's BackendResult of one row, in call memory. */
static Topos__V1__BackendResult *result_of(call_ctx *cx,
                                           const topos_conformance_row *row) {
  Topos__V1__BackendResult *b = call_scratch(cx, sizeof *b);
  Topos__V1__OutputResult *o =
      call_scratch(cx, sizeof *o * (size_t)(row->noutputs + 1));
  Topos__V1__OutputResult **op =
      call_scratch(cx, sizeof *op * (size_t)(row->noutputs + 1));
  if (b == NULL || o == NULL || op == NULL) return NULL;
  topos__v1__backend_result__init(b);
  b->backend = (char *)row->backend;
  b->fidelity = (char *)row->fidelity;
  b->numerics = row->numerics == TOPOS_NUMERICS_FAST
                    ? TOPOS__V1__NUMERICS__FAST
                    : TOPOS__V1__NUMERICS__EXACT;
  b->holds = row->holds;
  b->bit_identical = row->bit_identical;
  b->max_ulp = row->max_ulp;
  b->max_relative = row->max_relative;
  b->rel_l2 = row->rel_l2;
  b->note = (char *)row->note;
  if (!call_split_names(cx, row->ran, &b->ran, &b->n_ran)) return NULL;
  for (int k = 0; k < row->noutputs; k++) {
    const topos_conformance_output *src = &row->outputs[k];
    topos__v1__output_result__init(&o[k]);
    o[k].what = (char *)src->what;
    o[k].holds = src->holds;
    o[k].bit_identical = src->bit_identical;
    o[k].max_ulp = src->max_ulp;
    o[k].max_relative = src->max_relative;
    o[k].rel_l2 = src->rel_l2;
    o[k].envelope = src->envelope;
    op[k] = &o[k];
  }
  b->n_outputs = (size_t)row->noutputs;
  b->outputs = op;
  return b;
}

void handle_conformance(call_ctx *cx) {
  Topos__V1__ConformanceRequest *req = call_unpack(
      cx, &topos__v1__conformance_request__descriptor, "Conformance", false);
  planned p;
  if (req == NULL) return;
  if (req->n_candidates > MAX_CANDIDATES) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "%zu candidates (at most %d)", req->n_candidates, MAX_CANDIDATES);
    return;
  }
  if (!plan_request(cx, req->id, req->entry, &p)) return;
  topos_exec cands[MAX_CANDIDATES];
  int n = 0;
  for (size_t i = 0; i < req->n_candidates; i++) {
    char what[48];
    snprintf(what, sizeof what, "candidates[%zu]", i);
    if (req->candidates[i] == NULL) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "%s is empty", what);
      break;
    }
    if (!call_exec_of(cx, req->candidates[i], p.plan, NULL, &cands[n])) break;
    n++;
  }
  if (req->n_candidates == 0) n = default_candidates(cx, &p, cands);
  topos_run_bytes b;
  topos_plan_run_bytes(p.plan, &b);
  size_t need = b.conformance;
  if (req->n_parameters > 0)
    need += admission_decoded(b.parameters,
                              (size_t)topos_network_parameter_count(p.net));
  if (req->n_feeds > 0)
    need +=
        admission_decoded(b.inputs, (size_t)topos_network_input_count(p.net));
  admission adm = {0};
  run_inputs in;
  if (cx->status == WIRE_GRPC_OK &&
      admission_take(cx, "Conformance", need, 0, &adm) &&
      run_inputs_read(cx, p.net, req->parameters, req->n_parameters, req->feeds,
                      req->n_feeds, &in)) {
    topos_error err = {0};
    topos_conformance *c = topos_conformance_run(p.plan, in.params, in.feeds,
                                                 in.nfeeds, cands, n, &err);
    if (c == NULL) call_fail_err(cx, &err, "conformance");
    Topos__V1__BackendResult **rows =
        c ? call_scratch(cx, sizeof *rows * (size_t)(c->nrows + 1)) : NULL;
    bool ok = rows != NULL && call_continue(cx);
    for (int i = 0; ok && i < c->nrows; i++)
      ok = (rows[i] = result_of(cx, &c->rows[i])) != NULL;
    if (ok) {
      Topos__V1__ConformanceReply r = TOPOS__V1__CONFORMANCE_REPLY__INIT;
      r.n_results = (size_t)c->nrows;
      r.results = rows;
      call_reply(cx, &r.base);
    }
    topos_conformance_free(c);
    run_inputs_clear(&in);
  }
  admission_give(cx, &adm);
  planned_clear(cx, &p);
}
