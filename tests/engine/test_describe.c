/*
 * test_describe.c - topos_network_describe (engine/describe.c) in its three
 * formats: the text form byte for byte against listings captured before
 * JSON and DOT were added; JSON parsed back with cJSON and compared field
 * by field with every node; DOT's node and edge statements; escaping of
 * names in both; big integers and exponents; bad arguments.
 */
#include <cJSON.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "sample_nets.h"
#include "testutil.h"

static char *describe(const topos_network *net, topos_format format) {
  topos_error err = {0};
  char *s = topos_network_describe(net, format, &err);
  ck_assert_msg(s != NULL, "describe: %s", err.message);
  return s;
}

/* A network of one f32[2] constant c named `name` and neg(c). */
static topos_network *named(const char *name) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *z = topos_tensor_zeros(TOPOS_F32, 1, SN_S(2), NULL);
  topos_value c = topos_name(t, topos_constant(t, z), name);
  topos_neg(t, c);
  topos_tensor_release(z);
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  return net;
}

static int count_of(const char *text, const char *part) {
  int n = 0;
  for (const char *p = strstr(text, part); p; p = strstr(p + 1, part)) n++;
  return n;
}

/* ------------------------------------------------------------------ text */

/* Captured from the text describe before JSON and DOT were added: the
 * text form must not change. */
static const char every_op_text[] =
    "   0  p      parameter                         f32[2,3]            "
    "parameter 0\n"
    "   1  x      input                             f32[2,3]            input "
    "0\n"
    "   2  -      constant                          f32[2,3]            "
    "constant\n"
    "   3  -      constant                          bf16[3]             "
    "constant\n"
    "   4  idx    constant                          i32[4]              "
    "constant\n"
    "   5  -      constant                          f32[]               "
    "constant\n"
    "   6  -      add(%0, %1)                       f32[2,3]\n"
    "   7  -      sub(%6, %2)                       f32[2,3]\n"
    "   8  -      mul(%7, %0)                       f32[2,3]\n"
    "   9  -      div(%8, %0)                       f32[2,3]\n"
    "  10  -      neg(%9)                           f32[2,3]\n"
    "  11  -      exp(%10)                          f32[2,3]\n"
    "  12  log p  log(%0)                           f32[2,3]\n"
    "  13  -      sqrt(%0)                          f32[2,3]\n"
    "  14  -      tanh(%1)                          f32[2,3]\n"
    "  15  -      pow(%0) p=1.5                     f32[2,3]\n"
    "  16  -      maximum(%12, %14)                 f32[2,3]\n"
    "  17  -      step(%13, %15)                    f32[2,3]\n"
    "  18  -      relu(%16)                         f32[2,3]\n"
    "  19  -      transpose(%1)                     f32[3,2]\n"
    "  20  -      matmul(%0, %19)                   f32[2,2]\n"
    "  21  -      permute(%11) perm=[1,0]           f32[3,2]\n"
    "  22  -      reshape(%21) shape=[6]            f32[6]\n"
    "  23  -      narrow(%18) axis=1 start=1 length=2  f32[2,2]\n"
    "  24  -      pad(%23) axis=1 before=1 after=0  f32[2,3]\n"
    "  25  -      unfold(%24) axis=1 size=2 step=1 dilation=1  f32[2,2,2]\n"
    "  26  -      fold(%25) extent=3 axis=1 size=2 step=1 dilation=1  "
    "f32[2,3]\n"
    "  27  -      concat(%26, %17, %16) axis=0      f32[6,3]\n"
    "  28  -      broadcast(%5) shape=[6,3]         f32[6,3]\n"
    "  29  -      broadcast_along(%3) axis=0 extent=6  bf16[6,3]           "
    "output\n"
    "  30  -      broadcast_along(%22) axis=0 extent=2  f32[2,6]\n"
    "  31  -      mul(%27, %28)                     f32[6,3]\n"
    "  32  -      sum_along(%31) axis=1             f32[6]\n"
    "  33  -      max_along(%27) axis=0             f32[3]\n"
    "  34  -      log_softmax(%27) axis=1           f32[6,3]\n"
    "  35  -      logsumexp(%34) axis=1             f32[6]\n"
    "  36  -      gather(%20, %4)                   f32[4,2]\n"
    "  37  -      scatter(%36, %4) extent=3         f32[3,2]\n"
    "  38  -      sum(%37)                          f32[]\n"
    "  39  -      sum(%30)                          f32[]\n"
    "  40  -      add(%38, %39)                     f32[]\n"
    "  41  -      sum(%32)                          f32[]\n"
    "  42  -      add(%40, %41)                     f32[]\n"
    "  43  -      sum(%33)                          f32[]\n"
    "  44  -      add(%42, %43)                     f32[]\n"
    "  45  -      sum(%35)                          f32[]\n"
    "  46  -      add(%44, %45)                     f32[]\n"
    "  47  -      erf(%1)                           f32[2,3]\n"
    "  48  -      sum(%47)                          f32[]\n"
    "  49  total  add(%46, %48)                     f32[]               "
    "output\n";

