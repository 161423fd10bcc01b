/*
 * plan.c - lowering an entry of a sealed network to a plan, and running it.
 *
 * A plan is a view over the immutable network, never a rewrite of it:
 *  - dead-node elimination: only ancestors of roots and observes are live;
 *  - the keep-set: only roots and observes can be read from a plan's run;
 *  - liveness: every other buffer is released right after its last
 *    consumer (training plans also keep what backward's adjoints read);
 *  - a static peak-live-bytes figure from those spans, and upper bounds
 *    of what each kind of run allocates (topos_plan_run_bytes: buffers at
 *    pool capacities, kernel scratch, structs; the backward's through a
 *    metering builder, interp.c), for admission control;
 *  - pattern offers: the conv2d chain (pad -> unfold -> unfold -> permute
 *    -> reshape -> matmul) runs as one direct windowed product and the
 *    max-pool chain (unfold -> unfold -> permute -> reshape -> max_along)
 *    as one window walk, without materialising the interior; an interior
 *    value that is kept, read by backward, or used elsewhere blocks them.
 *    The attention chain (matmul -> mul? -> add? -> log_softmax -> exp ->
 *    matmul) runs as one pass per query row, offered to backends as one
 *    task; an interior value it must keep (backward reads it, or it is
 *    observed) is written by that pass, and only one used elsewhere
 *    blocks it.  All are recognised structurally and reproduce the
 *    unfused bits.
 * Running a plan gives the interpreter's bits: the same kernels, the same
 * adjoint scan, only fewer live buffers.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------ recognition */

/* A chain link may be absorbed into a group when nothing else reads it. */
static bool absorbable(const topos_plan *p, const int32_t *uses, int32_t i) {
  return uses[i] == 1 && !p->retain[i];
}

static bool is_perm(const node *n, const int *perm) {
  for (int i = 0; i < 6; i++)
    if (n->at.perm[i] != perm[i]) return false;
  return true;
}

/*
 * Walks from a reshape down the common window chain
 *   x -> [pad axis 2|3]{0,2} -> unfold(axis 2) -> unfold(axis 4) -> permute
 * filling the geometry of g.  `perm` is the permutation the chain must
 * use.  Returns false when the nodes do not form exactly this chain.
 */
static bool match_window(const topos_plan *p, const int32_t *uses,
                         int32_t reshape, const int *perm, plan_group *g) {
  const node *nodes = p->net->nodes;
  const node *r = &nodes[reshape];
  /* Backward may read the reshape (the head's adjoint does, in a training
   * plan): the group's fused adjoint reads x instead (elect_groups). */
  if (r->op != OP_RESHAPE || uses[reshape] != 1 || p->keep[reshape])
    return false;
  int32_t pi = r->in[0];
  const node *pm = &nodes[pi];
  if (pm->op != OP_PERMUTE || pm->meta.rank != 6 || !is_perm(pm, perm) ||
      !absorbable(p, uses, pi))
    return false;
  int32_t u2i = pm->in[0];
  const node *u2 = &nodes[u2i];
  if (u2->op != OP_UNFOLD || u2->at.axis != 4 || !absorbable(p, uses, u2i))
    return false;
  int32_t u1i = u2->in[0];
  const node *u1 = &nodes[u1i];
  if (u1->op != OP_UNFOLD || u1->at.axis != 2 || u1->meta.rank != 5 ||
      !absorbable(p, uses, u1i))
    return false;
  int32_t members[8];
  int nm = 0;
  int32_t xi = u1->in[0];
  int64_t pad[4] = {0, 0, 0, 0}; /* top, bottom, left, right */
  bool padded[2] = {false, false};
  while (nodes[xi].op == OP_PAD) {
    const node *pd = &nodes[xi];
    int ax = pd->at.axis;
    if ((ax != 2 && ax != 3) || padded[ax - 2] || !absorbable(p, uses, xi))
      return false;
    padded[ax - 2] = true;
    pad[(ax - 2) * 2] = pd->at.before;
    pad[(ax - 2) * 2 + 1] = pd->at.after;
    members[nm++] = xi;
    xi = pd->in[0];
  }
  const node *x = &nodes[xi];
  if (x->meta.rank != 4 || !dtype_is_float(x->meta.dtype)) return false;
  /* Chain order: pads were found outermost-first; list them x-first. */
  for (int a = 0, b = nm - 1; a < b; a++, b--) {
    int32_t t = members[a];
    members[a] = members[b];
    members[b] = t;
  }
  members[nm++] = u1i;
  members[nm++] = u2i;
  members[nm++] = pi;
  members[nm++] = reshape;
  g->x = xi;
  g->nmembers = nm;
  memcpy(g->members, members, sizeof(int32_t) * (size_t)nm);
  g->N = x->meta.shape[0];
  g->C = x->meta.shape[1];
  g->H = x->meta.shape[2];
  g->W = x->meta.shape[3];
  g->kh = u1->at.size;
  g->stride_h = u1->at.step;
  g->dil_h = u1->at.dilation;
  g->kw = u2->at.size;
  g->stride_w = u2->at.step;
  g->dil_w = u2->at.dilation;
  g->oh = u1->meta.shape[2];
  g->ow = u2->meta.shape[4];
  g->pad_top = pad[0];
  g->pad_bottom = pad[1];
  g->pad_left = pad[2];
  g->pad_right = pad[3];
  return true;
}

/* matmul(reshape [N·oh·ow, C·kh·kw] of the window chain, weight). */
static bool match_conv(const topos_plan *p, const int32_t *uses, int32_t head,
                       plan_group *g) {
  static const int perm[6] = {0, 2, 4, 1, 3, 5}; /* -> [N,oh,ow,C,kh,kw] */
  const node *m = &p->net->nodes[head];
  if (m->op != OP_MATMUL || m->meta.rank != 2) return false;
  if (!match_window(p, uses, m->in[0], perm, g)) return false;
  const node *r = &p->net->nodes[m->in[0]];
  if (r->meta.rank != 2 || r->meta.shape[0] != g->N * g->oh * g->ow ||
      r->meta.shape[1] != g->C * g->kh * g->kw)
    return false;
  g->kind = GROUP_CONV;
  g->head = head;
  g->weight = m->in[1];
  g->nout = m->meta.shape[1];
  g->ins[0] = g->x;
  g->ins[1] = g->weight;
  g->nins = 2;
  return true;
}

