/*
 * test_tls.c - TLS and client certificates on the gRPC port (issue 15,
 * second slice), against real toposd processes on loopback ports with
 * real SQLite files.  The certificates are made at test time with the
 * `openssl` command (EC P-256 keys, a fraction of a second): a CA, a
 * server certificate for IP:127.0.0.1 and DNS:localhost, a client
 * certificate from the same CA, and a second, unrelated CA with a client
 * certificate of its own.
 *
 *  - a TLS daemon serves a TLS client (Record and Forward), by IP and by
 *    name, from the library's settings, $TOPOS_TLS_CA and the CLI's
 *    --tls-ca; a plain-text client and a client trusting another CA fail
 *    with UNAVAILABLE, at once;
 *  - with --tls-client-ca a certificate from that CA is served, none or
 *    one from the other CA is refused;
 *  - bad files (missing, garbage, a key of another certificate) stop the
 *    daemon at start with a message naming the file;
 *  - a non-loopback address without TLS is refused unless --insecure;
 *    with TLS (from the --config file) it starts;
 *  - tokens and TLS together;
 *  - the HTTP gateway serves HTTPS with the same certificate: keep-alive,
 *    pipelining, 100-continue, bodies and replies of many records, tokens
 *    and the per-address throttle over fresh connections; a plain HTTP
 *    client gets a plain 400, a client trusting another CA is refused, a
 *    silent handshake times out; with --tls-client-ca only a certificate
 *    of that CA is served.
 */
#include "harness.h"
#include "http_client.h"
#include "store.h"
#include "topos_client.h"

#define UNAUTHENTICATED 16
#define UNAVAILABLE 14

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b && *b ? b : "build";
}

/* Certificates in dir: ca.pem, server.pem/.key, client.pem/.key,
 * other-ca.pem, other-client.pem/.key. */
static void make_certs(const char *dir) {
  char script[512];
  snprintf(script, sizeof script, "%s/certs.sh", dir);
  FILE *f = fopen(script, "w");
  ck_assert_ptr_nonnull(f);
  fputs(
      "set -e\n"
      "key() { openssl genpkey -algorithm EC -pkeyopt "
      "ec_paramgen_curve:P-256 -out \"$1\"; }\n"
      "ca() { key $1.key; openssl req -x509 -new -key $1.key "
      "-subj \"/CN=$1\" -days 2 -out $1.pem; }\n"
      "leaf() {\n"
      "  key $1.key\n"
      "  openssl req -new -key $1.key -subj \"/CN=$1\" -out $1.csr\n"
      "  printf '%s\\n' \"$3\" > $1.ext\n"
      "  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key "
      "-CAcreateserial -days 2 -extfile $1.ext -out $1.pem\n"
      "}\n"
      "ca ca\n"
      "ca other-ca\n"
      "leaf server ca 'subjectAltName=IP:127.0.0.1,DNS:localhost'\n"
      "leaf client ca 'extendedKeyUsage=clientAuth'\n"
      "leaf other-client other-ca 'extendedKeyUsage=clientAuth'\n",
      f);
  fclose(f);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cd '%s' && sh certs.sh >certs.log 2>&1", dir);
  int rc = system(cmd);
  ck_assert_msg(rc == 0, "openssl failed making certificates: see %s/certs.log",
                dir);
}

/* dir/name, in a static buffer of 8 rotating slots: for arguments of one
 * call; a path kept longer is copied. */
static const char *in_dir(const daemon_proc *d, const char *name) {
  static char paths[8][400];
  static int next = 0;
  char *p = paths[next++ % 8];
  snprintf(p, 400, "%s/%s", d->dir, name);
  return p;
}

static topos_client *connect_tls(const char *addr, const char *ca,
                                 const char *cert, const char *key) {
  topos_client_tls tls = {ca, cert, key};
  topos_error err = {0};
  topos_client *c = topos_client_connect_tls(addr, &tls, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  topos_client_set_deadline(c, 10);
  return c;
}

static topos_client *connect_port(int port, const char *ca, const char *cert,
                                  const char *key) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  return connect_tls(addr, ca, cert, key);
}

