/*
 * bpe.c - GPT-2's byte-level BPE tokenizer (bpe.h): OpenAI's encoder.py
 * in C, the same ids for the same text.
 *
 * Loading turns the vocabulary into bytes: encoder.json's strings are
 * written in GPT-2's byte alphabet (bytes_to_unicode: the 188 printable
 * bytes stand for themselves, the other 68 for U+0100 + n in byte order),
 * so each token becomes the bytes it stands for, and each line "a b" of
 * vocab.bpe a pair of token ids with a rank and the id of a+b.
 *
 * Encoding cuts the text into pieces with the pre-tokenisation regex,
 * matched by hand (piece_end), and merges each piece as encoder.py's
 * bpe() does: while some adjacent pair has a rank, take the lowest and
 * merge every occurrence of that pair, left to right and not overlapping.
 * A heap of (rank, position) keys finds the lowest pair without rescanning,
 * so a long piece costs n log n, not n squared.  A per-call cache maps a
 * piece's bytes to its ids, since text repeats its words.
 */
#include "bpe.h"

#include <cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ex_error.h"

/* The longest piece encoded (the merge scratch indexes it with uint32). */
#define MAX_PIECE ((size_t)INT32_MAX)

/* A merge: the pair (left << 32 | right), its rank and the merged id. */
typedef struct merge {
  uint64_t key; /* EMPTY_KEY: a free slot */
  uint32_t rank;
  int32_t merged;
} merge;

#define EMPTY_KEY UINT64_MAX

struct ex_bpe {
  int vocab;
  uint8_t *bytes;       /* every token's bytes, one after another */
  uint32_t *start;      /* [vocab]: where token id's bytes begin in bytes */
  uint32_t *len;        /* [vocab]: how many */
  int32_t byte_id[256]; /* the token of each single byte */
  merge *merges;        /* open addressing, mask + 1 slots */
  size_t mask;
};

/* ------------------------------------------------------------------ UTF-8 */

/*
 * The code point at s[i] into *cp; returns its length in bytes.  A byte
 * that does not begin a well-formed sequence (Unicode's table 3-7) is a
 * character of its own, U+DC00 + byte as in Python's "surrogateescape":
 * a surrogate, so of class other.
 */
static size_t utf8_next(const uint8_t *s, size_t len, size_t i, uint32_t *cp) {
  uint8_t c = s[i];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t need = c >= 0xC2 && c <= 0xDF   ? 1
                : c >= 0xE0 && c <= 0xEF ? 2
                : c >= 0xF0 && c <= 0xF4 ? 3
                                         : 0;
  /* The second byte's range is narrower after E0, ED, F0 and F4. */
  uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  bool ok = need > 0 && len - i > need && s[i + 1] >= lo && s[i + 1] <= hi;
  for (size_t k = 2; ok && k <= need; k++) ok = (s[i + k] & 0xC0) == 0x80;
  if (!ok) {
    *cp = 0xDC00u + c;
    return 1;
  }
  uint32_t v = c & (0x7Fu >> (need + 1));
  for (size_t k = 1; k <= need; k++) v = v << 6 | (s[i + k] & 0x3Fu);
  *cp = v;
  return need + 1;
}

/* The class of the character at s[i]; returns its length in bytes. */
static size_t char_at(const uint8_t *s, size_t len, size_t i,
                      ex_bpe_class *cls) {
  uint32_t cp;
  size_t w = utf8_next(s, len, i, &cp);
  *cls = ex_bpe_char_class(cp);
  return w;
}

/* -------------------------------------------------------- pre-tokenising */

/* Where the run of class cls that continues at s[j] ends. */
static size_t run_end(const uint8_t *s, size_t len, size_t j,
                      ex_bpe_class cls) {
  while (j < len) {
    ex_bpe_class k;
    size_t w = char_at(s, len, j, &k);
    if (k != cls) break;
    j += w;
  }
  return j;
}

/* The contraction ('s 't 're 've 'm 'll 'd, case-sensitive) at s[i]: its
 * length, or 0. */
