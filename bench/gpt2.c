/*
 * gpt2.c - GPT-2 124M inference, topos against PyTorch on the same weights
 * and machine in one run (issue 14, item 8; docs/bench.md):
 *
 *   forward256  one forward of 256 tokens, full logits [256, 50257] (ms);
 *   decode@128  ms per generated token at positions 128, 129, ... after a
 *               prefill of 128 tokens, with a KV cache;
 *   peak RSS    of each side's process, against the weights' size.
 *
 * The weights are GPT-2's initialisation from a seed (ex_gpt2_init,
 * config 124M: no weights can be downloaded here), written once to a
 * temporary safetensors file with Hugging Face's names (ex_gpt2_save) by
 * a child of its own.  Each side then runs in a child process of its own,
 * so that its peak RSS (wait4's ru_maxrss) is its own, and loads that file:
 *   - topos: this binary again with hidden arguments (--child ...), which
 *     loads the file with ex_gpt2_load and runs the examples' decoder path
 *     (examples/gpt2/gpt2.c's): ex_gpt2_record records a step network for
 *     T tokens after `past` cached ones, ex_kv_run runs it
 *     (a forward plan of the step network - topos_network_lower,
 *     topos_plan_forward - on the weights, the default backends
 *     registered, numerics exact, the threads in its topos_exec) and
 *     hands back the new cache;
 *   - PyTorch: /usr/bin/python3 bench/gpt2_torch.py FILE DIR, a GPT-2
 *     module of HF's arithmetic (Conv1D, GELU tanh, tied head, a KV cache
 *     of concatenated past keys and values) under torch.inference_mode().
 *
 * Threads: both sides at --threads N (default 2) and, in a full run with
 * N > 1, also at 1 thread, in the same process (topos_exec.threads; in
 * PyTorch torch.set_num_threads and openblas_set_num_threads), and each
 * side's figure is its better one, the winning setting printed beside it
 * (bench/train's convention: on these shared 2-vCPU VMs PyTorch's two
 * threads can lose badly to one under load).  TOPOS_THREADS and
 * OPENBLAS_NUM_THREADS are N in the children, and OPENBLAS_CORETYPE and
 * OPENBLAS_L2_SIZE are removed.  PyTorch runs in one process with glibc's
 * default malloc and one that keeps freed memory (GLIBC_TUNABLES, as in
 * bench/train: a decode step's torch.cat otherwise takes fresh pages), and,
 * on a CPU with AVX-512 where OpenBLAS picked kernels without it, a third
 * pinned to SkylakeX.  --quick: N threads only, default malloc only, fewer
 * repetitions.
 *
 * The 256 tokens are splitmix64 outputs from a seed mod 50257, the same
 * on both sides.  Forward: the network for 256 tokens is recorded once
 * (its recording time is printed apart), one untimed warm-up call, then
 * the median of the timed calls.  Decode: prefill tokens 0..127 once,
 * then passes of consecutive single-token steps at positions 128, 129,
 * ..., each pass from the prefilled cache, feeding the sequence's own
 * tokens 128, 129, ... (teacher forcing, so that both sides run the same
 * tokens whatever their logits), after an untimed 2-step pass; the figure
 * is the median step.  A topos step is what a user of the API pays per
 * token: ex_gpt2_record (the network depends on the cache's length, so
 * there is one per position) + ex_kv_run + ex_kv_net_free; the recording
 * part is also printed apart.
 *
 * Both sides write the forward's last logits row (position 255) and the
 * last decode step's row; the run exits 1 when either pair differs by
 * more than 1e-4 in relative L2 norm.  Without an importable torch, topos
 * is measured alone (exit 0).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends.h"
#include "gpt2.h"
#include "models.h"

#define PYTHON "/usr/bin/python3"
#define MALLOC_KEEP                         \
  "glibc.malloc.trim_threshold=4294967295:" \
  "glibc.malloc.mmap_threshold=4294967295"
#define TOKEN_SEED 20240601ull
#define WEIGHT_SEED 1ull
#define MAX_REL_L2 1e-4
/* The aims of issue 14 item 8. */
#define AIM_FORWARD 1.0
#define AIM_DECODE 0.5
#define AIM_RSS 1.5

enum { FWD_T = 256, DEC_POS = 128, MAX_REPS = 64, MAX_STEPS = 512 };

