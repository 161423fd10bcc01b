/*
 * test_encode.c - the canonical encoding and the id (engine/encode.c):
 * round trips of real networks (bytes, values, names, slots), ids that
 * are equal for equal specs and change with any change, the SHA-256 test
 * vectors, and hostile bytes: every truncation, seeded random byte flips
 * and hand-made inputs, each of which must give a clear error and never
 * crash or over-allocate (run it under ASan and valgrind).
 *
 * The hand-made inputs are written byte by byte from docs/encoding.md, so
 * this file is also a check of that document.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "sample_nets.h"
#include "testutil.h"

/* --------------------------------------------------------------- helpers */

/* The encoding of net (new; free with topos_free). */
static uint8_t *encode(const topos_network *net, size_t *len) {
  topos_error err = {0};
  uint8_t *bytes = NULL;
  int rc = topos_network_encode(net, &bytes, len, &err);
  ck_assert_msg(rc == TOPOS_OK, "encode: %s", err.message);
  ck_assert_ptr_nonnull(bytes);
  return bytes;
}

static topos_network *sample(int i) {
  topos_network *net = sn_samples[i].build();
  ck_assert_msg(net != NULL, "sample %s did not record", sn_samples[i].name);
  return net;
}

static void id_of(const topos_network *net, char id[65]) {
  topos_error err = {0};
  ck_assert_msg(topos_network_id(net, id, &err) == TOPOS_OK, "id: %s",
                err.message);
}

/* Decodes a private copy of exactly len bytes, so that ASan and valgrind
 * see any read past the end. */
static topos_network *decode_copy(const uint8_t *bytes, size_t len,
                                  topos_error *err) {
  uint8_t *copy = malloc(len ? len : 1);
  ck_assert_ptr_nonnull(copy);
  if (len) memcpy(copy, bytes, len);
  topos_network *net = topos_network_decode(copy, len, err);
  free(copy);
  return net;
}

/* Decoding must fail with this code and a message containing `part`. */
static void expect_decode_error(const uint8_t *bytes, size_t len, int code,
                                const char *part) {
  topos_error err = {0};
  topos_network *net = decode_copy(bytes, len, &err);
  ck_assert_msg(net == NULL, "decoded bytes that should fail (%s)", part);
  ck_assert_msg(err.code == code, "code %d (%s), want %d: %s", err.code,
                topos_status_name(err.code), code, err.message);
  ck_assert_msg(strncmp(err.message, "decode: ", 8) == 0,
                "message lacks the decode prefix: %s", err.message);
  ck_assert_msg(strstr(err.message, part) != NULL, "'%s' not in: %s", part,
                err.message);
}