/* max_along(reshape [N,C,oh,ow,kh·kw] of the window chain, axis 4). */
static bool match_pool(const topos_plan *p, const int32_t *uses, int32_t head,
                       plan_group *g) {
  static const int perm[6] = {0, 1, 2, 4, 3, 5}; /* -> [N,C,oh,ow,kh,kw] */
  const node *m = &p->net->nodes[head];
  if (m->op != OP_MAX_ALONG || m->at.axis != 4) return false;
  if (!match_window(p, uses, m->in[0], perm, g)) return false;
  const node *r = &p->net->nodes[m->in[0]];
  const int64_t want[5] = {g->N, g->C, g->oh, g->ow, g->kh * g->kw};
  if (!shape_equal(r->meta.rank, r->meta.shape, 5, want)) return false;
  g->kind = GROUP_POOL;
  g->head = head;
  g->weight = -1;
  g->nout = 0;
  g->ins[0] = g->x;
  g->nins = 1;
  return true;
}

/* An attention link: read by the chain alone.  Unlike a window link it
 * may be retained (backward reads it, or it is observed): the fused
 * kernel then writes it too. */
static bool linkable(const int32_t *uses, int32_t i) {
  return uses[i] == 1;
}

/*
 * matmul(exp(log_softmax(add?(mul?(matmul(q, kᵀ), scale), mask), last)), v)
 * as topos_attention records it (scores first in the mul and the add),
 * f32/f64, rank 3 (a batch of matrices) or 2, every extent >= 1.
 */
static bool match_attention(const topos_plan *p, const int32_t *uses,
                            int32_t head, plan_group *g) {
  const node *nodes = p->net->nodes;
  const node *m2 = &nodes[head];
  if (m2->op != OP_MATMUL ||
      (m2->meta.dtype != TOPOS_F32 && m2->meta.dtype != TOPOS_F64))
    return false;
  int32_t ei = m2->in[0];
  if (nodes[ei].op != OP_EXP || !linkable(uses, ei)) return false;
  int32_t li = nodes[ei].in[0];
  const node *ls = &nodes[li];
  if (ls->op != OP_LOG_SOFTMAX || ls->at.axis != ls->meta.rank - 1 ||
      !linkable(uses, li))
    return false;
  int32_t cur = ls->in[0], add = -1, mul = -1;
  if (nodes[cur].op == OP_ADD && linkable(uses, cur)) {
    add = cur;
    cur = nodes[cur].in[0];
  }
  if (nodes[cur].op == OP_MUL && linkable(uses, cur)) {
    mul = cur;
    cur = nodes[cur].in[0];
  }
  int32_t m1i = cur;
  const node *m1 = &nodes[m1i];
  if (m1->op != OP_MATMUL || !linkable(uses, m1i)) return false;
  int r = m2->meta.rank;
  const tensor_meta *qm = &nodes[m1->in[0]].meta;
  if (m1->meta.rank != r || (r != 2 && r != 3) ||
      m1->meta.dtype != m2->meta.dtype || qm->rank != r)
    return false;
  memset(g, 0, sizeof *g);
  g->kind = GROUP_ATTENTION;
  g->head = head;
  g->weight = -1;
  g->batch = r == 3 ? m1->meta.shape[0] : 1;
  g->t = m1->meta.shape[r - 2];
  g->s = m1->meta.shape[r - 1];
  g->dh = qm->shape[r - 1];
  g->dv = m2->meta.shape[r - 1];
  if (g->batch < 1 || g->t < 1 || g->s < 1 || g->dh < 1 || g->dv < 1)
    return false;
  g->x = m1->in[0];
  g->ins[g->nins++] = m1->in[0];
  g->ins[g->nins++] = m1->in[1];
  g->ins[g->nins++] = m2->in[1];
  if (mul >= 0) g->ins[g->nins++] = nodes[mul].in[1];
  if (add >= 0) g->ins[g->nins++] = nodes[add].in[1];
  g->raw = m1i;
  g->scaled = mul;
  g->masked = add;
  g->logp = li;
  g->probs = ei;
  const int32_t chain[5] = {m1i, mul, add, li, ei};
  for (int k = 0; k < 5; k++) {
    if (chain[k] < 0) continue;
    g->exported[g->nmembers] = p->retain[chain[k]];
    g->members[g->nmembers++] = chain[k];
  }
  return true;
}

/* topos_gelu's nodes (gelu_match): the eight computed members, each
 * written where the plan keeps it (backward reads it, or it is observed);
 * the constants' broadcasts stay ordinary views. */
static bool match_gelu(const topos_plan *p, const int32_t *uses, int32_t head,
                       plan_group *g) {
  gelu_pattern m;
  if (!gelu_match(p->net, uses, head, &m)) return false;
  memset(g, 0, sizeof *g);
  g->kind = GROUP_GELU;
  g->head = head;
  g->x = m.x;
  g->weight = -1;
  g->ins[g->nins++] = m.x;
  g->gelu = m;
  _Static_assert(GELU_MEMBERS <= GROUP_MAX_MEMBERS, "a GELU's members fit");
  gelu_members(&m, g->members);
  g->nmembers = GELU_MEMBERS;
  for (int k = 0; k < GELU_MEMBERS; k++)
    g->exported[k] = p->retain[g->members[k]];
  return true;
}

/* A window group's fused adjoint adds x's cotangent at the head's step of
 * the reverse scan, where the unfused chain adds it at its first link's;
 * the sums are the same when no other reader of x lies between the two
 * (they would see x's cotangent accumulate in another order) - a link
 * of another group included, whose own contribution may move too. */
static bool grad_order_kept(const topos_plan *p, const plan_group *g) {
  const topos_network *net = p->net;
  for (int32_t j = g->members[0] + 1; j < g->head; j++) {
    if (!p->live[j]) continue;
    bool member = false;
    for (int k = 0; k < g->nmembers; k++) member |= g->members[k] == j;
    if (member) continue;
    for (int k = 0; k < net->nodes[j].nin; k++)
      if (net->nodes[j].in[k] == g->x) return false;
  }
  return true;
}

