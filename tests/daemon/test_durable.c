/*
 * test_durable.c - acknowledged means durable (issue 10, items 5 and 10).
 *
 * By default PutBlob answers only once its blob is committed to the
 * store, so a daemon SIGKILLed at any moment under an upload load keeps
 * every blob it acknowledged: several clients upload distinct blobs (a
 * third of them 4 MiB) while the test kills and restarts the daemon on
 * the same file ten times, and afterwards every acknowledged blob is
 * there with its bytes (a Forward summing it gives the exact sum).
 * Stats counts what was acknowledged, right after PutBlob returns, both
 * by default and with early acknowledgement (--blob-pending-bytes),
 * where the blobs still waiting for the store are counted once each.
 */
#include "harness.h"

enum { SMALL = 16384, BIG = 1 << 20 }; /* f32 elements: 64 KiB, 4 MiB */

/* Blob (t, k): small integers, so a float sum is exact in any order;
 * elements 0 and 1 make it distinct. */
static void fill(float *v, int64_t n, int t, int k) {
  for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7 + k) % 4);
  v[0] = (float)t;
  v[1] = (float)k;
}

static double sum_of(const float *v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  return s;
}

/* One f32 tensor of n elements as a PutBlobRequest's bytes (free()). */
static uint8_t *blob_request(const float *v, int64_t n, size_t *len) {
  int64_t shape[1] = {n};
  Topos__V1__Tensor t = TOPOS__V1__TENSOR__INIT;
  t.dtype = TOPOS__V1__DTYPE__F32;
  t.n_shape = 1;
  t.shape = shape;
  t.data.len = (size_t)n * sizeof(float);
  t.data.data = (uint8_t *)v;
  Topos__V1__Tensor *one[1] = {&t};
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  pb.tensors = one;
  pb.n_tensors = 1;
  return pack(&pb.base, len);
}

/* PutBlob of blob (t, k) of n elements; the id and size on OK. */
static int put_blob(client *c, float *scratch, int64_t n, int t, int k,
                    int timeout_ms, char id[65], int64_t *bytes) {
  fill(scratch, n, t, k);
  size_t len = 0;
  uint8_t *msg = blob_request(scratch, n, &len);
  reply r;
  call_raw(c, "PutBlob", msg, len, timeout_ms, &r);
  free(msg);
  int status = r.status;
  if (status == GRPC_STATUS_OK) {
    Topos__V1__PutBlobReply *put =
        topos__v1__put_blob_reply__unpack(NULL, r.len, r.data);
    ck_assert_ptr_nonnull(put);
    ck_assert(wire_id_valid(put->id));
    memcpy(id, put->id, 65);
    *bytes = put->bytes;
    topos__v1__put_blob_reply__free_unpacked(put, NULL);
  }
  reply_clear(&r);
  return status;
}

static Topos__V1__StatsReply *stats(client *c) {
  Topos__V1__StatsRequest sr = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *st = NULL;
  CALL_OK(c, "Stats", &sr, &topos__v1__stats_reply__descriptor, &st);
  return st;
}

/* StatBlob: whether the blob is held, and its size. */
static bool stat_blob(client *c, const char *id, int64_t *bytes) {
  Topos__V1__StatBlobRequest sb = TOPOS__V1__STAT_BLOB_REQUEST__INIT;
  sb.id = (char *)id;
  Topos__V1__StatBlobReply *st = NULL;
  CALL_OK(c, "StatBlob", &sb, &topos__v1__stat_blob_reply__descriptor, &st);
  bool present = st->present;
  *bytes = st->bytes;
  wire_message_free(&st->base);
  return present;
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
  ck_assert_msg(net != NULL, "sum network: %s", err.message);
  topos_tensor_release(p0);
  return net;
}

/* Forward of spec `spec` (a sum_network) on blob `id`: the sum the daemon
 * computed from the stored bytes (which it re-hashes on every read). */
