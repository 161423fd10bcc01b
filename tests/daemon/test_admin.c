/*
 * test_admin.c - administration through the daemon (issue 15, item 1: the
 * Admin* RPCs), against real toposd processes on loopback ports with real
 * SQLite files:
 *
 *  - an admin adds a tenant and a token through the daemon and that token
 *    works at once; a revocation through the daemon is in effect from the
 *    next call; removing a tenant takes its token with it;
 *  - a non-admin tenant's admin calls (all eight) are PERMISSION_DENIED
 *    with the message saying why, and the store is unchanged afterwards;
 *  - unknown tenants and tokens are NOT_FOUND, bad names, ids and quotas
 *    INVALID_ARGUMENT, a taken name ALREADY_EXISTS, and the last live
 *    admin token can be neither revoked nor removed (FAILED_PRECONDITION);
 *  - a quota set through the daemon is enforced from the next call, and
 *    cleared the same way;
 *  - the built `topos` through the daemon (--server, --token; and
 *    $TOPOS_SERVER) prints what it prints on the store file, the secret
 *    once on stdout, with the same exit statuses;
 *  - a daemon without tenants takes admin calls from anyone, but its first
 *    tenant must be an admin with a token, which turns auth on;
 *  - every admin call is one event=audit line naming the caller and its
 *    peer, never a secret.
 */
#include "harness.h"
#include "store.h"
#include "tenant_util.h"
#include "topos_client.h"

#define NOT_FOUND 5
#define ALREADY_EXISTS 6
#define PERMISSION_DENIED 7
#define RESOURCE_EXHAUSTED 8
#define FAILED_PRECONDITION 9
#define INVALID_ARGUMENT 3
#define UNAUTHENTICATED 16

/* The store's directory (the daemon creates it; the CLI does not). */
static void store_dir(const daemon_proc *d) {
  char var[400];
  snprintf(var, sizeof var, "%s/var", d->dir);
  mkdir(var, 0700);
}

/* The gRPC status of a client call's result. */
#define STATUS(rc) topos_client_grpc_status(rc)

#define ASSERT_STATUS(call, want, err)                                      \
  do {                                                                      \
    int got_ = STATUS(call);                                                \
    ck_assert_msg(got_ == (want), "%s: status %d, not %d: %s", #call, got_, \
                  (want), (err).message);                                   \
  } while (0)

/* Runs the built `topos ARGS` (a shell fragment) with TOPOS_STORE,
 * TOPOS_SERVER, TOPOS_TOKEN and TOPOS_TLS_CA unset, then `env` (assignments,
 * "" for none) set; stdout into out, stderr into err.  Returns the exit
 * status. */
static int run_topos(const char *dir, const char *env, const char *args,
                     char *out, size_t outlen, char *err, size_t errlen) {
  char errfile[400], cmd[2048];
  snprintf(errfile, sizeof errfile, "%s/topos-stderr", dir);
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_STORE -u TOPOS_SERVER -u TOPOS_TOKEN -u TOPOS_TLS_CA "
           "%s %s/bin/topos %s 2>'%s'",
           env, build_dir(), args, errfile);
  return run_captured(cmd, errfile, out, outlen, err, errlen);
}

/* A daemon over a store with an admin tenant `ops` and a plain tenant
 * `alice`, each with a token (made on the file, the way an operator
 * starts). */
typedef struct box {
  daemon_proc d;
  char ops[80], alice[80];
} box;

static void box_start(box *b) {
  memset(b, 0, sizeof *b);
  daemon_dir(&b->d);
  store_dir(&b->d);
  tenant_with_token(b->d.store, "ops", true, b->ops);
  tenant_with_token(b->d.store, "alice", false, b->alice);
  daemon_start(&b->d, NULL);
  grpc_up();
}

static void box_stop(box *b) {
  grpc_down();
  assert_clean_exit(daemon_stop(&b->d, SIGTERM, 20), 20);
  /* No secret ever reaches the log. */
  ck_assert(!log_has(&b->d, b->ops + 4));
  ck_assert(!log_has(&b->d, b->alice + 4));
  daemon_cleanup(&b->d);
}

