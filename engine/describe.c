/*
 * describe.c - listings of a sealed network: text, JSON and Graphviz DOT.
 *
 * The text form prints one line per node: index, name, op with operands
 * and attributes, dtype and shape, and role (parameter/input slot,
 * constant, or output for a value nothing consumes).  JSON and DOT carry
 * the same facts for programs and for drawing:
 *
 *   JSON  {"nodes": [{"index", "name" (null when none), "op",
 *          "operands": [...], "dtype", "shape": [...], "role",
 *          "slot" (parameters and inputs), "attrs": {...}}, ...],
 *          "parameters": N, "inputs": M, "dtype": tape dtype}
 *         role is "parameter", "input", "constant", "output" (nothing
 *         consumes it) or "value".  attrs holds what the op reads, under
 *         the names of docs/encoding.md.  Integers are written as exact
 *         decimal numbers (even past 2^53); pow's exponent as the shortest
 *         decimal that reads back to the same double, or the string "inf"
 *         / "-inf".
 *   DOT   digraph topos { one box per node labelled index and name, op
 *         and attributes, dtype and shape; one edge per operand, from the
 *         operand to its consumer, labelled with the operand position }.
 *
 * Names are escaped for each format: JSON through cJSON (quotes,
 * backslashes, control characters), DOT by hand (a quote or a backslash
 * gets a backslash; a control character is shown as a visible escape,
 * backslash-n, backslash-t or backslash-xNN, never as a raw byte or a
 * label line break).  Names are UTF-8 without NUL by construction
 * (topos_name and the canonical decoding check them with engine/utf8.c),
 * so the output is always valid UTF-8.  Every form is a read of the
 * immutable network; nothing it allocates outlives the call but the
 * returned string.
 */
#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The attribute names describe prints (ops.h's TOPOS_ATTRS, which are
 * also docs/encoding.md's). */
static const char *const attr_names[ATTR_BIT_COUNT] = {
#define ATTR_NAME(NAME, field) [ATTR_BIT_##NAME] = #field,
    TOPOS_ATTRS(ATTR_NAME)
#undef ATTR_NAME
};

/* The attributes a listing shows: what the op reads, except a leaf's slot
 * (shown as its role) and its tensor (the values are not listed). */
static unsigned listed_attrs(const node *n) {
  return op_table[n->op].attrs & ~(unsigned)(ATTR_SLOT | ATTR_TENSOR);
}

