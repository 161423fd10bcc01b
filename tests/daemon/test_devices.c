/*
 * test_devices.c - toposd and its accelerators (issue 13): the plugin the
 * daemon loaded or why it did not, the devices it uses (Backends, Stats,
 * /v1/backends, /metrics), --devices, and a host without a GPU serving as
 * before.  Against a real toposd on loopback with a real SQLite store.
 *
 * On a host with no GPU (CI) the daemon must start, say why `cuda` is
 * missing, and list no devices; on a GPU host the same tests check that
 * the devices are listed with their properties.
 */
#include <check.h>
#include <sys/wait.h>

#include "http_client.h"

static daemon_proc D;
static client C;

static Topos__V1__BackendsReply *backends(void) {
  Topos__V1__BackendsRequest q = TOPOS__V1__BACKENDS_REQUEST__INIT;
  Topos__V1__BackendsReply *r = NULL;
  CALL_OK(&C, "Backends", &q, &topos__v1__backends_reply__descriptor, &r);
  return r;
}

static Topos__V1__StatsReply *stats(void) {
  Topos__V1__StatsRequest q = TOPOS__V1__STATS_REQUEST__INIT;
  Topos__V1__StatsReply *r = NULL;
  CALL_OK(&C, "Stats", &q, &topos__v1__stats_reply__descriptor, &r);
  return r;
}

static bool has_backend(const Topos__V1__BackendsReply *r, const char *name) {
  for (size_t i = 0; i < r->n_backends; i++)
    if (strcmp(r->backends[i]->name, name) == 0) return true;
  return false;
}

/* The default daemon: the plugin report in Backends and in the log, and
 * the devices (none here) in Backends, Stats, /v1/backends and /metrics,
 * consistent with the backends registered. */
START_TEST(test_devices_default) {
  fixture_start(&D, &C, NULL);
  Topos__V1__BackendsReply *b = backends();
  ck_assert_msg(strncmp(b->plugins, "cuda: ", 6) == 0, "plugins: %s",
                b->plugins);
  ck_assert(has_backend(b, "cpu"));
  ck_assert(log_has(&D, "cuda: "));
  Topos__V1__StatsReply *s = stats();
  ck_assert_uint_eq(s->n_devices, b->n_devices);
  if (b->n_devices == 0) {
    /* No GPU: no cuda backend, and the report says why. */
    ck_assert(!has_backend(b, "cuda"));
    ck_assert(!has_backend(b, "cublas"));
    ck_assert_msg(
        strstr(b->plugins, "not loaded") || strstr(b->plugins, "not built"),
        "plugins: %s", b->plugins);
  } else {
    ck_assert(has_backend(b, "cuda"));
    for (size_t i = 0; i < b->n_devices; i++) {
      ck_assert_str_eq(b->devices[i]->backend, "cuda");
      ck_assert_int_gt((int)strlen(b->devices[i]->name), 0);
      ck_assert_int_gt(b->devices[i]->memory_total, 0);
      ck_assert_int_ge(b->devices[i]->cc_major, 7);
    }
  }
  /* The gateway carries the same. */
  http_reply r;
  http_get(D.http_port, "/v1/backends", &r);
  ck_assert_int_eq(r.status, 200);
  cJSON *j = cJSON_Parse(r.body);
  ck_assert_ptr_nonnull(j);
  cJSON *plugins = cJSON_GetObjectItem(j, "plugins");
  ck_assert(cJSON_IsString(plugins));
  ck_assert_str_eq(plugins->valuestring, b->plugins);
  cJSON_Delete(j);
  http_reply_clear(&r);
  http_get(D.http_port, "/metrics", &r);
  ck_assert_int_eq(r.status, 200);
  ck_assert(b->n_devices == 0
                ? strstr(r.body, "topos_device_") == NULL
                : strstr(r.body, "topos_device_tasks_total{") != NULL);
  http_reply_clear(&r);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  protobuf_c_message_free_unpacked(&s->base, NULL);
  fixture_stop(&D, &C, 10);
}
END_TEST

