/*
 * test_cuda_host.c - the cuda backend's host-side bookkeeping, on the
 * CPU: the device buffer pool (backends/cuda/devpool.c), the blob cache
 * (blobcache.c) and operand spans (span.c).
 *
 * "Device" memory here is malloc'd by a fake allocator that counts its
 * calls and live blocks and can be told to fail (the Nth call, or any
 * request above a byte limit); uploads are memcpy through a fake that
 * can be told to fail too.  So every path the CUDA code takes through
 * the pool and the cache, failures included, runs on a machine with no
 * GPU, under the sanitizers like the rest of the suite.
 */
#include <check.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/blobcache.h"
#include "cuda/devpool.h"
#include "cuda/span.h"

/* ---- the fake device ---- */

/* Each block carries its size in a 16-byte header before it. */
#define HDR 16

typedef struct fake_dev {
  pthread_mutex_t mu;
  unsigned long long calls;    /* alloc calls, failed or not */
  unsigned long long releases; /* release calls */
  long live;                   /* blocks allocated and not released */
  size_t live_bytes;
  unsigned long long fail_nth; /* fail the call with this number (1-based) */
  bool fail_all;
  size_t fail_above; /* fail requests over this many bytes (0: none) */
  size_t limit;      /* fail when live_bytes would pass this (0: none) */
} fake_dev;

static int fake_alloc(void *ctx, size_t bytes, void **out) {
  fake_dev *f = ctx;
  pthread_mutex_lock(&f->mu);
  unsigned long long n = ++f->calls;
  bool fail = f->fail_all || n == f->fail_nth ||
              (f->fail_above && bytes > f->fail_above) ||
              (f->limit && f->live_bytes + bytes > f->limit);
  char *p = fail ? NULL : malloc(HDR + bytes);
  if (p) {
    memcpy(p, &bytes, sizeof bytes);
    f->live++;
    f->live_bytes += bytes;
  }
  pthread_mutex_unlock(&f->mu);
  if (!p) return 1;
  *out = p + HDR;
  return 0;
}

static void fake_release(void *ctx, void *ptr) {
  fake_dev *f = ctx;
  char *p = (char *)ptr - HDR;
  size_t bytes;
  memcpy(&bytes, p, sizeof bytes);
  free(p);
  pthread_mutex_lock(&f->mu);
  f->releases++;
  f->live--;
  f->live_bytes -= bytes;
  pthread_mutex_unlock(&f->mu);
}

static void fake_init(fake_dev *f) {
  memset(f, 0, sizeof *f);
  pthread_mutex_init(&f->mu, NULL);
}

static devpool *fake_pool(fake_dev *f, size_t budget) {
  fake_init(f);
  devpool_allocator a = {f, fake_alloc, fake_release};
  devpool *p = devpool_new(a, budget);
  ck_assert_ptr_nonnull(p);
  return p;
}

static devpool_stats pool_stats(devpool *p) {
  devpool_stats s;
  devpool_get_stats(p, &s);
  return s;
}

/* ---- the fake upload ---- */

typedef struct fake_up {
  pthread_mutex_t mu;
  unsigned long long calls;
  unsigned long long fail_nth; /* fail the call with this number */
  bool fail_all;
} fake_up;

static int fake_upload(void *ctx, void *dev, const void *host, size_t bytes) {
  fake_up *u = ctx;
  pthread_mutex_lock(&u->mu);
  unsigned long long n = ++u->calls;
  bool fail = u->fail_all || n == u->fail_nth;
  pthread_mutex_unlock(&u->mu);
  if (fail) return 1;
  memcpy(dev, host, bytes);
  return 0;
}

static void up_init(fake_up *u) {
  memset(u, 0, sizeof *u);
  pthread_mutex_init(&u->mu, NULL);
}

static blobcache_stats cache_stats(blobcache *c) {
  blobcache_stats s;
  blobcache_get_stats(c, &s);
  return s;
}

/* ---- content ---- */

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* A stand-in SHA-256 for content number id. */
static void hash_of(unsigned id, uint8_t h[32]) {
  for (int i = 0; i < 4; i++) {
    uint64_t w = mix(((uint64_t)id << 8) | (uint64_t)i);
    memcpy(h + 8 * i, &w, 8);
  }
}

/* Content number id: n bytes that differ from every other id's. */
static uint8_t *content(unsigned id, size_t n) {
  uint8_t *b = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)mix(((uint64_t)id << 32) + i);
  return b;
}

/* ---- devpool ---- */

START_TEST(pool_classes) {
  ck_assert_uint_eq(devpool_class_size(0), 0);
  ck_assert_uint_eq(devpool_class_size(1), 256);
  ck_assert_uint_eq(devpool_class_size(256), 256);
  ck_assert_uint_eq(devpool_class_size(257), 320);
  ck_assert_uint_eq(devpool_class_size(320), 320);
  ck_assert_uint_eq(devpool_class_size(321), 384);
  ck_assert_uint_eq(devpool_class_size(449), 512);
  ck_assert_uint_eq(devpool_class_size(512), 512);
  ck_assert_uint_eq(devpool_class_size(513), 640);
  ck_assert_uint_eq(devpool_class_size(1000), 1024);
  ck_assert_uint_eq(devpool_class_size(1025), 1280);
  ck_assert_uint_eq(devpool_class_size((size_t)3 << 20), (size_t)3 << 20);
  ck_assert_uint_eq(devpool_class_size(((size_t)3 << 20) + 1), (size_t)7 << 19);
  ck_assert_uint_eq(devpool_class_size(SIZE_MAX / 2), SIZE_MAX / 2 + 1);
  ck_assert_uint_eq(devpool_class_size(SIZE_MAX / 2 + 1), 0);
  ck_assert_uint_eq(devpool_class_size(SIZE_MAX), 0);
  /* Every size: a class no smaller, at most 25% more, idempotent and
   * monotone; four classes per power of two above 256. */
  size_t prev = 0;
  int classes = 0;
  for (size_t s = 1; s <= 70000; s++) {
    size_t c = devpool_class_size(s);
    ck_assert_uint_ge(c, s);
    ck_assert_uint_le(c - s, s > 256 ? s / 4 : 255);
    ck_assert_uint_eq(devpool_class_size(c), c);
    ck_assert_uint_ge(c, prev);
    if (c != prev && c > 1024 && c <= 16384) classes++;
    prev = c;
  }
  ck_assert_int_eq(classes, 16); /* (1024, 16384]: 4 powers of two */
  for (size_t s = (size_t)1 << 40; s < ((size_t)1 << 40) + 4096; s += 97) {
    size_t c = devpool_class_size(s);
    ck_assert_uint_ge(c, s);
    ck_assert_uint_le(c - s, s / 4);
  }
}
END_TEST

