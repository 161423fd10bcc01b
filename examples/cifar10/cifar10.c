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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "cifar.h"
#include "ex.h"
#include "images.h"

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
  ex_images im;
  model train, stats, eval;
  ex_eval *stats_ev, *ev;
  int64_t stats_batch, stats_batches;
  /* Population statistics for the evaluation network (NLAYERS x C2). */
  float pop_mean[NLAYERS][C2], pop_var[NLAYERS][C2];
} run;

/* The population statistics of every batch-norm layer under params, from
 * the first stats_batches batches of training images (header comment). */
static int population_stats(run *r, const topos_params *params,
                            topos_error *err) {
  double sum[NLAYERS][C2] = {{0}}, sq[NLAYERS][C2] = {{0}},
         vsum[NLAYERS][C2] = {{0}};
  int rc = ex_eval_params(r->stats_ev, params, err);
  for (int64_t k = 0; k < r->stats_batches && rc == TOPOS_OK; k++) {
    ex_images_fill(&r->im, &r->im.train, NULL, k * r->stats_batch,
                   r->stats_batch, r->stats_batch);
    topos_tensor *xt = ex_images_tensor(&r->im, r->stats_batch, err);
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

/* Scores the test set (ex_images_score) with population statistics. */
static int evaluate(void *ctx, const topos_params *params, topos_error *err) {
  run *r = ctx;
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
  int64_t eb = r->im.ntest < EVAL_BATCH ? r->im.ntest : EVAL_BATCH;
  if (rc == TOPOS_OK)
    rc = ex_images_score(&r->im, r->ev, r->eval.x, feeds, 1 + 2 * NLAYERS, eb,
                         err);
  for (int i = 1; i < 1 + 2 * NLAYERS; i++)
    topos_tensor_release((topos_tensor *)feeds[i].tensor);
  return rc;
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
          "[flags]\n%s"
          "  (without --data: a generated set of the CIFAR-10 format)\n%s",
          prog, ex_images_usage, ex_args_usage);
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  ex_args a = {.prog = "cifar10"};
  ex_images_opts o = EX_IMAGES_OPTS;
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(&a, argc, argv, &i);
    if (got == 0) got = ex_images_arg(&o, &a, argc, argv, &i);
    if (got < 0) return 2;
    if (got > 0) continue;
    usage(a.prog);
    return 2;
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
  run r = {.im = {.train = {tr.images, tr.labels, tr.n},
                  .test = {te.images, te.labels, te.n},
                  .channels = CH,
                  .rank = 4,
                  .shape = {0, CH, SIDE, SIDE},
                  .shuffle_seed = SHUFFLE_SEED,
                  .lr = 2e-3,
                  .lr_settle = 2e-4,
                  .evaluate = evaluate}};
  r.im.ctx = &r;
  rc = ex_images_setup(&r.im, &a, &o, EVAL_BATCH, MEAN, STD, rc);
  int64_t ntrain = r.im.ntrain, ntest = r.im.ntest;
  r.stats_batch = ntrain < STATS_BATCH ? ntrain : STATS_BATCH;
  r.stats_batches = r.stats_batch ? ntrain / r.stats_batch : 0;
  if (r.stats_batches > STATS_BATCHES) r.stats_batches = STATS_BATCHES;
  if (rc == 0)
    printf("%lld training images (%d files), %lld test images%s%s\n",
           (long long)ntrain, tr.nfiles, (long long)ntest,
           a.data ? " from " : "", a.data ? a.data : "");

  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "the daemon", &err);
  if (rc == 0 && (model_build(&r.train, NET_TRAIN, o.batch, &err) ||
                  model_build(&r.stats, NET_STATS, r.stats_batch, &err) ||
                  model_build(&r.eval, NET_EVAL,
                              ntest < EVAL_BATCH ? ntest : EVAL_BATCH, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    printf(
        "model: %lld parameters; %lld epochs of %lld steps of %lld "
        "images\n",
        (long long)ex_images_parameter_count(r.train.net), (long long)o.epochs,
        (long long)r.im.per_epoch, (long long)o.batch);
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
  r.im.x = r.train.x;
  r.im.y = r.train.y;
  rc = ex_images_train(&r.im, &a, s, r.train.net, r.train.loss, rc, &err);
  ex_eval_free(r.stats_ev);
  ex_eval_free(r.ev);
  topos_network_release(r.train.net);
  topos_network_release(r.stats.net);
  topos_network_release(r.eval.net);
  ex_session_close(s);
  ex_images_free(&r.im);
  ex_cifar_free(&tr);
  ex_cifar_free(&te);
  if (tmpdir[0] != '\0') nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  return rc;
}
