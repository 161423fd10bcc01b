/*
 * harness.h - what the daemon suites share: a real toposd started as a
 * child on an ephemeral loopback port with a temporary SQLite file, raw
 * gRPC C core calls carrying protobuf-c messages, and a few networks.
 * Each suite includes it once; the functions are static so every suite
 * links its own copy, and a suite may leave some of them unused.
 */
#ifndef TOPOS_TESTS_DAEMON_HARNESS_H
#define TOPOS_TESTS_DAEMON_HARNESS_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "backends.h"
#include "topos.h"
#include "topos.pb-c.h"
#include "wire.h"

#pragma GCC diagnostic ignored "-Wunused-function"

#define UNUSED __attribute__((unused))

static bool skip_slow(void) {
  return getenv("TOPOS_SKIP_SLOW") != NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------ the daemon */

typedef struct daemon_proc {
  pid_t pid;
  int port;
  int http_port; /* the HTTP gateway's; 0 when started with --http off */
  char dir[256];
  char store[320];
  char log[320];
} daemon_proc;

/* A fresh temporary directory for one daemon's store and log. */
static void daemon_dir(daemon_proc *d) {
  const char *tmp = getenv("TMPDIR");
  snprintf(d->dir, sizeof d->dir, "%s/toposd-test-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(d->dir));
  snprintf(d->store, sizeof d->store, "%s/var/topos.db", d->dir);
  snprintf(d->log, sizeof d->log, "%s/toposd.log", d->dir);
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Removes the daemon's directory (store, WAL, log) after a passing test;
 * a failing test leaves it for inspection. */
static void daemon_cleanup(daemon_proc *d) {
  if (d->dir[0]) nftw(d->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  d->dir[0] = '\0';
}

/* The port of a start-up line's HOST:PORT ("toposd listening on
 * [::]:50051"), 0 when there is none. */
static int start_line_port(const char *line) {
  const char *end = strchr(line, '\n');
  const char *colon = NULL;
  for (const char *p = line; *p && p != end; p++)
    if (*p == ':') colon = p;
  return colon ? atoi(colon + 1) : 0;
}

/* Runs argv (argv[0] the toposd binary, NULL-terminated) with env
 * (NAME=VALUE strings added to the environment; may be NULL), stderr
 * appended to d->log, and waits for its start-up lines ("toposd listening
 * on HOST:PORT", then "toposd http on HOST:PORT" unless --http is off).
 * Sets d->pid, d->port and d->http_port.  The child dies with the test
 * process (PR_SET_PDEATHSIG) so a failed test leaves nothing; a daemon
 * that does not start fails the test, saying why. */
static void daemon_exec(daemon_proc *d, char *const *argv,
                        const char *const *env) {
  bool http_off = false;
  for (int i = 1; argv[i] && argv[i + 1]; i++)
    if (strcmp(argv[i], "--http") == 0)
      http_off = strcmp(argv[i + 1], "off") == 0;
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    int log = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) dup2(log, STDERR_FILENO);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  d->pid = pid;
  char out[1024] = {0};
  size_t len = 0;
  int want = http_off ? 1 : 2;
  double until = now_s() + 60;
  for (;;) {
    int lines = 0;
    for (const char *p = out; (p = strchr(p, '\n')) != NULL; p++) lines++;
    if (lines >= want || len >= sizeof out - 1 || now_s() > until) break;
    struct pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fds[0], out + len, sizeof out - 1 - len);
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fds[0]);
  const char *grpc_line = strstr(out, "toposd listening on ");
  const char *http_line = strstr(out, "toposd http on ");
  if (grpc_line == NULL || (!http_off && http_line == NULL)) {
    /* Say why: the command, whether the child is gone (and how), and the
     * ends of its output and log. */
    char cmd[2048] = "";
    for (int i = 0; argv[i]; i++) {
      size_t used = strlen(cmd);
      snprintf(cmd + used, sizeof cmd - used, "%s ", argv[i]);
    }
    char why[96] = "still running after 60 s";
    int status = 0;
    pid_t gone = 0;
    for (double t = now_s() + 2; gone == 0 && now_s() < t; usleep(10000))
      gone = waitpid(pid, &status, WNOHANG);
    if (gone == pid) {
      snprintf(why, sizeof why, "exited: status %d, signal %d",
               WIFEXITED(status) ? WEXITSTATUS(status) : -1,
               WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      d->pid = 0;
    }
    char tail[1024] = "";
    FILE *f = fopen(d->log, "r");
    if (f != NULL) {
      if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        fseek(f,
              size > (long)sizeof tail - 1 ? size - (long)sizeof tail + 1 : 0,
              SEEK_SET);
      }
      size_t n = fread(tail, 1, sizeof tail - 1, f);
      tail[n] = '\0';
      fclose(f);
    }
    ck_abort_msg("toposd did not start (%s): %s\nstdout: '%s'\nlog %s ends: %s",
                 why, cmd, out, d->log, tail);
  }
  d->port = start_line_port(grpc_line + strlen("toposd listening on "));
  d->http_port =
      http_line ? start_line_port(http_line + strlen("toposd http on ")) : 0;
  ck_assert_int_gt(d->port, 0);
}

/* Starts toposd on 127.0.0.1:0 over d->store with extra flags (NULL-
 * terminated) and waits for its "listening" line (daemon_exec). */
static void daemon_start(daemon_proc *d, const char *const *extra) {
  const char *build = getenv("TOPOS_BUILD");
  char bin[512];
  snprintf(bin, sizeof bin, "%s/bin/toposd", build && *build ? build : "build");
  const char *argv[32];
  int argc = 0;
  argv[argc++] = bin;
  argv[argc++] = "--listen";
  argv[argc++] = "127.0.0.1:0";
  argv[argc++] = "--store";
  argv[argc++] = d->store;
  /* The HTTP gateway on an ephemeral port too, unless the test sets it. */
  bool http_given = false;
  for (int i = 0; extra && extra[i]; i++)
    http_given = http_given || strcmp(extra[i], "--http") == 0;
  if (!http_given) {
    argv[argc++] = "--http";
    argv[argc++] = "127.0.0.1:0";
  }
  for (int i = 0; extra && extra[i] && argc < 30; i++) argv[argc++] = extra[i];
  argv[argc] = NULL;
  daemon_exec(d, (char *const *)argv, NULL);
}

/* Runs toposd with args (NULL-terminated) to its exit, its stdout and
 * stderr into out; returns the exit status (-1 when it did not exit
 * normally). */
static int run_toposd(const char *const *args, char *out, size_t outlen) {
  const char *build = getenv("TOPOS_BUILD");
  char cmd[4096];
  int n = snprintf(cmd, sizeof cmd, "'%s/bin/toposd'",
                   build && *build ? build : "build");
  for (int i = 0; args[i]; i++)
    n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", args[i]);
  snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t len = fread(out, 1, outlen - 1, p);
  out[len] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Whether a line of the daemon's log holds `needle`. */
static bool log_has(const daemon_proc *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (f == NULL) return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

/* SIGTERM (or `sig`) and wait up to `seconds`; returns the wait status, or
 * -1 after a SIGKILL when the daemon did not exit in time. */
static int daemon_stop(daemon_proc *d, int sig, double seconds) {
  if (d->pid <= 0) return 0;
  kill(d->pid, sig);
  double until = now_s() + seconds;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(d->pid, &status, WNOHANG);
    if (r == d->pid) break;
    if (now_s() > until) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &status, 0);
      status = -1;
      break;
    }
    usleep(10000);
  }
  d->pid = 0;
  return status;
}

static void assert_clean_exit(int status, double seconds) {
  ck_assert_msg(status != -1, "toposd did not exit within %.0f s", seconds);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "toposd exit status %d (signal %d)",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* ------------------------------------------------------------ the client */

typedef struct client {
  grpc_channel *ch;
  grpc_completion_queue *cq;
} client;

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

typedef struct reply {
  int status;
  int topos_code; /* trailing "topos-status", 0 when absent */
  char details[1024];
  uint8_t *data; /* malloc'd reply message */
  size_t len;
} reply;

static void reply_clear(reply *r) {
  free(r->data);
  memset(r, 0, sizeof *r);
}

/* One unary call of `method` ("Forward" or a full path) with `len` bytes,
 * or with no message at all when msg is NULL.  timeout_ms 0: 120 s;
 * negative: no deadline at all. */
static void call_raw(client *c, const char *method, const void *msg, size_t len,
                     int timeout_ms, reply *r) {
  memset(r, 0, sizeof *r);
  char path[128];
  if (method[0] == '/')
    snprintf(path, sizeof path, "%s", method);
  else
    snprintf(path, sizeof path, "/topos.v1.Topos/%s", method);
  gpr_timespec deadline =
      timeout_ms < 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC)
                     : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                    gpr_time_from_millis(
                                        timeout_ms > 0 ? timeout_ms : 120000,
                                        GPR_TIMESPAN));
  grpc_slice method_slice = grpc_slice_from_copied_string(path);
  grpc_call *call =
      grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                               method_slice, NULL, deadline, NULL);
  grpc_slice_unref(method_slice);
  grpc_byte_buffer *send = NULL;
  if (msg != NULL) {
    grpc_slice s = grpc_slice_from_copied_buffer(msg, len);
    send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
  }
  grpc_metadata_array initial, trailing;
  grpc_metadata_array_init(&initial);
  grpc_metadata_array_init(&trailing);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (send != NULL) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = send;
  }
  ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &initial;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &recv;
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[n].data.recv_status_on_client.status = &status;
  ops[n++].data.recv_status_on_client.status_details = &details;
  int tag = 0;
  ck_assert_int_eq(grpc_call_start_batch(call, ops, n, &tag, NULL),
                   GRPC_CALL_OK);
  grpc_event ev = grpc_completion_queue_pluck(
      c->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
  r->status = (int)status;
  char *text = grpc_slice_to_c_string(details);
  snprintf(r->details, sizeof r->details, "%s", text);
  gpr_free(text);
  for (size_t i = 0; i < trailing.count; i++)
    if (grpc_slice_str_cmp(trailing.metadata[i].key, WIRE_STATUS_KEY) == 0) {
      char *v = grpc_slice_to_c_string(trailing.metadata[i].value);
      r->topos_code = atoi(v);
      gpr_free(v);
    }
  if (recv != NULL) {
    grpc_byte_buffer_reader rd;
    ck_assert(grpc_byte_buffer_reader_init(&rd, recv));
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    r->len = GRPC_SLICE_LENGTH(all);
    r->data = malloc(r->len ? r->len : 1);
    memcpy(r->data, GRPC_SLICE_START_PTR(all), r->len);
    grpc_slice_unref(all);
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(recv);
  }
  if (send) grpc_byte_buffer_destroy(send);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&initial);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
}

