/*
 * train.c - training step time against PyTorch (issue 5; docs/bench.md
 * explains every column).
 *
 *   build/bench/train [--model makemore|lenet|mlp784|transformer|
 *                              fmnist-epoch] [--quick] [--seconds S]
 *                     [--data DIR]
 *
 * Four f32 models (bench/models.h and examples/common/gpt.h; the same
 * networks in bench/train_torch.py): the makemore MLP (batch 64), LeNet-5
 * (batch 64) and an MLP 784-256-256-10 (batch 128), each trained with
 * cross entropy and plain SGD (lr 0.01), and makemore's transformer
 * (batch 32 sequences of 16), trained with cross entropy ignoring padding
 * targets and AdamW (lr 1e-3, betas 0.9/0.99, eps 1e-8, decay 0.01 on
 * the rank >= 2 parameters).  A topos step is a training-posture plan's
 * forward + backward + topos_optimizer_step, with the backends
 * registered; a PyTorch step is zero_grad + forward + backward + step.
 *
 * Every measurement runs in a child process of its own, so that its peak
 * RSS (wait4's ru_maxrss) is its own:
 *   - topos: this binary again with hidden arguments (--one MODEL
 *     NUMERICS SECONDS), under numerics exact at the default thread count
 *     and at 1 thread (TOPOS_THREADS in the child's environment), and
 *     under fast at the default thread count;
 *   - PyTorch: bench/train_torch.py under each of two builds, Debian's
 *     python3-torch 1.13 (/usr/bin/python3) and a current torch from
 *     PyPI ($TORCH_VENV/bin/python, by default .torch-venv; both from
 *     `make bench-deps`), at 1 thread and at the default thread count,
 *     each with glibc's default malloc and with a malloc that keeps freed
 *     memory (GLIBC_TUNABLES), and for Debian's build each with OpenBLAS
 *     choosing its kernels and pinned to SkylakeX (setting "SKX", only on
 *     a CPU with AVX-512); each build's best wins, and on each row the
 *     faster build is the anchor that the ratios are against.  A build
 *     that cannot import torch is absent, not an error: its columns print
 *     "-" and a last line says how to install it.
 * Every child runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed
 * from its environment (docs/architecture.md, "Platform facts"), except the
 * pinned PyTorch runs, which set OPENBLAS_CORETYPE=SkylakeX.
 *
 * A child warms up, then times blocks of steps (CLOCK_MONOTONIC) for a
 * fixed budget of seconds and reports the median block time per step and
 * the minor page faults per timed step.  Every configuration runs in two
 * rounds (topos first, then PyTorch first) and keeps its best time.  Before
 * that it takes a fixed number of check steps from the initial parameters and
 * reports their last loss and a hash of the parameters they produced: the run
 * exits 1 unless exact's parameters are bit-identical at 1 and at the default
 * thread count, and fast's loss is within 1e-3 (relative) of exact's.
 *
 * Last comes one row that is not a step: a whole epoch of LeNet on the
 * 60000 Fashion-MNIST training images (--data DIR, default
 * /usr/share/datasets/fashion-mnist; 937 batches of 64 in a fixed seeded
 * order, SGD momentum 0.9 lr 0.01), one child each side (hidden
 * arguments --epoch DIR BATCHES here, --epoch in the script), each at the
 * setting that won its lenet row, PyTorch in the build that was that
 * row's anchor (--model fmnist-epoch runs the lenet row too, for them).  It
 * reports seconds per epoch and the mean loss of the last 100 steps on both
 * sides; without the data set it prints why it is skipped.  --quick runs the
 * epoch's first 50 batches.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends.h"
#include "gpt.h"
#include "idx.h"
#include "models.h"

/* Debian's PyTorch (python3-torch) runs under Debian's python, not
 * whatever python3 is first on PATH; PyPI's under TORCH_VENV's. */
#define PYTHON "/usr/bin/python3"
#define TORCH_VENV_DIR ".torch-venv"
/* Keeps freed memory in the heap for the next step: no trimming, and no
 * mmap for large blocks (glibc 2.36 accepts both values). */
#define MALLOC_KEEP                         \
  "glibc.malloc.trim_threshold=4294967295:" \
  "glibc.malloc.mmap_threshold=4294967295"
#define LOSS_RTOL 1e-3
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define EPOCH_ROW "fmnist-epoch"

enum { NBATCHES = 8 };

/* makemore's transformer (examples/common/gpt.h), batch 32 sequences. */
enum { GPT_BATCH = 32 };

static model transformer_build(void) {
  topos_error err = {0};
  ex_gpt g;
  if (ex_gpt_build(&g, &EX_GPT_MAKEMORE, GPT_BATCH, true, &err) != 0)
    die("transformer build", &err);
  return (model){g.net, g.x, g.y, g.logits, g.loss};
}

typedef struct bench_model {
  const char *name;
  int batch;
  int check_steps;
  double target; /* exact / PyTorch must be at most this; 0: no target */
  model (*build)(void);
  bool adamw; /* AdamW lr 1e-3 (makemore_transformer's), else SGD lr 0.01 */
} bench_model;

static const bench_model MODELS[] = {
    {"makemore", BATCH, 40, 0.5, makemore_build, false},
    {"lenet", LENET_BATCH, 3, 1.0, lenet_build, false},
    {"mlp784", MLP_BATCH, 10, 0.8, mlp784_build, false},
    {"transformer", GPT_BATCH, 10, 1.0, transformer_build, true},
};
enum { NMODELS = sizeof MODELS / sizeof MODELS[0] };

