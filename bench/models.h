/*
 * models.h - what the training benchmarks share (bench/compiler.c,
 * bench/train.c): timing and error helpers, a training-step driver and
 * the model builders.  Everything is `static inline`, so a file that uses
 * only part of it compiles without unused-function warnings.
 *
 * Models (f32, cross entropy against i32 targets):
 *   makemore  the MLP of examples/makemore/makemore_mlp.c: embedding
 *             27x10, context 3, linear 30->100, tanh, linear 100->27,
 *             batch 64, the example's own initialisation.
 *   lenet     LeNet-5: x [64,1,28,28] -> conv 6@5x5 pad 2 -> relu ->
 *             max_pool 2 -> conv 16@5x5 -> relu -> max_pool 2 ->
 *             [64,400] -> linear 120 -> relu -> linear 84 -> relu ->
 *             linear 10.
 *   mlp784    784 -> 256 -> relu -> 256 -> relu -> 10, batch 128.
 *
 * Layouts follow the engine (engine/nn.c): conv weights [out,in,kh,kw]
 * as in PyTorch's Conv2d, linear weights [in,out] (PyTorch's Linear keeps
 * the transpose, [out,in]: the same parameters and arithmetic).
 */
#ifndef TOPOS_BENCH_MODELS_H
#define TOPOS_BENCH_MODELS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "topos.h"

/* The program's name in error messages; main sets it. */
static const char *bench_prog = "bench";

/* ------------------------------------------------------------- utilities */

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof v[0], cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline void die(const char *what, const topos_error *err) {
  fprintf(stderr, "%s: %s: %s\n", bench_prog, what,
          err && err->message[0] ? err->message : "failed");
  exit(1);
}

static inline void *must(void *p, const char *what, const topos_error *err) {
  if (p == NULL) die(what, err);
  return p;
}

static inline uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The first "model name" of /proc/cpuinfo, or "unknown CPU". */
static inline void cpu_model(char *out, size_t size) {
  snprintf(out, size, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *colon = strchr(line, ':');
    if (colon == NULL) continue;
    colon++;
    while (*colon == ' ' || *colon == '\t') colon++;
    snprintf(out, size, "%.*s", (int)strcspn(colon, "\n"), colon);
    break;
  }
  fclose(f);
}

/* The 1-minute load average, or -1. */
static inline double load_average(void) {
  double load = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f != NULL) {
    if (fscanf(f, "%lf", &load) != 1) load = -1;
    fclose(f);
  }
  return load;
}

/* ------------------------------------------------------------- training */

/* One path of training: the interpreter (plan NULL) or a training plan,
 * each with its own parameters and optimizer state. */
typedef struct trainer {
  const topos_network *net;
  const topos_plan *plan;
  topos_value loss;
  topos_params *params;
  topos_opt_state *state;
  long steps;
  bool keep_loss;   /* read the loss of every step into last_loss */
  double last_loss; /* (f32 loss only) */
} trainer;

static inline void trainer_init(trainer *t, const topos_network *net,
                                const topos_plan *plan, topos_value loss,
                                const topos_optimizer *opt) {
  topos_error err = {0};
  t->net = net;
  t->plan = plan;
  t->loss = loss;
  t->steps = 0;
  t->keep_loss = false;
  t->last_loss = 0;
  t->params = must(topos_network_parameters(net), "parameters", NULL);
  t->state = must(topos_opt_state_new(opt, t->params, &err), "opt state", &err);
}

static inline void trainer_free(trainer *t) {
  topos_params_free(t->params);
  topos_opt_state_free(t->state);
}

/* A fixed batch: the two input tensors of a network. */
typedef struct batch {
  topos_tensor *x, *y;
} batch;

/* Keeps the step's new parameters and state, freeing the old ones. */
static inline void trainer_advance(trainer *t, topos_params *next,
                                   topos_opt_state *next_state) {
  topos_params_free(t->params);
  topos_opt_state_free(t->state);
  t->params = next;
  t->state = next_state;
  t->steps++;
}

