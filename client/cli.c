/*
 * cli.c - `topos`, the command-line client of toposd.
 *
 *   topos [--server ADDRESS] [--deadline SECONDS] COMMAND [ARGS]
 *
 *   record FILE          store a spec; prints its id.  FILE holds a
 *                        network's canonical encoding (topos_network_encode,
 *                        "TPOS" magic) or a serialised topos.v1.Spec
 *                        message (what any gRPC language can write); "-"
 *                        reads standard input
 *   describe ID          [--format text|json|dot]
 *   lower ID             [ENTRY]  the plan: schedule, liveness, groups, peak
 *   emit ID              [ENTRY] [--generic]  the plan as StableHLO
 *   conformance ID       [ENTRY] [--allow-envelope]  every backend against
 *                        the interpreter; exit status 1 on any mismatch
 *   health               exit status 1 unless the daemon is serving
 *   stats
 *
 *   ENTRY: --roots V,V,... [--observes V,...] [--training] [--fast]
 *          [--backend NAME] [--threads N].  A value V is a node index
 *          (decimal) or a node name.  Without --roots the roots are the
 *          spec's outputs (the nodes nothing consumes, from its JSON
 *          describe).  --threads N (0..1024, 0 = the daemon's default) is
 *          the most threads each backend task of the entry's runs may use.
 *
 * --server defaults to $TOPOS_SERVER, then 127.0.0.1:50051.  Every command
 * takes --help.  Results go to stdout, errors to stderr; the exit status
 * is 0 on success, 1 on a failed call or mismatch, 2 on a usage error.
 *
 * Values travel by name here, so the CLI builds its requests itself
 * (proto/wire.h, protobuf-c) and sends them with topos_client_call_raw.
 */
#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topos.h"
#include "topos_client.h"
#include "wire.h"

typedef struct options {
  const char *server;
  double deadline;
  int threads; /* --threads; -1 when not given */
  const char *command;
  const char *id; /* or FILE for record */
  const char *format;
  const char *roots, *observes, *backend;
  bool training, fast, generic, allow_envelope, summary, help, format_given;
} options;

static const char *const usage_text =
    "usage: topos [--server ADDRESS] [--deadline SECONDS] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  record FILE [--summary]     store a spec (canonical encoding or a\n"
    "                              serialised topos.v1.Spec; - for stdin)\n"
    "  describe ID [--format text|json|dot]\n"
    "  lower ID [ENTRY]            the compiled plan\n"
    "  emit ID [ENTRY] [--generic] the plan as StableHLO\n"
    "  conformance ID [ENTRY] [--allow-envelope]\n"
    "                              exit 1 on any backend mismatch\n"
    "  health                      exit 1 unless serving\n"
    "  stats\n"
    "\n"
    "ENTRY: --roots V,... [--observes V,...] [--training] [--fast]\n"
    "       [--backend NAME] [--threads N]; V is a node index or name; the\n"
    "       default roots are the spec's outputs; N (0..1024) caps each\n"
    "       task's threads, 0 = the daemon's default.\n"
    "--server defaults to $TOPOS_SERVER, then " TOPOS_CLIENT_DEFAULT_ADDRESS
    ".\n";