static const bench_model *find_model(const char *name) {
  for (int i = 0; i < NMODELS; i++)
    if (strcmp(MODELS[i].name, name) == 0) return &MODELS[i];
  return NULL;
}

static topos_optimizer bench_optimizer(const bench_model *bm) {
  return bm->adamw ? topos_adamw(1e-3, 0.9, 0.99, 1e-8, 0.01)
                   : topos_sgd(0.01, 0.0);
}

/* ------------------------------------------------------------ the child */

/* One batch of sequences like makemore's padded names (x = ". w", y =
 * "w ." then EX_GPT_IGNORE), w of 2 to 15 random letters. */
static void padded_names(batch *b, int64_t n, uint64_t *rng) {
  const ex_gpt_config c = EX_GPT_MAKEMORE;
  const int64_t T = c.context;
  int32_t *x = calloc((size_t)(n * T), sizeof *x);
  int32_t *y = malloc(sizeof *y * (size_t)(n * T));
  if (x == NULL || y == NULL) die("transformer batch", NULL);
  for (int64_t i = 0; i < n; i++) {
    int64_t len = 2 + (int64_t)(splitmix64(rng) % (uint64_t)(T - 2));
    int32_t *xi = x + i * T, *yi = y + i * T;
    for (int64_t k = 0; k < T; k++) yi[k] = EX_GPT_IGNORE;
    for (int64_t k = 0; k < len; k++) {
      xi[k + 1] = 1 + (int32_t)(splitmix64(rng) % (uint64_t)(c.vocab - 1));
      yi[k] = xi[k + 1];
    }
    yi[len] = 0;
  }
  topos_error err = {0};
  int64_t xs[2] = {n, T}, ys[1] = {n * T};
  b->x = must(topos_tensor_from(TOPOS_I32, 2, xs, x, &err), "batch", &err);
  b->y = must(topos_tensor_from(TOPOS_I32, 1, ys, y, &err), "batch", &err);
  free(x);
  free(y);
}

/* NBATCHES fixed, seeded batches of the model's inputs. */
static void make_batches(const bench_model *bm, batch *b) {
  topos_error err = {0};
  uint64_t rng = 20240601;
  int64_t n = bm->batch, ys[1] = {n};
  for (int i = 0; i < NBATCHES; i++) {
    if (strcmp(bm->name, "transformer") == 0) {
      padded_names(&b[i], n, &rng);
      continue;
    }
    if (strcmp(bm->name, "makemore") == 0) {
      int64_t xs[2] = {n, CONTEXT};
      b[i].x = random_indices(2, xs, n * CONTEXT, VOCAB, &rng);
      b[i].y = random_indices(1, ys, n, VOCAB, &rng);
      continue;
    }
    int64_t xl[4] = {n, 1, 28, 28}, xm[2] = {n, MLP_IN};
    bool lenet = strcmp(bm->name, "lenet") == 0;
    b[i].x = must(topos_init_uniform(TOPOS_F32, lenet ? 4 : 2, lenet ? xl : xm,
                                     0.0, 1.0, splitmix64(&rng), &err),
                  "batch", &err);
    b[i].y =
        random_indices(1, ys, n, lenet ? LENET_CLASSES : MLP_CLASSES, &rng);
  }
}

/* FNV-1a over every parameter's f32 bits. */
static uint64_t params_hash(const topos_params *p) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < topos_params_count(p); i++) {
    const topos_tensor *t = topos_params_get(p, i);
    size_t bytes =
        (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
    unsigned char *buf = malloc(bytes ? bytes : 1);
    topos_error err = {0};
    if (!buf || topos_tensor_read(t, buf, bytes, &err) != TOPOS_OK)
      die("reading a parameter", &err);
    for (size_t k = 0; k < bytes; k++) h = (h ^ buf[k]) * 0x100000001b3ull;
    free(buf);
  }
  return h;
}

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* --one MODEL NUMERICS SECONDS: one measurement, one result line. */
static int run_one(const char *name, const char *numerics, double seconds) {
  const bench_model *bm = find_model(name);
  if (bm == NULL) die("unknown model", NULL);
  topos_numerics num = strcmp(numerics, "fast") == 0 ? TOPOS_NUMERICS_FAST
                                                     : TOPOS_NUMERICS_EXACT;
  topos_backends_register_defaults();
  model m = bm->build();
  batch b[NBATCHES];
  make_batches(bm, b);
  topos_plan *plan = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                           num, "lower train");
  topos_optimizer opt = bench_optimizer(bm);
  trainer t;
  trainer_init(&t, m.net, plan, m.loss, &opt);

  /* The check steps, from the initial parameters (also a warm-up). */
  t.keep_loss = true;
  train_block(&t, &opt, b, NBATCHES, m.x, m.y, bm->check_steps);
  double check_loss = t.last_loss;
  uint64_t hash = params_hash(t.params);
  t.keep_loss = false;

  /* Warm-up: a fifth of the budget, at least two steps; it also sizes the
   * blocks so that about 15 fit in the rest. */
  double t0 = now_s();
  int warm = 0;
  while (warm < 2 || now_s() - t0 < 0.2 * seconds) {
    train_block(&t, &opt, b, NBATCHES, m.x, m.y, 1);
    warm++;
  }
  double per_step = (now_s() - t0) / warm;
  int block = (int)(0.8 * seconds / 15 / per_step);
  if (block < 1) block = 1;

  enum { MAX_BLOCKS = 200 };
  double times[MAX_BLOCKS];
  int nblocks = 0;
  long f0 = minor_faults(), timed = 0;
  double start = now_s();
  while (nblocks < 5 ||
         (now_s() - start < 0.8 * seconds && nblocks < MAX_BLOCKS)) {
    times[nblocks++] = train_block(&t, &opt, b, NBATCHES, m.x, m.y, block);
    timed += block;
  }
  long f1 = minor_faults();
  printf("result ms=%.6f steps=%ld minflt=%.3f loss=%.9g hash=%016llx\n",
         median(times, nblocks) * 1e3 / block, timed,
         (double)(f1 - f0) / (double)timed, check_loss,
         (unsigned long long)hash);

  trainer_free(&t);
  topos_plan_free(plan);
  for (int i = 0; i < NBATCHES; i++) {
    topos_tensor_release(b[i].x);
    topos_tensor_release(b[i].y);
  }
  topos_network_release(m.net);
  return 0;
}

