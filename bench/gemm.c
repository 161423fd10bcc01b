/*
 * gemm.c - GEMM GFLOP/s: the reference matmul loop, the exact `cpu`
 * backend and OpenBLAS (when the blas backend is built), measured side by
 * side in one run.
 *
 *   build/bench/gemm [--n N] [--dtype f32|f64] [--threads T]
 *                    [--pairs R [--cputime] [--gap MS]]
 *
 * prints one line per case:
 *   gemm n=N dtype=D threads=T reference=X cpu_exact=Y openblas=Z gflops
 * (reference is `-` above n = 512; openblas `-` when it is not built).
 * With --pairs R (OpenBLAS built): R interleaved rounds of cpu_exact and
 * OpenBLAS, printing medians and the median ratio cpu_exact/openblas:
 *   gemm n=N dtype=D threads=T pairs=R cpu_exact=Y openblas=Z ratio=Q ...
 * --cputime times one-thread cases by the thread's CPU clock, --gap MS
 * sleeps MS milliseconds before each timed call (see gap_ms).
 *
 * OpenBLAS reads OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE when it loads, so
 * the process re-executes itself with both unset before touching it
 * (docs/architecture.md, "Platform facts": the environment may pin it to its
 * AVX2 kernels).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "internal.h"

#if __has_include("blas.h") && __has_include(<cblas.h>)
#define HAVE_OPENBLAS 1
#include <cblas.h>
/* OpenBLAS's own thread control (declared by its cblas.h on Debian, but
 * not by every cblas.h). */
void openblas_set_num_threads(int num_threads);
#else
#define HAVE_OPENBLAS 0
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bench_case {
  int64_t n;
  topos_dtype dtype;
  int threads;
  topos_tensor *a, *b;
  void *c;
} bench_case;

/* The reference: the engine's matmul kernel with the backend chain off. */
static void run_reference(bench_case *bc) {
  topos_tensor *in[2] = {bc->a, bc->b};
  tensor_meta out = {bc->dtype, 2, {bc->n, bc->n}};
  topos_error err = {0};
  topos_tensor *c = op_eval(OP_MATMUL, NULL, 2, in, &out, &err);
  if (!c) {
    fprintf(stderr, "gemm: reference failed: %s\n", err.message);
    exit(1);
  }
  topos_tensor_release(c);
}

static void run_cpu(bench_case *bc) {
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = bc->threads};
  t.u.gemm = (topos_gemm_task){.dtype = bc->dtype,
                               .batch = 1,
                               .m = bc->n,
                               .n = bc->n,
                               .k = bc->n,
                               .a = tensor_data(bc->a),
                               .a_row = bc->n,
                               .a_col = 1,
                               .b = tensor_data(bc->b),
                               .b_row = bc->n,
                               .b_col = 1,
                               .c = bc->c,
                               .c_row = bc->n,
                               .c_col = 1};
  const topos_backend *cpu = topos_cpu_backend();
  topos_error err = {0};
  if (cpu->run(cpu, &t, &err) != TOPOS_OK) {
    fprintf(stderr, "gemm: cpu backend failed\n");
    exit(1);
  }
}

/* A named backend (the CUDA plugin's `cuda` or `cublas`): through its
 * run(), so the figure includes the operands' trip over the bus. */
static const topos_backend *named;
static void run_named(bench_case *bc) {
  topos_task t = {.kind = TOPOS_TASK_GEMM, .threads = bc->threads};
  t.u.gemm = (topos_gemm_task){.dtype = bc->dtype,
                               .batch = 1,
                               .m = bc->n,
                               .n = bc->n,
                               .k = bc->n,
                               .a = tensor_data(bc->a),
                               .a_row = bc->n,
                               .a_col = 1,
                               .b = tensor_data(bc->b),
                               .b_row = bc->n,
                               .b_col = 1,
                               .c = bc->c,
                               .c_row = bc->n,
                               .c_col = 1};
  topos_error err = {0};
  if (named->run(named, &t, &err) != TOPOS_OK) {
    fprintf(stderr, "gemm: %s failed: %s\n", named->name, err.message);
    exit(1);
  }
}

#if HAVE_OPENBLAS
static void run_openblas(bench_case *bc) {
  int n = (int)bc->n;
  openblas_set_num_threads(bc->threads);
  if (bc->dtype == TOPOS_F64)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0,
                tensor_data(bc->a), n, tensor_data(bc->b), n, 0.0, bc->c, n);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                tensor_data(bc->a), n, tensor_data(bc->b), n, 0.0f, bc->c, n);
}
#endif

/* `--pairs R`: instead of each side's best over its own time budget, R
 * rounds that time the cpu backend and OpenBLAS back to back, so a load
 * that comes and goes on a shared machine hits both alike; the line then
 * carries each side's median and the median of the per-round ratios. */