/* The value of an integer attribute; false for the others. */
static bool attr_int(const node_attrs *a, attr_bit bit, int64_t *v) {
  switch (bit) {
    case ATTR_BIT_SLOT:
      *v = a->slot;
      return true;
    case ATTR_BIT_AXIS:
      *v = a->axis;
      return true;
    case ATTR_BIT_START:
      *v = a->start;
      return true;
    case ATTR_BIT_LENGTH:
      *v = a->length;
      return true;
    case ATTR_BIT_BEFORE:
      *v = a->before;
      return true;
    case ATTR_BIT_AFTER:
      *v = a->after;
      return true;
    case ATTR_BIT_EXTENT:
      *v = a->extent;
      return true;
    case ATTR_BIT_SIZE:
      *v = a->size;
      return true;
    case ATTR_BIT_STEP:
      *v = a->step;
      return true;
    case ATTR_BIT_DILATION:
      *v = a->dilation;
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

/* One attribute as text: " name=value". */
static void attr_text(text *t, const node *n, attr_bit bit) {
  const node_attrs *a = &n->at;
  const char *name = attr_names[bit];
  char s[SHAPE_TEXT];
  int64_t v;
  if (attr_int(a, bit, &v)) {
    text_add(t, " %s=%lld", name, (long long)v);
  } else if (bit == ATTR_BIT_P) {
    text_add(t, " %s=%.17g", name, a->p);
  } else if (bit == ATTR_BIT_PERM) {
    text_add(t, " %s=[", name);
    for (int i = 0; i < n->meta.rank; i++)
      text_add(t, "%s%d", i ? "," : "", a->perm[i]);
    text_add(t, "]");
  } else if (bit == ATTR_BIT_TARGET) {
    text_add(t, " %s=%s", name, shape_text(s, a->rank, a->shape));
  }
}

/* The listed attributes in TOPOS_ATTRS order, as the encoding writes
 * them.  One exception: text and DOT have printed fold's extent first
 * since before the op list existed, and the text form is pinned
 * (test_describe.c), so fold keeps that order there; JSON, whose keys are
 * named, follows the list. */
static void attrs_text(text *t, const node *n) {
  unsigned mask = listed_attrs(n);
  if (n->op == OP_FOLD) {
    attr_text(t, n, ATTR_BIT_EXTENT);
    mask &= ~(unsigned)ATTR_EXTENT;
  }
  for (int bit = 0; bit < ATTR_BIT_COUNT; bit++)
    if (mask & 1u << bit) attr_text(t, n, (attr_bit)bit);
}

static char *describe_text(const topos_network *net, topos_error *err) {
  bool *used = calloc((size_t)net->n + 1, sizeof(bool));
  if (!used) {
    error_set(err, TOPOS_ERR_MEMORY, "describe: out of memory");
    return NULL;
  }
  int name_width = 1;
  for (int i = 0; i < net->n; i++) {
    for (int j = 0; j < net->nodes[i].nin; j++) used[net->nodes[i].in[j]] = 1;
    if (net->nodes[i].name) {
      int len = (int)strlen(net->nodes[i].name);
      if (len > name_width) name_width = len;
    }
  }
  text t = {0};
  for (int i = 0; i < net->n; i++) {
    const node *n = &net->nodes[i];
    text op = {0};
    text_add(&op, "%s", op_table[n->op].name);
    if (n->nin) {
      text_add(&op, "(");
      for (int j = 0; j < n->nin; j++)
        text_add(&op, "%s%%%d", j ? ", " : "", n->in[j]);
      text_add(&op, ")");
    }
    attrs_text(&op, n);
    char mt[SHAPE_TEXT + 8];
    text_add(&t, "%4d  %-*s  %-32s  %-18s", i, name_width,
             n->name ? n->name : "-", op.failed ? "?" : op.s,
             meta_text(mt, &n->meta));
    free(op.s);
    if (n->op == OP_PARAMETER)
      text_add(&t, "  parameter %d", n->at.slot);
    else if (n->op == OP_INPUT)
      text_add(&t, "  input %d", n->at.slot);
    else if (n->op == OP_CONSTANT)
      text_add(&t, "  constant");
    else if (!used[i])
      text_add(&t, "  output");
    /* Trim the padding of lines without a role. */
    while (t.s && t.len > 0 && t.s[t.len - 1] == ' ') t.s[--t.len] = '\0';
    text_add(&t, "\n");
  }
  free(used);
  /* A network without nodes lists as the empty string. */
  if (!t.failed && !t.s) text_add(&t, "%s", "");
  return text_finish(&t, "describe", err);
}

/* ------------------------------------------------------- shared facts */

/* Per node: does a later node consume it (new array, or NULL). */
static bool *consumed(const topos_network *net) {
  bool *used = calloc((size_t)net->n + 1, sizeof(bool));
  if (!used) return NULL;
  for (int i = 0; i < net->n; i++)
    for (int j = 0; j < net->nodes[i].nin; j++) used[net->nodes[i].in[j]] = 1;
  return used;
}

static const char *role_of(const node *n, bool used) {
  switch (n->op) {
    case OP_PARAMETER:
      return "parameter";
    case OP_INPUT:
      return "input";
    case OP_CONSTANT:
      return "constant";
    default:
      return used ? "value" : "output";
  }
}

/* ------------------------------------------------------------------ JSON */

/* cJSON reports allocation failures by returning NULL; the builder
 * remembers the first one so the caller checks once. */
typedef struct json_out {
  bool failed;
} json_out;

static void json_add(json_out *o, cJSON *parent, const char *key, cJSON *item) {
  if (!item) {
    o->failed = true;
    return;
  }
  if (key ? !cJSON_AddItemToObject(parent, key, item)
          : !cJSON_AddItemToArray(parent, item)) {
    cJSON_Delete(item);
    o->failed = true;
  }
}

/* An int64 as exact decimal digits (a double would round past 2^53). */
static cJSON *json_int(int64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%lld", (long long)v);
  return cJSON_CreateRaw(buf);
}

/* A double as the shortest %.Ng that reads back to the same bits;
 * JSON has no infinities, so those are strings. */
static cJSON *json_double(double v) {
  if (isnan(v)) return cJSON_CreateString("nan");
  if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
  char buf[32];
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) break;
  }
  return cJSON_CreateRaw(buf);
}

