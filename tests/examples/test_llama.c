/*
 * test_llama.c - Llama with a caller-owned KV cache (examples/common/
 * llama.c): decoding with the cache gives the full forward's bits, row by
 * row, with grouped-query attention; the cache holds the KV heads only, is
 * the caller's, and a failed run leaves it as it was; configs that are no
 * Llama are refused; weights round-trip through safetensors under Hugging
 * Face's names; and the logits match PyTorch's LlamaForCausalLM
 * (tests/python/llama_torch.py) run in float32 and in float64.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decoder_check.h"
#include "llama.h"

/* GPT-2's vocabulary, 4 query heads over 2 kv heads of 8 lanes. */
static const ex_llama_config tiny = {50257, 64, 32,   4,       2,    0,
                                     48,    2,  1e-6, 10000.0, false};

static void weights(ex_llama_weights *w, const ex_llama_config *c) {
  topos_error err = {0};
  ck_assert_msg(ex_llama_init(w, c, 7, &err) == 0, "%s", err.message);
}

/* The full forward over n tokens: its logits [n, V], retained. */
static topos_tensor *full_logits(const ex_llama_weights *w, const int32_t *tok,
                                 int64_t n) {
  topos_error err = {0};
  ex_kv_net net;
  ck_assert_msg(ex_llama_record(&net, w, n, 0, &err) == 0, "%s", err.message);
  return run_prefix(&net, w->c.layers, tok, n);
}

/* Prefill 5, then one token at a time: every row the full forward's. */
static void decode_matches(const ex_llama_config *cfg) {
  ex_llama_weights w;
  weights(&w, cfg);
  topos_error err = {0};
  int32_t tok[12] = {15496, 11, 995, 0, 464, 28846, 318, 262, 1, 50256, 7, 9};
  for (int i = 0; i < 12; i++) tok[i] %= cfg->vocab;
  topos_tensor *full = full_logits(&w, tok, 12);
  ex_kv_cache c;
  ck_assert_int_eq(ex_kv_cache_init(&c, cfg->layers, &err), 0);
  ex_kv_net pre;
  ck_assert_int_eq(ex_llama_record(&pre, &w, 5, 0, &err), 0);
  topos_tensor *pl = NULL;
  float *last = malloc(sizeof(float) * (size_t)cfg->vocab);
  ck_assert_int_eq(ex_kv_run(&pre, tok, &c, NULL, last, &pl, &err), 0);
  for (int64_t r = 0; r < 5; r++) same_row(full, r, pl, r, "prefill");
  /* logits_last is the last row's values. */
  int64_t idx[2] = {4, 123};
  ck_assert(last[123] == (float)topos_tensor_get(pl, idx, &err));
  topos_tensor_release(pl);
  ex_kv_net_free(&pre);
  /* The cache is KV heads wide, not H. */
  const int64_t kvw = (int64_t)cfg->kv_heads * ex_llama_head_dim(cfg);
  ck_assert_int_eq(topos_tensor_rank(c.k[0]), 3);
  ck_assert_int_eq(topos_tensor_shape(c.k[0])[1], 5);
  ck_assert_int_eq(topos_tensor_shape(c.k[0])[2], kvw);
  ck_assert_int_eq(topos_tensor_shape(c.v[cfg->layers - 1])[2], kvw);
  for (int64_t p = 5; p < 12; p++) {
    ex_kv_net step;
    ck_assert_int_eq(ex_llama_record(&step, &w, 1, p, &err), 0);
    topos_tensor *sl = NULL;
    ck_assert_msg(ex_kv_run(&step, &tok[p], &c, NULL, NULL, &sl, &err) == 0,
                  "%s", err.message);
    ck_assert_int_eq(c.len, p + 1);
    same_row(full, p, sl, 0, "decode");
    topos_tensor_release(sl);
    ex_kv_net_free(&step);
  }
  ck_assert_int_eq(topos_tensor_shape(c.v[0])[1], 12);
  free(last);
  ex_kv_cache_free(&c);
  topos_tensor_release(full);
  ex_llama_weights_free(&w);
}