/* --devices none: no plugin is loaded, and the daemon says so. */
START_TEST(test_devices_none) {
  const char *extra[] = {"--devices", "none", NULL};
  fixture_start(&D, &C, extra);
  Topos__V1__BackendsReply *b = backends();
  ck_assert_str_eq(b->plugins, "cuda: off (no devices asked for)");
  ck_assert_uint_eq(b->n_devices, 0);
  ck_assert(!has_backend(b, "cuda"));
  protobuf_c_message_free_unpacked(&b->base, NULL);
  assert_serving(&C);
  fixture_stop(&D, &C, 10);
}
END_TEST

/* A device that is not there: the daemon serves on the CPU and says why
 * (no driver, no device, or "device 15 does not exist"). */
START_TEST(test_devices_missing_ordinal) {
  const char *extra[] = {"--devices", "15", NULL};
  fixture_start(&D, &C, extra);
  Topos__V1__BackendsReply *b = backends();
  ck_assert_msg(
      strstr(b->plugins, "not loaded") || strstr(b->plugins, "not built"),
      "plugins: %s", b->plugins);
  ck_assert_uint_eq(b->n_devices, 0);
  ck_assert(!has_backend(b, "cuda"));
  ck_assert(has_backend(b, "cpu"));
  protobuf_c_message_free_unpacked(&b->base, NULL);
  assert_serving(&C);
  fixture_stop(&D, &C, 10);
}
END_TEST

/* Bad --devices values: exit 2 with the reason, nothing started. */
START_TEST(test_devices_bad_flags) {
  const char *build = getenv("TOPOS_BUILD");
  const char *bad[] = {"0,0",
                       "x",
                       "1,",
                       "64",
                       "0,1,2,3,4,5,6,7,8,9,10,11,12,"
                       "13,14,15,16",
                       "-1",
                       ""};
  const char *why[] = {"listed twice", "not all, none", "comma-separated",
                       "not in 0..63", "more than 16",  "not all, none",
                       "not all, none"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s/bin/toposd --devices '%s' --store /nonexistent/x.db 2>&1",
             build && *build ? build : "build", bad[i]);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[1024] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: status %d",
                  bad[i], st);
    ck_assert_msg(strstr(out, why[i]), "--devices '%s': %s", bad[i], out);
  }
  /* --device-*-bytes: at least 1M. */
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "%s/bin/toposd --device-cache-bytes 10 --store /nonexistent/x.db "
           "2>&1",
           build && *build ? build : "build");
  FILE *p = popen(cmd, "r");
  char out[1024] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int st = pclose(p);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  ck_assert_msg(strstr(out, "at least 1M"), "%s", out);
}
END_TEST

/* The daemon announces a run's blob tensors to the device plugin by
 * content - SHA-256("<blob id>:<index>") - for the run's duration and
 * retracts them after, so a GPU's blob cache can keep them across steps.
 * Shown with a pretend plugin (tests/cuda/fake_plugin.c) that records the
 * announcements; a Forward by value announces nothing. */