/* Packs a message into a new buffer. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len ? *len : 1);
  protobuf_c_message_pack(m, buf);
  return buf;
}

/* Calls `method` with m; returns the status.  On OK with a reply
 * descriptor, *out is the unpacked reply (free with wire_message_free). */
static int call_msg(client *c, const char *method, const ProtobufCMessage *m,
                    const ProtobufCMessageDescriptor *reply_desc, void **out,
                    reply *raw) {
  size_t len = 0;
  uint8_t *buf = pack(m, &len);
  reply local;
  reply *r = raw ? raw : &local;
  call_raw(c, method, buf, len, 0, r);
  free(buf);
  int status = r->status;
  if (out) *out = NULL;
  if (status == GRPC_STATUS_OK && reply_desc && out) {
    *out = protobuf_c_message_unpack(reply_desc, NULL, r->len, r->data);
    ck_assert_msg(*out != NULL, "%s: reply does not parse", method);
  }
  if (r == &local) reply_clear(&local);
  return status;
}

#define CALL_OK(c, method, m, desc, out)                                       \
  do {                                                                         \
    reply r_;                                                                  \
    int s_ = call_msg((c), (method), &(m)->base, (desc), (void **)(out), &r_); \
    ck_assert_msg(s_ == GRPC_STATUS_OK, "%s: status %d: %s", (method), s_,     \
                  r_.details);                                                 \
    reply_clear(&r_);                                                          \
  } while (0)

