/*
 * wire.c - protobuf messages <-> engine values (see wire.h for the
 * contract: trust, ownership, status mapping).
 *
 * Everything that comes from a message is checked here before it reaches
 * an allocation or the engine: enums, ranks, extents, counts, byte lengths,
 * operand indices, permutation lengths.  What the engine checks anyway
 * (op shape rules, feed shapes, optimizer hyper-parameters) is left to it,
 * so a message is held to exactly the rules a local caller is.
 */
#include "wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "utf8.h"

/* ------------------------------------------------------------ errors */

static int fail(topos_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(topos_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Prefixes err's message with "<prefix>: " (keeps the code). */
static int prefix_error(topos_error *err, int code, const char *prefix) {
  if (!err) return code;
  char msg[sizeof err->message];
  snprintf(msg, sizeof msg, "%s", err->message);
  return fail(err, code, "%s: %s", prefix, msg);
}

int wire_grpc_status_of(int code) {
  switch (code) {
    case TOPOS_OK:
      return WIRE_GRPC_OK;
    case TOPOS_ERR_ARGUMENT:
    case TOPOS_ERR_SHAPE:
    case TOPOS_ERR_DTYPE:
    case TOPOS_ERR_RANGE:
    case TOPOS_ERR_STATE:
      return WIRE_GRPC_INVALID_ARGUMENT;
    case TOPOS_ERR_NOT_FOUND:
      return WIRE_GRPC_NOT_FOUND;
    case TOPOS_ERR_MEMORY:
      return WIRE_GRPC_RESOURCE_EXHAUSTED;
    case TOPOS_ERR_CORRUPT:
      return WIRE_GRPC_DATA_LOSS;
    case TOPOS_ERR_IO:
      return WIRE_GRPC_UNAVAILABLE;
    case TOPOS_ERR_CANCELLED:
      return WIRE_GRPC_CANCELLED;
    case TOPOS_ERR_DEADLINE:
      return WIRE_GRPC_DEADLINE_EXCEEDED;
    default:
      if (code > WIRE_GRPC_BASE && code <= WIRE_GRPC_BASE + 16)
        return code - WIRE_GRPC_BASE;
      return WIRE_GRPC_INTERNAL;
  }
}

int wire_topos_code_of(int status) {
  switch (status) {
    case WIRE_GRPC_OK:
      return TOPOS_OK;
    case WIRE_GRPC_INVALID_ARGUMENT:
      return TOPOS_ERR_ARGUMENT;
    case WIRE_GRPC_NOT_FOUND:
      return TOPOS_ERR_NOT_FOUND;
    case WIRE_GRPC_RESOURCE_EXHAUSTED:
      return TOPOS_ERR_MEMORY;
    case WIRE_GRPC_DATA_LOSS:
      return TOPOS_ERR_CORRUPT;
    default:
      return WIRE_GRPC_BASE + status;
  }
}

const char *wire_grpc_status_name(int status) {
  static const char *const names[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  if (status < 0 || status >= (int)(sizeof names / sizeof names[0]))
    return "UNKNOWN_STATUS";
  return names[status];
}

/* ------------------------------------------------------------ messages */

/* Frees one field's storage (not the message): strings and bytes that are
 * not the field's static default, sub-messages, repeated arrays. */
static void free_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  char *base = (char *)m;
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
    uint32_t which = *(uint32_t *)(base + f->quantifier_offset);
    if (which != f->id) return;
  }
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    size_t n = *(size_t *)(base + f->quantifier_offset);
    void **arr = *(void ***)(base + f->offset);
    if (arr) {
      for (size_t i = 0; i < n; i++) {
        if (f->type == PROTOBUF_C_TYPE_STRING) {
          free(((char **)arr)[i]);
        } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
          free(((ProtobufCBinaryData *)arr)[i].data);
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
          if (arr[i])
            protobuf_c_message_free_unpacked((ProtobufCMessage *)arr[i], NULL);
        }
      }
    }
    free(arr);
    return;
  }
  if (f->type == PROTOBUF_C_TYPE_STRING) {
    char *s = *(char **)(base + f->offset);
    if (s && s != (const char *)f->default_value &&
        s != (const char *)protobuf_c_empty_string)
      free(s);
  } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
    ProtobufCBinaryData *b = (ProtobufCBinaryData *)(base + f->offset);
    const ProtobufCBinaryData *def = f->default_value;
    if (b->data && (!def || b->data != def->data)) free(b->data);
  } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    ProtobufCMessage *sub = *(ProtobufCMessage **)(base + f->offset);
    if (sub && sub != f->default_value)
      protobuf_c_message_free_unpacked(sub, NULL);
  }
}

void wire_message_clear(ProtobufCMessage *m) {
  if (!m || !m->descriptor) return;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) free_field(m, &d->fields[i]);
  /* Unknown fields are only ever set by protobuf-c's unpack. */
  for (unsigned i = 0; i < m->n_unknown_fields; i++)
    free(m->unknown_fields[i].data);
  free(m->unknown_fields);
  d->message_init(m);
}

void wire_message_free(ProtobufCMessage *m) {
  if (m) protobuf_c_message_free_unpacked(m, NULL);
}

int wire_pack(const ProtobufCMessage *m, uint8_t **bytes, size_t *len,
              topos_error *err) {
  if (!m || !bytes || !len)
    return fail(err, TOPOS_ERR_ARGUMENT, "pack: a NULL argument");
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf)
    return fail(err, TOPOS_ERR_MEMORY, "pack: out of memory for %zu bytes", n);
  size_t got = protobuf_c_message_pack(m, buf);
  if (got != n) {
    free(buf);
    return fail(err, TOPOS_ERR_ARGUMENT, "pack: %zu bytes packed, %zu sized",
                got, n);
  }
  *bytes = buf;
  *len = n;
  return TOPOS_OK;
}

/* ------------------------------------------------------------ strings */

/* Where the walk of a packed message (wire_check_strings) is: a chain of
 * the fields entered, innermost last, rendered as a path
 * ("Spec.nodes[3].name") only when something fails, so a valid message
 * costs no formatting. */
typedef struct walk_frame {
  const struct walk_frame *up;
  const ProtobufCFieldDescriptor *field;
  long index; /* the element of a repeated field; -1 otherwise */
} walk_frame;

typedef struct string_walk {
  const uint8_t *base; /* the whole buffer, for offsets */
  const char *root;    /* the message's short name */
  topos_error *err;
} string_walk;

/* Appends the path of frame f to buf (at least cap bytes, NUL-kept). */
static size_t walk_path(const string_walk *w, const walk_frame *f, char *buf,
                        size_t cap) {
  size_t used = f ? walk_path(w, f->up, buf, cap)
                  : (size_t)snprintf(buf, cap, "%s", w->root);
  if (!f || used >= cap) return used < cap ? used : cap - 1;
  int n = f->index >= 0
              ? snprintf(buf + used, cap - used, ".%s[%ld]", f->field->name,
                         f->index)
              : snprintf(buf + used, cap - used, ".%s", f->field->name);
  used += n > 0 ? (size_t)n : 0;
  return used < cap ? used : cap - 1;
}

static int walk_fail(const string_walk *w, const walk_frame *f,
                     const char *why) {
  char path[512];
  walk_path(w, f, path, sizeof path);
  return fail(w->err, TOPOS_ERR_ARGUMENT, "%s: %s", path, why);
}