START_TEST(pool_reuse) {
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  size_t g;
  void *a = devpool_get(p, 1000, &g);
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_eq(g, 1024);
  memset(a, 1, g);
  devpool_put(p, a);
  /* The same class (900 and 1000 both round to 1024): the cached block. */
  void *b = devpool_get(p, 900, &g);
  ck_assert_ptr_eq(a, b);
  ck_assert_uint_eq(g, 1024);
  ck_assert_uint_eq(f.calls, 1);
  /* Another class: a new block even though one is cached. */
  devpool_put(p, b);
  void *c = devpool_get(p, 1025, &g);
  ck_assert_ptr_ne(c, a);
  ck_assert_uint_eq(g, 1280);
  ck_assert_uint_eq(f.calls, 2);
  /* LIFO: of two cached blocks of a class, the one put last. */
  void *d = devpool_get(p, 1024, NULL);
  void *e = devpool_get(p, 1024, NULL);
  ck_assert_ptr_eq(d, a);
  ck_assert_ptr_ne(e, a);
  devpool_put(p, d);
  devpool_put(p, e);
  ck_assert_ptr_eq(devpool_get(p, 1024, NULL), e);
  ck_assert_ptr_eq(devpool_get(p, 1024, NULL), d);
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.allocs, 3);
  ck_assert_uint_eq(s.hits, 4);
  ck_assert_uint_eq(s.blocks_in_use, 3);
  ck_assert_uint_eq(s.blocks_cached, 0);
  ck_assert_uint_eq(s.bytes_in_use, 1024 + 1024 + 1280);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(pool_budget) {
  fake_dev f;
  devpool *p = fake_pool(&f, 4096);
  void *a = devpool_get(p, 2048, NULL);
  void *b = devpool_get(p, 2048, NULL);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  /* Full, nothing cached: no room. */
  size_t g = 7;
  ck_assert_ptr_null(devpool_get(p, 1, &g));
  ck_assert_uint_eq(g, 0);
  ck_assert_uint_eq(f.calls, 2);
  /* Larger than the whole budget: never. */
  devpool_put(p, a);
  ck_assert_ptr_null(devpool_get(p, 4097, NULL));
  ck_assert_uint_eq(f.calls, 2);
  /* A cached 2048 block is released to make room for a 1024 one. */
  void *c = devpool_get(p, 1024, NULL);
  ck_assert_ptr_nonnull(c);
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.trims, 1);
  ck_assert_uint_eq(s.blocks_cached, 0);
  ck_assert_uint_eq(s.bytes_in_use, 2048 + 1024);
  ck_assert_int_eq(f.live, 2);
  /* Largest first: cache 256 and 512 and 1024 (2048 + 1792 held), then
   * ask for 512 more of another class (640): releasing the 1024 is
   * enough, the smaller ones stay. */
  void *d = devpool_get(p, 256, NULL);
  void *e = devpool_get(p, 512, NULL);
  devpool_put(p, c);
  devpool_put(p, d);
  devpool_put(p, e);
  ck_assert_ptr_nonnull(devpool_get(p, 600, &g));
  ck_assert_uint_eq(g, 640);
  s = pool_stats(p);
  ck_assert_uint_eq(s.trims, 2);
  ck_assert_uint_eq(s.blocks_cached, 2);
  ck_assert_uint_eq(s.bytes_cached, 256 + 512);
  ck_assert_uint_le(s.peak_bytes, 4096);
  ck_assert_ptr_eq(devpool_get(p, 256, NULL), d);
  ck_assert_ptr_eq(devpool_get(p, 512, NULL), e);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(pool_trim_retry) {
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  void *a = devpool_get(p, 4096, NULL);
  void *b = devpool_get(p, 300, NULL);
  devpool_put(p, a);
  devpool_put(p, b);
  ck_assert_int_eq(f.live, 2);
  /* The device is "full": the next alloc fails, so the pool releases its
   * cache and tries again, which succeeds. */
  f.fail_nth = f.calls + 1;
  size_t g;
  void *c = devpool_get(p, 10000, &g);
  ck_assert_ptr_nonnull(c);
  ck_assert_uint_eq(g, 10240);
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.alloc_failures, 1);
  ck_assert_uint_eq(s.allocs, 3);
  ck_assert_uint_eq(s.trims, 1);
  ck_assert_uint_eq(s.blocks_cached, 0);
  ck_assert_int_eq(f.live, 1);
  /* With nothing cached to release, a failure is final (one try only). */
  f.fail_nth = f.calls + 1;
  ck_assert_ptr_null(devpool_get(p, 64, NULL));
  ck_assert_uint_eq(f.calls, 5);
  /* Cached blocks, and the retry fails too: NULL, the cache is gone. */
  void *d = devpool_get(p, 64, NULL);
  devpool_put(p, d);
  f.fail_all = true;
  ck_assert_ptr_null(devpool_get(p, 20000, NULL));
  s = pool_stats(p);
  ck_assert_uint_eq(s.alloc_failures, 4);
  ck_assert_uint_eq(s.trims, 2);
  ck_assert_uint_eq(s.blocks_cached, 0);
  ck_assert_uint_eq(s.blocks_in_use, 1);
  ck_assert_int_eq(f.live, 1);
  devpool_put(p, c);
  devpool_trim(p);
  ck_assert_int_eq(f.live, 0);
  devpool_free(p);
}
END_TEST