static cJSON *json_shape(json_out *o, int rank, const int64_t *shape) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < rank; i++) json_add(o, a, NULL, json_int(shape[i]));
  return a;
}

static cJSON *json_name(const char *name) {
  return name ? cJSON_CreateString(name) : cJSON_CreateNull();
}

/* The listed attributes, in TOPOS_ATTRS order, under their names. */
static cJSON *json_attrs(json_out *o, const node *n) {
  const node_attrs *a = &n->at;
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  unsigned mask = listed_attrs(n);
  for (int b = 0; b < ATTR_BIT_COUNT; b++) {
    if (!(mask & 1u << b)) continue;
    attr_bit bit = (attr_bit)b;
    const char *name = attr_names[bit];
    int64_t v;
    if (attr_int(a, bit, &v)) {
      json_add(o, j, name, json_int(v));
    } else if (bit == ATTR_BIT_P) {
      json_add(o, j, name, json_double(a->p));
    } else if (bit == ATTR_BIT_PERM) {
      cJSON *perm = cJSON_CreateArray();
      for (int i = 0; perm && i < n->meta.rank; i++)
        json_add(o, perm, NULL, json_int(a->perm[i]));
      json_add(o, j, name, perm);
    } else if (bit == ATTR_BIT_TARGET) {
      json_add(o, j, name, json_shape(o, a->rank, a->shape));
    }
  }
  return j;
}

static char *describe_json(const topos_network *net, topos_error *err) {
  bool *used = consumed(net);
  cJSON *root = cJSON_CreateObject();
  json_out o = {!used || !root};
  cJSON *nodes = cJSON_CreateArray();
  json_add(&o, root, "nodes", nodes);
  for (int i = 0; !o.failed && i < net->n; i++) {
    const node *n = &net->nodes[i];
    cJSON *j = cJSON_CreateObject();
    json_add(&o, nodes, NULL, j);
    if (o.failed) break;
    json_add(&o, j, "index", json_int(i));
    json_add(&o, j, "name", json_name(n->name));
    json_add(&o, j, "op", cJSON_CreateString(op_table[n->op].name));
    cJSON *operands = cJSON_CreateArray();
    for (int k = 0; operands && k < n->nin; k++)
      json_add(&o, operands, NULL, json_int(n->in[k]));
    json_add(&o, j, "operands", operands);
    json_add(&o, j, "dtype",
             cJSON_CreateString(topos_dtype_name(n->meta.dtype)));
    json_add(&o, j, "shape", json_shape(&o, n->meta.rank, n->meta.shape));
    json_add(&o, j, "role", cJSON_CreateString(role_of(n, used[i])));
    if (n->op == OP_PARAMETER || n->op == OP_INPUT)
      json_add(&o, j, "slot", json_int(n->at.slot));
    json_add(&o, j, "attrs", json_attrs(&o, n));
  }
  if (!o.failed) {
    json_add(&o, root, "parameters", json_int(net->nparams));
    json_add(&o, root, "inputs", json_int(net->ninputs));
    json_add(&o, root, "dtype",
             cJSON_CreateString(topos_dtype_name(net->dtype)));
  }
  char *printed = o.failed ? NULL : cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  free(used);
  if (!printed) {
    error_set(err, TOPOS_ERR_MEMORY, "describe: out of memory");
    return NULL;
  }
  /* Callers free the result with topos_free (free), while cJSON's string
   * comes from whatever allocator an application hooked into cJSON: hand
   * back a copy. */
  char *s = strdup(printed);
  cJSON_free(printed);
  if (!s) error_set(err, TOPOS_ERR_MEMORY, "describe: out of memory");
  return s;
}

