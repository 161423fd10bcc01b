/*
 * interp.c - the reference interpreter: forward runs and backward.
 *
 * A run holds one tensor per evaluated node.  It reads the sealed network
 * and the caller's parameters and never writes either, so any number of
 * threads may run one network at once.  Node buffers come from the
 * engine's pool (pool.c), so a training loop reuses the same memory every
 * step.  backward() evaluates the adjoint rules of adjoint.c through a
 * builder whose every emitted op runs at once.  Every node, forward or
 * adjoint, goes through the dispatch (exec.c) under the call's context:
 * to a backend where the context's chain takes it, else to the reference
 * kernels (kernels.c).  Cancellation and the deadline are asked at every
 * node boundary.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* --------------------------------------------------------------- forward */

static int check_tensor_fits(const topos_tensor *t, const node *n,
                             const char *what, int slot, topos_error *err) {
  if (!t)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s slot %d: tensor is NULL",
                     what, slot);
  tensor_meta m = tensor_meta_of(t);
  if (m.dtype != n->meta.dtype ||
      !shape_equal(m.rank, m.shape, n->meta.rank, n->meta.shape)) {
    char want[SHAPE_TEXT + 8], got[SHAPE_TEXT + 8];
    return error_set(
        err, m.dtype != n->meta.dtype ? TOPOS_ERR_DTYPE : TOPOS_ERR_SHAPE,
        "%s slot %d: expected %s, got %s", what, slot,
        meta_text(want, &n->meta), meta_text(got, &m));
  }
  return 0;
}

/* The tensor each input node takes: its feed, else its default. */
static int resolve_feeds(const topos_network *net, const topos_feed *feeds,
                         int nfeeds, const topos_tensor **by_slot,
                         topos_error *err) {
  if (nfeeds < 0 || (nfeeds > 0 && !feeds))
    return error_set(err, TOPOS_ERR_ARGUMENT, "%d feeds given with %s array",
                     nfeeds, feeds ? "an" : "a NULL");
  for (int s = 0; s < net->ninputs; s++) by_slot[s] = NULL;
  for (int f = 0; f < nfeeds; f++) {
    topos_error e = {0};
    int i = network_index(net, feeds[f].input, &e);
    if (i < 0)
      return error_set(err, TOPOS_ERR_ARGUMENT, "feed %d: %s", f, e.message);
    const node *n = &net->nodes[i];
    if (n->op != OP_INPUT)
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "feed %d: node %d is a %s, not an input", f, i,
                       op_table[n->op].name);
    if (by_slot[n->at.slot])
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "feed %d: input slot %d is "
                       "fed twice",
                       f, n->at.slot);
    if (check_tensor_fits(feeds[f].tensor, n, "input", n->at.slot, err))
      return err ? err->code : TOPOS_ERR_ARGUMENT;
    by_slot[n->at.slot] = feeds[f].tensor;
  }
  return 0;
}

static int check_params(const topos_network *net, const topos_params *params,
                        topos_error *err) {
  if (!params) return 0;
  if (params->n != net->nparams)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%d parameters given, the network has %d", params->n,
                     net->nparams);
  for (int s = 0; s < net->nparams; s++) {
    const node *n = &net->nodes[net->param_nodes[s]];
    if (check_tensor_fits(params->t[s], n, "parameter", s, err))
      return err ? err->code : TOPOS_ERR_ARGUMENT;
  }
  return 0;
}

int topos_network_check_params(const topos_network *net,
                               const topos_params *params, topos_error *err) {
  if (!net) return error_set(err, TOPOS_ERR_ARGUMENT, "network is NULL");
  return check_params(net, params, err)
             ? (err && err->code ? err->code : TOPOS_ERR_ARGUMENT)
             : TOPOS_OK;
}

void topos_run_free(topos_run *run) {
  if (!run) return;
  if (run->vals) {
    for (int i = 0; i < run->net->n; i++) topos_tensor_release(run->vals[i]);
    free(run->vals);
  }
  free(run->readable);
  topos_network_release(run->net);
  free(run);
}

topos_run *run_alloc(const topos_network *net, topos_error *err) {
  topos_run *run = calloc(1, sizeof *run);
  if (run) run->vals = calloc((size_t)net->n + 1, sizeof(topos_tensor *));
  if (!run || !run->vals) {
    free(run);
    error_set(err, TOPOS_ERR_MEMORY, "forward: out of memory");
    return NULL;
  }
  run->net = topos_network_retain(net);
  return run;
}

