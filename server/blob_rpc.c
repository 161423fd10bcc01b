/*
 * blob_rpc.c - the blob resource: PutBlob validates and names an upload,
 * StatBlob says whether one is held, and the other rooms' requests refer
 * to blob tensors by {id, index}.  Decoded blobs are cached (cache.c,
 * "blob <id>"); the bytes come from the store, or with early
 * acknowledgement from the write-behind queue (blobs.c) until the store
 * has them.
 *
 * References are looked up here, before a request's tensors are
 * converted (blob_refs, rooms.h): wire.c converts from the table of what
 * was found and never calls back into the daemon.
 */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "blobs.h"
#include "rooms.h"

/* ------------------------------------------------------- cached blobs */

typedef struct blob_set {
  int n;
  topos_tensor **tensors;
} blob_set;

static void destroy_blob_set(void *v) {
  blob_set *b = v;
  wire_tensor_array_free(b->tensors, b->n);
  free(b);
}

/* Caches a set of tensors under "blob <id>" (takes ownership of them). */
static blob_set *cache_blob_set(call_ctx *cx, const char *id,
                                topos_tensor **tensors, int n,
                                cache_entry **ref) {
  blob_set *b = malloc(sizeof *b);
  if (b == NULL) {
    wire_tensor_array_free(tensors, n);
    return NULL;
  }
  b->n = n;
  b->tensors = tensors;
  /* The memory the entry keeps: tensors (structs and buffers), the array
   * and the set. */
  int64_t bytes = (int64_t)(sizeof *b + sizeof *tensors * (size_t)n);
  for (int i = 0; i < n; i++)
    bytes += (int64_t)topos_tensor_memory_bytes(tensors[i]);
  char key[80];
  snprintf(key, sizeof key, "blob %s", id);
  return cache_put(cx->d->cache, key, b, destroy_blob_set, bytes, ref);
}

/* ------------------------------------------------------------ ownership */

/* Whose blobs a call may see (docs/operations.md, "Isolation"): NULL for
 * every blob (auth off, or an admin tenant), else the caller's tenant. */
static const char *blob_scope(const call_ctx *cx) {
  return cx->tenant == NULL || cx->tenant[0] == '\0' || cx->admin ? NULL
                                                                  : cx->tenant;
}

/* Whether the caller may see blob id: a blob another tenant uploaded is
 * answered exactly like an unknown id.  False with err set when the store
 * cannot say. */
static bool blob_visible(call_ctx *cx, const char *id, bool *visible,
                         topos_error *err) {
  const char *scope = blob_scope(cx);
  *visible = true;
  if (scope == NULL || blob_writer_pending_owner(cx->d->blobs, id, scope))
    return true;
  return store_blob_owned(cx->d->store, id, scope, visible, err) == TOPOS_OK;
}

/* The blob `id` decoded (borrowed until *ref is released), or NULL with
 * err filled (NOT_FOUND when the store has no such blob, or the caller's
 * tenant does not own it). */
