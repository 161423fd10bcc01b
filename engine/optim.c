/*
 * optim.c - pure optimizer steps: (params, grads, state) -> (params',
 * state').  Nothing is modified in place; a step reads its inputs and
 * builds two new values, so a training loop can keep, compare, send or
 * replay any of them.
 *
 * Numerics.  Every update is computed per element in double from the
 * exactly widened parameter, gradient and moment values, and each result
 * is rounded ONCE to its storage dtype (bf16 straight from double).
 * Moments are stored in the parameter's dtype for f32 and f64 parameters
 * and in f32 for bf16 parameters.  With lr, wd, mu, b1, b2, eps from the
 * optimizer, and p, g, m, v the widened elements of one slot, the
 * expressions below are evaluated exactly as written, left to right, with
 * no fused multiply-add (the build uses -ffp-contract=off):
 *
 *  SGD      g' = g + wd*p                  (only when wd != 0; else g' = g)
 *           mu > 0:  m' = mu*m + g';  p' = p - lr*m'     (m' stored as m)
 *           mu = 0:  p' = p - lr*g';  the state carries no moments.
 *  Adam     g' = g + wd*p                  (L2, only when wd != 0)
 *           m' = b1*m + (1 - b1)*g'
 *           v' = b2*v + (1 - b2)*g'*g'
 *           t = step + 1, bc1 = 1 - b1^t, bc2 = 1 - b2^t
 *           p' = p - lr*(m'/bc1) / (sqrt(v'/bc2) + eps)
 *  AdamW    p1 = p - (lr*wd)*p on the slots opt->decay(slot, param, ctx)
 *           selects (decay NULL: parameters of rank >= 2), else p1 = p;
 *           then Adam with g' = g and p1 in place of p in the last line.
 *
 * b^t is computed from the integer step by binary exponentiation in
 * double-double arithmetic (error-free products through fma) and rounded
 * once, so it is the correctly rounded power for any t whose power does
 * not underflow, the same bits on every machine and for every route to
 * the same step (a running product or libm's pow would give neither).
 * A state rebuilt with topos_opt_state_from therefore steps to exactly
 * the bits the original would have.
 *
 * Validation: on any error the outputs are left untouched.  Accepted:
 * lr finite and >= 0 (0 holds the parameters still, as a warm-up
 * schedule's first step may), weight_decay finite and >= 0, SGD momentum
 * in [0, 1), beta1 and beta2 in [0, 1), eps finite and > 0, and nothing
 * set that the kind does not read (SGD: beta1, beta2, eps 0; Adam and
 * AdamW: momentum 0; a decay predicate only for AdamW); parameters f32,
 * f64 or bf16, gradients and moments matching them slot by slot (moments
 * in the moment dtype), a step that can advance, and moments a valid
 * step could have made: every element of a first moment finite, of a
 * second moment >= 0 and not NaN (the error names the slot and the
 * element).  topos_optimizer_check reads every moment element before any
 * work; a step checks each as it reads it.  NaN or Inf inside gradients
 * and parameters is data, not an error, and propagates as IEEE arithmetic
 * says, into the state a step returns too (which the next step then
 * refuses).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "internal.h"

struct topos_opt_state {
  int64_t step;
  topos_params *m; /* first moment (momentum for SGD), or NULL */
  topos_params *v; /* second moment, or NULL */
};

topos_optimizer topos_sgd(double lr, double momentum) {
  return (topos_optimizer){.kind = TOPOS_SGD, .lr = lr, .momentum = momentum};
}

topos_optimizer topos_adam(double lr, double beta1, double beta2, double eps) {
  return (topos_optimizer){
      .kind = TOPOS_ADAM, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps};
}

topos_optimizer topos_adamw(double lr, double beta1, double beta2, double eps,
                            double weight_decay) {
  return (topos_optimizer){.kind = TOPOS_ADAMW,
                           .lr = lr,
                           .beta1 = beta1,
                           .beta2 = beta2,
                           .eps = eps,
                           .weight_decay = weight_decay};
}

/* --------------------------------------------------------------- validation
 */

static const char *kind_name(topos_optimizer_kind kind) {
  switch (kind) {
    case TOPOS_SGD:
      return "sgd";
    case TOPOS_ADAM:
      return "adam";
    case TOPOS_ADAMW:
      return "adamw";
  }
  return "?";
}

static bool needs_first_moment(const topos_optimizer *opt) {
  return opt->kind != TOPOS_SGD || opt->momentum > 0;
}

static bool needs_second_moment(const topos_optimizer *opt) {
  return opt->kind != TOPOS_SGD;
}

static topos_dtype moment_dtype(topos_dtype param) {
  return param == TOPOS_BF16 ? TOPOS_F32 : param;
}

/* A number the optimizer's kind does not read must be left 0 (and a
 * decay predicate is AdamW's): a setting that would silently do nothing
 * is a mistake, refused like an out-of-range one. */
static int check_unread(const topos_optimizer *opt, const char *fn,
                        const char *k, topos_error *err) {
  const char *field = NULL;
  double value = 0;
  if (opt->kind == TOPOS_SGD) {
    if (opt->beta1 != 0)
      field = "beta1", value = opt->beta1;
    else if (opt->beta2 != 0)
      field = "beta2", value = opt->beta2;
    else if (opt->eps != 0)
      field = "eps", value = opt->eps;
  } else if (opt->momentum != 0) {
    field = "momentum", value = opt->momentum;
  }
  if (field)
    return error_set(
        err, TOPOS_ERR_ARGUMENT,
        "%s: %s does not read %s (%g); leave it 0 (%s)", fn, k, field, value,
        opt->kind == TOPOS_SGD ? "beta1, beta2 and eps are adam's and adamw's"
                               : "momentum is sgd's");
  if (opt->decay && opt->kind != TOPOS_ADAMW)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: %s does not read a decay predicate (adamw's); its "
                     "weight_decay is L2 on every slot",
                     fn, k);
  return TOPOS_OK;
}

