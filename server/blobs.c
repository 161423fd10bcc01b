/*
 * blobs.c - durable blob writes, or a FIFO of blobs waiting to be written
 * by one writer thread (early acknowledgement, blobs.h).
 *
 * A pending entry is reference counted: the queue holds one reference and
 * every reader that looked it up holds one, so the writer can drop a
 * written blob while a worker is still decoding its bytes.  Lookups scan
 * the queue (a handful of large blobs at most: the bound is in bytes).
 *
 * Stats under early acknowledgement: the store's counts lag what was
 * acknowledged, so the writer keeps the store's blob count and bytes as
 * of its last commit (only it writes blobs, so they change only when it
 * commits) and the queue keeps what is new to the store.  Both change
 * together, under the lock, when a written entry leaves the queue, so a
 * blob is counted exactly once whether it is in flight, committed or
 * queued.  A blob queued while already stored, or already queued, is not
 * counted again.
 */
#include "blobs.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

/* In durable mode the buffer of the last written blob is kept for the
 * next upload up to this size (early acknowledgement keeps up to the
 * pending bound): enough for a 100 MB parameter set. */
#define DURABLE_SPARE_BYTES ((int64_t)128 << 20)

struct blob_pending {
  char id[65];
  char owner[STORE_TENANT_NAME_MAX + 1]; /* the queuing tenant; "" none */
  uint8_t *bytes;
  size_t len, cap; /* cap: the buffer's size (from blob_writer_buffer) */
  int refs;        /* under the writer's lock */
  bool counted;    /* new to the store when queued: Stats counts it */
  blob_pending *next;
};

struct blob_writer {
  topos_store *store;  /* the writer's own handle */
  topos_store *reader; /* early ack: is a queued blob stored already? */
  int64_t blob_cap;
  pthread_mutex_t lock;
  pthread_cond_t wake;    /* the writer: work arrived or stop */
  pthread_cond_t drained; /* putters: room freed */
  blob_pending *head, *tail;
  int64_t pending_blobs, pending_bytes, max_pending;
  /* Early ack, for Stats: the queued blobs new to the store, and the
   * store's blobs as of the writer's last commit. */
  int64_t new_blobs, new_bytes;
  int64_t stored_blobs, stored_bytes;
  bool stopping, started;
  pthread_t thread;
  /* The largest buffer of a written blob, kept for the next upload. */
  uint8_t *spare;
  size_t spare_cap;
  int64_t spare_max;
};

static void pending_unref_locked(blob_pending *p, blob_pending **dead) {
  if (--p->refs == 0) {
    p->next = *dead;
    *dead = p;
  }
}

/* Keeps a written blob's buffer as the spare when it is the largest one
 * within spare_max, else frees it. */
static void recycle(blob_writer *w, uint8_t *bytes, size_t cap) {
  if (cap > 0 && (int64_t)cap <= w->spare_max) {
    pthread_mutex_lock(&w->lock);
    if (cap > w->spare_cap) {
      uint8_t *old = w->spare;
      w->spare = bytes;
      w->spare_cap = cap;
      bytes = old;
    }
    pthread_mutex_unlock(&w->lock);
  }
  free(bytes);
}

static void free_dead(blob_writer *w, blob_pending *dead) {
  while (dead) {
    blob_pending *next = dead->next;
    recycle(w, dead->bytes, dead->cap);
    free(dead);
    dead = next;
  }
}

uint8_t *blob_writer_buffer(blob_writer *w, size_t len, size_t *cap) {
  uint8_t *p = NULL;
  *cap = 0;
  pthread_mutex_lock(&w->lock);
  if (w->spare != NULL && w->spare_cap >= len) {
    p = w->spare;
    *cap = w->spare_cap;
    w->spare = NULL;
    w->spare_cap = 0;
  }
  pthread_mutex_unlock(&w->lock);
  if (p == NULL) {
    *cap = len ? len : 1;
    p = malloc(*cap);
    if (p == NULL) *cap = 0;
  }
  return p;
}

/* The store's blob count and bytes on the writer's handle (only the
 * writer thread calls it while it runs).  False when the store failed. */
static bool stored_counts(blob_writer *w, int64_t *blobs, int64_t *bytes) {
  store_stats_info si;
  topos_error err = {0};
  if (store_stats(w->store, &si, &err) != TOPOS_OK) {
    log_event_at(LOG_WARN, "warning",
                 "blob writer cannot count the stored blobs: %s", err.message);
    return false;
  }
  *blobs = si.blob_count;
  *bytes = si.blob_bytes;
  return true;
}

