/*
 * ex.c - the examples' shared plumbing (ex.h): flags, sessions, trainers
 * and evaluators that run locally or on a daemon, checkpoints, data
 * paths, progress, metrics and a seeded generator.
 */
#include "ex.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ex_error.h"
#include "topos_client.h"

#ifndef TOPOS_SOURCE_DIR
#define TOPOS_SOURCE_DIR "."
#endif

/* ------------------------------------------------------------------ flags */

const char ex_args_usage[] =
    "  --server ADDRESS   train on a toposd daemon (default: $TOPOS_SERVER; "
    "unset: in-process)\n"
    "  --backend NAME     reference, cpu, blas (with --fast), ... (default: "
    "auto)\n"
    "  --fast             the fast numerics posture (default: exact)\n"
    "  --threads N        threads per backend task (default: all cores)\n"
    "  --save FILE        write a checkpoint (safetensors) at the end\n"
    "  --resume FILE      start from a checkpoint --save wrote\n"
    "  --save-spec FILE   write the training network's spec (what `topos "
    "record FILE` stores)\n"
    "  --metrics FILE     write metrics as CSV (tools/plot_metrics.sh plots "
    "them)\n"
    "  --data PATH        where the data set is\n"
    "  --stop-at K        stop after step K, as if interrupted (with --save: "
    "a checkpoint to --resume)\n"
    "  --no-progress      no progress bar or progress lines\n";

int ex_parse_count(const ex_args *a, const char *flag, const char *text,
                   int64_t max, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 1 || v > max) {
    fprintf(stderr, "%s: %s needs a whole number in 1..%lld, not '%s'\n",
            a->prog, flag, (long long)max, text);
    return -1;
  }
  *out = v;
  return 0;
}

int ex_arg(ex_args *a, int argc, char **argv, int *i) {
  const char *flag = argv[*i];
  static const char *const valued[] = {"--server", "--backend", "--threads",
                                       "--save",   "--resume",  "--metrics",
                                       "--data",   "--stop-at", "--save-spec"};
  bool takes_value = false;
  for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
    if (strcmp(flag, valued[k]) == 0) takes_value = true;
  if (strcmp(flag, "--fast") == 0) {
    a->exec.numerics = TOPOS_NUMERICS_FAST;
    return 1;
  }
  if (strcmp(flag, "--no-progress") == 0) {
    a->no_progress = true;
    return 1;
  }
  if (!takes_value) return 0;
  if (*i + 1 >= argc || argv[*i + 1][0] == '\0') {
    fprintf(stderr, "%s: %s needs a value\n", a->prog, flag);
    return -1;
  }
  const char *v = argv[++*i];
  if (strcmp(flag, "--server") == 0) a->server = v;
  if (strcmp(flag, "--backend") == 0) a->exec.backend = v;
  if (strcmp(flag, "--save") == 0) a->save = v;
  if (strcmp(flag, "--save-spec") == 0) a->save_spec = v;
  if (strcmp(flag, "--resume") == 0) a->resume = v;
  if (strcmp(flag, "--metrics") == 0) a->metrics = v;
  if (strcmp(flag, "--data") == 0) a->data = v;
  if (strcmp(flag, "--stop-at") == 0 &&
      ex_parse_count(a, flag, v, INT64_MAX / 2, &a->stop_at) != 0)
    return -1;
  if (strcmp(flag, "--threads") == 0) {
    int64_t n = 0;
    if (ex_parse_count(a, flag, v, TOPOS_THREADS_MAX, &n) != 0) return -1;
    a->exec.threads = (int)n;
  }
  return 1;
}

int ex_args_done(ex_args *a) {
  if (a->server == NULL) {
    const char *env = getenv("TOPOS_SERVER");
    if (env != NULL && env[0] != '\0') a->server = env;
  }
  topos_error err = {0};
  if (topos_exec_check(&a->exec, &err) != TOPOS_OK) {
    fprintf(stderr, "%s: %s\n", a->prog, err.message);
    return -1;
  }
  return 0;
}

int ex_fail(const ex_args *a, const char *what, const topos_error *err) {
  fprintf(stderr, "%s: %s: %s\n", a && a->prog ? a->prog : "example", what,
          err && err->message[0] ? err->message : "failed");
  return 1;
}

