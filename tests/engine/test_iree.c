/*
 * test_iree.c - StableHLO emission validated by execution: the emitted
 * modules are compiled by IREE for the CPU, run, and compared with the
 * reference interpreter (docs/emission.md, "Execution by IREE").
 *
 * test_emit.c checks modules with mlir-opt, its own shape rules and its
 * own evaluator, all written against our reading of StableHLO.  Here a
 * real StableHLO implementation reads them: for each case
 *  1. iree-opt parses both forms (pretty and generic) with StableHLO's own
 *     parser and verifiers, prints each in generic form, and the two
 *     prints must be identical: the forms denote the same module;
 *  2. iree-compile compiles the generic form for the host CPU (llvm-cpu,
 *     f64 kept as f64);
 *  3. iree-run-module runs @main on the network's parameter initials and
 *     input defaults, written as raw little-endian files;
 *  4. every result is compared with the interpreter's value of that node:
 *     NaN and ±Inf exactly where the reference has them, i32 bit for bit,
 *     floats within numerics.md's envelope ‖out − ref‖₂ / ‖ref‖₂ ≤ 1e-5
 *     (f32), 1e-12 (f64), 1e-2 (bf16), and bit for bit where a case says
 *     the ops only move, compare or select their arguments.
 * The networks are the samples of sample_nets.h, replayed into each
 * float dtype, as forward plans (fused), forward plans observing every
 * node (so each op's own result is compared, fusion blocked) and training
 * plans (gradients of every parameter recorded by
 * topos_tape_differentiate); plus special values and conv/pool geometry.
 *
 * IREE comes from the virtual environment `make deps` creates; the
 * Makefile passes its bin directory as TOPOS_IREE_BIN.  Without it every
 * test says "IREE absent (run make deps): skipped" and checks nothing,
 * except under CI (CI=true), where a missing IREE is a failure.  At the end
 * the suite prints how many modules IREE executed and the worst error per
 * dtype.  TOPOS_IREE_KEEP=1 keeps the work directory (MLIR, inputs,
 * outputs, tool logs) and prints its path.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sample_nets.h"
#include "testutil.h"

extern char **environ;

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ================================================= where IREE and files are */

/* Set by the unchecked fixture in the runner's process, before any test
 * forks, so every test process inherits them. */
static char iree_bin[PATH_MAX];  /* "" when IREE is absent */
static char iree_work[PATH_MAX]; /* this run's temporary directory */
static char iree_log[PATH_MAX + 16];

static bool tool_ok(const char *dir, const char *tool) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, tool);
  return access(path, X_OK) == 0;
}

static void iree_setup(void) {
  iree_bin[0] = iree_work[0] = iree_log[0] = '\0';
  const char *bin = getenv("TOPOS_IREE_BIN");
  if (bin && bin[0] && strlen(bin) < sizeof iree_bin &&
      tool_ok(bin, "iree-compile") && tool_ok(bin, "iree-run-module") &&
      tool_ok(bin, "iree-opt"))
    snprintf(iree_bin, sizeof iree_bin, "%s", bin);
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !tmp[0]) tmp = "/tmp";
  snprintf(iree_work, sizeof iree_work, "%s/topos_iree_XXXXXX", tmp);
  if (!mkdtemp(iree_work)) {
    fprintf(stderr, "iree: mkdtemp %s: %s\n", iree_work, strerror(errno));
    iree_work[0] = '\0';
    return;
  }
  snprintf(iree_log, sizeof iree_log, "%s/results.log", iree_work);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Runs in the runner's process after every test of the case: adds up
 * what the tests logged (each test runs in its own process) and prints
 * the suite's one-line report. */
