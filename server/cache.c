/*
 * cache.c - the LRU cache: a chained hash table over a doubly linked
 * recency list, one mutex.  Lookups cost a hash and a few string
 * compares; nothing slow (decoding, lowering, destroying) happens under
 * the lock, except freeing entries evicted by a put, which is moved out
 * of the lock too.
 *
 * Invariants (under the lock):
 *  - An entry is in exactly one of: the table and the recency list
 *    (cached), the retired list (out of the table but still referenced:
 *    evicted while held, or never kept), or nowhere (unreferenced and
 *    about to be destroyed, or an entry made without a key when memory
 *    ran out).
 *  - A cached child's parent is cached; evicting a parent evicts its
 *    children first, so c->bytes is the memory of everything the table
 *    keeps alive.
 */
#include "cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cache_entry {
  char *key;
  char *group; /* a child's parent key: in-use questions after eviction */
  uint64_t hash;
  void *value;
  cache_destroy_fn destroy;
  int64_t bytes;
  int refs;     /* references handed out and not yet released */
  bool cached;  /* in the table */
  bool retired; /* on the retired list */
  cache_entry *next_in_bucket;
  cache_entry *newer, *older; /* recency list, or the retired list */
  cache_entry *parent;        /* cached children only */
  cache_entry *children, *next_sibling, *prev_sibling;
};

/* A key being loaded (cache_pin). */
typedef struct pin {
  char *key;
  int count;
  struct pin *next;
} pin;

struct cache {
  pthread_mutex_t lock;
  cache_entry **buckets;
  size_t nbuckets;
  cache_entry *newest, *oldest;
  cache_entry *retired;
  pin *pins;
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
  free(e->group);
  free(e);
}

