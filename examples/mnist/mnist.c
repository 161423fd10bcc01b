/*
 * mnist.c - an image classifier trained on Fashion-MNIST (or MNIST: the
 * same IDX files) with topos: a LeNet-style CNN or a 784-input MLP.
 *
 * Models (f32, cross entropy against the class, layouts as bench/models.h):
 *   cnn  x [B,1,28,28] -> conv 16@5x5 pad 2 -> relu -> max_pool 2 ->
 *        conv 32@5x5 -> relu -> max_pool 2 -> [B,800] -> linear 128 ->
 *        relu -> linear 10.  LeNet-5's shape (bench/models.h) with more
 *        filters (16 and 32 rather than 6 and 16) for headroom over the
 *        0.89 test accuracy three epochs are to reach: it reached 0.9004
 *        (0.8757 and 0.8879 after epochs 1 and 2), about 100 ms a step of
 *        64 on two cores.  The MLP reached 0.8817.
 *   mlp  x [B,784] -> linear 256 -> relu -> linear 256 -> relu ->
 *        linear 10 (bench/models.h's mlp784).
 * Hidden layers start He-normal, the last layer Glorot, biases zero.
 *
 * Pixels are scaled to [0,1] and normalised by Fashion-MNIST's training
 * mean and standard deviation (0.2860, 0.3530), so the first layer sees
 * inputs of unit scale.  Training is Adam (lr 1e-3, a tenth of it for the
 * last third of the steps to settle) on minibatches of --batch images.
 * Every epoch is a seeded shuffle of the training set (seed + epoch); the
 * minibatch of step s is rows perm[(s mod S)·B .. +B) of its epoch's
 * permutation (S whole batches per epoch, the last partial one dropped),
 * a pure function of the step, so a resumed run takes the same steps.
 *
 * After every epoch the test set is scored by an evaluation network of
 * the same parameters and a fixed batch (1000; a last partial batch is
 * padded with blank images and only its real rows are scored), locally
 * or on the daemon (ex_eval).  stdout then gets
 *   epoch E: train loss X, test loss Y, test accuracy Z
 * (X the mean step loss of the epoch's steps this run took) and stderr
 * the epoch's stepping time, which is the only thing that differs
 * between runs: stdout is the same locally and with --server, bit for
 * bit.  The last line is "final: test accuracy = X".
 *
 * Usage: mnist [--model cnn|mlp] [--epochs N] [--batch N] [--limit N]
 *              [--test-limit N] [common flags: ex.h, --help]
 * Data: --data DIR (train-images-idx3-ubyte[.gz] etc.), else the Debian
 * package dataset-fashion-mnist's /usr/share/datasets/fashion-mnist.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends.h"
#include "ex.h"
#include "idx.h"

#define DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

enum {
  SIDE = 28,
  PIXELS = SIDE * SIDE,
  CLASSES = 10,
  EVAL_BATCH = 1000,
  /* the CNN */
  C1 = 16,
  C2 = 32,
  FC = 128,
  FLAT = C2 * 5 * 5,
  /* the MLP */
  HIDDEN = 256
};
static const uint64_t SHUFFLE_SEED = 20240901;
/* Fashion-MNIST's training pixels, scaled to [0,1]: mean and std. */
static const double PIXEL_MEAN = 0.2860, PIXEL_STD = 0.3530;

typedef enum { MODEL_CNN, MODEL_MLP } model_kind;

typedef struct model {
  topos_network *net;
  topos_value x, y, logits, loss;
} model;

/* A named parameter from a new initial tensor (the tape retains it). */
static topos_value param(topos_tape *tape, topos_tensor *init,
                         const char *name) {
  if (init == NULL) return TOPOS_NONE;
  topos_value v = topos_name(tape, topos_parameter(tape, init), name);
  topos_tensor_release(init);
  return v;
}

/* A linear layer [in,out] + [out]: He normal for a layer a relu follows,
 * Glorot for the logits. */
static topos_value linear(topos_tape *tape, topos_value x, int64_t in,
                          int64_t out, bool last, uint64_t seed,
                          const char *wname, const char *bname,
                          topos_error *err) {
  int64_t w_shape[2] = {in, out}, b_shape[1] = {out};
  topos_value w =
      param(tape,
            last ? topos_init_xavier(TOPOS_F32, 2, w_shape, in, out, seed, err)
                 : topos_init_kaiming(TOPOS_F32, 2, w_shape, in, seed, err),
            wname);
  topos_value b =
      param(tape, topos_tensor_zeros(TOPOS_F32, 1, b_shape, err), bname);
  return topos_linear(tape, x, w, b);
}

