/*
 * makemore_mlp.c - the character-level MLP of Bengio et al. (2003) as
 * taught in Karpathy's makemore, trained on a list of names with topos.
 *
 * Each training example is three characters of context (".." padding at
 * the start of a name) and the character that follows; '.' (0) also ends
 * a name and a-z are 1..26.  The model embeds each context character in
 * 10 dimensions, concatenates them (30), applies a 100-unit tanh layer
 * and predicts the next character among 27 with cross entropy.  Training
 * is 5000 plain-SGD steps on minibatches of 64 drawn by a seeded
 * generator, so every run prints the same numbers.
 *
 * Usage: makemore_mlp [--data PATH] [--steps N] [--server ADDRESS]
 *                     [--dump FILE]
 * The data defaults to examples/makemore/names.txt, relative to the
 * current directory (the repository root).  Output: a progress line every
 * 500 steps and, last, "final: mean loss of the last 500 steps = X";
 * the time per step goes to stderr.
 *
 * Training is one loop over topos_trainer_step, whichever trainer runs
 * it: in-process, a training plan lowered once (topos_trainer_local);
 * with --server, a toposd daemon that stores the network
 * (topos_client_trainer), where every step is one Step call carrying the
 * minibatch as feeds, the parameters and the optimizer state (the first
 * sends no parameters: the daemon starts from its stored initials).  The
 * daemon keeps nothing between steps and the numbers are bit for bit
 * those of the in-process run.
 * --dump writes the final parameters' bytes (each slot's elements
 * row-major, in slot order) to FILE.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends.h"
#include "topos.h"
#include "topos_client.h"

enum { VOCAB = 27, CONTEXT = 3, EMBED = 10, HIDDEN = 100, BATCH = 64 };

/* The dataset: CONTEXT indices per example in x, the next index in y. */
typedef struct dataset {
  int32_t *x;
  int32_t *y;
  int64_t n, cap;
} dataset;

static int char_index(int c) {
  if (c >= 'a' && c <= 'z') return c - 'a' + 1;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 1;
  return -1;
}

static int dataset_push(dataset *d, const int32_t *context, int32_t next) {
  if (d->n == d->cap) {
    int64_t cap = d->cap ? d->cap * 2 : 4096;
    int32_t *x = realloc(d->x, sizeof(int32_t) * (size_t)(cap * CONTEXT));
    if (x == NULL) return -1;
    d->x = x;
    int32_t *y = realloc(d->y, sizeof(int32_t) * (size_t)cap);
    if (y == NULL) return -1;
    d->y = y;
    d->cap = cap;
  }
  memcpy(d->x + d->n * CONTEXT, context, sizeof(int32_t) * CONTEXT);
  d->y[d->n++] = next;
  return 0;
}

/* One example per character of every name plus one for its end.
 * Characters outside a-z are skipped. */
static int dataset_load(dataset *d, const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  char line[256];
  int rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    int32_t context[CONTEXT] = {0};
    size_t len = strcspn(line, "\r\n");
    if (len == 0) continue;
    for (size_t i = 0; i <= len && rc == 0; i++) {
      int32_t next = 0;
      if (i < len) {
        int c = char_index((unsigned char)line[i]);
        if (c < 0) continue;
        next = c;
      }
      rc = dataset_push(d, context, next);
      memmove(context, context + 1, sizeof(int32_t) * (CONTEXT - 1));
      context[CONTEXT - 1] = next;
    }
  }
  fclose(f);
  return rc;
}

