/*
 * svg.c - DOT to SVG through Graphviz's library (svg.h).
 *
 * One GVC_t is created on first use, under the lock, and kept for the
 * process's life: creating it loads Graphviz's plugins, which costs more
 * than a small render, and nothing frees it at exit (the operating system
 * does; Graphviz's plugins keep memory of their own anyway).  Every call
 * into Graphviz happens under the same lock, because libgvc and cgraph
 * keep global state (the parser, the error hook, the layout's statics).
 *
 * Graphviz reports through agerr, which prints to stderr by default: the
 * daemon's log.  A node name in a hostile spec could then reach the log
 * unescaped, so an error function (agseterrf) collects the text instead,
 * and a failed render hands it back cleaned to printable ASCII.
 *
 * Before layout the graph is measured (layout_work): dot's cost grows
 * faster than its node count, and an edge that spans k ranks is k
 * virtual nodes to order and place, so nodes and spans are both capped,
 * and the network-simplex passes are bounded (nslimit, nslimit1).  The
 * layout itself cannot be interrupted: a call's deadline is not checked
 * inside it, which is what the caps are for.
 */
#include "svg.h"

#include <graphviz/gvc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t svg_lock = PTHREAD_MUTEX_INITIALIZER;
static GVC_t *svg_gvc;        /* under svg_lock; created once, kept */
static char svg_errors[512];  /* what agerr said during this render */
static size_t svg_errors_len; /* under svg_lock, like the buffer */

/* Graphviz's error hook (agseterrf): keeps the start of what is said,
 * drops the rest, prints nothing.  Called only under svg_lock, since
 * Graphviz runs only under it. */
static int collect_error(char *text) {
  size_t n = strlen(text);
  size_t room = sizeof svg_errors - 1 - svg_errors_len;
  if (n > room) n = room;
  memcpy(svg_errors + svg_errors_len, text, n);
  svg_errors_len += n;
  svg_errors[svg_errors_len] = '\0';
  return 0;
}

/* msg = prefix + detail, the detail cleaned to printable ASCII (a line
 * break or any other byte becomes a space) so it is safe in a status
 * text and a log line. */
static void say(char *msg, size_t msglen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *msg, size_t msglen, const char *fmt, ...) {
  if (msg == NULL || msglen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, msglen, fmt, ap);
  va_end(ap);
  size_t n = strlen(msg);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)msg[i];
    if (c < 0x20 || c > 0x7E) msg[i] = ' ';
  }
  while (n > 0 && msg[n - 1] == ' ') msg[--n] = '\0';
}

/* Graphviz's collected errors, or a fallback when it said nothing. */
static const char *errors_or(const char *fallback) {
  return svg_errors_len > 0 ? svg_errors : fallback;
}

/* An estimate of dot's work on g before it runs: the node count plus the
 * ranks each edge spans, with ranks from the longest path from the
 * sources and every source moved down to one rank above its nearest
 * consumer (dot's ranking shortens edges the same way).  Edges in a cycle
 * count one rank each.  Stops counting past `limit`; -1 when out of
 * memory. */
static long layout_work(Agraph_t *g, long limit) {
  int n = agnnodes(g), maxseq = 0;
  for (Agnode_t *v = agfstnode(g); v; v = agnxtnode(g, v))
    if ((int)AGSEQ(v) > maxseq) maxseq = (int)AGSEQ(v);
  size_t slots = (size_t)maxseq + 1;
  int *indeg = calloc(slots, sizeof *indeg);
  long *rank = calloc(slots, sizeof *rank);
  Agnode_t **queue = malloc(((size_t)n + 1) * sizeof *queue);
  long work = -1;
  if (indeg == NULL || rank == NULL || queue == NULL) goto done;
  int head = 0, tail = 0;
  for (Agnode_t *v = agfstnode(g); v; v = agnxtnode(g, v)) {
    for (Agedge_t *e = agfstin(g, v); e; e = agnxtin(g, e))
      if (agtail(e) != v) indeg[AGSEQ(v)]++;
    if (indeg[AGSEQ(v)] == 0) queue[tail++] = v;
  }
  /* Kahn's order: a node's rank is one past its deepest operand. */
  while (head < tail) {
    Agnode_t *u = queue[head++];
    for (Agedge_t *e = agfstout(g, u); e; e = agnxtout(g, e)) {
      Agnode_t *w = aghead(e);
      if (w == u) continue;
      if (rank[AGSEQ(w)] < rank[AGSEQ(u)] + 1)
        rank[AGSEQ(w)] = rank[AGSEQ(u)] + 1;
      if (--indeg[AGSEQ(w)] == 0) queue[tail++] = w;
    }
  }
  /* Sources (parameters, inputs, constants) sit just above their first
   * consumer; their own ranks feed nobody else's. */
  for (Agnode_t *v = agfstnode(g); v; v = agnxtnode(g, v)) {
    if (agfstin(g, v) != NULL) continue;
    long lowest = -1;
    for (Agedge_t *e = agfstout(g, v); e; e = agnxtout(g, e))
      if (lowest < 0 || rank[AGSEQ(aghead(e))] < lowest)
        lowest = rank[AGSEQ(aghead(e))];
    if (lowest > 0) rank[AGSEQ(v)] = lowest - 1;
  }
  work = n;
  for (Agnode_t *v = agfstnode(g); v && work <= limit; v = agnxtnode(g, v))
    for (Agedge_t *e = agfstout(g, v); e; e = agnxtout(g, e)) {
      long span = rank[AGSEQ(aghead(e))] - rank[AGSEQ(v)];
      work += span > 1 ? span : span < -1 ? -span : 1;
    }
done:
  free(indeg);
  free(rank);
  free(queue);
  return work;
}

