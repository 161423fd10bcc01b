/*
 * test_decode_bf16.c - bf16 decoding (examples/common/gpt2.c, llama.c,
 * decoder.c with the config's dtype TOPOS_BF16): the whole network on a
 * bf16 tape, weights, activations, logits and the caller's cache bf16,
 * each op computing in f32 and rounding once (docs/numerics.md).
 *
 *  - Decoding with the bf16 cache gives the bits of the bf16 full forward,
 *    row by row, as in f32 (test_gpt2.c, test_llama.c), in-process and on
 *    a toposd with the weights as one bf16 blob.
 *  - The envelope against f32: the bf16 model (the f32 weights of the
 *    same seed rounded once) against the f32 model on the same tokens.
 *    Relative L2 of the logits is measured and held to a bound with
 *    margin (the numbers are in docs/examples.md); greedy agreement over
 *    16 steps is printed, not asserted (random weights give nearly flat
 *    logits, so agreement there says little).
 *  - Weights: a bf16 safetensors file round-trips with equal bits, an f32
 *    file loaded as bf16 equals the f32 weights converted, a BF16 file
 *    loaded as f32 is widened exactly; other dtypes are refused.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../daemon/harness.h"
#include "decoder_check.h"
#include "gpt2.h"
#include "llama.h"
#include "topos_client.h"

/* GPT-2's vocabulary with small bodies, as test_gpt2.c and test_llama.c
 * build them, and deeper ones for the envelope. */
static const ex_gpt2_config gpt2_tiny = {50257, 64, 32, 4, 2, TOPOS_BF16};
static const ex_gpt2_config gpt2_deep = {50257, 64, 64, 4, 6, TOPOS_BF16};
static const ex_llama_config llama_tiny = {
    50257, 64, 32, 4, 2, 0, 48, 2, 1e-6, 10000.0, false, TOPOS_BF16};
static const ex_llama_config llama_deep = {
    50257, 64, 64, 4, 2, 0, 172, 6, 1e-6, 10000.0, false, TOPOS_BF16};

static const int32_t tokens[16] = {15496, 11,  995, 0,     464, 28846,
                                   318,   262, 1,   50256, 7,   9,
                                   1000,  20,  333, 4444};

/* One model behind the decoder's record function. */
typedef struct model {
  ex_kv_record_fn record;
  const void *w;
  const topos_params *params;
  int nparams, layers, vocab;
} model;

static int gpt2_rec(ex_kv_net *n, const void *w, int64_t T, int64_t past,
                    topos_error *err) {
  return ex_gpt2_record(n, w, T, past, err);
}

static int llama_rec(ex_kv_net *n, const void *w, int64_t T, int64_t past,
                     topos_error *err) {
  return ex_llama_record(n, w, T, past, err);
}

static model gpt2_model(const ex_gpt2_weights *w) {
  return (model){gpt2_rec, w, w->params, w->n, w->c.layers, w->c.vocab};
}

static model llama_model(const ex_llama_weights *w) {
  return (model){llama_rec, w, w->params, w->n, w->c.layers, w->c.vocab};
}

static void gpt2_weights(ex_gpt2_weights *w, ex_gpt2_config c,
                         topos_dtype dtype) {
  topos_error err = {0};
  c.dtype = dtype;
  ck_assert_msg(ex_gpt2_init(w, &c, 7, &err) == 0, "%s", err.message);
}

static void llama_weights(ex_llama_weights *w, ex_llama_config c,
                          topos_dtype dtype) {
  topos_error err = {0};
  c.dtype = dtype;
  ck_assert_msg(ex_llama_init(w, &c, 7, &err) == 0, "%s", err.message);
}

/* The full forward over n tokens: its logits [n, V], retained. */
static topos_tensor *full_logits(const model *m, const int32_t *tok,
                                 int64_t n) {
  topos_error err = {0};
  ex_kv_net net;
  ck_assert_msg(m->record(&net, m->w, n, 0, &err) == 0, "%s", err.message);
  return run_prefix(&net, m->layers, tok, n);
}

/* Prefill 5 tokens, then one at a time (remote on client c with the
 * weights' blob when c is not NULL): every row of logits the full
 * forward's, the cache and the logits bf16. */
