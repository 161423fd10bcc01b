/*
 * train.c - training step time against PyTorch (issue 5; docs/bench.md
 * explains every column).
 *
 *   build/bench/train [--model makemore|lenet|mlp784] [--quick]
 *                     [--seconds S]
 *
 * Three f32 models (bench/models.h; the same networks in
 * bench/train_torch.py): the makemore MLP (batch 64), LeNet-5 (batch 64)
 * and an MLP 784-256-256-10 (batch 128), each trained with cross entropy
 * and plain SGD (lr 0.01).  A topos step is a training-posture plan's
 * forward + backward + topos_optimizer_step, with the backends
 * registered; a PyTorch step is zero_grad + forward + backward + step.
 *
 * Every measurement runs in a child process of its own, so that its peak
 * RSS (wait4's ru_maxrss) is its own:
 *   - topos: this binary again with hidden arguments (--one MODEL
 *     NUMERICS SECONDS), under numerics exact at the default thread count
 *     and at 1 thread (TOPOS_THREADS in the child's environment), and
 *     under fast at the default thread count;
 *   - PyTorch: /usr/bin/python3 bench/train_torch.py at 1 thread and at
 *     the default thread count, each with glibc's default malloc and with
 *     a malloc that keeps freed memory (GLIBC_TUNABLES), and each with
 *     OpenBLAS choosing its kernels and pinned to SkylakeX (setting
 *     "SKX"); the best wins.
 * Every child runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed
 * from its environment (platform-notes.md), except the pinned PyTorch
 * runs, which set OPENBLAS_CORETYPE=SkylakeX.
 *
 * A child warms up, then times blocks of steps (CLOCK_MONOTONIC) for a
 * fixed budget of seconds and reports the median block time per step and
 * the minor page faults per timed step.  Every configuration runs in two
 * rounds (topos first, then PyTorch first) and keeps its best time.  Before
 * that it takes a fixed number of check steps from the initial parameters and
 * reports their last loss and a hash of the parameters they produced: the run
 * exits 1 unless exact's parameters are bit-identical at 1 and at the default
 * thread count, and fast's loss is within 1e-3 (relative) of exact's.
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
#include "models.h"

#define PYTHON "/usr/bin/python3"
/* Keeps freed memory in the heap for the next step: no trimming, and no
 * mmap for large blocks (glibc 2.36 accepts both values). */
#define MALLOC_KEEP                         \
  "glibc.malloc.trim_threshold=4294967295:" \
  "glibc.malloc.mmap_threshold=4294967295"
#define LOSS_RTOL 1e-3

enum { NBATCHES = 8 };

typedef struct bench_model {
  const char *name;
  int batch;
  int check_steps;
  double target; /* exact / PyTorch must be at most this */
  model (*build)(void);
} bench_model;

static const bench_model MODELS[] = {
    {"makemore", BATCH, 40, 0.5, makemore_build},
    {"lenet", LENET_BATCH, 3, 1.0, lenet_build},
    {"mlp784", MLP_BATCH, 10, 1.0, mlp784_build},
};
enum { NMODELS = sizeof MODELS / sizeof MODELS[0] };

static const bench_model *find_model(const char *name) {
  for (int i = 0; i < NMODELS; i++)
    if (strcmp(MODELS[i].name, name) == 0) return &MODELS[i];
  return NULL;
}

/* ------------------------------------------------------------ the child */

