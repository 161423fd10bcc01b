/*
 * test_pool.c - the buffer pool: reuse, size classes, alignment, the idle
 * cap and thread safety.
 *
 * The suites may run in one process (CK_FORK=no), so every test starts
 * from pool_trim() and asserts only on buffers it owns.
 */
#include <pthread.h>
#include <stdint.h>

#include "internal.h"
#include "testutil.h"

static bool aligned64(const void *p) {
  return ((uintptr_t)p & 63u) == 0;
}

START_TEST(test_pool_reuses_freed_buffer) {
  pool_trim();
  size_t c1 = 0, c2 = 0;
  void *p = pool_alloc(1000, &c1);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_ge(c1, 1000);
  memset(p, 0xAB, c1);
  pool_free(p, c1);
  ck_assert_uint_eq(pool_idle_bytes(), c1);
  void *q = pool_alloc(1000, &c2);
  ck_assert_ptr_eq(q, p);
  ck_assert_uint_eq(c2, c1);
  ck_assert_uint_eq(pool_idle_bytes(), 0);
  /* Any request of the same class takes the same buffer. */
  pool_free(q, c2);
  void *r = pool_alloc(c1, &c2);
  ck_assert_ptr_eq(r, p);
  ck_assert_uint_eq(c2, c1);
  pool_free(r, c2);
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
}
END_TEST

START_TEST(test_pool_large_buffer_reused) {
  /* The case the pool exists for: a big activation buffer comes back to
   * the next step instead of going to the OS. */
  pool_trim();
  size_t c = 0, c2 = 0;
  void *p = pool_alloc((size_t)48 << 20, &c);
  ck_assert_ptr_nonnull(p);
  pool_free(p, c);
  void *q = pool_alloc((size_t)47 << 20, &c2);
  ck_assert_ptr_eq(q, p);
  ck_assert_uint_eq(c2, c);
  pool_free(q, c2);
  pool_trim();
}
END_TEST

START_TEST(test_pool_zero_and_small) {
  pool_trim();
  size_t c = 12345;
  void *p = pool_alloc(0, &c);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(c, 64);
  ck_assert(aligned64(p));
  pool_free(p, c);
  for (size_t bytes = 1; bytes <= 4096; bytes += 13) {
    void *b = pool_alloc(bytes, &c);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_ge(c, bytes);
    ck_assert_uint_eq(c % 64, 0);
    /* Below 64 KiB a class wastes at most a quarter power plus the 64-byte
     * rounding. */
    ck_assert_uint_le(c, bytes * 1.19 + 64);
    ck_assert(aligned64(b));
    memset(b, 0x5A, c); /* the whole capacity is usable */
    pool_free(b, c);
  }
  pool_trim();
}
END_TEST

START_TEST(test_pool_class_rounding) {
  /* Walk the classes from 64 KiB to 512 MiB by asking one byte more than
   * the previous capacity: that is the worst case for waste. */
  pool_trim();
  size_t c = 0;
  void *p = pool_alloc((size_t)64 << 10, &c);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq(c, (size_t)64 << 10); /* exact powers of two fit */
  pool_free(p, c);
  pool_trim();
  int classes = 0;
  while (c < ((size_t)512 << 20)) {
    size_t want = c + 1, got = 0;
    void *b = pool_alloc(want, &got);
    ck_assert_ptr_nonnull(b);
    ck_assert(aligned64(b));
    ck_assert_uint_ge(got, want);
    ck_assert_uint_eq(got % 64, 0);
    double waste = (double)(got - want) / (double)want;
    ck_assert_msg(waste < 0.19, "%zu bytes -> capacity %zu (%.4f waste)", want,
                  got, waste);
    /* Quarter powers of two: consecutive classes differ by ~2^(1/4). */
    double ratio = (double)got / (double)c;
    ck_assert_msg(ratio > 1.18 && ratio < 1.20, "class ratio %.5f at %zu",
                  ratio, got);
    /* An exact request for a capacity gets that capacity back. */
    size_t again = 0;
    pool_free(b, got);
    void *b2 = pool_alloc(got, &again);
    ck_assert_ptr_eq(b2, b);
    ck_assert_uint_eq(again, got);
    pool_free(b2, again);
    pool_trim();
    c = got;
    classes++;
  }
  ck_assert_int_eq(classes, 4 * 13); /* 2^16 .. 2^29 in quarter steps */
}
END_TEST

START_TEST(test_pool_overflow) {
  size_t c = 77;
  ck_assert_ptr_null(pool_alloc(SIZE_MAX, &c));
  ck_assert_ptr_null(pool_alloc(SIZE_MAX / 2, &c));
  ck_assert_ptr_null(pool_alloc(((size_t)1 << 62) + 1, &c));
  pool_free(NULL, 64); /* harmless */
}
END_TEST

