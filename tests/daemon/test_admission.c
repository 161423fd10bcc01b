/*
 * test_admission.c - memory admission control (docs/daemon.md, "Memory
 * admission"): a run whose peak bound is over the per-run budget, or over
 * what the global budget has left beside the runs in flight, is
 * RESOURCE_EXHAUSTED at once with both numbers and nothing allocated; a
 * run within budget answers the engine's bits; and the memory of a large
 * admitted run goes back to the system afterwards (the pool's cap).
 */
#include "harness.h"

static daemon_proc D;
static client C;

static void start(const char *const *extra) {
  fixture_start(&D, &C, extra);
}

static void stop(void) {
  fixture_stop(&D, &C, 30);
}

/* loss = sum(exp(broadcast(s, [rows, cols]))) for a scalar parameter s:
 * a spec of a few dozen bytes whose run holds the exp's output and its
 * operand's compute copy, 8·rows·cols bytes at f32. */
typedef struct bcast_net {
  topos_network *net;
  topos_value s, loss;
} bcast_net;

static bcast_net broadcast_network(int64_t rows, int64_t cols) {
  topos_error err = {0};
  bcast_net b;
  topos_tensor *s0 = topos_tensor_scalar(TOPOS_F32, 0.001, &err);
  topos_tape *t = topos_tape_new(TOPOS_F32);
  b.s = topos_name(t, topos_parameter(t, s0), "s");
  int64_t shape[2] = {rows, cols};
  topos_value e = topos_exp(t, topos_broadcast(t, b.s, 2, shape));
  b.loss = topos_name(t, topos_sum(t, e), "loss");
  b.net = topos_tape_seal(t, &err);
  ck_assert_msg(b.net != NULL, "%s", err.message);
  topos_tensor_release(s0);
  return b;
}

