/*
 * gpt2.c - GPT-2 text generation with topos: the byte-level BPE tokenizer,
 * a prefill network over the prompt, then one decode network per
 * position whose KV cache is the caller's state (examples/common/gpt2.h).
 *
 * Usage:
 *   gpt2 [--weights model.safetensors] [--config 124m|tiny] [--prompt TEXT]
 *        [--tokens N] [--temperature T] [--top-k K] [--seed S]
 *        [--data DIR] [--backend NAME] [--threads N] [--fast]
 *   gpt2 --encode TEXT       the ids, one JSON array on one line
 *   gpt2 --decode ID,ID,...  the text
 *
 * Without --weights the 124M model is initialised with GPT-2's scheme from
 * the seed (no weights can be downloaded here), and the example says so:
 * the text is then noise, but every step is the real computation.
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
#include "topos_client.h"

static const char usage[] =
    "usage: gpt2 [--weights FILE] [--config 124m|tiny] [--prompt TEXT]\n"
    "            [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
    "       gpt2 --encode TEXT | --decode ID,ID,...\n";

typedef struct opts {
  const char *weights, *prompt, *encode, *decode;
  ex_gpt2_config config;
  int64_t tokens, top_k;
  double temperature;
  uint64_t seed;
} opts;

static int bad_value(const char *flag, const char *v) {
  fprintf(stderr, "gpt2: %s: '%s' is not a valid value\n%s", flag, v, usage);
  return -1;
}

static int parse(int argc, char **argv, ex_args *a, opts *o) {
  *o = (opts){
      .prompt = "Hello", .config = EX_GPT2_124M, .tokens = 20, .seed = 1};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(f, "--help")) {
      printf("%s%s", usage, ex_args_usage);
      exit(0);
    } else if (v && !strcmp(f, "--weights")) {
      o->weights = argv[++i];
    } else if (v && !strcmp(f, "--prompt")) {
      o->prompt = argv[++i];
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
    } else if (v && !strcmp(f, "--tokens")) {
      i++;
      if (ex_parse_count(a, f, v, 1 << 20, &o->tokens) != 0) return -1;
    } else if (v && !strcmp(f, "--top-k")) {
      i++;
      if (ex_parse_count(a, f, v, 1 << 20, &o->top_k) != 0) return -1;
    } else if (v && !strcmp(f, "--temperature")) {
      i++;
      errno = 0;
      o->temperature = strtod(v, &end);
      if (errno || !end || *end || !(o->temperature >= 0) ||
          o->temperature > 1e6)
        return bad_value(f, v);
    } else if (v && !strcmp(f, "--seed")) {
      i++;
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      if (errno || !end || *end || *v == '-') return bad_value(f, v);
    } else {
      int r = ex_arg(a, argc, argv, &i);
      if (r < 0) return -1;
      if (r == 0) {
        fprintf(stderr, "gpt2: unknown flag '%s'\n%s", f, usage);
        return -1;
      }
    }
  }
  if (ex_args_done(a) != 0) return -1;
  return 0;
}

/* --decode's list: ids separated by commas (spaces allowed). */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
  size_t cap = 16;
  *ids = malloc(cap * sizeof **ids);
  *n = 0;
  while (*ids && *s) {
    while (*s == ' ' || *s == ',') s++;
    if (!*s) break;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0 || v > INT32_MAX) return -1;
    if (*n == cap) {
      int32_t *g = realloc(*ids, 2 * cap * sizeof **ids);
      if (!g) return -1;
      *ids = g;
      cap *= 2;
    }
    (*ids)[(*n)++] = (int32_t)v;
    s = end;
  }
  return *ids ? 0 : -1;
}

