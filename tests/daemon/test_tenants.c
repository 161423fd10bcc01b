/*
 * test_tenants.c - tenants and bearer tokens (issue 15, first slice),
 * against real toposd processes on loopback ports with real SQLite files,
 * administered with the built `topos` program:
 *
 *  - a daemon with tenants refuses calls without a token, with a garbage
 *    token and with a token revoked while it runs (the next call fails),
 *    and accepts valid tokens of two tenants; health probes need none;
 *  - TOPOS_TOKEN is picked up by the client library, --token by the CLI;
 *  - the HTTP gateway answers 401 (JSON body, WWW-Authenticate) without a
 *    valid token and 200 with one; /healthz stays open;
 *  - the CLI adds, lists and removes tenants, creates, lists and revokes
 *    tokens, and the store file never holds a secret;
 *  - without tenants a non-loopback --listen or --http is refused;
 *  - a first tenant added (and removed) on the file while the daemon runs
 *    switches tokens on (and off) from the next call;
 *  - what one token lookup costs (printed).
 */
#include <sys/resource.h>

#include "http_client.h"
#include "store.h"
#include "tenant_util.h"
#include "topos_client.h"

/* A new token of tenant: its secret (the CLI's stdout, one line). */
static void token_create(const char *store, const char *tenant,
                         char secret[STORE_TOKEN_SECRET_LEN + 1],
                         char id[STORE_TOKEN_ID_LEN + 1]) {
  char args[128], out[512], err[1024];
  snprintf(args, sizeof args, "token create %s", tenant);
  ck_assert_int_eq(run_cli(store, args, out, sizeof out, err, sizeof err), 0);
  ck_assert_int_eq((int)strlen(out), STORE_TOKEN_SECRET_LEN + 1);
  ck_assert(strncmp(out, "tps_", 4) == 0);
  memcpy(secret, out, STORE_TOKEN_SECRET_LEN);
  secret[STORE_TOKEN_SECRET_LEN] = '\0';
  /* stderr: "topos: token ID created for tenant ..." and the audit line. */
  const char *p = strstr(err, "topos: token ");
  ck_assert_ptr_nonnull(p);
  memcpy(id, p + 13, STORE_TOKEN_ID_LEN);
  id[STORE_TOKEN_ID_LEN] = '\0';
  ck_assert_ptr_nonnull(strstr(err, "action=token.create"));
  ck_assert_ptr_null(strstr(err, secret));
}

/* The store's directory (the daemon creates it; the CLI does not). */
static void store_dir(daemon_proc *d) {
  char var[400];
  snprintf(var, sizeof var, "%s/var", d->dir);
  mkdir(var, 0700);
}

/* Whether any file of the store (database, WAL) holds `needle`. */
static bool store_bytes_hold(const char *store, const char *needle) {
  static const char *const suffix[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char path[400];
    snprintf(path, sizeof path, "%s%s", store, suffix[i]);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc(size > 0 ? (size_t)size : 1);
    size_t n = fread(bytes, 1, size > 0 ? (size_t)size : 0, f);
    fclose(f);
    bool found = memmem(bytes, n, needle, strlen(needle)) != NULL;
    free(bytes);
    if (found) return true;
  }
  return false;
}

#define UNAUTHENTICATED 16

