/*
 * cpu_math.c - f32 tanhf / expf / logf over arrays with exactly the C
 * library's bits (numerics.md, "Elementwise": libm once per element).
 *
 * A vector kernel here is the same sequence of IEEE operations as the
 * libm it stands for, run in every lane: glibc 2.36 x86_64 (Debian 12),
 *
 *  - tanhf: sysdeps/ieee754/flt-32/s_tanhf.c, built for baseline x86-64
 *    (no FMA), calling expm1f (s_expm1f.c, fdlibm style, float ops): the
 *    kernel evaluates every branch of both in the lanes and keeps, per
 *    lane, the branch libm takes (same thresholds on the bit patterns,
 *    same float operations, same integer exponent arithmetic);
 *  - expf: e_expf.c as the ifunc's __expf_fma (double arithmetic, the
 *    32-entry 2^(i/32) table, and the four multiply-adds GCC fused there);
 *  - logf: e_logf.c as __logf_fma (16-entry table, fused likewise).
 *
 * Operation order and fusion were read off the disassembly of the
 * installed libm.  Lanes that leave the main path (expf: |x| >= 88 or NaN;
 * logf: x <= 0, subnormal, Inf, NaN) call libm itself, so errno and NaN
 * payloads are libm's by construction.  Every operation is an explicit
 * intrinsic (the build has -ffp-contract=off, so nothing else is fused).
 *
 * None of this is trusted: at first use a self-check runs each kernel on
 * thousands of inputs that reach every branch, every threshold and its
 * neighbours, and compares bit patterns with libm's.  A kernel that
 * differs anywhere is off for the process (cpu_math_live() says false) and
 * cpu_math_f32() calls libm per element.  A different libm can therefore
 * cost speed, never bits.
 */
#include "cpu_math.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MATH_X86 1
#include <immintrin.h>
#else
#define MATH_X86 0
#endif

typedef void (*math_kernel)(const float *x, float *y, int64_t n);

static float libm1(cpu_math_fn f, float x) {
  switch (f) {
    case CPU_MATH_TANH:
      return tanhf(x);
    case CPU_MATH_EXP:
      return expf(x);
    default:
      return logf(x);
  }
}

static void libm_loop(cpu_math_fn f, const float *x, float *y, int64_t n) {
  switch (f) {
    case CPU_MATH_TANH:
      for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
      break;
    case CPU_MATH_EXP:
      for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
      break;
    default:
      for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
      break;
  }
}

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ------------------------------------------------------------ constants */

/* s_expm1f.c */
#define EM_LN2_HI 0x1.62e300p-1f  /* 0x3f317180 */
#define EM_LN2_LO 0x1.2fefa2p-17f /* 0x3717f7d1 */
#define EM_INVLN2 0x1.715476p+0f  /* 0x3fb8aa3b */
#define EM_Q1 -0x1.111112p-5f     /* 0xbd088889 */
#define EM_Q2 0x1.a01a02p-10f     /* 0x3ad00d01 */
#define EM_Q3 -0x1.4ce19ap-14f    /* 0xb8a670cd */
#define EM_Q4 0x1.0cfca8p-18f     /* 0x36867e54 */
#define EM_Q5 -0x1.afdb76p-23f    /* 0xb457edbb */

/* e_exp2f_data.c: tab[i] = bits(2^(i/32)) - (i << 47) */
static const uint64_t exp_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f,
    0x3fef9301d0125b51, 0x3fef72b83c7d517b, 0x3fef54873168b9aa,
    0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74,
    0x3feea11473eb0187, 0x3feea589994cce13, 0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c,
    0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define EXP_INVLN2N (0x1.71547652b82fep+0 * 32)
#define EXP_SHIFT 0x1.8p+52
#define EXP_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define EXP_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define EXP_C2 (0x1.62e42ff0c52d6p-1 / 32)

/* e_logf_data.c: per subinterval 1/c and log(c) */
static const double log_invc[16] = {
    0x1.661ec79f8f3bep+0, 0x1.571ed4aaf883dp+0,
    0x1.49539f0f010bp+0,  0x1.3c995b0b80385p+0,
    0x1.30d190c8864a5p+0, 0x1.25e227b0b8eap+0,
    0x1.1bb4a4a1a343fp+0, 0x1.12358f08ae5bap+0,
    0x1.0953f419900a7p+0, 0x1p+0,
    0x1.e608cfd9a47acp-1, 0x1.ca4b31f026aap-1,
    0x1.b2036576afce6p-1, 0x1.9c2d163a1aa2dp-1,
    0x1.886e6037841edp-1, 0x1.767dcf5534862p-1,
};
static const double log_logc[16] = {
    -0x1.57bf7808caadep-2, -0x1.2bef0a7c06ddbp-2,
    -0x1.01eae7f513a67p-2, -0x1.b31d8a68224e9p-3,
    -0x1.6574f0ac07758p-3, -0x1.1aa2bc79c81p-3,
    -0x1.a4e76ce8c0e5ep-4, -0x1.1973c5a611cccp-4,
    -0x1.252f438e10c1ep-5, 0x0p+0,
    0x1.aa5aa5df25984p-5,  0x1.c5e53aa362eb4p-4,
    0x1.526e57720db08p-3,  0x1.bc2860d22477p-3,
    0x1.1058bc8a07ee1p-2,  0x1.4043057b6ee09p-2,
};
#define LOG_LN2 0x1.62e42fefa39efp-1
#define LOG_A0 -0x1.00ea348b88334p-2
#define LOG_A1 0x1.5575b0be00b6ap-2
#define LOG_A2 -0x1.ffffef20a4123p-2
#define LOG_OFF 0x3f330000

/* ------------------------------------------------------------- AVX-512 */

#if MATH_X86