START_TEST(pool_alloc_failure) {
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  f.fail_all = true;
  size_t g = 1;
  ck_assert_ptr_null(devpool_get(p, 100, &g));
  ck_assert_uint_eq(g, 0);
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.allocs, 0);
  ck_assert_uint_eq(s.alloc_failures, 1);
  ck_assert_uint_eq(s.blocks_in_use + s.blocks_cached, 0);
  ck_assert_uint_eq(s.bytes_in_use + s.bytes_cached, 0);
  /* Over a byte limit: small requests work, big ones fail. */
  f.fail_all = false;
  f.fail_above = 1 << 20;
  void *a = devpool_get(p, 1 << 20, NULL);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_null(devpool_get(p, (1 << 20) + 1, NULL));
  /* Requests that could overflow, and 0 bytes: NULL, no alloc call. */
  unsigned long long calls = f.calls;
  ck_assert_ptr_null(devpool_get(p, SIZE_MAX / 2 + 1, &g));
  ck_assert_ptr_null(devpool_get(p, SIZE_MAX, NULL));
  ck_assert_ptr_null(devpool_get(p, 0, NULL));
  ck_assert_uint_eq(f.calls, calls);
  ck_assert_uint_eq(g, 0);
  devpool_put(p, a);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
  ck_assert_uint_eq(f.live_bytes, 0);
}
END_TEST

START_TEST(pool_bad_puts) {
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  char *a = devpool_get(p, 512, NULL);
  char *b = devpool_get(p, 512, NULL);
  char foreign[16];
  devpool_put(p, foreign);
  devpool_put(p, a + 1);
  devpool_put(p, NULL); /* like free(NULL): not counted */
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.bad_puts, 2);
  ck_assert_uint_eq(s.blocks_in_use, 2);
  devpool_put(p, a);
  devpool_put(p, a); /* double put */
  s = pool_stats(p);
  ck_assert_uint_eq(s.bad_puts, 3);
  ck_assert_uint_eq(s.blocks_in_use, 1);
  ck_assert_uint_eq(s.blocks_cached, 1);
  /* The cache holds `a` once: the next two gets are a, then a new one. */
  ck_assert_ptr_eq(devpool_get(p, 512, NULL), a);
  char *c = devpool_get(p, 512, NULL);
  ck_assert_ptr_ne(c, a);
  ck_assert_ptr_ne(c, b);
  devpool_put(p, c);
  devpool_trim(p);
  devpool_put(p, c); /* released by trim: unknown again */
  s = pool_stats(p);
  ck_assert_uint_eq(s.bad_puts, 4);
  ck_assert_int_eq(f.live, 2);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(pool_stats_peak) {
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  void *a = devpool_get(p, 300, NULL);   /* 320 */
  void *b = devpool_get(p, 5000, NULL);  /* 5120 */
  void *c = devpool_get(p, 70000, NULL); /* 81920 */
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.bytes_in_use, 320 + 5120 + 81920);
  ck_assert_uint_eq(s.peak_bytes, 320 + 5120 + 81920);
  devpool_put(p, c);
  devpool_put(p, b);
  s = pool_stats(p);
  ck_assert_uint_eq(s.bytes_in_use, 320);
  ck_assert_uint_eq(s.bytes_cached, 5120 + 81920);
  ck_assert_uint_eq(s.blocks_in_use, 1);
  ck_assert_uint_eq(s.blocks_cached, 2);
  devpool_trim(p);
  s = pool_stats(p);
  ck_assert_uint_eq(s.bytes_cached, 0);
  ck_assert_uint_eq(s.blocks_cached, 0);
  ck_assert_uint_eq(s.peak_bytes, 320 + 5120 + 81920);
  ck_assert_uint_eq(s.allocs, 3);
  ck_assert_uint_eq(s.hits, 0);
  ck_assert_uint_eq(f.releases, 2);
  devpool_put(p, a);
  devpool_free(p);
}
END_TEST

