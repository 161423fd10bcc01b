/*
 * test_examples.c - runs the examples as a user would and checks what they
 * print: gradient_descent must land w within 1e-6 of 2 and list the
 * network (with its "loss" node); makemore_mlp must end with a mean
 * training loss of at most 2.30 over its last 500 steps and a test loss of
 * at most 2.30; makemore_bigram's test loss must be at most 2.48; a short
 * makemore_transformer run must train, sample and score.  Checkpoints:
 * an interrupted run (--stop-at, --save) resumed with --resume ends with
 * the same bytes as an uninterrupted one, and a checkpoint of another
 * model, or a damaged file, is refused with a message.
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

#include "example_runner.h"

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

/* The number after `prefix` on its line of out; fails when absent. */
static double value_after(const char *out, const char *prefix) {
  const char *at = strstr(out, prefix);
  ck_assert_msg(at != NULL, "no '%s' in:\n%s", prefix, out);
  char *end = NULL;
  double v = strtod(at + strlen(prefix), &end);
  ck_assert_msg(end != at + strlen(prefix) && (*end == '\n' || *end == '\0'),
                "unparsable number after '%s'", prefix);
  return v;
}

/* The "samples:" block lists `count` non-empty lowercase names. */
static void check_samples(const char *out, int count) {
  const char *at = strstr(out, "samples:\n");
  ck_assert_msg(at != NULL, "no samples in:\n%s", out);
  at += strlen("samples:\n");
  for (int i = 0; i < count; i++) {
    ck_assert_msg(strncmp(at, "  ", 2) == 0, "sample %d malformed", i);
    at += 2;
    const char *nl = strchr(at, '\n');
    ck_assert_ptr_nonnull(nl);
    for (const char *c = at; c < nl; c++)
      ck_assert_msg(*c >= 'a' && *c <= 'z', "sample %d: '%.*s'", i,
                    (int)(nl - at), at);
    at = nl + 1;
  }
}

START_TEST(test_makemore_mlp) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  int status = 0;
  char *out = run_example("makemore_mlp", "--no-progress", &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  ck_assert_msg(strstr(out, "step 500: loss ") != NULL,
                "no progress line in:\n%s", out);
  double loss = value_after(out, "final: mean loss of the last 500 steps = ");
  ck_assert_msg(loss <= 2.30, "final loss %.4f > 2.30", loss);
  check_samples(out, 20);
  const char *line = last_line(out);
  const char *prefix = "final: test loss = ";
  ck_assert_msg(strncmp(line, prefix, strlen(prefix)) == 0, "last line is '%s'",
                line);
  double test = value_after(line, prefix);
  ck_assert_msg(test <= 2.30, "test loss %.4f > 2.30", test);
  free(out);
}
END_TEST

START_TEST(test_makemore_bigram) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  int status = 0;
  char *out = run_example("makemore_bigram", "--no-progress", &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  /* Counting and gradient descent land on the same loss. */
  const char *counting = strstr(out, "counting: ");
  ck_assert_msg(counting != NULL, "no counting line in:\n%s", out);
  double counted = value_after(counting, "test loss ");
  ck_assert_msg(counted <= 2.48, "counting test loss %.4f", counted);
  check_samples(out, 20);
  const char *line = last_line(out);
  double test = value_after(line, "final: test loss = ");
  ck_assert_msg(test <= 2.48, "bigram test loss %.4f > 2.48", test);
  ck_assert_msg(fabs(test - counted) < 0.05, "trained %.4f, counted %.4f", test,
                counted);
  free(out);
}
END_TEST

/* A short transformer run: it trains (the loss falls below log 27), prints
 * dev losses, samples and a test loss. */
START_TEST(test_makemore_transformer_short) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  int status = 0;
  char *out =
      run_example("makemore_transformer", "--steps 60 --no-progress", &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  ck_assert_msg(strstr(out, "204544 parameters") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "step 60: train loss ") && strstr(out, "dev loss "),
                "no progress line in:\n%s", out);
  check_samples(out, 20);
  double test = value_after(last_line(out), "final: test loss = ");
  ck_assert_msg(test < 3.0, "test loss %.4f after 60 steps", test);
  free(out);
}
END_TEST

static void tmp_path(char *out, size_t cap, const char *name) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, cap, "%s/topos-ex-%d-%s", tmp && *tmp ? tmp : "/tmp",
           (int)getpid(), name);
}

/* `example` with `args` stopped at step `stop` and resumed ends with the
 * checkpoint an uninterrupted run writes, byte for byte, and prints the
 * same final lines. */