#define T512 __attribute__((target("avx512f")))
#define F512(v) _mm512_set1_ps(v)
#define I512(v) _mm512_set1_epi32((int)(v))

/*
 * expm1f (s_expm1f.c) for the arguments tanhf gives it: finite u with
 * |u| < 44.  Branches by |u|'s bits hx:
 *   hx <  0x33000000            u
 *   hx <= 0x3eb17218            k = 0, no reduction
 *   hx <  0x3f851592            k = +-1, hi = u -+ ln2_hi, lo = +-ln2_lo
 *   else                        k = (int)(invln2*u +- 0.5), hi, lo
 * then the common rational approximation and the result by k.
 */
T512 __attribute__((always_inline)) static inline __m512 expm1_512(__m512 x) {
  const __m512 one = F512(1.0f);
  __m512i bx = _mm512_castps_si512(x);
  __m512i hx = _mm512_and_epi32(bx, I512(0x7fffffff));
  __mmask16 neg = _mm512_cmplt_epi32_mask(bx, _mm512_setzero_si512());
  __mmask16 small = _mm512_cmplt_epi32_mask(hx, I512(0x33000000));
  __mmask16 k0 = _mm512_cmple_epi32_mask(hx, I512(0x3eb17218));
  __mmask16 kg = _mm512_cmpge_epi32_mask(hx, I512(0x3f851592));
  __mmask16 k1 = (__mmask16)(~k0 & ~kg);

  /* general k */
  __m512 hs = _mm512_mask_blend_ps(neg, F512(0.5f), F512(-0.5f));
  __m512 kf = _mm512_add_ps(_mm512_mul_ps(F512(EM_INVLN2), x), hs);
  __m512i k = _mm512_cvttps_epi32(kf);
  __m512 t = _mm512_cvtepi32_ps(k);
  __m512 hi = _mm512_sub_ps(x, _mm512_mul_ps(t, F512(EM_LN2_HI)));
  __m512 lo = _mm512_mul_ps(t, F512(EM_LN2_LO));
  /* k = +-1 */
  __m512 hi1 = _mm512_mask_blend_ps(neg, _mm512_sub_ps(x, F512(EM_LN2_HI)),
                                    _mm512_add_ps(x, F512(EM_LN2_HI)));
  __m512 lo1 = _mm512_mask_blend_ps(neg, F512(EM_LN2_LO), F512(-EM_LN2_LO));
  __m512i kk1 = _mm512_mask_blend_epi32(neg, I512(1), I512(-1));
  hi = _mm512_mask_blend_ps(k1, hi, hi1);
  lo = _mm512_mask_blend_ps(k1, lo, lo1);
  k = _mm512_mask_blend_epi32(k1, k, kk1);
  __m512 xr = _mm512_sub_ps(hi, lo);
  __m512 c = _mm512_sub_ps(_mm512_sub_ps(hi, xr), lo);
  /* k = 0 */
  xr = _mm512_mask_blend_ps(k0, xr, x);
  k = _mm512_mask_blend_epi32(k0, k, _mm512_setzero_si512());

  __m512 hfx = _mm512_mul_ps(F512(0.5f), xr);
  __m512 hxs = _mm512_mul_ps(xr, hfx);
  __m512 p = _mm512_mul_ps(hxs, F512(EM_Q5));
  p = _mm512_mul_ps(hxs, _mm512_add_ps(F512(EM_Q4), p));
  p = _mm512_mul_ps(hxs, _mm512_add_ps(F512(EM_Q3), p));
  p = _mm512_mul_ps(hxs, _mm512_add_ps(F512(EM_Q2), p));
  p = _mm512_mul_ps(hxs, _mm512_add_ps(F512(EM_Q1), p));
  __m512 r1 = _mm512_add_ps(one, p);
  __m512 tt = _mm512_sub_ps(F512(3.0f), _mm512_mul_ps(r1, hfx));
  __m512 e = _mm512_mul_ps(
      hxs, _mm512_div_ps(_mm512_sub_ps(r1, tt),
                         _mm512_sub_ps(F512(6.0f), _mm512_mul_ps(xr, tt))));

  /* k == 0 */
  __m512 res = _mm512_sub_ps(xr, _mm512_sub_ps(_mm512_mul_ps(xr, e), hxs));
  /* k != 0 */
  e = _mm512_sub_ps(_mm512_sub_ps(_mm512_mul_ps(xr, _mm512_sub_ps(e, c)), c),
                    hxs);
  __m512i k23 = _mm512_slli_epi32(k, 23);
  __m512 emx = _mm512_sub_ps(e, xr);
  /* k == -1 */
  __m512 rm1 = _mm512_sub_ps(_mm512_mul_ps(F512(0.5f), _mm512_sub_ps(xr, e)),
                             F512(0.5f));
  /* k == 1 */
  __m512 rp1a = _mm512_mul_ps(F512(-2.0f),
                              _mm512_sub_ps(e, _mm512_add_ps(xr, F512(0.5f))));
  __m512 rp1b =
      _mm512_add_ps(one, _mm512_mul_ps(F512(2.0f), _mm512_sub_ps(xr, e)));
  __mmask16 lt = _mm512_cmp_ps_mask(xr, F512(-0.25f), _CMP_LT_OQ);
  __m512 rp1 = _mm512_mask_blend_ps(lt, rp1b, rp1a);
  /* k <= -2 or k > 56 */
  __m512 yp = _mm512_sub_ps(one, emx);
  yp = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(yp), k23));
  yp = _mm512_sub_ps(yp, one);
  /* 2 <= k < 23 */
  __m512 tq = _mm512_castsi512_ps(_mm512_sub_epi32(
      I512(0x3f800000), _mm512_srlv_epi32(I512(0x1000000), k)));
  __m512 yq = _mm512_sub_ps(tq, emx);
  yq = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(yq), k23));
  /* 23 <= k <= 56 */
  __m512 tr = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_sub_epi32(I512(0x7f), k), 23));
  __m512 yr = _mm512_sub_ps(xr, _mm512_add_ps(e, tr));
  yr = _mm512_add_ps(yr, one);
  yr = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(yr), k23));

  __mmask16 is_m1 = _mm512_cmpeq_epi32_mask(k, I512(-1));
  __mmask16 is_p1 = _mm512_cmpeq_epi32_mask(k, I512(1));
  __mmask16 is_p = (__mmask16)(_mm512_cmple_epi32_mask(k, I512(-2)) |
                               _mm512_cmpgt_epi32_mask(k, I512(56)));
  __mmask16 is_q = (__mmask16)(_mm512_cmpge_epi32_mask(k, I512(2)) &
                               _mm512_cmplt_epi32_mask(k, I512(23)));
  __mmask16 is_r = (__mmask16)(_mm512_cmpge_epi32_mask(k, I512(23)) &
                               _mm512_cmple_epi32_mask(k, I512(56)));
  res = _mm512_mask_mov_ps(res, is_m1, rm1);
  res = _mm512_mask_mov_ps(res, is_p1, rp1);
  res = _mm512_mask_mov_ps(res, is_p, yp);
  res = _mm512_mask_mov_ps(res, is_q, yq);
  res = _mm512_mask_mov_ps(res, is_r, yr);
  return _mm512_mask_mov_ps(res, small, x);
}