/* ------------------------------------------------------------------- DOT */

/* Appends s inside a DOT double-quoted string: quotes and backslashes
 * escaped, control characters shown as visible escapes (a raw newline
 * would be a line break, \n a centred one); other bytes as they are. */
static void dot_escaped(text *t, const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; u[i];) {
    unsigned c = u[i];
    if (c == '"' || c == '\\') {
      text_add(t, "\\%c", (char)c);
      i++;
    } else if (c == '\n') {
      text_add(t, "\\\\n");
      i++;
    } else if (c == '\t') {
      text_add(t, "\\\\t");
      i++;
    } else if (c < 0x20 || c == 0x7F) {
      text_add(t, "\\\\x%02x", c);
      i++;
    } else {
      text_add(t, "%c", (char)c);
      i++;
    }
  }
}

static char *describe_dot(const topos_network *net, topos_error *err) {
  bool *used = consumed(net);
  if (!used) {
    error_set(err, TOPOS_ERR_MEMORY, "describe: out of memory");
    return NULL;
  }
  text t = {0};
  text_add(&t,
           "digraph topos {\n"
           "  node [shape=box, fontname=\"monospace\"];\n");
  for (int i = 0; i < net->n; i++) {
    const node *n = &net->nodes[i];
    char mt[SHAPE_TEXT + 8];
    text_add(&t, "  n%d [label=\"%%%d", i, i);
    if (n->name) {
      text_add(&t, " ");
      dot_escaped(&t, n->name);
    }
    text_add(&t, "\\n%s", op_table[n->op].name);
    if (n->op == OP_PARAMETER || n->op == OP_INPUT)
      text_add(&t, " %d", n->at.slot);
    attrs_text(&t, n);
    text_add(&t, "\\n%s\"", meta_text(mt, &n->meta));
    const char *role = role_of(n, used[i]);
    if (n->op == OP_PARAMETER || n->op == OP_INPUT || n->op == OP_CONSTANT)
      text_add(&t, ", shape=ellipse");
    else if (strcmp(role, "output") == 0)
      text_add(&t, ", peripheries=2");
    text_add(&t, "];\n");
  }
  for (int i = 0; i < net->n; i++)
    for (int k = 0; k < net->nodes[i].nin; k++)
      text_add(&t, "  n%d -> n%d [label=\"%d\"];\n", net->nodes[i].in[k], i, k);
  text_add(&t, "}\n");
  free(used);
  return text_finish(&t, "describe", err);
}

char *topos_network_describe(const topos_network *net, topos_format format,
                             topos_error *err) {
  if (!net) {
    error_set(err, TOPOS_ERR_ARGUMENT, "describe: network is NULL");
    return NULL;
  }
  switch (format) {
    case TOPOS_FORMAT_TEXT:
      return describe_text(net, err);
    case TOPOS_FORMAT_JSON:
      return describe_json(net, err);
    case TOPOS_FORMAT_DOT:
      return describe_dot(net, err);
    default:
      break;
  }
  error_set(err, TOPOS_ERR_ARGUMENT, "describe: unknown format %d",
            (int)format);
  return NULL;
}