/* A varint at *p (at most 10 bytes, inside [*p, end)); advances *p. */
static bool walk_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < 10; i++) {
    if (*p >= end) return false;
    uint8_t b = *(*p)++;
    if (i == 9 && b > 1) return false; /* past 64 bits */
    v |= (uint64_t)(b & 0x7F) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

static int walk_malformed(const string_walk *w, const walk_frame *f,
                          const uint8_t *at, const char *why) {
  char text[160];
  snprintf(text, sizeof text, "malformed at byte %zu (%s)",
           (size_t)(at - w->base), why);
  return walk_fail(w, f, text);
}

/* The field of d numbered `id`, or NULL (a linear scan: only the
 * descriptor's fields array is read). */
static const ProtobufCFieldDescriptor *walk_field(
    const ProtobufCMessageDescriptor *d, uint64_t id) {
  for (unsigned i = 0; i < d->n_fields; i++)
    if (d->fields[i].id == id) return &d->fields[i];
  return NULL;
}

static int walk_message(const string_walk *w, const walk_frame *here,
                        const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, int depth) {
  /* Occurrences so far of each repeated field (its element index), for
   * the first 64 fields of d; a later one is named without an index. */
  uint32_t seen[64] = {0};
  while (p < end) {
    const uint8_t *at = p;
    uint64_t tag = 0, len = 0;
    if (!walk_varint(&p, end, &tag))
      return walk_malformed(w, here, at, "a tag cut short");
    uint64_t id = tag >> 3;
    unsigned type = (unsigned)(tag & 7);
    if (id == 0 || id > 536870911)
      return walk_malformed(w, here, at, "field number 0 or above 2^29 - 1");
    const ProtobufCFieldDescriptor *f = walk_field(d, id);
    bool walked = f && (f->type == PROTOBUF_C_TYPE_STRING ||
                        f->type == PROTOBUF_C_TYPE_MESSAGE);
    if (walked && type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
      return walk_malformed(w, here, at,
                            "a string or message field not length-prefixed");
    switch (type) {
      case PROTOBUF_C_WIRE_TYPE_VARINT:
        if (!walk_varint(&p, end, &len))
          return walk_malformed(w, here, at,
                                "a varint cut short or past 64 bits");
        continue;
      case PROTOBUF_C_WIRE_TYPE_64BIT:
      case PROTOBUF_C_WIRE_TYPE_32BIT: {
        size_t n = type == PROTOBUF_C_WIRE_TYPE_64BIT ? 8 : 4;
        if ((size_t)(end - p) < n)
          return walk_malformed(w, here, at, "a truncated fixed-width value");
        p += n;
        continue;
      }
      case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
        if (!walk_varint(&p, end, &len) || len > (uint64_t)(end - p))
          return walk_malformed(w, here, at, "a truncated length");
        break;
      default:
        return walk_malformed(w, here, at,
                              "groups and wire types 6, 7 are not accepted");
    }
    const uint8_t *v = p;
    p += len;
    if (!walked) continue;
    size_t k = (size_t)(f - d->fields);
    walk_frame frame = {here, f, -1};
    if (f->label == PROTOBUF_C_LABEL_REPEATED && k < 64)
      frame.index = (long)seen[k]++;
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      size_t bad = 0;
      const char *why = NULL;
      if (!topos_utf8_check((const char *)v, (size_t)len, &bad, &why)) {
        char text[160];
        snprintf(text, sizeof text, "%s at byte %zu", why, bad);
        return walk_fail(w, &frame, text);
      }
      continue;
    }
    if (depth + 1 > WIRE_STRING_DEPTH) {
      char text[64];
      snprintf(text, sizeof text, "messages nested deeper than %d",
               WIRE_STRING_DEPTH);
      return walk_fail(w, &frame, text);
    }
    if (!f->descriptor) return walk_fail(w, &frame, "no descriptor");
    int rc = walk_message(w, &frame, f->descriptor, v, v + len, depth + 1);
    if (rc != TOPOS_OK) return rc;
  }
  return TOPOS_OK;
}

int wire_check_strings(const ProtobufCMessageDescriptor *desc,
                       const uint8_t *bytes, size_t len, topos_error *err) {
  if (!desc || (len && !bytes))
    return fail(err, TOPOS_ERR_ARGUMENT, "check strings: a NULL argument");
  if (len == 0) return TOPOS_OK;
  string_walk w = {.base = bytes,
                   .root = desc->short_name ? desc->short_name : "message",
                   .err = err};
  return walk_message(&w, NULL, desc, bytes, bytes + len, 0);
}

/* Allocates a zeroed array of n pointers (n may be 0: NULL). */
static void **ptr_array(size_t n) {
  return n ? calloc(n, sizeof(void *)) : NULL;
}

static char *dup_string(const char *s) {
  size_t n = strlen(s);
  char *c = malloc(n + 1);
  if (c) memcpy(c, s, n + 1);
  return c;
}

/* ------------------------------------------------------------ dtypes */

static bool host_is_little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* Reverses the bytes of each of count elements of size es, in place. */
static void swap_elements(uint8_t *p, size_t count, size_t es) {
  for (size_t i = 0; i < count; i++, p += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      uint8_t t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
}

int wire_dtype_from_proto(int d, const char *what, topos_dtype *out,
                          topos_error *err) {
  switch (d) {
    case TOPOS__V1__DTYPE__F32:
      *out = TOPOS_F32;
      return TOPOS_OK;
    case TOPOS__V1__DTYPE__F64:
      *out = TOPOS_F64;
      return TOPOS_OK;
    case TOPOS__V1__DTYPE__BF16:
      *out = TOPOS_BF16;
      return TOPOS_OK;
    case TOPOS__V1__DTYPE__I32:
      *out = TOPOS_I32;
      return TOPOS_OK;
    default:
      return fail(err, TOPOS_ERR_DTYPE,
                  "%s: unknown dtype %d (F32 0, F64 1, BF16 2, I32 3)",
                  what ? what : "dtype", d);
  }
}

/* "f32[2,3]" into buf (at least 200 bytes). */
static void shape_text(char *buf, size_t cap, const char *dtype, size_t rank,
                       const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, cap, "%s[", dtype);
  for (size_t i = 0; i < rank && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, i ? "," : "",
                             shape[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

bool wire_id_valid(const char *s) {
  if (!s) return false;
  for (int i = 0; i < 64; i++) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return s[64] == '\0';
}

/* ------------------------------------------------------------ tensors */

/* t into *out; `splat`: an all-equal tensor as one element (the splat
 * form, Tensor.splat). */
static int tensor_to_proto(const topos_tensor *t, Topos__V1__Tensor *out,
                           bool splat, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "tensor: out is NULL");
  if (!t) return fail(err, TOPOS_ERR_ARGUMENT, "tensor is NULL");
  topos_dtype dtype = topos_tensor_dtype(t);
  int rank = topos_tensor_rank(t);
  int64_t count = topos_tensor_count(t);
  const int64_t *full_shape = topos_tensor_shape(t);
  topos_tensor *one = NULL;
  if (splat && topos_tensor_is_uniform(t)) {
    /* element 0 alone: a narrow of every axis to extent 1 */
    one = topos_tensor_retain(t);
    for (int a = 0; one && a < rank; a++) {
      topos_tensor *n = topos_tensor_narrow(one, a, 0, 1, err);
      topos_tensor_release(one);
      one = n;
    }
    if (!one) return err ? err->code : TOPOS_ERR_MEMORY;
    t = one;
    count = 1;
  }
  size_t es = topos_dtype_size(dtype);
  size_t bytes = (size_t)count * es;
  int64_t *shape = rank ? malloc(sizeof(int64_t) * (size_t)rank) : NULL;
  uint8_t *data = bytes ? malloc(bytes) : NULL;
  if ((rank && !shape) || (bytes && !data)) {
    free(shape);
    free(data);
    return fail(err, TOPOS_ERR_MEMORY, "tensor: out of memory for %zu bytes",
                bytes);
  }
  if (rank) memcpy(shape, full_shape, sizeof(int64_t) * rank);
  if (bytes) {
    int rc = topos_tensor_read(t, data, bytes, err);
    if (rc != TOPOS_OK) {
      free(shape);
      free(data);
      topos_tensor_release(one);
      return rc;
    }
    if (!host_is_little_endian()) swap_elements(data, (size_t)count, es);
  }
  out->dtype = (Topos__V1__DType)dtype;
  out->n_shape = (size_t)rank;
  out->shape = shape;
  out->data.data = data;
  out->data.len = bytes;
  out->splat = one != NULL;
  topos_tensor_release(one);
  return TOPOS_OK;
}

int wire_tensor_to_proto(const topos_tensor *t, Topos__V1__Tensor *out,
                         topos_error *err) {
  return tensor_to_proto(t, out, false, err);
}

static Topos__V1__Tensor *tensor_new(const topos_tensor *t, bool splat,
                                     topos_error *err) {
  Topos__V1__Tensor *m = malloc(sizeof *m);
  if (!m) {
    fail(err, TOPOS_ERR_MEMORY, "tensor: out of memory");
    return NULL;
  }
  topos__v1__tensor__init(m);
  if (tensor_to_proto(t, m, splat, err) != TOPOS_OK) {
    free(m);
    return NULL;
  }
  return m;
}

Topos__V1__Tensor *wire_tensor_new(const topos_tensor *t, topos_error *err) {
  return tensor_new(t, false, err);
}

Topos__V1__Tensor *wire_tensor_new_splat(const topos_tensor *t,
                                         topos_error *err) {
  return tensor_new(t, true, err);
}

Topos__V1__Tensor *wire_tensor_new_ref(const char *blob_id, int index,
                                       topos_error *err) {
  if (!wire_id_valid(blob_id)) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "blob reference: the id is not 64 lowercase hex digits");
    return NULL;
  }
  if (index < 0) {
    fail(err, TOPOS_ERR_ARGUMENT, "blob reference: index %d is negative",
         index);
    return NULL;
  }
  Topos__V1__Tensor *m = malloc(sizeof *m);
  Topos__V1__BlobRef *ref = malloc(sizeof *ref);
  char *id = dup_string(blob_id);
  if (!m || !ref || !id) {
    free(m);
    free(ref);
    free(id);
    fail(err, TOPOS_ERR_MEMORY, "blob reference: out of memory");
    return NULL;
  }
  topos__v1__tensor__init(m);
  topos__v1__blob_ref__init(ref);
  ref->id = id;
  ref->index = index;
  m->blob = ref;
  return m;
}

void wire_tensor_clear(Topos__V1__Tensor *m) {
  if (m) wire_message_clear(&m->base);
}

static int blob_cmp(const void *a, const void *b) {
  return strcmp(((const wire_blob *)a)->id, ((const wire_blob *)b)->id);
}

void wire_blobs_sort(wire_blob *v, size_t n) {
  if (v && n > 1) qsort(v, n, sizeof *v, blob_cmp);
}

/* Tensor `index` of blob `id` (a checked reference) from what the caller
 * looked up: a new reference. */
static topos_tensor *blob_tensor(const wire_blobs *blobs, const char *id,
                                 int32_t index, const char *what,
                                 topos_error *err) {
  const wire_blob key = {.id = id};
  const wire_blob *b =
      blobs->n ? bsearch(&key, blobs->v, blobs->n, sizeof key, blob_cmp) : NULL;
  if (!b && blobs->failed_id && strcmp(blobs->failed_id, id) == 0) {
    const topos_error *f = &blobs->failed;
    fail(err, f->code ? f->code : TOPOS_ERR_NOT_FOUND, "%s: %s", what,
         f->message[0] ? f->message : "the blob reference is unresolved");
    return NULL;
  }
  if (!b) {
    fail(err, TOPOS_ERR_STATE, "%s: blob %s was not looked up", what, id);
    return NULL;
  }
  if (index >= b->n) {
    fail(err, TOPOS_ERR_RANGE,
         "%s: blob %s holds %d tensors; index %d is out of range", what, id,
         b->n, (int)index);
    return NULL;
  }
  return topos_tensor_retain(b->tensors[index]);
}

topos_tensor *wire_tensor_from_proto(const Topos__V1__Tensor *m,
                                     const wire_blobs *blobs, const char *what,
                                     topos_error *err) {
  if (!what) what = "tensor";
  if (!m) {
    fail(err, TOPOS_ERR_ARGUMENT, "%s is missing", what);
    return NULL;
  }
  if (m->blob) {
    const Topos__V1__BlobRef *b = m->blob;
    if (!blobs) {
      fail(err, TOPOS_ERR_ARGUMENT,
           "%s: a blob reference is not accepted here (send the bytes)", what);
      return NULL;
    }
    if (!wire_id_valid(b->id)) {
      fail(err, TOPOS_ERR_ARGUMENT,
           "%s: blob id \"%.80s\" is not 64 lowercase hex digits", what,
           b->id ? b->id : "");
      return NULL;
    }
    if (b->index < 0) {
      fail(err, TOPOS_ERR_RANGE, "%s: blob index %d is negative", what,
           (int)b->index);
      return NULL;
    }
    return blob_tensor(blobs, b->id, b->index, what, err);
  }
  topos_dtype dtype;
  if (wire_dtype_from_proto((int)m->dtype, what, &dtype, err) != TOPOS_OK)
    return NULL;
  if (m->n_shape > TOPOS_MAX_RANK) {
    fail(err, TOPOS_ERR_SHAPE, "%s: rank %zu; the limit is %d", what,
         m->n_shape, TOPOS_MAX_RANK);
    return NULL;
  }
  if (m->n_shape && !m->shape) {
    fail(err, TOPOS_ERR_SHAPE, "%s: shape is NULL", what);
    return NULL;
  }
  int rank = (int)m->n_shape;
  for (int i = 0; i < rank; i++) {
    if (m->shape[i] < 0) {
      fail(err, TOPOS_ERR_SHAPE,
           "%s: extent %" PRId64 " on axis %d is negative", what, m->shape[i],
           i);
      return NULL;
    }
  }
  char st[256];
  shape_text(st, sizeof st, topos_dtype_name(dtype), m->n_shape, m->shape);
  size_t es = topos_dtype_size(dtype);
  /* The product of the extents must fit int64 even when one of them is 0
   * (an empty tensor): row-major strides multiply the others. */
  int64_t span = 1;
  bool zero = false;
  for (int i = 0; i < rank; i++) {
    int64_t e = m->shape[i] ? m->shape[i] : 1;
    if (m->shape[i] == 0) zero = true;
    if (span > INT64_MAX / e) {
      fail(err, TOPOS_ERR_SHAPE, "%s: %s has more elements than int64 holds",
           what, st);
      return NULL;
    }
    span *= e;
  }
  int64_t count = zero ? 0 : span;
  if ((uint64_t)count > SIZE_MAX / es) {
    fail(err, TOPOS_ERR_SHAPE, "%s: %s has more bytes than size_t holds", what,
         st);
    return NULL;
  }
  if (m->splat && count < 2) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "%s: a splat of %s (%" PRId64
         " elements; the form is for two or more)",
         what, st, count);
    return NULL;
  }
  /* A splat's data is its one element. */
  int64_t stored = m->splat ? 1 : count;
  size_t bytes = (size_t)stored * es;
  if (m->data.len != bytes) {
    fail(err, TOPOS_ERR_ARGUMENT,
         "%s: data holds %zu bytes, %s%s needs %zu (%" PRId64
         " elements of %zu)",
         what, m->data.len, m->splat ? "a splat of " : "", st, bytes, stored,
         es);
    return NULL;
  }
  if (bytes && !m->data.data) {
    fail(err, TOPOS_ERR_ARGUMENT, "%s: data is NULL", what);
    return NULL;
  }
  static const uint8_t empty[8];
  const uint8_t *data = bytes ? m->data.data : empty;
  uint8_t *swapped = NULL;
  if (bytes && !host_is_little_endian()) {
    swapped = malloc(bytes);
    if (!swapped) {
      fail(err, TOPOS_ERR_MEMORY, "%s: out of memory for %zu bytes", what,
           bytes);
      return NULL;
    }
    memcpy(swapped, data, bytes);
    swap_elements(swapped, (size_t)stored, es);
    data = swapped;
  }
  topos_error terr = {0};
  topos_tensor *t = NULL;
  if (m->splat) { /* one element, broadcast: a view, never count copies */
    topos_tensor *e = topos_tensor_from(dtype, 0, NULL, data, &terr);
    t = e ? topos_tensor_broadcast(e, rank, m->shape, &terr) : NULL;
    topos_tensor_release(e);
  } else {
    t = topos_tensor_from(dtype, rank, rank ? m->shape : NULL, data, &terr);
  }
  free(swapped);
  if (!t) fail(err, terr.code, "%s: %s", what, terr.message);
  return t;
}