static size_t contraction(const uint8_t *s, size_t len, size_t i) {
  if (s[i] != '\'' || len - i < 2) return 0;
  uint8_t a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (len - i < 3) return 0;
  uint8_t b = s[i + 2];
  bool two = (a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
             (a == 'l' && b == 'l');
  return two ? 3 : 0;
}

/*
 * The end of the regex's match at s[i] (i < len), alternatives in order:
 * a contraction; " ?" and a run of letters, of numbers or of others (the
 * class of the first character after the optional space picks which);
 * otherwise s[i] is a space and the match is its run, less the last
 * character when the run is followed by a non-space and has more than one
 * (\s+(?!\S) backtracks one; a lone one is \s+).
 */
static size_t piece_end(const uint8_t *s, size_t len, size_t i) {
  size_t c = contraction(s, len, i);
  if (c > 0) return i + c;
  ex_bpe_class k;
  size_t j = i + char_at(s, len, i, &k);
  if (s[i] == ' ' && j < len) {
    ex_bpe_class next;
    size_t w = char_at(s, len, j, &next);
    if (next != EX_BPE_SPACE) return run_end(s, len, j + w, next);
  }
  if (k != EX_BPE_SPACE) return run_end(s, len, j, k);
  size_t last = i; /* where the run's last character begins */
  while (j < len) {
    size_t w = char_at(s, len, j, &k);
    if (k != EX_BPE_SPACE) break;
    last = j;
    j += w;
  }
  return j == len || last == i ? j : last;
}

/* ------------------------------------------------------------ the merges */

static size_t pair_slot(uint64_t key, size_t mask) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* The merge of left and right, or NULL. */
static const merge *find_merge(const ex_bpe *b, int32_t left, int32_t right) {
  uint64_t key = pair_key(left, right);
  for (size_t i = pair_slot(key, b->mask);; i = (i + 1) & b->mask) {
    const merge *m = &b->merges[i];
    if (m->key == key) return m;
    if (m->key == EMPTY_KEY) return NULL;
  }
}

/* Adds or re-ranks a merge (a repeated pair keeps its last rank, as
 * encoder.py's dict does).  The table never fills: it has twice the
 * slots of merges. */
static void put_merge(ex_bpe *b, int32_t left, int32_t right, uint32_t rank,
                      int32_t merged) {
  uint64_t key = pair_key(left, right);
  size_t i = pair_slot(key, b->mask);
  while (b->merges[i].key != EMPTY_KEY && b->merges[i].key != key)
    i = (i + 1) & b->mask;
  b->merges[i] = (merge){key, rank, merged};
}

/* ----------------------------------------------------- growable id arrays */

typedef struct ids {
  int32_t *v;
  size_t n, cap;
} ids;

static bool ids_reserve(ids *a, size_t more) {
  if (a->cap - a->n >= more) return true;
  size_t cap = a->cap ? a->cap : 64;
  while (cap - a->n < more) {
    if (cap > SIZE_MAX / 2 / sizeof *a->v) return false;
    cap *= 2;
  }
  int32_t *v = realloc(a->v, cap * sizeof *v);
  if (v == NULL) return false;
  a->v = v;
  a->cap = cap;
  return true;
}

/* ------------------------------------------------------------- one piece */

/* Scratch for merging one piece of up to cap bytes: the symbols as a
 * linked list over byte positions, and a binary heap of (rank << 32 | pos)
 * keys, one per candidate pair (pos: the left symbol). */
typedef struct scratch {
  size_t cap;
  int32_t *sym;     /* the token starting at each position; -1: merged in */
  uint32_t *next;   /* the next symbol's position; n at the end */
  uint32_t *prev;   /* the previous one's; UINT32_MAX at the start */
  uint32_t *merged; /* positions merged in this round */
  uint64_t *heap;   /* up to 3 * cap keys: n - 1, then two per merge */
  size_t nheap;
} scratch;

static void scratch_free(scratch *w) {
  free(w->sym);
  free(w->next);
  free(w->prev);
  free(w->merged);
  free(w->heap);
  memset(w, 0, sizeof *w);
}

static bool scratch_reserve(scratch *w, size_t n) {
  if (n <= w->cap) return true;
  size_t cap = w->cap ? w->cap : 64;
  while (cap < n) cap *= 2;
  scratch_free(w);
  w->sym = malloc(cap * sizeof *w->sym);
  w->next = malloc(cap * sizeof *w->next);
  w->prev = malloc(cap * sizeof *w->prev);
  w->merged = malloc(cap * sizeof *w->merged);
  w->heap = malloc(3 * cap * sizeof *w->heap);
  if (!w->sym || !w->next || !w->prev || !w->merged || !w->heap) {
    scratch_free(w);
    return false;
  }
  w->cap = cap;
  return true;
}

static void heap_push(scratch *w, uint64_t key) {
  size_t i = w->nheap++;
  while (i > 0 && w->heap[(i - 1) / 2] > key) {
    w->heap[i] = w->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->heap[i] = key;
}

static uint64_t heap_pop(scratch *w) {
  uint64_t top = w->heap[0], last = w->heap[--w->nheap];
  size_t i = 0, n = w->nheap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
    if (w->heap[c] >= last) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (n > 0) w->heap[i] = last;
  return top;
}

/* Pushes the pair whose left symbol is at pos, when it has a rank. */
static void push_pair(const ex_bpe *b, scratch *w, uint32_t pos, uint32_t n) {
  uint32_t q = w->next[pos];
  if (q >= n) return;
  const merge *m = find_merge(b, w->sym[pos], w->sym[q]);
  if (m != NULL) heap_push(w, (uint64_t)m->rank << 32 | pos);
}

/* Merges the pair at pos when it is still there with this rank: a key is
 * stale once either symbol changed, and ranks name pairs one to one. */
static bool merge_at(const ex_bpe *b, scratch *w, uint32_t pos, uint32_t rank,
                     uint32_t n) {
  uint32_t q = w->next[pos];
  if (w->sym[pos] < 0 || q >= n) return false;
  const merge *m = find_merge(b, w->sym[pos], w->sym[q]);
  if (m == NULL || m->rank != rank) return false;
  w->sym[pos] = m->merged;
  w->sym[q] = -1;
  w->next[pos] = w->next[q];
  if (w->next[q] < n) w->prev[w->next[q]] = pos;
  return true;
}

/*
 * encoder.py's bpe() on the n bytes at p, the ids appended to out.  Each
 * round takes every key of the lowest rank, in position order, so merges
 * every occurrence of that one pair left to right, as encoder.py does; the
 * pairs the round made are pushed after it, so even a pair ranked below
 * it waits for the round to end.
 */
static bool merge_piece(const ex_bpe *b, scratch *w, const uint8_t *p,
                        uint32_t n, ids *out) {
  if (!scratch_reserve(w, n)) return false;
  w->nheap = 0;
  for (uint32_t i = 0; i < n; i++) {
    w->sym[i] = b->byte_id[p[i]];
    w->next[i] = i + 1;
    w->prev[i] = i == 0 ? UINT32_MAX : i - 1;
  }
  for (uint32_t i = 0; i + 1 < n; i++) push_pair(b, w, i, n);
  while (w->nheap > 0) {
    uint32_t rank = (uint32_t)(w->heap[0] >> 32), nmerged = 0;
    while (w->nheap > 0 && (uint32_t)(w->heap[0] >> 32) == rank) {
      uint32_t pos = (uint32_t)heap_pop(w);
      if (merge_at(b, w, pos, rank, n)) w->merged[nmerged++] = pos;
    }
    for (uint32_t k = 0; k < nmerged; k++) {
      uint32_t pos = w->merged[k];
      if (w->prev[pos] != UINT32_MAX) push_pair(b, w, w->prev[pos], n);
      push_pair(b, w, pos, n);
    }
  }
  size_t count = 0;
  for (uint32_t i = 0; i < n; i = w->next[i]) count++;
  if (!ids_reserve(out, count)) return false;
  for (uint32_t i = 0; i < n; i = w->next[i]) out->v[out->n++] = w->sym[i];
  return true;
}

/* ------------------------------------------------------------- the cache */

/* The least power of two >= n, and >= 16. */
static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c *= 2;
  return c;
}

/* The pieces met in one call: bytes -> a span of earlier output ids.
 * Open addressing, a slot per 8 bytes of text within [CACHE_MIN,
 * CACHE_MAX]; it takes pieces of up to CACHE_PIECE bytes until half full.
 * (Per call, so a loaded ex_bpe stays read-only.) */
#define CACHE_MIN 256
#define CACHE_MAX 65536
#define CACHE_PIECE 64

typedef struct cached {
  size_t at; /* the piece's first byte in the text; SIZE_MAX: free */
  uint32_t len;
  uint32_t first, count; /* the ids: out->v[first .. first + count) */
} cached;

typedef struct cache {
  cached *slot; /* mask + 1 of them, or NULL: no cache */
  size_t mask, used;
} cache;

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* The slot for the piece text[at, at + n): holding it, or free. */
static cached *cache_find(cache *c, const uint8_t *text, size_t at, size_t n) {
  for (size_t i = hash_bytes(text + at, n) & c->mask;; i = (i + 1) & c->mask) {
    cached *e = &c->slot[i];
    if (e->at == SIZE_MAX) return e;
    if (e->len == n && memcmp(text + e->at, text + at, n) == 0) return e;
  }
}

/* ---------------------------------------------------------------- encode */

/* Appends the ids of the piece text[at, at + n). */
static bool encode_piece(const ex_bpe *b, scratch *w, cache *c,
                         const uint8_t *text, size_t at, size_t n, ids *out) {
  if (n == 1) {
    if (!ids_reserve(out, 1)) return false;
    out->v[out->n++] = b->byte_id[text[at]];
    return true;
  }
  cached *e = NULL;
  if (c->slot != NULL && n <= CACHE_PIECE) {
    e = cache_find(c, text, at, n);
    if (e->at != SIZE_MAX) {
      if (!ids_reserve(out, e->count)) return false;
      memcpy(out->v + out->n, out->v + e->first, e->count * sizeof *out->v);
      out->n += e->count;
      return true;
    }
    if (c->used >= c->mask / 2) e = NULL; /* full enough: stop adding */
  }
  size_t first = out->n;
  if (!merge_piece(b, w, text + at, (uint32_t)n, out)) return false;
  if (e != NULL && first <= UINT32_MAX && out->n <= UINT32_MAX) {
    *e = (cached){at, (uint32_t)n, (uint32_t)first, (uint32_t)(out->n - first)};
    c->used++;
  }
  return true;
}

int ex_bpe_encode(const ex_bpe *b, const char *text, size_t len, int32_t **out,
                  size_t *n, topos_error *err) {
  if (out != NULL) *out = NULL;
  if (n != NULL) *n = 0;
  if (b == NULL || out == NULL || n == NULL || (text == NULL && len > 0)) {
    ex_error(err, TOPOS_ERR_ARGUMENT, "ex_bpe_encode: NULL argument");
    return -1;
  }
  const uint8_t *s = (const uint8_t *)text;
  ids res = {0};
  scratch w = {0};
  cache c = {0};
  if (len > CACHE_PIECE) { /* a short text gains nothing from a cache */
    size_t slots = pow2_at_least(len / 8 < CACHE_MAX ? len / 8 : CACHE_MAX);
    c.mask = (slots < CACHE_MIN ? CACHE_MIN : slots) - 1;
    c.slot = malloc((c.mask + 1) * sizeof *c.slot);
    for (size_t i = 0; c.slot != NULL && i <= c.mask; i++)
      c.slot[i].at = SIZE_MAX;
  }
  int rc = ids_reserve(&res, len / 4 + 1) ? TOPOS_OK : TOPOS_ERR_MEMORY;
  for (size_t i = 0; rc == TOPOS_OK && i < len;) {
    size_t end = piece_end(s, len, i);
    if (end - i > MAX_PIECE)
      rc = ex_error(err, TOPOS_ERR_ARGUMENT,
                    "ex_bpe_encode: a piece of %zu bytes, over 2^31 - 1",
                    end - i);
    else if (!encode_piece(b, &w, &c, s, i, end - i, &res))
      rc = TOPOS_ERR_MEMORY;
    i = end;
  }
  scratch_free(&w);
  free(c.slot);
  if (rc != TOPOS_OK) {
    free(res.v);
    if (rc == TOPOS_ERR_MEMORY)
      ex_error(err, rc, "ex_bpe_encode: out of memory");
    return -1;
  }
  *out = res.v;
  *n = res.n;
  return 0;
}

/* ---------------------------------------------------------------- decode */

int ex_bpe_decode(const ex_bpe *b, const int32_t *ids, size_t n, char **out,
                  size_t *len, topos_error *err) {
  if (out != NULL) *out = NULL;
  if (len != NULL) *len = 0;
  if (b == NULL || out == NULL || len == NULL || (ids == NULL && n > 0)) {
    ex_error(err, TOPOS_ERR_ARGUMENT, "ex_bpe_decode: NULL argument");
    return -1;
  }
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= b->vocab) {
      ex_error(err, TOPOS_ERR_RANGE,
               "ex_bpe_decode: id %ld (at %zu) is outside [0, %d)",
               (long)ids[i], i, b->vocab);
      return -1;
    }
    total += b->len[ids[i]];
  }
  char *s = malloc(total + 1);
  if (s == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "ex_bpe_decode: out of memory");
    return -1;
  }
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(s + at, b->bytes + b->start[ids[i]], b->len[ids[i]]);
    at += b->len[ids[i]];
  }
  s[at] = '\0';
  *out = s;
  *len = at;
  return 0;
}

