/*
 * tape.c - recording: the op table, every op's shape rule, the tape and
 * the sealed network.
 *
 * A tape is an append-only array of nodes whose operands are earlier nodes,
 * so array order is a topological order.  Every recording call checks its
 * operands with the op's shape rule (op_infer) before appending.  The first
 * failure sticks to the tape as a message naming the op, the node index it
 * would have had and the operand shapes; every later call returns an
 * invalid value and leaves the message alone, and sealing fails with it.
 * Nothing here aborts on input.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "utf8.h"

const op_info op_table[OP_COUNT] = {
#define OP_INFO(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = {name, arity, reads, linear, attrs, FAMILY_##family},
    TOPOS_OPS(OP_INFO)
#undef OP_INFO
};

/* ------------------------------------------------------------ shape rules */

static int fail(char *msg, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *msg, size_t len, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
  return code;
}

#define FAIL(code, ...) return fail(msg, msglen, code, __VA_ARGS__)

static int need_float(const tensor_meta *m, int i, char *msg, size_t msglen) {
  if (!dtype_is_float(m->dtype))
    FAIL(TOPOS_ERR_DTYPE,
         "operand %d has dtype %s; the op needs f32, f64 "
         "or bf16",
         i, topos_dtype_name(m->dtype));
  return 0;
}

static int need_axis(int axis, int rank, char *msg, size_t msglen) {
  if (axis < 0 || axis >= rank)
    FAIL(TOPOS_ERR_ARGUMENT, "axis %d is out of range for rank %d", axis, rank);
  return 0;
}

/* Checks that the unfold attributes fit an axis of extent L; writes count. */
static int unfold_count(int64_t L, const node_attrs *at, int64_t *count,
                        char *msg, size_t msglen) {
  if (at->size < 1 || at->step < 1 || at->dilation < 1)
    FAIL(TOPOS_ERR_ARGUMENT,
         "size %lld, step %lld and dilation %lld must all be >= 1",
         (long long)at->size, (long long)at->step, (long long)at->dilation);
  if (at->size - 1 > (INT64_MAX - 1) / at->dilation)
    FAIL(TOPOS_ERR_ARGUMENT, "window span overflows");
  int64_t span = (at->size - 1) * at->dilation + 1;
  if (span > L)
    FAIL(TOPOS_ERR_SHAPE, "window span %lld exceeds the axis extent %lld",
         (long long)span, (long long)L);
  *count = (L - span) / at->step + 1;
  return 0;
}

/*
 * The shape rules, one per `rule` column of TOPOS_OPS.  op_infer has
 * already checked the op code and the operand count against the list and
 * zeroed *out; `a` is operand 0 (NULL for a leaf).  Each rule checks its
 * operands and the attributes its op reads, and fills out.
 */
#define RULE_ARGS                                                   \
  op_code op, const node_attrs *at, int nin, const tensor_meta *in, \
      const tensor_meta *a, tensor_meta *out, char *msg, size_t msglen

static int rule_leaf(RULE_ARGS) {
  if (!at->tensor) FAIL(TOPOS_ERR_ARGUMENT, "needs a tensor (got NULL)");
  *out = tensor_meta_of(at->tensor);
  if (op == OP_PARAMETER && !dtype_is_float(out->dtype))
    FAIL(TOPOS_ERR_DTYPE, "a parameter must be f32, f64 or bf16, not %s",
         topos_dtype_name(out->dtype));
  return 0;
}

static int rule_elementwise(RULE_ARGS) {
  if (nin == 2) {
    if (in[0].dtype != in[1].dtype)
      FAIL(TOPOS_ERR_DTYPE, "operand dtypes differ (%s vs %s)",
           topos_dtype_name(in[0].dtype), topos_dtype_name(in[1].dtype));
    if (!shape_equal(in[0].rank, in[0].shape, in[1].rank, in[1].shape))
      FAIL(TOPOS_ERR_SHAPE,
           "operand shapes differ; elementwise ops never "
           "broadcast implicitly");
  }
  bool int_ok = op == OP_ADD && in[0].dtype == TOPOS_I32;
  if (!int_ok) {
    int rc = need_float(&in[0], 0, msg, msglen);
    if (rc) return rc;
  }
  *out = in[0];
  return 0;
}

static int rule_pow(RULE_ARGS) {
  if (isnan(at->p)) FAIL(TOPOS_ERR_ARGUMENT, "exponent is NaN");
  return rule_elementwise(op, at, nin, in, a, out, msg, msglen);
}

static int rule_matmul(RULE_ARGS) {
  int rc;
  const tensor_meta *b = &in[1];
  if ((rc = need_float(a, 0, msg, msglen))) return rc;
  if (a->dtype != b->dtype)
    FAIL(TOPOS_ERR_DTYPE, "operand dtypes differ (%s vs %s)",
         topos_dtype_name(a->dtype), topos_dtype_name(b->dtype));
  if (a->rank != b->rank || (a->rank != 2 && a->rank != 3))
    FAIL(TOPOS_ERR_SHAPE, "needs [m,k]·[k,n] or [B,m,k]·[B,k,n]");
  int r = a->rank;
  if (r == 3 && a->shape[0] != b->shape[0])
    FAIL(TOPOS_ERR_SHAPE, "batch extents differ (%lld vs %lld)",
         (long long)a->shape[0], (long long)b->shape[0]);
  if (a->shape[r - 1] != b->shape[r - 2])
    FAIL(TOPOS_ERR_SHAPE, "inner extents differ (%lld vs %lld)",
         (long long)a->shape[r - 1], (long long)b->shape[r - 2]);
  *out = *a;
  out->shape[r - 1] = b->shape[r - 1];
  return 0;
}

