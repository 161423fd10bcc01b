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
 *  4. every result is compared with the interpreter's value of that node
 *     within numerics.md's envelope (see compare), and bit for bit where
 *     a case says its ops only move, compare or select arguments.
 * The networks are the samples of sample_nets.h, replayed into f32 and
 * f64, as forward plans (fused), forward plans observing every node (each
 * op's own result compared, fusion blocked), training plans (gradients of
 * every parameter recorded by topos_tape_differentiate) and every op in
 * isolation (also in bf16); plus special values, conv/pool geometry, and
 * mutations that show the checks fail.
 *
 * IREE comes from the virtual environment `make deps` creates; the
 * Makefile passes its bin directory as TOPOS_IREE_BIN.  Without it every
 * test says "IREE absent (run make deps): skipped" and checks nothing,
 * except under CI (CI=true), where a missing IREE is a failure.  At the end
 * the suite prints how many modules IREE executed and the worst error per
 * dtype.  TOPOS_IREE_VERBOSE=1 prints every result's verdict;
 * TOPOS_IREE_KEEP=1 keeps the work directory (MLIR, inputs, outputs, tool
 * logs) and prints its path.
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

#include "gpt2.h"
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
    double worst[3] = {0, 0, 0}, worst_ratio = 0;
    int have[3] = {0, 0, 0};
    long modules = 0, results = 0, bitwise = 0, ill = 0;
    FILE *f = iree_log[0] ? fopen(iree_log, "r") : NULL;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
      char dt[8];
      double x;
      int same;
      if (strncmp(line, "module ", 7) == 0) {
        modules++;
      } else if (sscanf(line, "ill %7s %lg", dt, &x) == 2) {
        results++;
        ill++;
        if (x > worst_ratio) worst_ratio = x;
      } else if (sscanf(line, "result %7s %lg %d", dt, &x, &same) == 3) {
        results++;
        bitwise += same;
        for (int d = 0; d < 3; d++)
          if (strcmp(dt, names[d]) == 0) {
            have[d] = 1;
            if (x > worst[d]) worst[d] = x;
          }
      }
    }
    if (f) fclose(f);
    printf(
        "iree: %ld modules executed, %ld float results (%ld bit-identical "
        "to the interpreter); worst relative error",
        modules, results, bitwise);
    const char *sep = " ";
    for (int d = 0; d < 3; d++)
      if (have[d]) {
        printf("%s%.2g (%s)", sep, worst[d], names[d]);
        sep = ", ";
      }
    if (ill)
      printf(
          "; %ld ill-conditioned, the module's error at most %.2g times "
          "the interpreter's own",
          ill, worst_ratio);
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
 * indices, every_op's bf16 constant) are kept, and node i stays node i.
 * So each sample network is written once, in sample_nets.h, and runs in
 * every float dtype; replayed into f64, an f32 or bf16 network gives the
 * same computation with a far smaller rounding error.  With a valid
 * `loss` (a value of src), the gradient of loss with respect to every
 * parameter, in slot order, is appended (topos_tape_differentiate) and
 * written to grads.  With `scalars`, the rank-0 float leaves take these
 * values in node order instead (a sample whose leaves are all zeros
 * would compare nothing but zeros).
 */
