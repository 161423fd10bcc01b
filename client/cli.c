/*
 * cli.c - `topos`, the command-line client of toposd.
 *
 *   topos [--server ADDRESS] [--deadline SECONDS] [--token TOKEN] COMMAND
 *         [ARGS]
 *
 *   record FILE          store a spec; prints its id.  FILE holds a
 *                        network's canonical encoding (topos_network_encode,
 *                        "TPOS" magic) or a serialised topos.v1.Spec
 *                        message (what any gRPC language can write); "-"
 *                        reads standard input
 *   describe ID          [--format text|json|dot|svg]  (svg: laid out
 *                        by the daemon with Graphviz)
 *   lower ID             [ENTRY]  the plan: schedule, liveness, groups, peak
 *   emit ID              [ENTRY] [--generic]  the plan as StableHLO
 *   conformance ID       [ENTRY] [--backend NAME,...] [--allow-envelope]
 *                        candidates against the reference interpreter;
 *                        exit 0 all hold, 1 one does not, 2 usage/connection
 *   health               exit status 1 unless the daemon is serving
 *   stats
 *   backends [--local]   the daemon's (or this binary's) backend registry
 *
 *   ENTRY: --roots V,V,... [--observes V,...] [--training] [--fast]
 *          [--backend NAME] [--threads N].  A value V is a node index
 *          (decimal) or a node name.  Without --roots the roots are the
 *          spec's outputs (the nodes nothing consumes, from its JSON
 *          describe).  --threads N (0..1024, 0 = the daemon's default) is
 *          the most threads each backend task of the entry's runs may use.
 *
 *   tenant add NAME [--admin] [--with-token] | tenant list
 *         | tenant remove NAME
 *   token create TENANT | token list TENANT | token revoke TOKEN_ID
 *                        administration, on the store file itself
 *                        (--store PATH) or through the daemon with an
 *                        admin tenant's token (--server ADDRESS; the Admin*
 *                        RPCs); neither: $TOPOS_STORE, else $TOPOS_SERVER,
 *                        else the file ./var/topos.db.  The same output
 *                        both ways: each change prints an audit line on
 *                        stderr; token create (and tenant add
 *                        --with-token) prints the secret on stdout, once
 *   quota set TENANT [--stored-bytes N] [--inflight N] [--rate R --burst B]
 *         [--nodes N] [--run-ms N] [--run-bytes N] [--device-bytes N]
 *         [--weight W]
 *         | quota show TENANT
 *                        a tenant's quotas, either way too ('none' clears
 *                        one); set prints an audit line
 *
 * --token (default $TOPOS_TOKEN) is sent as "authorization: Bearer TOKEN".
 * --tls-ca FILE (default $TOPOS_TLS_CA) turns TLS on and verifies the
 * daemon's certificate with that CA bundle; --tls-cert FILE and --tls-key
 * FILE (defaults $TOPOS_TLS_CERT, $TOPOS_TLS_KEY) are the client
 * certificate a daemon with --tls-client-ca asks for.
 * --server defaults to $TOPOS_SERVER, then 127.0.0.1:50051.  Every command
 * takes --help.  Results go to stdout, errors to stderr; the exit status
 * is 0 on success, 1 on a failed call or mismatch, 2 on a usage error.
 *
 * Values travel by name here, so the CLI builds its requests itself
 * (proto/wire.h, protobuf-c) and sends them with topos_client_call_raw.
 */
#include <cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends.h"
#include "store.h"
#include "topos.h"
#include "topos_client.h"
#include "wire.h"

typedef struct options {
  const char *server;
  const char *token; /* --token, else $TOPOS_TOKEN (the library reads it) */
  /* --tls-ca, --tls-cert, --tls-key; each else its $TOPOS_TLS_... */
  const char *tls_ca, *tls_cert, *tls_key;
  double deadline;
  int threads; /* --threads; -1 when not given */
  const char *command;
  const char *id; /* or FILE for record */
  const char *format;
  const char *roots, *observes, *backend;
  bool training, fast, generic, allow_envelope, summary, help, format_given;
  bool local;
} options;

