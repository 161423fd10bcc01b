/*
 * svg.h - DOT text rendered to SVG by Graphviz's library (libgvc), for
 * Describe's SVG format and the HTTP graph page.
 *
 * libgvc is not thread-safe: every render holds one process-wide mutex,
 * so renders run one at a time whichever worker asks.  Graphviz's dot
 * layout is superlinear in the graph (and worse in edges that span many
 * ranks), so a graph over the caps below is refused before layout, with
 * a message that says to ask for DOT and render it elsewhere.
 */
#ifndef TOPOSD_SVG_H
#define TOPOSD_SVG_H

#include <stddef.h>

/* The most nodes a graph may have to be laid out here.  Measured on this
 * VM with Graphviz's default limits (engine-style DOT, a chain with skip
 * edges): 500 nodes lay out in about 0.7 s, 1000 in 5.6 s, 2000 in 36 s;
 * a plain chain of 1000 in 0.35 s. */
#define SVG_MAX_NODES 1000
/* The most layout work a graph may take: its nodes plus the ranks its
 * edges span, estimated before layout (a node one rank above its first
 * consumer, otherwise the longest path).  An edge that spans k ranks
 * becomes k virtual nodes in dot's layout, so one node that feeds 100
 * others down a chain costs as much as 5,000 nodes would. */
#define SVG_MAX_LAYOUT 2500

/* svg_render's results. */
enum {
  SVG_OK = 0,
  SVG_ERR_INPUT = 1,     /* not DOT Graphviz reads, or its layout failed */
  SVG_ERR_TOO_LARGE = 2, /* over SVG_MAX_NODES or SVG_MAX_LAYOUT */
  SVG_ERR_MEMORY = 3
};

/* Renders dot_len bytes of DOT text (the first graph in them) as SVG
 * with the dot layout.  On SVG_OK *svg is a new NUL-terminated string of
 * *svg_len bytes (the caller frees it with free); otherwise *svg is NULL
 * and msg (msglen bytes, may be NULL/0) says why in printable ASCII:
 * Graphviz's own error text for bad DOT, or the counts and the advice to
 * render DOT elsewhere for a graph over the caps.  Graphviz's warnings
 * are collected, never written to stderr.  Thread-safe (serialised). */
int svg_render(const char *dot, size_t dot_len, char **svg, size_t *svg_len,
               char *msg, size_t msglen);

#endif /* TOPOSD_SVG_H */
