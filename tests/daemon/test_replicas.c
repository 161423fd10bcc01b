/*
 * test_replicas.c - training through daemons that go away: the client
 * library retries idempotent calls on UNAVAILABLE and records its specs
 * again where a daemon answers "no spec with id", so a training loop
 *  - rides through toposd being killed and restarted on its port, once on
 *    its own store and once on a fresh one, and
 *  - spread round-robin over three replicas, one killed mid-run,
 * finishes with the bits of an in-process run.  Also the client's words
 * for a daemon it cannot reach, and addresses without a port.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "harness.h"
#include "topos_client.h"

#define STEPS 90

/* The loop under test, on a thread of its own (ck_assert is the main
 * thread's): remote steps of the gradient-descent network, counting. */
typedef struct training {
  topos_client *client;
  const char *id;
  gd_net g;
  _Atomic int steps;
  double w;       /* the result */
  char fail[640]; /* why it stopped early, "" if it did not */
} training;

static const double samples[3][2] = {{1, 2}, {2, 4}, {3, 6}};

/* STEPS SGD steps by tr from the initial parameters; w at the end. */
static int run_steps(topos_trainer *tr, gd_net *g, _Atomic int *count,
                     double *w, char *fail, size_t faillen) {
  topos_error err = {0};
  topos_optimizer opt = topos_sgd(0.02, 0.0);
  topos_step_result cur = {0};
  for (int i = 0; i < STEPS; i++) {
    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, samples[i % 3][0], &err);
    topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, samples[i % 3][1], &err);
    topos_feed feeds[2] = {{g->x, xt}, {g->y, yt}};
    topos_step_result next;
    int rc = topos_trainer_step(tr, cur.params, feeds, 2, &opt, cur.state,
                                &next, &err);
    topos_tensor_release(xt);
    topos_tensor_release(yt);
    if (rc != TOPOS_OK) {
      snprintf(fail, faillen, "step %d: %s", i, err.message);
      topos_step_result_clear(&cur);
      return -1;
    }
    topos_step_result_clear(&cur);
    cur = next;
    if (count) atomic_fetch_add(count, 1);
  }
  int64_t none[1] = {0};
  *w = topos_tensor_get(topos_params_get(cur.params, 0), none, &err);
  topos_step_result_clear(&cur);
  return 0;
}

static void *training_main(void *p) {
  training *t = p;
  topos_error err = {0};
  topos_trainer *tr =
      topos_client_trainer(t->client, t->id, t->g.loss, NULL, &err);
  if (tr == NULL) {
    snprintf(t->fail, sizeof t->fail, "trainer: %s", err.message);
    return NULL;
  }
  run_steps(tr, &t->g, &t->steps, &t->w, t->fail, sizeof t->fail);
  topos_trainer_free(tr);
  return NULL;
}

/* The same steps in-process: the bits to match. */
static double local_w(gd_net *g) {
  topos_error err = {0};
  topos_trainer *tr = topos_trainer_local(g->net, g->loss, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(tr);
  double w = 0;
  char fail[512] = "";
  ck_assert_msg(run_steps(tr, g, NULL, &w, fail, sizeof fail) == 0, "%s", fail);
  topos_trainer_free(tr);
  return w;
}

static void wait_steps(training *t, int n) {
  double until = now_s() + 60;
  while (atomic_load(&t->steps) < n && t->fail[0] == '\0' && now_s() < until)
    usleep(1000);
  ck_assert_msg(atomic_load(&t->steps) >= n, "stuck at step %d: %s",
                atomic_load(&t->steps), t->fail);
}

/* kill -9, then wait for the process. */
static void daemon_kill(daemon_proc *d) {
  kill(d->pid, SIGKILL);
  int status = 0;
  waitpid(d->pid, &status, 0);
  d->pid = 0;
}

START_TEST(test_restart_mid_training) {
  gd_net g = gd_network(0);
  double want = local_w(&g);
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, NULL);
  int port = d.port;
  char addr[64], listen[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  const char *const same_port[] = {"--listen", listen, NULL};
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_ptr_nonnull(c);
  char id[65];
  ck_assert_int_eq(topos_client_record(c, g.net, id, &err), 0);
  training t = {.client = c, .id = id, .g = g};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, training_main, &t), 0);

  /* A restart on the same store: the steps wait and go on. */
  wait_steps(&t, 20);
  daemon_kill(&d);
  usleep(300 * 1000);
  daemon_start(&d, same_port);
  /* A restart on a fresh store: the spec is recorded again. */
  wait_steps(&t, 50);
  daemon_kill(&d);
  daemon_proc fresh;
  memset(&fresh, 0, sizeof fresh);
  daemon_dir(&fresh);
  usleep(300 * 1000);
  daemon_start(&fresh, same_port);
  pthread_join(th, NULL);
  ck_assert_msg(t.fail[0] == '\0', "training stopped: %s", t.fail);
  ck_assert_int_eq(atomic_load(&t.steps), STEPS);
  ck_assert_msg(memcmp(&t.w, &want, sizeof want) == 0,
                "w %a through restarts, %a in-process", t.w, want);
  /* The fresh daemon holds the spec now. */
  topos_client_stats_info st;
  ck_assert_int_eq(topos_client_stats(c, &st, &err), 0);
  ck_assert_int_eq(st.specs, 1);
  topos_client_close(c);
  assert_clean_exit(daemon_stop(&fresh, SIGTERM, 30), 30);
  daemon_cleanup(&fresh);
  daemon_cleanup(&d);
  topos_network_release(g.net);
}
END_TEST