int wire_tensors_from_array(topos_tensor *const *v, int n,
                            Topos__V1__Tensor ***out, size_t *nout,
                            topos_error *err) {
  if (!out || !nout || n < 0 || (n && !v))
    return fail(err, TOPOS_ERR_ARGUMENT, "tensors: bad arguments");
  *out = NULL;
  *nout = 0;
  Topos__V1__Tensor **arr = (Topos__V1__Tensor **)ptr_array((size_t)n);
  if (n && !arr) return fail(err, TOPOS_ERR_MEMORY, "tensors: out of memory");
  for (int i = 0; i < n; i++) {
    if (!v[i]) {
      wire_tensors_free(arr, (size_t)n);
      return fail(err, TOPOS_ERR_ARGUMENT, "tensors[%d] is NULL", i);
    }
    arr[i] = wire_tensor_new(v[i], err);
    if (!arr[i]) {
      wire_tensors_free(arr, (size_t)n);
      return err ? err->code : TOPOS_ERR_MEMORY;
    }
  }
  *out = arr;
  *nout = (size_t)n;
  return TOPOS_OK;
}

int wire_tensors_from_params(const topos_params *p, Topos__V1__Tensor ***out,
                             size_t *n, topos_error *err) {
  if (!out || !n) return fail(err, TOPOS_ERR_ARGUMENT, "params: out is NULL");
  *out = NULL;
  *n = 0;
  int count = p ? topos_params_count(p) : 0;
  if (count == 0) return TOPOS_OK;
  Topos__V1__Tensor **arr = (Topos__V1__Tensor **)ptr_array((size_t)count);
  if (!arr) return fail(err, TOPOS_ERR_MEMORY, "params: out of memory");
  for (int i = 0; i < count; i++) {
    arr[i] = wire_tensor_new(topos_params_get(p, i), err);
    if (!arr[i]) {
      wire_tensors_free(arr, (size_t)count);
      return err ? err->code : TOPOS_ERR_MEMORY;
    }
  }
  *out = arr;
  *n = (size_t)count;
  return TOPOS_OK;
}