/* One training step.  A plan takes it in one engine call
 * (topos_plan_step); the interpreter path composes forward, the
 * parameters' gradients (no work on the data branches) and the optimizer
 * step itself, the same arithmetic without a plan. */
static inline void train_step(trainer *t, const topos_optimizer *opt,
                              const topos_feed *feeds, int nfeeds) {
  topos_error err = {0};
  if (t->plan) {
    /* The old parameters and state are dropped after the step anyway:
     * donated, so plain SGD updates them in place (as PyTorch's does). */
    topos_step_result r;
    if (topos_plan_step_donated(t->plan, &t->params, feeds, nfeeds, opt,
                                &t->state, NULL, &r, &err) != TOPOS_OK)
      die("plan step", &err);
    /* f32 models: the loss widened exactly, so narrowing restores it. */
    if (t->keep_loss) t->last_loss = (float)r.loss;
    trainer_advance(t, r.params, r.state);
    r.params = NULL;
    r.state = NULL;
    topos_step_result_clear(&r);
    return;
  }
  topos_run *run =
      must(topos_forward(t->net, t->params, feeds, nfeeds, NULL, &err),
           "forward", &err);
  if (t->keep_loss) {
    float loss = 0;
    const topos_tensor *l = topos_run_of(run, t->loss, &err);
    if (l == NULL || topos_tensor_read(l, &loss, sizeof loss, &err) != TOPOS_OK)
      die("reading the loss", &err);
    t->last_loss = loss;
  }
  topos_params *g =
      must(topos_gradients(run, t->loss, NULL, &err), "gradients", &err);
  topos_params *next = NULL;
  topos_opt_state *next_state = NULL;
  if (topos_optimizer_step(opt, t->params, g, t->state, &next, &next_state,
                           &err) != TOPOS_OK)
    die("optimizer step", &err);
  trainer_advance(t, next, next_state);
  topos_params_free(g);
  topos_run_free(run);
}

/* Runs `steps` steps on the batches in order, returns seconds taken. */
static inline double train_block(trainer *t, const topos_optimizer *opt,
                                 const batch *b, int nb, topos_value xv,
                                 topos_value yv, int steps) {
  double t0 = now_s();
  for (int k = 0; k < steps; k++) {
    const batch *cur = &b[t->steps % nb];
    topos_feed feeds[2] = {{xv, cur->x}, {yv, cur->y}};
    train_step(t, opt, feeds, 2);
  }
  return now_s() - t0;
}

static inline topos_plan *lower(const topos_network *net,
                                const topos_value *roots, int nroots,
                                const topos_value *observes, int nobserves,
                                topos_posture posture, topos_numerics numerics,
                                const char *what) {
  topos_error err = {0};
  topos_entry entry = {roots, nroots, observes, nobserves, posture, numerics};
  return must(topos_network_lower(net, &entry, &err), what, &err);
}

/* Random index tensor of `count` entries below `bound`. */
static inline topos_tensor *random_indices(int rank, const int64_t *shape,
                                           int64_t count, uint64_t bound,
                                           uint64_t *rng) {
  topos_error err = {0};
  int32_t *v = malloc(sizeof(int32_t) * (size_t)count);
  if (!v) die("index batch", NULL);
  for (int64_t i = 0; i < count; i++) v[i] = (int32_t)(splitmix64(rng) % bound);
  topos_tensor *t = topos_tensor_from(TOPOS_I32, rank, shape, v, &err);
  free(v);
  return must(t, "index batch", &err);
}

/* ---------------------------------------------------------------- models */

typedef struct model {
  topos_network *net;
  topos_value x, y, logits, loss;
} model;

/* A named parameter from a fresh initial tensor (which the tape retains;
 * this releases the caller's reference). */