static blob_set *get_blob(call_ctx *cx, const char *id, cache_entry **ref,
                          topos_error *err) {
  /* Checked before the cache, which all tenants share. */
  bool visible = false;
  if (!blob_visible(cx, id, &visible, err)) return NULL;
  if (!visible) {
    err->code = TOPOS_ERR_NOT_FOUND;
    snprintf(err->message, sizeof err->message, "no blob with id %s", id);
    return NULL;
  }
  char key[80];
  snprintf(key, sizeof key, "blob %s", id);
  blob_set *b = cache_get(cx->d->cache, key, ref);
  if (b != NULL) return b;
  /* Not decoded yet: from the write-behind queue, else from the store. */
  uint8_t *bytes = NULL;
  size_t len = 0;
  blob_pending *pending = NULL;
  const uint8_t *data = blob_writer_lookup(cx->d->blobs, id, &len, &pending);
  if (data == NULL) {
    if (store_get_blob(cx->d->store, id, &bytes, &len, err) != TOPOS_OK) {
      if (err->code == TOPOS_ERR_NOT_FOUND)
        snprintf(err->message, sizeof err->message, "no blob with id %s", id);
      return NULL;
    }
    data = bytes;
  }
  Topos__V1__PutBlobRequest *m =
      topos__v1__put_blob_request__unpack(cx->alloc, len, data);
  topos_tensor **tensors = NULL;
  int rc = TOPOS_OK;
  if (m == NULL) {
    rc = TOPOS_ERR_CORRUPT;
    err->code = rc;
    snprintf(err->message, sizeof err->message, "stored blob %s does not parse",
             id);
  } else if (m->n_tensors > INT32_MAX) {
    rc = TOPOS_ERR_CORRUPT;
    err->code = rc;
    snprintf(err->message, sizeof err->message, "stored blob %s is too long",
             id);
  } else {
    rc = wire_tensor_array_from_proto(m->tensors, m->n_tensors, NULL,
                                      "blob.tensors", &tensors, err);
  }
  free(bytes);
  blob_writer_release(cx->d->blobs, pending);
  if (rc != TOPOS_OK) return NULL;
  b = cache_blob_set(cx, id, tensors, (int)m->n_tensors, ref);
  if (b == NULL) {
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "out of memory");
  }
  return b;
}

/* ------------------------------------------------ references in requests */

/*
 * A run's blob tensors are announced to the device backends for as long
 * as the run holds them (blob_refs_add to blob_refs_clear): tensor i of
 * blob X is content SHA-256("X:i"), so a GPU keeps one copy of it across
 * steps and a client's unchanged parameters cross the bus once.  The
 * announcement only names memory; a run that finds it retracted (another
 * run holding the same blob finished first) uploads as usual.  Nothing
 * happens without a device.
 */
static void announce_tensors(const char *id, topos_tensor *const *t, int n,
                             bool on) {
  if (!topos_blob_announce_wanted()) return;
  for (int i = 0; i < n; i++) {
    size_t bytes;
    const void *mem = topos_tensor_memory(t[i], &bytes);
    if (mem == NULL || bytes == 0) continue;
    if (!on) {
      topos_blob_retract(mem);
      continue;
    }
    char key[80];
    int len = snprintf(key, sizeof key, "%s:%d", id, i);
    uint8_t hash[32];
    unsigned hlen = 0;
    if (EVP_Digest(key, (size_t)len, hash, &hlen, EVP_sha256(), NULL) == 1)
      topos_blob_announce(mem, bytes, hash);
  }
}

bool blob_refs_add(call_ctx *cx, blob_refs *b, Topos__V1__Tensor *const *v,
                   size_t n) {
  for (size_t i = 0; v != NULL && i < n; i++) {
    /* After a failed lookup the conversion stops at that reference, so
     * nothing after it is read. */
    if (b->table.failed_id != NULL) return true;
    const Topos__V1__BlobRef *r = v[i] != NULL ? v[i]->blob : NULL;
    /* A malformed reference is the conversion's to report; it needs no
     * lookup. */
    if (r == NULL || !wire_id_valid(r->id) || r->index < 0) continue;
    /* Clients refer to a blob's tensors in a run ({id, 0..n-1}). */
    if (b->last != NULL && strcmp(b->last, r->id) == 0) continue;
    if (b->n == b->cap) {
      size_t cap = b->cap ? 2 * b->cap : 8;
      wire_blob *nv = realloc(b->v, cap * sizeof *nv);
      if (nv != NULL) b->v = nv;
      cache_entry **nr = nv ? realloc(b->refs, cap * sizeof *nr) : NULL;
      if (nr == NULL) {
        call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                  "out of memory");
        return false;
      }
      b->refs = nr;
      b->cap = cap;
    }
    topos_error err = {0};
    cache_entry *ref = NULL;
    blob_set *s = get_blob(cx, r->id, &ref, &err);
    if (s == NULL) {
      b->table.failed_id = r->id;
      b->table.failed = err;
      return true;
    }
    b->v[b->n] = (wire_blob){r->id, s->tensors, s->n};
    b->refs[b->n] = ref;
    b->n++;
    announce_tensors(r->id, s->tensors, s->n, true);
    b->last = r->id;
  }
  return true;
}

