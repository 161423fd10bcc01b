/*
 * test_emit.c - StableHLO emission (engine/emit.c).
 *
 * Every module a test emits is held to three independent checks:
 *  1. mlir-opt: `/usr/lib/llvm-19/bin/mlir-opt --allow-unregistered-dialect`
 *     must accept the generic form (SSA, types against the signature,
 *     dense literal shapes).  A missing mlir-opt fails the test, saying
 *     that `make deps` installs mlir-19-tools.
 *  2. Shape rules: mlir-opt does not know StableHLO's op rules, so a small
 *     parser here reads every generic line (`%N = "stablehlo.X"(operands)
 *     {attrs} : (types) -> type`) and checks its operand and result types
 *     against that op's rule (dot_general dims, broadcast_in_dim mapping,
 *     reduce dims, slice/pad/concat extents, convolution and reduce_window
 *     windows, gather/scatter shapes), plus the function signature
 *     (parameters then inputs; roots then observes).
 *  3. Values: a small evaluator runs the parsed module on the network's
 *     parameter initials and input defaults and compares every result
 *     with the reference interpreter (within the rounding a different
 *     reduction order allows; constants bit for bit).
 * Mutation tests show that each check fails on a broken module.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "mlir_opt.h"
#include "sample_nets.h"
#include "testutil.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ================================================================ parsing */

enum { ET_F32, ET_F64, ET_BF16, ET_I32, ET_I1 };

typedef struct mtype {
  int et;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
} mtype;

typedef struct mval {
  char name[24];
  mtype t;
  double *v; /* evaluator values, row-major */
} mval;

typedef struct mop {
  char op[40];    /* without "stablehlo." */
  int res;        /* value index */
  int nops;       /* operands */
  int *ops;       /* value indices */
  mtype *optypes; /* the types the line lists */
  int noptypes;
  mtype rt;
  char *attrs; /* "{...}" text or "" */
  bool region;
  char region_op[40]; /* the inner op of a region ("add"/"maximum") */
  int line;
} mop;

typedef struct mmod {
  mval *vals;
  int nvals, capvals;
  mop *ops;
  int nops, capops;
  int args[256];
  int nargs;
  mtype res[256];
  int nres;
  int ret[256];
  int nret;
  char err[1024];
} mmod;