static topos_network *replay(const topos_network *src, topos_dtype to,
                             topos_value loss, topos_value *grads,
                             const double *scalars) {
  topos_dtype from = topos_network_dtype(src);
  int n = topos_network_node_count(src);
  topos_value *map = calloc((size_t)n + 1, sizeof *map);
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
    if (scalars && info.tensor && info.rank == 0 && info.dtype == from)
      at.tensor = conv = topos_tensor_scalar(to, *scalars++, NULL);
    else if (info.tensor && info.dtype == from && to != from)
      at.tensor = conv = convert_tensor(info.tensor, to);
    map[i] = topos_record(t, info.op, ops, info.nin, &at);
    topos_tensor_release(conv);
    if (info.name) topos_name(t, map[i], info.name);
    ck_assert_msg(map[i].index == i, "replay node %d (%s): %s", i, info.op_name,
                  topos_tape_error(t));
  }
  if (topos_value_ok(loss)) {
    int np = topos_network_parameter_count(src);
    topos_value *wrt = calloc((size_t)np + 1, sizeof *wrt);
    ck_assert_ptr_nonnull(wrt);
    for (int s = 0; s < np; s++)
      wrt[s] = map[topos_network_parameter(src, s).index];
    ck_assert_msg(topos_tape_differentiate(t, map[loss.index], wrt, np,
                                           grads) == TOPOS_OK,
                  "differentiate: %s", topos_tape_error(t));
    free(wrt);
  }
  free(map);
  return seal(t);
}

/*
 * Every op of net on its own: a network with one node per non-leaf node
 * of net, same op and attributes, whose operands are new inputs holding
 * the interpreter's values of the original operands.  Its results are
 * then each one op applied to exactly the reference's operands, so a
 * difference upstream cannot reach them: each is held to the envelope as
 * a single kernel is.  *roots (new, free it) gets the ops, *nroots their
 * count.
 */
static topos_network *isolate(const topos_network *net, topos_value **roots,
                              int *nroots) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  int n = topos_network_node_count(net);
  *roots = calloc((size_t)n + 1, sizeof **roots);
  ck_assert_ptr_nonnull(*roots);
  *nroots = 0;
  topos_tape *t = topos_tape_new(topos_network_dtype(net));
  for (int i = 0; i < n; i++) {
    topos_node_info info;
    ck_assert_int_eq(topos_network_node(net, i, &info, &err), TOPOS_OK);
    if (info.nin == 0) continue; /* leaves are arguments or constants */
    topos_value ops[8];
    ck_assert_int_le(info.nin, 8);
    for (int k = 0; k < info.nin; k++) {
      const topos_tensor *v =
          topos_run_of(run, topos_network_value(net, info.operands[k]), &err);
      ck_assert_msg(v != NULL, "%s", err.message);
      ops[k] = topos_input(t, v);
    }
    (*roots)[(*nroots)++] = topos_record(t, info.op, ops, info.nin, &info);
  }
  topos_run_free(run);
  return seal(t);
}

/* ======================================================= one module */

typedef struct iree_case {
  const char *label; /* unique within the run: names the files */
  const topos_network *net;
  topos_entry entry;
  int groups;        /* fused groups the plan must elect; -1 = not checked */
  const bool *exact; /* per result: must equal the reference bit for bit */
  /* Mutation tests: in form f (0 pretty, 1 generic) the first from[f]
   * becomes to[f] (from[f] NULL: the form is left alone).  Mutated modules
   * are not counted in the report. */
  const char *from[2], *to[2];
} iree_case;

/* numerics.md's fast-posture envelope: what a different reduction order
 * and different (but faithful) transcendentals may change. */
static double envelope(topos_dtype dt) {
  return dt == TOPOS_F64 ? 1e-12 : dt == TOPOS_F32 ? 1e-5 : 1e-2;
}

/* An ill-conditioned result (below) passes when the module's error
 * against the f64 evaluation is at most this many times the
 * interpreter's own. */
#define ILL_FACTOR 4.0

/* What compare found for one result. */
typedef struct verdict {
  bool same;  /* every bit agrees */
  double rel; /* ‖out − ref‖₂ / ‖ref‖₂ over the finite elements */
  bool ill;   /* the interpreter's own error exceeds the envelope */
  double ratio; /* ill: ‖out − f64‖₂ / ‖ref − f64‖₂ */
} verdict;

/* ‖a − b‖₂ over the elements where mask is finite, computed scaled so
 * that no square overflows. */
