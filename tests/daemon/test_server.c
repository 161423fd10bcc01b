/*
 * test_server.c - toposd end to end: a real daemon started as a child on
 * an ephemeral loopback port with a temporary SQLite file, driven by raw
 * gRPC C core calls carrying protobuf-c messages, so these tests depend
 * on nothing but the wire contract (proto/topos.proto).
 *
 * What is held: every RPC answers what the in-process engine computes,
 * bit for bit; hostile requests (random bytes, truncated messages, wrong
 * dtypes, overflowing shapes, unknown and malformed ids, no message, an
 * unknown method, a message over the size limit) get their status and the
 * daemon keeps serving; 16 concurrent clients x 200 Steps are all
 * correct; a full queue answers UNAVAILABLE; deadlines give
 * DEADLINE_EXCEEDED; kill -9 under a Record load loses no acknowledged
 * spec; SIGTERM drains and exits 0 (under `make asan` that exit status
 * also says LeakSanitizer found nothing).
 *
 * The daemon binary is $TOPOS_BUILD/bin/toposd (default build/).  Slow
 * tests (the 512 MiB message, the load tests) are skipped when
 * TOPOS_SKIP_SLOW is set.
 */
#include "harness.h"

/* ------------------------------------------------------- fixtures/tests */

static daemon_proc D;
static client C;

static void start_default(void) {
  fixture_start(&D, &C, NULL);
}

static void stop_default(void) {
  fixture_stop(&D, &C, 20);
}

START_TEST(test_record_describe_idempotent) {
  start_default();
  gd_net g = gd_network(0);
  char id[65], again[65];
  record(&C, g.net, id);
  record(&C, g.net, again);
  ck_assert_str_eq(id, again);
  topos_error err = {0};
  for (int f = 0; f <= 2; f++) {
    Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
    dr.id = id;
    dr.format = (Topos__V1__Format)f;
    Topos__V1__TextReply *tr = NULL;
    CALL_OK(&C, "Describe", &dr, &topos__v1__text_reply__descriptor, &tr);
    char *local = topos_network_describe(g.net, (topos_format)f, &err);
    ck_assert_str_eq(tr->text, local);
    topos_free(local);
    wire_message_free(&tr->base);
  }
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(&C, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  ck_assert_int_eq(st->specs, 1);
  ck_assert_int_ge(st->requests, 5);
  ck_assert_int_ge(st->cache_hits, 1);
  ck_assert_int_ge(st->workers, 1);
  wire_message_free(&st->base);
  topos_network_release(g.net);
  stop_default();
}
END_TEST

/* Forward, Backward, Lower, Emit on the GD spec against the engine. */
START_TEST(test_forward_backward_lower_emit) {
  start_default();
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  topos_error err = {0};
  topos_value roots[1] = {g.loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};

  /* Forward with parameters and feeds. */
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  Topos__V1__Tensor *params[1] = {scalar_msg(1.25)};
  fr.n_parameters = 1;
  fr.parameters = params;
  topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, 3, &err);
  topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, 5, &err);
  topos_feed feeds[2] = {{g.x, xt}, {g.y, yt}};
  Topos__V1__Feed **fm = NULL;
  size_t nf = 0;
  ck_assert_int_eq(wire_feeds_to_proto(feeds, 2, &fm, &nf, &err), TOPOS_OK);
  fr.n_feeds = nf;
  fr.feeds = fm;
  Topos__V1__ForwardReply *fwd = NULL;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
  ck_assert_int_eq(fwd->n_roots, 1);
  topos_tensor *got = tensor_of(fwd->roots[0]);
  topos_tensor *w = topos_tensor_scalar(TOPOS_F64, 1.25, &err);
  topos_params *p = topos_params_new(1, &w, &err);
  topos_run *run = topos_forward(g.net, p, feeds, 2, NULL, &err);
  ck_assert(topos_tensor_bitwise_equal(got, topos_run_of(run, g.loss, &err)));
  topos_tensor_release(got);
  wire_message_free(&fwd->base);

  /* Backward. */
  Topos__V1__BackwardRequest br = TOPOS__V1__BACKWARD_REQUEST__INIT;
  br.id = id;
  br.loss = value_msg(g.loss);
  br.n_parameters = 1;
  br.parameters = params;
  br.n_feeds = nf;
  br.feeds = fm;
  Topos__V1__BackwardReply *bw = NULL;
  CALL_OK(&C, "Backward", &br, &topos__v1__backward_reply__descriptor, &bw);
  topos_field *field = topos_backward(run, g.loss, NULL, &err);
  topos_params *grads = topos_parameters_of(field, &err);
  ck_assert_int_eq(bw->n_gradients, 1);
  got = tensor_of(bw->gradients[0]);
  ck_assert(topos_tensor_bitwise_equal(got, topos_params_get(grads, 0)));
  ck_assert(bw->loss == topos_run_scalar(run, g.loss, &err));
  topos_tensor_release(got);
  wire_message_free(&bw->base);
  wire_message_free(&br.loss->base);

  /* Lower and Emit answer the engine's text. */
  Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
  lr.id = id;
  lr.entry = fr.entry;
  Topos__V1__LowerReply *lw = NULL;
  CALL_OK(&C, "Lower", &lr, &topos__v1__lower_reply__descriptor, &lw);
  topos_plan *plan = topos_network_lower(g.net, &e, &err);
  char *text = topos_plan_describe(plan, &err);
  ck_assert_str_eq(lw->text, text);
  ck_assert_int_eq(lw->peak_bytes, (int64_t)topos_plan_peak_bytes(plan));
  topos_free(text);
  wire_message_free(&lw->base);
  Topos__V1__EmitRequest er = TOPOS__V1__EMIT_REQUEST__INIT;
  er.id = id;
  er.entry = fr.entry;
  er.form = TOPOS__V1__FORM__GENERIC;
  Topos__V1__TextReply *em = NULL;
  CALL_OK(&C, "Emit", &er, &topos__v1__text_reply__descriptor, &em);
  text = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_str_eq(em->text, text);
  topos_free(text);
  wire_message_free(&em->base);
  topos_plan_free(plan);

  /* Empty parameters mean the spec's initials (w = 0). */
  fr.n_parameters = 0;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
  got = tensor_of(fwd->roots[0]);
  int64_t none[1] = {0};
  ck_assert(topos_tensor_get(got, none, &err) == 25.0); /* (0·3 − 5)² */
  topos_tensor_release(got);
  wire_message_free(&fwd->base);

  topos_params_free(grads);
  topos_field_free(field);
  topos_run_free(run);
  topos_params_free(p);
  topos_tensor_release(w);
  topos_tensor_release(xt);
  topos_tensor_release(yt);
  wire_feeds_free_proto(fm, nf);
  wire_message_free(&params[0]->base);
  wire_message_free(&fr.entry->base);
  topos_network_release(g.net);
  stop_default();
}
END_TEST

/* Hostile execution options: every bad field is INVALID_ARGUMENT with a
 * message naming it, nothing runs, and the daemon keeps serving. */
START_TEST(test_exec_options_hostile) {
  start_default();
  topos_error err = {0};
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  topos_value roots[1] = {g.loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  char long_name[4096];
  memset(long_name, 'x', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  struct {
    int numerics;
    uint32_t threads;
    const char *backend;
    const char *expect;
  } bad[] = {
      {0, 5000, "", "threads 5000"},
      {7, 0, "", "numerics 7"},
      {0, 0, "nope", "unknown backend 'nope' (known: reference, cpu, blas"},
      {0, 0, "blas", "envelope"},
      {0, 0, long_name, "unknown backend 'xxxx"},
      {0, 0, "auto\x01", "unknown backend"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    Topos__V1__ExecOptions x = TOPOS__V1__EXEC_OPTIONS__INIT;
    x.numerics = (Topos__V1__Numerics)bad[i].numerics;
    x.threads = bad[i].threads;
    x.backend = (char *)bad[i].backend;
    Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
    fr.id = id;
    fr.entry = wire_entry_new(&e, NULL, &err);
    fr.exec = &x;
    reply r;
    call_msg(&C, "Forward", &fr.base, NULL, NULL, &r);
    ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT &&
                      strstr(r.details, bad[i].expect) != NULL,
                  "case %zu: status %d: %s", i, r.status, r.details);
    ck_assert_msg(strlen(r.details) < 1024, "case %zu: an unbounded message",
                  i);
    reply_clear(&r);
    Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
    Topos__V1__Optimizer opt = TOPOS__V1__OPTIMIZER__INIT;
    opt.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
    opt.lr = 0.1;
    sr.id = id;
    sr.loss = wire_value_new_index(g.loss.index);
    sr.optimizer = &opt;
    sr.exec = &x;
    call_msg(&C, "Step", &sr.base, NULL, NULL, &r);
    ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT,
                  "step case %zu: status %d: %s", i, r.status, r.details);
    reply_clear(&r);
    wire_message_free(&sr.loss->base);
    wire_message_free(&fr.entry->base);
  }
  /* Conformance: more than 16 candidates, or an empty one. */
  Topos__V1__ExecOptions one = TOPOS__V1__EXEC_OPTIONS__INIT;
  Topos__V1__ExecOptions *many[17];
  for (int i = 0; i < 17; i++) many[i] = &one;
  Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  cr.id = id;
  cr.entry = wire_entry_new(&e, NULL, &err);
  cr.candidates = many;
  cr.n_candidates = 17;
  reply r;
  call_msg(&C, "Conformance", &cr.base, NULL, NULL, &r);
  ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT &&
                    strstr(r.details, "17 candidates"),
                "%d %s", r.status, r.details);
  reply_clear(&r);
  one.backend = "flip-test"; /* not registered on this daemon */
  cr.n_candidates = 1;
  call_msg(&C, "Conformance", &cr.base, NULL, NULL, &r);
  ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT &&
                    strstr(r.details, "unknown backend 'flip-test'"),
                "%d %s", r.status, r.details);
  reply_clear(&r);
  wire_message_free(&cr.entry->base);
  assert_serving(&C);
  topos_network_release(g.net);
  stop_default();
}
END_TEST