static int elect_groups(topos_plan *p, topos_error *err) {
  const topos_network *net = p->net;
  int32_t *uses = network_uses(net, p->live);
  if (!uses) return error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
  /* The table grows as groups are found: most plans have none or few. */
  int cap = 0;
  for (int i = 0; i < net->n; i++) {
    if (!p->live[i]) continue;
    plan_group g = {0};
    if (!match_conv(p, uses, i, &g) && !match_pool(p, uses, i, &g) &&
        !match_attention(p, uses, i, &g) && !match_gelu(p, uses, i, &g))
      continue;
    /* Chains may overlap in odd graphs: a node belongs to one group. */
    bool taken = false;
    for (int k = 0; k < g.nmembers; k++)
      taken |= p->group_of[g.members[k]] >= 0;
    if (taken) continue;
    if ((g.kind == GROUP_CONV || g.kind == GROUP_POOL) &&
        p->posture == TOPOS_POSTURE_TRAINING) {
      /* Backward runs the group's adjoint fused: it reads x and the
       * weight (or the head's value), never the interior. */
      if (!grad_order_kept(p, &g)) continue;
      g.fused_grad = true;
      for (int k = 0; k < g.nmembers; k++) p->retain[g.members[k]] = false;
      p->retain[g.x] = true;
      p->retain[g.kind == GROUP_CONV ? g.weight : g.head] = true;
    }
    if (p->ngroups == cap) {
      int more = cap ? cap * 2 : 4;
      plan_group *grown = realloc(p->groups, sizeof(plan_group) * (size_t)more);
      if (!grown) {
        free(uses);
        return error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
      }
      p->groups = grown;
      cap = more;
    }
    int gi = p->ngroups++;
    p->groups[gi] = g;
    p->group_of[i] = gi;
    for (int k = 0; k < g.nmembers; k++) p->group_of[g.members[k]] = gi;
  }
  free(uses);
  if (p->ngroups > 0 && p->ngroups < cap) { /* exactly what it holds */
    plan_group *fit =
        realloc(p->groups, sizeof(plan_group) * (size_t)p->ngroups);
    if (fit) p->groups = fit;
  }
  return 0;
}

/* ---------------------------------------------------------------- lowering */

static bool is_member(const topos_plan *p, int32_t i) {
  int g = p->group_of[i];
  return g >= 0 && p->groups[g].head != i;
}

/* Whether a node's value owns a buffer, rather than viewing its operand's
 * or being the caller's (leaves). */
static bool owns_buffer(const node *n, const bool *contiguous) {
  switch (n->op) {
    case OP_CONSTANT:
    case OP_PARAMETER:
    case OP_INPUT:
    case OP_TRANSPOSE:
    case OP_PERMUTE:
    case OP_NARROW:
    case OP_BROADCAST:
    case OP_BROADCAST_ALONG:
    case OP_UNFOLD:
      return false;
    case OP_RESHAPE: /* a view of a contiguous operand, else a copy */
      return !contiguous[n->in[0]];
    default:
      return true;
  }
}

/* ------------------------------------------------------------- memory */

static bool is_leaf(op_code op) {
  return op == OP_CONSTANT || op == OP_PARAMETER || op == OP_INPUT;
}

/* A buffer of meta m: its pool block and its struct. */
static size_t buffer_bytes(const tensor_meta *m) {
  return size_add(
      pool_bytes_of(shape_count(m->rank, m->shape), topos_dtype_size(m->dtype)),
      BUFFER_STRUCT_BYTES);
}

static size_t data_bytes(const tensor_meta *m) {
  return (size_t)shape_count(m->rank, m->shape) * topos_dtype_size(m->dtype);
}

/* The kernel scratch of node i evaluated alone (not fused), its operands'
 * contiguity from contig. */
static size_t node_scratch(const topos_network *net, int32_t i,
                           const bool *contig) {
  const node *nd = &net->nodes[i];
  tensor_meta in[4];
  bool c[4];
  int k = nd->nin < 4 ? nd->nin : 4; /* only 1- and 2-operand ops have any */
  for (int j = 0; j < k; j++) {
    in[j] = net->nodes[nd->in[j]].meta;
    c[j] = contig[nd->in[j]];
  }
  return op_scratch_bytes(nd->op, &nd->at, nd->nin, in, c, &nd->meta);
}

/* What a run holds besides its values: the run, its value and
 * readability tables, the feed table. */
static size_t run_tables(const topos_network *net) {
  size_t t = malloc_block(sizeof(topos_run));
  t = size_add(t, malloc_block(sizeof(topos_tensor *) * (size_t)(net->n + 1)));
  t = size_add(t, malloc_block(sizeof(bool) * (size_t)(net->n + 1)));
  return size_add(
      t, malloc_block(sizeof(topos_tensor *) * (size_t)(net->ninputs + 1)));
}

/* Per live node: its value is contiguous as the interpreter computes it
 * (leaves and views are not known to be; a reshape is what its operand
 * is, or a contiguous copy; everything else is a new contiguous tensor). */
static void value_contiguity(const topos_plan *p, bool *contig) {
  const topos_network *net = p->net;
  for (int i = 0; i < net->n; i++) {
    const node *nd = &net->nodes[i];
    if (!p->live[i] || is_leaf(nd->op))
      contig[i] = false;
    else if (nd->op == OP_RESHAPE)
      contig[i] = true; /* a view of a contiguous operand, or a copy */
    else
      contig[i] = !(nd->op == OP_TRANSPOSE || nd->op == OP_PERMUTE ||
                    nd->op == OP_NARROW || nd->op == OP_BROADCAST ||
                    nd->op == OP_BROADCAST_ALONG || nd->op == OP_UNFOLD);
  }
}

/* The reference interpreter over the live nodes (topos_forward_for, as
 * conformance runs it): nothing is freed and no group is fused. */
static size_t interp_bytes(const topos_plan *p, const bool *contig) {
  const topos_network *net = p->net;
  size_t held = size_add(run_tables(net),
                         malloc_block(sizeof(bool) * (size_t)(net->n + 1)));
  size_t scratch = 0;
  for (int i = 0; i < net->n; i++) {
    const node *nd = &net->nodes[i];
    if (!p->live[i] || is_leaf(nd->op)) continue;
    held = size_add(held, TENSOR_STRUCT_BYTES);
    bool copy = nd->op == OP_RESHAPE ? !contig[nd->in[0]] : contig[i];
    if (copy) held = size_add(held, buffer_bytes(&nd->meta));
    size_t sc = node_scratch(net, i, contig);
    if (sc > scratch) scratch = sc;
  }
  return size_add(held, scratch);
}

/* The bounds of topos_plan_run_bytes, from the liveness spans: buffer
 * `owner` lives over [its step, end[owner]], each value's struct over
 * [its step, its death], and each step adds its kernel's scratch. */
