/*
 * sample_nets.h - real networks for the encoding and describe suites and
 * for the fuzzer's seed corpus (tests/fuzz/make_corpus.c): the seed's
 * gradient-descent net, a small MLP with index cross-entropy, a
 * conv2d + max_pool2d net, and one net that records every op.  Only the
 * public API is used, every tensor is seeded, so each builder gives the
 * same network (and the same encoding) on every call.
 *
 * Each builder returns a new sealed network (release it) or NULL.
 */
#ifndef TOPOS_SAMPLE_NETS_H
#define TOPOS_SAMPLE_NETS_H

#include <stdlib.h>

#include "topos.h"

#define SN_UNUSED __attribute__((unused))
#define SN_S(...) ((const int64_t[]){__VA_ARGS__})

/* A seeded tensor with elements uniform in [lo, hi) (splitmix-free: a
 * plain xorshift, so the corpus does not depend on the initializers). */
static SN_UNUSED topos_tensor *sn_tensor(topos_dtype dtype, int rank,
                                         const int64_t *shape, uint64_t seed,
                                         double lo, double hi) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  size_t es = topos_dtype_size(dtype);
  unsigned char *buf = malloc((size_t)(n > 0 ? n : 1) * es);
  if (!buf) return NULL;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double v = lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
    switch (dtype) {
      case TOPOS_F32:
        ((float *)buf)[i] = (float)v;
        break;
      case TOPOS_F64:
        ((double *)buf)[i] = v;
        break;
      case TOPOS_BF16:
        ((uint16_t *)buf)[i] = topos_bf16_from_f32((float)v);
        break;
      case TOPOS_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    }
  }
  topos_tensor *t = topos_tensor_from(dtype, rank, shape, buf, NULL);
  free(buf);
  return t;
}

/* Records a leaf of this kind (0 constant, 1 parameter, 2 input). */
static SN_UNUSED topos_value sn_leaf(topos_tape *tape, int kind,
                                     topos_dtype dtype, int rank,
                                     const int64_t *shape, uint64_t seed,
                                     double lo, double hi) {
  topos_tensor *t = sn_tensor(dtype, rank, shape, seed, lo, hi);
  topos_value v = kind == 1   ? topos_parameter(tape, t)
                  : kind == 2 ? topos_input(tape, t)
                              : topos_constant(tape, t);
  topos_tensor_release(t);
  return v;
}

/* The seed example: loss = (w·x − y)², w a parameter, x and y inputs. */
static SN_UNUSED topos_network *sn_gradient_descent(void) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, NULL);
  topos_value w = topos_name(tape, topos_parameter(tape, zero), "w");
  topos_value x = topos_name(tape, topos_input(tape, zero), "x");
  topos_value y = topos_name(tape, topos_input(tape, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(tape, topos_mul(tape, w, x), y);
  topos_name(tape, topos_mul(tape, r, r), "loss");
  return topos_tape_seal(tape, NULL);
}

/* Two tanh layers and index cross-entropy over 3 classes, batch 4. */
static SN_UNUSED topos_network *sn_mlp(void) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_F64, 2, SN_S(4, 3), 1, -1, 1), "x");
  topos_value y = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_I32, 1, SN_S(4), 2, 0, 3), "targets");
  topos_value w[2], b[2];
  w[0] = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F64, 2, SN_S(3, 5), 3, -0.5, 0.5), "w1");
  b[0] = topos_name(tape, sn_leaf(tape, 1, TOPOS_F64, 1, SN_S(5), 4, 0, 0.1),
                    "b1");
  w[1] = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F64, 2, SN_S(5, 3), 5, -0.5, 0.5), "w2");
  b[1] = topos_name(tape, sn_leaf(tape, 1, TOPOS_F64, 1, SN_S(3), 6, 0, 0.1),
                    "b2");
  topos_value logits = topos_mlp(tape, x, 2, w, b, TOPOS_ACT_TANH);
  topos_name(tape, topos_cross_entropy(tape, logits, y), "loss");
  return topos_tape_seal(tape, NULL);
}

/* conv2d (padding 1) -> relu -> max_pool2d -> linear -> mse, in f32. */
static SN_UNUSED topos_network *sn_conv(void) {
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value x = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_F32, 4, SN_S(2, 1, 6, 6), 11, -1, 1),
      "image");
  topos_value w = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F32, 4, SN_S(2, 1, 3, 3), 12, -0.5, 0.5),
      "kernel");
  topos_value b = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F32, 1, SN_S(2), 13, 0, 0.1), "bias");
  topos_value c = topos_relu(tape, topos_conv2d(tape, x, w, b, 1, 1, 1));
  topos_value p = topos_max_pool2d(tape, c, 2, 2); /* [2,2,3,3] */
  topos_value f = topos_reshape(tape, p, 2, SN_S(2, 18));
  topos_value fw = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F32, 2, SN_S(18, 3), 14, -0.3, 0.3), "fc");
  topos_value out = topos_linear(tape, f, fw, TOPOS_NONE);
  topos_value target = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_F32, 2, SN_S(2, 3), 15, 0, 1), "target");
  topos_name(tape, topos_mse(tape, out, target), "loss");
  return topos_tape_seal(tape, NULL);
}