static int mfail(mmod *m, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int mfail(mmod *m, int line, const char *fmt, ...) {
  if (m->err[0]) return -1;
  int n = snprintf(m->err, sizeof m->err, "line %d: ", line + 1);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err + n, sizeof m->err - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

static void mmod_free(mmod *m) {
  for (int i = 0; i < m->nvals; i++) free(m->vals[i].v);
  for (int i = 0; i < m->nops; i++) {
    free(m->ops[i].ops);
    free(m->ops[i].optypes);
    free(m->ops[i].attrs);
  }
  free(m->vals);
  free(m->ops);
  memset(m, 0, sizeof *m);
}

static int64_t mcount(const mtype *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

static bool mtype_eq(const mtype *a, const mtype *b) {
  if (a->et != b->et || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static const char *mtype_text(const mtype *t, char *buf, size_t len) {
  static const char *names[] = {"f32", "f64", "bf16", "i32", "i1"};
  size_t pos = (size_t)snprintf(buf, len, "tensor<");
  for (int i = 0; i < t->rank; i++)
    pos +=
        (size_t)snprintf(buf + pos, len - pos, "%lldx", (long long)t->shape[i]);
  snprintf(buf + pos, len - pos, "%s>", names[t->et]);
  return buf;
}

static bool eat(const char **p, const char *lit) {
  size_t n = strlen(lit);
  if (strncmp(*p, lit, n) != 0) return false;
  *p += n;
  return true;
}

/* tensor<2x3xf32> */
static bool parse_type(const char **p, mtype *t) {
  memset(t, 0, sizeof *t);
  if (!eat(p, "tensor<")) return false;
  for (;;) {
    if (**p >= '0' && **p <= '9') {
      char *end;
      long long v = strtoll(*p, &end, 10);
      if (*end != 'x' || t->rank >= TOPOS_MAX_RANK) return false;
      t->shape[t->rank++] = v;
      *p = end + 1;
      continue;
    }
    if (eat(p, "f32>"))
      t->et = ET_F32;
    else if (eat(p, "f64>"))
      t->et = ET_F64;
    else if (eat(p, "bf16>"))
      t->et = ET_BF16;
    else if (eat(p, "i32>"))
      t->et = ET_I32;
    else if (eat(p, "i1>"))
      t->et = ET_I1;
    else
      return false;
    return true;
  }
}

/* "(T, T, ...)" into types; returns the count or -1. */
static int parse_type_list(const char **p, mtype *types, int cap) {
  if (!eat(p, "(")) return -1;
  int n = 0;
  if (eat(p, ")")) return 0;
  for (;;) {
    if (n >= cap || !parse_type(p, &types[n])) return -1;
    n++;
    if (eat(p, ")")) return n;
    if (!eat(p, ", ")) return -1;
  }
}

static int find_val(const mmod *m, const char *name) {
  for (int i = m->nvals - 1; i >= 0; i--)
    if (strcmp(m->vals[i].name, name) == 0) return i;
  return -1;
}

static int add_val(mmod *m, int line, const char *name, const mtype *t) {
  if (find_val(m, name) >= 0)
    return mfail(m, line, "%s is defined twice", name);
  if (m->nvals == m->capvals) {
    m->capvals = m->capvals ? m->capvals * 2 : 64;
    m->vals = realloc(m->vals, sizeof(mval) * (size_t)m->capvals);
  }
  mval *v = &m->vals[m->nvals];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->t = *t;
  return m->nvals++;
}

/* An SSA name at *p ("%12", "%arg0"). */
static bool parse_name(const char **p, char *out, size_t len) {
  if (**p != '%') return false;
  size_t n = 1;
  while ((*p)[n] && (isalnum((unsigned char)(*p)[n]) || (*p)[n] == '_')) n++;
  if (n == 1 || n >= len) return false;
  memcpy(out, *p, n);
  out[n] = '\0';
  *p += n;
  return true;
}

/* "(%a, %b)" into value indices (each must be defined). */
static int parse_operands(mmod *m, int line, const char **p, int **out) {
  *out = NULL;
  if (!eat(p, "(")) return mfail(m, line, "expected '('");
  int n = 0, cap = 0;
  if (eat(p, ")")) return 0;
  for (;;) {
    char name[24];
    if (!parse_name(p, name, sizeof name))
      return mfail(m, line, "expected an SSA name at '%.20s'", *p);
    int v = find_val(m, name);
    if (v < 0) return mfail(m, line, "%s is not defined", name);
    if (n == cap) {
      cap = cap ? cap * 2 : 4;
      *out = realloc(*out, sizeof(int) * (size_t)cap);
    }
    (*out)[n++] = v;
    if (eat(p, ")")) return n;
    if (!eat(p, ", ")) return mfail(m, line, "expected ', ' or ')'");
  }
}

/* ' {attrs}' (optional) then ' : (types) -> type'. */
static int parse_tail(mmod *m, int line, const char **p, mop *op) {
  const char *s = *p;
  op->attrs = strdup("");
  if (eat(&s, " {")) {
    const char *start = s - 1;
    int depth = 1;
    while (*s && depth) {
      if (*s == '{') depth++;
      if (*s == '}') depth--;
      s++;
    }
    if (depth) return mfail(m, line, "unbalanced attribute braces");
    free(op->attrs);
    op->attrs = strndup(start, (size_t)(s - start));
  }
  if (!eat(&s, " : ")) return mfail(m, line, "expected ' : '");
  op->optypes = malloc(sizeof(mtype) * 64);
  op->noptypes = parse_type_list(&s, op->optypes, 64);
  if (op->noptypes < 0) return mfail(m, line, "bad operand type list");
  if (!eat(&s, " -> ") || !parse_type(&s, &op->rt))
    return mfail(m, line, "bad result type");
  if (*s) return mfail(m, line, "trailing text '%s'", s);
  *p = s;
  return 0;
}

static char *line_dup(const char *start, const char *end) {
  return strndup(start, (size_t)(end - start));
}

/* Parses the generic module text into m.  0, or -1 with m->err. */
static int parse_module(mmod *m, const char *text) {
  memset(m, 0, sizeof *m);
  /* Split into lines. */
  int nlines = 0, cap = 64;
  char **lines = malloc(sizeof(char *) * (size_t)cap);
  for (const char *s = text; *s;) {
    const char *nl = strchr(s, '\n');
    const char *end = nl ? nl : s + strlen(s);
    if (nlines == cap)
      lines = realloc(lines, sizeof(char *) * (size_t)(cap *= 2));
    lines[nlines++] = line_dup(s, end);
    s = nl ? nl + 1 : end;
  }
  int rc = -1, li = 0;
  const char *p;
  if (nlines < 4 || strcmp(lines[0], "module {") != 0) {
    mfail(m, 0, "the module does not open with 'module {'");
    goto done;
  }
  li = 1;
  p = lines[1];
  if (!eat(&p, "  func.func @main(")) {
    mfail(m, li, "expected '  func.func @main('");
    goto done;
  }
  while (!eat(&p, ")")) {
    char name[24];
    mtype t;
    if (m->nargs && !eat(&p, ", ")) {
      mfail(m, li, "bad argument list");
      goto done;
    }
    if (!parse_name(&p, name, sizeof name) || !eat(&p, ": ") ||
        !parse_type(&p, &t)) {
      mfail(m, li, "bad argument");
      goto done;
    }
    char want[24];
    snprintf(want, sizeof want, "%%arg%d", m->nargs);
    if (strcmp(name, want) != 0) {
      mfail(m, li, "argument %s should be named %s", name, want);
      goto done;
    }
    int v = add_val(m, li, name, &t);
    if (v < 0) goto done;
    m->args[m->nargs++] = v;
  }
  if (!eat(&p, " -> ") || (m->nres = parse_type_list(&p, m->res, 256)) < 0 ||
      !eat(&p, " {") || *p) {
    mfail(m, li, "bad result list");
    goto done;
  }
  bool returned = false;
  for (li = 2; li < nlines; li++) {
    p = lines[li];
    if (strcmp(p, "  }") == 0) break;
    if (returned) {
      mfail(m, li, "text after the return");
      goto done;
    }
    while (*p == ' ') p++;
    if (eat(&p, "\"func.return\"")) {
      int *ops = NULL;
      int n = parse_operands(m, li, &p, &ops);
      mtype types[256];
      int nt = -1;
      if (n >= 0 && eat(&p, " : ")) nt = parse_type_list(&p, types, 256);
      if (n < 0 || nt != n || !eat(&p, " -> ()") || *p) {
        free(ops);
        mfail(m, li, "bad return");
        goto done;
      }
      for (int k = 0; k < n; k++) {
        m->ret[k] = ops[k];
        if (!mtype_eq(&types[k], &m->vals[ops[k]].t)) {
          free(ops);
          mfail(m, li, "return operand %d's listed type differs from its value",
                k);
          goto done;
        }
      }
      m->nret = n;
      free(ops);
      returned = true;
      continue;
    }
    mop op;
    memset(&op, 0, sizeof op);
    op.line = li;
    char name[24];
    /* CHLO ops (erf) keep their dialect in the name: "chlo.erf". */
    bool chlo = false;
    if (!parse_name(&p, name, sizeof name) ||
        !(eat(&p, " = \"stablehlo.") || (chlo = eat(&p, " = \"chlo.")))) {
      mfail(m, li, "expected '%%N = \"stablehlo.'");
      goto done;
    }
    const char *q = strchr(p, '"');
    if (!q || q - p + (chlo ? 5 : 0) >= (long)sizeof op.op) {
      mfail(m, li, "bad op name");
      goto done;
    }
    if (chlo) memcpy(op.op, "chlo.", 5);
    memcpy(op.op + (chlo ? 5 : 0), p, (size_t)(q - p));
    p = q + 1;
    op.nops = parse_operands(m, li, &p, &op.ops);
    if (op.nops < 0) goto fail_op;
    if (eat(&p, " ({")) {
      if (*p) {
        mfail(m, li, "text after '({'");
        goto fail_op;
      }
      /* ^bb0(%a: T, %b: T): / inner op / return / }) tail */
      op.region = true;
      if (li + 4 >= nlines) {
        mfail(m, li, "truncated region");
        goto fail_op;
      }
      const char *b = lines[++li];
      while (*b == ' ') b++;
      char a0[24], a1[24];
      mtype t0, t1;
      if (!eat(&b, "^bb0(") || !parse_name(&b, a0, sizeof a0) ||
          !eat(&b, ": ") || !parse_type(&b, &t0) || !eat(&b, ", ") ||
          !parse_name(&b, a1, sizeof a1) || !eat(&b, ": ") ||
          !parse_type(&b, &t1) || !eat(&b, "):") || *b) {
        mfail(m, li, "bad region block header");
        goto fail_op;
      }
      if (t0.rank || t1.rank || !mtype_eq(&t0, &t1)) {
        mfail(m, li, "region arguments must be equal scalars");
        goto fail_op;
      }
      int v0 = add_val(m, li, a0, &t0), v1 = add_val(m, li, a1, &t1);
      if (v0 < 0 || v1 < 0) goto fail_op;
      const char *in = lines[++li];
      while (*in == ' ') in++;
      char rname[24];
      if (!parse_name(&in, rname, sizeof rname) ||
          !eat(&in, " = \"stablehlo.")) {
        mfail(m, li, "bad region op");
        goto fail_op;
      }
      const char *qq = strchr(in, '"');
      if (!qq || qq - in >= (long)sizeof op.region_op) {
        mfail(m, li, "bad region op name");
        goto fail_op;
      }
      memcpy(op.region_op, in, (size_t)(qq - in));
      in = qq + 1;
      mop inner;
      memset(&inner, 0, sizeof inner);
      inner.nops = parse_operands(m, li, &in, &inner.ops);
      int trc = inner.nops == 2 ? parse_tail(m, li, &in, &inner) : -1;
      bool ok = trc == 0 && inner.ops[0] == v0 && inner.ops[1] == v1 &&
                inner.noptypes == 2 && mtype_eq(&inner.optypes[0], &t0) &&
                mtype_eq(&inner.optypes[1], &t0) && mtype_eq(&inner.rt, &t0);
      free(inner.ops);
      free(inner.optypes);
      free(inner.attrs);
      if (!ok) {
        mfail(m, li, "the region op must combine its two block arguments");
        goto fail_op;
      }
      int rv = add_val(m, li, rname, &t0);
      if (rv < 0) goto fail_op;
      const char *rt = lines[++li];
      while (*rt == ' ') rt++;
      char want[96], tt[64];
      snprintf(want, sizeof want, "\"stablehlo.return\"(%s) : (%s) -> ()",
               rname, mtype_text(&t0, tt, sizeof tt));
      if (strcmp(rt, want) != 0) {
        mfail(m, li, "expected '%s'", want);
        goto fail_op;
      }
      p = lines[++li];
      while (*p == ' ') p++;
      if (!eat(&p, "})")) {
        mfail(m, li, "expected '})'");
        goto fail_op;
      }
    }
    if (parse_tail(m, li, &p, &op)) goto fail_op;
    if (op.noptypes != op.nops) {
      mfail(m, li, "%d operands but %d operand types", op.nops, op.noptypes);
      goto fail_op;
    }
    for (int k = 0; k < op.nops; k++)
      if (!mtype_eq(&op.optypes[k], &m->vals[op.ops[k]].t)) {
        char a[64], b[64];
        mfail(m, li, "operand %d is listed as %s but %s is %s", k,
              mtype_text(&op.optypes[k], a, sizeof a), m->vals[op.ops[k]].name,
              mtype_text(&m->vals[op.ops[k]].t, b, sizeof b));
        goto fail_op;
      }
    op.res = add_val(m, li, name, &op.rt);
    if (op.res < 0) goto fail_op;
    if (m->nops == m->capops) {
      m->capops = m->capops ? m->capops * 2 : 64;
      m->ops = realloc(m->ops, sizeof(mop) * (size_t)m->capops);
    }
    m->ops[m->nops++] = op;
    continue;
  fail_op:
    free(op.ops);
    free(op.optypes);
    free(op.attrs);
    goto done;
  }
  if (!returned) {
    mfail(m, li, "no return");
    goto done;
  }
  if (li + 1 >= nlines || strcmp(lines[li + 1], "}") != 0 || li + 2 != nlines) {
    mfail(m, li, "the module does not close with '  }' and '}'");
    goto done;
  }
  if (m->nret != m->nres) {
    mfail(m, li, "%d values returned, %d declared", m->nret, m->nres);
    goto done;
  }
  for (int k = 0; k < m->nret; k++)
    if (!mtype_eq(&m->vals[m->ret[k]].t, &m->res[k])) {
      mfail(m, li, "result %d's type differs from the signature", k);
      goto done;
    }
  rc = 0;
done:
  for (int i = 0; i < nlines; i++) free(lines[i]);
  free(lines);
  return rc;
}

/* ============================================================ attributes */

/* The integers of `key = <list>` in attrs ("array<i64: 1, 2>", "[1, 2]",
 * "3 : i64", "dense<[[0, 1], [2, 3]]> : ..."), in order.  -1 when absent. */
static int attr_ints(const char *attrs, const char *key, int64_t *out,
                     int cap) {
  char pat[96];
  snprintf(pat, sizeof pat, "%s = ", key);
  const char *s = attrs;
  for (;;) {
    s = strstr(s, pat);
    if (!s) return -1;
    /* Whole key: preceded by '{', ' ' or '<'. */
    if (s == attrs || s[-1] == ' ' || s[-1] == '{' || s[-1] == '<') break;
    s++;
  }
  s += strlen(pat);
  if (eat(&s, "array<i64>")) return 0;
  char stop;
  if (eat(&s, "array<i64: ") || eat(&s, "dense<")) {
    stop = '>';
  } else if (eat(&s, "[")) {
    stop = ']';
  } else {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s) return -1;
    if (cap > 0) out[0] = v;
    return 1;
  }
  int n = 0;
  for (;;) {
    while (*s == ' ' || *s == ',' || *s == '[' || (stop == '>' && *s == ']'))
      s++;
    if (*s == stop || *s == '\0') break;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s) return -1;
    if (n < cap) out[n] = v;
    n++;
    s = end;
  }
  return n;
}

static bool attr_has(const char *attrs, const char *text) {
  return strstr(attrs, text) != NULL;
}

/* The three lists of #stablehlo.conv<[b, f, 0, 1]x[i, 0, 1, o]->[...]>:
 * for each, the position of b/f (i/o) and of spatial dims 0 and 1. */
typedef struct conv_layout {
  int batch, feature, spatial[2];    /* input */
  int kin, kout, kspatial[2];        /* kernel */
  int obatch, ofeature, ospatial[2]; /* output */
} conv_layout;

static bool parse_conv_list(const char **p, char a, char b, int *pa, int *pb,
                            int *sp) {
  if (!eat(p, "[")) return false;
  *pa = *pb = sp[0] = sp[1] = -1;
  for (int pos = 0;; pos++) {
    char c = **p;
    if (c == a)
      *pa = pos;
    else if (c == b)
      *pb = pos;
    else if (c == '0' || c == '1')
      sp[c - '0'] = pos;
    else
      return false;
    (*p)++;
    if (eat(p, "]"))
      return pos == 3 && *pa >= 0 && *pb >= 0 && sp[0] >= 0 && sp[1] >= 0;
    if (!eat(p, ", ")) return false;
  }
}

static bool parse_conv_layout(const char *attrs, conv_layout *l) {
  const char *s = strstr(attrs, "#stablehlo.conv<");
  if (!s) return false;
  s += strlen("#stablehlo.conv<");
  return parse_conv_list(&s, 'b', 'f', &l->batch, &l->feature, l->spatial) &&
         eat(&s, "x") &&
         parse_conv_list(&s, 'i', 'o', &l->kin, &l->kout, l->kspatial) &&
         eat(&s, "->") &&
         parse_conv_list(&s, 'b', 'f', &l->obatch, &l->ofeature, l->ospatial) &&
         eat(&s, ">");
}

/* ================================================== the shape rule checks */

static bool is_float_et(int et) {
  return et == ET_F32 || et == ET_F64 || et == ET_BF16;
}

/* Checks one op against its StableHLO shape rule; NULL when it holds,
 * else a message in buf. */
static const char *check_op(const mmod *m, const mop *op, char *buf,
                            size_t len) {
  const mtype *rt = &op->rt;
  const mtype *in[64];
  for (int k = 0; k < op->nops && k < 64; k++) in[k] = &m->vals[op->ops[k]].t;
  const char *a = op->attrs;
  int64_t l1[16], l2[16], l3[16], l4[16];
  int n1, n2, n3, n4;
#define BAD(...)                     \
  do {                               \
    snprintf(buf, len, __VA_ARGS__); \
    return buf;                      \
  } while (0)
#define NOPS(k) \
  if (op->nops != (k)) BAD("%s takes %d operands, has %d", op->op, k, op->nops)

  static const char *binary[] = {"add",    "subtract", "multiply",
                                 "divide", "power",    "maximum"};
  static const char *unary[] = {"negate", "exponential", "log",     "sqrt",
                                "tanh",   "abs",         "chlo.erf"};
  for (size_t k = 0; k < sizeof binary / sizeof *binary; k++)
    if (strcmp(op->op, binary[k]) == 0) {
      NOPS(2);
      if (!mtype_eq(in[0], in[1]) || !mtype_eq(in[0], rt))
        BAD("%s: operand and result types differ", op->op);
      if (in[0]->et == ET_I1) BAD("%s on i1", op->op);
      if (in[0]->et == ET_I32 && strcmp(op->op, "add") != 0)
        BAD("%s on i32 (only index add is emitted)", op->op);
      return NULL;
    }
  for (size_t k = 0; k < sizeof unary / sizeof *unary; k++)
    if (strcmp(op->op, unary[k]) == 0) {
      NOPS(1);
      if (!mtype_eq(in[0], rt)) BAD("%s: operand and result differ", op->op);
      if (!is_float_et(in[0]->et)) BAD("%s needs a float", op->op);
      return NULL;
    }
  if (strcmp(op->op, "constant") == 0) {
    NOPS(0);
    const char *v = strstr(a, "value = dense<");
    if (!v) BAD("constant without a dense value");
    v += strlen("value = dense<");
    const char *close = strstr(v, "> : ");
    if (!close) BAD("constant value has no type");
    const char *tp = close + 4;
    mtype vt;
    if (!parse_type(&tp, &vt) || !mtype_eq(&vt, rt) || strcmp(tp, "}") != 0)
      BAD("constant value type differs from the result");
    /* Leaves: a splat (no '['), none (dense<>), or one per element. */
    int64_t leaves = 0;
    bool nested = false, in_tok = false;
    for (const char *c = v; c < close; c++) {
      if (*c == '[') nested = true;
      bool tok = !(*c == '[' || *c == ']' || *c == ',' || *c == ' ');
      if (tok && !in_tok) leaves++;
      in_tok = tok;
    }
    if (v == close) {
      if (mcount(rt) != 0) BAD("dense<> for a non-empty tensor");
    } else if (!nested) {
      if (leaves != 1) BAD("bad splat literal");
    } else if (leaves != mcount(rt)) {
      BAD("literal has %lld elements, the type %lld", (long long)leaves,
          (long long)mcount(rt));
    }
    return NULL;
  }
  if (strcmp(op->op, "compare") == 0) {
    NOPS(2);
    if (!mtype_eq(in[0], in[1])) BAD("compare operands differ");
    mtype want = *in[0];
    want.et = ET_I1;
    if (!mtype_eq(&want, rt)) BAD("compare result is not the operands' i1");
    static const char *dirs[] = {"EQ", "NE", "GE", "GT", "LE", "LT"};
    bool ok = false;
    for (int k = 0; k < 6; k++) {
      char d[64];
      snprintf(d, sizeof d, "#stablehlo<comparison_direction %s>", dirs[k]);
      ok = ok || attr_has(a, d);
    }
    if (!ok) BAD("compare without a direction");
    return NULL;
  }
  if (strcmp(op->op, "select") == 0) {
    NOPS(3);
    mtype want = *in[1];
    want.et = ET_I1;
    if (!mtype_eq(in[0], &want)) BAD("select predicate is not i1 of the shape");
    if (!mtype_eq(in[1], in[2]) || !mtype_eq(in[1], rt))
      BAD("select branches and result differ");
    return NULL;
  }
  if (strcmp(op->op, "convert") == 0) {
    NOPS(1);
    mtype want = *in[0];
    want.et = rt->et;
    if (!mtype_eq(&want, rt)) BAD("convert changes the shape");
    return NULL;
  }
  if (strcmp(op->op, "reshape") == 0) {
    NOPS(1);
    if (in[0]->et != rt->et || mcount(in[0]) != mcount(rt))
      BAD("reshape changes the element count or type");
    return NULL;
  }
  if (strcmp(op->op, "transpose") == 0) {
    NOPS(1);
    n1 = attr_ints(a, "permutation", l1, 16);
    if (n1 != in[0]->rank || rt->rank != n1 || rt->et != in[0]->et)
      BAD("transpose permutation length %d for rank %d", n1, in[0]->rank);
    bool seen[16] = {false};
    for (int i = 0; i < n1; i++) {
      if (l1[i] < 0 || l1[i] >= n1 || seen[l1[i]]) BAD("not a permutation");
      seen[l1[i]] = true;
      if (rt->shape[i] != in[0]->shape[l1[i]])
        BAD("transpose result axis %d is %lld, operand axis %lld is %lld", i,
            (long long)rt->shape[i], (long long)l1[i],
            (long long)in[0]->shape[l1[i]]);
    }
    return NULL;
  }
  if (strcmp(op->op, "broadcast_in_dim") == 0) {
    NOPS(1);
    n1 = attr_ints(a, "broadcast_dimensions", l1, 16);
    if (n1 != in[0]->rank || rt->et != in[0]->et)
      BAD("broadcast_dimensions has %d entries for rank %d", n1, in[0]->rank);
    for (int i = 0; i < n1; i++) {
      if (l1[i] < 0 || l1[i] >= rt->rank || (i && l1[i] <= l1[i - 1]))
        BAD("broadcast_dimensions not increasing in range");
      if (in[0]->shape[i] != 1 && in[0]->shape[i] != rt->shape[l1[i]])
        BAD("operand axis %d (%lld) does not broadcast to %lld", i,
            (long long)in[0]->shape[i], (long long)rt->shape[l1[i]]);
    }
    return NULL;
  }
  if (strcmp(op->op, "slice") == 0) {
    NOPS(1);
    int r = in[0]->rank;
    n1 = attr_ints(a, "start_indices", l1, 16);
    n2 = attr_ints(a, "limit_indices", l2, 16);
    n3 = attr_ints(a, "strides", l3, 16);
    if (n1 != r || n2 != r || n3 != r || rt->rank != r || rt->et != in[0]->et)
      BAD("slice attributes do not match rank %d", r);
    for (int i = 0; i < r; i++) {
      if (l1[i] < 0 || l1[i] > l2[i] || l2[i] > in[0]->shape[i] || l3[i] < 1)
        BAD("slice axis %d: [%lld:%lld:%lld] outside %lld", i, (long long)l1[i],
            (long long)l2[i], (long long)l3[i], (long long)in[0]->shape[i]);
      int64_t want = (l2[i] - l1[i] + l3[i] - 1) / l3[i];
      if (rt->shape[i] != want)
        BAD("slice axis %d gives %lld, result says %lld", i, (long long)want,
            (long long)rt->shape[i]);
    }
    return NULL;
  }
  if (strcmp(op->op, "pad") == 0) {
    NOPS(2);
    int r = in[0]->rank;
    n1 = attr_ints(a, "edge_padding_low", l1, 16);
    n2 = attr_ints(a, "edge_padding_high", l2, 16);
    n3 = attr_ints(a, "interior_padding", l3, 16);
    if (n1 != r || n2 != r || n3 != r || rt->rank != r || rt->et != in[0]->et)
      BAD("pad attributes do not match rank %d", r);
    if (in[1]->rank != 0 || in[1]->et != in[0]->et)
      BAD("pad value is not a scalar of the operand's type");
    for (int i = 0; i < r; i++) {
      int64_t e = in[0]->shape[i];
      if (l3[i] < 0) BAD("negative interior padding");
      int64_t want = l1[i] + l2[i] + e + (e > 0 ? (e - 1) * l3[i] : 0);
      if (want != rt->shape[i])
        BAD("pad axis %d gives %lld, result says %lld", i, (long long)want,
            (long long)rt->shape[i]);
    }
    return NULL;
  }
  if (strcmp(op->op, "concatenate") == 0) {
    if (op->nops < 1) BAD("concatenate without operands");
    n1 = attr_ints(a, "dimension", l1, 16);
    if (n1 != 1 || l1[0] < 0 || l1[0] >= rt->rank) BAD("bad dimension");
    int64_t sum = 0;
    for (int k = 0; k < op->nops; k++) {
      if (in[k]->rank != rt->rank || in[k]->et != rt->et)
        BAD("concatenate operand %d differs in rank or type", k);
      for (int i = 0; i < rt->rank; i++)
        if (i != l1[0] && in[k]->shape[i] != rt->shape[i])
          BAD("concatenate operand %d differs on axis %d", k, i);
      sum += in[k]->shape[l1[0]];
    }
    if (sum != rt->shape[l1[0]]) BAD("concatenated extent is wrong");
    return NULL;
  }
  if (strcmp(op->op, "dot_general") == 0) {
    NOPS(2);
    if (!attr_has(a, "#stablehlo.dot<"))
      BAD("dot_general without #stablehlo.dot");
    n1 = attr_ints(a, "lhs_batching_dimensions", l1, 16);
    n2 = attr_ints(a, "rhs_batching_dimensions", l2, 16);
    n3 = attr_ints(a, "lhs_contracting_dimensions", l3, 16);
    n4 = attr_ints(a, "rhs_contracting_dimensions", l4, 16);
    if (n1 < 0) n1 = 0;
    if (n2 < 0) n2 = 0;
    if (n1 != n2 || n3 != n4 || n3 < 0) BAD("dot dimension lists differ");
    if (in[0]->et != in[1]->et || rt->et != in[0]->et) BAD("dot types differ");
    bool lused[16] = {false}, rused[16] = {false};
    mtype want = {in[0]->et, 0, {0}};
    for (int i = 0; i < n1; i++) {
      if (in[0]->shape[l1[i]] != in[1]->shape[l2[i]]) BAD("batch extents");
      lused[l1[i]] = rused[l2[i]] = true;
      want.shape[want.rank++] = in[0]->shape[l1[i]];
    }
    for (int i = 0; i < n3; i++) {
      if (l3[i] >= in[0]->rank || l4[i] >= in[1]->rank ||
          in[0]->shape[l3[i]] != in[1]->shape[l4[i]])
        BAD("contracting extents differ (%lld vs %lld)",
            (long long)in[0]->shape[l3[i]], (long long)in[1]->shape[l4[i]]);
      lused[l3[i]] = rused[l4[i]] = true;
    }
    for (int i = 0; i < in[0]->rank; i++)
      if (!lused[i]) want.shape[want.rank++] = in[0]->shape[i];
    for (int i = 0; i < in[1]->rank; i++)
      if (!rused[i]) want.shape[want.rank++] = in[1]->shape[i];
    if (!mtype_eq(&want, rt)) BAD("dot_general result shape is wrong");
    return NULL;
  }
  if (strcmp(op->op, "reduce") == 0) {
    NOPS(2);
    if (!op->region) BAD("reduce without a region");
    if (strcmp(op->region_op, "add") && strcmp(op->region_op, "maximum"))
      BAD("reduce region op %s", op->region_op);
    if (in[1]->rank != 0 || in[1]->et != in[0]->et) BAD("reduce init type");
    n1 = attr_ints(a, "dimensions", l1, 16);
    if (n1 < 0) BAD("reduce without dimensions");
    mtype want = {in[0]->et, 0, {0}};
    for (int i = 0, k = 0; i < in[0]->rank; i++) {
      if (k < n1 && l1[k] == i) {
        k++;
        continue;
      }
      want.shape[want.rank++] = in[0]->shape[i];
    }
    for (int k = 0; k < n1; k++)
      if (l1[k] < 0 || l1[k] >= in[0]->rank || (k && l1[k] <= l1[k - 1]))
        BAD("reduce dimensions not increasing in range");
    if (!mtype_eq(&want, rt)) BAD("reduce result does not drop the dims");
    return NULL;
  }
  if (strcmp(op->op, "reduce_window") == 0) {
    NOPS(2);
    int r = in[0]->rank;
    if (!op->region || strcmp(op->region_op, "maximum"))
      BAD("reduce_window needs a maximum region");
    if (in[1]->rank != 0 || in[1]->et != in[0]->et) BAD("init type");
    n1 = attr_ints(a, "window_dimensions", l1, 16);
    n2 = attr_ints(a, "window_strides", l2, 16);
    n3 = attr_ints(a, "window_dilations", l3, 16);
    int64_t pads[32];
    n4 = attr_ints(a, "padding", pads, 32);
    if (n1 != r || n2 != r || n3 != r || (n4 >= 0 && n4 != 2 * r))
      BAD("reduce_window attributes do not match rank %d", r);
    if (rt->rank != r || rt->et != in[0]->et) BAD("reduce_window result");
    for (int i = 0; i < r; i++) {
      int64_t lo = n4 > 0 ? pads[2 * i] : 0, hi = n4 > 0 ? pads[2 * i + 1] : 0;
      int64_t span = (l1[i] - 1) * l3[i] + 1, ext = in[0]->shape[i] + lo + hi;
      int64_t want = ext < span ? 0 : (ext - span) / l2[i] + 1;
      if (want != rt->shape[i])
        BAD("reduce_window axis %d gives %lld, result says %lld", i,
            (long long)want, (long long)rt->shape[i]);
    }
    return NULL;
  }
  if (strcmp(op->op, "convolution") == 0) {
    NOPS(2);
    conv_layout L;
    if (!parse_conv_layout(a, &L)) BAD("bad #stablehlo.conv layout");
    if (in[0]->rank != 4 || in[1]->rank != 4 || rt->rank != 4)
      BAD("convolution needs rank 4");
    if (in[0]->et != in[1]->et || rt->et != in[0]->et) BAD("types differ");
    n1 = attr_ints(a, "window_strides", l1, 16);
    n2 = attr_ints(a, "rhs_dilation", l2, 16);
    n3 = attr_ints(a, "lhs_dilation", l3, 16);
    int64_t pads[8];
    n4 = attr_ints(a, "padding", pads, 8);
    if (n1 != 2 || n2 != 2 || n3 != 2 || n4 != 4 || l3[0] != 1 || l3[1] != 1)
      BAD("convolution window attributes");
    if (!attr_has(a, "feature_group_count = 1 : i64") ||
        !attr_has(a, "batch_group_count = 1 : i64"))
      BAD("group counts");
    if (in[0]->shape[L.feature] != in[1]->shape[L.kin])
      BAD("input features %lld vs kernel input features %lld",
          (long long)in[0]->shape[L.feature], (long long)in[1]->shape[L.kin]);
    if (rt->shape[L.obatch] != in[0]->shape[L.batch] ||
        rt->shape[L.ofeature] != in[1]->shape[L.kout])
      BAD("convolution batch or output features");
    for (int s = 0; s < 2; s++) {
      int64_t k = in[1]->shape[L.kspatial[s]];
      int64_t ext = in[0]->shape[L.spatial[s]] + pads[2 * s] + pads[2 * s + 1];
      int64_t span = (k - 1) * l2[s] + 1;
      int64_t want = ext < span ? 0 : (ext - span) / l1[s] + 1;
      if (rt->shape[L.ospatial[s]] != want)
        BAD("convolution spatial %d gives %lld, result says %lld", s,
            (long long)want, (long long)rt->shape[L.ospatial[s]]);
    }
    return NULL;
  }
  if (strcmp(op->op, "gather") == 0) {
    NOPS(2);
    n1 = attr_ints(a, "offset_dims", l1, 16);
    n2 = attr_ints(a, "collapsed_slice_dims", l2, 16);
    n3 = attr_ints(a, "start_index_map", l3, 16);
    int64_t ivd[1], sizes[16];
    int nivd = attr_ints(a, "index_vector_dim", ivd, 1);
    int ns = attr_ints(a, "slice_sizes", sizes, 16);
    const mtype *op0 = in[0], *idx = in[1];
    if (n1 < 0 || n2 < 0 || n3 < 0 || nivd != 1 || ns != op0->rank)
      BAD("gather attributes");
    if (idx->et != ET_I32 || rt->et != op0->et) BAD("gather types");
    int64_t vec = ivd[0] < idx->rank ? idx->shape[ivd[0]] : 1;
    if (vec != n3)
      BAD("index vector has %lld entries, start_index_map %d", (long long)vec,
          n3);
    for (int i = 0; i < op0->rank; i++)
      if (sizes[i] < 0 || sizes[i] > op0->shape[i]) BAD("slice size %d", i);
    int64_t offs[16];
    int no = 0;
    for (int i = 0; i < op0->rank; i++) {
      bool collapsed = false;
      for (int k = 0; k < n2; k++) collapsed = collapsed || l2[k] == i;
      if (collapsed && sizes[i] != 1) BAD("collapsed dim %d has size != 1", i);
      if (!collapsed) offs[no++] = sizes[i];
    }
    if (no != n1) BAD("offset_dims count");
    int64_t batch[16];
    int nb = 0;
    for (int i = 0; i < idx->rank; i++)
      if (i != ivd[0]) batch[nb++] = idx->shape[i];
    mtype want = {op0->et, nb + no, {0}};
    for (int i = 0, ob = 0, oo = 0; i < nb + no; i++) {
      bool is_off = false;
      for (int k = 0; k < n1; k++) is_off = is_off || l1[k] == i;
      want.shape[i] = is_off ? offs[oo++] : batch[ob++];
    }
    if (!mtype_eq(&want, rt)) BAD("gather result shape is wrong");
    return NULL;
  }
  if (strcmp(op->op, "scatter") == 0) {
    NOPS(3);
    if (!op->region || strcmp(op->region_op, "add"))
      BAD("scatter needs an add region");
    const mtype *op0 = in[0], *idx = in[1], *upd = in[2];
    if (!mtype_eq(op0, rt)) BAD("scatter result differs from its operand");
    if (idx->et != ET_I32 || upd->et != op0->et) BAD("scatter types");
    n1 = attr_ints(a, "update_window_dims", l1, 16);
    n2 = attr_ints(a, "inserted_window_dims", l2, 16);
    n3 = attr_ints(a, "scatter_dims_to_operand_dims", l3, 16);
    int64_t ivd[1];
    if (n1 < 0 || n2 < 0 || n3 < 0 ||
        attr_ints(a, "index_vector_dim", ivd, 1) != 1)
      BAD("scatter attributes");
    int64_t vec = ivd[0] < idx->rank ? idx->shape[ivd[0]] : 1;
    if (vec != n3) BAD("index vector size");
    int64_t batch[16];
    int nb = 0;
    for (int i = 0; i < idx->rank; i++)
      if (i != ivd[0]) batch[nb++] = idx->shape[i];
    if (upd->rank != nb + n1) BAD("updates rank %d", upd->rank);
    int ob = 0, w = 0;
    for (int i = 0; i < upd->rank; i++) {
      bool is_win = false;
      for (int k = 0; k < n1; k++) is_win = is_win || l1[k] == i;
      if (!is_win) {
        if (upd->shape[i] != batch[ob++]) BAD("update scatter dim %d", i);
        continue;
      }
      /* The w-th window dim maps to the w-th operand dim not inserted. */
      int od = -1;
      for (int d = 0, seen = 0; d < op0->rank; d++) {
        bool ins = false;
        for (int k = 0; k < n2; k++) ins = ins || l2[k] == d;
        if (ins) continue;
        if (seen++ == w) {
          od = d;
          break;
        }
      }
      w++;
      if (od < 0 || upd->shape[i] > op0->shape[od]) BAD("update window dim");
    }
    if (w + n2 != op0->rank) BAD("window dims and inserted dims");
    return NULL;
  }
  BAD("unknown op stablehlo.%s", op->op);
#undef BAD
#undef NOPS
}

/* Parses and checks a generic module against expected signature types.
 * NULL when everything holds; else a message (static storage). */
static const char *verify_module(const char *text, const mtype *args, int nargs,
                                 const mtype *res, int nres, mmod *keep) {
  static char msg[1400];
  mmod m;
  if (parse_module(&m, text)) {
    snprintf(msg, sizeof msg, "parse: %s", m.err);
    mmod_free(&m);
    return msg;
  }
  const char *why = NULL;
  char buf[512];
  if (m.nargs != nargs) {
    snprintf(msg, sizeof msg, "%d arguments, expected %d", m.nargs, nargs);
    why = msg;
  }
  for (int k = 0; !why && k < nargs; k++)
    if (!mtype_eq(&m.vals[m.args[k]].t, &args[k])) {
      snprintf(msg, sizeof msg, "argument %d has the wrong type", k);
      why = msg;
    }
  if (!why && m.nres != nres) {
    snprintf(msg, sizeof msg, "%d results, expected %d", m.nres, nres);
    why = msg;
  }
  for (int k = 0; !why && k < nres; k++)
    if (!mtype_eq(&m.res[k], &res[k])) {
      snprintf(msg, sizeof msg, "result %d has the wrong type", k);
      why = msg;
    }
  for (int i = 0; !why && i < m.nops; i++) {
    const char *e = check_op(&m, &m.ops[i], buf, sizeof buf);
    if (e) {
      snprintf(msg, sizeof msg, "line %d (stablehlo.%s): %s", m.ops[i].line + 1,
               m.ops[i].op, e);
      why = msg;
    }
  }
  if (keep && !why)
    *keep = m;
  else
    mmod_free(&m);
  return why;
}

/* ============================================================= evaluator */

/* Rounds x to the element type (f32/bf16 once, i32 wraps, i1 to 0/1). */
static double round_to(int et, double x) {
  switch (et) {
    case ET_F32:
      return (double)(float)x;
    case ET_BF16:
      return (double)topos_bf16_to_f32(topos_bf16_from_f32((float)x));
    case ET_I32:
      return (double)(int32_t)(uint32_t)(int64_t)x;
    case ET_I1:
      return x != 0;
  }
  return x;
}

/* Row-major index <-> coordinates. */
static void coords_of(const mtype *t, int64_t i, int64_t *c) {
  for (int a = t->rank - 1; a >= 0; a--) {
    c[a] = t->shape[a] ? i % t->shape[a] : 0;
    i = t->shape[a] ? i / t->shape[a] : 0;
  }
}

static int64_t index_of(const mtype *t, const int64_t *c) {
  int64_t i = 0;
  for (int a = 0; a < t->rank; a++) i = i * t->shape[a] + c[a];
  return i;
}

static double combine(const char *op, double acc, double x) {
  if (strcmp(op, "add") == 0) return acc + x;
  if (isnan(acc) || isnan(x)) return NAN;
  return x > acc ? x : acc;
}

/* Parses one dense literal element for element type et. */
static double literal_element(int et, const char *tok, char **end) {
  if (tok[0] == '0' && tok[1] == 'x') {
    unsigned long long bits = strtoull(tok + 2, end, 16);
    if (et == ET_F32) {
      uint32_t b = (uint32_t)bits;
      float f;
      memcpy(&f, &b, 4);
      return f;
    }
    if (et == ET_BF16) return topos_bf16_to_f32((uint16_t)bits);
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  return strtod(tok, end);
}

static int eval_constant(const mop *op, double *out, int64_t n, char *why,
                         size_t len) {
  const char *v =
      strstr(op->attrs, "value = dense<") + strlen("value = dense<");
  const char *close = strstr(v, "> : ");
  if (v == close) return 0;
  bool splat = *v != '[';
  int64_t k = 0;
  for (const char *s = v; s < close;) {
    if (*s == '[' || *s == ']' || *s == ',' || *s == ' ') {
      s++;
      continue;
    }
    char *end;
    double x = literal_element(op->rt.et, s, &end);
    if (end == s) {
      snprintf(why, len, "bad literal at '%.16s'", s);
      return -1;
    }
    if (k < n) out[k] = x;
    k++;
    s = end;
  }
  if (splat)
    for (int64_t i = 1; i < n; i++) out[i] = out[0];
  else if (k != n) {
    snprintf(why, len, "literal has %lld of %lld elements", (long long)k,
             (long long)n);
    return -1;
  }
  return 0;
}

/* Evaluates one op into out (count of rt elements). */
static int eval_op(const mmod *m, const mop *op, double *out, char *why,
                   size_t len) {
  const mtype *rt = &op->rt;
  int64_t n = mcount(rt);
  const double *x[64];
  const mtype *t[64];
  for (int k = 0; k < op->nops && k < 64; k++) {
    x[k] = m->vals[op->ops[k]].v;
    t[k] = &m->vals[op->ops[k]].t;
  }
  const char *a = op->attrs, *name = op->op;
  int64_t c[16], d[16], l1[16], l2[16], l3[16], l4[16];
  if (strcmp(name, "constant") == 0) return eval_constant(op, out, n, why, len);
  if (strcmp(name, "add") == 0 || strcmp(name, "subtract") == 0 ||
      strcmp(name, "multiply") == 0 || strcmp(name, "divide") == 0 ||
      strcmp(name, "power") == 0 || strcmp(name, "maximum") == 0) {
    for (int64_t i = 0; i < n; i++) {
      double p = x[0][i], q = x[1][i];
      double r = name[0] == 'a'   ? p + q
                 : name[0] == 's' ? p - q
                 : name[0] == 'd' ? p / q
                 : name[0] == 'p' ? pow(p, q)
                 : name[1] == 'u' ? p * q
                                  : (isnan(p) || isnan(q) ? NAN : fmax(p, q));
      out[i] = r;
    }
    return 0;
  }
  static const struct {
    const char *name;
    double (*fn)(double);
  } unary[] = {{"exponential", exp}, {"log", log},  {"sqrt", sqrt},
               {"tanh", tanh},       {"abs", fabs}, {"chlo.erf", erf}};
  for (size_t k = 0; k < sizeof unary / sizeof *unary; k++)
    if (strcmp(name, unary[k].name) == 0) {
      for (int64_t i = 0; i < n; i++) out[i] = unary[k].fn(x[0][i]);
      return 0;
    }
  if (strcmp(name, "negate") == 0) {
    for (int64_t i = 0; i < n; i++) out[i] = -x[0][i];
    return 0;
  }
  if (strcmp(name, "compare") == 0) {
    const char *dir = strstr(a, "<comparison_direction ") + 22;
    for (int64_t i = 0; i < n; i++) {
      double p = x[0][i], q = x[1][i];
      bool r = strncmp(dir, "EQ", 2) == 0   ? p == q
               : strncmp(dir, "NE", 2) == 0 ? p != q
               : strncmp(dir, "GE", 2) == 0 ? p >= q
               : strncmp(dir, "GT", 2) == 0 ? p > q
               : strncmp(dir, "LE", 2) == 0 ? p <= q
                                            : p < q;
      out[i] = r;
    }
    return 0;
  }
  if (strcmp(name, "select") == 0) {
    for (int64_t i = 0; i < n; i++) out[i] = x[0][i] != 0 ? x[1][i] : x[2][i];
    return 0;
  }
  if (strcmp(name, "convert") == 0 || strcmp(name, "reshape") == 0) {
    for (int64_t i = 0; i < n; i++) out[i] = x[0][i];
    return 0;
  }
  if (strcmp(name, "transpose") == 0) {
    attr_ints(a, "permutation", l1, 16);
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      for (int k = 0; k < rt->rank; k++) d[l1[k]] = c[k];
      out[i] = x[0][index_of(t[0], d)];
    }
    return 0;
  }
  if (strcmp(name, "broadcast_in_dim") == 0) {
    attr_ints(a, "broadcast_dimensions", l1, 16);
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      for (int k = 0; k < t[0]->rank; k++)
        d[k] = t[0]->shape[k] == 1 ? 0 : c[l1[k]];
      out[i] = x[0][index_of(t[0], d)];
    }
    return 0;
  }
  if (strcmp(name, "slice") == 0) {
    attr_ints(a, "start_indices", l1, 16);
    attr_ints(a, "strides", l3, 16);
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      for (int k = 0; k < rt->rank; k++) d[k] = l1[k] + c[k] * l3[k];
      out[i] = x[0][index_of(t[0], d)];
    }
    return 0;
  }
  if (strcmp(name, "pad") == 0) {
    attr_ints(a, "edge_padding_low", l1, 16);
    attr_ints(a, "interior_padding", l3, 16);
    for (int64_t i = 0; i < n; i++) out[i] = x[1][0];
    int64_t cnt = mcount(t[0]);
    for (int64_t i = 0; i < cnt; i++) {
      coords_of(t[0], i, c);
      bool inside = true;
      for (int k = 0; k < rt->rank; k++) {
        d[k] = l1[k] + c[k] * (l3[k] + 1);
        inside = inside && d[k] >= 0 && d[k] < rt->shape[k];
      }
      if (inside) out[index_of(rt, d)] = x[0][i];
    }
    return 0;
  }
  if (strcmp(name, "concatenate") == 0) {
    attr_ints(a, "dimension", l1, 16);
    int ax = (int)l1[0];
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      int k = 0;
      int64_t pos = c[ax];
      while (pos >= t[k]->shape[ax]) pos -= t[k++]->shape[ax];
      memcpy(d, c, sizeof c);
      d[ax] = pos;
      out[i] = x[k][index_of(t[k], d)];
    }
    return 0;
  }
  if (strcmp(name, "dot_general") == 0) {
    int n1 = attr_ints(a, "lhs_batching_dimensions", l1, 16);
    attr_ints(a, "rhs_batching_dimensions", l2, 16);
    int n3 = attr_ints(a, "lhs_contracting_dimensions", l3, 16);
    attr_ints(a, "rhs_contracting_dimensions", l4, 16);
    if (n1 < 0) n1 = 0;
    bool lu[16] = {false}, ru[16] = {false};
    for (int k = 0; k < n1; k++) lu[l1[k]] = ru[l2[k]] = true;
    for (int k = 0; k < n3; k++) lu[l3[k]] = ru[l4[k]] = true;
    mtype ct = {0, n3, {0}};
    for (int k = 0; k < n3; k++) ct.shape[k] = t[0]->shape[l3[k]];
    int64_t nc = mcount(&ct), cc[16];
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      int64_t lc[16], rc[16];
      int pos = 0;
      for (int k = 0; k < n1; k++, pos++) lc[l1[k]] = rc[l2[k]] = c[pos];
      for (int k = 0; k < t[0]->rank; k++)
        if (!lu[k]) lc[k] = c[pos++];
      for (int k = 0; k < t[1]->rank; k++)
        if (!ru[k]) rc[k] = c[pos++];
      double acc = 0;
      for (int64_t j = 0; j < nc; j++) {
        coords_of(&ct, j, cc);
        for (int k = 0; k < n3; k++) lc[l3[k]] = rc[l4[k]] = cc[k];
        acc += x[0][index_of(t[0], lc)] * x[1][index_of(t[1], rc)];
      }
      out[i] = acc;
    }
    return 0;
  }
  if (strcmp(name, "reduce") == 0) {
    int n1 = attr_ints(a, "dimensions", l1, 16);
    for (int64_t i = 0; i < n; i++) out[i] = x[1][0];
    int64_t cnt = mcount(t[0]);
    for (int64_t i = 0; i < cnt; i++) {
      coords_of(t[0], i, c);
      int r = 0;
      for (int k = 0, j = 0; k < t[0]->rank; k++) {
        if (j < n1 && l1[j] == k) {
          j++;
          continue;
        }
        d[r++] = c[k];
      }
      int64_t o = index_of(rt, d);
      out[o] = combine(op->region_op, out[o], x[0][i]);
    }
    return 0;
  }
  if (strcmp(name, "reduce_window") == 0) {
    attr_ints(a, "window_dimensions", l1, 16);
    attr_ints(a, "window_strides", l2, 16);
    attr_ints(a, "window_dilations", l3, 16);
    int64_t pads[32] = {0};
    attr_ints(a, "padding", pads, 32);
    mtype wt = {0, rt->rank, {0}};
    memcpy(wt.shape, l1, sizeof(int64_t) * (size_t)rt->rank);
    int64_t nw = mcount(&wt), wc[16];
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      double acc = x[1][0];
      for (int64_t j = 0; j < nw; j++) {
        coords_of(&wt, j, wc);
        bool inside = true;
        for (int k = 0; k < rt->rank; k++) {
          d[k] = c[k] * l2[k] + wc[k] * l3[k] - pads[2 * k];
          inside = inside && d[k] >= 0 && d[k] < t[0]->shape[k];
        }
        if (inside) acc = combine(op->region_op, acc, x[0][index_of(t[0], d)]);
      }
      out[i] = acc;
    }
    return 0;
  }
  if (strcmp(name, "convolution") == 0) {
    conv_layout L;
    parse_conv_layout(a, &L);
    attr_ints(a, "window_strides", l1, 16);
    attr_ints(a, "rhs_dilation", l2, 16);
    int64_t pads[8];
    attr_ints(a, "padding", pads, 8);
    int64_t C = t[0]->shape[L.feature];
    int64_t kh = t[1]->shape[L.kspatial[0]], kw = t[1]->shape[L.kspatial[1]];
    for (int64_t i = 0; i < n; i++) {
      coords_of(rt, i, c);
      double acc = 0;
      for (int64_t ci = 0; ci < C; ci++)
        for (int64_t u = 0; u < kh; u++)
          for (int64_t v = 0; v < kw; v++) {
            int64_t yy = c[L.ospatial[0]] * l1[0] + u * l2[0] - pads[0];
            int64_t xx = c[L.ospatial[1]] * l1[1] + v * l2[1] - pads[2];
            if (yy < 0 || yy >= t[0]->shape[L.spatial[0]] || xx < 0 ||
                xx >= t[0]->shape[L.spatial[1]])
              continue;
            int64_t ic[4], kc[4];
            ic[L.batch] = c[L.obatch];
            ic[L.feature] = ci;
            ic[L.spatial[0]] = yy;
            ic[L.spatial[1]] = xx;
            kc[L.kin] = ci;
            kc[L.kout] = c[L.ofeature];
            kc[L.kspatial[0]] = u;
            kc[L.kspatial[1]] = v;
            acc += x[0][index_of(t[0], ic)] * x[1][index_of(t[1], kc)];
          }
      out[i] = acc;
    }
    return 0;
  }
  if (strcmp(name, "gather") == 0 || strcmp(name, "scatter") == 0) {
    /* The one row pattern the emitter writes: table[V,d] by idx[n]. */
    bool gather = name[0] == 'g';
    if (!attr_has(a, gather ? "offset_dims = [1], collapsed_slice_dims = [0], "
                              "start_index_map = [0], index_vector_dim = 1>"
                            : "update_window_dims = [1], inserted_window_dims "
                              "= [0], scatter_dims_to_operand_dims = [0], "
                              "index_vector_dim = 1>")) {
      snprintf(why, len, "evaluator: unsupported %s dimension numbers", name);
      return -1;
    }
    const mtype *tab = t[0];
    int64_t V = tab->shape[0], dd = tab->shape[1];
    if (gather) {
      for (int64_t r = 0; r < rt->shape[0]; r++) {
        int64_t ix = (int64_t)x[1][r];
        if (ix < 0 || ix >= V) {
          snprintf(why, len, "gather index %lld out of range", (long long)ix);
          return -1;
        }
        for (int64_t j = 0; j < dd; j++) out[r * dd + j] = x[0][ix * dd + j];
      }
    } else {
      for (int64_t i = 0; i < n; i++) out[i] = x[0][i];
      for (int64_t r = 0; r < t[2]->shape[0]; r++) {
        int64_t ix = (int64_t)x[1][r];
        if (ix < 0 || ix >= V) {
          snprintf(why, len, "scatter index %lld out of range", (long long)ix);
          return -1;
        }
        for (int64_t j = 0; j < dd; j++) out[ix * dd + j] += x[2][r * dd + j];
      }
    }
    return 0;
  }
  snprintf(why, len, "evaluator: no rule for stablehlo.%s", name);
  return -1;
}

