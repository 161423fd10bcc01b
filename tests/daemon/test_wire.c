/*
 * test_wire.c - proto/wire.c: protobuf <-> engine conversions, with no
 * socket.  Round trips (tensors of every dtype, every sample network as a
 * spec, entries, feeds, optimizers with every decay rule, optimizer
 * state) must be exact, and hostile messages (unknown enums, lengths off
 * by one, extents that overflow, rank 9, forward operand references,
 * unknown ops, permutes without a perm, blob references where none are
 * allowed) must give the right error code and a message naming the field,
 * never a crash.  Each message also goes through pack/unpack, so the
 * conversions are checked on what protobuf-c really produces.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_nets.h"
#include "testutil.h"
#include "topos.h"
#include "wire.h"

/* Packs m and unpacks it again as the descriptor's type (new message). */
static ProtobufCMessage *repack(const ProtobufCMessage *m) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  topos_error err = {0};
  ck_assert_int_eq(wire_pack(m, &bytes, &len, &err), TOPOS_OK);
  ProtobufCMessage *u =
      protobuf_c_message_unpack(m->descriptor, NULL, len, bytes);
  free(bytes);
  ck_assert_ptr_nonnull(u);
  return u;
}

static topos_tensor *tensor_roundtrip(const topos_tensor *t) {
  topos_error err = {0};
  Topos__V1__Tensor m = TOPOS__V1__TENSOR__INIT;
  ck_assert_int_eq(wire_tensor_to_proto(t, &m, &err), TOPOS_OK);
  Topos__V1__Tensor *u = (Topos__V1__Tensor *)repack(&m.base);
  wire_tensor_clear(&m);
  topos_tensor *back = wire_tensor_from_proto(u, NULL, "t", &err);
  ck_assert_msg(back != NULL, "%s", err.message);
  wire_message_free(&u->base);
  return back;
}

START_TEST(test_tensor_roundtrip_every_dtype) {
  const topos_dtype dts[4] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16, TOPOS_I32};
  for (int d = 0; d < 4; d++) {
    topos_tensor *t = tt_random(dts[d], 3, SN_S(2, 3, 4), 7 + d, -100, 100);
    topos_tensor *back = tensor_roundtrip(t);
    ck_assert_msg(topos_tensor_bitwise_equal(t, back), "dtype %d", d);
    topos_tensor_release(back);
    topos_tensor_release(t);
  }
  /* Scalars, empty tensors, rank 8, a non-contiguous view. */
  topos_tensor *s = topos_tensor_scalar(TOPOS_F64, -0.0, NULL);
  topos_tensor *sb = tensor_roundtrip(s);
  ck_assert(topos_tensor_bitwise_equal(s, sb));
  ck_assert_int_eq(topos_tensor_rank(sb), 0);
  topos_tensor *z = topos_tensor_zeros(TOPOS_F32, 2, SN_S(0, 5), NULL);
  topos_tensor *zb = tensor_roundtrip(z);
  ck_assert(topos_tensor_bitwise_equal(z, zb));
  topos_tensor *r8 =
      tt_random(TOPOS_F32, 8, SN_S(1, 2, 1, 2, 1, 2, 1, 2), 3, -1, 1);
  topos_tensor *r8b = tensor_roundtrip(r8);
  ck_assert(topos_tensor_bitwise_equal(r8, r8b));
  topos_tensor *base = tt_random(TOPOS_F64, 2, SN_S(3, 4), 4, -1, 1);
  topos_tensor *view = topos_tensor_transpose(base, NULL);
  topos_tensor *vb = tensor_roundtrip(view);
  ck_assert(topos_tensor_bitwise_equal(view, vb));
  ck_assert(topos_tensor_is_contiguous(vb));
  /* NaN payloads survive (bits, not values). */
  const double nan_bits[2] = {NAN, -INFINITY};
  topos_tensor *n = topos_tensor_from(TOPOS_F64, 1, SN_S(2), nan_bits, NULL);
  topos_tensor *nb = tensor_roundtrip(n);
  ck_assert(topos_tensor_bitwise_equal(n, nb));
  topos_tensor *all[] = {s, sb, z, zb, r8, r8b, base, view, vb, n, nb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    topos_tensor_release(all[i]);
}
END_TEST

START_TEST(test_tensor_little_endian_bytes) {
  const float v[2] = {1.0f, -2.5f};
  topos_tensor *t = topos_tensor_from(TOPOS_F32, 1, SN_S(2), v, NULL);
  Topos__V1__Tensor m = TOPOS__V1__TENSOR__INIT;
  ck_assert_int_eq(wire_tensor_to_proto(t, &m, NULL), TOPOS_OK);
  ck_assert_int_eq(m.dtype, TOPOS__V1__DTYPE__F32);
  ck_assert_uint_eq(m.n_shape, 1);
  ck_assert_int_eq(m.shape[0], 2);
  ck_assert_uint_eq(m.data.len, 8);
  const uint8_t want[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0};
  ck_assert(memcmp(m.data.data, want, 8) == 0);
  wire_tensor_clear(&m);
  ck_assert_ptr_null(m.data.data);
  ck_assert_ptr_null(m.shape);
  topos_tensor_release(t);
}
END_TEST

/* Expects wire_tensor_from_proto to fail with `code` and a message that
 * contains `needle`. */
static void expect_tensor_error(const Topos__V1__Tensor *m,
                                const wire_blobs *blobs, int code,
                                const char *needle) {
  topos_error err = {0};
  topos_tensor *t = wire_tensor_from_proto(m, blobs, "feeds[0].tensor", &err);
  ck_assert_msg(t == NULL, "accepted a hostile tensor (%s)", needle);
  ck_assert_msg(err.code == code, "code %d want %d: %s", err.code, code,
                err.message);
  ck_assert_msg(strstr(err.message, needle) != NULL, "'%s' lacks '%s'",
                err.message, needle);
  ck_assert_msg(strstr(err.message, "feeds[0].tensor") != NULL,
                "'%s' does not name the field", err.message);
}

START_TEST(test_tensor_hostile) {
  uint8_t data[17] = {0};
  int64_t shape[9] = {2, 2, 1, 1, 1, 1, 1, 1, 1};
  Topos__V1__Tensor m = TOPOS__V1__TENSOR__INIT;
  m.shape = shape;
  m.n_shape = 2;
  m.data.data = data;

  m.dtype = 7; /* unknown dtype */
  m.data.len = 16;
  expect_tensor_error(&m, NULL, TOPOS_ERR_DTYPE, "unknown dtype 7");
  m.dtype = -1;
  expect_tensor_error(&m, NULL, TOPOS_ERR_DTYPE, "unknown dtype -1");

  m.dtype = TOPOS__V1__DTYPE__F32; /* f32[2,2] needs 16 bytes */
  m.data.len = 15;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "holds 15 bytes");
  m.data.len = 17;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "holds 17 bytes");
  m.data.len = 16;
  topos_tensor *ok = wire_tensor_from_proto(&m, NULL, NULL, NULL);
  ck_assert_ptr_nonnull(ok);
  topos_tensor_release(ok);

  m.n_shape = 9; /* rank 9 */
  expect_tensor_error(&m, NULL, TOPOS_ERR_SHAPE, "rank 9");

  int64_t huge[3] = {(int64_t)1 << 62, (int64_t)1 << 62, 4};
  m.shape = huge;
  m.n_shape = 2; /* 2^124 elements */
  expect_tensor_error(&m, NULL, TOPOS_ERR_SHAPE, "more elements");
  m.n_shape = 1; /* 2^62 f32 elements: 2^64 bytes */
  expect_tensor_error(&m, NULL, TOPOS_ERR_SHAPE, "more bytes");
  int64_t big[2] = {(int64_t)1 << 40, 1}; /* fits, but no such data */
  m.shape = big;
  m.n_shape = 2;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "holds 16 bytes");
  /* A zero extent beside huge ones: the strides would overflow. */
  int64_t zero_huge[3] = {(int64_t)1 << 62, 0, (int64_t)1 << 62};
  m.shape = zero_huge;
  m.n_shape = 3;
  m.data.len = 0; /* even when empty, strides must fit int64 */
  expect_tensor_error(&m, NULL, TOPOS_ERR_SHAPE, "more elements");
  zero_huge[0] = (int64_t)1 << 40;
  zero_huge[2] = (int64_t)1 << 20;
  topos_tensor *empty = wire_tensor_from_proto(&m, NULL, NULL, NULL);
  ck_assert_ptr_nonnull(empty);
  ck_assert_int_eq(topos_tensor_count(empty), 0);
  topos_tensor_release(empty);
  m.data.len = 16;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "needs 0");

  int64_t neg[2] = {2, -2};
  m.shape = neg;
  m.n_shape = 2;
  expect_tensor_error(&m, NULL, TOPOS_ERR_SHAPE, "negative");

  expect_tensor_error(NULL, NULL, TOPOS_ERR_ARGUMENT, "missing");
}
END_TEST

