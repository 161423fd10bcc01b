/*
 * gradient_descent.c - the seed loop: fit w in y = w·x by plain SGD.
 *
 * The network has one parameter w (initially 0) and two rank-0 inputs x
 * and y; the loss is (w·x − y)².  One hundred SGD steps at learning rate
 * 0.02 cycle through the samples (1,2), (2,4), (3,6), each a forward run
 * with x and y fed, a backward pass and a pure optimizer step that
 * returns new parameters.  The program prints w, which converges to 2,
 * and the network's describe listing, and exits 1 if w is not within
 * 1e-6 of 2.
 */
#include <math.h>
#include <stdio.h>

#include "topos.h"

static int fail(const char *what, const topos_error *err) {
  fprintf(stderr, "gradient_descent: %s: %s\n", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

int main(void) {
  topos_error err = {0};

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

  /* Train: state is held here, as values; the network never changes. */
  static const double samples[3][2] = {{1, 2}, {2, 4}, {3, 6}};
  topos_optimizer opt = topos_sgd(0.02, 0.0);
  topos_params *params = topos_network_parameters(net);
  topos_opt_state *state = topos_opt_state_new(&opt, params, &err);
  int rc = state ? 0 : fail("optimizer state", &err);
  for (int step = 0; step < 100 && rc == 0; step++) {
    const double *s = samples[step % 3];
    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, s[0], &err);
    topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, s[1], &err);
    topos_feed feeds[2] = {{x, xt}, {y, yt}};
    topos_run *run = topos_forward(net, params, feeds, 2, &err);
    topos_field *grad = run ? topos_backward(run, loss, &err) : NULL;
    topos_params *g = grad ? topos_parameters_of(grad, &err) : NULL;
    topos_params *next = NULL;
    topos_opt_state *next_state = NULL;
    if (g == NULL || topos_optimizer_step(&opt, params, g, state, &next,
                                          &next_state, &err) != TOPOS_OK) {
      rc = fail("training step", &err);
    } else {
      topos_params_free(params);
      topos_opt_state_free(state);
      params = next;
      state = next_state;
    }
    topos_params_free(g);
    topos_field_free(grad);
    topos_run_free(run);
    topos_tensor_release(xt);
    topos_tensor_release(yt);
  }

  double wv = NAN;
  if (rc == 0) {
    int64_t none[1] = {0};
    wv = topos_tensor_get(topos_params_get(params, 0), none, &err);
    printf("w = %.17g\n", wv);
    char *text = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
    if (text == NULL) {
      rc = fail("describe", &err);
    } else {
      fputs(text, stdout);
      topos_free(text);
    }
  }

  topos_opt_state_free(state);
  topos_params_free(params);
  topos_network_release(net);
  if (rc == 0 && !(fabs(wv - 2.0) <= 1e-6)) {
    fprintf(stderr, "gradient_descent: w = %.17g is not within 1e-6 of 2\n",
            wv);
    rc = 1;
  }
  return rc;
}