static const char gradient_descent_text[] =
    "   0  w     parameter                         f64[]               "
    "parameter 0\n"
    "   1  x     input                             f64[]               input "
    "0\n"
    "   2  y     input                             f64[]               input "
    "1\n"
    "   3  -     mul(%0, %1)                       f64[]\n"
    "   4  -     sub(%3, %2)                       f64[]\n"
    "   5  loss  mul(%4, %4)                       f64[]               "
    "output\n";

START_TEST(text_is_unchanged) {
  topos_network *net = sn_every_op();
  char *s = describe(net, TOPOS_FORMAT_TEXT);
  ck_assert_str_eq(s, every_op_text);
  topos_free(s);
  topos_network_release(net);
  net = sn_gradient_descent();
  s = describe(net, TOPOS_FORMAT_TEXT);
  ck_assert_str_eq(s, gradient_descent_text);
  topos_free(s);
  topos_network_release(net);
}
END_TEST

START_TEST(empty_network) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(topos_tape_new(TOPOS_F64), &err);
  ck_assert_ptr_nonnull(net);
  char *s = describe(net, TOPOS_FORMAT_TEXT);
  ck_assert_str_eq(s, "");
  topos_free(s);
  s = describe(net, TOPOS_FORMAT_JSON);
  cJSON *j = cJSON_Parse(s);
  ck_assert_ptr_nonnull(j);
  ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "nodes")), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(j, "dtype")->valuestring, "f64");
  cJSON_Delete(j);
  topos_free(s);
  s = describe(net, TOPOS_FORMAT_DOT);
  ck_assert_int_eq(count_of(s, "->"), 0);
  ck_assert_int_eq(count_of(s, "label"), 0);
  topos_free(s);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------------ JSON */

static int64_t json_int64(const cJSON *item) {
  ck_assert_msg(cJSON_IsNumber(item), "not a number");
  return (int64_t)item->valuedouble;
}

static void expect_int(const cJSON *obj, const char *key, int64_t want) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  ck_assert_msg(item != NULL, "no \"%s\"", key);
  ck_assert_msg(json_int64(item) == want, "\"%s\" is %lld, want %lld", key,
                (long long)json_int64(item), (long long)want);
}

static void expect_int_array(const cJSON *arr, int n, const int64_t *want,
                             const char *what, int node) {
  ck_assert_msg(cJSON_IsArray(arr), "node %d: %s is not an array", node, what);
  ck_assert_msg(cJSON_GetArraySize(arr) == n,
                "node %d: %s has %d entries, "
                "want %d",
                node, what, cJSON_GetArraySize(arr), n);
  for (int i = 0; i < n; i++)
    ck_assert_msg(json_int64(cJSON_GetArrayItem(arr, i)) == want[i],
                  "node %d: %s[%d] differs", node, what, i);
}

