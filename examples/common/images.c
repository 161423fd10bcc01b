/*
 * images.c - the image classifiers' shared run (see images.h).
 */
#include "images.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char ex_images_usage[] =
    "  --epochs N         passes over the training set (default 3)\n"
    "  --batch N          images per step (default 64)\n"
    "  --limit N          train on the first N images only\n"
    "  --test-limit N     score the first N test images only\n";

int ex_images_arg(ex_images_opts *o, const ex_args *a, int argc, char **argv,
                  int *i) {
  const char *flag = argv[*i];
  if (*i + 1 >= argc) return 0;
  int64_t *dst, max;
  if (strcmp(flag, "--epochs") == 0) {
    dst = &o->epochs, max = 1000;
  } else if (strcmp(flag, "--batch") == 0) {
    dst = &o->batch, max = 65536;
  } else if (strcmp(flag, "--limit") == 0) {
    dst = &o->limit, max = INT64_MAX;
  } else if (strcmp(flag, "--test-limit") == 0) {
    dst = &o->test_limit, max = INT64_MAX;
  } else {
    return 0;
  }
  return ex_parse_count(a, flag, argv[++*i], max, dst) ? -1 : 1;
}

int ex_images_setup(ex_images *im, const ex_args *a, const ex_images_opts *o,
                    int64_t eval_rows, const double *mean, const double *std,
                    int rc) {
  im->batch = o->batch;
  im->perm_epoch = -1;
  im->evaluated_at = -1;
  im->image = 1;
  for (int d = 1; d < im->rank; d++) im->image *= im->shape[d];
  im->ntrain = o->limit && o->limit < im->train.n ? o->limit : im->train.n;
  im->ntest =
      o->test_limit && o->test_limit < im->test.n ? o->test_limit : im->test.n;
  im->per_epoch = im->ntrain / o->batch;
  im->steps = im->per_epoch * o->epochs;
  if (rc == 0 && im->per_epoch == 0) {
    fprintf(stderr, "%s: %lld training images make no batch of %lld\n", a->prog,
            (long long)im->ntrain, (long long)o->batch);
    rc = 1;
  }
  for (int c = 0; c < im->channels; c++)
    for (int v = 0; v < 256; v++)
      im->lut[c][v] = (float)(((double)v / 255.0 - mean[c]) / std[c]);
  int64_t rows = o->batch > eval_rows ? o->batch : eval_rows;
  im->perm = rc == 0 ? malloc(sizeof(int64_t) * (size_t)im->ntrain) : NULL;
  im->xbuf =
      rc == 0 ? malloc(sizeof(float) * (size_t)(rows * im->image)) : NULL;
  im->ybuf = rc == 0 ? malloc(sizeof(int32_t) * (size_t)rows) : NULL;
  if (rc == 0 && (!im->perm || !im->xbuf || !im->ybuf)) {
    fprintf(stderr, "%s: out of memory\n", a->prog);
    rc = 1;
  }
  return rc;
}

void ex_images_free(ex_images *im) {
  free(im->perm);
  free(im->xbuf);
  free(im->ybuf);
  im->perm = NULL;
  im->xbuf = NULL;
  im->ybuf = NULL;
}

void ex_images_fill(ex_images *im, const ex_images_set *d, const int64_t *idx,
                    int64_t first, int64_t n, int64_t rows) {
  int64_t plane = im->image / im->channels;
  for (int64_t b = 0; b < rows; b++) {
    float *dst = im->xbuf + b * im->image;
    if (b >= n) {
      memset(dst, 0, sizeof(float) * (size_t)im->image);
      im->ybuf[b] = 0;
      continue;
    }
    int64_t k = idx ? idx[first + b] : first + b;
    const uint8_t *src = d->images + k * im->image;
    for (int c = 0; c < im->channels; c++)
      for (int64_t p = c * plane; p < (c + 1) * plane; p++)
        dst[p] = im->lut[c][src[p]];
    im->ybuf[b] = d->labels[k];
  }
}

topos_tensor *ex_images_tensor(const ex_images *im, int64_t rows,
                               topos_error *err) {
  int64_t shape[4];
  memcpy(shape, im->shape, sizeof shape);
  shape[0] = rows;
  return topos_tensor_from(TOPOS_F32, im->rank, shape, im->xbuf, err);
}

/* Adam's rate covers ground; a tenth of it for the last third of the
 * steps settles into the minimum it found. */
static double learning_rate(int64_t step, void *ctx) {
  const ex_images *im = ctx;
  return step < im->steps - im->steps / 3 ? im->lr : im->lr_settle;
}

static int batch(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
                 topos_error *err) {
  ex_images *im = ctx;
  int64_t epoch = step / im->per_epoch, within = step % im->per_epoch;
  if (epoch != im->perm_epoch) {
    ex_shuffle(im->perm, im->ntrain, im->shuffle_seed + (uint64_t)epoch);
    im->perm_epoch = epoch;
  }
  ex_images_fill(im, &im->train, im->perm, within * im->batch, im->batch,
                 im->batch);
  int64_t y_shape[1] = {im->batch};
  topos_tensor *xt = ex_images_tensor(im, im->batch, err);
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, y_shape, im->ybuf, err);
  feeds[0] = (topos_feed){im->x, xt};
  feeds[1] = (topos_feed){im->y, yt};
  *nfeeds = 2;
  return xt && yt ? TOPOS_OK : err->code;
}

