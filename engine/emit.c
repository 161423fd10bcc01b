/*
 * emit.c - a plan as a StableHLO MLIR module (topos_plan_emit_stablehlo).
 *
 * The module has one function, @main, whose arguments are every parameter
 * of the network in slot order and then every input in slot order, and
 * whose results are the plan's roots and then its observes.  The body
 * walks the plan's schedule: each node lowers to a few StableHLO ops
 * (docs/emission.md has the table), a fused group lowers to one
 * stablehlo.convolution or stablehlo.reduce_window, constants become
 * dense literals that round-trip every bit.
 *
 * Guarantees:
 *  - Emission is a pure read of the plan: the same plan gives the same
 *    text byte for byte (SSA values are numbered in emission order).
 *  - Every op's result type is computed here from the op's own shape rule
 *    and compared with the node's dtype and shape before the text is
 *    returned; any disagreement, an operand the schedule did not compute,
 *    or running out of memory gives an error naming the node
 *    ("emit: node 7 (fold): ..."), never partial or malformed text.
 *  - bf16 arithmetic is emitted as the reference computes it: operands are
 *    converted to f32, the op runs in f32 and the result is converted back
 *    once.  Ops that only move or compare values stay in bf16.
 *
 * The generic form quotes op names and spells attributes the way
 * `mlir-opt --allow-unregistered-dialect` (MLIR 19) parses them; the pretty
 * form is StableHLO's custom assembly, for people to read.
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------ text buffer */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_vadd(sbuf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0,
                    fmt, ap);
  if (n < 0) {
    b->oom = true;
    va_end(again);
    return;
  }
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      va_end(again);
      return;
    }
    b->p = p;
    b->cap = cap;
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, again);
  }
  va_end(again);
  b->len += (size_t)n;
}

