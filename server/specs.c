/*
 * specs.c - the spec resource: Record stores a spec (idempotent, by
 * topos_network_id); Describe, Lower and Emit read a stored one.  Decoded
 * networks and compiled plans are cached (cache.c) by spec id, and spec
 * id + entry key: the cached values are immutable and shared by all
 * workers.  Nothing ever rewrites a stored spec, but retention may drop
 * one (store.c, docs/daemon.md "Retention and budgets"): every use marks
 * it used (store_touch_spec), and a spec whose network is in use here
 * (referenced, or being loaded: cache_in_use) is never dropped.
 *
 * Cache entries count the memory their values keep: a network its
 * decoded nodes, names and tensors (topos_network_memory_bytes), a plan
 * its own tables as a child of its network's entry (a plan retains its
 * network, so the network must not be evicted from the count while the
 * plan stays cached).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rooms.h"
#include "svg.h"

/* ----------------------------------------------------- cached networks */

static void destroy_network(void *v) {
  topos_network_release(v);
}
static void destroy_plan(void *v) {
  topos_plan_free(v);
}

/* ------------------------------------------------------------ ownership */

/* Whose specs a call may see (docs/operations.md, "Isolation"): NULL for
 * every spec (auth off, or an admin tenant), else the caller's tenant. */
static const char *spec_scope(const call_ctx *cx) {
  return cx->tenant == NULL || cx->tenant[0] == '\0' || cx->admin ? NULL
                                                                  : cx->tenant;
}

/* The answer for an unknown spec, and for another tenant's. */
static void spec_not_found(call_ctx *cx, const char *id) {
  call_fail(cx, WIRE_GRPC_NOT_FOUND, TOPOS_ERR_NOT_FOUND,
            "no spec with id %s: it was never recorded here, or "
            "retention dropped it (once stored specs pass the spec "
            "budget, --spec-bytes, the least recently used are "
            "dropped); record it again",
            id);
}

/* The stored spec `id` as a network (borrowed until *ref is released). */
topos_network *spec_network(call_ctx *cx, const char *id, cache_entry **ref) {
  *ref = NULL;
  if (!call_check_id(cx, id, "id")) return NULL;
  memcpy(cx->spec_id, id, 65);
  /* Checked before the cache, which all tenants share. */
  const char *scope = spec_scope(cx);
  if (scope != NULL) {
    topos_error err = {0};
    bool owned = false;
    if (store_spec_owned(cx->d->store, id, scope, &owned, &err) != TOPOS_OK) {
      call_fail_err(cx, &err, "reading the spec");
      return NULL;
    }
    if (!owned) {
      spec_not_found(cx, id);
      return NULL;
    }
  }
  char key[80];
  snprintf(key, sizeof key, "net %s", id);
  topos_network *net = cache_get(cx->d->cache, key, ref);
  if (net != NULL) {
    /* A use, for retention: kept in memory, written in batches. */
    store_touch_spec(cx->d->store, id, NULL);
    return net;
  }
  /* Pinned while it is read and decoded, so retention cannot drop the
   * spec between the read and the cache_put. */
  if (!cache_pin(cx->d->cache, key)) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
    return NULL;
  }
  topos_error err = {0};
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (store_get_spec(cx->d->store, id, &bytes, &len, &err) != TOPOS_OK) {
    cache_unpin(cx->d->cache, key);
    if (err.code == TOPOS_ERR_NOT_FOUND)
      spec_not_found(cx, id);
    else
      call_fail_err(cx, &err, "reading the spec");
    return NULL;
  }
  net = topos_network_decode(bytes, len, &err);
  free(bytes);
  if (net == NULL) {
    cache_unpin(cx->d->cache, key);
    /* The store verified the hash, so this is a bug or a format change. */
    call_fail(cx, WIRE_GRPC_INTERNAL, 0, "stored spec %s does not decode: %s",
              id, err.message);
    return NULL;
  }
  net = cache_put(cx->d->cache, key, net, destroy_network,
                  (int64_t)topos_network_memory_bytes(net), ref);
  cache_unpin(cx->d->cache, key);
  store_touch_spec(cx->d->store, id, NULL);
  return net;
}

