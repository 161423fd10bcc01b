/*
 * gpt2.c - GPT-2 text generation with topos: the byte-level BPE tokenizer,
 * a prefill network over the prompt, then one decode network per
 * position whose KV cache is the caller's state (examples/common/gpt2.h).
 *
 * Usage:
 *   gpt2 [--weights model.safetensors] [--config 124m|tiny] [--prompt TEXT]
 *        [--tokens N] [--temperature T] [--top-k K] [--seed S]
 *        [--dtype f32|bf16] [--data DIR] [--backend NAME] [--threads N]
 *        [--fast]
 *   gpt2 --encode TEXT       the ids, one JSON array on one line
 *   gpt2 --decode ID,ID,...  the text
 *
 * Without --weights the 124M model is initialised with GPT-2's scheme from
 * the seed (no weights can be downloaded here), and the example says so:
 * the text is then noise, but every step is the real computation.
 * --dtype bf16 keeps the weights, the activations and the cache in bf16
 * (an F32 file is rounded once on loading, a BF16 one loads as it is;
 * each op computes in f32 and rounds once, docs/numerics.md); the
 * default f32 widens a BF16 file exactly.
 * --temperature 0 (the default) is greedy; otherwise the next token is
 * drawn from softmax(logits / T), over the K largest with --top-k K.
 * Prints the prompt, the tokens as they come, then the speed.  With
 * --server ADDRESS (or $TOPOS_SERVER) every step runs on toposd: the
 * weights are uploaded once as a blob, each step's network (a spec of
 * kilobytes: its parameters are recorded as zeros) runs on them by
 * reference, and the cache travels as the step's feeds and roots.  The
 * tokens are the in-process run's.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "bpe.h"
#include "ex.h"
#include "gpt2.h"

static const char usage[] =
    "usage: gpt2 [--weights FILE] [--config 124m|tiny] [--prompt TEXT]\n"
    "            [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
    "            [--dtype f32|bf16]\n"
    "       gpt2 --encode TEXT | --decode ID,ID,...\n";

typedef struct opts {
  ex_gen_flags gen;
  const char *encode, *decode, *config_name;
  ex_gpt2_config config;
} opts;

static int bad_value(const char *flag, const char *v) {
  fprintf(stderr, "gpt2: %s: '%s' is not a valid value\n%s", flag, v, usage);
  return -1;
}

static int parse(int argc, char **argv, ex_args *a, opts *o) {
  *o = (opts){.gen = {.prompt = "Hello", .tokens = 20, .seed = 1},
              .config_name = "124m",
              .config = EX_GPT2_124M};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(f, "--help")) {
      printf("%s%s", usage, ex_args_usage);
      exit(0);
    } else if (v && !strcmp(f, "--encode")) {
      o->encode = argv[++i];
    } else if (v && !strcmp(f, "--decode")) {
      o->decode = argv[++i];
    } else if (v && !strcmp(f, "--config")) {
      i++;
      if (!strcmp(v, "124m"))
        o->config = EX_GPT2_124M;
      else if (!strcmp(v, "tiny"))
        o->config = EX_GPT2_TINY;
      else
        return bad_value(f, v);
      o->config_name = v;
    } else {
      int r = ex_gen_flag(&o->gen, a, argc, argv, &i);
      if (r == 0) r = ex_arg(a, argc, argv, &i);
      if (r < 0) return -1;
      if (r == 0) {
        fprintf(stderr, "gpt2: unknown flag '%s'\n%s", f, usage);
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

/* Prints ids' text as it comes (a token may end mid-character: the bytes
 * go out as they are, and the terminal joins them). */
static void print_tokens(const ex_bpe *bpe, const int32_t *ids, size_t n) {
  char *text = NULL;
  size_t len = 0;
  topos_error err = {0};
  if (ex_bpe_decode(bpe, ids, n, &text, &len, &err) == 0)
    fwrite(text, 1, len, stdout);
  free(text);
  fflush(stdout);
}