/* ------------------------------------------------------------------ load */

int ex_bpe_vocab_size(const ex_bpe *b) {
  return b != NULL ? b->vocab : -1;
}

void ex_bpe_free(ex_bpe *b) {
  if (b == NULL) return;
  free(b->bytes);
  free(b->start);
  free(b->len);
  free(b->merges);
  free(b);
}

/* The whole file dir/name into *buf (NUL-terminated, *size without it);
 * the path into path.  0, or a topos_status with err. */
static int read_whole(const char *dir, const char *name, char *path, size_t cap,
                      char **buf, size_t *size, topos_error *err) {
  snprintf(path, cap, "%s/%s", dir, name);
  *buf = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return ex_error(err, errno == ENOENT ? TOPOS_ERR_NOT_FOUND : TOPOS_ERR_IO,
                    "%s: %s", path, strerror(errno));
  size_t n = 0, room = 1 << 16;
  char *s = malloc(room + 1);
  while (s != NULL) {
    n += fread(s + n, 1, room - n, f);
    if (n < room) break;
    char *t = realloc(s, 2 * room + 1);
    if (t == NULL) free(s);
    s = t;
    room *= 2;
  }
  bool failed = s != NULL && ferror(f);
  fclose(f);
  if (s == NULL)
    return ex_error(err, TOPOS_ERR_MEMORY, "%s: out of memory", path);
  if (failed) {
    free(s);
    return ex_error(err, TOPOS_ERR_IO, "%s: read error", path);
  }
  s[n] = '\0';
  *buf = s;
  *size = n;
  return TOPOS_OK;
}