/* The hyperparameters the optimizer's kind reads, and nothing set that it
 * does not. */
static int check_optimizer(const topos_optimizer *opt, const char *fn,
                           topos_error *err) {
  if (opt == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: optimizer is NULL", fn);
  if (opt->kind != TOPOS_SGD && opt->kind != TOPOS_ADAM &&
      opt->kind != TOPOS_ADAMW)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: unknown optimizer kind %d",
                     fn, (int)opt->kind);
  const char *k = kind_name(opt->kind);
  if (!isfinite(opt->lr) || opt->lr < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: %s lr %g must be finite and >= 0", fn, k, opt->lr);
  if (!isfinite(opt->weight_decay) || opt->weight_decay < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: %s weight_decay %g must be finite and >= 0", fn, k,
                     opt->weight_decay);
  int rc = check_unread(opt, fn, k, err);
  if (rc != TOPOS_OK) return rc;
  if (opt->kind == TOPOS_SGD) {
    if (!(opt->momentum >= 0 && opt->momentum < 1))
      return error_set(err, TOPOS_ERR_ARGUMENT,
                       "%s: sgd momentum %g is not in [0,1)", fn,
                       opt->momentum);
    return TOPOS_OK;
  }
  if (!(opt->beta1 >= 0 && opt->beta1 < 1))
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s beta1 %g is not in [0,1)",
                     fn, k, opt->beta1);
  if (!(opt->beta2 >= 0 && opt->beta2 < 1))
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s beta2 %g is not in [0,1)",
                     fn, k, opt->beta2);
  if (!isfinite(opt->eps) || opt->eps <= 0)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: %s eps %g must be finite and > 0", fn, k, opt->eps);
  return TOPOS_OK;
}

/* A set whose every slot is a floating tensor. */
static int check_float_set(const topos_params *p, const char *what,
                           const char *fn, topos_error *err) {
  if (p == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s is NULL", fn, what);
  for (int s = 0; s < p->n; s++) {
    if (p->t[s] == NULL)
      return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s slot %d is NULL", fn,
                       what, s);
    if (!dtype_is_float(p->t[s]->dtype))
      return error_set(err, TOPOS_ERR_DTYPE,
                       "%s: %s slot %d is %s; optimizers take f32, f64, bf16",
                       fn, what, s, topos_dtype_name(p->t[s]->dtype));
  }
  return TOPOS_OK;
}

/* x matches params slot by slot: same count and shapes, and the dtype of
 * the parameter (or, for a moment, the moment dtype of the parameter). */
static int check_matches(const topos_params *params, const topos_params *x,
                         const char *what, bool moment, const char *fn,
                         topos_error *err) {
  if (x == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s is missing", fn, what);
  if (x->n != params->n)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %d slots but %d in %s", fn,
                     params->n, x->n, what);
  for (int s = 0; s < params->n; s++) {
    const topos_tensor *p = params->t[s], *t = x->t[s];
    if (t == NULL)
      return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s slot %d is NULL", fn,
                       what, s);
    topos_dtype want = moment ? moment_dtype(p->dtype) : p->dtype;
    if (t->dtype != want)
      return error_set(err, TOPOS_ERR_DTYPE, "%s: %s slot %d is %s, wants %s",
                       fn, what, s, topos_dtype_name(t->dtype),
                       topos_dtype_name(want));
    if (!shape_equal(p->rank, p->shape, t->rank, t->shape)) {
      char sp[SHAPE_TEXT], st[SHAPE_TEXT];
      return error_set(err, TOPOS_ERR_SHAPE, "%s: slot %d: param %s, %s %s", fn,
                       s, shape_text(sp, p->rank, p->shape), what,
                       shape_text(st, t->rank, t->shape));
    }
  }
  return TOPOS_OK;
}

/* ------------------------------------------------------------------- state */

/* A new set holding the tensors of p, retained (NULL stays NULL). */
static int share_set(const topos_params *p, topos_params **out,
                     topos_error *err) {
  *out = NULL;
  if (p == NULL) return TOPOS_OK;
  *out = topos_params_new(p->n, p->t, err);
  return *out ? TOPOS_OK : TOPOS_ERR_MEMORY;
}

static topos_opt_state *state_make(int64_t step, topos_params *m,
                                   topos_params *v) {
  topos_opt_state *s = malloc(sizeof *s);
  if (s == NULL) return NULL;
  *s = (topos_opt_state){.step = step, .m = m, .v = v};
  return s;
}

/* Zero moments shaped like params, in the moment dtypes. */
static topos_params *zero_moments(const topos_params *params,
                                  topos_error *err) {
  topos_params *z = params_alloc(params->n);
  if (z == NULL) {
    error_set(err, TOPOS_ERR_MEMORY, "opt_state_new: out of memory");
    return NULL;
  }
  for (int s = 0; s < params->n; s++) {
    const topos_tensor *p = params->t[s];
    z->t[s] =
        topos_tensor_zeros(moment_dtype(p->dtype), p->rank, p->shape, err);
    if (z->t[s] == NULL) {
      topos_params_free(z);
      return NULL;
    }
  }
  return z;
}

