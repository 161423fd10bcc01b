/*
 * test_http.c - the HTTP JSON gateway against a real toposd on loopback
 * with a real SQLite file: every route answers what gRPC answers, errors
 * map to statuses with JSON bodies, keep-alive and pipelining, hostile
 * requests (malformed, oversized, slow, abandoned, a thousand idle
 * connections), metrics accepted by promtool, and the drain.
 */
#include <sys/resource.h>

#include "harness.h"
#include "http_client.h"
#include "pbjson.h"

static daemon_proc D;
static client C;

static void up(const char *const *extra) {
  fixture_start(&D, &C, extra);
}
static void down(void) {
  fixture_stop(&D, &C, 30);
}

/* The gRPC Describe text of id in a format. */
static char *grpc_describe(const char *id, Topos__V1__Format format) {
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = (char *)id;
  dr.format = format;
  Topos__V1__TextReply *tr = NULL;
  CALL_OK(&C, "Describe", &dr, &topos__v1__text_reply__descriptor, &tr);
  char *text = strdup(tr->text);
  wire_message_free(&tr->base);
  return text;
}

static Topos__V1__Entry *loss_entry(const mlp_net *m) {
  topos_error err = {0};
  topos_value roots[1] = {m->loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__Entry *pe = wire_entry_new(&e, NULL, &err);
  ck_assert_ptr_nonnull(pe);
  return pe;
}

/* Stats' spec count and bytes: what the hostile tests must not move. */
static void store_counts(int64_t *specs, int64_t *bytes) {
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(&C, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  *specs = st->specs;
  *bytes = st->spec_bytes;
  wire_message_free(&st->base);
}

/* The daemon serves on (gRPC and HTTP) and its store holds what it held. */
static void assert_store_unchanged(int64_t specs0, int64_t bytes0) {
  int64_t specs1, bytes1;
  store_counts(&specs1, &bytes1);
  ck_assert_int_eq(specs1, specs0);
  ck_assert_int_eq(bytes1, bytes0);
  assert_serving(&C);
  http_reply r;
  http_get(D.http_port, "/healthz", &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
}

START_TEST(test_http_routes_match_grpc) {
  up(NULL);
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  topos_error err = {0};

  /* Record: the protobuf Spec as octet-stream, and as JSON: same id. */
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(m.net, &spec, &err), TOPOS_OK);
  size_t len = 0;
  uint8_t *bytes = pack(&spec.base, &len);
  http_reply r;
  http_do(D.http_port, "POST", "/v1/specs", "application/octet-stream", bytes,
          len, &r);
  ck_assert_msg(r.status == 200, "record: %d %s", r.status, r.body);
  cJSON *doc = cJSON_Parse(r.body);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "id")->valuestring, id);
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "nodes")->valueint,
                   topos_network_node_count(m.net));
  cJSON_Delete(doc);
  http_reply_clear(&r);
  free(bytes);
  cJSON *json_spec = pbjson_from_message(&spec.base);
  char *spec_text = cJSON_PrintUnformatted(json_spec);
  cJSON_Delete(json_spec);
  http_do(D.http_port, "POST", "/v1/specs", "application/json", spec_text,
          strlen(spec_text), &r);
  ck_assert_msg(r.status == 200, "record json: %d %s", r.status, r.body);
  ck_assert_ptr_nonnull(strstr(r.body, id));
  http_reply_clear(&r);
  free(spec_text);
  wire_message_clear(&spec.base);

  /* Describe in every text format: the gRPC text, byte for byte. */
  const char *formats[3] = {"text", "json", "dot"};
  const char *types[3] = {"text/plain", "application/json",
                          "text/vnd.graphviz"};
  for (int f = 0; f < 3; f++) {
    char path[160], v[128];
    snprintf(path, sizeof path, "/v1/specs/%s?format=%s", id, formats[f]);
    http_get(D.http_port, path, &r);
    ck_assert_msg(r.status == 200, "%s: %d %s", path, r.status, r.body);
    char *want = grpc_describe(id, (Topos__V1__Format)f);
    ck_assert_str_eq(r.body, want);
    ck_assert_msg(strncmp(http_header(&r, "Content-Type", v, sizeof v),
                          types[f], strlen(types[f])) == 0,
                  "%s: content type %s", formats[f], v);
    free(want);
    http_reply_clear(&r);
  }
  char path[200];
  snprintf(path, sizeof path, "/v1/specs/%s", id);
  http_get(D.http_port, path, &r);
  char *text = grpc_describe(id, TOPOS__V1__FORMAT__TEXT);
  ck_assert_str_eq(r.body, text); /* text is the default */
  free(text);
  http_reply_clear(&r);

  /* Lower and Emit: the entry as JSON in, gRPC's answers out. */
  Topos__V1__Entry *entry = loss_entry(&m);
  cJSON *ej = pbjson_from_message(&entry->base);
  char *entry_text = cJSON_PrintUnformatted(ej);
  cJSON_Delete(ej);
  Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
  lr.id = id;
  lr.entry = entry;
  Topos__V1__LowerReply *lw = NULL;
  CALL_OK(&C, "Lower", &lr, &topos__v1__lower_reply__descriptor, &lw);
  snprintf(path, sizeof path, "/v1/specs/%s/lower", id);
  http_do(D.http_port, "POST", path, "application/json", entry_text,
          strlen(entry_text), &r);
  ck_assert_msg(r.status == 200, "lower: %d %s", r.status, r.body);
  doc = cJSON_Parse(r.body);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "text")->valuestring, lw->text);
  char peak[32];
  snprintf(peak, sizeof peak, "%lld", (long long)lw->peak_bytes);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "peakBytes")->valuestring, peak);
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "groups")->valueint, lw->groups);
  cJSON_Delete(doc);
  http_reply_clear(&r);
  wire_message_free(&lw->base);
  for (int form = 0; form < 2; form++) {
    Topos__V1__EmitRequest er = TOPOS__V1__EMIT_REQUEST__INIT;
    er.id = id;
    er.entry = entry;
    er.form = (Topos__V1__Form)form;
    Topos__V1__TextReply *em = NULL;
    CALL_OK(&C, "Emit", &er, &topos__v1__text_reply__descriptor, &em);
    snprintf(path, sizeof path, "/v1/specs/%s/emit?form=%s", id,
             form ? "generic" : "pretty");
    http_do(D.http_port, "POST", path, "application/json", entry_text,
            strlen(entry_text), &r);
    ck_assert_msg(r.status == 200, "emit: %d %s", r.status, r.body);
    ck_assert_str_eq(r.body, em->text);
    http_reply_clear(&r);
    wire_message_free(&em->base);
  }

  /* Conformance: the table as JSON, every backend holding. */
  char body[4096];
  snprintf(body, sizeof body, "{\"entry\": %s}", entry_text);
  snprintf(path, sizeof path, "/v1/specs/%s/conformance", id);
  http_do(D.http_port, "POST", path, "application/json", body, strlen(body),
          &r);
  ck_assert_msg(r.status == 200, "conformance: %d %s", r.status, r.body);
  doc = cJSON_Parse(r.body);
  const cJSON *results = cJSON_GetObjectItem(doc, "results");
  ck_assert_int_ge(cJSON_GetArraySize(results), 1);
  const cJSON *row;
  cJSON_ArrayForEach(row, results) {
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(row, "holds")));
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(row, "bitIdentical")));
  }
  cJSON_Delete(doc);
  http_reply_clear(&r);
  free(entry_text);
  wire_message_free(&entry->base);

  /* Backends: the reference first. */
  http_get(D.http_port, "/v1/backends", &r);
  ck_assert_int_eq(r.status, 200);
  doc = cJSON_Parse(r.body);
  const cJSON *first =
      cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "backends"), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(first, "name")->valuestring,
                   "reference");
  cJSON_Delete(doc);
  http_reply_clear(&r);

  /* ListSpecs a page at a time: three specs, pages of two. */
  gd_net g1 = gd_network(1), g2 = gd_network(2);
  char id1[65], id2[65];
  record(&C, g1.net, id1);
  record(&C, g2.net, id2);
  http_get(D.http_port, "/v1/specs?page_size=2", &r);
  ck_assert_msg(r.status == 200, "list: %d %s", r.status, r.body);
  doc = cJSON_Parse(r.body);
  const cJSON *specs = cJSON_GetObjectItem(doc, "specs");
  ck_assert_int_eq(cJSON_GetArraySize(specs), 2);
  ck_assert_str_eq(
      cJSON_GetObjectItem(cJSON_GetArrayItem(specs, 0), "id")->valuestring,
      id2); /* newest first */
  char token[64];
  snprintf(token, sizeof token, "%s",
           cJSON_GetObjectItem(doc, "nextPageToken")->valuestring);
  ck_assert(token[0] != '\0');
  cJSON_Delete(doc);
  http_reply_clear(&r);
  snprintf(path, sizeof path, "/v1/specs?page_size=2&page_token=%s", token);
  http_get(D.http_port, path, &r);
  doc = cJSON_Parse(r.body);
  specs = cJSON_GetObjectItem(doc, "specs");
  ck_assert_int_eq(cJSON_GetArraySize(specs), 1);
  ck_assert_str_eq(
      cJSON_GetObjectItem(cJSON_GetArrayItem(specs, 0), "id")->valuestring, id);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "nextPageToken")->valuestring, "");
  cJSON_Delete(doc);
  http_reply_clear(&r);

  /* Health and readiness. */
  http_get(D.http_port, "/healthz", &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.body, "\"serving\""));
  http_reply_clear(&r);
  http_get(D.http_port, "/readyz", &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  /* HEAD: the headers of GET, no body. */
  http_conn *hc = calloc(1, sizeof *hc);
  hc->fd = http_connect(D.http_port);
  const char *head =
      "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  http_send_all(hc->fd, head, strlen(head));
  /* The HEAD response announces a length but carries no body, so read
   * its headers alone and then the GET. */
  double until = now_s() + 10;
  while (now_s() < until && !memmem(hc->buf, hc->len, "\r\n\r\n", 4)) {
    ssize_t n = recv(hc->fd, hc->buf + hc->len, sizeof hc->buf - hc->len, 0);
    if (n <= 0) break;
    hc->len += (size_t)n;
  }
  ck_assert(strncmp(hc->buf, "HTTP/1.1 200", 12) == 0);
  char *end = memmem(hc->buf, hc->len, "\r\n\r\n", 4);
  size_t cut = (size_t)(end - hc->buf) + 4;
  memmove(hc->buf, hc->buf + cut, hc->len - cut);
  hc->len -= cut;
  http_read(hc, 10, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.body, "serving"));
  http_reply_clear(&r);
  close(hc->fd);
  free(hc);

  topos_network_release(g1.net);
  topos_network_release(g2.net);
  topos_network_release(m.net);
  down();
}
END_TEST

