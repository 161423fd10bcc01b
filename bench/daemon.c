/*
 * daemon.c - toposd's benchmark (issue 4, item 9): one table of figures,
 * each printed beside its target (docs/daemon.md explains every row).
 *
 *  1. Forward round trip on the gradient-descent spec, one call in flight:
 *     p50 and p99 latency (target p50 <= 200 µs on loopback).
 *  2. Step throughput on the same spec with 16 concurrent clients, each
 *     with its own connection and one call in flight (target >= 10,000
 *     calls/s on 2 cores, clients and daemon sharing them).
 *  3. Upload of a 100 MB parameter set with PutBlob (25 f32 tensors of
 *     4 MB; target >= 500 MB/s, MB = 10^6 bytes).
 *  4. A remote makemore MLP training step (client encodes parameters and
 *     batch, Step, client decodes parameters and state) over the
 *     in-process step of examples/makemore (a local trainer's
 *     topos_plan_step: forward + backward + SGD), and the same step on a
 *     Train stream (the session's parameters and state stay on the
 *     daemon; the client sends the batch and reads the loss, one step in
 *     flight).  Beside them the loopback floor: TCP round trips of the
 *     same request size with nothing but a busy wait of the in-process
 *     step's time on the other side (loopback_floor) - what any strictly
 *     serial remote step costs on this machine before gRPC, encoding or
 *     the step's own work.  Then 640 stream steps with the next message
 *     sent before the last reply is read (two in flight), one step and
 *     MM_PER_MESSAGE steps a message, in blocks alternating with
 *     in-process steps: the last is the pipelined remote step, target <=
 *     1.3x (issue 16; docs/decisions.md, "The remote-step aim is the
 *     pipelined stream").  Each ratio is the median over blocks of a
 *     block's remote time over the in-process time measured beside it.
 *     The parameters of every path are checked to be bit-identical
 *     afterwards.
 *  5. The HTTP gateway's GET /healthz under wrk (one thread, 8
 *     keep-alive connections, 5 s): requests/s and p99 latency, as wrk
 *     reports them (issue 12, item 7).
 *  6. GET /v1/specs/{id}?format=json of the recorded makemore MLP spec
 *     under the same wrk load: requests/s and p99.  Before any load, one
 *     gRPC Describe and one GET (untimed) put the decoded network in the
 *     daemon's cache (server/specs.c; the JSON is rendered on every call)
 *     and check that both return the same text.
 *  7. gRPC Describe (format JSON) of the same spec under a comparable
 *     load: one thread driving 8 channels, each on its own connection
 *     with one call in flight, for 5 s: calls/s and p99; then gRPC
 *     calls/s over HTTP requests/s, the HTTP per-request cost over
 *     gRPC's (aim: within 1.5x).
 *  Rows 5 and 6 need wrk (Debian package; `make deps` installs it); when
 *  it is missing they are skipped with a line saying so.
 *
 * It starts its own toposd ($TOPOS_BUILD/bin/toposd, default build/) on
 * 127.0.0.1:0 (gRPC) and 127.0.0.1:0 (--http, the JSON gateway) with a
 * temporary store, talks raw gRPC C core with
 * protobuf-c messages built by proto/wire.c (what libtoposclient does),
 * and stops the daemon with SIGTERM at the end.  The daemon runs with
 * GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (transparent huge pages for
 * malloc), which docs/architecture.md ("Platform facts") records measured to
 * cut the first-touch cost of large messages.  Times are medians after warm-up
 * unless the row says otherwise.  Exits 1 when a call fails (for rows 5 and 6:
 * a non-2xx response or a socket error counted by wrk, reported after the
 * table) or a bit check fails; a missed target is reported, not an error.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "topos.h"
#include "topos.pb-c.h"
#include "topos_client.h"
#include "wire.h"

/* ------------------------------------------------------------- utilities */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-quantile (0..1) of n values (sorts v). */
static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(q * (n - 1) + 0.5);
  return v[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

static void die(const char *what, const char *detail) {
  fprintf(stderr, "bench/daemon: %s: %s\n", what, detail ? detail : "failed");
  exit(1);
}

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ------------------------------------------------------------ the daemon */

static pid_t daemon_pid;
static char tmp_dir[256];

/* The gateway's port from the daemon's second line; 0 when none came. */
static int http_port;

static int line_count(const char *text) {
  int n = 0;
  for (; *text; text++) n += *text == '\n';
  return n;
}

static int daemon_start(void) {
  const char *build = getenv("TOPOS_BUILD");
  char bin[512], store[400], log[400];
  snprintf(bin, sizeof bin, "%s/bin/toposd", build && *build ? build : "build");
  const char *tmp = getenv("TMPDIR");
  snprintf(tmp_dir, sizeof tmp_dir, "%s/toposd-bench-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(tmp_dir) == NULL) die("mkdtemp", strerror(errno));
  snprintf(store, sizeof store, "%s/topos.db", tmp_dir);
  snprintf(log, sizeof log, "%s/toposd.log", tmp_dir);
  int fds[2];
  if (pipe(fds) != 0) die("pipe", strerror(errno));
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, STDERR_FILENO);
    setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", 1);
    execl(bin, bin, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
          "--store", store, "--blob-cap-bytes", "2G", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  daemon_pid = pid;
  /* Two lines: the gRPC address, then the HTTP gateway's. */
  char line[512] = {0};
  size_t len = 0;
  double until = now_s() + 60;
  while (len < sizeof line - 1 && line_count(line) < 2 && now_s() < until) {
    struct pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fds[0], line + len, sizeof line - 1 - len);
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fds[0]);
  int port = 0;
  if (sscanf(line, "toposd listening on 127.0.0.1:%d", &port) != 1)
    die("starting toposd", bin);
  const char *second = strchr(line, '\n');
  if (second == NULL ||
      sscanf(second + 1, "toposd http on 127.0.0.1:%d", &http_port) != 1)
    http_port = 0;
  return port;
}

static void daemon_stop(void) {
  if (daemon_pid <= 0) return;
  kill(daemon_pid, SIGTERM);
  int status = 0;
  waitpid(daemon_pid, &status, 0);
  daemon_pid = 0;
  if (getenv("TOPOS_BENCH_KEEP")) {
    fprintf(stderr, "bench/daemon: daemon log and store kept in %s\n", tmp_dir);
    return;
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "bench/daemon: could not remove %s\n", tmp_dir);
}

/* ------------------------------------------------------------ the client */

typedef struct client {
  grpc_channel *ch;
  grpc_completion_queue *cq;
  void *methods[16];
} client;

static const char *const method_names[] = {"Record", "Forward", "Step",
                                           "PutBlob", "Describe"};
enum { M_RECORD, M_FORWARD, M_STEP, M_PUTBLOB, M_DESCRIBE, N_METHODS };

static void client_open(client *c, int port) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  grpc_arg args[2];
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = -1;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = -1;
  grpc_channel_args chargs = {2, args};
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  c->ch = grpc_channel_create(target, cr, &chargs);
  grpc_channel_credentials_release(cr);
  c->cq = grpc_completion_queue_create_for_pluck(NULL);
  for (int i = 0; i < N_METHODS; i++) {
    char path[64];
    snprintf(path, sizeof path, "/topos.v1.Topos/%s", method_names[i]);
    c->methods[i] = grpc_channel_register_call(c->ch, path, NULL, NULL);
  }
}