/* Entry.threads: the same Forward at threads 0, 1 and 4 answers the same
 * bytes (and the engine's bits) on a net the cpu backend splits (a
 * 300x300x300 product; an exp and a sum over 2^20 elements); Lower names
 * the count (each count is its own cached plan); above 1024 is
 * INVALID_ARGUMENT naming the field, and the daemon keeps serving. */
START_TEST(test_entry_threads) {
  start_default();
  topos_error err = {0};
  int64_t ms[2] = {300, 300}, cs[2] = {1024, 1}, rs[2] = {1, 1024};
  topos_tensor *a0 = topos_init_normal(TOPOS_F32, 2, ms, 0, 1, 41, &err);
  topos_tensor *b0 = topos_init_normal(TOPOS_F32, 2, ms, 0, 0.1, 42, &err);
  topos_tensor *c0 = topos_init_normal(TOPOS_F32, 2, cs, 0, 1, 43, &err);
  topos_tensor *r0 = topos_init_normal(TOPOS_F32, 2, rs, 0, 1, 44, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value a = topos_parameter(tape, a0);
  topos_value b = topos_parameter(tape, b0);
  topos_value col = topos_input(tape, c0);
  topos_value row = topos_parameter(tape, r0);
  topos_value y = topos_tanh(tape, topos_matmul(tape, a, b));
  topos_value big = topos_exp(tape, topos_matmul(tape, col, row));
  topos_value roots[2] = {topos_name(tape, topos_sum(tape, y), "loss"),
                          topos_name(tape, topos_sum(tape, big), "big")};
  topos_value obs[1] = {y};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  topos_tensor_release(a0);
  topos_tensor_release(b0);
  topos_tensor_release(c0);
  topos_tensor_release(r0);
  char id[65];
  record(&C, net, id);
  topos_run *ref = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(ref);

  const int counts[3] = {1, 4, 0};
  reply first = {0};
  for (int i = 0; i < 3; i++) {
    topos_entry e = {.roots = roots,
                     .nroots = 2,
                     .observes = obs,
                     .nobserves = 1,
                     .threads = counts[i]};
    Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
    fr.id = id;
    fr.entry = wire_entry_new(&e, NULL, &err);
    ck_assert_ptr_nonnull(fr.entry);
    ck_assert_uint_eq(fr.entry->threads, (unsigned)counts[i]);
    reply r;
    Topos__V1__ForwardReply *fwd = NULL;
    int st = call_msg(&C, "Forward", &fr.base,
                      &topos__v1__forward_reply__descriptor, (void **)&fwd, &r);
    ck_assert_msg(st == GRPC_STATUS_OK, "threads %d: %d %s", counts[i], st,
                  r.details);
    ck_assert_int_eq(fwd->n_roots, 2);
    ck_assert_int_eq(fwd->n_observes, 1);
    for (int k = 0; k < 3; k++) {
      topos_tensor *got = tensor_of(k < 2 ? fwd->roots[k] : fwd->observes[0]);
      ck_assert_msg(
          topos_tensor_bitwise_equal(
              got, topos_run_of(ref, k < 2 ? roots[k] : obs[0], &err)),
          "threads %d: value %d differs from the engine's", counts[i], k);
      topos_tensor_release(got);
    }
    if (i == 0) {
      first = r;
    } else {
      ck_assert_uint_eq(r.len, first.len);
      ck_assert_msg(memcmp(r.data, first.data, r.len) == 0,
                    "threads %d: reply bytes differ from threads 1", counts[i]);
      reply_clear(&r);
    }
    wire_message_free(&fwd->base);

    /* Lower names the count; 4 then 1 shows the cache keeps them apart. */
    Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
    lr.id = id;
    lr.entry = fr.entry;
    Topos__V1__LowerReply *lw = NULL;
    CALL_OK(&C, "Lower", &lr, &topos__v1__lower_reply__descriptor, &lw);
    char want[32];
    snprintf(want, sizeof want, ", threads %d;", counts[i]);
    if (counts[i])
      ck_assert_msg(strstr(lw->text, want) != NULL, "%s", lw->text);
    else
      ck_assert_msg(strstr(lw->text, "threads") == NULL, "%s", lw->text);
    wire_message_free(&lw->base);
    wire_message_free(&fr.entry->base);
  }
  reply_clear(&first);
  /* Lower at 1 again after 4: still 1 (not the cached plan of 4). */
  {
    topos_entry e = {.roots = roots, .nroots = 2, .threads = 1};
    Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
    lr.id = id;
    lr.entry = wire_entry_new(&e, NULL, &err);
    Topos__V1__LowerReply *lw = NULL;
    CALL_OK(&C, "Lower", &lr, &topos__v1__lower_reply__descriptor, &lw);
    ck_assert_msg(strstr(lw->text, ", threads 1;") != NULL, "%s", lw->text);
    wire_message_free(&lw->base);
    wire_message_free(&lr.entry->base);
  }

  /* Too many: INVALID_ARGUMENT on every RPC that takes an entry. */
  const char *methods[4] = {"Forward", "Lower", "Emit", "Conformance"};
  const uint32_t bad[2] = {5000, 1025};
  for (int m = 0; m < 4; m++) {
    for (int j = 0; j < 2; j++) {
      topos_entry e = {.roots = roots, .nroots = 2};
      Topos__V1__Entry *em = wire_entry_new(&e, NULL, &err);
      ck_assert_ptr_nonnull(em);
      em->threads = bad[j];
      Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
      Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
      Topos__V1__EmitRequest er = TOPOS__V1__EMIT_REQUEST__INIT;
      Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
      fr.id = lr.id = er.id = cr.id = id;
      fr.entry = lr.entry = er.entry = cr.entry = em;
      const ProtobufCMessage *msg = m == 0   ? &fr.base
                                    : m == 1 ? &lr.base
                                    : m == 2 ? &er.base
                                             : &cr.base;
      reply r;
      int st = call_msg(&C, methods[m], msg, NULL, NULL, &r);
      ck_assert_msg(st == GRPC_STATUS_INVALID_ARGUMENT, "%s %u: %d %s",
                    methods[m], (unsigned)bad[j], st, r.details);
      ck_assert_int_eq(r.topos_code, TOPOS_ERR_ARGUMENT);
      char want[48];
      snprintf(want, sizeof want, "threads %u", (unsigned)bad[j]);
      ck_assert_msg(strstr(r.details, want) != NULL, "%s", r.details);
      reply_clear(&r);
      wire_message_free(&em->base);
    }
  }
  assert_serving(&C);
  /* ... and still computes. */
  {
    topos_entry e = {.roots = roots, .nroots = 2, .threads = 2};
    Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
    fr.id = id;
    fr.entry = wire_entry_new(&e, NULL, &err);
    Topos__V1__ForwardReply *fwd = NULL;
    CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
    topos_tensor *got = tensor_of(fwd->roots[0]);
    ck_assert(
        topos_tensor_bitwise_equal(got, topos_run_of(ref, roots[0], &err)));
    topos_tensor_release(got);
    wire_message_free(&fwd->base);
    wire_message_free(&fr.entry->base);
  }
  topos_run_free(ref);
  topos_network_release(net);
  stop_default();
}
END_TEST

/* One in-process step, as the gradient-descent example takes it. */
static void local_step(const topos_network *net, topos_value loss,
                       const topos_optimizer *opt, topos_params **params,
                       topos_opt_state **state, const topos_feed *feeds,
                       int nfeeds, double *loss_out) {
  topos_error err = {0};
  topos_run *run = topos_forward(net, *params, feeds, nfeeds, NULL, &err);
  ck_assert_msg(run != NULL, "%s", err.message);
  if (loss_out) *loss_out = topos_run_scalar(run, loss, &err);
  topos_field *grad = topos_backward(run, loss, NULL, &err);
  topos_params *g = topos_parameters_of(grad, &err);
  topos_params *next = NULL;
  topos_opt_state *next_state = NULL;
  ck_assert_int_eq(
      topos_optimizer_step(opt, *params, g, *state, &next, &next_state, &err),
      TOPOS_OK);
  topos_params_free(g);
  topos_field_free(grad);
  topos_run_free(run);
  topos_params_free(*params);
  topos_opt_state_free(*state);
  *params = next;
  *state = next_state;
}

/* A remote Step: parameters and state go out and come back. */
static int remote_step(client *c, const char *id, topos_value loss,
                       const topos_optimizer *opt, topos_params **params,
                       topos_opt_state **state, const topos_feed *feeds,
                       int nfeeds, double *loss_out, reply *raw) {
  topos_error err = {0};
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = (char *)id;
  sr.loss = value_msg(loss);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(opt, *params, &om, &err), TOPOS_OK);
  sr.optimizer = &om;
  ck_assert_int_eq(
      wire_tensors_from_params(*params, &sr.parameters, &sr.n_parameters, &err),
      TOPOS_OK);
  ck_assert_int_eq(
      wire_feeds_to_proto(feeds, nfeeds, &sr.feeds, &sr.n_feeds, &err),
      TOPOS_OK);
  if (*state != NULL) sr.state = wire_state_new(*state, &err);
  Topos__V1__StepReply *rep = NULL;
  int status = call_msg(c, "Step", &sr.base, &topos__v1__step_reply__descriptor,
                        (void **)&rep, raw);
  if (status == GRPC_STATUS_OK) {
    topos_params *next = NULL;
    topos_opt_state *next_state = NULL;
    ck_assert_int_eq(wire_params_from_proto(rep->parameters, rep->n_parameters,
                                            NULL, "parameters", &next, &err),
                     TOPOS_OK);
    ck_assert_int_eq(wire_state_from_proto(rep->state, NULL, &next_state, &err),
                     TOPOS_OK);
    if (loss_out) *loss_out = rep->loss;
    topos_params_free(*params);
    topos_opt_state_free(*state);
    *params = next;
    *state = next_state;
    wire_message_free(&rep->base);
  }
  if (sr.state) wire_message_free(&sr.state->base);
  wire_tensors_free(sr.parameters, sr.n_parameters);
  wire_feeds_free_proto(sr.feeds, sr.n_feeds);
  wire_message_clear(&om.base);
  wire_message_free(&sr.loss->base);
  return status;
}

/* 100 SGD steps of the gradient-descent example and 20 AdamW steps of an
 * MLP: remote and in-process parameters stay bit-identical. */
