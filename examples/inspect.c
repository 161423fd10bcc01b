/*
 * inspect.c - the seed's second example: record, inspect, compile, emit.
 *
 * Records loss = w·w with w an f64 parameter (initially 1.0), prints the
 * network's describe listing, lowers it for the root [loss] (forward
 * posture, exact numerics), prints the plan's describe text and then the
 * plan as StableHLO in the pretty form.
 *
 *   build/examples/inspect            describe, plan, pretty StableHLO
 *   build/examples/inspect --generic  only the generic-form module, which
 *                                     mlir-opt --allow-unregistered-dialect
 *                                     parses
 *
 * Exits 0 on success, 1 on any error (message on stderr), 2 on a bad
 * argument.
 */
#include <stdio.h>
#include <string.h>

#include "topos.h"

static int fail(const char *what, const topos_error *err) {
  fprintf(stderr, "inspect: %s: %s\n", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

int main(int argc, char **argv) {
  bool generic = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--generic") == 0) {
      generic = true;
    } else {
      fprintf(stderr, "usage: %s [--generic]\n", argv[0]);
      return 2;
    }
  }

  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *one = topos_tensor_scalar(TOPOS_F64, 1.0, &err);
  if (tape == NULL || one == NULL) {
    topos_tape_free(tape);
    return fail("recording", &err);
  }
  topos_value w = topos_name(tape, topos_parameter(tape, one), "w");
  topos_tensor_release(one);
  topos_value loss = topos_name(tape, topos_mul(tape, w, w), "loss");
  topos_network *net = topos_tape_seal(tape, &err);
  if (net == NULL) return fail("recording", &err);

  int rc = 0;
  char *listing = NULL, *plan_text = NULL, *module = NULL;
  topos_plan *plan = NULL;

  listing = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
  if (listing == NULL) {
    rc = fail("describe", &err);
    goto done;
  }
  topos_entry entry = {.roots = &loss,
                       .nroots = 1,
                       .observes = NULL,
                       .nobserves = 0,
                       .posture = TOPOS_POSTURE_FORWARD,
                       .numerics = TOPOS_NUMERICS_EXACT};
  plan = topos_network_lower(net, &entry, &err);
  if (plan == NULL) {
    rc = fail("lower", &err);
    goto done;
  }
  plan_text = topos_plan_describe(plan, &err);
  if (plan_text == NULL) {
    rc = fail("plan describe", &err);
    goto done;
  }
  module = topos_plan_emit_stablehlo(
      plan, generic ? TOPOS_EMIT_GENERIC : TOPOS_EMIT_PRETTY, &err);
  if (module == NULL) {
    rc = fail("emit", &err);
    goto done;
  }

  if (generic) {
    fputs(module, stdout);
  } else {
    printf("== network ==\n%s\n== plan for [loss] ==\n%s\n", listing,
           plan_text);
    printf("== StableHLO (pretty) ==\n%s", module);
  }
  if (fflush(stdout) != 0) rc = 1;

done:
  topos_free(module);
  topos_free(plan_text);
  topos_free(listing);
  topos_plan_free(plan);
  topos_network_release(net);
  return rc;
}
