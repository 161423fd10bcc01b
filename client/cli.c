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
 *   list                 the stored specs, newest first
 *   forward ID           [ENTRY] [--feed NAME=FILE ...] [--params FILE]
 *                        [--out FILE]  the entry's roots and observes on
 *                        tensors read from files (.npy, .safetensors),
 *                        written to FILE (.safetensors, or .npy for one
 *                        root) or printed
 *   step ID              --loss V --lr X [--optimizer sgd|adam|adamw]
 *                        [--momentum X] [--beta1 X] [--beta2 X] [--eps X]
 *                        [--weight-decay X] [--feed NAME=FILE ...]
 *                        [--params FILE] [--state FILE] [--out-params FILE]
 *                        [--out-state FILE]  one optimizer step; prints the
 *                        loss; the parameters and state it writes are the
 *                        next step's --params and --state
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
 * is 0 on success, 1 on a failed call or mismatch, 2 on a usage error
 * (for forward and step also a file that cannot be read, is malformed or
 * does not fit the spec).
 *
 * Values travel by name here, so the CLI builds its requests itself
 * (proto/wire.h, protobuf-c) and sends them with topos_client_call_raw.
 */
#include <cJSON.h>
#include <ctype.h>
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

/* step's hyperparameters, in Optimizer's field order (hp_flags). */
enum {
  HP_LR,
  HP_MOMENTUM,
  HP_BETA1,
  HP_BETA2,
  HP_EPS,
  HP_WEIGHT_DECAY,
  HP_COUNT
};
static const char *const hp_flags[HP_COUNT] = {
    "--lr", "--momentum", "--beta1", "--beta2", "--eps", "--weight-decay"};

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
  /* forward and step */
  const char **feeds; /* --feed NAME=FILE, nfeeds of them (argv's) */
  int nfeeds;
  const char *params, *out;
  const char *loss, *state, *optimizer, *out_params, *out_state;
  double hp[HP_COUNT];
  bool hp_given[HP_COUNT];
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
    "  forward ID [ENTRY] [--feed NAME=FILE ...] [--params FILE] [--out FILE]\n"
    "                              run the entry on tensors from files\n"
    "  step ID --loss V --lr X [--optimizer sgd|adam|adamw] [--feed ...]\n"
    "       [--params FILE] [--state FILE] [--out-params FILE]\n"
    "       [--out-state FILE]     one optimizer step; prints the loss\n"
    "  put-blob FILE               upload a file's tensors; prints the id\n"
    "  get-blob ID [--out FILE]    a blob's tensors, to a file or printed\n"
    "  delete ID                   remove a stored spec (an admin's call)\n"
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
    {"forward",
     "usage: topos forward ID [--roots V,...] [--observes V,...] [--training]\n"
     "                    [--fast] [--backend NAME] [--threads N]\n"
     "                    [--feed NAME=FILE ...] [--params FILE] [--out FILE]\n"
     "Runs the entry on the daemon with tensors read from files, and writes\n"
     "its roots and observes to a file or prints them.\n"
     "  --feed NAME=FILE  an input's value, NAME the input node's name\n"
     "                    or index (repeat it per input; the others take\n"
     "                    their defaults).  FILE is .npy, or .safetensors\n"
     "                    holding one tensor or one named NAME\n"
     "  --params FILE     every parameter slot, from a safetensors file: each\n"
     "                    tensor named as its parameter node, or by its slot\n"
     "                    (\"0\", \"1\", ...); other tensors are ignored.\n"
     "                    Default: the spec's initial values\n"
     "  --out FILE        .safetensors: every root and observe, named as\n"
     "                    --roots and --observes name them (a name, or an\n"
     "                    index's digits; root0, root1, ... without --roots);\n"
     "                    .npy: the one root.  Without it, one line per\n"
     "                    output on stdout: name, dtype, shape, and the\n"
     "                    elements when there are at most 16 (f32, bf16\n"
     "                    %.9g; f64 %.17g)\n"
     ".npy is NumPy's format 1.0 or 2.0, little-endian '<f4', '<f8' or '<i4'\n"
     "in C order (bf16 needs .safetensors).  Exit status 0; 1 when the call\n"
     "fails (the daemon's message: a feed that is not an input, a wrong dtype\n"
     "or shape) or a result cannot be written; 2 on a usage error or a file\n"
     "that cannot be read, is malformed or does not fit the spec.\n"},
    {"put-blob",
     "usage: topos put-blob FILE\n"
     "Uploads the tensors of FILE as one blob and prints its id (64 hex\n"
     "digits, the content's: the same tensors give the same id).  FILE is\n"
     ".safetensors (every tensor, in the file's order) or .npy (one).  A\n"
     "blob's tensors are parameter slots 0, 1, ... of a call that names it.\n"},
    {"get-blob",
     "usage: topos get-blob ID [--out FILE]\n"
     "Downloads blob ID's tensors: to FILE (.safetensors, named \"0\", \"1\",\n"
     "...; .npy for a blob of one tensor), or one line per tensor on stdout\n"
     "(index, dtype, shape, and the elements when there are at most 16).\n"},
    {"delete",
     "usage: topos delete ID\n"
     "Removes stored spec ID, whoever recorded it, and what the daemon\n"
     "cached from it (AdminSpecDelete: an admin tenant's token when the\n"
     "daemon has tenants).  Exit status 1 when there is no such spec or a\n"
     "call is running it.\n"},
    {"step",
     "usage: topos step ID --loss V --lr X [--optimizer sgd|adam|adamw]\n"
     "                 [--momentum X] [--beta1 X] [--beta2 X] [--eps X]\n"
     "                 [--weight-decay X] [--feed NAME=FILE ...]\n"
     "                 [--params FILE] [--state FILE] [--out-params FILE]\n"
     "                 [--out-state FILE]\n"
     "One training step on the daemon: forward, backward of the scalar V (a\n"
     "node name or index), and the optimizer's update.  Prints the loss\n"
     "before the update (%.17g).  The optimizer's defaults are the daemon's:\n"
     "  --optimizer KIND  sgd (the default), adam or adamw\n"
     "  --lr X            the learning rate; required\n"
     "  --momentum X      sgd only; default 0\n"
     "  --beta1 X, --beta2 X, --eps X\n"
     "                    adam and adamw only; defaults 0.9, 0.999, 1e-8\n"
     "  --weight-decay X  sgd and adam: L2 added to the gradient; adamw:\n"
     "                    decoupled, on the parameters of rank 2 or more;\n"
     "                    default 0, adamw 0.01\n"
     "  --state FILE      the optimizer state to go on from, as --out-state\n"
     "                    writes it; default: a fresh state\n"
     "  --out-params FILE the new parameters, a safetensors file named as\n"
     "                    --params reads it\n"
     "  --out-state FILE  the new optimizer state, a safetensors file: step\n"
     "                    (f64[1], the steps taken) and the moments m.KEY and\n"
     "                    v.KEY the optimizer keeps, KEY a parameter's name\n"
     "                    (or its slot)\n"
     "--feed and --params are read as for forward (topos forward --help).\n"
     "One step's --out-params and --out-state are the next one's --params\n"
     "and --state, bit for bit what topos_client_step passes on.  Exit status\n"
     "as for forward.\n"},
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

/* The hp_flags index of a flag, or -1. */
static int hp_index(const char *flag) {
  for (int i = 0; i < HP_COUNT; i++)
    if (strcmp(flag, hp_flags[i]) == 0) return i;
  return -1;
}