static int rule_transpose(RULE_ARGS) {
  if (a->rank != 2) FAIL(TOPOS_ERR_SHAPE, "needs a rank-2 operand");
  *out = *a;
  out->shape[0] = a->shape[1];
  out->shape[1] = a->shape[0];
  return 0;
}

static int rule_permute(RULE_ARGS) {
  bool seen[TOPOS_MAX_RANK] = {false};
  *out = *a;
  for (int i = 0; i < a->rank; i++) {
    int p = at->perm[i];
    if (p < 0 || p >= a->rank || seen[p])
      FAIL(TOPOS_ERR_ARGUMENT, "perm is not a permutation of 0..%d",
           a->rank - 1);
    seen[p] = true;
    out->shape[i] = a->shape[p];
  }
  return 0;
}

static int rule_reshape(RULE_ARGS) {
  if (at->rank < 0 || at->rank > TOPOS_MAX_RANK)
    FAIL(TOPOS_ERR_ARGUMENT, "target rank %d is outside 0..%d", at->rank,
         TOPOS_MAX_RANK);
  int64_t n = shape_count(at->rank, at->shape);
  if (n < 0) FAIL(TOPOS_ERR_SHAPE, "target shape is invalid");
  if (n != shape_count(a->rank, a->shape))
    FAIL(TOPOS_ERR_SHAPE, "element counts differ (%lld vs %lld)",
         (long long)shape_count(a->rank, a->shape), (long long)n);
  out->dtype = a->dtype;
  out->rank = at->rank;
  memcpy(out->shape, at->shape, sizeof(int64_t) * (size_t)at->rank);
  return 0;
}

static int rule_narrow(RULE_ARGS) {
  int rc;
  if ((rc = need_axis(at->axis, a->rank, msg, msglen))) return rc;
  if (at->start < 0 || at->length < 0 ||
      at->start > a->shape[at->axis] - at->length)
    FAIL(TOPOS_ERR_SHAPE,
         "range [%lld, %lld+%lld) is outside axis %d "
         "of extent %lld",
         (long long)at->start, (long long)at->start, (long long)at->length,
         at->axis, (long long)a->shape[at->axis]);
  *out = *a;
  out->shape[at->axis] = at->length;
  return 0;
}

static int rule_pad(RULE_ARGS) {
  int rc;
  if ((rc = need_axis(at->axis, a->rank, msg, msglen))) return rc;
  if (at->before < 0 || at->after < 0)
    FAIL(TOPOS_ERR_ARGUMENT, "padding %lld/%lld must not be negative",
         (long long)at->before, (long long)at->after);
  if (at->before > INT32_MAX || at->after > INT32_MAX)
    FAIL(TOPOS_ERR_MEMORY, "padding is too large");
  *out = *a;
  out->shape[at->axis] += at->before + at->after;
  if (shape_count(out->rank, out->shape) < 0)
    FAIL(TOPOS_ERR_MEMORY, "padded shape overflows");
  return 0;
}

static int rule_unfold(RULE_ARGS) {
  int rc;
  int64_t count;
  if ((rc = need_axis(at->axis, a->rank, msg, msglen))) return rc;
  if (a->rank + 1 > TOPOS_MAX_RANK)
    FAIL(TOPOS_ERR_SHAPE, "result would exceed rank %d", TOPOS_MAX_RANK);
  rc = unfold_count(a->shape[at->axis], at, &count, msg, msglen);
  if (rc) return rc;
  out->dtype = a->dtype;
  out->rank = a->rank + 1;
  for (int i = 0, j = 0; i < a->rank; i++) {
    if (i == at->axis) {
      out->shape[j++] = count;
      out->shape[j++] = at->size;
    } else {
      out->shape[j++] = a->shape[i];
    }
  }
  return 0;
}

static int rule_fold(RULE_ARGS) {
  int rc;
  int64_t count;
  if ((rc = need_float(a, 0, msg, msglen))) return rc;
  if (at->axis < 0 || at->axis + 1 >= a->rank)
    FAIL(TOPOS_ERR_ARGUMENT, "axes %d and %d do not both exist in rank %d",
         at->axis, at->axis + 1, a->rank);
  if (at->extent < 0 || at->extent > (int64_t)1 << 40)
    FAIL(TOPOS_ERR_ARGUMENT, "extent %lld is out of range",
         (long long)at->extent);
  if (a->shape[at->axis + 1] != at->size)
    FAIL(TOPOS_ERR_SHAPE, "window axis has extent %lld, size is %lld",
         (long long)a->shape[at->axis + 1], (long long)at->size);
  rc = unfold_count(at->extent, at, &count, msg, msglen);
  if (rc) return rc;
  if (count != a->shape[at->axis])
    FAIL(TOPOS_ERR_SHAPE, "%lld windows fit extent %lld, operand has %lld",
         (long long)count, (long long)at->extent,
         (long long)a->shape[at->axis]);
  out->dtype = a->dtype;
  out->rank = a->rank - 1;
  for (int i = 0, j = 0; i < a->rank; i++) {
    if (i == at->axis + 1) continue;
    out->shape[j++] = i == at->axis ? at->extent : a->shape[i];
  }
  return 0;
}

