/*
 * gelu.c - the tanh GELU's adjoint in one pass.
 *
 * topos_gelu (nn.c) records GELU as thirteen elementwise nodes:
 *
 *   x2 = x·x   x3 = x·x2   inner = x + c·x3   t = tanh(k·inner)
 *   half = h·x   s = 1 + t   y = half·s
 *
 * with c, k and h broadcast constants.  Its unfused adjoint is about
 * sixteen passes over tensors of x's size (a third of a small
 * transformer's training step).  When backward gathers gradients
 * (params_only: no interior cotangent is wanted) and the nodes form
 * exactly that pattern, the evaluating builder (interp.c) asks this file
 * for x's cotangent at once: one pass over g, x, x2, half, s and t, which
 * the training plan keeps anyway (the unfused adjoints read them).
 *
 * Each element runs the unfused scan's arithmetic, op for op, operands in
 * the adjoint rules' order (adjoint.c: mul's dx0 = g·b, dx1 = g·a; add
 * passes g; tanh's g·(1 − y·y)), in the dtype's own arithmetic (f32 or
 * f64; bf16 keeps the unfused adjoints), and x's contributions
 * summed in the scan's order (consumers by decreasing index: half, inner,
 * x3, then x2's two operands).  So the bits are the unfused ones; the plan
 * suite compares them for every dtype, specials included.
 *
 * The match is strict: each interior node has its one consumer inside the
 * pattern, x has no consumer outside it, the constants are broadcast
 * scalars (no gradient flows into them), every value has x's dtype and
 * shape, and the consumers of x come in the order topos_gelu records them
 * (that order is the order of the sum).  Anything else takes the unfused
 * adjoints.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fma_pinned.h"
#include "internal.h"

int32_t *network_uses(const topos_network *net, const bool *live) {
  int32_t *uses = calloc((size_t)net->n + 1, sizeof *uses);
  if (uses == NULL) return NULL;
  for (int i = 0; i < net->n; i++)
    if (live == NULL || live[i])
      for (int j = 0; j < net->nodes[i].nin; j++) uses[net->nodes[i].in[j]]++;
  return uses;
}

/* Node i is a broadcast of a rank-0 constant: its value in *v. */
static bool fill_value(const topos_network *net, int32_t i, double *v) {
  const node *n = &net->nodes[i];
  if (n->op != OP_BROADCAST || n->nin != 1) return false;
  const node *c = &net->nodes[n->in[0]];
  if (c->op != OP_CONSTANT || c->at.tensor == NULL || c->meta.rank != 0)
    return false;
  *v = topos_tensor_get(c->at.tensor, NULL, NULL);
  return true;
}

/* Node i is op over {a fill, v} in either order: v's index and the fill's
 * value. */
static bool fill_and(const topos_network *net, int32_t i, op_code op,
                     int32_t *v, double *value) {
  const node *n = &net->nodes[i];
  if (n->op != op || n->nin != 2) return false;
  for (int j = 0; j < 2; j++)
    if (fill_value(net, n->in[j], value)) {
      *v = n->in[1 - j];
      return !fill_value(net, *v, &(double){0});
    }
  return false;
}

static bool same_meta(const tensor_meta *a, const tensor_meta *b) {
  return a->dtype == b->dtype &&
         shape_equal(a->rank, a->shape, b->rank, b->shape);
}

