/*
 * gpt2.c - GPT-2 with a caller-owned KV cache (gpt2.h).
 */
#include "gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(topos_error *err, int code, const char *fmt, const char *a,
                long long b) {
  err->code = code;
  snprintf(err->message, sizeof err->message, fmt, a, b);
  return -1;
}

int ex_gpt2_check(const ex_gpt2_config *c, topos_error *err) {
  if (c->vocab < 1 || c->context < 1 || c->width < 1 || c->heads < 1 ||
      c->layers < 0 || c->layers > 64 || c->width % c->heads != 0 ||
      (c->width / c->heads) % 2 != 0) {
    err->code = TOPOS_ERR_ARGUMENT;
    snprintf(err->message, sizeof err->message,
             "gpt2: vocab %d, context %d, width %d, %d heads, %d layers is "
             "not a GPT-2 (positive sizes, heads dividing the width into "
             "even head sizes, at most 64 layers)",
             c->vocab, c->context, c->width, c->heads, c->layers);
    return -1;
  }
  if (c->dtype != TOPOS_F32 && c->dtype != TOPOS_BF16) {
    err->code = TOPOS_ERR_DTYPE;
    snprintf(err->message, sizeof err->message,
             "gpt2: dtype %s: the weights are f32 or bf16",
             topos_dtype_name(c->dtype));
    return -1;
  }
  return 0;
}

/* Weight i's name, shape and initialisation kind (0 normal(0, 0.02), 1
 * zeros, 2 ones, 3 a residual projection). */
typedef struct wspec {
  char name[48];
  int rank;
  int64_t shape[2];
  int kind;
} wspec;

static int weight_specs(const ex_gpt2_config *c, wspec *out) {
  const int64_t V = c->vocab, T = c->context, D = c->width, FF = 4 * D;
  static const char *const suffix[EX_GPT2_PER_LAYER] = {
      "ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
      "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
      "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  static const int rank[EX_GPT2_PER_LAYER] = {1, 1, 2, 1, 2, 1,
                                              1, 1, 2, 1, 2, 1};
  static const int kind[EX_GPT2_PER_LAYER] = {2, 1, 0, 1, 3, 1,
                                              2, 1, 0, 1, 3, 1};
  const int64_t shape[EX_GPT2_PER_LAYER][2] = {
      {D}, {D}, {D, 3 * D}, {3 * D}, {D, D},  {D},
      {D}, {D}, {D, FF},    {FF},    {FF, D}, {D}};
  int n = 0;
  out[n++] = (wspec){"wte.weight", 2, {V, D}, 0};
  out[n++] = (wspec){"wpe.weight", 2, {T, D}, 0};
  for (int l = 0; l < c->layers; l++)
    for (int k = 0; k < EX_GPT2_PER_LAYER; k++) {
      wspec *p = &out[n++];
      snprintf(p->name, sizeof p->name, "h.%d.%s", l, suffix[k]);
      p->rank = rank[k];
      p->shape[0] = shape[k][0];
      p->shape[1] = shape[k][1];
      p->kind = kind[k];
    }
  out[n++] = (wspec){"ln_f.weight", 1, {D}, 2};
  out[n++] = (wspec){"ln_f.bias", 1, {D}, 1};
  return n;
}

static int weights_alloc(ex_gpt2_weights *w, const ex_gpt2_config *c,
                         wspec **specs, topos_error *err) {
  memset(w, 0, sizeof *w);
  if (ex_gpt2_check(c, err) != 0) return -1;
  int n = 2 + c->layers * EX_GPT2_PER_LAYER + 2;
  *specs = calloc((size_t)n, sizeof **specs);
  w->names = calloc((size_t)n, sizeof *w->names);
  w->t = calloc((size_t)n, sizeof *w->t);
  if (!*specs || !w->names || !w->t) {
    free(*specs);
    ex_gpt2_weights_free(w);
    return fail(err, TOPOS_ERR_MEMORY, "gpt2: out of memory%s%lld", "", 0);
  }
  w->c = *c;
  w->n = weight_specs(c, *specs);
  for (int i = 0; i < w->n; i++)
    snprintf(w->names[i], sizeof w->names[i], "%s", (*specs)[i].name);
  return 0;
}

