/*
 * test_client.c - libtoposclient, the topos CLI and the remote examples
 * against a real toposd.
 *
 * Each test case starts $TOPOS_BUILD/bin/toposd (default build/) on an
 * ephemeral loopback port with a temporary SQLite store, once, in the
 * runner (an unchecked fixture), and every test talks to it through the
 * C client: every RPC is driven and its results compared bit for bit with
 * the in-process engine (describe text, plan text and peak bytes, emitted
 * modules, forward values, gradients, optimizer steps and state), errors
 * are checked for their code and status, one client is shared by 16
 * threads, both examples run in-process and remote with bit-identical
 * final parameters, the CLI runs every command, and a Python client
 * generated from proto/topos.proto (tests/python/test_client.py, run with
 * /usr/bin/python3) records and steps a spec and must reproduce the C
 * client's numbers.  Tests run from the repository root (make test).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sample_nets.h"
#include "testutil.h"
#include "topos.h"
#include "topos.pb-c.h"
#include "topos_client.h"

/* ------------------------------------------------------------ the daemon */

static struct {
  pid_t pid;
  char dir[256];
  char log[320];
  char address[64];
} daemon_;

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b && *b ? b : "build";
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The daemon's --stream-read-ahead (NULL: its default). */
static const char *read_ahead_flag;

static void daemon_up(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(daemon_.dir, sizeof daemon_.dir, "%s/topos-client-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(daemon_.dir));
  char store[320], bin[512];
  snprintf(store, sizeof store, "%s/topos.db", daemon_.dir);
  snprintf(daemon_.log, sizeof daemon_.log, "%s/toposd.log", daemon_.dir);
  snprintf(bin, sizeof bin, "%s/bin/toposd", build_dir());
  ck_assert_msg(access(bin, X_OK) == 0, "%s is not built", bin);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    int log = open(daemon_.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) dup2(log, STDERR_FILENO);
    /* flip-test joins no chain unless named: the conformance tests ask
     * for it to see a row turn red. */
    execl(bin, bin, "--listen", "127.0.0.1:0", "--http", "off", "--store",
          store, "--test-backend", "flip-test",
          read_ahead_flag ? "--stream-read-ahead" : (char *)NULL,
          read_ahead_flag, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  daemon_.pid = pid;
  char line[256] = {0};
  size_t len = 0;
  double until = now_s() + 60;
  while (len < sizeof line - 1 && !strchr(line, '\n') && now_s() < until) {
    struct pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fds[0], line + len, sizeof line - 1 - len);
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fds[0]);
  const char *prefix = "toposd listening on ";
  ck_assert_msg(strncmp(line, prefix, strlen(prefix)) == 0,
                "toposd did not start (stdout '%s', log %s)", line,
                daemon_.log);
  snprintf(daemon_.address, sizeof daemon_.address, "%.*s",
           (int)strcspn(line + strlen(prefix), "\r\n"), line + strlen(prefix));
}

static void daemon_down(void) {
  if (daemon_.pid > 0) {
    kill(daemon_.pid, SIGTERM);
    int status = 0;
    double until = now_s() + 30;
    while (waitpid(daemon_.pid, &status, WNOHANG) == 0) {
      if (now_s() > until) {
        kill(daemon_.pid, SIGKILL);
        waitpid(daemon_.pid, &status, 0);
        break;
      }
      usleep(10000);
    }
    daemon_.pid = 0;
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", daemon_.dir);
  if (system(cmd) != 0)
    fprintf(stderr, "test_client: cannot remove %s\n", daemon_.dir);
}

/* A daemon that reads every Train stream's next message while a step runs
 * (--stream-read-ahead always), so a reply can be held behind the one in
 * flight and a stream's end can wait for it. */
static void daemon_up_reading_ahead(void) {
  read_ahead_flag = "always";
  daemon_up();
}

static void daemon_down_reading_ahead(void) {
  daemon_down();
  read_ahead_flag = NULL;
}

static topos_client *connect_daemon(void) {
  topos_error err = {0};
  topos_client *c = topos_client_connect(daemon_.address, &err);
  ck_assert_msg(c != NULL, "connect %s: %s", daemon_.address, err.message);
  return c;
}

static void record(topos_client *c, const topos_network *net, char id[65]) {
  topos_error err = {0};
  ck_assert_msg(topos_client_record(c, net, id, &err) == TOPOS_OK, "record: %s",
                err.message);
}

/* ------------------------------------------------------------ commands */

/* Runs a shell command; returns its stdout (new) and exit status, and its
 * stderr in *errout when not NULL (new). */
static char *run_cmd(const char *cmd, int *status, char **errout) {
  char errpath[320], full[4096];
  snprintf(errpath, sizeof errpath, "%s/stderr.txt", daemon_.dir);
  snprintf(full, sizeof full, "%s 2>'%s'", cmd, errpath);
  FILE *p = popen(full, "r");
  ck_assert_msg(p != NULL, "cannot run %s", cmd);
  size_t len = 0, cap = 1 << 14;
  char *out = malloc(cap);
  size_t got;
  while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 4096) out = realloc(out, cap *= 2);
  }
  out[len] = '\0';
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (errout) {
    FILE *f = fopen(errpath, "r");
    char *e = calloc(1, 1 << 14);
    if (f) {
      size_t n = fread(e, 1, (1 << 14) - 1, f);
      e[n] = '\0';
      fclose(f);
    }
    *errout = e;
  }
  return out;
}

static bool files_equal(const char *a, const char *b, long *size) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  bool same = fa && fb;
  long n = 0;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = false;
    if (ca == EOF || cb == EOF) break;
    n++;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  *size = n;
  return same;
}

/* ------------------------------------------------------------ health */

START_TEST(test_health_and_stats) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  char status[32], version[64];
  ck_assert_msg(topos_client_health(c, status, version, &err) == TOPOS_OK, "%s",
                err.message);
  ck_assert_str_eq(status, "serving");
  ck_assert_msg(version[0] != '\0', "no version");
  topos_client_stats_info a, b;
  ck_assert_int_eq(topos_client_stats(c, &a, &err), TOPOS_OK);
  ck_assert_int_ge(a.workers, 1);
  ck_assert_int_ge(a.queue_capacity, 1);
  ck_assert_int_ge(a.queue_depth, 0);
  ck_assert_int_eq(topos_client_health(c, NULL, NULL, &err), TOPOS_OK);
  ck_assert_int_eq(topos_client_stats(c, &b, &err), TOPOS_OK);
  ck_assert_int_ge(b.requests, a.requests + 1);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ specs */

START_TEST(test_record_and_describe) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_client_stats_info before, after;
  ck_assert_int_eq(topos_client_stats(c, &before, &err), TOPOS_OK);
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char id[65], again[65], local[65];
    record(c, net, id);
    ck_assert_int_eq(topos_network_id(net, local, NULL), TOPOS_OK);
    ck_assert_msg(strcmp(id, local) == 0, "%s: daemon id %s, local %s",
                  sn_samples[s].name, id, local);
    record(c, net, again); /* idempotent */
    ck_assert_str_eq(id, again);
    for (int f = TOPOS_FORMAT_TEXT; f <= TOPOS_FORMAT_DOT; f++) {
      char *remote = NULL;
      ck_assert_msg(topos_client_describe(c, id, (topos_format)f, &remote,
                                          &err) == TOPOS_OK,
                    "describe: %s", err.message);
      char *mine = topos_network_describe(net, (topos_format)f, NULL);
      ck_assert_msg(strcmp(remote, mine) == 0, "%s format %d differs",
                    sn_samples[s].name, f);
      topos_free(remote);
      topos_free(mine);
    }
    topos_network_release(net);
  }
  ck_assert_int_eq(topos_client_stats(c, &after, &err), TOPOS_OK);
  ck_assert_int_ge(after.specs, SN_NSAMPLES);
  ck_assert_int_ge(after.spec_bytes, before.spec_bytes);
  topos_client_close(c);
}
END_TEST

/* The value the samples end in: "loss", or "total" for every_op. */
static topos_value sample_root(const topos_network *net) {
  topos_value v = topos_network_find(net, "loss");
  return topos_value_ok(v) ? v : topos_network_find(net, "total");
}

START_TEST(test_lower_and_emit) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char id[65];
    record(c, net, id);
    topos_value roots[1] = {sample_root(net)};
    topos_value obs[1] = {topos_network_parameter(net, 0)};
    for (int posture = 0; posture < 2; posture++) {
      topos_entry e = {
          roots, 1, obs, 1, (topos_posture)posture, TOPOS_NUMERICS_EXACT};
      topos_plan *plan = topos_network_lower(net, &e, &err);
      ck_assert_msg(plan != NULL, "%s", err.message);
      char *text = NULL;
      int64_t peak = -1;
      int groups = -1;
      ck_assert_msg(topos_client_lower(c, id, &e, &text, &peak, &groups,
                                       &err) == TOPOS_OK,
                    "lower %s: %s", sn_samples[s].name, err.message);
      char *mine = topos_plan_describe(plan, NULL);
      ck_assert_msg(strcmp(text, mine) == 0, "%s: plan text differs",
                    sn_samples[s].name);
      ck_assert_int_eq(peak, (int64_t)topos_plan_peak_bytes(plan));
      ck_assert_int_eq(groups, topos_plan_group_count(plan));
      topos_free(text);
      topos_free(mine);
      for (int form = 0; form < 2; form++) {
        char *module = NULL;
        ck_assert_msg(topos_client_emit(c, id, &e, (topos_emit_form)form,
                                        &module, &err) == TOPOS_OK,
                      "emit %s: %s", sn_samples[s].name, err.message);
        char *local =
            topos_plan_emit_stablehlo(plan, (topos_emit_form)form, NULL);
        ck_assert_ptr_nonnull(local);
        ck_assert_msg(strcmp(module, local) == 0, "%s: module differs",
                      sn_samples[s].name);
        ck_assert_ptr_nonnull(strstr(module, "func.func @main"));
        topos_free(module);
        topos_free(local);
      }
      topos_plan_free(plan);
    }
    topos_network_release(net);
  }
  /* The conv sample fuses: the plan says so remotely too. */
  topos_network *conv = sn_conv();
  char id[65];
  record(c, conv, id);
  topos_value root[1] = {topos_network_find(conv, "loss")};
  topos_entry e = {
      root, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  int groups = 0;
  ck_assert_int_eq(topos_client_lower(c, id, &e, NULL, NULL, &groups, &err),
                   TOPOS_OK);
  ck_assert_int_gt(groups, 0);
  topos_network_release(conv);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ execution */

/* Parameters equal to the initials perturbed by a seeded amount. */
static topos_params *perturbed(const topos_network *net, uint64_t seed) {
  topos_params *p = topos_network_parameters(net);
  for (int s = 0; s < topos_params_count(p); s++) {
    const topos_tensor *t = topos_params_get(p, s);
    topos_tensor *r = tt_random(topos_tensor_dtype(t), topos_tensor_rank(t),
                                topos_tensor_shape(t), seed + s, -0.5, 0.5);
    topos_params *q = topos_params_with(p, s, r, NULL);
    topos_tensor_release(r);
    topos_params_free(p);
    p = q;
  }
  return p;
}

/* Feeds for every float input: a seeded tensor of the default's shape. */
static int float_feeds(const topos_network *net, uint64_t seed,
                       topos_feed *feeds, int cap) {
  int n = 0;
  for (int i = 0; i < topos_network_input_count(net) && n < cap; i++) {
    topos_value v = topos_network_input(net, i);
    topos_dtype dt = topos_network_value_dtype(net, v);
    if (dt == TOPOS_I32) continue;
    int rank = 0;
    const int64_t *shape = topos_network_value_shape(net, v, &rank);
    feeds[n].input = v;
    feeds[n].tensor = tt_random(dt, rank, shape, seed + i, -1, 1);
    n++;
  }
  return n;
}

static void free_feeds(topos_feed *feeds, int n) {
  for (int i = 0; i < n; i++)
    topos_tensor_release((topos_tensor *)feeds[i].tensor);
}

START_TEST(test_forward_bits) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char id[65];
    record(c, net, id);
    topos_value roots[2] = {sample_root(net), topos_network_parameter(net, 0)};
    int n = topos_network_node_count(net);
    topos_value obs[2] = {topos_network_input(net, 0), roots[0]};
    obs[1].index = n / 2; /* some interior node */
    topos_entry e = {
        roots, 2, obs, 2, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
    for (int variant = 0; variant < 2; variant++) {
      topos_params *p = variant ? perturbed(net, 40 + s) : NULL;
      topos_feed feeds[4];
      int nf = variant ? float_feeds(net, 50 + s, feeds, 4) : 0;
      topos_tensor **rr = NULL, **oo = NULL;
      ck_assert_msg(topos_client_forward(c, id, &e, p, feeds, nf, &rr, &oo,
                                         &err) == TOPOS_OK,
                    "forward %s: %s", sn_samples[s].name, err.message);
      topos_run *run = topos_forward(net, p, feeds, nf, NULL, &err);
      ck_assert_msg(run != NULL, "%s", err.message);
      for (int k = 0; k < 2; k++) {
        ck_assert_msg(topos_tensor_bitwise_equal(
                          rr[k], topos_run_of(run, roots[k], NULL)),
                      "%s variant %d root %d differs", sn_samples[s].name,
                      variant, k);
        ck_assert_msg(
            topos_tensor_bitwise_equal(oo[k], topos_run_of(run, obs[k], NULL)),
            "%s variant %d observe %d differs", sn_samples[s].name, variant, k);
      }
      topos_client_tensors_free(rr, 2);
      topos_client_tensors_free(oo, 2);
      topos_run_free(run);
      free_feeds(feeds, nf);
      topos_params_free(p);
    }
    topos_network_release(net);
  }
  topos_client_close(c);
}
END_TEST