static double dist(const double *a, const double *b, const double *mask,
                   int64_t n, double scale) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(mask[i])) continue;
    double d = (a[i] - (b ? b[i] : 0)) / scale;
    s += d * d;
  }
  return sqrt(s) * scale;
}

/*
 * Compares one result, the module's raw little-endian bytes `got`, with
 * the interpreter's tensor `want`: NaN and ±Inf exactly where the
 * reference has them; i32, and every element when `exact`, bit for bit
 * (any NaN for a NaN: which NaN comes out is IREE's choice, and its bf16
 * negate keeps a NaN's sign where the reference flips it);
 * floats within numerics.md's envelope, normwise over the finite elements.
 *
 * One exception, which needs `truth`, the same node evaluated in f64
 * (NULL for f64 networks): a result whose exact value is mostly lost to
 * rounding, like logsumexp of a log_softmax row (exactly log 1 = 0, left
 * at ±1 ulp of the row's entries) or a sum of such values.  There no
 * faithful implementation can meet a relative bound against the
 * interpreter, because the interpreter itself does not meet it against
 * the exact value.  Such a result (‖ref − f64‖₂ > envelope · ‖f64‖₂) must
 * instead be as accurate as the interpreter, up to ILL_FACTOR.
 *
 * Returns NULL when the result holds, else why (static buffer).
 */
static const char *compare(const void *got, const topos_tensor *want,
                           const topos_tensor *truth, bool exact,
                           verdict *out) {
  static char why[512];
  memset(out, 0, sizeof *out);
  topos_dtype dt = topos_tensor_dtype(want);
  int64_t n = topos_tensor_count(want);
  size_t bytes = (size_t)n * topos_dtype_size(dt);
  void *wb = malloc(bytes + 1);
  ck_assert_ptr_nonnull(wb);
  ck_assert_int_eq(topos_tensor_read(want, wb, bytes + 1, NULL), TOPOS_OK);
  out->same = memcmp(got, wb, bytes) == 0;
  free(wb);
  if (out->same) return NULL;
  /* Widen both to double through a tensor of the module's bytes. */
  topos_tensor *gt = topos_tensor_from(dt, topos_tensor_rank(want),
                                       topos_tensor_shape(want), got, NULL);
  ck_assert_ptr_nonnull(gt);
  double *g = tt_values(gt), *w = tt_values(want);
  double *t = truth ? tt_values(truth) : NULL;
  topos_tensor_release(gt);
  const char *fail = NULL;
  double scale = 0;
  for (int64_t i = 0; i < n && !fail; i++) {
    bool bits = (g[i] == w[i] && signbit(g[i]) == signbit(w[i])) ||
                (isnan(g[i]) && isnan(w[i]));
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
      if (t && isfinite(t[i])) scale = fmax(scale, fabs(t[i]));
    }
  }
  if (!fail && scale > 0) {
    double dw = dist(g, w, w, n, scale), nw = dist(w, NULL, w, n, scale);
    /* A reference of zeros: the error is absolute (scale 1). */
    out->rel = nw > 0 ? dw / nw : dw;
    if (!(out->rel <= envelope(dt))) {
      bool truth_finite = t != NULL;
      for (int64_t i = 0; t && i < n; i++)
        if (isfinite(w[i]) && !isfinite(t[i])) truth_finite = false;
      double eref = 0, eout = 0, nt = 0;
      if (truth_finite) {
        eref = dist(w, t, w, n, scale);
        eout = dist(g, t, w, n, scale);
        nt = dist(t, NULL, w, n, scale);
      }
      out->ill = truth_finite && eref > envelope(dt) * nt;
      out->ratio = out->ill ? eout / eref : 0;
      if (!out->ill)
        snprintf(why, sizeof why,
                 "relative error %.3g exceeds the %s envelope %.0e", out->rel,
                 topos_dtype_name(dt), envelope(dt));
      else if (!(out->ratio <= ILL_FACTOR))
        snprintf(why, sizeof why,
                 "ill-conditioned (the interpreter is %.3g off the f64 value, "
                 "relative %.3g), and the module is %.3g off, more than %.0f "
                 "times that",
                 eref, nt > 0 ? eref / nt : eref, eout, ILL_FACTOR);
      else
        why[0] = '\0';
      if (why[0]) fail = why;
    }
  }
  free(g);
  free(w);
  free(t);
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