/* Thousands of blocks: the pointer table grows and deletes correctly. */
START_TEST(pool_many) {
  enum { N = 5000 };
  fake_dev f;
  devpool *p = fake_pool(&f, 0);
  void **v = malloc(N * sizeof *v);
  for (int i = 0; i < N; i++) {
    v[i] = devpool_get(p, (size_t)1 + (size_t)(mix((uint64_t)i) % 20000), NULL);
    ck_assert_ptr_nonnull(v[i]);
  }
  for (int i = N - 1; i > 0; i--) {
    int j = (int)(mix((uint64_t)i + 77) % (uint64_t)(i + 1));
    void *t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
  /* Put half, trim them away, put the rest: every put is recognised. */
  for (int i = 0; i < N / 2; i++) devpool_put(p, v[i]);
  devpool_trim(p);
  for (int i = N / 2; i < N; i++) devpool_put(p, v[i]);
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.bad_puts, 0);
  ck_assert_uint_eq(s.blocks_in_use, 0);
  ck_assert_uint_eq(s.blocks_cached, N - N / 2);
  ck_assert_int_eq(f.live, N - N / 2);
  free(v);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(pool_free_all) {
  fake_dev f;
  devpool *p = fake_pool(&f, 1 << 20);
  for (int i = 0; i < 10; i++) ck_assert_ptr_nonnull(devpool_get(p, 700, NULL));
  for (int i = 0; i < 5; i++) {
    void *q = devpool_get(p, 3000 + (size_t)i * 1000, NULL);
    ck_assert_ptr_nonnull(q);
    devpool_put(p, q);
  }
  ck_assert_int_eq(f.live, 15);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
  ck_assert_uint_eq(f.live_bytes, 0);
  ck_assert_uint_eq(f.releases, 15);
  devpool_free(NULL);
}
END_TEST

/* Four threads get and put blocks of random sizes under a tight budget,
 * each stamping its blocks with its id and checking the stamp before
 * the put: a block handed to two threads at once shows as a stamp
 * overwritten. */
typedef struct pool_worker {
  devpool *p;
  unsigned id;
  long gets, nulls, errors;
} pool_worker;

enum { POOL_ITERS = 20000, POOL_HELD = 8 };

static void stamp(uint64_t *w, size_t words, uint64_t tag) {
  w[0] = tag;
  w[words / 2] = tag;
  w[words - 1] = tag;
}

static bool stamped(const uint64_t *w, size_t words, uint64_t tag) {
  return w[0] == tag && w[words / 2] == tag && w[words - 1] == tag;
}

static void *pool_work(void *arg) {
  pool_worker *w = arg;
  uint64_t *held[POOL_HELD] = {0};
  size_t words[POOL_HELD] = {0};
  uint64_t tag[POOL_HELD] = {0};
  uint64_t r = w->id;
  for (long it = 0; it < POOL_ITERS; it++) {
    r = mix(r);
    int k = (int)(r % POOL_HELD);
    if (held[k]) {
      if (!stamped(held[k], words[k], tag[k])) w->errors++;
      devpool_put(w->p, held[k]);
      held[k] = NULL;
      continue;
    }
    size_t want = 1 + (size_t)((r >> 8) % 16384), got;
    uint64_t *b = devpool_get(w->p, want, &got);
    w->gets++;
    if (!b) {
      w->nulls++;
      continue;
    }
    if (got < want || got % 8) w->errors++;
    held[k] = b;
    words[k] = got / 8;
    tag[k] = ((uint64_t)w->id << 32) | (uint64_t)it;
    stamp(b, words[k], tag[k]);
  }
  for (int k = 0; k < POOL_HELD; k++) {
    if (!held[k]) continue;
    if (!stamped(held[k], words[k], tag[k])) w->errors++;
    devpool_put(w->p, held[k]);
  }
  return NULL;
}

START_TEST(pool_threads) {
  fake_dev f;
  size_t budget = 256 << 10;
  devpool *p = fake_pool(&f, budget);
  pthread_t t[4];
  pool_worker w[4];
  for (unsigned i = 0; i < 4; i++) {
    w[i] = (pool_worker){.p = p, .id = i + 1};
    ck_assert_int_eq(pthread_create(&t[i], NULL, pool_work, &w[i]), 0);
  }
  long gets = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].errors, 0);
    gets += w[i].gets;
  }
  devpool_stats s = pool_stats(p);
  ck_assert_uint_eq(s.bad_puts, 0);
  ck_assert_uint_eq(s.blocks_in_use, 0);
  ck_assert_uint_eq(s.bytes_in_use, 0);
  ck_assert_uint_le(s.peak_bytes, budget);
  ck_assert_uint_le(s.bytes_cached, budget);
  ck_assert_uint_gt(s.hits, 0);
  ck_assert_uint_le(s.hits + s.allocs, (unsigned long long)gets);
  ck_assert_int_eq(f.live, (long)s.blocks_cached);
  devpool_free(p);
  ck_assert_int_eq(f.live, 0);
}
END_TEST

/* ---- blobcache ---- */

typedef struct cache_env {
  fake_dev f;
  fake_up u;
  devpool *p;
  blobcache *c;
} cache_env;

static void cache_open(cache_env *e, size_t pool_budget, size_t budget) {
  e->p = fake_pool(&e->f, pool_budget);
  up_init(&e->u);
  e->c = blobcache_new(e->p, budget, fake_upload, &e->u);
  ck_assert_ptr_nonnull(e->c);
}

/* Frees the cache and the pool; nothing may stay allocated. */
static void cache_close(cache_env *e) {
  blobcache_free(e->c);
  devpool_stats s = pool_stats(e->p);
  ck_assert_uint_eq(s.blocks_in_use, 0);
  devpool_free(e->p);
  ck_assert_int_eq(e->f.live, 0);
}

/* Acquires content id of n bytes; checks the device bytes. */
static void *get(cache_env *e, unsigned id, size_t n, bool *hit) {
  uint8_t h[32];
  hash_of(id, h);
  uint8_t *host = content(id, n);
  void *dev = blobcache_acquire(e->c, h, host, n, hit);
  if (dev) ck_assert_mem_eq(dev, host, n);
  free(host);
  return dev;
}

/* Whether content id of n bytes is resident (acquired and released). */
static bool resident(cache_env *e, unsigned id, size_t n) {
  bool hit = false;
  void *d = get(e, id, n, &hit);
  ck_assert_ptr_nonnull(d);
  blobcache_release(e->c, d);
  return hit;
}

START_TEST(cache_hit_miss) {
  cache_env e;
  cache_open(&e, 0, 0);
  bool hit = true;
  void *a = get(&e, 1, 1000, &hit);
  ck_assert_ptr_nonnull(a);
  ck_assert(!hit);
  ck_assert_uint_eq(e.u.calls, 1);
  blobcache_release(e.c, a);
  void *b = get(&e, 1, 1000, &hit);
  ck_assert_ptr_eq(a, b);
  ck_assert(hit);
  ck_assert_uint_eq(e.u.calls, 1);
  /* Acquired twice at once: two references, two releases. */
  void *b2 = get(&e, 1, 1000, NULL);
  ck_assert_ptr_eq(b, b2);
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.hits, 2);
  ck_assert_uint_eq(s.misses, 1);
  ck_assert_uint_eq(s.entries, 1);
  ck_assert_uint_eq(s.pinned, 1);
  ck_assert_uint_eq(s.bytes, 1024);
  blobcache_release(e.c, b);
  ck_assert_uint_eq(cache_stats(e.c).pinned, 1);
  blobcache_release(e.c, b2);
  ck_assert_uint_eq(cache_stats(e.c).pinned, 0);
  /* A different hash, and a zero-length blob (uploads nothing). */
  ck_assert(!resident(&e, 2, 1000));
  ck_assert(!resident(&e, 3, 0));
  ck_assert(resident(&e, 3, 0));
  ck_assert_uint_eq(e.u.calls, 2);
  ck_assert_uint_eq(cache_stats(e.c).entries, 3);
  cache_close(&e);
}
END_TEST