static void *writer_main(void *arg) {
  blob_writer *w = arg;
  /* Persistence is background work: requests go first (Linux nice values
   * are per thread). */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
    log_event_at(LOG_WARN, "warning", "blob writer keeps its priority");
  /* Whether stored_* must be counted afresh before the next write: at
   * first, and after every pause, so that whatever else changed the
   * store meanwhile (another process on the file) is in them. */
  bool stale = true;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (w->head == NULL && !w->stopping) {
      pthread_cond_wait(&w->wake, &w->lock);
      stale = true;
    }
    blob_pending *p = w->head;
    if (p == NULL) break; /* stopping and drained */
    p->refs++;            /* ours while writing, unlocked */
    pthread_mutex_unlock(&w->lock);
    int64_t blobs = 0, bytes = 0;
    /* Nothing queued is committed yet, so the counts are those to add
     * the queue's to. */
    if (stale && stored_counts(w, &blobs, &bytes)) {
      pthread_mutex_lock(&w->lock);
      w->stored_blobs = blobs;
      w->stored_bytes = bytes;
      pthread_mutex_unlock(&w->lock);
      stale = false;
    }
    topos_error err = {0};
    char id[65];
    int rc = store_put_blob_as(w->store, p->owner, p->bytes, p->len, id, &err);
    if (rc != TOPOS_OK)
      log_event_at(LOG_ERROR, "error", "blob %s (%zu bytes) was not stored: %s",
                   p->id, p->len, err.message);
    else if (strcmp(id, p->id) != 0)
      log_event_at(LOG_ERROR, "error", "blob %s was stored as %s", p->id, id);
    /* A new blob under the cap adds itself; anything else (a failure, an
     * eviction, a stored blob put again) is counted afresh.  Only this
     * thread changes stored_*, so it reads them unlocked. */
    bool counts = false;
    if (rc == TOPOS_OK && p->counted && !stale &&
        w->stored_bytes + (int64_t)p->len <= w->blob_cap) {
      blobs = w->stored_blobs + 1;
      bytes = w->stored_bytes + (int64_t)p->len;
      counts = true;
    } else {
      counts = stored_counts(w, &blobs, &bytes);
      stale = !counts;
    }
    pthread_mutex_lock(&w->lock);
    w->head = p->next;
    if (w->head == NULL) w->tail = NULL;
    w->pending_blobs--;
    w->pending_bytes -= (int64_t)p->len;
    if (p->counted) {
      w->new_blobs--;
      w->new_bytes -= (int64_t)p->len;
    }
    if (counts) {
      w->stored_blobs = blobs;
      w->stored_bytes = bytes;
    }
    blob_pending *dead = NULL;
    pending_unref_locked(p, &dead); /* the queue's */
    pending_unref_locked(p, &dead); /* ours */
    pthread_cond_broadcast(&w->drained);
    pthread_mutex_unlock(&w->lock);
    free_dead(w, dead);
    pthread_mutex_lock(&w->lock);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

blob_writer *blob_writer_start(const char *path, int64_t blob_cap,
                               int64_t max_pending, topos_error *err) {
  blob_writer *w = calloc(1, sizeof *w);
  if (w == NULL) {
    if (err) {
      err->code = TOPOS_ERR_MEMORY;
      snprintf(err->message, sizeof err->message, "out of memory");
    }
    return NULL;
  }
  w->max_pending = max_pending < 0 ? 0 : max_pending;
  w->blob_cap = blob_cap;
  w->store = store_open(path, err);
  if (w->store == NULL ||
      store_set_blob_cap(w->store, blob_cap, err) != TOPOS_OK ||
      (w->max_pending > 0 && (w->reader = store_open(path, err)) == NULL)) {
    store_close(w->store);
    free(w);
    return NULL;
  }
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
  pthread_cond_init(&w->drained, NULL);
  w->spare_max = w->max_pending > 0 ? w->max_pending : DURABLE_SPARE_BYTES;
  if (w->max_pending > 0) {
    w->started = pthread_create(&w->thread, NULL, writer_main, w) == 0;
    if (!w->started) {
      log_event_at(LOG_WARN, "warning",
                   "no blob writer thread: PutBlob writes durably");
      w->max_pending = 0;
      w->spare_max = DURABLE_SPARE_BYTES;
    }
  }
  return w;
}

void blob_writer_stop(blob_writer *w) {
  if (w == NULL) return;
  pthread_mutex_lock(&w->lock);
  w->stopping = true;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->lock);
  if (w->started) pthread_join(w->thread, NULL);
  /* Without a thread nothing can be queued; with one, it drained. */
  blob_pending *dead = NULL;
  while (w->head) {
    blob_pending *p = w->head;
    w->head = p->next;
    pending_unref_locked(p, &dead);
  }
  w->spare_max = 0; /* free everything, keep nothing */
  free_dead(w, dead);
  free(w->spare);
  store_close(w->reader);
  store_close(w->store);
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->wake);
  pthread_cond_destroy(&w->drained);
  free(w);
}