START_TEST(test_tensor_blob_refs) {
  static const char id[] =
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  static const char other[] =
      "00000000000000000000000000000000000000000000000000000000000000aa";
  static const char failed[] =
      "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
  static const char absent[] =
      "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
  topos_tensor *a = tt_random(TOPOS_F32, 1, SN_S(3), 1, -1, 1);
  topos_tensor *b = tt_random(TOPOS_F64, 2, SN_S(2, 2), 2, -1, 1);
  topos_tensor *c = tt_random(TOPOS_F32, 1, SN_S(5), 3, -1, 1);
  topos_params *p = topos_params_new(2, (topos_tensor *[]){a, b}, NULL);
  /* What a daemon looked up: two blobs, given out of order (sorting is
   * what makes the lookup find them), and one lookup that failed. */
  topos_tensor *ab[2] = {a, b};
  wire_blob v[2] = {{id, ab, 2}, {other, &c, 1}};
  wire_blobs_sort(v, 2);
  ck_assert_str_eq(v[0].id, other);
  wire_blobs table = {
      v, 2, failed, {TOPOS_ERR_NOT_FOUND, "blob is not stored"}};
  topos_error err = {0};

  Topos__V1__Tensor **refs = NULL;
  size_t n = 0;
  ck_assert_int_eq(wire_tensor_refs(id, 2, &refs, &n, &err), TOPOS_OK);
  ck_assert_uint_eq(n, 2);
  /* Through the wire: what the daemon would unpack. */
  Topos__V1__ForwardRequest req = TOPOS__V1__FORWARD_REQUEST__INIT;
  req.parameters = refs;
  req.n_parameters = n;
  Topos__V1__ForwardRequest *u = (Topos__V1__ForwardRequest *)repack(&req.base);
  wire_tensors_free(refs, n);
  topos_params *got = NULL;
  ck_assert_int_eq(wire_params_from_proto(u->parameters, u->n_parameters,
                                          &table, "parameters", &got, &err),
                   TOPOS_OK);
  ck_assert(topos_params_bitwise_equal(got, p));
  topos_params_free(got);

  /* Without a table a reference is an error. */
  ck_assert_int_eq(wire_params_from_proto(u->parameters, u->n_parameters, NULL,
                                          "parameters", &got, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(got);
  ck_assert_msg(strstr(err.message, "parameters[0]") &&
                    strstr(err.message, "blob reference"),
                "%s", err.message);
  wire_message_free(&u->base);

  /* A bad id or index is refused before the table is read (the empty
   * table would say "not looked up"); an index past the end is RANGE; the
   * failed lookup is its own error in the field that referred to it; an id
   * nobody looked up is STATE. */
  wire_blobs empty = {0};
  Topos__V1__BlobRef ref = TOPOS__V1__BLOB_REF__INIT;
  Topos__V1__Tensor m = TOPOS__V1__TENSOR__INIT;
  m.blob = &ref;
  ref.id = "ABC";
  expect_tensor_error(&m, &empty, TOPOS_ERR_ARGUMENT, "64 lowercase hex");
  ref.id = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef";
  expect_tensor_error(&m, &empty, TOPOS_ERR_ARGUMENT, "64 lowercase hex");
  ref.id = (char *)id;
  ref.index = -1;
  expect_tensor_error(&m, &empty, TOPOS_ERR_RANGE, "negative");
  ref.index = 0;
  expect_tensor_error(&m, &empty, TOPOS_ERR_STATE, "not looked up");
  ref.index = 2;
  expect_tensor_error(&m, &table, TOPOS_ERR_RANGE, "holds 2 tensors; index 2");
  ref.id = (char *)other;
  ref.index = 0;
  topos_tensor *t = wire_tensor_from_proto(&m, &table, NULL, &err);
  ck_assert_ptr_eq(t, c);
  topos_tensor_release(t);
  ref.id = (char *)failed;
  expect_tensor_error(&m, &table, TOPOS_ERR_NOT_FOUND, "not stored");
  ref.id = (char *)absent;
  expect_tensor_error(&m, &table, TOPOS_ERR_STATE, "not looked up");

  ck_assert(wire_id_valid(id));
  ck_assert(!wire_id_valid(NULL));
  ck_assert(!wire_id_valid(""));
  ck_assert(!wire_tensor_new_ref("abc", 0, NULL));
  topos_params_free(p);
  topos_tensor_release(a);
  topos_tensor_release(b);
  topos_tensor_release(c);
}
END_TEST

/* net -> Spec -> bytes -> Spec -> network. */
static topos_network *spec_roundtrip(const topos_network *net) {
  topos_error err = {0};
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_msg(wire_spec_from_network(net, &spec, &err) == TOPOS_OK, "%s",
                err.message);
  ck_assert_int_eq((int)spec.n_nodes, topos_network_node_count(net));
  Topos__V1__Spec *u = (Topos__V1__Spec *)repack(&spec.base);
  wire_message_clear(&spec.base);
  ck_assert_uint_eq(spec.n_nodes, 0);
  topos_network *back = wire_spec_to_network(u, &err);
  ck_assert_msg(back != NULL, "%s", err.message);
  wire_message_free(&u->base);
  return back;
}

START_TEST(test_spec_roundtrip_samples) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    ck_assert_ptr_nonnull(net);
    topos_network *once = spec_roundtrip(net);
    topos_network *twice = spec_roundtrip(once);
    char a[65], b[65], c[65];
    ck_assert_int_eq(topos_network_id(net, a, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(once, b, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(twice, c, NULL), TOPOS_OK);
    ck_assert_msg(strcmp(a, b) == 0, "%s: id changed", sn_samples[s].name);
    ck_assert_str_eq(b, c);
    /* Names and parameter initials came across too. */
    ck_assert_int_eq(topos_network_parameter_count(once),
                     topos_network_parameter_count(net));
    topos_params *p0 = topos_network_parameters(net);
    topos_params *p1 = topos_network_parameters(once);
    ck_assert(topos_params_bitwise_equal(p0, p1));
    topos_params_free(p0);
    topos_params_free(p1);
    topos_network_release(twice);
    topos_network_release(once);
    topos_network_release(net);
  }
}
END_TEST

/* The splat form (Tensor.splat): a spec's all-equal leaf tensors go as
 * one element - a model's parameters recorded as zeros make a spec of
 * bytes, not the model's size - and come back as the same network (the
 * same id); data of any other length, or a splat of fewer than two
 * elements, is refused; a splat of many elements decodes to a view of
 * one, never count copies. */
START_TEST(test_spec_splat) {
  topos_error err = {0};
  const int64_t shape[2] = {1000, 1000};
  topos_tensor *zero = topos_tensor_zeros(TOPOS_F32, 2, shape, &err);
  topos_tensor *ramp =
      topos_init_normal(TOPOS_F32, 2, shape, 0.0, 1.0, 7, &err);
  ck_assert_ptr_nonnull(zero);
  ck_assert_ptr_nonnull(ramp);
  ck_assert(topos_tensor_is_uniform(zero));
  ck_assert(!topos_tensor_is_uniform(ramp));
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w = topos_parameter(tape, zero);
  topos_value x = topos_parameter(tape, ramp);
  topos_value y = topos_sum(tape, topos_add(tape, w, x));
  (void)y;
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, &err), TOPOS_OK);
  ck_assert(spec.nodes[0]->tensor->splat);
  ck_assert_uint_eq(spec.nodes[0]->tensor->data.len, 4);
  ck_assert(!spec.nodes[1]->tensor->splat);
  ck_assert_uint_eq(spec.nodes[1]->tensor->data.len, 4000000);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(wire_pack(&spec.base, &bytes, &len, &err), TOPOS_OK);
  ck_assert_uint_lt(len, 4000000 + 1000); /* the zeros are 4 bytes */
  free(bytes);
  wire_message_clear(&spec.base);
  topos_network *back = spec_roundtrip(net);
  char a[65], b[65];
  ck_assert_int_eq(topos_network_id(net, a, NULL), TOPOS_OK);
  ck_assert_int_eq(topos_network_id(back, b, NULL), TOPOS_OK);
  ck_assert_str_eq(a, b);
  topos_network_release(back);
  topos_network_release(net);
  topos_tensor_release(zero);
  topos_tensor_release(ramp);

  /* hostile splats */
  float one = 2.5f;
  int64_t s2[2] = {2, 3};
  Topos__V1__Tensor m = TOPOS__V1__TENSOR__INIT;
  m.dtype = TOPOS__V1__DTYPE__F32;
  m.shape = s2;
  m.n_shape = 2;
  m.splat = true;
  m.data.data = (uint8_t *)&one;
  m.data.len = 3;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "a splat of");
  m.data.len = 24;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "holds 24 bytes");
  int64_t s1[1] = {1};
  m.shape = s1;
  m.n_shape = 1;
  m.data.len = 4;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "two or more");
  m.n_shape = 0;
  expect_tensor_error(&m, NULL, TOPOS_ERR_ARGUMENT, "two or more");
  int64_t big[2] = {(int64_t)1 << 26, (int64_t)1 << 10}; /* 2^36 elements */
  m.shape = big;
  m.n_shape = 2;
  topos_tensor *v = wire_tensor_from_proto(&m, NULL, NULL, &err);
  ck_assert_msg(v != NULL, "%s", err.message);
  ck_assert_int_eq(topos_tensor_count(v), (int64_t)1 << 36);
  ck_assert(topos_tensor_is_uniform(v)); /* a view of one element */
  topos_tensor_release(v);
  big[0] = (int64_t)1 << 30; /* 2^42 bytes: over the engine's tensor limit */
  expect_tensor_error(&m, NULL, TOPOS_ERR_MEMORY, "2^40-byte limit");
  m.shape = s2; /* the decoded value */
  v = wire_tensor_from_proto(&m, NULL, NULL, &err);
  float got[6];
  ck_assert_int_eq(topos_tensor_read(v, got, sizeof got, &err), TOPOS_OK);
  for (int i = 0; i < 6; i++) ck_assert(got[i] == 2.5f);
  topos_tensor_release(v);
}
END_TEST