int run_prepare(const topos_network *net, const topos_params *params,
                const topos_feed *feeds, int nfeeds, const topos_tensor **fed,
                topos_error *err) {
  if (check_params(net, params, err)) return err ? err->code : -1;
  if (resolve_feeds(net, feeds, nfeeds, fed, err)) return err ? err->code : -1;
  return 0;
}

int run_eval_node(const exec_env *env, topos_run *run, int i,
                  const topos_params *params, const topos_tensor **fed,
                  topos_error *err) {
  const node *n = &run->net->nodes[i];
  if (n->op == OP_PARAMETER && params) {
    run->vals[i] = topos_tensor_retain(params->t[n->at.slot]);
    return 0;
  }
  if (n->op == OP_INPUT && fed[n->at.slot]) {
    run->vals[i] = topos_tensor_retain(fed[n->at.slot]);
    return 0;
  }
  topos_tensor *stack_in[4] = {NULL};
  topos_tensor **in =
      n->nin <= 4 ? stack_in : malloc(sizeof(topos_tensor *) * (size_t)n->nin);
  if (!in) return error_set(err, TOPOS_ERR_MEMORY, "forward: out of memory");
  for (int j = 0; j < n->nin; j++) {
    in[j] = run->vals[n->in[j]];
    if (!in[j]) { /* only a planner bug can get here; fail, never crash */
      if (in != stack_in) free(in);
      return error_set(err, TOPOS_ERR_STATE,
                       "%s (node %d): operand node %d has no value",
                       op_table[n->op].name, i, n->in[j]);
    }
  }
  topos_error e = {0};
  run->vals[i] = exec_eval(env, n->op, &n->at, n->nin, in, &n->meta, &e);
  if (in != stack_in) free(in);
  if (!run->vals[i])
    return error_set(err, e.code ? e.code : TOPOS_ERR_STATE, "%s (node %d): %s",
                     op_table[n->op].name, i, e.message);
  return 0;
}

/* Evaluates the nodes with want[i] (every node when want is NULL). */
static topos_run *run_network(const topos_network *net,
                              const topos_params *params,
                              const topos_feed *feeds, int nfeeds,
                              const bool *want, const topos_exec *ctx,
                              topos_error *err) {
  exec_env env;
  if (exec_resolve(ctx, &env, err)) return NULL;
  const topos_tensor **fed = malloc(sizeof(*fed) * (size_t)(net->ninputs + 1));
  topos_run *run = fed ? run_alloc(net, err) : NULL;
  if (!run) {
    free(fed);
    if (!fed) error_set(err, TOPOS_ERR_MEMORY, "forward: out of memory");
    return NULL;
  }
  if (run_prepare(net, params, feeds, nfeeds, fed, err)) goto fail;
  for (int i = 0; i < net->n; i++) {
    if (want && !want[i]) continue;
    if (exec_stop(&env, err) || run_eval_node(&env, run, i, params, fed, err))
      goto fail;
  }
  free(fed);
  return run;
fail:
  free(fed);
  topos_run_free(run);
  return NULL;
}

topos_run *topos_forward(const topos_network *net, const topos_params *params,
                         const topos_feed *feeds, int nfeeds,
                         const topos_exec *ctx, topos_error *err) {
  if (!net) {
    error_set(err, TOPOS_ERR_ARGUMENT, "forward: network is NULL");
    return NULL;
  }
  return run_network(net, params, feeds, nfeeds, NULL, ctx, err);
}

topos_run *topos_forward_for(const topos_network *net,
                             const topos_params *params,
                             const topos_feed *feeds, int nfeeds,
                             const topos_value *targets, int ntargets,
                             const topos_exec *ctx, topos_error *err) {
  if (!net) {
    error_set(err, TOPOS_ERR_ARGUMENT, "forward: network is NULL");
    return NULL;
  }
  if (ntargets < 0 || (ntargets > 0 && !targets)) {
    error_set(err, TOPOS_ERR_ARGUMENT, "forward: %d targets with %s array",
              ntargets, targets ? "an" : "a NULL");
    return NULL;
  }
  bool *want = calloc((size_t)net->n + 1, sizeof(bool));
  if (!want) {
    error_set(err, TOPOS_ERR_MEMORY, "forward: out of memory");
    return NULL;
  }
  for (int t = 0; t < ntargets; t++) {
    topos_error e = {0};
    int i = network_index(net, targets[t], &e);
    if (i < 0) {
      error_set(err, TOPOS_ERR_ARGUMENT, "forward: target %d: %s", t,
                e.message);
      free(want);
      return NULL;
    }
    want[i] = true;
  }
  for (int i = net->n - 1; i >= 0; i--)
    if (want[i])
      for (int j = 0; j < net->nodes[i].nin; j++)
        want[net->nodes[i].in[j]] = true;
  topos_run *run = run_network(net, params, feeds, nfeeds, want, ctx, err);
  free(want);
  return run;
}