static const struct {
  const char *name, *usage;
} commands[] = {
    {"record",
     "usage: topos record FILE [--summary]\n"
     "Stores a spec on the daemon and prints its id (64 hex digits).\n"
     "FILE holds a network's canonical encoding (topos_network_encode) or a\n"
     "serialised topos.v1.Spec message; - reads standard input.  --summary\n"
     "also prints the node, parameter and input counts and the daemon's\n"
     "summary.\n"},
    {"describe",
     "usage: topos describe ID [--format text|json|dot]\n"
     "Prints the stored spec: one line per node (text), JSON, or Graphviz.\n"},
    {"lower",
     "usage: topos lower ID [--roots V,...] [--observes V,...] [--training]\n"
     "                  [--fast] [--backend NAME] [--threads N]\n"
     "Prints the plan the daemon compiles for the entry: schedule, liveness,\n"
     "fused groups and peak bytes.  V is a node index or a node name; the\n"
     "default roots are the spec's outputs.  --threads N (0..1024; 0 = the\n"
     "daemon's default) is the most threads each backend task may use.\n"},
    {"emit",
     "usage: topos emit ID [--roots V,...] [--observes V,...] [--training]\n"
     "                 [--fast] [--threads N] [--generic]\n"
     "Prints the entry's plan as a StableHLO module (pretty, or the generic\n"
     "form mlir-opt parses with --generic).\n"},
    {"conformance",
     "usage: topos conformance ID [--roots V,...] [--observes V,...]\n"
     "                        [--training] [--fast] [--threads N]\n"
     "                        [--allow-envelope]\n"
     "Runs the entry on every backend of the daemon's host and compares it\n"
     "with the reference interpreter.  Prints one line per backend; the\n"
     "exit status is 1 when any backend is not bit-identical (with\n"
     "--allow-envelope, backends of \"envelope\" fidelity may differ).\n"
     "--threads N (0..1024) runs the plans with that many threads.\n"},
    {"health",
     "usage: topos health\n"
     "Prints the daemon's status and version; exit status 1 unless it is\n"
     "serving.\n"},
    {"stats",
     "usage: topos stats\n"
     "Prints the daemon's workers, queue, cache and store counters.\n"},
};
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static int usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("topos: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\n(topos --help lists the commands)\n", stderr);
  va_end(ap);
  return 2;
}

static int call_error(const char *what, const topos_error *err) {
  fprintf(stderr, "topos: %s: %s\n", what,
          err->message[0] ? err->message : "failed");
  return 1;
}

/* Parses argv into o.  Returns -1 to go on, or an exit status. */
static int parse(int argc, char **argv, options *o) {
  const char *env = getenv("TOPOS_SERVER");
  o->server = env && env[0] ? env : TOPOS_CLIENT_DEFAULT_ADDRESS;
  o->format = "text";
  o->threads = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool more = i + 1 < argc;
#define VALUE(field)                                      \
  do {                                                    \
    if (!more) return usage_error("%s needs a value", a); \
    o->field = argv[++i];                                 \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      o->help = true;
    } else if (strcmp(a, "--server") == 0) {
      VALUE(server);
    } else if (strcmp(a, "--deadline") == 0) {
      if (!more) return usage_error("--deadline needs a value");
      char *end = NULL;
      o->deadline = strtod(argv[++i], &end);
      if (!end || *end || !(o->deadline > 0))
        return usage_error("--deadline needs a positive number of seconds");
    } else if (strcmp(a, "--format") == 0) {
      VALUE(format);
      o->format_given = true;
    } else if (strcmp(a, "--roots") == 0) {
      VALUE(roots);
    } else if (strcmp(a, "--observes") == 0) {
      VALUE(observes);
    } else if (strcmp(a, "--backend") == 0) {
      VALUE(backend);
    } else if (strcmp(a, "--threads") == 0) {
      if (!more) return usage_error("--threads needs a value");
      const char *v = argv[++i];
      char *end = NULL;
      long n = strtol(v, &end, 10);
      if (!end || end == v || *end || n < 0 || n > TOPOS_THREADS_MAX)
        return usage_error("--threads needs a whole number 0..%d, not %s",
                           TOPOS_THREADS_MAX, v);
      o->threads = (int)n;
    } else if (strcmp(a, "--training") == 0) {
      o->training = true;
    } else if (strcmp(a, "--fast") == 0) {
      o->fast = true;
    } else if (strcmp(a, "--generic") == 0) {
      o->generic = true;
    } else if (strcmp(a, "--allow-envelope") == 0) {
      o->allow_envelope = true;
    } else if (strcmp(a, "--summary") == 0) {
      o->summary = true;
    } else if (a[0] == '-' && a[1] != '\0') {
      return usage_error("unknown option %s", a);
    } else if (!o->command) {
      o->command = a;
    } else if (!o->id) {
      o->id = a;
    } else {
      return usage_error("unexpected argument %s", a);
    }
#undef VALUE
  }
  return -1;
}

