/*
 * scratch_dir.h - what file-writing suites share: a fresh directory per
 * test (made under $TMPDIR, else /tmp, by the suite's setup fixture and
 * removed with everything in it by its teardown) and a xorshift stream
 * for deterministic bytes.  Each suite includes it once; the functions
 * are static.
 */
#ifndef TOPOS_TESTS_SCRATCH_DIR_H
#define TOPOS_TESTS_SCRATCH_DIR_H

#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char g_dir[512];

/* $TMPDIR/<prefix>-XXXXXX (mkdtemp's template) into g_dir. */
static void scratch_dir_make(const char *prefix) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/%s-XXXXXX",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", prefix);
  ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static int scratch_remove_entry(const char *path, const struct stat *sb,
                                int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void scratch_dir_remove(void) {
  if (g_dir[0] != '\0')
    nftw(g_dir, scratch_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static inline uint64_t next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return x;
}

#endif /* TOPOS_TESTS_SCRATCH_DIR_H */
