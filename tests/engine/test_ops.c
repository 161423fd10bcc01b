/*
 * test_ops.c - the op list (engine/ops.h) is the one source of the op set.
 * Every entry's name round-trips through topos_op_code and its columns
 * agree with each other; the sample that records every op covers the
 * list; the canonical encoding of every node carries exactly the
 * attributes its entry names, in list order (read back by a walk written
 * here from docs/encoding.md, not by the decoder); describe lists those
 * attributes under their documented names; and a recorded node keeps only
 * the attributes its op reads.
 */
#include <cJSON.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "sample_nets.h"
#include "testutil.h"

/* docs/encoding.md's attribute names, by list position: the test's own
 * copy, so a renamed attribute shows up as a failure. */
static const char *const doc_names[ATTR_BIT_COUNT] = {
    "slot",   "tensor", "p",     "perm",   "shape", "axis", "start",
    "length", "before", "after", "extent", "size",  "step", "dilation"};

static topos_network *build(int s) {
  topos_network *net = sn_samples[s].build();
  ck_assert_msg(net != NULL, "sample %s", sn_samples[s].name);
  return net;
}

static topos_node_info node_info(const topos_network *net, int i) {
  topos_node_info ni;
  topos_error err = {0};
  ck_assert_msg(topos_network_node(net, i, &ni, &err) == TOPOS_OK, "%s",
                err.message);
  return ni;
}

/* An integer attribute of ni; false for the others. */
static bool info_int(const topos_node_info *ni, attr_bit bit, int64_t *v) {
  switch (bit) {
    case ATTR_BIT_SLOT:
      *v = ni->slot;
      return true;
    case ATTR_BIT_AXIS:
      *v = ni->axis;
      return true;
    case ATTR_BIT_START:
      *v = ni->start;
      return true;
    case ATTR_BIT_LENGTH:
      *v = ni->length;
      return true;
    case ATTR_BIT_BEFORE:
      *v = ni->before;
      return true;
    case ATTR_BIT_AFTER:
      *v = ni->after;
      return true;
    case ATTR_BIT_EXTENT:
      *v = ni->extent;
      return true;
    case ATTR_BIT_SIZE:
      *v = ni->size;
      return true;
    case ATTR_BIT_STEP:
      *v = ni->step;
      return true;
    case ATTR_BIT_DILATION:
      *v = ni->dilation;
      return true;
    case ATTR_BIT_TENSOR:
    case ATTR_BIT_P:
    case ATTR_BIT_PERM:
    case ATTR_BIT_TARGET:
    case ATTR_BIT_COUNT:
      break;
  }
  return false;
}

/* ------------------------------------------------------------ the list */

START_TEST(names_round_trip) {
  ck_assert_int_eq(topos_op_count(), OP_COUNT);
  for (int i = 0; i < OP_COUNT; i++) {
    const op_info *o = &op_table[i];
    ck_assert_msg(o->name != NULL, "op %d has no name", i);
    ck_assert_msg(topos_op_code(o->name) == i, "%s is code %d, not %d", o->name,
                  topos_op_code(o->name), i);
  }
  ck_assert_int_eq(topos_op_code("no such op"), -1);
  ck_assert_int_eq(topos_op_code(NULL), -1);
}
END_TEST

/* The columns of one entry cannot contradict each other. */
START_TEST(entries_are_consistent) {
  for (int i = 0; i < OP_COUNT; i++) {
    const op_info *o = &op_table[i];
    ck_assert_msg(o->arity >= -1 && o->arity <= 2, "%s: arity %d", o->name,
                  o->arity);
    ck_assert_msg((unsigned)o->family < FAMILY_COUNT, "%s: family %d", o->name,
                  (int)o->family);
    ck_assert_msg((o->attrs >> ATTR_BIT_COUNT) == 0, "%s: attrs 0x%x", o->name,
                  o->attrs);
    /* A leaf has no operands and a value of its own; nothing else does. */
    bool leaf = o->family == FAMILY_LEAF;
    ck_assert_msg(leaf == (o->arity == 0), "%s", o->name);
    ck_assert_msg(leaf == ((o->attrs & ATTR_TENSOR) != 0), "%s", o->name);
    if (o->attrs & ATTR_SLOT) ck_assert_msg(leaf, "%s has a slot", o->name);
    /* An adjoint reads operands that exist, and a linear one reads none. */
    int nops = o->arity < 0 ? 0 : o->arity;
    for (int j = nops; j < 7; j++)
      ck_assert_msg(!(o->reads & READS_OPERAND(j)), "%s reads operand %d",
                    o->name, j);
    if (o->linear) ck_assert_msg(o->reads == 0, "%s", o->name);
    if (leaf) ck_assert_msg(o->reads == 0 && !o->linear, "%s", o->name);
    /* Layout ops move values without arithmetic: their adjoints only move
     * g back. */
    if (o->family == FAMILY_LAYOUT) ck_assert_msg(o->linear, "%s", o->name);
  }
}
END_TEST