const topos_tensor *topos_run_of(const topos_run *run, topos_value v,
                                 topos_error *err) {
  if (!run) {
    error_set(err, TOPOS_ERR_ARGUMENT, "run is NULL");
    return NULL;
  }
  int i = network_index(run->net, v, err);
  if (i < 0) return NULL;
  if (run->readable && !run->readable[i]) {
    error_set(err, TOPOS_ERR_STATE,
              "node %d (%s) is not a root or observe of the plan that made "
              "this run",
              i, op_table[run->net->nodes[i].op].name);
    return NULL;
  }
  if (!run->vals[i]) {
    error_set(err, TOPOS_ERR_STATE,
              "node %d (%s) was not evaluated by this run", i,
              op_table[run->net->nodes[i].op].name);
    return NULL;
  }
  return run->vals[i];
}

double topos_run_scalar(const topos_run *run, topos_value v, topos_error *err) {
  const topos_tensor *t = topos_run_of(run, v, err);
  if (!t) return NAN;
  if (t->rank != 0) {
    error_set(err, TOPOS_ERR_SHAPE, "node %d has rank %d, not 0", v.index,
              t->rank);
    return NAN;
  }
  return topos_tensor_get(t, NULL, err);
}

/* ------------------------------------------------- the evaluating builder */

typedef struct eval_builder {
  builder base;
  const exec_env *env;
  const topos_run *run;
  topos_tensor **t; /* NULL: released, or a value the adjoint may not read */
  tensor_meta *m;
  int n, cap;
  int settled;   /* handles below this survived the last settle */
  int32_t *uses; /* network_uses, made at the first fused-GELU question */
  bool uses_failed;
  topos_error *err;
} eval_builder;

static int32_t eb_push(eval_builder *eb, topos_tensor *t,
                       const tensor_meta *m) {
  if (eb->n == eb->cap) {
    int cap = eb->cap ? eb->cap * 2 : 64;
    topos_tensor **nt = realloc(eb->t, sizeof(*nt) * (size_t)cap);
    if (nt) eb->t = nt;
    tensor_meta *nm = realloc(eb->m, sizeof(*nm) * (size_t)cap);
    if (nm) eb->m = nm;
    if (!nt || !nm) {
      topos_tensor_release(t);
      error_set(eb->err, TOPOS_ERR_MEMORY, "backward: out of memory");
      return -1;
    }
    eb->cap = cap;
  }
  eb->t[eb->n] = t;
  eb->m[eb->n] = *m;
  return eb->n++;
}

static int32_t eb_emit(builder *b, op_code op, const int32_t *in, int nin,
                       const node_attrs *at) {
  eval_builder *eb = (eval_builder *)b;
  topos_tensor *stack_t[4];
  tensor_meta stack_m[4];
  if (nin > 4) {
    error_set(eb->err, TOPOS_ERR_STATE, "%s: too many operands",
              op_table[op].name);
    return -1;
  }
  for (int i = 0; i < nin; i++) {
    if (in[i] < 0 || in[i] >= eb->n || !eb->t[in[i]]) {
      error_set(eb->err, TOPOS_ERR_STATE,
                "%s: a value the adjoint needs is not available (not in its "
                "op's reads, or not kept by the plan)",
                op_table[op].name);
      return -1;
    }
    stack_t[i] = eb->t[in[i]];
    stack_m[i] = eb->m[in[i]];
  }
  node_attrs attrs = at ? *at : (node_attrs){0};
  tensor_meta out;
  char msg[400];
  int rc = op_infer(op, &attrs, nin, stack_m, &out, msg, sizeof msg);
  if (rc) {
    error_set(eb->err, rc, "%s: %s", op_table[op].name, msg);
    return -1;
  }
  topos_error e = {0};
  topos_tensor *t = exec_eval(eb->env, op, &attrs, nin, stack_t, &out, &e);
  if (!t) {
    error_set(eb->err, e.code, "%s: %s", op_table[op].name, e.message);
    return -1;
  }
  return eb_push(eb, t, &out);
}

static int32_t eb_scalar(builder *b, topos_dtype dtype, double value) {
  eval_builder *eb = (eval_builder *)b;
  topos_tensor *t = topos_tensor_scalar(dtype, value, eb->err);
  if (!t) return -1;
  tensor_meta m = tensor_meta_of(t);
  return eb_push(eb, t, &m);
}

