/*
 * sim.cc - the fiber scheduler behind sim.h.
 *
 * A launch runs its blocks one after another.  A block's threads are
 * fibers (ucontext) on the calling OS thread; the scheduler resumes each
 * in turn until it reaches __syncthreads or returns.  When every fiber
 * has stopped at the barrier, the next pass releases them; when all have
 * returned, the block is done.  Some at the barrier and some returned is
 * a kernel bug (on a GPU: undefined behaviour, usually a hang): the
 * launch stops and cudaGetLastError() says cudaErrorLaunchFailure.
 *
 * Under AddressSanitizer the stack switches are announced to it
 * (__sanitizer_start_switch_fiber), so it tracks the fibers' stacks.
 */
#include "sim.h"

#include <pthread.h>
#include <stdlib.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

sim_index threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum { RUNNABLE, AT_BARRIER, DONE };
const size_t STACK = 256 << 10;

struct fiber {
  ucontext_t ctx;
  char *stack;
  int state;
};

pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
cudaError_t last_error;
ucontext_t sched;
fiber *fibers;
int nfibers, capacity, cur;
void (*body_fn)(void *);
void *body_ctx;
#ifdef SIM_ASAN
const void *sched_bottom;
size_t sched_size;
#endif

/* Switches from the running fiber back to the scheduler. */
void to_scheduler(bool exiting) {
#ifdef SIM_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, sched_bottom,
                                 sched_size);
  if (exiting) {
    setcontext(&sched);
    return;
  }
  swapcontext(&fibers[cur].ctx, &sched);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  if (exiting)
    setcontext(&sched);
  else
    swapcontext(&fibers[cur].ctx, &sched);
#endif
}

void fiber_main() {
#ifdef SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
  body_fn(body_ctx);
  fibers[cur].state = DONE;
  to_scheduler(true);
}

/* Resumes fiber i until it stops. */
void resume(int i) {
  cur = i;
  unsigned bx = blockDim.x, by = blockDim.y;
  threadIdx = {(unsigned)i % bx, (unsigned)i / bx % by,
               (unsigned)i / (bx * by)};
  fibers[i].state = RUNNABLE;
#ifdef SIM_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, fibers[i].stack, STACK);
  swapcontext(&sched, &fibers[i].ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swapcontext(&sched, &fibers[i].ctx);
#endif
}

/* Fiber i, ready to start the kernel (getcontext returns once: no
 * local of a caller's loop is live across it). */
__attribute__((noinline)) void fiber_init(fiber *f) {
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main, 0);
  f->state = RUNNABLE;
}

/* Runs one block; false when its threads disagreed about a barrier. */
bool run_block() {
  for (int i = 0; i < nfibers; i++) fiber_init(&fibers[i]);
  for (;;) {
    for (int i = 0; i < nfibers; i++)
      if (fibers[i].state != DONE) resume(i);
    int waiting = 0, done = 0;
    for (int i = 0; i < nfibers; i++) {
      waiting += fibers[i].state == AT_BARRIER;
      done += fibers[i].state == DONE;
    }
    if (done == nfibers) return true;
    if (done > 0) return false; /* some returned, some wait: diverged */
    (void)waiting;
  }
}

}  // namespace

void __syncthreads(void) {
  fibers[cur].state = AT_BARRIER;
  to_scheduler(false);
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

void sim_launch(dim3 grid, dim3 block, void (*body)(void *), void *ctx) {
  pthread_mutex_lock(&launch_mu);
  int n = (int)(block.x * block.y * block.z);
  if (n > capacity) {
    fiber *grown = (fiber *)realloc(fibers, sizeof(fiber) * (size_t)n);
    if (!grown) abort();
    fibers = grown;
    for (int i = capacity; i < n; i++) {
      fibers[i].stack = (char *)malloc(STACK);
      if (!fibers[i].stack) abort();
    }
    capacity = n;
  }
  nfibers = n;
  body_fn = body;
  body_ctx = ctx;
  blockDim = {block.x, block.y, block.z};
  gridDim = {grid.x, grid.y, grid.z};
  bool ok = true;
  for (unsigned z = 0; z < grid.z && ok; z++)
    for (unsigned y = 0; y < grid.y && ok; y++)
      for (unsigned x = 0; x < grid.x && ok; x++) {
        blockIdx = {x, y, z};
        ok = run_block();
      }
  if (!ok) last_error = cudaErrorLaunchFailure;
  pthread_mutex_unlock(&launch_mu);
}
