/*
 * makemore_mlp.c - the character-level MLP of Bengio et al. (2003) as
 * taught in Karpathy's makemore, trained on a list of names with topos.
 *
 * Each training example is three characters of context (".." padding at
 * the start of a name) and the character that follows; '.' (0) also ends
 * a name and a-z are 1..26.  The model embeds each context character in
 * 10 dimensions, concatenates them (30), applies a 100-unit tanh layer
 * and predicts the next character among 27 with cross entropy.  The names
 * are split 80/10/10 into train, dev and test sets by a seeded shuffle
 * (examples/common/names.c).  Training is 5000 plain-SGD steps on
 * minibatches of 64 train examples, each drawn by a generator seeded from
 * the step, so every run (and every resumed run) prints the same numbers.
 *
 * Usage: makemore_mlp [--steps N] [common flags: ex.h, --help]
 * Output: a progress line every 500 steps with the dev loss; then
 * "final: mean loss of the last 500 steps = X" (training minibatches),
 * 20 sampled names, and last "final: test loss = X".
 *
 * Training is one loop over topos_trainer_step (ex_loop), whichever
 * trainer runs it: in-process, a training plan lowered once; with
 * --server (or $TOPOS_SERVER), a toposd daemon that stores the network,
 * where every step is one Step call carrying the minibatch, the
 * parameters and the optimizer state.  The daemon keeps nothing between
 * steps and the numbers are bit for bit those of the in-process run.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "ex.h"
#include "names.h"

enum {
  VOCAB = EX_NAMES_VOCAB,
  CONTEXT = 3,
  EMBED = 10,
  HIDDEN = 100,
  BATCH = 64,
  EVAL_BATCH = 4096,
  SAMPLES = 20
};
static const uint64_t SPLIT_SEED = 42, DATA_SEED = 20240601,
                      SAMPLE_SEED = 2147483647;

/* The network: parameters C, W1, b1, W2, b2 (slots 0..4), inputs x and y
 * (y and the loss only in the training network). */
typedef struct model {
  topos_network *net;
  topos_value x, y, logits, loss;
} model;

/*
 * Initialisation follows makemore's "good init": the output layer starts
 * near zero (W2 · 0.01, b2 = 0) so the first loss is log 27 ≈ 3.30 rather
 * than a confident wrong guess, and W1 is He-normal so the tanh units start
 * in their linear range rather than saturated.  Every network built here
 * has the same parameters (same seeds); the batch differs.
 */
static int model_build(model *m, int64_t batch, bool with_loss,
                       topos_error *err) {
  const topos_dtype dt = TOPOS_F32;
  int64_t c_shape[2] = {VOCAB, EMBED};
  int64_t w1_shape[2] = {CONTEXT * EMBED, HIDDEN};
  int64_t b1_shape[1] = {HIDDEN};
  int64_t w2_shape[2] = {HIDDEN, VOCAB};
  int64_t b2_shape[1] = {VOCAB};
  int64_t x_shape[2] = {batch, CONTEXT};
  int64_t y_shape[1] = {batch};
  topos_tensor *init[7] = {
      topos_init_normal(dt, 2, c_shape, 0.0, 1.0, 1, err),
      topos_init_kaiming(dt, 2, w1_shape, CONTEXT * EMBED, 2, err),
      topos_tensor_zeros(dt, 1, b1_shape, err),
      topos_init_normal(dt, 2, w2_shape, 0.0, 0.01, 3, err),
      topos_tensor_zeros(dt, 1, b2_shape, err),
      topos_tensor_zeros(TOPOS_I32, 2, x_shape, err),
      topos_tensor_zeros(TOPOS_I32, 1, y_shape, err),
  };
  int ok = 1;
  for (int i = 0; i < 7; i++) ok = ok && init[i] != NULL;
  topos_tape *tape = ok ? topos_tape_new(dt) : NULL;
  if (tape != NULL) {
    topos_value c = topos_name(tape, topos_parameter(tape, init[0]), "C");
    topos_value w1 = topos_name(tape, topos_parameter(tape, init[1]), "W1");
    topos_value b1 = topos_name(tape, topos_parameter(tape, init[2]), "b1");
    topos_value w2 = topos_name(tape, topos_parameter(tape, init[3]), "W2");
    topos_value b2 = topos_name(tape, topos_parameter(tape, init[4]), "b2");
    m->x = topos_name(tape, topos_input(tape, init[5]), "x");
    /* [B,3] indices -> [B,3,10] embeddings -> [B,30] concatenated. */
    int64_t flat[2] = {batch, CONTEXT * EMBED};
    topos_value emb =
        topos_reshape(tape, topos_embedding(tape, c, m->x), 2, flat);
    topos_value h = topos_tanh(tape, topos_linear(tape, emb, w1, b1));
    m->logits = topos_name(tape, topos_linear(tape, h, w2, b2), "logits");
    if (with_loss) {
      m->y = topos_name(tape, topos_input(tape, init[6]), "y");
      m->loss =
          topos_name(tape, topos_cross_entropy(tape, m->logits, m->y), "loss");
    }
    m->net = topos_tape_seal(tape, err);
  }
  for (int i = 0; i < 7; i++) topos_tensor_release(init[i]);
  return m->net != NULL ? 0 : -1;
}