/* Health's gRPC status (0 = served), and how long it took; msg gets the
 * error. */
static int health_status(topos_client *c, double *seconds, char *msg,
                         size_t len) {
  char status[32], version[64];
  topos_error err = {0};
  double t0 = now_s();
  int rc = topos_client_health(c, status, version, &err);
  if (seconds) *seconds = now_s() - t0;
  if (msg) snprintf(msg, len, "%s", rc == TOPOS_OK ? "" : err.message);
  return topos_client_grpc_status(rc);
}

/* The call fails at the transport (UNAVAILABLE) well before its 10 s
 * deadline.  Retries off: a refused handshake and a daemon going away
 * look alike to gRPC (the connection closes), and the client retries
 * those for its retry time (test_replicas.c). */
static void assert_refused(topos_client *c, const char *why) {
  topos_client_set_retry(c, 0);
  double took = 0;
  char msg[600];
  int st = health_status(c, &took, msg, sizeof msg);
  ck_assert_msg(st == UNAVAILABLE, "%s: status %d (%s)", why, st, msg);
  ck_assert_msg(took < 5, "%s: took %.1f s", why, took);
}

/* Record and Forward of a small network; the loss equals the local run. */
static void record_forward(topos_client *c) {
  gd_net g = gd_network(2.5);
  topos_error err = {0};
  char id[65];
  ck_assert_msg(topos_client_record(c, g.net, id, &err) == TOPOS_OK,
                "record: %s", err.message);
  topos_value roots[1] = {g.loss};
  topos_entry e = {.roots = roots, .nroots = 1};
  topos_tensor **rr = NULL;
  ck_assert_msg(topos_client_forward(c, id, &e, NULL, NULL, 0, &rr, NULL,
                                     &err) == TOPOS_OK,
                "forward: %s", err.message);
  topos_run *ref = topos_forward(g.net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(ref);
  ck_assert(topos_tensor_bitwise_equal(rr[0], topos_run_of(ref, g.loss, NULL)));
  topos_client_tensors_free(rr, 1);
  topos_run_free(ref);
  topos_network_release(g.net);
}

/* Runs toposd with args (a shell fragment) and no --listen of the
 * harness's: its exit status, stdout and stderr in out. */
static int toposd_exit(const daemon_proc *d, const char *args, char *out,
                       size_t len) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "timeout 20 %s/bin/toposd --store '%s' --http off %s 2>&1",
           build_dir(), d->store, args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Starts toposd with args (a shell fragment) and waits for its first
 * stdout line: true when it says "toposd listening on"; then stops it
 * with SIGTERM (it must exit 0).  line gets the line. */
static bool toposd_starts(const daemon_proc *d, const char *args, char *line,
                          size_t len) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "exec %s/bin/toposd --store '%s' --http off %s 2>>'%s'", build_dir(),
           d->store, args, d->log);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  size_t n = 0;
  line[0] = '\0';
  double until = now_s() + 30;
  while (n < len - 1 && strchr(line, '\n') == NULL && now_s() < until) {
    struct pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t got = read(fds[0], line + n, len - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
    line[n] = '\0';
  }
  close(fds[0]);
  bool started = strstr(line, "toposd listening on ") != NULL;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  if (started) assert_clean_exit(status, 20);
  return started;
}

/* `topos ARGS` on d's store; exit status (for tenant administration). */
static int run_cli(const daemon_proc *d, const char *args, char *out,
                   size_t outlen) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s/bin/topos --store '%s' %s 2>/dev/null",
           build_dir(), d->store, args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, outlen - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A tenant in d's store, and a token of it in secret. */
static void tenant_with_token(daemon_proc *d, char *secret, size_t len) {
  char var[400], out[512];
  snprintf(var, sizeof var, "%s/var", d->dir);
  mkdir(var, 0700);
  ck_assert_int_eq(run_cli(d, "tenant add alice", out, sizeof out), 0);
  ck_assert_int_eq(run_cli(d, "token create alice", out, sizeof out), 0);
  ck_assert(strncmp(out, "tps_", 4) == 0);
  snprintf(secret, len, "%.*s", STORE_TOKEN_SECRET_LEN, out);
}