static void iree_teardown(void) {
  if (!iree_bin[0]) {
    printf("iree: IREE absent (run make deps): 0 modules executed\n");
  } else {
    const char *names[3] = {"f32", "f64", "bf16"};
    double worst[3] = {0, 0, 0};
    int have[3] = {0, 0, 0};
    long modules = 0, results = 0, bitwise = 0;
    FILE *f = iree_log[0] ? fopen(iree_log, "r") : NULL;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
      char kind[16], dt[8];
      double rel;
      int same;
      if (sscanf(line, "%15s", kind) != 1) continue;
      if (strcmp(kind, "module") == 0) {
        modules++;
      } else if (sscanf(line, "result %7s %lg %d", dt, &rel, &same) == 3) {
        results++;
        bitwise += same;
        for (int d = 0; d < 3; d++)
          if (strcmp(dt, names[d]) == 0) {
            have[d] = 1;
            if (rel > worst[d]) worst[d] = rel;
          }
      }
    }
    if (f) fclose(f);
    printf(
        "iree: %ld modules executed (%ld results, %ld bit-identical to "
        "the interpreter), worst relative error",
        modules, results, bitwise);
    const char *sep = " ";
    for (int d = 0; d < 3; d++)
      if (have[d]) {
        printf("%s%.2g (%s)", sep, worst[d], names[d]);
        sep = ", ";
      }
    printf("\n");
  }
  if (iree_work[0]) {
    const char *keep = getenv("TOPOS_IREE_KEEP");
    if (keep && keep[0] && strcmp(keep, "0") != 0)
      printf("iree: work directory kept: %s\n", iree_work);
    else
      nftw(iree_work, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  fflush(stdout);
}

/* Whether IREE is here; otherwise says so and the test checks nothing.
 * Under CI, where `make deps` installs IREE, its absence is a failure. */
static bool iree_present(const char *test) {
  ck_assert_msg(iree_work[0] != '\0', "iree: no work directory");
  if (iree_bin[0]) return true;
  const char *ci = getenv("CI");
  ck_assert_msg(!(ci && strcmp(ci, "true") == 0),
                "iree: IREE absent under CI (TOPOS_IREE_BIN=%s): `make deps` "
                "installs it",
                getenv("TOPOS_IREE_BIN") ? getenv("TOPOS_IREE_BIN") : "");
  printf("iree: %s: IREE absent (run make deps): skipped\n", test);
  return false;
}

static void log_line(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static void log_line(const char *fmt, ...) {
  FILE *f = fopen(iree_log, "a");
  ck_assert_msg(f != NULL, "iree: %s: %s", iree_log, strerror(errno));
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "iree: %s: %s", path, strerror(errno));
  ck_assert_msg(n == 0 || fwrite(data, 1, n, f) == n, "iree: writing %s", path);
  ck_assert_int_eq(fclose(f), 0);
}

/* The whole file (new, NUL-terminated), its length in *len; NULL when it
 * cannot be read. */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (cap - n < 2) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert_ptr_nonnull(buf);
    }
  }
  fclose(f);
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

/* The start of a tool's log, for failure messages (static buffer). */
static const char *log_head(const char *path) {
  static char head[1600];
  char *text = read_file(path, NULL);
  snprintf(head, sizeof head, "%s", text ? text : "(no log)");
  free(text);
  return head;
}

/* Runs argv[0] (an absolute path) with stdout and stderr to `log` and
 * returns its exit status (128 + signal when killed; -1 when it could not
 * start).  No shell: paths are passed as they are. */
