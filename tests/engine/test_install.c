/*
 * test_install.c - what a program outside the tree sees of topos: the
 * shared libraries' exported symbols and SONAMEs, topos_version(), and
 * `make install`'s tree (tools/install.sh), against which a program is
 * built with nothing but `pkg-config --cflags --libs` and run.
 *
 * The libraries are $TOPOS_BUILD/lib's (default "build"); the suite runs
 * from the repository root, as `make test` runs it.  Under `make asan`
 * the libraries are sanitized, so the outside program is compiled with
 * the same flags (TOPOS_TEST_SAN, from the Makefile).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "scratch_dir.h"
#include "topos.h"
#include "topos_client.h"

#ifndef TOPOS_TEST_SAN
#define TOPOS_TEST_SAN ""
#endif

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b != NULL && b[0] != '\0' ? b : "build";
}

/* Runs cmd under sh, its stdout and stderr into out (NUL-terminated,
 * truncated to cap); returns the exit status (-1 when it did not run). */
static int run(const char *cmd, char *out, size_t cap) {
  char full[8192];
  snprintf(full, sizeof full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  if (p == NULL) return -1;
  size_t n = 0;
  if (out != NULL && cap > 0) {
    n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
  }
  char sink[4096];
  while (fread(sink, 1, sizeof sink, p) > 0) {
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --------------------------------------------------------------- exports */

/* The ASan runtime's own definitions in a sanitized library. */
static bool sanitizer_symbol(const char *name) {
  return TOPOS_TEST_SAN[0] != '\0' &&
         (!strncmp(name, "__asan", 6) || !strncmp(name, "__odr_asan", 10) ||
          !strncmp(name, "__ubsan", 7) || !strncmp(name, "__lsan", 6) ||
          !strncmp(name, "__sanitizer", 11));
}

/* Every defined dynamic symbol of lib starts with prefix; returns how
 * many there are and fails naming the first that does not. */
static int check_exports(const char *lib, const char *prefix) {
  char cmd[1024], path[512];
  snprintf(path, sizeof path, "%s/lib/%s", build_dir(), lib);
  ck_assert_msg(access(path, R_OK) == 0, "%s is not built", path);
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", path);
  static char out[1 << 20];
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  int count = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    char addr[64], type[8], name[512];
    if (sscanf(line, "%63s %7s %511s", addr, type, name) != 3) continue;
    /* Lower-case types are local; 'A' marks version nodes. */
    if (type[0] < 'A' || type[0] > 'Z' || type[0] == 'A') continue;
    if (sanitizer_symbol(name)) continue;
    ck_assert_msg(strncmp(name, prefix, strlen(prefix)) == 0,
                  "%s exports %s, which is not %s*: mark only the public "
                  "API TOPOS_API",
                  lib, name, prefix);
    count++;
  }
  return count;
}

/* The library's SONAME is want. */
static void check_soname(const char *lib, const char *want) {
  char cmd[1024], out[8192], needle[128];
  snprintf(cmd, sizeof cmd, "readelf -d '%s/lib/%s'", build_dir(), lib);
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  snprintf(needle, sizeof needle, "Library soname: [%s]", want);
  ck_assert_msg(strstr(out, needle) != NULL, "%s: no SONAME %s in\n%s", lib,
                want, out);
}

START_TEST(test_exports_only_the_api) {
  int engine = check_exports("libtopos.so", "topos_");
  int backends = check_exports("libtopos_backends.so", "topos_");
  int client = check_exports("libtoposclient.so", "topos_client_");
  /* The API is there: a library exporting nothing would pass the above. */
  ck_assert_int_gt(engine, 150);
  ck_assert_int_gt(backends, 5);
  ck_assert_int_gt(client, 20);
  char major[32];
  snprintf(major, sizeof major, "%d", TOPOS_VERSION_MAJOR);
  char want[64];
  snprintf(want, sizeof want, "libtopos.so.%s", major);
  check_soname("libtopos.so", want);
  snprintf(want, sizeof want, "libtopos_backends.so.%s", major);
  check_soname("libtopos_backends.so", want);
  snprintf(want, sizeof want, "libtoposclient.so.%s", major);
  check_soname("libtoposclient.so", want);
}
END_TEST

START_TEST(test_version) {
  ck_assert_str_eq(topos_version(), TOPOS_VERSION);
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", TOPOS_VERSION_MAJOR, TOPOS_VERSION_MINOR,
           TOPOS_VERSION_PATCH);
  ck_assert_str_eq(v, TOPOS_VERSION);
}
END_TEST

/* --------------------------------------------------------------- install */

/* The outside program: the engine (a spec recorded and trained by the
 * local trainer), the backends (registered, their ISA named) and the
 * client (a channel opened and closed; nothing listens there).  It
 * prints the version and w after the steps as a hex float. */
static const char outside_c[] =
    "#include <stdio.h>\n"
    "#include <topos/topos.h>\n"
    "#include <topos/backends.h>\n"
    "#include <topos/topos_client.h>\n"
    "int main(void) {\n"
    "  topos_backends_register_defaults();\n"
    "  topos_error err = {0};\n"
    "  topos_client *c = topos_client_connect(\"127.0.0.1:9\", &err);\n"
    "  if (c == NULL) { fprintf(stderr, \"%s\\n\", err.message); return 1; }\n"
    "  topos_client_close(c);\n"
    "  topos_tape *t = topos_tape_new(TOPOS_F64);\n"
    "  topos_tensor *z = topos_tensor_scalar(TOPOS_F64, 0.5, &err);\n"
    "  topos_value w = topos_parameter(t, z), x = topos_input(t, z);\n"
    "  topos_tensor_release(z);\n"
    "  topos_value r = topos_sub(t, topos_mul(t, w, x), x);\n"
    "  topos_value loss = topos_mul(t, r, r);\n"
    "  topos_network *net = topos_tape_seal(t, &err);\n"
    "  topos_trainer *tr = net ? topos_trainer_local(net, loss, NULL, 0,\n"
    "                                                NULL, &err) : NULL;\n"
    "  if (tr == NULL) { fprintf(stderr, \"%s\\n\", err.message); return 1; }\n"
    "  topos_optimizer opt = topos_sgd(0.05, 0.0);\n"
    "  topos_step_result cur = {0};\n"
    "  for (int i = 0; i < 20; i++) {\n"
    "    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, 1 + i % 3, &err);\n"
    "    topos_feed f[1] = {{x, xt}};\n"
    "    topos_step_result next;\n"
    "    int rc = topos_trainer_step(tr, cur.params, f, 1, &opt, cur.state,\n"
    "                                &next, &err);\n"
    "    topos_tensor_release(xt);\n"
    "    if (rc != 0) { fprintf(stderr, \"%s\\n\", err.message); return 1; }\n"
    "    topos_step_result_clear(&cur);\n"
    "    cur = next;\n"
    "  }\n"
    "  int64_t none[1] = {0};\n"
    "  double wv = topos_tensor_get(topos_params_get(cur.params, 0), none,\n"
    "                               &err);\n"
    "  printf(\"version %s isa %s w %a\\n\", topos_version(), "
    "topos_cpu_isa(), wv);\n"
    "  topos_step_result_clear(&cur);\n"
    "  topos_trainer_free(tr);\n"
    "  topos_network_release(net);\n"
    "  return 0;\n"
    "}\n";

/* The same steps here, with the libraries this runner links. */
static double inside_w(void) {
  topos_error err = {0};
  topos_tape *t = topos_tape_new(TOPOS_F64);
  topos_tensor *z = topos_tensor_scalar(TOPOS_F64, 0.5, &err);
  topos_value w = topos_parameter(t, z), x = topos_input(t, z);
  topos_tensor_release(z);
  topos_value r = topos_sub(t, topos_mul(t, w, x), x);
  topos_value loss = topos_mul(t, r, r);
  topos_network *net = topos_tape_seal(t, &err);
  ck_assert_ptr_nonnull(net);
  topos_trainer *tr = topos_trainer_local(net, loss, NULL, 0, NULL, &err);
  ck_assert_ptr_nonnull(tr);
  topos_optimizer opt = topos_sgd(0.05, 0.0);
  topos_step_result cur = {0};
  for (int i = 0; i < 20; i++) {
    topos_tensor *xt = topos_tensor_scalar(TOPOS_F64, 1 + i % 3, &err);
    topos_feed f[1] = {{x, xt}};
    topos_step_result next;
    ck_assert_int_eq(
        topos_trainer_step(tr, cur.params, f, 1, &opt, cur.state, &next, &err),
        0);
    topos_tensor_release(xt);
    topos_step_result_clear(&cur);
    cur = next;
  }
  int64_t none[1] = {0};
  double wv = topos_tensor_get(topos_params_get(cur.params, 0), none, &err);
  topos_step_result_clear(&cur);
  topos_trainer_free(tr);
  topos_network_release(net);
  return wv;
}

static void install_env(char *buf, size_t cap, const char *destdir,
                        const char *prefix) {
  snprintf(buf, cap,
           "BUILD='%s' PREFIX='%s' DESTDIR='%s' VERSION='%s' MAJOR='%d'",
           build_dir(), prefix, destdir, TOPOS_VERSION, TOPOS_VERSION_MAJOR);
}

/* Regular files and links under dir (0 when none or absent). */
static int files_under(const char *dir) {
  char cmd[1024], out[64];
  snprintf(cmd, sizeof cmd, "find '%s' ! -type d 2>/dev/null | wc -l", dir);
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  return atoi(out);
}

static void setup(void) {
  scratch_dir_make("topos-install");
}
static void teardown(void) {
  scratch_dir_remove();
}

START_TEST(test_install_and_build_outside) {
  char env[2048], prefix[600], cmd[8192];
  static char out[1 << 16];
  snprintf(prefix, sizeof prefix, "%s/prefix", g_dir);
  install_env(env, sizeof env, "", prefix);
  snprintf(cmd, sizeof cmd, "%s sh tools/install.sh install", env);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "install failed:\n%s", out);

  /* What the tree holds. */
  static const char *const want[] = {
      "include/topos/topos.h",
      "include/topos/backends.h",
      "include/topos/topos_client.h",
      "lib/libtopos.so.0",
      "lib/libtoposclient.so",
      "lib/libtopos_backends.a",
      "lib/pkgconfig/topos.pc",
      "lib/pkgconfig/topos-client.pc",
      "lib/pkgconfig/topos-backends.pc",
      "bin/topos",
      "sbin/toposd",
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", prefix, want[i]);
    ck_assert_msg(access(p, R_OK) == 0, "install wrote no %s", want[i]);
  }

  /* The program, built with pkg-config's flags alone, and run. */
  char src[700], prog[700];
  snprintf(src, sizeof src, "%s/outside.c", g_dir);
  snprintf(prog, sizeof prog, "%s/outside", g_dir);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fputs(outside_c, f);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "export PKG_CONFIG_PATH='%s/lib/pkgconfig'; "
           "pkg-config --modversion topos-client | grep -qx '%s' && "
           "cc -std=c17 -Wall -Werror %s '%s' -o '%s' "
           "$(pkg-config --cflags --libs topos-client topos-backends)",
           prefix, TOPOS_VERSION, TOPOS_TEST_SAN, src, prog);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "building outside:\n%s\n%s",
                cmd, out);
  snprintf(cmd, sizeof cmd, "TOPOS_CUDA=off LD_LIBRARY_PATH='%s/lib' '%s'",
           prefix, prog);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "running outside:\n%s", out);
  char expect[256];
  snprintf(expect, sizeof expect, "version %s isa %s w %a\n", TOPOS_VERSION,
           topos_cpu_isa(), inside_w());
  ck_assert_str_eq(out, expect);

  /* Uninstall leaves nothing behind. */
  snprintf(cmd, sizeof cmd, "%s sh tools/install.sh uninstall", env);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "uninstall failed:\n%s", out);
  ck_assert_int_eq(files_under(prefix), 0);
}
END_TEST

