/*
 * llama.c - Llama with a caller-owned KV cache (llama.h): the weights
 * under Hugging Face's names, the network recorded from the public op
 * surface, and a run that hands the cache back.
 *
 * It mirrors gpt2.c (same cache, same run) and differs in the block:
 * RMSNorm, rotary embeddings on q and k, grouped-query attention and a
 * SwiGLU MLP, all with nn.Linear's [out, in] weights.  topos_attention
 * wants k and v as wide as q, so the KV heads are repeated to H heads
 * (reshape, broadcast, reshape: a copy of data, no arithmetic) after the
 * cache concatenation: the cache keeps the KV heads alone.
 */
#include "llama.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 3, 4))) static int fail(topos_error *err,
                                                      int code, const char *fmt,
                                                      ...) {
  err->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  return -1;
}

static int out_of_memory(topos_error *err) {
  return fail(err, TOPOS_ERR_MEMORY, "llama: out of memory");
}

/* --------------------------------------------------------------- configs */

const char ex_llama_config_names[] = "tiny, smollm-135m, tinyllama-1.1b";

int ex_llama_config_named(const char *name, ex_llama_config *out) {
  if (!strcmp(name, "tiny"))
    *out = EX_LLAMA_TINY;
  else if (!strcmp(name, "smollm-135m"))
    *out = EX_LLAMA_SMOLLM_135M;
  else if (!strcmp(name, "tinyllama-1.1b"))
    *out = EX_LLAMA_TINYLLAMA_1B;
  else
    return -1;
  return 0;
}

int ex_llama_head_dim(const ex_llama_config *c) {
  return c->head_dim ? c->head_dim : c->heads > 0 ? c->width / c->heads : 0;
}

int ex_llama_check(const ex_llama_config *c, topos_error *err) {
  bool sizes = c->vocab >= 1 && c->context >= 1 && c->width >= 1 &&
               c->heads >= 1 && c->kv_heads >= 1 && c->ffn >= 1 &&
               c->head_dim >= 0 && c->layers >= 0 && c->layers <= 128;
  bool heads = sizes && c->heads % c->kv_heads == 0 &&
               (c->head_dim > 0 || c->width % c->heads == 0);
  int dh = heads ? ex_llama_head_dim(c) : 0;
  bool head_dim = dh >= 2 && dh % 2 == 0 && (int64_t)c->heads * dh <= INT32_MAX;
  bool numbers = c->rms_eps > 0 && isfinite(c->rms_eps) && c->rope_theta > 0 &&
                 isfinite(c->rope_theta);
  if (c->dtype != TOPOS_F32 && c->dtype != TOPOS_BF16)
    return fail(err, TOPOS_ERR_DTYPE,
                "llama: dtype %s: the weights are f32 or bf16",
                topos_dtype_name(c->dtype));
  if (sizes && heads && head_dim && numbers) return 0;
  return fail(err, TOPOS_ERR_ARGUMENT,
              "llama: vocab %d, context %d, width %d, %d heads, %d kv heads, "
              "head size %d, ffn %d, %d layers, eps %g, theta %g is not a "
              "Llama (positive sizes, kv heads dividing the heads, an even "
              "head size, at most 128 layers, eps and theta > 0)",
              c->vocab, c->context, c->width, c->heads, c->kv_heads,
              c->head_dim, c->ffn, c->layers, c->rms_eps, c->rope_theta);
}

/* ---------------------------------------------------------------- weights */

/* Weight i's name, shape and initialisation (normal or ones). */
typedef struct wspec {
  char name[64];
  int rank;
  int64_t shape[2];
  bool ones;
} wspec;

static int weight_count(const ex_llama_config *c) {
  return 1 + c->layers * EX_LLAMA_PER_LAYER + 1 + (c->tie ? 0 : 1);
}