static void sb_add(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_add(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vadd(b, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------- the values */

/* Element types: the four dtypes (same numbers) and i1 for predicates. */
enum { ET_I1 = 4 };

typedef struct vtype {
  int et;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
} vtype;

/* An SSA value: %id for id >= 0, %arg(-id-1) for a function argument. */
typedef struct val {
  int id;
  vtype t;
} val;

#define RING 32
#define RING_TEXT 256

typedef struct emitter {
  const topos_plan *plan;
  const node *nodes;
  bool generic;
  sbuf out;
  int next;       /* the next SSA number */
  int indent;     /* spaces before each line */
  val *vals;      /* per node, valid where done[i] */
  bool *done;     /* per node: lowered (or an argument) */
  bool *visiting; /* per node: being lowered (guards constant recursion) */
  int status;     /* first failure, 0 while none */
  topos_error *err;
  char ring[RING][RING_TEXT];
  int ring_pos;
} emitter;

static char *ring_next(emitter *e) {
  char *s = e->ring[e->ring_pos];
  e->ring_pos = (e->ring_pos + 1) % RING;
  s[0] = '\0';
  return s;
}

static const char *et_name(int et) {
  switch (et) {
    case TOPOS_F32:
      return "f32";
    case TOPOS_F64:
      return "f64";
    case TOPOS_BF16:
      return "bf16";
    case TOPOS_I32:
      return "i32";
    case ET_I1:
      return "i1";
  }
  return "?";
}

/* "tensor<2x3xf32>", "tensor<f32>" for rank 0. */
static const char *T(emitter *e, const vtype *t) {
  char *s = ring_next(e);
  size_t pos = (size_t)snprintf(s, RING_TEXT, "tensor<");
  for (int i = 0; i < t->rank; i++)
    pos +=
        (size_t)snprintf(s + pos, RING_TEXT - pos, "%" PRId64 "x", t->shape[i]);
  snprintf(s + pos, RING_TEXT - pos, "%s>", et_name(t->et));
  return s;
}

static const char *R(emitter *e, val v) {
  char *s = ring_next(e);
  if (v.id >= 0)
    snprintf(s, RING_TEXT, "%%%d", v.id);
  else
    snprintf(s, RING_TEXT, "%%arg%d", -v.id - 1);
  return s;
}

/* Writes "1, 2, 3" (nothing for n == 0) at s + pos; returns the new end. */
static size_t list_into(char *s, size_t pos, int n, const int64_t *v) {
  for (int i = 0; i < n; i++)
    pos += (size_t)snprintf(s + pos, RING_TEXT - pos, "%s%" PRId64,
                            i ? ", " : "", v[i]);
  return pos;
}

/* "1, 2, 3" (empty for n == 0). */
static const char *L(emitter *e, int n, const int64_t *v) {
  char *s = ring_next(e);
  list_into(s, 0, n, v);
  return s;
}

/* "array<i64: 1, 2>", or "array<i64>" when empty. */
static const char *A(emitter *e, int n, const int64_t *v) {
  char *s = ring_next(e);
  if (n == 0) {
    snprintf(s, RING_TEXT, "array<i64>");
  } else {
    size_t pos = (size_t)snprintf(s, RING_TEXT, "array<i64: ");
    pos = list_into(s, pos, n, v);
    snprintf(s + pos, RING_TEXT - pos, ">");
  }
  return s;
}

static void line(emitter *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void line(emitter *e, const char *fmt, ...) {
  sb_add(&e->out, "%*s", e->indent, "");
  va_list ap;
  va_start(ap, fmt);
  sb_vadd(&e->out, fmt, ap);
  va_end(ap);
  sb_add(&e->out, "\n");
}

static val new_val(emitter *e, const vtype *t) {
  val v = {e->next++, *t};
  return v;
}

static vtype vt_of(const tensor_meta *m) {
  vtype t = {(int)m->dtype, m->rank, {0}};
  memcpy(t.shape, m->shape, sizeof(int64_t) * (size_t)m->rank);
  return t;
}

static vtype vt_make(int et, int rank, const int64_t *shape) {
  vtype t = {et, rank, {0}};
  if (rank > 0) memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
  return t;
}

static vtype vt_with_et(vtype t, int et) {
  t.et = et;
  return t;
}

static vtype vt_scalar(int et) {
  vtype t = {et, 0, {0}};
  return t;
}

static bool vt_equal(const vtype *a, const vtype *b) {
  if (a->et != b->et || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* ------------------------------------------------------------ literals */

/* Appends ".0" where a printed float has neither '.' nor an exponent's
 * mantissa dot: MLIR lexes "1" and "1e+10" as integers. */
static void add_float_text(sbuf *b, const char *num) {
  const char *exp = strpbrk(num, "eE");
  if (strchr(num, '.')) {
    sb_add(b, "%s", num);
  } else if (exp) {
    sb_add(b, "%.*s.0%s", (int)(exp - num), num, exp);
  } else {
    sb_add(b, "%s.0", num);
  }
}

/* One element of a dense literal.  Finite floats are printed with enough
 * digits to round-trip (%.9g for f32 and bf16's f32 value, %.17g for f64);
 * NaN and infinities as their bit patterns in hex, which MLIR reads as
 * the exact bits of the element type. */
static void add_element(sbuf *b, int et, const void *data, int64_t i) {
  char num[64];
  switch (et) {
    case TOPOS_F32: {
      float v;
      memcpy(&v, (const char *)data + i * 4, 4);
      if (!isfinite(v)) {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        sb_add(b, "0x%08" PRIX32, bits);
        return;
      }
      snprintf(num, sizeof num, "%.9g", (double)v);
      add_float_text(b, num);
      return;
    }
    case TOPOS_F64: {
      double v;
      memcpy(&v, (const char *)data + i * 8, 8);
      if (!isfinite(v)) {
        uint64_t bits;
        memcpy(&bits, &v, 8);
        sb_add(b, "0x%016" PRIX64, bits);
        return;
      }
      snprintf(num, sizeof num, "%.17g", v);
      add_float_text(b, num);
      return;
    }
    case TOPOS_BF16: {
      uint16_t bits;
      memcpy(&bits, (const char *)data + i * 2, 2);
      float v = topos_bf16_to_f32(bits);
      if (!isfinite(v)) {
        sb_add(b, "0x%04X", (unsigned)bits);
        return;
      }
      snprintf(num, sizeof num, "%.9g", (double)v);
      add_float_text(b, num);
      return;
    }
    case TOPOS_I32: {
      int32_t v;
      memcpy(&v, (const char *)data + i * 4, 4);
      sb_add(b, "%" PRId32, v);
      return;
    }
  }
}

/* Nested brackets over axes [axis, rank) starting at element *i. */
static void add_nested(sbuf *b, const vtype *t, const void *data, int axis,
                       int64_t *i) {
  if (axis == t->rank) {
    add_element(b, t->et, data, (*i)++);
    return;
  }
  sb_add(b, "[");
  for (int64_t k = 0; k < t->shape[axis]; k++) {
    if (k) sb_add(b, ", ");
    add_nested(b, t, data, axis + 1, i);
  }
  sb_add(b, "]");
}

/* "dense<...>" for count elements of type t in `data` (row-major).  All
 * equal bits print as a splat; no elements as dense<>. */
static void add_dense(sbuf *b, const vtype *t, const void *data,
                      int64_t count) {
  size_t es = topos_dtype_size((topos_dtype)t->et);
  sb_add(b, "dense<");
  if (count > 0) {
    bool splat = true;
    for (int64_t i = 1; i < count && splat; i++)
      splat = memcmp((const char *)data, (const char *)data + i * (int64_t)es,
                     es) == 0;
    if (splat) {
      add_element(b, t->et, data, 0);
    } else {
      int64_t i = 0;
      add_nested(b, t, data, 0, &i);
    }
  }
  sb_add(b, ">");
}

/* ------------------------------------------------------------ op helpers */

static int fail_node(emitter *e, int i, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_node(emitter *e, int i, int code, const char *fmt, ...) {
  if (e->status) return e->status;
  char why[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  e->status = code;
  error_set(e->err, code, "emit: node %d (%s): %s", i,
            op_table[e->nodes[i].op].name, why);
  return code;
}

static void const_line(emitter *e, val r, const char *lit) {
  if (e->generic)
    line(e, "%s = \"stablehlo.constant\"() {value = %s : %s} : () -> %s",
         R(e, r), lit, T(e, &r.t), T(e, &r.t));
  else
    line(e, "%s = stablehlo.constant %s : %s", R(e, r), lit, T(e, &r.t));
}

/* A constant of type t with every element `value` (rounded to t's type). */
static val h_splat(emitter *e, const vtype *t, double value) {
  union {
    float f;
    double d;
    uint16_t h;
    int32_t i;
  } u;
  switch (t->et) {
    case TOPOS_F32:
      u.f = (float)value;
      break;
    case TOPOS_F64:
      u.d = value;
      break;
    case TOPOS_BF16:
      u.h = bf16_from_f64(value);
      break;
    default:
      u.i = (int32_t)value;
  }
  sbuf lit = {0};
  vtype one = vt_scalar(t->et);
  add_dense(&lit, &one, &u, 1);
  val r = new_val(e, t);
  if (lit.oom) {
    e->out.oom = true;
  } else {
    const_line(e, r, lit.p);
  }
  free(lit.p);
  return r;
}

static val h_unary(emitter *e, const char *op, val a) {
  val r = new_val(e, &a.t);
  if (e->generic)
    line(e, "%s = \"stablehlo.%s\"(%s) : (%s) -> %s", R(e, r), op, R(e, a),
         T(e, &a.t), T(e, &r.t));
  else
    line(e, "%s = stablehlo.%s %s : %s", R(e, r), op, R(e, a), T(e, &r.t));
  return r;
}

/* A CHLO unary op (StableHLO has no erf; CHLO is the client dialect that
 * lowers it to StableHLO, which IREE and XLA accept as input).  Its
 * custom assembly names both types. */
static val h_chlo_unary(emitter *e, const char *op, val a) {
  val r = new_val(e, &a.t);
  if (e->generic)
    line(e, "%s = \"chlo.%s\"(%s) : (%s) -> %s", R(e, r), op, R(e, a),
         T(e, &a.t), T(e, &r.t));
  else
    line(e, "%s = chlo.%s %s : %s -> %s", R(e, r), op, R(e, a), T(e, &a.t),
         T(e, &r.t));
  return r;
}

static val h_binary(emitter *e, const char *op, val a, val b) {
  val r = new_val(e, &a.t);
  if (e->generic)
    line(e, "%s = \"stablehlo.%s\"(%s, %s) : (%s, %s) -> %s", R(e, r), op,
         R(e, a), R(e, b), T(e, &a.t), T(e, &b.t), T(e, &r.t));
  else
    line(e, "%s = stablehlo.%s %s, %s : %s", R(e, r), op, R(e, a), R(e, b),
         T(e, &r.t));
  return r;
}

static val h_compare(emitter *e, const char *dir, val a, val b) {
  vtype rt = vt_with_et(a.t, ET_I1);
  val r = new_val(e, &rt);
  if (e->generic)
    line(e,
         "%s = \"stablehlo.compare\"(%s, %s) {comparison_direction = "
         "#stablehlo<comparison_direction %s>} : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, b), dir, T(e, &a.t), T(e, &b.t), T(e, &rt));
  else
    line(e, "%s = stablehlo.compare %s, %s, %s : (%s, %s) -> %s", R(e, r), dir,
         R(e, a), R(e, b), T(e, &a.t), T(e, &b.t), T(e, &rt));
  return r;
}

static val h_select(emitter *e, val p, val a, val b) {
  val r = new_val(e, &a.t);
  if (e->generic)
    line(e, "%s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s",
         R(e, r), R(e, p), R(e, a), R(e, b), T(e, &p.t), T(e, &a.t), T(e, &b.t),
         T(e, &r.t));
  else
    line(e, "%s = stablehlo.select %s, %s, %s : %s, %s", R(e, r), R(e, p),
         R(e, a), R(e, b), T(e, &p.t), T(e, &r.t));
  return r;
}

static val h_convert(emitter *e, val a, int et) {
  vtype rt = vt_with_et(a.t, et);
  val r = new_val(e, &rt);
  if (e->generic)
    line(e, "%s = \"stablehlo.convert\"(%s) : (%s) -> %s", R(e, r), R(e, a),
         T(e, &a.t), T(e, &rt));
  else
    line(e, "%s = stablehlo.convert %s : (%s) -> %s", R(e, r), R(e, a),
         T(e, &a.t), T(e, &rt));
  return r;
}

static val h_reshape(emitter *e, val a, int rank, const int64_t *shape) {
  vtype rt = vt_make(a.t.et, rank, shape);
  val r = new_val(e, &rt);
  if (e->generic)
    line(e, "%s = \"stablehlo.reshape\"(%s) : (%s) -> %s", R(e, r), R(e, a),
         T(e, &a.t), T(e, &rt));
  else
    line(e, "%s = stablehlo.reshape %s : (%s) -> %s", R(e, r), R(e, a),
         T(e, &a.t), T(e, &rt));
  return r;
}

/* result[i] = a[perm[i]]. */
static val h_transpose(emitter *e, val a, const int *perm) {
  vtype rt = a.t;
  int64_t p[TOPOS_MAX_RANK];
  for (int i = 0; i < a.t.rank; i++) {
    p[i] = perm[i];
    rt.shape[i] = a.t.shape[perm[i]];
  }
  val r = new_val(e, &rt);
  if (e->generic)
    line(e, "%s = \"stablehlo.transpose\"(%s) {permutation = %s} : (%s) -> %s",
         R(e, r), R(e, a), A(e, a.t.rank, p), T(e, &a.t), T(e, &rt));
  else
    line(e, "%s = stablehlo.transpose %s, dims = [%s] : (%s) -> %s", R(e, r),
         R(e, a), L(e, a.t.rank, p), T(e, &a.t), T(e, &rt));
  return r;
}

/* Each of a's axes maps to result axis dims[i]. */
static val h_broadcast_in_dim(emitter *e, val a, const vtype *rt,
                              const int64_t *dims) {
  val r = new_val(e, rt);
  if (e->generic)
    line(e,
         "%s = \"stablehlo.broadcast_in_dim\"(%s) {broadcast_dimensions = "
         "%s} : (%s) -> %s",
         R(e, r), R(e, a), A(e, a.t.rank, dims), T(e, &a.t), T(e, rt));
  else
    line(e, "%s = stablehlo.broadcast_in_dim %s, dims = [%s] : (%s) -> %s",
         R(e, r), R(e, a), L(e, a.t.rank, dims), T(e, &a.t), T(e, rt));
  return r;
}

static val h_slice(emitter *e, val a, const int64_t *start,
                   const int64_t *limit, const int64_t *stride) {
  vtype rt = a.t;
  int rank = a.t.rank;
  for (int i = 0; i < rank; i++)
    rt.shape[i] = (limit[i] - start[i] + stride[i] - 1) / stride[i];
  val r = new_val(e, &rt);
  if (e->generic) {
    line(e,
         "%s = \"stablehlo.slice\"(%s) {start_indices = %s, limit_indices = "
         "%s, strides = %s} : (%s) -> %s",
         R(e, r), R(e, a), A(e, rank, start), A(e, rank, limit),
         A(e, rank, stride), T(e, &a.t), T(e, &rt));
  } else {
    char *s = ring_next(e);
    size_t pos = 0;
    for (int i = 0; i < rank; i++)
      pos += (size_t)snprintf(s + pos, RING_TEXT - pos,
                              "%s%" PRId64 ":%" PRId64 ":%" PRId64,
                              i ? ", " : "", start[i], limit[i], stride[i]);
    line(e, "%s = stablehlo.slice %s [%s] : (%s) -> %s", R(e, r), R(e, a), s,
         T(e, &a.t), T(e, &rt));
  }
  return r;
}

static val h_pad(emitter *e, val a, val pv, const int64_t *low,
                 const int64_t *high, const int64_t *interior) {
  vtype rt = a.t;
  int rank = a.t.rank;
  for (int i = 0; i < rank; i++) {
    int64_t n = a.t.shape[i];
    rt.shape[i] = low[i] + high[i] + n + (n > 0 ? (n - 1) * interior[i] : 0);
  }
  val r = new_val(e, &rt);
  if (e->generic)
    line(e,
         "%s = \"stablehlo.pad\"(%s, %s) {edge_padding_high = %s, "
         "edge_padding_low = %s, interior_padding = %s} : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, pv), A(e, rank, high), A(e, rank, low),
         A(e, rank, interior), T(e, &a.t), T(e, &pv.t), T(e, &rt));
  else
    line(e,
         "%s = stablehlo.pad %s, %s, low = [%s], high = [%s], interior = "
         "[%s] : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, pv), L(e, rank, low), L(e, rank, high),
         L(e, rank, interior), T(e, &a.t), T(e, &pv.t), T(e, &rt));
  return r;
}

static val h_concatenate(emitter *e, int n, const val *v, int axis) {
  vtype rt = v[0].t;
  for (int i = 1; i < n; i++) rt.shape[axis] += v[i].t.shape[axis];
  val r = new_val(e, &rt);
  sb_add(&e->out, "%*s%s = %s", e->indent, "", R(e, r),
         e->generic ? "\"stablehlo.concatenate\"(" : "stablehlo.concatenate ");
  for (int i = 0; i < n; i++)
    sb_add(&e->out, "%s%s", i ? ", " : "", R(e, v[i]));
  if (e->generic)
    sb_add(&e->out, ") {dimension = %d : i64} : (", axis);
  else
    sb_add(&e->out, ", dim = %d : (", axis);
  for (int i = 0; i < n; i++)
    sb_add(&e->out, "%s%s", i ? ", " : "", T(e, &v[i].t));
  sb_add(&e->out, ") -> %s\n", T(e, &rt));
  return r;
}

/* a[m,k]·b[k,n] or batched a[B,m,k]·b[B,k,n]. */
static val h_dot_general(emitter *e, val a, val b) {
  int r3 = a.t.rank == 3;
  vtype rt = a.t;
  rt.shape[a.t.rank - 1] = b.t.shape[b.t.rank - 1];
  val r = new_val(e, &rt);
  int lc = r3 ? 2 : 1, rc = r3 ? 1 : 0;
  if (e->generic)
    line(e,
         "%s = \"stablehlo.dot_general\"(%s, %s) {dot_dimension_numbers = "
         "#stablehlo.dot<%slhs_contracting_dimensions = [%d], "
         "rhs_contracting_dimensions = [%d]>} : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, b),
         r3 ? "lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], "
            : "",
         lc, rc, T(e, &a.t), T(e, &b.t), T(e, &rt));
  else
    line(e,
         "%s = stablehlo.dot_general %s, %s, %scontracting_dims = [%d] x "
         "[%d] : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, b), r3 ? "batching_dims = [0] x [0], " : "", lc,
         rc, T(e, &a.t), T(e, &b.t), T(e, &rt));
  return r;
}

/* The body of a reduction region: two scalars in, `op` of them out. */
static void region_body(emitter *e, const char *op, int et) {
  vtype st = vt_scalar(et);
  val x = new_val(e, &st), y = new_val(e, &st);
  const char *ts = T(e, &st);
  line(e, "^bb0(%s: %s, %s: %s):", R(e, x), ts, R(e, y), ts);
  e->indent += 2;
  val z = h_binary(e, op, x, y);
  if (e->generic)
    line(e, "\"stablehlo.return\"(%s) : (%s) -> ()", R(e, z), ts);
  else
    line(e, "stablehlo.return %s : %s", R(e, z), ts);
  e->indent -= 2;
}

/* Reduces a over `dims` (increasing) with `op` ("add" or "maximum"). */
static val h_reduce(emitter *e, val a, val init, int ndims, const int64_t *dims,
                    const char *op) {
  vtype rt = {a.t.et, 0, {0}};
  for (int i = 0, k = 0; i < a.t.rank; i++) {
    if (k < ndims && dims[k] == i) {
      k++;
      continue;
    }
    rt.shape[rt.rank++] = a.t.shape[i];
  }
  val r = new_val(e, &rt);
  if (!e->generic) {
    line(e,
         "%s = stablehlo.reduce(%s init: %s) applies stablehlo.%s across "
         "dimensions = [%s] : (%s, %s) -> %s",
         R(e, r), R(e, a), R(e, init), op, L(e, ndims, dims), T(e, &a.t),
         T(e, &init.t), T(e, &rt));
    return r;
  }
  line(e, "%s = \"stablehlo.reduce\"(%s, %s) ({", R(e, r), R(e, a), R(e, init));
  region_body(e, op, a.t.et);
  line(e, "}) {dimensions = %s} : (%s, %s) -> %s", A(e, ndims, dims),
       T(e, &a.t), T(e, &init.t), T(e, &rt));
  return r;
}

/* The reduction of one axis with a region (op) and a splat init. */
static val reduce_axis(emitter *e, val a, int axis, const char *op,
                       double init) {
  vtype st = vt_scalar(a.t.et);
  val z = h_splat(e, &st, init);
  int64_t dims[TOPOS_MAX_RANK] = {axis};
  return h_reduce(e, a, z, 1, dims, op);
}

/* broadcast_in_dim of a (a's shape with `axis` removed) back to `to`. */
static val broadcast_back(emitter *e, val a, int axis, const vtype *to) {
  int64_t dims[TOPOS_MAX_RANK];
  for (int i = 0; i < a.t.rank; i++) dims[i] = i < axis ? i : i + 1;
  vtype rt = vt_with_et(*to, a.t.et);
  return h_broadcast_in_dim(e, a, &rt, dims);
}

/* "dense<[[a, b], [c, d]]> : tensor<nx2xi64>" for n (low, high) pairs. */
static const char *pad_pairs(emitter *e, int n, const int64_t *low,
                             const int64_t *high) {
  char *s = ring_next(e);
  size_t pos = (size_t)snprintf(s, RING_TEXT, "dense<[");
  for (int i = 0; i < n; i++)
    pos += (size_t)snprintf(s + pos, RING_TEXT - pos,
                            "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "",
                            low[i], high[i]);
  snprintf(s + pos, RING_TEXT - pos, "]> : tensor<%dx2xi64>", n);
  return s;
}

/* The fused convolution: x[N,C,H,W] (b, f, 0, 1) with w[C,kh,kw,O]
 * (i, 0, 1, o) into [N,oh,ow,O] (b, 0, 1, f). */
static val h_convolution(emitter *e, val x, val w, const plan_group *g) {
  int64_t out[4] = {g->N, g->oh, g->ow, w.t.shape[3]};
  vtype rt = vt_make(x.t.et, 4, out);
  val r = new_val(e, &rt);
  int64_t stride[2] = {g->stride_h, g->stride_w};
  int64_t dil[2] = {g->dil_h, g->dil_w};
  int64_t lo[2] = {g->pad_top, g->pad_left},
          hi[2] = {g->pad_bottom, g->pad_right};
  static const int64_t ones[2] = {1, 1};
  if (e->generic) {
    line(e,
         "%s = \"stablehlo.convolution\"(%s, %s) {batch_group_count = 1 : "
         "i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[i, 0, 1, "
         "o]->[b, 0, 1, f]>, feature_group_count = 1 : i64, lhs_dilation = "
         "%s, padding = %s, rhs_dilation = %s, window_strides = %s} : (%s, "
         "%s) -> %s",
         R(e, r), R(e, x), R(e, w), A(e, 2, ones), pad_pairs(e, 2, lo, hi),
         A(e, 2, dil), A(e, 2, stride), T(e, &x.t), T(e, &w.t), T(e, &rt));
  } else {
    line(e,
         "%s = stablehlo.convolution(%s, %s) dim_numbers = [b, f, 0, "
         "1]x[i, 0, 1, o]->[b, 0, 1, f], window = {stride = [%s], pad = "
         "[[%" PRId64 ", %" PRId64 "], [%" PRId64 ", %" PRId64
         "]], lhs_dilate = [1, 1], rhs_dilate = [%s]} {batch_group_count = "
         "1 : i64, feature_group_count = 1 : i64} : (%s, %s) -> %s",
         R(e, r), R(e, x), R(e, w), L(e, 2, stride), lo[0], hi[0], lo[1], hi[1],
         L(e, 2, dil), T(e, &x.t), T(e, &w.t), T(e, &rt));
  }
  return r;
}

/* The fused max pool: windows [1,1,kh,kw] over x[N,C,H,W]. */
static val h_reduce_window_max(emitter *e, val x, val init,
                               const plan_group *g) {
  int64_t wdim[4] = {1, 1, g->kh, g->kw};
  int64_t wstr[4] = {1, 1, g->stride_h, g->stride_w};
  int64_t wdil[4] = {1, 1, g->dil_h, g->dil_w};
  vtype rt = x.t;
  for (int i = 2; i < 4; i++)
    rt.shape[i] = (x.t.shape[i] - ((wdim[i] - 1) * wdil[i] + 1)) / wstr[i] + 1;
  val r = new_val(e, &rt);
  line(e, "%s = \"stablehlo.reduce_window\"(%s, %s) ({", R(e, r), R(e, x),
       R(e, init));
  region_body(e, "maximum", x.t.et);
  line(e,
       "}) {window_dilations = %s, window_dimensions = %s, window_strides = "
       "%s} : (%s, %s) -> %s",
       A(e, 4, wdil), A(e, 4, wdim), A(e, 4, wstr), T(e, &x.t), T(e, &init.t),
       T(e, &rt));
  return r;
}

/* Rows of table[V,d] picked by idx[n] -> [n,d]. */
static val h_gather(emitter *e, val table, val idx) {
  int64_t out[2] = {idx.t.shape[0], table.t.shape[1]};
  vtype rt = vt_make(table.t.et, 2, out);
  val r = new_val(e, &rt);
  int64_t sizes[2] = {1, table.t.shape[1]};
  line(e,
       "%s = \"stablehlo.gather\"(%s, %s) {dimension_numbers = "
       "#stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
       "start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = "
       "false, slice_sizes = %s} : (%s, %s) -> %s",
       R(e, r), R(e, table), R(e, idx), A(e, 2, sizes), T(e, &table.t),
       T(e, &idx.t), T(e, &rt));
  return r;
}

/* rows[n,d] added into zeros[V,d] at rows idx[n]. */
static val h_scatter_add(emitter *e, val zeros, val idx, val rows) {
  val r = new_val(e, &zeros.t);
  line(e, "%s = \"stablehlo.scatter\"(%s, %s, %s) ({", R(e, r), R(e, zeros),
       R(e, idx), R(e, rows));
  region_body(e, "add", zeros.t.et);
  line(e,
       "}) {indices_are_sorted = false, scatter_dimension_numbers = "
       "#stablehlo.scatter<update_window_dims = [1], inserted_window_dims = "
       "[0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
       "unique_indices = false} : (%s, %s, %s) -> %s",
       T(e, &zeros.t), T(e, &idx.t), T(e, &rows.t), T(e, &r.t));
  return r;
}

/* bf16 arithmetic runs in f32 (the reference's compute type). */
static val widen(emitter *e, val v) {
  return v.t.et == TOPOS_BF16 ? h_convert(e, v, TOPOS_F32) : v;
}

static val narrow_to(emitter *e, val v, int et) {
  return v.t.et != et ? h_convert(e, v, et) : v;
}

/* ------------------------------------------------------------- lowering */

static int lower_node(emitter *e, int i);

/* The SSA value of node j as an operand of node i: computed already, or
 * a constant emitted on first use. */
static int operand(emitter *e, int i, int32_t j, val *out) {
  if (j < 0 || j >= e->plan->net->n)
    return fail_node(e, i, TOPOS_ERR_STATE, "operand node %d does not exist",
                     (int)j);
  if (!e->done[j] && e->nodes[j].op == OP_CONSTANT && !e->visiting[j])
    if (lower_node(e, j)) return e->status;
  if (!e->done[j])
    return fail_node(e, i, TOPOS_ERR_STATE,
                     "operand node %d (%s) is not computed before it in the "
                     "plan's schedule",
                     (int)j, op_table[e->nodes[j].op].name);
  *out = e->vals[j];
  return 0;
}

static val lower_constant(emitter *e, const node *n) {
  const topos_tensor *t = n->at.tensor;
  vtype vt = vt_of(&n->meta);
  int64_t count = shape_count(vt.rank, vt.shape);
  size_t bytes = (size_t)(count > 0 ? count : 1) * topos_dtype_size(t->dtype);
  void *data = malloc(bytes);
  val r = new_val(e, &vt);
  sbuf lit = {0};
  if (!data || topos_tensor_read(t, data, bytes, NULL) != TOPOS_OK) {
    e->out.oom = true;
  } else {
    add_dense(&lit, &vt, data, count);
    if (lit.oom)
      e->out.oom = true;
    else
      const_line(e, r, lit.p);
  }
  free(lit.p);
  free(data);
  return r;
}

static val lower_unfold(emitter *e, const node *n, val a) {
  const node_attrs *at = &n->at;
  int ax = at->axis, rank = a.t.rank;
  int64_t count = n->meta.shape[ax];
  int64_t start[TOPOS_MAX_RANK], limit[TOPOS_MAX_RANK], step[TOPOS_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    start[i] = 0;
    limit[i] = a.t.shape[i];
    step[i] = 1;
  }
  /* Window element s of every window: a strided slice, given a unit axis
   * after the window axis, then the size slices side by side. */
  int64_t size = at->size;
  val *parts = malloc(sizeof(val) * (size_t)size);
  if (!parts) {
    e->out.oom = true;
    return a;
  }
  for (int64_t s = 0; s < size; s++) {
    start[ax] = s * at->dilation;
    limit[ax] = start[ax] + (count - 1) * at->step + 1;
    step[ax] = at->step;
    val sl = h_slice(e, a, start, limit, step);
    int64_t shape[TOPOS_MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++) {
      shape[j++] = sl.t.shape[i];
      if (i == ax) shape[j++] = 1;
    }
    parts[s] = h_reshape(e, sl, rank + 1, shape);
  }
  val r = size == 1 ? parts[0] : h_concatenate(e, (int)size, parts, ax + 1);
  free(parts);
  return r;
}

/* Window element s of every window goes back to position c·step +
 * s·dilation: a slice of the window axis, padded out with interior
 * padding step−1.  The slices are summed from the last window element to
 * the first, so each output adds its contributions in window order as the
 * reference does. */
static val lower_fold(emitter *e, const node *n, val a) {
  const node_attrs *at = &n->at;
  int ax = at->axis, rank = a.t.rank;
  int64_t count = a.t.shape[ax];
  int64_t start[TOPOS_MAX_RANK], limit[TOPOS_MAX_RANK], ones[TOPOS_MAX_RANK];
  int64_t low[TOPOS_MAX_RANK] = {0}, high[TOPOS_MAX_RANK] = {0},
          interior[TOPOS_MAX_RANK] = {0};
  for (int i = 0; i < rank; i++) {
    start[i] = 0;
    limit[i] = a.t.shape[i];
    ones[i] = 1;
  }
  vtype st = vt_scalar(a.t.et);
  val zero = h_splat(e, &st, 0.0);
  val sum = {0, {0}};
  bool have = false;
  for (int64_t s = at->size - 1; s >= 0; s--) {
    start[ax + 1] = s;
    limit[ax + 1] = s + 1;
    val sl = h_slice(e, a, start, limit, ones);
    int64_t shape[TOPOS_MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
      if (i != ax + 1) shape[j++] = sl.t.shape[i];
    val row = h_reshape(e, sl, rank - 1, shape);
    int64_t first = s * at->dilation;
    low[ax] = first;
    high[ax] = at->extent - (first + (count - 1) * at->step + 1);
    interior[ax] = at->step - 1;
    val placed = h_pad(e, row, zero, low, high, interior);
    sum = have ? h_binary(e, "add", sum, placed) : placed;
    have = true;
  }
  return sum;
}

/* logsumexp / log_softmax as the reference computes them: shift by the
 * axis maximum (0 where that maximum is infinite), sum the exponentials,
 * take the log. */
static val lower_lse(emitter *e, const node *n, val a) {
  int ax = n->at.axis;
  val m = reduce_axis(e, a, ax, "maximum", -INFINITY);
  val mag = h_unary(e, "abs", m);
  val inf = h_splat(e, &m.t, INFINITY);
  val zero = h_splat(e, &m.t, 0.0);
  val is_inf = h_compare(e, "EQ", mag, inf);
  val shift = h_select(e, is_inf, zero, m);
  val shifted = h_binary(e, "subtract", a, broadcast_back(e, shift, ax, &a.t));
  val ex = h_unary(e, "exponential", shifted);
  val lse = h_unary(e, "log", reduce_axis(e, ex, ax, "add", 0.0));
  if (n->op == OP_LOGSUMEXP) return h_binary(e, "add", shift, lse);
  return h_binary(e, "subtract", shifted, broadcast_back(e, lse, ax, &a.t));
}

/* The op of one node; `in` holds its operands. */
static val lower_op(emitter *e, int i, const val *in) {
  const node *n = &e->nodes[i];
  const node_attrs *at = &n->at;
  val a = in[0];
  int et = a.t.et;
  switch (n->op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV: {
      static const char *names[] = {"add", "subtract", "multiply", "divide"};
      const char *name = names[n->op - OP_ADD];
      return narrow_to(e, h_binary(e, name, widen(e, a), widen(e, in[1])), et);
    }
    case OP_NEG:
      return h_unary(e, "negate", a);
    case OP_EXP:
    case OP_LOG:
    case OP_SQRT:
    case OP_TANH: {
      static const char *names[] = {"exponential", "log", "sqrt", "tanh"};
      return narrow_to(e, h_unary(e, names[n->op - OP_EXP], widen(e, a)), et);
    }
    case OP_ERF:
      return narrow_to(e, h_chlo_unary(e, "erf", widen(e, a)), et);
    case OP_POW: {
      val w = widen(e, a);
      val p = h_splat(e, &w.t, at->p);
      return narrow_to(e, h_binary(e, "power", w, p), et);
    }
    case OP_MAXIMUM: {
      /* a if a is NaN, else b if b is NaN, else a ≥ b ? a : b (ties to a),
       * exactly the reference's rule. */
      val ge = h_compare(e, "GE", a, in[1]);
      val pick = h_select(e, ge, a, in[1]);
      val a_nan = h_compare(e, "NE", a, a);
      return h_select(e, a_nan, a, pick);
    }
    case OP_STEP: {
      val ge = h_compare(e, "GE", a, in[1]);
      val one = h_splat(e, &a.t, 1.0), zero = h_splat(e, &a.t, 0.0);
      return h_select(e, ge, one, zero);
    }
    case OP_RELU: {
      /* x ≤ 0 (-0 included) gives +0; NaN fails the test and stays. */
      val zero = h_splat(e, &a.t, 0.0);
      val le = h_compare(e, "LE", a, zero);
      return h_select(e, le, zero, a);
    }
    case OP_MATMUL:
      return narrow_to(e, h_dot_general(e, widen(e, a), widen(e, in[1])), et);
    case OP_TRANSPOSE: {
      static const int swap[TOPOS_MAX_RANK] = {1, 0};
      return h_transpose(e, a, swap);
    }
    case OP_PERMUTE:
      return h_transpose(e, a, at->perm);
    case OP_RESHAPE:
      return h_reshape(e, a, at->rank, at->shape);
    case OP_NARROW: {
      int64_t start[TOPOS_MAX_RANK] = {0}, limit[TOPOS_MAX_RANK] = {0},
              step[TOPOS_MAX_RANK] = {0};
      for (int k = 0; k < a.t.rank; k++) {
        start[k] = 0;
        limit[k] = a.t.shape[k];
        step[k] = 1;
      }
      start[at->axis] = at->start;
      limit[at->axis] = at->start + at->length;
      return h_slice(e, a, start, limit, step);
    }
    case OP_PAD: {
      int64_t low[TOPOS_MAX_RANK] = {0}, high[TOPOS_MAX_RANK] = {0},
              interior[TOPOS_MAX_RANK] = {0};
      low[at->axis] = at->before;
      high[at->axis] = at->after;
      vtype st = vt_scalar(et);
      return h_pad(e, a, h_splat(e, &st, 0.0), low, high, interior);
    }
    case OP_UNFOLD:
      return lower_unfold(e, n, a);
    case OP_FOLD:
      return narrow_to(e, lower_fold(e, n, widen(e, a)), et);
    case OP_CONCAT:
      return h_concatenate(e, n->nin, in, at->axis);
    case OP_BROADCAST: {
      int64_t dims[TOPOS_MAX_RANK];
      for (int k = 0; k < a.t.rank; k++) dims[k] = k;
      vtype rt = vt_of(&n->meta);
      return h_broadcast_in_dim(e, a, &rt, dims);
    }
    case OP_BROADCAST_ALONG: {
      vtype rt = vt_of(&n->meta);
      return broadcast_back(e, a, at->axis, &rt);
    }
    case OP_SUM: {
      if (a.t.rank == 0) return a; /* the sum of one element is itself */
      val w = widen(e, a);
      vtype st = vt_scalar(w.t.et);
      int64_t dims[TOPOS_MAX_RANK];
      for (int k = 0; k < a.t.rank; k++) dims[k] = k;
      val r = h_reduce(e, w, h_splat(e, &st, 0.0), a.t.rank, dims, "add");
      return narrow_to(e, r, et);
    }
    case OP_SUM_ALONG:
      return narrow_to(e, reduce_axis(e, widen(e, a), at->axis, "add", 0.0),
                       et);
    case OP_MAX_ALONG:
      return reduce_axis(e, a, at->axis, "maximum", -INFINITY);
    case OP_LOG_SOFTMAX:
    case OP_LOGSUMEXP:
      return narrow_to(e, lower_lse(e, n, widen(e, a)), et);
    case OP_GATHER:
      return h_gather(e, a, in[1]);
    case OP_SCATTER: {
      val rows = widen(e, a);
      int64_t shape[2] = {at->extent, a.t.shape[1]};
      vtype zt = vt_make(rows.t.et, 2, shape);
      val zeros = h_splat(e, &zt, 0.0);
      return narrow_to(e, h_scatter_add(e, zeros, in[1], rows), et);
    }
    case OP_CONSTANT:
    case OP_PARAMETER:
    case OP_INPUT:
    case OP_COUNT:
      break;
  }
  fail_node(e, i, TOPOS_ERR_ARGUMENT, "no StableHLO lowering for this op");
  return a;
}

/* Records node i's value after checking it has the node's type. */
static int finish(emitter *e, int i, val r) {
  vtype want = vt_of(&e->nodes[i].meta);
  if (!vt_equal(&r.t, &want)) {
    char got[RING_TEXT], need[RING_TEXT];
    snprintf(got, sizeof got, "%s", T(e, &r.t));
    snprintf(need, sizeof need, "%s", T(e, &want));
    return fail_node(e, i, TOPOS_ERR_STATE, "lowered to %s but the node is %s",
                     got, need);
  }
  e->vals[i] = r;
  e->done[i] = true;
  return 0;
}

static int lower_node(emitter *e, int i) {
  const node *n = &e->nodes[i];
  if (e->done[i]) return 0;
  if (n->op == OP_PARAMETER || n->op == OP_INPUT)
    return fail_node(e, i, TOPOS_ERR_STATE, "leaf has no function argument");
  if (n->op >= OP_COUNT || n->op < 0)
    return fail_node(e, i, TOPOS_ERR_ARGUMENT, "unknown op %d", (int)n->op);
  e->visiting[i] = true;
  val r;
  if (n->op == OP_CONSTANT) {
    r = lower_constant(e, n);
  } else {
    val *in = calloc((size_t)(n->nin > 0 ? n->nin : 1), sizeof(val));
    if (!in) {
      e->visiting[i] = false;
      e->out.oom = true;
      return fail_node(e, i, TOPOS_ERR_MEMORY, "out of memory");
    }
    for (int k = 0; k < n->nin; k++)
      if (operand(e, i, n->in[k], &in[k])) {
        free(in);
        e->visiting[i] = false;
        return e->status;
      }
    r = lower_op(e, i, in);
    free(in);
  }
  e->visiting[i] = false;
  if (e->status) return e->status;
  if (e->out.oom) return fail_node(e, i, TOPOS_ERR_MEMORY, "out of memory");
  return finish(e, i, r);
}

static bool meta_is(const tensor_meta *m, int rank, const int64_t *shape) {
  return shape_equal(m->rank, m->shape, rank, shape);
}

/* A window count along one axis, or -1 when the window does not fit. */
static int64_t window_count(int64_t extent, int64_t lo, int64_t hi, int64_t k,
                            int64_t stride, int64_t dil) {
  if (k < 1 || stride < 1 || dil < 1 || lo < 0 || hi < 0) return -1;
  int64_t span = (k - 1) * dil + 1, padded = extent + lo + hi;
  return padded < span ? -1 : (padded - span) / stride + 1;
}

/* Whether a group's recorded geometry agrees with the nodes it fuses; a
 * group that does not is emitted node by node instead. */
static bool group_fits(const emitter *e, const plan_group *g) {
  /* Attention has no single StableHLO op: its members are ordinary ops. */
  if (g->kind == GROUP_ATTENTION || g->kind == GROUP_GELU) return false;
  int n = e->plan->net->n;
  if (g->x < 0 || g->x >= n || g->head < 0 || g->head >= n) return false;
  const node *x = &e->nodes[g->x], *head = &e->nodes[g->head];
  int64_t xs[4] = {g->N, g->C, g->H, g->W};
  if (!meta_is(&x->meta, 4, xs) || !dtype_is_float(x->meta.dtype)) return false;
  if (window_count(g->H, g->pad_top, g->pad_bottom, g->kh, g->stride_h,
                   g->dil_h) != g->oh ||
      window_count(g->W, g->pad_left, g->pad_right, g->kw, g->stride_w,
                   g->dil_w) != g->ow)
    return false;
  if (g->kind == GROUP_POOL) {
    int64_t hs[4] = {g->N, g->C, g->oh, g->ow};
    return head->op == OP_MAX_ALONG && meta_is(&head->meta, 4, hs);
  }
  if (g->kind != GROUP_CONV || head->op != OP_MATMUL || head->nin != 2 ||
      head->in[1] != g->weight || g->weight < 0 || g->weight >= n)
    return false;
  const tensor_meta *w = &e->nodes[g->weight].meta;
  if (w->rank != 2 || w->shape[0] != g->C * g->kh * g->kw) return false;
  int64_t hs[2] = {g->N * g->oh * g->ow, w->shape[1]};
  return meta_is(&head->meta, 2, hs);
}

static int lower_group(emitter *e, const plan_group *g) {
  if (!group_fits(e, g)) {
    /* The members are ordinary nodes: lowering them one by one is always
     * correct, only slower to run. */
    for (int k = 0; k < g->nmembers; k++)
      if (lower_node(e, g->members[k])) return e->status;
    return lower_node(e, g->head);
  }
  int i = g->head;
  val x = {0, {0}};
  if (operand(e, i, g->x, &x)) return e->status;
  int et = x.t.et;
  val r;
  if (g->kind == GROUP_CONV) {
    val w = {0, {0}};
    if (operand(e, i, g->weight, &w)) return e->status;
    int64_t kshape[4] = {g->C, g->kh, g->kw, w.t.shape[1]};
    val xw = widen(e, x);
    val k = h_reshape(e, widen(e, w), 4, kshape);
    val y = h_convolution(e, xw, k, g);
    int64_t rows[2] = {g->N * g->oh * g->ow, w.t.shape[1]};
    r = narrow_to(e, h_reshape(e, y, 2, rows), et);
  } else {
    if (g->pad_top || g->pad_bottom || g->pad_left || g->pad_right) {
      int64_t low[4] = {0, 0, g->pad_top, g->pad_left};
      int64_t high[4] = {0, 0, g->pad_bottom, g->pad_right};
      int64_t interior[4] = {0, 0, 0, 0};
      vtype st = vt_scalar(et);
      x = h_pad(e, x, h_splat(e, &st, 0.0), low, high, interior);
    }
    /* Windows that stop short of the end leave rows or columns no window
     * reads; slice them off first.  The same values (reduce_window skips
     * them too), and IREE 3.13 cannot compile a reduce_window whose
     * output has extent 1 on an axis with such a remainder (3x4 pooled
     * 3x3/3 into 1x1); docs/emission.md. */
    int64_t reach[4] = {g->N, g->C,
                        (g->oh - 1) * g->stride_h + (g->kh - 1) * g->dil_h + 1,
                        (g->ow - 1) * g->stride_w + (g->kw - 1) * g->dil_w + 1};
    if (reach[2] < x.t.shape[2] || reach[3] < x.t.shape[3]) {
      static const int64_t zeros[4] = {0, 0, 0, 0}, ones[4] = {1, 1, 1, 1};
      x = h_slice(e, x, zeros, reach, ones);
    }
    vtype st = vt_scalar(et);
    r = h_reduce_window_max(e, x, h_splat(e, &st, -INFINITY), g);
  }
  if (e->out.oom) return fail_node(e, i, TOPOS_ERR_MEMORY, "out of memory");
  return finish(e, i, r);
}

/* ----------------------------------------------------------------- driver */

static int check_plan(const topos_plan *plan, topos_error *err) {
  const topos_network *net = plan->net;
  if (!net || net->n < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT, "emit: the plan has no network");
  if ((plan->nroots > 0 && !plan->roots) ||
      (plan->nobserves > 0 && !plan->observes) ||
      (plan->nschedule > 0 && !plan->schedule) || plan->nroots < 0 ||
      plan->nobserves < 0 || plan->nschedule < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT, "emit: the plan is malformed");
  for (int k = 0; k < plan->nroots + plan->nobserves; k++) {
    int32_t j =
        k < plan->nroots ? plan->roots[k] : plan->observes[k - plan->nroots];
    if (j < 0 || j >= net->n)
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "emit: result %d names node %d, outside the network", k,
                       (int)j);
  }
  return 0;
}

static void emit_signature(emitter *e) {
  const topos_network *net = e->plan->net;
  const topos_plan *plan = e->plan;
  sb_add(&e->out, "module {\n  func.func @main(");
  int arg = 0;
  for (int pass = 0; pass < 2; pass++) {
    int count = pass == 0 ? net->nparams : net->ninputs;
    const int32_t *slots = pass == 0 ? net->param_nodes : net->input_nodes;
    for (int s = 0; s < count; s++, arg++) {
      int32_t j = slots[s];
      val v = {-arg - 1, vt_of(&e->nodes[j].meta)};
      e->vals[j] = v;
      e->done[j] = true;
      sb_add(&e->out, "%s%s: %s", arg ? ", " : "", R(e, v), T(e, &v.t));
    }
  }
  sb_add(&e->out, ") -> (");
  int nres = plan->nroots + plan->nobserves;
  for (int k = 0; k < nres; k++) {
    int32_t j =
        k < plan->nroots ? plan->roots[k] : plan->observes[k - plan->nroots];
    vtype t = vt_of(&e->nodes[j].meta);
    sb_add(&e->out, "%s%s", k ? ", " : "", T(e, &t));
  }
  sb_add(&e->out, ") {\n");
}

static int emit_return(emitter *e) {
  const topos_plan *plan = e->plan;
  int nres = plan->nroots + plan->nobserves;
  val *res = malloc(sizeof(val) * (size_t)(nres > 0 ? nres : 1));
  if (!res) return error_set(e->err, TOPOS_ERR_MEMORY, "emit: out of memory");
  for (int k = 0; k < nres; k++) {
    int32_t j =
        k < plan->nroots ? plan->roots[k] : plan->observes[k - plan->nroots];
    if (!e->done[j] && e->nodes[j].op == OP_CONSTANT && lower_node(e, j)) break;
    if (!e->done[j]) {
      fail_node(e, j, TOPOS_ERR_STATE,
                "the plan asks for it as a %s but its schedule does not "
                "compute it",
                k < plan->nroots ? "root" : "observe");
      break;
    }
    res[k] = e->vals[j];
  }
  if (!e->status) {
    sb_add(&e->out, "%*s", e->indent, "");
    if (e->generic) {
      sb_add(&e->out, "\"func.return\"(");
      for (int k = 0; k < nres; k++)
        sb_add(&e->out, "%s%s", k ? ", " : "", R(e, res[k]));
      sb_add(&e->out, ") : (");
      for (int k = 0; k < nres; k++)
        sb_add(&e->out, "%s%s", k ? ", " : "", T(e, &res[k].t));
      sb_add(&e->out, ") -> ()\n");
    } else {
      sb_add(&e->out, "return");
      for (int k = 0; k < nres; k++)
        sb_add(&e->out, "%s%s", k ? ", " : " ", R(e, res[k]));
      if (nres) sb_add(&e->out, " :");
      for (int k = 0; k < nres; k++)
        sb_add(&e->out, "%s%s", k ? ", " : " ", T(e, &res[k].t));
      sb_add(&e->out, "\n");
    }
    sb_add(&e->out, "  }\n}\n");
  }
  free(res);
  return e->status;
}

char *topos_plan_emit_stablehlo(const topos_plan *plan, topos_emit_form form,
                                topos_error *err) {
  if (!plan) {
    error_set(err, TOPOS_ERR_ARGUMENT, "emit: plan is NULL");
    return NULL;
  }
  if (form != TOPOS_EMIT_PRETTY && form != TOPOS_EMIT_GENERIC) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "emit: form %d is neither pretty (%d) nor generic (%d)",
              (int)form, TOPOS_EMIT_PRETTY, TOPOS_EMIT_GENERIC);
    return NULL;
  }
  if (check_plan(plan, err)) return NULL;
  int n = plan->net->n;
  emitter *e = calloc(1, sizeof *e);
  if (!e) {
    error_set(err, TOPOS_ERR_MEMORY, "emit: out of memory");
    return NULL;
  }
  e->plan = plan;
  e->nodes = plan->net->nodes;
  e->generic = form == TOPOS_EMIT_GENERIC;
  e->err = err;
  e->indent = 4;
  size_t cells = (size_t)(n > 0 ? n : 1);
  e->vals = calloc(cells, sizeof(val));
  e->done = calloc(cells, sizeof(bool));
  e->visiting = calloc(cells, sizeof(bool));
  char *text = NULL;
  if (!e->vals || !e->done || !e->visiting) {
    error_set(err, TOPOS_ERR_MEMORY, "emit: out of memory");
    goto done;
  }
  emit_signature(e);
  for (int p = 0; p < plan->nschedule && !e->status; p++) {
    int32_t i = plan->schedule[p];
    if (i < 0 || i >= n) {
      error_set(err, TOPOS_ERR_STATE,
                "emit: schedule position %d names node %d, outside the "
                "network",
                p, (int)i);
      e->status = TOPOS_ERR_STATE;
      break;
    }
    if (e->done[i]) continue;
    int32_t g = plan->group_of ? plan->group_of[i] : -1;
    if (g >= 0 && g < plan->ngroups && plan->groups[g].head == i)
      lower_group(e, &plan->groups[g]);
    else
      lower_node(e, i);
  }
  if (!e->status) emit_return(e);
  if (!e->status && e->out.oom)
    e->status = error_set(err, TOPOS_ERR_MEMORY, "emit: out of memory");
  if (!e->status) {
    text = e->out.p;
    e->out.p = NULL;
  }
done:
  free(e->out.p);
  free(e->vals);
  free(e->done);
  free(e->visiting);
  free(e);
  return text;
}
