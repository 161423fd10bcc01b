/*
 * backend.c - the backend registry and execution contexts: how a
 * topos_exec (topos.h) resolves to the chain of backends a run offers its
 * tasks to (backend.h describes the seam, exec.c the dispatch).
 *
 * The registry is a fixed array appended under a mutex and published with
 * a release store of its length, so resolving a context takes no lock.
 * Nothing here is per thread: every run carries its own resolved context
 * (exec_env), so numerics, threads, the backend choice, cancellation and
 * the deadline are arguments, never ambient state.  The only process-wide
 * settings are the registry itself and the default thread count.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "internal.h"

/* Registry index 0 is the reference; backends take 1.. in registration
 * order.  tasks_run counts per index for the life of the process. */
static const topos_backend *chain[TOPOS_BACKENDS_MAX];
static atomic_int chain_len; /* backends, the reference not counted */
static pthread_mutex_t chain_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong tasks_run[TOPOS_BACKENDS_MAX];

static bool name_reserved(const char *name) {
  return strcmp(name, "reference") == 0 || strcmp(name, "auto") == 0 ||
         name[0] == '\0';
}

int topos_backend_register(const topos_backend *backend) {
  if (!backend || !backend->name || !backend->supports || !backend->run)
    return TOPOS_ERR_ARGUMENT;
  if (backend->fidelity != TOPOS_FIDELITY_EXACT &&
      backend->fidelity != TOPOS_FIDELITY_ENVELOPE)
    return TOPOS_ERR_ARGUMENT;
  if (name_reserved(backend->name) || strlen(backend->name) >= 32)
    return TOPOS_ERR_ARGUMENT;
  int rc = TOPOS_OK;
  pthread_mutex_lock(&chain_lock);
  int n = atomic_load_explicit(&chain_len, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    if (chain[i] == backend) goto done; /* idempotent */
    if (strcmp(chain[i]->name, backend->name) == 0) {
      rc = TOPOS_ERR_ARGUMENT; /* a second backend with a taken name */
      goto done;
    }
  }
  if (n == TOPOS_BACKENDS_MAX - 1) {
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

const topos_backend *topos_backend_find(const char *name) {
  if (!name) return NULL;
  int n = topos_backend_count();
  for (int i = 0; i < n; i++)
    if (strcmp(chain[i]->name, name) == 0) return chain[i];
  return NULL;
}

/* ------------------------------------------------------------- threads */

/*
 * The process default: backend_set_threads's override, else TOPOS_THREADS
 * (read once, capped at TOPOS_THREADS_MAX), else the online cores.  A
 * context's non-zero threads replaces it for that run, above it too (the
 * caller asked explicitly); the backends cap it at what their pools give.
 */
static atomic_int threads_override;
static int threads_default;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

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
  int o = atomic_load(&threads_override);
  if (o > 0) return o;
  pthread_once(&threads_once, threads_init);
  return threads_default;
}

void backend_set_threads(int threads) {
  atomic_store(&threads_override, threads > 0 ? threads : 0);
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

/* ------------------------------------------------------------ contexts */

int64_t topos_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* "reference, cpu, blas" into buf. */
static const char *known_names(char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "reference");
  int n = topos_backend_count();
  for (int i = 0; i < n && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, ", %s", chain[i]->name);
  return buf;
}

static void chain_add(exec_env *env, int i) {
  env->chain[env->nchain] = chain[i];
  env->chain_index[env->nchain] = (uint8_t)(i + 1);
  env->nchain++;
}

/* The chain's first backend sets the block size of split tasks. */
static int chain_done(exec_env *env) {
  env->task_block = env->nchain > 0 ? env->chain[0]->task_block : 0;
  return 0;
}

int exec_resolve(const topos_exec *ctx, exec_env *env, topos_error *err) {
  topos_exec dflt = {0};
  if (!ctx) ctx = &dflt;
  memset(env, 0, sizeof *env);
  if (ctx->numerics != TOPOS_NUMERICS_EXACT &&
      ctx->numerics != TOPOS_NUMERICS_FAST)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "context: unknown numerics %d (exact 0, fast 1)",
                     (int)ctx->numerics);
  if (ctx->threads < 0 || ctx->threads > TOPOS_THREADS_MAX)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "context: threads %d is out of range (0 = the process "
                     "default, at most %d)",
                     ctx->threads, TOPOS_THREADS_MAX);
  env->numerics = ctx->numerics;
  env->threads = ctx->threads > 0 ? ctx->threads : backend_threads();
  env->cancel = ctx->cancel;
  env->cancel_ctx = ctx->cancel_ctx;
  env->deadline_ns = ctx->deadline_ns;
  env->report = ctx->report;
  bool fast = ctx->numerics == TOPOS_NUMERICS_FAST;
  int n = topos_backend_count();
  const char *name = ctx->backend;
  if (!name || !*name || strcmp(name, "auto") == 0) {
    /* auto: registration order is preference order (the defaults put
     * the exact cpu backend before blas, which it outruns on this
     * hardware: docs/decisions.md); fast admits the envelope ones. */
    for (int i = 0; i < n; i++)
      if ((fast || chain[i]->fidelity == TOPOS_FIDELITY_EXACT) &&
          !chain[i]->named_only)
        chain_add(env, i);
    return chain_done(env);
  }
  if (strcmp(name, "reference") == 0) return chain_done(env);
  int chosen = -1;
  for (int i = 0; i < n; i++)
    if (strcmp(chain[i]->name, name) == 0) chosen = i;
  char known[256];
  if (chosen < 0)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "context: unknown backend '%.64s' (known: %s)", name,
                     known_names(known, sizeof known));
  if (!fast && chain[chosen]->fidelity != TOPOS_FIDELITY_EXACT)
    return error_set(err, TOPOS_ERR_ARGUMENT,
                     "context: backend '%s' has envelope fidelity and cannot "
                     "run exact numerics; ask for fast numerics (exact "
                     "backends: %s)",
                     name, known_names(known, sizeof known));
  /* The chosen backend first; what it declines goes to the exact
   * backends, never to a looser fidelity than asked. */
  chain_add(env, chosen);
  for (int i = 0; i < n; i++)
    if (i != chosen && chain[i]->fidelity == TOPOS_FIDELITY_EXACT &&
        !chain[i]->named_only)
      chain_add(env, i);
  return chain_done(env);
}