/* tanhf (s_tanhf.c), every input. */
T512 static inline __m512 tanh_512(__m512 x) {
  const __m512 one = F512(1.0f), two = F512(2.0f);
  __m512i jx = _mm512_castps_si512(x);
  __m512i sign = _mm512_and_epi32(jx, I512(0x80000000));
  __m512i ix = _mm512_and_epi32(jx, I512(0x7fffffff));
  __m512 a = _mm512_castsi512_ps(ix);
  __mmask16 neg = _mm512_cmplt_epi32_mask(jx, _mm512_setzero_si512());
  __mmask16 naninf = _mm512_cmpge_epi32_mask(ix, I512(0x7f800000));
  __mmask16 big = _mm512_cmpge_epi32_mask(ix, I512(0x41b00000));
  __mmask16 tiny = _mm512_cmplt_epi32_mask(ix, I512(0x24000000));
  __mmask16 zero = _mm512_cmpeq_epi32_mask(ix, _mm512_setzero_si512());
  __mmask16 ge1 = _mm512_cmpge_epi32_mask(ix, I512(0x3f800000));

  /* 2^-55 <= |x| < 22: through expm1f */
  __m512 u = _mm512_mask_blend_ps(ge1, _mm512_mul_ps(a, F512(-2.0f)),
                                  _mm512_add_ps(a, a));
  /* keep the unused lanes in expm1f's domain */
  u = _mm512_mask_mov_ps(u, (__mmask16)(big | tiny), one);
  __m512 t = expm1_512(u);
  /* |x| >= 1: 1 - 2/(t+2); else -t/(t+2) (one divide for both) */
  __m512 den = _mm512_add_ps(t, two);
  __m512 mt = _mm512_castsi512_ps(
      _mm512_xor_epi32(_mm512_castps_si512(t), I512(0x80000000)));
  __m512 q = _mm512_div_ps(_mm512_mask_blend_ps(ge1, mt, two), den);
  __m512 z = _mm512_mask_sub_ps(q, ge1, one, q);
  /* |x| >= 22: 1 - tiny */
  z = _mm512_mask_mov_ps(z, big, _mm512_sub_ps(one, F512(1.0e-30f)));
  z = _mm512_castsi512_ps(_mm512_xor_epi32(_mm512_castps_si512(z), sign));
  /* |x| < 2^-55: x * (1 + x); +-0: x */
  z = _mm512_mask_mov_ps(z, tiny, _mm512_mul_ps(x, _mm512_add_ps(one, x)));
  z = _mm512_mask_mov_ps(z, zero, x);
  /* Inf, NaN: 1/x +- 1 */
  if (naninf) {
    __m512 rx = _mm512_div_ps(one, x);
    __m512 zn = _mm512_mask_blend_ps(neg, _mm512_add_ps(rx, one),
                                     _mm512_sub_ps(rx, one));
    z = _mm512_mask_mov_ps(z, naninf, zn);
  }
  return z;
}