static double forward_sum(client *c, const char *spec, topos_value out,
                          const char *id) {
  topos_error err = {0};
  topos_value roots[1] = {out};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = (char *)spec;
  fr.entry = wire_entry_new(&e, NULL, &err);
  Topos__V1__Tensor *ref = wire_tensor_new_ref(id, 0, &err);
  ck_assert_ptr_nonnull(ref);
  Topos__V1__Tensor *params[1] = {ref};
  fr.parameters = params;
  fr.n_parameters = 1;
  Topos__V1__ForwardReply *fwd = NULL;
  CALL_OK(c, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
  ck_assert_int_eq(fwd->n_roots, 1);
  topos_tensor *t = tensor_of(fwd->roots[0]);
  double s = topos_tensor_get(t, NULL, &err);
  topos_tensor_release(t);
  wire_message_free(&fwd->base);
  wire_message_free(&ref->base);
  wire_message_free(&fr.entry->base);
  return s;
}

/* --------------------------------------------- kill -9 under uploads */

/* At most CLIENTS·PER_CLIENT blobs, a quarter of them 4 MiB: about 170 MB
 * of store at the end, so the test fits a CI disk with little room. */
enum { CLIENTS = 4, KILLS = 10, PER_CLIENT = 40 };

typedef struct acked_blob {
  char id[65];
  int64_t bytes;
  int k;
} acked_blob;

typedef struct uploader {
  int index;
  _Atomic int *port; /* 0 while the daemon is down */
  _Atomic int *stop;
  _Atomic int *acked_total;
  _Atomic int *finished; /* uploaders that reached PER_CLIENT */
  acked_blob acked[PER_CLIENT];
  int nacked, failed;
} uploader;

static bool is_big(int k) {
  return k % 4 == 0;
}

static void *upload_main(void *arg) {
  uploader *u = arg;
  float *scratch = malloc(sizeof(float) * BIG);
  ck_assert_ptr_nonnull(scratch);
  client c;
  int port = 0;
  for (int k = 0; !atomic_load(u->stop) && u->nacked < PER_CLIENT;) {
    int p = atomic_load(u->port);
    if (p == 0) {
      usleep(2000);
      continue;
    }
    if (p != port) {
      if (port != 0) client_close(&c);
      client_open(&c, p);
      port = p;
    }
    acked_blob *a = &u->acked[u->nacked];
    int status = put_blob(&c, scratch, is_big(k) ? BIG : SMALL, u->index, k,
                          30000, a->id, &a->bytes);
    if (status == GRPC_STATUS_OK) {
      a->k = k;
      u->nacked++;
      atomic_fetch_add(u->acked_total, 1);
    } else {
      /* Killed in flight, or not up yet: not acknowledged, so it may or
       * may not be there.  The next blob is a new one either way. */
      u->failed++;
      usleep(1000);
    }
    k++;
  }
  if (port != 0) client_close(&c);
  free(scratch);
  atomic_fetch_add(u->finished, 1);
  return NULL;
}

START_TEST(test_kill9_under_uploads) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  /* Every blob fits under the cap, so none is evicted. */
  const char *flags[] = {"--blob-cap-bytes", "4G", NULL};
  daemon_start(&d, flags);
  grpc_init();
  static uploader up[CLIENTS];
  pthread_t th[CLIENTS];
  _Atomic int port = d.port, stop = 0, acked = 0, finished = 0;
  for (int i = 0; i < CLIENTS; i++) {
    memset(&up[i], 0, sizeof up[i]);
    up[i].index = i;
    up[i].port = &port;
    up[i].stop = &stop;
    up[i].acked_total = &acked;
    up[i].finished = &finished;
    pthread_create(&th[i], NULL, upload_main, &up[i]);
  }
  unsigned seed = (unsigned)getpid();
  int kills = 0, acked_at_kills = 0;
  double until = now_s() + 40;
  for (; kills < KILLS && now_s() < until; kills++) {
    /* Let uploads flow on the new daemon, then kill it at a random
     * moment: with four clients, uploads are in flight at every one. */
    int before = atomic_load(&acked);
    while (atomic_load(&acked) < before + 6 && now_s() < until &&
           atomic_load(&finished) < CLIENTS)
      usleep(1000);
    usleep(1000 * (useconds_t)(rand_r(&seed) % 150));
    int status = daemon_stop(&d, SIGKILL, 10);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    acked_at_kills = atomic_load(&acked);
    atomic_store(&port, 0);
    daemon_start(&d, flags);
    atomic_store(&port, d.port);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
  ck_assert_int_eq(kills, KILLS);
  ck_assert_int_ge(acked_at_kills, KILLS * 6);

  /* The daemon restarted after the last kill holds every acknowledged
   * blob, with its bytes. */
  client c;
  client_open(&c, d.port);
  topos_value small_out, big_out;
  topos_network *small_net = sum_network(SMALL, &small_out);
  topos_network *big_net = sum_network(BIG, &big_out);
  char small_spec[65], big_spec[65];
  record(&c, small_net, small_spec);
  record(&c, big_net, big_spec);
  float *scratch = malloc(sizeof(float) * BIG);
  ck_assert_ptr_nonnull(scratch);
  int total = 0, lost = 0, big = 0, failed = 0;
  int64_t total_bytes = 0;
  for (int i = 0; i < CLIENTS; i++) {
    failed += up[i].failed;
    for (int j = 0; j < up[i].nacked; j++) {
      const acked_blob *a = &up[i].acked[j];
      int64_t n = is_big(a->k) ? BIG : SMALL, bytes = 0;
      total++;
      total_bytes += a->bytes;
      big += is_big(a->k);
      if (!stat_blob(&c, a->id, &bytes)) {
        lost++;
        continue;
      }
      ck_assert_int_eq(bytes, a->bytes);
      fill(scratch, n, i, a->k);
      double want = sum_of(scratch, n);
      double got = forward_sum(&c, is_big(a->k) ? big_spec : small_spec,
                               is_big(a->k) ? big_out : small_out, a->id);
      ck_assert_msg(got == want, "blob (%d, %d): sum %.1f, expected %.1f", i,
                    a->k, got, want);
    }
  }
  ck_assert_msg(lost == 0,
                "%d of %d acknowledged blobs lost over %d kills (%d of them "
                "4 MiB)",
                lost, total, kills, big);
  ck_assert_int_gt(big, 0);
  ck_assert_int_gt(failed, 0); /* the kills did hit uploads */
  /* Stats counts every one (and any that were stored unacknowledged). */
  Topos__V1__StatsReply *st = stats(&c);
  ck_assert_int_ge(st->blobs, total);
  ck_assert_int_ge(st->blob_bytes, total_bytes);
  wire_message_free(&st->base);
  free(scratch);
  topos_network_release(small_net);
  topos_network_release(big_net);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  daemon_cleanup(&d);
}
END_TEST

/* ------------------------------------------------ Stats counts acks */

/* Stats.blobs and blob_bytes right after each PutBlob returns: every
 * acknowledged blob, once.  Durable by default; with early
 * acknowledgement the 4 MiB blobs are still waiting for the store when
 * Stats is asked (the store writes one in tens of ms), which is what
 * the count used to miss.  A blob put again (while still pending, or
 * stored already) is not counted twice.  After a restart the store has
 * them all. */
static void check_stats_after_puts(const char *const *flags, bool early) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  daemon_start(&d, flags);
  grpc_init();
  client c;
  client_open(&c, d.port);
  float *scratch = malloc(sizeof(float) * BIG);
  ck_assert_ptr_nonnull(scratch);
  enum { N = 8 };
  char ids[N + 1][65];
  int64_t bytes = 0, total = 0;
  for (int k = 0; k < N; k++) {
    ck_assert_int_eq(put_blob(&c, scratch, BIG, 0, k, 0, ids[k], &bytes),
                     GRPC_STATUS_OK);
    total += bytes;
    Topos__V1__StatsReply *st = stats(&c);
    ck_assert_msg(st->blobs == k + 1 && st->blob_bytes == total,
                  "after %d PutBlobs (%lld bytes) Stats says %lld blobs, "
                  "%lld bytes",
                  k + 1, (long long)total, (long long)st->blobs,
                  (long long)st->blob_bytes);
    wire_message_free(&st->base);
  }
  /* The same blob twice in a row: the second finds the first pending or
   * stored. */
  for (int again = 0; again < 2; again++)
    ck_assert_int_eq(put_blob(&c, scratch, BIG, 0, N, 0, ids[N], &bytes),
                     GRPC_STATUS_OK);
  total += bytes;
  Topos__V1__StatsReply *st = stats(&c);
  ck_assert_int_eq(st->blobs, N + 1);
  ck_assert_int_eq(st->blob_bytes, total);
  wire_message_free(&st->base);
  /* Once written, a blob put again is still one blob. */
  if (early) usleep(1500000);
  for (int k = 0; k < 2; k++)
    ck_assert_int_eq(put_blob(&c, scratch, BIG, 0, k, 0, ids[k], &bytes),
                     GRPC_STATUS_OK);
  st = stats(&c);
  ck_assert_int_eq(st->blobs, N + 1);
  ck_assert_int_eq(st->blob_bytes, total);
  wire_message_free(&st->base);
  for (int k = 0; k <= N; k++) {
    int64_t size = 0;
    ck_assert(stat_blob(&c, ids[k], &size));
    ck_assert_int_eq(size, bytes);
  }
  client_close(&c);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  /* SIGTERM wrote whatever was pending: the store counts the same. */
  daemon_start(&d, flags);
  client_open(&c, d.port);
  st = stats(&c);
  ck_assert_int_eq(st->blobs, N + 1);
  ck_assert_int_eq(st->blob_bytes, total);
  wire_message_free(&st->base);
  client_close(&c);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 20), 20);
  free(scratch);
  daemon_cleanup(&d);
}

START_TEST(test_stats_counts_acknowledged) {
  /* The default: durable when it answers. */
  check_stats_after_puts(NULL, false);
}
END_TEST

START_TEST(test_stats_counts_pending) {
  const char *early[] = {"--blob-pending-bytes", "1G", NULL};
  check_stats_after_puts(early, true);
}
END_TEST

Suite *durable_suite(void) {
  Suite *s = suite_create("durable");
  TCase *tc = tcase_create("durable");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_kill9_under_uploads);
  tcase_add_test(tc, test_stats_counts_acknowledged);
  tcase_add_test(tc, test_stats_counts_pending);
  suite_add_tcase(s, tc);
  return s;
}