static void client_close(client *c) {
  grpc_channel_destroy(c->ch);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_pluck(c->cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(c->cq);
}

static void no_free(void *p) {
  (void)p;
}

/* One unary call; the request bytes are sent without a copy.  Returns the
 * status; *out (malloc'd, may be NULL) and *out_len get the reply, or,
 * when out is NULL and slice is not, *slice gets it without a copy of its
 * own (one slice; grpc_slice_unref it). */
static int call_to(client *c, int method, const uint8_t *msg, size_t len,
                   uint8_t **out, size_t *out_len, grpc_slice *slice,
                   char *details, size_t details_len) {
  grpc_call *call = grpc_channel_create_registered_call(
      c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, c->methods[method],
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_seconds(120, GPR_TIMESPAN)),
      NULL);
  grpc_slice s =
      grpc_slice_new_with_user_data((void *)msg, len, no_free, (void *)msg);
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_metadata_array initial, trailing;
  grpc_metadata_array_init(&initial);
  grpc_metadata_array_init(&trailing);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &det;
  int tag = 0;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK)
    die("grpc", "start_batch");
  grpc_completion_queue_pluck(c->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                              NULL);
  if (out) *out = NULL;
  if (out_len) *out_len = 0;
  if (slice) *slice = grpc_empty_slice();
  if (recv != NULL) {
    if (slice && !out) {
      grpc_byte_buffer_reader rd;
      grpc_byte_buffer_reader_init(&rd, recv);
      *slice = grpc_byte_buffer_reader_readall(&rd);
      grpc_byte_buffer_reader_destroy(&rd);
    } else if (out) {
      grpc_byte_buffer_reader rd;
      grpc_byte_buffer_reader_init(&rd, recv);
      grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
      *out_len = GRPC_SLICE_LENGTH(all);
      *out = malloc(*out_len ? *out_len : 1);
      memcpy(*out, GRPC_SLICE_START_PTR(all), *out_len);
      grpc_slice_unref(all);
      grpc_byte_buffer_reader_destroy(&rd);
    }
    grpc_byte_buffer_destroy(recv);
  }
  if (details) {
    char *text = grpc_slice_to_c_string(det);
    snprintf(details, details_len, "%s", text);
    gpr_free(text);
  }
  grpc_byte_buffer_destroy(send);
  grpc_slice_unref(det);
  grpc_metadata_array_destroy(&initial);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
  return (int)status;
}

static int call(client *c, int method, const uint8_t *msg, size_t len,
                uint8_t **out, size_t *out_len, char *details,
                size_t details_len) {
  return call_to(c, method, msg, len, out, out_len, NULL, details, details_len);
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len ? *len : 1);
  if (buf == NULL) die("pack", "out of memory");
  protobuf_c_message_pack(m, buf);
  return buf;
}

/* Calls and unpacks; dies on any status but OK. */
static void *call_msg(client *c, int method, const ProtobufCMessage *m,
                      const ProtobufCMessageDescriptor *desc) {
  size_t len = 0;
  uint8_t *bytes = pack(m, &len);
  char details[512];
  /* The reply is unpacked from gRPC's slice, as libtoposclient does. */
  grpc_slice reply;
  int status = call_to(c, method, bytes, len, NULL, NULL, &reply, details,
                       sizeof details);
  free(bytes);
  if (status != GRPC_STATUS_OK) die(method_names[method], details);
  void *r = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(reply),
                                      GRPC_SLICE_START_PTR(reply));
  grpc_slice_unref(reply);
  if (r == NULL) die(method_names[method], "reply does not parse");
  return r;
}

static void record(client *c, const topos_network *net, char id[65]) {
  topos_error err = {0};
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  if (wire_spec_from_network(net, &spec, &err) != TOPOS_OK)
    die("spec", err.message);
  Topos__V1__RecordReply *r =
      call_msg(c, M_RECORD, &spec.base, &topos__v1__record_reply__descriptor);
  memcpy(id, r->id, 65);
  wire_message_free(&r->base);
  wire_message_clear(&spec.base);
}

/* ------------------------------------------------- gradient-descent spec */

typedef struct gd_net {
  topos_network *net;
  topos_value w, x, y, loss;
} gd_net;