START_TEST(test_three_replicas_one_killed) {
  gd_net g = gd_network(0);
  double want = local_w(&g);
  daemon_proc r[3];
  char addr[256] = "";
  for (int i = 0; i < 3; i++) {
    memset(&r[i], 0, sizeof r[i]);
    daemon_dir(&r[i]);
    daemon_start(&r[i], NULL);
    size_t n = strlen(addr);
    snprintf(addr + n, sizeof addr - n, "%s127.0.0.1:%d", i ? "," : "",
             r[i].port);
  }
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  char id[65];
  ck_assert_int_eq(topos_client_record(c, g.net, id, &err), 0);
  training t = {.client = c, .id = id, .g = g};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, training_main, &t), 0);
  wait_steps(&t, 30);
  daemon_kill(&r[1]);
  pthread_join(th, NULL);
  ck_assert_msg(t.fail[0] == '\0', "training stopped: %s", t.fail);
  ck_assert_msg(memcmp(&t.w, &want, sizeof want) == 0,
                "w %a over replicas, %a in-process", t.w, want);
  topos_client_close(c);
  /* Both survivors served steps (round-robin) and so hold the spec,
   * recorded by the client on the one that lacked it. */
  for (int i = 0; i < 3; i += 2) {
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", r[i].port);
    topos_client *s = topos_client_connect(one, &err);
    ck_assert_ptr_nonnull(s);
    topos_client_stats_info st;
    ck_assert_int_eq(topos_client_stats(s, &st, &err), 0);
    ck_assert_msg(st.specs == 1 && st.requests > STEPS / 4,
                  "replica %d: %lld specs, %lld requests", i,
                  (long long)st.specs, (long long)st.requests);
    topos_client_close(s);
    assert_clean_exit(daemon_stop(&r[i], SIGTERM, 30), 30);
  }
  for (int i = 0; i < 3; i++) daemon_cleanup(&r[i]);
  topos_network_release(g.net);
}
END_TEST

/* The bytes of a file (malloc'd), *n its size. */
static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(size > 0 ? (size_t)size : 1);
  *n = fread(b, 1, size > 0 ? (size_t)size : 0, f);
  fclose(f);
  return b;
}

/* Starts makemore_mlp against port, saving its checkpoint to save;
 * returns its pid (output to log). */