T512 static void tanh_avx512(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, tanh_512(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, tanh_512(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

T512 static inline __m256 lo256(__m512 v) {
  return _mm512_castps512_ps256(v);
}
T512 static inline __m256 hi256(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
T512 static inline __m512 join256(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(
      _mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* expf (e_expf.c, __expf_fma) on 8 lanes in double. */
T512 static inline __m256 exp_512_8(__m256 xf, const __m512i tab[4]) {
  const __m512d invln2n = _mm512_set1_pd(EXP_INVLN2N);
  const __m512d shift = _mm512_set1_pd(EXP_SHIFT);
  __m512d xd = _mm512_cvtps_pd(xf);
  __m512d kd = _mm512_fmadd_pd(invln2n, xd, shift);
  __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
  __m512i t0 = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
  __m512i t1 = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
  __mmask8 up = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
  __m512i t = _mm512_mask_blend_epi64(up, t0, t1);
  t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
  __m512d s = _mm512_castsi512_pd(t);
  __m512d z =
      _mm512_fmadd_pd(_mm512_set1_pd(EXP_C0), r, _mm512_set1_pd(EXP_C1));
  __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(EXP_C2), r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  y = _mm512_mul_pd(y, s);
  return _mm512_cvtpd_ps(y);
}

/* logf (e_logf.c, __logf_fma) on 8 lanes of (ix, tmp) in double. */
T512 static inline __m256 log_512_8(__m256i ix, __m256i tmp,
                                    const __m512d tab[4]) {
  __m256i i =
      _mm256_and_si256(_mm256_srli_epi32(tmp, 19), _mm256_set1_epi32(15));
  __m256i k = _mm256_srai_epi32(tmp, 23);
  __m256i iz = _mm256_sub_epi32(
      ix, _mm256_and_si256(tmp, _mm256_set1_epi32((int)0xff800000)));
  __m512i i64 = _mm512_cvtepu32_epi64(i);
  __m512d invc = _mm512_permutex2var_pd(tab[0], i64, tab[1]);
  __m512d logc = _mm512_permutex2var_pd(tab[2], i64, tab[3]);
  __m512d z = _mm512_cvtps_pd(_mm256_castsi256_ps(iz));
  __m512d kd = _mm512_cvtepi32_pd(k);
  __m512d r = _mm512_fmadd_pd(z, invc, _mm512_set1_pd(-1.0));
  __m512d y0 = _mm512_fmadd_pd(kd, _mm512_set1_pd(LOG_LN2), logc);
  __m512d y =
      _mm512_fmadd_pd(r, _mm512_set1_pd(LOG_A1), _mm512_set1_pd(LOG_A2));
  __m512d r2 = _mm512_mul_pd(r, r);
  __m512d p = _mm512_add_pd(r, y0);
  y = _mm512_fmadd_pd(r2, _mm512_set1_pd(LOG_A0), y);
  y = _mm512_fmadd_pd(r2, y, p);
  return _mm512_cvtpd_ps(y);
}

/* 16 lanes: the vector result in r; lanes in `spec` call libm. */
T512 static inline void store16(cpu_math_fn f, __m512 v, __m512 r,
                                __mmask16 spec, __mmask16 m, float *y) {
  if (spec) {
    float in[16], out[16];
    _mm512_storeu_ps(in, v);
    _mm512_storeu_ps(out, r);
    for (unsigned s = spec; s; s &= s - 1) {
      int j = __builtin_ctz(s);
      out[j] = libm1(f, in[j]);
    }
    r = _mm512_loadu_ps(out);
  }
  _mm512_mask_storeu_ps(y, m, r);
}

T512 static void exp_avx512(const float *x, float *y, int64_t n) {
  __m512i tab[4];
  for (int q = 0; q < 4; q++) tab[q] = _mm512_loadu_si512(exp_tab + 8 * q);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m =
        n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    __m512i ax = _mm512_and_epi32(_mm512_castps_si512(v), I512(0x7fffffff));
    /* |x| >= 88 or NaN: libm's special cases */
    __mmask16 spec =
        (__mmask16)(_mm512_cmpge_epi32_mask(ax, I512(0x42b00000)) & m);
    __m512 r = join256(exp_512_8(lo256(v), tab), exp_512_8(hi256(v), tab));
    /* expf(-inf) is +0 exactly (C Annex F): no call for a masked score. */
    __mmask16 ninf =
        _mm512_cmpeq_epi32_mask(_mm512_castps_si512(v), I512((int)0xff800000));
    spec = (__mmask16)(spec & ~ninf);
    r = _mm512_maskz_mov_ps((__mmask16)~ninf, r);
    store16(CPU_MATH_EXP, v, r, spec, m, y + i);
  }
}

T512 static void log_avx512(const float *x, float *y, int64_t n) {
  __m512d tab[4];
  tab[0] = _mm512_loadu_pd(log_invc);
  tab[1] = _mm512_loadu_pd(log_invc + 8);
  tab[2] = _mm512_loadu_pd(log_logc);
  tab[3] = _mm512_loadu_pd(log_logc + 8);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m =
        n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 v = _mm512_mask_loadu_ps(F512(1.0f), m, x + i);
    __m512i ix = _mm512_castps_si512(v);
    /* x < 0x1p-126 (zero, subnormal, negative), Inf or NaN: libm */
    __mmask16 spec = (__mmask16)(_mm512_cmpge_epu32_mask(
                                     _mm512_sub_epi32(ix, I512(0x00800000)),
                                     I512(0x7f800000 - 0x00800000)) &
                                 m);
    __mmask16 is1 = _mm512_cmpeq_epi32_mask(ix, I512(0x3f800000));
    __m512i tmp = _mm512_sub_epi32(ix, I512(LOG_OFF));
    __m256i ixl = _mm512_castsi512_si256(ix);
    __m256i ixh = _mm512_extracti64x4_epi64(ix, 1);
    __m256i tl = _mm512_castsi512_si256(tmp);
    __m256i th = _mm512_extracti64x4_epi64(tmp, 1);
    __m512 r = join256(log_512_8(ixl, tl, tab), log_512_8(ixh, th, tab));
    r = _mm512_mask_mov_ps(r, is1, _mm512_setzero_ps());
    store16(CPU_MATH_LOG, v, r, spec, m, y + i);
  }
}

/* --------------------------------------------------------- AVX2 + FMA */

#define T256 __attribute__((target("avx2,fma")))
#define F256(v) _mm256_set1_ps(v)
#define I256(v) _mm256_set1_epi32((int)(v))

/* Lane masks as all-ones / zero float vectors. */
T256 static inline __m256 ge32(__m256i a, int32_t c) { /* a >= c, signed */
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, I256(c - 1)));
}
T256 static inline __m256 eq32(__m256i a, int32_t c) {
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, I256(c)));
}
/* where m: b, else a */
T256 static inline __m256 sel(__m256 m, __m256 a, __m256 b) {
  return _mm256_blendv_ps(a, b, m);
}
T256 static inline __m256i seli(__m256 m, __m256i a, __m256i b) {
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
}
T256 static inline __m256 addbits(__m256 y, __m256i k23) {
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), k23));
}