static const char *const usage_text =
    "usage: topos [--server ADDRESS] [--deadline SECONDS] COMMAND [ARGS]\n"
    "       topos --version\n"
    "\n"
    "commands:\n"
    "  record FILE [--summary]     store a spec (canonical encoding or a\n"
    "                              serialised topos.v1.Spec; - for stdin)\n"
    "  describe ID [--format text|json|dot|svg]\n"
    "  lower ID [ENTRY]            the compiled plan\n"
    "  emit ID [ENTRY] [--generic] the plan as StableHLO\n"
    "  conformance ID [ENTRY] [--backend NAME,...] [--allow-envelope]\n"
    "                              exit 1 when a row does not hold\n"
    "  health                      exit 1 unless serving\n"
    "  stats\n"
    "  backends [--local]          the backend registry\n"
    "  list                        the stored specs, newest first\n"
    "\n"
    "ENTRY: --roots V,... [--observes V,...] [--training] [--fast]\n"
    "       [--backend NAME] [--threads N]; V is a node index or name; the\n"
    "       default roots are the spec's outputs; N (0..1024) caps each\n"
    "       task's threads, 0 = the daemon's default.\n"
    "--server defaults to $TOPOS_SERVER, then " TOPOS_CLIENT_DEFAULT_ADDRESS
    ".\n"
    "--token TOKEN (default $TOPOS_TOKEN) is sent with every call.\n"
    "--tls-ca FILE (default $TOPOS_TLS_CA) connects over TLS, verifying the\n"
    "daemon's certificate with that CA; --tls-cert FILE --tls-key FILE\n"
    "(defaults $TOPOS_TLS_CERT, $TOPOS_TLS_KEY) send a client certificate.\n"
    "\n"
    "administration (docs/operations.md; topos tenant --help):\n"
    "  tenant add NAME [--admin] [--with-token] | tenant list\n"
    "  tenant remove NAME\n"
    "  token create TENANT | token list TENANT | token revoke TOKEN_ID\n"
    "  quota set TENANT [--stored-bytes N] ... | quota show TENANT\n"
    "  on the store file (--store PATH) or through the daemon with an\n"
    "  admin tenant's token (--server ADDRESS); without either,\n"
    "  $TOPOS_STORE, else $TOPOS_SERVER, else the file ./var/topos.db.\n";

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
     "usage: topos describe ID [--format text|json|dot|svg]\n"
     "Prints the stored spec: one line per node (text), JSON, Graphviz DOT,\n"
     "or an SVG drawing of it the daemon lays out with Graphviz (networks\n"
     "too large for that are refused: ask for dot and render it yourself).\n"},
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
     "                        [--backend NAME[,NAME...]] [--allow-envelope]\n"
     "Runs the entry's plan under each candidate backend and compares every\n"
     "root, observe and (--training) parameter gradient with the reference\n"
     "interpreter: bit for bit under exact numerics, within numerics.md's\n"
     "envelope under fast (an envelope backend such as blas always runs\n"
     "fast).  Without --backend: the reference backend and every exact\n"
     "backend; --allow-envelope adds the envelope ones.  One line per\n"
     "candidate, one per differing output.  Exit status 0 when every row\n"
     "holds, 1 when one does not, 2 on a usage or connection error.\n"},
    {"health",
     "usage: topos health\n"
     "Prints the daemon's status and version; exit status 1 unless it is\n"
     "serving.\n"},
    {"stats",
     "usage: topos stats\n"
     "Prints the daemon's workers, queue, cache and store counters, and the\n"
     "tasks each backend has run.\n"},
    {"backends",
     "usage: topos backends [--local]\n"
     "Lists the daemon's backends (the reference first): fidelity, threads,\n"
     "tasks run, device or ISA, dtypes and the ops their tasks cover.\n"
     "--local lists this program's own registry instead (the backends\n"
     "toposd registers by default), without a daemon.\n"},
    {"list",
     "usage: topos list\n"
     "Lists the stored specs (the caller's, when the daemon has tenants),\n"
     "newest first: id, bytes, first recorded and last used (UTC).\n"},
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
    } else if (strcmp(a, "--version") == 0) {
      printf("topos %s\n", topos_version());
      return 0;
    } else if (strcmp(a, "--server") == 0) {
      VALUE(server);
    } else if (strcmp(a, "--token") == 0) {
      VALUE(token);
    } else if (strcmp(a, "--tls-ca") == 0) {
      VALUE(tls_ca);
    } else if (strcmp(a, "--tls-cert") == 0) {
      VALUE(tls_cert);
    } else if (strcmp(a, "--tls-key") == 0) {
      VALUE(tls_key);
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
    } else if (strcmp(a, "--local") == 0) {
      o->local = true;
    } else if (a[0] == '-' && a[1] != '\0') {
      return usage_error("unknown option '%s'", a);
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
  /* conformance reads --backend as its candidates, not the entry's. */
  if (rc < 0 && o->backend && strcmp(o->command, "conformance") != 0) {
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
  else if (strcmp(o->format, "svg") == 0)
    f = TOPOS_CLIENT_FORMAT_SVG;
  else
    return usage_error("describe: --format is text, json, dot or svg, not %s",
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

/* Adds one ExecOptions candidate to req. */
static bool add_candidate(Topos__V1__ConformanceRequest *req, const char *name,
                          bool fast, int threads) {
  Topos__V1__ExecOptions *x = malloc(sizeof *x);
  Topos__V1__ExecOptions **grown =
      realloc(req->candidates, sizeof *grown * (req->n_candidates + 1));
  char *copy = strdup(name);
  if (grown) req->candidates = grown;
  if (!x || !grown || !copy) {
    free(x);
    free(copy);
    return false;
  }
  topos__v1__exec_options__init(x);
  x->backend = copy;
  x->numerics = fast ? TOPOS__V1__NUMERICS__FAST : TOPOS__V1__NUMERICS__EXACT;
  x->threads = threads > 0 ? (uint32_t)threads : 0;
  req->candidates[req->n_candidates++] = x;
  return true;
}

/* Candidates from --backend NAME[,NAME...] (an envelope backend runs fast:
 * that is the only numerics it may run) and --allow-envelope (every
 * envelope backend, fast).  Fidelity comes from the daemon's registry.
 * Returns -1, or an exit status. */
static int conformance_candidates(topos_client *c, const options *o,
                                  Topos__V1__ConformanceRequest *req) {
  if (!o->backend && !o->allow_envelope) return -1; /* the daemon's set */
  topos_error err = {0};
  topos_backend_info *info = NULL;
  int n = 0;
  if (topos_client_backends(c, &info, &n, &err) != TOPOS_OK) {
    call_error("conformance (listing backends)", &err);
    return 2;
  }
  int rc = -1;
  if (o->backend) {
    char *list = strdup(o->backend);
    for (char *save = NULL, *tok = list ? strtok_r(list, ",", &save) : NULL;
         tok && rc < 0; tok = strtok_r(NULL, ",", &save)) {
      bool envelope = false;
      for (int i = 0; i < n; i++)
        if (strcmp(info[i].name, tok) == 0)
          envelope = strcmp(info[i].fidelity, "envelope") == 0;
      /* An unknown name goes as it is: the daemon's error lists the
       * known ones. */
      if (!add_candidate(req, tok, o->fast || envelope, o->threads))
        rc = usage_error("out of memory");
    }
    if (!list) rc = usage_error("out of memory");
    free(list);
  } else {
    for (int i = 0; i < n && rc < 0; i++) {
      bool envelope = strcmp(info[i].fidelity, "envelope") == 0;
      if ((i == 0 || strcmp(info[i].fidelity, "exact") == 0 || envelope) &&
          !add_candidate(req, info[i].name, envelope || o->fast, o->threads))
        rc = usage_error("out of memory");
    }
  }
  topos_free(info);
  return rc;
}

/* One line per candidate, and one per output of a row that is not
 * bit-identical (how far it is).  Exit status 0 when every row holds, 1
 * when one does not, 2 when the call itself fails. */
static int cmd_conformance(topos_client *c, const options *o) {
  topos_error err = {0};
  Topos__V1__ConformanceRequest req = TOPOS__V1__CONFORMANCE_REQUEST__INIT;
  int rc = build_entry(c, o, &req.entry, &err);
  if (rc >= 0) return rc == 1 ? 2 : rc;
  rc = conformance_candidates(c, o, &req);
  if (rc >= 0) {
    wire_message_clear(&req.base);
    return rc;
  }
  req.id = heap_id(o->id);
  ProtobufCMessage *r = NULL;
  int st = call(c, o, "Conformance", &req.base,
                &topos__v1__conformance_reply__descriptor, &r, &err);
  wire_message_clear(&req.base);
  if (st != TOPOS_OK) {
    call_error("conformance", &err);
    return 2;
  }
  Topos__V1__ConformanceReply *reply = (Topos__V1__ConformanceReply *)r;
  int red = 0;
  printf("%-12s %-8s %-8s %-6s %-10s %-10s %-10s %s\n", "backend", "numerics",
         "fidelity", "holds", "max_ulp", "max_rel", "rel_l2", "ran");
  for (size_t i = 0; i < reply->n_results; i++) {
    const Topos__V1__BackendResult *b = reply->results[i];
    if (!b->holds) red++;
    char ran[160] = "";
    size_t at = 0;
    for (size_t k = 0; k < b->n_ran && at < sizeof ran; k++)
      at += (size_t)snprintf(ran + at, sizeof ran - at, "%s%s", k ? "," : "",
                             b->ran[k]);
    printf("%-12s %-8s %-8s %-6s %-10.3g %-10.3g %-10.3g %s\n", b->backend,
           b->numerics == TOPOS__V1__NUMERICS__FAST ? "fast" : "exact",
           b->fidelity, b->holds ? (b->bit_identical ? "bits" : "yes") : "NO",
           b->max_ulp, b->max_relative, b->rel_l2, ran[0] ? ran : "-");
    for (size_t k = 0; k < b->n_outputs && !b->bit_identical; k++) {
      const Topos__V1__OutputResult *out = b->outputs[k];
      printf("    %-28s %-6s max_ulp %-10.3g max_rel %-10.3g rel_l2 %-10.3g",
             out->what, out->holds ? "ok" : "NO", out->max_ulp,
             out->max_relative, out->rel_l2);
      if (out->envelope > 0) printf(" (envelope %g)", out->envelope);
      putchar('\n');
    }
    if (b->note && b->note[0]) printf("    %s\n", b->note);
  }
  if (reply->n_results == 0) {
    fprintf(stderr, "topos: conformance: the daemon reported no backend\n");
    red++;
  }
  wire_message_free(r);
  if (red)
    fprintf(stderr, "topos: conformance: %d row%s do%s not hold\n", red,
            red == 1 ? "" : "s", red == 1 ? "es" : "");
  return red ? 1 : 0;
}

/* The registry, remote (the daemon's) or in-process (--local: this
 * binary's, the backends toposd registers by default). */
static int print_backends(const topos_backend_info *info, int n) {
  printf("%-10s %-8s %-7s %-10s %s\n", "backend", "fidelity", "threads",
         "tasks_run", "device");
  for (int i = 0; i < n; i++) {
    const topos_backend_info *b = &info[i];
    printf("%-10s %-8s %-7d %-10llu %s\n", b->name, b->fidelity, b->threads,
           (unsigned long long)b->tasks_run, b->device);
    printf("    dtypes:");
    for (int d = 0; d < 4; d++)
      if (b->dtypes & (1u << d))
        printf(" %s", topos_dtype_name((topos_dtype)d));
    putchar('\n');
    if (i == 0) {
      printf("    ops: every op (what no backend takes)\n");
      continue;
    }
    for (int k = 0; k < 4; k++)
      if (b->tasks & (1u << k)) printf("    ops: %s\n", topos_task_ops(k));
  }
  return 0;
}

static int cmd_backends(topos_client *c, const options *o) {
  topos_error err = {0};
  topos_backend_info *info = NULL;
  int n = 0;
  if (topos_client_backends(c, &info, &n, &err) != TOPOS_OK)
    return call_error("backends", &err);
  print_backends(info, n);
  topos_free(info);
  return 0;
}

static int cmd_backends_local(void) {
  topos_backends_register_defaults();
  topos_backend_info info[TOPOS_BACKENDS_MAX];
  int n = topos_backends_list(info, TOPOS_BACKENDS_MAX);
  print_backends(info, n < TOPOS_BACKENDS_MAX ? n : TOPOS_BACKENDS_MAX);
  /* The plugins, and the devices they use. */
  char plugins[512];
  topos_backends_plugin_report(plugins, sizeof plugins);
  printf("plugins: %s\n", plugins);
  topos_device_info dev[TOPOS_DEVICES_MAX];
  int nd = topos_devices_list(dev, TOPOS_DEVICES_MAX);
  for (int i = 0; i < nd && i < TOPOS_DEVICES_MAX; i++)
    printf("device %s:%d %s sm_%d%d %d SMs %.1f GiB (%.1f free) tasks %llu\n",
           dev[i].backend, dev[i].ordinal, dev[i].name, dev[i].cc_major,
           dev[i].cc_minor, dev[i].multiprocessors,
           dev[i].memory_total / 1073741824.0,
           dev[i].memory_free / 1073741824.0, (unsigned long long)dev[i].tasks);
  return 0;
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
  printf(
      "connections %lld\nconnections_shed %lld\nconnections_refused "
      "%lld\nconnection_cap %d\n",
      (long long)s.connections, (long long)s.connections_shed,
      (long long)s.connections_refused, s.connection_cap);
  for (int i = 0; i < s.nbackends; i++)
    printf("backend_tasks %s %lld\n", s.backend_names[i],
           (long long)s.backend_tasks[i]);
  return 0;
}

/* The stored specs, page by page (ListSpecs). */
static int cmd_list(topos_client *c, const options *o) {
  char token[256] = "";
  for (;;) {
    Topos__V1__ListSpecsRequest req = TOPOS__V1__LIST_SPECS_REQUEST__INIT;
    req.page_size = 100;
    req.page_token = token;
    ProtobufCMessage *r = NULL;
    topos_error err = {0};
    if (call(c, o, "ListSpecs", &req.base,
             &topos__v1__list_specs_reply__descriptor, &r, &err) != TOPOS_OK)
      return call_error("list", &err);
    Topos__V1__ListSpecsReply *rep = (Topos__V1__ListSpecsReply *)r;
    for (size_t i = 0; i < rep->n_specs; i++) {
      const Topos__V1__SpecInfo *sp = rep->specs[i];
      char when[2][32];
      int64_t ms[2] = {sp->created_ms, sp->last_used_ms};
      for (int k = 0; k < 2; k++) {
        time_t t = (time_t)(ms[k] / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(when[k], sizeof when[k], "%Y-%m-%dT%H:%M:%SZ", &tm);
      }
      printf("%s %lld %s %s\n", sp->id, (long long)sp->bytes, when[0], when[1]);
    }
    bool more = rep->next_page_token && rep->next_page_token[0] &&
                strlen(rep->next_page_token) < sizeof token;
    if (more) snprintf(token, sizeof token, "%s", rep->next_page_token);
    wire_message_free(r);
    if (!more) return 0;
  }
}

/* ------------------------------------------------------- administration */

static const char *const admin_usage =
    "usage: topos [WHERE] tenant add NAME [--admin] [--with-token]\n"
    "       topos [WHERE] tenant list\n"
    "       topos [WHERE] tenant remove NAME\n"
    "       topos [WHERE] token create TENANT\n"
    "       topos [WHERE] token list TENANT\n"
    "       topos [WHERE] token revoke TOKEN_ID\n"
    "       topos [WHERE] quota set TENANT [--stored-bytes N] [--inflight N]\n"
    "             [--rate R --burst B] [--nodes N] [--run-ms N] "
    "[--run-bytes N]\n"
    "             [--device-bytes N] [--weight W]\n"
    "       topos [WHERE] quota show TENANT\n"
    "\n"
    "WHERE is the store file or the daemon:\n"
    "  --store PATH     works on the daemon's store file directly; safe while\n"
    "                   toposd runs (SQLite locks the file, and the daemon\n"
    "                   reads tokens on every call, so a revoked token is\n"
    "                   refused from the next call on)\n"
    "  --server ADDRESS goes through the daemon, with an admin tenant's\n"
    "                   token (--token TOKEN or $TOPOS_TOKEN; --tls-ca,\n"
    "                   --tls-cert, --tls-key and --deadline as for the other\n"
    "                   commands)\n"
    "Without either: $TOPOS_STORE when set, else $TOPOS_SERVER when set, else\n"
    "the file ./var/topos.db.  Both ways print the same: token create (and\n"
    "tenant add --with-token, which also creates the tenant's first token)\n"
    "prints the secret on stdout, once; only its SHA-256 is stored.  Every\n"
    "change prints an audit line on stderr.  Tenant names are 1..64 of a-z,\n"
    "0-9, '_' and '-'.  Exit status 0, 1 when refused (unknown tenant or\n"
    "token, a taken name, not an admin), 2 on a usage error or when the\n"
    "daemon cannot be reached.\n";

static const char *const quota_usage =
    "usage: topos [WHERE] quota set TENANT [--stored-bytes N] "
    "[--inflight N]\n"
    "             [--rate R --burst B] [--nodes N] [--run-ms N] "
    "[--run-bytes N]\n"
    "             [--device-bytes N] [--weight W]\n"
    "       topos [WHERE] quota show TENANT\n"
    "\n"
    "Per-tenant quotas (docs/operations.md, \"Quotas\"), on the daemon's\n"
    "store file (--store PATH) or through the daemon (--server ADDRESS, an\n"
    "admin tenant's token; topos tenant --help says which is the default);\n"
    "a change applies from the daemon's next call.  A value 'none' clears a\n"
    "quota (unlimited); --rate none clears the burst too.  --weight W\n"
    "(1..1000, none: 1) is the tenant's share of the workers when tenants\n"
    "compete (\"Fair scheduling\").  --device-bytes N bounds the device\n"
    "memory of one run on a GPU host (its largest task's operands and\n"
    "output).\n";

static void format_ms(int64_t ms, char *out, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Where the administration commands work: the store file, or the daemon
 * (server set). */
typedef struct admin_target {
  const char *store_path, *server;
  const char *token, *tls_ca, *tls_cert, *tls_key;
  double deadline;
  topos_store *st;
  topos_client *c;
} admin_target;

/* One line per change, on stderr: what, on which store or daemon, by
 * whom.  Never a secret.  (Through the daemon, the daemon logs its own
 * line too: event=audit, with the caller's tenant and address.) */
static void audit(const admin_target *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void audit(const admin_target *t, const char *fmt, ...) {
  char what[640], when[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  format_ms((int64_t)ts.tv_sec * 1000, when, sizeof when);
  const char *user = getenv("USER");
  fprintf(stderr, "topos: audit ts=%s %s %s=%s uid=%u user=%s\n", when, what,
          t->server ? "server" : "store", t->server ? t->server : t->store_path,
          (unsigned)getuid(), user && *user ? user : "-");
}

/* The store file for the admin commands (NULL with the reason printed):
 * a missing file is a wrong --store, not an empty store, unless the
 * command may create it (tenant add). */
static topos_store *admin_store_open(const char *store_path, bool may_create,
                                     topos_error *err) {
  struct stat sb;
  if (!may_create && stat(store_path, &sb) != 0) {
    fprintf(stderr,
            "topos: no store at %s (the daemon's --store; pass --store PATH "
            "or set TOPOS_STORE, or go through the daemon with --server "
            "ADDRESS)\n",
            store_path);
    return NULL;
  }
  topos_store *st = store_open(store_path, err);
  if (st == NULL) fprintf(stderr, "topos: %s\n", err->message);
  return st;
}

/* A client of `server` with the CLI's TLS settings (a flag overrides its
 * environment variable, one by one), deadline and token.  NULL with the
 * exit status in *rc (2: a connect or usage error, printed). */
static topos_client *cli_connect(const char *server, const char *tls_ca,
                                 const char *tls_cert, const char *tls_key,
                                 double deadline, const char *token, int *rc) {
  topos_error err = {0};
  topos_client_tls tls = {tls_ca, tls_cert, tls_key};
  const char *const env_names[3] = {"TOPOS_TLS_CA", "TOPOS_TLS_CERT",
                                    "TOPOS_TLS_KEY"};
  const char **fields[3] = {&tls.ca_file, &tls.cert_file, &tls.key_file};
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(env_names[i]);
    if (*fields[i] == NULL && v != NULL && v[0] != '\0') *fields[i] = v;
  }
  topos_client *c = topos_client_connect_tls(server, &tls, &err);
  if (!c) {
    /* "--server needs HOST:PORT", not the library's "connect: ...". */
    const char *m = err.message;
    if (strncmp(m, "connect: ", 9) == 0) m += 9;
    *rc = strstr(m, "needs HOST:PORT") != NULL
              ? usage_error("--server %s: %s", server, m)
              : (call_error("connect", &err), 2);
    return NULL;
  }
  if (deadline > 0) topos_client_set_deadline(c, deadline);
  /* A person waits: a daemon that is down is said so within seconds,
   * not after the library's 30 s of retries. */
  topos_client_set_retry(c, 2.0);
  if (token && topos_client_set_token(c, token, &err) != TOPOS_OK) {
    topos_client_close(c);
    *rc = usage_error("--token: %s", err.message);
    return NULL;
  }
  return c;
}

/* Picks the store file or the daemon (admin_usage says how) and opens it;
 * `create`: the command may create a missing store file.  Returns -1, or
 * an exit status. */
static int admin_open(admin_target *t, bool create, topos_error *err) {
  if (t->store_path && t->server)
    return usage_error(
        "--store PATH (the store file) and --server ADDRESS (the daemon) "
        "exclude each other: pick one");
  if (!t->store_path && !t->server) {
    const char *store = getenv("TOPOS_STORE");
    const char *server = getenv("TOPOS_SERVER");
    if (store && store[0])
      t->store_path = store;
    else if (server && server[0])
      t->server = server;
    else
      t->store_path = "./var/topos.db";
  }
  if (t->store_path) {
    const char *stray = t->token      ? "--token"
                        : t->tls_ca   ? "--tls-ca"
                        : t->tls_cert ? "--tls-cert"
                        : t->tls_key  ? "--tls-key"
                        : t->deadline ? "--deadline"
                                      : NULL;
    if (stray)
      return usage_error(
          "%s applies through the daemon (--server ADDRESS); on the store "
          "file %s it is not needed",
          stray, t->store_path);
    t->st = admin_store_open(t->store_path, create, err);
    return t->st ? -1 : 1;
  }
  int rc = 2;
  t->c = cli_connect(t->server, t->tls_ca, t->tls_cert, t->tls_key, t->deadline,
                     t->token, &rc);
  return t->c ? -1 : rc;
}

static void admin_close(admin_target *t) {
  store_close(t->st);
  topos_client_close(t->c);
  t->st = NULL;
  t->c = NULL;
}

/* A refused change or a failed call: the message on stderr; exit status
 * 1, or 2 when the daemon cannot be reached (UNAVAILABLE). */
static int admin_failed(const admin_target *t, const topos_error *err) {
  fprintf(stderr, "topos: %s\n", err->message[0] ? err->message : "failed");
  if (t->c && topos_client_grpc_status(err->code) == WIRE_GRPC_UNAVAILABLE)
    return 2;
  return 1;
}

static void tenant_of(const topos_client_tenant *c, store_tenant_info *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->name, sizeof s->name, "%s", c->name);
  s->admin = c->admin;
  s->created_ms = c->created_ms;
  s->live_tokens = c->live_tokens;
}

static void token_of(const topos_client_token *c, store_token_info *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->id, sizeof s->id, "%s", c->id);
  snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant);
  s->created_ms = c->created_ms;
  s->revoked_ms = c->revoked_ms;
}

static store_quota quota_of(const topos_client_quota *c) {
  return (store_quota){.stored_bytes = c->stored_bytes,
                       .inflight = c->inflight,
                       .rate_per_s = c->rate_per_s,
                       .burst = c->burst,
                       .nodes_per_spec = c->nodes_per_spec,
                       .run_ms = c->run_ms,
                       .run_bytes = c->run_bytes,
                       .device_bytes = c->device_bytes,
                       .weight = c->weight};
}

/* The secret on stdout (alone, so TOKEN=$(topos token create T) works),
 * then what it is on stderr. */
static void show_secret(char *secret, const char *id, const char *tenant) {
  printf("%s\n", secret);
  fflush(stdout);
  memset(secret, 0, strlen(secret));
  fprintf(stderr,
          "topos: token %s created for tenant %s; the secret above is "
          "shown only now (the store keeps its SHA-256): give it to the "
          "client as TOPOS_TOKEN\n",
          id, tenant);
}

/* tenant add NAME [--admin] [--with-token] */
static int admin_tenant_add(admin_target *t, const char *name, bool admin,
                            bool with_token) {
  topos_error err = {0};
  char id[STORE_TOKEN_ID_LEN + 1] = "", secret[STORE_TOKEN_SECRET_LEN + 1] = "";
  int rc = 0;
  bool added = false;
  if (t->st) {
    added = store_tenant_add(t->st, name, admin, &err) == TOPOS_OK;
    if (added && with_token &&
        store_token_create(t->st, name, id, secret, &err) != TOPOS_OK)
      rc = 1;
  } else {
    topos_client_token tok;
    added = topos_client_tenant_add(
                t->c, name, admin, NULL, with_token ? &tok : NULL,
                with_token ? secret : NULL, &err) == TOPOS_OK;
    if (added && with_token) snprintf(id, sizeof id, "%s", tok.id);
  }
  if (!added) return admin_failed(t, &err);
  if (with_token && rc == 0) {
    fprintf(stderr, "topos: tenant %s added%s\n", name,
            admin ? " (admin)" : "");
    show_secret(secret, id, name);
    audit(t, "action=tenant.add tenant=%s admin=%d token=%s", name,
          admin ? 1 : 0, id);
    return 0;
  }
  printf("tenant %s added%s\n", name, admin ? " (admin)" : "");
  audit(t, "action=tenant.add tenant=%s admin=%d", name, admin ? 1 : 0);
  if (rc != 0) {
    fprintf(stderr, "topos: the tenant has no token: %s\n", err.message);
    return rc;
  }
  return 0;
}

static int admin_tenant_list(admin_target *t) {
  topos_error err = {0};
  store_tenant_info *rows = NULL;
  int n = 0;
  if (t->st) {
    if (store_tenant_list(t->st, &rows, &n, &err) != TOPOS_OK)
      return admin_failed(t, &err);
  } else {
    topos_client_tenant *v = NULL;
    if (topos_client_tenant_list(t->c, &v, &n, &err) != TOPOS_OK)
      return admin_failed(t, &err);
    rows = calloc(n > 0 ? (size_t)n : 1, sizeof *rows);
    for (int i = 0; rows && i < n; i++) tenant_of(&v[i], &rows[i]);
    free(v);
    if (!rows) return usage_error("out of memory");
  }
  printf("%-24s %-5s %-6s %s\n", "TENANT", "ADMIN", "TOKENS", "CREATED");
  for (int i = 0; i < n; i++) {
    char when[32];
    format_ms(rows[i].created_ms, when, sizeof when);
    printf("%-24s %-5s %-6lld %s\n", rows[i].name, rows[i].admin ? "yes" : "no",
           (long long)rows[i].live_tokens, when);
  }
  free(rows);
  return 0;
}

static int admin_tenant_remove(admin_target *t, const char *name) {
  topos_error err = {0};
  int rc = t->st ? store_tenant_remove(t->st, name, &err)
                 : topos_client_tenant_remove(t->c, name, NULL, &err);
  if (rc != TOPOS_OK) return admin_failed(t, &err);
  printf("tenant %s removed, with its tokens\n", name);
  audit(t, "action=tenant.remove tenant=%s", name);
  return 0;
}

static int admin_token_create(admin_target *t, const char *tenant) {
  topos_error err = {0};
  char id[STORE_TOKEN_ID_LEN + 1] = "", secret[STORE_TOKEN_SECRET_LEN + 1] = "";
  int rc;
  if (t->st) {
    rc = store_token_create(t->st, tenant, id, secret, &err);
  } else {
    topos_client_token tok;
    rc = topos_client_token_create(t->c, tenant, &tok, secret, &err);
    if (rc == TOPOS_OK) snprintf(id, sizeof id, "%s", tok.id);
  }
  if (rc != TOPOS_OK) return admin_failed(t, &err);
  show_secret(secret, id, tenant);
  audit(t, "action=token.create tenant=%s token=%s", tenant, id);
  return 0;
}

static int admin_token_list(admin_target *t, const char *tenant) {
  topos_error err = {0};
  store_token_info *rows = NULL;
  int n = 0;
  if (t->st) {
    if (store_token_list(t->st, tenant, &rows, &n, &err) != TOPOS_OK)
      return admin_failed(t, &err);
  } else {
    topos_client_token *v = NULL;
    if (topos_client_token_list(t->c, tenant, &v, &n, &err) != TOPOS_OK)
      return admin_failed(t, &err);
    rows = calloc(n > 0 ? (size_t)n : 1, sizeof *rows);
    for (int i = 0; rows && i < n; i++) token_of(&v[i], &rows[i]);
    free(v);
    if (!rows) return usage_error("out of memory");
  }
  printf("%-16s %-20s %s\n", "TOKEN_ID", "CREATED", "STATE");
  for (int i = 0; i < n; i++) {
    char made[32], gone[32] = "";
    format_ms(rows[i].created_ms, made, sizeof made);
    if (rows[i].revoked_ms) format_ms(rows[i].revoked_ms, gone, sizeof gone);
    printf("%-16s %-20s %s%s\n", rows[i].id, made,
           rows[i].revoked_ms ? "revoked " : "live", gone);
  }
  free(rows);
  return 0;
}

static int admin_token_revoke(admin_target *t, const char *id) {
  topos_error err = {0};
  int rc = t->st ? store_token_revoke(t->st, id, &err)
                 : topos_client_token_revoke(t->c, id, NULL, &err);
  if (rc != TOPOS_OK) return admin_failed(t, &err);
  printf("token %s revoked\n", id);
  audit(t, "action=token.revoke token=%s", id);
  return 0;
}

/* quota set (mask != 0) or show: prints the quotas after it. */
static int admin_quota(admin_target *t, const char *tenant,
                       const store_quota *q, unsigned mask) {
  topos_error err = {0};
  store_quota now;
  store_tenant_info info;
  if (t->st) {
    /* An unknown tenant is an error, not a tenant without quotas. */
    if ((mask && store_quota_set(t->st, tenant, q, mask, &err) != TOPOS_OK) ||
        (!mask && store_tenant_get(t->st, tenant, &info, &err) != TOPOS_OK) ||
        store_quota_get(t->st, tenant, &now, NULL, &err) != TOPOS_OK)
      return admin_failed(t, &err);
  } else {
    /* The client's bits are the store's (topos_client.h). */
    topos_client_quota cq = {.stored_bytes = q->stored_bytes,
                             .inflight = q->inflight,
                             .rate_per_s = q->rate_per_s,
                             .burst = q->burst,
                             .nodes_per_spec = q->nodes_per_spec,
                             .run_ms = q->run_ms,
                             .run_bytes = q->run_bytes,
                             .weight = q->weight,
                             .device_bytes = q->device_bytes};
    topos_client_quota got;
    int rc = mask ? topos_client_quota_set(t->c, tenant, &cq, mask, &got, &err)
                  : topos_client_quota_show(t->c, tenant, &got, &err);
    if (rc != TOPOS_OK) return admin_failed(t, &err);
    now = quota_of(&got);
  }
  char line[400];
  store_quota_format(&now, line, sizeof line);
  printf("tenant %s: %s\n", tenant, line);
  if (mask) audit(t, "action=quota.set tenant=%s %s", tenant, line);
  return 0;
}

/* A quota's value: a non-negative integer, or "none" (STORE_QUOTA_NONE). */
static bool quota_value(const char *text, int64_t *out) {
  if (strcmp(text, "none") == 0) {
    *out = STORE_QUOTA_NONE;
    return true;
  }
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0) return false;
  *out = v;
  return true;
}

#define SAME_BIT(name) \
  ((int)STORE_QUOTA_##name == (int)TOPOS_CLIENT_QUOTA_##name)
_Static_assert(SAME_BIT(STORED_BYTES) && SAME_BIT(INFLIGHT) && SAME_BIT(RATE) &&
                   SAME_BIT(NODES) && SAME_BIT(RUN_MS) && SAME_BIT(RUN_BYTES) &&
                   SAME_BIT(WEIGHT) && SAME_BIT(DEVICE_BYTES),
               "the client's quota bits are the store's");
#undef SAME_BIT

/* tenant, token and quota, on the store file or through the daemon. */
static int admin_main(int argc, char **argv) {
  admin_target t;
  memset(&t, 0, sizeof t);
  const char *pos[4] = {NULL};
  int npos = 0;
  bool admin = false, with_token = false;
  store_quota q = store_quota_unlimited();
  unsigned mask = 0;
  bool rate_given = false, burst_given = false;
  static const struct {
    const char *flag;
    unsigned bit;
    size_t offset;
  } flags[] = {
      {"--stored-bytes", STORE_QUOTA_STORED_BYTES,
       offsetof(store_quota, stored_bytes)},
      {"--inflight", STORE_QUOTA_INFLIGHT, offsetof(store_quota, inflight)},
      {"--burst", STORE_QUOTA_RATE, offsetof(store_quota, burst)},
      {"--nodes", STORE_QUOTA_NODES, offsetof(store_quota, nodes_per_spec)},
      {"--run-ms", STORE_QUOTA_RUN_MS, offsetof(store_quota, run_ms)},
      {"--run-bytes", STORE_QUOTA_RUN_BYTES, offsetof(store_quota, run_bytes)},
      {"--device-bytes", STORE_QUOTA_DEVICE_BYTES,
       offsetof(store_quota, device_bytes)},
      {"--weight", STORE_QUOTA_WEIGHT, offsetof(store_quota, weight)},
  };
  bool help = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool more = i + 1 < argc;
    int k = -1;
    for (int f = 0; f < (int)(sizeof flags / sizeof flags[0]); f++)
      if (strcmp(a, flags[f].flag) == 0) k = f;
    const char **value = strcmp(a, "--store") == 0      ? &t.store_path
                         : strcmp(a, "--server") == 0   ? &t.server
                         : strcmp(a, "--token") == 0    ? &t.token
                         : strcmp(a, "--tls-ca") == 0   ? &t.tls_ca
                         : strcmp(a, "--tls-cert") == 0 ? &t.tls_cert
                         : strcmp(a, "--tls-key") == 0  ? &t.tls_key
                                                        : NULL;
    if (value != NULL) {
      if (!more) return usage_error("%s needs a value", a);
      *value = argv[++i];
    } else if (strcmp(a, "--deadline") == 0) {
      if (!more) return usage_error("--deadline needs a value");
      char *end = NULL;
      t.deadline = strtod(argv[++i], &end);
      if (!end || *end || !(t.deadline > 0))
        return usage_error("--deadline needs a positive number of seconds");
    } else if (strcmp(a, "--admin") == 0) {
      admin = true;
    } else if (strcmp(a, "--with-token") == 0) {
      with_token = true;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      help = true;
    } else if (strcmp(a, "--rate") == 0) {
      if (!more) return usage_error("--rate needs a value");
      const char *v = argv[++i];
      char *end;
      errno = 0;
      double r = strcmp(v, "none") == 0 ? STORE_QUOTA_NONE : strtod(v, &end);
      if (strcmp(v, "none") != 0 &&
          (errno != 0 || end == v || *end != '\0' || !(r > 0)))
        return usage_error(
            "--rate: '%s' is not a rate (calls per second, > 0) or none", v);
      q.rate_per_s = r;
      mask |= STORE_QUOTA_RATE;
      rate_given = true;
    } else if (k >= 0) {
      if (!more) return usage_error("%s needs a value", a);
      int64_t v;
      if (!quota_value(argv[++i], &v))
        return usage_error("%s: '%s' is not a count (0 or more) or none", a,
                           argv[i]);
      *(int64_t *)((char *)&q + flags[k].offset) = v;
      mask |= flags[k].bit;
      if (flags[k].bit == STORE_QUOTA_RATE) burst_given = true;
    } else if (a[0] == '-' && a[1] != '\0') {
      return usage_error("unknown option %s", a);
    } else if (npos < 4) {
      pos[npos++] = a;
    } else {
      return usage_error("unexpected argument %s", a);
    }
  }
  bool quota = strcmp(pos[0], "quota") == 0;
  bool tenant = strcmp(pos[0], "tenant") == 0;
  if (help) {
    fputs(quota ? quota_usage : admin_usage, stdout);
    return 0;
  }
  const char *sub = pos[1] ? pos[1] : "";
  int want = -1; /* positional arguments after the subcommand */
  if (tenant && strcmp(sub, "add") == 0) want = 1;
  if (tenant && strcmp(sub, "list") == 0) want = 0;
  if (tenant && strcmp(sub, "remove") == 0) want = 1;
  if (!tenant && !quota && strcmp(sub, "create") == 0) want = 1;
  if (!tenant && !quota && strcmp(sub, "list") == 0) want = 1;
  if (!tenant && !quota && strcmp(sub, "revoke") == 0) want = 1;
  if (quota && (strcmp(sub, "set") == 0 || strcmp(sub, "show") == 0)) want = 1;
  if (want < 0 || npos != 2 + want) {
    fputs(quota ? quota_usage : admin_usage, stderr);
    return 2;
  }
  bool add = tenant && strcmp(sub, "add") == 0;
  if (admin && !add) return usage_error("--admin applies to tenant add only");
  if (with_token && !add)
    return usage_error("--with-token applies to tenant add only");
  if (mask != 0 && !quota)
    return usage_error("quota options apply to quota set only");
  const char *arg = pos[2];
  if ((tenant || quota || strcmp(sub, "revoke") != 0) && arg &&
      !store_tenant_name_valid(arg))
    return usage_error(
        "\"%s\" is not a tenant name (1..%d of a-z, 0-9, '_', "
        "'-')",
        arg, STORE_TENANT_NAME_MAX);
  bool set = quota && strcmp(sub, "set") == 0;
  if (quota && !set && mask != 0)
    return usage_error("quota show takes no quota options");
  if (set && mask == 0)
    return usage_error("quota set needs at least one quota option");
  /* --rate none alone clears the burst too; the rest of the rules are the
   * store's, which the daemon applies the same way. */
  if (rate_given && q.rate_per_s < 0 && !burst_given) q.burst = -1;
  topos_error err = {0};
  if (set && store_quota_check(&q, mask, &err) != TOPOS_OK)
    return usage_error("quota set: %s", strncmp(err.message, "store: ", 7) == 0
                                            ? err.message + 7
                                            : err.message);
  /* Only tenant add may create the store file. */
  int rc = admin_open(&t, add, &err);
  if (rc >= 0) return rc;
  if (add)
    rc = admin_tenant_add(&t, arg, admin, with_token);
  else if (tenant && strcmp(sub, "remove") == 0)
    rc = admin_tenant_remove(&t, arg);
  else if (tenant)
    rc = admin_tenant_list(&t);
  else if (quota)
    rc = admin_quota(&t, arg, &q, mask);
  else if (strcmp(sub, "create") == 0)
    rc = admin_token_create(&t, arg);
  else if (strcmp(sub, "list") == 0)
    rc = admin_token_list(&t, arg);
  else
    rc = admin_token_revoke(&t, arg);
  admin_close(&t);
  fflush(stdout);
  return rc;
}

int main(int argc, char **argv) {
  /* tenant, token and quota: on the store file or through the daemon. */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--server") == 0 || strcmp(a, "--deadline") == 0 ||
        strcmp(a, "--token") == 0 || strcmp(a, "--store") == 0 ||
        strcmp(a, "--tls-ca") == 0 || strcmp(a, "--tls-cert") == 0 ||
        strcmp(a, "--tls-key") == 0) {
      i++;
      continue;
    }
    if (a[0] == '-') continue;
    if (strcmp(a, "tenant") == 0 || strcmp(a, "token") == 0 ||
        strcmp(a, "quota") == 0)
      return admin_main(argc, argv);
    break;
  }
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
                      : o.local && k != 7                 ? "--local"
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

  if (k == 7 && o.local) return cmd_backends_local();
  topos_client *c = cli_connect(o.server, o.tls_ca, o.tls_cert, o.tls_key,
                                o.deadline, o.token, &rc);
  if (!c) return rc;
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
    case 6:
      rc = cmd_stats(c, &o);
      break;
    case 7:
      rc = cmd_backends(c, &o);
      break;
    default:
      rc = cmd_list(c, &o);
      break;
  }
  topos_client_close(c);
  fflush(stdout);
  return rc;
}
