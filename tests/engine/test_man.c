/*
 * test_man.c - the manual pages docs/man/toposd.8 and docs/man/topos.1
 * stay true to the programs:
 *  - every option `toposd --help` lists (the "  --NAME" at the start of
 *    an option line, and a ", --OTHER" after it) is the tag of a .TP
 *    entry of toposd.8;
 *  - every command `topos --help` names ("record", "tenant add", ...)
 *    and every --option of `topos --help` and of `topos WORD --help`, for
 *    each command word, is the tag of a .TP entry of topos.1;
 *  - both pages render with `groff -man -Tutf8 -ww -z` silently (skipped,
 *    saying so, where groff is absent);
 *  - the .TH line's footer is "topos TOPOS_VERSION".
 * A last case feeds each check a page with a fault (an entry deleted, a
 * stale version, an unknown macro) and sees it caught, so none of them
 * can pass vacuously.
 *
 * The binaries are $TOPOS_BUILD/bin's (default "build"); the suite runs
 * from the repository root, as `make test` runs it.  A tag is compared
 * after its roff is undone: the macro name, quotes, font escapes, and
 * "\-" written as '-'.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "topos.h"

#define TOPOSD_PAGE "docs/man/toposd.8"
#define TOPOS_PAGE "docs/man/topos.1"

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b != NULL && b[0] != '\0' ? b : "build";
}

/* ------------------------------------------------------------ strings */

typedef struct strlist {
  char **v;
  int n, cap;
} strlist;

static bool strlist_has(const strlist *l, const char *s) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->v[i], s) == 0) return true;
  return false;
}

/* Adds a copy of the first len bytes of s, unless it is there already. */
static void strlist_add(strlist *l, const char *s, size_t len) {
  char *copy = strndup(s, len);
  ck_assert_ptr_nonnull(copy);
  if (strlist_has(l, copy)) {
    free(copy);
    return;
  }
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = realloc(l->v, sizeof *l->v * (size_t)l->cap);
    ck_assert_ptr_nonnull(l->v);
  }
  l->v[l->n++] = copy;
}

static void strlist_free(strlist *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

/* A character of an option's or command's name. */
static bool name_char(char c) {
  return islower((unsigned char)c) || isdigit((unsigned char)c) || c == '-' ||
         c == '_';
}

/* ------------------------------------------------------------ files, runs */

/* A whole file, NUL-terminated (NULL when it cannot be read). */
static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    cap *= 2;
    char *grown = realloc(buf, cap);
    if (grown == NULL) free(buf);
    buf = grown;
  }
  fclose(f);
  if (buf != NULL) buf[n] = '\0';
  return buf;
}

/* Runs cmd under sh; returns its standard output and error, NUL-
 * terminated, and its exit status in *status (-1 when it did not exit). */