topos_opt_state *topos_opt_state_new(const topos_optimizer *opt,
                                     const topos_params *params,
                                     topos_error *err) {
  const char *fn = "opt_state_new";
  if (check_optimizer(opt, fn, err) != TOPOS_OK ||
      check_float_set(params, "params", fn, err) != TOPOS_OK)
    return NULL;
  topos_params *m = NULL, *v = NULL;
  if (needs_first_moment(opt) && (m = zero_moments(params, err)) == NULL)
    return NULL;
  if (needs_second_moment(opt) && (v = zero_moments(params, err)) == NULL) {
    topos_params_free(m);
    return NULL;
  }
  topos_opt_state *s = state_make(0, m, v);
  if (s == NULL) {
    topos_params_free(m);
    topos_params_free(v);
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", fn);
  }
  return s;
}

topos_opt_state *topos_opt_state_from(int64_t step, const topos_params *m,
                                      const topos_params *v, topos_error *err) {
  const char *fn = "opt_state_from";
  if (step < 0) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: negative step %lld", fn,
              (long long)step);
    return NULL;
  }
  if ((m && check_float_set(m, "first moment", fn, err) != TOPOS_OK) ||
      (v && check_float_set(v, "second moment", fn, err) != TOPOS_OK))
    return NULL;
  if (m && v && check_matches(m, v, "second moment", false, fn, err))
    return NULL;
  topos_params *mm, *vv;
  if (share_set(m, &mm, err) != TOPOS_OK) return NULL;
  if (share_set(v, &vv, err) != TOPOS_OK) {
    topos_params_free(mm);
    return NULL;
  }
  topos_opt_state *s = state_make(step, mm, vv);
  if (s == NULL) {
    topos_params_free(mm);
    topos_params_free(vv);
    error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", fn);
  }
  return s;
}

void topos_opt_state_free(topos_opt_state *s) {
  if (s == NULL) return;
  topos_params_free(s->m);
  topos_params_free(s->v);
  free(s);
}

int64_t topos_opt_state_step(const topos_opt_state *s) {
  return s ? s->step : -1;
}

const topos_params *topos_opt_state_moment(const topos_opt_state *s,
                                           int which) {
  if (s == NULL) return NULL;
  return which == 0 ? s->m : which == 1 ? s->v : NULL;
}

/* ------------------------------------------------------------ exact powers */

/* A double-double: the unevaluated sum hi + lo, |lo| <= ulp(hi)/2. */
typedef struct dd {
  double hi, lo;
} dd;

/* a*b to about 2^-104 relative: the head product is split exactly by fma,
 * the cross terms are small enough that plain products do. */
static dd dd_mul(dd a, dd b) {
  double p = a.hi * b.hi;
  double e = fma(a.hi, b.hi, -p);
  e += a.hi * b.lo + a.lo * b.hi;
  double hi = p + e;
  return (dd){hi, e - (hi - p)};
}

/* beta^t, t >= 1, correctly rounded (see the file comment).  Binary
 * exponentiation takes at most 2*63 products, whose errors together stay
 * near 2^-97 relative, far below the 2^-53 of the final rounding. */
static double exact_pow(double beta, int64_t t) {
  dd r = {1.0, 0.0}, b = {beta, 0.0};
  while (t > 0) {
    if (t & 1) r = dd_mul(r, b);
    t >>= 1;
    if (t > 0) b = dd_mul(b, b);
  }
  return r.hi + r.lo;
}

/* ----------------------------------------------------------------- the step */

/* The widened element i of a compute view of a tensor of `dtype`. */
static double view_at(const compute_view *v, topos_dtype dtype, int64_t i) {
  return dtype == TOPOS_F64 ? ((const double *)v->data)[i]
                            : (double)((const float *)v->data)[i];
}

/* What one step needs beyond the optimizer: bias corrections (Adam). */
typedef struct step_ctx {
  const topos_optimizer *opt;
  double bc1, bc2;
  const char *fn;      /* the public call, for messages */
  const exec_env *env; /* threads for the Adam pass, or NULL */
} step_ctx;

/* A moment element no step from a valid state can make: a first moment
 * must be finite, a second moment >= 0 and not NaN (v' = b2*v + (1-b2)*g*g
 * keeps v >= 0 from v >= 0; NaN there is a NaN gradient of an earlier
 * step).  Checked when a state is used, never when a step writes one, so
 * a NaN gradient still propagates into the state it returns. */
static bool first_moment_ok(double x) {
  return isfinite(x);
}

static bool second_moment_ok(double x) {
  return x >= 0; /* false for NaN; -0 and +inf pass */
}

static int moment_fault(const char *fn, bool second, int slot, int64_t i,
                        double x, topos_error *err) {
  if (second)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "%s: state second moment (v) slot %d element %lld is %g; "
                     "second moments must be >= 0 and not NaN",
                     fn, slot, (long long)i, x);
  return error_set(err, TOPOS_ERR_ARGUMENT,
                   "%s: state first moment (m) slot %d element %lld is %g; "
                   "first moments must be finite",
                   fn, slot, (long long)i, x);
}

