/*
 * tensor.c - tensors: immutable, reference-counted, strided views of a
 * shared, reference-counted buffer from the pool.
 *
 * Guarantees:
 *  - Every public entry point validates its arguments and reports a bad
 *    one through topos_error (never a crash, abort or print).  The codes:
 *    TOPOS_ERR_ARGUMENT for NULL pointers, ranks outside 0..8, bad perms,
 *    axes out of range and attributes that are invalid whatever the shape
 *    (size, step, dilation < 1, negative start/length); TOPOS_ERR_DTYPE
 *    for an unknown dtype; TOPOS_ERR_SHAPE for negative extents and
 *    shapes that do not fit an operation; TOPOS_ERR_RANGE for an element
 *    index outside the tensor; TOPOS_ERR_MEMORY when a size overflows,
 *    exceeds 2^40 bytes, or the allocator fails.
 *  - A tensor never changes after it is built; views (transpose, permute,
 *    narrow, broadcast, unfold) share the buffer, copy nothing, and keep it
 *    alive.  Strides are in elements; a broadcast axis has stride 0.
 *  - Reference counts are atomic, so tensors may be retained, read and
 *    released from any thread.  The last release of a buffer returns its
 *    memory to the pool for the next step to reuse.
 *  - "Contiguous" means row-major strides over every axis of extent > 1;
 *    the offset does not matter (tensor_data accounts for it).
 *  - bf16 is stored as uint16_t bits and rounded to nearest even; a NaN
 *    stays a quiet NaN with its sign, never becoming an infinity.
 */
#include <assert.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "transpose16.h"

/* The largest buffer one tensor may own: far beyond any real model, and
 * low enough that element offsets and byte sizes never overflow. */
#define TENSOR_MAX_BYTES ((int64_t)1 << 40)

/* ------------------------------------------------------------ dtypes */

bool dtype_valid(topos_dtype dtype) {
  return (unsigned)dtype <= (unsigned)TOPOS_I32;
}

bool dtype_is_float(topos_dtype dtype) {
  return dtype == TOPOS_F32 || dtype == TOPOS_F64 || dtype == TOPOS_BF16;
}

const char *topos_dtype_name(topos_dtype dtype) {
  switch (dtype) {
    case TOPOS_F32:
      return "f32";
    case TOPOS_F64:
      return "f64";
    case TOPOS_BF16:
      return "bf16";
    case TOPOS_I32:
      return "i32";
  }
  return "?";
}

size_t topos_dtype_size(topos_dtype dtype) {
  switch (dtype) {
    case TOPOS_F32:
      return 4;
    case TOPOS_F64:
      return 8;
    case TOPOS_BF16:
      return 2;
    case TOPOS_I32:
      return 4;
  }
  return 0;
}

/* -------------------------------------------------------------- bf16 */

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

static float f32_from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

uint16_t topos_bf16_from_f32(float value) {
  uint32_t bits = f32_bits(value);
  /* Rounding a NaN's bits could carry into the exponent and produce an
   * infinity, so NaNs truncate instead and set the quiet bit (bf16's
   * mantissa MSB) in case the surviving payload bits were all zero. */
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)((bits >> 16) | 0x0040u);
  /* Round to nearest, ties to even: add just under half an ulp, plus one
   * more when the kept part is odd.  A carry out of the mantissa bumps the
   * exponent, which is exactly right (and overflows to Inf at the top). */
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

float topos_bf16_to_f32(uint16_t bits) {
  return f32_from_bits((uint32_t)bits << 16);
}

/* A double rounded once to bf16.  Going through (float) first would round
 * twice, and a value just off a bf16 tie could land exactly on the tie.
 * So the float is made "round to odd": truncated toward zero with its
 * last bit set when inexact, which keeps the sticky information that the
 * final round to nearest even needs (f32 has more than 8 + 2 bits). */
uint16_t bf16_from_f64(double v) {
  float f = (float)v;
  if (isnan(v) || isinf(f) || (double)f == v) return topos_bf16_from_f32(f);
  uint32_t b = f32_bits(f);
  if (fabs((double)f) > fabs(v)) b -= 1; /* |f| > 0 here, no borrow */
  b |= 1u;
  return topos_bf16_from_f32(f32_from_bits(b));
}

void store_rounded(void *dst, topos_dtype dtype, int64_t i, double x) {
  switch (dtype) {
    case TOPOS_F64:
      ((double *)dst)[i] = x;
      break;
    case TOPOS_F32:
      ((float *)dst)[i] = (float)x;
      break;
    case TOPOS_BF16:
      ((uint16_t *)dst)[i] = bf16_from_f64(x);
      break;
    case TOPOS_I32:
      assert(!"store_rounded takes float dtypes");
      break;
  }
}

void bf16_round_array(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = topos_bf16_from_f32(src[i]);
}

/* ------------------------------------------------------------- shapes */

int64_t shape_count(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return -1;
    if (__builtin_mul_overflow(n, shape[i], &n)) return -1;
  }
  return n;
}

bool shape_equal(int ra, const int64_t *a, int rb, const int64_t *b) {
  if (ra != rb) return false;
  if (ra <= 0) return true;
  if (a == NULL || b == NULL) return a == b;
  for (int i = 0; i < ra; i++)
    if (a[i] != b[i]) return false;
  return true;
}