START_TEST(test_devices_blob_announce) {
  const char *build = getenv("TOPOS_BUILD");
  char plugin[512];
  snprintf(plugin, sizeof plugin, "%s/lib/libtopos_fakegpu.so",
           build && *build ? build : "build");
  setenv("TOPOS_CUDA_PLUGIN", plugin, 1);
  fixture_start(&D, &C, NULL);
  unsetenv("TOPOS_CUDA_PLUGIN");
  Topos__V1__BackendsReply *b = backends();
  ck_assert_msg(strncmp(b->plugins, "cuda: 1 device (fake", 20) == 0,
                "plugins: %s", b->plugins);
  ck_assert_uint_eq(b->n_devices, 1);
  ck_assert_str_eq(b->devices[0]->backend, "fake");
  /* Every worker bound itself to a device at start. */
  ck_assert_int_ge(b->devices[0]->tasks, 1);
  protobuf_c_message_free_unpacked(&b->base, NULL);

  topos_error err = {0};
  mlp_net m = mlp_network();
  char id[65];
  record(&C, m.net, id);
  topos_params *p = topos_network_parameters(m.net);
  Topos__V1__PutBlobRequest pb = TOPOS__V1__PUT_BLOB_REQUEST__INIT;
  ck_assert_int_eq(
      wire_tensors_from_params(p, &pb.tensors, &pb.n_tensors, &err), TOPOS_OK);
  Topos__V1__PutBlobReply *put = NULL;
  CALL_OK(&C, "PutBlob", &pb, &topos__v1__put_blob_reply__descriptor, &put);
  size_t np = pb.n_tensors;

  topos_value roots[1] = {m.logits};
  topos_entry e = {
      roots, 1, NULL, 0, TOPOS_POSTURE_FORWARD, TOPOS_NUMERICS_EXACT};
  Topos__V1__ForwardRequest fr = TOPOS__V1__FORWARD_REQUEST__INIT;
  fr.id = id;
  fr.entry = wire_entry_new(&e, NULL, &err);
  /* By value: nothing to announce. */
  fr.parameters = pb.tensors;
  fr.n_parameters = pb.n_tensors;
  Topos__V1__ForwardReply *fwd = NULL;
  CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
  wire_message_free(&fwd->base);
  Topos__V1__StatsReply *s = stats();
  ck_assert_uint_eq(s->n_devices, 1);
  ck_assert_int_eq(s->devices[0]->cache_hits, 0);
  protobuf_c_message_free_unpacked(&s->base, NULL);
  /* By reference, twice: each run announces every tensor of the blob and
   * retracts it when done. */
  ck_assert_int_eq(
      wire_tensor_refs(put->id, np, &fr.parameters, &fr.n_parameters, &err),
      TOPOS_OK);
  for (int round = 1; round <= 2; round++) {
    CALL_OK(&C, "Forward", &fr, &topos__v1__forward_reply__descriptor, &fwd);
    wire_message_free(&fwd->base);
    s = stats();
    ck_assert_int_eq(s->devices[0]->cache_hits, (int64_t)np * round);
    ck_assert_int_eq(s->devices[0]->cache_misses, (int64_t)np * round);
    ck_assert_int_eq(s->devices[0]->cache_bytes, 0);
    /* The last tensor announced is the blob's last, named by content. */
    char key[80], want[65];
    snprintf(key, sizeof key, "%s:%zu", put->id, np - 1);
    topos_sha256_hex(key, strlen(key), want);
    char name[96];
    snprintf(name, sizeof name, "fake %s", want);
    ck_assert_str_eq(s->devices[0]->name, name);
    protobuf_c_message_free_unpacked(&s->base, NULL);
  }
  /* Health carries the device too. */
  Topos__V1__HealthRequest hq = TOPOS__V1__HEALTH_REQUEST__INIT;
  Topos__V1__HealthReply *hr = NULL;
  CALL_OK(&C, "Health", &hq, &topos__v1__health_reply__descriptor, &hr);
  ck_assert_uint_eq(hr->n_devices, 1);
  protobuf_c_message_free_unpacked(&hr->base, NULL);
  wire_tensors_free(fr.parameters, fr.n_parameters);
  wire_tensors_free(pb.tensors, pb.n_tensors);
  wire_message_free(&fr.entry->base);
  wire_message_free(&put->base);
  topos_params_free(p);
  topos_network_release(m.net);
  fixture_stop(&D, &C, 10);
}
END_TEST

Suite *devices_suite(void) {
  Suite *s = suite_create("devices");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_devices_default);
  tcase_add_test(tc, test_devices_none);
  tcase_add_test(tc, test_devices_missing_ordinal);
  tcase_add_test(tc, test_devices_bad_flags);
  tcase_add_test(tc, test_devices_blob_announce);
  suite_add_tcase(s, tc);
  return s;
}