/* Every node of a and b evaluates to the same bits under the defaults. */
static void expect_same_values(const topos_network *a, const topos_network *b) {
  topos_error err = {0};
  topos_run *ra = topos_forward(a, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(ra != NULL, "forward: %s", err.message);
  topos_run *rb = topos_forward(b, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(rb != NULL, "forward of the decoded network: %s", err.message);
  for (int i = 0; i < a->n; i++) {
    const topos_tensor *ta = topos_run_of(ra, (topos_value){a->id, i}, &err);
    const topos_tensor *tb = topos_run_of(rb, (topos_value){b->id, i}, &err);
    ck_assert_ptr_nonnull(ta);
    ck_assert_ptr_nonnull(tb);
    ck_assert_msg(topos_tensor_bitwise_equal(ta, tb),
                  "node %d evaluates differently after decoding", i);
  }
  topos_run_free(ra);
  topos_run_free(rb);
}

/* Hand-made bytes, little-endian, as docs/encoding.md lays them out. */
typedef struct bytes_out {
  uint8_t b[8192];
  size_t n;
} bytes_out;

static void b8(bytes_out *o, unsigned v) {
  ck_assert(o->n < sizeof o->b);
  o->b[o->n++] = (uint8_t)v;
}
static void b16(bytes_out *o, unsigned v) {
  b8(o, v & 0xFF);
  b8(o, v >> 8);
}
static void b32(bytes_out *o, uint32_t v) {
  for (int i = 0; i < 4; i++) b8(o, (v >> (8 * i)) & 0xFF);
}
static void b64(bytes_out *o, uint64_t v) {
  for (int i = 0; i < 8; i++) b8(o, (unsigned)(v >> (8 * i)) & 0xFF);
}
static void bf32(bytes_out *o, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  b32(o, u);
}

/* The format version hand-made inputs carry (2; a test of version 1's
 * inputs sets 1 for its own). */
static unsigned b_version = 2;

static void b_header(bytes_out *o, unsigned dtype, uint32_t count) {
  o->n = 0;
  b8(o, 'T');
  b8(o, 'P');
  b8(o, 'O');
  b8(o, 'S');
  b16(o, b_version);
  b8(o, dtype);
  b32(o, count);
}

/* op, dtype, rank + shape, operand count + operands. */
static void b_node(bytes_out *o, unsigned op, unsigned dtype, int rank,
                   const int64_t *shape, int nin, const uint32_t *in) {
  b8(o, op);
  b8(o, dtype);
  b8(o, (unsigned)rank);
  for (int i = 0; i < rank; i++) b64(o, (uint64_t)shape[i]);
  b32(o, (uint32_t)nin);
  for (int i = 0; i < nin; i++) b32(o, in[i]);
}

/* A complete f32[2] constant node {1, 2} without a name. */
static void b_constant2(bytes_out *o) {
  b_node(o, OP_CONSTANT, TOPOS_F32, 1, SN_S(2), 0, NULL);
  b8(o, TOPOS_F32);
  b8(o, 1);
  b64(o, 2);
  if (b_version >= 2) b8(o, 0); /* its elements follow */
  bf32(o, 1.0f);
  bf32(o, 2.0f);
  b8(o, 0); /* no name */
}

/* The valid two-node network every hostile input below is a variation of:
 * c = constant f32[2]; add(c, c) named "sum". */
static void b_valid(bytes_out *o) {
  b_header(o, TOPOS_F32, 2);
  b_constant2(o);
  b_node(o, OP_ADD, TOPOS_F32, 1, SN_S(2), 2, (const uint32_t[]){0, 0});
  b8(o, 3);
  b8(o, 's');
  b8(o, 'u');
  b8(o, 'm');
}

/* ------------------------------------------------------------ round trips */

START_TEST(round_trip_samples) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sample(s);
    size_t len, len2;
    uint8_t *bytes = encode(net, &len);
    topos_error err = {0};
    topos_network *back = decode_copy(bytes, len, &err);
    ck_assert_msg(back != NULL, "%s: decode: %s", sn_samples[s].name,
                  err.message);
    uint8_t *again = encode(back, &len2);
    ck_assert_msg(len == len2 && memcmp(bytes, again, len) == 0,
                  "%s: re-encoding differs (%zu vs %zu bytes)",
                  sn_samples[s].name, len, len2);

    ck_assert_int_eq(topos_network_node_count(back), net->n);
    ck_assert_int_eq(topos_network_parameter_count(back), net->nparams);
    ck_assert_int_eq(topos_network_input_count(back), net->ninputs);
    ck_assert_int_eq(back->dtype, net->dtype);
    for (int i = 0; i < net->n; i++) {
      const char *na = net->nodes[i].name, *nb = back->nodes[i].name;
      ck_assert_msg((na == NULL) == (nb == NULL) && (!na || !strcmp(na, nb)),
                    "%s: node %d name '%s' vs '%s'", sn_samples[s].name, i,
                    na ? na : "(none)", nb ? nb : "(none)");
      if (na) ck_assert_int_eq(topos_network_find(back, na).index, i);
    }
    for (int k = 0; k < net->nparams; k++)
      ck_assert_int_eq(topos_network_parameter(back, k).index,
                       topos_network_parameter(net, k).index);
    for (int k = 0; k < net->ninputs; k++)
      ck_assert_int_eq(topos_network_input(back, k).index,
                       topos_network_input(net, k).index);

    char *da = topos_network_describe(net, TOPOS_FORMAT_TEXT, &err);
    char *db = topos_network_describe(back, TOPOS_FORMAT_TEXT, &err);
    ck_assert_ptr_nonnull(da);
    ck_assert_ptr_nonnull(db);
    ck_assert_str_eq(da, db);
    topos_free(da);
    topos_free(db);

    expect_same_values(net, back);
    char ia[65], ib[65];
    id_of(net, ia);
    id_of(back, ib);
    ck_assert_str_eq(ia, ib);

    topos_free(bytes);
    topos_free(again);
    topos_network_release(back);
    topos_network_release(net);
  }
}
END_TEST

/* Only logical content is encoded: a transposed or broadcast view as a
 * constant gives the same bytes as a contiguous tensor of its values. */