START_TEST(decode_equals_full_forward) {
  decode_matches(&tiny);
}
END_TEST

/* Other shapes: a head size that is not D / H, a tied head and another
 * theta; multi-head attention (KV = H); multi-query (KV = 1). */
START_TEST(decode_equals_full_forward_shapes) {
  ex_llama_config c = tiny;
  c.vocab = 300;
  c.heads = 6;
  c.kv_heads = 3;
  c.head_dim = 6; /* 36 query lanes over a width of 32 */
  c.tie = true;
  c.rope_theta = 500000.0;
  decode_matches(&c);
  c = tiny;
  c.vocab = 300;
  c.kv_heads = 4;
  decode_matches(&c);
  c.kv_heads = 1;
  c.layers = 1;
  decode_matches(&c);
}
END_TEST

START_TEST(cache_is_the_callers) {
  ex_llama_weights w;
  weights(&w, &tiny);
  topos_error err = {0};
  int32_t tok[3] = {1, 2, 3};
  ex_kv_cache c;
  ck_assert_int_eq(ex_kv_cache_init(&c, tiny.layers, &err), 0);
  ex_kv_net pre, step;
  ck_assert_int_eq(ex_llama_record(&pre, &w, 3, 0, &err), 0);
  ck_assert_int_eq(ex_kv_run(&pre, tok, &c, NULL, NULL, NULL, &err), 0);
  topos_tensor *k0 = topos_tensor_retain(c.k[0]);
  /* A network for the wrong position: refused, the cache as it was. */
  ck_assert_int_eq(ex_llama_record(&step, &w, 1, 2, &err), 0);
  ck_assert_int_eq(ex_kv_run(&step, tok, &c, NULL, NULL, NULL, &err), -1);
  ck_assert_ptr_nonnull(strstr(err.message, "cache"));
  ck_assert_int_eq(c.len, 3);
  ck_assert_ptr_eq(c.k[0], k0);
  ex_kv_net_free(&step);
  /* An out-of-vocabulary token: a run-time error, the cache unchanged. */
  ck_assert_int_eq(ex_llama_record(&step, &w, 1, 3, &err), 0);
  int32_t bad = 50257;
  float *a = malloc(sizeof(float) * 50257), *b = malloc(sizeof(float) * 50257);
  ck_assert_int_eq(ex_kv_run(&step, &bad, &c, NULL, a, NULL, &err), -1);
  ck_assert_int_eq(c.len, 3);
  ck_assert_ptr_eq(c.k[0], k0);
  /* Running the same step twice from the same cache gives the same bits:
   * the state is all in the cache the caller holds. */
  ex_kv_cache c2;
  ck_assert_int_eq(ex_kv_cache_init(&c2, tiny.layers, &err), 0);
  for (int l = 0; l < tiny.layers; l++) {
    c2.k[l] = topos_tensor_retain(c.k[l]);
    c2.v[l] = topos_tensor_retain(c.v[l]);
  }
  c2.len = c.len;
  int32_t nxt = 42;
  ck_assert_int_eq(ex_kv_run(&step, &nxt, &c, NULL, a, NULL, &err), 0);
  ck_assert_int_eq(ex_kv_run(&step, &nxt, &c2, NULL, b, NULL, &err), 0);
  ck_assert(memcmp(a, b, sizeof(float) * 50257) == 0);
  ck_assert(topos_tensor_bitwise_equal(c.k[1], c2.k[1]));
  ck_assert(topos_tensor_bitwise_equal(c.v[1], c2.v[1]));
  /* A cache of the wrong layer count: refused. */
  ex_kv_cache c3;
  ck_assert_int_eq(ex_kv_cache_init(&c3, 1, &err), 0);
  c3.len = 3;
  ck_assert_int_eq(ex_kv_run(&step, &nxt, &c3, NULL, a, NULL, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  c3.len = 0;
  ex_kv_cache_free(&c3);
  free(a);
  free(b);
  topos_tensor_release(k0);
  ex_kv_cache_free(&c);
  ex_kv_cache_free(&c2);
  ex_kv_net_free(&pre);
  ex_kv_net_free(&step);
  ex_llama_weights_free(&w);
}
END_TEST

/* init refuses c with TOPOS_ERR_ARGUMENT. */
static void refused(const ex_llama_config *c, const char *what) {
  topos_error err = {0};
  ex_llama_weights w;
  ck_assert_msg(ex_llama_init(&w, c, 1, &err) == -1, "%s accepted", what);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "not a Llama"));
  ck_assert_ptr_null(w.t);
}