double ex_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------- data files */

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static bool try_under(const char *root, const char *rel, char *out,
                      size_t cap) {
  if (root == NULL || root[0] == '\0') return false;
  int n = snprintf(out, cap, "%s/%s", root, rel);
  return n > 0 && (size_t)n < cap && exists(out);
}

int ex_find_data(const char *given, const char *rel, char *out, size_t cap) {
  if (given != NULL) {
    snprintf(out, cap, "%s", given);
    return exists(out) ? 0 : -1;
  }
  if (try_under(getenv("TOPOS_DATA_ROOT"), rel, out, cap)) return 0;
  if (try_under(".", rel, out, cap)) return 0;
  if (try_under(TOPOS_SOURCE_DIR, rel, out, cap)) return 0;
  /* build/examples/<name>: the tree is two levels above. */
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL) {
      *slash = '\0';
      char up[PATH_MAX + 8];
      snprintf(up, sizeof up, "%s/../..", exe);
      if (try_under(up, rel, out, cap)) return 0;
    }
  }
  snprintf(out, cap, "%s", rel);
  return -1;
}

/* ---------------------------------------------------------------- session */

struct ex_session {
  topos_exec exec;
  topos_client *client;  /* NULL: in-process */
  const char *save_spec; /* --save-spec FILE, or NULL */
  bool spec_written;     /* by a trainer (an evaluator writes only first) */
  char where[320];
};

int ex_save_spec(const char *path, const topos_network *net, topos_error *err) {
  uint8_t *bytes = NULL;
  size_t n = 0;
  if (topos_network_encode(net, &bytes, &n, err) != TOPOS_OK) return -1;
  FILE *f = fopen(path, "wb");
  bool ok = f != NULL && fwrite(bytes, 1, n, f) == n;
  if (f != NULL && fclose(f) != 0) ok = false;
  topos_free(bytes);
  if (!ok) {
    if (err) {
      err->code = TOPOS_ERR_IO;
      snprintf(err->message, sizeof err->message, "--save-spec %s: %s", path,
               strerror(errno));
    }
    return -1;
  }
  return 0;
}

