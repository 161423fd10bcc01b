/*
 * soak.c - toposd under a long mixed and hostile load with periodic
 * kill -9 (issue 10, item 11; `make soak`, not part of `make test`).
 *
 * It starts its own toposd ($TOPOS_BUILD/bin/toposd, default build/) on
 * 127.0.0.1:0 with a temporary store and runs, for SOAK_SECONDS (or
 * --seconds N; default 600):
 *
 *  - a recorder: Record of ever new specs, Describe of earlier ones;
 *  - a trainer: Forward, Step (SGD, the parameters carried from step to
 *    step), Emit and Describe on an MLP spec;
 *  - an uploader: PutBlob of ever new blobs (16 KiB, every 40th 4 MiB),
 *    StatBlob of each, and a Forward summing every 10th by reference
 *    (the sum is exact, so a wrong byte shows);
 *  - a hostile client: random bytes to every method, truncated Forward
 *    requests, huge shapes, node names that are not UTF-8 or hold a NUL,
 *    unknown ids; and every 5 s a broadcast to a 6.4 GB tensor (a Forward
 *    of a few bytes) and a message over the daemon's limit;
 *  - idle TCP connections (more than the daemon's connection cap), some
 *    of them a half-sent HTTP/2 preface;
 *  - Stats and Health every second;
 *
 * and SIGKILLs the daemon every SOAK_KILL_SECONDS (--kill-every; default
 * 45, each interval uniform in [2/3, 4/3] of it), each time amid a burst
 * of 4 MiB uploads, restarting it on the same store.  After each restart every
 * spec and blob acknowledged since the previous check must be present (blobs
 * with their size), plus a sample of older ones; at the end the daemon is
 * killed and restarted once more and everything acknowledged is checked, then
 * it is stopped with SIGTERM (it must exit 0).
 *
 * It prints the calls served, the statuses by kind of call (calls that
 * overlapped a kill counted apart), the daemon's RSS over time (sampled
 * from /proc every SOAK_RSS_SECONDS, default 5) and acknowledged vs
 * present after every restart.  Exit status 1 when anything acknowledged
 * was lost, a value was wrong, the daemon died on its own or did not
 * drain cleanly, or a well-formed call failed outside a kill (each is
 * printed loudly); 2 when the soak could not run.  The store and log are
 * kept on failure (or with SOAK_KEEP=1).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "topos.h"
#include "topos.pb-c.h"
#include "topos_client.h"
#include "wire.h"

/* ------------------------------------------------------------- utilities */

static double t0;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double elapsed(void) {
  return now_s() - t0;
}

static void sleep_ms(int ms) {
  usleep((useconds_t)ms * 1000);
}

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "soak: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static long env_long(const char *name, long fallback) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return fallback;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v <= 0) die("%s: '%s' is not a positive number", name, s);
  return v;
}

/* Failures worth a non-zero exit, printed as they happen. */
static _Atomic int g_failures;
static pthread_mutex_t g_print = PTHREAD_MUTEX_INITIALIZER;

static void loud(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void loud(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_print);
  printf("[%7.1f s] !!! ", elapsed());
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  pthread_mutex_unlock(&g_print);
  va_end(ap);
  atomic_fetch_add(&g_failures, 1);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_print);
  printf("[%7.1f s] ", elapsed());
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  pthread_mutex_unlock(&g_print);
  va_end(ap);
}

/* ------------------------------------------------------------ the daemon */

/* The daemon's connection cap is below the idle connections opened, so
 * shedding is exercised; its message limit is what "oversized" exceeds. */
#define MAX_MESSAGE_BYTES ((size_t)16 << 20)
#define MAX_CONNECTIONS 48
#define IDLE_SOCKETS 64

static char g_dir[256], g_store[320], g_log[320];
static pid_t g_pid;
static _Atomic int g_port;  /* 0 while the daemon is down */
static _Atomic int g_epoch; /* odd while a kill and restart are under way */
static _Atomic bool g_stop;

static int daemon_start(void) {
  const char *build = getenv("TOPOS_BUILD");
  char bin[512];
  snprintf(bin, sizeof bin, "%s/bin/toposd", build && *build ? build : "build");
  int fds[2];
  if (pipe(fds) != 0) die("pipe: %s", strerror(errno));
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    int fd = open(g_log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) dup2(fd, STDERR_FILENO);
    char max_message[32], max_connections[32];
    snprintf(max_message, sizeof max_message, "%zu", MAX_MESSAGE_BYTES);
    snprintf(max_connections, sizeof max_connections, "%d", MAX_CONNECTIONS);
    execl(bin, bin, "--listen", "127.0.0.1:0", "--http", "off", "--store",
          g_store, "--blob-cap-bytes", "8G", "--max-message-bytes", max_message,
          "--max-connections", max_connections, "--idle-timeout-ms", "20000",
          (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[256] = {0};
  size_t len = 0;
  double until = now_s() + 60;
  while (len < sizeof line - 1 && !strchr(line, '\n') && now_s() < until) {
    struct pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fds[0], line + len, sizeof line - 1 - len);
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fds[0]);
  int port = 0;
  if (sscanf(line, "toposd listening on 127.0.0.1:%d", &port) != 1) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    die("%s did not start (log %s)", bin, g_log);
  }
  g_pid = pid;
  return port;
}

/* VmRSS of the daemon in KiB (0 when it cannot be read). */
static long daemon_rss_kib(void) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)g_pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* ------------------------------------------------------ call accounting */

