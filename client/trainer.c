/*
 * trainer.c - the remote topos_trainer: a training loop written against
 * topos_trainer_step runs on a daemon by swapping the constructor.
 *
 * Each step is one Step RPC (topos_client_step_with) carrying the
 * parameters, the feeds, the optimizer and its state; the daemon keeps
 * nothing between steps, so the results are the local trainer's bits.
 * What of the execution context cannot cross the wire is honoured here:
 * the deadline becomes the call's, the cancel predicate is asked before
 * the call is sent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topos_client.h"
#include "wire.h"

typedef struct remote_trainer {
  topos_client *client; /* borrowed */
  char id[65];
  topos_value loss;
  bool has_exec;
  topos_exec exec;
  char *backend; /* exec.backend's copy */
} remote_trainer;

static void remote_free(void *self) {
  remote_trainer *t = self;
  if (!t) return;
  free(t->backend);
  free(t);
}

static int remote_step(void *self, const topos_params *params,
                       const topos_feed *feeds, int nfeeds,
                       const topos_optimizer *opt, const topos_opt_state *state,
                       topos_step_result *out, topos_error *err) {
  const remote_trainer *t = self;
  topos_client_args args = {.params = params,
                            .feeds = feeds,
                            .nfeeds = nfeeds,
                            .exec = t->has_exec ? &t->exec : NULL};
  const topos_exec *x = args.exec;
  if (x && x->cancel && x->cancel(x->cancel_ctx)) {
    if (err) {
      err->code = TOPOS_ERR_CANCELLED;
      snprintf(err->message, sizeof err->message,
               "trainer step: cancelled before the call");
    }
    return TOPOS_ERR_CANCELLED;
  }
  if (x && x->deadline_ns > 0) {
    int64_t left = x->deadline_ns - topos_now_ns();
    if (left <= 0) {
      if (err) {
        err->code = TOPOS_ERR_DEADLINE;
        snprintf(err->message, sizeof err->message,
                 "trainer step: the deadline passed before the call");
      }
      return TOPOS_ERR_DEADLINE;
    }
    args.deadline_s = (double)left / 1e9;
  }
  int rc = topos_client_step_with(t->client, t->id, t->loss, &args, opt, state,
                                  &out->params, &out->state, &out->loss, err);
  /* The context's deadline ran out on the wire: the local trainer's code,
   * so a loop reads one code whichever trainer it has. */
  if (rc == TOPOS_CLIENT_GRPC_BASE + 4 /* DEADLINE_EXCEEDED */ && x &&
      x->deadline_ns > 0) {
    rc = TOPOS_ERR_DEADLINE;
    if (err) err->code = rc;
  }
  return rc;
}

static const topos_trainer_ops remote_ops = {"remote", remote_step,
                                             remote_free};

topos_trainer *topos_client_trainer(topos_client *c, const char *id,
                                    topos_value loss, const topos_exec *exec,
                                    topos_error *err) {
  const char *bad = !c ? "the client is NULL"
                    : !wire_id_valid(id)
                        ? "the id is not 64 lowercase hex digits"
                    : loss.index < 0            ? "the loss is not a value"
                    : exec && exec->threads < 0 ? "exec threads is negative"
                                                : NULL;
  if (bad) {
    if (err) {
      err->code = TOPOS_ERR_ARGUMENT;
      snprintf(err->message, sizeof err->message, "client trainer: %s", bad);
    }
    return NULL;
  }
  remote_trainer *t = calloc(1, sizeof *t);
  if (t && exec && exec->backend) {
    t->backend = strdup(exec->backend);
    if (!t->backend) {
      free(t);
      t = NULL;
    }
  }
  if (!t) {
    if (err) {
      err->code = TOPOS_ERR_MEMORY;
      snprintf(err->message, sizeof err->message,
               "client trainer: out of memory");
    }
    return NULL;
  }
  t->client = c;
  memcpy(t->id, id, 64);
  t->id[64] = '\0';
  t->loss = loss;
  if (exec) {
    t->has_exec = true;
    t->exec = *exec;
    t->exec.backend = t->backend;
    t->exec.report = NULL; /* nothing fills it over the wire */
  }
  return topos_trainer_new(&remote_ops, t, err);
}