static const tensor_meta *eb_meta(builder *b, int32_t h) {
  return &((eval_builder *)b)->m[h];
}

/* The value of a member of a fused window group whose adjoint runs fused
 * (so the plan keeps no interior value), recomputed from the group's x
 * through the chain's nodes: a full field (topos_plan_backward) runs the
 * unfused adjoints, which read the im2col or window tensor.  NULL when
 * index is no such member or evaluating fails. */
static topos_tensor *eb_remat(eval_builder *eb, int32_t index) {
  const topos_plan *p = eb->run->plan;
  const topos_network *net = eb->run->net;
  if (!p || p->group_of[index] < 0) return NULL;
  const plan_group *g = &p->groups[p->group_of[index]];
  if (!g->fused_grad || g->head == index || !eb->run->vals[g->x]) return NULL;
  topos_tensor *cur = topos_tensor_retain(eb->run->vals[g->x]);
  for (int k = 0; k < g->nmembers && cur; k++) {
    const node *n = &net->nodes[g->members[k]];
    topos_error e = {0};
    topos_tensor *in[1] = {cur};
    topos_tensor *next = exec_eval(eb->env, n->op, &n->at, 1, in, &n->meta, &e);
    topos_tensor_release(cur);
    cur = next;
    if (g->members[k] == index) return cur;
  }
  topos_tensor_release(cur);
  return NULL;
}

static int32_t eb_value(builder *b, int32_t index, bool needed) {
  eval_builder *eb = (eval_builder *)b;
  const node *n = &eb->run->net->nodes[index];
  topos_tensor *t = NULL;
  if (needed)
    t = eb->run->vals[index] ? topos_tensor_retain(eb->run->vals[index])
                             : eb_remat(eb, index);
  return eb_push(eb, t, &n->meta);
}

static const node *eb_node_at(builder *b, int32_t i) {
  return &((eval_builder *)b)->run->net->nodes[i];
}

static void eb_settle(builder *b, const int32_t *keep, int nkeep) {
  eval_builder *eb = (eval_builder *)b;
  for (int h = eb->settled; h < eb->n; h++) {
    bool kept = false;
    for (int k = 0; k < nkeep; k++) kept |= keep[k] == h;
    if (!kept) {
      topos_tensor_release(eb->t[h]);
      eb->t[h] = NULL;
    }
  }
  eb->settled = eb->n;
}

/* x's cotangent for the matched GELU m from the head's cotangent eb->t[g]:
 * 1 with it pushed, 0 when a value it reads is missing, -1 on failure. */
static int eb_gelu_apply(eval_builder *eb, const gelu_pattern *m, int32_t g,
                         int32_t *to, int32_t *dx, int *n) {
  const topos_run *run = eb->run;
  const topos_tensor *v[5] = {run->vals[m->x], run->vals[m->x2],
                              run->vals[m->half], run->vals[m->s],
                              run->vals[m->t]};
  for (int k = 0; k < 5; k++)
    if (!v[k]) return 0;
  if (g < 0 || !eb->t[g]) return 0;
  topos_error e = {0};
  topos_tensor *gx = gelu_grad(eb->env, m, eb->t[g], v, &e);
  if (!gx) {
    error_set(eb->err, e.code, "fused GELU adjoint: %s", e.message);
    return -1;
  }
  tensor_meta meta = tensor_meta_of(gx);
  to[0] = m->x;
  dx[0] = eb_push(eb, gx, &meta);
  *n = 1;
  return dx[0] < 0 ? -1 : 1;
}

/* A tanh GELU headed by node i: x's cotangent in one pass (gelu.c), when
 * only the parameters' gradients are wanted and the forward values it
 * reads are there (a plan keeps them: the unfused adjoints read them). */
static int eb_gelu_adjoint(eval_builder *eb, int32_t i, int32_t g, int32_t *to,
                           int32_t *dx, int *n) {
  const topos_run *run = eb->run;
  if (eb->uses == NULL && !eb->uses_failed) {
    eb->uses = network_uses(run->net, NULL);
    eb->uses_failed = eb->uses == NULL; /* the unfused adjoints, then */
  }
  gelu_pattern m;
  if (eb->uses == NULL || !gelu_match(run->net, eb->uses, i, &m)) return 0;
  return eb_gelu_apply(eb, &m, g, to, dx, n);
}

/* A plan run's fused window group headed by node i: its adjoint from the
 * group's inputs at once (plan.c elects them; exec_group_grad); else a
 * tanh GELU's (the plan's GELU group, or eb_gelu_adjoint's match). */