START_TEST(views_encode_as_their_values) {
  topos_error err = {0};
  topos_tensor *base = sn_tensor(TOPOS_F64, 2, SN_S(3, 2), 7, -1, 1);
  topos_tensor *view = topos_tensor_transpose(base, &err);
  ck_assert_ptr_nonnull(view);
  ck_assert(!topos_tensor_is_contiguous(view));
  topos_tensor *copy = topos_tensor_contiguous(view, &err);
  ck_assert_ptr_nonnull(copy);
  topos_tensor *one = topos_tensor_scalar(TOPOS_F64, 0.5, &err);
  topos_tensor *wide = topos_tensor_broadcast(one, 2, SN_S(2, 3), &err);
  ck_assert_ptr_nonnull(wide);
  topos_tensor *wide_copy =
      topos_tensor_filled(TOPOS_F64, 2, SN_S(2, 3), 0.5, &err);

  uint8_t *bytes[2];
  size_t len[2];
  for (int v = 0; v < 2; v++) {
    topos_tape *t = topos_tape_new(TOPOS_F64);
    topos_value a = topos_constant(t, v ? copy : view);
    topos_value b = topos_parameter(t, v ? wide_copy : wide);
    topos_add(t, a, b);
    topos_network *net = topos_tape_seal(t, &err);
    ck_assert_msg(net != NULL, "%s", err.message);
    bytes[v] = encode(net, &len[v]);
    topos_network_release(net);
  }
  ck_assert(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0);
  topos_free(bytes[0]);
  topos_free(bytes[1]);
  topos_tensor_release(base);
  topos_tensor_release(view);
  topos_tensor_release(copy);
  topos_tensor_release(one);
  topos_tensor_release(wide);
  topos_tensor_release(wide_copy);
}
END_TEST

/* A network without nodes is a valid spec and survives the trip. */
START_TEST(empty_network) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(topos_tape_new(TOPOS_BF16), &err);
  ck_assert_ptr_nonnull(net);
  size_t len;
  uint8_t *bytes = encode(net, &len);
  ck_assert_uint_eq(len, 11);
  topos_network *back = decode_copy(bytes, len, &err);
  ck_assert_msg(back != NULL, "%s", err.message);
  ck_assert_int_eq(topos_network_node_count(back), 0);
  ck_assert_int_eq(back->dtype, TOPOS_BF16);
  topos_network_release(back);
  topos_network_release(net);
  topos_free(bytes);
}
END_TEST

/* The layout of docs/encoding.md, pinned: the seed example's bytes.  A
 * change here is a format change and needs a new format version. */
START_TEST(layout_is_pinned) {
  topos_network *net = sn_gradient_descent();
  size_t len;
  uint8_t *bytes = encode(net, &len);
  static const uint8_t header[11] = {'T', 'P', 'O', 'S', 2, 0, 1, 6, 0, 0, 0};
  ck_assert_uint_ge(len, sizeof header);
  ck_assert(memcmp(bytes, header, sizeof header) == 0);
  /* Node 0: parameter (1), f64 (1), rank 0, no operands, slot 0, tensor
   * f64 rank 0, form 0 (elements) with 8 zero bytes, name "w". */
  static const uint8_t node0[] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'w'};
  ck_assert(memcmp(bytes + 11, node0, sizeof node0) == 0);
  /* Its hand-made twin: the same bytes from the document alone. */
  bytes_out o;
  b_header(&o, TOPOS_F64, 6);
  for (int k = 0; k < 3; k++) {
    b_node(&o, k ? OP_INPUT : OP_PARAMETER, TOPOS_F64, 0, NULL, 0, NULL);
    b32(&o, k ? (uint32_t)k - 1 : 0);
    b8(&o, TOPOS_F64);
    b8(&o, 0);
    b8(&o, 0); /* form: elements */
    b64(&o, 0);
    b8(&o, 1);
    b8(&o, "wxy"[k]);
  }
  b_node(&o, OP_MUL, TOPOS_F64, 0, NULL, 2, (const uint32_t[]){0, 1});
  b8(&o, 0);
  b_node(&o, OP_SUB, TOPOS_F64, 0, NULL, 2, (const uint32_t[]){3, 2});
  b8(&o, 0);
  b_node(&o, OP_MUL, TOPOS_F64, 0, NULL, 2, (const uint32_t[]){4, 4});
  b8(&o, 4);
  for (int k = 0; k < 4; k++) b8(&o, (unsigned)"loss"[k]);
  ck_assert_uint_eq(o.n, len);
  ck_assert(memcmp(o.b, bytes, len) == 0);
  char id[65];
  id_of(net, id);
  char expect[65];
  topos_sha256_hex(o.b, o.n, expect);
  ck_assert_str_eq(id, expect);
  topos_free(bytes);
  topos_network_release(net);
}
END_TEST

/* The op codes are part of the format: frozen, appended to only. */
START_TEST(op_codes_are_frozen) {
  static const char *const names[] = {
      "constant",    "parameter", "input",
      "add",         "sub",       "mul",
      "div",         "neg",       "exp",
      "log",         "sqrt",      "tanh",
      "pow",         "maximum",   "step",
      "relu",        "matmul",    "transpose",
      "permute",     "reshape",   "narrow",
      "pad",         "unfold",    "fold",
      "concat",      "broadcast", "broadcast_along",
      "sum",         "sum_along", "max_along",
      "log_softmax", "logsumexp", "gather",
      "scatter",     "erf"};
  int n = (int)(sizeof names / sizeof names[0]);
  ck_assert_int_ge(OP_COUNT, n);
  ck_assert_int_lt(OP_COUNT, 256); /* the op is one byte */
  for (int i = 0; i < n; i++)
    ck_assert_msg(strcmp(op_table[i].name, names[i]) == 0,
                  "op code %d is %s, the format says %s", i, op_table[i].name,
                  names[i]);
  ck_assert_int_eq(TOPOS_F32, 0);
  ck_assert_int_eq(TOPOS_F64, 1);
  ck_assert_int_eq(TOPOS_BF16, 2);
  ck_assert_int_eq(TOPOS_I32, 3);
}
END_TEST