typedef struct run {
  model train, eval;
  ex_eval *dev;
  const int32_t *x, *y, *dx, *dy;
  int64_t n, dn, steps;
  ex_metrics *metrics;
  double t0, block_sum, window_sum;
  int64_t window, block_n;
} run;

/* lr 0.3, then 0.03 for the last fifth: the large rate covers ground in
 * few steps, the small one settles into the basin it found. */
static double learning_rate(int64_t step, void *ctx) {
  const run *r = ctx;
  return step < r->steps - r->steps / 5 ? 0.3 : 0.03;
}

static int batch(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
                 topos_error *err) {
  run *r = ctx;
  int32_t bx[BATCH * CONTEXT], by[BATCH];
  uint64_t rng = DATA_SEED ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull);
  for (int b = 0; b < BATCH; b++) {
    int64_t k = (int64_t)ex_rand_below(&rng, (uint64_t)r->n);
    memcpy(bx + b * CONTEXT, r->x + k * CONTEXT, sizeof bx[0] * CONTEXT);
    by[b] = r->y[k];
  }
  int64_t x_shape[2] = {BATCH, CONTEXT}, y_shape[1] = {BATCH};
  topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, x_shape, bx, err);
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, y_shape, by, err);
  feeds[0] = (topos_feed){r->train.x, xt};
  feeds[1] = (topos_feed){r->train.y, yt};
  *nfeeds = 2;
  return xt && yt ? TOPOS_OK : err->code;
}

