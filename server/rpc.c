/*
 * rpc.c - the gRPC C core front of toposd.
 *
 * Threads and ownership:
 *  - One completion-queue thread (the caller of rpc_server_run) owns the
 *    server's only completion queue.  It keeps REQUESTS_PER_METHOD
 *    registered-call requests posted per method (payload read by gRPC:
 *    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) and a few unregistered
 *    ones; each arrival is reposted at once and becomes a job.
 *  - A job first gets a RECV_CLOSE_ON_SERVER batch of its own, so a client
 *    that cancels (or whose deadline gRPC enforces) sets job->cancelled
 *    while a worker is still busy with it.  Then it is pushed onto the
 *    bounded job queue, in its tenant's FIFO (served by deficit round
 *    robin, below); a full queue is answered UNAVAILABLE on the spot.
 *  - Workers pop jobs, read the payload into per-worker reused memory, run
 *    the handler, log the request and finish the call themselves with one
 *    batch (initial metadata, message, status).  They never touch the job
 *    after starting that batch: its completion comes back to the queue
 *    thread, which drops the job's last reference.
 *  - A job carries two references (close batch, send batch); whoever drops
 *    the last one frees it, so the order of the two completions does not
 *    matter.
 *
 * Shutdown (docs/architecture.md, "Platform facts"): on the stop flag the queue
 * thread calls grpc_server_shutdown_and_notify and keeps draining events;
 * pending requests come back with success = 0 and are not reposted.  After the
 * grace period it sets daemon.cancel_all (workers stop at their next
 * check) and cancels all calls.  Once the shutdown tag is in and no job
 * is alive, the workers are joined; rpc_server_destroy then destroys the
 * server, shuts the queue down and drains it to GRPC_QUEUE_SHUTDOWN.
 */
#include "rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "auth.h"
#include "backends.h"
#include "handlers.h"
#include "health.pb-c.h"
#include "listener.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "quota.h"
#include "wire.h"

/* Registered-call requests kept posted per method. */
#define REQUESTS_PER_METHOD 16
/* Unregistered-call requests (answered UNIMPLEMENTED). */
#define UNREGISTERED_REQUESTS 4
/* grpc.health.v1.Health/Watch requests kept posted. */
#define WATCH_REQUESTS 4
#define METHOD_UNREGISTERED (-1)
#define METHOD_WATCH (-2)
/* The queue thread wakes at least this often to look at the stop flag. */
#define POLL_MS 50
/* After the grace period, how long cancelled jobs get to notice before
 * the daemon gives up on them. */
#define ABANDON_MS 10000
/* While idle, freed memory is handed back to the system this often. */
#define TRIM_MS 1000
/* A Train stream whose read (sent with a reply) completes within this
 * was sending ahead: its next messages are read while a step runs. */
#define STREAM_AHEAD_NS 50000
/* Per-worker memory kept across requests (arena and input buffer). */
#define WORKER_RETAIN_BYTES ((size_t)256 << 20)
#define PROBER_RETAIN_BYTES ((size_t)64 << 10)

typedef enum tag_kind {
  TAG_REQUEST,     /* a posted request slot received a call */
  TAG_CLOSE,       /* a job's RECV_CLOSE_ON_SERVER completed */
  TAG_SEND,        /* a job's reply batch completed */
  TAG_TRAIN_RECV,  /* a Train stream's next message came (or its end) */
  TAG_TRAIN_SENT,  /* a Train stream's reply went */
  TAG_WATCH_SEND,  /* a health watcher's message (or status) went out */
  TAG_WATCH_CLOSE, /* a health watcher's call is over */
  TAG_SHUTDOWN     /* grpc_server_shutdown_and_notify is done */
} tag_kind;

typedef struct tag {
  tag_kind kind;
  void *owner;
} tag;

typedef struct job job;

/* A posted request: gRPC fills these fields when a call arrives. */
typedef struct request_slot {
  tag tag;
  int method; /* index into handler_methods, -1 = unregistered */
  bool posted;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array metadata;
  grpc_byte_buffer *payload;
  grpc_call_details details; /* unregistered only */
} request_slot;

struct job {
  tag close_tag, send_tag;
  _Atomic int refs;
  rpc_server *server;
  grpc_call *call;
  int method;         /* -1 for an unregistered method */
  char *unknown_name; /* the path of an unregistered call (gpr_free) */
  grpc_byte_buffer *payload;
  grpc_metadata_array metadata;
  int64_t arrival_ns, deadline_ns;
  uint64_t conn; /* listener_call_begin's handle: pins the connection */
  char peer[64]; /* the client's address for the request log */
  char tenant[STORE_TENANT_NAME_MAX + 1]; /* auth.h; "" when auth is off */
  int weight; /* the tenant's scheduling weight (1.. ; 0 reads as 1) */
  bool admin;
  store_quota quota; /* the tenant's quotas, read at admission (quota.h) */
  bool has_quota;
  bool quota_counted; /* counted in flight until its reply */
  _Atomic int cancelled;
  int close_cancelled; /* written by gRPC for the close batch */
  /* What the reply batch sends; lives until the batch completes. */
  grpc_byte_buffer *reply;
  grpc_slice status_details;
  grpc_metadata trailing[2];
  size_t ntrailing;
  char trailing_text[2][32];
  service_call *ext; /* a call from another transport (rpc_submit) */
  /* A Train stream (docs/daemon.md, "Train streams"): its session, and
   * the deadline the client gave the whole stream.  Its next message is
   * read while a worker runs the last one, and replies go out on their
   * own batch; io_lock guards the state below, which the queue thread
   * (completions) and the stream's worker share. */
  train_session *train;
  int64_t stream_deadline_ns;
  tag recv_tag, sent_tag;
  pthread_mutex_t io_lock;
  grpc_byte_buffer *ahead; /* the read's message (NULL: the client's end) */
  bool recv_pending;       /* a read is in flight */
  bool read_sends;         /* ... and it carries the last reply */
  bool read_ahead;         /* the client sends ahead: read while running */
  int64_t read_start_ns;   /* when the read carrying a reply started */
  bool have_ahead;         /* a read completed while the stream was busy */
  bool ahead_ok;           /* ... and its batch succeeded */
  bool busy;               /* a message of it is queued or running */
  bool send_pending;       /* a reply is in flight */
  bool broken;             /* a reply's batch failed while busy */
  uint8_t *held;           /* a reply waiting for the one in flight */
  size_t held_len;
  bool ending; /* the stream's end is decided: no more messages run */
  bool over;   /* its last batch started or it was dropped */
  /* An end decided while a reply was in flight, started once it went. */
  bool end_waits;
  int end_status, end_code;
  char end_message[512];
  job *next; /* queue link */
};

/* A grpc.health.v1.Health/Watch stream.  Lives on the queue thread only:
 * it sends the status when it changes (the drain), and its status line
 * when the server stops.  refs: the close batch, and a send in flight. */
typedef struct watcher watcher;
struct watcher {
  tag send_tag, close_tag;
  grpc_call *call;
  grpc_metadata_array metadata;
  grpc_byte_buffer *out;
  grpc_slice details;
  int refs;
  int close_cancelled;
  int sent;      /* the status last sent; -1: none yet */
  uint64_t conn; /* listener_call_begin's: a stream is a call in flight */
  bool unknown;  /* a service not served: SERVICE_UNKNOWN, for good */
  bool sending, finishing, finished, gone;
  watcher *prev, *next;
};

/* One tenant's FIFO of queued jobs (the "" class: calls without a
 * tenant).  Classes are made on a tenant's first push and kept (one per
 * tenant that ever queued: bounded by the store's tenants). */
typedef struct sched_class sched_class;
struct sched_class {
  char tenant[STORE_TENANT_NAME_MAX + 1];
  int weight;  /* the latest pushed job's (read at admission) */
  int deficit; /* jobs this class may still take in its current turn */
  job *head, *tail;
  int depth;
  bool active;              /* in the active ring: has queued jobs */
  sched_class *next_active; /* the active FIFO */
  sched_class *next;        /* every class */
};

/* A worker asleep in queue_pop, on the queue's stack of sleepers. */
typedef struct sleeper sleeper;
struct sleeper {
  pthread_cond_t wake;
  bool woken;
  sleeper *next;
};

/* The job queue: per-tenant FIFOs served by deficit round robin counted
 * in jobs (docs/daemon.md, "The job queue").  The active classes form a
 * FIFO; the head class is the one whose turn it is.  A turn starts with
 * deficit = weight; each pop takes the head class's oldest job and spends
 * one; a class whose deficit is spent goes to the back (at the next pop),
 * one left empty leaves the ring (deficit back to 0).  With one class (auth
 * off) this is exactly the FIFO it replaces.  capacity bounds all classes
 * together; a named tenant may hold at most share of it, so others find room.
 */
typedef struct job_queue {
  pthread_mutex_t lock;
  /* The sleeping workers, the last to sleep on top: a push wakes that
   * one, whose cache still holds the last job's memory. */
  sleeper *sleepers;
  _Atomic int spinning; /* workers watching the queue awake (queue_pop,
                         * and from their reply on: worker_awake) */
  sched_class *classes;
  sched_class *active_head, *active_tail;
  int depth, capacity, share;
  int64_t spin_ns; /* how long queue_pop polls before it sleeps */
  bool closed;
} job_queue;

