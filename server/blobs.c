/*
 * blobs.c - a FIFO of blobs waiting to be written, one writer thread.
 *
 * A pending entry is reference counted: the queue holds one reference and
 * every reader that looked it up holds one, so the writer can drop a
 * written blob while a worker is still decoding its bytes.  Lookups scan
 * the queue (a handful of large blobs at most: the bound is in bytes).
 */
#include "blobs.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

struct blob_pending {
  char id[65];
  uint8_t *bytes;
  size_t len, cap; /* cap: the buffer's size (from blob_writer_buffer) */
  int refs;        /* under the writer's lock */
  blob_pending *next;
};

struct blob_writer {
  topos_store *store; /* the writer's own handle */
  pthread_mutex_t lock;
  pthread_cond_t wake;    /* the writer: work arrived or stop */
  pthread_cond_t drained; /* putters: room freed */
  blob_pending *head, *tail;
  int64_t pending_blobs, pending_bytes, max_pending;
  bool stopping, started;
  pthread_t thread;
  /* The largest buffer of a written blob, kept for the next upload. */
  uint8_t *spare;
  size_t spare_cap;
};

static void pending_unref_locked(blob_pending *p, blob_pending **dead) {
  if (--p->refs == 0) {
    p->next = *dead;
    *dead = p;
  }
}

/* Frees dead entries; the largest buffer among them (and the current
 * spare) is kept as the spare, within the pending bound. */
static void free_dead(blob_writer *w, blob_pending *dead) {
  while (dead) {
    blob_pending *next = dead->next;
    uint8_t *drop = dead->bytes;
    size_t cap = dead->cap;
    if (cap > 0 && (int64_t)cap <= w->max_pending) {
      pthread_mutex_lock(&w->lock);
      if (cap > w->spare_cap) {
        uint8_t *old = w->spare;
        w->spare = drop;
        w->spare_cap = cap;
        drop = old;
      }
      pthread_mutex_unlock(&w->lock);
    }
    free(drop);
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

static void *writer_main(void *arg) {
  blob_writer *w = arg;
  /* Persistence is background work: requests go first (Linux nice values
   * are per thread). */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
    log_event("warning", "blob writer keeps its priority");
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (w->head == NULL && !w->stopping)
      pthread_cond_wait(&w->wake, &w->lock);
    blob_pending *p = w->head;
    if (p == NULL) break; /* stopping and drained */
    p->refs++;            /* ours while writing, unlocked */
    pthread_mutex_unlock(&w->lock);
    topos_error err = {0};
    char id[65];
    int rc = store_put_blob(w->store, p->bytes, p->len, id, &err);
    if (rc != TOPOS_OK)
      log_event("error", "blob %s (%zu bytes) was not stored: %s", p->id,
                p->len, err.message);
    else if (strcmp(id, p->id) != 0)
      log_event("error", "blob %s was stored as %s", p->id, id);
    pthread_mutex_lock(&w->lock);
    w->head = p->next;
    if (w->head == NULL) w->tail = NULL;
    w->pending_blobs--;
    w->pending_bytes -= (int64_t)p->len;
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
  w->store = store_open(path, err);
  if (w->store == NULL ||
      store_set_blob_cap(w->store, blob_cap, err) != TOPOS_OK) {
    store_close(w->store);
    free(w);
    return NULL;
  }
  w->max_pending = max_pending < 0 ? 0 : max_pending;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
  pthread_cond_init(&w->drained, NULL);
  if (w->max_pending > 0) {
    w->started = pthread_create(&w->thread, NULL, writer_main, w) == 0;
    if (!w->started) w->max_pending = 0; /* fall back to synchronous */
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
  w->max_pending = 0; /* free everything, keep nothing */
  free_dead(w, dead);
  free(w->spare);
  store_close(w->store);
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->wake);
  pthread_cond_destroy(&w->drained);
  free(w);
}

int blob_writer_put(blob_writer *w, const char *id, uint8_t *bytes, size_t len,
                    size_t cap, topos_error *err) {
  if (w->max_pending == 0) {
    char stored[65];
    int rc = store_put_blob(w->store, bytes, len, stored, err);
    free(bytes);
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
  p->bytes = bytes;
  p->len = len;
  p->cap = cap;
  p->refs = 1;
  pthread_mutex_lock(&w->lock);
  /* Back-pressure: wait for room, unless nothing is pending (a single
   * blob larger than the bound still goes through). */
  while (w->pending_bytes > 0 &&
         w->pending_bytes + (int64_t)len > w->max_pending)
    pthread_cond_wait(&w->drained, &w->lock);
  if (w->tail)
    w->tail->next = p;
  else
    w->head = p;
  w->tail = p;
  w->pending_blobs++;
  w->pending_bytes += (int64_t)len;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  return TOPOS_OK;
}

const uint8_t *blob_writer_lookup(blob_writer *w, const char *id, size_t *len,
                                  blob_pending **ref) {
  *ref = NULL;
  pthread_mutex_lock(&w->lock);
  blob_pending *p = w->head;
  while (p && strcmp(p->id, id) != 0) p = p->next;
  if (p) p->refs++;
  pthread_mutex_unlock(&w->lock);
  if (p == NULL) return NULL;
  *ref = p;
  *len = p->len;
  return p->bytes;
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