START_TEST(test_tls_serves) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  const char *const extra[] = {"--tls-cert", in_dir(&d, "server.pem"),
                               "--tls-key", in_dir(&d, "server.key"), NULL};
  daemon_start(&d, extra);
  ck_assert(log_has(&d, "over TLS"));
  grpc_up();
  char ca[400];
  snprintf(ca, sizeof ca, "%s", in_dir(&d, "ca.pem"));

  /* Verified by IP and by name: Record and Forward work. */
  topos_client *c = connect_port(d.port, ca, NULL, NULL);
  record_forward(c);
  topos_client_close(c);
  char addr[64];
  snprintf(addr, sizeof addr, "localhost:%d", d.port);
  c = connect_tls(addr, ca, NULL, NULL);
  ck_assert_int_eq(health_status(c, NULL, NULL, 0), 0);
  topos_client_close(c);

  /* Plain text against TLS, and a client trusting another CA: refused at
   * the handshake, at once. */
  c = connect_port(d.port, NULL, NULL, NULL);
  assert_refused(c, "plain text client");
  topos_client_close(c);
  c = connect_port(d.port, in_dir(&d, "other-ca.pem"), NULL, NULL);
  assert_refused(c, "client trusting another CA");
  topos_client_close(c);

  /* The environment: topos_client_connect reads $TOPOS_TLS_CA. */
  setenv("TOPOS_TLS_CA", ca, 1);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", d.port);
  topos_error err = {0};
  c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ck_assert_int_eq(health_status(c, NULL, NULL, 0), 0);
  topos_client_close(c);
  /* A CA file that is not there is an error at connect, naming it. */
  setenv("TOPOS_TLS_CA", in_dir(&d, "missing.pem"), 1);
  ck_assert_ptr_null(topos_client_connect(addr, &err));
  ck_assert_msg(
      strstr(err.message, "TOPOS_TLS_CA") && strstr(err.message, "missing.pem"),
      "%s", err.message);
  unsetenv("TOPOS_TLS_CA");
  /* A certificate without a CA: refused too, not sent in clear. */
  topos_client_tls half = {NULL, in_dir(&d, "client.pem"),
                           in_dir(&d, "client.key")};
  ck_assert_ptr_null(topos_client_connect_tls(addr, &half, &err));
  ck_assert_msg(strstr(err.message, "only over TLS"), "%s", err.message);
  grpc_down();

  /* The CLI: --tls-ca, and without it. */
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_TLS_CA %s/bin/topos --server 127.0.0.1:%d --tls-ca "
           "'%s' health >/dev/null 2>&1",
           build_dir(), d.port, ca);
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_TLS_CA %s/bin/topos --server 127.0.0.1:%d --deadline "
           "10 health >/dev/null 2>&1",
           build_dir(), d.port);
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 1);

  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_client_certificates) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  const char *const extra[] = {"--tls-cert",
                               in_dir(&d, "server.pem"),
                               "--tls-key",
                               in_dir(&d, "server.key"),
                               "--tls-client-ca",
                               in_dir(&d, "ca.pem"),
                               NULL};
  daemon_start(&d, extra);
  ck_assert(log_has(&d, "client certificates required"));
  grpc_up();
  char ca[400];
  snprintf(ca, sizeof ca, "%s", in_dir(&d, "ca.pem"));

  topos_client *c = connect_port(d.port, ca, in_dir(&d, "client.pem"),
                                 in_dir(&d, "client.key"));
  record_forward(c);
  topos_client_close(c);

  c = connect_port(d.port, ca, NULL, NULL);
  assert_refused(c, "no client certificate");
  topos_client_close(c);
  c = connect_port(d.port, ca, in_dir(&d, "other-client.pem"),
                   in_dir(&d, "other-client.key"));
  assert_refused(c, "a client certificate from another CA");
  topos_client_close(c);

  /* $TOPOS_TLS_CERT and $TOPOS_TLS_KEY. */
  setenv("TOPOS_TLS_CA", ca, 1);
  setenv("TOPOS_TLS_CERT", in_dir(&d, "client.pem"), 1);
  setenv("TOPOS_TLS_KEY", in_dir(&d, "client.key"), 1);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", d.port);
  topos_error err = {0};
  c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ck_assert_int_eq(health_status(c, NULL, NULL, 0), 0);
  topos_client_close(c);
  unsetenv("TOPOS_TLS_CERT");
  unsetenv("TOPOS_TLS_KEY");
  unsetenv("TOPOS_TLS_CA");
  grpc_down();

  /* The CLI's --tls-cert and --tls-key. */
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s/bin/topos --server 127.0.0.1:%d --tls-ca '%s' --tls-cert '%s' "
           "--tls-key '%s' health >/dev/null 2>&1",
           build_dir(), d.port, ca, in_dir(&d, "client.pem"),
           in_dir(&d, "client.key"));
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);

  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_bad_files) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  char garbage[400];
  snprintf(garbage, sizeof garbage, "%s/garbage.pem", d.dir);
  FILE *f = fopen(garbage, "w");
  fputs(
      "-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
      "-----END CERTIFICATE-----\n",
      f);
  fclose(f);
  struct {
    const char *args, *names, *says;
  } cases[] = {
      {"--tls-cert %s/missing.pem --tls-key %s/server.key", "missing.pem",
       "cannot read it"},
      {"--tls-cert %s/garbage.pem --tls-key %s/server.key", "garbage.pem",
       "certificate"},
      {"--tls-cert %s/server.pem --tls-key %s/garbage.pem", "garbage.pem",
       "no private key"},
      {"--tls-cert %s/server.key --tls-key %s/server.key", "server.key",
       "no certificate"},
      {"--tls-cert %s/server.pem --tls-key %s/client.key", "client.key",
       "does not match"},
      {"--tls-cert %s/server.pem --tls-key %s/server.key --tls-client-ca "
       "%s/garbage.pem",
       "garbage.pem", "tls-client-ca"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char args[1600], out[4096];
    snprintf(args, sizeof args, cases[i].args, d.dir, d.dir, d.dir);
    ck_assert_msg(toposd_exit(&d, args, out, sizeof out) == 1, "%s: %s", args,
                  out);
    ck_assert_msg(strstr(out, cases[i].names) && strstr(out, cases[i].says) &&
                      !strstr(out, "toposd listening"),
                  "%s: %s", args, out);
  }
  /* Half a pair is a usage error. */
  char args[1200], out[4096];
  snprintf(args, sizeof args, "--tls-cert %s/server.pem", d.dir);
  ck_assert_int_eq(toposd_exit(&d, args, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "go together"), "%s", out);
  snprintf(args, sizeof args, "--tls-client-ca %s/ca.pem", d.dir);
  ck_assert_int_eq(toposd_exit(&d, args, out, sizeof out), 2);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_network_needs_tls) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  char secret[80];
  tenant_with_token(&d, secret, sizeof secret);
  char out[4096], line[512];
  /* A tenant but no TLS: refused, saying why and what to do. */
  ck_assert_int_eq(toposd_exit(&d, "--listen 0.0.0.0:0", out, sizeof out), 1);
  ck_assert_msg(strstr(out, "refusing to serve 0.0.0.0:0 without TLS") &&
                    strstr(out, "--tls-cert") && strstr(out, "--insecure"),
                "%s", out);
  /* A non-loopback --http without a certificate: refused too. */
  ck_assert_int_eq(toposd_exit(&d, "--http 0.0.0.0:0", out, sizeof out), 1);
  ck_assert_msg(strstr(out, "refusing to serve 0.0.0.0:0 without TLS") &&
                    strstr(out, "the gateway then serves HTTPS"),
                "%s", out);
  /* With one, the gateway serves HTTPS there: it starts. */
  char args[1600];
  snprintf(args, sizeof args,
           "--listen 127.0.0.1:0 --tls-cert %s/server.pem --tls-key "
           "%s/server.key --http 0.0.0.0:0",
           d.dir, d.dir);
  ck_assert_msg(toposd_starts(&d, args, line, sizeof line), "%s", line);
  ck_assert(log_has(&d, "over TLS (https)"));
  /* --insecure: it starts, and says so in its log. */
  ck_assert_msg(
      toposd_starts(&d, "--listen 0.0.0.0:0 --insecure", line, sizeof line),
      "%s", line);
  ck_assert(log_has(&d, "without TLS (--insecure)"));
  /* TLS from the --config file: it starts. */
  char config[400];
  snprintf(config, sizeof config, "%s/toposd.json", d.dir);
  FILE *f = fopen(config, "w");
  fprintf(f,
          "{\"listen\": \"0.0.0.0:0\", \"tls_cert\": \"%s/server.pem\", "
          "\"tls_key\": \"%s/server.key\", \"insecure\": false}\n",
          d.dir, d.dir);
  fclose(f);
  snprintf(args, sizeof args, "--config '%s'", config);
  ck_assert_msg(toposd_starts(&d, args, line, sizeof line), "%s", line);
  ck_assert(log_has(&d, "over TLS"));
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_tokens_over_tls) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  char secret[80];
  tenant_with_token(&d, secret, sizeof secret);
  const char *const extra[] = {"--tls-cert", in_dir(&d, "server.pem"),
                               "--tls-key", in_dir(&d, "server.key"), NULL};
  daemon_start(&d, extra);
  ck_assert(log_has(&d, "a token is required"));
  grpc_up();
  char ca[400];
  snprintf(ca, sizeof ca, "%s", in_dir(&d, "ca.pem"));
  topos_client *c = connect_port(d.port, ca, NULL, NULL);
  topos_client_stats_info info;
  topos_error err = {0};
  int rc = topos_client_stats(c, &info, &err);
  ck_assert_int_eq(topos_client_grpc_status(rc), UNAUTHENTICATED);
  ck_assert_int_eq(topos_client_set_token(c, secret, &err), TOPOS_OK);
  ck_assert_msg(topos_client_stats(c, &info, &err) == TOPOS_OK, "%s",
                err.message);
  record_forward(c);
  topos_client_close(c);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(!log_has(&d, secret + 4));
  daemon_cleanup(&d);
}
END_TEST