static int vocab(void) {
  return EX_GPT2_124M.vocab;
}

/* The sequence both sides run: splitmix64 from the seed, mod the vocab. */
static void make_tokens(int32_t *tok, int n) {
  uint64_t state = TOKEN_SEED;
  for (int i = 0; i < n; i++)
    tok[i] = (int32_t)(splitmix64(&state) % (uint64_t)vocab());
}

static void write_row(const char *dir, const char *name, const float *row) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL ||
      fwrite(row, sizeof *row, (size_t)vocab(), f) != (size_t)vocab() ||
      fclose(f) != 0)
    die(path, NULL);
}

/* ------------------------------------------------------------ children */

/* A field of /proc/self/status in kB ("VmHWM: %lf kB": the peak
 * resident set so far; "VmRSS: %lf kB": now), in 10^6 bytes. */
static double status_mb(const char *format) {
  FILE *f = fopen("/proc/self/status", "r");
  double kb = NAN;
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, format, &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024.0 / 1e6;
}

static double hwm_mb(void) {
  return status_mb("VmHWM: %lf kB");
}
static double rss_now_mb(void) {
  return status_mb("VmRSS: %lf kB");
}

/* --write FILE: the 124M weights from WEIGHT_SEED, as safetensors. */
static int run_write(const char *path) {
  topos_error err = {0};
  ex_gpt2_weights w;
  if (ex_gpt2_init(&w, &EX_GPT2_124M, WEIGHT_SEED, &err) != 0)
    die("ex_gpt2_init", &err);
  if (ex_gpt2_save(&w, path, &err) != 0) die("ex_gpt2_save", &err);
  ex_gpt2_weights_free(&w);
  return 0;
}

/* A cache holding base's tensors (retained): a run replaces them in the
 * copy and leaves base as it is. */
static void cache_copy(ex_kv_cache *c, const ex_kv_cache *base) {
  topos_error err = {0};
  if (ex_kv_cache_init(c, base->layers, &err) != 0) die("cache", &err);
  for (int l = 0; l < base->layers; l++) {
    c->k[l] = topos_tensor_retain(base->k[l]);
    c->v[l] = topos_tensor_retain(base->v[l]);
  }
  c->len = base->len;
}

/* The forward of the 256 tokens at `threads`: the median time of `reps`
 * calls after a warm-up; the last row of the logits into row. */
static double time_forward(const ex_gpt2_weights *w, const int32_t *tok,
                           int threads, int reps, double *rec_ms, float *row) {
  topos_error err = {0};
  topos_exec ctx = {.numerics = TOPOS_NUMERICS_EXACT, .threads = threads};
  ex_kv_net fwd;
  double t0 = now_s();
  if (ex_gpt2_record(&fwd, w, FWD_T, 0, &err) != 0) die("record", &err);
  *rec_ms = (now_s() - t0) * 1e3;
  double times[MAX_REPS];
  for (int i = -1; i < reps; i++) {
    ex_kv_cache cache;
    if (ex_kv_cache_init(&cache, w->c.layers, &err) != 0) die("cache", &err);
    topos_tensor *all = NULL;
    double a = now_s();
    if (ex_kv_run(&fwd, tok, &cache, &ctx, row, &all, &err) != 0)
      die("forward", &err);
    double b = now_s();
    if (topos_tensor_rank(all) != 2 || topos_tensor_shape(all)[0] != FWD_T ||
        topos_tensor_shape(all)[1] != w->c.vocab)
      die("forward: the logits are not [256, vocab]", NULL);
    topos_tensor_release(all);
    ex_kv_cache_free(&cache);
    if (i >= 0) times[i] = b - a;
  }
  ex_kv_net_free(&fwd);
  return median(times, reps) * 1e3;
}

typedef struct decode_figures {
  double step_ms, rec_ms, run_ms, prefill_ms;
} decode_figures;

/* Decode at `threads`: the prefill of tokens 0..127, then `passes` passes
 * of `steps` steps from position 128 (after a 2-step warm-up pass); the
 * last step's logits into row. */
