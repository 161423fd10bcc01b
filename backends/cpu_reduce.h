/*
 * cpu_reduce.h - the cpu backend's reduction and elementwise-map tasks
 * (cpu_reduce.c), reached through the cpu backend's supports()/run().
 */
#ifndef TOPOS_CPU_REDUCE_H
#define TOPOS_CPU_REDUCE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the cpu backend takes a TOPOS_TASK_REDUCE / TOPOS_TASK_MAP. */
bool cpu_reduce_supports(const topos_task *task);
bool cpu_map_supports(const topos_task *task);
/* Runs one (whatever its size); a topos_status. */
int cpu_reduce_run(const topos_task *task);
int cpu_map_run(const topos_task *task);

/* The reference's striped-16 sum of x[0..n) (kernels_real.h, reduce),
 * its adds pinned accumulator-first: for the attention rows. */
float cpu_reduce_sum_f32(const float *x, int64_t n);
double cpu_reduce_sum_f64(const double *x, int64_t n);

/* Tests: how many reduce / map tasks the cpu backend has run. */
unsigned long long topos_cpu_reduce_tasks_run(void);
unsigned long long topos_cpu_map_tasks_run(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_CPU_REDUCE_H */
