/*
 * gpt2.h - GPT-2 from the public op surface, for inference with a
 * caller-owned KV cache (examples/gpt2, its tests and the bench).
 *
 * The model is Hugging Face's GPT2LMHeadModel: token and position
 * embeddings, pre-LayerNorm blocks of causal multi-head self-attention
 * (c_attn holding q, k, v as column blocks) and a GELU-tanh MLP four
 * times as wide, a final LayerNorm, and the output head tied to the token
 * embedding.  Weights carry Hugging Face's names and layouts (Conv1D:
 * [in, out]), so a real model.safetensors loads.
 *
 * A network is recorded for T tokens at positions past .. past+T-1 of one
 * sequence: its inputs are the tokens and, per layer, the keys and values
 * of the `past` earlier positions; its roots are the logits and, per
 * layer, the keys and values of all past+T positions.  The cache is the
 * caller's state, passed in and handed back by each run; networks never
 * change.  Decoding position P with the cache gives the bits of the full
 * forward's row P (the attention over [cache ‖ new] is the last rows of
 * full causal attention, and every other op works row by row).
 *
 * The config's dtype is the weights' storage and the network's tape
 * dtype: f32 (the default), or bf16, where the whole network is recorded
 * on a bf16 tape - weights, activations, logits and the caller's cache
 * are bf16, and every op converts its operands to f32 exactly, computes
 * in f32 (accumulating sums and products in f32 across the whole chain)
 * and rounds its result once to bf16 (docs/numerics.md).
 */
#ifndef TOPOS_EX_GPT2_H
#define TOPOS_EX_GPT2_H

#include <stdbool.h>
#include <stdint.h>

#include "decoder.h"
#include "topos.h"

typedef struct ex_gpt2_config {
  int vocab, context, width, heads, layers; /* MLP hidden: 4 x width */
  /* The weights' and the networks' dtype: TOPOS_F32 (0, so a config
   * that leaves it out is f32) or TOPOS_BF16. */
  topos_dtype dtype;
} ex_gpt2_config;

#define EX_GPT2_124M ((ex_gpt2_config){50257, 1024, 768, 12, 12})
/* The tests' and the quick demo's: GPT-2's vocabulary, a small body. */
#define EX_GPT2_TINY ((ex_gpt2_config){50257, 256, 64, 4, 2})

enum { EX_GPT2_PER_LAYER = 12 };

/* The weights, in the config's dtype, in Hugging Face's order and with its
 * names: wte.weight, wpe.weight, then per layer h.L.ln_1.weight, .ln_1.bias,
 * .attn.c_attn.weight, .attn.c_attn.bias, .attn.c_proj.weight,
 * .attn.c_proj.bias, .ln_2.weight, .ln_2.bias, .mlp.c_fc.weight,
 * .mlp.c_fc.bias, .mlp.c_proj.weight, .mlp.c_proj.bias, and ln_f.weight,
 * ln_f.bias. */
typedef struct ex_gpt2_weights {
  ex_gpt2_config c;
  int n;
  char (*names)[48];
  topos_tensor **t;
  topos_params *params; /* the tensors as a parameter set (retained) */
} ex_gpt2_weights;

/* Checks a config (positive sizes, heads dividing the width, at most 64
 * layers, dtype f32 or bf16); 0, or -1 with err. */
int ex_gpt2_check(const ex_gpt2_config *c, topos_error *err);
/* GPT-2's initialisation from a seed: normal(0, 0.02), the residual
 * projections scaled by 1/sqrt(2·layers), biases 0, LayerNorm gains 1.
 * Drawn in f32; bf16 weights are those rounded once to nearest even, so
 * one seed gives the f32 model and its bf16 rounding. */
int ex_gpt2_init(ex_gpt2_weights *w, const ex_gpt2_config *c, uint64_t seed,
                 topos_error *err);
/* Loads a Hugging Face GPT-2 model.safetensors (names with or without
 * the "transformer." prefix; the attention-mask buffers and lm_head, tied
 * to wte, are ignored).  Every weight must be there with its shape, F32
 * or BF16, and is converted to the config's dtype (BF16 widens to f32
 * exactly; F32 rounds once to bf16, nearest even).  0, or -1 with err
 * naming the first fault. */
int ex_gpt2_load(ex_gpt2_weights *w, const ex_gpt2_config *c, const char *path,
                 topos_error *err);
/* Writes the weights as safetensors with their names (F32 or BF16, the
 * weights' dtype). */
int ex_gpt2_save(const ex_gpt2_weights *w, const char *path, topos_error *err);
void ex_gpt2_weights_free(ex_gpt2_weights *w);

/* Records GPT-2's step network (decoder.h) on a tape of the weights'
 * dtype for T >= 1 tokens after `past` cached positions (past + T <=
 * context); it runs on w->params.  0, or -1 with err. */
int ex_gpt2_record(ex_kv_net *n, const ex_gpt2_weights *w, int64_t T,
                   int64_t past, topos_error *err);
/* The same with the weights as the parameters' initials: a network that
 * runs, lowers and emits on its own (its encoding carries the weights). */
int ex_gpt2_record_embedded(ex_kv_net *n, const ex_gpt2_weights *w, int64_t T,
                            int64_t past, topos_error *err);

#endif /* TOPOS_EX_GPT2_H */