static gd_net gd_network(void) {
  topos_error err = {0};
  gd_net g;
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  g.w = topos_name(tape, topos_parameter(tape, zero), "w");
  g.x = topos_name(tape, topos_input(tape, zero), "x");
  g.y = topos_name(tape, topos_input(tape, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(tape, topos_mul(tape, g.w, g.x), g.y);
  g.loss = topos_name(tape, topos_mul(tape, r, r), "loss");
  g.net = topos_tape_seal(tape, &err);
  if (g.net == NULL) die("gd network", err.message);
  return g;
}

/* A Step (or Forward) request of the GD spec with w, x, y as given. */
static uint8_t *gd_request(const gd_net *g, const char *id, bool step, double w,
                           double x, double y, size_t *len) {
  topos_error err = {0};
  topos_tensor *wt = topos_tensor_scalar(TOPOS_F64, w, &err);
  topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, x, &err);
  topos_tensor *yt = topos_tensor_scalar(TOPOS_F64, y, &err);
  topos_feed feeds[2] = {{g->x, xt}, {g->y, yt}};
  topos_params *p = topos_params_new(1, &wt, &err);
  Topos__V1__Tensor **pm = NULL;
  Topos__V1__Feed **fm = NULL;
  size_t np = 0, nf = 0;
  if (wire_tensors_from_params(p, &pm, &np, &err) != TOPOS_OK ||
      wire_feeds_to_proto(feeds, 2, &fm, &nf, &err) != TOPOS_OK)
    die("request", err.message);
  uint8_t *bytes;
  if (step) {
    Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
    sr.id = (char *)id;
    sr.loss = wire_value_new_index(g->loss.index);
    topos_optimizer sgd = topos_sgd(0.02, 0.0);
    Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
    wire_optimizer_to_proto(&sgd, p, &om, &err);
    sr.optimizer = &om;
    sr.parameters = pm;
    sr.n_parameters = np;
    sr.feeds = fm;
    sr.n_feeds = nf;
    bytes = pack(&sr.base, len);
    wire_message_clear(&om.base);
    wire_message_free(&sr.loss->base);
  } else {
    topos_value roots[1] = {g->loss};
    topos_entry e = {
        roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
    Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
    fr.id = (char *)id;
    fr.entry = wire_entry_new(&e, NULL, &err);
    fr.parameters = pm;
    fr.n_parameters = np;
    fr.feeds = fm;
    fr.n_feeds = nf;
    bytes = pack(&fr.base, len);
    wire_message_free(&fr.entry->base);
  }
  wire_tensors_free(pm, np);
  wire_feeds_free_proto(fm, nf);
  topos_params_free(p);
  topos_tensor_release(wt);
  topos_tensor_release(xt);
  topos_tensor_release(yt);
  return bytes;
}

/* ----------------------------------------------------- 1. Forward latency */

static void bench_forward_latency(int port, const gd_net *g, const char *id,
                                  double *p50, double *p99) {
  client c;
  client_open(&c, port);
  size_t len = 0;
  uint8_t *req = gd_request(g, id, false, 1.5, 2, 4, &len);
  enum { WARM = 1000, TIMED = 10000 };
  double *t = malloc(sizeof(double) * TIMED);
  char details[256];
  for (int i = 0; i < WARM + TIMED; i++) {
    double t0 = now_s();
    uint8_t *out = NULL;
    size_t out_len = 0;
    int status =
        call(&c, M_FORWARD, req, len, &out, &out_len, details, sizeof details);
    double dt = now_s() - t0;
    if (status != GRPC_STATUS_OK) die("Forward", details);
    free(out);
    if (i >= WARM) t[i - WARM] = dt * 1e6;
  }
  *p50 = quantile(t, TIMED, 0.50);
  *p99 = quantile(t, TIMED, 0.99);
  free(t);
  free(req);
  client_close(&c);
}

/* ---------------------------------------------------- 2. Step throughput */

typedef struct step_worker {
  int port;
  const gd_net *g;
  const char *id;
  int index;
  _Atomic int *phase; /* 0 warm-up, 1 timed, 2 stop */
  long timed_calls;
  int failures;
} step_worker;

static void *step_thread(void *arg) {
  step_worker *w = arg;
  client c;
  client_open(&c, w->port);
  size_t len = 0;
  uint8_t *req = gd_request(w->g, w->id, true, 0.1 * w->index, 1 + w->index % 3,
                            2 + 2 * (w->index % 3), &len);
  int phase;
  while ((phase = atomic_load(w->phase)) < 2) {
    uint8_t *out = NULL;
    size_t out_len = 0;
    int status = call(&c, M_STEP, req, len, &out, &out_len, NULL, 0);
    if (status != GRPC_STATUS_OK || out_len == 0) w->failures++;
    free(out);
    if (phase == 1 && atomic_load(w->phase) == 1) w->timed_calls++;
  }
  free(req);
  client_close(&c);
  return NULL;
}

static double bench_step_throughput(int port, const gd_net *g, const char *id) {
  enum { N = 16 };
  step_worker w[N];
  pthread_t th[N];
  _Atomic int phase = 0;
  for (int i = 0; i < N; i++) {
    w[i] = (step_worker){port, g, id, i, &phase, 0, 0};
    pthread_create(&th[i], NULL, step_thread, &w[i]);
  }
  usleep(1000000);
  atomic_store(&phase, 1);
  double t0 = now_s();
  usleep(4000000);
  atomic_store(&phase, 2);
  double dt = now_s() - t0;
  long calls = 0;
  int failures = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    calls += w[i].timed_calls;
    failures += w[i].failures;
  }
  if (failures) die("Step", "calls failed under load");
  return (double)calls / dt;
}

/* --------------------------------------------------------- 3. Upload */

/* Uploads 100 MB ROUNDS times after WARM untimed rounds.  With `idle`,
 * the daemon's store writer has finished the previous blob when the next
 * upload starts (one upload, as a client uploads a parameter set once);
 * without, uploads follow each other and share the cores with the store
 * writing the previous ones. */
static double bench_upload(int port, bool idle, double *best) {
  client c;
  client_open(&c, port);
  enum { TENSORS = 25, ELEMENTS = 1000000, WARM = 2, ROUNDS = 5 };
  float *data = malloc(sizeof(float) * (size_t)ELEMENTS * TENSORS);
  uint64_t seed = 7;
  for (size_t i = 0; i < (size_t)ELEMENTS * TENSORS; i++)
    data[i] = (float)(splitmix64(&seed) >> 40) * 0x1p-24f;
  Topos__V1__Tensor t[TENSORS];
  Topos__V1__Tensor *ptrs[TENSORS];
  int64_t shape[1] = {ELEMENTS};
  for (int i = 0; i < TENSORS; i++) {
    topos__v1__tensor__init(&t[i]);
    t[i].dtype = TOPOS__V1__DTYPE__F32;
    t[i].n_shape = 1;
    t[i].shape = shape;
    t[i].data.len = sizeof(float) * ELEMENTS;
    t[i].data.data = (uint8_t *)(data + (size_t)i * ELEMENTS);
    ptrs[i] = &t[i];
  }
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  pb.tensors = ptrs;
  pb.n_tensors = TENSORS;
  size_t len = protobuf_c_message_get_packed_size(&pb.base);
  uint8_t *msg = malloc(len);
  double rates[ROUNDS];
  char details[512];
  for (int round = -WARM; round < ROUNDS; round++) {
    data[0] = (float)round + (idle ? 0.5f : 0.0f); /* a new blob each time */
    protobuf_c_message_pack(&pb.base, msg);
    if (idle) usleep(1500000);
    double t0 = now_s();
    uint8_t *out = NULL;
    size_t out_len = 0;
    int status =
        call(&c, M_PUTBLOB, msg, len, &out, &out_len, details, sizeof details);
    double dt = now_s() - t0;
    if (status != GRPC_STATUS_OK) die("PutBlob", details);
    free(out);
    if (round >= 0) /* the first rounds warm the daemon's buffers up */
      rates[round] =
          (double)((size_t)ELEMENTS * TENSORS * sizeof(float)) / dt / 1e6;
  }
  *best = rates[0];
  for (int i = 1; i < ROUNDS; i++)
    if (rates[i] > *best) *best = rates[i];
  double median = quantile(rates, ROUNDS, 0.5);
  free(msg);
  free(data);
  client_close(&c);
  return median;
}

/* ------------------------------------------------------- 4. makemore step */

enum { VOCAB = 27, CONTEXT = 3, EMBED = 10, HIDDEN = 100, BATCH = 64 };

typedef struct mm_model {
  topos_network *net;
  topos_value x, y, loss;
} mm_model;

/* The network of examples/makemore/makemore_mlp.c, same initialisation. */
static mm_model mm_build(void) {
  topos_error err = {0};
  const topos_dtype dt = TOPOS_F32;
  int64_t c_shape[2] = {VOCAB, EMBED};
  int64_t w1_shape[2] = {CONTEXT * EMBED, HIDDEN};
  int64_t b1_shape[1] = {HIDDEN};
  int64_t w2_shape[2] = {HIDDEN, VOCAB};
  int64_t b2_shape[1] = {VOCAB};
  int64_t x_shape[2] = {BATCH, CONTEXT};
  int64_t y_shape[1] = {BATCH};
  topos_tensor *init[7] = {
      topos_init_normal(dt, 2, c_shape, 0.0, 1.0, 1, &err),
      topos_init_kaiming(dt, 2, w1_shape, CONTEXT * EMBED, 2, &err),
      topos_tensor_zeros(dt, 1, b1_shape, &err),
      topos_init_normal(dt, 2, w2_shape, 0.0, 0.01, 3, &err),
      topos_tensor_zeros(dt, 1, b2_shape, &err),
      topos_tensor_zeros(TOPOS_I32, 2, x_shape, &err),
      topos_tensor_zeros(TOPOS_I32, 1, y_shape, &err),
  };
  mm_model m;
  topos_tape *tape = topos_tape_new(dt);
  topos_value c = topos_name(tape, topos_parameter(tape, init[0]), "C");
  topos_value w1 = topos_name(tape, topos_parameter(tape, init[1]), "W1");
  topos_value b1 = topos_name(tape, topos_parameter(tape, init[2]), "b1");
  topos_value w2 = topos_name(tape, topos_parameter(tape, init[3]), "W2");
  topos_value b2 = topos_name(tape, topos_parameter(tape, init[4]), "b2");
  m.x = topos_name(tape, topos_input(tape, init[5]), "x");
  m.y = topos_name(tape, topos_input(tape, init[6]), "y");
  int64_t flat[2] = {BATCH, CONTEXT * EMBED};
  topos_value emb = topos_reshape(tape, topos_embedding(tape, c, m.x), 2, flat);
  topos_value h = topos_tanh(tape, topos_linear(tape, emb, w1, b1));
  topos_value logits = topos_linear(tape, h, w2, b2);
  m.loss = topos_name(tape, topos_cross_entropy(tape, logits, m.y), "loss");
  m.net = topos_tape_seal(tape, &err);
  if (m.net == NULL) die("makemore network", err.message);
  for (int i = 0; i < 7; i++) topos_tensor_release(init[i]);
  return m;
}

typedef struct mm_batch {
  topos_tensor *x, *y;
} mm_batch;

static mm_batch mm_batch_make(uint64_t *seed) {
  int32_t x[BATCH * CONTEXT], y[BATCH];
  for (int i = 0; i < BATCH * CONTEXT; i++)
    x[i] = (int32_t)(splitmix64(seed) % VOCAB);
  for (int i = 0; i < BATCH; i++) y[i] = (int32_t)(splitmix64(seed) % VOCAB);
  int64_t xs[2] = {BATCH, CONTEXT}, ys[1] = {BATCH};
  topos_error err = {0};
  mm_batch b = {topos_tensor_from(TOPOS_I32, 2, xs, x, &err),
                topos_tensor_from(TOPOS_I32, 1, ys, y, &err)};
  if (!b.x || !b.y) die("batch", err.message);
  return b;
}

/* The in-process step of examples/makemore: a local trainer's (one
 * topos_plan_step on a training plan, as the daemon's Step takes it). */
static void mm_local_step(topos_trainer *tr, const mm_model *m,
                          const topos_optimizer *opt, topos_params **params,
                          topos_opt_state **state, const mm_batch *b) {
  topos_error err = {0};
  topos_feed feeds[2] = {{m->x, b->x}, {m->y, b->y}};
  topos_step_result r;
  if (topos_trainer_step(tr, *params, feeds, 2, opt, *state, &r, &err) !=
      TOPOS_OK)
    die("in-process step", err.message);
  topos_params_free(*params);
  topos_opt_state_free(*state);
  *params = r.params;
  *state = r.state;
  r.params = NULL;
  r.state = NULL;
  topos_step_result_clear(&r);
}

/* The same step through the daemon, with everything a remote client does:
 * encode parameters, state and batch, call, decode parameters and state. */
static void mm_remote_step(client *c, const char *id, const mm_model *m,
                           const topos_optimizer *opt, topos_params **params,
                           topos_opt_state **state, const mm_batch *b) {
  topos_error err = {0};
  topos_feed feeds[2] = {{m->x, b->x}, {m->y, b->y}};
  Topos__V1__StepRequest sr = TOPOS__V1__STEP_REQUEST__INIT;
  sr.id = (char *)id;
  Topos__V1__Value loss = TOPOS__V1__VALUE__INIT;
  loss.ref_case = TOPOS__V1__VALUE__REF_INDEX;
  loss.index = m->loss.index;
  sr.loss = &loss;
  Topos__V1__Optimizer om = TOPOS__V1__OPTIMIZER__INIT;
  if (wire_optimizer_to_proto(opt, *params, &om, &err) != TOPOS_OK ||
      wire_tensors_from_params(*params, &sr.parameters, &sr.n_parameters,
                               &err) != TOPOS_OK ||
      wire_feeds_to_proto(feeds, 2, &sr.feeds, &sr.n_feeds, &err) != TOPOS_OK)
    die("encoding a step", err.message);
  sr.optimizer = &om;
  if (*state) sr.state = wire_state_new(*state, &err);
  Topos__V1__StepReply *r =
      call_msg(c, M_STEP, &sr.base, &topos__v1__step_reply__descriptor);
  topos_params *next = NULL;
  topos_opt_state *next_state = NULL;
  if (wire_params_from_proto(r->parameters, r->n_parameters, NULL, "parameters",
                             &next, &err) != TOPOS_OK ||
      wire_state_from_proto(r->state, NULL, &next_state, &err) != TOPOS_OK)
    die("decoding a step", err.message);
  wire_message_free(&r->base);
  if (sr.state) wire_message_free(&sr.state->base);
  wire_tensors_free(sr.parameters, sr.n_parameters);
  wire_feeds_free_proto(sr.feeds, sr.n_feeds);
  wire_message_clear(&om.base);
  topos_params_free(*params);
  topos_opt_state_free(*state);
  *params = next;
  *state = next_state;
}

/* The same step on a Train stream: the batch goes, the loss comes back. */
static void mm_stream_step(topos_client_train *t, const mm_model *m,
                           const mm_batch *b) {
  topos_error err = {0};
  topos_feed feeds[2] = {{m->x, b->x}, {m->y, b->y}};
  topos_client_train_reply r;
  if (topos_client_train_step(t, feeds, 2, false, &r, &err) != TOPOS_OK)
    die("stream step", err.message);
  topos_client_train_reply_clear(&r);
}

enum { MM_PER_MESSAGE = 8 };

typedef struct mm_figures {
  double local_us, remote_us, stream_us;
  /* Side by side: in-process, two steps in flight, MM_PER_MESSAGE steps
   * per message. */
  double piped_local_us, piped_us, multi_us;
  /* Each row's ratio: the median over blocks of the block's remote time
   * over the in-process time of the same block (paired, so a VM whose
   * speed wanders between blocks moves both sides of a ratio). */
  double remote_x, stream_x, piped_x, multi_x;
  /* The loopback floor under one step in flight (loopback_floor). */
  double floor_us, floor_x;
  size_t request_bytes;
} mm_figures;

/* The median of num[i] / den[i] over n blocks. */
static double paired_ratio(const double *num, const double *den, int n) {
  double r[64];
  if (n > 64) die("paired_ratio", "too many blocks");
  for (int i = 0; i < n; i++) r[i] = num[i] / den[i];
  return quantile(r, n, 0.5);
}

static topos_client_train *mm_stream_open(topos_client *tc, const char *id,
                                          const mm_model *m,
                                          const topos_optimizer *opt) {
  topos_error err = {0};
  topos_client_train *t =
      topos_client_train_open(tc, id, m->loss, NULL, opt, NULL, &err);
  if (t == NULL) die("Train open", err.message);
  return t;
}

/* The stream's final parameters, checked against the in-process ones. */
static void mm_stream_check(topos_client_train *t, const topos_params *want,
                            const char *what) {
  topos_error err = {0};
  topos_params *got = NULL;
  if (topos_client_train_close(t, &got, NULL, &err) != TOPOS_OK)
    die("Train close", err.message);
  if (!topos_params_bitwise_equal(got, want))
    die(what, "stream and in-process parameters differ");
  topos_params_free(got);
  topos_client_train_free(t);
}

/* Sends MM_PER_MESSAGE steps in one message. */
static void mm_multi_send(topos_client_train *t, const mm_model *m,
                          const mm_batch *batches, int nb, int *step) {
  topos_feed feeds[2 * MM_PER_MESSAGE];
  for (int i = 0; i < MM_PER_MESSAGE; i++) {
    const mm_batch *b = &batches[(*step)++ % nb];
    feeds[2 * i] = (topos_feed){m->x, b->x};
    feeds[2 * i + 1] = (topos_feed){m->y, b->y};
  }
  topos_error err = {0};
  if (topos_client_train_send_steps(t, feeds, 2, MM_PER_MESSAGE, false, &err) !=
      TOPOS_OK)
    die("stream steps", err.message);
}

static void mm_multi_recv(topos_client_train *t) {
  topos_error err = {0};
  topos_client_train_reply r;
  if (topos_client_train_recv(t, &r, &err) != TOPOS_OK)
    die("stream steps", err.message);
  if (r.nlosses != MM_PER_MESSAGE) die("stream steps", "missing losses");
  topos_client_train_reply_clear(&r);
}

/* Stream steps with the next batch sent before the last loss is read, and
 * MM_PER_MESSAGE steps per message, in blocks alternating with in-process
 * steps from the same start. */
static void bench_makemore_piped(topos_client *tc, const char *id,
                                 const mm_model *m, const mm_batch *batches,
                                 int nb, mm_figures *f) {
  enum { BLOCKS = 20, STEPS = 32 };
  topos_error err = {0};
  topos_optimizer opt = topos_sgd(0.1, 0.0);
  topos_params *lp = topos_network_parameters(m->net);
  topos_opt_state *ls = topos_opt_state_new(&opt, lp, &err);
  topos_trainer *tr = topos_trainer_local(m->net, m->loss, NULL, 0, NULL, &err);
  if (tr == NULL) die("makemore trainer", err.message);
  topos_client_train *t = mm_stream_open(tc, id, m, &opt);
  topos_client_train *mt = mm_stream_open(tc, id, m, &opt);
  double lt[BLOCKS], pt[BLOCKS], mtt[BLOCKS];
  int step_l = 0, step_p = 0, step_m = 0;
  for (int blk = 0; blk < BLOCKS; blk++) {
    double t0 = now_s();
    for (int s = 0; s < STEPS; s++)
      mm_local_step(tr, m, &opt, &lp, &ls, &batches[step_l++ % nb]);
    lt[blk] = (now_s() - t0) / STEPS * 1e6;
    t0 = now_s();
    /* Two messages in flight: the next is sent before the last reply. */
    for (int s = 0; s < STEPS; s += MM_PER_MESSAGE) {
      mm_multi_send(mt, m, batches, nb, &step_m);
      if (s > 0) mm_multi_recv(mt);
    }
    mm_multi_recv(mt);
    mtt[blk] = (now_s() - t0) / STEPS * 1e6;
    t0 = now_s();
    for (int s = 0; s < STEPS; s++) {
      const mm_batch *b = &batches[step_p++ % nb];
      topos_feed feeds[2] = {{m->x, b->x}, {m->y, b->y}};
      if (topos_client_train_send(t, feeds, 2, false, &err) != TOPOS_OK)
        die("stream send", err.message);
      /* Two in flight: the reply of the step before this one. */
      if (s > 0 && topos_client_train_recv(t, NULL, &err) != TOPOS_OK)
        die("stream recv", err.message);
    }
    if (topos_client_train_recv(t, NULL, &err) != TOPOS_OK)
      die("stream recv", err.message);
    pt[blk] = (now_s() - t0) / STEPS * 1e6;
  }
  mm_stream_check(t, lp, "makemore (two in flight)");
  mm_stream_check(mt, lp, "makemore (steps per message)");
  f->piped_x = paired_ratio(pt, lt, BLOCKS);
  f->multi_x = paired_ratio(mtt, lt, BLOCKS);
  f->piped_local_us = quantile(lt, BLOCKS, 0.5);
  f->piped_us = quantile(pt, BLOCKS, 0.5);
  f->multi_us = quantile(mtt, BLOCKS, 0.5);
  topos_params_free(lp);
  topos_opt_state_free(ls);
  topos_trainer_free(tr);
}

/* The packed size of one step's TrainRequest (its feeds). */
static size_t mm_request_bytes(const mm_model *m, const mm_batch *b) {
  topos_feed feeds[2] = {{m->x, b->x}, {m->y, b->y}};
  Topos__V1__TrainRequest req = TOPOS__V1__TRAIN_REQUEST__INIT;
  topos_error err = {0};
  if (wire_feeds_to_proto(feeds, 2, &req.feeds, &req.n_feeds, &err) != TOPOS_OK)
    die("encoding a batch", err.message);
  size_t n = topos__v1__train_request__get_packed_size(&req);
  wire_feeds_free_proto(req.feeds, req.n_feeds);
  return n;
}

/* ----------------------------------------------- the loopback floor */

/* What the kernel alone charges a strictly serial remote step on this
 * machine: TCP round trips on loopback, requests of a step's size, a
 * 16-byte reply (a loss), between a requester that sleeps in recv until
 * its reply comes (as a client waiting for its step) and a responder
 * that polls its socket, yielding between looks (as the daemon's
 * threads do after work), and is busy for the in-process step's time on
 * each request.  No gRPC, no encoding, no step: what is left of a
 * remote step's time with every cost of topos's own removed. */
enum { FLOOR_REPLY = 16 };

typedef struct floor_side {
  int fd;
  size_t request;
  double work_us;
} floor_side;

static bool floor_read(int fd, char *buf, size_t n, bool poll_it) {
  for (size_t got = 0; got < n;) {
    ssize_t r = recv(fd, buf + got, n - got, poll_it ? MSG_DONTWAIT : 0);
    if (r > 0)
      got += (size_t)r;
    else if (r == 0 || (errno != EAGAIN && errno != EINTR))
      return false;
    else if (poll_it)
      sched_yield();
  }
  return true;
}

static void *floor_responder(void *arg) {
  const floor_side *fs = arg;
  char *buf = calloc(1, fs->request);
  while (buf && floor_read(fs->fd, buf, fs->request, true)) {
    double until = now_s() + fs->work_us * 1e-6;
    while (now_s() < until) {
    }
    if (send(fs->fd, buf, FLOOR_REPLY, MSG_NOSIGNAL) != FLOOR_REPLY) break;
  }
  free(buf);
  return NULL;
}

/* Round trips in blocks; *us is the median block's time per round trip,
 * *x the median of each block's time over work_us. */
static void loopback_floor(size_t request, double work_us, double *us,
                           double *x) {
  enum { BLOCKS = 20, TRIPS = 40 };
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(ls, 1) != 0 || getsockname(ls, (struct sockaddr *)&a, &alen) != 0)
    die("loopback floor", strerror(errno));
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
    die("loopback floor", strerror(errno));
  int srv = accept(ls, NULL, NULL);
  if (srv < 0) die("loopback floor", strerror(errno));
  close(ls);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(srv, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  floor_side fs = {srv, request, work_us};
  pthread_t th;
  if (pthread_create(&th, NULL, floor_responder, &fs) != 0)
    die("loopback floor", "pthread_create");
  char *buf = calloc(1, request);
  if (buf == NULL) die("loopback floor", "out of memory");
  double per[BLOCKS], ratio[BLOCKS];
  for (int blk = -2; blk < BLOCKS; blk++) {
    double t0 = now_s();
    for (int i = 0; i < TRIPS; i++)
      if (send(c, buf, request, MSG_NOSIGNAL) != (ssize_t)request ||
          !floor_read(c, buf, FLOOR_REPLY, false))
        die("loopback floor", "a round trip failed");
    double t = (now_s() - t0) / TRIPS * 1e6;
    if (blk >= 0) {
      per[blk] = t;
      ratio[blk] = t / work_us;
    }
  }
  close(c); /* the responder reads the end and returns */
  pthread_join(th, NULL);
  close(srv);
  free(buf);
  *us = quantile(per, BLOCKS, 0.5);
  *x = quantile(ratio, BLOCKS, 0.5);
}

static void bench_makemore(int port, mm_figures *f) {
  client c;
  client_open(&c, port);
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", port);
  topos_error cerr = {0};
  topos_client *tc = topos_client_connect(address, &cerr);
  if (tc == NULL) die("connect", cerr.message);
  topos_error err = {0};
  mm_model m = mm_build();
  char id[65];
  record(&c, m.net, id);
  enum { NB = 32, WARM_BLOCKS = 6, BLOCKS = 40, STEPS = 10 };
  mm_batch batches[NB];
  uint64_t seed = 42;
  for (int i = 0; i < NB; i++) batches[i] = mm_batch_make(&seed);
  topos_optimizer opt = topos_sgd(0.1, 0.0);
  topos_params *lp = topos_network_parameters(m.net);
  topos_params *rp = topos_network_parameters(m.net);
  topos_opt_state *ls = topos_opt_state_new(&opt, lp, &err);
  topos_opt_state *rs = topos_opt_state_new(&opt, rp, &err);
  topos_trainer *tr = topos_trainer_local(m.net, m.loss, NULL, 0, NULL, &err);
  if (tr == NULL) die("makemore trainer", err.message);
  topos_client_train *st = mm_stream_open(tc, id, &m, &opt);
  double lt[BLOCKS], rt[BLOCKS], stt[BLOCKS];
  int step_l = 0, step_r = 0, step_s = 0;
  for (int blk = 0; blk < WARM_BLOCKS + BLOCKS; blk++) {
    /* The three paths in a rotating order, block by block. */
    for (int order = 0; order < 3; order++) {
      int path = (order + blk) % 3; /* 0 local, 1 unary Step, 2 stream */
      double t0 = now_s();
      for (int s = 0; s < STEPS; s++) {
        if (path == 0)
          mm_local_step(tr, &m, &opt, &lp, &ls, &batches[step_l++ % NB]);
        else if (path == 1)
          mm_remote_step(&c, id, &m, &opt, &rp, &rs, &batches[step_r++ % NB]);
        else
          mm_stream_step(st, &m, &batches[step_s++ % NB]);
      }
      double per = (now_s() - t0) / STEPS * 1e6;
      double *row = path == 0 ? lt : path == 1 ? rt : stt;
      if (blk >= WARM_BLOCKS) row[blk - WARM_BLOCKS] = per;
    }
  }
  if (!topos_params_bitwise_equal(lp, rp))
    die("makemore", "remote and in-process parameters differ");
  mm_stream_check(st, lp, "makemore (stream)");
  f->remote_x = paired_ratio(rt, lt, BLOCKS);
  f->stream_x = paired_ratio(stt, lt, BLOCKS);
  f->local_us = quantile(lt, BLOCKS, 0.5);
  f->remote_us = quantile(rt, BLOCKS, 0.5);
  f->stream_us = quantile(stt, BLOCKS, 0.5);
  bench_makemore_piped(tc, id, &m, batches, NB, f);
  f->request_bytes = mm_request_bytes(&m, &batches[0]);
  loopback_floor(f->request_bytes, f->local_us, &f->floor_us, &f->floor_x);
  for (int i = 0; i < NB; i++) {
    topos_tensor_release(batches[i].x);
    topos_tensor_release(batches[i].y);
  }
  topos_params_free(lp);
  topos_params_free(rp);
  topos_opt_state_free(ls);
  topos_opt_state_free(rs);
  topos_trainer_free(tr);
  topos_network_release(m.net);
  client_close(&c);
  topos_client_close(tc);
}

/* ------------------------------------- 5-7. HTTP gateway against gRPC */

/* Both sides run LOAD_CONNECTIONS connections for LOAD_SECONDS: wrk with
 * one thread (its event loop keeps one request in flight per connection),
 * the gRPC side with one thread driving as many channels. */
enum { LOAD_CONNECTIONS = 8, LOAD_SECONDS = 5 };

/* Whether an executable called name is on $PATH. */
static bool on_path(const char *name) {
  const char *path = getenv("PATH");
  if (path == NULL) return false;
  while (*path) {
    size_t n = strcspn(path, ":");
    char full[1024];
    snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? path : ".", name);
    if (access(full, X_OK) == 0) return true;
    path += n;
    if (*path == ':') path++;
  }
  return false;
}

