/*
 * compiler.c - the compiler tier's benchmark: one table of figures measured
 * side by side in one run (issue 3, item 7; docs/bench.md explains every
 * row).
 *
 *  1. makemore MLP (f32; vocab 27, context 3, embedding 10, hidden 100 tanh,
 *     batch 64): a training step (forward + backward + plain SGD) through
 *     the interpreter and through a training-posture plan, the plans' peak
 *     bytes, and a check that both paths end with the same parameter bits.
 *  2. A LeNet-style CNN (28x28x1, conv 8 -> relu -> pool 2 -> conv 16 ->
 *     relu -> pool 2 -> linear 10, batch 64, cross entropy): the same
 *     training comparison, plus forward-only time for the interpreter, a
 *     forward plan with fused conv/pool groups and the same plan with the
 *     fusion blocked, their peak bytes, and a bit check of the logits.
 *  3. A 10k-node spec: encode, decode and id times and throughput.
 *  4. Causal multi-head attention (4 x 128 x 128, 4 heads): forward and
 *     training-step time of plans with the chain fused and blocked, on the
 *     reference kernels and on the cpu backend, and a bit check of y and
 *     every gradient against the interpreter.
 *
 * Every time is the median of several repetitions after warm-up, read
 * from CLOCK_MONOTONIC.  Batches are random and seeded, so the work is the
 * same every run.  The program exits 1 when a bit check fails or any
 * engine call reports an error.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "models.h" /* timing, the training step, the makemore network */

/* ------------------------------------------------------------- utilities */

static void row(const char *workload, const char *measure, const char *value,
                const char *unit) {
  printf("%-9s %-52s %12s%s%s\n", workload, measure, value, unit[0] ? " " : "",
         unit);
  fflush(stdout);
}

static void rowf(const char *workload, const char *measure, double value,
                 int decimals, const char *unit) {
  char text[64];
  snprintf(text, sizeof text, "%.*f", decimals, value);
  row(workload, measure, text, unit);
}

static void rowi(const char *workload, const char *measure, long long value,
                 const char *unit) {
  char text[64];
  snprintf(text, sizeof text, "%lld", value);
  row(workload, measure, text, unit);
}

static void cpu_header(void) {
  char model[256];
  cpu_model(model, sizeof model);
  printf(
      "topos compiler bench: %s, %ld threads online (this bench runs on 1)\n",
      model, sysconf(_SC_NPROCESSORS_ONLN));
  /* The machine's load when the run starts: a busy shared host slows
   * every figure, and the side-by-side ratios less than the times. */
  printf(
      "times: median of the repetitions after warm-up, CLOCK_MONOTONIC; "
      "1-min load average at start %.2f\n\n",
      load_average());
  printf("%-9s %-52s %12s %s\n", "workload", "measure", "value", "unit");
  printf("%-9s %-52s %12s %s\n", "--------",
         "----------------------------------------------------", "-----",
         "----");
}

/* ------------------------------------------------------------- training */

typedef struct train_result {
  double interp_ms, plan_ms;
  long steps;
  bool identical;
} train_result;

/* Interpreter and plan, side by side: `warm` warm-up blocks and `reps`
 * timed blocks of `block` steps each, alternating which path goes first.
 * Both paths see the same batches in the same order. */
