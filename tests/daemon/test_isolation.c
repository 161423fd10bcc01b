/*
 * test_isolation.c - tenants do not see each other's data (issue 15,
 * item 3), against real toposd processes on loopback ports with real
 * SQLite files, two tenants (alice, bob) and an admin (ops):
 *
 *  - a blob alice uploaded is, for bob, exactly an unknown id: StatBlob
 *    answers the same bytes as for a random id, and a Backward or Forward
 *    referencing it fails NOT_FOUND with the same message; bob uploading
 *    the same content gets the same reply as a first upload and can then
 *    use it; the admin sees it;
 *  - a spec alice recorded is NOT_FOUND for bob (Describe, Lower, Forward)
 *    with the message of an unknown id; ListSpecs (gRPC and GET /v1/specs)
 *    lists each tenant's own specs, the admin's every spec;
 *  - Stats counts each tenant's own specs and blobs, the admin's all;
 *  - Stats counts each tenant's own calls (requests, errors; both
 *    transports, refusals by a quota included), the admin's the daemon's;
 *    /metrics is refused to a non-admin tenant (403 PERMISSION_DENIED) and
 *    carries topos_tenant_requests_total for every tenant for an admin;
 *    without auth nothing per tenant is kept; past the cap of 1024
 *    tenants the rest count together as "(other)";
 *  - under a small blob cap a tenant's uploads evict only its own blobs,
 *    never another tenant's or a shared one (and are refused when nothing
 *    of theirs is left to evict); removing a tenant drops its ownership,
 *    so what only it owned becomes evictable.
 */
#include "http_client.h"
#include "store.h"
#include "tenant_util.h"
#include "topos_client.h"

/* A daemon with tenants alice, bob and the admin ops. */
typedef struct box {
  daemon_proc d;
  char alice[80], bob[80], ops[80];
} box;

static void box_start(box *b, const char *const *extra) {
  memset(b, 0, sizeof *b);
  daemon_dir(&b->d);
  char var[400];
  snprintf(var, sizeof var, "%s/var", b->d.dir);
  mkdir(var, 0700);
  tenant_with_token(b->d.store, "alice", false, b->alice);
  tenant_with_token(b->d.store, "bob", false, b->bob);
  tenant_with_token(b->d.store, "ops", true, b->ops);
  daemon_start(&b->d, extra);
  grpc_up();
}

static void box_stop(box *b) {
  grpc_down();
  assert_clean_exit(daemon_stop(&b->d, SIGTERM, 20), 20);
  daemon_cleanup(&b->d);
}

static topos_client *as(const box *b, const char *token) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", b->d.port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ck_assert_int_eq(topos_client_set_token(c, token, &err), TOPOS_OK);
  return c;
}

/* One raw call: its gRPC status; the reply (free()) and message. */
static int raw(topos_client *c, const char *method, const ProtobufCMessage *m,
               uint8_t **out, size_t *out_len, char *msg, size_t msglen) {
  size_t len = 0;
  uint8_t *req = pack(m, &len);
  uint8_t *reply = NULL;
  size_t reply_len = 0;
  int status = 0;
  topos_error err = {0};
  int rc = topos_client_call_raw(c, method, req, len, 30, &reply, &reply_len,
                                 &status, &err);
  free(req);
  if (msg) snprintf(msg, msglen, "%s", rc == TOPOS_OK ? "" : err.message);
  if (out) {
    *out = reply;
    *out_len = reply_len;
  } else {
    free(reply);
  }
  return rc == TOPOS_OK ? 0 : status;
}

/* The StatBlob reply's bytes for id (compared whole across tenants). */
static void stat_reply(topos_client *c, const char *id, uint8_t **out,
                       size_t *len) {
  Topos__V1__StatBlobRequest r = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
  r.id = (char *)id;
  ck_assert_int_eq(raw(c, "StatBlob", &r.base, out, len, NULL, 0), 0);
}

