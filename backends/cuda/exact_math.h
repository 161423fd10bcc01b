/*
 * exact_math.h - scalar expf / logf / tanhf with exactly the bits of glibc
 * 2.36 x86_64's libm, for host code and for CUDA kernels.
 *
 * numerics.md defines f32 exp, log and tanh as the C library's expf, logf
 * and tanhf.  A GPU's own expf/logf/tanhf differ from glibc's in the last
 * bit on many inputs, so a device kernel that must agree with the cpu
 * backend bit for bit calls these instead.  Each is the same sequence of
 * IEEE operations as the glibc code (cpu_math.c's AVX-512/AVX2 kernels do
 * the same lane by lane and were checked against libm on all 2^32 inputs;
 * their constants, tables and branch structure are the spec here):
 *
 *  - tp_tanhf: s_tanhf.c + s_expm1f.c (fdlibm), plain float + - * /, no
 *    fused operation anywhere;
 *  - tp_expf: e_expf.c as the ifunc's __expf_fma: double arithmetic, the
 *    32-entry 2^(i/32) table, the five multiply-adds GCC fused there written
 *    as fma() (every other operation unfused);
 *  - tp_logf: e_logf.c as __logf_fma: 16-entry table, five fma()s likewise.
 *
 * Every input gives libm's bits; a NaN result is some NaN (payloads may
 * differ).  errno and the floating-point flags are not reproduced.
 *
 * Compile with the operations as written: C with -ffp-contract=off, CUDA
 * with -fmad=false (nvcc would otherwise fuse expm1f's products and adds,
 * which changes tanhf on a few inputs).  Division must be IEEE (nvcc's
 * default -prec-div=true; never --use_fast_math), denormals kept (-ftz=
 * false, the default).  tests/backends/test_cuda_math.c checks the host
 * build against libm.
 */
#ifndef TOPOS_CUDA_EXACT_MATH_H
#define TOPOS_CUDA_EXACT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TP_HD __host__ __device__ __forceinline__
#else
#define TP_HD static inline
#endif

TP_HD float tp_expf(float x);
TP_HD float tp_logf(float x);
TP_HD float tp_tanhf(float x);

/* ------------------------------------------------------------- tables */

/* e_exp2f_data.c: tab[i] = bits(2^(i/32)) - (i << 47) */
#define TP_EXP_TAB                                                   \
  0x3ff0000000000000u, 0x3fefd9b0d3158574u, 0x3fefb5586cf9890fu,     \
      0x3fef9301d0125b51u, 0x3fef72b83c7d517bu, 0x3fef54873168b9aau, \
      0x3fef387a6e756238u, 0x3fef1e9df51fdee1u, 0x3fef06fe0a31b715u, \
      0x3feef1a7373aa9cbu, 0x3feedea64c123422u, 0x3feece086061892du, \
      0x3feebfdad5362a27u, 0x3feeb42b569d4f82u, 0x3feeab07dd485429u, \
      0x3feea47eb03a5585u, 0x3feea09e667f3bcdu, 0x3fee9f75e8ec5f74u, \
      0x3feea11473eb0187u, 0x3feea589994cce13u, 0x3feeace5422aa0dbu, \
      0x3feeb737b0cdc5e5u, 0x3feec49182a3f090u, 0x3feed503b23e255du, \
      0x3feee89f995ad3adu, 0x3feeff76f2fb5e47u, 0x3fef199bdd85529cu, \
      0x3fef3720dcef9069u, 0x3fef5818dcfba487u, 0x3fef7c97337b9b5fu, \
      0x3fefa4afa2a490dau, 0x3fefd0765b6e4540u

/* e_logf_data.c: per subinterval 1/c and log(c) */
#define TP_LOG_INVC                                                            \
  0x1.661ec79f8f3bep+0, 0x1.571ed4aaf883dp+0, 0x1.49539f0f010bp+0,             \
      0x1.3c995b0b80385p+0, 0x1.30d190c8864a5p+0, 0x1.25e227b0b8eap+0,         \
      0x1.1bb4a4a1a343fp+0, 0x1.12358f08ae5bap+0, 0x1.0953f419900a7p+0,        \
      0x1p+0, 0x1.e608cfd9a47acp-1, 0x1.ca4b31f026aap-1, 0x1.b2036576afce6p-1, \
      0x1.9c2d163a1aa2dp-1, 0x1.886e6037841edp-1, 0x1.767dcf5534862p-1
