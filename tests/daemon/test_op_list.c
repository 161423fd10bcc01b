/*
 * test_op_list.c - the wire follows the op list (engine/ops.h).  proto/
 * wire.c's _Static_asserts tie each list entry to the proto enumerator of
 * the same name at compile time; what they cannot see is checked here:
 * the proto enum has no op the list lacks, every enumerator's name is the
 * op's name, and a spec Node carries exactly the attributes its op reads,
 * both going out and coming in (unread fields of a received Node are
 * ignored, whatever they hold).
 */
#include <check.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "sample_nets.h"
#include "testutil.h"
#include "topos.h"
#include "wire.h"

static const char *const names[OP_COUNT] = {
#define NAME_OF(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = name,
    TOPOS_OPS(NAME_OF)
#undef NAME_OF
};

static const unsigned masks[OP_COUNT] = {
#define MASK_OF(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = attrs,
    TOPOS_OPS(MASK_OF)
#undef MASK_OF
};

/* The proto name of an op ("BROADCAST_ALONG" for "broadcast_along"). */
static void upper(const char *s, char *out, size_t n) {
  size_t i = 0;
  for (; s[i] && i + 1 < n; i++) out[i] = (char)toupper((unsigned char)s[i]);
  out[i] = '\0';
}

START_TEST(proto_enum_is_the_list) {
  const ProtobufCEnumDescriptor *d = &topos__v1__op__descriptor;
  ck_assert_int_eq(topos_op_count(), OP_COUNT);
  ck_assert_msg(d->n_values == (unsigned)OP_COUNT,
                "proto/topos.proto's Op has %u values, engine/ops.h %d ops",
                d->n_values, OP_COUNT);
  for (int op = 0; op < OP_COUNT; op++) {
    char want[64];
    upper(names[op], want, sizeof want);
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, op);
    ck_assert_msg(v != NULL, "no proto Op numbered %d (%s)", op, names[op]);
    ck_assert_str_eq(v->name, want);
    const ProtobufCEnumValue *byname =
        protobuf_c_enum_descriptor_get_value_by_name(d, want);
    ck_assert_ptr_nonnull(byname);
    ck_assert_int_eq(byname->value, op);
    ck_assert_int_eq(topos_op_code(names[op]), op);
  }
}
END_TEST

/* Each Node of every sample's spec: the op by number and by name, and
 * every attribute field set exactly when the op reads it. */
START_TEST(nodes_carry_exactly_the_mask) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    ck_assert_ptr_nonnull(net);
    Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
    topos_error err = {0};
    ck_assert_msg(wire_spec_from_network(net, &spec, &err) == TOPOS_OK, "%s",
                  err.message);
    ck_assert_int_eq((int)spec.n_nodes, topos_network_node_count(net));
    for (int i = 0; i < (int)spec.n_nodes; i++) {
      topos_node_info ni;
      ck_assert_int_eq(topos_network_node(net, i, &ni, NULL), TOPOS_OK);
      const Topos__V1__Node *m = spec.nodes[i];
      ck_assert_int_eq((int)m->op, ni.op);
      char want[64];
      upper(ni.op_name, want, sizeof want);
      ck_assert_str_eq(protobuf_c_enum_descriptor_get_value(
                           &topos__v1__op__descriptor, (int)m->op)
                           ->name,
                       want);
      unsigned k = masks[ni.op];
#define SAME(BIT, field)                                          \
  ck_assert_msg((k & BIT) ? m->field == ni.field : m->field == 0, \
                "%s node %d (%s): " #field, sn_samples[s].name, i, want)
      SAME(ATTR_AXIS, axis);
      SAME(ATTR_START, start);
      SAME(ATTR_LENGTH, length);
      SAME(ATTR_BEFORE, before);
      SAME(ATTR_AFTER, after);
      SAME(ATTR_SIZE, size);
      SAME(ATTR_STEP, step);
      SAME(ATTR_DILATION, dilation);
      SAME(ATTR_EXTENT, extent);
      SAME(ATTR_P, p);
#undef SAME
      ck_assert_int_eq((int)m->n_perm, (k & ATTR_PERM) ? ni.rank : 0);
      ck_assert_int_eq((int)m->n_shape, (k & ATTR_TARGET) ? ni.target_rank : 0);
      ck_assert((m->tensor != NULL) == ((k & ATTR_TENSOR) != 0));
    }
    wire_message_clear(&spec.base);
    topos_network_release(net);
  }
}
END_TEST

/* A received spec whose Nodes carry junk in every attribute their op does
 * not read replays as the same network. */
START_TEST(unread_fields_are_ignored) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
    ck_assert_int_eq(wire_spec_from_network(net, &spec, NULL), TOPOS_OK);
    for (size_t i = 0; i < spec.n_nodes; i++) {
      Topos__V1__Node *m = spec.nodes[i];
      unsigned k = masks[m->op];
      if (!(k & ATTR_AXIS)) m->axis = 5;
      if (!(k & ATTR_START)) m->start = 21;
      if (!(k & ATTR_LENGTH)) m->length = 22;
      if (!(k & ATTR_BEFORE)) m->before = 23;
      if (!(k & ATTR_AFTER)) m->after = 24;
      if (!(k & ATTR_SIZE)) m->size = 25;
      if (!(k & ATTR_STEP)) m->step = 26;
      if (!(k & ATTR_DILATION)) m->dilation = 27;
      if (!(k & ATTR_EXTENT)) m->extent = 28;
      if (!(k & ATTR_P)) m->p = -7.5;
      if (!(k & ATTR_PERM)) {
        m->perm = malloc(3 * sizeof *m->perm);
        m->perm[0] = 9, m->perm[1] = 9, m->perm[2] = 9;
        m->n_perm = 3;
      }
      if (!(k & ATTR_TARGET)) {
        m->shape = malloc(2 * sizeof *m->shape);
        m->shape[0] = 1, m->shape[1] = 99;
        m->n_shape = 2;
      }
    }
    topos_error err = {0};
    topos_network *back = wire_spec_to_network(&spec, &err);
    ck_assert_msg(back != NULL, "%s: %s", sn_samples[s].name, err.message);
    char a[65], b[65];
    ck_assert_int_eq(topos_network_id(net, a, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(back, b, NULL), TOPOS_OK);
    ck_assert_str_eq(a, b);
    topos_network_release(back);
    wire_message_clear(&spec.base);
    topos_network_release(net);
  }
}
END_TEST

Suite *op_list_suite(void) {
  Suite *s = suite_create("op_list");
  TCase *tc = tcase_create("wire");
  tcase_add_test(tc, proto_enum_is_the_list);
  tcase_add_test(tc, nodes_carry_exactly_the_mask);
  tcase_add_test(tc, unread_fields_are_ignored);
  suite_add_tcase(s, tc);
  return s;
}
