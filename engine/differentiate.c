/*
 * differentiate.c - reverse mode as recording: the adjoint rules of
 * adjoint.c, run through a builder whose every emitted op becomes a node
 * of the tape.
 *
 * The scan (backward_scan) and the rules are the very ones topos_backward
 * evaluates, so a plan over [loss, grads...] computes each gradient by the
 * same ops in the same accumulation order, and its bits equal backward's.
 * The gradients are ordinary values: they can be differentiated again.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct record_builder {
  builder base;
  topos_tape *tape;
} record_builder;

static topos_value value_of(const record_builder *rb, int32_t h) {
  return (topos_value){rb->tape->id, h};
}

static int32_t rb_emit(builder *b, op_code op, const int32_t *in, int nin,
                       const node_attrs *at) {
  record_builder *rb = (record_builder *)b;
  topos_value stack[4];
  if (nin > 4) return -1; /* no adjoint emits more than two operands */
  for (int i = 0; i < nin; i++) stack[i] = value_of(rb, in[i]);
  return tape_record(rb->tape, op, stack, nin, at).index;
}

static int32_t rb_scalar(builder *b, topos_dtype dtype, double value) {
  record_builder *rb = (record_builder *)b;
  topos_error err = {0};
  topos_tensor *t = topos_tensor_scalar(dtype, value, &err);
  if (!t) {
    topos_tape_fail(rb->tape, err.code, err.message);
    return -1;
  }
  node_attrs at = {0};
  at.tensor = t;
  int32_t h = tape_record(rb->tape, OP_CONSTANT, NULL, 0, &at).index;
  topos_tensor_release(t);
  return h;
}

static const tensor_meta *rb_meta(builder *b, int32_t h) {
  return &((record_builder *)b)->tape->nodes[h].meta;
}

static int32_t rb_value(builder *b, int32_t index, bool needed) {
  (void)b;
  (void)needed;
  return index; /* a recorded adjoint reads the node itself */
}

static void rb_settle(builder *b, const int32_t *keep, int nkeep) {
  (void)b;
  (void)keep;
  (void)nkeep; /* recorded nodes are never released */
}

static const node *rb_node_at(builder *b, int32_t i) {
  return &((record_builder *)b)->tape->nodes[i];
}

/* The tape index of a value of this tape, or -1 with the tape failed. */
static int own_index(topos_tape *tape, topos_value v, const char *what) {
  if (v.index < 0 || v.tape != tape->id || v.index >= tape->n) {
    char msg[128];
    snprintf(msg, sizeof msg, "differentiate: %s is %s", what,
             v.index < 0 ? "an invalid value" : "a value of another tape");
    topos_tape_fail(tape, TOPOS_ERR_ARGUMENT, msg);
    return -1;
  }
  return v.index;
}

/* Every failure leaves each grads_out entry invalid. */
static int fail_all(topos_tape *tape, topos_value *grads_out, int n) {
  for (int k = 0; grads_out && k < n; k++) grads_out[k] = TOPOS_NONE;
  return tape->error_code;
}

int topos_tape_differentiate(topos_tape *tape, topos_value loss,
                             const topos_value *wrt, int n,
                             topos_value *grads_out) {
  if (!tape) return TOPOS_ERR_ARGUMENT;
  if (tape->error) return fail_all(tape, grads_out, n);
  if (n < 0 || (n > 0 && (!wrt || !grads_out))) {
    topos_tape_fail(tape, TOPOS_ERR_ARGUMENT,
                    "differentiate: wrt and grads_out must hold n values");
    return fail_all(tape, n < 0 ? NULL : grads_out, n);
  }
  int li = own_index(tape, loss, "the loss");
  for (int k = 0; li >= 0 && k < n; k++)
    if (own_index(tape, wrt[k], "a wrt value") < 0) li = -1;
  if (li < 0) return fail_all(tape, grads_out, n);
  const tensor_meta *lm = &tape->nodes[li].meta;
  if (lm->rank != 0 || !dtype_is_float(lm->dtype)) {
    char msg[160], mt[SHAPE_TEXT + 8];
    snprintf(msg, sizeof msg,
             "differentiate: the loss (node %d) is %s; it must be a rank-0 "
             "float value",
             li, meta_text(mt, lm));
    topos_tape_fail(tape, TOPOS_ERR_SHAPE, msg);
    return fail_all(tape, grads_out, n);
  }
  record_builder rb = {
      .base = {rb_emit, rb_scalar, rb_meta, rb_value, rb_settle, rb_node_at},
      .tape = tape,
  };
  /* Results go to grads_out only at the end: callers may pass wrt itself
   * as grads_out, replacing each value by its gradient. */
  int32_t *grads = malloc(sizeof(int32_t) * (size_t)(li + 1 + n));
  if (!grads) {
    topos_tape_fail(tape, TOPOS_ERR_MEMORY, "differentiate: out of memory");
    return fail_all(tape, grads_out, n);
  }
  topos_error err = {0};
  int32_t *out = grads + li + 1;
  if (backward_scan(&rb.base, li, grads, false, NULL, &err) == 0) {
    for (int k = 0; k < n; k++) {
      int32_t w = wrt[k].index;
      int32_t g = w <= li ? grads[w] : -1;
      /* Outside the loss's ancestors the gradient is an exact zero. */
      out[k] = g >= 0 ? g : b_fill_like(&rb.base, w, 0.0);
    }
  } else if (!tape->error) {
    topos_tape_fail(tape, err.code, err.message);
  }
  for (int k = 0; k < n; k++)
    grads_out[k] = tape->error ? TOPOS_NONE : value_of(&rb, out[k]);
  free(grads);
  return tape->error ? tape->error_code : TOPOS_OK;
}
