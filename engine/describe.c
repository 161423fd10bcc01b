/*
 * describe.c - human-readable listings of a sealed network.
 *
 * The text form prints one line per node: index, name, op with operands
 * and attributes, dtype and shape, and role (parameter/input slot,
 * constant, or output for a value nothing consumes).  It is a read of the
 * immutable network and allocates only the returned string.
 */
#include <stdarg.h>
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
  if (t.failed || !t.s) {
    free(t.s);
    error_set(err, TOPOS_ERR_MEMORY, "describe: out of memory");
    return NULL;
  }
  return t.s;
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
    default:
      break;
  }
  error_set(err, TOPOS_ERR_ARGUMENT, "describe: unknown format %d",
            (int)format);
  return NULL;
}