static int plan_bounds(topos_plan *p, const int32_t *owner, const int32_t *end,
                       topos_error *err) {
  const topos_network *net = p->net;
  int n = net->n, S = p->nschedule;
  topos_run_bytes *b = &p->bytes;
  bool *contig = calloc((size_t)n + 1, sizeof(bool));
  size_t *up = calloc((size_t)S + 2, sizeof(size_t));
  size_t *down = calloc((size_t)S + 2, sizeof(size_t));
  if (!contig || !up || !down) {
    free(contig);
    free(up);
    free(down);
    return error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
  }
  value_contiguity(p, contig);
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    const node *nd = &net->nodes[i];
    if (is_leaf(nd->op)) continue; /* the caller's or the network's */
    int32_t d = p->retain[i] ? S : (p->last_use[i] >= 0 ? p->last_use[i] : s);
    up[s] = size_add(up[s], TENSOR_STRUCT_BYTES);
    down[d + 1] = size_add(down[d + 1], TENSOR_STRUCT_BYTES);
    if (owner[i] == i) {
      size_t bytes = buffer_bytes(&nd->meta);
      up[s] = size_add(up[s], bytes);
      down[end[i] + 1] = size_add(down[end[i] + 1], bytes);
    }
    /* A group's exported members: born with the head, retained. */
    int g = p->group_of[i];
    for (int k = 0; g >= 0 && k < p->groups[g].nmembers; k++) {
      if (!p->groups[g].exported[k]) continue;
      const tensor_meta *m = &net->nodes[p->groups[g].members[k]].meta;
      size_t bytes = size_add(buffer_bytes(m), TENSOR_STRUCT_BYTES);
      up[s] = size_add(up[s], bytes);
      down[S + 1] = size_add(down[S + 1], bytes);
    }
  }
  /* live never goes below zero: each `down` matches an earlier `up`. */
  size_t live = 0, peak = 0;
  for (int s = 0; s < S; s++) {
    live = size_add(live, up[s]);
    live = live == SIZE_MAX ? live : live - down[s];
    int32_t i = p->schedule[s];
    int g = p->group_of[i];
    size_t scratch;
    if (g >= 0) {
      const plan_group *grp = &p->groups[g];
      tensor_meta ins[GROUP_MAX_INS];
      bool cin[GROUP_MAX_INS];
      for (int k = 0; k < grp->nins; k++) {
        ins[k] = net->nodes[grp->ins[k]].meta;
        cin[k] = contig[grp->ins[k]];
      }
      scratch = group_scratch_bytes(grp, ins, cin, &net->nodes[i].meta);
    } else {
      scratch = node_scratch(net, i, contig);
    }
    size_t at = size_add(live, scratch);
    if (at > peak) peak = at;
  }
  live = live == SIZE_MAX ? live : live - down[S];
  size_t tables = run_tables(net);
  b->forward = size_add(peak, tables);
  b->retained = size_add(live, tables);
  size_t interp = interp_bytes(p, contig);
  /* Sizes of a request's tensors and a reply's. */
  b->parameters = b->moments = b->inputs = b->outputs = 0;
  for (int k = 0; k < net->nparams; k++) {
    tensor_meta m = net->nodes[net->param_nodes[k]].meta;
    b->parameters = size_add(b->parameters, data_bytes(&m));
    if (m.dtype == TOPOS_BF16) m.dtype = TOPOS_F32;
    b->moments = size_add(b->moments, data_bytes(&m));
  }
  for (int k = 0; k < net->ninputs; k++)
    b->inputs =
        size_add(b->inputs, data_bytes(&net->nodes[net->input_nodes[k]].meta));
  for (int k = 0; k < p->nroots; k++)
    b->outputs =
        size_add(b->outputs, data_bytes(&net->nodes[p->roots[k]].meta));
  for (int k = 0; k < p->nobserves; k++)
    b->outputs =
        size_add(b->outputs, data_bytes(&net->nodes[p->observes[k]].meta));
  /* Training plans meter their reverse scan when first asked
   * (plan_meter): it costs about what a backward's bookkeeping does. */
  b->gradients = b->backward = b->gradients_held = 0;
  p->interp_bytes = interp;
  b->conformance = size_add(size_add(interp, b->forward), 64 * 1024);
  /* The optimizer's worst slot: every operand converted (a broadcast zero
   * gradient, a strided or bf16 parameter or moment). */
  p->opt_slot_scratch = 0;
  for (int k = 0; k < net->nparams; k++) {
    const tensor_meta *m = &net->nodes[net->param_nodes[k]].meta;
    size_t cs = m->dtype == TOPOS_F64 ? 8 : 4;
    size_t one = pool_bytes_of(shape_count(m->rank, m->shape), cs);
    size_t slot = size_mul(one, 4);
    if (slot > p->opt_slot_scratch) p->opt_slot_scratch = slot;
  }
  free(contig);
  free(up);
  free(down);
  return 0;
}

/* What the fused window adjoints (exec_group_grad) hold beside the
 * buffers the metered unfused scan counts, at the worst group: x's
 * zero-padded copy, the max-pool's window cotangents, the fold rows and
 * the weight gradient's accumulators, each at malloc's rounding; with
 * `remat`, every interior value a full field recomputes (eb_remat). */
static size_t fused_grad_bytes(const topos_plan *p, bool remat) {
  const topos_network *net = p->net;
  size_t worst = 0, members = 0;
  for (int k = 0; k < p->ngroups; k++) {
    const plan_group *g = &p->groups[k];
    if (!g->fused_grad) continue;
    size_t es = topos_dtype_size(net->nodes[g->head].meta.dtype) < 8 ? 4 : 8;
    size_t Hp = (size_t)(g->H + g->pad_top + g->pad_bottom);
    size_t Wp = (size_t)(g->W + g->pad_left + g->pad_right);
    size_t nc = (size_t)(g->N * g->C), L = (size_t)(g->kh * g->kw);
    size_t t = malloc_block(size_mul(size_mul(nc, size_mul(Hp, Wp)), es));
    t = size_add(t,
                 malloc_block(size_mul(
                     size_mul((size_t)g->C * (size_t)(g->oh * g->ow), L), es)));
    t = size_add(t, malloc_block(size_mul((size_t)(g->oh * g->kh) * Wp, es)));
    t = size_add(t, malloc_block(size_mul(Hp * Wp, es)));
    t = size_add(t, 2 * malloc_block(size_mul((size_t)g->C * L, 8)));
    t = size_add(t, malloc_block(size_mul((size_t)(8 * g->nout), es)));
    if (net->nodes[g->head].meta.dtype == TOPOS_BF16) {
      /* f32 compute copies of x, gy (and the pooled values) and da. */
      size_t R = (size_t)(g->N * g->oh * g->ow);
      t = size_add(t, malloc_block(size_mul(nc * (size_t)(g->H * g->W), 4)));
      t = size_add(t,
                   2 * malloc_block(size_mul(
                           R, (size_t)(g->nout > g->C ? g->nout : g->C) * 4)));
      t = size_add(t, malloc_block(size_mul(R, (size_t)g->C * L * 4)));
    }
    if (t > worst) worst = t;
    for (int m = 0; m < g->nmembers; m++)
      members = size_add(members,
                         size_add(buffer_bytes(&net->nodes[g->members[m]].meta),
                                  TENSOR_STRUCT_BYTES));
  }
  return remat ? size_add(worst, members) : worst;
}