START_TEST(test_spec_only_read_attributes) {
  /* An add with stray attributes replays as the same network as a clean
   * one: attributes an op does not read are dropped. */
  topos_network *net = sn_gradient_descent();
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
  ck_assert_int_eq(spec.dtype, TOPOS__V1__DTYPE__F64);
  ck_assert_str_eq(spec.nodes[0]->name, "w");
  ck_assert_int_eq(spec.nodes[3]->op, TOPOS__V1__OP__MUL);
  spec.nodes[3]->axis = 5;
  spec.nodes[3]->p = 2.5;
  topos_network *back = wire_spec_to_network(&spec, NULL);
  ck_assert_ptr_nonnull(back);
  char a[65], b[65];
  topos_network_id(net, a, NULL);
  topos_network_id(back, b, NULL);
  ck_assert_str_eq(a, b);
  topos_node_info ni;
  ck_assert_int_eq(topos_network_node(back, 3, &ni, NULL), TOPOS_OK);
  ck_assert_int_eq(ni.axis, 0);
  ck_assert(ni.p == 0);
  topos_network_release(back);
  wire_message_clear(&spec.base);
  topos_network_release(net);
}
END_TEST

/* Expects the spec to be refused with `code` and `needle` in the message. */
static void expect_spec_error(const Topos__V1__Spec *spec, int code,
                              const char *needle) {
  topos_error err = {0};
  topos_network *net = wire_spec_to_network(spec, &err);
  ck_assert_msg(net == NULL, "accepted a hostile spec (%s)", needle);
  ck_assert_msg(err.code == code, "code %d want %d: %s", err.code, code,
                err.message);
  ck_assert_msg(strstr(err.message, needle) != NULL, "'%s' lacks '%s'",
                err.message, needle);
}

START_TEST(test_spec_hostile) {
  topos_network *net = sn_every_op();
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
  /* Find a binary node, a permute, a reshape and a parameter. */
  int bin = -1, perm = -1, reshape = -1;
  for (size_t i = 0; i < spec.n_nodes; i++) {
    int op = spec.nodes[i]->op;
    if (bin < 0 && op == TOPOS__V1__OP__ADD) bin = (int)i;
    if (op == TOPOS__V1__OP__PERMUTE) perm = (int)i;
    if (op == TOPOS__V1__OP__RESHAPE) reshape = (int)i;
  }
  ck_assert(bin > 0 && perm > 0 && reshape > 0);
  Topos__V1__Node *nb = spec.nodes[bin];

  /* Operand index == node index, > node index, negative. */
  int32_t keep = nb->operands[1];
  nb->operands[1] = bin;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "not an earlier node");
  nb->operands[1] = 1 << 30;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "not an earlier node");
  nb->operands[1] = -1;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "not an earlier node");
  nb->operands[1] = keep;

  /* Unknown op 99 and -3. */
  nb->op = 99;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "unknown op 99");
  nb->op = -3;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "unknown op -3");
  nb->op = TOPOS__V1__OP__ADD;

  /* Wrong arity: the engine's own check. */
  nb->n_operands = 1;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "");
  nb->n_operands = 2;

  /* Permute without a perm, with a short perm, with a non-permutation. */
  Topos__V1__Node *np = spec.nodes[perm];
  size_t nperm = np->n_perm;
  ck_assert_uint_eq(nperm, 2);
  np->n_perm = 0;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "perm has 0 entries");
  np->n_perm = 1;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "perm has 1 entries");
  np->n_perm = 2;
  int32_t p0 = np->perm[0];
  np->perm[0] = np->perm[1];
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "permutation");
  np->perm[0] = p0;

  /* A reshape target of rank 9, and one with the wrong count. */
  Topos__V1__Node *nr = spec.nodes[reshape];
  int64_t *target = nr->shape;
  size_t ntarget = nr->n_shape;
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 6};
  nr->shape = nine;
  nr->n_shape = 9;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "target shape has 9");
  nine[8] = 7;
  nr->n_shape = 1;
  nr->shape = nine + 8;
  expect_spec_error(&spec, TOPOS_ERR_SHAPE, "element counts differ");
  nr->shape = target;
  nr->n_shape = ntarget;

  /* A leaf without a tensor; a leaf with a bad tensor; a blob reference in
   * a spec. */
  Topos__V1__Tensor *t0 = spec.nodes[0]->tensor;
  spec.nodes[0]->tensor = NULL;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "needs a tensor");
  Topos__V1__Tensor bad = TOPOS__V1__TENSOR__INIT;
  bad.dtype = 9;
  spec.nodes[0]->tensor = &bad;
  expect_spec_error(&spec, TOPOS_ERR_DTYPE, "node 0");
  Topos__V1__BlobRef ref = TOPOS__V1__BLOB_REF__INIT;
  ref.id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  bad.blob = &ref;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "blob reference");
  spec.nodes[0]->tensor = t0;

  /* Duplicate names, an over-long name. */
  char *n1 = spec.nodes[1]->name;
  spec.nodes[1]->name = spec.nodes[0]->name;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "already names");
  char longname[300];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  spec.nodes[1]->name = longname;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "1 to 255 bytes");
  spec.nodes[1]->name = n1;

  /* Tape dtype I32 or unknown. */
  spec.dtype = TOPOS__V1__DTYPE__I32;
  expect_spec_error(&spec, TOPOS_ERR_DTYPE, "tape dtype 3");
  spec.dtype = 42;
  expect_spec_error(&spec, TOPOS_ERR_DTYPE, "tape dtype 42");
  spec.dtype = TOPOS__V1__DTYPE__F32;

  /* A missing node. */
  Topos__V1__Node *n5 = spec.nodes[5];
  spec.nodes[5] = NULL;
  expect_spec_error(&spec, TOPOS_ERR_ARGUMENT, "node 5");
  spec.nodes[5] = n5;

  /* After all that, the spec still replays to the same network. */
  topos_network *back = wire_spec_to_network(&spec, NULL);
  ck_assert_ptr_nonnull(back);
  char a[65], b[65];
  topos_network_id(net, a, NULL);
  topos_network_id(back, b, NULL);
  ck_assert_str_eq(a, b);
  topos_network_release(back);
  wire_message_clear(&spec.base);
  topos_network_release(net);

  expect_spec_error(NULL, TOPOS_ERR_ARGUMENT, "NULL");
}
END_TEST

START_TEST(test_spec_random_bytes) {
  /* Random bytes that happen to unpack as a Spec never crash the replay. */
  uint64_t s = 99;
  int unpacked = 0;
  for (int round = 0; round < 3000; round++) {
    uint8_t buf[96];
    size_t len = 1 + (size_t)(tt_uniform(&s, 0, sizeof buf));
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)tt_uniform(&s, 0, 256);
    Topos__V1__Spec *m = topos__v1__spec__unpack(NULL, len, buf);
    if (!m) continue;
    unpacked++;
    topos_error err = {0};
    topos_network *net = wire_spec_to_network(m, &err);
    if (!net) ck_assert_msg(err.message[0] != '\0', "an empty message");
    topos_network_release(net);
    topos__v1__spec__free_unpacked(m, NULL);
  }
  ck_assert_int_gt(unpacked, 0);
}
END_TEST