START_TEST(cache_length_distinct) {
  cache_env e;
  cache_open(&e, 0, 0);
  uint8_t h[32];
  hash_of(9, h);
  uint8_t *host = content(9, 600);
  bool hit;
  void *a = blobcache_acquire(e.c, h, host, 500, &hit);
  ck_assert(!hit);
  void *b = blobcache_acquire(e.c, h, host, 600, &hit);
  ck_assert(!hit);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_ne(a, b);
  ck_assert_uint_eq(cache_stats(e.c).entries, 2);
  blobcache_release(e.c, a);
  blobcache_release(e.c, b);
  ck_assert_ptr_eq(blobcache_acquire(e.c, h, host, 500, &hit), a);
  ck_assert(hit);
  ck_assert_ptr_eq(blobcache_acquire(e.c, h, host, 600, &hit), b);
  ck_assert(hit);
  blobcache_release(e.c, a);
  blobcache_release(e.c, b);
  free(host);
  cache_close(&e);
}
END_TEST

START_TEST(cache_pinned_not_evicted) {
  cache_env e;
  cache_open(&e, 0, 2048); /* two 1024-byte entries */
  void *a = get(&e, 1, 1024, NULL);
  void *b = get(&e, 2, 1024, NULL);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_null(get(&e, 3, 1024, NULL));
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.evictions, 0);
  ck_assert_uint_eq(s.entries, 2);
  ck_assert_uint_eq(s.pinned, 2);
  /* Both still hold their bytes. */
  uint8_t *want = content(1, 1024);
  ck_assert_mem_eq(a, want, 1024);
  free(want);
  blobcache_release(e.c, a);
  void *c = get(&e, 3, 1024, NULL);
  ck_assert_ptr_nonnull(c);
  s = cache_stats(e.c);
  ck_assert_uint_eq(s.evictions, 1);
  ck_assert_uint_eq(s.entries, 2);
  /* b was never evicted; 1 was. */
  blobcache_release(e.c, b);
  blobcache_release(e.c, c);
  ck_assert(resident(&e, 2, 1024));
  ck_assert(resident(&e, 3, 1024));
  ck_assert(!resident(&e, 1, 1024));
  cache_close(&e);
}
END_TEST

START_TEST(cache_lru_order) {
  cache_env e;
  cache_open(&e, 0, 3 * 1024);
  ck_assert(!resident(&e, 1, 1024));
  ck_assert(!resident(&e, 2, 1024));
  ck_assert(!resident(&e, 3, 1024));
  ck_assert(resident(&e, 1, 1024));  /* 1 is now the most recent */
  ck_assert(!resident(&e, 4, 1024)); /* evicts 2, the least recent */
  ck_assert_uint_eq(cache_stats(e.c).evictions, 1);
  ck_assert(resident(&e, 3, 1024));
  ck_assert(resident(&e, 1, 1024));
  ck_assert(resident(&e, 4, 1024));
  ck_assert_uint_eq(cache_stats(e.c).evictions, 1);
  /* Order now 3, 1, 4 (least recent first): a 2048-byte entry evicts 3
   * and 1, not 4. */
  ck_assert(!resident(&e, 5, 2048));
  ck_assert_uint_eq(cache_stats(e.c).evictions, 3);
  ck_assert(resident(&e, 4, 1024));
  ck_assert(!resident(&e, 2, 1024)); /* evicts 5 (least recent) */
  ck_assert(resident(&e, 4, 1024));
  ck_assert(resident(&e, 2, 1024));
  /* Order 4, 2: room for 2048 more takes evicting 4 only. */
  ck_assert(!resident(&e, 5, 2048));
  ck_assert(resident(&e, 2, 1024));
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.evictions, 5);
  ck_assert_uint_eq(s.entries, 2);
  ck_assert_uint_eq(s.bytes, 3072);
  cache_close(&e);
}
END_TEST

START_TEST(cache_upload_failure) {
  cache_env e;
  cache_open(&e, 0, 0);
  e.u.fail_nth = 1;
  bool hit = true;
  ck_assert_ptr_null(get(&e, 1, 5000, &hit));
  ck_assert(!hit);
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.upload_failures, 1);
  ck_assert_uint_eq(s.entries, 0);
  ck_assert_uint_eq(s.bytes, 0);
  ck_assert_uint_eq(s.pinned, 0);
  devpool_stats ps = pool_stats(e.p);
  ck_assert_uint_eq(ps.blocks_in_use, 0);
  ck_assert_uint_eq(ps.blocks_cached, 1);
  /* The next acquire misses, uploads, and reuses the pool's block. */
  ck_assert(!resident(&e, 1, 5000));
  ck_assert(resident(&e, 1, 5000));
  ck_assert_uint_eq(e.u.calls, 2);
  ck_assert_uint_eq(pool_stats(e.p).allocs, 1);
  cache_close(&e);
}
END_TEST

START_TEST(cache_budget) {
  cache_env e;
  cache_open(&e, 0, 10000);
  /* Bytes are counted in class sizes: 1100 bytes hold 1280. */
  ck_assert(!resident(&e, 1, 1100));
  ck_assert_uint_eq(cache_stats(e.c).bytes, 1280);
  ck_assert_ptr_null(get(&e, 2, 10001, NULL)); /* larger than the budget */
  ck_assert_uint_eq(cache_stats(e.c).entries, 1);
  for (unsigned id = 10; id < 60; id++) {
    ck_assert(!resident(&e, id, 100 + (size_t)id * 37));
    blobcache_stats s = cache_stats(e.c);
    ck_assert_uint_le(s.bytes, 10000);
  }
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_gt(s.evictions, 0);
  ck_assert_uint_eq(s.entries + s.evictions, 51);
  ck_assert_uint_eq(s.misses, 52);
  ck_assert_uint_eq(pool_stats(e.p).blocks_in_use, s.entries);
  cache_close(&e);
}
END_TEST

/* The pool, not the cache's budget, runs out: the cache gives back its
 * unreferenced entries and the pool retries. */