enum {
  K_RECORD,
  K_DESCRIBE,
  K_FORWARD,
  K_STEP,
  K_EMIT,
  K_PUTBLOB,
  K_STATBLOB,
  K_STATS,
  K_HEALTH,
  K_NORMAL, /* the kinds above are well-formed calls */
  K_RANDOM = K_NORMAL,
  K_TRUNCATED,
  K_HUGE_SHAPE,
  K_BOMB,
  K_BAD_UTF8,
  K_UNKNOWN_ID,
  K_OVERSIZED,
  K_KINDS
};

static const char *const kind_names[K_KINDS] = {
    "Record",        "Describe",        "Forward",         "Step",
    "Emit",          "PutBlob",         "StatBlob",        "Stats",
    "Health",        "hostile: random", "hostile: trunc.", "hostile: shape",
    "hostile: bomb", "hostile: utf-8",  "hostile: no id",  "hostile: size",
};

enum { STATUSES = 17 };
static _Atomic long g_calls[K_KINDS][STATUSES];
static _Atomic long g_around_kill[STATUSES];

static const char *status_name(int s) {
  static const char *const names[STATUSES] = {
      "OK",        "CANCELLED", "UNKNOWN",    "INVALID_ARG", "DEADLINE",
      "NOT_FOUND", "EXISTS",    "PERMISSION", "RESOURCE_EX", "PRECONDITION",
      "ABORTED",   "RANGE",     "UNIMPL",     "INTERNAL",    "UNAVAILABLE",
      "DATA_LOSS", "UNAUTH"};
  return s >= 0 && s < STATUSES ? names[s] : "?";
}

/* Counts one call: `epoch` is g_epoch when it started.  A call that
 * overlapped a kill is counted apart; outside kills a well-formed call
 * must succeed (expected codes aside) and no call may be INTERNAL or
 * UNKNOWN. */
static void account(int kind, int epoch, int status, const char *message) {
  if (status < 0 || status >= STATUSES) status = 2; /* UNKNOWN */
  int now = atomic_load(&g_epoch);
  if (epoch != now || (epoch & 1)) {
    atomic_fetch_add(&g_around_kill[status], 1);
    return;
  }
  atomic_fetch_add(&g_calls[kind][status], 1);
  bool bad = status == 2 || status == 13 || status == 15;
  if (kind < K_NORMAL && status != 0) bad = true;
  if (bad)
    loud("%s answered %s outside a kill: %s", kind_names[kind],
         status_name(status), message ? message : "");
}

static int status_of(int rc, const topos_error *err) {
  return rc == TOPOS_OK ? 0 : topos_client_grpc_status(err->code);
}

/* ------------------------------------------------ acknowledged objects */

typedef struct acked {
  char id[65];
  int64_t bytes; /* blobs: the size PutBlob answered */
} acked;

typedef struct acked_list {
  pthread_mutex_t lock;
  acked *v;
  size_t n, cap;
  size_t checked; /* entries before this were acknowledged before a kill
                     and checked after it */
} acked_list;

static acked_list g_specs = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};
static acked_list g_blobs = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

static void acked_add(acked_list *l, const char *id, int64_t bytes) {
  pthread_mutex_lock(&l->lock);
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 1024;
    acked *v = realloc(l->v, cap * sizeof *v);
    if (v == NULL) die("out of memory");
    l->v = v;
    l->cap = cap;
  }
  memcpy(l->v[l->n].id, id, 65);
  l->v[l->n].bytes = bytes;
  l->n++;
  pthread_mutex_unlock(&l->lock);
}

/* Entry i (copied: the array may move). */
static acked acked_at(acked_list *l, size_t i) {
  pthread_mutex_lock(&l->lock);
  acked a = l->v[i];
  pthread_mutex_unlock(&l->lock);
  return a;
}

static size_t acked_count(acked_list *l) {
  pthread_mutex_lock(&l->lock);
  size_t n = l->n;
  pthread_mutex_unlock(&l->lock);
  return n;
}

/* ---------------------------------------------------------------- networks */

