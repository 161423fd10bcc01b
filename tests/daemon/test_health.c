/*
 * test_health.c - the standard grpc.health.v1 protocol against a real
 * toposd, with a client built from the standard proto (proto/health.proto
 * is grpc's own health.proto): Check and the Watch stream, SERVING, then
 * NOT_SERVING when the drain begins, and the stream's end with the
 * daemon.  Also the proto3 JSON mapping the HTTP gateway speaks
 * (proto/pbjson.c), by itself.
 */
#include "harness.h"
#include "health.pb-c.h"
#include "pbjson.h"

static daemon_proc D;
static client C;

typedef struct watch {
  grpc_call *call;
  grpc_metadata_array initial, trailing;
  grpc_status_code status;
  grpc_slice details;
  bool ended;
} watch;

static void watch_start(watch *w, const char *service) {
  memset(w, 0, sizeof *w);
  grpc_slice method =
      grpc_slice_from_static_string("/grpc.health.v1.Health/Watch");
  w->call = grpc_channel_create_call(C.ch, NULL, GRPC_PROPAGATE_DEFAULTS, C.cq,
                                     method, NULL,
                                     gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  Grpc__Health__V1__HealthCheckRequest req =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  size_t len = 0;
  uint8_t *bytes = pack(&req.base, &len);
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)bytes, len);
  free(bytes);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_metadata_array_init(&w->initial);
  grpc_metadata_array_init(&w->trailing);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &w->initial;
  int tag = 1;
  ck_assert_int_eq(grpc_call_start_batch(w->call, ops, 4, &tag, NULL),
                   GRPC_CALL_OK);
  grpc_event ev = grpc_completion_queue_pluck(
      C.cq, &tag,
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_seconds(30, GPR_TIMESPAN)),
      NULL);
  ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
  ck_assert(ev.success);
  grpc_byte_buffer_destroy(send);
}

/* The next status on the stream, or -1 when the stream ended (its status
 * is then in w->status). */
