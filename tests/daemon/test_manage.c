/*
 * test_manage.c - what an operator does with what a daemon stores, against
 * a real toposd and SQLite file: GetBlob gives back the tensors PutBlob
 * took, bit for bit (another tenant's blob is NOT_FOUND, as an unknown
 * one); AdminSpecDelete removes a spec and what was cached from it, is an
 * admin's call when the daemon has tenants, and leaves a later Record
 * free to store it again.
 */
#include "harness.h"
#include "tenant_util.h"
#include "topos_client.h"

#define NOT_FOUND 5
#define PERMISSION_DENIED 7

/* Three tensors of three dtypes, with a NaN payload and -0. */
static topos_params *blob_params(void) {
  topos_error err = {0};
  float f[6] = {1.5f, -0.0f, 3.25f, 0, 0, 7};
  uint32_t nan_bits = 0x7fc01234u;
  memcpy(&f[3], &nan_bits, 4);
  double d[3] = {1e-310, -2.5, 1.0 / 3.0};
  int64_t s23[2] = {2, 3}, s3[1] = {3}, s0[1] = {0};
  topos_tensor *t[3] = {topos_tensor_from(TOPOS_F32, 2, s23, f, &err),
                        topos_tensor_from(TOPOS_F64, 1, s3, d, &err),
                        topos_tensor_from(TOPOS_F32, 1, s0, NULL, &err)};
  for (int i = 0; i < 3; i++) ck_assert_msg(t[i] != NULL, "%s", err.message);
  topos_params *p = topos_params_new(3, t, &err);
  ck_assert_msg(p != NULL, "%s", err.message);
  for (int i = 0; i < 3; i++) topos_tensor_release(t[i]);
  return p;
}

START_TEST(test_get_blob) {
  daemon_proc d;
  client raw;
  fixture_start(&d, &raw, NULL);
  topos_client *c = connect_with(d.port, NULL);
  topos_error err = {0};
  topos_params *p = blob_params();
  char id[65];
  ck_assert_int_eq(topos_client_put_blob(c, p, id, NULL, &err), TOPOS_OK);
  topos_tensor **got = NULL;
  int n = -1;
  ck_assert_msg(topos_client_get_blob(c, id, &got, &n, &err) == TOPOS_OK, "%s",
                err.message);
  ck_assert_int_eq(n, 3);
  for (int i = 0; i < 3; i++)
    ck_assert_msg(topos_tensor_bitwise_equal(got[i], topos_params_get(p, i)),
                  "tensor %d differs", i);
  topos_client_tensors_free(got, n);
  /* Unknown and malformed ids. */
  char unknown[65];
  memset(unknown, 'e', 64);
  unknown[64] = '\0';
  ck_assert_int_eq(topos_client_grpc_status(
                       topos_client_get_blob(c, unknown, &got, &n, &err)),
                   NOT_FOUND);
  ck_assert_msg(strstr(err.message, "no blob with id") != NULL, "%s",
                err.message);
  ck_assert_int_eq(topos_client_get_blob(c, "xyz", &got, &n, &err),
                   TOPOS_ERR_ARGUMENT);
  topos_params_free(p);
  topos_client_close(c);
  fixture_stop(&d, &raw, 30);
}
END_TEST

/* A Forward of the gradient-descent network's loss (its gRPC status). */
static int forward_status(topos_client *c, const char *id, gd_net *g, char *msg,
                          size_t len) {
  topos_error err = {0};
  topos_entry e = {.roots = &g->loss, .nroots = 1};
  topos_tensor **r = NULL;
  int rc = topos_client_forward_with(c, id, &e, NULL, &r, NULL, &err);
  if (rc == TOPOS_OK) topos_client_tensors_free(r, 1);
  if (msg) snprintf(msg, len, "%s", err.message);
  return topos_client_grpc_status(rc);
}