int wire_tensor_refs(const char *blob_id, int n, Topos__V1__Tensor ***out,
                     size_t *nout, topos_error *err) {
  if (!out || !nout || n < 0)
    return fail(err, TOPOS_ERR_ARGUMENT, "blob references: bad arguments");
  *out = NULL;
  *nout = 0;
  Topos__V1__Tensor **arr = (Topos__V1__Tensor **)ptr_array((size_t)n);
  if (n && !arr)
    return fail(err, TOPOS_ERR_MEMORY, "blob references: out of memory");
  for (int i = 0; i < n; i++) {
    arr[i] = wire_tensor_new_ref(blob_id, i, err);
    if (!arr[i]) {
      wire_tensors_free(arr, (size_t)n);
      return err ? err->code : TOPOS_ERR_ARGUMENT;
    }
  }
  *out = arr;
  *nout = (size_t)n;
  return TOPOS_OK;
}

void wire_tensors_free(Topos__V1__Tensor **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++)
    if (v[i]) protobuf_c_message_free_unpacked(&v[i]->base, NULL);
  free(v);
}

int wire_tensor_array_from_proto(Topos__V1__Tensor *const *v, size_t n,
                                 const wire_blobs *blobs, const char *what,
                                 topos_tensor ***out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "tensors: out is NULL");
  *out = NULL;
  if (!what) what = "tensors";
  if (n > INT32_MAX)
    return fail(err, TOPOS_ERR_ARGUMENT, "%s: %zu tensors", what, n);
  if (n == 0) return TOPOS_OK;
  if (!v) return fail(err, TOPOS_ERR_ARGUMENT, "%s is NULL", what);
  topos_tensor **arr = (topos_tensor **)ptr_array(n);
  if (!arr) return fail(err, TOPOS_ERR_MEMORY, "%s: out of memory", what);
  for (size_t i = 0; i < n; i++) {
    char name[96];
    snprintf(name, sizeof name, "%s[%zu]", what, i);
    arr[i] = wire_tensor_from_proto(v[i], blobs, name, err);
    if (!arr[i]) {
      wire_tensor_array_free(arr, (int)n);
      return err ? err->code : TOPOS_ERR_ARGUMENT;
    }
  }
  *out = arr;
  return TOPOS_OK;
}

void wire_tensor_array_free(topos_tensor **v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) topos_tensor_release(v[i]);
  free(v);
}

int wire_params_from_proto(Topos__V1__Tensor *const *v, size_t n,
                           const wire_blobs *blobs, const char *what,
                           topos_params **out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "params: out is NULL");
  *out = NULL;
  if (!what) what = "parameters";
  topos_tensor **arr = NULL;
  int rc = wire_tensor_array_from_proto(v, n, blobs, what, &arr, err);
  if (rc != TOPOS_OK || n == 0) return rc;
  topos_error perr = {0};
  *out = topos_params_new((int)n, arr, &perr);
  wire_tensor_array_free(arr, (int)n);
  if (!*out) return fail(err, perr.code, "%s: %s", what, perr.message);
  return TOPOS_OK;
}

/* ------------------------------------------------------------ specs */

/* The proto Op enum is the engine's op list (ops.h) under the same names
 * and numbers, so an op converts by value in both directions.  Each entry
 * of the list must have its enumerator in proto/topos.proto with the same
 * number; an op missing from the proto, or numbered differently, fails
 * to compile here.  (The proto having an op the list lacks cannot be
 * seen at compile time: wire_spec_to_network refuses codes past
 * topos_op_count(), and tests/daemon/test_op_list.c compares the counts.) */
#define WIRE_OP_SAME(E, name, arity, family, reads, linear, rule, attrs) \
  _Static_assert((int)TOPOS__V1__OP__##E == (int)OP_##E,                 \
                 "proto Op " #E " is not op code OP_" #E " (engine/ops.h)");
TOPOS_OPS(WIRE_OP_SAME)
#undef WIRE_OP_SAME

/* Which attributes each op reads (its ATTR_* mask), by op code: a Node
 * carries those and no others, in both directions. */
static const unsigned op_attrs[OP_COUNT] = {
#define WIRE_OP_ATTRS(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = attrs,
    TOPOS_OPS(WIRE_OP_ATTRS)
#undef WIRE_OP_ATTRS
};

/* Fills one init'ed Node from node info. */
static int node_to_proto(const topos_node_info *ni, int index,
                         Topos__V1__Node *m, topos_error *err) {
  unsigned at = op_attrs[ni->op];
  m->op = (Topos__V1__Op)ni->op;
  if (ni->nin > 0) {
    m->operands = malloc(sizeof(int32_t) * (size_t)ni->nin);
    if (!m->operands) goto oom;
    memcpy(m->operands, ni->operands, sizeof(int32_t) * (size_t)ni->nin);
    m->n_operands = (size_t)ni->nin;
  }
  if (ni->name) {
    m->name = dup_string(ni->name);
    if (!m->name) goto oom;
  }
  if (at & ATTR_AXIS) m->axis = ni->axis;
  if (at & ATTR_START) m->start = ni->start;
  if (at & ATTR_LENGTH) m->length = ni->length;
  if (at & ATTR_BEFORE) m->before = ni->before;
  if (at & ATTR_AFTER) m->after = ni->after;
  if (at & ATTR_SIZE) m->size = ni->size;
  if (at & ATTR_STEP) m->step = ni->step;
  if (at & ATTR_DILATION) m->dilation = ni->dilation;
  if (at & ATTR_EXTENT) m->extent = ni->extent;
  if (at & ATTR_P) m->p = ni->p;
  if ((at & ATTR_PERM) && ni->nin == 1) {
    /* perm has the operand's rank, which equals the result's. */
    int rank = ni->rank;
    if (rank > 0) {
      m->perm = malloc(sizeof(int32_t) * (size_t)rank);
      if (!m->perm) goto oom;
      for (int i = 0; i < rank; i++) m->perm[i] = ni->perm[i];
      m->n_perm = (size_t)rank;
    }
  }
  if ((at & ATTR_TARGET) && ni->target_rank > 0) {
    m->shape = malloc(sizeof(int64_t) * (size_t)ni->target_rank);
    if (!m->shape) goto oom;
    memcpy(m->shape, ni->target, sizeof(int64_t) * (size_t)ni->target_rank);
    m->n_shape = (size_t)ni->target_rank;
  }
  if (at & ATTR_TENSOR) {
    m->tensor = wire_tensor_new_splat(ni->tensor, err);
    if (!m->tensor) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "spec: node %d (%s)", index, ni->op_name);
      return prefix_error(err, err ? err->code : TOPOS_ERR_MEMORY, prefix);
    }
  }
  return TOPOS_OK;
oom:
  return fail(err, TOPOS_ERR_MEMORY, "spec: node %d: out of memory", index);
}

int wire_spec_from_network(const topos_network *net, Topos__V1__Spec *out,
                           topos_error *err) {
  if (!net || !out)
    return fail(err, TOPOS_ERR_ARGUMENT, "spec: %s is NULL",
                net ? "out" : "network");
  topos_dtype dtype = topos_network_dtype(net);
  int n = topos_network_node_count(net);
  Topos__V1__Node **nodes = (Topos__V1__Node **)ptr_array((size_t)n);
  if (n && !nodes) return fail(err, TOPOS_ERR_MEMORY, "spec: out of memory");
  out->dtype = (Topos__V1__DType)dtype;
  out->nodes = nodes;
  out->n_nodes = 0;
  for (int i = 0; i < n; i++) {
    topos_node_info ni;
    int rc = topos_network_node(net, i, &ni, err);
    if (rc == TOPOS_OK) {
      nodes[i] = malloc(sizeof *nodes[i]);
      if (!nodes[i]) rc = fail(err, TOPOS_ERR_MEMORY, "spec: out of memory");
    }
    if (rc != TOPOS_OK) {
      wire_message_clear(&out->base);
      return rc;
    }
    topos__v1__node__init(nodes[i]);
    out->n_nodes = (size_t)i + 1;
    rc = node_to_proto(&ni, i, nodes[i], err);
    if (rc != TOPOS_OK) {
      wire_message_clear(&out->base);
      return rc;
    }
  }
  return TOPOS_OK;
}