static inline topos_value bench_param(topos_tape *tape, topos_tensor *init,
                                      const char *name,
                                      const topos_error *err) {
  must(init, name, err);
  topos_value v = topos_name(tape, topos_parameter(tape, init), name);
  topos_tensor_release(init);
  return v;
}

/* The inputs x (f32, or i32 when `index_x`) and y (i32 [n]), the logits'
 * cross entropy, and the sealed network. */
static inline void bench_inputs(topos_tape *tape, model *m, bool index_x,
                                int rank, const int64_t *x_shape) {
  topos_error err = {0};
  int64_t y_shape[1] = {x_shape[0]};
  topos_tensor *x =
      topos_tensor_zeros(index_x ? TOPOS_I32 : TOPOS_F32, rank, x_shape, &err);
  topos_tensor *y = topos_tensor_zeros(TOPOS_I32, 1, y_shape, &err);
  must(x, "input x", &err);
  must(y, "input y", &err);
  m->x = topos_name(tape, topos_input(tape, x), "x");
  m->y = topos_name(tape, topos_input(tape, y), "y");
  topos_tensor_release(x);
  topos_tensor_release(y);
}

static inline void bench_seal(topos_tape *tape, model *m, topos_value logits,
                              const char *what) {
  topos_error err = {0};
  m->logits = topos_name(tape, logits, "logits");
  m->loss =
      topos_name(tape, topos_cross_entropy(tape, m->logits, m->y), "loss");
  m->net = must(topos_tape_seal(tape, &err), what, &err);
}

enum { VOCAB = 27, CONTEXT = 3, EMBED = 10, HIDDEN = 100, BATCH = 64 };

/* The network of examples/makemore/makemore_mlp.c, same initialisation. */
static inline model makemore_build(void) {
  const topos_dtype dt = TOPOS_F32;
  topos_error err = {0};
  int64_t c_shape[2] = {VOCAB, EMBED};
  int64_t w1_shape[2] = {CONTEXT * EMBED, HIDDEN};
  int64_t b1_shape[1] = {HIDDEN};
  int64_t w2_shape[2] = {HIDDEN, VOCAB};
  int64_t b2_shape[1] = {VOCAB};
  int64_t x_shape[2] = {BATCH, CONTEXT};
  topos_tape *tape = must(topos_tape_new(dt), "tape", NULL);
  model m = {0};
  topos_value c = bench_param(
      tape, topos_init_normal(dt, 2, c_shape, 0.0, 1.0, 1, &err), "C", &err);
  topos_value w1 = bench_param(
      tape, topos_init_kaiming(dt, 2, w1_shape, CONTEXT * EMBED, 2, &err), "W1",
      &err);
  topos_value b1 =
      bench_param(tape, topos_tensor_zeros(dt, 1, b1_shape, &err), "b1", &err);
  topos_value w2 = bench_param(
      tape, topos_init_normal(dt, 2, w2_shape, 0.0, 0.01, 3, &err), "W2", &err);
  topos_value b2 =
      bench_param(tape, topos_tensor_zeros(dt, 1, b2_shape, &err), "b2", &err);
  bench_inputs(tape, &m, true, 2, x_shape);
  int64_t flat[2] = {BATCH, CONTEXT * EMBED};
  topos_value emb = topos_reshape(tape, topos_embedding(tape, c, m.x), 2, flat);
  topos_value h = topos_tanh(tape, topos_linear(tape, emb, w1, b1));
  bench_seal(tape, &m, topos_linear(tape, h, w2, b2), "makemore seal");
  return m;
}

/* A linear layer's weight [in,out] (He normal, or Glorot for the last
 * layer before the loss) and zero bias [out], recorded as parameters. */