/* NBATCHES fixed, seeded batches of the model's inputs. */
static void make_batches(const bench_model *bm, batch *b) {
  topos_error err = {0};
  uint64_t rng = 20240601;
  int64_t n = bm->batch, ys[1] = {n};
  for (int i = 0; i < NBATCHES; i++) {
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
  topos_optimizer opt = topos_sgd(0.01, 0.0);
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

typedef struct torch_best {
  bool have;
  double ms, rss_mb, minflt;
  char setting[32];
} torch_best;

static int torch_state; /* 0 unknown, 1 usable, -1 not installed */

static bool torch_importable(void) {
  char *argv[] = {PYTHON, "-c", "import torch", NULL};
  child_result r;
  if (access(PYTHON, X_OK) != 0) return false;
  spawn(argv, NULL, NULL, NULL, &r);
  return r.ok;
}

/* Folds into *best the PyTorch times over threads {1, threads} x malloc
 * {default, keep} x OpenBLAS kernels {its own choice, SkylakeX} (in quick
 * mode: 1 thread, default malloc, its own choice).  Debian's torch does
 * its dense products through libblas.so.3, i.e. OpenBLAS 0.3.21, which
 * does not recognise this CPU and falls back to generic kernels unless
 * pinned; pinned, PyTorch's 784 MLP step is about twice as fast, so the
 * pinned runs are candidates too (PyTorch gets its best). */
static void run_torch(const bench_model *bm, int threads, double seconds,
                      bool quick, torch_best *best) {
  if (torch_state < 0) return;
  const char *script = torch_script();
  if (script == NULL) die("bench/train_torch.py not found", NULL);
  int thread_set[2] = {1, threads};
  int nthreads = threads > 1 && !quick ? 2 : 1;
  for (int ti = 0; ti < nthreads; ti++) {
    for (int mi = 0; mi < (quick ? 1 : 2); mi++)
      for (int ci = 0; ci < (quick ? 1 : 2); ci++) {
        char secs[32], thr[16];
        snprintf(secs, sizeof secs, "%g", seconds);
        snprintf(thr, sizeof thr, "%d", thread_set[ti]);
        char *argv[] = {PYTHON,           (char *)script, "--model",
                        (char *)bm->name, "--threads",    thr,
                        "--seconds",      secs,           NULL};
        child_result r;
        spawn(argv, NULL, mi ? MALLOC_KEEP : NULL, ci ? "SkylakeX" : NULL, &r);
        const char *line = strstr(r.output, "ms_per_step=");
        double ms = 0, minflt = 0;
        if (!r.ok || line == NULL ||
            sscanf(line,
                   "ms_per_step=%lf steps=%*d threads=%*d minflt_per_step=%lf",
                   &ms, &minflt) != 2) {
          if (torch_state == 0 && !torch_importable()) {
            torch_state = -1;
            return;
          }
          fprintf(stderr, "%s: %s failed for %s:\n%s\n", bench_prog, script,
                  bm->name, r.output);
          exit(1);
        }
        torch_state = 1;
        if (!best->have || ms < best->ms) {
          best->have = true;
          best->ms = ms;
          best->rss_mb = r.rss_mb;
          best->minflt = minflt;
          snprintf(best->setting, sizeof best->setting, "%dT,%s%s",
                   thread_set[ti], mi ? "keep" : "default", ci ? ",SKX" : "");
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

static void header(int threads, double topos_s, double torch_s, int rounds,
                   bool quick) {
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf(
      "topos training bench: %s, %ld threads online; topos at %d "
      "thread(s) (nT) and 1 (1T)\n",
      cpu, sysconf(_SC_NPROCESSORS_ONLN), threads);
  printf(
      "ms per training step (fwd+bwd+SGD lr 0.01): median of timed blocks "
      "after warm-up, best of %d round(s); %.1f s per topos child, %.1f s per "
      "PyTorch child%s; 1-min load average at start %.2f\n\n",
      rounds, topos_s, torch_s, quick ? " (--quick)" : "", load_average());
  printf("%-8s %5s %8s %8s %8s %8s %-10s %7s %7s %-13s %-17s %s\n", "model",
         "batch", "exact nT", "exact 1T", "fast nT", "PyTorch", "(setting)",
         "ex/pt", "fast/pt", "target", "peak RSS MB e/f/p",
         "faults/step e/f/p");
  printf("%-8s %5s %8s %8s %8s %8s %-10s %7s %7s %-13s %-17s %s\n", "-----",
         "-----", "--------", "--------", "-------", "-------", "---------",
         "-----", "-------", "------", "-----------------",
         "-----------------");
}

static void fmt(char *out, size_t n, bool have, const char *f, double v) {
  if (have)
    snprintf(out, n, f, v);
  else
    snprintf(out, n, "-");
}

static void usage(void) {
  fprintf(stderr,
          "usage: train [--model makemore|lenet|mlp784] [--quick] "
          "[--seconds S]\n");
  exit(2);
}

int main(int argc, char **argv) {
  bench_prog = "bench/train";
  if (argc == 5 && strcmp(argv[1], "--one") == 0)
    return run_one(argv[2], argv[3], atof(argv[4]));

  const bench_model *only = NULL;
  bool quick = false;
  double seconds = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      only = find_model(argv[++i]);
      if (only == NULL) usage();
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
  header(threads, topos_s, torch_s, rounds, quick);

  bool failed = false;
  char notes[NMODELS][256];
  int nnotes = 0;
  for (int i = 0; i < NMODELS; i++) {
    const bench_model *bm = &MODELS[i];
    if (only && only != bm) continue;
    /* Round 0 runs topos first, round 1 PyTorch first, so that a load
     * that changes during the run weighs on both sides. */
    topos_figures en = {0}, e1 = {0}, fa = {0};
    torch_best pt = {0};
    for (int round = 0; round < rounds; round++) {
      if (round % 2) run_torch(bm, threads, torch_s, quick, &pt);
      merge(&en, run_topos(bm, "exact", threads, topos_s));
      merge(&e1, run_topos(bm, "exact", 1, topos_s));
      merge(&fa, run_topos(bm, "fast", threads, topos_s));
      if (round % 2 == 0) run_torch(bm, threads, torch_s, quick, &pt);
    }

    /* Exact's figure against PyTorch's best: the better of its two thread
     * settings, as PyTorch gets the best of its own. */
    double exact = en.ms < e1.ms ? en.ms : e1.ms;
    char pms[16], ratio_e[16], ratio_f[16], target[24], rss_p[16], flt_p[16];
    fmt(pms, sizeof pms, pt.have, "%.3f", pt.ms);
    fmt(ratio_e, sizeof ratio_e, pt.have, "%.2f", exact / pt.ms);
    fmt(ratio_f, sizeof ratio_f, pt.have, "%.2f", fa.ms / pt.ms);
    fmt(rss_p, sizeof rss_p, pt.have, "%.0f", pt.rss_mb);
    fmt(flt_p, sizeof flt_p, pt.have, "%.2f", pt.minflt);
    if (pt.have)
      snprintf(target, sizeof target, "<=%.1fx %s", bm->target,
               exact / pt.ms <= bm->target ? "met" : "missed");
    else
      snprintf(target, sizeof target, "<=%.1fx -", bm->target);
    char setting[40], rss[64], faults[64];
    snprintf(setting, sizeof setting, "(%s)", pt.have ? pt.setting : "-");
    snprintf(rss, sizeof rss, "%.0f/%.0f/%s", en.rss_mb, fa.rss_mb, rss_p);
    snprintf(faults, sizeof faults, "%.2f/%.2f/%s", en.minflt, fa.minflt,
             flt_p);
    printf("%-8s %5d %8.3f %8.3f %8.3f %8s %-10s %7s %7s %-13s %-17s %s\n",
           bm->name, bm->batch, en.ms, e1.ms, fa.ms, pms, setting, ratio_e,
           ratio_f, target, rss, faults);
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
  for (int i = 0; i < nnotes; i++) printf("check %s\n", notes[i]);
  if (torch_state < 0)
    printf(
        "PyTorch: %s cannot import torch; run `make bench-deps` to install "
        "python3-torch\n",
        PYTHON);
  return failed ? 1 : 0;
}
