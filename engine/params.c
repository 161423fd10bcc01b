/*
 * params.c - parameter sets (one tensor per slot) and fields (one tensor
 * per node of a network), and the elementwise algebra over both.
 *
 * Both are immutable values: every operation builds a new set or field
 * and only retains the tensors it shares.  The algebra is written once,
 * over arrays of tensors (algebra_apply); a parameter set hands it its
 * slots, a field its nodes.  What each operation computes:
 *
 *  - add:   a+b in the dtype (f32 in float, f64 in double, bf16 widened to
 *           f32, added, rounded once to bf16), as numerics.md defines add.
 *  - scale: x*s with s first rounded to the dtype, then multiplied like
 *           add adds.
 *  - map/zip: each element widened exactly to double, fn called, the
 *           double result rounded once to the dtype (bf16 straight from
 *           double, not through an f32 rounding first).
 *
 * Operands match slot by slot in dtype and shape.  i32 tensors take no
 * part in arithmetic: a parameter set holding one is rejected, while a
 * field passes its i32 nodes through unchanged (index data carries no
 * gradient: backward gives those nodes exact i32 zeros, and refusing
 * them would refuse the field of every network with an index input;
 * map and zip do not call fn on them).  Inputs may be strided or
 * broadcast views (a field's zeros are one element broadcast by stride
 * 0): they are read through compute views, and every result is a fresh
 * contiguous tensor.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------ bf16 rounding */

/* --------------------------------------------------------------- the algebra
 */

typedef enum algebra_kind {
  ALGEBRA_ADD,
  ALGEBRA_SCALE,
  ALGEBRA_MAP,
  ALGEBRA_ZIP
} algebra_kind;

typedef struct algebra_op {
  algebra_kind kind;
  const char *name; /* for messages: "params_add", "field_zip", ... */
  double s;         /* scale */
  topos_map_fn map;
  topos_zip_fn zip;
  void *ctx;
  bool pass_ints; /* fields: i32 elements pass through, see above */
} algebra_op;

static bool algebra_binary(const algebra_op *op) {
  return op->kind == ALGEBRA_ADD || op->kind == ALGEBRA_ZIP;
}

/* Checks every element of the operands before anything is computed:
 * `unit` names what an index is ("slot" or "node"). */
static int algebra_check(const algebra_op *op, int n, topos_tensor *const *a,
                         topos_tensor *const *b, const char *unit,
                         topos_error *err) {
  if (op->kind == ALGEBRA_MAP && op->map == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: fn is NULL", op->name);
  if (op->kind == ALGEBRA_ZIP && op->zip == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: fn is NULL", op->name);
  for (int i = 0; i < n; i++) {
    const topos_tensor *x = a[i];
    if (x == NULL)
      return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s %d has no tensor",
                       op->name, unit, i);
    if (!dtype_is_float(x->dtype) && !(op->pass_ints && x->dtype == TOPOS_I32))
      return error_set(err, TOPOS_ERR_DTYPE,
                       "%s: %s %d is %s; the algebra takes f32, f64 or bf16",
                       op->name, unit, i, topos_dtype_name(x->dtype));
    if (!algebra_binary(op)) continue;
    const topos_tensor *y = b[i];
    if (y == NULL)
      return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s %d has no tensor",
                       op->name, unit, i);
    if (y->dtype != x->dtype)
      return error_set(err, TOPOS_ERR_DTYPE, "%s: %s %d: %s vs %s", op->name,
                       unit, i, topos_dtype_name(x->dtype),
                       topos_dtype_name(y->dtype));
    if (!shape_equal(x->rank, x->shape, y->rank, y->shape)) {
      char sa[SHAPE_TEXT], sb[SHAPE_TEXT];
      return error_set(err, TOPOS_ERR_SHAPE, "%s: %s %d: %s vs %s", op->name,
                       unit, i, shape_text(sa, x->rank, x->shape),
                       shape_text(sb, y->rank, y->shape));
    }
  }
  return TOPOS_OK;
}

