/*
 * decoder.c - what the decoder examples share (decoder.h).
 */
#include "decoder.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ex.h"
#include "topos_client.h"

static int fail(topos_error *err, int code, const char *fmt, const char *a,
                long long b) {
  err->code = code;
  snprintf(err->message, sizeof err->message, fmt, a, b);
  return -1;
}

/* ------------------------------------------------------------ networks */

int ex_kv_net_begin(ex_kv_net *n, int layers, int64_t T, int64_t past,
                    const topos_params *params, int nparams, topos_error *err) {
  memset(n, 0, sizeof *n);
  n->params = params;
  n->nparams = nparams;
  n->layers = layers;
  n->T = T;
  n->past = past;
  size_t L = (size_t)(layers > 0 ? layers : 1);
  n->k_in = calloc(L, sizeof *n->k_in);
  n->v_in = calloc(L, sizeof *n->v_in);
  n->k_out = calloc(L, sizeof *n->k_out);
  n->v_out = calloc(L, sizeof *n->v_out);
  if (!n->k_in || !n->v_in || !n->k_out || !n->v_out) {
    ex_kv_net_free(n);
    return fail(err, TOPOS_ERR_MEMORY, "decoder: out of memory%s%lld", "", 0);
  }
  return 0;
}

void ex_kv_net_free(ex_kv_net *n) {
  topos_network_release(n->net);
  free(n->k_in);
  free(n->v_in);
  free(n->k_out);
  free(n->v_out);
  memset(n, 0, sizeof *n);
}

topos_value ex_kv_parameter(topos_tape *tape, const topos_tensor *like,
                            const char *name) {
  topos_error err = {0};
  topos_tensor *zero = topos_tensor_scalar(topos_tensor_dtype(like), 0.0, &err);
  topos_tensor *z = zero
                        ? topos_tensor_broadcast(zero, topos_tensor_rank(like),
                                                 topos_tensor_shape(like), &err)
                        : NULL;
  /* A NULL tensor fails the tape, which then reports it at sealing. */
  topos_value v = topos_name(tape, topos_parameter(tape, z), name);
  topos_tensor_release(z);
  topos_tensor_release(zero);
  return v;
}

void ex_kv_cache_inputs(ex_kv_net *n, topos_tape *tape, int l,
                        const topos_tensor *zc, topos_value *k,
                        topos_value *v) {
  *k = *v = TOPOS_NONE;
  if (n->past == 0) return;
  char name[32];
  snprintf(name, sizeof name, "k_cache.%d", l);
  *k = n->k_in[l] = topos_name(tape, topos_input(tape, zc), name);
  snprintf(name, sizeof name, "v_cache.%d", l);
  *v = n->v_in[l] = topos_name(tape, topos_input(tape, zc), name);
}

void ex_kv_name_outputs(ex_kv_net *n, topos_tape *tape, int l) {
  char name[32];
  snprintf(name, sizeof name, "k_all.%d", l);
  n->k_out[l] = topos_name(tape, n->k_out[l], name);
  snprintf(name, sizeof name, "v_all.%d", l);
  n->v_out[l] = topos_name(tape, n->v_out[l], name);
}

/* -------------------------------------------------------------- running */

int ex_kv_cache_init(ex_kv_cache *c, int layers, topos_error *err) {
  memset(c, 0, sizeof *c);
  c->layers = layers;
  c->k = calloc((size_t)(layers ? layers : 1), sizeof *c->k);
  c->v = calloc((size_t)(layers ? layers : 1), sizeof *c->v);
  if (!c->k || !c->v) {
    ex_kv_cache_free(c);
    return fail(err, TOPOS_ERR_MEMORY, "decoder: out of memory%s%lld", "", 0);
  }
  return 0;
}

void ex_kv_cache_free(ex_kv_cache *c) {
  for (int l = 0; l < c->layers && c->k && c->v; l++) {
    topos_tensor_release(c->k[l]);
    topos_tensor_release(c->v[l]);
  }
  free(c->k);
  free(c->v);
  memset(c, 0, sizeof *c);
}

