/*
 * test_retention.c - memory and disk held to their bounds (issue 10,
 * item 4, and the store's file modes of item 8): the cache counts what
 * its entries keep in memory, plans hang from their networks' entries,
 * specs are retained by last use under --spec-bytes and never dropped
 * while in use, the store file keeps to --store-bytes, and the store is
 * private.
 *
 * The cache tests call server/cache.c directly: test_server.c compiles it
 * into the suite runner, and this file uses it through cache.h.
 */
#include "harness.h"

#include "../../server/cache.h"

static daemon_proc D;
static client C;

static void start(const char *const *extra) {
  fixture_start(&D, &C, extra);
}

static void stop(void) {
  fixture_stop(&D, &C, 60);
}

/* -------------------------------------------------------------- the cache */

static int destroyed;

static void count_destroy(void *v) {
  destroyed++;
  free(v);
}

static int *boxed(int v) {
  int *p = malloc(sizeof *p);
  *p = v;
  return p;
}

static int64_t cached_bytes(cache *c) {
  cache_counters cc;
  cache_stats(c, &cc);
  return cc.bytes;
}

START_TEST(test_cache_children) {
  destroyed = 0;
  cache *c = cache_new(8, 100);
  cache_entry *net, *plan, *other, *r;
  int *n = cache_put(c, "net a", boxed(1), count_destroy, 50, &net);
  cache_put_child(c, "net a", n, "plan a x", boxed(2), count_destroy, 30,
                  &plan);
  cache_release(c, plan);
  cache_release(c, net);
  ck_assert_int_eq(cached_bytes(c), 80);
  ck_assert_ptr_nonnull(cache_get(c, "plan a x", &r));
  cache_release(c, r);
  /* A child whose parent is not cached under that key and value is handed
   * back, not kept: it would keep memory the count does not see. */
  int *v =
      cache_put_child(c, "net b", n, "plan b", boxed(3), count_destroy, 10, &r);
  ck_assert_int_eq(*v, 3);
  ck_assert_ptr_null(cache_get(c, "plan b", &other));
  cache_release(c, r);
  int *stranger = boxed(9);
  cache_put_child(c, "net a", stranger, "plan a y", boxed(4), count_destroy, 10,
                  &r);
  ck_assert_ptr_null(cache_get(c, "plan a y", &other));
  cache_release(c, r);
  free(stranger);
  ck_assert_int_eq(destroyed, 2);
  ck_assert_int_eq(cached_bytes(c), 80);
  /* Making room evicts the network, which takes its plan with it: the
   * plan (which the cache would count as 30 bytes) no longer pins 50
   * uncounted ones. */
  cache_put(c, "net c", boxed(5), count_destroy, 60, &other);
  cache_release(c, other);
  ck_assert_ptr_null(cache_get(c, "net a", &r));
  ck_assert_ptr_null(cache_get(c, "plan a x", &r));
  ck_assert_int_eq(destroyed, 4);
  ck_assert_int_eq(cached_bytes(c), 60);
  cache_free(c);
}
END_TEST

START_TEST(test_cache_in_use) {
  destroyed = 0;
  cache *c = cache_new(8, 1000);
  cache_entry *net, *plan, *r;
  int *n = cache_put(c, "net a", boxed(1), count_destroy, 50, &net);
  cache_put_child(c, "net a", n, "plan a", boxed(2), count_destroy, 30, &plan);
  ck_assert(cache_in_use(c, "net a"));
  cache_release(c, net);
  /* A held plan keeps its network's spec in use. */
  ck_assert(cache_in_use(c, "net a"));
  ck_assert(!cache_drop(c, "net a"));
  ck_assert_ptr_nonnull(cache_get(c, "net a", &r));
  cache_release(c, r);
  /* Evicted while held (here by making room): still in use until the last
   * reference goes. */
  cache_entry *big;
  cache_put(c, "net big", boxed(3), count_destroy, 990, &big);
  cache_release(c, big);
  ck_assert_ptr_null(cache_get(c, "net a", &r));
  ck_assert(cache_in_use(c, "net a"));
  ck_assert(!cache_drop(c, "net a"));
  cache_release(c, plan);
  ck_assert(!cache_in_use(c, "net a"));
  ck_assert_int_eq(destroyed, 2);
  /* A value too large to keep is in use while held. */
  cache_entry *huge;
  cache_put(c, "net huge", boxed(4), count_destroy, 5000, &huge);
  ck_assert(cache_in_use(c, "net huge"));
  cache_release(c, huge);
  ck_assert(!cache_in_use(c, "net huge"));
  /* Pins: a key being loaded is in use before it is cached. */
  ck_assert(cache_pin(c, "net d"));
  ck_assert(cache_pin(c, "net d"));
  ck_assert(cache_in_use(c, "net d"));
  cache_unpin(c, "net d");
  ck_assert(cache_in_use(c, "net d"));
  cache_unpin(c, "net d");
  ck_assert(!cache_in_use(c, "net d"));
  /* cache_drop of an unused key evicts it at once. */
  ck_assert(cache_drop(c, "net big"));
  ck_assert_ptr_null(cache_get(c, "net big", &r));
  ck_assert(cache_drop(c, "net never"));
  ck_assert_int_eq(destroyed, 4);
  ck_assert_int_eq(cached_bytes(c), 0);
  cache_free(c);
}
END_TEST

