/*
 * test_page.c - the graph page (GET /specs/{id}, server/gateway.c and
 * server/page.c) in a real browser: headless Chromium loads the page of a
 * recorded network from a real toposd and the test reads back what the
 * browser made of it.
 *
 * The DOM is Chromium's own serialization after parsing (--dump-dom), so
 * the node groups counted in it are the ones the browser found in the
 * inline SVG, and the sections are where the parser put them: markup that
 * escaped its section would move them.  The screenshot is decoded here
 * (zlib, which the runner links) and must not be blank; it is kept at
 * $TOPOS_BUILD/test-artifacts/graph-page.png for a person to look at.
 * The error pages (an unknown id, an entry that cannot be planned) are
 * checked over plain HTTP.
 *
 * Chromium is a test dependency (`make deps`): without it the suite fails
 * and says so rather than skipping.  Two browser launches in all, each a
 * few seconds.
 */
#include <zlib.h>

#include "harness.h"
#include "http_client.h"

/* ------------------------------------------------------------ the browser */

/* The chromium binary: $TOPOS_CHROMIUM, else `chromium` on PATH; NULL
 * when there is none. */
static const char *chromium_path(char *out, size_t outlen) {
  const char *given = getenv("TOPOS_CHROMIUM");
  if (given && *given) {
    snprintf(out, outlen, "%s", given);
    return access(out, X_OK) == 0 ? out : NULL;
  }
  const char *path = getenv("PATH");
  char *dirs = strdup(path && *path ? path : "/usr/bin:/bin");
  const char *found = NULL;
  char *save = NULL;
  for (char *d = strtok_r(dirs, ":", &save); d && !found;
       d = strtok_r(NULL, ":", &save)) {
    snprintf(out, outlen, "%s/chromium", d);
    if (access(out, X_OK) == 0) found = out;
  }
  free(dirs);
  return found;
}

/* A whole file as a NUL-terminated string (NULL when it cannot be read);
 * *len its size.  Free with free(). */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
  }
  fclose(f);
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

/* The last `keep` bytes of a file, for failure messages. */
static void file_tail(const char *path, char *out, size_t keep) {
  size_t n = 0;
  char *all = slurp(path, &n);
  if (all == NULL) {
    snprintf(out, keep, "(no %s)", path);
    return;
  }
  snprintf(out, keep, "%s", n >= keep ? all + n - keep + 1 : all);
  free(all);
}

/* Loads url in headless Chromium with a throwaway profile under dir and
 * returns the DOM after load (free with free()); with a screenshot path,
 * also a 1400x1800 screenshot there.  Chromium's stderr (dbus and crashpad
 * noise as root in a container) goes to a file whose end failures show. */
static char *browse(const char *dir, const char *tag, const char *url,
                    const char *screenshot) {
  char chromium[512];
  ck_assert_msg(chromium_path(chromium, sizeof chromium) != NULL,
                "chromium is not installed (looked for $TOPOS_CHROMIUM, "
                "else chromium on PATH): the graph page is tested in a "
                "real browser; `make deps` installs it (tools/deps.sh)");
  char dom[400], err[400], shot[600] = "", cmd[3000];
  snprintf(dom, sizeof dom, "%s/%s.dom.html", dir, tag);
  snprintf(err, sizeof err, "%s/%s.chromium.log", dir, tag);
  if (screenshot != NULL)
    snprintf(shot, sizeof shot, " --screenshot='%s' --window-size=1400,1800",
             screenshot);
  /* As root in CI: no sandbox; no display: the new headless mode.  A
   * small /dev/shm in containers is why the shared memory goes to /tmp. */
  snprintf(cmd, sizeof cmd,
           "timeout 60 '%s' --headless --no-sandbox --disable-gpu "
           "--disable-dev-shm-usage --no-first-run --hide-scrollbars "
           "--user-data-dir='%s/%s.profile' --dump-dom%s '%s' "
           ">'%s' 2>'%s' </dev/null",
           chromium, dir, tag, shot, url, dom, err);
  double t0 = now_s();
  int status = system(cmd);
  char tail[1600];
  file_tail(err, tail, sizeof tail);
  ck_assert_msg(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "chromium on %s: exit %d after %.1f s (124: timed out); "
                "its stderr ends:\n%s",
                url, WIFEXITED(status) ? WEXITSTATUS(status) : -1, now_s() - t0,
                tail);
  size_t n = 0;
  char *text = slurp(dom, &n);
  ck_assert_msg(text != NULL && n > 0,
                "chromium on %s dumped no DOM; its stderr ends:\n%s", url,
                tail);
  return text;
}