/* Runs a parsed module on args (one double array per argument); the
 * results stay in m's values (m->ret).  NULL, or a message. */
static const char *eval_module(mmod *m, double *const *args) {
  static char msg[600];
  for (int k = 0; k < m->nargs; k++) {
    mval *v = &m->vals[m->args[k]];
    int64_t n = mcount(&v->t);
    v->v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    memcpy(v->v, args[k], sizeof(double) * (size_t)n);
  }
  for (int i = 0; i < m->nops; i++) {
    mop *op = &m->ops[i];
    mval *r = &m->vals[op->res];
    int64_t n = mcount(&op->rt);
    r->v = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    char why[400] = "";
    if (eval_op(m, op, r->v, why, sizeof why)) {
      snprintf(msg, sizeof msg, "line %d (stablehlo.%s): %s", op->line + 1,
               op->op, why);
      return msg;
    }
    for (int64_t j = 0; j < n; j++) r->v[j] = round_to(op->rt.et, r->v[j]);
  }
  return NULL;
}

/* ========================================================== test drivers */

static mtype mtype_of(const topos_network *net, int32_t node_index) {
  const tensor_meta *meta = &net->nodes[node_index].meta;
  mtype t = {(int)meta->dtype, meta->rank, {0}};
  memcpy(t.shape, meta->shape, sizeof(int64_t) * (size_t)meta->rank);
  return t;
}