static decode_figures time_decode(const ex_gpt2_weights *w, const int32_t *tok,
                                  int threads, int passes, int steps,
                                  float *row) {
  topos_error err = {0};
  topos_exec ctx = {.numerics = TOPOS_NUMERICS_EXACT, .threads = threads};
  decode_figures f;
  ex_kv_cache base;
  if (ex_kv_cache_init(&base, w->c.layers, &err) != 0) die("cache", &err);
  double t0 = now_s();
  ex_kv_net pre;
  if (ex_gpt2_record(&pre, w, DEC_POS, 0, &err) != 0 ||
      ex_kv_run(&pre, tok, &base, &ctx, row, NULL, &err) != 0)
    die("prefill", &err);
  ex_kv_net_free(&pre);
  f.prefill_ms = (now_s() - t0) * 1e3;
  static double step_s[MAX_STEPS], rec_s[MAX_STEPS], run_s[MAX_STEPS];
  int n = 0;
  for (int p = -1; p < passes; p++) {
    ex_kv_cache cache;
    cache_copy(&cache, &base);
    for (int s = 0; s < (p < 0 ? 2 : steps); s++) {
      int64_t pos = DEC_POS + s;
      ex_kv_net net;
      double a = now_s();
      if (ex_gpt2_record(&net, w, 1, pos, &err) != 0) die("record", &err);
      double b = now_s();
      if (ex_kv_run(&net, &tok[pos], &cache, &ctx, row, NULL, &err) != 0)
        die("decode step", &err);
      double d = now_s();
      ex_kv_net_free(&net);
      double e = now_s();
      if (p >= 0) {
        step_s[n] = e - a;
        rec_s[n] = b - a;
        run_s[n] = d - b;
        n++;
      }
    }
    ex_kv_cache_free(&cache);
  }
  ex_kv_cache_free(&base);
  f.step_ms = median(step_s, n) * 1e3;
  f.rec_ms = median(rec_s, n) * 1e3;
  f.run_ms = median(run_s, n) * 1e3;
  return f;
}

/* --child FILE DIR THREADS,... REPS PASSES STEPS: topos's measurements at
 * each thread count, one result line each, then one rss line. */
static int run_child(const char *file, const char *dir, const char *threads,
                     int reps, int passes, int steps) {
  if (reps < 1 || reps > MAX_REPS || passes < 1 || steps < 2 ||
      passes * steps > MAX_STEPS || DEC_POS + steps > FWD_T)
    die("--child: repetitions out of range", NULL);
  topos_error err = {0};
  topos_backends_register_defaults();
  char plugins[512];
  topos_backends_plugin_report(plugins, sizeof plugins);
  printf("plugins %.*s\n", (int)strcspn(plugins, "\n"), plugins);
  const ex_gpt2_config c = EX_GPT2_124M;
  double t0 = now_s();
  ex_gpt2_weights w;
  if (ex_gpt2_load(&w, &c, file, &err) != 0) die("ex_gpt2_load", &err);
  double load_s = now_s() - t0, hwm_load = hwm_mb(), rss_load = rss_now_mb();
  double hwm_fwd = NAN;
  int32_t tok[FWD_T];
  make_tokens(tok, FWD_T);
  float *row = malloc(sizeof *row * (size_t)c.vocab);
  if (row == NULL) die("logits row", NULL);
  for (const char *p = threads; *p;) {
    char *end = NULL;
    long t = strtol(p, &end, 10);
    if (end == p || t < 1) die("--child: bad thread list", NULL);
    p = *end == ',' ? end + 1 : end;
    double rec_ms;
    double fwd_ms = time_forward(&w, tok, (int)t, reps, &rec_ms, row);
    write_row(dir, "topos.fwd.f32", row);
    if (isnan(hwm_fwd)) hwm_fwd = hwm_mb();
    decode_figures d = time_decode(&w, tok, (int)t, passes, steps, row);
    write_row(dir, "topos.dec.f32", row);
    printf(
        "result threads=%ld fwd_ms=%.3f fwd_rec_ms=%.3f dec_ms=%.3f "
        "dec_rec_ms=%.3f dec_run_ms=%.3f prefill_ms=%.3f\n",
        t, fwd_ms, rec_ms, d.step_ms, d.rec_ms, d.run_ms, d.prefill_ms);
    fflush(stdout);
  }
  printf(
      "rss load_s=%.3f hwm_load_mb=%.1f rss_load_mb=%.1f hwm_fwd_mb=%.1f "
      "hwm_mb=%.1f\n",
      load_s, hwm_load, rss_load, hwm_fwd, hwm_mb());
  free(row);
  ex_gpt2_weights_free(&w);
  return 0;
}

