/*
 * test_safetensors.c - checkpoints in the safetensors format
 * (engine/safetensors.c): bit-exact round trips of every dtype, strided
 * views and scalars; hostile files written byte by byte from
 * docs/checkpoints.md, each of which must be refused with
 * TOPOS_ERR_CORRUPT and a message naming the fault; a refused save that
 * leaves the old file as it was; a file cut or rewritten after loading
 * (get fails cleanly) and one removed or replaced (get still reads what
 * was loaded); the peak memory of loading a 64 MB file (one copy of the
 * data, not two); and interop with the Python safetensors package (from
 * .iree-venv, `make deps`) in both directions.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* --------------------------------------------------------------- helpers */

static char work[PATH_MAX]; /* this test's temporary directory */

static void make_work(void) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !tmp[0]) tmp = "/tmp";
  snprintf(work, sizeof work, "%s/topos_st_XXXXXX", tmp);
  ck_assert_msg(mkdtemp(work) != NULL, "mkdtemp: %s", strerror(errno));
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_work(void) {
  if (work[0]) nftw(work, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  work[0] = '\0';
}

/* A path in the work directory; four rotating buffers, so a test may
 * hold a few at once. */
static const char *in_work(const char *name) {
  static char paths[4][PATH_MAX + 64];
  static int next;
  char *path = paths[next++ % 4];
  snprintf(path, sizeof paths[0], "%s/%s", work, name);
  return path;
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

/* The file's bytes (caller frees). */
static uint8_t *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)len + 1);
  ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return buf;
}

/* A file of an 8-byte length `claimed`, the header text, then data_len
 * bytes of data. */
static void write_raw(const char *path, uint64_t claimed, const char *header,
                      size_t data_len) {
  size_t hl = strlen(header);
  size_t n = 8 + hl + data_len;
  uint8_t *buf = calloc(1, n);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(claimed >> (8 * i));
  memcpy(buf + 8, header, hl);
  for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)i;
  write_bytes(path, buf, n);
  free(buf);
}

/* Loading must fail with this code and a message containing `part`. */
static void expect_load_error(const char *path, int code, const char *part) {
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st == NULL, "loaded a file that should fail (%s)", part);
  ck_assert_msg(err.code == code, "code %d, want %d: %s", err.code, code,
                err.message);
  ck_assert_msg(strstr(err.message, part) != NULL, "want \"%s\" in: %s", part,
                err.message);
}

/* A header with `entries` (JSON members) over data_len bytes. */
static void expect_header_error(const char *entries, size_t data_len,
                                const char *part) {
  char header[4096];
  snprintf(header, sizeof header, "{%s}", entries);
  const char *path = in_work("bad.safetensors");
  write_raw(path, strlen(header), header, data_len);
  expect_load_error(path, TOPOS_ERR_CORRUPT, part);
}

/* The sample set every direction checks: all dtypes, a strided view and
 * a scalar (released by the caller). */
#define N_SAMPLE 6
static const char *const SAMPLE_NAMES[N_SAMPLE] = {
    "w.f32", "b.f64", "emb.bf16", "idx.i32", "wT.view", "step"};

static void sample_set(topos_tensor *t[N_SAMPLE]) {
  topos_error err = {0};
  const int64_t s23[] = {2, 3}, s3[] = {3}, s22[] = {2, 2}, s4[] = {4};
  const double v6[] = {1.5, -2.25, 3e-8, 1e30, -0.0, 7};
  t[0] = tt_tensor(TOPOS_F32, 2, s23, v6);
  const double v3[] = {0.1, -1e300, 5e-324};
  t[1] = tt_tensor(TOPOS_F64, 1, s3, v3);
  const double v4[] = {1.0, -2.5, 3.140625, 65280};
  t[2] = tt_tensor(TOPOS_BF16, 2, s22, v4);
  const double vi[] = {0, -1, 2147483647, -2147483648.0};
  t[3] = tt_tensor(TOPOS_I32, 1, s4, vi);
  t[4] = topos_tensor_transpose(t[0], &err); /* [3,2], not contiguous */
  ck_assert_ptr_nonnull(t[4]);
  ck_assert(!topos_tensor_is_contiguous(t[4]));
  t[5] = topos_tensor_scalar(TOPOS_F64, 42.5, &err);
  ck_assert_ptr_nonnull(t[5]);
}