/* Fails the replay with "spec: node i (op): ..." and frees the tape. */
static topos_network *spec_fail(topos_tape *tape, topos_error *err, int code,
                                int node, int op, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static topos_network *spec_fail(topos_tape *tape, topos_error *err, int code,
                                int node, int op, const char *fmt, ...) {
  char why[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  const ProtobufCEnumValue *ev =
      topos__v1__op__descriptor.n_values > 0 && op >= 0 &&
              op < (int)topos__v1__op__descriptor.n_values
          ? &topos__v1__op__descriptor.values[op]
          : NULL;
  if (node < 0)
    fail(err, code, "spec: %s", why);
  else if (ev)
    fail(err, code, "spec: node %d (%s): %s", node, ev->name, why);
  else
    fail(err, code, "spec: node %d: %s", node, why);
  topos_tape_free(tape);
  return NULL;
}

topos_network *wire_spec_to_network(const Topos__V1__Spec *spec,
                                    topos_error *err) {
  if (!spec) return spec_fail(NULL, err, TOPOS_ERR_ARGUMENT, -1, -1, "NULL");
  int d = (int)spec->dtype;
  if (d != TOPOS__V1__DTYPE__F32 && d != TOPOS__V1__DTYPE__F64 &&
      d != TOPOS__V1__DTYPE__BF16)
    return spec_fail(NULL, err, TOPOS_ERR_DTYPE, -1, -1,
                     "the tape dtype %d is not F32 (0), F64 (1) or BF16 (2)",
                     d);
  if (spec->n_nodes > (size_t)INT32_MAX - 2)
    return spec_fail(NULL, err, TOPOS_ERR_ARGUMENT, -1, -1, "%zu nodes",
                     spec->n_nodes);
  /* An empty message parses as a spec with no nodes; recording one is
   * always a mistake (an empty file, the wrong message), so say so. */
  if (spec->n_nodes == 0)
    return spec_fail(NULL, err, TOPOS_ERR_ARGUMENT, -1, -1,
                     "the spec has no nodes");
  if (!spec->nodes)
    return spec_fail(NULL, err, TOPOS_ERR_ARGUMENT, -1, -1, "nodes is NULL");
  topos_tape *tape = topos_tape_new((topos_dtype)d);
  if (!tape)
    return spec_fail(NULL, err, TOPOS_ERR_MEMORY, -1, -1,
                     "out of memory for the tape");
  int n = (int)spec->n_nodes;
  /* values[i] is node i's value on this tape, so an operand index is
   * turned into a value only after it is checked to be earlier. */
  topos_value *values = n ? malloc(sizeof(topos_value) * (size_t)n) : NULL;
  if (n && !values)
    return spec_fail(tape, err, TOPOS_ERR_MEMORY, -1, -1, "out of memory");
  topos_value stack_in[4];
  for (int i = 0; i < n; i++) {
    const Topos__V1__Node *m = spec->nodes[i];
    if (!m) {
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, -1, "missing");
    }
    int op = (int)m->op;
    if (op < 0 || op >= topos_op_count()) {
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, -1,
                       "unknown op %d (valid: 0..%d)", op,
                       topos_op_count() - 1);
    }
    if (m->n_operands > 4096 || (m->n_operands && !m->operands)) {
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, op, "%zu operands",
                       m->n_operands);
    }
    int nin = (int)m->n_operands;
    topos_value *in =
        nin <= 4 ? stack_in : malloc(sizeof(topos_value) * (size_t)nin);
    if (!in) {
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_MEMORY, i, op, "out of memory");
    }
    for (int j = 0; j < nin; j++) {
      int32_t k = m->operands[j];
      if (k < 0 || k >= i) {
        if (in != stack_in) free(in);
        free(values);
        return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, op,
                         "operand %d is node %d, not an earlier node "
                         "(0..%d)",
                         j, (int)k, i - 1);
      }
      in[j] = values[k];
    }
    unsigned at = op_attrs[op];
    topos_node_info info;
    memset(&info, 0, sizeof info);
    int perm[TOPOS_MAX_RANK] = {0};
    topos_tensor *tensor = NULL;
    const char *bad = NULL;
    char why[300] = "";
    if (at & ATTR_AXIS) info.axis = m->axis;
    if (at & ATTR_START) info.start = m->start;
    if (at & ATTR_LENGTH) info.length = m->length;
    if (at & ATTR_BEFORE) info.before = m->before;
    if (at & ATTR_AFTER) info.after = m->after;
    if (at & ATTR_SIZE) info.size = m->size;
    if (at & ATTR_STEP) info.step = m->step;
    if (at & ATTR_DILATION) info.dilation = m->dilation;
    if (at & ATTR_EXTENT) info.extent = m->extent;
    if (at & ATTR_P) info.p = m->p;
    if (at & ATTR_PERM) {
      int rank = 0;
      if (nin == 1) topos_value_shape(tape, in[0], &rank);
      if (nin == 1 && m->n_perm != (size_t)rank) {
        snprintf(why, sizeof why,
                 "perm has %zu entries; the operand has rank %d", m->n_perm,
                 rank);
        bad = why;
      } else {
        for (size_t j = 0; j < m->n_perm && j < TOPOS_MAX_RANK; j++)
          perm[j] = m->perm[j];
        info.perm = perm;
      }
    }
    if (!bad && (at & ATTR_TARGET)) {
      if (m->n_shape > TOPOS_MAX_RANK || (m->n_shape && !m->shape)) {
        snprintf(why, sizeof why,
                 "target shape has %zu extents; the limit "
                 "is %d",
                 m->n_shape, TOPOS_MAX_RANK);
        bad = why;
      } else {
        info.target_rank = (int)m->n_shape;
        info.target = m->shape;
      }
    }
    if (!bad && (at & ATTR_TENSOR)) {
      if (!m->tensor) {
        bad = "a leaf needs a tensor";
      } else {
        topos_error terr = {0};
        tensor = wire_tensor_from_proto(m->tensor, NULL, "tensor", &terr);
        if (!tensor) {
          if (in != stack_in) free(in);
          free(values);
          return spec_fail(tape, err, terr.code, i, op, "%s", terr.message);
        }
        info.tensor = tensor;
      }
    }
    if (bad) {
      if (in != stack_in) free(in);
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, op, "%s", bad);
    }
    topos_value v = topos_record(tape, op, in, nin, &info);
    topos_tensor_release(tensor);
    if (in != stack_in) free(in);
    if (topos_value_ok(v) && v.index != i) {
      free(values);
      return spec_fail(tape, err, TOPOS_ERR_ARGUMENT, i, op,
                       "replayed as node %d", v.index);
    }
    if (topos_value_ok(v) && m->name && m->name[0])
      v = topos_name(tape, v, m->name);
    if (!topos_value_ok(v)) {
      /* The tape's message already names the op and the node. */
      topos_error serr = {0};
      topos_network *none = topos_tape_seal(tape, &serr);
      topos_network_release(none);
      free(values);
      fail(err, serr.code ? serr.code : TOPOS_ERR_ARGUMENT, "spec: %s",
           serr.message);
      return NULL;
    }
    values[i] = v;
  }
  free(values);
  topos_error serr = {0};
  topos_network *net = topos_tape_seal(tape, &serr);
  if (!net)
    fail(err, serr.code ? serr.code : TOPOS_ERR_ARGUMENT, "spec: %s",
         serr.message);
  return net;
}

/* ------------------------------------------------------------ values */