static void decode_matches(const model *m, topos_client *c, const char *blob) {
  topos_error err = {0};
  const int64_t n = 12;
  int32_t tok[12];
  for (int i = 0; i < n; i++) tok[i] = tokens[i] % m->vocab;
  topos_tensor *full = full_logits(m, tok, n);
  ck_assert_int_eq(topos_tensor_dtype(full), TOPOS_BF16);
  ex_kv_cache cache;
  ck_assert_int_eq(ex_kv_cache_init(&cache, m->layers, &err), 0);
  float *last = malloc(sizeof(float) * (size_t)m->vocab);
  for (int64_t p = 0; p < n;) {
    int64_t T = p == 0 ? 5 : 1;
    ex_kv_net net;
    ck_assert_msg(m->record(&net, m->w, T, p, &err) == 0, "%s", err.message);
    ck_assert_int_eq(topos_network_dtype(net.net), TOPOS_BF16);
    topos_tensor *lg = NULL;
    int rc = c ? ex_kv_run_remote(&net, c, blob, &tok[p], &cache, NULL, last,
                                  &lg, &err)
               : ex_kv_run(&net, &tok[p], &cache, NULL, last, &lg, &err);
    ck_assert_msg(rc == 0, "step at %lld: %s", (long long)p, err.message);
    ck_assert_int_eq(topos_tensor_dtype(lg), TOPOS_BF16);
    for (int64_t r = 0; r < T; r++)
      same_row(full, p + r, lg, r, c ? "remote decode" : "decode");
    /* logits_last is the last row widened exactly. */
    for (int64_t v = 0; v < m->vocab; v += 997) {
      int64_t idx[2] = {T - 1, v};
      ck_assert(last[v] == (float)topos_tensor_get(lg, idx, &err));
    }
    topos_tensor_release(lg);
    ex_kv_net_free(&net);
    p += T;
    ck_assert_int_eq(cache.len, p);
    for (int l = 0; l < m->layers; l++) {
      ck_assert_int_eq(topos_tensor_dtype(cache.k[l]), TOPOS_BF16);
      ck_assert_int_eq(topos_tensor_dtype(cache.v[l]), TOPOS_BF16);
    }
  }
  free(last);
  ex_kv_cache_free(&cache);
  topos_tensor_release(full);
}

START_TEST(gpt2_decode_equals_full_forward) {
  ex_gpt2_weights w;
  gpt2_weights(&w, gpt2_tiny, TOPOS_BF16);
  for (int i = 0; i < w.n; i++)
    ck_assert_int_eq(topos_tensor_dtype(w.t[i]), TOPOS_BF16);
  model m = gpt2_model(&w);
  decode_matches(&m, NULL, NULL);
  ex_gpt2_weights_free(&w);
}
END_TEST

START_TEST(llama_decode_equals_full_forward) {
  ex_llama_weights w;
  llama_weights(&w, llama_tiny, TOPOS_BF16);
  model m = llama_model(&w);
  decode_matches(&m, NULL, NULL);
  ex_llama_weights_free(&w);
  /* A tied head, a head size that is not D / H, multi-query attention. */
  ex_llama_config c = llama_tiny;
  c.vocab = 300;
  c.heads = 6;
  c.kv_heads = 1;
  c.head_dim = 6;
  c.tie = true;
  llama_weights(&w, c, TOPOS_BF16);
  m = llama_model(&w);
  decode_matches(&m, NULL, NULL);
  ex_llama_weights_free(&w);
}
END_TEST

/* The same steps on a toposd: the bf16 weights go up as one blob, the
 * bf16 cache travels as feeds and roots, and the bits are the
 * in-process run's (decode_matches compares with the in-process full
 * forward). */
