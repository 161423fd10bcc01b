/*
 * cpu_attention_real.h - the attention rows of cpu_attention.c, written
 * once and included four times: R = float or double, each built for FMA
 * hardware (ATT_VEC: AVX vectors of AW lanes, the fused multiply-add in
 * its pinned form) and portably (libm's fma).  A(name) suffixes each
 * function.
 *
 * Parameters: R, A, AFMA (the scalar fma), AEXP (exp over an array),
 * ALOG, ASUM (the striped-16 sum), ATT_TARGET; with ATT_VEC also AW
 * (lanes), AV (the vector type), AP (the intrinsics' suffix: ps, pd) and
 * APS (the instructions': "ps", "pd").  It undefines them at the end,
 * ready for the next instance.
 *
 * Up to four query rows of one matrix go together so that each key and
 * value element loaded feeds four chains; every chain is still its own
 * (one output's fma sequence, in the reference's order, from +0.0).
 */

#ifdef ATT_VEC
#define ACAT2(a, b) a##b
#define ACAT(a, b) ACAT2(a, b)
#define AI(op) ACAT(ACAT(_mm256_, op), ACAT(_, AP)) /* _mm256_<op>_ps */
#define AZERO AI(setzero)()
#define ASET1 AI(set1)
#define ALOAD AI(loadu)
#define ASTORE AI(storeu)
#define ASUB AI(sub)
#define AMAX AI(max)
#define AOR AI(or)
#define AUNORD(v) AI(cmp)(v, v, _CMP_UNORD_Q)
#define AMASK AI(movemask)
/* Pinned forms: acc = a·b + acc with a first; o = a op b with a first. */
#define AFMAV(acc, a, b) \
  __asm__("vfmadd231" APS " %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b))
#define AMULV(o, a, b) \
  __asm__("vmul" APS " %2, %1, %0" : "=x"(o) : "x"(a), "xm"(b))
#define AADDV(o, a, b) \
  __asm__("vadd" APS " %2, %1, %0" : "=x"(o) : "x"(a), "xm"(b))
#endif

/*
 * c[r][n] = the fma chain over kk < K of a[r, kk]·b[kk, n], from +0.0,
 * for r < nr (<= 4), n < N: a's rows `ar` apart and its elements `ac`,
 * b's rows `br` apart and its columns `bc`, c's rows `cr` apart.  With
 * vectors, columns go AW·2 at a time with the 4 x 2 accumulators in
 * registers across the whole chain (rows past nr are computed from row 0
 * and not stored); the remaining columns, or strided ones, one at a time.
 */
ATT_TARGET static void A(gemm4)(const R *a, int64_t ar, int64_t ac, int nr,
                                const R *b, int64_t br, int64_t bc, int64_t K,
                                int64_t N, R *c, int64_t cr) {
  int64_t n0 = 0;
#ifdef ATT_VEC
  if (bc == 1) {
    /* Rows past nr repeat row 0 and are not stored.  Named accumulators:
     * an array of them would live on the stack. */
    const R *a0 = a, *a1 = a + (nr > 1 ? ar : 0),
            *a2 = a + (nr > 2 ? 2 * ar : 0), *a3 = a + (nr > 3 ? 3 * ar : 0);
    for (; n0 + 2 * AW <= N; n0 += 2 * AW) {
      AV c00 = AZERO, c01 = AZERO, c10 = AZERO, c11 = AZERO, c20 = AZERO,
         c21 = AZERO, c30 = AZERO, c31 = AZERO;
      for (int64_t kk = 0; kk < K; kk++) {
        const R *bk = b + kk * br + n0;
        AV b0 = ALOAD(bk), b1 = ALOAD(bk + AW), x;
        x = ASET1(a0[kk * ac]);
        AFMAV(c00, x, b0);
        AFMAV(c01, x, b1);
        x = ASET1(a1[kk * ac]);
        AFMAV(c10, x, b0);
        AFMAV(c11, x, b1);
        x = ASET1(a2[kk * ac]);
        AFMAV(c20, x, b0);
        AFMAV(c21, x, b1);
        x = ASET1(a3[kk * ac]);
        AFMAV(c30, x, b0);
        AFMAV(c31, x, b1);
      }
      R *c0 = c + n0;
      ASTORE(c0, c00);
      ASTORE(c0 + AW, c01);
      if (nr > 1) {
        ASTORE(c0 + cr, c10);
        ASTORE(c0 + cr + AW, c11);
      }
      if (nr > 2) {
        ASTORE(c0 + 2 * cr, c20);
        ASTORE(c0 + 2 * cr + AW, c21);
      }
      if (nr > 3) {
        ASTORE(c0 + 3 * cr, c30);
        ASTORE(c0 + 3 * cr + AW, c31);
      }
    }
  }
#endif
  for (int r = 0; r < nr; r++)
    for (int64_t n = n0; n < N; n++) {
      R acc = (R)0;
      for (int64_t kk = 0; kk < K; kk++)
        acc = AFMA(a[r * ar + kk * ac], b[kk * br + n * bc], acc);
      c[r * cr + n] = acc;
    }
}

/* row[j] = row[j] op x[j·xs] (op: 0 multiply, 1 add), row the first
 * source (which decides which NaN comes out when both are NaN, as in the
 * reference's compiled loop; the vector ops are pinned to it). */
ATT_TARGET static void A(combine)(R *row, const R *x, int64_t xs, int64_t S,
                                  int op) {
  int64_t j = 0;
#ifdef ATT_VEC
  if (xs == 0 || xs == 1) {
    AV one = ASET1(x[0]);
    for (; j + AW <= S; j += AW) {
      AV r = ALOAD(row + j), v = xs ? ALOAD(x + j) : one, o;
      if (op == 0)
        AMULV(o, r, v);
      else
        AADDV(o, r, v);
      ASTORE(row + j, o);
    }
  }
#endif
  if (op == 0) {
    for (; j < S; j++) row[j] = row[j] * x[j * xs];
  } else {
    for (; j < S; j++) row[j] = row[j] + x[j * xs];
  }
}

/* The reference's row maximum: the first NaN if there is one, else the
 * first of the largest values.  A vector maximum is the same value when
 * the row has no NaN and the maximum is not zero (only ±0 compare equal
 * with different bits); otherwise the scalar walk decides. */
ATT_TARGET static R A(row_max)(const R *row, int64_t S) {
#ifdef ATT_VEC
  if (S >= AW) {
    AV m = ALOAD(row), nan = AUNORD(m);
    int64_t j = AW;
    for (; j + AW <= S; j += AW) {
      AV v = ALOAD(row + j);
      nan = AOR(nan, AUNORD(v));
      m = AMAX(m, v);
    }
    R lane[AW];
    ASTORE(lane, m);
    R best = lane[0];
    bool any_nan = AMASK(nan) != 0;
    for (int l = 1; l < AW; l++) best = lane[l] > best ? lane[l] : best;
    for (; j < S; j++) {
      any_nan |= isnan(row[j]);
      best = row[j] > best ? row[j] : best;
    }
    if (!any_nan && best != 0) return best;
  }
#endif
  R m = row[0];
  for (int64_t l = 0; l < S && !isnan(m); l++) {
    R x = row[l];
    if (isnan(x) || x > m) m = x;
  }
  return m;
}

/* dst[j] = (src[j] - a) - b (b_too) or src[j] - a. */
ATT_TARGET static void A(shift)(R *dst, const R *src, int64_t S, R a, R b,
                                bool b_too) {
  int64_t j = 0;
#ifdef ATT_VEC
  AV av = ASET1(a), bv = ASET1(b);
  for (; j + AW <= S; j += AW) {
    AV d = ASUB(ALOAD(src + j), av);
    ASTORE(dst + j, b_too ? ASUB(d, bv) : d);
  }
#endif
  for (; j < S; j++) dst[j] = b_too ? (src[j] - a) - b : src[j] - a;
}

/* The reference's lse_rows with softmax = true on one row, in place:
 * shift = the maximum (first NaN; 0 when infinite), sum = striped-16 sum
 * of exp(row - shift), row = (row - shift) - log(sum).  tmp holds S. */
ATT_TARGET static void A(log_softmax)(R *row, R *tmp, int64_t S) {
  R m = A(row_max)(row, S);
  R shift = isinf(m) ? (R)0 : m;
  A(shift)(tmp, row, S, shift, 0, false);
  AEXP(tmp, S);
  R lse = ALOG(ASUM(tmp, S));
  A(shift)(row, row, S, shift, lse, true);
}

/* Query rows [i0, i0 + nr) of matrix b (nr <= 4): acc holds 4·S, tmp S. */
ATT_TARGET static void A(rows)(const topos_attention_task *t, int64_t b,
                               int64_t i0, int nr, R *acc, R *tmp) {
  int64_t S = t->s;
  A(gemm4)
  ((const R *)t->q + b * t->q_batch + i0 * t->q_row, t->q_row, t->q_col, nr,
   (const R *)t->k + b * t->k_batch, t->k_row, t->k_col, t->dh, S, acc, S);
  R *const outs[5] = {t->raw, t->scaled, t->masked, t->logp, t->probs};
  size_t bytes = sizeof(R) * (size_t)S;
  for (int r = 0; r < nr; r++) {
    R *row = acc + r * S;
    int64_t i = i0 + r, at = (b * t->t + i) * S;
    if (outs[0]) memcpy(outs[0] + at, row, bytes);
    if (t->scale) {
      A(combine)
      (row, (const R *)t->scale + b * t->scale_batch + i * t->scale_row,
       t->scale_col, S, 0);
      if (outs[1]) memcpy(outs[1] + at, row, bytes);
    }
    if (t->mask) {
      A(combine)
      (row, (const R *)t->mask + b * t->mask_batch + i * t->mask_row,
       t->mask_col, S, 1);
      if (outs[2]) memcpy(outs[2] + at, row, bytes);
    }
    A(log_softmax)(row, tmp, S);
    if (outs[3]) memcpy(outs[3] + at, row, bytes);
    AEXP(row, S);
    if (outs[4]) memcpy(outs[4] + at, row, bytes);
  }
  A(gemm4)
  (acc, S, 1, nr, (const R *)t->v + b * t->v_batch, t->v_row, t->v_col, S,
   t->dv, (R *)t->out + (b * t->t + i0) * t->dv, t->dv);
}

#undef R
#undef A
#undef AFMA
#undef AEXP
#undef ALOG
#undef ASUM
#undef ATT_TARGET
#ifdef ATT_VEC
#undef ACAT2
#undef ACAT
#undef AI
#undef AP
#undef APS
#undef AW
#undef AV
#undef AZERO
#undef ASET1
#undef ALOAD
#undef ASTORE
#undef AFMAV
#undef AMULV
#undef AADDV
#undef ASUB
#undef AMAX
#undef AOR
#undef AUNORD
#undef AMASK
#undef ATT_VEC
#endif