static int run_tool(char *const argv[], const char *log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

/* A growing argv of owned strings. */
typedef struct args {
  char **v;
  int n, cap;
} args;

static void args_add(args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void args_add(args *a, const char *fmt, ...) {
  if (a->n + 2 > a->cap) {
    a->cap = a->cap ? a->cap * 2 : 32;
    a->v = realloc(a->v, sizeof(char *) * (size_t)a->cap);
    ck_assert_ptr_nonnull(a->v);
  }
  va_list ap;
  va_start(ap, fmt);
  ck_assert_int_ge(vasprintf(&a->v[a->n], fmt, ap), 0);
  va_end(ap);
  a->v[++a->n] = NULL;
}

static void args_free(args *a) {
  for (int i = 0; i < a->n; i++) free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}

/* ======================================================= the networks */

static topos_network *seal(topos_tape *tape) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

/* t converted to dtype `to` (bf16 rounded to nearest even); new. */
static topos_tensor *convert_tensor(const topos_tensor *t, topos_dtype to) {
  double *v = tt_values(t);
  topos_tensor *c =
      tt_tensor(to, topos_tensor_rank(t), topos_tensor_shape(t), v);
  free(v);
  return c;
}

/* The value a sample is trained on: "loss", or every_op's "total". */
static topos_value sample_root(const topos_network *net) {
  topos_value v = topos_network_find(net, "loss");
  if (!topos_value_ok(v)) v = topos_network_find(net, "total");
  ck_assert_msg(topos_value_ok(v), "sample without loss or total");
  return v;
}

/*
 * Records src again on a new tape whose floating dtype is `to`, node by
 * node through topos_record (so the shape rules derive every dtype anew):
 * leaf tensors in src's own dtype are converted, other leaves (i32
 * indices, every_op's bf16 constant) are kept.  So each sample network
 * is written once, in sample_nets.h, and runs in every float dtype.
 * With `grads`, the gradient of the root with respect to every parameter
 * is appended (topos_tape_differentiate) and roots gets {root, grads...};
 * without, roots gets {root}.  *nroots is set; roots has room for
 * 1 + parameters.
 */
static topos_network *replay(const topos_network *src, topos_dtype to,
                             bool grads, topos_value *roots, int *nroots) {
  topos_dtype from = topos_network_dtype(src);
  int n = topos_network_node_count(src);
  topos_value *map = calloc((size_t)n, sizeof *map);
  ck_assert_ptr_nonnull(map);
  topos_tape *t = topos_tape_new(to);
  for (int i = 0; i < n; i++) {
    topos_error err = {0};
    topos_node_info info;
    ck_assert_msg(topos_network_node(src, i, &info, &err) == TOPOS_OK, "%s",
                  err.message);
    topos_value ops[8];
    ck_assert_int_le(info.nin, 8);
    for (int k = 0; k < info.nin; k++) ops[k] = map[info.operands[k]];
    topos_node_info at = info;
    topos_tensor *conv = NULL;
    if (info.tensor && topos_tensor_dtype(info.tensor) == from && to != from)
      at.tensor = conv = convert_tensor(info.tensor, to);
    map[i] = topos_record(t, info.op, ops, info.nin, &at);
    topos_tensor_release(conv);
    if (info.name) topos_name(t, map[i], info.name);
    ck_assert_msg(topos_value_ok(map[i]), "replay node %d (%s): %s", i,
                  info.op_name, topos_tape_error(t));
  }
  roots[0] = map[sample_root(src).index];
  *nroots = 1;
  if (grads) {
    int np = topos_network_parameter_count(src);
    topos_value *wrt = calloc((size_t)np + 1, sizeof *wrt);
    ck_assert_ptr_nonnull(wrt);
    for (int s = 0; s < np; s++)
      wrt[s] = map[topos_network_parameter(src, s).index];
    ck_assert_msg(
        topos_tape_differentiate(t, roots[0], wrt, np, roots + 1) == TOPOS_OK,
        "differentiate: %s", topos_tape_error(t));
    *nroots += np;
    free(wrt);
  }
  free(map);
  return seal(t);
}

/* ======================================================= one module */

typedef struct iree_case {
  const char *label; /* unique within the run: names the files */
  const topos_network *net;
  topos_entry entry;
  int groups;     /* fused groups the plan must elect; -1 = not checked */
  uint64_t exact; /* bit k: result k must equal the reference bit for bit */
} iree_case;

/* numerics.md's fast-posture envelope: what a different reduction order
 * and different (but faithful) transcendentals may change. */
static double envelope(topos_dtype dt) {
  return dt == TOPOS_F64 ? 1e-12 : dt == TOPOS_F32 ? 1e-5 : 1e-2;
}

/* Compares one result (raw little-endian bytes `got`, the reference's
 * element count and dtype) with the reference tensor.  Returns NULL when
 * it holds, else why (static buffer); *rel gets the normwise relative
 * error of the finite elements (absolute when the reference's are all
 * zero) and *same whether every bit agrees. */
static const char *compare(const void *got, const topos_tensor *want,
                           bool exact, double *rel, bool *same) {
  static char why[512];
  topos_dtype dt = topos_tensor_dtype(want);
  int64_t n = topos_tensor_count(want);
  size_t bytes = (size_t)n * topos_dtype_size(dt);
  void *wb = malloc(bytes + 1);
  ck_assert_ptr_nonnull(wb);
  ck_assert_int_eq(topos_tensor_read(want, wb, bytes + 1, NULL), TOPOS_OK);
  *same = memcmp(got, wb, bytes) == 0;
  *rel = 0;
  free(wb);
  if (*same) return NULL;
  /* Widen both to double through a tensor of the module's bytes. */
  topos_tensor *gt = topos_tensor_from(dt, topos_tensor_rank(want),
                                       topos_tensor_shape(want), got, NULL);
  ck_assert_ptr_nonnull(gt);
  double *g = tt_values(gt), *w = tt_values(want);
  topos_tensor_release(gt);
  const char *fail = NULL;
  double scale = 0;
  for (int64_t i = 0; i < n && !fail; i++) {
    bool bits = g[i] == w[i] && signbit(g[i]) == signbit(w[i]);
    if (dt == TOPOS_I32 || exact) {
      if (!bits) fail = "must equal the reference bit for bit";
    } else if (isnan(w[i]) != isnan(g[i])) {
      fail = "NaN where the reference has none, or the reverse";
    } else if ((isinf(w[i]) || isinf(g[i])) && g[i] != w[i]) {
      fail = "an infinity where the reference differs";
    }
    if (fail) {
      snprintf(why, sizeof why,
               "element %lld: module %.17g, reference %.17g: %s", (long long)i,
               g[i], w[i], fail);
    } else if (isfinite(w[i])) {
      scale = fmax(scale, fmax(fabs(w[i]), fabs(g[i])));
    }
  }
  if (!fail && scale > 0) {
    /* Scaled so the squares cannot overflow. */
    double dd = 0, ww = 0;
    for (int64_t i = 0; i < n; i++) {
      if (!isfinite(w[i])) continue;
      double d = (g[i] - w[i]) / scale, r = w[i] / scale;
      dd += d * d;
      ww += r * r;
    }
    *rel = ww > 0 ? sqrt(dd) / sqrt(ww) : sqrt(dd) * scale;
    if (!(*rel <= envelope(dt))) {
      snprintf(why, sizeof why,
               "relative error %.3g exceeds the %s envelope %.0e", *rel,
               topos_dtype_name(dt), envelope(dt));
      fail = why;
    }
  }
  free(g);
  free(w);
  return fail ? why : NULL;
}

/* "2x3xf32" / "f32": the type part of an iree-run-module --input. */
static void type_spec(char *buf, size_t len, topos_dtype dt, int rank,
                      const int64_t *shape) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < rank; i++)
    pos += (size_t)snprintf(buf + pos, len - pos, "%lldx", (long long)shape[i]);
  snprintf(buf + pos, len - pos, "%s", topos_dtype_name(dt));
}