START_TEST(test_step_bit_identical) {
  start_default();
  topos_error err = {0};
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  static const double samples[3][2] = {{1, 2}, {2, 4}, {3, 6}};
  topos_optimizer sgd = topos_sgd(0.02, 0.0);
  topos_params *lp = topos_network_parameters(g.net);
  topos_params *rp = topos_network_parameters(g.net);
  topos_opt_state *ls = topos_opt_state_new(&sgd, lp, &err);
  topos_opt_state *rs = NULL;
  for (int step = 0; step < 100; step++) {
    topos_tensor *xt =
        topos_tensor_scalar(TOPOS_F64, samples[step % 3][0], &err);
    topos_tensor *yt =
        topos_tensor_scalar(TOPOS_F64, samples[step % 3][1], &err);
    topos_feed feeds[2] = {{g.x, xt}, {g.y, yt}};
    double l1 = 0, l2 = 0;
    local_step(g.net, g.loss, &sgd, &lp, &ls, feeds, 2, &l1);
    reply raw;
    int status =
        remote_step(&C, id, g.loss, &sgd, &rp, &rs, feeds, 2, &l2, &raw);
    ck_assert_msg(status == GRPC_STATUS_OK, "step %d: %s", step, raw.details);
    reply_clear(&raw);
    ck_assert(l1 == l2);
    ck_assert(topos_params_bitwise_equal(lp, rp));
    topos_tensor_release(xt);
    topos_tensor_release(yt);
  }
  int64_t none[1] = {0};
  ck_assert(fabs(topos_tensor_get(topos_params_get(rp, 0), none, &err) - 2) <
            1e-6);
  topos_params_free(lp);
  topos_params_free(rp);
  topos_opt_state_free(ls);
  topos_opt_state_free(rs);
  topos_network_release(g.net);

  /* AdamW: moments and the step count cross the wire every step. */
  mlp_net m = mlp_network();
  record(&C, m.net, id);
  topos_optimizer adamw = topos_adamw(0.01, 0.9, 0.999, 1e-8, 0.1);
  lp = topos_network_parameters(m.net);
  rp = topos_network_parameters(m.net);
  ls = topos_opt_state_new(&adamw, lp, &err);
  rs = NULL;
  int64_t ys[1] = {8};
  int32_t labels[8] = {0, 1, 2, 3, 4, 0, 1, 2};
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, ys, labels, &err);
  topos_feed feeds[1] = {{m.y, yt}};
  for (int step = 0; step < 20; step++) {
    double l1 = 0, l2 = 0;
    local_step(m.net, m.loss, &adamw, &lp, &ls, feeds, 1, &l1);
    reply raw;
    int status =
        remote_step(&C, id, m.loss, &adamw, &rp, &rs, feeds, 1, &l2, &raw);
    ck_assert_msg(status == GRPC_STATUS_OK, "adamw step %d: %s", step,
                  raw.details);
    reply_clear(&raw);
    ck_assert(l1 == l2);
    ck_assert(topos_params_bitwise_equal(lp, rp));
    ck_assert_int_eq(topos_opt_state_step(rs), step + 1);
  }
  topos_tensor_release(yt);
  topos_params_free(lp);
  topos_params_free(rp);
  topos_opt_state_free(ls);
  topos_opt_state_free(rs);
  topos_network_release(m.net);
  stop_default();
}
END_TEST

/* PutBlob is content-addressed; Forward with blob references equals
 * Forward with the tensors; StatBlob reports presence. */
START_TEST(test_blobs) {
  start_default();
  topos_error err = {0};
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  topos_params *p = topos_network_parameters(m.net);
  topos_params *q = topos_params_scale(p, 0.5, &err);
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  ck_assert_int_eq(
      wire_tensors_from_params(q, &pb.tensors, &pb.n_tensors, &err), TOPOS_OK);
  Topos__V1__PutBlobReply *put = NULL, *again = NULL;
  CALL_OK(&C, "PutBlob", &pb, &topos__v1__put_blob_reply__descriptor, &put);
  CALL_OK(&C, "PutBlob", &pb, &topos__v1__put_blob_reply__descriptor, &again);
  ck_assert_str_eq(put->id, again->id);
  ck_assert(wire_id_valid(put->id));
  /* The id is the SHA-256 of the canonical PutBlobRequest bytes. */
  size_t len = 0;
  uint8_t *bytes = pack(&pb.base, &len);
  char hash[65];
  topos_sha256_hex(bytes, len, hash);
  ck_assert_str_eq(put->id, hash);
  ck_assert_int_eq(put->bytes, (int64_t)len);
  free(bytes);

  Topos__V1__StatBlobRequest sb = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
  sb.id = put->id;
  Topos__V1__StatBlobReply *stat = NULL;
  CALL_OK(&C, "StatBlob", &sb, &topos__v1__stat_blob_reply__descriptor, &stat);
  ck_assert(stat->present);
  ck_assert_int_eq(stat->bytes, put->bytes);
  wire_message_free(&stat->base);
  sb.id = "abababababababababababababababababababababababababababababababab";
  CALL_OK(&C, "StatBlob", &sb, &topos__v1__stat_blob_reply__descriptor, &stat);
  ck_assert(!stat->present);
  wire_message_free(&stat->base);

  /* Forward on the blob's tensors, by reference and by value. */
  topos_value roots[1] = {m.logits};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  ck_assert_int_eq(wire_tensor_refs(put->id, topos_params_count(q),
                                    &fr.parameters, &fr.n_parameters, &err),
                   TOPOS_OK);
  Topos__V1__ForwardReply *by_ref = NULL, *by_value = NULL;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &by_ref);
  wire_tensors_free(fr.parameters, fr.n_parameters);
  fr.parameters = pb.tensors;
  fr.n_parameters = pb.n_tensors;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &by_value);
  topos_tensor *a = tensor_of(by_ref->roots[0]);
  topos_tensor *b = tensor_of(by_value->roots[0]);
  ck_assert(topos_tensor_bitwise_equal(a, b));
  topos_tensor_release(a);
  topos_tensor_release(b);
  wire_message_free(&by_ref->base);
  wire_message_free(&by_value->base);

  /* An index past the blob's end, and an unknown blob. */
  Topos__V1__Tensor *bad = wire_tensor_new_ref(put->id, 99, &err);
  Topos__V1__Tensor *one[1] = {bad};
  fr.parameters = one;
  fr.n_parameters = 1;
  reply raw;
  ck_assert_int_eq(call_msg(&C, "Forward", &fr.base, NULL, NULL, &raw),
                   GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(raw.topos_code, TOPOS_ERR_RANGE);
  reply_clear(&raw);
  wire_message_free(&bad->base);
  one[0] = bad = wire_tensor_new_ref(
      "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd", 0,
      &err);
  ck_assert_int_eq(call_msg(&C, "Forward", &fr.base, NULL, NULL, &raw),
                   GRPC_STATUS_NOT_FOUND);
  reply_clear(&raw);
  wire_message_free(&bad->base);
  /* Blob references are not allowed inside a blob. */
  Topos__V1__PutBlobRequest nested = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  one[0] = bad = wire_tensor_new_ref(put->id, 0, &err);
  nested.tensors = one;
  nested.n_tensors = 1;
  ck_assert_int_eq(call_msg(&C, "PutBlob", &nested.base, NULL, NULL, NULL),
                   GRPC_STATUS_INVALID_ARGUMENT);
  wire_message_free(&bad->base);

  wire_message_free(&fr.entry->base);
  wire_message_free(&put->base);
  wire_message_free(&again->base);
  wire_tensors_free(pb.tensors, pb.n_tensors);
  topos_params_free(p);
  topos_params_free(q);
  topos_network_release(m.net);
  assert_serving(&C);
  stop_default();
}
END_TEST

/* n heap messages referring to tensors first..first+n-1 of blob `id`
 * (wire_tensors_free). */
static Topos__V1__Tensor **refs_at(const char *id, int first, size_t n) {
  Topos__V1__Tensor **v = calloc(n ? n : 1, sizeof *v);
  ck_assert_ptr_nonnull(v);
  for (size_t i = 0; i < n; i++) {
    v[i] = wire_tensor_new_ref(id, first + (int)i, NULL);
    ck_assert_ptr_nonnull(v[i]);
  }
  return v;
}

/* Uploads n tensor messages as one blob; its id in id[65]. */
static void put_tensors(client *c, Topos__V1__Tensor **v, size_t n,
                        char id[65]) {
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  pb.tensors = v;
  pb.n_tensors = n;
  Topos__V1__PutBlobReply *put = NULL;
  CALL_OK(c, "PutBlob", &pb, &topos__v1__put_blob_reply__descriptor, &put);
  snprintf(id, 65, "%s", put->id);
  wire_message_free(&put->base);
}

/* Blob references in every tensor field a Step reads: the parameters and
 * the feed (looked up together before they are converted) and the
 * optimizer state's moments (looked up when the state is read), from two
 * blobs whose tensors are spread across those fields.  The reply is the
 * by-value Step's byte for byte; a missing blob after references that
 * resolve is NOT_FOUND naming the field that referred to it. */