static int pairs;

/* `--cputime` (with --pairs, one thread): time by the calling thread's CPU
 * clock instead of the wall clock, so that time slices the scheduler
 * gives another process on a shared core do not count (cache refills
 * after them still do). */
static bool cputime;

static double cpu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* `--gap MS` (with --pairs): an idle pause before each timed call.
 * OpenBLAS's worker threads spin (sched_yield) for about 2^28 cycles
 * after each call before they sleep, so without a pause the cpu backend's
 * two-thread runs share the cores with a spinning OpenBLAS thread; a
 * pause past that lets both sides start from sleeping workers. */
static int gap_ms;

static double time_once(void (*fn)(bench_case *), bench_case *bc) {
  if (gap_ms > 0) {
    struct timespec ts = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  bool cpu = cputime && bc->threads == 1;
  double t0 = cpu ? cpu_now_s() : now_s();
  fn(bc);
  return (cpu ? cpu_now_s() : now_s()) - t0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Best GFLOP/s over repetitions filling about `budget` seconds. */
static double measure(void (*fn)(bench_case *), bench_case *bc, double budget) {
  double flops = 2.0 * (double)bc->n * (double)bc->n * (double)bc->n;
  fn(bc); /* warm: pages, pool workers, packing buffers */
  double best = INFINITY, spent = 0;
  int reps = 0;
  while ((spent < budget && reps < 50) || reps < 2) {
    double t0 = now_s();
    fn(bc);
    double dt = now_s() - t0;
    spent += dt;
    reps++;
    if (dt < best) best = dt;
  }
  return flops / best * 1e-9;
}

static void fmt(char *buf, size_t len, double v) {
  if (v < 0)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.1f", v);
}

static void run_case(int64_t n, topos_dtype dtype, int threads) {
  bench_case bc = {.n = n, .dtype = dtype, .threads = threads};
  int64_t shape[2] = {n, n};
  size_t es = topos_dtype_size(dtype);
  double *v = malloc(sizeof(double) * (size_t)(n * n));
  uint64_t s = 0x9E3779B97F4A7C15ull + (uint64_t)n;
  for (int64_t i = 0; i < n * n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v[i] = (double)(s >> 11) / 9007199254740992.0 - 0.5;
  }
  void *buf = malloc(es * (size_t)(n * n));
  for (int64_t i = 0; i < n * n; i++) {
    if (dtype == TOPOS_F64)
      ((double *)buf)[i] = v[i];
    else
      ((float *)buf)[i] = (float)v[i];
  }
  bc.a = topos_tensor_from(dtype, 2, shape, buf, NULL);
  bc.b = topos_tensor_from(dtype, 2, shape, buf, NULL);
  bc.c = malloc(es * (size_t)(n * n));
  memset(bc.c, 0, es * (size_t)(n * n));
  free(buf);
  free(v);
  double budget = n >= 2048 ? 0.6 : 0.25;
  double ref = -1, cpu, blas = -1;
#if HAVE_OPENBLAS
  if (pairs > 0) {
    double flops = 2.0 * (double)n * (double)n * (double)n;
    double *tc = malloc(sizeof(double) * 3 * (size_t)pairs);
    double *tb = tc + pairs, *ratio = tb + pairs;
    run_cpu(&bc); /* warm both */
    run_openblas(&bc);
    for (int r = 0; r < pairs; r++) {
      /* Alternate which side goes first. */
      if (r % 2) {
        tb[r] = time_once(run_openblas, &bc);
        tc[r] = time_once(run_cpu, &bc);
      } else {
        tc[r] = time_once(run_cpu, &bc);
        tb[r] = time_once(run_openblas, &bc);
      }
      ratio[r] = tb[r] / tc[r];
    }
    double mc = median(tc, pairs), mb = median(tb, pairs);
    double mr = median(ratio, pairs);
    printf(
        "gemm n=%lld dtype=%s threads=%d pairs=%d cpu_exact=%.1f "
        "openblas=%.1f ratio=%.3f gflops (medians%s)\n",
        (long long)n, topos_dtype_name(dtype), threads, pairs,
        flops / mc * 1e-9, flops / mb * 1e-9, mr,
        cputime && threads == 1 ? ", thread cpu time" : "");
    fflush(stdout);
    free(tc);
    topos_tensor_release(bc.a);
    topos_tensor_release(bc.b);
    free(bc.c);
    return;
  }
#endif
  if (n <= 512) {
    backend_set_threads(threads);
    ref = measure(run_reference, &bc, n >= 512 ? 0.4 : budget);
  }
  cpu = measure(run_cpu, &bc, budget);
#if HAVE_OPENBLAS
  blas = measure(run_openblas, &bc, budget);
#endif
  /* The GPU's backends when the CUDA plugin found a device (with the
   * host<->device copies: bench/cuda's device check times the kernels
   * alone). */
  double gpu[2] = {-1, -1};
  const char *gpu_names[2] = {"cuda", "cublas"};
  for (int g = 0; g < 2; g++)
    if ((named = topos_backend_find(gpu_names[g])) != NULL)
      gpu[g] = measure(run_named, &bc, budget);
  char r[32], c[32], o[32], ge[32], gb[32];
  fmt(r, sizeof r, ref);
  fmt(c, sizeof c, cpu);
  fmt(o, sizeof o, blas);
  fmt(ge, sizeof ge, gpu[0]);
  fmt(gb, sizeof gb, gpu[1]);
  printf(
      "gemm n=%lld dtype=%s threads=%d reference=%s cpu_exact=%s "
      "openblas=%s cuda_exact=%s cublas=%s gflops\n",
      (long long)n, topos_dtype_name(dtype), threads, r, c, o, ge, gb);
  fflush(stdout);
  topos_tensor_release(bc.a);
  topos_tensor_release(bc.b);
  free(bc.c);
}

int main(int argc, char **argv) {
#if HAVE_OPENBLAS
  /* OpenBLAS reads these once, when it loads: re-execute without them.
   * `--openblas-core NAME` instead pins its kernels (OpenBLAS 0.3.21 does
   * not know every CPU and falls back to its SSE3 "Prescott" kernels). */
  const char *core = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--openblas-core") == 0) core = argv[i + 1];
  if (!getenv("TOPOS_GEMM_REEXEC") &&
      (core || getenv("OPENBLAS_CORETYPE") || getenv("OPENBLAS_L2_SIZE"))) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_L2_SIZE");
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("TOPOS_GEMM_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    perror("gemm: re-exec");
    return 1;
  }
#endif
  int64_t only_n = 0;
  int only_dtype = -1, only_threads = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
      only_n = atoll(argv[++i]);
    } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      const char *d = argv[++i];
      if (strcmp(d, "f32") == 0)
        only_dtype = TOPOS_F32;
      else if (strcmp(d, "f64") == 0)
        only_dtype = TOPOS_F64;
      else {
        fprintf(stderr, "gemm: --dtype f32|f64\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      only_threads = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--openblas-core") == 0 && i + 1 < argc) {
      i++; /* handled above */
    } else if (strcmp(argv[i], "--pairs") == 0 && i + 1 < argc) {
      pairs = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--cputime") == 0) {
      cputime = true;
    } else if (strcmp(argv[i], "--gap") == 0 && i + 1 < argc) {
      gap_ms = atoi(argv[++i]);
    } else {
      fprintf(stderr,
              "usage: %s [--n N] [--dtype f32|f64] [--threads T] "
              "[--openblas-core NAME] [--pairs R [--cputime] [--gap MS]]\n",
              argv[0]);
      return 2;
    }
  }
  topos_backends_register_defaults();
  fprintf(stderr, "gemm: cpu backend microkernels: %s\n", topos_cpu_isa());
  char plugins[512];
  topos_backends_plugin_report(plugins, sizeof plugins);
  fprintf(stderr, "gemm: %s\n", plugins);
  const int64_t sizes[] = {256, 512, 1024, 2048};
  const topos_dtype dtypes[] = {TOPOS_F32, TOPOS_F64};
  const int threads[] = {1, 2};
  for (int si = 0; si < 4; si++) {
    int64_t n = sizes[si];
    if (only_n && n != only_n) continue;
    for (int di = 0; di < 2; di++) {
      if (only_dtype >= 0 && (int)dtypes[di] != only_dtype) continue;
      for (int ti = 0; ti < 2; ti++) {
        if (only_threads && threads[ti] != only_threads) continue;
        run_case(n, dtypes[di], threads[ti]);
      }
    }
  }
  /* A size outside the default sweep. */
  if (only_n && only_n != 256 && only_n != 512 && only_n != 1024 &&
      only_n != 2048) {
    for (int di = 0; di < 2; di++) {
      if (only_dtype >= 0 && (int)dtypes[di] != only_dtype) continue;
      for (int ti = 0; ti < 2; ti++) {
        int t = only_threads ? only_threads : threads[ti];
        if (only_threads && ti > 0) break;
        run_case(only_n, dtypes[di], t);
      }
    }
  } else if (only_threads && only_threads != 1 && only_threads != 2) {
    for (int si = 0; si < 4; si++) {
      if (only_n && sizes[si] != only_n) continue;
      for (int di = 0; di < 2; di++) {
        if (only_dtype >= 0 && (int)dtypes[di] != only_dtype) continue;
        run_case(sizes[si], dtypes[di], only_threads);
      }
    }
  }
  backend_set_threads(0);
  pool_trim();
  return 0;
}