const wire_blobs *blob_refs_table(blob_refs *b) {
  wire_blobs_sort(b->v, b->n);
  b->table.v = b->v;
  b->table.n = b->n;
  return &b->table;
}

void blob_refs_clear(call_ctx *cx, blob_refs *b) {
  for (size_t i = 0; i < b->n; i++) {
    announce_tensors(b->v[i].id, b->v[i].tensors, b->v[i].n, false);
    cache_release(cx->d->cache, b->refs[i]);
  }
  free(b->refs);
  free(b->v);
  memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------- PutBlob, StatBlob */

/*
 * A blob is a PutBlobRequest re-packed canonically: each tensor as dtype,
 * shape and data only, in order, packed by protobuf-c (fields in number
 * order, packed shapes, nothing unknown).  Its id is the SHA-256 of those
 * bytes, so the same tensors give the same id whichever client encoded
 * them, and the daemon decodes a stored blob with the same message.
 *
 * Speed (a 100 MB upload; SHA-256 runs at ~1.1 GB/s here, a warm copy at
 * ~6 GB/s): the hash is the largest cost, so for a large request it
 * starts at once on a helper thread over the bytes as received, while
 * this thread unpacks, validates and packs the canonical form into a
 * reused buffer, comparing it with the received bytes as it goes.  A
 * client that sent the canonical form (protobuf-c does; so do the other
 * protobuf libraries for these messages) gets the helper's hash; any
 * other encoding is hashed again from the packed bytes.  The blob then
 * goes to the blob writer (blobs.h), which commits it before PutBlob
 * answers unless the operator opted into early acknowledgement; its
 * tensors are decoded on first use.
 */
#define PARALLEL_HASH_BYTES ((size_t)4 << 20)

typedef struct parallel_hash {
  pthread_t thread;
  bool started, ok;
  const uint8_t *bytes;
  size_t len;
  unsigned char md[32];
} parallel_hash;

static bool sha256(const void *bytes, size_t len, unsigned char md[32]) {
  unsigned int mdlen = 0;
  return EVP_Digest(bytes, len, md, &mdlen, EVP_sha256(), NULL) && mdlen == 32;
}

static void *parallel_hash_main(void *arg) {
  parallel_hash *h = arg;
  h->ok = sha256(h->bytes, h->len, h->md);
  return NULL;
}

static void parallel_hash_join(parallel_hash *h) {
  if (h->started) pthread_join(h->thread, NULL);
  h->started = false;
}

typedef struct canonical_buffer {
  ProtobufCBuffer base;
  uint8_t *out;
  size_t len;
  const uint8_t *received; /* compared with what is packed, when set */
  size_t received_len;
  bool same; /* so far, what is packed equals what was received */
} canonical_buffer;

static void canonical_append(ProtobufCBuffer *buffer, size_t len,
                             const uint8_t *data) {
  canonical_buffer *c = (canonical_buffer *)buffer;
  if (c->same && (c->received == NULL || c->len + len > c->received_len ||
                  memcmp(c->received + c->len, data, len) != 0))
    c->same = false;
  memcpy(c->out + c->len, data, len);
  c->len += len;
}

static void put_blob(call_ctx *cx, parallel_hash *ph) {
  Topos__V1__PutBlobRequest *req = call_unpack(
      cx, &topos__v1__put_blob_request__descriptor, "PutBlob", false);
  if (req == NULL) return;
  if (req->n_tensors > (size_t)INT32_MAX) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "too many tensors");
    return;
  }
  /* Validate every tensor as the engine would take it (one at a time, so
   * the engine's pool recycles one buffer). */
  topos_error err = {0};
  int n = (int)req->n_tensors;
  for (int i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "tensors[%d]", i);
    topos_tensor *t = wire_tensor_from_proto(req->tensors[i], NULL, what, &err);
    if (t == NULL) {
      call_fail_err(cx, &err, what);
      return;
    }
    topos_tensor_release(t);
  }
  if (!call_continue(cx)) return;
  Topos__V1__Tensor *canon =
      n ? call_scratch(cx, sizeof *canon * (size_t)n) : NULL;
  Topos__V1__Tensor **ptrs =
      n ? call_scratch(cx, sizeof *ptrs * (size_t)n) : NULL;
  if (n && (canon == NULL || ptrs == NULL)) return;
  for (int i = 0; i < n; i++) {
    topos__v1__tensor__init(&canon[i]);
    canon[i].dtype = req->tensors[i]->dtype;
    canon[i].n_shape = req->tensors[i]->n_shape;
    canon[i].shape = req->tensors[i]->shape;
    canon[i].data = req->tensors[i]->data;
    ptrs[i] = &canon[i];
  }
  Topos__V1__PutBlobRequest blob = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  blob.n_tensors = (size_t)n;
  blob.tensors = ptrs;
  size_t len = topos__v1__put_blob_request__get_packed_size(&blob);
  if ((int64_t)len > cx->d->cfg->blob_cap_bytes) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "a blob of %zu bytes is larger than the daemon's blob cap "
              "(%lld bytes)",
              len, (long long)cx->d->cfg->blob_cap_bytes);
    return;
  }
  size_t cap = 0;
  canonical_buffer c = {{canonical_append},
                        blob_writer_buffer(cx->d->blobs, len, &cap),
                        0,
                        ph->started ? cx->in : NULL,
                        cx->in_len,
                        true};
  if (c.out == NULL) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory for a %zu-byte blob", len);
    return;
  }
  topos__v1__put_blob_request__pack_to_buffer(&blob, &c.base);
  if (c.len != len) {
    free(c.out);
    call_fail(cx, WIRE_GRPC_INTERNAL, 0, "blob packed to %zu of %zu bytes",
              c.len, len);
    return;
  }
  /* The received bytes were canonical: their hash is the id. */
  unsigned char md[32];
  bool hashed = false;
  if (ph->started && c.same && c.len == cx->in_len) {
    parallel_hash_join(ph);
    if (ph->ok) {
      memcpy(md, ph->md, sizeof md);
      hashed = true;
    }
  }
  if (!hashed && !sha256(c.out, len, md)) {
    free(c.out);
    call_fail(cx, WIRE_GRPC_INTERNAL, 0, "SHA-256 failed");
    return;
  }
  char id[65];
  for (int i = 0; i < 32; i++) snprintf(id + 2 * i, 3, "%02x", md[i]);
  /* The caller's tenant owns it afterwards, whether the bytes were new
   * or another tenant's already (the reply is the same either way). */
  const char *owner = cx->tenant != NULL ? cx->tenant : "";
  bool owned = false;
  if (cx->quota != NULL && cx->quota->stored_bytes >= 0 &&
      store_blob_owned(cx->d->store, id, owner, &owned, &err) != TOPOS_OK) {
    free(c.out);
    call_fail_err(cx, &err, "store");
    return;
  }
  if (!call_quota_stored(cx, "PutBlob", owned ? 0 : (int64_t)len)) {
    free(c.out); /* over the tenant's stored_bytes: nothing stored */
    return;
  }
  if (blob_writer_put(cx->d->blobs, owner, id, c.out, len, cap, &err) !=
      TOPOS_OK) {
    if (err.code == TOPOS_ERR_MEMORY)
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY, "%s",
                err.message);
    else
      call_fail_err(cx, &err, "store");
    return;
  }
  Topos__V1__PutBlobReply r = TOPOS__V1__PUT_BLOB_REPLY__INIT;
  r.id = id;
  r.bytes = (int64_t)len;
  call_reply(cx, &r.base);
}

