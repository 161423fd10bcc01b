/*
 * cache.c - the LRU cache: a chained hash table over a doubly linked
 * recency list, one mutex.  Lookups cost a hash and a few string
 * compares; nothing slow (decoding, lowering, destroying) happens under
 * the lock, except freeing entries evicted by a put, which is moved out
 * of the lock too.
 */
#include "cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cache_entry {
  char *key;
  uint64_t hash;
  void *value;
  cache_destroy_fn destroy;
  int64_t bytes;
  int refs;    /* references handed out and not yet released */
  bool cached; /* still in the table (false once evicted) */
  cache_entry *next_in_bucket;
  cache_entry *newer, *older; /* recency list */
};

struct cache {
  pthread_mutex_t lock;
  cache_entry **buckets;
  size_t nbuckets;
  cache_entry *newest, *oldest;
  int max_entries;
  int64_t max_bytes;
  int64_t entries, bytes, hits, misses, evictions;
};

static uint64_t hash_key(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

cache *cache_new(int max_entries, int64_t max_bytes) {
  if (max_entries < 1) max_entries = 1;
  cache *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->nbuckets = 16;
  while (c->nbuckets < (size_t)max_entries * 2) c->nbuckets *= 2;
  c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
  if (c->buckets == NULL) {
    free(c);
    return NULL;
  }
  c->max_entries = max_entries;
  c->max_bytes = max_bytes;
  pthread_mutex_init(&c->lock, NULL);
  return c;
}

static void entry_destroy(cache_entry *e) {
  if (e->destroy != NULL && e->value != NULL) e->destroy(e->value);
  free(e->key);
  free(e);
}

void cache_free(cache *c) {
  if (c == NULL) return;
  cache_entry *e = c->newest;
  while (e != NULL) {
    cache_entry *next = e->older;
    assert(e->refs == 0);
    entry_destroy(e);
    e = next;
  }
  free(c->buckets);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static void list_unlink(cache *c, cache_entry *e) {
  if (e->newer)
    e->newer->older = e->older;
  else
    c->newest = e->older;
  if (e->older)
    e->older->newer = e->newer;
  else
    c->oldest = e->newer;
  e->newer = e->older = NULL;
}

static void list_push_newest(cache *c, cache_entry *e) {
  e->newer = NULL;
  e->older = c->newest;
  if (c->newest) c->newest->newer = e;
  c->newest = e;
  if (c->oldest == NULL) c->oldest = e;
}

static cache_entry *find(cache *c, const char *key, uint64_t h) {
  for (cache_entry *e = c->buckets[h & (c->nbuckets - 1)]; e;
       e = e->next_in_bucket)
    if (e->hash == h && strcmp(e->key, key) == 0) return e;
  return NULL;
}

/* Takes e out of the table and the list; the caller destroys it when it
 * has no references (returns true then). */
static bool evict(cache *c, cache_entry *e) {
  cache_entry **p = &c->buckets[e->hash & (c->nbuckets - 1)];
  while (*p != e) p = &(*p)->next_in_bucket;
  *p = e->next_in_bucket;
  list_unlink(c, e);
  e->cached = false;
  c->entries--;
  c->bytes -= e->bytes;
  c->evictions++;
  return e->refs == 0;
}

void *cache_get(cache *c, const char *key, cache_entry **ref) {
  *ref = NULL;
  uint64_t h = hash_key(key);
  pthread_mutex_lock(&c->lock);
  cache_entry *e = find(c, key, h);
  if (e == NULL) {
    c->misses++;
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  c->hits++;
  e->refs++;
  if (c->newest != e) {
    list_unlink(c, e);
    list_push_newest(c, e);
  }
  void *value = e->value;
  pthread_mutex_unlock(&c->lock);
  *ref = e;
  return value;
}

void *cache_put(cache *c, const char *key, void *value,
                cache_destroy_fn destroy, int64_t bytes, cache_entry **ref) {
  *ref = NULL;
  cache_entry *e = calloc(1, sizeof *e);
  char *k = strdup(key);
  if (e == NULL || k == NULL) {
    /* Uncached: the caller keeps a reference that destroys on release. */
    free(k);
    if (e != NULL) {
      e->value = value;
      e->destroy = destroy;
      e->refs = 1;
      *ref = e;
    }
    /* Without even an entry the value cannot be tracked; hand it back and
     * let it leak rather than free it under the caller.  calloc of a few
     * dozen bytes failing means the process is going down anyway. */
    return value;
  }
  e->key = k;
  e->hash = hash_key(key);
  e->value = value;
  e->destroy = destroy;
  e->bytes = bytes < 0 ? 0 : bytes;
  e->refs = 1;
  *ref = e;

  cache_entry *dead = NULL; /* evicted, unreferenced: destroyed unlocked */
  pthread_mutex_lock(&c->lock);
  cache_entry *old = find(c, key, e->hash);
  if (old != NULL) {
    /* Lost a race: use the value already cached. */
    old->refs++;
    if (c->newest != old) {
      list_unlink(c, old);
      list_push_newest(c, old);
    }
    pthread_mutex_unlock(&c->lock);
    entry_destroy(e);
    *ref = old;
    return old->value;
  }
  if (c->max_bytes > 0 && e->bytes > c->max_bytes) {
    pthread_mutex_unlock(&c->lock); /* too large to keep: refs only */
    return value;
  }
  while (c->oldest != NULL &&
         (c->entries + 1 > c->max_entries ||
          (c->max_bytes > 0 && c->bytes + e->bytes > c->max_bytes))) {
    cache_entry *victim = c->oldest;
    if (evict(c, victim)) {
      victim->next_in_bucket = dead;
      dead = victim;
    }
  }
  size_t b = e->hash & (c->nbuckets - 1);
  e->next_in_bucket = c->buckets[b];
  c->buckets[b] = e;
  list_push_newest(c, e);
  e->cached = true;
  c->entries++;
  c->bytes += e->bytes;
  pthread_mutex_unlock(&c->lock);
  while (dead != NULL) {
    cache_entry *next = dead->next_in_bucket;
    entry_destroy(dead);
    dead = next;
  }
  return value;
}

void cache_release(cache *c, cache_entry *ref) {
  if (ref == NULL) return;
  pthread_mutex_lock(&c->lock);
  assert(ref->refs > 0);
  bool destroy = --ref->refs == 0 && !ref->cached;
  pthread_mutex_unlock(&c->lock);
  if (destroy) entry_destroy(ref);
}

void cache_stats(cache *c, cache_counters *out) {
  pthread_mutex_lock(&c->lock);
  out->entries = c->entries;
  out->bytes = c->bytes;
  out->hits = c->hits;
  out->misses = c->misses;
  out->evictions = c->evictions;
  pthread_mutex_unlock(&c->lock);
}