START_TEST(test_delete_spec) {
  daemon_proc d;
  client raw;
  fixture_start(&d, &raw, NULL);
  topos_client *c = connect_with(d.port, NULL);
  topos_error err = {0};
  gd_net g = gd_network(1.5);
  char id[65], msg[1024];
  ck_assert_int_eq(topos_client_record(c, g.net, id, &err), TOPOS_OK);
  ck_assert_int_eq(forward_status(c, id, &g, msg, sizeof msg), 0);
  char *text = NULL;
  ck_assert_int_eq(topos_client_describe(c, id, TOPOS_FORMAT_TEXT, &text, &err),
                   TOPOS_OK);
  topos_free(text);
  int64_t bytes = 0;
  ck_assert_msg(topos_client_delete_spec(c, id, &bytes, &err) == TOPOS_OK, "%s",
                err.message);
  ck_assert_int_gt(bytes, 0);
  /* Gone from the store and from every cache: run, describe, list. */
  ck_assert_int_eq(forward_status(c, id, &g, msg, sizeof msg), NOT_FOUND);
  ck_assert_msg(strstr(msg, "no spec with id") != NULL, "%s", msg);
  ck_assert_int_eq(topos_client_grpc_status(topos_client_describe(
                       c, id, TOPOS_FORMAT_TEXT, &text, &err)),
                   NOT_FOUND);
  topos_client_stats_info st;
  ck_assert_int_eq(topos_client_stats(c, &st, &err), TOPOS_OK);
  ck_assert_int_eq(st.specs, 0);
  ck_assert_int_eq(
      topos_client_grpc_status(topos_client_delete_spec(c, id, NULL, &err)),
      NOT_FOUND);
  ck_assert(log_has(&d, "action=spec.delete spec="));
  /* Recorded again: the same id, and it runs. */
  char again[65];
  ck_assert_int_eq(topos_client_record(c, g.net, again, &err), TOPOS_OK);
  ck_assert_str_eq(again, id);
  ck_assert_int_eq(forward_status(c, id, &g, msg, sizeof msg), 0);
  topos_network_release(g.net);
  topos_client_close(c);
  fixture_stop(&d, &raw, 30);
}
END_TEST

/* With tenants: a non-admin may not delete (even its own spec), and may
 * not read another tenant's blob; an admin may delete anyone's spec. */
START_TEST(test_delete_needs_admin) {
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char var[400];
  snprintf(var, sizeof var, "%s/var", d.dir);
  mkdir(var, 0700);
  char admin[STORE_TOKEN_SECRET_LEN + 1], bob[STORE_TOKEN_SECRET_LEN + 1],
      carol[STORE_TOKEN_SECRET_LEN + 1];
  tenant_with_token(d.store, "ops", true, admin);
  tenant_with_token(d.store, "bob", false, bob);
  tenant_with_token(d.store, "carol", false, carol);
  daemon_start(&d, NULL);
  topos_client *cb = connect_with(d.port, bob);
  topos_client *cc = connect_with(d.port, carol);
  topos_client *ca = connect_with(d.port, admin);
  topos_error err = {0};
  gd_net g = gd_network(2.5);
  char id[65], blob[65];
  ck_assert_int_eq(topos_client_record(cb, g.net, id, &err), TOPOS_OK);
  topos_params *p = blob_params();
  ck_assert_int_eq(topos_client_put_blob(cb, p, blob, NULL, &err), TOPOS_OK);
  topos_tensor **got = NULL;
  int n = 0;
  ck_assert_int_eq(
      topos_client_grpc_status(topos_client_get_blob(cc, blob, &got, &n, &err)),
      NOT_FOUND);
  ck_assert_int_eq(topos_client_get_blob(cb, blob, &got, &n, &err), TOPOS_OK);
  topos_client_tensors_free(got, n);
  ck_assert_int_eq(
      topos_client_grpc_status(topos_client_delete_spec(cb, id, NULL, &err)),
      PERMISSION_DENIED);
  ck_assert_msg(strstr(err.message, "not an admin") != NULL, "%s", err.message);
  char msg[1024];
  ck_assert_int_eq(forward_status(cb, id, &g, msg, sizeof msg), 0);
  ck_assert_int_eq(topos_client_delete_spec(ca, id, NULL, &err), TOPOS_OK);
  ck_assert_int_eq(forward_status(ca, id, &g, msg, sizeof msg), NOT_FOUND);
  ck_assert(log_has(&d, "action=spec.delete spec="));
  ck_assert(log_has(&d, "by=bob"));
  topos_params_free(p);
  topos_network_release(g.net);
  topos_client_close(ca);
  topos_client_close(cb);
  topos_client_close(cc);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

Suite *manage_suite(void) {
  Suite *s = suite_create("manage");
  TCase *tc = tcase_create("manage");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_get_blob);
  tcase_add_test(tc, test_delete_spec);
  tcase_add_test(tc, test_delete_needs_admin);
  suite_add_tcase(s, tc);
  return s;
}
