/*
 * makemore_transformer.c - the small GPT of Karpathy's makemore, trained
 * on names with topos: 4 pre-LayerNorm blocks of 4-head causal
 * self-attention and a GELU MLP (4x wide), 64 wide, with learned token
 * and position embeddings and a linear head, over a context of 16 (the
 * longest name, 15 characters, plus the '.' that starts every sequence).
 *
 * Each name is one sequence: x = ". c1 c2 ... cn . . ." and
 * y = "c1 c2 ... cn . -1 -1 ...": every position predicts the next
 * character, the end '.' included, and the padding targets (-1) are
 * ignored by the loss (topos_cross_entropy_ignore).  Training is AdamW
 * (weight decay 0.01, betas 0.9/0.99) on minibatches of 32 train names
 * drawn by a generator seeded from the step, with a linear warmup and a
 * cosine decay of the learning rate (topos_lr_warmup_cosine, a pure
 * function of the step, so resumed runs give the same bits).
 *
 * Usage: makemore_transformer [--steps N] [common flags: ex.h]
 * Output: train and dev loss every 250 steps, 20 sampled names, and last
 * "final: test loss = X" (the mean over every target of the test names).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "ex.h"
#include "gpt.h"
#include "names.h"

/* The network is gpt.h's EX_GPT_MAKEMORE: vocabulary 27, context 16 (the
 * longest name plus the start '.'), width 64, 4 heads of 16, 4 layers. */
enum {
  V = EX_NAMES_VOCAB,
  T = 16,
  BATCH = 32, /* names per step */
  EVAL_BATCH = 256,
  SAMPLES = 20,
  IGNORE = EX_GPT_IGNORE, /* padding targets */
};
static const uint64_t SPLIT_SEED = 42, DATA_SEED = 3407,
                      SAMPLE_SEED = 2147483647;

/* ------------------------------------------------------------- the data */

/* Name w as a sequence: x = ". w", y = "w ." then IGNORE. */
static void encode(const char *w, int32_t *x, int32_t *y) {
  int len = (int)strlen(w);
  if (len > T - 1) len = T - 1; /* longer names are cut (none in names.txt) */
  for (int i = 0; i < T; i++) {
    x[i] = 0;
    y[i] = IGNORE;
  }
  for (int i = 0; i < len; i++) {
    x[i + 1] = ex_names_index((unsigned char)w[i]);
    y[i] = x[i + 1];
  }
  y[len] = 0;
}

typedef struct run {
  const ex_args *args;
  const ex_names *d;
  ex_gpt train, eval;
  ex_eval *dev;
  ex_metrics *metrics;
  int64_t steps, warmup;
  double peak, t0, block_sum;
  int block_n;
} run;

static double learning_rate(int64_t step, void *ctx) {
  const run *r = ctx;
  return topos_lr_warmup_cosine(step, r->warmup, r->steps, r->peak,
                                r->peak / 10);
}

static int batch(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
                 topos_error *err) {
  run *r = ctx;
  int32_t bx[BATCH * T], by[BATCH * T];
  int64_t b0, b1;
  ex_names_range(r->d, EX_TRAIN, &b0, &b1);
  uint64_t rng = DATA_SEED ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull);
  for (int b = 0; b < BATCH; b++) {
    int64_t k = b0 + (int64_t)ex_rand_below(&rng, (uint64_t)(b1 - b0));
    encode(r->d->words[k], bx + b * T, by + b * T);
  }
  int64_t xs[2] = {BATCH, T}, ys[1] = {BATCH * T};
  topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, xs, bx, err);
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, ys, by, err);
  feeds[0] = (topos_feed){r->train.x, xt};
  feeds[1] = (topos_feed){r->train.y, yt};
  *nfeeds = 2;
  return xt && yt ? TOPOS_OK : err->code;
}

/* Mean cross entropy over every non-ignored target of a split. */
static int split_loss(run *r, ex_split split, double *loss, topos_error *err) {
  int64_t b0, b1;
  ex_names_range(r->d, split, &b0, &b1);
  static int32_t bx[EVAL_BATCH * T], by[EVAL_BATCH * T];
  double sum = 0;
  int64_t count = 0;
  int rc = TOPOS_OK;
  for (int64_t at = b0; at < b1 && rc == TOPOS_OK; at += EVAL_BATCH) {
    int64_t rows = b1 - at < EVAL_BATCH ? b1 - at : EVAL_BATCH;
    for (int64_t b = 0; b < EVAL_BATCH; b++)
      encode(b < rows ? r->d->words[at + b] : "", bx + b * T, by + b * T);
    int64_t xs[2] = {EVAL_BATCH, T};
    topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, xs, bx, err);
    if (xt == NULL) return err->code;
    topos_feed feed = {r->eval.x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(r->dev, &feed, 1, &logits, err);
    topos_tensor_release(xt);
    if (rc != TOPOS_OK) break;
    /* Score the real targets only: gather the rows that count. */
    static float lg[EVAL_BATCH * T * V];
    rc = topos_tensor_read(logits, lg, sizeof lg, err);
    topos_tensor_release(logits);
    for (int64_t i = 0; rc == TOPOS_OK && i < rows * T; i++) {
      if (by[i] == IGNORE) continue;
      const float *row = lg + i * V;
      double mx = row[0], s = 0;
      for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
      for (int j = 0; j < V; j++) s += exp((double)row[j] - mx);
      sum += log(s) + mx - row[by[i]];
      count++;
    }
  }
  *loss = count ? sum / (double)count : NAN;
  return rc;
}