/* The suites below iterate the list through this sample, so it must hold
 * every op. */
START_TEST(every_op_sample_covers_the_list) {
  topos_network *net = sn_every_op();
  ck_assert_ptr_nonnull(net);
  int seen[OP_COUNT] = {0};
  for (int i = 0; i < topos_network_node_count(net); i++)
    seen[node_info(net, i).op]++;
  for (int op = 0; op < OP_COUNT; op++)
    ck_assert_msg(seen[op] > 0,
                  "sn_every_op (tests/engine/sample_nets.h) has no %s node",
                  op_table[op].name);
  topos_network_release(net);
}
END_TEST

/* What the families say holds for every node of the samples: elementwise
 * ops give their operand's dtype and shape, reductions never grow their
 * operand, and neither they nor layout ops change its dtype. */
START_TEST(families_hold_on_the_samples) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = build(s);
    for (int i = 0; i < topos_network_node_count(net); i++) {
      topos_node_info ni = node_info(net, i);
      op_family f = op_table[ni.op].family;
      if (f == FAMILY_LEAF) continue;
      topos_node_info a = node_info(net, ni.operands[0]);
      int64_t na = 1, n = 1;
      for (int k = 0; k < a.rank; k++) na *= a.shape[k];
      for (int k = 0; k < ni.rank; k++) n *= ni.shape[k];
      const char *op = op_table[ni.op].name;
      if (f == FAMILY_UNARY || f == FAMILY_BINARY) {
        ck_assert_msg(ni.dtype == a.dtype && ni.rank == a.rank &&
                          memcmp(ni.shape, a.shape,
                                 sizeof(int64_t) * (size_t)a.rank) == 0,
                      "%s: node %d (%s) changed its operand's type",
                      sn_samples[s].name, i, op);
      }
      if (f == FAMILY_REDUCTION)
        ck_assert_msg(n <= na, "node %d (%s) grew", i, op);
      if (f == FAMILY_LAYOUT || f == FAMILY_REDUCTION)
        ck_assert_msg(ni.dtype == a.dtype, "node %d (%s) changed its dtype", i,
                      op);
    }
    topos_network_release(net);
  }
}
END_TEST

/* ------------------------------------------------------------ encoding */

typedef struct walk {
  const uint8_t *p;
  size_t left;
} walk;

/* A little-endian unsigned integer of n bytes. */
static uint64_t take(walk *w, size_t n, const char *what) {
  ck_assert_msg(w->left >= n, "the encoding ends inside %s", what);
  uint64_t v = 0;
  for (size_t k = n; k-- > 0;) v = v << 8 | w->p[k];
  w->p += n;
  w->left -= n;
  return v;
}

/* Every node of every sample, read with docs/encoding.md's layout and the
 * attribute masks of the list: the bytes hold exactly those attributes, in
 * list order, with the node's values, and nothing else. */