/* GPT-2's byte alphabet backwards: the byte a code point below 0x144
 * stands for (bytes_to_unicode: printable bytes stand for themselves, the
 * others for U+0100 + n in order). */
static void byte_alphabet(int16_t byte_of[0x144]) {
  for (int u = 0; u < 0x144; u++) byte_of[u] = -1;
  int n = 0;
  for (int c = 0; c < 256; c++) {
    bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
                     (c >= 0xAE && c <= 0xFF);
    byte_of[printable ? c : 0x100 + n++] = (int16_t)c;
  }
}

/* The bytes a token string in the byte alphabet stands for, written to
 * out (room for n bytes); their count, or -1 for a character outside the
 * alphabet or an empty string. */
static long unmap(const int16_t byte_of[0x144], const char *str, size_t n,
                  uint8_t *out) {
  const uint8_t *s = (const uint8_t *)str;
  long k = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += utf8_next(s, n, i, &cp);
    if (cp >= 0x144 || byte_of[cp] < 0) return -1;
    out[k++] = (uint8_t)byte_of[cp];
  }
  return k > 0 ? k : -1;
}

/* While loading: token bytes -> id, open addressing over ids. */
typedef struct lookup {
  int32_t *slot; /* -1: free */
  size_t mask;
} lookup;

