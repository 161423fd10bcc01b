/*
 * makemore_bigram.c - the bigram character model of Karpathy's makemore,
 * two ways: by counting (a 27x27 table of pair counts, add-one smoothed)
 * and by gradient descent (a 27x27 table of logits W, trained with cross
 * entropy through topos).  Both should land on the same loss: the
 * gradient-trained table converges to the log of the counted one.
 *
 * The names are split 80/10/10 into train, dev and test sets by a seeded
 * shuffle (examples/common/names.c); both models learn from the train set,
 * report dev loss as they go and test loss at the end, and sample 20
 * names.
 *
 * Usage: makemore_bigram [--steps N] [common flags: ex.h]
 * Output: the counting model's losses, a line per 100 steps of training,
 * 20 samples, and last "final: test loss = X" (the trained model).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "ex.h"
#include "names.h"

enum { V = EX_NAMES_VOCAB, BATCH = 4096, EVAL_BATCH = 8192, SAMPLES = 20 };
static const uint64_t SPLIT_SEED = 42, DATA_SEED = 20240602,
                      SAMPLE_SEED = 2147483647;

/* ------------------------------------------------------------- counting */

/* Mean negative log likelihood of n pairs under P. */
static double count_loss(const double P[V][V], const int32_t *x,
                         const int32_t *y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s -= log(P[x[i]][y[i]]);
  return s / (double)n;
}

/* --------------------------------------------------------------- trained */

typedef struct net {
  topos_network *net;
  topos_value x, y, logits, loss;
} net;

/* W [27,27]; x [batch] -> logits = W[x] (one-hot times W is a row lookup);
 * with a loss: cross entropy against y plus 0.01 mean(W^2), makemore's
 * smoothing by regularisation. */
static int build(net *m, int64_t batch, bool with_loss, topos_error *err) {
  int64_t w_shape[2] = {V, V}, x_shape[1] = {batch};
  topos_tensor *w0 = topos_init_normal(TOPOS_F32, 2, w_shape, 0.0, 1.0, 7, err);
  topos_tensor *x0 = topos_tensor_zeros(TOPOS_I32, 1, x_shape, err);
  topos_tape *tape = w0 && x0 ? topos_tape_new(TOPOS_F32) : NULL;
  if (tape != NULL) {
    topos_value w = topos_name(tape, topos_parameter(tape, w0), "W");
    m->x = topos_name(tape, topos_input(tape, x0), "x");
    m->logits = topos_name(tape, topos_embedding(tape, w, m->x), "logits");
    if (with_loss) {
      m->y = topos_name(tape, topos_input(tape, x0), "y");
      topos_value ce = topos_cross_entropy(tape, m->logits, m->y);
      topos_value reg = topos_mul(tape, topos_sum(tape, topos_mul(tape, w, w)),
                                  topos_scalar(tape, 0.01 / (V * V)));
      m->loss = topos_name(tape, topos_add(tape, ce, reg), "loss");
    }
    m->net = topos_tape_seal(tape, err);
  }
  topos_tensor_release(w0);
  topos_tensor_release(x0);
  return m->net ? TOPOS_OK : -1;
}

typedef struct run {
  const ex_args *args;
  net train;
  const int32_t *x, *y;
  int64_t n;
  ex_eval *dev;
  topos_value dev_x;
  const int32_t *dx, *dy;
  int64_t dn;
  ex_metrics *metrics;
  int64_t steps;
  double t0;
} run;

/* Each step's minibatch is drawn by a generator seeded from the step, so
 * a resumed run draws what an uninterrupted one would. */
static int batch(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
                 topos_error *err) {
  run *r = ctx;
  int32_t bx[BATCH], by[BATCH];
  uint64_t rng = DATA_SEED ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull);
  for (int b = 0; b < BATCH; b++) {
    int64_t k = (int64_t)ex_rand_below(&rng, (uint64_t)r->n);
    bx[b] = r->x[k];
    by[b] = r->y[k];
  }
  int64_t shape[1] = {BATCH};
  topos_tensor *xt = topos_tensor_from(TOPOS_I32, 1, shape, bx, err);
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, shape, by, err);
  feeds[0] = (topos_feed){r->train.x, xt};
  feeds[1] = (topos_feed){r->train.y, yt};
  *nfeeds = 2;
  return xt && yt ? TOPOS_OK : err->code;
}

/* makemore trains the bigram with a large rate: the loss is convex. */
static double lr(int64_t step, void *ctx) {
  run *r = ctx;
  return step < r->steps - r->steps / 5 ? 50.0 : 5.0;
}

static int after(int64_t step, const topos_params *params, double loss,
                 void *ctx, topos_error *err) {
  run *r = ctx;
  ex_metrics_row(r->metrics, step, NAN, "train", loss, NAN, ex_now_s() - r->t0);
  if (step % 100 != 0 && step != r->steps) return TOPOS_OK;
  double dev_loss = 0;
  int rc = ex_eval_params(r->dev, params, err);
  if (rc == TOPOS_OK)
    rc = ex_names_score(r->dev, r->dev_x, 1, 1, EVAL_BATCH, r->dx, r->dy, r->dn,
                        &dev_loss, NULL, err);
  if (rc != TOPOS_OK) return rc;
  ex_metrics_row(r->metrics, step, NAN, "dev", dev_loss, NAN,
                 ex_now_s() - r->t0);
  printf("step %lld: train loss %.4f, dev loss %.4f\n", (long long)step, loss,
         dev_loss);
  fflush(stdout);
  return TOPOS_OK;
}