/* The evaluator's argument values: parameter initials, input defaults. */
static double **argument_values(const topos_network *net) {
  int n = net->nparams + net->ninputs;
  double **args = calloc((size_t)(n > 0 ? n : 1), sizeof(double *));
  for (int k = 0; k < n; k++) {
    int32_t j = k < net->nparams ? net->param_nodes[k]
                                 : net->input_nodes[k - net->nparams];
    args[k] = tt_values(net->nodes[j].at.tensor);
  }
  return args;
}

static void free_arguments(const topos_network *net, double **args) {
  for (int k = 0; k < net->nparams + net->ninputs; k++) free(args[k]);
  free(args);
}

/* Tolerance of a module result against the reference, by element type:
 * the reference sums in its own fixed order, the evaluator in index
 * order, so only rounding-sized differences are allowed. */
static bool close_enough(int et, double got, double want, bool exact) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
  if (exact || et == ET_I32 || et == ET_I1)
    return got == want && signbit(got) == signbit(want);
  if (isinf(want) || isinf(got)) return got == want;
  double tol = et == ET_F64 ? 1e-10 : et == ET_F32 ? 2e-5 : 3e-2;
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

typedef struct emit_case {
  const topos_value *roots;
  int nroots;
  const topos_value *observes;
  int nobserves;
  topos_posture posture;
  int groups;           /* expected fused groups, -1 = any */
  const char *contains; /* a substring the generic form must hold */
  const char *lacks;    /* one it must not hold */
  bool exact;           /* results must equal the reference bit for bit */
  void (*mutate)(topos_plan *plan); /* applied after lowering, or NULL */
} emit_case;

static topos_plan *lower_case(const topos_network *net, const emit_case *c) {
  topos_error err = {0};
  topos_entry entry = {c->roots,     c->nroots,  c->observes,
                       c->nobserves, c->posture, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &entry, &err);
  ck_assert_msg(plan != NULL, "lower: %s", err.message);
  if (c->mutate) c->mutate(plan);
  return plan;
}

/* Emits one form (new string). */
static char *emit_case_form(const topos_network *net, const emit_case *c,
                            topos_emit_form form) {
  topos_plan *plan = lower_case(net, c);
  topos_error err = {0};
  char *text = topos_plan_emit_stablehlo(plan, form, &err);
  ck_assert_msg(text != NULL, "emit: %s", err.message);
  topos_plan_free(plan);
  return text;
}

/* Signature and shape rules of a generic module for this case; on
 * success the parsed module is left in *m (mmod_free it). */
static const char *verify_case(const topos_network *net, const emit_case *c,
                               const char *text, mmod *m) {
  int nargs = net->nparams + net->ninputs, nres = c->nroots + c->nobserves;
  mtype *args = calloc((size_t)nargs + 1, sizeof(mtype));
  mtype *res = calloc((size_t)nres + 1, sizeof(mtype));
  for (int k = 0; k < nargs; k++)
    args[k] =
        mtype_of(net, k < net->nparams ? net->param_nodes[k]
                                       : net->input_nodes[k - net->nparams]);
  for (int k = 0; k < nres; k++)
    res[k] = mtype_of(
        net, (k < c->nroots ? c->roots[k] : c->observes[k - c->nroots]).index);
  memset(m, 0, sizeof *m);
  const char *why = verify_module(text, args, nargs, res, nres, m);
  free(args);
  free(res);
  return why;
}

