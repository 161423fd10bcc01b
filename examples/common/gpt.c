/*
 * gpt.c - the small GPT (gpt.h).
 */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { NPER = 12 }; /* parameters per block */

typedef struct init {
  char name[40];
  int rank;
  int64_t shape[2];
  int kind; /* 0 normal(0, 0.02), 1 zeros, 2 ones, 3 residual projection */
} init;

/* GPT-2's initialisation: weights normal(0, 0.02), the two projections
 * that write into the residual stream scaled by 1/sqrt(2·layers), biases
 * zero, LayerNorm gains one. */
static topos_tensor *make_param(const init *p, int layers, uint64_t seed,
                                topos_error *err) {
  switch (p->kind) {
    case 0:
      return topos_init_normal(TOPOS_F32, p->rank, p->shape, 0.0, 0.02, seed,
                               err);
    case 3:
      return topos_init_normal(TOPOS_F32, p->rank, p->shape, 0.0,
                               0.02 / sqrt(2.0 * layers), seed, err);
    case 1:
      return topos_tensor_zeros(TOPOS_F32, p->rank, p->shape, err);
    default:
      return topos_tensor_ones(TOPOS_F32, p->rank, p->shape, err);
  }
}

/* The parameters in slot order, with Hugging Face GPT-2's names. */
static int param_list(const ex_gpt_config *c, init *out) {
  const int64_t V = c->vocab, T = c->context, D = c->width, FF = 4 * D;
  int n = 0;
  out[n++] = (init){"wte", 2, {V, D}, 0};
  out[n++] = (init){"wpe", 2, {T, D}, 0};
  static const char *const suffix[NPER] = {
      "ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
      "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
      "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const int rank[NPER] = {1, 1, 2, 1, 2, 1, 1, 1, 2, 1, 2, 1};
  const int64_t shape[NPER][2] = {{D}, {D}, {D, 3 * D}, {3 * D}, {D, D},  {D},
                                  {D}, {D}, {D, FF},    {FF},    {FF, D}, {D}};
  static const int kind[NPER] = {2, 1, 0, 1, 3, 1, 2, 1, 0, 1, 3, 1};
  for (int l = 0; l < c->layers; l++)
    for (int k = 0; k < NPER; k++) {
      init *p = &out[n++];
      snprintf(p->name, sizeof p->name, "h.%d.%s", l, suffix[k]);
      p->rank = rank[k];
      p->shape[0] = shape[k][0];
      p->shape[1] = shape[k][1];
      p->kind = kind[k];
    }
  out[n++] = (init){"ln_f.weight", 1, {D}, 2};
  out[n++] = (init){"ln_f.bias", 1, {D}, 1};
  out[n++] = (init){"lm_head.weight", 2, {D, V}, 0};
  return n;
}

int ex_gpt_build(ex_gpt *m, const ex_gpt_config *c, int64_t batch,
                 bool with_loss, topos_error *err) {
  m->net = NULL;
  if (c->vocab < 1 || c->context < 1 || c->width < 1 || c->heads < 1 ||
      c->layers < 0 || c->layers > 64 || c->width % c->heads != 0 ||
      batch < 1) {
    err->code = TOPOS_ERR_ARGUMENT;
    snprintf(err->message, sizeof err->message,
             "gpt: a config of vocab %d, context %d, width %d, %d heads, %d "
             "layers and batch %lld cannot be built",
             c->vocab, c->context, c->width, c->heads, c->layers,
             (long long)batch);
    return -1;
  }
  const int64_t T = c->context, D = c->width;
  int nparam = 2 + c->layers * NPER + 3;
  init *plist = calloc((size_t)nparam, sizeof *plist);
  topos_tensor **t = calloc((size_t)nparam, sizeof *t);
  topos_value *p = calloc((size_t)nparam, sizeof *p);
  int32_t *pos = calloc((size_t)T, sizeof *pos);
  bool ok = plist && t && p && pos;
  if (ok) param_list(c, plist);
  for (int i = 0; ok && i < nparam; i++) {
    t[i] = make_param(&plist[i], c->layers, 1000 + (uint64_t)i, err);
    ok = t[i] != NULL;
  }
  int64_t seq[2] = {batch, T}, flat[1] = {batch * T}, tshape[1] = {T};
  for (int64_t i = 0; ok && i < T; i++) pos[i] = (int32_t)i;
  topos_tensor *x0 = ok ? topos_tensor_zeros(TOPOS_I32, 2, seq, err) : NULL;
  topos_tensor *y0 = ok ? topos_tensor_zeros(TOPOS_I32, 1, flat, err) : NULL;
  topos_tensor *pt =
      ok ? topos_tensor_from(TOPOS_I32, 1, tshape, pos, err) : NULL;
  topos_tape *tape = x0 && y0 && pt ? topos_tape_new(TOPOS_F32) : NULL;
  if (tape != NULL) {
    for (int i = 0; i < nparam; i++)
      p[i] = topos_name(tape, topos_parameter(tape, t[i]), plist[i].name);
    m->x = topos_name(tape, topos_input(tape, x0), "x");
    /* Token plus position embeddings, as rows [B·T, D]; the linear layers
     * work on rows, attention on [B, T, D]. */
    int64_t rows[2] = {batch * T, D}, btd[3] = {batch, T, D},
            one_td[3] = {1, T, D};
    topos_value tok =
        topos_reshape(tape, topos_embedding(tape, p[0], m->x), 2, rows);
    topos_value wpe = topos_embedding(tape, p[1], topos_constant(tape, pt));
    topos_value posb = topos_reshape(
        tape,
        topos_broadcast(tape, topos_reshape(tape, wpe, 3, one_td), 3, btd), 2,
        rows);
    topos_value h = topos_add(tape, tok, posb);
    topos_attention_opts ao = {.heads = c->heads, .causal = true};
    for (int l = 0; l < c->layers; l++) {
      const topos_value *b = p + 2 + l * NPER;
      topos_value a = topos_layer_norm(tape, h, b[0], b[1], 1e-5);
      topos_value att = topos_self_attention(
          tape, topos_reshape(tape, a, 3, btd), b[2], b[3], b[4], b[5], &ao,
          TOPOS_NONE, TOPOS_NONE, NULL, NULL);
      h = topos_add(tape, h, topos_reshape(tape, att, 2, rows));
      topos_value f = topos_layer_norm(tape, h, b[6], b[7], 1e-5);
      f = topos_gelu(tape, topos_linear(tape, f, b[8], b[9]));
      h = topos_add(tape, h, topos_linear(tape, f, b[10], b[11]));
    }
    const topos_value *tail = p + 2 + c->layers * NPER;
    h = topos_layer_norm(tape, h, tail[0], tail[1], 1e-5);
    m->logits = topos_name(tape, topos_matmul(tape, h, tail[2]), "logits");
    if (with_loss) {
      m->y = topos_name(tape, topos_input(tape, y0), "y");
      m->loss = topos_name(
          tape,
          topos_cross_entropy_ignore(tape, m->logits, m->y, EX_GPT_IGNORE),
          "loss");
    }
    m->net = topos_tape_seal(tape, err);
  }
  for (int i = 0; t && i < nparam; i++) topos_tensor_release(t[i]);
  topos_tensor_release(x0);
  topos_tensor_release(y0);
  topos_tensor_release(pt);
  free(plist);
  free(t);
  free(p);
  free(pos);
  return m->net != NULL ? 0 : -1;
}