bool gelu_match(const topos_network *net, const int32_t *uses, int32_t head,
                gelu_pattern *m) {
  const node *y = &net->nodes[head];
  if (y->op != OP_MUL || y->nin != 2) return false;
  topos_dtype dt = y->meta.dtype;
  /* bf16 would read six f32 copies of x's size at once, more than the
   * unfused adjoints hold (and the plan's backward bound meters): it keeps
   * them. */
  if (dt != TOPOS_F32 && dt != TOPOS_F64) return false;
  int32_t half = -1, s = -1, t = -1, x = -1, x_h = -1;
  double one;
  for (int j = 0; j < 2 && half < 0; j++) {
    int32_t a = y->in[j], b = y->in[1 - j];
    if (fill_and(net, a, OP_MUL, &x_h, &m->h) &&
        fill_and(net, b, OP_ADD, &t, &one)) {
      half = a;
      s = b;
    }
  }
  if (half < 0 || net->nodes[t].op != OP_TANH) return false;
  int32_t u = net->nodes[t].in[0], inner, cx3, x3, x2;
  if (!fill_and(net, u, OP_MUL, &inner, &m->k)) return false;
  const node *in = &net->nodes[inner];
  if (in->op != OP_ADD || in->nin != 2) return false;
  /* inner = x + c·x3, either order; x is half's operand. */
  x = x_h;
  int j = in->in[0] == x ? 1 : in->in[1] == x ? 0 : -1;
  if (j < 0) return false;
  cx3 = in->in[j];
  if (!fill_and(net, cx3, OP_MUL, &x3, &m->c)) return false;
  const node *n3 = &net->nodes[x3];
  if (n3->op != OP_MUL || n3->nin != 2) return false;
  j = n3->in[0] == x ? 1 : n3->in[1] == x ? 0 : -1;
  if (j < 0) return false;
  x2 = n3->in[j];
  const node *n2 = &net->nodes[x2];
  if (n2->op != OP_MUL || n2->nin != 2 || n2->in[0] != x || n2->in[1] != x)
    return false;
  /* One consumer each inside; x's five operand slots all inside. */
  const int32_t inside[] = {x2, x3, cx3, inner, u, t, half, s};
  for (size_t i = 0; i < sizeof inside / sizeof *inside; i++)
    if (uses[inside[i]] != 1 ||
        !same_meta(&net->nodes[inside[i]].meta, &y->meta))
      return false;
  if (uses[x] != 5 || !same_meta(&net->nodes[x].meta, &y->meta)) return false;
  /* x's cotangent sums its consumers by decreasing index. */
  if (!(half > inner && inner > x3 && x3 > x2)) return false;
  m->x = x;
  m->x2 = x2;
  m->x3 = x3;
  m->cx3 = cx3;
  m->inner = inner;
  m->u = u;
  m->half = half;
  m->s = s;
  m->t = t;
  m->one = one;
  /* Which nodes hold their operands the other way round from the
   * formulas (the forward's bits follow each node's own order). */
  const node *nodes = net->nodes;
  m->flip = (nodes[x3].in[0] != x ? GELU_FLIP_X3 : 0) |
            (nodes[cx3].in[0] == x3 ? GELU_FLIP_CX3 : 0) |
            (nodes[inner].in[0] != x ? GELU_FLIP_INNER : 0) |
            (nodes[u].in[0] == inner ? GELU_FLIP_U : 0) |
            (nodes[s].in[0] == t ? GELU_FLIP_S : 0) |
            (nodes[half].in[0] == x ? GELU_FLIP_HALF : 0) |
            (y->in[0] == s ? GELU_FLIP_Y : 0);
  return true;
}

/* ------------------------------------------------------------ the kernel */

typedef struct gelu_job {
  topos_dtype dtype;
  int64_t n;
  const void *g, *x, *x2, *half, *s, *t; /* compute-type arrays */
  void *gx;
  double c, k, h;
} gelu_job;

enum { GELU_UNIT = 1 << 14 }; /* elements per unit */

/* The unfused scan's arithmetic for one element, in the dtype's own type:
 * each line one op of the unfused adjoints (rounded as its output tensor
 * is, by the operation itself), operands in adjoint.c's order.  MUL, ADD
 * and SUB keep that order where two NaNs meet (fma_pinned.h): written as
 * C, a loop this long may have a commutative op's operands swapped. */
