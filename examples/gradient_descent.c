/*
 * gradient_descent.c - the seed loop: fit w in y = w·x by plain SGD.
 *
 * The network has one parameter w (initially 0) and two rank-0 inputs x
 * and y; the loss is (w·x − y)².  One hundred SGD steps at learning rate
 * 0.02 cycle through the samples (1,2), (2,4), (3,6), each one
 * topos_trainer_step with x and y fed: forward, the gradient and a pure
 * optimizer update that returns new parameters and state.  The program
 * prints w, which converges to 2, and the network's describe listing, and
 * exits 1 if w is not within 1e-6 of 2.
 *
 * Usage: gradient_descent [--server ADDRESS] [--dump FILE]
 * Without --server the trainer is in-process (topos_trainer_local).  With
 * it the network is recorded on a toposd daemon and the trainer is remote
 * (topos_client_trainer): every step is one Step call carrying the
 * parameters, the optimizer state and the feeds (the listing is the
 * daemon's describe); the loop is the same and the numbers are bit for
 * bit those of the in-process run.  --dump writes the final parameters'
 * bytes (each slot's elements row-major, in slot order) to FILE, so two
 * runs can be compared byte for byte.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "topos.h"
#include "topos_client.h"

static int fail(const char *what, const topos_error *err) {
  fprintf(stderr, "gradient_descent: %s: %s\n", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

/* Writes every slot's elements row-major, in slot order, to path. */
static int dump_params(const char *path, const topos_params *p,
                       topos_error *err) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    snprintf(err->message, sizeof err->message, "cannot write %s", path);
    return 1;
  }
  int rc = 0;
  for (int s = 0; s < topos_params_count(p) && rc == 0; s++) {
    const topos_tensor *t = topos_params_get(p, s);
    size_t bytes =
        (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
    void *buf = malloc(bytes ? bytes : 1);
    rc = buf != NULL && topos_tensor_read(t, buf, bytes, err) == TOPOS_OK &&
                 fwrite(buf, 1, bytes, f) == bytes
             ? 0
             : 1;
    free(buf);
  }
  if (fclose(f) != 0) rc = 1;
  if (rc != 0 && err->message[0] == '\0')
    snprintf(err->message, sizeof err->message, "cannot write %s", path);
  return rc;
}

int main(int argc, char **argv) {
  /* Exact backends give the reference's bits; blas runs when named. */
  topos_backends_register_defaults();
  topos_error err = {0};
  const char *server = NULL, *dump = NULL;
  /* How steps run (in-process or on the daemon): the backend by name
   * ("reference", "cpu", "blas" with --fast) and the numerics. */
  topos_exec exec = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--server") == 0 && i + 1 < argc) {
      server = argv[++i];
    } else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump = argv[++i];
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      exec.backend = argv[++i];
    } else if (strcmp(argv[i], "--fast") == 0) {
      exec.numerics = TOPOS_NUMERICS_FAST;
    } else {
      fprintf(stderr,
              "usage: %s [--server ADDRESS] [--dump FILE] [--backend NAME] "
              "[--fast]\n",
              argv[0]);
      return 2;
    }
  }

  /* Record: w is a parameter, x and y are inputs with default 0. */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  topos_value w = topos_name(tape, topos_parameter(tape, zero), "w");
  topos_value x = topos_name(tape, topos_input(tape, zero), "x");
  topos_value y = topos_name(tape, topos_input(tape, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(tape, topos_mul(tape, w, x), y);
  topos_value loss = topos_name(tape, topos_mul(tape, r, r), "loss");
  topos_network *net = topos_tape_seal(tape, &err);
  if (net == NULL) return fail("recording", &err);

  /* Where the steps run, chosen once: in-process (a training plan lowered
   * here) or on a daemon that stores the spec.  Everything below is the
   * same either way; so is the listing, which the daemon describes from
   * its stored copy. */
  topos_client *client = NULL;
  topos_trainer *trainer = NULL;
  char *listing = NULL;
  if (server != NULL) {
    char id[65] = "";
    client = topos_client_connect(server, &err);
    if (client != NULL && topos_client_record(client, net, id, &err) == 0 &&
        topos_client_describe(client, id, TOPOS_FORMAT_TEXT, &listing, &err) ==
            0)
      trainer = topos_client_trainer(client, id, loss, &exec, &err);
  } else {
    listing = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
    if (listing != NULL)
      trainer = topos_trainer_local(net, loss, NULL, 0, &exec, &err);
  }
  int rc = 0;
  if (trainer == NULL)
    rc = fail(server ? "the daemon" : "lowering the training plan", &err);

  /* Train: state is held here, as values; the network never changes.  The
   * first step starts from the initial parameters and a fresh optimizer
   * state (NULL, NULL); each result holds what the next step takes. */
  static const double samples[3][2] = {{1, 2}, {2, 4}, {3, 6}};
  topos_optimizer opt = topos_sgd(0.02, 0.0);
  topos_step_result cur = {0};
  for (int step = 0; step < 100 && rc == 0; step++) {
    const double *s = samples[step % 3];
    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, s[0], &err);
    topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, s[1], &err);
    topos_feed feeds[2] = {{x, xt}, {y, yt}};
    topos_step_result next;
    if (topos_trainer_step(trainer, cur.params, feeds, 2, &opt, cur.state,
                           &next, &err) != TOPOS_OK) {
      rc = fail("training step", &err);
    } else {
      topos_step_result_clear(&cur);
      cur = next;
    }
    topos_tensor_release(xt);
    topos_tensor_release(yt);
  }

  double wv = NAN;
  if (rc == 0) {
    int64_t none[1] = {0};
    wv = topos_tensor_get(topos_params_get(cur.params, 0), none, &err);
    printf("w = %.17g\n", wv);
    fputs(listing, stdout);
  }

  if (rc == 0 && dump != NULL && dump_params(dump, cur.params, &err) != 0)
    rc = fail("--dump", &err);

  topos_step_result_clear(&cur);
  topos_trainer_free(trainer); /* before the client it borrows */
  topos_client_close(client);
  topos_free(listing);
  topos_network_release(net);
  if (rc == 0 && !(fabs(wv - 2.0) <= 1e-6)) {
    fprintf(stderr, "gradient_descent: w = %.17g is not within 1e-6 of 2\n",
            wv);
    rc = 1;
  }
  return rc;
}