/* Runs a verified module and compares its results with the reference. */
static const char *values_case(const topos_network *net, const emit_case *c,
                               mmod *m) {
  static char msg[600];
  double **argv = argument_values(net);
  const char *why = eval_module(m, argv);
  free_arguments(net, argv);
  if (why) return why;
  topos_error err = {0};
  topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
  ck_assert_msg(run != NULL, "forward: %s", err.message);
  for (int k = 0; k < c->nroots + c->nobserves && !why; k++) {
    topos_value v = k < c->nroots ? c->roots[k] : c->observes[k - c->nroots];
    const topos_tensor *want = topos_run_of(run, v, &err);
    ck_assert_ptr_nonnull(want);
    double *w = tt_values(want);
    const mval *got = &m->vals[m->ret[k]];
    int64_t n = mcount(&got->t);
    ck_assert_int_eq(n, topos_tensor_count(want));
    for (int64_t i = 0; i < n && !why; i++)
      if (!close_enough(got->t.et, got->v[i], w[i], c->exact)) {
        snprintf(msg, sizeof msg,
                 "result %d element %lld: module %.17g, reference %.17g", k,
                 (long long)i, got->v[i], w[i]);
        why = msg;
      }
    free(w);
  }
  topos_run_free(run);
  return why;
}

/* Lowers net for the case, emits both forms and holds the generic one to
 * mlir-opt, the shape-rule checker and the evaluator. */
static void check_emit(const topos_network *net, const emit_case *c) {
  topos_plan *plan = lower_case(net, c);
  if (c->groups >= 0) ck_assert_int_eq(topos_plan_group_count(plan), c->groups);
  topos_error err = {0};
  char *generic = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_msg(generic != NULL, "emit generic: %s", err.message);
  char *again = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_msg(again && strcmp(generic, again) == 0,
                "emission is not deterministic");
  free(again);
  char *pretty = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_PRETTY, &err);
  ck_assert_msg(pretty != NULL, "emit pretty: %s", err.message);
  ck_assert_msg(strncmp(pretty, "module {\n  func.func @main(", 27) == 0,
                "pretty form:\n%.2000s", pretty);
  ck_assert_msg(strstr(pretty, "\n    return") != NULL, "pretty form:\n%.2000s",
                pretty);
  topos_plan_free(plan);
  if (c->contains)
    ck_assert_msg(strstr(generic, c->contains) != NULL, "no '%s' in:\n%.2000s",
                  c->contains, generic);
  if (c->lacks)
    ck_assert_msg(strstr(generic, c->lacks) == NULL, "'%s' in:\n%.2000s",
                  c->lacks, generic);

  char diag[512];
  int status = run_mlir_opt(generic, diag, sizeof diag);
  ck_assert_msg(status == 0, "mlir-opt rejected the module (%d): %s\n%.2000s",
                status, diag, generic);
  mmod m;
  const char *why = verify_case(net, c, generic, &m);
  ck_assert_msg(why == NULL, "%s\n%.2000s", why, generic);
  why = values_case(net, c, &m);
  ck_assert_msg(why == NULL, "%s\n%.2000s", why, generic);
  mmod_free(&m);
  free(generic);
  free(pretty);
}

/* The common case: one root, forward posture. */
static void check_root(const topos_network *net, topos_value root,
                       const char *contains) {
  emit_case c = {&root, 1,        NULL, 0,     TOPOS_POSTURE_FORWARD,
                 -1,    contains, NULL, false, NULL};
  check_emit(net, &c);
}

/* ================================================================ tests */

static const topos_dtype float_dtypes[] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16};
#define NFLOAT 3

static topos_network *seal(topos_tape *tape) {
  topos_error err = {0};
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "seal: %s", err.message);
  return net;
}

/* ----------------------------------------------------- one net per op */

enum {
  E_ADD,
  E_SUB,
  E_MUL,
  E_DIV,
  E_NEG,
  E_EXP,
  E_LOG,
  E_SQRT,
  E_TANH,
  E_ERF,
  E_POW,
  E_POW_NEG,
  E_POW_INT,
  E_MAXIMUM,
  E_MAXIMUM_TIES,
  E_STEP,
  E_RELU,
  E_COUNT
};

static const char *const elementwise_hlo[E_COUNT] = {
    "\"stablehlo.add\"",       "\"stablehlo.subtract\"",
    "\"stablehlo.multiply\"",  "\"stablehlo.divide\"",
    "\"stablehlo.negate\"",    "\"stablehlo.exponential\"",
    "\"stablehlo.log\"",       "\"stablehlo.sqrt\"",
    "\"stablehlo.tanh\"",      "\"chlo.erf\"",
    "\"stablehlo.power\"",     "\"stablehlo.power\"",
    "\"stablehlo.power\"",     "comparison_direction GE",
    "comparison_direction NE", "comparison_direction GE",
    "comparison_direction LE"};

START_TEST(test_elementwise_ops) {
  for (int d = 0; d < NFLOAT; d++)
    for (int op = 0; op < E_COUNT; op++) {
      topos_dtype dt = float_dtypes[d];
      topos_tape *t = topos_tape_new(dt);
      topos_value a = sn_leaf(t, 1, dt, 2, S(2, 3), 1 + (uint64_t)op, 0.5, 1.5);
      topos_value b = sn_leaf(t, 2, dt, 2, S(2, 3), 40 + (uint64_t)op, -1, 1);
      topos_value c = sn_leaf(t, 0, dt, 2, S(2, 3), 80 + (uint64_t)op, -1, 1);
      topos_value y = TOPOS_NONE;
      switch (op) {
        case E_ADD:
          y = topos_add(t, a, b);
          break;
        case E_SUB:
          y = topos_sub(t, b, a);
          break;
        case E_MUL:
          y = topos_mul(t, a, c);
          break;
        case E_DIV:
          y = topos_div(t, b, a);
          break;
        case E_NEG:
          y = topos_neg(t, b);
          break;
        case E_EXP:
          y = topos_exp(t, b);
          break;
        case E_LOG:
          y = topos_log(t, a);
          break;
        case E_SQRT:
          y = topos_sqrt(t, a);
          break;
        case E_TANH:
          y = topos_tanh(t, b);
          break;
        case E_ERF:
          y = topos_erf(t, b);
          break;
        case E_POW:
          y = topos_pow(t, a, 1.5);
          break;
        case E_POW_NEG:
          y = topos_pow(t, a, -0.5);
          break;
        case E_POW_INT:
          y = topos_pow(t, b, 3.0);
          break;
        case E_MAXIMUM:
          y = topos_maximum(t, a, b);
          break;
        case E_MAXIMUM_TIES:
          y = topos_maximum(t, b, b);
          break;
        case E_STEP:
          y = topos_step(t, b, c);
          break;
        case E_RELU:
          y = topos_relu(t, b);
          break;
      }
      topos_network *net = seal(t);
      check_root(net, y, elementwise_hlo[op]);
      /* bf16 arithmetic runs in f32 like the reference. */
      if (dt == TOPOS_BF16 && op <= E_POW_INT && op != E_NEG) {
        emit_case cs = {&y,
                        1,
                        NULL,
                        0,
                        TOPOS_POSTURE_FORWARD,
                        -1,
                        "\"stablehlo.convert\"",
                        NULL,
                        false,
                        NULL};
        check_emit(net, &cs);
      }
      topos_network_release(net);
    }
}
END_TEST

/* NaN, signed zeros and infinities through relu, maximum, step and neg:
 * the module must give the reference's bits. */
START_TEST(test_special_values) {
  const double va[8] = {NAN, -0.0, 0.0, -1, 2, INFINITY, -INFINITY, 1e-40};
  const double vb[8] = {1, 0.0, -0.0, NAN, 2, -INFINITY, -INFINITY, 0};
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_tensor *ta = tt_tensor(dt, 1, S(8), va),
                 *tb = tt_tensor(dt, 1, S(8), vb);
    topos_value a = topos_constant(t, ta), b = topos_input(t, tb);
    topos_tensor_release(ta);
    topos_tensor_release(tb);
    topos_value roots[6] = {topos_relu(t, a),       topos_maximum(t, a, b),
                            topos_maximum(t, b, a), topos_step(t, a, b),
                            topos_step(t, b, a),    topos_neg(t, a)};
    topos_network *net = seal(t);
    emit_case c = {roots, 6,    NULL, 0,    TOPOS_POSTURE_FORWARD,
                   -1,    NULL, NULL, true, NULL};
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_int_add) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  const double vi[4] = {1, -2, 1000000000, -1000000000};
  topos_tensor *ti = tt_tensor(TOPOS_I32, 1, S(4), vi);
  topos_value a = topos_constant(t, ti), b = topos_input(t, ti);
  topos_tensor_release(ti);
  topos_value y = topos_add(t, a, b);
  y = topos_add(t, y, sn_leaf(t, 0, TOPOS_I32, 1, S(4), 3, 0, 100));
  topos_network *net = seal(t);
  emit_case c = {&y,
                 1,
                 NULL,
                 0,
                 TOPOS_POSTURE_FORWARD,
                 -1,
                 "(tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>",
                 "convert",
                 true,
                 NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* Constants of every dtype, printed exactly: awkward decimals, extremes,
 * subnormals, signed zeros, NaN and infinities, splats, rank 0, empty. */
START_TEST(test_constants_exact) {
  const double f[12] = {0.1,
                        1.0 / 3,
                        16777217,
                        3.4028234663852886e38,
                        1.17549435e-38,
                        1.4e-45,
                        -0.0,
                        NAN,
                        INFINITY,
                        -INFINITY,
                        1e10,
                        -123456789};
  const double g[12] = {
      0.1,     1.0 / 3,  1e308,     4.9406564584124654e-324, -0.0,
      NAN,     INFINITY, -INFINITY, 9007199254740993.0,      2.5e-310,
      -1e-300, 7};
  const double i[4] = {-2147483648.0, 2147483647, 0, -1};
  const double seven[4] = {7, 7, 7, 7};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *ts[8] = {tt_tensor(TOPOS_F32, 2, S(3, 4), f),
                         tt_tensor(TOPOS_F64, 2, S(4, 3), g),
                         tt_tensor(TOPOS_BF16, 1, S(12), f),
                         tt_tensor(TOPOS_I32, 1, S(4), i),
                         tt_tensor(TOPOS_F32, 2, S(2, 2), seven),
                         tt_tensor(TOPOS_F64, 0, NULL, g + 1),
                         tt_tensor(TOPOS_BF16, 2, S(0, 3), f),
                         tt_tensor(TOPOS_I32, 3, S(1, 2, 2), i)};
  topos_value roots[8];
  for (int k = 0; k < 8; k++) {
    roots[k] = topos_constant(t, ts[k]);
    topos_tensor_release(ts[k]);
  }
  topos_network *net = seal(t);
  emit_case c = {roots,
                 8,
                 NULL,
                 0,
                 TOPOS_POSTURE_FORWARD,
                 -1,
                 "dense<7.0> : tensor<2x2xf32>",
                 NULL,
                 true,
                 NULL};
  check_emit(net, &c);
  char *text = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  ck_assert_msg(strstr(text, "0x7FF0000000000000") &&
                    strstr(text, "0xFF800000") && strstr(text, "0x7FC0") &&
                    strstr(text, "-2147483648") &&
                    strstr(text, "dense<> : tensor<0x3xbf16>") &&
                    strstr(text, "9007199254740992.0"),
                "%.2000s", text);
  free(text);
  topos_network_release(net);
}
END_TEST

/* Parameters and inputs come back directly; arguments are every
 * parameter in slot order, then every input, used or not. */
START_TEST(test_signature) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value p0 = sn_leaf(t, 1, TOPOS_F32, 1, S(2), 1, 0, 1);
  topos_value i0 = sn_leaf(t, 2, TOPOS_I32, 1, S(3), 2, 0, 5);
  topos_value p1 = sn_leaf(t, 1, TOPOS_BF16, 2, S(2, 2), 3, 0, 1);
  topos_value i1 = sn_leaf(t, 2, TOPOS_F64, 0, NULL, 4, 0, 1);
  topos_value p2 = sn_leaf(t, 1, TOPOS_F64, 1, S(5), 5, 0, 1); /* unused */
  topos_value y = topos_exp(t, p1);
  (void)p2;
  (void)i0;
  topos_network *net = seal(t);
  topos_value roots[3] = {y, i1, p0};
  topos_value obs[2] = {p1, y};
  emit_case c = {
      roots,
      3,
      obs,
      2,
      TOPOS_POSTURE_FORWARD,
      -1,
      "func.func @main(%arg0: tensor<2xf32>, %arg1: "
      "tensor<2x2xbf16>, %arg2: tensor<5xf64>, %arg3: tensor<3xi32>, "
      "%arg4: tensor<f64>) -> (tensor<2x2xbf16>, tensor<f64>, "
      "tensor<2xf32>, tensor<2x2xbf16>, tensor<2x2xbf16>)",
      NULL,
      false,
      NULL};
  check_emit(net, &c);
  char *text = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  ck_assert_msg(strstr(text, "\"func.return\"(%2, %arg4, %arg0, %arg1, %2)"),
                "%.2000s", text);
  free(text);
  topos_network_release(net);
}
END_TEST

START_TEST(test_matmul) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value a = sn_leaf(t, 1, dt, 2, S(2, 3), 1, -1, 1);
    topos_value b = sn_leaf(t, 2, dt, 2, S(3, 4), 2, -1, 1);
    topos_value ba = sn_leaf(t, 1, dt, 3, S(2, 2, 3), 3, -1, 1);
    topos_value bb = sn_leaf(t, 0, dt, 3, S(2, 3, 4), 4, -1, 1);
    topos_value y = topos_matmul(t, a, b);
    topos_value yb = topos_matmul(t, ba, bb);
    topos_value ye =
        topos_matmul(t, sn_leaf(t, 0, dt, 2, S(0, 3), 5, 0, 1), b); /* [0,4] */
    topos_network *net = seal(t);
    check_root(net, y, "rhs_contracting_dimensions = [0]");
    check_root(net, yb, "lhs_batching_dimensions = [0]");
    check_root(net, ye, "-> tensor<0x4x");
    topos_network_release(net);
  }
}
END_TEST