/* A training plan's backward figures: the reverse scan metered with and
 * without params_only; a scan that cannot be metered (never expected) is
 * bounded by every value three times over.  Conformance keeps the
 * reference's gradients while a candidate runs forward and gradients. */
static void plan_meter(topos_plan *p) {
  const topos_network *net = p->net;
  topos_run_bytes *b = &p->bytes;
  bool *contig = calloc((size_t)net->n + 1, sizeof(bool));
  size_t peak_g, held_g, peak_b, held_b;
  int32_t loss = p->roots[0];
  if (contig) value_contiguity(p, contig);
  if (!contig || backward_meter(net, loss, true, contig, &peak_g, &held_g) ||
      backward_meter(net, loss, false, contig, &peak_b, &held_b))
    peak_g = peak_b = held_g = size_mul(p->interp_bytes, 3);
  free(contig);
  peak_g = size_add(peak_g, fused_grad_bytes(p, false));
  peak_b = size_add(peak_b, fused_grad_bytes(p, true));
  b->gradients = peak_g;
  b->backward = peak_b;
  b->gradients_held = held_g;
  b->conformance = size_add(size_add(p->interp_bytes, peak_g),
                            size_add(b->forward, b->gradients));
  b->conformance = size_add(b->conformance, 64 * 1024); /* rows, tables */
}

/* The figures of a plan, metering a training plan's scan once (plans are
 * shared by threads: under the plan's lock). */
static const topos_run_bytes *plan_bytes(const topos_plan *plan) {
  topos_plan *p = (topos_plan *)plan; /* the figures are a cache */
  if (p->posture == TOPOS_POSTURE_TRAINING &&
      !atomic_load_explicit(&p->metered, memory_order_acquire)) {
    pthread_mutex_lock(&p->meter_lock);
    if (!atomic_load_explicit(&p->metered, memory_order_relaxed)) {
      plan_meter(p);
      atomic_store_explicit(&p->metered, true, memory_order_release);
    }
    pthread_mutex_unlock(&p->meter_lock);
  }
  return &p->bytes;
}

/* Liveness, free lists and peak bytes over the schedule. */
static int plan_liveness(topos_plan *p, topos_error *err) {
  const topos_network *net = p->net;
  int n = net->n, S = p->nschedule;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n + 1));
  int32_t *owner = malloc(sizeof(int32_t) * (size_t)(n + 1));
  int32_t *end = malloc(sizeof(int32_t) * (size_t)(n + 1));
  bool *contig = calloc((size_t)n + 1, sizeof(bool));
  int32_t *count = calloc((size_t)S + 2, sizeof(int32_t));
  p->last_use = malloc(sizeof(int32_t) * (size_t)(n + 1));
  p->free_start = calloc((size_t)S + 2, sizeof(int32_t));
  p->free_after = malloc(sizeof(int32_t) * (size_t)(S + 1));
  int rc = 0;
  if (!pos || !owner || !end || !contig || !count || !p->last_use ||
      !p->free_start || !p->free_after) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++) pos[i] = p->last_use[i] = -1;
  for (int s = 0; s < S; s++) pos[p->schedule[s]] = s;
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    int g = p->group_of[i];
    if (g >= 0) { /* a group head reads the group's inputs */
      for (int k = 0; k < p->groups[g].nins; k++)
        p->last_use[p->groups[g].ins[k]] = s;
    } else {
      for (int j = 0; j < net->nodes[i].nin; j++)
        p->last_use[net->nodes[i].in[j]] = s;
    }
  }
  /* A value dies after its last use (or its own step if unused); a
   * retained one lives to the end of the run. */
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    if (p->retain[i]) continue;
    int32_t d = p->last_use[i] >= 0 ? p->last_use[i] : s;
    count[d]++;
  }
  for (int s = 0; s < S; s++)
    p->free_start[s + 1] = p->free_start[s] + count[s];
  memset(count, 0, sizeof(int32_t) * (size_t)(S + 2));
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    if (p->retain[i]) continue;
    int32_t d = p->last_use[i] >= 0 ? p->last_use[i] : s;
    p->free_after[p->free_start[d] + count[d]++] = i;
  }
  /* Peak bytes: a buffer lives from its owner's step until the last of
   * the values viewing it dies. */
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    const node *nd = &net->nodes[i];
    bool owns = owns_buffer(nd, contig) && !is_member(p, i);
    bool g = p->group_of[i] >= 0;
    owner[i] = owns || g ? i : (nd->nin ? owner[nd->in[0]] : -1);
    if (nd->op == OP_RESHAPE)
      contig[i] = owns || contig[nd->in[0]];
    else
      contig[i] = owns || g;
    end[i] = -1;
  }
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    int32_t o = owner[i];
    if (o < 0) continue;
    int32_t d = p->retain[i] ? S : (p->last_use[i] >= 0 ? p->last_use[i] : s);
    if (d > end[o]) end[o] = d;
  }
  size_t live_bytes = 0, peak = 0;
  int64_t *delta = calloc((size_t)S + 2, sizeof(int64_t));
  if (!delta) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
    goto done;
  }
  for (int s = 0; s < S; s++) {
    int32_t i = p->schedule[s];
    if (owner[i] != i) continue;
    const tensor_meta *m = &net->nodes[i].meta;
    int64_t bytes =
        shape_count(m->rank, m->shape) * (int64_t)topos_dtype_size(m->dtype);
    delta[s] += bytes;
    delta[end[i] + 1] -= bytes;
    /* A group's exported members: born with the head, retained. */
    int g = p->group_of[i];
    for (int k = 0; g >= 0 && k < p->groups[g].nmembers; k++) {
      if (!p->groups[g].exported[k]) continue;
      const tensor_meta *mm = &net->nodes[p->groups[g].members[k]].meta;
      int64_t eb = shape_count(mm->rank, mm->shape) *
                   (int64_t)topos_dtype_size(mm->dtype);
      delta[s] += eb;
      delta[S + 1] -= eb;
    }
  }
  for (int s = 0; s < S; s++) {
    live_bytes = (size_t)((int64_t)live_bytes + delta[s]);
    if (live_bytes > peak) peak = live_bytes;
  }
  p->peak_bytes = peak;
  free(delta);
  rc = plan_bounds(p, owner, end, err);