/* The attrs object holds exactly what the op reads. */
static void expect_attrs(const cJSON *attrs, const node *n, int i) {
  const node_attrs *a = &n->at;
  ck_assert_msg(cJSON_IsObject(attrs), "node %d: attrs is not an object", i);
  int keys = cJSON_GetArraySize(attrs);
  int64_t v[TOPOS_MAX_RANK];
  switch (n->op) {
    case OP_POW:
      ck_assert_int_eq(keys, 1);
      ck_assert(cJSON_GetObjectItem(attrs, "p")->valuedouble == a->p);
      break;
    case OP_PERMUTE:
      ck_assert_int_eq(keys, 1);
      for (int k = 0; k < n->meta.rank; k++) v[k] = a->perm[k];
      expect_int_array(cJSON_GetObjectItem(attrs, "perm"), n->meta.rank, v,
                       "perm", i);
      break;
    case OP_RESHAPE:
    case OP_BROADCAST:
      ck_assert_int_eq(keys, 1);
      expect_int_array(cJSON_GetObjectItem(attrs, "shape"), a->rank, a->shape,
                       "shape", i);
      break;
    case OP_NARROW:
      ck_assert_int_eq(keys, 3);
      expect_int(attrs, "axis", a->axis);
      expect_int(attrs, "start", a->start);
      expect_int(attrs, "length", a->length);
      break;
    case OP_PAD:
      ck_assert_int_eq(keys, 3);
      expect_int(attrs, "axis", a->axis);
      expect_int(attrs, "before", a->before);
      expect_int(attrs, "after", a->after);
      break;
    case OP_FOLD:
    case OP_UNFOLD:
      ck_assert_int_eq(keys, n->op == OP_FOLD ? 5 : 4);
      if (n->op == OP_FOLD) expect_int(attrs, "extent", a->extent);
      expect_int(attrs, "axis", a->axis);
      expect_int(attrs, "size", a->size);
      expect_int(attrs, "step", a->step);
      expect_int(attrs, "dilation", a->dilation);
      break;
    case OP_CONCAT:
    case OP_SUM_ALONG:
    case OP_MAX_ALONG:
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      ck_assert_int_eq(keys, 1);
      expect_int(attrs, "axis", a->axis);
      break;
    case OP_BROADCAST_ALONG:
      ck_assert_int_eq(keys, 2);
      expect_int(attrs, "axis", a->axis);
      expect_int(attrs, "extent", a->extent);
      break;
    case OP_SCATTER:
      ck_assert_int_eq(keys, 1);
      expect_int(attrs, "extent", a->extent);
      break;
    default:
      ck_assert_msg(keys == 0, "node %d (%s) has %d attrs", i,
                    op_table[n->op].name, keys);
      break;
  }
}

/* Every field of every node against the network itself. */
static void expect_json_matches(const topos_network *net) {
  char *s = describe(net, TOPOS_FORMAT_JSON);
  cJSON *root = cJSON_Parse(s);
  ck_assert_msg(root != NULL, "JSON does not parse: %s", s);
  ck_assert_int_eq(cJSON_GetArraySize(root), 4);
  expect_int(root, "parameters", net->nparams);
  expect_int(root, "inputs", net->ninputs);
  ck_assert_str_eq(cJSON_GetObjectItem(root, "dtype")->valuestring,
                   topos_dtype_name(net->dtype));
  const cJSON *nodes = cJSON_GetObjectItem(root, "nodes");
  ck_assert(cJSON_IsArray(nodes));
  ck_assert_int_eq(cJSON_GetArraySize(nodes), net->n);
  bool *used = calloc((size_t)net->n + 1, 1);
  for (int i = 0; i < net->n; i++)
    for (int k = 0; k < net->nodes[i].nin; k++) used[net->nodes[i].in[k]] = 1;
  int outputs = 0;
  for (int i = 0; i < net->n; i++) {
    const node *n = &net->nodes[i];
    const cJSON *j = cJSON_GetArrayItem(nodes, i);
    expect_int(j, "index", i);
    const cJSON *name = cJSON_GetObjectItem(j, "name");
    ck_assert_ptr_nonnull(name);
    if (n->name)
      ck_assert_str_eq(name->valuestring, n->name);
    else
      ck_assert_msg(cJSON_IsNull(name), "node %d: name is not null", i);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "op")->valuestring,
                     op_table[n->op].name);
    int64_t in[64];
    ck_assert_int_le(n->nin, 64);
    for (int k = 0; k < n->nin; k++) in[k] = n->in[k];
    expect_int_array(cJSON_GetObjectItem(j, "operands"), n->nin, in, "operands",
                     i);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "dtype")->valuestring,
                     topos_dtype_name(n->meta.dtype));
    expect_int_array(cJSON_GetObjectItem(j, "shape"), n->meta.rank,
                     n->meta.shape, "shape", i);
    const char *role = n->op == OP_PARAMETER  ? "parameter"
                       : n->op == OP_INPUT    ? "input"
                       : n->op == OP_CONSTANT ? "constant"
                       : used[i]              ? "value"
                                              : "output";
    outputs += strcmp(role, "output") == 0;
    ck_assert_str_eq(cJSON_GetObjectItem(j, "role")->valuestring, role);
    const cJSON *slot = cJSON_GetObjectItem(j, "slot");
    if (n->op == OP_PARAMETER || n->op == OP_INPUT)
      expect_int(j, "slot", n->at.slot);
    else
      ck_assert_msg(slot == NULL, "node %d has a slot", i);
    expect_attrs(cJSON_GetObjectItem(j, "attrs"), n, i);
  }
  ck_assert_int_gt(outputs, 0);
  free(used);
  cJSON_Delete(root);
  topos_free(s);
}

