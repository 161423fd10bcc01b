/*
 * test_cuda.c - the CUDA plugin from the main runner.
 *
 * On every host: the loader's reports (a missing plugin, a file that is
 * not one, TOPOS_CUDA=off, no device) are clear and leave the registry as
 * it was; and the reference loops the device cases compare against
 * (tests/cuda/ref.c) are the reference: bit for bit the exact `cpu`
 * backend's results, which its own suite holds to the engine's kernels.
 *
 * With a device: every case of tests/cuda/cases.c on the `cuda` and
 * `cublas` backends.  Without one each says "no device" and passes: the
 * device check (tests/cuda/device-check.sh) is where they must run.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends.h"
#include "cases.h"
#include "ref.h"

/* The plugin as the defaults found it: NULL exact backend = no device. */
static cuda_env env_get(void) {
  topos_backends_register_defaults();
  cuda_env env = {.exact = topos_backend_find("cuda"),
                  .fast = topos_backend_find("cublas"),
                  .devices = topos_devices_list,
                  .announce = topos_blob_announce,
                  .retract = topos_blob_retract};
  return env;
}

/* ------------------------------------------------------------- loader */

START_TEST(loader_reports) {
  cuda_env env = env_get();
  char rep[512];
  topos_backends_plugin_report(rep, sizeof rep);
  ck_assert_msg(strncmp(rep, "cuda: ", 6) == 0, "report: %s", rep);
  topos_device_info dev[TOPOS_DEVICES_MAX];
  int n = topos_devices_list(dev, TOPOS_DEVICES_MAX);
  if (!env.exact) {
    /* No device (or no plugin): nothing registered, nothing listed, and
     * the report says why. */
    ck_assert_int_eq(n, 0);
    ck_assert_msg(strstr(rep, "not loaded") || strstr(rep, "not built") ||
                      strstr(rep, "off"),
                  "report: %s", rep);
    ck_assert_ptr_null(topos_backend_find("cublas"));
    ck_assert_int_eq(topos_devices_bind_thread(3), -1);
    ck_assert_int_eq(topos_blob_announce(rep, 8, (const uint8_t *)rep), 0);
    topos_blob_retract(rep);
    fprintf(stderr, "cuda: %s\n", rep);
  } else {
    ck_assert_int_ge(n, 1);
    ck_assert_msg(strstr(rep, "device"), "report: %s", rep);
    ck_assert_int_ge(topos_devices_bind_thread(0), 0);
  }
  /* The reference, cpu and blas are there either way. */
  ck_assert_ptr_nonnull(topos_backend_find("cpu"));
}
END_TEST

START_TEST(plugin_load_errors) {
  const topos_plugin *p = (const topos_plugin *)1;
  char why[256];
  ck_assert_int_eq(topos_plugin_load("/nonexistent/libtopos_cuda.so", NULL, &p,
                                     why, sizeof why),
                   -1);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(why, "nonexistent"), "why: %s", why);
  /* A shared object that is not a plugin. */
  const char *libm = "libm.so.6";
  ck_assert_int_eq(topos_plugin_load(libm, NULL, &p, why, sizeof why), -1);
  ck_assert_msg(strstr(why, "not a topos plugin"), "why: %s", why);
  /* A file that is not a shared object at all. */
  char path[] = "/tmp/topos-notso-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq((int)write(fd, "garbage\n", 8), 8);
  close(fd);
  ck_assert_int_eq(topos_plugin_load(path, NULL, &p, why, sizeof why), -1);
  ck_assert_msg(why[0] != 0, "no reason given");
  unlink(path);
}
END_TEST

/* The real plugin loaded by path: with no device it refuses with a reason
 * naming the driver or the device; with one it loads. */
