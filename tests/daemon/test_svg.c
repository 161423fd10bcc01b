/*
 * test_svg.c - Describe's SVG format (server/svg.c through a real toposd
 * and the client library) and the HTML graph page (server/page.c).
 *
 * Daemon tests: the SVG of a recorded network has one `class="node"`
 * group per node and each node's label; a hostile node name comes out
 * escaped; a network over the node cap, or over the layout cap (one value
 * feeding a long chain), is RESOURCE_EXHAUSTED with advice to ask for DOT,
 * and the daemon goes on serving.  Unit tests, with svg.c and page.c
 * compiled into this file (the runner links no daemon objects): garbage
 * DOT fails with a message, and the page escapes every text and keeps
 * the drawing's nodes.
 */
#include "harness.h"
#include "topos_client.h"

#include "../../server/page.c"
#include "../../server/svg.c"
#include "../../server/text_buf.c"

static const char *const http_off[] = {"--http", "off", NULL};

static topos_client *connect_port(int port) {
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", port);
  topos_error err = {0};
  topos_client *c = topos_client_connect(address, &err);
  ck_assert_msg(c != NULL, "connect %s: %s", address, err.message);
  return c;
}

/* How many times needle occurs in s. */
static int count_of(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static char *record_and_svg(topos_client *c, const topos_network *net,
                            char id[65]) {
  topos_error err = {0};
  ck_assert_msg(topos_client_record(c, net, id, &err) == TOPOS_OK, "record: %s",
                err.message);
  char *svg = NULL;
  ck_assert_msg(topos_client_describe(c, id, TOPOS_CLIENT_FORMAT_SVG, &svg,
                                      &err) == TOPOS_OK,
                "describe svg: %s", err.message);
  return svg;
}

/* An SVG document as Graphviz writes it, one node group per node, each
 * node's label line "%i name" as a text element. */
static void assert_svg_of(const char *svg, const topos_network *net) {
  ck_assert_msg(strstr(svg, "<svg") != NULL, "no <svg in %.200s", svg);
  size_t n = strlen(svg);
  ck_assert_msg(n > 7 && strstr(svg + n - 8, "</svg>") != NULL,
                "does not end in </svg>: %s", svg + (n > 40 ? n - 40 : 0));
  int nodes = topos_network_node_count(net);
  ck_assert_int_eq(count_of(svg, "class=\"node\""), nodes);
  for (int i = 0; i < nodes; i++) {
    char head[64];
    snprintf(head, sizeof head, "<g id=\"node%d\" class=\"node\">", i + 1);
    ck_assert_msg(strstr(svg, head) != NULL, "no %s", head);
  }
}

START_TEST(test_svg_describe) {
  daemon_proc d;
  client raw;
  fixture_start(&d, &raw, http_off);
  topos_client *c = connect_port(d.port);
  gd_net g = gd_network(0.5);
  mlp_net m = mlp_network();
  const topos_network *nets[2] = {g.net, m.net};
  const char *names[2][6] = {{"w", "x", "y", "loss", NULL},
                             {"W1", "b1", "W2", "logits", "loss", NULL}};
  for (int k = 0; k < 2; k++) {
    char id[65];
    char *svg = record_and_svg(c, nets[k], id);
    assert_svg_of(svg, nets[k]);
    for (int j = 0; names[k][j]; j++) {
      topos_value v = topos_network_find(nets[k], names[k][j]);
      ck_assert(topos_value_ok(v));
      char text[64];
      snprintf(text, sizeof text, ">%%%d %s</text>", v.index, names[k][j]);
      ck_assert_msg(strstr(svg, text) != NULL, "no %s in the SVG", text);
    }
    topos_free(svg);
  }
  /* The same DOT through svg_render here gives the same node count. */
  char *dot = topos_network_describe(m.net, TOPOS_FORMAT_DOT, NULL);
  char *svg = NULL, msg[256];
  size_t len = 0;
  ck_assert_int_eq(svg_render(dot, strlen(dot), &svg, &len, msg, sizeof msg),
                   SVG_OK);
  ck_assert_uint_eq(len, strlen(svg));
  ck_assert_int_eq(count_of(svg, "class=\"node\""),
                   topos_network_node_count(m.net));
  free(svg);
  topos_free(dot);
  topos_network_release(g.net);
  topos_network_release(m.net);
  topos_client_close(c);
  fixture_stop(&d, &raw, 20);
}
END_TEST

#define HOSTILE "<script>alert(\"x&y\")</script> 'q' \\N"

START_TEST(test_svg_hostile_name) {
  daemon_proc d;
  client raw;
  fixture_start(&d, &raw, http_off);
  topos_client *c = connect_port(d.port);
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F64);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F64, 0.0, &err);
  topos_value x = topos_name(tape, topos_input(tape, zero), HOSTILE);
  topos_name(tape, topos_tanh(tape, x), "out");
  topos_tensor_release(zero);
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "%s", err.message);
  char id[65];
  char *svg = record_and_svg(c, net, id);
  assert_svg_of(svg, net);
  ck_assert_msg(strstr(svg, "<script") == NULL, "raw <script in %s", svg);
  ck_assert_msg(strstr(svg, "&lt;script&gt;") != NULL, "%s", svg);
  ck_assert_msg(strstr(svg, "x&amp;y") != NULL, "%s", svg);
  ck_assert_msg(strstr(svg, "\"x&") == NULL, "raw quote in %s", svg);
  /* The backslash-N stays text, not Graphviz's node-name escape. */
  ck_assert_msg(strstr(svg, "\\N") != NULL, "%s", svg);
  /* Graphviz said nothing to the daemon's log. */
  FILE *f = fopen(d.log, "r");
  ck_assert_ptr_nonnull(f);
  char line[1024];
  while (fgets(line, sizeof line, f))
    ck_assert_msg(strstr(line, "<script") == NULL, "log: %s", line);
  fclose(f);
  /* And the page keeps it escaped around the drawing. */
  size_t len = 0;
  char *page = page_html(id, svg, HOSTILE, HOSTILE, NULL, &len);
  ck_assert_ptr_nonnull(page);
  ck_assert_msg(strstr(page, "<script") == NULL, "raw <script in the page");
  ck_assert_int_eq(count_of(page, "class=\"node\""), 2);
  free(page);
  topos_free(svg);
  topos_network_release(net);
  topos_client_close(c);
  fixture_stop(&d, &raw, 20);
}
END_TEST

