/*
 * llama.c - Llama text generation with topos: a prefill network over the
 * prompt, then one decode network per position whose KV cache (the KV
 * heads only) is the caller's state (examples/common/llama.h).
 *
 * Usage:
 *   llama [--weights model.safetensors] [--config NAME] [--prompt TEXT]
 *         [--prompt-ids ID,ID,...] [--tokens N] [--temperature T]
 *         [--top-k K] [--seed S] [--dtype f32|bf16] [--data DIR]
 *         [--backend NAME] [--threads N] [--fast]
 *
 * No Llama tokenizer ships here (SentencePiece or tiktoken files are not
 * in data/).  When the config's vocabulary is GPT-2's (50257, the default
 * "tiny" config) the prompt is tokenized, and the output detokenized,
 * with GPT-2's byte-level BPE (data/gpt2), and the example says so; with
 * any other vocabulary the prompt is given as ids (--prompt-ids; token 1,
 * Llama's <s>, when not) and the output is printed as ids.
 *
 * Without --weights the model is initialised with Hugging Face's scheme
 * from the seed (no weights can be downloaded here), and the example says
 * so: the text is then noise, but every step is the real computation.
 * --dtype bf16 keeps the weights, the activations and the cache in bf16
 * (an F32 file is rounded once on loading, a BF16 one - Hugging Face's
 * usual - loads as it is; each op computes in f32 and rounds once,
 * docs/numerics.md); the default f32 widens a BF16 file exactly.
 * --temperature 0 (the default) is greedy; otherwise the next token is
 * drawn from softmax(logits / T), over the K largest with --top-k K.
 * Prints the prompt, the tokens as they come, then the speed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "bpe.h"
#include "ex.h"
#include "llama.h"

enum { GPT2_VOCAB = 50257 };

static const char usage[] =
    "usage: llama [--weights FILE] [--config NAME] [--prompt TEXT]\n"
    "             [--prompt-ids ID,ID,...] [--tokens N] [--temperature T]\n"
    "             [--top-k K] [--seed S] [--dtype f32|bf16]\n"
    "  configs: tiny (the default), smollm-135m, tinyllama-1.1b\n";

typedef struct opts {
  ex_gen_flags gen;
  const char *prompt_ids, *config_name;
  ex_llama_config config;
} opts;

static int bad_value(const char *flag, const char *v) {
  fprintf(stderr, "llama: %s: '%s' is not a valid value\n%s", flag, v, usage);
  return -1;
}

static int parse(int argc, char **argv, ex_args *a, opts *o) {
  *o = (opts){.gen = {.prompt = "Hello", .tokens = 20, .seed = 1},
              .config_name = "tiny",
              .config = EX_LLAMA_TINY};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(f, "--help")) {
      printf("%s%s", usage, ex_args_usage);
      exit(0);
    } else if (v && !strcmp(f, "--prompt-ids")) {
      o->prompt_ids = argv[++i];
    } else if (v && !strcmp(f, "--config")) {
      i++;
      if (ex_llama_config_named(v, &o->config) != 0) return bad_value(f, v);
      o->config_name = v;
    } else {
      int r = ex_gen_flag(&o->gen, a, argc, argv, &i);
      if (r == 0) r = ex_arg(a, argc, argv, &i);
      if (r < 0) return -1;
      if (r == 0) {
        fprintf(stderr, "llama: unknown flag '%s'\n%s", f, usage);
        return -1;
      }
    }
  }
  if (ex_args_done(a) != 0) return -1;
  if (a->save_spec != NULL) {
    /* The decoder runs several networks (prompt, steps); none is "the"
     * spec.  --save-spec is the training examples'. */
    fprintf(stderr, "%s: --save-spec applies to the training examples\n",
            a->prog);
    return -1;
  }
  o->config.dtype = o->gen.dtype;
  return 0;
}

/* Prints ids as they come: their text through GPT-2's BPE when there is
 * one (a token may end mid-character: the bytes go out as they are), else
 * the ids themselves. */
static void print_tokens(const ex_bpe *bpe, const int32_t *ids, size_t n) {
  if (!bpe) {
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
  } else {
    char *text = NULL;
    size_t len = 0;
    topos_error err = {0};
    if (ex_bpe_decode(bpe, ids, n, &text, &len, &err) == 0)
      fwrite(text, 1, len, stdout);
    free(text);
  }
  fflush(stdout);
}