/* The case's module through iree-opt, iree-compile and iree-run-module,
 * every result compared with the reference interpreter. */
static void iree_check(const iree_case *c) {
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(c->net, &c->entry, &err);
  ck_assert_msg(plan != NULL, "%s: lower: %s", c->label, err.message);
  if (c->groups >= 0)
    ck_assert_msg(topos_plan_group_count(plan) == c->groups,
                  "%s: %d fused groups, expected %d", c->label,
                  topos_plan_group_count(plan), c->groups);
  char *generic = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_msg(generic != NULL, "%s: emit: %s", c->label, err.message);
  char *pretty = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_PRETTY, &err);
  ck_assert_msg(pretty != NULL, "%s: emit: %s", c->label, err.message);
  topos_plan_free(plan);

  char dir[PATH_MAX + 128], path[PATH_MAX + 256], logp[PATH_MAX + 256];
  snprintf(dir, sizeof dir, "%s/%s", iree_work, c->label);
  ck_assert_msg(mkdir(dir, 0755) == 0, "%s: mkdir: %s", dir, strerror(errno));
  char gpath[PATH_MAX + 256], ppath[PATH_MAX + 256], vmfb[PATH_MAX + 256];
  snprintf(gpath, sizeof gpath, "%s/generic.mlir", dir);
  snprintf(ppath, sizeof ppath, "%s/pretty.mlir", dir);
  snprintf(vmfb, sizeof vmfb, "%s/module.vmfb", dir);
  write_file(gpath, generic, strlen(generic));
  write_file(ppath, pretty, strlen(pretty));
  free(generic);
  free(pretty);

  /* 1. Both forms through StableHLO's parser and verifiers; their generic
   * prints must be the same text. */
  char *printed[2];
  for (int f = 0; f < 2; f++) {
    char out[PATH_MAX + 256];
    snprintf(out, sizeof out, "%s/%s.opt", dir, f ? "generic" : "pretty");
    snprintf(logp, sizeof logp, "%s/iree-opt-%d.log", dir, f);
    args a = {0};
    args_add(&a, "%s/iree-opt", iree_bin);
    args_add(&a, "--mlir-print-op-generic");
    args_add(&a, "-o");
    args_add(&a, "%s", out);
    args_add(&a, "%s", f ? gpath : ppath);
    int rc = run_tool(a.v, logp);
    args_free(&a);
    ck_assert_msg(rc == 0, "%s: iree-opt rejected the %s form (%d):\n%s",
                  c->label, f ? "generic" : "pretty", rc, log_head(logp));
    printed[f] = read_file(out, NULL);
    ck_assert_ptr_nonnull(printed[f]);
  }
  ck_assert_msg(strcmp(printed[0], printed[1]) == 0,
                "%s: the pretty and generic forms parse to different modules "
                "(%s/*.opt)",
                c->label, dir);
  free(printed[0]);
  free(printed[1]);

  /* 2. Compile for this CPU.  f64 stays f64 (IREE demotes it to f32 by
   * default).  System linking: IREE's embedded ELF has no libm, and f64
   * tanh (for one) is a libm call. */
  snprintf(logp, sizeof logp, "%s/iree-compile.log", dir);
  args a = {0};
  args_add(&a, "%s/iree-compile", iree_bin);
  args_add(&a, "--iree-input-type=stablehlo");
  args_add(&a, "--iree-hal-target-device=local");
  args_add(&a, "--iree-hal-local-target-device-backends=llvm-cpu");
  args_add(&a, "--iree-llvmcpu-target-cpu=host");
  args_add(&a, "--iree-llvmcpu-link-embedded=false");
  args_add(&a, "--iree-input-demote-f64-to-f32=false");
  args_add(&a, "-o");
  args_add(&a, "%s", vmfb);
  args_add(&a, "%s", gpath);
  int rc = run_tool(a.v, logp);
  args_free(&a);
  ck_assert_msg(rc == 0, "%s: iree-compile failed (%d):\n%s", c->label, rc,
                log_head(logp));

  /* 3. Run it: arguments are every parameter in slot order, then every
   * input (docs/emission.md), as the interpreter sees them by default. */
  const topos_network *net = c->net;
  int np = topos_network_parameter_count(net);
  int ni = topos_network_input_count(net);
  snprintf(logp, sizeof logp, "%s/iree-run-module.log", dir);
  args_add(&a, "%s/iree-run-module", iree_bin);
  args_add(&a, "--device=local-sync");
  args_add(&a, "--module=%s", vmfb);
  args_add(&a, "--function=main");
  for (int k = 0; k < np + ni; k++) {
    topos_value v = k < np ? topos_network_parameter(net, k)
                           : topos_network_input(net, k - np);
    topos_node_info info;
    ck_assert_int_eq(topos_network_node(net, v.index, &info, &err), TOPOS_OK);
    size_t bytes = (size_t)topos_tensor_count(info.tensor) *
                   topos_dtype_size(topos_tensor_dtype(info.tensor));
    void *buf = malloc(bytes + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(topos_tensor_read(info.tensor, buf, bytes + 1, &err),
                     TOPOS_OK);
    snprintf(path, sizeof path, "%s/arg%d.bin", dir, k);
    write_file(path, buf, bytes);
    free(buf);
    char spec[160];
    type_spec(spec, sizeof spec, topos_tensor_dtype(info.tensor),
              topos_tensor_rank(info.tensor), topos_tensor_shape(info.tensor));
    args_add(&a, "--input=%s=@%s", spec, path);
  }
  int nres = c->entry.nroots + c->entry.nobserves;
  for (int k = 0; k < nres; k++)
    args_add(&a, "--output=@%s/result%d.bin", dir, k);
  rc = run_tool(a.v, logp);
  args_free(&a);
  ck_assert_msg(rc == 0, "%s: iree-run-module failed (%d):\n%s", c->label, rc,
                log_head(logp));

  /* 4. Every result against the interpreter (exact numerics: the
   * reference's bits whichever backend takes a task). */
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s: forward: %s", c->label, err.message);
  log_line("module %s\n", c->label);
  for (int k = 0; k < nres; k++) {
    topos_value v = k < c->entry.nroots
                        ? c->entry.roots[k]
                        : c->entry.observes[k - c->entry.nroots];
    const topos_tensor *want = topos_run_of(run, v, &err);
    ck_assert_msg(want != NULL, "%s: %s", c->label, err.message);
    topos_dtype dt = topos_tensor_dtype(want);
    size_t bytes = (size_t)topos_tensor_count(want) * topos_dtype_size(dt);
    size_t len = 0;
    snprintf(path, sizeof path, "%s/result%d.bin", dir, k);
    char *got = read_file(path, &len);
    ck_assert_msg(got != NULL, "%s: no %s", c->label, path);
    ck_assert_msg(len == bytes, "%s: result %d has %zu bytes, expected %zu",
                  c->label, k, len, bytes);
    double rel;
    bool same;
    const char *why =
        compare(got, want, k < 64 && (c->exact >> k) & 1, &rel, &same);
    free(got);
    ck_assert_msg(why == NULL, "%s: result %d (node %d, %s): %s (files in %s)",
                  c->label, k, v.index,
                  topos_network_name_of(net, v) ? topos_network_name_of(net, v)
                                                : "unnamed",
                  why, dir);
    if (dt != TOPOS_I32)
      log_line("result %s %.3e %d\n", topos_dtype_name(dt), rel, same);
  }
  topos_run_free(run);
}