START_TEST(test_tokens_on_grpc) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  char out[4096], err[4096];
  ck_assert_int_eq(run_cli(d.store, "tenant add alice --admin", out, sizeof out,
                           err, sizeof err),
                   0);
  ck_assert_int_eq(
      run_cli(d.store, "tenant add bob", out, sizeof out, err, sizeof err), 0);
  char ta[80], tb[80], ida[20], idb[20];
  token_create(d.store, "alice", ta, ida);
  token_create(d.store, "bob", tb, idb);
  daemon_start(&d, NULL);
  ck_assert(log_has(&d, "auth: 2 tenants; a token is required"));
  grpc_up();

  /* No token: probes answer, work does not. */
  topos_client *none = connect_with(d.port, NULL);
  char status[32], version[64], msg[600];
  topos_error e = {0};
  ck_assert_int_eq(topos_client_health(none, status, version, &e), TOPOS_OK);
  ck_assert_int_eq(stats_status(none, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_msg(strstr(msg, "requires a token") && strstr(msg, "Bearer"), "%s",
                msg);
  client raw;
  client_open(&raw, d.port);
  reply r;
  call_raw(&raw, "Backends", "", 0, 0, &r);
  ck_assert_int_eq(r.status, UNAUTHENTICATED);
  reply_clear(&r);
  call_raw(&raw, "/grpc.health.v1.Health/Check", "", 0, 0, &r);
  ck_assert_int_eq(r.status, 0);
  reply_clear(&r);
  client_close(&raw);

  /* Garbage, and a well-formed token this daemon never issued. */
  topos_client *garbage = connect_with(d.port, "garbage");
  ck_assert_int_eq(stats_status(garbage, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_msg(strstr(msg, "not one this daemon knows"), "%s", msg);
  char forged[80];
  snprintf(forged, sizeof forged, "%s", ta);
  forged[10] = forged[10] == 'a' ? 'b' : 'a';
  topos_client *other = connect_with(d.port, forged);
  ck_assert_int_eq(stats_status(other, msg, sizeof msg), UNAUTHENTICATED);

  /* Both tenants' tokens work. */
  topos_client *a = connect_with(d.port, ta);
  topos_client *b = connect_with(d.port, tb);
  ck_assert_int_eq(stats_status(a, msg, sizeof msg), 0);
  ck_assert_int_eq(stats_status(b, msg, sizeof msg), 0);
  topos_backend_info *backends = NULL;
  int nb = 0;
  ck_assert_int_eq(topos_client_backends(b, &backends, &nb, &e), TOPOS_OK);
  ck_assert_int_gt(nb, 0);
  free(backends);

  /* Revoke bob's token while the daemon runs: the next call fails. */
  char args[128];
  snprintf(args, sizeof args, "token revoke %s", idb);
  ck_assert_int_eq(run_cli(d.store, args, out, sizeof out, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "action=token.revoke"));
  ck_assert_int_eq(stats_status(b, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_msg(strstr(msg, "was revoked") && strstr(msg, idb), "%s", msg);
  ck_assert_int_eq(stats_status(a, msg, sizeof msg), 0);

  /* A second token for bob works at once (rotation). */
  char tb2[80], idb2[20];
  token_create(d.store, "bob", tb2, idb2);
  ck_assert_int_eq(topos_client_set_token(b, tb2, &e), TOPOS_OK);
  ck_assert_msg(stats_status(b, msg, sizeof msg) == 0, "%s", msg);

  /* TOPOS_TOKEN is the library's default. */
  setenv("TOPOS_TOKEN", ta, 1);
  topos_client *env = connect_with(d.port, NULL);
  unsetenv("TOPOS_TOKEN");
  ck_assert_int_eq(stats_status(env, msg, sizeof msg), 0);
  /* A token with a space or newline is refused by the library. */
  ck_assert_int_ne(topos_client_set_token(env, "tps_a b", &e), TOPOS_OK);
  ck_assert_int_eq(stats_status(env, msg, sizeof msg), 0);

  /* The CLI: --token, and without one. */
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s/bin/topos --server 127.0.0.1:%d --token %s stats >/dev/null "
           "2>&1",
           build_dir(), d.port, ta);
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_TOKEN %s/bin/topos --server 127.0.0.1:%d stats "
           ">/dev/null 2>&1",
           build_dir(), d.port);
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 1);

  /* Removing a tenant removes its tokens. */
  ck_assert_int_eq(
      run_cli(d.store, "tenant remove bob", out, sizeof out, err, sizeof err),
      0);
  ck_assert_int_eq(stats_status(b, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_int_eq(stats_status(a, msg, sizeof msg), 0);

  topos_client_close(none);
  topos_client_close(garbage);
  topos_client_close(other);
  topos_client_close(a);
  topos_client_close(b);
  topos_client_close(env);
  grpc_down();

  /* The audit lines name the peer and never a secret. */
  ck_assert(log_has(&d, "event=auth msg=\"refused Stats from ipv4:127.0.0.1:"));
  ck_assert(log_has(&d, "(grpc): revoked token "));
  ck_assert(!log_has(&d, ta + 4));
  ck_assert(!log_has(&d, tb + 4));
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(!store_bytes_hold(d.store, ta + 4));
  ck_assert(!store_bytes_hold(d.store, tb + 4));
  ck_assert(!store_bytes_hold(d.store, tb2 + 4));
  daemon_cleanup(&d);
}
END_TEST

/* GET with an Authorization header (NULL: none). */
static void http_get_auth(int port, const char *path, const char *authz,
                          http_reply *r) {
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(port);
  ck_assert_int_ge(c->fd, 0);
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s\r\n", path,
                   authz ? "Authorization: " : "", authz ? authz : "",
                   authz ? "\r\n" : "");
  http_send_all(c->fd, head, (size_t)n);
  http_read(c, 30, r);
  close(c->fd);
  free(c);
}

START_TEST(test_tokens_on_http) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  ck_assert_int_eq(run_cli(d.store, "tenant add carol", NULL, 0, NULL, 0), 0);
  char tc[80], idc[20];
  token_create(d.store, "carol", tc, idc);
  daemon_start(&d, NULL);
  ck_assert_int_gt(d.http_port, 0);
  http_reply r = {0};
  http_get_auth(d.http_port, "/v1/backends", NULL, &r);
  HTTP_ASSERT_ERROR(&r, 401, "UNAUTHENTICATED");
  char v[256];
  ck_assert_str_eq(http_header(&r, "WWW-Authenticate", v, sizeof v),
                   "Bearer realm=\"toposd\"");
  http_reply_clear(&r);
  http_get_auth(d.http_port, "/v1/specs", "Bearer tps_0000", &r);
  HTTP_ASSERT_ERROR(&r, 401, "UNAUTHENTICATED");
  http_reply_clear(&r);
  http_get_auth(d.http_port, "/metrics", "Basic YWxhZGRpbjpvcGVu", &r);
  HTTP_ASSERT_ERROR(&r, 401, "UNAUTHENTICATED");
  ck_assert_ptr_nonnull(strstr(r.body, "not 'Bearer TOKEN'"));
  http_reply_clear(&r);
  char authz[128];
  snprintf(authz, sizeof authz, "Bearer %s", tc);
  http_get_auth(d.http_port, "/v1/backends", authz, &r);
  ck_assert_msg(r.status == 200, "%d %s", r.status, r.body);
  http_reply_clear(&r);
  /* The scheme is case-insensitive. */
  snprintf(authz, sizeof authz, "bearer %s", tc);
  http_get_auth(d.http_port, "/v1/specs", authz, &r);
  ck_assert_msg(r.status == 200, "%d %s", r.status, r.body);
  http_reply_clear(&r);
  /* Probes and the API description need no token. */
  http_get_auth(d.http_port, "/healthz", NULL, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  http_get_auth(d.http_port, "/readyz", NULL, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  ck_assert(log_has(&d, "(http): missing"));
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_cli_admin) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  char out[4096], err[4096];
  /* Only tenant add creates a store. */
  ck_assert_int_eq(
      run_cli(d.store, "tenant list", out, sizeof out, err, sizeof err), 1);
  ck_assert_ptr_nonnull(strstr(err, "no store at"));
  ck_assert_int_eq(
      run_cli(d.store, "tenant add Bad-Name", out, sizeof out, err, sizeof err),
      2);
  ck_assert_int_eq(run_cli(d.store, "tenant add team-a_1 --admin", out,
                           sizeof out, err, sizeof err),
                   0);
  ck_assert_ptr_nonnull(
      strstr(err, "action=tenant.add tenant=team-a_1 admin=1"));
  ck_assert_int_eq(
      run_cli(d.store, "tenant add team-b", out, sizeof out, err, sizeof err),
      0);
  ck_assert_int_eq(
      run_cli(d.store, "tenant add team-b", out, sizeof out, err, sizeof err),
      1);
  ck_assert_ptr_nonnull(strstr(err, "already exists"));
  char t1[80], id1[20], t2[80], id2[20];
  token_create(d.store, "team-b", t1, id1);
  token_create(d.store, "team-b", t2, id2);
  ck_assert_str_ne(t1, t2);
  ck_assert_int_eq(
      run_cli(d.store, "token create nobody", out, sizeof out, err, sizeof err),
      1);
  ck_assert_int_eq(
      run_cli(d.store, "tenant list", out, sizeof out, err, sizeof err), 0);
  ck_assert_msg(
      strstr(out, "team-a_1") && strstr(out, "yes") && strstr(out, "team-b"),
      "%s", out);
  char args[128];
  snprintf(args, sizeof args, "token revoke %s", id1);
  ck_assert_int_eq(run_cli(d.store, args, out, sizeof out, err, sizeof err), 0);
  ck_assert_int_eq(
      run_cli(d.store, "token list team-b", out, sizeof out, err, sizeof err),
      0);
  ck_assert_msg(strstr(out, id1) && strstr(out, id2) && strstr(out, "revoked"),
                "%s", out);
  ck_assert_ptr_null(strstr(out, "tps_"));
  ck_assert_int_eq(run_cli(d.store, "token revoke 0123456789abcdef", out,
                           sizeof out, err, sizeof err),
                   1);
  ck_assert_int_eq(run_cli(d.store, "tenant remove nobody", out, sizeof out,
                           err, sizeof err),
                   1);
  ck_assert_int_eq(run_cli(d.store, "tenant remove team-b", out, sizeof out,
                           err, sizeof err),
                   0);
  ck_assert_int_eq(
      run_cli(d.store, "token list team-b", out, sizeof out, err, sizeof err),
      1);
  ck_assert(!store_bytes_hold(d.store, t1 + 4));
  ck_assert(!store_bytes_hold(d.store, t2 + 4));
  daemon_cleanup(&d);
}
END_TEST

/* Starts toposd with args on a fresh store, expecting it to refuse:
 * returns its exit status, its output in out. */
static int toposd_refusal(const char *store, const char *args, char *out,
                          size_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "timeout 20 %s/bin/toposd --store '%s' %s 2>&1",
           build_dir(), store, args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(test_loopback_rule) {
  daemon_proc d = {0};
  daemon_dir(&d);
  char out[4096];
  ck_assert_int_eq(
      toposd_refusal(d.store, "--listen 0.0.0.0:0 --http off", out, sizeof out),
      1);
  ck_assert_msg(
      strstr(out, "not a loopback address") && strstr(out, "no tenants") &&
          strstr(out, "topos tenant add") && strstr(out, "topos token create"),
      "%s", out);
  ck_assert_int_eq(
      toposd_refusal(d.store, "--listen 127.0.0.1:0 --http 0.0.0.0:0", out,
                     sizeof out),
      1);
  ck_assert_ptr_nonnull(strstr(out, "refusing to serve 0.0.0.0:0"));
  ck_assert_int_eq(
      toposd_refusal(d.store, "--listen [::]:0 --http off", out, sizeof out),
      1);
  ck_assert_ptr_nonnull(strstr(out, "not a loopback address"));
  /* Loopback without tenants: served as before, no token asked. */
  daemon_start(&d, NULL);
  ck_assert(log_has(&d, "no token required (loopback only)"));
  grpc_up();
  topos_client *c = connect_with(d.port, "tps_whatever");
  ck_assert_int_eq(stats_status(c, NULL, 0), 0);
  topos_client_close(c);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* Repeated failures from one address (--auth-fail-limit 3): the fourth
 * call, even with a valid token, is refused RESOURCE_EXHAUSTED for 1 s
 * without its token being looked at; after that the valid token works;
 * a second block lasts twice as long.  The refusals are audit lines. */
START_TEST(test_auth_failures_throttled) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  char out[4096], err[4096];
  ck_assert_int_eq(
      run_cli(d.store, "tenant add alice", out, sizeof out, err, sizeof err),
      0);
  char ta[80], ida[20];
  token_create(d.store, "alice", ta, ida);
  const char *extra[] = {"--auth-fail-limit", "3", NULL};
  daemon_start(&d, extra);
  grpc_up();
  topos_client *bad = connect_with(d.port, "tps_not_a_token_of_this_daemon");
  topos_client *good = connect_with(d.port, ta);
  char msg[600];
  ck_assert_int_eq(stats_status(good, msg, sizeof msg), 0);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(stats_status(bad, msg, sizeof msg), UNAUTHENTICATED);
  /* blocked: even the valid token, and the bad one no longer reaches the
   * lookup */
  ck_assert_int_eq(stats_status(good, msg, sizeof msg), 8);
  ck_assert_msg(strstr(msg, "too many failed authentications from 127.0.0.1"),
                "%s", msg);
  ck_assert_int_eq(stats_status(bad, msg, sizeof msg), 8);
  usleep(1100 * 1000);
  ck_assert_int_eq(stats_status(good, msg, sizeof msg), 0);
  /* a second block within the minute: 2 s */
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(stats_status(bad, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_int_eq(stats_status(good, msg, sizeof msg), 8);
  long left = 0;
  const char *p = strstr(msg, "refused for ");
  ck_assert_ptr_nonnull(p);
  left = strtol(p + 12, NULL, 10);
  ck_assert_msg(left > 1500 && left <= 2000, "%s", msg);
  /* health probes are never throttled */
  char status[32], version[64];
  topos_error e = {0};
  ck_assert_int_eq(topos_client_health(bad, status, version, &e), TOPOS_OK);
  topos_client_close(bad);
  topos_client_close(good);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(log_has(&d, "throttled"));
  daemon_cleanup(&d);
}
END_TEST

/* A daemon started without tenants answers calls without a token; the
 * CLI adds the first tenant on the file while it runs, and the very next
 * call needs a token; the CLI removes it again, and the next call is free
 * again.  The "is there any tenant" check runs on a connection of the
 * checker's own with its statement prepared once (auth.c), so this is
 * the check that it sees another process's commits, both ways. */
START_TEST(test_first_tenant_while_running) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  daemon_start(&d, NULL);
  grpc_up();
  topos_client *none = connect_with(d.port, NULL);
  char msg[600];
  for (int i = 0; i < 20; i++) /* the statement, stepped and reset */
    ck_assert_int_eq(stats_status(none, msg, sizeof msg), 0);
  char out[4096], err[4096];
  ck_assert_int_eq(run_cli(d.store, "tenant add zed --admin", out, sizeof out,
                           err, sizeof err),
                   0);
  ck_assert_int_eq(stats_status(none, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_msg(strstr(msg, "requires a token"), "%s", msg);
  char tz[80], idz[20];
  token_create(d.store, "zed", tz, idz);
  topos_client *z = connect_with(d.port, tz);
  ck_assert_int_eq(stats_status(z, msg, sizeof msg), 0);
  ck_assert_int_eq(stats_status(none, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_int_eq(
      run_cli(d.store, "tenant remove zed", out, sizeof out, err, sizeof err),
      0);
  ck_assert_int_eq(stats_status(none, msg, sizeof msg), 0);
  topos_client_close(z);
  topos_client_close(none);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* One lookup, measured on a store with 1000 tokens: the daemon pays this
 * once per call. */
START_TEST(test_lookup_cost) {
  daemon_proc d = {0};
  daemon_dir(&d);
  store_dir(&d);
  topos_error err = {0};
  topos_store *st = store_open(d.store, &err);
  ck_assert_msg(st != NULL, "%s", err.message);
  ck_assert_int_eq(store_tenant_add(st, "t", false, &err), TOPOS_OK);
  char id[20], secret[80], last[80];
  for (int i = 0; i < 1000; i++) {
    ck_assert_int_eq(store_token_create(st, "t", id, secret, &err), TOPOS_OK);
    if (i == 500) memcpy(last, secret, sizeof secret);
  }
  store_token_info info;
  int n = 20000;
  double t0 = now_s();
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(store_token_lookup(st, last, &info, &err), TOPOS_OK);
  double hit = (now_s() - t0) / n * 1e6;
  t0 = now_s();
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(store_token_lookup(st, "tps_nope", &info, &err),
                     TOPOS_ERR_NOT_FOUND);
  double miss = (now_s() - t0) / n * 1e6;
  int64_t count = 0;
  t0 = now_s();
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(store_tenant_count(st, &count, &err), TOPOS_OK);
  double counted = (now_s() - t0) / n * 1e6;
  fprintf(stderr,
          "tenants: token lookup %.2f us (hit), %.2f us (miss); tenant "
          "count %.2f us\n",
          hit, miss, counted);
  ck_assert_str_eq(info.tenant, "");
  ck_assert(hit < 500 && miss < 500);
  store_close(st);
  daemon_cleanup(&d);
}
END_TEST

Suite *tenants_suite(void) {
  Suite *s = suite_create("tenants");
  TCase *tc = tcase_create("tenants");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_tokens_on_grpc);
  tcase_add_test(tc, test_tokens_on_http);
  tcase_add_test(tc, test_cli_admin);
  tcase_add_test(tc, test_loopback_rule);
  tcase_add_test(tc, test_auth_failures_throttled);
  tcase_add_test(tc, test_first_tenant_while_running);
  tcase_add_test(tc, test_lookup_cost);
  suite_add_tcase(s, tc);
  return s;
}