/* next = p − lr·g (g + wd·p with L2) in double, rounded once to T. */
#define SGD_LOOP(T, P, G, D, n, l2, wd, lr)                         \
  do {                                                              \
    const T *p_ = (const T *)(P), *g_ = (const T *)(G);             \
    T *d_ = (T *)(D);                                               \
    if (l2)                                                         \
      for (int64_t i = 0; i < (n); i++)                             \
        d_[i] = (T)((double)p_[i] -                                 \
                    (lr) * ((double)g_[i] + (wd) * (double)p_[i])); \
    else                                                            \
      for (int64_t i = 0; i < (n); i++)                             \
        d_[i] = (T)((double)p_[i] - (lr) * (double)g_[i]);          \
  } while (0)

/* SGD_LOOP for f32 on AVX-512, 8 elements at once: each widened to
 * double, the same mul and sub (no fma), rounded once to f32 by
 * cvtpd2ps (round to nearest even, as the C conversion). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static void sgd_f32_512(const float *p,
                                                           const float *g,
                                                           float *d, int64_t n,
                                                           bool l2, double wd,
                                                           double lr) {
  const __m512d vlr = _mm512_set1_pd(lr), vwd = _mm512_set1_pd(wd);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512d pv = _mm512_cvtps_pd(_mm256_loadu_ps(p + i));
    __m512d gv = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
    if (l2) gv = _mm512_add_pd(gv, _mm512_mul_pd(vwd, pv));
    __m512d r = _mm512_sub_pd(pv, _mm512_mul_pd(vlr, gv));
    _mm256_storeu_ps(d + i, _mm512_cvtpd_ps(r));
  }
  /* The tail (named first: SGD_LOOP's own index is i). */
  const float *pt = p + i, *gt = g + i;
  float *dt = d + i;
  int64_t left = n - i;
  SGD_LOOP(float, pt, gt, dt, left, l2, wd, lr);
}

static bool avx512_available(void) {
  static int known = -1;
  if (known < 0) known = __builtin_cpu_supports("avx512f");
  return known;
}

/* What one Adam/AdamW element needs beyond its four inputs. */
typedef struct adam_consts {
  double lr, wd, lr_wd, b1, b2, bc1, bc2, eps;
  bool l2, decoupled;
} adam_consts;

/* step_slot's Adam loop for f32 parameters and moments on AVX-512, 8
 * elements at once, up to the first group holding a moment the state may
 * not hold; returns how many elements it stepped (step_slot's own loop
 * does the rest, and names the element at fault).  Each element is the
 * scalar loop's: widened to double, the same operations in the same
 * order (no fma; sqrt and division correctly rounded in both), each
 * result rounded once to f32 by cvtpd2ps. */
__attribute__((target("avx512f"))) static int64_t adam_f32_512(
    const adam_consts *k, const float *p, const float *g, const float *m,
    const float *v, float *po, float *mo, float *vo, int64_t n) {
  const __m512d lr = _mm512_set1_pd(k->lr), wd = _mm512_set1_pd(k->wd),
                lr_wd = _mm512_set1_pd(k->lr_wd), b1 = _mm512_set1_pd(k->b1),
                b2 = _mm512_set1_pd(k->b2), c1 = _mm512_set1_pd(1 - k->b1),
                c2 = _mm512_set1_pd(1 - k->b2), bc1 = _mm512_set1_pd(k->bc1),
                bc2 = _mm512_set1_pd(k->bc2), eps = _mm512_set1_pd(k->eps),
                inf = _mm512_set1_pd(INFINITY), zero = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512d m0 = _mm512_cvtps_pd(_mm256_loadu_ps(m + i));
    __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(v + i));
    /* first_moment_ok: |m| < inf (false for NaN); second_moment_ok:
     * v >= 0 (false for NaN). */
    __mmask8 ok = _mm512_cmp_pd_mask(_mm512_abs_pd(m0), inf, _CMP_LT_OQ) &
                  _mm512_cmp_pd_mask(v0, zero, _CMP_GE_OQ);
    if (ok != 0xFF) break;
    __m512d pv = _mm512_cvtps_pd(_mm256_loadu_ps(p + i));
    __m512d gv = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
    if (k->l2) gv = _mm512_add_pd(gv, _mm512_mul_pd(wd, pv));
    if (k->decoupled) pv = _mm512_sub_pd(pv, _mm512_mul_pd(lr_wd, pv));
    __m512d m1 = _mm512_add_pd(_mm512_mul_pd(b1, m0), _mm512_mul_pd(c1, gv));
    __m512d v1 = _mm512_add_pd(_mm512_mul_pd(b2, v0),
                               _mm512_mul_pd(_mm512_mul_pd(c2, gv), gv));
    _mm256_storeu_ps(mo + i, _mm512_cvtpd_ps(m1));
    _mm256_storeu_ps(vo + i, _mm512_cvtpd_ps(v1));
    __m512d num = _mm512_mul_pd(lr, _mm512_div_pd(m1, bc1));
    __m512d den = _mm512_add_pd(_mm512_sqrt_pd(_mm512_div_pd(v1, bc2)), eps);
    _mm256_storeu_ps(
        po + i, _mm512_cvtpd_ps(_mm512_sub_pd(pv, _mm512_div_pd(num, den))));
  }
  return i;
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* adam_f32_512 over units of ADAM_UNIT elements (a multiple of 8, its
 * group) on a context's threads, from ADAM_MIN_PARALLEL elements.  Each
 * element's arithmetic is its own.  A unit that meets a moment the
 * state may not hold stops at that group and lowers `stop`; step_slot's
 * loop then resumes at the lowest such group and names the first fault,
 * as after the serial pass (the other units' outputs die with the step). */
#define ADAM_UNIT ((int64_t)1 << 14)
#define ADAM_MIN_PARALLEL ((int64_t)1 << 16)

typedef struct adam_job {
  const adam_consts *k;
  const float *p, *g, *m, *v;
  float *po, *mo, *vo;
  int64_t n;
  _Atomic int64_t stop; /* the lowest group a unit stopped at, or n */
} adam_job;

static void adam_unit(void *arg, int64_t unit, int slot) {
  (void)slot;
  adam_job *j = arg;
  int64_t i0 = unit * ADAM_UNIT;
  int64_t len = j->n - i0 < ADAM_UNIT ? j->n - i0 : ADAM_UNIT;
  int64_t done = adam_f32_512(j->k, j->p + i0, j->g + i0, j->m + i0, j->v + i0,
                              j->po + i0, j->mo + i0, j->vo + i0, len);
  if (done < (len & ~(int64_t)7)) {
    int64_t at = i0 + done, cur = atomic_load(&j->stop);
    while (at < cur && !atomic_compare_exchange_weak(&j->stop, &cur, at)) {
    }
  }
}

/* The Adam pass over [0, n) on env's threads where it pays; returns where
 * step_slot's own loop resumes (as adam_f32_512's return). */
static int64_t adam_f32_pass(const exec_env *env, const adam_consts *k,
                             const float *p, const float *g, const float *m,
                             const float *v, float *po, float *mo, float *vo,
                             int64_t n) {
  if (!env || exec_unit_slots(env) < 2 || n < ADAM_MIN_PARALLEL)
    return adam_f32_512(k, p, g, m, v, po, mo, vo, n);
  adam_job j = {k, p, g, m, v, po, mo, vo, n, n};
  /* never stopped midway: the caller asked its context before the pass */
  exec_env whole = *env;
  whole.cancel = NULL;
  whole.deadline_ns = 0;
  whole.report = NULL;
  exec_units(&whole, adam_unit, &j, (n + ADAM_UNIT - 1) / ADAM_UNIT, NULL);
  int64_t stop = atomic_load(&j.stop);
  return stop < n ? stop : n & ~(int64_t)7;
}
#endif

/* Plain SGD over n contiguous values of pd (f32 or f64): d = p − lr·g
 * (with L2: g + wd·p), d may be p itself (each element is read before it
 * is written). */
static void sgd_plain(topos_dtype pd, const void *p, const void *g, void *d,
                      int64_t n, bool l2, double wd, double lr) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (pd == TOPOS_F32 && avx512_available()) {
    sgd_f32_512(p, g, d, n, l2, wd, lr);
    return;
  }
#endif
  if (pd == TOPOS_F32)
    SGD_LOOP(float, p, g, d, n, l2, wd, lr);
  else
    SGD_LOOP(double, p, g, d, n, l2, wd, lr);
}