START_TEST(test_backward_bits) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char id[65];
    record(c, net, id);
    topos_value loss = sample_root(net);
    topos_params *p = perturbed(net, 7 + s);
    topos_feed feeds[4];
    int nf = float_feeds(net, 9 + s, feeds, 4);
    double rl = NAN;
    topos_params *rg = NULL;
    ck_assert_msg(topos_client_backward(c, id, loss, p, feeds, nf, &rl, &rg,
                                        &err) == TOPOS_OK,
                  "backward %s: %s", sn_samples[s].name, err.message);
    topos_run *run = topos_forward(net, p, feeds, nf, NULL, &err);
    topos_field *f = topos_backward(run, loss, NULL, &err);
    topos_params *g = topos_parameters_of(f, &err);
    double l = topos_run_scalar(run, loss, &err);
    ck_assert_msg(memcmp(&l, &rl, sizeof l) == 0, "%s: loss %.17g vs %.17g",
                  sn_samples[s].name, rl, l);
    ck_assert_msg(topos_params_bitwise_equal(g, rg), "%s: gradients differ",
                  sn_samples[s].name);
    topos_params_free(g);
    topos_params_free(rg);
    topos_field_free(f);
    topos_run_free(run);
    free_feeds(feeds, nf);
    topos_params_free(p);
    topos_network_release(net);
  }
  topos_client_close(c);
}
END_TEST

static bool decay_even(int slot, const topos_tensor *param, void *ctx) {
  return slot % 2 == 0;
}

/* Runs `steps` remote and in-process steps side by side and asserts the
 * parameters, the state and the loss stay bit-identical. */
static void check_steps(topos_client *c, const topos_optimizer *opt,
                        int steps) {
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  topos_params *pl = topos_network_parameters(net);
  topos_params *pr = topos_network_parameters(net);
  topos_opt_state *sl = topos_opt_state_new(opt, pl, &err);
  topos_opt_state *sr = NULL; /* the first remote step: a fresh state */
  ck_assert_ptr_nonnull(sl);
  for (int k = 0; k < steps; k++) {
    topos_feed feeds[2];
    int nf = float_feeds(net, 100 + k, feeds, 2);
    /* In-process. */
    topos_run *run = topos_forward(net, pl, feeds, nf, NULL, &err);
    topos_field *f = topos_backward(run, loss, NULL, &err);
    topos_params *g = topos_parameters_of(f, &err);
    double ll = topos_run_scalar(run, loss, &err);
    topos_params *pl2 = NULL;
    topos_opt_state *sl2 = NULL;
    ck_assert_msg(
        topos_optimizer_step(opt, pl, g, sl, &pl2, &sl2, &err) == TOPOS_OK,
        "%s", err.message);
    /* Remote. */
    topos_params *pr2 = NULL;
    topos_opt_state *sr2 = NULL;
    double lr = NAN;
    ck_assert_msg(topos_client_step(c, id, loss, pr, feeds, nf, opt, sr, &pr2,
                                    &sr2, &lr, &err) == TOPOS_OK,
                  "step %d: %s", k, err.message);
    ck_assert_msg(memcmp(&ll, &lr, sizeof ll) == 0,
                  "kind %d step %d: loss %.17g vs %.17g", opt->kind, k, lr, ll);
    ck_assert_msg(topos_params_bitwise_equal(pl2, pr2),
                  "kind %d step %d: parameters differ", opt->kind, k);
    ck_assert_int_eq(topos_opt_state_step(sl2), topos_opt_state_step(sr2));
    for (int m = 0; m < 2; m++) {
      const topos_params *a = topos_opt_state_moment(sl2, m);
      const topos_params *b = topos_opt_state_moment(sr2, m);
      ck_assert_msg((a == NULL) == (b == NULL), "moment %d presence", m);
      if (a)
        ck_assert_msg(topos_params_bitwise_equal(a, b),
                      "kind %d step %d: moment %d differs", opt->kind, k, m);
    }
    topos_params_free(pl);
    topos_params_free(pr);
    topos_opt_state_free(sl);
    topos_opt_state_free(sr);
    pl = pl2;
    pr = pr2;
    sl = sl2;
    sr = sr2;
    topos_params_free(g);
    topos_field_free(f);
    topos_run_free(run);
    free_feeds(feeds, nf);
  }
  topos_params_free(pl);
  topos_params_free(pr);
  topos_opt_state_free(sl);
  topos_opt_state_free(sr);
  topos_network_release(net);
}

START_TEST(test_step_bits) {
  topos_client *c = connect_daemon();
  topos_optimizer sgd = topos_sgd(0.1, 0.0);
  check_steps(c, &sgd, 5);
  topos_optimizer momentum = topos_sgd(0.05, 0.9);
  momentum.weight_decay = 1e-3;
  check_steps(c, &momentum, 5);
  topos_optimizer adam = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  check_steps(c, &adam, 5);
  topos_optimizer adamw = topos_adamw(1e-2, 0.9, 0.999, 1e-8, 0.1);
  check_steps(c, &adamw, 5);
  topos_optimizer custom = topos_adamw(1e-2, 0.8, 0.99, 1e-6, 0.3);
  custom.decay = decay_even;
  check_steps(c, &custom, 4);
  topos_client_close(c);
}
END_TEST

/* One loop, two trainers: topos_trainer_local and topos_client_trainer
 * over the same network take `steps` steps side by side and must agree
 * bit for bit on the loss, the parameters and the state after each.  The
 * first step passes NULL parameters and state (the initials, a fresh
 * state) unless a custom decay predicate needs the parameters here. */
static void check_trainers(topos_client *c, const topos_network *net,
                           const topos_optimizer *opt, const topos_exec *exec,
                           int steps, const char *what) {
  topos_error err = {0};
  char id[65];
  record(c, net, id);
  topos_value loss = sample_root(net);
  topos_trainer *local = topos_trainer_local(net, loss, NULL, 0, exec, &err);
  ck_assert_msg(local != NULL, "%s: %s", what, err.message);
  topos_trainer *remote = topos_client_trainer(c, id, loss, exec, &err);
  ck_assert_msg(remote != NULL, "%s: %s", what, err.message);
  ck_assert_str_eq(topos_trainer_kind(remote), "remote");
  topos_params *first = opt->decay ? topos_network_parameters(net) : NULL;
  topos_step_result a = {0}, b = {0};
  for (int k = 0; k < steps; k++) {
    topos_feed feeds[4];
    int nf = float_feeds(net, 200 + k, feeds, 4);
    topos_step_result na, nb;
    const topos_params *pa = k ? a.params : first, *pb = k ? b.params : first;
    ck_assert_msg(topos_trainer_step(local, pa, feeds, nf, opt, a.state, &na,
                                     &err) == TOPOS_OK,
                  "%s step %d local: %s", what, k, err.message);
    ck_assert_msg(topos_trainer_step(remote, pb, feeds, nf, opt, b.state, &nb,
                                     &err) == TOPOS_OK,
                  "%s step %d remote: %s", what, k, err.message);
    ck_assert_msg(memcmp(&na.loss, &nb.loss, sizeof na.loss) == 0,
                  "%s step %d: loss %.17g vs %.17g", what, k, na.loss, nb.loss);
    ck_assert_msg(topos_params_bitwise_equal(na.params, nb.params),
                  "%s step %d: parameters differ", what, k);
    ck_assert_int_eq(topos_opt_state_step(na.state), k + 1);
    ck_assert_int_eq(topos_opt_state_step(nb.state), k + 1);
    for (int m = 0; m < 2; m++) {
      const topos_params *x = topos_opt_state_moment(na.state, m);
      const topos_params *y = topos_opt_state_moment(nb.state, m);
      ck_assert_msg((x == NULL) == (y == NULL), "%s: moment %d presence", what,
                    m);
      if (x)
        ck_assert_msg(topos_params_bitwise_equal(x, y),
                      "%s step %d: moment %d differs", what, k, m);
    }
    /* The remote trainer keeps no run. */
    ck_assert_ptr_null(nb.run);
    ck_assert_int_eq(nb.nobserves, 0);
    topos_step_result_clear(&a);
    topos_step_result_clear(&b);
    a = na;
    b = nb;
    free_feeds(feeds, nf);
  }
  topos_params *p0 = topos_network_parameters(net);
  ck_assert_msg(!topos_params_bitwise_equal(p0, b.params), "%s: nothing moved",
                what);
  topos_params_free(p0);
  topos_params_free(first);
  topos_step_result_clear(&a);
  topos_step_result_clear(&b);
  topos_trainer_free(remote);
  topos_trainer_free(local);
}

static bool cancel_now(void *ctx) {
  return true;
}

/* SGD, SGD with momentum and weight decay, Adam, AdamW, and AdamW with a
 * custom decay predicate. */
static void five_optimizers(topos_optimizer opts[5]) {
  opts[0] = topos_sgd(0.1, 0.0);
  opts[1] = topos_sgd(0.05, 0.9);
  opts[1].weight_decay = 1e-3;
  opts[2] = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  opts[3] = topos_adamw(1e-2, 0.9, 0.999, 1e-8, 0.1);
  opts[4] = topos_adamw(1e-2, 0.8, 0.99, 1e-6, 0.3);
  opts[4].decay = decay_even;
}