static char *run_capture(const char *cmd, int *status) {
  char full[4096];
  snprintf(full, sizeof full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_msg(p != NULL, "popen %s: %s", cmd, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  for (;;) {
    size_t got = fread(buf + n, 1, cap - n - 1, p);
    n += got;
    if (got == 0) break;
    if (n == cap - 1) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert_ptr_nonnull(buf);
    }
  }
  buf[n] = '\0';
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return buf;
}

/* `BIN ARGS` from $TOPOS_BUILD/bin, which must exit 0 with some output. */
static char *program_help(const char *bin, const char *args) {
  char path[512], cmd[1024];
  snprintf(path, sizeof path, "%s/bin/%s", build_dir(), bin);
  ck_assert_msg(access(path, X_OK) == 0, "%s is not built", path);
  snprintf(cmd, sizeof cmd, "'%s' %s", path, args);
  int status = 0;
  char *out = run_capture(cmd, &status);
  ck_assert_msg(status == 0 && out[0] != '\0', "%s: exit status %d:\n%s", cmd,
                status, out);
  return out;
}

static char *page_text(const char *path) {
  char *page = read_text(path);
  ck_assert_msg(page != NULL, "%s: %s", path, strerror(errno));
  return page;
}

/* ------------------------------------------------------------ the pages */

/* The text of a roff line with the roff undone: the macro name of a
 * control line, quotes, font and size escapes and zero-width ones
 * dropped; "\-" is '-', "\~" and "\ " a space, "\e" a backslash. */
static char *roff_plain(const char *line, size_t len) {
  char *out = malloc(len + 1);
  ck_assert_ptr_nonnull(out);
  size_t i = 0, o = 0;
  if (len > 0 && (line[0] == '.' || line[0] == '\'')) {
    i = 1;
    while (i < len && !isspace((unsigned char)line[i])) i++;
    while (i < len && isspace((unsigned char)line[i])) i++;
  }
  while (i < len) {
    char c = line[i++];
    if (c == '"') continue;
    if (c != '\\' || i >= len) {
      out[o++] = c;
      continue;
    }
    char e = line[i++];
    if (e == '-' || e == 'e') {
      out[o++] = e == '-' ? '-' : '\\';
    } else if (e == '~' || e == ' ') {
      out[o++] = ' ';
    } else if (e == 'f' || e == 's' || e == '(' || e == '*') {
      /* \fB, \f(BI, \f[BI], \s0, \(aq, \*(lq: skip the argument. */
      if (e == 's' && i < len && (line[i] == '+' || line[i] == '-')) i++;
      if (i < len && line[i] == '(' && e != '(') {
        i += 3;
      } else if (i < len && line[i] == '[') {
        while (i < len && line[i] != ']') i++;
        i++;
      } else {
        i += e == '(' ? 2 : 1;
      }
    }
    /* \&, \|, \^, \c and the rest: nothing. */
  }
  out[o] = '\0';
  return out;
}

/* Whether some .TP entry of page has a tag (the line after .TP) that,
 * its roff undone, starts with term followed by anything but a name
 * character. */
static bool page_has_entry(const char *page, const char *term) {
  size_t tl = strlen(term);
  const char *line = page;
  while (*line) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    bool tp = len >= 3 && strncmp(line, ".TP", 3) == 0 &&
              (len == 3 || line[3] == ' ');
    line = end ? end + 1 : line + len;
    if (!tp || !*line) continue;
    end = strchr(line, '\n');
    char *tag = roff_plain(line, end ? (size_t)(end - line) : strlen(line));
    bool hit = strncmp(tag, term, tl) == 0 && !name_char(tag[tl]);
    free(tag);
    if (hit) return true;
  }
  return false;
}

/* The terms of l with no .TP entry in page, one per line ("" if none);
 * the caller frees it. */
static char *missing_entries(const char *page, const strlist *l) {
  size_t cap = 1, used = 0;
  for (int i = 0; i < l->n; i++) cap += strlen(l->v[i]) + 3;
  char *out = malloc(cap);
  ck_assert_ptr_nonnull(out);
  out[0] = '\0';
  for (int i = 0; i < l->n; i++)
    if (!page_has_entry(page, l->v[i]))
      used += (size_t)snprintf(out + used, cap - used, "  %s\n", l->v[i]);
  return out;
}

/* The arguments of page's .TH line (quotes honoured) into args, up to
 * max; returns how many, or -1 without a .TH line.  args point into buf. */
static int th_args(const char *page, char *buf, size_t buflen, char **args,
                   int max) {
  const char *th =
      strncmp(page, ".TH ", 4) == 0 ? page : strstr(page, "\n.TH ");
  if (th == NULL) return -1;
  if (th[0] == '\n') th++;
  const char *end = strchr(th, '\n');
  size_t len = end ? (size_t)(end - th) : strlen(th);
  if (len >= buflen) len = buflen - 1;
  memcpy(buf, th, len);
  buf[len] = '\0';
  int n = 0;
  char *p = buf + 3;
  while (n < max) {
    while (*p == ' ') p++;
    if (*p == '\0') break;
    if (*p == '"') {
      args[n++] = ++p;
      while (*p && *p != '"') p++;
    } else {
      args[n++] = p;
      while (*p && *p != ' ') p++;
    }
    if (*p) *p++ = '\0';
  }
  return n;
}

