/*
 * mlir_opt.h - the emission suites' check with LLVM's mlir-opt: writes
 * the text to a temporary file, runs mlir-opt on it and returns its exit
 * status (0 = accepted), with its first diagnostic line in diag.  Each
 * suite includes it once; the function is static.
 */
#ifndef TOPOS_TESTS_MLIR_OPT_H
#define TOPOS_TESTS_MLIR_OPT_H

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MLIR_OPT "/usr/lib/llvm-19/bin/mlir-opt"

static int run_mlir_opt(const char *text, char *diag, size_t len) {
  ck_assert_msg(access(MLIR_OPT, X_OK) == 0,
                "%s is missing: `make deps` installs mlir-19-tools", MLIR_OPT);
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !tmp[0]) tmp = "/tmp";
  char path[512], errpath[540];
  snprintf(path, sizeof path, "%s/topos_mlir_XXXXXX", tmp); /* mkstemp */
  int fd = mkstemp(path);
  ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
  size_t n = strlen(text);
  ck_assert(write(fd, text, n) == (ssize_t)n);
  close(fd);
  snprintf(errpath, sizeof errpath, "%s.err", path);
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "'%s' --allow-unregistered-dialect '%s' > /dev/null 2> '%s'",
           MLIR_OPT, path, errpath);
  int rc = system(cmd);
  int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  diag[0] = '\0';
  FILE *f = fopen(errpath, "r");
  if (f) {
    if (!fgets(diag, (int)len, f)) diag[0] = '\0';
    fclose(f);
  }
  unlink(path);
  unlink(errpath);
  return status;
}

#endif /* TOPOS_TESTS_MLIR_OPT_H */