static void release_all(int n, topos_tensor **t) {
  for (int i = 0; i < n; i++) topos_tensor_release(t[i]);
}

static void save_sample(const char *path) {
  topos_tensor *t[N_SAMPLE];
  sample_set(t);
  topos_error err = {0};
  ck_assert_msg(
      topos_safetensors_save(path, N_SAMPLE, SAMPLE_NAMES, t, &err) == TOPOS_OK,
      "save: %s", err.message);
  release_all(N_SAMPLE, t);
}

/* ----------------------------------------------------------- round trip */

START_TEST(test_round_trip) {
  make_work();
  const char *path = in_work("ok.safetensors");
  save_sample(path);
  topos_tensor *t[N_SAMPLE];
  sample_set(t);
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  ck_assert_int_eq(topos_safetensors_count(st), N_SAMPLE);
  for (int i = 0; i < N_SAMPLE; i++) {
    ck_assert_str_eq(topos_safetensors_name(st, i), SAMPLE_NAMES[i]);
    topos_tensor *got = topos_safetensors_get(st, SAMPLE_NAMES[i], &err);
    ck_assert_msg(got != NULL, "get %s: %s", SAMPLE_NAMES[i], err.message);
    ck_assert_msg(topos_tensor_bitwise_equal(got, t[i]), "%s differs",
                  SAMPLE_NAMES[i]);
    topos_tensor_release(got);
  }
  ck_assert_int_eq(topos_tensor_rank(t[5]), 0);
  ck_assert_ptr_null(topos_safetensors_name(st, N_SAMPLE));
  ck_assert_ptr_null(topos_safetensors_get(st, "missing", &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_NOT_FOUND);
  topos_safetensors_free(st);

  /* The header is padded so the data starts 8-byte aligned. */
  size_t n = 0;
  uint8_t *bytes = read_bytes(path, &n);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)bytes[i] << (8 * i);
  ck_assert_uint_eq(hl % 8, 0);
  ck_assert_uint_eq(bytes[8], '{');
  free(bytes);

  /* An empty set round-trips too. */
  ck_assert_int_eq(topos_safetensors_save(path, 0, NULL, NULL, &err), TOPOS_OK);
  st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load empty: %s", err.message);
  ck_assert_int_eq(topos_safetensors_count(st), 0);
  topos_safetensors_free(st);
  release_all(N_SAMPLE, t);
  remove_work();
}
END_TEST

/* A file written by hand (other order, metadata, zero-size tensor,
 * padding) loads with the right values. */
START_TEST(test_hand_made_file) {
  make_work();
  const char *path = in_work("hand.safetensors");
  const char *header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"e\":{\"dtype\":\"F64\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}   ";
  size_t hl = strlen(header);
  uint8_t buf[512] = {0};
  buf[0] = (uint8_t)hl;
  memcpy(buf + 8, header, hl);
  float a = 2.5f;
  int32_t b = -7;
  memcpy(buf + 8 + hl, &a, 4);
  memcpy(buf + 8 + hl + 4, &b, 4);
  write_bytes(path, buf, 8 + hl + 8);
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  ck_assert_int_eq(topos_safetensors_count(st), 3);
  topos_tensor *ta = topos_safetensors_get(st, "a", &err);
  topos_tensor *tb = topos_safetensors_get(st, "b", &err);
  topos_tensor *te = topos_safetensors_get(st, "e", &err);
  ck_assert_int_eq(topos_tensor_rank(ta), 0);
  ck_assert(topos_tensor_get(ta, NULL, &err) == 2.5);
  int64_t zero = 0;
  ck_assert(topos_tensor_get(tb, &zero, &err) == -7);
  ck_assert_int_eq(topos_tensor_count(te), 0);
  ck_assert_int_eq(topos_tensor_dtype(te), TOPOS_F64);
  topos_tensor_release(ta);
  topos_tensor_release(tb);
  topos_tensor_release(te);
  topos_safetensors_free(st);
  remove_work();
}
END_TEST