int wire_value_resolve(const topos_network *net, const Topos__V1__Value *m,
                       const char *what, topos_value *out, topos_error *err) {
  if (!what) what = "value";
  if (!net || !out)
    return fail(err, TOPOS_ERR_ARGUMENT, "%s: %s is NULL", what,
                net ? "out" : "network");
  *out = TOPOS_NONE;
  if (!m || m->ref_case == TOPOS__V1__VALUE__REF__NOT_SET)
    return fail(err, TOPOS_ERR_ARGUMENT, "%s is missing (an index or a name)",
                what);
  int n = topos_network_node_count(net);
  if (m->ref_case == TOPOS__V1__VALUE__REF_INDEX) {
    if (m->index < 0 || m->index >= n)
      return fail(err, TOPOS_ERR_RANGE,
                  "%s: node %d is outside the spec's %d nodes", what,
                  (int)m->index, n);
    /* A network's values carry its tape id; parameter 0 or input 0, when
     * there is one, gives it without reaching into the network. */
    topos_value probe = topos_network_parameter(net, 0);
    if (!topos_value_ok(probe)) probe = topos_network_input(net, 0);
    if (!topos_value_ok(probe))
      return fail(err, TOPOS_ERR_STATE,
                  "%s: this spec has no parameter or input, so its nodes can "
                  "only be named, not indexed",
                  what);
    *out = (topos_value){probe.tape, m->index};
    return TOPOS_OK;
  }
  if (m->ref_case == TOPOS__V1__VALUE__REF_NAME) {
    topos_value v = topos_network_find(net, m->name);
    if (!topos_value_ok(v))
      return fail(err, TOPOS_ERR_ARGUMENT, "%s: no node is named \"%.200s\"",
                  what, m->name ? m->name : "");
    *out = v;
    return TOPOS_OK;
  }
  return fail(err, TOPOS_ERR_ARGUMENT, "%s: unknown reference kind %d", what,
              (int)m->ref_case);
}

Topos__V1__Value *wire_value_new_index(int32_t index) {
  Topos__V1__Value *m = malloc(sizeof *m);
  if (!m) return NULL;
  topos__v1__value__init(m);
  m->ref_case = TOPOS__V1__VALUE__REF_INDEX;
  m->index = index;
  return m;
}

Topos__V1__Value *wire_value_new_name(const char *name) {
  if (!name) return NULL;
  Topos__V1__Value *m = malloc(sizeof *m);
  char *copy = dup_string(name);
  if (!m || !copy) {
    free(m);
    free(copy);
    return NULL;
  }
  topos__v1__value__init(m);
  m->ref_case = TOPOS__V1__VALUE__REF_NAME;
  m->name = copy;
  return m;
}

/* ------------------------------------------------------------ entries */

int wire_entry_from_proto(const topos_network *net, const Topos__V1__Entry *m,
                          wire_entry *out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "entry: out is NULL");
  memset(out, 0, sizeof *out);
  if (!m) return fail(err, TOPOS_ERR_ARGUMENT, "entry is missing");
  if (m->n_roots > 65536 || m->n_observes > 65536)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: %zu roots and %zu observes; the limit is 65536 each",
                m->n_roots, m->n_observes);
  if ((m->n_roots && !m->roots) || (m->n_observes && !m->observes))
    return fail(err, TOPOS_ERR_ARGUMENT, "entry: NULL value lists");
  if (m->posture != TOPOS__V1__POSTURE__FORWARD &&
      m->posture != TOPOS__V1__POSTURE__TRAINING)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: unknown posture %d (FORWARD 0, TRAINING 1)",
                (int)m->posture);
  if (m->numerics != TOPOS__V1__NUMERICS__EXACT &&
      m->numerics != TOPOS__V1__NUMERICS__FAST)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: unknown numerics %d (EXACT 0, FAST 1)",
                (int)m->numerics);
  if (m->threads > TOPOS_THREADS_MAX)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: threads %u is out of range (0 = the daemon's default, "
                "else 1..%d)",
                (unsigned)m->threads, TOPOS_THREADS_MAX);
  const char *backend = m->backend ? m->backend : "";
  if (strlen(backend) >= sizeof out->backend)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: the backend hint has %zu bytes; the limit is %zu",
                strlen(backend), sizeof out->backend - 1);
  size_t total = m->n_roots + m->n_observes;
  topos_value *values = total ? malloc(sizeof(topos_value) * total) : NULL;
  if (total && !values)
    return fail(err, TOPOS_ERR_MEMORY, "entry: out of memory");
  for (size_t i = 0; i < total; i++) {
    bool root = i < m->n_roots;
    size_t j = root ? i : i - m->n_roots;
    char what[64];
    snprintf(what, sizeof what, "entry.%s[%zu]", root ? "roots" : "observes",
             j);
    int rc = wire_value_resolve(net, root ? m->roots[j] : m->observes[j], what,
                                &values[i], err);
    if (rc != TOPOS_OK) {
      free(values);
      return rc;
    }
  }
  out->values = values;
  out->entry.roots = values;
  out->entry.nroots = (int)m->n_roots;
  out->entry.observes = values ? values + m->n_roots : NULL;
  out->entry.nobserves = (int)m->n_observes;
  out->entry.posture = (topos_posture)m->posture;
  out->entry.numerics = (topos_numerics)m->numerics;
  out->entry.threads = (int)m->threads;
  snprintf(out->backend, sizeof out->backend, "%s", backend);
  return TOPOS_OK;
}

void wire_entry_clear(wire_entry *e) {
  if (!e) return;
  free(e->values);
  memset(e, 0, sizeof *e);
}

char *wire_entry_key(const topos_entry *e) {
  if (!e) return NULL;
  int n =
      (e->nroots > 0 ? e->nroots : 0) + (e->nobserves > 0 ? e->nobserves : 0);
  size_t cap = 64 + 12 * (size_t)n;
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t used = (size_t)snprintf(s, cap, "r");
  for (int i = 0; i < e->nroots; i++)
    used += (size_t)snprintf(s + used, cap - used, "%s%d", i ? "," : "",
                             (int)e->roots[i].index);
  used += (size_t)snprintf(s + used, cap - used, ";o");
  for (int i = 0; i < e->nobserves; i++)
    used += (size_t)snprintf(s + used, cap - used, "%s%d", i ? "," : "",
                             (int)e->observes[i].index);
  used += (size_t)snprintf(s + used, cap - used, ";p%d;n%d", (int)e->posture,
                           (int)e->numerics);
  /* Plans remember their threads; 0 keeps the key it always had. */
  if (e->threads) snprintf(s + used, cap - used, ";t%d", e->threads);
  return s;
}

/* n values -> a new array of heap Values (indices). */
static int values_to_proto(const topos_value *v, int n, const char *what,
                           Topos__V1__Value ***out, size_t *nout,
                           topos_error *err) {
  *out = NULL;
  *nout = 0;
  if (n < 0 || (n && !v))
    return fail(err, TOPOS_ERR_ARGUMENT, "entry: bad %s", what);
  Topos__V1__Value **arr = (Topos__V1__Value **)ptr_array((size_t)n);
  if (n && !arr) return fail(err, TOPOS_ERR_MEMORY, "entry: out of memory");
  for (int i = 0; i < n; i++) {
    if (v[i].index < 0) {
      for (int j = 0; j < i; j++) wire_message_free(&arr[j]->base);
      free(arr);
      return fail(err, TOPOS_ERR_ARGUMENT, "entry: %s[%d] is not a value", what,
                  i);
    }
    arr[i] = wire_value_new_index(v[i].index);
    if (!arr[i]) {
      for (int j = 0; j < i; j++) wire_message_free(&arr[j]->base);
      free(arr);
      return fail(err, TOPOS_ERR_MEMORY, "entry: out of memory");
    }
  }
  *out = arr;
  *nout = (size_t)n;
  return TOPOS_OK;
}

int wire_entry_to_proto(const topos_entry *e, const char *backend,
                        Topos__V1__Entry *out, topos_error *err) {
  if (!e || !out)
    return fail(err, TOPOS_ERR_ARGUMENT, "entry: %s is NULL",
                e ? "out" : "entry");
  /* Negative threads cannot be sent; the daemon judges the upper bound. */
  if (e->threads < 0)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "entry: threads %d is negative (0 = the daemon's default)",
                e->threads);
  int rc = values_to_proto(e->roots, e->nroots, "roots", &out->roots,
                           &out->n_roots, err);
  if (rc == TOPOS_OK)
    rc = values_to_proto(e->observes, e->nobserves, "observes", &out->observes,
                         &out->n_observes, err);
  if (rc == TOPOS_OK && backend && backend[0]) {
    out->backend = dup_string(backend);
    if (!out->backend) rc = fail(err, TOPOS_ERR_MEMORY, "entry: out of memory");
  }
  if (rc != TOPOS_OK) {
    wire_message_clear(&out->base);
    return rc;
  }
  out->posture = (Topos__V1__Posture)e->posture;
  out->numerics = (Topos__V1__Numerics)e->numerics;
  out->threads = (uint32_t)e->threads;
  return TOPOS_OK;
}

