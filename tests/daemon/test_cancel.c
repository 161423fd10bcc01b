/*
 * test_cancel.c - a cancelled call's worker stops within one node's time,
 * and inside a long node at a coarse granularity (docs/daemon.md,
 * "Cancellation").
 *
 * Every test runs a daemon with one worker, starts a call, cancels it
 * from the client after 200 ms and times how long the only worker takes
 * to answer a tiny Forward queued behind it (Health is answered by the
 * front itself): that is the cancel-to-stop latency.  The long node is
 * one matmul of two [n,n] broadcasts of a scalar parameter, n grown until
 * the daemon's own Forward of it takes at least 1.5 s: a check only at
 * node boundaries leaves the worker busy for most of that, and the bound
 * is at most 0.5 s.
 */
#include "harness.h"

static daemon_proc D;
static client C;
/* The probe: a Forward of the gradient-descent spec, which needs the
 * worker. */
static gd_net G;
static uint8_t *probe;
static size_t probe_len;

/* loss = sum(matmul(broadcast(a, [n,n]), broadcast(b, [n,n]))): one long
 * node (the matmul) between cheap ones. */
typedef struct mm_net {
  topos_network *net;
  topos_value a, b, product, loss;
  int64_t n;
} mm_net;

static mm_net matmul_network(int64_t n) {
  topos_error err = {0};
  mm_net m = {.n = n};
  topos_tensor *a0 = topos_tensor_scalar(TOPOS_F32, 0.5, &err);
  topos_tensor *b0 = topos_tensor_scalar(TOPOS_F32, 0.25, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  m.a = topos_name(tape, topos_parameter(tape, a0), "a");
  m.b = topos_name(tape, topos_parameter(tape, b0), "b");
  int64_t s[2] = {n, n};
  topos_value ba = topos_broadcast(tape, m.a, 2, s);
  topos_value bb = topos_broadcast(tape, m.b, 2, s);
  m.product = topos_name(tape, topos_matmul(tape, ba, bb), "product");
  m.loss = topos_name(tape, topos_sum(tape, m.product), "loss");
  m.net = topos_tape_seal(tape, &err);
  ck_assert_msg(m.net != NULL, "matmul net: %s", err.message);
  topos_tensor_release(a0);
  topos_tensor_release(b0);
  return m;
}

/* The matmul network whose in-process forward takes at least `seconds`
 * here with the daemon's backends (auto, exact); *took is that time. */
static mm_net calibrated_matmul(double seconds, const char *backend,
                                double *took) {
  topos_backends_register_defaults();
  mm_net m = {0};
  double t = 0;
  for (int64_t n = 256; t < seconds; n = n * 5 / 4) {
    if (m.net) topos_network_release(m.net);
    m = matmul_network(n);
    topos_error err = {0};
    topos_exec ex = {.backend = backend};
    double t0 = now_s();
    topos_run *run = topos_forward(m.net, NULL, NULL, 0, &ex, &err);
    t = now_s() - t0;
    ck_assert_msg(run != NULL, "forward: %s", err.message);
    topos_run_free(run);
    ck_assert_msg(n < 20000, "no matmul takes %.1f s here", seconds);
  }
  *took = t;
  return m;
}

/* Starts a unary call, cancels it after `cancel_ms` and waits for its
 * status; *cancel_at is when the cancel was sent. */
static int call_cancelled(client *c, const char *method, const uint8_t *msg,
                          size_t len, int cancel_ms, double *cancel_at) {
  char path[128];
  snprintf(path, sizeof path, "/topos.v1.Topos/%s", method);
  grpc_slice method_slice = grpc_slice_from_copied_string(path);
  grpc_call *call = grpc_channel_create_call(
      c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, method_slice, NULL,
      gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  grpc_slice_unref(method_slice);
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)msg, len);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_metadata_array initial, trailing;
  grpc_metadata_array_init(&initial);
  grpc_metadata_array_init(&trailing);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = send;
  ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &initial;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &recv;
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[n].data.recv_status_on_client.status = &status;
  ops[n++].data.recv_status_on_client.status_details = &details;
  int tag = 0;
  ck_assert_int_eq(grpc_call_start_batch(call, ops, n, &tag, NULL),
                   GRPC_CALL_OK);
  usleep((useconds_t)cancel_ms * 1000);
  *cancel_at = now_s();
  grpc_call_cancel(call, NULL);
  grpc_event ev = grpc_completion_queue_pluck(
      c->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_byte_buffer_destroy(send);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&initial);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
  return (int)status;
}

/* Seconds from the cancel until the daemon's only worker answers the
 * probe. */
static double cancel_latency(const char *method, const uint8_t *msg,
                             size_t len) {
  double cancel_at = 0;
  int status = call_cancelled(&C, method, msg, len, 200, &cancel_at);
  ck_assert_int_eq(status, GRPC_STATUS_CANCELLED);
  reply r;
  call_raw(&C, "Forward", probe, probe_len, 0, &r);
  double latency = now_s() - cancel_at;
  ck_assert_msg(r.status == GRPC_STATUS_OK, "probe: %d %s", r.status,
                r.details);
  reply_clear(&r);
  return latency;
}

