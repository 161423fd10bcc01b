/*
 * test_options.c - toposd's hygiene as an operator meets it: strict
 * option parsing with one clear line per mistake, addresses bound before
 * the store is touched (a port in use leaves no store file), log levels
 * and request-line sampling, and systemd's notifications (READY=1,
 * WATCHDOG=1, STOPPING=1 on $NOTIFY_SOCKET), each against a real toposd.
 */
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "harness.h"
#include "topos_client.h"

/* Each mistake is one line naming it, exit status 2. */
static void assert_refused(const char *const *args, const char *want) {
  char out[4096];
  int rc = run_toposd(args, out, sizeof out);
  ck_assert_msg(rc == 2, "toposd %s: exit %d, want 2 (%s)", args[0], rc, out);
  ck_assert_msg(strstr(out, want) != NULL, "toposd %s said '%s', want '%s'",
                args[0], out, want);
  ck_assert_msg(strchr(out, '\n') == strrchr(out, '\n'),
                "more than one line: '%s'", out);
}

START_TEST(test_strict_options) {
  assert_refused((const char *const[]){"--bogus", NULL},
                 "toposd: unknown option '--bogus' (see --help)");
  assert_refused((const char *const[]){"--bogus", "1", NULL},
                 "toposd: unknown option '--bogus' (see --help)");
  assert_refused((const char *const[]){"--bogus=1", NULL},
                 "unknown option '--bogus'");
  assert_refused((const char *const[]){"--max_message_bytes", "1", NULL},
                 "unknown option '--max_message_bytes'");
  assert_refused((const char *const[]){"--listen", NULL},
                 "toposd: --listen needs a value");
  assert_refused((const char *const[]){"--workers", "many", NULL},
                 "--workers: 'many' is not in 1..1024");
  assert_refused((const char *const[]){"--log-level", "loud", NULL},
                 "--log-level: 'loud' is not debug, info, warn or error");
  assert_refused((const char *const[]){"--log-requests", "sample:0", NULL},
                 "'sample:0' is not all, errors, sample:N");
  assert_refused((const char *const[]){"stray", NULL},
                 "unexpected argument 'stray'");
  char out[16384];
  ck_assert_int_eq(
      run_toposd((const char *const[]){"--version", NULL}, out, sizeof out), 0);
  char want[64];
  snprintf(want, sizeof want, "toposd %s\n", TOPOS_VERSION);
  ck_assert_str_eq(out, want);
  ck_assert_int_eq(
      run_toposd((const char *const[]){"--help", NULL}, out, sizeof out), 0);
  ck_assert(strstr(out, "--log-level LEVEL") != NULL);
  ck_assert(strstr(out, "--log-requests WHICH") != NULL);
}
END_TEST

/* A TCP socket listening on 127.0.0.1, its port in *port. */
static int occupy_port(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* Either address in use: exit 1, one line naming it, no store directory
 * made (the store lies in a directory of its own that must not appear). */
START_TEST(test_port_in_use_leaves_no_store) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  int port = 0;
  int fd = occupy_port(&port);
  char busy[64], store[400], out[8192], want[128];
  snprintf(busy, sizeof busy, "127.0.0.1:%d", port);
  snprintf(store, sizeof store, "%s/store/topos.db", d.dir);
  for (int which = 0; which < 2; which++) {
    const char *args[] = {"--listen", which == 0 ? busy : "127.0.0.1:0",
                          "--http",   which == 1 ? busy : "off",
                          "--store",  store,
                          NULL};
    int rc = run_toposd(args, out, sizeof out);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, out);
    snprintf(want, sizeof want, "toposd: %scannot listen on %s: %s\n",
             which == 1 ? "http: " : "", busy, strerror(EADDRINUSE));
    ck_assert_str_eq(out, want);
    struct stat st;
    char dir[420];
    snprintf(dir, sizeof dir, "%s/store", d.dir);
    ck_assert_msg(stat(dir, &st) != 0, "the store's directory was made");
  }
  close(fd);
  daemon_cleanup(&d);
}
END_TEST

/* Lines of the log holding every needle (NULL-terminated). */
static int log_count(const daemon_proc *d, const char *const *needles) {
  FILE *f = fopen(d->log, "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    bool all = true;
    for (int i = 0; needles[i] && all; i++)
      all = strstr(line, needles[i]) != NULL;
    n += all;
  }
  fclose(f);
  return n;
}

