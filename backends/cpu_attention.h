/*
 * cpu_attention.h - private to the `cpu` backend: the attention chain of
 * plans (TOPOS_TASK_ATTENTION, cpu_attention.c).
 */
#ifndef TOPOS_CPU_ATTENTION_H
#define TOPOS_CPU_ATTENTION_H

#include "backend.h"

bool cpu_attention_supports(const topos_attention_task *t);
/* Runs the task on up to `threads` threads; a topos_status. */
int cpu_attention_run(const topos_attention_task *t, int threads);

#endif /* TOPOS_CPU_ATTENTION_H */
