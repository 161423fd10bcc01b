/*
 * blobs.h - the write-behind of uploaded blobs into the store.
 *
 * Why: a blob is a cache entry (content-addressed, immutable, evictable),
 * and writing 100 MB durably through SQLite (WAL, fsync, checkpoint)
 * takes several times as long as receiving it.  PutBlob therefore answers
 * once the blob is validated, hashed and held here, and a writer thread
 * with its own store handle writes it behind.  Until it is written the
 * blob is served from here, so the id is usable at once.  What is pending
 * is bounded in bytes: a PutBlob that would exceed the bound waits for the
 * writer (so a stream of uploads runs at the store's speed), and a bound
 * of 0 makes every PutBlob write synchronously.  A blob lost to a crash
 * before its write is NOT_FOUND afterwards, exactly like an evicted one;
 * the client uploads it again.
 */
#ifndef TOPOSD_BLOBS_H
#define TOPOSD_BLOBS_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct blob_writer blob_writer;
typedef struct blob_pending blob_pending;

/* Opens a second handle on the store at `path` for the writer thread
 * (blob cap `blob_cap`).  max_pending 0: synchronous writes.  NULL with
 * err on failure. */
blob_writer *blob_writer_start(const char *path, int64_t blob_cap,
                               int64_t max_pending, topos_error *err);
/* Writes everything pending, stops the thread and closes its handle. */
void blob_writer_stop(blob_writer *w);

/* A buffer of at least len bytes for the next blob: the last written
 * blob's memory when it is large enough (its pages are already mapped,
 * which on these machines is ~100x cheaper than fresh ones), else new.
 * *cap gets its size.  Hand it to blob_writer_put, or free() it. */
uint8_t *blob_writer_buffer(blob_writer *w, size_t len, size_t *cap);

/* Hands over a blob: `bytes` (malloc'd, cap bytes of which len are the
 * blob, whose SHA-256 is id) becomes the writer's.  cap 0: unknown (the
 * buffer is then never reused).  Waits while the pending bytes are over the
 * bound. With a bound of 0, writes now and returns the store's status. */
int blob_writer_put(blob_writer *w, const char *id, uint8_t *bytes, size_t len,
                    size_t cap, topos_error *err);

/* A pending blob's bytes (borrowed until blob_writer_release), or NULL
 * when the blob is not pending (written already, or never put). */
const uint8_t *blob_writer_lookup(blob_writer *w, const char *id, size_t *len,
                                  blob_pending **ref);
void blob_writer_release(blob_writer *w, blob_pending *ref);

/* Blobs and bytes waiting to be written. */
void blob_writer_counts(blob_writer *w, int64_t *blobs, int64_t *bytes);

#endif /* TOPOSD_BLOBS_H */