static train_result compare_training(const topos_network *net,
                                     const topos_plan *plan, topos_value loss,
                                     const topos_optimizer *opt, const batch *b,
                                     int nb, topos_value xv, topos_value yv,
                                     int warm, int reps, int block) {
  trainer ti, tp;
  trainer_init(&ti, net, NULL, loss, opt);
  trainer_init(&tp, net, plan, loss, opt);
  double *si = malloc(sizeof(double) * (size_t)reps);
  double *sp = malloc(sizeof(double) * (size_t)reps);
  if (!si || !sp) die("timing arrays", NULL);
  for (int w = 0; w < warm; w++) {
    train_block(&ti, opt, b, nb, xv, yv, block);
    train_block(&tp, opt, b, nb, xv, yv, block);
  }
  for (int r = 0; r < reps; r++) {
    if (r % 2 == 0) {
      si[r] = train_block(&ti, opt, b, nb, xv, yv, block);
      sp[r] = train_block(&tp, opt, b, nb, xv, yv, block);
    } else {
      sp[r] = train_block(&tp, opt, b, nb, xv, yv, block);
      si[r] = train_block(&ti, opt, b, nb, xv, yv, block);
    }
  }
  train_result res;
  res.interp_ms = median(si, reps) * 1e3 / block;
  res.plan_ms = median(sp, reps) * 1e3 / block;
  res.steps = ti.steps;
  res.identical =
      ti.steps == tp.steps && topos_params_bitwise_equal(ti.params, tp.params);
  free(si);
  free(sp);
  trainer_free(&ti);
  trainer_free(&tp);
  return res;
}

static void report_training(const char *workload, const train_result *r) {
  char label[96];
  rowf(workload, "train step, interpreter (fwd+bwd+SGD)", r->interp_ms, 3,
       "ms/step");
  rowf(workload, "train step, training plan (fwd+bwd+SGD)", r->plan_ms, 3,
       "ms/step");
  rowf(workload, "interpreter / plan step time", r->interp_ms / r->plan_ms, 2,
       "x");
  snprintf(label, sizeof label, "params bit-identical after %ld steps",
           r->steps);
  row(workload, label, r->identical ? "yes" : "no", "");
}

/* ------------------------------------------------------------- makemore */

enum { MM_BATCHES = 16 };

static void bench_makemore(void) {
  const char *wl = "makemore";
  model m = makemore_build();
  uint64_t rng = 20240601;
  batch b[MM_BATCHES];
  int64_t xs[2] = {BATCH, CONTEXT}, ys[1] = {BATCH};
  for (int i = 0; i < MM_BATCHES; i++) {
    b[i].x = random_indices(2, xs, BATCH * CONTEXT, VOCAB, &rng);
    b[i].y = random_indices(1, ys, BATCH, VOCAB, &rng);
  }
  topos_plan *train = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                            TOPOS_NUMERICS_EXACT, "lower train");
  topos_plan *fwd = lower(m.net, &m.logits, 1, NULL, 0, TOPOS_POSTURE_FORWARD,
                          TOPOS_NUMERICS_EXACT, "lower fwd");
  topos_optimizer opt = topos_sgd(0.1, 0.0);
  train_result r = compare_training(m.net, train, m.loss, &opt, b, MM_BATCHES,
                                    m.x, m.y, 16, 84, 10);
  report_training(wl, &r);
  rowi(wl, "peak bytes, forward plan (roots [logits])",
       (long long)topos_plan_peak_bytes(fwd), "bytes");
  rowi(wl, "peak bytes, training plan (roots [loss])",
       (long long)topos_plan_peak_bytes(train), "bytes");
  topos_plan_free(train);
  topos_plan_free(fwd);
  for (int i = 0; i < MM_BATCHES; i++) {
    topos_tensor_release(b[i].x);
    topos_tensor_release(b[i].y);
  }
  topos_network_release(m.net);
  if (!r.identical) {
    fprintf(stderr,
            "bench/compiler: makemore: interpreter and plan "
            "parameters differ\n");
    exit(1);
  }
}

/* ------------------------------------------------------------------ CNN */

enum { CNN_BATCH = 64, CNN_BATCHES = 4, CNN_CLASSES = 10 };

typedef struct cnn {
  topos_network *net;
  topos_value x, y, logits, loss;
  topos_value interior[4]; /* each fusable chain's interior reshape */
} cnn;

/* The node recorded since `from` whose value has exactly this shape; the
 * interior reshape of a conv or pool chain has a shape nothing else in the
 * chain has.  Dies unless exactly one matches. */