START_TEST(test_blob_refs_in_step) {
  start_default();
  topos_error err = {0};
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  topos_optimizer adamw = topos_adamw(0.01, 0.9, 0.999, 1e-8, 0.1);
  topos_params *p = topos_network_parameters(m.net);
  topos_opt_state *st = NULL;
  int64_t ys[1] = {8};
  int32_t labels[8] = {0, 1, 2, 3, 4, 0, 1, 2};
  topos_tensor *yt = topos_tensor_from(TOPOS_I32, 1, ys, labels, &err);
  topos_feed feeds[1] = {{m.y, yt}};
  /* One step first, so that the state has moments to refer to. */
  reply raw;
  ck_assert_int_eq(
      remote_step(&C, id, m.loss, &adamw, &p, &st, feeds, 1, NULL, &raw),
      GRPC_STATUS_OK);
  reply_clear(&raw);

  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = id;
  sr.loss = value_msg(m.loss);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(&adamw, p, &om, &err), TOPOS_OK);
  sr.optimizer = &om;
  ck_assert_int_eq(
      wire_tensors_from_params(p, &sr.parameters, &sr.n_parameters, &err),
      TOPOS_OK);
  ck_assert_int_eq(wire_feeds_to_proto(feeds, 1, &sr.feeds, &sr.n_feeds, &err),
                   TOPOS_OK);
  sr.state = wire_state_new(st, &err);
  ck_assert_ptr_nonnull(sr.state);
  size_t np = sr.n_parameters;
  ck_assert_uint_eq(sr.state->n_m, np);
  ck_assert_uint_eq(sr.state->n_v, np);

  /* Blob A: the parameters, then the first moments.  Blob B: the feed,
   * then the second moments. */
  Topos__V1__Tensor **a = calloc(2 * np, sizeof *a);
  Topos__V1__Tensor **b = calloc(1 + np, sizeof *b);
  for (size_t i = 0; i < np; i++) {
    a[i] = sr.parameters[i];
    a[np + i] = sr.state->m[i];
    b[1 + i] = sr.state->v[i];
  }
  b[0] = sr.feeds[0]->tensor;
  char ida[65], idb[65];
  put_tensors(&C, a, 2 * np, ida);
  put_tensors(&C, b, 1 + np, idb);
  free(a);
  free(b);

  /* The same request by reference (shallow copies of the messages). */
  Topos__V1__StepRequest rr = sr;
  rr.parameters = refs_at(ida, 0, np);
  Topos__V1__Feed feed = *sr.feeds[0];
  Topos__V1__Tensor **feed_ref = refs_at(idb, 0, 1);
  feed.tensor = feed_ref[0];
  Topos__V1__Feed *feedp[1] = {&feed};
  rr.feeds = feedp;
  Topos__V1__OptimizerState state = *sr.state;
  state.m = refs_at(ida, (int)np, np);
  state.v = refs_at(idb, 1, np);
  rr.state = &state;

  reply by_value, by_ref;
  ck_assert_int_eq(call_msg(&C, "Step", &sr.base, NULL, NULL, &by_value),
                   GRPC_STATUS_OK);
  int status = call_msg(&C, "Step", &rr.base, NULL, NULL, &by_ref);
  ck_assert_msg(status == GRPC_STATUS_OK, "by reference: %s", by_ref.details);
  ck_assert_uint_eq(by_ref.len, by_value.len);
  ck_assert(memcmp(by_ref.data, by_value.data, by_value.len) == 0);
  reply_clear(&by_value);
  reply_clear(&by_ref);

  static const char missing[] =
      "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";
  Topos__V1__Tensor *kept = state.v[np - 1];
  state.v[np - 1] = wire_tensor_new_ref(missing, 0, NULL);
  status = call_msg(&C, "Step", &rr.base, NULL, NULL, &by_ref);
  ck_assert_int_eq(status, GRPC_STATUS_NOT_FOUND);
  char want[32];
  snprintf(want, sizeof want, "state.v[%zu]", np - 1);
  ck_assert_msg(strstr(by_ref.details, want) != NULL, "%s", by_ref.details);
  reply_clear(&by_ref);
  wire_message_free(&state.v[np - 1]->base);
  state.v[np - 1] = kept;
  Topos__V1__Tensor *param1 = rr.parameters[1];
  rr.parameters[1] = wire_tensor_new_ref(missing, 0, NULL);
  status = call_msg(&C, "Step", &rr.base, NULL, NULL, &by_ref);
  ck_assert_int_eq(status, GRPC_STATUS_NOT_FOUND);
  ck_assert_msg(strstr(by_ref.details, "parameters[1]") != NULL, "%s",
                by_ref.details);
  reply_clear(&by_ref);
  wire_message_free(&rr.parameters[1]->base);
  rr.parameters[1] = param1;

  wire_tensors_free(rr.parameters, np);
  wire_tensors_free(feed_ref, 1);
  wire_tensors_free(state.m, np);
  wire_tensors_free(state.v, np);
  wire_message_free(&sr.state->base);
  wire_tensors_free(sr.parameters, sr.n_parameters);
  wire_feeds_free_proto(sr.feeds, sr.n_feeds);
  wire_message_clear(&om.base);
  wire_message_free(&sr.loss->base);
  topos_tensor_release(yt);
  topos_params_free(p);
  topos_opt_state_free(st);
  topos_network_release(m.net);
  assert_serving(&C);
  stop_default();
}
END_TEST

/* Conformance: every backend bit-identical to the interpreter, on a net
 * whose forward plan fuses convolution and pooling, and in training. */
START_TEST(test_conformance) {
  start_default();
  topos_error err = {0};
  topos_value out;
  topos_network *net = conv_network(&out);
  char id[65];
  record(&C, net, id);
  for (int posture = 0; posture <= 1; posture++) {
    topos_value roots[1] = {out};
    topos_entry e = {
        roots, 1, NULL, 0, (topos_posture)posture, TOPOS_NUMERICS_EXACT};
    Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
    cr.id = id;
    cr.entry = wire_entry_new(&e, NULL, &err);
    Topos__V1__ConformanceReply *rep = NULL;
    CALL_OK(&C, "Conformance", &cr, &topos__v1__conformance_reply__descriptor,
            &rep);
    /* The defaults: the reference backend, then every exact backend by
     * name; each bit-identical to the interpreter. */
    ck_assert_int_ge(rep->n_results, 2);
    ck_assert_str_eq(rep->results[0]->backend, "reference");
    for (size_t i = 0; i < rep->n_results; i++) {
      ck_assert_msg(rep->results[i]->holds && rep->results[i]->bit_identical,
                    "%s: %s", rep->results[i]->backend, rep->results[i]->note);
      ck_assert_str_eq(rep->results[i]->fidelity, "exact");
      ck_assert(rep->results[i]->max_ulp == 0);
      ck_assert_uint_eq(
          rep->results[i]->n_outputs,
          posture ? 1 + (size_t)topos_network_parameter_count(net) : 1);
    }
    if (posture == 0)
      ck_assert_msg(strstr(rep->results[0]->note, "2 fused groups") != NULL,
                    "plan note: %s", rep->results[0]->note);
    wire_message_free(&rep->base);
    wire_message_free(&cr.entry->base);
  }
  topos_network_release(net);
  stop_default();
}
END_TEST

/* -------------------------------------------------------- hostile input */

static void expect_status(client *c, const char *method, const void *msg,
                          size_t len, int want, const char *what) {
  reply r;
  call_raw(c, method, msg, len, 0, &r);
  ck_assert_msg(r.status == want, "%s: %s: status %d (%s), want %d", what,
                method, r.status, r.details, want);
  reply_clear(&r);
}

static void expect_msg(client *c, const char *method, const ProtobufCMessage *m,
                       int want, const char *what) {
  size_t len = 0;
  uint8_t *buf = pack(m, &len);
  expect_status(c, method, buf, len, want, what);
  free(buf);
}

/* Train is sent as a stream of one message (then the client's close). */
static const char *const all_methods[] = {
    "Record",    "Describe",       "Lower",       "Emit",    "Forward",
    "Backward",  "Step",           "Conformance", "PutBlob", "StatBlob",
    "Health",    "Stats",          "Backends",    "Train",   "GetBlob",
    "ListSpecs", "AdminSpecDelete"};

START_TEST(test_hostile_random_and_truncated) {
  start_default();
  topos_error err = {0};
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  /* Random bytes: whatever they parse as, the answer is a client error
   * (or OK, for the few that happen to be valid), never INTERNAL, and
   * the daemon keeps serving. */
  uint64_t seed = 0x12345678;
  uint8_t buf[512];
  for (int round = 0; round < 40; round++) {
    size_t n = 1 + (size_t)(round * 13 % 500);
    for (size_t i = 0; i < n; i++) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      buf[i] = (uint8_t)seed;
    }
    for (size_t k = 0; k < sizeof all_methods / sizeof *all_methods; k++) {
      reply r;
      call_raw(&C, all_methods[k], buf, n, 0, &r);
      ck_assert_msg(r.status == GRPC_STATUS_OK ||
                        r.status == GRPC_STATUS_INVALID_ARGUMENT ||
                        r.status == GRPC_STATUS_NOT_FOUND,
                    "random %zu bytes to %s: status %d: %s", n, all_methods[k],
                    r.status, r.details);
      reply_clear(&r);
    }
  }
  assert_serving(&C);
  /* A 0xff run is a malformed varint: INVALID_ARGUMENT everywhere except
   * the two RPCs without a request body... which also must parse it. */
  memset(buf, 0xff, 16);
  for (size_t k = 0; k < sizeof all_methods / sizeof *all_methods; k++)
    expect_status(&C, all_methods[k], buf, 16, GRPC_STATUS_INVALID_ARGUMENT,
                  "0xff bytes");

  /* Truncated Forward requests: the id is the first field, so any cut
   * inside it is a malformed message; every other cut is a valid
   * prefix or a malformed one, never anything else. */
  topos_value roots[1] = {g.loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  Topos__V1__Tensor *params[1] = {scalar_msg(1.5)};
  fr.parameters = params;
  fr.n_parameters = 1;
  size_t len = 0;
  uint8_t *full = pack(&fr.base, &len);
  for (size_t cut = 1; cut < len; cut++) {
    reply r;
    call_raw(&C, "Forward", full, cut, 0, &r);
    if (cut < 66)
      ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT,
                    "cut %zu: status %d", cut, r.status);
    else
      ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT ||
                        r.status == GRPC_STATUS_OK,
                    "cut %zu: status %d: %s", cut, r.status, r.details);
    reply_clear(&r);
  }
  expect_status(&C, "Forward", full, len, GRPC_STATUS_OK, "whole message");
  free(full);
  /* Truncated spec: cut inside the last node's tensor bytes. */
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(g.net, &spec, &err), TOPOS_OK);
  full = pack(&spec.base, &len);
  expect_status(&C, "Record", full, len - 1, GRPC_STATUS_INVALID_ARGUMENT,
                "spec minus one byte");
  free(full);
  wire_message_clear(&spec.base);
  assert_serving(&C);

  /* No message at all (only SEND_CLOSE): a request body is required,
   * except by Health, Stats, Backends and ListSpecs, and by Train (a stream the
   * client closed at once ends OK, with no reply). */
  for (size_t k = 0; k < sizeof all_methods / sizeof *all_methods; k++) {
    bool bodyless = strcmp(all_methods[k], "Health") == 0 ||
                    strcmp(all_methods[k], "Stats") == 0 ||
                    strcmp(all_methods[k], "Backends") == 0 ||
                    strcmp(all_methods[k], "ListSpecs") == 0 ||
                    strcmp(all_methods[k], "Train") == 0;
    expect_status(&C, all_methods[k], NULL, 0,
                  bodyless ? GRPC_STATUS_OK : GRPC_STATUS_INVALID_ARGUMENT,
                  "no message");
  }
  /* Empty (zero-byte) messages are valid protobuf: ids are missing. */
  expect_status(&C, "Describe", "", 0, GRPC_STATUS_INVALID_ARGUMENT, "empty");
  expect_status(&C, "Forward", "", 0, GRPC_STATUS_INVALID_ARGUMENT, "empty");
  expect_status(&C, "Health", "", 0, GRPC_STATUS_OK, "empty");
  /* An unknown method of the service, and of another service. */
  expect_status(&C, "/topos.v1.Topos/Teleport", "", 0,
                GRPC_STATUS_UNIMPLEMENTED, "unknown method");
  expect_status(&C, "/other.Service/Call", "x", 1, GRPC_STATUS_UNIMPLEMENTED,
                "unknown service");
  assert_serving(&C);
  wire_message_free(&params[0]->base);
  wire_message_free(&fr.entry->base);
  topos_network_release(g.net);
  stop_default();
}
END_TEST