static int after(int64_t step, const topos_params *params, double loss,
                 void *ctx, topos_error *err) {
  run *r = ctx;
  r->block_sum += loss;
  r->block_n++;
  if (step > r->steps - r->window) r->window_sum += loss;
  ex_metrics_row(r->metrics, step, NAN, "train", loss, NAN, ex_now_s() - r->t0);
  if (step % 500 != 0) return TOPOS_OK;
  double dev_loss = 0;
  int rc = ex_eval_params(r->dev, params, err);
  if (rc == TOPOS_OK)
    rc = ex_names_score(r->dev, r->eval.x, 2, CONTEXT, EVAL_BATCH, r->dx, r->dy,
                        r->dn, &dev_loss, NULL, err);
  if (rc != TOPOS_OK) return rc;
  ex_metrics_row(r->metrics, step, NAN, "dev", dev_loss, NAN,
                 ex_now_s() - r->t0);
  printf(
      "step %lld: loss %.4f (mean of the last %lld: %.4f, lr %g), "
      "dev loss %.4f\n",
      (long long)step, loss, (long long)r->block_n,
      r->block_sum / (double)r->block_n, learning_rate(step - 1, r), dev_loss);
  fflush(stdout);
  r->block_sum = 0;
  r->block_n = 0;
  return TOPOS_OK;
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  ex_args a = {.prog = "makemore_mlp"};
  int64_t steps = 5000;
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
    if (ex_names_windows(&d, (ex_split)s, CONTEXT, &x[s], &y[s], &n[s], &err))
      rc = ex_fail(&a, "building examples", &err);
  if (rc == 0)
    printf("%lld examples from %s (%lld dev, %lld test)\n", (long long)n[0],
           path, (long long)n[1], (long long)n[2]);

  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "the daemon", &err);
  run r = {.x = x[0],
           .y = y[0],
           .n = n[0],
           .dx = x[1],
           .dy = y[1],
           .dn = n[1],
           .steps = steps,
           .t0 = ex_now_s()};
  r.window = steps < 500 ? steps : 500;
  model sampler = {0};
  ex_eval *sample = NULL;
  if (rc == 0 && (model_build(&r.train, BATCH, true, &err) ||
                  model_build(&r.eval, EVAL_BATCH, false, &err) ||
                  model_build(&sampler, SAMPLES, false, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    r.dev = ex_eval_new(s, r.eval.net, &r.eval.logits, 1, &err);
    sample =
        r.dev ? ex_eval_new(s, sampler.net, &sampler.logits, 1, &err) : NULL;
    if (sample == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  r.metrics = rc == 0 ? ex_metrics_open(a.metrics, &err) : NULL;
  if (rc == 0 && r.metrics == NULL) rc = ex_fail(&a, "--metrics", &err);

  ex_loop loop = {.args = &a,
                  .session = s,
                  .net = r.train.net,
                  .loss = r.train.loss,
                  .opt = topos_sgd(0.3, 0.0),
                  .steps = steps,
                  .ctx = &r,
                  .lr = learning_rate,
                  .batch = batch,
                  .after = after};
  if (rc == 0 && ex_loop_run(&loop, &err) != TOPOS_OK)
    rc = ex_fail(&a, "training", &err);
  if (rc == 0)
    fprintf(stderr, "%.3f ms/step (%lld steps, %.1f s) %s\n",
            1e3 * loop.seconds / (double)(loop.step ? loop.step : 1),
            (long long)loop.step, loop.seconds, ex_session_where(s));
  if (rc == 0 && !loop.stopped) {
    /* A resumed run saw only its own steps of the window. */
    int64_t seen = loop.step - (steps - r.window);
    if (a.resume == NULL || seen == r.window)
      printf("final: mean loss of the last %lld steps = %.4f\n",
             (long long)r.window, r.window_sum / (double)r.window);
    double test_loss = 0;
    printf("samples:\n");
    if (ex_eval_params(sample, loop.params, &err) ||
        ex_names_sample(sample, sampler.x, 2, CONTEXT, SAMPLES, SAMPLE_SEED,
                        &err) ||
        ex_eval_params(r.dev, loop.params, &err) ||
        ex_names_score(r.dev, r.eval.x, 2, CONTEXT, EVAL_BATCH, x[2], y[2],
                       n[2], &test_loss, NULL, &err)) {
      rc = ex_fail(&a, "evaluating", &err);
    } else {
      ex_metrics_row(r.metrics, loop.step, NAN, "test", test_loss, NAN,
                     ex_now_s() - r.t0);
      printf("final: test loss = %.4f\n", test_loss);
    }
  }
  if (ex_metrics_close(r.metrics, &err) != TOPOS_OK && rc == 0)
    rc = ex_fail(&a, "--metrics", &err);
  ex_loop_clear(&loop);
  ex_eval_free(r.dev);
  ex_eval_free(sample);
  topos_network_release(r.train.net);
  topos_network_release(r.eval.net);
  topos_network_release(sampler.net);
  ex_session_close(s);
  for (int k = 0; k < 3; k++) {
    free(x[k]);
    free(y[k]);
  }
  ex_names_free(&d);
  return rc;
}