tensor_meta tensor_meta_of(const topos_tensor *t) {
  tensor_meta m;
  memset(&m, 0, sizeof m);
  if (t == NULL) return m;
  m.dtype = t->dtype;
  m.rank = t->rank;
  memcpy(m.shape, t->shape, sizeof(int64_t) * (size_t)t->rank);
  return m;
}

/* Checks dtype, rank and shape for a new tensor and returns its element
 * count, or -1 with err set.  `what` names the caller in the message. */
static int64_t check_new(const char *what, topos_dtype dtype, int rank,
                         const int64_t *shape, topos_error *err) {
  if (!dtype_valid(dtype)) {
    error_set(err, TOPOS_ERR_DTYPE, "%s: unknown dtype %d", what, (int)dtype);
    return -1;
  }
  if (rank < 0 || rank > TOPOS_MAX_RANK) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: rank %d is outside 0..%d", what,
              rank, TOPOS_MAX_RANK);
    return -1;
  }
  if (rank > 0 && shape == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: shape is NULL for rank %d", what,
              rank);
    return -1;
  }
  char text[SHAPE_TEXT];
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) {
      error_set(err, TOPOS_ERR_SHAPE,
                "%s: shape %s has a negative extent on axis %d", what,
                shape_text(text, rank, shape), i);
      return -1;
    }
  }
  int64_t count = shape_count(rank, shape);
  size_t es = topos_dtype_size(dtype);
  if (count < 0 || count > TENSOR_MAX_BYTES / (int64_t)es) {
    error_set(err, TOPOS_ERR_MEMORY,
              "%s: %s%s is larger than the 2^40-byte limit", what,
              topos_dtype_name(dtype), shape_text(text, rank, shape));
    return -1;
  }
  return count;
}

/* ------------------------------------------------- buffers and structs */

static tensor_buffer *buffer_new(size_t bytes) {
  tensor_buffer *b = malloc(sizeof *b);
  if (b == NULL) return NULL;
  b->data = pool_alloc(bytes, &b->capacity);
  if (b->data == NULL) {
    free(b);
    return NULL;
  }
  atomic_init(&b->refs, 1);
  return b;
}

static void buffer_release(tensor_buffer *b) {
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
    pool_free(b->data, b->capacity);
    free(b);
  }
}

/* A tensor struct over buf (taking over the caller's reference to it). */
static topos_tensor *tensor_wrap(tensor_buffer *buf, topos_dtype dtype,
                                 int rank, const int64_t *shape,
                                 const int64_t *stride, int64_t offset) {
  topos_tensor *t = malloc(sizeof *t);
  if (t == NULL) return NULL;
  memset(t, 0, sizeof *t);
  atomic_init(&t->refs, 1);
  t->dtype = dtype;
  t->rank = rank;
  for (int i = 0; i < rank; i++) {
    t->shape[i] = shape[i];
    t->stride[i] = stride[i];
  }
  t->offset = offset;
  t->buf = buf;
  return t;
}

static void row_major_strides(int rank, const int64_t *shape, int64_t *stride) {
  /* Only an empty tensor can have extents whose product overflows (a zero
   * extent elsewhere); its strides are never used to address anything,
   * so they saturate instead of overflowing. */
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    stride[i] = s;
    if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s))
      s = INT64_MAX;
  }
}

/* A contiguous tensor of `count` elements, shape already validated. */
static topos_tensor *tensor_alloc(const char *what, topos_dtype dtype, int rank,
                                  const int64_t *shape, int64_t count,
                                  topos_error *err) {
  size_t bytes = (size_t)count * topos_dtype_size(dtype);
  tensor_buffer *buf = buffer_new(bytes);
  if (buf == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory for %zu bytes", what,
              bytes);
    return NULL;
  }
  int64_t stride[TOPOS_MAX_RANK];
  row_major_strides(rank, shape, stride);
  topos_tensor *t = tensor_wrap(buf, dtype, rank, shape, stride, 0);
  if (t == NULL) {
    buffer_release(buf);
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", what);
  }
  return t;
}

topos_tensor *tensor_new(topos_dtype dtype, int rank, const int64_t *shape,
                         topos_error *err) {
  int64_t count = check_new("tensor_new", dtype, rank, shape, err);
  if (count < 0) return NULL;
  return tensor_alloc("tensor_new", dtype, rank, shape, count, err);
}

topos_tensor *tensor_new_meta(const tensor_meta *m, topos_error *err) {
  if (m == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "tensor_new_meta: meta is NULL");
    return NULL;
  }
  return tensor_new(m->dtype, m->rank, m->shape, err);
}

topos_tensor *tensor_view(const topos_tensor *base, int rank,
                          const int64_t *shape, const int64_t *stride,
                          int64_t offset) {
  assert(base != NULL && rank >= 0 && rank <= TOPOS_MAX_RANK);
  atomic_fetch_add_explicit(&base->buf->refs, 1, memory_order_relaxed);
  topos_tensor *t =
      tensor_wrap(base->buf, base->dtype, rank, shape, stride, offset);
  if (t == NULL) buffer_release(base->buf);
  return t;
}

void *tensor_data(const topos_tensor *t) {
  if (t == NULL) return NULL;
  return (char *)t->buf->data + (size_t)t->offset * topos_dtype_size(t->dtype);
}

