/*
 * test_image_examples.c - runs the image classifiers (examples/mnist/mnist.c
 * and examples/cifar10/cifar10.c) as a user would, on small limits, and
 * checks what they print: the CNN and the MLP learn Fashion-MNIST from
 * 2000 images well above chance; cifar10 without --data generates its own
 * set, learns it and removes it; an interrupted run resumed ends with the
 * bytes of an uninterrupted one; a missing or damaged data set is refused
 * with exit status 1 and a message naming the path.
 *
 * The binaries are found under $TOPOS_BUILD/examples (default "build").
 * The training runs are skipped when TOPOS_SKIP_SLOW is set (valgrind),
 * and the Fashion-MNIST ones, with a note, when the data set
 * (dataset-fashion-mnist) is not installed.
 */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example_runner.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static bool slow_skipped(void) {
  return getenv("TOPOS_SKIP_SLOW") != NULL;
}

static bool have_fashion(void) {
  struct stat st;
  if (stat(FASHION_DIR, &st) == 0 && S_ISDIR(st.st_mode)) return true;
  fprintf(stderr,
          "image_examples: %s absent (install dataset-fashion-mnist): "
          "mnist runs skipped\n",
          FASHION_DIR);
  return false;
}

/* The accuracy of the last line of out, which must be the final line. */
static double final_accuracy(const char *out) {
  size_t len = strlen(out);
  while (len > 0 && out[len - 1] == '\n') len--;
  size_t start = len;
  while (start > 0 && out[start - 1] != '\n') start--;
  const char *line = out + start;
  const char *prefix = "final: test accuracy = ";
  ck_assert_msg(strncmp(line, prefix, strlen(prefix)) == 0,
                "last line is '%.*s'", (int)(len - start), line);
  char *end = NULL;
  double acc = strtod(line + strlen(prefix), &end);
  ck_assert_msg(end != line + strlen(prefix) && end == out + len,
                "unparsable accuracy in '%.*s'", (int)(len - start), line);
  ck_assert_msg(acc >= 0 && acc <= 1, "accuracy %g outside [0,1]", acc);
  return acc;
}