int ex_kv_run(const ex_kv_net *n, const int32_t *tokens, ex_kv_cache *cache,
              const topos_exec *ctx, float *logits_last, topos_tensor **all,
              topos_error *err) {
  if (cache->len != n->past || cache->layers != n->layers)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "decoder: the cache holds %s%lld positions, not the network's",
                "", (long long)cache->len);
  const int L = n->layers;
  int64_t xs[2] = {1, n->T};
  topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, xs, tokens, err);
  int nfeeds = 1 + (n->past > 0 ? 2 * L : 0);
  topos_feed *feeds = calloc((size_t)nfeeds, sizeof *feeds);
  topos_value *targets = calloc((size_t)(1 + 2 * L), sizeof *targets);
  if (!xt || !feeds || !targets) {
    topos_tensor_release(xt);
    free(feeds);
    free(targets);
    return xt ? fail(err, TOPOS_ERR_MEMORY, "decoder: out of memory%s%lld", "",
                     0)
              : -1;
  }
  feeds[0] = (topos_feed){n->x, xt};
  for (int l = 0; n->past > 0 && l < L; l++) {
    feeds[1 + 2 * l] = (topos_feed){n->k_in[l], cache->k[l]};
    feeds[2 + 2 * l] = (topos_feed){n->v_in[l], cache->v[l]};
  }
  targets[0] = n->logits;
  for (int l = 0; l < L; l++) {
    targets[1 + 2 * l] = n->k_out[l];
    targets[2 + 2 * l] = n->v_out[l];
  }
  topos_run *run = topos_forward_for(n->net, n->params, feeds, nfeeds, targets,
                                     1 + 2 * L, ctx, err);
  int rc = run ? 0 : -1;
  const topos_tensor *lg = run ? topos_run_of(run, n->logits, err) : NULL;
  if (run && !lg) rc = -1;
  if (rc == 0 && logits_last) {
    topos_tensor *row = topos_tensor_narrow(lg, 0, n->T - 1, 1, err);
    int64_t V = topos_tensor_shape(lg)[1];
    rc = row && topos_tensor_read(row, logits_last, (size_t)V * sizeof(float),
                                  err) == TOPOS_OK
             ? 0
             : -1;
    topos_tensor_release(row);
  }
  /* The new cache, all of it or nothing. */
  for (int l = 0; rc == 0 && l < L; l++) {
    const topos_tensor *k = topos_run_of(run, n->k_out[l], err);
    const topos_tensor *v = topos_run_of(run, n->v_out[l], err);
    if (!k || !v) rc = -1;
  }
  for (int l = 0; rc == 0 && l < L; l++) {
    topos_tensor_release(cache->k[l]);
    topos_tensor_release(cache->v[l]);
    cache->k[l] = topos_tensor_retain(topos_run_of(run, n->k_out[l], err));
    cache->v[l] = topos_tensor_retain(topos_run_of(run, n->v_out[l], err));
  }
  if (rc == 0) cache->len = n->past + n->T;
  if (rc == 0 && all) *all = topos_tensor_retain(lg);
  topos_run_free(run);
  topos_tensor_release(xt);
  free(feeds);
  free(targets);
  return rc;
}

