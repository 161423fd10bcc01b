/*
 * gpt.h - the small GPT of makemore (examples/makemore/makemore_transformer.c,
 * and bench/train's transformer step): pre-LayerNorm blocks of causal
 * multi-head self-attention and a GELU MLP, learned token and position
 * embeddings and a linear head, with GPT-2's initialisation and Hugging
 * Face GPT-2 parameter names.  One builder, so the example and the bench
 * train the same network.
 */
#ifndef TOPOS_EX_GPT_H
#define TOPOS_EX_GPT_H

#include <stdbool.h>
#include <stdint.h>

#include "topos.h"

typedef struct ex_gpt_config {
  int vocab, context, width, heads, layers; /* MLP hidden: 4 x width */
} ex_gpt_config;

/* makemore's: 27 characters, context 16, width 64, 4 heads, 4 layers. */
#define EX_GPT_MAKEMORE ((ex_gpt_config){27, 16, 64, 4, 4})
enum { EX_GPT_IGNORE = -1 }; /* targets the loss skips (padding) */

typedef struct ex_gpt {
  topos_network *net;
  topos_value x;      /* i32 [batch, context] token indices */
  topos_value y;      /* i32 [batch·context] next tokens (with a loss) */
  topos_value logits; /* [batch·context, vocab] */
  topos_value loss;   /* mean cross entropy over targets not EX_GPT_IGNORE */
} ex_gpt;

/* Records the network for `batch` sequences, with the loss when asked.
 * Every network built from one config has the same parameters (same
 * seeds), whatever the batch.  0, or -1 with err. */
int ex_gpt_build(ex_gpt *m, const ex_gpt_config *c, int64_t batch,
                 bool with_loss, topos_error *err);

#endif /* TOPOS_EX_GPT_H */