/* -------------------------------------------------------- hostile files */

START_TEST(test_truncations) {
  make_work();
  const char *path = in_work("ok.safetensors");
  save_sample(path);
  size_t n = 0;
  uint8_t *bytes = read_bytes(path, &n);
  const char *cut = in_work("cut.safetensors");
  for (size_t len = 0; len < n; len++) {
    write_bytes(cut, bytes, len);
    topos_error err = {0};
    topos_safetensors *st = topos_safetensors_load(cut, &err);
    ck_assert_msg(st == NULL, "loaded a file cut to %zu of %zu bytes", len, n);
    ck_assert_msg(err.code == TOPOS_ERR_CORRUPT, "cut %zu: %s", len,
                  err.message);
  }
  expect_load_error(in_work("absent"), TOPOS_ERR_NOT_FOUND, "absent");
  write_bytes(cut, bytes, 5);
  expect_load_error(cut, TOPOS_ERR_CORRUPT, "truncated");
  free(bytes);
  remove_work();
}
END_TEST

START_TEST(test_bad_header) {
  make_work();
  const char *path = in_work("bad.safetensors");
  write_raw(path, 1000, "{}", 0);
  expect_load_error(path, TOPOS_ERR_CORRUPT, "beyond the file");
  write_raw(path, 200u * 1000u * 1000u, "{}", 0);
  expect_load_error(path, TOPOS_ERR_CORRUPT, "over the cap");
  write_raw(path, UINT64_MAX, "{}", 0);
  expect_load_error(path, TOPOS_ERR_CORRUPT, "over the cap");
  const char *not_objects[] = {"[1,2]", "{", "\"x\"", "{} x",
                               "{}\n",  "",  "null"};
  for (size_t i = 0; i < sizeof not_objects / sizeof *not_objects; i++) {
    write_raw(path, strlen(not_objects[i]), not_objects[i], 0);
    expect_load_error(path, TOPOS_ERR_CORRUPT, "not a JSON object");
  }
  remove_work();
}
END_TEST

#define F32_4 "\"dtype\":\"F32\",\"shape\":[4]"

START_TEST(test_bad_entries) {
  make_work();
  expect_header_error(
      "\"a\":{\"dtype\":\"F16\",\"shape\":[2],"
      "\"data_offsets\":[0,4]}",
      4, "dtype \"F16\"");
  expect_header_error("\"a\":{\"shape\":[2],\"data_offsets\":[0,4]}", 4,
                      "no dtype");
  expect_header_error("\"a\":[1]", 4, "not an object");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[-1],"
      "\"data_offsets\":[0,4]}",
      4, "extent 0");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1,1.5],"
      "\"data_offsets\":[0,4]}",
      4, "extent 1");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],"
      "\"data_offsets\":[0,4]}",
      4, "extent 0");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],"
      "\"data_offsets\":[0,4]}",
      4, "extent 0");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,"
      "4294967296],\"data_offsets\":[0,4]}",
      4, "overflows");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
      "\"data_offsets\":[0,4]}",
      4, "rank 9");
  expect_header_error(
      "\"a\":{\"dtype\":\"F32\",\"shape\":4,"
      "\"data_offsets\":[0,4]}",
      4, "no shape");
  /* data_offsets */
  expect_header_error("\"a\":{" F32_4 "}", 16, "no data_offsets");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[0]}", 16,
                      "no data_offsets");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[0,16,16]}", 16,
                      "no data_offsets");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[-1,15]}", 16,
                      "no data_offsets");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[16,0]}", 16,
                      "outside");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[0,20]}", 16,
                      "outside");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[0,12]}", 16,
                      "holds 12 bytes but F32 of 4 elements needs 16");
  expect_header_error("\"a\":{" F32_4
                      ",\"data_offsets\":[0,16]},"
                      "\"b\":{" F32_4 ",\"data_offsets\":[8,24]}",
                      24, "overlaps");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[4,20]}", 20,
                      "[0, 4) belong to no tensor");
  expect_header_error("\"a\":{" F32_4 ",\"data_offsets\":[0,16]}", 20,
                      "[16, 20) belong to no tensor");
  expect_header_error("\"a\":{" F32_4
                      ",\"data_offsets\":[0,16]},"
                      "\"a\":{" F32_4 ",\"data_offsets\":[16,32]}",
                      32, "duplicate tensor name \"a\"");
  /* names and metadata */
  expect_header_error("\"a\\u0000\":{" F32_4
                      ",\"data_offsets\":[0,16]},"
                      "\"a\":{" F32_4 ",\"data_offsets\":[16,32]}",
                      32, "duplicate tensor name");
  expect_header_error("\"\xff\":{" F32_4 ",\"data_offsets\":[0,16]}", 16,
                      "not valid UTF-8");
  expect_header_error("\"__metadata__\":{\"k\":1}", 0, "is not a string");
  expect_header_error("\"__metadata__\":[]", 0, "is not an object");
  remove_work();
}
END_TEST