/* One slot: new parameter and moments into *po, *mo, *vo (mo/vo NULL
 * when the optimizer keeps no such moment).  Returns a status. */
static int step_slot(const step_ctx *c, int slot, const topos_tensor *p,
                     const topos_tensor *g, const topos_tensor *m,
                     const topos_tensor *v, topos_tensor **po,
                     topos_tensor **mo, topos_tensor **vo, topos_error *err) {
  const topos_optimizer *opt = c->opt;
  topos_dtype pd = p->dtype, md = moment_dtype(pd);
  compute_view vp = {0}, vg = {0}, vm = {0}, vv = {0};
  int rc = compute_view_of(p, &vp, err);
  if (rc == TOPOS_OK) rc = compute_view_of(g, &vg, err);
  if (rc == TOPOS_OK && mo) rc = compute_view_of(m, &vm, err);
  if (rc == TOPOS_OK && vo) rc = compute_view_of(v, &vv, err);
  if (rc == TOPOS_OK) {
    *po = tensor_new(pd, p->rank, p->shape, err);
    if (mo) *mo = tensor_new(md, p->rank, p->shape, err);
    if (vo) *vo = tensor_new(md, p->rank, p->shape, err);
    if (!*po || (mo && !*mo) || (vo && !*vo)) rc = TOPOS_ERR_MEMORY;
  }
  if (rc != TOPOS_OK) goto done;

  const double lr = opt->lr, wd = opt->weight_decay;
  const double mu = opt->momentum, b1 = opt->beta1, b2 = opt->beta2;
  const double eps = opt->eps, lr_wd = lr * wd;
  bool l2 = opt->kind != TOPOS_ADAMW && wd != 0;
  bool decoupled = false;
  if (opt->kind == TOPOS_ADAMW && wd != 0)
    decoupled = opt->decay ? opt->decay(slot, p, opt->decay_ctx) : p->rank >= 2;
  void *dp = tensor_data(*po);
  void *dm = mo ? tensor_data(*mo) : NULL, *dv = vo ? tensor_data(*vo) : NULL;
  int64_t n = shape_count(p->rank, p->shape);
  /* Plain SGD on f32/f64, the common training step: the same double
   * arithmetic as the loop below, written so the compiler vectorises it. */
  if (opt->kind == TOPOS_SGD && !mo && (pd == TOPOS_F32 || pd == TOPOS_F64)) {
    sgd_plain(pd, vp.data, vg.data, dp, n, l2, wd, lr);
    goto done;
  }
  int64_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (opt->kind != TOPOS_SGD && pd == TOPOS_F32 && avx512_available()) {
    adam_consts k = {lr, wd, lr_wd, b1, b2, c->bc1, c->bc2, eps, l2, decoupled};
    i = adam_f32_pass(c->env, &k, vp.data, vg.data, vm.data, vv.data, dp, dm,
                      dv, n);
  }
#endif
  for (; i < n; i++) {
    double pv = view_at(&vp, pd, i), gv = view_at(&vg, pd, i);
    if (l2) gv = gv + wd * pv;
    double next;
    if (opt->kind == TOPOS_SGD) {
      if (mo) {
        double m0 = view_at(&vm, md, i);
        if (!first_moment_ok(m0)) {
          rc = moment_fault(c->fn, false, slot, i, m0, err);
          goto done;
        }
        double vel = mu * m0 + gv;
        store_rounded(dm, md, i, vel);
        next = pv - lr * vel;
      } else {
        next = pv - lr * gv;
      }
    } else {
      double m0 = view_at(&vm, md, i), v0 = view_at(&vv, md, i);
      if (!first_moment_ok(m0) || !second_moment_ok(v0)) {
        bool second = first_moment_ok(m0);
        rc = moment_fault(c->fn, second, slot, i, second ? v0 : m0, err);
        goto done;
      }
      if (decoupled) pv = pv - lr_wd * pv;
      double m1 = b1 * m0 + (1 - b1) * gv;
      double v1 = b2 * v0 + (1 - b2) * gv * gv;
      store_rounded(dm, md, i, m1);
      store_rounded(dv, md, i, v1);
      next = pv - lr * (m1 / c->bc1) / (sqrt(v1 / c->bc2) + eps);
    }
    store_rounded(dp, pd, i, next);
  }
done:
  compute_view_done(&vp);
  compute_view_done(&vg);
  compute_view_done(&vm);
  compute_view_done(&vv);
  if (rc != TOPOS_OK) {
    topos_tensor_release(*po);
    *po = NULL;
    if (mo) {
      topos_tensor_release(*mo);
      *mo = NULL;
    }
    if (vo) {
      topos_tensor_release(*vo);
      *vo = NULL;
    }
  }
  return rc;
}