/* DESTDIR stages the tree; the .pc files name the final prefix, and a
 * sysroot-aware pkg-config finds the staged headers. */
START_TEST(test_install_destdir) {
  char env[2048], stage[600], cmd[8192];
  static char out[1 << 16];
  snprintf(stage, sizeof stage, "%s/stage", g_dir);
  install_env(env, sizeof env, stage, "/opt/topos");
  snprintf(cmd, sizeof cmd, "%s sh tools/install.sh install", env);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "install failed:\n%s", out);
  char pc[800];
  snprintf(pc, sizeof pc, "%s/opt/topos/lib/pkgconfig/topos.pc", stage);
  snprintf(cmd, sizeof cmd, "grep -x 'prefix=/opt/topos' '%s'", pc);
  ck_assert_msg(run(cmd, out, sizeof out) == 0, "%s names another prefix", pc);
  snprintf(cmd, sizeof cmd,
           "PKG_CONFIG_SYSROOT_DIR='%s' "
           "PKG_CONFIG_PATH='%s/opt/topos/lib/pkgconfig' "
           "pkg-config --cflags topos",
           stage, stage);
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  char want[800];
  snprintf(want, sizeof want, "-I%s/opt/topos/include", stage);
  ck_assert_msg(strstr(out, want) != NULL, "cflags %s lack %s", out, want);
  snprintf(cmd, sizeof cmd, "%s sh tools/install.sh uninstall", env);
  ck_assert_int_eq(run(cmd, out, sizeof out), 0);
  ck_assert_int_eq(files_under(stage), 0);
}
END_TEST

Suite *install_suite(void) {
  Suite *s = suite_create("install");
  TCase *tc = tcase_create("install");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_exports_only_the_api);
  tcase_add_test(tc, test_version);
  tcase_add_test(tc, test_install_and_build_outside);
  tcase_add_test(tc, test_install_destdir);
  suite_add_tcase(s, tc);
  return s;
}
