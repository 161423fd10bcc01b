/*
 * make_corpus.c - writes the fuzzer's seed corpus: the canonical encoding
 * of each real network of tests/engine/sample_nets.h (the seed's
 * gradient-descent net, an MLP with cross-entropy, a conv2d + max_pool2d
 * net, a net using every op) and of an empty network, one file each, into
 * the directory argv[1].  Exits 1 with a message on any failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../engine/sample_nets.h"
#include "topos.h"

static int write_spec(const char *dir, const char *name, topos_network *net) {
  if (!net) {
    fprintf(stderr, "make_corpus: %s did not record\n", name);
    return 1;
  }
  topos_error err = {0};
  uint8_t *bytes = NULL;
  size_t len = 0;
  int rc = topos_network_encode(net, &bytes, &len, &err);
  topos_network_release(net);
  if (rc != TOPOS_OK) {
    fprintf(stderr, "make_corpus: %s: %s\n", name, err.message);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.spec", dir, name);
  FILE *f = fopen(path, "wb");
  int bad = !f || fwrite(bytes, 1, len, f) != len;
  if (f && fclose(f) != 0) bad = 1;
  topos_free(bytes);
  if (bad) {
    fprintf(stderr, "make_corpus: cannot write %s\n", path);
    return 1;
  }
  printf("%s: %zu bytes\n", path, len);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_corpus DIRECTORY\n");
    return 2;
  }
  int failed = 0;
  for (int i = 0; i < SN_NSAMPLES; i++)
    failed |= write_spec(argv[1], sn_samples[i].name, sn_samples[i].build());
  failed |= write_spec(argv[1], "empty",
                       topos_tape_seal(topos_tape_new(TOPOS_F32), NULL));
  return failed;
}