/* A chain of n tanh nodes over one scalar input, offset by k (distinct
 * specs for distinct k). */
static topos_network *long_chain(int n, double k, topos_value *out) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F32, 0.0, &err);
  topos_value v = topos_name(tape, topos_input(tape, zero), "x");
  topos_tensor_release(zero);
  v = topos_add(tape, v, topos_scalar(tape, k));
  for (int i = 0; i < n; i++) v = topos_tanh(tape, v);
  *out = topos_name(tape, v, "y");
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "chain: %s", err.message);
  return net;
}

/* The daemon's cache counted networks by their encoding: 30 100k-node
 * specs of under 1 MB each "fit" in 256 MiB while holding gigabytes.
 * Counted by what they keep, only what fits stays. */
START_TEST(test_cache_counts_network_memory) {
  topos_error err = {0};
  topos_value out;
  topos_network *net = long_chain(100000, 1.0, &out);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(topos_network_encode(net, &bytes, &len, &err), TOPOS_OK);
  int64_t mem = (int64_t)topos_network_memory_bytes(net);
  ck_assert_int_gt(mem, 20 * (int64_t)len);
  int64_t bound = (int64_t)256 << 20;
  cache *c = cache_new(256, bound);
  for (int i = 0; i < 30; i++) {
    char key[32];
    snprintf(key, sizeof key, "net %d", i);
    topos_network *copy = topos_network_decode(bytes, len, &err);
    ck_assert_ptr_nonnull(copy);
    cache_entry *r;
    cache_put(c, key, copy, (cache_destroy_fn)topos_network_release,
              (int64_t)topos_network_memory_bytes(copy), &r);
    cache_release(c, r);
  }
  cache_counters cc;
  cache_stats(c, &cc);
  ck_assert_int_le(cc.bytes, bound);
  ck_assert_int_eq(cc.entries, bound / mem);
  ck_assert_int_lt(cc.entries, 30);
  cache_free(c);
  topos_free(bytes);
  topos_network_release(net);
}
END_TEST

/* ------------------------------------------------------------ daemon calls */

/* Record of net; returns the status, the id in id (on OK) and the
 * details in details. */
static int record_status(const topos_network *net, char id[65], char *details,
                         size_t dlen) {
  topos_error err = {0};
  Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
  ck_assert_int_eq(wire_spec_from_network(net, &spec, &err), TOPOS_OK);
  Topos__V1__RecordReply *rr = NULL;
  reply r;
  int status = call_msg(&C, "Record", &spec.base,
                        &topos__v1__record_reply__descriptor, (void **)&rr, &r);
  if (status == GRPC_STATUS_OK) {
    memcpy(id, rr->id, 65);
    wire_message_free(&rr->base);
  }
  if (details != NULL) snprintf(details, dlen, "%s", r.details);
  reply_clear(&r);
  wire_message_clear(&spec.base);
  return status;
}

static int describe_status(const char *id, char *details, size_t dlen) {
  Topos__V1__DescribeRequest dr = TOPOS__V1__DESCRIBE_REQUEST__INIT;
  dr.id = (char *)id;
  reply r;
  int status = call_msg(&C, "Describe", &dr.base, NULL, NULL, &r);
  if (details != NULL) snprintf(details, dlen, "%s", r.details);
  reply_clear(&r);
  return status;
}