static void start(void) {
  const char *extra[] = {"--workers", "1", NULL};
  fixture_start(&D, &C, extra);
  G = gd_network(0);
  char id[65];
  record(&C, G.net, id);
  topos_error err = {0};
  topos_entry e = {
      &G.loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  probe = pack(&fr.base, &probe_len);
  wire_message_free(&fr.entry->base);
}

static void stop(void) {
  fixture_stop(&D, &C, 30);
  free(probe);
  probe = NULL;
  topos_network_release(G.net);
}

static Topos__V1__ExecOptions *exec_msg(const char *backend) {
  Topos__V1__ExecOptions *x = calloc(1, sizeof *x);
  topos__v1__exec_options__init(x);
  x->backend = (char *)backend;
  return x;
}

static uint8_t *forward_bytes(const mm_net *m, const char *id,
                              const char *backend, size_t *len) {
  topos_error err = {0};
  topos_value roots[1] = {m->loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = (char *)id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  fr.exec = backend ? exec_msg(backend) : NULL;
  uint8_t *bytes = pack(&fr.base, len);
  wire_message_free(&fr.entry->base);
  free(fr.exec);
  return bytes;
}

static uint8_t *backward_bytes(const mm_net *m, const char *id, size_t *len) {
  Topos__V1__BackwardRequest br = TOPOS__V1__BACKWARD_REQUEST__INIT;
  br.id = (char *)id;
  br.loss = value_msg(m->loss);
  uint8_t *bytes = pack(&br.base, len);
  wire_message_free(&br.loss->base);
  return bytes;
}

static uint8_t *step_bytes(const mm_net *m, const char *id, size_t *len) {
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  Topos__V1__Optimizer opt = TOPOS__V1__OPTIMIZER__INIT;
  opt.kind = TOPOS__V1__OPTIMIZER_KIND__SGD;
  opt.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  opt.lr = 0.01;
  sr.id = (char *)id;
  sr.loss = value_msg(m->loss);
  sr.optimizer = &opt;
  uint8_t *bytes = pack(&sr.base, len);
  wire_message_free(&sr.loss->base);
  return bytes;
}

static uint8_t *conformance_bytes(const mm_net *m, const char *id,
                                  size_t *len) {
  topos_error err = {0};
  topos_value roots[1] = {m->loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  cr.id = (char *)id;
  cr.entry = wire_entry_new(&e, NULL, &err);
  uint8_t *bytes = pack(&cr.base, len);
  wire_message_free(&cr.entry->base);
  return bytes;
}

/* The matmul network, recorded on the daemon, whose whole Forward takes
 * the daemon at least 1.5 s (timed there, so neither the machine's load
 * nor the daemon's threads can make the node short by accident); *node
 * is that time. */
static mm_net daemon_matmul(const char *backend, char id[65], double *node) {
  double local = 0;
  mm_net m = calibrated_matmul(1.5, backend, &local);
  for (;;) {
    record(&C, m.net, id);
    size_t len;
    uint8_t *bytes = forward_bytes(&m, id, backend, &len);
    reply r;
    double t0 = now_s();
    call_raw(&C, "Forward", bytes, len, 0, &r);
    *node = now_s() - t0;
    free(bytes);
    ck_assert_msg(r.status == GRPC_STATUS_OK, "%d %s", r.status, r.details);
    reply_clear(&r);
    if (*node >= 1.5) return m;
    int64_t n = m.n * 5 / 4;
    topos_network_release(m.net);
    m = matmul_network(n);
  }
}

/* The bound a cancel must meet: well under the long node's own time, so
 * a worker that only looks at node boundaries (busy for the node's time
 * less the 200 ms before the cancel) cannot meet it. */
static double bound_of(double node_s) {
  double b = 0.1 + node_s / 4;
  return b < 0.5 ? b : 0.5;
}

static void check_latency(const char *what, double latency, double node_s) {
  fprintf(stderr, "cancel: %s stopped %.3f s after the cancel (node %.3f s)\n",
          what, latency, node_s);
  ck_assert_msg(latency < bound_of(node_s),
                "%s: the worker was busy %.3f s after the cancel; one node "
                "takes %.3f s, the bound is %.3f s",
                what, latency, node_s, bound_of(node_s));
}

START_TEST(test_cancel_forward_long_node) {
  double node = 0;
  start();
  char id[65];
  mm_net m = daemon_matmul(NULL, id, &node);
  size_t len;
  uint8_t *bytes = forward_bytes(&m, id, NULL, &len);
  check_latency("Forward (auto)", cancel_latency("Forward", bytes, len), node);
  free(bytes);
  stop();
  topos_network_release(m.net);
}
END_TEST

START_TEST(test_cancel_forward_reference) {
  double node = 0;
  start();
  char id[65];
  mm_net m = daemon_matmul("reference", id, &node);
  size_t len;
  uint8_t *bytes = forward_bytes(&m, id, "reference", &len);
  check_latency("Forward (reference)", cancel_latency("Forward", bytes, len),
                node);
  free(bytes);
  stop();
  topos_network_release(m.net);
}
END_TEST

START_TEST(test_cancel_backward_step_conformance) {
  double node = 0;
  start();
  char id[65];
  mm_net m = daemon_matmul(NULL, id, &node);
  size_t len;
  uint8_t *bytes = backward_bytes(&m, id, &len);
  check_latency("Backward", cancel_latency("Backward", bytes, len), node);
  free(bytes);
  bytes = step_bytes(&m, id, &len);
  check_latency("Step", cancel_latency("Step", bytes, len), node);
  free(bytes);
  bytes = conformance_bytes(&m, id, &len);
  check_latency("Conformance", cancel_latency("Conformance", bytes, len), node);
  free(bytes);
  stop();
  topos_network_release(m.net);
}
END_TEST

Suite *cancel_suite(void) {
  Suite *s = suite_create("cancel");
  TCase *tc = tcase_create("cancel");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_cancel_forward_long_node);
  tcase_add_test(tc, test_cancel_forward_reference);
  tcase_add_test(tc, test_cancel_backward_step_conformance);
  suite_add_tcase(s, tc);
  return s;
}