static uint8_t *forward_bytes(const char *id, topos_value root, size_t *len) {
  topos_error err = {0};
  topos_entry e = {
      &root, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = (char *)id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  uint8_t *bytes = pack(&fr.base, len);
  wire_message_free(&fr.entry->base);
  return bytes;
}

static uint8_t *backward_bytes(const char *id, topos_value loss, size_t *len) {
  Topos__V1__BackwardRequest br = TOPOS__V1__BACKWARD_REQUEST__INIT;
  br.id = (char *)id;
  br.loss = value_msg(loss);
  uint8_t *bytes = pack(&br.base, len);
  wire_message_free(&br.loss->base);
  return bytes;
}

static uint8_t *step_bytes(const char *id, topos_value loss, size_t *len) {
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  Topos__V1__Optimizer opt = TOPOS__V1__OPTIMIZER__INIT;
  opt.kind = TOPOS__V1__OPTIMIZER_KIND__SGD;
  opt.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  opt.lr = 0.01;
  sr.id = (char *)id;
  sr.loss = value_msg(loss);
  sr.optimizer = &opt;
  uint8_t *bytes = pack(&sr.base, len);
  wire_message_free(&sr.loss->base);
  return bytes;
}

static uint8_t *conformance_bytes(const char *id, topos_value root,
                                  size_t *len) {
  topos_error err = {0};
  topos_entry e = {
      &root, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  cr.id = (char *)id;
  cr.entry = wire_entry_new(&e, NULL, &err);
  uint8_t *bytes = pack(&cr.base, len);
  wire_message_free(&cr.entry->base);
  return bytes;
}

/* The N of "<method> needs N bytes at its peak" in a refusal. */
static int64_t needed_bytes(const reply *r, const char *method) {
  char head[64];
  snprintf(head, sizeof head, "%s needs ", method);
  const char *at = strstr(r->details, head);
  ck_assert_msg(at != NULL, "no '%s' in '%s'", head, r->details);
  long long n = strtoll(at + strlen(head), NULL, 10);
  ck_assert_msg(n > 0, "%s", r->details);
  return n;
}

/* A refusal of `method` under the run budget, naming both numbers. */
static int64_t expect_over_run_budget(const char *method, const uint8_t *bytes,
                                      size_t len, int64_t budget) {
  reply r;
  call_raw(&C, method, bytes, len, 0, &r);
  ck_assert_msg(r.status == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %d %s", method,
                r.status, r.details);
  ck_assert_int_eq(r.topos_code, TOPOS_ERR_MEMORY);
  char budget_text[96];
  snprintf(budget_text, sizeof budget_text, "the run budget is %lld bytes",
           (long long)budget);
  ck_assert_msg(strstr(r.details, budget_text) != NULL, "%s: %s", method,
                r.details);
  int64_t n = needed_bytes(&r, method);
  ck_assert_msg(n > budget, "%s: %s", method, r.details);
  reply_clear(&r);
  return n;
}

/* The bits of a Forward reply's first root against an in-process plan
 * forward with the daemon's backends. */
static void expect_forward_bits(const reply *r, const topos_network *net,
                                topos_value root) {
  Topos__V1__ForwardReply *fr =
      topos__v1__forward_reply__unpack(NULL, r->len, r->data);
  ck_assert_ptr_nonnull(fr);
  ck_assert_uint_eq(fr->n_roots, 1);
  topos_tensor *got = tensor_of(fr->roots[0]);
  topos_backends_register_defaults();
  topos_error err = {0};
  topos_entry e = {
      &root, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &e, &err);
  ck_assert_ptr_nonnull(plan);
  topos_run *run = topos_plan_forward(plan, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  ck_assert(topos_tensor_bitwise_equal(got, topos_run_of(run, root, &err)));
  topos_run_free(run);
  topos_plan_free(plan);
  topos_tensor_release(got);
  wire_message_free(&fr->base);
}

/* A run over the per-run budget is refused before it allocates: every
 * kind of run of a 76-byte-ish spec whose run would hold 1 GiB, on a
 * daemon whose runs may peak at 64 MiB; the daemon's high-water mark
 * stays small and it keeps serving. */
START_TEST(test_admission_run_budget) {
  const char *extra[] = {"--run-bytes", "64M", NULL};
  start(extra);
  int64_t budget = (int64_t)64 << 20;
  bcast_net b = broadcast_network(16384, 8192);
  char id[65];
  record(&C, b.net, id);
  size_t len;
  uint8_t *bytes = forward_bytes(id, b.loss, &len);
  ck_assert_uint_lt(len, 100);
  int64_t n = expect_over_run_budget("Forward", bytes, len, budget);
  /* The exp's output and the broadcast's compute copy, 512 MiB each. */
  ck_assert_msg(n >= (int64_t)1 << 30, "needs %lld", (long long)n);
  free(bytes);
  bytes = backward_bytes(id, b.loss, &len);
  expect_over_run_budget("Backward", bytes, len, budget);
  free(bytes);
  bytes = step_bytes(id, b.loss, &len);
  expect_over_run_budget("Step", bytes, len, budget);
  free(bytes);
  bytes = conformance_bytes(id, b.loss, &len);
  expect_over_run_budget("Conformance", bytes, len, budget);
  free(bytes);
  /* Nothing of that size was ever allocated. */
  int64_t hwm = proc_bytes(D.pid, "VmHWM:");
  ck_assert_msg(hwm < (int64_t)400 << 20, "toposd peaked at %lld bytes",
                (long long)hwm);
  /* A small run still fits and answers. */
  gd_net g = gd_network(0);
  char gid[65];
  record(&C, g.net, gid);
  bytes = forward_bytes(gid, g.loss, &len);
  reply r;
  call_raw(&C, "Forward", bytes, len, 0, &r);
  ck_assert_msg(r.status == GRPC_STATUS_OK, "%d %s", r.status, r.details);
  expect_forward_bits(&r, g.net, g.loss);
  reply_clear(&r);
  free(bytes);
  assert_serving(&C);
  topos_network_release(g.net);
  topos_network_release(b.net);
  stop();
}
END_TEST

typedef struct slow_call {
  int port;
  const uint8_t *bytes;
  size_t len;
  reply r;
} slow_call;

static void *slow_call_run(void *p) {
  slow_call *a = p;
  client c;
  client_open(&c, a->port);
  call_raw(&c, "Forward", a->bytes, a->len, 0, &a->r);
  client_close(&c);
  return NULL;
}

/* The global budget: with room for one slow run and not two, a second
 * run while the first is in flight is refused at once, naming what it
 * needs, what is reserved and the budget; the first answers the
 * engine's bits, and once it is done the next run is admitted. */
START_TEST(test_admission_global_budget) {
  topos_value out;
  topos_network *net = calibrated_slow_network(1.5, &out, NULL);
  /* What the run needs, as the daemon says when refusing it. */
  const char *probe[] = {"--run-bytes", "1K", NULL};
  start(probe);
  char id[65];
  record(&C, net, id);
  size_t len;
  uint8_t *bytes = forward_bytes(id, out, &len);
  int64_t need = expect_over_run_budget("Forward", bytes, len, 1024);
  stop();

  int64_t budget = need + need / 2;
  char budget_text[32];
  snprintf(budget_text, sizeof budget_text, "%lld", (long long)budget);
  const char *extra[] = {"--workers", "2",           "--memory-bytes",
                         budget_text, "--run-bytes", budget_text,
                         NULL};
  start(extra);
  record(&C, net, id);
  slow_call first = {.port = D.port, .bytes = bytes, .len = len};
  pthread_t th;
  pthread_create(&th, NULL, slow_call_run, &first);
  usleep(300 * 1000); /* the first is running (two workers, no queue) */
  reply r;
  double t0 = now_s();
  call_raw(&C, "Forward", bytes, len, 0, &r);
  double took = now_s() - t0;
  ck_assert_msg(r.status == GRPC_STATUS_RESOURCE_EXHAUSTED, "%d %s", r.status,
                r.details);
  ck_assert_int_eq(r.topos_code, TOPOS_ERR_MEMORY);
  char want[256];
  snprintf(want, sizeof want,
           "Forward needs %lld bytes at its peak, and %lld bytes are "
           "reserved by runs in flight of a %lld-byte budget",
           (long long)need, (long long)need, (long long)budget);
  ck_assert_msg(strstr(r.details, want) != NULL, "'%s' is not '%s'", r.details,
                want);
  /* Refused at once, not after waiting for the first. */
  ck_assert_msg(took < 0.5, "refused after %.3f s", took);
  reply_clear(&r);
  pthread_join(th, NULL);
  ck_assert_msg(first.r.status == GRPC_STATUS_OK, "%d %s", first.r.status,
                first.r.details);
  expect_forward_bits(&first.r, net, out);
  reply_clear(&first.r);
  /* The reservation came back: the same run is admitted again. */
  call_raw(&C, "Forward", bytes, len, 0, &r);
  ck_assert_msg(r.status == GRPC_STATUS_OK, "%d %s", r.status, r.details);
  expect_forward_bits(&r, net, out);
  reply_clear(&r);
  free(bytes);
  topos_network_release(net);
  stop();
}
END_TEST

/* A large admitted run's memory goes back: the daemon peaks at over
 * 1 GiB for a Forward of a 512 MiB exp, and its resident memory falls
 * back to near where it was (buffers above the pool's cap are freed, the
 * heap trimmed), rather than keeping a gigabyte in the pool. */
START_TEST(test_admission_memory_returns) {
  /* A pool-bytes that is not a size is a usage error. */
  const char *build = getenv("TOPOS_BUILD");
  char cmd[600];
  snprintf(cmd, sizeof cmd,
           "%s/bin/toposd --pool-bytes -5 --listen 127.0.0.1:0 "
           ">/dev/null 2>&1",
           build && *build ? build : "build");
  int rc = system(cmd);
  ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "exit %d", rc);
  const char *extra[] = {
      "--run-bytes", "4G", "--memory-bytes", "8G", "--pool-bytes", "64M", NULL};
  start(extra);
  gd_net g = gd_network(0);
  char gid[65];
  record(&C, g.net, gid);
  size_t glen;
  uint8_t *small = forward_bytes(gid, g.loss, &glen);
  reply r;
  call_raw(&C, "Forward", small, glen, 0, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_OK);
  reply_clear(&r);
  int64_t before = proc_bytes(D.pid, "VmRSS:");
  bcast_net b = broadcast_network(16384, 8192);
  char id[65];
  record(&C, b.net, id);
  size_t len;
  uint8_t *bytes = forward_bytes(id, b.loss, &len);
  call_raw(&C, "Forward", bytes, len, 0, &r);
  ck_assert_msg(r.status == GRPC_STATUS_OK, "%d %s", r.status, r.details);
  expect_forward_bits(&r, b.net, b.loss);
  reply_clear(&r);
  int64_t peak = proc_bytes(D.pid, "VmHWM:");
  ck_assert_msg(peak > before + ((int64_t)900 << 20),
                "the run peaked at %lld bytes (from %lld)", (long long)peak,
                (long long)before);
  /* The daemon trims its heap within a second of going idle. */
  int64_t after = 0;
  for (int i = 0; i < 40; i++) {
    after = proc_bytes(D.pid, "VmRSS:");
    if (after < before + ((int64_t)300 << 20)) break;
    usleep(100 * 1000);
  }
  fprintf(stderr,
          "admission: RSS %lld MB before, peak %lld MB, %lld MB after\n",
          (long long)(before >> 20), (long long)(peak >> 20),
          (long long)(after >> 20));
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator keeps freed memory */
  ck_assert_msg(after < before + ((int64_t)300 << 20),
                "RSS %lld bytes after the run (%lld before, peak %lld)",
                (long long)after, (long long)before, (long long)peak);
#endif
  /* And it still serves. */
  call_raw(&C, "Forward", small, glen, 0, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_OK);
  reply_clear(&r);
  free(bytes);
  free(small);
  topos_network_release(b.net);
  topos_network_release(g.net);
  stop();
}
END_TEST

Suite *admission_suite(void) {
  Suite *s = suite_create("admission");
  TCase *tc = tcase_create("admission");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_admission_run_budget);
  tcase_add_test(tc, test_admission_global_budget);
  tcase_add_test(tc, test_admission_memory_returns);
  suite_add_tcase(s, tc);
  return s;
}