START_TEST(test_hostile_values) {
  start_default();
  topos_error err = {0};
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  topos_value roots[1] = {g.loss};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  Topos__V1__Tensor t = TOPOS__V1__TENSOR__INIT;
  Topos__V1__Tensor *params[1] = {&t};
  fr.parameters = params;
  fr.n_parameters = 1;
  double one = 1;
  float onef = 1;
  int32_t onei = 1;

  /* Wrong dtypes: f32 and i32 where f64 is expected, an unknown dtype. */
  t.dtype = TOPOS__V1__DTYPE__F32;
  t.data.data = (uint8_t *)&onef;
  t.data.len = 4;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "f32 parameter");
  t.dtype = TOPOS__V1__DTYPE__I32;
  t.data.data = (uint8_t *)&onei;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "i32 parameter");
  t.dtype = (Topos__V1__DType)99;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT, "dtype 99");
  /* Data that does not fill its shape, and shapes whose size overflows. */
  t.dtype = TOPOS__V1__DTYPE__F64;
  t.data.data = (uint8_t *)&one;
  t.data.len = 7;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "7 bytes of f64");
  int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, (int64_t)1 << 40};
  t.data.len = 8;
  t.n_shape = 3;
  t.shape = huge;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "overflowing shape");
  int64_t big[2] = {INT64_MAX / 4, 3};
  t.n_shape = 2;
  t.shape = big;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "shape over size_t bytes");
  int64_t negative[1] = {-1};
  t.n_shape = 1;
  t.shape = negative;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "negative extent");
  int64_t rank9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  t.n_shape = 9;
  t.shape = rank9;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT, "rank 9");
  /* Too many parameters, a feed to a non-input, a root out of range. */
  t.n_shape = 0;
  Topos__V1__Tensor *two[2] = {&t, &t};
  fr.parameters = two;
  fr.n_parameters = 2;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "two parameters");
  fr.n_parameters = 0;
  Topos__V1__Feed feed = TOPOS__V1__FEED__INIT;
  Topos__V1__Feed *feeds[1] = {&feed};
  feed.input = wire_value_new_index(g.w.index);
  feed.tensor = &t;
  fr.feeds = feeds;
  fr.n_feeds = 1;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "feed to a parameter");
  wire_message_free(&feed.input->base);
  feed.input = wire_value_new_name("no-such-input");
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "feed to an unknown name");
  wire_message_free(&feed.input->base);
  fr.n_feeds = 0;
  fr.entry->roots[0]->index = 1000;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "root 1000");
  fr.entry->roots[0]->index = g.loss.index;
  fr.entry->posture = (Topos__V1__Posture)7;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "posture 7");
  fr.entry->posture = TOPOS__V1__POSTURE__FORWARD;
  assert_serving(&C);

  /* Ids: malformed ones are INVALID_ARGUMENT, unknown ones NOT_FOUND. */
  const char *bad_ids[] = {"", "abc", "ZZ",
                           "0123456789ABCDEF0123456789abcdef0123456789abcdef"
                           "0123456789abcdef",
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0"};
  for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
    fr.id = (char *)bad_ids[i];
    expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_INVALID_ARGUMENT,
               "malformed id");
    Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
    dr.id = (char *)bad_ids[i];
    expect_msg(&C, "Describe", &dr.base, GRPC_STATUS_INVALID_ARGUMENT,
               "malformed id");
    Topos__V1__StatBlobRequest sb = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
    sb.id = (char *)bad_ids[i];
    expect_msg(&C, "StatBlob", &sb.base, GRPC_STATUS_INVALID_ARGUMENT,
               "malformed blob id");
  }
  char unknown[65];
  memset(unknown, 'e', 64);
  unknown[64] = '\0';
  fr.id = unknown;
  expect_msg(&C, "Forward", &fr.base, GRPC_STATUS_NOT_FOUND, "unknown id");
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = unknown;
  expect_msg(&C, "Describe", &dr.base, GRPC_STATUS_NOT_FOUND, "unknown id");
  dr.id = id;
  dr.format = (Topos__V1__Format)5;
  expect_msg(&C, "Describe", &dr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "format 5");
  Topos__V1__EmitRequest er = TOPOS__V1__EMIT_REQUEST__INIT;
  er.id = id;
  er.entry = fr.entry;
  er.form = (Topos__V1__Form)3;
  expect_msg(&C, "Emit", &er.base, GRPC_STATUS_INVALID_ARGUMENT, "form 3");
  Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
  lr.id = id;
  expect_msg(&C, "Lower", &lr.base, GRPC_STATUS_INVALID_ARGUMENT, "no entry");

  /* Bad specs: an operand that is not earlier, an unknown op, a shape
   * mismatch, a reshape whose target overflows. */
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(g.net, &spec, &err), TOPOS_OK);
  int32_t saved = spec.nodes[3]->operands[0];
  spec.nodes[3]->operands[0] = 5;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_INVALID_ARGUMENT,
             "forward operand");
  spec.nodes[3]->operands[0] = saved;
  Topos__V1__Op op = spec.nodes[3]->op;
  spec.nodes[3]->op = (Topos__V1__Op)77;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_INVALID_ARGUMENT,
             "unknown op");
  spec.nodes[3]->op = TOPOS__V1__OP__MATMUL;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_INVALID_ARGUMENT,
             "matmul of scalars");
  spec.nodes[3]->op = TOPOS__V1__OP__RESHAPE;
  spec.nodes[3]->n_operands = 1;
  int64_t *keep_shape = spec.nodes[3]->shape;
  spec.nodes[3]->shape = huge;
  spec.nodes[3]->n_shape = 3;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_INVALID_ARGUMENT,
             "reshape overflow");
  spec.nodes[3]->shape = keep_shape;
  spec.nodes[3]->n_shape = 0;
  spec.nodes[3]->n_operands = 2;
  spec.nodes[3]->op = op;
  spec.dtype = TOPOS__V1__DTYPE__I32;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_INVALID_ARGUMENT,
             "i32 tape");
  spec.dtype = TOPOS__V1__DTYPE__F64;
  expect_msg(&C, "Record", &spec.base, GRPC_STATUS_OK, "repaired spec");
  wire_message_clear(&spec.base);

  /* Step: a missing optimizer, an unknown kind, a moment of the wrong
   * shape. */
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = id;
  sr.loss = wire_value_new_index(g.loss.index);
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "no optimizer");
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  om.kind = (Topos__V1__OptimizerKind)9;
  sr.optimizer = &om;
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_INVALID_ARGUMENT, "kind 9");
  om.kind = TOPOS__V1__OPTIMIZER_KIND__ADAM;
  om.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  om.lr = 0.1;
  om.beta1_given_case = TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
  om.beta1 = 0.9;
  om.beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  om.beta2 = 0.99;
  om.eps_given_case = TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
  om.eps = 1e-8;
  Topos__V1__OptimizerState state = TOPOS__V1__OPTIMIZER_STATE__INIT;
  int64_t two_shape[1] = {2};
  double pair[2] = {0, 0};
  Topos__V1__Tensor mt = TOPOS__V1__TENSOR__INIT;
  mt.dtype = TOPOS__V1__DTYPE__F64;
  mt.n_shape = 1;
  mt.shape = two_shape;
  mt.data.data = (uint8_t *)pair;
  mt.data.len = 16;
  Topos__V1__Tensor *moments[1] = {&mt};
  state.step = 3;
  state.n_m = state.n_v = 1;
  state.m = state.v = moments;
  sr.state = &state;
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "moment shape");
  state.step = -1;
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_INVALID_ARGUMENT,
             "negative step");
  sr.state = NULL;
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_OK, "fresh Adam state");
  wire_message_free(&sr.loss->base);
  sr.loss = wire_value_new_index(g.x.index);
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_OK, "loss is an input");
  wire_message_free(&sr.loss->base);
  sr.loss = NULL;
  expect_msg(&C, "Step", &sr.base, GRPC_STATUS_INVALID_ARGUMENT, "no loss");

  /* Nothing above changed the stored spec. */
  Topos__V1__DescribeRequest d2 = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  d2.id = id;
  Topos__V1__TextReply *tr = NULL;
  CALL_OK(&C, "Describe", &d2, &topos__v1__text_reply__descriptor, &tr);
  char *local = topos_network_describe(g.net, TOPOS_FORMAT_TEXT, &err);
  ck_assert_str_eq(tr->text, local);
  topos_free(local);
  wire_message_free(&tr->base);
  wire_message_free(&fr.entry->base);
  topos_network_release(g.net);
  assert_serving(&C);
  stop_default();
}
END_TEST