Topos__V1__Entry *wire_entry_new(const topos_entry *e, const char *backend,
                                 topos_error *err) {
  Topos__V1__Entry *m = malloc(sizeof *m);
  if (!m) {
    fail(err, TOPOS_ERR_MEMORY, "entry: out of memory");
    return NULL;
  }
  topos__v1__entry__init(m);
  if (wire_entry_to_proto(e, backend, m, err) != TOPOS_OK) {
    free(m);
    return NULL;
  }
  return m;
}

/* ------------------------------------------------------------ feeds */

int wire_feeds_from_proto(const topos_network *net, Topos__V1__Feed *const *v,
                          size_t n, const wire_blobs *blobs, topos_feed **out,
                          topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "feeds: out is NULL");
  *out = NULL;
  if (n == 0) return TOPOS_OK;
  if (!v) return fail(err, TOPOS_ERR_ARGUMENT, "feeds is NULL");
  if (n > 65536)
    return fail(err, TOPOS_ERR_ARGUMENT, "%zu feeds; the limit is 65536", n);
  topos_feed *feeds = calloc(n, sizeof *feeds);
  if (!feeds) return fail(err, TOPOS_ERR_MEMORY, "feeds: out of memory");
  for (size_t i = 0; i < n; i++) {
    char what[64];
    if (!v[i]) {
      wire_feeds_free(feeds, (int)n);
      return fail(err, TOPOS_ERR_ARGUMENT, "feeds[%zu] is missing", i);
    }
    snprintf(what, sizeof what, "feeds[%zu].input", i);
    int rc = wire_value_resolve(net, v[i]->input, what, &feeds[i].input, err);
    if (rc == TOPOS_OK) {
      topos_node_info ni;
      rc = topos_network_node(net, feeds[i].input.index, &ni, err);
      if (rc == TOPOS_OK && ni.op != TOPOS__V1__OP__INPUT)
        rc = fail(err, TOPOS_ERR_ARGUMENT, "%s: node %d (%s) is not an input",
                  what, (int)feeds[i].input.index, ni.op_name);
    }
    if (rc != TOPOS_OK) {
      wire_feeds_free(feeds, (int)n);
      return rc;
    }
    snprintf(what, sizeof what, "feeds[%zu].tensor", i);
    feeds[i].tensor = wire_tensor_from_proto(v[i]->tensor, blobs, what, err);
    if (!feeds[i].tensor) {
      wire_feeds_free(feeds, (int)n);
      return err ? err->code : TOPOS_ERR_ARGUMENT;
    }
  }
  *out = feeds;
  return TOPOS_OK;
}

void wire_feeds_free(topos_feed *feeds, int n) {
  if (!feeds) return;
  for (int i = 0; i < n; i++)
    topos_tensor_release((topos_tensor *)feeds[i].tensor);
  free(feeds);
}

int wire_feeds_to_proto(const topos_feed *feeds, int n, Topos__V1__Feed ***out,
                        size_t *nout, topos_error *err) {
  if (!out || !nout || n < 0 || (n && !feeds))
    return fail(err, TOPOS_ERR_ARGUMENT, "feeds: bad arguments");
  *out = NULL;
  *nout = 0;
  Topos__V1__Feed **arr = (Topos__V1__Feed **)ptr_array((size_t)n);
  if (n && !arr) return fail(err, TOPOS_ERR_MEMORY, "feeds: out of memory");
  for (int i = 0; i < n; i++) {
    if (feeds[i].input.index < 0 || !feeds[i].tensor) {
      wire_feeds_free_proto(arr, (size_t)n);
      return fail(
          err, TOPOS_ERR_ARGUMENT, "feeds[%d]: %s", i,
          feeds[i].tensor ? "the input is not a value" : "the tensor is NULL");
    }
    arr[i] = malloc(sizeof *arr[i]);
    if (arr[i]) {
      topos__v1__feed__init(arr[i]);
      arr[i]->input = wire_value_new_index(feeds[i].input.index);
    }
    if (!arr[i] || !arr[i]->input) {
      wire_feeds_free_proto(arr, (size_t)n);
      return fail(err, TOPOS_ERR_MEMORY, "feeds: out of memory");
    }
    arr[i]->tensor = wire_tensor_new(feeds[i].tensor, err);
    if (!arr[i]->tensor) {
      wire_feeds_free_proto(arr, (size_t)n);
      return err ? err->code : TOPOS_ERR_MEMORY;
    }
  }
  *out = arr;
  *nout = (size_t)n;
  return TOPOS_OK;
}

void wire_feeds_free_proto(Topos__V1__Feed **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++)
    if (v[i]) protobuf_c_message_free_unpacked(&v[i]->base, NULL);
  free(v);
}

/* ------------------------------------------------------------ optimizers */

static bool decay_all(int slot, const topos_tensor *param, void *ctx) {
  return true;
}

static bool decay_listed(int slot, const topos_tensor *param, void *ctx) {
  const wire_optimizer *o = ctx;
  for (size_t i = 0; i < o->nslots; i++)
    if (o->slots[i] == slot) return true;
  return false;
}

/* The numbers of an Optimizer message with their presence (each sits
 * alone in a oneof: proto3 `optional` on the wire). */
enum { NUM_LR, NUM_MOMENTUM, NUM_BETA1, NUM_BETA2, NUM_EPS, NUM_WD, NUMS };

static const char *const num_names[NUMS] = {
    "lr", "momentum", "beta1", "beta2", "eps", "weight_decay"};

static void numbers_of(const Topos__V1__Optimizer *m, bool given[NUMS],
                       double value[NUMS]) {
  given[NUM_LR] = m->lr_given_case == TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  given[NUM_MOMENTUM] =
      m->momentum_given_case == TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
  given[NUM_BETA1] =
      m->beta1_given_case == TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
  given[NUM_BETA2] =
      m->beta2_given_case == TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
  given[NUM_EPS] = m->eps_given_case == TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
  given[NUM_WD] = m->weight_decay_given_case ==
                  TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
  value[NUM_LR] = m->lr;
  value[NUM_MOMENTUM] = m->momentum;
  value[NUM_BETA1] = m->beta1;
  value[NUM_BETA2] = m->beta2;
  value[NUM_EPS] = m->eps;
  value[NUM_WD] = m->weight_decay;
}

/* Which numbers a kind reads, and the defaults of those not given (lr has
 * none): PyTorch's, so a settings file means the same in both. */
static bool kind_reads(topos_optimizer_kind kind, int num) {
  switch (num) {
    case NUM_LR:
    case NUM_WD:
      return true;
    case NUM_MOMENTUM:
      return kind == TOPOS_SGD;
    default:
      return kind != TOPOS_SGD;
  }
}

static double num_default(topos_optimizer_kind kind, int num) {
  if (!kind_reads(kind, num)) return 0.0; /* the engine wants it 0 */
  switch (num) {
    case NUM_BETA1:
      return 0.9;
    case NUM_BETA2:
      return 0.999;
    case NUM_EPS:
      return 1e-8;
    case NUM_WD:
      return kind == TOPOS_ADAMW ? 0.01 : 0.0;
    default:
      return 0.0;
  }
}

