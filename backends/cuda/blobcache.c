/*
 * blobcache.c - the device-resident cache of parameter blobs keyed by
 * content hash (blobcache.h).
 *
 * Each entry is in two hash tables, one keyed by (SHA-256, length) for
 * acquire and one keyed by device pointer for release; both are open
 * addressing with linear probing and backward-shift deletion, grown to
 * twice their size before they pass half full.  An entry with no
 * references is on the LRU list (most recently released at the head);
 * eviction takes from the tail, so it is O(1) per entry and never sees a
 * referenced entry.
 *
 * Announced host ranges are a sorted array of disjoint ranges: look-up
 * is a binary search; announcing moves the tail of the array (a run
 * announces its parameters once, so this is not on a hot path).
 */
#include "blobcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_MIN_LOG2 5
#define GOLDEN 0x9E3779B97F4A7C15ull

typedef struct entry {
  uint8_t hash[32];
  size_t bytes; /* the content's length */
  size_t size;  /* the block's size, as the pool granted it */
  void *dev;
  unsigned long refs;
  struct entry *prev, *next; /* the LRU list, while refs == 0 */
} entry;

/* The two tables differ only in their key. */
typedef enum key_kind { BY_CONTENT = 0, BY_DEV = 1 } key_kind;

typedef struct table {
  entry **slot; /* 1 << cap_log2 slots, NULL when empty */
  int cap_log2;
  size_t count;
} table;

typedef struct range {
  uintptr_t base;
  size_t len;
  uint8_t hash[32];
} range;

struct blobcache {
  pthread_mutex_t mu;
  devpool *pool;
  size_t budget;
  blobcache_upload_fn upload;
  void *ctx;
  table by[2];
  entry *lru_head, *lru_tail;
  range *ranges; /* sorted by base, disjoint */
  size_t nranges, cap_ranges;
  blobcache_stats st;
};

/* ---- the tables ---- */

static uint64_t content_key(const uint8_t hash[32], size_t bytes) {
  uint64_t h;
  memcpy(&h, hash, sizeof h);
  return (h ^ ((uint64_t)bytes * GOLDEN)) * GOLDEN;
}

static uint64_t key_of(key_kind k, const entry *e) {
  if (k == BY_CONTENT) return content_key(e->hash, e->bytes);
  return (uint64_t)(uintptr_t)e->dev * GOLDEN;
}

static bool same_key(key_kind k, const entry *a, const entry *b) {
  if (k == BY_DEV) return a->dev == b->dev;
  return a->bytes == b->bytes && memcmp(a->hash, b->hash, 32) == 0;
}

static size_t mask_of(const table *t) {
  return ((size_t)1 << t->cap_log2) - 1;
}

static size_t home(const table *t, uint64_t key) {
  return (size_t)(key >> (64 - t->cap_log2));
}

static bool table_init(table *t) {
  t->cap_log2 = TABLE_MIN_LOG2;
  t->count = 0;
  t->slot = calloc((size_t)1 << t->cap_log2, sizeof *t->slot);
  return t->slot != NULL;
}

/* The entry with probe's key, or NULL. */
static entry *table_find(const table *t, key_kind k, const entry *probe) {
  size_t mask = mask_of(t);
  for (size_t i = home(t, key_of(k, probe));; i = (i + 1) & mask) {
    if (!t->slot[i]) return NULL;
    if (same_key(k, t->slot[i], probe)) return t->slot[i];
  }
}

static void table_place(table *t, key_kind k, entry *e) {
  size_t mask = mask_of(t);
  size_t i = home(t, key_of(k, e));
  while (t->slot[i]) i = (i + 1) & mask;
  t->slot[i] = e;
}

/* Makes room for one more entry; false when out of host memory. */
static bool table_reserve(table *t, key_kind k) {
  size_t cap = (size_t)1 << t->cap_log2;
  if ((t->count + 1) * 2 <= cap) return true;
  entry **old = t->slot;
  entry **slot = calloc(cap * 2, sizeof *slot);
  if (!slot) return false;
  t->slot = slot;
  t->cap_log2++;
  for (size_t i = 0; i < cap; i++)
    if (old[i]) table_place(t, k, old[i]);
  free(old);
  return true;
}

static void table_insert(table *t, key_kind k, entry *e) {
  table_place(t, k, e);
  t->count++;
}