typedef struct worker {
  rpc_server *server;
  pthread_t thread;
  bool started;
  bool counted; /* counted among the workers awake (worker_awake) */
  arena arena;
  reuse_buf input;
} worker;

struct rpc_server {
  daemon_state *d;
  grpc_server *server;
  grpc_completion_queue *cq;
  listener *listener;
  void *methods[32]; /* registered method handles */
  void *watch_method;
  watcher *watchers;
  request_slot *slots;
  int nslots;
  tag shutdown_tag;
  job_queue queue;
  worker *workers;
  int nworkers;
  worker prober; /* answers health probes on the queue thread */
  /* Answers the probes other transports submit (rpc_submit), on their
   * thread; the lock keeps two such threads apart. */
  worker ext_prober;
  pthread_mutex_t ext_prober_lock;
  listener_counts last_counts;
  _Atomic int live_jobs;
  _Atomic uint64_t next_request_id;
  quota_table *quotas; /* in-flight counts and token buckets per tenant */
  bool drain_started, shutdown_started, shutdown_done, destroyed_server;
};

int64_t daemon_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------- job queue */

static void queue_init(job_queue *q, int capacity, int64_t spin_ns) {
  pthread_mutex_init(&q->lock, NULL);
  q->sleepers = NULL;
  atomic_init(&q->spinning, 0);
  q->spin_ns = spin_ns;
  q->classes = NULL;
  q->active_head = q->active_tail = NULL;
  q->depth = 0;
  q->capacity = capacity;
  /* A named tenant's share: three quarters of the queue, at least 1. */
  q->share = capacity - capacity / 4;
  if (q->share < 1) q->share = 1;
  q->closed = false;
}

/* tenant's class, made when missing; NULL when out of memory.  Linear in
 * the tenants that ever queued (few). */
static sched_class *queue_class(job_queue *q, const char *tenant) {
  for (sched_class *c = q->classes; c; c = c->next)
    if (strcmp(c->tenant, tenant) == 0) return c;
  sched_class *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  snprintf(c->tenant, sizeof c->tenant, "%s", tenant);
  c->weight = 1;
  c->next = q->classes;
  q->classes = c;
  return c;
}

/* false when the queue is full (or closed), or tenant's share of it is:
 * the caller rejects the job. */
static bool queue_push(job_queue *q, job *j, const char *tenant, int weight,
                       _Atomic int *depth) {
  pthread_mutex_lock(&q->lock);
  sched_class *c = NULL;
  if (!q->closed && q->depth < q->capacity) c = queue_class(q, tenant);
  if (c == NULL || (tenant[0] != '\0' && c->depth >= q->share)) {
    pthread_mutex_unlock(&q->lock);
    return false;
  }
  c->weight = weight < 1 ? 1 : weight;
  j->next = NULL;
  if (c->tail)
    c->tail->next = j;
  else
    c->head = j;
  c->tail = j;
  c->depth++;
  if (!c->active) {
    c->active = true;
    c->deficit = 0;
    c->next_active = NULL;
    if (q->active_tail)
      q->active_tail->next_active = c;
    else
      q->active_head = c;
    q->active_tail = c;
  }
  q->depth++;
  atomic_store(depth, q->depth);
  /* A sleeper is woken only for a job no awake worker will take: one
   * watching the queue takes it sooner, and a needless wake costs both
   * cores a futex round. */
  sleeper *w = q->sleepers;
  if (w != NULL && q->depth > atomic_load(&q->spinning)) {
    q->sleepers = w->next;
    w->woken = true;
    pthread_cond_signal(&w->wake);
  }
  pthread_mutex_unlock(&q->lock);
  return true;
}

/* The next job by deficit round robin, or NULL once the queue is closed
 * and empty.  O(1).  A class whose turn is spent goes to the back at the
 * next pop, not at once: a tenant that arrives while the last job of
 * another's turn runs is served next, after that one job. */
static job *queue_pop(job_queue *q, _Atomic int *depth, bool counted) {
  /* A worker that finds the queue empty watches it for a moment before it
   * sleeps: a stream's next message, or a client's next call, usually
   * comes within that, and a sleeping thread takes tens of microseconds
   * to wake on an idle core (far more than the wait).
   * *depth is the queue's depth, stored under the lock by every push and
   * pop, read here without it.  `counted`: the caller already counts
   * among the workers watching (worker_awake). */
  if (q->spin_ns > 0 && atomic_load(depth) == 0) {
    int64_t until = daemon_now_ns() + q->spin_ns;
    if (!counted) atomic_fetch_add(&q->spinning, 1);
    counted = true;
    for (int i = 0; atomic_load(depth) == 0; i++) {
      if ((i & 15) == 15 && daemon_now_ns() >= until) break;
      sched_yield();
    }
  }
  /* Before the lock: a push from now on wakes a sleeper if need be, and
   * one before it is seen under the lock below. */
  if (counted) atomic_fetch_sub(&q->spinning, 1);
  pthread_mutex_lock(&q->lock);
  while (q->active_head == NULL && !q->closed) {
    sleeper me = {.woken = false, .next = q->sleepers};
    pthread_cond_init(&me.wake, NULL);
    q->sleepers = &me;
    while (!me.woken && !q->closed) pthread_cond_wait(&me.wake, &q->lock);
    if (!me.woken) {
      /* Closed: off the stack (another push may have taken it already). */
      for (sleeper **at = &q->sleepers; *at; at = &(*at)->next)
        if (*at == &me) {
          *at = me.next;
          break;
        }
    }
    pthread_cond_destroy(&me.wake);
  }
  sched_class *c = q->active_head;
  job *j = NULL;
  if (c) {
    if (c->deficit <= 0 && c->next_active != NULL) {
      /* Its turn is spent and another class waits: to the back. */
      q->active_head = c->next_active;
      c->next_active = NULL;
      q->active_tail->next_active = c;
      q->active_tail = c;
      c = q->active_head;
    }
    if (c->deficit <= 0) c->deficit = c->weight; /* its turn starts */
    j = c->head;
    c->head = j->next;
    if (c->head == NULL) c->tail = NULL;
    c->depth--;
    c->deficit--;
    if (c->head == NULL) {
      /* Nothing left: out of the ring (c is its head). */
      q->active_head = c->next_active;
      if (q->active_head == NULL) q->active_tail = NULL;
      c->next_active = NULL;
      c->active = false;
      c->deficit = 0;
    }
    q->depth--;
    atomic_store(depth, q->depth);
  }
  pthread_mutex_unlock(&q->lock);
  return j;
}

static void queue_close(job_queue *q) {
  pthread_mutex_lock(&q->lock);
  q->closed = true;
  for (sleeper *w = q->sleepers; w; w = w->next) pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&q->lock);
}

static void queue_destroy(job_queue *q) {
  while (q->classes) {
    sched_class *c = q->classes;
    q->classes = c->next;
    free(c);
  }
  pthread_mutex_destroy(&q->lock);
}

/* ------------------------------------------------------------------ jobs */

static void job_free(job *j) {
  rpc_server *s = j->server;
  if (j->payload) grpc_byte_buffer_destroy(j->payload);
  if (j->reply) grpc_byte_buffer_destroy(j->reply);
  grpc_slice_unref(j->status_details);
  for (size_t i = 0; i < j->ntrailing; i++) {
    grpc_slice_unref(j->trailing[i].key);
    grpc_slice_unref(j->trailing[i].value);
  }
  grpc_metadata_array_destroy(&j->metadata);
  if (j->call) grpc_call_unref(j->call);
  train_session_free(s->d, j->train);
  if (j->ahead) grpc_byte_buffer_destroy(j->ahead);
  free(j->held);
  pthread_mutex_destroy(&j->io_lock);
  listener_call_end(s->listener, j->conn);
  gpr_free(j->unknown_name);
  free(j);
  atomic_fetch_sub(&s->live_jobs, 1);
}

static void job_unref(job *j) {
  if (atomic_fetch_sub(&j->refs, 1) == 1) job_free(j);
}

/* out/out_len (taken) as j's reply buffer, which lives until the next
 * one or the job's end (the batch sending it must be done by then). */
static grpc_byte_buffer *job_reply(job *j, uint8_t *out, size_t out_len) {
  if (j->reply) grpc_byte_buffer_destroy(j->reply);
  grpc_slice slice =
      out_len ? grpc_slice_new(out, out_len, free) : grpc_empty_slice();
  if (out_len == 0) free(out);
  j->reply = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return j->reply;
}

/* Sends a call's last batch: the initial metadata unless a stream sent
 * it already, the message out/out_len (taken) when with_message, then
 * the status with its details and the engine's code as trailing
 * metadata.  After this the caller must not touch j (the completion may
 * free it). */
