/*
 * runner.c - runs every Check suite of the project in one SRunner and
 * prints Check's summary line.  The suites are listed by the Makefile
 * (build/tests/suites.c), one per tests/engine/test_<name>.c.
 */
#include <check.h>
#include <stdlib.h>

void add_suites(SRunner *r);

int main(void) {
  SRunner *r = srunner_create(NULL);
  add_suites(r);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
