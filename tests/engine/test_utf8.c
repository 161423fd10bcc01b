/*
 * test_utf8.c - engine/utf8.c, the one UTF-8 rule for stored strings:
 * every valid form (1 to 4 bytes, the edges of each range) passes; every
 * malformed one (overlong forms, surrogates, past U+10FFFF, truncated or
 * interrupted sequences, stray continuation bytes, bytes that cannot
 * start a character, NUL) fails at the right byte with the right phrase,
 * reading only the bytes given.  The canonical decoding holds names to
 * the same rule as topos_name.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "topos.h"
#include "utf8.h"

static void expect_valid(const char *s, size_t n) {
  size_t at = 99;
  const char *why = NULL;
  ck_assert_msg(topos_utf8_check(s, n, &at, &why),
                "%zu bytes refused at %zu: %s", n, at, why ? why : "");
}

static void expect_fault(const char *s, size_t n, size_t want_at,
                         const char *phrase) {
  size_t at = 99;
  const char *why = NULL;
  ck_assert_msg(!topos_utf8_check(s, n, &at, &why), "'%.*s' accepted", (int)n,
                s);
  ck_assert_msg(at == want_at, "'%.*s': fault at %zu, want %zu (%s)", (int)n, s,
                at, want_at, why);
  ck_assert_msg(why && strstr(why, phrase), "'%.*s': '%s' lacks '%s'", (int)n,
                s, why ? why : "", phrase);
}

START_TEST(test_valid_forms) {
  expect_valid(NULL, 0);
  expect_valid("", 0);
  expect_valid("loss", 4);
  expect_valid("\x7f", 1);
  expect_valid("\xc2\x80", 2);                          /* U+0080 */
  expect_valid("\xdf\xbf", 2);                          /* U+07FF */
  expect_valid("\xe0\xa0\x80", 3);                      /* U+0800 */
  expect_valid("\xed\x9f\xbf", 3);                      /* U+D7FF */
  expect_valid("\xee\x80\x80", 3);                      /* U+E000 */
  expect_valid("\xef\xbf\xbf", 3);                      /* U+FFFF */
  expect_valid("\xf0\x90\x80\x80", 4);                  /* U+10000 */
  expect_valid("\xf4\x8f\xbf\xbf", 4);                  /* U+10FFFF */
  expect_valid("\xce\xbb_\xe6\x8d\x9f\xe5\xa4\xb1", 9); /* λ_损失 */
  expect_valid("W1 \xf0\x9f\x98\x80 b\xc3\xa9ta", 13);  /* emoji, é */
  /* Only n bytes are read: a prefix ending at a boundary is valid. */
  expect_valid("ab\xff", 2);
  size_t at = 7;
  const char *why = "x";
  ck_assert(topos_utf8_check("ok", 2, NULL, NULL));
  ck_assert(topos_utf8_check("ok", 2, &at, &why));
  ck_assert_uint_eq(at, 7); /* untouched on success */
}
END_TEST

START_TEST(test_malformed_forms) {
  /* Overlong encodings of '/' and of NUL, and at each length's edge. */
  expect_fault("\xc0\xaf", 2, 0, "overlong");
  expect_fault("a\xc0\x80", 3, 1, "overlong");
  expect_fault("\xc1\xbf", 2, 0, "overlong");
  expect_fault("\xe0\x80\xaf", 3, 0, "overlong");
  expect_fault("\xe0\x9f\xbf", 3, 0, "overlong"); /* U+07FF in 3 bytes */
  expect_fault("\xf0\x80\x80\xaf", 4, 0, "overlong");
  expect_fault("\xf0\x8f\xbf\xbf", 4, 0, "overlong"); /* U+FFFF in 4 */
  /* Surrogates U+D800..U+DFFF, alone or as a CESU-8 pair. */
  expect_fault("\xed\xa0\x80", 3, 0, "surrogate");
  expect_fault("xy\xed\xbf\xbf", 5, 2, "surrogate");
  expect_fault("\xed\xa0\xbd\xed\xb8\x80", 6, 0, "surrogate");
  /* Above U+10FFFF: F4 90.., and the leads F5..F7. */
  expect_fault("\xf4\x90\x80\x80", 4, 0, "above U+10FFFF");
  expect_fault("\xf5\x80\x80\x80", 4, 0, "above U+10FFFF");
  expect_fault("\xf7\xbf\xbf\xbf", 4, 0, "above U+10FFFF");
  /* Truncated: the string ends inside a sequence, or an ASCII byte (or
   * NUL) interrupts one. */
  expect_fault("\xc3", 1, 0, "truncated");
  expect_fault("ab\xe6\x8d", 4, 2, "truncated");
  expect_fault("\xf0\x9f\x98", 3, 0, "truncated");
  expect_fault("\xe6\x8dx", 3, 0, "truncated");
  expect_fault("\xc3\x00", 2, 0, "truncated");
  expect_fault("\xce\xbb\xe6\x8d\x9f\xe5\xa4", 7, 5, "truncated");
  /* Bytes that cannot begin a character. */
  expect_fault("\x80", 1, 0, "stray continuation");
  expect_fault("a\xbf", 2, 1, "stray continuation");
  expect_fault("\xc3\xa9\xa9", 3, 2, "stray continuation");
  expect_fault("\xf8\x88\x80\x80\x80", 5, 0, "cannot start");
  expect_fault("\xfe", 1, 0, "cannot start");
  expect_fault("\xff\xfe", 2, 0, "cannot start");
  /* NUL, anywhere. */
  expect_fault("\0", 1, 0, "contains NUL");
  expect_fault("loss\0x", 6, 4, "contains NUL");
  expect_fault("\xce\xbb\0", 3, 2, "contains NUL");
  /* Every phrase but NUL's says "not valid UTF-8". */
  const char *why = NULL;
  ck_assert(!topos_utf8_check("\xed\xa0\x80", 3, NULL, &why));
  ck_assert_ptr_nonnull(strstr(why, "not valid UTF-8"));
}
END_TEST