/* ----------------------------------------------------------- the parent */

typedef struct child_result {
  bool ok;
  double rss_mb; /* 10^6 bytes */
  char output[8192];
} child_result;

/* Runs argv with stdout and stderr captured and the OpenBLAS variables
 * removed; OPENBLAS_CORETYPE is coretype and GLIBC_TUNABLES tunables when
 * not NULL, TOPOS_THREADS and OPENBLAS_NUM_THREADS `threads`. */
static void spawn(char *const argv[], const char *threads, const char *coretype,
                  const char *tunables, child_result *r) {
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
    unsetenv("GLIBC_TUNABLES");
    if (coretype) setenv("OPENBLAS_CORETYPE", coretype, 1);
    if (tunables) setenv("GLIBC_TUNABLES", tunables, 1);
    if (threads) {
      setenv("TOPOS_THREADS", threads, 1);
      setenv("OPENBLAS_NUM_THREADS", threads, 1);
    }
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0;
  for (;;) {
    char chunk[1024];
    ssize_t got = read(fd[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    size_t room = sizeof r->output - 1; /* keep the tail */
    if (len + (size_t)got > room) {
      size_t drop = len + (size_t)got - room;
      memmove(r->output, r->output + drop, len - drop);
      len -= drop;
    }
    memcpy(r->output + len, chunk, (size_t)got);
    len += (size_t)got;
  }
  r->output[len] = '\0';
  close(fd[0]);
  int status = 0;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0)
    if (errno != EINTR) die("wait4", NULL);
  r->rss_mb = (double)ru.ru_maxrss * 1024.0 / 1e6; /* ru_maxrss: KiB */
  r->ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static const char *self_exe(void) {
  static char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) die("readlink /proc/self/exe", NULL);
  path[n] = '\0';
  return path;
}

/* bench/gpt2_torch.py: in the working directory (make runs from the
 * repository root) or above the binary (build/bench/gpt2). */
static const char *torch_script(void) {
  static char path[4096 + 64];
  if (access("bench/gpt2_torch.py", R_OK) == 0) return "bench/gpt2_torch.py";
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", self_exe());
  for (int up = 0; up < 4; up++) {
    char *slash = strrchr(dir, '/');
    if (slash == NULL) break;
    *slash = '\0';
    snprintf(path, sizeof path, "%s/bench/gpt2_torch.py", dir);
    if (access(path, R_OK) == 0) return path;
  }
  return NULL;
}

static bool torch_importable(void) {
  if (access(PYTHON, X_OK) != 0) return false;
  char *argv[] = {PYTHON, "-c", "import torch", NULL};
  child_result r;
  spawn(argv, NULL, NULL, NULL, &r);
  return r.ok;
}

static bool cpu_has_avx512(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return false;
  char line[8192];
  bool has = false;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "flags", 5) != 0) continue;
    has = strstr(line, " avx512f") != NULL;
    break;
  }
  fclose(f);
  return has;
}

/* One measured setting: a side, its label, its figures. */
typedef struct setting {
  const char *side;
  char label[32];
  double fwd_ms, fwd_rec_ms, dec_ms, dec_rec_ms, dec_run_ms, prefill_ms;
  int process; /* index into procs */
} setting;

/* One child process: its peak RSS (wait4) and its phases (VmHWM). */
typedef struct process {
  const char *side;
  char label[32];
  double rss_mb, load_s, hwm_load, rss_load, hwm_fwd, hwm_end;
} process;

enum { MAX_SETTINGS = 16, MAX_PROCS = 8 };
static setting settings[MAX_SETTINGS];
static int nsettings;
static process procs[MAX_PROCS];
static int nprocs;

/* The number after `key` in line, or NaN. */
static double field(const char *line, const char *key) {
  const char *eol = strchr(line, '\n');
  const char *at = strstr(line, key);
  double v = NAN;
  if (at == NULL || (eol && at > eol) ||
      sscanf(at + strlen(key), "%lf", &v) != 1)
    return NAN;
  return v;
}

static void keep_min(double *into, double v) {
  if (v < *into) *into = v;
}
static void keep_max(double *into, double v) {
  if (v > *into) *into = v;
}

/* Adds a process, or folds it into the one of the same side and label
 * (an earlier round): the highest memory figures, the least load time. */
