/*
 * page.h - the HTML page of one spec's graph: its SVG drawing (svg.h),
 * the plan of an entry and the StableHLO emitted for it, as one
 * self-contained HTML5 document (inline CSS, no scripts, nothing
 * fetched), for the HTTP gateway to serve.
 */
#ifndef TOPOSD_PAGE_H
#define TOPOSD_PAGE_H

#include <stddef.h>

/* The page of spec `spec_id`: a title naming it; the SVG inline in
 * <section id="graph"> (svg as Graphviz rendered it, already escaped by
 * Graphviz, its <?xml?> and <!DOCTYPE> prolog dropped; each node stays a
 * <g id="nodeN" class="node">); <section id="plan"> with plan_text in a
 * <pre> and entry_label naming the entry it is for; <section
 * id="stablehlo"> with the emitted text in a <pre>.  plan_text and
 * stablehlo may be NULL (the section says there is none); spec_id,
 * entry_label and the texts are HTML-escaped (& < > " ').  Returns a new
 * NUL-terminated document of *len bytes (len may be NULL; free with
 * free), or NULL when out of memory or spec_id or svg is NULL. */
char *page_html(const char *spec_id, const char *svg, const char *plan_text,
                const char *entry_label, const char *stablehlo, size_t *len);

#endif /* TOPOSD_PAGE_H */