int ex_gpt2_init(ex_gpt2_weights *w, const ex_gpt2_config *c, uint64_t seed,
                 topos_error *err) {
  wspec *s;
  if (weights_alloc(w, c, &s, err) != 0) return -1;
  for (int i = 0; i < w->n; i++) {
    const wspec *p = &s[i];
    double sd = p->kind == 3 ? 0.02 / sqrt(2.0 * c->layers) : 0.02;
    /* Drawn in f32 whatever the dtype: bf16 weights are the f32 ones
     * rounded. */
    w->t[i] = ex_weight_as(
        p->kind == 1   ? topos_tensor_zeros(TOPOS_F32, p->rank, p->shape, err)
        : p->kind == 2 ? topos_tensor_ones(TOPOS_F32, p->rank, p->shape, err)
                       : topos_init_normal(TOPOS_F32, p->rank, p->shape, 0.0,
                                           sd, seed * 1000 + (uint64_t)i, err),
        c->dtype, err);
    if (!w->t[i]) {
      free(s);
      ex_gpt2_weights_free(w);
      return -1;
    }
  }
  free(s);
  w->params = topos_params_new(w->n, w->t, err);
  if (!w->params) {
    ex_gpt2_weights_free(w);
    return -1;
  }
  return 0;
}

int ex_gpt2_load(ex_gpt2_weights *w, const ex_gpt2_config *c, const char *path,
                 topos_error *err) {
  wspec *s;
  if (weights_alloc(w, c, &s, err) != 0) return -1;
  topos_safetensors *st = topos_safetensors_load(path, err);
  int rc = st ? 0 : -1;
  for (int i = 0; rc == 0 && i < w->n; i++) {
    char prefixed[64];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", s[i].name);
    topos_error e2 = {0};
    topos_tensor *t = topos_safetensors_get(st, s[i].name, &e2);
    if (!t && e2.code == TOPOS_ERR_NOT_FOUND)
      t = topos_safetensors_get(st, prefixed, &e2);
    if (!t && e2.code != TOPOS_ERR_NOT_FOUND) { /* the file changed, I/O */
      *err = e2;
      rc = -1;
      break;
    }
    if (!t) {
      rc = fail(err, TOPOS_ERR_NOT_FOUND,
                "gpt2: %s: no weight of that name (with or without "
                "'transformer.')%.0lld",
                s[i].name, 0);
      break;
    }
    topos_dtype dt = topos_tensor_dtype(t);
    bool shape_ok = (dt == TOPOS_F32 || dt == TOPOS_BF16) &&
                    topos_tensor_rank(t) == s[i].rank;
    for (int d = 0; shape_ok && d < s[i].rank; d++)
      shape_ok = topos_tensor_shape(t)[d] == s[i].shape[d];
    if (!shape_ok) {
      topos_tensor_release(t);
      rc = fail(err, TOPOS_ERR_SHAPE,
                "gpt2: %s: expected f32 or bf16 with this config's shape "
                "(first extent %lld)",
                s[i].name, (long long)s[i].shape[0]);
      break;
    }
    /* The file's dtype to the config's: bf16 widens exactly, f32 rounds
     * once. */
    if (!(w->t[i] = ex_weight_as(t, c->dtype, err))) {
      rc = -1;
      break;
    }
  }
  topos_safetensors_free(st);
  free(s);
  if (rc == 0 && !(w->params = topos_params_new(w->n, w->t, err))) rc = -1;
  if (rc != 0) ex_gpt2_weights_free(w);
  return rc;
}

int ex_gpt2_save(const ex_gpt2_weights *w, const char *path, topos_error *err) {
  const char **names = calloc((size_t)w->n, sizeof *names);
  if (!names)
    return fail(err, TOPOS_ERR_MEMORY, "gpt2: out of memory%s%lld", "", 0);
  for (int i = 0; i < w->n; i++) names[i] = w->names[i];
  int rc = topos_safetensors_save(path, w->n, names, w->t, err);
  free(names);
  return rc == TOPOS_OK ? 0 : -1;
}

