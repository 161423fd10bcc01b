/*
 * topos.h - the public API of libtopos, the topos engine.
 *
 * A computation is recorded on a tape, sealed into an immutable network,
 * and then read: evaluated by the reference interpreter, differentiated
 * by reverse mode, stepped by pure optimizers.  The reference interpreter
 * is the executable specification (docs/numerics.md); every faster path
 * must reproduce its bits.
 *
 * Conventions, for every function in this header:
 *  - Errors never abort and never print.  A function that can fail takes a
 *    `topos_error *err` (which may be NULL) and returns NULL, an invalid
 *    value, or a non-zero status; the error carries a code and a message.
 *  - A function returning a pointer says who owns it.  "New" results are
 *    owned by the caller and released with the matching *_free/_release.
 *    "Borrowed" results live as long as the object they were read from.
 *  - NULL, foreign (another tape's) values, wrong dtypes and wrong shapes
 *    are reported as errors, never dereferenced blindly.
 *  - Tensors, sealed networks, parameter sets and fields are immutable
 *    values once built and safe to share between threads.
 */
#ifndef TOPOS_H
#define TOPOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The version of this header.  topos_version() is the library's: a
 * program can compare the two to find a header/library mismatch.  The
 * shared libraries' SONAMEs carry the major number (libtopos.so.0).
 */
#define TOPOS_VERSION_MAJOR 0
#define TOPOS_VERSION_MINOR 1
#define TOPOS_VERSION_PATCH 0
#define TOPOS_VERSION "0.1.0"

/*
 * The export marker: the shared libraries are built with
 * -fvisibility=hidden, so only declarations marked TOPOS_API (the
 * topos_* API of this header, backend.h, backends.h and topos_client.h)
 * are visible to programs that link them; internal helpers stay local.
 */
#if defined(__GNUC__) || defined(__clang__)
#define TOPOS_API __attribute__((visibility("default")))
#else
#define TOPOS_API
#endif

/* "0.1.0": the library's version (TOPOS_VERSION when header and library
 * agree).  Static. */
TOPOS_API const char *topos_version(void);

#define TOPOS_MAX_RANK 8

/* ------------------------------------------------------------------ errors */

typedef enum topos_status {
  TOPOS_OK = 0,
  TOPOS_ERR_ARGUMENT = 1,   /* NULL, foreign value, bad attribute */
  TOPOS_ERR_SHAPE = 2,      /* operand shapes do not fit the op */
  TOPOS_ERR_DTYPE = 3,      /* operand dtypes do not fit the op */
  TOPOS_ERR_RANGE = 4,      /* an index out of range at run time */
  TOPOS_ERR_MEMORY = 5,     /* allocation failed or a size overflows */
  TOPOS_ERR_STATE = 6,      /* e.g. reading a value a run did not evaluate */
  TOPOS_ERR_NOT_FOUND = 7,  /* an unknown spec or blob id */
  TOPOS_ERR_CORRUPT = 8,    /* bytes that do not match their id, or are not
                               a valid encoding */
  TOPOS_ERR_IO = 9,         /* the store's file could not be used */
  TOPOS_ERR_CANCELLED = 10, /* the context's cancel check said stop */
  TOPOS_ERR_DEADLINE = 11   /* the context's deadline passed */
} topos_status;

typedef struct topos_error {
  int code; /* a topos_status */
  char message[512];
} topos_error;

/* A static, human-readable name for a status code ("shape", "range", ...). */
TOPOS_API const char *topos_status_name(int code);

/* A cancellation predicate (see topos_exec): true means stop. */
typedef bool (*topos_cancel_fn)(void *ctx);

/* Frees strings returned by topos (describe output). */
TOPOS_API void topos_free(void *p);

/* ----------------------------------------------------------------- tensors */

typedef enum topos_dtype {
  TOPOS_F32 = 0,
  TOPOS_F64 = 1,
  TOPOS_BF16 = 2, /* stored as uint16_t bit patterns; computed in f32 */
  TOPOS_I32 = 3   /* index data only */
} topos_dtype;

typedef struct topos_tensor topos_tensor;

TOPOS_API const char *topos_dtype_name(
    topos_dtype dtype);                               /* "f32"...; "?" if bad */
TOPOS_API size_t topos_dtype_size(topos_dtype dtype); /* bytes; 0 if bad */

/* bf16 conversions: to bf16 rounds to nearest even, NaN stays NaN (quiet). */
TOPOS_API uint16_t topos_bf16_from_f32(float value);
TOPOS_API float topos_bf16_to_f32(uint16_t bits);

/* New tensors (caller releases).  `data` holds count elements row-major in
 * the dtype's C type (float, double, uint16_t bf16 bits, int32_t) and is
 * copied.  rank 0 (a scalar) takes shape NULL. */
TOPOS_API topos_tensor *topos_tensor_from(topos_dtype dtype, int rank,
                                          const int64_t *shape,
                                          const void *data, topos_error *err);
/* Every element set to `value` converted to the dtype (bf16: rounded). */
TOPOS_API topos_tensor *topos_tensor_filled(topos_dtype dtype, int rank,
                                            const int64_t *shape, double value,
                                            topos_error *err);
TOPOS_API topos_tensor *topos_tensor_zeros(topos_dtype dtype, int rank,
                                           const int64_t *shape,
                                           topos_error *err);
TOPOS_API topos_tensor *topos_tensor_ones(topos_dtype dtype, int rank,
                                          const int64_t *shape,
                                          topos_error *err);
TOPOS_API topos_tensor *topos_tensor_scalar(topos_dtype dtype, double value,
                                            topos_error *err);

/* Reference counting.  retain returns its argument (NULL stays NULL). */
TOPOS_API topos_tensor *topos_tensor_retain(const topos_tensor *t);
TOPOS_API void topos_tensor_release(topos_tensor *t);

/* For a NULL tensor: dtype is invalid (its name is "?"), rank and count
 * are -1, shape is NULL. */
TOPOS_API topos_dtype topos_tensor_dtype(const topos_tensor *t);
TOPOS_API int topos_tensor_rank(const topos_tensor *t);
/* Borrowed pointer to rank extents (NULL for a NULL tensor). */
TOPOS_API const int64_t *topos_tensor_shape(const topos_tensor *t);
TOPOS_API int64_t topos_tensor_count(const topos_tensor *t); /* element count */
TOPOS_API bool topos_tensor_is_contiguous(const topos_tensor *t);
/* A contiguous tensor's elements in memory: their first byte, and their
 * length in *bytes (read-only: tensors are values).  NULL and 0 for a
 * strided view.  For a host that tells device backends which memory
 * holds which content (backends.h, topos_blob_announce). */
TOPOS_API const void *topos_tensor_memory(const topos_tensor *t, size_t *bytes);

/* One element, widened exactly to double (bf16 and f32 exactly, i32
 * exactly).  An index out of range sets err and returns NaN. */
TOPOS_API double topos_tensor_get(const topos_tensor *t, const int64_t *index,
                                  topos_error *err);
/* Copies every element row-major into out (count * dtype size bytes,
 * `bytes` must be at least that).  Returns a topos_status. */
TOPOS_API int topos_tensor_read(const topos_tensor *t, void *out, size_t bytes,
                                topos_error *err);
/* Same dtype, same shape, same bit pattern element by element (layouts
 * may differ).  NULL equals only NULL. */
TOPOS_API bool topos_tensor_bitwise_equal(const topos_tensor *a,
                                          const topos_tensor *b);

/* Views share the buffer and copy nothing (caller releases the view). */
TOPOS_API topos_tensor *topos_tensor_transpose(const topos_tensor *t,
                                               topos_error *err);
TOPOS_API topos_tensor *topos_tensor_permute(const topos_tensor *t,
                                             const int *perm, topos_error *err);
TOPOS_API topos_tensor *topos_tensor_narrow(const topos_tensor *t, int axis,
                                            int64_t start, int64_t length,
                                            topos_error *err);
