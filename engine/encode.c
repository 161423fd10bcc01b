/*
 * encode.c - the canonical byte form of a sealed network and its id.
 *
 * The format is specified in docs/encoding.md: a fixed header, then every
 * node in index order with its op, dtype, shape, operands, the attributes
 * its op reads (one schema per op), the tensor of a leaf, and its name.
 * Every integer is little-endian with a fixed width, and nothing else is
 * written (no padding, no optional fields, no field an op does not read),
 * so equal networks give equal bytes and the id - the SHA-256 of the
 * bytes - names the network's content.
 *
 * Decoding never trusts the bytes.  Each length is checked against the
 * bytes that remain before anything is allocated for it, so an input of
 * L bytes allocates O(L) memory at most; every node is then replayed
 * through tape_record (and names through topos_name), exactly the checks a
 * recorded network passed, and the replayed node's dtype, shape and slot
 * must equal the stored ones.  A byte string that decodes therefore
 * re-encodes to itself.
 */
#include <assert.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "utf8.h"

/* "TPOS", then the format version this file writes and reads. */
static const uint8_t MAGIC[4] = {'T', 'P', 'O', 'S'};
#define FORMAT_VERSION 2
/* Version 1 (no splat form) is still read; its networks re-encode as 2. */
#define FORMAT_OLDEST 1
#define HEADER_BYTES 11 /* magic 4, version u16, tape dtype u8, count u32 */
/* A tensor's form (version 2). */
enum { TENSOR_ELEMENTS = 0, TENSOR_SPLAT = 1 };
/* op u8, dtype u8, rank u8, operand count u32, name length u8: no node
 * can take fewer bytes, which bounds the node count a header may claim. */
#define MIN_NODE_BYTES 8

/* ------------------------------------------------------------ the writer */

/* Writes into a buffer sized beforehand by a first pass with buf == NULL
 * (which only counts), so the two passes cannot disagree on a layout. */
typedef struct writer {
  uint8_t *buf;
  size_t pos;
} writer;

static void put_bytes(writer *w, const void *p, size_t n) {
  if (w->buf && n) memcpy(w->buf + w->pos, p, n);
  w->pos += n;
}

static void put_u8(writer *w, unsigned v) {
  uint8_t b = (uint8_t)v;
  put_bytes(w, &b, 1);
}

static void put_u16(writer *w, unsigned v) {
  uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  put_bytes(w, b, 2);
}

static void put_u32(writer *w, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  put_bytes(w, b, 4);
}

static void put_u64(writer *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  put_bytes(w, b, 8);
}

static void put_i64(writer *w, int64_t v) {
  put_u64(w, (uint64_t)v);
}

static void put_shape(writer *w, int rank, const int64_t *shape) {
  put_u8(w, (unsigned)rank);
  for (int i = 0; i < rank; i++) put_i64(w, shape[i]);
}

static bool host_is_little_endian(void) {
  const uint16_t one = 1;
  uint8_t first;
  memcpy(&first, &one, 1);
  return first == 1;
}