START_TEST(test_http_errors) {
  up(NULL);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  int64_t specs0, bytes0;
  store_counts(&specs0, &bytes0);
  http_reply r;
  char path[300];
  struct {
    const char *method, *path, *type, *body;
    int status;
    const char *code;
  } cases[] = {
      {"GET",
       "/v1/specs/"
       "0000000000000000000000000000000000000000000000000000000000000000",
       NULL, NULL, 404, "NOT_FOUND"},
      {"GET", "/v1/specs/not-an-id", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs/..%2F..%2Fetc%2Fpasswd", NULL, NULL, 400,
       "INVALID_ARGUMENT"},
      {"GET", "/v1/specs/../../etc/passwd", NULL, NULL, 404, "NOT_FOUND"},
      {"GET", "/v1/specs/%2e%2e", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs/abc%00def", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs/abc%zz", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs?page_size=-1", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs?page_size=5000", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs?page_token=zz", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/v1/specs?pagesize=2", NULL, NULL, 400, "INVALID_ARGUMENT"},
      {"GET", "/nowhere", NULL, NULL, 404, "NOT_FOUND"},
      {"GET", "/v1/specs/x/y/z/w", NULL, NULL, 404, "NOT_FOUND"},
      {"DELETE", "/v1/specs", NULL, NULL, 405, "METHOD_NOT_ALLOWED"},
      {"POST", "/healthz", NULL, "", 405, "METHOD_NOT_ALLOWED"},
      {"POST", "/v1/specs", "text/plain", "hello", 415, "INVALID_ARGUMENT"},
      {"POST", "/v1/specs", "application/octet-stream", "\xff\xff\xff", 400,
       "INVALID_ARGUMENT"},
      {"POST", "/v1/specs", "application/json", "{\"nodes\": 3}", 400,
       "INVALID_ARGUMENT"},
      {"POST", "/v1/specs", "application/json", "{not json", 400,
       "INVALID_ARGUMENT"},
      {"POST", "/v1/specs", "application/json", "{\"dtype\": \"F128\"}", 400,
       "INVALID_ARGUMENT"},
      /* A rank-0 target with no extents (UBSan caught memcpy from NULL
       * in the engine's recorder under schemathesis). */
      {"POST", "/v1/specs", "application/json",
       "{\"nodes\": [{\"op\": \"BROADCAST\", \"shape\": []}]}", 400,
       "INVALID_ARGUMENT"},
      {"POST", "/v1/specs", "application/json",
       "{\"nodes\": [{\"op\": \"PERMUTE\", \"perm\": []}]}", 400,
       "INVALID_ARGUMENT"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    http_do(D.http_port, cases[i].method, cases[i].path, cases[i].type,
            cases[i].body, cases[i].body ? strlen(cases[i].body) : 0, &r);
    char code[64];
    http_error_code(&r, code, sizeof code);
    ck_assert_msg(
        r.status == cases[i].status && strcmp(code, cases[i].code) == 0,
        "%s %s: want %d %s, got %d %s", cases[i].method, cases[i].path,
        cases[i].status, cases[i].code, r.status, r.body);
    if (r.status == 405) {
      char allow[64];
      ck_assert(http_header(&r, "Allow", allow, sizeof allow)[0] != '\0');
    }
    http_reply_clear(&r);
  }
  /* Per-spec routes: bad query values, bad bodies. */
  const struct {
    const char *method, *suffix, *body;
    int status;
  } spec_cases[] = {
      {"GET", "?format=png", NULL, 400},
      {"GET", "?format=json&extra=1", NULL, 400},
      {"POST", "/lower", "{\"roots\": [{\"name\": \"nope\"}]}", 400},
      {"POST", "/lower", "{\"roots\": [{\"index\": 1, \"name\": \"x\"}]}", 400},
      {"POST", "/lower", "{\"rootz\": []}", 400},
      {"POST", "/lower", "{\"threads\": 99999}", 400},
      {"POST", "/lower", "{\"roots\": [{\"index\": 1.5}]}", 400},
      {"POST", "/lower", "[1, 2]", 400},
      {"POST", "/emit?form=ugly", "{}", 400},
      {"POST", "/conformance", "{\"id\": \"abc\"}", 400},
      {"POST", "/conformance", "{\"id\": \"\"}", 400}, /* no entry */
      {"POST", "/conformance", "{\"parameters\": [{\"data\": \"!!\"}]}", 400},
      {"POST", "/frobnicate", "{}", 404},
      {"GET", "/lower", NULL, 405},
  };
  for (size_t i = 0; i < sizeof spec_cases / sizeof *spec_cases; i++) {
    snprintf(path, sizeof path, "/v1/specs/%s%s", id, spec_cases[i].suffix);
    http_do(D.http_port, spec_cases[i].method, path,
            spec_cases[i].body ? "application/json" : NULL, spec_cases[i].body,
            spec_cases[i].body ? strlen(spec_cases[i].body) : 0, &r);
    char code[64];
    http_error_code(&r, code, sizeof code);
    ck_assert_msg(r.status == spec_cases[i].status && code[0] != '\0',
                  "%s %s: want %d, got %d %s", spec_cases[i].method, path,
                  spec_cases[i].status, r.status, r.body);
    http_reply_clear(&r);
  }
  assert_store_unchanged(specs0, bytes0);
  topos_network_release(g.net);
  down();
}
END_TEST

START_TEST(test_http_keepalive_pipelining) {
  up(NULL);
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(D.http_port);
  /* Three requests in one write: three answers, in order, and the
   * connection stays open. */
  const char *three =
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /v1/backends HTTP/1.1\r\nHost: x\r\n\r\n";
  http_send_all(c->fd, three, strlen(three));
  http_reply r;
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.body, "serving"));
  ck_assert(!r.closed);
  http_reply_clear(&r);
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 404);
  ck_assert(!r.closed);
  http_reply_clear(&r);
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.body, "reference"));
  http_reply_clear(&r);
  /* A request split across writes byte by byte still parses. */
  const char *one = "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t i = 0; one[i]; i++) {
    http_send_all(c->fd, one + i, 1);
    usleep(1000);
  }
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  /* A POST body with Expect: 100-continue gets the interim response. */
  const char *expect =
      "POST /v1/specs HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\n"
      "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  http_send_all(c->fd, expect, strlen(expect));
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 100);
  http_reply_clear(&r);
  http_send_all(c->fd, "{}", 2);
  http_read(c, 10, &r); /* an empty Spec: refused, but answered */
  ck_assert_int_eq(r.status, 400);
  ck_assert(!r.closed);
  http_reply_clear(&r);
  /* Chunked bodies are taken. */
  const char *chunked =
      "POST /v1/specs HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n"
      "1\r\n{\r\n1\r\n}\r\n0\r\n\r\n";
  http_send_all(c->fd, chunked, strlen(chunked));
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 400); /* the same empty Spec */
  ck_assert_ptr_nonnull(strstr(r.body, "INVALID_ARGUMENT"));
  http_reply_clear(&r);
  /* Connection: close is honoured. */
  const char *last =
      "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  http_send_all(c->fd, last, strlen(last));
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert(r.closed);
  http_reply_clear(&r);
  ck_assert(http_closed(c->fd, 5));
  close(c->fd);
  free(c);
  down();
}
END_TEST