START_TEST(test_trainer_bits) {
  topos_client *c = connect_daemon();
  topos_optimizer opts[5];
  five_optimizers(opts);
  /* f64 (the MLP) and f32 (conv + pool, fused on both sides). */
  sn_builder nets[2] = {sn_mlp, sn_conv};
  const topos_exec reference = {.backend = "reference"};
  for (int n = 0; n < 2; n++) {
    topos_network *net = nets[n]();
    for (int o = 0; o < 5; o++) {
      char what[64];
      snprintf(what, sizeof what, "net %d optimizer %d", n, o);
      check_trainers(c, net, &opts[o], o == 2 ? &reference : NULL, 4, what);
    }
    topos_network_release(net);
  }

  /* Errors: before anything is sent, and the daemon's, both leaving the
   * result zero. */
  topos_error err = {0};
  topos_network *net = sn_gradient_descent();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  ck_assert_ptr_null(topos_client_trainer(NULL, id, loss, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(topos_client_trainer(c, "xyz", loss, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(topos_client_trainer(c, id, TOPOS_NONE, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  topos_trainer *tr = topos_client_trainer(c, id, loss, NULL, &err);
  ck_assert_ptr_nonnull(tr);
  topos_optimizer neg = topos_sgd(-1, 0);
  topos_step_result r;
  memset(&err, 0, sizeof err);
  ck_assert_int_eq(topos_trainer_step(tr, NULL, NULL, 0, &neg, NULL, &r, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  ck_assert_ptr_null(r.params);
  ck_assert_ptr_null(r.state);
  topos_trainer_free(tr);
  /* What of the context stays here: a passed deadline and a cancel. */
  topos_exec late = {.deadline_ns = 1};
  tr = topos_client_trainer(c, id, loss, &late, &err);
  ck_assert_ptr_nonnull(tr);
  topos_optimizer sgd = topos_sgd(0.02, 0);
  ck_assert_int_eq(topos_trainer_step(tr, NULL, NULL, 0, &sgd, NULL, &r, &err),
                   TOPOS_ERR_DEADLINE);
  ck_assert_ptr_null(r.params);
  topos_trainer_free(tr);
  topos_exec stop = {.cancel = cancel_now};
  tr = topos_client_trainer(c, id, loss, &stop, &err);
  ck_assert_int_eq(topos_trainer_step(tr, NULL, NULL, 0, &sgd, NULL, &r, &err),
                   TOPOS_ERR_CANCELLED);
  topos_trainer_free(tr);
  /* A deadline far ahead lets the step through. */
  topos_exec later = {.deadline_ns = topos_now_ns() + 60 * 1000000000LL};
  tr = topos_client_trainer(c, id, loss, &later, &err);
  ck_assert_msg(
      topos_trainer_step(tr, NULL, NULL, 0, &sgd, NULL, &r, &err) == TOPOS_OK,
      "%s", err.message);
  ck_assert_ptr_nonnull(r.params);
  topos_step_result_clear(&r);
  topos_trainer_free(tr);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ blobs */

START_TEST(test_blobs) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65], blob[65], again[65];
  record(c, net, id);
  topos_params *p = perturbed(net, 77);
  int64_t bytes = 0;
  ck_assert_msg(topos_client_put_blob(c, p, blob, &bytes, &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert_int_gt(bytes, 0);
  ck_assert_int_eq(topos_client_put_blob(c, p, again, NULL, &err), TOPOS_OK);
  ck_assert_str_eq(blob, again); /* content-addressed */
  bool present = false;
  int64_t size = 0;
  ck_assert_int_eq(topos_client_stat_blob(c, blob, &present, &size, &err),
                   TOPOS_OK);
  ck_assert(present);
  ck_assert_int_eq(size, bytes);
  char unknown[65];
  memset(unknown, 'e', 64);
  unknown[64] = '\0';
  ck_assert_int_eq(topos_client_stat_blob(c, unknown, &present, &size, &err),
                   TOPOS_OK);
  ck_assert(!present);

  /* Referencing the blob gives what sending the tensors gives. */
  topos_value loss = topos_network_find(net, "loss");
  int n = topos_params_count(p);
  topos_client_args by_ref = {.params_blob = blob, .nparams_blob = n};
  double l1 = NAN, l2 = NAN;
  topos_params *g1 = NULL, *g2 = NULL;
  ck_assert_msg(topos_client_backward_with(c, id, loss, &by_ref, &l1, &g1,
                                           &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert_int_eq(
      topos_client_backward(c, id, loss, p, NULL, 0, &l2, &g2, &err), TOPOS_OK);
  ck_assert(memcmp(&l1, &l2, sizeof l1) == 0);
  ck_assert(topos_params_bitwise_equal(g1, g2));
  topos_params_free(g1);
  topos_params_free(g2);
  topos_value roots[1] = {loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_tensor **rr = NULL;
  ck_assert_int_eq(
      topos_client_forward_with(c, id, &e, &by_ref, &rr, NULL, &err), TOPOS_OK);
  ck_assert(topos_tensor_get(rr[0], NULL, NULL) == l1);
  topos_client_tensors_free(rr, 1);
  topos_opt_state *st = NULL;
  topos_params *stepped = NULL;
  topos_optimizer sgd = topos_sgd(0.1, 0);
  ck_assert_int_eq(topos_client_step_with(c, id, loss, &by_ref, &sgd, NULL,
                                          &stepped, &st, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_params_count(stepped), n);
  topos_params_free(stepped);
  topos_opt_state_free(st);
  topos_conformance *res = NULL;
  ck_assert_int_eq(topos_client_conformance(c, id, &e, &by_ref, &res, &err),
                   TOPOS_OK);
  ck_assert_int_gt(res->nrows, 0);
  topos_conformance_free(res);

  /* An unknown blob is NOT_FOUND; an index past the blob's end and both
   * params and a blob are argument errors. */
  topos_client_args missing = {.params_blob = unknown, .nparams_blob = n};
  ck_assert_int_eq(
      topos_client_backward_with(c, id, loss, &missing, NULL, NULL, &err),
      TOPOS_ERR_NOT_FOUND);
  topos_client_args past = {.params_blob = blob, .nparams_blob = n + 1};
  ck_assert_int_ne(
      topos_client_backward_with(c, id, loss, &past, NULL, NULL, &err),
      TOPOS_OK);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  topos_client_args both = {
      .params = p, .params_blob = blob, .nparams_blob = n};
  ck_assert_int_eq(
      topos_client_backward_with(c, id, loss, &both, NULL, NULL, &err),
      TOPOS_ERR_ARGUMENT);
  topos_params_free(p);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

START_TEST(test_large_tensors) {
  /* Tensors past the packer's 64 KiB threshold travel as slices of their
   * own: inline parameters, a large feed, large gradients and a blob. */
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *w0 = tt_random(TOPOS_F32, 2, SN_S(256, 256), 5, -1, 1);
  topos_tensor *b0 = tt_random(TOPOS_F32, 1, SN_S(256), 6, -1, 1);
  topos_tensor *x0 = tt_random(TOPOS_F32, 2, SN_S(128, 256), 7, -1, 1);
  topos_value w = topos_parameter(tape, w0);
  topos_value b = topos_parameter(tape, b0);
  topos_value x = topos_input(tape, x0);
  topos_value y = topos_tanh(tape, topos_linear(tape, x, w, b));
  topos_value loss =
      topos_name(tape, topos_sum(tape, topos_mul(tape, y, y)), "loss");
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  char id[65], blob[65];
  record(c, net, id);
  topos_params *p = perturbed(net, 3);
  topos_tensor *xf = tt_random(TOPOS_F32, 2, SN_S(128, 256), 8, -1, 1);
  topos_feed feeds[1] = {{x, xf}};

  topos_run *run = topos_forward(net, p, feeds, 1, NULL, &err);
  topos_field *f = topos_backward(run, loss, NULL, &err);
  topos_params *g = topos_parameters_of(f, &err);
  double l = topos_run_scalar(run, loss, &err);
  double rl = NAN;
  topos_params *rg = NULL;
  ck_assert_msg(topos_client_backward(c, id, loss, p, feeds, 1, &rl, &rg,
                                      &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert(memcmp(&l, &rl, sizeof l) == 0);
  ck_assert(topos_params_bitwise_equal(g, rg));
  topos_params_free(rg);
  rg = NULL;
  ck_assert_int_eq(topos_client_put_blob(c, p, blob, NULL, &err), TOPOS_OK);
  topos_client_args by_ref = {
      .params_blob = blob, .nparams_blob = 2, .feeds = feeds, .nfeeds = 1};
  ck_assert_int_eq(
      topos_client_backward_with(c, id, loss, &by_ref, &rl, &rg, &err),
      TOPOS_OK);
  ck_assert(memcmp(&l, &rl, sizeof l) == 0);
  ck_assert(topos_params_bitwise_equal(g, rg));
  topos_params_free(rg);

  topos_optimizer adam = topos_adam(1e-3, 0.9, 0.999, 1e-8);
  topos_opt_state *s0 = topos_opt_state_new(&adam, p, &err);
  topos_params *pl = NULL, *pr = NULL;
  topos_opt_state *sl = NULL, *sr = NULL;
  ck_assert_int_eq(topos_optimizer_step(&adam, p, g, s0, &pl, &sl, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_client_step(c, id, loss, p, feeds, 1, &adam, s0, &pr,
                                     &sr, NULL, &err),
                   TOPOS_OK);
  ck_assert(topos_params_bitwise_equal(pl, pr));
  ck_assert(topos_params_bitwise_equal(topos_opt_state_moment(sl, 1),
                                       topos_opt_state_moment(sr, 1)));
  topos_params_free(pl);
  topos_params_free(pr);
  topos_opt_state_free(sl);
  topos_opt_state_free(sr);
  topos_opt_state_free(s0);
  topos_params_free(g);
  topos_field_free(f);
  topos_run_free(run);
  topos_tensor_release(xf);
  topos_params_free(p);
  topos_tensor_release(w0);
  topos_tensor_release(b0);
  topos_tensor_release(x0);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ conformance */

START_TEST(test_conformance) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char id[65];
    record(c, net, id);
    topos_value roots[1] = {sample_root(net)};
    for (int posture = 0; posture < 2; posture++) {
      topos_entry e = {
          roots, 1, NULL, 0, (topos_posture)posture, TOPOS_NUMERICS_EXACT};
      topos_conformance *res = NULL;
      ck_assert_msg(
          topos_client_conformance(c, id, &e, NULL, &res, &err) == TOPOS_OK,
          "%s", err.message);
      ck_assert_int_gt(res->nrows, 0);
      for (int i = 0; i < res->nrows; i++) {
        const topos_conformance_row *row = &res->rows[i];
        ck_assert_msg(row->backend[0] != '\0', "a backend without a name");
        ck_assert_msg(row->holds && row->bit_identical,
                      "%s on %s: max ulp %g (%s)", sn_samples[s].name,
                      row->backend, row->max_ulp, row->note);
      }
      topos_conformance_free(res);
    }
    topos_network_release(net);
  }
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ errors */

/* topos_entry.threads through the client: the same Forward at 1 and 4
 * threads gives the same bits (the engine's), Lower names the count, a
 * negative count never leaves the client, 5000 is the daemon's
 * INVALID_ARGUMENT and it keeps serving. */
START_TEST(test_entry_threads) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65];
  record(c, net, id);
  topos_value roots[1] = {topos_network_find(net, "loss")};
  topos_value obs[1] = {topos_network_parameter(net, 0)};
  obs[0].index = topos_network_node_count(net) / 2;
  topos_run *ref = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(ref);
  topos_tensor **first[2] = {NULL, NULL};
  const int counts[2] = {1, 4};
  for (int i = 0; i < 2; i++) {
    topos_entry e = {.roots = roots,
                     .nroots = 1,
                     .observes = obs,
                     .nobserves = 1,
                     .threads = counts[i]};
    topos_tensor **rr = NULL, **oo = NULL;
    ck_assert_msg(topos_client_forward(c, id, &e, NULL, NULL, 0, &rr, &oo,
                                       &err) == TOPOS_OK,
                  "threads %d: %s", counts[i], err.message);
    ck_assert(
        topos_tensor_bitwise_equal(rr[0], topos_run_of(ref, roots[0], NULL)));
    ck_assert(
        topos_tensor_bitwise_equal(oo[0], topos_run_of(ref, obs[0], NULL)));
    if (i == 0) {
      first[0] = rr;
      first[1] = oo;
    } else {
      ck_assert(topos_tensor_bitwise_equal(rr[0], first[0][0]));
      ck_assert(topos_tensor_bitwise_equal(oo[0], first[1][0]));
      topos_client_tensors_free(rr, 1);
      topos_client_tensors_free(oo, 1);
    }
    char *text = NULL;
    ck_assert_int_eq(topos_client_lower(c, id, &e, &text, NULL, NULL, &err),
                     TOPOS_OK);
    char want[32];
    snprintf(want, sizeof want, ", threads %d;", counts[i]);
    ck_assert_msg(strstr(text, want) != NULL, "%s", text);
    topos_free(text);
  }
  topos_client_tensors_free(first[0], 1);
  topos_client_tensors_free(first[1], 1);
  topos_entry e = {.roots = roots, .nroots = 1, .threads = -1};
  char *text = NULL;
  ck_assert_int_eq(topos_client_lower(c, id, &e, &text, NULL, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(text);
  ck_assert_ptr_nonnull(strstr(err.message, "threads -1"));
  e.threads = 5000;
  topos_tensor **rr = NULL;
  ck_assert_int_eq(
      topos_client_forward(c, id, &e, NULL, NULL, 0, &rr, NULL, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  ck_assert_msg(strstr(err.message, "INVALID_ARGUMENT") != NULL &&
                    strstr(err.message, "threads 5000") != NULL,
                "%s", err.message);
  char status[32];
  ck_assert_int_eq(topos_client_health(c, status, NULL, &err), TOPOS_OK);
  ck_assert_str_eq(status, "serving");
  topos_run_free(ref);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

START_TEST(test_errors) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_gradient_descent();
  char id[65];
  record(c, net, id);
  char unknown[65];
  memset(unknown, '0', 64);
  unknown[64] = '\0';
  char *text = NULL;

  /* Unknown id: NOT_FOUND with the daemon's message. */
  ck_assert_int_eq(
      topos_client_describe(c, unknown, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_ERR_NOT_FOUND);
  ck_assert_ptr_null(text);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 5);
  ck_assert_msg(strncmp(err.message, "NOT_FOUND: ", 11) == 0, "%s",
                err.message);
  /* A malformed id never leaves the client. */
  ck_assert_int_eq(
      topos_client_describe(c, "xyz", TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "64 lowercase hex"));

  /* A feed of the wrong shape: the engine's exact code and message. */
  topos_value loss = topos_network_find(net, "loss");
  topos_tensor *bad = topos_tensor_zeros(TOPOS_F64, 1, SN_S(3), NULL);
  topos_feed feeds[1] = {{topos_network_find(net, "x"), bad}};
  ck_assert_int_ne(
      topos_client_backward(c, id, loss, NULL, feeds, 1, NULL, NULL, &err),
      TOPOS_OK);
  ck_assert_msg(err.code > TOPOS_OK && err.code < TOPOS_CLIENT_GRPC_BASE,
                "code %d: %s", err.code, err.message);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  ck_assert_msg(strncmp(err.message, "INVALID_ARGUMENT: ", 18) == 0, "%s",
                err.message);
  topos_tensor_release(bad);
  /* A loss that is not a node of the spec. */
  topos_value nowhere = loss;
  nowhere.index = 1000;
  ck_assert_int_ne(
      topos_client_backward(c, id, nowhere, NULL, NULL, 0, NULL, NULL, &err),
      TOPOS_OK);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  /* An optimizer the engine refuses (negative learning rate). */
  topos_optimizer neg = topos_sgd(-1, 0);
  ck_assert_int_ne(topos_client_step(c, id, loss, NULL, NULL, 0, &neg, NULL,
                                     NULL, NULL, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  /* A custom decay predicate needs parameters to be evaluated on. */
  topos_optimizer custom = topos_adamw(1e-3, 0.9, 0.999, 1e-8, 0.1);
  custom.decay = decay_even;
  ck_assert_int_eq(topos_client_step(c, id, loss, NULL, NULL, 0, &custom, NULL,
                                     NULL, NULL, NULL, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Raw calls: an unknown method is UNIMPLEMENTED, garbage INVALID_ARGUMENT,
   * and the daemon keeps serving. */
  int status = -1;
  uint8_t *reply = NULL;
  size_t rlen = 0;
  ck_assert_int_eq(
      topos_client_call_raw(c, "/topos.v1.Topos/Nope", (const uint8_t *)"", 0,
                            0, &reply, &rlen, &status, &err),
      TOPOS_CLIENT_GRPC_BASE + 12);
  ck_assert_int_eq(status, 12);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 12);
  const uint8_t garbage[6] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
  ck_assert_int_ne(topos_client_call_raw(c, "Forward", garbage, sizeof garbage,
                                         0, &reply, &rlen, &status, &err),
                   TOPOS_OK);
  ck_assert_int_eq(status, 3);
  ck_assert_int_eq(topos_client_call_raw(c, "Nope", garbage, 1, 0, &reply,
                                         &rlen, &status, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(topos_client_call_raw(c, "Health", NULL, 0, 0, &reply, &rlen,
                                         &status, &err),
                   TOPOS_OK);
  ck_assert_int_eq(status, 0);
  free(reply);

  /* A deadline shorter than the work: DEADLINE_EXCEEDED, a client code.
   * The work is ~1.3 GFLOP of f64 products (tens of ms on any core this
   * suite runs on), so that no run can finish inside the 1 ms deadline
   * and race its reply past it. */
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *w0 =
      topos_init_normal(TOPOS_F64, 2, SN_S(500, 500), 0.0, 0.05, 3, NULL);
  topos_value m = topos_parameter(tape, w0);
  topos_tensor_release(w0);
  topos_value p = m;
  for (int i = 0; i < 5; i++) p = topos_matmul(tape, p, m);
  m = topos_sum(tape, p);
  topos_network *slow = topos_tape_seal(tape, NULL);
  char slow_id[65];
  record(c, slow, slow_id);
  topos_value roots[1] = {m};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_client_args quick = {.deadline_s = 0.001};
  topos_tensor **rr = NULL;
  ck_assert_int_eq(
      topos_client_forward_with(c, slow_id, &e, &quick, &rr, NULL, &err),
      TOPOS_CLIENT_GRPC_BASE + 4);
  ck_assert_ptr_null(rr);
  ck_assert_ptr_nonnull(strstr(err.message, "DEADLINE_EXCEEDED"));
  topos_network_release(slow);

  /* Nothing listening: UNAVAILABLE, kept as a client code, in words
   * (retries off: test_replicas.c times them). */
  topos_client *dead = topos_client_connect("127.0.0.1:1", &err);
  ck_assert_ptr_nonnull(dead);
  topos_client_set_retry(dead, 0);
  ck_assert_int_eq(topos_client_health(dead, NULL, NULL, &err),
                   TOPOS_CLIENT_GRPC_BASE + 14);
  ck_assert_msg(strstr(err.message, "cannot reach toposd at 127.0.0.1:1: ") ==
                    err.message,
                "%s", err.message);
  topos_client_close(dead);
  ck_assert_ptr_null(topos_client_connect("", &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ threads */

enum { THREADS = 16, THREAD_STEPS = 40 };

static const double gd_samples[3][2] = {{1, 2}, {2, 4}, {3, 6}};

typedef struct thread_job {
  topos_client *c;
  const char *id;
  const topos_network *net;
  int offset;
  const double *expect; /* THREAD_STEPS values of w */
  int failures;
  char message[256];
} thread_job;

/* Gradient descent from w = 0, samples from `offset`; returns w per step
 * (in-process), THREAD_STEPS of them into w. */
static void gd_expect(const topos_network *net, int offset, double *w) {
  topos_optimizer opt = topos_sgd(0.02, 0);
  topos_params *p = topos_network_parameters(net);
  topos_opt_state *s = topos_opt_state_new(&opt, p, NULL);
  topos_value loss = topos_network_find(net, "loss");
  for (int k = 0; k < THREAD_STEPS; k++) {
    const double *smp = gd_samples[(offset + k) % 3];
    topos_tensor *x = topos_tensor_scalar(TOPOS_F64, smp[0], NULL);
    topos_tensor *y = topos_tensor_scalar(TOPOS_F64, smp[1], NULL);
    topos_feed f[2] = {{topos_network_find(net, "x"), x},
                       {topos_network_find(net, "y"), y}};
    topos_run *run = topos_forward(net, p, f, 2, NULL, NULL);
    topos_field *g = topos_backward(run, loss, NULL, NULL);
    topos_params *gp = topos_parameters_of(g, NULL);
    topos_params *np = NULL;
    topos_opt_state *ns = NULL;
    topos_optimizer_step(&opt, p, gp, s, &np, &ns, NULL);
    topos_params_free(p);
    topos_opt_state_free(s);
    p = np;
    s = ns;
    w[k] = topos_tensor_get(topos_params_get(p, 0), NULL, NULL);
    topos_params_free(gp);
    topos_field_free(g);
    topos_run_free(run);
    topos_tensor_release(x);
    topos_tensor_release(y);
  }
  topos_params_free(p);
  topos_opt_state_free(s);
}

static void *thread_main(void *arg) {
  thread_job *j = arg;
  topos_optimizer opt = topos_sgd(0.02, 0);
  topos_params *p = topos_network_parameters(j->net);
  topos_opt_state *s = NULL;
  topos_value loss = topos_network_find(j->net, "loss");
  for (int k = 0; k < THREAD_STEPS && j->failures == 0; k++) {
    const double *smp = gd_samples[(j->offset + k) % 3];
    topos_tensor *x = topos_tensor_scalar(TOPOS_F64, smp[0], NULL);
    topos_tensor *y = topos_tensor_scalar(TOPOS_F64, smp[1], NULL);
    topos_feed f[2] = {{topos_network_find(j->net, "x"), x},
                       {topos_network_find(j->net, "y"), y}};
    topos_params *np = NULL;
    topos_opt_state *ns = NULL;
    topos_error err = {0};
    if (topos_client_step(j->c, j->id, loss, p, f, 2, &opt, s, &np, &ns, NULL,
                          &err) != TOPOS_OK) {
      j->failures++;
      snprintf(j->message, sizeof j->message, "step %d: %.200s", k,
               err.message);
    } else {
      double w = topos_tensor_get(topos_params_get(np, 0), NULL, NULL);
      if (memcmp(&w, &j->expect[k], sizeof w) != 0) {
        j->failures++;
        snprintf(j->message, sizeof j->message, "step %d: w %.17g want %.17g",
                 k, w, j->expect[k]);
      }
      topos_params_free(p);
      topos_opt_state_free(s);
      p = np;
      s = ns;
    }
    topos_tensor_release(x);
    topos_tensor_release(y);
  }
  topos_params_free(p);
  topos_opt_state_free(s);
  return NULL;
}

START_TEST(test_one_client_many_threads) {
  topos_client *c = connect_daemon();
  topos_network *net = sn_gradient_descent();
  char id[65];
  record(c, net, id);
  double expect[3][THREAD_STEPS];
  for (int o = 0; o < 3; o++) gd_expect(net, o, expect[o]);
  thread_job jobs[THREADS];
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; t++) {
    jobs[t] = (thread_job){c, id, net, t % 3, expect[t % 3], 0, ""};
    ck_assert_int_eq(pthread_create(&threads[t], NULL, thread_main, &jobs[t]),
                     0);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
  for (int t = 0; t < THREADS; t++)
    ck_assert_msg(jobs[t].failures == 0, "thread %d: %s", t, jobs[t].message);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* ------------------------------------------------------------ examples */

/* Runs an example in-process and against the daemon with --save and
 * asserts the two checkpoints are byte-identical and non-empty, and that
 * they print the same.  The remote run names the daemon by --server, or
 * by $TOPOS_SERVER when by_env is set. */
static void check_example_with(const char *name, const char *args,
                               bool by_env) {
  char a[400], b[400], cmd[1400];
  snprintf(a, sizeof a, "%s/%s-local.bin", daemon_.dir, name);
  snprintf(b, sizeof b, "%s/%s-remote.bin", daemon_.dir, name);
  int st = -1;
  char *err = NULL;
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_SERVER '%s/examples/%s' %s --no-progress --save '%s'",
           build_dir(), name, args, a);
  char *out1 = run_cmd(cmd, &st, &err);
  ck_assert_msg(st == 0, "%s exited %d: %s", cmd, st, err);
  free(err);
  if (by_env)
    snprintf(cmd, sizeof cmd,
             "TOPOS_SERVER=%s '%s/examples/%s' %s --no-progress --save '%s'",
             daemon_.address, build_dir(), name, args, b);
  else
    snprintf(cmd, sizeof cmd,
             "'%s/examples/%s' %s --server %s --no-progress --save '%s'",
             build_dir(), name, args, daemon_.address, b);
  char *out2 = run_cmd(cmd, &st, &err);
  ck_assert_msg(st == 0, "%s exited %d: %s", cmd, st, err);
  free(err);
  long size = 0;
  ck_assert_msg(files_equal(a, b, &size), "%s: final parameters differ", name);
  ck_assert_int_gt(size, 0);
  /* What they print is the same too. */
  ck_assert_msg(strcmp(out1, out2) == 0, "%s prints:\n%s\nremote:\n%s", name,
                out1, out2);
  free(out1);
  free(out2);
}

static void check_example(const char *name, const char *args) {
  check_example_with(name, args, false);
}

START_TEST(test_gradient_descent_remote) {
  check_example("gradient_descent", "");
}
END_TEST

START_TEST(test_makemore_remote) {
  if (getenv("TOPOS_SKIP_SLOW")) {
    fprintf(stderr, "client: makemore remote skipped (TOPOS_SKIP_SLOW)\n");
    return;
  }
  check_example("makemore_mlp", "--steps 1000");
  check_example_with("makemore_bigram", "--steps 100", true);
  check_example("makemore_transformer", "--steps 20");
  check_example("cifar10", "--limit 640 --test-limit 500 --epochs 1");
  if (access("/usr/share/datasets/fashion-mnist", R_OK) == 0)
    check_example("mnist", "--limit 640 --test-limit 1000 --epochs 1");
  else
    fprintf(stderr, "client: mnist remote skipped (no Fashion-MNIST)\n");
}
END_TEST

/* GPT-2 generation on the daemon (weights as one blob, each step's small
 * spec, the cache as feeds and roots) prints the tokens the in-process
 * run prints, greedy and sampled. */
START_TEST(test_gpt2_remote) {
  const char *modes[3] = {"", "--temperature 0.9 --top-k 50 --seed 5", ""};
  for (int m = 0; m < 3; m++) {
    /* The third run is Llama's (GQA, rotary, SwiGLU) on the same path. */
    const char *prog = m == 2 ? "llama" : "gpt2";
    char cmd[1400];
    int st = -1;
    char *err = NULL;
    snprintf(cmd, sizeof cmd,
             "env -u TOPOS_SERVER '%s/examples/%s' --config tiny --prompt "
             "'The cache is the callers' --tokens 12 %s",
             build_dir(), prog, modes[m]);
    char *local = run_cmd(cmd, &st, &err);
    ck_assert_msg(st == 0, "%s exited %d: %s", cmd, st, err);
    free(err);
    snprintf(cmd, sizeof cmd,
             "'%s/examples/%s' --config tiny --prompt 'The cache is the "
             "callers' --tokens 12 %s --server %s",
             build_dir(), prog, modes[m], daemon_.address);
    char *remote = run_cmd(cmd, &st, &err);
    ck_assert_msg(st == 0, "%s exited %d: %s", cmd, st, err);
    ck_assert_msg(strstr(err, "as blob"), "no blob upload said: %s", err);
    free(err);
    ck_assert_msg(strncmp(local, "The cache is the callers", 24) == 0, "%s",
                  local);
    ck_assert_msg(strlen(local) > 30, "no tokens: %s", local);
    ck_assert_msg(strcmp(local, remote) == 0, "local:\n%s\nremote:\n%s", local,
                  remote);
    free(local);
    free(remote);
  }
}
END_TEST

/* ------------------------------------------------------------ the CLI */

static char *cli(const char *args, int *status, char **err) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s/bin/topos' --server %s %s", build_dir(),
           daemon_.address, args);
  return run_cmd(cmd, status, err);
}

/* A GEMM-heavy spec: x[128,256]·w[256,128] -> tanh -> ·v[128,64], sum of
 * squares; both products are above blas's threshold. */
static topos_network *gemm_net(void) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  int64_t xs[2] = {128, 256}, ws[2] = {256, 128}, vs[2] = {128, 64};
  topos_tensor *xt = topos_init_uniform(TOPOS_F32, 2, xs, -1, 1, 1, NULL);
  topos_tensor *wt = topos_init_uniform(TOPOS_F32, 2, ws, -0.1, 0.1, 2, NULL);
  topos_tensor *vt = topos_init_uniform(TOPOS_F32, 2, vs, -0.1, 0.1, 3, NULL);
  topos_value x = topos_name(t, topos_input(t, xt), "x");
  topos_value w = topos_name(t, topos_parameter(t, wt), "w");
  topos_value v = topos_name(t, topos_parameter(t, vt), "v");
  topos_tensor_release(xt);
  topos_tensor_release(wt);
  topos_tensor_release(vt);
  topos_value y = topos_matmul(t, topos_tanh(t, topos_matmul(t, x, w)), v);
  topos_name(t, topos_sum(t, topos_mul(t, y, y)), "loss");
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  return net;
}

/* Backends end to end: the registry over the wire and in-process, Forward
 * and Step under fast blas (the daemon's counter moves, the reply names
 * blas), exact requests never reaching blas, unknown backends refused by
 * name, and conformance rows: blas within the envelope, flip-test red
 * with the CLI's exit status 1. */
START_TEST(test_backends_end_to_end) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_backend_info *info = NULL;
  int n = 0;
  ck_assert_int_eq(topos_client_backends(c, &info, &n, &err), TOPOS_OK);
  ck_assert_int_ge(n, 4);
  ck_assert_str_eq(info[0].name, "reference");
  bool cpu = false, blas = false, flip = false;
  for (int i = 1; i < n; i++) {
    cpu |= strcmp(info[i].name, "cpu") == 0 &&
           strcmp(info[i].fidelity, "exact") == 0 && info[i].tasks == 0xF;
    blas |= strcmp(info[i].name, "blas") == 0 &&
            strcmp(info[i].fidelity, "envelope") == 0 && info[i].tasks == 1u &&
            strstr(info[i].device, "OpenBLAS") != NULL;
    flip |= strcmp(info[i].name, "flip-test") == 0;
  }
  ck_assert(cpu && blas && flip);
  topos_free(info);

  topos_network *net = gemm_net();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  topos_entry e = {.roots = &loss, .nroots = 1};
  topos_client_stats_info s0, s1, s2;
  int st = -1;
  char *out, *errs, args[400];
  ck_assert_int_eq(topos_client_stats(c, &s0, &err), TOPOS_OK);
  int blas_at = -1;
  for (int i = 0; i < s0.nbackends; i++)
    if (strcmp(s0.backend_names[i], "blas") == 0) blas_at = i;
  ck_assert_int_ge(blas_at, 1);

  /* Exact (the default): blas never runs, the reply names cpu. */
  char ran[128] = "";
  topos_client_args exact = {.ran = ran, .ran_len = sizeof ran};
  topos_tensor **roots = NULL;
  ck_assert_msg(topos_client_forward_with(c, id, &e, &exact, &roots, NULL,
                                          &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert_msg(strstr(ran, "cpu") != NULL && strstr(ran, "blas") == NULL,
                "ran: %s", ran);
  double exact_loss = topos_tensor_get(roots[0], NULL, NULL);
  topos_client_tensors_free(roots, 1);
  ck_assert_int_eq(topos_client_stats(c, &s1, &err), TOPOS_OK);
  ck_assert_int_eq(s1.backend_tasks[blas_at], s0.backend_tasks[blas_at]);

  /* Fast with blas: the counter moves, the reply says so, the loss is
   * within the envelope. */
  topos_exec fast = {.numerics = TOPOS_NUMERICS_FAST, .backend = "blas"};
  topos_client_args fa = {.exec = &fast, .ran = ran, .ran_len = sizeof ran};
  ck_assert_msg(
      topos_client_forward_with(c, id, &e, &fa, &roots, NULL, &err) == TOPOS_OK,
      "%s", err.message);
  ck_assert_msg(strstr(ran, "blas") != NULL, "ran: %s", ran);
  double fast_loss = topos_tensor_get(roots[0], NULL, NULL);
  topos_client_tensors_free(roots, 1);
  ck_assert(fabs(fast_loss - exact_loss) <= 1e-5 * fabs(exact_loss));
  ck_assert_int_eq(topos_client_stats(c, &s2, &err), TOPOS_OK);
  ck_assert_int_ge(s2.backend_tasks[blas_at], s1.backend_tasks[blas_at] + 2);

  /* Step and Backward run fast too. */
  topos_optimizer opt = topos_sgd(0.01, 0);
  ran[0] = '\0';
  ck_assert_msg(topos_client_step_with(c, id, loss, &fa, &opt, NULL, NULL, NULL,
                                       NULL, &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert_msg(strstr(ran, "blas") != NULL, "step ran: %s", ran);
  ran[0] = '\0';
  ck_assert_int_eq(
      topos_client_backward_with(c, id, loss, &fa, NULL, NULL, &err), TOPOS_OK);
  ck_assert_msg(strstr(ran, "blas") != NULL, "backward ran: %s", ran);

  /* Refusals: an unknown name lists the known ones; blas under exact. */
  topos_exec foo = {.backend = "foo"};
  topos_client_args fo = {.exec = &foo};
  ck_assert_int_ne(topos_client_forward_with(c, id, &e, &fo, NULL, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  ck_assert_msg(strstr(err.message, "unknown backend 'foo'") &&
                    strstr(err.message, "blas"),
                "%s", err.message);
  topos_exec eb = {.backend = "blas"};
  topos_client_args ea = {.exec = &eb};
  ck_assert_int_ne(topos_client_step_with(c, id, loss, &ea, &opt, NULL, NULL,
                                          NULL, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  /* The entry's backend is honoured, and checked, even by Lower. */
  snprintf(args, sizeof args, "lower %s --roots loss --backend foo", id);
  out = cli(args, &st, &errs);
  ck_assert_msg(st == 1 && strstr(errs, "unknown backend 'foo'"),
                "lower --backend foo: %d %s", st, errs);
  free(out);
  free(errs);
  snprintf(args, sizeof args, "lower %s --roots loss --backend blas --fast",
           id);
  out = cli(args, &st, &errs);
  ck_assert_msg(st == 0, "lower --backend blas --fast: %d %s", st, errs);
  free(out);
  free(errs);

  /* Conformance through the client: blas holds the envelope, flip-test
   * does not hold. */
  topos_exec cands[2] = {{.numerics = TOPOS_NUMERICS_FAST, .backend = "blas"},
                         {.backend = "flip-test"}};
  topos_client_args ca = {.exec = cands, .nexec = 2};
  topos_conformance *res = NULL;
  /* Training: the gradients are GEMM outputs themselves, so the flipped
   * bit reaches an output (a sum could round it away). */
  topos_entry te = {
      .roots = &loss, .nroots = 1, .posture = TOPOS_POSTURE_TRAINING};
  ck_assert_msg(
      topos_client_conformance(c, id, &te, &ca, &res, &err) == TOPOS_OK, "%s",
      err.message);
  ck_assert_int_eq(res->nrows, 2);
  ck_assert_msg(res->rows[0].holds, "blas: %s", res->rows[0].note);
  ck_assert_str_eq(res->rows[0].fidelity, "envelope");
  ck_assert(res->rows[0].rel_l2 <= 1e-5);
  ck_assert_ptr_nonnull(strstr(res->rows[0].ran, "blas"));
  ck_assert(!res->rows[1].holds && !res->rows[1].bit_identical);
  ck_assert(res->rows[1].max_ulp >= 1);
  ck_assert_int_eq(res->rows[1].noutputs, 3); /* loss, dw, dv */
  topos_conformance_free(res);

  /* The CLI: backends (remote and local), conformance exit codes. */
  out = cli("backends", &st, &errs);
  ck_assert_msg(st == 0, "backends: %s", errs);
  ck_assert_msg(strstr(out, "reference ") && strstr(out, "\ncpu ") &&
                    strstr(out, "\nblas ") && strstr(out, "envelope"),
                "%s", out);
  free(out);
  free(errs);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "'%s/bin/topos' backends --local", build_dir());
  out = run_cmd(cmd, &st, &errs);
  ck_assert_msg(st == 0 && strstr(out, "\ncpu ") && strstr(out, "\nblas "),
                "backends --local: %d %s", st, out);
  free(out);
  free(errs);
  snprintf(args, sizeof args, "conformance %s --roots loss --backend blas", id);
  out = cli(args, &st, &errs);
  ck_assert_msg(st == 0, "conformance --backend blas: %d %s %s", st, out, errs);
  ck_assert_msg(strstr(out, "\nblas ") && strstr(out, "fast") &&
                    strstr(out, "envelope") && strstr(out, "rel_l2"),
                "%s", out);
  free(out);
  free(errs);
  snprintf(args, sizeof args,
           "conformance %s --roots loss --training --backend cpu,flip-test",
           id);
  out = cli(args, &st, &errs);
  ck_assert_msg(st == 1, "conformance --backend flip-test: %d %s %s", st, out,
                errs);
  ck_assert_msg(strstr(out, "\nflip-test ") && strstr(out, " NO "), "%s", out);
  ck_assert_msg(strstr(out, "\ncpu ") && strstr(out, " bits "), "%s", out);
  free(out);
  free(errs);
  snprintf(args, sizeof args, "conformance %s --backend nope", id);
  out = cli(args, &st, &errs);
  ck_assert_msg(st == 2 && strstr(errs, "unknown backend 'nope'"),
                "conformance --backend nope: %d %s", st, errs);
  free(out);
  free(errs);
  snprintf(cmd, sizeof cmd,
           "'%s/bin/topos' --server 127.0.0.1:1 --deadline 2 conformance %s",
           build_dir(), id);
  out = run_cmd(cmd, &st, &errs);
  ck_assert_int_eq(st, 2);
  free(out);
  free(errs);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* An example's --save-spec file is what `topos record` stores: the id is
 * the network's own, and `topos list` shows it; --version is the
 * library's. */
START_TEST(test_cli_save_spec) {
  char path[400], cmd[1200], args[600];
  snprintf(path, sizeof path, "%s/gd.spec", daemon_.dir);
  snprintf(cmd, sizeof cmd,
           "'%s/examples/gradient_descent' --save-spec '%s' >/dev/null",
           build_dir(), path);
  int st = -1;
  char *err = NULL, *out = run_cmd(cmd, &st, &err);
  ck_assert_msg(st == 0, "gradient_descent: %d %s", st, err);
  free(out);
  free(err);
  /* The same network, recorded here (examples/gradient_descent.c's). */
  topos_network *net = sn_gradient_descent();
  ck_assert_ptr_nonnull(net);
  char id[65];
  topos_network_id(net, id, NULL);
  snprintf(args, sizeof args, "record '%s'", path);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "record: %d %s", st, err);
  ck_assert_msg(strncmp(out, id, 64) == 0 && out[64] == '\n', "'%s' vs %s", out,
                id);
  free(out);
  free(err);
  out = cli("list", &st, &err);
  ck_assert_msg(st == 0, "list: %d %s", st, err);
  char line[80];
  snprintf(line, sizeof line, "%s ", id);
  ck_assert_msg(strstr(out, line) != NULL, "list: %s", out);
  free(out);
  free(err);
  out = cli("--version", &st, &err);
  char want[64];
  snprintf(want, sizeof want, "topos %s\n", topos_version());
  ck_assert_int_eq(st, 0);
  ck_assert_str_eq(out, want);
  free(out);
  free(err);
  out = cli("--bogus health", &st, &err);
  ck_assert_int_eq(st, 2);
  ck_assert_msg(strstr(err, "unknown option '--bogus'") != NULL, "%s", err);
  free(out);
  free(err);
  snprintf(cmd, sizeof cmd, "'%s/bin/topos' --server 127.0.0.1 health",
           build_dir());
  out = run_cmd(cmd, &st, &err);
  ck_assert_int_eq(st, 2);
  ck_assert_msg(strstr(err, "needs HOST:PORT") != NULL, "%s", err);
  free(out);
  free(err);
  topos_network_release(net);
}
END_TEST

START_TEST(test_cli) {
  topos_network *net = sn_mlp();
  char local[65], path[400], args[1200];
  topos_network_id(net, local, NULL);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(topos_network_encode(net, &bytes, &len, NULL), TOPOS_OK);
  snprintf(path, sizeof path, "%s/mlp.tpos", daemon_.dir);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  fclose(f);
  topos_free(bytes);
  int st = -1;
  char *err = NULL, *out = NULL;

  /* record prints the id; --summary the counts. */
  snprintf(args, sizeof args, "record '%s'", path);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "record: %d %s", st, err);
  ck_assert_msg(strncmp(out, local, 64) == 0 && out[64] == '\n', "'%s'", out);
  free(out);
  free(err);
  snprintf(args, sizeof args, "record --summary '%s'", path);
  out = cli(args, &st, &err);
  ck_assert_int_eq(st, 0);
  ck_assert_ptr_nonnull(strstr(out, "parameters 4"));
  free(out);
  free(err);

  /* describe in each format equals the local describe. */
  const char *formats[3] = {"text", "json", "dot"};
  for (int k = 0; k < 3; k++) {
    snprintf(args, sizeof args, "describe %s --format %s", local, formats[k]);
    out = cli(args, &st, &err);
    ck_assert_msg(st == 0, "describe: %s", err);
    char *mine = topos_network_describe(net, (topos_format)k, NULL);
    ck_assert_msg(strncmp(out, mine, strlen(mine)) == 0, "%s differs",
                  formats[k]);
    topos_free(mine);
    free(out);
    free(err);
  }

  /* lower / emit / conformance with names, indices and defaults. */
  snprintf(args, sizeof args,
           "lower %s --roots loss --observes w1,2 --training", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "lower: %s", err);
  ck_assert_ptr_nonnull(strstr(out, "peak bytes"));
  free(out);
  free(err);
  /* --threads: the daemon's plan names it; bad counts are usage errors. */
  snprintf(args, sizeof args, "lower %s --roots loss --threads 3", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "lower --threads: %s", err);
  ck_assert_msg(strstr(out, ", threads 3;") != NULL, "%s", out);
  free(out);
  free(err);
  snprintf(args, sizeof args, "conformance %s --roots loss --threads 2", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "conformance --threads: %d %s %s", st, out, err);
  free(out);
  free(err);
  const char *bad_threads[] = {"-1", "1025", "x", "3x", ""};
  for (size_t k = 0; k < sizeof bad_threads / sizeof bad_threads[0]; k++) {
    snprintf(args, sizeof args, "lower %s --threads '%s'", local,
             bad_threads[k]);
    out = cli(args, &st, &err);
    ck_assert_msg(st == 2, "'%s' exited %d", args, st);
    ck_assert_msg(strstr(err, "--threads") != NULL, "'%s': %s", args, err);
    free(out);
    free(err);
  }
  out = cli("health --threads 2", &st, &err);
  ck_assert_int_eq(st, 2);
  free(out);
  free(err);
  snprintf(args, sizeof args, "emit %s --generic", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "emit: %s", err);
  ck_assert_ptr_nonnull(strstr(out, "\"stablehlo."));
  free(out);
  free(err);
  snprintf(args, sizeof args, "conformance %s --roots loss --training", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "conformance: %d %s %s", st, out, err);
  ck_assert_ptr_nonnull(strstr(out, "\nreference "));
  ck_assert_ptr_nonnull(strstr(out, "\ncpu "));
  ck_assert_ptr_nonnull(strstr(out, " bits "));
  ck_assert_ptr_null(strstr(out, " NO "));
  free(out);
  free(err);
  snprintf(args, sizeof args, "conformance %s", local);
  out = cli(args, &st, &err);
  ck_assert_msg(st == 0, "conformance (default roots): %s", err);
  free(out);
  free(err);

  out = cli("health", &st, &err);
  ck_assert_int_eq(st, 0);
  ck_assert_ptr_nonnull(strstr(out, "serving"));
  free(out);
  free(err);
  out = cli("stats", &st, &err);
  ck_assert_int_eq(st, 0);
  ck_assert_ptr_nonnull(strstr(out, "workers "));
  ck_assert_ptr_nonnull(strstr(out, "specs "));
  free(out);
  free(err);

  /* Errors: stderr and a non-zero status. */
  char unknown[65];
  memset(unknown, 'a', 64);
  unknown[64] = '\0';
  snprintf(args, sizeof args, "describe %s", unknown);
  out = cli(args, &st, &err);
  ck_assert_int_eq(st, 1);
  ck_assert_ptr_nonnull(strstr(err, "NOT_FOUND"));
  ck_assert_str_eq(out, "");
  free(out);
  free(err);
  snprintf(args, sizeof args, "lower %s --roots nosuch", local);
  out = cli(args, &st, &err);
  ck_assert_int_eq(st, 1);
  ck_assert_ptr_nonnull(strstr(err, "nosuch"));
  free(out);
  free(err);
  const char *usage_errors[] = {
      "describe notanid", "bogus",
      "describe",         "health --generic",
      "stats extra",      "describe --format xml " /* id follows */};
  for (size_t k = 0; k < sizeof usage_errors / sizeof usage_errors[0]; k++) {
    snprintf(args, sizeof args, "%s%s", usage_errors[k], k == 5 ? local : "");
    out = cli(args, &st, &err);
    ck_assert_msg(st == 2, "'%s' exited %d", args, st);
    ck_assert_msg(err[0] != '\0', "'%s' printed no error", args);
    free(out);
    free(err);
  }
  snprintf(args, sizeof args, "record '%s/nonexistent.tpos'", daemon_.dir);
  out = cli(args, &st, &err);
  ck_assert_int_eq(st, 1);
  free(out);
  free(err);
  /* Hostile bytes as a spec file: the daemon refuses them. */
  snprintf(path, sizeof path, "%s/junk.bin", daemon_.dir);
  f = fopen(path, "wb");
  fputs("\x0a\x05\x10\x63\x1a\x01\x00 junk", f);
  fclose(f);
  snprintf(args, sizeof args, "record '%s'", path);
  out = cli(args, &st, &err);
  ck_assert_int_eq(st, 1);
  ck_assert_ptr_nonnull(strstr(err, "INVALID_ARGUMENT"));
  free(out);
  free(err);

  /* --help everywhere. */
  const char *helps[] = {"--help",        "record --help", "describe --help",
                         "lower --help",  "emit --help",   "conformance --help",
                         "health --help", "stats --help",  "help"};
  for (size_t k = 0; k < sizeof helps / sizeof helps[0]; k++) {
    out = cli(helps[k], &st, &err);
    ck_assert_msg(st == 0, "'%s' exited %d", helps[k], st);
    ck_assert_msg(strstr(out, "usage: topos") != NULL, "'%s': %s", helps[k],
                  out);
    free(out);
    free(err);
  }
  /* Nothing listening: exit status 1, in words. */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "'%s/bin/topos' --server 127.0.0.1:1 health",
           build_dir());
  out = run_cmd(cmd, &st, &err);
  ck_assert_int_eq(st, 1);
  ck_assert_msg(strstr(err,
                       "cannot reach toposd at 127.0.0.1:1: connection "
                       "refused") != NULL,
                "%s", err);
  free(out);
  free(err);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------ Python */

START_TEST(test_python_client) {
  /* The C client's numbers: gradient descent, 6 steps. */
  topos_client *c = connect_daemon();
  topos_network *net = sn_gradient_descent();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  topos_optimizer opt = topos_sgd(0.02, 0);
  topos_params *p = topos_network_parameters(net);
  topos_opt_state *s = NULL;
  char ws[1024] = "", losses[1024] = "";
  for (int k = 0; k < 6; k++) {
    const double *smp = gd_samples[k % 3];
    topos_tensor *x = topos_tensor_scalar(TOPOS_F64, smp[0], NULL);
    topos_tensor *y = topos_tensor_scalar(TOPOS_F64, smp[1], NULL);
    topos_feed f[2] = {{topos_network_find(net, "x"), x},
                       {topos_network_find(net, "y"), y}};
    topos_params *np = NULL;
    topos_opt_state *ns = NULL;
    double l = NAN;
    topos_error err = {0};
    ck_assert_msg(topos_client_step(c, id, loss, p, f, 2, &opt, s, &np, &ns, &l,
                                    &err) == TOPOS_OK,
                  "%s", err.message);
    double w = topos_tensor_get(topos_params_get(np, 0), NULL, NULL);
    size_t u = strlen(ws), v = strlen(losses);
    snprintf(ws + u, sizeof ws - u, "%s%a", k ? "," : "", w);
    snprintf(losses + v, sizeof losses - v, "%s%a", k ? "," : "", l);
    topos_params_free(p);
    topos_opt_state_free(s);
    p = np;
    s = ns;
    topos_tensor_release(x);
    topos_tensor_release(y);
  }
  topos_params_free(p);
  topos_opt_state_free(s);
  topos_network_release(net);
  topos_client_close(c);

  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 tests/python/test_client.py --server %s "
           "--proto proto/topos.proto --id %s --w %s --loss %s",
           daemon_.address, id, ws, losses);
  int st = -1;
  char *err = NULL;
  char *out = run_cmd(cmd, &st, &err);
  ck_assert_msg(st == 0, "python client exited %d:\n%s\n%s", st, out, err);
  ck_assert_msg(strstr(out, "python client: ok") != NULL, "%s", out);
  free(out);
  free(err);
}
END_TEST

/* ------------------------------------------------------------ Train */

/* The in-process side of a Train stream: a parameter set and state, and
 * one step of opt on them (the engine's own forward, backward and
 * optimizer), returning the loss. */
typedef struct local_train {
  topos_params *p;
  topos_opt_state *s;
} local_train;

static local_train local_train_new(const topos_network *net,
                                   const topos_optimizer *opt) {
  topos_error err = {0};
  local_train l = {topos_network_parameters(net), NULL};
  l.s = topos_opt_state_new(opt, l.p, &err);
  ck_assert_ptr_nonnull(l.s);
  return l;
}

static void local_train_free(local_train *l) {
  topos_params_free(l->p);
  topos_opt_state_free(l->s);
}

static double local_train_step(const topos_network *net, topos_value loss,
                               const topos_optimizer *opt, local_train *l,
                               const topos_feed *feeds, int nf) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, l->p, feeds, nf, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  topos_field *f = topos_backward(run, loss, NULL, &err);
  topos_params *g = topos_parameters_of(f, &err);
  double value = topos_run_scalar(run, loss, &err);
  topos_params *p2 = NULL;
  topos_opt_state *s2 = NULL;
  ck_assert_msg(
      topos_optimizer_step(opt, l->p, g, l->s, &p2, &s2, &err) == TOPOS_OK,
      "%s", err.message);
  local_train_free(l);
  l->p = p2;
  l->s = s2;
  topos_params_free(g);
  topos_field_free(f);
  topos_run_free(run);
  return value;
}

static void assert_train_state(const local_train *l, const topos_params *p,
                               const topos_opt_state *s, const char *what) {
  ck_assert_msg(p != NULL && s != NULL, "%s: no parameters or state", what);
  ck_assert_msg(topos_params_bitwise_equal(l->p, p), "%s: parameters differ",
                what);
  ck_assert_int_eq(topos_opt_state_step(l->s), topos_opt_state_step(s));
  for (int m = 0; m < 2; m++) {
    const topos_params *a = topos_opt_state_moment(l->s, m);
    const topos_params *b = topos_opt_state_moment(s, m);
    ck_assert_msg((a == NULL) == (b == NULL), "%s: moment %d presence", what,
                  m);
    if (a)
      ck_assert_msg(topos_params_bitwise_equal(a, b), "%s: moment %d differs",
                    what, m);
  }
}

static void assert_loss(double want, double got, const char *what, int k) {
  ck_assert_msg(memcmp(&want, &got, sizeof want) == 0,
                "%s step %d: loss %.17g, in-process %.17g", what, k, got, want);
}

/* Ten steps on one stream - one at a time, two in flight, four in one
 * message - against the in-process steps, bit for bit. */
static void check_train(topos_client *c, const topos_optimizer *opt,
                        const char *what) {
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  local_train l = local_train_new(net, opt);
  /* A custom decay predicate is sent as the slots it picks: the client
   * needs the parameters to evaluate it. */
  topos_client_args args = {.params = l.p};
  topos_client_train *t = topos_client_train_open(
      c, id, loss, opt->decay ? &args : NULL, opt, NULL, &err);
  ck_assert_msg(t != NULL, "%s: open: %s", what, err.message);
  enum { N = 10 };
  topos_feed feeds[N][1];
  double want[N];
  for (int k = 0; k < N; k++)
    ck_assert_int_eq(float_feeds(net, 500 + k, feeds[k], 1), 1);
  topos_client_train_reply r;
  /* 0, 1: one at a time; 1 asks for the state. */
  for (int k = 0; k < 2; k++) {
    want[k] = local_train_step(net, loss, opt, &l, feeds[k], 1);
    ck_assert_msg(
        topos_client_train_step(t, feeds[k], 1, k == 1, &r, &err) == TOPOS_OK,
        "%s step %d: %s", what, k, err.message);
    assert_loss(want[k], r.loss, what, k);
    ck_assert_int_eq(r.steps, k + 1);
    ck_assert(!r.last);
    if (k == 1)
      assert_train_state(&l, r.params, r.state, what);
    else
      ck_assert_ptr_null(r.params);
    topos_client_train_reply_clear(&r);
  }
  /* 2..5: the next sent before the last is read. */
  for (int k = 2; k < 6; k++) {
    want[k] = local_train_step(net, loss, opt, &l, feeds[k], 1);
    ck_assert_int_eq(topos_client_train_send(t, feeds[k], 1, false, &err),
                     TOPOS_OK);
    if (k == 2) continue;
    ck_assert_int_eq(topos_client_train_recv(t, &r, &err), TOPOS_OK);
    assert_loss(want[k - 1], r.loss, what, k - 1);
    topos_client_train_reply_clear(&r);
  }
  ck_assert_int_eq(topos_client_train_recv(t, &r, &err), TOPOS_OK);
  assert_loss(want[5], r.loss, what, 5);
  ck_assert_int_eq(r.steps, 6);
  topos_client_train_reply_clear(&r);
  /* 6..9 in one message, with the state. */
  topos_feed four[4];
  for (int k = 6; k < N; k++) {
    want[k] = local_train_step(net, loss, opt, &l, feeds[k], 1);
    four[k - 6] = feeds[k][0];
  }
  ck_assert_int_eq(topos_client_train_send_steps(t, four, 1, 4, true, &err),
                   TOPOS_OK);
  ck_assert_msg(topos_client_train_recv(t, &r, &err) == TOPOS_OK, "%s: %s",
                what, err.message);
  ck_assert_int_eq(r.nlosses, 4);
  ck_assert_int_eq(r.steps, N);
  for (int k = 6; k < N; k++) assert_loss(want[k], r.losses[k - 6], what, k);
  assert_loss(want[N - 1], r.loss, what, N - 1);
  assert_train_state(&l, r.params, r.state, what);
  topos_client_train_reply_clear(&r);
  /* Close hands the final state back. */
  topos_params *p = NULL;
  topos_opt_state *s = NULL;
  ck_assert_msg(topos_client_train_close(t, &p, &s, &err) == TOPOS_OK, "%s: %s",
                what, err.message);
  assert_train_state(&l, p, s, what);
  topos_params_free(p);
  topos_opt_state_free(s);
  /* A closed stream takes nothing more. */
  ck_assert_int_ne(topos_client_train_send(t, feeds[0], 1, false, &err),
                   TOPOS_OK);
  topos_client_train_free(t);
  for (int k = 0; k < N; k++) free_feeds(feeds[k], 1);
  local_train_free(&l);
  topos_network_release(net);
}

START_TEST(test_train_bits) {
  topos_client *c = connect_daemon();
  topos_optimizer opts[5];
  five_optimizers(opts);
  for (int o = 0; o < 5; o++) {
    char what[32];
    snprintf(what, sizeof what, "optimizer %d", o);
    check_train(c, &opts[o], what);
  }
  topos_client_close(c);
}
END_TEST

/* The daemon's reserved bytes (Stats). */
static int64_t reserved_bytes(topos_client *c) {
  Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
  uint8_t buf[16];
  size_t n = topos__v1__stats_request__pack(&q, buf);
  uint8_t *out = NULL;
  size_t len = 0;
  topos_error err = {0};
  ck_assert_int_eq(
      topos_client_call_raw(c, "Stats", buf, n, 10, &out, &len, NULL, &err),
      TOPOS_OK);
  Topos__V1__StatsReply *r = topos__v1__stats_reply__unpack(NULL, len, out);
  ck_assert_ptr_nonnull(r);
  int64_t v = r->reserved_bytes;
  topos__v1__stats_reply__free_unpacked(r, NULL);
  free(out);
  return v;
}

/* A stream on spec id that ran `steps` of f one at a time, and *l the
 * same steps in-process. */
static topos_client_train *train_steps_both(
    topos_client *c, const topos_network *net, const char *id,
    const topos_optimizer *opt, topos_feed (*f)[1], int steps, local_train *l) {
  topos_error err = {0};
  topos_value loss = topos_network_find(net, "loss");
  *l = local_train_new(net, opt);
  topos_client_train *t =
      topos_client_train_open(c, id, loss, NULL, opt, NULL, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  for (int k = 0; k < steps; k++) {
    local_train_step(net, loss, opt, l, f[k], 1);
    ck_assert_int_eq(topos_client_train_step(t, f[k], 1, false, NULL, &err),
                     TOPOS_OK);
  }
  return t;
}

/* A stream's step refused: the error is the stream's status, and the last
 * reply holds the state `l` (where the session stood). */
static void expect_refused(topos_client_train *t, const local_train *l,
                           int64_t steps, int grpc_status, const char *what) {
  topos_error err = {0};
  topos_client_train_reply r;
  int rc = topos_client_train_recv(t, &r, &err);
  ck_assert_msg(rc != TOPOS_OK, "%s: accepted", what);
  ck_assert_msg(topos_client_grpc_status(rc) == grpc_status,
                "%s: status %d (%s)", what, topos_client_grpc_status(rc),
                err.message);
  ck_assert_msg(r.last, "%s: no last reply", what);
  ck_assert_int_eq(r.steps, steps);
  assert_train_state(l, r.params, r.state, what);
  topos_client_train_reply_clear(&r);
  /* The stream is over: every later call says the same. */
  topos_error again = {0};
  ck_assert_int_eq(topos_client_train_send(t, NULL, 0, false, &again), rc);
}

START_TEST(test_train_refusals) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65];
  record(c, net, id);
  topos_value loss = topos_network_find(net, "loss");
  topos_optimizer sgd = topos_sgd(0.1, 0.0);

  /* Refused at open: nothing sent, or the daemon's answer. */
  ck_assert_ptr_null(
      topos_client_train_open(NULL, id, loss, NULL, &sgd, NULL, &err));
  ck_assert_ptr_null(
      topos_client_train_open(c, id, TOPOS_NONE, NULL, &sgd, NULL, &err));
  ck_assert_ptr_null(
      topos_client_train_open(c, "xyz", loss, NULL, &sgd, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  char unknown[65];
  memset(unknown, 'a', 64);
  unknown[64] = '\0';
  ck_assert_ptr_null(
      topos_client_train_open(c, unknown, loss, NULL, &sgd, NULL, &err));
  ck_assert_int_eq(topos_client_grpc_status(err.code), 5); /* NOT_FOUND */
  topos_optimizer neg = topos_sgd(-1, 0);
  ck_assert_ptr_null(
      topos_client_train_open(c, id, loss, NULL, &neg, NULL, &err));
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  /* Parameters of another network do not fit the spec: refused at open,
   * not at the first step. */
  topos_network *other = sn_conv();
  topos_params *foreign = topos_network_parameters(other);
  topos_client_args wrong_params = {.params = foreign};
  ck_assert_ptr_null(
      topos_client_train_open(c, id, loss, &wrong_params, &sgd, NULL, &err));
  ck_assert_int_eq(topos_client_grpc_status(err.code), 3);
  topos_params_free(foreign);
  topos_network_release(other);
  topos_feed one[1];
  float_feeds(net, 1, one, 1);
  topos_client_args with_feeds = {.feeds = one, .nfeeds = 1};
  ck_assert_ptr_null(
      topos_client_train_open(c, id, loss, &with_feeds, &sgd, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);

  /* A bad step after two good ones changes nothing. */
  topos_feed f[4][1];
  for (int k = 0; k < 4; k++) float_feeds(net, 700 + k, f[k], 1);
  local_train l;
  topos_client_train *t = train_steps_both(c, net, id, &sgd, f, 2, &l);
  int64_t shape[1] = {7};
  topos_tensor *wrong = tt_random(TOPOS_F64, 1, shape, 9, -1, 1);
  topos_feed bad = {f[0][0].input, wrong};
  ck_assert_int_eq(topos_client_train_send(t, &bad, 1, false, &err), TOPOS_OK);
  expect_refused(t, &l, 2, 3, "wrong shape");
  topos_client_train_free(t);
  /* The same with the client sending on after the bad step, until a send
   * finds the stream over: the last reply is still there to read. */
  local_train_free(&l);
  t = train_steps_both(c, net, id, &sgd, f, 2, &l);
  ck_assert_int_eq(topos_client_train_send(t, &bad, 1, false, &err), TOPOS_OK);
  int rc = TOPOS_OK;
  double until = now_s() + 10;
  while (rc == TOPOS_OK && now_s() < until) {
    usleep(5000);
    rc = topos_client_train_send(t, f[2], 1, false, &err);
  }
  ck_assert_int_eq(topos_client_grpc_status(rc), 3);
  expect_refused(t, &l, 2, 3, "sending on after a wrong shape");
  topos_client_train_free(t);

  /* Several steps in one message: all or none. */
  local_train_free(&l);
  l = local_train_new(net, &sgd);
  t = topos_client_train_open(c, id, loss, NULL, &sgd, NULL, &err);
  ck_assert_ptr_nonnull(t);
  local_train_step(net, loss, &sgd, &l, f[0], 1);
  ck_assert_int_eq(topos_client_train_step(t, f[0], 1, false, NULL, &err),
                   TOPOS_OK);
  topos_feed three[3] = {f[1][0], bad, f[2][0]};
  ck_assert_int_eq(topos_client_train_send_steps(t, three, 1, 3, false, &err),
                   TOPOS_OK);
  expect_refused(t, &l, 1, 3, "steps with a bad one");
  topos_client_train_free(t);
  ck_assert_int_eq(
      topos_client_train_send_steps(NULL, three, 1, 3, false, &err),
      TOPOS_ERR_ARGUMENT);

  /* One-message streams by hand: no `open`, garbage, and an open with a
   * step (its loss is the in-process first step's). */
  Topos__V1__TrainRequest q = TOPOS__V1__TRAIN_REQUEST__INIT;
  q.no_step = true;
  uint8_t buf[64];
  size_t n = topos__v1__train_request__pack(&q, buf);
  int status = 0;
  ck_assert_int_ne(
      topos_client_call_raw(c, "Train", buf, n, 10, NULL, NULL, &status, &err),
      TOPOS_OK);
  ck_assert_int_eq(status, 3);
  ck_assert_ptr_nonnull(strstr(err.message, "open"));
  const uint8_t junk[5] = {0x0a, 0x20, 0xff, 0xff, 0x01};
  ck_assert_int_ne(topos_client_call_raw(c, "Train", junk, sizeof junk, 10,
                                         NULL, NULL, &status, &err),
                   TOPOS_OK);
  ck_assert_int_eq(status, 3);

  /* Abandoned streams give their memory back. */
  for (int k = 0; k < 3; k++) {
    t = topos_client_train_open(c, id, loss, NULL, &sgd, NULL, &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(topos_client_train_send(t, f[3], 1, false, &err),
                     TOPOS_OK);
    topos_client_train_free(t); /* cancelled, never closed */
  }
  until = now_s() + 10;
  while (reserved_bytes(c) != 0 && now_s() < until) usleep(10000);
  ck_assert_int_eq(reserved_bytes(c), 0);
  /* And the daemon serves on. */
  t = topos_client_train_open(c, id, loss, NULL, &sgd, NULL, &err);
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(topos_client_train_close(t, NULL, NULL, &err), TOPOS_OK);
  topos_client_train_free(t);

  topos_tensor_release(wrong);
  for (int k = 0; k < 4; k++) free_feeds(f[k], 1);
  free_feeds(one, 1);
  local_train_free(&l);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

/* Another hold of l's parameters and state (tensors shared: they are
 * immutable). */
static local_train local_train_copy(const local_train *l) {
  topos_error err = {0};
  int n = topos_params_count(l->p);
  topos_tensor *t[16];
  ck_assert_int_le(n, 16);
  for (int i = 0; i < n; i++) t[i] = (topos_tensor *)topos_params_get(l->p, i);
  local_train c = {topos_params_new(n, t, &err), NULL};
  c.s = topos_opt_state_from(topos_opt_state_step(l->s),
                             topos_opt_state_moment(l->s, 0),
                             topos_opt_state_moment(l->s, 1), &err);
  ck_assert(c.p != NULL && c.s != NULL);
  return c;
}

/* sn_mlp's shape with 16384 hidden units: about 0.8 MB of parameters, so
 * a reply with the state (1.6 MB with momentum) outgrows the stream's
 * flow-control window while the client reads nothing. */
static topos_network *wide_mlp(void) {
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_value x = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_F64, 2, SN_S(4, 3), 1, -1, 1), "x");
  topos_value y = topos_name(
      tape, sn_leaf(tape, 2, TOPOS_I32, 1, SN_S(4), 2, 0, 3), "targets");
  enum { H = 16384 };
  topos_value w[2], b[2];
  w[0] = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F64, 2, SN_S(3, H), 3, -0.5, 0.5), "w1");
  b[0] = topos_name(tape, sn_leaf(tape, 1, TOPOS_F64, 1, SN_S(H), 4, 0, 0.1),
                    "b1");
  w[1] = topos_name(
      tape, sn_leaf(tape, 1, TOPOS_F64, 2, SN_S(H, 3), 5, -0.01, 0.01), "w2");
  b[1] = topos_name(tape, sn_leaf(tape, 1, TOPOS_F64, 1, SN_S(3), 6, 0, 0.1),
                    "b2");
  topos_value logits = topos_mlp(tape, x, 2, w, b, TOPOS_ACT_TANH);
  topos_name(tape, topos_cross_entropy(tape, logits, y), "loss");
  return topos_tape_seal(tape, NULL);
}

/* A Train stream of momentum SGD on net (recorded as *id), its n feed
 * sets from seed, and *l the in-process side from the same start. */
static topos_client_train *momentum_stream(topos_client *c,
                                           const topos_network *net,
                                           char id[65], topos_optimizer *mom,
                                           topos_feed (*f)[1], int n,
                                           uint64_t seed, local_train *l) {
  topos_error err = {0};
  record(c, net, id);
  *mom = topos_sgd(0.05, 0.9);
  for (int k = 0; k < n; k++) float_feeds(net, seed + (uint64_t)k, f[k], 1);
  *l = local_train_new(net, mom);
  topos_client_train *t = topos_client_train_open(
      c, id, topos_network_find(net, "loss"), NULL, mom, NULL, &err);
  ck_assert_msg(t != NULL, "%s", err.message);
  return t;
}

/* What momentum_stream made, but the stream. */
static void momentum_free(topos_network *net, topos_feed (*f)[1], int n,
                          local_train *l) {
  for (int k = 0; k < n; k++) free_feeds(f[k], 1);
  local_train_free(l);
  topos_network_release(net);
}

/* Replies backed up: steps asking for the state are sent ahead and
 * nothing is read for a while, so a finished step's reply waits for the
 * one before it; then a bad message among them, whose end waits for the
 * replies before it.  Every reply arrives, in order, with the right
 * state. */
static void train_backed_up(topos_client *c) {
  topos_error err = {0};
  topos_network *net = wide_mlp();
  topos_value loss = topos_network_find(net, "loss");
  char id[65];
  topos_optimizer mom;
  enum { N = 6 };
  topos_feed f[N][1];
  local_train l;
  topos_client_train *t = momentum_stream(c, net, id, &mom, f, N, 1300, &l);
  local_train want[N];
  for (int k = 0; k < N; k++) {
    ck_assert_int_eq(topos_client_train_send(t, f[k], 1, true, &err), TOPOS_OK);
    local_train_step(net, loss, &mom, &l, f[k], 1);
    want[k] = local_train_copy(&l);
    ck_assert(want[k].p != NULL && want[k].s != NULL);
  }
  usleep(300000); /* the daemon runs ahead of the reader meanwhile */
  for (int k = 0; k < N; k++) {
    topos_client_train_reply r;
    ck_assert_msg(topos_client_train_recv(t, &r, &err) == TOPOS_OK, "%s",
                  err.message);
    ck_assert_int_eq(r.steps, k + 1);
    assert_train_state(&want[k], r.params, r.state, "backed up");
    topos_client_train_reply_clear(&r);
  }
  /* Three good steps with the state, one bad, one more good. */
  int64_t shape[1] = {5};
  topos_tensor *wrong = tt_random(TOPOS_F64, 1, shape, 3, -1, 1);
  topos_feed bad = {f[0][0].input, wrong};
  for (int k = 0; k < 5; k++) {
    if (k < 3) local_train_step(net, loss, &mom, &l, f[k], 1);
    ck_assert_int_eq(
        topos_client_train_send(t, k == 3 ? &bad : f[k], 1, k < 3, &err),
        TOPOS_OK);
  }
  usleep(300000);
  for (int k = 0; k < 3; k++)
    ck_assert_int_eq(topos_client_train_recv(t, NULL, &err), TOPOS_OK);
  expect_refused(t, &l, N + 3, 3, "a bad message behind backed-up replies");
  topos_client_train_free(t);
  topos_tensor_release(wrong);
  for (int k = 0; k < N; k++) local_train_free(&want[k]);
  momentum_free(net, f, N, &l);
}

/* Keeps a core busy until *arg turns non-zero: the daemon's threads then
 * run late and in odd orders. */
static void *spin_until(void *arg) {
  _Atomic int *stop = arg;
  while (!atomic_load_explicit(stop, memory_order_relaxed)) {
  }
  return NULL;
}

/* A client that sends far ahead: the daemon reads each next message while
 * a step runs, holds a reply while the one before is still going out,
 * and a refused message among those sent ahead ends the stream where the
 * good ones left it (the ones after it never run).  Then streams dropped
 * with messages still queued in them give everything back. */
/* The daemon's worker threads (named toposd-work*, server/rpc.c): their
 * ids and voluntary context switches (the times each went to sleep), at
 * most max of them; how many were found. */
static int worker_sleeps(int *tid, long *sleeps, int max) {
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)daemon_.pid);
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
  int n = 0;
  struct dirent *e;
  while (n < max && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[600], text[256] = {0};
    snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    bool worker = fgets(text, sizeof text, f) != NULL &&
                  strncmp(text, "toposd-work", 11) == 0;
    fclose(f);
    if (!worker) continue;
    snprintf(path, sizeof path, "%s/%s/status", dir, e->d_name);
    f = fopen(path, "r");
    if (f == NULL) continue;
    long v = -1;
    while (v < 0 && fgets(text, sizeof text, f) != NULL)
      if (sscanf(text, "voluntary_ctxt_switches: %ld", &v) != 1) v = -1;
    fclose(f);
    if (v < 0) continue;
    tid[n] = atoi(e->d_name);
    sleeps[n++] = v;
  }
  closedir(d);
  return n;
}

/* A stream whose next message is read while its step runs keeps to one
 * worker: the worker queues that message as the step ends and takes it
 * itself, so no other worker is woken for it.  (Before, every such
 * message woke a sleeping worker, which found nothing, polled for
 * spin_us and slept again: a futex round and a fifth of a core.)  Four
 * steps a message, two messages in flight: the next message is in long
 * before a step ends. */
START_TEST(test_train_one_worker) {
  enum { MAXW = 64, N = 100, PER = 4 };
  int tid0[MAXW], tid1[MAXW];
  long before[MAXW], after[MAXW];
  int nw = worker_sleeps(tid0, before, MAXW);
  ck_assert_msg(nw >= 1, "no toposd-work thread found");
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = wide_mlp(); /* steps long enough to read ahead */
  topos_value loss = topos_network_find(net, "loss");
  char id[65];
  topos_optimizer mom;
  topos_feed f[PER][1];
  local_train l;
  topos_client_train *t = momentum_stream(c, net, id, &mom, f, PER, 1400, &l);
  topos_feed steps[PER];
  for (int k = 0; k < PER; k++) steps[k] = f[k][0];
  double want[2] = {0};
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < PER; k++)
      want[i % 2] = local_train_step(net, loss, &mom, &l, f[k], 1);
    ck_assert_int_eq(
        topos_client_train_send_steps(t, steps, 1, PER, false, &err), TOPOS_OK);
    if (i == 0) continue;
    topos_client_train_reply r;
    ck_assert_msg(topos_client_train_recv(t, &r, &err) == TOPOS_OK, "%s",
                  err.message);
    ck_assert_int_eq(r.nlosses, PER);
    assert_loss(want[(i - 1) % 2], r.loss, "two in flight", i - 1);
    topos_client_train_reply_clear(&r);
  }
  ck_assert_int_eq(topos_client_train_recv(t, NULL, &err), TOPOS_OK);
  ck_assert_int_eq(topos_client_train_close(t, NULL, NULL, &err), TOPOS_OK);
  topos_client_train_free(t);
  momentum_free(net, f, PER, &l);
  topos_client_close(c);
  ck_assert_int_eq(worker_sleeps(tid1, after, MAXW), nw);
  if (nw < 2) return; /* one worker: nothing to wake */
  /* The quietest worker slept no more than a few times meanwhile. */
  long quietest = -1;
  for (int i = 0; i < nw; i++)
    for (int k = 0; k < nw; k++)
      if (tid1[i] == tid0[k] &&
          (quietest < 0 || after[i] - before[k] < quietest))
        quietest = after[i] - before[k];
  ck_assert_msg(quietest >= 0 && quietest <= N / 5,
                "the quietest of %d workers slept %ld times over %d messages",
                nw, quietest, N);
}
END_TEST

START_TEST(test_train_ahead) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_mlp();
  topos_value loss = topos_network_find(net, "loss");
  char id[65];
  topos_optimizer mom;
  enum { N = 40 };
  topos_feed f[N][1];
  local_train l;
  topos_client_train *t = momentum_stream(c, net, id, &mom, f, N, 1100, &l);
  /* Rounds of 1, 2, 4, ... messages sent before any reply is read. */
  int k = 0;
  for (int round = 1; k + round <= N - 8; round *= 2) {
    double want[N];
    for (int i = 0; i < round; i++) {
      want[i] = local_train_step(net, loss, &mom, &l, f[k + i], 1);
      ck_assert_int_eq(topos_client_train_send(t, f[k + i], 1, false, &err),
                       TOPOS_OK);
    }
    for (int i = 0; i < round; i++) {
      topos_client_train_reply r;
      ck_assert_msg(topos_client_train_recv(t, &r, &err) == TOPOS_OK, "%s",
                    err.message);
      assert_loss(want[i], r.loss, "sent ahead", k + i);
      ck_assert_int_eq(r.steps, k + i + 1);
      topos_client_train_reply_clear(&r);
    }
    k += round;
  }
  /* Thousands of steps with the next sent before the last is read, two
   * threads keeping the cores busy: a finished step's reply may find the
   * one before it still going out (the stream then holds it), in whatever
   * order the threads come to run.  (Before a held reply took the next
   * read with it, a stream that had just stopped reading ahead hung here:
   * 2 runs in 3 under load.) */
  _Atomic int stop = 0;
  pthread_t hog[2];
  for (int h = 0; h < 2; h++)
    ck_assert_int_eq(pthread_create(&hog[h], NULL, spin_until, &stop), 0);
  for (int i = 0; i < 3000; i++) {
    /* Now and then a pause, so the daemon's read ahead is still out when
     * a step ends (it stops reading ahead) and the next two come at once
     * (it starts again). */
    if (i % 7 == 3) usleep(300);
    local_train_step(net, loss, &mom, &l, f[i % 8], 1);
    ck_assert_int_eq(topos_client_train_send(t, f[i % 8], 1, false, &err),
                     TOPOS_OK);
    if (i > 0)
      ck_assert_msg(topos_client_train_recv(t, NULL, &err) == TOPOS_OK, "%s",
                    err.message);
  }
  ck_assert_int_eq(topos_client_train_recv(t, NULL, &err), TOPOS_OK);
  atomic_store(&stop, 1);
  for (int h = 0; h < 2; h++) pthread_join(hog[h], NULL);
  int64_t steps = k + 3000;
  /* Two good, one bad, three more good, all sent ahead. */
  int64_t shape[1] = {5};
  topos_tensor *wrong = tt_random(TOPOS_F64, 1, shape, 3, -1, 1);
  topos_feed bad = {f[0][0].input, wrong};
  for (int i = 0; i < 6; i++) {
    if (i < 2) local_train_step(net, loss, &mom, &l, f[k + i], 1);
    ck_assert_int_eq(
        topos_client_train_send(t, i == 2 ? &bad : f[k + i], 1, false, &err),
        TOPOS_OK);
  }
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(topos_client_train_recv(t, NULL, &err), TOPOS_OK);
  }
  expect_refused(t, &l, steps + 2, 3, "a bad message among those sent ahead");
  topos_client_train_free(t);
  /* Dropped with messages waiting in it, three times over. */
  for (int d = 0; d < 3; d++) {
    t = topos_client_train_open(c, id, loss, NULL, &mom, NULL, &err);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < 8; i++)
      ck_assert_int_eq(topos_client_train_send(t, f[i], 1, false, &err),
                       TOPOS_OK);
    if (d > 0)
      ck_assert_int_eq(topos_client_train_recv(t, NULL, &err), TOPOS_OK);
    topos_client_train_free(t);
  }
  double until = now_s() + 10;
  while (reserved_bytes(c) != 0 && now_s() < until) usleep(10000);
  ck_assert_int_eq(reserved_bytes(c), 0);
  t = topos_client_train_open(c, id, loss, NULL, &mom, NULL, &err);
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(topos_client_train_step(t, f[0], 1, false, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_client_train_close(t, NULL, NULL, &err), TOPOS_OK);
  topos_client_train_free(t);
  topos_tensor_release(wrong);
  train_backed_up(c);
  momentum_free(net, f, N, &l);
  topos_client_close(c);
}
END_TEST

/* Whether the daemon has exited (a zombie, or reaped). */
static bool daemon_exited(void) {
  char path[64], stat[256] = "";
  snprintf(path, sizeof path, "/proc/%d/stat", (int)daemon_.pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return true;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *close = strrchr(stat, ')');
  return close == NULL || close[1] == '\0' || close[2] == 'Z' ||
         close[2] == 'X';
}

/* A drain ends a stream at its next message, with its state. */
START_TEST(test_train_drain) {
  topos_client *c = connect_daemon();
  topos_error err = {0};
  topos_network *net = sn_mlp();
  char id[65];
  record(c, net, id);
  topos_optimizer adam = topos_adam(1e-2, 0.9, 0.999, 1e-8);
  topos_feed f[3][1];
  for (int k = 0; k < 3; k++) float_feeds(net, 900 + k, f[k], 1);
  local_train l;
  topos_client_train *t = train_steps_both(c, net, id, &adam, f, 2, &l);
  ck_assert_int_eq(kill(daemon_.pid, SIGTERM), 0);
  char status[32] = "", version[64];
  double until = now_s() + 10;
  while (strcmp(status, "draining") != 0 && now_s() < until) {
    topos_client_health(c, status, version, &err);
    usleep(10000);
  }
  ck_assert_str_eq(status, "draining");
  /* The open stream held the drain; its next step is refused. */
  ck_assert_int_eq(topos_client_train_send(t, f[2], 1, false, &err), TOPOS_OK);
  expect_refused(t, &l, 2, 14, "draining");
  topos_client_train_free(t);
  /* With the stream over, the daemon exits (well before its grace).  The
   * test runs in a child of the daemon's parent: it sees the exit as a
   * zombie in /proc. */
  until = now_s() + 10;
  while (!daemon_exited() && now_s() < until) usleep(10000);
  ck_assert_msg(daemon_exited(), "toposd did not exit after the stream");
  for (int k = 0; k < 3; k++) free_feeds(f[k], 1);
  local_train_free(&l);
  topos_network_release(net);
  topos_client_close(c);
}
END_TEST

Suite *client_suite(void) {
  Suite *s = suite_create("client");
  TCase *rpc = tcase_create("rpcs");
  tcase_add_unchecked_fixture(rpc, daemon_up, daemon_down);
  tcase_set_timeout(rpc, 180);
  tcase_add_test(rpc, test_health_and_stats);
  tcase_add_test(rpc, test_record_and_describe);
  tcase_add_test(rpc, test_lower_and_emit);
  tcase_add_test(rpc, test_forward_bits);
  tcase_add_test(rpc, test_backward_bits);
  tcase_add_test(rpc, test_step_bits);
  tcase_add_test(rpc, test_trainer_bits);
  tcase_add_test(rpc, test_blobs);
  tcase_add_test(rpc, test_large_tensors);
  tcase_add_test(rpc, test_conformance);
  tcase_add_test(rpc, test_errors);
  tcase_add_test(rpc, test_entry_threads);
  tcase_add_test(rpc, test_one_client_many_threads);
  suite_add_tcase(s, rpc);
  TCase *train = tcase_create("train");
  tcase_add_unchecked_fixture(train, daemon_up, daemon_down);
  tcase_set_timeout(train, 120);
  tcase_add_test(train, test_train_bits);
  tcase_add_test(train, test_train_refusals);
  tcase_add_test(train, test_train_ahead);
  tcase_add_test(train, test_train_drain); /* last: it stops the daemon */
  suite_add_tcase(s, train);
  TCase *ahead = tcase_create("train_read_ahead");
  tcase_add_unchecked_fixture(ahead, daemon_up_reading_ahead,
                              daemon_down_reading_ahead);
  tcase_set_timeout(ahead, 120);
  tcase_add_test(ahead, test_train_bits);
  tcase_add_test(ahead, test_train_refusals);
  tcase_add_test(ahead, test_train_ahead);
  tcase_add_test(ahead, test_train_one_worker);
  tcase_add_test(ahead, test_train_drain);
  suite_add_tcase(s, ahead);

  TCase *tools = tcase_create("tools");
  tcase_add_unchecked_fixture(tools, daemon_up, daemon_down);
  tcase_set_timeout(tools, 600);
  tcase_add_test(tools, test_gradient_descent_remote);
  tcase_add_test(tools, test_makemore_remote);
  tcase_add_test(tools, test_gpt2_remote);
  tcase_add_test(tools, test_cli);
  tcase_add_test(tools, test_cli_save_spec);
  tcase_add_test(tools, test_backends_end_to_end);
  tcase_add_test(tools, test_python_client);
  suite_add_tcase(s, tools);
  return s;
}