static int eb_group_adjoint(builder *b, int32_t i, int32_t g,
                            const bool *wanted, int32_t *to, int32_t *dx,
                            int *n) {
  eval_builder *eb = (eval_builder *)b;
  const topos_run *run = eb->run;
  const topos_plan *p = run->plan;
  *n = 0;
  /* A full field also wants the interior's cotangents: the unfused
   * adjoints give them (for window groups on recomputed interior values,
   * eb_remat). */
  if (!wanted) return 0;
  if (!p || p->group_of[i] < 0) return eb_gelu_adjoint(eb, i, g, to, dx, n);
  const plan_group *grp = &p->groups[p->group_of[i]];
  /* The plan matched the pattern already (on its live nodes: a consumer
   * of x outside them adds no cotangent). */
  if (grp->kind == GROUP_GELU)
    return grp->head == i ? eb_gelu_apply(eb, &grp->gelu, g, to, dx, n) : 0;
  if (!grp->fused_grad || grp->head != i) return 0;
  int32_t other = grp->kind == GROUP_CONV ? grp->weight : i;
  bool want_x = wanted[grp->x];
  bool want_w = grp->kind == GROUP_CONV && wanted[grp->weight];
  const topos_tensor *x = run->vals[grp->x], *o = run->vals[other];
  if (!x || !o || g < 0 || !eb->t[g]) {
    error_set(eb->err, TOPOS_ERR_STATE,
              "fused adjoint: a value it reads was not kept by the plan");
    return -1;
  }
  topos_tensor *tx, *tw;
  topos_error e = {0};
  if (exec_group_grad(eb->env, grp, eb->t[g], x, o, want_x, want_w, &tx, &tw,
                      &e)) {
    error_set(eb->err, e.code, "fused adjoint: %s", e.message);
    return -1;
  }
  if (tw) {
    tensor_meta m = tensor_meta_of(tw);
    to[*n] = grp->weight;
    dx[(*n)++] = eb_push(eb, tw, &m);
  }
  if (tx) {
    tensor_meta m = tensor_meta_of(tx);
    to[*n] = grp->x;
    dx[(*n)++] = eb_push(eb, tx, &m);
  }
  for (int k = 0; k < *n; k++)
    if (dx[k] < 0) return -1;
  return 1;
}

/* The checks both public entry points to backward make: target is a
 * value of this run, and the run kept what backward reads. */
static bool backward_target_ok(const topos_run *run, topos_value target,
                               const char *what, topos_error *err) {
  if (!topos_run_of(run, target, err)) return false;
  if (run->plan && run->plan->posture != TOPOS_POSTURE_TRAINING) {
    error_set(err, TOPOS_ERR_STATE,
              "%s: this run's plan is forward-only and freed what backward "
              "reads; lower with the training posture",
              what);
    return false;
  }
  return true;
}

topos_field *topos_backward(const topos_run *run, topos_value target,
                            const topos_exec *ctx, topos_error *err) {
  topos_error local = {0};
  if (!err) err = &local;
  exec_env env;
  if (!backward_target_ok(run, target, "backward", err)) return NULL;
  if (exec_resolve(ctx, &env, err)) return NULL;
  return run_backward(&env, run, target.index, err);
}

topos_params *topos_gradients(const topos_run *run, topos_value target,
                              const topos_exec *ctx, topos_error *err) {
  topos_error local = {0};
  if (!err) err = &local;
  exec_env env;
  if (!backward_target_ok(run, target, "gradients", err)) return NULL;
  if (exec_resolve(ctx, &env, err)) return NULL;
  return run_gradients(&env, run, target.index, err);
}

/* The reverse scan on run's values: on success eb holds the emitted
 * tensors and grads[0..ti] their handles (-1 where none reached); the
 * caller frees both with backward_done. */
static int backward_eval(const exec_env *env, const topos_run *run, int ti,
                         bool params_only, eval_builder *eb, int32_t **grads,
                         topos_error *err) {
  const topos_network *net = run->net;
  const topos_tensor *y = run->vals[ti];
  *eb = (eval_builder){
      .base = {eb_emit, eb_scalar, eb_meta, eb_value, eb_settle, eb_node_at,
               eb_group_adjoint},
      .env = env,
      .run = run,
      .err = err,
  };
  *grads = NULL;
  if (!y)
    return error_set(err, TOPOS_ERR_STATE,
                     "backward: node %d was not evaluated", ti);
  if (y->rank != 0 || !dtype_is_float(y->dtype)) {
    char mt[SHAPE_TEXT + 8];
    return error_set(err, TOPOS_ERR_SHAPE,
                     "backward: the target (node %d) is %s; it must be a "
                     "rank-0 float value",
                     ti, meta_text(mt, &net->nodes[ti].meta));
  }
  *grads = malloc(sizeof(int32_t) * (size_t)(ti + 1));
  if (!*grads)
    return error_set(err, TOPOS_ERR_MEMORY, "backward: out of memory");
  return backward_scan(&eb->base, ti, *grads, params_only, env, err);
}