static int add_process(const process *p) {
  for (int i = 0; i < nprocs; i++) {
    process *q = &procs[i];
    if (strcmp(q->side, p->side) != 0 || strcmp(q->label, p->label) != 0)
      continue;
    keep_max(&q->rss_mb, p->rss_mb);
    keep_max(&q->hwm_load, p->hwm_load);
    keep_max(&q->rss_load, p->rss_load);
    keep_max(&q->hwm_fwd, p->hwm_fwd);
    keep_max(&q->hwm_end, p->hwm_end);
    keep_min(&q->load_s, p->load_s);
    return i;
  }
  if (nprocs == MAX_PROCS) die("too many processes", NULL);
  procs[nprocs] = *p;
  return nprocs++;
}

/* Adds a setting, or folds it into the one of the same side and label:
 * the least of each time (each figure is the best over the rounds). */
static void add_setting(const setting *s) {
  for (int i = 0; i < nsettings; i++) {
    setting *q = &settings[i];
    if (strcmp(q->side, s->side) != 0 || strcmp(q->label, s->label) != 0)
      continue;
    keep_min(&q->fwd_ms, s->fwd_ms);
    keep_min(&q->fwd_rec_ms, s->fwd_rec_ms);
    keep_min(&q->dec_ms, s->dec_ms);
    keep_min(&q->dec_rec_ms, s->dec_rec_ms);
    keep_min(&q->dec_run_ms, s->dec_run_ms);
    keep_min(&q->prefill_ms, s->prefill_ms);
    return;
  }
  if (nsettings == MAX_SETTINGS) die("too many settings", NULL);
  settings[nsettings++] = *s;
}

/* Reads a child's result lines (one per thread count) and its rss line;
 * false when they are not all there. */
static bool parse_child(const child_result *r, const char *side,
                        const char *label, int expect) {
  if (!r->ok) return false;
  process pr = {.side = side, .rss_mb = r->rss_mb, .hwm_end = NAN};
  snprintf(pr.label, sizeof pr.label, "%s", label);
  setting found[4];
  int n = 0;
  for (const char *line = r->output; line && *line;) {
    if (strncmp(line, "result ", 7) == 0 && n < 4) {
      setting *s = &found[n++];
      *s = (setting){.side = side};
      snprintf(s->label, sizeof s->label, "%.0fT%s%s", field(line, "threads="),
               *label ? "," : "", label);
      s->fwd_ms = field(line, "fwd_ms=");
      s->fwd_rec_ms = field(line, "fwd_rec_ms=");
      s->dec_ms = field(line, "dec_ms=");
      s->dec_rec_ms = field(line, "dec_rec_ms=");
      s->dec_run_ms = field(line, "dec_run_ms=");
      s->prefill_ms = field(line, "prefill_ms=");
      if (isnan(s->fwd_ms) || isnan(s->dec_ms) || isnan(s->prefill_ms))
        return false;
    } else if (strncmp(line, "rss ", 4) == 0) {
      pr.load_s = field(line, "load_s=");
      pr.hwm_load = field(line, "hwm_load_mb=");
      pr.rss_load = field(line, "rss_load_mb=");
      pr.hwm_fwd = field(line, "hwm_fwd_mb=");
      pr.hwm_end = field(line, "hwm_mb=");
    }
    line = strchr(line, '\n');
    if (line) line++;
  }
  if (n != expect || isnan(pr.hwm_end)) return false;
  int at = add_process(&pr);
  for (int i = 0; i < n; i++) {
    found[i].process = at;
    add_setting(&found[i]);
  }
  return true;
}

typedef struct run_config {
  const char *file, *dir;
  int threads, reps, passes, steps;
  char list[32]; /* the thread counts, "2,1" */
  int nlist;
} run_config;

/* What the topos child's topos_backends_plugin_report said. */
static char topos_plugins[256] = "?";

