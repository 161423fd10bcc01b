/*
 * fuzz_decode.c - libFuzzer target for the spec decoder (`make fuzz`).
 *
 * Any input either fails to decode with a message, or decodes to a
 * network that re-encodes to exactly the input (the encoding is
 * canonical; a format 1 input re-encodes as format 2, which must then be
 * canonical itself), whose id is stable and is the SHA-256 of its
 * encoding, and
 * whose three describe forms succeed (JSON that cJSON parses back).  Any
 * other outcome aborts, which libFuzzer reports as a crash; ASan and
 * UBSan catch the rest.  Everything is freed, so leaks are reported too.
 */
#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topos.h"

static void check(int ok, const char *what, const topos_error *err) {
  if (ok) return;
  fprintf(stderr, "fuzz_decode: %s (%s)\n", what,
          err && err->message[0] ? err->message : "no message");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  topos_error err = {0};
  topos_network *net = topos_network_decode(data, size, &err);
  if (!net) {
    check(err.code != TOPOS_OK && err.message[0] != '\0',
          "a refusal without a code and a message", &err);
    return 0;
  }

  uint8_t *bytes = NULL;
  size_t len = 0;
  check(topos_network_encode(net, &bytes, &len, &err) == TOPOS_OK,
        "a decoded network does not encode", &err);
  /* Format 1 is still read, and re-encodes as format 2: then the
   * re-encoding must itself be canonical (decode, encode, same bytes). */
  bool v1 = size >= 6 && data[4] == 1 && data[5] == 0;
  if (!v1) {
    check(len == size && memcmp(bytes, data, size) == 0,
          "re-encoding differs from the input", NULL);
  } else {
    check(len >= 6 && bytes[4] == 2 && bytes[5] == 0,
          "a format 1 input does not re-encode as format 2", NULL);
    topos_network *again = topos_network_decode(bytes, len, &err);
    check(again != NULL, "the format 2 re-encoding does not decode", &err);
    uint8_t *b3 = NULL;
    size_t l3 = 0;
    check(topos_network_encode(again, &b3, &l3, &err) == TOPOS_OK,
          "the format 2 network does not encode", &err);
    check(l3 == len && memcmp(b3, bytes, len) == 0,
          "the format 2 re-encoding is not canonical", NULL);
    topos_free(b3);
    topos_network_release(again);
  }

  char id1[65], id2[65], hash[65];
  check(topos_network_id(net, id1, &err) == TOPOS_OK, "id failed", &err);
  check(topos_network_id(net, id2, &err) == TOPOS_OK, "id failed", &err);
  topos_sha256_hex(bytes, len, hash);
  check(strcmp(id1, id2) == 0, "the id is not stable", NULL);
  check(strcmp(id1, hash) == 0, "the id is not the hash of the bytes", NULL);

  /* Decoded names and attributes are attacker-chosen: every describe form
   * must cope, and the JSON must stay valid. */
  for (int f = TOPOS_FORMAT_TEXT; f <= TOPOS_FORMAT_DOT; f++) {
    char *s = topos_network_describe(net, (topos_format)f, &err);
    check(s != NULL, "describe failed", &err);
    if (f == TOPOS_FORMAT_JSON) {
      cJSON *j = cJSON_Parse(s);
      check(j != NULL, "describe's JSON does not parse", NULL);
      cJSON_Delete(j);
    }
    topos_free(s);
  }

  topos_free(bytes);
  topos_network_release(net);
  return 0;
}