/* expm1_512, eight lanes. */
T256 __attribute__((always_inline)) static inline __m256 expm1_256(__m256 x) {
  const __m256 one = F256(1.0f);
  __m256i bx = _mm256_castps_si256(x);
  __m256i hx = _mm256_and_si256(bx, I256(0x7fffffff));
  __m256 neg = _mm256_castsi256_ps(_mm256_srai_epi32(bx, 31));
  __m256 small = _mm256_castsi256_ps(_mm256_cmpgt_epi32(I256(0x33000000), hx));
  __m256 k0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(I256(0x3eb17219), hx));
  __m256 kg = ge32(hx, 0x3f851592);
  __m256 k1 =
      _mm256_andnot_ps(_mm256_or_ps(k0, kg), _mm256_castsi256_ps(I256(-1)));

  __m256 hs = sel(neg, F256(0.5f), F256(-0.5f));
  __m256 kf = _mm256_add_ps(_mm256_mul_ps(F256(EM_INVLN2), x), hs);
  __m256i k = _mm256_cvttps_epi32(kf);
  __m256 t = _mm256_cvtepi32_ps(k);
  __m256 hi = _mm256_sub_ps(x, _mm256_mul_ps(t, F256(EM_LN2_HI)));
  __m256 lo = _mm256_mul_ps(t, F256(EM_LN2_LO));
  __m256 hi1 = sel(neg, _mm256_sub_ps(x, F256(EM_LN2_HI)),
                   _mm256_add_ps(x, F256(EM_LN2_HI)));
  __m256 lo1 = sel(neg, F256(EM_LN2_LO), F256(-EM_LN2_LO));
  __m256i kk1 = seli(neg, I256(1), I256(-1));
  hi = sel(k1, hi, hi1);
  lo = sel(k1, lo, lo1);
  k = seli(k1, k, kk1);
  __m256 xr = _mm256_sub_ps(hi, lo);
  __m256 c = _mm256_sub_ps(_mm256_sub_ps(hi, xr), lo);
  xr = sel(k0, xr, x);
  k = seli(k0, k, _mm256_setzero_si256());

  __m256 hfx = _mm256_mul_ps(F256(0.5f), xr);
  __m256 hxs = _mm256_mul_ps(xr, hfx);
  __m256 p = _mm256_mul_ps(hxs, F256(EM_Q5));
  p = _mm256_mul_ps(hxs, _mm256_add_ps(F256(EM_Q4), p));
  p = _mm256_mul_ps(hxs, _mm256_add_ps(F256(EM_Q3), p));
  p = _mm256_mul_ps(hxs, _mm256_add_ps(F256(EM_Q2), p));
  p = _mm256_mul_ps(hxs, _mm256_add_ps(F256(EM_Q1), p));
  __m256 r1 = _mm256_add_ps(one, p);
  __m256 tt = _mm256_sub_ps(F256(3.0f), _mm256_mul_ps(r1, hfx));
  __m256 e = _mm256_mul_ps(
      hxs, _mm256_div_ps(_mm256_sub_ps(r1, tt),
                         _mm256_sub_ps(F256(6.0f), _mm256_mul_ps(xr, tt))));

  __m256 res = _mm256_sub_ps(xr, _mm256_sub_ps(_mm256_mul_ps(xr, e), hxs));
  e = _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(xr, _mm256_sub_ps(e, c)), c),
                    hxs);
  __m256i k23 = _mm256_slli_epi32(k, 23);
  __m256 emx = _mm256_sub_ps(e, xr);
  __m256 rm1 = _mm256_sub_ps(_mm256_mul_ps(F256(0.5f), _mm256_sub_ps(xr, e)),
                             F256(0.5f));
  __m256 rp1a = _mm256_mul_ps(F256(-2.0f),
                              _mm256_sub_ps(e, _mm256_add_ps(xr, F256(0.5f))));
  __m256 rp1b =
      _mm256_add_ps(one, _mm256_mul_ps(F256(2.0f), _mm256_sub_ps(xr, e)));
  __m256 lt = _mm256_cmp_ps(xr, F256(-0.25f), _CMP_LT_OQ);
  __m256 rp1 = sel(lt, rp1b, rp1a);
  __m256 yp = addbits(_mm256_sub_ps(one, emx), k23);
  yp = _mm256_sub_ps(yp, one);
  __m256 tq = _mm256_castsi256_ps(_mm256_sub_epi32(
      I256(0x3f800000), _mm256_srlv_epi32(I256(0x1000000), k)));
  __m256 yq = addbits(_mm256_sub_ps(tq, emx), k23);
  __m256 tr = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(I256(0x7f), k), 23));
  __m256 yr = _mm256_sub_ps(xr, _mm256_add_ps(e, tr));
  yr = addbits(_mm256_add_ps(yr, one), k23);

  __m256 is_m1 = eq32(k, -1), is_p1 = eq32(k, 1);
  __m256 is_p =
      _mm256_or_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(I256(-1), k)),
                   _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, I256(56))));
  __m256 ge2 = ge32(k, 2), ge23 = ge32(k, 23);
  __m256 le56 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(I256(57), k));
  __m256 is_q = _mm256_andnot_ps(ge23, ge2);
  __m256 is_r = _mm256_and_ps(ge23, le56);
  res = sel(is_m1, res, rm1);
  res = sel(is_p1, res, rp1);
  res = sel(is_p, res, yp);
  res = sel(is_q, res, yq);
  res = sel(is_r, res, yr);
  return sel(small, res, x);
}

