/*
 * arena.h - a per-worker bump allocator whose memory outlives requests.
 *
 * Why: on these machines the first touch of fresh memory costs ~11 µs per
 * 4 KiB page (docs/architecture.md, "Platform facts") while writing reused
 * memory is ~100x faster, so a 100 MB upload that lands in new pages every time
 * is slow before any work is done.  A worker unpacks each request into its
 * arena (protobuf-c takes a ProtobufCAllocator) and resets it afterwards; the
 * pages stay mapped and the next request reuses them.  Memory beyond
 * `retain` bytes is returned to the system on reset, so one huge request
 * does not pin its size forever.
 */
#ifndef TOPOSD_ARENA_H
#define TOPOSD_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct arena_chunk arena_chunk;

typedef struct arena {
  arena_chunk *chunks; /* in allocation order; the first ones are reused */
  arena_chunk *current;
  size_t retain;                /* bytes kept across resets */
  ProtobufCAllocator allocator; /* alloc/free for protobuf-c, data = this */
} arena;

void arena_init(arena *a, size_t retain);
/* 16-byte aligned memory valid until the next reset; NULL when out of
 * memory. */
void *arena_alloc(arena *a, size_t size);
/* Forgets every allocation; keeps up to `retain` bytes of chunks. */
void arena_reset(arena *a);
void arena_destroy(arena *a);

/* A growable byte buffer that keeps its memory across uses (up to
 * `retain` bytes), for request and reply bytes. */
typedef struct reuse_buf {
  unsigned char *data;
  size_t len, cap, retain;
} reuse_buf;

/* Makes room for `need` bytes in total; returns 0 or -1 (out of memory). */
int reuse_buf_reserve(reuse_buf *b, size_t need);
/* Empties it, returning the memory when it grew past `retain`. */
void reuse_buf_reset(reuse_buf *b);
void reuse_buf_destroy(reuse_buf *b);

#endif /* TOPOSD_ARENA_H */