START_TEST(plugin_direct) {
  const char *build = getenv("TOPOS_BUILD");
  char path[512];
  snprintf(path, sizeof path, "%s/lib/libtopos_cuda.so",
           build ? build : "build");
  if (access(path, F_OK) != 0) {
    fprintf(stderr, "cuda: %s not built (CUDA=0 or no nvcc): skipped\n", path);
    return;
  }
  const topos_plugin *p = NULL;
  char why[256] = "";
  int rc = topos_plugin_load(path, NULL, &p, why, sizeof why);
  if (rc != 0) {
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(why, "CUDA driver") || strstr(why, "CUDA device"),
                  "why: %s", why);
  } else {
    ck_assert_int_eq(p->abi, TOPOS_PLUGIN_ABI);
    ck_assert_int_ge(p->nbackends, 1);
    ck_assert_str_eq(p->backends[0]->name, "cuda");
  }
}
END_TEST

/* ------------------------------------------- ref.c is the reference */

static uint64_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}

static void *values(topos_dtype dt, int64_t n, uint64_t seed, bool specials) {
  const double sp[] = {INFINITY, -INFINITY, -0.0, 0.0, 1e38, 1e-40, -1e-310};
  size_t es = dt == TOPOS_F64 ? 8 : 4;
  void *p = malloc((size_t)n * es);
  for (int64_t i = 0; i < n; i++) {
    double v = (double)next(&seed) / 9007199254740992.0 * 4 - 2;
    if (specials && next(&seed) % 17 == 0) v = sp[next(&seed) % 7];
    if (dt == TOPOS_F64)
      ((double *)p)[i] = v;
    else
      ((float *)p)[i] = (float)v;
  }
  return p;
}

/* Same bits, NaN matching NaN (no device path returns a NaN: the plugin
 * hands those tasks back). */
static void same(topos_dtype dt, const void *a, const void *b, int64_t n,
                 const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double x = dt == TOPOS_F64 ? ((const double *)a)[i] : ((const float *)a)[i];
    double y = dt == TOPOS_F64 ? ((const double *)b)[i] : ((const float *)b)[i];
    if (isnan(x) && isnan(y)) continue;
    size_t es = dt == TOPOS_F64 ? 8 : 4;
    ck_assert_msg(
        memcmp((const char *)a + i * es, (const char *)b + i * es, es) == 0,
        "%s: element %lld: %a vs %a", what, (long long)i, x, y);
  }
}