/* The weights: loaded, or initialised from the seed (and said so). */
static int weights(const ex_args *a, const opts *o, ex_llama_weights *w) {
  topos_error err = {0};
  double t0 = ex_now_s();
  if (o->gen.weights) {
    if (ex_llama_load(w, &o->config, o->gen.weights, &err) != 0)
      return ex_fail(a, "weights", &err);
    fprintf(stderr, "llama: weights from %s (%.1f s)\n", o->gen.weights,
            ex_now_s() - t0);
    return 0;
  }
  if (ex_llama_init(w, &o->config, o->gen.seed, &err) != 0)
    return ex_fail(a, "init", &err);
  fprintf(stderr,
          "llama: no --weights: random weights from seed %llu with Hugging "
          "Face's initialisation (%.1f s); the text will be noise\n",
          (unsigned long long)o->gen.seed, ex_now_s() - t0);
  return 0;
}

/* The prompt's ids: --prompt-ids, GPT-2's BPE on --prompt, or <s>. */
static int prompt_ids(const ex_args *a, const opts *o, const ex_bpe *bpe,
                      int32_t **ids, size_t *n) {
  topos_error err = {0};
  if (o->prompt_ids) {
    if (ex_parse_ids(o->prompt_ids, o->config.vocab, ids, n) != 0 || *n == 0) {
      fprintf(stderr,
              "llama: --prompt-ids: '%s' is not a list of ids below %d\n",
              o->prompt_ids, o->config.vocab);
      return 2;
    }
    return 0;
  }
  if (!bpe) {
    fprintf(stderr,
            "llama: the vocabulary (%d) is not GPT-2's and no Llama "
            "tokenizer ships here: the prompt is token 1 (<s>); give "
            "--prompt-ids\n",
            o->config.vocab);
    *ids = malloc(sizeof **ids);
    if (!*ids) return 1;
    (*ids)[0] = 1;
    *n = 1;
    return 0;
  }
  fprintf(stderr,
          "llama: no Llama tokenizer ships here: the prompt is tokenized "
          "with GPT-2's BPE (the vocabulary is GPT-2's 50257)\n");
  if (ex_bpe_encode(bpe, o->gen.prompt, strlen(o->gen.prompt), ids, n, &err) !=
      0)
    return ex_fail(a, "prompt", &err);
  return 0;
}

static void show(const int32_t *ids, size_t n, void *bpe) {
  print_tokens(bpe, ids, n);
}

static int record(ex_kv_net *n, const void *w, int64_t T, int64_t past,
                  topos_error *err) {
  return ex_llama_record(n, w, T, past, err);
}

static int generate(const ex_args *a, const opts *o, const ex_bpe *bpe) {
  const ex_llama_config *c = &o->config;
  fprintf(stderr,
          "llama: config %s: vocab %d, width %d, %d heads over %d kv heads "
          "of %d, ffn %d, %d layers, context %d%s; dtype %s\n",
          o->config_name, c->vocab, c->width, c->heads, c->kv_heads,
          ex_llama_head_dim(c), c->ffn, c->layers, c->context,
          c->tie ? ", tied head" : "", topos_dtype_name(c->dtype));
  ex_llama_weights w;
  if (weights(a, o, &w) != 0) return 1;
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = prompt_ids(a, o, bpe, &ids, &n);
  if (rc != 0) {
    free(ids);
    ex_llama_weights_free(&w);
    return rc;
  }
  ex_kv_generation g = {.prog = "llama",
                        .server = a->server,
                        .exec = &a->exec,
                        .record = record,
                        .model = &w,
                        .params = w.params,
                        .layers = c->layers,
                        .vocab = c->vocab,
                        .context = c->context,
                        .tokens = o->gen.tokens,
                        .temperature = o->gen.temperature,
                        .top_k = o->gen.top_k,
                        .seed = o->gen.seed,
                        .print = show,
                        .print_ctx = (void *)bpe};
  rc = ex_kv_generate(&g, &ids, &n);
  free(ids);
  ex_llama_weights_free(&w);
  return rc;
}

int main(int argc, char **argv) {
  ex_args a = {.prog = "llama"};
  opts o;
  if (parse(argc, argv, &a, &o) != 0) return 2;
  topos_backends_register_defaults();
  ex_bpe *bpe = NULL;
  if (o.config.vocab == GPT2_VOCAB) {
    char dir[4096];
    if (ex_find_data(a.data, "data/gpt2", dir, sizeof dir) != 0) {
      fprintf(stderr, "llama: no GPT-2 tokenizer files at %s (--data DIR)\n",
              dir);
      return 1;
    }
    topos_error err = {0};
    bpe = ex_bpe_load(dir, &err);
    if (!bpe) return ex_fail(&a, "tokenizer", &err);
  }
  int rc = generate(&a, &o, bpe);
  ex_bpe_free(bpe);
  return rc;
}