/* One GET on a fresh connection ("Connection: close"); returns the HTTP
 * status (-1 when the exchange fails) and the body in *body (malloc'd,
 * NUL-terminated, caller frees) and *body_len. */
static int http_get(int port, const char *target, char **body,
                    size_t *body_len) {
  *body = NULL;
  *body_len = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char req[512];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   "Connection: close\r\n\r\n",
                   target);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      write(fd, req, (size_t)n) != n) {
    close(fd);
    return -1;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  if (buf == NULL) die("GET", "out of memory");
  ssize_t got;
  while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (cap - len < 2) {
      char *grown = realloc(buf, cap *= 2);
      if (grown == NULL) die("GET", "out of memory");
      buf = grown;
    }
  }
  close(fd);
  buf[len] = '\0';
  int status = -1;
  char *start = strstr(buf, "\r\n\r\n");
  if (sscanf(buf, "HTTP/1.1 %d", &status) != 1 || start == NULL) {
    free(buf);
    return -1;
  }
  start += 4;
  *body_len = len - (size_t)(start - buf);
  *body = malloc(*body_len + 1);
  if (*body == NULL) die("GET", "out of memory");
  memcpy(*body, start, *body_len + 1);
  free(buf);
  return status;
}

typedef struct load_result {
  bool measured;
  double rate; /* requests (calls) per second */
  double p99;  /* µs */
  long requests, non_2xx, socket_errors;
} load_result;