const void *topos_tensor_memory(const topos_tensor *t, size_t *bytes) {
  *bytes = 0;
  if (t == NULL || !topos_tensor_is_contiguous(t)) return NULL;
  *bytes = (size_t)topos_tensor_count(t) * topos_dtype_size(t->dtype);
  return tensor_data(t);
}

topos_tensor *tensor_zeros_like_meta(const tensor_meta *m, topos_error *err) {
  if (m == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "tensor_zeros_like_meta: meta is NULL");
    return NULL;
  }
  if (check_new("tensor_zeros_like_meta", m->dtype, m->rank, m->shape, err) < 0)
    return NULL;
  /* One zero element seen everywhere through stride 0: a gradient of
   * zeros for a large node costs one element, not a full buffer. */
  static const int64_t one[1] = {1};
  topos_tensor *z =
      tensor_alloc("tensor_zeros_like_meta", m->dtype, 1, one, 1, err);
  if (z == NULL) return NULL;
  memset(z->buf->data, 0, topos_dtype_size(m->dtype));
  z->rank = m->rank;
  for (int i = 0; i < m->rank; i++) {
    z->shape[i] = m->shape[i];
    z->stride[i] = 0;
  }
  return z;
}

/* --------------------------------------------------------- reading */

/* Walks a tensor's elements in row-major logical order, yielding each
 * element's position in the buffer (in elements). */
typedef struct walker {
  int rank;
  int64_t idx[TOPOS_MAX_RANK];
  int64_t pos;
  const topos_tensor *t;
} walker;

static void walker_init(walker *w, const topos_tensor *t) {
  w->t = t;
  w->rank = t->rank;
  w->pos = t->offset;
  memset(w->idx, 0, sizeof w->idx);
}

/* Returns the current position and advances (the caller counts elements,
 * so the walker never runs past the end on its own terms). */
static int64_t walker_next(walker *w) {
  int64_t here = w->pos;
  const topos_tensor *t = w->t;
  for (int a = w->rank - 1; a >= 0; a--) {
    w->idx[a]++;
    w->pos += t->stride[a];
    if (w->idx[a] < t->shape[a]) break;
    w->pos -= t->stride[a] * t->shape[a];
    w->idx[a] = 0;
  }
  return here;
}