/* ------------------------------------------------------------- gateway */

/* One request on an open connection (token and body optional). */
static void https_request(http_conn *c, const char *method, const char *path,
                          const char *token, const char *ctype,
                          const void *body, size_t len, http_reply *r) {
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s%s%s%s"
                   "Content-Length: %zu\r\n\r\n",
                   method, path, token ? "Authorization: Bearer " : "",
                   token ? token : "", token ? "\r\n" : "",
                   ctype ? "Content-Type: " : "", ctype ? ctype : "",
                   ctype ? "\r\n" : "", len);
  http_conn_send(c, head, (size_t)n);
  if (len) http_conn_send(c, body, len);
  http_read(c, 30, r);
}

/* GET path on a fresh TLS connection; its status. */
static int https_status(int port, const char *ca, const char *path,
                        const char *token, http_reply *r) {
  char err[256];
  http_conn *c = https_open(port, ca, "127.0.0.1", NULL, NULL, err, sizeof err);
  ck_assert_msg(c != NULL, "handshake: %s", err);
  https_request(c, "GET", path, token, NULL, NULL, 0, r);
  http_conn_close(c);
  return r->status;
}

START_TEST(test_https_gateway) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  char secret[80];
  tenant_with_token(&d, secret, sizeof secret);
  const char *const extra[] = {"--tls-cert",
                               in_dir(&d, "server.pem"),
                               "--tls-key",
                               in_dir(&d, "server.key"),
                               "--http-read-timeout-ms",
                               "1000",
                               "--auth-fail-limit",
                               "5",
                               NULL};
  daemon_start(&d, extra);
  ck_assert_int_gt(d.http_port, 0);
  char ca[400];
  snprintf(ca, sizeof ca, "%s", in_dir(&d, "ca.pem"));
  char err[256];
  http_reply r = {0};

  /* Keep-alive: a probe, a reply of many records, tokens. */
  http_conn *c =
      https_open(d.http_port, ca, "127.0.0.1", NULL, NULL, err, sizeof err);
  ck_assert_msg(c != NULL, "handshake: %s", err);
  https_request(c, "GET", "/healthz", NULL, NULL, NULL, 0, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  https_request(c, "GET", "/openapi.json", NULL, NULL, NULL, 0, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_uint_gt(r.body_len, 16384); /* over one TLS record */
  cJSON *doc = cJSON_Parse(r.body);
  ck_assert(cJSON_GetObjectItemCaseSensitive(doc, "openapi") != NULL);
  cJSON_Delete(doc);
  http_reply_clear(&r);
  https_request(c, "GET", "/v1/backends", NULL, NULL, NULL, 0, &r);
  HTTP_ASSERT_ERROR(&r, 401, "UNAUTHENTICATED");
  http_reply_clear(&r);
  https_request(c, "GET", "/v1/backends", secret, NULL, NULL, 0, &r);
  ck_assert_msg(r.status == 200, "%d %s", r.status, r.body);
  http_reply_clear(&r);

  /* A body of many records (3 MB, not JSON at its end): read whole and
   * refused, and the connection goes on. */
  size_t big = (size_t)3 << 20;
  char *body = malloc(big);
  memset(body, ' ', big);
  body[big - 1] = '[';
  https_request(c, "POST", "/v1/specs", secret, "application/json", body, big,
                &r);
  HTTP_ASSERT_ERROR(&r, 400, "INVALID_ARGUMENT");
  ck_assert(!r.closed);
  http_reply_clear(&r);
  free(body);

  /* Pipelining: two requests in one write, two replies in order. */
  const char two[] =
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /v1/specs HTTP/1.1\r\nHost: x\r\n\r\n";
  http_conn_send(c, two, sizeof two - 1);
  http_read(c, 30, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  http_read(c, 30, &r);
  HTTP_ASSERT_ERROR(&r, 401, "UNAUTHENTICATED");
  http_reply_clear(&r);

  /* Expect: 100-continue goes through TLS too. */
  char head[512];
  int n = snprintf(head, sizeof head,
                   "POST /v1/specs HTTP/1.1\r\nHost: x\r\nAuthorization: "
                   "Bearer %s\r\nContent-Type: application/json\r\n"
                   "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n",
                   secret);
  http_conn_send(c, head, (size_t)n);
  http_read(c, 30, &r);
  ck_assert_int_eq(r.status, 100);
  http_reply_clear(&r);
  http_conn_send(c, "[]", 2);
  http_read(c, 30, &r);
  HTTP_ASSERT_ERROR(&r, 400, "INVALID_ARGUMENT");
  http_reply_clear(&r);
  http_conn_close(c);

  /* By name. */
  c = https_open(d.http_port, ca, "localhost", NULL, NULL, err, sizeof err);
  ck_assert_msg(c != NULL, "handshake: %s", err);
  http_conn_close(c);

  /* Trusting another CA, or a name the certificate lacks: refused. */
  c = https_open(d.http_port, in_dir(&d, "other-ca.pem"), "127.0.0.1", NULL,
                 NULL, err, sizeof err);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, "certificate verify failed"), "%s", err);
  c = https_open(d.http_port, ca, "127.0.0.2", NULL, NULL, err, sizeof err);
  ck_assert_ptr_null(c);

  /* Plain HTTP on the HTTPS port: a plain 400 that says so. */
  http_get(d.http_port, "/healthz", &r);
  HTTP_ASSERT_ERROR(&r, 400, "INVALID_ARGUMENT");
  ck_assert_msg(strstr(r.body, "serves HTTPS"), "%s", r.body);
  http_reply_clear(&r);

  /* A client that never says hello is closed at the read timeout. */
  int fd = http_connect(d.http_port);
  double t0 = now_s();
  ck_assert(http_closed(fd, 10));
  double took = now_s() - t0;
  ck_assert_msg(took >= 0.9 && took < 5, "closed after %.2f s", took);
  close(fd);

  /* Failed tokens over fresh connections count against the address:
   * two refusals above (no token) and three here reach the limit of 5,
   * so the next connection, with a good token, is throttled. */
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(https_status(d.http_port, ca, "/v1/backends",
                                  "tps_not_a_token_of_this_daemon", &r),
                     401);
    http_reply_clear(&r);
  }
  https_status(d.http_port, ca, "/v1/backends", secret, &r);
  HTTP_ASSERT_ERROR(&r, 429, "RESOURCE_EXHAUSTED");
  http_reply_clear(&r);

  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(log_has(&d, "over TLS (https)"));
  ck_assert(log_has(&d, "plain HTTP on the HTTPS port"));
  ck_assert(log_has(&d, "refused the handshake"));
  ck_assert(!log_has(&d, secret + 4));
  daemon_cleanup(&d);
}
END_TEST

