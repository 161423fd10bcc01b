/*
 * admission.h - memory admission control of runs (docs/daemon.md,
 * "Memory admission").
 *
 * Before a Forward, Backward, Step or Conformance allocates anything of
 * its own, its handler bounds the run's peak bytes - the plan's bounds
 * (topos_plan_run_bytes, topos_plan_step_bytes) plus the tensors it will
 * decode from the request and encode into the reply - and reserves them:
 * over the per-run budget (--run-bytes), or more than the global budget
 * (--memory-bytes) has left beside the runs in flight, the call is
 * RESOURCE_EXHAUSTED at once with both numbers in the message.  A run
 * that does not fit now fails rather than waits: a waiting run would hold
 * a worker that cheaper calls need, and the client, told the numbers,
 * retries with its own backoff or a smaller request.
 */
#ifndef TOPOSD_ADMISSION_H
#define TOPOSD_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>

#include "handlers.h"

typedef struct admission {
  int64_t bytes; /* reserved; 0 when nothing is held */
} admission;

/* Bytes of tensors a run decodes from a request (pool buffers, rounded
 * to their size classes, with their structs), from their data bytes. */
size_t admission_decoded(size_t data_bytes, size_t tensors);
/* Bytes of tensors a run encodes into its reply (the messages' copies
 * and the packed reply), from their data bytes. */
size_t admission_encoded(size_t data_bytes, size_t tensors);

/* Checks that a reply carrying `data_bytes` of tensors can be sent
 * (max_message_bytes), then reserves `need` bytes for the run of
 * `method` under both budgets.  False with the call failed
 * RESOURCE_EXHAUSTED (engine code `memory`) when it does not fit. */
bool admission_take(call_ctx *cx, const char *method, size_t need,
                    size_t reply_data_bytes, admission *a);
/* Gives the reservation back (a no-op when none is held).  What the run
 * freed goes back to the engine's pool up to its cap (--pool-bytes), the
 * rest to the system. */
void admission_give(call_ctx *cx, admission *a);

#endif /* TOPOSD_ADMISSION_H */