START_TEST(remote_decode_equals_in_process) {
  daemon_proc d = {0};
  daemon_dir(&d);
  daemon_start(&d, NULL);
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", d.port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(address, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  ex_gpt2_weights gw;
  gpt2_weights(&gw, gpt2_tiny, TOPOS_BF16);
  ex_llama_weights lw;
  llama_weights(&lw, llama_tiny, TOPOS_BF16);
  model ms[2] = {gpt2_model(&gw), llama_model(&lw)};
  for (int i = 0; i < 2; i++) {
    char blob[65];
    int64_t bytes = 0;
    ck_assert_msg(
        topos_client_put_blob(c, ms[i].params, blob, &bytes, &err) == TOPOS_OK,
        "%s", err.message);
    decode_matches(&ms[i], c, blob);
  }
  topos_client_close(c);
  ex_gpt2_weights_free(&gw);
  ex_llama_weights_free(&lw);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

/* ------------------------------------------------------------ envelope */

/* ‖a − b‖₂ / ‖b‖₂ over every element, both widened to f64. */
static double rel_l2(const topos_tensor *a, const topos_tensor *b) {
  topos_error err = {0};
  topos_tensor *x = topos_tensor_convert(a, TOPOS_F64, &err);
  topos_tensor *y = topos_tensor_convert(b, TOPOS_F64, &err);
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_nonnull(y);
  int64_t n = topos_tensor_count(x);
  ck_assert_int_eq(n, topos_tensor_count(y));
  double *u = malloc(sizeof(double) * (size_t)n);
  double *v = malloc(sizeof(double) * (size_t)n);
  ck_assert_int_eq(topos_tensor_read(x, u, sizeof(double) * (size_t)n, &err),
                   TOPOS_OK);
  ck_assert_int_eq(topos_tensor_read(y, v, sizeof(double) * (size_t)n, &err),
                   TOPOS_OK);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    ck_assert(isfinite(u[i]) && isfinite(v[i]));
    num += (u[i] - v[i]) * (u[i] - v[i]);
    den += v[i] * v[i];
  }
  free(u);
  free(v);
  topos_tensor_release(x);
  topos_tensor_release(y);
  return sqrt(num / den);
}

/* Greedy decoding of `steps` tokens after a 4-token prompt, with the
 * cache: out[steps]. */
static void greedy(const model *m, int steps, int32_t *out) {
  topos_error err = {0};
  int32_t ids[64];
  for (int i = 0; i < 4; i++) ids[i] = tokens[i] % m->vocab;
  ex_kv_cache cache;
  ck_assert_int_eq(ex_kv_cache_init(&cache, m->layers, &err), 0);
  float *lg = malloc(sizeof(float) * (size_t)m->vocab);
  int64_t pos = 0, len = 4;
  for (int s = 0; s < steps; s++) {
    int64_t T = len - pos;
    ex_kv_net net;
    ck_assert_int_eq(m->record(&net, m->w, T, pos, &err), 0);
    ck_assert_msg(ex_kv_run(&net, &ids[pos], &cache, NULL, lg, NULL, &err) == 0,
                  "%s", err.message);
    ex_kv_net_free(&net);
    pos = len;
    uint64_t rng = 1;
    ids[len++] = out[s] = ex_next_token(lg, m->vocab, 0.0, 0, &rng);
  }
  free(lg);
  ex_kv_cache_free(&cache);
}

/* The bf16 model against the f32 model of the same seed: the logits over
 * 16 tokens (relative L2, at most `bound`, and not 0) and 16 greedy steps
 * of each model on its own tokens (printed). */
static void envelope(const char *name, const model *f32, const model *bf16,
                     double bound) {
  topos_tensor *a = full_logits(f32, tokens, 16);
  topos_tensor *b = full_logits(bf16, tokens, 16);
  ck_assert_int_eq(topos_tensor_dtype(a), TOPOS_F32);
  ck_assert_int_eq(topos_tensor_dtype(b), TOPOS_BF16);
  double e = rel_l2(b, a);
  enum { STEPS = 16 };
  int32_t ga[STEPS], gb[STEPS];
  greedy(f32, STEPS, ga);
  greedy(bf16, STEPS, gb);
  int same = 0, prefix = 0;
  for (int s = 0; s < STEPS; s++) same += ga[s] == gb[s];
  while (prefix < STEPS && ga[prefix] == gb[prefix]) prefix++;
  printf(
      "decode_bf16: %s: logits relative L2 %.3g against f32 (bound %.3g); "
      "greedy: %d of %d tokens equal, the first %d in a row\n",
      name, e, bound, same, STEPS, prefix);
  ck_assert_msg(e <= bound, "%s: relative L2 %.3g over %.3g", name, e, bound);
  ck_assert_msg(e > 0, "%s: bf16 equals f32 exactly?", name);
  topos_tensor_release(a);
  topos_tensor_release(b);
}

