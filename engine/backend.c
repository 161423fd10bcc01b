/*
 * backend.c - the backend registry and the dispatch helper the engine's
 * kernels call (backend.h describes the seam).
 *
 * The chain is a fixed array appended under a mutex and published with a
 * release store of its length, so offering a task takes no lock.  The
 * numerics in force is per thread: plan runs set it from the plan for the
 * duration of the run; everything else (the interpreter, its backward)
 * runs under exact.  So is an entry's thread count (see "threads").  Whatever
 * no backend takes runs on the reference kernels, and a backend's failure is
 * never seen by the caller.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "internal.h"

#define MAX_BACKENDS 16

static const topos_backend *chain[MAX_BACKENDS];
static atomic_int chain_len;
static pthread_mutex_t chain_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool chain_off;

int topos_backend_register(const topos_backend *backend) {
  if (!backend || !backend->name || !backend->supports || !backend->run)
    return TOPOS_ERR_ARGUMENT;
  if (backend->fidelity != TOPOS_FIDELITY_EXACT &&
      backend->fidelity != TOPOS_FIDELITY_ENVELOPE)
    return TOPOS_ERR_ARGUMENT;
  int rc = TOPOS_OK;
  pthread_mutex_lock(&chain_lock);
  int n = atomic_load_explicit(&chain_len, memory_order_relaxed);
  for (int i = 0; i < n; i++)
    if (chain[i] == backend || strcmp(chain[i]->name, backend->name) == 0)
      goto done; /* already registered: idempotent */
  if (n == MAX_BACKENDS) {
    rc = TOPOS_ERR_MEMORY;
    goto done;
  }
  chain[n] = backend;
  atomic_store_explicit(&chain_len, n + 1, memory_order_release);
done:
  pthread_mutex_unlock(&chain_lock);
  return rc;
}

int topos_backend_count(void) {
  return atomic_load_explicit(&chain_len, memory_order_acquire);
}

const topos_backend *topos_backend_at(int index) {
  if (index < 0 || index >= topos_backend_count()) return NULL;
  return chain[index];
}

void backend_chain_enable(bool on) {
  atomic_store(&chain_off, !on);
}

/* ------------------------------------------------------------ numerics */

static _Thread_local topos_numerics current_numerics = TOPOS_NUMERICS_EXACT;

topos_numerics backend_numerics(void) {
  return current_numerics;
}

topos_numerics backend_set_numerics(topos_numerics numerics) {
  topos_numerics old = current_numerics;
  current_numerics = numerics;
  return old;
}

/* ------------------------------------------------------------- threads */

/*
 * Two levels.  The process default: backend_set_threads's override, else
 * TOPOS_THREADS (read once, capped at TOPOS_THREADS_MAX), else the online
 * cores.  Over it, per thread, the run value a plan run installs from its
 * entry's `threads` for the duration of the run (like the numerics): when
 * non-zero it is what every task offered on this thread gets, above the
 * process default too (the entry asked for it explicitly); the backends
 * cap it at what their pools can give.
 */
static atomic_int threads_override;
static int threads_default;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static _Thread_local int run_threads; /* 0 = the process default */

static void threads_init(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores > 0 ? (int)cores : 1;
  const char *env = getenv("TOPOS_THREADS");
  if (env && *env) {
    char *end = NULL;
    long v = strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 1)
      n = v > TOPOS_THREADS_MAX ? TOPOS_THREADS_MAX : (int)v;
  }
  threads_default = n;
}

int backend_threads(void) {
  if (run_threads > 0) return run_threads;
  int o = atomic_load(&threads_override);
  if (o > 0) return o;
  pthread_once(&threads_once, threads_init);
  return threads_default;
}

void backend_set_threads(int threads) {
  atomic_store(&threads_override, threads > 0 ? threads : 0);
}

int backend_run_threads(void) {
  return run_threads;
}

int backend_set_run_threads(int threads) {
  int old = run_threads;
  run_threads = threads > 0 ? threads : 0;
  return old;
}

/* ------------------------------------------------------------ test hook */

typedef void (*offer_hook_fn)(const topos_task *t, void *ctx);
static _Atomic(offer_hook_fn) offer_hook;
static _Atomic(void *) offer_hook_ctx;

void backend_set_offer_hook(void (*fn)(const topos_task *t, void *ctx),
                            void *ctx) {
  atomic_store(&offer_hook, NULL);
  atomic_store(&offer_hook_ctx, ctx);
  atomic_store(&offer_hook, fn);
}

/* ------------------------------------------------------------- offering */

int backend_offer(const topos_task *t, topos_numerics numerics,
                  topos_error *err) {
  (void)err; /* a backend's failure falls back silently */
  offer_hook_fn hook = atomic_load_explicit(&offer_hook, memory_order_acquire);
  if (hook) hook(t, atomic_load(&offer_hook_ctx));
  if (atomic_load_explicit(&chain_off, memory_order_relaxed)) return -1;
  int n = topos_backend_count();
  for (int i = 0; i < n; i++) {
    const topos_backend *b = chain[i];
    if (b->fidelity != TOPOS_FIDELITY_EXACT && numerics != TOPOS_NUMERICS_FAST)
      continue;
    if (!b->supports(b, t)) continue;
    topos_error e = {0};
    if (b->run(b, t, &e) == TOPOS_OK) return 0;
  }
  return -1;
}