static topos_value find_shape(topos_tape *tape, uint32_t tape_id, int from,
                              int rank, const int64_t *shape) {
  topos_value found = TOPOS_NONE;
  int matches = 0;
  for (int i = from; i < topos_tape_node_count(tape); i++) {
    topos_value v = {tape_id, i};
    int r = 0;
    const int64_t *s = topos_value_shape(tape, v, &r);
    if (s && r == rank && memcmp(s, shape, sizeof(int64_t) * rank) == 0) {
      found = v;
      matches++;
    }
  }
  if (matches != 1) die("cnn: finding a chain's interior reshape", NULL);
  return found;
}

static cnn cnn_build(void) {
  const topos_dtype dt = TOPOS_F32;
  const int64_t N = CNN_BATCH;
  topos_error err = {0};
  int64_t x_shape[4] = {N, 1, 28, 28}, y_shape[1] = {N};
  int64_t w1_shape[4] = {8, 1, 3, 3}, b1_shape[1] = {8};
  int64_t w2_shape[4] = {16, 8, 3, 3}, b2_shape[1] = {16};
  int64_t w3_shape[2] = {16 * 7 * 7, CNN_CLASSES}, b3_shape[1] = {CNN_CLASSES};
  topos_tensor *init[8] = {
      topos_init_kaiming(dt, 4, w1_shape, 1 * 9, 11, &err),
      topos_tensor_zeros(dt, 1, b1_shape, &err),
      topos_init_kaiming(dt, 4, w2_shape, 8 * 9, 12, &err),
      topos_tensor_zeros(dt, 1, b2_shape, &err),
      topos_init_xavier(dt, 2, w3_shape, 16 * 7 * 7, CNN_CLASSES, 13, &err),
      topos_tensor_zeros(dt, 1, b3_shape, &err),
      topos_tensor_zeros(dt, 4, x_shape, &err),
      topos_tensor_zeros(TOPOS_I32, 1, y_shape, &err),
  };
  for (int i = 0; i < 8; i++) must(init[i], "cnn initials", &err);
  topos_tape *tape = must(topos_tape_new(dt), "tape", NULL);
  cnn m = {0};
  topos_value w1 = topos_name(tape, topos_parameter(tape, init[0]), "conv1.w");
  topos_value b1 = topos_name(tape, topos_parameter(tape, init[1]), "conv1.b");
  topos_value w2 = topos_name(tape, topos_parameter(tape, init[2]), "conv2.w");
  topos_value b2 = topos_name(tape, topos_parameter(tape, init[3]), "conv2.b");
  topos_value w3 = topos_name(tape, topos_parameter(tape, init[4]), "fc.w");
  topos_value b3 = topos_name(tape, topos_parameter(tape, init[5]), "fc.b");
  m.x = topos_name(tape, topos_input(tape, init[6]), "x");
  m.y = topos_name(tape, topos_input(tape, init[7]), "y");
  uint32_t id = m.x.tape;

  /* The interior reshapes: conv [N·oh·ow, C·3·3], pool [N,C,oh,ow,2·2]. */
  const int64_t conv1_rows[2] = {N * 28 * 28, 1 * 9};
  const int64_t pool1_win[5] = {N, 8, 14, 14, 4};
  const int64_t conv2_rows[2] = {N * 14 * 14, 8 * 9};
  const int64_t pool2_win[5] = {N, 16, 7, 7, 4};
  int from = topos_tape_node_count(tape);
  topos_value h = topos_conv2d(tape, m.x, w1, b1, 1, 1, 1);
  m.interior[0] = find_shape(tape, id, from, 2, conv1_rows);
  h = topos_relu(tape, h);
  from = topos_tape_node_count(tape);
  h = topos_max_pool2d(tape, h, 2, 2);
  m.interior[1] = find_shape(tape, id, from, 5, pool1_win);
  from = topos_tape_node_count(tape);
  h = topos_conv2d(tape, h, w2, b2, 1, 1, 1);
  m.interior[2] = find_shape(tape, id, from, 2, conv2_rows);
  h = topos_relu(tape, h);
  from = topos_tape_node_count(tape);
  h = topos_max_pool2d(tape, h, 2, 2);
  m.interior[3] = find_shape(tape, id, from, 5, pool2_win);
  int64_t flat[2] = {N, 16 * 7 * 7};
  h = topos_reshape(tape, h, 2, flat);
  m.logits = topos_name(tape, topos_linear(tape, h, w3, b3), "logits");
  m.loss = topos_name(tape, topos_cross_entropy(tape, m.logits, m.y), "loss");
  m.net = must(topos_tape_seal(tape, &err), "cnn seal", &err);
  for (int i = 0; i < 8; i++) topos_tensor_release(init[i]);
  return m;
}

