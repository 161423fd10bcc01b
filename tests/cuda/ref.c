/*
 * ref.c - numerics.md's arithmetic as plain loops (ref.h).  Built with
 * -ffp-contract=off like the engine: fma appears only where written.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_LOOP(R)                                                         \
  do {                                                                       \
    const R *A = g->a, *B = g->b;                                            \
    R *C = g->c;                                                             \
    for (int64_t b = 0; b < g->batch; b++)                                   \
      for (int64_t i = 0; i < g->m; i++)                                     \
        for (int64_t j = 0; j < g->n; j++) {                                 \
          R acc = (R)0;                                                      \
          for (int64_t k = 0; k < g->k; k++)                                 \
            acc = FMA(A[b * g->a_batch + i * g->a_row + k * g->a_col],       \
                      B[b * g->b_batch + k * g->b_row + j * g->b_col], acc); \
          C[b * g->c_batch + i * g->c_row + j * g->c_col] = acc;             \
        }                                                                    \
  } while (0)

void ref_gemm(const topos_gemm_task *g) {
  if (g->dtype == TOPOS_F64) {
#define FMA fma
    GEMM_LOOP(double);
#undef FMA
  } else {
#define FMA fmaf
    GEMM_LOOP(float);
#undef FMA
  }
}

#define WINDOW_LOOP(R)                                                         \
  do {                                                                         \
    const R *X = w->x, *W = w->weight;                                         \
    R *O = w->out;                                                             \
    int64_t row = 0;                                                           \
    for (int64_t img = 0; img < w->n; img++)                                   \
      for (int64_t oi = 0; oi < w->oh; oi++)                                   \
        for (int64_t oj = 0; oj < w->ow; oj++, row++)                          \
          for (int64_t o = 0; o < w->o; o++) {                                 \
            R acc = (R)0;                                                      \
            int64_t kk = 0;                                                    \
            for (int64_t c = 0; c < w->c; c++)                                 \
              for (int64_t a = 0; a < w->kh; a++)                              \
                for (int64_t bb = 0; bb < w->kw; bb++, kk++) {                 \
                  int64_t ih = oi * w->stride_h + a * w->dil_h - w->pad_top;   \
                  int64_t iw = oj * w->stride_w + bb * w->dil_w - w->pad_left; \
                  R xv = ih < 0 || ih >= w->h || iw < 0 || iw >= w->w          \
                             ? (R)0                                            \
                             : X[((img * w->c + c) * w->h + ih) * w->w + iw];  \
                  acc = FMA(xv, W[kk * w->w_row + o * w->w_col], acc);         \
                }                                                              \
            O[row * w->o + o] = acc;                                           \
          }                                                                    \
  } while (0)

void ref_window(const topos_window_task *w) {
  if (w->dtype == TOPOS_F64) {
#define FMA fma
    WINDOW_LOOP(double);
#undef FMA
  } else {
#define FMA fmaf
    WINDOW_LOOP(float);
#undef FMA
  }
}

#define REDUCE_BODY(R)                                          \
  do {                                                          \
    const R *X = r->x;                                          \
    R *Y = r->y;                                                \
    for (int64_t o = 0; o < r->outer; o++)                      \
      for (int64_t in = 0; in < r->inner; in++) {               \
        const R *x = X + o * r->L * r->inner + in;              \
        int64_t n = r->L, s = r->inner;                         \
        R out;                                                  \
        if (n == 0) {                                           \
          out = (R)0;                                           \
        } else if (n <= 16) {                                   \
          out = x[0];                                           \
          for (int64_t i = 1; i < n; i++) out = out + x[i * s]; \
        } else {                                                \
          R lane[16];                                           \
          for (int l = 0; l < 16; l++) lane[l] = x[l * s];      \
          for (int64_t i = 16; i < n; i++)                      \
            lane[i % 16] = lane[i % 16] + x[i * s];             \
          for (int width = 16; width > 1; width /= 2)           \
            for (int l = 0; l < width / 2; l++)                 \
              lane[l] = lane[2 * l] + lane[2 * l + 1];          \
          out = lane[0];                                        \
        }                                                       \
        Y[o * r->inner + in] = out;                             \
      }                                                         \
  } while (0)

void ref_reduce(const topos_reduce_task *r) {
  if (r->dtype == TOPOS_F64)
    REDUCE_BODY(double);
  else
    REDUCE_BODY(float);
}

#define MAP_BODY(R, EXP, LOG, SQRT, TANH, POW)              \
  do {                                                      \
    const R *a = m->a, *b = m->b;                           \
    R *y = m->y;                                            \
    for (int64_t i = 0; i < m->n; i++) {                    \
      R u = a[i], v = b ? b[i] : (R)0, r = u;               \
      switch (m->op) {                                      \
        case TOPOS_MAP_NEG:                                 \
          r = -u;                                           \
          break;                                            \
        case TOPOS_MAP_EXP:                                 \
          r = EXP(u);                                       \
          break;                                            \
        case TOPOS_MAP_LOG:                                 \
          r = LOG(u);                                       \
          break;                                            \
        case TOPOS_MAP_SQRT:                                \
          r = SQRT(u);                                      \
          break;                                            \
        case TOPOS_MAP_TANH:                                \
          r = TANH(u);                                      \
          break;                                            \
        case TOPOS_MAP_POW:                                 \
          r = POW(u, (R)m->p);                              \
          break;                                            \
        case TOPOS_MAP_RELU:                                \
          r = isnan(u) ? u : (u > 0 ? u : (R)0);            \
          break;                                            \
        case TOPOS_MAP_ADD:                                 \
          r = u + v;                                        \
          break;                                            \
        case TOPOS_MAP_SUB:                                 \
          r = u - v;                                        \
          break;                                            \
        case TOPOS_MAP_MUL:                                 \
          r = u * v;                                        \
          break;                                            \
        case TOPOS_MAP_DIV:                                 \
          r = u / v;                                        \
          break;                                            \
        case TOPOS_MAP_MAXIMUM:                             \
          r = isnan(u) ? u : isnan(v) ? v : u >= v ? u : v; \
          break;                                            \
        case TOPOS_MAP_STEP:                                \
          r = u >= v ? (R)1 : (R)0;                         \
          break;                                            \
        default:                                            \
          break;                                            \
      }                                                     \
      y[i] = r;                                             \
    }                                                       \
  } while (0)

void ref_map(const topos_map_task *m) {
  if (m->dtype == TOPOS_F64)
    MAP_BODY(double, exp, log, sqrt, tanh, pow);
  else
    MAP_BODY(float, expf, logf, sqrtf, tanhf, powf);
}

/* The striped-16 sum of x[0..n) (numerics.md). */
#define STRIPED(R, NAME)                                                       \
  static R NAME(const R *x, int64_t n) {                                       \
    if (n == 0) return (R)0;                                                   \
    if (n <= 16) {                                                             \
      R acc = x[0];                                                            \
      for (int64_t i = 1; i < n; i++) acc = acc + x[i];                        \
      return acc;                                                              \
    }                                                                          \
    R lane[16];                                                                \
    for (int l = 0; l < 16; l++) lane[l] = x[l];                               \
    for (int64_t i = 16; i < n; i++) lane[i % 16] = lane[i % 16] + x[i];       \
    for (int w = 16; w > 1; w /= 2)                                            \
      for (int l = 0; l < w / 2; l++) lane[l] = lane[2 * l] + lane[2 * l + 1]; \
    return lane[0];                                                            \
  }