/* The slot holding the n bytes at p, or the free one they would take. */
static int32_t *lookup_slot(const ex_bpe *b, const lookup *t, const uint8_t *p,
                            size_t n) {
  for (size_t i = hash_bytes(p, n) & t->mask;; i = (i + 1) & t->mask) {
    int32_t id = t->slot[i];
    if (id < 0) return &t->slot[i];
    if (b->len[id] == n && memcmp(b->bytes + b->start[id], p, n) == 0)
      return &t->slot[i];
  }
}

/* encoder.json into b's tokens and t.  0, or a topos_status with err. */
static int load_encoder(ex_bpe *b, lookup *t, const int16_t byte_of[0x144],
                        const char *path, const char *json, size_t size,
                        topos_error *err) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, size, &end, false);
  if (root == NULL)
    return ex_error(err, TOPOS_ERR_CORRUPT, "%s: not JSON (at byte %ld)", path,
                    end != NULL ? (long)(end - json) : -1L);
  int n = cJSON_IsObject(root) ? cJSON_GetArraySize(root) : 0;
  if (n <= 0) {
    cJSON_Delete(root);
    return ex_error(err, TOPOS_ERR_CORRUPT, "%s: not a JSON object of tokens",
                    path);
  }
  size_t chars = 0;
  for (cJSON *e = root->child; e != NULL; e = e->next)
    chars += strlen(e->string);
  if (chars > UINT32_MAX) {
    cJSON_Delete(root);
    return ex_error(err, TOPOS_ERR_CORRUPT, "%s: over 4 GiB of tokens", path);
  }
  int rc = TOPOS_OK;
  b->vocab = n;
  b->bytes = malloc(chars + 1);
  b->start = calloc((size_t)n + 1, sizeof *b->start);
  b->len = calloc((size_t)n + 1, sizeof *b->len);
  t->mask = pow2_at_least(2 * (size_t)n) - 1;
  t->slot = malloc((t->mask + 1) * sizeof *t->slot);
  if (!b->bytes || !b->start || !b->len || !t->slot)
    rc = ex_error(err, TOPOS_ERR_MEMORY, "%s: out of memory", path);
  if (rc == TOPOS_OK) memset(t->slot, 0xFF, (t->mask + 1) * sizeof *t->slot);
  size_t at = 0;
  for (cJSON *e = root->child; rc == TOPOS_OK && e != NULL; e = e->next) {
    double v = e->valuedouble;
    if (!cJSON_IsNumber(e) || !(v >= 0 && v < n) || v != (double)(int)v) {
      rc = ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s: token \"%.80s\": the id is not a whole number in "
                    "[0, %d)",
                    path, e->string, n);
      break;
    }
    int id = (int)v;
    long k = unmap(byte_of, e->string, strlen(e->string), b->bytes + at);
    if (k < 0)
      rc = ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s: token \"%.80s\" is not in GPT-2's byte alphabet", path,
                    e->string);
    else if (b->len[id] != 0)
      rc = ex_error(err, TOPOS_ERR_CORRUPT, "%s: id %d is given twice", path,
                    id);
    if (rc != TOPOS_OK) break;
    b->start[id] = (uint32_t)at;
    b->len[id] = (uint32_t)k;
    int32_t *slot = lookup_slot(b, t, b->bytes + at, (size_t)k);
    if (*slot >= 0)
      rc = ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s: token \"%.80s\" is given twice", path, e->string);
    *slot = id;
    at += (size_t)k;
  }
  cJSON_Delete(root);
  /* n distinct ids in [0, n): every id has its bytes. */
  for (int c = 0; rc == TOPOS_OK && c < 256; c++) {
    uint8_t byte = (uint8_t)c;
    b->byte_id[c] = *lookup_slot(b, t, &byte, 1);
    if (b->byte_id[c] < 0)
      rc = ex_error(err, TOPOS_ERR_CORRUPT, "%s: no token for byte 0x%02X",
                    path, c);
  }
  return rc;
}