/* Parses argv into o (o->feeds has room for argc entries).  Returns -1 to
 * go on, or an exit status. */
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
    } else if (strcmp(a, "--feed") == 0) {
      if (!more) return usage_error("--feed needs NAME=FILE");
      o->feeds[o->nfeeds++] = argv[++i];
    } else if (strcmp(a, "--params") == 0) {
      VALUE(params);
    } else if (strcmp(a, "--out") == 0) {
      VALUE(out);
    } else if (strcmp(a, "--loss") == 0) {
      VALUE(loss);
    } else if (strcmp(a, "--state") == 0) {
      VALUE(state);
    } else if (strcmp(a, "--optimizer") == 0) {
      VALUE(optimizer);
    } else if (strcmp(a, "--out-params") == 0) {
      VALUE(out_params);
    } else if (strcmp(a, "--out-state") == 0) {
      VALUE(out_state);
    } else if (hp_index(a) >= 0) {
      int h = hp_index(a);
      if (!more) return usage_error("%s needs a value", a);
      const char *v = argv[++i];
      char *end = NULL;
      o->hp[h] = strtod(v, &end);
      if (!end || end == v || *end)
        return usage_error("%s needs a number, not '%s'", a, v);
      o->hp_given[h] = true;
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

/* A node given by index (decimal digits) or by name: a new Value, or NULL
 * (an index past INT32_MAX, or no memory). */
static Topos__V1__Value *value_of(const char *tok) {
  bool digits = *tok != '\0';
  for (const char *p = tok; *p; p++) digits = digits && *p >= '0' && *p <= '9';
  if (!digits) return wire_value_new_name(tok);
  errno = 0;
  long long k = strtoll(tok, NULL, 10);
  if (errno != 0 || k > INT32_MAX) return NULL;
  return wire_value_new_index((int32_t)k);
}

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
    Topos__V1__Value *val = value_of(tok);
    if (!val && digits) {
      rc = usage_error("%s: index %s is too large", what, tok);
      break;
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

static void format_ms(int64_t ms, char *out, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
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
      format_ms(sp->created_ms, when[0], sizeof when[0]);
      format_ms(sp->last_used_ms, when[1], sizeof when[1]);
      printf("%s %lld %s %s\n", sp->id, (long long)sp->bytes, when[0], when[1]);
    }
    bool more = rep->next_page_token && rep->next_page_token[0] &&
                strlen(rep->next_page_token) < sizeof token;
    if (more) snprintf(token, sizeof token, "%s", rep->next_page_token);
    wire_message_free(r);
    if (!more) return 0;
  }
}

/* ------------------------------------------------------- tensor files */

/* An input error: a file that cannot be read, is malformed or does not
 * fit the spec.  One line on stderr; exit status 2. */