static void show(const int32_t *ids, size_t n, void *bpe) {
  print_tokens(bpe, ids, n);
}

static int record(ex_kv_net *n, const void *w, int64_t T, int64_t past,
                  topos_error *err) {
  return ex_gpt2_record(n, w, T, past, err);
}

static int generate(const ex_args *a, const opts *o, const ex_bpe *bpe) {
  topos_error err = {0};
  const ex_gpt2_config *c = &o->config;
  fprintf(stderr,
          "gpt2: config %s: vocab %d, width %d, %d heads, %d layers, "
          "context %d; dtype %s\n",
          o->config_name, c->vocab, c->width, c->heads, c->layers, c->context,
          topos_dtype_name(c->dtype));
  ex_gpt2_weights w;
  double t0 = ex_now_s();
  if (o->gen.weights) {
    if (ex_gpt2_load(&w, &o->config, o->gen.weights, &err) != 0)
      return ex_fail(a, "weights", &err);
    fprintf(stderr, "gpt2: weights from %s (%.1f s)\n", o->gen.weights,
            ex_now_s() - t0);
  } else {
    if (ex_gpt2_init(&w, &o->config, o->gen.seed, &err) != 0)
      return ex_fail(a, "init", &err);
    fprintf(stderr,
            "gpt2: no --weights: random weights from seed %llu with GPT-2's "
            "initialisation (%.1f s); the text will be noise\n",
            (unsigned long long)o->gen.seed, ex_now_s() - t0);
  }
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = 0;
  if (ex_bpe_encode(bpe, o->gen.prompt, strlen(o->gen.prompt), &ids, &n,
                    &err) != 0) {
    rc = ex_fail(a, "prompt", &err);
  } else {
    ex_kv_generation g = {.prog = "gpt2",
                          .server = a->server,
                          .exec = &a->exec,
                          .record = record,
                          .model = &w,
                          .params = w.params,
                          .layers = o->config.layers,
                          .vocab = o->config.vocab,
                          .context = o->config.context,
                          .tokens = o->gen.tokens,
                          .temperature = o->gen.temperature,
                          .top_k = o->gen.top_k,
                          .seed = o->gen.seed,
                          .print = show,
                          .print_ctx = (void *)bpe};
    rc = ex_kv_generate(&g, &ids, &n);
  }
  free(ids);
  ex_gpt2_weights_free(&w);
  return rc;
}

int main(int argc, char **argv) {
  ex_args a = {.prog = "gpt2"};
  opts o;
  if (parse(argc, argv, &a, &o) != 0) return 2;
  topos_backends_register_defaults();
  char dir[4096];
  if (ex_find_data(a.data, "data/gpt2", dir, sizeof dir) != 0) {
    fprintf(stderr, "gpt2: no tokenizer files at %s (--data DIR)\n", dir);
    return 1;
  }
  topos_error err = {0};
  ex_bpe *bpe = ex_bpe_load(dir, &err);
  if (!bpe) return ex_fail(&a, "tokenizer", &err);
  int rc = 0;
  if (o.encode) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (ex_bpe_encode(bpe, o.encode, strlen(o.encode), &ids, &n, &err) != 0) {
      rc = ex_fail(&a, "encode", &err);
    } else {
      printf("[");
      for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
      printf("]\n");
    }
    free(ids);
  } else if (o.decode) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t len = 0;
    if (ex_parse_ids(o.decode, ex_bpe_vocab_size(bpe), &ids, &n) != 0) {
      fprintf(stderr, "gpt2: --decode: '%s' is not a list of ids\n", o.decode);
      rc = 2;
    } else if (ex_bpe_decode(bpe, ids, n, &text, &len, &err) != 0) {
      rc = ex_fail(&a, "decode", &err);
    } else {
      fwrite(text, 1, len, stdout);
      printf("\n");
    }
    free(ids);
    free(text);
  } else {
    rc = generate(&a, &o, bpe);
  }
  ex_bpe_free(bpe);
  return rc;
}