/* ------------------------------------------------------------ one call */

/* Packs req, calls method, unpacks the reply (new, wire_message_free). */
static int call(topos_client *c, const options *o, const char *method,
                const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *reply_desc,
                ProtobufCMessage **reply, topos_error *err) {
  uint8_t *bytes = NULL, *answer = NULL;
  size_t len = 0, alen = 0;
  int rc = wire_pack(req, &bytes, &len, err);
  if (rc == TOPOS_OK)
    rc = topos_client_call_raw(c, method, bytes, len, o->deadline, &answer,
                               &alen, NULL, err);
  free(bytes);
  if (rc != TOPOS_OK) return rc;
  *reply = protobuf_c_message_unpack(reply_desc, NULL, alen, answer);
  free(answer);
  if (!*reply) {
    snprintf(err->message, sizeof err->message,
             "the daemon's reply is not a valid %s", reply_desc->name);
    return err->code = TOPOS_CLIENT_GRPC_BASE + WIRE_GRPC_INTERNAL;
  }
  return TOPOS_OK;
}

/* ------------------------------------------------------------ values */

/* "a,3,b" -> Values (name, index, name) appended to *v. */
static int parse_values(const char *list, const char *what,
                        Topos__V1__Value ***v, size_t *n) {
  char *copy = strdup(list);
  if (!copy) return usage_error("out of memory");
  int rc = -1;
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok && rc < 0;
       tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    if (!*tok) continue;
    bool digits = true;
    for (const char *p = tok; *p; p++)
      digits = digits && *p >= '0' && *p <= '9';
    Topos__V1__Value *val = NULL;
    if (digits) {
      long k = strtol(tok, NULL, 10);
      if (k > INT32_MAX) {
        rc = usage_error("%s: index %s is too large", what, tok);
        break;
      }
      val = wire_value_new_index((int32_t)k);
    } else {
      val = wire_value_new_name(tok);
    }
    Topos__V1__Value **grown = realloc(*v, sizeof **v * (*n + 1));
    if (!val || !grown) {
      wire_message_free(val ? &val->base : NULL);
      if (grown) *v = grown;
      rc = usage_error("out of memory");
      break;
    }
    *v = grown;
    (*v)[(*n)++] = val;
  }
  free(copy);
  if (rc < 0 && *n == 0)
    rc = usage_error("%s: no values in \"%s\"", what, list);
  return rc;
}

/* The spec's output nodes (nothing consumes them), from its JSON
 * describe, as index Values. */
static int default_roots(topos_client *c, const options *o, Topos__V1__Entry *e,
                         topos_error *err) {
  char *json = NULL;
  int rc = topos_client_describe(c, o->id, TOPOS_FORMAT_JSON, &json, err);
  if (rc != TOPOS_OK)
    return call_error("describe (for the default roots)", err);
  cJSON *doc = cJSON_Parse(json);
  topos_free(json);
  cJSON *nodes = doc ? cJSON_GetObjectItemCaseSensitive(doc, "nodes") : NULL;
  const cJSON *node;
  cJSON_ArrayForEach(node, nodes) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(node, "index");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "output") != 0 ||
        !cJSON_IsNumber(index))
      continue;
    Topos__V1__Value *val = wire_value_new_index((int32_t)index->valuedouble);
    Topos__V1__Value **grown =
        realloc(e->roots, sizeof *e->roots * (e->n_roots + 1));
    if (!val || !grown) {
      wire_message_free(val ? &val->base : NULL);
      if (grown) e->roots = grown;
      cJSON_Delete(doc);
      fprintf(stderr, "topos: out of memory\n");
      return 1;
    }
    e->roots = grown;
    e->roots[e->n_roots++] = val;
  }
  cJSON_Delete(doc);
  if (e->n_roots == 0) {
    fprintf(stderr,
            "topos: the spec's describe names no output node; give "
            "--roots\n");
    return 1;
  }
  return -1;
}

