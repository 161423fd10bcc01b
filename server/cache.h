/*
 * cache.h - a bounded, thread-safe LRU cache of immutable values shared
 * by the workers: decoded networks (key "net <id>"), compiled plans
 * ("plan <id> <entry>") and decoded blobs ("blob <id>").
 *
 * Values are reference counted: cache_get and cache_put hand out a
 * reference that the caller must return with cache_release, and an
 * evicted value is destroyed only when its last reference is returned, so
 * a worker never sees a value freed under it.  The bounds are a number of
 * entries and a number of bytes (each entry declares its size).
 */
#ifndef TOPOSD_CACHE_H
#define TOPOSD_CACHE_H

#include <stdint.h>

typedef struct cache cache;
typedef struct cache_entry cache_entry;

/* Destroys a value nobody references any more. */
typedef void (*cache_destroy_fn)(void *value);

/* New cache (cache_free).  max_entries >= 1; max_bytes <= 0 = unbounded. */
cache *cache_new(int max_entries, int64_t max_bytes);
/* Frees the cache; every reference must have been released. */
void cache_free(cache *c);

/* The value under key, or NULL (a miss).  On a hit *ref is the reference
 * to release and the entry becomes the most recently used. */
void *cache_get(cache *c, const char *key, cache_entry **ref);
/* Inserts value under key and returns the value to use with its
 * reference in *ref.  When another thread inserted the key first, value
 * is destroyed and the cached one is returned instead.  A value larger
 * than the byte bound is not kept: the caller still gets a reference and
 * the value dies with it.  Never fails: on allocation failure the value
 * is handed back uncached. */
void *cache_put(cache *c, const char *key, void *value,
                cache_destroy_fn destroy, int64_t bytes, cache_entry **ref);
/* Returns a reference; NULL is a no-op. */
void cache_release(cache *c, cache_entry *ref);

typedef struct cache_counters {
  int64_t entries, bytes, hits, misses, evictions;
} cache_counters;

void cache_stats(cache *c, cache_counters *out);

#endif /* TOPOSD_CACHE_H */
