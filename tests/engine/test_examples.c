/*
 * test_examples.c - runs the two seed examples as a user would and checks
 * what they print: gradient_descent must land w within 1e-6 of 2 and list
 * the network (with its "loss" node); makemore_mlp must end with a mean
 * training loss of at most 2.30 over its last 500 steps.
 *
 * The binaries are found under $TOPOS_BUILD/examples (default "build"),
 * and run from the current directory, which is the repository root when
 * `make test` runs them (makemore reads examples/makemore/names.txt).
 * The makemore run takes a while and is skipped when TOPOS_SKIP_SLOW is
 * set (valgrind runs).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `$TOPOS_BUILD/examples/<name> <args>` and returns everything it
 * wrote to stdout (new, free it) and its exit status in *status. */
static char *run_example(const char *name, const char *args, int *status) {
  const char *build = getenv("TOPOS_BUILD");
  if (build == NULL || build[0] == '\0') build = "build";
  char cmd[1024];
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

/* The last non-empty line of text (points into text). */
static const char *last_line(char *text) {
  size_t len = strlen(text);
  while (len > 0 && text[len - 1] == '\n') text[--len] = '\0';
  char *nl = strrchr(text, '\n');
  return nl ? nl + 1 : text;
}

START_TEST(test_gradient_descent) {
  int status = 0;
  char *out = run_example("gradient_descent", "", &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  const char *wline = strstr(out, "w = ");
  ck_assert_msg(wline != NULL, "no 'w = ' line in:\n%s", out);
  char *end = NULL;
  double w = strtod(wline + 4, &end);
  ck_assert_msg(end != wline + 4, "unparsable w in:\n%s", out);
  ck_assert_msg(fabs(w - 2.0) <= 1e-6, "w = %.17g", w);
  /* The describe listing follows the w line and names the loss node. */
  const char *listing = strchr(wline, '\n');
  ck_assert_ptr_nonnull(listing);
  ck_assert_msg(strstr(listing, "loss") != NULL, "no 'loss' in:\n%s", out);
  ck_assert_msg(strstr(listing, "w") != NULL, "no 'w' in:\n%s", out);
  free(out);
}
END_TEST

START_TEST(test_makemore_mlp) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  int status = 0;
  char *out = run_example("makemore_mlp", "", &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  ck_assert_msg(strstr(out, "step 500: loss ") != NULL,
                "no progress line in:\n%s", out);
  const char *line = last_line(out);
  const char *prefix = "final: mean loss of the last 500 steps = ";
  ck_assert_msg(strncmp(line, prefix, strlen(prefix)) == 0, "last line is '%s'",
                line);
  char *end = NULL;
  double loss = strtod(line + strlen(prefix), &end);
  ck_assert_msg(end != line + strlen(prefix) && *end == '\0',
                "unparsable loss in '%s'", line);
  ck_assert_msg(loss <= 2.30, "final loss %.4f > 2.30", loss);
  free(out);
}
END_TEST

/* The same 200 steps on the reference backend, on cpu (auto) and on cpu by
 * name give the same bits (the dumped parameters' bytes); asking for blas
 * without --fast, or an unknown backend, is refused by name. */
static char *makemore_dump(const char *args, const char *path, size_t *len) {
  char full[512];
  snprintf(full, sizeof full, "--steps 200 --dump '%s' %s", path, args);
  int status = 0;
  char *out = run_example("makemore_mlp", full, &status);
  ck_assert_msg(status == 0, "%s: exit status %d:\n%s", args, status, out);
  free(out);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  char *bytes = calloc(1, 1 << 20);
  ck_assert_ptr_nonnull(bytes);
  size_t n = fread(bytes, 1, (1 << 20) - 1, f);
  fclose(f);
  ck_assert_uint_gt(n, 0);
  *len = n;
  return bytes;
}

START_TEST(test_example_backends) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  const char *tmp = getenv("TMPDIR");
  char path[256];
  snprintf(path, sizeof path, "%s/topos-ex-%d.dump", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
  size_t na, nb, nc;
  char *a = makemore_dump("", path, &na);
  char *b = makemore_dump("--backend reference", path, &nb);
  char *c = makemore_dump("--backend cpu", path, &nc);
  ck_assert_msg(na == nb && memcmp(a, b, na) == 0, "reference differs");
  ck_assert_msg(na == nc && memcmp(a, c, na) == 0, "cpu differs from auto");
  free(a);
  free(b);
  free(c);
  remove(path);
  int status = 0;
  char *out =
      run_example("makemore_mlp", "--steps 1 --backend blas 2>&1", &status);
  ck_assert_msg(status != 0 && strstr(out, "envelope"), "%d: %s", status, out);
  free(out);
  out = run_example("gradient_descent", "--backend nope 2>&1", &status);
  ck_assert_msg(status != 0 && strstr(out, "unknown backend 'nope'"), "%d: %s",
                status, out);
  free(out);
}
END_TEST

Suite *examples_suite(void) {
  Suite *s = suite_create("examples");
  TCase *quick = tcase_create("gradient_descent");
  tcase_add_test(quick, test_gradient_descent);
  suite_add_tcase(s, quick);
  TCase *slow = tcase_create("makemore_mlp");
  tcase_set_timeout(slow, 600);
  tcase_add_test(slow, test_makemore_mlp);
  tcase_add_test(slow, test_example_backends);
  suite_add_tcase(s, slow);
  return s;
}