/* A daemon with a 1 MiB limit: a message of exactly the limit passes, one
 * byte more is RESOURCE_EXHAUSTED, and so is a reply over it. */
START_TEST(test_message_limit_small) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  const char *extra[] = {"--max-message-bytes", "1M", NULL};
  daemon_start(&D, extra);
  grpc_init();
  client_open(&C, D.port);
  /* A PutBlob of one u8-free f32 tensor padded to exactly the limit. */
  size_t limit = (size_t)1 << 20;
  for (int over = 0; over <= 1; over++) {
    /* Tensor message: field 3 (data) with a 3-byte varint length; field 1
     * of PutBlobRequest wraps it with another 3-byte length. */
    size_t data_len = limit - 64;
    Topos__V1__Tensor t = TOPOS__V1__TENSOR__INIT;
    int64_t shape[1] = {(int64_t)(data_len / 4)};
    t.n_shape = 1;
    t.shape = shape;
    t.data.len = data_len;
    t.data.data = calloc(1, data_len);
    Topos__V1__Tensor *ts[1] = {&t};
    Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
    pb.tensors = ts;
    pb.n_tensors = 1;
    size_t len = 0;
    uint8_t *bytes = pack(&pb.base, &len);
    /* Pad with an unknown field to hit the exact size wanted. */
    size_t want = limit + (size_t)over;
    ck_assert_uint_le(len, want);
    size_t pad = want - len;
    uint8_t *msg = malloc(want);
    memcpy(msg, bytes, len);
    if (pad > 0) {
      ck_assert_uint_ge(pad, 2);
      /* field 15, wire type 2, then a 1-byte length (pad < 130). */
      ck_assert_uint_lt(pad, 130);
      msg[len] = (15 << 3) | 2;
      msg[len + 1] = (uint8_t)(pad - 2);
      memset(msg + len + 2, 0, pad - 2);
    }
    expect_status(&C, "PutBlob", msg, want,
                  over ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_OK,
                  over ? "limit + 1" : "exactly the limit");
    free(msg);
    free(bytes);
    free(t.data.data);
    assert_serving(&C);
  }
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_cleanup(&D);
}
END_TEST

/* The default limit: a 512 MiB + 1 byte message is RESOURCE_EXHAUSTED. */
START_TEST(test_message_limit_512m) {
  if (skip_slow()) return;
  start_default();
  size_t n = ((size_t)512 << 20) + 1;
  uint8_t *big = malloc(n);
  ck_assert_ptr_nonnull(big);
  memset(big, 0, n);
  expect_status(&C, "PutBlob", big, n, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "512 MiB + 1");
  free(big);
  assert_serving(&C);
  stop_default();
}
END_TEST

/* ------------------------------------------------ deadlines, queue full */

START_TEST(test_deadlines) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  /* The daemon's default deadline applies to calls that set none. */
  const char *extra[] = {"--deadline-ms", "1", "--workers", "1", NULL};
  daemon_start(&D, extra);
  grpc_init();
  client_open(&C, D.port);
  topos_value out;
  topos_network *net = slow_network(8, &out);
  char id[65];
  record(&C, net, id);
  uint8_t *bytes;
  size_t len;
  slow_forward_request(net, out, id, &bytes, &len);
  /* A client deadline of 5 ms. */
  reply r;
  call_raw(&C, "Forward", bytes, len, 5, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
  reply_clear(&r);
  assert_serving(&C);
  /* No client deadline: the daemon's default of 1 ms applies, and the
   * answer comes from the daemon's own check. */
  call_raw(&C, "Forward", bytes, len, -1, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
  ck_assert_msg(strstr(r.details, "deadline") != NULL, "%s", r.details);
  reply_clear(&r);
  assert_serving(&C);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_cleanup(&D);
  free(bytes);
  topos_network_release(net);
}
END_TEST

/* A job past its deadline stops at the next node boundary: the only
 * worker is free again long before the whole run could have finished. */
START_TEST(test_deadline_stops_mid_run) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  const char *extra[] = {"--workers", "1", NULL};
  daemon_start(&D, extra);
  grpc_init();
  client_open(&C, D.port);
  /* A network whose whole run takes at least ~1.5 s here, in-process,
   * with the backends the daemon registers. */
  topos_value out;
  double full = 0, t0;
  topos_network *net = calibrated_slow_network(1.5, &out, &full);
  char id[65];
  record(&C, net, id);
  uint8_t *bytes;
  size_t len;
  slow_forward_request(net, out, id, &bytes, &len);
  reply r;
  t0 = now_s();
  call_raw(&C, "Forward", bytes, len, 50, &r);
  ck_assert_int_eq(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
  reply_clear(&r);
  assert_serving(&C); /* needs the single worker back */
  double busy = now_s() - t0;
  ck_assert_msg(busy < 0.5 * full,
                "the worker was busy %.3f s; the whole run takes %.3f s", busy,
                full);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_cleanup(&D);
  free(bytes);
  topos_network_release(net);
}
END_TEST

/* One worker, a queue of one: of 8 concurrent slow calls some must be
 * answered UNAVAILABLE at once, the rest OK. */
START_TEST(test_queue_full) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  const char *extra[] = {"--workers", "1", "--queue", "1", NULL};
  daemon_start(&D, extra);
  grpc_init();
  client_open(&C, D.port);
  topos_value out;
  topos_network *net = calibrated_slow_network(0.3, &out, NULL);
  char id[65];
  record(&C, net, id);
  uint8_t *bytes;
  size_t len;
  slow_forward_request(net, out, id, &bytes, &len);
  enum { N = 8 };
  flood_arg args[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    args[i] = (flood_arg){D.port, bytes, len, -1};
    pthread_create(&th[i], NULL, flood_one, &args[i]);
  }
  int ok = 0, unavailable = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    if (args[i].status == GRPC_STATUS_OK) ok++;
    if (args[i].status == GRPC_STATUS_UNAVAILABLE) unavailable++;
  }
  ck_assert_int_eq(ok + unavailable, N);
  ck_assert_int_ge(ok, 1);
  ck_assert_int_ge(unavailable, 1);
  assert_serving(&C);
  free(bytes);
  topos_network_release(net);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 30), 30);
  daemon_cleanup(&D);
}
END_TEST

/* ------------------------------------------------------------ concurrency */

typedef struct step_arg {
  int port;
  const char *id;
  gd_net *g;
  int index;
  int calls, failures;
  char first_failure[256];
} step_arg;

static void *step_client(void *p) {
  step_arg *a = p;
  client c;
  client_open(&c, a->port);
  topos_error err = {0};
  topos_optimizer sgd = topos_sgd(0.01 + 0.001 * a->index, 0.0);
  topos_tensor *w0 = topos_tensor_scalar(TOPOS_F64, 0.1 * a->index, &err);
  topos_params *lp = topos_params_new(1, &w0, &err);
  topos_params *rp = topos_params_new(1, &w0, &err);
  topos_tensor_release(w0);
  topos_opt_state *ls = topos_opt_state_new(&sgd, lp, &err);
  topos_opt_state *rs = NULL;
  for (int i = 0; i < 200; i++) {
    double xv = 1 + (i + a->index) % 5, yv = 2 * xv + 0.5 * a->index;
    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, xv, &err);
    topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, yv, &err);
    topos_feed feeds[2] = {{a->g->x, xt}, {a->g->y, yt}};
    double l1 = 0, l2 = 0;
    local_step(a->g->net, a->g->loss, &sgd, &lp, &ls, feeds, 2, &l1);
    reply raw;
    int status =
        remote_step(&c, a->id, a->g->loss, &sgd, &rp, &rs, feeds, 2, &l2, &raw);
    a->calls++;
    if (status != GRPC_STATUS_OK || l1 != l2 ||
        !topos_params_bitwise_equal(lp, rp)) {
      if (a->failures++ == 0)
        snprintf(a->first_failure, sizeof a->first_failure,
                 "client %d call %d: status %d (%.100s), loss %.17g vs %.17g",
                 a->index, i, status, raw.details, l1, l2);
      if (status != GRPC_STATUS_OK) {
        /* Resynchronise so one failure is not counted 200 times. */
        topos_params_free(rp);
        rp = topos_params_with(lp, 0, topos_params_get(lp, 0), &err);
      }
    }
    reply_clear(&raw);
    topos_tensor_release(xt);
    topos_tensor_release(yt);
  }
  topos_params_free(lp);
  topos_params_free(rp);
  topos_opt_state_free(ls);
  topos_opt_state_free(rs);
  client_close(&c);
  return NULL;
}

/* 16 clients at once, against a daemon whose idle workers and queue
 * thread poll before they sleep (the default) and one whose sleep at once
 * (--spin-us 0: every job wakes a sleeper, the last to sleep first). */
START_TEST(test_concurrent_steps) {
  if (skip_slow()) return;
  const char *sleepy[] = {"--spin-us", "0", "--workers", "3", NULL};
  fixture_start(&D, &C, _i == 0 ? NULL : sleepy);
  gd_net g = gd_network(0);
  char id[65];
  record(&C, g.net, id);
  enum { N = 16 };
  step_arg args[N];
  pthread_t th[N];
  double t0 = now_s();
  for (int i = 0; i < N; i++) {
    memset(&args[i], 0, sizeof args[i]);
    args[i].port = D.port;
    args[i].id = id;
    args[i].g = &g;
    args[i].index = i;
    pthread_create(&th[i], NULL, step_client, &args[i]);
  }
  int calls = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(args[i].failures == 0, "%d failures; first: %s",
                  args[i].failures, args[i].first_failure);
    calls += args[i].calls;
  }
  ck_assert_int_eq(calls, N * 200);
  fprintf(stderr,
          "  16 clients x 200 Steps: %.0f calls/s (with local steps%s)\n",
          calls / (now_s() - t0), _i == 0 ? "" : "; --spin-us 0");
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(&C, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  ck_assert_int_ge(st->requests, N * 200);
  ck_assert_int_eq(st->errors, 0);
  wire_message_free(&st->base);
  topos_network_release(g.net);
  stop_default();
}
END_TEST

/* ---------------------------------------------------------------- kill -9 */

typedef struct record_arg {
  int port;
  int index;
  _Atomic int *stop;
  _Atomic int *acked_total;
  int acked[4096]; /* k of every spec whose Record returned OK */
  int nacked;
} record_arg;

