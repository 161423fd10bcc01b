/*
 * check_main.c - the standalone CUDA device check: loads the plugin
 * (libtopos_cuda.so) with dlopen, runs every case of cases.c on its
 * `cuda` and `cublas` backends, optionally times the exact GEMM against
 * cuBLAS, and prints one summary.  It needs no engine and no library
 * beyond libc, libm and the plugin, so the GPU machine (which has the
 * CUDA toolkit and nothing of topos's dependencies) can build and run it:
 * tests/cuda/device-check.sh.
 *
 *   cuda_check [--plugin PATH] [--case NAME] [--bench] [--allow-no-device]
 *
 * Exit status: 0 when every case held (or, with --allow-no-device, when
 * there is no device), 1 when a case failed, 2 on usage or load errors.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cases.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(const topos_plugin *p) {
  if (!p->bench_gemm) {
    printf("bench: the plugin has no bench entry\n");
    return;
  }
  const int sizes[] = {1024, 2048, 4096, 8192};
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < 4; i++) {
      int n = sizes[i];
      if (d && n > 4096) continue;
      double ops = 2.0 * n * (double)n * n;
      /* about half a second of the exact kernel per row */
      int reps = (int)(2e13 / ops);
      if (reps < 3) reps = 3;
      if (reps > 200) reps = 200;
      double te = 0, tb = 0;
      char err[256] = "";
      int re = p->bench_gemm(n, d, false, reps, &te, err, sizeof err);
      int rb = p->bench_gemm(n, d, true, reps, &tb, err, sizeof err);
      printf("bench gemm n=%d dtype=%s reps=%d exact=", n, d ? "f64" : "f32",
             reps);
      if (re == 0)
        printf("%.1f", ops / te * 1e-9);
      else
        printf("-");
      printf(" cublas=");
      if (rb == 0)
        printf("%.1f", ops / tb * 1e-9);
      else
        printf("-");
      printf(" gflops");
      if (re == 0 && rb == 0) printf(" exact/cublas=%.2f", tb / te);
      if (re || rb) printf(" (%s)", err);
      printf("\n");
    }
}

int main(int argc, char **argv) {
  const char *path = "build/lib/libtopos_cuda.so", *only = NULL;
  int want_bench = 0, allow_none = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--plugin") && i + 1 < argc)
      path = argv[++i];
    else if (!strcmp(argv[i], "--case") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--bench"))
      want_bench = 1;
    else if (!strcmp(argv[i], "--allow-no-device"))
      allow_none = 1;
    else {
      fprintf(stderr,
              "usage: %s [--plugin PATH] [--case NAME] [--bench] "
              "[--allow-no-device]\n",
              argv[0]);
      return 2;
    }
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "cuda_check: %s\n", dlerror());
    return 2;
  }
  topos_plugin_init_fn init;
  void *sym = dlsym(h, TOPOS_PLUGIN_ENTRY);
  if (!sym) {
    fprintf(stderr, "cuda_check: %s is not a topos plugin\n", path);
    return 2;
  }
  memcpy(&init, &sym, sizeof init);
  topos_plugin_options opt = {.abi = TOPOS_PLUGIN_ABI};
  const topos_plugin *p = NULL;
  char why[256] = "";
  if (init(&opt, &p, why, sizeof why) != 0) {
    printf("cuda device check: no device: %s%s\n", why,
           allow_none ? " (skipped)" : "");
    return allow_none ? 0 : 1;
  }
  cuda_env env = {
      .devices = p->devices, .announce = p->announce, .retract = p->retract};
  for (int i = 0; i < p->nbackends; i++) {
    if (!strcmp(p->backends[i]->name, "cuda")) env.exact = p->backends[i];
    if (!strcmp(p->backends[i]->name, "cublas")) env.fast = p->backends[i];
  }
  topos_device_info dev[TOPOS_DEVICES_MAX];
  int ndev = p->devices(dev, TOPOS_DEVICES_MAX);
  for (int i = 0; i < ndev; i++)
    printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", dev[i].ordinal,
           dev[i].name, dev[i].cc_major, dev[i].cc_minor,
           dev[i].multiprocessors, dev[i].memory_total / 1073741824.0);
  int passed = 0, ran = 0, skipped = 0;
  long total_checks = 0;
  for (int i = 0; i < cuda_ncases; i++) {
    if (only && strcmp(only, cuda_cases[i].name)) continue;
    char msg[512] = "";
    long checks = 0;
    double t0 = now();
    int rc = cuda_cases[i].fn(&env, msg, sizeof msg, &checks);
    ran++;
    total_checks += checks;
    if (rc == CUDA_PASS) passed++;
    if (rc == CUDA_SKIP) skipped++;
    printf("%s %s (%ld checks, %.2f s)%s%s\n",
           rc == CUDA_PASS   ? "ok"
           : rc == CUDA_SKIP ? "skip"
                             : "FAIL",
           cuda_cases[i].name, checks, now() - t0, msg[0] ? ": " : "", msg);
    fflush(stdout);
  }
  if (want_bench) bench(p);
  ndev = p->devices(dev, TOPOS_DEVICES_MAX);
  printf(
      "cuda device check: %d/%d cases passed, %ld checks; %s (sm_%d%d); "
      "%llu tasks, %llu handed back (NaN)\n",
      passed, ran, total_checks, ndev ? dev[0].name : "?",
      ndev ? dev[0].cc_major : 0, ndev ? dev[0].cc_minor : 0,
      ndev ? (unsigned long long)dev[0].tasks : 0ull,
      ndev ? (unsigned long long)dev[0].declined : 0ull);
  return passed + skipped == ran ? 0 : 1;
}