/* One node of every op (f32 tape), with names on some, every attribute
 * schema exercised, a bf16 constant and i32 index data.  Every value is
 * finite under the defaults, so forward runs compare bit for bit. */
static SN_UNUSED topos_network *sn_every_op(void) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value p =
      topos_name(t, sn_leaf(t, 1, TOPOS_F32, 2, SN_S(2, 3), 21, 0.5, 1.5), "p");
  topos_value x =
      topos_name(t, sn_leaf(t, 2, TOPOS_F32, 2, SN_S(2, 3), 22, -1, 1), "x");
  topos_value c = sn_leaf(t, 0, TOPOS_F32, 2, SN_S(2, 3), 23, -1, 1);
  topos_value h = sn_leaf(t, 0, TOPOS_BF16, 1, SN_S(3), 24, -2, 2);
  const int32_t idx_data[4] = {0, 1, 1, 0};
  topos_tensor *it = topos_tensor_from(TOPOS_I32, 1, SN_S(4), idx_data, NULL);
  topos_value idx = topos_name(t, topos_constant(t, it), "idx");
  topos_tensor_release(it);
  topos_value s = topos_scalar(t, 0.25);

  topos_value a = topos_add(t, p, x);
  topos_value d = topos_div(t, topos_mul(t, topos_sub(t, a, c), p), p);
  topos_value e = topos_exp(t, topos_neg(t, d));
  topos_value lg = topos_name(t, topos_log(t, p), "log p");
  topos_value q = topos_sqrt(t, p);
  topos_value th = topos_tanh(t, x);
  topos_value pw = topos_pow(t, p, 1.5);
  topos_value mx = topos_maximum(t, lg, th);
  topos_value st = topos_step(t, q, pw);
  topos_value r = topos_relu(t, mx);
  topos_value mm = topos_matmul(t, p, topos_transpose(t, x)); /* [2,2] */
  topos_value pm = topos_permute(t, e, (const int[]){1, 0});  /* [3,2] */
  topos_value rs = topos_reshape(t, pm, 1, SN_S(6));
  topos_value nr = topos_narrow(t, r, 1, 1, 2);      /* [2,2] */
  topos_value pd = topos_pad(t, nr, 1, 1, 0);        /* [2,3] */
  topos_value uf = topos_unfold(t, pd, 1, 2, 1, 1);  /* [2,2,2] */
  topos_value fd = topos_fold(t, uf, 1, 3, 2, 1, 1); /* [2,3] */
  topos_value cc =
      topos_concat(t, 3, (const topos_value[]){fd, st, mx}, 0); /* [6,3] */
  topos_value bc = topos_broadcast(t, s, 2, SN_S(6, 3));
  topos_value hb = topos_broadcast_along(t, h, 0, 6);           /* bf16 [6,3] */
  topos_value ba = topos_broadcast_along(t, rs, 0, 2);          /* [2,6] */
  topos_value sa = topos_sum_along(t, topos_mul(t, cc, bc), 1); /* [6] */
  topos_value ma = topos_max_along(t, cc, 0);                   /* [3] */
  topos_value ls = topos_log_softmax(t, cc, 1);                 /* [6,3] */
  topos_value lse = topos_logsumexp(t, ls, 1);                  /* [6] */
  topos_value g = topos_gather(t, mm, idx);                     /* [4,2] */
  topos_value sc = topos_scatter(t, g, idx, 3);                 /* [3,2] */
  /* One call per statement: C leaves the order in which arguments are
   * evaluated open, and the node order must not depend on the compiler. */
  topos_value total = topos_sum(t, sc);
  total = topos_add(t, total, topos_sum(t, ba));
  total = topos_add(t, total, topos_sum(t, sa));
  total = topos_add(t, total, topos_sum(t, ma));
  total = topos_add(t, total, topos_sum(t, lse));
  total = topos_add(t, total, topos_sum(t, topos_erf(t, x)));
  topos_name(t, total, "total");
  (void)hb;
  return topos_tape_seal(t, NULL);
}

/* The builders, for loops over every sample. */
typedef topos_network *(*sn_builder)(void);
static SN_UNUSED const struct {
  const char *name;
  sn_builder build;
} sn_samples[] = {
    {"gradient_descent", sn_gradient_descent},
    {"mlp_cross_entropy", sn_mlp},
    {"conv_pool", sn_conv},
    {"every_op", sn_every_op},
};
#define SN_NSAMPLES ((int)(sizeof sn_samples / sizeof sn_samples[0]))

#endif /* TOPOS_SAMPLE_NETS_H */