/* One element in double: f64 tensors, and map/zip of every dtype. */
static double algebra_f64(const algebra_op *op, double x, double y) {
  switch (op->kind) {
    case ALGEBRA_ADD:
      return x + y;
    case ALGEBRA_SCALE:
      return x * op->s;
    case ALGEBRA_MAP:
      return op->map(x, op->ctx);
    case ALGEBRA_ZIP:
      return op->zip(x, y, op->ctx);
  }
  return NAN;
}

/* One element of f32 and bf16 add/scale: computed in f32 (numerics.md). */
static float algebra_f32(const algebra_op *op, float x, float y, float s) {
  return op->kind == ALGEBRA_ADD ? x + y : x * s;
}

/* The result tensor for one pair of operands (b ignored when unary). */
static topos_tensor *algebra_tensor(const algebra_op *op, const topos_tensor *a,
                                    const topos_tensor *b, topos_error *err) {
  compute_view va = {0}, vb = {0};
  topos_tensor *out = NULL;
  if (compute_view_of(a, &va, err) != TOPOS_OK) return NULL;
  if (algebra_binary(op) && compute_view_of(b, &vb, err) != TOPOS_OK) goto done;
  out = tensor_new(a->dtype, a->rank, a->shape, err);
  if (out == NULL) goto done;
  int64_t n = shape_count(a->rank, a->shape);
  void *dst = tensor_data(out);
  if (a->dtype == TOPOS_F64) {
    const double *x = va.data, *y = vb.data;
    double *o = dst;
    for (int64_t i = 0; i < n; i++) o[i] = algebra_f64(op, x[i], y ? y[i] : 0);
    goto done;
  }
  /* f32 and bf16 both read as float. */
  const float *x = va.data, *y = vb.data;
  bool in_f32 = op->kind == ALGEBRA_ADD || op->kind == ALGEBRA_SCALE;
  float s = 0;
  if (op->kind == ALGEBRA_SCALE)
    s = a->dtype == TOPOS_BF16 ? topos_bf16_to_f32(bf16_from_f64(op->s))
                               : (float)op->s;
  for (int64_t i = 0; i < n; i++) {
    float yi = y ? y[i] : 0;
    if (a->dtype == TOPOS_F32) {
      ((float *)dst)[i] = in_f32 ? algebra_f32(op, x[i], yi, s)
                                 : (float)algebra_f64(op, x[i], yi);
    } else {
      ((uint16_t *)dst)[i] =
          in_f32 ? topos_bf16_from_f32(algebra_f32(op, x[i], yi, s))
                 : bf16_from_f64(algebra_f64(op, x[i], yi));
    }
  }
done:
  compute_view_done(&va);
  compute_view_done(&vb);
  return out;
}

/* Fills out[0..n) with op applied to a (and b), or fills nothing and
 * returns a status. */
static int algebra_apply(const algebra_op *op, int n, topos_tensor *const *a,
                         topos_tensor *const *b, topos_tensor **out,
                         const char *unit, topos_error *err) {
  int rc = algebra_check(op, n, a, b, unit, err);
  if (rc != TOPOS_OK) return rc;
  for (int i = 0; i < n; i++) {
    topos_error local = {0};
    if (a[i]->dtype == TOPOS_I32) { /* only where pass_ints allows it */
      out[i] = topos_tensor_retain(a[i]);
      continue;
    }
    out[i] = algebra_tensor(op, a[i], algebra_binary(op) ? b[i] : NULL, &local);
    if (out[i] == NULL) {
      for (int j = 0; j < i; j++) {
        topos_tensor_release(out[j]);
        out[j] = NULL;
      }
      return error_set(err, local.code ? local.code : TOPOS_ERR_MEMORY,
                       "%s: %s %d: %s", op->name, unit, i, local.message);
    }
  }
  return TOPOS_OK;
}

/* ----------------------------------------------------------- parameter sets
 */

topos_params *params_alloc(int n) {
  if (n < 0) return NULL;
  topos_params *p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  p->t = calloc((size_t)(n > 0 ? n : 1), sizeof *p->t);
  if (p->t == NULL) {
    free(p);
    return NULL;
  }
  p->n = n;
  return p;
}