/* The plan of `entry` over net (borrowed until *ref is released).  The
 * key holds everything a plan remembers of its entry, threads included,
 * so entries that differ only in threads get plans of their own. */
topos_plan *spec_plan(call_ctx *cx, const topos_network *net,
                      const topos_entry *entry, cache_entry **ref) {
  *ref = NULL;
  char *entry_key = wire_entry_key(entry);
  size_t klen = entry_key ? strlen(entry_key) + 80 : 0;
  char *key = entry_key ? malloc(klen) : NULL;
  if (key == NULL) {
    free(entry_key);
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "out of memory");
    return NULL;
  }
  snprintf(key, klen, "plan %s %s", cx->spec_id, entry_key);
  free(entry_key);
  topos_plan *plan = cache_get(cx->d->cache, key, ref);
  if (plan == NULL) {
    topos_error err = {0};
    plan = topos_network_lower(net, entry, &err);
    if (plan == NULL) {
      call_fail_err(cx, &err, "lower");
    } else {
      char net_key[80];
      snprintf(net_key, sizeof net_key, "net %s", cx->spec_id);
      plan =
          cache_put_child(cx->d->cache, net_key, net, key, plan, destroy_plan,
                          (int64_t)topos_plan_memory_bytes(plan), ref);
    }
  }
  free(key);
  return plan;
}

/* --------------------------------------------------------------- Record */

/* One line about a network: dtype, counts, parameter elements, outputs. */
static void summarize(const topos_network *net, topos_dtype dtype, char *out,
                      size_t outlen) {
  int n = topos_network_node_count(net);
  int np = topos_network_parameter_count(net);
  int64_t elements = 0;
  for (int s = 0; s < np; s++) {
    int rank = 0;
    const int64_t *shape =
        topos_network_value_shape(net, topos_network_parameter(net, s), &rank);
    int64_t c = 1;
    for (int k = 0; shape && k < rank; k++) c *= shape[k];
    elements += c;
  }
  bool *used = calloc((size_t)n + 1, sizeof(bool));
  size_t len = (size_t)snprintf(
      out, outlen,
      "%s network: %d nodes, %d parameters (%lld elements), %d "
      "inputs; outputs:",
      topos_dtype_name(dtype), n, np, (long long)elements,
      topos_network_input_count(net));
  if (used == NULL || len >= outlen) {
    free(used);
    return;
  }
  topos_node_info info;
  for (int i = 0; i < n; i++)
    if (topos_network_node(net, i, &info, NULL) == TOPOS_OK)
      for (int k = 0; k < info.nin; k++) used[info.operands[k]] = true;
  int shown = 0, outputs = 0;
  for (int i = 0; i < n; i++) {
    if (used[i]) continue;
    outputs++;
    if (shown == 8 || len + 40 >= outlen) continue;
    if (topos_network_node(net, i, &info, NULL) != TOPOS_OK) continue;
    int w = info.name ? snprintf(out + len, outlen - len, " %.32s", info.name)
                      : snprintf(out + len, outlen - len, " %%%d", i);
    if (w > 0) len += (size_t)w < outlen - len ? (size_t)w : outlen - len - 1;
    shown++;
  }
  if (outputs > shown && len + 24 < outlen)
    snprintf(out + len, outlen - len, " (+%d more)", outputs - shown);
  free(used);
}

/* The stored_bytes quota for a spec of `len` encoded bytes: a spec the
 * tenant owns already adds nothing. */
static bool spec_fits_quota(call_ctx *cx, const uint8_t *bytes, size_t len) {
  if (cx->quota == NULL || cx->quota->stored_bytes < 0) return true;
  char id[65];
  topos_sha256_hex(bytes, len, id);
  bool owned = false;
  topos_error err = {0};
  if (store_spec_owned(cx->d->store, id, cx->tenant, &owned, &err) !=
      TOPOS_OK) {
    call_fail_err(cx, &err, "store");
    return false;
  }
  return call_quota_stored(cx, "Record", owned ? 0 : (int64_t)len);
}