static int rule_concat(RULE_ARGS) {
  int rc;
  if (nin < 1) FAIL(TOPOS_ERR_ARGUMENT, "needs at least one operand");
  if ((rc = need_axis(at->axis, a->rank, msg, msglen))) return rc;
  *out = *a;
  for (int i = 1; i < nin; i++) {
    if (in[i].dtype != a->dtype)
      FAIL(TOPOS_ERR_DTYPE, "operand %d has dtype %s, operand 0 %s", i,
           topos_dtype_name(in[i].dtype), topos_dtype_name(a->dtype));
    if (in[i].rank != a->rank)
      FAIL(TOPOS_ERR_SHAPE, "operand %d has rank %d, operand 0 rank %d", i,
           in[i].rank, a->rank);
    for (int d = 0; d < a->rank; d++)
      if (d != at->axis && in[i].shape[d] != a->shape[d])
        FAIL(TOPOS_ERR_SHAPE,
             "operand %d differs from operand 0 on "
             "axis %d",
             i, d);
    out->shape[at->axis] += in[i].shape[at->axis];
    if (out->shape[at->axis] > (int64_t)1 << 40)
      FAIL(TOPOS_ERR_MEMORY, "concatenated extent is too large");
  }
  return 0;
}

static int rule_broadcast(RULE_ARGS) {
  if (at->rank < 0 || at->rank > TOPOS_MAX_RANK ||
      shape_count(at->rank, at->shape) < 0)
    FAIL(TOPOS_ERR_ARGUMENT, "target shape is invalid");
  if (a->rank != 0) {
    if (a->rank != at->rank)
      FAIL(TOPOS_ERR_SHAPE,
           "operand rank %d differs from target rank %d "
           "(use broadcast_along to add axes)",
           a->rank, at->rank);
    for (int i = 0; i < a->rank; i++)
      if (a->shape[i] != at->shape[i] && a->shape[i] != 1)
        FAIL(TOPOS_ERR_SHAPE,
             "axis %d has extent %lld; broadcasting to "
             "%lld needs 1",
             i, (long long)a->shape[i], (long long)at->shape[i]);
  }
  out->dtype = a->dtype;
  out->rank = at->rank;
  memcpy(out->shape, at->shape, sizeof(int64_t) * (size_t)at->rank);
  return 0;
}

static int rule_broadcast_along(RULE_ARGS) {
  if (at->axis < 0 || at->axis > a->rank)
    FAIL(TOPOS_ERR_ARGUMENT,
         "axis %d is out of range for inserting into "
         "rank %d",
         at->axis, a->rank);
  if (a->rank + 1 > TOPOS_MAX_RANK)
    FAIL(TOPOS_ERR_SHAPE, "result would exceed rank %d", TOPOS_MAX_RANK);
  if (at->extent < 0) FAIL(TOPOS_ERR_ARGUMENT, "extent is negative");
  out->dtype = a->dtype;
  out->rank = a->rank + 1;
  for (int i = 0, j = 0; i <= a->rank; i++) {
    if (i == at->axis) out->shape[j++] = at->extent;
    if (i < a->rank) out->shape[j++] = a->shape[i];
  }
  if (shape_count(out->rank, out->shape) < 0)
    FAIL(TOPOS_ERR_MEMORY, "broadcast shape overflows");
  return 0;
}

static int rule_sum(RULE_ARGS) {
  int rc;
  if ((rc = need_float(a, 0, msg, msglen))) return rc;
  out->dtype = a->dtype;
  out->rank = 0;
  return 0;
}

/* sum_along, max_along, logsumexp (axis removed) and log_softmax (shape
 * kept). */
static int rule_along(RULE_ARGS) {
  int rc;
  if ((rc = need_float(a, 0, msg, msglen))) return rc;
  if ((rc = need_axis(at->axis, a->rank, msg, msglen))) return rc;
  if (op == OP_LOG_SOFTMAX) {
    *out = *a;
    return 0;
  }
  if (op != OP_SUM_ALONG && a->shape[at->axis] == 0)
    FAIL(TOPOS_ERR_SHAPE, "axis %d is empty; the maximum is undefined",
         at->axis);
  out->dtype = a->dtype;
  out->rank = a->rank - 1;
  for (int i = 0, j = 0; i < a->rank; i++)
    if (i != at->axis) out->shape[j++] = a->shape[i];
  return 0;
}

/* gather (rows of a picked by i32 indices) and scatter (rows of a added
 * into `extent` rows). */
static int rule_index(RULE_ARGS) {
  int rc;
  const tensor_meta *idx = &in[1];
  if ((rc = need_float(a, 0, msg, msglen))) return rc;
  if (a->rank != 2) FAIL(TOPOS_ERR_SHAPE, "operand 0 must have rank 2");
  if (idx->dtype != TOPOS_I32 || idx->rank != 1)
    FAIL(TOPOS_ERR_DTYPE, "indices must be i32 of rank 1");
  out->dtype = a->dtype;
  out->rank = 2;
  out->shape[1] = a->shape[1];
  if (op == OP_GATHER) {
    out->shape[0] = idx->shape[0];
  } else {
    if (a->shape[0] != idx->shape[0])
      FAIL(TOPOS_ERR_SHAPE, "%lld rows but %lld indices",
           (long long)a->shape[0], (long long)idx->shape[0]);
    if (at->extent < 0 || at->extent > (int64_t)1 << 40)
      FAIL(TOPOS_ERR_ARGUMENT, "extent %lld is out of range",
           (long long)at->extent);
    out->shape[0] = at->extent;
  }
  if (shape_count(out->rank, out->shape) < 0)
    FAIL(TOPOS_ERR_MEMORY, "result shape overflows");
  return 0;
}

#undef RULE_ARGS

typedef int shape_rule(op_code op, const node_attrs *at, int nin,
                       const tensor_meta *in, const tensor_meta *a,
                       tensor_meta *out, char *msg, size_t msglen);

/* Each op's rule, named by its TOPOS_OPS entry: an entry whose rule does
 * not exist does not compile. */
