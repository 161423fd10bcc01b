/*
 * test_quotas.c - per-tenant quotas (issue 15, item 4), against real
 * toposd processes on loopback ports with real SQLite files, two tenants:
 * alice (with quotas) and bob (none), administered with the built `topos`:
 *
 *  - `topos quota set/show`: values, 'none' clears one, an audit line per
 *    change, usage errors and an unknown tenant;
 *  - each quota alice exceeds answers RESOURCE_EXHAUSTED (run time:
 *    DEADLINE_EXCEEDED) with a message naming the quota, the limit and the
 *    ask; the store's counts are unchanged afterwards; bob, doing the same
 *    thing at the same time, is not refused; clearing the quota with the
 *    CLI lets alice proceed from the next call;
 *  - stored_bytes and nodes_per_spec (Record, PutBlob), run_bytes
 *    (Forward), the rate's token bucket (refused when empty, served after
 *    the refill), inflight (two slow Forwards held in flight, the third
 *    call refused) and run_ms (a long Forward stopped by the cap).
 */
#include <pthread.h>

#include "http_client.h"
#include "store.h"
#include "tenant_util.h"
#include "topos_client.h"

#define RESOURCE_EXHAUSTED 8
#define DEADLINE_EXCEEDED 4

/* `topos quota set ARGS` must succeed and print its audit line. */
static void quota_set(const char *store, const char *args) {
  char cmd[512], out[1024], err[2048];
  snprintf(cmd, sizeof cmd, "quota set %s", args);
  ck_assert_msg(run_cli(store, cmd, out, sizeof out, err, sizeof err) == 0,
                "%s: %s", cmd, err);
  ck_assert_msg(strstr(err, "action=quota.set") != NULL, "%s", err);
}

typedef struct box {
  daemon_proc d;
  char alice[80], bob[80];
} box;

/* A store with alice and bob; alice's quotas set from `quotas` (a
 * `quota set alice` argument list, NULL for none) before the daemon
 * starts. */
static void box_start(box *b, const char *quotas) {
  memset(b, 0, sizeof *b);
  daemon_dir(&b->d);
  char var[400];
  snprintf(var, sizeof var, "%s/var", b->d.dir);
  mkdir(var, 0700);
  tenant_with_token(b->d.store, "alice", false, b->alice);
  tenant_with_token(b->d.store, "bob", false, b->bob);
  if (quotas) {
    char args[512];
    snprintf(args, sizeof args, "alice %s", quotas);
    quota_set(b->d.store, args);
  }
  const char *extra[] = {"--workers", "4", NULL};
  daemon_start(&b->d, extra);
  grpc_up();
}

static void box_stop(box *b) {
  grpc_down();
  assert_clean_exit(daemon_stop(&b->d, SIGTERM, 20), 20);
  daemon_cleanup(&b->d);
}

static topos_client *as(int port, const char *token) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ck_assert_int_eq(topos_client_set_token(c, token, &err), TOPOS_OK);
  return c;
}

/* One raw call: its gRPC status, and the message. */
static int raw_bytes(topos_client *c, const char *method, const uint8_t *req,
                     size_t len, char *msg, size_t msglen) {
  uint8_t *reply = NULL;
  size_t reply_len = 0;
  int status = 0;
  topos_error err = {0};
  int rc = topos_client_call_raw(c, method, req, len, 60, &reply, &reply_len,
                                 &status, &err);
  free(reply);
  if (msg) snprintf(msg, msglen, "%s", rc == TOPOS_OK ? "" : err.message);
  return rc == TOPOS_OK ? 0 : status;
}

static topos_client_stats_info stats_of(topos_client *c) {
  topos_client_stats_info s;
  topos_error err = {0};
  ck_assert_msg(topos_client_stats(c, &s, &err) == TOPOS_OK, "%s", err.message);
  return s;
}