/* Layout ops over every dtype they accept (i32 included). */
START_TEST(test_layout_ops) {
  const topos_dtype dts[4] = {TOPOS_F32, TOPOS_F64, TOPOS_BF16, TOPOS_I32};
  for (int d = 0; d < 4; d++) {
    topos_dtype dt = dts[d];
    topos_tape *t = topos_tape_new(TOPOS_F32);
    topos_value x = sn_leaf(t, 2, dt, 2, S(2, 3), 1, -9, 9);
    topos_value x3 = sn_leaf(t, 2, dt, 3, S(2, 3, 4), 2, -9, 9);
    topos_value x7 = sn_leaf(t, 0, dt, 2, S(2, 7), 3, -9, 9);
    topos_value one = sn_leaf(t, 2, dt, 2, S(1, 1), 4, -9, 9);
    topos_value s = sn_leaf(t, 0, dt, 0, NULL, 5, -9, 9);
    struct {
      topos_value v;
      const char *hlo;
    } cases[] = {
        {topos_transpose(t, x), "permutation = array<i64: 1, 0>"},
        {topos_permute(t, x3, (const int[]){2, 0, 1}), "array<i64: 2, 0, 1>"},
        {topos_reshape(t, x, 2, S(3, 2)), "\"stablehlo.reshape\""},
        {topos_reshape(t, one, 0, NULL), "-> tensor<"},
        {topos_reshape(t, s, 1, S(1)), "\"stablehlo.reshape\""},
        {topos_narrow(t, x, 1, 1, 2), "limit_indices = array<i64: 2, 3>"},
        {topos_narrow(t, x3, 2, 0, 0), "\"stablehlo.slice\""},
        {topos_pad(t, x, 0, 1, 2), "edge_padding_high = array<i64: 2, 0>"},
        {topos_pad(t, x3, 2, 0, 3), "\"stablehlo.pad\""},
        {topos_unfold(t, x7, 1, 3, 2, 2), "\"stablehlo.concatenate\""},
        {topos_unfold(t, x7, 1, 2, 3, 1), "strides = array<i64: 1, 3>"},
        {topos_unfold(t, x7, 1, 1, 1, 1), "\"stablehlo.slice\""},
        {topos_unfold(t, x3, 0, 2, 1, 1), "\"stablehlo.concatenate\""},
        {topos_concat(t, 3,
                      (const topos_value[]){x, x, topos_narrow(t, x7, 1, 4, 3)},
                      0),
         "dimension = 0 : i64"},
        {topos_concat(t, 2, (const topos_value[]){x7, x}, 1),
         "dimension = 1 : i64"},
        {topos_concat(t, 1, &x, 1), "\"stablehlo.concatenate\""},
        {topos_broadcast(t, s, 2, S(2, 3)),
         "broadcast_dimensions = array<i64>"},
        {topos_broadcast(t, one, 2, S(4, 5)),
         "broadcast_dimensions = array<i64: 0, 1>"},
        {topos_broadcast_along(t, x, 0, 4), "array<i64: 1, 2>"},
        {topos_broadcast_along(t, x, 1, 4), "array<i64: 0, 2>"},
        {topos_broadcast_along(t, x, 2, 4), "array<i64: 0, 1>"},
        {topos_broadcast_along(t, s, 0, 3), "array<i64>"},
    };
    topos_network *net = seal(t);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
      check_root(net, cases[k].v, cases[k].hlo);
    topos_network_release(net);
  }
}
END_TEST

/* fold over several geometries: overlapping windows, gaps, dilation, a
 * window axis in the middle, every float dtype. */
START_TEST(test_fold) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    /* (count, size) -> extent with step, dilation */
    topos_value a = sn_leaf(t, 1, dt, 3, S(2, 3, 3), 1, -1, 1);
    topos_value f1 = topos_fold(t, a, 1, 5, 3, 1, 1); /* overlapping */
    topos_value b = sn_leaf(t, 1, dt, 3, S(2, 2, 2), 2, -1, 1);
    topos_value f2 = topos_fold(t, b, 1, 8, 2, 4, 1); /* gaps */
    topos_value c = sn_leaf(t, 2, dt, 3, S(2, 2, 3), 3, -1, 1);
    topos_value f3 = topos_fold(t, c, 1, 7, 3, 2, 2); /* dilation */
    topos_value e = sn_leaf(t, 2, dt, 4, S(2, 2, 2, 3), 4, -1, 1);
    topos_value f4 = topos_fold(t, e, 1, 3, 2, 1, 1); /* inner axis */
    topos_value g = sn_leaf(t, 0, dt, 2, S(4, 1), 5, -1, 1);
    topos_value f5 = topos_fold(t, g, 0, 4, 1, 1, 1); /* size 1 */
    /* fold of an unfold, as a gradient would build it */
    topos_value u =
        topos_unfold(t, sn_leaf(t, 1, dt, 2, S(3, 9), 6, -1, 1), 1, 3, 2, 1);
    topos_value f6 = topos_fold(t, u, 1, 9, 3, 2, 1);
    topos_network *net = seal(t);
    topos_value roots[6] = {f1, f2, f3, f4, f5, f6};
    for (int k = 0; k < 6; k++)
      check_root(net, roots[k], "interior_padding = array<i64: ");
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_reductions) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value x = sn_leaf(t, 1, dt, 2, S(3, 4), 1, -2, 2);
    topos_value x3 = sn_leaf(t, 2, dt, 3, S(2, 3, 4), 2, -3, 3);
    topos_value s = sn_leaf(t, 0, dt, 0, NULL, 3, -1, 1);
    topos_value big = sn_leaf(t, 1, dt, 2, S(5, 40), 4, -1, 1);
    struct {
      topos_value v;
      const char *hlo;
    } cases[] = {
        {topos_sum(t, x), "dimensions = array<i64: 0, 1>"},
        {topos_sum(t, s), NULL},
        {topos_sum(t, big), "\"stablehlo.reduce\""},
        {topos_sum_along(t, x, 0), "dimensions = array<i64: 0>"},
        {topos_sum_along(t, x3, 1), "dimensions = array<i64: 1>"},
        {topos_sum_along(t, big, 1), "\"stablehlo.add\""},
        {topos_max_along(t, x, 1), "\"stablehlo.maximum\""},
        {topos_max_along(t, x3, 0), "\"stablehlo.maximum\""},
        {topos_max_along(t, x3, 2), "\"stablehlo.maximum\""},
        {topos_log_softmax(t, x, 1), "\"stablehlo.exponential\""},
        {topos_log_softmax(t, x3, 0), "\"stablehlo.log\""},
        {topos_log_softmax(t, big, 1), "\"stablehlo.abs\""},
        {topos_logsumexp(t, x, 0), "comparison_direction EQ"},
        {topos_logsumexp(t, x3, 2), "\"stablehlo.select\""},
        {topos_logsumexp(t, big, 1), "\"stablehlo.reduce\""},
    };
    topos_network *net = seal(t);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
      check_root(net, cases[k].v, cases[k].hlo);
    topos_network_release(net);
  }
}
END_TEST

/* Rows with -inf, +inf and NaN: the max shift is 0 for an infinite
 * maximum, so the module must agree with the reference on every one. */