static shape_rule *const rules[OP_COUNT] = {
#define OP_RULE(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = rule_##rule,
    TOPOS_OPS(OP_RULE)
#undef OP_RULE
};

int op_infer(op_code op, const node_attrs *at, int nin, const tensor_meta *in,
             tensor_meta *out, char *msg, size_t msglen) {
  if (op < 0 || op >= OP_COUNT) FAIL(TOPOS_ERR_ARGUMENT, "unknown op %d", op);
  int arity = op_table[op].arity;
  if (arity >= 0 && nin != arity)
    FAIL(TOPOS_ERR_ARGUMENT, "takes %d operands, got %d", arity, nin);
  memset(out, 0, sizeof *out);
  const tensor_meta *a = nin > 0 ? &in[0] : NULL;
  return rules[op](op, at, nin, in, a, out, msg, msglen);
}

/* ---------------------------------------------------------------- the tape */

static atomic_uint next_tape_id = 1;

topos_tape *topos_tape_new(topos_dtype dtype) {
  if (!dtype_is_float(dtype)) return NULL;
  topos_tape *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->id = atomic_fetch_add(&next_tape_id, 1);
  if (t->id == 0) t->id = atomic_fetch_add(&next_tape_id, 1);
  t->dtype = dtype;
  return t;
}

static void node_clear(node *n) {
  free(n->in);
  free(n->name);
  topos_tensor_release(n->at.tensor);
}

void topos_tape_free(topos_tape *tape) {
  if (!tape) return;
  for (int i = 0; i < tape->n; i++) node_clear(&tape->nodes[i]);
  free(tape->nodes);
  free(tape->error);
  free(tape->names);
  free(tape);
}

topos_dtype topos_tape_dtype(const topos_tape *tape) {
  return tape ? tape->dtype : TOPOS_F32;
}

const char *topos_tape_error(const topos_tape *tape) {
  return tape ? tape->error : "tape is NULL";
}

int topos_tape_node_count(const topos_tape *tape) {
  return tape ? tape->n : 0;
}

static void tape_fail(topos_tape *tape, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tape_fail(topos_tape *tape, int code, const char *fmt, ...) {
  if (tape->error) return;
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  tape->error = strdup(buf);
  tape->error_code = code;
}

/* Resolves a value of this tape to its node index, or -1 (error set). */
static int tape_index(topos_tape *tape, const char *opname, topos_value v,
                      int which) {
  if (v.index < 0) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT,
              "%s (node %d): operand %d is an invalid value", opname, tape->n,
              which);
    return -1;
  }
  if (v.tape != tape->id || v.index >= tape->n) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT,
              "%s (node %d): operand %d belongs to another tape", opname,
              tape->n, which);
    return -1;
  }
  return v.index;
}

/* The attributes of `at` that an op with this ATTR_* mask reads; every
 * other field is 0.  A node then holds exactly what the encoding writes, so
 * networks with equal bytes are equal in memory too, and a shape rule, a
 * kernel or an emission that read an attribute its list entry does not
 * declare would see 0 in every recorded or decoded network alike. */
static node_attrs attrs_kept(unsigned mask, const node_attrs *at) {
  node_attrs k = {0};
  if (!at) return k;
  for (int bit = 0; bit < ATTR_BIT_COUNT; bit++) {
    if (!(mask & 1u << bit)) continue;
    switch ((attr_bit)bit) {
      case ATTR_BIT_SLOT:
        k.slot = at->slot;
        break;
      case ATTR_BIT_TENSOR:
        k.tensor = at->tensor;
        break;
      case ATTR_BIT_P:
        k.p = at->p;
        break;
      case ATTR_BIT_PERM:
        memcpy(k.perm, at->perm, sizeof k.perm);
        break;
      case ATTR_BIT_TARGET:
        k.rank = at->rank;
        memcpy(k.shape, at->shape, sizeof k.shape);
        break;
      case ATTR_BIT_AXIS:
        k.axis = at->axis;
        break;
      case ATTR_BIT_START:
        k.start = at->start;
        break;
      case ATTR_BIT_LENGTH:
        k.length = at->length;
        break;
      case ATTR_BIT_BEFORE:
        k.before = at->before;
        break;
      case ATTR_BIT_AFTER:
        k.after = at->after;
        break;
      case ATTR_BIT_EXTENT:
        k.extent = at->extent;
        break;
      case ATTR_BIT_SIZE:
        k.size = at->size;
        break;
      case ATTR_BIT_STEP:
        k.step = at->step;
        break;
      case ATTR_BIT_DILATION:
        k.dilation = at->dilation;
        break;
      case ATTR_BIT_COUNT:
        break;
    }
  }
  return k;
}