/* Whether every element of a first moment (m, or NULL) is finite and of a
 * second moment (v, or NULL) is >= 0 and not NaN: one branch-free pass
 * over the arrays, the quick answer when all hold (check_moment_values
 * then looks no further; otherwise its element loop names the first
 * fault). */
#define MOMENTS_OK(T, ABS, MAX)                                     \
  static bool moments_ok_##T(const T *m, const T *v, int64_t n) {   \
    int bad = 0;                                                    \
    if (m)                                                          \
      for (int64_t i = 0; i < n; i++) bad |= !(ABS(m[i]) <= (MAX)); \
    if (v)                                                          \
      for (int64_t i = 0; i < n; i++) bad |= !(v[i] >= 0);          \
    return bad == 0;                                                \
  }
MOMENTS_OK(float, fabsf, FLT_MAX)
MOMENTS_OK(double, fabs, DBL_MAX)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* moments_ok_float on AVX-512, sixteen elements a compare (GCC leaves the
 * loop above scalar at -O2): the same predicates, |m| <= FLT_MAX and v >=
 * 0, each false for NaN. */
__attribute__((target("avx512f"))) static bool moments_ok_512(const float *m,
                                                              const float *v,
                                                              int64_t n) {
  const __m512 max = _mm512_set1_ps(FLT_MAX), zero = _mm512_setzero_ps();
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (m)
      bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(m + i)), max,
                                _CMP_NLE_UQ);
    if (v) bad |= _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), zero, _CMP_NGE_UQ);
  }
  return bad == 0 &&
         moments_ok_float(m ? m + i : NULL, v ? v + i : NULL, n - i);
}
#endif

static bool moments_ok_f32(const float *m, const float *v, int64_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (avx512_available()) return moments_ok_512(m, v, n);
#endif
  return moments_ok_float(m, v, n);
}

/* Every element of the moments opt reads holds (first_moment_ok,
 * second_moment_ok), element by element and the first moment first, the
 * order in which step_slot meets them, so both name the same element. */
static int check_moment_values(const topos_optimizer *opt,
                               const topos_opt_state *state, const char *fn,
                               topos_error *err) {
  bool need_m = needs_first_moment(opt), need_v = needs_second_moment(opt);
  int n = need_m ? state->m->n : need_v ? state->v->n : 0;
  for (int s = 0; s < n; s++) {
    const topos_tensor *m = need_m ? state->m->t[s] : NULL;
    const topos_tensor *v = need_v ? state->v->t[s] : NULL;
    const topos_tensor *any = m ? m : v;
    compute_view vm = {0}, vv = {0};
    int rc = m ? compute_view_of(m, &vm, err) : TOPOS_OK;
    if (rc == TOPOS_OK && v) rc = compute_view_of(v, &vv, err);
    int64_t count = shape_count(any->rank, any->shape);
    bool all_ok = false;
    if (rc == TOPOS_OK) {
      const void *md = m ? vm.data : NULL, *vd = v ? vv.data : NULL;
      all_ok = any->dtype == TOPOS_F64 ? moments_ok_double(md, vd, count)
                                       : moments_ok_f32(md, vd, count);
    }
    for (int64_t i = 0; rc == TOPOS_OK && !all_ok && i < count; i++) {
      double mx = m ? view_at(&vm, m->dtype, i) : 0;
      double vx = v ? view_at(&vv, v->dtype, i) : 0;
      if (!first_moment_ok(mx))
        rc = moment_fault(fn, false, s, i, mx, err);
      else if (!second_moment_ok(vx))
        rc = moment_fault(fn, true, s, i, vx, err);
    }
    compute_view_done(&vm);
    compute_view_done(&vv);
    if (rc != TOPOS_OK) return rc;
  }
  return TOPOS_OK;
}