static int input_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static int input_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("topos: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 2;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* "f32[2,3]" ("f64[]" for a scalar). */
static void shape_text(topos_dtype dtype, int rank, const int64_t *shape,
                       char *out, size_t cap) {
  size_t w = (size_t)snprintf(out, cap, "%s[", topos_dtype_name(dtype));
  for (int i = 0; i < rank && w < cap; i++)
    w += (size_t)snprintf(out + w, cap - w, "%s%lld", i ? "," : "",
                          (long long)shape[i]);
  if (w < cap) snprintf(out + w, cap - w, "]");
}

static void tensor_text(const topos_tensor *t, char *out, size_t cap) {
  shape_text(topos_tensor_dtype(t), topos_tensor_rank(t), topos_tensor_shape(t),
             out, cap);
}

/* A new file gets the permissions the umask leaves of 0666, as a shell
 * redirection or numpy.save would give it (the temporary file it was
 * written as is 0600). */
static void default_mode(const char *path) {
  mode_t mask = umask(0);
  umask(mask);
  (void)chmod(path, 0666 & ~mask);
}

/*
 * NumPy's .npy format (numpy.lib.format): the magic "\x93NUMPY", a major
 * and a minor version byte, the header's length (little-endian: 2 bytes
 * in version 1.0, 4 in 2.0), the header, then the elements.  The header
 * is an ASCII Python dict literal with exactly the keys 'descr',
 * 'fortran_order' and 'shape', padded with spaces and a newline.
 *
 * Read: versions 1.0 and 2.0; descr '<f4', '<f8' or '<i4' (f32, f64,
 * i32); fortran_order False; a tuple shape of at most TOPOS_MAX_RANK
 * extents whose byte count is exactly what follows the header.  Anything
 * else (another magic or version, a header past the end of the file,
 * another key or dtype, big-endian or column-major data, a shape that
 * overflows or disagrees with the file's size) is refused with the reason.
 * Written: version 1.0, the header padded so the data starts at a multiple
 * of 64 bytes, as numpy.save writes it.  bf16 has no NumPy dtype: it is
 * refused (.safetensors carries it).  The host is little-endian, as the
 * wire and safetensors assume.
 */
#define NPY_MAGIC "\x93NUMPY"

static const struct {
  const char *descr;
  topos_dtype dtype;
} npy_dtypes[] = {{"<f4", TOPOS_F32}, {"<f8", TOPOS_F64}, {"<i4", TOPOS_I32}};
#define NPY_NDTYPES ((int)(sizeof npy_dtypes / sizeof npy_dtypes[0]))

/* Where the header's parse is, and where it ends. */
typedef struct npy_cursor {
  const char *p, *end;
} npy_cursor;

static void npy_space(npy_cursor *c) {
  while (c->p < c->end &&
         (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

/* Takes ch (after blanks) when it comes next. */
static bool npy_char(npy_cursor *c, char ch) {
  npy_space(c);
  if (c->p >= c->end || *c->p != ch) return false;
  c->p++;
  return true;
}

/* A quoted string without escapes ('...' or "...") into out. */
static bool npy_string(npy_cursor *c, char *out, size_t cap) {
  npy_space(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
  char quote = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != quote) {
    if (*c->p == '\\' || n + 1 >= cap) return false;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end) return false;
  c->p++;
  out[n] = '\0';
  return true;
}

/* Takes the identifier w when it comes next, whole. */
static bool npy_word(npy_cursor *c, const char *w) {
  npy_space(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
  const char *after = c->p + n;
  if (after < c->end && (isalnum((unsigned char)*after) || *after == '_'))
    return false;
  c->p = after;
  return true;
}

/* A shape tuple: "()", "(3,)", "(2, 3)".  false with the reason. */
static bool npy_shape(npy_cursor *c, int64_t *shape, int *rank, char *why,
                      size_t cap) {
  *rank = 0;
  if (!npy_char(c, '(')) {
    snprintf(why, cap, "the header's shape is not a tuple");
    return false;
  }
  if (npy_char(c, ')')) return true;
  for (;;) {
    npy_space(c);
    if (c->p >= c->end || !isdigit((unsigned char)*c->p)) {
      snprintf(why, cap,
               "the header's shape holds something other than "
               "whole numbers");
      return false;
    }
    uint64_t v = 0;
    while (c->p < c->end && isdigit((unsigned char)*c->p)) {
      unsigned d = (unsigned)(*c->p++ - '0');
      if (v > ((uint64_t)INT64_MAX - d) / 10) {
        snprintf(why, cap, "a shape extent is too large");
        return false;
      }
      v = v * 10 + d;
    }
    if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2's long */
    if (*rank == TOPOS_MAX_RANK) {
      snprintf(why, cap, "the shape has more than %d extents", TOPOS_MAX_RANK);
      return false;
    }
    shape[(*rank)++] = (int64_t)v;
    if (npy_char(c, ',')) {
      if (npy_char(c, ')')) return true;
      continue;
    }
    /* "(3)" is the number 3 in Python, not a tuple. */
    if (*rank > 1 && npy_char(c, ')')) return true;
    snprintf(why, cap, "the header's shape is not a tuple of whole numbers");
    return false;
  }
}

/* "(2, 3)", "(3,)", "()": a shape as Python writes a tuple. */
static void npy_shape_text(const int64_t *shape, int rank, char *out,
                           size_t cap) {
  size_t w = (size_t)snprintf(out, cap, "(");
  for (int i = 0; i < rank && w < cap; i++)
    w += (size_t)snprintf(out + w, cap - w, "%s%lld", i ? ", " : "",
                          (long long)shape[i]);
  if (w < cap) snprintf(out + w, cap - w, rank == 1 ? ",)" : ")");
}

/* The header dict between p and end: descr, fortran_order, shape. */
static bool npy_header(npy_cursor *c, char *descr, size_t dcap, bool *fortran,
                       int64_t *shape, int *rank, char *why, size_t cap) {
  static const char *const keys[3] = {"descr", "fortran_order", "shape"};
  bool have[3] = {false, false, false};
  if (!npy_char(c, '{')) {
    snprintf(why, cap, "the header is not a dict");
    return false;
  }
  for (bool done = npy_char(c, '}'); !done;) {
    char key[32];
    if (!npy_string(c, key, sizeof key)) {
      snprintf(why, cap, "the header holds a key that is not a string");
      return false;
    }
    int k = -1;
    for (int i = 0; i < 3; i++)
      if (strcmp(key, keys[i]) == 0) k = i;
    if (k < 0) {
      snprintf(why, cap, "the header has an unexpected key '%s'", key);
      return false;
    }
    if (have[k]) {
      snprintf(why, cap, "the header has '%s' twice", key);
      return false;
    }
    have[k] = true;
    if (!npy_char(c, ':')) {
      snprintf(why, cap, "the header has no ':' after '%s'", key);
      return false;
    }
    if (k == 0 && !npy_string(c, descr, dcap)) {
      snprintf(why, cap,
               "the header's descr is not a plain dtype string "
               "(structured dtypes are not supported)");
      return false;
    }
    if (k == 1) {
      if (npy_word(c, "True")) {
        *fortran = true;
      } else if (npy_word(c, "False")) {
        *fortran = false;
      } else {
        snprintf(why, cap, "the header's fortran_order is not True or False");
        return false;
      }
    }
    if (k == 2 && !npy_shape(c, shape, rank, why, cap)) return false;
    if (npy_char(c, ','))
      done = npy_char(c, '}');
    else if (npy_char(c, '}'))
      done = true;
    else {
      snprintf(why, cap, "the header has no ',' or '}' after '%s'", key);
      return false;
    }
  }
  npy_space(c);
  if (c->p != c->end) {
    snprintf(why, cap, "the header has bytes after its dict");
    return false;
  }
  for (int k = 0; k < 3; k++)
    if (!have[k]) {
      snprintf(why, cap, "the header has no '%s'", keys[k]);
      return false;
    }
  return true;
}

/* A .npy file's bytes -> a new tensor, or NULL with the reason in why. */
static topos_tensor *npy_parse(const uint8_t *b, size_t len, char *why,
                               size_t cap) {
  size_t magic = strlen(NPY_MAGIC);
  if (memcmp(b, NPY_MAGIC, len < magic ? len : magic) != 0) {
    snprintf(why, cap, "not a .npy file (no \\x93NUMPY magic)");
    return NULL;
  }
  if (len < 10) {
    snprintf(why, cap, "truncated: %zu bytes, not even a .npy preamble", len);
    return NULL;
  }
  int major = b[6], minor = b[7];
  size_t start;
  uint64_t hlen;
  if (major == 1 && minor == 0) {
    start = 10;
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
  } else if (major == 2 && minor == 0 && len >= 12) {
    start = 12;
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 |
           (uint64_t)b[11] << 24;
  } else if (major == 2 && minor == 0) {
    snprintf(why, cap, "truncated: %zu bytes, not even a .npy preamble", len);
    return NULL;
  } else {
    snprintf(why, cap, ".npy version %d.%d is not supported (1.0 and 2.0 are)",
             major, minor);
    return NULL;
  }
  if (hlen > len - start) {
    snprintf(why, cap,
             "truncated: the header's %llu bytes run past the end of the "
             "file (%zu bytes)",
             (unsigned long long)hlen, len);
    return NULL;
  }
  npy_cursor c = {(const char *)b + start, (const char *)b + start + hlen};
  char descr[16] = "";
  bool fortran = false;
  int64_t shape[TOPOS_MAX_RANK];
  int rank = 0;
  if (!npy_header(&c, descr, sizeof descr, &fortran, shape, &rank, why, cap))
    return NULL;
  int k = -1;
  for (int i = 0; i < NPY_NDTYPES; i++)
    if (strcmp(descr, npy_dtypes[i].descr) == 0) k = i;
  if (k < 0 && descr[0] == '>') {
    snprintf(why, cap,
             "big-endian data ('%s') is not supported: save it little-endian "
             "(a.astype('<%s'))",
             descr, descr + 1);
    return NULL;
  }
  if (k < 0) {
    snprintf(why, cap,
             "dtype '%s' is not supported ('<f4' f32, '<f8' f64, '<i4' i32; "
             "bf16 travels in .safetensors)",
             descr);
    return NULL;
  }
  if (fortran) {
    snprintf(why, cap,
             "fortran_order True (column-major) is not supported: save "
             "np.ascontiguousarray(a)");
    return NULL;
  }
  topos_dtype dtype = npy_dtypes[k].dtype;
  size_t esize = topos_dtype_size(dtype);
  char st[200];
  npy_shape_text(shape, rank, st, sizeof st);
  uint64_t count = 1;
  bool huge = false;
  for (int i = 0; i < rank; i++) {
    if (shape[i] != 0 && count > (uint64_t)INT64_MAX / (uint64_t)shape[i])
      huge = true;
    else
      count *= (uint64_t)shape[i];
  }
  if (huge || count > (uint64_t)INT64_MAX / esize) {
    snprintf(why, cap, "shape %s holds more bytes than any file", st);
    return NULL;
  }
  uint64_t bytes = count * esize;
  size_t data = len - start - (size_t)hlen;
  if (bytes != data) {
    snprintf(why, cap,
             "the data is %zu bytes, and '%s' %s needs %llu (a truncated "
             "file, or a wrong shape)",
             data, descr, st, (unsigned long long)bytes);
    return NULL;
  }
  /* The data may sit anywhere after the header: copy it to an aligned
   * buffer before the engine reads it as elements. */
  void *aligned = malloc(bytes ? (size_t)bytes : 1);
  if (!aligned) {
    snprintf(why, cap, "out of memory for %llu bytes",
             (unsigned long long)bytes);
    return NULL;
  }
  memcpy(aligned, b + start + hlen, (size_t)bytes);
  topos_error err = {0};
  topos_tensor *t =
      topos_tensor_from(dtype, rank, rank ? shape : NULL, aligned, &err);
  free(aligned);
  if (!t) snprintf(why, cap, "%.*s", (int)cap - 1, err.message);
  return t;
}

/* Writes the n byte ranges parts[i] (lens[i] bytes) to path: a temporary
 * file beside it, renamed over it, so path holds its old bytes or all the
 * new ones.  false with the reason. */
static bool write_parts(const char *path, const void *const *parts,
                        const size_t *lens, int n, char *why, size_t cap) {
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 8);
  if (!tmp) {
    snprintf(why, cap, "out of memory");
    return false;
  }
  snprintf(tmp, plen + 8, "%s.XXXXXX", path);
  int fd = mkstemp(tmp);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  bool ok = f != NULL;
  for (int i = 0; ok && i < n; i++)
    ok = lens[i] == 0 || fwrite(parts[i], 1, lens[i], f) == lens[i];
  int e = errno;
  if (f && fclose(f) != 0 && ok) {
    ok = false;
    e = errno;
  } else if (!f && fd >= 0) {
    close(fd);
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    if (fd >= 0) unlink(tmp);
    snprintf(why, cap, "cannot write %s: %s", path, strerror(e));
  } else {
    default_mode(path);
  }
  free(tmp);
  return ok;
}

/* Writes t to path as .npy.  false with the reason. */
static bool npy_write(const char *path, const topos_tensor *t, char *why,
                      size_t cap) {
  topos_dtype dtype = topos_tensor_dtype(t);
  const char *descr = NULL;
  for (int i = 0; i < NPY_NDTYPES; i++)
    if (npy_dtypes[i].dtype == dtype) descr = npy_dtypes[i].descr;
  if (!descr) {
    snprintf(why, cap, "%s: %s has no .npy dtype; write .safetensors instead",
             path, topos_dtype_name(dtype));
    return false;
  }
  char st[200], header[320];
  npy_shape_text(topos_tensor_shape(t), topos_tensor_rank(t), st, sizeof st);
  int hl = snprintf(header, sizeof header,
                    "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, st);
  /* Spaces, then a newline, so the data starts at a multiple of 64. */
  size_t total = 10 + (size_t)hl + 1, pad = (64 - total % 64) % 64;
  if ((size_t)hl + pad + 1 >= sizeof header) {
    snprintf(why, cap, "%s: the shape is too long for a header", path);
    return false;
  }
  memset(header + hl, ' ', pad);
  header[(size_t)hl + pad] = '\n';
  size_t hlen = (size_t)hl + pad + 1;
  uint8_t pre[10] = {0x93,
                     'N',
                     'U',
                     'M',
                     'P',
                     'Y',
                     1,
                     0,
                     (uint8_t)(hlen & 0xff),
                     (uint8_t)(hlen >> 8)};
  size_t bytes = (size_t)topos_tensor_count(t) * topos_dtype_size(dtype);
  void *data = malloc(bytes ? bytes : 1);
  topos_error err = {0};
  if (!data || topos_tensor_read(t, data, bytes, &err) != TOPOS_OK) {
    snprintf(why, cap, "%s: %s", path, data ? err.message : "out of memory");
    free(data);
    return false;
  }
  const void *parts[3] = {pre, header, data};
  size_t lens[3] = {sizeof pre, hlen, bytes};
  bool ok = write_parts(path, parts, lens, 3, why, cap);
  free(data);
  return ok;
}

/* The engine's safetensors message without what the caller says
 * already: the function's name and the path. */
static const char *st_message(const char *msg, const char *path) {
  static const char *const fns[3] = {
      "topos_safetensors_load: ", "topos_safetensors_save: ",
      "topos_safetensors_get: "};
  for (int i = 0; i < 3; i++)
    if (strncmp(msg, fns[i], strlen(fns[i])) == 0) msg += strlen(fns[i]);
  size_t n = strlen(path);
  if (strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0)
    msg += n + 2;
  return msg;
}

/* "no such file", "not a safetensors file (why)", or the reason. */
static void st_why(const topos_error *err, const char *path, char *why,
                   size_t cap) {
  const char *m = st_message(err->message, path);
  if (err->code == TOPOS_ERR_NOT_FOUND)
    snprintf(why, cap, "no such file");
  else if (err->code == TOPOS_ERR_CORRUPT)
    snprintf(why, cap, "not a safetensors file (%s)", m);
  else
    snprintf(why, cap, "%s", m);
}

/* A tensor from FILE for the input `name`: .safetensors holding one
 * tensor, or a tensor called `name`; anything else is read as .npy.  NULL
 * with the reason (which does not repeat the path). */
static topos_tensor *tensor_file_read(const char *path, const char *name,
                                      char *why, size_t cap) {
  if (ends_with(path, ".safetensors")) {
    topos_error err = {0};
    topos_safetensors *st = topos_safetensors_load(path, &err);
    if (!st) {
      st_why(&err, path, why, cap);
      return NULL;
    }
    int n = topos_safetensors_count(st);
    topos_tensor *t = topos_safetensors_get(
        st, n == 1 ? topos_safetensors_name(st, 0) : name, &err);
    if (!t && err.code == TOPOS_ERR_NOT_FOUND)
      snprintf(why, cap, "it holds %d tensors, none of them named %s", n, name);
    else if (!t)
      st_why(&err, path, why, cap);
    topos_safetensors_free(st);
    return t;
  }
  size_t len = 0;
  errno = 0;
  uint8_t *bytes = read_file(path, &len);
  if (!bytes) {
    snprintf(why, cap, "%s", errno ? strerror(errno) : "cannot be read");
    return NULL;
  }
  topos_tensor *t = npy_parse(bytes, len, why, cap);
  free(bytes);
  return t;
}

/* Saves n named tensors to path: .npy for one tensor when path ends in
 * .npy, safetensors otherwise.  Returns 0, or 1 with the reason printed. */
static int tensors_save(const char *path, int n, const char *const *names,
                        topos_tensor *const *tensors) {
  char why[600];
  if (ends_with(path, ".npy")) {
    if (n != 1) {
      fprintf(stderr, "topos: %s: .npy holds one tensor, not %d\n", path, n);
      return 1;
    }
    if (!npy_write(path, tensors[0], why, sizeof why)) {
      fprintf(stderr, "topos: %s\n", why);
      return 1;
    }
    return 0;
  }
  topos_error err = {0};
  if (topos_safetensors_save(path, n, names, tensors, &err) != TOPOS_OK) {
    fprintf(stderr, "topos: %s: %s\n", path, st_message(err.message, path));
    return 1;
  }
  default_mode(path);
  return 0;
}

/* ------------------------------------------------------- forward, step */

/* A parameter slot of the stored spec, from its JSON describe.  `key`
 * names it in parameter and state files: the parameter's name, or the
 * slot as decimal digits when it has none. */
typedef struct spec_param {
  char key[300];
  bool named;
  topos_dtype dtype;
  int rank;
  int64_t shape[TOPOS_MAX_RANK];
} spec_param;

typedef struct spec_params {
  spec_param *v;
  int n;
} spec_params;

static bool dtype_named(const char *name, topos_dtype *out) {
  for (int d = 0; d < 4; d++)
    if (strcmp(name, topos_dtype_name((topos_dtype)d)) == 0) {
      *out = (topos_dtype)d;
      return true;
    }
  return false;
}

/* The spec's parameter slots.  Returns -1, or an exit status (printed). */
static int spec_params_read(topos_client *c, const options *o,
                            spec_params *out) {
  topos_error err = {0};
  char *json = NULL;
  char what[64];
  snprintf(what, sizeof what, "%s (describing the spec)", o->command);
  if (topos_client_describe(c, o->id, TOPOS_FORMAT_JSON, &json, &err) !=
      TOPOS_OK)
    return call_error(what, &err);
  cJSON *doc = cJSON_Parse(json);
  topos_free(json);
  const cJSON *np =
      doc ? cJSON_GetObjectItemCaseSensitive(doc, "parameters") : NULL;
  const cJSON *nodes =
      doc ? cJSON_GetObjectItemCaseSensitive(doc, "nodes") : NULL;
  bool ok = cJSON_IsNumber(np) && np->valuedouble >= 0 &&
            np->valuedouble <= 1e7 && cJSON_IsArray(nodes);
  int n = ok ? (int)np->valuedouble : 0;
  spec_param *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
  int found = 0;
  ok = ok && v != NULL;
  const cJSON *node;
  cJSON_ArrayForEach(node, nodes) {
    if (!ok) break;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "parameter") != 0)
      continue;
    const cJSON *slot = cJSON_GetObjectItemCaseSensitive(node, "slot");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(node, "name");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(node, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(node, "shape");
    int s = cJSON_IsNumber(slot) ? (int)slot->valuedouble : -1;
    ok = s >= 0 && s < n && !v[s].key[0] && cJSON_IsString(dtype) &&
         dtype_named(dtype->valuestring, &v[s].dtype) && cJSON_IsArray(shape) &&
         cJSON_GetArraySize(shape) <= TOPOS_MAX_RANK;
    if (!ok) break;
    const cJSON *e;
    cJSON_ArrayForEach(e, shape) {
      v[s].shape[v[s].rank++] = (int64_t)e->valuedouble;
    }
    v[s].named = cJSON_IsString(name) && name->valuestring[0];
    if (v[s].named)
      snprintf(v[s].key, sizeof v[s].key, "%s", name->valuestring);
    else
      snprintf(v[s].key, sizeof v[s].key, "%d", s);
    found++;
  }
  cJSON_Delete(doc);
  if (!ok || found != n) {
    free(v);
    fprintf(stderr,
            "topos: %s: the daemon's describe of the spec is "
            "malformed\n",
            o->command);
    return 1;
  }
  out->v = v;
  out->n = n;
  return -1;
}

/* Slot s's tensor under prefix ("" parameters, "m." and "v." moments):
 * named by the parameter's name, else by the slot's index.  NULL with err
 * (TOPOS_ERR_NOT_FOUND when neither is there). */
static topos_tensor *slot_tensor(const topos_safetensors *st,
                                 const char *prefix, const spec_params *sp,
                                 int s, topos_error *err) {
  char name[320];
  if (sp->v[s].named) {
    snprintf(name, sizeof name, "%s%s", prefix, sp->v[s].key);
    topos_tensor *t = topos_safetensors_get(st, name, err);
    if (t || err->code != TOPOS_ERR_NOT_FOUND) return t;
  }
  snprintf(name, sizeof name, "%s%d", prefix, s);
  return topos_safetensors_get(st, name, err);
}

/* "W1" or "W1 (or 0)": how a slot may be named in a file. */
static void slot_names(const spec_params *sp, const char *prefix, int s,
                       char *out, size_t cap) {
  if (sp->v[s].named)
    snprintf(out, cap, "%s%s (or %s%d)", prefix, sp->v[s].key, prefix, s);
  else
    snprintf(out, cap, "%s%d", prefix, s);
}

/* Opens a safetensors file that `flag` names.  NULL with the error
 * printed. */
static topos_safetensors *open_safetensors(const char *flag, const char *path) {
  topos_error err = {0};
  topos_safetensors *st = topos_safetensors_load(path, &err);
  if (!st) {
    char why[600];
    st_why(&err, path, why, sizeof why);
    input_error("%s %s: %s", flag, path, why);
  }
  return st;
}

/* --params FILE: every slot's tensor (slot_tensor), with the slot's dtype
 * and shape; the file's other tensors are ignored.  Returns -1, or an
 * exit status. */
static int params_read(const char *path, const spec_params *sp,
                       Topos__V1__Tensor ***out, size_t *nout) {
  topos_safetensors *st = open_safetensors("--params", path);
  if (!st) return 2;
  Topos__V1__Tensor **v = calloc((size_t)(sp->n ? sp->n : 1), sizeof *v);
  int rc = v ? -1 : usage_error("out of memory");
  for (int s = 0; s < sp->n && rc < 0; s++) {
    topos_error err = {0};
    char names[640], got[200], want[200];
    topos_tensor *t = slot_tensor(st, "", sp, s, &err);
    if (!t) {
      slot_names(sp, "", s, names, sizeof names);
      rc = err.code == TOPOS_ERR_NOT_FOUND
               ? input_error(
                     "--params %s has no tensor %s for parameter "
                     "slot %d",
                     path, names, s)
               : input_error("--params %s: %s", path,
                             st_message(err.message, path));
      break;
    }
    const spec_param *p = &sp->v[s];
    shape_text(p->dtype, p->rank, p->shape, want, sizeof want);
    tensor_text(t, got, sizeof got);
    if (strcmp(got, want) != 0)
      rc = input_error("--params %s: %s is %s, the spec's parameter is %s",
                       path, p->key, got, want);
    else if (!(v[s] = wire_tensor_new(t, &err)))
      rc = input_error("--params %s: %s", path, err.message);
    topos_tensor_release(t);
  }
  topos_safetensors_free(st);
  if (rc >= 0) {
    wire_tensors_free(v, v ? (size_t)sp->n : 0);
    return rc;
  }
  *out = v;
  *nout = (size_t)sp->n;
  return -1;
}

/* --state FILE: "step" (one element, i32 or a whole f64) and the moments
 * m.KEY and v.KEY of every slot, or of none.  Returns -1, or an exit
 * status. */
static int state_read(const char *path, const spec_params *sp,
                      Topos__V1__OptimizerState **out) {
  topos_safetensors *st = open_safetensors("--state", path);
  if (!st) return 2;
  topos_error err = {0};
  int rc = -1;
  Topos__V1__OptimizerState *s = malloc(sizeof *s);
  if (!s) rc = usage_error("out of memory");
  if (s) topos__v1__optimizer_state__init(s);
  topos_tensor *step = s ? topos_safetensors_get(st, "step", &err) : NULL;
  if (rc < 0 && !step)
    rc = err.code == TOPOS_ERR_NOT_FOUND
             ? input_error("--state %s has no tensor step", path)
             : input_error("--state %s: %s", path,
                           st_message(err.message, path));
  if (rc < 0) {
    double d = -1;
    uint8_t buf[8];
    topos_dtype dt = topos_tensor_dtype(step);
    if (topos_tensor_count(step) == 1 &&
        topos_tensor_read(step, buf, sizeof buf, &err) == TOPOS_OK) {
      if (dt == TOPOS_F64) memcpy(&d, buf, sizeof d);
      if (dt == TOPOS_I32) {
        int32_t i;
        memcpy(&i, buf, sizeof i);
        d = i;
      }
    }
    if (!(d >= 0 && d < 9007199254740992.0 && d == (double)(int64_t)d))
      rc = input_error(
          "--state %s: step is not one whole number >= 0 (i32 or f64)", path);
    else
      s->step = (int64_t)d;
  }
  topos_tensor_release(step);
  for (int which = 0; which < 2 && rc < 0; which++) {
    const char *prefix = which ? "v." : "m.";
    Topos__V1__Tensor **v = calloc((size_t)(sp->n ? sp->n : 1), sizeof *v);
    int have = 0, missing = -1;
    if (!v) rc = usage_error("out of memory");
    for (int k = 0; k < sp->n && rc < 0; k++) {
      topos_error e = {0};
      topos_tensor *t = slot_tensor(st, prefix, sp, k, &e);
      if (!t && e.code != TOPOS_ERR_NOT_FOUND)
        rc = input_error("--state %s: %s", path, st_message(e.message, path));
      if (!t) {
        if (missing < 0) missing = k;
        continue;
      }
      if (!(v[k] = wire_tensor_new(t, &e)))
        rc = input_error("--state %s: %s", path, e.message);
      topos_tensor_release(t);
      have++;
    }
    if (rc < 0 && have > 0 && missing >= 0) {
      char names[640];
      slot_names(sp, prefix, missing, names, sizeof names);
      rc = input_error(
          "--state %s has %d of the %d %s moments, not %s: every slot's or "
          "none",
          path, have, sp->n, which ? "v" : "m", names);
    }
    if (rc < 0 && have > 0) {
      if (which) {
        s->v = v;
        s->n_v = (size_t)sp->n;
      } else {
        s->m = v;
        s->n_m = (size_t)sp->n;
      }
    } else {
      wire_tensors_free(v, v ? (size_t)sp->n : 0);
    }
  }
  topos_safetensors_free(st);
  if (rc >= 0) {
    wire_message_free(s ? &s->base : NULL);
    return rc;
  }
  *out = s;
  return -1;
}

/* The --feed NAME=FILE options as Feed messages.  Returns -1, or an exit
 * status. */
static int feeds_read(const options *o, Topos__V1__Feed ***out, size_t *n) {
  for (int i = 0; i < o->nfeeds; i++) {
    const char *arg = o->feeds[i];
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
      return usage_error("--feed needs NAME=FILE, not '%s'", arg);
    char *name = strndup(arg, (size_t)(eq - arg));
    if (!name) return usage_error("out of memory");
    char why[700];
    topos_tensor *t = tensor_file_read(eq + 1, name, why, sizeof why);
    if (!t) {
      free(name);
      return input_error("--feed %s: %s", arg, why);
    }
    topos_error err = {0};
    Topos__V1__Feed *f = malloc(sizeof *f);
    Topos__V1__Feed **grown = realloc(*out, sizeof *grown * (*n + 1));
    if (grown) *out = grown;
    if (f) {
      topos__v1__feed__init(f);
      f->input = value_of(name);
      f->tensor = wire_tensor_new(t, &err);
    }
    topos_tensor_release(t);
    bool ok = f && grown && f->input && f->tensor;
    if (!ok) {
      int rc =
          f && grown && !f->input
              ? usage_error("--feed %s: index too large", name)
              : usage_error("--feed %s: %s", name,
                            err.message[0] ? err.message : "out of memory");
      wire_message_free(f ? &f->base : NULL);
      free(name);
      return rc;
    }
    free(name);
    (*out)[(*n)++] = f;
  }
  return -1;
}

/* What a reply tensor is on this side (new), or NULL with the error
 * printed. */
static topos_tensor *reply_tensor(const Topos__V1__Tensor *m,
                                  const char *what) {
  topos_error err = {0};
  topos_tensor *t = wire_tensor_from_proto(m, NULL, what, &err);
  if (!t) fprintf(stderr, "topos: the daemon's reply: %s\n", err.message);
  return t;
}

/* One line per tensor: name, dtype and shape, and its elements when there
 * are at most 16 (f32 and bf16 with %.9g, f64 with %.17g: each reads
 * back to the same bits). */
static void tensor_print(const char *name, const topos_tensor *t) {
  char shape[200];
  tensor_text(t, shape, sizeof shape);
  int64_t n = topos_tensor_count(t);
  printf("%s %s", name, shape);
  uint8_t buf[16 * 8];
  topos_error err = {0};
  if (n > 16 || topos_tensor_read(t, buf, sizeof buf, &err) != TOPOS_OK) {
    printf(" (%lld elements)\n", (long long)n);
    return;
  }
  bool list = topos_tensor_rank(t) > 0;
  fputs(list ? " = [" : " = ", stdout);
  for (int64_t i = 0; i < n; i++) {
    if (i) fputs(", ", stdout);
    switch (topos_tensor_dtype(t)) {
      case TOPOS_F32: {
        float f;
        memcpy(&f, buf + 4 * i, sizeof f);
        printf("%.9g", f);
        break;
      }
      case TOPOS_F64: {
        double d;
        memcpy(&d, buf + 8 * i, sizeof d);
        printf("%.17g", d);
        break;
      }
      case TOPOS_BF16: {
        uint16_t h;
        memcpy(&h, buf + 2 * i, sizeof h);
        printf("%.9g", topos_bf16_to_f32(h));
        break;
      }
      default: {
        int32_t k;
        memcpy(&k, buf + 4 * i, sizeof k);
        printf("%d", k);
        break;
      }
    }
  }
  fputs(list ? "]\n" : "\n", stdout);
}

/* The label of a root or observe in the output: as --roots/--observes
 * named it (a node name, or an index's digits); a default root (no
 * --roots) is rootK. */
static char *value_label(const Topos__V1__Value *v, bool given,
                         const char *fallback, size_t k) {
  char buf[64];
  if (given && v->ref_case == TOPOS__V1__VALUE__REF_NAME)
    return strdup(v->name);
  if (given)
    snprintf(buf, sizeof buf, "%d", (int)v->index);
  else
    snprintf(buf, sizeof buf, "%s%zu", fallback, k);
  return strdup(buf);
}

/* The file a result goes to must say its format. */
static int check_out_path(const char *flag, const char *path, bool npy_ok) {
  if (!path) return -1;
  if (ends_with(path, ".safetensors") || (npy_ok && ends_with(path, ".npy")))
    return -1;
  return usage_error("%s %s: the file name must end in %s", flag, path,
                     npy_ok ? ".safetensors or .npy" : ".safetensors");
}

static int cmd_forward(topos_client *c, const options *o) {
  topos_error err = {0};
  Topos__V1__ForwardRequest req = TOPOS__V1__FORWARD_REQUEST__INIT;
  spec_params sp = {0};
  int rc = check_out_path("--out", o->out, true);
  if (rc < 0) rc = feeds_read(o, &req.feeds, &req.n_feeds);
  if (rc < 0 && o->params) rc = spec_params_read(c, o, &sp);
  if (rc < 0 && o->params)
    rc = params_read(o->params, &sp, &req.parameters, &req.n_parameters);
  free(sp.v);
  if (rc < 0) rc = build_entry(c, o, &req.entry, &err);
  /* Every output's label, roots then observes. */
  size_t nout = req.entry ? req.entry->n_roots + req.entry->n_observes : 0;
  char **labels = rc < 0 ? calloc(nout + 1, sizeof *labels) : NULL;
  if (rc < 0 && !labels) rc = usage_error("out of memory");
  for (size_t i = 0; rc < 0 && i < nout; i++) {
    bool root = i < req.entry->n_roots;
    labels[i] =
        root ? value_label(req.entry->roots[i], o->roots != NULL, "root", i)
             : value_label(req.entry->observes[i - req.entry->n_roots], true,
                           "", 0);
    if (!labels[i]) rc = usage_error("out of memory");
    for (size_t k = 0; rc < 0 && o->out && k < i; k++)
      if (strcmp(labels[k], labels[i]) == 0)
        rc = usage_error(
            "--out %s: two outputs named %s (a file needs "
            "distinct names)",
            o->out, labels[i]);
  }
  if (rc < 0 && o->out && ends_with(o->out, ".npy") && nout != 1)
    rc = usage_error(
        "--out %s: .npy holds one tensor, and there are %zu "
        "outputs (write .safetensors)",
        o->out, nout);
  ProtobufCMessage *r = NULL;
  if (rc < 0) {
    req.id = heap_id(o->id);
    if (call(c, o, "Forward", &req.base, &topos__v1__forward_reply__descriptor,
             &r, &err) != TOPOS_OK)
      rc = call_error("forward", &err);
  }
  Topos__V1__ForwardReply *reply = (Topos__V1__ForwardReply *)r;
  topos_tensor **outs = rc < 0 ? calloc(nout + 1, sizeof *outs) : NULL;
  if (rc < 0 && !outs) rc = usage_error("out of memory");
  if (rc < 0 && (reply->n_roots != req.entry->n_roots ||
                 reply->n_observes != req.entry->n_observes)) {
    fprintf(stderr,
            "topos: forward: the daemon answered %zu roots and %zu observes "
            "for %zu and %zu\n",
            reply->n_roots, reply->n_observes, req.entry->n_roots,
            req.entry->n_observes);
    rc = 1;
  }
  for (size_t i = 0; rc < 0 && i < nout; i++) {
    bool root = i < reply->n_roots;
    outs[i] = reply_tensor(
        root ? reply->roots[i] : reply->observes[i - reply->n_roots],
        labels[i]);
    if (!outs[i]) rc = 1;
  }
  /* Written to --out (rc becomes 0 or 1), or printed. */
  if (rc < 0 && o->out)
    rc = tensors_save(o->out, (int)nout, (const char *const *)labels, outs);
  for (size_t i = 0; rc < 0 && i < nout; i++) tensor_print(labels[i], outs[i]);
  for (size_t i = 0; i < nout; i++) {
    if (outs) topos_tensor_release(outs[i]);
    if (labels) free(labels[i]);
  }
  free(outs);
  free(labels);
  wire_message_free(r);
  wire_message_clear(&req.base);
  return rc < 0 ? 0 : rc;
}

/* Writes a parameter set from the reply under the slots' keys (as
 * --params reads them).  Returns 0, or 1 with the error printed. */
static int params_write(const char *path, const spec_params *sp,
                        Topos__V1__Tensor *const *v, size_t n) {
  if (n != (size_t)sp->n) {
    fprintf(stderr,
            "topos: step: the daemon answered %zu parameters for a spec of "
            "%d\n",
            n, sp->n);
    return 1;
  }
  const char **names = calloc(n + 1, sizeof *names);
  topos_tensor **ts = calloc(n + 1, sizeof *ts);
  int rc = names && ts ? 0 : usage_error("out of memory");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    names[i] = sp->v[i].key;
    if (!(ts[i] = reply_tensor(v[i], sp->v[i].key))) rc = 1;
  }
  if (rc == 0) rc = tensors_save(path, (int)n, names, ts);
  for (size_t i = 0; ts && i < n; i++) topos_tensor_release(ts[i]);
  free(names);
  free(ts);
  return rc;
}

/* Writes an optimizer state: "step" (f64[1], exact up to 2^53), then
 * m.KEY and v.KEY for the moments the optimizer keeps.  Returns 0, or 1
 * with the error printed. */
static int state_write(const char *path, const spec_params *sp,
                       const Topos__V1__OptimizerState *s) {
  if (!s || (s->n_m && s->n_m != (size_t)sp->n) ||
      (s->n_v && s->n_v != (size_t)sp->n)) {
    fprintf(stderr,
            "topos: step: the daemon's optimizer state does not fit "
            "the spec's %d parameters\n",
            sp->n);
    return 1;
  }
  size_t n = 1 + s->n_m + s->n_v;
  char(*names)[320] = calloc(n, sizeof *names);
  const char **ptrs = calloc(n, sizeof *ptrs);
  topos_tensor **ts = calloc(n, sizeof *ts);
  int rc = names && ptrs && ts ? 0 : usage_error("out of memory");
  topos_error err = {0};
  double step = (double)s->step;
  int64_t one = 1;
  if (rc == 0) {
    snprintf(names[0], sizeof names[0], "step");
    ts[0] = topos_tensor_from(TOPOS_F64, 1, &one, &step, &err);
    if (!ts[0]) rc = call_error("step", &err);
  }
  for (size_t i = 1; rc == 0 && i < n; i++) {
    bool m = i <= s->n_m;
    size_t k = m ? i - 1 : i - 1 - s->n_m;
    snprintf(names[i], sizeof names[i], "%s.%s", m ? "m" : "v", sp->v[k].key);
    if (!(ts[i] = reply_tensor(m ? s->m[k] : s->v[k], names[i]))) rc = 1;
  }
  for (size_t i = 0; ptrs && names && i < n; i++) ptrs[i] = names[i];
  if (rc == 0) rc = tensors_save(path, (int)n, ptrs, ts);
  for (size_t i = 0; ts && i < n; i++) topos_tensor_release(ts[i]);
  free(names);
  free(ptrs);
  free(ts);
  return rc;
}

/* The Optimizer message of the options: the kind, and only the numbers
 * given (the daemon's defaults apply to the others, as for any client).
 * Returns -1, or an exit status. */
static int step_optimizer(const options *o, Topos__V1__Optimizer **out) {
  const char *kind = o->optimizer ? o->optimizer : "sgd";
  Topos__V1__OptimizerKind k;
  if (strcmp(kind, "sgd") == 0)
    k = TOPOS__V1__OPTIMIZER_KIND__SGD;
  else if (strcmp(kind, "adam") == 0)
    k = TOPOS__V1__OPTIMIZER_KIND__ADAM;
  else if (strcmp(kind, "adamw") == 0)
    k = TOPOS__V1__OPTIMIZER_KIND__ADAMW;
  else
    return usage_error("--optimizer is sgd, adam or adamw, not %s", kind);
  if (!o->hp_given[HP_LR])
    return usage_error(
        "step needs --lr X (the optimizer has no default learning rate)");
  bool sgd = k == TOPOS__V1__OPTIMIZER_KIND__SGD;
  if (!sgd && o->hp_given[HP_MOMENTUM])
    return usage_error("--momentum applies to --optimizer sgd only");
  for (int i = HP_BETA1; sgd && i <= HP_EPS; i++)
    if (o->hp_given[i])
      return usage_error("%s applies to --optimizer adam and adamw only",
                         hp_flags[i]);
  Topos__V1__Optimizer *m = malloc(sizeof *m);
  if (!m) return usage_error("out of memory");
  topos__v1__optimizer__init(m);
  m->kind = k;
  m->lr_given_case = TOPOS__V1__OPTIMIZER__LR_GIVEN_LR;
  m->lr = o->hp[HP_LR];
  if (o->hp_given[HP_MOMENTUM]) {
    m->momentum_given_case = TOPOS__V1__OPTIMIZER__MOMENTUM_GIVEN_MOMENTUM;
    m->momentum = o->hp[HP_MOMENTUM];
  }
  if (o->hp_given[HP_BETA1]) {
    m->beta1_given_case = TOPOS__V1__OPTIMIZER__BETA1_GIVEN_BETA1;
    m->beta1 = o->hp[HP_BETA1];
  }
  if (o->hp_given[HP_BETA2]) {
    m->beta2_given_case = TOPOS__V1__OPTIMIZER__BETA2_GIVEN_BETA2;
    m->beta2 = o->hp[HP_BETA2];
  }
  if (o->hp_given[HP_EPS]) {
    m->eps_given_case = TOPOS__V1__OPTIMIZER__EPS_GIVEN_EPS;
    m->eps = o->hp[HP_EPS];
  }
  if (o->hp_given[HP_WEIGHT_DECAY]) {
    m->weight_decay_given_case =
        TOPOS__V1__OPTIMIZER__WEIGHT_DECAY_GIVEN_WEIGHT_DECAY;
    m->weight_decay = o->hp[HP_WEIGHT_DECAY];
  }
  *out = m;
  return -1;
}

static int cmd_step(topos_client *c, const options *o) {
  if (!o->loss)
    return usage_error("step needs --loss V (the scalar value to minimise)");
  topos_error err = {0};
  Topos__V1__StepRequest req = TOPOS__V1__STEP_REQUEST__INIT;
  spec_params sp = {0};
  int rc = step_optimizer(o, &req.optimizer);
  if (rc < 0) rc = check_out_path("--out-params", o->out_params, false);
  if (rc < 0) rc = check_out_path("--out-state", o->out_state, false);
  if (rc < 0 && !(req.loss = value_of(o->loss)))
    rc = usage_error("--loss %s: index too large", o->loss);
  if (rc < 0) rc = feeds_read(o, &req.feeds, &req.n_feeds);
  if (rc < 0 && (o->params || o->state || o->out_params || o->out_state))
    rc = spec_params_read(c, o, &sp);
  if (rc < 0 && o->params)
    rc = params_read(o->params, &sp, &req.parameters, &req.n_parameters);
  if (rc < 0 && o->state) rc = state_read(o->state, &sp, &req.state);
  ProtobufCMessage *r = NULL;
  if (rc < 0) {
    req.id = heap_id(o->id);
    if (call(c, o, "Step", &req.base, &topos__v1__step_reply__descriptor, &r,
             &err) != TOPOS_OK)
      rc = call_error("step", &err);
  }
  Topos__V1__StepReply *reply = (Topos__V1__StepReply *)r;
  if (rc < 0) printf("%.17g\n", reply->loss);
  if (rc < 0 && o->out_params) {
    rc = params_write(o->out_params, &sp, reply->parameters,
                      reply->n_parameters);
    if (rc == 0) rc = -1;
  }
  if (rc < 0 && o->out_state) {
    rc = state_write(o->out_state, &sp, reply->state);
    if (rc == 0) rc = -1;
  }
  free(sp.v);
  wire_message_free(r);
  wire_message_clear(&req.base);
  return rc < 0 ? 0 : rc;
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

/* The commands, in the order of `commands`. */
enum {
  C_RECORD,
  C_DESCRIBE,
  C_LOWER,
  C_EMIT,
  C_CONFORMANCE,
  C_HEALTH,
  C_STATS,
  C_BACKENDS,
  C_LIST,
  C_FORWARD,
  C_PUT_BLOB,
  C_GET_BLOB,
  C_DELETE,
  C_STEP
};
_Static_assert(C_STEP + 1 == NCOMMANDS, "one C_ constant per command");

/* put-blob FILE: the file's tensors as one blob. */
static int cmd_put_blob(topos_client *c, const options *o) {
  topos_tensor **t = NULL;
  int n = 0;
  char why[600] = "";
  if (ends_with(o->id, ".safetensors")) {
    topos_error err = {0};
    topos_safetensors *st = topos_safetensors_load(o->id, &err);
    if (!st) {
      st_why(&err, o->id, why, sizeof why);
    } else {
      n = topos_safetensors_count(st);
      t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
      for (int i = 0; t && i < n && !why[0]; i++) {
        t[i] = topos_safetensors_get(st, topos_safetensors_name(st, i), &err);
        if (!t[i]) st_why(&err, o->id, why, sizeof why);
      }
      if (!t) snprintf(why, sizeof why, "out of memory");
      topos_safetensors_free(st);
    }
  } else {
    t = calloc(1, sizeof *t);
    n = 1;
    if (t) t[0] = tensor_file_read(o->id, "", why, sizeof why);
    if (!t) snprintf(why, sizeof why, "out of memory");
  }
  int rc = 0;
  if (why[0] || !t) {
    fprintf(stderr, "topos: put-blob: %s: %s\n", o->id, why);
    rc = 2;
  } else if (n == 0) {
    fprintf(stderr, "topos: put-blob: %s holds no tensor\n", o->id);
    rc = 2;
  } else {
    topos_error err = {0};
    topos_params *p = topos_params_new(n, t, &err);
    char id[65];
    int64_t bytes = 0;
    if (!p || topos_client_put_blob(c, p, id, &bytes, &err) != TOPOS_OK)
      rc = call_error("put-blob", &err);
    else
      printf("%s\n", id);
    topos_params_free(p);
  }
  for (int i = 0; t && i < n; i++) topos_tensor_release(t[i]);
  free(t);
  return rc;
}

/* get-blob ID: to --out, or printed. */
static int cmd_get_blob(topos_client *c, const options *o) {
  int rc = check_out_path("--out", o->out, true);
  if (rc >= 0) return rc;
  topos_error err = {0};
  topos_tensor **t = NULL;
  int n = 0;
  if (topos_client_get_blob(c, o->id, &t, &n, &err) != TOPOS_OK)
    return call_error("get-blob", &err);
  char(*names)[16] = calloc((size_t)(n > 0 ? n : 1), sizeof *names);
  const char **np = calloc((size_t)(n > 0 ? n : 1), sizeof *np);
  rc = 0;
  if (!names || !np) {
    rc = usage_error("out of memory");
  } else {
    for (int i = 0; i < n; i++) {
      snprintf(names[i], sizeof names[i], "%d", i);
      np[i] = names[i];
    }
    if (o->out)
      rc = tensors_save(o->out, n, np, t);
    else
      for (int i = 0; i < n; i++) tensor_print(names[i], t[i]);
  }
  free(np);
  free(names);
  topos_client_tensors_free(t, n);
  return rc;
}

/* delete ID: AdminSpecDelete. */
static int cmd_delete(topos_client *c, const options *o) {
  topos_error err = {0};
  int64_t bytes = 0;
  if (topos_client_delete_spec(c, o->id, &bytes, &err) != TOPOS_OK)
    return call_error("delete", &err);
  printf("deleted %s (%lld bytes)\n", o->id, (long long)bytes);
  return 0;
}

/* The command o names, after parse.  Returns its exit status. */
static int run_command(options *o) {
  if (!o->command || strcmp(o->command, "help") == 0) {
    if (o->command || o->help) {
      fputs(usage_text, stdout);
      return 0;
    }
    fputs(usage_text, stderr);
    return 2;
  }
  int k = -1;
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(o->command, commands[i].name) == 0) k = i;
  if (k < 0) return usage_error("unknown command %s", o->command);
  if (o->help) {
    fputs(commands[k].usage, stdout);
    return 0;
  }
  /* Options a command does not read are usage errors, not ignored. */
  bool entry =
      k == C_LOWER || k == C_EMIT || k == C_CONFORMANCE || k == C_FORWARD;
  bool run = k == C_FORWARD || k == C_STEP;
  const char *hp = NULL; /* the first hyperparameter given */
  for (int i = HP_COUNT - 1; i >= 0; i--)
    if (o->hp_given[i]) hp = hp_flags[i];
  const char *stray =
      o->format_given && k != C_DESCRIBE            ? "--format"
      : (o->roots || o->observes) && !entry         ? "--roots/--observes"
      : (o->training || o->fast) && !entry          ? "--training/--fast"
      : o->backend && !entry                        ? "--backend"
      : o->threads >= 0 && !entry                   ? "--threads"
      : o->generic && k != C_EMIT                   ? "--generic"
      : o->allow_envelope && k != C_CONFORMANCE     ? "--allow-envelope"
      : o->summary && k != C_RECORD                 ? "--summary"
      : o->local && k != C_BACKENDS                 ? "--local"
      : o->nfeeds && !run                           ? "--feed"
      : o->params && !run                           ? "--params"
      : o->out && k != C_FORWARD && k != C_GET_BLOB ? "--out"
      : k == C_STEP                                 ? NULL
      : o->loss                                     ? "--loss"
      : o->optimizer                                ? "--optimizer"
      : hp                                          ? hp
      : o->state                                    ? "--state"
      : o->out_params                               ? "--out-params"
      : o->out_state                                ? "--out-state"
                                                    : NULL;
  if (stray) return usage_error("%s does not apply to %s", stray, o->command);
  bool takes_id = k <= C_CONFORMANCE || run || k == C_PUT_BLOB ||
                  k == C_GET_BLOB || k == C_DELETE;
  if (takes_id && !o->id) {
    fputs(commands[k].usage, stderr);
    return 2;
  }
  if (!takes_id && o->id)
    return usage_error("%s takes no argument (got %s)", o->command, o->id);
  if (takes_id && k != C_RECORD && k != C_PUT_BLOB && !wire_id_valid(o->id))
    return usage_error("%s: \"%s\" is not an id (64 lowercase hex digits)",
                       o->command, o->id);

  if (k == C_BACKENDS && o->local) return cmd_backends_local();
  int rc = 0;
  topos_client *c = cli_connect(o->server, o->tls_ca, o->tls_cert, o->tls_key,
                                o->deadline, o->token, &rc);
  if (!c) return rc;
  switch (k) {
    case C_RECORD:
      rc = cmd_record(c, o);
      break;
    case C_DESCRIBE:
      rc = cmd_describe(c, o);
      break;
    case C_LOWER:
      rc = cmd_lower(c, o);
      break;
    case C_EMIT:
      rc = cmd_emit(c, o);
      break;
    case C_CONFORMANCE:
      rc = cmd_conformance(c, o);
      break;
    case C_HEALTH:
      rc = cmd_health(c, o);
      break;
    case C_STATS:
      rc = cmd_stats(c, o);
      break;
    case C_BACKENDS:
      rc = cmd_backends(c, o);
      break;
    case C_FORWARD:
      rc = cmd_forward(c, o);
      break;
    case C_STEP:
      rc = cmd_step(c, o);
      break;
    case C_PUT_BLOB:
      rc = cmd_put_blob(c, o);
      break;
    case C_GET_BLOB:
      rc = cmd_get_blob(c, o);
      break;
    case C_DELETE:
      rc = cmd_delete(c, o);
      break;
    default:
      rc = cmd_list(c, o);
      break;
  }
  topos_client_close(c);
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
  o.feeds = calloc((size_t)argc, sizeof *o.feeds);
  if (!o.feeds) return usage_error("out of memory");
  int rc = parse(argc, argv, &o);
  if (rc < 0) rc = run_command(&o);
  free(o.feeds);
  return rc;
}