/* conv out@k×k (He normal [out,in,k,k], zero bias) -> relu -> pool 2. */
static topos_value conv_block(topos_tape *tape, topos_value x, int64_t in,
                              int64_t out, int padding, uint64_t seed,
                              const char *wname, const char *bname,
                              topos_error *err) {
  int64_t w_shape[4] = {out, in, 5, 5}, b_shape[1] = {out};
  topos_value w =
      param(tape, topos_init_kaiming(TOPOS_F32, 4, w_shape, in * 25, seed, err),
            wname);
  topos_value b =
      param(tape, topos_tensor_zeros(TOPOS_F32, 1, b_shape, err), bname);
  topos_value h = topos_relu(tape, topos_conv2d(tape, x, w, b, 1, padding, 1));
  return topos_max_pool2d(tape, h, 2, 2);
}

/* The network for `batch` images; every network built here has the same
 * parameters in the same slots (same seeds), so the training network's
 * parameters run the evaluation network unchanged. */
static int model_build(model *m, model_kind kind, int64_t batch, bool with_loss,
                       topos_error *err) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  if (tape == NULL) {
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "no memory for a tape");
    return -1;
  }
  int64_t x4[4] = {batch, 1, SIDE, SIDE}, x2[2] = {batch, PIXELS};
  int64_t y_shape[1] = {batch};
  bool cnn = kind == MODEL_CNN;
  topos_tensor *x0 =
      topos_tensor_zeros(TOPOS_F32, cnn ? 4 : 2, cnn ? x4 : x2, err);
  topos_tensor *y0 = topos_tensor_zeros(TOPOS_I32, 1, y_shape, err);
  m->x = topos_name(tape, topos_input(tape, x0), "x");
  topos_value h;
  if (cnn) {
    h = conv_block(tape, m->x, 1, C1, 2, 31, "conv1.w", "conv1.b", err);
    h = conv_block(tape, h, C1, C2, 0, 32, "conv2.w", "conv2.b", err);
    int64_t flat[2] = {batch, FLAT};
    h = topos_reshape(tape, h, 2, flat);
    h = topos_relu(tape,
                   linear(tape, h, FLAT, FC, false, 33, "fc1.w", "fc1.b", err));
    h = linear(tape, h, FC, CLASSES, true, 34, "fc2.w", "fc2.b", err);
  } else {
    h = topos_relu(tape, linear(tape, m->x, PIXELS, HIDDEN, false, 41, "fc1.w",
                                "fc1.b", err));
    h = topos_relu(tape, linear(tape, h, HIDDEN, HIDDEN, false, 42, "fc2.w",
                                "fc2.b", err));
    h = linear(tape, h, HIDDEN, CLASSES, true, 43, "fc3.w", "fc3.b", err);
  }
  m->logits = topos_name(tape, h, "logits");
  if (with_loss) {
    m->y = topos_name(tape, topos_input(tape, y0), "y");
    m->loss =
        topos_name(tape, topos_cross_entropy(tape, m->logits, m->y), "loss");
  }
  topos_tensor_release(x0);
  topos_tensor_release(y0);
  /* A failed initialiser or op leaves its error on the tape: sealing
   * reports the first one. */
  m->net = topos_tape_seal(tape, err);
  return m->net != NULL ? 0 : -1;
}

typedef struct run {
  model train, eval;
  model_kind kind;
  ex_eval *ev;
  const ex_mnist *tr, *te;
  int64_t ntrain, ntest, batch, per_epoch, steps;
  int64_t *perm, perm_epoch; /* the permutation of epoch perm_epoch */
  float lut[256];            /* a pixel byte -> its normalised value */
  float *xbuf;               /* one batch of images (train or eval) */
  int32_t *ybuf;
  ex_metrics *metrics;
  double t0, epoch_t0, loss_sum;
  int64_t loss_n, stepped; /* steps this run took: of the epoch, in all */
  int64_t evaluated_at;    /* the step of the last evaluation, -1: none */
  double test_loss, test_acc;
} run;

/* Adam at 1e-3 covers ground; a tenth of it for the last third of the
 * steps settles into the minimum it found. */
static double learning_rate(int64_t step, void *ctx) {
  const run *r = ctx;
  return step < r->steps - r->steps / 3 ? 1e-3 : 1e-4;
}