START_TEST(cache_pool_full) {
  cache_env e;
  cache_open(&e, 0, 0);
  e.f.limit = 4096;
  void *a = get(&e, 1, 2048, NULL);
  ck_assert_ptr_nonnull(a);
  ck_assert(!resident(&e, 2, 1024));
  ck_assert(!resident(&e, 3, 1024));
  /* 2048 more: no room on the device until 2 and 3 are evicted. */
  void *b = get(&e, 4, 2048, NULL);
  ck_assert_ptr_nonnull(b);
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.evictions, 2);
  ck_assert_uint_eq(s.entries, 2);
  /* Everything pinned: a failure, and nothing is left behind. */
  ck_assert_ptr_null(get(&e, 5, 256, NULL));
  s = cache_stats(e.c);
  ck_assert_uint_eq(s.entries, 2);
  ck_assert_uint_eq(s.pinned, 2);
  ck_assert_uint_eq(pool_stats(e.p).blocks_in_use, 2);
  blobcache_release(e.c, a);
  blobcache_release(e.c, b);
  e.f.fail_all = true;
  ck_assert_ptr_null(get(&e, 6, 100, NULL));
  ck_assert_uint_eq(cache_stats(e.c).entries, 0);
  cache_close(&e);
}
END_TEST

START_TEST(cache_bad_release) {
  cache_env e;
  cache_open(&e, 0, 0);
  void *a = get(&e, 1, 300, NULL);
  char foreign[8];
  blobcache_release(e.c, foreign);
  blobcache_release(e.c, (char *)a + 1);
  blobcache_release(e.c, NULL); /* like free(NULL): not counted */
  blobcache_release(e.c, a);
  blobcache_release(e.c, a); /* no reference left */
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.bad_releases, 3);
  ck_assert_uint_eq(s.pinned, 0);
  ck_assert_uint_eq(s.entries, 1);
  ck_assert(resident(&e, 1, 300));
  cache_close(&e);
}
END_TEST

START_TEST(cache_clear) {
  cache_env e;
  cache_open(&e, 0, 0);
  void *a = get(&e, 1, 700, NULL);
  ck_assert(!resident(&e, 2, 700));
  ck_assert(!resident(&e, 3, 700));
  blobcache_clear(e.c);
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.entries, 1);
  ck_assert_uint_eq(s.evictions, 2);
  ck_assert_uint_eq(s.bytes, 768);
  ck_assert(!resident(&e, 2, 700));
  blobcache_release(e.c, a);
  ck_assert(resident(&e, 1, 700));
  blobcache_clear(e.c);
  ck_assert_uint_eq(cache_stats(e.c).entries, 0);
  ck_assert_uint_eq(cache_stats(e.c).bytes, 0);
  ck_assert_uint_eq(pool_stats(e.p).blocks_in_use, 0);
  cache_close(&e);
}
END_TEST

/* Thousands of entries: both tables grow and delete correctly. */
START_TEST(cache_many) {
  enum { N = 3000 };
  cache_env e;
  cache_open(&e, 0, 0);
  for (unsigned id = 0; id < N; id++) ck_assert(!resident(&e, id, 40 + id % 7));
  for (unsigned id = 0; id < N; id += 3)
    ck_assert(resident(&e, id, 40 + id % 7));
  /* A budget by clearing: then everything misses again. */
  blobcache_clear(e.c);
  ck_assert_uint_eq(cache_stats(e.c).entries, 0);
  for (unsigned id = 0; id < N; id += 5)
    ck_assert(!resident(&e, id, 40 + id % 7));
  ck_assert_uint_eq(cache_stats(e.c).bad_releases, 0);
  cache_close(&e);
}
END_TEST

START_TEST(cache_ranges) {
  cache_env e;
  cache_open(&e, 0, 0);
  static char host[4096];
  uint8_t h1[32], h2[32], h3[32], got[32];
  hash_of(1, h1);
  hash_of(2, h2);
  hash_of(3, h3);
  const void *base;
  size_t len;
  ck_assert_int_eq(blobcache_announce(e.c, host + 100, 100, h1), 0);
  ck_assert_int_eq(blobcache_announce(e.c, host + 300, 50, h2), 0);
  /* Inside: the whole range, a piece, a point. */
  ck_assert(blobcache_find_range(e.c, host + 100, 100, got, &base, &len));
  ck_assert_mem_eq(got, h1, 32);
  ck_assert_ptr_eq(base, host + 100);
  ck_assert_uint_eq(len, 100);
  ck_assert(blobcache_find_range(e.c, host + 150, 10, got, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 199, 1, NULL, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 199, 0, NULL, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 320, 30, got, &base, NULL));
  ck_assert_mem_eq(got, h2, 32);
  ck_assert_ptr_eq(base, host + 300);
  /* Straddling an end, outside, between. */
  ck_assert(!blobcache_find_range(e.c, host + 150, 51, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 99, 2, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 200, 1, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 200, 0, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 50, 10, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 340, SIZE_MAX, NULL, NULL, NULL));
  ck_assert(!blobcache_find_range(e.c, host + 1000, 1, NULL, NULL, NULL));
  /* Overlapping both: replaces them. */
  ck_assert_int_eq(blobcache_announce(e.c, host + 150, 200, h3), 0);
  ck_assert(!blobcache_find_range(e.c, host + 100, 10, NULL, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 300, 50, got, &base, &len));
  ck_assert_mem_eq(got, h3, 32);
  ck_assert_ptr_eq(base, host + 150);
  ck_assert_uint_eq(len, 200);
  /* Adjacent ranges do not overlap; the same base is replaced. */
  ck_assert_int_eq(blobcache_announce(e.c, host + 350, 10, h1), 0);
  ck_assert_int_eq(blobcache_announce(e.c, host + 140, 10, h2), 0);
  ck_assert(blobcache_find_range(e.c, host + 150, 200, got, NULL, NULL));
  ck_assert_mem_eq(got, h3, 32);
  ck_assert(blobcache_find_range(e.c, host + 355, 5, got, NULL, NULL));
  ck_assert_mem_eq(got, h1, 32);
  ck_assert(blobcache_find_range(e.c, host + 140, 10, got, NULL, NULL));
  ck_assert_mem_eq(got, h2, 32);
  ck_assert(!blobcache_find_range(e.c, host + 345, 10, NULL, NULL, NULL));
  ck_assert_int_eq(blobcache_announce(e.c, host + 350, 20, h2), 0);
  ck_assert(blobcache_find_range(e.c, host + 365, 5, got, NULL, &len));
  ck_assert_mem_eq(got, h2, 32);
  ck_assert_uint_eq(len, 20);
  /* Retract: only by the exact start. */
  blobcache_retract(e.c, host + 151);
  ck_assert(blobcache_find_range(e.c, host + 151, 1, NULL, NULL, NULL));
  blobcache_retract(e.c, host + 150);
  ck_assert(!blobcache_find_range(e.c, host + 151, 1, NULL, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 140, 10, NULL, NULL, NULL));
  ck_assert(blobcache_find_range(e.c, host + 350, 20, NULL, NULL, NULL));
  blobcache_retract(e.c, host + 150);
  /* Bad arguments. */
  ck_assert_int_eq(blobcache_announce(e.c, host, 0, h1), -1);
  ck_assert_int_eq(blobcache_announce(e.c, NULL, 10, h1), -1);
  ck_assert_int_eq(blobcache_announce(e.c, host + 1, SIZE_MAX, h1), -1);
  /* Many ranges, announced out of order. */
  for (int i = 0; i < 64; i++) {
    int k = (i * 37) % 64;
    uint8_t hk[32];
    hash_of(100 + (unsigned)k, hk);
    ck_assert_int_eq(blobcache_announce(e.c, host + 1024 + 32 * k, 32, hk), 0);
  }
  for (int k = 0; k < 64; k++) {
    uint8_t hk[32];
    hash_of(100 + (unsigned)k, hk);
    ck_assert(blobcache_find_range(e.c, host + 1024 + 32 * k + 3, 29, got,
                                   &base, NULL));
    ck_assert_mem_eq(got, hk, 32);
    ck_assert_ptr_eq(base, host + 1024 + 32 * k);
    ck_assert(!blobcache_find_range(e.c, host + 1024 + 32 * k + 3, 30, NULL,
                                    NULL, NULL));
  }
  cache_close(&e);
}
END_TEST

