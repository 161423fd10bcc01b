/*
 * cifar10.c - a small convolutional network with batch normalisation
 * trained on CIFAR-10 (the binary batches) with topos.
 *
 * Model (f32): x [B,3,32,32] -> conv 16@3x3 pad 1 -> batch norm -> relu ->
 * max_pool 2 -> conv 32@3x3 pad 1 -> batch norm -> relu -> max_pool 2 ->
 * [B,2048] -> linear 10, cross entropy.  The convolutions have no bias:
 * batch norm's shift (beta) takes its place.  Convolutions start He-normal,
 * the linear layer Glorot; gamma 1, beta 0.
 *
 * Batch normalisation in training is topos_batch_norm: the statistics of
 * the minibatch are computed in the graph and differentiated through.
 * Evaluation uses population statistics instead, so a test image's class
 * does not depend on which images share its batch (and a padded last batch
 * is harmless).  They are not tracked as running averages during training:
 * that would be state carried from step to step outside the parameters,
 * which the checkpoint would have to hold for a resumed run to match.
 * Instead, before each evaluation they are recomputed from the current
 * parameters ("precise BN"): a statistics network with the training form
 * runs over up to 5000 training images in batches of 500 in storage order
 * and returns each layer's batch mean and (biased) variance; the
 * population mean is the mean of the batch means and the variance the
 * mean of the batch variances plus the variance of the batch means (exact
 * for the first layer; the second sees the first normalised by batch
 * statistics, as during training).  The evaluation network then uses
 * topos_batch_norm_inference with those statistics fed as inputs.  They
 * are a pure function of the parameters and the data, held by this
 * program between the two calls: the state stays the caller's, and
 * locally and on a daemon the bits are the same.
 *
 * Pixels are scaled to [0,1] and normalised per channel by CIFAR-10's
 * training means and standard deviations.  Training is Adam (lr 2e-3, a
 * tenth of it for the last third of the steps); every epoch is a seeded
 * shuffle (seed + epoch) and step s takes rows perm[(s mod S)·B .. +B) of
 * its epoch's permutation (the last partial batch dropped), so the
 * minibatch is a pure function of the step and resumed runs are
 * bit-identical.
 *
 * Data: --data DIR with data_batch_1.bin .. data_batch_5.bin and
 * test_batch.bin (cifar-10-batches-bin).  Without --data, since CIFAR-10
 * cannot be downloaded here, it generates a small learnable set in the
 * same format (ex_cifar_generate: 5 files of 400 training images and
 * 1000 test images) into a temporary directory, trains on it through the
 * same loader and removes it at the end.
 *
 * Usage: cifar10 [--epochs N] [--batch N] [--limit N] [--test-limit N]
 *                [common flags: ex.h, --help]
 * Output (stdout, the same locally and with --server): the data, the
 * model's parameter count, "epoch E: train loss X, test loss Y, test
 * accuracy Z" per epoch, last "final: test accuracy = X".  Timings and
 * where it runs go to stderr.
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "cifar.h"
#include "ex.h"

enum {
  CH = EX_CIFAR_CHANNELS,
  SIDE = EX_CIFAR_SIDE,
  IMAGE = EX_CIFAR_IMAGE_BYTES,
  CLASSES = EX_CIFAR_CLASSES,
  C1 = 16,
  C2 = 32,
  FLAT = C2 * 8 * 8,
  EVAL_BATCH = 1000,
  STATS_BATCH = 500,
  STATS_BATCHES = 10,
  NLAYERS = 2,
  /* the generated set */
  GEN_PER_FILE = 400,
  GEN_FILES = 5,
  GEN_TEST = 1000
};
static const uint64_t SHUFFLE_SEED = 20240902, GEN_SEED = 7;
static const double BN_EPS = 1e-5;
/* CIFAR-10's training pixels, scaled to [0,1], per channel. */
static const double MEAN[CH] = {0.4914, 0.4822, 0.4465};
static const double STD[CH] = {0.2470, 0.2435, 0.2616};
static const int WIDTH[NLAYERS] = {C1, C2};

/* The training and statistics networks use batch statistics and expose
 * them (mean[l], var[l]); the evaluation network takes population
 * statistics as inputs (mean_in[l], var_in[l]). */
typedef struct model {
  topos_network *net;
  topos_value x, y, logits, loss;
  topos_value mean[NLAYERS], var[NLAYERS];
  topos_value mean_in[NLAYERS], var_in[NLAYERS];
} model;