/* The id of the n bytes at p, or -1. */
static int32_t token_id(const ex_bpe *b, const lookup *t, const uint8_t *p,
                        size_t n) {
  return *lookup_slot(b, t, p, n);
}

/* One line "a b" of vocab.bpe (line, n bytes, no newline) as merge rank.
 * 0, or a topos_status with err. */
static int load_merge(ex_bpe *b, const lookup *t, const int16_t byte_of[0x144],
                      const char *path, long lineno, const char *line, size_t n,
                      uint32_t rank, uint8_t *buf, topos_error *err) {
  const char *sp = memchr(line, ' ', n);
  size_t na = sp != NULL ? (size_t)(sp - line) : 0;
  if (sp == NULL || na == 0 || na + 1 == n || memchr(sp + 1, ' ', n - na - 1))
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s:%ld: not two tokens separated by a space", path,
                    lineno);
  long ka = unmap(byte_of, line, na, buf);
  long kb = ka < 0 ? -1 : unmap(byte_of, sp + 1, n - na - 1, buf + ka);
  if (ka < 0 || kb < 0)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s:%ld: a token outside GPT-2's byte alphabet", path,
                    lineno);
  int32_t left = token_id(b, t, buf, (size_t)ka);
  int32_t right = token_id(b, t, buf + ka, (size_t)kb);
  int32_t merged = token_id(b, t, buf, (size_t)(ka + kb));
  if (left < 0 || right < 0 || merged < 0)
    return ex_error(err, TOPOS_ERR_CORRUPT,
                    "%s:%ld: \"%.*s\": the pair or its merge is not in "
                    "encoder.json",
                    path, lineno, (int)(n > 80 ? 80 : n), line);
  put_merge(b, left, right, rank, merged);
  return TOPOS_OK;
}

