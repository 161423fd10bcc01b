/*
 * ops.h - the op list: the one place that says which ops exist, in which
 * code order, with how many operands, which attributes each reads, which
 * family it belongs to, what its adjoint reads and which shape rule checks
 * it.  Everything that enumerates ops expands TOPOS_OPS (an X-macro)
 * instead of spelling ops out:
 *
 *   ops.h        the op_code enum (below)
 *   tape.c       op_table (internal.h's op_info), the shape-rule dispatch,
 *                and which attributes a recorded node keeps (only those
 *                its op reads)
 *   encode.c     which attributes a node's bytes carry, and in what order
 *   describe.c   which attributes text, JSON and DOT print
 *   proto/wire.c proto Node <-> engine attributes, and a _Static_assert
 *                per op that the proto Op enumerator of the same name has
 *                the same number
 *
 * The order of the entries is the op code, which the canonical encoding
 * (docs/encoding.md) and proto/topos.proto's Op enum both carry: it is
 * frozen.  A new op is appended at the end, never inserted; an entry is
 * never removed or moved.  docs/encoding.md ("Adding an op") lists what
 * else a new op touches: its shape rule, kernel, adjoint, emission and
 * proto enumerator.
 *
 * This header is plain preprocessor and enums, with no engine types, so
 * proto/wire.c can read the list without the engine's internals.
 */
#ifndef TOPOS_OPS_H
#define TOPOS_OPS_H

/* -------------------------------------------------------------- attributes */

/*
 * The attributes of node_attrs (internal.h), one bit each.  The order of
 * this list is the order in which docs/encoding.md writes a node's
 * attributes: an op writes the ones it reads, in list order, so one mask
 * per op is its whole schema.  The second column is the name describe
 * prints and docs/encoding.md uses (TARGET is node_attrs' rank + shape,
 * printed "shape").
 */
/* clang-format off */
#define TOPOS_ATTRS(X) \
  X(SLOT,     slot)     /* u32: a parameter's or input's slot */        \
  X(TENSOR,   tensor)   /* a leaf's value */                            \
  X(P,        p)        /* f64: pow's exponent */                       \
  X(PERM,     perm)     /* u8 x rank: permute's order */                \
  X(TARGET,   shape)    /* rank u8 + extents: reshape/broadcast target */\
  X(AXIS,     axis)     /* u8 */                                        \
  X(START,    start)    /* i64 */                                       \
  X(LENGTH,   length)   /* i64 */                                       \
  X(BEFORE,   before)   /* i64 */                                       \
  X(AFTER,    after)    /* i64 */                                       \
  X(EXTENT,   extent)   /* i64 */                                       \
  X(SIZE,     size)     /* i64 */                                       \
  X(STEP,     step)     /* i64 */                                       \
  X(DILATION, dilation) /* i64 */
/* clang-format on */

/* ATTR_BIT_AXIS is the axis' position in TOPOS_ATTRS; ATTR_AXIS its bit. */
typedef enum attr_bit {
#define TOPOS_ATTR_BIT_(NAME, field) ATTR_BIT_##NAME,
  TOPOS_ATTRS(TOPOS_ATTR_BIT_)
#undef TOPOS_ATTR_BIT_
      ATTR_BIT_COUNT
} attr_bit;

enum {
#define TOPOS_ATTR_MASK_(NAME, field) ATTR_##NAME = 1u << ATTR_BIT_##NAME,
  TOPOS_ATTRS(TOPOS_ATTR_MASK_)
#undef TOPOS_ATTR_MASK_
};

/* ---------------------------------------------------------------- families */

/* What kind of computation an op is, for people, docs and capability
 * listings; the per-op behaviour itself lives in the rule, kernel, adjoint
 * and emission. */
typedef enum op_family {
  FAMILY_LEAF,      /* no operands: a constant, a parameter, an input */
  FAMILY_UNARY,     /* elementwise, one operand, same shape out */
  FAMILY_BINARY,    /* elementwise, two operands of one shape */
  FAMILY_LINALG,    /* matmul */
  FAMILY_LAYOUT,    /* moves values without arithmetic (linear adjoints) */
  FAMILY_REDUCTION, /* along an axis or over all (log_softmax: x minus a
                       reduction broadcast back) */
  FAMILY_INDEXING,  /* rows selected or accumulated by i32 indices */
  FAMILY_COUNT
} op_family;

/* ---------------------------------------------------------- adjoint reads */

/* Which forward values an op's adjoint reads: bit i = operand i,
 * READS_OUTPUT = the op's own result. */
#define READS_OPERAND(i) (1u << (i))
#define READS_OUTPUT (1u << 7)
#define READS_X0 READS_OPERAND(0)
#define READS_X1 READS_OPERAND(1)
#define READS_Y READS_OUTPUT

/* --------------------------------------------------------------- the list */

/*
 * X(ENUM, "name", arity, family, reads, linear, rule, attributes)
 *
 *   ENUM        OP_<ENUM> in the engine, TOPOS__V1__OP__<ENUM> on the wire
 *   name        the op's name (topos_op_code, describe, messages)
 *   arity       operand count; -1 = one or more (concat)
 *   attributes  ATTR_* bits: the node_attrs fields the op reads; nothing
 *               else is kept, encoded, printed or sent
 *   family      FAMILY_<family>
 *   reads       READS_* bits: the forward values its adjoint reads
 *   linear      reads no values and the adjoint only moves g
 *   rule        its shape rule is rule_<rule> in tape.c
 */
