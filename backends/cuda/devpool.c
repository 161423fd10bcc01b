/*
 * devpool.c - the device buffer pool (devpool.h): size classes, a LIFO
 * free list per class, a budget, and a pointer-keyed hash table that
 * tells put which block it is given.
 *
 * Every block the pool holds, in use or cached, has a record in the
 * table; the cached ones are also on their class's free list (singly
 * linked, pushed and popped at the head only).  The table is open
 * addressing with linear probing and backward-shift deletion (no
 * tombstones), grown to twice its size whenever an insertion would make
 * it more than half full.
 */
#include "devpool.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* The smallest class, and the classes per power of two (as a shift). */
#define MIN_CLASS_LOG2 8
#define STEPS_LOG2 2
/* Class indices: four per power of two from 2^8 up to 2^63 (on LP64). */
#define NCLASS ((int)(sizeof(size_t) * CHAR_BIT - MIN_CLASS_LOG2) << STEPS_LOG2)
#define TABLE_MIN_LOG2 6

typedef struct block {
  void *ptr;
  size_t size; /* the class size */
  int cls;
  bool in_use;
  struct block *next; /* the free list, while cached */
} block;

struct devpool {
  pthread_mutex_t mu;
  devpool_allocator a;
  size_t budget;
  block **slot; /* the table: 1 << cap_log2 slots, NULL when empty */
  int cap_log2;
  size_t count;
  block *free_head[NCLASS];
  devpool_stats st;
};

static int floor_log2(size_t x) {
  return (int)(sizeof(unsigned long long) * CHAR_BIT) - 1 -
         __builtin_clzll((unsigned long long)x);
}

size_t devpool_class_size(size_t bytes) {
  if (bytes == 0 || bytes > SIZE_MAX / 2) return 0;
  if (bytes <= (size_t)1 << MIN_CLASS_LOG2) return (size_t)1 << MIN_CLASS_LOG2;
  size_t step = (size_t)1 << (floor_log2(bytes) - STEPS_LOG2);
  return (bytes + step - 1) & ~(step - 1);
}

/* The index of a class size c (devpool_class_size's result). */
static int class_index(size_t c) {
  int k = floor_log2(c);
  int j = (int)((c >> (k - STEPS_LOG2)) & ((1u << STEPS_LOG2) - 1));
  return ((k - MIN_CLASS_LOG2) << STEPS_LOG2) + j;
}

/* ---- the pointer table ---- */

static size_t table_mask(const devpool *p) {
  return ((size_t)1 << p->cap_log2) - 1;
}

static size_t home_slot(const devpool *p, const void *ptr) {
  uint64_t h = (uint64_t)(uintptr_t)ptr * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> (64 - p->cap_log2));
}

/* The slot holding ptr's block, or SIZE_MAX. */
static size_t table_find(const devpool *p, const void *ptr) {
  size_t mask = table_mask(p);
  for (size_t i = home_slot(p, ptr);; i = (i + 1) & mask) {
    if (!p->slot[i]) return SIZE_MAX;
    if (p->slot[i]->ptr == ptr) return i;
  }
}

/* Places b in the table, which has a free slot. */
static void table_place(devpool *p, block *b) {
  size_t mask = table_mask(p);
  size_t i = home_slot(p, b->ptr);
  while (p->slot[i]) i = (i + 1) & mask;
  p->slot[i] = b;
}

/* Makes room for one more record; false when out of host memory. */
static bool table_reserve(devpool *p) {
  if ((p->count + 1) * 2 <= (size_t)1 << p->cap_log2) return true;
  block **old = p->slot;
  size_t old_cap = (size_t)1 << p->cap_log2;
  block **slot = calloc(old_cap * 2, sizeof *slot);
  if (!slot) return false;
  p->slot = slot;
  p->cap_log2++;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i]) table_place(p, old[i]);
  free(old);
  return true;
}

/* Empties slot i, shifting back the records after it that probed past. */
static void table_remove_at(devpool *p, size_t i) {
  size_t mask = table_mask(p);
  for (size_t j = (i + 1) & mask; p->slot[j]; j = (j + 1) & mask) {
    size_t h = home_slot(p, p->slot[j]->ptr);
    if (((j - h) & mask) >= ((j - i) & mask)) {
      p->slot[i] = p->slot[j];
      i = j;
    }
  }
  p->slot[i] = NULL;
  p->count--;
}

/* ---- blocks ---- */

static size_t held(const devpool *p) {
  return p->st.bytes_in_use + p->st.bytes_cached;
}

/* Gives a block back to the allocator and forgets it. */
static void release_block(devpool *p, block *b) {
  size_t i = table_find(p, b->ptr);
  if (i != SIZE_MAX) table_remove_at(p, i);
  if (b->in_use) {
    p->st.bytes_in_use -= b->size;
    p->st.blocks_in_use--;
  } else {
    p->st.bytes_cached -= b->size;
    p->st.blocks_cached--;
  }
  p->a.release(p->a.ctx, b->ptr);
  free(b);
}