/* PutBlob of one f64 tensor of n elements from seed: its status. */
static int put_blob(topos_client *c, int seed, int n, char *msg,
                    size_t msglen) {
  double *v = malloc(sizeof *v * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = seed * 1000.0 + i;
  Topos__V1__Tensor t = TOPOS__V1__TENSOR__INIT;
  t.dtype = TOPOS__V1__DTYPE__F64;
  int64_t shape[1] = {n};
  t.n_shape = 1;
  t.shape = shape;
  t.data.data = (uint8_t *)v;
  t.data.len = sizeof *v * (size_t)n;
  Topos__V1__Tensor *ts[1] = {&t};
  Topos__V1__PutBlobRequest r = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  r.n_tensors = 1;
  r.tensors = ts;
  size_t len = 0;
  uint8_t *req = pack(&r.base, &len);
  int status = raw_bytes(c, "PutBlob", req, len, msg, msglen);
  free(req);
  free(v);
  return status;
}

/* Record of net: its status (id written when OK). */
static int record_as(topos_client *c, const topos_network *net, char id[65],
                     char *msg, size_t msglen) {
  topos_error err = {0};
  int rc = topos_client_record(c, net, id, &err);
  if (msg) snprintf(msg, msglen, "%s", rc == TOPOS_OK ? "" : err.message);
  return topos_client_grpc_status(rc);
}

static void assert_has(const char *msg, const char *needle) {
  ck_assert_msg(strstr(msg, needle) != NULL, "'%s' lacks '%s'", msg, needle);
}

START_TEST(test_cli) {
  daemon_proc d = {0};
  daemon_dir(&d);
  char var[400], out[1024], err[2048], secret[80];
  snprintf(var, sizeof var, "%s/var", d.dir);
  mkdir(var, 0700);
  tenant_with_token(d.store, "alice", false, secret);
  ck_assert_int_eq(
      run_cli(d.store, "quota show alice", out, sizeof out, err, sizeof err),
      0);
  assert_has(out,
             "stored_bytes=none inflight=none rate=none burst=none "
             "nodes_per_spec=none run_ms=none run_bytes=none");
  quota_set(d.store,
            "alice --stored-bytes 1000 --inflight 2 --rate 20 --burst 3 "
            "--nodes 7 --run-ms 250 --run-bytes 4096");
  ck_assert_int_eq(
      run_cli(d.store, "quota show alice", out, sizeof out, err, sizeof err),
      0);
  assert_has(out,
             "stored_bytes=1000 inflight=2 rate=20 burst=3 "
             "nodes_per_spec=7 run_ms=250 run_bytes=4096");
  ck_assert_ptr_null(strstr(err, "action=")); /* show changes nothing */
  /* 'none' clears one; the others stay. */
  quota_set(d.store, "alice --nodes none --rate none");
  ck_assert_int_eq(
      run_cli(d.store, "quota show alice", out, sizeof out, err, sizeof err),
      0);
  assert_has(out,
             "stored_bytes=1000 inflight=2 rate=none burst=none "
             "nodes_per_spec=none run_ms=250 run_bytes=4096");
  /* Usage errors (2) and an unknown tenant (1). */
  ck_assert_int_eq(
      run_cli(d.store, "quota set alice --rate 5", NULL, 0, err, sizeof err),
      2);
  ck_assert_int_eq(run_cli(d.store, "quota set alice --inflight -3", NULL, 0,
                           err, sizeof err),
                   2);
  ck_assert_int_eq(
      run_cli(d.store, "quota set alice", NULL, 0, err, sizeof err), 2);
  ck_assert_int_eq(run_cli(d.store, "quota set nobody --inflight 1", NULL, 0,
                           err, sizeof err),
                   1);
  assert_has(err, "no tenant nobody");
  /* Removing the tenant drops its quotas. */
  ck_assert_int_eq(
      run_cli(d.store, "tenant remove alice", NULL, 0, err, sizeof err), 0);
  ck_assert_int_eq(run_cli(d.store, "tenant add alice", NULL, 0, NULL, 0), 0);
  ck_assert_int_eq(
      run_cli(d.store, "quota show alice", out, sizeof out, err, sizeof err),
      0);
  assert_has(out, "stored_bytes=none inflight=none");
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_stored_bytes_and_nodes) {
  box b;
  box_start(&b, "--stored-bytes 4000 --nodes 15");
  topos_client *a = as(b.d.port, b.alice);
  topos_client *o = as(b.d.port, b.bob);
  char msg[1200], id[65];

  /* nodes_per_spec: slow_network(2) has 2 x 11 + 3 nodes. */
  topos_value out;
  topos_network *big = slow_network(2, &out);
  int nodes = topos_network_node_count(big);
  ck_assert_int_gt(nodes, 15);
  ck_assert_int_eq(record_as(a, big, id, msg, sizeof msg), RESOURCE_EXHAUSTED);
  char want[256];
  snprintf(want, sizeof want,
           "Record: quota nodes_per_spec: limit 15 nodes, this spec has %d",
           nodes);
  assert_has(msg, want);
  fprintf(stderr, "quotas: %s\n", msg);
  ck_assert_int_eq(stats_of(a).specs, 0);
  ck_assert_int_eq(record_as(o, big, id, msg, sizeof msg),
                   0); /* bob: no quota */

  /* stored_bytes: a 1000-double blob (8000 + bytes) is over 4000. */
  ck_assert_int_eq(put_blob(a, 1, 1000, msg, sizeof msg), RESOURCE_EXHAUSTED);
  assert_has(msg,
             "PutBlob: quota stored_bytes: limit 4000 bytes, the tenant "
             "holds 0, this upload adds 80");
  fprintf(stderr, "quotas: %s\n", msg);
  topos_client_stats_info s = stats_of(a);
  ck_assert_int_eq(s.blobs, 0);
  ck_assert_int_eq(s.blob_bytes, 0);
  ck_assert_int_eq(put_blob(o, 1, 1000, msg, sizeof msg), 0); /* bob */
  /* Within the quota, then over it with what it holds counted. */
  ck_assert_int_eq(put_blob(a, 2, 300, msg, sizeof msg), 0);
  s = stats_of(a);
  ck_assert_int_eq(s.blobs, 1);
  int64_t held = s.blob_bytes;
  ck_assert_int_eq(put_blob(a, 3, 300, msg, sizeof msg), RESOURCE_EXHAUSTED);
  snprintf(want, sizeof want,
           "quota stored_bytes: limit 4000 bytes, the tenant holds %lld, "
           "this upload adds",
           (long long)held);
  assert_has(msg, want);
  /* Uploading what it already owns adds nothing: still fine. */
  ck_assert_int_eq(put_blob(a, 2, 300, msg, sizeof msg), 0);
  /* Record counts too. */
  topos_network *small = slow_network(1, &out);
  ck_assert_int_eq(record_as(a, small, id, msg, sizeof msg),
                   RESOURCE_EXHAUSTED);
  assert_has(msg, "Record: quota stored_bytes: limit 4000 bytes");
  s = stats_of(a);
  ck_assert_int_eq(s.specs, 0);
  ck_assert_int_eq(s.blobs, 1);
  ck_assert_int_eq(s.blob_bytes, held);

  /* Cleared with the CLI: the next calls go through. */
  quota_set(b.d.store, "alice --stored-bytes none --nodes none");
  ck_assert_int_eq(put_blob(a, 3, 300, msg, sizeof msg), 0);
  ck_assert_int_eq(put_blob(a, 1, 1000, msg, sizeof msg), 0);
  ck_assert_msg(record_as(a, big, id, msg, sizeof msg) == 0, "%s", msg);
  ck_assert_int_eq(stats_of(a).specs, 1);
  ck_assert_int_eq(stats_of(a).blobs, 3);

  topos_network_release(big);
  topos_network_release(small);
  topos_client_close(a);
  topos_client_close(o);
  box_stop(&b);
}
END_TEST

START_TEST(test_run_bytes) {
  box b;
  box_start(&b, "--run-bytes 1000");
  topos_client *a = as(b.d.port, b.alice);
  topos_client *o = as(b.d.port, b.bob);
  char msg[1200], ida[65], idb[65];
  topos_value out;
  topos_network *net = slow_network(1, &out);
  ck_assert_int_eq(record_as(a, net, ida, msg, sizeof msg), 0);
  ck_assert_int_eq(record_as(o, net, idb, msg, sizeof msg), 0);
  uint8_t *req;
  size_t len;
  slow_forward_request(net, out, ida, &req, &len);
  int64_t before = stats_of(a).requests;
  ck_assert_int_eq(raw_bytes(a, "Forward", req, len, msg, sizeof msg),
                   RESOURCE_EXHAUSTED);
  assert_has(msg,
             "Forward: quota run_bytes: limit 1000 bytes, this run needs ");
  assert_has(msg, " bytes");
  fprintf(stderr, "quotas: %s\n", msg);
  ck_assert_int_gt(stats_of(a).requests, before);
  ck_assert_msg(raw_bytes(o, "Forward", req, len, msg, sizeof msg) == 0, "%s",
                msg);
  quota_set(b.d.store, "alice --run-bytes none");
  ck_assert_msg(raw_bytes(a, "Forward", req, len, msg, sizeof msg) == 0, "%s",
                msg);
  free(req);
  topos_network_release(net);
  topos_client_close(a);
  topos_client_close(o);
  box_stop(&b);
}
END_TEST

typedef struct upload_arg {
  int port;
  const char *token;
  int seed, status;
  char msg[600];
} upload_arg;

static void *upload_one(void *p) {
  upload_arg *u = p;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", u->port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  if (c == NULL || topos_client_set_token(c, u->token, &err) != TOPOS_OK) {
    u->status = -1;
    snprintf(u->msg, sizeof u->msg, "%s", err.message);
  } else {
    u->status = put_blob(c, u->seed, 20000, u->msg, sizeof u->msg);
  }
  topos_client_close(c);
  return NULL;
}