START_TEST(record_errors) {
  ex_llama_weights w;
  weights(&w, &tiny);
  topos_error err = {0};
  ex_kv_net n;
  ck_assert_int_eq(ex_llama_record(&n, &w, 0, 0, &err), -1);
  ck_assert_int_eq(ex_llama_record(&n, &w, 10, tiny.context - 5, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "context"));
  ck_assert_int_eq(ex_llama_record(&n, &w, 1, -1, &err), -1);
  ck_assert_ptr_null(n.net);
  /* Exactly the context fits. */
  ck_assert_int_eq(ex_llama_record(&n, &w, 4, tiny.context - 4, &err), 0);
  ex_kv_net_free(&n);
  ex_llama_weights_free(&w);
  ex_llama_config bad = tiny;
  bad.kv_heads = 3; /* 4 heads over 3 kv heads */
  refused(&bad, "H % KV != 0");
  bad = tiny;
  bad.head_dim = 7;
  refused(&bad, "odd head_dim");
  bad = tiny;
  bad.heads = 8;
  bad.kv_heads = 8;
  bad.width = 24; /* D / H = 3 */
  refused(&bad, "odd D / H");
  bad = tiny;
  bad.heads = 5; /* 32 / 5 */
  bad.kv_heads = 5;
  refused(&bad, "H not dividing D");
  bad = tiny;
  bad.rms_eps = 0;
  refused(&bad, "eps 0");
  bad = tiny;
  bad.rope_theta = NAN;
  refused(&bad, "theta NaN");
  bad = tiny;
  bad.ffn = 0;
  refused(&bad, "ffn 0");
  /* Named configs are Llamas. */
  const char *names[3] = {"tiny", "smollm-135m", "tinyllama-1.1b"};
  for (int i = 0; i < 3; i++) {
    ex_llama_config c;
    ck_assert_int_eq(ex_llama_config_named(names[i], &c), 0);
    ck_assert_msg(ex_llama_check(&c, &err) == 0, "%s: %s", names[i],
                  err.message);
  }
  ex_llama_config c;
  ck_assert_int_eq(ex_llama_config_named("llama-70b", &c), -1);
  ck_assert_int_eq(ex_llama_head_dim(&EX_LLAMA_TINYLLAMA_1B), 64);
}
END_TEST

/* Writes n named tensors to path. */
static void write_file(const char *path, int n, const char **names,
                       topos_tensor **ts) {
  topos_error err = {0};
  ck_assert_msg(topos_safetensors_save(path, n, names, ts, &err) == TOPOS_OK,
                "%s", err.message);
}