void cache_free(cache *c) {
  if (c == NULL) return;
  assert(c->retired == NULL && c->pins == NULL);
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

static void touch(cache *c, cache_entry *e) {
  if (c->newest != e) {
    list_unlink(c, e);
    list_push_newest(c, e);
  }
}

/* The retired list is singly headed and doubly linked through
 * newer/older, which an entry out of the recency list does not use. */
static void retire(cache *c, cache_entry *e) {
  e->retired = true;
  e->newer = NULL;
  e->older = c->retired;
  if (c->retired) c->retired->newer = e;
  c->retired = e;
}

static void unretire(cache *c, cache_entry *e) {
  if (e->newer)
    e->newer->older = e->older;
  else
    c->retired = e->older;
  if (e->older) e->older->newer = e->newer;
  e->newer = e->older = NULL;
  e->retired = false;
}

static cache_entry *find(cache *c, const char *key, uint64_t h) {
  for (cache_entry *e = c->buckets[h & (c->nbuckets - 1)]; e;
       e = e->next_in_bucket)
    if (e->hash == h && strcmp(e->key, key) == 0) return e;
  return NULL;
}

/* Takes e and its children out of the table and the list.  Those without
 * references go onto *dead (linked through next_in_bucket) for the
 * caller to destroy outside the lock; the others are retired. */
static void evict(cache *c, cache_entry *e, cache_entry **dead) {
  while (e->children != NULL) evict(c, e->children, dead);
  if (e->parent != NULL) {
    if (e->prev_sibling)
      e->prev_sibling->next_sibling = e->next_sibling;
    else
      e->parent->children = e->next_sibling;
    if (e->next_sibling) e->next_sibling->prev_sibling = e->prev_sibling;
    e->parent = e->next_sibling = e->prev_sibling = NULL;
  }
  cache_entry **p = &c->buckets[e->hash & (c->nbuckets - 1)];
  while (*p != e) p = &(*p)->next_in_bucket;
  *p = e->next_in_bucket;
  e->next_in_bucket = NULL;
  list_unlink(c, e);
  e->cached = false;
  c->entries--;
  c->bytes -= e->bytes;
  c->evictions++;
  if (e->refs == 0) {
    e->next_in_bucket = *dead;
    *dead = e;
  } else {
    retire(c, e);
  }
}

static void destroy_all(cache_entry *dead) {
  while (dead != NULL) {
    cache_entry *next = dead->next_in_bucket;
    entry_destroy(dead);
    dead = next;
  }
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
  touch(c, e);
  void *value = e->value;
  pthread_mutex_unlock(&c->lock);
  *ref = e;
  return value;
}

static void *put(cache *c, const char *parent_key, const void *parent_value,
                 const char *key, void *value, cache_destroy_fn destroy,
                 int64_t bytes, cache_entry **ref) {
  *ref = NULL;
  cache_entry *e = calloc(1, sizeof *e);
  char *k = strdup(key);
  char *g = parent_key != NULL ? strdup(parent_key) : NULL;
  if (e == NULL || k == NULL || (parent_key != NULL && g == NULL)) {
    /* Uncached: the caller keeps a reference that destroys on release. */
    free(k);
    free(g);
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
  e->group = g;
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
    touch(c, old);
    pthread_mutex_unlock(&c->lock);
    entry_destroy(e);
    *ref = old;
    return old->value;
  }
  cache_entry *parent = NULL;
  if (parent_key != NULL) {
    parent = find(c, parent_key, hash_key(parent_key));
    if (parent == NULL || parent->value != parent_value ||
        parent->parent != NULL) {
      retire(c, e); /* no parent to hang from: refs only */
      pthread_mutex_unlock(&c->lock);
      return value;
    }
    touch(c, parent); /* evicted last by the loop below */
  }
  if (c->max_bytes > 0 && e->bytes > c->max_bytes) {
    retire(c, e); /* too large to keep: refs only */
    pthread_mutex_unlock(&c->lock);
    return value;
  }
  while (c->oldest != NULL &&
         (c->entries + 1 > c->max_entries ||
          (c->max_bytes > 0 && c->bytes + e->bytes > c->max_bytes)))
    evict(c, c->oldest, &dead);
  if (parent != NULL && !parent->cached) {
    /* Making room took the parent (still alive until dead is destroyed
     * below, or retired): the child cannot stay either. */
    retire(c, e);
  } else {
    size_t b = e->hash & (c->nbuckets - 1);
    e->next_in_bucket = c->buckets[b];
    c->buckets[b] = e;
    list_push_newest(c, e);
    e->cached = true;
    c->entries++;
    c->bytes += e->bytes;
    if (parent != NULL) {
      e->parent = parent;
      e->next_sibling = parent->children;
      if (parent->children) parent->children->prev_sibling = e;
      parent->children = e;
    }
  }
  pthread_mutex_unlock(&c->lock);
  destroy_all(dead);
  return value;
}

void *cache_put(cache *c, const char *key, void *value,
                cache_destroy_fn destroy, int64_t bytes, cache_entry **ref) {
  return put(c, NULL, NULL, key, value, destroy, bytes, ref);
}

void *cache_put_child(cache *c, const char *parent_key,
                      const void *parent_value, const char *key, void *value,
                      cache_destroy_fn destroy, int64_t bytes,
                      cache_entry **ref) {
  return put(c, parent_key, parent_value, key, value, destroy, bytes, ref);
}

void cache_release(cache *c, cache_entry *ref) {
  if (ref == NULL) return;
  pthread_mutex_lock(&c->lock);
  assert(ref->refs > 0);
  bool destroy = --ref->refs == 0 && !ref->cached;
  if (destroy && ref->retired) unretire(c, ref);
  pthread_mutex_unlock(&c->lock);
  if (destroy) entry_destroy(ref);
}

/* ------------------------------------------------------------ in use */

static pin *find_pin(cache *c, const char *key) {
  for (pin *p = c->pins; p != NULL; p = p->next)
    if (strcmp(p->key, key) == 0) return p;
  return NULL;
}

bool cache_pin(cache *c, const char *key) {
  pin *fresh = malloc(sizeof *fresh);
  char *k = strdup(key);
  pthread_mutex_lock(&c->lock);
  pin *p = find_pin(c, key);
  if (p != NULL) {
    p->count++;
  } else if (fresh != NULL && k != NULL) {
    fresh->key = k;
    fresh->count = 1;
    fresh->next = c->pins;
    c->pins = fresh;
    fresh = NULL;
    k = NULL;
  }
  bool ok = p != NULL || fresh == NULL;
  pthread_mutex_unlock(&c->lock);
  free(fresh);
  free(k);
  return ok;
}

void cache_unpin(cache *c, const char *key) {
  pin *gone = NULL;
  pthread_mutex_lock(&c->lock);
  for (pin **p = &c->pins; *p != NULL; p = &(*p)->next) {
    if (strcmp((*p)->key, key) != 0) continue;
    if (--(*p)->count == 0) {
      gone = *p;
      *p = gone->next;
    }
    break;
  }
  pthread_mutex_unlock(&c->lock);
  if (gone != NULL) {
    free(gone->key);
    free(gone);
  }
}

static bool in_use(cache *c, const char *key, cache_entry **found) {
  cache_entry *e = find(c, key, hash_key(key));
  *found = e;
  if (e != NULL) {
    if (e->refs > 0) return true;
    for (cache_entry *k = e->children; k != NULL; k = k->next_sibling)
      if (k->refs > 0) return true;
  }
  /* Retired entries are referenced by definition. */
  for (cache_entry *r = c->retired; r != NULL; r = r->older)
    if (strcmp(r->key, key) == 0 ||
        (r->group != NULL && strcmp(r->group, key) == 0))
      return true;
  return find_pin(c, key) != NULL;
}

bool cache_in_use(cache *c, const char *key) {
  cache_entry *e;
  pthread_mutex_lock(&c->lock);
  bool used = in_use(c, key, &e);
  pthread_mutex_unlock(&c->lock);
  return used;
}

bool cache_drop(cache *c, const char *key) {
  cache_entry *e, *dead = NULL;
  pthread_mutex_lock(&c->lock);
  bool used = in_use(c, key, &e);
  if (!used && e != NULL) evict(c, e, &dead);
  pthread_mutex_unlock(&c->lock);
  destroy_all(dead);
  return !used;
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