/* stored_bytes under concurrent uploads: eight 160 KB blobs at once
 * against room for three.  Each check counts the uploads still being
 * written, so however they interleave no more than three are stored;
 * and nothing stays counted after: uploading one at a time then fills
 * the quota to exactly three blobs. */
START_TEST(test_stored_bytes_concurrent) {
  box b;
  box_start(&b, "--stored-bytes 560000");
  enum { N = 8 };
  upload_arg u[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&u[i], 0, sizeof u[i]);
    u[i].port = b.d.port;
    u[i].token = b.alice;
    u[i].seed = 10 + i;
    ck_assert_int_eq(pthread_create(&th[i], NULL, upload_one, &u[i]), 0);
  }
  int stored = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(u[i].status == 0 || u[i].status == RESOURCE_EXHAUSTED,
                  "upload %d: %d %s", i, u[i].status, u[i].msg);
    stored += u[i].status == 0;
  }
  topos_client *a = as(b.d.port, b.alice);
  topos_client_stats_info s = stats_of(a);
  fprintf(stderr, "quotas: %d of %d concurrent uploads stored, %lld bytes\n",
          stored, N, (long long)s.blob_bytes);
  ck_assert_int_le(stored, 3);
  ck_assert_int_eq(s.blobs, stored);
  ck_assert_int_le(s.blob_bytes, 560000);
  char msg[1200];
  for (int seed = 100; s.blobs < 3 && seed < 110; seed++) {
    ck_assert_msg(put_blob(a, seed, 20000, msg, sizeof msg) == 0, "%s", msg);
    s = stats_of(a);
  }
  ck_assert_int_eq(s.blobs, 3);
  ck_assert_int_eq(put_blob(a, 200, 20000, msg, sizeof msg),
                   RESOURCE_EXHAUSTED);
  assert_has(msg,
             "PutBlob: quota stored_bytes: limit 560000 bytes, the "
             "tenant holds ");
  topos_client_close(a);
  box_stop(&b);
}
END_TEST