/* A tanh chain of n nodes in all (x and n - 1 tanh). */
static topos_network *chain_network(int n) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F32, 0.0, &err);
  topos_value v = topos_name(tape, topos_input(tape, zero), "x");
  topos_tensor_release(zero);
  for (int i = 1; i < n; i++) v = topos_tanh(tape, v);
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "chain: %s", err.message);
  ck_assert_int_eq(topos_network_node_count(net), n);
  return net;
}

/* One input added at every step of a chain of `steps`: few nodes, but
 * edges from it that span the whole depth. */
static topos_network *fan_network(int steps) {
  topos_error err = {0};
  topos_tape *tape = topos_tape_new(TOPOS_F32);
  topos_tensor *zero = topos_tensor_scalar(TOPOS_F32, 0.0, &err);
  topos_value v = topos_name(tape, topos_input(tape, zero), "x");
  topos_value s = topos_name(tape, topos_input(tape, zero), "s");
  topos_tensor_release(zero);
  for (int i = 0; i < steps; i++) v = topos_tanh(tape, topos_add(tape, v, s));
  topos_network *net = topos_tape_seal(tape, &err);
  ck_assert_msg(net != NULL, "fan: %s", err.message);
  return net;
}

static void assert_refused(topos_client *c, const topos_network *net,
                           const char *what) {
  topos_error err = {0};
  char id[65];
  ck_assert_int_eq(topos_client_record(c, net, id, &err), TOPOS_OK);
  char *svg = NULL;
  double t0 = now_s();
  int rc = topos_client_describe(c, id, TOPOS_CLIENT_FORMAT_SVG, &svg, &err);
  ck_assert_msg(rc != TOPOS_OK, "%s: rendered", what);
  ck_assert_ptr_null(svg);
  ck_assert_msg(now_s() - t0 < 5, "%s: refused only after %.1f s", what,
                now_s() - t0);
  ck_assert_int_eq(topos_client_grpc_status(err.code),
                   WIRE_GRPC_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(err.message, what) != NULL &&
                    strstr(err.message, "format dot") != NULL &&
                    strstr(err.message, "render it yourself") != NULL,
                "%s", err.message);
  /* DOT of the same spec still works. */
  char *dot = NULL;
  ck_assert_int_eq(topos_client_describe(c, id, TOPOS_FORMAT_DOT, &dot, &err),
                   TOPOS_OK);
  topos_free(dot);
}