/* ------------------------------------------------------------ the DOM */

/* How many times needle occurs in s. */
static int count_of(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* The markup of <section id="name"> up to its end tag (free with free()),
 * or NULL when the document has no such section. */
static char *section_of(const char *doc, const char *name) {
  char open[64];
  snprintf(open, sizeof open, "<section id=\"%s\">", name);
  const char *start = strstr(doc, open);
  if (start == NULL) return NULL;
  const char *end = strstr(start, "</section>");
  if (end == NULL) return NULL;
  return strndup(start, (size_t)(end - start));
}

static char *assert_section(const char *doc, const char *name) {
  char *s = section_of(doc, name);
  ck_assert_msg(s != NULL, "no section %s in the DOM: %.400s", name, doc);
  return s;
}

/* The text of the first <pre> in s (free with free()), or NULL. */
static char *pre_of(const char *s) {
  const char *start = strstr(s, "<pre>");
  if (start == NULL) return NULL;
  start += 5;
  const char *end = strstr(start, "</pre>");
  return end ? strndup(start, (size_t)(end - start)) : NULL;
}

/* The page as the browser parsed it: three sections in order, the graph
 * with one node group per node of net and every node's label, the
 * StableHLO as text.  Returns the plan's text (free with free()). */
static char *assert_page_dom(const char *dom, const topos_network *net) {
  ck_assert_msg(strstr(dom, "<title>topos spec ") != NULL, "%.300s", dom);
  ck_assert_int_eq(count_of(dom, "<section id="), 3);
  const char *g = strstr(dom, "<section id=\"graph\">");
  const char *p = strstr(dom, "<section id=\"plan\">");
  const char *h = strstr(dom, "<section id=\"stablehlo\">");
  ck_assert_msg(g && p && h && g < p && p < h, "sections out of order");
  ck_assert_msg(strstr(dom, "<?xml") == NULL, "an XML prolog in the DOM");

  char *graph = assert_section(dom, "graph");
  ck_assert_int_eq(count_of(graph, "<svg"), 1);
  ck_assert_msg(strstr(graph, "</svg>") != NULL, "the SVG is not closed");
  int nodes = topos_network_node_count(net);
  ck_assert_msg(count_of(graph, "class=\"node\"") == nodes,
                "%d node groups in the graph section, the network has %d",
                count_of(graph, "class=\"node\""), nodes);
  ck_assert_int_eq(count_of(dom, "class=\"node\""), nodes);
  int named = 0;
  for (int i = 0; i < nodes; i++) {
    char head[64];
    snprintf(head, sizeof head, "<g id=\"node%d\" class=\"node\">", i + 1);
    ck_assert_msg(strstr(graph, head) != NULL, "no %s in the graph", head);
    const char *name = topos_network_name_of(net, topos_network_value(net, i));
    if (name == NULL) continue;
    char label[128];
    snprintf(label, sizeof label, ">%%%d %s</text>", i, name);
    ck_assert_msg(strstr(graph, label) != NULL, "node %d: no %s in the graph",
                  i, label);
    named++;
  }
  ck_assert_int_ge(named, 8); /* W1 b1 W2 b2 x y logits loss */
  free(graph);

  char *hlo_section = assert_section(dom, "stablehlo");
  char *hlo = pre_of(hlo_section);
  ck_assert_msg(hlo != NULL && (strstr(hlo, "func.func") != NULL ||
                                strstr(hlo, "stablehlo.") != NULL),
                "the StableHLO section: %.600s", hlo_section);
  ck_assert_msg(strstr(hlo, "not available") == NULL, "%.600s", hlo);
  free(hlo);
  free(hlo_section);

  char *plan_section = assert_section(dom, "plan");
  char *plan = pre_of(plan_section);
  ck_assert_msg(plan != NULL && strlen(plan) > 40,
                "the plan section has no plan: %.600s", plan_section);
  /* topos_plan_describe's head line. */
  ck_assert_msg(strstr(plan, "plan: posture ") != NULL &&
                    strstr(plan, "fused groups; peak ") != NULL &&
                    strstr(plan, " bytes") != NULL &&
                    strstr(plan, "schedule (step:") != NULL,
                "the plan: %.600s", plan);
  free(plan_section);
  return plan;
}

/* ------------------------------------------------------------ the PNG */

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

static int paeth(int a, int b, int c) {
  int p = a + b - c;
  int pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)
 * and counts its pixels that are not near white.  Fails the test on
 * anything else. */
static void png_ink(const unsigned char *png, size_t n, uint32_t *w,
                    uint32_t *h, long *ink) {
  static const unsigned char magic[8] = {0x89, 'P',  'N',  'G',
                                         '\r', '\n', 0x1a, '\n'};
  ck_assert_msg(n > 33 && memcmp(png, magic, 8) == 0, "not a PNG");
  ck_assert_msg(memcmp(png + 12, "IHDR", 4) == 0, "no IHDR first");
  *w = be32(png + 16);
  *h = be32(png + 20);
  int depth = png[24], type = png[25], interlace = png[28];
  ck_assert_msg(depth == 8 && (type == 2 || type == 6) && interlace == 0,
                "a PNG of depth %d, colour type %d, interlace %d", depth, type,
                interlace);
  size_t bpp = type == 6 ? 4 : 3, stride = *w * bpp;
  size_t raw_len = (stride + 1) * *h;
  unsigned char *raw = malloc(raw_len);
  z_stream z = {0};
  ck_assert_int_eq(inflateInit(&z), Z_OK);
  z.next_out = raw;
  z.avail_out = (uInt)raw_len;
  int zs = Z_OK;
  for (size_t at = 8; at + 12 <= n && zs == Z_OK;) {
    uint32_t len = be32(png + at);
    ck_assert_msg(at + 12 + len <= n, "a PNG chunk runs past the end");
    if (memcmp(png + at + 4, "IDAT", 4) == 0) {
      z.next_in = (unsigned char *)png + at + 8;
      z.avail_in = len;
      zs = inflate(&z, Z_NO_FLUSH);
    }
    at += 12 + len;
  }
  inflateEnd(&z);
  ck_assert_msg(zs == Z_STREAM_END && z.total_out == raw_len,
                "the PNG's image data: zlib %d, %lu of %zu bytes", zs,
                (unsigned long)z.total_out, raw_len);
  /* Undo the per-row filters in place, then count. */
  *ink = 0;
  for (uint32_t y = 0; y < *h; y++) {
    unsigned char *row = raw + y * (stride + 1);
    unsigned char *up = y ? row - (stride + 1) + 1 : NULL;
    int filter = row[0];
    ck_assert_msg(filter <= 4, "row %u: filter %d", y, filter);
    unsigned char *px = row + 1;
    for (size_t i = 0; i < stride; i++) {
      int a = i >= bpp ? px[i - bpp] : 0, b = up ? up[i] : 0;
      int c = up && i >= bpp ? up[i - bpp] : 0;
      int pred = filter == 1   ? a
                 : filter == 2 ? b
                 : filter == 3 ? (a + b) / 2
                 : filter == 4 ? paeth(a, b, c)
                               : 0;
      px[i] = (unsigned char)(px[i] + pred);
    }
    for (uint32_t x = 0; x < *w; x++) {
      const unsigned char *p = px + x * bpp;
      if (p[0] < 200 || p[1] < 200 || p[2] < 200) (*ink)++;
    }
  }
  free(raw);
}

/* $TOPOS_BUILD/test-artifacts/graph-page.png, its directory made, any
 * earlier one removed (a stale file must not pass). */
static void artifact_path(char *out, size_t outlen) {
  const char *build = getenv("TOPOS_BUILD");
  char dir[400];
  snprintf(dir, sizeof dir, "%s/test-artifacts",
           build && *build ? build : "build");
  ck_assert_msg(mkdir(dir, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", dir,
                strerror(errno));
  snprintf(out, outlen, "%s/graph-page.png", dir);
  ck_assert_msg(unlink(out) == 0 || errno == ENOENT, "unlink %s: %s", out,
                strerror(errno));
}

/* ------------------------------------------------------------ the tests */

START_TEST(test_page_in_chromium) {
  daemon_proc d;
  client c;
  fixture_start(&d, &c, NULL);
  mlp_net m = mlp_network();
  char id[65];
  record(&c, m.net, id);
  char shot[512], url[256];
  artifact_path(shot, sizeof shot);

  /* The spec's outputs, forward: DOM and screenshot in one launch. */
  snprintf(url, sizeof url, "http://127.0.0.1:%d/specs/%s", d.http_port, id);
  char *dom = browse(d.dir, "forward", url, shot);
  ck_assert_msg(strstr(dom, id) != NULL, "the id is not on the page");
  char *plan = assert_page_dom(dom, m.net);
  ck_assert_msg(strstr(plan, "plan: posture forward") != NULL, "%.300s", plan);
  ck_assert_msg(strstr(dom, "the spec&#39;s outputs") != NULL ||
                    strstr(dom, "the spec's outputs") != NULL,
                "no entry label for the outputs");

  size_t n = 0;
  unsigned char *png = (unsigned char *)slurp(shot, &n);
  ck_assert_msg(png != NULL, "no screenshot at %s", shot);
  /* A blank 1400x1800 page compresses to about 11 KB. */
  ck_assert_msg(n > 10 * 1024, "the screenshot is %zu bytes", n);
  uint32_t w = 0, h = 0;
  long ink = 0;
  png_ink(png, n, &w, &h, &ink);
  ck_assert_msg(w == 1400 && h == 1800, "the screenshot is %ux%u", w, h);
  /* Text, node outlines and edges: well over a thousand dark pixels on a
   * drawn page, none on a blank one. */
  ck_assert_msg(ink > 5000, "the screenshot is blank: %ld inked pixels", ink);
  free(png);

  /* Training, with a named root: another plan, the same graph. */
  snprintf(url, sizeof url,
           "http://127.0.0.1:%d/specs/%s?posture=training&root=loss",
           d.http_port, id);
  char *train_dom = browse(d.dir, "training", url, NULL);
  char *train_plan = assert_page_dom(train_dom, m.net);
  ck_assert_msg(strstr(train_plan, "plan: posture training") != NULL, "%.300s",
                train_plan);
  ck_assert_msg(strcmp(plan, train_plan) != 0, "the same plan for both");
  char loss_root[32];
  snprintf(loss_root, sizeof loss_root, "roots: %%%d", m.loss.index);
  ck_assert_msg(strstr(train_plan, loss_root) != NULL, "%.300s", train_plan);
  ck_assert_msg(strstr(train_dom, "posture=training&amp;root=loss") != NULL,
                "no entry label for the query");

  free(train_plan);
  free(train_dom);
  free(plan);
  free(dom);
  topos_network_release(m.net);
  fixture_stop(&d, &c, 20);
}
END_TEST

START_TEST(test_page_errors) {
  daemon_proc d;
  client c;
  fixture_start(&d, &c, NULL);
  mlp_net m = mlp_network();
  char id[65], path[256], v[128];
  record(&c, m.net, id);
  http_reply r;

  /* An id nothing was recorded under: a JSON error, not a page. */
  snprintf(path, sizeof path, "/specs/%064d", 0);
  http_get(d.http_port, path, &r);
  HTTP_ASSERT_ERROR(&r, 404, "NOT_FOUND");
  ck_assert_str_eq(http_header(&r, "Content-Type", v, sizeof v),
                   "application/json");
  http_reply_clear(&r);

  /* An entry that cannot be planned: the graph, and the reason. */
  snprintf(path, sizeof path, "/specs/%s?root=nosuchname", id);
  http_get(d.http_port, path, &r);
  ck_assert_msg(r.status == 200, "%d: %s", r.status, r.body);
  ck_assert_msg(strncmp(http_header(&r, "Content-Type", v, sizeof v),
                        "text/html", 9) == 0,
                "content type %s", v);
  char *graph = section_of(r.body, "graph");
  ck_assert_ptr_nonnull(graph);
  ck_assert_int_eq(count_of(graph, "class=\"node\""),
                   topos_network_node_count(m.net));
  free(graph);
  char *plan = section_of(r.body, "plan");
  ck_assert_ptr_nonnull(plan);
  ck_assert_msg(strstr(plan, "not available: ") != NULL &&
                    strstr(plan, "nosuchname") != NULL,
                "the plan section: %s", plan);
  free(plan);
  char *hlo = section_of(r.body, "stablehlo");
  ck_assert_ptr_nonnull(hlo);
  ck_assert_msg(strstr(hlo, "not available: ") != NULL, "%s", hlo);
  ck_assert_msg(strstr(hlo, "func.func") == NULL, "%s", hlo);
  free(hlo);
  http_reply_clear(&r);

  topos_network_release(m.net);
  fixture_stop(&d, &c, 20);
}
END_TEST

Suite *page_suite(void) {
  Suite *s = suite_create("page");
  TCase *browser = tcase_create("browser");
  tcase_set_timeout(browser, 180);
  tcase_add_test(browser, test_page_in_chromium);
  suite_add_tcase(s, browser);
  TCase *http = tcase_create("http");
  tcase_set_timeout(http, 60);
  tcase_add_test(http, test_page_errors);
  suite_add_tcase(s, http);
  return s;
}