/* tanh_512, eight lanes. */
T256 static inline __m256 tanh_256(__m256 x) {
  const __m256 one = F256(1.0f), two = F256(2.0f);
  __m256i jx = _mm256_castps_si256(x);
  __m256i sign = _mm256_and_si256(jx, I256(0x80000000));
  __m256i ix = _mm256_and_si256(jx, I256(0x7fffffff));
  __m256 a = _mm256_castsi256_ps(ix);
  __m256 neg = _mm256_castsi256_ps(_mm256_srai_epi32(jx, 31));
  __m256 naninf = ge32(ix, 0x7f800000);
  __m256 big = ge32(ix, 0x41b00000);
  __m256 tiny = _mm256_castsi256_ps(_mm256_cmpgt_epi32(I256(0x24000000), ix));
  __m256 zero = eq32(ix, 0);
  __m256 ge1 = ge32(ix, 0x3f800000);

  __m256 u = sel(ge1, _mm256_mul_ps(a, F256(-2.0f)), _mm256_add_ps(a, a));
  u = sel(_mm256_or_ps(big, tiny), u, one);
  __m256 t = expm1_256(u);
  __m256 den = _mm256_add_ps(t, two);
  __m256 mt = _mm256_xor_ps(t, _mm256_castsi256_ps(I256(0x80000000)));
  __m256 q = _mm256_div_ps(sel(ge1, mt, two), den);
  __m256 z = sel(ge1, q, _mm256_sub_ps(one, q));
  z = sel(big, z, _mm256_sub_ps(one, F256(1.0e-30f)));
  z = _mm256_xor_ps(z, _mm256_castsi256_ps(sign));
  z = sel(tiny, z, _mm256_mul_ps(x, _mm256_add_ps(one, x)));
  z = sel(zero, z, x);
  if (_mm256_movemask_ps(naninf)) {
    __m256 rx = _mm256_div_ps(one, x);
    __m256 zn = sel(neg, _mm256_add_ps(rx, one), _mm256_sub_ps(rx, one));
    z = sel(naninf, z, zn);
  }
  return z;
}

/* Lanes [0, m) of x (the rest 1.0f). */
T256 static inline __m256 load_part(const float *x, int64_t m) {
  float b[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  memcpy(b, x, (size_t)m * sizeof(float));
  return _mm256_loadu_ps(b);
}
T256 static inline void store_part(float *y, __m256 r, int64_t m) {
  float b[8];
  _mm256_storeu_ps(b, r);
  memcpy(y, b, (size_t)m * sizeof(float));
}

T256 static void tanh_avx2(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, tanh_256(_mm256_loadu_ps(x + i)));
  if (i < n) store_part(y + i, tanh_256(load_part(x + i, n - i)), n - i);
}

/* exp_512_8, four lanes. */
T256 static inline __m128 exp_256_4(__m128 xf) {
  const __m256d invln2n = _mm256_set1_pd(EXP_INVLN2N);
  const __m256d shift = _mm256_set1_pd(EXP_SHIFT);
  __m256d xd = _mm256_cvtps_pd(xf);
  __m256d kd = _mm256_fmadd_pd(invln2n, xd, shift);
  __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
  __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  __m256i t = _mm256_i64gather_epi64((const long long *)exp_tab, idx, 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  __m256d s = _mm256_castsi256_pd(t);
  __m256d z =
      _mm256_fmadd_pd(_mm256_set1_pd(EXP_C0), r, _mm256_set1_pd(EXP_C1));
  __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(EXP_C2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  y = _mm256_mul_pd(y, s);
  return _mm256_cvtpd_ps(y);
}

/* log_512_8, four lanes. */
T256 static inline __m128 log_256_4(__m128i ix, __m128i tmp) {
  __m128i i = _mm_and_si128(_mm_srli_epi32(tmp, 19), _mm_set1_epi32(15));
  __m128i k = _mm_srai_epi32(tmp, 23);
  __m128i iz =
      _mm_sub_epi32(ix, _mm_and_si128(tmp, _mm_set1_epi32((int)0xff800000)));
  __m256d invc = _mm256_i32gather_pd(log_invc, i, 8);
  __m256d logc = _mm256_i32gather_pd(log_logc, i, 8);
  __m256d z = _mm256_cvtps_pd(_mm_castsi128_ps(iz));
  __m256d kd = _mm256_cvtepi32_pd(k);
  __m256d r = _mm256_fmadd_pd(z, invc, _mm256_set1_pd(-1.0));
  __m256d y0 = _mm256_fmadd_pd(kd, _mm256_set1_pd(LOG_LN2), logc);
  __m256d y =
      _mm256_fmadd_pd(r, _mm256_set1_pd(LOG_A1), _mm256_set1_pd(LOG_A2));
  __m256d r2 = _mm256_mul_pd(r, r);
  __m256d p = _mm256_add_pd(r, y0);
  y = _mm256_fmadd_pd(r2, _mm256_set1_pd(LOG_A0), y);
  y = _mm256_fmadd_pd(r2, y, p);
  return _mm256_cvtpd_ps(y);
}

T256 static inline void store8(cpu_math_fn f, __m256 v, __m256 r, int spec,
                               float *y, int64_t m) {
  if (spec) {
    float in[8], out[8];
    _mm256_storeu_ps(in, v);
    _mm256_storeu_ps(out, r);
    for (unsigned s = (unsigned)spec; s; s &= s - 1) {
      int j = __builtin_ctz(s);
      out[j] = libm1(f, in[j]);
    }
    r = _mm256_loadu_ps(out);
  }
  if (m == 8)
    _mm256_storeu_ps(y, r);
  else
    store_part(y, r, m);
}

T256 static void exp_avx2(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    int64_t m = n - i >= 8 ? 8 : n - i;
    __m256 v = m == 8 ? _mm256_loadu_ps(x + i) : load_part(x + i, m);
    __m256i ax = _mm256_and_si256(_mm256_castps_si256(v), I256(0x7fffffff));
    int spec = _mm256_movemask_ps(ge32(ax, 0x42b00000)) & ((1 << m) - 1);
    __m256 r = _mm256_set_m128(exp_256_4(_mm256_extractf128_ps(v, 1)),
                               exp_256_4(_mm256_castps256_ps128(v)));
    /* expf(-inf) is +0 exactly (C Annex F): no call for a masked score. */
    __m256 ninf = eq32(_mm256_castps_si256(v), (int)0xff800000);
    spec &= ~_mm256_movemask_ps(ninf);
    r = _mm256_andnot_ps(ninf, r);
    store8(CPU_MATH_EXP, v, r, spec, y + i, m);
  }
}

T256 static void log_avx2(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    int64_t m = n - i >= 8 ? 8 : n - i;
    __m256 v = m == 8 ? _mm256_loadu_ps(x + i) : load_part(x + i, m);
    __m256i ix = _mm256_castps_si256(v);
    /* unsigned ix - 0x00800000 >= 0x7f000000, by flipping the sign bits */
    __m256i off = _mm256_xor_si256(_mm256_sub_epi32(ix, I256(0x00800000)),
                                   I256(0x80000000));
    __m256 sp = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(off, I256((int)((0x7f000000u - 1u) ^ 0x80000000u))));
    int spec = _mm256_movemask_ps(sp) & ((1 << m) - 1);
    __m256 is1 = eq32(ix, 0x3f800000);
    __m256i tmp = _mm256_sub_epi32(ix, I256(LOG_OFF));
    __m256 r = _mm256_set_m128(
        log_256_4(_mm256_extracti128_si256(ix, 1),
                  _mm256_extracti128_si256(tmp, 1)),
        log_256_4(_mm256_castsi256_si128(ix), _mm256_castsi256_si128(tmp)));
    r = sel(is1, r, _mm256_setzero_ps());
    store8(CPU_MATH_LOG, v, r, spec, y + i, m);
  }
}

