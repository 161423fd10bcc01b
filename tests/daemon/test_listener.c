/*
 * test_listener.c - toposd's front under hostile connections: a flood of
 * idle connections under a small descriptor limit, the connection cap,
 * the idle timeout, a busy connection never shed, compression bombs
 * refused without inflating, health while draining, strict addresses.
 */
#include <arpa/inet.h>
#include <grpc/compression.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "../../server/config.h"
#include "harness.h"
#include "health.pb-c.h"

/* A raw TCP connection to the daemon that sends nothing. */
static int idle_connection(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* True once the daemon closed fd (EOF or reset), within `seconds`; reads
 * and discards what gRPC sent first (its SETTINGS frame). */
static bool closed_by_peer(int fd, double seconds) {
  double until = now_s() + seconds;
  char buf[4096];
  while (now_s() < until) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

/* Health on a fresh channel, retried until `seconds` pass; true once one
 * answers "serving". */
static bool served_within(int port, double seconds) {
  double until = now_s() + seconds;
  while (now_s() < until) {
    client c;
    client_open(&c, port);
    Topos__V1__HealthRequest h = TOPOS__V1__HEALTH_REQUEST__INIT;
    size_t len = 0;
    uint8_t *buf = pack(&h.base, &len);
    reply r;
    call_raw(&c, "Health", buf, len, 1000, &r);
    free(buf);
    bool ok = r.status == GRPC_STATUS_OK;
    reply_clear(&r);
    client_close(&c);
    if (ok) return true;
  }
  return false;
}

static void raise_nofile(void) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

/* Starts a daemon whose descriptor limit is `nofile` (inherited through
 * fork; the test keeps its own). */
static void start_limited(daemon_proc *d, rlim_t nofile,
                          const char *const *extra) {
  struct rlimit mine, low;
  getrlimit(RLIMIT_NOFILE, &mine);
  low = mine;
  low.rlim_cur = nofile;
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  daemon_start(d, extra);
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &mine), 0);
}

/* Descriptor exhaustion: 400 idle connections against a daemon allowed 64
 * descriptors.  gRPC's own listener stopped accepting for good at the
 * first EMFILE; here new clients are served during the flood and after. */