START_TEST(encode_arguments) {
  topos_error err = {0};
  uint8_t *bytes = (uint8_t *)1;
  size_t len = 99;
  ck_assert_int_eq(topos_network_encode(NULL, &bytes, &len, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(bytes);
  ck_assert_uint_eq(len, 0);
  topos_network *net = sn_gradient_descent();
  ck_assert_int_eq(topos_network_encode(net, NULL, &len, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(topos_network_encode(net, &bytes, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  char id[65] = "x";
  ck_assert_int_eq(topos_network_id(NULL, id, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_str_eq(id, "");
  ck_assert_int_eq(topos_network_id(net, NULL, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "id"));
  topos_network_release(net);
}
END_TEST

/* -------------------------------------------------------------------- ids */

START_TEST(sha256_vectors) {
  char out[65];
  topos_sha256_hex("abc", 3, out);
  ck_assert_str_eq(
      out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  topos_sha256_hex("", 0, out);
  ck_assert_str_eq(
      out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  topos_sha256_hex(NULL, 0, out);
  ck_assert_str_eq(
      out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  topos_sha256_hex(two, strlen(two), out);
  ck_assert_str_eq(
      out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
END_TEST

START_TEST(equal_specs_equal_ids) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *a = sample(s), *b = sample(s);
    char ia[65], ib[65];
    id_of(a, ia);
    id_of(b, ib);
    ck_assert_msg(strcmp(ia, ib) == 0, "%s: ids differ", sn_samples[s].name);
    ck_assert_uint_eq(strlen(ia), 64);
    for (int i = 0; i < 64; i++)
      ck_assert_msg(
          (ia[i] >= '0' && ia[i] <= '9') || (ia[i] >= 'a' && ia[i] <= 'f'),
          "not lowercase hex: %s", ia);
    /* The id is the SHA-256 of the encoding. */
    size_t len;
    uint8_t *bytes = encode(a, &len);
    char hash[65];
    topos_sha256_hex(bytes, len, hash);
    ck_assert_str_eq(ia, hash);
    topos_free(bytes);
    topos_network_release(a);
    topos_network_release(b);
  }
}
END_TEST

enum {
  V_BASE,
  V_ATTRIBUTE,   /* narrow starts at 1, not 0 */
  V_DATA_BIT,    /* the lowest bit of one constant element flipped */
  V_NAME,        /* "out" is "Out" */
  V_PARAM_ORDER, /* the two parameters recorded in the other order */
  V_TAPE_DTYPE,  /* an f64 tape (every node still f32) */
  V_COUNT
};

static topos_network *variant(int v) {
  topos_error err = {0};
  topos_tensor *p1 = sn_tensor(TOPOS_F32, 2, SN_S(2, 3), 31, -1, 1);
  topos_tensor *p2 = sn_tensor(TOPOS_F32, 2, SN_S(2, 3), 32, -1, 1);
  float cdata[6] = {1, 2, 3, 4, 5, 6};
  if (v == V_DATA_BIT) {
    uint32_t u;
    memcpy(&u, &cdata[4], 4);
    u ^= 1;
    memcpy(&cdata[4], &u, 4);
  }
  topos_tensor *ct = topos_tensor_from(TOPOS_F32, 2, SN_S(2, 3), cdata, &err);
  topos_tape *t = topos_tape_new(v == V_TAPE_DTYPE ? TOPOS_F64 : TOPOS_F32);
  topos_value a, b;
  if (v == V_PARAM_ORDER) {
    b = topos_parameter(t, p2);
    a = topos_parameter(t, p1);
  } else {
    a = topos_parameter(t, p1);
    b = topos_parameter(t, p2);
  }
  topos_value c = topos_constant(t, ct);
  topos_value z = topos_mul(t, topos_sub(t, a, b), c);
  topos_name(t, topos_narrow(t, z, 1, v == V_ATTRIBUTE ? 1 : 0, 2),
             v == V_NAME ? "Out" : "out");
  topos_tensor_release(p1);
  topos_tensor_release(p2);
  topos_tensor_release(ct);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "variant %d: %s", v, err.message);
  return net;
}

START_TEST(any_change_changes_the_id) {
  char ids[V_COUNT][65];
  for (int v = 0; v < V_COUNT; v++) {
    topos_network *net = variant(v);
    id_of(net, ids[v]);
    topos_network_release(net);
  }
  for (int v = 0; v < V_COUNT; v++)
    for (int w = v + 1; w < V_COUNT; w++)
      ck_assert_msg(strcmp(ids[v], ids[w]) != 0,
                    "variants %d and %d have the same id %s", v, w, ids[v]);
  /* And the base is stable. */
  topos_network *again = variant(V_BASE);
  char id[65];
  id_of(again, id);
  ck_assert_str_eq(id, ids[V_BASE]);
  topos_network_release(again);
}
END_TEST

/* ------------------------------------------------------------ hostile bytes */

START_TEST(every_truncation_fails) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sample(s);
    size_t len;
    uint8_t *bytes = encode(net, &len);
    for (size_t cut = 0; cut < len; cut++) {
      topos_error err = {0};
      topos_network *got = decode_copy(bytes, cut, &err);
      ck_assert_msg(got == NULL, "%s: %zu of %zu bytes decoded",
                    sn_samples[s].name, cut, len);
      ck_assert_int_eq(err.code, TOPOS_ERR_CORRUPT);
      ck_assert_msg(strncmp(err.message, "decode: ", 8) == 0, "%s",
                    err.message);
    }
    topos_free(bytes);
    topos_network_release(net);
  }
}
END_TEST

/* Random damage gives an error or a valid network, and a network that
 * decodes re-encodes to exactly the damaged bytes. */
START_TEST(random_flips) {
  int decoded = 0, refused = 0;
  uint64_t state = 0x5EED0001;
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sample(s);
    size_t len;
    uint8_t *bytes = encode(net, &len);
    uint8_t *copy = malloc(len);
    for (int trial = 0; trial < 250; trial++) {
      memcpy(copy, bytes, len);
      int flips = 1 + (int)(tt_uniform(&state, 0, 3));
      for (int f = 0; f < flips; f++) {
        size_t at = (size_t)tt_uniform(&state, 0, (double)len);
        if (tt_uniform(&state, 0, 1) < 0.5)
          copy[at] ^= (uint8_t)(1u << (int)tt_uniform(&state, 0, 8));
        else
          copy[at] = (uint8_t)tt_uniform(&state, 0, 256);
      }
      topos_error err = {0};
      topos_network *got = decode_copy(copy, len, &err);
      if (!got) {
        refused++;
        ck_assert_msg(err.code != TOPOS_OK && err.message[0], "no message");
        continue;
      }
      decoded++;
      size_t len2;
      uint8_t *again = encode(got, &len2);
      ck_assert_msg(len2 == len && memcmp(again, copy, len) == 0,
                    "%s trial %d: a decoded network re-encodes differently",
                    sn_samples[s].name, trial);
      char id1[65], id2[65], hash[65];
      id_of(got, id1);
      id_of(got, id2);
      topos_sha256_hex(copy, len, hash);
      ck_assert_str_eq(id1, id2);
      ck_assert_str_eq(id1, hash);
      topos_free(again);
      topos_network_release(got);
    }
    free(copy);
    topos_free(bytes);
    topos_network_release(net);
  }
  ck_assert_int_eq(decoded + refused, 1000);
  /* Both outcomes happen: flips in tensor data decode, flips in the
   * structure are refused. */
  ck_assert_int_gt(decoded, 0);
  ck_assert_int_gt(refused, 0);
}
END_TEST

START_TEST(hand_made_valid) {
  bytes_out o;
  b_valid(&o);
  topos_error err = {0};
  topos_network *net = decode_copy(o.b, o.n, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  ck_assert_int_eq(topos_network_node_count(net), 2);
  topos_value v = topos_network_find(net, "sum");
  ck_assert_int_eq(v.index, 1);
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  const double want[2] = {2, 4};
  tt_assert_values(topos_run_of(run, v, &err), want, 2);
  topos_run_free(run);
  size_t len;
  uint8_t *again = encode(net, &len);
  ck_assert(len == o.n && memcmp(again, o.b, len) == 0);
  topos_free(again);
  topos_network_release(net);
}
END_TEST

/* A tensor whose elements are all one value is written as that value:
 * a zero-initialised f32[1000, 1000] parameter takes a few bytes, decodes
 * to a broadcast of one element, and re-encodes to the same bytes. */
START_TEST(splat_tensors) {
  topos_error err = {0};
  int64_t big[2] = {1000, 1000}, two[1] = {2};
  topos_tensor *z = topos_tensor_zeros(TOPOS_F32, 2, big, &err);
  topos_tensor *half = topos_tensor_filled(TOPOS_F64, 1, two, -0.5, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w = topos_parameter(tape, z);
  topos_value c = topos_constant(tape, half);
  topos_name(tape, topos_sum(tape, w), "s");
  (void)c;
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  size_t len;
  uint8_t *bytes = encode(net, &len);
  ck_assert_uint_lt(len, 200);
  topos_network *back = decode_copy(bytes, len, &err);
  ck_assert_msg(back != NULL, "%s", err.message);
  size_t len2;
  uint8_t *again = encode(back, &len2);
  ck_assert(len2 == len && memcmp(again, bytes, len) == 0);
  topos_run *run = topos_forward(back, NULL, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(run);
  ck_assert(topos_run_scalar(run, topos_network_find(back, "s"), &err) == 0);
  topos_run_free(run);
  topos_free(again);
  topos_free(bytes);
  topos_network_release(back);
  topos_network_release(net);
  topos_tensor_release(z);
  topos_tensor_release(half);
}
END_TEST

/* The splat form's rules: only for two or more elements, only when they
 * are all equal (one encoding per content), a known form byte. */
START_TEST(splat_form_is_canonical) {
  bytes_out o;
  /* f32[2] {3, 3} written as elements: not canonical. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(2), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 2);
  b8(&o, 0);
  bf32(&o, 3.0f);
  bf32(&o, 3.0f);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "must be written as a splat");
  /* The same as a splat: valid. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(2), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 2);
  b8(&o, 1);
  bf32(&o, 3.0f);
  b8(&o, 0);
  topos_error err = {0};
  topos_network *net = decode_copy(o.b, o.n, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  size_t len;
  uint8_t *again = encode(net, &len);
  ck_assert(len == o.n && memcmp(again, o.b, len) == 0);
  topos_free(again);
  topos_network_release(net);
  /* A splat of one element. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(1), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 1);
  b8(&o, 1);
  bf32(&o, 3.0f);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "a splat tensor of 1");
  /* An unknown form; a splat whose element is cut off. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(2), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 2);
  b8(&o, 7);
  bf32(&o, 3.0f);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "unknown tensor form 7");
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(4), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 4);
  b8(&o, 1);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "truncated");
  /* A splat past the engine's tensor limit: refused like any tensor. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S((int64_t)1 << 60), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, (uint64_t)1 << 60);
  b8(&o, 1);
  bf32(&o, 0.0f);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "2^40-byte limit");
}
END_TEST

/* Version 1 (no form byte) still decodes, and re-encodes as version 2. */
START_TEST(version_one_still_reads) {
  bytes_out o;
  b_version = 1;
  b_valid(&o);
  b_version = 2;
  topos_error err = {0};
  topos_network *net = decode_copy(o.b, o.n, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  size_t len;
  uint8_t *again = encode(net, &len);
  bytes_out v2;
  b_valid(&v2);
  ck_assert(len == v2.n && memcmp(again, v2.b, len) == 0);
  topos_free(again);
  topos_network_release(net);
}
END_TEST

START_TEST(null_and_empty_input) {
  topos_error err = {0};
  ck_assert_ptr_null(topos_network_decode(NULL, 0, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "NULL"));
  ck_assert_ptr_null(topos_network_decode(NULL, 100, NULL));
  uint8_t none[1] = {0};
  expect_decode_error(none, 0, TOPOS_ERR_CORRUPT, "truncated");
}
END_TEST

START_TEST(bad_header) {
  bytes_out o;
  b_valid(&o);
  o.b[0] = 'X';
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "magic");
  b_valid(&o);
  o.b[4] = 3; /* version 3 */
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "format version 3");
  b_valid(&o);
  o.b[4] = 0; /* version 0 */
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "format version 0");
  b_valid(&o);
  o.b[6] = TOPOS_I32; /* an integer tape */
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "tape dtype 3");
  b_valid(&o);
  o.b[6] = 77;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "tape dtype 77");
}
END_TEST

START_TEST(huge_node_count) {
  bytes_out o;
  b_valid(&o);
  /* The count says 2^32 - 1 nodes; 50-odd bytes follow. */
  o.b[7] = o.b[8] = o.b[9] = o.b[10] = 0xFF;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "claims 4294967295 nodes");
  o.b[10] = 0x7F;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "claims 2147483647 nodes");
  /* A count that fits the bytes but is one too many runs out mid-way. */
  b_valid(&o);
  o.b[7] = 3;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "node 2: truncated");
  /* One too few leaves the last node as trailing bytes. */
  o.b[7] = 1;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "trailing bytes");
}
END_TEST

START_TEST(huge_tensor_extent) {
  const int64_t huge = (int64_t)1 << 62;
  bytes_out o;
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(huge), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, (uint64_t)huge);
  b8(&o, 0); /* its elements follow */
  bf32(&o, 1.0f);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "truncated: tensor f32[");
  /* An element count that overflows int64. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 2, SN_S(huge, huge), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 2);
  b64(&o, (uint64_t)huge);
  b64(&o, (uint64_t)huge);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "more elements than int64 can count");
  /* A negative extent. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(-2), 0, NULL);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "negative extent");
  /* A tensor without elements has no bytes, whatever its other extents
   * (even ones whose product overflows): it records, so it decodes, and
   * re-encodes to the same bytes. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 3, SN_S(0, huge, huge), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 3);
  b64(&o, 0);
  b64(&o, (uint64_t)huge);
  b64(&o, (uint64_t)huge);
  b8(&o, 0); /* form: elements (none) */
  b8(&o, 0);
  topos_error err = {0};
  topos_network *net = decode_copy(o.b, o.n, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  size_t len;
  uint8_t *again = encode(net, &len);
  ck_assert(len == o.n && memcmp(again, o.b, len) == 0);
  topos_free(again);
  topos_network_release(net);
}
END_TEST

START_TEST(rank_nine) {
  bytes_out o;
  b_header(&o, TOPOS_F32, 1);
  b8(&o, OP_CONSTANT);
  b8(&o, TOPOS_F32);
  b8(&o, 9);
  for (int i = 0; i < 9; i++) b64(&o, 1);
  b32(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "node 0: shape has rank 9");
  /* In the tensor. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 0, NULL, 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 9);
  for (int i = 0; i < 9; i++) b64(&o, 1);
  bf32(&o, 0);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "tensor shape has rank 9");
  /* In a reshape target. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_RESHAPE, TOPOS_F32, 1, SN_S(2), 1, (const uint32_t[]){0});
  b8(&o, 9);
  for (int i = 0; i < 9; i++) b64(&o, 1);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "target shape has rank 9");
}
END_TEST

START_TEST(operands_must_be_earlier) {
  bytes_out o;
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_ADD, TOPOS_F32, 1, SN_S(2), 2, (const uint32_t[]){1, 0});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "node 1: operand 0 refers to node 1, not an earlier "
                      "node");
  b_header(&o, TOPOS_F32, 3);
  b_constant2(&o);
  b_node(&o, OP_ADD, TOPOS_F32, 1, SN_S(2), 2, (const uint32_t[]){0, 2});
  b8(&o, 0);
  b_constant2(&o);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "node 1: operand 1 refers to node 2, not an earlier "
                      "node");
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_NEG, TOPOS_F32, 1, SN_S(2), 1, (const uint32_t[]){0xFFFFFFFF});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "refers to node 4294967295");
}
END_TEST

START_TEST(operand_counts) {
  bytes_out o;
  /* Three operands for add. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_ADD, TOPOS_F32, 1, SN_S(2), 3, (const uint32_t[]){0, 0, 0});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "add takes 2 operands, the bytes give 3");
  /* concat with none. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_CONCAT, TOPOS_F32, 1, SN_S(2), 0, NULL);
  b8(&o, 0);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "at least 1 operand");
  /* A count far beyond the bytes. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b8(&o, OP_CONCAT);
  b8(&o, TOPOS_F32);
  b8(&o, 0);
  b32(&o, 0xFFFFFFFF);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "truncated: operands");
}
END_TEST

START_TEST(unknown_op_and_dtype) {
  bytes_out o;
  b_valid(&o);
  /* The header takes 11 bytes, the constant node 35: op, dtype, rank 1,
   * one extent, operand count (15); tensor dtype, rank 1, one extent, its
   * form, two f32 (19); name length (1). */
  size_t add_at = 11 + 35;
  ck_assert_uint_eq(o.b[add_at], OP_ADD);
  o.b[add_at] = 200;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "node 1: unknown op 200");
  o.b[add_at] = OP_COUNT;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "unknown op");
  b_valid(&o);
  o.b[add_at + 1] = 4;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "node 1: unknown dtype 4");
  b_valid(&o);
  o.b[11 + 15] = 200; /* the constant's tensor dtype */
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "node 0: unknown tensor dtype 200");
}
END_TEST