int ex_kv_run_remote(const ex_kv_net *n, topos_client *c,
                     const char *weights_blob, const int32_t *tokens,
                     ex_kv_cache *cache, const topos_exec *ctx,
                     float *logits_last, topos_tensor **all, topos_error *err) {
  if (cache->len != n->past || cache->layers != n->layers)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "decoder: the cache holds %s%lld positions, not the network's",
                "", (long long)cache->len);
  const int L = n->layers;
  char id[65];
  if (topos_client_record(c, n->net, id, err) != TOPOS_OK) return -1;
  int64_t xs[2] = {1, n->T};
  topos_tensor *xt = topos_tensor_from(TOPOS_I32, 2, xs, tokens, err);
  int nfeeds = 1 + (n->past > 0 ? 2 * L : 0);
  topos_feed *feeds = calloc((size_t)nfeeds, sizeof *feeds);
  topos_value *roots = calloc((size_t)(1 + 2 * L), sizeof *roots);
  if (!xt || !feeds || !roots) {
    topos_tensor_release(xt);
    free(feeds);
    free(roots);
    return xt ? fail(err, TOPOS_ERR_MEMORY, "decoder: out of memory%s%lld", "",
                     0)
              : -1;
  }
  feeds[0] = (topos_feed){n->x, xt};
  for (int l = 0; n->past > 0 && l < L; l++) {
    feeds[1 + 2 * l] = (topos_feed){n->k_in[l], cache->k[l]};
    feeds[2 + 2 * l] = (topos_feed){n->v_in[l], cache->v[l]};
  }
  roots[0] = n->logits;
  for (int l = 0; l < L; l++) {
    roots[1 + 2 * l] = n->k_out[l];
    roots[2 + 2 * l] = n->v_out[l];
  }
  topos_entry e = {roots,
                   1 + 2 * L,
                   NULL,
                   0,
                   TOPOS_POSTURE_FORWARD,
                   ctx ? ctx->numerics : TOPOS_NUMERICS_EXACT};
  topos_client_args args = {.params_blob = weights_blob,
                            .nparams_blob = n->nparams,
                            .feeds = feeds,
                            .nfeeds = nfeeds,
                            .exec = ctx};
  topos_tensor **out = NULL;
  int rc =
      topos_client_forward_with(c, id, &e, &args, &out, NULL, err) == TOPOS_OK
          ? 0
          : -1;
  if (rc == 0 && logits_last) {
    topos_tensor *row = topos_tensor_narrow(out[0], 0, n->T - 1, 1, err);
    int64_t V = topos_tensor_shape(out[0])[1];
    rc = row && topos_tensor_read(row, logits_last, (size_t)V * sizeof(float),
                                  err) == TOPOS_OK
             ? 0
             : -1;
    topos_tensor_release(row);
  }
  if (rc == 0) {
    for (int l = 0; l < L; l++) {
      topos_tensor_release(cache->k[l]);
      topos_tensor_release(cache->v[l]);
      cache->k[l] = topos_tensor_retain(out[1 + 2 * l]);
      cache->v[l] = topos_tensor_retain(out[2 + 2 * l]);
    }
    cache->len = n->past + n->T;
    if (all) *all = topos_tensor_retain(out[0]);
  }
  if (out) topos_client_tensors_free(out, 1 + 2 * L);
  topos_tensor_release(xt);
  free(feeds);
  free(roots);
  return rc;
}

/* ------------------------------------------------------------- sampling */