/* Four threads acquire and release 24 contents (twice what the budget
 * holds), holding up to three at a time and checking the device bytes
 * on acquire and again before release: an entry evicted while in use,
 * or a block shared by two entries, shows as changed bytes. */
enum { CACHE_IDS = 24, CACHE_ITERS = 4000, CACHE_HELD = 3 };

typedef struct cache_shared {
  blobcache *c;
  uint8_t hash[CACHE_IDS][32];
  uint8_t *host[CACHE_IDS];
  size_t len[CACHE_IDS];
} cache_shared;

typedef struct cache_worker {
  cache_shared *sh;
  unsigned id;
  long acquires, nulls, errors;
} cache_worker;

static void *cache_work(void *arg) {
  cache_worker *w = arg;
  cache_shared *sh = w->sh;
  void *held[CACHE_HELD] = {0};
  int which[CACHE_HELD] = {0};
  uint64_t r = 1000 + w->id;
  for (long it = 0; it < CACHE_ITERS; it++) {
    r = mix(r);
    int k = (int)(r % CACHE_HELD);
    if (held[k]) {
      int i = which[k];
      if (memcmp(held[k], sh->host[i], sh->len[i]) != 0) w->errors++;
      blobcache_release(sh->c, held[k]);
      held[k] = NULL;
      continue;
    }
    int i = (int)((r >> 8) % CACHE_IDS);
    void *d =
        blobcache_acquire(sh->c, sh->hash[i], sh->host[i], sh->len[i], NULL);
    w->acquires++;
    if (!d) {
      w->nulls++;
      continue;
    }
    if (memcmp(d, sh->host[i], sh->len[i]) != 0) w->errors++;
    held[k] = d;
    which[k] = i;
  }
  for (int k = 0; k < CACHE_HELD; k++) {
    if (!held[k]) continue;
    int i = which[k];
    if (memcmp(held[k], sh->host[i], sh->len[i]) != 0) w->errors++;
    blobcache_release(sh->c, held[k]);
  }
  return NULL;
}

START_TEST(cache_threads) {
  cache_env e;
  cache_shared sh;
  size_t total = 0;
  for (unsigned i = 0; i < CACHE_IDS; i++) {
    sh.len[i] = 200 + (size_t)i * 150;
    sh.host[i] = content(i, sh.len[i]);
    hash_of(i, sh.hash[i]);
    total += devpool_class_size(sh.len[i]);
  }
  cache_open(&e, 0, total / 2);
  sh.c = e.c;
  pthread_t t[4];
  cache_worker w[4];
  for (unsigned i = 0; i < 4; i++) {
    w[i] = (cache_worker){.sh = &sh, .id = i};
    ck_assert_int_eq(pthread_create(&t[i], NULL, cache_work, &w[i]), 0);
  }
  unsigned long long acquires = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(w[i].errors, 0);
    acquires += (unsigned long long)w[i].acquires;
  }
  blobcache_stats s = cache_stats(e.c);
  ck_assert_uint_eq(s.hits + s.misses, acquires);
  ck_assert_uint_gt(s.hits, 0);
  ck_assert_uint_gt(s.evictions, 0);
  ck_assert_uint_eq(s.pinned, 0);
  ck_assert_uint_eq(s.bad_releases, 0);
  ck_assert_uint_le(s.bytes, total / 2);
  ck_assert_uint_eq(pool_stats(e.p).blocks_in_use, s.entries);
  for (unsigned i = 0; i < CACHE_IDS; i++) free(sh.host[i]);
  cache_close(&e);
}
END_TEST

/* ---- span ---- */

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* span_elems' result as "rc lo hi". */
static void span_is(int rank, const int64_t *ext, const int64_t *str, int rc,
                    int64_t lo, int64_t hi) {
  int64_t l = 12345, h = 12345;
  ck_assert_int_eq(span_elems(rank, ext, str, &l, &h), rc);
  if (rc != 0) return;
  ck_assert_int_eq(l, lo);
  ck_assert_int_eq(h, hi);
}

START_TEST(span_positive) {
  span_is(0, NULL, NULL, 0, 0, 1);
  span_is(1, S(5), S(1), 0, 0, 5);
  span_is(2, S(3, 4), S(4, 1), 0, 0, 12);
  span_is(2, S(3, 4), S(1, 3), 0, 0, 12);  /* transposed */
  span_is(2, S(3, 4), S(10, 1), 0, 0, 24); /* narrowed rows */
  span_is(3, S(2, 3, 4), S(100, 10, 2), 0, 0, 100 + 20 + 6 + 1);
}
END_TEST