topos_value tape_record(topos_tape *tape, op_code op, const topos_value *in,
                        int nin, const node_attrs *at) {
  if (!tape || tape->error) return TOPOS_NONE;
  const char *name = op_table[op].name;
  if (nin < 0 || nin > 4096 || (nin > 0 && !in)) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT, "%s (node %d): %d operands", name,
              tape->n, nin);
    return TOPOS_NONE;
  }
  if (tape->n == INT32_MAX - 1) {
    tape_fail(tape, TOPOS_ERR_MEMORY, "%s: the tape is full", name);
    return TOPOS_NONE;
  }
  tensor_meta stack_metas[4];
  tensor_meta *metas =
      nin <= 4 ? stack_metas : malloc(sizeof(tensor_meta) * (size_t)nin);
  int32_t *ins = nin ? malloc(sizeof(int32_t) * (size_t)nin) : NULL;
  if ((nin > 4 && !metas) || (nin && !ins)) {
    tape_fail(tape, TOPOS_ERR_MEMORY, "%s: out of memory", name);
    goto fail;
  }
  for (int i = 0; i < nin; i++) {
    int idx = tape_index(tape, name, in[i], i);
    if (idx < 0) goto fail;
    ins[i] = idx;
    metas[i] = tape->nodes[idx].meta;
  }
  node_attrs attrs = attrs_kept(op_table[op].attrs, at);
  tensor_meta out;
  char reason[400];
  int rc = op_infer(op, &attrs, nin, metas, &out, reason, sizeof reason);
  if (rc) {
    char ops[512] = "";
    size_t used = 0;
    for (int i = 0; i < nin && used < sizeof ops - 64; i++) {
      char mt[SHAPE_TEXT + 8];
      used += (size_t)snprintf(ops + used, sizeof ops - used, "%s%s",
                               i ? ", " : "", meta_text(mt, &metas[i]));
    }
    tape_fail(tape, rc, "%s (node %d): %s; operands: %s", name, tape->n, reason,
              nin ? ops : "none");
    goto fail;
  }
  if (tape->n == tape->cap) {
    int cap = tape->cap ? tape->cap * 2 : 64;
    node *nodes = realloc(tape->nodes, sizeof(node) * (size_t)cap);
    if (!nodes) {
      tape_fail(tape, TOPOS_ERR_MEMORY, "%s: out of memory", name);
      goto fail;
    }
    tape->nodes = nodes;
    tape->cap = cap;
  }
  node *n = &tape->nodes[tape->n];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->meta = out;
  n->nin = nin;
  n->in = ins;
  n->at = attrs;
  topos_tensor_retain(attrs.tensor);
  if (op == OP_PARAMETER) n->at.slot = tape->nparams++;
  if (op == OP_INPUT) n->at.slot = tape->ninputs++;
  if (metas != stack_metas) free(metas);
  return (topos_value){tape->id, tape->n++};
fail:
  if (metas != stack_metas) free(metas);
  free(ins);
  return TOPOS_NONE;
}

/* ------------------------------------------------------- recording calls */

static topos_value leaf(topos_tape *tape, op_code op, const topos_tensor *t) {
  node_attrs at = {0};
  at.tensor = (topos_tensor *)t;
  return tape_record(tape, op, NULL, 0, &at);
}

topos_value topos_parameter(topos_tape *tape, const topos_tensor *initial) {
  return leaf(tape, OP_PARAMETER, initial);
}

topos_value topos_input(topos_tape *tape, const topos_tensor *default_value) {
  return leaf(tape, OP_INPUT, default_value);
}

topos_value topos_constant(topos_tape *tape, const topos_tensor *tensor) {
  return leaf(tape, OP_CONSTANT, tensor);
}

topos_value topos_scalar(topos_tape *tape, double value) {
  if (!tape || tape->error) return TOPOS_NONE;
  topos_error err = {0};
  topos_tensor *t = topos_tensor_scalar(tape->dtype, value, &err);
  if (!t) {
    tape_fail(tape, err.code, "constant (node %d): %s", tape->n, err.message);
    return TOPOS_NONE;
  }
  topos_value v = leaf(tape, OP_CONSTANT, t);
  topos_tensor_release(t);
  return v;
}

static topos_value unary(topos_tape *tape, op_code op, topos_value a) {
  return tape_record(tape, op, &a, 1, NULL);
}

static topos_value binary(topos_tape *tape, op_code op, topos_value a,
                          topos_value b) {
  topos_value in[2] = {a, b};
  return tape_record(tape, op, in, 2, NULL);
}

static topos_value with_axis(topos_tape *tape, op_code op, topos_value a,
                             int axis) {
  node_attrs at = {0};
  at.axis = axis;
  return tape_record(tape, op, &a, 1, &at);
}

topos_value topos_add(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_ADD, a, b);
}
topos_value topos_sub(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_SUB, a, b);
}
topos_value topos_mul(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_MUL, a, b);
}
topos_value topos_div(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_DIV, a, b);
}
topos_value topos_maximum(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_MAXIMUM, a, b);
}
topos_value topos_step(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_STEP, a, b);
}
topos_value topos_matmul(topos_tape *t, topos_value a, topos_value b) {
  return binary(t, OP_MATMUL, a, b);
}
topos_value topos_neg(topos_tape *t, topos_value a) {
  return unary(t, OP_NEG, a);
}
topos_value topos_exp(topos_tape *t, topos_value a) {
  return unary(t, OP_EXP, a);
}
topos_value topos_log(topos_tape *t, topos_value a) {
  return unary(t, OP_LOG, a);
}
topos_value topos_sqrt(topos_tape *t, topos_value a) {
  return unary(t, OP_SQRT, a);
}
topos_value topos_tanh(topos_tape *t, topos_value a) {
  return unary(t, OP_TANH, a);
}
topos_value topos_erf(topos_tape *t, topos_value a) {
  return unary(t, OP_ERF, a);
}
topos_value topos_relu(topos_tape *t, topos_value a) {
  return unary(t, OP_RELU, a);
}
topos_value topos_transpose(topos_tape *t, topos_value a) {
  return unary(t, OP_TRANSPOSE, a);
}
topos_value topos_sum(topos_tape *t, topos_value a) {
  return unary(t, OP_SUM, a);
}

topos_value topos_pow(topos_tape *tape, topos_value a, double exponent) {
  node_attrs at = {0};
  at.p = exponent;
  return tape_record(tape, OP_POW, &a, 1, &at);
}