typedef enum { NET_TRAIN, NET_STATS, NET_EVAL } net_kind;

static topos_value param(topos_tape *tape, topos_tensor *init,
                         const char *name) {
  if (init == NULL) return TOPOS_NONE;
  topos_value v = topos_name(tape, topos_parameter(tape, init), name);
  topos_tensor_release(init);
  return v;
}

static topos_value input(topos_tape *tape, topos_tensor *init,
                         const char *name) {
  if (init == NULL) return TOPOS_NONE;
  topos_value v = topos_name(tape, topos_input(tape, init), name);
  topos_tensor_release(init);
  return v;
}

/* conv out@3x3 pad 1 (no bias) -> batch norm -> relu -> max_pool 2.
 * Parameter slots are the same in every kind of network. */
static topos_value conv_bn(topos_tape *tape, model *m, net_kind kind, int l,
                           topos_value x, int64_t in, int64_t out,
                           topos_error *err) {
  char wname[16], gname[16], bname[16], mname[16], vname[16];
  snprintf(wname, sizeof wname, "conv%d.w", l + 1);
  snprintf(gname, sizeof gname, "bn%d.gamma", l + 1);
  snprintf(bname, sizeof bname, "bn%d.beta", l + 1);
  snprintf(mname, sizeof mname, "bn%d.mean", l + 1);
  snprintf(vname, sizeof vname, "bn%d.var", l + 1);
  int64_t w_shape[4] = {out, in, 3, 3}, c_shape[1] = {out};
  topos_value w = param(
      tape,
      topos_init_kaiming(TOPOS_F32, 4, w_shape, in * 9, 51 + (uint64_t)l, err),
      wname);
  float one[C2];
  for (int c = 0; c < out; c++) one[c] = 1.0f;
  topos_value gamma =
      param(tape, topos_tensor_from(TOPOS_F32, 1, c_shape, one, err), gname);
  topos_value beta =
      param(tape, topos_tensor_zeros(TOPOS_F32, 1, c_shape, err), bname);
  topos_value h = topos_conv2d(tape, x, w, TOPOS_NONE, 1, 1, 1);
  if (kind == NET_EVAL) {
    m->mean_in[l] =
        input(tape, topos_tensor_zeros(TOPOS_F32, 1, c_shape, err), mname);
    m->var_in[l] =
        input(tape, topos_tensor_zeros(TOPOS_F32, 1, c_shape, err), vname);
    h = topos_batch_norm_inference(tape, h, gamma, beta, m->mean_in[l],
                                   m->var_in[l], BN_EPS);
  } else {
    h = topos_batch_norm(tape, h, gamma, beta, BN_EPS, &m->mean[l], &m->var[l]);
  }
  return topos_max_pool2d(tape, topos_relu(tape, h), 2, 2);
}

static int model_build(model *m, net_kind kind, int64_t batch,
                       topos_error *err) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  if (tape == NULL) {
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "no memory for a tape");
    return -1;
  }
  int64_t x_shape[4] = {batch, CH, SIDE, SIDE}, y_shape[1] = {batch};
  m->x = input(tape, topos_tensor_zeros(TOPOS_F32, 4, x_shape, err), "x");
  topos_value h = conv_bn(tape, m, kind, 0, m->x, CH, C1, err);
  h = conv_bn(tape, m, kind, 1, h, C1, C2, err);
  int64_t flat[2] = {batch, FLAT};
  h = topos_reshape(tape, h, 2, flat);
  int64_t w_shape[2] = {FLAT, CLASSES}, b_shape[1] = {CLASSES};
  topos_value w = param(
      tape, topos_init_xavier(TOPOS_F32, 2, w_shape, FLAT, CLASSES, 53, err),
      "fc.w");
  topos_value b =
      param(tape, topos_tensor_zeros(TOPOS_F32, 1, b_shape, err), "fc.b");
  m->logits = topos_name(tape, topos_linear(tape, h, w, b), "logits");
  if (kind == NET_TRAIN) {
    m->y = input(tape, topos_tensor_zeros(TOPOS_I32, 1, y_shape, err), "y");
    m->loss =
        topos_name(tape, topos_cross_entropy(tape, m->logits, m->y), "loss");
  }
  /* A failed initialiser or op leaves its error on the tape: sealing
   * reports the first one. */
  m->net = topos_tape_seal(tape, err);
  return m->net != NULL ? 0 : -1;
}