static void check_resume(const char *example, const char *args, int stop) {
  char full[256], mid[256], end[256], cmd[1024];
  tmp_path(full, sizeof full, "full.safetensors");
  tmp_path(mid, sizeof mid, "mid.safetensors");
  tmp_path(end, sizeof end, "end.safetensors");
  int status = 0;
  snprintf(cmd, sizeof cmd, "%s --no-progress --save '%s'", args, full);
  char *a = run_example(example, cmd, &status);
  ck_assert_msg(status == 0, "%s %s: %d\n%s", example, cmd, status, a);
  snprintf(cmd, sizeof cmd, "%s --no-progress --stop-at %d --save '%s'", args,
           stop, mid);
  char *b = run_example(example, cmd, &status);
  ck_assert_msg(status == 0, "%s %s: %d\n%s", example, cmd, status, b);
  snprintf(cmd, sizeof cmd, "%s --no-progress --resume '%s' --save '%s'", args,
           mid, end);
  char *c = run_example(example, cmd, &status);
  ck_assert_msg(status == 0, "%s %s: %d\n%s", example, cmd, status, c);
  ck_assert_msg(strstr(c, "resumed from ") != NULL, "%s", c);
  size_t na, nc;
  char *fa = read_file(full, &na), *fc = read_file(end, &nc);
  ck_assert_msg(na == nc && memcmp(fa, fc, na) == 0,
                "%s: resumed checkpoint differs from the uninterrupted one",
                example);
  /* The final lines (test loss, samples) agree too. */
  const char *fa_line = strstr(a, "final: test loss = ");
  const char *fc_line = strstr(c, "final: test loss = ");
  if (fa_line != NULL || fc_line != NULL) {
    ck_assert_msg(fa_line && fc_line && strcmp(fa_line, fc_line) == 0,
                  "final lines differ:\n%s\n---\n%s", a, c);
  }
  free(fa);
  free(fc);
  free(a);
  free(b);
  free(c);
  remove(full);
  remove(mid);
  remove(end);
}

START_TEST(test_resume_gradient_descent) {
  check_resume("gradient_descent", "", 37);
}
END_TEST

START_TEST(test_resume_makemore) {
  if (getenv("TOPOS_SKIP_SLOW") != NULL) return;
  check_resume("makemore_mlp", "--steps 700", 333);
  check_resume("makemore_bigram", "--steps 120", 50);
  check_resume("makemore_transformer", "--steps 12", 5);
}
END_TEST

/* A checkpoint of another model, a damaged one and a missing one are
 * refused with a message that says why; nothing is trained. */
START_TEST(test_resume_refused) {
  char path[256], cmd[600];
  tmp_path(path, sizeof path, "gd.safetensors");
  int status = 0;
  snprintf(cmd, sizeof cmd, "--save '%s'", path);
  char *out = run_example("gradient_descent", cmd, &status);
  ck_assert_int_eq(status, 0);
  free(out);
  snprintf(cmd, sizeof cmd, "--resume '%s' --steps 5 2>&1", path);
  out = run_example("makemore_mlp", cmd, &status);
  ck_assert_msg(status == 1 && strstr(out, "has no parameter of this network"),
                "%d: %s", status, out);
  ck_assert_msg(strstr(out, "final:") == NULL, "%s", out);
  free(out);
  /* Cut the file short: the loader says it is truncated or corrupt. */
  size_t n;
  char *bytes = read_file(path, &n);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  fwrite(bytes, 1, n - 3, f);
  fclose(f);
  free(bytes);
  snprintf(cmd, sizeof cmd, "--resume '%s' 2>&1", path);
  out = run_example("gradient_descent", cmd, &status);
  ck_assert_msg(status == 1 && strstr(out, path) != NULL, "%d: %s", status,
                out);
  free(out);
  remove(path);
  out = run_example("gradient_descent", "--resume /nonexistent/x.st 2>&1",
                    &status);
  ck_assert_msg(status == 1 && strstr(out, "/nonexistent/x.st"), "%d: %s",
                status, out);
  free(out);
}
END_TEST

/* Run from another directory, the examples still find their data. */
START_TEST(test_data_found_anywhere) {
  const char *build = getenv("TOPOS_BUILD");
  if (build == NULL || build[0] == '\0') build = "build";
  char exe[1024], cmd[1400];
  ck_assert_ptr_nonnull(realpath(build, exe));
  snprintf(cmd, sizeof cmd,
           "cd /tmp && '%s/examples/makemore_bigram' --steps 1 --no-progress",
           exe);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  char buf[4096] = "";
  size_t got = fread(buf, 1, sizeof buf - 1, p);
  buf[got] = '\0';
  int rc = pclose(p);
  ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s", buf);
  ck_assert_msg(strstr(buf, "32033 names from ") != NULL, "%s", buf);
}
END_TEST

/* The same 200 steps on the reference backend, on cpu (auto) and on cpu by
 * name give the same bits (the checkpoints' bytes); asking for blas
 * without --fast, or an unknown backend, is refused by name. */
static char *makemore_dump(const char *args, const char *path, size_t *len) {
  char full[512];
  snprintf(full, sizeof full, "--steps 200 --no-progress --save '%s' %s", path,
           args);
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
  snprintf(path, sizeof path, "%s/topos-ex-%d.safetensors",
           tmp && *tmp ? tmp : "/tmp", (int)getpid());
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
  tcase_add_test(quick, test_resume_gradient_descent);
  tcase_add_test(quick, test_resume_refused);
  tcase_add_test(quick, test_data_found_anywhere);
  suite_add_tcase(s, quick);
  TCase *slow = tcase_create("makemore_mlp");
  tcase_set_timeout(slow, 600);
  tcase_add_test(slow, test_makemore_mlp);
  tcase_add_test(slow, test_example_backends);
  tcase_add_test(slow, test_makemore_bigram);
  tcase_add_test(slow, test_makemore_transformer_short);
  tcase_add_test(slow, test_resume_makemore);
  suite_add_tcase(s, slow);
  return s;
}
