/*
 * test_python.c - the Python package client/python (`pip install
 * ./client/python`, import name `topos`) against a real toposd.
 *
 * package: starts toposd on a loopback port with a temporary SQLite
 * store (harness.h), creates a virtual environment that sees Debian's
 * python3-grpcio, python3-protobuf, python3-numpy and python3-pytest
 * (/usr/bin/python3 -m venv --system-site-packages), installs a copy of
 * the package into it offline (pip --no-build-isolation --no-index
 * --no-deps; the copy, so the build writes nothing into the source
 * tree), checks `import topos` finds the installed one, and runs
 * client/python/tests with pytest and TOPOS_SERVER set: every test must
 * pass and none may be skipped.  The source tree must be as before.
 *
 * no_server: the same tests without TOPOS_SERVER skip those that need a
 * daemon, saying why, and pass the rest.
 *
 * stubs_current: client/python/regen.sh regenerates the shipped gRPC
 * stubs (client/python/topos/_proto) into a temporary directory; they
 * must equal the shipped files byte for byte, so a change to
 * proto/topos.proto or proto/health.proto without a regeneration fails.
 *
 * Tests run from the repository root (make test); the daemon is
 * $TOPOS_BUILD/bin/toposd (default build/).
 */
#include <dirent.h>

#include "harness.h"

/* The last bytes of an output shown in a failure message (Check cuts
 * messages at BUFSIZ); the whole output goes to stderr. */
#define TAIL_BYTES 3000

/* Runs `cmd` with sh, its stdout and stderr into `log`; returns its exit
 * status (-1 when it did not exit) and the output in *out (new). */
static int run_logged(const char *cmd, const char *log, char **out) {
  size_t len = strlen(cmd) + strlen(log) + 32;
  char *full = malloc(len);
  snprintf(full, len, "( %s ) >'%s' 2>&1 </dev/null", cmd, log);
  int rc = system(full);
  free(full);
  FILE *f = fopen(log, "rb");
  char *text = NULL;
  size_t n = 0;
  if (f != NULL) {
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc(size > 0 ? (size_t)size + 1 : 1);
    n = size > 0 ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
  } else {
    text = malloc(1);
  }
  text[n] = '\0';
  *out = text;
  return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static const char *tail(const char *text) {
  size_t n = strlen(text);
  return n > TAIL_BYTES ? text + n - TAIL_BYTES : text;
}

/* The last non-empty line of `text` (pytest's summary), in a static
 * buffer. */
static const char *last_line(const char *text) {
  static char line[256];
  size_t end = strlen(text);
  while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r')) end--;
  size_t start = end;
  while (start > 0 && text[start - 1] != '\n') start--;
  snprintf(line, sizeof line, "%.*s", (int)(end - start), text + start);
  return line;
}

/* Fails with the command's output when it did not exit 0. */
static char *run_ok(const char *what, const char *cmd, const char *log) {
  char *out = NULL;
  int st = run_logged(cmd, log, &out);
  if (st != 0) {
    fprintf(stderr, "test_python: %s exited %d:\n%s\n", what, st, out);
    ck_abort_msg("%s exited %d (command: %s); its output ends:\n%s", what, st,
                 cmd, tail(out));
  }
  return out;
}

/* What lies under client/python, one path a line, sorted. */
static char *source_listing(const char *dir) {
  char cmd[600], log[400];
  snprintf(log, sizeof log, "%s/listing.txt", dir);
  snprintf(cmd, sizeof cmd, "find client/python -print | LC_ALL=C sort");
  return run_ok("find client/python", cmd, log);
}

static bool python_ready(void) {
  return access("/usr/bin/python3", X_OK) == 0 &&
         access("client/python/pyproject.toml", R_OK) == 0;
}

/* ------------------------------------------------------------ package */

START_TEST(test_python_package) {
  ck_assert_msg(python_ready(),
                "/usr/bin/python3 or client/python is missing (run from "
                "the repository root; make deps installs python3)");
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *const flags[] = {"--http", "off", NULL};
  daemon_start(&d, flags);
  char *before = source_listing(d.dir);

  char venv[400], pkg[400], log[400], cmd[4096];
  snprintf(venv, sizeof venv, "%s/venv", d.dir);
  snprintf(pkg, sizeof pkg, "%s/pkg", d.dir);
  snprintf(log, sizeof log, "%s/python.log", d.dir);

  /* The package's files, copied: pip builds in the directory it is
   * given (build/, *.egg-info), and that must not be the source tree. */
  snprintf(cmd, sizeof cmd,
           "mkdir '%s' && cp -R client/python/pyproject.toml "
           "client/python/README.md client/python/topos '%s'/ && "
           "find '%s' -name __pycache__ -prune -exec rm -rf {} +",
           pkg, pkg, pkg);
  free(run_ok("copying client/python", cmd, log));
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -m venv --system-site-packages '%s'", venv);
  free(run_ok("python3 -m venv", cmd, log));
  /* What an offline install and the tests take from Debian: say which
   * package is missing rather than let pip fail obscurely (setuptools
   * builds the wheel only with python3-wheel). */
  snprintf(cmd, sizeof cmd,
           "'%s/bin/python' -c 'import setuptools, wheel, grpc, "
           "google.protobuf, numpy, pytest'",
           venv);
  free(
      run_ok("the venv's imports (python3-setuptools python3-wheel "
             "python3-grpcio python3-protobuf python3-numpy python3-pytest)",
             cmd, log));
  snprintf(
      cmd, sizeof cmd,
      "PIP_DISABLE_PIP_VERSION_CHECK=1 '%s/bin/pip' install --no-cache-dir "
      "--no-build-isolation --no-index --no-deps '%s'",
      venv, pkg);
  char *out = run_ok("pip install", cmd, log);
  ck_assert_msg(strstr(out, "Successfully installed topos-client") != NULL,
                "pip install said:\n%s", tail(out));
  free(out);

  /* `import topos` from the repository root, where pytest runs, finds
   * the installed package, not client/python's sources. */
  snprintf(cmd, sizeof cmd,
           "PYTHONDONTWRITEBYTECODE=1 '%s/bin/python' -c "
           "'import topos; print(topos.__file__)'",
           venv);
  out = run_ok("import topos", cmd, log);
  ck_assert_msg(strncmp(out, venv, strlen(venv)) == 0,
                "topos imported from %s, not from %s", out, venv);
  free(out);

  /* The tests, from the source tree, on the installed package. */
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_TOKEN TOPOS_SERVER=127.0.0.1:%d "
           "PYTHONDONTWRITEBYTECODE=1 '%s/bin/python' -m pytest -q -rs "
           "-p no:cacheprovider client/python/tests",
           d.port, venv);
  out = run_ok("pytest client/python/tests", cmd, log);
  printf("python package: %s\n", last_line(out));
  ck_assert_msg(strstr(out, " passed") != NULL, "pytest said:\n%s", tail(out));
  ck_assert_msg(strstr(out, "skipped") == NULL,
                "tests were skipped with a daemon running:\n%s", tail(out));
  free(out);

  char *after = source_listing(d.dir);
  ck_assert_msg(strcmp(before, after) == 0,
                "the suite changed client/python:\nbefore:\n%s\nafter:\n%s",
                tail(before), tail(after));
  free(before);
  free(after);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_python_no_server) {
  ck_assert_msg(python_ready(), "/usr/bin/python3 or client/python missing");
  daemon_proc d; /* only its temporary directory */
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char log[400], cmd[1024];
  snprintf(log, sizeof log, "%s/python.log", d.dir);
  snprintf(cmd, sizeof cmd,
           "env -u TOPOS_SERVER -u TOPOS_TOKEN PYTHONPATH=client/python "
           "PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -q -rs "
           "-p no:cacheprovider client/python/tests");
  char *out = run_ok("pytest without TOPOS_SERVER", cmd, log);
  ck_assert_msg(strstr(out, "skipped") != NULL &&
                    strstr(out, "TOPOS_SERVER is not set") != NULL,
                "no test skipped for want of a daemon:\n%s", tail(out));
  ck_assert_msg(strstr(out, " passed") != NULL,
                "the tests that need no daemon did not run:\n%s", tail(out));
  free(out);
  daemon_cleanup(&d);
}
END_TEST