static pid_t makemore_start(int port, const char *save, const char *log) {
  const char *build = getenv("TOPOS_BUILD");
  char bin[512], server[64];
  snprintf(bin, sizeof bin, "%s/examples/makemore_mlp",
           build && *build ? build : "build");
  snprintf(server, sizeof server, "127.0.0.1:%d", port);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execl(bin, bin, "--server", server, "--steps", "1500", "--no-progress",
          "--save", save, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int wait_exit(pid_t pid) {
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The requests a daemon has answered (Stats), -1 when it does not answer. */
static int64_t requests_of(int port) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_ptr_nonnull(c);
  topos_client_set_retry(c, 0);
  topos_client_stats_info st;
  int64_t n = topos_client_stats(c, &st, &err) == TOPOS_OK ? st.requests : -1;
  topos_client_close(c);
  return n;
}

/* The makemore MLP example, run remotely, is killed out from under: its
 * daemon gets SIGKILL mid-run and a new one starts on the same port with
 * a fresh store.  The example finishes, and its checkpoint is byte for
 * byte the one of a run that was never interrupted. */
START_TEST(test_example_survives_restart) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, NULL);
  char listen[64], want[400], got[400], log[400];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", d.port);
  snprintf(want, sizeof want, "%s/want.safetensors", d.dir);
  snprintf(got, sizeof got, "%s/got.safetensors", d.dir);
  snprintf(log, sizeof log, "%s/makemore.log", d.dir);
  ck_assert_int_eq(wait_exit(makemore_start(d.port, want, log)), 0);
  int64_t base = requests_of(d.port);

  pid_t pid = makemore_start(d.port, got, log);
  double until = now_s() + 120;
  while (requests_of(d.port) < base + 300 && now_s() < until) usleep(2000);
  daemon_kill(&d);
  daemon_proc fresh;
  memset(&fresh, 0, sizeof fresh);
  daemon_dir(&fresh);
  usleep(300 * 1000);
  daemon_start(&fresh, (const char *const[]){"--listen", listen, NULL});
  int rc = wait_exit(pid);
  ck_assert_msg(rc == 0, "makemore_mlp exited %d (log %s)", rc, log);
  size_t nw = 0, ng = 0;
  uint8_t *w = slurp(want, &nw), *g = slurp(got, &ng);
  ck_assert_msg(nw == ng && memcmp(w, g, nw) == 0,
                "the checkpoint after the restart differs (%zu vs %zu bytes)",
                ng, nw);
  free(w);
  free(g);
  /* The fresh daemon served the rest: the spec was recorded on it. */
  ck_assert_int_gt(requests_of(fresh.port), 0);
  assert_clean_exit(daemon_stop(&fresh, SIGTERM, 30), 30);
  daemon_cleanup(&fresh);
  daemon_cleanup(&d);
}
END_TEST

/* A daemon that is not there, in words, after the retries; retries off
 * answer at once; an address without its port is refused up front. */
START_TEST(test_unreachable_in_words) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &len);
  char addr[64], want[128];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  close(fd); /* nothing listens there now */
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_ptr_nonnull(c);
  topos_client_set_retry(c, 0.5);
  double t0 = now_s();
  ck_assert_int_ne(topos_client_health(c, NULL, NULL, &err), 0);
  double took = now_s() - t0;
  snprintf(want, sizeof want, "cannot reach toposd at %s: connection refused",
           addr);
  ck_assert_str_eq(err.message, want);
  ck_assert_int_eq(topos_client_grpc_status(err.code), 14); /* UNAVAILABLE */
  /* 50 + 100 ms of backoff at least (the next wait would pass 0.5 s). */
  ck_assert_msg(took >= 0.14 && took < 10, "retried for %.2f s", took);
  topos_client_set_retry(c, 0);
  t0 = now_s();
  ck_assert_int_ne(topos_client_health(c, NULL, NULL, &err), 0);
  ck_assert_msg(now_s() - t0 < 0.3, "no retry took %.2f s", now_s() - t0);
  topos_client_close(c);

  static const char *const bad[] = {"127.0.0.1", "localhost:", "[::1]",
                                    "127.0.0.1:1,127.0.0.1", "host:port"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ck_assert_ptr_null(topos_client_connect(bad[i], &err));
    ck_assert_msg(strstr(err.message, "needs HOST:PORT") != NULL, "%s: %s",
                  bad[i], err.message);
  }
}
END_TEST

Suite *replicas_suite(void) {
  Suite *s = suite_create("replicas");
  TCase *tc = tcase_create("replicas");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_restart_mid_training);
  tcase_add_test(tc, test_three_replicas_one_killed);
  tcase_add_test(tc, test_example_survives_restart);
  tcase_add_test(tc, test_unreachable_in_words);
  suite_add_tcase(s, tc);
  return s;
}