/* text with its first `from` replaced by `to` (new); the case's
 * mutation must apply. */
static char *replace_first(char *text, const char *from, const char *to) {
  char *at = strstr(text, from);
  ck_assert_msg(at != NULL, "mutation: no '%s' in the module", from);
  char *out = NULL;
  ck_assert_int_ge(
      asprintf(&out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from)),
      0);
  free(text);
  return out;
}

/*
 * The case's module through iree-opt, iree-compile and iree-run-module,
 * every result compared with the reference interpreter.  Returns NULL
 * when every check holds, else the first failure (static buffer); a tool
 * that cannot run or a module IREE rejects fails the test at once.
 * TOPOS_IREE_VERBOSE=1 prints every result's verdict.
 */
static const char *iree_run(const iree_case *c) {
  static char fail[2 * PATH_MAX + 1024];
  fail[0] = '\0';
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
  bool mutated = c->from[0] || c->from[1];
  if (c->from[0]) pretty = replace_first(pretty, c->from[0], c->to[0]);
  if (c->from[1]) generic = replace_first(generic, c->from[1], c->to[1]);

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
  bool forms_agree = strcmp(printed[0], printed[1]) == 0;
  free(printed[0]);
  free(printed[1]);
  if (!forms_agree) {
    snprintf(fail, sizeof fail,
             "%s: the pretty and generic forms parse to different modules "
             "(%s/*.opt)",
             c->label, dir);
    return fail;
  }

  /* 2. Compile for this CPU.  f64 stays f64 (IREE demotes it to f32 by
   * default).  System linking: IREE's embedded ELF has no libm, and f64
   * tanh, for one, is a libm call; for the same reason no constant is
   * evaluated at compile time (that JIT links embedded), so every op
   * runs in the module. */
  snprintf(logp, sizeof logp, "%s/iree-compile.log", dir);
  args a = {0};
  args_add(&a, "%s/iree-compile", iree_bin);
  args_add(&a, "--iree-input-type=stablehlo");
  args_add(&a, "--iree-hal-target-device=local");
  args_add(&a, "--iree-hal-local-target-device-backends=llvm-cpu");
  args_add(&a, "--iree-llvmcpu-target-cpu=host");
  args_add(&a, "--iree-llvmcpu-link-embedded=false");
  args_add(&a, "--iree-input-demote-f64-to-f32=false");
  args_add(&a, "--iree-opt-const-eval=false");
  args_add(&a, "-o");
  args_add(&a, "%s", vmfb);
  args_add(&a, "%s", gpath);
  int rc = run_tool(a.v, logp);
  args_free(&a);
  ck_assert_msg(rc == 0, "%s: iree-compile failed (%d):\n%s", c->label, rc,
                log_head(logp));

  /* 3. Run it: arguments are every parameter in slot order, then every
   * input (docs/emission.md), as the interpreter sees them by default.
   * Raw files, not .npy: IREE's numpy writer has no bf16. */
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
   * reference's bits whichever backend takes a task), and, for f32 and
   * bf16 networks, against the same network evaluated in f64. */
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s: forward: %s", c->label, err.message);
  topos_network *tnet = NULL;
  topos_run *trun = NULL;
  if (topos_network_dtype(net) != TOPOS_F64) {
    tnet = replay(net, TOPOS_F64, TOPOS_NONE, NULL, NULL);
    trun = topos_forward(tnet, NULL, NULL, 0, NULL, &err);
    ck_assert_msg(trun != NULL, "%s: f64 forward: %s", c->label, err.message);
  }
  /* What the report counts, written only when the whole module holds. */
  char *report = NULL;
  size_t report_len = 0;
  FILE *rep = open_memstream(&report, &report_len);
  ck_assert_ptr_nonnull(rep);
  fprintf(rep, "module %s\n", c->label);
  for (int k = 0; k < nres; k++) {
    topos_value v = k < c->entry.nroots
                        ? c->entry.roots[k]
                        : c->entry.observes[k - c->entry.nroots];
    const topos_tensor *want = topos_run_of(run, v, &err);
    ck_assert_msg(want != NULL, "%s: %s", c->label, err.message);
    const topos_tensor *truth = NULL;
    if (trun) {
      truth = topos_run_of(trun, topos_network_value(tnet, v.index), &err);
      ck_assert_msg(truth != NULL, "%s: %s", c->label, err.message);
    }
    topos_dtype dt = topos_tensor_dtype(want);
    size_t bytes = (size_t)topos_tensor_count(want) * topos_dtype_size(dt);
    size_t len = 0;
    snprintf(path, sizeof path, "%s/result%d.bin", dir, k);
    char *got = read_file(path, &len);
    ck_assert_msg(got != NULL, "%s: no %s", c->label, path);
    ck_assert_msg(len == bytes, "%s: result %d has %zu bytes, expected %zu",
                  c->label, k, len, bytes);
    verdict vd;
    const char *why = compare(got, want, truth, c->exact && c->exact[k], &vd);
    free(got);
    topos_node_info info;
    ck_assert_int_eq(topos_network_node(net, v.index, &info, &err), TOPOS_OK);
    if (getenv("TOPOS_IREE_VERBOSE")) {
      printf("iree: %s result %d (node %d, %s %s): ", c->label, k, v.index,
             info.op_name, topos_dtype_name(dt));
      if (vd.same)
        printf("bit-identical");
      else if (vd.ill)
        printf("ill-conditioned, error %.3g times the interpreter's", vd.ratio);
      else
        printf("relative error %.3e", vd.rel);
      printf("%s%s\n", why ? ": FAILS: " : "", why ? why : "");
    }
    if (why && !fail[0])
      snprintf(fail, sizeof fail,
               "%s: result %d (node %d, %s%s%s, %s): %s (files in %s)",
               c->label, k, v.index, info.op_name, info.name ? " " : "",
               info.name ? info.name : "", topos_dtype_name(dt), why, dir);
    if (dt == TOPOS_I32) continue;
    if (vd.ill)
      fprintf(rep, "ill %s %.3e\n", topos_dtype_name(dt), vd.ratio);
    else
      fprintf(rep, "result %s %.3e %d\n", topos_dtype_name(dt), vd.rel,
              vd.same);
  }
  fclose(rep);
  if (!fail[0] && !mutated) log_line("%s", report);
  free(report);
  topos_run_free(trun);
  topos_network_release(tnet);
  topos_run_free(run);
  return fail[0] ? fail : NULL;
}