/* nok Health calls and nbad Describes of an id nobody stored. */
static void make_calls(const daemon_proc *d, int nok, int nbad) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", d->port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_ptr_nonnull(c);
  for (int i = 0; i < nok; i++)
    ck_assert_int_eq(topos_client_health(c, NULL, NULL, &err), 0);
  char id[65];
  memset(id, 'a', 64);
  id[64] = '\0';
  for (int i = 0; i < nbad; i++) {
    char *text = NULL;
    ck_assert_int_ne(
        topos_client_describe(c, id, TOPOS_FORMAT_TEXT, &text, &err), 0);
  }
  topos_client_close(c);
}

START_TEST(test_log_sampling_and_levels) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, (const char *const[]){"--log-requests", "sample:3", NULL});
  make_calls(&d, 9, 2);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  /* One OK line in three, each saying so; every failure. */
  ck_assert_int_eq(
      log_count(&d, (const char *const[]){"event=request", "status=OK", NULL}),
      3);
  ck_assert_int_eq(
      log_count(&d, (const char *const[]){"event=request", "status=OK",
                                          "sample=3", "level=info", NULL}),
      3);
  ck_assert_int_eq(
      log_count(&d, (const char *const[]){"level=warn", "event=request",
                                          "status=NOT_FOUND", NULL}),
      2);
  ck_assert_int_eq(
      log_count(&d, (const char *const[]){"level=info", "event=start", NULL}),
      log_count(&d, (const char *const[]){"event=start", NULL}));
  daemon_cleanup(&d);

  /* errors only, at warn: no info line at all, the failures still. */
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, (const char *const[]){"--log-requests", "errors",
                                         "--log-level", "warn", NULL});
  make_calls(&d, 4, 2);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  ck_assert_int_eq(log_count(&d, (const char *const[]){"level=info", NULL}), 0);
  ck_assert_int_eq(log_count(&d, (const char *const[]){"status=OK", NULL}), 0);
  ck_assert_int_eq(
      log_count(&d, (const char *const[]){"status=NOT_FOUND", NULL}), 2);
  daemon_cleanup(&d);

  /* --log-level error drops refusals too; none drops every request. */
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, (const char *const[]){"--log-level", "error", NULL});
  make_calls(&d, 2, 2);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  ck_assert_int_eq(log_count(&d, (const char *const[]){"event=request", NULL}),
                   0);
  daemon_cleanup(&d);
}
END_TEST

/* Datagrams on a socket standing in for systemd's: READY=1 once serving
 * (with the address), WATCHDOG=1 about every half of WATCHDOG_USEC, and
 * STOPPING=1 when SIGTERM starts the drain. */
START_TEST(test_sd_notify) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  /* sun_path holds 108 bytes: the harness's directory fits (TMPDIR/
   * toposd-test-XXXXXX). */
  ck_assert_uint_lt(strlen(d.dir) + sizeof "/notify", sizeof a.sun_path);
  memcpy(a.sun_path, d.dir, strlen(d.dir));
  memcpy(a.sun_path + strlen(d.dir), "/notify", sizeof "/notify");
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  setenv("NOTIFY_SOCKET", a.sun_path, 1);
  setenv("WATCHDOG_USEC", "200000", 1);
  daemon_start(&d, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  int ready = 0, watchdog = 0, stopping = 0;
  char want_status[64];
  snprintf(want_status, sizeof want_status, "STATUS=serving on 127.0.0.1:%d",
           d.port);
  bool signalled = false;
  double start = now_s(), until = start + 20;
  while (now_s() < until && !stopping) {
    /* 1.2 s of pings at 100 ms, then the drain. */
    if (!signalled && ready && now_s() - start > 1.2) {
      kill(d.pid, SIGTERM);
      signalled = true;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char msg[512];
    ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
    if (n <= 0) continue;
    msg[n] = '\0';
    if (strstr(msg, "READY=1")) {
      ready++;
      ck_assert_msg(strstr(msg, want_status) != NULL, "READY says '%s'", msg);
    }
    if (strstr(msg, "WATCHDOG=1")) {
      ck_assert_msg(ready, "a watchdog ping before READY=1");
      watchdog++;
    }
    if (strstr(msg, "STOPPING=1")) stopping++;
  }
  close(fd);
  ck_assert_int_eq(ready, 1);
  ck_assert_msg(watchdog >= 4, "%d watchdog pings in 1.2 s", watchdog);
  ck_assert_int_eq(stopping, 1);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

Suite *options_suite(void) {
  Suite *s = suite_create("options");
  TCase *tc = tcase_create("options");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_strict_options);
  tcase_add_test(tc, test_port_in_use_leaves_no_store);
  tcase_add_test(tc, test_log_sampling_and_levels);
  tcase_add_test(tc, test_sd_notify);
  suite_add_tcase(s, tc);
  return s;
}