START_TEST(encoding_carries_exactly_the_mask) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = build(s);
    uint8_t *bytes = NULL;
    size_t len = 0;
    ck_assert_int_eq(topos_network_encode(net, &bytes, &len, NULL), TOPOS_OK);
    walk w = {bytes, len};
    take(&w, 4 + 2 + 1, "the header");
    int n = (int)take(&w, 4, "the node count");
    ck_assert_int_eq(n, topos_network_node_count(net));
    for (int i = 0; i < n; i++) {
      topos_node_info ni = node_info(net, i);
      const char *op = op_table[ni.op].name;
      ck_assert_int_eq((int)take(&w, 1, "op"), ni.op);
      take(&w, 1, "dtype");
      int rank = (int)take(&w, 1, "rank");
      ck_assert_int_eq(rank, ni.rank);
      take(&w, 8 * (size_t)rank, "shape");
      ck_assert_int_eq((int)take(&w, 4, "nin"), ni.nin);
      take(&w, 4 * (size_t)ni.nin, "operands");
      unsigned mask = op_table[ni.op].attrs;
      for (int b = 0; b < ATTR_BIT_COUNT; b++) {
        if (!(mask & 1u << b)) continue;
        attr_bit bit = (attr_bit)b;
        int64_t v = 0;
        if (bit == ATTR_BIT_SLOT) {
          ck_assert_int_eq((int64_t)take(&w, 4, "slot"), ni.slot);
        } else if (bit == ATTR_BIT_AXIS) {
          ck_assert_int_eq((int64_t)take(&w, 1, "axis"), ni.axis);
        } else if (info_int(&ni, bit, &v)) {
          ck_assert_msg((int64_t)take(&w, 8, doc_names[b]) == v,
                        "node %d (%s): %s", i, op, doc_names[b]);
        } else if (bit == ATTR_BIT_P) {
          uint64_t bits;
          memcpy(&bits, &ni.p, sizeof bits);
          ck_assert_uint_eq(take(&w, 8, "p"), bits);
        } else if (bit == ATTR_BIT_PERM) {
          for (int k = 0; k < ni.rank; k++)
            ck_assert_int_eq((int)take(&w, 1, "perm"), ni.perm[k]);
        } else if (bit == ATTR_BIT_TARGET) {
          ck_assert_int_eq((int)take(&w, 1, "target rank"), ni.target_rank);
          for (int k = 0; k < ni.target_rank; k++)
            ck_assert_int_eq((int64_t)take(&w, 8, "target"), ni.target[k]);
        } else if (bit == ATTR_BIT_TENSOR) {
          const topos_tensor *t = ni.tensor;
          ck_assert_int_eq((int)take(&w, 1, "tensor dtype"),
                           topos_tensor_dtype(t));
          int tr = (int)take(&w, 1, "tensor rank");
          ck_assert_int_eq(tr, topos_tensor_rank(t));
          int64_t count = 1;
          for (int k = 0; k < tr; k++)
            count *= (int64_t)take(&w, 8, "tensor shape");
          ck_assert_int_eq(count, topos_tensor_count(t));
          /* The form: 1 (splat) gives one element, 0 all of them. */
          int form = (int)take(&w, 1, "tensor form");
          ck_assert_int_le(form, 1);
          take(&w,
               (size_t)(form ? 1 : count) *
                   topos_dtype_size(topos_tensor_dtype(t)),
               "tensor data");
        } else {
          ck_abort_msg("node %d (%s): attribute %d has no encoding", i, op, b);
        }
      }
      size_t name_len = (size_t)take(&w, 1, "name length");
      ck_assert_msg(name_len == (ni.name ? strlen(ni.name) : 0),
                    "node %d (%s): the bytes and the mask disagree", i, op);
      ck_assert(w.left >= name_len);
      ck_assert(name_len == 0 || memcmp(w.p, ni.name, name_len) == 0);
      take(&w, name_len, "name");
    }
    ck_assert_msg(w.left == 0, "%s: %zu bytes after the last node",
                  sn_samples[s].name, w.left);
    topos_free(bytes);
    topos_network_release(net);
  }
}
END_TEST

/* ------------------------------------------------------------ describe */

/* Line i of a text listing (new string). */
static char *line_of(const char *text, int i) {
  for (; i > 0 && text; i--) {
    text = strchr(text, '\n');
    if (text) text++;
  }
  ck_assert_ptr_nonnull(text);
  const char *end = strchr(text, '\n');
  return strndup(text, end ? (size_t)(end - text) : strlen(text));
}

/* JSON's "attrs" of every node: the op's mask less slot and tensor, in
 * list order, under the documented names, with the node's values; "slot"
 * beside it exactly for the ops that read one.  The text line names the
 * op and every listed attribute. */