void handle_record(call_ctx *cx) {
  Topos__V1__Spec *spec =
      call_unpack(cx, &topos__v1__spec__descriptor, "Record", false);
  if (spec == NULL) return;
  topos_error err = {0};
  topos_network *net = wire_spec_to_network(spec, &err);
  if (net == NULL) {
    call_fail_err(cx, &err, "spec");
    return;
  }
  int nodes = topos_network_node_count(net);
  if (cx->quota != NULL && cx->quota->nodes_per_spec >= 0 &&
      nodes > cx->quota->nodes_per_spec) {
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "Record: quota nodes_per_spec: limit %lld nodes, this spec has "
              "%d",
              (long long)cx->quota->nodes_per_spec, nodes);
    topos_network_release(net);
    return;
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  char id[65] = {0};
  if (!call_continue(cx)) {
  } else if (topos_network_encode(net, &bytes, &len, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "encode");
  } else if (!spec_fits_quota(cx, bytes, len)) {
    /* Over the tenant's stored_bytes: refused, nothing stored. */
  } else if (store_put_spec_as(cx->d->store, cx->tenant, bytes, len, id,
                               &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "store");
  }
  topos_free(bytes);
  if (cx->status != WIRE_GRPC_OK) {
    topos_network_release(net);
    return;
  }
  memcpy(cx->spec_id, id, sizeof id);
  char summary[512];
  summarize(net, (topos_dtype)spec->dtype, summary, sizeof summary);
  Topos__V1__RecordReply r = TOPOS__V1__RECORD_REPLY__INIT;
  r.id = id;
  r.nodes = nodes;
  r.parameters = topos_network_parameter_count(net);
  r.inputs = topos_network_input_count(net);
  r.summary = summary;
  /* The next request on this spec will want it decoded. */
  char key[80];
  snprintf(key, sizeof key, "net %s", id);
  cache_entry *ref = NULL;
  cache_put(cx->d->cache, key, net, destroy_network,
            (int64_t)topos_network_memory_bytes(net), &ref);
  cache_release(cx->d->cache, ref);
  call_reply(cx, &r.base);
}

/* -------------------------------------------------------------- Describe */

void handle_describe(call_ctx *cx) {
  Topos__V1__DescribeRequest *req = call_unpack(
      cx, &topos__v1__describe_request__descriptor, "Describe", false);
  if (req == NULL) return;
  if (req->format < TOPOS__V1__FORMAT__TEXT ||
      req->format > TOPOS__V1__FORMAT__SVG) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "format %d is not TEXT, JSON, DOT or SVG", (int)req->format);
    return;
  }
  bool svg = req->format == TOPOS__V1__FORMAT__SVG;
  cache_entry *ref = NULL;
  topos_network *net = spec_network(cx, req->id, &ref);
  if (net == NULL) return;
  /* The text is cached as a child of the network's entry (so it goes
   * when the network does): a describe is rendered once per format. */
  char key[96];
  snprintf(key, sizeof key, "describe %d %s", (int)req->format, req->id);
  cache_entry *text_ref = NULL;
  const char *cached = cache_get(cx->d->cache, key, &text_ref);
  if (cached != NULL) {
    Topos__V1__TextReply r = TOPOS__V1__TEXT_REPLY__INIT;
    r.text = (char *)cached;
    call_reply(cx, &r.base);
    cache_release(cx->d->cache, text_ref);
    cache_release(cx->d->cache, ref);
    return;
  }
  /* SVG is the DOT listing laid out by Graphviz (svg.c), refused before
   * any work for a network over its node cap. */
  int nodes = topos_network_node_count(net);
  if (svg && nodes > SVG_MAX_NODES) {
    cache_release(cx->d->cache, ref);
    call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
              "Describe SVG: the network has %d nodes, over the %d the daemon "
              "lays out as SVG (Graphviz's dot layout is superlinear): ask for "
              "format dot and render it yourself (dot -Tsvg)",
              nodes, SVG_MAX_NODES);
    return;
  }
  topos_error err = {0};
  char *text = topos_network_describe(
      net, svg ? TOPOS_FORMAT_DOT : (topos_format)req->format, &err);
  if (text == NULL) {
    cache_release(cx->d->cache, ref);
    call_fail_err(cx, &err, "describe");
    return;
  }
  char *image = NULL;
  if (svg && call_continue(cx)) {
    size_t len = 0;
    char msg[512];
    int rc = svg_render(text, strlen(text), &image, &len, msg, sizeof msg);
    if (rc == SVG_ERR_TOO_LARGE || rc == SVG_ERR_MEMORY)
      call_fail(cx, WIRE_GRPC_RESOURCE_EXHAUSTED, TOPOS_ERR_MEMORY,
                "Describe %s", msg);
    else if (rc != SVG_OK) /* the engine's DOT always parses: a bug */
      call_fail(cx, WIRE_GRPC_INTERNAL, 0, "Describe %s", msg);
  }
  if (!svg || (image != NULL && call_continue(cx))) {
    Topos__V1__TextReply r = TOPOS__V1__TEXT_REPLY__INIT;
    r.text = svg ? image : text;
    call_reply(cx, &r.base);
    char *keep = strdup(r.text);
    if (keep != NULL) {
      char net_key[80];
      snprintf(net_key, sizeof net_key, "net %s", req->id);
      cache_put_child(cx->d->cache, net_key, net, key, keep, free,
                      (int64_t)strlen(keep) + 1, &text_ref);
      cache_release(cx->d->cache, text_ref);
    }
  }
  cache_release(cx->d->cache, ref);
  free(image);
  topos_free(text);
}