/* Times one forward of each path per repetition, side by side. */
static void bench_cnn(void) {
  const char *wl = "cnn";
  topos_error err = {0};
  cnn m = cnn_build();
  uint64_t rng = 19980701;
  batch b[CNN_BATCHES];
  int64_t xs[4] = {CNN_BATCH, 1, 28, 28}, ys[1] = {CNN_BATCH};
  for (int i = 0; i < CNN_BATCHES; i++) {
    b[i].x = must(
        topos_init_uniform(TOPOS_F32, 4, xs, 0.0, 1.0, splitmix64(&rng), &err),
        "cnn batch", &err);
    b[i].y = random_indices(1, ys, CNN_BATCH, CNN_CLASSES, &rng);
  }
  topos_plan *train = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                            TOPOS_NUMERICS_EXACT, "lower train");
  topos_plan *fused = lower(m.net, &m.logits, 1, NULL, 0, TOPOS_POSTURE_FORWARD,
                            TOPOS_NUMERICS_EXACT, "lower fwd");
  topos_plan *unfused =
      lower(m.net, &m.logits, 1, m.interior, 4, TOPOS_POSTURE_FORWARD,
            TOPOS_NUMERICS_EXACT, "lower fwd, observed");
  if (topos_plan_group_count(unfused) != 0)
    die("cnn: observing the interior reshapes did not block fusion", NULL);

  /* Training. */
  topos_optimizer opt = topos_sgd(0.05, 0.0);
  train_result r = compare_training(m.net, train, m.loss, &opt, b, CNN_BATCHES,
                                    m.x, m.y, 2, 18, 1);
  report_training(wl, &r);

  /* Forward only, with the network's initial parameters. */
  topos_params *params = must(topos_network_parameters(m.net), "params", NULL);
  enum { WARM = 2, REPS = 31 };
  double ti[REPS], tf[REPS], tu[REPS];
  bool identical = true;
  for (int rep = 0; rep < WARM + REPS; rep++) {
    const batch *cur = &b[rep % CNN_BATCHES];
    topos_feed feeds[2] = {{m.x, cur->x}, {m.y, cur->y}};
    double t0 = now_s();
    topos_run *ri = topos_forward(m.net, params, feeds, 2, NULL, &err);
    double t1 = now_s();
    must(ri, "cnn forward", &err);
    topos_run *rf = topos_plan_forward(fused, params, feeds, 2, NULL, &err);
    double t2 = now_s();
    must(rf, "cnn fused plan forward", &err);
    topos_run *ru = topos_plan_forward(unfused, params, feeds, 2, NULL, &err);
    double t3 = now_s();
    must(ru, "cnn unfused plan forward", &err);
    const topos_tensor *li = must((void *)topos_run_of(ri, m.logits, &err),
                                  "interpreter logits", &err);
    const topos_tensor *lf =
        must((void *)topos_run_of(rf, m.logits, &err), "fused logits", &err);
    const topos_tensor *lu =
        must((void *)topos_run_of(ru, m.logits, &err), "unfused logits", &err);
    identical = identical && topos_tensor_bitwise_equal(lf, lu) &&
                topos_tensor_bitwise_equal(lf, li);
    topos_run_free(ri);
    topos_run_free(rf);
    topos_run_free(ru);
    if (rep >= WARM) {
      ti[rep - WARM] = t1 - t0;
      tf[rep - WARM] = t2 - t1;
      tu[rep - WARM] = t3 - t2;
    }
  }
  double mi = median(ti, REPS) * 1e3, mf = median(tf, REPS) * 1e3;
  double mu = median(tu, REPS) * 1e3;
  rowf(wl, "forward, interpreter topos_forward (unfused)", mi, 3, "ms");
  rowf(wl, "forward, plan with fusion (roots [logits])", mf, 3, "ms");
  rowf(wl, "forward, plan with fusion blocked (4 observes)", mu, 3, "ms");
  rowf(wl, "unfused plan / fused plan forward time", mu / mf, 2, "x");
  rowf(wl, "interpreter / fused plan forward time", mi / mf, 2, "x");
  rowi(wl, "fused groups, forward plan", topos_plan_group_count(fused),
       "groups");
  rowi(wl, "fused groups, blocked forward plan",
       topos_plan_group_count(unfused), "groups");
  rowi(wl, "fused groups, training plan", topos_plan_group_count(train),
       "groups");
  rowi(wl, "peak bytes, forward plan, fused",
       (long long)topos_plan_peak_bytes(fused), "bytes");
  rowi(wl, "peak bytes, forward plan, fusion blocked",
       (long long)topos_plan_peak_bytes(unfused), "bytes");
  rowi(wl, "peak bytes, training plan (roots [loss])",
       (long long)topos_plan_peak_bytes(train), "bytes");
  row(wl, "logits bit-identical (fused, blocked, interpreter)",
      identical ? "yes" : "no", "");

  topos_params_free(params);
  topos_plan_free(train);
  topos_plan_free(fused);
  topos_plan_free(unfused);
  for (int i = 0; i < CNN_BATCHES; i++) {
    topos_tensor_release(b[i].x);
    topos_tensor_release(b[i].y);
  }
  topos_network_release(m.net);
  if (!r.identical || !identical) {
    fprintf(stderr, "bench/compiler: cnn: %s differ\n",
            r.identical ? "fused and unfused logits"
                        : "interpreter and plan parameters");
    exit(1);
  }
}