static void assert_serving(client *c) {
  Topos__V1__HealthRequest h = TOPOS__V1__HEALTH_REQUEST__INIT;
  Topos__V1__HealthReply *hr = NULL;
  CALL_OK(c, "Health", &h, &topos__v1__health_reply__descriptor, &hr);
  ck_assert_str_eq(hr->status, "serving");
  wire_message_free(&hr->base);
}

/* -------------------------------------------------------------- networks */

/* The gradient-descent example: loss = (w·x − y)² + k, f64 scalars.  k
 * varies the spec (the kill -9 test records many distinct ones). */
typedef struct gd_net {
  topos_network *net;
  topos_value w, x, y, loss;
} gd_net;

static gd_net gd_network(double k) {
  topos_error err = {0};
  gd_net g;
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  g.w = topos_name(tape, topos_parameter(tape, zero), "w");
  g.x = topos_name(tape, topos_input(tape, zero), "x");
  g.y = topos_name(tape, topos_input(tape, zero), "y");
  topos_tensor_release(zero);
  topos_value r = topos_sub(tape, topos_mul(tape, g.w, g.x), g.y);
  topos_value sq = topos_mul(tape, r, r);
  if (k != 0) sq = topos_add(tape, sq, topos_scalar(tape, k));
  g.loss = topos_name(tape, sq, "loss");
  g.net = topos_tape_seal(tape, &err);
  ck_assert_msg(g.net != NULL, "gd network: %s", err.message);
  return g;
}