START_TEST(test_values_and_entries) {
  topos_network *net = sn_mlp();
  topos_error err = {0};
  topos_value v;
  Topos__V1__Value *byname = wire_value_new_name("loss");
  ck_assert_int_eq(wire_value_resolve(net, byname, "loss", &v, &err), TOPOS_OK);
  ck_assert_int_eq(v.index, topos_network_find(net, "loss").index);
  ck_assert_int_eq(v.tape, topos_network_find(net, "loss").tape);
  Topos__V1__Value *byidx = wire_value_new_index(2);
  ck_assert_int_eq(wire_value_resolve(net, byidx, "x", &v, &err), TOPOS_OK);
  ck_assert_int_eq(v.index, 2);
  ck_assert_ptr_nonnull(topos_network_value_shape(net, v, NULL));
  byidx->index = topos_network_node_count(net);
  ck_assert_int_eq(wire_value_resolve(net, byidx, "loss", &v, &err),
                   TOPOS_ERR_RANGE);
  ck_assert_ptr_nonnull(strstr(err.message, "loss"));
  byidx->index = -1;
  ck_assert_int_eq(wire_value_resolve(net, byidx, "loss", &v, &err),
                   TOPOS_ERR_RANGE);
  Topos__V1__Value *nobody = wire_value_new_name("nobody");
  ck_assert_int_eq(wire_value_resolve(net, nobody, "loss", &v, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "nobody"));
  Topos__V1__Value unset = TOPOS__V1__VALUE__INIT;
  ck_assert_int_eq(wire_value_resolve(net, &unset, "loss", &v, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "loss is missing"));
  ck_assert_int_eq(wire_value_resolve(net, NULL, "loss", &v, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Entry out (indices) and back in, through the wire. */
  topos_value loss = topos_network_find(net, "loss");
  topos_value w1 = topos_network_find(net, "w1");
  topos_value roots[1] = {loss};
  topos_value obs[2] = {w1, topos_network_input(net, 0)};
  topos_entry e = {
      roots, 1, obs, 2, TOPOS_POSTURE_TRAINING, TOPOS_NUMERICS_FAST};
  Topos__V1__Entry *em = wire_entry_new(&e, "cpu", &err);
  ck_assert_ptr_nonnull(em);
  Topos__V1__Entry *eu = (Topos__V1__Entry *)repack(&em->base);
  wire_message_free(&em->base);
  wire_entry we;
  ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err), TOPOS_OK);
  ck_assert_int_eq(we.entry.nroots, 1);
  ck_assert_int_eq(we.entry.nobserves, 2);
  ck_assert_int_eq(we.entry.roots[0].index, loss.index);
  ck_assert_int_eq(we.entry.observes[1].index, obs[1].index);
  ck_assert_int_eq(we.entry.posture, TOPOS_POSTURE_TRAINING);
  ck_assert_int_eq(we.entry.numerics, TOPOS_NUMERICS_FAST);
  ck_assert_str_eq(we.backend, "cpu");
  char *k1 = wire_entry_key(&e), *k2 = wire_entry_key(&we.entry);
  ck_assert_str_eq(k1, k2);
  e.posture = TOPOS_POSTURE_FORWARD;
  char *k3 = wire_entry_key(&e);
  ck_assert_str_ne(k1, k3);
  free(k1);
  free(k2);
  free(k3);
  /* The engine accepts what came across. */
  topos_plan *plan = topos_network_lower(net, &we.entry, &err);
  ck_assert_msg(plan != NULL, "%s", err.message);
  topos_plan_free(plan);
  wire_entry_clear(&we);
  ck_assert_ptr_null(we.values);

  /* Hostile entries. */
  eu->posture = 7;
  ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "posture 7"));
  eu->posture = 1;
  eu->numerics = -2;
  ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err),
                   TOPOS_ERR_ARGUMENT);
  eu->numerics = 0;
  eu->roots[0]->index = 1000;
  ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err), TOPOS_ERR_RANGE);
  ck_assert_ptr_nonnull(strstr(err.message, "entry.roots[0]"));
  ck_assert_ptr_null(we.values);
  ck_assert_int_eq(wire_entry_from_proto(net, NULL, &we, &err),
                   TOPOS_ERR_ARGUMENT);
  wire_message_free(&eu->base);
  wire_message_free(&byname->base);
  wire_message_free(&byidx->base);
  wire_message_free(&nobody->base);
  topos_network_release(net);
}
END_TEST

/* Entry.threads: through the wire both ways, into the plan cache's key,
 * and anything above TOPOS_THREADS_MAX refused with the field named. */
START_TEST(test_entry_threads) {
  topos_network *net = sn_gradient_descent();
  topos_error err = {0};
  topos_value roots[1] = {topos_network_find(net, "loss")};
  topos_entry e = {.roots = roots, .nroots = 1};
  const int counts[4] = {0, 1, 4, TOPOS_THREADS_MAX};
  char *keys[4];
  for (int i = 0; i < 4; i++) {
    e.threads = counts[i];
    Topos__V1__Entry *em = wire_entry_new(&e, NULL, &err);
    ck_assert_ptr_nonnull(em);
    ck_assert_uint_eq(em->threads, (unsigned)counts[i]);
    Topos__V1__Entry *eu = (Topos__V1__Entry *)repack(&em->base);
    wire_message_free(&em->base);
    ck_assert_uint_eq(eu->threads, (unsigned)counts[i]);
    wire_entry we;
    ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err), TOPOS_OK);
    ck_assert_int_eq(we.entry.threads, counts[i]);
    keys[i] = wire_entry_key(&we.entry);
    ck_assert_ptr_nonnull(keys[i]);
    for (int j = 0; j < i; j++) ck_assert_str_ne(keys[i], keys[j]);
    topos_plan *plan = topos_network_lower(net, &we.entry, &err);
    ck_assert_msg(plan != NULL, "%s", err.message);
    ck_assert_int_eq(topos_plan_threads(plan), counts[i]);
    topos_plan_free(plan);
    wire_entry_clear(&we);
    wire_message_free(&eu->base);
  }
  /* 0 keeps the key entries always had; others append ";t<n>". */
  char want0[64], want4[64];
  snprintf(want0, sizeof want0, "r%d;o;p0;n0", (int)roots[0].index);
  snprintf(want4, sizeof want4, "r%d;o;p0;n0;t4", (int)roots[0].index);
  ck_assert_str_eq(keys[0], want0);
  ck_assert_str_eq(keys[2], want4);
  for (int i = 0; i < 4; i++) free(keys[i]);

  /* Above the limit: refused, naming the field and the value. */
  const uint32_t bad[3] = {TOPOS_THREADS_MAX + 1, 5000, UINT32_MAX};
  for (int i = 0; i < 3; i++) {
    e.threads = 1;
    Topos__V1__Entry *em = wire_entry_new(&e, NULL, &err);
    ck_assert_ptr_nonnull(em);
    em->threads = bad[i];
    Topos__V1__Entry *eu = (Topos__V1__Entry *)repack(&em->base);
    wire_message_free(&em->base);
    wire_entry we;
    ck_assert_int_eq(wire_entry_from_proto(net, eu, &we, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_int_eq(wire_grpc_status_of(err.code), WIRE_GRPC_INVALID_ARGUMENT);
    char want[64];
    snprintf(want, sizeof want, "entry: threads %u is out of range",
             (unsigned)bad[i]);
    ck_assert_msg(strstr(err.message, want) != NULL, "%s", err.message);
    ck_assert_ptr_null(we.values);
    wire_message_free(&eu->base);
  }
  /* A negative count cannot be sent. */
  e.threads = -1;
  ck_assert_ptr_null(wire_entry_new(&e, NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "threads -1"));
  topos_network_release(net);
}
END_TEST

START_TEST(test_feeds) {
  topos_network *net = sn_gradient_descent();
  topos_value x = topos_network_find(net, "x"),
              y = topos_network_find(net, "y");
  topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, 3, NULL);
  topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, 6, NULL);
  topos_feed feeds[2] = {{x, xt}, {y, yt}};
  topos_error err = {0};
  Topos__V1__Feed **fm = NULL;
  size_t n = 0;
  ck_assert_int_eq(wire_feeds_to_proto(feeds, 2, &fm, &n, &err), TOPOS_OK);
  Topos__V1__BackwardRequest req = TOPOS__V1__BACKWARD_REQUEST__INIT;
  req.feeds = fm;
  req.n_feeds = n;
  Topos__V1__BackwardRequest *u =
      (Topos__V1__BackwardRequest *)repack(&req.base);
  wire_feeds_free_proto(fm, n);
  topos_feed *back = NULL;
  ck_assert_int_eq(
      wire_feeds_from_proto(net, u->feeds, u->n_feeds, NULL, &back, &err),
      TOPOS_OK);
  ck_assert_int_eq(back[0].input.index, x.index);
  ck_assert(topos_tensor_bitwise_equal(back[1].tensor, yt));
  /* Same forward result in-process with either set of feeds. */
  topos_run *r1 = topos_forward(net, NULL, feeds, 2, NULL, &err);
  topos_run *r2 = topos_forward(net, NULL, back, 2, NULL, &err);
  topos_value loss = topos_network_find(net, "loss");
  ck_assert(topos_run_scalar(r1, loss, NULL) ==
            topos_run_scalar(r2, loss, NULL));
  topos_run_free(r1);
  topos_run_free(r2);
  wire_feeds_free(back, 2);

  /* A feed into a non-input, a feed without input, a bad tensor. */
  u->feeds[0]->input->index = loss.index;
  ck_assert_int_eq(
      wire_feeds_from_proto(net, u->feeds, u->n_feeds, NULL, &back, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "not an input"));
  ck_assert_ptr_null(back);
  u->feeds[0]->input->index = x.index;
  u->feeds[1]->tensor->data.len--;
  ck_assert_int_eq(
      wire_feeds_from_proto(net, u->feeds, u->n_feeds, NULL, &back, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "feeds[1].tensor"));
  u->feeds[1]->tensor->data.len++;
  Topos__V1__Value *in = u->feeds[1]->input;
  u->feeds[1]->input = NULL;
  ck_assert_int_eq(
      wire_feeds_from_proto(net, u->feeds, u->n_feeds, NULL, &back, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "feeds[1].input is missing"));
  u->feeds[1]->input = in;
  wire_message_free(&u->base);
  topos_tensor_release(xt);
  topos_tensor_release(yt);
  topos_network_release(net);
}
END_TEST