void handle_put_blob(call_ctx *cx) {
  parallel_hash ph = {.bytes = cx->in, .len = cx->in_len};
  if (cx->in_len >= PARALLEL_HASH_BYTES)
    ph.started = pthread_create(&ph.thread, NULL, parallel_hash_main, &ph) == 0;
  put_blob(cx, &ph);
  parallel_hash_join(&ph); /* on every path: it reads the request */
}

void handle_stat_blob(call_ctx *cx) {
  Topos__V1__StatBlobRequest *req = call_unpack(
      cx, &topos__v1__stat_blob_request__descriptor, "StatBlob", false);
  if (req == NULL || !call_check_id(cx, req->id, "id")) return;
  topos_error err = {0};
  int64_t size = 0;
  Topos__V1__StatBlobReply r = TOPOS__V1__STAT_BLOB_REPLY__INIT;
  blob_pending *pending = NULL;
  size_t pending_len = 0;
  bool visible = false;
  if (!blob_visible(cx, req->id, &visible, &err)) {
    call_fail_err(cx, &err, "store");
    return;
  }
  if (!visible) {
    /* Another tenant's blob: present = false, as for an unknown id. */
  } else if (blob_writer_lookup(cx->d->blobs, req->id, &pending_len,
                                &pending)) {
    blob_writer_release(cx->d->blobs, pending);
    r.present = true;
    r.bytes = (int64_t)pending_len;
  } else if (store_stat_blob(cx->d->store, req->id, &size, &err) == TOPOS_OK) {
    r.present = true;
    r.bytes = size;
  } else if (err.code != TOPOS_ERR_NOT_FOUND) {
    call_fail_err(cx, &err, "store");
    return;
  }
  call_reply(cx, &r.base);
}

