/*
 * test_error.c - the error convention (error_set) and the text helpers
 * messages are built from (shape_text, meta_text, topos_status_name).
 */
#include <stdint.h>

#include "internal.h"
#include "testutil.h"

START_TEST(test_error_set_fills_code_and_message) {
  topos_error err = {0};
  int code = error_set(&err, TOPOS_ERR_SHAPE, "op %s (node %d): %s", "add", 7,
                       "mismatch");
  ck_assert_int_eq(code, TOPOS_ERR_SHAPE);
  ck_assert_int_eq(err.code, TOPOS_ERR_SHAPE);
  ck_assert_str_eq(err.message, "op add (node 7): mismatch");
  /* A second error replaces the first entirely. */
  code = error_set(&err, TOPOS_ERR_RANGE, "x");
  ck_assert_int_eq(code, TOPOS_ERR_RANGE);
  ck_assert_int_eq(err.code, TOPOS_ERR_RANGE);
  ck_assert_str_eq(err.message, "x");
}
END_TEST

START_TEST(test_error_set_null_err) {
  ck_assert_int_eq(error_set(NULL, TOPOS_ERR_MEMORY, "no %s", "memory"),
                   TOPOS_ERR_MEMORY);
  ck_assert_int_eq(error_set(NULL, TOPOS_OK, "fine"), TOPOS_OK);
}
END_TEST

START_TEST(test_error_set_truncates) {
  char long_text[2000];
  memset(long_text, 'a', sizeof long_text - 1);
  long_text[sizeof long_text - 1] = '\0';
  long_text[0] = 'Z';
  topos_error err;
  memset(&err, 0x55, sizeof err); /* garbage must not survive */
  int code = error_set(&err, TOPOS_ERR_ARGUMENT, "%s", long_text);
  ck_assert_int_eq(code, TOPOS_ERR_ARGUMENT);
  ck_assert_int_eq(err.code, TOPOS_ERR_ARGUMENT);
  ck_assert_uint_eq(strlen(err.message), sizeof err.message - 1);
  ck_assert_int_eq(err.message[0], 'Z');
  ck_assert_int_eq(err.message[sizeof err.message - 2], 'a');
  ck_assert_int_eq(err.message[sizeof err.message - 1], '\0');
}
END_TEST

START_TEST(test_shape_text) {
  char buf[SHAPE_TEXT];
  int64_t s23[2] = {2, 3};
  ck_assert_str_eq(shape_text(buf, 2, s23), "[2,3]");
  ck_assert_ptr_eq(shape_text(buf, 2, s23), buf);
  ck_assert_str_eq(shape_text(buf, 0, NULL), "[]");
  int64_t s1[1] = {0};
  ck_assert_str_eq(shape_text(buf, 1, s1), "[0]");
  int64_t neg[2] = {4, -1};
  ck_assert_str_eq(shape_text(buf, 2, neg), "[4,-1]");
  /* The widest possible text fits in SHAPE_TEXT without truncation. */
  int64_t wide[TOPOS_MAX_RANK];
  for (int i = 0; i < TOPOS_MAX_RANK; i++) wide[i] = INT64_MIN;
  shape_text(buf, TOPOS_MAX_RANK, wide);
  ck_assert_uint_eq(strlen(buf), 2 + 8 * 20 + 7);
  ck_assert_int_eq(buf[strlen(buf) - 1], ']');
  ck_assert_ptr_nonnull(strstr(buf, "[-9223372036854775808,"));
}
END_TEST

START_TEST(test_meta_text) {
  char buf[SHAPE_TEXT];
  tensor_meta m = {.dtype = TOPOS_F32, .rank = 2, .shape = {2, 3}};
  ck_assert_str_eq(meta_text(buf, &m), "f32[2,3]");
  m = (tensor_meta){.dtype = TOPOS_BF16, .rank = 0};
  ck_assert_str_eq(meta_text(buf, &m), "bf16[]");
  m = (tensor_meta){.dtype = TOPOS_I32, .rank = 1, .shape = {7}};
  ck_assert_str_eq(meta_text(buf, &m), "i32[7]");
  m = (tensor_meta){.dtype = TOPOS_F64, .rank = 3, .shape = {1, 0, 5}};
  ck_assert_str_eq(meta_text(buf, &m), "f64[1,0,5]");
  m = (tensor_meta){.dtype = (topos_dtype)9, .rank = 1, .shape = {2}};
  ck_assert_str_eq(meta_text(buf, &m), "?[2]");
  tensor_meta wide = {.dtype = TOPOS_BF16, .rank = TOPOS_MAX_RANK};
  for (int i = 0; i < TOPOS_MAX_RANK; i++) wide.shape[i] = INT64_MIN;
  meta_text(buf, &wide);
  ck_assert_uint_eq(strlen(buf), 4 + 2 + 8 * 20 + 7);
}
END_TEST

START_TEST(test_status_names) {
  ck_assert_str_eq(topos_status_name(TOPOS_OK), "ok");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_ARGUMENT), "argument");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_SHAPE), "shape");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_DTYPE), "dtype");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_RANGE), "range");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_MEMORY), "memory");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_STATE), "state");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_NOT_FOUND), "not found");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_CORRUPT), "corrupt");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_IO), "io");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_CANCELLED), "cancelled");
  ck_assert_str_eq(topos_status_name(TOPOS_ERR_DEADLINE), "deadline");
  ck_assert_str_eq(topos_status_name(12), "unknown");
  ck_assert_str_eq(topos_status_name(-1), "unknown");
  ck_assert_str_eq(topos_status_name(1000000), "unknown");
}
END_TEST

START_TEST(test_topos_free) {
  topos_free(NULL);
  char *s = malloc(16);
  ck_assert_ptr_nonnull(s);
  strcpy(s, "described");
  topos_free(s); /* valgrind/asan report a leak or a bad free otherwise */
}
END_TEST

Suite *error_suite(void) {
  Suite *s = suite_create("error");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_error_set_fills_code_and_message);
  tcase_add_test(tc, test_error_set_null_err);
  tcase_add_test(tc, test_error_set_truncates);
  tcase_add_test(tc, test_shape_text);
  tcase_add_test(tc, test_meta_text);
  tcase_add_test(tc, test_status_names);
  tcase_add_test(tc, test_topos_free);
  suite_add_tcase(s, tc);
  return s;
}