/* ======================================================= the cases */

static const topos_dtype float_dtypes[] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};

/* Every value of a network, for observes. */
static topos_value *every_value(const topos_network *net, int *n) {
  *n = topos_network_node_count(net);
  topos_value *v = calloc((size_t)*n + 1, sizeof *v);
  ck_assert_ptr_nonnull(v);
  for (int i = 0; i < *n; i++) v[i] = topos_network_value(net, i);
  return v;
}

/*
 * One sample of sample_nets.h in one dtype, three plans:
 *  - forward, the root only: fusion as the plan elects it (`groups`);
 *  - forward observing every node: each op's own result is compared, and
 *    observing the unfolds blocks every fusion;
 *  - training: the root and every parameter's gradient, training posture,
 *    fused again.
 */
static void check_sample(const char *name, sn_builder build, topos_dtype dt,
                         int groups) {
  topos_network *src = build();
  ck_assert_msg(src != NULL, "%s", name);
  int np = topos_network_parameter_count(src);
  topos_value *roots = calloc((size_t)np + 1, sizeof *roots);
  ck_assert_ptr_nonnull(roots);
  int nroots;
  char label[96];

  topos_network *net = replay(src, dt, false, roots, &nroots);
  if (dt == topos_network_dtype(src)) {
    /* The replay is faithful: the same network, bit for bit. */
    char a[65], b[65];
    ck_assert_int_eq(topos_network_id(src, a, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(net, b, NULL), TOPOS_OK);
    ck_assert_str_eq(a, b);
  }
  snprintf(label, sizeof label, "%s_%s_forward", name, topos_dtype_name(dt));
  iree_case c = {label, net, {roots, nroots}, groups, 0};
  iree_check(&c);

  int nobs;
  topos_value *obs = every_value(net, &nobs);
  snprintf(label, sizeof label, "%s_%s_every_node", name, topos_dtype_name(dt));
  c.entry.observes = obs;
  c.entry.nobserves = nobs;
  c.groups = 0;
  iree_check(&c);
  free(obs);
  topos_network_release(net);

  net = replay(src, dt, true, roots, &nroots);
  snprintf(label, sizeof label, "%s_%s_training", name, topos_dtype_name(dt));
  iree_case t = {
      label, net, {roots, nroots, NULL, 0, TOPOS_POSTURE_TRAINING}, groups, 0};
  iree_check(&t);
  topos_network_release(net);
  free(roots);
  topos_network_release(src);
}

START_TEST(test_gradient_descent) {
  if (!iree_present("gradient_descent")) return;
  for (int d = 0; d < 3; d++)
    check_sample("gradient_descent", sn_gradient_descent, float_dtypes[d], 0);
}
END_TEST

START_TEST(test_mlp) {
  if (!iree_present("mlp")) return;
  for (int d = 0; d < 3; d++) check_sample("mlp", sn_mlp, float_dtypes[d], 0);
}
END_TEST

/* The CNN: conv2d and max_pool2d, each one fused group. */
START_TEST(test_cnn) {
  if (!iree_present("cnn")) return;
  for (int d = 0; d < 3; d++) check_sample("cnn", sn_conv, float_dtypes[d], 2);
}
END_TEST

/* Every op of the op set, each result compared on its own. */
START_TEST(test_every_op) {
  if (!iree_present("every_op")) return;
  for (int d = 0; d < 3; d++)
    check_sample("every_op", sn_every_op, float_dtypes[d], 0);
}
END_TEST

/* NaN, signed zeros and infinities: relu, maximum, step and neg only
 * select or move their arguments, so they must give the reference's bits;
 * the transcendentals and the max-shifted rows must put NaN and ±Inf
 * where the reference does.  Plus i32 index arithmetic. */
START_TEST(test_special_values) {
  if (!iree_present("special_values")) return;
  const double va[8] = {NAN, -0.0, 0.0, -1, 2, INFINITY, -INFINITY, 1e-40};
  const double vb[8] = {1, 0.0, -0.0, NAN, 2, -INFINITY, -INFINITY, 0};
  const double rows[12] = {-INFINITY, -INFINITY, -INFINITY, INFINITY, 1, 2,
                           NAN,       1,         0,         1,        2, 3};
  const double vi[4] = {1, -2, 1000000000, -1000000000};
  for (int d = 0; d < 3; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_tensor *ta = tt_tensor(dt, 1, S(8), va),
                 *tb = tt_tensor(dt, 1, S(8), vb),
                 *tr = tt_tensor(dt, 2, S(4, 3), rows),
                 *ti = tt_tensor(TOPOS_I32, 1, S(4), vi);
    topos_value a = topos_constant(t, ta), b = topos_input(t, tb);
    topos_value x = topos_input(t, tr), i = topos_input(t, ti);
    topos_tensor_release(ta);
    topos_tensor_release(tb);
    topos_tensor_release(tr);
    topos_tensor_release(ti);
    topos_value roots[] = {topos_relu(t, a),
                           topos_maximum(t, a, b),
                           topos_maximum(t, b, a),
                           topos_step(t, a, b),
                           topos_step(t, b, a),
                           topos_neg(t, a),
                           topos_add(t, i, i),
                           topos_exp(t, a),
                           topos_log(t, a),
                           topos_sqrt(t, a),
                           topos_tanh(t, a),
                           topos_div(t, b, a),
                           topos_max_along(t, x, 1),
                           topos_logsumexp(t, x, 1),
                           topos_log_softmax(t, x, 1),
                           topos_logsumexp(t, x, 0)};
    topos_network *net = seal(t);
    char label[64];
    snprintf(label, sizeof label, "special_values_%s", topos_dtype_name(dt));
    iree_case c = {
        label, net, {roots, (int)(sizeof roots / sizeof *roots)}, 0, 0x7F};
    iree_check(&c);
    topos_network_release(net);
  }
}
END_TEST

/* Convolution and pooling attributes IREE must read as we mean them:
 * stride, padding, dilation, several channels, overlapping pool windows,
 * all fused, in one module. */
START_TEST(test_conv_pool_geometry) {
  if (!iree_present("conv_pool_geometry")) return;
  static const struct {
    int stride, padding, dilation, pool_k, pool_s;
  } g[] = {{2, 1, 1, 2, 1}, {1, 2, 2, 3, 2}, {3, 0, 1, 3, 3}, {1, 0, 3, 1, 1}};
  enum { NG = sizeof g / sizeof *g };
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value x = sn_leaf(t, 2, dt, 4, S(2, 3, 9, 11), 1, -1, 1);
    topos_value w = sn_leaf(t, 1, dt, 4, S(4, 3, 3, 2), 2, -0.5, 0.5);
    topos_value b = sn_leaf(t, 1, dt, 1, S(4), 3, -0.1, 0.1);
    topos_value roots[NG];
    for (int k = 0; k < NG; k++)
      roots[k] = topos_max_pool2d(
          t, topos_conv2d(t, x, w, b, g[k].stride, g[k].padding, g[k].dilation),
          g[k].pool_k, g[k].pool_s);
    topos_network *net = seal(t);
    char label[64];
    snprintf(label, sizeof label, "conv_pool_geometry_%s",
             topos_dtype_name(dt));
    iree_case c = {label, net, {roots, NG}, 2 * NG, 0};
    iree_check(&c);
    topos_network_release(net);
  }
}
END_TEST

Suite *iree_suite(void) {
  Suite *s = suite_create("iree");
  TCase *tc = tcase_create("execute");
  /* Each module costs a few seconds of iree-compile; the limits are hang
   * guards (CK_TIMEOUT_MULTIPLIER stretches them under sanitizers). */
  tcase_set_timeout(tc, 300);
  tcase_add_unchecked_fixture(tc, iree_setup, iree_teardown);
  tcase_add_test(tc, test_every_op);
  tcase_add_test(tc, test_special_values);
  tcase_add_test(tc, test_gradient_descent);
  tcase_add_test(tc, test_mlp);
  tcase_add_test(tc, test_cnn);
  tcase_add_test(tc, test_conv_pool_geometry);
  suite_add_tcase(s, tc);
  return s;
}
