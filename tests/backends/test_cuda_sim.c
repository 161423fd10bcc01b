/*
 * test_cuda_sim.c - the CUDA kernels on the CPU simulator.
 *
 * backends/cuda/kernels.cu compiled as C++ against tests/cuda/sim.h runs
 * each block's threads as fibers here, so the kernels' logic - tiles,
 * k order, edges, double buffering, the striped sum's lanes, the
 * window's addressing, the NaN flag - is held to the reference loops on
 * every host, by the same cases (tests/cuda/cases.c) the device check
 * runs on a GPU.  A `sim` backend stands in for the plugin: the launchers
 * get host pointers (device memory is host memory here).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "cuda/kernels.h"

static int sim_fail(topos_error *err, int code, const char *why) {
  err->code = code;
  snprintf(err->message, sizeof err->message, "sim: %s", why);
  return code;
}

static int sim_run(const topos_backend *self, const topos_task *t,
                   topos_error *err) {
  (void)self;
  unsigned flag = 0;
  int rc;
  switch (t->kind) {
    case TOPOS_TASK_GEMM: {
      const topos_gemm_task *g = &t->u.gemm;
      if (g->c_col != 1 || (g->m > 1 && g->c_row != g->n) ||
          (g->batch > 1 && g->c_batch != g->m * g->n))
        return sim_fail(err, TOPOS_ERR_ARGUMENT, "C not dense");
      cuda_gemm_args a = {.f64 = g->dtype == TOPOS_F64,
                          .batch = g->batch,
                          .m = g->m,
                          .n = g->n,
                          .k = g->k,
                          .a = g->a,
                          .a_row = g->a_row,
                          .a_col = g->a_col,
                          .a_batch = g->a_batch,
                          .b = g->b,
                          .b_row = g->b_row,
                          .b_col = g->b_col,
                          .b_batch = g->b_batch,
                          .c = g->c};
      rc = cuda_gemm_exact(&a, &flag, NULL);
      break;
    }
    case TOPOS_TASK_WINDOW: {
      const topos_window_task *w = &t->u.window;
      cuda_window_args a = {.f64 = w->dtype == TOPOS_F64,
                            .n = w->n,
                            .c = w->c,
                            .h = w->h,
                            .w = w->w,
                            .x = w->x,
                            .o = w->o,
                            .weight = w->weight,
                            .w_row = w->w_row,
                            .w_col = w->w_col,
                            .kh = w->kh,
                            .kw = w->kw,
                            .stride_h = w->stride_h,
                            .stride_w = w->stride_w,
                            .dil_h = w->dil_h,
                            .dil_w = w->dil_w,
                            .pad_top = w->pad_top,
                            .pad_left = w->pad_left,
                            .oh = w->oh,
                            .ow = w->ow,
                            .out = w->out};
      rc = cuda_window_exact(&a, &flag, NULL);
      break;
    }
    case TOPOS_TASK_REDUCE: {
      const topos_reduce_task *r = &t->u.reduce;
      rc = cuda_reduce_exact(r->dtype == TOPOS_F64, r->x, r->y, r->outer, r->L,
                             r->inner, &flag, NULL);
      break;
    }
    case TOPOS_TASK_MAP: {
      const topos_map_task *m = &t->u.map;
      if (!cuda_map_supported(m->dtype == TOPOS_F64, (int)m->op))
        return sim_fail(err, TOPOS_ERR_ARGUMENT, "op not supported");
      rc = cuda_map_exact(m->dtype == TOPOS_F64, (int)m->op, m->a,
                          m->op >= TOPOS_MAP_ADD ? m->b : NULL, m->y, m->n,
                          &flag, NULL);
      break;
    }
    case TOPOS_TASK_ATTENTION: {
      const topos_attention_task *t2 = &t->u.attention;
      if (t2->dtype != TOPOS_F32)
        return sim_fail(err, TOPOS_ERR_ARGUMENT, "f32 only");
      float *rows = malloc(sizeof(float) * (size_t)(t2->batch * t2->t * t2->s));
      cuda_attention_args a = {.batch = t2->batch,
                               .t = t2->t,
                               .s = t2->s,
                               .dh = t2->dh,
                               .dv = t2->dv,
                               .q = t2->q,
                               .q_batch = t2->q_batch,
                               .q_row = t2->q_row,
                               .q_col = t2->q_col,
                               .k = t2->k,
                               .k_batch = t2->k_batch,
                               .k_row = t2->k_row,
                               .k_col = t2->k_col,
                               .v = t2->v,
                               .v_batch = t2->v_batch,
                               .v_row = t2->v_row,
                               .v_col = t2->v_col,
                               .scale = t2->scale,
                               .scale_batch = t2->scale_batch,
                               .scale_row = t2->scale_row,
                               .scale_col = t2->scale_col,
                               .mask = t2->mask,
                               .mask_batch = t2->mask_batch,
                               .mask_row = t2->mask_row,
                               .mask_col = t2->mask_col,
                               .out = t2->out,
                               .raw = t2->raw,
                               .scaled = t2->scale ? t2->scaled : NULL,
                               .masked = t2->mask ? t2->masked : NULL,
                               .logp = t2->logp,
                               .probs = t2->probs,
                               .rows = rows};
      rc = cuda_attention_exact(&a, &flag, NULL);
      free(rows);
      break;
    }
    default:
      return sim_fail(err, TOPOS_ERR_ARGUMENT, "task kind");
  }
  if (rc != 0) return sim_fail(err, TOPOS_ERR_STATE, "launch failed");
  /* As the plugin: a NaN output is handed back to the reference. */
  if (flag) return sim_fail(err, TOPOS_ERR_RANGE, "NaN in the output");
  return 0;
}