int topos_exec_check(const topos_exec *ctx, topos_error *err) {
  exec_env env;
  return exec_resolve(ctx, &env, err);
}

bool exec_stop(const exec_env *env, topos_error *err) {
  if (env->cancel && env->cancel(env->cancel_ctx)) {
    error_set(err, TOPOS_ERR_CANCELLED, "cancelled at a node boundary");
    return true;
  }
  if (env->deadline_ns > 0 && topos_now_ns() >= env->deadline_ns) {
    error_set(err, TOPOS_ERR_DEADLINE,
              "the deadline passed (stopped at a node boundary)");
    return true;
  }
  return false;
}

static void count(const exec_env *env, int index) {
  atomic_fetch_add_explicit(&tasks_run[index], 1, memory_order_relaxed);
  if (env->report) env->report->tasks[index]++;
}

void exec_reference_ran(const exec_env *env) {
  count(env, 0);
}

/* Offers t down env's chain: the first backend that takes it and succeeds
 * is counted; a backend's failure falls back silently to the next.
 * Returns whether one ran. */
static bool offer_chain(const exec_env *env, topos_task *t) {
  offer_hook_fn hook = atomic_load_explicit(&offer_hook, memory_order_acquire);
  if (hook) hook(t, atomic_load(&offer_hook_ctx));
  for (int i = 0; i < env->nchain; i++) {
    const topos_backend *b = env->chain[i];
    if (!b->supports(b, t)) continue;
    topos_error e = {0};
    if (b->run(b, t, &e) == TOPOS_OK) {
      count(env, env->chain_index[i]);
      return true;
    }
  }
  return false;
}

int exec_offer(const exec_env *env, topos_task *t) {
  t->threads = env->threads;
  if (offer_chain(env, t)) return 0;
  count(env, 0);
  return -1;
}

/* exec_units' wrapper around the kernel's units: the calling thread (slot
 * 0, in the serial loop and in every backend's pool) looks at the context
 * between units; once it has stopped, the units left return at once. */
typedef struct units_ctx {
  const exec_env *env;
  void (*fn)(void *arg, int64_t unit, int slot);
  void *arg;
  atomic_bool stopped;
  topos_error e; /* written by slot 0 only */
} units_ctx;