/* Sends raw bytes on a new connection and reads one response. */
static void raw_exchange(const char *bytes, size_t len, double timeout_s,
                         http_reply *r, int *fd_out) {
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(D.http_port);
  ck_assert_int_ge(c->fd, 0);
  http_send_all(c->fd, bytes, len);
  http_read(c, timeout_s, r);
  if (fd_out)
    *fd_out = c->fd;
  else
    close(c->fd);
  free(c);
}

START_TEST(test_http_hostile) {
  const char *extra[] = {"--http-body-bytes",
                         "4K",
                         "--http-header-bytes",
                         "2K",
                         "--http-read-timeout-ms",
                         "400",
                         NULL};
  up(extra);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  int64_t specs0, bytes0;
  store_counts(&specs0, &bytes0);
  http_reply r;
  int fd = -1;
  struct {
    const char *what, *bytes;
    int status;
  } cases[] = {
      {"garbage line", "GARBAGE\r\n\r\n", 400},
      {"no version (HTTP/0.9)", "GET /healthz\r\n\r\n", 505},
      {"HTTP/2.0", "GET /healthz HTTP/2.0\r\n\r\n", 505},
      {"bad version", "GET /healthz HTTP/x.y\r\n\r\n", 400},
      {"space in header name", "GET /healthz HTTP/1.1\r\nBad Header: 1\r\n\r\n",
       400},
      {"space before the colon",
       "POST /v1/specs HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello", 400},
      {"control byte in target", "GET /he\x01lthz HTTP/1.1\r\n\r\n", 400},
      {"length and chunked",
       "POST /v1/specs HTTP/1.1\r\nContent-Length: 3\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"bad chunk size",
       "POST /v1/specs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       400},
      {"huge chunk size",
       "POST /v1/specs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
       "ffffffffffffffffff\r\n",
       400},
      {"overflowing length",
       "POST /v1/specs HTTP/1.1\r\nContent-Length: "
       "99999999999999999999999\r\n\r\n",
       400},
      {"body over the limit",
       "POST /v1/specs HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413},
      {"negative length",
       "POST /v1/specs HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"CONNECT", "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n", 405},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    raw_exchange(cases[i].bytes, strlen(cases[i].bytes), 10, &r, &fd);
    char code[64];
    http_error_code(&r, code, sizeof code);
    ck_assert_msg(r.status == cases[i].status && code[0],
                  "%s: want %d, got %d: %s", cases[i].what, cases[i].status,
                  r.status, r.body ? r.body : "");
    ck_assert_msg(r.closed && http_closed(fd, 5),
                  "%s: the connection stays open", cases[i].what);
    close(fd);
    http_reply_clear(&r);
  }

  /* Headers over 2K: 431; a long target: 414 or 431, whichever limit its
   * bytes reach first. */
  char *big = malloc(12000);
  int n = snprintf(big, 12000, "GET /healthz HTTP/1.1\r\nX-Big: ");
  memset(big + n, 'a', 3000);
  n += 3000;
  n += snprintf(big + n, 12000 - (size_t)n, "\r\n\r\n");
  raw_exchange(big, (size_t)n, 10, &r, NULL);
  HTTP_ASSERT_ERROR(&r, 431, "RESOURCE_EXHAUSTED");
  http_reply_clear(&r);
  n = snprintf(big, 12000, "GET /");
  memset(big + n, 'a', 9000);
  n += 9000;
  n += snprintf(big + n, 12000 - (size_t)n, " HTTP/1.1\r\n\r\n");
  raw_exchange(big, (size_t)n, 10, &r, NULL);
  ck_assert_msg(r.status == 414 || r.status == 431, "long target: %d",
                r.status);
  http_reply_clear(&r);
  /* 200 header fields of a few bytes each. */
  n = snprintf(big, 12000, "GET /healthz HTTP/1.1\r\n");
  for (int i = 0; i < 200; i++)
    n += snprintf(big + n, 12000 - (size_t)n, "A%d: 1\r\n", i);
  n += snprintf(big + n, 12000 - (size_t)n, "\r\n");
  raw_exchange(big, (size_t)n, 10, &r, NULL);
  HTTP_ASSERT_ERROR(&r, 431, "RESOURCE_EXHAUSTED");
  http_reply_clear(&r);

  /* A chunked body that passes 4K: 413 once it does. */
  n = snprintf(big, 12000,
               "POST /v1/specs HTTP/1.1\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n");
  for (int i = 0; i < 6; i++) {
    n += snprintf(big + n, 12000 - (size_t)n, "400\r\n");
    memset(big + n, ' ', 1024);
    n += 1024;
    n += snprintf(big + n, 12000 - (size_t)n, "\r\n");
  }
  raw_exchange(big, (size_t)n, 10, &r, NULL);
  HTTP_ASSERT_ERROR(&r, 413, "RESOURCE_EXHAUSTED");
  http_reply_clear(&r);
  free(big);

  /* Slow senders: headers not complete within 400 ms, or a body that
   * stops: 408, and the connection closes. */
  const char *partial[2] = {
      "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1",
      "POST /v1/specs HTTP/1.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 100\r\n\r\n{\"dtype\":"};
  for (int i = 0; i < 2; i++) {
    double t0 = now_s();
    raw_exchange(partial[i], strlen(partial[i]), 10, &r, &fd);
    double took = now_s() - t0;
    HTTP_ASSERT_ERROR(&r, 408, "DEADLINE_EXCEEDED");
    ck_assert_msg(took > 0.3 && took < 5, "408 after %.2f s", took);
    ck_assert(http_closed(fd, 5));
    close(fd);
    http_reply_clear(&r);
  }
  /* A byte every 100 ms does not extend the header deadline. */
  http_conn *c = calloc(1, sizeof *c);
  c->fd = http_connect(D.http_port);
  const char *drip = "GET /healthz HTTP/1.1\r\nX-Drip: aaaaaaaaaaaaaaaaaaaa";
  double t0 = now_s();
  for (size_t i = 0; drip[i] && now_s() - t0 < 3; i++) {
    http_send_all(c->fd, drip + i, 1);
    usleep(100000);
  }
  http_read(c, 5, &r);
  HTTP_ASSERT_ERROR(&r, 408, "DEADLINE_EXCEEDED");
  http_reply_clear(&r);
  close(c->fd);
  free(c);

  /* Abrupt closes: mid-headers, mid-body, and right after a request. */
  const char *cut[3] = {
      "GET /v1/backends HTTP/1.1\r\nHo",
      "POST /v1/specs HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"a",
      "GET /v1/backends HTTP/1.1\r\n\r\n"};
  for (int round = 0; round < 20; round++)
    for (int i = 0; i < 3; i++) {
      int s = http_connect(D.http_port);
      http_send_all(s, cut[i], strlen(cut[i]));
      if (round % 2) {
        struct linger lg = {1, 0}; /* RST rather than FIN */
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      }
      close(s);
    }

  /* The daemon serves on, and nothing stored changed. */
  assert_store_unchanged(specs0, bytes0);
  topos_network_release(g.net);
  down();
}
END_TEST

START_TEST(test_http_client_gone_cancels) {
  /* One worker, a Conformance that takes seconds, and a client that hangs
   * up 300 ms in: the call is cancelled and the worker is free again at
   * once, as with gRPC. */
  const char *extra[] = {"--workers", "1", NULL};
  up(extra);
  topos_value out;
  double took = 0;
  topos_network *net = calibrated_slow_network(1.0, &out, &took);
  char id[65];
  record(&C, net, id);
  char body[128], head[512];
  snprintf(body, sizeof body, "{\"entry\": {\"roots\": [{\"index\": %d}]}}",
           out.index);
  int n = snprintf(head, sizeof head,
                   "POST /v1/specs/%s/conformance HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/json\r\nContent-Length: %zu"
                   "\r\n\r\n%s",
                   id, strlen(body), body);
  int fd = http_connect(D.http_port);
  http_send_all(fd, head, (size_t)n);
  usleep(300000);
  close(fd);
  double t0 = now_s();
  http_reply r;
  http_get(D.http_port, "/v1/backends", &r); /* needs the one worker */
  double waited = now_s() - t0;
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  /* Conformance runs the reference and every exact backend: at least
   * twice the forward's time when it is not cancelled. */
  ck_assert_msg(waited < took,
                "the worker was busy %.2f s after the client "
                "left (a forward takes %.2f s)",
                waited, took);
  double until = now_s() + 10;
  while (!log_has(&D, "method=Conformance") && now_s() < until) usleep(50000);
  ck_assert_msg(log_has(&D, "status=CANCELLED"),
                "the abandoned Conformance was not cancelled (log %s)", D.log);
  topos_network_release(net);
  down();
}
END_TEST

static void raise_fd_limit(void) {
  struct rlimit rl;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

START_TEST(test_http_idle_connections) {
  raise_fd_limit();
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  ck_assert_msg(rl.rlim_cur >= 2200, "descriptor limit %llu is below 2200",
                (unsigned long long)rl.rlim_cur);
  const char *extra[] = {"--http-max-connections", "1200", NULL};
  up(extra);
  /* 1000 idle connections: each one accepted and kept; a new client is
   * still served at once, and so is a request on an old one. */
  enum { IDLE = 1000 };
  int *fds = malloc(sizeof(int) * IDLE);
  for (int i = 0; i < IDLE; i++) {
    fds[i] = http_connect(D.http_port);
    ck_assert_msg(fds[i] >= 0, "connection %d: %s", i, strerror(errno));
  }
  http_reply r;
  double t0 = now_s();
  http_get(D.http_port, "/healthz", &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert_msg(now_s() - t0 < 2, "healthz took %.2f s", now_s() - t0);
  http_reply_clear(&r);
  http_conn *c = calloc(1, sizeof *c);
  c->fd = fds[IDLE / 2];
  const char *req = "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";
  http_send_all(c->fd, req, strlen(req));
  http_read(c, 10, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  free(c);
  http_get(D.http_port, "/metrics", &r);
  ck_assert_int_eq(r.status, 200);
  const char *open = strstr(r.body, "\ntopos_http_connections ");
  ck_assert_ptr_nonnull(open);
  ck_assert_int_ge(strtol(open + 24, NULL, 10), IDLE);
  http_reply_clear(&r);
  for (int i = 0; i < IDLE; i++) close(fds[i]);
  free(fds);
  down();

  /* At a cap of 50, idle connections make room: the longest idle ones
   * are closed, and new clients are served. */
  const char *capped[] = {"--http-max-connections", "50", NULL};
  up(capped);
  int many[80];
  for (int i = 0; i < 80; i++) {
    many[i] = http_connect(D.http_port);
    ck_assert_int_ge(many[i], 0);
    usleep(2000);
  }
  http_get(D.http_port, "/healthz", &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  int closed = 0;
  for (int i = 0; i < 80; i++) closed += http_closed(many[i], 0.05);
  ck_assert_msg(closed >= 30, "only %d of 80 idle connections were shed",
                closed);
  ck_assert_msg(!http_closed(many[79], 0.05), "the newest one was shed");
  for (int i = 0; i < 80; i++) close(many[i]);
  http_get(D.http_port, "/metrics", &r);
  const char *shed = strstr(r.body, "\ntopos_http_connections_shed_total ");
  ck_assert_ptr_nonnull(shed);
  ck_assert_int_ge(strtol(shed + 35, NULL, 10), 30);
  http_reply_clear(&r);
  down();
}
END_TEST

START_TEST(test_http_idle_timeout) {
  const char *extra[] = {"--http-idle-timeout-ms", "300", NULL};
  up(extra);
  int fd = http_connect(D.http_port);
  double t0 = now_s();
  ck_assert(http_closed(fd, 5));
  ck_assert_msg(now_s() - t0 > 0.25, "closed after %.2f s", now_s() - t0);
  close(fd);
  down();
}
END_TEST

START_TEST(test_http_metrics_promtool) {
  up(NULL);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  char path[200];
  snprintf(path, sizeof path, "/v1/specs/%s?format=json", id);
  http_reply r;
  for (int i = 0; i < 3; i++) {
    http_get(D.http_port, path, &r);
    ck_assert_int_eq(r.status, 200);
    http_reply_clear(&r);
  }
  http_get(D.http_port, "/v1/specs/nope", &r);
  http_reply_clear(&r);
  http_get(D.http_port, "/metrics", &r);
  ck_assert_int_eq(r.status, 200);
  char type[128];
  ck_assert(strncmp(http_header(&r, "Content-Type", type, sizeof type),
                    "text/plain; version=0.0.4", 25) == 0);
  const char *want[] = {
      "topos_requests_total{method=\"Describe\",transport=\"http\",code=\"OK\"}"
      " 3",
      "topos_requests_total{method=\"Describe\",transport=\"http\",code="
      "\"INVALID_ARGUMENT\"} 1",
      "topos_requests_total{method=\"Record\",transport=\"grpc\",code=\"OK\"} "
      "1",
      "topos_request_duration_seconds_count{method=\"Describe\",transport="
      "\"http\"} 4",
      "topos_request_duration_seconds_bucket{method=\"Describe\",transport="
      "\"http\",le=\"+Inf\"} 4",
      "\ntopos_queue_depth ",
      "\ntopos_workers_busy ",
      "\ntopos_cache_hits_total ",
      "\ntopos_cache_misses_total ",
      "\ntopos_store_specs 1\n",
      "\ntopos_store_spec_bytes ",
      "topos_backend_tasks_total{backend=\"reference\"}",
      "\ntopos_http_connections "};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    ck_assert_msg(strstr(r.body, want[i]) != NULL, "/metrics lacks '%s':\n%s",
                  want[i], r.body);
  /* promtool, Prometheus's own checker, accepts the exposition. */
  char file[400];
  snprintf(file, sizeof file, "%s/metrics.txt", D.dir);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fwrite(r.body, 1, r.body_len, f);
  fclose(f);
  http_reply_clear(&r);
  ck_assert_msg(system("command -v promtool >/dev/null") == 0,
                "promtool is not installed (make deps installs prometheus)");
  char cmd[900];
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s.out 2>&1", file,
           file);
  int rc = system(cmd);
  char out[2048] = "";
  snprintf(cmd, sizeof cmd, "%s.out", file);
  f = fopen(cmd, "r");
  if (f) {
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    fclose(f);
  }
  ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "promtool: %s", out);
  topos_network_release(g.net);
  down();
}
END_TEST

START_TEST(test_http_drain) {
  const char *extra[] = {"--grace-ms", "20000", "--workers", "2", NULL};
  up(extra);
  topos_value out;
  topos_network *net = calibrated_slow_network(1.5, &out, NULL);
  char id[65];
  record(&C, net, id);
  flood_arg s = {.port = D.port};
  uint8_t *bytes = NULL;
  slow_forward_request(net, out, id, &bytes, &s.len);
  s.bytes = bytes;
  /* An idle keep-alive connection, to see it closed by the drain. */
  int idle = http_connect(D.http_port);
  http_conn *kc = calloc(1, sizeof *kc);
  kc->fd = idle;
  const char *req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  http_send_all(idle, req, strlen(req));
  http_reply r;
  http_read(kc, 10, &r);
  ck_assert_int_eq(r.status, 200);
  http_reply_clear(&r);
  pthread_t t;
  pthread_create(&t, NULL, flood_one, &s);
  wait_run_in_flight(&C, 30);
  kill(D.pid, SIGTERM);
  /* Draining: alive, not ready, no new work, idle connections closed. */
  for (double until = now_s() + 10;; usleep(10000)) {
    http_get(D.http_port, "/healthz", &r);
    ck_assert_int_eq(r.status, 200);
    bool draining = strstr(r.body, "draining") != NULL;
    http_reply_clear(&r);
    if (draining) break;
    ck_assert_msg(now_s() < until, "/healthz never said draining");
  }
  http_get(D.http_port, "/readyz", &r);
  HTTP_ASSERT_ERROR(&r, 503, "UNAVAILABLE");
  http_reply_clear(&r);
  char path[200];
  snprintf(path, sizeof path, "/v1/specs/%s", id);
  http_get(D.http_port, path, &r);
  HTTP_ASSERT_ERROR(&r, 503, "UNAVAILABLE");
  http_reply_clear(&r);
  ck_assert(http_closed(idle, 5));
  close(idle);
  free(kc);
  pthread_join(t, NULL);
  ck_assert_int_eq(s.status, GRPC_STATUS_OK); /* in flight: it finished */
  free(bytes);
  down();
  topos_network_release(net);
}
END_TEST

START_TEST(test_http_off_and_bad_address) {
  const char *off[] = {"--http", "off", NULL};
  up(off);
  ck_assert_int_eq(D.http_port, 0);
  assert_serving(&C);
  down();
  /* An address that cannot be served is a start-up failure (exit 1). */
  daemon_proc a;
  memset(&a, 0, sizeof a);
  daemon_dir(&a);
  const char *build = getenv("TOPOS_BUILD");
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "timeout 20 %s/bin/toposd --listen 127.0.0.1:0 --http 192.0.2.1:1 "
           "--store %s >/dev/null 2>&1",
           build && *build ? build : "build", a.store);
  int status = system(cmd);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit %d",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  daemon_cleanup(&a);
}
END_TEST

/* The tail of a file, for failure messages. */
static void file_tail(const char *path, char *out, size_t outlen) {
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  if (fseek(f, 0, SEEK_END) == 0) {
    long size = ftell(f);
    fseek(f, size > (long)outlen - 1 ? size - (long)outlen + 1 : 0, SEEK_SET);
  }
  size_t n = fread(out, 1, outlen - 1, f);
  out[n] = '\0';
  fclose(f);
}

START_TEST(test_http_schemathesis) {
  /* schemathesis generates requests from /openapi.json (valid and
   * invalid ones) against the live gateway: no 5xx, every status and
   * content type documented, every response matching its schema. */
  const char *venv = getenv("SCHEMATHESIS_VENV");
  char st[600];
  snprintf(st, sizeof st, "%s/bin/st",
           venv && *venv ? venv : ".schemathesis-venv");
  ck_assert_msg(access(st, X_OK) == 0,
                "%s is missing: `make deps` installs schemathesis", st);
  up(NULL);
  /* A stored spec, so describe, lower, emit and the page have something
   * real behind the ids the examples use. */
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  /* Two runs: ids as generated (mostly malformed or unknown), then every
   * {id} the stored spec's, so the routes behind it run for real. */
  char config[400];
  snprintf(config, sizeof config, "%s/schemathesis.toml", D.dir);
  FILE *f = fopen(config, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "[parameters]\n\"path.id\" = \"%s\"\n", id);
  fclose(f);
  for (int run = 0; run < 2; run++) {
    char out[400], cmd[2400], with_config[500] = "";
    snprintf(out, sizeof out, "%s/schemathesis-%d.txt", D.dir, run);
    if (run == 1)
      snprintf(with_config, sizeof with_config, "--config-file %s", config);
    snprintf(cmd, sizeof cmd,
             "timeout 600 %s %s run http://127.0.0.1:%d/openapi.json "
             "--no-color --checks not_a_server_error,status_code_conformance,"
             "content_type_conformance,response_schema_conformance "
             "--max-examples 25 --seed 12 --workers 1 "
             "--suppress-health-check all > %s 2>&1",
             st, with_config, D.http_port, out);
    int rc = system(cmd);
    char tail[3000];
    file_tail(out, tail, sizeof tail);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
                  "schemathesis run %d found failures (exit %d):\n%s", run,
                  WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, tail);
    ck_assert_msg(strstr(tail, " passed") != NULL, "no cases ran:\n%s", tail);
  }
  /* And the daemon still serves. */
  assert_serving(&C);
  topos_network_release(m.net);
  down();
}
END_TEST

Suite *http_suite(void) {
  Suite *s = suite_create("http");
  TCase *tc = tcase_create("gateway");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_http_routes_match_grpc);
  tcase_add_test(tc, test_http_errors);
  tcase_add_test(tc, test_http_keepalive_pipelining);
  tcase_add_test(tc, test_http_hostile);
  tcase_add_test(tc, test_http_idle_connections);
  tcase_add_test(tc, test_http_idle_timeout);
  tcase_add_test(tc, test_http_metrics_promtool);
  tcase_add_test(tc, test_http_drain);
  tcase_add_test(tc, test_http_off_and_bad_address);
  tcase_add_test(tc, test_http_schemathesis);
  tcase_add_test(tc, test_http_client_gone_cancels);
  suite_add_tcase(s, tc);
  return s;
}