#define GELU_GRAD_BODY(V, MUL, ADD, SUB, g, x, x2, hx, s, t, c, k, h, one, \
                       out)                                                \
  do {                                                                     \
    V g_half = MUL(g, s);                  /* y = half·s: dx0 = g·s */   \
    V g_s = MUL(g, hx);                    /*             dx1 = g·half */ \
    V acc = MUL(g_half, h);                /* half = h·x: x's first */    \
    V g_u = MUL(g_s, SUB(one, MUL(t, t))); /* tanh: g·(1 − t·t) */     \
    V g_in = MUL(g_u, k);                  /* u = k·inner */              \
    acc = ADD(acc, g_in);                  /* inner = x + c·x3: second */ \
    V g_x3 = MUL(g_in, c);                 /* c·x3 */                     \
    acc = ADD(acc, MUL(g_x3, x2));         /* x3 = x·x2: x's third */     \
    V c4 = MUL(MUL(g_x3, x), x);           /* x2 = x·x: both operands */  \
    acc = ADD(acc, c4);                                                    \
    out = ADD(acc, c4);                                                    \
  } while (0)

#if FMA_PINNED_X86
#define MUL_F32 mul_f32
#define ADD_F32 add_f32
#define SUB_F32 sub_f32
#define MUL_F64 mul_f64
#define ADD_F64 add_f64
#define SUB_F64 sub_f64
#else
#define C_MUL(u, w) ((u) * (w))
#define C_ADD(u, w) ((u) + (w))
#define C_SUB(u, w) ((u) - (w))
#define MUL_F32 C_MUL
#define ADD_F32 C_ADD
#define SUB_F32 C_SUB
#define MUL_F64 C_MUL
#define ADD_F64 C_ADD
#define SUB_F64 C_SUB
#endif

/* Elements [i0, i1) with type R's values V (one element, or a vector of
 * L), loaded and stored by LOAD/STORE, the constants made by SET1. */
#define GELU_GRAD_PASS(R, V, L, LOAD, STORE, SET1, MUL, ADD, SUB)              \
  do {                                                                         \
    const R *g = j->g, *x = j->x, *x2 = j->x2, *hx = j->half, *s = j->s,       \
            *t = j->t;                                                         \
    R *gx = j->gx;                                                             \
    const V c = SET1((R)j->c), k = SET1((R)j->k), h = SET1((R)j->h),           \
            one = SET1((R)1);                                                  \
    for (; i0 + L <= i1; i0 += L) {                                            \
      V out;                                                                   \
      GELU_GRAD_BODY(V, MUL, ADD, SUB, LOAD(g + i0), LOAD(x + i0),             \
                     LOAD(x2 + i0), LOAD(hx + i0), LOAD(s + i0), LOAD(t + i0), \
                     c, k, h, one, out);                                       \
      STORE(gx + i0, out);                                                     \
    }                                                                          \
  } while (0)

#define SCALAR_LOAD(p) (*(p))
#define SCALAR_STORE(p, v) (*(p) = (v))
#define SCALAR_SET1(v) (v)

static void gelu_grad_f32(const gelu_job *j, int64_t i0, int64_t i1) {
  GELU_GRAD_PASS(float, float, 1, SCALAR_LOAD, SCALAR_STORE, SCALAR_SET1,
                 MUL_F32, ADD_F32, SUB_F32);
}

static void gelu_grad_f64(const gelu_job *j, int64_t i0, int64_t i1) {
  GELU_GRAD_PASS(double, double, 1, SCALAR_LOAD, SCALAR_STORE, SCALAR_SET1,
                 MUL_F64, ADD_F64, SUB_F64);
}

#if FMA_PINNED_X86
/* The same on whole vectors (sixteen f32 or eight f64 lanes, the ops
 * pinned as above); returns where it stopped, for the scalar loop. */
__attribute__((target("avx512f"))) static int64_t gelu_grad_f32_512(
    const gelu_job *j, int64_t i0, int64_t i1) {
  GELU_GRAD_PASS(float, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                 _mm512_set1_ps, mul_ps512, add_ps512, sub_ps512);
  return i0;
}