static void backward_done(eval_builder *eb, int32_t *grads) {
  free(eb->uses);
  for (int h = 0; h < eb->n; h++) topos_tensor_release(eb->t[h]);
  free(eb->t);
  free(eb->m);
  free(grads);
}

topos_field *run_backward(const exec_env *env, const topos_run *run, int ti,
                          topos_error *err) {
  topos_error local = {0};
  if (!err) err = &local;
  const topos_network *net = run->net;
  eval_builder eb;
  int32_t *grads;
  topos_field *f = NULL;
  if (backward_eval(env, run, ti, false, &eb, &grads, err)) goto done;
  f = field_alloc(net);
  if (!f) {
    error_set(err, TOPOS_ERR_MEMORY, "backward: out of memory");
    goto done;
  }
  for (int i = 0; i < net->n; i++) {
    if (i <= ti && grads[i] >= 0) {
      f->t[i] = topos_tensor_retain(eb.t[grads[i]]);
    } else {
      f->t[i] = tensor_zeros_like_meta(&net->nodes[i].meta, err);
      if (!f->t[i]) {
        topos_field_free(f);
        f = NULL;
        goto done;
      }
    }
  }
done:
  backward_done(&eb, grads);
  return f;
}

topos_params *run_gradients(const exec_env *env, const topos_run *run, int ti,
                            topos_error *err) {
  topos_error local = {0};
  if (!err) err = &local;
  const topos_network *net = run->net;
  eval_builder eb;
  int32_t *grads;
  topos_params *p = NULL;
  if (backward_eval(env, run, ti, true, &eb, &grads, err)) goto done;
  p = params_alloc(net->nparams);
  if (!p) {
    error_set(err, TOPOS_ERR_MEMORY, "gradients: out of memory");
    goto done;
  }
  for (int s = 0; s < net->nparams; s++) {
    int i = net->param_nodes[s];
    if (i <= ti && grads[i] >= 0) {
      p->t[s] = topos_tensor_retain(eb.t[grads[i]]);
    } else {
      p->t[s] = tensor_zeros_like_meta(&net->nodes[i].meta, err);
      if (!p->t[s]) {
        topos_params_free(p);
        p = NULL;
        goto done;
      }
    }
  }
done:
  backward_done(&eb, grads);
  return p;
}

/* ------------------------------------------------- the metering builder */

/* A handle: where its shape is (a slot, recycled once the handle is
 * released: the scan makes millions of handles on a large graph and
 * keeps few), the buffer it holds (-1: none, or the run's), the struct
 * it owns, and whether its value is contiguous. */
typedef struct meter_handle {
  int32_t slot; /* into metas; -1 once released */
  int32_t buf;
  bool contig;
  bool own; /* a tensor struct of its own (not a value of the run) */
} meter_handle;

typedef struct meter_builder {
  builder base;
  const topos_network *net;
  const bool *contig; /* per node */
  meter_handle *h;
  int n, cap, settled;
  tensor_meta *metas;
  int32_t *free_slots;
  int nmetas, metacap, nfree;
  size_t *bytes; /* per buffer */
  int32_t *refs; /* handles holding it */
  int nbuf, bufcap;
  size_t live, peak;
  bool failed;
} meter_builder;

static void mb_note(meter_builder *mb, size_t extra) {
  size_t at = size_add(mb->live, extra);
  if (at > mb->peak) mb->peak = at;
}

static int32_t mb_slot(meter_builder *mb, const tensor_meta *m) {
  if (mb->nfree > 0) {
    int32_t slot = mb->free_slots[--mb->nfree];
    mb->metas[slot] = *m;
    return slot;
  }
  if (mb->nmetas == mb->metacap) {
    int cap = mb->metacap ? mb->metacap * 2 : 64;
    tensor_meta *nm = realloc(mb->metas, sizeof(*nm) * (size_t)cap);
    if (nm) mb->metas = nm;
    int32_t *nf = realloc(mb->free_slots, sizeof(*nf) * (size_t)cap);
    if (nf) mb->free_slots = nf;
    if (!nm || !nf) return -1;
    mb->metacap = cap;
  }
  mb->metas[mb->nmetas] = *m;
  return mb->nmetas++;
}

