/*
 * test_cli_run.c - `topos forward` and `topos step` against a real toposd
 * (loopback port, SQLite store): tensors go in through .npy and
 * .safetensors files the test writes, and come back through the files the
 * CLI writes.
 *  - forward: the roots and observes read back from --out (.safetensors,
 *    and .npy for one root) are bit for bit topos_client_forward_with's
 *    and the in-process interpreter's; parameters named by node name or
 *    by slot index give the same bits; the text summary prints them.
 *  - step: five chained `topos step` calls (each passing the previous
 *    one's --out-params and --out-state on) give the loss, parameters and
 *    optimizer state of five topos_client_step calls, bit for bit, for
 *    SGD with momentum, plain SGD and Adam.
 *  - refusals: malformed .npy files (truncated, bad magic, fortran order,
 *    a shape that disagrees with the data, a huge shape, big-endian, an
 *    unknown dtype or version, header faults) are exit status 2 with a
 *    one-line reason; a feed that is not an input, or of the wrong shape,
 *    is the daemon's refusal, exit status 1; usage faults are 2.  None of
 *    them crashes the CLI.
 * The binaries are $TOPOS_BUILD/bin's (default "build").
 */
#include <stdarg.h>

#include "harness.h"
#include "topos_client.h"

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b && *b ? b : "build";
}

/* ------------------------------------------------------------ the setup */

typedef struct env {
  daemon_proc d;
  topos_client *c;
  mlp_net m;
  char id[65];
} env;

static void env_up(env *e) {
  memset(e, 0, sizeof *e);
  daemon_dir(&e->d);
  daemon_start(&e->d, NULL);
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", e->d.port);
  topos_error err = {0};
  e->c = topos_client_connect(address, &err);
  ck_assert_msg(e->c != NULL, "connect %s: %s", address, err.message);
  e->m = mlp_network();
  ck_assert_msg(topos_client_record(e->c, e->m.net, e->id, &err) == TOPOS_OK,
                "record: %s", err.message);
}

static void env_down(env *e) {
  topos_client_close(e->c);
  topos_network_release(e->m.net);
  assert_clean_exit(daemon_stop(&e->d, SIGTERM, 30), 30);
  daemon_cleanup(&e->d);
}

/* A path in the daemon's temporary directory (removed after the test). */
static const char *path_in(const env *e, const char *name) {
  static char buf[16][512];
  static int next;
  char *p = buf[next++ % 16];
  snprintf(p, sizeof buf[0], "%s/%s", e->d.dir, name);
  return p;
}

/* ------------------------------------------------------------ the CLI */

typedef struct cli_result {
  int status; /* exit status; -1 when it did not exit (a crash) */
  char *out, *err;
} cli_result;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  size_t cap = 1 << 14, n = 0;
  char *buf = calloc(1, cap);
  ck_assert_ptr_nonnull(buf);
  while (f) {
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
    if (cap - n < 2) {
      buf = realloc(buf, cap *= 2);
      ck_assert_ptr_nonnull(buf);
    }
  }
  if (f) fclose(f);
  buf[n] = '\0';
  return buf;
}

/* Runs `topos --server ... ARGS` (a printf format); stdout and stderr
 * are captured apart. */