int wire_optimizer_from_proto(const Topos__V1__Optimizer *m, int nslots,
                              wire_optimizer *out, topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "optimizer: out is NULL");
  memset(out, 0, sizeof *out);
  if (!m) return fail(err, TOPOS_ERR_ARGUMENT, "optimizer is missing");
  topos_optimizer_kind kind;
  const char *kname;
  switch ((int)m->kind) {
    case TOPOS__V1__OPTIMIZER_KIND__SGD:
      kind = TOPOS_SGD, kname = "SGD";
      break;
    case TOPOS__V1__OPTIMIZER_KIND__ADAM:
      kind = TOPOS_ADAM, kname = "ADAM";
      break;
    case TOPOS__V1__OPTIMIZER_KIND__ADAMW:
      kind = TOPOS_ADAMW, kname = "ADAMW";
      break;
    default:
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "optimizer: unknown kind %d (SGD 0, ADAM 1, ADAMW 2)",
                  (int)m->kind);
  }
  bool given[NUMS];
  double value[NUMS];
  numbers_of(m, given, value);
  if (!given[NUM_LR])
    return fail(err, TOPOS_ERR_ARGUMENT,
                "optimizer.lr is missing (the learning rate has no default)");
  for (int i = 0; i < NUMS; i++) {
    if (given[i] && !kind_reads(kind, i))
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "optimizer.%s is given, but %s does not read it (%s)",
                  num_names[i], kname,
                  i == NUM_MOMENTUM ? "momentum is SGD's"
                                    : "beta1, beta2 and eps are ADAM's and "
                                      "ADAMW's");
    if (!given[i]) value[i] = num_default(kind, i);
  }
  int rule = (int)m->decay;
  if (rule != TOPOS__V1__DECAY_RULE__RANK_AT_LEAST_2 &&
      rule != TOPOS__V1__DECAY_RULE__ALL_SLOTS &&
      rule != TOPOS__V1__DECAY_RULE__LISTED_SLOTS)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "optimizer.decay: unknown decay rule %d (RANK_AT_LEAST_2 0, "
                "ALL_SLOTS 1, LISTED_SLOTS 2)",
                rule);
  if (kind != TOPOS_ADAMW &&
      (rule != TOPOS__V1__DECAY_RULE__RANK_AT_LEAST_2 || m->n_decay_slots))
    return fail(err, TOPOS_ERR_ARGUMENT,
                "optimizer.decay%s is given, but %s does not read it (the "
                "decay rule is ADAMW's; SGD and ADAM apply weight_decay to "
                "every slot)",
                rule != TOPOS__V1__DECAY_RULE__RANK_AT_LEAST_2 ? "" : "_slots",
                kname);
  if (rule != TOPOS__V1__DECAY_RULE__LISTED_SLOTS && m->n_decay_slots)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "optimizer.decay_slots given without the LISTED_SLOTS rule");
  if (m->n_decay_slots > 1u << 20)
    return fail(err, TOPOS_ERR_ARGUMENT,
                "optimizer.decay_slots: %zu slots (at most 2^20)",
                m->n_decay_slots);
  int *slots = NULL;
  if (m->n_decay_slots) {
    if (!m->decay_slots)
      return fail(err, TOPOS_ERR_ARGUMENT, "optimizer.decay_slots is NULL");
    slots = malloc(sizeof(int) * m->n_decay_slots);
    if (!slots) return fail(err, TOPOS_ERR_MEMORY, "optimizer: out of memory");
    for (size_t i = 0; i < m->n_decay_slots; i++) {
      int32_t s = m->decay_slots[i];
      int rc = TOPOS_OK;
      if (s < 0)
        rc = fail(err, TOPOS_ERR_ARGUMENT,
                  "optimizer.decay_slots[%zu] = %d is negative", i, (int)s);
      else if (nslots >= 0 && s >= nslots)
        rc = fail(err, TOPOS_ERR_ARGUMENT,
                  "optimizer.decay_slots[%zu] = %d is not a parameter slot "
                  "(the spec has %d: 0..%d)",
                  i, (int)s, nslots, nslots - 1);
      for (size_t j = 0; rc == TOPOS_OK && j < i; j++)
        if (slots[j] == s)
          rc = fail(err, TOPOS_ERR_ARGUMENT,
                    "optimizer.decay_slots[%zu] = %d repeats "
                    "decay_slots[%zu]",
                    i, (int)s, j);
      if (rc != TOPOS_OK) {
        free(slots);
        return rc;
      }
      slots[i] = s;
    }
  }
  out->opt = (topos_optimizer){
      .kind = kind,
      .lr = value[NUM_LR],
      .momentum = value[NUM_MOMENTUM],
      .beta1 = value[NUM_BETA1],
      .beta2 = value[NUM_BETA2],
      .eps = value[NUM_EPS],
      .weight_decay = value[NUM_WD],
  };
  out->rule = rule;
  out->slots = slots;
  out->nslots = m->n_decay_slots;
  if (rule == TOPOS__V1__DECAY_RULE__ALL_SLOTS) {
    out->opt.decay = decay_all;
  } else if (rule == TOPOS__V1__DECAY_RULE__LISTED_SLOTS) {
    out->opt.decay = decay_listed;
    out->opt.decay_ctx = out;
  }
  return TOPOS_OK;
}

void wire_optimizer_clear(wire_optimizer *o) {
  if (!o) return;
  free(o->slots);
  memset(o, 0, sizeof *o);
}

int wire_optimizer_to_proto(const topos_optimizer *opt,
                            const topos_params *params,
                            Topos__V1__Optimizer *out, topos_error *err) {
  if (!opt || !out)
    return fail(err, TOPOS_ERR_ARGUMENT, "optimizer: %s is NULL",
                opt ? "out" : "optimizer");
  if ((int)opt->kind < TOPOS_SGD || (int)opt->kind > TOPOS_ADAMW)
    return fail(err, TOPOS_ERR_ARGUMENT, "optimizer: unknown kind %d",
                (int)opt->kind);
  out->kind = (Topos__V1__OptimizerKind)opt->kind;
  /* What the kind reads goes out given, so the wire defaults never stand
   * in for the engine's values; what it does not read goes out only when
   * it is set, to be refused as the engine refuses it. */
#define WIRE_SEND(num, field, CASE)                                        \
  if (kind_reads(opt->kind, num) || opt->field != 0) {                     \
    out->field##_given_case = TOPOS__V1__OPTIMIZER__##CASE##_GIVEN_##CASE; \
    out->field = opt->field;                                               \
  }
  WIRE_SEND(NUM_LR, lr, LR)
  WIRE_SEND(NUM_MOMENTUM, momentum, MOMENTUM)
  WIRE_SEND(NUM_BETA1, beta1, BETA1)
  WIRE_SEND(NUM_BETA2, beta2, BETA2)
  WIRE_SEND(NUM_EPS, eps, EPS)
  WIRE_SEND(NUM_WD, weight_decay, WEIGHT_DECAY)
#undef WIRE_SEND
  out->decay = TOPOS__V1__DECAY_RULE__RANK_AT_LEAST_2;
  if (opt->decay) {
    if (!params)
      return fail(err, TOPOS_ERR_ARGUMENT,
                  "optimizer: a decay predicate is sent as the slots it "
                  "selects, which needs the parameters");
    int n = topos_params_count(params);
    int32_t *slots = n ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    if (n && !slots)
      return fail(err, TOPOS_ERR_MEMORY, "optimizer: out of memory");
    size_t k = 0;
    for (int s = 0; s < n; s++)
      if (opt->decay(s, topos_params_get(params, s), opt->decay_ctx))
        slots[k++] = s;
    out->decay = TOPOS__V1__DECAY_RULE__LISTED_SLOTS;
    out->decay_slots = slots;
    out->n_decay_slots = k;
    if (k == 0) {
      free(slots);
      out->decay_slots = NULL;
    }
  }
  return TOPOS_OK;
}

/* ------------------------------------------------------------ state */

int wire_state_from_proto(const Topos__V1__OptimizerState *m,
                          const wire_blobs *blobs, topos_opt_state **out,
                          topos_error *err) {
  if (!out) return fail(err, TOPOS_ERR_ARGUMENT, "state: out is NULL");
  *out = NULL;
  if (!m) return TOPOS_OK;
  if (m->step < 0)
    return fail(err, TOPOS_ERR_ARGUMENT, "state: step %" PRId64 " is negative",
                m->step);
  topos_params *mm = NULL, *vv = NULL;
  int rc = wire_params_from_proto(m->m, m->n_m, blobs, "state.m", &mm, err);
  if (rc == TOPOS_OK)
    rc = wire_params_from_proto(m->v, m->n_v, blobs, "state.v", &vv, err);
  if (rc == TOPOS_OK) {
    topos_error serr = {0};
    *out = topos_opt_state_from(m->step, mm, vv, &serr);
    if (!*out) rc = fail(err, serr.code, "state: %s", serr.message);
  }
  topos_params_free(mm);
  topos_params_free(vv);
  return rc;
}

int wire_state_to_proto(const topos_opt_state *s,
                        Topos__V1__OptimizerState *out, topos_error *err) {
  if (!s || !out)
    return fail(err, TOPOS_ERR_ARGUMENT, "state: %s is NULL",
                s ? "out" : "state");
  out->step = topos_opt_state_step(s);
  int rc = wire_tensors_from_params(topos_opt_state_moment(s, 0), &out->m,
                                    &out->n_m, err);
  if (rc == TOPOS_OK)
    rc = wire_tensors_from_params(topos_opt_state_moment(s, 1), &out->v,
                                  &out->n_v, err);
  if (rc != TOPOS_OK) wire_message_clear(&out->base);
  return rc;
}

Topos__V1__OptimizerState *wire_state_new(const topos_opt_state *s,
                                          topos_error *err) {
  Topos__V1__OptimizerState *m = malloc(sizeof *m);
  if (!m) {
    fail(err, TOPOS_ERR_MEMORY, "state: out of memory");
    return NULL;
  }
  topos__v1__optimizer_state__init(m);
  if (wire_state_to_proto(s, m, err) != TOPOS_OK) {
    free(m);
    return NULL;
  }
  return m;
}