static int32_t mb_push(meter_builder *mb, const tensor_meta *m, int32_t buf,
                       bool contig, bool own) {
  if (mb->n == mb->cap) {
    int cap = mb->cap ? mb->cap * 2 : 64;
    meter_handle *nh = realloc(mb->h, sizeof(*nh) * (size_t)cap);
    if (!nh) {
      mb->failed = true;
      return -1;
    }
    mb->h = nh;
    mb->cap = cap;
  }
  int32_t slot = mb_slot(mb, m);
  if (slot < 0) {
    mb->failed = true;
    return -1;
  }
  mb->h[mb->n] = (meter_handle){slot, buf, contig, own};
  if (own) mb->live = size_add(mb->live, TENSOR_STRUCT_BYTES);
  if (buf >= 0) mb->refs[buf]++;
  mb_note(mb, 0);
  return mb->n++;
}

/* A new buffer for a value of meta m (not yet held by a handle). */
static int32_t mb_buffer(meter_builder *mb, const tensor_meta *m) {
  if (mb->nbuf == mb->bufcap) {
    int cap = mb->bufcap ? mb->bufcap * 2 : 64;
    size_t *nb = realloc(mb->bytes, sizeof(*nb) * (size_t)cap);
    if (nb) mb->bytes = nb;
    int32_t *nr = realloc(mb->refs, sizeof(*nr) * (size_t)cap);
    if (nr) mb->refs = nr;
    if (!nb || !nr) {
      mb->failed = true;
      return -1;
    }
    mb->bufcap = cap;
  }
  size_t b = size_add(
      pool_bytes_of(shape_count(m->rank, m->shape), topos_dtype_size(m->dtype)),
      BUFFER_STRUCT_BYTES);
  mb->bytes[mb->nbuf] = b;
  mb->refs[mb->nbuf] = 0;
  mb->live = size_add(mb->live, b);
  return mb->nbuf++;
}

static void mb_drop(meter_builder *mb, int32_t h) {
  meter_handle *x = &mb->h[h];
  if (x->own) mb->live -= TENSOR_STRUCT_BYTES;
  x->own = false;
  if (x->buf >= 0 && --mb->refs[x->buf] == 0) mb->live -= mb->bytes[x->buf];
  x->buf = -1;
  if (x->slot >= 0) mb->free_slots[mb->nfree++] = x->slot;
  x->slot = -1;
}

/* The shape of a live handle; a released one (which the evaluating
 * builder would hold no value for) fails the meter. */
static const tensor_meta *mb_meta_of(meter_builder *mb, int32_t h) {
  static const tensor_meta none = {0};
  if (h < 0 || h >= mb->n || mb->h[h].slot < 0) {
    mb->failed = true;
    return &none;
  }
  return &mb->metas[mb->h[h].slot];
}

static bool is_view_op(op_code op) {
  switch (op) {
    case OP_TRANSPOSE:
    case OP_PERMUTE:
    case OP_NARROW:
    case OP_BROADCAST:
    case OP_BROADCAST_ALONG:
    case OP_UNFOLD:
      return true;
    default:
      return false;
  }
}

static int32_t mb_emit(builder *b, op_code op, const int32_t *in, int nin,
                       const node_attrs *at) {
  meter_builder *mb = (meter_builder *)b;
  tensor_meta stack_m[4];
  bool stack_c[4];
  if (nin > 4) {
    mb->failed = true;
    return -1;
  }
  for (int i = 0; i < nin; i++) {
    if (in[i] < 0 || in[i] >= mb->n || mb->h[in[i]].slot < 0) {
      mb->failed = true;
      return -1;
    }
    stack_m[i] = mb->metas[mb->h[in[i]].slot];
    stack_c[i] = mb->h[in[i]].contig;
  }
  node_attrs attrs = at ? *at : (node_attrs){0};
  tensor_meta out;
  char msg[400];
  if (op_infer(op, &attrs, nin, stack_m, &out, msg, sizeof msg)) {
    mb->failed = true;
    return -1;
  }
  /* Views share their operand's buffer (a reshape of a contiguous one
   * too); everything else gets a buffer of its own, written while the
   * kernel's scratch is held. */
  if (is_view_op(op) || (op == OP_RESHAPE && stack_c[0]))
    return mb_push(mb, &out, mb->h[in[0]].buf, op == OP_RESHAPE, true);
  size_t scratch = op_scratch_bytes(op, &attrs, nin, stack_m, stack_c, &out);
  int32_t buf = mb_buffer(mb, &out);
  if (buf < 0) return -1;
  mb_note(mb, scratch);
  return mb_push(mb, &out, buf, true, true);
}

