/*
 * test_gpt2.c - GPT-2 with a caller-owned KV cache (examples/common/
 * gpt2.c): decoding with the cache gives the full forward's bits, row by
 * row; the cache is the caller's and a failed run leaves it as it was;
 * weights round-trip through safetensors under Hugging Face's names; and
 * the logits match PyTorch's GPT2LMHeadModel (tests/python/gpt2_torch.py)
 * run in float32 and in float64.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/mlir_opt.h"
#include "decoder_check.h"
#include "gpt2.h"

static const ex_gpt2_config tiny = {50257, 64, 32, 4, 2};

static void weights(ex_gpt2_weights *w) {
  topos_error err = {0};
  ck_assert_msg(ex_gpt2_init(w, &tiny, 7, &err) == 0, "%s", err.message);
}

/* The full forward over n tokens: its logits [n, V], retained. */
static topos_tensor *full_logits(const ex_gpt2_weights *w, const int32_t *tok,
                                 int64_t n) {
  topos_error err = {0};
  ex_kv_net net;
  ck_assert_msg(ex_gpt2_record(&net, w, n, 0, &err) == 0, "%s", err.message);
  return run_prefix(&net, w->c.layers, tok, n);
}

START_TEST(decode_equals_full_forward) {
  ex_gpt2_weights w;
  weights(&w);
  topos_error err = {0};
  int32_t tok[12] = {15496, 11, 995, 0, 464, 28846, 318, 262, 1, 50256, 7, 9};
  topos_tensor *full = full_logits(&w, tok, 12);
  /* Prefill 5, then one token at a time. */
  ex_kv_cache c;
  ck_assert_int_eq(ex_kv_cache_init(&c, tiny.layers, &err), 0);
  ex_kv_net pre;
  ck_assert_int_eq(ex_gpt2_record(&pre, &w, 5, 0, &err), 0);
  topos_tensor *pl = NULL;
  float last[50257];
  ck_assert_int_eq(ex_kv_run(&pre, tok, &c, NULL, last, &pl, &err), 0);
  for (int64_t r = 0; r < 5; r++) same_row(full, r, pl, r, "prefill");
  /* logits_last is the last row's values. */
  int64_t idx[2] = {4, 123};
  ck_assert(last[123] == (float)topos_tensor_get(pl, idx, &err));
  topos_tensor_release(pl);
  ex_kv_net_free(&pre);
  for (int64_t p = 5; p < 12; p++) {
    ex_kv_net step;
    ck_assert_int_eq(ex_gpt2_record(&step, &w, 1, p, &err), 0);
    topos_tensor *sl = NULL;
    ck_assert_msg(ex_kv_run(&step, &tok[p], &c, NULL, NULL, &sl, &err) == 0,
                  "%s", err.message);
    ck_assert_int_eq(c.len, p + 1);
    same_row(full, p, sl, 0, "decode");
    topos_tensor_release(sl);
    ex_kv_net_free(&step);
  }
  ex_kv_cache_free(&c);
  topos_tensor_release(full);
  ex_gpt2_weights_free(&w);
}
END_TEST

/* The same through the exact cpu backend and fast numerics' context is
 * refused nothing: the cache works under any context. */
START_TEST(cache_is_the_callers) {
  ex_gpt2_weights w;
  weights(&w);
  topos_error err = {0};
  int32_t tok[3] = {1, 2, 3};
  ex_kv_cache c;
  ck_assert_int_eq(ex_kv_cache_init(&c, tiny.layers, &err), 0);
  ex_kv_net pre, step;
  ck_assert_int_eq(ex_gpt2_record(&pre, &w, 3, 0, &err), 0);
  ck_assert_int_eq(ex_kv_run(&pre, tok, &c, NULL, NULL, NULL, &err), 0);
  topos_tensor *k0 = topos_tensor_retain(c.k[0]);
  /* A network for the wrong position: refused, the cache as it was. */
  ck_assert_int_eq(ex_gpt2_record(&step, &w, 1, 2, &err), 0);
  ck_assert_int_eq(ex_kv_run(&step, tok, &c, NULL, NULL, NULL, &err), -1);
  ck_assert_ptr_nonnull(strstr(err.message, "cache"));
  ck_assert_int_eq(c.len, 3);
  ck_assert_ptr_eq(c.k[0], k0);
  ex_kv_net_free(&step);
  /* An out-of-vocabulary token: a run-time error, the cache unchanged. */
  ck_assert_int_eq(ex_gpt2_record(&step, &w, 1, 3, &err), 0);
  int32_t bad = 50257;
  ck_assert_int_eq(ex_kv_run(&step, &bad, &c, NULL, NULL, NULL, &err), -1);
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
  float a[50257], b[50257];
  int32_t nxt = 42;
  ck_assert_int_eq(ex_kv_run(&step, &nxt, &c, NULL, a, NULL, &err), 0);
  ck_assert_int_eq(ex_kv_run(&step, &nxt, &c2, NULL, b, NULL, &err), 0);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  ck_assert(topos_tensor_bitwise_equal(c.k[1], c2.k[1]));
  topos_tensor_release(k0);
  ex_kv_cache_free(&c);
  ex_kv_cache_free(&c2);
  ex_kv_net_free(&pre);
  ex_kv_net_free(&step);
  ex_gpt2_weights_free(&w);
}
END_TEST

