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
 * label line break).  Bytes that are not valid UTF-8 become U+FFFD in
 * both, so the output is always valid UTF-8.  Every form is a read of the
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

static void attrs_text(text *t, const node *n) {
  const node_attrs *a = &n->at;
  char s[SHAPE_TEXT];
  switch (n->op) {
    case OP_POW:
      text_add(t, " p=%.17g", a->p);
      break;
    case OP_PERMUTE:
      text_add(t, " perm=[");
      for (int i = 0; i < n->meta.rank; i++)
        text_add(t, "%s%d", i ? "," : "", a->perm[i]);
      text_add(t, "]");
      break;
    case OP_RESHAPE:
    case OP_BROADCAST:
      text_add(t, " shape=%s", shape_text(s, a->rank, a->shape));
      break;
    case OP_NARROW:
      text_add(t, " axis=%d start=%lld length=%lld", a->axis,
               (long long)a->start, (long long)a->length);
      break;
    case OP_PAD:
      text_add(t, " axis=%d before=%lld after=%lld", a->axis,
               (long long)a->before, (long long)a->after);
      break;
    case OP_FOLD:
      text_add(t, " extent=%lld", (long long)a->extent);
      /* fall through */
    case OP_UNFOLD:
      text_add(t, " axis=%d size=%lld step=%lld dilation=%lld", a->axis,
               (long long)a->size, (long long)a->step, (long long)a->dilation);
      break;
    case OP_BROADCAST_ALONG:
      text_add(t, " axis=%d extent=%lld", a->axis, (long long)a->extent);
      break;
    case OP_CONCAT:
    case OP_SUM_ALONG:
    case OP_MAX_ALONG:
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      text_add(t, " axis=%d", a->axis);
      break;
    case OP_SCATTER:
      text_add(t, " extent=%lld", (long long)a->extent);
      break;
    default:
      break;
  }
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

/* The length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes
 * there are not one (overlong forms, surrogates and code points past
 * U+10FFFF included). */
static int utf8_sequence(const unsigned char *s) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  int len;
  unsigned cp, min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
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

/* A copy of s with every byte that is not valid UTF-8 replaced by U+FFFD
 * (new), or NULL when s is valid and can be used as it is (or on failure,
 * with *failed set). */
static char *utf8_repaired(const char *s, bool *failed) {
  const unsigned char *u = (const unsigned char *)s;
  size_t len = strlen(s);
  bool valid = true;
  for (size_t i = 0; i < len;) {
    int n = utf8_sequence(u + i);
    if (!n) {
      valid = false;
      break;
    }
    i += (size_t)n;
  }
  if (valid) return NULL;
  char *out = malloc(len * 3 + 1);
  if (!out) {
    *failed = true;
    return NULL;
  }
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    int n = utf8_sequence(u + i);
    if (n) {
      memcpy(out + o, s + i, (size_t)n);
      o += (size_t)n;
      i += (size_t)n;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    }
  }
  out[o] = '\0';
  return out;
}

static cJSON *json_name(json_out *o, const char *name) {
  if (!name) return cJSON_CreateNull();
  char *fixed = utf8_repaired(name, &o->failed);
  cJSON *s = cJSON_CreateString(fixed ? fixed : name);
  free(fixed);
  return s;
}

static cJSON *json_attrs(json_out *o, const node *n) {
  const node_attrs *a = &n->at;
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  switch (n->op) {
    case OP_POW:
      json_add(o, j, "p", json_double(a->p));
      break;
    case OP_PERMUTE: {
      cJSON *perm = cJSON_CreateArray();
      for (int i = 0; perm && i < n->meta.rank; i++)
        json_add(o, perm, NULL, json_int(a->perm[i]));
      json_add(o, j, "perm", perm);
      break;
    }
    case OP_RESHAPE:
    case OP_BROADCAST:
      json_add(o, j, "shape", json_shape(o, a->rank, a->shape));
      break;
    case OP_NARROW:
      json_add(o, j, "axis", json_int(a->axis));
      json_add(o, j, "start", json_int(a->start));
      json_add(o, j, "length", json_int(a->length));
      break;
    case OP_PAD:
      json_add(o, j, "axis", json_int(a->axis));
      json_add(o, j, "before", json_int(a->before));
      json_add(o, j, "after", json_int(a->after));
      break;
    case OP_UNFOLD:
    case OP_FOLD:
      json_add(o, j, "axis", json_int(a->axis));
      if (n->op == OP_FOLD) json_add(o, j, "extent", json_int(a->extent));
      json_add(o, j, "size", json_int(a->size));
      json_add(o, j, "step", json_int(a->step));
      json_add(o, j, "dilation", json_int(a->dilation));
      break;
    case OP_CONCAT:
    case OP_SUM_ALONG:
    case OP_MAX_ALONG:
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      json_add(o, j, "axis", json_int(a->axis));
      break;
    case OP_BROADCAST_ALONG:
      json_add(o, j, "axis", json_int(a->axis));
      json_add(o, j, "extent", json_int(a->extent));
      break;
    case OP_SCATTER:
      json_add(o, j, "extent", json_int(a->extent));
      break;
    default:
      break;
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
    json_add(&o, j, "name", json_name(&o, n->name));
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
 * would be a line break, \n a centred one), invalid UTF-8 as U+FFFD. */
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
      int n = utf8_sequence(u + i);
      if (n)
        text_add(t, "%.*s", n, s + i);
      else
        text_add(t, "\xEF\xBF\xBD");
      i += n ? (size_t)n : 1;
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