static void job_finish(job *j, bool initial_metadata, bool with_message,
                       int status, const char *message, int topos_code,
                       uint8_t *out, size_t out_len, bool with_close) {
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (initial_metadata) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
  }
  if (with_message) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = job_reply(j, out, out_len);
    n++;
  } else {
    free(out);
  }
  if (status != GRPC_STATUS_OK) {
    if (topos_code > 0) {
      snprintf(j->trailing_text[0], sizeof j->trailing_text[0], "%d",
               topos_code);
      j->trailing[j->ntrailing].key =
          grpc_slice_from_static_string(WIRE_STATUS_KEY);
      j->trailing[j->ntrailing].value =
          grpc_slice_from_copied_string(j->trailing_text[0]);
      j->ntrailing++;
    }
  }
  j->status_details = grpc_slice_from_copied_string(message ? message : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)status;
  ops[n].data.send_status_from_server.status_details = &j->status_details;
  ops[n].data.send_status_from_server.trailing_metadata_count = j->ntrailing;
  ops[n].data.send_status_from_server.trailing_metadata = j->trailing;
  n++;
  if (with_close) {
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &j->close_cancelled;
    n++;
  }
  grpc_call_error e =
      grpc_call_start_batch(j->call, ops, n, &j->send_tag, NULL);
  if (e != GRPC_CALL_OK) {
    /* No completion will come for a batch that did not start. */
    log_event_at(LOG_ERROR, "error", "start_batch failed (%d) on request reply",
                 (int)e);
    job_unref(j);
  }
}

/* A unary call's reply: the message when status is OK, then the status. */
static void job_send(job *j, int status, const char *message, int topos_code,
                     uint8_t *out, size_t out_len, bool with_close) {
  job_finish(j, true, status == GRPC_STATUS_OK, status, message, topos_code,
             out, out_len, with_close);
}

/* ---------------------------------------------------------- Train streams */

/*
 * A stream's life (docs/daemon.md, "Train streams").  The stream holds
 * one reference of its job for its whole life (given back by its last
 * batch, or by a drop); every read and reply batch in flight holds one
 * more.  While a message is queued or runs (busy) the worker owns the
 * stream; otherwise the queue thread's completions drive it.  A worker
 * starting a message reads the next one ahead, so a client that sends
 * ahead finds its next message already in when the step ends: it goes
 * straight back to the queue, with no wake-up of the queue thread on the
 * way.  One reply is in flight at a time (a later one is held until it
 * goes), and the stream's last batch waits for the reply in flight.
 */

/* A stream is over for the daemon: its in-flight count goes back. */
static void stream_release(job *j) {
  if (j->quota_counted) quota_release(j->server->quotas, j->tenant);
  j->quota_counted = false;
}

/* The call broke (cancelled, the connection gone, a batch refused):
 * nothing more is sent.  Cancelling makes sure the call ends (a no-op on
 * one that already has), which completes any batch still in flight. */
static void stream_drop(job *j) {
  pthread_mutex_lock(&j->io_lock);
  bool over = j->over;
  j->ending = j->over = true;
  pthread_mutex_unlock(&j->io_lock);
  if (over) return; /* dropped or finished already */
  stream_release(j);
  grpc_call_cancel_with_status(j->call, GRPC_STATUS_CANCELLED,
                               "the Train stream broke", NULL);
  job_unref(j);
}

/* The stream's last batch, its end decided and no reply in flight. */
static void stream_finish(job *j, int status, const char *message,
                          int topos_code) {
  stream_release(j);
  uint8_t *last = NULL;
  size_t last_len = 0;
  bool with_last = status != GRPC_STATUS_OK &&
                   train_session_last(j->server->d, j->train, &last, &last_len);
  job_finish(j, false, with_last, status, message, topos_code, last, last_len,
             false);
}

/* Ends the stream: OK once the client closed its side, or the refusal
 * of a message, after a last reply with the session's state (when it has
 * one) so the client loses nothing.  With a reply in flight the end waits
 * for it (the sent completion starts it).  The stream must not be busy. */
static void stream_end(job *j, int status, const char *message,
                       int topos_code) {
  pthread_mutex_lock(&j->io_lock);
  if (j->over) {
    pthread_mutex_unlock(&j->io_lock);
    return;
  }
  j->ending = true;
  if (j->send_pending) {
    j->end_waits = true;
    j->end_status = status;
    j->end_code = topos_code;
    snprintf(j->end_message, sizeof j->end_message, "%s",
             message ? message : "");
    pthread_mutex_unlock(&j->io_lock);
    return;
  }
  j->over = true;
  pthread_mutex_unlock(&j->io_lock);
  stream_finish(j, status, message, topos_code);
}

/* Starts a batch of j's holding a reference (io_lock held).  false: it
 * did not start, and no completion will come. */
static bool stream_batch(job *j, const grpc_op *ops, size_t n, tag *t) {
  atomic_fetch_add(&j->refs, 1);
  grpc_call_error e = grpc_call_start_batch(j->call, ops, n, t, NULL);
  if (e == GRPC_CALL_OK) return true;
  log_event_at(LOG_ERROR, "error", "start_batch failed (%d) on a Train stream",
               (int)e);
  atomic_fetch_sub(&j->refs, 1); /* the stream's own keeps it alive */
  return false;
}

/* The read of the next message (io_lock held), with the initial metadata
 * when first, or with a reply (out/out_len taken, none in flight) when
 * with_reply: one batch, one completion.  A read that does not start
 * reads as a broken call. */
static void stream_read(job *j, bool first, bool with_reply, uint8_t *out,
                        size_t out_len) {
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (first) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (with_reply) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = job_reply(j, out, out_len);
    n++;
  }
  j->ahead = NULL;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n].data.recv_message.recv_message = &j->ahead;
  n++;
  j->recv_pending = stream_batch(j, ops, n, &j->recv_tag);
  /* After the batch started: starting it sends the reply, which takes
   * tens of microseconds here (the read's wait is what is measured). */
  if (with_reply) j->read_start_ns = daemon_now_ns();
  j->read_sends = j->recv_pending && with_reply;
  if (j->read_sends) j->send_pending = true;
  if (!j->recv_pending) {
    j->have_ahead = true;
    j->ahead_ok = false;
  }
}

/* A reply's batch (io_lock held, none in flight): out/out_len taken. */
static void stream_send(job *j, uint8_t *out, size_t out_len) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = job_reply(j, out, out_len);
  j->send_pending = stream_batch(j, &op, 1, &j->sent_tag);
  if (!j->send_pending) j->broken = true;
}

/* A reply (io_lock held, none in flight; out/out_len taken): with the
 * read of the next message when none is out or in (a stream that is not
 * reading ahead reads with each reply), else on its own. */
static void stream_reply(job *j, uint8_t *out, size_t out_len) {
  if (!j->recv_pending && !j->have_ahead && !j->ending)
    stream_read(j, false, true, out, out_len);
  else
    stream_send(j, out, out_len);
}

static void stream_next(rpc_server *s, job *j, bool ok,
                        grpc_byte_buffer *payload);

/* Whether an end that waited for the reply in flight may start now
 * (io_lock held): then the stream is over, and the caller starts it with
 * stream_finish once the lock is let go. */
static bool stream_end_due(job *j) {
  if (j->over || !j->end_waits || j->send_pending) return false;
  j->end_waits = false;
  j->over = true;
  return true;
}

/* The message read ahead, taken (io_lock held; have_ahead): the stream
 * turns busy when it is one, so nothing else drives it meanwhile. */
static grpc_byte_buffer *stream_take(job *j, bool *ok) {
  grpc_byte_buffer *payload = j->ahead;
  *ok = j->ahead_ok;
  j->ahead = NULL;
  j->have_ahead = false;
  if (*ok && payload != NULL) j->busy = true;
  return payload;
}

/* A worker takes a message of the stream: when the client sends ahead,
 * the next one is read now (unless a read is in flight, one is in, or the
 * stream is ending); otherwise it is read with the reply. */
static void stream_started(job *j) {
  pthread_mutex_lock(&j->io_lock);
  if (j->read_ahead && !j->recv_pending && !j->have_ahead && !j->ending)
    stream_read(j, false, false, NULL, 0);
  pthread_mutex_unlock(&j->io_lock);
}

/* A worker is done with a message: its reply (out/out_len taken) goes,
 * or waits for the one in flight; a message read meanwhile goes to the
 * queue; a refusal (status not OK) or a broken call ends the stream. */
static void stream_done(job *j, int status, const char *message, int topos_code,
                        uint8_t *out, size_t out_len) {
  rpc_server *s = j->server;
  pthread_mutex_lock(&j->io_lock);
  j->busy = false;
  bool broken = j->broken;
  if (status != GRPC_STATUS_OK || broken) {
    /* Ending now: a message the read ahead brings meanwhile is dropped. */
    j->ending = true;
    pthread_mutex_unlock(&j->io_lock);
    free(out);
    if (broken)
      stream_drop(j);
    else
      stream_end(j, status, message, topos_code);
    return;
  }
  if (j->send_pending) {
    j->held = out;
    j->held_len = out_len;
    pthread_mutex_unlock(&j->io_lock);
    return;
  }
  /* A read ahead still out: the client waits for this reply before it
   * sends, so reading ahead buys nothing for now. */
  if (j->recv_pending && s->d->cfg->read_ahead == READ_AHEAD_AUTO)
    j->read_ahead = false;
  stream_reply(j, out, out_len);
  broken = j->broken;
  bool next = j->have_ahead && !broken, ok = false;
  grpc_byte_buffer *payload = next ? stream_take(j, &ok) : NULL;
  pthread_mutex_unlock(&j->io_lock);
  if (broken)
    stream_drop(j);
  else if (next)
    stream_next(s, j, ok, payload);
}

