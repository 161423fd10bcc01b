/*
 * test_bpe.c - GPT-2's byte-level BPE tokenizer (examples/common/bpe.c)
 * against the released vocabulary in data/gpt2.
 *
 * What must hold: every line of data/gpt2/vectors.jsonl (ids from the
 * gpt-3-encoder package) encodes to exactly its ids and decodes back; the
 * REFERENCE table below, ids from OpenAI's encoder.py run with the
 * `regex` module (arbitrary bytes read with Python's "surrogateescape",
 * bpe.h's rule for invalid UTF-8), covers contractions, space runs,
 * Unicode spaces, other scripts' digits, combining marks, emoji, NULs and
 * invalid UTF-8; decode(encode(x)) == x for random byte strings; a text
 * encodes as its parts do when cut where pieces end anyway (which checks
 * the per-call cache); merges go in encoder.py's rounds, on a vocabulary
 * the suite writes; and malformed files, bad ids and NULLs are refused.
 */
#include <cJSON.h>
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "ex.h"
#include "scratch_dir.h"

/* ------------------------------------------------------------- fixtures */

static ex_bpe *g_bpe;
static topos_error g_load_err;
static char g_data[1024]; /* data/gpt2, found as ex_find_data finds it */

/* Once per test case: the real vocabulary (about 20 ms, longer under
 * sanitizers), shared by the forked tests. */
static void load_gpt2(void) {
  ex_find_data(NULL, "data/gpt2", g_data, sizeof g_data);
  g_bpe = ex_bpe_load(g_data, &g_load_err);
}

static void free_gpt2(void) {
  ex_bpe_free(g_bpe);
  g_bpe = NULL;
}

static const ex_bpe *gpt2(void) {
  ck_assert_msg(g_bpe != NULL, "loading %s: %s", g_data, g_load_err.message);
  return g_bpe;
}

static void setup(void) {
  scratch_dir_make("topos-bpe");
}
static void teardown(void) {
  scratch_dir_remove();
}

/* -------------------------------------------------------------- helpers */

/* The ids of n bytes of text (new), asserting success. */
static int32_t *encode(const ex_bpe *b, const char *text, size_t n,
                       size_t *count) {
  topos_error err = {0};
  int32_t *ids = NULL;
  int rc = ex_bpe_encode(b, text, n, &ids, count, &err);
  ck_assert_msg(rc == 0, "encode: %s", err.message);
  ck_assert_ptr_nonnull(ids);
  return ids;
}

/* decode(encode(text)) must give text back, byte for byte. */
static void assert_round_trip(const ex_bpe *b, const char *text, size_t n) {
  size_t count = 0, len = 0;
  int32_t *ids = encode(b, text, n, &count);
  char *back = NULL;
  topos_error err = {0};
  ck_assert_msg(ex_bpe_decode(b, ids, count, &back, &len, &err) == 0,
                "decode: %s", err.message);
  ck_assert_msg(len == n && memcmp(back, text, n) == 0,
                "round trip of %zu bytes gave %zu", n, len);
  ck_assert_int_eq(back[len], '\0');
  free(back);
  free(ids);
}

static void assert_ids(const ex_bpe *b, const char *what, const char *text,
                       size_t n, const int32_t *want, size_t nwant) {
  size_t count = 0;
  int32_t *ids = encode(b, text, n, &count);
  ck_assert_msg(count == nwant, "%s: %zu ids, want %zu", what, count, nwant);
  for (size_t i = 0; i < count; i++)
    ck_assert_msg(ids[i] == want[i], "%s: id %zu is %d, want %d", what, i,
                  (int)ids[i], (int)want[i]);
  free(ids);
  assert_round_trip(b, text, n);
}