static bool present(topos_client *c, const char *id) {
  bool p = false;
  int64_t size = 0;
  topos_error err = {0};
  ck_assert_int_eq(topos_client_stat_blob(c, id, &p, &size, &err), TOPOS_OK);
  return p;
}

/* PutBlob of one f64 tensor of n elements from seed: its status; the id
 * and the reply bytes when OK. */
static int put_raw_blob(topos_client *c, int seed, int n, char id[65],
                        char *msg, size_t msglen) {
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
  uint8_t *out = NULL;
  size_t len = 0;
  int status = raw(c, "PutBlob", &r.base, &out, &len, msg, msglen);
  free(v);
  if (status == 0) {
    Topos__V1__PutBlobReply *m =
        topos__v1__put_blob_reply__unpack(NULL, len, out);
    ck_assert_ptr_nonnull(m);
    snprintf(id, 65, "%s", m->id);
    protobuf_c_message_free_unpacked(&m->base, NULL);
  }
  free(out);
  return status;
}

/* The spec ids ListSpecs gives (one page of up to 100), newest first. */
static int list_ids(topos_client *c, char ids[][65], int max) {
  Topos__V1__ListSpecsRequest r = TOPOS__V1__LIST_SPECS_REQUEST__INIT;
  uint8_t *out = NULL;
  size_t len = 0;
  ck_assert_int_eq(
      raw(c, "/topos.v1.Topos/ListSpecs", &r.base, &out, &len, NULL, 0), 0);
  Topos__V1__ListSpecsReply *m =
      topos__v1__list_specs_reply__unpack(NULL, len, out);
  ck_assert_ptr_nonnull(m);
  int n = (int)m->n_specs;
  ck_assert_int_le(n, max);
  for (int i = 0; i < n; i++) snprintf(ids[i], 65, "%s", m->specs[i]->id);
  protobuf_c_message_free_unpacked(&m->base, NULL);
  free(out);
  return n;
}

static bool listed(char ids[][65], int n, const char *id) {
  for (int i = 0; i < n; i++)
    if (strcmp(ids[i], id) == 0) return true;
  return false;
}

/* GET path with an Authorization header. */
static void http_get_auth(int port, const char *path, const char *authz,
                          http_reply *r) {
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(port);
  ck_assert_int_ge(c->fd, 0);
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   "Authorization: %s\r\n\r\n",
                   path, authz);
  http_send_all(c->fd, head, (size_t)n);
  http_read(c, 30, r);
  close(c->fd);
  free(c);
}