/* device_bytes: on a host with a device (the pretend plugin of
 * tests/cuda/fake_plugin.c) a run whose largest device task is over the
 * tenant's quota is refused before it runs, naming the ask; another
 * tenant, or the quota cleared, runs.  On a host without a device the
 * quota has nothing to bound. */
START_TEST(test_device_bytes) {
  const char *build = getenv("TOPOS_BUILD");
  char plugin[512];
  snprintf(plugin, sizeof plugin, "%s/lib/libtopos_fakegpu.so",
           build && *build ? build : "build");
  topos_value out;
  topos_network *net = slow_network(1, &out);
  topos_value roots[1] = {out};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  size_t need = topos_plan_device_bytes(plan);
  topos_plan_free(plan);
  ck_assert_uint_gt(need, 1000);
  char want[256];
  snprintf(want, sizeof want,
           "Forward: quota device_bytes: limit 1000 bytes, this run's largest "
           "device task needs %zu bytes",
           need);
  for (int gpu = 1; gpu >= 0; gpu--) {
    box b;
    if (gpu) setenv("TOPOS_CUDA_PLUGIN", plugin, 1);
    box_start(&b, "--device-bytes 1000");
    unsetenv("TOPOS_CUDA_PLUGIN");
    topos_client *a = as(b.d.port, b.alice);
    topos_client *o = as(b.d.port, b.bob);
    char msg[1200], ida[65], idb[65], shown[4096], cli_err[4096];
    ck_assert_int_eq(run_cli(b.d.store, "quota show alice", shown, sizeof shown,
                             cli_err, sizeof cli_err),
                     0);
    assert_has(shown, "run_bytes=none device_bytes=1000 weight=1");
    ck_assert_int_eq(record_as(a, net, ida, msg, sizeof msg), 0);
    ck_assert_int_eq(record_as(o, net, idb, msg, sizeof msg), 0);
    uint8_t *req;
    size_t len;
    slow_forward_request(net, out, ida, &req, &len);
    int st = raw_bytes(a, "Forward", req, len, msg, sizeof msg);
    if (gpu) {
      ck_assert_int_eq(st, RESOURCE_EXHAUSTED);
      assert_has(msg, want);
      fprintf(stderr, "quotas: %s\n", msg);
    } else {
      ck_assert_msg(st == 0, "no device, yet: %s", msg);
    }
    free(req);
    slow_forward_request(net, out, idb, &req, &len);
    ck_assert_msg(raw_bytes(o, "Forward", req, len, msg, sizeof msg) == 0, "%s",
                  msg);
    free(req);
    quota_set(b.d.store, "alice --device-bytes none");
    slow_forward_request(net, out, ida, &req, &len);
    ck_assert_msg(raw_bytes(a, "Forward", req, len, msg, sizeof msg) == 0, "%s",
                  msg);
    free(req);
    topos_client_close(a);
    topos_client_close(o);
    box_stop(&b);
  }
  topos_network_release(net);
}
END_TEST

