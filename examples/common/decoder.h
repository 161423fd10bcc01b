/*
 * decoder.h - what the decoder examples share (GPT-2: gpt2.h, Llama:
 * llama.h): the step network's handles, the caller-owned KV cache, the
 * step runner (in-process and on a daemon), and token sampling.
 *
 * A step network runs T tokens at positions past .. past+T-1: its inputs
 * are the tokens and, per layer, the keys and values of the `past`
 * earlier positions; its roots are the logits and, per layer, the keys
 * and values of all past+T positions.  Its parameters are recorded as
 * zeros (a splat in the encoding: a spec of kilobytes, whatever the
 * model's size) and the weights go with each run: in-process as a
 * parameter set, remotely as one blob uploaded once.  The cache is the
 * caller's state, passed in and handed back by every run; networks never
 * change.
 *
 * A network has the dtype of its weights (one dtype per tape): with bf16
 * weights its logits and its keys and values are bf16 too, so the cache
 * is bf16, and the logits are widened exactly to float for sampling.
 */
#ifndef TOPOS_EX_DECODER_H
#define TOPOS_EX_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "topos.h"

typedef struct topos_client topos_client;

typedef struct ex_kv_net {
  topos_network *net;
  const topos_params *params; /* the weights (borrowed) */
  int nparams;
  int layers;
  int64_t T, past;
  topos_value x;              /* i32 [1, T] tokens */
  topos_value logits;         /* [T, vocab] */
  topos_value *k_in, *v_in;   /* per layer [1, past, width] (past > 0) */
  topos_value *k_out, *v_out; /* per layer [1, past + T, width] */
} ex_kv_net;

/* Starts n for T tokens after `past` of `layers` layers run on params;
 * 0, or -1 with err. */
int ex_kv_net_begin(ex_kv_net *n, int layers, int64_t T, int64_t past,
                    const topos_params *params, int nparams, topos_error *err);
void ex_kv_net_free(ex_kv_net *n);

/* t converted to dtype (t consumed: released, even on failure; NULL
 * stays NULL): weights on loading and initialisation, f32 <-> bf16, and
 * bf16 logits widened for sampling. */
topos_tensor *ex_weight_as(topos_tensor *t, topos_dtype dtype,
                           topos_error *err);

/* A parameter recorded as zeros of like's shape and dtype, named. */
topos_value ex_kv_parameter(topos_tape *tape, const topos_tensor *like,
                            const char *name);
/* Layer l's cache inputs (past > 0; zc their [1, past, width] default),
 * named k_cache.l and v_cache.l, into *k and *v (TOPOS_NONE without a
 * cache). */
void ex_kv_cache_inputs(ex_kv_net *n, topos_tape *tape, int l,
                        const topos_tensor *zc, topos_value *k, topos_value *v);
/* Names layer l's k_out/v_out (k_all.l, v_all.l). */
void ex_kv_name_outputs(ex_kv_net *n, topos_tape *tape, int l);

/* The caller's cache: per layer the keys and values of `len` positions
 * (tensors retained; NULL when len is 0). */
typedef struct ex_kv_cache {
  int layers;
  int64_t len;
  topos_tensor **k, **v;
} ex_kv_cache;

int ex_kv_cache_init(ex_kv_cache *c, int layers, topos_error *err);
void ex_kv_cache_free(ex_kv_cache *c);

/* Runs n (recorded with past == cache->len) on its T tokens: writes the
 * last row of the logits to logits_last (vocab floats, widened exactly
 * from a bf16 network's logits; NULL: skipped),
 * the whole logits to *all (retained; NULL: not asked), and replaces the
 * cache's tensors with the run's keys and values.  0, or -1 with err
 * (the cache unchanged). */
int ex_kv_run(const ex_kv_net *n, const int32_t *tokens, ex_kv_cache *cache,
              const topos_exec *ctx, float *logits_last, topos_tensor **all,
              topos_error *err);
/* The same on a daemon: n is recorded there (a small spec), the weights
 * are the blob `weights_blob` (topos_client_put_blob of n->params), the
 * tokens and the cache travel as feeds and the new cache comes back as
 * roots.  Bits equal ex_kv_run's. */
int ex_kv_run_remote(const ex_kv_net *n, topos_client *c,
                     const char *weights_blob, const int32_t *tokens,
                     ex_kv_cache *cache, const topos_exec *ctx,
                     float *logits_last, topos_tensor **all, topos_error *err);

/* Token ids separated by commas or spaces, each in [0, vocab) (*ids new,
 * *n their count); 0, or -1 when the text is not such a list. */
int ex_parse_ids(const char *s, int vocab, int32_t **ids, size_t *n);
/* The next token from logits (modified): greedy when temperature is 0,
 * else drawn from softmax(logits / temperature), over the top_k largest
 * when top_k > 0. */
int32_t ex_next_token(float *logits, int vocab, double temperature,
                      int64_t top_k, uint64_t *rng);

/* The generation flags both decoder examples take. */
typedef struct ex_gen_flags {
  const char *weights; /* --weights FILE (safetensors) */
  const char *prompt;  /* --prompt TEXT */
  int64_t tokens;      /* --tokens N */
  double temperature;  /* --temperature T (0: greedy) */
  int64_t top_k;       /* --top-k K (0: all) */
  uint64_t seed;       /* --seed S */
  topos_dtype dtype;   /* --dtype f32|bf16: the weights' and the network's */
} ex_gen_flags;
struct ex_args;
/* Reads argv[*i] when it is one of them (advancing *i past its value):
 * 1, 0 when it is not, -1 when its value is malformed (printed). */
int ex_gen_flag(ex_gen_flags *g, const struct ex_args *a, int argc, char **argv,
                int *i);

/* Generation: records a step network with record(n, model, T, past,
 * err) and runs it, the prompt in one step and then one token per step,
 * in-process or (server not NULL) on that daemon, where the weights go
 * once as a blob.  print(ids, n, ctx) shows tokens as they come.  The
 * prompt is (*ids, *n), and the new tokens are appended to it.  Prints
 * the speed on stderr under prog's name.  0, or 1 after printing why. */
typedef int (*ex_kv_record_fn)(ex_kv_net *n, const void *model, int64_t T,
                               int64_t past, topos_error *err);
typedef struct ex_kv_generation {
  const char *prog;
  const char *server; /* NULL: in-process */
  const topos_exec *exec;
  ex_kv_record_fn record;
  const void *model;
  const topos_params *params; /* the weights, in slot order */
  int layers, vocab, context;
  int64_t tokens;
  double temperature;
  int64_t top_k;
  uint64_t seed;
  void (*print)(const int32_t *ids, size_t n, void *ctx);
  void *print_ctx;
} ex_kv_generation;
int ex_kv_generate(const ex_kv_generation *g, int32_t **ids, size_t *n);

#endif /* TOPOS_EX_DECODER_H */
