/*
 * admission.c - memory admission control of runs (admission.h): the
 * reservation counter in daemon_state and the RESOURCE_EXHAUSTED answers.
 */
#include "admission.h"

#include <stdatomic.h>
#include <stdint.h>

#include "rooms.h"

/* Per tensor: its struct and message, and the pool's size classes
 * (at most 19% above a buffer's bytes, 64 bytes below 64 KiB). */
#define PER_TENSOR_BYTES 1024

static size_t add_sat(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

size_t admission_decoded(size_t data_bytes, size_t tensors) {
  size_t rounded = add_sat(data_bytes, data_bytes / 5);
  size_t per = tensors > SIZE_MAX / PER_TENSOR_BYTES
                   ? SIZE_MAX
                   : tensors * PER_TENSOR_BYTES;
  return add_sat(rounded, per);
}

size_t admission_encoded(size_t data_bytes, size_t tensors) {
  /* The Tensor messages' copies, then the packed reply beside them. */
  size_t twice = add_sat(data_bytes, data_bytes);
  size_t per = tensors > SIZE_MAX / PER_TENSOR_BYTES
                   ? SIZE_MAX
                   : tensors * PER_TENSOR_BYTES;
  return add_sat(twice, per);
}

bool admission_take(call_ctx *cx, const char *method, size_t need,
                    size_t reply_data_bytes, admission *a) {
  a->bytes = 0;
  const toposd_config *cfg = cx->d->cfg;
  if (reply_data_bytes > (size_t)cfg->max_message_bytes) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "%s would reply with %zu bytes of tensors, over the daemon's "
              "max-message-bytes %lld",
              method, reply_data_bytes, (long long)cfg->max_message_bytes);
    return false;
  }
  if (cx->quota != NULL && cx->quota->run_bytes >= 0 &&
      need > (size_t)cx->quota->run_bytes) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "%s: quota run_bytes: limit %lld bytes, this run needs %zu "
              "bytes",
              method, (long long)cx->quota->run_bytes, need);
    return false;
  }
  if (need > (size_t)cfg->run_bytes) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "%s needs %zu bytes at its peak; the run budget is %lld bytes "
              "(--run-bytes)",
              method, need, (long long)cfg->run_bytes);
    return false;
  }
  int64_t want = (int64_t)need; /* need <= run_bytes <= memory_bytes */
  int64_t cur = atomic_load(&cx->d->reserved_bytes);
  do {
    if (cur > cfg->memory_bytes - want) {
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "%s needs %zu bytes at its peak, and %lld bytes are reserved "
                "by runs in flight of a %lld-byte budget (--memory-bytes)",
                method, need, (long long)cur, (long long)cfg->memory_bytes);
      return false;
    }
  } while (
      !atomic_compare_exchange_weak(&cx->d->reserved_bytes, &cur, cur + want));
  a->bytes = want;
  return true;
}

void admission_give(call_ctx *cx, admission *a) {
  if (a->bytes <= 0) return;
  atomic_fetch_sub(&cx->d->reserved_bytes, a->bytes);
  a->bytes = 0;
}
