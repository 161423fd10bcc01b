/*
 * example_runner.h - running a built example as a user would, for the
 * example tests (tests/engine/test_examples.c,
 * tests/examples/test_image_examples.c): its stdout and exit status, and
 * whole files (checkpoints) to compare.
 *
 * The binaries are found under $TOPOS_BUILD/examples (default "build").
 * Failures are check assertions, so these run inside a check test.
 */
#ifndef TOPOS_EXAMPLE_RUNNER_H
#define TOPOS_EXAMPLE_RUNNER_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#define ER_UNUSED __attribute__((unused))

/* Runs `$TOPOS_BUILD/examples/<name> <args>` and returns everything it
 * wrote to stdout (new, free it) and its exit status in *status. */
static ER_UNUSED char *run_example(const char *name, const char *args,
                                   int *status) {
  const char *build = getenv("TOPOS_BUILD");
  if (build == NULL || build[0] == '\0') build = "build";
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s/examples/%s' %s", build, name, args);
  FILE *p = popen(cmd, "r");
  ck_assert_msg(p != NULL, "cannot run %s", cmd);
  size_t len = 0, cap = 4096;
  char *out = malloc(cap);
  ck_assert_ptr_nonnull(out);
  size_t got;
  while ((got = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 1024) {
      cap *= 2;
      out = realloc(out, cap);
      ck_assert_ptr_nonnull(out);
    }
  }
  out[len] = '\0';
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

/* The whole of the file at path (new, free it); its size in *len. */
static ER_UNUSED char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  size_t cap = 1 << 20, n = 0, got;
  char *bytes = malloc(cap);
  ck_assert_ptr_nonnull(bytes);
  while ((got = fread(bytes + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      cap *= 2;
      bytes = realloc(bytes, cap);
      ck_assert_ptr_nonnull(bytes);
    }
  }
  fclose(f);
  *len = n;
  return bytes;
}

#endif