/* msg with every occurrence of id replaced by "ID". */
static void without_id(const char *msg, const char *id, char *out, size_t len) {
  size_t o = 0;
  for (const char *p = msg; *p && o + 3 < len;) {
    if (strncmp(p, id, 64) == 0) {
      memcpy(out + o, "ID", 2);
      o += 2;
      p += 64;
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
}

/* Asserts that msg_a (about id_a) and msg_b (about id_b) say the same. */
static void assert_same_answer(const char *msg_a, const char *id_a,
                               const char *msg_b, const char *id_b) {
  char a[1200], b[1200];
  without_id(msg_a, id_a, a, sizeof a);
  without_id(msg_b, id_b, b, sizeof b);
  ck_assert_msg(strcmp(a, b) == 0, "'%s' differs from '%s'", a, b);
}

static void stats_of(topos_client *c, topos_client_stats_info *s) {
  topos_error err = {0};
  ck_assert_msg(topos_client_stats(c, s, &err) == TOPOS_OK, "%s", err.message);
}

#define NOT_FOUND 5
#define RESOURCE_EXHAUSTED 8

/* The value of the sample `series` (the name and labels as the exposition
 * writes them) in a /metrics body; -1 when there is no such line. */
static long long sample(const char *body, const char *series) {
  size_t n = strlen(series);
  for (const char *p = body; (p = strstr(p, series)) != NULL; p += n)
    if ((p == body || p[-1] == '\n') && p[n] == ' ') return atoll(p + n + 1);
  return -1;
}

/* The count of tenant's calls answered with status code in a body. */
static long long tenant_sample(const char *body, const char *tenant,
                               const char *code) {
  char series[160];
  snprintf(series, sizeof series,
           "topos_tenant_requests_total{tenant=\"%s\",code=\"%s\"}", tenant,
           code);
  return sample(body, series);
}

/* GET path on port with token as the bearer. */
static void get_as(int port, const char *path, const char *token,
                   http_reply *r) {
  char authz[120];
  snprintf(authz, sizeof authz, "Bearer %s", token);
  http_get_auth(port, path, authz, r);
}

START_TEST(test_blobs_and_specs) {
  box b;
  box_start(&b, NULL);
  topos_client *a = as(&b, b.alice), *o = as(&b, b.bob), *adm = as(&b, b.ops);
  topos_error err = {0};
  char unknown[65];
  memset(unknown, 'e', 64);
  unknown[64] = '\0';

  /* alice records a spec and uploads its parameters as a blob. */
  gd_net g = gd_network(0);
  gd_net g2 = gd_network(3);
  char spec[65], spec2[65], blob[65];
  ck_assert_int_eq(topos_client_record(a, g.net, spec, &err), TOPOS_OK);
  ck_assert_int_eq(topos_client_record(a, g2.net, spec2, &err), TOPOS_OK);
  topos_params *p = topos_network_parameters(g.net);
  int64_t bytes_a = 0, bytes_b = 0;
  ck_assert_msg(topos_client_put_blob(a, p, blob, &bytes_a, &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert(present(a, blob));

  /* For bob the blob is an unknown id: StatBlob's reply is byte for byte
   * the one for a random id. */
  uint8_t *r1 = NULL, *r2 = NULL;
  size_t l1 = 0, l2 = 0;
  stat_reply(o, blob, &r1, &l1);
  stat_reply(o, unknown, &r2, &l2);
  ck_assert_uint_eq(l1, l2);
  ck_assert(l1 == 0 || memcmp(r1, r2, l1) == 0);
  free(r1);
  free(r2);
  ck_assert(!present(o, blob));

  /* bob's spec (his own record of the same network: ids are content, so
   * it is the same id, now his too) referencing alice's blob: NOT_FOUND,
   * the message of an unknown blob. */
  char own[65];
  ck_assert_int_eq(topos_client_record(o, g.net, own, &err), TOPOS_OK);
  ck_assert_str_eq(own, spec);
  topos_client_args by_blob = {.params_blob = blob, .nparams_blob = 1};
  topos_client_args by_unknown = {.params_blob = unknown, .nparams_blob = 1};
  char m1[1024], m2[1024];
  ck_assert_int_eq(
      topos_client_backward_with(o, own, g.loss, &by_blob, NULL, NULL, &err),
      TOPOS_ERR_NOT_FOUND);
  snprintf(m1, sizeof m1, "%s", err.message);
  ck_assert_int_eq(
      topos_client_backward_with(o, own, g.loss, &by_unknown, NULL, NULL, &err),
      TOPOS_ERR_NOT_FOUND);
  snprintf(m2, sizeof m2, "%s", err.message);
  assert_same_answer(m1, blob, m2, unknown);
  topos_value roots[1] = {g.loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_tensor **rr = NULL;
  ck_assert_int_eq(
      topos_client_forward_with(o, own, &e, &by_blob, &rr, NULL, &err),
      TOPOS_ERR_NOT_FOUND);
  /* alice uses it. */
  ck_assert_msg(topos_client_forward_with(a, spec, &e, &by_blob, &rr, NULL,
                                          &err) == TOPOS_OK,
                "%s", err.message);
  topos_client_tensors_free(rr, 1);

  /* bob uploads the same content: the reply of a first upload; then it
   * is his as well. */
  char again[65];
  ck_assert_int_eq(topos_client_put_blob(o, p, again, &bytes_b, &err),
                   TOPOS_OK);
  ck_assert_str_eq(again, blob);
  ck_assert_int_eq(bytes_a, bytes_b);
  ck_assert(present(o, blob));
  double loss = NAN;
  ck_assert_msg(topos_client_backward_with(o, own, g.loss, &by_blob, &loss,
                                           NULL, &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert(present(a, blob));

  /* Specs: alice's second spec is an unknown id for bob, for every
   * operation by id. */
  char *text = NULL;
  ck_assert_int_eq(
      topos_client_describe(o, spec2, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_ERR_NOT_FOUND);
  snprintf(m1, sizeof m1, "%s", err.message);
  ck_assert_int_eq(
      topos_client_describe(o, unknown, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_ERR_NOT_FOUND);
  snprintf(m2, sizeof m2, "%s", err.message);
  assert_same_answer(m1, spec2, m2, unknown);
  topos_value roots2[1] = {g2.loss};
  topos_entry e2 = {
      roots2, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  ck_assert_int_eq(
      topos_client_forward(o, spec2, &e2, NULL, NULL, 0, &rr, NULL, &err),
      TOPOS_ERR_NOT_FOUND);
  ck_assert_int_eq(topos_client_lower(o, spec2, &e2, &text, NULL, NULL, &err),
                   TOPOS_ERR_NOT_FOUND);
  ck_assert_int_eq(
      topos_client_describe(a, spec2, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_OK);
  topos_free(text);
  /* The admin sees every spec and blob. */
  ck_assert_int_eq(
      topos_client_describe(adm, spec2, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_OK);
  topos_free(text);
  ck_assert(present(adm, blob));

  /* Listing: each tenant its own; the admin everything. */
  char ids[16][65];
  int n = list_ids(a, ids, 16);
  ck_assert_int_eq(n, 2);
  ck_assert(listed(ids, n, spec) && listed(ids, n, spec2));
  n = list_ids(o, ids, 16);
  ck_assert_int_eq(n, 1);
  ck_assert(listed(ids, n, spec));
  n = list_ids(adm, ids, 16);
  ck_assert_int_eq(n, 2);
  /* The gateway's GET /v1/specs is the same call. */
  if (b.d.http_port > 0) {
    char authz[120];
    http_reply hr;
    snprintf(authz, sizeof authz, "Bearer %s", b.bob);
    http_get_auth(b.d.http_port, "/v1/specs", authz, &hr);
    ck_assert_int_eq(hr.status, 200);
    ck_assert_ptr_nonnull(strstr(hr.body, spec));
    ck_assert_ptr_null(strstr(hr.body, spec2));
    http_reply_clear(&hr);
    snprintf(authz, sizeof authz, "Bearer %s", b.ops);
    http_get_auth(b.d.http_port, "/v1/specs", authz, &hr);
    ck_assert_int_eq(hr.status, 200);
    ck_assert_ptr_nonnull(strstr(hr.body, spec2));
    http_reply_clear(&hr);
  }

  /* Stats: own counts for tenants, the store's for the admin. */
  char third[65];
  ck_assert_int_eq(put_raw_blob(a, 7, 100, third, NULL, 0), 0);
  topos_client_stats_info sa, sb, sx;
  stats_of(a, &sa);
  stats_of(o, &sb);
  stats_of(adm, &sx);
  ck_assert_int_eq(sa.specs, 2);
  ck_assert_int_eq(sa.blobs, 2);
  ck_assert_int_eq(sb.specs, 1);
  ck_assert_int_eq(sb.blobs, 1);
  ck_assert_int_eq(sb.blob_bytes, bytes_b);
  ck_assert_int_eq(sx.specs, 2);
  ck_assert_int_eq(sx.blobs, 2);
  ck_assert_int_eq(sx.blob_bytes, sa.blob_bytes);

  /* Removing bob drops his ownership; alice keeps hers. */
  ck_assert_int_eq(run_cli(b.d.store, "tenant remove bob", NULL, 0, NULL, 0),
                   0);
  topos_store *st = store_open(b.d.store, &err);
  ck_assert_msg(st != NULL, "%s", err.message);
  bool owns = true;
  ck_assert_int_eq(store_blob_owned(st, blob, "bob", &owns, &err), TOPOS_OK);
  ck_assert(!owns);
  ck_assert_int_eq(store_spec_owned(st, spec, "bob", &owns, &err), TOPOS_OK);
  ck_assert(!owns);
  ck_assert_int_eq(store_blob_owned(st, blob, "alice", &owns, &err), TOPOS_OK);
  ck_assert(owns);
  store_close(st);
  ck_assert(present(a, blob));

  topos_params_free(p);
  topos_network_release(g.net);
  topos_network_release(g2.net);
  topos_client_close(a);
  topos_client_close(o);
  topos_client_close(adm);
  box_stop(&b);
}
END_TEST

START_TEST(test_eviction) {
  /* Room for two blobs of 1000 f64 (8 KB and a few bytes each). */
  const char *const extra[] = {"--blob-cap-bytes", "20000", NULL};
  box b;
  box_start(&b, extra);
  topos_client *a = as(&b, b.alice), *o = as(&b, b.bob);
  char x1[65], x2[65], x3[65], x4[65], y1[65], msg[1024];
  ck_assert_int_eq(put_raw_blob(a, 1, 1000, x1, msg, sizeof msg), 0);
  ck_assert_int_eq(put_raw_blob(o, 2, 1000, y1, msg, sizeof msg), 0);
  /* alice's next upload evicts her own oldest blob, not bob's (older). */
  ck_assert_int_eq(put_raw_blob(a, 3, 1000, x2, msg, sizeof msg), 0);
  ck_assert(!present(a, x1));
  ck_assert(present(o, y1));
  ck_assert(present(a, x2));
  ck_assert_int_eq(put_raw_blob(a, 4, 1000, x3, msg, sizeof msg), 0);
  ck_assert(!present(a, x2));
  ck_assert(present(o, y1));
  /* x3 shared with bob: alice's pressure can no longer evict it, and
   * bob's blob never; her upload is refused and nothing changes. */
  char same[65];
  ck_assert_int_eq(put_raw_blob(o, 4, 1000, same, msg, sizeof msg), 0);
  ck_assert_str_eq(same, x3);
  ck_assert_int_eq(put_raw_blob(a, 5, 1000, x4, msg, sizeof msg),
                   RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(msg, "blob cap full") && strstr(msg, "other tenants"),
                "%s", msg);
  ck_assert(present(o, y1));
  ck_assert(present(o, x3));
  ck_assert(present(a, x3));
  /* Once bob is removed, what only he owned is evictable. */
  ck_assert_int_eq(run_cli(b.d.store, "tenant remove bob", NULL, 0, NULL, 0),
                   0);
  ck_assert_int_eq(put_raw_blob(a, 5, 1000, x4, msg, sizeof msg), 0);
  ck_assert(present(a, x3));
  ck_assert(present(a, x4));
  topos_store *st = store_open(b.d.store, NULL);
  ck_assert_ptr_nonnull(st);
  int64_t size = 0;
  ck_assert_int_eq(store_stat_blob(st, y1, &size, NULL), TOPOS_ERR_NOT_FOUND);
  store_close(st);
  topos_client_close(a);
  topos_client_close(o);
  box_stop(&b);
}
END_TEST

START_TEST(test_early_ack) {
  /* With early acknowledgement a blob waits in memory before it is
   * written; it belongs to its uploader there too. */
  const char *const extra[] = {"--blob-pending-bytes", "64M", NULL};
  box b;
  box_start(&b, extra);
  topos_client *a = as(&b, b.alice), *o = as(&b, b.bob);
  char x[65], same[65], msg[1024];
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(put_raw_blob(a, 20 + i, 50000, x, msg, sizeof msg), 0);
    ck_assert(present(a, x));
    ck_assert(!present(o, x));
  }
  ck_assert_int_eq(put_raw_blob(o, 24, 50000, same, msg, sizeof msg), 0);
  ck_assert_str_eq(same, x);
  ck_assert(present(o, x));
  topos_client_close(a);
  topos_client_close(o);
  grpc_down();
  assert_clean_exit(daemon_stop(&b.d, SIGTERM, 20), 20);
  /* Written by the shutdown at the latest, with both owners. */
  topos_store *st = store_open(b.d.store, NULL);
  ck_assert_ptr_nonnull(st);
  bool owns = false;
  ck_assert_int_eq(store_blob_owned(st, x, "alice", &owns, NULL), TOPOS_OK);
  ck_assert(owns);
  ck_assert_int_eq(store_blob_owned(st, x, "bob", &owns, NULL), TOPOS_OK);
  ck_assert(owns);
  store_close(st);
  daemon_cleanup(&b.d);
}
END_TEST

START_TEST(test_request_counts) {
  box b;
  box_start(&b, NULL);
  ck_assert_int_gt(b.d.http_port, 0);
  topos_client *a = as(&b, b.alice), *o = as(&b, b.bob), *adm = as(&b, b.ops);
  topos_error err = {0};
  char unknown[65], ids[4][65], msg[1024], *text = NULL;
  memset(unknown, 'e', 64);
  unknown[64] = '\0';
  /* A fresh daemon has answered nothing, so every count below is exact.
   * alice: 4 ListSpecs and 3 Describe of an unknown id (NOT_FOUND) over
   * gRPC, a GET /v1/specs over HTTP; bob: 2 ListSpecs and 1 Describe. */
  for (int i = 0; i < 4; i++) list_ids(a, ids, 4);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(
        topos_client_describe(a, unknown, TOPOS_FORMAT_TEXT, &text, &err),
        TOPOS_ERR_NOT_FOUND);
  http_reply hr;
  get_as(b.d.http_port, "/v1/specs", b.alice, &hr);
  ck_assert_msg(hr.status == 200, "%d %s", hr.status, hr.body);
  http_reply_clear(&hr);
  for (int i = 0; i < 2; i++) list_ids(o, ids, 4);
  ck_assert_int_eq(
      topos_client_describe(o, unknown, TOPOS_FORMAT_TEXT, &text, &err),
      TOPOS_ERR_NOT_FOUND);

  /* /metrics is the admins': alice is refused, and the refusal is no
   * call of hers (no method ran). */
  get_as(b.d.http_port, "/metrics", b.alice, &hr);
  HTTP_ASSERT_ERROR(&hr, 403, "PERMISSION_DENIED");
  ck_assert_msg(strstr(hr.body, "daemon-wide metrics are for admin tenants") &&
                    strstr(hr.body, "tenant alice is not one") &&
                    strstr(hr.body, "admin tenant's token"),
                "%s", hr.body);
  ck_assert_ptr_null(strstr(hr.body, "topos_"));
  fprintf(stderr, "isolation: /metrics as alice: %d %s\n", hr.status, hr.body);
  http_reply_clear(&hr);
  ck_assert(log_has(&b.d, "refused /metrics from"));

  /* Each tenant's Stats: its own calls, both transports; a Stats call is
   * counted once answered, so the next one sees it. */
  topos_client_stats_info sa, sb, sx;
  stats_of(a, &sa);
  ck_assert_int_eq(sa.requests, 8);
  ck_assert_int_eq(sa.errors, 3);
  stats_of(a, &sa);
  ck_assert_int_eq(sa.requests, 9);
  ck_assert_int_eq(sa.errors, 3);
  stats_of(o, &sb);
  ck_assert_int_eq(sb.requests, 3);
  ck_assert_int_eq(sb.errors, 1);
  /* The admin's: the daemon's, every tenant's calls (alice 10, bob 4). */
  stats_of(adm, &sx);
  ck_assert_int_eq(sx.requests, 14);
  ck_assert_int_eq(sx.errors, 4);

  /* The admin's scrape: the daemon's counts as the scrape's Stats read
   * them (14 and the admin's Stats: not the scrape's own, counted once
   * answered), and each tenant's lines, written after that (so ops has
   * its Stats and the scrape's). */
  get_as(b.d.http_port, "/metrics", b.ops, &hr);
  ck_assert_msg(hr.status == 200, "%d %s", hr.status, hr.body);
  ck_assert_int_eq(sample(hr.body, "topos_calls_total"), 15);
  ck_assert_int_eq(sample(hr.body, "topos_call_errors_total"), 4);
  ck_assert_ptr_nonnull(
      strstr(hr.body, "# TYPE topos_tenant_requests_total counter\n"));
  ck_assert_int_eq(tenant_sample(hr.body, "alice", "OK"), 7);
  ck_assert_int_eq(tenant_sample(hr.body, "alice", "NOT_FOUND"), 3);
  ck_assert_int_eq(tenant_sample(hr.body, "bob", "OK"), 3);
  ck_assert_int_eq(tenant_sample(hr.body, "bob", "NOT_FOUND"), 1);
  ck_assert_int_eq(tenant_sample(hr.body, "ops", "OK"), 2);
  ck_assert_int_eq(tenant_sample(hr.body, "ops", "NOT_FOUND"), -1);
  ck_assert_int_eq(tenant_sample(hr.body, "(other)", "OK"), -1);
  /* The per-method counts stay global. */
  ck_assert_int_eq(sample(hr.body,
                          "topos_requests_total{method=\"Describe\","
                          "transport=\"grpc\",code=\"NOT_FOUND\"}"),
                   4);
  http_reply_clear(&hr);

  /* Calls refused before a worker ran them count for their tenant too:
   * bob under a rate of one call (his bucket starts full), then refused
   * over gRPC and over HTTP. */
  ck_assert_int_eq(run_cli(b.d.store, "quota set bob --rate 0.01 --burst 1",
                           NULL, 0, NULL, 0),
                   0);
  list_ids(o, ids, 4);
  Topos__V1__ListSpecsRequest lr = TOPOS__V1__LIST_SPECS_REQUEST__INIT;
  uint8_t *out = NULL;
  size_t out_len = 0;
  ck_assert_int_eq(raw(o, "/topos.v1.Topos/ListSpecs", &lr.base, &out, &out_len,
                       msg, sizeof msg),
                   RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(msg, "quota rate") != NULL, "%s", msg);
  free(out);
  get_as(b.d.http_port, "/v1/specs", b.bob, &hr);
  HTTP_ASSERT_ERROR(&hr, 429, "RESOURCE_EXHAUSTED");
  http_reply_clear(&hr);
  get_as(b.d.http_port, "/metrics", b.ops, &hr);
  ck_assert_msg(hr.status == 200, "%d %s", hr.status, hr.body);
  ck_assert_int_eq(tenant_sample(hr.body, "bob", "OK"), 4);
  ck_assert_int_eq(tenant_sample(hr.body, "bob", "RESOURCE_EXHAUSTED"), 2);
  ck_assert_int_eq(tenant_sample(hr.body, "alice", "OK"), 7);
  ck_assert_int_eq(tenant_sample(hr.body, "ops", "OK"), 3);
  http_reply_clear(&hr);
  stats_of(a, &sa);
  ck_assert_int_eq(sa.requests, 10);
  ck_assert_int_eq(sa.errors, 3);

  topos_client_close(a);
  topos_client_close(o);
  topos_client_close(adm);
  box_stop(&b);
}
END_TEST

START_TEST(test_request_counts_auth_off) {
  /* No tenants on loopback: no auth, nothing kept per tenant; Stats and
   * /metrics are the daemon's, as before tenants. */
  daemon_proc d = {0};
  daemon_dir(&d);
  char var[400];
  snprintf(var, sizeof var, "%s/var", d.dir);
  mkdir(var, 0700);
  daemon_start(&d, NULL);
  grpc_up();
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", d.port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  char ids[4][65];
  list_ids(c, ids, 4);
  list_ids(c, ids, 4);
  topos_client_stats_info st;
  stats_of(c, &st);
  ck_assert_int_eq(st.requests, 2);
  ck_assert_int_eq(st.errors, 0);
  http_reply hr;
  http_get(d.http_port, "/metrics", &hr);
  ck_assert_msg(hr.status == 200, "%d %s", hr.status, hr.body);
  ck_assert_int_eq(sample(hr.body, "topos_calls_total"), 3);
  ck_assert_ptr_null(strstr(hr.body, "topos_tenant_requests_total"));
  http_reply_clear(&hr);
  topos_client_close(c);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_request_counts_cap) {
  /* One more tenant than the table holds, and one more: t0000 (an admin)
   * to t1025.  Made on the store directly (the CLI would take a process
   * per tenant and token). */
  enum { CAP = 1024, TENANTS = CAP + 2 };
  daemon_proc d = {0};
  daemon_dir(&d);
  char var[400];
  snprintf(var, sizeof var, "%s/var", d.dir);
  mkdir(var, 0700);
  topos_error err = {0};
  topos_store *st = store_open(d.store, &err);
  ck_assert_msg(st != NULL, "%s", err.message);
  char(*secret)[STORE_TOKEN_SECRET_LEN + 1] = calloc(TENANTS, sizeof *secret);
  ck_assert_ptr_nonnull(secret);
  for (int i = 0; i < TENANTS; i++) {
    char name[16], id[STORE_TOKEN_ID_LEN + 1];
    snprintf(name, sizeof name, "t%04d", i);
    ck_assert_msg(store_tenant_add(st, name, i == 0, &err) == TOPOS_OK, "%s",
                  err.message);
    ck_assert_msg(store_token_create(st, name, id, secret[i], &err) == TOPOS_OK,
                  "%s", err.message);
  }
  store_close(st);
  daemon_start(&d, NULL);
  grpc_up();
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", d.port);
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  /* One Stats each, in order: t0000 .. t1023 take the rows, t1024 and
   * t1025 count as "(other)". */
  topos_client_stats_info s;
  for (int i = 0; i < TENANTS; i++) {
    ck_assert_int_eq(topos_client_set_token(c, secret[i], &err), TOPOS_OK);
    stats_of(c, &s);
  }
  /* A tenant with a row sees its own count; one past the cap sees none
   * (never the shared row's: that would be other tenants' calls). */
  ck_assert_int_eq(topos_client_set_token(c, secret[1], &err), TOPOS_OK);
  stats_of(c, &s);
  ck_assert_int_eq(s.requests, 1);
  ck_assert_int_eq(topos_client_set_token(c, secret[CAP + 1], &err), TOPOS_OK);
  stats_of(c, &s);
  ck_assert_int_eq(s.requests, 0);
  ck_assert_int_eq(s.errors, 0);
  ck_assert(log_has(&d,
                    "1024 tenants have request counts; the calls of "
                    "tenant t1024 and of any further tenant"));
  http_reply hr;
  get_as(d.http_port, "/metrics", secret[0], &hr);
  ck_assert_msg(hr.status == 200, "%d %s", hr.status, hr.body);
  ck_assert_int_eq(tenant_sample(hr.body, "t0000", "OK"), 2);
  ck_assert_int_eq(tenant_sample(hr.body, "t0001", "OK"), 2);
  ck_assert_int_eq(tenant_sample(hr.body, "t1023", "OK"), 1);
  ck_assert_int_eq(tenant_sample(hr.body, "t1024", "OK"), -1);
  ck_assert_int_eq(tenant_sample(hr.body, "t1025", "OK"), -1);
  ck_assert_int_eq(tenant_sample(hr.body, "(other)", "OK"), 3);
  ck_assert_int_eq(sample(hr.body, "topos_calls_total"), TENANTS + 2);
  http_reply_clear(&hr);
  free(secret);
  topos_client_close(c);
  grpc_down();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

Suite *isolation_suite(void) {
  Suite *s = suite_create("isolation");
  TCase *tc = tcase_create("isolation");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_blobs_and_specs);
  tcase_add_test(tc, test_eviction);
  tcase_add_test(tc, test_early_ack);
  tcase_add_test(tc, test_request_counts);
  tcase_add_test(tc, test_request_counts_auth_off);
  tcase_add_test(tc, test_request_counts_cap);
  suite_add_tcase(s, tc);
  return s;
}