START_TEST(test_descriptor_flood) {
  raise_nofile();
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *extra[] = {"--workers", "1", NULL};
  start_limited(&d, 64, extra);
  grpc_init();
  enum { FLOOD = 400 };
  int fds[FLOOD];
  int opened = 0;
  for (int i = 0; i < FLOOD; i++) {
    fds[i] = idle_connection(d.port);
    if (fds[i] >= 0) opened++;
  }
  ck_assert_int_ge(opened, 300);
  usleep(300000);
  ck_assert_msg(served_within(d.port, 15),
                "no new client served during the flood (log %s)", d.log);
  for (int i = 0; i < FLOOD; i++)
    if (fds[i] >= 0) close(fds[i]);
  ck_assert_msg(served_within(d.port, 15),
                "no new client served after the flood (log %s)", d.log);
  /* And again, a second flood after the first. */
  for (int i = 0; i < FLOOD; i++) fds[i] = idle_connection(d.port);
  ck_assert(served_within(d.port, 15));
  for (int i = 0; i < FLOOD; i++)
    if (fds[i] >= 0) close(fds[i]);
  ck_assert(log_has(&d, "event=shed"));
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* The cap: past --max-connections the longest-silent connection is shed,
 * so idle ones make way for a client that talks. */
START_TEST(test_connection_cap) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *extra[] = {"--max-connections", "8", NULL};
  daemon_start(&d, extra);
  grpc_init();
  enum { IDLE = 20 };
  int fds[IDLE];
  for (int i = 0; i < IDLE; i++) {
    fds[i] = idle_connection(d.port);
    ck_assert_int_ge(fds[i], 0);
    usleep(2000);
  }
  ck_assert(served_within(d.port, 10));
  int shed = 0;
  for (int i = 0; i < IDLE; i++) {
    if (closed_by_peer(fds[i], 0.3)) shed++;
    close(fds[i]);
  }
  ck_assert_msg(shed >= IDLE - 8, "only %d of %d idle connections shed", shed,
                IDLE);
  /* Stats counts them. */
  client c;
  client_open(&c, d.port);
  Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *sr = NULL;
  CALL_OK(&c, "Stats", &q, &topos__v1__stats_reply__descriptor, &sr);
  ck_assert_int_eq(sr->connection_cap, 8);
  ck_assert_int_ge(sr->connections_shed, IDLE - 8);
  ck_assert_int_le(sr->connections, 8);
  wire_message_free(&sr->base);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* The idle timeout closes a connection that says nothing, and leaves one
 * that keeps calling. */
START_TEST(test_idle_timeout) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *extra[] = {"--idle-timeout-ms", "800", NULL};
  daemon_start(&d, extra);
  grpc_init();
  int fd = idle_connection(d.port);
  ck_assert_int_ge(fd, 0);
  client c;
  client_open(&c, d.port);
  double t0 = now_s();
  while (now_s() - t0 < 3) {
    assert_serving(&c);
    usleep(200000);
  }
  ck_assert_msg(closed_by_peer(fd, 3), "a silent connection was kept");
  close(fd);
  assert_serving(&c);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* A connection with a call in flight is never shed, however long the
 * call is silent and however many idle connections push on the cap. */
START_TEST(test_busy_connection_kept) {
  if (skip_slow()) return;
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *extra[] = {"--max-connections", "4", "--idle-timeout-ms", "300",
                         NULL};
  daemon_start(&d, extra);
  grpc_init();
  client c;
  client_open(&c, d.port);
  topos_value out;
  topos_network *net = calibrated_slow_network(1.5, &out, NULL);
  char id[65];
  record(&c, net, id);
  uint8_t *bytes;
  size_t len;
  slow_forward_request(net, out, id, &bytes, &len);
  flood_arg a = {d.port, bytes, len, -1};
  pthread_t th;
  pthread_create(&th, NULL, flood_one, &a);
  wait_run_in_flight(&c, 30);
  client_close(&c);
  int fds[16];
  for (int i = 0; i < 16; i++) fds[i] = idle_connection(d.port);
  pthread_join(th, NULL);
  ck_assert_int_eq(a.status, GRPC_STATUS_OK);
  for (int i = 0; i < 16; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(bytes);
  topos_network_release(net);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* A compressed 256 MiB of zeros (about 256 KiB on the wire) is refused
 * without being inflated: the daemon's peak memory barely moves. */
static void compressed_bomb(grpc_compression_algorithm alg) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, NULL);
  grpc_init();
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", d.port);
  grpc_arg args[2];
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[0].value.integer = -1;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_COMPRESSION_CHANNEL_DEFAULT_ALGORITHM;
  args[1].value.integer = (int)alg;
  grpc_channel_args chargs = {2, args};
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  client c;
  c.ch = grpc_channel_create(target, cr, &chargs);
  grpc_channel_credentials_release(cr);
  c.cq = grpc_completion_queue_create_for_pluck(NULL);
  size_t big = (size_t)256 << 20;
  uint8_t *zeros = calloc(1, big);
  ck_assert_ptr_nonnull(zeros);
  /* A PutBlob-shaped message: field 1 (bytes) of 256 MiB. */
  zeros[0] = 0x0a;
  size_t body = big - 6, v = body;
  int k = 1;
  while (v >= 0x80) {
    zeros[k++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  zeros[k++] = (uint8_t)v;
  long hwm0 = proc_bytes(d.pid, "VmHWM:") / 1024;
  reply r;
  call_raw(&c, "PutBlob", zeros, k + body, 60000, &r);
  free(zeros);
  ck_assert_msg(r.status == GRPC_STATUS_UNIMPLEMENTED,
                "compressed request: status %d (%s)", r.status, r.details);
  reply_clear(&r);
  long hwm1 = proc_bytes(d.pid, "VmHWM:") / 1024;
  ck_assert_msg(hwm1 - hwm0 < 64 * 1024,
                "peak RSS grew %ld kB on a compressed request", hwm1 - hwm0);
  client_close(&c);
  /* Uncompressed calls are served as before. */
  client_open(&c, d.port);
  assert_serving(&c);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}

START_TEST(test_gzip_bomb) {
  compressed_bomb(GRPC_COMPRESS_GZIP);
}
END_TEST

START_TEST(test_deflate_bomb) {
  compressed_bomb(GRPC_COMPRESS_DEFLATE);
}
END_TEST

/* A message over the limit is buffered by gRPC before it is refused; the
 * memory goes back to the system afterwards (it stayed 410 MB higher). */
START_TEST(test_rejected_message_memory_returns) {
  if (skip_slow()) return;
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, NULL);
  grpc_init();
  client c;
  client_open(&c, d.port);
  assert_serving(&c);
  long rss0 = proc_bytes(d.pid, "VmRSS:") / 1024;
  size_t n = ((size_t)512 << 20) + 1;
  uint8_t *big = calloc(1, n);
  ck_assert_ptr_nonnull(big);
  reply r;
  call_raw(&c, "PutBlob", big, n, 0, &r);
  free(big);
  ck_assert_int_eq(r.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  reply_clear(&r);
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator keeps freed memory */
  long rss = 0;
  double until = now_s() + 10;
  do {
    usleep(200000);
    rss = proc_bytes(d.pid, "VmRSS:") / 1024;
  } while (rss - rss0 > 96 * 1024 && now_s() < until);
  ck_assert_msg(rss - rss0 <= 96 * 1024,
                "resident memory stayed %ld kB higher after a refused "
                "512 MiB message",
                rss - rss0);
#else
  (void)rss0;
#endif
  assert_serving(&c);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

static int grpc_health_check(client *c, const char *service, int *serving) {
  Grpc__Health__V1__HealthCheckRequest q =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  q.service = (char *)service;
  Grpc__Health__V1__HealthCheckResponse *resp = NULL;
  reply r;
  int status = call_msg(c, "/grpc.health.v1.Health/Check", &q.base,
                        &grpc__health__v1__health_check_response__descriptor,
                        (void **)&resp, &r);
  reply_clear(&r);
  if (resp) {
    *serving = (int)resp->status;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  return status;
}

/* SIGTERM with a call in flight: health says draining / NOT_SERVING, new
 * work is UNAVAILABLE, the call in flight finishes, the daemon exits 0. */
START_TEST(test_health_while_draining) {
  if (skip_slow()) return;
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *extra[] = {"--grace-ms", "30000", NULL};
  daemon_start(&d, extra);
  grpc_init();
  client c;
  client_open(&c, d.port);
  int st = -1;
  ck_assert_int_eq(grpc_health_check(&c, "", &st), GRPC_STATUS_OK);
  ck_assert_int_eq(
      st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  ck_assert_int_eq(grpc_health_check(&c, "topos.v1.Topos", &st),
                   GRPC_STATUS_OK);
  ck_assert_int_eq(grpc_health_check(&c, "other.Service", &st),
                   GRPC_STATUS_NOT_FOUND);
  topos_value out;
  topos_network *net = calibrated_slow_network(2.0, &out, NULL);
  char id[65];
  record(&c, net, id);
  uint8_t *bytes;
  size_t len;
  slow_forward_request(net, out, id, &bytes, &len);
  flood_arg a = {d.port, bytes, len, -1};
  pthread_t th;
  pthread_create(&th, NULL, flood_one, &a);
  wait_run_in_flight(&c, 30);
  kill(d.pid, SIGTERM);
  for (double until = now_s() + 10;; usleep(10000)) {
    Topos__V1__HealthRequest h = TOPOS__V1__HEALTH_REQUEST__INIT;
    Topos__V1__HealthReply *hr = NULL;
    CALL_OK(&c, "Health", &h, &topos__v1__health_reply__descriptor, &hr);
    bool draining = strcmp(hr->status, "draining") == 0;
    if (!draining) ck_assert_str_eq(hr->status, "serving");
    wire_message_free(&hr->base);
    if (draining) break;
    ck_assert_msg(now_s() < until, "Health never said draining");
  }
  ck_assert_int_eq(grpc_health_check(&c, "", &st), GRPC_STATUS_OK);
  ck_assert_int_eq(
      st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  reply r;
  call_raw(&c, "Forward", bytes, len, 0, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_UNAVAILABLE);
  ck_assert_msg(strstr(r.details, "draining") != NULL, "%s", r.details);
  reply_clear(&r);
  pthread_join(th, NULL);
  ck_assert_int_eq(a.status, GRPC_STATUS_OK);
  client_close(&c);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  free(bytes);
  topos_network_release(net);
  grpc_shutdown();
  daemon_cleanup(&d);
}
END_TEST

/* A listen address is taken as written or refused: no silent fallback to
 * another port, no scheme gRPC would have guessed. */
START_TEST(test_strict_listen) {
  const char *bad[] = {"127.0.0.1:99999", "127.0.0.1:-1",  "127.0.0.1:+80",
                       "127.0.0.1:",      ":8080",         "127.0.0.1:80x",
                       "[::1:80",         "unix:/tmp/x:1", "a b:80",
                       "127.0.0.1:065536"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char host[256], msg[256];
    int port = 0;
    ck_assert_msg(config_split_listen(bad[i], host, sizeof host, &port, msg,
                                      sizeof msg) == -1,
                  "'%s' accepted", bad[i]);
    ck_assert_ptr_nonnull(strstr(msg, "listen"));
  }
  struct {
    const char *text, *host;
    int port;
  } good[] = {{"127.0.0.1:0", "127.0.0.1", 0},
              {"0.0.0.0:50051", "0.0.0.0", 50051},
              {"[::1]:65535", "::1", 65535},
              {"localhost:7000", "localhost", 7000}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    char host[256], msg[256];
    int port = -1;
    ck_assert_int_eq(config_split_listen(good[i].text, host, sizeof host, &port,
                                         msg, sizeof msg),
                     0);
    ck_assert_str_eq(host, good[i].host);
    ck_assert_int_eq(port, good[i].port);
  }
  /* The daemon itself refuses to start (exit 2) on a bad port, before it
   * touches the store. */
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *build = getenv("TOPOS_BUILD");
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "timeout 10 %s/bin/toposd --listen 127.0.0.1:99999 --store %s "
           ">/dev/null 2>&1",
           build && *build ? build : "build", d.store);
  int status = system(cmd);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2,
                "toposd --listen 127.0.0.1:99999: exit %d",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  struct stat st;
  ck_assert_int_ne(stat(d.store, &st), 0);
  daemon_cleanup(&d);
}
END_TEST

Suite *listener_suite(void) {
  Suite *s = suite_create("listener");
  TCase *tc = tcase_create("connections");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_descriptor_flood);
  tcase_add_test(tc, test_connection_cap);
  tcase_add_test(tc, test_idle_timeout);
  tcase_add_test(tc, test_busy_connection_kept);
  tcase_add_test(tc, test_health_while_draining);
  tcase_add_test(tc, test_strict_listen);
  suite_add_tcase(s, tc);
  TCase *bombs = tcase_create("compression");
  tcase_set_timeout(bombs, 180);
  tcase_add_test(bombs, test_gzip_bomb);
  tcase_add_test(bombs, test_deflate_bomb);
  tcase_add_test(bombs, test_rejected_message_memory_returns);
  suite_add_tcase(s, bombs);
  return s;
}