/* ------------------------------------------------------------ Lower, Emit */

void planned_clear(call_ctx *cx, planned *p) {
  cache_release(cx->d->cache, p->plan_ref);
  wire_entry_clear(&p->entry);
  cache_release(cx->d->cache, p->net_ref);
  memset(p, 0, sizeof *p);
}

bool plan_request(call_ctx *cx, const char *id, const Topos__V1__Entry *entry,
                  planned *p) {
  memset(p, 0, sizeof *p);
  p->net = spec_network(cx, id, &p->net_ref);
  if (p->net == NULL) return false;
  topos_error err = {0};
  if (wire_entry_from_proto(p->net, entry, &p->entry, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "entry");
    planned_clear(cx, p);
    return false;
  }
  /* The entry's backend is honoured: its runs default to it, so a name
   * that could not run is refused here, for Lower and Emit too. */
  topos_exec hint = {.numerics = p->entry.entry.numerics,
                     .threads = p->entry.entry.threads,
                     .backend = p->entry.backend};
  if (topos_exec_check(&hint, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "entry");
    planned_clear(cx, p);
    return false;
  }
  p->plan = spec_plan(cx, p->net, &p->entry.entry, &p->plan_ref);
  if (p->plan == NULL || !call_continue(cx)) {
    planned_clear(cx, p);
    return false;
  }
  return true;
}

void handle_lower(call_ctx *cx) {
  Topos__V1__LowerRequest *req =
      call_unpack(cx, &topos__v1__lower_request__descriptor, "Lower", false);
  planned p;
  if (req == NULL || !plan_request(cx, req->id, req->entry, &p)) return;
  topos_error err = {0};
  char *text = topos_plan_describe(p.plan, &err);
  if (text == NULL) {
    call_fail_err(cx, &err, "plan describe");
  } else {
    Topos__V1__LowerReply r = TOPOS__V1__LOWER_REPLY__INIT;
    r.text = text;
    r.peak_bytes = (int64_t)topos_plan_peak_bytes(p.plan);
    r.groups = topos_plan_group_count(p.plan);
    call_reply(cx, &r.base);
    topos_free(text);
  }
  planned_clear(cx, &p);
}