static void *record_client(void *p) {
  record_arg *a = p;
  client c;
  client_open(&c, a->port);
  topos_error err = {0};
  for (int i = 0; !atomic_load(a->stop) && a->nacked < 4096; i++) {
    int k = 1 + a->index * 100000 + i;
    gd_net g = gd_network(k);
    Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
    wire_spec_from_network(g.net, &spec, &err);
    size_t len = 0;
    uint8_t *bytes = pack(&spec.base, &len);
    reply r;
    call_raw(&c, "Record", bytes, len, 10000, &r);
    if (r.status == GRPC_STATUS_OK) {
      a->acked[a->nacked++] = k;
      atomic_fetch_add(a->acked_total, 1);
    } else {
      atomic_store(a->stop, 1); /* the daemon is gone */
    }
    reply_clear(&r);
    free(bytes);
    wire_message_clear(&spec.base);
    topos_network_release(g.net);
  }
  client_close(&c);
  return NULL;
}

START_TEST(test_kill9_under_load) {
  if (skip_slow()) return;
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  daemon_start(&D, NULL);
  grpc_init();
  enum { N = 8 };
  static record_arg args[N];
  pthread_t th[N];
  _Atomic int stop = 0, acked = 0;
  for (int i = 0; i < N; i++) {
    memset(&args[i], 0, sizeof args[i]);
    args[i].port = D.port;
    args[i].index = i;
    args[i].stop = &stop;
    args[i].acked_total = &acked;
    pthread_create(&th[i], NULL, record_client, &args[i]);
  }
  double until = now_s() + 30;
  while (atomic_load(&acked) < 200 && now_s() < until) usleep(1000);
  /* Records are in flight on all eight clients right now. */
  int status = daemon_stop(&D, SIGKILL, 10);
  ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  atomic_store(&stop, 1);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  ck_assert_int_ge(atomic_load(&acked), 200);

  /* Restart on the same file: every acknowledged spec is there and
   * describes exactly as the engine describes it. */
  daemon_start(&D, NULL);
  client_open(&C, D.port);
  topos_error err = {0};
  int checked = 0;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < args[i].nacked; j++) {
      gd_net g = gd_network(args[i].acked[j]);
      char id[65];
      ck_assert_int_eq(topos_network_id(g.net, id, &err), TOPOS_OK);
      Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
      dr.id = id;
      Topos__V1__TextReply *tr = NULL;
      CALL_OK(&C, "Describe", &dr, &topos__v1__text_reply__descriptor, &tr);
      char *local = topos_network_describe(g.net, TOPOS_FORMAT_TEXT, &err);
      ck_assert_str_eq(tr->text, local);
      topos_free(local);
      wire_message_free(&tr->base);
      topos_network_release(g.net);
      checked++;
    }
  }
  ck_assert_int_eq(checked, atomic_load(&acked));
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(&C, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  ck_assert_int_ge(st->specs, checked);
  wire_message_free(&st->base);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_cleanup(&D);
}
END_TEST

/* --------------------------------------------------------------- SIGTERM */

START_TEST(test_sigterm_idle) {
  start_default();
  assert_serving(&C);
  client_close(&C);
  grpc_shutdown();
  double t0 = now_s();
  int status = daemon_stop(&D, SIGTERM, 5);
  assert_clean_exit(status, 5);
  ck_assert(now_s() - t0 < 3);
  /* The log says it drained and closed the store. */
  FILE *f = fopen(D.log, "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  bool drained = false;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "event=stop")) drained = true;
  fclose(f);
  ck_assert(drained);
  daemon_cleanup(&D);
}
END_TEST

typedef struct slow_arg {
  int port;
  const uint8_t *bytes;
  size_t len;
  int status;
} slow_arg;

/* SIGTERM with a slow call in flight: it finishes inside the grace period
 * and the daemon exits 0; with a grace period too short, the call is
 * answered UNAVAILABLE and the daemon still exits 0. */
START_TEST(test_sigterm_in_flight) {
  if (skip_slow()) return;
  for (int short_grace = 0; short_grace <= 1; short_grace++) {
    memset(&D, 0, sizeof D);
    daemon_dir(&D);
    const char *extra[] = {"--grace-ms", short_grace ? "1" : "20000", NULL};
    daemon_start(&D, extra);
    grpc_init();
    client_open(&C, D.port);
    topos_value out;
    topos_network *net = calibrated_slow_network(1.5, &out, NULL);
    char id[65];
    record(&C, net, id);
    uint8_t *bytes;
    size_t len;
    slow_forward_request(net, out, id, &bytes, &len);
    flood_arg a = {D.port, bytes, len, -1};
    pthread_t th;
    pthread_create(&th, NULL, flood_one, &a);
    wait_run_in_flight(&C, 30); /* the call is running (it takes over 1 s) */
    double t0 = now_s();
    int status = daemon_stop(&D, SIGTERM, 30);
    pthread_join(th, NULL);
    assert_clean_exit(status, 30);
    ck_assert_msg(
        a.status == (short_grace ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_OK),
        "grace %s: in-flight call status %d", short_grace ? "1 ms" : "20 s",
        a.status);
    ck_assert(now_s() - t0 < 20);
    free(bytes);
    topos_network_release(net);
    client_close(&C);
    grpc_shutdown();
    daemon_cleanup(&D);
  }
}
END_TEST

/* ---------------------------------------------------------------- config */

START_TEST(test_config) {
  char out[8192];
  const char *help[] = {"--help", NULL};
  ck_assert_int_eq(run_toposd(help, out, sizeof out), 0);
  ck_assert(strstr(out, "--listen") && strstr(out, "--max-message-bytes"));
  const char *bad[] = {"--workers", "0", NULL};
  ck_assert_int_eq(run_toposd(bad, out, sizeof out), 2);
  ck_assert(strstr(out, "workers"));
  const char *unknown[] = {"--frobnicate", "1", NULL};
  ck_assert_int_eq(run_toposd(unknown, out, sizeof out), 2);
  const char *fmt[] = {"--log-format", "xml", NULL};
  ck_assert_int_eq(run_toposd(fmt, out, sizeof out), 2);

  /* A JSON file: its listen and log format are used; a flag overrides
   * the file's workers. */
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  char path[400];
  snprintf(path, sizeof path, "%s/toposd.json", D.dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f,
          "{\"listen\": \"127.0.0.1:0\", \"log_format\": \"json\", "
          "\"workers\": 3, \"queue\": 17, \"max_message_bytes\": \"8M\"}\n");
  fclose(f);
  const char *extra[] = {"--config", path, "--workers", "2", NULL};
  daemon_start(&D, extra);
  grpc_init();
  client_open(&C, D.port);
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(&C, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  ck_assert_int_eq(st->workers, 2);
  ck_assert_int_eq(st->queue_capacity, 17);
  wire_message_free(&st->base);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  /* Every log line is one JSON object with the request fields. */
  f = fopen(D.log, "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  int requests = 0;
  while (fgets(line, sizeof line, f)) {
    ck_assert_msg(line[0] == '{' && strstr(line, "}\n"), "log: %s", line);
    if (strstr(line, "\"event\":\"request\"")) {
      ck_assert(strstr(line, "\"method\":\"Stats\""));
      ck_assert(strstr(line, "\"status\":\"OK\""));
      ck_assert(strstr(line, "\"us\":"));
      requests++;
    }
  }
  fclose(f);
  ck_assert_int_eq(requests, 1);

  /* A config file with an unknown key is refused. */
  f = fopen(path, "w");
  fprintf(f, "{\"listne\": \"127.0.0.1:0\"}\n");
  fclose(f);
  const char *typo[] = {"--config", path, NULL};
  ck_assert_int_eq(run_toposd(typo, out, sizeof out), 2);
  ck_assert(strstr(out, "listne"));
  daemon_cleanup(&D);
}
END_TEST

/* ------------------------------------------------- blob write-behind */

static void put_one_blob(client *c, double v, char id[65]) {
  topos_error err = {0};
  int64_t shape[1] = {4096};
  topos_tensor *t = topos_tensor_filled(TOPOS_F32, 1, shape, v, &err);
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  Topos__V1__Tensor *one[1] = {wire_tensor_new(t, &err)};
  pb.tensors = one;
  pb.n_tensors = 1;
  Topos__V1__PutBlobReply *put = NULL;
  CALL_OK(c, "PutBlob", &pb, &topos__v1__put_blob_reply__descriptor, &put);
  memcpy(id, put->id, 65);
  wire_message_free(&put->base);
  wire_message_free(&one[0]->base);
  topos_tensor_release(t);
}

static bool blob_present(client *c, const char *id) {
  Topos__V1__StatBlobRequest sb = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
  sb.id = (char *)id;
  Topos__V1__StatBlobReply *stat = NULL;
  CALL_OK(c, "StatBlob", &sb, &topos__v1__stat_blob_reply__descriptor, &stat);
  bool present = stat->present;
  wire_message_free(&stat->base);
  return present;
}

/* Blobs written behind (early acknowledgement, opted into) are flushed
 * by a SIGTERM; with a pending bound of 0 (the default) a PutBlob is
 * durable when it answers, even across kill -9 (test_durable.c). */
START_TEST(test_blob_durability) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  const char *early[] = {"--blob-pending-bytes", "1G", NULL};
  daemon_start(&D, early);
  grpc_init();
  client_open(&C, D.port);
  char ids[8][65];
  for (int i = 0; i < 8; i++) put_one_blob(&C, i, ids[i]);
  for (int i = 0; i < 8; i++) ck_assert(blob_present(&C, ids[i]));
  client_close(&C);
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_start(&D, NULL);
  client_open(&C, D.port);
  for (int i = 0; i < 8; i++) ck_assert(blob_present(&C, ids[i]));
  client_close(&C);
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);

  const char *sync[] = {"--blob-pending-bytes", "0", NULL};
  daemon_start(&D, sync);
  client_open(&C, D.port);
  char id[65];
  put_one_blob(&C, 100, id);
  client_close(&C);
  int status = daemon_stop(&D, SIGKILL, 10);
  ck_assert(WIFSIGNALED(status));
  daemon_start(&D, NULL);
  client_open(&C, D.port);
  ck_assert(blob_present(&C, id));
  /* A blob over the cap is refused before anything is stored. */
  client_close(&C);
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  const char *small_cap[] = {"--blob-cap-bytes", "1K", NULL};
  daemon_start(&D, small_cap);
  client_open(&C, D.port);
  topos_error err = {0};
  int64_t shape[1] = {1024};
  topos_tensor *t = topos_tensor_zeros(TOPOS_F32, 1, shape, &err);
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  Topos__V1__Tensor *one[1] = {wire_tensor_new(t, &err)};
  pb.tensors = one;
  pb.n_tensors = 1;
  expect_msg(&C, "PutBlob", &pb.base, GRPC_STATUS_RESOURCE_EXHAUSTED,
             "blob over the cap");
  wire_message_free(&one[0]->base);
  topos_tensor_release(t);
  assert_serving(&C);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 20), 20);
  daemon_cleanup(&D);
}
END_TEST