topos_value topos_permute(topos_tape *tape, topos_value a, const int *perm) {
  node_attrs at = {0};
  if (tape && !tape->error && !perm) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT, "permute (node %d): perm is NULL",
              tape->n);
    return TOPOS_NONE;
  }
  if (perm && tape && topos_value_ok(a) && a.tape == tape->id &&
      a.index < tape->n)
    memcpy(at.perm, perm, sizeof(int) * (size_t)tape->nodes[a.index].meta.rank);
  return tape_record(tape, OP_PERMUTE, &a, 1, &at);
}

/* Shared by reshape and broadcast: a target shape attribute. */
static topos_value with_shape(topos_tape *tape, op_code op, topos_value a,
                              int rank, const int64_t *shape) {
  node_attrs at = {0};
  if (tape && !tape->error &&
      (rank < 0 || rank > TOPOS_MAX_RANK || (rank > 0 && !shape))) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT,
              "%s (node %d): target rank %d with %s shape", op_table[op].name,
              tape->n, rank, shape ? "a" : "a NULL");
    return TOPOS_NONE;
  }
  at.rank = rank;
  if (rank > 0 && shape)
    memcpy(at.shape, shape, sizeof(int64_t) * (size_t)rank);
  return tape_record(tape, op, &a, 1, &at);
}

topos_value topos_reshape(topos_tape *tape, topos_value a, int rank,
                          const int64_t *shape) {
  return with_shape(tape, OP_RESHAPE, a, rank, shape);
}

topos_value topos_broadcast(topos_tape *tape, topos_value a, int rank,
                            const int64_t *shape) {
  return with_shape(tape, OP_BROADCAST, a, rank, shape);
}

topos_value topos_narrow(topos_tape *tape, topos_value a, int axis,
                         int64_t start, int64_t length) {
  node_attrs at = {0};
  at.axis = axis;
  at.start = start;
  at.length = length;
  return tape_record(tape, OP_NARROW, &a, 1, &at);
}

topos_value topos_pad(topos_tape *tape, topos_value a, int axis, int64_t before,
                      int64_t after) {
  node_attrs at = {0};
  at.axis = axis;
  at.before = before;
  at.after = after;
  return tape_record(tape, OP_PAD, &a, 1, &at);
}

topos_value topos_unfold(topos_tape *tape, topos_value a, int axis,
                         int64_t size, int64_t step, int64_t dilation) {
  node_attrs at = {0};
  at.axis = axis;
  at.size = size;
  at.step = step;
  at.dilation = dilation;
  return tape_record(tape, OP_UNFOLD, &a, 1, &at);
}

topos_value topos_fold(topos_tape *tape, topos_value a, int axis,
                       int64_t extent, int64_t size, int64_t step,
                       int64_t dilation) {
  node_attrs at = {0};
  at.axis = axis;
  at.extent = extent;
  at.size = size;
  at.step = step;
  at.dilation = dilation;
  return tape_record(tape, OP_FOLD, &a, 1, &at);
}

topos_value topos_concat(topos_tape *tape, int n, const topos_value *values,
                         int axis) {
  node_attrs at = {0};
  at.axis = axis;
  return tape_record(tape, OP_CONCAT, values, n, &at);
}

topos_value topos_broadcast_along(topos_tape *tape, topos_value a, int axis,
                                  int64_t extent) {
  node_attrs at = {0};
  at.axis = axis;
  at.extent = extent;
  return tape_record(tape, OP_BROADCAST_ALONG, &a, 1, &at);
}

topos_value topos_sum_along(topos_tape *t, topos_value a, int axis) {
  return with_axis(t, OP_SUM_ALONG, a, axis);
}
topos_value topos_max_along(topos_tape *t, topos_value a, int axis) {
  return with_axis(t, OP_MAX_ALONG, a, axis);
}
topos_value topos_log_softmax(topos_tape *t, topos_value a, int axis) {
  return with_axis(t, OP_LOG_SOFTMAX, a, axis);
}
topos_value topos_logsumexp(topos_tape *t, topos_value a, int axis) {
  return with_axis(t, OP_LOGSUMEXP, a, axis);
}

topos_value topos_gather(topos_tape *tape, topos_value table, topos_value idx) {
  return binary(tape, OP_GATHER, table, idx);
}

topos_value topos_scatter(topos_tape *tape, topos_value rows, topos_value idx,
                          int64_t extent) {
  topos_value in[2] = {rows, idx};
  node_attrs at = {0};
  at.extent = extent;
  return tape_record(tape, OP_SCATTER, in, 2, &at);
}

/* ------------------------------------------------------------ name index */

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int name_lookup(const topos_tape *t, const char *name) {
  if (t->name_cap == 0) return -1;
  size_t mask = (size_t)t->name_cap - 1;
  for (size_t k = name_hash(name) & mask;; k = (k + 1) & mask) {
    int32_t e = t->names[k];
    if (e == 0) return -1;
    if (e > 0 && strcmp(t->nodes[e - 1].name, name) == 0) return e - 1;
  }
}

static void name_place(int32_t *slots, int cap, const char *name,
                       int32_t entry) {
  size_t mask = (size_t)cap - 1;
  size_t k = name_hash(name) & mask;
  while (slots[k] > 0) k = (k + 1) & mask;
  slots[k] = entry;
}

/* Adds node i (already named) to the index, growing it at half load. */
static int name_insert(topos_tape *t, int32_t i) {
  if (2 * (t->name_used + 1) > t->name_cap) {
    int cap = t->name_cap ? t->name_cap * 2 : 64;
    int32_t *slots = calloc((size_t)cap, sizeof(int32_t));
    if (!slots) return -1;
    int used = 0;
    for (int k = 0; k < t->name_cap; k++)
      if (t->names[k] > 0) {
        name_place(slots, cap, t->nodes[t->names[k] - 1].name, t->names[k]);
        used++;
      }
    free(t->names);
    t->names = slots;
    t->name_cap = cap;
    t->name_used = used;
  }
  name_place(t->names, t->name_cap, t->nodes[i].name, i + 1);
  t->name_used++;
  return 0;
}