/* A small tanh MLP with cross entropy (f32), for Adam/AdamW state. */
typedef struct mlp_net {
  topos_network *net;
  topos_value x, y, loss, logits;
} mlp_net;

static mlp_net mlp_network(void) {
  topos_error err = {0};
  mlp_net m;
  int64_t w1s[2] = {6, 16}, b1s[1] = {16}, w2s[2] = {16, 5}, b2s[1] = {5};
  int64_t xs[2] = {8, 6}, ys[1] = {8};
  topos_tensor *init[6] = {
      topos_init_normal(TOPOS_F32, 2, w1s, 0, 0.5, 11, &err),
      topos_tensor_zeros(TOPOS_F32, 1, b1s, &err),
      topos_init_normal(TOPOS_F32, 2, w2s, 0, 0.5, 12, &err),
      topos_tensor_zeros(TOPOS_F32, 1, b2s, &err),
      topos_init_normal(TOPOS_F32, 2, xs, 0, 1, 13, &err),
      topos_tensor_zeros(TOPOS_I32, 1, ys, &err),
  };
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w1 = topos_name(tape, topos_parameter(tape, init[0]), "W1");
  topos_value b1 = topos_name(tape, topos_parameter(tape, init[1]), "b1");
  topos_value w2 = topos_name(tape, topos_parameter(tape, init[2]), "W2");
  topos_value b2 = topos_name(tape, topos_parameter(tape, init[3]), "b2");
  m.x = topos_name(tape, topos_input(tape, init[4]), "x");
  m.y = topos_name(tape, topos_input(tape, init[5]), "y");
  topos_value h = topos_tanh(tape, topos_linear(tape, m.x, w1, b1));
  m.logits = topos_name(tape, topos_linear(tape, h, w2, b2), "logits");
  m.loss = topos_name(tape, topos_cross_entropy(tape, m.logits, m.y), "loss");
  m.net = topos_tape_seal(tape, &err);
  ck_assert_msg(m.net != NULL, "mlp: %s", err.message);
  for (int i = 0; i < 6; i++) topos_tensor_release(init[i]);
  return m;
}