START_TEST(ref_matches_cpu_backend) {
  const topos_backend *cpu = topos_cpu_backend();
  topos_error err;
  for (int d = 0; d < 2; d++)
    for (int sp = 0; sp < 2; sp++) {
      topos_dtype dt = d ? TOPOS_F64 : TOPOS_F32;
      size_t es = d ? 8 : 4;
      /* GEMM, A transposed, 2 batches */
      int64_t m = 70, n = 65, k = 129, batch = 2;
      void *A = values(dt, batch * m * k, 1, sp), *B = values(dt, k * n, 2, sp);
      void *c1 = malloc((size_t)(batch * m * n) * es);
      void *c2 = malloc((size_t)(batch * m * n) * es);
      topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = 1};
      t.u.gemm = (topos_gemm_task){.dtype = dt,
                                   .batch = batch,
                                   .m = m,
                                   .n = n,
                                   .k = k,
                                   .a = A,
                                   .a_row = 1,
                                   .a_col = m,
                                   .a_batch = m * k,
                                   .b = B,
                                   .b_row = n,
                                   .b_col = 1,
                                   .b_batch = 0,
                                   .c = c1,
                                   .c_row = n,
                                   .c_col = 1,
                                   .c_batch = m * n};
      ck_assert(cpu->supports(cpu, &t));
      ck_assert_int_eq(cpu->run(cpu, &t, &err), 0);
      t.u.gemm.c = c2;
      ref_gemm(&t.u.gemm);
      same(dt, c1, c2, batch * m * n, "gemm");
      free(A);
      free(B);
      free(c1);
      free(c2);
      /* window: 3x3, stride 2, pad 1, dilation 1 */
      int64_t N = 2, C = 5, H = 17, W = 15, O = 9, oh = 9, ow = 8;
      void *x = values(dt, N * C * H * W, 3, sp),
           *w = values(dt, C * 9 * O, 4, sp);
      void *o1 = malloc((size_t)(N * oh * ow * O) * es);
      void *o2 = malloc((size_t)(N * oh * ow * O) * es);
      topos_task tw = {.kind = TOPOS_TASK_WINDOW, .threads = 1};
      tw.u.window = (topos_window_task){.dtype = dt,
                                        .n = N,
                                        .c = C,
                                        .h = H,
                                        .w = W,
                                        .x = x,
                                        .o = O,
                                        .weight = w,
                                        .w_row = O,
                                        .w_col = 1,
                                        .kh = 3,
                                        .kw = 3,
                                        .stride_h = 2,
                                        .stride_w = 2,
                                        .dil_h = 1,
                                        .dil_w = 1,
                                        .pad_top = 1,
                                        .pad_left = 1,
                                        .oh = oh,
                                        .ow = ow,
                                        .out = o1};
      if (cpu->supports(cpu, &tw)) {
        ck_assert_int_eq(cpu->run(cpu, &tw, &err), 0);
        tw.u.window.out = o2;
        ref_window(&tw.u.window);
        same(dt, o1, o2, N * oh * ow * O, "window");
      }
      free(x);
      free(w);
      free(o1);
      free(o2);
      /* reduce: L past 16 and under */
      const int64_t shapes[][3] = {{3, 1000, 7}, {50, 9, 1}, {2, 70001, 1}};
      for (int s = 0; s < 3; s++) {
        int64_t outer = shapes[s][0], L = shapes[s][1], inner = shapes[s][2];
        void *xr = values(dt, outer * L * inner, 5 + (uint64_t)s, sp);
        void *y1 = malloc((size_t)(outer * inner) * es);
        void *y2 = malloc((size_t)(outer * inner) * es);
        topos_task tr = {.kind = TOPOS_TASK_REDUCE, .threads = 1};
        tr.u.reduce = (topos_reduce_task){.dtype = dt,
                                          .outer = outer,
                                          .L = L,
                                          .inner = inner,
                                          .x = xr,
                                          .y = y1};
        if (cpu->supports(cpu, &tr)) {
          ck_assert_int_eq(cpu->run(cpu, &tr, &err), 0);
          tr.u.reduce.y = y2;
          ref_reduce(&tr.u.reduce);
          same(dt, y1, y2, outer * inner, "reduce");
        }
        free(xr);
        free(y1);
        free(y2);
      }
      /* attention with a broadcast scale, a mask and every row output */
      {
        int64_t B = 2, T = 9, S = 33, DH = 8, DV = 12;
        void *q = values(dt, B * T * DH, 20, sp),
             *kk = values(dt, B * DH * S, 21, sp);
        void *v = values(dt, B * S * DV, 22, sp),
             *sc = values(dt, B * T, 23, false);
        void *mk = values(dt, B * T * S, 24, false);
        void *o1[6], *o2[6];
        for (int o = 0; o < 6; o++) {
          size_t n = (size_t)(o ? B * T * S : B * T * DV) * es;
          o1[o] = calloc(1, n);
          o2[o] = calloc(1, n);
        }
        topos_task ta = {.kind = TOPOS_TASK_ATTENTION, .threads = 1};
        ta.u.attention = (topos_attention_task){.dtype = dt,
                                                .batch = B,
                                                .t = T,
                                                .s = S,
                                                .dh = DH,
                                                .dv = DV,
                                                .q = q,
                                                .q_batch = T * DH,
                                                .q_row = DH,
                                                .q_col = 1,
                                                .k = kk,
                                                .k_batch = DH * S,
                                                .k_row = 1,
                                                .k_col = DH,
                                                .v = v,
                                                .v_batch = S * DV,
                                                .v_row = DV,
                                                .v_col = 1,
                                                .scale = sc,
                                                .scale_batch = T,
                                                .scale_row = 1,
                                                .scale_col = 0,
                                                .mask = mk,
                                                .mask_batch = T * S,
                                                .mask_row = S,
                                                .mask_col = 1,
                                                .out = o1[0],
                                                .raw = o1[1],
                                                .scaled = o1[2],
                                                .masked = o1[3],
                                                .logp = o1[4],
                                                .probs = o1[5]};
        if (cpu->supports(cpu, &ta)) {
          ck_assert_int_eq(cpu->run(cpu, &ta, &err), 0);
          topos_attention_task *a = &ta.u.attention;
          a->out = o2[0];
          a->raw = o2[1];
          a->scaled = o2[2];
          a->masked = o2[3];
          a->logp = o2[4];
          a->probs = o2[5];
          ref_attention(a);
          for (int o = 0; o < 6; o++)
            same(dt, o1[o], o2[o], o ? B * T * S : B * T * DV, "attention");
        } else {
          ck_abort_msg("the cpu backend declined an attention task");
        }
        for (int o = 0; o < 6; o++) {
          free(o1[o]);
          free(o2[o]);
        }
        free(q);
        free(kk);
        free(v);
        free(sc);
        free(mk);
      }
      /* maps, every op */
      int64_t nm = 20000;
      void *a = values(dt, nm, 8, sp), *b = values(dt, nm, 9, sp);
      void *y1 = malloc((size_t)nm * es), *y2 = malloc((size_t)nm * es);
      for (int op = 0; op < TOPOS_MAP_COUNT; op++) {
        topos_task tm = {.kind = TOPOS_TASK_MAP, .threads = 1};
        tm.u.map = (topos_map_task){.dtype = dt,
                                    .op = (topos_map_op)op,
                                    .p = 3.0,
                                    .n = nm,
                                    .a = a,
                                    .b = op >= TOPOS_MAP_ADD ? b : NULL,
                                    .y = y1};
        if (!cpu->supports(cpu, &tm)) continue;
        ck_assert_int_eq(cpu->run(cpu, &tm, &err), 0);
        tm.u.map.y = y2;
        ref_map(&tm.u.map);
        char what[32];
        snprintf(what, sizeof what, "map op %d", op);
        same(dt, y1, y2, nm, what);
      }
      free(a);
      free(b);
      free(y1);
      free(y2);
    }
}
END_TEST