/* clang-format off */
#define TOPOS_OPS(X)                                                                                                                       \
  X(CONSTANT,        "constant",        0,  LEAF,      0,                   false, leaf,            ATTR_TENSOR)                           \
  X(PARAMETER,       "parameter",       0,  LEAF,      0,                   false, leaf,            ATTR_SLOT | ATTR_TENSOR)               \
  X(INPUT,           "input",           0,  LEAF,      0,                   false, leaf,            ATTR_SLOT | ATTR_TENSOR)               \
  X(ADD,             "add",             2,  BINARY,    0,                   true,  elementwise,     0)                                     \
  X(SUB,             "sub",             2,  BINARY,    0,                   true,  elementwise,     0)                                     \
  X(MUL,             "mul",             2,  BINARY,    READS_X0 | READS_X1, false, elementwise,     0)                                     \
  X(DIV,             "div",             2,  BINARY,    READS_X1 | READS_Y,  false, elementwise,     0)                                     \
  X(NEG,             "neg",             1,  UNARY,     0,                   true,  elementwise,     0)                                     \
  X(EXP,             "exp",             1,  UNARY,     READS_Y,             false, elementwise,     0)                                     \
  X(LOG,             "log",             1,  UNARY,     READS_X0,            false, elementwise,     0)                                     \
  X(SQRT,            "sqrt",            1,  UNARY,     READS_Y,             false, elementwise,     0)                                     \
  X(TANH,            "tanh",            1,  UNARY,     READS_Y,             false, elementwise,     0)                                     \
  X(POW,             "pow",             1,  UNARY,     READS_X0,            false, pow,             ATTR_P)                                \
  X(MAXIMUM,         "maximum",         2,  BINARY,    READS_X0 | READS_X1, false, elementwise,     0)                                     \
  X(STEP,            "step",            2,  BINARY,    0,                   false, elementwise,     0)                                     \
  X(RELU,            "relu",            1,  UNARY,     READS_X0,            false, elementwise,     0)                                     \
  X(MATMUL,          "matmul",          2,  LINALG,    READS_X0 | READS_X1, false, matmul,          0)                                     \
  X(TRANSPOSE,       "transpose",       1,  LAYOUT,    0,                   true,  transpose,       0)                                     \
  X(PERMUTE,         "permute",         1,  LAYOUT,    0,                   true,  permute,         ATTR_PERM)                             \
  X(RESHAPE,         "reshape",         1,  LAYOUT,    0,                   true,  reshape,         ATTR_TARGET)                           \
  X(NARROW,          "narrow",          1,  LAYOUT,    0,                   true,  narrow,          ATTR_AXIS | ATTR_START | ATTR_LENGTH)  \
  X(PAD,             "pad",             1,  LAYOUT,    0,                   true,  pad,             ATTR_AXIS | ATTR_BEFORE | ATTR_AFTER)  \
  X(UNFOLD,          "unfold",          1,  LAYOUT,    0,                   true,  unfold,          ATTR_AXIS | ATTR_SIZE |                \
                                                                                                    ATTR_STEP | ATTR_DILATION)             \
  X(FOLD,            "fold",            1,  LAYOUT,    0,                   true,  fold,            ATTR_AXIS | ATTR_EXTENT |              \
                                                                                                    ATTR_SIZE | ATTR_STEP | ATTR_DILATION) \
  X(CONCAT,          "concat",          -1, LAYOUT,    0,                   true,  concat,          ATTR_AXIS)                             \
  X(BROADCAST,       "broadcast",       1,  LAYOUT,    0,                   true,  broadcast,       ATTR_TARGET)                           \
  X(BROADCAST_ALONG, "broadcast_along", 1,  LAYOUT,    0,                   true,  broadcast_along, ATTR_AXIS | ATTR_EXTENT)               \
  X(SUM,             "sum",             1,  REDUCTION, 0,                   true,  sum,             0)                                     \
  X(SUM_ALONG,       "sum_along",       1,  REDUCTION, 0,                   true,  along,           ATTR_AXIS)                             \
  X(MAX_ALONG,       "max_along",       1,  REDUCTION, READS_X0 | READS_Y,  false, along,           ATTR_AXIS)                             \
  X(LOG_SOFTMAX,     "log_softmax",     1,  REDUCTION, READS_Y,             false, along,           ATTR_AXIS)                             \
  X(LOGSUMEXP,       "logsumexp",       1,  REDUCTION, READS_X0 | READS_Y,  false, along,           ATTR_AXIS)                             \
  X(GATHER,          "gather",          2,  INDEXING,  READS_X1,            false, index,           0)                                     \
  X(SCATTER,         "scatter",         2,  INDEXING,  READS_X1,            false, index,           ATTR_EXTENT)                           \
  X(ERF,             "erf",             1,  UNARY,     READS_X0,            false, elementwise,     0)
/* clang-format on */

/* The op codes: an entry's position in TOPOS_OPS.  They are part of the
 * canonical encoding: frozen, appended to before OP_COUNT, never
 * reordered. */
typedef enum op_code {
#define TOPOS_OP_CODE_(E, name, arity, family, reads, linear, rule, attrs) \
  OP_##E,
  TOPOS_OPS(TOPOS_OP_CODE_)
#undef TOPOS_OP_CODE_
      OP_COUNT
} op_code;

#endif /* TOPOS_OPS_H */