/* A fresh directory under $TMPDIR (or /tmp). */
static void temp_dir(char *out, size_t cap) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, cap, "%s/topos-imgex-XXXXXX",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp: %s", strerror(errno));
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void remove_tree(const char *dir) {
  nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

/* One epoch on 2000 images: the network learns (2000 images of one epoch
 * reach about 0.72 (cnn) and 0.75 (mlp) on the first 1000 test images;
 * chance is 0.1). */
static void check_mnist(const char *model) {
  if (slow_skipped() || !have_fashion()) return;
  char args[256];
  snprintf(args, sizeof args,
           "--model %s --limit 2000 --test-limit 1000 --epochs 1 "
           "--no-progress",
           model);
  int status = 0;
  char *out = run_example("mnist", args, &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  char head[64];
  snprintf(head, sizeof head, "model %s: ", model);
  ck_assert_msg(strstr(out, head) && strstr(out, " parameters"), "%s", out);
  ck_assert_msg(strstr(out, "2000 training images, 1000 test images"), "%s",
                out);
  ck_assert_msg(strstr(out, "epoch 1: train loss "), "%s", out);
  ck_assert_msg(strstr(out, ", test accuracy "), "%s", out);
  double acc = final_accuracy(out);
  ck_assert_msg(acc > 0.5, "%s: accuracy %.4f after 2000 images:\n%s", model,
                acc, out);
  free(out);
}

START_TEST(test_mnist_cnn) {
  check_mnist("cnn");
}
END_TEST

START_TEST(test_mnist_mlp) {
  check_mnist("mlp");
}
END_TEST

/* Stopped mid-epoch and resumed, the MLP ends with the checkpoint of an
 * uninterrupted run, byte for byte, and the same final line. */
START_TEST(test_mnist_resume) {
  if (slow_skipped() || !have_fashion()) return;
  char dir[512], full[600], mid[600], end[600], cmd[2048];
  temp_dir(dir, sizeof dir);
  snprintf(full, sizeof full, "%s/full.safetensors", dir);
  snprintf(mid, sizeof mid, "%s/mid.safetensors", dir);
  snprintf(end, sizeof end, "%s/end.safetensors", dir);
  /* 15 steps an epoch: step 20 is inside the second epoch. */
  const char *args =
      "--model mlp --limit 1000 --test-limit 500 --epochs 2 --no-progress";
  int status = 0;
  snprintf(cmd, sizeof cmd, "%s --save '%s'", args, full);
  char *a = run_example("mnist", cmd, &status);
  ck_assert_msg(status == 0, "%s: %d\n%s", cmd, status, a);
  snprintf(cmd, sizeof cmd, "%s --stop-at 20 --save '%s'", args, mid);
  char *b = run_example("mnist", cmd, &status);
  ck_assert_msg(status == 0, "%s: %d\n%s", cmd, status, b);
  ck_assert_msg(strstr(b, "final:") == NULL, "stopped run ended:\n%s", b);
  snprintf(cmd, sizeof cmd, "%s --resume '%s' --save '%s'", args, mid, end);
  char *c = run_example("mnist", cmd, &status);
  ck_assert_msg(status == 0, "%s: %d\n%s", cmd, status, c);
  ck_assert_msg(strstr(c, "resumed from ") && strstr(c, "epoch 2: "), "%s", c);
  size_t na, nc;
  char *fa = read_file(full, &na), *fc = read_file(end, &nc);
  ck_assert_msg(na == nc && memcmp(fa, fc, na) == 0,
                "resumed checkpoint differs from the uninterrupted one");
  const char *la = strstr(a, "final: "), *lc = strstr(c, "final: ");
  ck_assert_msg(la && lc && strcmp(la, lc) == 0, "final lines differ:\n%s\n%s",
                a, c);
  free(fa);
  free(fc);
  free(a);
  free(b);
  free(c);
  remove_tree(dir);
}
END_TEST

/* Without --data, cifar10 generates a set, says so, learns it (the
 * generated classes are easy: about 1.0 after two epochs of 640 images;
 * chance is 0.1) and removes the directory it made. */
START_TEST(test_cifar_generated) {
  if (slow_skipped()) return;
  int status = 0;
  char *out = run_example(
      "cifar10", "--limit 640 --test-limit 500 --epochs 2 --no-progress 2>&1",
      &status);
  ck_assert_msg(status == 0, "exit status %d, output:\n%s", status, out);
  ck_assert_msg(strstr(out, "no --data: CIFAR-10 cannot be downloaded here"),
                "%s", out);
  ck_assert_msg(strstr(out, "epoch 2: train loss "), "%s", out);
  const char *at = strstr(out, "generated set in ");
  ck_assert_msg(at != NULL, "%s", out);
  at += strlen("generated set in ");
  char dir[1024];
  size_t n = strcspn(at, " \n");
  ck_assert_uint_lt(n, sizeof dir);
  memcpy(dir, at, n);
  dir[n] = '\0';
  struct stat st;
  ck_assert_msg(stat(dir, &st) != 0, "%s was left behind", dir);
  double acc = final_accuracy(out);
  ck_assert_msg(acc > 0.5, "accuracy %.4f on the generated set:\n%s", acc, out);
  free(out);
}
END_TEST

/* A data directory that is not there: exit 1, the path and what to do. */
START_TEST(test_data_missing) {
  int status = 0;
  char *out = run_example("mnist", "--data /nonexistent/fm 2>&1", &status);
  ck_assert_msg(status == 1, "exit status %d:\n%s", status, out);
  ck_assert_msg(strstr(out, "/nonexistent/fm") &&
                    strstr(out, "dataset-fashion-mnist") &&
                    strstr(out, "--data DIR"),
                "%s", out);
  ck_assert_msg(strstr(out, "final:") == NULL, "%s", out);
  free(out);
  out = run_example("cifar10", "--data /nonexistent/cf 2>&1", &status);
  ck_assert_msg(status == 1, "exit status %d:\n%s", status, out);
  ck_assert_msg(strstr(out, "/nonexistent/cf"), "%s", out);
  ck_assert_msg(strstr(out, "final:") == NULL, "%s", out);
  free(out);
}
END_TEST

/* A damaged data set: exit 1 and a message naming the damaged file. */
START_TEST(test_data_corrupt) {
  char dir[512], path[700], cmd[1024];
  temp_dir(dir, sizeof dir);
  /* 60000 well-formed labels, and an IDX header for 60000 images of
   * 28x28 followed by only 100 bytes. */
  enum { N = 60000 };
  unsigned char *labels = calloc(1, 8 + N);
  ck_assert_ptr_nonnull(labels);
  memcpy(labels, (unsigned char[8]){0, 0, 0x08, 1, 0, 0, 0xEA, 0x60}, 8);
  snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
  write_bytes(path, labels, 8 + N);
  free(labels);
  unsigned char idx[16 + 100] = {0, 0, 0x08, 3,  0, 0, 0xEA, 0x60,
                                 0, 0, 0,    28, 0, 0, 0,    28};
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
  write_bytes(path, idx, sizeof idx);
  int status = 0;
  snprintf(cmd, sizeof cmd, "--data '%s' 2>&1", dir);
  char *out = run_example("mnist", cmd, &status);
  ck_assert_msg(status == 1, "exit status %d:\n%s", status, out);
  ck_assert_msg(strstr(out, path) != NULL, "no '%s' in:\n%s", path, out);
  free(out);
  /* A CIFAR batch that is not a whole number of records. */
  unsigned char rec[100] = {0};
  snprintf(path, sizeof path, "%s/data_batch_1.bin", dir);
  write_bytes(path, rec, sizeof rec);
  out = run_example("cifar10", cmd, &status);
  ck_assert_msg(status == 1, "exit status %d:\n%s", status, out);
  ck_assert_msg(strstr(out, path) != NULL, "no '%s' in:\n%s", path, out);
  free(out);
  remove_tree(dir);
}
END_TEST

/* Flags the examples do not know, or bad values, are usage errors. */
START_TEST(test_bad_flags) {
  int status = 0;
  char *out = run_example("mnist", "--model resnet 2>&1", &status);
  ck_assert_msg(status == 2 && strstr(out, "--model is cnn or mlp"), "%d: %s",
                status, out);
  free(out);
  out = run_example("cifar10", "--epochs 0 2>&1", &status);
  ck_assert_msg(status == 2 && strstr(out, "--epochs"), "%d: %s", status, out);
  free(out);
  out = run_example("mnist", "--frobnicate 2>&1", &status);
  ck_assert_msg(status == 2 && strstr(out, "usage: mnist"), "%d: %s", status,
                out);
  free(out);
}
END_TEST

Suite *image_examples_suite(void) {
  Suite *s = suite_create("image_examples");
  TCase *quick = tcase_create("refusals");
  tcase_add_test(quick, test_data_missing);
  tcase_add_test(quick, test_data_corrupt);
  tcase_add_test(quick, test_bad_flags);
  suite_add_tcase(s, quick);
  TCase *slow = tcase_create("training");
  tcase_set_timeout(slow, 300);
  tcase_add_test(slow, test_mnist_cnn);
  tcase_add_test(slow, test_mnist_mlp);
  tcase_add_test(slow, test_mnist_resume);
  tcase_add_test(slow, test_cifar_generated);
  suite_add_tcase(s, slow);
  return s;
}