/* t rank 0, or equal rank with each extent equal to the target's or 1. */
TOPOS_API topos_tensor *topos_tensor_broadcast(const topos_tensor *t, int rank,
                                               const int64_t *shape,
                                               topos_error *err);
/* axis of extent L becomes (count, size), count = (L - span) / step + 1,
 * span = (size - 1) * dilation + 1. */
TOPOS_API topos_tensor *topos_tensor_unfold(const topos_tensor *t, int axis,
                                            int64_t size, int64_t step,
                                            int64_t dilation, topos_error *err);
/* Whether t has two or more elements, all with the same bit pattern (a
 * broadcast of one element, or equal elements stored apart): the tensors
 * the encoding and the wire write as one element (docs/encoding.md). */
TOPOS_API bool topos_tensor_is_uniform(const topos_tensor *t);
/* A contiguous tensor with the same elements (retains t if it already is). */
TOPOS_API topos_tensor *topos_tensor_contiguous(const topos_tensor *t,
                                                topos_error *err);
/* The same elements in dtype `to`, among f32, f64 and bf16: a new
 * contiguous tensor (t itself, retained, when it is already `to`).
 * Widening (bf16 -> f32 -> f64) is exact; narrowing rounds once to
 * nearest even (f64 -> bf16 directly, never through f32); a NaN stays a
 * quiet NaN with its sign, and a finite value past the target's range
 * becomes an infinity.  i32, in or out, is TOPOS_ERR_DTYPE. */
TOPOS_API topos_tensor *topos_tensor_convert(const topos_tensor *t,
                                             topos_dtype to, topos_error *err);

/* -------------------------------------------------------- tape and network */

typedef struct topos_tape topos_tape;
typedef struct topos_network topos_network;

/* A value is a small handle naming one node of one tape.  It stays valid for
 * the network sealed from that tape.  index < 0 means "invalid / none". */
typedef struct topos_value {
  uint32_t tape;
  int32_t index;
} topos_value;

#define TOPOS_NONE ((topos_value){0, -1})

static inline bool topos_value_ok(topos_value v) {
  return v.index >= 0;
}

/* New tape (caller seals it or frees it).  `dtype` is the tape's floating
 * dtype: composites record their constants in it.  NULL on a bad dtype. */
TOPOS_API topos_tape *topos_tape_new(topos_dtype dtype);
TOPOS_API void topos_tape_free(topos_tape *tape);
TOPOS_API topos_dtype topos_tape_dtype(const topos_tape *tape);
/* The first recording error (borrowed), or NULL when there is none. */
TOPOS_API const char *topos_tape_error(const topos_tape *tape);
TOPOS_API int topos_tape_node_count(const topos_tape *tape);

/* Leaves.  The tensor is retained, not copied (tensors are immutable).
 * Parameters and inputs are numbered in recording order ("slots"). */
TOPOS_API topos_value topos_parameter(topos_tape *tape,
                                      const topos_tensor *initial);
TOPOS_API topos_value topos_input(topos_tape *tape,
                                  const topos_tensor *default_value);
TOPOS_API topos_value topos_constant(topos_tape *tape,
                                     const topos_tensor *tensor);
/* A rank-0 constant in the tape's dtype. */
TOPOS_API topos_value topos_scalar(topos_tape *tape, double value);

/* Names a value (unique per tape; 1..255 bytes of UTF-8 without NUL);
 * returns the value for chaining. */
TOPOS_API topos_value topos_name(topos_tape *tape, topos_value value,
                                 const char *name);

/* Records a caller's own error on the tape, as a composite written outside
 * the engine must when its arguments do not fit: like any recording
 * error, the first one sticks ("<message> (at node N)") and sealing
 * returns it.  Returns TOPOS_NONE. */
TOPOS_API topos_value topos_tape_fail(topos_tape *tape, int code,
                                      const char *message);

/* What was inferred for a recorded value.  shape: borrowed, `*rank` set;
 * NULL for an invalid or foreign value.  The pointer is valid until the
 * next recording call on the tape (node storage may move): copy it. */
TOPOS_API topos_dtype topos_value_dtype(const topos_tape *tape, topos_value v);
TOPOS_API const int64_t *topos_value_shape(const topos_tape *tape,
                                           topos_value v, int *rank);

/* Elementwise: identical shapes and dtypes, no implicit broadcasting.
 * add also accepts two i32 operands (index arithmetic, no gradient). */