START_TEST(describe_lists_the_mask) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = build(s);
    char *js = topos_network_describe(net, TOPOS_FORMAT_JSON, NULL);
    char *txt = topos_network_describe(net, TOPOS_FORMAT_TEXT, NULL);
    char *dot = topos_network_describe(net, TOPOS_FORMAT_DOT, NULL);
    ck_assert(js && txt && dot);
    cJSON *root = cJSON_Parse(js);
    ck_assert_ptr_nonnull(root);
    cJSON *nodes = cJSON_GetObjectItem(root, "nodes");
    ck_assert_int_eq(cJSON_GetArraySize(nodes), topos_network_node_count(net));
    for (int i = 0; i < cJSON_GetArraySize(nodes); i++) {
      topos_node_info ni = node_info(net, i);
      const char *op = op_table[ni.op].name;
      cJSON *j = cJSON_GetArrayItem(nodes, i);
      ck_assert_str_eq(cJSON_GetObjectItem(j, "op")->valuestring, op);
      ck_assert_int_eq(topos_op_code(op), ni.op);
      unsigned mask = op_table[ni.op].attrs;
      ck_assert_msg(
          (cJSON_GetObjectItem(j, "slot") != NULL) == ((mask & ATTR_SLOT) != 0),
          "node %d (%s): slot", i, op);
      cJSON *a = cJSON_GetObjectItem(j, "attrs")->child;
      char *line = line_of(txt, i);
      char opword[64];
      snprintf(opword, sizeof opword, "  %s%s", op, ni.nin ? "(" : "");
      ck_assert_msg(strstr(line, opword) != NULL, "line %d: %s", i, line);
      for (int b = 0; b < ATTR_BIT_COUNT; b++) {
        if (!(mask & 1u << b) || b == ATTR_BIT_SLOT || b == ATTR_BIT_TENSOR)
          continue;
        ck_assert_msg(a != NULL, "node %d (%s): %s is not listed", i, op,
                      doc_names[b]);
        ck_assert_str_eq(a->string, doc_names[b]);
        int64_t v = 0;
        if (info_int(&ni, (attr_bit)b, &v))
          ck_assert_msg(cJSON_IsNumber(a) && a->valuedouble == (double)v,
                        "node %d (%s): %s", i, op, doc_names[b]);
        else if (b == ATTR_BIT_P)
          ck_assert(cJSON_IsNumber(a) && a->valuedouble == ni.p);
        else if (b == ATTR_BIT_PERM)
          ck_assert_int_eq(cJSON_GetArraySize(a), ni.rank);
        else if (b == ATTR_BIT_TARGET)
          ck_assert_int_eq(cJSON_GetArraySize(a), ni.target_rank);
        char key[32];
        snprintf(key, sizeof key, " %s=", doc_names[b]);
        ck_assert_msg(strstr(line, key) != NULL, "line %d lacks%s: %s", i, key,
                      line);
        a = a->next;
      }
      ck_assert_msg(a == NULL, "node %d (%s) lists %s, which it does not read",
                    i, op, a ? a->string : "");
      free(line);
      char label[80];
      snprintf(label, sizeof label, "\\n%s", op);
      ck_assert(strstr(dot, label) != NULL);
    }
    cJSON_Delete(root);
    topos_free(js);
    topos_free(txt);
    topos_free(dot);
    topos_network_release(net);
  }
}
END_TEST

/* ------------------------------------------------------------ recording */

/* Every node re-recorded through topos_record with every attribute its op
 * does not read set to something else: the network is the same (same id,
 * same node infos), and the unread fields read back as 0. */