void handle_emit(call_ctx *cx) {
  Topos__V1__EmitRequest *req =
      call_unpack(cx, &topos__v1__emit_request__descriptor, "Emit", false);
  if (req == NULL) return;
  if (req->form != TOPOS__V1__FORM__PRETTY &&
      req->form != TOPOS__V1__FORM__GENERIC) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "form %d is not PRETTY or GENERIC", (int)req->form);
    return;
  }
  planned p;
  if (!plan_request(cx, req->id, req->entry, &p)) return;
  topos_error err = {0};
  char *text = topos_plan_emit_stablehlo(p.plan,
                                         req->form == TOPOS__V1__FORM__GENERIC
                                             ? TOPOS_EMIT_GENERIC
                                             : TOPOS_EMIT_PRETTY,
                                         &err);
  if (text == NULL) {
    call_fail_err(cx, &err, "emit");
  } else {
    Topos__V1__TextReply r = TOPOS__V1__TEXT_REPLY__INIT;
    r.text = text;
    call_reply(cx, &r.base);
    topos_free(text);
  }
  planned_clear(cx, &p);
}

/* ------------------------------------------------------------- ListSpecs */

#define LIST_PAGE_DEFAULT 100
#define LIST_PAGE_MAX 1000

void handle_list_specs(call_ctx *cx) {
  Topos__V1__ListSpecsRequest *req = call_unpack(
      cx, &topos__v1__list_specs_request__descriptor, "ListSpecs", true);
  if (req == NULL) return;
  if (req->page_size < 0 || req->page_size > LIST_PAGE_MAX) {
    call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
              "page_size %d is not in 0..%d (0 = %d)", (int)req->page_size,
              LIST_PAGE_MAX, LIST_PAGE_DEFAULT);
    return;
  }
  int limit = req->page_size ? req->page_size : LIST_PAGE_DEFAULT;
  /* The token is the position of the page's first spec, in decimal. */
  int64_t offset = 0;
  const char *token = req->page_token;
  if (token[0] != '\0') {
    char *end = NULL;
    long long v = strtoll(token, &end, 10);
    if (token[0] < '0' || token[0] > '9' || *end != '\0' || v < 0 ||
        strlen(token) > 18) {
      call_fail(cx, WIRE_GRPC_INVALID_ARGUMENT, TOPOS_ERR_ARGUMENT,
                "page_token '%.40s' is not one this daemon gave out", token);
      return;
    }
    offset = v;
  }
  store_spec_info *rows = NULL;
  int n = 0;
  topos_error err = {0};
  /* One more than the page: whether there is a next one. */
  /* A tenant lists its own specs; an admin (or a daemon without auth)
   * every spec. */
  if (store_list_specs_of(cx->d->store, spec_scope(cx), offset, limit + 1,
                          &rows, &n, &err) != TOPOS_OK) {
    call_fail_err(cx, &err, "list specs");
    return;
  }
  int shown = n > limit ? limit : n;
  Topos__V1__SpecInfo *infos =
      call_scratch(cx, (size_t)(shown ? shown : 1) * sizeof *infos);
  Topos__V1__SpecInfo **ptrs =
      call_scratch(cx, (size_t)(shown ? shown : 1) * sizeof *ptrs);
  char *ids = call_scratch(cx, (size_t)(shown ? shown : 1) * 65);
  if (infos == NULL || ptrs == NULL || ids == NULL) {
    free(rows);
    return;
  }
  for (int i = 0; i < shown; i++) {
    topos__v1__spec_info__init(&infos[i]);
    memcpy(ids + (size_t)i * 65, rows[i].id, 65);
    infos[i].id = ids + (size_t)i * 65;
    infos[i].bytes = rows[i].size;
    infos[i].created_ms = rows[i].created_ms;
    infos[i].last_used_ms = rows[i].last_used_ms;
    ptrs[i] = &infos[i];
  }
  free(rows);
  char next[32] = "";
  if (n > limit)
    snprintf(next, sizeof next, "%lld", (long long)(offset + limit));
  Topos__V1__ListSpecsReply r = TOPOS__V1__LIST_SPECS_REPLY__INIT;
  r.n_specs = (size_t)shown;
  r.specs = ptrs;
  r.next_page_token = next;
  call_reply(cx, &r.base);
}