/* A refused save leaves an existing file exactly as it was, and no
 * temporary file behind. */
START_TEST(test_refused_save_changes_nothing) {
  make_work();
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s", in_work("keep.safetensors"));
  save_sample(path);
  size_t n0 = 0;
  uint8_t *before = read_bytes(path, &n0);
  topos_tensor *t[N_SAMPLE];
  sample_set(t);
  topos_error err = {0};
  const char *dup[N_SAMPLE] = {"a", "b", "c", "d", "a", "f"};
  ck_assert_int_eq(topos_safetensors_save(path, N_SAMPLE, dup, t, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "duplicate name \"a\""));
  const char *bad_utf8[2] = {"ok", "\xc0\xaf"};
  ck_assert_int_eq(topos_safetensors_save(path, 2, bad_utf8, t, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "UTF-8"));
  const char *reserved[1] = {"__metadata__"};
  ck_assert_int_eq(topos_safetensors_save(path, 1, reserved, t, &err),
                   TOPOS_ERR_ARGUMENT);
  const char *one[1] = {"x"};
  topos_tensor *null_tensor[1] = {NULL};
  ck_assert_int_eq(topos_safetensors_save(path, 1, one, null_tensor, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(
      topos_safetensors_save(in_work("no/such/dir/x"), 1, one, t, &err),
      TOPOS_ERR_IO);
  size_t n1 = 0;
  uint8_t *after = read_bytes(path, &n1);
  ck_assert_uint_eq(n0, n1);
  ck_assert(memcmp(before, after, n0) == 0);
  free(before);
  free(after);
  /* Only the one file is in the directory. */
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", work);
  ck_assert_int_eq(system(cmd), 0);
  release_all(N_SAMPLE, t);
  remove_work();
}
END_TEST

/* ------------------------------------------------- after loading */

/* Every tensor of the sample file read back equal to the sample set. */
static void expect_sample(const topos_safetensors *st) {
  topos_tensor *t[N_SAMPLE];
  sample_set(t);
  for (int i = 0; i < N_SAMPLE; i++) {
    topos_error err = {0};
    topos_tensor *got = topos_safetensors_get(st, SAMPLE_NAMES[i], &err);
    ck_assert_msg(got != NULL, "get %s: %s", SAMPLE_NAMES[i], err.message);
    ck_assert_msg(topos_tensor_bitwise_equal(got, t[i]), "%s differs",
                  SAMPLE_NAMES[i]);
    topos_tensor_release(got);
  }
  release_all(N_SAMPLE, t);
}

/* get must fail for every tensor with TOPOS_ERR_IO naming the change. */
static void expect_get_fails(const topos_safetensors *st) {
  for (int i = 0; i < N_SAMPLE; i++) {
    topos_error err = {0};
    topos_tensor *got = topos_safetensors_get(st, SAMPLE_NAMES[i], &err);
    ck_assert_msg(got == NULL, "got %s from a changed file", SAMPLE_NAMES[i]);
    ck_assert_msg(err.code == TOPOS_ERR_IO, "%s: code %d: %s", SAMPLE_NAMES[i],
                  err.code, err.message);
    ck_assert_msg(strstr(err.message, "changed since it was loaded") &&
                      strstr(err.message, SAMPLE_NAMES[i]),
                  "%s", err.message);
  }
}

/* Loading reads the header only; the data is read by get from the file,
 * which stays open.  A file cut or rewritten in place after loading makes
 * get fail cleanly, never hand back other bytes. */
START_TEST(test_file_changed_after_load) {
  make_work();
  const char *path = in_work("ok.safetensors");
  save_sample(path);
  size_t n = 0;
  uint8_t *bytes = read_bytes(path, &n);
  /* An old mtime, so a rewrite below moves it whatever the clock's
   * granularity. */
  const struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
  ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0);
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  expect_sample(st);
  expect_sample(st); /* again: each get reads a new tensor */
  /* Cut: the last tensors' bytes are gone, and the size moved. */
  ck_assert_int_eq(truncate(path, (off_t)n - 8), 0);
  expect_get_fails(st);
  /* The names stay listed. */
  ck_assert_int_eq(topos_safetensors_count(st), N_SAMPLE);
  ck_assert_str_eq(topos_safetensors_name(st, 0), SAMPLE_NAMES[0]);
  topos_safetensors_free(st);

  /* Rewritten in place at the same size: refused too. */
  write_bytes(path, bytes, n);
  ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0);
  st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, (long)n - 4, SEEK_SET), 0);
  ck_assert_int_eq(fputc(0x55, f), 0x55);
  ck_assert_int_eq(fclose(f), 0);
  expect_get_fails(st);
  topos_safetensors_free(st);

  /* Removed, or replaced by a save (a rename over the path): the open
   * file is the one loaded, and its tensors read back as they were. */
  write_bytes(path, bytes, n);
  st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  ck_assert_int_eq(unlink(path), 0);
  expect_sample(st);
  topos_safetensors_free(st);
  write_bytes(path, bytes, n);
  st = topos_safetensors_load(path, &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  topos_tensor *other = topos_tensor_scalar(TOPOS_F32, 1.0, &err);
  const char *one[1] = {"other"};
  ck_assert_int_eq(topos_safetensors_save(path, 1, one, &other, &err),
                   TOPOS_OK);
  topos_tensor_release(other);
  expect_sample(st);
  topos_safetensors_free(st);
  free(bytes);
  remove_work();
}
END_TEST