static int weight_specs(const ex_llama_config *c, wspec *out) {
  const int64_t V = c->vocab, D = c->width, F = c->ffn;
  const int64_t Q = (int64_t)c->heads * ex_llama_head_dim(c);
  const int64_t K = (int64_t)c->kv_heads * ex_llama_head_dim(c);
  static const char *const suffix[EX_LLAMA_PER_LAYER] = {
      "input_layernorm.weight",  "self_attn.q_proj.weight",
      "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight"};
  const int64_t shape[EX_LLAMA_PER_LAYER][2] = {
      {D}, {Q, D}, {K, D}, {K, D}, {D, Q}, {D}, {F, D}, {F, D}, {D, F}};
  int n = 0;
  out[n++] = (wspec){"model.embed_tokens.weight", 2, {V, D}, false};
  for (int l = 0; l < c->layers; l++)
    for (int k = 0; k < EX_LLAMA_PER_LAYER; k++) {
      wspec *p = &out[n++];
      snprintf(p->name, sizeof p->name, "model.layers.%d.%s", l, suffix[k]);
      p->ones = k == 0 || k == 5;
      p->rank = p->ones ? 1 : 2;
      p->shape[0] = shape[k][0];
      p->shape[1] = shape[k][1];
    }
  out[n++] = (wspec){"model.norm.weight", 1, {D}, true};
  if (!c->tie) out[n++] = (wspec){"lm_head.weight", 2, {V, D}, false};
  return n;
}

static int weights_alloc(ex_llama_weights *w, const ex_llama_config *c,
                         wspec **specs, topos_error *err) {
  memset(w, 0, sizeof *w);
  if (ex_llama_check(c, err) != 0) return -1;
  int n = weight_count(c);
  *specs = calloc((size_t)n, sizeof **specs);
  w->names = calloc((size_t)n, sizeof *w->names);
  w->t = calloc((size_t)n, sizeof *w->t);
  if (!*specs || !w->names || !w->t) {
    free(*specs);
    ex_llama_weights_free(w);
    return out_of_memory(err);
  }
  w->c = *c;
  w->n = weight_specs(c, *specs);
  for (int i = 0; i < w->n; i++)
    snprintf(w->names[i], sizeof w->names[i], "%s", (*specs)[i].name);
  return 0;
}

int ex_llama_init(ex_llama_weights *w, const ex_llama_config *c, uint64_t seed,
                  topos_error *err) {
  wspec *s;
  if (weights_alloc(w, c, &s, err) != 0) return -1;
  for (int i = 0; i < w->n; i++) {
    const wspec *p = &s[i];
    /* Drawn in f32 whatever the dtype: bf16 weights are the f32 ones
     * rounded. */
    w->t[i] = ex_weight_as(
        p->ones ? topos_tensor_ones(TOPOS_F32, p->rank, p->shape, err)
                : topos_init_normal(TOPOS_F32, p->rank, p->shape, 0.0, 0.02,
                                    seed * 1000 + (uint64_t)i, err),
        c->dtype, err);
    if (!w->t[i]) {
      free(s);
      ex_llama_weights_free(w);
      return -1;
    }
  }
  free(s);
  if (!(w->params = topos_params_new(w->n, w->t, err))) {
    ex_llama_weights_free(w);
    return -1;
  }
  return 0;
}

/* Whether t is f32 or bf16 with spec p's shape. */
static bool fits(const topos_tensor *t, const wspec *p) {
  topos_dtype dt = topos_tensor_dtype(t);
  if ((dt != TOPOS_F32 && dt != TOPOS_BF16) || topos_tensor_rank(t) != p->rank)
    return false;
  for (int d = 0; d < p->rank; d++)
    if (topos_tensor_shape(t)[d] != p->shape[d]) return false;
  return true;
}

int ex_llama_load(ex_llama_weights *w, const ex_llama_config *c,
                  const char *path, topos_error *err) {
  wspec *s;
  if (weights_alloc(w, c, &s, err) != 0) return -1;
  topos_safetensors *st = topos_safetensors_load(path, err);
  int rc = st ? 0 : -1;
  for (int i = 0; rc == 0 && i < w->n; i++) {
    topos_error e2 = {0};
    topos_tensor *t = topos_safetensors_get(st, s[i].name, &e2);
    if (!t && e2.code != TOPOS_ERR_NOT_FOUND) { /* the file changed, I/O */
      *err = e2;
      rc = -1;
    } else if (!t) {
      rc = fail(err, TOPOS_ERR_NOT_FOUND, "llama: %s: no weight of that name%s",
                s[i].name,
                !strcmp(s[i].name, "lm_head.weight")
                    ? " (a tied model: a config with tie set)"
                    : "");
    } else if (!fits(t, &s[i])) {
      topos_tensor_release(t);
      if (s[i].rank == 1)
        rc = fail(err, TOPOS_ERR_SHAPE,
                  "llama: %s: expected f32 or bf16 [%lld] for this config",
                  s[i].name, (long long)s[i].shape[0]);
      else
        rc =
            fail(err, TOPOS_ERR_SHAPE,
                 "llama: %s: expected f32 or bf16 [%lld, %lld] for this "
                 "config",
                 s[i].name, (long long)s[i].shape[0], (long long)s[i].shape[1]);
    } else if (!(w->t[i] = ex_weight_as(t, c->dtype, err))) {
      /* The file's dtype to the config's: bf16 widens exactly, f32
       * rounds once. */
      rc = -1;
    }
  }
  topos_safetensors_free(st);
  free(s);
  if (rc == 0 && !(w->params = topos_params_new(w->n, w->t, err))) rc = -1;
  if (rc != 0) ex_llama_weights_free(w);
  return rc;
}