/* The epoch row's data and arithmetic (train_torch.py does the same). */
enum { EPOCH_BATCH = LENET_BATCH, EPOCH_TAIL = 100, QUICK_EPOCH = 50 };
#define EPOCH_SEED 20240601u
#define FMNIST_MEAN 0.2860 /* Fashion-MNIST's training pixel mean and */
#define FMNIST_STD 0.3530  /* standard deviation, on [0,1] */

/* A fixed order of n rows: Fisher-Yates from the top with splitmix64
 * (train_torch.py's epoch_order draws the same). */
static int32_t *epoch_order(int64_t n, uint64_t seed) {
  int32_t *perm = malloc(sizeof *perm * (size_t)n);
  if (perm == NULL) die("epoch order", NULL);
  for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
    int32_t tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  return perm;
}

/*
 * --epoch DIR BATCHES: LeNet (exact) over the first BATCHES batches (0:
 * all) of one epoch of the Fashion-MNIST training set in DIR, one result
 * line.  The timed loop includes building each batch from the bytes
 * (scale, normalise, gather labels), as a data loader would; loading the
 * files does not count.  Exits 3 with a "skip" line when the data set
 * cannot be loaded.
 */
static int run_epoch(const char *dir, int limit) {
  topos_error err = {0};
  ex_mnist d = {0};
  if (ex_mnist_load(dir, true, &d, &err) != 0) {
    printf("skip %s\n", err.message);
    return 3;
  }
  if (d.rows != 28 || d.cols != 28 || d.n < EPOCH_BATCH) {
    printf("skip %s holds %lld images of %lldx%lld, not 28x28\n", dir,
           (long long)d.n, (long long)d.rows, (long long)d.cols);
    ex_mnist_free(&d);
    return 3;
  }
  topos_backends_register_defaults();
  model m = lenet_build();
  topos_plan *plan = lower(m.net, &m.loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING,
                           TOPOS_NUMERICS_EXACT, "lower train");
  topos_optimizer opt = topos_sgd(0.01, 0.9);
  trainer t;
  trainer_init(&t, m.net, plan, m.loss, &opt);
  t.keep_loss = true;
  int32_t *perm = epoch_order(d.n, EPOCH_SEED);
  int64_t steps = d.n / EPOCH_BATCH; /* the last partial batch dropped */
  if (limit > 0 && limit < steps) steps = limit;
  enum { PIX = 28 * 28 };
  float *xb = malloc(sizeof *xb * EPOCH_BATCH * PIX);
  int32_t yb[EPOCH_BATCH];
  if (xb == NULL) die("epoch batch", NULL);
  int64_t xs[4] = {EPOCH_BATCH, 1, 28, 28}, ys[1] = {EPOCH_BATCH};
  int64_t tail_from = steps > EPOCH_TAIL ? steps - EPOCH_TAIL : 0;
  double tail = 0, first = 0;

  double t0 = now_s();
  for (int64_t s = 0; s < steps; s++) {
    const int32_t *rows = perm + s * EPOCH_BATCH;
    for (int i = 0; i < EPOCH_BATCH; i++) {
      const uint8_t *img = d.images + (int64_t)rows[i] * PIX;
      for (int k = 0; k < PIX; k++)
        xb[i * PIX + k] = (float)((img[k] / 255.0 - FMNIST_MEAN) / FMNIST_STD);
      yb[i] = d.labels[rows[i]];
    }
    topos_tensor *x = topos_tensor_from(TOPOS_F32, 4, xs, xb, &err);
    topos_tensor *y = topos_tensor_from(TOPOS_I32, 1, ys, yb, &err);
    if (x == NULL || y == NULL) die("epoch batch", &err);
    topos_feed feeds[2] = {{m.x, x}, {m.y, y}};
    train_step(&t, &opt, feeds, 2);
    topos_tensor_release(x);
    topos_tensor_release(y);
    if (s == 0) first = t.last_loss;
    if (s >= tail_from) tail += t.last_loss;
  }
  double seconds = now_s() - t0;
  printf("epoch s=%.4f steps=%lld loss=%.6f first=%.6f\n", seconds,
         (long long)steps, tail / (double)(steps - tail_from), first);

  free(xb);
  free(perm);
  trainer_free(&t);
  topos_plan_free(plan);
  topos_network_release(m.net);
  ex_mnist_free(&d);
  return 0;
}

/* ----------------------------------------------------------- the parent */

typedef struct child_result {
  bool ok;
  double ms, minflt, loss, rss_mb;
  unsigned long long hash;
  char output[4096]; /* everything the child wrote, for errors */
} child_result;