#define TP_LOG_LOGC                                                        \
  -0x1.57bf7808caadep-2, -0x1.2bef0a7c06ddbp-2, -0x1.01eae7f513a67p-2,     \
      -0x1.b31d8a68224e9p-3, -0x1.6574f0ac07758p-3, -0x1.1aa2bc79c81p-3,   \
      -0x1.a4e76ce8c0e5ep-4, -0x1.1973c5a611cccp-4, -0x1.252f438e10c1ep-5, \
      0x0p+0, 0x1.aa5aa5df25984p-5, 0x1.c5e53aa362eb4p-4,                  \
      0x1.526e57720db08p-3, 0x1.bc2860d22477p-3, 0x1.1058bc8a07ee1p-2,     \
      0x1.4043057b6ee09p-2

/* One copy for the host, one in device memory for kernels (device code
 * cannot read a host static const array); each function picks its own
 * with __CUDA_ARCH__. */
static const uint64_t tp_exp_tab_host[32] = {TP_EXP_TAB};
static const double tp_log_invc_host[16] = {TP_LOG_INVC};
static const double tp_log_logc_host[16] = {TP_LOG_LOGC};
#ifdef __CUDACC__
static __device__ const uint64_t tp_exp_tab_dev[32] = {TP_EXP_TAB};
static __device__ const double tp_log_invc_dev[16] = {TP_LOG_INVC};
static __device__ const double tp_log_logc_dev[16] = {TP_LOG_LOGC};
#endif

/* ------------------------------------------------------------ helpers */