/* wrk's latency with its unit ("541.00us", "0.92ms", "1.02s") in µs. */
static double wrk_us(double v, const char *unit) {
  if (strcmp(unit, "us") == 0) return v;
  if (strcmp(unit, "ms") == 0) return v * 1e3;
  if (strcmp(unit, "s") == 0) return v * 1e6;
  if (strcmp(unit, "m") == 0) return v * 60e6;
  return -1;
}

/* Runs wrk against the gateway's target and reads its summary; false with
 * the output on stderr when wrk fails or prints something else. */
static bool wrk_run(int port, const char *target, load_result *r) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "wrk --latency -t1 -c%d -d%ds http://127.0.0.1:%d%s 2>&1",
           LOAD_CONNECTIONS, LOAD_SECONDS, port, target);
  *r = (load_result){0};
  FILE *p = popen(cmd, "r");
  if (p == NULL) return false;
  char line[512], all[8192] = {0};
  size_t used = 0;
  bool have_rate = false, have_p99 = false;
  while (fgets(line, sizeof line, p)) {
    used += (size_t)snprintf(all + used, sizeof all - used, "%s", line);
    if (used >= sizeof all) used = sizeof all - 1;
    double v;
    char unit[8];
    long c, rd, wr, to;
    if (sscanf(line, " Requests/sec: %lf", &r->rate) == 1) have_rate = true;
    if (sscanf(line, " 99%% %lf%7s", &v, unit) == 2) {
      r->p99 = wrk_us(v, unit);
      have_p99 = r->p99 >= 0;
    }
    if (sscanf(line, " %ld requests in", &c) == 1) r->requests = c;
    if (sscanf(line, " Non-2xx or 3xx responses: %ld", &c) == 1) r->non_2xx = c;
    if (sscanf(line,
               " Socket errors: connect %ld, read %ld, write %ld, "
               "timeout %ld",
               &c, &rd, &wr, &to) == 4)
      r->socket_errors = c + rd + wr + to;
  }
  int status = pclose(p);
  r->measured = status == 0 && have_rate && have_p99;
  if (!r->measured) fprintf(stderr, "bench/daemon: %s gave:\n%s", cmd, all);
  return r->measured;
}