/* splitmix64: the minibatch order, independent of the engine's RNGs. */
static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int fail(const char *what, const topos_error *err) {
  fprintf(stderr, "makemore_mlp: %s: %s\n", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

/* The network: parameters C, W1, b1, W2, b2 (slots 0..4), inputs x and y. */
typedef struct model {
  topos_network *net;
  topos_value x, y, loss;
} model;

/*
 * Initialisation follows makemore's "good init": the output layer starts
 * near zero (W2 · 0.01, b2 = 0) so the first loss is log 27 ≈ 3.30 rather
 * than a confident wrong guess, and W1 is He-normal so the tanh units start
 * in their linear range rather than saturated.
 */
static int model_build(model *m, topos_error *err) {
  const topos_dtype dt = TOPOS_F32;
  int64_t c_shape[2] = {VOCAB, EMBED};
  int64_t w1_shape[2] = {CONTEXT * EMBED, HIDDEN};
  int64_t b1_shape[1] = {HIDDEN};
  int64_t w2_shape[2] = {HIDDEN, VOCAB};
  int64_t b2_shape[1] = {VOCAB};
  int64_t x_shape[2] = {BATCH, CONTEXT};
  int64_t y_shape[1] = {BATCH};
  topos_tensor *init[7] = {
      topos_init_normal(dt, 2, c_shape, 0.0, 1.0, 1, err),
      topos_init_kaiming(dt, 2, w1_shape, CONTEXT * EMBED, 2, err),
      topos_tensor_zeros(dt, 1, b1_shape, err),
      topos_init_normal(dt, 2, w2_shape, 0.0, 0.01, 3, err),
      topos_tensor_zeros(dt, 1, b2_shape, err),
      topos_tensor_zeros(TOPOS_I32, 2, x_shape, err),
      topos_tensor_zeros(TOPOS_I32, 1, y_shape, err),
  };
  int ok = 1;
  for (int i = 0; i < 7; i++) ok = ok && init[i] != NULL;
  topos_tape *tape = ok ? topos_tape_new(dt) : NULL;
  if (tape != NULL) {
    topos_value c = topos_name(tape, topos_parameter(tape, init[0]), "C");
    topos_value w1 = topos_name(tape, topos_parameter(tape, init[1]), "W1");
    topos_value b1 = topos_name(tape, topos_parameter(tape, init[2]), "b1");
    topos_value w2 = topos_name(tape, topos_parameter(tape, init[3]), "W2");
    topos_value b2 = topos_name(tape, topos_parameter(tape, init[4]), "b2");
    m->x = topos_name(tape, topos_input(tape, init[5]), "x");
    m->y = topos_name(tape, topos_input(tape, init[6]), "y");
    /* [B,3] indices -> [B,3,10] embeddings -> [B,30] concatenated. */
    int64_t flat[2] = {BATCH, CONTEXT * EMBED};
    topos_value emb =
        topos_reshape(tape, topos_embedding(tape, c, m->x), 2, flat);
    topos_value h = topos_tanh(tape, topos_linear(tape, emb, w1, b1));
    topos_value logits = topos_linear(tape, h, w2, b2);
    m->loss = topos_name(tape, topos_cross_entropy(tape, logits, m->y), "loss");
    m->net = topos_tape_seal(tape, err);
  }
  for (int i = 0; i < 7; i++) topos_tensor_release(init[i]);
  return m->net != NULL ? 0 : -1;
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

/* lr 0.3, then 0.03 for the last fifth: the large rate covers ground in
 * few steps, the small one settles into the basin it found. */
static double learning_rate(int step, int steps) {
  return step < steps - steps / 5 ? 0.3 : 0.03;
}

int main(int argc, char **argv) {
  /* The exact CPU backend gives the reference's bits, only faster. */
  topos_backends_register_defaults();
  const char *path = "examples/makemore/names.txt";
  const char *server = NULL, *dump = NULL;
  int steps = 5000;
  /* How steps run, in-process or on the daemon: --backend NAME
   * ("reference", "cpu", "blas" with --fast), --fast. */
  topos_exec exec = {0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--server") == 0 && i + 1 < argc) {
      server = argv[++i];
    } else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump = argv[++i];
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      exec.backend = argv[++i];
    } else if (strcmp(argv[i], "--fast") == 0) {
      exec.numerics = TOPOS_NUMERICS_FAST;
    } else {
      fprintf(stderr,
              "usage: %s [--data PATH] [--steps N] [--server ADDRESS] "
              "[--dump FILE] [--backend NAME] [--fast]\n",
              argv[0]);
      return 2;
    }
  }
  if (steps < 1) {
    fprintf(stderr, "makemore_mlp: --steps must be positive\n");
    return 2;
  }

  dataset data = {0};
  if (dataset_load(&data, path) != 0 || data.n == 0) {
    fprintf(stderr, "makemore_mlp: cannot read names from %s\n", path);
    free(data.x);
    free(data.y);
    return 1;
  }
  printf("%lld examples from %s\n", (long long)data.n, path);

  topos_error err = {0};
  model m = {0};
  if (model_build(&m, &err) != 0) {
    free(data.x);
    free(data.y);
    return fail("building the network", &err);
  }

  /* Where the steps run, chosen once: in-process (the training plan
   * lowered here) or on a daemon that stores the spec.  The loop below is
   * the same either way. */
  topos_client *client = NULL;
  topos_trainer *trainer = NULL;
  const char *where = "";
  if (server != NULL) {
    char id[65] = "";
    where = " remote";
    client = topos_client_connect(server, &err);
    if (client != NULL && topos_client_record(client, m.net, id, &err) == 0)
      trainer = topos_client_trainer(client, id, m.loss, &exec, &err);
  } else {
    trainer = topos_trainer_local(m.net, m.loss, NULL, 0, &exec, &err);
  }
  int rc = 0;
  if (trainer == NULL)
    rc = fail(server ? "the daemon" : "lowering the training plan", &err);

  /* The first step starts from the initial parameters and a fresh
   * optimizer state (NULL, NULL: remotely, the daemon's copy of the
   * initials, so nothing is uploaded); each result holds what the next
   * step takes. */
  topos_optimizer opt = topos_sgd(learning_rate(0, steps), 0.0);
  topos_step_result cur = {0};
  uint64_t rng = 20240601;
  int32_t bx[BATCH * CONTEXT], by[BATCH];
  int64_t x_shape[2] = {BATCH, CONTEXT}, y_shape[1] = {BATCH};
  int window = steps < 500 ? steps : 500;
  double window_sum = 0, block_sum = 0;
  double t0 = now_ms();
  for (int step = 0; step < steps && rc == 0; step++) {
    for (int b = 0; b < BATCH; b++) {
      int64_t k = (int64_t)(splitmix64(&rng) % (uint64_t)data.n);
      memcpy(bx + b * CONTEXT, data.x + k * CONTEXT, sizeof bx[0] * CONTEXT);
      by[b] = data.y[k];
    }
    topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, x_shape, bx, &err);
    topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, y_shape, by, &err);
    topos_feed feeds[2] = {{m.x, xt}, {m.y, yt}};
    opt.lr = learning_rate(step, steps);
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
    if (rc != 0) break;

    double loss = cur.loss;
    block_sum += loss;
    if (step >= steps - window) window_sum += loss;
    if ((step + 1) % 500 == 0) {
      printf("step %d: loss %.4f (mean of the last 500: %.4f, lr %g)\n",
             step + 1, loss, block_sum / 500, opt.lr);
      fflush(stdout);
      block_sum = 0;
    }
  }
  double elapsed = now_ms() - t0;
  if (rc == 0) {
    printf("final: mean loss of the last %d steps = %.4f\n", window,
           window_sum / window);
    fprintf(stderr, "%.3f ms/step (%d steps, %.1f s)%s\n", elapsed / steps,
            steps, elapsed / 1e3, where);
  }
  if (rc == 0 && dump != NULL && dump_params(dump, cur.params, &err) != 0)
    rc = fail("--dump", &err);

  topos_step_result_clear(&cur);
  topos_trainer_free(trainer); /* before the client it borrows */
  topos_client_close(client);
  topos_network_release(m.net);
  free(data.x);
  free(data.y);
  return rc;
}
