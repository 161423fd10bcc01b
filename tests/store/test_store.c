/*
 * test_store.c - the spec and blob store (store/store.c) on real SQLite
 * files in a fresh mkdtemp directory per test.
 *
 * Ids are checked against OpenSSL's SHA-256 directly, and damage is done
 * behind the store's back with a raw sqlite3 connection, so the suite does
 * not trust the code it tests.  The crash test forks children that put
 * specs and report each one the moment store_put_spec returns; the parent
 * SIGKILLs them at random moments and then reads back every reported id.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scratch_dir.h"
#include "store.h"

/* ------------------------------------------------------------- fixtures */

static char g_path[600];

static void setup(void) {
  scratch_dir_make("topos-store");
  snprintf(g_path, sizeof g_path, "%s/store.db", g_dir);
}

static void teardown(void) {
  scratch_dir_remove();
}

/* A path next to the store. */
static const char *in_dir(const char *name) {
  static char buf[700];
  snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
  return buf;
}

/* -------------------------------------------------------------- helpers */

/* Deterministic bytes from a seed. */
static void fill(uint8_t *buf, size_t n, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(next_random(&state) >> 56);
}

static uint8_t *make_bytes(size_t n, uint64_t seed) {
  uint8_t *buf = malloc(n > 0 ? n : 1);
  ck_assert_ptr_nonnull(buf);
  fill(buf, n, seed);
  return buf;
}

/* SHA-256 straight from OpenSSL, independent of the engine's helper. */
static void expected_id(const void *bytes, size_t len, char out[65]) {
  unsigned char md[32];
  unsigned int n = 0;
  ck_assert(EVP_Digest(bytes, len, md, &n, EVP_sha256(), NULL) == 1);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static topos_store *open_ok(const char *path) {
  topos_error err = {0};
  topos_store *st = store_open(path, &err);
  ck_assert_msg(st != NULL, "store_open(%s): %s", path, err.message);
  return st;
}

static void put_spec_ok(topos_store *st, const void *bytes, size_t len,
                        char id[65]) {
  topos_error err = {0};
  int rc = store_put_spec(st, bytes, len, id, &err);
  ck_assert_msg(rc == TOPOS_OK, "put_spec: %s", err.message);
}

static void put_blob_ok(topos_store *st, const void *bytes, size_t len,
                        char id[65]) {
  topos_error err = {0};
  int rc = store_put_blob(st, bytes, len, id, &err);
  ck_assert_msg(rc == TOPOS_OK, "put_blob: %s", err.message);
}

static void assert_spec_is(topos_store *st, const char *id, const uint8_t *want,
                           size_t want_len) {
  topos_error err = {0};
  uint8_t *got = NULL;
  size_t len = 0;
  int rc = store_get_spec(st, id, &got, &len, &err);
  ck_assert_msg(rc == TOPOS_OK, "get_spec %s: %s", id, err.message);
  ck_assert_uint_eq(len, want_len);
  ck_assert(want_len == 0 || memcmp(got, want, want_len) == 0);
  free(got);
}

static bool blob_present(topos_store *st, const char *id) {
  topos_error err = {0};
  int64_t size = 0;
  int rc = store_stat_blob(st, id, &size, &err);
  ck_assert_msg(rc == TOPOS_OK || rc == TOPOS_ERR_NOT_FOUND, "stat_blob: %s",
                err.message);
  return rc == TOPOS_OK;
}

static store_stats_info stats_ok(topos_store *st) {
  topos_error err = {0};
  store_stats_info s;
  ck_assert_msg(store_stats(st, &s, &err) == TOPOS_OK, "stats: %s",
                err.message);
  return s;
}

/* Whole-file contents (NULL and *len 0 when it cannot be read). */
static uint8_t *read_file(const char *path, size_t *len) {
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  ck_assert_ptr_nonnull(buf);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  ck_assert_uint_eq(got, (size_t)n);
  *len = (size_t)n;
  return buf;
}

static void write_file(const char *path, const void *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

static bool file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* A raw connection, behind the store's back. */
static sqlite3 *raw_open(const char *path) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open(path, &db);
  ck_assert_msg(rc == SQLITE_OK, "sqlite3_open: %s", sqlite3_errmsg(db));
  sqlite3_busy_timeout(db, 10000);
  return db;
}

static void raw_exec(sqlite3 *db, const char *sql) {
  char *msg = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg != NULL ? msg : "?");
}

static int64_t raw_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *stmt;
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  int64_t v = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  return v;
}

/* Runs raw SQL with ?1 bound to an id (changes exactly one row). */
static void raw_with_id(const char *path, const char *sql, const char *id) {
  sqlite3 *db = raw_open(path);
  sqlite3_stmt *stmt;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
  ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
  sqlite3_bind_text(stmt, 1, id, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

/* Flips one byte of a stored payload with raw SQL ("spec" or "blob"). */
static void raw_flip_byte(const char *path, const char *noun, const char *id,
                          size_t offset) {
  sqlite3 *db = raw_open(path);
  char sql[160];
  snprintf(sql, sizeof sql,
           "SELECT p.bytes FROM %ss AS t JOIN %s_bytes AS p ON p.seq = t.seq "
           "WHERE t.id = ?1",
           noun, noun);
  sqlite3_stmt *stmt;
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), SQLITE_OK);
  sqlite3_bind_text(stmt, 1, id, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  int n = sqlite3_column_bytes(stmt, 0);
  ck_assert_int_gt(n, (int)offset);
  uint8_t *copy = malloc((size_t)n);
  memcpy(copy, sqlite3_column_blob(stmt, 0), (size_t)n);
  sqlite3_finalize(stmt);
  copy[offset] ^= 0x01;
  snprintf(sql, sizeof sql,
           "UPDATE %s_bytes SET bytes = ?1 "
           "WHERE seq = (SELECT seq FROM %ss WHERE id = ?2)",
           noun, noun);
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), SQLITE_OK);
  sqlite3_bind_blob(stmt, 1, copy, n, SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt, 2, id, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  free(copy);
  sqlite3_close(db);
}

static void assert_integrity_ok(const char *path) {
  sqlite3 *db = raw_open(path);
  sqlite3_stmt *stmt;
  ck_assert_int_eq(
      sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt, NULL),
      SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  const char *verdict = (const char *)sqlite3_column_text(stmt, 0);
  ck_assert_msg(verdict != NULL && strcmp(verdict, "ok") == 0,
                "integrity_check: %s", verdict != NULL ? verdict : "(null)");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

/* -------------------------------------------------------- specs: basics */

START_TEST(test_put_get_round_trip) {
  topos_store *st = open_ok(g_path);
  /* Empty, tiny, one page, many overflow pages, and more than one
   * incremental-I/O chunk (4 MiB) with an odd tail. */
  const size_t sizes[] = {0, 1, 100, 5000, 300000, ((size_t)9 << 20) + 7};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint8_t *bytes = make_bytes(sizes[i], 100 + i);
    char id[65], want[65];
    put_spec_ok(st, bytes, sizes[i], id);
    expected_id(bytes, sizes[i], want);
    ck_assert_str_eq(id, want);
    assert_spec_is(st, id, bytes, sizes[i]);
    free(bytes);
  }
  /* NULL bytes with length 0 are the empty spec. */
  char id[65], want[65];
  put_spec_ok(st, NULL, 0, id);
  expected_id("", 0, want);
  ck_assert_str_eq(id, want);
  ck_assert_int_eq(stats_ok(st).spec_count, 6);
  store_close(st);
}
END_TEST

START_TEST(test_put_idempotent) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(2048, 7);
  char id1[65], id2[65], other[65];
  put_spec_ok(st, bytes, 2048, id1);
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  ck_assert_int_eq(store_list_specs(st, 0, 10, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 1);
  int64_t created = rows[0].created_ms;
  free(rows);
  usleep(20000);
  put_spec_ok(st, bytes, 2048, id2);
  ck_assert_str_eq(id1, id2);
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, 1);
  ck_assert_int_eq(s.spec_bytes, 2048);
  ck_assert_int_eq(store_list_specs(st, 0, 10, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(rows[0].created_ms, created); /* the first put's time */
  free(rows);
  /* One byte more is another spec. */
  bytes[2047] ^= 0x80;
  put_spec_ok(st, bytes, 2048, other);
  ck_assert_str_ne(other, id1);
  ck_assert_int_eq(stats_ok(st).spec_count, 2);
  free(bytes);
  store_close(st);
}
END_TEST

START_TEST(test_has_delete) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(500, 3);
  char id[65];
  put_spec_ok(st, bytes, 500, id);
  topos_error err = {0};
  bool present = false;
  ck_assert_int_eq(store_has_spec(st, id, &present, &err), TOPOS_OK);
  ck_assert(present);
  ck_assert_int_eq(store_delete_spec(st, id, &err), TOPOS_OK);
  ck_assert_int_eq(store_has_spec(st, id, &present, &err), TOPOS_OK);
  ck_assert(!present);
  uint8_t *got = (uint8_t *)1;
  size_t len = 99;
  ck_assert_int_eq(store_get_spec(st, id, &got, &len, &err),
                   TOPOS_ERR_NOT_FOUND);
  ck_assert_ptr_null(got);
  ck_assert_uint_eq(len, 0);
  ck_assert_ptr_nonnull(strstr(err.message, id));
  ck_assert_int_eq(store_delete_spec(st, id, &err), TOPOS_ERR_NOT_FOUND);
  ck_assert_int_eq(stats_ok(st).spec_count, 0);
  /* It can be put again after a delete. */
  put_spec_ok(st, bytes, 500, id);
  assert_spec_is(st, id, bytes, 500);
  free(bytes);
  store_close(st);
}
END_TEST