START_TEST(safetensors_round_trip) {
  ex_llama_weights w, back;
  weights(&w, &tiny);
  topos_error err = {0};
  char path[] = "/tmp/topos-llama-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_msg(ex_llama_save(&w, path, &err) == 0, "%s", err.message);
  ck_assert_msg(ex_llama_load(&back, &tiny, path, &err) == 0, "%s",
                err.message);
  ck_assert_int_eq(back.n, w.n);
  ck_assert_int_eq(w.n, 1 + 9 * tiny.layers + 2);
  ck_assert_str_eq(w.names[0], "model.embed_tokens.weight");
  ck_assert_str_eq(w.names[3], "model.layers.0.self_attn.k_proj.weight");
  ck_assert_str_eq(w.names[w.n - 1], "lm_head.weight");
  for (int i = 0; i < w.n; i++) {
    ck_assert_str_eq(back.names[i], w.names[i]);
    ck_assert(topos_tensor_bitwise_equal(back.t[i], w.t[i]));
  }
  /* HF's shapes: k_proj [KV·Dh, D], o_proj [D, H·Dh], down [D, F]. */
  ck_assert_int_eq(topos_tensor_shape(w.t[3])[0], 16);
  ck_assert_int_eq(topos_tensor_shape(w.t[3])[1], 32);
  ck_assert_int_eq(topos_tensor_shape(w.t[9])[1], 48);
  ex_llama_weights_free(&back);
  /* Extra entries (a rotary inv_freq buffer) beside the weights: loaded. */
  const char **names = calloc((size_t)w.n + 1, sizeof *names);
  topos_tensor **ts = calloc((size_t)w.n + 1, sizeof *ts);
  for (int i = 0; i < w.n; i++) {
    names[i] = w.names[i];
    ts[i] = w.t[i];
  }
  int64_t fs[1] = {4};
  topos_tensor *inv = topos_tensor_ones(TOPOS_F32, 1, fs, &err);
  names[w.n] = "model.layers.0.self_attn.rotary_emb.inv_freq";
  ts[w.n] = inv;
  write_file(path, w.n + 1, names, ts);
  ck_assert_msg(ex_llama_load(&back, &tiny, path, &err) == 0, "%s",
                err.message);
  ck_assert(topos_tensor_bitwise_equal(back.t[5], w.t[5]));
  ex_llama_weights_free(&back);
  /* Tied: lm_head.weight is ignored when there, and not written. */
  ex_llama_config tied = tiny;
  tied.tie = true;
  ck_assert_msg(ex_llama_load(&back, &tied, path, &err) == 0, "%s",
                err.message);
  ck_assert_int_eq(back.n, w.n - 1);
  ck_assert_str_eq(back.names[back.n - 1], "model.norm.weight");
  ck_assert_msg(ex_llama_save(&back, path, &err) == 0, "%s", err.message);
  ex_llama_weights_free(&back);
  /* ... so the untied config misses it. */
  ck_assert_int_eq(ex_llama_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err.message, "lm_head.weight"));
  ck_assert_ptr_null(back.t);
  /* Another config's shapes: refused, naming the weight. */
  write_file(path, w.n, names, ts);
  ex_llama_config other = tiny;
  other.kv_heads = 4;
  ck_assert_int_eq(ex_llama_load(&back, &other, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_ptr_nonnull(
      strstr(err.message, "model.layers.0.self_attn.k_proj.weight"));
  other = tiny;
  other.ffn = 64;
  ck_assert_int_eq(ex_llama_load(&back, &other, path, &err), -1);
  ck_assert_ptr_nonnull(
      strstr(err.message, "model.layers.0.mlp.gate_proj.weight"));
  /* Not f32: refused, naming the weight. */
  topos_tensor *d64 = topos_tensor_zeros(TOPOS_F64, topos_tensor_rank(w.t[1]),
                                         topos_tensor_shape(w.t[1]), &err);
  ts[1] = d64;
  write_file(path, w.n, names, ts);
  ck_assert_int_eq(ex_llama_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_ptr_nonnull(
      strstr(err.message, "model.layers.0.input_layernorm.weight"));
  /* A missing weight: the first three only. */
  ts[1] = w.t[1];
  write_file(path, 3, names, ts);
  ck_assert_int_eq(ex_llama_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(
      strstr(err.message, "model.layers.0.self_attn.k_proj.weight"));
  /* No file. */
  unlink(path);
  ck_assert_int_eq(ex_llama_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  topos_tensor_release(d64);
  topos_tensor_release(inv);
  free(names);
  free(ts);
  ex_llama_weights_free(&w);
}
END_TEST

/* ------------------------------------------------ against PyTorch */

/* Runs tests/python/llama_torch.py for config c on tok[n]; rel[0] and
 * rel[1] are the relative L2 errors of topos's f32 logits against
 * PyTorch's float64 and float32 ones. */
static void against_pytorch(const char *python, const ex_llama_config *c,
                            const int32_t *tok, int n, double rel[2]) {
  char dir[] = "/tmp/topos-llamaref-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char cmd[8192];
  int len = snprintf(cmd, sizeof cmd,
                     "'%s' tests/python/llama_torch.py '%s' %d %d %d %d %d %d "
                     "%d %.17g %.17g %d 5",
                     python, dir, c->vocab, c->width, c->heads, c->kv_heads,
                     ex_llama_head_dim(c), c->ffn, c->layers, c->rms_eps,
                     c->rope_theta, c->tie ? 1 : 0);
  for (int i = 0; i < n; i++)
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %d", tok[i]);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  topos_error err = {0};
  ex_llama_weights w;
  ck_assert_msg(ex_llama_load(&w, c, path, &err) == 0, "%s", err.message);
  ex_kv_net net;
  ck_assert_int_eq(ex_llama_record(&net, &w, n, 0, &err), 0);
  ex_kv_cache cache;
  ck_assert_int_eq(ex_kv_cache_init(&cache, c->layers, &err), 0);
  topos_tensor *all = NULL;
  ck_assert_msg(ex_kv_run(&net, tok, &cache, NULL, NULL, &all, &err) == 0, "%s",
                err.message);
  size_t m = (size_t)n * (size_t)c->vocab;
  float *got = malloc(m * sizeof *got);
  ck_assert_int_eq(topos_tensor_read(all, got, m * sizeof *got, &err),
                   TOPOS_OK);
  rel[0] = rel_l2_file(got, dir, "logits.f64", m, true);
  rel[1] = rel_l2_file(got, dir, "logits.f32", m, false);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  free(got);
  topos_tensor_release(all);
  ex_kv_cache_free(&cache);
  ex_kv_net_free(&net);
  ex_llama_weights_free(&w);
}

/* tests/python/llama_torch.py is LlamaForCausalLM in PyTorch: it writes
 * its random weights with Hugging Face's names and its logits, run in
 * float32 and again after .double() in float64.  topos loads the file and
 * its f32 logits hold numerics.md's f32 envelope against both: relative
 * L2 error at most 1e-5.  Two shapes: GQA (H 4, KV 2) untied, and a head
 * size other than D / H (H 6, KV 3, Dh 16 over D 48) tied, with Llama 3's
 * theta and eps. */
START_TEST(matches_pytorch_reference) {
  const char *python = torch_python();
  if (!python) {
    printf(
        "llama: /usr/bin/python3 cannot import torch (run `make deps` for "
        "python3-torch): PyTorch comparison skipped\n");
    return;
  }
  const int32_t tok[9] = {0, 17, 999, 512, 3, 3, 250, 1, 42};
  const ex_llama_config cs[2] = {
      {1000, 32, 48, 4, 2, 0, 128, 3, 1e-6, 10000.0, false},
      {1000, 32, 48, 6, 3, 16, 96, 2, 1e-5, 500000.0, true}};
  for (int i = 0; i < 2; i++) {
    double rel[2];
    against_pytorch(python, &cs[i], tok, 9, rel);
    printf(
        "llama: logits against PyTorch's (H %d, KV %d, Dh %d%s): relative L2 "
        "%.3g (float64), %.3g (float32)\n",
        cs[i].heads, cs[i].kv_heads, ex_llama_head_dim(&cs[i]),
        cs[i].tie ? ", tied" : "", rel[0], rel[1]);
    ck_assert_msg(rel[0] <= 1e-5, "relative L2 error %g over 1e-5 (float64)",
                  rel[0]);
    ck_assert_msg(rel[1] <= 1e-5, "relative L2 error %g over 1e-5 (float32)",
                  rel[1]);
    ck_assert_msg(rel[0] > 0, "bit-equal to a float64 model: not a real check");
  }
}
END_TEST

Suite *llama_suite(void) {
  Suite *s = suite_create("llama");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, decode_equals_full_forward);
  tcase_add_test(tc, decode_equals_full_forward_shapes);
  tcase_add_test(tc, cache_is_the_callers);
  tcase_add_test(tc, record_errors);
  tcase_add_test(tc, safetensors_round_trip);
  tcase_add_test(tc, matches_pytorch_reference);
  suite_add_tcase(s, tc);
  return s;
}