#endif /* MATH_X86 */

/* ------------------------------------------------------------ dispatch */

enum { ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static math_kernel kernel_for(cpu_math_fn f, int isa) {
#if MATH_X86
  if (isa == ISA_AVX512) {
    switch (f) {
      case CPU_MATH_TANH:
        return tanh_avx512;
      case CPU_MATH_EXP:
        return exp_avx512;
      case CPU_MATH_LOG:
        return log_avx512;
      default:
        return NULL;
    }
  }
  if (isa == ISA_AVX2) {
    switch (f) {
      case CPU_MATH_TANH:
        return tanh_avx2;
      case CPU_MATH_EXP:
        return exp_avx2;
      case CPU_MATH_LOG:
        return log_avx2;
      default:
        return NULL;
    }
  }
#endif
  (void)f;
  (void)isa;
  return NULL;
}

static int best_isa(void) {
#if MATH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return ISA_AVX2;
#endif
  return ISA_NONE;
}

static int isa_named(const char *s) {
  if (!s) return -1;
  if (strcmp(s, "avx512") == 0) return ISA_AVX512;
  if (strcmp(s, "avx2") == 0) return ISA_AVX2;
  return -1;
}

/* ---------------------------------------------------------- self-check */

typedef struct inputs {
  float *v;
  int64_t n, cap;
} inputs;

static void put(inputs *in, uint32_t bits) {
  if (in->n == in->cap) {
    int64_t cap = in->cap ? in->cap * 2 : 4096;
    float *v = realloc(in->v, (size_t)cap * sizeof *v);
    if (!v) return;
    in->v = v;
    in->cap = cap;
  }
  in->v[in->n++] = u2f(bits);
}

/* bits and its neighbours, both signs */
static void around(inputs *in, uint32_t bits, int w) {
  for (int d = -w; d <= w; d++) {
    uint32_t b = (bits & 0x7fffffffu) + (uint32_t)d;
    put(in, b);
    put(in, b | 0x80000000u);
  }
}

static void around_f(inputs *in, float v, int w) {
  around(in, f2u(v), w);
}

static uint32_t xs32(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *s = x;
  return x;
}

/* A value uniform in [lo, hi). */
static float uni(uint32_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)(xs32(s) >> 8) * 0x1p-24f;
}

/* Inputs for f's check: a stride over all 2^32 patterns (every exponent,
 * both signs), specials, each branch threshold of f's libm with its
 * neighbours, and dense random values where the work is. */
