/*
 * pool.c - the process-wide buffer pool every tensor buffer comes from.
 *
 * Why: a training loop allocates the same set of buffer sizes every step.
 * Handing large buffers back to the OS and asking again costs a page fault
 * per fresh page (~11 us each on these machines), which dwarfs the work of
 * small steps.  The pool keeps freed buffers on per-size free lists and
 * hands them out again.
 *
 * Guarantees:
 *  - Size classes are quarter powers of two, 64 * 2^(k/4) bytes rounded up
 *    to a multiple of 64, so a buffer wastes less than 19% above 64 KiB
 *    (and at most 64 bytes below).  pool_alloc returns a buffer of the
 *    smallest class that holds `bytes` and reports that class's size as
 *    the capacity; pool_free must be given that capacity back.
 *  - Every buffer is 64-byte aligned (one cache line, one AVX-512 vector).
 *  - At most TOPOS_POOL_BYTES (read once from the environment, default
 *    1 GiB) of memory sits idle; a buffer that would exceed it is freed.
 *    topos_pool_set_cap changes the cap (the daemon sets its
 *    --pool-bytes), and topos_pool_release hands idle buffers back,
 *    largest first, so a run that peaked high leaves nothing of its size
 *    behind.
 *  - The bytes handed out and not yet returned, and their high-water
 *    mark, are counted (at class sizes) so tests can hold the engine's
 *    memory estimates (topos_plan_run_bytes) against what runs take.
 *  - All entry points are thread-safe (one mutex; the lock is never held
 *    across a call into the system allocator).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

#define POOL_ALIGN 64
/* Classes up to 2^56 bytes: far beyond any tensor (tensor.c caps a
 * buffer at 2^40 bytes), and small enough that sizes never overflow. */
#define POOL_MAX_LOG2 56
#define POOL_CLASSES (4 * (POOL_MAX_LOG2 - 6) + 1)
#define POOL_DEFAULT_CAP ((size_t)1 << 30)

/* A free buffer stores the link to the next free buffer of its class in
 * its own first bytes, so the free lists cost no memory of their own. */
typedef struct free_block {
  struct free_block *next;
} free_block;

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t class_size[POOL_CLASSES];
static free_block *free_list[POOL_CLASSES];
static size_t pool_idle;
static size_t pool_cap = POOL_DEFAULT_CAP;
static size_t pool_used, pool_used_peak; /* handed out, at class sizes */

