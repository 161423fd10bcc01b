/*
 * page.c - the HTML graph page of a spec (page.h).
 *
 * Everything that comes from a spec (its id, the entry's label, the plan
 * and the StableHLO, which carry node names) is HTML-escaped here.  The
 * SVG is not: Graphviz escapes the labels it writes (svg.c renders the
 * engine's DOT, whose labels hold the names), and escaping it again would
 * show entities as text.  Its XML prolog goes, since a document type
 * inside HTML is an error and the DTD would be an external resource.
 */
#include "page.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "text_buf.h"

static void put(text_buf *b, const char *s) {
  text_put(b, s, strlen(s));
}

/* s with & < > " ' as entities, so it is text in an element or an
 * attribute value; runs of other bytes go as they are. */
static void put_escaped(text_buf *b, const char *s) {
  const char *run = s;
  for (; *s; s++) {
    const char *ent = NULL;
    switch (*s) {
      case '&':
        ent = "&amp;";
        break;
      case '<':
        ent = "&lt;";
        break;
      case '>':
        ent = "&gt;";
        break;
      case '"':
        ent = "&quot;";
        break;
      case '\'':
        ent = "&#39;";
        break;
      default:
        continue;
    }
    text_put(b, run, (size_t)(s - run));
    put(b, ent);
    run = s + 1;
  }
  text_put(b, run, (size_t)(s - run));
}

/* The svg element and what follows it: Graphviz writes an XML
 * declaration, a DOCTYPE and comments before it. */
static const char *svg_element(const char *svg) {
  for (const char *p = strstr(svg, "<svg"); p; p = strstr(p + 4, "<svg")) {
    char c = p[4];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '>') return p;
  }
  return svg;
}

char *page_html(const char *spec_id, const char *svg, const char *plan_text,
                const char *entry_label, const char *stablehlo, size_t *len) {
  if (len != NULL) *len = 0;
  if (spec_id == NULL || svg == NULL) return NULL;
  text_buf b = {0};
  put(&b,
      "<!DOCTYPE html>\n"
      "<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>topos spec ");
  put_escaped(&b, spec_id);
  put(&b,
      "</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 1.5em; color: #222; }\n"
      "h1 { font-size: 1.2em; word-break: break-all; }\n"
      "h2 { font-size: 1.05em; margin-top: 1.5em; }\n"
      "code, pre { font-family: monospace; }\n"
      "pre { background: #f6f6f6; padding: 0.8em; overflow: auto; }\n"
      "#graph { overflow: auto; border: 1px solid #ddd; }\n"
      ".none { color: #777; font-style: italic; }\n"
      "</style>\n</head>\n<body>\n<h1>topos spec <code>");
  put_escaped(&b, spec_id);
  put(&b, "</code></h1>\n<section id=\"graph\">\n<h2>Graph</h2>\n");
  put(&b, svg_element(svg));
  put(&b, "\n</section>\n<section id=\"plan\">\n<h2>Plan</h2>\n");
  if (entry_label != NULL) {
    put(&b, "<p>For the entry <code>");
    put_escaped(&b, entry_label);
    put(&b, "</code>.</p>\n");
  }
  if (plan_text != NULL) {
    put(&b, "<pre>");
    put_escaped(&b, plan_text);
    put(&b, "</pre>\n");
  } else {
    put(&b, "<p class=\"none\">No plan.</p>\n");
  }
  put(&b, "</section>\n<section id=\"stablehlo\">\n<h2>StableHLO</h2>\n");
  if (stablehlo != NULL) {
    put(&b, "<pre>");
    put_escaped(&b, stablehlo);
    put(&b, "</pre>\n");
  } else {
    put(&b, "<p class=\"none\">No StableHLO.</p>\n");
  }
  put(&b, "</section>\n</body>\n</html>\n");
  if (b.failed) {
    free(b.data);
    return NULL;
  }
  if (len != NULL) *len = b.len;
  return b.data;
}