/* Whether groff is installed. */
static bool have_groff(void) {
  int status = 0;
  free(run_capture("command -v groff", &status));
  return status == 0;
}

/* What `groff -man -Tutf8 -ww -z path` prints (its warnings), with its
 * exit status in *status. */
static char *render_warnings(const char *path, int *status) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "groff -man -Tutf8 -ww -z '%s'", path);
  return run_capture(cmd, status);
}

/* ------------------------------------------------------------ the programs */

/* toposd's options: every "  --NAME" that starts a line of its --help,
 * and the "--OTHER" of a "--NAME, --OTHER" list there. */
static void toposd_options(strlist *opts) {
  char *help = program_help("toposd", "--help");
  for (const char *line = help; *line;) {
    const char *end = strchr(line, '\n');
    if (strncmp(line, "  --", 4) == 0) {
      const char *p = line + 2;
      for (;;) {
        const char *q = p + 2;
        while (name_char(*q)) q++;
        strlist_add(opts, p, (size_t)(q - p));
        if (strncmp(q, ", --", 4) != 0) break;
        p = q + 2;
      }
    }
    line = end ? end + 1 : line + strlen(line);
  }
  free(help);
}

/* Every "--NAME" anywhere in text. */
static void collect_options(const char *text, strlist *opts) {
  for (const char *p = strstr(text, "--"); p != NULL; p = strstr(p + 2, "--")) {
    if (p > text && (name_char(p[-1]) || p[-1] == '-')) continue;
    const char *q = p + 2;
    if (!islower((unsigned char)*q)) continue;
    while (name_char(*q)) q++;
    strlist_add(opts, p, (size_t)(q - p));
  }
}

/* The length of the lowercase word at p (0 when there is none). */
static size_t word_len(const char *p) {
  size_t n = 0;
  while (islower((unsigned char)p[n])) n++;
  return n;
}

/* A command written at p ("record FILE", "tenant list", "stats"): its
 * length ("record", "tenant list"), or 0 when p holds prose.  A command
 * is one or two lowercase words followed by the end, or by an argument
 * (an uppercase word or '['). */
static size_t command_at(const char *p, size_t len) {
  size_t w = word_len(p);
  if (w == 0 || w > len) return 0;
  for (int words = 1; words <= 2; words++) {
    if (w == len) return w;
    if (p[w] != ' ') return 0;
    char next = p[w + 1];
    if (isupper((unsigned char)next) || next == '[') return w;
    size_t w2 = word_len(p + w + 1);
    if (w2 == 0 || words == 2) return 0;
    w += 1 + w2;
  }
  return 0;
}

/* topos's commands: the lines of `topos --help` indented by exactly two
 * spaces, up to their first run of two spaces (the description column),
 * each part between " | " that reads as a command. */
static void topos_commands(const char *help, strlist *cmds) {
  for (const char *line = help; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len > 2 && line[0] == ' ' && line[1] == ' ' &&
        islower((unsigned char)line[2])) {
      const char *p = line + 2;
      const char *gap = strstr(p, "  ");
      size_t seg =
          gap != NULL && gap < line + len ? (size_t)(gap - p) : len - 2;
      while (seg > 0) {
        const char *bar = strstr(p, " | ");
        size_t part = bar != NULL && bar < p + seg ? (size_t)(bar - p) : seg;
        size_t c = command_at(p, part);
        if (c > 0) strlist_add(cmds, p, c);
        if (part == seg) break;
        p += part + 3;
        seg -= part + 3;
      }
    }
    line = end ? end + 1 : line + len;
  }
}

/* ------------------------------------------------------------ cases */