/* The render itself, under svg_lock with the error buffer cleared. */
static int render_locked(const char *text, char **svg, size_t *svg_len,
                         char *msg, size_t msglen) {
  if (svg_gvc == NULL) {
    agseterrf(collect_error);
    svg_gvc = gvContext();
    if (svg_gvc == NULL) {
      say(msg, msglen, "svg: Graphviz did not start: %s",
          errors_or("no context"));
      return SVG_ERR_MEMORY;
    }
  }
  Agraph_t *g = agmemread(text);
  if (g == NULL) {
    say(msg, msglen, "svg: the DOT text does not parse: %s",
        errors_or("no graph in it"));
    return SVG_ERR_INPUT;
  }
  int rc = SVG_OK;
  int nodes = agnnodes(g);
  long work = 0;
  if (nodes > SVG_MAX_NODES) {
    say(msg, msglen,
        "svg: the graph has %d nodes, over the %d the daemon lays out as SVG "
        "(Graphviz's dot layout is superlinear): ask for format dot and "
        "render it yourself (dot -Tsvg)",
        nodes, SVG_MAX_NODES);
    rc = SVG_ERR_TOO_LARGE;
  } else if ((work = layout_work(g, SVG_MAX_LAYOUT)) < 0) {
    say(msg, msglen, "svg: out of memory measuring the graph");
    rc = SVG_ERR_MEMORY;
  } else if (work > SVG_MAX_LAYOUT) {
    say(msg, msglen,
        "svg: the graph's layout is too large: %d nodes whose edges span "
        "%ld ranks, over the %d (nodes plus ranks spanned) the daemon lays "
        "out as SVG (Graphviz's dot layout is superlinear): ask for format "
        "dot and render it yourself (dot -Tsvg)",
        nodes, work - nodes, SVG_MAX_LAYOUT);
    rc = SVG_ERR_TOO_LARGE;
  }
  if (rc != SVG_OK) {
    agclose(g);
    return rc;
  }
  /* One network-simplex pass per ranking and placement instead of
   * Graphviz's unbounded search: a node that feeds many others far down
   * (a shared constant) took 39 s for 100 nodes, 3.5 s with this, and a
   * chain's layout barely changes. */
  agattr(g, AGRAPH, "nslimit", "1");
  agattr(g, AGRAPH, "nslimit1", "1");
  if (gvLayout(svg_gvc, g, "dot") != 0) {
    say(msg, msglen, "svg: the dot layout failed: %s",
        errors_or("no reason given"));
    agclose(g);
    return SVG_ERR_INPUT;
  }
  char *data = NULL;
  unsigned int len = 0;
  if (gvRenderData(svg_gvc, g, "svg", &data, &len) != 0 || data == NULL) {
    say(msg, msglen, "svg: rendering failed: %s", errors_or("no reason given"));
    rc = SVG_ERR_INPUT;
  } else {
    /* Graphviz's buffer must go back through gvFreeRenderData; the
     * caller gets its own malloc'd copy. */
    *svg = malloc((size_t)len + 1);
    if (*svg == NULL) {
      say(msg, msglen, "svg: out of memory (%u bytes of SVG)", len);
      rc = SVG_ERR_MEMORY;
    } else {
      memcpy(*svg, data, len);
      (*svg)[len] = '\0';
      *svg_len = len;
    }
  }
  if (data != NULL) gvFreeRenderData(data);
  gvFreeLayout(svg_gvc, g);
  agclose(g);
  return rc;
}

int svg_render(const char *dot, size_t dot_len, char **svg, size_t *svg_len,
               char *msg, size_t msglen) {
  if (msg != NULL && msglen > 0) msg[0] = '\0';
  if (svg != NULL) *svg = NULL;
  if (svg_len != NULL) *svg_len = 0;
  if (dot == NULL || svg == NULL || svg_len == NULL) {
    say(msg, msglen, "svg: NULL argument");
    return SVG_ERR_INPUT;
  }
  if (memchr(dot, '\0', dot_len) != NULL) {
    say(msg, msglen, "svg: the DOT text holds a NUL byte");
    return SVG_ERR_INPUT;
  }
  /* agmemread reads a C string: the caller's bytes need not end in NUL. */
  char *text = malloc(dot_len + 1);
  if (text == NULL) {
    say(msg, msglen, "svg: out of memory (%zu bytes of DOT)", dot_len);
    return SVG_ERR_MEMORY;
  }
  memcpy(text, dot, dot_len);
  text[dot_len] = '\0';
  pthread_mutex_lock(&svg_lock);
  svg_errors_len = 0;
  svg_errors[0] = '\0';
  int rc = render_locked(text, svg, svg_len, msg, msglen);
  pthread_mutex_unlock(&svg_lock);
  free(text);
  return rc;
}
