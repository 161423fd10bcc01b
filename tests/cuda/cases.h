/*
 * cases.h - the CUDA suites: each case runs tasks on the `cuda` (exact)
 * or `cublas` (envelope) backend and holds the result to the reference
 * loops of ref.h - memcmp for exact, numerics.md's envelope for fast.
 *
 * The cases are plain C over backend.h and plugin.h, so two drivers run
 * them: the Check suite in the main runner (tests/backends/test_cuda.c),
 * which reports "no device" and skips on a host without a GPU, and the
 * standalone device check (tests/cuda/check_main.c, tests/cuda/
 * device-check.sh), which needs nothing but a C compiler and the CUDA
 * toolkit on the GPU machine.
 */
#ifndef TOPOS_TESTS_CUDA_CASES_H
#define TOPOS_TESTS_CUDA_CASES_H

#include <stdbool.h>
#include <stddef.h>

#include "plugin.h"

typedef struct cuda_env {
  const topos_backend *exact; /* "cuda" */
  const topos_backend *fast;  /* "cublas", or NULL without cuBLAS */
  int (*devices)(topos_device_info *out, int max);
  int (*announce)(const void *host, size_t bytes, const uint8_t hash[32]);
  void (*retract)(const void *host);
  /* The kernels on the CPU simulator (tests/cuda/sim.h): smaller sweeps,
   * and no device-only cases. */
  bool sim;
} cuda_env;

/* CUDA_PASS when the case holds, CUDA_FAIL with what failed in msg, or
 * CUDA_SKIP with why in msg (a case the environment cannot run).
 * *checks counts the comparisons made. */
enum { CUDA_PASS = 0, CUDA_FAIL = 1, CUDA_SKIP = 2 };
typedef int (*cuda_case_fn)(const cuda_env *env, char *msg, size_t len,
                            long *checks);

typedef struct cuda_case {
  const char *name;
  cuda_case_fn fn;
} cuda_case;

extern const cuda_case cuda_cases[];
extern const int cuda_ncases;

#endif