/* A field of /proc/self/status in bytes ("VmHWM:", "VmRSS:"), or -1. */
static int64_t status_bytes(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, strlen(field)) == 0)
      kb = strtoll(line + strlen(field), NULL, 10);
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

#define PEAK_TENSORS 4
#define PEAK_ELEMS (4 << 20) /* f32: 16 MiB a tensor, 64 MiB in all */

/* The child of test_load_peak_memory: loads the file and gets every
 * tensor, holding them all, and writes the growth of its peak resident
 * set (bytes) to fd.  Exit 0; 2 when the peak cannot be reset here. */
static int peak_child(const char *path, int fd) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  /* "5" resets the peak resident set (VmHWM) to the current one. */
  if (!f || fputs("5", f) < 0 || fclose(f) != 0) return 2;
  int64_t before = status_bytes("VmRSS:");
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  if (!st) return 1;
  topos_tensor *t[PEAK_TENSORS] = {0};
  for (int i = 0; i < PEAK_TENSORS; i++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    t[i] = topos_safetensors_get(st, name, &err);
    if (!t[i] || topos_tensor_count(t[i]) != PEAK_ELEMS) return 1;
    int64_t last = PEAK_ELEMS - 1;
    if (topos_tensor_get(t[i], &last, &err) != (double)(i * 1000 + 7)) return 1;
  }
  topos_safetensors_free(st);
  int64_t growth = status_bytes("VmHWM:") - before;
  for (int i = 0; i < PEAK_TENSORS; i++) topos_tensor_release(t[i]);
  return write(fd, &growth, sizeof growth) == sizeof growth ? 0 : 1;
}

/* Loading a 64 MiB file and getting every tensor grows the peak resident
 * set by about the data once (the tensors), not twice (a copy of the
 * file as well, as the loader once did). */
