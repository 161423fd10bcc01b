/*
 * internal.h - what the engine's source files share and the public header
 * hides: tensor layout, the buffer pool, the node model, the op table, and
 * the builder seam through which adjoints are either evaluated (backward)
 * or recorded (differentiate).
 */
#ifndef TOPOS_INTERNAL_H
#define TOPOS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "backend.h"
#include "topos.h"

/* ------------------------------------------------------------ error helpers */

/* Formats into err (when non-NULL) and returns code. */
int error_set(topos_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "[2,3]" for a shape; buf must hold at least SHAPE_TEXT bytes. */
#define SHAPE_TEXT 192
const char *shape_text(char *buf, int rank, const int64_t *shape);

/* A growing string (text.c).  Zero-initialise; append with text_add;
 * text_finish returns the string (caller frees) or NULL with err when an
 * allocation failed. */
typedef struct text {
  char *s;
  size_t len, cap;
  bool failed;
} text;
void text_add(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
char *text_finish(text *t, const char *what, topos_error *err);

/* ---------------------------------------------------------------- buffer pool
 */

/*
 * Buffers come from a process-wide size-class pool so a training loop
 * reuses the same pages every step instead of handing them back to the OS
 * (first touch of a fresh page costs ~11 us on these machines).  Classes
 * are quarter powers of two; the pool keeps at most TOPOS_POOL_BYTES
 * (default 1 GiB) of idle memory.  Thread-safe.
 */
void *pool_alloc(size_t bytes, size_t *capacity);
void pool_free(void *p, size_t capacity);
/* Bytes currently idle in the pool (for tests and benchmarks). */
size_t pool_idle_bytes(void);
/* Hands every idle buffer back to the system (tests, valgrind). */
void pool_trim(void);
/* The capacity pool_alloc(bytes) hands out (SIZE_MAX when none can). */
size_t pool_capacity_of(size_t bytes);
/* Bytes handed out and not returned (at class sizes), and their
 * high-water mark since the last pool_peak_reset (which sets it to the
 * bytes handed out now): what tests hold memory estimates against. */
size_t pool_used_bytes(void);
size_t pool_peak_bytes(void);
void pool_peak_reset(void);

/* Saturating size arithmetic for memory estimates. */
static inline size_t size_add(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}
static inline size_t size_mul(size_t a, size_t b) {
  return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}
/* The pool capacity of a buffer of count elements of es bytes. */
size_t pool_bytes_of(int64_t count, size_t es);

/* -------------------------------------------------------------------- tensors
 */

typedef struct tensor_buffer {
  atomic_int refs;
  size_t capacity;
  void *data;
} tensor_buffer;

struct topos_tensor {
  atomic_int refs;
  topos_dtype dtype;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
  int64_t stride[TOPOS_MAX_RANK]; /* in elements; 0 = broadcast */
  int64_t offset;                 /* in elements */
  tensor_buffer *buf;
};

/* dtype and shape, without values: what shape rules work on. */
typedef struct tensor_meta {
  topos_dtype dtype;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
} tensor_meta;

bool dtype_valid(topos_dtype dtype);
bool dtype_is_float(topos_dtype dtype);
/* Product of extents; -1 if it overflows int64 or an extent is negative. */
int64_t shape_count(int rank, const int64_t *shape);
bool shape_equal(int ra, const int64_t *a, int rb, const int64_t *b);
tensor_meta tensor_meta_of(const topos_tensor *t);

/* A new contiguous, uninitialised tensor from the pool (NULL + err on a
 * bad shape or no memory). */
topos_tensor *tensor_new(topos_dtype dtype, int rank, const int64_t *shape,
                         topos_error *err);
topos_tensor *tensor_new_meta(const tensor_meta *m, topos_error *err);
/* A view of base's buffer with its own layout (buffer retained). */
topos_tensor *tensor_view(const topos_tensor *base, int rank,
                          const int64_t *shape, const int64_t *stride,
                          int64_t offset);
/* Address of element 0 of the view (buffer data + offset). */
void *tensor_data(const topos_tensor *t);
/* Copies t's elements row-major into dst (count * dtype size bytes). */
void tensor_copy_out(const topos_tensor *t, void *dst);
/* Whether t has at least two elements and all of them have the same bit
 * pattern (the encoding's splat form). */
bool tensor_is_uniform(const topos_tensor *t);
/* Writes src's elements, walked row-major, to dst laid out by dst_stride
 * (in elements); dst may be unaligned. */
void tensor_copy_strided(const topos_tensor *src, void *dst,
                         const int64_t *dst_stride);
/* A shape walked with two stride sets (an operand's and another's, or a
 * source's and a destination's): extent-1 axes dropped and neighbours that
 * both sets step through as one merged.  Returns the rank left (0: one
 * element). */
int strided_coalesce2(int rank, const int64_t *shape, const int64_t *sa_in,
                      const int64_t *sb_in, int64_t *shape_out, int64_t *sa,
                      int64_t *sb);

/* Compute views: a contiguous array of t's elements in its compute type
 * (float for f32/bf16, double for f64, int32 for i32).  Borrows t's
 * memory when t is already contiguous in that type, else converts into a
 * pool buffer.  Release with compute_view_done. */
typedef struct compute_view {
  const void *data;
  void *owned;
  size_t capacity;
} compute_view;
int compute_view_of(const topos_tensor *t, compute_view *v, topos_error *err);
void compute_view_done(compute_view *v);

/* An output being written: the tensor, and where a kernel writes its
 * compute-type values (the tensor itself, or f32 scratch for bf16).
 * out_begin makes a new contiguous tensor of m (0, or -1 with err);
 * out_end rounds the scratch into it (bf16) and returns it; out_abort
 * releases both. */
typedef struct out_buf {
  topos_tensor *t;
  void *data;
  size_t scratch_cap;
} out_buf;
int out_begin(out_buf *ob, const tensor_meta *m, topos_error *err);
topos_tensor *out_end(out_buf *ob);
void out_abort(out_buf *ob);

/* A double rounded once to bf16 (nearest even; NaN stays a quiet NaN). */
uint16_t bf16_from_f64(double v);
/* Rounds x once to a float dtype into element i of a contiguous buffer. */
void store_rounded(void *dst, topos_dtype dtype, int64_t i, double x);
/* Rounds n floats to bf16 into dst (round to nearest even, NaN kept). */
void bf16_round_array(const float *src, uint16_t *dst, int64_t n);

/* ------------------------------------------------------------------ op table
 */

/* The op codes, names, arities, attribute schemas and families: one list,
 * TOPOS_OPS in ops.h, which every file that enumerates ops expands. */
#include "ops.h"

/* Attributes of one node.  Which fields an op reads is its ATTR_* mask in
 * TOPOS_OPS (ops.h); a recorded node keeps only those, the rest are 0. */
typedef struct node_attrs {
  int axis;                      /* ATTR_AXIS */
  int64_t start, length;         /* ATTR_START, ATTR_LENGTH */
  int64_t before, after;         /* ATTR_BEFORE, ATTR_AFTER */
  int64_t size, step, dilation;  /* ATTR_SIZE, ATTR_STEP, ATTR_DILATION */
  int64_t extent;                /* ATTR_EXTENT */
  double p;                      /* ATTR_P */
  int perm[TOPOS_MAX_RANK];      /* ATTR_PERM: the operand's rank entries */
  int rank;                      /* ATTR_TARGET: the target shape */
  int64_t shape[TOPOS_MAX_RANK]; /* ATTR_TARGET */
  topos_tensor *tensor;          /* ATTR_TENSOR: a leaf's value (owned by
                                    the node) */
  int slot;                      /* ATTR_SLOT: set by the tape */
} node_attrs;

/* One TOPOS_OPS entry (ops.h has what each column means). */
typedef struct op_info {
  const char *name;
  int arity;      /* -1 = variadic (concat) */
  unsigned reads; /* READS_* bits */
  bool linear;    /* no values read, adjoint only reshapes g */
  unsigned attrs; /* ATTR_* bits: the node_attrs fields the op reads */
  op_family family;
} op_info;

extern const op_info op_table[OP_COUNT];

/* The shape rule: checks operands and attributes, fills out.  On failure
 * returns a status and writes a message (without the node prefix). */
int op_infer(op_code op, const node_attrs *at, int nin, const tensor_meta *in,
             tensor_meta *out, char *msg, size_t msglen);

/* The reference forward kernel: a new tensor (a view where the op is a
 * layout change) or NULL with err.  `out` is what op_infer gave. */
topos_tensor *op_eval(op_code op, const node_attrs *at, int nin,
                      topos_tensor *const *in, const tensor_meta *out,
                      topos_error *err);
/* The same under a run's context (NULL: none): long kernels (matmul, the
 * maps, the row ops) ask env's cancel and deadline between blocks of
 * whole rows, a few milliseconds of work apart, and stop with
 * TOPOS_ERR_CANCELLED / TOPOS_ERR_DEADLINE; the bits never depend on
 * the blocks. */
typedef struct exec_env exec_env;
topos_tensor *op_eval_in(const exec_env *env, op_code op, const node_attrs *at,
                         int nin, topos_tensor *const *in,
                         const tensor_meta *out, topos_error *err);
/* True (err set) when env says stop, asked from inside a long kernel or a
 * task split into blocks; false for a NULL env. */
bool kernel_stop(const exec_env *env, topos_error *err);
/* Pool bytes a kernel takes beside its output while computing op's value
 * from operands of these metas (contig[j]: operand j is known to be
 * contiguous): compute-type copies of bf16 or strided operands, a bf16
 * output's f32 scratch, work rows.  An upper bound at pool capacities,
 * for plan.c's memory bounds; kept in step with the kernels. */
size_t op_scratch_bytes(op_code op, const node_attrs *at, int nin,
                        const tensor_meta *in, const bool *contig,
                        const tensor_meta *out);

/* The reference loops over contiguous compute arrays (float for f32 and
 * bf16, double for f64; y written, never read), which op_eval runs and
 * the dispatch runs on the arrays it prepared when no backend takes a map
 * or a sum (so nothing is prepared twice). */
int kernel_elementwise(const exec_env *env, op_code op, double p,
                       topos_dtype dtype, int nin, const void *a, const void *b,
                       void *y, int64_t n, topos_error *err);
int kernel_sum_rows(const exec_env *env, topos_dtype dtype, const void *x,
                    void *y, int64_t outer, int64_t L, int64_t inner,
                    topos_error *err);
/* c[m,n] = a[m,k]·b[k,n] on the reference loop (a, b by row and column
 * strides, c contiguous), in blocks of rows.  These three return 0, or -1
 * with err when env said stop between blocks. */
int kernel_matmul(const exec_env *env, topos_dtype dtype, const void *a,
                  int64_t as0, int64_t as1, const void *b, int64_t bs0,
                  int64_t bs1, void *c, int64_t m, int64_t k, int64_t n,
                  topos_error *err);
/* Splits t's shape around `axis` into (outer, L, inner): the rows an
 * `_along` op folds. */
void around_axis(const topos_tensor *t, int axis, int64_t *outer, int64_t *L,
                 int64_t *inner);

/* ------------------------------------------------------------ tape / network
 */

typedef struct node {
  op_code op;
  tensor_meta meta;
  int nin;
  int32_t *in; /* operand node indices, each < this node's index */
  node_attrs at;
  char *name; /* NULL when unnamed */
} node;

struct topos_tape {
  uint32_t id;
  topos_dtype dtype;
  node *nodes;
  int n, cap;
  int nparams, ninputs;
  int error_code;
  char *error; /* first error, NULL when none */
  /* Name index: open addressing over node index + 1 (0 empty, -1 a
   * removed entry), so naming stays O(1) however many names a spec has. */
  int32_t *names;
  int name_cap, name_used;
};

struct topos_network {
  atomic_int refs;
  uint32_t id; /* the tape id: values of the tape stay valid */
  topos_dtype dtype;
  node *nodes;
  int n;
  int nparams, ninputs;
  int32_t *param_nodes; /* slot -> node index */
  int32_t *input_nodes; /* slot -> node index */
};

/* Appends a node after checking it with op_infer.  Returns its value, or
 * an invalid value with the tape's first error set ("op (node N): ...").
 * `at` is copied; a tensor in it is retained. */
topos_value tape_record(topos_tape *tape, op_code op, const topos_value *in,
                        int nin, const node_attrs *at);
/* Tape/network value checks: index of the node or -1 with err. */
int network_index(const topos_network *net, topos_value v, topos_error *err);
/* Node descriptions for messages: "f32[2,3]"; buf holds SHAPE_TEXT + 8. */
const char *meta_text(char *buf, const tensor_meta *m);

/* ------------------------------------------------------------- parameters */

struct topos_params {
  int n;
  topos_tensor **t;
};

struct topos_field {
  topos_network *net; /* retained */
  topos_tensor **t;   /* one per node, never NULL */
};

/* A new set of n NULL slots (filled by the caller). */
topos_params *params_alloc(int n);
/* A new field over net with n NULL tensors (filled by the caller). */
topos_field *field_alloc(const topos_network *net);
/* A zero tensor shaped like m: one element broadcast by stride 0. */
topos_tensor *tensor_zeros_like_meta(const tensor_meta *m, topos_error *err);

/* ------------------------------------------------------------------ runs */

typedef struct exec_env exec_env; /* a resolved context, see "backends" */

struct topos_run {
  topos_network *net;     /* retained */
  topos_tensor **vals;    /* one per node, NULL = not evaluated / freed */
  const topos_plan *plan; /* the plan that made it, or NULL (interpreter) */
  bool *readable;         /* plan runs: the keep-set; NULL = every value */
};

/* ------------------------------------------------------------------ plans */

/* topos_gelu's thirteen nodes headed by y (gelu.c): x, the interior
 * values, the constants, and which binary nodes take their operands the
 * other way round from gelu.c's formulas (GELU_FLIP_* bits). */
typedef struct gelu_pattern {
  int32_t x, x2, x3, cx3, inner, u, t, s, half;
  double c, k, h, one;
  unsigned flip;
} gelu_pattern;
enum {
  GELU_FLIP_X3 = 1,    /* x3 = x2·x */
  GELU_FLIP_CX3 = 2,   /* cx3 = x3·c */
  GELU_FLIP_INNER = 4, /* inner = cx3 + x */
  GELU_FLIP_U = 8,     /* u = inner·k */
  GELU_FLIP_S = 16,    /* s = t + one */
  GELU_FLIP_HALF = 32, /* half = x·h */
  GELU_FLIP_Y = 64     /* y = s·half */
};
/* A GROUP_GELU's members, in this order (gelu_members). */
enum {
  GELU_M_X2,
  GELU_M_X3,
  GELU_M_CX3,
  GELU_M_INNER,
  GELU_M_U,
  GELU_M_T,
  GELU_M_S,
  GELU_M_HALF,
  GELU_MEMBERS
};

typedef enum group_kind {
  GROUP_CONV = 1,      /* pad? -> pad? -> unfold -> unfold -> permute ->
                          reshape -> matmul: a direct windowed product */
  GROUP_POOL = 2,      /* unfold -> unfold -> permute -> reshape -> max_along:
                          a window walk */
  GROUP_ATTENTION = 3, /* matmul(q, kᵀ) -> mul? -> add? -> log_softmax(last)
                          -> exp -> matmul(·, v): one pass per query row */
  GROUP_GELU = 4       /* topos_gelu's nodes (gelu.c): three passes over x */
} group_kind;

#define GROUP_MAX_INS 5
#define GROUP_MAX_MEMBERS 8

/*
 * A fused group computes its head node straight from its inputs without
 * materialising the interior nodes (its members).  The window groups'
 * geometry is that of a 2-D window over axes 2 and 3 of x[N,C,H,W]:
 * output position (oi, oj) reads x[n, c, oi·stride_h + a·dil_h −
 * pad_top, oj·stride_w + b·dil_w − pad_left] for a < kh, b < kw (zero
 * outside x).  An attention group's are the extents of its matmuls.
 *
 * A member is normally never evaluated.  An attention member the run
 * keeps (backward reads it, or it is observed) is *exported*: the fused
 * kernel writes its value too, at the head's step.
 */
typedef struct plan_group {
  group_kind kind;
  int32_t head;   /* the node the group computes (matmul / max_along) */
  int32_t x;      /* the window chain's input, rank 4; attention: q */
  int32_t weight; /* GROUP_CONV: the matmul's [C·kh·kw, O] operand; else -1 */
  /* What the head's step reads: conv x, weight; pool x; attention q, kᵀ,
   * v, then the scale and mask operands when those steps are present. */
  int32_t ins[GROUP_MAX_INS];
  int nins;
  int32_t members[GROUP_MAX_MEMBERS]; /* interior nodes, chain order */
  bool exported[GROUP_MAX_MEMBERS];   /* per member: the kernel writes it */
  int nmembers;
  int64_t N, C, H, W, kh, kw, oh, ow;
  int64_t nout; /* GROUP_CONV: O, the weight's columns */
  int64_t stride_h, stride_w, dil_h, dil_w;
  int64_t pad_top, pad_bottom, pad_left, pad_right;
  /* GROUP_ATTENTION: [batch,] t x dh queries, s keys, dv value features;
   * the member of each row step (-1 when the chain has no such step). */
  int64_t batch, t, s, dh, dv;
  int32_t raw, scaled, masked, logp, probs;
  /* A window group of a training plan: backward runs its adjoint fused
   * (exec_group_grad) from x (and the weight, or the head's value), so
   * the chain's interior is never kept. */
  bool fused_grad;
  gelu_pattern gelu; /* GROUP_GELU: members x2 x3 cx3 inner u t s half */
} plan_group;

struct topos_plan {
  topos_network *net; /* retained */
  topos_posture posture;
  topos_numerics numerics;
  int threads;               /* the entry's: 0 = the process default */
  int32_t *roots, *observes; /* node indices */
  int nroots, nobserves;
  int32_t *schedule; /* node indices in execution order (live nodes that
                        are not group members) */
  int nschedule;
  bool *live;          /* per node: in the schedule or a group member */
  bool *keep;          /* per node: readable from a run (roots ∪ observes) */
  bool *retain;        /* per node: alive until the run ends (keep, and in
                          training what backward reads) */
  int32_t *last_use;   /* per node: schedule position of its last consumer
                          (-1 when none) */
  int32_t *free_after; /* nodes to release after schedule position p: */
  int32_t *free_start; /* free_after[free_start[p] .. free_start[p+1]) */
  int32_t *group_of;   /* per node: index into groups, or -1 */
  plan_group *groups;
  int ngroups;
  size_t peak_bytes;
  /* Memory bounds of its runs (plan.c, topos_plan_run_bytes), the
   * optimizer's per-slot conversions at their worst (topos_plan_step_bytes)
   * and the reference interpreter's run.  A training plan's backward
   * figures are metered when first asked, once, under meter_lock. */
  topos_run_bytes bytes;
  size_t opt_slot_scratch, interp_bytes;
  pthread_mutex_t meter_lock;
  atomic_bool metered;
};

/* Interpreter pieces plans reuse (interp.c). */
topos_run *run_alloc(const topos_network *net, topos_error *err);
/* Checks params and feeds; fed[slot] gets each input's feed or NULL. */
int run_prepare(const topos_network *net, const topos_params *params,
                const topos_feed *feeds, int nfeeds, const topos_tensor **fed,
                topos_error *err);
/* Evaluates node i from the run's operand values (reference kernels). */
int run_eval_node(const exec_env *env, topos_run *run, int i,
                  const topos_params *params, const topos_tensor **fed,
                  topos_error *err);
/* The gradient of rank-0 node `target` w.r.t. every node (new field). */
topos_field *run_backward(const exec_env *env, const topos_run *run, int target,
                          topos_error *err);
/* The parameters' gradients only (backward_scan with params_only). */
topos_params *run_gradients(const exec_env *env, const topos_run *run,
                            int target, topos_error *err);
/* What run_gradients (params_only) or run_backward would allocate, without
 * running: the reverse scan through a builder that only infers shapes and
 * keeps the bytes the evaluating builder would hold (buffers at pool
 * capacities, shared by views, released at each settle) plus each op's
 * kernel scratch.  contig[i]: node i's forward value is contiguous.
 * *peak is the most held at once on top of the run, *held what the
 * result keeps.  Returns 0, or -1 when the scan could not be metered. */
int backward_meter(const topos_network *net, int target, bool params_only,
                   const bool *contig, size_t *peak, size_t *held);

/* The heap block glibc's malloc gives a request of n bytes (an 8-byte
 * header, 16-byte granules, 32 bytes at least), for memory bounds. */
static inline size_t malloc_block(size_t n) {
  if (n == 0) return 0;
  if (n > SIZE_MAX - 32) return SIZE_MAX;
  size_t c = (n + 8 + 15) & ~(size_t)15;
  return c < 32 ? 32 : c;
}
/* A tensor's struct, and a buffer's (its data is a pool block). */
#define TENSOR_STRUCT_BYTES malloc_block(sizeof(topos_tensor))
#define BUFFER_STRUCT_BYTES malloc_block(sizeof(tensor_buffer))

/* Runs one fused group on the reference kernels: the head's value from
 * its inputs ins[0..g->nins), and for an attention group each exported
 * member's value into exports[k] (k indexing g->members; the others are
 * left NULL).  On failure nothing is returned and exports stays NULL. */
topos_tensor *group_eval(const plan_group *g, const tensor_meta *out,
                         const topos_tensor *const *ins, topos_tensor **exports,
                         topos_error *err);
/* The same under a run's context: a convolution asks env between blocks
 * of output rows, a max-pool between images, attention between rows. */
topos_tensor *group_eval_in(const exec_env *env, const plan_group *g,
                            const tensor_meta *out,
                            const topos_tensor *const *ins,
                            topos_tensor **exports, topos_error *err);
/* The reference window walk of a group over x (contiguous compute
 * array) and w (by strides) into y, in blocks (0, or -1 with err when env
 * said stop). */
int kernel_window(const exec_env *env, const plan_group *g, topos_dtype dtype,
                  const void *x, const void *w, int64_t ws0, int64_t ws1,
                  void *y, topos_error *err);
/* The fused adjoints of a training plan's window groups (plan.c), over
 * contiguous compute arrays: kernel_window_dw gives a convolution's
 * weight cotangent dw [C·kh·kw, O] from x and gy (the head's cotangent,
 * [N·oh·ow, O]); kernel_window_dx gives x's cotangent [N, C, H, W] - for
 * a convolution from da, gy·weightᵀ [N·oh·ow, C·kh·kw]; for a max-pool
 * from x, y (the pooled values) and gy - through the chain's folds and
 * narrows.  The bits are the unfused adjoints' (kernels_real.h says
 * how).  0, or -1 with err when out of memory or env said stop. */
int kernel_window_dw(const exec_env *env, const plan_group *g,
                     topos_dtype dtype, const void *x, const void *gy, void *dw,
                     topos_error *err);
int kernel_window_dx(const exec_env *env, const plan_group *g,
                     topos_dtype dtype, const void *da, const void *x,
                     const void *y, const void *gy, void *dx, topos_error *err);
/* The reference attention chain over rows [r0, r1) of the task's
 * batch·t query rows (backend.h's contract, on the reference kernels). */
int kernel_attention(const topos_attention_task *t, int64_t r0, int64_t r1,
                     topos_error *err);
/* An attention group's run begins: its head's tensor (returned), the
 * exported members' (exports as group_eval's) and the task over them and
 * the inputs.  NULL with err when memory runs out (nothing allocated). */
topos_tensor *attention_begin(const plan_group *g, const tensor_meta *out,
                              const topos_tensor *const *ins,
                              topos_tensor **exports, topos_attention_task *t,
                              topos_error *err);
/* Releases what attention_begin made (y and the exports, set to NULL). */
void attention_abort(const plan_group *g, topos_tensor *y,
                     topos_tensor **exports);
/* op_scratch_bytes for a fused group: its inputs' metas and contiguity
 * (ins[k], contig[k] for k < g->nins) and the head's. */
size_t group_scratch_bytes(const plan_group *g, const tensor_meta *ins,
                           const bool *contig, const tensor_meta *out);

/* ------------------------------------------------------------ the builder */

/*
 * Adjoint rules are written once, against this seam.  A builder hands out
 * integer handles for values; the backward interpreter's builder evaluates
 * each emitted op at once with the reference kernels, the differentiate
 * builder records it as a tape node.  Handles < 0 mean "failed/none" and
 * propagate: an op emitted on a failed handle fails too.
 */
typedef struct builder builder;
struct builder {
  int32_t (*emit)(builder *b, op_code op, const int32_t *in, int nin,
                  const node_attrs *at);
  /* A rank-0 constant of this dtype. */
  int32_t (*scalar)(builder *b, topos_dtype dtype, double value);
  const tensor_meta *(*meta)(builder *b, int32_t h);
  /* A handle for the forward value of node `index`.  When `needed` is
   * false the adjoint does not read it (op_info.reads), and an evaluating
   * builder may hand out a handle that has a shape but no value. */
  int32_t (*value)(builder *b, int32_t index, bool needed);
  /* Every handle made since the last settle is dead except keep[0..n). */
  void (*settle)(builder *b, const int32_t *keep, int nkeep);
  /* Node i of the graph being differentiated.  Recording may move the
   * node array, so callers copy what they need before emitting. */
  const node *(*node_at)(builder *b, int32_t i);
  /* Optional (NULL: none).  When node i heads a group whose adjoint runs
   * fused, emits the cotangents of the group's inputs from g, the head's:
   * to[k] is the node that dx[k] goes to, k < *n (wanted: the scan's
   * params_only table, or NULL).  Returns 1, 0 when i heads no such
   * group, or -1 with the error set. */
  int (*group_adjoint)(builder *b, int32_t i, int32_t g, const bool *wanted,
                       int32_t *to, int32_t *dx, int *n);
};

/* The reverse scan of ops.md over nodes[0..target]: seeds 1 at target,
 * visits ancestors in decreasing index, runs each adjoint through b and
 * adds cotangents into grads (consumers in decreasing index order).
 * grads has target+1 entries; -1 marks a node no gradient reached.
 * params_only: only nodes that have a parameter among their ancestors (or
 * are one) receive cotangents, so branches that lead only to inputs and
 * constants cost nothing; the wanted nodes' bits are the same either way.
 * env (NULL when recording) is asked to stop before each adjoint.
 * Returns 0, or a status with err naming the node. */
int backward_scan(builder *b, int target, int32_t *grads, bool params_only,
                  const exec_env *env, topos_error *err);

/* Emits node `n`'s adjoint.  g is the output cotangent, y the output, x the
 * operands (handles; an operand the op does not read may be a handle whose
 * value is absent).  Writes one cotangent per operand to dx, -1 where none
 * flows or where want (NULL: every operand) is false.  Returns 0, or -1
 * when an emitted op failed. */
int op_adjoint(builder *b, const node *n, int32_t g, int32_t y,
               const int32_t *x, int32_t *dx, const bool *want);

/* Builder helpers used by adjoint rules and composites of the engine. */
int32_t b_unary(builder *b, op_code op, int32_t a);
int32_t b_binary(builder *b, op_code op, int32_t a, int32_t c);
/* A constant shaped like h (a scalar broadcast). */
int32_t b_fill_like(builder *b, int32_t h, double value);

/* ------------------------------------------------------------- backends */

#include "backend.h"

/* A context resolved for one run (backend.c): the numerics, the threads
 * every task gets, the chain its tasks are offered to in order (empty for
 * the reference), when to stop, and where to report what ran.  Built once
 * per public call and passed down; nothing rides in thread-locals. */
struct exec_env {
  topos_numerics numerics;
  int threads; /* >= 1 */
  int nchain;
  const topos_backend *chain[TOPOS_BACKENDS_MAX];
  uint8_t chain_index[TOPOS_BACKENDS_MAX]; /* registry index of chain[i] */
  topos_cancel_fn cancel;
  void *cancel_ctx;
  int64_t deadline_ns;
  topos_exec_report *report;
  int64_t task_block; /* the chain's first backend's task_block (0: none) */
};

/* Resolves ctx (NULL: the default) into env.  Returns a topos_status:
 * TOPOS_ERR_ARGUMENT for an unknown backend (naming the known ones), an
 * envelope backend under exact numerics, bad numerics or threads. */
int exec_resolve(const topos_exec *ctx, exec_env *env, topos_error *err);
/* True when the run must stop here (cancelled or past its deadline); sets
 * err (TOPOS_ERR_CANCELLED / TOPOS_ERR_DEADLINE). */
bool exec_stop(const exec_env *env, topos_error *err);
/* Offers a task down env's chain (setting its threads).  0 when a backend
 * ran it; non-zero when the caller must run the reference kernel (counted
 * as a reference task). */
int exec_offer(const exec_env *env, topos_task *t);
/* Runs fn(arg, unit, slot) for every unit < units (a reference kernel's
 * independent pieces): on the chain's threads when a backend takes the
 * TOPOS_TASK_UNITS task, else in order on this thread.  slot <
 * exec_unit_slots(env) names per-thread scratch.  A cancel or a passed
 * deadline (looked at between units) skips the rest: -1 with err. */
int exec_units(const exec_env *env,
               void (*fn)(void *arg, int64_t unit, int slot), void *arg,
               int64_t units, topos_error *err);
int exec_unit_slots(const exec_env *env);
/* topos_tensor_contiguous on env's threads for a large strided view
 * (slices of its outermost axis copied side by side; a copy, so the same
 * bits); the caller's alone otherwise. */
topos_tensor *contiguous_in(const exec_env *env, const topos_tensor *t,
                            topos_error *err);

/* topos_optimizer_step on a donated *params (optim.c): plain SGD writes
 * each slot nothing else holds in place, and every other slot (and every
 * other optimizer) into new buffers.  On success *params is consumed (set
 * to NULL; its tensors freed or moved into *params_out); on failure it is
 * unchanged. */
/* topos_optimizer_step with a context whose threads the update may use
 * (NULL: the caller's alone); the same bits either way. */
int optimizer_step_in(const exec_env *env, const topos_optimizer *opt,
                      const topos_params *params, const topos_params *grads,
                      const topos_opt_state *state, topos_params **params_out,
                      topos_opt_state **state_out, topos_error *err);
int optimizer_step_donated(const exec_env *env, const topos_optimizer *opt,
                           topos_params **params, const topos_params *grads,
                           const topos_opt_state *state,
                           topos_params **params_out,
                           topos_opt_state **state_out, topos_error *err);
/* Counts a task the reference ran without an offer (an empty chain). */
void exec_reference_ran(const exec_env *env);

/* The dispatch (exec.c): node i's value through env's backends where a
 * task can take it, else the reference kernel op_eval; a fused group
 * likewise, else group_eval.  Same contracts as op_eval / group_eval. */
topos_tensor *exec_eval(const exec_env *env, op_code op, const node_attrs *at,
                        int nin, topos_tensor *const *in,
                        const tensor_meta *out, topos_error *err);
/* A fused group's head (and exported members, as group_eval's). */
topos_tensor *exec_group(const exec_env *env, const plan_group *g,
                         const tensor_meta *out, const topos_tensor *const *ins,
                         topos_tensor **exports, topos_error *err);
/* A fused window group's adjoint in a training plan (g->fused_grad): from
 * gy, the head's cotangent, the cotangents the unfused chain would give
 * the group's inputs - *dx for x when want_x, *dw for the weight when
 * want_w (a convolution); `other` is the weight (convolution) or the
 * head's value (max-pool).  The same bits; 0, or -1 with err. */
int exec_group_grad(const exec_env *env, const plan_group *g,
                    const topos_tensor *gy, const topos_tensor *x,
                    const topos_tensor *other, bool want_x, bool want_w,
                    topos_tensor **dx, topos_tensor **dw, topos_error *err);

/* The process default of threads per task: the setter's value when > 0,
 * else TOPOS_THREADS (read once), else the online cores.
 * backend_set_threads(0) restores the default (tests sweep thread counts
 * with it). */
int backend_threads(void);
void backend_set_threads(int threads);
/* Tests: fn(task, ctx) is called with every task offered from now on (on
 * the offering thread, before the chain sees it); NULL removes it. */
void backend_set_offer_hook(void (*fn)(const topos_task *t, void *ctx),
                            void *ctx);

/* ------------------------------------------------------- fused adjoints */

/* How many operand slots of net's nodes (those live[i] marks; NULL: all)
 * name each node (malloc'd, one per node; NULL when out of memory). */
int32_t *network_uses(const topos_network *net, const bool *live);

/* Whether node head is the product of a tanh GELU whose adjoint may run
 * in one pass with the unfused bits (gelu.c says when); uses from
 * network_uses. */
bool gelu_match(const topos_network *net, const int32_t *uses, int32_t head,
                gelu_pattern *m);

/* x's cotangent from the head's cotangent g and the forward values
 * v = {x, x2, half, s, t}: the unfused adjoints' bits in one pass, in
 * units env's backends may spread.  NULL with err on failure or a stop. */
topos_tensor *gelu_grad(const exec_env *env, const gelu_pattern *m,
                        const topos_tensor *g, const topos_tensor *const *v,
                        topos_error *err);

/* The pattern's computed nodes in GELU_M_* order. */
void gelu_members(const gelu_pattern *m, int32_t *members);

/* A GROUP_GELU's forward (exec_group, group_eval_in): y from x with each
 * member's bits, the exported members written; tanh offered down env's
 * chain.  NULL with err on failure or a stop. */
topos_tensor *gelu_forward(const exec_env *env, const plan_group *g,
                           const tensor_meta *out,
                           const topos_tensor *const *ins,
                           topos_tensor **exports, topos_error *err);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* The lane indices 0, s, ..., 15·s of a sixteen-lane gather of elements s
 * apart (kernels.c's strided rows, tensor.c's transposing copies).  The
 * gather scales each index by the element size and adds it to the base in
 * 64 bits, so only 15·s must fit an int32: s <= GATHER16_STRIDE_MAX. */
#define GATHER16_STRIDE_MAX ((int64_t)INT32_MAX / 15)
__attribute__((target("avx512f"))) static inline __m512i gather16_index(
    int64_t s) {
  return _mm512_mullo_epi32(
      _mm512_set1_epi32((int)s),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}
#endif

#endif /* TOPOS_INTERNAL_H */
