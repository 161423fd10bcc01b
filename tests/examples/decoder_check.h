/*
 * decoder_check.h - what the decoder suites share (test_gpt2.c,
 * test_llama.c, test_decode_bf16.c): a network run over a whole prefix,
 * rows compared bit for bit, and the PyTorch reference's plumbing.  Each
 * suite includes it once; the functions are static inline.
 */
#ifndef TOPOS_TESTS_DECODER_CHECK_H
#define TOPOS_TESTS_DECODER_CHECK_H

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "decoder.h"

/* Runs net (recorded for n tokens after no cache, `layers` layers) on
 * tok[n] from an empty cache: the logits [n, V], retained. */
static inline topos_tensor *run_prefix(ex_kv_net *net, int layers,
                                       const int32_t *tok, int64_t n) {
  topos_error err = {0};
  ex_kv_cache c;
  ck_assert_int_eq(ex_kv_cache_init(&c, layers, &err), 0);
  topos_tensor *all = NULL;
  ck_assert_msg(ex_kv_run(net, tok, &c, NULL, NULL, &all, &err) == 0, "%s",
                err.message);
  ck_assert_int_eq(c.len, n);
  ex_kv_cache_free(&c);
  ex_kv_net_free(net);
  return all;
}

/* Row r of logits [n, V] against a [k, V] tensor's row q, bit for bit. */
static inline void same_row(const topos_tensor *a, int64_t r,
                            const topos_tensor *b, int64_t q,
                            const char *what) {
  topos_error err = {0};
  topos_tensor *x = topos_tensor_narrow(a, 0, r, 1, &err);
  topos_tensor *y = topos_tensor_narrow(b, 0, q, 1, &err);
  ck_assert_msg(topos_tensor_bitwise_equal(x, y), "%s: row %lld differs", what,
                (long long)r);
  topos_tensor_release(x);
  topos_tensor_release(y);
}

/* Debian's python3 when it imports torch (python3-torch, `make deps`),
 * or NULL. */
static inline const char *torch_python(void) {
  static const char path[] = "/usr/bin/python3";
  if (access(path, X_OK) != 0) return NULL;
  return system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0
             ? path
             : NULL;
}

/* The relative L2 error of got[n] against DIR/NAME: n raw little-endian
 * floats (f64 false) or doubles (f64 true). */
static inline double rel_l2_file(const float *got, const char *dir,
                                 const char *name, size_t n, bool f64) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t size = f64 ? sizeof(double) : sizeof(float);
  unsigned char *want = malloc(n * size);
  ck_assert_ptr_nonnull(want);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s missing", path);
  ck_assert_uint_eq(fread(want, size, n, f), n);
  fclose(f);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double w = f64 ? ((const double *)(const void *)want)[i]
                   : (double)((const float *)(const void *)want)[i];
    num += ((double)got[i] - w) * ((double)got[i] - w);
    den += w * w;
  }
  free(want);
  return sqrt(num / den);
}

#endif /* TOPOS_TESTS_DECODER_CHECK_H */