/* Takes e out, shifting back the entries after it that probed past. */
static void table_remove(table *t, key_kind k, const entry *e) {
  size_t mask = mask_of(t);
  size_t i = home(t, key_of(k, e));
  while (t->slot[i] != e) i = (i + 1) & mask;
  for (size_t j = (i + 1) & mask; t->slot[j]; j = (j + 1) & mask) {
    size_t h = home(t, key_of(k, t->slot[j]));
    if (((j - h) & mask) >= ((j - i) & mask)) {
      t->slot[i] = t->slot[j];
      i = j;
    }
  }
  t->slot[i] = NULL;
  t->count--;
}

/* ---- entries and the LRU list ---- */

static void lru_push_head(blobcache *c, entry *e) {
  e->prev = NULL;
  e->next = c->lru_head;
  if (c->lru_head)
    c->lru_head->prev = e;
  else
    c->lru_tail = e;
  c->lru_head = e;
}

static void lru_unlink(blobcache *c, entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    c->lru_head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    c->lru_tail = e->prev;
  e->prev = e->next = NULL;
}

/* Drops the least recently used unreferenced entry; false if none. */
static bool evict_one(blobcache *c) {
  entry *e = c->lru_tail;
  if (!e) return false;
  lru_unlink(c, e);
  table_remove(&c->by[BY_CONTENT], BY_CONTENT, e);
  table_remove(&c->by[BY_DEV], BY_DEV, e);
  devpool_put(c->pool, e->dev);
  c->st.bytes -= e->size;
  c->st.entries--;
  c->st.evictions++;
  free(e);
  return true;
}

/* Evicts until `need` more bytes fit the budget; whether they do. */
static bool make_room(blobcache *c, size_t need) {
  if (!c->budget) return true;
  if (need > c->budget) return false;
  while (c->st.bytes + need > c->budget)
    if (!evict_one(c)) return false;
  return true;
}

/* A new resident entry for the content, referenced once; NULL when it
 * cannot be made. */
static entry *load(blobcache *c, const uint8_t hash[32], const void *host,
                   size_t bytes) {
  size_t want = bytes ? bytes : 1;
  size_t size = devpool_class_size(want);
  if (size == 0 || !make_room(c, size)) return NULL;
  if (!table_reserve(&c->by[BY_CONTENT], BY_CONTENT) ||
      !table_reserve(&c->by[BY_DEV], BY_DEV))
    return NULL;
  entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->dev = devpool_get(c->pool, want, &e->size);
  if (!e->dev && c->lru_tail) {
    /* The device is full: give the pool every unreferenced entry. */
    while (evict_one(c)) continue;
    e->dev = devpool_get(c->pool, want, &e->size);
  }
  if (!e->dev) {
    free(e);
    return NULL;
  }
  if (bytes && c->upload(c->ctx, e->dev, host, bytes) != 0) {
    c->st.upload_failures++;
    devpool_put(c->pool, e->dev);
    free(e);
    return NULL;
  }
  memcpy(e->hash, hash, 32);
  e->bytes = bytes;
  e->refs = 1;
  table_insert(&c->by[BY_CONTENT], BY_CONTENT, e);
  table_insert(&c->by[BY_DEV], BY_DEV, e);
  c->st.bytes += e->size;
  c->st.entries++;
  c->st.pinned++;
  return e;
}

/* ---- the cache ---- */

blobcache *blobcache_new(devpool *pool, size_t budget,
                         blobcache_upload_fn upload, void *ctx) {
  blobcache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (!table_init(&c->by[BY_CONTENT]) || !table_init(&c->by[BY_DEV]) ||
      pthread_mutex_init(&c->mu, NULL) != 0) {
    free(c->by[BY_CONTENT].slot);
    free(c->by[BY_DEV].slot);
    free(c);
    return NULL;
  }
  c->pool = pool;
  c->budget = budget;
  c->upload = upload;
  c->ctx = ctx;
  return c;
}

void *blobcache_acquire(blobcache *c, const uint8_t hash[32], const void *host,
                        size_t bytes, bool *hit) {
  entry probe = {.bytes = bytes};
  memcpy(probe.hash, hash, 32);
  pthread_mutex_lock(&c->mu);
  entry *e = table_find(&c->by[BY_CONTENT], BY_CONTENT, &probe);
  bool resident = e != NULL;
  if (e) {
    c->st.hits++;
    if (e->refs++ == 0) {
      lru_unlink(c, e);
      c->st.pinned++;
    }
  } else {
    c->st.misses++;
    e = load(c, hash, host, bytes);
  }
  void *dev = e ? e->dev : NULL;
  pthread_mutex_unlock(&c->mu);
  if (hit) *hit = resident;
  return dev;
}