/* The bound.  One bf16 rounding is at most 2^-9 (about 2e-3) relative,
 * and numerics.md's per-op bf16 envelope is 1e-2.  A decoder rounds its
 * residual stream, its norms, attention and MLP several times per layer,
 * and the roundings are independent, so they add roughly in quadrature,
 * not linearly.  Measured (docs/examples.md): 5.4e-3 to 8.2e-3 for these
 * 2- and 6-layer models, 1.4e-2 for GPT-2 124M and 1.6e-2 for SmolLM-135M's
 * 30 layers.  3e-2, three times the per-op envelope, leaves a factor of
 * 3.5 over the models here. */
static const double BOUND = 3e-2;

START_TEST(gpt2_envelope_against_f32) {
  const ex_gpt2_config cs[2] = {gpt2_tiny, gpt2_deep};
  const char *names[2] = {"gpt2 2 layers, width 32", "gpt2 6 layers, width 64"};
  for (int i = 0; i < 2; i++) {
    ex_gpt2_weights wf, wb;
    gpt2_weights(&wf, cs[i], TOPOS_F32);
    gpt2_weights(&wb, cs[i], TOPOS_BF16);
    model mf = gpt2_model(&wf), mb = gpt2_model(&wb);
    envelope(names[i], &mf, &mb, BOUND);
    ex_gpt2_weights_free(&wf);
    ex_gpt2_weights_free(&wb);
  }
}
END_TEST

START_TEST(llama_envelope_against_f32) {
  const ex_llama_config cs[2] = {llama_tiny, llama_deep};
  const char *names[2] = {"llama 2 layers, width 32",
                          "llama 6 layers, width 64"};
  for (int i = 0; i < 2; i++) {
    ex_llama_weights wf, wb;
    llama_weights(&wf, cs[i], TOPOS_F32);
    llama_weights(&wb, cs[i], TOPOS_BF16);
    model mf = llama_model(&wf), mb = llama_model(&wb);
    envelope(names[i], &mf, &mb, BOUND);
    ex_llama_weights_free(&wf);
    ex_llama_weights_free(&wb);
  }
}
END_TEST

/* ------------------------------------------------------------- weights */

static void temp_path(char *path) {
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
}

/* Each tensor of a converted to dtype equals b's, bit for bit. */
static void converted_equal(topos_tensor *const *a, topos_tensor *const *b,
                            int n, topos_dtype dtype) {
  topos_error err = {0};
  for (int i = 0; i < n; i++) {
    topos_tensor *c = topos_tensor_convert(a[i], dtype, &err);
    ck_assert_msg(topos_tensor_bitwise_equal(c, b[i]), "weight %d differs", i);
    topos_tensor_release(c);
  }
}

