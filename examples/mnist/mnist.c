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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends.h"
#include "ex.h"
#include "idx.h"
#include "images.h"

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
  ex_images im;
  model train, eval;
  ex_eval *ev;
} run;

/* Scores the test set with params (ex_images_score). */
static int evaluate(void *ctx, const topos_params *params, topos_error *err) {
  run *r = ctx;
  int rc = ex_eval_params(r->ev, params, err);
  if (rc != TOPOS_OK) return rc;
  topos_feed feed;
  return ex_images_score(&r->im, r->ev, r->eval.x, &feed, 1, EVAL_BATCH, err);
}

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--model cnn|mlp] [--epochs N] [--batch N] [--limit N] "
          "[--test-limit N] [flags]\n"
          "  --model cnn|mlp    the network (default cnn)\n%s%s",
          prog, ex_images_usage, ex_args_usage);
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  ex_args a = {.prog = "mnist"};
  model_kind kind = MODEL_CNN;
  ex_images_opts o = EX_IMAGES_OPTS;
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(&a, argc, argv, &i);
    if (got == 0) got = ex_images_arg(&o, &a, argc, argv, &i);
    if (got < 0) return 2;
    if (got > 0) continue;
    const char *flag = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
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
    } else {
      usage(a.prog);
      return 2;
    }
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
  bool cnn = kind == MODEL_CNN;
  run r = {.im = {.train = {tr.images, tr.labels, tr.n},
                  .test = {te.images, te.labels, te.n},
                  .channels = 1,
                  .rank = cnn ? 4 : 2,
                  .shape = {0, cnn ? 1 : PIXELS, SIDE, SIDE},
                  .shuffle_seed = SHUFFLE_SEED,
                  .lr = 1e-3,
                  .lr_settle = 1e-4,
                  .evaluate = evaluate}};
  r.im.ctx = &r;
  rc = ex_images_setup(&r.im, &a, &o, EVAL_BATCH, &PIXEL_MEAN, &PIXEL_STD, rc);
  if (rc == 0)
    printf("%lld training images, %lld test images from %s\n",
           (long long)r.im.ntrain, (long long)r.im.ntest, dir);

  ex_session *s = rc == 0 ? ex_session_open(&a, &err) : NULL;
  if (rc == 0 && s == NULL) rc = ex_fail(&a, "the daemon", &err);
  if (rc == 0 && (model_build(&r.train, kind, o.batch, true, &err) ||
                  model_build(&r.eval, kind, EVAL_BATCH, false, &err)))
    rc = ex_fail(&a, "building the network", &err);
  if (rc == 0) {
    printf(
        "model %s: %lld parameters; %lld epochs of %lld steps of %lld "
        "images\n",
        cnn ? "cnn" : "mlp", (long long)ex_images_parameter_count(r.train.net),
        (long long)o.epochs, (long long)r.im.per_epoch, (long long)o.batch);
    fprintf(stderr, "%s: training %s\n", a.prog, ex_session_where(s));
    r.ev = ex_eval_new(s, r.eval.net, &r.eval.logits, 1, &err);
    if (r.ev == NULL) rc = ex_fail(&a, "preparing evaluation", &err);
  }
  r.im.x = r.train.x;
  r.im.y = r.train.y;
  rc = ex_images_train(&r.im, &a, s, r.train.net, r.train.loss, rc, &err);
  ex_eval_free(r.ev);
  topos_network_release(r.train.net);
  topos_network_release(r.eval.net);
  ex_session_close(s);
  ex_images_free(&r.im);
  ex_mnist_free(&tr);
  ex_mnist_free(&te);
  return rc;
}