START_TEST(test_rate) {
  box b;
  box_start(&b, "--rate 20 --burst 3");
  topos_client *a = as(b.d.port, b.alice);
  topos_client *o = as(b.d.port, b.bob);
  char msg[1200];
  /* A burst: the first 3 pass (the bucket starts full); a few more may
   * pass on what refills meanwhile (20/s), then one is refused. */
  int ok = 0, refused_at = -1;
  for (int i = 0; i < 12 && refused_at < 0; i++) {
    int st = stats_status(a, msg, sizeof msg);
    if (st == 0)
      ok++;
    else
      refused_at = i;
  }
  ck_assert_int_ge(ok, 3);
  ck_assert_msg(refused_at >= 3, "never refused after %d calls", ok);
  assert_has(msg,
             "Stats: quota rate: limit 20 calls per second (burst 3), "
             "the tenant's bucket is empty, this call asks 1; retry "
             "after ");
  fprintf(stderr, "quotas: %s\n", msg);
  /* bob, at the same moment, is not limited. */
  for (int i = 0; i < 8; i++) ck_assert_int_eq(stats_status(o, NULL, 0), 0);
  /* After the refill (at most 50 ms per token), alice is served again. */
  usleep(120 * 1000);
  ck_assert_msg(stats_status(a, msg, sizeof msg) == 0, "%s", msg);
  /* Cleared with the CLI: no limit from the next call. */
  quota_set(b.d.store, "alice --rate none");
  for (int i = 0; i < 10; i++)
    ck_assert_msg(stats_status(a, msg, sizeof msg) == 0, "%s", msg);
  topos_client_close(a);
  topos_client_close(o);
  box_stop(&b);
}
END_TEST