START_TEST(json_every_node) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    ck_assert_ptr_nonnull(net);
    expect_json_matches(net);
    topos_network_release(net);
  }
}
END_TEST

/* Integers past 2^53 stay exact; exponents keep every bit. */
START_TEST(json_numbers_are_exact) {
  const int64_t big = ((int64_t)1 << 60) + 1;
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_value s = topos_scalar(t, 1.0);
  topos_value b = topos_broadcast(t, s, 2, SN_S(0, big));
  topos_value p = topos_pow(t, s, 0.1);
  topos_value q = topos_pow(t, p, -1.0 / 3.0);
  topos_pow(t, q, INFINITY);
  topos_pow(t, q, -0.0);
  (void)b;
  topos_error err = {0};
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  char *text = describe(net, TOPOS_FORMAT_JSON);
  ck_assert_msg(strstr(text, "[0,1152921504606846977]") != NULL,
                "shape not exact: %s", text);
  ck_assert_msg(strstr(text, "{\"p\":0.1}") != NULL, "%s", text);
  ck_assert_msg(strstr(text, "{\"p\":\"inf\"}") != NULL, "%s", text);
  ck_assert_msg(strstr(text, "{\"p\":-0}") != NULL, "%s", text);
  cJSON *root = cJSON_Parse(text);
  ck_assert_ptr_nonnull(root);
  const cJSON *nodes = cJSON_GetObjectItem(root, "nodes");
  const cJSON *third = cJSON_GetObjectItem(
      cJSON_GetObjectItem(cJSON_GetArrayItem(nodes, 3), "attrs"), "p");
  ck_assert(third->valuedouble == -1.0 / 3.0);
  cJSON_Delete(root);
  topos_free(text);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------------- DOT */

START_TEST(dot_nodes_and_edges) {
  for (int s = 0; s < SN_NSAMPLES; s++) {
    topos_network *net = sn_samples[s].build();
    char *text = describe(net, TOPOS_FORMAT_DOT);
    ck_assert_msg(strncmp(text, "digraph topos {\n", 16) == 0, "%s", text);
    size_t len = strlen(text);
    ck_assert(len > 2 && strcmp(text + len - 2, "}\n") == 0);
    int edges = 0;
    for (int i = 0; i < net->n; i++) {
      char stmt[64];
      snprintf(stmt, sizeof stmt, "\n  n%d [label=\"%%%d", i, i);
      ck_assert_msg(count_of(text, stmt) == 1, "node %d: %d statements", i,
                    count_of(text, stmt));
      for (int k = 0; k < net->nodes[i].nin; k++) {
        snprintf(stmt, sizeof stmt, "\n  n%d -> n%d [label=\"%d\"];\n",
                 net->nodes[i].in[k], i, k);
        ck_assert_msg(strstr(text, stmt) != NULL, "no edge %s", stmt + 1);
        edges++;
      }
    }
    ck_assert_int_eq(count_of(text, " [label="), net->n + edges);
    ck_assert_int_eq(count_of(text, " -> "), edges);
    /* One statement per line: header, node defaults, nodes, edges, end. */
    ck_assert_int_eq(count_of(text, "\n"), 3 + net->n + edges);
    topos_free(text);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(dot_labels) {
  topos_network *net = sn_gradient_descent();
  char *text = describe(net, TOPOS_FORMAT_DOT);
  ck_assert_msg(strstr(text,
                       "  n0 [label=\"%0 w\\nparameter 0\\nf64[]\", "
                       "shape=ellipse];\n") != NULL,
                "%s", text);
  ck_assert_msg(strstr(text,
                       "  n5 [label=\"%5 loss\\nmul\\nf64[]\", "
                       "peripheries=2];\n") != NULL,
                "%s", text);
  ck_assert_msg(strstr(text, "  n3 [label=\"%3\\nmul\\nf64[]\"];\n") != NULL,
                "%s", text);
  topos_free(text);
  topos_network_release(net);
  net = sn_every_op();
  text = describe(net, TOPOS_FORMAT_DOT);
  ck_assert_msg(
      strstr(text, "narrow axis=1 start=1 length=2\\nf32[2,2]") != NULL, "%s",
      text);
  topos_free(text);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------- escaping */

START_TEST(names_are_escaped) {
  const char *name = "say \"hi\" \\ back\nline\ttab\x01 end";
  topos_network *net = named(name);
  char *json = describe(net, TOPOS_FORMAT_JSON);
  cJSON *root = cJSON_Parse(json);
  ck_assert_msg(root != NULL, "JSON does not parse: %s", json);
  const cJSON *n0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "nodes"), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(n0, "name")->valuestring, name);
  for (const char *p = json; *p; p++)
    ck_assert_msg((unsigned char)*p >= 0x20, "raw control byte in JSON");
  cJSON_Delete(root);
  topos_free(json);

  char *dot = describe(net, TOPOS_FORMAT_DOT);
  ck_assert_msg(strstr(dot,
                       "%0 say \\\"hi\\\" \\\\ back\\\\nline\\\\ttab\\\\x01 end"
                       "\\nconstant") != NULL,
                "%s", dot);
  for (const char *p = dot; *p; p++)
    ck_assert_msg((unsigned char)*p >= 0x20 || *p == '\n',
                  "raw control byte in DOT");
  /* The name did not add lines: header, defaults, 2 nodes, 1 edge, end. */
  ck_assert_int_eq(count_of(dot, "\n"), 6);
  topos_free(dot);
  topos_network_release(net);
}
END_TEST

/* A name that is not UTF-8 cannot be recorded (topos_name), so every
 * format is UTF-8; valid multi-byte names pass through byte for byte. */
START_TEST(names_invalid_utf8) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_tensor *z = topos_tensor_zeros(TOPOS_F32, 1, SN_S(2), NULL);
  topos_value c = topos_constant(t, z);
  topos_tensor_release(z);
  ck_assert(!topos_value_ok(topos_name(t, c, "caf\xC3\xA9 \xFF\xC0\xAF!")));
  ck_assert_ptr_nonnull(strstr(topos_tape_error(t), "not valid UTF-8"));
  topos_tape_free(t);
  topos_network *net = named("caf\xC3\xA9 \xCE\xBB_\xE6\x8D\x9F!");
  char *json = describe(net, TOPOS_FORMAT_JSON);
  cJSON *root = cJSON_Parse(json);
  ck_assert_ptr_nonnull(root);
  const cJSON *n0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "nodes"), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(n0, "name")->valuestring,
                   "caf\xC3\xA9 \xCE\xBB_\xE6\x8D\x9F!");
  cJSON_Delete(root);
  topos_free(json);
  char *dot = describe(net, TOPOS_FORMAT_DOT);
  ck_assert_ptr_nonnull(strstr(dot, "caf\xC3\xA9 \xCE\xBB_\xE6\x8D\x9F!"));
  topos_free(dot);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------- arguments */