ex_session *ex_session_open(const ex_args *a, topos_error *err) {
  ex_session *s = calloc(1, sizeof *s);
  if (s == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  s->exec = a->exec;
  s->save_spec = a->save_spec;
  if (a->server == NULL) {
    snprintf(s->where, sizeof s->where, "local");
    return s;
  }
  s->client = topos_client_connect(a->server, err);
  if (s->client == NULL) {
    free(s);
    return NULL;
  }
  snprintf(s->where, sizeof s->where, "remote %s", a->server);
  return s;
}

void ex_session_close(ex_session *s) {
  if (s == NULL) return;
  topos_client_close(s->client);
  free(s);
}

bool ex_session_remote(const ex_session *s) {
  return s && s->client;
}
const char *ex_session_where(const ex_session *s) {
  return s ? s->where : "";
}

topos_trainer *ex_trainer(ex_session *s, const topos_network *net,
                          topos_value loss, topos_error *err) {
  /* The training network is the one --save-spec means. */
  if (s->save_spec != NULL) {
    if (ex_save_spec(s->save_spec, net, err) != 0) return NULL;
    s->spec_written = true;
  }
  if (s->client == NULL)
    return topos_trainer_local(net, loss, NULL, 0, &s->exec, err);
  char id[65];
  if (topos_client_record(s->client, net, id, err) != TOPOS_OK) return NULL;
  return topos_client_trainer(s->client, id, loss, &s->exec, err);
}

struct ex_eval {
  ex_session *s;
  int nroots;
  topos_value *roots;
  topos_plan *plan; /* local */
  char id[65];      /* remote: the network's spec id */
  char blob[65];    /* remote: the parameters' blob, "" = initials */
  int nparams;
  const topos_params *params; /* local: borrowed */
};

ex_eval *ex_eval_new(ex_session *s, const topos_network *net,
                     const topos_value *roots, int nroots, topos_error *err) {
  /* An example that only evaluates (gpt2, llama) saves what it runs; one
   * that trains overwrites it with its training network (ex_trainer). */
  if (s->save_spec != NULL && !s->spec_written) {
    if (ex_save_spec(s->save_spec, net, err) != 0) return NULL;
  }
  ex_eval *e = calloc(1, sizeof *e);
  topos_value *r = calloc((size_t)(nroots > 0 ? nroots : 1), sizeof *r);
  if (e == NULL || r == NULL) {
    free(e);
    free(r);
    ex_error(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  memcpy(r, roots, sizeof *r * (size_t)nroots);
  e->s = s;
  e->roots = r;
  e->nroots = nroots;
  e->nparams = topos_network_parameter_count(net);
  int rc;
  if (s->client == NULL) {
    topos_entry entry = {.roots = r,
                         .nroots = nroots,
                         .posture = TOPOS_POSTURE_FORWARD,
                         .numerics = s->exec.numerics,
                         .threads = s->exec.threads};
    e->plan = topos_network_lower(net, &entry, err);
    rc = e->plan != NULL ? TOPOS_OK : -1;
  } else {
    rc = topos_client_record(s->client, net, e->id, err);
  }
  if (rc != TOPOS_OK) {
    ex_eval_free(e);
    return NULL;
  }
  return e;
}

void ex_eval_free(ex_eval *e) {
  if (e == NULL) return;
  topos_plan_free(e->plan);
  free(e->roots);
  free(e);
}

int ex_eval_params(ex_eval *e, const topos_params *params, topos_error *err) {
  e->params = params;
  e->blob[0] = '\0';
  if (e->s->client == NULL || params == NULL) return TOPOS_OK;
  /* Once per parameter set: the batches that follow name the blob. */
  int64_t bytes = 0;
  return topos_client_put_blob(e->s->client, params, e->blob, &bytes, err);
}

int ex_eval_run(ex_eval *e, const topos_feed *feeds, int nfeeds,
                topos_tensor **out, topos_error *err) {
  for (int i = 0; i < e->nroots; i++) out[i] = NULL;
  if (e->s->client == NULL) {
    topos_run *run =
        topos_plan_forward(e->plan, e->params, feeds, nfeeds, &e->s->exec, err);
    if (run == NULL) return err->code ? err->code : TOPOS_ERR_STATE;
    int rc = TOPOS_OK;
    for (int i = 0; i < e->nroots && rc == TOPOS_OK; i++) {
      const topos_tensor *t = topos_run_of(run, e->roots[i], err);
      if (t == NULL)
        rc = err->code ? err->code : TOPOS_ERR_STATE;
      else
        out[i] = topos_tensor_retain(t);
    }
    topos_run_free(run);
    if (rc != TOPOS_OK)
      for (int i = 0; i < e->nroots; i++) {
        topos_tensor_release(out[i]);
        out[i] = NULL;
      }
    return rc;
  }
  topos_entry entry = {.roots = e->roots, .nroots = e->nroots};
  topos_client_args args = {
      .feeds = feeds, .nfeeds = nfeeds, .exec = &e->s->exec};
  if (e->blob[0] != '\0') {
    args.params_blob = e->blob;
    args.nparams_blob = e->nparams;
  }
  topos_tensor **roots = NULL;
  int rc = topos_client_forward_with(e->s->client, e->id, &entry, &args, &roots,
                                     NULL, err);
  if (rc != TOPOS_OK) return rc;
  for (int i = 0; i < e->nroots; i++) {
    out[i] = roots[i];
    roots[i] = NULL;
  }
  topos_client_tensors_free(roots, e->nroots);
  return TOPOS_OK;
}

/* ------------------------------------------------------------ checkpoints */

enum { NAME_MAX_LEN = 256 };

/* The checkpoint name of parameter slot `slot`. */
static void param_name(const topos_network *net, int slot, char *out,
                       size_t cap) {
  const char *n =
      topos_network_name_of(net, topos_network_parameter(net, slot));
  if (n != NULL && n[0] != '\0')
    snprintf(out, cap, "%s", n);
  else
    snprintf(out, cap, "param.%d", slot);
}

static topos_tensor *i64_tensor(int64_t v, topos_error *err) {
  uint64_t u = (uint64_t)v;
  int32_t halves[2] = {(int32_t)(uint32_t)(u & 0xffffffffu),
                       (int32_t)(uint32_t)(u >> 32)};
  int64_t shape[1] = {2};
  return topos_tensor_from(TOPOS_I32, 1, shape, halves, err);
}

static int i64_of(const topos_tensor *t, const char *path, const char *name,
                  int64_t *out, topos_error *err) {
  int32_t halves[2];
  if (t == NULL || topos_tensor_dtype(t) != TOPOS_I32 ||
      topos_tensor_rank(t) != 1 || topos_tensor_shape(t)[0] != 2 ||
      topos_tensor_read(t, halves, sizeof halves, err) != TOPOS_OK) {
    ex_error(err, TOPOS_ERR_CORRUPT, "%s: %s is not an I32[2] counter", path,
             name);
    return TOPOS_ERR_CORRUPT;
  }
  uint64_t u =
      (uint64_t)(uint32_t)halves[0] | ((uint64_t)(uint32_t)halves[1] << 32);
  *out = (int64_t)u;
  if (*out < 0) {
    ex_error(err, TOPOS_ERR_CORRUPT, "%s: %s is negative", path, name);
    return TOPOS_ERR_CORRUPT;
  }
  return TOPOS_OK;
}

int ex_checkpoint_save(const char *path, const topos_network *net,
                       const topos_params *params, const topos_opt_state *state,
                       int64_t step, topos_error *err) {
  int np = topos_params_count(params);
  if (np != topos_network_parameter_count(net)) {
    ex_error(err, TOPOS_ERR_ARGUMENT,
             "checkpoint: %d parameters for a network of %d", np,
             topos_network_parameter_count(net));
    return TOPOS_ERR_ARGUMENT;
  }
  const topos_params *m = state ? topos_opt_state_moment(state, 0) : NULL;
  const topos_params *v = state ? topos_opt_state_moment(state, 1) : NULL;
  int cap = 3 * np + 2;
  char(*names)[NAME_MAX_LEN + 16] = calloc((size_t)cap, sizeof *names);
  const char **name_ptrs = calloc((size_t)cap, sizeof *name_ptrs);
  topos_tensor **tensors = calloc((size_t)cap, sizeof *tensors);
  topos_tensor **owned = calloc((size_t)cap, sizeof *owned);
  int n = 0, rc = TOPOS_OK;
  if (names == NULL || name_ptrs == NULL || tensors == NULL || owned == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "out of memory");
    rc = TOPOS_ERR_MEMORY;
  }
  for (int s = 0; s < np && rc == TOPOS_OK; s++) {
    char base[NAME_MAX_LEN];
    param_name(net, s, base, sizeof base);
    snprintf(names[n], sizeof names[n], "%s", base);
    tensors[n++] = (topos_tensor *)topos_params_get(params, s);
    if (m != NULL) {
      snprintf(names[n], sizeof names[n], "optimizer.m.%s", base);
      tensors[n++] = (topos_tensor *)topos_params_get(m, s);
    }
    if (v != NULL) {
      snprintf(names[n], sizeof names[n], "optimizer.v.%s", base);
      tensors[n++] = (topos_tensor *)topos_params_get(v, s);
    }
  }
  if (rc == TOPOS_OK && state != NULL) {
    snprintf(names[n], sizeof names[n], "optimizer.step");
    owned[n] = tensors[n] = i64_tensor(topos_opt_state_step(state), err);
    if (tensors[n++] == NULL) rc = err->code;
  }
  if (rc == TOPOS_OK) {
    snprintf(names[n], sizeof names[n], "train.step");
    owned[n] = tensors[n] = i64_tensor(step, err);
    if (tensors[n++] == NULL) rc = err->code;
  }
  for (int i = 0; i < n; i++) name_ptrs[i] = names[i];
  if (rc == TOPOS_OK)
    rc = topos_safetensors_save(path, n, name_ptrs, tensors, err);
  for (int i = 0; owned && i < cap; i++) topos_tensor_release(owned[i]);
  free(names);
  free(name_ptrs);
  free(tensors);
  free(owned);
  return rc;
}

static bool same_shape(const topos_tensor *t, topos_dtype dtype, int rank,
                       const int64_t *shape) {
  if (topos_tensor_dtype(t) != dtype || topos_tensor_rank(t) != rank)
    return false;
  for (int i = 0; i < rank; i++)
    if (topos_tensor_shape(t)[i] != shape[i]) return false;
  return true;
}

/* Reads one parameter-shaped set (prefix "" for the parameters,
 * "optimizer.m." / "optimizer.v." for moments) into *out.  *present is
 * how many slots the file has under the prefix: 0 or all, anything else
 * is an error. */
static int load_set(const topos_safetensors *st, const char *path,
                    const topos_network *net, const char *prefix,
                    topos_params **out, int *used, topos_error *err) {
  int np = topos_network_parameter_count(net);
  topos_tensor **ts = calloc((size_t)(np > 0 ? np : 1), sizeof *ts);
  if (ts == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "out of memory");
    return TOPOS_ERR_MEMORY;
  }
  int found = 0, rc = TOPOS_OK;
  char first_missing[NAME_MAX_LEN + 16] = "";
  for (int s = 0; s < np && rc == TOPOS_OK; s++) {
    char base[NAME_MAX_LEN], name[NAME_MAX_LEN + 16];
    param_name(net, s, base, sizeof base);
    snprintf(name, sizeof name, "%s%s", prefix, base);
    topos_error miss = {0};
    ts[s] = topos_safetensors_get(st, name, &miss);
    if (ts[s] == NULL && miss.code != TOPOS_ERR_NOT_FOUND) {
      *err = miss; /* not a missing name: the file changed, or I/O */
      rc = miss.code;
      break;
    }
    if (ts[s] == NULL) {
      if (first_missing[0] == '\0')
        snprintf(first_missing, sizeof first_missing, "%s", name);
      continue;
    }
    found++;
    topos_value pv = topos_network_parameter(net, s);
    int rank = 0;
    const int64_t *shape = topos_network_value_shape(net, pv, &rank);
    topos_dtype dt = topos_network_value_dtype(net, pv);
    if (!same_shape(ts[s], dt, rank, shape)) {
      char want[128] = "", got[128] = "";
      int w = snprintf(want, sizeof want, "%s[", topos_dtype_name(dt));
      for (int i = 0; i < rank; i++)
        w += snprintf(want + w, sizeof want - (size_t)w, "%s%lld", i ? "," : "",
                      (long long)shape[i]);
      snprintf(want + w, sizeof want - (size_t)w, "]");
      int g = snprintf(got, sizeof got, "%s[",
                       topos_dtype_name(topos_tensor_dtype(ts[s])));
      for (int i = 0; i < topos_tensor_rank(ts[s]); i++)
        g += snprintf(got + g, sizeof got - (size_t)g, "%s%lld", i ? "," : "",
                      (long long)topos_tensor_shape(ts[s])[i]);
      snprintf(got + g, sizeof got - (size_t)g, "]");
      ex_error(err, TOPOS_ERR_ARGUMENT,
               "%s: %s is %s, the network's parameter is %s", path, name, got,
               want);
      rc = TOPOS_ERR_ARGUMENT;
    }
  }
  if (rc == TOPOS_OK && found > 0 && found < np) {
    ex_error(err, TOPOS_ERR_ARGUMENT, "%s: has no %s", path, first_missing);
    rc = TOPOS_ERR_ARGUMENT;
  }
  if (rc == TOPOS_OK && found == 0 && prefix[0] == '\0' && np > 0) {
    ex_error(err, TOPOS_ERR_ARGUMENT,
             "%s: has no parameter of this network (no %s)", path,
             first_missing);
    rc = TOPOS_ERR_ARGUMENT;
  }
  *out = NULL;
  if (rc == TOPOS_OK && found == np) {
    *out = topos_params_new(np, ts, err);
    if (*out == NULL) rc = err->code ? err->code : TOPOS_ERR_MEMORY;
  }
  *used += found;
  for (int s = 0; s < np; s++) topos_tensor_release(ts[s]);
  free(ts);
  return rc;
}

int ex_checkpoint_load(const char *path, const topos_network *net,
                       topos_params **params, topos_opt_state **state,
                       int64_t *step, topos_error *err) {
  *params = NULL;
  *state = NULL;
  *step = 0;
  topos_safetensors *st = topos_safetensors_load(path, err);
  if (st == NULL) return err->code ? err->code : TOPOS_ERR_IO;
  topos_params *p = NULL, *m = NULL, *v = NULL;
  int used = 0;
  int rc = load_set(st, path, net, "", &p, &used, err);
  if (rc == TOPOS_OK)
    rc = load_set(st, path, net, "optimizer.m.", &m, &used, err);
  if (rc == TOPOS_OK)
    rc = load_set(st, path, net, "optimizer.v.", &v, &used, err);
  int64_t opt_step = 0, train_step = 0;
  bool has_opt = false;
  if (rc == TOPOS_OK) {
    topos_error miss = {0};
    topos_tensor *t = topos_safetensors_get(st, "optimizer.step", &miss);
    if (t != NULL) {
      has_opt = true;
      used++;
      rc = i64_of(t, path, "optimizer.step", &opt_step, err);
      topos_tensor_release(t);
    }
  }
  if (rc == TOPOS_OK) {
    topos_error miss = {0};
    topos_tensor *t = topos_safetensors_get(st, "train.step", &miss);
    if (t == NULL) {
      ex_error(err, TOPOS_ERR_ARGUMENT, "%s: has no train.step", path);
      rc = TOPOS_ERR_ARGUMENT;
    } else {
      used++;
      rc = i64_of(t, path, "train.step", &train_step, err);
      topos_tensor_release(t);
    }
  }
  if (rc == TOPOS_OK && !has_opt && (m != NULL || v != NULL)) {
    ex_error(err, TOPOS_ERR_ARGUMENT, "%s: moments without optimizer.step",
             path);
    rc = TOPOS_ERR_ARGUMENT;
  }
  /* Everything in the file must have been read: a tensor the network does
   * not know means the checkpoint is of another model. */
  if (rc == TOPOS_OK && used != topos_safetensors_count(st)) {
    for (int i = 0; i < topos_safetensors_count(st); i++) {
      const char *name = topos_safetensors_name(st, i);
      bool known = strcmp(name, "train.step") == 0 ||
                   (has_opt && strcmp(name, "optimizer.step") == 0);
      for (int s = 0; !known && s < topos_network_parameter_count(net); s++) {
        char base[NAME_MAX_LEN], full[NAME_MAX_LEN + 16];
        param_name(net, s, base, sizeof base);
        known = strcmp(name, base) == 0;
        snprintf(full, sizeof full, "optimizer.m.%s", base);
        known = known || (m != NULL && strcmp(name, full) == 0);
        snprintf(full, sizeof full, "optimizer.v.%s", base);
        known = known || (v != NULL && strcmp(name, full) == 0);
      }
      if (!known) {
        ex_error(err, TOPOS_ERR_ARGUMENT,
                 "%s: tensor '%s' is not part of this network's checkpoint",
                 path, name);
        rc = TOPOS_ERR_ARGUMENT;
        break;
      }
    }
  }
  if (rc == TOPOS_OK && has_opt) {
    *state = topos_opt_state_from(opt_step, m, v, err);
    if (*state == NULL) rc = err->code ? err->code : TOPOS_ERR_ARGUMENT;
  }
  topos_params_free(m);
  topos_params_free(v);
  topos_safetensors_free(st);
  if (rc != TOPOS_OK) {
    topos_params_free(p);
    topos_opt_state_free(*state);
    *state = NULL;
    return rc;
  }
  *params = p;
  *step = train_step;
  return TOPOS_OK;
}

/* --------------------------------------------------------------- progress */

void ex_progress_start(ex_progress *p, bool on, const char *label,
                       const char *unit, int64_t total) {
  memset(p, 0, sizeof *p);
  p->label = label;
  p->unit = unit;
  p->total = total > 0 ? total : 1;
  p->on = on;
  p->tty = isatty(STDERR_FILENO) == 1;
  p->t0 = ex_now_s();
  p->last_tenth = 0;
}

static void fmt_duration(double s, char *out, size_t cap) {
  if (!(s >= 0) || s > 1e7)
    snprintf(out, cap, "?");
  else if (s < 60)
    snprintf(out, cap, "%.1fs", s);
  else if (s < 3600)
    snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else
    snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

void ex_progress_update(ex_progress *p, int64_t done, const char *note) {
  if (!p->on) return;
  p->done = done;
  double now = ex_now_s(), el = now - p->t0;
  double rate = el > 0 ? (double)done / el : 0;
  char eta[32];
  fmt_duration(rate > 0 ? (double)(p->total - done) / rate : -1, eta,
               sizeof eta);
  double frac = (double)done / (double)p->total;
  if (frac > 1) frac = 1;
  if (p->tty) {
    /* At most ten redraws a second, and always the last. */
    if (done < p->total && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1];
    int full = (int)(frac * WIDTH);
    for (int i = 0; i < WIDTH; i++) bar[i] = i < full ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %s, %.1f %s/s, ETA %s%s%s\033[K",
            p->label, bar, (int)(frac * 100), (long long)done,
            (long long)p->total, p->unit, rate, p->unit, eta, note ? "  " : "",
            note ? note : "");
    p->drawn = true;
  } else {
    int tenth = (int)(frac * 10);
    if (tenth <= p->last_tenth) return;
    p->last_tenth = tenth;
    fprintf(stderr, "%s: %lld/%lld %s (%d%%), %.1f %s/s, ETA %s%s%s\n",
            p->label, (long long)done, (long long)p->total, p->unit, tenth * 10,
            rate, p->unit, eta, note ? ", " : "", note ? note : "");
  }
  fflush(stderr);
}

void ex_progress_end(ex_progress *p) {
  if (p->on && p->tty && p->drawn) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
  p->drawn = false;
}

/* ---------------------------------------------------------------- metrics */

struct ex_metrics {
  FILE *f;
  char path[1024];
};

ex_metrics *ex_metrics_open(const char *path, topos_error *err) {
  ex_metrics *m = calloc(1, sizeof *m);
  if (m == NULL) {
    ex_error(err, TOPOS_ERR_MEMORY, "out of memory");
    return NULL;
  }
  if (path == NULL) return m;
  snprintf(m->path, sizeof m->path, "%s", path);
  m->f = fopen(path, "w");
  if (m->f == NULL) {
    ex_error(err, TOPOS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    free(m);
    return NULL;
  }
  fprintf(m->f, "step,epoch,split,loss,accuracy,seconds\n");
  fflush(m->f);
  return m;
}

static void put_num(FILE *f, double v, const char *fmt) {
  if (!isnan(v)) fprintf(f, fmt, v);
}

void ex_metrics_row(ex_metrics *m, int64_t step, double epoch,
                    const char *split, double loss, double accuracy,
                    double seconds) {
  if (m == NULL || m->f == NULL) return;
  fprintf(m->f, "%lld,", (long long)step);
  put_num(m->f, epoch, "%.4f");
  fprintf(m->f, ",%s,", split);
  put_num(m->f, loss, "%.6f");
  fputc(',', m->f);
  put_num(m->f, accuracy, "%.6f");
  fputc(',', m->f);
  put_num(m->f, seconds, "%.3f");
  fputc('\n', m->f);
  fflush(m->f);
}

int ex_metrics_close(ex_metrics *m, topos_error *err) {
  if (m == NULL) return TOPOS_OK;
  int rc = TOPOS_OK;
  if (m->f != NULL && fclose(m->f) != 0) {
    ex_error(err, TOPOS_ERR_IO, "cannot write %s: %s", m->path,
             strerror(errno));
    rc = TOPOS_ERR_IO;
  }
  free(m);
  return rc;
}

/* ------------------------------------------------------------ randomness */

uint64_t ex_rand_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double ex_rand_unit(uint64_t *state) {
  return (double)(ex_rand_u64(state) >> 11) * 0x1.0p-53;
}

uint64_t ex_rand_below(uint64_t *state, uint64_t n) {
  /* Rejection of the partial last block keeps every value equally likely. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t r;
  do r = ex_rand_u64(state);
  while (r >= limit);
  return r % n;
}

void ex_shuffle(int64_t *perm, int64_t n, uint64_t seed) {
  uint64_t st = seed;
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)ex_rand_below(&st, (uint64_t)i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

int ex_sample_logits(const float *logits, int n, double temperature,
                     uint64_t *state) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  if (!(temperature > 0)) return best;
  double total = 0;
  for (int i = 0; i < n; i++)
    total += exp(((double)logits[i] - logits[best]) / temperature);
  double r = ex_rand_unit(state) * total;
  for (int i = 0; i < n; i++) {
    r -= exp(((double)logits[i] - logits[best]) / temperature);
    if (r < 0) return i;
  }
  return best;
}

/* ------------------------------------------------------------------ misc */

void ex_score(const topos_tensor *logits, const int32_t *labels, int64_t n,
              double *loss_sum, int64_t *correct) {
  int64_t k = topos_tensor_shape(logits)[topos_tensor_rank(logits) - 1];
  size_t count = (size_t)topos_tensor_count(logits);
  float *v = malloc(sizeof(float) * (count ? count : 1));
  topos_error err = {0};
  if (v == NULL || topos_tensor_dtype(logits) != TOPOS_F32 ||
      topos_tensor_read(logits, v, sizeof(float) * count, &err) != TOPOS_OK) {
    free(v);
    if (loss_sum) *loss_sum = NAN;
    return;
  }
  double ls = 0;
  int64_t ok = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *row = v + i * k;
    int best = 0;
    for (int64_t j = 1; j < k; j++)
      if (row[j] > row[best]) best = (int)j;
    double lse = 0;
    for (int64_t j = 0; j < k; j++) lse += exp((double)row[j] - row[best]);
    lse = log(lse) + row[best];
    ls += lse - row[labels[i]];
    ok += best == labels[i];
  }
  if (loss_sum) *loss_sum += ls;
  if (correct) *correct += ok;
  free(v);
}

/* ------------------------------------------------------------ the loop */

int ex_loop_run(ex_loop *l, topos_error *err) {
  const ex_args *a = l->args;
  int rc = TOPOS_OK;
  l->step = 0;
  l->stopped = false;
  if (a->resume != NULL) {
    rc = ex_checkpoint_load(a->resume, l->net, &l->params, &l->state, &l->step,
                            err);
    if (rc != TOPOS_OK) return rc;
    if (l->step > l->steps) {
      snprintf(err->message, sizeof err->message,
               "%s is at step %lld, past the run's %lld steps", a->resume,
               (long long)l->step, (long long)l->steps);
      return err->code = TOPOS_ERR_ARGUMENT;
    }
    printf("resumed from %s at step %lld\n", a->resume, (long long)l->step);
  }
  topos_trainer *tr = ex_trainer(l->session, l->net, l->loss, err);
  if (tr == NULL) return err->code ? err->code : TOPOS_ERR_STATE;
  int64_t end = l->steps;
  if (a->stop_at > 0 && a->stop_at < end) end = a->stop_at;
  ex_progress bar;
  ex_progress_start(&bar, !a->no_progress, "train", l->unit ? l->unit : "steps",
                    l->steps);
  double t0 = ex_now_s();
  while (l->step < end && rc == TOPOS_OK) {
    topos_feed feeds[EX_MAX_FEEDS] = {{{0}}};
    int nfeeds = 0;
    rc = l->batch(l->step, feeds, &nfeeds, l->ctx, err);
    topos_optimizer opt = l->opt;
    if (l->lr != NULL) opt.lr = l->lr(l->step, l->ctx);
    topos_step_result next = {0};
    if (rc == TOPOS_OK)
      rc = topos_trainer_step(tr, l->params, feeds, nfeeds, &opt, l->state,
                              &next, err);
    for (int i = 0; i < nfeeds; i++)
      topos_tensor_release((topos_tensor *)feeds[i].tensor);
    if (rc != TOPOS_OK) break;
    topos_params_free(l->params);
    topos_opt_state_free(l->state);
    double loss = next.loss;
    l->params = next.params;
    l->state = next.state;
    next.params = NULL;
    next.state = NULL;
    topos_step_result_clear(&next);
    l->step++;
    char note[64];
    snprintf(note, sizeof note, "loss %.4f", loss);
    ex_progress_update(&bar, l->step, note);
    if (l->after != NULL) {
      /* The example prints: the bar steps aside for its lines. */
      double t_eval = ex_now_s();
      ex_progress_end(&bar);
      rc = l->after(l->step, l->params, loss, l->ctx, err);
      t0 += ex_now_s() - t_eval; /* evaluation is not stepping time */
      bar.t0 += ex_now_s() - t_eval;
    }
  }
  ex_progress_end(&bar);
  l->seconds = ex_now_s() - t0;
  l->stopped = rc == TOPOS_OK && l->step < l->steps;
  topos_trainer_free(tr);
  if (rc == TOPOS_OK && l->params == NULL) {
    l->params = topos_network_parameters(l->net); /* never stepped */
    if (l->params == NULL) rc = err->code = TOPOS_ERR_MEMORY;
  }
  if (rc == TOPOS_OK && a->save != NULL) {
    rc = ex_checkpoint_save(a->save, l->net, l->params, l->state, l->step, err);
    if (rc == TOPOS_OK)
      fprintf(stderr, "saved %s at step %lld\n", a->save, (long long)l->step);
  }
  return rc;
}

void ex_loop_clear(ex_loop *l) {
  topos_params_free(l->params);
  topos_opt_state_free(l->state);
  l->params = NULL;
  l->state = NULL;
}