topos_params *topos_params_new(int n, topos_tensor *const *tensors,
                               topos_error *err) {
  if (n < 0) {
    error_set(err, TOPOS_ERR_ARGUMENT, "params_new: negative count %d", n);
    return NULL;
  }
  if (n > 0 && tensors == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "params_new: tensors is NULL");
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    if (tensors[i] == NULL) {
      error_set(err, TOPOS_ERR_ARGUMENT, "params_new: slot %d is NULL", i);
      return NULL;
    }
  }
  topos_params *p = params_alloc(n);
  if (p == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "params_new: out of memory");
    return NULL;
  }
  for (int i = 0; i < n; i++) p->t[i] = topos_tensor_retain(tensors[i]);
  return p;
}

void topos_params_free(topos_params *p) {
  if (p == NULL) return;
  for (int i = 0; i < p->n; i++) topos_tensor_release(p->t[i]);
  free(p->t);
  free(p);
}

int topos_params_count(const topos_params *p) {
  return p ? p->n : 0;
}

const topos_tensor *topos_params_get(const topos_params *p, int slot) {
  if (p == NULL || slot < 0 || slot >= p->n) return NULL;
  return p->t[slot];
}

topos_params *topos_params_with(const topos_params *p, int slot,
                                const topos_tensor *tensor, topos_error *err) {
  if (p == NULL || tensor == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "params_with: %s is NULL",
              p == NULL ? "params" : "tensor");
    return NULL;
  }
  if (slot < 0 || slot >= p->n) {
    error_set(err, TOPOS_ERR_RANGE, "params_with: slot %d of %d", slot, p->n);
    return NULL;
  }
  topos_params *q = params_alloc(p->n);
  if (q == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "params_with: out of memory");
    return NULL;
  }
  for (int i = 0; i < p->n; i++)
    q->t[i] = topos_tensor_retain(i == slot ? tensor : p->t[i]);
  return q;
}

bool topos_params_bitwise_equal(const topos_params *a, const topos_params *b) {
  if (a == NULL || b == NULL) return a == b;
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (!topos_tensor_bitwise_equal(a->t[i], b->t[i])) return false;
  return true;
}

/* A new set holding op(a, b), or NULL with err. */
static topos_params *params_algebra(const algebra_op *op, const topos_params *a,
                                    const topos_params *b, topos_error *err) {
  if (a == NULL || (algebra_binary(op) && b == NULL)) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: params is NULL", op->name);
    return NULL;
  }
  if (algebra_binary(op) && a->n != b->n) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: %d slots vs %d", op->name, a->n,
              b->n);
    return NULL;
  }
  topos_params *out = params_alloc(a->n);
  if (out == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", op->name);
    return NULL;
  }
  if (algebra_apply(op, a->n, a->t, b ? b->t : NULL, out->t, "slot", err) !=
      TOPOS_OK) {
    topos_params_free(out);
    return NULL;
  }
  return out;
}

topos_params *topos_params_add(const topos_params *a, const topos_params *b,
                               topos_error *err) {
  algebra_op op = {.kind = ALGEBRA_ADD, .name = "params_add"};
  return params_algebra(&op, a, b, err);
}

topos_params *topos_params_scale(const topos_params *a, double s,
                                 topos_error *err) {
  algebra_op op = {.kind = ALGEBRA_SCALE, .name = "params_scale", .s = s};
  return params_algebra(&op, a, NULL, err);
}

topos_params *topos_params_map(const topos_params *a, topos_map_fn fn,
                               void *ctx, topos_error *err) {
  algebra_op op = {
      .kind = ALGEBRA_MAP, .name = "params_map", .map = fn, .ctx = ctx};
  return params_algebra(&op, a, NULL, err);
}

topos_params *topos_params_zip(const topos_params *a, const topos_params *b,
                               topos_zip_fn fn, void *ctx, topos_error *err) {
  algebra_op op = {
      .kind = ALGEBRA_ZIP, .name = "params_zip", .zip = fn, .ctx = ctx};
  return params_algebra(&op, a, b, err);
}

