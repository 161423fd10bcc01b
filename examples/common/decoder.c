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

topos_tensor *ex_weight_as(topos_tensor *t, topos_dtype dtype,
                           topos_error *err) {
  if (!t) return NULL;
  topos_tensor *c = topos_tensor_convert(t, dtype, err);
  topos_tensor_release(t);
  return c;
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

/* One step's inputs and outputs: the tokens and the cache as feeds, the
 * logits and every layer's keys and values as targets (interleaved:
 * logits, k0, v0, k1, v1, ...). */
typedef struct step_io {
  topos_tensor *x;
  topos_feed *feeds;
  int nfeeds;
  topos_value *targets;
  int ntargets;
} step_io;

static void io_free(step_io *io) {
  topos_tensor_release(io->x);
  free(io->feeds);
  free(io->targets);
}

static int io_begin(const ex_kv_net *n, const int32_t *tokens,
                    const ex_kv_cache *cache, step_io *io, topos_error *err) {
  memset(io, 0, sizeof *io);
  if (cache->len != n->past || cache->layers != n->layers)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "decoder: the cache holds %s%lld positions, not the network's",
                "", (long long)cache->len);
  const int L = n->layers;
  int64_t xs[2] = {1, n->T};
  io->x = topos_tensor_from(TOPOS_I32, 2, xs, tokens, err);
  if (!io->x) return -1;
  io->nfeeds = 1 + (n->past > 0 ? 2 * L : 0);
  io->ntargets = 1 + 2 * L;
  io->feeds = calloc((size_t)io->nfeeds, sizeof *io->feeds);
  io->targets = calloc((size_t)io->ntargets, sizeof *io->targets);
  if (!io->feeds || !io->targets) {
    io_free(io);
    return fail(err, TOPOS_ERR_MEMORY, "decoder: out of memory%s%lld", "", 0);
  }
  io->feeds[0] = (topos_feed){n->x, io->x};
  for (int l = 0; n->past > 0 && l < L; l++) {
    io->feeds[1 + 2 * l] = (topos_feed){n->k_in[l], cache->k[l]};
    io->feeds[2 + 2 * l] = (topos_feed){n->v_in[l], cache->v[l]};
  }
  io->targets[0] = n->logits;
  for (int l = 0; l < L; l++) {
    io->targets[1 + 2 * l] = n->k_out[l];
    io->targets[2 + 2 * l] = n->v_out[l];
  }
  return 0;
}

/* Takes a step's results, out[] in the targets' order: the last logits
 * row into logits_last, the logits into *all, and the keys and values as
 * the new cache - all of it or nothing. */
static int adopt(const ex_kv_net *n, const topos_tensor *const *out,
                 ex_kv_cache *cache, float *logits_last, topos_tensor **all,
                 topos_error *err) {
  for (int i = 0; i < 1 + 2 * n->layers; i++)
    if (!out[i]) return -1;
  if (logits_last) {
    /* A bf16 network's logits widen to float exactly. */
    topos_tensor *row = ex_weight_as(
        topos_tensor_narrow(out[0], 0, n->T - 1, 1, err), TOPOS_F32, err);
    int64_t V = topos_tensor_shape(out[0])[1];
    int ok =
        row && topos_tensor_read(row, logits_last, (size_t)V * sizeof(float),
                                 err) == TOPOS_OK;
    topos_tensor_release(row);
    if (!ok) return -1;
  }
  for (int l = 0; l < n->layers; l++) {
    topos_tensor_release(cache->k[l]);
    topos_tensor_release(cache->v[l]);
    cache->k[l] = topos_tensor_retain(out[1 + 2 * l]);
    cache->v[l] = topos_tensor_retain(out[2 + 2 * l]);
  }
  cache->len = n->past + n->T;
  if (all) *all = topos_tensor_retain(out[0]);
  return 0;
}

int ex_kv_run(const ex_kv_net *n, const int32_t *tokens, ex_kv_cache *cache,
              const topos_exec *ctx, float *logits_last, topos_tensor **all,
              topos_error *err) {
  step_io io;
  if (io_begin(n, tokens, cache, &io, err) != 0) return -1;
  /* A forward plan, not the interpreter: every intermediate dies at its
   * last use (the interpreter keeps all of them until the run is freed)
   * and the attention chain runs fused; the bits are the interpreter's. */
  topos_entry entry = {.roots = io.targets,
                       .nroots = io.ntargets,
                       .posture = TOPOS_POSTURE_FORWARD,
                       .numerics = ctx ? ctx->numerics : TOPOS_NUMERICS_EXACT,
                       .threads = ctx ? ctx->threads : 0};
  topos_plan *plan = topos_network_lower(n->net, &entry, err);
  topos_run *run =
      plan ? topos_plan_forward(plan, n->params, io.feeds, io.nfeeds, ctx, err)
           : NULL;
  topos_plan_free(plan);
  const topos_tensor **out = calloc((size_t)io.ntargets, sizeof *out);
  int rc = -1;
  if (run && out) {
    for (int i = 0; i < io.ntargets; i++)
      out[i] = topos_run_of(run, io.targets[i], err);
    rc = adopt(n, out, cache, logits_last, all, err);
  }
  free(out);
  topos_run_free(run);
  io_free(&io);
  return rc;
}

int ex_kv_run_remote(const ex_kv_net *n, topos_client *c,
                     const char *weights_blob, const int32_t *tokens,
                     ex_kv_cache *cache, const topos_exec *ctx,
                     float *logits_last, topos_tensor **all, topos_error *err) {
  step_io io;
  if (io_begin(n, tokens, cache, &io, err) != 0) return -1;
  char id[65];
  topos_tensor **out = NULL;
  int rc = -1;
  if (topos_client_record(c, n->net, id, err) == TOPOS_OK) {
    topos_entry e = {io.targets,
                     io.ntargets,
                     NULL,
                     0,
                     TOPOS_POSTURE_FORWARD,
                     ctx ? ctx->numerics : TOPOS_NUMERICS_EXACT};
    topos_client_args args = {.params_blob = weights_blob,
                              .nparams_blob = n->nparams,
                              .feeds = io.feeds,
                              .nfeeds = io.nfeeds,
                              .exec = ctx};
    if (topos_client_forward_with(c, id, &e, &args, &out, NULL, err) ==
        TOPOS_OK)
      rc = adopt(n, (const topos_tensor *const *)out, cache, logits_last, all,
                 err);
  }
  if (out) topos_client_tensors_free(out, io.ntargets);
  io_free(&io);
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
  } else if (!strcmp(f, "--dtype")) {
    if (!strcmp(v, "f32")) {
      g->dtype = TOPOS_F32;
    } else if (!strcmp(v, "bf16")) {
      g->dtype = TOPOS_BF16;
    } else {
      fprintf(stderr, "%s: --dtype: '%s' is not f32 or bf16\n", a->prog, v);
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
