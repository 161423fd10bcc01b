/*
 * test_strings.c - every string field of every request is UTF-8 without
 * NUL before anything is stored or run (issue 10, item 6), against a real
 * toposd on loopback with a real SQLite store: a spec whose node name is
 * not UTF-8, or holds a NUL (which protobuf-c alone would cut to "loss"),
 * is INVALID_ARGUMENT naming the field path and the byte, and the store
 * is unchanged (Stats, Describe of the id the cut spec would have had);
 * valid non-ASCII names round-trip through Record, Describe (text and
 * JSON) and a Forward by name, and every reply parses as UTF-8.  Bad
 * strings in other requests (ids, value names, backend hints) get the
 * same rule, and unknown backend hints are refused by every RPC that
 * takes one, naming the known backends.
 */
#include "harness.h"
#include "utf8.h"

/* Packs m, replaces the first occurrence of `marker` in the bytes with
 * `with` (same length: the framing stays valid), and calls method. */
static void call_patched(client *c, const char *method,
                         const ProtobufCMessage *m, const char *marker,
                         const char *with, size_t n, reply *r) {
  size_t len = 0;
  uint8_t *buf = pack(m, &len);
  uint8_t *at = memmem(buf, len, marker, n);
  ck_assert_msg(at != NULL, "marker '%s' not in the packed message", marker);
  memcpy(at, with, n);
  call_raw(c, method, buf, len, 0, r);
  free(buf);
}

static int64_t spec_count(client *c) {
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(c, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  int64_t n = st->specs;
  wire_message_free(&st->base);
  return n;
}

static void expect_status(const reply *r, int status, const char *needle,
                          const char *what) {
  ck_assert_msg(r->status == status, "%s: status %d, want %d (%s)", what,
                r->status, status, r->details);
  ck_assert_msg(strstr(r->details, needle) != NULL, "%s: '%s' lacks '%s'", what,
                r->details, needle);
}

/* A small network whose node 3 is named `name` (and the others plainly). */
static topos_network *named_network(const char *name, topos_value *loss) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *two = topos_tensor_scalar(TOPOS_F64, 2.0, &err);
  topos_value w = topos_name(tape, topos_parameter(tape, two), "w");
  topos_value x = topos_name(tape, topos_input(tape, two), "x");
  topos_value p = topos_mul(tape, w, x);
  *loss = topos_name(tape, topos_mul(tape, p, p), name);
  topos_tensor_release(two);
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  return net;
}