/* --tls-client-ca on the gateway: a certificate of that CA is served;
 * none, or one of another CA, gets no answer.  The connection cap holds
 * over TLS: at --http-max-connections 2 a third connection sheds the
 * longest idle one.  /metrics counts both. */
START_TEST(test_https_client_certificates) {
  daemon_proc d = {0};
  daemon_dir(&d);
  make_certs(d.dir);
  const char *const extra[] = {"--tls-cert",
                               in_dir(&d, "server.pem"),
                               "--tls-key",
                               in_dir(&d, "server.key"),
                               "--tls-client-ca",
                               in_dir(&d, "ca.pem"),
                               "--http-max-connections",
                               "2",
                               NULL};
  daemon_start(&d, extra);
  char ca[400];
  snprintf(ca, sizeof ca, "%s", in_dir(&d, "ca.pem"));
  char err[256];
  http_reply r = {0};
  http_conn *c =
      https_open(d.http_port, ca, "127.0.0.1", in_dir(&d, "client.pem"),
                 in_dir(&d, "client.key"), err, sizeof err);
  ck_assert_msg(c != NULL, "handshake: %s", err);
  https_request(c, "GET", "/healthz", NULL, NULL, NULL, 0, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  http_conn_close(c);

  const char *certs[2][2] = {
      {NULL, NULL},
      {in_dir(&d, "other-client.pem"), in_dir(&d, "other-client.key")}};
  for (int i = 0; i < 2; i++) {
    /* TLS 1.3 finishes the client's side of the handshake before the
     * server checks its certificate: the refusal may come at the first
     * read instead. */
    c = https_open(d.http_port, ca, "127.0.0.1", certs[i][0], certs[i][1], err,
                   sizeof err);
    if (c == NULL) continue;
    https_request(c, "GET", "/healthz", NULL, NULL, NULL, 0, &r);
    ck_assert_msg(r.status == 0, "certificate %d: served %d", i, r.status);
    http_reply_clear(&r);
    http_conn_close(c);
  }

  http_conn *open[3];
  for (int i = 0; i < 3; i++) {
    open[i] = https_open(d.http_port, ca, "127.0.0.1", in_dir(&d, "client.pem"),
                         in_dir(&d, "client.key"), err, sizeof err);
    ck_assert_msg(open[i] != NULL, "connection %d: %s", i, err);
    usleep(50 * 1000); /* an order of idleness */
  }
  https_request(open[2], "GET", "/metrics", NULL, NULL, NULL, 0, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_msg(
      strstr(r.body, "topos_http_connections_shed_total 1\n") &&
          strstr(r.body, "topos_http_tls_handshake_failures_total 2\n"),
      "%s", r.body);
  http_reply_clear(&r);
  ck_assert(http_closed(open[0]->fd, 5)); /* the one idle longest */
  https_request(open[1], "GET", "/healthz", NULL, NULL, NULL, 0, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  for (int i = 0; i < 3; i++) http_conn_close(open[i]);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(log_has(&d, "refused the handshake"));
  daemon_cleanup(&d);
}
END_TEST

Suite *tls_suite(void) {
  Suite *s = suite_create("tls");
  TCase *tc = tcase_create("tls");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_tls_serves);
  tcase_add_test(tc, test_client_certificates);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_network_needs_tls);
  tcase_add_test(tc, test_tokens_over_tls);
  tcase_add_test(tc, test_https_gateway);
  tcase_add_test(tc, test_https_client_certificates);
  suite_add_tcase(s, tc);
  return s;
}