void blobcache_release(blobcache *c, const void *dev) {
  if (!dev) return;
  entry probe = {.dev = (void *)dev};
  pthread_mutex_lock(&c->mu);
  entry *e = table_find(&c->by[BY_DEV], BY_DEV, &probe);
  if (!e || e->refs == 0) {
    c->st.bad_releases++;
  } else if (--e->refs == 0) {
    lru_push_head(c, e);
    c->st.pinned--;
  }
  pthread_mutex_unlock(&c->mu);
}

void blobcache_clear(blobcache *c) {
  pthread_mutex_lock(&c->mu);
  while (evict_one(c)) continue;
  pthread_mutex_unlock(&c->mu);
}

void blobcache_get_stats(blobcache *c, blobcache_stats *s) {
  pthread_mutex_lock(&c->mu);
  *s = c->st;
  pthread_mutex_unlock(&c->mu);
}

void blobcache_free(blobcache *c) {
  if (!c) return;
  table *t = &c->by[BY_CONTENT];
  for (size_t i = 0; i < (size_t)1 << t->cap_log2; i++) {
    if (!t->slot[i]) continue;
    devpool_put(c->pool, t->slot[i]->dev);
    free(t->slot[i]);
  }
  free(t->slot);
  free(c->by[BY_DEV].slot);
  free(c->ranges);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ---- announced ranges ---- */

/* The number of ranges whose base is <= p. */
static size_t ranges_upto(const blobcache *c, uintptr_t p) {
  size_t lo = 0, hi = c->nranges;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->ranges[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static bool ranges_reserve(blobcache *c) {
  if (c->nranges < c->cap_ranges) return true;
  size_t cap = c->cap_ranges ? c->cap_ranges * 2 : 16;
  range *r = realloc(c->ranges, cap * sizeof *r);
  if (!r) return false;
  c->ranges = r;
  c->cap_ranges = cap;
  return true;
}

int blobcache_announce(blobcache *c, const void *host, size_t bytes,
                       const uint8_t hash[32]) {
  uintptr_t base = (uintptr_t)host;
  if (!host || bytes == 0 || bytes > UINTPTR_MAX - base) return -1;
  uintptr_t end = base + bytes;
  pthread_mutex_lock(&c->mu);
  if (!ranges_reserve(c)) {
    pthread_mutex_unlock(&c->mu);
    return -1;
  }
  /* [i, j): the ranges the new one overlaps (disjoint, so consecutive). */
  size_t i = ranges_upto(c, base);
  if (i > 0 && c->ranges[i - 1].base + c->ranges[i - 1].len > base) i--;
  size_t j = i;
  while (j < c->nranges && c->ranges[j].base < end) j++;
  memmove(&c->ranges[i + 1], &c->ranges[j],
          (c->nranges - j) * sizeof *c->ranges);
  c->nranges = c->nranges - (j - i) + 1;
  c->ranges[i].base = base;
  c->ranges[i].len = bytes;
  memcpy(c->ranges[i].hash, hash, 32);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

void blobcache_retract(blobcache *c, const void *host) {
  uintptr_t base = (uintptr_t)host;
  pthread_mutex_lock(&c->mu);
  size_t i = ranges_upto(c, base);
  if (i > 0 && c->ranges[i - 1].base == base) {
    memmove(&c->ranges[i - 1], &c->ranges[i],
            (c->nranges - i) * sizeof *c->ranges);
    c->nranges--;
  }
  pthread_mutex_unlock(&c->mu);
}

bool blobcache_find_range(blobcache *c, const void *p, size_t bytes,
                          uint8_t hash[32], const void **base, size_t *len) {
  uintptr_t at = (uintptr_t)p;
  pthread_mutex_lock(&c->mu);
  size_t i = ranges_upto(c, at);
  const range *r = i > 0 ? &c->ranges[i - 1] : NULL;
  size_t off = r ? at - r->base : 0;
  bool inside = r && off < r->len && bytes <= r->len - off;
  if (inside) {
    if (hash) memcpy(hash, r->hash, 32);
    if (base) *base = (const void *)r->base;
    if (len) *len = r->len;
  }
  pthread_mutex_unlock(&c->mu);
  return inside;
}