/* Every 1- and 2-byte string, against a reference decoder written
 * differently: the table of RFC 3629's well-formed sequences. */
static bool reference_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c == 0) return false;
    if (c < 0x80) {
      i++;
      continue;
    }
    unsigned lo = 0x80, hi = 0xBF;
    size_t len;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c == 0xE0)
      len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      len = 3;
    else if (c == 0xED)
      len = 3, hi = 0x9F;
    else if (c == 0xF0)
      len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      len = 4;
    else if (c == 0xF4)
      len = 4, hi = 0x8F;
    else
      return false;
    if (i + len > n) return false;
    if (s[i + 1] < lo || s[i + 1] > hi) return false;
    for (size_t k = 2; k < len; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
    i += len;
  }
  return true;
}

START_TEST(test_against_reference) {
  unsigned char b[4];
  for (unsigned a = 0; a < 256; a++) {
    b[0] = (unsigned char)a;
    ck_assert_msg(
        topos_utf8_check((char *)b, 1, NULL, NULL) == reference_valid(b, 1),
        "%02x", a);
    for (unsigned c = 0; c < 256; c++) {
      b[1] = (unsigned char)c;
      ck_assert_msg(
          topos_utf8_check((char *)b, 2, NULL, NULL) == reference_valid(b, 2),
          "%02x %02x", a, c);
    }
  }
  /* Every 3-byte string with a lead E0..EF and 4-byte strings with lead
   * F0..F4, over the boundary second bytes. */
  const unsigned seconds[] = {0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0};
  for (unsigned a = 0xE0; a <= 0xF4; a++)
    for (size_t j = 0; j < sizeof seconds / sizeof *seconds; j++)
      for (unsigned c = 0x7F; c <= 0xC0; c++) {
        b[0] = (unsigned char)a;
        b[1] = (unsigned char)seconds[j];
        b[2] = (unsigned char)c;
        b[3] = 0x80;
        size_t n = a < 0xF0 ? 3 : 4;
        ck_assert_msg(
            topos_utf8_check((char *)b, n, NULL, NULL) == reference_valid(b, n),
            "%02x %02x %02x", a, seconds[j], c);
      }
}
END_TEST

/* The canonical decoding refuses a stored name that is not UTF-8 or that
 * holds a NUL (which a C string would silently shorten). */
START_TEST(test_decode_names) {
  topos_error err = {0};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *z = topos_tensor_scalar(TOPOS_F64, 0, &err);
  topos_value w = topos_name(t, topos_parameter(t, z), "wqzq");
  topos_name(t, topos_mul(t, w, w), "\xce\xbb_\xe6\x8d\x9f");
  topos_tensor_release(z);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(topos_network_encode(net, &bytes, &len, &err), TOPOS_OK);
  /* The valid multi-byte name survives a decode. */
  topos_network *back = topos_network_decode(bytes, len, &err);
  ck_assert_msg(back != NULL, "%s", err.message);
  ck_assert_int_eq(topos_network_find(back, "\xce\xbb_\xe6\x8d\x9f").index, 1);
  topos_network_release(back);
  uint8_t *at = memmem(bytes, len, "wqzq", 4);
  ck_assert_ptr_nonnull(at);
  struct {
    const char *patch, *expect;
  } bad[] = {
      {"wq\0q", "decode: node 0: name of 4 bytes: contains NUL at byte 2"},
      {"w\xc0\x80q", "overlong encoding) at byte 1"},
      {"wq\xed\xa0", "truncated sequence) at byte 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memcpy(at, bad[i].patch, 4);
    err = (topos_error){0};
    ck_assert_ptr_null(topos_network_decode(bytes, len, &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_CORRUPT);
    ck_assert_msg(strstr(err.message, bad[i].expect) != NULL, "%zu: %s", i,
                  err.message);
  }
  topos_free(bytes);
  topos_network_release(net);
}
END_TEST

Suite *utf8_suite(void) {
  Suite *s = suite_create("utf8");
  TCase *tc = tcase_create("check");
  tcase_add_test(tc, test_valid_forms);
  tcase_add_test(tc, test_malformed_forms);
  tcase_add_test(tc, test_against_reference);
  tcase_add_test(tc, test_decode_names);
  suite_add_tcase(s, tc);
  return s;
}