int ex_parse_ids(const char *s, int vocab, int32_t **ids, size_t *n) {
  size_t cap = 16;
  *ids = malloc(cap * sizeof **ids);
  *n = 0;
  while (*ids && *s) {
    while (*s == ' ' || *s == ',') s++;
    if (!*s) break;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0 || v >= vocab) return -1;
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

static float kth_largest(const float *v, int n, int64_t k) {
  float *tmp = malloc(sizeof(float) * (size_t)n);
  if (!tmp) return -INFINITY;
  memcpy(tmp, v, sizeof(float) * (size_t)n);
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) { /* the (k-1)-th of descending order */
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
  return cut;
}

int32_t ex_next_token(float *logits, int vocab, double temperature,
                      int64_t top_k, uint64_t *rng) {
  if (top_k > 0 && top_k < vocab && temperature > 0) {
    float cut = kth_largest(logits, vocab, top_k);
    for (int i = 0; i < vocab; i++)
      if (logits[i] < cut) logits[i] = -INFINITY;
  }
  return (int32_t)ex_sample_logits(logits, vocab, temperature, rng);
}

/* ----------------------------------------------------------- generation */

int ex_gen_flag(ex_gen_flags *g, const ex_args *a, int argc, char **argv,
                int *i) {
  const char *f = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  char *end = NULL;
  if (!v) return 0;
  if (!strcmp(f, "--weights")) {
    g->weights = v;
  } else if (!strcmp(f, "--prompt")) {
    g->prompt = v;
  } else if (!strcmp(f, "--tokens")) {
    if (ex_parse_count(a, f, v, 1 << 20, &g->tokens) != 0) return -1;
  } else if (!strcmp(f, "--top-k")) {
    if (ex_parse_count(a, f, v, 1 << 20, &g->top_k) != 0) return -1;
  } else if (!strcmp(f, "--temperature")) {
    errno = 0;
    g->temperature = strtod(v, &end);
    if (errno || !end || *end || !(g->temperature >= 0) ||
        g->temperature > 1e6) {
      fprintf(stderr, "%s: --temperature: '%s' is not in 0..1e6\n", a->prog, v);
      return -1;
    }
  } else if (!strcmp(f, "--seed")) {
    errno = 0;
    g->seed = strtoull(v, &end, 10);
    if (errno || !end || *end || *v == '-') {
      fprintf(stderr, "%s: --seed: '%s' is not a whole number\n", a->prog, v);
      return -1;
    }
  } else {
    return 0;
  }
  (*i)++;
  return 1;
}

/* Prints "<prog>: <what>: <message>" and returns 1. */
static int gen_fail(const ex_kv_generation *g, const char *what,
                    const topos_error *err) {
  fprintf(stderr, "%s: %s: %s\n", g->prog, what, err->message);
  return 1;
}

int ex_kv_generate(const ex_kv_generation *g, int32_t **ids, size_t *n) {
  topos_error err = {0};
  size_t prompt = *n;
  if (prompt == 0 || (int64_t)prompt + g->tokens > g->context) {
    fprintf(stderr,
            "%s: the prompt (%zu tokens) plus %lld new ones must fit the "
            "context of %d\n",
            g->prog, prompt, (long long)g->tokens, g->context);
    return 1;
  }
  /* Remote: the weights go up once as a blob; each step sends its small
   * spec, the tokens and the cache, and gets the logits and the new cache
   * back.  The cache stays here, the caller's. */
  topos_client *client = NULL;
  char blob[65] = "";
  if (g->server) {
    double tb = ex_now_s();
    int64_t bytes = 0;
    client = topos_client_connect(g->server, &err);
    if (!client ||
        topos_client_put_blob(client, g->params, blob, &bytes, &err) != 0) {
      topos_client_close(client);
      return gen_fail(g, g->server, &err);
    }
    fprintf(stderr, "%s: weights on %s as blob %.12s (%.1f MB, %.1f s)\n",
            g->prog, g->server, blob, (double)bytes / 1e6, ex_now_s() - tb);
  }
  float *logits = malloc(sizeof(float) * (size_t)g->vocab);
  ex_kv_cache cache;
  int rc = logits && ex_kv_cache_init(&cache, g->layers, &err) == 0 ? 0 : 1;
  if (rc) {
    free(logits);
    topos_client_close(client);
    return gen_fail(g, "memory", &err);
  }
  g->print(*ids, prompt, g->print_ctx);
  uint64_t rng = g->seed;
  double tp = ex_now_s(), prefill = 0;
  int64_t made = 0;
  for (int64_t pos = 0; rc == 0 && made < g->tokens;) {
    /* The prompt in one step, then one token per step. */
    int64_t T = pos == 0 ? (int64_t)prompt : 1;
    const int32_t *in = *ids + pos;
    ex_kv_net net;
    if (g->record(&net, g->model, T, pos, &err) != 0) {
      rc = gen_fail(g, "record", &err);
      break;
    }
    int ran = client ? ex_kv_run_remote(&net, client, blob, in, &cache, g->exec,
                                        logits, NULL, &err)
                     : ex_kv_run(&net, in, &cache, g->exec, logits, NULL, &err);
    ex_kv_net_free(&net);
    if (ran != 0) {
      rc = gen_fail(g, "step", &err);
      break;
    }
    if (pos == 0) prefill = ex_now_s() - tp;
    pos += T;
    int32_t next =
        ex_next_token(logits, g->vocab, g->temperature, g->top_k, &rng);
    int32_t *grown = realloc(*ids, sizeof **ids * (size_t)(pos + 1));
    if (!grown) {
      rc = 1;
      break;
    }
    *ids = grown;
    (*ids)[pos] = next;
    *n = (size_t)pos + 1;
    made++;
    g->print(&(*ids)[pos], 1, g->print_ctx);
  }
  double total = ex_now_s() - tp;
  printf("\n");
  if (rc == 0)
    fprintf(stderr,
            "%s: %lld tokens in %.2f s (prefill of %zu tokens %.1f ms, then "
            "%.1f ms/token, %.1f tokens/s)\n",
            g->prog, (long long)made, total, prompt, prefill * 1e3,
            made > 1 ? (total - prefill) / (double)(made - 1) * 1e3 : 0.0,
            made / total);
  ex_kv_cache_free(&cache);
  free(logits);
  topos_client_close(client);
  return rc;
}