bool topos_tensor_is_contiguous(const topos_tensor *t) {
  if (t == NULL) return false;
  int64_t expect = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    /* Any layout of an empty tensor reads as row-major, and the stride of
     * an extent-1 axis is never used to address anything. */
    if (t->shape[i] == 0) return true;
    if (t->shape[i] != 1 && t->stride[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

int strided_coalesce2(int rank, const int64_t *shape, const int64_t *sa_in,
                      const int64_t *sb_in, int64_t *shape_out, int64_t *sa,
                      int64_t *sb) {
  int r = 0;
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    int64_t e = shape[d], a = sa_in[d], b = sb_in[d];
    if (r > 0 && sa[r - 1] == a * e && sb[r - 1] == b * e) {
      shape_out[r - 1] *= e;
      sa[r - 1] = a;
      sb[r - 1] = b;
    } else {
      shape_out[r] = e;
      sa[r] = a;
      sb[r] = b;
      r++;
    }
  }
  return r;
}

#if defined(__x86_64__)
/* n1 short contiguous rows of 4-byte elements (an im2col patch row of 3 or
 * 5, a pooling window of 2) with one masked vector load and store each:
 * the masked-off lanes are never touched, so nothing past a row is read
 * or written. */
__attribute__((target("avx512f"))) static void copy_short_rows32(
    char *dst, int64_t d1, const char *src, int64_t s1, int64_t n1,
    int64_t n0) {
  __mmask16 m = (__mmask16)((1u << n0) - 1u);
  for (int64_t i1 = 0; i1 < n1; i1++, src += s1 * 4, dst += d1 * 4)
    _mm512_mask_storeu_epi32(dst, m, _mm512_maskz_loadu_epi32(m, src));
}

/* n1 rows of n0 4-byte elements read s0 apart (a transposing copy: a
 * conv's [positions, channels] output into [channels, positions]) and
 * written contiguously, sixteen a gather; the masked-off lanes are
 * neither read nor written. */
__attribute__((target("avx512f"))) static void copy_gather_rows32(
    char *dst, int64_t d1, const char *src, int64_t s1, int64_t s0, int64_t n1,
    int64_t n0) {
  const __m512i idx = gather16_index(s0);
  for (int64_t i1 = 0; i1 < n1; i1++, src += s1 * 4, dst += d1 * 4)
    for (int64_t i0 = 0; i0 < n0; i0 += 16) {
      int64_t left = n0 - i0;
      __mmask16 m =
          left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
      __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx,
                                              src + i0 * s0 * 4, 4);
      _mm512_mask_storeu_epi32(dst + i0 * 4, m, v);
    }
}

/* n1 x n0 4-byte elements at src + i1 + i0·s0 (the source contiguous
 * along i1: a transposing copy, as a conv's [positions, channels] output
 * read as [channels, positions] or the gradient going back) into dst +
 * i1·d1 + i0, in 16 x 16 tiles: sixteen i0 each a vector along i1
 * (masked past n1), one register transpose, sixteen i1 each a vector
 * along i0 (masked past n0).  Unlike a gather per sixteen elements, every
 * load and store is a plain vector.  The masked-off lanes are neither
 * read nor written. */
__attribute__((target("avx512f"))) static void copy_transpose32(
    char *dst, int64_t d1, const char *src, int64_t s0, int64_t n1,
    int64_t n0) {
  const float *sf = (const float *)src;
  float *df = (float *)dst;
  for (int64_t i1 = 0; i1 < n1; i1 += 16) {
    int64_t w1 = n1 - i1 < 16 ? n1 - i1 : 16;
    __mmask16 m1 = (__mmask16)((1u << w1) - 1u);
    for (int64_t i0 = 0; i0 < n0; i0 += 16) {
      int64_t w0 = n0 - i0 < 16 ? n0 - i0 : 16;
      __mmask16 m0 = (__mmask16)((1u << w0) - 1u);
      __m512 r[16];
      transpose16_load_ps(sf + i0 * s0 + i1, s0, w0, m1, r);
      for (int t = 0; t < w1; t++)
        _mm512_mask_storeu_ps(df + (i1 + t) * d1 + i0, m0, r[t]);
    }
  }
}

static bool have_avx512(void) {
  static int known = -1;
  if (known < 0) known = __builtin_cpu_supports("avx512f") ? 1 : 0;
  return known == 1;
}
#else
static bool have_avx512(void) {
  return false;
}
static void copy_short_rows32(char *dst, int64_t d1, const char *src,
                              int64_t s1, int64_t n1, int64_t n0) {}
static void copy_gather_rows32(char *dst, int64_t d1, const char *src,
                               int64_t s1, int64_t s0, int64_t n1, int64_t n0) {
}
static void copy_transpose32(char *dst, int64_t d1, const char *src, int64_t s0,
                             int64_t n1, int64_t n0) {}
#endif

/* Element i0 of each of n1 rows, es bytes each; dst may be unaligned (an
 * encoding buffer), so elements go through memcpy of a constant size,
 * which compiles to one unaligned move. */
#define COPY_ELEMENTS(ES)               \
  for (int64_t i1 = 0; i1 < n1; i1++)   \
    for (int64_t i0 = 0; i0 < n0; i0++) \
  memcpy(d + (i1 * d1 + i0 * d0) * (ES), sp + (i1 * s1 + i0 * s0) * (ES), (ES))

void tensor_copy_strided(const topos_tensor *src, void *dst,
                         const int64_t *dst_stride) {
  const size_t es = topos_dtype_size(src->dtype);
  if (shape_count(src->rank, src->shape) <= 0) return;
  /* The two innermost (coalesced) axes are a block; an odometer walks the
   * rest. */
  int64_t shape[TOPOS_MAX_RANK], ss[TOPOS_MAX_RANK], ds[TOPOS_MAX_RANK];
  int r = strided_coalesce2(src->rank, src->shape, src->stride, dst_stride,
                            shape, ss, ds);
  int64_t n0 = r ? shape[r - 1] : 1, s0 = r ? ss[r - 1] : 0,
          d0 = r ? ds[r - 1] : 0;
  int64_t n1 = r > 1 ? shape[r - 2] : 1, s1 = r > 1 ? ss[r - 2] : 0,
          d1 = r > 1 ? ds[r - 2] : 0;
  bool rows = s0 == 1 && d0 == 1;
  bool short_rows = rows && es == 4 && n0 < 16 && n1 > 1 && have_avx512();
  /* A source contiguous along the outer axis into contiguous rows, 4-byte
   * elements: a tiled transpose; otherwise strided rows: gathers. */
  bool transpose = !rows && es == 4 && d0 == 1 && s1 == 1 && s0 > 1 &&
                   n1 >= 4 && n0 >= 2 && have_avx512();
  bool gather = !rows && es == 4 && d0 == 1 && s0 > 0 &&
                s0 <= GATHER16_STRIDE_MAX && n0 >= 4 && have_avx512();
  const char *s = tensor_data(src);
  int64_t idx[TOPOS_MAX_RANK] = {0}, so = 0, doff = 0;
  for (;;) {
    const char *sp = s + so * (int64_t)es;
    char *d = (char *)dst + doff * (int64_t)es;
    if (short_rows)
      copy_short_rows32(d, d1, sp, s1, n1, n0);
    else if (transpose)
      copy_transpose32(d, d1, sp, s0, n1, n0);
    else if (gather)
      copy_gather_rows32(d, d1, sp, s1, s0, n1, n0);
    else if (rows)
      for (int64_t i1 = 0; i1 < n1; i1++)
        memcpy(d + i1 * d1 * (int64_t)es, sp + i1 * s1 * (int64_t)es,
               (size_t)n0 * es);
    else if (es == 4)
      COPY_ELEMENTS(4);
    else if (es == 8)
      COPY_ELEMENTS(8);
    else
      COPY_ELEMENTS(2);
    int a = r - 3;
    for (; a >= 0; a--) {
      so += ss[a];
      doff += ds[a];
      if (++idx[a] < shape[a]) break;
      so -= ss[a] * shape[a];
      doff -= ds[a] * shape[a];
      idx[a] = 0;
    }
    if (a < 0) break;
  }
}
#undef COPY_ELEMENTS

/* Copies elements of size es from t, row-major, to dst. */
void tensor_copy_out(const topos_tensor *t, void *dst) {
  size_t es = topos_dtype_size(t->dtype);
  int64_t n = shape_count(t->rank, t->shape);
  if (n <= 0) return;
  if (topos_tensor_is_contiguous(t)) {
    memcpy(dst, tensor_data(t), (size_t)n * es);
    return;
  }
  int64_t stride[TOPOS_MAX_RANK];
  int64_t step = 1; /* n > 0 fits, so every partial product does */
  for (int a = t->rank - 1; a >= 0; a--) {
    stride[a] = step;
    step *= t->shape[a];
  }
  tensor_copy_strided(t, dst, stride);
}

bool tensor_is_uniform(const topos_tensor *t) {
  size_t es = topos_dtype_size(t->dtype);
  int64_t n = shape_count(t->rank, t->shape);
  if (n < 2) return false;
  const char *base = tensor_data(t);
  bool broadcast = true; /* every element is element 0 */
  for (int a = 0; a < t->rank; a++)
    if (t->shape[a] > 1 && t->stride[a] != 0) broadcast = false;
  if (broadcast) return true;
  /* Walk the view row-major, comparing each element's bytes with the
   * first; the first difference ends it. */
  int64_t idx[TOPOS_MAX_RANK] = {0}, off = 0;
  for (;;) {
    if (memcmp(base + off * (int64_t)es, base, es) != 0) return false;
    int a = t->rank - 1;
    for (; a >= 0; a--) {
      off += t->stride[a];
      if (++idx[a] < t->shape[a]) break;
      off -= t->stride[a] * t->shape[a];
      idx[a] = 0;
    }
    if (a < 0) return true;
  }
}

bool topos_tensor_is_uniform(const topos_tensor *t) {
  return t != NULL && tensor_is_uniform(t);
}

int64_t topos_tensor_count(const topos_tensor *t) {
  if (t == NULL) return -1;
  return shape_count(t->rank, t->shape);
}

topos_dtype topos_tensor_dtype(const topos_tensor *t) {
  /* No dtype is right for a NULL tensor; an invalid one makes
   * topos_dtype_name say "?" instead of pretending it is f32. */
  if (t == NULL) return (topos_dtype)-1;
  return t->dtype;
}

int topos_tensor_rank(const topos_tensor *t) {
  if (t == NULL) return -1;
  return t->rank;
}

const int64_t *topos_tensor_shape(const topos_tensor *t) {
  if (t == NULL) return NULL;
  return t->shape;
}

static double element_as_double(const topos_tensor *t, int64_t pos) {
  const char *p =
      (const char *)t->buf->data + (size_t)pos * topos_dtype_size(t->dtype);
  switch (t->dtype) {
    case TOPOS_F32: {
      float f;
      memcpy(&f, p, sizeof f);
      return f;
    }
    case TOPOS_F64: {
      double d;
      memcpy(&d, p, sizeof d);
      return d;
    }
    case TOPOS_BF16: {
      uint16_t b;
      memcpy(&b, p, sizeof b);
      return topos_bf16_to_f32(b);
    }
    case TOPOS_I32: {
      int32_t i;
      memcpy(&i, p, sizeof i);
      return i;
    }
  }
  assert(0 && "tensor with an invalid dtype");
  return NAN;
}

double topos_tensor_get(const topos_tensor *t, const int64_t *index,
                        topos_error *err) {
  if (t == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "topos_tensor_get: tensor is NULL");
    return NAN;
  }
  if (t->rank > 0 && index == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "topos_tensor_get: index is NULL for a rank-%d tensor", t->rank);
    return NAN;
  }
  int64_t pos = t->offset;
  for (int a = 0; a < t->rank; a++) {
    if (index[a] < 0 || index[a] >= t->shape[a]) {
      char text[SHAPE_TEXT];
      error_set(err, TOPOS_ERR_RANGE,
                "topos_tensor_get: index %lld on axis %d is outside shape %s",
                (long long)index[a], a, shape_text(text, t->rank, t->shape));
      return NAN;
    }
    pos += index[a] * t->stride[a];
  }
  return element_as_double(t, pos);
}