done:
  free(pos);
  free(owner);
  free(end);
  free(contig);
  free(count);
  return rc;
}

void topos_plan_free(topos_plan *p) {
  if (!p) return;
  pthread_mutex_destroy(&p->meter_lock);
  free(p->roots);
  free(p->observes);
  free(p->schedule);
  free(p->live);
  free(p->keep);
  free(p->retain);
  free(p->last_use);
  free(p->free_after);
  free(p->free_start);
  free(p->group_of);
  free(p->groups);
  topos_network_release(p->net);
  free(p);
}

/* Copies entry values to node indices; -1 with err on a bad one. */
static int32_t *entry_nodes(const topos_network *net, const topos_value *v,
                            int n, const char *what, topos_error *err) {
  if (n < 0 || (n > 0 && !v)) {
    error_set(err, TOPOS_ERR_ARGUMENT, "lower: %d %s with %s array", n, what,
              v ? "an" : "a NULL");
    return NULL;
  }
  int32_t *out = malloc(sizeof(int32_t) * (size_t)(n + 1));
  if (!out) {
    error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
    return NULL;
  }
  for (int k = 0; k < n; k++) {
    topos_error e = {0};
    out[k] = network_index(net, v[k], &e);
    if (out[k] < 0) {
      error_set(err, TOPOS_ERR_ARGUMENT, "lower: %s %d: %s", what, k,
                e.message);
      free(out);
      return NULL;
    }
  }
  return out;
}

topos_plan *topos_network_lower(const topos_network *net,
                                const topos_entry *entry, topos_error *err) {
  if (!net || !entry) {
    error_set(err, TOPOS_ERR_ARGUMENT, "lower: %s is NULL",
              net ? "entry" : "network");
    return NULL;
  }
  if (entry->nroots < 1) {
    error_set(err, TOPOS_ERR_ARGUMENT, "lower: an entry needs a root");
    return NULL;
  }
  if ((entry->posture != TOPOS_POSTURE_FORWARD &&
       entry->posture != TOPOS_POSTURE_TRAINING) ||
      (entry->numerics != TOPOS_NUMERICS_EXACT &&
       entry->numerics != TOPOS_NUMERICS_FAST)) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "lower: unknown posture %d or numerics "
              "%d",
              (int)entry->posture, (int)entry->numerics);
    return NULL;
  }
  if (entry->threads < 0 || entry->threads > TOPOS_THREADS_MAX) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "lower: entry threads %d is out of range (0 = the process "
              "default, else 1..%d)",
              entry->threads, TOPOS_THREADS_MAX);
    return NULL;
  }
  topos_plan *p = calloc(1, sizeof *p);
  if (!p) {
    error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
    return NULL;
  }
  pthread_mutex_init(&p->meter_lock, NULL);
  int n = net->n;
  p->net = topos_network_retain(net);
  p->posture = entry->posture;
  p->numerics = entry->numerics;
  p->threads = entry->threads;
  p->nroots = entry->nroots;
  p->nobserves = entry->nobserves;
  p->roots = entry_nodes(net, entry->roots, entry->nroots, "root", err);
  if (!p->roots) goto fail;
  p->observes =
      entry_nodes(net, entry->observes, entry->nobserves, "observe", err);
  if (!p->observes) goto fail;
  p->live = calloc((size_t)n + 1, sizeof(bool));
  p->keep = calloc((size_t)n + 1, sizeof(bool));
  p->retain = calloc((size_t)n + 1, sizeof(bool));
  p->group_of = malloc(sizeof(int32_t) * (size_t)(n + 1));
  p->schedule = malloc(sizeof(int32_t) * (size_t)(n + 1));
  if (!p->live || !p->keep || !p->retain || !p->group_of || !p->schedule) {
    error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
    goto fail;
  }
  for (int k = 0; k < p->nroots; k++) p->keep[p->roots[k]] = true;
  for (int k = 0; k < p->nobserves; k++) p->keep[p->observes[k]] = true;
  for (int i = n - 1; i >= 0; i--) {
    p->group_of[i] = -1;
    p->live[i] |= p->keep[i];
    if (p->live[i])
      for (int j = 0; j < net->nodes[i].nin; j++)
        p->live[net->nodes[i].in[j]] = true;
  }
  memcpy(p->retain, p->keep, sizeof(bool) * (size_t)n);
  if (p->posture == TOPOS_POSTURE_TRAINING) {
    int32_t loss = p->roots[0];
    const tensor_meta *lm = &net->nodes[loss].meta;
    if (lm->rank != 0 || !dtype_is_float(lm->dtype)) {
      char mt[SHAPE_TEXT + 8];
      error_set(err, TOPOS_ERR_SHAPE,
                "lower: a training entry's first root is the loss; node %d "
                "is %s, not a rank-0 float",
                loss, meta_text(mt, lm));
      goto fail;
    }
    /* Keep every value an adjoint of the loss's ancestors reads. */
    bool *anc = calloc((size_t)n + 1, sizeof(bool));
    if (!anc) {
      error_set(err, TOPOS_ERR_MEMORY, "lower: out of memory");
      goto fail;
    }
    anc[loss] = true;
    for (int i = loss; i >= 0; i--) {
      if (!anc[i]) continue;
      const node *nd = &net->nodes[i];
      unsigned reads = op_table[nd->op].reads;
      if (reads & READS_OUTPUT) p->retain[i] = true;
      for (int j = 0; j < nd->nin; j++) {
        anc[nd->in[j]] = true;
        if (reads & READS_OPERAND(j)) p->retain[nd->in[j]] = true;
      }
    }
    free(anc);
  }
  if (elect_groups(p, err)) goto fail;
  for (int i = 0; i < n; i++)
    if (p->live[i] && !is_member(p, i)) p->schedule[p->nschedule++] = i;
  if (plan_liveness(p, err)) goto fail;
  return p;
fail:
  topos_plan_free(p);
  return NULL;
}

size_t topos_plan_peak_bytes(const topos_plan *plan) {
  return plan ? plan->peak_bytes : 0;
}

void topos_plan_run_bytes(const topos_plan *plan, topos_run_bytes *out) {
  if (!out) return;
  if (!plan) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = *plan_bytes(plan);
}