static void pool_init(void) {
  /* 2^(f/4) for f = 0..3; the products are rounded up to 64 bytes, so a
   * class is never smaller than its exact quarter power. */
  static const double quarter[4] = {1.0, 1.189207115002721, 1.4142135623730951,
                                    1.681792830507429};
  for (int k = 0; k < POOL_CLASSES; k++) {
    double exact = ldexp(64.0 * quarter[k % 4], k / 4);
    size_t size = (size_t)ceil(exact);
    size = (size + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    class_size[k] = size;
  }
  const char *env = getenv("TOPOS_POOL_BYTES");
  if (env != NULL && *env != '\0') {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    /* An unparsable setting keeps the default rather than disabling the
     * pool by accident. */
    if (errno == 0 && end != NULL && *end == '\0' && env[0] != '-')
      pool_cap = (size_t)v;
  }
}

/* The smallest class holding `bytes`, or -1 when none does. */
static int class_for(size_t bytes) {
  int lo = 0, hi = POOL_CLASSES - 1;
  if (bytes > class_size[hi]) return -1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (class_size[mid] >= bytes)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

void *pool_alloc(size_t bytes, size_t *capacity) {
  pthread_once(&pool_once, pool_init);
  int k = class_for(bytes);
  if (k < 0) return NULL;
  size_t size = class_size[k];
  pthread_mutex_lock(&pool_lock);
  free_block *b = free_list[k];
  if (b != NULL) {
    free_list[k] = b->next;
    pool_idle -= size;
  }
  pool_used += size;
  if (pool_used > pool_used_peak) pool_used_peak = pool_used;
  pthread_mutex_unlock(&pool_lock);
  if (b == NULL) {
    b = aligned_alloc(POOL_ALIGN, size);
    if (b == NULL) {
      pthread_mutex_lock(&pool_lock);
      pool_used -= size;
      pthread_mutex_unlock(&pool_lock);
      return NULL;
    }
  }
  if (capacity != NULL) *capacity = size;
  return b;
}

size_t pool_capacity_of(size_t bytes) {
  pthread_once(&pool_once, pool_init);
  int k = class_for(bytes);
  return k < 0 ? SIZE_MAX : class_size[k];
}

void pool_free(void *p, size_t capacity) {
  if (p == NULL) return;
  pthread_once(&pool_once, pool_init);
  int k = class_for(capacity);
  /* A capacity that is not a class size did not come from pool_alloc;
   * the buffer is still a valid malloc-family pointer, so free it. */
  if (k < 0 || class_size[k] != capacity) {
    free(p);
    return;
  }
  free_block *b = p;
  pthread_mutex_lock(&pool_lock);
  pool_used -= capacity < pool_used ? capacity : pool_used;
  bool keep = capacity <= pool_cap && pool_idle <= pool_cap - capacity;
  if (keep) {
    b->next = free_list[k];
    free_list[k] = b;
    pool_idle += capacity;
  }
  pthread_mutex_unlock(&pool_lock);
  if (!keep) free(p);
}

size_t pool_idle_bytes(void) {
  pthread_mutex_lock(&pool_lock);
  size_t idle = pool_idle;
  pthread_mutex_unlock(&pool_lock);
  return idle;
}

size_t pool_used_bytes(void) {
  pthread_mutex_lock(&pool_lock);
  size_t used = pool_used;
  pthread_mutex_unlock(&pool_lock);
  return used;
}

size_t pool_peak_bytes(void) {
  pthread_mutex_lock(&pool_lock);
  size_t peak = pool_used_peak;
  pthread_mutex_unlock(&pool_lock);
  return peak;
}

void pool_peak_reset(void) {
  pthread_mutex_lock(&pool_lock);
  pool_used_peak = pool_used;
  pthread_mutex_unlock(&pool_lock);
}

/* Unlinks idle buffers, largest class first, until at most `keep` bytes
 * are idle; the caller frees the returned chain (outside the lock).  The
 * chain is threaded through the blocks themselves. */
static free_block *take_idle_above(size_t keep) {
  free_block *chain = NULL;
  for (int k = POOL_CLASSES - 1; k >= 0 && pool_idle > keep; k--) {
    while (free_list[k] != NULL && pool_idle > keep) {
      free_block *b = free_list[k];
      free_list[k] = b->next;
      pool_idle -= class_size[k];
      b->next = chain;
      chain = b;
    }
  }
  return chain;
}

static void free_chain(free_block *b) {
  while (b != NULL) {
    free_block *next = b->next;
    free(b);
    b = next;
  }
}

void pool_trim(void) {
  topos_pool_release(0);
}

void topos_pool_release(size_t keep) {
  pthread_once(&pool_once, pool_init);
  pthread_mutex_lock(&pool_lock);
  free_block *chain = take_idle_above(keep);
  pthread_mutex_unlock(&pool_lock);
  free_chain(chain);
}

void topos_pool_set_cap(size_t idle_bytes) {
  pthread_once(&pool_once, pool_init);
  pthread_mutex_lock(&pool_lock);
  pool_cap = idle_bytes;
  free_block *chain = take_idle_above(idle_bytes);
  pthread_mutex_unlock(&pool_lock);
  free_chain(chain);
}

size_t topos_pool_cap(void) {
  pthread_once(&pool_once, pool_init);
  pthread_mutex_lock(&pool_lock);
  size_t cap = pool_cap;
  pthread_mutex_unlock(&pool_lock);
  return cap;
}

size_t topos_pool_idle_bytes(void) {
  return pool_idle_bytes();
}