__attribute__((target("avx512f"))) static int64_t gelu_grad_f64_512(
    const gelu_job *j, int64_t i0, int64_t i1) {
  GELU_GRAD_PASS(double, __m512d, 8, _mm512_loadu_pd, _mm512_storeu_pd,
                 _mm512_set1_pd, mul_pd512, add_pd512, sub_pd512);
  return i0;
}
#endif

/* A units task's function for a pass of job type JOB: whole vectors
 * (VF32 / VF64, AVX-512) where the CPU has them, the rest one element at
 * a time (SF32 / SF64). */
#if FMA_PINNED_X86
#define GELU_VECTOR(j, VF32, VF64)                      \
  (!__builtin_cpu_supports("avx512f") ? i0              \
   : (j)->dtype == TOPOS_F64          ? VF64(j, i0, i1) \
                                      : VF32(j, i0, i1))
#else
#define GELU_VECTOR(j, VF32, VF64) i0
#endif
#define DEFINE_GELU_UNIT(NAME, JOB, VF32, VF64, SF32, SF64)     \
  static void NAME(void *arg, int64_t unit, int slot) {         \
    (void)slot;                                                 \
    const JOB *j = arg;                                         \
    int64_t i0 = unit * GELU_UNIT;                              \
    int64_t i1 = j->n - i0 < GELU_UNIT ? j->n : i0 + GELU_UNIT; \
    int64_t done = GELU_VECTOR(j, VF32, VF64);                  \
    if (j->dtype == TOPOS_F64)                                  \
      SF64(j, done, i1);                                        \
    else                                                        \
      SF32(j, done, i1);                                        \
  }

DEFINE_GELU_UNIT(gelu_unit, gelu_job, gelu_grad_f32_512, gelu_grad_f64_512,
                 gelu_grad_f32, gelu_grad_f64)

topos_tensor *gelu_grad(const exec_env *env, const gelu_pattern *m,
                        const topos_tensor *g, const topos_tensor *const *v,
                        topos_error *err) {
  /* v: x, x2, half, s, t */
  compute_view cv[6];
  const topos_tensor *src[6] = {g, v[0], v[1], v[2], v[3], v[4]};
  int got = 0;
  topos_tensor *out = NULL;
  for (; got < 6; got++)
    if (compute_view_of(src[got], &cv[got], err)) goto done;
  tensor_meta meta = tensor_meta_of(v[0]);
  out_buf ob;
  if (out_begin(&ob, &meta, err)) goto done;
  gelu_job j = {
      .dtype = meta.dtype,
      .n = shape_count(meta.rank, meta.shape),
      .g = cv[0].data,
      .x = cv[1].data,
      .x2 = cv[2].data,
      .half = cv[3].data,
      .s = cv[4].data,
      .t = cv[5].data,
      .gx = ob.data,
      .c = m->c,
      .k = m->k,
      .h = m->h,
  };
  if (exec_units(env, gelu_unit, &j, (j.n + GELU_UNIT - 1) / GELU_UNIT, err)) {
    out_abort(&ob);
    goto done;
  }
  out = out_end(&ob);
done:
  for (int i = 0; i < got; i++) compute_view_done(&cv[i]);
  return out;
}

/* ------------------------------------------------------------ the forward */

/*
 * A GROUP_GELU (plan.c elects it wherever gelu_match holds) computes y in
 * three passes instead of nine: pass A reads x and writes u = k·(x +
 * c·x·x·x) (and x2, x3, c·x3 and inner where the plan keeps them), tanh
 * runs on u as a map task (offered down the chain, as the unfused node's
 * is), and pass B reads x and t and writes y = (h·x)·(one + t) (and s and
 * half where kept).  Every value is the node's own op on its own operands
 * in its own order (flip), rounded to the dtype, so each member and y
 * carry the unfused bits; the plan suite compares them.
 */