/* --------------------------------------------------------------- workers */

/* The request bytes of j: the payload's single slice when it has one,
 * else the slices copied into the worker's reused buffer.  *hold gets the
 * slice to unref afterwards (an empty slice when nothing is held). */
static int read_payload(worker *w, grpc_byte_buffer *bb, const uint8_t **data,
                        size_t *len, grpc_slice *hold) {
  *hold = grpc_empty_slice();
  *data = (const uint8_t *)"";
  *len = 0;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return -1;
  grpc_slice first, next;
  if (!grpc_byte_buffer_reader_next(&r, &first)) {
    grpc_byte_buffer_reader_destroy(&r);
    return 0;
  }
  if (!grpc_byte_buffer_reader_next(&r, &next)) {
    grpc_byte_buffer_reader_destroy(&r);
    /* A small slice keeps its bytes inline, in the struct itself: point
     * into the caller's copy, which lives on, not into `first`. */
    *hold = first;
    *data = GRPC_SLICE_START_PTR(*hold);
    *len = GRPC_SLICE_LENGTH(*hold);
    return 0;
  }
  reuse_buf *b = &w->input;
  b->len = 0;
  int rc = reuse_buf_reserve(b, grpc_byte_buffer_length(bb));
  grpc_slice s = first;
  bool read_ahead = true; /* `next` is still to be appended */
  for (;;) {
    size_t n = GRPC_SLICE_LENGTH(s);
    if (rc == 0 && reuse_buf_reserve(b, b->len + n) == 0) {
      memcpy(b->data + b->len, GRPC_SLICE_START_PTR(s), n);
      b->len += n;
    } else {
      rc = -1;
    }
    grpc_slice_unref(s);
    if (read_ahead) {
      s = next;
      read_ahead = false;
    } else if (!grpc_byte_buffer_reader_next(&r, &s)) {
      break;
    }
  }
  grpc_byte_buffer_reader_destroy(&r);
  *data = b->data;
  *len = b->len;
  return rc;
}

static int64_t micros_between(int64_t from_ns, int64_t to_ns) {
  return (to_ns - from_ns) / 1000;
}

static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs method m's handler over cx (its request set; a status already set
 * by reading the request skips the handler), then logs the request, counts
 * it and resets the worker's memory.  What the handler left in cx is the
 * transport's to send. */
static void serve(worker *w, int method, call_ctx *cx, int transport,
                  const char *peer, int64_t arrival_ns, int64_t picked_ns,
                  int64_t cpu_start_ns) {
  rpc_server *s = w->server;
  daemon_state *d = s->d;
  const method_def *m = &handler_methods[method];
  cx->d = d;
  cx->alloc = &w->arena.allocator;
  cx->peer = peer;
  cx->method = m->name;
  cx->quotas = s->quotas;
  cx->request_id = atomic_fetch_add(&s->next_request_id, 1) + 1;
  size_t bytes_in = cx->in_len;
  /* The handlers' engine runs carry call_should_stop in their context
   * (handlers.c, call_exec), so a cancelled call, an expired deadline or a
   * drain stops the job at a node boundary and its buffers are released. */
  if (cx->status == GRPC_STATUS_OK && call_continue(cx)) m->handler(cx);
  /* The upload is in the store now, or failed: no longer in flight. */
  if (cx->upload_counted > 0) {
    quota_upload_done(s->quotas, cx->tenant, cx->upload_counted);
    cx->upload_counted = 0;
  }
  if (cx->status == GRPC_STATUS_INTERNAL) {
    /* A bug: the request id ties the client's error to the log line. */
    size_t len = strlen(cx->message);
    snprintf(cx->message + len, sizeof cx->message - len, " (request %llu)",
             (unsigned long long)cx->request_id);
  }
  if (cx->status != GRPC_STATUS_OK && cx->out) {
    free(cx->out);
    cx->out = NULL;
    cx->out_len = 0;
  }

  int64_t done_ns = daemon_now_ns();
  log_request_line line = {
      .request_id = cx->request_id,
      .method = m->name,
      .spec_id = cx->spec_id,
      .peer = peer,
      .status = cx->status,
      .message = cx->message,
      .bytes_in = (int64_t)bytes_in,
      .bytes_out = (int64_t)cx->out_len,
      .queue_us = micros_between(arrival_ns, picked_ns),
      .duration_us = micros_between(arrival_ns, done_ns),
      .cpu_us = micros_between(cpu_start_ns, thread_cpu_ns()),
  };
  log_request(&line);
  metrics_observe(method, transport, cx->status,
                  micros_between(arrival_ns, done_ns));
  metrics_observe_tenant(cx->tenant, cx->status);
  atomic_fetch_add(&d->requests, 1);
  if (cx->status != GRPC_STATUS_OK) atomic_fetch_add(&d->errors, 1);

  arena_reset(&w->arena);
  reuse_buf_reset(&w->input);
}

/* Runs a call of another transport: its request is its own bytes, its
 * result goes back through c->done. */
static void run_service_call(worker *w, service_call *c, int64_t picked_ns) {
  int64_t cpu_start_ns = thread_cpu_ns();
  call_ctx cx;
  memset(&cx, 0, sizeof cx);
  cx.in = c->in;
  cx.in_len = c->in_len;
  cx.has_message = c->has_message;
  cx.deadline_ns = c->deadline_ns;
  cx.cancelled = &c->cancelled;
  cx.tenant = c->tenant;
  cx.admin = c->admin;
  cx.quota = c->has_quota ? &c->quota : NULL;
  cx.status = GRPC_STATUS_OK;
  serve(w, c->method, &cx, TRANSPORT_HTTP, c->peer, c->arrival_ns, picked_ns,
        cpu_start_ns);
  c->status = cx.status;
  c->topos_code = cx.topos_code;
  memcpy(c->message, cx.message, sizeof c->message);
  c->out = cx.out;
  c->out_len = cx.out_len;
}

/* The worker is about to send its job's reply, then look for the next
 * job: from now on it counts among the workers watching the queue, so a
 * job the reply prompts (the client's next call, or its stream's next
 * message, often queued while the reply is still going out) wakes no
 * sleeping worker for nothing: a futex round, and the woken one polling
 * for spin_us before it sleeps again.  queue_pop takes the count back. */
static void worker_awake(worker *w) {
  /* Not the prober: it runs on the queue thread, which never pops. */
  if (w == &w->server->prober) return;
  atomic_fetch_add(&w->server->queue.spinning, 1);
  w->counted = true;
}

static void worker_run_job(worker *w, job *j) {
  int64_t picked_ns = daemon_now_ns();
  if (j->ext) {
    service_call *c = j->ext;
    run_service_call(w, c, picked_ns);
    if (c->quota_counted) quota_release(w->server->quotas, c->tenant);
    c->quota_counted = false;
    job_unref(j);
    worker_awake(w);
    c->done(c); /* the last touch: c may be gone after this */
    return;
  }
  int64_t cpu_start_ns = thread_cpu_ns();
  const method_def *m = &handler_methods[j->method];
  call_ctx cx;
  memset(&cx, 0, sizeof cx);
  cx.deadline_ns = j->deadline_ns;
  cx.cancelled = &j->cancelled;
  cx.tenant = j->tenant;
  cx.admin = j->admin;
  cx.quota = j->has_quota ? &j->quota : NULL;
  cx.status = GRPC_STATUS_OK;

  grpc_slice hold = grpc_empty_slice();
  if (j->payload != NULL &&
      j->payload->data.raw.compression != GRPC_COMPRESS_NONE) {
    /* Never inflated (rpc_server_start): refused as the gRPC spec asks. */
    cx.status = GRPC_STATUS_UNIMPLEMENTED;
    snprintf(cx.message, sizeof cx.message,
             "%s: compressed requests are not accepted; send the message "
             "uncompressed (grpc-encoding identity)",
             m->name);
  } else if (j->payload != NULL) {
    if (read_payload(w, j->payload, &cx.in, &cx.in_len, &hold) != 0) {
      cx.status = GRPC_STATUS_RESOURCE_EXHAUSTED;
      snprintf(cx.message, sizeof cx.message,
               "%s: out of memory reading the request", m->name);
    }
    cx.has_message = true;
  }
  cx.train = j->train;
  if (j->train) stream_started(j);
  serve(w, j->method, &cx, TRANSPORT_GRPC, j->peer, j->arrival_ns, picked_ns,
        cpu_start_ns);
  grpc_slice_unref(hold);
  if (j->payload) {
    grpc_byte_buffer_destroy(j->payload);
    j->payload = NULL;
  }
  if (j->train) {
    /* A stream's message: its reply goes (a refusal ends the stream). */
    worker_awake(w);
    stream_done(j, cx.status, cx.message, cx.topos_code, cx.out, cx.out_len);
    return;
  }
  /* In flight from admission to reply: released before the reply goes,
   * so a client that saw it may send its next call at once. */
  if (j->quota_counted) quota_release(w->server->quotas, j->tenant);
  j->quota_counted = false;
  worker_awake(w);
  job_send(j, cx.status, cx.message, cx.topos_code, cx.out, cx.out_len, false);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  rpc_server *s = w->server;
  job *j;
  /* Workers are dealt to the devices in turn: worker i runs its GPU
   * tasks on device i mod count (none: nothing happens). */
  topos_devices_bind_thread((int)(w - s->workers));
  /* Named for ps -L, top -H and perf (at most 15 characters). */
  char name[16];
  snprintf(name, sizeof name, "toposd-work%u",
           (unsigned)(w - s->workers) % 10000u);
  pthread_setname_np(pthread_self(), name);
  while ((j = queue_pop(&s->queue, &s->d->queue_depth, w->counted)) != NULL) {
    w->counted = false;
    atomic_fetch_add(&s->d->busy_workers, 1);
    worker_run_job(w, j);
    atomic_fetch_sub(&s->d->busy_workers, 1);
  }
  return NULL;
}