/* -------------------------------------------------------------- attention */

enum { ATT_B = 4, ATT_H = 4, ATT_T = 128, ATT_D = 128 };

/* The first node recorded from `from` on with this shape. */
static topos_value first_of_shape(topos_tape *tape, uint32_t tape_id, int from,
                                  int rank, const int64_t *shape) {
  for (int i = from; i < topos_tape_node_count(tape); i++) {
    topos_value v = {tape_id, i};
    int r = 0;
    const int64_t *s = topos_value_shape(tape, v, &r);
    if (s && r == rank && memcmp(s, shape, sizeof(int64_t) * rank) == 0)
      return v;
  }
  die("attention: finding the scores", NULL);
  return TOPOS_NONE;
}

/* Forward and training-step time (min over repetitions is noisy on a
 * shared host: medians) of causal attention over q, k, v parameters
 * [4,128,128], 4 heads, loss sum(y·c): the plan with the chain fused and
 * the same plan with the fusion blocked (a sum of the raw scores is
 * observed, so they have a second reader), on the reference kernels and
 * on the cpu backend at 1 thread. */
static void bench_attention(void) {
  const char *wl = "attention";
  topos_backends_register_defaults();
  topos_error err = {0};
  const topos_dtype dt = TOPOS_F32;
  int64_t xs[3] = {ATT_B, ATT_T, ATT_D};
  topos_tape *tape = must(topos_tape_new(dt), "tape", NULL);
  topos_value leaf[4];
  for (int i = 0; i < 4; i++) {
    topos_tensor *t =
        must(topos_init_uniform(dt, 3, xs, -1.0, 1.0, 700 + (uint64_t)i, &err),
             "attention init", &err);
    leaf[i] = i < 3 ? topos_parameter(tape, t) : topos_constant(tape, t);
    topos_tensor_release(t);
  }
  uint32_t id = leaf[0].tape;
  int from = topos_tape_node_count(tape);
  topos_attention_opts o = {.heads = ATT_H, .causal = true};
  topos_value y = topos_attention(tape, leaf[0], leaf[1], leaf[2], &o);
  int64_t ss[3] = {ATT_B * ATT_H, ATT_T, ATT_T};
  topos_value scores = first_of_shape(tape, id, from, 3, ss);
  topos_value loss = topos_sum(tape, topos_mul(tape, y, leaf[3]));
  topos_value spy = topos_sum(tape, scores);
  topos_network *net = must(topos_tape_seal(tape, &err), "seal", &err);
  topos_plan *fwd = lower(net, &y, 1, NULL, 0, TOPOS_POSTURE_FORWARD,
                          TOPOS_NUMERICS_EXACT, "lower fused");
  topos_plan *fwd_b = lower(net, &y, 1, &spy, 1, TOPOS_POSTURE_FORWARD,
                            TOPOS_NUMERICS_EXACT, "lower blocked");
  topos_plan *tr = lower(net, &loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                         TOPOS_NUMERICS_EXACT, "lower train");
  topos_plan *tr_b = lower(net, &loss, 1, &spy, 1, TOPOS_POSTURE_TRAINING,
                           TOPOS_NUMERICS_EXACT, "lower train blocked");
  if (topos_plan_group_count(fwd) != 1 || topos_plan_group_count(tr) != 1 ||
      topos_plan_group_count(fwd_b) != 0 || topos_plan_group_count(tr_b) != 0)
    die("attention: the chain did not fuse, or blocking did not block", NULL);
  const topos_exec ref = {.backend = "reference", .threads = 1};
  const topos_exec cpu = {.backend = "cpu", .threads = 1};
  const topos_exec *ctx[2] = {&ref, &cpu};
  const topos_plan *fplans[2] = {fwd, fwd_b}, *tplans[2] = {tr, tr_b};
  enum { WARM = 2, REPS = 15 };
  /* [context][fused, blocked]: forward, and forward + gradients */
  double tf[2][2][REPS], tt[2][2][REPS];
  bool identical = true;
  topos_run *interp = must(topos_forward(net, NULL, NULL, 0, &ref, &err),
                           "attention interpreter", &err);
  const topos_tensor *want = topos_run_of(interp, y, &err);
  topos_run *tr_ref = must(topos_forward(net, NULL, NULL, 0, &ref, &err),
                           "attention interpreter", &err);
  topos_params *gwant = must(topos_gradients(tr_ref, loss, &ref, &err),
                             "attention interpreter gradients", &err);
  for (int rep = 0; rep < WARM + REPS; rep++)
    for (int c = 0; c < 2; c++)
      for (int f = 0; f < 2; f++) {
        double t0 = now_s();
        topos_run *r =
            must(topos_plan_forward(fplans[f], NULL, NULL, 0, ctx[c], &err),
                 "attention forward", &err);
        double t1 = now_s();
        identical = identical &&
                    topos_tensor_bitwise_equal(want, topos_run_of(r, y, &err));
        topos_run_free(r);
        double t2 = now_s();
        r = must(topos_plan_forward(tplans[f], NULL, NULL, 0, ctx[c], &err),
                 "attention training forward", &err);
        topos_params *g = must(topos_plan_gradients(tplans[f], r, ctx[c], &err),
                               "attention gradients", &err);
        double t3 = now_s();
        for (int k = 0; k < topos_params_count(g); k++)
          identical = identical &&
                      topos_tensor_bitwise_equal(topos_params_get(g, k),
                                                 topos_params_get(gwant, k));
        topos_params_free(g);
        topos_run_free(r);
        if (rep >= WARM) {
          tf[c][f][rep - WARM] = t1 - t0;
          tt[c][f][rep - WARM] = t3 - t2;
        }
      }
  double mf[2][2], mt[2][2];
  for (int c = 0; c < 2; c++)
    for (int f = 0; f < 2; f++) {
      mf[c][f] = median(tf[c][f], REPS) * 1e3;
      mt[c][f] = median(tt[c][f], REPS) * 1e3;
    }
  rowf(wl, "forward, reference, fusion blocked", mf[0][1], 3, "ms");
  rowf(wl, "forward, reference, fused", mf[0][0], 3, "ms");
  rowf(wl, "forward, cpu, fusion blocked", mf[1][1], 3, "ms");
  rowf(wl, "forward, cpu, fused (one attention task)", mf[1][0], 3, "ms");
  rowf(wl, "blocked / fused forward time, cpu", mf[1][1] / mf[1][0], 2, "x");
  rowf(wl, "training step (forward + gradients), cpu, blocked", mt[1][1], 3,
       "ms");
  rowf(wl, "training step (forward + gradients), cpu, fused", mt[1][0], 3,
       "ms");
  rowf(wl, "blocked / fused training step time, cpu", mt[1][1] / mt[1][0], 2,
       "x");
  rowf(wl, "blocked / fused training step time, reference", mt[0][1] / mt[0][0],
       2, "x");
  rowi(wl, "peak bytes, forward plan, fused",
       (long long)topos_plan_peak_bytes(fwd), "bytes");
  rowi(wl, "peak bytes, forward plan, fusion blocked",
       (long long)topos_plan_peak_bytes(fwd_b), "bytes");
  row(wl, "y and gradients bit-identical (all paths, interpreter)",
      identical ? "yes" : "no", "");
  topos_params_free(gwant);
  topos_run_free(tr_ref);
  topos_run_free(interp);
  topos_plan_free(fwd);
  topos_plan_free(fwd_b);
  topos_plan_free(tr);
  topos_plan_free(tr_b);
  topos_network_release(net);
  if (!identical) {
    fprintf(stderr, "bench/compiler: attention: fused and unfused differ\n");
    exit(1);
  }
}