START_TEST(test_softmax_special_rows) {
  const double v[12] = {-INFINITY, -INFINITY, -INFINITY, INFINITY, 1, 2,
                        NAN,       1,         0,         1,        2, 3};
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_tensor *tx = tt_tensor(dt, 2, S(4, 3), v);
    topos_value x = topos_input(t, tx);
    topos_tensor_release(tx);
    topos_value roots[4] = {topos_logsumexp(t, x, 1),
                            topos_log_softmax(t, x, 1),
                            topos_max_along(t, x, 1), topos_logsumexp(t, x, 0)};
    topos_network *net = seal(t);
    emit_case c = {roots, 4,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                   -1,    NULL, NULL, false, NULL};
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_gather_scatter) {
  const double idx[5] = {4, 0, 2, 2, 4};
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_tensor *ti = tt_tensor(TOPOS_I32, 1, S(5), idx);
    topos_value ic = topos_constant(t, ti), ii = topos_input(t, ti);
    topos_tensor_release(ti);
    topos_value table = sn_leaf(t, 1, dt, 2, S(5, 3), 1, -1, 1);
    topos_value rows = sn_leaf(t, 2, dt, 2, S(5, 3), 2, -1, 1);
    topos_value g1 = topos_gather(t, table, ic);
    topos_value g2 = topos_gather(t, table, ii);
    topos_value s1 = topos_scatter(t, rows, ic, 6);
    topos_value s2 = topos_scatter(t, topos_gather(t, table, ii), ii, 5);
    topos_value e = topos_gather(
        t, table, sn_leaf(t, 0, TOPOS_I32, 1, S(0), 3, 0, 1)); /* no rows */
    topos_network *net = seal(t);
    check_root(net, g1, "slice_sizes = array<i64: 1, 3>");
    check_root(net, g2, "\"stablehlo.gather\"");
    check_root(net, s1, "inserted_window_dims = [0]");
    check_root(net, s2, "\"stablehlo.scatter\"");
    check_root(net, e, "-> tensor<0x3x");
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_empty_tensors) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value z = sn_leaf(t, 2, TOPOS_F32, 2, S(0, 3), 1, 0, 1);
  topos_value x = sn_leaf(t, 1, TOPOS_F32, 2, S(2, 3), 2, 0, 1);
  topos_value roots[6] = {topos_sum_along(t, z, 0),
                          topos_sum(t, z),
                          topos_concat(t, 2, (const topos_value[]){z, x}, 0),
                          topos_log_softmax(t, z, 0),
                          topos_exp(t, z),
                          topos_transpose(t, z)};
  topos_network *net = seal(t);
  emit_case c = {roots, 6,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 -1,    NULL, NULL, false, NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------ example networks */

static topos_value named(const topos_network *net, const char *name) {
  topos_value v = topos_network_find(net, name);
  ck_assert_msg(topos_value_ok(v), "no value named %s", name);
  return v;
}

START_TEST(test_sample_networks) {
  for (int k = 0; k < SN_NSAMPLES; k++) {
    topos_network *net = sn_samples[k].build();
    ck_assert_msg(net != NULL, "%s", sn_samples[k].name);
    topos_value root = topos_network_find(
        net, strcmp(sn_samples[k].name, "every_op") == 0 ? "total" : "loss");
    ck_assert(topos_value_ok(root));
    emit_case c = {&root, 1,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                   -1,    NULL, NULL, false, NULL};
    check_emit(net, &c);
    c.posture = TOPOS_POSTURE_TRAINING;
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_every_op_with_observes) {
  topos_network *net = sn_every_op();
  topos_value root = named(net, "total");
  topos_value obs[3] = {named(net, "log p"), named(net, "idx"),
                        named(net, "p")};
  emit_case c = {&root, 1,    obs,  3,     TOPOS_POSTURE_FORWARD,
                 -1,    NULL, NULL, false, NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* Records (w·x − y)² and its gradient with differentiate. */
START_TEST(test_gradient_descent_with_gradient) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.5, NULL);
  topos_value w = topos_name(t, topos_parameter(t, zero), "w");
  topos_value x = topos_name(t, topos_input(t, zero), "x");
  topos_value y = topos_name(t, topos_input(t, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(t, topos_mul(t, w, x), y);
  topos_value loss = topos_name(t, topos_mul(t, r, r), "loss");
  topos_value g;
  ck_assert_int_eq(topos_tape_differentiate(t, loss, &w, 1, &g), TOPOS_OK);
  topos_network *net = seal(t);
  topos_value roots[2] = {loss, g};
  emit_case c = {roots,
                 2,
                 NULL,
                 0,
                 TOPOS_POSTURE_TRAINING,
                 0,
                 "\"stablehlo.multiply\"",
                 NULL,
                 false,
                 NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* A two-layer tanh MLP with index cross-entropy and every gradient. */
START_TEST(test_mlp_cross_entropy_gradients) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value x = sn_leaf(t, 2, dt, 2, S(6, 4), 1, -1, 1);
    topos_value y = sn_leaf(t, 2, TOPOS_I32, 1, S(6), 2, 0, 5);
    topos_value w[2] = {sn_leaf(t, 1, dt, 2, S(4, 8), 3, -0.5, 0.5),
                        sn_leaf(t, 1, dt, 2, S(8, 5), 4, -0.5, 0.5)};
    topos_value b[2] = {sn_leaf(t, 1, dt, 1, S(8), 5, 0, 0.1),
                        sn_leaf(t, 1, dt, 1, S(5), 6, 0, 0.1)};
    topos_value logits = topos_mlp(t, x, 2, w, b, TOPOS_ACT_TANH);
    topos_value loss = topos_cross_entropy(t, logits, y);
    topos_value wrt[4] = {w[0], b[0], w[1], b[1]}, grads[4];
    ck_assert_int_eq(topos_tape_differentiate(t, loss, wrt, 4, grads),
                     TOPOS_OK);
    topos_network *net = seal(t);
    topos_value roots[5] = {loss, grads[0], grads[1], grads[2], grads[3]};
    emit_case c = {roots,
                   5,
                   NULL,
                   0,
                   TOPOS_POSTURE_TRAINING,
                   -1,
                   "\"stablehlo.scatter\"",
                   NULL,
                   false,
                   NULL};
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

/* LeNet-style: conv → relu → pool → conv(padding 1) → relu → pool →
 * linear → cross-entropy. */
static topos_network *lenet(topos_dtype dt, topos_value *loss,
                            topos_value *grads, int *ngrads) {
  topos_tape *t = topos_tape_new(dt);
  topos_value x = sn_leaf(t, 2, dt, 4, S(2, 1, 10, 10), 1, -1, 1);
  topos_value y = sn_leaf(t, 2, TOPOS_I32, 1, S(2), 2, 0, 5);
  topos_value w1 = sn_leaf(t, 1, dt, 4, S(3, 1, 3, 3), 3, -0.5, 0.5);
  topos_value b1 = sn_leaf(t, 1, dt, 1, S(3), 4, 0, 0.1);
  topos_value w2 = sn_leaf(t, 1, dt, 4, S(4, 3, 3, 3), 5, -0.5, 0.5);
  topos_value fc = sn_leaf(t, 1, dt, 2, S(16, 5), 6, -0.5, 0.5);
  topos_value h = topos_relu(t, topos_conv2d(t, x, w1, b1, 1, 0, 1));
  h = topos_max_pool2d(t, h, 2, 2);                               /* 4x4 */
  h = topos_relu(t, topos_conv2d(t, h, w2, TOPOS_NONE, 1, 1, 1)); /* 4x4 */
  h = topos_max_pool2d(t, h, 2, 2);                               /* 2x2 */
  h = topos_reshape(t, h, 2, S(2, 16));
  *loss = topos_cross_entropy(t, topos_linear(t, h, fc, TOPOS_NONE), y);
  if (grads) {
    topos_value wrt[4] = {w1, b1, w2, fc};
    *ngrads = 4;
    ck_assert_int_eq(topos_tape_differentiate(t, *loss, wrt, 4, grads),
                     TOPOS_OK);
  }
  return seal(t);
}

/* Observing every unfold blocks every fusion. */
static int unfold_values(const topos_network *net, topos_value *out, int cap) {
  int n = 0;
  for (int i = 0; i < net->n && n < cap; i++)
    if (net->nodes[i].op == OP_UNFOLD) out[n++] = (topos_value){net->id, i};
  return n;
}

START_TEST(test_lenet_fused_and_unfused) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_value loss;
    topos_network *net = lenet(float_dtypes[d], &loss, NULL, NULL);
    emit_case c = {&loss,
                   1,
                   NULL,
                   0,
                   TOPOS_POSTURE_FORWARD,
                   4,
                   "\"stablehlo.convolution\"",
                   NULL,
                   false,
                   NULL};
    check_emit(net, &c);
    c.contains = "\"stablehlo.reduce_window\"";
    check_emit(net, &c);
    topos_value obs[16];
    c.observes = obs;
    c.nobserves = unfold_values(net, obs, 16);
    ck_assert_int_eq(c.nobserves, 8);
    c.groups = 0;
    c.contains = "\"stablehlo.concatenate\"";
    c.lacks = "convolution";
    check_emit(net, &c);
    c.lacks = "reduce_window";
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

START_TEST(test_lenet_gradients) {
  topos_value loss, grads[4];
  int ng = 0;
  topos_network *net = lenet(TOPOS_F64, &loss, grads, &ng);
  topos_value roots[5] = {loss, grads[0], grads[1], grads[2], grads[3]};
  emit_case c = {roots, 5,    NULL, 0,     TOPOS_POSTURE_TRAINING,
                 -1,    NULL, NULL, false, NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* Convolution and pooling geometry: stride, padding, dilation, channels,
 * overlapping pool windows. */
START_TEST(test_conv_pool_geometry) {
  static const struct {
    int stride, padding, dilation, pool_k, pool_s;
  } g[] = {{2, 1, 1, 2, 1}, {1, 2, 2, 3, 2}, {3, 0, 1, 3, 3}, {1, 0, 3, 1, 1}};
  for (size_t k = 0; k < sizeof g / sizeof *g; k++)
    for (int d = 0; d < NFLOAT; d++) {
      topos_dtype dt = float_dtypes[d];
      topos_tape *t = topos_tape_new(dt);
      topos_value x = sn_leaf(t, 2, dt, 4, S(2, 3, 9, 11), 1, -1, 1);
      topos_value w = sn_leaf(t, 1, dt, 4, S(4, 3, 3, 2), 2, -0.5, 0.5);
      topos_value b = sn_leaf(t, 1, dt, 1, S(4), 3, -0.1, 0.1);
      topos_value c =
          topos_conv2d(t, x, w, b, g[k].stride, g[k].padding, g[k].dilation);
      topos_value p = topos_max_pool2d(t, c, g[k].pool_k, g[k].pool_s);
      topos_network *net = seal(t);
      emit_case cs = {&p,
                      1,
                      NULL,
                      0,
                      TOPOS_POSTURE_FORWARD,
                      2,
                      "\"stablehlo.convolution\"",
                      NULL,
                      false,
                      NULL};
      check_emit(net, &cs);
      topos_network_release(net);
    }
}
END_TEST

/* A pool chain recorded by hand over a padded input fuses (pads
 * included) and lowers to a zero pad and reduce_window. */
START_TEST(test_padded_pool_chain) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = sn_leaf(t, 2, TOPOS_F32, 4, S(1, 2, 5, 5), 1, -1, 1);
  topos_value p = topos_pad(t, topos_pad(t, x, 2, 1, 0), 3, 0, 2);
  topos_value u = topos_unfold(t, p, 2, 2, 2, 1);
  u = topos_unfold(t, u, 4, 3, 1, 1);
  u = topos_permute(t, u, (const int[]){0, 1, 2, 4, 3, 5});
  u = topos_reshape(t, u, 5, S(1, 2, 3, 5, 6));
  topos_value y = topos_max_along(t, u, 4);
  topos_network *net = seal(t);
  emit_case c = {&y,
                 1,
                 NULL,
                 0,
                 TOPOS_POSTURE_FORWARD,
                 -1,
                 "\"stablehlo.reduce_window\"",
                 NULL,
                 false,
                 NULL};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* Pool windows that stop short of the end: the rows and columns no window
 * reads are sliced off before reduce_window (IREE 3.13 cannot compile the
 * 1x1 case without; test_iree.c runs it). */
START_TEST(test_pool_remainder_sliced) {
  for (int d = 0; d < NFLOAT; d++) {
    topos_dtype dt = float_dtypes[d];
    topos_tape *t = topos_tape_new(dt);
    topos_value x = sn_leaf(t, 2, dt, 4, S(2, 2, 3, 4), 1, -1, 1);
    topos_value y = topos_max_pool2d(t, x, 3, 3); /* 1x1, one column left */
    topos_value z = sn_leaf(t, 2, dt, 4, S(1, 2, 5, 5), 2, -1, 1);
    topos_value w = topos_max_pool2d(t, z, 2, 2); /* 2x2, a row and a column */
    topos_value v = topos_max_pool2d(t, z, 3, 1); /* 3x3, nothing left */
    topos_network *net = seal(t);
    emit_case c = {&y,
                   1,
                   NULL,
                   0,
                   TOPOS_POSTURE_FORWARD,
                   1,
                   "limit_indices = array<i64: 2, 2, 3, 3>",
                   NULL,
                   false,
                   NULL};
    check_emit(net, &c);
    c.roots = &w;
    c.contains = "limit_indices = array<i64: 1, 2, 4, 4>";
    check_emit(net, &c);
    c.roots = &v;
    c.contains = "\"stablehlo.reduce_window\"";
    c.lacks = "\"stablehlo.slice\"";
    check_emit(net, &c);
    topos_network_release(net);
  }
}
END_TEST

/* A group whose geometry disagrees with its nodes is emitted node by
 * node, still correct. */
static void break_groups(topos_plan *plan) {
  for (int g = 0; g < plan->ngroups; g++) plan->groups[g].oh += 1;
}

START_TEST(test_group_fallback) {
  topos_value loss;
  topos_network *net = lenet(TOPOS_F32, &loss, NULL, NULL);
  emit_case c = {&loss,
                 1,
                 NULL,
                 0,
                 TOPOS_POSTURE_FORWARD,
                 4,
                 "\"stablehlo.concatenate\"",
                 "reduce_window",
                 false,
                 break_groups};
  check_emit(net, &c);
  topos_network_release(net);
}
END_TEST

/* -------------------------------------------------- the forms, verbatim */

static topos_network *square_net(topos_value *loss) {
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *one = topos_tensor_scalar(TOPOS_F64, 1.0, NULL);
  topos_value w = topos_name(t, topos_parameter(t, one), "w");
  topos_tensor_release(one);
  *loss = topos_name(t, topos_mul(t, w, w), "loss");
  return seal(t);
}

START_TEST(test_forms_verbatim) {
  topos_value loss;
  topos_network *net = square_net(&loss);
  emit_case c = {&loss, 1,    NULL, 0,    TOPOS_POSTURE_FORWARD,
                 0,     NULL, NULL, true, NULL};
  char *pretty = emit_case_form(net, &c, TOPOS_EMIT_PRETTY);
  char *generic = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  ck_assert_str_eq(pretty,
                   "module {\n"
                   "  func.func @main(%arg0: tensor<f64>) -> (tensor<f64>) {\n"
                   "    %0 = stablehlo.multiply %arg0, %arg0 : tensor<f64>\n"
                   "    return %0 : tensor<f64>\n"
                   "  }\n"
                   "}\n");
  ck_assert_str_eq(generic,
                   "module {\n"
                   "  func.func @main(%arg0: tensor<f64>) -> (tensor<f64>) {\n"
                   "    %0 = \"stablehlo.multiply\"(%arg0, %arg0) : "
                   "(tensor<f64>, tensor<f64>) -> tensor<f64>\n"
                   "    \"func.return\"(%0) : (tensor<f64>) -> ()\n"
                   "  }\n"
                   "}\n");
  free(pretty);
  free(generic);
  topos_network_release(net);
}
END_TEST

/* The pretty form uses StableHLO's custom assembly where it has one. */
START_TEST(test_pretty_syntax) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = sn_leaf(t, 1, TOPOS_F32, 2, S(2, 3), 1, -1, 1);
  topos_value w = sn_leaf(t, 1, TOPOS_F32, 2, S(3, 2), 2, -1, 1);
  topos_value y = topos_relu(t, topos_matmul(t, x, w));
  y = topos_sum_along(t, topos_pad(t, topos_narrow(t, y, 1, 1, 1), 0, 1, 0), 1);
  y = topos_broadcast_along(t, y, 1, 2);
  y = topos_concat(t, 2, (const topos_value[]){y, topos_transpose(t, x)}, 0);
  y = topos_reshape(t, y, 1, S(12));
  topos_network *net = seal(t);
  emit_case c = {&y, 1,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 0,  NULL, NULL, false, NULL};
  check_emit(net, &c);
  char *pretty = emit_case_form(net, &c, TOPOS_EMIT_PRETTY);
  static const char *want[] = {
      "stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : "
      "(tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>",
      "stablehlo.constant dense<0.0> : tensor<2x2xf32>",
      "stablehlo.compare LE, %0, %1 : (tensor<2x2xf32>, tensor<2x2xf32>) -> "
      "tensor<2x2xi1>",
      "stablehlo.select %2, %1, %0 : tensor<2x2xi1>, tensor<2x2xf32>",
      "stablehlo.slice %3 [0:2:1, 1:2:1] : (tensor<2x2xf32>) -> "
      "tensor<2x1xf32>",
      "stablehlo.pad %4, %5, low = [1, 0], high = [0, 0], interior = [0, 0] :",
      "stablehlo.reduce(%6 init: %7) applies stablehlo.add across dimensions "
      "= [1] : (tensor<3x1xf32>, tensor<f32>) -> tensor<3xf32>",
      "stablehlo.broadcast_in_dim %8, dims = [0] : (tensor<3xf32>) -> "
      "tensor<3x2xf32>",
      "stablehlo.transpose %arg0, dims = [1, 0] :",
      "stablehlo.concatenate %9, %10, dim = 0 : (tensor<3x2xf32>, "
      "tensor<3x2xf32>) -> tensor<6x2xf32>",
      "stablehlo.reshape %11 : (tensor<6x2xf32>) -> tensor<12xf32>",
      "return %12 : tensor<12xf32>"};
  for (size_t k = 0; k < sizeof want / sizeof *want; k++)
    ck_assert_msg(strstr(pretty, want[k]) != NULL, "no '%s' in:\n%.2000s",
                  want[k], pretty);
  ck_assert_msg(strstr(pretty, "\"stablehlo.") == NULL, "%.2000s", pretty);
  free(pretty);
  topos_network_release(net);
}
END_TEST

/* ---------------------------------------------------------------- errors */

START_TEST(test_bad_arguments) {
  topos_error err = {0};
  ck_assert_ptr_null(topos_plan_emit_stablehlo(NULL, TOPOS_EMIT_GENERIC, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_msg(strstr(err.message, "plan is NULL"), "%s", err.message);
  ck_assert_ptr_null(topos_plan_emit_stablehlo(NULL, TOPOS_EMIT_PRETTY, NULL));
  topos_value loss;
  topos_network *net = square_net(&loss);
  topos_entry entry = {
      &loss, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_plan *plan = topos_network_lower(net, &entry, &err);
  ck_assert_ptr_nonnull(plan);
  const int bad[3] = {-1, 2, 77};
  for (int k = 0; k < 3; k++) {
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(
        topos_plan_emit_stablehlo(plan, (topos_emit_form)bad[k], &err));
    ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
    ck_assert_msg(strstr(err.message, "form"), "%s", err.message);
    ck_assert_ptr_null(
        topos_plan_emit_stablehlo(plan, (topos_emit_form)bad[k], NULL));
  }
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* A plan whose schedule leaves out a value an op reads, or a root, gives
 * an error naming the node, and no text. */
START_TEST(test_unlowerable_plan) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = sn_leaf(t, 1, TOPOS_F32, 2, S(2, 7), 1, -1, 1);
  topos_value u = topos_unfold(t, x, 1, 3, 2, 1);
  topos_value f = topos_fold(t, u, 1, 7, 3, 2, 1);
  topos_network *net = seal(t);
  topos_entry entry = {
      &f, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_error err = {0};
  topos_plan *plan = topos_network_lower(net, &entry, &err);
  ck_assert_ptr_nonnull(plan);
  /* Drop the unfold from the schedule: the fold cannot read it. */
  int32_t *saved_schedule = malloc(sizeof(int32_t) * (size_t)plan->nschedule);
  memcpy(saved_schedule, plan->schedule,
         sizeof(int32_t) * (size_t)plan->nschedule);
  int w = 0;
  for (int p = 0; p < plan->nschedule; p++)
    if (plan->schedule[p] != u.index) plan->schedule[w++] = plan->schedule[p];
  int saved = plan->nschedule;
  plan->nschedule = w;
  for (int form = 0; form < 2; form++) {
    memset(&err, 0, sizeof err);
    char *text = topos_plan_emit_stablehlo(plan, (topos_emit_form)form, &err);
    ck_assert_ptr_null(text);
    char want[96];
    snprintf(want, sizeof want,
             "emit: node %d (fold): operand node %d (unfold)", f.index,
             u.index);
    ck_assert_msg(strncmp(err.message, want, strlen(want)) == 0, "%s",
                  err.message);
    ck_assert_int_eq(err.code, TOPOS_ERR_STATE);
  }
  /* No schedule at all: the root itself is missing. */
  plan->nschedule = 0;
  memset(&err, 0, sizeof err);
  ck_assert_ptr_null(topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err));
  char want[64];
  snprintf(want, sizeof want,
           "emit: node %d (fold): the plan asks for it as a root", f.index);
  ck_assert_msg(strncmp(err.message, want, strlen(want)) == 0, "%s",
                err.message);
  plan->nschedule = saved;
  memcpy(plan->schedule, saved_schedule, sizeof(int32_t) * (size_t)saved);
  free(saved_schedule);
  char *ok = topos_plan_emit_stablehlo(plan, TOPOS_EMIT_GENERIC, &err);
  ck_assert_ptr_nonnull(ok);
  free(ok);
  topos_plan_free(plan);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------- the checks can fail at all */

/* Each mutation keeps the module well-typed for mlir-opt (which accepts
 * it: it does not know StableHLO's rules) and must be caught by the shape
 * rule checker. */
static void expect_rule_violation(const topos_network *net, const emit_case *c,
                                  const char *from, const char *to) {
  char *text = emit_case_form(net, c, TOPOS_EMIT_GENERIC);
  char *at = strstr(text, from);
  ck_assert_msg(at != NULL, "no '%s' in:\n%.2000s", from, text);
  size_t lf = strlen(from), lt = strlen(to), len = strlen(text);
  char *bad = malloc(len - lf + lt + 1);
  memcpy(bad, text, (size_t)(at - text));
  memcpy(bad + (at - text), to, lt);
  strcpy(bad + (at - text) + lt, at + lf);
  char diag[512];
  ck_assert_msg(run_mlir_opt(bad, diag, sizeof diag) == 0,
                "mlir-opt rejected '%s' -> '%s': %s", from, to, diag);
  mmod m;
  const char *why = verify_case(net, c, bad, &m);
  ck_assert_msg(why != NULL, "the checker accepted '%s' -> '%s':\n%.2000s",
                from, to, bad);
  free(bad);
  free(text);
}

START_TEST(test_checker_catches_rule_violations) {
  topos_value loss;
  topos_network *net = lenet(TOPOS_F32, &loss, NULL, NULL);
  emit_case c = {&loss, 1,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 4,     NULL, NULL, false, NULL};
  expect_rule_violation(net, &c, "window_strides = array<i64: 1, 1>",
                        "window_strides = array<i64: 2, 1>");
  expect_rule_violation(net, &c, "#stablehlo.conv<[b, f, 0, 1]x[i, 0, 1, o]",
                        "#stablehlo.conv<[b, f, 0, 1]x[o, 0, 1, i]");
  expect_rule_violation(net, &c, "padding = dense<[[0, 0], [0, 0]]>",
                        "padding = dense<[[1, 0], [0, 0]]>");
  expect_rule_violation(net, &c, "window_dimensions = array<i64: 1, 1, 2, 2>",
                        "window_dimensions = array<i64: 1, 1, 3, 2>");
  expect_rule_violation(net, &c, "rhs_contracting_dimensions = [0]",
                        "rhs_contracting_dimensions = [1]");
  expect_rule_violation(net, &c, "slice_sizes = array<i64: 1, 1>",
                        "slice_sizes = array<i64: 2, 1>");
  topos_network_release(net);

  topos_network *every = sn_every_op();
  topos_value total = named(every, "total");
  emit_case e = {&total, 1,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 -1,     NULL, NULL, false, NULL};
  expect_rule_violation(every, &e, "permutation = array<i64: 1, 0>",
                        "permutation = array<i64: 0, 1>");
  expect_rule_violation(every, &e, "strides = array<i64: 1, 1>",
                        "strides = array<i64: 2, 1>");
  expect_rule_violation(every, &e, "interior_padding = array<i64: 0, 0>",
                        "interior_padding = array<i64: 0, 1>");
  expect_rule_violation(every, &e, "dimension = 0 : i64",
                        "dimension = 1 : i64");
  expect_rule_violation(every, &e, "dimensions = array<i64: 1>",
                        "dimensions = array<i64: 0>");
  expect_rule_violation(every, &e, "broadcast_dimensions = array<i64: 1>",
                        "broadcast_dimensions = array<i64: 0>");
  expect_rule_violation(every, &e, "update_window_dims = [1]",
                        "update_window_dims = [0]");
  expect_rule_violation(every, &e, "comparison_direction GE",
                        "comparison_direction XX");
  topos_network_release(every);
}
END_TEST

/* Type mistakes that mlir-opt sees too: the checker must see them, and
 * mlir-opt must reject a module with an undefined value. */
START_TEST(test_checker_catches_type_errors) {
  topos_value loss;
  topos_network *net = square_net(&loss);
  emit_case c = {&loss, 1,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 0,     NULL, NULL, false, NULL};
  char *text = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  mmod m;
  ck_assert_ptr_null(verify_case(net, &c, text, &m));
  mmod_free(&m);
  static const struct {
    const char *from, *to;
    bool mlir_rejects;
  } muts[] = {
      {"-> tensor<f64>\n", "-> tensor<f32>\n", true},
      {"(%arg0, %arg0)", "(%arg0, %7)", true},
      {"\"stablehlo.multiply\"", "\"stablehlo.multiply_typo\"", false},
      {"(tensor<f64>) -> ()", "(tensor<f64>, tensor<f64>) -> ()", true},
      {"-> (tensor<f64>)", "-> (tensor<f32>)", true},
  };
  for (size_t k = 0; k < sizeof muts / sizeof *muts; k++) {
    char *at = strstr(text, muts[k].from);
    ck_assert_ptr_nonnull(at);
    char bad[2048];
    snprintf(bad, sizeof bad, "%.*s%s%s", (int)(at - text), text, muts[k].to,
             at + strlen(muts[k].from));
    ck_assert_msg(verify_case(net, &c, bad, &m) != NULL, "accepted:\n%.2000s",
                  bad);
    char diag[512];
    if (muts[k].mlir_rejects)
      ck_assert_msg(run_mlir_opt(bad, diag, sizeof diag) != 0,
                    "mlir-opt accepted:\n%.2000s", bad);
  }
  /* And a wrong signature expectation fails. */
  emit_case other = c;
  topos_value w = topos_network_parameter(net, 0);
  other.roots = &w;
  ck_assert_ptr_null(verify_case(net, &c, text, &m));
  mmod_free(&m);
  topos_value two[2] = {loss, loss};
  other.roots = two;
  other.nroots = 2;
  ck_assert_ptr_nonnull(verify_case(net, &other, text, &m));
  free(text);
  topos_network_release(net);
}
END_TEST

/* A semantic slip that keeps every type right (relu's LE turned into GE)
 * passes mlir-opt and the shape rules; the evaluator catches it. */
START_TEST(test_evaluator_catches_wrong_values) {
  topos_tape *t = topos_tape_new(TOPOS_F32);
  topos_value x = sn_leaf(t, 2, TOPOS_F32, 1, S(6), 1, -1, 1);
  topos_value y = topos_relu(t, x);
  topos_value u = topos_fold(t, topos_unfold(t, x, 0, 2, 2, 1), 0, 6, 2, 2, 1);
  topos_network *net = seal(t);
  topos_value roots[2] = {y, u};
  emit_case c = {roots, 2,    NULL, 0,     TOPOS_POSTURE_FORWARD,
                 0,     NULL, NULL, false, NULL};
  check_emit(net, &c);
  static const struct {
    const char *from, *to;
  } muts[] = {
      {"comparison_direction LE", "comparison_direction GE"},
      {"start_indices = array<i64: 1>", "start_indices = array<i64: 0>"},
      {"edge_padding_high = array<i64: 0>, edge_padding_low = array<i64: 1>",
       "edge_padding_high = array<i64: 1>, edge_padding_low = array<i64: 0>"},
  };
  char *text = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  for (size_t k = 0; k < sizeof muts / sizeof *muts; k++) {
    char *at = strstr(text, muts[k].from);
    ck_assert_msg(at != NULL, "no '%s' in\n%.2000s", muts[k].from, text);
    size_t len = strlen(text) + strlen(muts[k].to) + 1;
    char *bad = malloc(len);
    snprintf(bad, len, "%.*s%s%s", (int)(at - text), text, muts[k].to,
             at + strlen(muts[k].from));
    char diag[512];
    ck_assert_int_eq(run_mlir_opt(bad, diag, sizeof diag), 0);
    mmod m;
    const char *why = verify_case(net, &c, bad, &m);
    ck_assert_msg(why == NULL, "%s", why);
    ck_assert_msg(values_case(net, &c, &m) != NULL,
                  "the evaluator accepted '%s':\n%.2000s", muts[k].to, bad);
    mmod_free(&m);
    free(bad);
  }
  free(text);
  topos_network_release(net);
}
END_TEST

/* ----------------------------------------------------- build/examples */

static char *run_inspect(const char *args, int *status) {
  const char *build = getenv("TOPOS_BUILD");
  if (build == NULL || build[0] == '\0') build = "build";
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s/examples/inspect' %s", build, args);
  FILE *p = popen(cmd, "r");
  ck_assert_msg(p != NULL, "cannot run %s", cmd);
  size_t len = 0, cap = 4096;
  char *out = malloc(cap);
  size_t got;
  while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 1024) out = realloc(out, cap *= 2);
  }
  out[len] = '\0';
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

START_TEST(test_inspect_example) {
  int status;
  char *generic = run_inspect("--generic", &status);
  ck_assert_msg(status == 0, "inspect --generic exited %d:\n%.2000s", status,
                generic);
  char diag[512];
  ck_assert_msg(run_mlir_opt(generic, diag, sizeof diag) == 0, "%s\n%.2000s",
                diag, generic);
  topos_value loss;
  topos_network *net = square_net(&loss);
  emit_case c = {&loss, 1,    NULL, 0,    TOPOS_POSTURE_FORWARD,
                 0,     NULL, NULL, true, NULL};
  char *mine = emit_case_form(net, &c, TOPOS_EMIT_GENERIC);
  ck_assert_str_eq(generic, mine);
  mmod m;
  const char *why = verify_case(net, &c, generic, &m);
  ck_assert_msg(why == NULL, "%s", why);
  ck_assert_ptr_null(values_case(net, &c, &m));
  mmod_free(&m);
  free(mine);
  free(generic);

  char *text = run_inspect("", &status);
  ck_assert_msg(status == 0, "inspect exited %d:\n%.2000s", status, text);
  const char *net_at = strstr(text, "loss");
  const char *plan_at = strstr(text, "== plan for [loss] ==");
  const char *hlo_at = strstr(text, "stablehlo.multiply %arg0, %arg0");
  ck_assert_msg(
      net_at && plan_at && hlo_at && net_at < plan_at && plan_at < hlo_at, "%s",
      text);
  free(text);
  char *usage = run_inspect("--bogus 2>/dev/null", &status);
  ck_assert_int_eq(status, 2);
  free(usage);
  topos_network_release(net);
}
END_TEST

/* The transformer composites of nn.c (and embedding), each as its own
 * module in f32 and f64, held to all three checks: exact GELU (chlo.erf),
 * causal multi-head self-attention over a key/value cache, rotary
 * embedding, cross entropy with an ignored target and global-norm
 * clipping of recorded gradients (training posture). */
START_TEST(test_transformer_composites) {
  for (int d = 0; d < 2; d++) {
    topos_dtype dt = float_dtypes[d];
    for (int which = 0; which < 6; which++) {
      topos_tape *t = topos_tape_new(dt);
      topos_value roots[8];
      int nroots = 1;
      const char *contains = NULL;
      topos_posture posture = TOPOS_POSTURE_FORWARD;
      switch (which) {
        case 0: {
          topos_value x = sn_leaf(t, 2, dt, 2, S(3, 4), 1, -3, 3);
          roots[0] = topos_gelu_exact(t, x);
          contains = "\"chlo.erf\"";
          break;
        }
        case 1: {
          topos_value x = sn_leaf(t, 2, dt, 3, S(2, 3, 4), 2, -1, 1);
          topos_value w = sn_leaf(t, 1, dt, 2, S(4, 12), 3, -0.5, 0.5);
          topos_value b = sn_leaf(t, 1, dt, 1, S(12), 4, -0.1, 0.1);
          topos_value wo = sn_leaf(t, 1, dt, 2, S(4, 4), 5, -0.5, 0.5);
          topos_value kc = sn_leaf(t, 2, dt, 3, S(2, 2, 4), 6, -1, 1);
          topos_value vc = sn_leaf(t, 2, dt, 3, S(2, 2, 4), 7, -1, 1);
          topos_attention_opts o = {.heads = 2, .causal = true, .past = 2};
          topos_value k_all, v_all;
          roots[0] = topos_self_attention(t, x, w, b, wo, TOPOS_NONE, &o, kc,
                                          vc, &k_all, &v_all);
          roots[1] = k_all;
          nroots = 2;
          contains = "\"stablehlo.dot_general\"";
          break;
        }
        case 2: {
          topos_value x = sn_leaf(t, 2, dt, 3, S(2, 3, 8), 8, -1, 1);
          roots[0] = topos_rope(t, x, 2, 5, 0);
          contains = "\"stablehlo.concatenate\"";
          break;
        }
        case 3: {
          topos_value l = sn_leaf(t, 1, dt, 2, S(5, 4), 9, -2, 2);
          const int32_t tg[5] = {1, -100, 3, 0, -100};
          topos_tensor *tt = topos_tensor_from(TOPOS_I32, 1, S(5), tg, NULL);
          topos_value y = topos_input(t, tt);
          topos_tensor_release(tt);
          topos_value loss = topos_cross_entropy_ignore(t, l, y, -100);
          topos_value g;
          ck_assert_int_eq(topos_tape_differentiate(t, loss, &l, 1, &g),
                           TOPOS_OK);
          roots[0] = loss;
          roots[1] = g;
          nroots = 2;
          posture = TOPOS_POSTURE_TRAINING;
          contains = "\"stablehlo.gather\"";
          break;
        }
        case 4: {
          topos_value w1 = sn_leaf(t, 1, dt, 2, S(3, 4), 10, -1, 1);
          topos_value w2 = sn_leaf(t, 1, dt, 2, S(4, 2), 11, -1, 1);
          topos_value y = topos_linear(t, w1, w2, TOPOS_NONE);
          topos_value loss = topos_sum(t, topos_mul(t, y, y));
          topos_value wrt[2] = {w1, w2}, g[2], c[2], norm;
          ck_assert_int_eq(topos_tape_differentiate(t, loss, wrt, 2, g),
                           TOPOS_OK);
          ck_assert_int_eq(topos_clip_global_norm(t, 2, g, 0.5, c, &norm),
                           TOPOS_OK);
          roots[0] = loss;
          roots[1] = c[0];
          roots[2] = c[1];
          roots[3] = norm;
          nroots = 4;
          posture = TOPOS_POSTURE_TRAINING;
          contains = "\"stablehlo.sqrt\"";
          break;
        }
        case 5: {
          topos_value table = sn_leaf(t, 1, dt, 2, S(6, 3), 12, -1, 1);
          const int32_t ix[6] = {5, 0, 2, 2, 1, 4};
          topos_tensor *it = topos_tensor_from(TOPOS_I32, 2, S(2, 3), ix, NULL);
          topos_value idx = topos_input(t, it);
          topos_tensor_release(it);
          roots[0] = topos_embedding(t, table, idx);
          contains = "\"stablehlo.gather\"";
          break;
        }
      }
      ck_assert_msg(topos_tape_error(t) == NULL, "case %d: %s", which,
                    topos_tape_error(t));
      topos_network *net = seal(t);
      emit_case c = {roots, nroots,   NULL, 0,     posture,
                     -1,    contains, NULL, false, NULL};
      check_emit(net, &c);
      topos_network_release(net);
    }
  }
}
END_TEST

Suite *emit_suite(void) {
  Suite *s = suite_create("emit");
  TCase *ops = tcase_create("ops");
  tcase_set_timeout(ops, 120);
  tcase_add_test(ops, test_elementwise_ops);
  tcase_add_test(ops, test_special_values);
  tcase_add_test(ops, test_int_add);
  tcase_add_test(ops, test_constants_exact);
  tcase_add_test(ops, test_signature);
  tcase_add_test(ops, test_matmul);
  tcase_add_test(ops, test_layout_ops);
  tcase_add_test(ops, test_fold);
  tcase_add_test(ops, test_reductions);
  tcase_add_test(ops, test_softmax_special_rows);
  tcase_add_test(ops, test_gather_scatter);
  tcase_add_test(ops, test_empty_tensors);
  suite_add_tcase(s, ops);

  TCase *nets = tcase_create("networks");
  tcase_set_timeout(nets, 120);
  tcase_add_test(nets, test_sample_networks);
  tcase_add_test(nets, test_every_op_with_observes);
  tcase_add_test(nets, test_gradient_descent_with_gradient);
  tcase_add_test(nets, test_mlp_cross_entropy_gradients);
  tcase_add_test(nets, test_lenet_fused_and_unfused);
  tcase_add_test(nets, test_lenet_gradients);
  tcase_add_test(nets, test_conv_pool_geometry);
  tcase_add_test(nets, test_padded_pool_chain);
  tcase_add_test(nets, test_pool_remainder_sliced);
  tcase_add_test(nets, test_group_fallback);
  tcase_add_test(nets, test_transformer_composites);
  suite_add_tcase(s, nets);

  TCase *forms = tcase_create("forms and errors");
  tcase_set_timeout(forms, 60);
  tcase_add_test(forms, test_forms_verbatim);
  tcase_add_test(forms, test_pretty_syntax);
  tcase_add_test(forms, test_bad_arguments);
  tcase_add_test(forms, test_unlowerable_plan);
  tcase_add_test(forms, test_checker_catches_rule_violations);
  tcase_add_test(forms, test_checker_catches_type_errors);
  tcase_add_test(forms, test_evaluator_catches_wrong_values);
  tcase_add_test(forms, test_inspect_example);
  suite_add_tcase(s, forms);
  return s;
}