/* The state fits params under opt: the moments opt reads match params,
 * and the step count can advance; with `values`, every moment element
 * holds too (the step checks them as it reads them instead). */
static int check_state(const topos_optimizer *opt, const topos_params *params,
                       const topos_opt_state *state, bool values,
                       const char *fn, topos_error *err) {
  int rc = TOPOS_OK;
  if (needs_first_moment(opt) &&
      (rc = check_matches(params, state->m, "first moment", true, fn, err)) !=
          TOPOS_OK)
    return rc;
  if (needs_second_moment(opt) &&
      (rc = check_matches(params, state->v, "second moment", true, fn, err)) !=
          TOPOS_OK)
    return rc;
  if (state->step < 0 || state->step == INT64_MAX)
    return error_set(err, TOPOS_ERR_RANGE, "%s: step %lld cannot advance", fn,
                     (long long)state->step);
  return values ? check_moment_values(opt, state, fn, err) : TOPOS_OK;
}

int topos_optimizer_check(const topos_optimizer *opt,
                          const topos_params *params,
                          const topos_opt_state *state, topos_error *err) {
  const char *fn = "optimizer_check";
  int rc = check_optimizer(opt, fn, err);
  if (rc == TOPOS_OK) rc = check_float_set(params, "params", fn, err);
  if (rc == TOPOS_OK && state)
    rc = check_state(opt, params, state, true, fn, err);
  return rc;
}

int topos_optimizer_step(const topos_optimizer *opt, const topos_params *params,
                         const topos_params *grads,
                         const topos_opt_state *state,
                         topos_params **params_out, topos_opt_state **state_out,
                         topos_error *err) {
  return optimizer_step_in(NULL, opt, params, grads, state, params_out,
                           state_out, err);
}

int optimizer_step_in(const exec_env *env, const topos_optimizer *opt,
                      const topos_params *params, const topos_params *grads,
                      const topos_opt_state *state, topos_params **params_out,
                      topos_opt_state **state_out, topos_error *err) {
  const char *fn = "optimizer_step";
  int rc = check_optimizer(opt, fn, err);
  if (rc != TOPOS_OK) return rc;
  if (params_out == NULL || state_out == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: %s is NULL", fn,
                     params_out == NULL ? "params_out" : "state_out");
  if (state == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: state is NULL", fn);
  if ((rc = check_float_set(params, "params", fn, err)) != TOPOS_OK ||
      (rc = check_matches(params, grads, "grads", false, fn, err)) !=
          TOPOS_OK ||
      (rc = check_state(opt, params, state, false, fn, err)) != TOPOS_OK)
    return rc;
  bool need_m = needs_first_moment(opt), need_v = needs_second_moment(opt);

  step_ctx c = {.opt = opt, .bc1 = 1, .bc2 = 1, .fn = fn, .env = env};
  if (opt->kind != TOPOS_SGD) {
    int64_t t = state->step + 1;
    c.bc1 = 1 - exact_pow(opt->beta1, t);
    c.bc2 = 1 - exact_pow(opt->beta2, t);
  }
  int n = params->n;
  topos_params *po = params_alloc(n);
  topos_params *mo = need_m ? params_alloc(n) : NULL;
  topos_params *vo = need_v ? params_alloc(n) : NULL;
  topos_opt_state *so = NULL;
  if (!po || (need_m && !mo) || (need_v && !vo)) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", fn);
    goto fail;
  }
  for (int s = 0; s < n; s++) {
    rc = step_slot(&c, s, params->t[s], grads->t[s],
                   need_m ? state->m->t[s] : NULL,
                   need_v ? state->v->t[s] : NULL, &po->t[s],
                   mo ? &mo->t[s] : NULL, vo ? &vo->t[s] : NULL, err);
    if (rc != TOPOS_OK) goto fail;
  }
  so = state_make(state->step + 1, mo, vo);
  if (so == NULL) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", fn);
    goto fail;
  }
  *params_out = po;
  *state_out = so;
  return TOPOS_OK;
fail:
  topos_params_free(po);
  topos_params_free(mo);
  topos_params_free(vo);
  return rc;
}

/* ------------------------------------------------------------- donation */

/* The in-place SGD pass in units of SGD_UNIT elements of one slot (a
 * multiple of 8, the vector loop's width; each element's arithmetic is
 * its own, so any split gives the same bits), spread over env's threads:
 * a pass of a few hundred thousand parameters is memory-bound work the
 * second core halves. */
#define SGD_UNIT ((int64_t)1 << 14)
#define SGD_MIN_PARALLEL (4 * SGD_UNIT)

typedef struct sgd_job {
  topos_tensor *const *p, *const *g;
  const int64_t *first; /* slot s's units are [first[s], first[s + 1]) */
  int n;
  bool l2;
  double wd, lr;
} sgd_job;