/*
 * Runs argv with stdout and stderr captured.  In the child TOPOS_THREADS
 * is `threads` (unset when NULL), GLIBC_TUNABLES is `tunables` (unset
 * when NULL), and both OpenBLAS variables are removed.  Fills output,
 * rss_mb and ok (exit status 0); the caller parses the output.
 */
static void spawn(char *const argv[], const char *threads, const char *tunables,
                  const char *coretype, child_result *r) {
  memset(r, 0, sizeof *r);
  int fd[2];
  if (pipe(fd) != 0) die("pipe", NULL);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", NULL);
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], STDOUT_FILENO);
    dup2(fd[1], STDERR_FILENO);
    close(fd[1]);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_L2_SIZE");
    if (coretype) setenv("OPENBLAS_CORETYPE", coretype, 1);
    if (threads)
      setenv("TOPOS_THREADS", threads, 1);
    else
      unsetenv("TOPOS_THREADS");
    if (tunables)
      setenv("GLIBC_TUNABLES", tunables, 1);
    else
      unsetenv("GLIBC_TUNABLES");
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0;
  for (;;) {
    char chunk[1024];
    ssize_t n = read(fd[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    /* Keep the tail (chunk is smaller than output): the result line
     * comes last. */
    size_t room = sizeof r->output - 1;
    if (len + (size_t)n > room) {
      size_t drop = len + (size_t)n - room;
      memmove(r->output, r->output + drop, len - drop);
      len -= drop;
    }
    memcpy(r->output + len, chunk, (size_t)n);
    len += (size_t)n;
  }
  r->output[len] = '\0';
  close(fd[0]);
  int status = 0;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0)
    if (errno != EINTR) die("wait4", NULL);
  r->rss_mb = (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB */
  r->ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static const char *self_exe(void) {
  static char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) die("readlink /proc/self/exe", NULL);
  path[n] = '\0';
  return path;
}

static child_result run_topos(const bench_model *bm, const char *numerics,
                              int threads, double seconds) {
  char secs[32], thr[16];
  snprintf(secs, sizeof secs, "%g", seconds);
  snprintf(thr, sizeof thr, "%d", threads);
  char *argv[] = {(char *)self_exe(), "--one", (char *)bm->name,
                  (char *)numerics,   secs,    NULL};
  child_result r;
  spawn(argv, thr, NULL, NULL, &r);
  const char *line = strstr(r.output, "result ");
  if (!r.ok || line == NULL ||
      sscanf(line, "result ms=%lf steps=%*d minflt=%lf loss=%lf hash=%llx",
             &r.ms, &r.minflt, &r.loss, &r.hash) != 4) {
    fprintf(stderr, "%s: %s %s at %d thread(s) failed:\n%s\n", bench_prog,
            bm->name, numerics, threads, r.output);
    exit(1);
  }
  return r;
}

/* One topos configuration over the rounds: its best time, its highest
 * peak RSS and fault rate, and whether every round's check steps ended
 * with the same parameter bits and loss. */
typedef struct topos_figures {
  int runs;
  bool same;
  double ms, rss_mb, minflt, loss;
  unsigned long long hash;
} topos_figures;

static void merge(topos_figures *f, child_result r) {
  if (f->runs++ == 0) {
    *f = (topos_figures){1, true, r.ms, r.rss_mb, r.minflt, r.loss, r.hash};
    return;
  }
  f->same = f->same && f->hash == r.hash && f->loss == r.loss;
  if (r.ms < f->ms) f->ms = r.ms;
  if (r.rss_mb > f->rss_mb) f->rss_mb = r.rss_mb;
  if (r.minflt > f->minflt) f->minflt = r.minflt;
}

/* bench/train_torch.py: in the working directory (make runs from the
 * repository root) or above the binary (build/bench/train,
 * build/asan/bench/train). */
static const char *torch_script(void) {
  static char path[4096 + 64];
  if (access("bench/train_torch.py", R_OK) == 0) return "bench/train_torch.py";
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", self_exe());
  for (int up = 0; up < 4; up++) {
    char *slash = strrchr(dir, '/');
    if (slash == NULL) break;
    *slash = '\0';
    snprintf(path, sizeof path, "%s/bench/train_torch.py", dir);
    if (access(path, R_OK) == 0) return path;
  }
  return NULL;
}

/* The PyTorch builds, each run at its best setting; on every row the
 * faster of them is the anchor that the ratios are against. */
typedef struct torch_build {
  const char *what;  /* for the lines that name it */
  bool openblas;     /* its dense products go through OpenBLAS */
  char python[4160]; /* the interpreter that runs train_torch.py */
  bool have;         /* train_torch.py --version ran and named a torch */
  char version[48];  /* torch.__version__, as train_torch.py printed it */
  char label[16];    /* its columns' name: "PT 1.13", or which build */
  char missing[160]; /* why it is absent: its last line of output */
} torch_build;

enum { NBUILDS = 2 };
static torch_build builds[NBUILDS] = {
    {.what = "Debian's python3-torch", .openblas = true, .label = "PT deb"},
    {.what = "torch from PyPI", .openblas = false, .label = "PT pypi"},
};

/* The PyPI build's python: $TORCH_VENV/bin/python when TORCH_VENV is set
 * (the Makefile exports it), else TORCH_VENV_DIR/bin/python in the
 * working directory or above the binary, as torch_script() looks. */
static void pypi_python(char *out, size_t n) {
  const char *venv = getenv("TORCH_VENV");
  if (venv && *venv) {
    snprintf(out, n, "%s/bin/python", venv);
    return;
  }
  char dir[4096];
  if (getcwd(dir, sizeof dir) != NULL) {
    snprintf(out, n, "%s/" TORCH_VENV_DIR "/bin/python", dir);
    if (access(out, X_OK) == 0) return;
  }
  snprintf(dir, sizeof dir, "%s", self_exe());
  for (int up = 0; up < 4; up++) {
    char *slash = strrchr(dir, '/');
    if (slash == NULL) break;
    *slash = '\0';
    snprintf(out, n, "%s/" TORCH_VENV_DIR "/bin/python", dir);
    if (access(out, X_OK) == 0) return;
  }
  snprintf(out, n, TORCH_VENV_DIR "/bin/python");
}

/* The last non-empty line of a child's output, for a message. */
static void last_line(const char *output, char *out, size_t n) {
  size_t len = strlen(output);
  while (len > 0 && (output[len - 1] == '\n' || output[len - 1] == ' ')) len--;
  size_t start = len;
  while (start > 0 && output[start - 1] != '\n') start--;
  snprintf(out, n, "%.*s", (int)(len - start), output + start);
}

/* Which builds can run train_torch.py (`--version` imports torch and
 * prints torch=VERSION), their versions and column names. */
static void probe_builds(void) {
  const char *script = torch_script();
  if (script == NULL) die("bench/train_torch.py not found", NULL);
  snprintf(builds[0].python, sizeof builds[0].python, "%s", PYTHON);
  pypi_python(builds[1].python, sizeof builds[1].python);
  for (int i = 0; i < NBUILDS; i++) {
    torch_build *b = &builds[i];
    if (access(b->python, X_OK) != 0) {
      snprintf(b->missing, sizeof b->missing, "%s: %s", b->python,
               strerror(errno));
      continue;
    }
    char *argv[] = {b->python, (char *)script, "--version", NULL};
    child_result r;
    spawn(argv, NULL, NULL, NULL, &r);
    const char *v = strstr(r.output, "torch=");
    int major = 0, minor = 0;
    if (!r.ok || v == NULL || sscanf(v, "torch=%47s", b->version) != 1) {
      last_line(r.output, b->missing, sizeof b->missing);
      continue;
    }
    b->have = true;
    if (sscanf(b->version, "%d.%d", &major, &minor) == 2)
      snprintf(b->label, sizeof b->label, "PT %d.%d", major, minor);
  }
}

/* Checks that a result line came from the torch that the probe found. */
static void same_torch(const torch_build *b, const char *output) {
  const char *v = strstr(output, "torch=");
  char version[48] = "";
  if (v == NULL || sscanf(v, "torch=%47s", version) != 1 ||
      strcmp(version, b->version) != 0) {
    fprintf(stderr, "%s: %s ran torch %s, not %s:\n%s\n", bench_prog, b->python,
            version[0] ? version : "(none)", b->version, output);
    exit(1);
  }
}

typedef struct torch_best {
  bool have;
  double ms, rss_mb, minflt;
  char setting[32];
  int threads; /* the setting that won */
  bool keep, skx;
} torch_best;

/* Whether the CPU has AVX-512 (the "avx512f" flag of /proc/cpuinfo):
 * OpenBLAS's SkylakeX kernels need it, and a process pinned to them on a
 * CPU without it dies of SIGILL (AMD EPYC before Zen 4, for one). */
static bool cpu_has_avx512(void) {
  static int known = -1;
  if (known >= 0) return known;
  known = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return false;
  char line[8192];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "flags", 5) != 0) continue;
    known = strstr(line, " avx512f") != NULL;
    break;
  }
  fclose(f);
  return known;
}