TOPOS_API topos_value topos_add(topos_tape *tape, topos_value a, topos_value b);
TOPOS_API topos_value topos_sub(topos_tape *tape, topos_value a, topos_value b);
TOPOS_API topos_value topos_mul(topos_tape *tape, topos_value a, topos_value b);
TOPOS_API topos_value topos_div(topos_tape *tape, topos_value a, topos_value b);
TOPOS_API topos_value topos_neg(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_exp(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_log(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_sqrt(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_tanh(topos_tape *tape, topos_value a);
/* The error function, erf(a) = 2/√π ∫₀^a exp(−t²) dt (the C library's
 * erff / erf once per element; bf16 through f32). */
TOPOS_API topos_value topos_erf(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_pow(topos_tape *tape, topos_value a,
                                double exponent);
TOPOS_API topos_value topos_maximum(topos_tape *tape, topos_value a,
                                    topos_value b);
TOPOS_API topos_value topos_step(topos_tape *tape, topos_value a,
                                 topos_value b);
TOPOS_API topos_value topos_relu(topos_tape *tape, topos_value a);

/* Linear algebra and layout. */
/* a[m,k]·b[k,n] -> [m,n]; or batched a[B,m,k]·b[B,k,n] -> [B,m,n]. */
TOPOS_API topos_value topos_matmul(topos_tape *tape, topos_value a,
                                   topos_value b);
TOPOS_API topos_value topos_transpose(topos_tape *tape,
                                      topos_value a); /* rank 2 */
TOPOS_API topos_value topos_permute(topos_tape *tape, topos_value a,
                                    const int *perm);
TOPOS_API topos_value topos_reshape(topos_tape *tape, topos_value a, int rank,
                                    const int64_t *shape);
TOPOS_API topos_value topos_narrow(topos_tape *tape, topos_value a, int axis,
                                   int64_t start, int64_t length);
TOPOS_API topos_value topos_pad(topos_tape *tape, topos_value a, int axis,
                                int64_t before, int64_t after);
TOPOS_API topos_value topos_unfold(topos_tape *tape, topos_value a, int axis,
                                   int64_t size, int64_t step,
                                   int64_t dilation);
/* Inverse shape of unfold: axes (axis, axis+1) = (count, size) -> extent;
 * overlapping windows add. */
TOPOS_API topos_value topos_fold(topos_tape *tape, topos_value a, int axis,
                                 int64_t extent, int64_t size, int64_t step,
                                 int64_t dilation);
TOPOS_API topos_value topos_concat(topos_tape *tape, int n,
                                   const topos_value *values, int axis);
TOPOS_API topos_value topos_broadcast(topos_tape *tape, topos_value a, int rank,
                                      const int64_t *shape);
TOPOS_API topos_value topos_broadcast_along(topos_tape *tape, topos_value a,
                                            int axis, int64_t extent);

/* Reductions and fused rows. */
TOPOS_API topos_value topos_sum(topos_tape *tape, topos_value a);
TOPOS_API topos_value topos_sum_along(topos_tape *tape, topos_value a,
                                      int axis);
TOPOS_API topos_value topos_max_along(topos_tape *tape, topos_value a,
                                      int axis);
TOPOS_API topos_value topos_log_softmax(topos_tape *tape, topos_value a,
                                        int axis);
TOPOS_API topos_value topos_logsumexp(topos_tape *tape, topos_value a,
                                      int axis);

/* Indexing.  gather(table[V,d], idx i32[n]) -> [n,d];
 * scatter(rows[n,d], idx i32[n]; V) -> [V,d], rows with equal index add. */
TOPOS_API topos_value topos_gather(topos_tape *tape, topos_value table,
                                   topos_value idx);
TOPOS_API topos_value topos_scatter(topos_tape *tape, topos_value rows,
                                    topos_value idx, int64_t extent);

/* ------------------------------------------------- generic node access */

/* One node of a sealed network, or the attributes of a node to record
 * generically.  op is the op code (the numbering of proto/topos.proto's
 * Op, frozen); pointers are borrowed from the network.  Each op reads
 * only the attributes it names (docs/encoding.md). */
typedef struct topos_node_info {
  int op;
  const char *op_name;
  int nin;
  const int32_t *operands; /* node indices of earlier nodes */
  topos_dtype dtype;
  int rank;
  const int64_t *shape;
  const char *name; /* NULL when unnamed */
  int axis;
  int64_t start, length, before, after, size, step, dilation, extent;
  double p;
  const int *perm;            /* permute: rank entries */
  int target_rank;            /* reshape / broadcast */
  const int64_t *target;      /* reshape / broadcast: target_rank extents */
  const topos_tensor *tensor; /* constant, parameter, input */
  int slot;                   /* parameter, input */
} topos_node_info;

/* Fills *out with node `index` of net.  Returns a topos_status. */
TOPOS_API int topos_network_node(const topos_network *net, int index,
                                 topos_node_info *out, topos_error *err);
/* Records op `op` with these operands and the attributes in *at (dtype,
 * rank, shape, name, operands and slot of *at are ignored); the same
 * checks as the per-op calls.  An unknown op fails the tape. */
TOPOS_API topos_value topos_record(topos_tape *tape, int op,
                                   const topos_value *operands, int n,
                                   const topos_node_info *at);
/* The op code of a name ("matmul"), or -1. */
TOPOS_API int topos_op_code(const char *name);
/* The number of ops (valid codes are 0 .. count-1). */
TOPOS_API int topos_op_count(void);

/* Consumes the tape.  Returns a new network (release it), or NULL when the
 * tape recorded an error, which is copied into err. */
TOPOS_API topos_network *topos_tape_seal(topos_tape *tape, topos_error *err);

TOPOS_API topos_network *topos_network_retain(const topos_network *net);
TOPOS_API void topos_network_release(topos_network *net);

TOPOS_API int topos_network_node_count(const topos_network *net);
/* The tape dtype the network was recorded with (f32 for NULL). */
TOPOS_API topos_dtype topos_network_dtype(const topos_network *net);
/* The value of node `index`, or TOPOS_NONE when out of range. */
TOPOS_API topos_value topos_network_value(const topos_network *net, int index);
TOPOS_API int topos_network_parameter_count(const topos_network *net);
TOPOS_API int topos_network_input_count(const topos_network *net);
TOPOS_API topos_value topos_network_parameter(const topos_network *net,
                                              int slot);
TOPOS_API topos_value topos_network_input(const topos_network *net, int slot);
/* The value with this name, or TOPOS_NONE. */
TOPOS_API topos_value topos_network_find(const topos_network *net,
                                         const char *name);
/* Borrowed name, or NULL. */
TOPOS_API const char *topos_network_name_of(const topos_network *net,
                                            topos_value v);
TOPOS_API topos_dtype topos_network_value_dtype(const topos_network *net,
                                                topos_value v);
TOPOS_API const int64_t *topos_network_value_shape(const topos_network *net,
                                                   topos_value v, int *rank);

typedef enum topos_format {
  TOPOS_FORMAT_TEXT = 0, /* one line per node */
  /* {"nodes":[{"index","name"|null,"op","operands","dtype","shape",
   * "role": parameter|input|constant|output|value,"slot","attrs"}],
   * "parameters","inputs","dtype"}; integers exact, exponents round-trip */
  TOPOS_FORMAT_JSON = 1,
  /* digraph topos: a node per node, an edge per operand labelled with its
   * position; names escaped */
  TOPOS_FORMAT_DOT = 2
} topos_format;

/* Text: one line per node: index, name, op, operands, dtype, shape, role.
 * JSON and DOT carry the same facts.  New string, free with topos_free. */
TOPOS_API char *topos_network_describe(const topos_network *net,
                                       topos_format format, topos_error *err);

/* -------------------------------------------------- parameters and fields */

typedef struct topos_params topos_params; /* one tensor per slot */
typedef struct topos_field topos_field;   /* one tensor per node */

/* Fresh copies of the network's initial parameters, in slot order (new). */
TOPOS_API topos_params *topos_network_parameters(const topos_network *net);
/* A parameter set from n tensors (retained, not copied). */
TOPOS_API topos_params *topos_params_new(int n, topos_tensor *const *tensors,
                                         topos_error *err);
TOPOS_API void topos_params_free(topos_params *p);
TOPOS_API int topos_params_count(const topos_params *p);
/* Borrowed; NULL when slot is out of range. */
TOPOS_API const topos_tensor *topos_params_get(const topos_params *p, int slot);
/* A new set equal to p with one slot replaced (tensor retained). */
TOPOS_API topos_params *topos_params_with(const topos_params *p, int slot,
                                          const topos_tensor *tensor,
                                          topos_error *err);
TOPOS_API bool topos_params_bitwise_equal(const topos_params *a,
                                          const topos_params *b);
/* Whether params fit net's parameter slots: their count, and each slot's
 * dtype and shape (the check topos_forward makes).  NULL fits (the
 * initials).  Returns a topos_status. */
TOPOS_API int topos_network_check_params(const topos_network *net,
                                         const topos_params *params,
                                         topos_error *err);

/* Elementwise algebra.  Operands must match slot by slot in dtype and
 * shape.  add computes a+b in the dtype; scale computes x*s with s
 * rounded to the dtype; map/zip call fn per element with the elements
 * widened to double and round the result to the dtype.  New results. */
typedef double (*topos_map_fn)(double x, void *ctx);
typedef double (*topos_zip_fn)(double a, double b, void *ctx);

TOPOS_API topos_params *topos_params_add(const topos_params *a,
                                         const topos_params *b,
                                         topos_error *err);
TOPOS_API topos_params *topos_params_scale(const topos_params *a, double s,
                                           topos_error *err);
TOPOS_API topos_params *topos_params_map(const topos_params *a, topos_map_fn fn,
                                         void *ctx, topos_error *err);
TOPOS_API topos_params *topos_params_zip(const topos_params *a,
                                         const topos_params *b, topos_zip_fn fn,
                                         void *ctx, topos_error *err);

/* Fields: one tensor per node of a network (gradients, for example). */
TOPOS_API void topos_field_free(topos_field *f);
/* Borrowed tensor of one node. */
TOPOS_API const topos_tensor *topos_field_of(const topos_field *f,
                                             topos_value v, topos_error *err);
/* The field's tensors at the network's parameter nodes, slot order (new). */
TOPOS_API topos_params *topos_parameters_of(const topos_field *f,
                                            topos_error *err);
TOPOS_API topos_field *topos_field_add(const topos_field *a,
                                       const topos_field *b, topos_error *err);
TOPOS_API topos_field *topos_field_scale(const topos_field *a, double s,
                                         topos_error *err);
TOPOS_API topos_field *topos_field_map(const topos_field *a, topos_map_fn fn,
                                       void *ctx, topos_error *err);
TOPOS_API topos_field *topos_field_zip(const topos_field *a,
                                       const topos_field *b, topos_zip_fn fn,
                                       void *ctx, topos_error *err);

/* ------------------------------------------------------ execution contexts */

typedef enum topos_numerics {
  TOPOS_NUMERICS_EXACT = 0, /* the reference's bits */
  TOPOS_NUMERICS_FAST = 1   /* may also use envelope backends (blas) */
} topos_numerics;

/* The most threads a context or entry may ask for (and TOPOS_THREADS's
 * cap). */
#define TOPOS_THREADS_MAX 1024
/* The most backends the registry holds (the reference included). */
#define TOPOS_BACKENDS_MAX 16

/* What ran under a context: per registry index (topos_backends_list's
 * order; 0 is the reference), the number of tasks that backend ran.  The
 * reference's count is the tasks no backend took.  Zero it before a run;
 * runs add to it (one report per concurrent run). */
typedef struct topos_exec_report {
  uint64_t tasks[TOPOS_BACKENDS_MAX];
} topos_exec_report;

/*
 * How a call executes: the numerics, the threads, the backend, and when to
 * stop.  Every run takes one (forward, backward, gradients, plan runs,
 * steps, conformance); NULL means the documented default: exact numerics,
 * the process's default threads, the `auto` backend choice, no
 * cancellation and no deadline.  (For plan runs NULL means the plan's
 * entry: its numerics and threads.)  Zero-initialise and set what you
 * need.  Results never depend on threads; under exact they never depend on
 * the backend either.
 *
 * Backend choice (docs/backends.md, "Choosing a backend"):
 *  - NULL or "" (`auto`): every registered backend the numerics allows, in
 *    registration order (backends marked named_only, such as test
 *    backends, join only when named);
 *  - "reference": no backend at all, the reference kernels only;
 *  - a registered name: that backend first; a task it declines goes to the
 *    exact backends in registration order, then to the reference, never to
 *    a looser fidelity than asked.  An envelope backend under exact
 *    numerics, or an unknown name, is TOPOS_ERR_ARGUMENT naming the known
 *    backends.
 */
typedef struct topos_exec {
  topos_numerics numerics;
  /* The most threads each backend task may use: 0 = the process default
   * (TOPOS_THREADS, else the online cores); 1..TOPOS_THREADS_MAX = that
   * many, above the default too (each backend caps it at its pool). */
  int threads;
  const char *backend;
  /* Asked at every node boundary, and inside long nodes between blocks
   * of a few milliseconds of work (kernels.c, exec.c); true stops the run
   * with TOPOS_ERR_CANCELLED, releasing what it built.  Called from the
   * run's own thread; it must be cheap and thread-safe. */
  topos_cancel_fn cancel;
  void *cancel_ctx;
  /* CLOCK_MONOTONIC nanoseconds after which a run stops at its next node
   * boundary or block with TOPOS_ERR_DEADLINE; 0 = none. */
  int64_t deadline_ns;
  topos_exec_report *report; /* optional: what ran */
} topos_exec;

/* The monotonic clock deadlines are read against, in nanoseconds. */
TOPOS_API int64_t topos_now_ns(void);

/* A backend as the registry describes it.  `tasks` has bit 1 << k for each
 * topos_task_kind it may take (backend.h: GEMM 0, WINDOW 1, REDUCE 2, MAP
 * 3, ATTENTION 4), `dtypes` 1 << d for each topos_dtype; `fidelity` is "exact"
 * or "envelope"; `device` the ISA or device it runs on; `threads` the most
 * threads one of its tasks uses; `tasks_run` the tasks it has run in this
 * process. */
typedef struct topos_backend_info {
  int index; /* registry index: 0 is the reference */
  char name[32];
  char fidelity[16];
  unsigned tasks;
  unsigned dtypes;
  char device[96];
  int threads;
  uint64_t tasks_run;
} topos_backend_info;

/* The registry: the reference first, then the backends in registration
 * order.  Fills out[0..max) and returns how many there are (may exceed
 * max). */
TOPOS_API int topos_backends_list(topos_backend_info *out, int max);
/* The ops a task kind covers, as text ("matmul", "sum, sum_along", ...). */
TOPOS_API const char *topos_task_ops(int kind);
/* Checks that a context can run (threads in range, the backend known and
 * allowed by the numerics).  Returns a topos_status. */
TOPOS_API int topos_exec_check(const topos_exec *ctx, topos_error *err);
/* The names of the backends a report says ran a task, comma-separated,
 * into buf ("reference" included when it ran one).  Returns buf. */
TOPOS_API char *topos_exec_report_names(const topos_exec_report *report,
                                        char *buf, size_t len);

/* ------------------------------------------------- interpreter and backward */

typedef struct topos_run topos_run;

typedef struct topos_feed {
  topos_value input;          /* an input value of the network */
  const topos_tensor *tensor; /* same dtype and shape as its default */
} topos_feed;

/* Evaluates every node.  params NULL means the network's initials; inputs
 * without a feed take their defaults.  New run (topos_run_free), or NULL
 * with err.  Neither the network nor params are modified. */
TOPOS_API topos_run *topos_forward(const topos_network *net,
                                   const topos_params *params,
                                   const topos_feed *feeds, int nfeeds,
                                   const topos_exec *ctx, topos_error *err);
/* Evaluates only the ancestors of the targets. */
TOPOS_API topos_run *topos_forward_for(const topos_network *net,
                                       const topos_params *params,
                                       const topos_feed *feeds, int nfeeds,
                                       const topos_value *targets, int ntargets,
                                       const topos_exec *ctx, topos_error *err);
TOPOS_API void topos_run_free(topos_run *run);
/* Borrowed value of a node; an unevaluated node is an error (NULL). */
TOPOS_API const topos_tensor *topos_run_of(const topos_run *run, topos_value v,
                                           topos_error *err);
/* A rank-0 value widened to double; NaN with err on failure. */
TOPOS_API double topos_run_scalar(const topos_run *run, topos_value v,
                                  topos_error *err);

/* Gradient of a rank-0 target with respect to every node (new field).
 * Nodes outside the target's ancestors get exact zeros. */
TOPOS_API topos_field *topos_backward(const topos_run *run, topos_value target,
                                      const topos_exec *ctx, topos_error *err);

/* The gradient of a rank-0 target with respect to the parameters only,
 * as new params in slot order: the bits of
 * topos_parameters_of(topos_backward(run, target)), but no cotangent flows
 * into a branch that reaches no parameter (inputs, constants, index
 * arithmetic), so a training step does only the work its update needs. */
TOPOS_API topos_params *topos_gradients(const topos_run *run,
                                        topos_value target,
                                        const topos_exec *ctx,
                                        topos_error *err);

/* ------------------------------------------- canonical encoding and the id */

/* The canonical byte form of a sealed network (docs/encoding.md): versioned,
 * little-endian, every node's op, attributes, operands, dtype, shape and
 * name, and the tensors of its leaves.  Equal networks give equal bytes.
 * *bytes is new (free with topos_free); on failure *bytes is NULL and *len
 * 0.  Returns a topos_status. */
TOPOS_API int topos_network_encode(const topos_network *net, uint8_t **bytes,
                                   size_t *len, topos_error *err);
/* Decodes by replaying every node through the recording API, so a decoded
 * network is checked exactly as a recorded one.  Hostile bytes give an
 * error, never a crash or an allocation larger than the input implies.
 * New network, or NULL with err: TOPOS_ERR_CORRUPT for bytes that are not
 * the encoding of a valid network (the message starts "decode: " and
 * names the node), TOPOS_ERR_ARGUMENT for NULL bytes, TOPOS_ERR_MEMORY.
 * A network that decodes re-encodes to exactly `bytes`. */
TOPOS_API topos_network *topos_network_decode(const uint8_t *bytes, size_t len,
                                              topos_error *err);
/* Lowercase hex SHA-256 of the encoding, into out[65] (NUL-terminated;
 * "" on failure).  Returns a topos_status. */
TOPOS_API int topos_network_id(const topos_network *net, char out[65],
                               topos_error *err);
/* The same hash of any bytes (store and blob ids); bytes may be NULL when
 * len is 0. */
TOPOS_API void topos_sha256_hex(const void *bytes, size_t len, char out[65]);

/* ----------------------------------------------------------- differentiate */

/* Appends the gradient computation of rank-0 `loss` with respect to each
 * of wrt[0..n) to the tape as ordinary nodes, using the same adjoint rules
 * and accumulation order as topos_backward, and writes the gradient values
 * to grads_out (a value outside the loss's ancestors gets a recorded zero).
 * Returns a topos_status; on failure the tape carries the error. */
TOPOS_API int topos_tape_differentiate(topos_tape *tape, topos_value loss,
                                       const topos_value *wrt, int n,
                                       topos_value *grads_out);

/* ------------------------------------------------------------------- plans */

typedef enum topos_posture {
  TOPOS_POSTURE_FORWARD = 0, /* forward only: buffers die at last use */
  TOPOS_POSTURE_TRAINING = 1 /* keeps what backward reads; roots[0] = loss */
} topos_posture;

/* What to compile: the values the caller wants (roots), values it also
 * wants to read (observes), the posture, and the numerics and threads its
 * runs use by default (when a run is given no context).  `threads` is last so
 * that positional initialisers that stop at `numerics` keep meaning 0. */
typedef struct topos_entry {
  const topos_value *roots;
  int nroots;
  const topos_value *observes;
  int nobserves;
  topos_posture posture;
  topos_numerics numerics;
  /* The most threads each backend task of this plan's runs may use:
   * 0 = the process default (TOPOS_THREADS, else the online cores);
   * 1..TOPOS_THREADS_MAX = exactly that many asked for, above the default
   * too (each backend still caps it at what its pool can give).  Results
   * never depend on it. */
  int threads;
} topos_entry;

typedef struct topos_plan topos_plan;

/* Compiles an entry: dead-node elimination, the keep-set (roots and
 * observes), liveness and free lists, static peak bytes, and pattern
 * groups (fused convolution and max-pool chains).  New plan
 * (topos_plan_free), or NULL with err (TOPOS_ERR_ARGUMENT for threads
 * outside 0..TOPOS_THREADS_MAX).  The plan retains the network. */
TOPOS_API topos_plan *topos_network_lower(const topos_network *net,
                                          const topos_entry *entry,
                                          topos_error *err);
TOPOS_API void topos_plan_free(topos_plan *plan);
/* Bytes of the largest set of buffers alive at once (views and the
 * caller's parameters and feeds are not counted). */
TOPOS_API size_t topos_plan_peak_bytes(const topos_plan *plan);
/* Number of fused pattern groups the plan elected. */
TOPOS_API int topos_plan_group_count(const topos_plan *plan);
/* The entry's threads the plan runs with (0 = the process default). */
TOPOS_API int topos_plan_threads(const topos_plan *plan);

/*
 * What running a plan costs in memory: upper bounds, in bytes, of what
 * each call allocates at once - tensor buffers at the pool's capacities
 * (pool.c), compute-type copies and kernel scratch, tensor structs and
 * the run's tables - for admission control (the daemon refuses a run
 * whose bound is over its budget before anything is allocated).  The
 * caller's own parameters, feeds and state are not counted (they exist
 * before the call), nor are a backend's per-thread packing buffers (kept
 * for the thread's life).  Computed when the plan is lowered; a training
 * plan's backward figures the first time they are asked for (metering
 * the reverse scan costs about what a backward's bookkeeping does).
 */
typedef struct topos_run_bytes {
  size_t forward;  /* topos_plan_forward, at its peak */
  size_t retained; /* what the run it returns holds */
  /* Training plans (0 for forward ones), on top of the run's `retained`:
   * topos_plan_gradients and topos_plan_backward at their peaks, and what
   * the gradients topos_plan_gradients returns hold. */
  size_t gradients, backward, gradients_held;
  /* topos_conformance_run with any number of candidates: the reference
   * interpreter's run (which frees nothing) and, for training plans, its
   * gradients, plus one candidate's run at a time. */
  size_t conformance;
  /* Data bytes (raw, not pool capacities) of one set of the network's
   * parameters, of one set of optimizer moments for them (f32 for bf16
   * parameters), of a feed for every input, and of the roots and
   * observes: what decoding a request's tensors or encoding a reply's
   * takes. */
  size_t parameters, moments, inputs, outputs;
} topos_run_bytes;

/* Fills *out for plan (all zero for NULL). */
TOPOS_API void topos_plan_run_bytes(const topos_plan *plan,
                                    topos_run_bytes *out);

/* A bound of the device memory a run of plan holds at once when a device
 * backend takes its tasks (docs/cuda.md: a device runs one task at a
 * time, so a run's device peak is its largest task): over the plan's
 * nodes and fused groups, the elements of the operands a task reads plus
 * those of its output, and in a training plan those of the operands'
 * gradients its adjoint writes as well.  Counted by elements, not by the
 * spans a strided view covers (a column slice reads its elements only
 * here).  0 for NULL. */
TOPOS_API size_t topos_plan_device_bytes(const topos_plan *plan);

/* An upper bound of what topos_plan_step allocates at once under opt:
 * the forward, the gradients and the optimizer's new parameters and
 * moments with their conversions, plus a copy of the initial parameters
 * when the step is given none (params_given false) and a fresh state when
 * it is given none (state_given false).  0 for a forward plan. */
struct topos_optimizer;
TOPOS_API size_t topos_plan_step_bytes(const topos_plan *plan,
                                       const struct topos_optimizer *opt,
                                       bool params_given, bool state_given);

/*
 * The buffer pool: tensor buffers freed by runs are kept for the next
 * run (first touch of fresh pages is slow), at most a cap of idle bytes
 * (TOPOS_POOL_BYTES, else 1 GiB).  A process that serves runs of very
 * different sizes lowers the cap, or releases idle buffers after a large
 * run, so one large run does not pin its memory.
 */
/* Sets the cap; idle buffers above it are freed at once, largest first. */
TOPOS_API void topos_pool_set_cap(size_t idle_bytes);
TOPOS_API size_t topos_pool_cap(void);
/* Frees idle buffers, largest first, until at most `keep` bytes are idle. */
TOPOS_API void topos_pool_release(size_t keep);
TOPOS_API size_t topos_pool_idle_bytes(void);
/* The schedule, liveness spans, fused groups and peak bytes as text (new,
 * topos_free). */
TOPOS_API char *topos_plan_describe(const topos_plan *plan, topos_error *err);

/* The context a plan's runs get when given none: the entry's numerics and
 * threads, the auto backend, no cancellation or deadline. */
TOPOS_API topos_exec topos_plan_exec(const topos_plan *plan);

/* Memory footprints (footprint.c): the heap memory an object keeps,
 * rounded as malloc rounds blocks, tensor buffers at their capacity; for
 * caches bounded in bytes.  A network counts its nodes, operand lists,
 * names and leaf tensors; a plan only its own tables (the network it
 * retains is the network's figure); a tensor its struct and buffer. */
TOPOS_API size_t topos_network_memory_bytes(const topos_network *net);
TOPOS_API size_t topos_plan_memory_bytes(const topos_plan *plan);
TOPOS_API size_t topos_tensor_memory_bytes(const topos_tensor *t);

/* Runs the plan: bits identical to topos_forward under exact numerics.
 * Only roots and observes can be read from the run (anything else is an
 * error, even if its buffer happens to survive).  ctx NULL is
 * topos_plan_exec(plan); a given ctx governs the run entirely. */
TOPOS_API topos_run *topos_plan_forward(const topos_plan *plan,
                                        const topos_params *params,
                                        const topos_feed *feeds, int nfeeds,
                                        const topos_exec *ctx,
                                        topos_error *err);
/* Training posture: the gradient of the plan's first root (rank 0) with
 * respect to every node, from a run of this plan: bits identical to
 * topos_backward under exact numerics.  ctx NULL is topos_plan_exec(plan). */
TOPOS_API topos_field *topos_plan_backward(const topos_plan *plan,
                                           const topos_run *run,
                                           const topos_exec *ctx,
                                           topos_error *err);
/* Training posture: the parameters' gradients of the plan's first root,
 * the bits of topos_parameters_of(topos_plan_backward(...)), computing
 * only what reaches a parameter (see topos_gradients). */
TOPOS_API topos_params *topos_plan_gradients(const topos_plan *plan,
                                             const topos_run *run,
                                             const topos_exec *ctx,
                                             topos_error *err);

typedef enum topos_emit_form {
  TOPOS_EMIT_PRETTY = 0, /* the custom assembly people read */
  TOPOS_EMIT_GENERIC = 1 /* quoted op names, what mlir-opt parses */
} topos_emit_form;

/* The plan as a StableHLO MLIR module: func.func @main(parameters...,
 * inputs...) -> (roots..., observes...).  An op that cannot lower gives an
 * error naming the node, never malformed text.  New string (topos_free). */
TOPOS_API char *topos_plan_emit_stablehlo(const topos_plan *plan,
                                          topos_emit_form form,
                                          topos_error *err);

/* ------------------------------------------------------------ conformance */

/* One compared output of a conformance row: a root, an observe, or (for a
 * training plan) the gradient of one parameter slot. */
typedef struct topos_conformance_output {
  char what[64]; /* "root 0 (loss)", "observe 1", "gradient 2 (w1)" */
  topos_dtype dtype;
  int64_t count;
  bool bit_identical;
  bool holds;          /* exact: bit-identical; fast: within the envelope */
  double max_ulp;      /* largest ulp distance (inf: NaN where none) */
  double max_relative; /* largest |got - ref| / max(|got|, |ref|) */
  double rel_l2;       /* ||got - ref||2 / ||ref||2, the envelope's measure */
  double envelope;     /* the rel_l2 bound (0 under exact) */
} topos_conformance_output;

/* One candidate context compared with the reference. */
typedef struct topos_conformance_row {
  char backend[32]; /* the candidate's backend ("auto" for NULL) */
  topos_numerics numerics;
  const char *fidelity; /* what was promised: "exact" or "envelope" */
  bool holds;           /* every output holds */
  bool bit_identical;   /* every output bit-identical */
  double max_ulp, max_relative, rel_l2; /* the worst over the outputs */
  char ran[160];  /* the backends that ran tasks, comma-separated */
  char note[320]; /* why a row failed to run, or a summary */
  int noutputs;
  topos_conformance_output *outputs;
} topos_conformance_row;

typedef struct topos_conformance {
  char reference_ran[160]; /* what the reference run ran ("reference") */
  int nrows;
  topos_conformance_row *rows;
} topos_conformance;

/*
 * Runs the plan under the reference context (backend "reference", exact)
 * and under each candidate context, and compares every root and observe
 * and, for a training plan, every parameter gradient: a candidate under
 * exact numerics must be bit-identical, one under fast must hold
 * numerics.md's envelope (rel_l2 <= 1e-5 f32, 1e-12 f64, 1e-2 bf16; NaN
 * and Inf where the reference has them).  A candidate that fails to run
 * is a row that does not hold, with the error in its note.  Cancellation
 * and deadlines are read from the first candidate.  New result
 * (topos_conformance_free), or NULL with err when the reference run
 * fails or an argument is bad (an unknown backend, ...).
 */
TOPOS_API topos_conformance *topos_conformance_run(
    const topos_plan *plan, const topos_params *params, const topos_feed *feeds,
    int nfeeds, const topos_exec *candidates, int ncandidates,
    topos_error *err);
TOPOS_API void topos_conformance_free(topos_conformance *c);

/* --------------------------------------------------------------- optimizers */

typedef enum topos_optimizer_kind {
  TOPOS_SGD = 0,
  TOPOS_ADAM = 1,
  TOPOS_ADAMW = 2
} topos_optimizer_kind;

/* Which slots AdamW decays; NULL means "rank >= 2". */
typedef bool (*topos_decay_fn)(int slot, const topos_tensor *param, void *ctx);

typedef struct topos_optimizer {
  topos_optimizer_kind kind;
  double lr;
  double momentum;     /* SGD; 0 = plain SGD */
  double beta1, beta2; /* Adam, AdamW */
  double eps;          /* Adam, AdamW */
  double weight_decay; /* SGD, Adam: L2 added to the gradient; AdamW:
                          decoupled, on the slots `decay` selects */
  topos_decay_fn decay;
  void *decay_ctx;
} topos_optimizer;

TOPOS_API topos_optimizer topos_sgd(double lr, double momentum);
TOPOS_API topos_optimizer topos_adam(double lr, double beta1, double beta2,
                                     double eps);
TOPOS_API topos_optimizer topos_adamw(double lr, double beta1, double beta2,
                                      double eps, double weight_decay);

/* Optimizer state: the step count and the moments (caller-held values). */
typedef struct topos_opt_state topos_opt_state;

/* Zero state for these parameters (new). */
TOPOS_API topos_opt_state *topos_opt_state_new(const topos_optimizer *opt,
                                               const topos_params *params,
                                               topos_error *err);
/* A state from its parts (moments retained; either may be NULL when the
 * optimizer needs none), e.g. after crossing the wire. */
TOPOS_API topos_opt_state *topos_opt_state_from(int64_t step,
                                                const topos_params *m,
                                                const topos_params *v,
                                                topos_error *err);
TOPOS_API void topos_opt_state_free(topos_opt_state *s);
TOPOS_API int64_t topos_opt_state_step(const topos_opt_state *s);
/* Borrowed moments: 0 = first (momentum / m), 1 = second (v); may be NULL. */
TOPOS_API const topos_params *topos_opt_state_moment(const topos_opt_state *s,
                                                     int which);

/* (params, grads, state) -> (params', state').  Pure: reads its inputs and
 * writes two new values.  Returns a topos_status. */
TOPOS_API int topos_optimizer_step(
    const topos_optimizer *opt, const topos_params *params,
    const topos_params *grads, const topos_opt_state *state,
    topos_params **params_out, topos_opt_state **state_out, topos_error *err);
/* Whether topos_optimizer_step could take (params, state) under opt: the
 * hyperparameters, floating parameters, and moments that match them.
 * state NULL checks opt and params only.  Returns a topos_status. */
TOPOS_API int topos_optimizer_check(const topos_optimizer *opt,
                                    const topos_params *params,
                                    const topos_opt_state *state,
                                    topos_error *err);

/* ---------------------------------------------------------- training steps */

/* What one training step gives.  Every pointer is new and owned by the
 * result: release them all with topos_step_result_clear.  A failed step
 * leaves every field zero. */
typedef struct topos_step_result {
  topos_params *params;   /* the parameters after the update */
  topos_opt_state *state; /* the optimizer state after it */
  double loss;            /* the loss of the step's forward, widened exactly */
  /* The forward run (topos_run_of reads its roots and observes); NULL from
   * a trainer that keeps no run (the remote one). */
  topos_run *run;
  /* The observes' values, entry order (nobserves 0 when none were asked). */
  int nobserves;
  topos_tensor **observes;
} topos_step_result;

/* Releases what r holds and zeroes it; a zeroed result or NULL is a no-op. */
TOPOS_API void topos_step_result_clear(topos_step_result *r);

/*
 * One training step of a TRAINING-posture plan whose roots[0] is the
 * rank-0 loss: topos_plan_forward, topos_plan_gradients and
 * topos_optimizer_step in one call, with their bits exactly.  params NULL
 * means the network's initial parameters, state NULL a fresh state
 * (topos_opt_state_new).  ctx NULL is topos_plan_exec(plan); a given ctx
 * governs the forward and the gradients (cancellation and the deadline
 * are checked throughout).  Nothing given is modified.  Fills *out;
 * returns a topos_status (TOPOS_ERR_STATE for a forward-only plan), and
 * on failure *out is all zero.  Bad optimizer settings and a state that
 * does not fit params fail before any work is done.
 */
TOPOS_API int topos_plan_step(
    const topos_plan *plan, const topos_params *params, const topos_feed *feeds,
    int nfeeds, const topos_optimizer *opt, const topos_opt_state *state,
    const topos_exec *ctx, topos_step_result *out, topos_error *err);

/*
 * topos_plan_step with the caller's parameters and state *donated*, for
 * loops that drop the old values after every step: the bits are
 * topos_plan_step's, but the update may reuse the donated buffers.  Where
 * a donated parameter tensor is held by nothing else (no other reference
 * to it, no view of its buffer, not an observe), plain SGD on f32/f64
 * writes it in place - the update that allocates nothing and cannot fail
 * midway; every other slot, and every other optimizer, goes to new
 * buffers.  On success *params and *state are consumed and set to NULL
 * (out holds the new values) and out->run is NULL (the run lets go of
 * the parameters before the update; the loss and observes are in out).
 * On failure nothing is consumed or changed.  *params NULL means the
 * network's initials, *state NULL a fresh state, as in topos_plan_step.
 */
TOPOS_API int topos_plan_step_donated(
    const topos_plan *plan, topos_params **params, const topos_feed *feeds,
    int nfeeds, const topos_optimizer *opt, topos_opt_state **state,
    const topos_exec *ctx, topos_step_result *out, topos_error *err);

/*
 * A trainer: where training steps run, behind one call, so a training loop
 * is written once and runs in-process (topos_trainer_local) or on a daemon
 * (topos_client_trainer in topos_client.h) with the same bits.  The state
 * stays the caller's: every step is a pure function of (params, feeds,
 * opt, state), and the optimizer is given per step so schedules need no
 * setter.  The two trainers topos provides may be stepped from several
 * threads at once.
 */
typedef struct topos_trainer topos_trainer;

/* An implementation: `step` has topos_trainer_step's contract (out is
 * zeroed before it is called and cleared after it fails); `free` releases
 * self.  `kind` names it in messages ("local", "remote"). */
typedef struct topos_trainer_ops {
  const char *kind;
  int (*step)(void *self, const topos_params *params, const topos_feed *feeds,
              int nfeeds, const topos_optimizer *opt,
              const topos_opt_state *state, topos_step_result *out,
              topos_error *err);
  void (*free)(void *self);
} topos_trainer_ops;

/* A trainer over ops (borrowed: static storage) and self, which it owns
 * from here on, even when this fails (NULL with err). */
TOPOS_API topos_trainer *topos_trainer_new(const topos_trainer_ops *ops,
                                           void *self, topos_error *err);
/* In-process: lowers the training plan of (loss; observes) once, with the
 * numerics and threads of ctx (NULL: exact, the process default), and
 * steps it with topos_plan_step under a copy of ctx.  The trainer retains
 * net.  New trainer, or NULL with err (a loss that is not a rank-0 float,
 * a bad context, ...). */
TOPOS_API topos_trainer *topos_trainer_local(
    const topos_network *net, topos_value loss, const topos_value *observes,
    int nobserves, const topos_exec *ctx, topos_error *err);
/* One step: params NULL means the network's initials, state NULL a fresh
 * state; *out as topos_plan_step fills it.  Returns a topos_status. */
TOPOS_API int topos_trainer_step(topos_trainer *tr, const topos_params *params,
                                 const topos_feed *feeds, int nfeeds,
                                 const topos_optimizer *opt,
                                 const topos_opt_state *state,
                                 topos_step_result *out, topos_error *err);
/* The implementation's kind ("local", "remote"); "" for NULL. */
TOPOS_API const char *topos_trainer_kind(const topos_trainer *tr);
TOPOS_API void topos_trainer_free(topos_trainer *tr);

/* ------------------------------------------------------------- initializers */

/* Seeded with splitmix64; same arguments, same bits.  New tensors.
 * f32/f64/bf16 only. */
TOPOS_API topos_tensor *topos_init_uniform(topos_dtype dtype, int rank,
                                           const int64_t *shape, double low,
                                           double high, uint64_t seed,
                                           topos_error *err);
TOPOS_API topos_tensor *topos_init_normal(topos_dtype dtype, int rank,
                                          const int64_t *shape, double mean,
                                          double std, uint64_t seed,
                                          topos_error *err);
/* Glorot uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). */
TOPOS_API topos_tensor *topos_init_xavier(topos_dtype dtype, int rank,
                                          const int64_t *shape, int64_t fan_in,
                                          int64_t fan_out, uint64_t seed,
                                          topos_error *err);
/* He normal: N(0, 2 / fan_in). */
TOPOS_API topos_tensor *topos_init_kaiming(topos_dtype dtype, int rank,
                                           const int64_t *shape, int64_t fan_in,
                                           uint64_t seed, topos_error *err);

/* ------------------------------------------------ neural composites (nn.c) */

/* Composites record ordinary ops through this API; they have no adjoint of
 * their own.  Optional operands take TOPOS_NONE. */

typedef enum topos_activation {
  TOPOS_ACT_NONE = 0,
  TOPOS_ACT_RELU,
  TOPOS_ACT_TANH,
  TOPOS_ACT_GELU,
  TOPOS_ACT_SILU
} topos_activation;

/* x[n,in]·w[in,out] + b[out]. */
TOPOS_API topos_value topos_linear(topos_tape *tape, topos_value x,
                                   topos_value w, topos_value b);
/* nlayers linear layers with `act` between them (not after the last). */
TOPOS_API topos_value topos_mlp(topos_tape *tape, topos_value x, int nlayers,
                                const topos_value *weights,
                                const topos_value *biases,
                                topos_activation act);
TOPOS_API topos_value topos_activate(topos_tape *tape, topos_value x,
                                     topos_activation act);
/* table[V,d], idx i32 of any rank r -> idx's shape + [d]. */
TOPOS_API topos_value topos_embedding(topos_tape *tape, topos_value table,
                                      topos_value idx);
/* Over the last axis; gamma/beta of that extent, or TOPOS_NONE. */
TOPOS_API topos_value topos_layer_norm(topos_tape *tape, topos_value x,
                                       topos_value gamma, topos_value beta,
                                       double eps);
TOPOS_API topos_value topos_rms_norm(topos_tape *tape, topos_value x,
                                     topos_value gamma, double eps);
/* Training form over x[N,C] or x[N,C,H,W] per channel C; the batch mean
 * and (biased) variance are written to mean_out / var_out when non-NULL. */
TOPOS_API topos_value topos_batch_norm(topos_tape *tape, topos_value x,
                                       topos_value gamma, topos_value beta,
                                       double eps, topos_value *mean_out,
                                       topos_value *var_out);
/* Inference form: mean and var[C] are given. */
TOPOS_API topos_value topos_batch_norm_inference(
    topos_tape *tape, topos_value x, topos_value gamma, topos_value beta,
    topos_value mean, topos_value var, double eps);
/* x[N,C,H,W], w[O,C,kh,kw], b[O] or TOPOS_NONE -> [N,O,oh,ow]. */
TOPOS_API topos_value topos_conv2d(topos_tape *tape, topos_value x,
                                   topos_value w, topos_value b, int stride,
                                   int padding, int dilation);
/* x[N,C,H,W] -> [N,C,oh,ow], windows kernel×kernel. */
TOPOS_API topos_value topos_max_pool2d(topos_tape *tape, topos_value x,
                                       int kernel, int stride);
TOPOS_API topos_value topos_softmax(topos_tape *tape, topos_value x, int axis);
/* Mean over the batch of -log softmax(logits[n,V])[target]; targets i32[n]. */
TOPOS_API topos_value topos_cross_entropy(topos_tape *tape, topos_value logits,
                                          topos_value targets);
/* Same with one-hot (or soft) targets[n,V] in the logits' dtype. */
TOPOS_API topos_value topos_cross_entropy_onehot(topos_tape *tape,
                                                 topos_value logits,
                                                 topos_value targets);
/* Mean of (a-b)^2 over every element. */
TOPOS_API topos_value topos_mse(topos_tape *tape, topos_value a, topos_value b);
/* GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
 * (GPT-2's gelu_new, PyTorch's approximate='tanh'). */
TOPOS_API topos_value topos_gelu(topos_tape *tape, topos_value x);
TOPOS_API topos_value topos_silu(topos_tape *tape, topos_value x);
/* x * mask / (1 - p); the 0/1 mask is fed as an input, never drawn here. */
TOPOS_API topos_value topos_dropout(topos_tape *tape, topos_value x,
                                    topos_value mask, double p);

/* ------------------------------------------- transformer composites (nn.c) */

/* GELU, exact: 0.5·x·(1 + erf(x/√2)) (PyTorch's approximate='none'). */
TOPOS_API topos_value topos_gelu_exact(topos_tape *tape, topos_value x);

typedef struct topos_attention_opts {
  int heads;    /* H >= 1; D (the last extent of q/k/v) must be a multiple */
  bool causal;  /* query i may attend keys at positions <= past + i */
  int64_t past; /* keys/values hold `past` earlier positions first (a KV
                   cache); 0 without a cache */
  double scale; /* 0: 1/sqrt(D/H) */
} topos_attention_opts;

/*
 * Multi-head scaled dot-product attention: q[B,T,D], k and v [B,S,D] ->
 * [B,T,D]; per head h (lanes h·Dh .. (h+1)·Dh, Dh = D/H)
 *   softmax(q_h·k_hᵀ·scale + mask)·v_h,
 * with mask[i,j] = 0 for j <= past + i and −∞ above (causal only, which
 * needs S = past + T).  Recorded as split heads -> matmul -> mul(scale)
 * -> add(mask) -> log_softmax -> exp -> matmul -> merge heads (nn.c has
 * the exact sequence).  Bad ranks, extents or options fail the tape.
 */
TOPOS_API topos_value topos_attention(topos_tape *tape, topos_value q,
                                      topos_value k, topos_value v,
                                      const topos_attention_opts *opts);

/*
 * A self-attention block (GPT-2's attn): x[B,T,D]; w_qkv[D,3D] holds the
 * q, k and v projections as column blocks (c_attn's layout), b_qkv[3D] or
 * TOPOS_NONE; w_o[D,D], b_o[D] or TOPOS_NONE (c_proj).  k_cache/v_cache
 * [B,P,D] or TOPOS_NONE: when given they are concatenated before this
 * step's keys/values along axis 1, and opts->past must equal P (0 without
 * them).  *k_all / *v_all (either may be NULL) receive the keys and values
 * attended over ([B,P+T,D]), for the caller to keep as its cache: the
 * state stays the caller's.  Returns [B,T,D].
 */
TOPOS_API topos_value topos_self_attention(
    topos_tape *tape, topos_value x, topos_value w_qkv, topos_value b_qkv,
    topos_value w_o, topos_value b_o, const topos_attention_opts *opts,
    topos_value k_cache, topos_value v_cache, topos_value *k_all,
    topos_value *v_all);

/*
 * Rotary position embedding of x[B,T,D], D = heads·Dh with Dh even, in the
 * rotate-half convention (Hugging Face Llama: lane i pairs with
 * i + Dh/2): y = x·cos + rotate_half(x)·sin at positions offset ..
 * offset+T−1, frequencies 1/base^(2i/Dh); the tables are computed in
 * double and rounded to the tape's dtype.  base 0 means 10000.
 */
TOPOS_API topos_value topos_rope(topos_tape *tape, topos_value x, int heads,
                                 int64_t offset, double base);

/*
 * Softmax cross entropy of logits[N,V] against i32 targets[N], averaged
 * over the targets that are not ignore_index (which may be negative, like
 * PyTorch's −100, and at most 2^20 outside [0, V)).  A target that is
 * neither in [0, V) nor ignore_index gives a run-time range error, or a
 * NaN loss when it lies between ignore_index and [0, V).  An all-ignored
 * batch gives NaN (0/0), as PyTorch does.
 */
TOPOS_API topos_value topos_cross_entropy_ignore(topos_tape *tape,
                                                 topos_value logits,
                                                 topos_value targets,
                                                 int32_t ignore_index);

/*
 * Global-norm gradient clipping over n recorded values (the gradients
 * topos_tape_differentiate writes, say), each of the tape's dtype:
 * norm = sqrt(Σ sum(g²)), scale = max_norm / max(norm, max_norm) (exactly
 * 1 when norm <= max_norm), clipped[i] = grads[i]·scale.  clipped may be
 * grads; norm_out (may be NULL) receives the rank-0 norm.  Returns a
 * topos_status; on failure the tape carries the error (TOPOS_ERR_STATE
 * when it already had one) and clipped[] is TOPOS_NONE.
 */
TOPOS_API int topos_clip_global_norm(topos_tape *tape, int n,
                                     const topos_value *grads, double max_norm,
                                     topos_value *clipped,
                                     topos_value *norm_out);

/*
 * A learning-rate schedule, a pure function of the step: linear warmup
 * lr = peak·(step+1)/warmup for step < warmup (reaching peak at step
 * warmup−1); then a half cosine from peak at step warmup to floor at step
 * total−1, lr = floor + (peak−floor)·(1 + cos(π·(step−warmup)/
 * (total−1−warmup)))/2 (floor when total−1 = warmup); floor from step
 * total on.  NaN for nonsense: step < 0, warmup < 0, total < 1,
 * warmup > total, peak or floor negative or not finite, floor > peak.
 */
TOPOS_API double topos_lr_warmup_cosine(int64_t step, int64_t warmup,
                                        int64_t total, double peak,
                                        double floor);

/* ------------------------------------------------------------ checkpoints */

/*
 * Checkpoints in the safetensors format (docs/checkpoints.md): dtypes
 * F32, F64, BF16, I32, data little-endian row-major.
 *
 * save writes the n tensors (any layout; their logical row-major elements
 * are written) under the n names, which must be unique, UTF-8 without
 * NUL, and not "__metadata__".  It writes a temporary file beside path
 * and renames it over path, so path holds either its old bytes or the
 * whole new file.  Returns a topos_status: TOPOS_ERR_ARGUMENT for bad
 * names or NULLs, TOPOS_ERR_IO when the file cannot be written.
 */
TOPOS_API int topos_safetensors_save(const char *path, int n,
                                     const char *const *names,
                                     topos_tensor *const *tensors,
                                     topos_error *err);

typedef struct topos_safetensors topos_safetensors;

/*
 * Opens the file at path and checks its header against the file's size
 * (caller frees the set with topos_safetensors_free), or NULL with err:
 * TOPOS_ERR_CORRUPT, naming the fault, for a file that is not valid
 * safetensors (truncated, a header length beyond the file or over
 * 100 MB, a header that is not a JSON object, an unknown dtype, a bad
 * shape or rank, data_offsets out of range, overlapping or leaving bytes
 * uncovered, a byte count that disagrees with dtype and shape, a
 * duplicate name); TOPOS_ERR_NOT_FOUND when there is no file,
 * TOPOS_ERR_IO when it cannot be read.  Only the header is read: the
 * file stays open until topos_safetensors_free, and each tensor's bytes
 * are read by topos_safetensors_get, so the data is in memory once.
 */
TOPOS_API topos_safetensors *topos_safetensors_load(const char *path,
                                                    topos_error *err);
/* Tensors in the set (-1 for NULL); names in header order, borrowed
 * (NULL when i is out of range). */
TOPOS_API int topos_safetensors_count(const topos_safetensors *st);
TOPOS_API const char *topos_safetensors_name(const topos_safetensors *st,
                                             int i);
/* The tensor named `name`, read from the open file (a new tensor each
 * call: caller releases), or NULL with TOPOS_ERR_NOT_FOUND for an
 * unknown name, TOPOS_ERR_IO when the read fails or the file was cut or
 * modified since it was loaded (removing it or renaming another file
 * over its path changes nothing: the set reads the file it opened),
 * TOPOS_ERR_MEMORY.  Safe to call from several threads at once. */
TOPOS_API topos_tensor *topos_safetensors_get(const topos_safetensors *st,
                                              const char *name,
                                              topos_error *err);
TOPOS_API void topos_safetensors_free(topos_safetensors *st);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_H */