START_TEST(test_load_peak_memory) {
#ifdef __SANITIZE_ADDRESS__
  printf("safetensors: peak memory not measured under ASan\n");
  return;
#endif
  make_work();
  const char *path = in_work("big.safetensors");
  char header[1024] = "{";
  size_t tensor_bytes = (size_t)PEAK_ELEMS * 4;
  for (int i = 0; i < PEAK_TENSORS; i++) {
    size_t len = strlen(header);
    snprintf(header + len, sizeof header - len,
             "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[%d],"
             "\"data_offsets\":[%zu,%zu]}",
             i ? "," : "", i, PEAK_ELEMS, i * tensor_bytes,
             (i + 1) * tensor_bytes);
  }
  strcat(header, "}");
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  uint64_t hl = strlen(header);
  uint8_t prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)(hl >> (8 * i));
  ck_assert_uint_eq(fwrite(prefix, 1, 8, f), 8);
  ck_assert_uint_eq(fwrite(header, 1, hl, f), hl);
  enum { CHUNK = 1 << 18 };
  static float chunk[CHUNK];
  for (int i = 0; i < PEAK_TENSORS; i++)
    for (int c = 0; c < PEAK_ELEMS / CHUNK; c++) {
      for (int k = 0; k < CHUNK; k++) chunk[k] = (float)(i * 1000 + k % 8);
      ck_assert_uint_eq(fwrite(chunk, sizeof *chunk, CHUNK, f), CHUNK);
    }
  ck_assert_int_eq(fclose(f), 0);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    _exit(peak_child(path, fds[1]));
  }
  close(fds[1]);
  int64_t growth = -1;
  ssize_t got = read(fds[0], &growth, sizeof growth);
  close(fds[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) {
    printf("safetensors: cannot reset the peak RSS here; not measured\n");
    remove_work();
    return;
  }
  ck_assert_msg(WEXITSTATUS(status) == 0 && got == sizeof growth,
                "the child failed to load or check the file");
  int64_t data = (int64_t)PEAK_TENSORS * (int64_t)tensor_bytes;
  printf("safetensors: loading %.1f MiB grew the peak RSS by %.1f MiB\n",
         data / 1048576.0, growth / 1048576.0);
  ck_assert_msg(growth <= data + data / 2,
                "peak RSS grew by %lld bytes loading %lld bytes of data "
                "(more than 1.5x)",
                (long long)growth, (long long)data);
  remove_work();
}
END_TEST

/* ---------------------------------------------------- Python interop */

/* The venv's python with safetensors importable, or NULL. */
static const char *find_python(void) {
  static char path[PATH_MAX + 32];
  const char *dirs[3] = {getenv("TOPOS_IREE_BIN"), NULL, ".iree-venv/bin"};
  char venv_bin[PATH_MAX];
  const char *venv = getenv("IREE_VENV");
  if (venv && venv[0] && strlen(venv) < PATH_MAX - 8) {
    snprintf(venv_bin, sizeof venv_bin, "%s/bin", venv);
    dirs[1] = venv_bin;
  }
  for (int i = 0; i < 3; i++) {
    if (!dirs[i] || !dirs[i][0] || strlen(dirs[i]) >= PATH_MAX) continue;
    char dir[PATH_MAX];
    if (!realpath(dirs[i], dir)) continue;
    snprintf(path, sizeof path, "%s/python", dir);
    if (access(path, X_OK) != 0) continue;
    char cmd[PATH_MAX + 96];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import safetensors, ml_dtypes' >/dev/null 2>&1", path);
    if (system(cmd) == 0) return path;
  }
  return NULL;
}

static void run_python(const char *python, const char *script) {
  const char *script_path = in_work("check.py");
  write_bytes(script_path, script, strlen(script));
  char cmd[3 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' '%s' 2>&1", work, python,
           script_path);
  ck_assert_msg(system(cmd) == 0, "python check failed (output above)");
}