/* Folds into *best build b's times over threads {1, threads} x malloc
 * {default, keep}, and for Debian's build x OpenBLAS kernels {its own
 * choice, SkylakeX} (in quick mode: 1 thread, default malloc, its own
 * choice; SkylakeX only on a CPU with AVX-512).  Debian's torch does its
 * dense products through libblas.so.3, i.e. OpenBLAS 0.3.21, which does
 * not recognise this CPU and falls back to generic kernels unless
 * pinned; pinned, PyTorch's 784 MLP step is about twice as fast, so the
 * pinned runs are candidates too (PyTorch gets its best).  PyPI's torch
 * uses MKL and oneDNN, which choose their kernels from the CPU's flags
 * (and turning oneDNN off made its LeNet step slower), so it runs the
 * threads x malloc settings alone. */
static void run_torch(const bench_model *bm, const torch_build *b, int threads,
                      double seconds, bool quick, torch_best *best) {
  if (!b->have) return;
  const char *script = torch_script();
  int thread_set[2] = {1, threads};
  int nthreads = threads > 1 && !quick ? 2 : 1;
  int ncores = quick || !b->openblas || !cpu_has_avx512() ? 1 : 2;
  for (int ti = 0; ti < nthreads; ti++) {
    for (int mi = 0; mi < (quick ? 1 : 2); mi++)
      for (int ci = 0; ci < ncores; ci++) {
        char secs[32], thr[16];
        snprintf(secs, sizeof secs, "%g", seconds);
        snprintf(thr, sizeof thr, "%d", thread_set[ti]);
        char *argv[] = {(char *)b->python, (char *)script, "--model",
                        (char *)bm->name,  "--threads",    thr,
                        "--seconds",       secs,           NULL};
        child_result r;
        spawn(argv, NULL, mi ? MALLOC_KEEP : NULL, ci ? "SkylakeX" : NULL, &r);
        const char *line = strstr(r.output, "ms_per_step=");
        double ms = 0, minflt = 0;
        if (!r.ok || line == NULL ||
            sscanf(line,
                   "ms_per_step=%lf steps=%*d threads=%*d minflt_per_step=%lf",
                   &ms, &minflt) != 2) {
          fprintf(stderr, "%s: %s %s failed for %s:\n%s\n", bench_prog,
                  b->python, script, bm->name, r.output);
          exit(1);
        }
        same_torch(b, line);
        if (!best->have || ms < best->ms) {
          best->have = true;
          best->ms = ms;
          best->rss_mb = r.rss_mb;
          best->minflt = minflt;
          snprintf(best->setting, sizeof best->setting, "%dT,%s%s",
                   thread_set[ti], mi ? "keep" : "default", ci ? ",SKX" : "");
          best->threads = thread_set[ti];
          best->keep = mi;
          best->skx = ci;
        }
      }
  }
}