START_TEST(test_list_paging_newest_first) {
  topos_store *st = open_ok(g_path);
  char ids[25][65];
  int64_t before = (int64_t)time(NULL) * 1000 - 2000;
  for (int i = 0; i < 25; i++) {
    uint8_t *bytes = make_bytes(100 + (size_t)i, 1000 + (uint64_t)i);
    put_spec_ok(st, bytes, 100 + (size_t)i, ids[i]);
    free(bytes);
  }
  int64_t after = (int64_t)time(NULL) * 1000 + 2000;
  const int want_n[] = {10, 10, 5, 0};
  for (int page = 0; page < 4; page++) {
    store_spec_info *rows = (store_spec_info *)1;
    int n = -1;
    topos_error err = {0};
    ck_assert_int_eq(store_list_specs(st, page * 10, 10, &rows, &n, &err),
                     TOPOS_OK);
    ck_assert_int_eq(n, want_n[page]);
    if (n == 0) ck_assert_ptr_null(rows);
    for (int j = 0; j < n; j++) {
      int k = 24 - (page * 10 + j); /* newest first */
      ck_assert_str_eq(rows[j].id, ids[k]);
      ck_assert_int_eq(rows[j].size, 100 + k);
      ck_assert_int_ge(rows[j].created_ms, before);
      ck_assert_int_le(rows[j].created_ms, after);
    }
    free(rows);
  }
  /* An idempotent put does not move a spec to the front. */
  uint8_t *first = make_bytes(100, 1000);
  char id[65];
  put_spec_ok(st, first, 100, id);
  free(first);
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  ck_assert_int_eq(store_list_specs(st, 0, 1, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(rows[0].id, ids[24]);
  free(rows);
  /* Bad arguments. */
  ck_assert_int_eq(store_list_specs(st, -1, 10, &rows, &n, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_list_specs(st, 0, -1, &rows, &n, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_list_specs(st, 0, 0, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(store_list_specs(st, 0, 10, NULL, &n, &err),
                   TOPOS_ERR_ARGUMENT);
  store_close(st);
}
END_TEST

START_TEST(test_stats) {
  topos_store *st = open_ok(g_path);
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, 0);
  ck_assert_int_eq(s.blob_count, 0);
  ck_assert_int_eq(s.blob_cap, STORE_DEFAULT_BLOB_CAP);
  ck_assert_int_eq(s.blob_cap, (int64_t)1 << 30);
  ck_assert_int_eq(s.schema_version, STORE_SCHEMA_VERSION);
  ck_assert_int_gt(s.file_bytes, 0);
  int64_t empty_size = s.file_bytes;
  char id[65];
  for (int i = 1; i <= 3; i++) {
    uint8_t *bytes = make_bytes((size_t)i * 10000, (uint64_t)i);
    put_spec_ok(st, bytes, (size_t)i * 10000, id);
    free(bytes);
  }
  for (int i = 1; i <= 2; i++) {
    uint8_t *bytes = make_bytes((size_t)i * 7000, 50 + (uint64_t)i);
    put_blob_ok(st, bytes, (size_t)i * 7000, id);
    free(bytes);
  }
  topos_error err = {0};
  ck_assert_int_eq(store_set_blob_cap(st, 123456, &err), TOPOS_OK);
  s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, 3);
  ck_assert_int_eq(s.spec_bytes, 60000);
  ck_assert_int_eq(s.blob_count, 2);
  ck_assert_int_eq(s.blob_bytes, 21000);
  ck_assert_int_eq(s.blob_cap, 123456);
  ck_assert_int_gt(s.file_bytes, empty_size + 60000);
  ck_assert_int_eq(store_stats(st, NULL, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_stats(NULL, &s, &err), TOPOS_ERR_ARGUMENT);
  store_close(st);
}
END_TEST

/* ----------------------------------------------------------- corruption */

START_TEST(test_corrupt_spec_detected) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(3000, 11);
  char id[65];
  put_spec_ok(st, bytes, 3000, id);
  raw_flip_byte(g_path, "spec", id, 1234);

  topos_error err = {0};
  uint8_t *got = (uint8_t *)1;
  size_t len = 77;
  ck_assert_int_eq(store_get_spec(st, id, &got, &len, &err), TOPOS_ERR_CORRUPT);
  ck_assert_int_eq(err.code, TOPOS_ERR_CORRUPT);
  ck_assert_ptr_null(got);
  ck_assert_uint_eq(len, 0);
  ck_assert_ptr_nonnull(strstr(err.message, id));
  ck_assert_ptr_nonnull(strstr(err.message, "corrupt"));
  /* has does not read the bytes; the row is still there. */
  bool present = false;
  ck_assert_int_eq(store_has_spec(st, id, &present, &err), TOPOS_OK);
  ck_assert(present);
  /* A second handle sees the same corruption (nothing is cached). */
  topos_store *other = open_ok(g_path);
  ck_assert_int_eq(store_get_spec(other, id, &got, &len, &err),
                   TOPOS_ERR_CORRUPT);
  ck_assert_ptr_null(got);
  store_close(other);
  /* Putting the right bytes again heals the row. */
  char again[65];
  put_spec_ok(st, bytes, 3000, again);
  ck_assert_str_eq(again, id);
  assert_spec_is(st, id, bytes, 3000);
  ck_assert_int_eq(stats_ok(st).spec_count, 1);

  /* A truncated payload (its size no longer the recorded one). */
  raw_with_id(g_path,
              "UPDATE spec_bytes SET bytes = substr(bytes, 1, 100) "
              "WHERE seq = (SELECT seq FROM specs WHERE id = ?1)",
              id);
  ck_assert_int_eq(store_get_spec(st, id, &got, &len, &err), TOPOS_ERR_CORRUPT);
  ck_assert_ptr_null(got);
  ck_assert_ptr_nonnull(strstr(err.message, id));
  ck_assert_msg(strstr(err.message, "100 bytes stored, 3000 recorded") != NULL,
                "message: %s", err.message);
  /* Bytes gone altogether. */
  put_spec_ok(st, bytes, 3000, again);
  raw_with_id(g_path,
              "DELETE FROM spec_bytes "
              "WHERE seq = (SELECT seq FROM specs WHERE id = ?1)",
              id);
  ck_assert_int_eq(store_get_spec(st, id, &got, &len, &err), TOPOS_ERR_CORRUPT);
  ck_assert_ptr_null(got);
  ck_assert_msg(strstr(err.message, "missing") != NULL, "message: %s",
                err.message);
  put_spec_ok(st, bytes, 3000, again);
  assert_spec_is(st, id, bytes, 3000);
  /* Deleting a spec takes its bytes with it. */
  ck_assert_int_eq(store_delete_spec(st, id, &err), TOPOS_OK);
  sqlite3 *db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM spec_bytes"), 0);
  sqlite3_close(db);
  free(bytes);
  store_close(st);
}
END_TEST

START_TEST(test_corrupt_blob_detected) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(70000, 12);
  char id[65];
  put_blob_ok(st, bytes, 70000, id);
  raw_flip_byte(g_path, "blob", id, 69999);
  topos_error err = {0};
  uint8_t *got = (uint8_t *)1;
  size_t len = 5;
  ck_assert_int_eq(store_get_blob(st, id, &got, &len, &err), TOPOS_ERR_CORRUPT);
  ck_assert_ptr_null(got);
  ck_assert_uint_eq(len, 0);
  ck_assert_ptr_nonnull(strstr(err.message, id));
  char again[65];
  put_blob_ok(st, bytes, 70000, again);
  ck_assert_int_eq(store_get_blob(st, id, &got, &len, &err), TOPOS_OK);
  ck_assert_uint_eq(len, 70000);
  ck_assert(memcmp(got, bytes, len) == 0);
  ck_assert_int_eq(stats_ok(st).blob_count, 1);
  free(got);
  free(bytes);
  store_close(st);
}
END_TEST

/* -------------------------------------------------------------- bad ids */

START_TEST(test_bad_ids_refused) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(64, 5);
  char good[65];
  put_spec_ok(st, bytes, 64, good);
  put_blob_ok(st, bytes, 64, good);

  char upper[65], longer[66], shorter[64], quote[65], nul_inside[65];
  for (int i = 0; i < 64; i++) {
    upper[i] = (char)(good[i] >= 'a' ? good[i] - 'a' + 'A' : good[i]);
  }
  upper[64] = '\0';
  snprintf(longer, sizeof longer, "%s0", good);
  memcpy(shorter, good, 63);
  shorter[63] = '\0';
  memcpy(quote, good, 65);
  quote[10] = '\'';
  memcpy(nul_inside, good, 65);
  nul_inside[30] = '\0';
  upper[0] = 'A'; /* at least one uppercase letter, whatever the hash */
  const char *bad[] = {
      "",
      "abc",
      shorter,
      longer,
      upper,
      quote,
      nul_inside,
      "' OR '1'='1",
      "x'); DROP TABLE specs; --",
      "0000000000000000000000000000000000000000000000000000000000000000' OR "
      "1=1 --",
      "000000000000000000000000000000000000000000000000000000000000000g",
      "                                                                ",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    topos_error err = {0};
    uint8_t *got = (uint8_t *)1;
    size_t len = 1;
    bool present = true;
    int64_t size = 1;
    ck_assert_int_eq(store_get_spec(st, bad[i], &got, &len, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_ptr_null(got);
    ck_assert_ptr_nonnull(strstr(err.message, "id"));
    ck_assert_int_eq(store_has_spec(st, bad[i], &present, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert(!present);
    ck_assert_int_eq(store_delete_spec(st, bad[i], &err), TOPOS_ERR_ARGUMENT);
    ck_assert_int_eq(store_get_blob(st, bad[i], &got, &len, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_int_eq(store_stat_blob(st, bad[i], &size, &err),
                     TOPOS_ERR_ARGUMENT);
    ck_assert_int_eq(store_delete_blob(st, bad[i], &err), TOPOS_ERR_ARGUMENT);
  }
  topos_error err = {0};
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert_int_eq(store_get_spec(st, NULL, &got, &len, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_delete_blob(st, NULL, &err), TOPOS_ERR_ARGUMENT);
  /* Other NULL arguments. */
  char id[65];
  ck_assert_int_eq(store_put_spec(NULL, bytes, 64, id, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_put_spec(st, NULL, 64, id, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_put_spec(st, bytes, 64, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_get_spec(st, good, NULL, &len, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_has_spec(st, good, NULL, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_stat_blob(st, good, NULL, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_put_spec(st, bytes, 64, id, NULL), TOPOS_OK);
  ck_assert_int_eq(store_get_spec(st, "nope", &got, &len, NULL),
                   TOPOS_ERR_ARGUMENT);
  /* Nothing was dropped or deleted along the way. */
  assert_spec_is(st, good, bytes, 64);
  ck_assert(blob_present(st, good));
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, 1);
  ck_assert_int_eq(s.blob_count, 1);
  free(bytes);
  store_close(st);
}
END_TEST

/* ------------------------------------------------ files that are refused */

/* Asserts store_open refuses path with TOPOS_ERR_IO, a message holding
 * `needle`, and leaves the file byte-identical. */
static void assert_refused(const char *path, const char *needle) {
  size_t before_len, after_len;
  uint8_t *before = read_file(path, &before_len);
  topos_error err = {0};
  topos_store *st = store_open(path, &err);
  ck_assert_msg(st == NULL, "%s was opened", path);
  ck_assert_int_eq(err.code, TOPOS_ERR_IO);
  ck_assert_msg(strstr(err.message, needle) != NULL, "message: %s",
                err.message);
  ck_assert_msg(strstr(err.message, path) != NULL, "message: %s", err.message);
  uint8_t *after = read_file(path, &after_len);
  ck_assert_uint_eq(before_len, after_len);
  ck_assert(before_len == 0 || memcmp(before, after, before_len) == 0);
  free(before);
  free(after);
}

START_TEST(test_random_bytes_refused) {
  const char *path = in_dir("random.bin");
  uint8_t *junk = make_bytes(8192, 99);
  write_file(path, junk, 8192);
  assert_refused(path, "not an SQLite database");
  ck_assert(!file_exists(in_dir("random.bin-wal")));
  ck_assert(!file_exists(in_dir("random.bin-shm")));
  ck_assert(!file_exists(in_dir("random.bin-journal")));
  /* A short text file, and a file that only starts like SQLite. */
  const char *text = in_dir("notes.txt");
  write_file(text, "hello\n", 6);
  assert_refused(text, "not an SQLite database");
  memcpy(junk, "SQLite format 3", 16);
  write_file(path, junk, 8192);
  assert_refused(path, "not");
  free(junk);
  /* A directory is not a store file. */
  topos_error err = {0};
  ck_assert_ptr_null(store_open(g_dir, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_IO);
  ck_assert_ptr_null(store_open("", &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(store_open(NULL, &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_ptr_null(store_open(in_dir("no/such/dir/store.db"), &err));
  ck_assert_int_eq(err.code, TOPOS_ERR_IO);
}
END_TEST

START_TEST(test_foreign_sqlite_refused) {
  /* Another application's database in rollback-journal mode. */
  const char *path = in_dir("other.db");
  sqlite3 *db = raw_open(path);
  raw_exec(db,
           "CREATE TABLE users (name TEXT, email TEXT);"
           "INSERT INTO users VALUES ('ada', 'ada@example.org');");
  sqlite3_close(db);
  assert_refused(path, "not a topos store");
  ck_assert(!file_exists(in_dir("other.db-wal")));
  ck_assert(!file_exists(in_dir("other.db-journal")));

  /* One in WAL mode with its own application id and no tables. */
  const char *wal_path = in_dir("other-wal.db");
  db = raw_open(wal_path);
  raw_exec(db, "PRAGMA journal_mode = WAL; PRAGMA application_id = 305419896;");
  sqlite3_close(db);
  assert_refused(wal_path, "0x12345678");

  /* One that has a table called specs but no application id. */
  const char *lookalike = in_dir("lookalike.db");
  db = raw_open(lookalike);
  raw_exec(db, "CREATE TABLE specs (id TEXT, bytes BLOB);");
  sqlite3_close(db);
  assert_refused(lookalike, "not a topos store");
}
END_TEST

START_TEST(test_newer_schema_refused) {
  topos_store *st = open_ok(g_path);
  uint8_t *bytes = make_bytes(100, 1);
  char id[65];
  put_spec_ok(st, bytes, 100, id);
  store_close(st);
  sqlite3 *db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "PRAGMA application_id"), STORE_APPLICATION_ID);
  ck_assert_int_eq(raw_int(db, "SELECT max(version) FROM schema_version"),
                   STORE_SCHEMA_VERSION);
  char sql[128];
  snprintf(sql, sizeof sql,
           "INSERT INTO schema_version (version, applied_ms) VALUES (%d, 0)",
           STORE_SCHEMA_VERSION + 1);
  raw_exec(db, sql);
  sqlite3_close(db); /* the last connection checkpoints the WAL */
  ck_assert(!file_exists(in_dir("store.db-wal")));
  assert_refused(g_path, "newer");
  topos_error err = {0};
  ck_assert_ptr_null(store_open(g_path, &err));
  char want[32];
  snprintf(want, sizeof want, "version %d", STORE_SCHEMA_VERSION + 1);
  ck_assert_ptr_nonnull(strstr(err.message, want));

  /* A store that lost its bookkeeping is refused, not re-created. */
  db = raw_open(g_path);
  raw_exec(db, "DROP TABLE meta;");
  sqlite3_close(db);
  assert_refused(g_path, "damaged");
  free(bytes);
}
END_TEST

START_TEST(test_reopen_persists) {
  topos_store *st = open_ok(g_path);
  char specs[5][65], blobs[2][65];
  for (int i = 0; i < 5; i++) {
    uint8_t *bytes = make_bytes(1000 + (size_t)i * 3000, 200 + (uint64_t)i);
    put_spec_ok(st, bytes, 1000 + (size_t)i * 3000, specs[i]);
    free(bytes);
  }
  for (int i = 0; i < 2; i++) {
    uint8_t *bytes = make_bytes(50000, 300 + (uint64_t)i);
    put_blob_ok(st, bytes, 50000, blobs[i]);
    free(bytes);
  }
  store_stats_info before = stats_ok(st);
  store_close(st);

  st = open_ok(g_path);
  store_stats_info after = stats_ok(st);
  ck_assert_int_eq(after.spec_count, 5);
  ck_assert_int_eq(after.spec_bytes, before.spec_bytes);
  ck_assert_int_eq(after.blob_count, 2);
  ck_assert_int_eq(after.blob_bytes, 100000);
  ck_assert_int_eq(after.schema_version, STORE_SCHEMA_VERSION);
  for (int i = 0; i < 5; i++) {
    uint8_t *bytes = make_bytes(1000 + (size_t)i * 3000, 200 + (uint64_t)i);
    assert_spec_is(st, specs[i], bytes, 1000 + (size_t)i * 3000);
    free(bytes);
  }
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  ck_assert_int_eq(store_list_specs(st, 0, 100, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 5);
  for (int i = 0; i < 5; i++) ck_assert_str_eq(rows[i].id, specs[4 - i]);
  free(rows);
  for (int i = 0; i < 2; i++) {
    uint8_t *got = NULL;
    size_t len = 0;
    ck_assert_int_eq(store_get_blob(st, blobs[i], &got, &len, &err), TOPOS_OK);
    uint8_t *bytes = make_bytes(50000, 300 + (uint64_t)i);
    ck_assert_uint_eq(len, 50000);
    ck_assert(memcmp(got, bytes, len) == 0);
    free(bytes);
    free(got);
  }
  store_close(st);
  /* The file is a WAL-mode database carrying the topos application id. */
  sqlite3 *db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "PRAGMA application_id"), STORE_APPLICATION_ID);
  sqlite3_stmt *stmt;
  ck_assert_int_eq(
      sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, NULL),
      SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}
END_TEST

START_TEST(test_empty_files_adopted) {
  /* A zero-byte file and an SQLite database with no schema become stores. */
  const char *empty = in_dir("empty.db");
  write_file(empty, "", 0);
  topos_store *st = open_ok(empty);
  ck_assert_int_eq(stats_ok(st).schema_version, STORE_SCHEMA_VERSION);
  store_close(st);
  const char *bare = in_dir("bare.db");
  sqlite3 *db = raw_open(bare);
  raw_exec(db, "PRAGMA user_version = 7;");
  sqlite3_close(db);
  st = open_ok(bare);
  ck_assert_int_eq(stats_ok(st).schema_version, STORE_SCHEMA_VERSION);
  store_close(st);
  /* Opening an existing store again migrates nothing and adds no row. */
  st = open_ok(bare);
  store_close(st);
  db = raw_open(bare);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM schema_version"),
                   STORE_SCHEMA_VERSION);
  sqlite3_close(db);
}
END_TEST

/* ---------------------------------------------------------------- blobs */

START_TEST(test_blob_lru_eviction) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  ck_assert_int_eq(store_set_blob_cap(st, 1000, &err), TOPOS_OK);
  uint8_t *a = make_bytes(400, 1), *b = make_bytes(400, 2),
          *c = make_bytes(400, 3), *d = make_bytes(300, 4),
          *e = make_bytes(600, 5), *f = make_bytes(1001, 6),
          *g = make_bytes(1000, 7);
  char ia[65], ib[65], ic[65], id[65], ie[65], ifd[65], ig[65];
  put_blob_ok(st, a, 400, ia);
  put_blob_ok(st, b, 400, ib);
  /* Reading a makes b the least recently used. */
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert_int_eq(store_get_blob(st, ia, &got, &len, &err), TOPOS_OK);
  ck_assert_uint_eq(len, 400);
  ck_assert(memcmp(got, a, 400) == 0);
  free(got);
  put_blob_ok(st, c, 400, ic);
  ck_assert(blob_present(st, ia));
  ck_assert(!blob_present(st, ib));
  ck_assert(blob_present(st, ic));
  ck_assert_int_eq(store_get_blob(st, ib, &got, &len, &err),
                   TOPOS_ERR_NOT_FOUND);
  /* stat does not count as a use: a is now the oldest use. */
  put_blob_ok(st, d, 300, id);
  ck_assert(!blob_present(st, ia));
  ck_assert(blob_present(st, ic));
  ck_assert(blob_present(st, id));
  /* Putting c again marks it used, so d goes next. */
  put_blob_ok(st, c, 400, ic);
  put_blob_ok(st, e, 600, ie);
  ck_assert(!blob_present(st, id));
  ck_assert(blob_present(st, ic));
  ck_assert(blob_present(st, ie));
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.blob_count, 2);
  ck_assert_int_eq(s.blob_bytes, 1000);
  /* Larger than the cap: refused, nothing evicted. */
  ck_assert_int_eq(store_put_blob(st, f, 1001, ifd, &err), TOPOS_ERR_MEMORY);
  ck_assert_ptr_nonnull(strstr(err.message, "cap"));
  ck_assert(blob_present(st, ic));
  ck_assert(blob_present(st, ie));
  /* Exactly the cap: everything else goes. */
  put_blob_ok(st, g, 1000, ig);
  s = stats_ok(st);
  ck_assert_int_eq(s.blob_count, 1);
  ck_assert_int_eq(s.blob_bytes, 1000);
  ck_assert(blob_present(st, ig));
  /* Eviction never touches specs. */
  char spec[65];
  put_spec_ok(st, f, 1001, spec);
  put_blob_ok(st, a, 400, ia);
  assert_spec_is(st, spec, f, 1001);
  int64_t size = 0;
  ck_assert_int_eq(store_stat_blob(st, ia, &size, &err), TOPOS_OK);
  ck_assert_int_eq(size, 400);
  ck_assert_int_eq(store_delete_blob(st, ia, &err), TOPOS_OK);
  ck_assert_int_eq(store_delete_blob(st, ia, &err), TOPOS_ERR_NOT_FOUND);
  ck_assert_int_eq(store_stat_blob(st, ia, &size, &err), TOPOS_ERR_NOT_FOUND);
  /* Evicted and deleted blobs took their bytes with them. */
  sqlite3 *db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM blob_bytes"),
                   stats_ok(st).blob_count);
  sqlite3_close(db);
  free(a), free(b), free(c), free(d), free(e), free(f), free(g);
  store_close(st);
}
END_TEST

START_TEST(test_blob_cap_lowered) {
  topos_store *st = open_ok(g_path);
  char ids[3][65];
  for (int i = 0; i < 3; i++) {
    uint8_t *bytes = make_bytes(300, 40 + (uint64_t)i);
    put_blob_ok(st, bytes, 300, ids[i]);
    free(bytes);
  }
  topos_error err = {0};
  ck_assert_int_eq(store_set_blob_cap(st, 700, &err), TOPOS_OK);
  ck_assert(!blob_present(st, ids[0]));
  ck_assert(blob_present(st, ids[1]));
  ck_assert(blob_present(st, ids[2]));
  ck_assert_int_eq(stats_ok(st).blob_cap, 700);
  ck_assert_int_eq(store_set_blob_cap(st, 0, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_set_blob_cap(st, -5, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_set_blob_cap(NULL, 5, &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(stats_ok(st).blob_cap, 700);
  /* The cap belongs to the handle, not the file. */
  topos_store *other = open_ok(g_path);
  ck_assert_int_eq(stats_ok(other).blob_cap, STORE_DEFAULT_BLOB_CAP);
  ck_assert_int_eq(stats_ok(other).blob_count, 2);
  store_close(other);
  store_close(st);
}
END_TEST

/* Set TOPOS_STORE_BIG=1 to store and read back a 600 MiB blob (needs about
 * 2 GiB of memory; off by default to keep the suite fast). */
START_TEST(test_big_blob) {
  if (getenv("TOPOS_STORE_BIG") == NULL) return;
  size_t n = (size_t)600 << 20;
  uint8_t *bytes = malloc(n);
  ck_assert_ptr_nonnull(bytes);
  for (size_t i = 0; i < n; i += 4096) fill(bytes + i, 4096, i);
  topos_store *st = open_ok(g_path);
  char id[65], want[65];
  put_blob_ok(st, bytes, n, id);
  expected_id(bytes, n, want);
  ck_assert_str_eq(id, want);
  topos_error err = {0};
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert_int_eq(store_get_blob(st, id, &got, &len, &err), TOPOS_OK);
  ck_assert_uint_eq(len, n);
  ck_assert(memcmp(got, bytes, n) == 0);
  /* One copy in memory on the way in and one on the way out: marking
   * the blob used must not read or rewrite it. */
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  ck_assert_int_lt((int64_t)usage.ru_maxrss * 1024,
                   2 * (int64_t)n + ((int64_t)400 << 20));
  free(got);
  /* More than SQLite's largest value is refused before a byte is read
   * (the buffer is never touched, so it costs no memory). */
  free(bytes);
  size_t huge = 1000000000;
  bytes = malloc(huge);
  ck_assert_ptr_nonnull(bytes);
  ck_assert_int_eq(store_put_blob(st, bytes, huge, id, &err), TOPOS_ERR_MEMORY);
  ck_assert_ptr_nonnull(strstr(err.message, "largest value"));
  store_close(st);
  free(bytes);
}
END_TEST

/* ---------------------------------------------------------- concurrency */

enum { THREADS = 4, PUTS = 200, STRIDE = 150 };

/* Spec k of the concurrency tests: threads t puts k in
 * [t*STRIDE, t*STRIDE + PUTS), so neighbours share PUTS - STRIDE ids. */
static size_t spec_size(int k) {
  return 64 + (size_t)(k * 37 % 3000);
}

typedef struct worker {
  pthread_t thread;
  int index;
  topos_store *shared; /* NULL: open a handle of its own */
  pthread_barrier_t *start;
  int failures;
  char message[600];
} worker;

static void worker_fail(worker *w, const char *what, const topos_error *err) {
  if (w->failures++ == 0) {
    snprintf(w->message, sizeof w->message, "thread %d: %s: %s", w->index, what,
             err != NULL ? err->message : "");
  }
}

static void *worker_run(void *arg) {
  worker *w = arg;
  topos_error err = {0};
  pthread_barrier_wait(w->start);
  topos_store *st = w->shared;
  if (st == NULL) {
    st = store_open(g_path, &err); /* every thread opens the fresh file */
    if (st == NULL) {
      worker_fail(w, "open", &err);
      return NULL;
    }
  }
  uint8_t *buf = malloc(4096);
  for (int i = 0; i < PUTS; i++) {
    int k = w->index * STRIDE + i;
    size_t n = spec_size(k);
    fill(buf, n, (uint64_t)k);
    char id[65], want[65];
    if (store_put_spec(st, buf, n, id, &err) != TOPOS_OK) {
      worker_fail(w, "put", &err);
      continue;
    }
    topos_sha256_hex(buf, n, want);
    if (strcmp(id, want) != 0) worker_fail(w, "wrong id", NULL);
    /* Mix reads in with the writes. */
    if (i % 10 == 0) {
      uint8_t *got = NULL;
      size_t len = 0;
      if (store_get_spec(st, id, &got, &len, &err) != TOPOS_OK) {
        worker_fail(w, "get", &err);
      } else if (len != n || memcmp(got, buf, n) != 0) {
        worker_fail(w, "get returned other bytes", NULL);
      }
      free(got);
      store_spec_info *rows = NULL;
      int count = 0;
      if (store_list_specs(st, 0, 5, &rows, &count, &err) != TOPOS_OK) {
        worker_fail(w, "list", &err);
      }
      free(rows);
    }
    if (i % 25 == 0) {
      char blob_id[65];
      if (store_put_blob(st, buf, n, blob_id, &err) != TOPOS_OK) {
        worker_fail(w, "put blob", &err);
      }
    }
  }
  free(buf);
  if (w->shared == NULL) store_close(st);
  return NULL;
}

static void run_workers(topos_store *shared) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  worker workers[THREADS];
  for (int t = 0; t < THREADS; t++) {
    workers[t] = (worker){.index = t, .shared = shared, .start = &start};
    ck_assert_int_eq(
        pthread_create(&workers[t].thread, NULL, worker_run, &workers[t]), 0);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(workers[t].thread, NULL);
  pthread_barrier_destroy(&start);
  for (int t = 0; t < THREADS; t++) {
    ck_assert_msg(workers[t].failures == 0, "%d failures; first: %s",
                  workers[t].failures, workers[t].message);
  }
}

static void verify_all_specs(void) {
  topos_store *st = open_ok(g_path);
  int distinct = (THREADS - 1) * STRIDE + PUTS;
  uint8_t *buf = malloc(4096);
  for (int k = 0; k < distinct; k++) {
    size_t n = spec_size(k);
    fill(buf, n, (uint64_t)k);
    char id[65];
    expected_id(buf, n, id);
    assert_spec_is(st, id, buf, n);
  }
  free(buf);
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, distinct);
  store_close(st);
  assert_integrity_ok(g_path);
}

START_TEST(test_concurrent_handles) {
  /* The file does not exist yet: four handles race to create it. */
  run_workers(NULL);
  verify_all_specs();
}
END_TEST

START_TEST(test_shared_handle) {
  topos_store *st = open_ok(g_path);
  run_workers(st);
  store_close(st);
  verify_all_specs();
}
END_TEST

/* ---------------------------------------------------------------- crash */

enum { CRASH_ROUNDS = 30, ID_RECORD = 65 };

/* The child: puts specs (and evicting blobs) until it is killed, writing
 * each spec's id to the pipe only after store_put_spec returned.  Any
 * failure exits with a code the parent reports. */
static void crash_child(int fd, uint64_t seed) {
  topos_error err = {0};
  topos_store *st = store_open(g_path, &err);
  if (st == NULL) _exit(3);
  if (store_set_blob_cap(st, 600000, &err) != TOPOS_OK) _exit(4);
  size_t max = 300000;
  uint8_t *buf = malloc(max);
  if (buf == NULL) _exit(5);
  uint64_t state = seed | 1;
  for (uint64_t i = 0; i < 1000000; i++) {
    /* Mostly small specs, some spanning many overflow pages. */
    size_t n = next_random(&state) % 4 == 0
                   ? 20000 + next_random(&state) % 280000
                   : 50 + next_random(&state) % 4000;
    fill(buf, n, seed * 1000003 + i);
    char id[65];
    if (i % 4 == 3) {
      if (store_put_blob(st, buf, n, id, &err) != TOPOS_OK) _exit(6);
      continue;
    }
    if (store_put_spec(st, buf, n, id, &err) != TOPOS_OK) _exit(7);
    char record[ID_RECORD];
    memcpy(record, id, 64);
    record[64] = '\n';
    if (write(fd, record, ID_RECORD) != ID_RECORD) _exit(8);
  }
  _exit(0);
}

typedef struct id_log {
  char (*ids)[65];
  size_t count, capacity;
  char partial[ID_RECORD];
  size_t partial_len;
} id_log;

/* Appends whole records from a read of the pipe (records are written
 * atomically, PIPE_BUF > 65, but reads may split them). */
static void log_bytes(id_log *log, const char *data, size_t n) {
  for (size_t i = 0; i < n; i++) {
    log->partial[log->partial_len++] = data[i];
    if (log->partial_len < ID_RECORD) continue;
    ck_assert_msg(log->partial[64] == '\n', "garbled id record");
    if (log->count == log->capacity) {
      log->capacity = log->capacity ? log->capacity * 2 : 256;
      log->ids = realloc(log->ids, log->capacity * sizeof *log->ids);
      ck_assert_ptr_nonnull(log->ids);
    }
    memcpy(log->ids[log->count], log->partial, 64);
    log->ids[log->count][64] = '\0';
    log->count++;
    log->partial_len = 0;
  }
}

/* Reads what is available within timeout_ms; false at end of file. */
static bool log_read(id_log *log, int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int ready = poll(&p, 1, timeout_ms);
  if (ready <= 0) return true;
  char data[4096];
  ssize_t got = read(fd, data, sizeof data);
  if (got < 0 && errno == EINTR) return true;
  ck_assert_int_ge(got, 0);
  if (got == 0) return false;
  log_bytes(log, data, (size_t)got);
  return true;
}

static void verify_ids(topos_store *st, const id_log *log, size_t from,
                       uint64_t seed) {
  for (size_t i = from; i < log->count; i++) {
    topos_error err = {0};
    uint8_t *got = NULL;
    size_t len = 0;
    int rc = store_get_spec(st, log->ids[i], &got, &len, &err);
    ck_assert_msg(rc == TOPOS_OK, "seed %llu: committed spec %s lost: %s",
                  (unsigned long long)seed, log->ids[i], err.message);
    char actual[65];
    expected_id(got, len, actual);
    ck_assert_str_eq(actual, log->ids[i]);
    free(got);
  }
}

/* Every spec in the store verifies, reported or not: a put the kill
 * interrupted is either absent or whole. */
static void verify_every_spec(topos_store *st, uint64_t seed) {
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  ck_assert_int_eq(store_list_specs(st, 0, INT_MAX, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, stats_ok(st).spec_count);
  for (int i = 0; i < n; i++) {
    uint8_t *got = NULL;
    size_t len = 0;
    int rc = store_get_spec(st, rows[i].id, &got, &len, &err);
    ck_assert_msg(rc == TOPOS_OK, "seed %llu: spec %s: %s",
                  (unsigned long long)seed, rows[i].id, err.message);
    ck_assert_int_eq((int64_t)len, rows[i].size);
    free(got);
  }
  free(rows);
}

/* Every blob left verifies and they fit under the child's cap. */
static void verify_blobs(topos_store *st) {
  sqlite3 *db = raw_open(g_path);
  sqlite3_stmt *stmt;
  ck_assert_int_eq(
      sqlite3_prepare_v2(db, "SELECT id FROM blobs", -1, &stmt, NULL),
      SQLITE_OK);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const char *id = (const char *)sqlite3_column_text(stmt, 0);
    topos_error err = {0};
    uint8_t *got = NULL;
    size_t len = 0;
    ck_assert_msg(store_get_blob(st, id, &got, &len, &err) == TOPOS_OK,
                  "blob %s: %s", id, err.message);
    free(got);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  ck_assert_int_le(stats_ok(st).blob_bytes, 600000);
}

START_TEST(test_crash_sigkill) {
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  uint64_t state = seed | 1;
  id_log log = {0};
  for (int round = 0; round < CRASH_ROUNDS; round++) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      /* Should this test die first, the child must not write on. */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      crash_child(fds[1], seed + (uint64_t)round);
    }
    close(fds[1]);
    size_t first = log.count;
    /* Wait for a few commits, then kill it a random moment later (mid-put
     * most of the time: a put takes about a millisecond). */
    size_t threshold = 1 + next_random(&state) % 12;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool open_pipe = true;
    while (open_pipe && log.count - first < threshold) {
      open_pipe = log_read(&log, fds[0], 100);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      ck_assert_msg(t1.tv_sec - t0.tv_sec < 30,
                    "seed %llu: the child committed nothing in 30 s",
                    (unsigned long long)seed);
    }
    usleep((useconds_t)(next_random(&state) % 15000));
    kill(pid, SIGKILL);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "seed %llu: the child failed on its own (exit %d)",
                  (unsigned long long)seed,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    while (log_read(&log, fds[0], 1000)) {
    }
    close(fds[0]);
    ck_assert_uint_ge(log.count - first, threshold);

    topos_store *st = open_ok(g_path);
    verify_ids(st, &log, first, seed);
    verify_every_spec(st, seed);
    verify_blobs(st);
    store_close(st);
  }
  /* At the end, every id of every round, and a sound file. */
  topos_store *st = open_ok(g_path);
  verify_ids(st, &log, 0, seed);
  ck_assert_int_ge(stats_ok(st).spec_count, (int64_t)log.count);
  store_close(st);
  assert_integrity_ok(g_path);
  free(log.ids);
}
END_TEST

/* ------------------------------------------------ retention and budgets */

/* Whether a spec is there, without reading it. */
static bool spec_present(topos_store *st, const char *id) {
  topos_error err = {0};
  bool present = false;
  ck_assert_msg(store_has_spec(st, id, &present, &err) == TOPOS_OK,
                "has_spec: %s", err.message);
  return present;
}

/* Puts a distinct spec of n bytes, then waits a little so the next use
 * gets a later millisecond (last use is wall-clock ms). */
static void put_spec_seed(topos_store *st, size_t n, uint64_t seed,
                          char id[65]) {
  uint8_t *bytes = make_bytes(n, seed);
  put_spec_ok(st, bytes, n, id);
  free(bytes);
  usleep(3000);
}

/* The in-use callback of the tests: the ids in a list are in use, and
 * every question is counted. */
typedef struct in_use_list {
  const char *ids[8];
  int n;
  int asked;
} in_use_list;

static bool list_in_use(void *ctx, const char *id) {
  in_use_list *l = ctx;
  l->asked++;
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->ids[i], id) == 0) return true;
  return false;
}

START_TEST(test_retention_lru_order) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  ck_assert_int_eq(store_set_spec_budget(st, 3500, NULL, NULL, &err), TOPOS_OK);
  char a[65], b[65], c[65], d[65], e[65];
  put_spec_seed(st, 1000, 1, a);
  put_spec_seed(st, 1000, 2, b);
  put_spec_seed(st, 1000, 3, c);
  /* A is used after C was put, so B is now the least recently used. */
  ck_assert_int_eq(store_touch_spec(st, a, &err), TOPOS_OK);
  usleep(3000);
  put_spec_seed(st, 1000, 4, d);
  ck_assert(!spec_present(st, b));
  ck_assert(spec_present(st, a));
  ck_assert(spec_present(st, c));
  ck_assert(spec_present(st, d));
  /* Putting a stored spec again is a use too: C outlives A now. */
  put_spec_seed(st, 1000, 3, c);
  put_spec_seed(st, 1000, 5, e);
  ck_assert(!spec_present(st, a));
  ck_assert(spec_present(st, c));
  ck_assert(spec_present(st, d));
  ck_assert(spec_present(st, e));
  store_stats_info s = stats_ok(st);
  ck_assert_int_eq(s.spec_count, 3);
  ck_assert_int_le(s.spec_bytes, 3500);
  ck_assert_int_eq(s.spec_budget, 3500);
  /* The list carries last use: E newest, then C (put again), then D. */
  store_spec_info *rows = NULL;
  int n = 0;
  ck_assert_int_eq(store_list_specs(st, 0, 10, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 3);
  int64_t used_c = 0, used_d = 0, used_e = 0;
  for (int i = 0; i < n; i++) {
    ck_assert_int_ge(rows[i].last_used_ms, rows[i].created_ms);
    if (strcmp(rows[i].id, c) == 0) used_c = rows[i].last_used_ms;
    if (strcmp(rows[i].id, d) == 0) used_d = rows[i].last_used_ms;
    if (strcmp(rows[i].id, e) == 0) used_e = rows[i].last_used_ms;
  }
  ck_assert_int_gt(used_c, used_d);
  ck_assert_int_gt(used_e, used_c);
  free(rows);
  /* Touching an unknown id is fine; a malformed one is refused. */
  ck_assert_int_eq(store_touch_spec(st, b, &err), TOPOS_OK);
  ck_assert_int_eq(store_touch_spec(st, "nope", &err), TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_set_spec_budget(st, -1, NULL, NULL, &err),
                   TOPOS_ERR_ARGUMENT);
  store_close(st);
}
END_TEST

START_TEST(test_retention_never_in_use) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  char a[65], b[65], c[65], d[65], e[65];
  in_use_list used = {0};
  ck_assert_int_eq(store_set_spec_budget(st, 2500, list_in_use, &used, &err),
                   TOPOS_OK);
  put_spec_seed(st, 1000, 1, a);
  put_spec_seed(st, 1000, 2, b);
  used.ids[used.n++] = a; /* the oldest, but in use */
  put_spec_seed(st, 1000, 3, c);
  ck_assert(spec_present(st, a));
  ck_assert(!spec_present(st, b));
  ck_assert(spec_present(st, c));
  ck_assert_int_ge(used.asked, 2); /* A was asked about, then B */
  /* With A and C both in use, a new spec cannot fit: refused, and nothing
   * is dropped or stored. */
  used.ids[used.n++] = c;
  uint8_t *bytes = make_bytes(1000, 4);
  int rc = store_put_spec(st, bytes, 1000, d, &err);
  free(bytes);
  ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
  ck_assert_msg(strstr(err.message, "spec budget full") != NULL &&
                    strstr(err.message, "in use") != NULL,
                "%s", err.message);
  ck_assert(spec_present(st, a));
  ck_assert(spec_present(st, c));
  ck_assert_int_eq(stats_ok(st).spec_count, 2);
  /* Once C is free again, the new spec takes its place. */
  used.n = 1;
  put_spec_seed(st, 1000, 4, d);
  ck_assert(spec_present(st, a));
  ck_assert(!spec_present(st, c));
  ck_assert(spec_present(st, d));
  /* A spec larger than the whole budget is refused before anything. */
  bytes = make_bytes(3000, 9);
  used.asked = 0;
  rc = store_put_spec(st, bytes, 3000, e, &err);
  free(bytes);
  ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
  ck_assert_msg(
      strstr(err.message, "larger than the spec budget of 2500") != NULL, "%s",
      err.message);
  ck_assert_int_eq(used.asked, 0);
  ck_assert_int_eq(stats_ok(st).spec_count, 2);
  store_close(st);
}
END_TEST

START_TEST(test_retention_budget_lowered) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  char ids[6][65];
  for (int i = 0; i < 6; i++) put_spec_seed(st, 1000, 10 + (uint64_t)i, ids[i]);
  ck_assert_int_eq(stats_ok(st).spec_count, 6); /* no budget: all kept */
  in_use_list used = {.ids = {ids[0]}, .n = 1};
  ck_assert_int_eq(store_set_spec_budget(st, 3000, list_in_use, &used, &err),
                   TOPOS_OK);
  /* The oldest unused go (1, 2, 3; 0 is in use) until 3000 bytes stay. */
  ck_assert(spec_present(st, ids[0]));
  ck_assert(!spec_present(st, ids[1]));
  ck_assert(!spec_present(st, ids[2]));
  ck_assert(!spec_present(st, ids[3]));
  ck_assert(spec_present(st, ids[4]));
  ck_assert(spec_present(st, ids[5]));
  ck_assert_int_le(stats_ok(st).spec_bytes, 3000);
  store_close(st);
}
END_TEST

START_TEST(test_touches_written) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  char a[65], b[65];
  put_spec_seed(st, 500, 1, a);
  put_spec_seed(st, 500, 2, b);
  sqlite3 *db = raw_open(g_path);
  char sql[200];
  snprintf(sql, sizeof sql, "SELECT last_used_ms FROM specs WHERE id = '%s'",
           a);
  int64_t before = raw_int(db, sql);
  /* A touch waits in memory ... */
  ck_assert_int_eq(store_touch_spec(st, a, &err), TOPOS_OK);
  ck_assert_int_eq(raw_int(db, sql), before);
  /* ... until a flush (or the next put, or close). */
  ck_assert_int_eq(store_flush_touches(st, &err), TOPOS_OK);
  int64_t after = raw_int(db, sql);
  ck_assert_int_gt(after, before);
  /* A full batch is written on its own: 1024 distinct ids. */
  usleep(3000);
  ck_assert_int_eq(store_touch_spec(st, a, &err), TOPOS_OK);
  for (int i = 0; i < 1100; i++) {
    char id[65];
    snprintf(id, sizeof id, "%064x", (unsigned)i + 1);
    ck_assert_int_eq(store_touch_spec(st, id, &err), TOPOS_OK);
  }
  ck_assert_int_gt(raw_int(db, sql), after);
  /* And close writes what waits. */
  after = raw_int(db, sql);
  usleep(3000);
  ck_assert_int_eq(store_touch_spec(st, a, &err), TOPOS_OK);
  store_close(st);
  ck_assert_int_gt(raw_int(db, sql), after);
  sqlite3_close(db);
}
END_TEST

/* The schema a version 1 store had, verbatim. */
static const char V1_SCHEMA[] =
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) "
    "WITHOUT ROWID;"
    "INSERT INTO meta (key, value) VALUES ('magic', 'topos-store');"
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY NOT NULL,"
    "  applied_ms INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES (1, 1000);"
    "CREATE TABLE specs (seq INTEGER PRIMARY KEY,"
    "  id TEXT NOT NULL UNIQUE CHECK (length(id) = 64),"
    "  size INTEGER NOT NULL CHECK (size >= 0),"
    "  created_ms INTEGER NOT NULL);"
    "CREATE TABLE spec_bytes (seq INTEGER PRIMARY KEY, bytes BLOB NOT NULL);"
    "CREATE TRIGGER specs_drop_bytes AFTER DELETE ON specs BEGIN"
    "  DELETE FROM spec_bytes WHERE seq = old.seq; END;"
    "CREATE TABLE blobs (seq INTEGER PRIMARY KEY,"
    "  id TEXT NOT NULL UNIQUE CHECK (length(id) = 64),"
    "  size INTEGER NOT NULL CHECK (size >= 0),"
    "  created_ms INTEGER NOT NULL, last_used INTEGER NOT NULL);"
    "CREATE TABLE blob_bytes (seq INTEGER PRIMARY KEY, bytes BLOB NOT NULL);"
    "CREATE TRIGGER blobs_drop_bytes AFTER DELETE ON blobs BEGIN"
    "  DELETE FROM blob_bytes WHERE seq = old.seq; END;"
    "CREATE INDEX blobs_by_last_use ON blobs (last_used);"
    "PRAGMA application_id = 1416589423;";

START_TEST(test_migrate_v1) {
  /* A version 1 store with three specs, created at t = 3000, 1000, 2000. */
  sqlite3 *db = raw_open(g_path);
  raw_exec(db, V1_SCHEMA);
  char ids[3][65];
  int64_t created[3] = {3000, 1000, 2000};
  for (int i = 0; i < 3; i++) {
    uint8_t *bytes = make_bytes(1000, 70 + (uint64_t)i);
    expected_id(bytes, 1000, ids[i]);
    sqlite3_stmt *stmt;
    ck_assert_int_eq(
        sqlite3_prepare_v2(db,
                           "INSERT INTO specs (id, size, created_ms) "
                           "VALUES (?1, 1000, ?2)",
                           -1, &stmt, NULL),
        SQLITE_OK);
    sqlite3_bind_text(stmt, 1, ids[i], 64, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, created[i]);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    ck_assert_int_eq(sqlite3_prepare_v2(db,
                                        "INSERT INTO spec_bytes (seq, bytes) "
                                        "VALUES (last_insert_rowid(), ?1)",
                                        -1, &stmt, NULL),
                     SQLITE_OK);
    sqlite3_bind_blob(stmt, 1, bytes, 1000, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    free(bytes);
  }
  sqlite3_close(db);

  topos_store *st = open_ok(g_path);
  /* Every step in one go: version 2 (last use), version 3 (tenants). */
  ck_assert_int_eq(stats_ok(st).schema_version, STORE_SCHEMA_VERSION);
  ck_assert_int_eq(stats_ok(st).spec_count, 3);
  int64_t tenants = -1;
  ck_assert_int_eq(store_tenant_count(st, &tenants, NULL), TOPOS_OK);
  ck_assert_int_eq(tenants, 0);
  /* Existing specs were last used when they were created. */
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  ck_assert_int_eq(store_list_specs(st, 0, 10, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 3);
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(rows[i].last_used_ms, rows[i].created_ms);
  free(rows);
  /* Retention runs in that order: the one created at 1000 goes first. */
  ck_assert_int_eq(store_set_spec_budget(st, 2000, NULL, NULL, &err), TOPOS_OK);
  ck_assert(spec_present(st, ids[0]));
  ck_assert(!spec_present(st, ids[1]));
  ck_assert(spec_present(st, ids[2]));
  uint8_t *bytes = make_bytes(1000, 70);
  assert_spec_is(st, ids[0], bytes, 1000);
  free(bytes);
  store_close(st);
  db = raw_open(g_path);
  /* One row per step: 1 (hand-made), 2, 3. */
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM schema_version"),
                   STORE_SCHEMA_VERSION);
  ck_assert_int_eq(raw_int(db,
                           "SELECT count(*) FROM sqlite_master WHERE name = "
                           "'specs_by_last_use'"),
                   1);
  ck_assert_int_eq(raw_int(db,
                           "SELECT count(*) FROM sqlite_master WHERE name IN "
                           "('tenants', 'tokens', 'tokens_by_tenant')"),
                   3);
  sqlite3_close(db);
}
END_TEST

START_TEST(test_store_budget_full) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  char id[65], first[65];
  put_spec_seed(st, 20000, 1, first);
  int64_t file = stats_ok(st).file_bytes;
  /* 66 KiB more than the file has now: not a whole number of pages, so
   * at the end there is room by the count but no page to put it in. */
  int64_t budget = file + 65536 + 2048;
  ck_assert_int_eq(store_set_store_budget(st, budget, &err), TOPOS_OK);
  ck_assert_int_eq(stats_ok(st).store_budget, budget);
  /* A spec larger than what is left: refused before anything is written. */
  uint8_t *big = make_bytes(100000, 2);
  char big_id[65];
  int rc = store_put_spec(st, big, 100000, big_id, &err);
  ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
  ck_assert_msg(strstr(err.message, "store full") != NULL &&
                    strstr(err.message, "budget") != NULL &&
                    strstr(err.message, "100000 bytes") != NULL,
                "%s", err.message);
  rc = store_put_blob(st, big, 100000, big_id, &err);
  ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
  ck_assert_msg(strstr(err.message, "store full") != NULL &&
                    strstr(err.message, "blob") != NULL,
                "%s", err.message);
  ck_assert_int_eq(stats_ok(st).spec_count, 1);
  ck_assert_int_eq(stats_ok(st).blob_count, 0);
  /* Small specs fill it up to the budget; past it each put is refused the
   * same way, whether the check or SQLite's page limit catches it. */
  int stored = 0, refused = 0;
  for (int i = 0; i < 200 && refused < 5; i++) {
    uint8_t *bytes = make_bytes(3000, 100 + (uint64_t)i);
    rc = store_put_spec(st, bytes, 3000, id, &err);
    free(bytes);
    if (rc == TOPOS_OK) {
      ck_assert_int_eq(refused, 0);
      stored++;
    } else {
      ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
      ck_assert_msg(strstr(err.message, "store full") != NULL, "%s",
                    err.message);
      refused++;
    }
  }
  ck_assert_int_gt(stored, 5);
  ck_assert_int_eq(refused, 5);
  /* Tiny specs fit by the count until the last page is full; then SQLite's
   * page limit refuses them, with the same message. */
  refused = 0;
  for (int i = 0; i < 2000 && refused == 0; i++) {
    uint8_t *bytes = make_bytes(100, 1000 + (uint64_t)i);
    rc = store_put_spec(st, bytes, 100, id, &err);
    free(bytes);
    if (rc == TOPOS_OK) {
      stored++;
      continue;
    }
    ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
    ck_assert_msg(strstr(err.message, "store full") != NULL &&
                      strstr(err.message, "a spec of 100 bytes") != NULL,
                  "%s", err.message);
    refused++;
  }
  ck_assert_int_eq(refused, 1);
  ck_assert_int_le(stats_ok(st).file_bytes, budget);
  ck_assert_int_eq(stats_ok(st).spec_count, 1 + stored);
  /* Reads keep working; another handle on the file (as the daemon's blob
   * writer has) enforces the same budget. */
  store_spec_info *rows = NULL;
  int n = 0;
  ck_assert_int_eq(store_list_specs(st, 0, 1, &rows, &n, &err), TOPOS_OK);
  ck_assert_int_eq(n, 1);
  uint8_t *got = NULL;
  size_t len = 0;
  ck_assert_int_eq(store_get_spec(st, rows[0].id, &got, &len, &err), TOPOS_OK);
  free(got);
  topos_store *other = open_ok(g_path);
  uint8_t *bytes = make_bytes(3000, 999);
  rc = store_put_blob(other, bytes, 3000, id, &err);
  ck_assert_int_eq(rc, TOPOS_ERR_MEMORY);
  ck_assert_msg(strstr(err.message, "store full") != NULL, "%s", err.message);
  /* Deleting frees pages that puts reuse. */
  ck_assert_int_eq(store_delete_spec(st, first, &err), TOPOS_OK);
  put_blob_ok(other, bytes, 3000, id);
  free(bytes);
  free(rows);
  store_close(other);
  /* Raising the budget lets the big spec in. */
  ck_assert_int_eq(store_set_store_budget(st, budget + 400000, &err), TOPOS_OK);
  put_spec_ok(st, big, 100000, big_id);
  free(big);
  ck_assert_int_eq(store_set_store_budget(st, 100, &err), TOPOS_ERR_ARGUMENT);
  store_close(st);
  assert_integrity_ok(g_path);
}
END_TEST

static mode_t mode_of(const char *path) {
  struct stat sb;
  ck_assert_msg(stat(path, &sb) == 0, "stat %s: %s", path, strerror(errno));
  return sb.st_mode & 07777;
}

START_TEST(test_file_modes) {
  /* Created private even under a permissive umask. */
  mode_t old = umask(0);
  topos_store *st = open_ok(g_path);
  char id[65];
  put_spec_seed(st, 100, 1, id);
  char wal[700], shm[700];
  snprintf(wal, sizeof wal, "%s-wal", g_path);
  snprintf(shm, sizeof shm, "%s-shm", g_path);
  ck_assert_int_eq(mode_of(g_path), 0600);
  ck_assert_int_eq(mode_of(wal), 0600);
  ck_assert_int_eq(mode_of(shm), 0600);
  store_close(st);
  /* An existing store keeps its owner's mode, never widened. */
  const char *shared = in_dir("shared.db");
  write_file(shared, "", 0);
  ck_assert_int_eq(chmod(shared, 0640), 0);
  st = open_ok(shared);
  put_spec_seed(st, 100, 2, id);
  ck_assert_int_eq(mode_of(shared), 0640);
  store_close(st);
  umask(old);
}
END_TEST

/* ------------------------------------------------------------ owners */

static bool owns(topos_store *st, bool blob, const char *id,
                 const char *tenant) {
  topos_error err = {0};
  bool o = false;
  int rc = blob ? store_blob_owned(st, id, tenant, &o, &err)
                : store_spec_owned(st, id, tenant, &o, &err);
  ck_assert_msg(rc == TOPOS_OK, "owned: %s", err.message);
  return o;
}

static int list_of(topos_store *st, const char *tenant, char ids[][65],
                   int max) {
  topos_error err = {0};
  store_spec_info *rows = NULL;
  int n = 0;
  ck_assert_int_eq(store_list_specs_of(st, tenant, 0, max, &rows, &n, &err),
                   TOPOS_OK);
  for (int i = 0; i < n; i++) memcpy(ids[i], rows[i].id, 65);
  free(rows);
  return n;
}

static store_usage usage_of(topos_store *st, const char *tenant) {
  topos_error err = {0};
  store_usage u;
  ck_assert_msg(store_tenant_usage(st, tenant, &u, &err) == TOPOS_OK, "%s",
                err.message);
  return u;
}

/* A version 3 store (v4's objects dropped by hand) keeps its rows when it
 * is migrated; they belong to no tenant. */
START_TEST(test_migrate_v3) {
  topos_store *st = open_ok(g_path);
  uint8_t *spec = make_bytes(300, 1), *blob = make_bytes(5000, 2);
  char sid[65], bid[65];
  put_spec_ok(st, spec, 300, sid);
  put_blob_ok(st, blob, 5000, bid);
  store_close(st);
  sqlite3 *db = raw_open(g_path);
  raw_exec(db,
           "DROP TRIGGER specs_drop_owners; DROP TRIGGER blobs_drop_owners;"
           "DROP TABLE spec_owners; DROP TABLE blob_owners; DROP TABLE quotas;"
           "DELETE FROM schema_version WHERE version >= 4;");
  ck_assert_int_eq(raw_int(db, "SELECT max(version) FROM schema_version"), 3);
  sqlite3_close(db);

  st = open_ok(g_path);
  ck_assert_int_eq(stats_ok(st).schema_version, STORE_SCHEMA_VERSION);
  assert_spec_is(st, sid, spec, 300);
  ck_assert(blob_present(st, bid));
  char ids[4][65];
  ck_assert_int_eq(list_of(st, NULL, ids, 4), 1);
  ck_assert_int_eq(list_of(st, "alice", ids, 4), 0);
  ck_assert(!owns(st, false, sid, "alice"));
  ck_assert(!owns(st, true, bid, "alice"));
  ck_assert_int_eq(usage_of(st, "alice").spec_count, 0);
  /* Putting it again as alice makes it hers. */
  topos_error err = {0};
  char again[65];
  ck_assert_int_eq(store_put_spec_as(st, "alice", spec, 300, again, &err),
                   TOPOS_OK);
  ck_assert_str_eq(again, sid);
  ck_assert(owns(st, false, sid, "alice"));
  ck_assert_int_eq(list_of(st, "alice", ids, 4), 1);
  store_close(st);
  db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM schema_version"),
                   STORE_SCHEMA_VERSION);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM spec_owners"), 1);
  sqlite3_close(db);
  free(spec);
  free(blob);
}
END_TEST

/* Schema 5: quotas per tenant (and 6: their scheduling weight).  A
 * version 4 store migrates to an empty quotas table; set changes only the
 * fields named, NONE clears one, a rate needs its burst, a weight is in
 * 1..1000, an unknown tenant is NOT_FOUND, and removing the tenant drops
 * its row. */
START_TEST(test_quotas) {
  topos_store *st = open_ok(g_path);
  store_close(st);
  sqlite3 *db = raw_open(g_path);
  raw_exec(db,
           "DROP TABLE quotas; DELETE FROM schema_version WHERE version >= 5;");
  sqlite3_close(db);
  st = open_ok(g_path);
  ck_assert_int_eq(stats_ok(st).schema_version, STORE_SCHEMA_VERSION);
  topos_error err = {0};
  ck_assert_int_eq(store_tenant_add(st, "alice", false, &err), TOPOS_OK);
  store_quota q;
  bool any = true;
  ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  ck_assert(!any);
  ck_assert_int_eq(q.stored_bytes, STORE_QUOTA_NONE);
  ck_assert_int_eq(q.run_bytes, STORE_QUOTA_NONE);
  store_quota set = store_quota_unlimited();
  set.stored_bytes = 1000;
  set.rate_per_s = 2.5;
  set.burst = 4;
  ck_assert_int_eq(
      store_quota_set(st, "alice", &set,
                      STORE_QUOTA_STORED_BYTES | STORE_QUOTA_RATE, &err),
      TOPOS_OK);
  set = store_quota_unlimited();
  set.run_ms = 300;
  ck_assert_int_eq(store_quota_set(st, "alice", &set, STORE_QUOTA_RUN_MS, &err),
                   TOPOS_OK);
  ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  ck_assert(any);
  ck_assert_int_eq(q.stored_bytes, 1000);
  ck_assert(q.rate_per_s == 2.5);
  ck_assert_int_eq(q.burst, 4);
  ck_assert_int_eq(q.run_ms, 300);
  ck_assert_int_eq(q.inflight, STORE_QUOTA_NONE);
  ck_assert_int_eq(q.weight, STORE_QUOTA_NONE);
  /* The weight: 1..1000, not a limit. */
  set.weight = 0;
  ck_assert_int_eq(store_quota_set(st, "alice", &set, STORE_QUOTA_WEIGHT, &err),
                   TOPOS_ERR_ARGUMENT);
  set.weight = 1001;
  ck_assert_int_eq(store_quota_set(st, "alice", &set, STORE_QUOTA_WEIGHT, &err),
                   TOPOS_ERR_ARGUMENT);
  set.weight = 3;
  ck_assert_int_eq(store_quota_set(st, "alice", &set, STORE_QUOTA_WEIGHT, &err),
                   TOPOS_OK);
  ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  ck_assert_int_eq(q.weight, 3);
  ck_assert_int_eq(q.run_ms, 300);
  set.weight = STORE_QUOTA_NONE;
  /* Clearing one leaves the rest. */
  set.stored_bytes = STORE_QUOTA_NONE;
  ck_assert_int_eq(
      store_quota_set(st, "alice", &set, STORE_QUOTA_STORED_BYTES, &err),
      TOPOS_OK);
  ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  ck_assert_int_eq(q.stored_bytes, STORE_QUOTA_NONE);
  ck_assert_int_eq(q.run_ms, 300);
  /* What the daemon's per-call read costs (docs/operations.md, "Quotas"),
   * among 1000 tenants' rows. */
  for (int i = 0; i < 1000; i++) {
    char name[32];
    snprintf(name, sizeof name, "t%04d", i);
    ck_assert_int_eq(store_tenant_add(st, name, false, &err), TOPOS_OK);
    ck_assert_int_eq(store_quota_set(st, name, &set, STORE_QUOTA_RUN_MS, &err),
                     TOPOS_OK);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 20000; i++)
    ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fprintf(stderr, "store: quota read %.2f us\n",
          ((double)(t1.tv_sec - t0.tv_sec) * 1e9 +
           (double)(t1.tv_nsec - t0.tv_nsec)) /
              20000 / 1000);
  /* A rate without a burst, an unknown tenant. */
  set.rate_per_s = 3;
  set.burst = STORE_QUOTA_NONE;
  ck_assert_int_eq(store_quota_set(st, "alice", &set, STORE_QUOTA_RATE, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(
      store_quota_set(st, "nobody", &set, STORE_QUOTA_RUN_MS, &err),
      TOPOS_ERR_NOT_FOUND);
  /* Removing the tenant drops its quotas. */
  ck_assert_int_eq(store_tenant_remove(st, "alice", &err), TOPOS_OK);
  ck_assert_int_eq(store_tenant_add(st, "alice", false, &err), TOPOS_OK);
  ck_assert_int_eq(store_quota_get(st, "alice", &q, &any, &err), TOPOS_OK);
  ck_assert(!any);
  store_close(st);
}
END_TEST

START_TEST(test_owners) {
  topos_store *st = open_ok(g_path);
  topos_error err = {0};
  ck_assert_int_eq(store_tenant_add(st, "alice", false, &err), TOPOS_OK);
  ck_assert_int_eq(store_tenant_add(st, "bob", false, &err), TOPOS_OK);
  enum { SIZE = 10000 };
  uint8_t *b[5];
  char id[5][65];
  for (int i = 0; i < 5; i++) b[i] = make_bytes(SIZE, 10 + i);

  /* Both uploaders of one content own it; it is stored once. */
  ck_assert_int_eq(store_put_blob_as(st, "alice", b[1], SIZE, id[1], &err),
                   TOPOS_OK);
  ck_assert(owns(st, true, id[1], "alice"));
  ck_assert(!owns(st, true, id[1], "bob"));
  char same[65];
  ck_assert_int_eq(store_put_blob_as(st, "bob", b[1], SIZE, same, &err),
                   TOPOS_OK);
  ck_assert_str_eq(same, id[1]);
  ck_assert(owns(st, true, id[1], "bob"));
  ck_assert_int_eq(stats_ok(st).blob_count, 1);
  ck_assert_int_eq(usage_of(st, "alice").blob_bytes, SIZE);
  ck_assert_int_eq(usage_of(st, "bob").blob_count, 1);
  ck_assert_int_eq(store_put_blob_as(st, "Bad", b[1], SIZE, same, &err),
                   TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(store_blob_owned(st, id[1], "", &(bool){0}, &err),
                   TOPOS_ERR_ARGUMENT);

  /* Eviction: room for two and a half.  bob cannot evict the shared
   * blob or alice's; alice evicts her own. */
  ck_assert_int_eq(store_set_blob_cap(st, SIZE * 5 / 2, &err), TOPOS_OK);
  ck_assert_int_eq(store_put_blob_as(st, "alice", b[2], SIZE, id[2], &err),
                   TOPOS_OK);
  ck_assert_int_eq(store_put_blob_as(st, "bob", b[3], SIZE, id[3], &err),
                   TOPOS_ERR_MEMORY);
  ck_assert_ptr_nonnull(strstr(err.message, "blob cap full"));
  ck_assert(blob_present(st, id[1]) && blob_present(st, id[2]));
  ck_assert(owns(st, true, id[1], "bob"));
  ck_assert_int_eq(store_put_blob_as(st, "alice", b[4], SIZE, id[4], &err),
                   TOPOS_OK);
  ck_assert(!blob_present(st, id[2]));
  ck_assert(!owns(st, true, id[2], "alice")); /* dropped with the blob */
  ck_assert(blob_present(st, id[1]) && blob_present(st, id[4]));

  /* Removing bob drops his ownership; the shared blob stays alice's. */
  ck_assert_int_eq(store_tenant_remove(st, "bob", &err), TOPOS_OK);
  ck_assert(!owns(st, true, id[1], "bob"));
  ck_assert(owns(st, true, id[1], "alice"));
  ck_assert_int_eq(usage_of(st, "bob").blob_count, 0);
  ck_assert_int_eq(store_delete_blob(st, id[1], &err), TOPOS_OK);
  sqlite3 *db = raw_open(g_path);
  ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM blob_owners"), 1);
  sqlite3_close(db);

  /* Specs: listing per tenant, and retention only drops a spec no other
   * tenant owns. */
  char s[4][65], ids[8][65];
  uint8_t *sb[4];
  for (int i = 0; i < 4; i++) sb[i] = make_bytes(1000, 40 + i);
  ck_assert_int_eq(store_put_spec_as(st, "alice", sb[0], 1000, s[0], &err),
                   TOPOS_OK);
  ck_assert_int_eq(store_put_spec_as(st, "carol", sb[1], 1000, s[1], &err),
                   TOPOS_OK);
  ck_assert_int_eq(list_of(st, "alice", ids, 8), 1);
  ck_assert_str_eq(ids[0], s[0]);
  ck_assert_int_eq(list_of(st, "carol", ids, 8), 1);
  ck_assert_str_eq(ids[0], s[1]);
  ck_assert_int_eq(list_of(st, NULL, ids, 8), 2);
  ck_assert_int_eq(store_set_spec_budget(st, 2500, NULL, NULL, &err), TOPOS_OK);
  ck_assert_int_eq(store_put_spec_as(st, "carol", sb[2], 1000, s[2], &err),
                   TOPOS_OK);
  bool present = false;
  ck_assert_int_eq(store_has_spec(st, s[0], &present, &err), TOPOS_OK);
  ck_assert(present); /* alice's, though the oldest */
  ck_assert_int_eq(store_has_spec(st, s[1], &present, &err), TOPOS_OK);
  ck_assert(!present);
  ck_assert_int_eq(usage_of(st, "carol").spec_count, 1);
  store_close(st);
  for (int i = 0; i < 5; i++) free(b[i]);
  for (int i = 0; i < 4; i++) free(sb[i]);
}
END_TEST

Suite *store_suite(void) {
  Suite *s = suite_create("store");

  TCase *specs = tcase_create("specs");
  tcase_add_checked_fixture(specs, setup, teardown);
  tcase_set_timeout(specs, 30);
  tcase_add_test(specs, test_put_get_round_trip);
  tcase_add_test(specs, test_put_idempotent);
  tcase_add_test(specs, test_has_delete);
  tcase_add_test(specs, test_list_paging_newest_first);
  tcase_add_test(specs, test_stats);
  tcase_add_test(specs, test_corrupt_spec_detected);
  tcase_add_test(specs, test_bad_ids_refused);
  suite_add_tcase(s, specs);

  TCase *files = tcase_create("files");
  tcase_add_checked_fixture(files, setup, teardown);
  tcase_set_timeout(files, 30);
  tcase_add_test(files, test_random_bytes_refused);
  tcase_add_test(files, test_foreign_sqlite_refused);
  tcase_add_test(files, test_newer_schema_refused);
  tcase_add_test(files, test_reopen_persists);
  tcase_add_test(files, test_empty_files_adopted);
  suite_add_tcase(s, files);

  TCase *blobs = tcase_create("blobs");
  tcase_add_checked_fixture(blobs, setup, teardown);
  tcase_set_timeout(blobs, 120);
  tcase_add_test(blobs, test_corrupt_blob_detected);
  tcase_add_test(blobs, test_blob_lru_eviction);
  tcase_add_test(blobs, test_blob_cap_lowered);
  tcase_add_test(blobs, test_big_blob);
  suite_add_tcase(s, blobs);

  TCase *retention = tcase_create("retention");
  tcase_add_checked_fixture(retention, setup, teardown);
  tcase_set_timeout(retention, 60);
  tcase_add_test(retention, test_retention_lru_order);
  tcase_add_test(retention, test_retention_never_in_use);
  tcase_add_test(retention, test_retention_budget_lowered);
  tcase_add_test(retention, test_touches_written);
  tcase_add_test(retention, test_migrate_v1);
  tcase_add_test(retention, test_migrate_v3);
  tcase_add_test(retention, test_quotas);
  tcase_add_test(retention, test_owners);
  tcase_add_test(retention, test_store_budget_full);
  tcase_add_test(retention, test_file_modes);
  suite_add_tcase(s, retention);

  TCase *durability = tcase_create("durability");
  tcase_add_checked_fixture(durability, setup, teardown);
  tcase_set_timeout(durability, 120);
  tcase_add_test(durability, test_concurrent_handles);
  tcase_add_test(durability, test_shared_handle);
  tcase_add_test(durability, test_crash_sigkill);
  suite_add_tcase(s, durability);
  return s;
}