static void check_inputs(cpu_math_fn f, inputs *in) {
  for (uint64_t b = 0; b < ((uint64_t)1 << 32); b += 0x7ffbfu)
    put(in, (uint32_t)b);
  static const uint32_t specials[] = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
      0x7f800001, 0xff800001, 0x7fa12345, 0xffe54321, 0x7fffffff, 0xffffffff,
      0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00800000, 0x80800000,
      0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000, 0x3f000000, 0x40000000,
  };
  for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
    put(in, specials[i]);
  uint32_t s = 0x9e3779b9u + (uint32_t)f;
  if (f == CPU_MATH_TANH) {
    static const uint32_t th[] = {0x7f800000, 0x41b00000, 0x24000000,
                                  0x3f800000};
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) around(in, th[i], 3);
    /* expm1f's thresholds, at u = 2|x| and u = -2|x| */
    static const uint32_t em[] = {0x4195b844, 0x42b17218, 0x3eb17218,
                                  0x3f851592, 0x33000000};
    for (size_t i = 0; i < sizeof em / sizeof *em; i++)
      around_f(in, u2f(em[i]) * 0.5f, 3);
    /* where expm1f's k steps: u = (k - 1/2)·ln2 */
    for (int k = 1; k <= 64; k++)
      around_f(in, (float)((k - 0.5) * 0.6931471805599453 * 0.5), 3);
    /* inputs where an FMA-contracted expm1f polynomial (a libm built
     * with -mfma) differs: found by the exhaustive comparison */
    static const uint32_t hard[] = {0x3df46db4, 0x3dff3a9e, 0x3e12dd9a,
                                    0x3e332a19, 0x3dc2562e, 0x3deec581,
                                    0x3e0aa71e, 0x3e0f77f8};
    for (size_t i = 0; i < sizeof hard / sizeof *hard; i++)
      around(in, hard[i], 0);
    for (int i = 0; i < 4096; i++) put(in, f2u(uni(&s, -23.0f, 23.0f)));
    for (int i = 0; i < 4096; i++) put(in, f2u(uni(&s, -1.5f, 1.5f)));
    for (int i = 0; i < 1024; i++)
      put(in, f2u(ldexpf(uni(&s, 1.0f, 2.0f), -(int)(xs32(&s) % 60))));
  } else if (f == CPU_MATH_EXP) {
    static const uint32_t th[] = {0x42b00000, 0x42b17217, 0x42cff1b4,
                                  0x42ce8ecf, 0x7f800000};
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) around(in, th[i], 3);
    /* 0x1.62e42ep6f, -0x1.9fe368p6f, -0x1.9d1d9ep6f */
    around_f(in, 0x1.62e42ep6f, 3);
    around_f(in, 0x1.9fe368p6f, 3);
    around_f(in, 0x1.9d1d9ep6f, 3);
    /* the only inputs where r = x·32/ln2 − kd unfused differs */
    put(in, 0x4202422f);
    put(in, 0xc27c65d9);
    for (int i = 0; i < 8192; i++) put(in, f2u(uni(&s, -104.0f, 89.0f)));
    for (int i = 0; i < 2048; i++) put(in, f2u(uni(&s, -1.0f, 1.0f)));
    for (int i = 0; i < 1024; i++)
      put(in, f2u(ldexpf(uni(&s, 1.0f, 2.0f), -(int)(xs32(&s) % 40))));
  } else {
    static const uint32_t th[] = {0x3f800000, 0x00800000, 0x7f800000,
                                  0x7f7fffff, 0x00000001};
    for (size_t i = 0; i < sizeof th / sizeof *th; i++) around(in, th[i], 3);
    /* the table's subinterval edges, a few octaves */
    for (uint32_t j = 0; j < 16; j++)
      for (int e = -3; e <= 3; e++)
        around(in, (uint32_t)(LOG_OFF + (j << 19)) + ((uint32_t)e << 23), 2);
    for (int i = 0; i < 8192; i++) put(in, xs32(&s) & 0x7fffffffu);
    for (int i = 0; i < 4096; i++) put(in, f2u(uni(&s, 0.5f, 2.0f)));
    for (int i = 0; i < 1024; i++) put(in, f2u(uni(&s, 0.0f, 0x1p-126f)));
  }
}

/* Whether kernel k gives libm's bits on f's check inputs, whole and
 * through every short tail and misaligned start. */
static bool self_check(cpu_math_fn f, math_kernel k) {
  inputs in = {0};
  check_inputs(f, &in);
  if (in.n == 0) return false;
  bool ok = true;
  float *want = malloc((size_t)in.n * sizeof(float));
  float *got = malloc((size_t)(in.n + 64) * sizeof(float));
  if (!want || !got) ok = false;
  if (ok) {
    libm_loop(f, in.v, want, in.n);
    k(in.v, got, in.n);
    ok = memcmp(want, got, (size_t)in.n * sizeof(float)) == 0;
    /* lengths 0..40 at odd offsets, guard values after the end */
    for (int64_t len = 0; ok && len <= 40 && len + 3 <= in.n; len++) {
      for (int64_t j = 0; j < len + 8; j++) got[j] = u2f(0x7fbadbadu);
      k(in.v + 3, got, len);
      ok = memcmp(want + 3, got, (size_t)len * sizeof(float)) == 0;
      for (int64_t j = len; ok && j < len + 8; j++)
        ok = f2u(got[j]) == 0x7fbadbadu;
    }
    /* in place */
    if (ok) {
      memcpy(got, in.v, (size_t)in.n * sizeof(float));
      k(got, got, in.n);
      ok = memcmp(want, got, (size_t)in.n * sizeof(float)) == 0;
    }
  }
  free(want);
  free(got);
  free(in.v);
  return ok;
}

static math_kernel live[CPU_MATH_COUNT];
static int live_isa = ISA_NONE;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
  const char *env = getenv("TOPOS_CPU_MATH");
  if (env && strcmp(env, "libm") == 0) return;
  int isa = best_isa();
  if (env && strcmp(env, "avx2") == 0 && isa >= ISA_AVX2) isa = ISA_AVX2;
  if (isa == ISA_NONE) return;
  for (int f = 0; f < CPU_MATH_COUNT; f++) {
    math_kernel k = kernel_for((cpu_math_fn)f, isa);
    if (k && self_check((cpu_math_fn)f, k)) {
      live[f] = k;
      live_isa = isa;
    }
  }
}

bool cpu_math_live(cpu_math_fn f) {
  if ((unsigned)f >= CPU_MATH_COUNT) return false;
  pthread_once(&once, init);
  return live[f] != NULL;
}

const char *cpu_math_isa(void) {
  pthread_once(&once, init);
  return live_isa == ISA_AVX512 ? "avx512"
         : live_isa == ISA_AVX2 ? "avx2"
                                : "none";
}

void cpu_math_f32(cpu_math_fn f, const float *x, float *y, int64_t n) {
  if (n <= 0 || (unsigned)f >= CPU_MATH_COUNT) return;
  if (cpu_math_live(f))
    live[f](x, y, n);
  else
    libm_loop(f, x, y, n);
}

bool cpu_math_kernel(cpu_math_fn f, const char *isa, const float *x, float *y,
                     int64_t n) {
  int want = isa_named(isa);
  if (want < 0 || (unsigned)f >= CPU_MATH_COUNT) return false;
  if (want > best_isa()) return false;
  math_kernel k = kernel_for(f, want);
  if (!k) return false;
  if (n > 0) k(x, y, n);
  return true;
}