static void sgd_unit(void *arg, int64_t unit, int slot) {
  (void)slot;
  const sgd_job *j = arg;
  int lo = 0, hi = j->n - 1; /* the slot holding unit */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (j->first[mid] <= unit)
      lo = mid;
    else
      hi = mid - 1;
  }
  topos_tensor *t = j->p[lo];
  int64_t count = shape_count(t->rank, t->shape);
  int64_t i0 = (unit - j->first[lo]) * SGD_UNIT;
  int64_t len = count - i0 < SGD_UNIT ? count - i0 : SGD_UNIT;
  size_t es = t->dtype == TOPOS_F64 ? sizeof(double) : sizeof(float);
  char *d = (char *)tensor_data(t) + (size_t)i0 * es;
  const char *g = (const char *)tensor_data(j->g[lo]) + (size_t)i0 * es;
  sgd_plain(t->dtype, d, g, d, len, j->l2, j->wd, j->lr);
}

/* Whether plain SGD may write slot tensor p in place: p is held by the
 * donated set alone (one reference, its buffer unshared), and p and its
 * gradient g are contiguous arrays of the same f32/f64 dtype (so the
 * update reads them where they are and allocates nothing). */
static bool donatable(const topos_tensor *p, const topos_tensor *g) {
  return (p->dtype == TOPOS_F32 || p->dtype == TOPOS_F64) &&
         g->dtype == p->dtype && atomic_load(&p->refs) == 1 &&
         atomic_load(&p->buf->refs) == 1 && topos_tensor_is_contiguous(p) &&
         topos_tensor_is_contiguous(g);
}

int optimizer_step_donated(const exec_env *env, const topos_optimizer *opt,
                           topos_params **params, const topos_params *grads,
                           const topos_opt_state *state,
                           topos_params **params_out,
                           topos_opt_state **state_out, topos_error *err) {
  const char *fn = "optimizer_step";
  topos_params *p = *params;
  int rc = check_optimizer(opt, fn, err);
  if (rc != TOPOS_OK) return rc;
  if (needs_first_moment(opt)) { /* moments: the update can fault midway */
    rc = optimizer_step_in(env, opt, p, grads, state, params_out, state_out,
                           err);
    if (rc == TOPOS_OK) {
      topos_params_free(p);
      *params = NULL;
    }
    return rc;
  }
  if (state == NULL)
    return error_set(err, TOPOS_ERR_ARGUMENT, "%s: state is NULL", fn);
  if ((rc = check_float_set(p, "params", fn, err)) != TOPOS_OK ||
      (rc = check_matches(p, grads, "grads", false, fn, err)) != TOPOS_OK ||
      (rc = check_state(opt, p, state, false, fn, err)) != TOPOS_OK)
    return rc;
  int n = p->n;
  step_ctx c = {.opt = opt, .bc1 = 1, .bc2 = 1, .fn = fn};
  topos_params *po = params_alloc(n);
  bool *in_place = calloc((size_t)(n > 0 ? n : 1), sizeof *in_place);
  /* the in-place slots' tensors and gradients, and their first units */
  topos_tensor **ip = calloc((size_t)(2 * n + 1), sizeof *ip);
  int64_t *first = calloc((size_t)(n + 1), sizeof *first);
  topos_opt_state *so = state_make(state->step + 1, NULL, NULL);
  if (!po || !in_place || !ip || !first || !so) {
    rc = error_set(err, TOPOS_ERR_MEMORY, "%s: out of memory", fn);
    goto fail;
  }
  /* Every slot that needs a new buffer first: a failure there leaves the
   * donated set as it was. */
  for (int s = 0; s < n; s++) {
    in_place[s] = donatable(p->t[s], grads->t[s]);
    if (in_place[s]) continue;
    rc = step_slot(&c, s, p->t[s], grads->t[s], NULL, NULL, &po->t[s], NULL,
                   NULL, err);
    if (rc != TOPOS_OK) goto fail;
  }
  /* Then the rest in place, which cannot fail (the pass is not stopped
   * midway: the caller asked its context once before it); their tensors
   * move over. */
  int nip = 0;
  int64_t total = 0;
  for (int s = 0; s < n; s++) {
    if (!in_place[s]) continue;
    topos_tensor *t = p->t[s];
    int64_t count = shape_count(t->rank, t->shape);
    total += count;
    ip[nip] = t;
    ip[n + nip] = grads->t[s];
    first[nip + 1] = first[nip] + (count + SGD_UNIT - 1) / SGD_UNIT;
    nip++;
  }
  if (nip > 0) {
    sgd_job job = {.p = ip,
                   .g = ip + n,
                   .first = first,
                   .n = nip,
                   .l2 = opt->weight_decay != 0,
                   .wd = opt->weight_decay,
                   .lr = opt->lr};
    exec_env whole = {.threads = 1};
    /* a pass of a few units runs on the caller alone: a wake-up of the
     * pool costs more than it would save */
    if (env && total >= SGD_MIN_PARALLEL) whole = *env;
    whole.cancel = NULL;
    whole.deadline_ns = 0;
    whole.report = NULL; /* a report covers the plan's kernels */
    exec_units(&whole, sgd_unit, &job, first[nip], NULL);
  }
  for (int s = 0; s < n; s++) {
    if (!in_place[s]) continue;
    po->t[s] = p->t[s];
    p->t[s] = NULL;
  }
  free(in_place);
  free(ip);
  free(first);
  topos_params_free(p);
  *params = NULL;
  *params_out = po;
  *state_out = so;
  return TOPOS_OK;
fail:
  free(in_place);
  free(ip);
  free(first);
  topos_params_free(po);
  topos_opt_state_free(so);
  return rc;
}