static inline topos_value bench_linear(topos_tape *tape, topos_value x,
                                       int64_t in, int64_t out, bool last,
                                       uint64_t seed, const char *wname,
                                       const char *bname) {
  topos_error err = {0};
  int64_t w_shape[2] = {in, out}, b_shape[1] = {out};
  topos_tensor *w =
      last ? topos_init_xavier(TOPOS_F32, 2, w_shape, in, out, seed, &err)
           : topos_init_kaiming(TOPOS_F32, 2, w_shape, in, seed, &err);
  topos_value wv = bench_param(tape, w, wname, &err);
  topos_value bv = bench_param(
      tape, topos_tensor_zeros(TOPOS_F32, 1, b_shape, &err), bname, &err);
  return topos_linear(tape, x, wv, bv);
}

/* conv out@k×k (He normal weight [out,in,k,k], zero bias) + relu. */
static inline topos_value bench_conv_relu(topos_tape *tape, topos_value x,
                                          int64_t in, int64_t out, int64_t k,
                                          int padding, uint64_t seed,
                                          const char *wname,
                                          const char *bname) {
  topos_error err = {0};
  int64_t w_shape[4] = {out, in, k, k}, b_shape[1] = {out};
  topos_value wv = bench_param(
      tape, topos_init_kaiming(TOPOS_F32, 4, w_shape, in * k * k, seed, &err),
      wname, &err);
  topos_value bv = bench_param(
      tape, topos_tensor_zeros(TOPOS_F32, 1, b_shape, &err), bname, &err);
  return topos_relu(tape, topos_conv2d(tape, x, wv, bv, 1, padding, 1));
}

enum { LENET_BATCH = 64, LENET_CLASSES = 10 };

static inline model lenet_build(void) {
  const int64_t n = LENET_BATCH;
  topos_tape *tape = must(topos_tape_new(TOPOS_F32), "tape", NULL);
  model m = {0};
  int64_t x_shape[4] = {n, 1, 28, 28};
  bench_inputs(tape, &m, false, 4, x_shape);
  topos_value h =
      bench_conv_relu(tape, m.x, 1, 6, 5, 2, 31, "conv1.w", "conv1.b");
  h = topos_max_pool2d(tape, h, 2, 2); /* [n,6,14,14] */
  h = bench_conv_relu(tape, h, 6, 16, 5, 0, 32, "conv2.w", "conv2.b");
  h = topos_max_pool2d(tape, h, 2, 2); /* [n,16,5,5] */
  int64_t flat[2] = {n, 16 * 5 * 5};
  h = topos_reshape(tape, h, 2, flat);
  h = topos_relu(tape,
                 bench_linear(tape, h, 400, 120, false, 33, "fc1.w", "fc1.b"));
  h = topos_relu(tape,
                 bench_linear(tape, h, 120, 84, false, 34, "fc2.w", "fc2.b"));
  h = bench_linear(tape, h, 84, LENET_CLASSES, true, 35, "fc3.w", "fc3.b");
  bench_seal(tape, &m, h, "lenet seal");
  return m;
}

enum { MLP_BATCH = 128, MLP_IN = 784, MLP_HIDDEN = 256, MLP_CLASSES = 10 };

static inline model mlp784_build(void) {
  topos_tape *tape = must(topos_tape_new(TOPOS_F32), "tape", NULL);
  model m = {0};
  int64_t x_shape[2] = {MLP_BATCH, MLP_IN};
  bench_inputs(tape, &m, false, 2, x_shape);
  topos_value h = topos_relu(tape, bench_linear(tape, m.x, MLP_IN, MLP_HIDDEN,
                                                false, 41, "fc1.w", "fc1.b"));
  h = topos_relu(tape, bench_linear(tape, h, MLP_HIDDEN, MLP_HIDDEN, false, 42,
                                    "fc2.w", "fc2.b"));
  h = bench_linear(tape, h, MLP_HIDDEN, MLP_CLASSES, true, 43, "fc3.w",
                   "fc3.b");
  bench_seal(tape, &m, h, "mlp784 seal");
  return m;
}

#endif /* TOPOS_BENCH_MODELS_H */