START_TEST(test_toposd_options_documented) {
  strlist opts = {0};
  toposd_options(&opts);
  /* The parse found the option lines at all. */
  ck_assert_msg(opts.n >= 10 && strlist_has(&opts, "--listen") &&
                    strlist_has(&opts, "--help") &&
                    strlist_has(&opts, "--version"),
                "toposd --help: only %d options found", opts.n);
  char *page = page_text(TOPOSD_PAGE);
  char *missing = missing_entries(page, &opts);
  ck_assert_msg(missing[0] == '\0',
                "%s has no .TP entry for these options of toposd --help:\n%s",
                TOPOSD_PAGE, missing);
  free(missing);
  free(page);
  strlist_free(&opts);
}
END_TEST

START_TEST(test_topos_commands_and_options_documented) {
  char *help = program_help("topos", "--help");
  strlist cmds = {0}, opts = {0}, words = {0};
  topos_commands(help, &cmds);
  collect_options(help, &opts);
  ck_assert_msg(cmds.n >= 8 && strlist_has(&cmds, "record") &&
                    strlist_has(&cmds, "stats") &&
                    strlist_has(&cmds, "tenant add") &&
                    strlist_has(&cmds, "quota show"),
                "topos --help: only %d commands found", cmds.n);
  /* Each command word's own --help ("tenant" and "token" share one). */
  for (int i = 0; i < cmds.n; i++)
    strlist_add(&words, cmds.v[i], word_len(cmds.v[i]));
  for (int i = 0; i < words.n; i++) {
    char args[128];
    snprintf(args, sizeof args, "%s --help", words.v[i]);
    char *sub = program_help("topos", args);
    ck_assert_msg(strstr(sub, "usage: topos") != NULL,
                  "topos %s: not a usage:\n%s", args, sub);
    collect_options(sub, &opts);
    free(sub);
  }
  ck_assert_msg(opts.n >= 20 && strlist_has(&opts, "--server") &&
                    strlist_has(&opts, "--roots") &&
                    strlist_has(&opts, "--weight"),
                "topos: only %d options found", opts.n);
  char *page = page_text(TOPOS_PAGE);
  char *missing = missing_entries(page, &cmds);
  ck_assert_msg(missing[0] == '\0',
                "%s has no .TP entry for these commands of topos --help:\n%s",
                TOPOS_PAGE, missing);
  free(missing);
  missing = missing_entries(page, &opts);
  ck_assert_msg(missing[0] == '\0',
                "%s has no .TP entry for these options of topos's "
                "--help outputs:\n%s",
                TOPOS_PAGE, missing);
  free(missing);
  free(page);
  free(help);
  strlist_free(&cmds);
  strlist_free(&opts);
  strlist_free(&words);
}
END_TEST

START_TEST(test_pages_render_cleanly) {
  if (!have_groff()) {
    printf("man: groff is not installed; the rendering check is skipped\n");
    return;
  }
  const char *pages[] = {TOPOSD_PAGE, TOPOS_PAGE};
  for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
    ck_assert_msg(access(pages[i], R_OK) == 0, "%s: %s", pages[i],
                  strerror(errno));
    int status = 0;
    char *out = render_warnings(pages[i], &status);
    ck_assert_msg(status == 0 && out[0] == '\0',
                  "groff -man -Tutf8 -ww -z %s: exit status %d:\n%s", pages[i],
                  status, out);
    free(out);
  }
}
END_TEST

START_TEST(test_th_version) {
  const struct {
    const char *path, *title, *section;
  } pages[] = {{TOPOSD_PAGE, "TOPOSD", "8"}, {TOPOS_PAGE, "TOPOS", "1"}};
  for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
    char *page = page_text(pages[i].path);
    char buf[512], *args[5];
    int n = th_args(page, buf, sizeof buf, args, 5);
    ck_assert_msg(n >= 4, "%s: no .TH line with a footer (%d arguments)",
                  pages[i].path, n);
    ck_assert_str_eq(args[0], pages[i].title);
    ck_assert_str_eq(args[1], pages[i].section);
    ck_assert_msg(strcmp(args[3], "topos " TOPOS_VERSION) == 0,
                  "%s: .TH footer \"%s\", want \"topos %s\" (engine/topos.h)",
                  pages[i].path, args[3], TOPOS_VERSION);
    free(page);
  }
}
END_TEST