/* Releases cached blocks, largest class first, until `need` more bytes
 * fit the budget (limit = 0: all of them).  Whether it released any. */
static bool release_cached(devpool *p, size_t need, size_t limit) {
  bool any = false;
  for (int c = NCLASS - 1; c >= 0; c--) {
    while (p->free_head[c]) {
      if (limit && held(p) + need <= limit) return any;
      block *b = p->free_head[c];
      p->free_head[c] = b->next;
      release_block(p, b);
      any = true;
    }
  }
  return any;
}

/* One call to the allocator; NULL (counted) when it fails. */
static void *try_alloc(devpool *p, size_t size) {
  void *ptr = NULL;
  if (p->a.alloc(p->a.ctx, size, &ptr) != 0 || !ptr) {
    p->st.alloc_failures++;
    return NULL;
  }
  p->st.allocs++;
  return ptr;
}

/* A new block of class size c, trimming the cache to make room; NULL
 * when it cannot. */
static block *new_block(devpool *p, size_t c) {
  if (p->budget && c > p->budget) return NULL;
  bool trimmed = false;
  if (p->budget && held(p) + c > p->budget) {
    trimmed = release_cached(p, c, p->budget);
    if (held(p) + c > p->budget) {
      if (trimmed) p->st.trims++;
      return NULL;
    }
  }
  block *b = NULL;
  if (!table_reserve(p) || !(b = malloc(sizeof *b))) goto fail;
  b->ptr = try_alloc(p, c);
  if (!b->ptr && p->st.blocks_cached > 0) {
    trimmed = release_cached(p, c, 0) || trimmed;
    b->ptr = try_alloc(p, c);
  }
  if (!b->ptr) goto fail;
  if (trimmed) p->st.trims++;
  b->size = c;
  b->cls = class_index(c);
  b->in_use = false;
  b->next = NULL;
  table_place(p, b);
  p->count++;
  return b;
fail:
  if (trimmed) p->st.trims++;
  free(b);
  return NULL;
}

/* ---- the interface ---- */

devpool *devpool_new(devpool_allocator a, size_t budget) {
  devpool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->cap_log2 = TABLE_MIN_LOG2;
  p->slot = calloc((size_t)1 << p->cap_log2, sizeof *p->slot);
  if (!p->slot || pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p->slot);
    free(p);
    return NULL;
  }
  p->a = a;
  p->budget = budget;
  return p;
}

void *devpool_get(devpool *p, size_t bytes, size_t *granted) {
  if (granted) *granted = 0;
  size_t c = devpool_class_size(bytes);
  if (c == 0) return NULL;
  int cls = class_index(c);
  pthread_mutex_lock(&p->mu);
  block *b = p->free_head[cls];
  if (b) {
    p->free_head[cls] = b->next;
    p->st.hits++;
    p->st.bytes_cached -= c;
    p->st.blocks_cached--;
  } else {
    b = new_block(p, c);
  }
  if (b) {
    b->in_use = true;
    b->next = NULL;
    p->st.bytes_in_use += c;
    p->st.blocks_in_use++;
    if (held(p) > p->st.peak_bytes) p->st.peak_bytes = held(p);
  }
  pthread_mutex_unlock(&p->mu);
  if (!b) return NULL;
  if (granted) *granted = c;
  return b->ptr;
}

void devpool_put(devpool *p, void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&p->mu);
  size_t i = table_find(p, ptr);
  block *b = i == SIZE_MAX ? NULL : p->slot[i];
  if (!b || !b->in_use) {
    p->st.bad_puts++;
  } else {
    b->in_use = false;
    b->next = p->free_head[b->cls];
    p->free_head[b->cls] = b;
    p->st.bytes_in_use -= b->size;
    p->st.blocks_in_use--;
    p->st.bytes_cached += b->size;
    p->st.blocks_cached++;
  }
  pthread_mutex_unlock(&p->mu);
}

void devpool_trim(devpool *p) {
  pthread_mutex_lock(&p->mu);
  release_cached(p, 0, 0);
  pthread_mutex_unlock(&p->mu);
}

void devpool_get_stats(devpool *p, devpool_stats *s) {
  pthread_mutex_lock(&p->mu);
  *s = p->st;
  pthread_mutex_unlock(&p->mu);
}

void devpool_free(devpool *p) {
  if (!p) return;
  size_t cap = (size_t)1 << p->cap_log2;
  for (size_t i = 0; i < cap; i++) {
    if (!p->slot[i]) continue;
    p->a.release(p->a.ctx, p->slot[i]->ptr);
    free(p->slot[i]);
  }
  free(p->slot);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
