/*
 * step.c - the training step as one engine call, and trainers.
 *
 * topos_plan_step is what every training loop composed by hand before
 * (the daemon's Step, the benches, the examples): a plan forward, the
 * parameters' gradients of the loss, one optimizer update.  It is exactly
 * those three calls, in that order, under one context, so its bits are
 * theirs; what it adds is the checks that would otherwise fail only after
 * the forward and backward were paid for, and one result to release.
 *
 * A trainer puts a step behind a small vtable so a loop does not care
 * where the step runs: topos_trainer_local lowers the plan once and calls
 * topos_plan_step; the remote one (client/trainer.c) sends Step RPCs.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void topos_step_result_clear(topos_step_result *r) {
  if (!r) return;
  topos_params_free(r->params);
  topos_opt_state_free(r->state);
  topos_run_free(r->run);
  for (int k = 0; k < r->nobserves; k++)
    topos_tensor_release(r->observes ? r->observes[k] : NULL);
  free(r->observes);
  memset(r, 0, sizeof *r);
}

/* The observes of the plan, retained from the run, into out. */
static int take_observes(const topos_plan *plan, const topos_run *run,
                         topos_step_result *out, topos_error *err) {
  if (plan->nobserves == 0) return TOPOS_OK;
  out->observes = calloc((size_t)plan->nobserves, sizeof *out->observes);
  if (!out->observes)
    return error_set(err, TOPOS_ERR_MEMORY, "plan step: out of memory");
  out->nobserves = plan->nobserves;
  for (int k = 0; k < plan->nobserves; k++) {
    topos_value v = topos_network_value(plan->net, plan->observes[k]);
    const topos_tensor *t = topos_run_of(run, v, err);
    if (!t) return err->code;
    out->observes[k] = topos_tensor_retain(t);
  }
  return TOPOS_OK;
}

/* The code of a call that returned NULL: an error always has one. */
static int code_of(const topos_error *e) {
  return e->code != TOPOS_OK ? e->code : TOPOS_ERR_MEMORY;
}

/* topos_plan_step, and with donate_params / donate_state (both or
 * neither) topos_plan_step_donated: params and state are then
 * *donate_params and *donate_state. */