static int32_t mb_scalar(builder *b, topos_dtype dtype, double value) {
  (void)value;
  meter_builder *mb = (meter_builder *)b;
  tensor_meta m = {.dtype = dtype, .rank = 0};
  int32_t buf = mb_buffer(mb, &m);
  return buf < 0 ? -1 : mb_push(mb, &m, buf, true, true);
}

static const tensor_meta *mb_meta(builder *b, int32_t h) {
  return mb_meta_of((meter_builder *)b, h);
}

static int32_t mb_value(builder *b, int32_t index, bool needed) {
  (void)needed; /* the run's value: retained, nothing new */
  meter_builder *mb = (meter_builder *)b;
  return mb_push(mb, &mb->net->nodes[index].meta, -1, mb->contig[index], false);
}

static const node *mb_node_at(builder *b, int32_t i) {
  return &((meter_builder *)b)->net->nodes[i];
}

static void mb_settle(builder *b, const int32_t *keep, int nkeep) {
  meter_builder *mb = (meter_builder *)b;
  for (int h = mb->settled; h < mb->n; h++) {
    bool kept = false;
    for (int k = 0; k < nkeep; k++) kept |= keep[k] == h;
    if (!kept) mb_drop(mb, h);
  }
  mb->settled = mb->n;
}

/* A zero tensor_zeros_like_meta makes: a one-element buffer and a
 * broadcast view of it. */
static size_t zeros_bytes(const tensor_meta *m) {
  return size_add(size_add(pool_bytes_of(1, topos_dtype_size(m->dtype)),
                           BUFFER_STRUCT_BYTES),
                  2 * TENSOR_STRUCT_BYTES);
}

int backward_meter(const topos_network *net, int target, bool params_only,
                   const bool *contig, size_t *peak, size_t *held) {
  meter_builder mb = {
      .base = {mb_emit, mb_scalar, mb_meta, mb_value, mb_settle, mb_node_at},
      .net = net,
      .contig = contig,
  };
  *peak = *held = 0;
  int32_t *grads = malloc(sizeof(int32_t) * (size_t)(target + 1));
  topos_error err = {0};
  int rc = grads
               ? backward_scan(&mb.base, target, grads, params_only, NULL, &err)
               : -1;
  if (rc != 0 || mb.failed) {
    free(grads);
    free(mb.h);
    free(mb.metas);
    free(mb.free_slots);
    free(mb.bytes);
    free(mb.refs);
    return -1;
  }
  /* The result: the gradients it retains (each buffer once, with its
   * struct), zeros where none reached (made while every handle is still
   * held), and its own tables. */
  int count = params_only ? net->nparams : net->n;
  bool *seen = calloc((size_t)mb.nbuf + 1, sizeof(bool));
  size_t result = malloc_block(sizeof(void *) * (size_t)(count + 1));
  result = size_add(result, malloc_block(sizeof(topos_field)));
  size_t zeros = 0;
  for (int k = 0; k < count && seen; k++) {
    int i = params_only ? net->param_nodes[k] : k;
    int32_t g = i <= target ? grads[i] : -1;
    if (g < 0) {
      zeros = size_add(zeros, zeros_bytes(&net->nodes[i].meta));
      continue;
    }
    result = size_add(result, TENSOR_STRUCT_BYTES);
    int32_t buf = mb.h[g].buf;
    if (buf >= 0 && !seen[buf]) {
      seen[buf] = true;
      result = size_add(result, mb.bytes[buf]);
    }
  }
  result = size_add(result, zeros);
  size_t end = size_add(
      mb.live,
      size_add(zeros, malloc_block(sizeof(void *) * (size_t)(count + 1))));
  /* The evaluating builder's tables, grown by doubling (the old and the
   * new array at once while they grow), and the scan's per-node arrays. */
  size_t tables =
      size_mul(malloc_block((sizeof(topos_tensor *) + sizeof(tensor_meta)) *
                            (size_t)(mb.cap > 0 ? mb.cap : 1)),
               2);
  tables =
      size_add(tables, malloc_block(sizeof(int32_t) * (size_t)(target + 1)));
  tables = size_add(tables, 2 * malloc_block((size_t)target + 1));
  *peak = size_add(mb.peak > end ? mb.peak : end, tables);
  *held = result;
  if (!seen) *peak = *held = SIZE_MAX;
  free(seen);
  free(grads);
  free(mb.h);
  free(mb.metas);
  free(mb.free_slots);
  free(mb.bytes);
  free(mb.refs);
  return 0;
}