/* ---------------------------------------------------------- 10k-node spec */

enum { SPEC_NODES = 10000, SPEC_R = 16, SPEC_C = 32 };

/*
 * A long chain of elementwise and layout ops over a [16,32] input, with
 * three constants, one parameter, a skip edge every eight ops (so it is a
 * DAG, not only a chain) and a name every 250 nodes; a sum at the end,
 * SPEC_NODES nodes in all.
 */
static topos_network *spec_build(void) {
  topos_error err = {0};
  const topos_dtype dt = TOPOS_F32;
  int64_t shape[2] = {SPEC_R, SPEC_C};
  int64_t flat[1] = {SPEC_R * SPEC_C};
  topos_tensor *t[5] = {
      topos_tensor_zeros(dt, 2, shape, &err),
      topos_init_uniform(dt, 2, shape, -0.1, 0.1, 21, &err),
      topos_init_uniform(dt, 2, shape, 0.9, 1.1, 22, &err),
      topos_init_uniform(dt, 2, shape, -1.0, 1.0, 23, &err),
      topos_init_normal(dt, 2, shape, 0.0, 0.5, 24, &err),
  };
  for (int i = 0; i < 5; i++) must(t[i], "spec tensors", &err);
  topos_tape *tape = must(topos_tape_new(dt), "tape", NULL);
  topos_value x = topos_name(tape, topos_input(tape, t[0]), "x");
  topos_value c1 = topos_constant(tape, t[1]);
  topos_value c2 = topos_constant(tape, t[2]);
  topos_value c3 = topos_constant(tape, t[3]);
  topos_value w = topos_name(tape, topos_parameter(tape, t[4]), "w");
  topos_value v = x, skip = x;
  int next_name = 250;
  for (int k = 0; topos_tape_node_count(tape) < SPEC_NODES - 4; k++) {
    switch (k % 8) {
      case 0:
        v = topos_add(tape, v, c1);
        break;
      case 1:
        v = topos_tanh(tape, v);
        break;
      case 2:
        v = topos_mul(tape, v, k % 16 == 2 ? c2 : w);
        break;
      case 3:
        v = topos_transpose(tape, v);
        break;
      case 4:
        v = topos_neg(tape, v);
        break;
      case 5:
        v = topos_transpose(tape, v);
        break;
      case 6:
        v = topos_reshape(tape, topos_reshape(tape, v, 1, flat), 2, shape);
        break;
      default:
        v = topos_maximum(tape, topos_add(tape, v, skip), c3);
        skip = v;
        break;
    }
    if (topos_tape_node_count(tape) >= next_name) {
      char name[32];
      snprintf(name, sizeof name, "n%d", next_name);
      v = topos_name(tape, v, name);
      next_name += 250;
    }
  }
  /* Top up to exactly SPEC_NODES with the final sum. */
  while (topos_tape_node_count(tape) < SPEC_NODES - 1) v = topos_neg(tape, v);
  topos_name(tape, topos_sum(tape, v), "out");
  topos_network *net = must(topos_tape_seal(tape, &err), "spec seal", &err);
  for (int i = 0; i < 5; i++) topos_tensor_release(t[i]);
  return net;
}