typedef struct slow_call {
  int port;
  const char *token;
  const uint8_t *req;
  size_t len;
  int status;
  char msg[600];
} slow_call;

static void *slow_call_main(void *p) {
  slow_call *s = p;
  topos_client *c = as(s->port, s->token);
  s->status = raw_bytes(c, "Forward", s->req, s->len, s->msg, sizeof s->msg);
  topos_client_close(c);
  return NULL;
}

START_TEST(test_inflight_and_run_ms) {
  double took = 0;
  topos_value out;
  topos_network *net = calibrated_slow_network(1.0, &out, &took);
  box b;
  box_start(&b, "--inflight 2");
  topos_client *a = as(b.d.port, b.alice);
  topos_client *o = as(b.d.port, b.bob);
  char msg[1200], ida[65], idb[65];
  ck_assert_int_eq(record_as(a, net, ida, msg, sizeof msg), 0);
  ck_assert_int_eq(record_as(o, net, idb, msg, sizeof msg), 0);
  uint8_t *req;
  size_t len;
  slow_forward_request(net, out, ida, &req, &len);

  /* Two slow Forwards of alice in flight: her third call is refused at
   * admission, bob's is served. */
  slow_call calls[2];
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) {
    calls[i] = (slow_call){b.d.port, b.alice, req, len, -1, ""};
    ck_assert_int_eq(
        pthread_create(&threads[i], NULL, slow_call_main, &calls[i]), 0);
  }
  usleep(300 * 1000); /* both admitted; each runs for a second or more */
  ck_assert_int_eq(stats_status(a, msg, sizeof msg), RESOURCE_EXHAUSTED);
  assert_has(msg,
             "Stats: quota inflight: limit 2 calls in flight, the tenant "
             "has 2, this call adds 1");
  fprintf(stderr, "quotas: %s\n", msg);
  ck_assert_msg(stats_status(o, msg, sizeof msg) == 0, "%s", msg);
  for (int i = 0; i < 2; i++) {
    pthread_join(threads[i], NULL);
    ck_assert_msg(calls[i].status == 0, "%d %s", calls[i].status, calls[i].msg);
  }
  /* Answered: counted out again. */
  ck_assert_msg(stats_status(a, msg, sizeof msg) == 0, "%s", msg);

  /* run_ms: alice's long Forward is stopped by the cap, bob's runs. */
  quota_set(b.d.store, "alice --inflight none --run-ms 200");
  double t0 = now_s();
  ck_assert_int_eq(raw_bytes(a, "Forward", req, len, msg, sizeof msg),
                   DEADLINE_EXCEEDED);
  double capped = now_s() - t0;
  assert_has(msg, "deadline exceeded (quota run_ms: limit 200 ms per call)");
  fprintf(stderr, "quotas: %s after %.3f s (uncapped %.3f s in process)\n", msg,
          capped, took);
  ck_assert_msg(capped < took, "capped run took %.3f s of %.3f s", capped,
                took);
  free(req);
  slow_forward_request(net, out, idb, &req, &len);
  ck_assert_msg(raw_bytes(o, "Forward", req, len, msg, sizeof msg) == 0, "%s",
                msg);
  free(req);
  topos_network_release(net);
  topos_client_close(a);
  topos_client_close(o);
  box_stop(&b);
}
END_TEST

Suite *quotas_suite(void) {
  Suite *s = suite_create("quotas");
  TCase *tc = tcase_create("quotas");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_cli);
  tcase_add_test(tc, test_stored_bytes_and_nodes);
  tcase_add_test(tc, test_run_bytes);
  tcase_add_test(tc, test_device_bytes);
  tcase_add_test(tc, test_stored_bytes_concurrent);
  tcase_add_test(tc, test_rate);
  tcase_add_test(tc, test_inflight_and_run_ms);
  suite_add_tcase(s, tc);
  return s;
}
