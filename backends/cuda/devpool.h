/*
 * devpool.h - a pool of device buffers, so that the cuda backend's hot
 * path does not call cudaMalloc / cudaFree.
 *
 * Plain C with no CUDA header: the device memory comes from an allocator
 * vtable (the cuda backend wraps cudaMalloc / cudaFree in one; the tests
 * wrap malloc / free), so the bookkeeping is built and tested on any
 * host.
 *
 * Policy:
 *
 *  - Sizes round up to classes: 256 bytes at least, then four classes per
 *    power of two (2^k, 1.25·2^k, 1.5·2^k, 1.75·2^k), so a block is never
 *    more than 25% larger than the request (devpool_class_size).
 *  - devpool_get reuses a cached free block of exactly the request's
 *    class, the one put most recently first (LIFO: the hot one);
 *    otherwise it allocates a new block of the class size.
 *  - The budget caps the bytes held, in use plus cached.  When a new
 *    block would exceed it, cached blocks are released, largest class
 *    first, until it fits; when the allocator fails, every cached block
 *    is released and the allocation is tried once more.  What still does
 *    not fit or allocate is NULL.
 *  - devpool_put of a pointer the pool did not hand out, or of one
 *    already put, changes nothing but the bad_puts count; devpool_put of
 *    NULL does nothing at all (like free(NULL)).
 *  - Requests of 0 bytes or over SIZE_MAX / 2 are NULL without a call to
 *    the allocator, so no byte count can overflow.
 *
 * Blocks are found for put by a hash table keyed by pointer (open
 * addressing, linear probing, grown at half full): get and put are O(1)
 * expected, apart from the allocator's own cost.  One mutex guards the
 * pool; the allocator is called with it held.
 */
#ifndef TOPOS_CUDA_DEVPOOL_H
#define TOPOS_CUDA_DEVPOOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct devpool_allocator {
  void *ctx;
  int (*alloc)(void *ctx, size_t bytes, void **out); /* 0 ok, else failure */
  void (*release)(void *ctx, void *ptr);
} devpool_allocator;

typedef struct devpool_stats {
  unsigned long long allocs; /* calls to alloc that succeeded */
  unsigned long long alloc_failures;
  unsigned long long hits;     /* gets served from a cached free block */
  unsigned long long trims;    /* times cached blocks were released to make
                                  room (once per get that released some) */
  unsigned long long bad_puts; /* puts of unknown or already-free pointers */
  size_t bytes_in_use, bytes_cached;
  size_t peak_bytes; /* the most bytes ever held, in use plus cached */
  size_t blocks_in_use, blocks_cached;
} devpool_stats;

typedef struct devpool devpool;

/* A pool drawing on `a`; budget is the most bytes held (in use plus
 * cached), 0 for no limit.  NULL when out of host memory. */
devpool *devpool_new(devpool_allocator a, size_t budget);
/* A block of at least `bytes` (>= 1); *granted (may be NULL) is its size,
 * the class size.  NULL (and *granted 0) when it cannot. */
void *devpool_get(devpool *p, size_t bytes, size_t *granted);
/* Gives a block back to the pool's cache. */
void devpool_put(devpool *p, void *ptr);
/* Releases every cached free block to the allocator. */
void devpool_trim(devpool *p);
void devpool_get_stats(devpool *p, devpool_stats *s);
/* Releases every block, in use or not, and the pool.  NULL is a no-op. */
void devpool_free(devpool *p);

/* The class size a request of `bytes` is served with; 0 for a request of
 * 0 bytes or over SIZE_MAX / 2. */
size_t devpool_class_size(size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CUDA_DEVPOOL_H */