/* ------------------------------------------------------ the queue thread */

static void post_request(rpc_server *s, request_slot *slot) {
  if (s->shutdown_started) return;
  slot->call = NULL;
  slot->payload = NULL;
  grpc_metadata_array_init(&slot->metadata);
  grpc_call_error e;
  if (slot->method >= 0 || slot->method == METHOD_WATCH) {
    e = grpc_server_request_registered_call(
        s->server,
        slot->method >= 0 ? s->methods[slot->method] : s->watch_method,
        &slot->call, &slot->deadline, &slot->metadata,
        slot->method >= 0 && handler_methods[slot->method].stream
            ? NULL
            : &slot->payload,
        s->cq, s->cq, &slot->tag);
  } else {
    grpc_call_details_init(&slot->details);
    e = grpc_server_request_call(s->server, &slot->call, &slot->details,
                                 &slot->metadata, s->cq, s->cq, &slot->tag);
  }
  slot->posted = e == GRPC_CALL_OK;
  if (!slot->posted) {
    grpc_metadata_array_destroy(&slot->metadata);
    if (slot->method == METHOD_UNREGISTERED)
      grpc_call_details_destroy(&slot->details);
  }
}

/* ------------------------------------------------------ health watchers */

static int serving_status(rpc_server *s, const watcher *w) {
  if (w->unknown)
    return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
  return atomic_load(&s->d->draining) || s->shutdown_started
             ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
             : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

static void watcher_unref(rpc_server *s, watcher *w) {
  if (--w->refs > 0) return;
  if (w->prev)
    w->prev->next = w->next;
  else
    s->watchers = w->next;
  if (w->next) w->next->prev = w->prev;
  if (w->out) grpc_byte_buffer_destroy(w->out);
  grpc_slice_unref(w->details);
  grpc_metadata_array_destroy(&w->metadata);
  grpc_call_unref(w->call);
  listener_call_end(s->listener, w->conn);
  free(w);
}

/* Sends what the watcher has not seen: the status when it changed, or
 * (finishing) the last status and the end of the stream.  One batch at a
 * time; the completion calls this again. */
static void watcher_send(rpc_server *s, watcher *w) {
  if (w->sending || w->gone || w->finished) return;
  int status = serving_status(s, w);
  bool finish = w->finishing && status == w->sent;
  if (status == w->sent && !finish) return;
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (w->sent < 0) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (finish) {
    w->details = grpc_slice_from_static_string("toposd is stopping");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_UNAVAILABLE;
    ops[n].data.send_status_from_server.status_details = &w->details;
    n++;
    w->finished = true;
  } else {
    Grpc__Health__V1__HealthCheckResponse r =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    uint8_t buf[16];
    size_t len = protobuf_c_message_pack(&r.base, buf);
    grpc_slice slice = grpc_slice_from_copied_buffer((const char *)buf, len);
    if (w->out) grpc_byte_buffer_destroy(w->out);
    w->out = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = w->out;
    n++;
    w->sent = status;
  }
  w->refs++;
  w->sending = true;
  if (grpc_call_start_batch(w->call, ops, n, &w->send_tag, NULL) !=
      GRPC_CALL_OK) {
    w->sending = false;
    w->gone = true;
    watcher_unref(s, w);
  }
}

static void watchers_update(rpc_server *s, bool finish) {
  for (watcher *w = s->watchers, *next; w; w = next) {
    next = w->next;
    if (finish) w->finishing = true;
    watcher_send(s, w);
  }
}

/* A Watch call arrived: answer the status now and keep the stream. */
static void on_watch(rpc_server *s, request_slot *slot) {
  watcher *w = calloc(1, sizeof *w);
  Grpc__Health__V1__HealthCheckRequest *req = NULL;
  if (slot->payload != NULL) {
    grpc_slice hold;
    worker *p = &s->prober;
    const uint8_t *data = NULL;
    size_t len = 0;
    if (read_payload(p, slot->payload, &data, &len, &hold) == 0)
      req = grpc__health__v1__health_check_request__unpack(NULL, len, data);
    grpc_slice_unref(hold);
    reuse_buf_reset(&p->input);
    grpc_byte_buffer_destroy(slot->payload);
  }
  const char *why = NULL;
  if (w == NULL)
    why = "daemon out of memory";
  else if (slot->payload != NULL && req == NULL)
    why = "HealthCheckRequest does not parse";
  if (why != NULL) {
    grpc_call_cancel_with_status(
        slot->call,
        w ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_RESOURCE_EXHAUSTED, why,
        NULL);
    grpc_call_unref(slot->call);
    grpc_metadata_array_destroy(&slot->metadata);
    free(w);
    if (req) grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    return;
  }
  w->send_tag = (tag){TAG_WATCH_SEND, w};
  w->close_tag = (tag){TAG_WATCH_CLOSE, w};
  w->call = slot->call;
  w->metadata = slot->metadata; /* moved */
  w->details = grpc_empty_slice();
  w->sent = -1;
  char *peer = grpc_call_get_peer(w->call);
  char shown[64];
  w->conn = listener_call_begin(s->listener, peer, shown, sizeof shown);
  gpr_free(peer);
  w->unknown = req != NULL && req->service[0] != '\0' &&
               strcmp(req->service, "topos.v1.Topos") != 0;
  if (req) grpc__health__v1__health_check_request__free_unpacked(req, NULL);
  w->next = s->watchers;
  if (s->watchers) s->watchers->prev = w;
  s->watchers = w;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &w->close_cancelled;
  w->refs = 1;
  if (grpc_call_start_batch(w->call, &op, 1, &w->close_tag, NULL) !=
      GRPC_CALL_OK) {
    w->gone = true;
    watcher_unref(s, w);
    return;
  }
  w->finishing = s->shutdown_started;
  watcher_send(s, w);
}

/* Logs and counts a call answered without a worker (unknown method, full
 * queue, draining, shutting down, a quota); tenant is the caller's once its
 * token was accepted, else "". */
static void log_refusal(rpc_server *s, const char *method, int method_index,
                        int transport, const char *tenant, const char *peer,
                        int status, const char *message, int64_t bytes_in,
                        int64_t arrival_ns) {
  uint64_t id = atomic_fetch_add(&s->next_request_id, 1) + 1;
  log_request_line line = {
      .request_id = id,
      .method = method,
      .spec_id = "",
      .peer = peer,
      .status = status,
      .message = message,
      .bytes_in = bytes_in,
      .bytes_out = 0,
      .queue_us = 0,
      .duration_us = micros_between(arrival_ns, daemon_now_ns()),
      .cpu_us = -1,
  };
  log_request(&line);
  if (method_index >= 0)
    metrics_observe(method_index, transport, status, line.duration_us);
  metrics_observe_tenant(tenant, status);
  atomic_fetch_add(&s->d->requests, 1);
  atomic_fetch_add(&s->d->errors, 1);
}

/* Answers a job from the queue thread without a worker (unknown method,
 * full queue, shutting down). */
static void reject(rpc_server *s, job *j, int status, const char *message,
                   const char *method, bool with_close) {
  log_refusal(s, method, j->method, TRANSPORT_GRPC, j->tenant, j->peer, status,
              message,
              j->payload ? (int64_t)grpc_byte_buffer_length(j->payload) : 0,
              j->arrival_ns);
  job_send(j, status, message, 0, NULL, 0, with_close);
}

/* Why new work is refused now (UNAVAILABLE), or NULL when it is taken. */
static const char *refusal(rpc_server *s) {
  if (atomic_load(&s->d->cancel_all)) return "toposd is shutting down";
  if (atomic_load(&s->d->draining))
    return "toposd is draining (SIGTERM): it takes no new work; retry on "
           "another server";
  return NULL;
}

static void queue_full_message(rpc_server *s, const char *tenant, char *buf,
                               size_t len) {
  if (tenant[0] != '\0')
    snprintf(buf, len,
             "job queue full (%d jobs; one tenant may hold %d of them)",
             s->queue.capacity, s->queue.share);
  else
    snprintf(buf, len, "job queue full (%d jobs)", s->queue.capacity);
}

/* The deadline the client gave (INT64_MAX: none). */
static int64_t client_deadline(gpr_timespec deadline, int64_t now_ns) {
  gpr_timespec mono = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(mono, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0)
    return INT64_MAX;
  gpr_timespec left = gpr_time_sub(mono, gpr_now(GPR_CLOCK_MONOTONIC));
  if (left.tv_sec > (int64_t)1 << 31) return INT64_MAX;
  return now_ns + left.tv_sec * 1000000000 + left.tv_nsec;
}

/* A run's deadline: the client's, else the daemon's default from now. */
static int64_t run_deadline(rpc_server *s, int64_t client_ns, int64_t now_ns) {
  int64_t ms = s->d->cfg->deadline_ms;
  if (client_ns != INT64_MAX || ms <= 0) return client_ns;
  return now_ns + ms * 1000000;
}

static int64_t deadline_of(rpc_server *s, gpr_timespec deadline,
                           int64_t now_ns) {
  return run_deadline(s, client_deadline(deadline, now_ns), now_ns);
}

/* The value of j's "authorization" metadata, or NULL. */
static const grpc_slice *authorization_of(const job *j) {
  for (size_t i = 0; i < j->metadata.count; i++)
    if (grpc_slice_str_cmp(j->metadata.metadata[i].key, "authorization") == 0)
      return &j->metadata.metadata[i].value;
  return NULL;
}

/* Checks j's bearer token (auth.h) once, before the job is queued: true
 * with j->tenant set, or false with j answered.  A refusal is the audit
 * line event=auth, with the peer and never the secret. */
static bool authenticate(rpc_server *s, job *j, const char *method) {
  if (s->d->auth == NULL) return true;
  const grpc_slice *v = authorization_of(j);
  auth_result r;
  int64_t now_ms = daemon_now_ns() / 1000000;
  if (!auth_peer_throttled(s->d->auth, j->peer, now_ms, &r)) {
    auth_check(s->d->auth, method,
               v ? (const char *)GRPC_SLICE_START_PTR(*v) : NULL,
               v ? GRPC_SLICE_LENGTH(*v) : 0, &r);
    if (r.status == GRPC_STATUS_OK) {
      snprintf(j->tenant, sizeof j->tenant, "%s", r.tenant);
      j->admin = r.admin;
      return true;
    }
    if (r.status == GRPC_STATUS_UNAUTHENTICATED)
      auth_peer_failed(s->d->auth, j->peer, now_ms);
  }
  log_event_at(LOG_WARN, "auth", "refused %s from %s (grpc): %s%s%s", method,
               j->peer, r.reason, r.token_id[0] ? " token " : "", r.token_id);
  reject(s, j, r.status, r.message, method, false);
  return false;
}

/* The quotas of tenant's call (docs/operations.md, "Quotas"), once it
 * passed auth and before it is queued: reads them from the store, caps
 * the deadline at run_ms and admits the call under in-flight and rate.
 * True when the call goes on (*counted: quota_release it once answered);
 * false with status and message set and nothing counted. */
static bool admit_quota(rpc_server *s, const char *tenant, const char *method,
                        int64_t arrival_ns, int64_t *deadline_ns,
                        store_quota *q, bool *has, bool *counted, int *weight,
                        int *status, char *message, size_t len) {
  *has = false;
  *counted = false;
  *weight = 1;
  if (s->d->auth == NULL || tenant[0] == '\0') return true;
  topos_error err = {0};
  bool any = false;
  if (auth_quota(s->d->auth, tenant, q, &any, &err) != TOPOS_OK) {
    *status = GRPC_STATUS_UNAVAILABLE;
    snprintf(message, len, "%s: cannot read the tenant's quotas: %.400s",
             method, err.message);
    return false;
  }
  /* The scheduling weight is read with the quotas (not a limit). */
  if (q->weight > 0) *weight = (int)q->weight;
  if (!any) return true;
  *has = true;
  *deadline_ns = quota_deadline(q, arrival_ns, *deadline_ns);
  if (q->inflight < 0 && q->rate_per_s <= 0) return true;
  if (!quota_admit(s->quotas, tenant, q, method, daemon_now_ns(), message,
                   len)) {
    *status = GRPC_STATUS_RESOURCE_EXHAUSTED;
    return false;
  }
  *counted = true;
  return true;
}

/* A Train stream passed auth and its quotas: its session, then the
 * first read.  It counts in flight (quota) until it ends. */
static void stream_open(rpc_server *s, job *j) {
  j->train = train_session_new();
  if (j->train == NULL) {
    if (j->quota_counted) quota_release(s->quotas, j->tenant);
    j->quota_counted = false;
    reject(s, j, GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon out of memory",
           "Train", false);
    return;
  }
  pthread_mutex_lock(&j->io_lock);
  j->read_ahead = s->d->cfg->read_ahead == READ_AHEAD_ALWAYS;
  stream_read(j, true, false, NULL, 0);
  bool failed = !j->recv_pending;
  pthread_mutex_unlock(&j->io_lock);
  if (failed) stream_drop(j);
}

/* The stream's next message, read (ok, payload taken; NULL: the client's
 * end): a job for a worker, in the tenant's turn like any call, or the
 * stream's end.  The caller marked the stream busy (stream_take) when it
 * is a message; a refused one leaves it idle. */
static void stream_next(rpc_server *s, job *j, bool ok,
                        grpc_byte_buffer *payload) {
  if (!ok) {
    if (payload) grpc_byte_buffer_destroy(payload);
    stream_drop(j);
    return;
  }
  if (payload == NULL) {
    stream_end(j, GRPC_STATUS_OK, "", 0);
    return;
  }
  int64_t now = daemon_now_ns();
  j->payload = payload;
  j->arrival_ns = now;
  /* Each message is one run: the daemon's default deadline and the
   * tenant's run_ms apply to it, the client's to the whole stream. */
  j->deadline_ns = run_deadline(s, j->stream_deadline_ns, now);
  if (j->has_quota)
    j->deadline_ns = quota_deadline(&j->quota, now, j->deadline_ns);
  const char *why = refusal(s);
  char message[512];
  if (why == NULL) {
    if (queue_push(&s->queue, j, j->tenant, j->weight, &s->d->queue_depth))
      return;
    queue_full_message(s, j->tenant, message, sizeof message);
    why = message;
  }
  pthread_mutex_lock(&j->io_lock);
  j->busy = false;
  j->ending = true; /* as in stream_done */
  pthread_mutex_unlock(&j->io_lock);
  log_refusal(s, "Train", j->method, TRANSPORT_GRPC, j->tenant, j->peer,
              GRPC_STATUS_UNAVAILABLE, why,
              (int64_t)grpc_byte_buffer_length(j->payload), now);
  grpc_byte_buffer_destroy(j->payload);
  j->payload = NULL;
  stream_end(j, GRPC_STATUS_UNAVAILABLE, why, 0);
}

/* A stream's read is in (queue thread): the next message, the client's
 * end, or a broken call.  A busy stream, or one holding a reply, keeps it
 * for later. */
static void on_stream_recv(rpc_server *s, job *j, bool ok) {
  pthread_mutex_lock(&j->io_lock);
  j->recv_pending = false;
  if (j->read_sends) {
    j->read_sends = false;
    j->send_pending = false;
    /* In at once: the message was waiting, so the client sends ahead. */
    if (ok && s->d->cfg->read_ahead == READ_AHEAD_AUTO &&
        daemon_now_ns() - j->read_start_ns < STREAM_AHEAD_NS)
      j->read_ahead = true;
  }
  grpc_byte_buffer *payload = j->ahead;
  j->ahead = NULL;
  if (j->ending) {
    /* An end that waited for the reply this read carried starts now. */
    bool finish = stream_end_due(j);
    pthread_mutex_unlock(&j->io_lock);
    if (payload) grpc_byte_buffer_destroy(payload);
    if (finish) stream_finish(j, j->end_status, j->end_message, j->end_code);
    job_unref(j);
    return;
  }
  j->ahead = payload;
  j->have_ahead = true;
  j->ahead_ok = ok;
  if (j->busy || j->held != NULL) {
    pthread_mutex_unlock(&j->io_lock);
    job_unref(j);
    return;
  }
  payload = stream_take(j, &ok);
  pthread_mutex_unlock(&j->io_lock);
  stream_next(s, j, ok, payload);
  job_unref(j); /* the read's; the stream's own keeps j */
}

/* A stream's reply went (queue thread): a held reply follows it, then a
 * message that waited for it, or the stream's end that did. */
static void on_stream_sent(rpc_server *s, job *j, bool ok) {
  pthread_mutex_lock(&j->io_lock);
  j->send_pending = false;
  if (j->over) {
    pthread_mutex_unlock(&j->io_lock);
    job_unref(j);
    return;
  }
  if (!ok) j->broken = true;
  if (j->busy) {
    /* The worker sees broken when it is done. */
    pthread_mutex_unlock(&j->io_lock);
    job_unref(j);
    return;
  }
  bool drop = j->broken, next = false, ahead_ok = false;
  grpc_byte_buffer *payload = NULL;
  if (!drop && stream_end_due(j)) {
    pthread_mutex_unlock(&j->io_lock);
    stream_finish(j, j->end_status, j->end_message, j->end_code);
    job_unref(j);
    return;
  }
  if (!drop && j->held != NULL) {
    uint8_t *out = j->held;
    j->held = NULL;
    stream_reply(j, out, j->held_len);
    drop = j->broken;
    next = !drop && j->have_ahead;
    if (next) payload = stream_take(j, &ahead_ok);
  }
  pthread_mutex_unlock(&j->io_lock);
  if (drop)
    stream_drop(j);
  else if (next)
    stream_next(s, j, ahead_ok, payload);
  job_unref(j);
}

static void on_request(rpc_server *s, request_slot *slot, bool ok) {
  slot->posted = false;
  if (!ok) {
    /* The server is shutting down: the request is returned unused. */
    grpc_metadata_array_destroy(&slot->metadata);
    if (slot->method == METHOD_UNREGISTERED)
      grpc_call_details_destroy(&slot->details);
    return;
  }
  if (slot->method == METHOD_WATCH) {
    on_watch(s, slot);
    post_request(s, slot);
    return;
  }
  int64_t now = daemon_now_ns();
  job *j = calloc(1, sizeof *j);
  if (j == NULL) {
    /* Nothing to answer with: let the call die with its client. */
    grpc_call_cancel_with_status(slot->call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                 "daemon out of memory", NULL);
    grpc_call_unref(slot->call);
    if (slot->payload) grpc_byte_buffer_destroy(slot->payload);
    grpc_metadata_array_destroy(&slot->metadata);
    if (slot->method < 0) grpc_call_details_destroy(&slot->details);
    post_request(s, slot);
    return;
  }
  atomic_fetch_add(&s->live_jobs, 1);
  j->server = s;
  j->close_tag = (tag){TAG_CLOSE, j};
  j->send_tag = (tag){TAG_SEND, j};
  j->call = slot->call;
  j->method = slot->method;
  j->payload = slot->payload;
  j->metadata = slot->metadata; /* moved */
  j->status_details = grpc_empty_slice();
  j->arrival_ns = now;
  j->deadline_ns = deadline_of(s, slot->deadline, now);
  j->stream_deadline_ns = client_deadline(slot->deadline, now);
  j->recv_tag = (tag){TAG_TRAIN_RECV, j};
  j->sent_tag = (tag){TAG_TRAIN_SENT, j};
  pthread_mutex_init(&j->io_lock, NULL);
  char *peer = grpc_call_get_peer(j->call);
  j->conn = listener_call_begin(s->listener, peer, j->peer, sizeof j->peer);
  if (j->peer[0] == '\0') snprintf(j->peer, sizeof j->peer, "%s", peer);
  gpr_free(peer);
  if (slot->method < 0) {
    j->unknown_name = grpc_slice_to_c_string(slot->details.method);
    grpc_call_details_destroy(&slot->details);
  }
  post_request(s, slot);

  if (j->method < 0) {
    atomic_store(&j->refs, 1);
    char message[512];
    snprintf(message, sizeof message, "unknown method %s", j->unknown_name);
    reject(s, j, GRPC_STATUS_UNIMPLEMENTED, message, j->unknown_name, true);
    return;
  }
  /* Two references: the close batch and the reply batch. */
  atomic_store(&j->refs, 2);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &j->close_cancelled;
  if (grpc_call_start_batch(j->call, &op, 1, &j->close_tag, NULL) !=
      GRPC_CALL_OK)
    atomic_store(&j->refs, 1);
  const method_def *m = &handler_methods[j->method];
  if (m->probe) {
    /* Probes never wait behind work, and are answered while draining.
     * They carry no token: load balancers and orchestrators ask them. */
    worker_run_job(&s->prober, j);
  } else if (!authenticate(s, j, m->name)) {
    /* Answered UNAUTHENTICATED (or UNAVAILABLE when the store failed);
     * the call never reached the queue. */
  } else if (refusal(s) != NULL) {
    reject(s, j, GRPC_STATUS_UNAVAILABLE, refusal(s), m->name, false);
  } else {
    int status = GRPC_STATUS_OK;
    char message[512];
    if (!admit_quota(s, j->tenant, m->name, j->arrival_ns, &j->deadline_ns,
                     &j->quota, &j->has_quota, &j->quota_counted, &j->weight,
                     &status, message, sizeof message)) {
      reject(s, j, status, message, m->name, false);
    } else if (m->stream) {
      stream_open(s, j);
    } else if (!queue_push(&s->queue, j, j->tenant, j->weight,
                           &s->d->queue_depth)) {
      if (j->quota_counted) quota_release(s->quotas, j->tenant);
      j->quota_counted = false;
      queue_full_message(s, j->tenant, message, sizeof message);
      reject(s, j, GRPC_STATUS_UNAVAILABLE, message, m->name, false);
    }
  }
}

int rpc_method_index(const char *name) {
  for (int i = 0; i < handler_method_count; i++)
    if (strcmp(handler_methods[i].name, name) == 0) return i;
  return -1;
}

bool rpc_submit(rpc_server *s, service_call *c) {
  const method_def *m = &handler_methods[c->method];
  c->status = GRPC_STATUS_OK;
  c->topos_code = 0;
  c->message[0] = '\0';
  c->out = NULL;
  c->out_len = 0;
  c->has_quota = false;
  c->quota_counted = false;
  char why[512];
  int status = GRPC_STATUS_UNAVAILABLE;
  int weight = 1;
  if (!m->probe &&
      !admit_quota(s, c->tenant, m->name, c->arrival_ns, &c->deadline_ns,
                   &c->quota, &c->has_quota, &c->quota_counted, &weight,
                   &status, why, sizeof why)) {
    c->status = status;
    snprintf(c->message, sizeof c->message, "%s", why);
    log_refusal(s, m->name, c->method, TRANSPORT_HTTP, c->tenant, c->peer,
                status, why, (int64_t)c->in_len, c->arrival_ns);
    return false;
  }
  if (m->probe || c->inline_call) {
    /* Probes never wait behind work, and are answered while draining. */
    pthread_mutex_lock(&s->ext_prober_lock);
    run_service_call(&s->ext_prober, c, daemon_now_ns());
    pthread_mutex_unlock(&s->ext_prober_lock);
    if (c->quota_counted) quota_release(s->quotas, c->tenant);
    c->quota_counted = false;
    return false;
  }
  const char *refused = refusal(s);
  status = GRPC_STATUS_UNAVAILABLE;
  if (refused == NULL) {
    job *j = calloc(1, sizeof *j);
    if (j != NULL) {
      atomic_fetch_add(&s->live_jobs, 1);
      atomic_store(&j->refs, 1);
      j->server = s;
      j->ext = c;
      j->method = c->method;
      j->status_details = grpc_empty_slice();
      if (queue_push(&s->queue, j, c->tenant, weight, &s->d->queue_depth))
        return true;
      job_unref(j);
      if (c->quota_counted) quota_release(s->quotas, c->tenant);
      c->quota_counted = false;
      queue_full_message(s, c->tenant, why, sizeof why);
    } else {
      status = GRPC_STATUS_RESOURCE_EXHAUSTED;
      snprintf(why, sizeof why, "daemon out of memory");
    }
    refused = why;
  }
  c->status = status;
  snprintf(c->message, sizeof c->message, "%s", refused);
  log_refusal(s, m->name, c->method, TRANSPORT_HTTP, c->tenant, c->peer, status,
              refused, (int64_t)c->in_len, c->arrival_ns);
  return false;
}

static void dispatch(rpc_server *s, grpc_event ev) {
  tag *t = ev.tag;
  switch (t->kind) {
    case TAG_REQUEST:
      on_request(s, t->owner, ev.success != 0);
      break;
    case TAG_CLOSE: {
      job *j = t->owner;
      if (ev.success == 0 || j->close_cancelled) atomic_store(&j->cancelled, 1);
      job_unref(j);
      break;
    }
    case TAG_SEND:
      job_unref(t->owner);
      break;
    case TAG_TRAIN_RECV:
      on_stream_recv(s, t->owner, ev.success != 0);
      break;
    case TAG_TRAIN_SENT:
      on_stream_sent(s, t->owner, ev.success != 0);
      break;
    case TAG_WATCH_SEND: {
      watcher *w = t->owner;
      w->sending = false;
      if (ev.success == 0) w->gone = true;
      watcher_send(s, w);
      watcher_unref(s, w);
      break;
    }
    case TAG_WATCH_CLOSE: {
      watcher *w = t->owner;
      w->gone = true;
      watcher_unref(s, w);
      break;
    }
    case TAG_SHUTDOWN:
      s->shutdown_done = true;
      break;
  }
}

/* ------------------------------------------------------------ life cycle */

rpc_server *rpc_server_start(daemon_state *d, char *bound, size_t boundlen,
                             char *msg, size_t msglen) {
  const toposd_config *cfg = d->cfg;
  rpc_server *s = calloc(1, sizeof *s);
  if (s == NULL) {
    snprintf(msg, msglen, "out of memory");
    return NULL;
  }
  if (handler_method_count > (int)(sizeof s->methods / sizeof s->methods[0])) {
    snprintf(msg, msglen, "too many methods for the method table");
    free(s);
    return NULL;
  }
  s->d = d;
  s->quotas = quota_table_new();
  if (s->quotas == NULL) {
    snprintf(msg, msglen, "out of memory");
    free(s);
    return NULL;
  }
  s->shutdown_tag = (tag){TAG_SHUTDOWN, s};
  queue_init(&s->queue, cfg->queue, cfg->spin_us * 1000);
  d->queue_capacity = cfg->queue;
  d->workers = cfg->workers;

  int max_bytes =
      cfg->max_message_bytes > INT_MAX ? INT_MAX : (int)cfg->max_message_bytes;
  int64_t idle =
      cfg->idle_timeout_ms > INT_MAX ? INT_MAX : cfg->idle_timeout_ms;
  grpc_arg args[5];
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = max_bytes;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = max_bytes;
  /* Compressed requests are refused, never inflated: gRPC would inflate a
   * message before checking the size limit, so 1 MB of gzip could cost
   * 256 MiB.  Only identity is enabled (a compressed call is answered
   * UNIMPLEMENTED, as the gRPC spec asks) and decompression is off, so
   * nothing is ever inflated even if a message slips through; the worker
   * refuses any payload still marked compressed. */
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET;
  args[2].value.integer = 1 << GRPC_COMPRESS_NONE;
  args[3].type = GRPC_ARG_INTEGER;
  args[3].key = GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION;
  args[3].value.integer = 0;
  /* A connection with no call this long gets a GOAWAY from gRPC itself;
   * the listener sheds silent ones (listener.c). */
  args[4].type = GRPC_ARG_INTEGER;
  args[4].key = GRPC_ARG_MAX_CONNECTION_IDLE_MS;
  args[4].value.integer = (int)idle;
  grpc_channel_args channel_args = {5, args};
  s->server = grpc_server_create(&channel_args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  for (int i = 0; i < handler_method_count; i++) {
    s->methods[i] = grpc_server_register_method(
        s->server, handler_methods[i].path, NULL,
        handler_methods[i].stream ? GRPC_SRM_PAYLOAD_NONE
                                  : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
        0);
  }
  s->watch_method = grpc_server_register_method(
      s->server, "/grpc.health.v1.Health/Watch", NULL,
      GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  /* gRPC gets no port of its own: the listener accepts and hands it each
   * connection (listener.h says why), or with TLS adds gRPC's SSL port.
   * listener_start starts the server either way, failure included. */
  s->listener = listener_start(s->server, cfg, d->listen_fd, bound, boundlen,
                               msg, msglen);
  d->listen_fd = -1; /* the listener's now, whatever the outcome */
  d->listener = s->listener;
  if (s->listener == NULL) {
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL)
               .tag != &s->shutdown_tag) {
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    queue_destroy(&s->queue);
    quota_table_free(s->quotas);
    free(s);
    return NULL;
  }

  s->nslots = handler_method_count * REQUESTS_PER_METHOD +
              UNREGISTERED_REQUESTS + WATCH_REQUESTS;
  s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
  s->nworkers = cfg->workers;
  s->workers = calloc((size_t)s->nworkers, sizeof *s->workers);
  if (s->slots == NULL || s->workers == NULL) {
    snprintf(msg, msglen, "out of memory");
    /* Not reached in practice; tear down like a stop with nothing live. */
    free(s->slots);
    free(s->workers);
    s->slots = NULL;
    s->workers = NULL;
    s->nslots = s->nworkers = 0;
    volatile sig_atomic_t stop = 1;
    rpc_server_run(s, &stop);
    rpc_server_destroy(s);
    return NULL;
  }
  for (int i = 0; i < s->nslots; i++) {
    request_slot *slot = &s->slots[i];
    slot->tag = (tag){TAG_REQUEST, slot};
    int registered = handler_method_count * REQUESTS_PER_METHOD;
    slot->method = i < registered ? i / REQUESTS_PER_METHOD
                   : i < registered + UNREGISTERED_REQUESTS
                       ? METHOD_UNREGISTERED
                       : METHOD_WATCH;
    post_request(s, slot);
  }
  s->prober.server = s;
  arena_init(&s->prober.arena, PROBER_RETAIN_BYTES);
  s->prober.input.retain = PROBER_RETAIN_BYTES;
  s->ext_prober.server = s;
  arena_init(&s->ext_prober.arena, PROBER_RETAIN_BYTES);
  s->ext_prober.input.retain = PROBER_RETAIN_BYTES;
  pthread_mutex_init(&s->ext_prober_lock, NULL);
  for (int i = 0; i < s->nworkers; i++) {
    worker *w = &s->workers[i];
    w->server = s;
    arena_init(&w->arena, WORKER_RETAIN_BYTES);
    w->input.retain = WORKER_RETAIN_BYTES;
    w->started = pthread_create(&w->thread, NULL, worker_main, w) == 0;
    if (!w->started)
      log_event_at(LOG_ERROR, "error", "cannot start worker %d", i);
  }
  return s;
}

int rpc_server_run(rpc_server *s, volatile sig_atomic_t *stop) {
  daemon_state *d = s->d;
  int64_t grace_end = 0, abandon_end = 0;
  int64_t next_trim = daemon_now_ns() + (int64_t)TRIM_MS * 1000000;
  /* systemd's watchdog (notify.h), fed while this loop turns. */
  int64_t watchdog_ns = notify_watchdog_period_ns(), next_watchdog = 0;
  bool cancelled = false;
  int rc = 0;
  /* docs/daemon.md, "Awake for a moment after work". */
  const int64_t spin_ns = d->cfg->spin_us * 1000;
  int64_t last_event_ns = INT64_MIN / 2;
  for (;;) {
    int64_t now = daemon_now_ns();
    if (*stop && !s->drain_started) {
      /* Draining: work calls are refused UNAVAILABLE, health probes say
       * NOT_SERVING, the calls in flight go on. */
      s->drain_started = true;
      atomic_store(&d->draining, 1);
      log_event("drain", "draining: no new work, %d calls in flight",
                atomic_load(&s->live_jobs));
      notify_stopping("draining");
      grace_end = now + d->cfg->grace_ms * 1000000;
      watchers_update(s, false); /* NOT_SERVING */
    }
    if (s->drain_started && !s->shutdown_started &&
        (atomic_load(&s->live_jobs) == 0 || now >= grace_end || *stop > 1)) {
      /* The work is done (or out of time): stop taking connections and
       * calls. */
      s->shutdown_started = true;
      listener_stop(s->listener);
      log_event("drain", "stopping: no new calls, %d in flight",
                atomic_load(&s->live_jobs));
      grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
      watchers_update(s, true); /* the streams end */
    }
    if (s->shutdown_started) {
      /* A second signal cancels at once.  So does the end of the work:
       * with no job left, gRPC's shutdown would otherwise wait for every
       * client to close its (idle) connection, until the grace ends. */
      if (!cancelled &&
          (now >= grace_end || *stop > 1 || atomic_load(&s->live_jobs) == 0)) {
        cancelled = true;
        atomic_store(&d->cancel_all, 1);
        grpc_server_cancel_all_calls(s->server);
        abandon_end = now + (int64_t)ABANDON_MS * 1000000;
        if (atomic_load(&s->live_jobs) > 0)
          log_event("drain", "grace period over: cancelling %d calls",
                    atomic_load(&s->live_jobs));
      }
      if (s->shutdown_done && atomic_load(&s->live_jobs) == 0) break;
      if (cancelled && now >= abandon_end) {
        log_event_at(LOG_ERROR, "error", "abandoning %d stuck calls",
                     atomic_load(&s->live_jobs));
        rc = 1;
        break;
      }
    }
    if (watchdog_ns > 0 && now >= next_watchdog) {
      notify_watchdog();
      next_watchdog = now + watchdog_ns;
    }
    if (now >= next_trim) {
      /* Memory freed after large messages and runs goes back to the
       * system while the daemon is idle (glibc keeps freed heap pages
       * otherwise: a rejected 512 MiB message left 410 MB behind). */
      if (atomic_load(&s->live_jobs) == 0) malloc_trim(0);
      next_trim = now + (int64_t)TRIM_MS * 1000000;
    }
    /* For a moment after an event the queue is polled without sleeping:
     * the next message of a conversation comes soon, and waking a thread
     * asleep in epoll costs more than the poll. */
    bool awake = now - last_event_ns < spin_ns;
    gpr_timespec until =
        awake ? gpr_inf_past(GPR_CLOCK_MONOTONIC)
              : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                             gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(s->cq, until, NULL);
    if (ev.type == GRPC_OP_COMPLETE) {
      dispatch(s, ev);
      last_event_ns = daemon_now_ns();
    } else if (awake) {
      sched_yield(); /* any other thread that wants this core goes first */
    }
  }
  if (rc != 0) return rc;
  queue_close(&s->queue);
  for (int i = 0; i < s->nworkers; i++) {
    worker *w = &s->workers[i];
    if (w->started) pthread_join(w->thread, NULL);
    w->started = false;
  }
  return 0;
}

void rpc_server_destroy(rpc_server *s) {
  if (s == NULL) return;
  grpc_server_destroy(s->server);
  grpc_completion_queue_shutdown(s->cq);
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE) dispatch(s, ev);
  }
  grpc_completion_queue_destroy(s->cq);
  for (int i = 0; i < s->nworkers; i++) {
    arena_destroy(&s->workers[i].arena);
    reuse_buf_destroy(&s->workers[i].input);
  }
  arena_destroy(&s->prober.arena);
  reuse_buf_destroy(&s->prober.input);
  arena_destroy(&s->ext_prober.arena);
  reuse_buf_destroy(&s->ext_prober.input);
  pthread_mutex_destroy(&s->ext_prober_lock);
  queue_destroy(&s->queue);
  listener_free(s->listener);
  free(s->workers);
  free(s->slots);
  quota_table_free(s->quotas);
  free(s);
}