START_TEST(test_python_reads_ours) {
  const char *python = find_python();
  if (!python) {
    printf(
        "safetensors: no .iree-venv python with safetensors "
        "(run `make deps`); Python interop skipped\n");
    return;
  }
  make_work();
  save_sample(in_work("ours.safetensors"));
  run_python(python,
             "import numpy as np, ml_dtypes\n"
             "from safetensors.numpy import load_file\n"
             "d = load_file('ours.safetensors')\n"
             "assert sorted(d) == sorted(['w.f32','b.f64','emb.bf16',"
             "'idx.i32','wT.view','step']), sorted(d)\n"
             "w = np.array([[1.5,-2.25,3e-8],[1e30,-0.0,7]], np.float32)\n"
             "def same(a, b):\n"
             "    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)\n"
             "    assert a.tobytes() == b.tobytes(), (a, b)\n"
             "same(d['w.f32'], w)\n"
             "same(d['wT.view'], np.ascontiguousarray(w.T))\n"
             "same(d['b.f64'], np.array([0.1,-1e300,5e-324]))\n"
             "same(d['emb.bf16'], np.array([[1.0,-2.5],[3.140625,65280]],"
             " ml_dtypes.bfloat16))\n"
             "same(d['idx.i32'], np.array([0,-1,2**31-1,-2**31], np.int32))\n"
             "same(d['step'], np.array(42.5))\n");
  remove_work();
}
END_TEST

START_TEST(test_we_read_python) {
  const char *python = find_python();
  if (!python) {
    printf(
        "safetensors: no .iree-venv python with safetensors "
        "(run `make deps`); Python interop skipped\n");
    return;
  }
  make_work();
  run_python(python,
             "import numpy as np, ml_dtypes\n"
             "from safetensors.numpy import save_file\n"
             "save_file({'f': np.arange(6, dtype=np.float32).reshape(2,3)"
             " / 3,\n"
             "           'd': np.array([1/3, -2e-310, 1e308]),\n"
             "           'i': np.array([[5, -6]], np.int32),\n"
             "           'h': np.array([0.5, -3.0], ml_dtypes.bfloat16),\n"
             "           's': np.array(7, np.int32)},\n"
             "          'theirs.safetensors', metadata={'format': 'np'})\n");
  topos_error err = {0};
  topos_safetensors *st =
      topos_safetensors_load(in_work("theirs.safetensors"), &err);
  ck_assert_msg(st != NULL, "load: %s", err.message);
  ck_assert_int_eq(topos_safetensors_count(st), 5);
  float f[6];
  for (int i = 0; i < 6; i++) f[i] = (float)i / 3.0f;
  const int64_t s23[] = {2, 3}, s3[] = {3}, s12[] = {1, 2}, s2[] = {2};
  double d[3] = {1.0 / 3, -2e-310, 1e308};
  int32_t iv[2] = {5, -6}, sv = 7;
  uint16_t h[2] = {topos_bf16_from_f32(0.5f), topos_bf16_from_f32(-3.0f)};
  struct {
    const char *name;
    topos_tensor *want;
  } cases[] = {
      {"f", topos_tensor_from(TOPOS_F32, 2, s23, f, &err)},
      {"d", topos_tensor_from(TOPOS_F64, 1, s3, d, &err)},
      {"i", topos_tensor_from(TOPOS_I32, 2, s12, iv, &err)},
      {"h", topos_tensor_from(TOPOS_BF16, 1, s2, h, &err)},
      {"s", topos_tensor_from(TOPOS_I32, 0, NULL, &sv, &err)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    topos_tensor *got = topos_safetensors_get(st, cases[i].name, &err);
    ck_assert_msg(got != NULL, "get %s: %s", cases[i].name, err.message);
    ck_assert_msg(topos_tensor_bitwise_equal(got, cases[i].want), "%s differs",
                  cases[i].name);
    topos_tensor_release(got);
    topos_tensor_release(cases[i].want);
  }
  topos_safetensors_free(st);
  remove_work();
}
END_TEST

Suite *safetensors_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("format");
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_hand_made_file);
  tcase_add_test(tc, test_truncations);
  tcase_add_test(tc, test_bad_header);
  tcase_add_test(tc, test_bad_entries);
  tcase_add_test(tc, test_refused_save_changes_nothing);
  tcase_add_test(tc, test_file_changed_after_load);
  tcase_add_test(tc, test_load_peak_memory);
  suite_add_tcase(s, tc);
  TCase *py = tcase_create("python");
  tcase_set_timeout(py, 60);
  tcase_add_test(py, test_python_reads_ours);
  tcase_add_test(py, test_we_read_python);
  suite_add_tcase(s, py);
  return s;
}