static int plan_step(const topos_plan *plan, const topos_params *params,
                     const topos_feed *feeds, int nfeeds,
                     const topos_optimizer *opt, const topos_opt_state *state,
                     const topos_exec *ctx, topos_step_result *out,
                     topos_params **donate_params,
                     topos_opt_state **donate_state, topos_error *err) {
  if (!out) return error_set(err, TOPOS_ERR_ARGUMENT, "plan step: out is NULL");
  memset(out, 0, sizeof *out);
  if (!plan || !opt)
    return error_set(err, TOPOS_ERR_ARGUMENT, "plan step: %s is NULL",
                     plan ? "optimizer" : "plan");
  if (plan->posture != TOPOS_POSTURE_TRAINING)
    return error_set(err, TOPOS_ERR_STATE,
                     "plan step: the plan is forward-only; lower with the "
                     "training posture (roots[0] the loss)");
  /* The calls below report into e, so a failure keeps its code when the
   * caller passed no err. */
  topos_error e = {0};
  /* The optimizer reads the parameters themselves, so "the initials" must
   * be a set here, not just the forward's NULL. */
  topos_params *initial = NULL;
  if (!params) {
    params = initial = topos_network_parameters(plan->net);
    if (!initial)
      return error_set(err, TOPOS_ERR_MEMORY,
                       "plan step: out of memory copying the initial "
                       "parameters");
  }
  topos_opt_state *fresh = NULL;
  topos_run *run = NULL;
  topos_params *grads = NULL;
  /* Settings and state are checked before the forward is paid for. */
  int rc = topos_optimizer_check(opt, params, state, &e);
  if (rc == TOPOS_OK && !state) {
    state = fresh = topos_opt_state_new(opt, params, &e);
    if (!fresh) rc = code_of(&e);
  }
  if (rc == TOPOS_OK) {
    run = topos_plan_forward(plan, params, feeds, nfeeds, ctx, &e);
    if (!run) rc = code_of(&e);
  }
  if (rc == TOPOS_OK) {
    out->loss = topos_run_scalar(
        run, topos_network_value(plan->net, plan->roots[0]), &e);
    rc = e.code;
  }
  if (rc == TOPOS_OK) {
    grads = topos_plan_gradients(plan, run, ctx, &e);
    if (!grads) rc = code_of(&e);
  }
  /* The update is one pass over the parameters: a cancel or deadline is
   * asked once more before it. */
  exec_env env;
  bool have_env = false;
  if (rc == TOPOS_OK) {
    have_env = exec_resolve(ctx, &env, &e) == TOPOS_OK;
    if (have_env && ctx && exec_stop(&env, &e)) rc = e.code;
  }
  bool donating = donate_params != NULL;
  if (!donating) {
    if (rc == TOPOS_OK)
      rc = optimizer_step_in(have_env ? &env : NULL, opt, params, grads, state,
                             &out->params, &out->state, &e);
    if (rc == TOPOS_OK) rc = take_observes(plan, run, out, &e);
  } else {
    /* The run lets go of the parameters before the update, so that the
     * donated set may be the only holder of its tensors. */
    if (rc == TOPOS_OK) rc = take_observes(plan, run, out, &e);
    if (rc == TOPOS_OK) {
      topos_run_free(run);
      run = NULL;
      topos_params *given = initial ? initial : *donate_params;
      rc = optimizer_step_donated(have_env ? &env : NULL, opt, &given, grads,
                                  state, &out->params, &out->state, &e);
      if (rc == TOPOS_OK) {
        if (initial)
          initial = NULL; /* consumed */
        else
          *donate_params = NULL;
        if (!fresh) {
          topos_opt_state_free(*donate_state);
          *donate_state = NULL;
        }
      }
    }
  }
  topos_params_free(grads);
  topos_opt_state_free(fresh);
  topos_params_free(initial);
  if (rc == TOPOS_OK) {
    out->run = run;
    return TOPOS_OK;
  }
  topos_run_free(run);
  topos_step_result_clear(out);
  if (err) *err = e;
  return rc;
}

int topos_plan_step(const topos_plan *plan, const topos_params *params,
                    const topos_feed *feeds, int nfeeds,
                    const topos_optimizer *opt, const topos_opt_state *state,
                    const topos_exec *ctx, topos_step_result *out,
                    topos_error *err) {
  return plan_step(plan, params, feeds, nfeeds, opt, state, ctx, out, NULL,
                   NULL, err);
}

int topos_plan_step_donated(const topos_plan *plan, topos_params **params,
                            const topos_feed *feeds, int nfeeds,
                            const topos_optimizer *opt, topos_opt_state **state,
                            const topos_exec *ctx, topos_step_result *out,
                            topos_error *err) {
  if (out) memset(out, 0, sizeof *out);
  if (!params || !state)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "plan step: the donated %s pointer is NULL",
                     params ? "state" : "params");
  return plan_step(plan, *params, feeds, nfeeds, opt, *state, ctx, out, params,
                   state, err);
}

/* ----------------------------------------------------------------- trainers */

struct topos_trainer {
  const topos_trainer_ops *ops;
  void *self;
};

topos_trainer *topos_trainer_new(const topos_trainer_ops *ops, void *self,
                                 topos_error *err) {
  if (!ops || !ops->step || !ops->free) {
    error_set(err, TOPOS_ERR_ARGUMENT, "trainer: ops %s",
              ops ? "lack step or free" : "is NULL");
    if (ops && ops->free) ops->free(self);
    return NULL;
  }
  topos_trainer *tr = malloc(sizeof *tr);
  if (!tr) {
    error_set(err, TOPOS_ERR_MEMORY, "trainer: out of memory");
    ops->free(self);
    return NULL;
  }
  tr->ops = ops;
  tr->self = self;
  return tr;
}

