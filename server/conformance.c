/*
 * conformance.c - Conformance: the request's entry on every execution
 * path this host has, each compared with the reference interpreter
 * (topos_forward_for; in training posture also the parameter gradients of
 * topos_backward), in max ulp and max relative difference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rooms.h"

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
  topos_run *run = plan ? topos_plan_forward(plan, in->params, in->feeds,
                                             in->nfeeds, NULL, &err)
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

void handle_conformance(call_ctx *cx) {
  Topos__V1__ConformanceRequest *req = call_unpack(
      cx, &topos__v1__conformance_request__descriptor, "Conformance", false);
  if (req == NULL) return;
  cache_entry *net_ref = NULL;
  topos_network *net = spec_network(cx, req->id, &net_ref);
  if (net == NULL) return;
  topos_error err = {0};
  wire_entry we;
  if (wire_entry_from_proto(net, req->entry, &we, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "entry");
    cache_release(cx->d->cache, net_ref);
    return;
  }
  const topos_entry *e = &we.entry;
  run_inputs in;
  if (!run_inputs_read(cx, net, req->parameters, req->n_parameters, req->feeds,
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
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
  } else {
    memcpy(targets, e->roots, sizeof *targets * (size_t)e->nroots);
    memcpy(targets + e->nroots, e->observes,
           sizeof *targets * (size_t)e->nobserves);
    ref = topos_forward_for(net, in.params, in.feeds, in.nfeeds, targets, nt,
                            NULL, &err);
    if (ref == NULL) call_fail_err(cx, &err, "interpreter");
  }
  if (ref != NULL && e->posture == TOPOS_POSTURE_TRAINING) {
    ref_field = topos_backward(ref, e->roots[0], NULL, &err);
    ref_grad = ref_field ? topos_parameters_of(ref_field, &err) : NULL;
    if (ref_grad == NULL) call_fail_err(cx, &err, "interpreter backward");
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
      call_reply(cx, &r.base);
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