/* -------------------------------------------------------------- stubs */

static bool read_file(const char *path, char **data, long *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return false;
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc(*size > 0 ? (size_t)*size : 1);
  bool ok = *size >= 0 && fread(*data, 1, (size_t)*size, f) == (size_t)*size;
  fclose(f);
  return ok;
}

START_TEST(test_python_stubs_current) {
  ck_assert_msg(python_ready(), "/usr/bin/python3 or client/python missing");
  daemon_proc d; /* only its temporary directory */
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char gen[400], log[400], cmd[1024];
  snprintf(gen, sizeof gen, "%s/gen", d.dir);
  snprintf(log, sizeof log, "%s/regen.log", d.dir);
  snprintf(cmd, sizeof cmd, "sh client/python/regen.sh '%s'", gen);
  free(run_ok("client/python/regen.sh (python3-grpc-tools)", cmd, log));

  static const char *const stubs[] = {"topos_pb2.py", "topos_pb2_grpc.py",
                                      "health_pb2.py", "health_pb2_grpc.py"};
  for (size_t i = 0; i < sizeof stubs / sizeof *stubs; i++) {
    char shipped[600], fresh[600];
    snprintf(shipped, sizeof shipped, "client/python/topos/_proto/%s",
             stubs[i]);
    snprintf(fresh, sizeof fresh, "%s/%s", gen, stubs[i]);
    char *a = NULL, *b = NULL;
    long na = 0, nb = 0;
    ck_assert_msg(read_file(fresh, &b, &nb), "regen.sh made no %s", fresh);
    ck_assert_msg(read_file(shipped, &a, &na), "%s is not shipped", shipped);
    long at = 0;
    while (at < na && at < nb && a[at] == b[at]) at++;
    ck_assert_msg(
        na == nb && at == na,
        "%s is stale: it differs from a fresh regeneration at byte %ld "
        "(%ld and %ld bytes); run client/python/regen.sh after changing "
        "proto/",
        shipped, at, na, nb);
    free(a);
    free(b);
  }
  /* Nothing else generated lies in the package: a stub of a proto that
   * is gone would still be importable. */
  DIR *dir = opendir("client/python/topos/_proto");
  ck_assert_ptr_nonnull(dir);
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (strstr(e->d_name, "_pb2") == NULL) continue;
    bool known = false;
    for (size_t i = 0; i < sizeof stubs / sizeof *stubs; i++)
      known = known || strcmp(e->d_name, stubs[i]) == 0;
    ck_assert_msg(known,
                  "client/python/topos/_proto/%s is no stub regen.sh "
                  "makes",
                  e->d_name);
  }
  closedir(dir);
  daemon_cleanup(&d);
}
END_TEST

Suite *python_suite(void) {
  Suite *s = suite_create("python");
  TCase *tc = tcase_create("package");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_python_stubs_current);
  tcase_add_test(tc, test_python_no_server);
  tcase_add_test(tc, test_python_package);
  suite_add_tcase(s, tc);
  return s;
}