START_TEST(test_svg_over_caps) {
  daemon_proc d;
  client raw;
  fixture_start(&d, &raw, http_off);
  topos_client *c = connect_port(d.port);
  topos_network *big = chain_network(SVG_MAX_NODES + 1);
  assert_refused(c, big, "nodes, over the 1000");
  topos_network *fan = fan_network(100);
  ck_assert_int_lt(topos_network_node_count(fan), SVG_MAX_NODES);
  assert_refused(c, fan, "layout is too large");
  /* The daemon goes on serving, SVG included: a chain at the cap's
   * tenth renders. */
  assert_serving(&raw);
  topos_network *small = chain_network(SVG_MAX_NODES / 10);
  char id[65];
  char *svg = record_and_svg(c, small, id);
  assert_svg_of(svg, small);
  topos_free(svg);
  topos_network_release(small);
  topos_network_release(fan);
  topos_network_release(big);
  topos_client_close(c);
  fixture_stop(&d, &raw, 20);
}
END_TEST

START_TEST(test_svg_render_garbage) {
  char msg[256];
  char *svg = (char *)1;
  size_t len = 7;
  const char *garbage = "this is { garbage";
  ck_assert_int_eq(
      svg_render(garbage, strlen(garbage), &svg, &len, msg, sizeof msg),
      SVG_ERR_INPUT);
  ck_assert_ptr_null(svg);
  ck_assert_uint_eq(len, 0);
  ck_assert_msg(strstr(msg, "does not parse") != NULL, "%s", msg);
  ck_assert_msg(strstr(msg, "syntax error") != NULL, "%s", msg);
  for (size_t i = 0; msg[i]; i++)
    ck_assert_msg(msg[i] >= 0x20 && msg[i] < 0x7F, "byte %zu of %s", i, msg);
  /* Empty text, a NUL inside, a long token, a NULL: messages, no crash. */
  ck_assert_int_eq(svg_render("", 0, &svg, &len, msg, sizeof msg),
                   SVG_ERR_INPUT);
  ck_assert_msg(msg[0] != '\0', "no message for empty text");
  ck_assert_int_eq(svg_render("digraph{a}\0x", 12, &svg, &len, msg, sizeof msg),
                   SVG_ERR_INPUT);
  ck_assert_msg(strstr(msg, "NUL") != NULL, "%s", msg);
  size_t n = 6000;
  char *longer = malloc(n + 32);
  strcpy(longer, "digraph { a -> ; ");
  memset(longer + strlen(longer), 'q', n);
  strcpy(longer + 17 + n, " }");
  ck_assert_int_eq(
      svg_render(longer, strlen(longer), &svg, &len, msg, sizeof msg),
      SVG_ERR_INPUT);
  free(longer);
  ck_assert_int_eq(svg_render(NULL, 0, &svg, &len, msg, sizeof msg),
                   SVG_ERR_INPUT);
  /* No msg buffer at all is fine too. */
  ck_assert_int_eq(svg_render(garbage, strlen(garbage), &svg, &len, NULL, 0),
                   SVG_ERR_INPUT);
  /* Graphviz still works after its parser failed, and reads only the
   * bytes it was given (no NUL needed after them). */
  const char *ok = "digraph { a -> b; }XXXX";
  ck_assert_int_eq(svg_render(ok, strlen(ok) - 4, &svg, &len, msg, sizeof msg),
                   SVG_OK);
  ck_assert_int_eq(count_of(svg, "class=\"node\""), 2);
  ck_assert_int_eq(count_of(svg, "class=\"edge\""), 1);
  free(svg);
}
END_TEST

