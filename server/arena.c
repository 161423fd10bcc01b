/*
 * arena.c - bump allocation over a list of chunks, reused across resets.
 *
 * A chunk is at least 1 MiB, or as large as the allocation that needed it,
 * so a 100 MB tensor lands in one chunk that the next upload reuses.  On
 * reset the chunks are kept in order while their total stays under the
 * retain bound; the rest are freed.
 */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_CHUNK ((size_t)1 << 20)
#define ALIGN 16

struct arena_chunk {
  arena_chunk *next;
  size_t size, used;
  _Alignas(ALIGN) unsigned char data[];
};

static void *pb_alloc(void *data, size_t size) {
  return arena_alloc(data, size);
}

static void pb_free(void *data, void *ptr) {
  (void)data;
  (void)ptr; /* released all at once by arena_reset */
}

void arena_init(arena *a, size_t retain) {
  memset(a, 0, sizeof *a);
  a->retain = retain;
  a->allocator.alloc = pb_alloc;
  a->allocator.free = pb_free;
  a->allocator.allocator_data = a;
}

void *arena_alloc(arena *a, size_t size) {
  if (size == 0) size = 1;
  if (size > SIZE_MAX - 2 * ALIGN) return NULL;
  size = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
  /* First fit among the current chunk and the kept ones after it. */
  for (arena_chunk *c = a->current ? a->current : a->chunks; c; c = c->next) {
    if (c->size - c->used >= size) {
      void *p = c->data + c->used;
      c->used += size;
      a->current = c;
      return p;
    }
    if (c->next == NULL) break;
  }
  size_t chunk = size > MIN_CHUNK ? size : MIN_CHUNK;
  arena_chunk *c = malloc(sizeof *c + chunk);
  if (c == NULL) return NULL;
  c->next = NULL;
  c->size = chunk;
  c->used = size;
  /* Append, so reuse after a reset walks chunks in the same order. */
  arena_chunk **tail = &a->chunks;
  while (*tail) tail = &(*tail)->next;
  *tail = c;
  a->current = c;
  return c->data;
}

void arena_reset(arena *a) {
  size_t kept = 0;
  arena_chunk **p = &a->chunks;
  while (*p) {
    arena_chunk *c = *p;
    if (kept + c->size <= a->retain) {
      kept += c->size;
      c->used = 0;
      p = &c->next;
    } else {
      *p = c->next;
      free(c);
    }
  }
  a->current = a->chunks;
}

void arena_destroy(arena *a) {
  arena_chunk *c = a->chunks;
  while (c) {
    arena_chunk *next = c->next;
    free(c);
    c = next;
  }
  a->chunks = a->current = NULL;
}

int reuse_buf_reserve(reuse_buf *b, size_t need) {
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  /* malloc + copy of what is held, like realloc, but never in place:
   * the size doubles, so this happens a few times per worker at most. */
  unsigned char *data = malloc(cap);
  if (data == NULL) return -1;
  if (b->len) memcpy(data, b->data, b->len);
  free(b->data);
  b->data = data;
  b->cap = cap;
  return 0;
}

void reuse_buf_reset(reuse_buf *b) {
  b->len = 0;
  if (b->cap > b->retain) {
    free(b->data);
    b->data = NULL;
    b->cap = 0;
  }
}

void reuse_buf_destroy(reuse_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}