/* A new heap Entry from the options.  Returns -1 on success, else an exit
 * status. */
static int build_entry(topos_client *c, const options *o,
                       Topos__V1__Entry **out, topos_error *err) {
  Topos__V1__Entry *e = malloc(sizeof *e);
  if (!e) return usage_error("out of memory");
  topos__v1__entry__init(e);
  int rc = -1;
  if (o->roots)
    rc = parse_values(o->roots, "--roots", &e->roots, &e->n_roots);
  else
    rc = default_roots(c, o, e, err);
  if (rc < 0 && o->observes)
    rc = parse_values(o->observes, "--observes", &e->observes, &e->n_observes);
  e->posture =
      o->training ? TOPOS__V1__POSTURE__TRAINING : TOPOS__V1__POSTURE__FORWARD;
  e->numerics =
      o->fast ? TOPOS__V1__NUMERICS__FAST : TOPOS__V1__NUMERICS__EXACT;
  e->threads = o->threads > 0 ? (uint32_t)o->threads : 0;
  if (rc < 0 && o->backend) {
    e->backend = strdup(o->backend);
    if (!e->backend) rc = usage_error("out of memory");
  }
  if (rc >= 0) {
    wire_message_free(&e->base);
    return rc;
  }
  *out = e;
  return -1;
}

static void print_text(const char *text) {
  size_t n = strlen(text);
  fputs(text, stdout);
  if (n == 0 || text[n - 1] != '\n') fputc('\n', stdout);
}

static char *heap_id(const char *id) {
  return strdup(id);
}

/* ------------------------------------------------------------ commands */

/* Reads a whole file ("-": stdin) into a new buffer. */
static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    uint8_t *grown = realloc(buf, cap * 2);
    if (!grown) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  bool bad = ferror(f);
  if (f != stdin) fclose(f);
  if (bad) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

static int cmd_record(topos_client *c, const options *o) {
  topos_error err = {0};
  size_t len = 0;
  uint8_t *bytes = read_file(o->id, &len);
  if (!bytes) {
    fprintf(stderr, "topos: record: cannot read %s\n", o->id);
    return 1;
  }
  /* A canonical encoding is decoded and sent as a structured spec; any
   * other bytes are sent as they are, as a serialised Spec (the daemon
   * checks them). */
  uint8_t *spec_bytes = bytes;
  size_t spec_len = len;
  uint8_t *packed = NULL;
  if (len >= 4 && memcmp(bytes, "TPOS", 4) == 0) {
    topos_network *net = topos_network_decode(bytes, len, &err);
    if (!net) {
      free(bytes);
      return call_error("record: the file is not a valid encoding", &err);
    }
    Topos__V1__Spec spec = TOPOS__V1__SPEC__INIT;
    int rc = wire_spec_from_network(net, &spec, &err);
    if (rc == TOPOS_OK) rc = wire_pack(&spec.base, &packed, &spec_len, &err);
    wire_message_clear(&spec.base);
    topos_network_release(net);
    if (rc != TOPOS_OK) {
      free(bytes);
      return call_error("record", &err);
    }
    spec_bytes = packed;
  }
  uint8_t *answer = NULL;
  size_t alen = 0;
  int rc = topos_client_call_raw(c, "Record", spec_bytes, spec_len, o->deadline,
                                 &answer, &alen, NULL, &err);
  free(bytes);
  free(packed);
  if (rc != TOPOS_OK) return call_error("record", &err);
  Topos__V1__RecordReply *r =
      topos__v1__record_reply__unpack(NULL, alen, answer);
  free(answer);
  if (!r || !wire_id_valid(r->id)) {
    if (r) topos__v1__record_reply__free_unpacked(r, NULL);
    fprintf(stderr, "topos: record: the daemon's reply is malformed\n");
    return 1;
  }
  printf("%s\n", r->id);
  if (o->summary) {
    printf("nodes %d, parameters %d, inputs %d\n", (int)r->nodes,
           (int)r->parameters, (int)r->inputs);
    if (r->summary && r->summary[0]) print_text(r->summary);
  }
  topos__v1__record_reply__free_unpacked(r, NULL);
  return 0;
}