/* ------------------------------------------------------- device cases */

static void run_case(const char *name) {
  cuda_env env = env_get();
  if (!env.exact) {
    char rep[512];
    topos_backends_plugin_report(rep, sizeof rep);
    fprintf(stderr, "cuda %s: no device (%s): skipped\n", name, rep);
    return;
  }
  for (int i = 0; i < cuda_ncases; i++) {
    if (strcmp(cuda_cases[i].name, name)) continue;
    char msg[512] = "";
    long checks = 0;
    int rc = cuda_cases[i].fn(&env, msg, sizeof msg, &checks);
    ck_assert_msg(rc != CUDA_FAIL, "%s: %s", name, msg);
    if (rc == CUDA_SKIP)
      fprintf(stderr, "cuda %s: skipped: %s\n", name, msg);
    else
      ck_assert_int_gt(checks, 0);
    return;
  }
  ck_abort_msg("no case %s", name);
}

START_TEST(device_cases) {
  run_case(cuda_cases[_i].name);
}
END_TEST

Suite *cuda_suite(void) {
  Suite *s = suite_create("cuda");
  TCase *tc = tcase_create("host");
  tcase_add_test(tc, loader_reports);
  tcase_add_test(tc, plugin_load_errors);
  tcase_add_test(tc, plugin_direct);
  tcase_add_test(tc, ref_matches_cpu_backend);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  TCase *dev = tcase_create("device");
  tcase_add_loop_test(dev, device_cases, 0, cuda_ncases);
  tcase_set_timeout(dev, 600);
  suite_add_tcase(s, dev);
  return s;
}
