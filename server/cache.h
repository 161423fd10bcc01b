/*
 * cache.h - a bounded, thread-safe LRU cache of immutable values shared
 * by the workers: decoded networks (key "net <id>"), compiled plans
 * ("plan <id> <entry>") and decoded blobs ("blob <id>").
 *
 * Values are reference counted: cache_get and cache_put hand out a
 * reference that the caller must return with cache_release, and an
 * evicted value is destroyed only when its last reference is returned, so
 * a worker never sees a value freed under it.  The bounds are a number of
 * entries and a number of bytes; each entry declares the memory its value
 * keeps (topos_network_memory_bytes and friends), not its encoded size.
 *
 * A value that keeps another cached value alive (a plan retains its
 * network) is put as a child of that value's entry: it is cached only
 * while its parent is, and evicting the parent evicts it too, so every
 * byte the cache keeps alive is counted once, in exactly one entry.
 *
 * The cache also answers whether a key is in use (referenced, or a child
 * of it referenced, or pinned while it is being loaded), which is what
 * the store's spec retention asks before it drops a spec.
 */
#ifndef TOPOSD_CACHE_H
#define TOPOSD_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cache cache;
typedef struct cache_entry cache_entry;

/* Destroys a value nobody references any more. */
typedef void (*cache_destroy_fn)(void *value);

/* New cache (cache_free).  max_entries >= 1; max_bytes <= 0 = unbounded. */
cache *cache_new(int max_entries, int64_t max_bytes);
/* Frees the cache; every reference must have been released and every pin
 * removed. */
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
/* cache_put of a value that keeps parent_value alive, as a child of the
 * entry under parent_key.  It is kept only while that entry is cached and
 * holds parent_value (else it is handed back uncached, as a value over
 * the bound is); `bytes` is the child's own memory.  Only one level: a
 * child's children are handed back uncached. */
void *cache_put_child(cache *c, const char *parent_key,
                      const void *parent_value, const char *key, void *value,
                      cache_destroy_fn destroy, int64_t bytes,
                      cache_entry **ref);
/* Returns a reference; NULL is a no-op. */
void cache_release(cache *c, cache_entry *ref);

/* Marks key as in use while its value is being loaded (before it can be
 * put); every successful pin needs one cache_unpin.  False when out of
 * memory. */
bool cache_pin(cache *c, const char *key);
void cache_unpin(cache *c, const char *key);
/* Whether key is in use: its value (cached or evicted) or a child of it
 * is referenced, or the key is pinned. */
bool cache_in_use(cache *c, const char *key);
/* Evicts key and its children unless it is in use, atomically with the
 * check.  True when nothing under key is in use any more (evicted, or
 * not cached at all); false, evicting nothing, when it is in use. */
bool cache_drop(cache *c, const char *key);

typedef struct cache_counters {
  int64_t entries, bytes, hits, misses, evictions;
} cache_counters;

void cache_stats(cache *c, cache_counters *out);

#endif /* TOPOSD_CACHE_H */