/* A convolution + max-pool net whose forward plan elects fused groups. */
static topos_network *conv_network(topos_value *out) {
  topos_error err = {0};
  int64_t xs[4] = {2, 3, 8, 8}, ws[4] = {4, 3, 3, 3};
  topos_tensor *x0 = topos_init_normal(TOPOS_F32, 4, xs, 0, 1, 21, &err);
  topos_tensor *w0 = topos_init_normal(TOPOS_F32, 4, ws, 0, 0.3, 22, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w = topos_name(tape, topos_parameter(tape, w0), "w");
  topos_value x = topos_name(tape, topos_input(tape, x0), "x");
  topos_value c = topos_conv2d(tape, x, w, TOPOS_NONE, 1, 1, 1);
  topos_value p = topos_max_pool2d(tape, topos_relu(tape, c), 2, 2);
  *out = topos_name(tape, topos_sum(tape, p), "out");
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "conv: %s", err.message);
  topos_tensor_release(x0);
  topos_tensor_release(w0);
  return net;
}

/* A forward that takes a while in the reference interpreter: a chain of
 * `n` 192x192 f32 matmuls. */
static topos_network *slow_network(int n, topos_value *out) {
  topos_error err = {0};
  int64_t s[2] = {192, 192};
  topos_tensor *a0 = topos_init_normal(TOPOS_F32, 2, s, 0, 0.07, 31, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value a = topos_name(tape, topos_parameter(tape, a0), "a");
  topos_value v = a;
  /* Mostly elementwise work: it stays on the reference kernels, so the
   * network is slow whichever GEMM backend the daemon has. */
  for (int i = 0; i < n; i++) {
    v = topos_tanh(tape, topos_matmul(tape, v, a));
    for (int j = 0; j < 10; j++) v = topos_tanh(tape, v);
  }
  *out = topos_name(tape, topos_sum(tape, v), "out");
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "slow: %s", err.message);
  topos_tensor_release(a0);
  return net;
}

/* A slow network whose in-process forward, with the backends the daemon
 * registers, takes at least `seconds` here: calibrated, so a faster kernel
 * (the vectorised exact tanh, say) cannot make a timing test pass or fail
 * by accident. */
static topos_network *calibrated_slow_network(double seconds, topos_value *out,
                                              double *took) {
  topos_backends_register_defaults();
  topos_network *net = NULL;
  double full = 0;
  for (int n = 25; full < seconds; n *= 2) {
    topos_network_release(net);
    net = slow_network(n, out);
    topos_error err = {0};
    double t0 = now_s();
    topos_run *run = topos_forward(net, NULL, NULL, 0, NULL, &err);
    full = now_s() - t0;
    ck_assert_msg(run != NULL, "slow forward: %s", err.message);
    topos_run_free(run);
  }
  if (took) *took = full;
  return net;
}

/* Records net on the daemon and checks the id is the engine's. */
static void record(client *c, const topos_network *net, char id[65]) {
  topos_error err = {0};
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, &err), TOPOS_OK);
  Topos__V1__RecordReply *rr = NULL;
  CALL_OK(c, "Record", &spec, &topos__v1__record_reply__descriptor, &rr);
  char local[65];
  ck_assert_int_eq(topos_network_id(net, local, &err), TOPOS_OK);
  ck_assert_str_eq(rr->id, local);
  ck_assert_int_eq(rr->nodes, topos_network_node_count(net));
  ck_assert_int_eq(rr->parameters, topos_network_parameter_count(net));
  ck_assert_int_eq(rr->inputs, topos_network_input_count(net));
  memcpy(id, rr->id, 65);
  wire_message_free(&rr->base);
  wire_message_clear(&spec.base);
}