typedef struct run {
  model train, stats, eval;
  ex_eval *stats_ev, *ev;
  const ex_cifar *tr, *te;
  int64_t ntrain, ntest, batch, per_epoch, steps;
  int64_t stats_batch, stats_batches;
  int64_t *perm, perm_epoch;
  float lut[CH][256]; /* a pixel byte of channel c -> its normalised value */
  float *xbuf;
  int32_t *ybuf;
  /* Population statistics for the evaluation network (NLAYERS x C2). */
  float pop_mean[NLAYERS][C2], pop_var[NLAYERS][C2];
  ex_metrics *metrics;
  double t0, epoch_t0, loss_sum;
  int64_t loss_n, stepped; /* steps this run took: of the epoch, in all */
  int64_t evaluated_at;    /* the step of the last evaluation, -1: none */
  double test_loss, test_acc;
} run;

static double learning_rate(int64_t step, void *ctx) {
  const run *r = ctx;
  return step < r->steps - r->steps / 3 ? 2e-3 : 2e-4;
}

/* Images idx[first..first+n) (or first.. when idx is NULL) of d into
 * r->xbuf, normalised, labels into r->ybuf; rows n..rows blank, label 0. */
static void fill_rows(run *r, const ex_cifar *d, const int64_t *idx,
                      int64_t first, int64_t n, int64_t rows) {
  for (int64_t b = 0; b < rows; b++) {
    float *dst = r->xbuf + b * IMAGE;
    if (b >= n) {
      memset(dst, 0, sizeof(float) * IMAGE);
      r->ybuf[b] = 0;
      continue;
    }
    int64_t k = idx ? idx[first + b] : first + b;
    const uint8_t *src = d->images + k * IMAGE;
    for (int p = 0; p < IMAGE; p++) dst[p] = r->lut[p / (SIDE * SIDE)][src[p]];
    r->ybuf[b] = d->labels[k];
  }
}

static topos_tensor *images_tensor(const run *r, int64_t rows,
                                   topos_error *err) {
  int64_t shape[4] = {rows, CH, SIDE, SIDE};
  return topos_tensor_from(TOPOS_F32, 4, shape, r->xbuf, err);
}

static int batch(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
                 topos_error *err) {
  run *r = ctx;
  int64_t epoch = step / r->per_epoch, within = step % r->per_epoch;
  if (epoch != r->perm_epoch) {
    ex_shuffle(r->perm, r->ntrain, SHUFFLE_SEED + (uint64_t)epoch);
    r->perm_epoch = epoch;
  }
  fill_rows(r, r->tr, r->perm, within * r->batch, r->batch, r->batch);
  int64_t y_shape[1] = {r->batch};
  topos_tensor *xt = images_tensor(r, r->batch, err);
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, y_shape, r->ybuf, err);
  feeds[0] = (topos_feed){r->train.x, xt};
  feeds[1] = (topos_feed){r->train.y, yt};
  *nfeeds = 2;
  return xt && yt ? TOPOS_OK : err->code;
}

/* The population statistics of every batch-norm layer under params, from
 * the first stats_batches batches of training images (header comment). */
static int population_stats(run *r, const topos_params *params,
                            topos_error *err) {
  double sum[NLAYERS][C2] = {{0}}, sq[NLAYERS][C2] = {{0}},
         vsum[NLAYERS][C2] = {{0}};
  int rc = ex_eval_params(r->stats_ev, params, err);
  for (int64_t k = 0; k < r->stats_batches && rc == TOPOS_OK; k++) {
    fill_rows(r, r->tr, NULL, k * r->stats_batch, r->stats_batch,
              r->stats_batch);
    topos_tensor *xt = images_tensor(r, r->stats_batch, err);
    if (xt == NULL) return err->code;
    topos_feed feed = {r->stats.x, xt};
    topos_tensor *out[2 * NLAYERS] = {0};
    rc = ex_eval_run(r->stats_ev, &feed, 1, out, err);
    topos_tensor_release(xt);
    for (int l = 0; l < NLAYERS && rc == TOPOS_OK; l++) {
      float mean[C2], var[C2];
      size_t bytes = sizeof(float) * (size_t)WIDTH[l];
      rc = topos_tensor_read(out[2 * l], mean, bytes, err);
      if (rc == TOPOS_OK)
        rc = topos_tensor_read(out[2 * l + 1], var, bytes, err);
      for (int c = 0; c < WIDTH[l] && rc == TOPOS_OK; c++) {
        sum[l][c] += mean[c];
        sq[l][c] += (double)mean[c] * mean[c];
        vsum[l][c] += var[c];
      }
    }
    for (int i = 0; i < 2 * NLAYERS; i++) topos_tensor_release(out[i]);
  }
  if (rc != TOPOS_OK) return rc;
  double n = (double)r->stats_batches;
  for (int l = 0; l < NLAYERS; l++)
    for (int c = 0; c < WIDTH[l]; c++) {
      double mean = sum[l][c] / n;
      /* Within-batch variance plus the spread of the batch means. */
      double between = sq[l][c] / n - mean * mean;
      r->pop_mean[l][c] = (float)mean;
      r->pop_var[l][c] = (float)(vsum[l][c] / n + (between > 0 ? between : 0));
    }
  return TOPOS_OK;
}