/* Removes node i's current name; the slot becomes a tombstone. */
static void name_remove(topos_tape *t, int32_t i) {
  size_t mask = (size_t)t->name_cap - 1;
  for (size_t k = name_hash(t->nodes[i].name) & mask; t->names[k] != 0;
       k = (k + 1) & mask)
    if (t->names[k] == i + 1) {
      t->names[k] = -1;
      return;
    }
}

topos_value topos_name(topos_tape *tape, topos_value value, const char *name) {
  if (!tape || tape->error) return TOPOS_NONE;
  if (tape_index(tape, "name", value, 0) < 0) return TOPOS_NONE;
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len > 255) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT,
              "name (node %d): a name must have 1 to 255 bytes", value.index);
    return TOPOS_NONE;
  }
  /* Names go out in proto3 `string` fields (Record replies, describes),
   * which must be UTF-8: the one rule for every name is utf8.h's. */
  size_t at = 0;
  const char *why = NULL;
  if (!topos_utf8_check(name, len, &at, &why)) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT, "name (node %d): %s at byte %zu",
              value.index, why, at);
    return TOPOS_NONE;
  }
  int other = name_lookup(tape, name);
  if (other >= 0 && other != value.index) {
    tape_fail(tape, TOPOS_ERR_ARGUMENT,
              "name (node %d): \"%s\" already names node %d", value.index, name,
              other);
    return TOPOS_NONE;
  }
  char *copy = strdup(name);
  if (!copy) {
    tape_fail(tape, TOPOS_ERR_MEMORY, "name: out of memory");
    return TOPOS_NONE;
  }
  if (tape->nodes[value.index].name) name_remove(tape, value.index);
  free(tape->nodes[value.index].name);
  tape->nodes[value.index].name = copy;
  if (name_insert(tape, value.index) != 0) {
    tape_fail(tape, TOPOS_ERR_MEMORY, "name: out of memory");
    return TOPOS_NONE;
  }
  return value;
}

topos_value topos_tape_fail(topos_tape *tape, int code, const char *message) {
  if (!tape || tape->error) return TOPOS_NONE;
  if (code == TOPOS_OK || code < 0 || code > TOPOS_ERR_STATE)
    code = TOPOS_ERR_ARGUMENT;
  tape_fail(tape, code, "%s (at node %d)",
            message && message[0] ? message : "failed", tape->n);
  return TOPOS_NONE;
}

static const node *tape_node(const topos_tape *tape, topos_value v) {
  if (!tape || v.index < 0 || v.tape != tape->id || v.index >= tape->n)
    return NULL;
  return &tape->nodes[v.index];
}

topos_dtype topos_value_dtype(const topos_tape *tape, topos_value v) {
  const node *n = tape_node(tape, v);
  return n ? n->meta.dtype : TOPOS_F32;
}

const int64_t *topos_value_shape(const topos_tape *tape, topos_value v,
                                 int *rank) {
  const node *n = tape_node(tape, v);
  if (rank) *rank = n ? n->meta.rank : 0;
  return n ? n->meta.shape : NULL;
}

/* --------------------------------------------------------------- sealing */

topos_network *topos_tape_seal(topos_tape *tape, topos_error *err) {
  if (!tape) {
    error_set(err, TOPOS_ERR_ARGUMENT, "seal: tape is NULL");
    return NULL;
  }
  if (tape->error) {
    error_set(err, tape->error_code, "%s", tape->error);
    topos_tape_free(tape);
    return NULL;
  }
  topos_network *net = calloc(1, sizeof *net);
  int32_t *pn = malloc(sizeof(int32_t) * (size_t)(tape->nparams + 1));
  int32_t *in = malloc(sizeof(int32_t) * (size_t)(tape->ninputs + 1));
  if (!net || !pn || !in) {
    free(net);
    free(pn);
    free(in);
    topos_tape_free(tape);
    error_set(err, TOPOS_ERR_MEMORY, "seal: out of memory");
    return NULL;
  }
  atomic_init(&net->refs, 1);
  net->id = tape->id;
  net->dtype = tape->dtype;
  net->nodes = tape->nodes;
  net->n = tape->n;
  net->nparams = tape->nparams;
  net->ninputs = tape->ninputs;
  net->param_nodes = pn;
  net->input_nodes = in;
  for (int i = 0; i < net->n; i++) {
    if (net->nodes[i].op == OP_PARAMETER) pn[net->nodes[i].at.slot] = i;
    if (net->nodes[i].op == OP_INPUT) in[net->nodes[i].at.slot] = i;
  }
  free(tape->error);
  free(tape->names);
  free(tape);
  return net;
}

topos_network *topos_network_retain(const topos_network *net) {
  topos_network *n = (topos_network *)net;
  if (n) atomic_fetch_add(&n->refs, 1);
  return n;
}

void topos_network_release(topos_network *net) {
  if (!net || atomic_fetch_sub(&net->refs, 1) != 1) return;
  for (int i = 0; i < net->n; i++) node_clear(&net->nodes[i]);
  free(net->nodes);
  free(net->param_nodes);
  free(net->input_nodes);
  free(net);
}

int network_index(const topos_network *net, topos_value v, topos_error *err) {
  if (!net) return error_set(err, TOPOS_ERR_ARGUMENT, "network is NULL"), -1;
  if (v.index < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT, "invalid value"), -1;
  if (v.tape != net->id || v.index >= net->n)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "value %d belongs to another network", v.index),
           -1;
  return v.index;
}