STRIPED(float, striped_f32)
STRIPED(double, striped_f64)

#define ATTENTION_BODY(R, FMA, EXP, LOG, SUM)                                \
  do {                                                                       \
    int64_t S = a->s;                                                        \
    R *row = malloc(sizeof(R) * (size_t)S),                                  \
      *tmp = malloc(sizeof(R) * (size_t)S);                                  \
    for (int64_t b = 0; b < a->batch; b++)                                   \
      for (int64_t i = 0; i < a->t; i++) {                                   \
        const R *q = (const R *)a->q + b * a->q_batch + i * a->q_row;        \
        const R *k = (const R *)a->k + b * a->k_batch;                       \
        int64_t at = (b * a->t + i) * S;                                     \
        for (int64_t j = 0; j < S; j++) {                                    \
          R acc = (R)0;                                                      \
          for (int64_t c = 0; c < a->dh; c++)                                \
            acc = FMA(q[c * a->q_col], k[c * a->k_row + j * a->k_col], acc); \
          row[j] = acc;                                                      \
          if (a->raw) ((R *)a->raw)[at + j] = acc;                           \
        }                                                                    \
        if (a->scale) {                                                      \
          const R *sc =                                                      \
              (const R *)a->scale + b * a->scale_batch + i * a->scale_row;   \
          for (int64_t j = 0; j < S; j++)                                    \
            row[j] = row[j] * sc[j * a->scale_col];                          \
          if (a->scaled)                                                     \
            memcpy((R *)a->scaled + at, row, sizeof(R) * (size_t)S);         \
        }                                                                    \
        if (a->mask) {                                                       \
          const R *mk =                                                      \
              (const R *)a->mask + b * a->mask_batch + i * a->mask_row;      \
          for (int64_t j = 0; j < S; j++)                                    \
            row[j] = row[j] + mk[j * a->mask_col];                           \
          if (a->masked)                                                     \
            memcpy((R *)a->masked + at, row, sizeof(R) * (size_t)S);         \
        }                                                                    \
        R m = row[0];                                                        \
        for (int64_t l = 0; l < S && !isnan(m); l++)                         \
          if (isnan(row[l]) || row[l] > m) m = row[l];                       \
        R shift = isinf(m) ? (R)0 : m;                                       \
        for (int64_t j = 0; j < S; j++) tmp[j] = EXP(row[j] - shift);        \
        R lse = LOG(SUM(tmp, S));                                            \
        for (int64_t j = 0; j < S; j++) {                                    \
          row[j] = (row[j] - shift) - lse;                                   \
          if (a->logp) ((R *)a->logp)[at + j] = row[j];                      \
          row[j] = EXP(row[j]);                                              \
          if (a->probs) ((R *)a->probs)[at + j] = row[j];                    \
        }                                                                    \
        const R *v = (const R *)a->v + b * a->v_batch;                       \
        R *out = (R *)a->out + (b * a->t + i) * a->dv;                       \
        for (int64_t c = 0; c < a->dv; c++) {                                \
          R acc = (R)0;                                                      \
          for (int64_t j = 0; j < S; j++)                                    \
            acc = FMA(row[j], v[j * a->v_row + c * a->v_col], acc);          \
          out[c] = acc;                                                      \
        }                                                                    \
      }                                                                      \
    free(row);                                                               \
    free(tmp);                                                               \
  } while (0)

void ref_attention(const topos_attention_task *a) {
  if (a->dtype == TOPOS_F64)
    ATTENTION_BODY(double, fma, exp, log, striped_f64);
  else
    ATTENTION_BODY(float, fmaf, expf, logf, striped_f32);
}