static void assert_described(const char *id) {
  char details[1024];
  int status = describe_status(id, details, sizeof details);
  ck_assert_msg(status == GRPC_STATUS_OK, "Describe %s: status %d: %s", id,
                status, details);
}

/* Describe of a spec retention dropped: NOT_FOUND, saying so. */
static void assert_dropped(const char *id) {
  char details[1024];
  int status = describe_status(id, details, sizeof details);
  ck_assert_msg(status == GRPC_STATUS_NOT_FOUND,
                "Describe %s: status %d (%s), expected NOT_FOUND", id, status,
                details);
  ck_assert_msg(strstr(details, "retention dropped it") != NULL &&
                    strstr(details, "--spec-bytes") != NULL &&
                    strstr(details, "record it again") != NULL,
                "%s", details);
}

static Topos__V1__StatsReply *stats(void) {
  Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *s = NULL;
  CALL_OK(&C, "Stats", &q, &topos__v1__stats_reply__descriptor, &s);
  return s;
}

/* A spec of about 64 KiB: one f32[16384] parameter drawn from `seed`. */
static topos_network *filler(uint64_t seed) {
  topos_error err = {0};
  int64_t shape[1] = {16384};
  topos_tensor *w0 = topos_init_normal(TOPOS_F32, 1, shape, 0, 1, seed, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_value w = topos_name(tape, topos_parameter(tape, w0), "w");
  topos_name(tape, topos_sum(tape, w), "s");
  topos_tensor_release(w0);
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "filler: %s", err.message);
  return net;
}

static void record_filler(uint64_t seed, char id[65]) {
  topos_network *net = filler(seed);
  record(&C, net, id);
  topos_network_release(net);
}

/* ------------------------------------------------------------- retention */

/* Past --spec-bytes the least recently used specs go: the old unused ones
 * are NOT_FOUND (saying retention may have dropped them), the recently
 * recorded ones and one used all along stay. */
