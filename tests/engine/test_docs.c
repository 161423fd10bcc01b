/*
 * test_docs.c - the documentation stands alone and agrees with the code.
 *
 *  - Nothing in the tree (docs, README.md, the sources, tests, tools,
 *    deploy files, the Makefile) points at design notes kept outside the
 *    repository: none holds the needles below.  Build directories,
 *    dot-directories, virtual environments and binary files are skipped.
 *  - Every relative markdown link of the docs (docs/NAME.md) and of
 *    README.md names a file that exists (web links, mailto: and pure
 *    #anchors are not checked; a link's #anchor is dropped before the
 *    path is looked up).
 *  - Every op of the engine's op list (engine/ops.h, the order of
 *    topos_op_code) is named in docs/ops.md as `name`.
 *  - Every rpc of proto/topos.proto is named in docs/protocol.md as
 *    `Name`.
 *  - No doc says the project has "no BLAS" (backends/blas.c is the
 *    OpenBLAS backend of the fast posture).
 *
 * The runner starts in the repository root; when it does not, the tree
 * is looked for above the test binary (build/tests, build/X/tests).
 * Paths are built from that root, so the process's directory is never
 * changed.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops.h"
#include "topos.h"

/* -------------------------------------------------------------- the tree */

static char g_root[PATH_MAX];

static bool exists_at(const char *dir, const char *rel) {
  char path[PATH_MAX + 64];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  return stat(path, &st) == 0;
}

static bool is_root(const char *dir) {
  return exists_at(dir, "proto/topos.proto") && exists_at(dir, "docs") &&
         exists_at(dir, "engine/ops.h");
}

/* The repository root: ".", or a directory above the test binary. */
static const char *root(void) {
  if (g_root[0]) return g_root;
  if (is_root(".")) {
    snprintf(g_root, sizeof g_root, ".");
    return g_root;
  }
  char dir[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
  if (n > 0) {
    dir[n] = '\0';
    for (int up = 0; up < 6 && !g_root[0]; up++) {
      char *slash = strrchr(dir, '/');
      if (slash == NULL || slash == dir) break;
      *slash = '\0';
      if (is_root(dir)) snprintf(g_root, sizeof g_root, "%s", dir);
    }
  }
  ck_assert_msg(g_root[0] != '\0',
                "cannot find the source tree (run the tests from the "
                "repository root)");
  return g_root;
}

/* The path of rel under the root, in buf. */
static const char *at_root(const char *rel, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", root(), rel);
  return buf;
}

/* The path as the tree names it ("docs/ops.md"), for messages. */
static const char *tree_name(const char *path) {
  size_t n = strlen(root());
  if (strncmp(path, root(), n) == 0 && path[n] == '/') return path + n + 1;
  return path;
}

/* A file's bytes, NUL-terminated (new; free()), or NULL. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf != NULL) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *grown = realloc(buf, cap * 2 + 1);
    if (grown == NULL) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  bool bad = ferror(f) != 0;
  fclose(f);
  if (buf == NULL || bad) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  if (len != NULL) *len = n;
  return buf;
}

/* A file under the root that must exist. */
static char *slurp_rel(const char *rel) {
  char path[PATH_MAX + 64];
  char *text = slurp(at_root(rel, path, sizeof path), NULL);
  ck_assert_msg(text != NULL, "cannot read %s", rel);
  return text;
}

/* The 1-based line of offset at in text. */
static int line_of(const char *text, const char *at) {
  int line = 1;
  for (const char *p = text; p < at; p++) line += *p == '\n';
  return line;
}

/* What a failing case lists: the first findings, and how many in all. */
typedef struct findings {
  char text[4096];
  size_t used;
  int count;
} findings;

static void note(findings *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note(findings *f, const char *fmt, ...) {
  f->count++;
  if (f->count > 12 || f->used >= sizeof f->text - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(f->text + f->used, sizeof f->text - f->used, fmt, ap);
  va_end(ap);
  if (n > 0) f->used += (size_t)n;
  if (f->used > sizeof f->text - 1) f->used = sizeof f->text - 1;
}

static int by_name(const void *a, const void *b) {
  return strcmp(a, b);
}

/* The markdown files the link and wording checks read: docs/NAME.md, sorted,
 * then README.md.  Returns how many (at most max), paths relative to the
 * root. */
static int markdown_files(char names[][PATH_MAX], int max) {
  char dir[PATH_MAX + 64];
  DIR *d = opendir(at_root("docs", dir, sizeof dir));
  ck_assert_msg(d != NULL, "cannot open docs/");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < max - 1) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || len < 4 || strcmp(e->d_name + len - 3, ".md"))
      continue;
    snprintf(names[n++], PATH_MAX, "docs/%s", e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, PATH_MAX, by_name);
  snprintf(names[n++], PATH_MAX, "README.md");
  return n;
}

enum { MAX_DOCS = 128 };
static char g_docs[MAX_DOCS][PATH_MAX];

/* --------------------------------------------------- outside references */

/* Written in pieces so this file does not hold what it looks for. */
static const char *const g_needles[] = {
    "../"
    "shared",
    "shared"
    "/design",
    "/work"
    "/shared",
};
#define NNEEDLES (sizeof g_needles / sizeof g_needles[0])

static findings g_outside;
static int g_scanned;

/* Directories never scanned: build outputs, dot-directories (.git, tool
 * caches), virtual environments and Python caches. */
static bool skipped_dir(const char *base) {
  return base[0] == '.' || strncmp(base, "build", 5) == 0 ||
         strstr(base, "venv") != NULL || strcmp(base, "__pycache__") == 0;
}

static int scan_entry(const char *path, const struct stat *st, int type,
                      struct FTW *ftw) {
  (void)st;
  if (type == FTW_D)
    return ftw->level > 0 && skipped_dir(path + ftw->base) ? FTW_SKIP_SUBTREE
                                                           : FTW_CONTINUE;
  if (type != FTW_F) return FTW_CONTINUE;
  size_t len = 0;
  char *text = slurp(path, &len);
  if (text == NULL) {
    note(&g_outside, "  %s: unreadable\n", tree_name(path));
    return FTW_CONTINUE;
  }
  if (memchr(text, '\0', len) == NULL) { /* text files only */
    g_scanned++;
    for (size_t k = 0; k < NNEEDLES; k++)
      for (const char *hit = strstr(text, g_needles[k]); hit != NULL;
           hit = strstr(hit + 1, g_needles[k]))
        note(&g_outside, "  %s:%d: %s\n", tree_name(path), line_of(text, hit),
             g_needles[k]);
  }
  free(text);
  return FTW_CONTINUE;
}

START_TEST(test_no_outside_references) {
  static const char *const tops[] = {
      "docs",   "README.md", "deploy", "engine",   "backends",
      "server", "client",    "proto",  "store",    "examples",
      "tests",  "tools",     "bench",  "Makefile",
  };
  memset(&g_outside, 0, sizeof g_outside);
  g_scanned = 0;
  for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++) {
    char path[PATH_MAX + 64];
    at_root(tops[i], path, sizeof path);
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "%s is missing", tops[i]);
    ck_assert_int_eq(nftw(path, scan_entry, 16, FTW_PHYS | FTW_ACTIONRETVAL),
                     0);
  }
  /* The tree holds hundreds of text files: far fewer means the walk
   * skipped what it should have read. */
  ck_assert_msg(g_scanned > 100, "only %d text files scanned", g_scanned);
  ck_assert_msg(g_outside.count == 0,
                "%d references to design notes outside the repository "
                "(the project's own docs are docs/*.md):\n%s",
                g_outside.count, g_outside.text);
}
END_TEST

