/*
 * tenant_util.h - what the multi-tenant suites share (test_tenants.c,
 * test_isolation.c, test_quotas.c): the build directory, the `topos` CLI
 * run on a store file, and a tenant created with a token.  Each suite
 * includes it once; the functions are static inline.
 */
#ifndef TOPOS_TESTS_TENANT_UTIL_H
#define TOPOS_TESTS_TENANT_UTIL_H

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store.h"
#include "topos_client.h"

static inline const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b && *b ? b : "build";
}

/* Runs the shell command cmd, whose stderr goes to errfile; stdout into
 * out and errfile's text into err (either may be NULL); errfile is
 * removed.  Returns the exit status. */
static inline int run_captured(const char *cmd, const char *errfile, char *out,
                               size_t outlen, char *err, size_t errlen) {
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = '\0';
  int status = pclose(p);
  if (out) {
    size_t k = n < outlen - 1 ? n : outlen - 1;
    memcpy(out, buf, k);
    out[k] = '\0';
  }
  if (err) {
    err[0] = '\0';
    FILE *f = fopen(errfile, "r");
    if (f) {
      size_t m = fread(err, 1, errlen - 1, f);
      err[m] = '\0';
      fclose(f);
    }
  }
  unlink(errfile);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs `topos --store STORE ARGS` (ARGS a shell fragment); stdout into
 * out and stderr into err (either may be NULL).  Returns the exit
 * status. */
static inline int run_cli(const char *store, const char *args, char *out,
                          size_t outlen, char *err, size_t errlen) {
  char errfile[400], cmd[2048];
  snprintf(errfile, sizeof errfile, "%s.cli-stderr", store);
  snprintf(cmd, sizeof cmd, "%s/bin/topos --store '%s' %s 2>'%s'", build_dir(),
           store, args, errfile);
  return run_captured(cmd, errfile, out, outlen, err, errlen);
}

/* A client of the daemon on 127.0.0.1:port, sending token (NULL: none). */
static inline topos_client *connect_with(int port, const char *token) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(addr, &err);
  ck_assert_msg(c != NULL, "%s", err.message);
  if (token) ck_assert_int_eq(topos_client_set_token(c, token, &err), TOPOS_OK);
  return c;
}

/* Stats through the client library: its gRPC status, and the message. */
static inline int stats_status(topos_client *c, char *msg, size_t len) {
  topos_client_stats_info info;
  topos_error err = {0};
  int rc = topos_client_stats(c, &info, &err);
  if (msg) snprintf(msg, len, "%s", rc == TOPOS_OK ? "" : err.message);
  return topos_client_grpc_status(rc);
}

/* Adds tenant (admin or not) and writes a new token's secret. */
static inline void tenant_with_token(const char *store, const char *tenant,
                                     bool admin,
                                     char secret[STORE_TOKEN_SECRET_LEN + 1]) {
  char args[128], out[512];
  snprintf(args, sizeof args, "tenant add %s%s", tenant,
           admin ? " --admin" : "");
  ck_assert_int_eq(run_cli(store, args, NULL, 0, NULL, 0), 0);
  snprintf(args, sizeof args, "token create %s", tenant);
  ck_assert_int_eq(run_cli(store, args, out, sizeof out, NULL, 0), 0);
  ck_assert_int_eq((int)strlen(out), STORE_TOKEN_SECRET_LEN + 1);
  memcpy(secret, out, STORE_TOKEN_SECRET_LEN);
  secret[STORE_TOKEN_SECRET_LEN] = '\0';
}

#endif /* TOPOS_TESTS_TENANT_UTIL_H */
