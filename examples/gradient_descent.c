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
 * Usage: gradient_descent [--server ADDRESS] [--save FILE] [--resume FILE]
 *                         [the other common flags: examples/common/ex.h]
 * Without --server the trainer is in-process (topos_trainer_local).  With
 * it the network is recorded on a toposd daemon and the trainer is remote
 * (topos_client_trainer): every step is one Step call carrying the
 * parameters, the optimizer state and the feeds (the listing is the
 * daemon's describe); the loop is the same and the numbers are bit for
 * bit those of the in-process run ($TOPOS_SERVER names the daemon when
 * --server is not given).  --save writes the final parameters and
 * optimizer state as a safetensors checkpoint (ex_checkpoint_save), so two
 * runs can be compared byte for byte; --resume continues from one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "ex.h"
#include "topos.h"
#include "topos_client.h"

static int fail(const char *what, const topos_error *err) {
  fprintf(stderr, "gradient_descent: %s: %s\n", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

int main(int argc, char **argv) {
  /* Exact backends give the reference's bits; blas runs when named. */
  topos_backends_register_defaults();
  topos_error err = {0};
  /* The common flags: --server (or $TOPOS_SERVER), --backend NAME
   * ("reference", "cpu", "blas" with --fast), --fast, --save, --resume. */
  ex_args args = {.prog = "gradient_descent"};
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(&args, argc, argv, &i);
    if (got < 0) return 2;
    if (got == 0) {
      fprintf(stderr, "usage: %s [flags]\n%s", argv[0], ex_args_usage);
      return 2;
    }
  }
  if (ex_args_done(&args) != 0) return 2;
  const char *server = args.server;
  topos_exec exec = args.exec;

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
  if (args.save_spec != NULL && ex_save_spec(args.save_spec, net, &err) != 0)
    return fail("--save-spec", &err);

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
  int64_t start = 0, end = 100;
  if (rc == 0 && args.resume != NULL &&
      ex_checkpoint_load(args.resume, net, &cur.params, &cur.state, &start,
                         &err) != TOPOS_OK)
    rc = fail("--resume", &err);
  else if (args.resume != NULL)
    printf("resumed from %s at step %lld\n", args.resume, (long long)start);
  if (args.stop_at > 0 && args.stop_at < end) end = args.stop_at;
  for (int64_t step = start; step < end && rc == 0; step++) {
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

  if (rc == 0 && args.save != NULL &&
      ex_checkpoint_save(args.save, net, cur.params, cur.state, end, &err) !=
          TOPOS_OK)
    rc = fail("--save", &err);

  topos_step_result_clear(&cur);
  topos_trainer_free(trainer); /* before the client it borrows */
  topos_client_close(client);
  topos_free(listing);
  topos_network_release(net);
  if (rc == 0 && end == 100 && !(fabs(wv - 2.0) <= 1e-6)) {
    fprintf(stderr, "gradient_descent: w = %.17g is not within 1e-6 of 2\n",
            wv);
    rc = 1;
  }
  return rc;
}