static blob_pending *find_locked(blob_writer *w, const char *id) {
  blob_pending *p = w->head;
  while (p && strcmp(p->id, id) != 0) p = p->next;
  return p;
}

int blob_writer_put(blob_writer *w, const char *tenant, const char *id,
                    uint8_t *bytes, size_t len, size_t cap, topos_error *err) {
  if (tenant == NULL) tenant = "";
  if (w->max_pending == 0) {
    char stored[65];
    int rc = store_put_blob_as(w->store, tenant, bytes, len, stored, err);
    recycle(w, bytes, cap);
    return rc;
  }
  blob_pending *p = calloc(1, sizeof *p);
  if (p == NULL) {
    free(bytes);
    if (err) {
      err->code = TOPOS_ERR_MEMORY;
      snprintf(err->message, sizeof err->message, "out of memory");
    }
    return TOPOS_ERR_MEMORY;
  }
  memcpy(p->id, id, 65);
  snprintf(p->owner, sizeof p->owner, "%s", tenant);
  p->bytes = bytes;
  p->len = len;
  p->cap = cap;
  p->refs = 1;
  pthread_mutex_lock(&w->lock);
  /* Back-pressure: wait for room, unless nothing is pending (a single
   * blob larger than the bound still goes through).  The same blob
   * queued already (by another upload, maybe while this one waited) is
   * written by that entry. */
  for (;;) {
    blob_pending *q = find_locked(w, id);
    if (q != NULL) {
      /* Queued by another tenant: this one owns it too, recorded now
       * (the row may come before the writer commits the bytes). */
      bool other = tenant[0] != '\0' && strcmp(q->owner, tenant) != 0;
      pthread_mutex_unlock(&w->lock);
      free(p);
      recycle(w, bytes, cap);
      return other ? store_blob_own(w->reader, id, tenant, err) : TOPOS_OK;
    }
    if (w->pending_bytes == 0 ||
        w->pending_bytes + (int64_t)len <= w->max_pending)
      break;
    pthread_cond_wait(&w->drained, &w->lock);
  }
  /* Not queued, so the writer is not committing it: whether the store
   * has it cannot change before it is queued (the lock is held). */
  int64_t size = 0;
  p->counted = store_stat_blob(w->reader, id, &size, NULL) != TOPOS_OK;
  if (w->tail)
    w->tail->next = p;
  else
    w->head = p;
  w->tail = p;
  w->pending_blobs++;
  w->pending_bytes += (int64_t)len;
  if (p->counted) {
    w->new_blobs++;
    w->new_bytes += (int64_t)len;
  }
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  return TOPOS_OK;
}

const uint8_t *blob_writer_lookup(blob_writer *w, const char *id, size_t *len,
                                  blob_pending **ref) {
  *ref = NULL;
  pthread_mutex_lock(&w->lock);
  blob_pending *p = find_locked(w, id);
  if (p) p->refs++;
  pthread_mutex_unlock(&w->lock);
  if (p == NULL) return NULL;
  *ref = p;
  *len = p->len;
  return p->bytes;
}

bool blob_writer_pending_owner(blob_writer *w, const char *id,
                               const char *tenant) {
  pthread_mutex_lock(&w->lock);
  blob_pending *p = find_locked(w, id);
  bool owns = p != NULL && strcmp(p->owner, tenant) == 0;
  pthread_mutex_unlock(&w->lock);
  return owns;
}

void blob_writer_release(blob_writer *w, blob_pending *ref) {
  if (ref == NULL) return;
  blob_pending *dead = NULL;
  pthread_mutex_lock(&w->lock);
  pending_unref_locked(ref, &dead);
  pthread_mutex_unlock(&w->lock);
  free_dead(w, dead);
}

void blob_writer_counts(blob_writer *w, int64_t *blobs, int64_t *bytes) {
  pthread_mutex_lock(&w->lock);
  *blobs = w->pending_blobs;
  *bytes = w->pending_bytes;
  pthread_mutex_unlock(&w->lock);
}

bool blob_writer_acknowledged(blob_writer *w, int64_t *blobs, int64_t *bytes) {
  pthread_mutex_lock(&w->lock);
  bool pending = w->head != NULL;
  if (pending) {
    *blobs = w->stored_blobs + w->new_blobs;
    *bytes = w->stored_bytes + w->new_bytes;
  }
  pthread_mutex_unlock(&w->lock);
  return pending;
}
