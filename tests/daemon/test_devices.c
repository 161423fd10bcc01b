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
    ck_assert_msg(strstr(b->plugins, "not loaded") ||
                      strstr(b->plugins, "not built"),
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
  ck_assert(b->n_devices == 0 ? strstr(r.body, "topos_device_") == NULL
                              : strstr(r.body, "topos_device_tasks_total{") !=
                                    NULL);
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
  ck_assert_msg(strstr(b->plugins, "not loaded") ||
                    strstr(b->plugins, "not built"),
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
  const char *bad[] = {"0,0", "x", "1,", "64", "0,1,2,3,4,5,6,7,8,9,10,11,12,"
                                               "13,14,15,16",
                       "-1", ""};
  const char *why[] = {"listed twice", "not all, none", "comma-separated",
                       "not in 0..63", "more than 16", "not all, none",
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

Suite *devices_suite(void) {
  Suite *s = suite_create("devices");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_devices_default);
  tcase_add_test(tc, test_devices_none);
  tcase_add_test(tc, test_devices_missing_ordinal);
  tcase_add_test(tc, test_devices_bad_flags);
  suite_add_tcase(s, tc);
  return s;
}