START_TEST(span_zero_negative) {
  span_is(2, S(3, 4), S(0, 1), 0, 0, 4);   /* broadcast rows */
  span_is(2, S(3, 4), S(0, 0), 0, 0, 1);   /* one element, everywhere */
  span_is(1, S(5), S(-1), 0, -4, 1);       /* reversed */
  span_is(2, S(3, 4), S(-4, 1), 0, -8, 4); /* rows reversed */
  span_is(2, S(3, 4), S(4, -1), 0, -3, 9);
  span_is(3, S(2, 2, 2), S(-10, 0, 3), 0, -10, 4);
}
END_TEST

START_TEST(span_empty_and_one) {
  span_is(1, S(0), S(1), 0, 0, 0);
  span_is(3, S(4, 0, 4), S(-100, 7, 1000), 0, 0, 0);
  /* An empty dim wins even with strides that would overflow. */
  span_is(2, S(0, INT64_MAX), S(1, INT64_MAX), 0, 0, 0);
  span_is(1, S(1), S(INT64_MIN), 0, 0, 1); /* extent 1: stride unused */
  span_is(3, S(1, 1, 1), S(9, -9, 0), 0, 0, 1);
  span_is(2, S(1, 6), S(INT64_MAX, -2), 0, -10, 1);
  span_is(1, S(-1), S(1), -1, 0, 0);
  span_is(2, S(0, -3), S(1, 1), -1, 0, 0);
  span_is(-1, NULL, NULL, -1, 0, 0);
}
END_TEST

START_TEST(span_overflow) {
  span_is(1, S(INT64_MAX), S(2), -1, 0, 0);
  span_is(1, S(3), S(INT64_MAX / 2 + 1), -1, 0, 0);
  span_is(1, S(3), S(INT64_MIN / 2), 0, INT64_MIN, 1);
  span_is(1, S(3), S(INT64_MIN / 2 - 1), -1, 0, 0);
  span_is(2, S(2, 2), S(INT64_MAX / 2 + 1, INT64_MAX / 2 + 1), -1, 0, 0);
  span_is(2, S(2, 2), S(INT64_MIN / 2, INT64_MIN / 2), 0, INT64_MIN, 1);
  span_is(2, S(2, 2), S(INT64_MIN / 2, INT64_MIN / 2 - 1), -1, 0, 0);
  /* hi = max + 1 must fit too. */
  span_is(1, S(2), S(INT64_MAX - 1), 0, 0, INT64_MAX);
  span_is(1, S(2), S(INT64_MAX), -1, 0, 0);
  span_is(1, S(INT64_MAX), S(1), 0, 0, INT64_MAX);
}
END_TEST

START_TEST(span_contiguous) {
  ck_assert(span_is_contiguous(0, NULL, NULL));
  ck_assert(span_is_contiguous(1, S(5), S(1)));
  ck_assert(!span_is_contiguous(1, S(5), S(2)));
  ck_assert(!span_is_contiguous(1, S(5), S(-1)));
  ck_assert(span_is_contiguous(2, S(3, 4), S(4, 1)));
  ck_assert(!span_is_contiguous(2, S(3, 4), S(1, 3)));
  ck_assert(!span_is_contiguous(2, S(3, 4), S(8, 1)));
  ck_assert(!span_is_contiguous(2, S(3, 4), S(0, 1)));
  /* Dims of extent 1 have any stride. */
  ck_assert(span_is_contiguous(3, S(3, 1, 4), S(4, 999, 1)));
  ck_assert(span_is_contiguous(3, S(1, 3, 4), S(-7, 4, 1)));
  ck_assert(span_is_contiguous(2, S(1, 1), S(0, 5)));
  ck_assert(span_is_contiguous(2, S(4, 1), S(1, 0)));
  ck_assert(span_is_contiguous(4, S(2, 3, 1, 5), S(15, 5, 0, 1)));
  ck_assert(!span_is_contiguous(4, S(2, 3, 1, 5), S(16, 5, 0, 1)));
  /* Empty counts as contiguous, a negative extent does not. */
  ck_assert(span_is_contiguous(2, S(0, 4), S(123, 456)));
  ck_assert(!span_is_contiguous(2, S(-1, 4), S(4, 1)));
  ck_assert(!span_is_contiguous(-1, NULL, NULL));
}
END_TEST

Suite *cuda_host_suite(void) {
  Suite *s = suite_create("cuda_host");
  TCase *p = tcase_create("devpool");
  tcase_set_timeout(p, 120);
  tcase_add_test(p, pool_classes);
  tcase_add_test(p, pool_reuse);
  tcase_add_test(p, pool_budget);
  tcase_add_test(p, pool_trim_retry);
  tcase_add_test(p, pool_alloc_failure);
  tcase_add_test(p, pool_bad_puts);
  tcase_add_test(p, pool_stats_peak);
  tcase_add_test(p, pool_many);
  tcase_add_test(p, pool_free_all);
  tcase_add_test(p, pool_threads);
  suite_add_tcase(s, p);
  TCase *c = tcase_create("blobcache");
  tcase_set_timeout(c, 120);
  tcase_add_test(c, cache_hit_miss);
  tcase_add_test(c, cache_length_distinct);
  tcase_add_test(c, cache_pinned_not_evicted);
  tcase_add_test(c, cache_lru_order);
  tcase_add_test(c, cache_upload_failure);
  tcase_add_test(c, cache_budget);
  tcase_add_test(c, cache_pool_full);
  tcase_add_test(c, cache_bad_release);
  tcase_add_test(c, cache_clear);
  tcase_add_test(c, cache_many);
  tcase_add_test(c, cache_ranges);
  tcase_add_test(c, cache_threads);
  suite_add_tcase(s, c);
  TCase *sp = tcase_create("span");
  tcase_add_test(sp, span_positive);
  tcase_add_test(sp, span_zero_negative);
  tcase_add_test(sp, span_empty_and_one);
  tcase_add_test(sp, span_overflow);
  tcase_add_test(sp, span_contiguous);
  suite_add_tcase(s, sp);
  return s;
}