START_TEST(test_page_html) {
  const char *dot = "digraph { n0 [label=\"a\"]; n1 [label=\"b\"]; n0 -> n1; }";
  char *svg = NULL, msg[256];
  size_t svg_len = 0, len = 0;
  ck_assert_int_eq(
      svg_render(dot, strlen(dot), &svg, &svg_len, msg, sizeof msg), SVG_OK);
  ck_assert_msg(strncmp(svg, "<?xml", 5) == 0, "prolog: %.60s", svg);
  const char *plan = "step 0: <add> & \"x\" 'y'";
  const char *hlo = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32>";
  char *page = page_html("<id&>", svg, plan, "roots=<loss>", hlo, &len);
  ck_assert_ptr_nonnull(page);
  ck_assert_uint_eq(len, strlen(page));
  ck_assert_msg(strncmp(page, "<!DOCTYPE html>", 15) == 0, "%.40s", page);
  ck_assert_msg(strstr(page, "<?xml") == NULL, "xml prolog kept");
  ck_assert_msg(strstr(page, "<!DOCTYPE svg") == NULL, "svg doctype kept");
  ck_assert_msg(strstr(page, "http://www.w3.org/Graphics/SVG/1.1/DTD") == NULL,
                "external DTD kept");
  ck_assert_msg(strstr(page, "<script") == NULL, "a script in the page");
  ck_assert(strstr(page, "id=\"graph\"") != NULL);
  ck_assert(strstr(page, "id=\"plan\"") != NULL);
  ck_assert(strstr(page, "id=\"stablehlo\"") != NULL);
  ck_assert(strstr(page, "<title>topos spec &lt;id&amp;&gt;</title>") != NULL);
  ck_assert(strstr(page, "<id&>") == NULL);
  ck_assert(
      strstr(page, "step 0: &lt;add&gt; &amp; &quot;x&quot; &#39;y&#39;") !=
      NULL);
  ck_assert(strstr(page, "roots=&lt;loss&gt;") != NULL);
  ck_assert(strstr(page, "tensor&lt;2xf32&gt;") != NULL);
  ck_assert(strstr(page, "tensor<2xf32>") == NULL);
  /* The drawing as Graphviz wrote it: its nodes, unescaped markup. */
  ck_assert_int_eq(count_of(page, "<g id=\"node1\" class=\"node\">"), 1);
  ck_assert_int_eq(count_of(page, "class=\"node\""), 2);
  ck_assert(strstr(page, strstr(svg, "<svg")) != NULL);
  /* Sections in order: graph, plan, StableHLO. */
  ck_assert(strstr(page, "id=\"graph\"") < strstr(page, "id=\"plan\""));
  ck_assert(strstr(page, "id=\"plan\"") < strstr(page, "id=\"stablehlo\""));
  free(page);
  /* Without a plan or StableHLO the sections say so. */
  page = page_html("abc", svg, NULL, NULL, NULL, NULL);
  ck_assert_ptr_nonnull(page);
  ck_assert(strstr(page, "No plan.") != NULL);
  ck_assert(strstr(page, "No StableHLO.") != NULL);
  ck_assert(strstr(page, "id=\"stablehlo\"") != NULL);
  free(page);
  ck_assert_ptr_null(page_html(NULL, svg, NULL, NULL, NULL, &len));
  ck_assert_uint_eq(len, 0);
  free(svg);
}
END_TEST

Suite *svg_suite(void) {
  Suite *s = suite_create("svg");
  TCase *rpc = tcase_create("describe");
  tcase_set_timeout(rpc, 120);
  tcase_add_test(rpc, test_svg_describe);
  tcase_add_test(rpc, test_svg_hostile_name);
  tcase_add_test(rpc, test_svg_over_caps);
  suite_add_tcase(s, rpc);
  TCase *unit = tcase_create("unit");
  tcase_set_timeout(unit, 60);
  tcase_add_test(unit, test_svg_render_garbage);
  tcase_add_test(unit, test_page_html);
  suite_add_tcase(s, unit);
  return s;
}