static void write_file(const char *name, const void *bytes, size_t n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static void write_text(const char *name, const char *text) {
  write_file(name, text, strlen(text));
}

/* The whole of data/gpt2/<name> (new, NUL-terminated). */
static char *read_data(const char *name, size_t *n) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", g_data, name);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long size = ftell(f);
  ck_assert_int_ge(size, 0);
  rewind(f);
  char *s = malloc((size_t)size + 1);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_eq(fread(s, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  s[size] = '\0';
  *n = (size_t)size;
  return s;
}

/* Loading g_dir must fail with code, the message holding `part`. */
static void assert_load_fails(int code, const char *part) {
  topos_error err = {0};
  ex_bpe *b = ex_bpe_load(g_dir, &err);
  ck_assert_msg(b == NULL, "loaded a vocabulary that should fail (%s)", part);
  ck_assert_msg(err.code == code, "code %d (%s), want %d", err.code,
                err.message, code);
  ck_assert_msg(strstr(err.message, part) != NULL,
                "message \"%s\" lacks \"%s\"", err.message, part);
}

/* --------------------------------------------------- a tiny vocabulary */

/* GPT-2's bytes_to_unicode, written again here: the printable bytes
 * stand for themselves, the other 68 for U+0100 + n in byte order. */
static unsigned alphabet(unsigned byte) {
  unsigned n = 0;
  for (unsigned c = 0; c < 256; c++) {
    bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
                     (c >= 0xAE && c <= 0xFF);
    if (c == byte) return printable ? c : 0x100 + n;
    if (!printable) n++;
  }
  return 0;
}

/* Appends the JSON string of byte token b (UTF-8, escaped) to s. */
static void append_byte_key(char *s, unsigned b) {
  unsigned u = alphabet(b);
  char *p = s + strlen(s);
  *p++ = '"';
  if (u == '"' || u == '\\') *p++ = '\\';
  if (u < 0x80) {
    *p++ = (char)u;
  } else {
    *p++ = (char)(0xC0 | u >> 6);
    *p++ = (char)(0x80 | (u & 0x3F));
  }
  *p++ = '"';
  *p = '\0';
}

/*
 * Writes encoder.json: the first `bytes` single-byte tokens (id = byte),
 * then `extra` (JSON members such as "\"ab\": 256", comma-separated, or
 * ""), and vocab.bpe as given.
 */
static void write_tiny(unsigned bytes, const char *extra, const char *merges) {
  size_t cap = 8192 + strlen(extra);
  char *json = malloc(cap);
  ck_assert_ptr_nonnull(json);
  strcpy(json, "{");
  for (unsigned b = 0; b < bytes; b++) {
    append_byte_key(json, b);
    snprintf(json + strlen(json), cap - strlen(json), ": %u,", b);
  }
  json[strlen(json) - 1] = '\0'; /* the last comma: extra brings its own */
  snprintf(json + strlen(json), cap - strlen(json), "%s}", extra);
  write_text("encoder.json", json);
  write_text("vocab.bpe", merges);
  free(json);
}

static ex_bpe *load_tiny(void) {
  topos_error err = {0};
  ex_bpe *b = ex_bpe_load(g_dir, &err);
  ck_assert_msg(b != NULL, "tiny vocabulary: %s", err.message);
  return b;
}

/* ------------------------------------------------------ the vocabulary */

START_TEST(test_vocab_size_and_known_ids) {
  const ex_bpe *b = gpt2();
  ck_assert_int_eq(ex_bpe_vocab_size(b), 50257);
  ck_assert_int_eq(ex_bpe_vocab_size(NULL), -1);
  assert_ids(b, "Hello", "Hello", 5, (const int32_t[]){15496}, 1);
  assert_ids(b, " world", " world", 6, (const int32_t[]){995}, 1);
  assert_ids(b, "newline", "\n", 1, (const int32_t[]){198}, 1);
  assert_ids(b, "space", " ", 1, (const int32_t[]){220}, 1);
  /* The end-of-text marker is only a token when asked for by id. */
  assert_ids(b, "<|endoftext|>", "<|endoftext|>", 13,
             (const int32_t[]){27, 91, 437, 1659, 5239, 91, 29}, 7);
  char *text = NULL;
  size_t len = 0;
  topos_error err = {0};
  ck_assert_int_eq(
      ex_bpe_decode(b, (const int32_t[]){50256}, 1, &text, &len, &err), 0);
  ck_assert_str_eq(text, "<|endoftext|>");
  ck_assert_uint_eq(len, 13);
  free(text);
}
END_TEST

START_TEST(test_vectors_file) {
  const ex_bpe *b = gpt2();
  size_t size = 0;
  char *all = read_data("vectors.jsonl", &size);
  int lines = 0;
  for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *v = cJSON_Parse(line);
    ck_assert_msg(v != NULL, "vectors.jsonl:%d: not JSON", lines + 1);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(v, "text");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(v, "ids");
    ck_assert(cJSON_IsString(text) && cJSON_IsArray(want));
    size_t n = (size_t)cJSON_GetArraySize(want), i = 0;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    ck_assert_ptr_nonnull(ids);
    for (const cJSON *e = want->child; e != NULL; e = e->next)
      ids[i++] = (int32_t)e->valueint;
    char what[64];
    snprintf(what, sizeof what, "vectors.jsonl:%d", lines + 1);
    assert_ids(b, what, text->valuestring, strlen(text->valuestring), ids, n);
    /* ... and the ids decode to the text. */
    char *back = NULL;
    size_t len = 0;
    topos_error err = {0};
    ck_assert_int_eq(ex_bpe_decode(b, ids, n, &back, &len, &err), 0);
    ck_assert_str_eq(back, text->valuestring);
    free(back);
    free(ids);
    cJSON_Delete(v);
    lines++;
  }
  ck_assert_int_ge(lines, 10);
  free(all);
}
END_TEST

/* Ids from OpenAI's encoder.py run with the `regex` module (whose Unicode
 * tables class every character here as bpe_unicode.c does), the bytes
 * read with "surrogateescape".  "separators 1c-1f": `regex`'s \s, unlike
 * `re`'s, leaves out U+001C..U+001F. */
static const struct {
  const char *name, *text;
  size_t len;
  int32_t ids[48];
  size_t n;
} REFERENCE[] = {
    /* clang-format off */
    {"contractions",
     "I'm sure they're fine; we'll see, she'd say, it's 'S and 'LL too", 64,
     {40, 1101, 1654, 484, 821, 3734, 26, 356, 1183, 766, 11, 673, 1549,
     910, 11, 340, 338, 705, 50, 290, 705, 3069, 1165},
     23},
    {"upper contractions",
     "IT'S DON'T WE'LL I'M they'Re IT'SS", 34,
     {2043, 6, 50, 23917, 6, 51, 12887, 6, 3069, 314, 6, 44, 484, 6, 3041,
     7283, 6, 5432},
     18},
    {"apostrophes",
     "''s 'x rock'n'roll ' s'", 23,
     {7061, 82, 705, 87, 3881, 6, 77, 6, 2487, 705, 264, 6},
     12},
    {"space runs",
     "a  b   c\n\n hello\t\tworld \n", 25,
     {64, 220, 275, 220, 220, 269, 628, 23748, 197, 197, 6894, 220, 198},
     13},
    {"trailing spaces",
     "end   ", 6,
     {437, 220, 220, 220},
     4},
    {"only spaces",
     "     ", 5,
     {220, 220, 220, 220, 220},
     5},
    {"crlf",
     "line one\r\nline two\r\n\r\n", 22,
     {1370, 530, 201, 198, 1370, 734, 201, 198, 201, 198},
     10},
    {"unicode spaces",
     "a\302\240b \343\200\200c\302\205d\342\200\250e \302\240 f", 21,
     {64, 1849, 65, 220, 5099, 222, 66, 126, 227, 67, 447, 101, 68, 5624,
     277},
     15},
    {"separators 1c-1f",
     "a\034b \035\036 c\037", 9,
     {64, 216, 65, 220, 217, 218, 269, 219},
     8},
    {"punctuation",
     "Hello\?! (yes) -- [no]... {maybe}; #tag @user $5.00 100%", 55,
     {15496, 12248, 357, 8505, 8, 1377, 685, 3919, 60, 986, 1391, 25991,
     19629, 1303, 12985, 2488, 7220, 720, 20, 13, 405, 1802, 4},
     23},
    {"digits",
     "12345678901234567890 3.14159 0x1F 1e-6 2026-12-01", 49,
     {10163, 2231, 3134, 4531, 486, 1954, 2231, 30924, 3829, 513, 13, 1415,
     19707, 657, 87, 16, 37, 352, 68, 12, 21, 1160, 2075, 12, 1065, 12, 486},
     27},
    {"other digits",
     "\331\243\331\244\331\245 \340\245\251\340\245\252\340\245\253 \357"
     "\274\221\357\274\222\357\274\223 \342\205\253 x\302\262 \302\275 "
     "\340\257\260", 41,
     {149, 96, 149, 97, 149, 98, 220, 24231, 102, 24231, 103, 24231, 104,
     27332, 120, 239, 171, 120, 240, 171, 120, 241, 2343, 227, 104, 2124,
     31185, 25208, 220, 156, 107, 108},
     32},
    {"combining marks",
     "e\314\201 cafe\314\201 a\314\210\314\243 \314\201x", 20,
     {68, 136, 223, 26725, 136, 223, 257, 136, 230, 136, 96, 220, 136, 223,
     87},
     15},
    {"cjk",
     "\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202"
     "\255\343\202\271\343\203\210\343\201\250\344\270\255\346\226\207\345"
     "\255\227\347\254\246\357\274\214\355\225\234\352\265\255\354\226\264"
     " \353\254\270\354\236\245", 58,
     {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302, 30201,
     40792, 23877, 229, 27764, 245, 163, 105, 99, 171, 120, 234, 47991,
     250, 166, 113, 255, 168, 244, 112, 31619, 105, 116, 168, 252, 98},
     36},
    {"arabic hebrew",
     "\331\205\330\261\330\255\330\250\330\247 \330\250\330\247\331\204"
     "\330\271\330\247\331\204\331\205 \327\251\327\234\327\225\327\235 "
     "\327\242\327\225\327\234\327\235", 43,
     {25405, 26897, 148, 255, 39848, 12919, 17550, 101, 23525, 44690, 23525,
     25405, 14360, 102, 40010, 27072, 147, 251, 14360, 95, 27072, 40010,
     147, 251},
     24},
    {"cyrillic greek",
     "\320\237\321\200\320\270\320\262\320\265\321\202, \320\274\320\270"
     "\321\200! \316\223\316\265\316\271\316\254 \317\203\316\277\317\205 "
     "\316\232\317\214\317\203\316\274\316\265", 48,
     {140, 253, 21169, 18849, 38857, 16843, 20375, 11, 12466, 120, 18849,
     21169, 0, 7377, 241, 30950, 29945, 138, 105, 18074, 225, 26517, 139,
     227, 7377, 248, 139, 234, 38392, 34703, 30950},
     31},
    {"emoji",
     "\360\237\231\202 \360\237\221\215\360\237\217\275 \360\237\221\250"
     "\342\200\215\360\237\221\251\342\200\215\360\237\221\247 \360\237"
     "\207\253\360\237\207\267!", 42,
     {8582, 25081, 50169, 235, 8582, 237, 121, 50169, 101, 447, 235, 41840,
     102, 447, 235, 41840, 100, 12520, 229, 104, 8582, 229, 115, 0},
     24},
    {"nuls",
     "a\000b\000\000 \000", 7,
     {64, 188, 65, 188, 188, 220, 188},
     7},
    {"invalid utf-8",
     "\377\376 ab\200cd \303 caf\303 \342\202 x", 20,
     {187, 186, 450, 222, 10210, 6184, 19945, 127, 2343, 224, 2124},
     11},
    {"overlong and surrogates",
     "\300\257 \340\200\257 \355\240\200 \364\220\200\200 \370\210 x\301"
     "\201y z\340\201\201w q\360\200\201\201r", 36,
     {124, 107, 220, 156, 222, 107, 220, 169, 254, 222, 220, 176, 238, 222,
     222, 220, 180, 230, 2124, 125, 223, 88, 1976, 156, 223, 223, 86,
     10662, 172, 222, 223, 223, 81},
     33},
    {"truncated at end",
     "word \360\237\231", 8,
     {4775, 12520, 247},
     3},
    {"endoftext as text",
     "<|endoftext|>", 13,
     {27, 91, 437, 1659, 5239, 91, 29},
     7},
    {"long word",
     "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentar"
     "ianism", 74,
     {47, 25668, 261, 25955, 859, 2500, 1416, 404, 873, 41896, 709, 349,
     5171, 36221, 42960, 1885, 29207, 44390, 3699, 1042},
     20},
    {"code",
     "int main(void) {\n    return x->y[0] != NULL \? 1 : -1;\n}\n", 56,
     {600, 1388, 7, 19382, 8, 1391, 198, 220, 220, 220, 1441, 2124, 3784,
     88, 58, 15, 60, 14512, 15697, 5633, 352, 1058, 532, 16, 26, 198, 92,
     198},
     28},
    /* clang-format on */
};

START_TEST(test_reference_encoder) {
  const ex_bpe *b = gpt2();
  for (size_t i = 0; i < sizeof REFERENCE / sizeof REFERENCE[0]; i++)
    assert_ids(b, REFERENCE[i].name, REFERENCE[i].text, REFERENCE[i].len,
               REFERENCE[i].ids, REFERENCE[i].n);
}
END_TEST

START_TEST(test_empty_and_single_bytes) {
  const ex_bpe *b = gpt2();
  size_t count = 99;
  int32_t *ids = encode(b, NULL, 0, &count);
  ck_assert_uint_eq(count, 0);
  free(ids);
  ids = encode(b, "", 0, &count);
  ck_assert_uint_eq(count, 0);
  char *text = NULL;
  size_t len = 99;
  topos_error err = {0};
  ck_assert_int_eq(ex_bpe_decode(b, ids, 0, &text, &len, &err), 0);
  ck_assert_uint_eq(len, 0);
  ck_assert_str_eq(text, "");
  free(text);
  free(ids);
  /* Each byte alone is one token, whatever it is. */
  for (int c = 0; c < 256; c++) {
    char byte = (char)c;
    ids = encode(b, &byte, 1, &count);
    ck_assert_uint_eq(count, 1);
    free(ids);
    assert_round_trip(b, &byte, 1);
  }
}
END_TEST

START_TEST(test_char_classes) {
  static const struct {
    uint32_t cp;
    ex_bpe_class cls;
  } want[] = {
      {'a', EX_BPE_LETTER},     {'Z', EX_BPE_LETTER},
      {'7', EX_BPE_NUMBER},     {' ', EX_BPE_SPACE},
      {'\t', EX_BPE_SPACE},     {'\v', EX_BPE_SPACE},
      {0x1C, EX_BPE_OTHER},     {0x1F, EX_BPE_OTHER},
      {'\'', EX_BPE_OTHER},     {0, EX_BPE_OTHER},
      {0x85, EX_BPE_SPACE},     {0xA0, EX_BPE_SPACE},
      {0xAA, EX_BPE_LETTER},    {0xB2, EX_BPE_NUMBER},
      {0xBD, EX_BPE_NUMBER},    {0x1680, EX_BPE_SPACE},
      {0x200B, EX_BPE_OTHER},   {0x2028, EX_BPE_SPACE},
      {0x3000, EX_BPE_SPACE},   {0xFEFF, EX_BPE_OTHER},
      {0x0301, EX_BPE_OTHER},   {0x0663, EX_BPE_NUMBER},
      {0x0969, EX_BPE_NUMBER},  {0x216B, EX_BPE_NUMBER},
      {0x3007, EX_BPE_NUMBER},  {0x01C5, EX_BPE_LETTER},
      {0x02B0, EX_BPE_LETTER},  {0x4E00, EX_BPE_LETTER},
      {0x0627, EX_BPE_LETTER},  {0xAC00, EX_BPE_LETTER},
      {0x20000, EX_BPE_LETTER}, {0x1F642, EX_BPE_OTHER},
      {0xD800, EX_BPE_OTHER},   {0xDCFF, EX_BPE_OTHER},
      {0xE000, EX_BPE_OTHER},   {0x10FFFF, EX_BPE_OTHER},
      {0x110000, EX_BPE_OTHER}, {UINT32_MAX, EX_BPE_OTHER},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(ex_bpe_char_class(want[i].cp) == want[i].cls,
                  "U+%04X: class %d, want %d", (unsigned)want[i].cp,
                  (int)ex_bpe_char_class(want[i].cp), (int)want[i].cls);
  ck_assert_int_gt((int)strlen(ex_bpe_unicode_version), 0);
}
END_TEST

/* ------------------------------------------------------------ round trips */

/* Fragments the random texts are drawn from: words, contractions, space
 * runs, scripts, marks, emoji, digits of several scripts, and bytes that
 * are not UTF-8. */
static const char *const FRAGMENTS[] = {
    "hello",
    "World",
    "it",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "don't",
    " ",
    "  ",
    "     ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    "'",
    "!",
    "?!",
    "...",
    "--",
    "123",
    "3.14",
    "0x1F",
    "naïve",
    "café",
    "日本語",
    "中文",
    "こんにちは",
    "한국어",
    "مرحبا",
    "שלום",
    "Привет",
    "Ελληνικά",
    "🙂",
    "👍🏽",
    "👨‍👩‍👧",
    "e\xcc\x81",
    "a\xcc\x88\xcc\xa3",
    "٣٤٥",
    "३४",
    "１２３",
    "Ⅻ",
    "²",
    "½",
    "\xc2\xa0",
    "\xe3\x80\x80",
    "\xc2\x85",
    "\xe2\x80\xa8",
    "\x1c",
    "\xef\xbb\xbf",
    "\xff",
    "\x80",
    "\xc0\xaf",
    "\xed\xa0\x80",
    "\xf4\x90\x80\x80",
    "\xe2\x82",
    "\xf0\x9f",
    "\xc3",
    "\xfe",
};

/* A random text of up to max bytes into buf; its length. */
static size_t random_text(uint64_t *rng, char *buf, size_t max) {
  size_t n = 0, want = next_random(rng) % (max + 1);
  while (n < want) {
    uint64_t r = next_random(rng);
    if (r % 8 == 0) { /* raw bytes, NULs among them */
      size_t k = 1 + (r >> 8) % 6;
      for (size_t i = 0; i < k && n < max; i++)
        buf[n++] = (char)(next_random(rng) & 0xFF);
    } else {
      const char *f =
          FRAGMENTS[(r >> 8) % (sizeof FRAGMENTS / sizeof FRAGMENTS[0])];
      size_t k = strlen(f);
      if (n + k > max) break;
      memcpy(buf + n, f, k);
      n += k;
    }
  }
  return n;
}

START_TEST(test_round_trip_random) {
  const ex_bpe *b = gpt2();
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  char buf[4096];
  for (int t = 0; t < 3000; t++) {
    size_t n = random_text(&rng, buf, t < 2000 ? 200 : sizeof buf);
    assert_round_trip(b, buf, n);
  }
  /* Uniform bytes: mostly invalid UTF-8. */
  for (int t = 0; t < 200; t++) {
    size_t n = next_random(&rng) % sizeof buf;
    for (size_t i = 0; i < n; i++) buf[i] = (char)(next_random(&rng) & 0xFF);
    assert_round_trip(b, buf, n);
  }
}
END_TEST

/* One piece of 200 KB merges in n log n: a run of letters, of spaces, of
 * digits and of others (each its own piece), and the ids are what the
 * reference gives for the regular ones. */
START_TEST(test_long_pieces) {
  const ex_bpe *b = gpt2();
  size_t n = 200000, count = 0;
  char *s = malloc(n + 1);
  ck_assert_ptr_nonnull(s);
  memset(s, 'a', n);
  int32_t *ids = encode(b, s, n, &count);
  ck_assert_uint_eq(count, n / 4); /* "aaaa" is 24794 */
  for (size_t i = 0; i < count; i++) ck_assert_int_eq(ids[i], 24794);
  free(ids);
  memset(s, ' ', n);
  s[n - 1] = 'x'; /* n - 2 spaces, then " x" */
  ids = encode(b, s, n, &count);
  ck_assert_uint_eq(count, n - 1);
  ck_assert_int_eq(ids[0], 220);
  ck_assert_int_eq(ids[count - 1], 2124);
  free(ids);
  uint64_t rng = 42;
  for (size_t i = 0; i < n; i++) s[i] = "acgt"[next_random(&rng) % 4];
  assert_round_trip(b, s, n);
  for (size_t i = 0; i < n; i++) s[i] = (char)('0' + next_random(&rng) % 10);
  assert_round_trip(b, s, n);
  for (size_t i = 0; i < n; i++) s[i] = "!?.,;:-"[next_random(&rng) % 7];
  assert_round_trip(b, s, n);
  free(s);
}
END_TEST

/* A text cut where a piece ends anyway (after a '.', before a letter)
 * encodes as the concatenation of its parts' ids: the whole goes through
 * the per-call cache, each part of 64 bytes or fewer does not. */
START_TEST(test_parts_match_whole) {
  const ex_bpe *b = gpt2();
  uint64_t rng = 7;
  enum { PARTS = 400 };
  static char text[2 * PARTS * 64];
  static int32_t want[2 * PARTS * 64];
  size_t len = 0, nwant = 0;
  for (int p = 0; p < PARTS; p++) {
    char *part = text + len;
    part[0] = 'X';
    size_t n = 1 + random_text(&rng, part + 1, 62);
    part[n++] = '.';
    size_t count = 0;
    int32_t *ids = encode(b, part, n, &count);
    memcpy(want + nwant, ids, count * sizeof *ids);
    nwant += count;
    free(ids);
    len += n;
  }
  /* Twice over, so the second half hits the cache throughout. */
  memcpy(text + len, text, len);
  memcpy(want + nwant, want, nwant * sizeof *want);
  assert_ids(b, "the whole", text, 2 * len, want, 2 * nwant);
}
END_TEST

/* ------------------------------------------------------------- threads */

typedef struct job {
  const ex_bpe *b;
  const char *text;
  size_t len, nwant;
  const int32_t *want;
  int bad;
} job;

static void *encode_often(void *arg) {
  job *j = arg;
  for (int r = 0; r < 20; r++) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (ex_bpe_encode(j->b, j->text, j->len, &ids, &n, NULL) != 0 ||
        n != j->nwant || memcmp(ids, j->want, n * sizeof *ids) != 0)
      j->bad++;
    free(ids);
  }
  return NULL;
}

START_TEST(test_shared_between_threads) {
  const ex_bpe *b = gpt2();
  uint64_t rng = 99;
  static char text[20000];
  size_t len = 0, nwant = 0;
  while (len < sizeof text - 200) len += random_text(&rng, text + len, 200);
  int32_t *want = encode(b, text, len, &nwant);
  pthread_t th[4];
  job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (job){b, text, len, nwant, want, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, encode_often, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_int_eq(jobs[i].bad, 0);
  }
  free(want);
}
END_TEST

/* ------------------------------------------------------------- merging */

/* encoder.py merges every occurrence of the lowest-ranked pair before it
 * looks again: "abab" is [ab, ab] even though "ab a" ranks below "a b"
 * (merging one "a b" at a time would make "aba" first).  Pairs do not
 * overlap: "aaaaa" is [aa, aa, a], then [aaaa, a].  The alphabet maps a
 * space to "Ġ" and byte 0 to "Ā". */
START_TEST(test_merge_rounds) {
  write_tiny(256,
             ", \"ab\": 256, \"aba\": 257, \"aa\": 258, \"aaaa\": 259, "
             "\"\xc4\xa0"
             "a\": 260, \"\xc4\x80\xc4\x80\": 261",
             "#version: 0.2\nab a\na b\na a\naa aa\n\xc4\xa0 a\n"
             "\xc4\x80 \xc4\x80\n");
  ex_bpe *b = load_tiny();
  ck_assert_int_eq(ex_bpe_vocab_size(b), 262);
  assert_ids(b, "abab", "abab", 4, (const int32_t[]){256, 256}, 2);
  assert_ids(b, "aba", "aba", 3, (const int32_t[]){257}, 1);
  assert_ids(b, "aaa", "aaa", 3, (const int32_t[]){258, 'a'}, 2);
  assert_ids(b, "aaaaa", "aaaaa", 5, (const int32_t[]){259, 'a'}, 2);
  assert_ids(b, "space a", " a", 2, (const int32_t[]){260}, 1);
  assert_ids(b, "NULs", "\0\0\0", 3, (const int32_t[]){261, 0}, 2);
  ex_bpe_free(b);
}
END_TEST

/* -------------------------------------------------------------- errors */

START_TEST(test_load_missing) {
  topos_error err = {0};
  ck_assert_ptr_null(ex_bpe_load("/nonexistent/topos-bpe", &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err.message, "encoder.json"));
  ck_assert_ptr_null(ex_bpe_load(NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(ex_bpe_load(NULL, NULL)); /* err may be NULL */
  write_tiny(256, "", "#version: 0.2\n");
  ex_bpe_free(load_tiny()); /* no merges is a vocabulary */
  char path[1024];
  snprintf(path, sizeof path, "%s/vocab.bpe", g_dir);
  ck_assert_int_eq(remove(path), 0);
  assert_load_fails(TOPOS_ERR_NOT_FOUND, "vocab.bpe");
}
END_TEST

START_TEST(test_load_truncated_encoder) {
  gpt2(); /* g_data */
  size_t size = 0;
  char *json = read_data("encoder.json", &size);
  write_file("vocab.bpe", "#version: 0.2\n", 14);
  size_t cuts[] = {0, 1, size / 2, size - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    write_file("encoder.json", json, cuts[i]);
    assert_load_fails(TOPOS_ERR_CORRUPT, "encoder.json: not JSON");
  }
  free(json);
}
END_TEST

START_TEST(test_load_malformed_encoder) {
  const char *merges = "#version: 0.2\n";
  write_text("vocab.bpe", merges);
  write_text("encoder.json", "[1, 2]");
  assert_load_fails(TOPOS_ERR_CORRUPT, "not a JSON object");
  write_text("encoder.json", "{}");
  assert_load_fails(TOPOS_ERR_CORRUPT, "not a JSON object");
  write_tiny(256, ", \"ab\": 9999", merges);
  assert_load_fails(TOPOS_ERR_CORRUPT, "whole number in [0, 257)");
  write_tiny(256, ", \"ab\": \"256\"", merges);
  assert_load_fails(TOPOS_ERR_CORRUPT, "\"ab\"");
  write_tiny(256, ", \"ab\": 255.5", merges);
  assert_load_fails(TOPOS_ERR_CORRUPT, "whole number");
  write_tiny(256, ", \"ab\": 3, \"ba\": 256", merges);
  assert_load_fails(TOPOS_ERR_CORRUPT, "id 3 is given twice");
  write_tiny(256, ", \"a\": 256", merges); /* the token "a" again */
  assert_load_fails(TOPOS_ERR_CORRUPT, "\"a\" is given twice");
  write_tiny(256, ", \"a b\": 256", merges); /* a space is "Ġ" */
  assert_load_fails(TOPOS_ERR_CORRUPT, "byte alphabet");
  write_tiny(256, ", \"\": 256", merges);
  assert_load_fails(TOPOS_ERR_CORRUPT, "byte alphabet");
  write_tiny(255, "", merges); /* byte 0xFF ("ÿ") has no token */
  assert_load_fails(TOPOS_ERR_CORRUPT, "no token for byte 0xFF");
}
END_TEST

START_TEST(test_load_malformed_merges) {
  const char *extra = ", \"ab\": 256";
  write_tiny(256, extra, "a b\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:1: the first line");
  write_tiny(256, extra, "#version: 0.2\na b\na b c\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:3: not two tokens");
  write_tiny(256, extra, "#version: 0.2\na b\n\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:3: not two tokens");
  write_tiny(256, extra, "#version: 0.2\nab\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:2: not two tokens");
  write_tiny(256, extra, "#version: 0.2\na \n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:2: not two tokens");
  write_tiny(256, extra, "#version: 0.2\n b\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:2: not two tokens");
  write_tiny(256, extra, "#version: 0.2\na  b\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:2: not two tokens");
  write_tiny(256, extra, "#version: 0.2\na b\nb c\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:3: \"b c\"");
  write_tiny(256, extra, "#version: 0.2\na\tb\n");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:2");
  /* CRLF lines and a last line without a newline are fine. */
  write_tiny(256, extra, "#version: 0.2\r\na b\r\nab ab");
  assert_load_fails(TOPOS_ERR_CORRUPT, "vocab.bpe:3"); /* "abab" absent */
  write_tiny(256, extra, "#version: 0.2\r\na b\r\n");
  ex_bpe *b = load_tiny();
  assert_ids(b, "ab", "ab", 2, (const int32_t[]){256}, 1);
  ex_bpe_free(b);
  write_tiny(256, extra, "#version: 0.2\na b");
  ex_bpe_free(load_tiny());
}
END_TEST

START_TEST(test_decode_out_of_range) {
  const ex_bpe *b = gpt2();
  const int32_t bad[][2] = {
      {-1, 0}, {50257, 0}, {0, 50257}, {0, INT32_MAX}, {INT32_MIN, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *text = (char *)1;
    size_t len = 99;
    topos_error err = {0};
    ck_assert_int_eq(ex_bpe_decode(b, bad[i], 2, &text, &len, &err), -1);
    ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.message, "outside [0, 50257)"));
    ck_assert_ptr_null(text);
    ck_assert_uint_eq(len, 0);
  }
}
END_TEST

START_TEST(test_null_arguments) {
  const ex_bpe *b = gpt2();
  topos_error err = {0};
  int32_t *ids = (int32_t *)1;
  size_t n = 99;
  ck_assert_int_eq(ex_bpe_encode(b, NULL, 3, &ids, &n, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(ids);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(ex_bpe_encode(NULL, "a", 1, &ids, &n, &err), -1);
  ck_assert_int_eq(ex_bpe_encode(b, "a", 1, NULL, &n, NULL), -1);
  char *text = NULL;
  size_t len = 0;
  ck_assert_int_eq(ex_bpe_decode(b, NULL, 2, &text, &len, &err), -1);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(ex_bpe_decode(NULL, NULL, 0, &text, &len, &err), -1);
  ex_bpe_free(NULL);
}
END_TEST

Suite *bpe_suite(void) {
  Suite *s = suite_create("bpe");

  TCase *real = tcase_create("gpt2");
  tcase_add_unchecked_fixture(real, load_gpt2, free_gpt2);
  tcase_set_timeout(real, 120);
  tcase_add_test(real, test_vocab_size_and_known_ids);
  tcase_add_test(real, test_vectors_file);
  tcase_add_test(real, test_reference_encoder);
  tcase_add_test(real, test_empty_and_single_bytes);
  tcase_add_test(real, test_char_classes);
  tcase_add_test(real, test_round_trip_random);
  tcase_add_test(real, test_long_pieces);
  tcase_add_test(real, test_parts_match_whole);
  tcase_add_test(real, test_shared_between_threads);
  tcase_add_test(real, test_decode_out_of_range);
  tcase_add_test(real, test_null_arguments);
  suite_add_tcase(s, real);

  TCase *files = tcase_create("files");
  tcase_add_unchecked_fixture(files, load_gpt2, free_gpt2);
  tcase_add_checked_fixture(files, setup, teardown);
  tcase_set_timeout(files, 60);
  tcase_add_test(files, test_merge_rounds);
  tcase_add_test(files, test_load_missing);
  tcase_add_test(files, test_load_truncated_encoder);
  tcase_add_test(files, test_load_malformed_encoder);
  tcase_add_test(files, test_load_malformed_merges);
  suite_add_tcase(s, files);
  return s;
}