int topos_tensor_read(const topos_tensor *t, void *out, size_t bytes,
                      topos_error *err) {
  if (t == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "topos_tensor_read: tensor is NULL");
  size_t need =
      (size_t)shape_count(t->rank, t->shape) * topos_dtype_size(t->dtype);
  if (need > 0 && out == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "topos_tensor_read: out is NULL for %zu bytes", need);
  if (bytes < need)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "topos_tensor_read: out holds %zu bytes, the tensor "
                     "needs %zu",
                     bytes, need);
  tensor_copy_out(t, out);
  return TOPOS_OK;
}

bool topos_tensor_bitwise_equal(const topos_tensor *a, const topos_tensor *b) {
  if (a == b) return true;
  if (a == NULL || b == NULL) return false;
  if (a->dtype != b->dtype ||
      !shape_equal(a->rank, a->shape, b->rank, b->shape))
    return false;
  int64_t n = shape_count(a->rank, a->shape);
  size_t es = topos_dtype_size(a->dtype);
  if (n <= 0) return true;
  if (topos_tensor_is_contiguous(a) && topos_tensor_is_contiguous(b))
    return memcmp(tensor_data(a), tensor_data(b), (size_t)n * es) == 0;
  const char *pa = a->buf->data, *pb = b->buf->data;
  walker wa, wb;
  walker_init(&wa, a);
  walker_init(&wb, b);
  for (int64_t i = 0; i < n; i++) {
    int64_t ia = walker_next(&wa), ib = walker_next(&wb);
    if (memcmp(pa + (size_t)ia * es, pb + (size_t)ib * es, es) != 0)
      return false;
  }
  return true;
}