START_TEST(stored_facts_must_match) {
  bytes_out o;
  /* add of two f32[2] stored as f32[3]. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_ADD, TOPOS_F32, 1, SN_S(3), 2, (const uint32_t[]){0, 0});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "node 1: add is stored as f32[3] but replays as f32[2]");
  /* ... stored as f64. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_ADD, TOPOS_F64, 1, SN_S(2), 2, (const uint32_t[]){0, 0});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "stored as f64[2]");
  /* A leaf whose node shape disagrees with its tensor. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_CONSTANT, TOPOS_F32, 1, SN_S(1), 0, NULL);
  b8(&o, TOPOS_F32);
  b8(&o, 1);
  b64(&o, 2);
  b8(&o, 0);
  bf32(&o, 1);
  bf32(&o, 2);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "constant is stored as f32[1] but replays as f32[2]");
  /* A parameter slot out of order. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_PARAMETER, TOPOS_F32, 0, NULL, 0, NULL);
  b32(&o, 5);
  b8(&o, TOPOS_F32);
  b8(&o, 0);
  b8(&o, 0);
  bf32(&o, 1);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "stored with slot 5 but replays as slot 0");
}
END_TEST

/* Whatever the recording API refuses, decoding refuses with its message. */
START_TEST(replay_applies_the_shape_rules) {
  bytes_out o;
  /* matmul of f32[2] by f32[2]: rank 1 operands. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_MATMUL, TOPOS_F32, 1, SN_S(2), 2, (const uint32_t[]){0, 0});
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT,
                      "replay failed: matmul (node 1): needs [m,k]");
  /* pow with a NaN exponent. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_POW, TOPOS_F32, 1, SN_S(2), 1, (const uint32_t[]){0});
  b64(&o, 0x7FF8000000000000ull);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "exponent is NaN");
  /* narrow past the end. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_NARROW, TOPOS_F32, 1, SN_S(2), 1, (const uint32_t[]){0});
  b8(&o, 0);
  b64(&o, 1);
  b64(&o, 2);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "narrow (node 1)");
  /* An axis byte beyond any rank. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  b_node(&o, OP_SUM_ALONG, TOPOS_F32, 0, NULL, 1, (const uint32_t[]){0});
  b8(&o, 255);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "axis 255 is out of range");
  /* A parameter that is i32. */
  b_header(&o, TOPOS_F32, 1);
  b_node(&o, OP_PARAMETER, TOPOS_I32, 0, NULL, 0, NULL);
  b32(&o, 0);
  b8(&o, TOPOS_I32);
  b8(&o, 0);
  b8(&o, 0);
  b32(&o, 7);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "a parameter must be");
}
END_TEST