/* Reverses each es-byte element of a buffer of n elements in place. */
static void swap_elements(uint8_t *p, int64_t n, size_t es) {
  for (int64_t i = 0; i < n; i++, p += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      uint8_t t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
}

/* A leaf's tensor: dtype, shape, then its form: 1 and one element when it
 * has two or more elements that are all the same bits (a zero-initialised
 * parameter of any size is a few bytes), else 0 and its elements
 * row-major, whatever its layout (a view or a broadcast encodes as the
 * values it shows). */
static void put_tensor(writer *w, const topos_tensor *t) {
  put_u8(w, (unsigned)t->dtype);
  put_shape(w, t->rank, t->shape);
  int64_t n = shape_count(t->rank, t->shape);
  size_t es = topos_dtype_size(t->dtype);
  if (tensor_is_uniform(t)) {
    put_u8(w, TENSOR_SPLAT);
    if (w->buf) {
      memcpy(w->buf + w->pos, tensor_data(t), es);
      if (!host_is_little_endian()) swap_elements(w->buf + w->pos, 1, es);
    }
    w->pos += es;
    return;
  }
  put_u8(w, TENSOR_ELEMENTS);
  size_t bytes = n > 0 ? (size_t)n * es : 0;
  if (w->buf && bytes) {
    tensor_copy_out(t, w->buf + w->pos);
    if (!host_is_little_endian()) swap_elements(w->buf + w->pos, n, es);
  }
  w->pos += bytes;
}

/* The attributes n's op reads (its ATTR_* mask in TOPOS_OPS), in list
 * order, each in its one encoding (docs/encoding.md).  Axes are u8: a
 * sealed network's axes lie in 0..TOPOS_MAX_RANK. */
static void put_attrs(writer *w, const node *n) {
  const node_attrs *a = &n->at;
  unsigned mask = op_table[n->op].attrs;
  for (int bit = 0; bit < ATTR_BIT_COUNT; bit++) {
    if (!(mask & 1u << bit)) continue;
    switch ((attr_bit)bit) {
      case ATTR_BIT_SLOT:
        put_u32(w, (uint32_t)a->slot);
        break;
      case ATTR_BIT_TENSOR:
        put_tensor(w, a->tensor);
        break;
      case ATTR_BIT_P: {
        uint64_t bits = 0;
        memcpy(&bits, &a->p, sizeof bits);
        put_u64(w, bits);
        break;
      }
      case ATTR_BIT_PERM: /* the operand's rank, which is the node's */
        for (int i = 0; i < n->meta.rank; i++) put_u8(w, (unsigned)a->perm[i]);
        break;
      case ATTR_BIT_TARGET:
        put_shape(w, a->rank, a->shape);
        break;
      case ATTR_BIT_AXIS:
        put_u8(w, (unsigned)a->axis);
        break;
      case ATTR_BIT_START:
        put_i64(w, a->start);
        break;
      case ATTR_BIT_LENGTH:
        put_i64(w, a->length);
        break;
      case ATTR_BIT_BEFORE:
        put_i64(w, a->before);
        break;
      case ATTR_BIT_AFTER:
        put_i64(w, a->after);
        break;
      case ATTR_BIT_EXTENT:
        put_i64(w, a->extent);
        break;
      case ATTR_BIT_SIZE:
        put_i64(w, a->size);
        break;
      case ATTR_BIT_STEP:
        put_i64(w, a->step);
        break;
      case ATTR_BIT_DILATION:
        put_i64(w, a->dilation);
        break;
      case ATTR_BIT_COUNT:
        break;
    }
  }
}

static void put_network(writer *w, const topos_network *net) {
  put_bytes(w, MAGIC, sizeof MAGIC);
  put_u16(w, FORMAT_VERSION);
  put_u8(w, (unsigned)net->dtype);
  put_u32(w, (uint32_t)net->n);
  for (int i = 0; i < net->n; i++) {
    const node *n = &net->nodes[i];
    put_u8(w, (unsigned)n->op);
    put_u8(w, (unsigned)n->meta.dtype);
    put_shape(w, n->meta.rank, n->meta.shape);
    put_u32(w, (uint32_t)n->nin);
    for (int j = 0; j < n->nin; j++) put_u32(w, (uint32_t)n->in[j]);
    put_attrs(w, n);
    size_t len = n->name ? strlen(n->name) : 0;
    put_u8(w, (unsigned)len);
    put_bytes(w, n->name, len);
  }
}

int topos_network_encode(const topos_network *net, uint8_t **bytes, size_t *len,
                         topos_error *err) {
  if (bytes) *bytes = NULL;
  if (len) *len = 0;
  if (!net || !bytes || !len)
    return error_set(err, TOPOS_ERR_ARGUMENT, "encode: %s is NULL",
                     !net     ? "network"
                     : !bytes ? "bytes"
                              : "len");
  writer count = {NULL, 0};
  put_network(&count, net);
  uint8_t *buf = malloc(count.pos);
  if (!buf)
    return error_set(err, TOPOS_ERR_MEMORY,
                     "encode: out of memory for %zu bytes", count.pos);
  writer w = {buf, 0};
  put_network(&w, net);
  assert(w.pos == count.pos);
  *bytes = buf;
  *len = w.pos;
  return TOPOS_OK;
}

/* ------------------------------------------------------------- the id */

void topos_sha256_hex(const void *bytes, size_t len, char out[65]) {
  static const char hex[] = "0123456789abcdef";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (!out) return;
  out[0] = '\0';
  if (!bytes && len) return;
  if (!EVP_Digest(bytes ? bytes : "", len, md, &mdlen, EVP_sha256(), NULL) ||
      mdlen != 32)
    return;
  for (unsigned i = 0; i < 32; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[64] = '\0';
}

int topos_network_id(const topos_network *net, char out[65], topos_error *err) {
  if (out) out[0] = '\0';
  if (!net || !out)
    return error_set(err, TOPOS_ERR_ARGUMENT, "id: %s is NULL",
                     !net ? "network" : "out");
  uint8_t *bytes;
  size_t len;
  int rc = topos_network_encode(net, &bytes, &len, err);
  if (rc) return rc;
  topos_sha256_hex(bytes, len, out);
  free(bytes);
  if (out[0] == '\0')
    return error_set(err, TOPOS_ERR_MEMORY, "id: SHA-256 failed");
  return TOPOS_OK;
}

/* ------------------------------------------------------------ the reader */

typedef struct reader {
  const uint8_t *p;
  size_t left;      /* bytes not yet read */
  size_t offset;    /* of p from the start, for messages */
  int node;         /* the node being read, -1 in the header */
  unsigned version; /* the input's format version */
  topos_error *err;
} reader;

static int decode_fail(reader *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets "decode: node N: <why>" (or "decode: <why>" in the header). */
static int decode_fail(reader *r, int code, const char *fmt, ...) {
  char why[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (r->node >= 0)
    return error_set(r->err, code, "decode: node %d: %s", r->node, why);
  return error_set(r->err, code, "decode: %s", why);
}

/* Succeeds when n more bytes remain for `what`; else a truncation error. */
static bool need(reader *r, size_t n, const char *what) {
  if (n <= r->left) return true;
  decode_fail(r, TOPOS_ERR_CORRUPT,
              "truncated: %s needs %zu bytes at offset %zu, %zu remain", what,
              n, r->offset, r->left);
  return false;
}

static const uint8_t *take(reader *r, size_t n) {
  const uint8_t *p = r->p;
  r->p += n;
  r->left -= n;
  r->offset += n;
  return p;
}

static bool get_u8(reader *r, const char *what, unsigned *v) {
  if (!need(r, 1, what)) return false;
  *v = *take(r, 1);
  return true;
}

static bool get_u16(reader *r, const char *what, unsigned *v) {
  if (!need(r, 2, what)) return false;
  const uint8_t *p = take(r, 2);
  *v = (unsigned)p[0] | (unsigned)p[1] << 8;
  return true;
}

static bool get_u32(reader *r, const char *what, uint32_t *v) {
  if (!need(r, 4, what)) return false;
  const uint8_t *p = take(r, 4);
  *v = 0;
  for (int i = 3; i >= 0; i--) *v = *v << 8 | p[i];
  return true;
}

static bool get_u64(reader *r, const char *what, uint64_t *v) {
  if (!need(r, 8, what)) return false;
  const uint8_t *p = take(r, 8);
  *v = 0;
  for (int i = 7; i >= 0; i--) *v = *v << 8 | p[i];
  return true;
}

static bool get_i64(reader *r, const char *what, int64_t *v) {
  uint64_t u;
  if (!get_u64(r, what, &u)) return false;
  *v = (int64_t)u;
  return true;
}

static bool get_axis(reader *r, int *axis) {
  unsigned v = 0;
  if (!get_u8(r, "axis", &v)) return false;
  *axis = (int)v;
  return true;
}

/* rank u8 (<= TOPOS_MAX_RANK) and rank extents (each >= 0). */
static bool get_shape(reader *r, const char *what, int *rank, int64_t *shape) {
  unsigned v = 0;
  if (!get_u8(r, what, &v)) return false;
  if (v > TOPOS_MAX_RANK) {
    decode_fail(r, TOPOS_ERR_CORRUPT, "%s has rank %u; the limit is %d", what,
                v, TOPOS_MAX_RANK);
    return false;
  }
  *rank = (int)v;
  memset(shape, 0, sizeof(int64_t) * TOPOS_MAX_RANK);
  for (int i = 0; i < *rank; i++) {
    if (!get_i64(r, what, &shape[i])) return false;
    if (shape[i] < 0) {
      decode_fail(r, TOPOS_ERR_CORRUPT, "%s has a negative extent on axis %d",
                  what, i);
      return false;
    }
  }
  return true;
}

static bool get_dtype(reader *r, const char *what, topos_dtype *dtype) {
  unsigned v = 0;
  if (!get_u8(r, what, &v)) return false;
  if (!dtype_valid((topos_dtype)v)) {
    decode_fail(r, TOPOS_ERR_CORRUPT, "unknown %s %u", what, v);
    return false;
  }
  *dtype = (topos_dtype)v;
  return true;
}

/* A leaf's tensor.  Its byte size is checked against the bytes that remain
 * before the tensor is made, so no tensor outgrows the input. */
static topos_tensor *get_tensor(reader *r) {
  topos_dtype dtype = TOPOS_F32;
  int rank = 0;
  int64_t shape[TOPOS_MAX_RANK] = {0};
  if (!get_dtype(r, "tensor dtype", &dtype)) return NULL;
  if (!get_shape(r, "tensor shape", &rank, shape)) return NULL;
  int64_t count = shape_count(rank, shape);
  size_t es = topos_dtype_size(dtype);
  unsigned form = TENSOR_ELEMENTS;
  if (count >= 0 && r->version >= 2 && !get_u8(r, "tensor form", &form))
    return NULL;
  if (count < 0 ||
      (form == TENSOR_ELEMENTS && (uint64_t)count > r->left / es)) {
    char st[SHAPE_TEXT];
    shape_text(st, rank, shape);
    if (count < 0)
      decode_fail(r, TOPOS_ERR_CORRUPT,
                  "tensor %s%s at offset %zu has more elements than int64 "
                  "can count",
                  topos_dtype_name(dtype), st, r->offset);
    else
      decode_fail(r, TOPOS_ERR_CORRUPT,
                  "truncated: tensor %s%s needs %lld elements of %zu bytes "
                  "at offset %zu, %zu bytes remain",
                  topos_dtype_name(dtype), st, (long long)count, es, r->offset,
                  r->left);
    return NULL;
  }
  if (form != TENSOR_ELEMENTS && form != TENSOR_SPLAT) {
    decode_fail(r, TOPOS_ERR_CORRUPT, "unknown tensor form %u at offset %zu",
                form, r->offset - 1);
    return NULL;
  }
  if (form == TENSOR_SPLAT && count < 2) {
    decode_fail(r, TOPOS_ERR_CORRUPT,
                "a splat tensor of %lld elements (the form is for two or "
                "more)",
                (long long)count);
    return NULL;
  }
  size_t bytes = form == TENSOR_SPLAT ? es : (size_t)count * es;
  if (bytes > r->left) {
    decode_fail(r, TOPOS_ERR_CORRUPT,
                "truncated: a tensor element at offset %zu needs %zu bytes, "
                "%zu remain",
                r->offset, bytes, r->left);
    return NULL;
  }
  const uint8_t *data = take(r, bytes);
  uint8_t *swapped = NULL;
  if (!host_is_little_endian() && bytes) {
    swapped = malloc(bytes);
    if (!swapped) {
      decode_fail(r, TOPOS_ERR_MEMORY, "out of memory for a tensor");
      return NULL;
    }
    memcpy(swapped, data, bytes);
    swap_elements(swapped, form == TENSOR_SPLAT ? 1 : count, es);
    data = swapped;
  }
  topos_error terr = {0};
  topos_tensor *t;
  if (form == TENSOR_SPLAT) {
    /* One element, shown at every index: a broadcast view, so a splat of
     * any size costs one element of memory. */
    topos_tensor *one = topos_tensor_from(dtype, 0, NULL, data, &terr);
    t = one ? topos_tensor_broadcast(one, rank, shape, &terr) : NULL;
    /* A shape past the engine's tensor limit is the input's fault. */
    if (one && !t) terr.code = TOPOS_ERR_CORRUPT;
    topos_tensor_release(one);
  } else {
    t = topos_tensor_from(dtype, rank, shape, data, &terr);
  }
  free(swapped);
  if (!t) {
    decode_fail(
        r, terr.code == TOPOS_ERR_MEMORY ? TOPOS_ERR_MEMORY : TOPOS_ERR_CORRUPT,
        "%s", terr.message);
    return NULL;
  }
  /* Canonical: version 2 writes a uniform tensor only as a splat. */
  if (r->version >= 2 && form == TENSOR_ELEMENTS && tensor_is_uniform(t)) {
    topos_tensor_release(t);
    decode_fail(r, TOPOS_ERR_CORRUPT,
                "a tensor whose %lld elements are all equal must be written "
                "as a splat (not canonical)",
                (long long)count);
    return NULL;
  }
  return t;
}

/* The attributes of op (put_attrs' order), into at; a leaf's slot into
 * *slot (the replay assigns the node's own, which is then compared) and
 * its tensor (new) into at->tensor. */
static bool get_attrs(reader *r, op_code op, int rank, node_attrs *at,
                      int64_t *slot) {
  unsigned mask = op_table[op].attrs;
  for (int bit = 0; bit < ATTR_BIT_COUNT; bit++) {
    if (!(mask & 1u << bit)) continue;
    bool ok = true;
    switch ((attr_bit)bit) {
      case ATTR_BIT_SLOT: {
        uint32_t s = 0;
        ok = get_u32(r, "slot", &s);
        *slot = s;
        break;
      }
      case ATTR_BIT_TENSOR:
        at->tensor = get_tensor(r);
        ok = at->tensor != NULL;
        break;
      case ATTR_BIT_P: {
        uint64_t bits = 0;
        ok = get_u64(r, "exponent", &bits);
        memcpy(&at->p, &bits, sizeof at->p);
        break;
      }
      case ATTR_BIT_PERM:
        for (int i = 0; ok && i < rank; i++) {
          unsigned v = 0;
          ok = get_u8(r, "perm", &v);
          at->perm[i] = (int)v;
        }
        break;
      case ATTR_BIT_TARGET:
        ok = get_shape(r, "target shape", &at->rank, at->shape);
        break;
      case ATTR_BIT_AXIS:
        ok = get_axis(r, &at->axis);
        break;
      case ATTR_BIT_START:
        ok = get_i64(r, "start", &at->start);
        break;
      case ATTR_BIT_LENGTH:
        ok = get_i64(r, "length", &at->length);
        break;
      case ATTR_BIT_BEFORE:
        ok = get_i64(r, "before", &at->before);
        break;
      case ATTR_BIT_AFTER:
        ok = get_i64(r, "after", &at->after);
        break;
      case ATTR_BIT_EXTENT:
        ok = get_i64(r, "extent", &at->extent);
        break;
      case ATTR_BIT_SIZE:
        ok = get_i64(r, "size", &at->size);
        break;
      case ATTR_BIT_STEP:
        ok = get_i64(r, "step", &at->step);
        break;
      case ATTR_BIT_DILATION:
        ok = get_i64(r, "dilation", &at->dilation);
        break;
      case ATTR_BIT_COUNT:
        break;
    }
    if (!ok) return false;
  }
  return true;
}

/* Reads node i and replays it on the tape.  Returns false with r->err. */
static bool decode_node(reader *r, topos_tape *tape, int i) {
  unsigned op_byte = 0, nbytes = 0;
  topos_dtype dtype = TOPOS_F32;
  int rank = 0;
  int64_t shape[TOPOS_MAX_RANK] = {0};
  uint32_t nin = 0;
  r->node = i;
  if (!get_u8(r, "op", &op_byte)) return false;
  if (op_byte >= OP_COUNT)
    return decode_fail(r, TOPOS_ERR_CORRUPT, "unknown op %u", op_byte), false;
  op_code op = (op_code)op_byte;
  const char *opname = op_table[op].name;
  if (!get_dtype(r, "dtype", &dtype)) return false;
  if (!get_shape(r, "shape", &rank, shape)) return false;
  if (!get_u32(r, "operand count", &nin)) return false;
  int arity = op_table[op].arity;
  if (arity >= 0 ? nin != (uint32_t)arity : nin == 0)
    return decode_fail(r, TOPOS_ERR_CORRUPT,
                       "%s takes %s%d operand%s, the bytes give %u", opname,
                       arity >= 0 ? "" : "at least ", arity >= 0 ? arity : 1,
                       arity == 1 || arity < 0 ? "" : "s", nin),
           false;
  /* Each operand takes 4 bytes: checking them against what remains keeps
   * the operand array no larger than the input. */
  if (!need(r, (size_t)nin * 4, "operands")) return false;
  topos_value stack_in[4];
  topos_value *in =
      nin <= 4 ? stack_in : malloc(sizeof(topos_value) * (size_t)nin);
  if (!in)
    return decode_fail(r, TOPOS_ERR_MEMORY, "out of memory for %u operands",
                       nin),
           false;
  node_attrs at;
  memset(&at, 0, sizeof at);
  int64_t slot = -1;
  bool ok = true;
  for (uint32_t j = 0; j < nin && ok; j++) {
    uint32_t k = 0;
    get_u32(r, "operand", &k); /* cannot fail: need() above */
    if (k >= (uint32_t)i) {
      decode_fail(r, TOPOS_ERR_CORRUPT,
                  "operand %u refers to node %u, not an earlier node", j, k);
      ok = false;
    }
    in[j] = (topos_value){tape->id, (int32_t)k};
  }
  ok = ok && get_attrs(r, op, rank, &at, &slot);
  char name[256];
  ok = ok && get_u8(r, "name length", &nbytes);
  if (ok && nbytes) {
    ok = need(r, nbytes, "name");
    if (ok) {
      size_t at = 0;
      const char *why = NULL;
      memcpy(name, take(r, nbytes), nbytes);
      name[nbytes] = '\0';
      /* topos_name would refuse it too; saying so here names the byte
       * and keeps a NUL from shortening the name before it is seen. */
      if (!topos_utf8_check(name, nbytes, &at, &why)) {
        decode_fail(r, TOPOS_ERR_CORRUPT, "name of %u bytes: %s at byte %zu",
                    nbytes, why, at);
        ok = false;
      }
    }
  }
  topos_value v = TOPOS_NONE;
  if (ok) {
    v = tape_record(tape, op, in, (int)nin, &at);
    if (!topos_value_ok(v)) {
      /* The recording rules refuse what the bytes say, unless the tape
       * itself ran out of memory. */
      bool oom = tape->error_code == TOPOS_ERR_MEMORY &&
                 strstr(tape->error, "out of memory") != NULL;
      decode_fail(r, oom ? TOPOS_ERR_MEMORY : TOPOS_ERR_CORRUPT,
                  "replay failed: %s", topos_tape_error(tape));
      ok = false;
    }
  }
  topos_tensor_release(at.tensor);
  if (in != stack_in) free(in);
  if (!ok) return false;

  /* The stored facts must be what the replay inferred. */
  const node *n = &tape->nodes[v.index];
  if (n->meta.dtype != dtype ||
      !shape_equal(n->meta.rank, n->meta.shape, rank, shape)) {
    tensor_meta stored = {dtype, rank, {0}};
    memcpy(stored.shape, shape, sizeof shape);
    char a[SHAPE_TEXT + 8], b[SHAPE_TEXT + 8];
    return decode_fail(r, TOPOS_ERR_CORRUPT,
                       "%s is stored as %s but replays as %s", opname,
                       meta_text(a, &stored), meta_text(b, &n->meta)),
           false;
  }
  if (slot >= 0 && slot != n->at.slot)
    return decode_fail(r, TOPOS_ERR_CORRUPT,
                       "%s is stored with slot %lld but replays as slot %d",
                       opname, (long long)slot, n->at.slot),
           false;
  if (nbytes && !topos_value_ok(topos_name(tape, v, name)))
    return decode_fail(r, TOPOS_ERR_CORRUPT, "%s", topos_tape_error(tape)),
           false;
  return true;
}

topos_network *topos_network_decode(const uint8_t *bytes, size_t len,
                                    topos_error *err) {
  reader r = {bytes, len, 0, -1, 0, err};
  if (!bytes) {
    decode_fail(&r, TOPOS_ERR_ARGUMENT, "bytes is NULL");
    return NULL;
  }
  if (!need(&r, HEADER_BYTES, "the header")) return NULL;
  if (memcmp(take(&r, sizeof MAGIC), MAGIC, sizeof MAGIC) != 0) {
    decode_fail(&r, TOPOS_ERR_CORRUPT,
                "not a topos network (the magic is not \"TPOS\")");
    return NULL;
  }
  unsigned version = 0, dtype = 0;
  uint32_t count = 0;
  get_u16(&r, "version", &version);
  get_u8(&r, "tape dtype", &dtype);
  get_u32(&r, "node count", &count);
  if (version < FORMAT_OLDEST || version > FORMAT_VERSION) {
    decode_fail(&r, TOPOS_ERR_CORRUPT,
                "format version %u is not supported (this build reads %d..%d)",
                version, FORMAT_OLDEST, FORMAT_VERSION);
    return NULL;
  }
  r.version = version;
  if (!dtype_is_float((topos_dtype)dtype)) {
    decode_fail(&r, TOPOS_ERR_CORRUPT,
                "tape dtype %u is not f32 (0), f64 (1) or bf16 (2)", dtype);
    return NULL;
  }
  if (count > r.left / MIN_NODE_BYTES || count > INT32_MAX - 1) {
    decode_fail(&r, TOPOS_ERR_CORRUPT,
                "the header claims %u nodes but only %zu bytes follow (a node "
                "takes at least %d)",
                count, r.left, MIN_NODE_BYTES);
    return NULL;
  }
  topos_tape *tape = topos_tape_new((topos_dtype)dtype);
  if (!tape) {
    decode_fail(&r, TOPOS_ERR_MEMORY, "out of memory for the tape");
    return NULL;
  }
  for (uint32_t i = 0; i < count; i++) {
    if (!decode_node(&r, tape, (int)i)) {
      topos_tape_free(tape);
      return NULL;
    }
  }
  r.node = -1;
  if (r.left) {
    decode_fail(&r, TOPOS_ERR_CORRUPT,
                "%zu trailing bytes after the last node (offset %zu)", r.left,
                r.offset);
    topos_tape_free(tape);
    return NULL;
  }
  topos_error serr = {0};
  topos_network *net = topos_tape_seal(tape, &serr);
  if (!net) decode_fail(&r, serr.code, "%s", serr.message);
  return net;
}