static Topos__V1__Tensor *scalar_msg(double v) {
  topos_error err = {0};
  topos_tensor *t = topos_tensor_scalar(TOPOS_F64, v, &err);
  Topos__V1__Tensor *m = wire_tensor_new(t, &err);
  topos_tensor_release(t);
  ck_assert_ptr_nonnull(m);
  return m;
}

static Topos__V1__Value *value_msg(topos_value v) {
  return wire_value_new_index(v.index);
}

static topos_tensor *tensor_of(const Topos__V1__Tensor *m) {
  topos_error err = {0};
  topos_tensor *t = wire_tensor_from_proto(m, NULL, "reply", &err);
  ck_assert_msg(t != NULL, "reply tensor: %s", err.message);
  return t;
}

/* A field of the daemon's /proc/PID/status in bytes ("VmRSS:",
 * "VmHWM:"). */
static int64_t proc_bytes(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  int64_t kb = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, strlen(field)) == 0)
      kb = strtoll(line + strlen(field), NULL, 10);
  fclose(f);
  ck_assert_msg(kb >= 0, "%s not in %s", field, path);
  return kb * 1024;
}

/* A checked fixture for suites whose tests start gRPC themselves (each
 * test is its own process under Check's fork). */
static void grpc_up(void) {
  grpc_init();
}
static void grpc_down(void) {
  grpc_shutdown();
}

/* A daemon with extra flags and a client of it, as most tests start. */
static void fixture_start(daemon_proc *d, client *c, const char *const *extra) {
  memset(d, 0, sizeof *d);
  daemon_dir(d);
  daemon_start(d, extra);
  grpc_init();
  client_open(c, d->port);
}

/* Closes the client, stops the daemon with SIGTERM (it must exit 0 within
 * `seconds`) and removes its directory. */
static void fixture_stop(daemon_proc *d, client *c, double seconds) {
  client_close(c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(d, SIGTERM, seconds), seconds);
  daemon_cleanup(d);
}

/* A packed Forward of net's root `out` on the stored spec id. */
static void slow_forward_request(const topos_network *net, topos_value out,
                                 const char *id, uint8_t **bytes, size_t *len) {
  topos_error err = {0};
  topos_value roots[1] = {out};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = (char *)id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  (void)net;
  *bytes = pack(&fr.base, len);
  wire_message_free(&fr.entry->base);
}

typedef struct flood_arg {
  int port;
  const uint8_t *bytes;
  size_t len;
  int status;
} flood_arg;

static void *flood_one(void *p) {
  flood_arg *a = p;
  client c;
  client_open(&c, a->port);
  reply r;
  call_raw(&c, "Forward", a->bytes, a->len, 0, &r);
  a->status = r.status;
  reply_clear(&r);
  client_close(&c);
  return NULL;
}

/* Waits (up to `seconds`) until the daemon has a run in flight: Stats shows
 * memory reserved, which a run holds from admission to its reply.  Drain
 * tests send SIGTERM after this, not after a fixed sleep: a new channel's
 * handshake under the sanitizers and a loaded CI box can take longer than
 * any sleep that keeps the suite quick. */
static void wait_run_in_flight(client *c, double seconds) {
  double until = now_s() + seconds;
  for (;;) {
    Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
    Topos__V1__StatsReply *sr = NULL;
    size_t len;
    uint8_t *bytes = pack(&q.base, &len);
    reply r;
    call_raw(c, "Stats", bytes, len, 0, &r);
    free(bytes);
    ck_assert_msg(r.status == GRPC_STATUS_OK, "Stats: %d %s", r.status,
                  r.details);
    sr = topos__v1__stats_reply__unpack(NULL, r.len, r.data);
    reply_clear(&r);
    ck_assert_ptr_nonnull(sr);
    int64_t reserved = sr->reserved_bytes;
    topos__v1__stats_reply__free_unpacked(sr, NULL);
    if (reserved > 0) return;
    ck_assert_msg(now_s() < until, "no run in flight after %.1f s", seconds);
    usleep(10000);
  }
}

#endif /* TOPOS_TESTS_DAEMON_HARNESS_H */
