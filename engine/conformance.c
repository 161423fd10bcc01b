/*
 * conformance.c - does a faster path keep its promise?
 *
 * topos_conformance_run (topos.h) computes the reference once, with the
 * interpreter under the `reference` backend (the executable spec: no
 * plan, no fusion, no backend), and then runs the plan under each
 * candidate context, comparing every root, observe and, for a training
 * plan, every parameter gradient.  A candidate under exact numerics
 * promised the reference's bits; one under fast promised numerics.md's
 * envelope.  Each output reports the largest ulp distance, the largest
 * elementwise relative error and the relative L2 error that the envelope
 * bounds, so a red row says by how much.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The fast-posture bound on ||got - ref||2 / ||ref||2 (numerics.md). */
static double envelope_of(topos_dtype dtype) {
  switch (dtype) {
    case TOPOS_F32:
      return 1e-5;
    case TOPOS_F64:
      return 1e-12;
    case TOPOS_BF16:
      return 1e-2;
    default:
      return 0; /* i32: equal */
  }
}

/* Distance in units in the last place of the dtype: equal values (and NaN
 * against NaN) are 0, NaN against a number is inf. */
static double ulp_distance(topos_dtype dtype, double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : INFINITY;
  if (a == b) return 0;
  if (dtype == TOPOS_I32) return fabs(a - b);
  if (dtype == TOPOS_F64) {
    int64_t ia, ib;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    /* Map the sign-magnitude bit patterns onto one ordered line. */
    ia = ia < 0 ? INT64_MIN - ia : ia;
    ib = ib < 0 ? INT64_MIN - ib : ib;
    return fabs((double)ia - (double)ib);
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

/* Compares got with ref into *o; fast chooses the envelope over bits. */
static void compare(const topos_tensor *ref, const topos_tensor *got, bool fast,
                    topos_conformance_output *o) {
  o->dtype = ref->dtype;
  o->count = topos_tensor_count(ref);
  o->envelope = fast ? envelope_of(ref->dtype) : 0;
  if (got->dtype != ref->dtype ||
      !shape_equal(got->rank, got->shape, ref->rank, ref->shape)) {
    o->max_ulp = o->max_relative = o->rel_l2 = INFINITY;
    return;
  }
  o->bit_identical = topos_tensor_bitwise_equal(ref, got);
  if (o->bit_identical) {
    o->holds = true;
    return;
  }
  bool placed = true; /* NaN and Inf where the reference has them */
  double num = 0, den = 0;
  int64_t index[TOPOS_MAX_RANK] = {0};
  for (int64_t i = 0; i < o->count; i++) {
    double a = topos_tensor_get(ref, index, NULL);
    double b = topos_tensor_get(got, index, NULL);
    double u = ulp_distance(ref->dtype, a, b);
    if (u > o->max_ulp) o->max_ulp = u;
    if (isnan(a) != isnan(b) || (isinf(a) || isinf(b) ? a != b : false))
      placed = false;
    if (isfinite(a) && isfinite(b)) {
      double scale = fmax(fabs(a), fabs(b));
      double rel = u == 0 ? 0 : fabs(a - b) / scale;
      if (rel > o->max_relative) o->max_relative = rel;
      num += (a - b) * (a - b);
      den += a * a;
    }
    for (int k = ref->rank - 1; k >= 0; k--) {
      if (++index[k] < ref->shape[k]) break;
      index[k] = 0;
    }
  }
  if (!placed) o->max_relative = INFINITY;
  o->rel_l2 = den > 0 ? sqrt(num) / sqrt(den) : (num > 0 ? INFINITY : 0);
  if (!placed) o->rel_l2 = INFINITY;
  o->holds =
      fast && ref->dtype != TOPOS_I32 && placed && o->rel_l2 <= o->envelope;
}

void topos_conformance_free(topos_conformance *c) {
  if (!c) return;
  for (int i = 0; i < c->nrows; i++) free(c->rows[i].outputs);
  free(c->rows);
  free(c);
}

/* What the plan's outputs are called: "root 0 (loss)", "gradient 1". */
static void output_name(const topos_network *net, const char *kind, int k,
                        int node, char *buf, size_t len) {
  const char *name = node >= 0 ? net->nodes[node].name : NULL;
  if (name)
    snprintf(buf, len, "%s %d (%.40s)", kind, k, name);
  else
    snprintf(buf, len, "%s %d (node %d)", kind, k, node);
}

typedef struct reference {
  topos_run *run;
  topos_params *grads; /* training plans only */
} reference;

/* One candidate: runs the plan under ctx and fills the row.  Returns 0, or
 * a status when the whole call must stop (cancelled, past its deadline,
 * out of memory). */
static int run_candidate(const topos_plan *plan, const topos_params *params,
                         const topos_feed *feeds, int nfeeds,
                         const topos_exec *ctx, const reference *ref,
                         topos_conformance_row *row, topos_error *err) {
  const topos_network *net = plan->net;
  topos_exec_report report = {0};
  topos_exec c = *ctx;
  c.report = &report;
  snprintf(row->backend, sizeof row->backend, "%s",
           ctx->backend && *ctx->backend ? ctx->backend : "auto");
  row->numerics = ctx->numerics;
  bool fast = ctx->numerics == TOPOS_NUMERICS_FAST;
  row->fidelity = fast ? "envelope" : "exact";
  int nout = plan->nroots + plan->nobserves +
             (ref->grads ? topos_params_count(ref->grads) : 0);
  row->outputs = calloc((size_t)nout + 1, sizeof *row->outputs);
  if (!row->outputs)
    return error_set(err, TOPOS_ERR_MEMORY, "conformance: out of memory");
  topos_error e = {0};
  topos_params *grads = NULL;
  topos_run *run = topos_plan_forward(plan, params, feeds, nfeeds, &c, &e);
  if (run && ref->grads) grads = topos_plan_gradients(plan, run, &c, &e);
  if (!run || (ref->grads && !grads)) {
    topos_params_free(grads);
    topos_run_free(run);
    if (e.code == TOPOS_ERR_CANCELLED || e.code == TOPOS_ERR_DEADLINE ||
        e.code == TOPOS_ERR_MEMORY)
      return error_set(err, e.code, "%s", e.message);
    snprintf(row->note, sizeof row->note, "failed: %.300s", e.message);
    row->max_ulp = row->max_relative = row->rel_l2 = INFINITY;
    return 0;
  }
  row->holds = row->bit_identical = true;
  for (int k = 0; k < nout; k++) {
    topos_conformance_output *o = &row->outputs[row->noutputs++];
    const topos_tensor *a, *b;
    if (k < plan->nroots + plan->nobserves) {
      bool root = k < plan->nroots;
      int node = root ? plan->roots[k] : plan->observes[k - plan->nroots];
      output_name(net, root ? "root" : "observe", root ? k : k - plan->nroots,
                  node, o->what, sizeof o->what);
      a = ref->run->vals[node];
      b = run->vals[node];
    } else {
      int s = k - plan->nroots - plan->nobserves;
      output_name(net, "gradient", s, net->param_nodes[s], o->what,
                  sizeof o->what);
      a = topos_params_get(ref->grads, s);
      b = topos_params_get(grads, s);
    }
    if (a && b) {
      compare(a, b, fast, o);
    } else {
      o->max_ulp = o->max_relative = o->rel_l2 = INFINITY;
    }
    row->holds &= o->holds;
    row->bit_identical &= o->bit_identical;
    row->max_ulp = fmax(row->max_ulp, o->max_ulp);
    row->max_relative = fmax(row->max_relative, o->max_relative);
    row->rel_l2 = fmax(row->rel_l2, o->rel_l2);
  }
  topos_exec_report_names(&report, row->ran, sizeof row->ran);
  if (ctx->report)
    for (int i = 0; i < TOPOS_BACKENDS_MAX; i++)
      ctx->report->tasks[i] += report.tasks[i];
  snprintf(row->note, sizeof row->note, "%d outputs, %d fused groups%s",
           row->noutputs, plan->ngroups,
           row->holds ? ""
                      : (fast ? "; outside the envelope"
                              : "; bits differ from the reference"));
  topos_params_free(grads);
  topos_run_free(run);
  return 0;
}

topos_conformance *topos_conformance_run(const topos_plan *plan,
                                         const topos_params *params,
                                         const topos_feed *feeds, int nfeeds,
                                         const topos_exec *candidates,
                                         int ncandidates, topos_error *err) {
  if (!plan) {
    error_set(err, TOPOS_ERR_ARGUMENT, "conformance: plan is NULL");
    return NULL;
  }
  if (ncandidates < 0 || (ncandidates > 0 && !candidates)) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "conformance: %d candidates with %s array", ncandidates,
              candidates ? "an" : "a NULL");
    return NULL;
  }
  for (int i = 0; i < ncandidates; i++) {
    topos_error e = {0};
    if (topos_exec_check(&candidates[i], &e)) {
      error_set(err, e.code, "conformance: candidate %d: %s", i, e.message);
      return NULL;
    }
  }
  const topos_network *net = plan->net;
  topos_conformance *c = calloc(1, sizeof *c);
  if (c) c->rows = calloc((size_t)ncandidates + 1, sizeof *c->rows);
  if (!c || !c->rows) {
    free(c);
    error_set(err, TOPOS_ERR_MEMORY, "conformance: out of memory");
    return NULL;
  }
  /* The reference: the interpreter over the plan's roots and observes,
   * no backend, stopped by the first candidate's cancel and deadline. */
  topos_exec_report ref_report = {0};
  topos_exec rctx = {.backend = "reference", .report = &ref_report};
  if (ncandidates > 0) {
    rctx.cancel = candidates[0].cancel;
    rctx.cancel_ctx = candidates[0].cancel_ctx;
    rctx.deadline_ns = candidates[0].deadline_ns;
  }
  int nt = plan->nroots + plan->nobserves;
  topos_value *targets = calloc((size_t)nt + 1, sizeof *targets);
  reference ref = {0};
  if (!targets) {
    error_set(err, TOPOS_ERR_MEMORY, "conformance: out of memory");
    goto fail;
  }
  for (int k = 0; k < nt; k++)
    targets[k] = topos_network_value(
        net,
        k < plan->nroots ? plan->roots[k] : plan->observes[k - plan->nroots]);
  ref.run =
      topos_forward_for(net, params, feeds, nfeeds, targets, nt, &rctx, err);
  if (!ref.run) goto fail;
  if (plan->posture == TOPOS_POSTURE_TRAINING) {
    ref.grads = topos_gradients(ref.run, targets[0], &rctx, err);
    if (!ref.grads) goto fail;
  }
  topos_exec_report_names(&ref_report, c->reference_ran,
                          sizeof c->reference_ran);
  for (int i = 0; i < ncandidates; i++) {
    if (run_candidate(plan, params, feeds, nfeeds, &candidates[i], &ref,
                      &c->rows[i], err))
      goto fail;
    c->nrows++;
  }
  free(targets);
  topos_params_free(ref.grads);
  topos_run_free(ref.run);
  return c;
fail:
  c->nrows = ncandidates; /* frees every row's outputs (NULL or not) */
  topos_conformance_free(c);
  free(targets);
  topos_params_free(ref.grads);
  topos_run_free(ref.run);
  return NULL;
}
