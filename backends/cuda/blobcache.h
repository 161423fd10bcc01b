/*
 * blobcache.h - a device-resident cache of parameter blobs keyed by
 * content hash.
 *
 * A remote training client sends its parameter blobs by SHA-256, and the
 * daemon loads their bytes on the host each step.  The cache keeps one
 * device copy per (hash, byte length), so a tensor that did not change
 * since the last step is not uploaded again.  The state stays the
 * caller's: an entry is only a copy of the content its hash names, so the
 * cache can never hand back stale bytes for a hash.
 *
 * Entries live in blocks from a devpool (devpool.h); the cache's own
 * budget caps the bytes its entries hold, counted as the pool's class
 * sizes (what they occupy on the device), not the requested lengths.  An
 * entry acquired and not yet released is referenced and never evicted;
 * when room is needed, the unreferenced entries are evicted least
 * recently used first.  Entries are found by a hash table keyed by
 * content (and a second one keyed by device pointer, for release); the
 * unreferenced ones sit on an intrusive LRU list.
 *
 * The cache also records host ranges announced as holding content of a
 * known hash (the blobs of the run about to execute), so that an operand
 * pointer can be traced back to the blob it lies in.
 *
 * Thread-safe: one mutex guards everything, and the upload callback runs
 * with it held (so concurrent acquirers of the same content wait for the
 * one upload and then hit).  Plain C, no CUDA header.
 */
#ifndef TOPOS_CUDA_BLOBCACHE_H
#define TOPOS_CUDA_BLOBCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies host[0..bytes) to dev; 0 ok. */
typedef int (*blobcache_upload_fn)(void *ctx, void *dev, const void *host,
                                   size_t bytes);

typedef struct blobcache_stats {
  unsigned long long hits, misses;
  unsigned long long evictions; /* to make room, and by blobcache_clear */
  unsigned long long upload_failures;
  unsigned long long
      bad_releases; /* releases of unknown or unreferenced pointers */
  size_t bytes;     /* held by entries, in class sizes */
  size_t entries;   /* resident */
  size_t pinned;    /* entries referenced now */
} blobcache_stats;

typedef struct blobcache blobcache;

/* A cache drawing on `pool` (which it does not own); budget caps the
 * entries' bytes, 0 for no cap beyond the pool's.  NULL when out of host
 * memory. */
blobcache *blobcache_new(devpool *pool, size_t budget,
                         blobcache_upload_fn upload, void *ctx);

/* The device copy of the content `hash` of length `bytes`, uploading
 * host[0..bytes) on a miss; the entry stays referenced (not evictable)
 * until blobcache_release, once per acquire.  NULL when it cannot (no
 * room after evicting unreferenced least-recently-used entries,
 * allocation or upload failure).  *hit (may be NULL) says whether it was
 * resident.  A length of 0 is a valid (one-block) entry and uploads
 * nothing. */
void *blobcache_acquire(blobcache *c, const uint8_t hash[32], const void *host,
                        size_t bytes, bool *hit);
/* Drops one reference, by the pointer acquire returned; an unknown or
 * unreferenced pointer is ignored and counted (bad_releases), NULL is
 * ignored (like free(NULL)). */
void blobcache_release(blobcache *c, const void *dev);
/* Evicts every unreferenced entry. */
void blobcache_clear(blobcache *c);
void blobcache_get_stats(blobcache *c, blobcache_stats *s);
/* Gives every entry's block back to the pool, referenced or not, and
 * frees the cache.  NULL is a no-op. */
void blobcache_free(blobcache *c);

/* Host ranges announced as holding content with a known hash, for the
 * run that uses them.  Announcing [host, host+bytes) (bytes >= 1)
 * replaces every announced range it overlaps; 0 ok, -1 on bad arguments
 * or out of host memory. */
int blobcache_announce(blobcache *c, const void *host, size_t bytes,
                       const uint8_t hash[32]);
/* Forgets the range starting at host (no-op when there is none). */
void blobcache_retract(blobcache *c, const void *host);
/* Whether [p, p+bytes) lies inside one announced range (for bytes 0:
 * whether p does): then its hash, base and length (each may be NULL). */
bool blobcache_find_range(blobcache *c, const void *p, size_t bytes,
                          uint8_t hash[32], const void **base, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CUDA_BLOBCACHE_H */