TP_HD uint32_t tp_asuint(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

TP_HD float tp_asfloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

TP_HD uint64_t tp_asuint64(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

TP_HD double tp_asdouble(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* ---------------------------------------------------------------- expf */

/*
 * e_expf.c (__expf_fma): x·32/ln2 = k + r, exp(x) = 2^(k/32)·2^(r/32),
 * 2^(k/32) from the table with k/32's integer part added to the
 * exponent bits, 2^(r/32) by a cubic; all in double, rounded once.
 */
TP_HD float tp_expf(float x) {
#ifdef __CUDA_ARCH__
  const uint64_t *tab = tp_exp_tab_dev;
#else
  const uint64_t *tab = tp_exp_tab_host;
#endif
  const double invln2n = 0x1.71547652b82fep+0 * 32;
  const double shift = 0x1.8p+52;
  const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  const double c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  const double c2 = 0x1.62e42ff0c52d6p-1 / 32;
  uint32_t ix = tp_asuint(x);
  /* |x| >= 88 or NaN: e_expf.c's special cases */
  if ((ix & 0x7fffffffu) >= 0x42b00000u) {
    /* -inf: +0 */
    if (ix == 0xff800000u) return 0.0f;
    /* +inf, NaN: x + x */
    if ((ix & 0x7fffffffu) >= 0x7f800000u) return x + x;
    /* x > 0x1.62e42ep6 (about log(2^128)): __math_oflowf, +inf */
    if (x > 0x1.62e42ep6f) return tp_asfloat(0x7f800000u);
    /* x < about log(2^-150): __math_uflowf (2^-95 · 2^-95), +0 */
    if (x < -0x1.9fe368p6f) return 0.0f;
    /* x < log(2^-149): __math_may_uflowf's 0x1.4p-75 squared, 2^-149
     * (what the main path gives there too) */
    if (x < -0x1.9d1d9ep6f) return tp_asfloat(0x00000001u);
    /* otherwise the main path */
  }
  double xd = (double)x;
  /* kd = round(z), z = x·32/ln2, by the shift; GCC fused z + shift */
  double kd = fma(invln2n, xd, shift);
  uint64_t ki = tp_asuint64(kd);
  kd -= shift;
  /* r = z - kd, fused */
  double r = fma(invln2n, xd, -kd);
  uint64_t t = tab[ki % 32];
  t += ki << 47;
  double s = tp_asdouble(t);
  /* s · (c0·r³ + c1·r² + c2·r + 1), three more fmas */
  double z = fma(c0, r, c1);
  double r2 = r * r;
  double y = fma(c2, r, 1.0);
  y = fma(z, r2, y);
  y = y * s;
  return (float)y;
}

/* ---------------------------------------------------------------- logf */

/*
 * e_logf.c (__logf_fma): x = 2^k·z with z in [0x3f330000, 2·that) as
 * bits, the table's c near z's subinterval centre, log(x) = k·ln2 +
 * log(c) + log1p(z/c - 1) by a cubic in r = z/c - 1; double, rounded once.
 */
TP_HD float tp_logf(float x) {
#ifdef __CUDA_ARCH__
  const double *tinvc = tp_log_invc_dev;
  const double *tlogc = tp_log_logc_dev;
#else
  const double *tinvc = tp_log_invc_host;
  const double *tlogc = tp_log_logc_host;
#endif
  const double ln2 = 0x1.62e42fefa39efp-1;
  const double a0 = -0x1.00ea348b88334p-2;
  const double a1 = 0x1.5575b0be00b6ap-2;
  const double a2 = -0x1.ffffef20a4123p-2;
  const uint32_t off = 0x3f330000u;
  uint32_t ix = tp_asuint(x);
  /* log(1) = +0 exactly (WANT_ROUNDING) */
  if (ix == 0x3f800000u) return 0.0f;
  /* x < 0x1p-126 (zero, subnormal, negative), Inf or NaN */
  if (ix - 0x00800000u >= 0x7f800000u - 0x00800000u) {
    /* +-0: __math_divzerof(1), -1/0 = -inf */
    if (ix * 2 == 0) return tp_asfloat(0xff800000u);
    /* +inf: inf */
    if (ix == 0x7f800000u) return x;
    /* negative, -inf, NaN: __math_invalidf, (x - x) / (x - x) */
    if ((ix & 0x80000000u) || ix * 2 >= 0xff000000u) return (x - x) / (x - x);
    /* subnormal: normalise, k - 23 */
    ix = tp_asuint(x * 0x1p23f);
    ix -= 23u << 23;
  }
  uint32_t tmp = ix - off;
  int i = (int)((tmp >> 19) % 16);
  int k = (int32_t)tmp >> 23; /* arithmetic shift */
  uint32_t iz = ix - (tmp & 0xff800000u);
  double invc = tinvc[i];
  double logc = tlogc[i];
  double z = (double)tp_asfloat(iz);
  /* r = z·invc - 1 and y0 = logc + k·ln2, fused */
  double r = fma(z, invc, -1.0);
  double y0 = fma((double)k, ln2, logc);
  /* a0·r⁴ + a1·r³ + a2·r² + (y0 + r): three more fmas */
  double r2 = r * r;
  double y = fma(a1, r, a2);
  y = fma(a0, r2, y);
  y = fma(y, r2, y0 + r);
  return (float)y;
}

/* --------------------------------------------------------------- tanhf */

/*
 * expm1f (s_expm1f.c) for the arguments tanhf gives it: u = -2|x| with
 * 2^-55 <= |x| < 1, or u = 2|x| with 1 <= |x| < 22; so u is finite,
 * |u| < 44, and u > -2 (no huge or -1 branch).  Plain float operations.
 */
TP_HD float tp_expm1f_tanh(float x) {
  const float ln2_hi = 0x1.62e300p-1f;  /* 0x3f317180 */
  const float ln2_lo = 0x1.2fefa2p-17f; /* 0x3717f7d1 */
  const float invln2 = 0x1.715476p+0f;  /* 0x3fb8aa3b */
  const float q1 = -0x1.111112p-5f;     /* 0xbd088889 */
  const float q2 = 0x1.a01a02p-10f;     /* 0x3ad00d01 */
  const float q3 = -0x1.4ce19ap-14f;    /* 0xb8a670cd */
  const float q4 = 0x1.0cfca8p-18f;     /* 0x36867e54 */
  const float q5 = -0x1.afdb76p-23f;    /* 0xb457edbb */
  uint32_t bx = tp_asuint(x);
  uint32_t hx = bx & 0x7fffffffu;
  int neg = (bx >> 31) != 0;
  float hi, lo, c = 0.0f;
  int32_t k;
  if (hx > 0x3eb17218u) {
    /* |x| > ln2/2: x = k·ln2 + (hi - lo), reduced x = hi - lo, c its
     * rounding error */
    if (hx < 0x3f851592u) {
      /* |x| < 1.5·ln2: k = +-1 */
      if (!neg) {
        hi = x - ln2_hi;
        lo = ln2_lo;
        k = 1;
      } else {
        hi = x + ln2_hi;
        lo = -ln2_lo;
        k = -1;
      }
    } else {
      /* k = (int)(x/ln2 +- 1/2); t·ln2_hi is exact */
      k = (int32_t)(invln2 * x + (neg ? -0.5f : 0.5f));
      float t = (float)k;
      hi = x - t * ln2_hi;
      lo = t * ln2_lo;
    }
    x = hi - lo;
    c = (hi - x) - lo;
  } else if (hx < 0x33000000u) {
    /* |x| < 2^-25: x (huge + x - huge is 0) */
    return x;
  } else {
    /* |x| <= ln2/2: no reduction */
    k = 0;
  }

  /* the rational approximation on the reduced x */
  float hfx = 0.5f * x;
  float hxs = x * hfx;
  float r1 =
      1.0f + hxs * (q1 + hxs * (q2 + hxs * (q3 + hxs * (q4 + hxs * q5))));
  float t = 3.0f - r1 * hfx;
  float e = hxs * ((r1 - t) / (6.0f - x * t));
  /* k == 0: c is 0 */
  if (k == 0) return x - (x * e - hxs);
  e = (x * (e - c) - c);
  e -= hxs;
  /* k == -1 */
  if (k == -1) return 0.5f * (x - e) - 0.5f;
  /* k == 1 */
  if (k == 1) {
    if (x < -0.25f) return -2.0f * (e - (x + 0.5f));
    return 1.0f + 2.0f * (x - e);
  }
  /* k <= -2 or k > 56: 1 - (e - x) with k added to its exponent, - 1 */
  if (k <= -2 || k > 56) {
    float y = 1.0f - (e - x);
    y = tp_asfloat(tp_asuint(y) + ((uint32_t)k << 23));
    return y - 1.0f;
  }
  float y;
  if (k < 23) {
    /* 2 <= k < 23: (1 - 2^-k) - (e - x), k added to the exponent */
    float tk = tp_asfloat(0x3f800000u - (0x1000000u >> k));
    y = tk - (e - x);
  } else {
    /* 23 <= k <= 56: x - (e + 2^-k) + 1, k added to the exponent */
    float tk = tp_asfloat((uint32_t)(0x7f - k) << 23);
    y = x - (e + tk);
    y += 1.0f;
  }
  return tp_asfloat(tp_asuint(y) + ((uint32_t)k << 23));
}

/* tanhf (s_tanhf.c): by |x|'s bits ix. */
TP_HD float tp_tanhf(float x) {
  uint32_t jx = tp_asuint(x);
  uint32_t ix = jx & 0x7fffffffu;
  int neg = (jx >> 31) != 0;
  float z;
  /* Inf, NaN: 1/x +- 1 (+-1, or NaN) */
  if (ix >= 0x7f800000u) return neg ? 1.0f / x - 1.0f : 1.0f / x + 1.0f;
  if (ix < 0x41b00000u) {
    /* +-0: x */
    if (ix == 0) return x;
    /* |x| < 2^-55: x·(1 + x) */
    if (ix < 0x24000000u) return x * (1.0f + x);
    float a = tp_asfloat(ix);
    int ge1 = ix >= 0x3f800000u;
    /* one expm1f call site (one inlined copy in a kernel) */
    float t = tp_expm1f_tanh(ge1 ? 2.0f * a : -2.0f * a);
    if (ge1) {
      /* 1 <= |x| < 22: 1 - 2/(expm1(2|x|) + 2) */
      z = 1.0f - 2.0f / (t + 2.0f);
    } else {
      /* |x| < 1: -expm1(-2|x|) / (expm1(-2|x|) + 2) */
      z = -t / (t + 2.0f);
    }
  } else {
    /* |x| >= 22: 1 - tiny */
    z = 1.0f - 1.0e-30f;
  }
  return neg ? -z : z;
}

#endif /* TOPOS_CUDA_EXACT_MATH_H */