/* What the store holds, read on the file: tenant names and live tokens,
 * one "name:admin:live" per tenant, and alice's quotas. */
static void store_snapshot(const char *store, char *out, size_t len) {
  topos_error err = {0};
  topos_store *st = store_open(store, &err);
  ck_assert_msg(st != NULL, "%s", err.message);
  store_tenant_info *rows = NULL;
  int n = 0;
  ck_assert_int_eq(store_tenant_list(st, &rows, &n, &err), TOPOS_OK);
  size_t at = 0;
  for (int i = 0; i < n && at < len; i++)
    at += (size_t)snprintf(out + at, len - at, "%s:%d:%lld ", rows[i].name,
                           rows[i].admin, (long long)rows[i].live_tokens);
  free(rows);
  store_quota q;
  if (at < len && store_quota_get(st, "alice", &q, NULL, &err) == TOPOS_OK) {
    char line[400];
    store_quota_format(&q, line, sizeof line);
    snprintf(out + at, len - at, "alice: %s", line);
  }
  store_close(st);
}

START_TEST(test_admin_tenants_and_tokens) {
  box b;
  box_start(&b);
  topos_client *ops = connect_with(b.d.port, b.ops);
  topos_error err = {0};
  char msg[600];

  /* A tenant and a token through the daemon: the token works at once. */
  topos_client_tenant t;
  ck_assert_int_eq(
      topos_client_tenant_add(ops, "bob", false, &t, NULL, NULL, &err),
      TOPOS_OK);
  ck_assert_str_eq(t.name, "bob");
  ck_assert(!t.admin);
  ck_assert_int_gt(t.created_ms, 0);
  topos_client_token tok;
  char secret[TOPOS_CLIENT_SECRET_LEN + 1];
  ck_assert_int_eq(topos_client_token_create(ops, "bob", &tok, secret, &err),
                   TOPOS_OK);
  ck_assert_int_eq((int)strlen(secret), TOPOS_CLIENT_SECRET_LEN);
  ck_assert(strncmp(secret, "tps_", 4) == 0);
  ck_assert_str_eq(tok.tenant, "bob");
  ck_assert_int_eq((int)strlen(tok.id), TOPOS_CLIENT_TOKEN_ID_LEN);
  ck_assert_int_eq(tok.revoked_ms, 0);
  topos_client *bob = connect_with(b.d.port, secret);
  ck_assert_msg(stats_status(bob, msg, sizeof msg) == 0, "%s", msg);

  /* A tenant with its first token in one call. */
  char carol_secret[TOPOS_CLIENT_SECRET_LEN + 1];
  topos_client_token carol_tok;
  ck_assert_int_eq(topos_client_tenant_add(ops, "carol", true, &t, &carol_tok,
                                           carol_secret, &err),
                   TOPOS_OK);
  ck_assert(t.admin);
  ck_assert_int_eq(t.live_tokens, 1);
  ck_assert_str_eq(carol_tok.tenant, "carol");
  topos_client *carol = connect_with(b.d.port, carol_secret);
  ck_assert_msg(stats_status(carol, msg, sizeof msg) == 0, "%s", msg);

  /* Listings. */
  topos_client_tenant *tenants = NULL;
  int n = 0;
  ck_assert_int_eq(topos_client_tenant_list(ops, &tenants, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 4);
  ck_assert_str_eq(tenants[0].name, "alice");
  ck_assert_str_eq(tenants[1].name, "bob");
  ck_assert_str_eq(tenants[2].name, "carol");
  ck_assert_str_eq(tenants[3].name, "ops");
  ck_assert(tenants[3].admin && !tenants[1].admin);
  ck_assert_int_eq(tenants[1].live_tokens, 1);
  free(tenants);
  topos_client_token *tokens = NULL;
  ck_assert_int_eq(topos_client_token_list(ops, "bob", &tokens, &n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(tokens[0].id, tok.id);
  free(tokens);

  /* A non-admin tenant: every admin call is PERMISSION_DENIED and
   * changes nothing. */
  char before[2048], after[2048];
  store_snapshot(b.d.store, before, sizeof before);
  topos_client *alice = connect_with(b.d.port, b.alice);
  char s2[TOPOS_CLIENT_SECRET_LEN + 1];
  topos_client_token t2;
  topos_client_quota q = topos_client_quota_none();
  q.inflight = 1;
  ASSERT_STATUS(
      topos_client_tenant_add(alice, "mallory", true, NULL, &t2, s2, &err),
      PERMISSION_DENIED, err);
  ck_assert_msg(strstr(err.message,
                       "PERMISSION_DENIED: AdminTenantAdd: tenant alice is "
                       "not an admin; administration needs an admin "
                       "tenant's token"),
                "%s", err.message);
  fprintf(stderr, "admin: %s\n", err.message);
  ASSERT_STATUS(topos_client_tenant_list(alice, &tenants, &n, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_tenant_remove(alice, "bob", NULL, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_token_create(alice, "alice", NULL, s2, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_token_list(alice, "bob", &tokens, &n, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_token_revoke(alice, tok.id, NULL, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_quota_set(alice, "alice", &q,
                                       TOPOS_CLIENT_QUOTA_INFLIGHT, NULL, &err),
                PERMISSION_DENIED, err);
  ASSERT_STATUS(topos_client_quota_show(alice, "alice", &q, &err),
                PERMISSION_DENIED, err);
  store_snapshot(b.d.store, after, sizeof after);
  ck_assert_str_eq(before, after);
  ck_assert_msg(stats_status(bob, msg, sizeof msg) == 0, "%s", msg);
  ck_assert(log_has(&b.d,
                    "action=tenant.add tenant=mallory admin=1 by=alice "
                    "peer=ipv4:127.0.0.1:"));
  ck_assert(log_has(&b.d, "status=PERMISSION_DENIED"));

  /* Unknown tenants and tokens: NOT_FOUND. */
  ASSERT_STATUS(topos_client_token_create(ops, "nobody", NULL, s2, &err),
                NOT_FOUND, err);
  ck_assert_msg(strstr(err.message, "no tenant nobody"), "%s", err.message);
  ASSERT_STATUS(topos_client_token_list(ops, "nobody", &tokens, &n, &err),
                NOT_FOUND, err);
  ASSERT_STATUS(topos_client_tenant_remove(ops, "nobody", NULL, &err),
                NOT_FOUND, err);
  ASSERT_STATUS(topos_client_token_revoke(ops, "0123456789abcdef", NULL, &err),
                NOT_FOUND, err);
  ASSERT_STATUS(topos_client_quota_show(ops, "nobody", &q, &err), NOT_FOUND,
                err);
  ASSERT_STATUS(topos_client_quota_set(ops, "nobody", &q,
                                       TOPOS_CLIENT_QUOTA_INFLIGHT, NULL, &err),
                NOT_FOUND, err);

  /* Bad names, ids and quotas: INVALID_ARGUMENT; a taken name:
   * ALREADY_EXISTS. */
  ASSERT_STATUS(
      topos_client_tenant_add(ops, "Bad-Name", false, NULL, NULL, NULL, &err),
      INVALID_ARGUMENT, err);
  ck_assert_msg(strstr(err.message, "is not"), "%s", err.message);
  ASSERT_STATUS(topos_client_tenant_add(ops, "", false, NULL, NULL, NULL, &err),
                INVALID_ARGUMENT, err);
  char long_name[80];
  memset(long_name, 'a', 65);
  long_name[65] = '\0';
  ASSERT_STATUS(
      topos_client_tenant_add(ops, long_name, false, NULL, NULL, NULL, &err),
      INVALID_ARGUMENT, err);
  ASSERT_STATUS(topos_client_token_list(ops, "a b", &tokens, &n, &err),
                INVALID_ARGUMENT, err);
  ASSERT_STATUS(topos_client_token_revoke(ops, "xyz", NULL, &err),
                INVALID_ARGUMENT, err);
  ck_assert_msg(strstr(err.message, "16 lowercase hex digits"), "%s",
                err.message);
  q = topos_client_quota_none();
  q.inflight = -3;
  ASSERT_STATUS(topos_client_quota_set(ops, "alice", &q,
                                       TOPOS_CLIENT_QUOTA_INFLIGHT, NULL, &err),
                INVALID_ARGUMENT, err);
  q = topos_client_quota_none();
  q.rate_per_s = 5; /* without its burst */
  ASSERT_STATUS(topos_client_quota_set(ops, "alice", &q,
                                       TOPOS_CLIENT_QUOTA_RATE, NULL, &err),
                INVALID_ARGUMENT, err);
  ck_assert_msg(strstr(err.message, "go together"), "%s", err.message);
  q.weight = 1001;
  ASSERT_STATUS(topos_client_quota_set(ops, "alice", &q,
                                       TOPOS_CLIENT_QUOTA_WEIGHT, NULL, &err),
                INVALID_ARGUMENT, err);
  ASSERT_STATUS(topos_client_quota_set(ops, "alice", &q, 0, NULL, &err),
                INVALID_ARGUMENT, err);
  ASSERT_STATUS(
      topos_client_tenant_add(ops, "alice", false, NULL, NULL, NULL, &err),
      ALREADY_EXISTS, err);
  ck_assert_msg(strstr(err.message, "tenant alice already exists"), "%s",
                err.message);
  store_snapshot(b.d.store, after, sizeof after);
  ck_assert_msg(strstr(after, "alice: stored_bytes=none inflight=none"), "%s",
                after);

  /* A revocation through the daemon: refused from the next call. */
  topos_client_token revoked;
  ck_assert_msg(
      topos_client_token_revoke(ops, tok.id, &revoked, &err) == TOPOS_OK, "%s",
      err.message);
  ck_assert_int_gt(revoked.revoked_ms, 0);
  ck_assert_int_eq(stats_status(bob, msg, sizeof msg), UNAUTHENTICATED);
  ck_assert_msg(strstr(msg, "was revoked") && strstr(msg, tok.id), "%s", msg);
  /* Again: no change, the first time stays. */
  topos_client_token again;
  ck_assert_int_eq(topos_client_token_revoke(ops, tok.id, &again, &err),
                   TOPOS_OK);
  ck_assert_int_eq(again.revoked_ms, revoked.revoked_ms);
  char line[200];
  snprintf(
      line, sizeof line,
      "action=token.revoke token=%s tenant=bob by=ops peer=ipv4:127.0.0.1:",
      tok.id);
  ck_assert(log_has(&b.d, line));

  /* The last live admin token: neither revoked nor removed.  ops and
   * carol are admins: carol's token goes first, then ops alone holds
   * one. */
  ck_assert_int_eq(topos_client_token_revoke(ops, carol_tok.id, NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(stats_status(carol, msg, sizeof msg), UNAUTHENTICATED);
  tokens = NULL;
  ck_assert_int_eq(topos_client_token_list(ops, "ops", &tokens, &n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(n, 1);
  char ops_id[20];
  snprintf(ops_id, sizeof ops_id, "%s", tokens[0].id);
  free(tokens);
  ASSERT_STATUS(topos_client_token_revoke(ops, ops_id, NULL, &err),
                FAILED_PRECONDITION, err);
  ck_assert_msg(strstr(err.message, "last live admin token"), "%s",
                err.message);
  fprintf(stderr, "admin: %s\n", err.message);
  ASSERT_STATUS(topos_client_tenant_remove(ops, "ops", NULL, &err),
                FAILED_PRECONDITION, err);
  fprintf(stderr, "admin: %s\n", err.message);
  ck_assert_msg(stats_status(ops, msg, sizeof msg) == 0, "%s", msg);
  /* With a second admin token, ops may remove itself: its token stops
   * at the next call. */
  ck_assert_int_eq(
      topos_client_token_create(ops, "carol", NULL, carol_secret, &err),
      TOPOS_OK);
  ck_assert_int_eq(topos_client_set_token(carol, carol_secret, &err), TOPOS_OK);
  topos_client_tenant gone;
  ck_assert_int_eq(topos_client_tenant_remove(ops, "ops", &gone, &err),
                   TOPOS_OK);
  ck_assert(gone.admin);
  ck_assert_int_eq(stats_status(ops, msg, sizeof msg), UNAUTHENTICATED);
  /* Removing a tenant takes its tokens (bob: revoked already; alice). */
  ck_assert_int_eq(topos_client_tenant_remove(carol, "alice", NULL, &err),
                   TOPOS_OK);
  ck_assert_int_eq(stats_status(alice, msg, sizeof msg), UNAUTHENTICATED);
  store_snapshot(b.d.store, after, sizeof after);
  ck_assert_msg(strncmp(after, "bob:0:0 carol:1:1 alice:", 24) == 0, "%s",
                after);

  topos_client_close(ops);
  topos_client_close(bob);
  topos_client_close(carol);
  topos_client_close(alice);
  ck_assert(!log_has(&b.d, secret + 4));
  ck_assert(!log_has(&b.d, carol_secret + 4));
  box_stop(&b);
}
END_TEST

/* A quota set through the daemon applies from the tenant's next call, and
 * clearing it the same way lifts it. */
START_TEST(test_admin_quota_enforced) {
  box b;
  box_start(&b);
  topos_client *ops = connect_with(b.d.port, b.ops);
  topos_client *alice = connect_with(b.d.port, b.alice);
  topos_error err = {0};
  char msg[600];
  ck_assert_msg(stats_status(alice, msg, sizeof msg) == 0, "%s", msg);
  /* A bucket of one call that refills once in 1000 s. */
  topos_client_quota q = topos_client_quota_none(), now;
  q.rate_per_s = 0.001;
  q.burst = 1;
  q.weight = 3;
  ck_assert_int_eq(
      topos_client_quota_set(
          ops, "alice", &q, TOPOS_CLIENT_QUOTA_RATE | TOPOS_CLIENT_QUOTA_WEIGHT,
          &now, &err),
      TOPOS_OK);
  ck_assert(now.rate_per_s == 0.001);
  ck_assert_int_eq(now.burst, 1);
  ck_assert_int_eq(now.weight, 3);
  ck_assert_int_eq(now.inflight, -1);
  ck_assert_msg(stats_status(alice, msg, sizeof msg) == 0, "%s", msg);
  ck_assert_int_eq(stats_status(alice, msg, sizeof msg), RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(msg,
                       "Stats: quota rate: limit 0.001 calls per second "
                       "(burst 1)"),
                "%s", msg);
  /* ops is not limited by alice's quota. */
  ck_assert_msg(stats_status(ops, msg, sizeof msg) == 0, "%s", msg);
  ck_assert_int_eq(topos_client_quota_show(ops, "alice", &now, &err), TOPOS_OK);
  ck_assert_int_eq(now.burst, 1);
  /* --rate none alone clears the burst too. */
  q = topos_client_quota_none();
  ck_assert_int_eq(topos_client_quota_set(ops, "alice", &q,
                                          TOPOS_CLIENT_QUOTA_RATE, &now, &err),
                   TOPOS_OK);
  ck_assert(now.rate_per_s < 0);
  ck_assert_int_eq(now.burst, -1);
  ck_assert_int_eq(now.weight, 3);
  ck_assert_msg(stats_status(alice, msg, sizeof msg) == 0, "%s", msg);
  ck_assert(log_has(&b.d,
                    "action=quota.set tenant=alice stored_bytes=none "
                    "inflight=none rate=0.001 burst=1"));
  topos_client_close(ops);
  topos_client_close(alice);
  box_stop(&b);
}
END_TEST

/* The CLI through the daemon: the same output as on the file, the secret
 * once on stdout, the same exit statuses. */
START_TEST(test_admin_cli_through_daemon) {
  box b;
  box_start(&b);
  char args[1024], out[4096], err[4096], file_out[4096];
  char where[512];
  snprintf(where, sizeof where, "--server 127.0.0.1:%d --token %s", b.d.port,
           b.ops);
  snprintf(args, sizeof args, "%s tenant add dave", where);
  ck_assert_msg(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err) == 0, "%s",
      err);
  ck_assert_str_eq(out, "tenant dave added\n");
  ck_assert_msg(strstr(err, "action=tenant.add tenant=dave admin=0 server="),
                "%s", err);
  snprintf(args, sizeof args, "%s token create dave", where);
  ck_assert_msg(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err) == 0, "%s",
      err);
  /* stdout: the secret alone; stderr: what it is, never the secret. */
  ck_assert_int_eq((int)strlen(out), TOPOS_CLIENT_SECRET_LEN + 1);
  ck_assert(strncmp(out, "tps_", 4) == 0);
  char dave[80];
  memcpy(dave, out, TOPOS_CLIENT_SECRET_LEN);
  dave[TOPOS_CLIENT_SECRET_LEN] = '\0';
  ck_assert_msg(strstr(err, "topos: token ") && strstr(err,
                                                       "created for "
                                                       "tenant dave"),
                "%s", err);
  ck_assert_msg(strstr(err, "action=token.create tenant=dave token="), "%s",
                err);
  ck_assert_ptr_null(strstr(err, dave));
  topos_client *c = connect_with(b.d.port, dave);
  char msg[600];
  ck_assert_msg(stats_status(c, msg, sizeof msg) == 0, "%s", msg);
  topos_client_close(c);

  /* Same output both ways: tenant list, token list, quota set and show. */
  snprintf(args, sizeof args, "%s tenant list", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 0);
  ck_assert_int_eq(
      run_cli(b.d.store, "tenant list", file_out, sizeof file_out, NULL, 0), 0);
  ck_assert_str_eq(out, file_out);
  ck_assert_msg(strstr(out, "dave ") && strstr(out, "ops "), "%s", out);
  snprintf(args, sizeof args, "%s token list dave", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 0);
  ck_assert_int_eq(
      run_cli(b.d.store, "token list dave", file_out, sizeof file_out, NULL, 0),
      0);
  ck_assert_str_eq(out, file_out);
  ck_assert_ptr_null(strstr(out, "tps_"));
  snprintf(args, sizeof args,
           "%s quota set dave --inflight 2 --rate 20 --burst 3 --weight 2",
           where);
  ck_assert_msg(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err) == 0, "%s",
      err);
  ck_assert_str_eq(out,
                   "tenant dave: stored_bytes=none inflight=2 rate=20 "
                   "burst=3 nodes_per_spec=none run_ms=none run_bytes=none "
                   "device_bytes=none weight=2\n");
  ck_assert_msg(strstr(err,
                       "action=quota.set tenant=dave stored_bytes=none "
                       "inflight=2"),
                "%s", err);
  ck_assert_int_eq(
      run_cli(b.d.store, "quota show dave", file_out, sizeof file_out, NULL, 0),
      0);
  ck_assert_str_eq(out, file_out);
  snprintf(args, sizeof args, "%s quota show dave", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 0);
  ck_assert_str_eq(out, file_out);

  /* $TOPOS_SERVER and $TOPOS_TOKEN pick the daemon without flags. */
  char env[256];
  snprintf(env, sizeof env, "TOPOS_SERVER=127.0.0.1:%d TOPOS_TOKEN=%s",
           b.d.port, b.ops);
  ck_assert_msg(run_topos(b.d.dir, env, "tenant list", out, sizeof out, err,
                          sizeof err) == 0,
                "%s", err);
  ck_assert_int_eq(
      run_cli(b.d.store, "tenant list", file_out, sizeof file_out, NULL, 0), 0);
  ck_assert_str_eq(out, file_out);

  /* Exit statuses: 1 refused (not an admin, unknown), 2 usage or no
   * daemon. */
  snprintf(args, sizeof args, "--server 127.0.0.1:%d --token %s tenant list",
           b.d.port, b.alice);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 1);
  ck_assert_msg(strstr(err,
                       "PERMISSION_DENIED: AdminTenantList: tenant alice "
                       "is not an admin"),
                "%s", err);
  ck_assert_str_eq(out, "");
  snprintf(args, sizeof args, "%s token create nobody", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 1);
  ck_assert_msg(strstr(err, "no tenant nobody"), "%s", err);
  ck_assert_str_eq(out, "");
  snprintf(args, sizeof args, "%s tenant add dave", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 1);
  ck_assert_msg(strstr(err, "already exists"), "%s", err);
  snprintf(args, sizeof args, "%s tenant add Bad-Name", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 2);
  snprintf(args, sizeof args, "%s quota set dave --rate 5", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 2);
  ck_assert_msg(strstr(err, "go together"), "%s", err);
  snprintf(args, sizeof args, "%s --store %s tenant list", where, b.d.store);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 2);
  ck_assert_msg(strstr(err, "exclude each other"), "%s", err);
  snprintf(args, sizeof args, "--store %s --token %s tenant list", b.d.store,
           b.ops);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 2);
  ck_assert_msg(strstr(err, "--token applies through the daemon"), "%s", err);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", "--server 127.0.0.1:1 --deadline 5 tenant list",
                out, sizeof out, err, sizeof err),
      2);
  ck_assert_msg(strstr(err, "cannot reach toposd at 127.0.0.1:1"), "%s", err);

  /* The last admin token through the CLI: refused, 1. */
  snprintf(args, sizeof args, "%s tenant remove ops", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 1);
  ck_assert_msg(strstr(err, "FAILED_PRECONDITION"), "%s", err);
  /* Revoke and remove through the CLI. */
  snprintf(args, sizeof args, "%s tenant remove dave", where);
  ck_assert_int_eq(
      run_topos(b.d.dir, "", args, out, sizeof out, err, sizeof err), 0);
  ck_assert_str_eq(out, "tenant dave removed, with its tokens\n");
  c = connect_with(b.d.port, dave);
  ck_assert_int_eq(stats_status(c, msg, sizeof msg), UNAUTHENTICATED);
  topos_client_close(c);
  ck_assert(!log_has(&b.d, dave + 4));
  box_stop(&b);
}
END_TEST

/* A daemon without tenants: anyone on loopback may administer it, but its
 * first tenant (which turns auth on) must be an admin with a token. */
START_TEST(test_admin_auth_off) {
  daemon_proc d = {0};
  daemon_dir(&d);
  daemon_start(&d, NULL);
  ck_assert(log_has(&d, "no token required (loopback only)"));
  grpc_up();
  topos_client *anyone = connect_with(d.port, NULL);
  topos_error err = {0};
  topos_client_tenant *tenants = NULL;
  int n = -1;
  ck_assert_int_eq(topos_client_tenant_list(anyone, &tenants, &n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(n, 0);
  ASSERT_STATUS(
      topos_client_tenant_add(anyone, "alice", false, NULL, NULL, NULL, &err),
      FAILED_PRECONDITION, err);
  ck_assert_msg(strstr(err.message, "--admin --with-token"), "%s", err.message);
  fprintf(stderr, "admin: %s\n", err.message);
  ASSERT_STATUS(
      topos_client_tenant_add(anyone, "ops", true, NULL, NULL, NULL, &err),
      FAILED_PRECONDITION, err);
  char out[4096], errtext[4096], args[512];
  /* Still no tenant, so still open. */
  ck_assert_int_eq(topos_client_tenant_list(anyone, &tenants, &n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(n, 0);
  snprintf(args, sizeof args,
           "--server 127.0.0.1:%d tenant add ops --admin --with-token", d.port);
  ck_assert_msg(
      run_topos(d.dir, "", args, out, sizeof out, errtext, sizeof errtext) == 0,
      "%s", errtext);
  ck_assert_int_eq((int)strlen(out), TOPOS_CLIENT_SECRET_LEN + 1);
  ck_assert_msg(strstr(errtext, "topos: tenant ops added (admin)") &&
                    strstr(errtext,
                           "action=tenant.add tenant=ops admin=1 "
                           "token="),
                "%s", errtext);
  char ops[80];
  memcpy(ops, out, TOPOS_CLIENT_SECRET_LEN);
  ops[TOPOS_CLIENT_SECRET_LEN] = '\0';
  ck_assert_ptr_null(strstr(errtext, ops));
  /* Auth is on from the next call. */
  char msg[600];
  ck_assert_int_eq(stats_status(anyone, msg, sizeof msg), UNAUTHENTICATED);
  ASSERT_STATUS(topos_client_tenant_list(anyone, &tenants, &n, &err),
                UNAUTHENTICATED, err);
  ck_assert_int_eq(topos_client_set_token(anyone, ops, &err), TOPOS_OK);
  ck_assert_int_eq(topos_client_tenant_list(anyone, &tenants, &n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(tenants[0].name, "ops");
  ck_assert(tenants[0].admin);
  free(tenants);
  /* The auth-off calls were audited without a tenant. */
  ck_assert(log_has(&d, "action=tenant.add tenant=ops admin=1 token="));
  ck_assert(log_has(&d, "by=- peer=ipv4:127.0.0.1:"));
  topos_client_close(anyone);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  ck_assert(!log_has(&d, ops + 4));
  daemon_cleanup(&d);
}
END_TEST

/* Hostile bytes to every admin method: a malformed message or a string
 * with a NUL is INVALID_ARGUMENT for an admin and PERMISSION_DENIED for a
 * tenant that is not one (checked first), and nothing changes. */
START_TEST(test_admin_hostile) {
  box b;
  box_start(&b);
  static const char *const methods[] = {"AdminTenantAdd",    "AdminTenantList",
                                        "AdminTenantRemove", "AdminTokenCreate",
                                        "AdminTokenList",    "AdminTokenRevoke",
                                        "AdminQuotaSet",     "AdminQuotaShow"};
  topos_client *ops = connect_with(b.d.port, b.ops);
  topos_client *alice = connect_with(b.d.port, b.alice);
  char before[2048], after[2048];
  store_snapshot(b.d.store, before, sizeof before);
  uint8_t junk[16];
  memset(junk, 0xff, sizeof junk);
  /* field 1 (string) "ops\0x": a NUL inside a name */
  static const uint8_t nul_name[] = {0x0a, 5, 'o', 'p', 's', 0, 'x'};
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    topos_error err = {0};
    int status = -1;
    uint8_t *reply = NULL;
    size_t len = 0;
    topos_client_call_raw(ops, methods[i], junk, sizeof junk, 0, &reply, &len,
                          &status, &err);
    ck_assert_msg(status == INVALID_ARGUMENT, "%s: %d %s", methods[i], status,
                  err.message);
    if (strcmp(methods[i], "AdminTenantList") != 0) {
      topos_client_call_raw(ops, methods[i], nul_name, sizeof nul_name, 0,
                            &reply, &len, &status, &err);
      ck_assert_msg(status == INVALID_ARGUMENT && strstr(err.message, "NUL"),
                    "%s: %d %s", methods[i], status, err.message);
    }
    topos_client_call_raw(alice, methods[i], junk, sizeof junk, 0, &reply, &len,
                          &status, &err);
    ck_assert_msg(status == PERMISSION_DENIED, "%s: %d %s", methods[i], status,
                  err.message);
    ck_assert_ptr_null(reply);
  }
  store_snapshot(b.d.store, after, sizeof after);
  ck_assert_str_eq(before, after);
  topos_client_close(ops);
  topos_client_close(alice);
  box_stop(&b);
}
END_TEST

Suite *admin_suite(void) {
  Suite *s = suite_create("admin");
  TCase *tc = tcase_create("admin");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_admin_tenants_and_tokens);
  tcase_add_test(tc, test_admin_quota_enforced);
  tcase_add_test(tc, test_admin_cli_through_daemon);
  tcase_add_test(tc, test_admin_auth_off);
  tcase_add_test(tc, test_admin_hostile);
  suite_add_tcase(s, tc);
  return s;
}
