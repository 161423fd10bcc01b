/*
 * llama.h - Llama from the public op surface, for inference with a
 * caller-owned KV cache (examples/llama and its tests).  The same shape
 * as gpt2.h: weights with Hugging Face's names, a network recorded per
 * (tokens, cached positions), and the cache the caller's state.
 *
 * The model is Hugging Face's LlamaForCausalLM: a token embedding, then
 * pre-RMSNorm blocks of causal self-attention with rotary position
 * embeddings (rotate-half, base rope_theta) and grouped-query attention
 * (H query heads share KV key/value heads, each kv head serving H/KV
 * consecutive query heads), and a SwiGLU MLP down(silu(gate(x)) * up(x));
 * a final RMSNorm and the output head lm_head (or, tied, the embedding).
 * No biases.  Linear weights are [out, in] as nn.Linear keeps them:
 * y = x·Wᵀ.
 *
 * A network is recorded for T tokens at positions past .. past+T-1 of one
 * sequence: its inputs are the tokens and, per layer, the keys (already
 * rotated) and values of the `past` earlier positions; its roots are the
 * logits and, per layer, the keys and values of all past+T positions.
 * The cache holds the KV heads only ([1, len, KV·Dh]); they are repeated
 * for the query heads inside the network.  Decoding position P with the
 * cache gives the bits of the full forward's row P: the rotation of a
 * position depends on that position alone, attention over [cache ‖ new]
 * is the last rows of full causal attention, and every other op works row
 * by row.
 *
 * The config's dtype is the weights' storage and the network's tape
 * dtype, f32 or bf16, as in gpt2.h: a bf16 network computes every op in
 * f32 from exactly widened operands and rounds once to bf16
 * (docs/numerics.md); its cache and logits are bf16.
 */
#ifndef TOPOS_EX_LLAMA_H
#define TOPOS_EX_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "decoder.h"
#include "topos.h"

typedef struct ex_llama_config {
  int vocab, context;
  int width;    /* D: hidden_size */
  int heads;    /* H: num_attention_heads */
  int kv_heads; /* KV: num_key_value_heads, dividing H */
  int head_dim; /* Dh, even; 0: D / H */
  int ffn;      /* F: intermediate_size */
  int layers;
  double rms_eps;    /* rms_norm_eps (Hugging Face's default 1e-6) */
  double rope_theta; /* RoPE base (default 10000) */
  bool tie;          /* lm_head is embed_tokens (tie_word_embeddings) */
  /* The weights' and the networks' dtype: TOPOS_F32 (0, so a config
   * that leaves it out is f32) or TOPOS_BF16. */
  topos_dtype dtype;
} ex_llama_config;

/* The tests' and the quick demo's: GPT-2's vocabulary (so its BPE can
 * tokenize a prompt), a small body with grouped-query attention. */
#define EX_LLAMA_TINY \
  ((ex_llama_config){50257, 256, 64, 4, 2, 16, 172, 2, 1e-6, 10000.0, false})
/* HuggingFaceTB/SmolLM-135M's shape: 135M parameters, tied head. */
#define EX_LLAMA_SMOLLM_135M \
  ((ex_llama_config){49152, 2048, 576, 9, 3, 64, 1536, 30, 1e-5, 10000.0, true})
/* TinyLlama-1.1B's shape (4.4 GB of f32 weights). */
#define EX_LLAMA_TINYLLAMA_1B                                               \
  ((ex_llama_config){32000, 2048, 2048, 32, 4, 64, 5632, 22, 1e-5, 10000.0, \
                     false})

enum { EX_LLAMA_PER_LAYER = 9 };

/* A named config ("tiny", "smollm-135m", "tinyllama-1.1b"): 0, or -1 for
 * an unknown name.  ex_llama_config_names lists them for messages. */
int ex_llama_config_named(const char *name, ex_llama_config *out);
extern const char ex_llama_config_names[];

/* Dh: head_dim, or D / H when it is 0. */
int ex_llama_head_dim(const ex_llama_config *c);

/* The weights, in the config's dtype, with Hugging Face's names:
 * model.embed_tokens.weight [V, D]; per layer model.layers.L.
 * input_layernorm.weight [D], self_attn.q_proj.weight [H·Dh, D], .k_proj.weight
 * [KV·Dh, D], .v_proj.weight [KV·Dh, D], .o_proj.weight [D, H·Dh],
 * post_attention_layernorm.weight [D], mlp.gate_proj.weight [F, D],
 * .up_proj.weight [F, D], .down_proj.weight [D, F]; model.norm.weight
 * [D]; and lm_head.weight [V, D] unless tied. */
typedef struct ex_llama_weights {
  ex_llama_config c;
  int n;
  char (*names)[64];
  topos_tensor **t;
  topos_params *params; /* the tensors as a parameter set (retained) */
} ex_llama_weights;

/* Checks a config: positive sizes, KV dividing H, an even head size (D / H
 * whole when head_dim is 0), at most 128 layers, eps and theta positive
 * and finite, dtype f32 or bf16.  0, or -1 with err. */
int ex_llama_check(const ex_llama_config *c, topos_error *err);
/* Hugging Face's initialisation from a seed: every projection and the
 * embedding normal(0, 0.02) (initializer_range), the norms' gains 1.
 * Drawn in f32; bf16 weights are those rounded once to nearest even. */
int ex_llama_init(ex_llama_weights *w, const ex_llama_config *c, uint64_t seed,
                  topos_error *err);
/* Loads a Hugging Face LlamaForCausalLM model.safetensors.  Every weight
 * must be there with its shape, F32 or BF16 (other entries, and
 * lm_head.weight when tied, are ignored), and is converted to the
 * config's dtype (BF16 widens to f32 exactly, F32 rounds once to bf16).
 * 0, or -1 with err naming the first fault. */
int ex_llama_load(ex_llama_weights *w, const ex_llama_config *c,
                  const char *path, topos_error *err);
/* Writes the weights as safetensors with their names, in their dtype. */
int ex_llama_save(const ex_llama_weights *w, const char *path,
                  topos_error *err);
void ex_llama_weights_free(ex_llama_weights *w);

/* Records Llama's step network (decoder.h: its parameters recorded as
 * zeros, run on w->params; the cache is KV heads wide, the keys stored
 * after rotation) on a tape of the weights' dtype for T >= 1 tokens after
 * `past` cached positions (past + T <= context).  0, or -1 with err. */
int ex_llama_record(ex_kv_net *n, const ex_llama_weights *w, int64_t T,
                    int64_t past, topos_error *err);

#endif /* TOPOS_EX_LLAMA_H */