/* vocab.bpe into b's merges.  0, or a topos_status with err. */
static int load_merges(ex_bpe *b, const lookup *t, const int16_t byte_of[0x144],
                       const char *path, char *text, size_t size,
                       topos_error *err) {
  size_t lines = 0;
  for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
  b->mask = pow2_at_least(2 * (lines + 1)) - 1;
  b->merges = malloc((b->mask + 1) * sizeof *b->merges);
  uint8_t *buf = malloc(size + 1);
  int rc = TOPOS_OK;
  if (b->merges == NULL || buf == NULL)
    rc = ex_error(err, TOPOS_ERR_MEMORY, "%s: out of memory", path);
  for (size_t i = 0; rc == TOPOS_OK && i <= b->mask; i++)
    b->merges[i].key = EMPTY_KEY;
  if (rc == TOPOS_OK && strncmp(text, "#version", 8) != 0)
    rc = ex_error(err, TOPOS_ERR_CORRUPT,
                  "%s:1: the first line is not a \"#version\" header", path);
  char *line = text;
  long lineno = 1;
  uint32_t rank = 0;
  for (char *nl = memchr(line, '\n', size); rc == TOPOS_OK && nl != NULL;) {
    line = nl + 1; /* the header, then each line after a newline */
    lineno++;
    size_t rest = size - (size_t)(line - text);
    if (rest == 0) break; /* the file's final newline */
    nl = memchr(line, '\n', rest);
    size_t n = nl != NULL ? (size_t)(nl - line) : rest;
    if (n > 0 && line[n - 1] == '\r') n--;
    rc = load_merge(b, t, byte_of, path, lineno, line, n, rank++, buf, err);
  }
  free(buf);
  return rc;
}

ex_bpe *ex_bpe_load(const char *dir, topos_error *err) {
  if (dir == NULL) {
    ex_error(err, TOPOS_ERR_ARGUMENT, "ex_bpe_load: NULL directory");
    return NULL;
  }
  ex_bpe *b = calloc(1, sizeof *b);
  if (b == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "ex_bpe_load: out of memory");
    return NULL;
  }
  int16_t byte_of[0x144];
  byte_alphabet(byte_of);
  lookup t = {0};
  char path[4096], *text = NULL;
  size_t size = 0;
  int rc =
      read_whole(dir, "encoder.json", path, sizeof path, &text, &size, err);
  if (rc == TOPOS_OK) rc = load_encoder(b, &t, byte_of, path, text, size, err);
  free(text);
  text = NULL;
  if (rc == TOPOS_OK)
    rc = read_whole(dir, "vocab.bpe", path, sizeof path, &text, &size, err);
  if (rc == TOPOS_OK) rc = load_merges(b, &t, byte_of, path, text, size, err);
  free(text);
  free(t.slot);
  if (rc != TOPOS_OK) {
    ex_bpe_free(b);
    return NULL;
  }
  return b;
}
