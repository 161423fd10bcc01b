/*
 * images.h - what the image classifiers (examples/mnist, examples/cifar10)
 * share: their flags (--epochs, --batch, --limit, --test-limit), the
 * minibatch of a step from a seeded shuffle of the training set, scoring
 * the test set in padded batches, the per-epoch report and the training
 * run itself (ex_loop with Adam, the final evaluation, metrics).
 *
 * Every epoch is a seeded shuffle of the training set (shuffle_seed +
 * epoch); the minibatch of step s is rows perm[(s mod S)·B .. +B) of its
 * epoch's permutation (S whole batches per epoch, the last partial one
 * dropped), a pure function of the step, so a resumed run takes the same
 * steps.  After every epoch the example's evaluate scores the test set
 * (ex_images_score) and stdout gets
 *   epoch E: train loss X, test loss Y, test accuracy Z
 * (X the mean step loss of the epoch's steps this run took), stderr the
 * epoch's stepping time; the last line is "final: test accuracy = X".
 */
#ifndef EX_IMAGES_H
#define EX_IMAGES_H

#include <stdint.h>

#include "ex.h"
#include "topos.h"

enum { EX_IMAGES_MAX_CHANNELS = 3 };

/* The shared flags, with their defaults in EX_IMAGES_OPTS. */
typedef struct ex_images_opts {
  int64_t epochs, batch, limit, test_limit; /* limit 0: all */
} ex_images_opts;
#define EX_IMAGES_OPTS ((ex_images_opts){.epochs = 3, .batch = 64})

/* Consumes argv[*i] (and its value) when it is a shared flag: 1; not one
 * of them: 0; a bad value (reported): -1, a usage error. */
int ex_images_arg(ex_images_opts *o, const ex_args *a, int argc, char **argv,
                  int *i);
/* The shared flags' lines of a usage message. */
extern const char ex_images_usage[];

/* A split: n images of the layout's bytes each, and their labels. */
typedef struct ex_images_set {
  const uint8_t *images, *labels;
  int64_t n;
} ex_images_set;

typedef struct ex_images {
  /* Set by the example before ex_images_setup. */
  ex_images_set train, test;
  int channels;     /* planes of an image, each normalised on its own */
  int rank;         /* of the networks' input */
  int64_t shape[4]; /* the input's shape; shape[0] (rows) is set per use */
  uint64_t shuffle_seed;
  double lr, lr_settle; /* Adam's rate, and for the last third of steps */
  topos_value x, y;     /* the training network's inputs */
  /* Scores the test set under params into test_loss and test_acc. */
  int (*evaluate)(void *ctx, const topos_params *params, topos_error *err);
  void *ctx;
  /* Set by ex_images_setup. */
  int64_t image; /* values of one image */
  int64_t ntrain, ntest, batch, per_epoch, steps;
  int64_t *perm, perm_epoch; /* the permutation of epoch perm_epoch */
  float lut[EX_IMAGES_MAX_CHANNELS][256]; /* byte of plane c -> value */
  float *xbuf;                            /* one batch of images */
  int32_t *ybuf;
  /* The run's. */
  ex_metrics *metrics;
  double t0, epoch_t0, loss_sum;
  int64_t loss_n, stepped; /* steps this run took: of the epoch, in all */
  int64_t evaluated_at;    /* the step of the last evaluation, -1: none */
  double test_loss, test_acc;
} ex_images;

/* Sizes the run from o (limits, steps), builds the pixel table (plane c:
 * (v/255 - mean[c]) / std[c]) and the buffers for batches of up to
 * max(o->batch, eval_rows) images.  rc is the example's status so far;
 * returns it, or 1 after reporting a training set without a whole batch
 * or no memory (only when rc was 0). */
int ex_images_setup(ex_images *im, const ex_args *a, const ex_images_opts *o,
                    int64_t eval_rows, const double *mean, const double *std,
                    int rc);
void ex_images_free(ex_images *im);

/* Images idx[first..first+n) (or first.. when idx is NULL) of d into
 * im->xbuf, normalised, labels into im->ybuf; rows n..rows blank, label 0. */
void ex_images_fill(ex_images *im, const ex_images_set *d, const int64_t *idx,
                    int64_t first, int64_t n, int64_t rows);
/* The input tensor of `rows` images of im->xbuf. */
topos_tensor *ex_images_tensor(const ex_images *im, int64_t rows,
                               topos_error *err);

/* Scores the test set in batches of `rows` (a last partial batch padded
 * with blank images, only its real rows scored) with ev, whose input x
 * goes in feeds[0] (feeds[1..nfeeds) are the caller's): im->test_loss
 * (mean cross entropy) and im->test_acc. */
int ex_images_score(ex_images *im, ex_eval *ev, topos_value x,
                    topos_feed *feeds, int nfeeds, int64_t rows,
                    topos_error *err);

/* The number of parameter values of net. */
int64_t ex_images_parameter_count(const topos_network *net);

/* Opens --metrics and trains net's loss with Adam (ex_loop, the callbacks
 * here), reports the time per step, scores a run resumed at its end and
 * prints the final line; closes the metrics.  rc is the example's status
 * so far (nothing runs unless 0); returns the status. */
int ex_images_train(ex_images *im, const ex_args *a, ex_session *s,
                    const topos_network *net, topos_value loss, int rc,
                    topos_error *err);

#endif