START_TEST(test_retention_drops_least_recent) {
  const char *extra[] = {"--spec-bytes", "400K", NULL};
  start(extra);
  char kept[65], ids[20][65];
  record_filler(1000, kept);
  for (int i = 0; i < 20; i++) {
    record_filler((uint64_t)i + 1, ids[i]);
    /* Used after every record: always more recent than the oldest. */
    usleep(2000);
    assert_described(kept);
    usleep(2000);
  }
  Topos__V1__StatsReply *s = stats();
  ck_assert_int_le(s->spec_bytes, 400 << 10);
  ck_assert_int_ge(s->specs, 4);
  ck_assert_int_lt(s->specs, 21);
  int64_t specs = s->specs;
  wire_message_free(&s->base);
  assert_described(kept);
  for (int i = 0; i < 20 - (int)specs + 1; i++) assert_dropped(ids[i]);
  for (int i = 20 - (int)specs + 1; i < 20; i++) assert_described(ids[i]);
  /* A spec larger than the whole budget is refused, naming it. */
  topos_error err = {0};
  int64_t shape[1] = {200000};
  topos_tensor *w0 = topos_init_normal(TOPOS_F32, 1, shape, 0, 1, 5, &err);
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_sum(tape, topos_parameter(tape, w0));
  topos_tensor_release(w0);
  topos_network *big = topos_tape_seal(tape, &err);
  char id[65], details[1024];
  int status = record_status(big, id, details, sizeof details);
  ck_assert_int_eq(status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(
      strstr(details, "larger than the spec budget of 409600") != NULL, "%s",
      details);
  topos_network_release(big);
  assert_serving(&C);
  stop();
}
END_TEST

typedef struct forward_arg {
  int port;
  const uint8_t *bytes;
  size_t len;
  int status;
  char details[1024];
  atomic_bool done;
} forward_arg;

static void *forward_thread(void *p) {
  forward_arg *a = p;
  client c;
  client_open(&c, a->port);
  reply r;
  call_raw(&c, "Forward", a->bytes, a->len, 0, &r);
  a->status = r.status;
  snprintf(a->details, sizeof a->details, "%s", r.details);
  reply_clear(&r);
  client_close(&c);
  atomic_store(&a->done, true);
  return NULL;
}

/* A spec whose run is in flight is never dropped, however old, and goes
 * like any other once the run is over. */
START_TEST(test_retention_never_drops_in_use) {
  topos_value out;
  topos_network *slow = calibrated_slow_network(2.0, &out, NULL);
  /* Room for the slow spec and about five fillers. */
  topos_error err = {0};
  uint8_t *enc = NULL;
  size_t enc_len = 0;
  ck_assert_int_eq(topos_network_encode(slow, &enc, &enc_len, &err), TOPOS_OK);
  topos_free(enc);
  char budget[32];
  snprintf(budget, sizeof budget, "%zu", enc_len + 5 * 66000);
  const char *extra[] = {"--spec-bytes", budget, "--workers", "2", NULL};
  start(extra);
  char slow_id[65];
  record(&C, slow, slow_id);
  topos_value roots[1] = {out};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = slow_id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  size_t len = 0;
  uint8_t *bytes = pack(&fr.base, &len);
  wire_message_free(&fr.entry->base);
  forward_arg a = {D.port, bytes, len, -1, "", false};
  pthread_t th;
  pthread_create(&th, NULL, forward_thread, &a);
  usleep(300000); /* the run is under way (it takes over 2 s) */
  /* Enough newer specs to push the slow one (the oldest) out 3 times. */
  char ids[24][65];
  for (int i = 0; i < 24; i++) record_filler(100 + (uint64_t)i, ids[i]);
  bool still_running = !atomic_load(&a.done);
  assert_described(slow_id);
  assert_dropped(ids[0]);
  pthread_join(th, NULL);
  ck_assert_msg(a.status == GRPC_STATUS_OK, "Forward: %d %s", a.status,
                a.details);
  ck_assert_msg(still_running, "the run ended before the records did");
  /* The run is over: now it is the least recently used spec, and goes. */
  for (int i = 0; i < 8; i++) record_filler(200 + (uint64_t)i, ids[i]);
  assert_dropped(slow_id);
  free(bytes);
  topos_network_release(slow);
  stop();
}
END_TEST

/* ---------------------------------------------------------- store budget */

START_TEST(test_store_budget) {
  const char *extra[] = {"--store-bytes", "512K", "--blob-pending-bytes", "0",
                         NULL};
  start(extra);
  char ids[16][65], details[1024];
  int stored = 0, status = GRPC_STATUS_OK;
  for (int i = 0; i < 16; i++) {
    topos_network *net = filler(300 + (uint64_t)i);
    status = record_status(net, ids[stored], details, sizeof details);
    topos_network_release(net);
    if (status != GRPC_STATUS_OK) break;
    stored++;
  }
  ck_assert_int_eq(status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(details, "store full: 512 KiB budget") != NULL &&
                    strstr(details, "--store-bytes") != NULL &&
                    strstr(details, "spec of") != NULL,
                "%s", details);
  ck_assert_int_ge(stored, 3);
  /* The daemon keeps serving what it has. */
  assert_serving(&C);
  for (int i = 0; i < stored; i++) assert_described(ids[i]);
  Topos__V1__StatsReply *s = stats();
  ck_assert_int_eq(s->specs, stored);
  wire_message_free(&s->base);
  /* An upload past it is refused the same way, and changes nothing. */
  topos_network *net = filler(999);
  topos_params *p = topos_network_parameters(net);
  topos_error err = {0};
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  ck_assert_int_eq(
      wire_tensors_from_params(p, &pb.tensors, &pb.n_tensors, &err), TOPOS_OK);
  reply r;
  status = call_msg(&C, "PutBlob", &pb.base, NULL, NULL, &r);
  ck_assert_int_eq(status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(r.details, "store full") != NULL &&
                    strstr(r.details, "blob of") != NULL,
                "%s", r.details);
  reply_clear(&r);
  s = stats();
  ck_assert_int_eq(s->blobs, 0);
  ck_assert_int_eq(s->specs, stored);
  wire_message_free(&s->base);
  assert_described(ids[0]);
  wire_message_clear(&pb.base);
  topos_params_free(p);
  topos_network_release(net);
  client_close(&C);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&D, SIGTERM, 60), 60);
  /* The file kept to its budget (the close checkpointed the WAL into it). */
  struct stat sb;
  ck_assert_int_eq(stat(D.store, &sb), 0);
  ck_assert_int_le(sb.st_size, 512 << 10);
  daemon_cleanup(&D);
}
END_TEST