/* ------------------------------------------------------- unit tests */

/* The daemon's small containers and its configuration are tested here
 * directly, compiled into this file (the runner links no daemon
 * objects). */
#include "../../server/cache.c"
#include "../../server/config.c"

static int destroyed;
static void count_destroy(void *v) {
  destroyed++;
  free(v);
}

static int *boxed(int v) {
  int *p = malloc(sizeof *p);
  *p = v;
  return p;
}

START_TEST(test_cache_lru) {
  destroyed = 0;
  cache *c = cache_new(3, 100);
  cache_entry *r[8];
  for (int i = 0; i < 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "k%d", i);
    cache_put(c, key, boxed(i), count_destroy, 10, &r[i]);
    cache_release(c, r[i]);
  }
  /* k0 is used, so k1 is the least recent and goes first. */
  int *v = cache_get(c, "k0", &r[0]);
  ck_assert_int_eq(*v, 0);
  cache_release(c, r[0]);
  cache_put(c, "k3", boxed(3), count_destroy, 10, &r[3]);
  cache_release(c, r[3]);
  ck_assert_ptr_null(cache_get(c, "k1", &r[1]));
  ck_assert_ptr_nonnull(cache_get(c, "k0", &r[0]));
  cache_release(c, r[0]);
  ck_assert_int_eq(destroyed, 1);
  /* A held value survives its eviction until released. */
  v = cache_get(c, "k2", &r[2]);
  cache_put(c, "big", boxed(9), count_destroy, 95, &r[4]);
  ck_assert_int_eq(*v, 2);
  ck_assert_ptr_null(cache_get(c, "k2", &r[5]));
  int before = destroyed;
  cache_release(c, r[2]);
  ck_assert_int_eq(destroyed, before + 1);
  cache_release(c, r[4]);
  /* Over the byte bound: handed back, never kept. */
  v = cache_put(c, "huge", boxed(7), count_destroy, 101, &r[6]);
  ck_assert_int_eq(*v, 7);
  ck_assert_ptr_null(cache_get(c, "huge", &r[7]));
  before = destroyed;
  cache_release(c, r[6]);
  ck_assert_int_eq(destroyed, before + 1);
  /* A second put of a key keeps the first value. */
  cache_put(c, "dup", boxed(1), count_destroy, 1, &r[0]);
  v = cache_put(c, "dup", boxed(2), count_destroy, 1, &r[1]);
  ck_assert_int_eq(*v, 1);
  cache_release(c, r[0]);
  cache_release(c, r[1]);
  cache_counters cc;
  cache_stats(c, &cc);
  ck_assert_int_le(cc.entries, 3);
  ck_assert_int_le(cc.bytes, 100);
  ck_assert_int_ge(cc.hits, 2);
  ck_assert_int_ge(cc.misses, 3);
  cache_free(c);
}
END_TEST

START_TEST(test_config_parse) {
  toposd_config cfg;
  char msg[512];
  config_defaults(&cfg);
  ck_assert_str_eq(cfg.listen, "127.0.0.1:50051");
  ck_assert_str_eq(cfg.store, "./var/topos.db");
  ck_assert_int_eq(cfg.max_message_bytes, (int64_t)512 << 20);
  ck_assert_int_ge(cfg.workers, 1);
  char *ok[] = {"toposd",
                "--listen=0.0.0.0:7000",
                "--workers",
                "3",
                "--max-message-bytes",
                "64M",
                "--log-format",
                "json",
                "--blob-cap-bytes",
                "2G",
                "--deadline-ms",
                "0",
                NULL};
  ck_assert_int_eq(config_parse(&cfg, 12, ok, msg, sizeof msg), 0);
  ck_assert_str_eq(cfg.listen, "0.0.0.0:7000");
  ck_assert_int_eq(cfg.workers, 3);
  ck_assert_int_eq(cfg.max_message_bytes, (int64_t)64 << 20);
  ck_assert_int_eq(cfg.log_format, LOG_JSON);
  ck_assert_int_eq(cfg.blob_cap_bytes, (int64_t)2 << 30);
  ck_assert_int_eq(cfg.deadline_ms, 0);
  ck_assert_int_eq(cfg.spin_us, 200);
  char *no_spin[] = {"toposd", "--spin-us", "0", NULL};
  ck_assert_int_eq(config_parse(&cfg, 3, no_spin, msg, sizeof msg), 0);
  ck_assert_int_eq(cfg.spin_us, 0);
  ck_assert_int_eq(cfg.read_ahead, READ_AHEAD_AUTO);
  char *ahead[] = {"toposd", "--stream-read-ahead", "always", NULL};
  ck_assert_int_eq(config_parse(&cfg, 3, ahead, msg, sizeof msg), 0);
  ck_assert_int_eq(cfg.read_ahead, READ_AHEAD_ALWAYS);
  const char *bad[][3] = {{"--workers", "0", ""},
                          {"--workers", "x", ""},
                          {"--max-message-bytes", "4G", ""},
                          {"--queue", "-1", ""},
                          {"--listen", "nocolon", ""},
                          {"--log-format", "xml", ""},
                          {"--grace-ms", "1h", ""},
                          {"--spin-us", "-1", ""},
                          {"--spin-us", "100001", ""},
                          {"--stream-read-ahead", "sometimes", ""},
                          {"--nope", "1", ""}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    config_defaults(&cfg);
    char *argv[] = {"toposd", (char *)bad[i][0], (char *)bad[i][1], NULL};
    ck_assert_msg(config_parse(&cfg, 3, argv, msg, sizeof msg) == -1,
                  "%s %s accepted", bad[i][0], bad[i][1]);
    ck_assert(msg[0] != '\0');
  }
  char *missing[] = {"toposd", "--store", NULL};
  ck_assert_int_eq(config_parse(&cfg, 2, missing, msg, sizeof msg), -1);
  char *stray[] = {"toposd", "serve", NULL};
  ck_assert_int_eq(config_parse(&cfg, 2, stray, msg, sizeof msg), -1);

  /* JSON: numbers and strings; flags win over the file wherever they
   * appear; unknown keys and non-objects are refused. */
  const char *tmp = getenv("TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/toposd-config-%d.json",
           tmp && *tmp ? tmp : "/tmp", (int)getpid());
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"workers\": 5, \"queue\": 9, \"cache_bytes\": \"3M\"}");
  fclose(f);
  config_defaults(&cfg);
  char *with_file[] = {"toposd", "--workers", "2", "--config", path, NULL};
  ck_assert_int_eq(config_parse(&cfg, 5, with_file, msg, sizeof msg), 0);
  ck_assert_int_eq(cfg.workers, 2);
  ck_assert_int_eq(cfg.queue, 9);
  ck_assert_int_eq(cfg.cache_bytes, (int64_t)3 << 20);
  const char *bad_files[] = {
      "[1, 2]",           "{\"workers\": 1.5}",  "{\"workers\": true}",
      "{\"wrokers\": 2}", "{\"config\": \"x\"}", "not json"};
  for (size_t i = 0; i < sizeof bad_files / sizeof *bad_files; i++) {
    f = fopen(path, "w");
    fputs(bad_files[i], f);
    fclose(f);
    config_defaults(&cfg);
    ck_assert_msg(config_load_json(&cfg, path, msg, sizeof msg) == -1,
                  "%s accepted", bad_files[i]);
  }
  remove(path);
  ck_assert_int_eq(config_load_json(&cfg, path, msg, sizeof msg), -1);
}
END_TEST

Suite *server_suite(void) {
  Suite *s = suite_create("server");
  TCase *tc = tcase_create("rpc");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_record_describe_idempotent);
  tcase_add_test(tc, test_forward_backward_lower_emit);
  tcase_add_test(tc, test_entry_threads);
  tcase_add_test(tc, test_step_bit_identical);
  tcase_add_test(tc, test_blobs);
  tcase_add_test(tc, test_blob_refs_in_step);
  tcase_add_test(tc, test_conformance);
  tcase_add_test(tc, test_exec_options_hostile);
  tcase_add_test(tc, test_blob_durability);
  suite_add_tcase(s, tc);
  TCase *units = tcase_create("units");
  tcase_add_test(units, test_cache_lru);
  tcase_add_test(units, test_config_parse);
  suite_add_tcase(s, units);
  TCase *hostile = tcase_create("hostile");
  tcase_set_timeout(hostile, 180);
  tcase_add_test(hostile, test_hostile_random_and_truncated);
  tcase_add_test(hostile, test_hostile_values);
  tcase_add_test(hostile, test_message_limit_small);
  tcase_add_test(hostile, test_message_limit_512m);
  tcase_add_test(hostile, test_deadlines);
  tcase_add_test(hostile, test_deadline_stops_mid_run);
  tcase_add_test(hostile, test_queue_full);
  suite_add_tcase(s, hostile);
  TCase *load = tcase_create("load");
  tcase_set_timeout(load, 300);
  tcase_add_loop_test(load, test_concurrent_steps, 0, 2);
  tcase_add_test(load, test_kill9_under_load);
  tcase_add_test(load, test_sigterm_idle);
  tcase_add_test(load, test_sigterm_in_flight);
  tcase_add_test(load, test_config);
  suite_add_tcase(s, load);
  return s;
}
