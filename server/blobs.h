/*
 * blobs.h - how uploaded blobs go into the store: durably before PutBlob
 * answers (the default), or written behind when the operator opts in.
 *
 * By default (a pending bound of 0) blob_writer_put commits the blob to
 * the store (WAL, synchronous=FULL) and only then returns, so a PutBlob
 * that answered OK survives kill -9 and power loss.  Concurrent uploads
 * commit one after another on the writer's own store handle while the
 * other workers keep receiving, validating and hashing theirs.
 *
 * Early acknowledgement (--blob-pending-bytes N > 0) trades that for
 * latency: PutBlob answers once the blob is validated, hashed and held
 * here, and a writer thread with its own store handle writes it behind.
 * Until it is written the blob is served from here, so the id is usable
 * at once.  What is pending is bounded in bytes: a PutBlob that would
 * exceed the bound waits for the writer (so a stream of uploads runs at
 * the store's speed).  SIGTERM writes everything pending; a kill -9 loses
 * what was not yet written (up to N bytes of acknowledged blobs), which is
 * NOT_FOUND afterwards like an evicted blob.
 */
#ifndef TOPOSD_BLOBS_H
#define TOPOSD_BLOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct blob_writer blob_writer;
typedef struct blob_pending blob_pending;

/* Opens a second handle on the store at `path` for the writer (blob cap
 * `blob_cap`).  max_pending 0: PutBlob is durable when it answers;
 * > 0: early acknowledgement of up to that many bytes (a writer thread).
 * NULL with err on failure. */
blob_writer *blob_writer_start(const char *path, int64_t blob_cap,
                               int64_t max_pending, topos_error *err);
/* Writes everything pending, stops the thread and closes its handle. */
void blob_writer_stop(blob_writer *w);

/* A buffer of at least len bytes for the next blob: the last written
 * blob's memory when it is large enough (its pages are already mapped,
 * which on these machines is ~100x cheaper than fresh ones), else new.
 * *cap gets its size.  Hand it to blob_writer_put, or free() it. */
uint8_t *blob_writer_buffer(blob_writer *w, size_t len, size_t *cap);

/* Hands over a blob of `tenant` (NULL or "": none; the tenant owns it once
 * stored, store_put_blob_as): `bytes` (malloc'd, cap bytes of which len
 * are the blob, whose SHA-256 is id) becomes the writer's.  cap 0: unknown (the
 * buffer is then never reused).  Durable mode: writes it now and returns
 * the store's status.  Early acknowledgement: queues it (a blob already
 * queued is not queued twice) and returns TOPOS_OK, after waiting while
 * the pending bytes are over the bound. */
int blob_writer_put(blob_writer *w, const char *tenant, const char *id,
                    uint8_t *bytes, size_t len, size_t cap, topos_error *err);
/* Whether blob id is pending and was queued by tenant (whose ownership
 * is written with the bytes). */
bool blob_writer_pending_owner(blob_writer *w, const char *id,
                               const char *tenant);

/* A pending blob's bytes (borrowed until blob_writer_release), or NULL
 * when the blob is not pending (written already, or never put). */
const uint8_t *blob_writer_lookup(blob_writer *w, const char *id, size_t *len,
                                  blob_pending **ref);
void blob_writer_release(blob_writer *w, blob_pending *ref);

/* Blobs and bytes waiting to be written. */
void blob_writer_counts(blob_writer *w, int64_t *blobs, int64_t *bytes);

/* What Stats reports as the blobs held.  False when nothing is pending:
 * then the store's own counts are exact (every acknowledged blob is
 * committed), and the caller must read them after this call.  True
 * while blobs are pending: *blobs and *bytes are the store's counts as
 * of the writer's last commit plus the pending blobs new to the store,
 * each blob counted once. */
bool blob_writer_acknowledged(blob_writer *w, int64_t *blobs, int64_t *bytes);

#endif /* TOPOSD_BLOBS_H */