/* ----------------------------------------------------------------- links */

/* Checks the link target at s (up to ')'), found in doc; counts it. */
static void check_link(const char *doc, int line, const char *s, size_t n,
                       findings *bad, int *checked) {
  char target[PATH_MAX];
  if (n >= sizeof target) n = sizeof target - 1;
  memcpy(target, s, n);
  target[n] = '\0';
  /* <path> and [text](path "title") forms. */
  char *t = target;
  if (*t == '<') {
    t++;
    char *close = strchr(t, '>');
    if (close) *close = '\0';
  }
  char *space = strpbrk(t, " \t");
  if (space) *space = '\0';
  if (*t == '\0' || *t == '#' || strstr(t, "://") != NULL ||
      strncmp(t, "mailto:", 7) == 0)
    return;
  char *cut = strpbrk(t, "#?");
  if (cut) *cut = '\0';
  (*checked)++;
  if (t[0] == '/') {
    note(bad, "  %s:%d: %s is an absolute path\n", doc, line, t);
    return;
  }
  char dir[PATH_MAX];
  size_t dn = strlen(doc) < sizeof dir ? strlen(doc) : sizeof dir - 1;
  memcpy(dir, doc, dn);
  dir[dn] = '\0';
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  char rel[2 * PATH_MAX + 8], path[3 * PATH_MAX + 64];
  snprintf(rel, sizeof rel, "%s/%s", dir, t);
  struct stat st;
  if (stat(at_root(rel, path, sizeof path), &st) != 0)
    note(bad, "  %s:%d: %s does not exist\n", doc, line, t);
}

/* Every `](target)` of one markdown file outside code (fenced blocks and
 * `inline code`). */
static void check_links_of(const char *doc, findings *bad, int *checked) {
  char *text = slurp_rel(doc);
  bool fence = false;
  int line = 0;
  for (char *p = text; *p != '\0';) {
    char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    line++;
    const char *q = p;
    while (q < p + len && (*q == ' ' || *q == '\t')) q++;
    if (strncmp(q, "```", 3) == 0 || strncmp(q, "~~~", 3) == 0) {
      fence = !fence;
    } else if (!fence) {
      bool code = false;
      for (size_t i = 0; i + 1 < len; i++) {
        if (p[i] == '`') code = !code;
        if (code || p[i] != ']' || p[i + 1] != '(') continue;
        const char *s = p + i + 2;
        const char *close = memchr(s, ')', len - (i + 2));
        if (close == NULL) {
          note(bad, "  %s:%d: unclosed link\n", doc, line);
          continue;
        }
        check_link(doc, line, s, (size_t)(close - s), bad, checked);
      }
    }
    p += len + (end != NULL);
  }
  free(text);
}