START_TEST(gpt2_weights_in_both_dtypes) {
  topos_error err = {0};
  ex_gpt2_weights wf, wb, back;
  gpt2_weights(&wf, gpt2_tiny, TOPOS_F32);
  gpt2_weights(&wb, gpt2_tiny, TOPOS_BF16);
  /* bf16 initialisation is the f32 one rounded once. */
  converted_equal(wf.t, wb.t, wf.n, TOPOS_BF16);
  char f32_path[] = "/tmp/topos-bf16-XXXXXX",
       bf16_path[] = "/tmp/topos-bf16-XXXXXX";
  temp_path(f32_path);
  temp_path(bf16_path);
  ck_assert_int_eq(ex_gpt2_save(&wf, f32_path, &err), 0);
  ck_assert_int_eq(ex_gpt2_save(&wb, bf16_path, &err), 0);
  /* A BF16 file as bf16: the same bits. */
  ex_gpt2_config c = gpt2_tiny;
  ck_assert_msg(ex_gpt2_load(&back, &c, bf16_path, &err) == 0, "%s",
                err.message);
  converted_equal(wb.t, back.t, wb.n, TOPOS_BF16);
  ex_gpt2_weights_free(&back);
  /* An F32 file as bf16: the f32 weights converted. */
  ck_assert_msg(ex_gpt2_load(&back, &c, f32_path, &err) == 0, "%s",
                err.message);
  converted_equal(wf.t, back.t, wf.n, TOPOS_BF16);
  ex_gpt2_weights_free(&back);
  /* A BF16 file as f32: widened exactly. */
  c.dtype = TOPOS_F32;
  ck_assert_msg(ex_gpt2_load(&back, &c, bf16_path, &err) == 0, "%s",
                err.message);
  converted_equal(wb.t, back.t, wb.n, TOPOS_F32);
  ex_gpt2_weights_free(&back);
  /* An F64 weight: refused, naming it. */
  const char **names = calloc((size_t)wf.n, sizeof *names);
  topos_tensor **ts = calloc((size_t)wf.n, sizeof *ts);
  for (int i = 0; i < wf.n; i++) {
    names[i] = wf.names[i];
    ts[i] = wf.t[i];
  }
  topos_tensor *d64 = topos_tensor_convert(wf.t[3], TOPOS_F64, &err);
  ts[3] = d64;
  ck_assert_int_eq(topos_safetensors_save(f32_path, wf.n, names, ts, &err),
                   TOPOS_OK);
  c.dtype = TOPOS_BF16;
  ck_assert_int_eq(ex_gpt2_load(&back, &c, f32_path, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_ptr_nonnull(strstr(err.message, wf.names[3]));
  /* A dtype that is not f32 or bf16: refused. */
  c.dtype = TOPOS_F64;
  ck_assert_int_eq(ex_gpt2_init(&back, &c, 1, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  topos_tensor_release(d64);
  free(names);
  free(ts);
  unlink(f32_path);
  unlink(bf16_path);
  ex_gpt2_weights_free(&wf);
  ex_gpt2_weights_free(&wb);
}
END_TEST

START_TEST(llama_weights_in_both_dtypes) {
  topos_error err = {0};
  ex_llama_weights wf, wb, back;
  llama_weights(&wf, llama_tiny, TOPOS_F32);
  llama_weights(&wb, llama_tiny, TOPOS_BF16);
  converted_equal(wf.t, wb.t, wf.n, TOPOS_BF16);
  char f32_path[] = "/tmp/topos-bf16-XXXXXX",
       bf16_path[] = "/tmp/topos-bf16-XXXXXX";
  temp_path(f32_path);
  temp_path(bf16_path);
  ck_assert_int_eq(ex_llama_save(&wf, f32_path, &err), 0);
  ck_assert_int_eq(ex_llama_save(&wb, bf16_path, &err), 0);
  ex_llama_config c = llama_tiny;
  ck_assert_msg(ex_llama_load(&back, &c, bf16_path, &err) == 0, "%s",
                err.message);
  converted_equal(wb.t, back.t, wb.n, TOPOS_BF16);
  ex_llama_weights_free(&back);
  ck_assert_msg(ex_llama_load(&back, &c, f32_path, &err) == 0, "%s",
                err.message);
  converted_equal(wf.t, back.t, wf.n, TOPOS_BF16);
  ex_llama_weights_free(&back);
  c.dtype = TOPOS_F32;
  ck_assert_msg(ex_llama_load(&back, &c, bf16_path, &err) == 0, "%s",
                err.message);
  converted_equal(wb.t, back.t, wb.n, TOPOS_F32);
  ex_llama_weights_free(&back);
  c.dtype = TOPOS_I32;
  ck_assert_int_eq(ex_llama_init(&back, &c, 1, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_DTYPE);
  unlink(f32_path);
  unlink(bf16_path);
  ex_llama_weights_free(&wf);
  ex_llama_weights_free(&wb);
}
END_TEST

Suite *decode_bf16_suite(void) {
  Suite *s = suite_create("decode_bf16");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, gpt2_decode_equals_full_forward);
  tcase_add_test(tc, llama_decode_equals_full_forward);
  tcase_add_test(tc, remote_decode_equals_in_process);
  tcase_add_test(tc, gpt2_envelope_against_f32);
  tcase_add_test(tc, llama_envelope_against_f32);
  tcase_add_test(tc, gpt2_weights_in_both_dtypes);
  tcase_add_test(tc, llama_weights_in_both_dtypes);
  suite_add_tcase(s, tc);
  return s;
}