START_TEST(record_errors) {
  ex_gpt2_weights w;
  weights(&w);
  topos_error err = {0};
  ex_kv_net n;
  ck_assert_int_eq(ex_gpt2_record(&n, &w, 0, 0, &err), -1);
  ck_assert_int_eq(ex_gpt2_record(&n, &w, 10, tiny.context - 5, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(ex_gpt2_record(&n, &w, 1, -1, &err), -1);
  ex_gpt2_config bad = tiny;
  bad.heads = 3; /* 32 / 3 */
  ex_gpt2_weights w2;
  ck_assert_int_eq(ex_gpt2_init(&w2, &bad, 1, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ex_gpt2_weights_free(&w);
}
END_TEST

START_TEST(safetensors_round_trip) {
  ex_gpt2_weights w, back;
  weights(&w);
  topos_error err = {0};
  char path[] = "/tmp/topos-gpt2-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_msg(ex_gpt2_save(&w, path, &err) == 0, "%s", err.message);
  ck_assert_msg(ex_gpt2_load(&back, &tiny, path, &err) == 0, "%s", err.message);
  ck_assert_int_eq(back.n, w.n);
  for (int i = 0; i < w.n; i++) {
    ck_assert_str_eq(back.names[i], w.names[i]);
    ck_assert(topos_tensor_bitwise_equal(back.t[i], w.t[i]));
  }
  ex_gpt2_weights_free(&back);
  /* Hugging Face's GPT2LMHeadModel prefix, the mask buffers and the tied
   * head beside the weights: loaded. */
  const char **names = calloc((size_t)w.n + 2, sizeof *names);
  topos_tensor **ts = calloc((size_t)w.n + 2, sizeof *ts);
  char(*pre)[64] = calloc((size_t)w.n, sizeof *pre);
  for (int i = 0; i < w.n; i++) {
    snprintf(pre[i], sizeof pre[i], "transformer.%s", w.names[i]);
    names[i] = pre[i];
    ts[i] = w.t[i];
  }
  names[w.n] = "lm_head.weight";
  ts[w.n] = w.t[0];
  int64_t ms[4] = {1, 1, 4, 4};
  topos_tensor *mask = topos_tensor_ones(TOPOS_F32, 4, ms, &err);
  names[w.n + 1] = "transformer.h.0.attn.bias";
  ts[w.n + 1] = mask;
  ck_assert_int_eq(topos_safetensors_save(path, w.n + 2, names, ts, &err),
                   TOPOS_OK);
  ck_assert_msg(ex_gpt2_load(&back, &tiny, path, &err) == 0, "%s", err.message);
  ck_assert(topos_tensor_bitwise_equal(back.t[5], w.t[5]));
  ex_gpt2_weights_free(&back);
  /* Another config's shapes: refused, naming the weight. */
  ex_gpt2_config wider = tiny;
  wider.width = 64;
  ck_assert_int_eq(ex_gpt2_load(&back, &wider, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.message, "wte.weight"));
  /* A missing weight. */
  ck_assert_int_eq(topos_safetensors_save(path, 3, names, ts, &err), TOPOS_OK);
  ck_assert_int_eq(ex_gpt2_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  /* No file. */
  unlink(path);
  ck_assert_int_eq(ex_gpt2_load(&back, &tiny, path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  topos_tensor_release(mask);
  free(names);
  free(ts);
  free(pre);
  ex_gpt2_weights_free(&w);
}
END_TEST

/* ------------------------------------------------ against PyTorch */

/* tests/python/gpt2_torch.py is GPT2LMHeadModel in PyTorch: it writes its
 * random weights with Hugging Face's names (the "transformer." prefix, the
 * tied head beside) and its logits, run in float32 and again after
 * .double() in float64.  topos loads the file and its f32 logits hold
 * numerics.md's f32 envelope against both: relative L2 error at most
 * 1e-5. */
START_TEST(matches_pytorch_reference) {
  const char *python = torch_python();
  if (!python) {
    printf(
        "gpt2: /usr/bin/python3 cannot import torch (run `make deps` for "
        "python3-torch): PyTorch comparison skipped\n");
    return;
  }
  char dir[] = "/tmp/topos-gpt2ref-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  const ex_gpt2_config c = {1000, 32, 48, 4, 3};
  const int32_t tok[9] = {0, 17, 999, 512, 3, 3, 250, 1, 42};
  char cmd[8192];
  int len = snprintf(
      cmd, sizeof cmd, "'%s' tests/python/gpt2_torch.py '%s' %d %d %d %d %d 5",
      python, dir, c.vocab, c.context, c.width, c.heads, c.layers);
  for (int i = 0; i < 9; i++)
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %d", tok[i]);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  topos_error err = {0};
  ex_gpt2_weights w;
  ck_assert_msg(ex_gpt2_load(&w, &c, path, &err) == 0, "%s", err.message);
  ex_kv_net net;
  ck_assert_int_eq(ex_gpt2_record(&net, &w, 9, 0, &err), 0);
  ex_kv_cache cache;
  ck_assert_int_eq(ex_kv_cache_init(&cache, c.layers, &err), 0);
  topos_tensor *all = NULL;
  ck_assert_msg(ex_kv_run(&net, tok, &cache, NULL, NULL, &all, &err) == 0, "%s",
                err.message);
  size_t n = (size_t)9 * (size_t)c.vocab;
  float *got = malloc(n * sizeof *got);
  ck_assert_int_eq(topos_tensor_read(all, got, n * sizeof *got, &err),
                   TOPOS_OK);
  double rel64 = rel_l2_file(got, dir, "logits.f64", n, true);
  double rel32 = rel_l2_file(got, dir, "logits.f32", n, false);
  printf(
      "gpt2: logits against PyTorch's: relative L2 %.3g (float64), %.3g "
      "(float32)\n",
      rel64, rel32);
  ck_assert_msg(rel64 <= 1e-5, "relative L2 error %g over 1e-5 (float64)",
                rel64);
  ck_assert_msg(rel32 <= 1e-5, "relative L2 error %g over 1e-5 (float32)",
                rel32);
  ck_assert_msg(rel64 > 0, "bit-equal to a float64 model: not a real check");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  free(got);
  topos_tensor_release(all);
  ex_kv_cache_free(&cache);
  ex_kv_net_free(&net);
  ex_gpt2_weights_free(&w);
}
END_TEST

/* Emission at scale: GPT-2 124M's forward plan (256 tokens) and a
 * one-token decode step at position 128, emitted as StableHLO with the
 * weights as function arguments, are accepted by mlir-opt.  (IREE runs
 * a small config's emitted module against the interpreter: test_iree.c's
 * test_gpt2.) */
START_TEST(emits_at_scale) {
  topos_error err = {0};
  ex_gpt2_weights w;
  ck_assert_msg(ex_gpt2_init(&w, &EX_GPT2_124M, 1, &err) == 0, "%s",
                err.message);
  const int64_t steps[2][2] = {{256, 0}, {1, 128}}; /* (T, past) */
  for (int k = 0; k < 2; k++) {
    ex_kv_net n;
    ck_assert_msg(ex_gpt2_record(&n, &w, steps[k][0], steps[k][1], &err) == 0,
                  "%s", err.message);
    topos_value roots[1 + 2 * 12];
    roots[0] = n.logits;
    for (int l = 0; l < 12; l++) {
      roots[1 + 2 * l] = n.k_out[l];
      roots[2 + 2 * l] = n.v_out[l];
    }
    topos_entry e = {
        .roots = roots, .nroots = 1 + 2 * 12, .posture = TOPOS_POSTURE_FORWARD};
    topos_plan *plan = topos_network_lower(n.net, &e, &err);
    ck_assert_msg(plan != NULL, "%s", err.message);
    char *text = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
    ck_assert_msg(text != NULL, "emit: %s", err.message);
    /* the weights are arguments, not constants (they would be 500 MB) */
    ck_assert_msg(strlen(text) < (size_t)64 << 20, "module of %zu bytes",
                  strlen(text));
    ck_assert_ptr_nonnull(strstr(text, "tensor<50257x768xf32>"));
    char diag[512];
    int status = run_mlir_opt(text, diag, sizeof diag);
    ck_assert_msg(status == 0,
                  "mlir-opt rejected GPT-2 124M (T %lld, past %lld): %s",
                  (long long)steps[k][0], (long long)steps[k][1], diag);
    printf(
        "gpt2: 124M T=%lld past=%lld emits %zu bytes of StableHLO, "
        "accepted by mlir-opt\n",
        (long long)steps[k][0], (long long)steps[k][1], strlen(text));
    topos_free(text);
    topos_plan_free(plan);
    ex_kv_net_free(&n);
  }
  ex_gpt2_weights_free(&w);
}
END_TEST

Suite *gpt2_suite(void) {
  Suite *s = suite_create("gpt2");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, decode_equals_full_forward);
  tcase_add_test(tc, cache_is_the_callers);
  tcase_add_test(tc, record_errors);
  tcase_add_test(tc, safetensors_round_trip);
  tcase_add_test(tc, matches_pytorch_reference);
  tcase_add_test(tc, emits_at_scale);
  suite_add_tcase(s, tc);
  return s;
}