static cli_result cli(const env *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static cli_result cli(const env *e, const char *fmt, ...) {
  char args[3072], cmd[8192], outp[512], errp[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(outp, sizeof outp, "%s/cli.out", e->d.dir);
  snprintf(errp, sizeof errp, "%s/cli.err", e->d.dir);
  snprintf(cmd, sizeof cmd,
           "'%s/bin/topos' --server 127.0.0.1:%d %s >'%s' 2>'%s'", build_dir(),
           e->d.port, args, outp, errp);
  int st = system(cmd);
  cli_result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(outp);
  r.err = slurp(errp);
  return r;
}

static void cli_free(cli_result *r) {
  free(r->out);
  free(r->err);
}

/* Exit status 0, or the test fails showing stderr. */
static cli_result cli_ok_(const env *e, const char *args) {
  cli_result r = cli(e, "%s", args);
  ck_assert_msg(r.status == 0, "topos %s: exit status %d: %s", args, r.status,
                r.err);
  return r;
}

#define CLI_OK(e, ...)                    \
  do {                                    \
    char a_[3072];                        \
    snprintf(a_, sizeof a_, __VA_ARGS__); \
    cli_result r_ = cli_ok_((e), a_);     \
    cli_free(&r_);                        \
  } while (0)

/* The CLI refuses: exit status `want`, one line on stderr holding
 * `needle`, nothing on stdout. */
static void expect_refusal(const env *e, int want, const char *needle,
                           const char *args) {
  cli_result r = cli(e, "%s", args);
  ck_assert_msg(r.status == want,
                "topos %s: exit status %d, want %d (stderr: %s)", args,
                r.status, want, r.err);
  ck_assert_msg(strstr(r.err, needle) != NULL,
                "topos %s: stderr does not say \"%s\": %s", args, needle,
                r.err);
  ck_assert_msg(strncmp(r.err, "topos: ", 7) == 0, "topos %s: stderr: %s", args,
                r.err);
  ck_assert_msg(r.out[0] == '\0', "topos %s: stdout: %s", args, r.out);
  cli_free(&r);
}

/* ------------------------------------------------------------ files */

static void write_bytes(const char *path, const void *a, size_t alen,
                        const void *b, size_t blen) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert(fwrite(a, 1, alen, f) == alen);
  if (blen) ck_assert(fwrite(b, 1, blen, f) == blen);
  ck_assert_int_eq(fclose(f), 0);
}

/* A .npy file: the magic, version major.0, the header dict padded to a
 * multiple of 64 (version 1: 2-byte length, 2: 4-byte), then data. */
static void write_npy_raw(const char *path, int major, const char *dict,
                          const void *data, size_t len) {
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t total = pre + dl + 1, pad = (64 - total % 64) % 64;
  size_t hlen = dl + pad + 1;
  uint8_t *buf = malloc(pre + hlen);
  ck_assert_ptr_nonnull(buf);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (uint8_t)major;
  buf[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (uint8_t)(hlen >> (8 * i));
  memcpy(buf + pre, dict, dl);
  memset(buf + pre + dl, ' ', pad);
  buf[pre + hlen - 1] = '\n';
  write_bytes(path, buf, pre + hlen, data, len);
  free(buf);
}

/* The tensor's row-major bytes (new). */
static void *tensor_bytes(const topos_tensor *t, size_t *len) {
  *len =
      (size_t)topos_tensor_count(t) * topos_dtype_size(topos_tensor_dtype(t));
  void *buf = malloc(*len ? *len : 1);
  topos_error err = {0};
  ck_assert_int_eq(topos_tensor_read(t, buf, *len, &err), TOPOS_OK);
  return buf;
}

/* t as .npy, the way numpy.save writes it. */
static void write_npy(const char *path, const topos_tensor *t, int major) {
  const char *descr = topos_tensor_dtype(t) == TOPOS_F32   ? "<f4"
                      : topos_tensor_dtype(t) == TOPOS_F64 ? "<f8"
                                                           : "<i4";
  char shape[128] = "(";
  size_t w = 1;
  int rank = topos_tensor_rank(t);
  for (int i = 0; i < rank; i++)
    w += (size_t)snprintf(shape + w, sizeof shape - w, "%s%lld", i ? ", " : "",
                          (long long)topos_tensor_shape(t)[i]);
  snprintf(shape + w, sizeof shape - w, rank == 1 ? ",)" : ")");
  char dict[256];
  snprintf(dict, sizeof dict,
           "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
           shape);
  size_t len;
  void *data = tensor_bytes(t, &len);
  write_npy_raw(path, major, dict, data, len);
  free(data);
}

/* Reads a .npy file the CLI wrote, checking the layout numpy.save
 * writes: version 1.0, the header "{'descr': D, 'fortran_order': False,
 * 'shape': S, }" padded with spaces and a newline to a multiple of 64,
 * then the data.  Returns the data (new) and its length. */
static uint8_t *read_npy(const char *path, const char *descr, const char *shape,
                         size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  ck_assert_msg(n >= 10 && memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0,
                "%s: not a .npy 1.0 file", path);
  size_t hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
  ck_assert_msg(
      10 + hlen <= n && (10 + hlen) % 64 == 0 && buf[10 + hlen - 1] == '\n',
      "%s: header length %zu", path, hlen);
  char want[256];
  int wl = snprintf(want, sizeof want,
                    "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, shape);
  ck_assert_msg(memcmp(buf + 10, want, (size_t)wl) == 0,
                "%s: header %.*s, want %s", path, (int)hlen, buf + 10, want);
  for (size_t i = 10 + (size_t)wl; i < 10 + hlen - 1; i++)
    ck_assert_msg(buf[i] == ' ', "%s: header padding", path);
  *len = n - 10 - hlen;
  uint8_t *data = malloc(*len ? *len : 1);
  memcpy(data, buf + 10 + hlen, *len);
  return data;
}

/* Saves n tensors under n names. */
static void write_safetensors(const char *path, int n, const char *const *names,
                              topos_tensor *const *ts) {
  topos_error err = {0};
  ck_assert_msg(topos_safetensors_save(path, n, names, ts, &err) == TOPOS_OK,
                "%s: %s", path, err.message);
}

/* The tensor `name` of a safetensors file (new). */
static topos_tensor *st_get(const char *path, const char *name) {
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "%s: %s", path, err.message);
  topos_tensor *t = topos_safetensors_get(st, name, &err);
  ck_assert_msg(t != NULL, "%s: %s: %s", path, name, err.message);
  topos_safetensors_free(st);
  return t;
}

static int st_count(const char *path) {
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "%s: %s", path, err.message);
  int n = topos_safetensors_count(st);
  topos_safetensors_free(st);
  return n;
}

/* Same dtype, shape and bytes. */
static void assert_same_bits(const topos_tensor *a, const topos_tensor *b,
                             const char *what) {
  ck_assert_msg(topos_tensor_dtype(a) == topos_tensor_dtype(b) &&
                    topos_tensor_rank(a) == topos_tensor_rank(b),
                "%s: dtype or rank differs", what);
  for (int i = 0; i < topos_tensor_rank(a); i++)
    ck_assert_msg(topos_tensor_shape(a)[i] == topos_tensor_shape(b)[i],
                  "%s: extent %d differs", what, i);
  size_t la, lb;
  void *da = tensor_bytes(a, &la), *db = tensor_bytes(b, &lb);
  ck_assert_msg(la == lb && memcmp(da, db, la) == 0, "%s: bits differ", what);
  free(da);
  free(db);
}

/* ------------------------------------------------------------ the data */

static const char *const param_names[4] = {"W1", "b1", "W2", "b2"};

/* Parameters other than the initials (so --params visibly matters). */
static topos_params *other_params(const mlp_net *m, uint64_t seed) {
  topos_error err = {0};
  topos_params *init = topos_network_parameters(m->net);
  topos_tensor *ts[4];
  for (int s = 0; s < 4; s++) {
    const topos_tensor *t = topos_params_get(init, s);
    ts[s] = topos_init_normal(TOPOS_F32, topos_tensor_rank(t),
                              topos_tensor_shape(t), 0, 0.4, seed + (uint64_t)s,
                              &err);
    ck_assert_ptr_nonnull(ts[s]);
  }
  topos_params *p = topos_params_new(4, ts, &err);
  ck_assert_ptr_nonnull(p);
  for (int s = 0; s < 4; s++) topos_tensor_release(ts[s]);
  topos_params_free(init);
  return p;
}

/* x f32[8,6] and labels y i32[8] for batch k. */
static void batch(const mlp_net *m, int k, topos_feed feeds[2]) {
  topos_error err = {0};
  int64_t xs[2] = {8, 6}, ys[1] = {8};
  int32_t labels[8];
  for (int i = 0; i < 8; i++) labels[i] = (int32_t)((i * 3 + k) % 5);
  feeds[0].input = m->x;
  feeds[0].tensor = topos_init_normal(TOPOS_F32, 2, xs, 0, 1, 500 + k, &err);
  feeds[1].input = m->y;
  feeds[1].tensor = topos_tensor_from(TOPOS_I32, 1, ys, labels, &err);
  ck_assert(feeds[0].tensor && feeds[1].tensor);
}

static void batch_free(topos_feed feeds[2]) {
  for (int i = 0; i < 2; i++)
    topos_tensor_release((topos_tensor *)feeds[i].tensor);
}

/* Writes batch k as x<k>.npy and y<k>.safetensors (one tensor, named
 * something else than y: a one-tensor file needs no particular name). */
static void write_batch(const env *e, int k, const topos_feed feeds[2]) {
  char name[64];
  snprintf(name, sizeof name, "x%d.npy", k);
  write_npy(path_in(e, name), feeds[0].tensor, k % 2 ? 2 : 1);
  snprintf(name, sizeof name, "y%d.safetensors", k);
  const char *n[1] = {"labels"};
  topos_tensor *t[1] = {(topos_tensor *)feeds[1].tensor};
  write_safetensors(path_in(e, name), 1, n, t);
}

/* ------------------------------------------------------------ forward */

START_TEST(test_forward_bits) {
  env e;
  env_up(&e);
  topos_error err = {0};
  topos_params *p = other_params(&e.m, 40);
  topos_feed feeds[2];
  batch(&e.m, 7, feeds);
  write_batch(&e, 7, feeds);
  /* The parameters by name, and by slot index. */
  topos_tensor *pt[4];
  for (int s = 0; s < 4; s++) pt[s] = (topos_tensor *)topos_params_get(p, s);
  write_safetensors(path_in(&e, "p.safetensors"), 4, param_names, pt);
  const char *idx[4] = {"0", "1", "2", "3"};
  write_safetensors(path_in(&e, "pi.safetensors"), 4, idx, pt);

  /* The reference: the C client, and the interpreter in-process. */
  topos_value roots[2] = {e.m.loss, e.m.logits};
  topos_entry entry = {
      roots, 2, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_client_args args = {.params = p, .feeds = feeds, .nfeeds = 2};
  topos_tensor **remote = NULL;
  ck_assert_msg(topos_client_forward_with(e.c, e.id, &entry, &args, &remote,
                                          NULL, &err) == TOPOS_OK,
                "forward: %s", err.message);
  topos_run *run = topos_forward(e.m.net, p, feeds, 2, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  for (int i = 0; i < 2; i++)
    assert_same_bits(remote[i], topos_run_of(run, roots[i], &err),
                     "client vs interpreter");

  /* --out .safetensors: roots by name, an observe by index. */
  const char *out = path_in(&e, "out.safetensors");
  const char *feed_args =
      "--feed x=%s/x7.npy --feed y=%s/y7.safetensors --params %s/%s";
  char fa[1024];
  snprintf(fa, sizeof fa, feed_args, e.d.dir, e.d.dir, e.d.dir,
           "p.safetensors");
  CLI_OK(&e, "forward %s --roots loss,logits --observes %d %s --out '%s'", e.id,
         e.m.logits.index, fa, out);
  ck_assert_int_eq(st_count(out), 3);
  topos_tensor *got = st_get(out, "loss");
  assert_same_bits(got, remote[0], "--out loss");
  topos_tensor_release(got);
  got = st_get(out, "logits");
  assert_same_bits(got, remote[1], "--out logits");
  topos_tensor_release(got);
  char obs[16];
  snprintf(obs, sizeof obs, "%d", e.m.logits.index);
  got = st_get(out, obs);
  assert_same_bits(got, remote[1], "--out observe");
  topos_tensor_release(got);

  /* Parameters named by slot index: the same bits. */
  char fi[1024];
  snprintf(fi, sizeof fi, feed_args, e.d.dir, e.d.dir, e.d.dir,
           "pi.safetensors");
  const char *out_i = path_in(&e, "out_i.safetensors");
  CLI_OK(&e, "forward %s --roots %d %s --out '%s'", e.id, e.m.loss.index, fi,
         out_i);
  snprintf(obs, sizeof obs, "%d", e.m.loss.index);
  got = st_get(out_i, obs);
  assert_same_bits(got, remote[0], "--params by slot");
  topos_tensor_release(got);

  /* --out .npy: the one root, as numpy.save writes it. */
  const char *npy = path_in(&e, "logits.npy");
  CLI_OK(&e, "forward %s --roots logits %s --out '%s'", e.id, fa, npy);
  size_t len, want_len;
  uint8_t *data = read_npy(npy, "<f4", "(8, 5)", &len);
  void *want = tensor_bytes(remote[1], &want_len);
  ck_assert_msg(len == want_len && memcmp(data, want, len) == 0,
                "logits.npy: data differs");
  free(data);
  free(want);

  /* No --out: the summary on stdout, the loss with its bits. */
  cli_result r = cli(&e, "forward %s --roots loss %s", e.id, fa);
  ck_assert_msg(r.status == 0, "%s", r.err);
  float loss;
  ck_assert_int_eq(topos_tensor_read(remote[0], &loss, sizeof loss, &err),
                   TOPOS_OK);
  char line[128];
  snprintf(line, sizeof line, "loss f32[] = %.9g\n", loss);
  ck_assert_str_eq(r.out, line);
  ck_assert_str_eq(r.err, "");
  float back = strtof(r.out + strlen("loss f32[] = "), NULL);
  ck_assert(memcmp(&back, &loss, sizeof loss) == 0);
  cli_free(&r);
  r = cli(&e, "forward %s --roots logits %s", e.id, fa);
  ck_assert_str_eq(r.out, "logits f32[8,5] (40 elements)\n");
  cli_free(&r);

  /* Without --roots and --params: the spec's outputs (loss), named root0,
   * and the initial parameters. */
  const char *out_d = path_in(&e, "out_d.safetensors");
  snprintf(fa, sizeof fa, "--feed x=%s/x7.npy --feed 5=%s/y7.safetensors",
           e.d.dir, e.d.dir);
  ck_assert_int_eq(e.m.y.index, 5);
  CLI_OK(&e, "forward %s %s --out '%s'", e.id, fa, out_d);
  topos_run *run0 = topos_forward(e.m.net, NULL, feeds, 2, NULL, &err);
  ck_assert_msg(run0 != NULL, "%s", err.message);
  ck_assert_int_eq(st_count(out_d), 1);
  got = st_get(out_d, "root0");
  assert_same_bits(got, topos_run_of(run0, e.m.loss, &err), "default roots");
  topos_tensor_release(got);
  topos_run_free(run0);

  topos_run_free(run);
  topos_client_tensors_free(remote, 2);
  batch_free(feeds);
  topos_params_free(p);
  env_down(&e);
}
END_TEST

/* ------------------------------------------------------------ step */

/* Five steps both ways, comparing after each: the loss (stdout), the
 * parameters (--out-params) and the state (--out-state). */
static void check_chain(env *e, const char *flags, const topos_optimizer *opt,
                        const char *tag) {
  topos_error err = {0};
  topos_params *params = NULL; /* the initials, then each step's */
  topos_opt_state *state = NULL;
  for (int k = 0; k < 5; k++) {
    topos_feed feeds[2];
    batch(&e->m, k, feeds);
    write_batch(e, k, feeds);
    topos_params *p2 = NULL;
    topos_opt_state *s2 = NULL;
    double loss = NAN;
    ck_assert_msg(
        topos_client_step(e->c, e->id, e->m.loss, params, feeds, 2, opt, state,
                          &p2, &s2, &loss, &err) == TOPOS_OK,
        "%s step %d: %s", tag, k, err.message);
    char prev[1024] = "", pp[64], ps[64];
    snprintf(pp, sizeof pp, "%s-p%d.safetensors", tag, k);
    snprintf(ps, sizeof ps, "%s-s%d.safetensors", tag, k);
    if (k > 0)
      snprintf(prev, sizeof prev,
               "--params '%s/%s-p%d.safetensors' --state "
               "'%s/%s-s%d.safetensors'",
               e->d.dir, tag, k - 1, e->d.dir, tag, k - 1);
    cli_result r =
        cli(e,
            "step %s --loss loss %s --feed x=%s/x%d.npy --feed "
            "y=%s/y%d.safetensors %s --out-params '%s' --out-state '%s'",
            e->id, flags, e->d.dir, k, e->d.dir, k, prev, path_in(e, pp),
            path_in(e, ps));
    ck_assert_msg(r.status == 0, "%s step %d: exit %d: %s", tag, k, r.status,
                  r.err);
    char *end = NULL;
    double cli_loss = strtod(r.out, &end);
    ck_assert_msg(end && *end == '\n' && end[1] == '\0', "stdout: %s", r.out);
    ck_assert_msg(memcmp(&cli_loss, &loss, sizeof loss) == 0,
                  "%s step %d: loss %.17g vs %.17g", tag, k, cli_loss, loss);
    cli_free(&r);
    /* The parameters. */
    ck_assert_int_eq(st_count(path_in(e, pp)), 4);
    for (int s = 0; s < 4; s++) {
      topos_tensor *t = st_get(path_in(e, pp), param_names[s]);
      assert_same_bits(t, topos_params_get(p2, s), param_names[s]);
      topos_tensor_release(t);
    }
    /* The state: step, and the moments the optimizer keeps. */
    topos_tensor *st = st_get(path_in(e, ps), "step");
    double step = -1;
    ck_assert_int_eq(topos_tensor_read(st, &step, sizeof step, &err), TOPOS_OK);
    ck_assert_int_eq(topos_tensor_dtype(st), TOPOS_F64);
    ck_assert(step == (double)topos_opt_state_step(s2));
    ck_assert(step == k + 1);
    topos_tensor_release(st);
    int moments = 0;
    for (int w = 0; w < 2; w++) {
      const topos_params *mp = topos_opt_state_moment(s2, w);
      for (int s = 0; mp && s < 4; s++) {
        char name[32];
        snprintf(name, sizeof name, "%c.%s", w ? 'v' : 'm', param_names[s]);
        topos_tensor *t = st_get(path_in(e, ps), name);
        assert_same_bits(t, topos_params_get(mp, s), name);
        topos_tensor_release(t);
        moments++;
      }
    }
    ck_assert_int_eq(st_count(path_in(e, ps)), 1 + moments);
    topos_params_free(params);
    topos_opt_state_free(state);
    params = p2;
    state = s2;
    batch_free(feeds);
  }
  topos_params_free(params);
  topos_opt_state_free(state);
}

START_TEST(test_step_chain_bits) {
  env e;
  env_up(&e);
  topos_optimizer sgd = topos_sgd(0.1, 0.9);
  check_chain(&e, "--optimizer sgd --lr 0.1 --momentum 0.9", &sgd, "sgdm");
  topos_optimizer plain = topos_sgd(0.05, 0);
  check_chain(&e, "--lr 0.05", &plain, "sgd");
  /* Adam with the daemon's defaults for beta1, beta2 and eps. */
  topos_optimizer adam = topos_adam(0.01, 0.9, 0.999, 1e-8);
  check_chain(&e, "--optimizer adam --lr 0.01", &adam, "adam");
  topos_optimizer adamw = topos_adamw(0.01, 0.8, 0.99, 1e-6, 0.05);
  check_chain(&e,
              "--optimizer adamw --lr 0.01 --beta1 0.8 --beta2 0.99 --eps "
              "1e-6 --weight-decay 0.05",
              &adamw, "adamw");
  env_down(&e);
}
END_TEST

/* ------------------------------------------------------------ refusals */

START_TEST(test_refusals) {
  env e;
  env_up(&e);
  topos_feed feeds[2];
  batch(&e.m, 1, feeds);
  write_batch(&e, 1, feeds);
  const char *dir = e.d.dir;
  char args[2048];
  size_t xlen;
  void *xdata = tensor_bytes(feeds[0].tensor, &xlen);
  const char *good =
      "{'descr': '<f4', 'fortran_order': False, "
      "'shape': (8, 6), }";

  /* Malformed .npy feeds: exit 2, a one-line reason. */
  static const struct {
    const char *file, *dict, *needle;
    int major;
    long cut; /* bytes of data written: -1 all */
  } bad[] = {
      {"trunc.npy", NULL, "a truncated file", 1, 100},
      {"fortran.npy",
       "{'descr': '<f4', 'fortran_order': True, 'shape': (8, 6), }",
       "fortran_order True", 1, -1},
      {"mismatch.npy",
       "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 7), }",
       "needs 224", 1, -1},
      {"huge.npy",
       "{'descr': '<f4', 'fortran_order': False, 'shape': "
       "(4611686018427387904, 4611686018427387904), }",
       "more bytes than any file", 1, -1},
      {"huge1.npy",
       "{'descr': '<f8', 'fortran_order': False, 'shape': "
       "(2305843009213693952,), }",
       "more bytes than any file", 2, -1},
      {"bigend.npy",
       "{'descr': '>f4', 'fortran_order': False, 'shape': (8, 6), }",
       "big-endian", 1, -1},
      {"int64.npy",
       "{'descr': '<i8', 'fortran_order': False, 'shape': (8, 3), }",
       "dtype '<i8' is not supported", 1, -1},
      {"nokey.npy", "{'descr': '<f4', 'shape': (8, 6), }", "no 'fortran_order'",
       1, -1},
      {"extra.npy",
       "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 6), 'x': 1}",
       "unexpected key 'x'", 1, -1},
      {"notuple.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': 48, }",
       "not a tuple", 1, -1},
      {"neg.npy",
       "{'descr': '<f4', 'fortran_order': False, 'shape': (-8, 6), }",
       "whole numbers", 1, -1},
      {"v3.npy", NULL, "version 3.0 is not supported", 3, -1},
      {"junk.npy",
       "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 6), } x",
       "bytes after its dict", 1, -1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = path_in(&e, bad[i].file);
    int major = bad[i].major == 3 ? 2 : bad[i].major;
    write_npy_raw(p, major, bad[i].dict ? bad[i].dict : good, xdata,
                  bad[i].cut < 0 ? xlen : (size_t)bad[i].cut);
    if (bad[i].major == 3) {
      FILE *f = fopen(p, "r+b");
      ck_assert_ptr_nonnull(f);
      fseek(f, 6, SEEK_SET);
      fputc(3, f);
      fclose(f);
    }
    snprintf(args, sizeof args, "forward %s --feed x='%s'", e.id, p);
    expect_refusal(&e, 2, bad[i].needle, args);
  }
  /* Bad magic, a file shorter than a preamble, a header past the end. */
  write_bytes(path_in(&e, "magic.npy"), "PK\x03\x04 not numpy at all", 22, NULL,
              0);
  snprintf(args, sizeof args, "forward %s --feed x=%s/magic.npy", e.id, dir);
  expect_refusal(&e, 2, "no \\x93NUMPY magic", args);
  write_bytes(path_in(&e, "short.npy"), "\x93NUM", 4, NULL, 0);
  snprintf(args, sizeof args, "forward %s --feed x=%s/short.npy", e.id, dir);
  expect_refusal(&e, 2, "truncated", args);
  write_bytes(path_in(&e, "hdr.npy"), "\x93NUMPY\x01\x00\xff\x7f{'de", 15, NULL,
              0);
  snprintf(args, sizeof args, "forward %s --feed x=%s/hdr.npy", e.id, dir);
  expect_refusal(&e, 2, "run past the end of the file", args);
  write_bytes(path_in(&e, "empty.npy"), "", 0, NULL, 0);
  snprintf(args, sizeof args, "forward %s --feed x=%s/empty.npy", e.id, dir);
  expect_refusal(&e, 2, "truncated", args);
  {
    const char *nn[2] = {"a", "b"};
    topos_tensor *tt[2] = {(topos_tensor *)feeds[0].tensor,
                           (topos_tensor *)feeds[1].tensor};
    write_safetensors(path_in(&e, "two.safetensors"), 2, nn, tt);
  }
  snprintf(args, sizeof args, "forward %s --feed x=%s/two.safetensors", e.id,
           dir);
  expect_refusal(&e, 2, "it holds 2 tensors, none of them named x", args);
  snprintf(args, sizeof args, "forward %s --feed x=%s/missing.npy", e.id, dir);
  expect_refusal(&e, 2, "No such file", args);

  /* What the daemon refuses: exit 1, its message. */
  snprintf(args, sizeof args, "forward %s --feed nosuch=%s/x1.npy", e.id, dir);
  expect_refusal(&e, 1, "nosuch", args);
  snprintf(args, sizeof args, "forward %s --feed W1=%s/x1.npy", e.id, dir);
  expect_refusal(&e, 1, "not an input", args);
  snprintf(args, sizeof args, "forward %s --feed y=%s/x1.npy", e.id, dir);
  expect_refusal(&e, 1, "forward: ", args);
  snprintf(args, sizeof args,
           "step %s --loss loss --lr 0.1 --feed nosuch=%s/x1.npy", e.id, dir);
  expect_refusal(&e, 1, "nosuch", args);

  /* Parameter files that do not fit: exit 2. */
  topos_params *init = topos_network_parameters(e.m.net);
  topos_tensor *pt[4];
  for (int s = 0; s < 4; s++) pt[s] = (topos_tensor *)topos_params_get(init, s);
  write_safetensors(path_in(&e, "three.safetensors"), 3, param_names, pt);
  snprintf(args, sizeof args, "forward %s --params %s/three.safetensors", e.id,
           dir);
  expect_refusal(&e, 2, "has no tensor b2 (or 3) for parameter slot 3", args);
  topos_tensor *swapped[4] = {pt[2], pt[1], pt[0], pt[3]};
  write_safetensors(path_in(&e, "swapped.safetensors"), 4, param_names,
                    swapped);
  snprintf(args, sizeof args, "forward %s --params %s/swapped.safetensors",
           e.id, dir);
  expect_refusal(&e, 2, "W1 is f32[16,5], the spec's parameter is f32[6,16]",
                 args);
  snprintf(args, sizeof args, "forward %s --params %s/nothere.safetensors",
           e.id, dir);
  expect_refusal(&e, 2, "no such file", args);
  snprintf(args, sizeof args, "forward %s --params %s/x1.npy", e.id, dir);
  expect_refusal(&e, 2, "x1.npy: not a safetensors file (", args);
  /* A state with some moments only. */
  write_safetensors(path_in(&e, "p.safetensors"), 4, param_names, pt);
  topos_tensor *step = topos_tensor_scalar(TOPOS_F64, 3, NULL);
  const char *sn[3] = {"step", "m.W1", "m.b1"};
  topos_tensor *sv[3] = {step, pt[0], pt[1]};
  write_safetensors(path_in(&e, "s.safetensors"), 3, sn, sv);
  snprintf(args, sizeof args,
           "step %s --loss loss --lr 0.1 --momentum 0.5 --params "
           "%s/p.safetensors --state %s/s.safetensors",
           e.id, dir, dir);
  expect_refusal(&e, 2, "has 2 of the 4 m moments", args);
  topos_tensor_release(step);
  step = topos_tensor_scalar(TOPOS_F64, 2.5, NULL);
  sv[0] = step;
  write_safetensors(path_in(&e, "s2.safetensors"), 1, sn, sv);
  snprintf(args, sizeof args,
           "step %s --loss loss --lr 0.1 --state %s/s2.safetensors", e.id, dir);
  expect_refusal(&e, 2, "step is not one whole number", args);
  topos_tensor_release(step);
  topos_params_free(init);

  /* Usage faults: exit 2. */
  snprintf(args, sizeof args, "forward %s --bogus", e.id);
  expect_refusal(&e, 2, "unknown option '--bogus'", args);
  snprintf(args, sizeof args, "forward %s --roots loss,logits --out %s/o.npy",
           e.id, dir);
  expect_refusal(&e, 2, ".npy holds one tensor", args);
  snprintf(args, sizeof args, "forward %s --out %s/o.txt", e.id, dir);
  expect_refusal(&e, 2, "must end in", args);
  snprintf(args, sizeof args, "forward %s --feed x", e.id);
  expect_refusal(&e, 2, "NAME=FILE", args);
  snprintf(args, sizeof args, "step %s --loss loss", e.id);
  expect_refusal(&e, 2, "needs --lr", args);
  snprintf(args, sizeof args, "step %s --lr 0.1", e.id);
  expect_refusal(&e, 2, "needs --loss", args);
  snprintf(args, sizeof args, "step %s --loss loss --lr x", e.id);
  expect_refusal(&e, 2, "--lr needs a number", args);
  snprintf(args, sizeof args,
           "step %s --loss loss --lr 0.1 --optimizer adam --momentum 0.9",
           e.id);
  expect_refusal(&e, 2, "--momentum applies to --optimizer sgd only", args);
  snprintf(args, sizeof args, "step %s --loss loss --lr 0.1 --optimizer rms",
           e.id);
  expect_refusal(&e, 2, "sgd, adam or adamw", args);
  snprintf(args, sizeof args, "forward %s --loss loss", e.id);
  expect_refusal(&e, 2, "--loss does not apply to forward", args);
  snprintf(args, sizeof args, "forward %s --beta2 0.9", e.id);
  expect_refusal(&e, 2, "--beta2 does not apply to forward", args);
  snprintf(args, sizeof args, "forward %s --out-state %s/s.safetensors", e.id,
           dir);
  expect_refusal(&e, 2, "--out-state does not apply to forward", args);
  snprintf(args, sizeof args, "step %s --loss loss --lr 0.1 --roots loss",
           e.id);
  expect_refusal(&e, 2, "does not apply to step", args);
  snprintf(args, sizeof args, "lower %s --feed x=%s/x1.npy", e.id, dir);
  expect_refusal(&e, 2, "--feed does not apply to lower", args);
  /* The daemon's range check on a hyperparameter: a failed call. */
  snprintf(args, sizeof args, "step %s --loss loss --lr -1", e.id);
  expect_refusal(&e, 1, "step: ", args);

  /* bf16 has no .npy dtype: a bf16 output is refused, not mangled. */
  topos_tape *tape = topos_tape_new(TOPOS_BF16);
  topos_tensor *two = topos_tensor_scalar(TOPOS_BF16, 2, NULL);
  topos_value v = topos_name(tape, topos_parameter(tape, two), "h");
  topos_name(tape, topos_mul(tape, v, v), "sq");
  topos_tensor_release(two);
  topos_error err = {0};
  topos_network *bnet = topos_tape_seal(tape, &err);
  ck_assert_msg(bnet != NULL, "%s", err.message);
  char bid[65];
  ck_assert_int_eq(topos_client_record(e.c, bnet, bid, &err), TOPOS_OK);
  snprintf(args, sizeof args, "forward %s --out %s/sq.npy", bid, dir);
  expect_refusal(&e, 1, "bf16 has no .npy dtype", args);
  cli_result r = cli(&e, "forward %s", bid);
  ck_assert_int_eq(r.status, 0);
  ck_assert_str_eq(r.out, "root0 bf16[] = 4\n");
  cli_free(&r);
  topos_network_release(bnet);

  free(xdata);
  batch_free(feeds);
  env_down(&e);
}
END_TEST

/* put-blob of a safetensors file (the client's id for the same tensors)
 * and of a .npy, get-blob back to files with the same bits, delete of the
 * stored spec, and their refusals. */
START_TEST(test_blobs_and_delete) {
  env e;
  env_up(&e);
  topos_params *p = other_params(&e.m, 7);
  topos_tensor *ts[4];
  for (int s = 0; s < 4; s++) ts[s] = (topos_tensor *)topos_params_get(p, s);
  write_safetensors(path_in(&e, "p.safetensors"), 4, param_names, ts);
  cli_result r = cli(&e, "put-blob '%s'", path_in(&e, "p.safetensors"));
  ck_assert_msg(r.status == 0, "%s", r.err);
  char want[65];
  topos_error err = {0};
  ck_assert_int_eq(topos_client_put_blob(e.c, p, want, NULL, &err), TOPOS_OK);
  ck_assert_msg(strncmp(r.out, want, 64) == 0 && r.out[64] == '\n',
                "put-blob said %s, the client %s", r.out, want);
  cli_free(&r);
  CLI_OK(&e, "get-blob %s --out '%s'", want, path_in(&e, "g.safetensors"));
  ck_assert_int_eq(st_count(path_in(&e, "g.safetensors")), 4);
  for (int s = 0; s < 4; s++) {
    char name[16];
    snprintf(name, sizeof name, "%d", s);
    topos_tensor *t = st_get(path_in(&e, "g.safetensors"), name);
    assert_same_bits(t, ts[s], param_names[s]);
    topos_tensor_release(t);
  }
  /* One tensor through .npy both ways. */
  write_npy(path_in(&e, "w1.npy"), ts[0], 1);
  r = cli(&e, "put-blob '%s'", path_in(&e, "w1.npy"));
  ck_assert_msg(r.status == 0 && strlen(r.out) == 65, "%s", r.err);
  char one[65];
  memcpy(one, r.out, 64);
  one[64] = '\0';
  cli_free(&r);
  CLI_OK(&e, "get-blob %s --out '%s'", one, path_in(&e, "w1b.npy"));
  char shape[64];
  snprintf(shape, sizeof shape, "(%lld, %lld)",
           (long long)topos_tensor_shape(ts[0])[0],
           (long long)topos_tensor_shape(ts[0])[1]);
  size_t len = 0;
  uint8_t *back = read_npy(path_in(&e, "w1b.npy"), "<f4", shape, &len);
  size_t wl = 0;
  void *wb = tensor_bytes(ts[0], &wl);
  ck_assert_msg(len == wl && memcmp(back, wb, wl) == 0, "W1 through .npy");
  free(back);
  free(wb);
  /* Printed: index, dtype, shape. */
  char gb[100];
  snprintf(gb, sizeof gb, "get-blob %s", one);
  r = cli_ok_(&e, gb);
  ck_assert_msg(strncmp(r.out, "0 f32[", 6) == 0, "%s", r.out);
  cli_free(&r);

  /* delete: the spec goes, and saying it again is NOT_FOUND. */
  char args[200];
  snprintf(args, sizeof args, "delete %s", e.id);
  r = cli_ok_(&e, args);
  char said[120];
  snprintf(said, sizeof said, "deleted %s (", e.id);
  ck_assert_msg(strncmp(r.out, said, strlen(said)) == 0, "%s", r.out);
  cli_free(&r);
  expect_refusal(&e, 1, "no spec with id", args);
  snprintf(args, sizeof args, "describe %s", e.id);
  expect_refusal(&e, 1, "NOT_FOUND", args);

  /* Refusals. */
  expect_refusal(
      &e, 1, "no blob with id",
      "get-blob "
      "0000000000000000000000000000000000000000000000000000000000000000");
  expect_refusal(&e, 2, "is not an id", "delete xyz");
  expect_refusal(&e, 2, "is not an id", "get-blob xyz");
  snprintf(args, sizeof args, "get-blob %s --out x.txt", one);
  expect_refusal(&e, 2, "must end in", args);
  snprintf(args, sizeof args, "put-blob '%s'", path_in(&e, "missing.npy"));
  expect_refusal(&e, 2, "missing.npy", args);
  snprintf(args, sizeof args, "get-blob %s --feed x=y.npy", one);
  expect_refusal(&e, 2, "does not apply", args);
  topos_params_free(p);
  env_down(&e);
}
END_TEST

Suite *cli_run_suite(void) {
  Suite *s = suite_create("cli_run");
  TCase *tc = tcase_create("cli_run");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_forward_bits);
  tcase_add_test(tc, test_step_chain_bits);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_blobs_and_delete);
  suite_add_tcase(s, tc);
  return s;
}