START_TEST(test_record_refuses_bad_names) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  topos_error err = {0};
  /* A spec recorded first, so "unchanged" means something. */
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  ck_assert_int_eq(spec_count(&C), 1);

  /* The spec with a placeholder name, patched into bad bytes on the wire
   * (the engine no longer records such a name locally). */
  topos_value loss;
  topos_network *net = named_network("lossQx", &loss);
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, &err), TOPOS_OK);
  struct {
    const char *patch, *expect;
  } bad[] = {
      {"loss\0x", "Spec.nodes[3].name: contains NUL at byte 4"},
      {"lo\xc0\xafxx",
       "Spec.nodes[3].name: not valid UTF-8 (an overlong encoding) at byte 2"},
      {"l\xed\xa0\x80xx",
       "Spec.nodes[3].name: not valid UTF-8 (a surrogate) at "
       "byte 1"},
      {"loss\xe6\x8d", "(a truncated sequence) at byte 4"},
      {"loss\xf5\x80", "(above U+10FFFF) at byte 4"},
      {"\xfflossx", "cannot start a character) at byte 0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    reply r;
    call_patched(&C, "Record", &spec.base, "lossQx", bad[i].patch, 6, &r);
    expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, bad[i].expect,
                  bad[i].patch);
    ck_assert_int_eq(r.topos_code, TOPOS_ERR_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(r.details, "Record: "));
    reply_clear(&r);
  }
  /* Nothing was stored: the count, and the id the NUL-cut spec ("loss")
   * would have had. */
  ck_assert_int_eq(spec_count(&C), 1);
  topos_value cut_loss;
  topos_network *cut = named_network("loss", &cut_loss);
  char cut_id[65];
  ck_assert_int_eq(topos_network_id(cut, cut_id, &err), TOPOS_OK);
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = cut_id;
  reply r;
  call_msg(&C, "Describe", &dr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_NOT_FOUND, cut_id, "describe the cut spec");
  reply_clear(&r);
  /* The earlier spec is still served. */
  dr.id = id;
  Topos__V1__TextReply *tr = NULL;
  CALL_OK(&C, "Describe", &dr, &topos__v1__text_reply__descriptor, &tr);
  wire_message_free(&tr->base);

  wire_message_clear(&spec.base);
  topos_network_release(net);
  topos_network_release(cut);
  topos_network_release(g.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

/* A reply's text field is valid UTF-8 (what a proto3 client demands). */
static void expect_utf8(const char *s, const char *what) {
  size_t at = 0;
  const char *why = NULL;
  ck_assert_msg(topos_utf8_check(s, strlen(s), &at, &why), "%s: %s at byte %zu",
                what, why, at);
}

START_TEST(test_non_ascii_names_round_trip) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  topos_error err = {0};
  const char *name = "\xce\xbb_\xe6\x8d\x9f\xe5\xa4\xb1"; /* λ_损失 */
  topos_value loss;
  topos_network *net = named_network(name, &loss);
  char id[65];
  record(&C, net, id); /* checks the id is the engine's */
  for (int f = 0; f < 2; f++) {
    Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
    dr.id = id;
    dr.format = f == 0 ? TOPOS__V1__FORMAT__TEXT : TOPOS__V1__FORMAT__JSON;
    Topos__V1__TextReply *tr = NULL;
    CALL_OK(&C, "Describe", &dr, &topos__v1__text_reply__descriptor, &tr);
    expect_utf8(tr->text, "describe");
    ck_assert_msg(strstr(tr->text, name) != NULL, "format %d: %s", f, tr->text);
    wire_message_free(&tr->base);
  }
  /* A Forward naming the root by its name, and the record reply's
   * summary, parse and hold the name byte for byte. */
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  Topos__V1__Entry entry = TOPOS__V1__ENTRY__INIT;
  Topos__V1__Value *root = wire_value_new_name(name);
  entry.roots = &root;
  entry.n_roots = 1;
  fr.id = id;
  fr.entry = &entry;
  Topos__V1__ForwardReply *rep = NULL;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &rep);
  ck_assert_uint_eq(rep->n_roots, 1);
  topos_tensor *t = tensor_of(rep->roots[0]);
  double v = 0;
  ck_assert_int_eq(topos_tensor_read(t, &v, sizeof v, &err), TOPOS_OK);
  ck_assert(v == 16.0);
  topos_tensor_release(t);
  wire_message_free(&rep->base);
  wire_message_free(&root->base);
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, &err), TOPOS_OK);
  Topos__V1__RecordReply *rr = NULL;
  CALL_OK(&C, "Record", &spec, &topos__v1__record_reply__descriptor, &rr);
  expect_utf8(rr->summary, "summary");
  ck_assert_str_eq(rr->id, id);
  wire_message_free(&rr->base);
  wire_message_clear(&spec.base);
  topos_network_release(net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

/* The rule holds for every RPC's strings, checked on the raw bytes. */
START_TEST(test_other_request_strings) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  topos_error err = {0};
  reply r;

  /* An id that is not UTF-8: the path, not "not hex". */
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  char bad_id[65];
  memcpy(bad_id, id, 65);
  bad_id[10] = (char)0xC3;
  dr.id = bad_id;
  call_msg(&C, "Describe", &dr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "Describe: DescribeRequest.id: not valid UTF-8 (a truncated "
                "sequence) at byte 10",
                "describe id");
  reply_clear(&r);

  /* A feed input named with a NUL inside ("x\0y" would read as "x", an
   * input of the spec). */
  topos_tensor *three = topos_tensor_scalar(TOPOS_F64, 3.0, &err);
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  topos_entry e = {
      &g.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  Topos__V1__Feed feed = TOPOS__V1__FEED__INIT;
  feed.input = wire_value_new_name("xQy");
  feed.tensor = wire_tensor_new(three, &err);
  Topos__V1__Feed *feeds[1] = {&feed};
  fr.feeds = feeds;
  fr.n_feeds = 1;
  call_patched(&C, "Forward", &fr.base, "xQy", "x\0y", 3, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "ForwardRequest.feeds[0].input.name: contains NUL at byte 1",
                "feed name");
  reply_clear(&r);
  /* An entry backend "cpu\0..." would read as "cpu". */
  fr.entry->backend = strdup("cpuQzz");
  fr.n_feeds = 0;
  call_patched(&C, "Forward", &fr.base, "cpuQzz", "cpu\0zz", 6, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "ForwardRequest.entry.backend: contains NUL at byte 3",
                "entry backend");
  reply_clear(&r);
  wire_message_free(&fr.entry->base);
  wire_message_free(&feed.input->base);
  wire_message_free(&feed.tensor->base);

  /* Step: the loss by a name that is not UTF-8. */
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = id;
  sr.loss = wire_value_new_name("lo\x80ss");
  topos_optimizer sgd = topos_sgd(0.1, 0);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(&sgd, NULL, &om, &err), TOPOS_OK);
  sr.optimizer = &om;
  call_msg(&C, "Step", &sr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "StepRequest.loss.name: not valid UTF-8 (a stray continuation "
                "byte) at byte 2",
                "step loss");
  reply_clear(&r);
  wire_message_free(&sr.loss->base);

  /* PutBlob: a blob reference id deep in the list. */
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  Topos__V1__Tensor *ts[2] = {wire_tensor_new(three, &err),
                              wire_tensor_new_ref(id, 0, &err)};
  pb.tensors = ts;
  pb.n_tensors = 2;
  char patch[64];
  memcpy(patch, id, 64);
  patch[63] = 0;
  call_patched(&C, "PutBlob", &pb.base, id, patch, 64, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "PutBlobRequest.tensors[1].blob.id: contains NUL at byte 63",
                "blob id");
  reply_clear(&r);
  wire_message_free(&ts[0]->base);
  wire_message_free(&ts[1]->base);
  topos_tensor_release(three);
  ck_assert_int_eq(spec_count(&C), 1);
  assert_serving(&C);
  topos_network_release(g.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

/* An unknown backend hint is refused wherever one can be given, naming
 * the known backends; one cut by a NUL is refused as a string. */
START_TEST(test_backend_hints) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  topos_error err = {0};
  reply r;
  const char *known = "unknown backend 'nope' (known: reference";
  topos_entry e = {
      &g.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};

  Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
  lr.id = id;
  lr.entry = wire_entry_new(&e, "nope", &err);
  call_msg(&C, "Lower", &lr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Lower");
  reply_clear(&r);
  Topos__V1__EmitRequest er = TOPOS__V1__EMIT_REQUEST__INIT;
  er.id = id;
  er.entry = lr.entry;
  call_msg(&C, "Emit", &er.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Emit");
  reply_clear(&r);
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = lr.entry;
  call_msg(&C, "Forward", &fr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Forward entry");
  reply_clear(&r);
  wire_message_free(&lr.entry->base);

  Topos__V1__ExecOptions x = TOPOS__V1__EXEC_OPTIONS__INIT;
  x.backend = "nope";
  fr.entry = wire_entry_new(&e, NULL, &err);
  fr.exec = &x;
  call_msg(&C, "Forward", &fr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Forward exec");
  reply_clear(&r);
  Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  Topos__V1__ExecOptions *cands[1] = {&x};
  cr.id = id;
  cr.entry = fr.entry;
  cr.candidates = cands;
  cr.n_candidates = 1;
  call_msg(&C, "Conformance", &cr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Conformance");
  reply_clear(&r);
  wire_message_free(&fr.entry->base);

  Topos__V1__BackwardRequest br = TOPOS__V1__BACKWARD_REQUEST__INIT;
  br.id = id;
  br.loss = value_msg(g.loss);
  br.exec = &x;
  call_msg(&C, "Backward", &br.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Backward");
  reply_clear(&r);
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  topos_optimizer sgd = topos_sgd(0.1, 0);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(&sgd, NULL, &om, &err), TOPOS_OK);
  sr.id = id;
  sr.loss = br.loss;
  sr.optimizer = &om;
  sr.exec = &x;
  call_msg(&C, "Step", &sr.base, NULL, NULL, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT, known, "Step");
  reply_clear(&r);
  /* "cpu\0xx" is not "cpu". */
  x.backend = "cpuQxx";
  call_patched(&C, "Step", &sr.base, "cpuQxx", "cpu\0xx", 6, &r);
  expect_status(&r, GRPC_STATUS_INVALID_ARGUMENT,
                "StepRequest.exec.backend: contains NUL at byte 3", "Step NUL");
  reply_clear(&r);
  /* A known one runs. */
  x.backend = "reference";
  Topos__V1__StepReply *rep = NULL;
  CALL_OK(&C, "Step", &sr, &topos__v1__step_reply__descriptor, &rep);
  wire_message_free(&rep->base);
  wire_message_free(&br.loss->base);
  topos_network_release(g.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

Suite *strings_suite(void) {
  Suite *s = suite_create("strings");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, grpc_up, grpc_down);
  tcase_add_test(tc, test_record_refuses_bad_names);
  tcase_add_test(tc, test_non_ascii_names_round_trip);
  tcase_add_test(tc, test_other_request_strings);
  tcase_add_test(tc, test_backend_hints);
  suite_add_tcase(s, tc);
  return s;
}