static void bench_spec(void) {
  const char *wl = "spec";
  topos_error err = {0};
  topos_network *net = spec_build();
  enum { WARM = 3, REPS = 21 };
  double te[REPS], td[REPS], tid[REPS];
  uint8_t *bytes = NULL;
  size_t len = 0;
  char id[65], id_decoded[65];
  bool same = true;
  if (topos_network_encode(net, &bytes, &len, &err) != TOPOS_OK)
    die("encode", &err);
  if (topos_network_id(net, id, &err) != TOPOS_OK) die("id", &err);
  for (int rep = 0; rep < WARM + REPS; rep++) {
    uint8_t *b = NULL;
    size_t n = 0;
    char out[65];
    double t0 = now_s();
    if (topos_network_encode(net, &b, &n, &err) != TOPOS_OK)
      die("encode", &err);
    double t1 = now_s();
    topos_network *dec = topos_network_decode(bytes, len, &err);
    double t2 = now_s();
    must(dec, "decode", &err);
    if (topos_network_id(net, out, &err) != TOPOS_OK) die("id", &err);
    double t3 = now_s();
    if (topos_network_id(dec, id_decoded, &err) != TOPOS_OK) die("id", &err);
    same = same && n == len && memcmp(b, bytes, len) == 0 &&
           strcmp(out, id) == 0 && strcmp(id_decoded, id) == 0;
    topos_free(b);
    topos_network_release(dec);
    if (rep >= WARM) {
      te[rep - WARM] = t1 - t0;
      td[rep - WARM] = t2 - t1;
      tid[rep - WARM] = t3 - t2;
    }
  }
  double me = median(te, REPS), md = median(td, REPS);
  double mid = median(tid, REPS);
  rowi(wl, "nodes in the spec", topos_network_node_count(net), "nodes");
  rowi(wl, "encoded size", (long long)len, "bytes");
  rowf(wl, "topos_network_encode", me * 1e6, 1, "us");
  rowf(wl, "topos_network_encode throughput", (double)len / me / 1e6, 1,
       "MB/s");
  rowf(wl, "topos_network_decode (replays the recording API)", md * 1e6, 1,
       "us");
  rowf(wl, "topos_network_decode throughput", (double)len / md / 1e6, 1,
       "MB/s");
  rowf(wl, "topos_network_id (encode + SHA-256)", mid * 1e6, 1, "us");
  rowf(wl, "topos_network_id throughput", (double)len / mid / 1e6, 1, "MB/s");
  row(wl, "round trip: same bytes and id after decode", same ? "yes" : "no",
      "");
  topos_free(bytes);
  topos_network_release(net);
  if (!same) {
    fprintf(stderr, "bench/compiler: spec: decode does not round-trip\n");
    exit(1);
  }
}

int main(void) {
  bench_prog = "bench/compiler";
  cpu_header();
  bench_makemore();
  bench_cnn();
  bench_spec();
  bench_attention(); /* last: it registers the cpu backend */
  return 0;
}