START_TEST(bad_arguments) {
  topos_error err = {0};
  topos_network *net = sn_gradient_descent();
  const int bad[] = {3, -1, 1000};
  for (int i = 0; i < 3; i++) {
    err = (topos_error){0};
    ck_assert_ptr_null(topos_network_describe(net, (topos_format)bad[i], &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "unknown format"));
  }
  ck_assert_ptr_null(topos_network_describe(net, (topos_format)7, NULL));
  for (int f = TOPOS_FORMAT_TEXT; f <= TOPOS_FORMAT_DOT; f++) {
    err = (topos_error){0};
    ck_assert_ptr_null(topos_network_describe(NULL, (topos_format)f, &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "NULL"));
  }
  topos_network_release(net);
}
END_TEST

Suite *describe_suite(void) {
  Suite *s = suite_create("describe");
  TCase *tc = tcase_create("formats");
  tcase_add_test(tc, text_is_unchanged);
  tcase_add_test(tc, empty_network);
  tcase_add_test(tc, json_every_node);
  tcase_add_test(tc, json_numbers_are_exact);
  tcase_add_test(tc, dot_nodes_and_edges);
  tcase_add_test(tc, dot_labels);
  tcase_add_test(tc, names_are_escaped);
  tcase_add_test(tc, names_invalid_utf8);
  tcase_add_test(tc, bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}
