/*
 * testflip.c - `flip-test`, a backend that lies, so conformance can be
 * seen to fail.
 *
 * It declares exact fidelity and takes every f32/f64 GEMM task, computes
 * the exact contract (the fma chain over k in order from +0.0, as
 * backend.h states it) and then flips the lowest bit of output element
 * (0, 0) of the first matrix.  A conformance run that chooses it must
 * report that row as not bit-identical and `topos conformance` must exit
 * 1; nothing registers it unless asked (toposd --test-backend flip-test,
 * or a test).  Never a default.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"

static bool flip_supports(const topos_backend *self, const topos_task *task) {
  (void)self;
  if (task->kind != TOPOS_TASK_GEMM) return false;
  const topos_gemm_task *g = &task->u.gemm;
  return (g->dtype == TOPOS_F32 || g->dtype == TOPOS_F64) && g->batch >= 1 &&
         g->m >= 1 && g->n >= 1;
}

static int flip_run(const topos_backend *self, const topos_task *task,
                    topos_error *err) {
  (void)self;
  (void)err;
  const topos_gemm_task *g = &task->u.gemm;
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        int64_t ai = b * g->a_batch + i * g->a_row;
        int64_t bj = b * g->b_batch + j * g->b_col;
        int64_t ci = b * g->c_batch + i * g->c_row + j * g->c_col;
        if (g->dtype == TOPOS_F64) {
          const double *A = g->a, *B = g->b;
          double acc = 0.0;
          for (int64_t k = 0; k < g->k; k++)
            acc = fma(A[ai + k * g->a_col], B[bj + k * g->b_row], acc);
          ((double *)g->c)[ci] = acc;
        } else {
          const float *A = g->a, *B = g->b;
          float acc = 0.0f;
          for (int64_t k = 0; k < g->k; k++)
            acc = fmaf(A[ai + k * g->a_col], B[bj + k * g->b_row], acc);
          ((float *)g->c)[ci] = acc;
        }
      }
  /* The lie: one low bit of one output. */
  if (g->dtype == TOPOS_F64) {
    uint64_t bits;
    memcpy(&bits, g->c, sizeof bits);
    bits ^= 1;
    memcpy(g->c, &bits, sizeof bits);
  } else {
    uint32_t bits;
    memcpy(&bits, g->c, sizeof bits);
    bits ^= 1;
    memcpy(g->c, &bits, sizeof bits);
  }
  return TOPOS_OK;
}

static void flip_device(const topos_backend *self, char *buf, size_t len) {
  (void)self;
  snprintf(buf, len, "host CPU, scalar loop (test only: flips one bit)");
}

static const topos_backend flip_backend = {
    .name = "flip-test",
    .fidelity = TOPOS_FIDELITY_EXACT,
    .supports = flip_supports,
    .run = flip_run,
    .tasks = 1u << TOPOS_TASK_GEMM,
    .dtypes = (1u << TOPOS_F32) | (1u << TOPOS_F64),
    .device = flip_device,
    .named_only = true, /* registered, it still never joins auto */
};

const topos_backend *topos_flip_test_backend(void) {
  return &flip_backend;
}