static bool decay_first(int slot, const topos_tensor *param, void *ctx) {
  return slot == *(int *)ctx;
}

/* One in-process step with opt vs one with the optimizer after a trip
 * through the wire: bit-identical parameters and state. */
static void check_optimizer_trip(const topos_optimizer *opt) {
  topos_network *net = sn_mlp();
  topos_error err = {0};
  topos_params *params = topos_network_parameters(net);
  topos_run *run = topos_forward(net, params, NULL, 0, NULL, &err);
  topos_field *g =
      topos_backward(run, topos_network_find(net, "loss"), NULL, &err);
  topos_params *grads = topos_parameters_of(g, &err);
  topos_opt_state *s0 = topos_opt_state_new(opt, params, &err);
  ck_assert_msg(s0 != NULL, "%s", err.message);

  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(opt, params, &om, &err), TOPOS_OK);
  Topos__V1__Optimizer *ou = (Topos__V1__Optimizer *)repack(&om.base);
  wire_message_clear(&om.base);
  wire_optimizer wo;
  ck_assert_msg(wire_optimizer_from_proto(ou, topos_params_count(params), &wo,
                                          &err) == TOPOS_OK,
                "%s", err.message);

  topos_params *pa = NULL, *pb = NULL;
  topos_opt_state *sa = NULL, *sb = NULL;
  ck_assert_int_eq(topos_optimizer_step(opt, params, grads, s0, &pa, &sa, &err),
                   TOPOS_OK);
  /* The state crosses the wire too. */
  Topos__V1__OptimizerState *sm = wire_state_new(s0, &err);
  Topos__V1__OptimizerState *su =
      (Topos__V1__OptimizerState *)repack(&sm->base);
  wire_message_free(&sm->base);
  topos_opt_state *s1 = NULL;
  ck_assert_int_eq(wire_state_from_proto(su, NULL, &s1, &err), TOPOS_OK);
  ck_assert_msg(topos_optimizer_step(&wo.opt, params, grads, s1, &pb, &sb,
                                     &err) == TOPOS_OK,
                "%s", err.message);
  ck_assert(topos_params_bitwise_equal(pa, pb));
  ck_assert_int_eq(topos_opt_state_step(sa), topos_opt_state_step(sb));
  for (int k = 0; k < 2; k++) {
    const topos_params *ma = topos_opt_state_moment(sa, k);
    const topos_params *mb = topos_opt_state_moment(sb, k);
    ck_assert((ma == NULL) == (mb == NULL));
    if (ma) ck_assert(topos_params_bitwise_equal(ma, mb));
  }
  /* And the resulting state round-trips exactly. */
  Topos__V1__OptimizerState st = TOPOS__V1__OPTIMIZER_STATE__INIT;
  ck_assert_int_eq(wire_state_to_proto(sb, &st, &err), TOPOS_OK);
  topos_opt_state *sc = NULL;
  ck_assert_int_eq(wire_state_from_proto(&st, NULL, &sc, &err), TOPOS_OK);
  ck_assert_int_eq(topos_opt_state_step(sc), topos_opt_state_step(sb));
  wire_message_clear(&st.base);

  topos_opt_state_free(sc);
  wire_message_free(&su->base);
  wire_message_free(&ou->base);
  wire_optimizer_clear(&wo);
  topos_params_free(pa);
  topos_params_free(pb);
  topos_opt_state_free(sa);
  topos_opt_state_free(sb);
  topos_opt_state_free(s0);
  topos_opt_state_free(s1);
  topos_params_free(grads);
  topos_field_free(g);
  topos_run_free(run);
  topos_params_free(params);
  topos_network_release(net);
}

START_TEST(test_optimizers) {
  topos_optimizer sgd = topos_sgd(0.1, 0.0);
  check_optimizer_trip(&sgd);
  topos_optimizer mom = topos_sgd(0.05, 0.9);
  mom.weight_decay = 1e-3;
  check_optimizer_trip(&mom);
  topos_optimizer adam = topos_adam(1e-3, 0.9, 0.999, 1e-8);
  check_optimizer_trip(&adam);
  topos_optimizer adamw = topos_adamw(1e-3, 0.9, 0.999, 1e-8, 0.1);
  check_optimizer_trip(&adamw);
  int first = 1;
  topos_optimizer custom = topos_adamw(1e-2, 0.8, 0.99, 1e-6, 0.5);
  custom.decay = decay_first;
  custom.decay_ctx = &first;
  check_optimizer_trip(&custom);

  /* A custom predicate goes out as its slots. */
  topos_network *net = sn_mlp();
  topos_params *p = topos_network_parameters(net);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(&custom, p, &om, NULL), TOPOS_OK);
  ck_assert_int_eq(om.decay, TOPOS__V1__DECAY_RULE__LISTED_SLOTS);
  ck_assert_uint_eq(om.n_decay_slots, 1);
  ck_assert_int_eq(om.decay_slots[0], 1);
  wire_message_clear(&om.base);
  ck_assert_int_eq(wire_optimizer_to_proto(&custom, NULL, &om, NULL),
                   TOPOS_ERR_ARGUMENT);
  wire_message_clear(&om.base);

  /* ALL_SLOTS decays everything. */
  om.kind = TOPOS__V1__OPTIMIZER_KIND__ADAMW;
  om.decay = TOPOS__V1__DECAY_RULE__ALL_SLOTS;
  om.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  om.lr = 1e-3;
  wire_optimizer wo;
  ck_assert_int_eq(wire_optimizer_from_proto(&om, -1, &wo, NULL), TOPOS_OK);
  ck_assert_ptr_nonnull(wo.opt.decay);
  for (int s = 0; s < topos_params_count(p); s++)
    ck_assert(wo.opt.decay(s, topos_params_get(p, s), wo.opt.decay_ctx));
  wire_optimizer_clear(&wo);

  /* Hostile optimizers. */
  topos_error err = {0};
  om.kind = 3;
  ck_assert_int_eq(wire_optimizer_from_proto(&om, -1, &wo, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "unknown kind 3"));
  om.kind = TOPOS__V1__OPTIMIZER_KIND__ADAMW;
  om.decay = 9;
  ck_assert_int_eq(wire_optimizer_from_proto(&om, -1, &wo, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "decay rule 9"));
  om.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  int32_t slots[2] = {0, -4};
  om.decay_slots = slots;
  om.n_decay_slots = 2;
  ck_assert_int_eq(wire_optimizer_from_proto(&om, -1, &wo, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "negative"));
  om.decay_slots = NULL;
  om.n_decay_slots = 0;
  ck_assert_int_eq(wire_optimizer_from_proto(NULL, -1, &wo, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Hostile state: negative step, mismatched moments. */
  Topos__V1__OptimizerState st = TOPOS__V1__OPTIMIZER_STATE__INIT;
  topos_opt_state *s = NULL;
  ck_assert_int_eq(wire_state_from_proto(NULL, NULL, &s, &err), TOPOS_OK);
  ck_assert_ptr_null(s);
  st.step = -1;
  ck_assert_int_eq(wire_state_from_proto(&st, NULL, &s, &err),
                   TOPOS_ERR_ARGUMENT);
  st.step = 3;
  topos_params *half = topos_params_new(
      1, (topos_tensor *[]){(topos_tensor *)topos_params_get(p, 0)}, NULL);
  ck_assert_int_eq(wire_tensors_from_params(p, &st.m, &st.n_m, NULL), TOPOS_OK);
  ck_assert_int_eq(wire_tensors_from_params(half, &st.v, &st.n_v, NULL),
                   TOPOS_OK);
  ck_assert_int_ne(wire_state_from_proto(&st, NULL, &s, &err), TOPOS_OK);
  ck_assert_ptr_null(s);
  ck_assert_ptr_nonnull(strstr(err.message, "state"));
  wire_message_clear(&st.base);
  topos_params_free(half);
  topos_params_free(p);
  topos_network_release(net);
}
END_TEST

START_TEST(test_status_mapping) {
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_OK), 0);
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_ERR_SHAPE), 3);
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_ERR_DTYPE), 3);
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_ERR_NOT_FOUND), 5);
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_ERR_MEMORY), 8);
  ck_assert_int_eq(wire_grpc_status_of(TOPOS_ERR_CORRUPT), 15);
  ck_assert_int_eq(wire_grpc_status_of(WIRE_GRPC_BASE + 14), 14);
  ck_assert_int_eq(wire_grpc_status_of(77), 13);
  for (int s = 0; s <= 16; s++) {
    int c = wire_topos_code_of(s);
    ck_assert_int_eq(wire_grpc_status_of(c), s);
  }
  ck_assert_int_eq(wire_topos_code_of(5), TOPOS_ERR_NOT_FOUND);
  ck_assert_int_eq(wire_topos_code_of(3), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(wire_topos_code_of(4), WIRE_GRPC_BASE + 4);
  ck_assert_str_eq(wire_grpc_status_name(4), "DEADLINE_EXCEEDED");
  ck_assert_str_eq(wire_grpc_status_name(99), "UNKNOWN_STATUS");
}
END_TEST