START_TEST(names) {
  bytes_out o;
  /* A NUL inside a name. */
  b_valid(&o);
  o.b[o.n - 2] = 0;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "NUL");
  /* A name longer than the bytes left. */
  b_valid(&o);
  o.b[o.n - 4] = 200;
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "truncated: name");
  /* The same name twice. */
  b_header(&o, TOPOS_F32, 2);
  b_constant2(&o);
  o.b[o.n - 1] = 1;
  b8(&o, 'a');
  b_node(&o, OP_NEG, TOPOS_F32, 1, SN_S(2), 1, (const uint32_t[]){0});
  b8(&o, 1);
  b8(&o, 'a');
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "already names node 0");
}
END_TEST

START_TEST(trailing_bytes) {
  bytes_out o;
  b_valid(&o);
  b8(&o, 0);
  expect_decode_error(o.b, o.n, TOPOS_ERR_CORRUPT, "1 trailing bytes");
  topos_network *net = sn_every_op();
  size_t len;
  uint8_t *bytes = encode(net, &len);
  uint8_t *longer = malloc(len + 64);
  memcpy(longer, bytes, len);
  memset(longer + len, 0xAB, 64);
  expect_decode_error(longer, len + 64, TOPOS_ERR_CORRUPT, "64 trailing bytes");
  free(longer);
  topos_free(bytes);
  topos_network_release(net);
}
END_TEST