size_t topos_plan_device_bytes(const topos_plan *plan) {
  if (!plan) return 0;
  const topos_network *net = plan->net;
  bool training = plan->posture == TOPOS_POSTURE_TRAINING;
  size_t best = 0;
  for (int s = 0; s < plan->nschedule; s++) {
    int32_t i = plan->schedule[s];
    const node *nd = &net->nodes[i];
    if (is_leaf(nd->op)) continue;
    int g = plan->group_of[i];
    size_t ins = 0;
    if (g >= 0)
      for (int k = 0; k < plan->groups[g].nins; k++)
        ins =
            size_add(ins, data_bytes(&net->nodes[plan->groups[g].ins[k]].meta));
    else
      for (int k = 0; k < nd->nin; k++)
        ins = size_add(ins, data_bytes(&net->nodes[nd->in[k]].meta));
    size_t task = size_add(ins, data_bytes(&nd->meta));
    if (training) task = size_add(task, ins);
    if (task > best) best = task;
  }
  return best;
}

/* A set of tensors shaped like the parameters, in dtype `moment` (bf16
 * parameters keep f32 moments) or their own. */
static size_t param_set_bytes(const topos_network *net, bool moment) {
  size_t total = malloc_block(sizeof(topos_params));
  total = size_add(
      total, malloc_block(sizeof(topos_tensor *) * (size_t)(net->nparams + 1)));
  for (int k = 0; k < net->nparams; k++) {
    tensor_meta m = net->nodes[net->param_nodes[k]].meta;
    if (moment && m.dtype == TOPOS_BF16) m.dtype = TOPOS_F32;
    total = size_add(total, size_add(buffer_bytes(&m), TENSOR_STRUCT_BYTES));
  }
  return total;
}

size_t topos_plan_step_bytes(const topos_plan *plan,
                             const struct topos_optimizer *opt,
                             bool params_given, bool state_given) {
  if (!plan || plan->posture != TOPOS_POSTURE_TRAINING) return 0;
  const topos_run_bytes *b = plan_bytes(plan);
  /* Moments: none for plain SGD, one with momentum, two for Adam(W);
   * the worst when the optimizer is not known. */
  int moments = 2;
  if (opt && opt->kind == TOPOS_SGD) moments = opt->momentum != 0 ? 1 : 0;
  size_t params = param_set_bytes(plan->net, false);
  size_t state =
      size_add(malloc_block(64),
               size_mul(param_set_bytes(plan->net, true), (size_t)moments));
  size_t before = 0;
  if (!params_given) before = size_add(before, params); /* the initials */
  if (!state_given) before = size_add(before, state);   /* a fresh state */
  /* Forward; then gradients on top of the run; then the update on top of
   * the run and the gradients, converting one slot at a time. */
  size_t phase = b->forward;
  size_t grads = size_add(b->retained, b->gradients);
  if (grads > phase) phase = grads;
  size_t update =
      size_add(size_add(b->retained, b->gradients_held),
               size_add(size_add(params, state), plan->opt_slot_scratch));
  if (update > phase) phase = update;
  /* The observes taken from the run. */
  phase = size_add(phase, malloc_block(sizeof(topos_tensor *) *
                                       (size_t)(plan->nobserves + 1)));
  return size_add(before, phase);
}

int topos_plan_group_count(const topos_plan *plan) {
  return plan ? plan->ngroups : 0;
}

int topos_plan_threads(const topos_plan *plan) {
  return plan ? plan->threads : 0;
}

/* ------------------------------------------------------------------ running */

topos_exec topos_plan_exec(const topos_plan *plan) {
  topos_exec ctx = {0};
  if (plan) {
    ctx.numerics = plan->numerics;
    ctx.threads = plan->threads;
  }
  return ctx;
}

/* The run's context: the caller's, else the plan's entry. */
static int plan_env(const topos_plan *plan, const topos_exec *ctx,
                    exec_env *env, topos_error *err) {
  topos_exec dflt = topos_plan_exec(plan);
  return exec_resolve(ctx ? ctx : &dflt, env, err);
}

topos_run *topos_plan_forward(const topos_plan *plan,
                              const topos_params *params,
                              const topos_feed *feeds, int nfeeds,
                              const topos_exec *ctx, topos_error *err) {
  if (!plan) {
    error_set(err, TOPOS_ERR_ARGUMENT, "plan forward: plan is NULL");
    return NULL;
  }
  const topos_network *net = plan->net;
  exec_env env;
  if (plan_env(plan, ctx, &env, err)) return NULL;
  const topos_tensor **fed = malloc(sizeof(*fed) * (size_t)(net->ninputs + 1));
  topos_run *run = fed ? run_alloc(net, err) : NULL;
  if (run) {
    run->plan = plan;
    run->readable = malloc(sizeof(bool) * (size_t)(net->n + 1));
  }
  if (!run || !run->readable) {
    if (!fed || run)
      error_set(err, TOPOS_ERR_MEMORY, "plan forward: no memory");
    goto fail;
  }
  memcpy(run->readable, plan->keep, sizeof(bool) * (size_t)net->n);
  if (run_prepare(net, params, feeds, nfeeds, fed, err)) goto fail;
  for (int s = 0; s < plan->nschedule; s++) {
    int32_t i = plan->schedule[s];
    int g = plan->group_of[i];
    if (exec_stop(&env, err)) goto fail;
    if (g >= 0) {
      const plan_group *grp = &plan->groups[g];
      const topos_tensor *ins[GROUP_MAX_INS];
      topos_tensor *exports[GROUP_MAX_MEMBERS] = {0};
      for (int k = 0; k < grp->nins; k++) {
        ins[k] = run->vals[grp->ins[k]];
        if (!ins[k]) {
          error_set(err, TOPOS_ERR_STATE,
                    "fused group %d (node %d): input %%%d has no value", g, i,
                    grp->ins[k]);
          goto fail;
        }
      }
      topos_error e = {0};
      run->vals[i] =
          exec_group(&env, grp, &net->nodes[i].meta, ins, exports, &e);
      if (!run->vals[i]) {
        error_set(err, e.code, "%s (node %d, fused): %s",
                  op_table[net->nodes[i].op].name, i, e.message);
        goto fail;
      }
      for (int k = 0; k < grp->nmembers; k++)
        if (exports[k]) run->vals[grp->members[k]] = exports[k];
    } else if (run_eval_node(&env, run, i, params, fed, err)) {
      goto fail;
    }
    for (int k = plan->free_start[s]; k < plan->free_start[s + 1]; k++) {
      int32_t v = plan->free_after[k];
      topos_tensor_release(run->vals[v]);
      run->vals[v] = NULL;
    }
  }
  free(fed);
  return run;
fail:
  free(fed);
  topos_run_free(run);
  return NULL;
}