START_TEST(test_message_clear_unpacked) {
  /* Clearing a protobuf-c-unpacked message frees every part: run under
   * ASan/valgrind this checks that the walker and protobuf-c agree. */
  topos_network *net = sn_every_op();
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
  Topos__V1__Spec *u = (Topos__V1__Spec *)repack(&spec.base);
  Topos__V1__Spec copy = *u;
  free(u);
  wire_message_clear(&copy.base);
  ck_assert_uint_eq(copy.n_nodes, 0);
  ck_assert_ptr_null(copy.nodes);
  wire_message_clear(&spec.base);
  wire_message_clear(NULL);
  wire_message_free(NULL);
  Topos__V1__Value *v = wire_value_new_name("abc");
  Topos__V1__Value vc = *v;
  free(v);
  wire_message_clear(&vc.base);
  ck_assert_int_eq(vc.ref_case, TOPOS__V1__VALUE__REF__NOT_SET);
  topos_network_release(net);
}
END_TEST

START_TEST(test_spec_empty_refused) {
  /* An empty message parses as a spec with no nodes: refused by name. */
  Topos__V1__Spec *spec = topos__v1__spec__unpack(NULL, 0, (const uint8_t *)"");
  ck_assert_ptr_nonnull(spec);
  topos_error err = {0};
  ck_assert_ptr_null(wire_spec_to_network(spec, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "no nodes"));
  topos__v1__spec__free_unpacked(spec, NULL);
}
END_TEST

/* ------------------------------------------------------------ strings */

#define ZERO_ID \
  "0000000000000000000000000000000000000000000000000000000000000000"

/* Packs m and returns wire_check_strings' status on the bytes (message in
 * err). */
static int check_packed(const ProtobufCMessage *m, topos_error *err) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(wire_pack(m, &bytes, &len, NULL), TOPOS_OK);
  *err = (topos_error){0};
  int rc = wire_check_strings(m->descriptor, bytes, len, err);
  free(bytes);
  return rc;
}

