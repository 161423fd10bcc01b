/*
 * test_footprint.c - memory footprints (engine/footprint.c): what a
 * tensor, a network and a plan keep, checked against what the engine
 * allocates for them (internal.h's structs), and against the encoding a
 * cache used to count instead.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* A chain of n tanh nodes over one scalar input, offset by k. */
static topos_network *chain(int n, double k, bool named) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F32, 0.0, &err);
  topos_value v = topos_input(tape, zero);
  topos_tensor_release(zero);
  v = topos_add(tape, v, topos_scalar(tape, k));
  for (int i = 0; i < n; i++) {
    v = topos_tanh(tape, v);
    if (named) {
      char name[48];
      snprintf(name, sizeof name, "a-rather-long-node-name-%06d", i);
      v = topos_name(tape, v, name);
    }
  }
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "chain: %s", err.message);
  return net;
}

START_TEST(tensor_memory) {
  topos_error err = {0};
  int64_t shape[1] = {1000};
  topos_tensor *t = topos_tensor_zeros(TOPOS_F32, 1, shape, &err);
  ck_assert_ptr_nonnull(t);
  size_t bytes = topos_tensor_memory_bytes(t);
  /* The struct, the buffer record and the buffer at its pool capacity. */
  ck_assert_uint_ge(
      bytes, sizeof(topos_tensor) + sizeof(tensor_buffer) + t->buf->capacity);
  ck_assert_uint_ge(t->buf->capacity, 4000);
  ck_assert_uint_lt(bytes, 4000 * 5 / 4 + 512);
  ck_assert_uint_eq(topos_tensor_memory_bytes(NULL), 0);
  topos_tensor_release(t);
}
END_TEST

START_TEST(network_memory_beats_encoding) {
  topos_error err = {0};
  int n = 100000;
  topos_network *net = chain(n, 1.0, false);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(topos_network_encode(net, &bytes, &len, &err), TOPOS_OK);
  size_t mem = topos_network_memory_bytes(net);
  /* Every node's struct is held (the node array, at the capacity the tape
   * grew it to), plus an operand list per tanh: far more than the ~10
   * bytes a node takes encoded. */
  ck_assert_uint_ge(mem, (size_t)n * (sizeof(node) + sizeof(int32_t)));
  ck_assert_uint_gt(mem, 20 * len);
  /* A decoded copy (what the daemon caches) holds the same. */
  topos_network *back = topos_network_decode(bytes, len, &err);
  ck_assert_msg(back != NULL, "decode: %s", err.message);
  ck_assert_uint_eq(topos_network_memory_bytes(back), mem);
  /* It grows with the nodes. */
  topos_network *half = chain(n / 2, 1.0, false);
  ck_assert_uint_lt(topos_network_memory_bytes(half), mem);
  ck_assert_uint_eq(topos_network_memory_bytes(NULL), 0);
  topos_network_release(half);
  topos_network_release(back);
  topos_network_release(net);
  topos_free(bytes);
}
END_TEST

START_TEST(network_memory_counts_names_and_tensors) {
  topos_error err = {0};
  topos_network *plain = chain(1000, 2.0, false);
  topos_network *named = chain(1000, 2.0, true);
  /* 1000 names of 30 characters, each a heap block of its own. */
  ck_assert_uint_ge(topos_network_memory_bytes(named),
                    topos_network_memory_bytes(plain) + 1000 * 31);
  /* A parameter's initial tensor: 4 MB of f32. */
  int64_t shape[1] = {1 << 20};
  topos_tensor *w = topos_tensor_zeros(TOPOS_F32, 1, shape, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value p = topos_parameter(tape, w);
  topos_sum(tape, p);
  topos_network *big = topos_tape_seal(tape, &err);
  ck_assert_ptr_nonnull(big);
  ck_assert_uint_ge(topos_network_memory_bytes(big), (size_t)4 << 20);
  ck_assert_uint_lt(topos_network_memory_bytes(big), (size_t)6 << 20);
  topos_tensor_release(w);
  topos_network_release(big);
  topos_network_release(named);
  topos_network_release(plain);
}
END_TEST

START_TEST(plan_memory) {
  topos_error err = {0};
  int n = 20000;
  topos_network *net = chain(n, 3.0, false);
  topos_value root =
      topos_network_value(net, topos_network_node_count(net) - 1);
  topos_entry entry = {.roots = &root, .nroots = 1};
  topos_plan *plan = topos_network_lower(net, &entry, &err);
  ck_assert_msg(plan != NULL, "lower: %s", err.message);
  size_t mem = topos_plan_memory_bytes(plan);
  /* Per node: live, keep, retain, group_of, schedule, last_use (the
   * groups table holds only the groups found: none in a chain); the
   * network is not the plan's to count. */
  size_t per_node = 3 * sizeof(bool) + 3 * sizeof(int32_t);
  ck_assert_uint_ge(mem, (size_t)n * per_node);
  ck_assert_uint_lt(mem, (size_t)n * per_node * 2);
  ck_assert_uint_eq(topos_plan_memory_bytes(NULL), 0);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

Suite *footprint_suite(void) {
  Suite *s = suite_create("footprint");
  TCase *tc = tcase_create("footprint");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, tensor_memory);
  tcase_add_test(tc, network_memory_beats_encoding);
  tcase_add_test(tc, network_memory_counts_names_and_tensors);
  tcase_add_test(tc, plan_memory);
  suite_add_tcase(s, tc);
  return s;
}