/* The checks both plan entry points to backward make. */
static bool plan_backward_ok(const topos_plan *plan, const topos_run *run,
                             const char *what, topos_error *err) {
  if (!plan || !run) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s is NULL", what,
              plan ? "run" : "plan");
    return false;
  }
  if (run->plan != plan) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: the run was not made by this plan",
              what);
    return false;
  }
  if (plan->posture != TOPOS_POSTURE_TRAINING) {
    error_set(err, TOPOS_ERR_STATE,
              "%s: the plan is forward-only; lower with the training posture",
              what);
    return false;
  }
  return true;
}

/* A fast plan's backward is fast too, and uses the plan's threads, unless
 * the caller's context says otherwise. */
topos_field *topos_plan_backward(const topos_plan *plan, const topos_run *run,
                                 const topos_exec *ctx, topos_error *err) {
  exec_env env;
  if (!plan_backward_ok(plan, run, "plan backward", err)) return NULL;
  if (plan_env(plan, ctx, &env, err)) return NULL;
  return run_backward(&env, run, plan->roots[0], err);
}

topos_params *topos_plan_gradients(const topos_plan *plan, const topos_run *run,
                                   const topos_exec *ctx, topos_error *err) {
  exec_env env;
  if (!plan_backward_ok(plan, run, "plan gradients", err)) return NULL;
  if (plan_env(plan, ctx, &env, err)) return NULL;
  return run_gradients(&env, run, plan->roots[0], err);
}

/* ---------------------------------------------------------------- describe */

/* " members %a %b (written) ...": the ones a group's kernel writes
 * marked. */
static void text_members(text *t, const plan_group *grp) {
  text_add(t, " members");
  for (int m = 0; m < grp->nmembers; m++)
    text_add(t, " %%%d%s", grp->members[m],
             grp->exported[m] ? " (written)" : "");
}

static const char *group_name(group_kind kind) {
  switch (kind) {
    case GROUP_CONV:
      return "fused-conv";
    case GROUP_POOL:
      return "fused-pool";
    case GROUP_ATTENTION:
      return "fused-attention";
    case GROUP_GELU:
      return "fused-gelu";
  }
  return "fused";
}

char *topos_plan_describe(const topos_plan *plan, topos_error *err) {
  if (!plan) {
    error_set(err, TOPOS_ERR_ARGUMENT, "plan describe: plan is NULL");
    return NULL;
  }
  const topos_network *net = plan->net;
  int nlive = 0;
  for (int i = 0; i < net->n; i++) nlive += plan->live[i];
  text t = {0};
  char threads[32] = "";
  if (plan->threads)
    snprintf(threads, sizeof threads, ", threads %d", plan->threads);
  text_add(&t,
           "plan: posture %s, numerics %s%s; %d of %d nodes live, %d "
           "scheduled, %d fused groups; peak %zu bytes\n",
           plan->posture == TOPOS_POSTURE_TRAINING ? "training" : "forward",
           plan->numerics == TOPOS_NUMERICS_FAST ? "fast" : "exact", threads,
           nlive, net->n, plan->nschedule, plan->ngroups, plan->peak_bytes);
  text_add(&t, "roots:");
  for (int k = 0; k < plan->nroots; k++) text_add(&t, " %%%d", plan->roots[k]);
  text_add(&t, "\nobserves:");
  for (int k = 0; k < plan->nobserves; k++)
    text_add(&t, " %%%d", plan->observes[k]);
  text_add(&t, "\nschedule (step: node op dtype[shape] live-span notes):\n");
  for (int s = 0; s < plan->nschedule; s++) {
    int32_t i = plan->schedule[s];
    const node *n = &net->nodes[i];
    char mt[SHAPE_TEXT + 8];
    int g = plan->group_of[i];
    int32_t last = plan->retain[i]          ? plan->nschedule - 1
                   : plan->last_use[i] >= 0 ? plan->last_use[i]
                                            : s;
    text_add(&t, "  %4d: %%%-4d %-16s %-20s live %d..%d", s, i,
             g >= 0 ? group_name(plan->groups[g].kind) : op_table[n->op].name,
             meta_text(mt, &n->meta), s, last);
    if (plan->keep[i])
      text_add(&t, " keep");
    else if (plan->retain[i])
      text_add(&t, " kept-for-backward");
    if (g >= 0) text_add(&t, " group %d", g);
    if (plan->free_start[s + 1] > plan->free_start[s]) {
      text_add(&t, " free");
      for (int k = plan->free_start[s]; k < plan->free_start[s + 1]; k++)
        text_add(&t, " %%%d", plan->free_after[k]);
    }
    text_add(&t, "\n");
  }
  for (int g = 0; g < plan->ngroups; g++) {
    const plan_group *grp = &plan->groups[g];
    if (grp->kind == GROUP_GELU) {
      text_add(&t, "group %d: gelu (tanh; three passes) head %%%d x %%%d", g,
               grp->head, grp->x);
      text_members(&t, grp);
      text_add(&t, "\n");
      continue;
    }
    if (grp->kind == GROUP_ATTENTION) {
      text_add(&t,
               "group %d: attention (one pass per query row) head %%%d q %%%d "
               "k %%%d v %%%d",
               g, grp->head, grp->ins[0], grp->ins[1], grp->ins[2]);
      int k = 3;
      if (grp->scaled >= 0) text_add(&t, " scale %%%d", grp->ins[k++]);
      if (grp->masked >= 0) text_add(&t, " mask %%%d", grp->ins[k++]);
      text_members(&t, grp);
      text_add(&t,
               "; %lld x %lld queries, %lld keys, %lld head features, "
               "%lld value features\n",
               (long long)grp->batch, (long long)grp->t, (long long)grp->s,
               (long long)grp->dh, (long long)grp->dv);
      continue;
    }
    text_add(&t, "group %d: %s head %%%d x %%%d", g,
             grp->kind == GROUP_CONV ? "conv (direct windowed product)"
                                     : "max-pool (window walk)",
             grp->head, grp->x);
    if (grp->weight >= 0) text_add(&t, " weight %%%d", grp->weight);
    text_members(&t, grp);
    text_add(&t,
             "; window %lldx%lld stride %lld,%lld dilation %lld,%lld "
             "padding %lld,%lld,%lld,%lld\n",
             (long long)grp->kh, (long long)grp->kw, (long long)grp->stride_h,
             (long long)grp->stride_w, (long long)grp->dil_h,
             (long long)grp->dil_w, (long long)grp->pad_top,
             (long long)grp->pad_bottom, (long long)grp->pad_left,
             (long long)grp->pad_right);
  }
  return text_finish(&t, "plan describe", err);
}