int ex_images_score(ex_images *im, ex_eval *ev, topos_value x,
                    topos_feed *feeds, int nfeeds, int64_t rows,
                    topos_error *err) {
  int rc = TOPOS_OK;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < im->ntest && rc == TOPOS_OK; i += rows) {
    int64_t n = im->ntest - i < rows ? im->ntest - i : rows;
    ex_images_fill(im, &im->test, NULL, i, n, rows);
    topos_tensor *xt = ex_images_tensor(im, rows, err);
    if (xt == NULL) {
      rc = err->code;
      break;
    }
    feeds[0] = (topos_feed){x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(ev, feeds, nfeeds, &logits, err);
    topos_tensor_release(xt);
    if (rc != TOPOS_OK) break;
    /* Only the real rows: the padding's labels are not the test set's. */
    ex_score(logits, im->ybuf, n, &loss_sum, &correct);
    topos_tensor_release(logits);
  }
  if (rc != TOPOS_OK) return rc;
  im->test_loss = loss_sum / (double)im->ntest;
  im->test_acc = (double)correct / (double)im->ntest;
  return TOPOS_OK;
}

static int after(int64_t step, const topos_params *params, double loss,
                 void *ctx, topos_error *err) {
  ex_images *im = ctx;
  im->loss_sum += loss;
  im->loss_n++;
  im->stepped++;
  ex_metrics_row(im->metrics, step, (double)step / (double)im->per_epoch,
                 "train", loss, NAN, ex_now_s() - im->t0);
  if (step % im->per_epoch != 0) return TOPOS_OK;
  /* The epoch is derived from the step, so a run resumed mid-epoch still
   * reports the epoch it finishes (over the steps it took itself). */
  int64_t epoch = step / im->per_epoch;
  double seconds = ex_now_s() - im->epoch_t0;
  int rc = im->evaluate(im->ctx, params, err);
  if (rc != TOPOS_OK) return rc;
  im->evaluated_at = step;
  ex_metrics_row(im->metrics, step, (double)epoch, "test", im->test_loss,
                 im->test_acc, ex_now_s() - im->t0);
  printf("epoch %lld: train loss %.4f, test loss %.4f, test accuracy %.4f",
         (long long)epoch, im->loss_sum / (double)im->loss_n, im->test_loss,
         im->test_acc);
  if (im->loss_n < im->per_epoch)
    printf(" (train loss of the last %lld steps)", (long long)im->loss_n);
  printf("\n");
  fflush(stdout);
  fprintf(stderr, "epoch %lld: %.1f s (%.1f ms/step)\n", (long long)epoch,
          seconds, 1e3 * seconds / (double)im->loss_n);
  im->loss_sum = 0;
  im->loss_n = 0;
  im->epoch_t0 = ex_now_s(); /* the loop does not count evaluation time */
  return TOPOS_OK;
}

int64_t ex_images_parameter_count(const topos_network *net) {
  topos_params *p = topos_network_parameters(net);
  int64_t total = 0;
  for (int i = 0; p != NULL && i < topos_params_count(p); i++)
    total += topos_tensor_count(topos_params_get(p, i));
  topos_params_free(p);
  return total;
}

int ex_images_train(ex_images *im, const ex_args *a, ex_session *s,
                    const topos_network *net, topos_value loss, int rc,
                    topos_error *err) {
  im->metrics = rc == 0 ? ex_metrics_open(a->metrics, err) : NULL;
  if (rc == 0 && im->metrics == NULL) rc = ex_fail(a, "--metrics", err);
  ex_loop loop = {.args = a,
                  .session = s,
                  .net = net,
                  .loss = loss,
                  .opt = topos_adam(im->lr, 0.9, 0.999, 1e-8),
                  .steps = im->steps,
                  .ctx = im,
                  .lr = learning_rate,
                  .batch = batch,
                  .after = after};
  im->t0 = im->epoch_t0 = ex_now_s();
  if (rc == 0 && ex_loop_run(&loop, err) != TOPOS_OK)
    rc = ex_fail(a, "training", err);
  if (rc == 0)
    fprintf(stderr, "%.3f ms/step (%lld steps, %.1f s) %s\n",
            1e3 * loop.seconds / (double)(im->stepped ? im->stepped : 1),
            (long long)im->stepped, loop.seconds, ex_session_where(s));
  if (rc == 0 && !loop.stopped) {
    /* A run resumed at its end took no step: score what it resumed. */
    if (im->evaluated_at != loop.step) {
      if (im->evaluate(im->ctx, loop.params, err) != TOPOS_OK)
        rc = ex_fail(a, "evaluating", err);
      else
        ex_metrics_row(im->metrics, loop.step,
                       (double)loop.step / (double)im->per_epoch, "test",
                       im->test_loss, im->test_acc, ex_now_s() - im->t0);
    }
    if (rc == 0) printf("final: test accuracy = %.4f\n", im->test_acc);
  }
  if (ex_metrics_close(im->metrics, err) != TOPOS_OK && rc == 0)
    rc = ex_fail(a, "--metrics", err);
  ex_loop_clear(&loop);
  return rc;
}