static int cmd_describe(topos_client *c, const options *o) {
  topos_format f;
  if (strcmp(o->format, "text") == 0)
    f = TOPOS_FORMAT_TEXT;
  else if (strcmp(o->format, "json") == 0)
    f = TOPOS_FORMAT_JSON;
  else if (strcmp(o->format, "dot") == 0)
    f = TOPOS_FORMAT_DOT;
  else
    return usage_error("describe: --format is text, json or dot, not %s",
                       o->format);
  topos_error err = {0};
  char *text = NULL;
  if (topos_client_describe(c, o->id, f, &text, &err) != TOPOS_OK)
    return call_error("describe", &err);
  print_text(text);
  topos_free(text);
  return 0;
}

static int cmd_lower(topos_client *c, const options *o) {
  topos_error err = {0};
  Topos__V1__LowerRequest req = TOPOS__V1__LOWER_REQUEST__INIT;
  int rc = build_entry(c, o, &req.entry, &err);
  if (rc >= 0) return rc;
  req.id = heap_id(o->id);
  ProtobufCMessage *r = NULL;
  int st = call(c, o, "Lower", &req.base, &topos__v1__lower_reply__descriptor,
                &r, &err);
  wire_message_clear(&req.base);
  if (st != TOPOS_OK) return call_error("lower", &err);
  Topos__V1__LowerReply *reply = (Topos__V1__LowerReply *)r;
  print_text(reply->text ? reply->text : "");
  printf("peak bytes %lld, fused groups %d\n", (long long)reply->peak_bytes,
         (int)reply->groups);
  wire_message_free(r);
  return 0;
}

static int cmd_emit(topos_client *c, const options *o) {
  topos_error err = {0};
  Topos__V1__EmitRequest req = TOPOS__V1__EMIT_REQUEST__INIT;
  int rc = build_entry(c, o, &req.entry, &err);
  if (rc >= 0) return rc;
  req.id = heap_id(o->id);
  req.form = o->generic ? TOPOS__V1__FORM__GENERIC : TOPOS__V1__FORM__PRETTY;
  ProtobufCMessage *r = NULL;
  int st = call(c, o, "Emit", &req.base, &topos__v1__text_reply__descriptor, &r,
                &err);
  wire_message_clear(&req.base);
  if (st != TOPOS_OK) return call_error("emit", &err);
  print_text(((Topos__V1__TextReply *)r)->text);
  wire_message_free(r);
  return 0;
}

static int cmd_conformance(topos_client *c, const options *o) {
  topos_error err = {0};
  Topos__V1__ConformanceRequest req = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  int rc = build_entry(c, o, &req.entry, &err);
  if (rc >= 0) return rc;
  req.id = heap_id(o->id);
  ProtobufCMessage *r = NULL;
  int st = call(c, o, "Conformance", &req.base,
                &topos__v1__conformance_reply__descriptor, &r, &err);
  wire_message_clear(&req.base);
  if (st != TOPOS_OK) return call_error("conformance", &err);
  Topos__V1__ConformanceReply *reply = (Topos__V1__ConformanceReply *)r;
  int mismatches = 0;
  for (size_t i = 0; i < reply->n_results; i++) {
    const Topos__V1__BackendResult *b = reply->results[i];
    bool envelope = b->fidelity && strcmp(b->fidelity, "envelope") == 0;
    bool ok = b->bit_identical || (envelope && o->allow_envelope);
    if (!ok) mismatches++;
    if (b->bit_identical)
      printf("%-16s %-8s bit-identical", b->backend, b->fidelity);
    else
      printf("%-16s %-8s MISMATCH max_ulp %g max_relative %g", b->backend,
             b->fidelity, b->max_ulp, b->max_relative);
    if (b->note && b->note[0]) printf("  (%s)", b->note);
    if (!b->bit_identical && ok) printf("  [within envelope]");
    putchar('\n');
  }
  if (reply->n_results == 0) {
    fprintf(stderr, "topos: conformance: the daemon reported no backend\n");
    mismatches++;
  }
  wire_message_free(r);
  if (mismatches)
    fprintf(stderr, "topos: conformance: %d mismatch%s\n", mismatches,
            mismatches == 1 ? "" : "es");
  return mismatches ? 1 : 0;
}