/* GetBlob: the stored PutBlobRequest bytes are the reply as they are
 * (GetBlobReply has the same field 1), from the write-behind queue or the
 * store; another tenant's blob is NOT_FOUND, as an unknown id. */
void handle_get_blob(call_ctx *cx) {
  Topos__V1__GetBlobRequest *req = call_unpack(
      cx, &topos__v1__get_blob_request__descriptor, "GetBlob", false);
  if (req == NULL || !call_check_id(cx, req->id, "id")) return;
  topos_error err = {0};
  bool visible = false;
  if (!blob_visible(cx, req->id, &visible, &err)) {
    call_fail_err(cx, &err, "store");
    return;
  }
  if (!visible) {
    call_fail(cx, WIRE_GRPC_NOT_FOUND, TOPOS_ERR_NOT_FOUND,
              "no blob with id %s", req->id);
    return;
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  blob_pending *pending = NULL;
  const uint8_t *data =
      blob_writer_lookup(cx->d->blobs, req->id, &len, &pending);
  if (data != NULL) {
    bytes = malloc(len ? len : 1);
    if (bytes != NULL) memcpy(bytes, data, len);
    blob_writer_release(cx->d->blobs, pending);
    if (bytes == NULL) {
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "out of memory copying blob %s", req->id);
      return;
    }
  } else if (store_get_blob(cx->d->store, req->id, &bytes, &len, &err) !=
             TOPOS_OK) {
    if (err.code == TOPOS_ERR_NOT_FOUND)
      call_fail(cx, WIRE_GRPC_NOT_FOUND, TOPOS_ERR_NOT_FOUND,
                "no blob with id %s", req->id);
    else
      call_fail_err(cx, &err, "store");
    return;
  }
  if ((int64_t)len > cx->d->cfg->max_message_bytes) {
    free(bytes);
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "blob %s is %zu bytes, over the daemon's max-message-bytes %lld",
              req->id, len, (long long)cx->d->cfg->max_message_bytes);
    return;
  }
  cx->out = bytes;
  cx->out_len = len;
}