int main(int argc, char **argv) {
  topos_backends_register_defaults();
  ex_args a = {.prog = "makemore_bigram"};
  int64_t steps = 500;
  char path[4096];
  ex_names d;
  int status =
      ex_names_main(&a, argc, argv, &steps, SPLIT_SEED, &d, path, sizeof path);
  if (status != 0) return status;
  topos_error err = {0};
  int32_t *x[3] = {0}, *y[3] = {0};
  int64_t n[3] = {0};
  int rc = 0;
  for (int s = 0; s < 3 && rc == 0; s++)
    if (ex_names_windows(&d, (ex_split)s, 1, &x[s], &y[s], &n[s], &err))
      rc = ex_fail(&a, "building pairs", &err);
  if (rc == 0)
    printf("%lld names from %s: %lld/%lld/%lld train/dev/test bigrams\n",
           (long long)d.n, path, (long long)n[0], (long long)n[1],
           (long long)n[2]);

  /* Counting: add-one smoothed pair frequencies. */
  static double P[V][V];
  if (rc == 0) {
    static double N[V][V];
    for (int64_t i = 0; i < n[EX_TRAIN]; i++) N[x[0][i]][y[0][i]] += 1;
    for (int i = 0; i < V; i++) {
      double row = 0;
      for (int j = 0; j < V; j++) row += N[i][j] + 1;
      for (int j = 0; j < V; j++) P[i][j] = (N[i][j] + 1) / row;
    }
    printf("counting: train loss %.4f, dev loss %.4f, test loss %.4f\n",
           count_loss(P, x[0], y[0], n[0]), count_loss(P, x[1], y[1], n[1]),
           count_loss(P, x[2], y[2], n[2]));
  }

  /* Gradient descent on W. */
  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "connecting", &err);
  net train = {0}, eval = {0}, sampler = {0};
  if (rc == 0 && (build(&train, BATCH, true, &err) ||
                  build(&eval, EVAL_BATCH, false, &err) ||
                  build(&sampler, SAMPLES, false, &err)))
    rc = ex_fail(&a, "building the network", &err);
  ex_eval *dev = NULL, *sample = NULL;
  if (rc == 0) {
    dev = ex_eval_new(s, eval.net, &eval.logits, 1, &err);
    sample = dev ? ex_eval_new(s, sampler.net, &sampler.logits, 1, &err) : NULL;
    if (sample == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  ex_metrics *metrics = rc == 0 ? ex_metrics_open(a.metrics, &err) : NULL;
  if (rc == 0 && metrics == NULL) rc = ex_fail(&a, "--metrics", &err);
  if (rc == 0)
    printf("training %lld steps of %d pairs\n", (long long)steps, BATCH);
  run r = {.args = &a,
           .train = train,
           .x = x[0],
           .y = y[0],
           .n = n[0],
           .dev = dev,
           .dev_x = eval.x,
           .dx = x[1],
           .dy = y[1],
           .dn = n[1],
           .metrics = metrics,
           .steps = steps,
           .t0 = ex_now_s()};
  ex_loop loop = {.args = &a,
                  .session = s,
                  .net = train.net,
                  .loss = train.loss,
                  .opt = topos_sgd(50.0, 0.0),
                  .steps = steps,
                  .ctx = &r,
                  .lr = lr,
                  .batch = batch,
                  .after = after};
  if (rc == 0 && ex_loop_run(&loop, &err) != TOPOS_OK)
    rc = ex_fail(&a, "training", &err);
  if (rc == 0) {
    fprintf(stderr, "%.3f ms/step (%lld steps, %.1f s, %s)\n",
            1e3 * loop.seconds / (double)(loop.step ? loop.step : 1),
            (long long)loop.step, loop.seconds, ex_session_where(s));
  }
  if (rc == 0 && !loop.stopped) {
    double test_loss = 0;
    printf("samples:\n");
    if (ex_eval_params(sample, loop.params, &err) ||
        ex_names_sample(sample, sampler.x, 1, 1, SAMPLES, SAMPLE_SEED, &err) ||
        ex_eval_params(dev, loop.params, &err) ||
        ex_names_score(dev, eval.x, 1, 1, EVAL_BATCH, x[2], y[2], n[2],
                       &test_loss, NULL, &err)) {
      rc = ex_fail(&a, "evaluating", &err);
    } else {
      ex_metrics_row(metrics, loop.step, NAN, "test", test_loss, NAN,
                     ex_now_s() - r.t0);
      printf("final: test loss = %.4f\n", test_loss);
    }
  }
  if (ex_metrics_close(metrics, &err) != TOPOS_OK && rc == 0)
    rc = ex_fail(&a, "--metrics", &err);
  ex_loop_clear(&loop);
  ex_eval_free(dev);
  ex_eval_free(sample);
  topos_network_release(train.net);
  topos_network_release(eval.net);
  topos_network_release(sampler.net);
  ex_session_close(s);
  for (int k = 0; k < 3; k++) {
    free(x[k]);
    free(y[k]);
  }
  ex_names_free(&d);
  return rc;
}