static int after(int64_t step, const topos_params *params, double loss,
                 void *ctx, topos_error *err) {
  run *r = ctx;
  r->block_sum += loss;
  r->block_n++;
  ex_metrics_row(r->metrics, step, NAN, "train", loss, NAN, ex_now_s() - r->t0);
  if (step % 250 != 0 && step != r->steps) return TOPOS_OK;
  double dev_loss = 0;
  int rc = ex_eval_params(r->dev, params, err);
  if (rc == TOPOS_OK) rc = split_loss(r, EX_DEV, &dev_loss, err);
  if (rc != TOPOS_OK) return rc;
  ex_metrics_row(r->metrics, step, NAN, "dev", dev_loss, NAN,
                 ex_now_s() - r->t0);
  printf(
      "step %lld: train loss %.4f (mean of the last %d), dev loss %.4f, "
      "lr %.2e\n",
      (long long)step, r->block_sum / r->block_n, r->block_n, dev_loss,
      learning_rate(step - 1, r));
  fflush(stdout);
  r->block_sum = 0;
  r->block_n = 0;
  return TOPOS_OK;
}

/* Samples SAMPLES names at once: each step feeds the prefixes so far and
 * draws position `len`'s next character. */
static int sample(ex_eval *ev, const ex_gpt *m, topos_error *err) {
  int32_t x[SAMPLES * T] = {0};
  char out[SAMPLES][T + 1] = {{0}};
  bool done[SAMPLES] = {0};
  static float lg[SAMPLES * T * V];
  uint64_t rng = SAMPLE_SEED;
  int rc = TOPOS_OK;
  for (int len = 0; len < T - 1 && rc == TOPOS_OK; len++) {
    int64_t xs[2] = {SAMPLES, T};
    topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, xs, x, err);
    if (xt == NULL) return err->code;
    topos_feed feed = {m->x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(ev, &feed, 1, &logits, err);
    topos_tensor_release(xt);
    if (rc == TOPOS_OK) rc = topos_tensor_read(logits, lg, sizeof lg, err);
    topos_tensor_release(logits);
    for (int i = 0; i < SAMPLES && rc == TOPOS_OK; i++) {
      int c = ex_sample_logits(lg + ((size_t)i * T + (size_t)len) * V, V, 1.0,
                               &rng);
      if (done[i]) continue;
      if (c == 0) {
        done[i] = true;
      } else {
        out[i][len] = ex_names_char(c);
        x[i * T + len + 1] = c;
      }
    }
  }
  for (int i = 0; i < SAMPLES && rc == TOPOS_OK; i++) printf("  %s\n", out[i]);
  return rc;
}

int main(int argc, char **argv) {
  topos_backends_register_defaults();
  ex_args a = {.prog = "makemore_transformer"};
  int64_t steps = 5000;
  char path[4096];
  ex_names d;
  int status =
      ex_names_main(&a, argc, argv, &steps, SPLIT_SEED, &d, path, sizeof path);
  if (status != 0) return status;
  topos_error err = {0};
  printf("%lld names from %s (longest %d), %lld/%lld/%lld train/dev/test\n",
         (long long)d.n, path, d.max_len, (long long)d.end[0],
         (long long)(d.end[1] - d.end[0]), (long long)(d.end[2] - d.end[1]));
  int rc = 0;
  ex_session *s = ex_session_open(&a, &err);
  if (s == NULL) rc = ex_fail(&a, "the daemon", &err);
  run r = {.args = &a, .d = &d, .steps = steps, .peak = 1e-3, .t0 = ex_now_s()};
  r.warmup = steps / 20 > 0 ? steps / 20 : 1;
  ex_gpt sampler = {0};
  const ex_gpt_config cfg = EX_GPT_MAKEMORE;
  ex_eval *samp = NULL;
  if (rc == 0 && (ex_gpt_build(&r.train, &cfg, BATCH, true, &err) ||
                  ex_gpt_build(&r.eval, &cfg, EVAL_BATCH, false, &err) ||
                  ex_gpt_build(&sampler, &cfg, SAMPLES, false, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    r.dev = ex_eval_new(s, r.eval.net, &r.eval.logits, 1, &err);
    samp = r.dev ? ex_eval_new(s, sampler.net, &sampler.logits, 1, &err) : NULL;
    if (samp == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  if (rc == 0) {
    int64_t count = 0;
    topos_params *p0 = topos_network_parameters(r.train.net);
    for (int i = 0; p0 && i < topos_params_count(p0); i++)
      count += topos_tensor_count(topos_params_get(p0, i));
    topos_params_free(p0);
    printf("%d layers, %d heads, width %d, context %d: %lld parameters\n",
           cfg.layers, cfg.heads, cfg.width, cfg.context, (long long)count);
  }
  r.metrics = rc == 0 ? ex_metrics_open(a.metrics, &err) : NULL;
  if (rc == 0 && r.metrics == NULL) rc = ex_fail(&a, "--metrics", &err);
  ex_loop loop = {.args = &a,
                  .session = s,
                  .net = r.train.net,
                  .loss = r.train.loss,
                  .opt = topos_adamw(r.peak, 0.9, 0.99, 1e-8, 0.01),
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
    double test_loss = 0;
    printf("samples:\n");
    if (ex_eval_params(samp, loop.params, &err) ||
        sample(samp, &sampler, &err) ||
        ex_eval_params(r.dev, loop.params, &err) ||
        split_loss(&r, EX_TEST, &test_loss, &err)) {
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
  ex_eval_free(samp);
  topos_network_release(r.train.net);
  topos_network_release(r.eval.net);
  topos_network_release(sampler.net);
  ex_session_close(s);
  ex_names_free(&d);
  return rc;
}