/* ------------------------------------------------------------ the table */

static int default_threads(void) {
  const char *env = getenv("TOPOS_THREADS");
  if (env && *env) {
    char *end = NULL;
    long v = strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 1 && v <= 1024) return (int)v;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* The width of build b's (setting) column: "(2T,default,SKX)" or
 * "(2T,default)". */
static int setting_width(const torch_build *b) {
  return b->openblas ? 16 : 12;
}

static void header(int threads, double topos_s, double torch_s, int rounds,
                   bool quick) {
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf(
      "topos training bench: %s, %ld threads online; topos at %d "
      "thread(s) (nT) and 1 (1T)\n",
      cpu, sysconf(_SC_NPROCESSORS_ONLN), threads);
  printf(
      "ms per training step (fwd+bwd+update: SGD lr 0.01; the transformer "
      "AdamW lr 1e-3): median of timed blocks "
      "after warm-up, best of %d round(s); %.1f s per topos child, %.1f s per "
      "PyTorch child%s; 1-min load average at start %.2f\n",
      rounds, topos_s, torch_s, quick ? " (--quick)" : "", load_average());
  printf(
      "PyTorch builds, each at its best setting; ex/pt and fast/pt are "
      "against the faster of them on each row (the anchor, its ms marked "
      "*):\n");
  for (int i = 0; i < NBUILDS; i++) {
    const torch_build *b = &builds[i];
    if (b->have)
      printf("  %s: %s, torch %s (%s)\n", b->label, b->what, b->version,
             b->python);
    else
      printf("  %s: %s, absent (the last line says why)\n", b->label, b->what);
  }
  printf("\n");
  char cols[2][160];
  snprintf(cols[0], sizeof cols[0], "%-11s %5s %8s %8s %8s", "model", "batch",
           "exact nT", "exact 1T", "fast nT");
  snprintf(cols[1], sizeof cols[1], "%-11s %5s %8s %8s %8s", "-----", "-----",
           "--------", "--------", "-------");
  for (int i = 0; i < NBUILDS; i++) {
    const torch_build *b = &builds[i];
    size_t n0 = strlen(cols[0]), n1 = strlen(cols[1]);
    snprintf(cols[0] + n0, sizeof cols[0] - n0, " %8s %-*s", b->label,
             setting_width(b), "(setting)");
    snprintf(cols[1] + n1, sizeof cols[1] - n1, " %8s %-*s", "-------",
             setting_width(b), "---------");
  }
  printf("%s %7s %7s %-13s %-17s %s\n", cols[0], "ex/pt", "fast/pt", "target",
         "peak RSS MB e/f/p", "faults/step e/f/p");
  printf("%s %7s %7s %-13s %-17s %s\n", cols[1], "-----", "-------", "------",
         "-----------------", "-----------------");
}

static void fmt(char *out, size_t n, bool have, const char *f, double v) {
  if (have)
    snprintf(out, n, f, v);
  else
    snprintf(out, n, "-");
}

/* ------------------------------------------------------ the epoch row */

/* Where each side runs the epoch: the settings that won the lenet row,
 * and for PyTorch the build that was its anchor (-1: none ran). */
typedef struct epoch_setting {
  int topos_threads, torch_threads;
  bool keep, skx;
  int build;
} epoch_setting;

typedef struct epoch_result {
  bool have;
  double seconds, loss, first;
  int steps;
} epoch_result;

static bool parse_epoch(const char *out, const char *key, epoch_result *e) {
  const char *line = strstr(out, key);
  char fmt[64];
  snprintf(fmt, sizeof fmt, "%s%%lf steps=%%d", key);
  if (line == NULL || sscanf(line, fmt, &e->seconds, &e->steps) != 2)
    return false;
  const char *loss = strstr(line, "loss=");
  const char *first = strstr(line, "first=");
  e->have = loss && first && sscanf(loss, "loss=%lf", &e->loss) == 1 &&
            sscanf(first, "first=%lf", &e->first) == 1;
  return e->have;
}

/* One epoch each side (topos first), one table row or a line saying why
 * there is none.  Returns false on a failed child. */
static bool epoch_row(const char *dir, int limit, const epoch_setting *es) {
  char lim[16], thr[16];
  snprintf(lim, sizeof lim, "%d", limit);
  snprintf(thr, sizeof thr, "%d", es->topos_threads);
  char *targv[] = {(char *)self_exe(), "--epoch", (char *)dir, lim, NULL};
  child_result r;
  spawn(targv, thr, NULL, NULL, &r);
  if (!r.ok && strncmp(r.output, "skip ", 5) == 0) {
    printf("%s row skipped: no Fashion-MNIST training set: %.*s\n", EPOCH_ROW,
           (int)strcspn(r.output + 5, "\n"), r.output + 5);
    return true;
  }
  epoch_result te = {0}, pe = {0};
  if (!r.ok || !parse_epoch(r.output, "epoch s=", &te)) {
    fprintf(stderr, "%s: the topos epoch failed:\n%s\n", bench_prog, r.output);
    return false;
  }

  const torch_build *b = es->build >= 0 ? &builds[es->build] : NULL;
  if (b != NULL) {
    const char *script = torch_script();
    snprintf(thr, sizeof thr, "%d", es->torch_threads);
    char *pargv[] = {
        (char *)b->python, (char *)script, "--epoch", lim, "--threads", thr,
        "--data",          (char *)dir,    NULL};
    spawn(pargv, NULL, es->keep ? MALLOC_KEEP : NULL,
          es->skx ? "SkylakeX" : NULL, &r);
    if (!r.ok || !parse_epoch(r.output, "epoch_s=", &pe)) {
      fprintf(stderr, "%s: %s %s --epoch failed:\n%s\n", bench_prog, b->python,
              script, r.output);
      return false;
    }
    same_torch(b, strstr(r.output, "epoch_s="));
  }

  const char *pname = b != NULL ? b->label : "PyTorch";
  char tset[24], pset[40], pts[16], ratio[16], ploss[16], pcol[24], plcol[24];
  snprintf(tset, sizeof tset, "(exact %dT)", es->topos_threads);
  snprintf(pset, sizeof pset, "(%dT,%s%s)", es->torch_threads,
           es->keep ? "keep" : "default", es->skx ? ",SKX" : "");
  fmt(pts, sizeof pts, pe.have, "%.3f", pe.seconds);
  fmt(ratio, sizeof ratio, pe.have, "%.2f", te.seconds / pe.seconds);
  fmt(ploss, sizeof ploss, pe.have, "%.4f", pe.loss);
  if (!pe.have) snprintf(pset, sizeof pset, "(-)");
  snprintf(pcol, sizeof pcol, "%s s", pname);
  snprintf(plcol, sizeof plcol, "loss %s", pname);
  printf("%-12s %5s %8s %-12s %9s %-17s %6s %-12s %s\n", "row", "steps",
         "topos s", "(setting)", pcol, "(setting)", "ex/pt", "loss topos",
         plcol);
  printf("%-12s %5d %8.3f %-12s %9s %-17s %6s %-12.4f %s\n", EPOCH_ROW,
         te.steps, te.seconds, tset, pts, pset, ratio, te.loss, ploss);
  char pfirst[16];
  fmt(pfirst, sizeof pfirst, pe.have, "%.4f", pe.first);
  printf(
      "(loss: the mean of the last %d steps' losses; the first step's: "
      "%.4f in topos, %s in %s)\n",
      te.steps < EPOCH_TAIL ? te.steps : EPOCH_TAIL, te.first, pfirst, pname);
  return true;
}

static void usage(void) {
  fprintf(stderr,
          "usage: train [--model "
          "makemore|lenet|mlp784|transformer|" EPOCH_ROW
          "] [--quick] [--seconds S] [--data DIR]\n");
  exit(2);
}

int main(int argc, char **argv) {
  bench_prog = "bench/train";
  if (argc == 5 && strcmp(argv[1], "--one") == 0)
    return run_one(argv[2], argv[3], atof(argv[4]));
  if (argc == 4 && strcmp(argv[1], "--epoch") == 0)
    return run_epoch(argv[2], atoi(argv[3]));

  const bench_model *only = NULL;
  bool epoch_only = false, quick = false;
  const char *data = FMNIST_DIR;
  double seconds = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      i++;
      epoch_only = strcmp(argv[i], EPOCH_ROW) == 0;
      only = find_model(argv[i]);
      if (only == NULL && !epoch_only) usage();
    } else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) {
      data = argv[++i];
    } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = atof(argv[++i]);
      if (!(seconds > 0)) usage();
    } else {
      usage();
    }
  }
  double topos_s = seconds > 0 ? seconds : quick ? 0.5 : 2.5;
  double torch_s = seconds > 0 ? seconds : quick ? 0.5 : 1.0;
  int rounds = quick ? 1 : 2;
  int threads = default_threads();
  probe_builds();
  header(threads, topos_s, torch_s, rounds, quick);

  bool failed = false;
  char notes[NMODELS][256];
  int nnotes = 0;
  epoch_setting es = {threads, threads, false, false, -1};
  for (int i = 0; i < NMODELS; i++) {
    const bench_model *bm = &MODELS[i];
    /* The epoch row alone still runs the lenet row, for its settings. */
    if (epoch_only ? bm->build != lenet_build : only && only != bm) continue;
    /* Round 0 runs topos first, then the PyTorch builds in order; round 1
     * the builds first, in reverse order, then topos, so that a load that
     * changes during the run weighs on every side. */
    topos_figures en = {0}, e1 = {0}, fa = {0};
    torch_best pts[NBUILDS] = {0};
    for (int round = 0; round < rounds; round++) {
      if (round % 2)
        for (int k = NBUILDS - 1; k >= 0; k--)
          run_torch(bm, &builds[k], threads, torch_s, quick, &pts[k]);
      merge(&en, run_topos(bm, "exact", threads, topos_s));
      merge(&e1, run_topos(bm, "exact", 1, topos_s));
      merge(&fa, run_topos(bm, "fast", threads, topos_s));
      if (round % 2 == 0)
        for (int k = 0; k < NBUILDS; k++)
          run_torch(bm, &builds[k], threads, torch_s, quick, &pts[k]);
    }

    /* The anchor: the faster PyTorch build at its best setting. */
    int anchor = -1;
    for (int k = 0; k < NBUILDS; k++)
      if (pts[k].have && (anchor < 0 || pts[k].ms < pts[anchor].ms)) anchor = k;
    torch_best pt = anchor >= 0 ? pts[anchor] : (torch_best){0};

    /* Exact's figure against the anchor: the better of its two thread
     * settings, as PyTorch gets the best of its own. */
    double exact = en.ms < e1.ms ? en.ms : e1.ms;
    if (bm->build == lenet_build) {
      es.topos_threads = en.ms < e1.ms ? threads : 1;
      if (pt.have) {
        es.torch_threads = pt.threads;
        es.keep = pt.keep;
        es.skx = pt.skx;
        es.build = anchor;
      }
    }
    /* Each build's best ms (the anchor's marked *) and its setting. */
    char cols[160] = "";
    for (int k = 0; k < NBUILDS; k++) {
      char ms[24], setting[40];
      if (pts[k].have)
        snprintf(ms, sizeof ms, "%.3f%s", pts[k].ms, k == anchor ? "*" : " ");
      else
        snprintf(ms, sizeof ms, "- ");
      snprintf(setting, sizeof setting, "(%s)",
               pts[k].have ? pts[k].setting : "-");
      size_t n = strlen(cols);
      snprintf(cols + n, sizeof cols - n, " %8s %-*s", ms,
               setting_width(&builds[k]), setting);
    }
    char ratio_e[16], ratio_f[16], target[24], rss_p[16], flt_p[16];
    fmt(ratio_e, sizeof ratio_e, pt.have, "%.2f", exact / pt.ms);
    fmt(ratio_f, sizeof ratio_f, pt.have, "%.2f", fa.ms / pt.ms);
    fmt(rss_p, sizeof rss_p, pt.have, "%.0f", pt.rss_mb);
    fmt(flt_p, sizeof flt_p, pt.have, "%.2f", pt.minflt);
    if (bm->target <= 0)
      snprintf(target, sizeof target, "none");
    else if (pt.have)
      snprintf(target, sizeof target, "<=%.1fx %s", bm->target,
               exact / pt.ms <= bm->target ? "met" : "missed");
    else
      snprintf(target, sizeof target, "<=%.1fx -", bm->target);
    char rss[64], faults[64];
    snprintf(rss, sizeof rss, "%.0f/%.0f/%s", en.rss_mb, fa.rss_mb, rss_p);
    snprintf(faults, sizeof faults, "%.2f/%.2f/%s", en.minflt, fa.minflt,
             flt_p);
    printf("%-11s %5d %8.3f %8.3f %8.3f%s %7s %7s %-13s %-17s %s\n", bm->name,
           bm->batch, en.ms, e1.ms, fa.ms, cols, ratio_e, ratio_f, target, rss,
           faults);
    fflush(stdout);

    bool same_bits =
        en.same && e1.same && en.hash == e1.hash && en.loss == e1.loss;
    double rel = fabs(fa.loss - en.loss) / fmax(fabs(en.loss), 1e-30);
    if (!same_bits) {
      snprintf(notes[nnotes++], sizeof notes[0],
               "%s: exact params after %d steps differ between runs "
               "(%d threads, 1 thread, rounds) (FAILED)",
               bm->name, bm->check_steps, threads);
      failed = true;
    } else if (!(rel <= LOSS_RTOL)) {
      snprintf(notes[nnotes++], sizeof notes[0],
               "%s: fast loss %.7g vs exact %.7g after %d steps: relative "
               "difference %.2g > %g (FAILED)",
               bm->name, fa.loss, en.loss, bm->check_steps, rel, LOSS_RTOL);
      failed = true;
    } else {
      snprintf(notes[nnotes++], sizeof notes[0],
               "%s: exact params bit-identical at %d and 1 thread(s), %d "
               "run(s) each, after %d steps; fast loss within %.1e of exact "
               "(%.7g vs %.7g)",
               bm->name, threads, en.runs, bm->check_steps, rel, fa.loss,
               en.loss);
    }
  }
  printf("\n");
  if (only == NULL) {
    int limit = quick ? QUICK_EPOCH : 0;
    if (quick)
      printf(
          "Fashion-MNIST epoch row (--quick: its first %d batches only): "
          "LeNet",
          limit);
    else
      printf("Fashion-MNIST epoch row: LeNet, one epoch");
    printf(
        " on the training set in %s, batches of 64 in a fixed seeded order "
        "(the last partial one dropped), SGD momentum 0.9 lr 0.01, from fresh "
        "parameters; one run each side, each at the setting that won its "
        "lenet row, PyTorch in the build that was that row's anchor\n",
        data);
    if (!epoch_row(data, limit, &es)) failed = true;
    printf("\n");
  }
  for (int i = 0; i < nnotes; i++) printf("check %s\n", notes[i]);
  for (int k = 0; k < NBUILDS; k++)
    if (!builds[k].have)
      printf(
          "PyTorch: %s (%s) is missing, its columns print -: %s; run `make "
          "bench-deps` to install it\n",
          builds[k].label, builds[k].what, builds[k].missing);
  return failed ? 1 : 0;
}
