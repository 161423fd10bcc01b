/*
 * test_optimizer.c - Step's optimizer settings and state against a real
 * toposd (issue 10, item 9): numbers left unset take their documented
 * defaults (Adam's betas 0.9 and 0.999, eps 1e-8; AdamW's weight decay
 * 0.01), bit for bit what the engine computes in-process with those
 * values; a missing lr, a number the kind does not read, out-of-range
 * numbers, unknown enums and decay slots outside the spec's parameters or
 * listed twice are INVALID_ARGUMENT naming the field; and a state with a
 * negative or NaN second moment, a non-finite first moment, or moments
 * that do not fit the parameters is INVALID_ARGUMENT naming the slot and
 * the element.  The daemon serves a good Step after all of it.
 */
#include "harness.h"

/* The MLP's Step request with optimizer om and optional state (borrowed;
 * free with step_request_clear). */
static Topos__V1__StepRequest step_request(const char *id, const mlp_net *m,
                                           Topos__V1__Optimizer *om,
                                           Topos__V1__OptimizerState *state) {
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = (char *)id;
  sr.loss = value_msg(m->loss);
  sr.optimizer = om;
  sr.state = state;
  return sr;
}

static void step_request_clear(Topos__V1__StepRequest *sr) {
  wire_message_free(&sr->loss->base);
}

static void expect_invalid(client *c, Topos__V1__StepRequest *sr,
                           const char *needle, const char *what) {
  reply r;
  call_msg(c, "Step", &sr->base, NULL, NULL, &r);
  ck_assert_msg(r.status == GRPC_STATUS_INVALID_ARGUMENT, "%s: status %d (%s)",
                what, r.status, r.details);
  ck_assert_msg(strstr(r.details, needle) != NULL, "%s: '%s' lacks '%s'", what,
                r.details, needle);
  reply_clear(&r);
}

static Topos__V1__Optimizer opt_msg(int kind, double lr) {
  Topos__V1__Optimizer m = TOPOS__V1__OPTIMIZER__INIT;
  m.kind = (Topos__V1__OptimizerKind)kind;
  m.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  m.lr = lr;
  return m;
}

/* One remote Step of the MLP from its initials and a fresh state with om;
 * the new parameters and state (new). */
static void remote_step(client *c, const char *id, const mlp_net *m,
                        Topos__V1__Optimizer *om, topos_params **params,
                        topos_opt_state **state) {
  topos_error err = {0};
  Topos__V1__StepRequest sr = step_request(id, m, om, NULL);
  Topos__V1__StepReply *rep = NULL;
  CALL_OK(c, "Step", &sr, &topos__v1__step_reply__descriptor, &rep);
  ck_assert_int_eq(wire_params_from_proto(rep->parameters, rep->n_parameters,
                                          NULL, "parameters", params, &err),
                   TOPOS_OK);
  ck_assert_int_eq(wire_state_from_proto(rep->state, NULL, state, &err),
                   TOPOS_OK);
  wire_message_free(&rep->base);
  step_request_clear(&sr);
}