/* ------------------------------------------------------ constructors */

topos_tensor *topos_tensor_from(topos_dtype dtype, int rank,
                                const int64_t *shape, const void *data,
                                topos_error *err) {
  const char *what = "topos_tensor_from";
  int64_t count = check_new(what, dtype, rank, shape, err);
  if (count < 0) return NULL;
  if (count > 0 && data == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: data is NULL for %lld elements",
              what, (long long)count);
    return NULL;
  }
  topos_tensor *t = tensor_alloc(what, dtype, rank, shape, count, err);
  if (t != NULL && count > 0)
    memcpy(t->buf->data, data, (size_t)count * topos_dtype_size(dtype));
  return t;
}

topos_tensor *topos_tensor_filled(topos_dtype dtype, int rank,
                                  const int64_t *shape, double value,
                                  topos_error *err) {
  const char *what = "topos_tensor_filled";
  int64_t count = check_new(what, dtype, rank, shape, err);
  if (count < 0) return NULL;
  /* Converting a NaN or an out-of-range double to int32_t is undefined
   * behaviour in C, so i32 accepts only values it can hold (truncated
   * toward zero, like a C cast). */
  if (dtype == TOPOS_I32 && !(value > -2147483649.0 && value < 2147483648.0)) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: %g does not fit in i32", what,
              value);
    return NULL;
  }
  topos_tensor *t = tensor_alloc(what, dtype, rank, shape, count, err);
  if (t == NULL) return NULL;
  void *p = t->buf->data;
  switch (dtype) {
    case TOPOS_F32: {
      float v = (float)value;
      for (int64_t i = 0; i < count; i++) ((float *)p)[i] = v;
      break;
    }
    case TOPOS_F64:
      for (int64_t i = 0; i < count; i++) ((double *)p)[i] = value;
      break;
    case TOPOS_BF16: {
      uint16_t v = bf16_from_f64(value);
      for (int64_t i = 0; i < count; i++) ((uint16_t *)p)[i] = v;
      break;
    }
    case TOPOS_I32: {
      int32_t v = (int32_t)value;
      for (int64_t i = 0; i < count; i++) ((int32_t *)p)[i] = v;
      break;
    }
  }
  return t;
}

topos_tensor *topos_tensor_zeros(topos_dtype dtype, int rank,
                                 const int64_t *shape, topos_error *err) {
  return topos_tensor_filled(dtype, rank, shape, 0.0, err);
}

topos_tensor *topos_tensor_ones(topos_dtype dtype, int rank,
                                const int64_t *shape, topos_error *err) {
  return topos_tensor_filled(dtype, rank, shape, 1.0, err);
}

topos_tensor *topos_tensor_scalar(topos_dtype dtype, double value,
                                  topos_error *err) {
  return topos_tensor_filled(dtype, 0, NULL, value, err);
}

/* ------------------------------------------------------ reference counts */

topos_tensor *topos_tensor_retain(const topos_tensor *t) {
  if (t == NULL) return NULL;
  /* Tensors are immutable values; the count is the one field that
   * changes, and it is atomic, so retaining through a const pointer is
   * safe. */
  topos_tensor *m = (topos_tensor *)t;
  atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
  return m;
}

void topos_tensor_release(topos_tensor *t) {
  if (t == NULL) return;
  if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1) {
    buffer_release(t->buf);
    free(t);
  }
}

/* --------------------------------------------------------------- views */

static bool check_tensor(const char *what, const topos_tensor *t,
                         topos_error *err) {
  if (t == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: tensor is NULL", what);
    return false;
  }
  return true;
}

static topos_tensor *view_or_error(const char *what, const topos_tensor *t,
                                   int rank, const int64_t *shape,
                                   const int64_t *stride, int64_t offset,
                                   topos_error *err) {
  topos_tensor *v = tensor_view(t, rank, shape, stride, offset);
  if (v == NULL) error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", what);
  return v;
}

topos_tensor *topos_tensor_transpose(const topos_tensor *t, topos_error *err) {
  const char *what = "topos_tensor_transpose";
  if (!check_tensor(what, t, err)) return NULL;
  if (t->rank != 2) {
    char text[SHAPE_TEXT];
    error_set(err, TOPOS_ERR_SHAPE, "%s: needs rank 2, got %s", what,
              shape_text(text, t->rank, t->shape));
    return NULL;
  }
  int64_t shape[2] = {t->shape[1], t->shape[0]};
  int64_t stride[2] = {t->stride[1], t->stride[0]};
  return view_or_error(what, t, 2, shape, stride, t->offset, err);
}

topos_tensor *topos_tensor_permute(const topos_tensor *t, const int *perm,
                                   topos_error *err) {
  const char *what = "topos_tensor_permute";
  if (!check_tensor(what, t, err)) return NULL;
  if (t->rank > 0 && perm == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: perm is NULL for rank %d", what,
              t->rank);
    return NULL;
  }
  bool seen[TOPOS_MAX_RANK] = {false};
  int64_t shape[TOPOS_MAX_RANK], stride[TOPOS_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    int p = perm[i];
    if (p < 0 || p >= t->rank || seen[p]) {
      error_set(err, TOPOS_ERR_ARGUMENT, "%s: perm[%d] = %d is %s for rank %d",
                what, i, p,
                (p < 0 || p >= t->rank) ? "out of range" : "repeated", t->rank);
      return NULL;
    }
    seen[p] = true;
    shape[i] = t->shape[p];
    stride[i] = t->stride[p];
  }
  return view_or_error(what, t, t->rank, shape, stride, t->offset, err);
}