static void run_topos(const run_config *rc) {
  char thr[16], reps[16], passes[16], steps[16];
  snprintf(thr, sizeof thr, "%d", rc->threads);
  snprintf(reps, sizeof reps, "%d", rc->reps);
  snprintf(passes, sizeof passes, "%d", rc->passes);
  snprintf(steps, sizeof steps, "%d", rc->steps);
  char *argv[] = {(char *)self_exe(),
                  "--child",
                  (char *)rc->file,
                  (char *)rc->dir,
                  (char *)rc->list,
                  reps,
                  passes,
                  steps,
                  NULL};
  child_result r;
  spawn(argv, thr, NULL, NULL, &r);
  if (!parse_child(&r, "topos", "", rc->nlist)) {
    fprintf(stderr, "%s: the topos child failed:\n%s\n", bench_prog, r.output);
    exit(1);
  }
  const char *at = strstr(r.output, "plugins ");
  if (at)
    snprintf(topos_plugins, sizeof topos_plugins, "%.*s",
             (int)strcspn(at + 8, "\n"), at + 8);
}

static int torch_state; /* 0 unknown, 1 usable, -1 not importable */

/* A PyTorch child; *corename is OpenBLAS's choice of kernels. */
static void run_torch(const run_config *rc, const char *coretype,
                      const char *tunables, const char *label, char *corename,
                      size_t cap) {
  if (torch_state < 0) return;
  const char *script = torch_script();
  if (script == NULL) die("bench/gpt2_torch.py not found", NULL);
  char thr[16], reps[16], passes[16], steps[16];
  snprintf(thr, sizeof thr, "%d", rc->threads);
  snprintf(reps, sizeof reps, "%d", rc->reps);
  snprintf(passes, sizeof passes, "%d", rc->passes);
  snprintf(steps, sizeof steps, "%d", rc->steps);
  char *argv[] = {
      PYTHON,      (char *)script,   (char *)rc->file, (char *)rc->dir,
      "--threads", (char *)rc->list, "--reps",         reps,
      "--passes",  passes,           "--steps",        steps,
      NULL};
  child_result r;
  spawn(argv, thr, coretype, tunables, &r);
  if (!parse_child(&r, "torch", label, rc->nlist)) {
    if (torch_state == 0 && !torch_importable()) {
      torch_state = -1;
      return;
    }
    fprintf(stderr, "%s: %s failed:\n%s\n", bench_prog, script, r.output);
    exit(1);
  }
  torch_state = 1;
  const char *at = strstr(r.output, "corename=");
  snprintf(corename, cap, "%.*s", at ? (int)strcspn(at + 9, " \n") : 1,
           at ? at + 9 : "?");
}