static void expect_string_fault(const ProtobufCMessage *m, const char *expect) {
  topos_error err = {0};
  ck_assert_int_eq(check_packed(m, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_msg(strstr(err.message, expect) != NULL, "'%s' lacks '%s'",
                err.message, expect);
}

/* Replaces a node's name (NULL: none) with a heap copy. */
static void set_name(Topos__V1__Node *n, const char *name) {
  if (n->name && n->name != protobuf_c_empty_string) free(n->name);
  n->name = name ? strdup(name) : NULL;
}

START_TEST(test_check_strings_paths) {
  topos_error err = {0};
  /* Every sample network's spec passes, and so do valid multi-byte
   * names. */
  topos_network *net = sn_every_op();
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
  ck_assert_int_eq(check_packed(&spec.base, &err), TOPOS_OK);
  ck_assert_uint_ge(spec.n_nodes, 4);
  set_name(spec.nodes[3], "\xce\xbb_\xe6\x8d\x9f\xe5\xa4\xb1");
  ck_assert_int_eq(check_packed(&spec.base, &err), TOPOS_OK);
  /* A bad name: the path names the node, the offset the byte. */
  set_name(spec.nodes[3], "ab\xc0\x80");
  expect_string_fault(
      &spec.base,
      "Spec.nodes[3].name: not valid UTF-8 (an overlong encoding) at byte 2");
  set_name(spec.nodes[3], "\xed\xa0\x80");
  expect_string_fault(&spec.base,
                      "Spec.nodes[3].name: not valid UTF-8 (a "
                      "surrogate) at byte 0");
  set_name(spec.nodes[3], "x\xf4\x90\x80\x80");
  expect_string_fault(&spec.base, "above U+10FFFF) at byte 1");
  set_name(spec.nodes[3], "loss\xe6\x8d");
  expect_string_fault(&spec.base, "truncated sequence) at byte 4");
  set_name(spec.nodes[3], NULL);

  /* An embedded NUL cannot be packed from a C string: patch the bytes.
   * protobuf-c alone would unpack "loss\0x" as "loss". */
  set_name(spec.nodes[1], "lossQx");
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(wire_pack(&spec.base, &bytes, &len, NULL), TOPOS_OK);
  uint8_t *q = memmem(bytes, len, "lossQx", 6);
  ck_assert_ptr_nonnull(q);
  q[4] = 0;
  Topos__V1__Spec *u = topos__v1__spec__unpack(NULL, len, bytes);
  ck_assert_ptr_nonnull(u);
  ck_assert_str_eq(u->nodes[1]->name, "loss"); /* what unpacking makes of it */
  topos__v1__spec__free_unpacked(u, NULL);
  ck_assert_int_eq(
      wire_check_strings(&topos__v1__spec__descriptor, bytes, len, &err),
      TOPOS_ERR_ARGUMENT);
  ck_assert_str_eq(err.message, "Spec.nodes[1].name: contains NUL at byte 4");
  free(bytes);
  wire_message_clear(&spec.base);
  topos_network_release(net);

  /* Nested and repeated: a blob id inside the state's second moment list,
   * a feed's input name (a oneof), a candidate's backend, a root name, a
   * repeated string of a reply. */
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  Topos__V1__OptimizerState st = TOPOS__V1__OPTIMIZER_STATE__INIT;
  Topos__V1__Tensor *m[2] = {wire_tensor_new_ref(ZERO_ID, 0, NULL),
                             wire_tensor_new_ref(ZERO_ID, 1, NULL)};
  st.m = m;
  st.n_m = 2;
  sr.state = &st;
  ck_assert_int_eq(check_packed(&sr.base, &err), TOPOS_OK);
  free(m[1]->blob->id);
  m[1]->blob->id = strdup("id\xff");
  expect_string_fault(&sr.base,
                      "StepRequest.state.m[1].blob.id: not valid UTF-8 (byte "
                      "0xf8..0xff cannot start a character) at byte 2");
  sr.loss = wire_value_new_name("\x80");
  /* The first fault in wire order wins: loss (field 2) before state (6). */
  expect_string_fault(&sr.base,
                      "StepRequest.loss.name: not valid UTF-8 (a "
                      "stray continuation byte) at byte 0");
  wire_message_free(&sr.loss->base);
  wire_message_free(&m[0]->base);
  wire_message_free(&m[1]->base);

  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  Topos__V1__Feed f0 = TOPOS__V1__FEED__INIT, f1 = TOPOS__V1__FEED__INIT;
  Topos__V1__Value v0 = TOPOS__V1__VALUE__INIT, v1 = TOPOS__V1__VALUE__INIT;
  v0.ref_case = v1.ref_case = TOPOS__V1__VALUE__REF_NAME;
  v0.name = "x";
  v1.name = "y\xe2\x82";
  f0.input = &v0;
  f1.input = &v1;
  Topos__V1__Feed *feeds[2] = {&f0, &f1};
  fr.feeds = feeds;
  fr.n_feeds = 2;
  expect_string_fault(&fr.base,
                      "ForwardRequest.feeds[1].input.name: not "
                      "valid UTF-8 (a truncated sequence) at byte 1");
  v1.name = "y";
  Topos__V1__Entry entry = TOPOS__V1__ENTRY__INIT;
  Topos__V1__Value r0 = TOPOS__V1__VALUE__INIT, r1 = TOPOS__V1__VALUE__INIT;
  r0.ref_case = TOPOS__V1__VALUE__REF_INDEX;
  r1.ref_case = TOPOS__V1__VALUE__REF_NAME;
  r1.name = "\xce";
  Topos__V1__Value *roots[2] = {&r0, &r1};
  entry.roots = roots;
  entry.n_roots = 2;
  fr.entry = &entry;
  expect_string_fault(&fr.base, "ForwardRequest.entry.roots[1].name");
  r1.name = "ok";
  entry.backend = "cpu\xc0";
  expect_string_fault(&fr.base, "ForwardRequest.entry.backend: not valid");
  entry.backend = "cpu";
  ck_assert_int_eq(check_packed(&fr.base, &err), TOPOS_OK);

  Topos__V1__ConformanceRequest cr = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  Topos__V1__ExecOptions e[3] = {TOPOS__V1__EXEC_OPTIONS__INIT,
                                 TOPOS__V1__EXEC_OPTIONS__INIT,
                                 TOPOS__V1__EXEC_OPTIONS__INIT};
  e[0].backend = "reference";
  e[2].backend = "bl\xed\xbf\xbf";
  Topos__V1__ExecOptions *ce[3] = {&e[0], &e[1], &e[2]};
  cr.candidates = ce;
  cr.n_candidates = 3;
  expect_string_fault(&cr.base, "ConformanceRequest.candidates[2].backend");

  Topos__V1__ForwardReply rep = TOPOS__V1__FORWARD_REPLY__INIT;
  char *names[3] = {"cpu", "\xc3\xa9", "r\xf5"};
  rep.backends = names;
  rep.n_backends = 3;
  expect_string_fault(&rep.base,
                      "ForwardReply.backends[2]: not valid UTF-8 "
                      "(above U+10FFFF) at byte 1");
}
END_TEST

/* A descriptor that contains itself, to reach the depth cap (the schema
 * nests only four deep). */
static const ProtobufCMessageDescriptor loop_desc;
static const ProtobufCFieldDescriptor loop_fields[2] = {
    {.name = "child",
     .id = 1,
     .label = PROTOBUF_C_LABEL_NONE,
     .type = PROTOBUF_C_TYPE_MESSAGE,
     .descriptor = &loop_desc},
    {.name = "s",
     .id = 2,
     .label = PROTOBUF_C_LABEL_NONE,
     .type = PROTOBUF_C_TYPE_STRING},
};
static const ProtobufCMessageDescriptor loop_desc = {
    .magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    .name = "test.Loop",
    .short_name = "Loop",
    .n_fields = 2,
    .fields = loop_fields,
};

/* `depth` Loop messages nested in field 1, the innermost holding string s
 * in field 2.  Returns the length written into buf. */
static size_t nested_loops(uint8_t *buf, size_t cap, int depth, const char *s) {
  size_t n = strlen(s);
  ck_assert_uint_lt(n + 2, cap);
  /* Built from the inside out at the end of buf. */
  size_t at = cap - n;
  memcpy(buf + at, s, n);
  buf[--at] = (uint8_t)n;
  buf[--at] = 0x12; /* field 2, length-prefixed */
  for (int d = 0; d < depth; d++) {
    size_t body = cap - at;
    uint8_t len[10];
    size_t k = 0;
    for (size_t v = body; k == 0 || v; v >>= 7)
      len[k++] = (uint8_t)((v & 0x7F) | (v >> 7 ? 0x80 : 0));
    ck_assert_uint_ge(at, k + 1);
    at -= k;
    memcpy(buf + at, len, k);
    buf[--at] = 0x0A; /* field 1, length-prefixed */
  }
  memmove(buf, buf + at, cap - at);
  return cap - at;
}

START_TEST(test_check_strings_depth_and_malformed) {
  uint8_t buf[4096];
  topos_error err = {0};
  size_t n = nested_loops(buf, sizeof buf, WIRE_STRING_DEPTH, "fine");
  ck_assert_int_eq(wire_check_strings(&loop_desc, buf, n, &err), TOPOS_OK);
  n = nested_loops(buf, sizeof buf, 3, "b\xc0\xaf");
  ck_assert_int_eq(wire_check_strings(&loop_desc, buf, n, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_str_eq(err.message,
                   "Loop.child.child.child.s: not valid UTF-8 (an overlong "
                   "encoding) at byte 1");
  n = nested_loops(buf, sizeof buf, WIRE_STRING_DEPTH + 1, "fine");
  ck_assert_int_eq(wire_check_strings(&loop_desc, buf, n, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "nested deeper than 32"));
  n = nested_loops(buf, sizeof buf, 300, "fine");
  ck_assert_int_eq(wire_check_strings(&loop_desc, buf, n, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Malformed bytes: each named, none read past the end. */
  struct {
    const char *bytes;
    size_t len;
    const char *expect;
  } bad[] = {
      {"\x12\x05"
       "ab",
       4, "Loop: malformed at byte 0 (a truncated length)"},
      {"\x0a\x03\x12\x05x", 5, "Loop.child: malformed at byte 2"},
      {"\x18", 1, "malformed at byte 0 (a varint cut short"},
      {"\x18\xff\xff", 3, "a varint cut short"},
      {"\x19\x01\x02", 3, "a truncated fixed-width value"},
      {"\x1d\x01", 2, "a truncated fixed-width value"},
      {"\x1b", 1, "groups"},
      {"\x1e", 1, "wire types 6, 7"},
      {"\x00", 1, "field number 0"},
      {"\x80", 1, "(a tag cut short)"},
      {"\x10\x01", 2, "not length-prefixed"}, /* a string as a varint */
      {"\x0b", 1, "not length-prefixed"},     /* a message as a group */
      {"\x18\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02", 11, "past 64 bits"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    /* A heap copy of exactly len bytes, so ASan sees any overread. */
    uint8_t *b = malloc(bad[i].len);
    memcpy(b, bad[i].bytes, bad[i].len);
    err = (topos_error){0};
    ck_assert_int_eq(wire_check_strings(&loop_desc, b, bad[i].len, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(err.message, bad[i].expect) != NULL,
                  "%zu: '%s' lacks '%s'", i, err.message, bad[i].expect);
    free(b);
  }
  /* Unknown fields of every wire type are skipped. */
  const uint8_t unknown[] = {0x18, 0x05, 0x21, 1,    2,    3,    4, 5, 6, 7,
                             8,    0x2a, 0x02, 0xff, 0xff, 0x35, 1, 2, 3, 4};
  ck_assert_int_eq(
      wire_check_strings(&loop_desc, unknown, sizeof unknown, &err), TOPOS_OK);
  ck_assert_int_eq(wire_check_strings(&loop_desc, NULL, 0, &err), TOPOS_OK);
  ck_assert_int_eq(wire_check_strings(NULL, unknown, 1, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Random bytes and every truncation of a real request: any answer, no
   * crash, no overread (run under ASan). */
  topos_network *net = sn_mlp();
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(wire_pack(&spec.base, &bytes, &len, NULL), TOPOS_OK);
  for (size_t cut = 0; cut <= len; cut++) {
    uint8_t *b = malloc(cut ? cut : 1);
    memcpy(b, bytes, cut);
    int rc = wire_check_strings(&topos__v1__spec__descriptor, b, cut, &err);
    ck_assert(rc == TOPOS_OK || rc == TOPOS_ERR_ARGUMENT);
    free(b);
  }
  uint64_t seed = 0x9e3779b97f4a7c15u;
  for (int trial = 0; trial < 20000; trial++) {
    seed = seed * 6364136223846793005u + 1442695040888963407u;
    size_t cut = (size_t)(seed >> 33) % 96;
    uint8_t *b = malloc(cut ? cut : 1);
    for (size_t i = 0; i < cut; i++) {
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      b[i] = (uint8_t)(seed >> 56);
    }
    /* Half of them start from real bytes, so deep fields are reached. */
    if (trial % 2 && cut <= len) memcpy(b, bytes, cut / 2);
    int rc =
        wire_check_strings(&topos__v1__step_request__descriptor, b, cut, &err);
    ck_assert(rc == TOPOS_OK || rc == TOPOS_ERR_ARGUMENT);
    rc = wire_check_strings(&topos__v1__spec__descriptor, b, cut, &err);
    ck_assert(rc == TOPOS_OK || rc == TOPOS_ERR_ARGUMENT);
    free(b);
  }
  free(bytes);
  wire_message_clear(&spec.base);
  topos_network_release(net);
}
END_TEST

/* --------------------------------------------------- optimizer settings */

static Topos__V1__Optimizer opt_msg(int kind, double lr) {
  Topos__V1__Optimizer m = TOPOS__V1__OPTIMIZER__INIT;
  m.kind = (Topos__V1__OptimizerKind)kind;
  m.lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  m.lr = lr;
  return m;
}

/* from_proto on m after a pack/unpack, expecting failure naming `expect`. */
static void expect_opt_fault(const Topos__V1__Optimizer *m, int nslots,
                             const char *expect) {
  Topos__V1__Optimizer *u = (Topos__V1__Optimizer *)repack(&m->base);
  wire_optimizer wo;
  topos_error err = {0};
  ck_assert_int_eq(wire_optimizer_from_proto(u, nslots, &wo, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_msg(strstr(err.message, expect) != NULL, "'%s' lacks '%s'",
                err.message, expect);
  ck_assert_ptr_null(wo.slots);
  wire_message_free(&u->base);
}

START_TEST(test_optimizer_defaults) {
  /* Only lr given: every other number takes its documented default,
   * after a real pack/unpack. */
  wire_optimizer wo;
  topos_error err = {0};
  Topos__V1__Optimizer m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAM, 1e-3);
  Topos__V1__Optimizer *u = (Topos__V1__Optimizer *)repack(&m.base);
  ck_assert_int_eq(wire_optimizer_from_proto(u, 4, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.kind == TOPOS_ADAM && wo.opt.lr == 1e-3);
  ck_assert(wo.opt.beta1 == 0.9 && wo.opt.beta2 == 0.999);
  ck_assert(wo.opt.eps == 1e-8 && wo.opt.weight_decay == 0);
  ck_assert(wo.opt.momentum == 0 && wo.opt.decay == NULL);
  ck_assert_int_eq(topos_optimizer_check(&wo.opt, NULL, NULL, &err),
                   TOPOS_ERR_ARGUMENT); /* NULL params, but opt passed */
  ck_assert_ptr_null(strstr(err.message, "beta"));
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);

  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAMW, 1e-3);
  u = (Topos__V1__Optimizer *)repack(&m.base);
  ck_assert_int_eq(wire_optimizer_from_proto(u, 4, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.kind == TOPOS_ADAMW && wo.opt.weight_decay == 0.01);
  ck_assert(wo.opt.beta1 == 0.9 && wo.opt.beta2 == 0.999 && wo.opt.eps == 1e-8);
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);

  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__SGD, 0.5);
  u = (Topos__V1__Optimizer *)repack(&m.base);
  ck_assert_int_eq(wire_optimizer_from_proto(u, 4, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.kind == TOPOS_SGD && wo.opt.lr == 0.5);
  ck_assert(wo.opt.momentum == 0 && wo.opt.weight_decay == 0);
  ck_assert(wo.opt.beta1 == 0 && wo.opt.beta2 == 0 && wo.opt.eps == 0);
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);

  /* Given values win over the defaults, zeros included: a given 0 is
   * packed (presence), unlike a plain proto3 double. */
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAMW, 0);
  m.beta1_given_case = TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
  m.beta1 = 0;
  m.weight_decay_given_case =
      TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
  m.weight_decay = 0;
  m.eps_given_case = TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
  m.eps = 1e-6;
  u = (Topos__V1__Optimizer *)repack(&m.base);
  ck_assert_int_eq(u->lr_given_case, TOPOS__V1__OPTIMIZER__LR_GIVEN_LR);
  ck_assert_int_eq(wire_optimizer_from_proto(u, 4, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.lr == 0 && wo.opt.beta1 == 0 && wo.opt.weight_decay == 0);
  ck_assert(wo.opt.beta2 == 0.999 && wo.opt.eps == 1e-6);
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);

  /* Bytes from a sender that knows the fields as plain doubles (the
   * schema before presence): the same wire format, read as given. */
  const uint8_t plain[] = {0x08, 0x01, /* ADAM */
                           0x11, 0x7b, 0x14, 0xae, 0x47, 0xe1,
                           0x7a, 0x84, 0x3f, 0x21, 0x9a, 0x99,
                           0x99, 0x99, 0x99, 0x99, 0xe9, 0x3f};
  u = topos__v1__optimizer__unpack(NULL, sizeof plain, plain);
  ck_assert_ptr_nonnull(u);
  ck_assert_int_eq(wire_optimizer_from_proto(u, -1, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.lr == 0.01 && wo.opt.beta1 == 0.8);
  ck_assert(wo.opt.beta2 == 0.999); /* not sent: the default */
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);

  /* to_proto sends what the kind reads, given, and round-trips it. */
  topos_optimizer adam = topos_adam(1e-3, 0.0, 0.5, 1e-7);
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  ck_assert_int_eq(wire_optimizer_to_proto(&adam, NULL, &om, &err), TOPOS_OK);
  ck_assert_int_eq(om.beta1_given_case,
                   TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1);
  ck_assert_int_eq(om.momentum_given_case,
                   TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN__NOT_SET);
  u = (Topos__V1__Optimizer *)repack(&om.base);
  ck_assert_int_eq(wire_optimizer_from_proto(u, -1, &wo, &err), TOPOS_OK);
  ck_assert(wo.opt.beta1 == 0.0 && wo.opt.beta2 == 0.5 && wo.opt.eps == 1e-7);
  wire_optimizer_clear(&wo);
  wire_message_free(&u->base);
  wire_message_clear(&om.base);
  topos_optimizer sgd = topos_sgd(0.1, 0.5);
  ck_assert_int_eq(wire_optimizer_to_proto(&sgd, NULL, &om, &err), TOPOS_OK);
  ck_assert_int_eq(om.beta1_given_case,
                   TOPOS__V1__OPTIMIZER__BETA1_GIVEN__NOT_SET);
  ck_assert_int_eq(om.eps_given_case, TOPOS__V1__OPTIMIZER__EPS_GIVEN__NOT_SET);
  wire_message_clear(&om.base);
  /* A number the kind does not read goes out, to be refused. */
  sgd.eps = 1e-8;
  ck_assert_int_eq(wire_optimizer_to_proto(&sgd, NULL, &om, &err), TOPOS_OK);
  expect_opt_fault(&om, -1, "optimizer.eps is given, but SGD does not read");
  wire_message_clear(&om.base);
}
END_TEST

START_TEST(test_optimizer_refusals) {
  /* No lr. */
  Topos__V1__Optimizer m = TOPOS__V1__OPTIMIZER__INIT;
  m.kind = TOPOS__V1__OPTIMIZER_KIND__ADAM;
  expect_opt_fault(&m, -1, "optimizer.lr is missing");
  /* Numbers the kind does not read, even given as 0. */
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__SGD, 0.1);
  m.beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  expect_opt_fault(&m, -1, "optimizer.beta2 is given, but SGD does not read");
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAM, 0.1);
  m.momentum_given_case = TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
  m.momentum = 0.9;
  expect_opt_fault(&m, -1,
                   "optimizer.momentum is given, but ADAM does not read it");
  /* Decay rules are AdamW's. */
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAM, 0.1);
  m.decay = TOPOS__V1__DECAY_RULE__ALL_SLOTS;
  expect_opt_fault(&m, -1, "optimizer.decay is given, but ADAM does not");
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__SGD, 0.1);
  int32_t one[1] = {0};
  m.decay_slots = one;
  m.n_decay_slots = 1;
  expect_opt_fault(&m, -1, "optimizer.decay_slots is given, but SGD");
  m.kind = TOPOS__V1__OPTIMIZER_KIND__ADAMW;
  m.decay = TOPOS__V1__DECAY_RULE__ALL_SLOTS;
  expect_opt_fault(&m, -1, "decay_slots given without the LISTED_SLOTS rule");
  /* Listed slots: inside the spec's slots, none twice. */
  m.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  int32_t out[3] = {0, 3, 4};
  m.decay_slots = out;
  m.n_decay_slots = 3;
  expect_opt_fault(&m, 4,
                   "optimizer.decay_slots[2] = 4 is not a parameter slot (the "
                   "spec has 4: 0..3)");
  int32_t twice[3] = {2, 0, 2};
  m.decay_slots = twice;
  expect_opt_fault(&m, 4,
                   "optimizer.decay_slots[2] = 2 repeats decay_slots[0]");
  int32_t neg[1] = {-1};
  m.decay_slots = neg;
  m.n_decay_slots = 1;
  expect_opt_fault(&m, 4, "decay_slots[0] = -1 is negative");
  /* Unknown enum values. */
  m = opt_msg(7, 0.1);
  expect_opt_fault(&m, -1, "unknown kind 7");
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAMW, 0.1);
  m.decay = (Topos__V1__DecayRule)5;
  expect_opt_fault(&m, -1, "unknown decay rule 5");
  /* A valid listed set converts, and decays exactly those slots. */
  int32_t fine[2] = {3, 1};
  m.decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
  m.decay_slots = fine;
  m.n_decay_slots = 2;
  wire_optimizer wo;
  ck_assert_int_eq(wire_optimizer_from_proto(&m, 4, &wo, NULL), TOPOS_OK);
  for (int s = 0; s < 4; s++)
    ck_assert(wo.opt.decay(s, NULL, wo.opt.decay_ctx) == (s == 1 || s == 3));
  wire_optimizer_clear(&wo);
  /* Out-of-range numbers pass the conversion and the engine refuses them
   * (one rule for local and remote callers). */
  m = opt_msg(TOPOS__V1__OPTIMIZER_KIND__ADAM, 0.1);
  m.beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  m.beta2 = 1.0;
  ck_assert_int_eq(wire_optimizer_from_proto(&m, 4, &wo, NULL), TOPOS_OK);
  topos_params *p = topos_params_new(0, NULL, NULL);
  topos_error err = {0};
  ck_assert_int_eq(topos_optimizer_check(&wo.opt, p, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "beta2 1 is not in [0,1)"));
  wire_optimizer_clear(&wo);
  topos_params_free(p);
}
END_TEST

Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *t = tcase_create("tensors");
  tcase_add_test(t, test_tensor_roundtrip_every_dtype);
  tcase_add_test(t, test_tensor_little_endian_bytes);
  tcase_add_test(t, test_tensor_hostile);
  tcase_add_test(t, test_tensor_blob_refs);
  suite_add_tcase(s, t);
  TCase *sp = tcase_create("specs");
  tcase_add_test(sp, test_spec_roundtrip_samples);
  tcase_add_test(sp, test_spec_splat);
  tcase_add_test(sp, test_spec_only_read_attributes);
  tcase_add_test(sp, test_spec_hostile);
  tcase_add_test(sp, test_spec_random_bytes);
  tcase_add_test(sp, test_spec_empty_refused);
  suite_add_tcase(s, sp);
  TCase *v = tcase_create("requests");
  tcase_add_test(v, test_values_and_entries);
  tcase_add_test(v, test_entry_threads);
  tcase_add_test(v, test_feeds);
  tcase_add_test(v, test_optimizers);
  tcase_add_test(v, test_status_mapping);
  tcase_add_test(v, test_message_clear_unpacked);
  tcase_add_test(v, test_optimizer_defaults);
  tcase_add_test(v, test_optimizer_refusals);
  suite_add_tcase(s, v);
  TCase *st = tcase_create("strings");
  tcase_add_test(st, test_check_strings_paths);
  tcase_add_test(st, test_check_strings_depth_and_malformed);
  suite_add_tcase(s, st);
  return s;
}