START_TEST(test_pool_idle_accounting_and_trim) {
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
  size_t caps[3];
  void *bufs[3];
  size_t sizes[3] = {100000, 3000, 1 << 20};
  size_t total = 0;
  for (int i = 0; i < 3; i++) {
    bufs[i] = pool_alloc(sizes[i], &caps[i]);
    ck_assert_ptr_nonnull(bufs[i]);
    total += caps[i];
  }
  ck_assert_uint_eq(pool_idle_bytes(), 0);
  for (int i = 0; i < 3; i++) pool_free(bufs[i], caps[i]);
  ck_assert_uint_eq(pool_idle_bytes(), total);
  size_t c;
  void *again = pool_alloc(sizes[1], &c);
  ck_assert_ptr_eq(again, bufs[1]);
  ck_assert_uint_eq(pool_idle_bytes(), total - caps[1]);
  pool_free(again, c);
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
  pool_trim(); /* trimming an empty pool is harmless */
  ck_assert_uint_eq(pool_idle_bytes(), 0);
}
END_TEST

START_TEST(test_pool_idle_cap) {
  /* The cap comes from TOPOS_POOL_BYTES once per process, so the test
   * reads the same setting.  Five 256 MiB buffers are only reserved, never
   * touched, so this costs address space, not memory. */
  const char *env = getenv("TOPOS_POOL_BYTES");
  size_t cap = (size_t)1 << 30;
  if (env != NULL && *env != '\0') cap = (size_t)strtoull(env, NULL, 10);
  pool_trim();
  const size_t big = (size_t)256 << 20;
  void *bufs[5];
  size_t caps[5];
  for (int i = 0; i < 5; i++) {
    bufs[i] = pool_alloc(big, &caps[i]);
    ck_assert_ptr_nonnull(bufs[i]);
    ck_assert_uint_eq(caps[i], big);
  }
  for (int i = 0; i < 5; i++) {
    pool_free(bufs[i], caps[i]);
    ck_assert_uint_le(pool_idle_bytes(), cap);
  }
  size_t kept = cap / big < 5 ? cap / big : 5;
  ck_assert_uint_eq(pool_idle_bytes(), kept * big);
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
}
END_TEST

/* The cap can be set (the daemon's --pool-bytes): idle buffers above it
 * go at once, largest first, and later frees above it go to the system;
 * topos_pool_release trims to a bound without changing the cap. */
START_TEST(test_pool_set_cap_and_release) {
  size_t saved = topos_pool_cap();
  topos_pool_set_cap((size_t)1 << 30);
  pool_trim();
  const size_t mib = (size_t)1 << 20;
  void *small[4], *big;
  size_t cs[4], cb;
  for (int i = 0; i < 4; i++) {
    small[i] = pool_alloc(mib, &cs[i]);
    ck_assert_ptr_nonnull(small[i]);
    ck_assert_uint_eq(cs[i], mib);
  }
  big = pool_alloc(8 * mib, &cb);
  ck_assert_ptr_nonnull(big);
  ck_assert_uint_eq(cb, 8 * mib);
  pool_free(big, cb);
  for (int i = 0; i < 4; i++) pool_free(small[i], cs[i]);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 12 * mib);
  /* Largest first: the 8 MiB buffer goes, the four 1 MiB ones stay. */
  topos_pool_release(5 * mib);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 4 * mib);
  ck_assert_uint_eq(topos_pool_cap(), (size_t)1 << 30);
  /* A lower cap trims at once and bounds what later frees keep. */
  topos_pool_set_cap(2 * mib + mib / 2);
  ck_assert_uint_eq(topos_pool_cap(), 2 * mib + mib / 2);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 2 * mib);
  size_t c1, c2;
  void *a = pool_alloc(mib, &c1), *b = pool_alloc(mib, &c2);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 0);
  void *x = pool_alloc(4 * mib, &c1);
  pool_free(x, c1); /* over the cap alone: freed */
  ck_assert_uint_eq(topos_pool_idle_bytes(), 0);
  pool_free(a, mib);
  pool_free(b, mib);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 2 * mib);
  topos_pool_set_cap(0); /* nothing idle at all */
  ck_assert_uint_eq(topos_pool_idle_bytes(), 0);
  a = pool_alloc(100, &c1);
  pool_free(a, c1);
  ck_assert_uint_eq(topos_pool_idle_bytes(), 0);
  topos_pool_set_cap(saved);
  pool_trim();
}
END_TEST