int topos_trainer_step(topos_trainer *tr, const topos_params *params,
                       const topos_feed *feeds, int nfeeds,
                       const topos_optimizer *opt, const topos_opt_state *state,
                       topos_step_result *out, topos_error *err) {
  if (!out)
    return error_set(err, TOPOS_ERR_ARGUMENT, "trainer step: out is NULL");
  memset(out, 0, sizeof *out);
  if (!tr)
    return error_set(err, TOPOS_ERR_ARGUMENT, "trainer step: trainer is NULL");
  int rc = tr->ops->step(tr->self, params, feeds, nfeeds, opt, state, out, err);
  /* Whatever an implementation left behind, a failure reads as all zero. */
  if (rc != TOPOS_OK) topos_step_result_clear(out);
  return rc;
}

const char *topos_trainer_kind(const topos_trainer *tr) {
  return tr && tr->ops->kind ? tr->ops->kind : "";
}

void topos_trainer_free(topos_trainer *tr) {
  if (!tr) return;
  tr->ops->free(tr->self);
  free(tr);
}

/* In-process: one plan, lowered once, and the caller's context copied so
 * the trainer outlives the caller's strings. */
typedef struct local_trainer {
  topos_plan *plan;
  bool has_ctx;
  topos_exec ctx;
  char *backend; /* ctx.backend's copy */
} local_trainer;

static void local_free(void *self) {
  local_trainer *t = self;
  if (!t) return;
  topos_plan_free(t->plan);
  free(t->backend);
  free(t);
}

static int local_step(void *self, const topos_params *params,
                      const topos_feed *feeds, int nfeeds,
                      const topos_optimizer *opt, const topos_opt_state *state,
                      topos_step_result *out, topos_error *err) {
  const local_trainer *t = self;
  return topos_plan_step(t->plan, params, feeds, nfeeds, opt, state,
                         t->has_ctx ? &t->ctx : NULL, out, err);
}

static const topos_trainer_ops local_ops = {"local", local_step, local_free};

topos_trainer *topos_trainer_local(const topos_network *net, topos_value loss,
                                   const topos_value *observes, int nobserves,
                                   const topos_exec *ctx, topos_error *err) {
  if (!net) {
    error_set(err, TOPOS_ERR_ARGUMENT, "trainer: network is NULL");
    return NULL;
  }
  if (ctx && topos_exec_check(ctx, err) != TOPOS_OK) return NULL;
  local_trainer *t = calloc(1, sizeof *t);
  if (!t) {
    error_set(err, TOPOS_ERR_MEMORY, "trainer: out of memory");
    return NULL;
  }
  if (ctx) {
    t->has_ctx = true;
    t->ctx = *ctx;
    if (ctx->backend) {
      t->backend = strdup(ctx->backend);
      if (!t->backend) {
        error_set(err, TOPOS_ERR_MEMORY, "trainer: out of memory");
        local_free(t);
        return NULL;
      }
      t->ctx.backend = t->backend;
    }
  }
  /* The plan's own numerics and threads are the context's, so that what
   * it reports (topos_plan_describe) says how its steps run. */
  topos_entry entry = {.roots = &loss,
                       .nroots = 1,
                       .observes = observes,
                       .nobserves = nobserves,
                       .posture = TOPOS_POSTURE_TRAINING,
                       .numerics = ctx ? ctx->numerics : TOPOS_NUMERICS_EXACT,
                       .threads = ctx ? ctx->threads : 0};
  t->plan = topos_network_lower(net, &entry, err);
  if (!t->plan) {
    local_free(t);
    return NULL;
  }
  return topos_trainer_new(&local_ops, t, err);
}