/* One gRPC Describe in flight on a channel of its own. */
typedef struct describe_slot {
  grpc_channel *ch;
  void *method;
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array initial, trailing;
  grpc_status_code status;
  grpc_slice details;
  double t0;
} describe_slot;

static void describe_start(describe_slot *s, grpc_completion_queue *cq,
                           const uint8_t *req, size_t len) {
  s->call = grpc_channel_create_registered_call(
      s->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, s->method,
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_seconds(60, GPR_TIMESPAN)),
      NULL);
  grpc_slice slice = grpc_slice_from_static_buffer(req, len);
  s->send = grpc_raw_byte_buffer_create(&slice, 1);
  s->recv = NULL;
  grpc_metadata_array_init(&s->initial);
  grpc_metadata_array_init(&s->trailing);
  s->status = GRPC_STATUS_UNKNOWN;
  s->details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = s->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &s->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &s->trailing;
  ops[5].data.recv_status_on_client.status = &s->status;
  ops[5].data.recv_status_on_client.status_details = &s->details;
  s->t0 = now_s();
  if (grpc_call_start_batch(s->call, ops, 6, s, NULL) != GRPC_CALL_OK)
    die("grpc", "start_batch");
}

/* Ends a completed call; returns whether it was OK with a reply of the
 * expected length. */
