/*
 * footprint.c - the memory a network, a plan or a tensor keeps, for
 * callers that bound a cache in bytes (the daemon's cache.c).
 *
 * A figure is the heap blocks the object owns, each rounded the way
 * glibc's malloc rounds a request (malloc_block), plus tensor buffers at
 * their pool capacity: what freeing the object would give back, not what
 * its encoding takes (a chain of 100,000 tanh nodes encodes to 1.2 MB and
 * holds 43 MB decoded).  Where the engine over-allocates, the figure
 * counts the allocation (a sealed network keeps its tape's doubled node
 * array, a plan its per-node group table), and a buffer shared by several
 * tensors is counted for each of them, so it errs on the high side.
 */
#include <string.h>

#include "internal.h"

size_t topos_tensor_memory_bytes(const topos_tensor *t) {
  if (t == NULL) return 0;
  size_t bytes = malloc_block(sizeof *t);
  if (t->buf != NULL) bytes += malloc_block(sizeof *t->buf) + t->buf->capacity;
  return bytes;
}

/* The node array a tape of n nodes grew to: tape_record (tape.c) starts
 * at 64 and doubles, and topos_tape_seal hands that array to the network
 * as it is. */
static size_t node_capacity(int n) {
  if (n <= 0) return 0;
  size_t cap = 64;
  while (cap < (size_t)n) cap *= 2;
  return cap;
}

size_t topos_network_memory_bytes(const topos_network *net) {
  if (net == NULL) return 0;
  size_t bytes = malloc_block(sizeof *net) +
                 malloc_block(node_capacity(net->n) * sizeof(node)) +
                 malloc_block(sizeof(int32_t) * (size_t)(net->nparams + 1)) +
                 malloc_block(sizeof(int32_t) * (size_t)(net->ninputs + 1));
  for (int i = 0; i < net->n; i++) {
    const node *nd = &net->nodes[i];
    if (nd->in != NULL)
      bytes += malloc_block(sizeof(int32_t) * (size_t)nd->nin);
    if (nd->name != NULL) bytes += malloc_block(strlen(nd->name) + 1);
    bytes += topos_tensor_memory_bytes(nd->at.tensor);
  }
  return bytes;
}

size_t topos_plan_memory_bytes(const topos_plan *plan) {
  if (plan == NULL) return 0;
  /* The arrays topos_network_lower allocates, at the sizes it asks for
   * (plan.c: per node n + 1 entries, per schedule step S + 1 or S + 2). */
  size_t n = (size_t)(plan->net != NULL ? plan->net->n : 0) + 1;
  size_t s = (size_t)plan->nschedule + 2;
  size_t bytes = malloc_block(sizeof *plan);
  bytes += malloc_block(sizeof(int32_t) * (size_t)(plan->nroots + 1));
  bytes += malloc_block(sizeof(int32_t) * (size_t)(plan->nobserves + 1));
  /* live, keep, retain; group_of, schedule, last_use; the groups (as
   * many as were found) */
  bytes += 3 * malloc_block(sizeof(bool) * n);
  bytes += 3 * malloc_block(sizeof(int32_t) * n);
  bytes += malloc_block(sizeof(plan_group) * (size_t)plan->ngroups);
  /* free_start, free_after */
  bytes += 2 * malloc_block(sizeof(int32_t) * s);
  return bytes;
}