/* loss = (w·x − y)² + k: f64 scalars, a distinct spec for every k. */
static topos_network *gd_network(double k, const char *loss_name) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  topos_value w = topos_name(tape, topos_parameter(tape, zero), "w");
  topos_value x = topos_name(tape, topos_input(tape, zero), "x");
  topos_value y = topos_name(tape, topos_input(tape, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(tape, topos_mul(tape, w, x), y);
  topos_value sq =
      topos_add(tape, topos_mul(tape, r, r), topos_scalar(tape, k));
  topos_name(tape, sq, loss_name);
  topos_network *net = topos_tape_seal(tape, &err);
  if (net == NULL) die("gd network: %s", err.message);
  return net;
}

typedef struct mlp {
  topos_network *net;
  topos_value x, y, loss, logits;
  topos_tensor *xt, *yt;
} mlp;

static mlp mlp_network(void) {
  topos_error err = {0};
  mlp m;
  int64_t w1s[2] = {6, 16}, b1s[1] = {16}, w2s[2] = {16, 5}, b2s[1] = {5};
  int64_t xs[2] = {8, 6}, ys[1] = {8};
  topos_tensor *init[4] = {
      topos_init_normal(TOPOS_F32, 2, w1s, 0, 0.5, 11, &err),
      topos_tensor_zeros(TOPOS_F32, 1, b1s, &err),
      topos_init_normal(TOPOS_F32, 2, w2s, 0, 0.5, 12, &err),
      topos_tensor_zeros(TOPOS_F32, 1, b2s, &err),
  };
  m.xt = topos_init_normal(TOPOS_F32, 2, xs, 0, 1, 13, &err);
  int32_t labels[8] = {0, 1, 2, 3, 4, 0, 1, 2};
  m.yt = topos_tensor_from(TOPOS_I32, 1, ys, labels, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w1 = topos_name(tape, topos_parameter(tape, init[0]), "W1");
  topos_value b1 = topos_name(tape, topos_parameter(tape, init[1]), "b1");
  topos_value w2 = topos_name(tape, topos_parameter(tape, init[2]), "W2");
  topos_value b2 = topos_name(tape, topos_parameter(tape, init[3]), "b2");
  m.x = topos_name(tape, topos_input(tape, m.xt), "x");
  m.y = topos_name(tape, topos_input(tape, m.yt), "y");
  topos_value h = topos_tanh(tape, topos_linear(tape, m.x, w1, b1));
  m.logits = topos_name(tape, topos_linear(tape, h, w2, b2), "logits");
  m.loss = topos_name(tape, topos_cross_entropy(tape, m.logits, m.y), "loss");
  m.net = topos_tape_seal(tape, &err);
  if (m.net == NULL) die("mlp: %s", err.message);
  for (int i = 0; i < 4; i++) topos_tensor_release(init[i]);
  return m;
}

/* out = sum(p), p an f32 parameter of n elements. */
static topos_network *sum_network(int64_t n, topos_value *out) {
  topos_error err = {0};
  int64_t shape[1] = {n};
  topos_tensor *p0 = topos_tensor_zeros(TOPOS_F32, 1, shape, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value p = topos_name(tape, topos_parameter(tape, p0), "p");
  *out = topos_name(tape, topos_sum(tape, p), "out");
  topos_network *net = topos_tape_seal(tape, &err);
  if (net == NULL) die("sum network: %s", err.message);
  topos_tensor_release(p0);
  return net;
}

/* A 76-byte-class Forward bomb: a scalar broadcast to 40000 x 40000 f32
 * (6.4 GB), summed.  Admission control must refuse it. */
static topos_network *bomb_network(topos_value *out) {
  topos_error err = {0};
  topos_tensor *one = topos_tensor_scalar(TOPOS_F32, 1.0, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value p = topos_name(tape, topos_parameter(tape, one), "p");
  int64_t shape[2] = {40000, 40000};
  *out = topos_name(tape, topos_sum(tape, topos_broadcast(tape, p, 2, shape)),
                    "out");
  topos_network *net = topos_tape_seal(tape, &err);
  if (net == NULL) die("bomb network: %s", err.message);
  topos_tensor_release(one);
  return net;
}

/* ------------------------------------------------------------- workers */

/* A worker's connection, reopened when the daemon comes back on a new
 * port.  False while the daemon is down. */
typedef struct conn {
  topos_client *c;
  int port;
} conn;

static bool conn_ready(conn *k) {
  int port = atomic_load(&g_port);
  if (port == 0) {
    sleep_ms(5);
    return false;
  }
  if (port != k->port || k->c == NULL) {
    topos_client_close(k->c);
    char address[64];
    snprintf(address, sizeof address, "127.0.0.1:%d", port);
    topos_error err = {0};
    k->c = topos_client_connect(address, &err);
    if (k->c == NULL) die("connect %s: %s", address, err.message);
    topos_client_set_deadline(k->c, 30);
    k->port = port;
  }
  return true;
}

static void conn_close(conn *k) {
  topos_client_close(k->c);
  k->c = NULL;
}

/* Record: ever new specs; Describe an earlier one every tenth. */
static void *recorder_main(void *arg) {
  (void)arg;
  conn k = {0};
  uint64_t rng = 1;
  for (long i = 0; !atomic_load(&g_stop); i++) {
    if (!conn_ready(&k)) continue;
    topos_network *net = gd_network((double)i + 0.5, "loss");
    char id[65];
    topos_error err = {0};
    int epoch = atomic_load(&g_epoch);
    int rc = topos_client_record(k.c, net, id, &err);
    account(K_RECORD, epoch, status_of(rc, &err), err.message);
    if (rc == TOPOS_OK) acked_add(&g_specs, id, 0);
    topos_network_release(net);
    size_t n = acked_count(&g_specs);
    if (i % 10 == 0 && n > 0) {
      acked a = acked_at(&g_specs, splitmix64(&rng) % n);
      char *text = NULL;
      err = (topos_error){0};
      epoch = atomic_load(&g_epoch);
      rc = topos_client_describe(k.c, a.id, TOPOS_FORMAT_TEXT, &text, &err);
      account(K_DESCRIBE, epoch, status_of(rc, &err), err.message);
      topos_free(text);
    }
    sleep_ms(10);
  }
  conn_close(&k);
  return NULL;
}

/* Forward, Step (parameters carried on), Emit, Describe on an MLP. */
static void *trainer_main(void *arg) {
  (void)arg;
  conn k = {0};
  mlp m = mlp_network();
  topos_params *params = topos_network_parameters(m.net);
  topos_feed feeds[2] = {{m.x, m.xt}, {m.y, m.yt}};
  topos_optimizer sgd = topos_sgd(0.05, 0.0);
  topos_value roots[1] = {m.logits};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  char id[65] = "";
  int recorded_port = 0;
  for (long i = 0; !atomic_load(&g_stop); i++) {
    if (!conn_ready(&k)) continue;
    topos_error err = {0};
    int epoch = atomic_load(&g_epoch), rc;
    if (recorded_port != k.port) { /* idempotent; a fresh daemon has it */
      rc = topos_client_record(k.c, m.net, id, &err);
      account(K_RECORD, epoch, status_of(rc, &err), err.message);
      if (rc != TOPOS_OK) continue;
      recorded_port = k.port;
    }
    topos_tensor **out = NULL;
    err = (topos_error){0};
    epoch = atomic_load(&g_epoch);
    rc = topos_client_forward(k.c, id, &e, params, feeds, 2, &out, NULL, &err);
    account(K_FORWARD, epoch, status_of(rc, &err), err.message);
    if (rc == TOPOS_OK) topos_client_tensors_free(out, 1);
    topos_params *next = NULL;
    double loss = 0;
    err = (topos_error){0};
    epoch = atomic_load(&g_epoch);
    rc = topos_client_step(k.c, id, m.loss, params, feeds, 2, &sgd, NULL, &next,
                           NULL, &loss, &err);
    account(K_STEP, epoch, status_of(rc, &err), err.message);
    if (rc == TOPOS_OK) {
      topos_params_free(params);
      params = next;
    }
    if (i % 25 == 0) {
      char *text = NULL;
      err = (topos_error){0};
      epoch = atomic_load(&g_epoch);
      rc = topos_client_emit(k.c, id, &e, TOPOS_EMIT_PRETTY, &text, &err);
      account(K_EMIT, epoch, status_of(rc, &err), err.message);
      topos_free(text);
      text = NULL;
      err = (topos_error){0};
      epoch = atomic_load(&g_epoch);
      rc = topos_client_describe(k.c, id, TOPOS_FORMAT_JSON, &text, &err);
      account(K_DESCRIBE, epoch, status_of(rc, &err), err.message);
      topos_free(text);
    }
    sleep_ms(2);
  }
  conn_close(&k);
  topos_params_free(params);
  topos_tensor_release(m.xt);
  topos_tensor_release(m.yt);
  topos_network_release(m.net);
  return NULL;
}

enum { SMALL_BLOB = 4096, BIG_BLOB = 1 << 20 }; /* f32: 16 KiB, 4 MiB */

/* Blob i: small integers, so a float sum is exact in any order. */
static void fill_blob(float *v, int64_t n, long i) {
  for (int64_t j = 0; j < n; j++) v[j] = (float)((j * 7 + i) % 4);
  v[0] = (float)(i & 0xffff);
  v[1] = (float)(i >> 16);
}

static _Atomic long g_blob_checks;
/* Set before each kill: the uploader sends 4 MiB blobs back to back and
 * counts those acknowledged, so that every kill lands among uploads
 * (where a write-behind would lose what it acknowledged). */
static _Atomic bool g_burst;
static _Atomic int g_burst_acked;

/* PutBlob of ever new blobs, StatBlob of each, Forward on every tenth. */
static void *uploader_main(void *arg) {
  (void)arg;
  conn k = {0};
  float *data = malloc(sizeof(float) * BIG_BLOB);
  if (data == NULL) die("out of memory");
  topos_value small_out, big_out;
  topos_network *small_net = sum_network(SMALL_BLOB, &small_out);
  topos_network *big_net = sum_network(BIG_BLOB, &big_out);
  char small_id[65], big_id[65];
  int recorded_port = 0;
  for (long i = 0; !atomic_load(&g_stop); i++) {
    if (!conn_ready(&k)) continue;
    topos_error err = {0};
    int epoch = atomic_load(&g_epoch), rc;
    if (recorded_port != k.port) {
      rc = topos_client_record(k.c, small_net, small_id, &err);
      if (rc == TOPOS_OK) rc = topos_client_record(k.c, big_net, big_id, &err);
      account(K_RECORD, epoch, status_of(rc, &err), err.message);
      if (rc != TOPOS_OK) continue;
      recorded_port = k.port;
    }
    bool burst = atomic_load(&g_burst), big = burst || i % 40 == 0;
    int64_t n = big ? BIG_BLOB : SMALL_BLOB;
    fill_blob(data, n, i);
    topos_tensor *t = topos_tensor_from(TOPOS_F32, 1, &n, data, &err);
    topos_params *p = topos_params_new(1, &t, &err);
    topos_tensor_release(t);
    char id[65];
    int64_t bytes = 0;
    err = (topos_error){0};
    epoch = atomic_load(&g_epoch);
    rc = topos_client_put_blob(k.c, p, id, &bytes, &err);
    account(K_PUTBLOB, epoch, status_of(rc, &err), err.message);
    topos_params_free(p);
    if (rc == TOPOS_OK) {
      acked_add(&g_blobs, id, bytes);
      if (burst) atomic_fetch_add(&g_burst_acked, 1);
      bool present = false;
      int64_t size = 0;
      err = (topos_error){0};
      epoch = atomic_load(&g_epoch);
      rc = topos_client_stat_blob(k.c, id, &present, &size, &err);
      account(K_STATBLOB, epoch, status_of(rc, &err), err.message);
      if (rc == TOPOS_OK && (!present || size != bytes))
        loud("StatBlob right after PutBlob: present %d, %lld bytes of %lld",
             present, (long long)size, (long long)bytes);
      if (i % 10 == 0) {
        double want = 0;
        for (int64_t j = 0; j < n; j++) want += data[j];
        topos_value roots[1] = {big ? big_out : small_out};
        topos_entry e = {
            roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
        topos_client_args args = {0};
        args.params_blob = id;
        args.nparams_blob = 1;
        topos_tensor **out = NULL;
        err = (topos_error){0};
        epoch = atomic_load(&g_epoch);
        rc = topos_client_forward_with(k.c, big ? big_id : small_id, &e, &args,
                                       &out, NULL, &err);
        account(K_FORWARD, epoch, status_of(rc, &err), err.message);
        if (rc == TOPOS_OK) {
          double got = topos_tensor_get(out[0], NULL, &err);
          if (got != want)
            loud("blob %s: Forward sums it to %.1f, expected %.1f", id, got,
                 want);
          atomic_fetch_add(&g_blob_checks, 1);
          topos_client_tensors_free(out, 1);
        }
      }
    }
    if (!burst) sleep_ms(40);
  }
  conn_close(&k);
  free(data);
  topos_network_release(small_net);
  topos_network_release(big_net);
  return NULL;
}

static const char *const methods[] = {
    "Record",   "Describe",
    "Lower",    "Emit",
    "Forward",  "Backward",
    "Step",     "Conformance",
    "PutBlob",  "StatBlob",
    "Health",   "Stats",
    "Backends", "/topos.v1.Topos/Nope",
};

static void random_hex(uint64_t *rng, char id[65]) {
  for (int i = 0; i < 64; i++) id[i] = "0123456789abcdef"[splitmix64(rng) & 15];
  id[64] = '\0';
}

/* One raw call; counted as `kind`. */
static void hostile_call(conn *k, int kind, const char *method,
                         const uint8_t *msg, size_t len) {
  uint8_t *out = NULL;
  size_t out_len = 0;
  int status = 0;
  topos_error err = {0};
  int epoch = atomic_load(&g_epoch);
  int rc = topos_client_call_raw(k->c, method, msg, len, 30, &out, &out_len,
                                 &status, &err);
  account(kind, epoch, rc == TOPOS_OK ? 0 : status, err.message);
  free(out);
}

static uint8_t *pack_message(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len ? *len : 1);
  if (buf == NULL) die("out of memory");
  protobuf_c_message_pack(m, buf);
  return buf;
}

static void *hostile_main(void *arg) {
  (void)arg;
  conn k = {0};
  uint64_t rng = 99;
  mlp m = mlp_network();
  char mlp_id[65] = "";
  int recorded_port = 0;
  /* A well-formed Forward on the MLP, to truncate. */
  topos_error err = {0};
  topos_value roots[1] = {m.logits};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  topos_network_id(m.net, mlp_id, &err);
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = mlp_id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  topos_feed feeds[2] = {{m.x, m.xt}, {m.y, m.yt}};
  if (wire_feeds_to_proto(feeds, 2, &fr.feeds, &fr.n_feeds, &err) != TOPOS_OK)
    die("feeds: %s", err.message);
  size_t forward_len = 0;
  uint8_t *forward = pack_message(&fr.base, &forward_len);
  uint8_t *random = malloc(4096);
  if (random == NULL) die("out of memory");
  for (long i = 0; !atomic_load(&g_stop); i++) {
    if (!conn_ready(&k)) continue;
    if (recorded_port != k.port) {
      char id[65];
      err = (topos_error){0};
      int epoch = atomic_load(&g_epoch);
      int rc = topos_client_record(k.c, m.net, id, &err);
      account(K_RECORD, epoch, status_of(rc, &err), err.message);
      if (rc != TOPOS_OK) continue;
      recorded_port = k.port;
    }
    switch (i % 5) {
      case 0: { /* random bytes to a random method */
        size_t len = splitmix64(&rng) % 4096;
        for (size_t j = 0; j < len; j++) random[j] = (uint8_t)splitmix64(&rng);
        hostile_call(&k, K_RANDOM, methods[splitmix64(&rng) % 14], random, len);
        break;
      }
      case 1: /* a truncated Forward */
        hostile_call(&k, K_TRUNCATED, "Forward", forward,
                     splitmix64(&rng) % forward_len);
        break;
      case 2: { /* a huge shape with 4 bytes of data, as a parameter and in
                 * a blob */
        int64_t shape[2] = {(int64_t)1 << 31, (int64_t)1 << 31};
        float four = 4;
        Topos__V1__Tensor t = TOPOS__V1__TENSOR__INIT;
        t.dtype = TOPOS__V1__DTYPE__F32;
        t.n_shape = 2;
        t.shape = shape;
        t.data.len = sizeof four;
        t.data.data = (uint8_t *)&four;
        Topos__V1__Tensor *one[1] = {&t};
        size_t len = 0;
        uint8_t *msg;
        if (i % 2) {
          Topos__V1__ForwardRequest h = fr;
          h.parameters = one;
          h.n_parameters = 1;
          msg = pack_message(&h.base, &len);
          hostile_call(&k, K_HUGE_SHAPE, "Forward", msg, len);
        } else {
          Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
          pb.tensors = one;
          pb.n_tensors = 1;
          msg = pack_message(&pb.base, &len);
          hostile_call(&k, K_HUGE_SHAPE, "PutBlob", msg, len);
        }
        free(msg);
        break;
      }
      case 3: { /* a node name that is not UTF-8, or has a NUL inside */
        topos_network *net = gd_network((double)i, i % 2 ? "loss" : "lo#ss");
        Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
        if (wire_spec_from_network(net, &spec, &err) != TOPOS_OK)
          die("spec: %s", err.message);
        Topos__V1__Node *last = spec.nodes[spec.n_nodes - 1];
        char *old = last->name;
        char bad[] = "loss\xff\xfe";
        if (i % 2) last->name = bad;
        size_t len = 0;
        uint8_t *msg = pack_message(&spec.base, &len);
        uint8_t *at = i % 2 ? NULL : memmem(msg, len, "lo#ss", 5);
        if (at != NULL) at[2] = '\0'; /* "lo\0ss" on the wire */
        hostile_call(&k, K_BAD_UTF8, "Record", msg, len);
        free(msg);
        last->name = old;
        wire_message_clear(&spec.base);
        topos_network_release(net);
        break;
      }
      case 4: { /* unknown ids */
        char id[65];
        random_hex(&rng, id);
        Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
        dr.id = id;
        size_t len = 0;
        uint8_t *msg = pack_message(&dr.base, &len);
        hostile_call(&k, K_UNKNOWN_ID, "Describe", msg, len);
        free(msg);
        Topos__V1__ForwardRequest h = fr;
        h.id = id;
        msg = pack_message(&h.base, &len);
        hostile_call(&k, K_UNKNOWN_ID, "Forward", msg, len);
        free(msg);
        break;
      }
    }
    sleep_ms(2);
  }
  conn_close(&k);
  free(random);
  free(forward);
  wire_feeds_free_proto(fr.feeds, fr.n_feeds);
  wire_message_free(&fr.entry->base);
  topos_tensor_release(m.xt);
  topos_tensor_release(m.yt);
  topos_network_release(m.net);
  return NULL;
}

/* Every 5 s: the broadcast bomb, and a message over the daemon's limit
 * (apart from hostile_main, so that a slow refusal holds nothing up). */
static void *heavy_main(void *arg) {
  (void)arg;
  conn k = {0};
  topos_value bomb_out;
  topos_network *bomb = bomb_network(&bomb_out);
  char bomb_id[65] = "";
  int recorded_port = 0;
  topos_value roots[1] = {bomb_out};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  size_t big = MAX_MESSAGE_BYTES + 4096;
  uint8_t *huge = calloc(1, big);
  if (huge == NULL) die("out of memory");
  while (!atomic_load(&g_stop)) {
    if (!conn_ready(&k)) continue;
    topos_error err = {0};
    if (recorded_port != k.port) {
      int epoch = atomic_load(&g_epoch);
      int rc = topos_client_record(k.c, bomb, bomb_id, &err);
      account(K_RECORD, epoch, status_of(rc, &err), err.message);
      if (rc != TOPOS_OK) continue;
      recorded_port = k.port;
    }
    Topos__V1__ForwardRequest b = TOPOS__V1__FORWARD_REQUEST__INIT;
    b.id = bomb_id;
    b.entry = wire_entry_new(&e, NULL, &err);
    size_t len = 0;
    uint8_t *msg = pack_message(&b.base, &len);
    hostile_call(&k, K_BOMB, "Forward", msg, len);
    free(msg);
    wire_message_free(&b.entry->base);
    hostile_call(&k, K_OVERSIZED, "PutBlob", huge, big);
    for (int i = 0; i < 50 && !atomic_load(&g_stop); i++) sleep_ms(100);
  }
  conn_close(&k);
  free(huge);
  topos_network_release(bomb);
  return NULL;
}

/* Stats and Health every second. */
static _Atomic long g_stats_blobs, g_stats_specs, g_stats_requests;

static void *monitor_main(void *arg) {
  (void)arg;
  conn k = {0};
  while (!atomic_load(&g_stop)) {
    if (!conn_ready(&k)) continue;
    topos_client_stats_info si;
    topos_error err = {0};
    int epoch = atomic_load(&g_epoch);
    int rc = topos_client_stats(k.c, &si, &err);
    account(K_STATS, epoch, status_of(rc, &err), err.message);
    if (rc == TOPOS_OK) {
      atomic_store(&g_stats_blobs, si.blobs);
      atomic_store(&g_stats_specs, si.specs);
      atomic_store(&g_stats_requests, si.requests);
    }
    char status[32];
    err = (topos_error){0};
    epoch = atomic_load(&g_epoch);
    rc = topos_client_health(k.c, status, NULL, &err);
    account(K_HEALTH, epoch, status_of(rc, &err), err.message);
    sleep_ms(1000);
  }
  conn_close(&k);
  return NULL;
}

/* Idle TCP connections, more than the daemon's cap: some connect only,
 * some send half the HTTP/2 preface. */
static _Atomic long g_idle_opened, g_idle_shed;

static void *idler_main(void *arg) {
  (void)arg;
  int fds[IDLE_SOCKETS];
  for (int i = 0; i < IDLE_SOCKETS; i++) fds[i] = -1;
  int port = 0;
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  for (long tick = 0; !atomic_load(&g_stop); tick++) {
    int p = atomic_load(&g_port);
    if (p != port) {
      for (int i = 0; i < IDLE_SOCKETS; i++) {
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
      }
      port = p;
    }
    if (port != 0) {
      for (int i = 0; i < IDLE_SOCKETS; i++) {
        if (fds[i] >= 0) { /* closed by the daemon? */
          char c;
          ssize_t n = recv(fds[i], &c, 1, MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            close(fds[i]);
            fds[i] = -1;
            atomic_fetch_add(&g_idle_shed, 1);
          }
          continue;
        }
        if (tick % 2) continue; /* open at most half of them per tick */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
          if (fd >= 0) close(fd);
          continue;
        }
        if (i % 2) (void)!write(fd, preface, sizeof preface / 2);
        fds[i] = fd;
        atomic_fetch_add(&g_idle_opened, 1);
      }
    }
    sleep_ms(250);
  }
  for (int i = 0; i < IDLE_SOCKETS; i++)
    if (fds[i] >= 0) close(fds[i]);
  return NULL;
}

/* ------------------------------------------------------------- checks */

/* Whether the daemon holds it: 1 yes, 0 no, -1 no answer. */
static int spec_present(topos_client *c, const char *id) {
  for (int attempt = 0; attempt < 5; attempt++) {
    char *text = NULL;
    topos_error err = {0};
    int rc = topos_client_describe(c, id, TOPOS_FORMAT_TEXT, &text, &err);
    topos_free(text);
    if (rc == TOPOS_OK) return 1;
    if (topos_client_grpc_status(err.code) == 5) return 0; /* NOT_FOUND */
    sleep_ms(100);
  }
  return -1;
}

static int blob_present(topos_client *c, const acked *a) {
  for (int attempt = 0; attempt < 5; attempt++) {
    bool present = false;
    int64_t size = 0;
    topos_error err = {0};
    if (topos_client_stat_blob(c, a->id, &present, &size, &err) == TOPOS_OK)
      return present && size == a->bytes;
    sleep_ms(100);
  }
  return -1;
}

/* Checks everything acknowledged before the kill that is not checked yet
 * (all of it when `all`), and a sample of `sample` older ones. */
static void check_list(topos_client *c, acked_list *l, const char *noun,
                       size_t upto, bool all, int sample, uint64_t *rng,
                       char *line, size_t line_len) {
  size_t from = all ? 0 : l->checked;
  size_t checked = 0, present = 0, unanswered = 0;
  for (size_t i = from; i < upto; i++) {
    acked a = acked_at(l, i);
    int p = noun[0] == 's' ? spec_present(c, a.id) : blob_present(c, &a);
    checked++;
    if (p == 1) {
      present++;
    } else if (p == 0) {
      loud("LOST: acknowledged %.4s %s is not there after the restart", noun,
           a.id);
    } else {
      unanswered++;
    }
  }
  for (int s = 0; !all && from > 0 && s < sample; s++) {
    acked a = acked_at(l, splitmix64(rng) % from);
    int p = noun[0] == 's' ? spec_present(c, a.id) : blob_present(c, &a);
    checked++;
    if (p == 1) {
      present++;
    } else if (p == 0) {
      loud("LOST: acknowledged %.4s %s (an older one) is not there", noun,
           a.id);
    } else {
      unanswered++;
    }
  }
  if (unanswered)
    loud("%zu %s checks got no answer after the restart", unanswered, noun);
  l->checked = upto;
  snprintf(line, line_len,
           "%s: %zu acknowledged, %zu since the last check; %zu checked, "
           "%zu present",
           noun, upto, upto - from, checked, present);
}

static void check_acknowledged(int port, size_t specs, size_t blobs, bool all,
                               uint64_t *rng) {
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(address, &err);
  if (c == NULL) die("connect: %s", err.message);
  char a[200], b[200];
  check_list(c, &g_specs, "specs", specs, all, 300, rng, a, sizeof a);
  check_list(c, &g_blobs, "blobs", blobs, all, 300, rng, b, sizeof b);
  say("  %s", a);
  say("  %s", b);
  topos_client_close(c);
}

/* ------------------------------------------------------------------ main */

typedef struct rss_sample {
  double t;
  int life; /* which daemon: 0, then one more per restart */
  long kib;
  long calls;
} rss_sample;

static long calls_total(void) {
  long n = 0;
  for (int k = 0; k < K_KINDS; k++)
    for (int s = 0; s < STATUSES; s++) n += atomic_load(&g_calls[k][s]);
  for (int s = 0; s < STATUSES; s++) n += atomic_load(&g_around_kill[s]);
  return n;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Kills the daemon, restarts it on the same store; the time it took. */
static double kill_and_restart(int *life) {
  atomic_fetch_add(&g_epoch, 1); /* odd: down */
  kill(g_pid, SIGKILL);
  int status = 0;
  waitpid(g_pid, &status, 0);
  atomic_store(&g_port, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
    loud("the daemon had exited on its own before the kill (status %d)",
         status);
  double t = now_s();
  int port = daemon_start();
  atomic_store(&g_port, port);
  atomic_fetch_add(&g_epoch, 1); /* even: up */
  (*life)++;
  return now_s() - t;
}

int main(int argc, char **argv) {
  long seconds = env_long("SOAK_SECONDS", 600);
  long kill_every = env_long("SOAK_KILL_SECONDS", 45);
  long rss_every = env_long("SOAK_RSS_SECONDS", 5);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = atol(argv[++i]);
    } else if (strcmp(argv[i], "--kill-every") == 0 && i + 1 < argc) {
      kill_every = atol(argv[++i]);
    } else {
      fprintf(stderr,
              "usage: soak [--seconds N] [--kill-every N]\n"
              "  (or SOAK_SECONDS, SOAK_KILL_SECONDS, SOAK_RSS_SECONDS)\n");
      return 2;
    }
  }
  if (seconds <= 0 || kill_every <= 0) die("durations must be positive");
  signal(SIGPIPE, SIG_IGN);
  t0 = now_s();
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/toposd-soak-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(g_dir) == NULL) die("mkdtemp: %s", strerror(errno));
  snprintf(g_store, sizeof g_store, "%s/topos.db", g_dir);
  snprintf(g_log, sizeof g_log, "%s/toposd.log", g_dir);
  atomic_store(&g_port, daemon_start());
  say("soak: %ld s, kill -9 every %ld s on average, store %s", seconds,
      kill_every, g_store);

  enum { THREADS = 7 };
  pthread_t th[THREADS];
  void *(*mains[THREADS])(void *) = {recorder_main, trainer_main, uploader_main,
                                     hostile_main,  heavy_main,   monitor_main,
                                     idler_main};
  for (int i = 0; i < THREADS; i++)
    if (pthread_create(&th[i], NULL, mains[i], NULL) != 0)
      die("pthread_create failed");

  uint64_t rng = (uint64_t)getpid();
  int life = 0, kills = 0;
  enum { MAX_SAMPLES = 4096 };
  static rss_sample samples[MAX_SAMPLES];
  int nsamples = 0;
  double end = t0 + (double)seconds;
  double next_rss = now_s();
  double interval = (double)kill_every *
                    (2.0 + (double)(splitmix64(&rng) % 1000) / 500.0) / 3;
  double next_kill = now_s() + interval;
  while (now_s() < end) {
    sleep_ms(100);
    int status = 0;
    if (waitpid(g_pid, &status, WNOHANG) == g_pid) {
      loud("the daemon died on its own (%s %d); restarting it",
           WIFSIGNALED(status) ? "signal" : "exit status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      atomic_fetch_add(&g_epoch, 1);
      atomic_store(&g_port, 0);
      atomic_store(&g_port, daemon_start());
      atomic_fetch_add(&g_epoch, 1);
      life++;
    }
    if (now_s() >= next_rss && nsamples < MAX_SAMPLES) {
      samples[nsamples++] =
          (rss_sample){elapsed(), life, daemon_rss_kib(), calls_total()};
      next_rss += (double)rss_every;
    }
    if (now_s() >= next_kill && now_s() < end - 5) {
      /* In the middle of a burst of uploads. */
      atomic_store(&g_burst_acked, 0);
      atomic_store(&g_burst, true);
      double until = now_s() + 5;
      while (atomic_load(&g_burst_acked) < 3 && now_s() < until) sleep_ms(1);
      sleep_ms((int)(splitmix64(&rng) % 50));
      long rss = daemon_rss_kib();
      size_t specs = acked_count(&g_specs), blobs = acked_count(&g_blobs);
      double took = kill_and_restart(&life);
      atomic_store(&g_burst, false);
      kills++;
      say("kill %d: SIGKILL amid 4 MiB uploads at RSS %.1f MB, restarted in "
          "%.2f s",
          kills, (double)rss / 1024, took);
      check_acknowledged(atomic_load(&g_port), specs, blobs, false, &rng);
      interval = (double)kill_every *
                 (2.0 + (double)(splitmix64(&rng) % 1000) / 500.0) / 3;
      next_kill = now_s() + interval;
    }
  }
  atomic_store(&g_stop, true);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);

  /* The last word: one more kill, then everything acknowledged. */
  size_t specs = acked_count(&g_specs), blobs = acked_count(&g_blobs);
  double took = kill_and_restart(&life);
  kills++;
  say("final kill %d: restarted in %.2f s; checking everything acknowledged",
      kills, took);
  check_acknowledged(atomic_load(&g_port), specs, blobs, true, &rng);

  /* The summary. */
  long served = 0, ok = 0;
  for (int k = 0; k < K_KINDS; k++) {
    for (int s = 0; s < STATUSES; s++) served += g_calls[k][s];
    ok += g_calls[k][0];
  }
  long around = 0;
  for (int s = 0; s < STATUSES; s++) around += g_around_kill[s];
  printf(
      "\ncalls served outside kills: %ld (%ld OK); %ld more overlapped a "
      "kill; %.0f calls/s\n",
      served, ok, around, (double)(served + around) / (double)seconds);
  printf(
      "Forward checks of blob bytes: %ld; idle connections opened %ld, "
      "closed by the daemon %ld\n",
      atomic_load(&g_blob_checks), atomic_load(&g_idle_opened),
      atomic_load(&g_idle_shed));
  bool used[STATUSES] = {false};
  for (int k = 0; k < K_KINDS; k++)
    for (int s = 0; s < STATUSES; s++)
      if (g_calls[k][s]) used[s] = true;
  for (int s = 0; s < STATUSES; s++)
    if (g_around_kill[s]) used[s] = true;
  printf("\n%-18s", "status by call");
  for (int s = 0; s < STATUSES; s++)
    if (used[s]) printf(" %12s", status_name(s));
  printf("\n");
  for (int k = 0; k < K_KINDS; k++) {
    printf("%-18s", kind_names[k]);
    for (int s = 0; s < STATUSES; s++)
      if (used[s]) printf(" %12ld", (long)g_calls[k][s]);
    printf("\n");
  }
  printf("%-18s", "around a kill");
  for (int s = 0; s < STATUSES; s++)
    if (used[s]) printf(" %12ld", (long)g_around_kill[s]);
  printf("\n");

  printf("\ndaemon RSS (every %ld s%s)\n%8s %6s %10s %10s\n", rss_every,
         nsamples > 40 ? ", every few shown" : "", "t (s)", "life", "RSS (MB)",
         "calls");
  int stride = nsamples > 40 ? (nsamples + 39) / 40 : 1;
  long peak = 0;
  for (int i = 0; i < nsamples; i++) {
    if (samples[i].kib > peak) peak = samples[i].kib;
    if (i % stride == 0 || i == nsamples - 1)
      printf("%8.1f %6d %10.1f %10ld\n", samples[i].t, samples[i].life,
             (double)samples[i].kib / 1024, samples[i].calls);
  }
  printf("peak RSS %.1f MB over %d daemons (%d kills)\n", (double)peak / 1024,
         life + 1, kills);
  printf("last Stats: %ld specs, %ld blobs, %ld requests\n",
         atomic_load(&g_stats_specs), atomic_load(&g_stats_blobs),
         atomic_load(&g_stats_requests));

  /* A clean drain to finish. */
  kill(g_pid, SIGTERM);
  int status = 0;
  double until = now_s() + 30;
  while (waitpid(g_pid, &status, WNOHANG) != g_pid) {
    if (now_s() > until) {
      kill(g_pid, SIGKILL);
      waitpid(g_pid, &status, 0);
      loud("the daemon did not exit within 30 s of SIGTERM");
      break;
    }
    sleep_ms(20);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    loud("SIGTERM: the daemon's exit status is %d, not 0", status);

  int failures = atomic_load(&g_failures);
  if (failures == 0 && !getenv("SOAK_KEEP")) {
    nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  } else {
    printf("store and log kept in %s\n", g_dir);
  }
  printf("%s: %d failure%s\n", failures ? "SOAK FAILED" : "soak passed",
         failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