static bool describe_finish(describe_slot *s, bool success, size_t reply_len) {
  bool ok = success && s->status == GRPC_STATUS_OK && s->recv != NULL &&
            grpc_byte_buffer_length(s->recv) == reply_len;
  if (s->recv) grpc_byte_buffer_destroy(s->recv);
  grpc_byte_buffer_destroy(s->send);
  grpc_slice_unref(s->details);
  grpc_metadata_array_destroy(&s->initial);
  grpc_metadata_array_destroy(&s->trailing);
  grpc_call_unref(s->call);
  s->call = NULL;
  return ok;
}

/* Row 7: LOAD_CONNECTIONS channels, each with a local subchannel pool so
 * that it has a connection of its own (channels to one target otherwise
 * share one), driven from one thread through one completion queue.  Calls
 * completing inside the timed window are counted; their latencies give
 * the p99.  reply_len is the packed TextReply's length, checked on every
 * reply. */
static void bench_grpc_describe(int port, const char *id, size_t reply_len,
                                load_result *r) {
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = (char *)id;
  dr.format = TOPOS__V1__FORMAT__JSON;
  size_t len = 0;
  uint8_t *req = pack(&dr.base, &len);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  grpc_arg arg = {0};
  arg.type = GRPC_ARG_INTEGER;
  arg.key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
  arg.value.integer = 1;
  grpc_channel_args chargs = {1, &arg};
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  describe_slot slots[LOAD_CONNECTIONS];
  memset(slots, 0, sizeof slots);
  for (int i = 0; i < LOAD_CONNECTIONS; i++) {
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    slots[i].ch = grpc_channel_create(target, cr, &chargs);
    grpc_channel_credentials_release(cr);
    slots[i].method = grpc_channel_register_call(
        slots[i].ch, "/topos.v1.Topos/Describe", NULL, NULL);
    describe_start(&slots[i], cq, req, len);
  }
  size_t cap = 1 << 16, n = 0;
  double *lat = malloc(sizeof(double) * cap);
  if (lat == NULL) die("Describe", "out of memory");
  long failures = 0;
  int in_flight = LOAD_CONNECTIONS;
  /* Half a second of warm-up: the connections are made and every channel
   * has had calls through it before the window opens. */
  double start = now_s() + 0.5, end = start + LOAD_SECONDS;
  while (in_flight > 0) {
    grpc_event ev = grpc_completion_queue_next(
        cq,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_seconds(1, GPR_TIMESPAN)),
        NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
    if (ev.type != GRPC_OP_COMPLETE) die("grpc", "completion queue");
    describe_slot *s = ev.tag;
    double t = now_s();
    if (!describe_finish(s, ev.success != 0, reply_len)) failures++;
    if (t >= start && t <= end) {
      if (n == cap) {
        double *grown = realloc(lat, sizeof(double) * (cap *= 2));
        if (grown == NULL) die("Describe", "out of memory");
        lat = grown;
      }
      lat[n++] = (t - s->t0) * 1e6;
    }
    if (t <= end)
      describe_start(s, cq, req, len);
    else
      in_flight--;
  }
  for (int i = 0; i < LOAD_CONNECTIONS; i++) grpc_channel_destroy(slots[i].ch);
  grpc_completion_queue_shutdown(cq);
  while (
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
          .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  if (failures) die("Describe", "calls failed under load");
  *r = (load_result){true,
                     (double)n / LOAD_SECONDS,
                     n ? quantile(lat, (int)n, 0.99) : 0,
                     (long)n,
                     0,
                     0};
  free(lat);
  free(req);
}

typedef struct gateway_figures {
  bool have_wrk;
  size_t describe_bytes;
  load_result healthz, http_describe, grpc_describe;
} gateway_figures;

/* Rows 5-7.  The spec is the makemore MLP's, recorded over gRPC; before
 * any load, one gRPC Describe and one HTTP GET (untimed: they put the
 * decoded network in the daemon's cache) must return the same JSON text. */
static void bench_gateway(int port, gateway_figures *f) {
  *f = (gateway_figures){0};
  client c;
  client_open(&c, port);
  mm_model m = mm_build();
  char id[65];
  record(&c, m.net, id);
  topos_network_release(m.net);
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = id;
  dr.format = TOPOS__V1__FORMAT__JSON;
  Topos__V1__TextReply *tr =
      call_msg(&c, M_DESCRIBE, &dr.base, &topos__v1__text_reply__descriptor);
  size_t reply_len = protobuf_c_message_get_packed_size(&tr->base);
  f->describe_bytes = strlen(tr->text);
  client_close(&c);
  char target[128];
  snprintf(target, sizeof target, "/v1/specs/%s?format=json", id);
  f->have_wrk = on_path("wrk");
  if (http_port > 0) {
    char *body = NULL;
    size_t body_len = 0;
    int status = http_get(http_port, target, &body, &body_len);
    if (status != 200) die("GET /v1/specs/{id}?format=json", body);
    if (body_len != f->describe_bytes || memcmp(body, tr->text, body_len) != 0)
      die("GET /v1/specs/{id}?format=json",
          "body differs from gRPC Describe's JSON");
    free(body);
    if (f->have_wrk) {
      if (!wrk_run(http_port, "/healthz", &f->healthz))
        die("wrk", "GET /healthz");
      if (!wrk_run(http_port, target, &f->http_describe))
        die("wrk", "GET /v1/specs/{id}?format=json");
    }
  }
  wire_message_free(&tr->base);
  bench_grpc_describe(port, id, reply_len, &f->grpc_describe);
}

/* One makemore row: remote over in-process (the paired ratio, the
 * medians beside it), against the 1.3x aim when `aim`. */
static void print_ratio(const char *what, double ratio, double remote_us,
                        double local_us, bool aim) {
  char m[64];
  snprintf(m, sizeof m, "%.2fx (%.0f / %.0f us)", ratio, remote_us, local_us);
  if (aim)
    printf("%-44s %-22s %-14s %s\n", what, m, "<= 1.3x",
           ratio <= 1.3 ? "met" : "MISSED");
  else
    printf("%-44s %-22s %-14s\n", what, m, "-");
}

/* ------------------------------------------------------------------ main */

int main(void) {
  /* The in-process side runs with the backends toposd registers, so the
   * makemore ratio compares the same kernels. */
  topos_backends_register_defaults();
  int port = daemon_start();
  grpc_init();
  client c;
  client_open(&c, port);
  gd_net g = gd_network();
  char id[65];
  record(&c, g.net, id);
  client_close(&c);

  /* TOPOS_BENCH_ONLY=forward,step,upload,makemore,http runs a subset
   * (http: rows 5-7). */
  const char *only = getenv("TOPOS_BENCH_ONLY");
#define WANT(name) (only == NULL || strstr(only, name) != NULL)
  double p50 = 0, p99 = 0;
  if (WANT("forward")) bench_forward_latency(port, &g, id, &p50, &p99);
  double rate = WANT("step") ? bench_step_throughput(port, &g, id) : 0;
  /* makemore before the uploads: the store writes uploaded blobs behind,
   * and that background work must not share the cores with the steps. */
  mm_figures mm = {0};
  if (WANT("makemore")) bench_makemore(port, &mm);
  /* The gateway rows before the uploads too, for the same reason. */
  gateway_figures gw = {0};
  if (WANT("http")) bench_gateway(port, &gw);
  double best_upload = 0, best_stream = 0;
  double upload = WANT("upload") ? bench_upload(port, true, &best_upload) : 0;
  double stream = WANT("upload") ? bench_upload(port, false, &best_stream) : 0;

  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("toposd (loopback, %ld cores shared by the clients and the daemon)\n",
         cores);
  printf("%-44s %-22s %-14s %s\n", "figure", "measured", "target", "");
  /* Rows TOPOS_BENCH_ONLY left out are not printed (not as zeros). */
  char m[64];
  if (WANT("forward")) {
    snprintf(m, sizeof m, "%.0f us", p50);
    printf("%-44s %-22s %-14s %s\n", "Forward round trip p50 (GD spec)", m,
           "<= 200 us", p50 <= 200 ? "met" : "MISSED");
    snprintf(m, sizeof m, "%.0f us", p99);
    printf("%-44s %-22s %-14s\n", "Forward round trip p99", m, "-");
  }
  if (WANT("step")) {
    snprintf(m, sizeof m, "%.0f calls/s", rate);
    printf("%-44s %-22s %-14s %s\n", "Step throughput, 16 clients (GD spec)", m,
           ">= 10000/s", rate >= 10000 ? "met" : "MISSED");
  }
  if (WANT("upload")) {
    snprintf(m, sizeof m, "%.0f MB/s (best %.0f)", upload, best_upload);
    printf("%-44s %-22s %-14s %s\n", "PutBlob upload, 100 MB (median of 5)", m,
           ">= 500 MB/s", upload >= 500 ? "met" : "MISSED");
    snprintf(m, sizeof m, "%.0f MB/s (best %.0f)", stream, best_stream);
    printf("%-44s %-22s %-14s\n", "PutBlob, 5 x 100 MB back to back", m, "-");
  }
  if (WANT("makemore")) {
    print_ratio("makemore step, unary Step / in-process", mm.remote_x,
                mm.remote_us, mm.local_us, false);
    print_ratio("makemore step, Train stream / in-proc", mm.stream_x,
                mm.stream_us, mm.local_us, false);
    print_ratio("  floor: loopback TCP round trip + step", mm.floor_x,
                mm.floor_us, mm.local_us, false);
    print_ratio("  stream, 2 steps in flight / in-proc", mm.piped_x,
                mm.piped_us, mm.piped_local_us, false);
    char what[64];
    snprintf(what, sizeof what, "  stream, %d steps/message, 2 in flight",
             MM_PER_MESSAGE);
    print_ratio(what, mm.multi_x, mm.multi_us, mm.piped_local_us, true);
    printf(
        "(floor: %zu-byte requests, %d-byte replies; the requester sleeps in "
        "recv, the responder polls and is busy %.0f us a request)\n",
        mm.request_bytes, FLOOR_REPLY, mm.local_us);
  }
  bool http_failed = false;
  if (gw.grpc_describe.measured) {
    const load_result *rows[3] = {&gw.healthz, &gw.http_describe,
                                  &gw.grpc_describe};
    static const char *const names[3] = {"HTTP GET /healthz, wrk 8 conns",
                                         "HTTP GET describe json, wrk 8 conns",
                                         "gRPC Describe json, 8 channels"};
    for (int i = 0; i < 3; i++) {
      if (!rows[i]->measured) continue;
      snprintf(m, sizeof m, "%.0f req/s", rows[i]->rate);
      printf("%-44s %-22s %-14s\n", names[i], m, "-");
      snprintf(m, sizeof m, "%.0f us", rows[i]->p99);
      printf("%-44s %-22s %-14s\n", i < 2 ? "  p99 (wrk)" : "  p99", m, "-");
    }
    if (gw.http_describe.measured) {
      double cost = gw.grpc_describe.rate / gw.http_describe.rate;
      snprintf(m, sizeof m, "%.2fx", cost);
      printf("%-44s %-22s %-14s %s\n",
             "HTTP/gRPC describe cost (gRPC/HTTP rps)", m, "<= 1.5x",
             cost <= 1.5 ? "met" : "MISSED");
    }
    printf(
        "(describe JSON of the makemore MLP spec: %zu bytes, the same "
        "text over both)\n",
        gw.describe_bytes);
    if (http_port == 0)
      printf("HTTP rows skipped: toposd printed no 'toposd http on' line\n");
    else if (!gw.have_wrk)
      printf(
          "HTTP rows skipped: wrk is not installed (make deps installs "
          "it)\n");
    for (int i = 0; i < 2; i++) {
      if (!rows[i]->measured ||
          (rows[i]->non_2xx == 0 && rows[i]->socket_errors == 0))
        continue;
      printf(
          "%s: %ld non-2xx responses and %ld socket errors in %ld "
          "requests\n",
          names[i], rows[i]->non_2xx, rows[i]->socket_errors,
          rows[i]->requests);
      http_failed = true;
    }
  }
  fflush(stdout);

  topos_network_release(g.net);
  grpc_shutdown();
  daemon_stop();
  return http_failed ? 1 : 0;
}