void ex_gpt2_weights_free(ex_gpt2_weights *w) {
  topos_params_free(w->params);
  for (int i = 0; w->t && i < w->n; i++) topos_tensor_release(w->t[i]);
  free(w->t);
  free(w->names);
  memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------ networks */

/* The step network; the parameters' initials the weights themselves
 * (embed) or zeros. */
static int record(ex_kv_net *n, const ex_gpt2_weights *w, int64_t T,
                  int64_t past, bool embed, topos_error *err) {
  memset(n, 0, sizeof *n);
  const ex_gpt2_config *c = &w->c;
  if (T < 1 || past < 0 || past + T > c->context)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "gpt2: %s%lld tokens after the cached ones do not fit the "
                "context",
                "", (long long)T);
  const int L = c->layers;
  const int64_t D = c->width;
  if (ex_kv_net_begin(n, L, T, past, w->params, w->n, err) != 0) return -1;
  topos_value *p = calloc((size_t)w->n, sizeof *p);
  int32_t *pos = calloc((size_t)T, sizeof *pos);
  if (!p || !pos) {
    free(p);
    free(pos);
    ex_kv_net_free(n);
    return fail(err, TOPOS_ERR_MEMORY, "gpt2: out of memory%s%lld", "", 0);
  }
  for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)(past + i);
  int64_t xs[2] = {1, T}, ts[1] = {T}, cs[3] = {1, past, D};
  topos_tensor *x0 = topos_tensor_zeros(TOPOS_I32, 2, xs, err);
  topos_tensor *pt = topos_tensor_from(TOPOS_I32, 1, ts, pos, err);
  /* The cache inputs' defaults: a broadcast zero, no memory of its own
   * (every run feeds the caller's cache). */
  topos_tensor *zero = topos_tensor_scalar(c->dtype, 0.0, err);
  topos_tensor *zc =
      zero && past > 0 ? topos_tensor_broadcast(zero, 3, cs, err) : NULL;
  /* One dtype for the whole network, the weights': with bf16 every
   * activation, the logits and the cache are bf16 too. */
  topos_tape *tape =
      x0 && pt && zero && (past == 0 || zc) ? topos_tape_new(c->dtype) : NULL;
  if (tape) {
    for (int i = 0; i < w->n; i++)
      p[i] = embed
                 ? topos_name(tape, topos_parameter(tape, w->t[i]), w->names[i])
                 : ex_kv_parameter(tape, w->t[i], w->names[i]);
    n->x = topos_name(tape, topos_input(tape, x0), "x");
    int64_t rows[2] = {T, D}, btd[3] = {1, T, D};
    topos_value tok =
        topos_reshape(tape, topos_embedding(tape, p[0], n->x), 2, rows);
    topos_value wpe = topos_embedding(tape, p[1], topos_constant(tape, pt));
    topos_value h = topos_add(tape, tok, wpe);
    topos_attention_opts ao = {.heads = c->heads, .causal = true, .past = past};
    for (int l = 0; l < L; l++) {
      const topos_value *b = p + 2 + l * EX_GPT2_PER_LAYER;
      topos_value kc, vc;
      ex_kv_cache_inputs(n, tape, l, zc, &kc, &vc);
      topos_value a = topos_layer_norm(tape, h, b[0], b[1], 1e-5);
      topos_value att = topos_self_attention(
          tape, topos_reshape(tape, a, 3, btd), b[2], b[3], b[4], b[5], &ao, kc,
          vc, &n->k_out[l], &n->v_out[l]);
      ex_kv_name_outputs(n, tape, l);
      h = topos_add(tape, h, topos_reshape(tape, att, 2, rows));
      topos_value f = topos_layer_norm(tape, h, b[6], b[7], 1e-5);
      f = topos_gelu(tape, topos_linear(tape, f, b[8], b[9]));
      h = topos_add(tape, h, topos_linear(tape, f, b[10], b[11]));
    }
    const topos_value *tail = p + 2 + L * EX_GPT2_PER_LAYER;
    h = topos_layer_norm(tape, h, tail[0], tail[1], 1e-5);
    /* The head is the token embedding, transposed (tied). */
    n->logits = topos_name(
        tape, topos_matmul(tape, h, topos_transpose(tape, p[0])), "logits");
    n->net = topos_tape_seal(tape, err);
  }
  topos_tensor_release(x0);
  topos_tensor_release(pt);
  topos_tensor_release(zero);
  topos_tensor_release(zc);
  free(p);
  free(pos);
  if (!n->net) {
    ex_kv_net_free(n);
    return -1;
  }
  return 0;
}

int ex_gpt2_record(ex_kv_net *n, const ex_gpt2_weights *w, int64_t T,
                   int64_t past, topos_error *err) {
  return record(n, w, T, past, false, err);
}

int ex_gpt2_record_embedded(ex_kv_net *n, const ex_gpt2_weights *w, int64_t T,
                            int64_t past, topos_error *err) {
  return record(n, w, T, past, true, err);
}

/* -------------------------------------------------------------- running */