/* Copies image rows idx[0..n) of d into r->xbuf (normalised) and their
 * labels into r->ybuf; rows n..rows are blank with label 0. */
static void fill_rows(run *r, const ex_mnist *d, const int64_t *idx,
                      int64_t first, int64_t n, int64_t rows) {
  for (int64_t b = 0; b < rows; b++) {
    float *dst = r->xbuf + b * PIXELS;
    if (b >= n) {
      memset(dst, 0, sizeof(float) * PIXELS);
      r->ybuf[b] = 0;
      continue;
    }
    int64_t k = idx ? idx[first + b] : first + b;
    const uint8_t *src = d->images + k * PIXELS;
    for (int p = 0; p < PIXELS; p++) dst[p] = r->lut[src[p]];
    r->ybuf[b] = d->labels[k];
  }
}

/* The input tensor of `rows` images of r->xbuf in the model's layout. */
static topos_tensor *images_tensor(const run *r, int64_t rows,
                                   topos_error *err) {
  int64_t x4[4] = {rows, 1, SIDE, SIDE}, x2[2] = {rows, PIXELS};
  bool cnn = r->kind == MODEL_CNN;
  return topos_tensor_from(TOPOS_F32, cnn ? 4 : 2, cnn ? x4 : x2, r->xbuf, err);
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

/* Scores the test set with params: r->test_loss (mean cross entropy) and
 * r->test_acc. */
static int evaluate(run *r, const topos_params *params, topos_error *err) {
  int rc = ex_eval_params(r->ev, params, err);
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < r->ntest && rc == TOPOS_OK; i += EVAL_BATCH) {
    int64_t n = r->ntest - i < EVAL_BATCH ? r->ntest - i : EVAL_BATCH;
    fill_rows(r, r->te, NULL, i, n, EVAL_BATCH);
    topos_tensor *xt = images_tensor(r, EVAL_BATCH, err);
    if (xt == NULL) return err->code;
    topos_feed feed = {r->eval.x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(r->ev, &feed, 1, &logits, err);
    topos_tensor_release(xt);
    if (rc != TOPOS_OK) break;
    /* Only the real rows: the padding's labels are not the test set's. */
    ex_score(logits, r->ybuf, n, &loss_sum, &correct);
    topos_tensor_release(logits);
  }
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
  double epoch_f = (double)step / (double)r->per_epoch;
  ex_metrics_row(r->metrics, step, epoch_f, "train", loss, NAN,
                 ex_now_s() - r->t0);
  if (step % r->per_epoch != 0) return TOPOS_OK;
  /* The epoch is derived from the step, so a run resumed mid-epoch still
   * reports the epoch it finishes (over the steps it took itself). */
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
  r->epoch_t0 = ex_now_s(); /* the loop does not count evaluation time */
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

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--model cnn|mlp] [--epochs N] [--batch N] [--limit N] "
          "[--test-limit N] [flags]\n"
          "  --model cnn|mlp    the network (default cnn)\n"
          "  --epochs N         passes over the training set (default 3)\n"
          "  --batch N          images per step (default 64)\n"
          "  --limit N          train on the first N images only\n"
          "  --test-limit N     score the first N test images only\n%s",
          prog, ex_args_usage);
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  ex_args a = {.prog = "mnist"};
  model_kind kind = MODEL_CNN;
  int64_t epochs = 3, bsize = 64, limit = 0, test_limit = 0;
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(&a, argc, argv, &i);
    if (got < 0) return 2;
    if (got > 0) continue;
    const char *flag = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (strcmp(flag, "--model") == 0 && val != NULL) {
      i++;
      if (strcmp(val, "cnn") == 0) {
        kind = MODEL_CNN;
      } else if (strcmp(val, "mlp") == 0) {
        kind = MODEL_MLP;
      } else {
        fprintf(stderr, "%s: --model is cnn or mlp, not '%s'\n", a.prog, val);
        return 2;
      }
    } else if (strcmp(flag, "--epochs") == 0 && val != NULL) {
      bad = ex_parse_count(&a, flag, argv[++i], 1000, &epochs);
    } else if (strcmp(flag, "--batch") == 0 && val != NULL) {
      bad = ex_parse_count(&a, flag, argv[++i], 65536, &bsize);
    } else if (strcmp(flag, "--limit") == 0 && val != NULL) {
      bad = ex_parse_count(&a, flag, argv[++i], INT64_MAX, &limit);
    } else if (strcmp(flag, "--test-limit") == 0 && val != NULL) {
      bad = ex_parse_count(&a, flag, argv[++i], INT64_MAX, &test_limit);
    } else {
      usage(a.prog);
      return 2;
    }
    if (bad) return 2;
  }
  if (ex_args_done(&a) != 0) return 2;

  const char *dir = a.data ? a.data : DEFAULT_DIR;
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr,
            "%s: no data set directory %s: install dataset-fashion-mnist "
            "(make deps) or give --data DIR\n",
            a.prog, dir);
    return 1;
  }
  topos_error err = {0};
  ex_mnist tr = {0}, te = {0};
  if (ex_mnist_load(dir, true, &tr, &err) != TOPOS_OK ||
      ex_mnist_load(dir, false, &te, &err) != TOPOS_OK) {
    ex_mnist_free(&tr);
    return ex_fail(&a, "loading the data set", &err);
  }
  int rc = 0;
  if (tr.rows != SIDE || tr.cols != SIDE || te.rows != SIDE ||
      te.cols != SIDE) {
    fprintf(stderr,
            "%s: %s: images are %lldx%lld (train), %lldx%lld (test), "
            "not 28x28\n",
            a.prog, dir, (long long)tr.rows, (long long)tr.cols,
            (long long)te.rows, (long long)te.cols);
    rc = 1;
  }
  run r = {.kind = kind,
           .tr = &tr,
           .te = &te,
           .batch = bsize,
           .perm_epoch = -1,
           .evaluated_at = -1};
  r.ntrain = limit && limit < tr.n ? limit : tr.n;
  r.ntest = test_limit && test_limit < te.n ? test_limit : te.n;
  r.per_epoch = r.ntrain / bsize;
  r.steps = r.per_epoch * epochs;
  if (rc == 0 && r.per_epoch == 0) {
    fprintf(stderr, "%s: %lld training images make no batch of %lld\n", a.prog,
            (long long)r.ntrain, (long long)bsize);
    rc = 1;
  }
  for (int v = 0; v < 256; v++)
    r.lut[v] = (float)(((double)v / 255.0 - PIXEL_MEAN) / PIXEL_STD);
  int64_t rows = bsize > EVAL_BATCH ? bsize : EVAL_BATCH;
  r.perm = rc == 0 ? malloc(sizeof(int64_t) * (size_t)r.ntrain) : NULL;
  r.xbuf = rc == 0 ? malloc(sizeof(float) * (size_t)(rows * PIXELS)) : NULL;
  r.ybuf = rc == 0 ? malloc(sizeof(int32_t) * (size_t)rows) : NULL;
  if (rc == 0 && (!r.perm || !r.xbuf || !r.ybuf)) {
    fprintf(stderr, "%s: out of memory\n", a.prog);
    rc = 1;
  }
  if (rc == 0)
    printf("%lld training images, %lld test images from %s\n",
           (long long)r.ntrain, (long long)r.ntest, dir);

  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "the daemon", &err);
  if (rc == 0 && (model_build(&r.train, kind, bsize, true, &err) ||
                  model_build(&r.eval, kind, EVAL_BATCH, false, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    printf(
        "model %s: %lld parameters; %lld epochs of %lld steps of %lld "
        "images\n",
        kind == MODEL_CNN ? "cnn" : "mlp",
        (long long)parameter_count(r.train.net), (long long)epochs,
        (long long)r.per_epoch, (long long)bsize);
    fprintf(stderr, "%s: training %s\n", a.prog, ex_session_where(s));
    r.ev = ex_eval_new(s, r.eval.net, &r.eval.logits, 1, &err);
    if (r.ev == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  r.metrics = rc == 0 ? ex_metrics_open(a.metrics, &err) : NULL;
  if (rc == 0 && r.metrics == NULL) rc = ex_fail(&a, "--metrics", &err);

  ex_loop loop = {.args = &a,
                  .session = s,
                  .net = r.train.net,
                  .loss = r.train.loss,
                  .opt = topos_adam(1e-3, 0.9, 0.999, 1e-8),
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
  if (ex_metrics_close(r.metrics, &err) != TOPOS_OK && rc == 0)
    rc = ex_fail(&a, "--metrics", &err);
  ex_loop_clear(&loop);
  ex_eval_free(r.ev);
  topos_network_release(r.train.net);
  topos_network_release(r.eval.net);
  ex_session_close(s);
  free(r.perm);
  free(r.xbuf);
  free(r.ybuf);
  ex_mnist_free(&tr);
  ex_mnist_free(&te);
  return rc;
}