/* A contiguous copy of t (NULL with err). */
static topos_tensor *tensor_fresh_copy(const topos_tensor *t,
                                       topos_error *err) {
  topos_tensor *c = tensor_new(t->dtype, t->rank, t->shape, err);
  if (c != NULL) tensor_copy_out(t, tensor_data(c));
  return c;
}

topos_params *topos_network_parameters(const topos_network *net) {
  if (net == NULL) return NULL;
  topos_params *p = params_alloc(net->nparams);
  if (p == NULL) return NULL;
  for (int s = 0; s < net->nparams; s++) {
    const topos_tensor *initial = net->nodes[net->param_nodes[s]].at.tensor;
    p->t[s] = initial ? tensor_fresh_copy(initial, NULL) : NULL;
    if (p->t[s] == NULL) {
      topos_params_free(p);
      return NULL;
    }
  }
  return p;
}

/* ------------------------------------------------------------------ fields */

topos_field *field_alloc(const topos_network *net) {
  if (net == NULL) return NULL;
  topos_field *f = calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  f->t = calloc((size_t)(net->n > 0 ? net->n : 1), sizeof *f->t);
  if (f->t == NULL) {
    free(f);
    return NULL;
  }
  f->net = topos_network_retain(net);
  return f;
}

void topos_field_free(topos_field *f) {
  if (f == NULL) return;
  for (int i = 0; i < f->net->n; i++) topos_tensor_release(f->t[i]);
  free(f->t);
  topos_network_release(f->net);
  free(f);
}

const topos_tensor *topos_field_of(const topos_field *f, topos_value v,
                                   topos_error *err) {
  if (f == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "field_of: field is NULL");
    return NULL;
  }
  int i = network_index(f->net, v, err);
  return i < 0 ? NULL : f->t[i];
}

topos_params *topos_parameters_of(const topos_field *f, topos_error *err) {
  if (f == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "parameters_of: field is NULL");
    return NULL;
  }
  const topos_network *net = f->net;
  topos_params *p = params_alloc(net->nparams);
  if (p == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "parameters_of: out of memory");
    return NULL;
  }
  for (int s = 0; s < net->nparams; s++)
    p->t[s] = topos_tensor_retain(f->t[net->param_nodes[s]]);
  return p;
}

/* A new field holding op(a, b), or NULL with err. */
static topos_field *field_algebra(algebra_op *op, const topos_field *a,
                                  const topos_field *b, topos_error *err) {
  op->pass_ints = true;
  if (a == NULL || (algebra_binary(op) && b == NULL)) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: field is NULL", op->name);
    return NULL;
  }
  if (algebra_binary(op) && a->net != b->net) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "%s: the fields belong to different networks", op->name);
    return NULL;
  }
  topos_field *out = field_alloc(a->net);
  if (out == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", op->name);
    return NULL;
  }
  if (algebra_apply(op, a->net->n, a->t, b ? b->t : NULL, out->t, "node",
                    err) != TOPOS_OK) {
    topos_field_free(out);
    return NULL;
  }
  return out;
}

topos_field *topos_field_add(const topos_field *a, const topos_field *b,
                             topos_error *err) {
  algebra_op op = {.kind = ALGEBRA_ADD, .name = "field_add"};
  return field_algebra(&op, a, b, err);
}

topos_field *topos_field_scale(const topos_field *a, double s,
                               topos_error *err) {
  algebra_op op = {.kind = ALGEBRA_SCALE, .name = "field_scale", .s = s};
  return field_algebra(&op, a, NULL, err);
}

topos_field *topos_field_map(const topos_field *a, topos_map_fn fn, void *ctx,
                             topos_error *err) {
  algebra_op op = {
      .kind = ALGEBRA_MAP, .name = "field_map", .map = fn, .ctx = ctx};
  return field_algebra(&op, a, NULL, err);
}

topos_field *topos_field_zip(const topos_field *a, const topos_field *b,
                             topos_zip_fn fn, void *ctx, topos_error *err) {
  algebra_op op = {
      .kind = ALGEBRA_ZIP, .name = "field_zip", .zip = fn, .ctx = ctx};
  return field_algebra(&op, a, b, err);
}