static int cmd_health(topos_client *c, const options *o) {
  topos_error err = {0};
  char status[32], version[64];
  if (topos_client_health(c, status, version, &err) != TOPOS_OK)
    return call_error("health", &err);
  printf("%s %s\n", status, version);
  return strcmp(status, "serving") == 0 ? 0 : 1;
}

static int cmd_stats(topos_client *c, const options *o) {
  topos_error err = {0};
  topos_client_stats_info s;
  if (topos_client_stats(c, &s, &err) != TOPOS_OK)
    return call_error("stats", &err);
  printf(
      "workers %d\nqueue_depth %d\nqueue_capacity %d\nrequests %lld\n"
      "errors %lld\ncache_entries %lld\ncache_hits %lld\n"
      "cache_misses %lld\nspecs %lld\nspec_bytes %lld\nblobs %lld\n"
      "blob_bytes %lld\n",
      s.workers, s.queue_depth, s.queue_capacity, (long long)s.requests,
      (long long)s.errors, (long long)s.cache_entries, (long long)s.cache_hits,
      (long long)s.cache_misses, (long long)s.specs, (long long)s.spec_bytes,
      (long long)s.blobs, (long long)s.blob_bytes);
  return 0;
}

int main(int argc, char **argv) {
  options o;
  memset(&o, 0, sizeof o);
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  if (!o.command || strcmp(o.command, "help") == 0) {
    if (o.command || o.help) {
      fputs(usage_text, stdout);
      return 0;
    }
    fputs(usage_text, stderr);
    return 2;
  }
  int k = -1;
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(o.command, commands[i].name) == 0) k = i;
  if (k < 0) return usage_error("unknown command %s", o.command);
  if (o.help) {
    fputs(commands[k].usage, stdout);
    return 0;
  }
  /* Options a command does not read are usage errors, not ignored. */
  bool entry = k >= 2 && k <= 4;
  const char *stray = o.format_given && k != 1            ? "--format"
                      : (o.roots || o.observes) && !entry ? "--roots/--observes"
                      : (o.training || o.fast) && !entry  ? "--training/--fast"
                      : o.backend && !entry               ? "--backend"
                      : o.threads >= 0 && !entry          ? "--threads"
                      : o.generic && k != 3               ? "--generic"
                      : o.allow_envelope && k != 4        ? "--allow-envelope"
                      : o.summary && k != 0               ? "--summary"
                                                          : NULL;
  if (stray) return usage_error("%s does not apply to %s", stray, o.command);
  bool takes_id = k <= 4;
  if (takes_id && !o.id) {
    fputs(commands[k].usage, stderr);
    return 2;
  }
  if (!takes_id && o.id)
    return usage_error("%s takes no argument (got %s)", o.command, o.id);
  if (takes_id && k != 0 && !wire_id_valid(o.id))
    return usage_error("%s: \"%s\" is not an id (64 lowercase hex digits)",
                       o.command, o.id);

  topos_error err = {0};
  topos_client *c = topos_client_connect(o.server, &err);
  if (!c) return call_error("connect", &err);
  if (o.deadline > 0) topos_client_set_deadline(c, o.deadline);
  switch (k) {
    case 0:
      rc = cmd_record(c, &o);
      break;
    case 1:
      rc = cmd_describe(c, &o);
      break;
    case 2:
      rc = cmd_lower(c, &o);
      break;
    case 3:
      rc = cmd_emit(c, &o);
      break;
    case 4:
      rc = cmd_conformance(c, &o);
      break;
    case 5:
      rc = cmd_health(c, &o);
      break;
    default:
      rc = cmd_stats(c, &o);
      break;
  }
  topos_client_close(c);
  fflush(stdout);
  return rc;
}