/* Relative L2 distance of topos's row from PyTorch's. */
static double compare_rows(const char *dir, const char *which) {
  int V = vocab();
  float *a = malloc(sizeof *a * (size_t)V), *b = malloc(sizeof *b * (size_t)V);
  if (a == NULL || b == NULL) die("rows", NULL);
  const char *side[2] = {"topos", "torch"};
  float *rows[2] = {a, b};
  for (int s = 0; s < 2; s++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s.f32", dir, side[s], which);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(rows[s], sizeof(float), (size_t)V, f) : 0;
    if (f) fclose(f);
    if (got != (size_t)V) die(path, NULL);
  }
  double num = 0, den = 0;
  for (int i = 0; i < V; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  free(a);
  free(b);
  return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* The worst distances seen, over the PyTorch processes. */
static double worst_fwd, worst_dec;

static void check_rows(const char *dir) {
  if (torch_state <= 0) return;
  double f = compare_rows(dir, "fwd"), d = compare_rows(dir, "dec");
  if (isnan(f) || f > worst_fwd) worst_fwd = f; /* a NaN sticks */
  if (isnan(d) || d > worst_dec) worst_dec = d;
}

/* The data bytes of a safetensors file: its size less the 8-byte length
 * and the JSON header, in 10^6 bytes. */
static double weights_mb(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char len[8];
  struct stat st;
  if (f == NULL || fread(len, 1, 8, f) != 8 || stat(path, &st) != 0)
    die(path, NULL);
  fclose(f);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len[i];
  return (double)((uint64_t)st.st_size - 8 - hlen) / 1e6;
}

/* The side's setting with the least of a figure (offset into setting). */
static const setting *best(const char *side, size_t offset) {
  const setting *b = NULL;
  for (int i = 0; i < nsettings; i++) {
    const setting *s = &settings[i];
    double v = *(const double *)((const char *)s + offset);
    if (strcmp(s->side, side) == 0 &&
        (b == NULL || v < *(const double *)((const char *)b + offset)))
      b = s;
  }
  return b;
}

static const process *least_rss(const char *side) {
  const process *b = NULL;
  for (int i = 0; i < nprocs; i++)
    if (strcmp(procs[i].side, side) == 0 &&
        (b == NULL || procs[i].rss_mb < b->rss_mb))
      b = &procs[i];
  return b;
}

static void row(const char *what, size_t offset, const char *unit, double aim) {
  const setting *t = best("topos", offset), *p = best("torch", offset);
  double tv = *(const double *)((const char *)t + offset);
  char tl[40];
  snprintf(tl, sizeof tl, "(%s)", t->label);
  printf("gpt2-124m %-11s topos %8.1f %-6s %-6s", what, tv, unit, tl);
  if (p == NULL) {
    printf("  torch        -                        (aim <= %.1f)\n", aim);
    return;
  }
  double pv = *(const double *)((const char *)p + offset);
  char pl[40];
  snprintf(pl, sizeof pl, "(%s)", p->label);
  printf("  torch %8.1f %-6s %-14s  ratio %5.2f (aim <= %.1f: %s)\n", pv, unit,
         pl, tv / pv, aim, tv / pv <= aim ? "met" : "missed");
}

static void usage(void) {
  fprintf(stderr, "usage: gpt2 [--quick] [--threads N]\n");
  exit(2);
}

int main(int argc, char **argv) {
  bench_prog = "bench/gpt2";
  if (argc == 3 && strcmp(argv[1], "--write") == 0) return run_write(argv[2]);
  if (argc == 8 && strcmp(argv[1], "--child") == 0)
    return run_child(argv[2], argv[3], argv[4], atoi(argv[5]), atoi(argv[6]),
                     atoi(argv[7]));
  bool quick = false;
  int threads = 2;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      char *end = NULL;
      long t = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end || t < 1 || t > 256) usage();
      threads = (int)t;
    } else {
      usage();
    }
  }
  run_config rc = {.threads = threads,
                   .reps = quick ? 2 : 5,
                   .passes = quick ? 1 : 2,
                   .steps = quick ? 4 : 16};
  int rounds = quick ? 1 : 2;
  if (threads > 1 && !quick) {
    snprintf(rc.list, sizeof rc.list, "%d,1", threads);
    rc.nlist = 2;
  } else {
    snprintf(rc.list, sizeof rc.list, "%d", threads);
    rc.nlist = 1;
  }

  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  printf(
      "topos GPT-2 bench: %s, %ld threads online; both sides at %s "
      "thread(s), each figure the side's best; 1-min load average at start "
      "%.2f%s\n",
      cpu, sysconf(_SC_NPROCESSORS_ONLN), rc.list, load_average(),
      quick ? " (--quick)" : "");
  printf(
      "GPT-2 124M f32 (GPT-2's initialisation from seed %llu); forward256: "
      "median of %d calls after a warm-up; decode@128: median of %d pass(es) "
      "x %d consecutive steps from position %d, each from the prefilled "
      "cache; each figure the best of %d round(s)\n",
      (unsigned long long)WEIGHT_SEED, rc.reps, rc.passes, rc.steps, DEC_POS,
      rounds);

  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/topos-gpt2-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) die("mkdtemp", NULL);
  char file[4096 + 32];
  snprintf(file, sizeof file, "%s/gpt2-124m.safetensors", dir);
  rc.file = file;
  rc.dir = dir;
  double t0 = now_s();
  {
    char *wargv[] = {(char *)self_exe(), "--write", file, NULL};
    child_result r;
    spawn(wargv, NULL, NULL, NULL, &r);
    if (!r.ok) {
      fprintf(stderr, "%s: writing the weights failed:\n%s\n", bench_prog,
              r.output);
      return 1;
    }
  }
  double wmb = weights_mb(file);
  printf("weights: %.1f MB of f32 (10^6 bytes), written in %.1f s\n\n", wmb,
         now_s() - t0);

  /* Rounds: topos first, then PyTorch first (a load that changes during
   * the run weighs on both sides); the rows are compared after each
   * PyTorch process. */
  char core[64] = "", core2[64];
  bool pin = false;
  for (int round = 0; round < rounds; round++) {
    if (round % 2 == 0) run_topos(&rc);
    run_torch(&rc, NULL, NULL, "default", core, sizeof core);
    check_rows(dir);
    if (!quick && torch_state > 0) {
      run_torch(&rc, NULL, MALLOC_KEEP, "keep", core2, sizeof core2);
      check_rows(dir);
      pin = cpu_has_avx512() && strcmp(core, "SkylakeX") != 0 &&
            strcmp(core, "Cooperlake") != 0 &&
            strcmp(core, "SapphireRapids") != 0;
      if (pin) {
        run_torch(&rc, "SkylakeX", NULL, "SKX", core2, sizeof core2);
        check_rows(dir);
      }
    }
    if (round % 2 == 1) run_topos(&rc);
  }
  bool failed = !(worst_fwd <= MAX_REL_L2) || !(worst_dec <= MAX_REL_L2);
  bool have = torch_state > 0;

  row("forward256", offsetof(setting, fwd_ms), "ms", AIM_FORWARD);
  row("decode@128", offsetof(setting, dec_ms), "ms/tok", AIM_DECODE);
  const process *tp = least_rss("topos"), *pp = least_rss("torch");
  printf("gpt2-124m %-11s topos %8.1f MB            ", "peak RSS", tp->rss_mb);
  if (pp) {
    char pl[40];
    snprintf(pl, sizeof pl, "(%s)", pp->label);
    printf("  torch %8.1f MB     %-14s  ratio %5.2f\n", pp->rss_mb, pl,
           tp->rss_mb / pp->rss_mb);
  } else
    printf("  torch        -\n");
  printf("gpt2-124m %-11s topos %8.2f x             ", "RSS/weights",
         tp->rss_mb / wmb);
  if (pp) printf("  torch %8.2f x                     ", pp->rss_mb / wmb);
  printf("  (aim <= %.1f for topos: %s)\n", AIM_RSS,
         tp->rss_mb / wmb <= AIM_RSS ? "met" : "missed");

  printf(
      "\nevery setting (ms; decode: the step's median, and its record + "
      "run parts):\n");
  printf("%-6s %-12s %10s %10s %16s %11s %9s\n", "side", "setting",
         "forward256", "decode@128", "record + run", "prefill128", "record256");
  for (int i = 0; i < nsettings; i++) {
    const setting *s = &settings[i];
    char parts[32] = "-", rec[16] = "-";
    if (strcmp(s->side, "topos") == 0) {
      snprintf(parts, sizeof parts, "%.2f + %.1f", s->dec_rec_ms,
               s->dec_run_ms);
      snprintf(rec, sizeof rec, "%.1f", s->fwd_rec_ms);
    }
    printf("%-6s %-12s %10.1f %10.1f %16s %11.1f %9s\n", s->side, s->label,
           s->fwd_ms, s->dec_ms, parts, s->prefill_ms, rec);
  }
  printf(
      "\nmemory of each process (MB): peak (VmHWM) after loading the "
      "weights, resident (VmRSS) then, peak after the first forward256 and "
      "at the end, and wait4's ru_maxrss:\n");
  for (int i = 0; i < nprocs; i++) {
    const process *p = &procs[i];
    printf(
        "%-6s %-8s load %6.1f (now %6.1f)  forward %6.1f  end %6.1f  "
        "ru_maxrss %6.1f = %.2f x the weights; loading took %.2f s\n",
        p->side, *p->label ? p->label : "-", p->hwm_load, p->rss_load,
        p->hwm_fwd, p->hwm_end, p->rss_mb, p->rss_mb / wmb, p->load_s);
  }
  printf(
      "\ntopos: backends registered by topos_backends_register_defaults; "
      "plugins: %s\n",
      topos_plugins);
  if (have) {
    printf("PyTorch: %s, OpenBLAS kernels %s%s\n", PYTHON, core,
           pin ? " (and pinned to SkylakeX: SKX)" : "");
    printf(
        "check logits, topos vs PyTorch (relative L2, the worst over the "
        "PyTorch processes): forward row 255 %.2e, decode row %d %.2e "
        "(limit %.0e)%s\n",
        worst_fwd, DEC_POS + rc.steps - 1, worst_dec, MAX_REL_L2,
        failed ? " FAILED" : "");
  } else {
    printf(
        "PyTorch: %s cannot import torch; topos measured alone (run `make "
        "bench-deps` to install python3-torch)\n",
        PYTHON);
  }

  const char *names[] = {"gpt2-124m.safetensors", "topos.fwd.f32",
                         "topos.dec.f32", "torch.fwd.f32", "torch.dec.f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
  return failed && have ? 1 : 0;
}