static void units_step(void *arg, int64_t unit, int slot) {
  units_ctx *c = arg;
  if (atomic_load_explicit(&c->stopped, memory_order_acquire)) return;
  if (slot == 0 && unit > 0 && kernel_stop(c->env, &c->e)) {
    atomic_store_explicit(&c->stopped, true, memory_order_release);
    return;
  }
  c->fn(c->arg, unit, slot);
}

int exec_unit_slots(const exec_env *env) {
  return env && env->threads > 1 ? env->threads : 1;
}

int exec_units(const exec_env *env,
               void (*fn)(void *arg, int64_t unit, int slot), void *arg,
               int64_t units, topos_error *err) {
  units_ctx c = {.env = env, .fn = fn, .arg = arg};
  atomic_init(&c.stopped, false);
  bool ran = false;
  /* Offered only where more than one thread could take it; a decline is
   * not counted as the reference's (the units are its kernel either way). */
  if (env && env->threads > 1 && units > 1) {
    topos_task t = {.kind = TOPOS_TASK_UNITS, .threads = env->threads};
    t.u.units = (topos_units_task){units_step, &c, units};
    ran = offer_chain(env, &t);
  }
  for (int64_t u = 0; !ran && u < units; u++) units_step(&c, u, 0);
  if (!atomic_load(&c.stopped)) return 0;
  if (err) *err = c.e;
  return -1;
}

/* ------------------------------------------------------------ listing */

const char *topos_task_ops(int kind) {
  switch (kind) {
    case TOPOS_TASK_GEMM:
      return "matmul";
    case TOPOS_TASK_WINDOW:
      return "fused conv2d (pad, unfold, permute, reshape, matmul)";
    case TOPOS_TASK_REDUCE:
      return "sum, sum_along";
    case TOPOS_TASK_MAP:
      return "neg, exp, log, sqrt, tanh, pow, relu, add, sub, mul, div, "
             "maximum, step";
    case TOPOS_TASK_ATTENTION:
      return "fused attention (matmul, mul, add, log_softmax, exp, matmul)";
    case TOPOS_TASK_UNITS:
      return "units of a reference kernel (fused conv and max-pool adjoints)";
  }
  return "?";
}

int topos_backends_list(topos_backend_info *out, int max) {
  int n = topos_backend_count();
  for (int i = 0; i <= n && i < max; i++) {
    topos_backend_info *b = &out[i];
    memset(b, 0, sizeof *b);
    b->index = i;
    b->tasks_run = atomic_load(&tasks_run[i]);
    if (i == 0) {
      snprintf(b->name, sizeof b->name, "reference");
      snprintf(b->fidelity, sizeof b->fidelity, "exact");
      b->tasks = (1u << TOPOS_TASK_GEMM) | (1u << TOPOS_TASK_WINDOW) |
                 (1u << TOPOS_TASK_REDUCE) | (1u << TOPOS_TASK_MAP) |
                 (1u << TOPOS_TASK_ATTENTION) | (1u << TOPOS_TASK_UNITS);
      b->dtypes = (1u << TOPOS_F32) | (1u << TOPOS_F64) | (1u << TOPOS_BF16) |
                  (1u << TOPOS_I32);
      snprintf(b->device, sizeof b->device,
               "portable C, the executable spec (every op)");
      b->threads = 1;
      continue;
    }
    const topos_backend *be = chain[i - 1];
    snprintf(b->name, sizeof b->name, "%s", be->name);
    snprintf(b->fidelity, sizeof b->fidelity, "%s",
             be->fidelity == TOPOS_FIDELITY_EXACT ? "exact" : "envelope");
    b->tasks = be->tasks;
    b->dtypes = be->dtypes;
    if (be->device) be->device(be, b->device, sizeof b->device);
    b->threads = be->max_threads ? be->max_threads(be) : 1;
  }
  return n + 1;
}

char *topos_exec_report_names(const topos_exec_report *report, char *buf,
                              size_t len) {
  if (!buf || len == 0) return buf;
  buf[0] = '\0';
  if (!report) return buf;
  size_t at = 0;
  int n = topos_backend_count();
  /* The backends first, the reference (what none took) last. */
  for (int k = 1; k <= n + 1 && at < len; k++) {
    int i = k <= n ? k : 0;
    if (report->tasks[i] == 0) continue;
    const char *name = i == 0 ? "reference" : chain[i - 1]->name;
    at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? "," : "", name);
  }
  return buf;
}