Suite *encode_suite(void) {
  Suite *s = suite_create("encode");
  TCase *tc = tcase_create("round trip");
  tcase_add_test(tc, round_trip_samples);
  tcase_add_test(tc, views_encode_as_their_values);
  tcase_add_test(tc, empty_network);
  tcase_add_test(tc, layout_is_pinned);
  tcase_add_test(tc, op_codes_are_frozen);
  tcase_add_test(tc, encode_arguments);
  suite_add_tcase(s, tc);

  tc = tcase_create("id");
  tcase_add_test(tc, sha256_vectors);
  tcase_add_test(tc, equal_specs_equal_ids);
  tcase_add_test(tc, any_change_changes_the_id);
  suite_add_tcase(s, tc);

  tc = tcase_create("hostile");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, every_truncation_fails);
  tcase_add_test(tc, random_flips);
  tcase_add_test(tc, hand_made_valid);
  tcase_add_test(tc, null_and_empty_input);
  tcase_add_test(tc, splat_tensors);
  tcase_add_test(tc, splat_form_is_canonical);
  tcase_add_test(tc, version_one_still_reads);
  tcase_add_test(tc, bad_header);
  tcase_add_test(tc, huge_node_count);
  tcase_add_test(tc, huge_tensor_extent);
  tcase_add_test(tc, rank_nine);
  tcase_add_test(tc, operands_must_be_earlier);
  tcase_add_test(tc, operand_counts);
  tcase_add_test(tc, unknown_op_and_dtype);
  tcase_add_test(tc, stored_facts_must_match);
  tcase_add_test(tc, replay_applies_the_shape_rules);
  tcase_add_test(tc, names);
  tcase_add_test(tc, trailing_bytes);
  suite_add_tcase(s, tc);
  return s;
}