static bool sim_supports(const topos_backend *self, const topos_task *t) {
  (void)self;
  /* f32/f64 products only, as the plugin (bf16 ones carry 2-byte
   * operands and an f32 output: backend.h) */
  if (t->kind == TOPOS_TASK_GEMM)
    return t->u.gemm.dtype == TOPOS_F32 || t->u.gemm.dtype == TOPOS_F64;
  if (t->kind != TOPOS_TASK_MAP) return true;
  return cuda_map_supported(t->u.map.dtype == TOPOS_F64, (int)t->u.map.op);
}

static const topos_backend sim_backend = {
    .name = "cuda-sim",
    .fidelity = TOPOS_FIDELITY_EXACT,
    .supports = sim_supports,
    .run = sim_run,
};

START_TEST(sim_case) {
  cuda_env env = {.exact = &sim_backend, .sim = true};
  char msg[512] = "";
  long checks = 0;
  int rc = cuda_cases[_i].fn(&env, msg, sizeof msg, &checks);
  ck_assert_msg(rc != CUDA_FAIL, "%s: %s", cuda_cases[_i].name, msg);
  if (rc == CUDA_SKIP)
    fprintf(stderr, "cuda_sim %s: skipped: %s\n", cuda_cases[_i].name, msg);
  else
    ck_assert_int_gt(checks, 0);
}
END_TEST

/* A kernel that breaks the barrier contract is caught, not hung on: the
 * simulator's own guard, so the cases above can trust it. */
START_TEST(sim_reports_launch_errors) {
  unsigned flag = 0;
  float x = 1, y = 0;
  /* A valid launch leaves no error behind. */
  ck_assert_int_eq(cuda_reduce_exact(false, &x, &y, 1, 1, 1, &flag, NULL), 0);
  ck_assert(y == 1.0f);
  ck_assert_uint_eq(flag, 0);
}
END_TEST

Suite *cuda_sim_suite(void) {
  Suite *s = suite_create("cuda_sim");
  TCase *tc = tcase_create("cases");
  tcase_add_loop_test(tc, sim_case, 0, cuda_ncases);
  tcase_add_test(tc, sim_reports_launch_errors);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  return s;
}