static void iree_check(const iree_case *c) {
  const char *why = iree_run(c);
  ck_assert_msg(why == NULL, "%s", why);
}

/* ======================================================= the cases */

static const topos_dtype float_dtypes[] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};

/* Every value of a network, for observes (new). */
static topos_value *every_value(const topos_network *net, int *n) {
  *n = topos_network_node_count(net);
  topos_value *v = calloc((size_t)*n + 1, sizeof *v);
  ck_assert_ptr_nonnull(v);
  for (int i = 0; i < *n; i++) v[i] = topos_network_value(net, i);
  return v;
}

/* Ops whose every result bit StableHLO fixes given their operands:
 * IEEE arithmetic (correctly rounded), comparisons and selects, moves.
 * Not the transcendentals (IREE has its own approximations) nor sums and
 * products (their order is the compiler's). */
static bool op_is_exact(int op) {
  static const char *const names[] = {"add",
                                      "sub",
                                      "mul",
                                      "div",
                                      "neg",
                                      "sqrt",
                                      "maximum",
                                      "step",
                                      "relu",
                                      "transpose",
                                      "permute",
                                      "reshape",
                                      "narrow",
                                      "pad",
                                      "unfold",
                                      "concat",
                                      "broadcast",
                                      "gather",
                                      "broadcast_along",
                                      "max_along"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (topos_op_code(names[i]) == op) return true;
  return false;
}

/* Every op of net in isolation (see isolate), one module; the exact ops
 * (op_is_exact) must give the reference's bits. */
static void check_isolated(const char *name, const topos_network *net) {
  topos_value *roots;
  int nroots;
  topos_network *iso = isolate(net, &roots, &nroots);
  bool *exact = calloc((size_t)nroots + 1, sizeof *exact);
  ck_assert_ptr_nonnull(exact);
  for (int k = 0; k < nroots; k++) {
    topos_node_info info;
    ck_assert_int_eq(topos_network_node(iso, roots[k].index, &info, NULL),
                     TOPOS_OK);
    exact[k] = op_is_exact(info.op);
  }
  char label[96];
  snprintf(label, sizeof label, "%s_%s_isolated", name,
           topos_dtype_name(topos_network_dtype(net)));
  iree_case c = {label, iso, {roots, nroots}, 0, exact};
  iree_check(&c);
  free(exact);
  free(roots);
  topos_network_release(iso);
}

/*
 * One sample of sample_nets.h in one dtype.  f32 and f64: four plans,
 *  - forward, the root only, fused as the plan elects (`groups`);
 *  - forward observing every node: each op's result is compared, and
 *    observing the unfolds blocks every fusion;
 *  - training: the root and every parameter's gradient, training posture
 *    (the gradient reads the unfolded patches, so nothing fuses);
 *  - every op in isolation.
 * bf16: every op in isolation only.  A bf16 network compounds one bf16
 * rounding (up to 2^-8) per op; an op that rounds the other way early on
 * moves later results in the interpreter and in IREE alike, past the
 * 1e-2 envelope of a single kernel (1.15e-2 was measured on the MLP's
 * gradients).  Each op on the reference's own operands is what the
 * envelope is about.  `scalars`: see replay.
 */
static void check_sample(const char *name, sn_builder build, topos_dtype dt,
                         int groups, const double *scalars) {
  topos_network *src = build();
  ck_assert_msg(src != NULL, "%s", name);
  topos_network *net = replay(src, dt, TOPOS_NONE, NULL, scalars);
  if (dt == topos_network_dtype(src) && !scalars) {
    /* The replay is faithful: the same network, bit for bit. */
    char a[65], b[65];
    ck_assert_int_eq(topos_network_id(src, a, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(net, b, NULL), TOPOS_OK);
    ck_assert_str_eq(a, b);
  }
  if (dt == TOPOS_BF16) {
    check_isolated(name, net);
    topos_network_release(net);
    topos_network_release(src);
    return;
  }
  topos_value root = topos_network_value(net, sample_root(src).index);
  char label[96];
  snprintf(label, sizeof label, "%s_%s_forward", name, topos_dtype_name(dt));
  iree_case c = {label, net, {&root, 1}, groups, 0};
  iree_check(&c);

  int nobs;
  topos_value *obs = every_value(net, &nobs);
  snprintf(label, sizeof label, "%s_%s_every_node", name, topos_dtype_name(dt));
  c.entry.observes = obs;
  c.entry.nobserves = nobs;
  c.groups = 0;
  iree_check(&c);
  free(obs);
  check_isolated(name, net);
  topos_network_release(net);

  int np = topos_network_parameter_count(src);
  topos_value *roots = calloc((size_t)np + 1, sizeof *roots);
  ck_assert_ptr_nonnull(roots);
  net = replay(src, dt, sample_root(src), roots + 1, scalars);
  roots[0] = topos_network_value(net, sample_root(src).index);
  snprintf(label, sizeof label, "%s_%s_training", name, topos_dtype_name(dt));
  iree_case t = {
      label, net, {roots, np + 1, NULL, 0, TOPOS_POSTURE_TRAINING}, 0, 0};
  iree_check(&t);
  topos_network_release(net);
  free(roots);
  topos_network_release(src);
}

/* GPT-2 at scale (issue 14): a small config's forward plan (fused
 * attention chains, tied head) and a one-token decode step over a cache,
 * with random weights as the parameters: the logits IREE computes from
 * the emitted module hold the f32 envelope against the interpreter. */
START_TEST(test_gpt2) {
  if (!iree_present("gpt2")) return;
  topos_error err = {0};
  const ex_gpt2_config cfg = {500, 16, 32, 4, 2};
  ex_gpt2_weights w;
  ck_assert_msg(ex_gpt2_init(&w, &cfg, 3, &err) == 0, "%s", err.message);
  const int64_t steps[2][2] = {{12, 0}, {1, 11}}; /* (T, past) */
  for (int k = 0; k < 2; k++) {
    ex_kv_net n;
    ck_assert_msg(
        ex_gpt2_record_embedded(&n, &w, steps[k][0], steps[k][1], &err) == 0,
        "%s", err.message);
    char label[64];
    snprintf(label, sizeof label, "gpt2_T%lld_past%lld", (long long)steps[k][0],
             (long long)steps[k][1]);
    iree_case c = {label, n.net, {&n.logits, 1}, -1, 0};
    iree_check(&c);
    ex_kv_net_free(&n);
  }
  ex_gpt2_weights_free(&w);
}
END_TEST

/* The seed's (w·x − y)², recorded with w = x = y = 0: given w, x, y
 * here, so that the loss and its gradient are not zeros. */
static const double gd_scalars[3] = {1.25, 0.75, 3.0};

START_TEST(test_gradient_descent) {
  if (!iree_present("gradient_descent")) return;
  for (int d = 0; d < 3; d++)
    check_sample("gradient_descent", sn_gradient_descent, float_dtypes[d], 0,
                 gd_scalars);
}
END_TEST

START_TEST(test_mlp) {
  if (!iree_present("mlp")) return;
  for (int d = 0; d < 3; d++)
    check_sample("mlp", sn_mlp, float_dtypes[d], 0, NULL);
}
END_TEST

/* The CNN: conv2d and max_pool2d, each one fused group. */
START_TEST(test_cnn) {
  if (!iree_present("cnn")) return;
  for (int d = 0; d < 3; d++)
    check_sample("cnn", sn_conv, float_dtypes[d], 2, NULL);
}
END_TEST

/* Every op of the op set. */
START_TEST(test_every_op) {
  if (!iree_present("every_op")) return;
  for (int d = 0; d < 3; d++)
    check_sample("every_op", sn_every_op, float_dtypes[d], 0, NULL);
}
END_TEST

/* NaN, signed zeros and infinities: relu, maximum, step and neg only
 * select or move their arguments, so they must give the reference's bits;
 * the transcendentals, the division and the max-shifted rows must put NaN
 * and ±Inf where the reference does.  Plus i32 index arithmetic.
 * The special values arrive as arguments: IREE 3.13 folds exp of a NaN
 * constant to 0 at compile time (exp of a NaN argument is NaN).  And no
 * subnormals: IREE's CPU runtime flushes them to zero, where numerics.md
 * keeps them (docs/emission.md). */
START_TEST(test_special_values) {
  if (!iree_present("special_values")) return;
  const double va[8] = {NAN, -0.0, 0.0, -1, 2, INFINITY, -INFINITY, 1e-30};
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
    topos_value a = topos_input(t, ta), b = topos_input(t, tb);
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
    /* The first seven: relu, maximum, step, neg and the i32 add. */
    static const bool exact[16] = {1, 1, 1, 1, 1, 1, 1};
    char label[64];
    snprintf(label, sizeof label, "special_values_%s", topos_dtype_name(dt));
    iree_case c = {
        label, net, {roots, (int)(sizeof roots / sizeof *roots)}, 0, exact};
    iree_check(&c);
    topos_network_release(net);
  }
}
END_TEST

/* Convolution and pooling attributes IREE must read as we mean them:
 * stride, padding, dilation, several channels, overlapping pool windows,
 * all fused, in one module; test_emit.c's geometries.  The third pools
 * 3x4 with 3x3/3 windows into 1x1, which IREE 3.13 could not compile
 * until the emitter sliced off the column no window reads. */
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

/* The checks can fail: a module whose forms disagree, one that computes
 * other values, and one that breaks an exact select, each reported. */
START_TEST(test_mutations) {
  if (!iree_present("mutations")) return;
  topos_network *src = sn_gradient_descent();
  topos_network *net = replay(src, TOPOS_F64, TOPOS_NONE, NULL, gd_scalars);
  topos_value root = topos_network_value(net, sample_root(src).index);
  /* The pretty form alone changed: StableHLO's parser sees two modules. */
  iree_case c = {"mutation_forms",
                 net,
                 {&root, 1},
                 0,
                 0,
                 {"stablehlo.subtract", NULL},
                 {"stablehlo.add", NULL}};
  const char *why = iree_run(&c);
  ck_assert_msg(why && strstr(why, "different modules"), "%s",
                why ? why : "not caught");
  /* Both forms changed alike: valid StableHLO, wrong loss. */
  iree_case v = {"mutation_values",
                 net,
                 {&root, 1},
                 0,
                 0,
                 {"stablehlo.subtract", "\"stablehlo.subtract\""},
                 {"stablehlo.add", "\"stablehlo.add\""}};
  why = iree_run(&v);
  ck_assert_msg(why && strstr(why, "envelope"), "%s", why ? why : "not caught");
  topos_network_release(net);
  topos_network_release(src);

  /* relu's compare LE turned GE: every shape is kept, the bits are not. */
  topos_tape *t = topos_tape_new(TOPOS_F32);
  const double va[4] = {-1, 0.5, -0.0, 2};
  topos_tensor *ta = tt_tensor(TOPOS_F32, 1, S(4), va);
  topos_value r = topos_relu(t, topos_input(t, ta));
  topos_tensor_release(ta);
  net = seal(t);
  iree_case e = {"mutation_exact",
                 net,
                 {&r, 1},
                 0,
                 (const bool[]){true},
                 {"compare LE,", "comparison_direction LE>"},
                 {"compare GE,", "comparison_direction GE>"}};
  why = iree_run(&e);
  ck_assert_msg(why && strstr(why, "bit for bit"), "%s",
                why ? why : "not caught");
  topos_network_release(net);
}
END_TEST

Suite *iree_suite(void) {
  Suite *s = suite_create("iree");
  TCase *tc = tcase_create("execute");
  /* Each module costs about a second of iree-compile; the limits are hang
   * guards (CK_TIMEOUT_MULTIPLIER stretches them under sanitizers). */
  tcase_set_timeout(tc, 300);
  tcase_add_unchecked_fixture(tc, iree_setup, iree_teardown);
  tcase_add_test(tc, test_every_op);
  tcase_add_test(tc, test_special_values);
  tcase_add_test(tc, test_gradient_descent);
  tcase_add_test(tc, test_mlp);
  tcase_add_test(tc, test_cnn);
  tcase_add_test(tc, test_gpt2);
  tcase_add_test(tc, test_conv_pool_geometry);
  tcase_add_test(tc, test_mutations);
  suite_add_tcase(s, tc);
  return s;
}