/* Bytes handed out and their high-water mark, at class sizes. */
START_TEST(test_pool_used_and_peak) {
  pool_trim();
  pool_peak_reset();
  size_t base = pool_used_bytes();
  ck_assert_uint_eq(pool_peak_bytes(), base);
  size_t c1, c2;
  void *a = pool_alloc(1000, &c1);
  void *b = pool_alloc(100000, &c2);
  ck_assert_uint_eq(pool_used_bytes(), base + c1 + c2);
  pool_free(b, c2);
  ck_assert_uint_eq(pool_used_bytes(), base + c1);
  ck_assert_uint_eq(pool_peak_bytes(), base + c1 + c2);
  /* Reused from the free list: counted the same. */
  b = pool_alloc(100000, &c2);
  ck_assert_uint_eq(pool_peak_bytes(), base + c1 + c2);
  pool_free(a, c1);
  pool_free(b, c2);
  ck_assert_uint_eq(pool_used_bytes(), base);
  pool_peak_reset();
  ck_assert_uint_eq(pool_peak_bytes(), base);
  ck_assert_uint_eq(pool_capacity_of(1000), c1);
  ck_assert_uint_eq(pool_capacity_of(SIZE_MAX), SIZE_MAX);
  ck_assert_uint_eq(pool_bytes_of(250, 4), c1);
  ck_assert_uint_eq(pool_bytes_of(-1, 4), SIZE_MAX);
  pool_trim();
}
END_TEST

/* Each thread holds a few buffers at a time from a small set of sizes, so
 * buffers move between threads through the shared free lists, and checks
 * that nobody else wrote into a buffer while it held it. */
typedef struct pool_worker {
  int id;
  int failures;
} pool_worker;

static void *pool_thread(void *arg) {
  pool_worker *w = arg;
  static const size_t sizes[4] = {64, 1000, 70000, 300000};
  enum { HELD = 6 };
  void *held[HELD] = {0};
  size_t cap[HELD] = {0}, len[HELD] = {0};
  uint32_t tag[HELD] = {0};
  uint64_t rng = 0x1234567u + (uint64_t)w->id * 7919u;
  for (int iter = 0; iter < 3000; iter++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    int slot = (int)(rng % HELD);
    if (held[slot] != NULL) {
      uint32_t *words = held[slot];
      for (size_t i = 0; i < len[slot] / 4; i++)
        if (words[i] != tag[slot] + (uint32_t)i) {
          w->failures++;
          break;
        }
      pool_free(held[slot], cap[slot]);
      held[slot] = NULL;
    }
    len[slot] = sizes[(rng >> 8) % 4];
    held[slot] = pool_alloc(len[slot], &cap[slot]);
    if (held[slot] == NULL || cap[slot] < len[slot] || !aligned64(held[slot])) {
      w->failures++;
      held[slot] = NULL;
      continue;
    }
    tag[slot] = ((uint32_t)w->id << 24) ^ ((uint32_t)iter << 4);
    uint32_t *words = held[slot];
    for (size_t i = 0; i < len[slot] / 4; i++)
      words[i] = tag[slot] + (uint32_t)i;
  }
  for (int s = 0; s < HELD; s++)
    if (held[s] != NULL) pool_free(held[s], cap[s]);
  return NULL;
}

START_TEST(test_pool_threads) {
  pool_trim();
  pthread_t threads[4];
  pool_worker workers[4];
  for (int i = 0; i < 4; i++) {
    workers[i] = (pool_worker){.id = i + 1, .failures = 0};
    ck_assert_int_eq(
        pthread_create(&threads[i], NULL, pool_thread, &workers[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(pthread_join(threads[i], NULL), 0);
    ck_assert_int_eq(workers[i].failures, 0);
  }
  /* Everything came back: the idle total is a sum of whole classes and
   * trimming empties it. */
  ck_assert_uint_gt(pool_idle_bytes(), 0);
  pool_trim();
  ck_assert_uint_eq(pool_idle_bytes(), 0);
}
END_TEST

Suite *pool_suite(void) {
  Suite *s = suite_create("pool");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_pool_reuses_freed_buffer);
  tcase_add_test(tc, test_pool_large_buffer_reused);
  tcase_add_test(tc, test_pool_zero_and_small);
  tcase_add_test(tc, test_pool_class_rounding);
  tcase_add_test(tc, test_pool_overflow);
  tcase_add_test(tc, test_pool_idle_accounting_and_trim);
  tcase_add_test(tc, test_pool_idle_cap);
  tcase_add_test(tc, test_pool_set_cap_and_release);
  tcase_add_test(tc, test_pool_used_and_peak);
  tcase_add_test(tc, test_pool_threads);
  suite_add_tcase(s, tc);
  return s;
}