static bool check_axis(const char *what, const topos_tensor *t, int axis,
                       topos_error *err) {
  if (axis < 0 || axis >= t->rank) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "%s: axis %d is out of range for rank %d", what, axis, t->rank);
    return false;
  }
  return true;
}

topos_tensor *topos_tensor_narrow(const topos_tensor *t, int axis,
                                  int64_t start, int64_t length,
                                  topos_error *err) {
  const char *what = "topos_tensor_narrow";
  if (!check_tensor(what, t, err) || !check_axis(what, t, axis, err))
    return NULL;
  if (start < 0 || length < 0) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "%s: start %lld and length %lld must be >= 0", what,
              (long long)start, (long long)length);
    return NULL;
  }
  int64_t extent = t->shape[axis];
  if (start > extent || length > extent - start) {
    char text[SHAPE_TEXT];
    error_set(err, TOPOS_ERR_SHAPE,
              "%s: [%lld, %lld + %lld) does not fit axis %d of %s", what,
              (long long)start, (long long)start, (long long)length, axis,
              shape_text(text, t->rank, t->shape));
    return NULL;
  }
  int64_t shape[TOPOS_MAX_RANK];
  memcpy(shape, t->shape, sizeof shape);
  shape[axis] = length;
  return view_or_error(what, t, t->rank, shape, t->stride,
                       t->offset + start * t->stride[axis], err);
}

topos_tensor *topos_tensor_broadcast(const topos_tensor *t, int rank,
                                     const int64_t *shape, topos_error *err) {
  const char *what = "topos_tensor_broadcast";
  if (!check_tensor(what, t, err)) return NULL;
  if (check_new(what, t->dtype, rank, shape, err) < 0) return NULL;
  int64_t stride[TOPOS_MAX_RANK];
  if (t->rank == 0) {
    for (int i = 0; i < rank; i++) stride[i] = 0;
  } else {
    bool fits = t->rank == rank;
    for (int i = 0; fits && i < rank; i++) {
      if (t->shape[i] == shape[i])
        stride[i] = t->stride[i];
      else if (t->shape[i] == 1)
        stride[i] = 0;
      else
        fits = false;
    }
    if (!fits) {
      char from[SHAPE_TEXT], to[SHAPE_TEXT];
      error_set(err, TOPOS_ERR_SHAPE, "%s: cannot broadcast %s to %s", what,
                shape_text(from, t->rank, t->shape),
                shape_text(to, rank, shape));
      return NULL;
    }
  }
  return view_or_error(what, t, rank, shape, stride, t->offset, err);
}

topos_tensor *topos_tensor_unfold(const topos_tensor *t, int axis, int64_t size,
                                  int64_t step, int64_t dilation,
                                  topos_error *err) {
  const char *what = "topos_tensor_unfold";
  if (!check_tensor(what, t, err) || !check_axis(what, t, axis, err))
    return NULL;
  if (size < 1 || step < 1 || dilation < 1) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "%s: size %lld, step %lld and dilation %lld must be >= 1", what,
              (long long)size, (long long)step, (long long)dilation);
    return NULL;
  }
  char text[SHAPE_TEXT];
  if (t->rank + 1 > TOPOS_MAX_RANK) {
    error_set(err, TOPOS_ERR_SHAPE, "%s: %s would exceed rank %d", what,
              shape_text(text, t->rank, t->shape), TOPOS_MAX_RANK);
    return NULL;
  }
  int64_t extent = t->shape[axis], span;
  if (__builtin_mul_overflow(size - 1, dilation, &span) || span >= extent) {
    error_set(err, TOPOS_ERR_SHAPE,
              "%s: a window of size %lld, dilation %lld does not fit axis %d "
              "of %s",
              what, (long long)size, (long long)dilation, axis,
              shape_text(text, t->rank, t->shape));
    return NULL;
  }
  span += 1;
  int64_t count = (extent - span) / step + 1;
  int64_t shape[TOPOS_MAX_RANK], stride[TOPOS_MAX_RANK];
  for (int i = 0, j = 0; i < t->rank; i++, j++) {
    if (i != axis) {
      shape[j] = t->shape[i];
      stride[j] = t->stride[i];
      continue;
    }
    shape[j] = count;
    shape[j + 1] = size;
    /* A product can only overflow when its axis has one entry (a step or
     * dilation past the extent), where the stride is never used. */
    if (__builtin_mul_overflow(step, t->stride[i], &stride[j])) stride[j] = 0;
    if (__builtin_mul_overflow(dilation, t->stride[i], &stride[j + 1]))
      stride[j + 1] = 0;
    j++;
  }
  return view_or_error(what, t, t->rank + 1, shape, stride, t->offset, err);
}

topos_tensor *topos_tensor_contiguous(const topos_tensor *t, topos_error *err) {
  const char *what = "topos_tensor_contiguous";
  if (!check_tensor(what, t, err)) return NULL;
  if (topos_tensor_is_contiguous(t)) return topos_tensor_retain(t);
  int64_t count = shape_count(t->rank, t->shape);
  topos_tensor *c = tensor_alloc(what, t->dtype, t->rank, t->shape, count, err);
  if (c != NULL) tensor_copy_out(t, c->buf->data);
  return c;
}