START_TEST(test_relative_links_resolve) {
  int n = markdown_files(g_docs, MAX_DOCS);
  findings bad = {0};
  int checked = 0;
  for (int i = 0; i < n; i++) check_links_of(g_docs[i], &bad, &checked);
  /* docs/architecture.md links the detailed documents. */
  ck_assert_msg(checked >= 10, "only %d relative links found", checked);
  ck_assert_msg(bad.count == 0, "%d broken links:\n%s", bad.count, bad.text);
}
END_TEST

/* ------------------------------------------------------------------- ops */

static const char *const g_op_names[OP_COUNT] = {
#define NAME_OF(E, name, arity, family, reads, linear, rule, attrs) \
  [OP_##E] = name,
    TOPOS_OPS(NAME_OF)
#undef NAME_OF
};

START_TEST(test_every_op_documented) {
  ck_assert_int_eq(topos_op_count(), OP_COUNT);
  char *ops = slurp_rel("docs/ops.md");
  findings missing = {0};
  for (int op = 0; op < OP_COUNT; op++) {
    ck_assert_int_eq(topos_op_code(g_op_names[op]), op);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "`%s`", g_op_names[op]);
    if (strstr(ops, quoted) == NULL) note(&missing, "  %s\n", quoted);
  }
  free(ops);
  ck_assert_msg(missing.count == 0,
                "%d ops of engine/ops.h are not named in docs/ops.md:\n%s",
                missing.count, missing.text);
}
END_TEST

/* ------------------------------------------------------------------ rpcs */

START_TEST(test_every_rpc_documented) {
  char *proto = slurp_rel("proto/topos.proto");
  char *doc = slurp_rel("docs/protocol.md");
  findings missing = {0};
  int rpcs = 0;
  for (char *p = proto; *p != '\0';) {
    char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *q = p;
    while (q < p + len && isspace((unsigned char)*q)) q++;
    if (strncmp(q, "rpc", 3) == 0 && isspace((unsigned char)q[3])) {
      q += 3;
      while (isspace((unsigned char)*q)) q++;
      const char *name = q;
      while (isalnum((unsigned char)*q) || *q == '_') q++;
      size_t n = (size_t)(q - name);
      while (isspace((unsigned char)*q)) q++;
      ck_assert_msg(n > 0 && n < 60 && *q == '(',
                    "proto/topos.proto:%d: cannot read the rpc",
                    line_of(proto, p));
      char quoted[64];
      snprintf(quoted, sizeof quoted, "`%.*s`", (int)n, name);
      rpcs++;
      if (strstr(doc, quoted) == NULL) note(&missing, "  %s\n", quoted);
    }
    p += len + (end != NULL);
  }
  free(proto);
  free(doc);
  ck_assert_msg(rpcs > 0, "no rpc found in proto/topos.proto");
  ck_assert_msg(missing.count == 0,
                "%d of the %d rpcs of proto/topos.proto are not named in "
                "docs/protocol.md:\n%s",
                missing.count, rpcs, missing.text);
}
END_TEST

/* ------------------------------------------------------------ no "no BLAS" */

/* The text lowercased, without `code` and *emphasis* marks, each run of
 * whitespace (line breaks included) one space. */
static void flatten(char *text) {
  char *out = text;
  bool space = false;
  for (const char *p = text; *p != '\0'; p++) {
    if (*p == '`' || *p == '*') continue;
    if (isspace((unsigned char)*p)) {
      space = true;
      continue;
    }
    if (space && out != text) *out++ = ' ';
    space = false;
    *out++ = (char)tolower((unsigned char)*p);
  }
  *out = '\0';
}

START_TEST(test_no_doc_denies_blas) {
  int n = markdown_files(g_docs, MAX_DOCS);
  findings bad = {0};
  for (int i = 0; i < n; i++) {
    char *text = slurp_rel(g_docs[i]);
    flatten(text);
    static const char *const claims[] = {"no blas", "no openblas"};
    for (size_t k = 0; k < 2; k++)
      for (const char *hit = strstr(text, claims[k]); hit != NULL;
           hit = strstr(hit + 1, claims[k]))
        if (hit == text || !isalnum((unsigned char)hit[-1]))
          note(&bad, "  %s: \"...%.60s...\"\n", g_docs[i], hit);
    free(text);
  }
  ck_assert_msg(bad.count == 0,
                "%d places say there is no BLAS; backends/blas.c is the "
                "OpenBLAS backend of the fast posture:\n%s",
                bad.count, bad.text);
}
END_TEST

Suite *docs_suite(void) {
  Suite *s = suite_create("docs");
  TCase *tc = tcase_create("docs");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_no_outside_references);
  tcase_add_test(tc, test_relative_links_resolve);
  tcase_add_test(tc, test_every_op_documented);
  tcase_add_test(tc, test_every_rpc_documented);
  tcase_add_test(tc, test_no_doc_denies_blas);
  suite_add_tcase(s, tc);
  return s;
}