typedef struct gelu_fwd_job {
  topos_dtype dtype;
  bool pass_b;
  const void *x, *t;
  void *x2, *x3, *cx3, *inner, *u; /* pass A: NULL where not kept (u never) */
  void *s, *half, *y;              /* pass B: NULL where not kept (y never) */
  int64_t n;
  double c, k, h, one;
  unsigned flip;
} gelu_fwd_job;

#define GELU_FLIPPED(F, OP, a, b) ((flip & (F)) ? OP(b, a) : OP(a, b))

/* Elements [i0, i1) of pass A or B with type R's values V (one element or
 * a vector of them), loaded and stored by LOAD/STORE at element i. */
#define GELU_FWD_PASS(R, V, L, LOAD, STORE, SET1, MUL, ADD)                  \
  do {                                                                       \
    const unsigned flip = j->flip;                                           \
    const R *x = j->x, *t = j->t;                                            \
    R *x2 = j->x2, *x3 = j->x3, *cx3 = j->cx3, *inner = j->inner, *u = j->u, \
      *s = j->s, *half = j->half, *y = j->y;                                 \
    const V c = SET1((R)j->c), k = SET1((R)j->k), h = SET1((R)j->h),         \
            one = SET1((R)j->one);                                           \
    if (!j->pass_b)                                                          \
      for (; i0 + L <= i1; i0 += L) {                                        \
        V xv = LOAD(x + i0);                                                 \
        V x2v = MUL(xv, xv);                                                 \
        V x3v = GELU_FLIPPED(GELU_FLIP_X3, MUL, xv, x2v);                    \
        V cx3v = GELU_FLIPPED(GELU_FLIP_CX3, MUL, c, x3v);                   \
        V inv = GELU_FLIPPED(GELU_FLIP_INNER, ADD, xv, cx3v);                \
        STORE(u + i0, GELU_FLIPPED(GELU_FLIP_U, MUL, k, inv));               \
        if (x2) STORE(x2 + i0, x2v);                                         \
        if (x3) STORE(x3 + i0, x3v);                                         \
        if (cx3) STORE(cx3 + i0, cx3v);                                      \
        if (inner) STORE(inner + i0, inv);                                   \
      }                                                                      \
    else                                                                     \
      for (; i0 + L <= i1; i0 += L) {                                        \
        V sv = GELU_FLIPPED(GELU_FLIP_S, ADD, one, LOAD(t + i0));            \
        V hv = GELU_FLIPPED(GELU_FLIP_HALF, MUL, h, LOAD(x + i0));           \
        STORE(y + i0, GELU_FLIPPED(GELU_FLIP_Y, MUL, hv, sv));               \
        if (s) STORE(s + i0, sv);                                            \
        if (half) STORE(half + i0, hv);                                      \
      }                                                                      \
  } while (0)

static void gelu_fwd_f32(const gelu_fwd_job *j, int64_t i0, int64_t i1) {
  GELU_FWD_PASS(float, float, 1, SCALAR_LOAD, SCALAR_STORE, SCALAR_SET1,
                MUL_F32, ADD_F32);
}

static void gelu_fwd_f64(const gelu_fwd_job *j, int64_t i0, int64_t i1) {
  GELU_FWD_PASS(double, double, 1, SCALAR_LOAD, SCALAR_STORE, SCALAR_SET1,
                MUL_F64, ADD_F64);
}

#if FMA_PINNED_X86
__attribute__((target("avx512f"))) static int64_t gelu_fwd_f32_512(
    const gelu_fwd_job *j, int64_t i0, int64_t i1) {
  GELU_FWD_PASS(float, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                _mm512_set1_ps, mul_ps512, add_ps512);
  return i0;
}

__attribute__((target("avx512f"))) static int64_t gelu_fwd_f64_512(
    const gelu_fwd_job *j, int64_t i0, int64_t i1) {
  GELU_FWD_PASS(double, __m512d, 8, _mm512_loadu_pd, _mm512_storeu_pd,
                _mm512_set1_pd, mul_pd512, add_pd512);
  return i0;
}
#endif