/* The next token: greedy, or drawn at the temperature over the top k. */
static int32_t next_token(float *logits, int V, const opts *o, uint64_t *rng) {
  if (o->top_k > 0 && o->top_k < V && o->temperature > 0) {
    /* Keep the k largest: the k-th largest value by selection. */
    float *tmp = malloc(sizeof(float) * (size_t)V);
    if (tmp) {
      memcpy(tmp, logits, sizeof(float) * (size_t)V);
      int64_t k = o->top_k, lo = 0, hi = V - 1;
      while (lo < hi) { /* quickselect for the (k-1)-th of descending */
        float pivot = tmp[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
          while (tmp[i] > pivot) i++;
          while (tmp[j] < pivot) j--;
          if (i <= j) {
            float t = tmp[i];
            tmp[i++] = tmp[j];
            tmp[j--] = t;
          }
        }
        if (k - 1 <= j)
          hi = j;
        else if (k - 1 >= i)
          lo = i;
        else
          break;
      }
      float cut = tmp[k - 1];
      free(tmp);
      for (int i = 0; i < V; i++)
        if (logits[i] < cut) logits[i] = -INFINITY;
    }
  }
  return (int32_t)ex_sample_logits(logits, V, o->temperature, rng);
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

static int generate(const ex_args *a, const opts *o, const ex_bpe *bpe) {
  topos_error err = {0};
  ex_gpt2_weights w;
  double t0 = ex_now_s();
  if (o->weights) {
    if (ex_gpt2_load(&w, &o->config, o->weights, &err) != 0)
      return ex_fail(a, "weights", &err);
    fprintf(stderr, "gpt2: weights from %s (%.1f s)\n", o->weights,
            ex_now_s() - t0);
  } else {
    if (ex_gpt2_init(&w, &o->config, o->seed, &err) != 0)
      return ex_fail(a, "init", &err);
    fprintf(stderr,
            "gpt2: no --weights: random weights from seed %llu with GPT-2's "
            "initialisation (%.1f s); the text will be noise\n",
            (unsigned long long)o->seed, ex_now_s() - t0);
  }
  int32_t *ids = NULL;
  size_t n = 0;
  if (ex_bpe_encode(bpe, o->prompt, strlen(o->prompt), &ids, &n, &err) != 0)
    return ex_fail(a, "prompt", &err);
  if (n == 0 || (int64_t)n + o->tokens > o->config.context) {
    fprintf(stderr,
            "gpt2: the prompt (%zu tokens) plus %lld new ones must fit the "
            "context of %d\n",
            n, (long long)o->tokens, o->config.context);
    free(ids);
    ex_gpt2_weights_free(&w);
    return 1;
  }
  /* Remote: the weights go up once as a blob; each step sends its small
   * spec, the tokens and the cache, and gets the logits and the new cache
   * back.  The cache stays here, the caller's. */
  topos_client *client = NULL;
  char blob[65] = "";
  if (a->server) {
    double tb = ex_now_s();
    int64_t bytes = 0;
    client = topos_client_connect(a->server, &err);
    if (!client ||
        topos_client_put_blob(client, w.params, blob, &bytes, &err) != 0) {
      topos_client_close(client);
      free(ids);
      ex_gpt2_weights_free(&w);
      return ex_fail(a, a->server, &err);
    }
    fprintf(stderr, "gpt2: weights on %s as blob %.12s (%.1f MB, %.1f s)\n",
            a->server, blob, bytes / 1e6, ex_now_s() - tb);
  }
  const int V = o->config.vocab;
  float *logits = malloc(sizeof(float) * (size_t)V);
  ex_gpt2_cache cache;
  int rc =
      logits && ex_gpt2_cache_init(&cache, o->config.layers, &err) == 0 ? 0 : 1;
  print_tokens(bpe, ids, n);
  uint64_t rng = o->seed;
  double tp = ex_now_s(), prefill = 0;
  int64_t made = 0;
  for (int64_t pos = 0; rc == 0 && made < o->tokens;) {
    /* The prompt in one run, then one token per run. */
    int64_t T = pos == 0 ? (int64_t)n : 1;
    ex_gpt2_net net;
    const int32_t *in = pos == 0 ? ids : &ids[pos];
    if (ex_gpt2_record(&net, &w, T, pos, &err) != 0 ||
        (client ? ex_gpt2_run_remote(&net, client, blob, in, &cache, &a->exec,
                                     logits, NULL, &err)
                : ex_gpt2_run(&net, in, &cache, &a->exec, logits, NULL,
                              &err)) != 0) {
      rc = ex_fail(a, "step", &err);
      ex_gpt2_net_free(&net);
      break;
    }
    ex_gpt2_net_free(&net);
    if (pos == 0) prefill = ex_now_s() - tp;
    pos += T;
    int32_t next = next_token(logits, V, o, &rng);
    int32_t *g = realloc(ids, sizeof *ids * (size_t)(pos + 1));
    if (!g) {
      rc = 1;
      break;
    }
    ids = g;
    ids[pos] = next;
    made++;
    print_tokens(bpe, &ids[pos], 1);
  }
  double total = ex_now_s() - tp;
  printf("\n");
  if (rc == 0)
    fprintf(stderr,
            "gpt2: %lld tokens in %.2f s (prefill of %zu tokens %.1f ms, then "
            "%.1f ms/token, %.1f tokens/s)\n",
            (long long)made, total, n, prefill * 1e3,
            made > 1 ? (total - prefill) / (double)(made - 1) * 1e3 : 0.0,
            made / total);
  if (logits) ex_gpt2_cache_free(&cache);
  topos_client_close(client);
  free(logits);
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
    if (parse_ids(o.decode, &ids, &n) != 0) {
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