/* Scores the test set: r->test_loss (mean cross entropy), r->test_acc. */
static int evaluate(run *r, const topos_params *params, topos_error *err) {
  int rc = population_stats(r, params, err);
  if (rc == TOPOS_OK) rc = ex_eval_params(r->ev, params, err);
  if (rc != TOPOS_OK) return rc;
  topos_feed feeds[1 + 2 * NLAYERS];
  for (int l = 0; l < NLAYERS; l++) {
    int64_t c_shape[1] = {WIDTH[l]};
    topos_tensor *m =
        topos_tensor_from(TOPOS_F32, 1, c_shape, r->pop_mean[l], err);
    topos_tensor *v =
        topos_tensor_from(TOPOS_F32, 1, c_shape, r->pop_var[l], err);
    feeds[1 + 2 * l] = (topos_feed){r->eval.mean_in[l], m};
    feeds[2 + 2 * l] = (topos_feed){r->eval.var_in[l], v};
    if (m == NULL || v == NULL) rc = err->code;
  }
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t eb = r->ntest < EVAL_BATCH ? r->ntest : EVAL_BATCH;
  for (int64_t i = 0; i < r->ntest && rc == TOPOS_OK; i += eb) {
    int64_t n = r->ntest - i < eb ? r->ntest - i : eb;
    fill_rows(r, r->te, NULL, i, n, eb);
    topos_tensor *xt = images_tensor(r, eb, err);
    if (xt == NULL) {
      rc = err->code;
      break;
    }
    feeds[0] = (topos_feed){r->eval.x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(r->ev, feeds, 1 + 2 * NLAYERS, &logits, err);
    topos_tensor_release(xt);
    if (rc != TOPOS_OK) break;
    /* Only the real rows: the padding's labels are not the test set's. */
    ex_score(logits, r->ybuf, n, &loss_sum, &correct);
    topos_tensor_release(logits);
  }
  for (int i = 1; i < 1 + 2 * NLAYERS; i++)
    topos_tensor_release((topos_tensor *)feeds[i].tensor);
  if (rc != TOPOS_OK) return rc;
  r->test_loss = loss_sum / (double)r->ntest;
  r->test_acc = (double)correct / (double)r->ntest;
  return TOPOS_OK;
}

static int after(int64_t step, const topos_params *params, double loss,
                 void *ctx, topos_error *err) {
  run *r = ctx;
  r->loss_sum += loss;
  r->loss_n++;
  r->stepped++;
  ex_metrics_row(r->metrics, step, (double)step / (double)r->per_epoch, "train",
                 loss, NAN, ex_now_s() - r->t0);
  if (step % r->per_epoch != 0) return TOPOS_OK;
  /* The epoch comes from the step: a run resumed mid-epoch reports the
   * epoch it finishes, over the steps it took itself. */
  int64_t epoch = step / r->per_epoch;
  double seconds = ex_now_s() - r->epoch_t0;
  int rc = evaluate(r, params, err);
  if (rc != TOPOS_OK) return rc;
  r->evaluated_at = step;
  ex_metrics_row(r->metrics, step, (double)epoch, "test", r->test_loss,
                 r->test_acc, ex_now_s() - r->t0);
  printf("epoch %lld: train loss %.4f, test loss %.4f, test accuracy %.4f",
         (long long)epoch, r->loss_sum / (double)r->loss_n, r->test_loss,
         r->test_acc);
  if (r->loss_n < r->per_epoch)
    printf(" (train loss of the last %lld steps)", (long long)r->loss_n);
  printf("\n");
  fflush(stdout);
  fprintf(stderr, "epoch %lld: %.1f s (%.1f ms/step)\n", (long long)epoch,
          seconds, 1e3 * seconds / (double)r->loss_n);
  r->loss_sum = 0;
  r->loss_n = 0;
  r->epoch_t0 = ex_now_s();
  return TOPOS_OK;
}

static int64_t parameter_count(const topos_network *net) {
  topos_params *p = topos_network_parameters(net);
  int64_t total = 0;
  for (int i = 0; p != NULL && i < topos_params_count(p); i++)
    total += topos_tensor_count(topos_params_get(p, i));
  topos_params_free(p);
  return total;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  if (remove(path) != 0)
    fprintf(stderr, "cifar10: cannot remove %s: %s\n", path, strerror(errno));
  return 0;
}

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--epochs N] [--batch N] [--limit N] [--test-limit N] "
          "[flags]\n"
          "  --epochs N         passes over the training set (default 3)\n"
          "  --batch N          images per step (default 64)\n"
          "  --limit N          train on the first N images only\n"
          "  --test-limit N     score the first N test images only\n"
          "  (without --data: a generated set of the CIFAR-10 format)\n%s",
          prog, ex_args_usage);
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  ex_args a = {.prog = "cifar10"};
  int64_t epochs = 3, bsize = 64, limit = 0, test_limit = 0;
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(&a, argc, argv, &i);
    if (got < 0) return 2;
    if (got > 0) continue;
    const char *flag = argv[i];
    bool has_val = i + 1 < argc;
    int bad = 0;
    if (strcmp(flag, "--epochs") == 0 && has_val) {
      bad = ex_parse_count(&a, flag, argv[++i], 1000, &epochs);
    } else if (strcmp(flag, "--batch") == 0 && has_val) {
      bad = ex_parse_count(&a, flag, argv[++i], 65536, &bsize);
    } else if (strcmp(flag, "--limit") == 0 && has_val) {
      bad = ex_parse_count(&a, flag, argv[++i], INT64_MAX, &limit);
    } else if (strcmp(flag, "--test-limit") == 0 && has_val) {
      bad = ex_parse_count(&a, flag, argv[++i], INT64_MAX, &test_limit);
    } else {
      usage(a.prog);
      return 2;
    }
    if (bad) return 2;
  }
  if (ex_args_done(&a) != 0) return 2;

  topos_error err = {0};
  char tmpdir[4096] = "";
  const char *dir = a.data;
  if (dir == NULL) {
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/topos-cifar10-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
      fprintf(stderr, "%s: cannot create a directory %s: %s\n", a.prog, tmpdir,
              strerror(errno));
      return 1;
    }
    /* The directory's name is random, so it goes to stderr: stdout stays
     * the same from run to run. */
    printf(
        "no --data: CIFAR-10 cannot be downloaded here; training on a "
        "generated set of the same format in a temporary directory\n");
    fprintf(stderr, "%s: generated set in %s (removed at the end)\n", a.prog,
            tmpdir);
    if (ex_cifar_generate(tmpdir, GEN_PER_FILE, GEN_FILES, GEN_TEST, GEN_SEED,
                          &err) != TOPOS_OK) {
      nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
      return ex_fail(&a, "generating a data set", &err);
    }
    dir = tmpdir;
  }
  ex_cifar tr = {0}, te = {0};
  int rc = 0;
  if (ex_cifar_load(dir, true, &tr, &err) != TOPOS_OK ||
      ex_cifar_load(dir, false, &te, &err) != TOPOS_OK)
    rc = ex_fail(&a, "loading the data set", &err);
  run r = {.tr = &tr,
           .te = &te,
           .batch = bsize,
           .perm_epoch = -1,
           .evaluated_at = -1};
  r.ntrain = limit && limit < tr.n ? limit : tr.n;
  r.ntest = test_limit && test_limit < te.n ? test_limit : te.n;
  r.per_epoch = rc == 0 ? r.ntrain / bsize : 0;
  r.steps = r.per_epoch * epochs;
  r.stats_batch = r.ntrain < STATS_BATCH ? r.ntrain : STATS_BATCH;
  r.stats_batches = r.stats_batch ? r.ntrain / r.stats_batch : 0;
  if (r.stats_batches > STATS_BATCHES) r.stats_batches = STATS_BATCHES;
  if (rc == 0 && r.per_epoch == 0) {
    fprintf(stderr, "%s: %lld training images make no batch of %lld\n", a.prog,
            (long long)r.ntrain, (long long)bsize);
    rc = 1;
  }
  for (int c = 0; c < CH; c++)
    for (int v = 0; v < 256; v++)
      r.lut[c][v] = (float)(((double)v / 255.0 - MEAN[c]) / STD[c]);
  int64_t rows = bsize > EVAL_BATCH ? bsize : EVAL_BATCH;
  r.perm = rc == 0 ? malloc(sizeof(int64_t) * (size_t)r.ntrain) : NULL;
  r.xbuf = rc == 0 ? malloc(sizeof(float) * (size_t)(rows * IMAGE)) : NULL;
  r.ybuf = rc == 0 ? malloc(sizeof(int32_t) * (size_t)rows) : NULL;
  if (rc == 0 && (!r.perm || !r.xbuf || !r.ybuf)) {
    fprintf(stderr, "%s: out of memory\n", a.prog);
    rc = 1;
  }
  if (rc == 0)
    printf("%lld training images (%d files), %lld test images%s%s\n",
           (long long)r.ntrain, tr.nfiles, (long long)r.ntest,
           a.data ? " from " : "", a.data ? a.data : "");

  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "the daemon", &err);
  if (rc == 0 &&
      (model_build(&r.train, NET_TRAIN, bsize, &err) ||
       model_build(&r.stats, NET_STATS, r.stats_batch, &err) ||
       model_build(&r.eval, NET_EVAL,
                   r.ntest < EVAL_BATCH ? r.ntest : EVAL_BATCH, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    printf(
        "model: %lld parameters; %lld epochs of %lld steps of %lld "
        "images\n",
        (long long)parameter_count(r.train.net), (long long)epochs,
        (long long)r.per_epoch, (long long)bsize);
    fprintf(stderr, "%s: training %s\n", a.prog, ex_session_where(s));
    topos_value stats_roots[2 * NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
      stats_roots[2 * l] = r.stats.mean[l];
      stats_roots[2 * l + 1] = r.stats.var[l];
    }
    r.stats_ev = ex_eval_new(s, r.stats.net, stats_roots, 2 * NLAYERS, &err);
    r.ev =
        r.stats_ev ? ex_eval_new(s, r.eval.net, &r.eval.logits, 1, &err) : NULL;
    if (r.ev == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  r.metrics = rc == 0 ? ex_metrics_open(a.metrics, &err) : NULL;
  if (rc == 0 && r.metrics == NULL) rc = ex_fail(&a, "--metrics", &err);

  ex_loop loop = {.args = &a,
                  .session = s,
                  .net = r.train.net,
                  .loss = r.train.loss,
                  .opt = topos_adam(2e-3, 0.9, 0.999, 1e-8),
                  .steps = r.steps,
                  .ctx = &r,
                  .lr = learning_rate,
                  .batch = batch,
                  .after = after};
  r.t0 = r.epoch_t0 = ex_now_s();
  if (rc == 0 && ex_loop_run(&loop, &err) != TOPOS_OK)
    rc = ex_fail(&a, "training", &err);
  if (rc == 0)
    fprintf(stderr, "%.3f ms/step (%lld steps, %.1f s) %s\n",
            1e3 * loop.seconds / (double)(r.stepped ? r.stepped : 1),
            (long long)r.stepped, loop.seconds, ex_session_where(s));
  if (rc == 0 && !loop.stopped) {
    /* A run resumed at its end took no step: score what it resumed. */
    if (r.evaluated_at != loop.step) {
      if (evaluate(&r, loop.params, &err) != TOPOS_OK)
        rc = ex_fail(&a, "evaluating", &err);
      else
        ex_metrics_row(r.metrics, loop.step,
                       (double)loop.step / (double)r.per_epoch, "test",
                       r.test_loss, r.test_acc, ex_now_s() - r.t0);
    }
    if (rc == 0) printf("final: test accuracy = %.4f\n", r.test_acc);
  }
  if (r.metrics != NULL && ex_metrics_close(r.metrics, &err) != TOPOS_OK &&
      rc == 0)
    rc = ex_fail(&a, "--metrics", &err);
  ex_loop_clear(&loop);
  ex_eval_free(r.stats_ev);
  ex_eval_free(r.ev);
  topos_network_release(r.train.net);
  topos_network_release(r.stats.net);
  topos_network_release(r.eval.net);
  ex_session_close(s);
  free(r.perm);
  free(r.xbuf);
  free(r.ybuf);
  ex_cifar_free(&tr);
  ex_cifar_free(&te);
  if (tmpdir[0] != '\0') nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  return rc;
}