DEFINE_GELU_UNIT(gelu_fwd_unit, gelu_fwd_job, gelu_fwd_f32_512,
                 gelu_fwd_f64_512, gelu_fwd_f32, gelu_fwd_f64)

void gelu_members(const gelu_pattern *m, int32_t *members) {
  members[GELU_M_X2] = m->x2;
  members[GELU_M_X3] = m->x3;
  members[GELU_M_CX3] = m->cx3;
  members[GELU_M_INNER] = m->inner;
  members[GELU_M_U] = m->u;
  members[GELU_M_T] = m->t;
  members[GELU_M_S] = m->s;
  members[GELU_M_HALF] = m->half;
}

topos_tensor *gelu_forward(const exec_env *env, const plan_group *g,
                           const tensor_meta *out,
                           const topos_tensor *const *ins,
                           topos_tensor **exports, topos_error *err) {
  const gelu_pattern *m = &g->gelu;
  compute_view xv;
  if (compute_view_of(ins[0], &xv, err)) return NULL;
  gelu_fwd_job j = {
      .dtype = out->dtype,
      .x = xv.data,
      .n = shape_count(out->rank, out->shape),
      .c = m->c,
      .k = m->k,
      .h = m->h,
      .one = m->one,
      .flip = m->flip,
  };
  size_t bytes = (size_t)(j.n > 0 ? j.n : 1) * topos_dtype_size(out->dtype);
  void *scratch[2] = {NULL, NULL};
  size_t cap[2] = {0, 0};
  topos_tensor *y = NULL;
  /* The members the plan keeps, by position (plan.c's match_gelu). */
  void *at[GELU_MEMBERS] = {0};
  for (int k = 0; k < GELU_MEMBERS; k++) {
    if (!g->exported[k]) continue;
    if (!(exports[k] = tensor_new_meta(out, err))) goto fail;
    at[k] = tensor_data(exports[k]);
  }
  j.x2 = at[GELU_M_X2];
  j.x3 = at[GELU_M_X3];
  j.cx3 = at[GELU_M_CX3];
  j.inner = at[GELU_M_INNER];
  j.u = at[GELU_M_U];
  j.s = at[GELU_M_S];
  j.half = at[GELU_M_HALF];
  void *t = at[GELU_M_T];
  /* u and t live in scratch where the plan keeps neither. */
  if (!j.u && !(j.u = scratch[0] = pool_alloc(bytes, &cap[0]))) goto oom;
  if (!t && !(t = scratch[1] = pool_alloc(bytes, &cap[1]))) goto oom;
  j.t = t;
  if (!(y = tensor_new_meta(out, err))) goto fail;
  j.y = tensor_data(y);
  int64_t units = (j.n + GELU_UNIT - 1) / GELU_UNIT;
  if (exec_units(env, gelu_fwd_unit, &j, units, err)) goto fail;
  topos_task task = {.kind = TOPOS_TASK_MAP};
  task.u.map = (topos_map_task){
      .dtype = out->dtype, .op = TOPOS_MAP_TANH, .n = j.n, .a = j.u, .y = t};
  if (exec_offer(env, &task) != 0 &&
      kernel_elementwise(env, OP_TANH, 0, out->dtype, 1, j.u, NULL, t, j.n,
                         err))
    goto fail;
  j.pass_b = true;
  if (exec_units(env, gelu_fwd_unit, &j, units, err)) goto fail;
  goto done;
oom:
  error_set(err, TOPOS_ERR_MEMORY, "fused GELU: out of memory");
fail:
  topos_tensor_release(y);
  y = NULL;
  for (int k = 0; k < g->nmembers; k++) {
    topos_tensor_release(exports[k]);
    exports[k] = NULL;
  }
done:
  for (int k = 0; k < 2; k++)
    if (scratch[k]) pool_free(scratch[k], cap[k]);
  compute_view_done(&xv);
  return y;
}