int ex_llama_save(const ex_llama_weights *w, const char *path,
                  topos_error *err) {
  const char **names = calloc((size_t)w->n, sizeof *names);
  if (!names) return out_of_memory(err);
  for (int i = 0; i < w->n; i++) names[i] = w->names[i];
  int rc = topos_safetensors_save(path, w->n, names, w->t, err);
  free(names);
  return rc == TOPOS_OK ? 0 : -1;
}

void ex_llama_weights_free(ex_llama_weights *w) {
  topos_params_free(w->params);
  for (int i = 0; w->t && i < w->n; i++) topos_tensor_release(w->t[i]);
  free(w->t);
  free(w->names);
  memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------ networks */

/* x[rows, in]·wᵀ for an nn.Linear weight w[out, in]. */
static topos_value proj(topos_tape *tape, topos_value x, topos_value w) {
  return topos_matmul(tape, x, topos_transpose(tape, w));
}

/* [1, S, KV·Dh] -> [1, S, KV·R·Dh]: kv head j becomes query heads
 * j·R .. j·R+R-1 (Hugging Face's repeat_kv). */
static topos_value repeat_kv(topos_tape *tape, topos_value x, int64_t S,
                             int64_t KV, int64_t R, int64_t Dh) {
  if (R == 1) return x;
  int64_t one[4] = {S, KV, 1, Dh}, rep[4] = {S, KV, R, Dh};
  int64_t back[3] = {1, S, KV * R * Dh};
  topos_value r = topos_reshape(tape, x, 4, one);
  return topos_reshape(tape, topos_broadcast(tape, r, 4, rep), 3, back);
}

/* One attention block on a[T, D] (normed): the projections, rotary
 * embeddings at past.., [cache ‖ new] keys and values (handed back in
 * *k_all, *v_all), grouped-query causal attention and o_proj. */
static topos_value attention_block(topos_tape *tape, const ex_llama_config *c,
                                   const topos_value *b, topos_value a,
                                   int64_t T, int64_t past, topos_value kc,
                                   topos_value vc, topos_value *k_all,
                                   topos_value *v_all) {
  const int64_t H = c->heads, KV = c->kv_heads, Dh = ex_llama_head_dim(c);
  int64_t qs[3] = {1, T, H * Dh}, ks[3] = {1, T, KV * Dh};
  topos_value q = topos_reshape(tape, proj(tape, a, b[1]), 3, qs);
  topos_value k = topos_reshape(tape, proj(tape, a, b[2]), 3, ks);
  topos_value v = topos_reshape(tape, proj(tape, a, b[3]), 3, ks);
  q = topos_rope(tape, q, (int)H, past, c->rope_theta);
  k = topos_rope(tape, k, (int)KV, past, c->rope_theta);
  if (past > 0) {
    topos_value kk[2] = {kc, k}, vv[2] = {vc, v};
    k = topos_concat(tape, 2, kk, 1);
    v = topos_concat(tape, 2, vv, 1);
  }
  *k_all = k;
  *v_all = v;
  const int64_t S = past + T;
  topos_attention_opts ao = {.heads = (int)H, .causal = true, .past = past};
  topos_value y =
      topos_attention(tape, q, repeat_kv(tape, k, S, KV, H / KV, Dh),
                      repeat_kv(tape, v, S, KV, H / KV, Dh), &ao);
  int64_t rows[2] = {T, H * Dh};
  return proj(tape, topos_reshape(tape, y, 2, rows), b[4]);
}

/* SwiGLU on f[T, D] (normed): down(silu(gate(f)) * up(f)). */
static topos_value mlp_block(topos_tape *tape, const topos_value *b,
                             topos_value f) {
  topos_value g = topos_silu(tape, proj(tape, f, b[6]));
  return proj(tape, topos_mul(tape, g, proj(tape, f, b[7])), b[8]);
}

/* Records the whole network on tape; p has room for the parameters, zc
 * is the cache inputs' default. */
static void record(ex_kv_net *n, topos_tape *tape, const ex_llama_weights *w,
                   topos_value *p, const topos_tensor *x0,
                   const topos_tensor *zc) {
  const ex_llama_config *c = &w->c;
  const int64_t T = n->T, past = n->past, D = c->width;
  for (int i = 0; i < w->n; i++)
    p[i] = ex_kv_parameter(tape, w->t[i], w->names[i]);
  n->x = topos_name(tape, topos_input(tape, x0), "x");
  int64_t rows[2] = {T, D};
  topos_value h =
      topos_reshape(tape, topos_embedding(tape, p[0], n->x), 2, rows);
  for (int l = 0; l < n->layers; l++) {
    const topos_value *b = p + 1 + l * EX_LLAMA_PER_LAYER;
    topos_value kc, vc;
    ex_kv_cache_inputs(n, tape, l, zc, &kc, &vc);
    topos_value a = topos_rms_norm(tape, h, b[0], c->rms_eps);
    topos_value att = attention_block(tape, c, b, a, T, past, kc, vc,
                                      &n->k_out[l], &n->v_out[l]);
    ex_kv_name_outputs(n, tape, l);
    h = topos_add(tape, h, att);
    topos_value f = topos_rms_norm(tape, h, b[5], c->rms_eps);
    h = topos_add(tape, h, mlp_block(tape, b, f));
  }
  const topos_value *tail = p + 1 + n->layers * EX_LLAMA_PER_LAYER;
  h = topos_rms_norm(tape, h, tail[0], c->rms_eps);
  /* The head: lm_head, or the embedding when tied; [V, D] either way. */
  n->logits =
      topos_name(tape, proj(tape, h, c->tie ? p[0] : tail[1]), "logits");
}

int ex_llama_record(ex_kv_net *n, const ex_llama_weights *w, int64_t T,
                    int64_t past, topos_error *err) {
  memset(n, 0, sizeof *n);
  const ex_llama_config *c = &w->c;
  if (T < 1 || past < 0 || past > c->context - T)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "llama: %lld tokens after %lld cached ones do not fit the "
                "context of %d",
                (long long)T, (long long)past, c->context);
  if (ex_kv_net_begin(n, c->layers, T, past, w->params, w->n, err) != 0)
    return -1;
  topos_value *p = calloc((size_t)w->n, sizeof *p);
  if (!p) {
    ex_kv_net_free(n);
    return out_of_memory(err);
  }
  int64_t xs[2] = {1, T};
  int64_t cs[3] = {1, past, (int64_t)c->kv_heads * ex_llama_head_dim(c)};
  topos_tensor *x0 = topos_tensor_zeros(TOPOS_I32, 2, xs, err);
  /* The cache inputs' defaults: a broadcast zero, no memory of its own
   * (every run feeds the caller's cache). */
  topos_tensor *zero = topos_tensor_scalar(c->dtype, 0.0, err);
  topos_tensor *zc =
      zero && past > 0 ? topos_tensor_broadcast(zero, 3, cs, err) : NULL;
  /* One dtype for the whole network, the weights': with bf16 every
   * activation, the rotary tables, the logits and the cache are bf16. */
  topos_tape *tape =
      x0 && zero && (past == 0 || zc) ? topos_tape_new(c->dtype) : NULL;
  if (tape) {
    record(n, tape, w, p, x0, zc);
    n->net = topos_tape_seal(tape, err);
  } else if (x0 && zero && (past == 0 || zc)) {
    out_of_memory(err);
  }
  topos_tensor_release(x0);
  topos_tensor_release(zero);
  topos_tensor_release(zc);
  free(p);
  if (!n->net) {
    ex_kv_net_free(n);
    return -1;
  }
  return 0;
}

/* -------------------------------------------------------------- running */

/* logits_last: the last row of lg [T, V]. */