/* The same step in-process with the engine optimizer opt. */
static void local_step(const mlp_net *m, const topos_optimizer *opt,
                       topos_params **params, topos_opt_state **state) {
  topos_error err = {0};
  topos_entry e = {
      &m->loss, 1, NULL, 0, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(m->net, &e, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  topos_step_result r = {0};
  ck_assert_msg(topos_plan_step(plan, NULL, NULL, 0, opt, NULL, NULL, &r,
                                &err) == TOPOS_OK,
                "%s", err.message);
  *params = r.params;
  *state = r.state;
  r.params = NULL;
  r.state = NULL;
  topos_step_result_clear(&r);
  topos_plan_free(plan);
}

static bool same_state(const topos_opt_state *a, const topos_opt_state *b) {
  if (topos_opt_state_step(a) != topos_opt_state_step(b)) return false;
  for (int k = 0; k < 2; k++) {
    const topos_params *x = topos_opt_state_moment(a, k);
    const topos_params *y = topos_opt_state_moment(b, k);
    if ((x == NULL) != (y == NULL)) return false;
    if (x && !topos_params_bitwise_equal(x, y)) return false;
  }
  return true;
}

START_TEST(test_defaults_applied) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  struct {
    int kind;
    topos_optimizer local;
  } cases[] = {
      {TOPOS__V1__OPTIMIZER_KIND__ADAM, topos_adam(1e-2, 0.9, 0.999, 1e-8)},
      {TOPOS__V1__OPTIMIZER_KIND__ADAMW,
       topos_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)},
      {TOPOS__V1__OPTIMIZER_KIND__SGD, topos_sgd(1e-2, 0)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    /* Only kind and lr on the wire. */
    Topos__V1__Optimizer om = opt_msg(cases[i].kind, 1e-2);
    topos_params *pr = NULL, *pl = NULL;
    topos_opt_state *sr = NULL, *sl = NULL;
    remote_step(&C, id, &m, &om, &pr, &sr);
    local_step(&m, &cases[i].local, &pl, &sl);
    ck_assert_msg(topos_params_bitwise_equal(pr, pl), "case %zu params", i);
    ck_assert_msg(same_state(sr, sl), "case %zu state", i);
    if (cases[i].kind != TOPOS__V1__OPTIMIZER_KIND__SGD) {
      /* Not what zero betas would give (the old reading of unset): the
       * moments differ (Adam's first update itself hardly depends on
       * the betas, the bias corrections cancel them). */
      topos_optimizer zero = cases[i].local;
      zero.beta1 = zero.beta2 = 0;
      topos_params *pz = NULL;
      topos_opt_state *sz = NULL;
      local_step(&m, &zero, &pz, &sz);
      ck_assert(!same_state(sr, sz));
      topos_params_free(pz);
      topos_opt_state_free(sz);
    }
    topos_params_free(pr);
    topos_params_free(pl);
    topos_opt_state_free(sr);
    topos_opt_state_free(sl);
  }
  /* Given values, zeros included, are used as given. */
  Topos__V1__Optimizer om = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAMW, 1e-2);
  om.weight_decay_given_case =
      TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
  om.weight_decay = 0;
  om.beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  om.beta2 = 0.99;
  topos_optimizer local = topos_adamw(1e-2, 0.9, 0.99, 1e-8, 0);
  topos_params *pr = NULL, *pl = NULL;
  topos_opt_state *sr = NULL, *sl = NULL;
  remote_step(&C, id, &m, &om, &pr, &sr);
  local_step(&m, &local, &pl, &sl);
  ck_assert(topos_params_bitwise_equal(pr, pl));
  ck_assert(same_state(sr, sl));
  topos_params_free(pr);
  topos_params_free(pl);
  topos_opt_state_free(sr);
  topos_opt_state_free(sl);
  topos_network_release(m.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_settings_refused) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  int32_t far[2] = {1, 4}, twice[3] = {3, 0, 3};
  enum { SGD = 0, ADAM = 1, ADAMW = 2 };
  struct {
    const char *what, *expect;
    Topos__V1__Optimizer om;
  } bad[] = {
      {"no lr", "optimizer.lr is missing", TOPOS__V1__OPTIMIZER__INIT},
      {"adam momentum", "optimizer.momentum is given, but ADAM does not read",
       opt_msg(ADAM, 0.1)},
      {"sgd beta1", "optimizer.beta1 is given, but SGD does not read",
       opt_msg(SGD, 0.1)},
      {"sgd eps", "optimizer.eps is given, but SGD", opt_msg(SGD, 0.1)},
      {"adam decay", "optimizer.decay is given, but ADAM", opt_msg(ADAM, 0.1)},
      {"slot out of range",
       "optimizer.decay_slots[1] = 4 is not a parameter slot (the spec has 4: "
       "0..3)",
       opt_msg(ADAMW, 0.1)},
      {"slot twice", "optimizer.decay_slots[2] = 3 repeats decay_slots[0]",
       opt_msg(ADAMW, 0.1)},
      {"slots without LISTED_SLOTS",
       "decay_slots given without the LISTED_SLOTS rule", opt_msg(ADAMW, 0.1)},
      {"unknown kind", "unknown kind 5 (SGD 0, ADAM 1, ADAMW 2)",
       opt_msg(5, 0.1)},
      {"unknown decay", "unknown decay rule 3", opt_msg(ADAMW, 0.1)},
      {"lr nan", "lr nan must be finite and >= 0", opt_msg(ADAM, NAN)},
      {"lr negative", "lr -1 must be finite and >= 0", opt_msg(SGD, -1)},
      {"beta1 1", "beta1 1 is not in [0,1)", opt_msg(ADAM, 0.1)},
      {"beta2 negative", "beta2 -0.5 is not in [0,1)", opt_msg(ADAMW, 0.1)},
      {"eps 0", "eps 0 must be finite and > 0", opt_msg(ADAM, 0.1)},
      {"momentum 1", "momentum 1 is not in [0,1)", opt_msg(SGD, 0.1)},
      {"weight decay negative", "weight_decay -0.1 must be finite and >= 0",
       opt_msg(ADAMW, 0.1)},
      {"weight decay inf", "weight_decay inf must be finite",
       opt_msg(SGD, 0.1)},
  };
  bad[0].om.kind = TOPOS__V1__OPTIMIZER_KIND__ADAM;
  bad[1].om.momentum_given_case = TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
  bad[1].om.momentum = 0.9;
  bad[2].om.beta1_given_case = TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
  bad[2].om.beta1 = 0.9;
  bad[3].om.eps_given_case = TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
  bad[3].om.eps = 0; /* given, even as 0 */
  bad[4].om.decay = TOPOS__V1__DECAY_RULE__ALL_SLOTS;
  bad[5].om.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  bad[5].om.decay_slots = far;
  bad[5].om.n_decay_slots = 2;
  bad[6].om.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  bad[6].om.decay_slots = twice;
  bad[6].om.n_decay_slots = 3;
  bad[7].om.decay = TOPOS__V1__DECAY_RULE__ALL_SLOTS;
  bad[7].om.decay_slots = far;
  bad[7].om.n_decay_slots = 1;
  bad[9].om.decay = (Topos__V1__DecayRule)3;
  bad[12].om.beta1_given_case = TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
  bad[12].om.beta1 = 1;
  bad[13].om.beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  bad[13].om.beta2 = -0.5;
  bad[14].om.eps_given_case = TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
  bad[14].om.eps = 0;
  bad[15].om.momentum_given_case =
      TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
  bad[15].om.momentum = 1;
  bad[16].om.weight_decay_given_case =
      TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
  bad[16].om.weight_decay = -0.1;
  bad[17].om.weight_decay_given_case =
      TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
  bad[17].om.weight_decay = INFINITY;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    Topos__V1__StepRequest sr = step_request(id, &m, &bad[i].om, NULL);
    expect_invalid(&C, &sr, bad[i].expect, bad[i].what);
    step_request_clear(&sr);
  }
  /* The same optimizer with its slots inside the spec steps. */
  Topos__V1__Optimizer ok = opt_msg(ADAMW, 0.1);
  int32_t fine[2] = {0, 2};
  ok.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  ok.decay_slots = fine;
  ok.n_decay_slots = 2;
  topos_params *p = NULL;
  topos_opt_state *s = NULL;
  remote_step(&C, id, &m, &ok, &p, &s);
  topos_params_free(p);
  topos_opt_state_free(s);
  topos_network_release(m.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

/* A state message whose moment `which` (0 m, 1 v) has element `elem` of
 * slot `slot` set to x; the others are fresh zeros (v) and zeros (m).
 * Free with wire_message_free. */
static Topos__V1__OptimizerState *state_with(const topos_network *net,
                                             int which, int slot, int64_t elem,
                                             double x) {
  topos_error err = {0};
  topos_params *p = topos_network_parameters(net);
  topos_optimizer adam = topos_adam(0.1, 0.9, 0.999, 1e-8);
  topos_opt_state *fresh = topos_opt_state_new(&adam, p, &err);
  const topos_params *mo = topos_opt_state_moment(fresh, which);
  const topos_tensor *t = topos_params_get(mo, slot);
  int64_t n = topos_tensor_count(t);
  float *vals = calloc((size_t)n, sizeof *vals);
  vals[elem] = (float)x;
  topos_tensor *bad = topos_tensor_from(TOPOS_F32, topos_tensor_rank(t),
                                        topos_tensor_shape(t), vals, &err);
  free(vals);
  topos_params *with = topos_params_with(mo, slot, bad, &err);
  topos_opt_state *s = topos_opt_state_from(
      2, which == 0 ? with : topos_opt_state_moment(fresh, 0),
      which == 1 ? with : topos_opt_state_moment(fresh, 1), &err);
  ck_assert_msg(s != NULL, "%s", err.message);
  Topos__V1__OptimizerState *m = wire_state_new(s, &err);
  ck_assert_ptr_nonnull(m);
  topos_opt_state_free(s);
  topos_params_free(with);
  topos_tensor_release(bad);
  topos_opt_state_free(fresh);
  topos_params_free(p);
  return m;
}

START_TEST(test_state_refused) {
  daemon_proc d;
  daemon_dir(&d);
  daemon_start(&d, NULL);
  client C;
  client_open(&C, d.port);
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  Topos__V1__Optimizer adam = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAM, 0.1);
  Topos__V1__Optimizer sgdm = opt_msg(TOPOS__V1__OPTIMIZER_KIND__SGD, 0.1);
  sgdm.momentum_given_case = TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
  sgdm.momentum = 0.9;
  struct {
    int which, slot;
    int64_t elem;
    double x;
    const char *expect;
  } bad[] = {
      {1, 2, 37, -1,
       "state second moment (v) slot 2 element 37 is -1; second "
       "moments must be >= 0 and not NaN"},
      {1, 0, 0, NAN, "second moment (v) slot 0 element 0 is nan"},
      {1, 3, 4, -1e-20, "second moment (v) slot 3 element 4 is -1e-20"},
      {0, 1, 15, INFINITY,
       "first moment (m) slot 1 element 15 is inf; first "
       "moments must be finite"},
      {0, 0, 95, NAN, "first moment (m) slot 0 element 95 is nan"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    Topos__V1__OptimizerState *st =
        state_with(m.net, bad[i].which, bad[i].slot, bad[i].elem, bad[i].x);
    Topos__V1__StepRequest sr = step_request(id, &m, &adam, st);
    expect_invalid(&C, &sr, bad[i].expect, bad[i].expect);
    /* SGD with momentum reads m only. */
    sr.optimizer = &sgdm;
    if (bad[i].which == 0) {
      expect_invalid(&C, &sr, bad[i].expect, "sgd momentum");
    } else {
      Topos__V1__StepReply *rep = NULL;
      CALL_OK(&C, "Step", &sr, &topos__v1__step_reply__descriptor, &rep);
      wire_message_free(&rep->base);
    }
    step_request_clear(&sr);
    wire_message_free(&st->base);
  }

  /* Moments that do not fit the parameters: a slot short, a slot of the
   * wrong shape, the wrong dtype, a negative step. */
  topos_error err = {0};
  Topos__V1__OptimizerState *st = state_with(m.net, 1, 0, 0, 0);
  Topos__V1__Tensor *last = st->v[3];
  st->n_v = 3;
  Topos__V1__StepRequest sr = step_request(id, &m, &adam, st);
  expect_invalid(&C, &sr, "4 slots but 3 in second moment", "short v");
  st->n_v = 4;
  Topos__V1__Tensor *m0 = st->m[0], *v0 = st->v[0];
  st->m[0] = st->m[1];
  st->v[0] = st->v[1];
  expect_invalid(&C, &sr, "slot 0: param [6,16], first moment [16]",
                 "misshapen moments");
  st->m[0] = m0;
  st->v[0] = v0;
  topos_tensor *z64 = topos_tensor_zeros(TOPOS_F64, 1, (int64_t[]){5}, &err);
  Topos__V1__Tensor *f64 = wire_tensor_new(z64, &err);
  st->v[3] = f64;
  expect_invalid(&C, &sr, "second moment slot 3 is f64, wants f32",
                 "f64 moment");
  st->v[3] = last;
  st->step = -1;
  expect_invalid(&C, &sr, "step -1 is negative", "negative step");
  st->step = 2;
  Topos__V1__StepReply *rep = NULL;
  CALL_OK(&C, "Step", &sr, &topos__v1__step_reply__descriptor, &rep);
  wire_message_free(&rep->base);
  wire_message_free(&f64->base);
  topos_tensor_release(z64);
  step_request_clear(&sr);
  wire_message_free(&st->base);
  assert_serving(&C);
  topos_network_release(m.net);
  client_close(&C);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

Suite *optimizer_suite(void) {
  Suite *s = suite_create("optimizer");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, grpc_up, grpc_down);
  tcase_add_test(tc, test_defaults_applied);
  tcase_add_test(tc, test_settings_refused);
  tcase_add_test(tc, test_state_refused);
  suite_add_tcase(s, tc);
  return s;
}