int topos_network_node_count(const topos_network *net) {
  return net ? net->n : 0;
}
topos_dtype topos_network_dtype(const topos_network *net) {
  return net ? net->dtype : TOPOS_F32;
}

topos_value topos_network_value(const topos_network *net, int index) {
  if (!net || index < 0 || index >= net->n) return TOPOS_NONE;
  return (topos_value){net->id, index};
}

int topos_network_parameter_count(const topos_network *net) {
  return net ? net->nparams : 0;
}
int topos_network_input_count(const topos_network *net) {
  return net ? net->ninputs : 0;
}

topos_value topos_network_parameter(const topos_network *net, int slot) {
  if (!net || slot < 0 || slot >= net->nparams) return TOPOS_NONE;
  return (topos_value){net->id, net->param_nodes[slot]};
}

topos_value topos_network_input(const topos_network *net, int slot) {
  if (!net || slot < 0 || slot >= net->ninputs) return TOPOS_NONE;
  return (topos_value){net->id, net->input_nodes[slot]};
}

topos_value topos_network_find(const topos_network *net, const char *name) {
  if (!net || !name) return TOPOS_NONE;
  for (int i = 0; i < net->n; i++)
    if (net->nodes[i].name && strcmp(net->nodes[i].name, name) == 0)
      return (topos_value){net->id, i};
  return TOPOS_NONE;
}

const char *topos_network_name_of(const topos_network *net, topos_value v) {
  int i = network_index(net, v, NULL);
  return i < 0 ? NULL : net->nodes[i].name;
}

topos_dtype topos_network_value_dtype(const topos_network *net, topos_value v) {
  int i = network_index(net, v, NULL);
  return i < 0 ? TOPOS_F32 : net->nodes[i].meta.dtype;
}

const int64_t *topos_network_value_shape(const topos_network *net,
                                         topos_value v, int *rank) {
  int i = network_index(net, v, NULL);
  if (rank) *rank = i < 0 ? 0 : net->nodes[i].meta.rank;
  return i < 0 ? NULL : net->nodes[i].meta.shape;
}

/* ------------------------------------------------- generic node access */

int topos_network_node(const topos_network *net, int index,
                       topos_node_info *out, topos_error *err) {
  if (!net || !out)
    return error_set(err, TOPOS_ERR_ARGUMENT, "node: %s is NULL",
                     net ? "out" : "network");
  if (index < 0 || index >= net->n)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "node: index %d is outside [0, %d)", index, net->n);
  const node *n = &net->nodes[index];
  const node_attrs *a = &n->at;
  *out = (topos_node_info){
      .op = n->op,
      .op_name = op_table[n->op].name,
      .nin = n->nin,
      .operands = n->in,
      .dtype = n->meta.dtype,
      .rank = n->meta.rank,
      .shape = n->meta.shape,
      .name = n->name,
      .axis = a->axis,
      .start = a->start,
      .length = a->length,
      .before = a->before,
      .after = a->after,
      .size = a->size,
      .step = a->step,
      .dilation = a->dilation,
      .extent = a->extent,
      .p = a->p,
      .perm = a->perm,
      .target_rank = a->rank,
      .target = a->shape,
      .tensor = a->tensor,
      .slot = a->slot,
  };
  return TOPOS_OK;
}

topos_value topos_record(topos_tape *tape, int op, const topos_value *operands,
                         int n, const topos_node_info *at) {
  if (!tape || tape->error) return TOPOS_NONE;
  if (op < 0 || op >= OP_COUNT || !at) {
    char msg[96];
    if (at)
      snprintf(msg, sizeof msg, "record: unknown op code %d", op);
    else
      snprintf(msg, sizeof msg, "record: op %d without attributes", op);
    return topos_tape_fail(tape, TOPOS_ERR_ARGUMENT, msg);
  }
  node_attrs na = {0};
  na.axis = at->axis;
  na.start = at->start;
  na.length = at->length;
  na.before = at->before;
  na.after = at->after;
  na.size = at->size;
  na.step = at->step;
  na.dilation = at->dilation;
  na.extent = at->extent;
  na.p = at->p;
  na.tensor = (topos_tensor *)at->tensor;
  /* The scalars are copied whatever the op (tape_record keeps only what
   * it reads); the arrays only where the op reads them, since only then do
   * the pointers have to be valid. */
  unsigned reads = op_table[op].attrs;
  if (reads & ATTR_PERM) {
    if (!at->perm) {
      char msg[96];
      snprintf(msg, sizeof msg, "record: %s without perm", op_table[op].name);
      return topos_tape_fail(tape, TOPOS_ERR_ARGUMENT, msg);
    }
    int rank = 0;
    if (n == 1 && operands) topos_value_shape(tape, operands[0], &rank);
    if (rank > 0) memcpy(na.perm, at->perm, sizeof(int) * (size_t)rank);
  }
  if (reads & ATTR_TARGET) {
    if (at->target_rank < 0 || at->target_rank > TOPOS_MAX_RANK ||
        (at->target_rank > 0 && !at->target))
      return topos_tape_fail(tape, TOPOS_ERR_ARGUMENT,
                             "record: a target shape needs rank 0..8 extents");
    na.rank = at->target_rank;
    /* A rank-0 target may come with no extents at all (NULL). */
    if (na.rank > 0)
      memcpy(na.shape, at->target, sizeof(int64_t) * (size_t)na.rank);
  }
  return tape_record(tape, (op_code)op, operands, n, &na);
}

int topos_op_code(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < OP_COUNT; i++)
    if (strcmp(op_table[i].name, name) == 0) return i;
  return -1;
}

int topos_op_count(void) {
  return OP_COUNT;
}