topos_tensor *topos_tensor_convert(const topos_tensor *t, topos_dtype to,
                                   topos_error *err) {
  const char *what = "topos_tensor_convert";
  if (!check_tensor(what, t, err)) return NULL;
  if (!dtype_is_float(t->dtype) || !dtype_is_float(to)) {
    error_set(err, TOPOS_ERR_DTYPE,
              "%s: converts among f32, f64 and bf16, not %s to %s", what,
              topos_dtype_name(t->dtype), topos_dtype_name(to));
    return NULL;
  }
  if (t->dtype == to) return topos_tensor_retain(t);
  int64_t count = shape_count(t->rank, t->shape);
  if (count > TENSOR_MAX_BYTES / (int64_t)topos_dtype_size(to)) {
    char text[SHAPE_TEXT];
    error_set(err, TOPOS_ERR_MEMORY,
              "%s: %s%s is larger than the 2^40-byte limit", what,
              topos_dtype_name(to), shape_text(text, t->rank, t->shape));
    return NULL;
  }
  topos_tensor *c = tensor_alloc(what, to, t->rank, t->shape, count, err);
  if (c == NULL || count == 0) return c;
  void *dst = c->buf->data;
  if (t->dtype == TOPOS_F32 && to == TOPOS_BF16 &&
      topos_tensor_is_contiguous(t)) {
    /* The common case (a checkpoint's weights): one pass, rounded once. */
    bf16_round_array(tensor_data(t), dst, count);
    return c;
  }
  /* Every float dtype widens to double exactly; store_rounded rounds once
   * (bf16 straight from double, f32 by the C conversion, nearest even). */
  walker w;
  walker_init(&w, t);
  for (int64_t i = 0; i < count; i++)
    store_rounded(dst, to, i, element_as_double(t, walker_next(&w)));
  return c;
}

/* --------------------------------------------------------- compute views */

int compute_view_of(const topos_tensor *t, compute_view *v, topos_error *err) {
  if (v == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "compute_view_of: view is NULL");
  v->data = NULL;
  v->owned = NULL;
  v->capacity = 0;
  if (t == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "compute_view_of: tensor is NULL");
  bool contiguous = topos_tensor_is_contiguous(t);
  if (t->dtype != TOPOS_BF16 && contiguous) {
    v->data = tensor_data(t);
    return TOPOS_OK;
  }
  int64_t n = shape_count(t->rank, t->shape);
  size_t es =
      t->dtype == TOPOS_BF16 ? sizeof(float) : topos_dtype_size(t->dtype);
  v->owned = pool_alloc((size_t)n * es, &v->capacity);
  if (v->owned == NULL)
    return error_set(err, TOPOS_ERR_MEMORY,
                     "compute_view_of: out of memory for %lld elements",
                     (long long)n);
  v->data = v->owned;
  if (t->dtype != TOPOS_BF16) {
    tensor_copy_out(t, v->owned);
    return TOPOS_OK;
  }
  float *out = v->owned;
  if (contiguous) {
    const uint16_t *src = tensor_data(t);
    for (int64_t i = 0; i < n; i++) out[i] = topos_bf16_to_f32(src[i]);
    return TOPOS_OK;
  }
  /* Gather the bf16 bits into the front of the float buffer, then widen
   * in place from the back: float i overwrites bits 2i and 2i+1, which are
   * at or after bits i, so every bf16 value is read before it is
   * overwritten and no second buffer is needed. */
  tensor_copy_out(t, v->owned);
  const char *bits = v->owned;
  for (int64_t i = n - 1; i >= 0; i--) {
    uint16_t b;
    memcpy(&b, bits + 2 * i, sizeof b);
    out[i] = topos_bf16_to_f32(b);
  }
  return TOPOS_OK;
}

void compute_view_done(compute_view *v) {
  if (v == NULL) return;
  if (v->owned != NULL) pool_free(v->owned, v->capacity);
  v->data = NULL;
  v->owned = NULL;
  v->capacity = 0;
}

/* ------------------------------------------------------------ outputs */

int out_begin(out_buf *ob, const tensor_meta *m, topos_error *err) {
  memset(ob, 0, sizeof *ob);
  ob->t = tensor_new_meta(m, err);
  if (!ob->t) return -1;
  if (m->dtype != TOPOS_BF16) {
    ob->data = tensor_data(ob->t);
    return 0;
  }
  int64_t n = shape_count(m->rank, m->shape);
  ob->data = pool_alloc((size_t)n * sizeof(float), &ob->scratch_cap);
  if (!ob->data) {
    topos_tensor_release(ob->t);
    return error_set(err, TOPOS_ERR_MEMORY, "out of memory"), -1;
  }
  return 0;
}

topos_tensor *out_end(out_buf *ob) {
  if (ob->t->dtype == TOPOS_BF16) {
    bf16_round_array(ob->data, tensor_data(ob->t), topos_tensor_count(ob->t));
    pool_free(ob->data, ob->scratch_cap);
  }
  return ob->t;
}

void out_abort(out_buf *ob) {
  if (ob->t && ob->t->dtype == TOPOS_BF16) pool_free(ob->data, ob->scratch_cap);
  topos_tensor_release(ob->t);
}