START_TEST(only_read_attributes_are_kept) {
  const int junk_perm[TOPOS_MAX_RANK] = {7, 6, 5, 4, 3, 2, 1, 0};
  const int64_t junk_target[3] = {5, 6, 7};
  topos_tensor *junk = topos_tensor_scalar(TOPOS_F32, 9.0, NULL);
  ck_assert_ptr_nonnull(junk);
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = build(s);
    int n = topos_network_node_count(net);
    topos_tape *tape = topos_tape_new(topos_network_dtype(net));
    topos_value *vals = calloc((size_t)n, sizeof *vals);
    for (int i = 0; i < n; i++) {
      topos_node_info ni = node_info(net, i), at = ni;
      unsigned mask = op_table[ni.op].attrs;
      if (!(mask & ATTR_AXIS)) at.axis = 3;
      if (!(mask & ATTR_START)) at.start = 11;
      if (!(mask & ATTR_LENGTH)) at.length = 12;
      if (!(mask & ATTR_BEFORE)) at.before = 13;
      if (!(mask & ATTR_AFTER)) at.after = 14;
      if (!(mask & ATTR_EXTENT)) at.extent = 15;
      if (!(mask & ATTR_SIZE)) at.size = 16;
      if (!(mask & ATTR_STEP)) at.step = 17;
      if (!(mask & ATTR_DILATION)) at.dilation = 18;
      if (!(mask & ATTR_P)) at.p = 3.25;
      if (!(mask & ATTR_PERM)) at.perm = junk_perm;
      if (!(mask & ATTR_TARGET)) {
        at.target_rank = 3;
        at.target = junk_target;
      }
      if (!(mask & ATTR_TENSOR)) at.tensor = junk;
      topos_value in[64];
      ck_assert_int_le(ni.nin, 64);
      for (int k = 0; k < ni.nin; k++) in[k] = vals[ni.operands[k]];
      vals[i] = topos_record(tape, ni.op, in, ni.nin, &at);
      if (ni.name) vals[i] = topos_name(tape, vals[i], ni.name);
      ck_assert_msg(topos_value_ok(vals[i]), "%s", topos_tape_error(tape));
    }
    free(vals);
    topos_error err = {0};
    topos_network *back = topos_tape_seal(tape, &err);
    ck_assert_msg(back != NULL, "%s", err.message);
    char a[65], b[65];
    ck_assert_int_eq(topos_network_id(net, a, NULL), TOPOS_OK);
    ck_assert_int_eq(topos_network_id(back, b, NULL), TOPOS_OK);
    ck_assert_str_eq(a, b);
    for (int i = 0; i < n; i++) {
      topos_node_info x = node_info(net, i), y = node_info(back, i);
      unsigned mask = op_table[x.op].attrs;
      const char *op = op_table[x.op].name;
      for (int bit = 0; bit < ATTR_BIT_COUNT; bit++) {
        int64_t vx = 0, vy = 0;
        if (!info_int(&x, (attr_bit)bit, &vx)) continue;
        info_int(&y, (attr_bit)bit, &vy);
        ck_assert_msg(vx == vy, "node %d (%s): %s %lld vs %lld", i, op,
                      doc_names[bit], (long long)vx, (long long)vy);
        if (!(mask & 1u << bit) && bit != ATTR_BIT_SLOT)
          ck_assert_msg(vy == 0, "node %d (%s) kept %s = %lld", i, op,
                        doc_names[bit], (long long)vy);
      }
      ck_assert(memcmp(&x.p, &y.p, sizeof x.p) == 0);
      if (!(mask & ATTR_P)) ck_assert(y.p == 0);
      for (int k = 0; k < TOPOS_MAX_RANK; k++) {
        ck_assert_int_eq(x.perm[k], y.perm[k]);
        if (!(mask & ATTR_PERM)) ck_assert_int_eq(y.perm[k], 0);
      }
      ck_assert_int_eq(x.target_rank, y.target_rank);
      if (!(mask & ATTR_TARGET)) ck_assert_int_eq(y.target_rank, 0);
      if (!(mask & ATTR_TENSOR)) ck_assert_ptr_null(y.tensor);
    }
    topos_network_release(back);
    topos_network_release(net);
  }
  topos_tensor_release(junk);
}
END_TEST

Suite *ops_suite(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("list");
  tcase_add_test(tc, names_round_trip);
  tcase_add_test(tc, entries_are_consistent);
  tcase_add_test(tc, every_op_sample_covers_the_list);
  tcase_add_test(tc, families_hold_on_the_samples);
  tcase_add_test(tc, encoding_carries_exactly_the_mask);
  tcase_add_test(tc, describe_lists_the_mask);
  tcase_add_test(tc, only_read_attributes_are_kept);
  suite_add_tcase(s, tc);
  return s;
}