/* Each check catches a fault: a page that lost an entry, a stale
 * version, a page groff warns about. */
START_TEST(test_checks_catch_faults) {
  char *page = page_text(TOPOSD_PAGE);
  ck_assert(page_has_entry(page, "--listen"));
  ck_assert(page_has_entry(page, "--http"));
  /* A prefix is not an entry: --http-body is no option's tag. */
  ck_assert(!page_has_entry(page, "--http-body"));
  ck_assert(!page_has_entry(page, "--no-such-option"));
  /* Every "\-\-listen" of the page misspelt: the entry is gone. */
  int spelt = 0;
  for (char *p = strstr(page, "\\-\\-listen"); p != NULL;
       p = strstr(p, "\\-\\-listen"))
    p[7] = 'x', spelt++;
  ck_assert_int_gt(spelt, 0);
  ck_assert(!page_has_entry(page, "--listen"));
  strlist one = {0};
  strlist_add(&one, "--listen", 8);
  char *missing = missing_entries(page, &one);
  ck_assert_str_eq(missing, "  --listen\n");
  free(missing);
  strlist_free(&one);
  free(page);

  /* A footer of another version is told apart. */
  char buf[256], *args[5];
  const char *stale =
      ".\\\" c\n.TH TOPOSD 8 2026-01-01 \"topos 0.0.9\" \"S\"\n";
  ck_assert_int_eq(th_args(stale, buf, sizeof buf, args, 5), 5);
  ck_assert_str_eq(args[3], "topos 0.0.9");
  ck_assert_str_ne(args[3], "topos " TOPOS_VERSION);
  ck_assert_int_eq(th_args(".SH NAME\n", buf, sizeof buf, args, 5), -1);

  /* topos's command reading: prose and variables are no commands. */
  strlist cmds = {0};
  topos_commands(
      "commands:\n  stats\n  emit ID [ENTRY] the plan\n"
      "  tenant add NAME | tenant list\n  on the store file (--store P)\n"
      "  admin tenant's token\n  $TOPOS_STORE, else\n   deeper ID\n",
      &cmds);
  ck_assert_int_eq(cmds.n, 4);
  ck_assert(strlist_has(&cmds, "stats") && strlist_has(&cmds, "emit") &&
            strlist_has(&cmds, "tenant add") &&
            strlist_has(&cmds, "tenant list"));
  strlist_free(&cmds);

  /* An unknown macro is a warning groff prints. */
  if (!have_groff()) {
    printf("man: groff is not installed; its fault check is skipped\n");
    return;
  }
  char path[] = "/tmp/topos-man-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
  const char bad[] = ".TH X 8 2026-12-04 \"topos " TOPOS_VERSION
                     "\" \"S\"\n"
                     ".SH NAME\nx \\- y\n.XY z\n";
  ck_assert_int_eq(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
  close(fd);
  int status = 0;
  char *out = render_warnings(path, &status);
  unlink(path);
  ck_assert_msg(out[0] != '\0' && strstr(out, "XY") != NULL,
                "groff said nothing of an unknown macro (status %d)", status);
  free(out);
}
END_TEST

Suite *man_suite(void) {
  Suite *s = suite_create("man");
  TCase *tc = tcase_create("pages");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_toposd_options_documented);
  tcase_add_test(tc, test_topos_commands_and_options_documented);
  tcase_add_test(tc, test_pages_render_cleanly);
  tcase_add_test(tc, test_th_version);
  tcase_add_test(tc, test_checks_catch_faults);
  suite_add_tcase(s, tc);
  return s;
}