/* ------------------------------------------------------------ RSS bound */

/* 30 different 100k-node specs, each recorded and lowered, under
 * --cache-bytes 256M: the daemon's RSS stays near the bound (it reached
 * 2.4 GB when the cache counted encodings). */
START_TEST(test_rss_bounded) {
  const char *extra[] = {"--cache-bytes", "256M", "--workers", "2", NULL};
  start(extra);
  int64_t rss0 = proc_bytes(D.pid, "VmRSS:"), peak = rss0;
  for (int i = 0; i < 30; i++) {
    topos_value out;
    topos_network *net = long_chain(100000, (double)i + 1, &out);
    char id[65];
    record(&C, net, id);
    topos_error err = {0};
    topos_value roots[1] = {out};
    topos_entry e = {
        roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
    Topos__V1__LowerRequest lr = TOPOS__V1__LOWER_REQUEST__INIT;
    lr.id = id;
    lr.entry = wire_entry_new(&e, NULL, &err);
    Topos__V1__LowerReply *lo = NULL;
    CALL_OK(&C, "Lower", &lr, &topos__v1__lower_reply__descriptor, &lo);
    wire_message_free(&lo->base);
    wire_message_free(&lr.entry->base);
    topos_network_release(net);
    int64_t rss = proc_bytes(D.pid, "VmRSS:");
    if (rss > peak) peak = rss;
  }
  fprintf(stderr,
          "retention: RSS of 30 100k-node specs under --cache-bytes 256M: "
          "%.0f MB at start, %.0f MB peak, %.0f MB at the end\n",
          rss0 / 1e6, peak / 1e6, proc_bytes(D.pid, "VmRSS:") / 1e6);
#ifndef __SANITIZE_ADDRESS__
  /* The cache's 256 MiB, plus what decoding and lowering one spec takes
   * at a time and malloc's slack; not 30 specs' worth (over 1.3 GB). */
  ck_assert_msg(peak < rss0 + ((int64_t)256 << 20) + ((int64_t)300 << 20),
                "RSS peaked at %.0f MB", peak / 1e6);
#endif
  assert_serving(&C);
  stop();
}
END_TEST

/* ------------------------------------------------------------ file modes */

static mode_t mode_of(const char *path) {
  struct stat sb;
  ck_assert_msg(stat(path, &sb) == 0, "stat %s: %s", path, strerror(errno));
  return sb.st_mode & 07777;
}

START_TEST(test_store_file_modes) {
  memset(&D, 0, sizeof D);
  daemon_dir(&D);
  /* Two folders the daemon creates, under a permissive umask. */
  snprintf(D.store, sizeof D.store, "%s/a/b/topos.db", D.dir);
  mode_t old = umask(0);
  daemon_start(&D, NULL);
  umask(old);
  grpc_init();
  client_open(&C, D.port);
  gd_net g = gd_network(1.0);
  char id[65];
  record(&C, g.net, id);
  topos_network_release(g.net);
  char path[400];
  snprintf(path, sizeof path, "%s/a", D.dir);
  ck_assert_int_eq(mode_of(path), 0700);
  snprintf(path, sizeof path, "%s/a/b", D.dir);
  ck_assert_int_eq(mode_of(path), 0700);
  ck_assert_int_eq(mode_of(D.store), 0600);
  snprintf(path, sizeof path, "%s-wal", D.store);
  ck_assert_int_eq(mode_of(path), 0600);
  snprintf(path, sizeof path, "%s-shm", D.store);
  ck_assert_int_eq(mode_of(path), 0600);
  stop();
}
END_TEST

Suite *retention_suite(void) {
  Suite *s = suite_create("retention");
  TCase *tc = tcase_create("cache");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_cache_children);
  tcase_add_test(tc, test_cache_in_use);
  tcase_add_test(tc, test_cache_counts_network_memory);
  suite_add_tcase(s, tc);

  tc = tcase_create("daemon");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_retention_drops_least_recent);
  tcase_add_test(tc, test_retention_never_drops_in_use);
  tcase_add_test(tc, test_store_budget);
  tcase_add_test(tc, test_rss_bounded);
  tcase_add_test(tc, test_store_file_modes);
  suite_add_tcase(s, tc);
  return s;
}