static int watch_next(watch *w, double timeout_s) {
  grpc_byte_buffer *recv = NULL;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &recv;
  int tag = 2;
  ck_assert_int_eq(grpc_call_start_batch(w->call, &op, 1, &tag, NULL),
                   GRPC_CALL_OK);
  grpc_event ev = grpc_completion_queue_pluck(
      C.cq, &tag,
      gpr_time_add(
          gpr_now(GPR_CLOCK_MONOTONIC),
          gpr_time_from_millis((int64_t)(timeout_s * 1000), GPR_TIMESPAN)),
      NULL);
  ck_assert_msg(ev.type == GRPC_OP_COMPLETE, "no message within %.1f s",
                timeout_s);
  if (recv == NULL) {
    /* The stream is over: read its status. */
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &w->trailing;
    op.data.recv_status_on_client.status = &w->status;
    op.data.recv_status_on_client.status_details = &w->details;
    tag = 3;
    ck_assert_int_eq(grpc_call_start_batch(w->call, &op, 1, &tag, NULL),
                     GRPC_CALL_OK);
    ev = grpc_completion_queue_pluck(C.cq, &tag,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    w->ended = true;
    return -1;
  }
  grpc_byte_buffer_reader rd;
  ck_assert(grpc_byte_buffer_reader_init(&rd, recv));
  grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
  Grpc__Health__V1__HealthCheckResponse *r =
      grpc__health__v1__health_check_response__unpack(
          NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  ck_assert_ptr_nonnull(r);
  int status = (int)r->status;
  grpc__health__v1__health_check_response__free_unpacked(r, NULL);
  grpc_slice_unref(all);
  grpc_byte_buffer_reader_destroy(&rd);
  grpc_byte_buffer_destroy(recv);
  return status;
}

static void watch_free(watch *w) {
  if (!w->ended) grpc_call_cancel(w->call, NULL);
  grpc_metadata_array_destroy(&w->initial);
  grpc_metadata_array_destroy(&w->trailing);
  grpc_slice_unref(w->details);
  grpc_call_unref(w->call);
}

START_TEST(test_health_watch) {
  const char *extra[] = {"--grace-ms", "20000", "--workers", "2", NULL};
  fixture_start(&D, &C, extra);
  enum {
    SERVING = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
    NOT_SERVING =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING,
    UNKNOWN =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
  };
  watch all, topos, other;
  watch_start(&all, "");
  watch_start(&topos, "topos.v1.Topos");
  watch_start(&other, "no.such.Service");
  ck_assert_int_eq(watch_next(&all, 10), SERVING);
  ck_assert_int_eq(watch_next(&topos, 10), SERVING);
  ck_assert_int_eq(watch_next(&other, 10), UNKNOWN);

  /* Check agrees. */
  Grpc__Health__V1__HealthCheckRequest hc =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  Grpc__Health__V1__HealthCheckResponse *hr = NULL;
  CALL_OK(&C, "/grpc.health.v1.Health/Check", &hc,
          &grpc__health__v1__health_check_response__descriptor, &hr);
  ck_assert_int_eq(hr->status, SERVING);
  wire_message_free(&hr->base);

  /* A call in flight keeps the daemon draining for a while: the watchers
   * hear NOT_SERVING when SIGTERM arrives, and the stream ends when the
   * daemon stops. */
  topos_value out;
  topos_network *net = calibrated_slow_network(1.0, &out, NULL);
  char id[65];
  record(&C, net, id);
  flood_arg s = {.port = D.port};
  uint8_t *bytes = NULL;
  slow_forward_request(net, out, id, &bytes, &s.len);
  s.bytes = bytes;
  pthread_t t;
  pthread_create(&t, NULL, flood_one, &s);
  wait_run_in_flight(&C, 30);
  kill(D.pid, SIGTERM);
  ck_assert_int_eq(watch_next(&all, 10), NOT_SERVING);
  ck_assert_int_eq(watch_next(&topos, 10), NOT_SERVING);
  pthread_join(t, NULL);
  ck_assert_int_eq(s.status, GRPC_STATUS_OK);
  ck_assert_int_eq(watch_next(&all, 30), -1);
  ck_assert_int_eq(all.status, GRPC_STATUS_UNAVAILABLE);
  ck_assert_int_eq(watch_next(&other, 30), -1);
  watch_free(&all);
  watch_free(&topos);
  watch_free(&other);
  free(bytes);
  fixture_stop(&D, &C, 30);
  topos_network_release(net);
}
END_TEST

START_TEST(test_health_watch_client_goes) {
  /* Watchers that hang up are forgotten; the daemon serves on and stops
   * cleanly. */
  fixture_start(&D, &C, NULL);
  for (int i = 0; i < 20; i++) {
    watch w;
    watch_start(&w, "");
    ck_assert_int_eq(watch_next(&w, 10), 1);
    watch_free(&w);
  }
  assert_serving(&C);
  fixture_stop(&D, &C, 30);
}
END_TEST

/* ------------------------------------------------------------- pbjson */

static ProtobufCMessage *from_text(const ProtobufCMessageDescriptor *desc,
                                   const char *text, char *msg, size_t len) {
  cJSON *doc = cJSON_Parse(text);
  ck_assert_msg(doc != NULL, "test JSON does not parse: %s", text);
  ProtobufCMessage *m = pbjson_to_message(desc, doc, msg, len);
  cJSON_Delete(doc);
  return m;
}

START_TEST(test_pbjson_round_trip) {
  /* A message with every kind of field: enums, 64-bit integers, bytes,
   * repeated messages, a oneof, doubles with NaN and infinities. */
  const char *text =
      "{\"id\":\"abc\",\"entry\":{\"roots\":[{\"index\":3},{\"name\":\"loss\"}]"
      ","
      "\"posture\":\"TRAINING\",\"numerics\":\"FAST\",\"threads\":4},"
      "\"parameters\":[{\"dtype\":\"F64\",\"shape\":[\"2\",\"3\"],"
      "\"data\":\"AAECAwQFBgc=\"}],"
      "\"candidates\":[{\"numerics\":\"EXACT\",\"backend\":\"cpu\"}]}";
  char msg[512];
  Topos__V1__ConformanceRequest *r = (Topos__V1__ConformanceRequest *)from_text(
      &topos__v1__conformance_request__descriptor, text, msg, sizeof msg);
  ck_assert_msg(r != NULL, "%s", msg);
  ck_assert_str_eq(r->id, "abc");
  ck_assert_int_eq(r->entry->n_roots, 2);
  ck_assert_int_eq(r->entry->roots[0]->ref_case, TOPOS__V1__VALUE__REF_INDEX);
  ck_assert_int_eq(r->entry->roots[0]->index, 3);
  ck_assert_str_eq(r->entry->roots[1]->name, "loss");
  ck_assert_int_eq(r->entry->posture, TOPOS__V1__POSTURE__TRAINING);
  ck_assert_int_eq(r->entry->threads, 4);
  ck_assert_int_eq(r->parameters[0]->n_shape, 2);
  ck_assert_int_eq(r->parameters[0]->shape[1], 3);
  ck_assert_int_eq(r->parameters[0]->data.len, 8);
  ck_assert_int_eq(r->parameters[0]->data.data[7], 7);
  ck_assert_str_eq(r->candidates[0]->backend, "cpu");
  /* Back to JSON, and the packed bytes survive the round trip. */
  cJSON *back = pbjson_from_message(&r->base);
  ck_assert_ptr_nonnull(back);
  char msg2[512];
  Topos__V1__ConformanceRequest *r2 =
      (Topos__V1__ConformanceRequest *)pbjson_to_message(
          &topos__v1__conformance_request__descriptor, back, msg2, sizeof msg2);
  ck_assert_msg(r2 != NULL, "%s", msg2);
  size_t l1 = 0, l2 = 0;
  uint8_t *b1 = pack(&r->base, &l1), *b2 = pack(&r2->base, &l2);
  ck_assert_int_eq(l1, l2);
  ck_assert(memcmp(b1, b2, l1) == 0);
  char *printed = cJSON_PrintUnformatted(back);
  ck_assert_ptr_nonnull(strstr(printed, "\"shape\":[\"2\",\"3\"]"));
  ck_assert_ptr_nonnull(strstr(printed, "\"posture\":\"TRAINING\""));
  ck_assert_ptr_nonnull(strstr(printed, "\"data\":\"AAECAwQFBgc=\""));
  free(printed);
  free(b1);
  free(b2);
  cJSON_Delete(back);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  protobuf_c_message_free_unpacked(&r2->base, NULL);

  /* Doubles: NaN and the infinities as the mapping's strings. */
  Topos__V1__OutputResult o = TOPOS__V1__OUTPUT_RESULT__INIT;
  o.max_ulp = NAN;
  o.max_relative = INFINITY;
  o.rel_l2 = -INFINITY;
  o.envelope = 0.5;
  cJSON *oj = pbjson_from_message(&o.base);
  char *ot = cJSON_PrintUnformatted(oj);
  ck_assert_ptr_nonnull(strstr(ot, "\"maxUlp\":\"NaN\""));
  ck_assert_ptr_nonnull(strstr(ot, "\"maxRelative\":\"Infinity\""));
  ck_assert_ptr_nonnull(strstr(ot, "\"relL2\":\"-Infinity\""));
  ck_assert_ptr_nonnull(strstr(ot, "\"envelope\":0.5"));
  free(ot);
  cJSON_Delete(oj);
  /* Proto names are read too, and base64 without padding or URL-safe. */
  Topos__V1__Tensor *t = (Topos__V1__Tensor *)from_text(
      &topos__v1__tensor__descriptor, "{\"dtype\":1,\"data\":\"_-8\"}", msg,
      sizeof msg);
  ck_assert_msg(t != NULL, "%s", msg);
  ck_assert_int_eq(t->dtype, TOPOS__V1__DTYPE__F64);
  ck_assert_int_eq(t->data.len, 2);
  ck_assert_int_eq(t->data.data[0], 0xff);
  ck_assert_int_eq(t->data.data[1], 0xef);
  protobuf_c_message_free_unpacked(&t->base, NULL);
  Topos__V1__ListSpecsRequest *l = (Topos__V1__ListSpecsRequest *)from_text(
      &topos__v1__list_specs_request__descriptor,
      "{\"page_size\": 7, \"page_token\": \"x\", \"pageToken\": \"y\"}", msg,
      sizeof msg);
  ck_assert_msg(l != NULL, "%s", msg);
  ck_assert_int_eq(l->page_size, 7);
  ck_assert_str_eq(l->page_token, "y"); /* the later one wins */
  protobuf_c_message_free_unpacked(&l->base, NULL);
}
END_TEST

START_TEST(test_pbjson_refuses) {
  const struct {
    const char *json, *want;
  } cases[] = {
      {"{\"nope\": 1}", "nope: topos.v1.Entry has no such field"},
      {"{\"threads\": -1}", "threads: -1 is out of range"},
      {"{\"threads\": 4294967296}",
       "threads: 4294967296 is out of uint32 range"},
      {"{\"threads\": 1.5}", "threads: 1.5 is not an integer"},
      {"{\"threads\": \"12a\"}", "threads: '12a' is not an integer"},
      {"{\"threads\": true}", "threads: expected an integer"},
      {"{\"posture\": \"SIDEWAYS\"}",
       "posture: 'SIDEWAYS' is not one of FORWARD, TRAINING"},
      {"{\"roots\": {}}", "roots: expected an array"},
      {"{\"roots\": [null]}", "roots[0]: null in an array"},
      {"{\"roots\": [{\"index\": 1, \"name\": \"a\"}]}",
       "roots[0].name: another member of its oneof is set too"},
      {"{\"roots\": [{\"index\": \"99999999999\"}]}",
       "roots[0].index: 99999999999 is out of int32 range"},
      {"{\"roots\": [7]}", "roots[0]: expected an object (topos.v1.Value)"},
      {"{\"backend\": 3}", "backend: expected a string"},
      {"{\"roots\": [{\"name\": \"a\", \"name\": \"b\"}]}",
       "roots[0].name: given twice"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char msg[512] = "";
    ProtobufCMessage *m = from_text(&topos__v1__entry__descriptor,
                                    cases[i].json, msg, sizeof msg);
    ck_assert_msg(m == NULL, "%s was accepted", cases[i].json);
    ck_assert_msg(strcmp(msg, cases[i].want) == 0, "%s: '%s', want '%s'",
                  cases[i].json, msg, cases[i].want);
  }
  char msg[512];
  ck_assert_ptr_null(from_text(&topos__v1__tensor__descriptor,
                               "{\"data\": \"***\"}", msg, sizeof msg));
  ck_assert_str_eq(msg, "data: not base64");
  ck_assert_ptr_null(
      from_text(&topos__v1__tensor__descriptor, "[]", msg, sizeof msg));
  /* Nesting deeper than the limit (a Spec's node tensor's blob is only 4
   * deep, so build depth with a chain the descriptors allow: none do
   * beyond a few levels, and the limit only guards future messages). */
  ck_assert_int_ge(PBJSON_MAX_DEPTH, 8);
  /* null is the default. */
  Topos__V1__Entry *e = (Topos__V1__Entry *)from_text(
      &topos__v1__entry__descriptor, "{\"roots\": null, \"backend\": null}",
      msg, sizeof msg);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->n_roots, 0);
  ck_assert_str_eq(e->backend, "");
  protobuf_c_message_free_unpacked(&e->base, NULL);
}
END_TEST

/* Probes run on the queue thread, not in a worker's turn: however many
 * come, a work call after them still wakes a sleeping worker at once.
 * (A probe once counted itself among the workers awake, a count only a
 * worker's next pop gives back, so each probe hid one more sleeper and
 * the next work calls waited for their deadlines.) */
START_TEST(test_probes_then_work) {
  const char *extra[] = {"--workers", "2", NULL};
  fixture_start(&D, &C, extra);
  for (int i = 0; i < 20; i++) assert_serving(&C);
  for (int i = 0; i < 10; i++) {
    usleep(20000); /* the workers stop polling and sleep */
    Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
    Topos__V1__StatsReply *r = NULL;
    double t0 = now_s();
    CALL_OK(&C, "Stats", &q, &topos__v1__stats_reply__descriptor, &r);
    double took = now_s() - t0;
    ck_assert_msg(took < 5, "Stats after probes took %.1f s", took);
    wire_message_free(&r->base);
    assert_serving(&C);
  }
  fixture_stop(&D, &C, 30);
}
END_TEST

Suite *health_suite(void) {
  Suite *s = suite_create("health");
  TCase *tc = tcase_create("watch");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_health_watch);
  tcase_add_test(tc, test_health_watch_client_goes);
  tcase_add_test(tc, test_probes_then_work);
  suite_add_tcase(s, tc);
  TCase *pj = tcase_create("pbjson");
  tcase_add_test(pj, test_pbjson_round_trip);
  tcase_add_test(pj, test_pbjson_refuses);
  suite_add_tcase(s, pj);
  return s;
}
