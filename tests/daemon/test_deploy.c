/*
 * test_deploy.c - deploy/ against the daemon it deploys.  No container
 * engine and no Kubernetes run here, so the files are checked as far as
 * a test can without one:
 *
 *   - every YAML file under deploy/k8s parses (Debian's python3-yaml,
 *     into JSON for cJSON), each document names its apiVersion, kind and
 *     metadata.name, kustomization.yaml lists exactly the manifests (and
 *     `kubectl kustomize` builds them when kubectl is there);
 *   - the probes point at the ports the daemon serves: every probe port
 *     is a containerPort, the grpc probe's is --listen's, the httpGet
 *     probes' --http's; the Services select the pods and target their
 *     ports; the termination grace covers preStop and --grace-ms; and the
 *     init container's script, then toposd with the container's own
 *     arguments (store and ports made local), start a daemon whose
 *     probes pass;
 *   - the probes' meaning: during the drain the liveness probes still
 *     pass and the readiness probes fail;
 *   - every flag of the Containerfile's ENTRYPOINT/CMD, the containers'
 *     args, the unit's ExecStart and every key of toposd.json is one
 *     `toposd --help` lists (the HEALTHCHECK's, `topos --help`), the
 *     image's CMD starts a daemon and its HEALTHCHECK passes against it,
 *     and a daemon starts on deploy/toposd.json;
 *   - the systemd unit: `systemd-analyze security --offline` rates it 3.0
 *     or less, `systemd-analyze verify` finds nothing (ExecStart pointed
 *     at the built toposd), the same with the GPU drop-in beside it
 *     (toposd-gpu.conf), it agrees with toposd.json, and toposd speaks
 *     the notify protocol it asks for (READY=1 from the main process once
 *     it serves, WATCHDOG=1 while $WATCHDOG_USEC is set).
 *
 * TOPOS_DEPLOY_DIR (default deploy) names the directory checked, so a
 * mutated copy can be checked without touching the tree.
 */
#include <cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "harness.h"
#include "health.pb-c.h"
#include "http_client.h"

enum {
  SERVING = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
};

static const char *deploy_dir(void) {
  const char *d = getenv("TOPOS_DEPLOY_DIR");
  return d && *d ? d : "deploy";
}

static const char *build_dir(void) {
  const char *b = getenv("TOPOS_BUILD");
  return b && *b ? b : "build";
}

/* An absolute path of the built program `name` (toposd, topos). */
static void built(const char *name, char *out, size_t len) {
  char rel[PATH_MAX];
  snprintf(rel, sizeof rel, "%s/bin/%s", build_dir(), name);
  ck_assert_msg(realpath(rel, out) != NULL && len >= PATH_MAX, "%s: %s", rel,
                strerror(errno));
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
    size_t n = fread(buf + len, 1, cap - 1 - len, f);
    if (n == 0) break;
    len += n;
  }
  buf[len] = '\0';
  fclose(f);
  return buf;
}

/* Whether `name` is a program on $PATH. */
static bool have_program(const char *name) {
  const char *path = getenv("PATH");
  if (path == NULL) return false;
  char dir[PATH_MAX];
  for (const char *p = path; *p;) {
    size_t n = strcspn(p, ":");
    snprintf(dir, sizeof dir, "%.*s/%s", (int)n, p, name);
    if (access(dir, X_OK) == 0) return true;
    p += n;
    if (*p == ':') p++;
  }
  return false;
}

/* Runs argv ($PATH searched) with the NAME=VALUE strings of env added,
 * stdin from /dev/null, stdout and stderr together into *out (malloc'd).
 * Returns the wait status. */
static int run_capture(const char *const *argv, const char *const *env,
                       char **out) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
    ssize_t n = read(fds[0], buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *out = buf;
  return status;
}

static bool exited_ok(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The last n bytes of a program's output, for a failure message (Check
 * caps their size). */
static const char *tail(const char *s, size_t n) {
  size_t len = strlen(s);
  return len > n ? s + len - n : s;
}

/* ------------------------------------------------------------- manifests */

/* deploy/k8s as JSON: [{"file": relative path, "docs": [...]}], every
 * *.yaml and *.yml below it, sorted; a file that does not parse fails the
 * test with Python's message. */
static const char yaml_to_json[] =
    "import json, os, sys, yaml\n"
    "out = []\n"
    "for root, dirs, files in os.walk(sys.argv[1]):\n"
    "    dirs.sort()\n"
    "    for name in sorted(files):\n"
    "        if name.endswith(('.yaml', '.yml')):\n"
    "            path = os.path.join(root, name)\n"
    "            with open(path) as f:\n"
    "                try:\n"
    "                    docs = list(yaml.safe_load_all(f))\n"
    "                except yaml.YAMLError as e:\n"
    "                    sys.exit('%s: %s' % (path, e))\n"
    "            out.append({'file': os.path.relpath(path, sys.argv[1]),\n"
    "                        'docs': [d for d in docs if d is not None]})\n"
    "print(json.dumps(out, default=str))\n";

static cJSON *load_manifests(void) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/k8s", deploy_dir());
  const char *argv[] = {"/usr/bin/python3", "-c", yaml_to_json, dir, NULL};
  char *out = NULL;
  int status = run_capture(argv, NULL, &out);
  ck_assert_msg(exited_ok(status), "%s does not parse as YAML: %s", dir,
                tail(out, 1500));
  cJSON *all = cJSON_Parse(out);
  ck_assert_msg(cJSON_IsArray(all), "python3 printed no JSON: %s",
                tail(out, 1500));
  free(out);
  return all;
}

static const char *str_of(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *at(const cJSON *o, const char *path) {
  /* "spec.template.spec": object keys joined by dots. */
  char key[64];
  while (o != NULL && *path) {
    size_t n = strcspn(path, ".");
    snprintf(key, sizeof key, "%.*s", (int)n, path);
    o = cJSON_GetObjectItemCaseSensitive(o, key);
    path += n;
    if (*path == '.') path++;
  }
  return o;
}

/* Every document of every file of load_manifests(). */
#define FOR_EACH_DOC(all, file, doc)                                      \
  for (const cJSON *file = (all)->child; file != NULL; file = file->next) \
    for (const cJSON *doc = at(file, "docs")->child; doc != NULL;         \
         doc = doc->next)

static bool is_workload(const cJSON *doc) {
  const char *kind = str_of(doc, "kind");
  return kind &&
         (strcmp(kind, "Deployment") == 0 || strcmp(kind, "StatefulSet") == 0 ||
          strcmp(kind, "DaemonSet") == 0);
}

/* A container that runs toposd: no command (the image's ENTRYPOINT) or a
 * command whose program is toposd. */
static bool runs_toposd(const cJSON *container) {
  const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(container, "command");
  if (cmd == NULL) return true;
  const cJSON *first = cJSON_GetArrayItem(cmd, 0);
  if (!cJSON_IsString(first)) return false;
  const char *slash = strrchr(first->valuestring, '/');
  return strcmp(slash ? slash + 1 : first->valuestring, "toposd") == 0;
}

/* The value of --flag in an argument array ("--flag VALUE" or
 * "--flag=VALUE"), or NULL. */
static const char *flag_value(const cJSON *args, const char *flag) {
  size_t n = strlen(flag);
  for (const cJSON *a = args ? args->child : NULL; a; a = a->next) {
    if (!cJSON_IsString(a)) continue;
    const char *s = a->valuestring;
    if (strncmp(s, flag, n) == 0 && s[n] == '=') return s + n + 1;
    if (strcmp(s, flag) == 0 && cJSON_IsString(a->next))
      return a->next->valuestring;
  }
  return NULL;
}

static bool has_flag(const cJSON *args, const char *flag) {
  size_t n = strlen(flag);
  for (const cJSON *a = args ? args->child : NULL; a; a = a->next)
    if (cJSON_IsString(a) && strncmp(a->valuestring, flag, n) == 0 &&
        (a->valuestring[n] == '\0' || a->valuestring[n] == '='))
      return true;
  return false;
}

/* The port of HOST:PORT, or -1. */
static int port_of(const char *address) {
  const char *colon = address ? strrchr(address, ':') : NULL;
  if (colon == NULL || !isdigit((unsigned char)colon[1])) return -1;
  return atoi(colon + 1);
}

/* A probe's port: a number, or the name of one of ports; the container
 * port it means, or -1 when it is neither. */
static int probe_port(const cJSON *port, const cJSON *ports) {
  for (const cJSON *p = ports ? ports->child : NULL; p; p = p->next) {
    const cJSON *num = cJSON_GetObjectItemCaseSensitive(p, "containerPort");
    const char *name = str_of(p, "name");
    if (!cJSON_IsNumber(num)) continue;
    if (cJSON_IsNumber(port) && port->valueint == num->valueint)
      return num->valueint;
    if (cJSON_IsString(port) && name && strcmp(port->valuestring, name) == 0)
      return num->valueint;
  }
  return -1;
}

static bool has_container_port(int port, const cJSON *ports) {
  cJSON *n = cJSON_CreateNumber(port);
  bool has = probe_port(n, ports) > 0;
  cJSON_Delete(n);
  return has;
}

static bool kind_is(const cJSON *doc, const char *kind) {
  const char *k = str_of(doc, "kind");
  return k != NULL && strcmp(k, kind) == 0;
}

static const char *const probe_kinds[] = {"startupProbe", "livenessProbe",
                                          "readinessProbe"};

/* ------------------------------------------------------- a live daemon */

/* Starts toposd with `args` as a container or a unit would, but local:
 * the value of --store becomes d->store, those of --listen and --http
 * keep their host and get port 0; then `append`.  env: NAME=VALUE strings
 * for the daemon's environment.  Waits for the start-up lines and sets
 * d->port and d->http_port. */
static void start_with(daemon_proc *d, const cJSON *args,
                       const char *const *append, const char *const *env) {
  char bin[PATH_MAX];
  built("toposd", bin, sizeof bin);
  enum { MAX = 96 };
  char *argv[MAX];
  int argc = 0;
  argv[argc++] = strdup(bin);
  const char *prev = "";
  for (const cJSON *a = args ? args->child : NULL; a && argc < MAX - 16;
       a = a->next) {
    ck_assert_msg(cJSON_IsString(a), "an argument is not a string");
    const char *s = a->valuestring;
    char buf[600];
    const char *eq = strchr(s, '=');
    char flag[64] = "";
    const char *value = NULL;
    if (strncmp(s, "--", 2) == 0 && eq != NULL) {
      snprintf(flag, sizeof flag, "%.*s", (int)(eq - s), s);
      value = eq + 1;
    } else if (strncmp(s, "--", 2) != 0) {
      snprintf(flag, sizeof flag, "%s", prev);
      value = s;
    }
    const char *v = value;
    if (value && strcmp(flag, "--store") == 0) v = d->store;
    if (value && (strcmp(flag, "--listen") == 0 ||
                  (strcmp(flag, "--http") == 0 && strcmp(value, "off") != 0))) {
      const char *colon = strrchr(value, ':');
      snprintf(buf, sizeof buf, "%.*s:0",
               (int)(colon ? colon - value : (long)strlen(value)), value);
      v = buf;
    }
    char joined[700];
    if (value && eq != NULL && strncmp(s, "--", 2) == 0) {
      snprintf(joined, sizeof joined, "%s=%s", flag, v);
      argv[argc++] = strdup(joined);
    } else {
      argv[argc++] = strdup(value ? v : s);
    }
    prev = s;
  }
  for (int i = 0; append && append[i] && argc < MAX - 1; i++)
    argv[argc++] = strdup(append[i]);
  argv[argc] = NULL;
  daemon_exec(d, argv, env);
  for (int i = 0; i < argc; i++) free(argv[i]);
}

/* grpc.health.v1.Health/Check(service) on 127.0.0.1:port: the serving
 * status, or -1 - the gRPC status when the call fails. */
static int health_check(int port, const char *service) {
  client c;
  client_open(&c, port);
  Grpc__Health__V1__HealthCheckRequest req =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)(service ? service : "");
  size_t len = 0;
  uint8_t *bytes = pack(&req.base, &len);
  reply r;
  call_raw(&c, "/grpc.health.v1.Health/Check", bytes, len, 10000, &r);
  free(bytes);
  int status = -1 - r.status;
  if (r.status == GRPC_STATUS_OK) {
    Grpc__Health__V1__HealthCheckResponse *m =
        grpc__health__v1__health_check_response__unpack(NULL, r.len, r.data);
    ck_assert_ptr_nonnull(m);
    status = (int)m->status;
    grpc__health__v1__health_check_response__free_unpacked(m, NULL);
  }
  reply_clear(&r);
  client_close(&c);
  return status;
}

/* Where the live daemon serves what the container's flags name. */
typedef struct live_ports {
  int listen_flag, http_flag; /* the ports in the container's flags */
  int grpc, http;             /* the live daemon's */
} live_ports;

/* Runs one probe as the kubelet would, against the live daemon: true when
 * it passes, else false with why. */
static bool probe_passes(const cJSON *probe, const cJSON *ports,
                         const live_ports *lp, char *why, size_t whylen) {
  const cJSON *get = cJSON_GetObjectItemCaseSensitive(probe, "httpGet");
  const cJSON *grpc = cJSON_GetObjectItemCaseSensitive(probe, "grpc");
  const cJSON *tcp = cJSON_GetObjectItemCaseSensitive(probe, "tcpSocket");
  const cJSON *handler = get ? get : grpc ? grpc : tcp;
  if (handler == NULL) {
    snprintf(why, whylen, "no httpGet, grpc or tcpSocket handler");
    return false;
  }
  int cport = probe_port(at(handler, "port"), ports);
  int live = cport == lp->listen_flag ? lp->grpc
             : cport == lp->http_flag ? lp->http
                                      : -1;
  if (live <= 0) {
    snprintf(why, whylen, "port %d is neither --listen's nor --http's", cport);
    return false;
  }
  if (get) {
    const char *path = str_of(get, "path");
    http_reply r;
    http_get(live, path ? path : "/", &r);
    int status = r.status;
    http_reply_clear(&r);
    /* The kubelet's rule: 200 <= status < 400. */
    snprintf(why, whylen, "GET %s: HTTP %d", path ? path : "/", status);
    return status >= 200 && status < 400;
  }
  if (grpc) {
    const char *service = str_of(grpc, "service");
    int s = health_check(live, service);
    snprintf(why, whylen, "Health/Check(\"%s\"): %d (1 is SERVING)",
             service ? service : "", s);
    return s == SERVING;
  }
  int fd = http_connect(live);
  snprintf(why, whylen, "tcp connect to %d: %s", live,
           fd >= 0 ? "ok" : "refused");
  if (fd >= 0) close(fd);
  return fd >= 0;
}

/* --------------------------------------------------------------- cases */

START_TEST(test_deploy_yaml_parses) {
  cJSON *all = load_manifests();
  ck_assert_msg(cJSON_GetArraySize(all) > 0, "no YAML under %s/k8s",
                deploy_dir());
  const cJSON *kustomization = NULL;
  int docs = 0;
  FOR_EACH_DOC(all, file, doc) {
    const char *name = str_of(file, "file");
    ck_assert_msg(cJSON_IsObject(doc), "%s: a document is not a mapping", name);
    const char *api = str_of(doc, "apiVersion"), *kind = str_of(doc, "kind");
    const cJSON *meta_name = at(doc, "metadata.name");
    ck_assert_msg(api && *api, "%s: a document has no apiVersion", name);
    ck_assert_msg(kind && *kind, "%s: a document has no kind", name);
    ck_assert_msg(cJSON_IsString(meta_name) && *meta_name->valuestring,
                  "%s: a %s has no metadata.name", name, kind);
    if (strcmp(kind, "Kustomization") == 0) kustomization = doc;
    docs++;
  }
  ck_assert_int_gt(docs, 0);
  /* The kustomization names every manifest, and only files that exist. */
  ck_assert_msg(kustomization != NULL, "no kustomization.yaml");
  const cJSON *resources = at(kustomization, "resources");
  ck_assert_msg(cJSON_IsArray(resources), "the kustomization has no resources");
  for (const cJSON *file = all->child; file; file = file->next) {
    const char *name = str_of(file, "file");
    if (strcmp(name, "kustomization.yaml") == 0) continue;
    bool listed = false;
    for (const cJSON *r = resources->child; r; r = r->next)
      listed =
          listed || (cJSON_IsString(r) && strcmp(r->valuestring, name) == 0);
    ck_assert_msg(listed, "kustomization.yaml does not list %s", name);
  }
  for (const cJSON *r = resources->child; r; r = r->next) {
    bool found = false;
    for (const cJSON *file = all->child; file; file = file->next)
      found = found || strcmp(str_of(file, "file"), r->valuestring) == 0;
    ck_assert_msg(found, "kustomization.yaml lists %s, which is not there",
                  r->valuestring);
  }
  cJSON_Delete(all);
  /* kubectl's own kustomize builds the set, where kubectl is installed. */
  if (have_program("kubectl")) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/k8s", deploy_dir());
    const char *argv[] = {"kubectl", "kustomize", dir, NULL};
    char *out = NULL;
    int status = run_capture(argv, NULL, &out);
    ck_assert_msg(exited_ok(status), "kubectl kustomize %s: %s", dir,
                  tail(out, 1500));
    free(out);
  } else {
    printf("deploy: kubectl not installed: `kubectl kustomize` not run\n");
  }
}
END_TEST

/* Runs the init containers' scripts (sh -ec) on d's store, as the pod
 * would before toposd starts; `seed` is $TOPOS_SEED. */
static void run_init_containers(const cJSON *pod, const daemon_proc *d,
                                const char *seed) {
  char bin[PATH_MAX], dir[PATH_MAX + 8];
  built("topos", bin, sizeof bin);
  snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(bin, '/') - bin), bin);
  static char env_store[600], env_seed[600], env_path[8192];
  snprintf(env_store, sizeof env_store, "TOPOS_STORE=%s", d->store);
  snprintf(env_seed, sizeof env_seed, "TOPOS_SEED=%s", seed);
  const char *path = getenv("PATH");
  snprintf(env_path, sizeof env_path, "PATH=%s:%s", dir, path ? path : "");
  const char *env[] = {env_store, env_seed, env_path, NULL};
  const cJSON *inits = at(pod, "initContainers");
  for (const cJSON *c = inits ? inits->child : NULL; c; c = c->next) {
    const cJSON *cmd = at(c, "command");
    const char *argv[16];
    int argc = 0;
    for (const cJSON *a = cmd ? cmd->child : NULL; a && argc < 15; a = a->next)
      argv[argc++] = a->valuestring;
    for (const cJSON *a = at(c, "args") ? at(c, "args")->child : NULL;
         a && argc < 15; a = a->next)
      argv[argc++] = a->valuestring;
    argv[argc] = NULL;
    ck_assert_msg(argc > 0, "init container %s has no command",
                  str_of(c, "name"));
    /* Twice: a restarted pod runs it again. */
    for (int round = 0; round < 2; round++) {
      char *out = NULL;
      int status = run_capture(argv, env, &out);
      ck_assert_msg(exited_ok(status), "init container %s (run %d): %s",
                    str_of(c, "name"), round + 1, tail(out, 1500));
      free(out);
    }
  }
}

/* The tenants of a store file, as `topos tenant list` prints them. */
static char *tenant_list(const char *store) {
  char bin[PATH_MAX];
  built("topos", bin, sizeof bin);
  const char *argv[] = {bin, "--store", store, "tenant", "list", NULL};
  char *out = NULL;
  int status = run_capture(argv, NULL, &out);
  ck_assert_msg(exited_ok(status), "topos tenant list: %s", tail(out, 1500));
  return out;
}

START_TEST(test_deploy_probes) {
  cJSON *all = load_manifests();
  int containers = 0, probes = 0;
  const cJSON *headless = NULL;
  FOR_EACH_DOC(all, file, doc) {
    if (kind_is(doc, "Service") && str_of(at(doc, "spec"), "clusterIP") &&
        strcmp(str_of(at(doc, "spec"), "clusterIP"), "None") == 0)
      headless = doc;
  }
  ck_assert_msg(headless != NULL, "no headless Service (clusterIP: None)");
  FOR_EACH_DOC(all, file, doc) {
    if (!is_workload(doc)) continue;
    const char *wname = str_of(at(doc, "metadata"), "name");
    const cJSON *pod = at(doc, "spec.template.spec");
    const cJSON *labels = at(doc, "spec.template.metadata.labels");
    if (kind_is(doc, "StatefulSet")) {
      const char *governing = str_of(at(doc, "spec"), "serviceName");
      ck_assert_msg(
          governing &&
              strcmp(governing, str_of(at(headless, "metadata"), "name")) == 0,
          "%s: serviceName is not the headless Service", wname);
    }
    for (const cJSON *c = at(pod, "containers")->child; c; c = c->next) {
      if (!runs_toposd(c)) continue;
      containers++;
      const char *cname = str_of(c, "name");
      const cJSON *args = at(c, "args");
      const cJSON *ports = at(c, "ports");
      const char *listen = flag_value(args, "--listen");
      const char *http = flag_value(args, "--http");
      live_ports lp = {port_of(listen ? listen : "127.0.0.1:50051"),
                       port_of(http ? http : "127.0.0.1:8080"), 0, 0};
      ck_assert_msg(has_container_port(lp.listen_flag, ports),
                    "%s/%s: --listen's port %d is not a containerPort", wname,
                    cname, lp.listen_flag);
      ck_assert_msg(has_container_port(lp.http_flag, ports),
                    "%s/%s: --http's port %d is not a containerPort", wname,
                    cname, lp.http_flag);
      bool tls = has_flag(args, "--tls-cert");
      for (int k = 0; k < 3; k++) {
        const cJSON *probe = at(c, probe_kinds[k]);
        if (probe == NULL) {
          ck_assert_msg(k == 0, "%s/%s has no %s", wname, cname,
                        probe_kinds[k]);
          continue;
        }
        probes++;
        const cJSON *get = at(probe, "httpGet"), *grpc = at(probe, "grpc");
        const cJSON *handler = get ? get : grpc ? grpc : at(probe, "tcpSocket");
        ck_assert_msg(handler != NULL,
                      "%s/%s %s: no httpGet, grpc or tcpSocket", wname, cname,
                      probe_kinds[k]);
        int cport = probe_port(at(handler, "port"), ports);
        ck_assert_msg(cport > 0, "%s/%s %s: its port is not a containerPort",
                      wname, cname, probe_kinds[k]);
        if (get) {
          ck_assert_msg(cport == lp.http_flag,
                        "%s/%s %s: httpGet on port %d, but --http serves %d",
                        wname, cname, probe_kinds[k], cport, lp.http_flag);
          const char *scheme = str_of(get, "scheme");
          bool https = scheme && strcmp(scheme, "HTTPS") == 0;
          ck_assert_msg(https == tls,
                        "%s/%s %s: scheme %s, but the gateway serves %s", wname,
                        cname, probe_kinds[k], https ? "HTTPS" : "HTTP",
                        tls ? "HTTPS (--tls-cert)" : "HTTP");
        }
        if (grpc) {
          ck_assert_msg(cJSON_IsNumber(at(grpc, "port")),
                        "%s/%s %s: a grpc probe's port must be a number", wname,
                        cname, probe_kinds[k]);
          ck_assert_msg(cport == lp.listen_flag,
                        "%s/%s %s: grpc on port %d, but --listen serves %d",
                        wname, cname, probe_kinds[k], cport, lp.listen_flag);
          ck_assert_msg(!tls,
                        "%s/%s %s: the kubelet's grpc probe cannot "
                        "speak TLS (--tls-cert)",
                        wname, cname, probe_kinds[k]);
        }
      }
      /* The termination grace covers preStop and the drain. */
      const cJSON *tgps = at(pod, "terminationGracePeriodSeconds");
      double grace_s = tgps ? tgps->valuedouble : 30;
      const char *grace_ms = flag_value(args, "--grace-ms");
      double drain_s = (grace_ms ? atof(grace_ms) : 5000) / 1000;
      double prestop_s = 0;
      const cJSON *pre = at(c, "lifecycle.preStop");
      const cJSON *sleep_cmd = at(pre, "exec.command");
      if (cJSON_IsArray(sleep_cmd) && cJSON_GetArraySize(sleep_cmd) == 2 &&
          strstr(cJSON_GetArrayItem(sleep_cmd, 0)->valuestring, "sleep"))
        prestop_s = atof(cJSON_GetArrayItem(sleep_cmd, 1)->valuestring);
      if (cJSON_IsNumber(at(pre, "sleep.seconds")))
        prestop_s = at(pre, "sleep.seconds")->valuedouble;
      ck_assert_msg(grace_s >= prestop_s + drain_s + 5,
                    "%s: terminationGracePeriodSeconds %.0f is less than "
                    "preStop %.0f s + --grace-ms %.0f s + 5 s to stop",
                    wname, grace_s, prestop_s, drain_s);
      /* The init containers prepare the store toposd opens. */
      const char *store = flag_value(args, "--store");
      const cJSON *inits = at(pod, "initContainers");
      for (const cJSON *ic = inits ? inits->child : NULL; ic; ic = ic->next) {
        const cJSON *env = at(ic, "env");
        for (const cJSON *e = env ? env->child : NULL; e; e = e->next)
          if (strcmp(str_of(e, "name"), "TOPOS_STORE") == 0)
            ck_assert_msg(store && strcmp(str_of(e, "value"), store) == 0,
                          "init container %s: TOPOS_STORE %s is not --store %s",
                          str_of(ic, "name"), str_of(e, "value"),
                          store ? store : "(default)");
      }
      /* Every Service selects these pods and targets their ports. */
      FOR_EACH_DOC(all, sfile, svc) {
        if (!kind_is(svc, "Service")) continue;
        const char *sname = str_of(at(svc, "metadata"), "name");
        const cJSON *sel = at(svc, "spec.selector");
        ck_assert_msg(cJSON_IsObject(sel) && sel->child,
                      "Service %s has no selector", sname);
        for (const cJSON *kv = sel->child; kv; kv = kv->next) {
          const char *v = str_of(labels, kv->string);
          ck_assert_msg(v && strcmp(v, kv->valuestring) == 0,
                        "Service %s selects %s=%s, which %s's pods lack", sname,
                        kv->string, kv->valuestring, wname);
        }
        for (const cJSON *sp = at(svc, "spec.ports")->child; sp;
             sp = sp->next) {
          const cJSON *target = at(sp, "targetPort");
          if (target == NULL) target = at(sp, "port");
          ck_assert_msg(probe_port(target, ports) > 0,
                        "Service %s: port %s targets no containerPort of "
                        "%s/%s",
                        sname, str_of(sp, "name"), wname, cname);
        }
      }

      /* Live: the init containers, then toposd with these very flags
       * (store and ports made local); every probe passes. */
      daemon_proc d;
      memset(&d, 0, sizeof d);
      daemon_dir(&d);
      char var[300];
      snprintf(var, sizeof var, "%s/var", d.dir);
      ck_assert_int_eq(mkdir(var, 0700), 0);
      char no_seed[300];
      snprintf(no_seed, sizeof no_seed, "%s/no-seed.db", d.dir);
      run_init_containers(pod, &d, no_seed);
      start_with(&d, args, NULL, NULL);
      grpc_init();
      lp.grpc = d.port;
      lp.http = d.http_port;
      for (int k = 0; k < 3; k++) {
        const cJSON *probe = at(c, probe_kinds[k]);
        if (probe == NULL) continue;
        char why[256];
        ck_assert_msg(probe_passes(probe, ports, &lp, why, sizeof why),
                      "%s/%s %s fails against toposd: %s", wname, cname,
                      probe_kinds[k], why);
      }
      /* The GET check tells a served path from one that is not (401
       * here: with tenants, only the probes' paths are open). */
      http_reply r;
      http_get(d.http_port, "/no-such-probe", &r);
      ck_assert_msg(r.status >= 400, "GET /no-such-probe: HTTP %d", r.status);
      http_reply_clear(&r);
      grpc_shutdown();
      assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
      daemon_cleanup(&d);
    }
  }
  ck_assert_msg(containers > 0, "no workload runs toposd");
  ck_assert_int_ge(probes, 2);
  cJSON_Delete(all);
}
END_TEST

START_TEST(test_deploy_init_seeds) {
  /* A new store is seeded from $TOPOS_SEED (the Secret toposd-seed), and
   * one that has tenants gets no "ops". */
  cJSON *all = load_manifests();
  int runs = 0;
  FOR_EACH_DOC(all, file, doc) {
    if (!is_workload(doc) ||
        at(doc, "spec.template.spec.initContainers") == NULL)
      continue;
    daemon_proc d;
    memset(&d, 0, sizeof d);
    daemon_dir(&d);
    char var[300], seed[300];
    snprintf(var, sizeof var, "%s/var", d.dir);
    ck_assert_int_eq(mkdir(var, 0700), 0);
    snprintf(seed, sizeof seed, "%s/seed.db", d.dir);
    char bin[PATH_MAX];
    built("topos", bin, sizeof bin);
    const char *add[] = {bin, "--store", seed, "tenant", "add", "alice", NULL};
    char *out = NULL;
    ck_assert_msg(exited_ok(run_capture(add, NULL, &out)), "%s", out);
    free(out);
    run_init_containers(at(doc, "spec.template.spec"), &d, seed);
    char *list = tenant_list(d.store);
    ck_assert_msg(strstr(list, "alice") != NULL && strstr(list, "ops") == NULL,
                  "the store was not seeded: %s", list);
    free(list);
    daemon_cleanup(&d);
    runs++;
  }
  cJSON_Delete(all);
  if (runs == 0) printf("deploy: no init container to seed a store\n");
}
END_TEST

START_TEST(test_deploy_probes_drain) {
  /* Liveness probes pass while toposd drains (the pod is not killed in
   * its grace); readiness probes fail (it leaves the endpoints). */
  cJSON *all = load_manifests();
  const cJSON *container = NULL;
  FOR_EACH_DOC(all, file, doc) {
    if (!is_workload(doc)) continue;
    for (const cJSON *c = at(doc, "spec.template.spec.containers")->child; c;
         c = c->next)
      if (runs_toposd(c) && container == NULL) container = c;
  }
  ck_assert_msg(container != NULL, "no workload runs toposd");
  const cJSON *args = at(container, "args");
  const cJSON *ports = at(container, "ports");
  const char *listen = flag_value(args, "--listen");
  const char *http = flag_value(args, "--http");
  const cJSON *live = at(container, "livenessProbe");
  const cJSON *ready = at(container, "readinessProbe");
  ck_assert_ptr_nonnull(live);
  ck_assert_ptr_nonnull(ready);

  daemon_proc d;
  client c;
  const char *extra[] = {"--grace-ms", "20000", "--workers", "2", NULL};
  fixture_start(&d, &c, extra);
  live_ports lp = {port_of(listen ? listen : "127.0.0.1:50051"),
                   port_of(http ? http : "127.0.0.1:8080"), d.port,
                   d.http_port};
  char why[256];
  ck_assert_msg(probe_passes(live, ports, &lp, why, sizeof why),
                "liveness fails on a serving daemon: %s", why);
  ck_assert_msg(probe_passes(ready, ports, &lp, why, sizeof why),
                "readiness fails on a serving daemon: %s", why);

  topos_value out;
  topos_network *net = calibrated_slow_network(1.0, &out, NULL);
  char id[65];
  record(&c, net, id);
  flood_arg s = {.port = d.port};
  uint8_t *bytes = NULL;
  slow_forward_request(net, out, id, &bytes, &s.len);
  s.bytes = bytes;
  pthread_t t;
  pthread_create(&t, NULL, flood_one, &s);
  wait_run_in_flight(&c, 30);
  kill(d.pid, SIGTERM);
  /* The drain has begun once the Health method says so. */
  double until = now_s() + 10;
  for (;;) {
    Topos__V1__HealthRequest h = TOPOS__V1__HEALTH_REQUEST__INIT;
    Topos__V1__HealthReply *hr = NULL;
    CALL_OK(&c, "Health", &h, &topos__v1__health_reply__descriptor, &hr);
    bool draining = strcmp(hr->status, "draining") == 0;
    wire_message_free(&hr->base);
    if (draining) break;
    ck_assert_msg(now_s() < until, "toposd did not start draining");
    usleep(10000);
  }
  ck_assert_msg(probe_passes(live, ports, &lp, why, sizeof why),
                "liveness fails while toposd drains (the kubelet would kill "
                "it in its grace): %s",
                why);
  ck_assert_msg(!probe_passes(ready, ports, &lp, why, sizeof why),
                "readiness passes while toposd drains (it would keep "
                "getting calls it refuses): %s",
                why);
  pthread_join(t, NULL);
  ck_assert_int_eq(s.status, GRPC_STATUS_OK);
  free(bytes);
  fixture_stop(&d, &c, 30);
  topos_network_release(net);
  cJSON_Delete(all);
}
END_TEST

/* ------------------------------------------------------------- flags */

/* The options a program's --help lists: every "--name" that starts an
 * option line (and "--help, --version"). */
static cJSON *help_flags(const char *program, bool anywhere) {
  char bin[PATH_MAX];
  built(program, bin, sizeof bin);
  const char *argv[] = {bin, "--help", NULL};
  char *out = NULL;
  int status = run_capture(argv, NULL, &out);
  ck_assert_msg(exited_ok(status) || anywhere, "%s --help: %s", program,
                tail(out, 1500));
  cJSON *set = cJSON_CreateObject();
  char *save = NULL;
  for (char *line = strtok_r(out, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char *p = line;
    while (*p == ' ') p++;
    if (anywhere) p = line;
    for (;;) {
      char *dash =
          anywhere ? strstr(p, "--") : (strncmp(p, "--", 2) ? NULL : p);
      if (dash == NULL) break;
      size_t n = 2;
      while (isalnum((unsigned char)dash[n]) || dash[n] == '-') n++;
      if (n > 2) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)n, dash);
        if (!cJSON_HasObjectItem(set, name)) cJSON_AddTrueToObject(set, name);
      }
      p = dash + n;
      if (!anywhere) {
        if (strncmp(p, ", --", 4) != 0) break;
        p += 2;
      }
    }
  }
  free(out);
  ck_assert_msg(cJSON_HasObjectItem(set, "--help"), "%s --help lists nothing",
                program);
  return set;
}

/* Every "--flag" of args is in set. */
static void assert_flags_known(const cJSON *args, const cJSON *set,
                               const char *where, const char *program) {
  int n = 0;
  for (const cJSON *a = args ? args->child : NULL; a; a = a->next) {
    ck_assert_msg(cJSON_IsString(a), "%s: an argument is not a string", where);
    if (strncmp(a->valuestring, "--", 2) != 0) continue;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(a->valuestring, "="),
             a->valuestring);
    ck_assert_msg(cJSON_HasObjectItem(set, name),
                  "%s: %s is not an option `%s --help` lists", where, name,
                  program);
    n++;
  }
  ck_assert_msg(n > 0, "%s: no flags at all", where);
}

/* The Containerfile's last stage: ENTRYPOINT, CMD (exec form, JSON
 * arrays), HEALTHCHECK's CMD, and ENV TOPOS_STORE. */
typedef struct containerfile {
  cJSON *entrypoint, *cmd, *healthcheck;
  char store_env[512];
} containerfile;

static void containerfile_load(containerfile *cf) {
  memset(cf, 0, sizeof *cf);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/Containerfile", deploy_dir());
  char *text = read_text(path);
  /* Logical lines: comments dropped (also inside a continuation), lines
   * ending in a backslash joined. */
  size_t cap = strlen(text) + 1;
  char *logical = malloc(cap);
  size_t len = 0;
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '#') {
      size_t n = strlen(line);
      while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\r')) n--;
      bool more = n > 0 && line[n - 1] == '\\';
      if (more) n--;
      if (n > 0 || !more) {
        memcpy(logical + len, line, n);
        len += n;
      }
      if (!more && len > 0) {
        logical[len] = '\0';
        char *s = logical;
        while (isspace((unsigned char)*s)) s++;
        char word[16] = "";
        size_t w = strcspn(s, " \t");
        snprintf(word, sizeof word, "%.*s", (int)w, s);
        for (char *u = word; *u; u++) *u = (char)toupper((unsigned char)*u);
        char *rest = s + w;
        while (isspace((unsigned char)*rest)) rest++;
        if (strcmp(word, "FROM") == 0) {
          cJSON_Delete(cf->entrypoint);
          cJSON_Delete(cf->cmd);
          cJSON_Delete(cf->healthcheck);
          cf->entrypoint = cf->cmd = cf->healthcheck = NULL;
          cf->store_env[0] = '\0';
        } else if (strcmp(word, "ENTRYPOINT") == 0 ||
                   strcmp(word, "CMD") == 0) {
          cJSON *array = cJSON_Parse(rest);
          ck_assert_msg(cJSON_IsArray(array),
                        "%s: %s is not in the exec form (a JSON array): "
                        "in the shell form SIGTERM reaches sh, not toposd",
                        path, word);
          cJSON **slot = word[0] == 'E' ? &cf->entrypoint : &cf->cmd;
          cJSON_Delete(*slot);
          *slot = array;
        } else if (strcmp(word, "HEALTHCHECK") == 0) {
          char *cmd = strstr(rest, "CMD");
          ck_assert_msg(cmd != NULL, "%s: HEALTHCHECK without CMD", path);
          cJSON_Delete(cf->healthcheck);
          cf->healthcheck = cJSON_Parse(cmd + 3);
          ck_assert_msg(cJSON_IsArray(cf->healthcheck),
                        "%s: HEALTHCHECK CMD is not a JSON array", path);
        } else if (strcmp(word, "ENV") == 0) {
          char *v = strstr(rest, "TOPOS_STORE=");
          if (v)
            snprintf(cf->store_env, sizeof cf->store_env, "%.*s",
                     (int)strcspn(v + 12, " \t"), v + 12);
        }
        len = 0;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  free(logical);
  free(text);
  ck_assert_msg(cf->entrypoint != NULL, "%s: no ENTRYPOINT", path);
  ck_assert_msg(cf->cmd != NULL, "%s: no CMD", path);
}

static void containerfile_free(containerfile *cf) {
  cJSON_Delete(cf->entrypoint);
  cJSON_Delete(cf->cmd);
  cJSON_Delete(cf->healthcheck);
}

/* The unit's [Service] settings, by key (a key given twice keeps the
 * last; ExecStart split into words, as a JSON array). */
typedef struct unit {
  cJSON *service; /* key -> string */
  cJSON *exec;    /* ExecStart's words */
} unit;

static void unit_load(unit *u) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/toposd.service", deploy_dir());
  char *text = read_text(path);
  u->service = cJSON_CreateObject();
  bool in_service = false;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    while (isspace((unsigned char)*line)) line++;
    if (*line == '#' || *line == ';' || *line == '\0') continue;
    if (*line == '[') {
      in_service = strncmp(line, "[Service]", 9) == 0;
      continue;
    }
    char *eq = strchr(line, '=');
    if (!in_service || eq == NULL) continue;
    *eq = '\0';
    char *key = line, *value = eq + 1;
    for (char *k = key + strlen(key); k > key && isspace((unsigned char)k[-1]);)
      *--k = '\0';
    while (isspace((unsigned char)*value)) value++;
    cJSON_DeleteItemFromObjectCaseSensitive(u->service, key);
    cJSON_AddStringToObject(u->service, key, value);
  }
  free(text);
  const char *exec = str_of(u->service, "ExecStart");
  ck_assert_msg(exec != NULL, "%s: no ExecStart", path);
  u->exec = cJSON_CreateArray();
  char *copy = strdup(exec);
  for (char *w = strtok_r(copy, " \t", &save); w;
       w = strtok_r(NULL, " \t", &save)) {
    if (cJSON_GetArraySize(u->exec) == 0)
      while (strchr("-@:+!", *w) && *w) w++; /* ExecStart's prefixes */
    cJSON_AddItemToArray(u->exec, cJSON_CreateString(w));
  }
  free(copy);
}

static void unit_free(unit *u) {
  cJSON_Delete(u->service);
  cJSON_Delete(u->exec);
}

static bool basename_is(const char *path, const char *name) {
  const char *slash = strrchr(path, '/');
  return strcmp(slash ? slash + 1 : path, name) == 0;
}

START_TEST(test_deploy_flags) {
  cJSON *toposd = help_flags("toposd", false);
  cJSON *topos = help_flags("topos", true);
  char where[PATH_MAX + 64];

  /* The Containerfile: ENTRYPOINT is toposd, CMD its flags. */
  containerfile cf;
  containerfile_load(&cf);
  snprintf(where, sizeof where, "%s/Containerfile", deploy_dir());
  ck_assert_msg(
      cJSON_GetArraySize(cf.entrypoint) == 1 &&
          basename_is(cJSON_GetArrayItem(cf.entrypoint, 0)->valuestring,
                      "toposd"),
      "%s: ENTRYPOINT is not [\".../toposd\"]", where);
  assert_flags_known(cf.cmd, toposd, where, "toposd");
  const char *cmd_store = flag_value(cf.cmd, "--store");
  ck_assert_msg(cmd_store && strcmp(cmd_store, cf.store_env) == 0,
                "%s: ENV TOPOS_STORE (%s) is not CMD's --store (%s)", where,
                cf.store_env, cmd_store ? cmd_store : "none");
  if (cf.healthcheck) {
    ck_assert_msg(
        basename_is(cJSON_GetArrayItem(cf.healthcheck, 0)->valuestring,
                    "topos"),
        "%s: HEALTHCHECK does not run topos", where);
    assert_flags_known(cf.healthcheck, topos, where, "topos");
  }

  /* The containers' args. */
  cJSON *all = load_manifests();
  int containers = 0;
  FOR_EACH_DOC(all, file, doc) {
    if (!is_workload(doc)) continue;
    for (const cJSON *c = at(doc, "spec.template.spec.containers")->child; c;
         c = c->next) {
      if (!runs_toposd(c)) continue;
      snprintf(where, sizeof where, "k8s/%s: container %s",
               str_of(file, "file"), str_of(c, "name"));
      assert_flags_known(at(c, "args"), toposd, where, "toposd");
      containers++;
    }
  }
  ck_assert_int_gt(containers, 0);
  cJSON_Delete(all);

  /* The unit's ExecStart, and the keys of the config file it reads. */
  unit u;
  unit_load(&u);
  snprintf(where, sizeof where, "%s/toposd.service ExecStart", deploy_dir());
  ck_assert_msg(
      basename_is(cJSON_GetArrayItem(u.exec, 0)->valuestring, "toposd"),
      "%s does not run toposd", where);
  assert_flags_known(u.exec, toposd, where, "toposd");
  char json_path[PATH_MAX];
  snprintf(json_path, sizeof json_path, "%s/toposd.json", deploy_dir());
  char *text = read_text(json_path);
  cJSON *config = cJSON_Parse(text);
  free(text);
  ck_assert_msg(cJSON_IsObject(config), "%s is not a JSON object", json_path);
  for (const cJSON *kv = config->child; kv; kv = kv->next) {
    char flag[80];
    snprintf(flag, sizeof flag, "--%s", kv->string);
    for (char *p = flag; *p; p++)
      if (*p == '_') *p = '-';
    ck_assert_msg(cJSON_HasObjectItem(toposd, flag),
                  "%s: key %s is no setting of toposd's (%s)", json_path,
                  kv->string, flag);
  }

  /* The image's CMD starts a daemon once the store has a tenant (the
   * step the Containerfile documents), and its HEALTHCHECK passes. */
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char var[300], env_store[600], bin[PATH_MAX];
  snprintf(var, sizeof var, "%s/var", d.dir);
  ck_assert_int_eq(mkdir(var, 0700), 0);
  snprintf(env_store, sizeof env_store, "TOPOS_STORE=%s", d.store);
  built("topos", bin, sizeof bin);
  const char *env[] = {env_store, NULL};
  const char *add[] = {bin,       "tenant",       "add", "ops",
                       "--admin", "--with-token", NULL};
  char *out = NULL;
  ck_assert_msg(exited_ok(run_capture(add, env, &out)), "%s", out);
  free(out);
  start_with(&d, cf.cmd, NULL, NULL);
  if (cf.healthcheck) {
    const char *argv[32];
    int argc = 0;
    char server[64];
    snprintf(server, sizeof server, "127.0.0.1:%d", d.port);
    const char *prev = "";
    for (const cJSON *a = cf.healthcheck->child; a && argc < 31; a = a->next) {
      /* The built topos, and --server at the live daemon. */
      const char *word = a->valuestring;
      if (argc == 0) word = bin;
      if (strcmp(prev, "--server") == 0) word = server;
      argv[argc++] = word;
      prev = a->valuestring;
    }
    argv[argc] = NULL;
    int status = run_capture(argv, NULL, &out);
    ck_assert_msg(exited_ok(status),
                  "HEALTHCHECK fails against CMD's daemon: %s",
                  tail(out, 1500));
    free(out);
  }
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);

  /* A daemon starts on deploy/toposd.json (at its own host, port 0). */
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  const char *listen = str_of(config, "listen");
  const char *http = str_of(config, "http");
  char listen0[300], http0[300];
  snprintf(listen0, sizeof listen0, "%.*s:0",
           (int)(strrchr(listen ? listen : "127.0.0.1:1", ':') -
                 (listen ? listen : "127.0.0.1:1")),
           listen ? listen : "127.0.0.1:1");
  snprintf(http0, sizeof http0, "%.*s:0",
           (int)(strrchr(http ? http : "127.0.0.1:1", ':') -
                 (http ? http : "127.0.0.1:1")),
           http ? http : "127.0.0.1:1");
  if (http && strcmp(http, "off") == 0) snprintf(http0, sizeof http0, "off");
  cJSON *cargs = cJSON_CreateArray();
  cJSON_AddItemToArray(cargs, cJSON_CreateString("--config"));
  cJSON_AddItemToArray(cargs, cJSON_CreateString(json_path));
  const char *append[] = {"--listen", listen0, "--http", http0,
                          "--store",  d.store, NULL};
  start_with(&d, cargs, append, NULL);
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
  cJSON_Delete(cargs);
  cJSON_Delete(config);
  unit_free(&u);
  containerfile_free(&cf);
  cJSON_Delete(toposd);
  cJSON_Delete(topos);
}
END_TEST

/* ------------------------------------------------------------- systemd */

/* systemd-analyze's exposure level of a unit file (0 to 10), from its
 * "Overall exposure level" line; --threshold=30 must pass with it. */
static double exposure(const char *path) {
  const char *argv[] = {"systemd-analyze", "security", "--offline=true",
                        "--threshold=30",  path,       NULL};
  char *out = NULL;
  int status = run_capture(argv, NULL, &out);
  const char *line = strstr(out, "Overall exposure level for ");
  ck_assert_msg(line != NULL, "systemd-analyze security printed no rating: %s",
                tail(out, 1500));
  const char *colon = strchr(line, ':');
  ck_assert_ptr_nonnull(colon);
  double level = atof(colon + 1);
  ck_assert_msg(level > 3.0 || exited_ok(status),
                "systemd-analyze security --threshold=30 %s failed: %s", path,
                tail(out, 1500));
  free(out);
  return level;
}

/* A copy of the unit at `copy` whose ExecStart runs the built toposd
 * (systemd-analyze verify checks that the program exists). */
static void unit_copy(const char *path, const char *copy) {
  char bin[PATH_MAX];
  built("toposd", bin, sizeof bin);
  char *text = read_text(path);
  FILE *f = fopen(copy, "w");
  ck_assert_ptr_nonnull(f);
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    if (strncmp(line, "ExecStart=", 10) == 0) {
      char *prog = line + 10;
      size_t n = strcspn(prog, " \t");
      fprintf(f, "ExecStart=%s%s\n", bin, prog + n);
    } else {
      fprintf(f, "%s\n", line);
    }
    line = nl ? nl + 1 : NULL;
  }
  fclose(f);
  free(text);
}

START_TEST(test_deploy_unit_security) {
  if (!have_program("systemd-analyze")) {
    printf("deploy: systemd-analyze not installed: unit exposure not rated\n");
    return;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/toposd.service", deploy_dir());
  double level = exposure(path);
  ck_assert_msg(level <= 3.0,
                "systemd-analyze rates %s %.1f (more than 3.0): see "
                "`systemd-analyze security --offline=true %s`",
                path, level, path);
}
END_TEST

START_TEST(test_deploy_unit_verify) {
  unit u;
  unit_load(&u);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/toposd.service", deploy_dir());
  /* What the daemon does (sd_notify, the drain) and the unit asks for. */
  const char *type = str_of(u.service, "Type");
  ck_assert_msg(type && strcmp(type, "notify") == 0, "%s: Type is not notify",
                path);
  const char *notify_access = str_of(u.service, "NotifyAccess");
  ck_assert_msg(notify_access && strcmp(notify_access, "main") == 0,
                "%s: NotifyAccess is not main", path);
  const char *watchdog = str_of(u.service, "WatchdogSec");
  ck_assert_msg(watchdog && atof(watchdog) > 0, "%s: no WatchdogSec", path);
  /* It reads deploy/toposd.json, whose store is in its StateDirectory and
   * whose grace fits in TimeoutStopSec. */
  const char *config_path = flag_value(u.exec, "--config");
  ck_assert_msg(config_path && basename_is(config_path, "toposd.json"),
                "%s: ExecStart does not read toposd.json", path);
  char json_path[PATH_MAX];
  snprintf(json_path, sizeof json_path, "%s/toposd.json", deploy_dir());
  char *text = read_text(json_path);
  cJSON *config = cJSON_Parse(text);
  free(text);
  ck_assert_ptr_nonnull(config);
  const char *state = str_of(u.service, "StateDirectory");
  const char *store = str_of(config, "store");
  char state_dir[300];
  snprintf(state_dir, sizeof state_dir, "/var/lib/%s/", state ? state : "?");
  ck_assert_msg(store && strncmp(store, state_dir, strlen(state_dir)) == 0,
                "%s: store %s is not in the unit's StateDirectory %s (the only "
                "place it may write)",
                json_path, store ? store : "(default)", state_dir);
  const cJSON *grace = cJSON_GetObjectItemCaseSensitive(config, "grace_ms");
  double grace_s = cJSON_IsNumber(grace) ? grace->valuedouble / 1000 : 5;
  const char *stop = str_of(u.service, "TimeoutStopSec");
  double stop_s = stop ? atof(stop) : 90;
  ck_assert_msg(stop_s >= grace_s + 5,
                "%s: TimeoutStopSec %.0f is less than grace_ms %.0f s + 5 s",
                path, stop_s, grace_s);
  cJSON_Delete(config);
  unit_free(&u);

  if (!have_program("systemd-analyze")) {
    printf("deploy: systemd-analyze not installed: unit not verified\n");
    return;
  }
  /* verify wants ExecStart's program to exist: a copy of the unit that
   * runs the built toposd; then the same with the GPU drop-in beside it
   * (toposd.service.d/gpu.conf), which must verify and rate as well. */
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char gpu[PATH_MAX];
  snprintf(gpu, sizeof gpu, "%s/toposd-gpu.conf", deploy_dir());
  bool has_gpu = access(gpu, R_OK) == 0;
  for (int with_gpu = 0; with_gpu <= (has_gpu ? 1 : 0); with_gpu++) {
    char dir[400], copy[450];
    snprintf(dir, sizeof dir, "%s/%s", d.dir, with_gpu ? "gpu" : "plain");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(copy, sizeof copy, "%s/toposd.service", dir);
    unit_copy(path, copy);
    const char *what = path;
    if (with_gpu) {
      char dropin[500];
      snprintf(dropin, sizeof dropin, "%s/toposd.service.d", dir);
      ck_assert_int_eq(mkdir(dropin, 0700), 0);
      snprintf(dropin, sizeof dropin, "%s/toposd.service.d/gpu.conf", dir);
      char *conf = read_text(gpu);
      FILE *f = fopen(dropin, "w");
      ck_assert_ptr_nonnull(f);
      fputs(conf, f);
      fclose(f);
      free(conf);
      what = gpu;
    }
    const char *argv[] = {"systemd-analyze", "verify", copy, NULL};
    char *out = NULL;
    int status = run_capture(argv, NULL, &out);
    ck_assert_msg(exited_ok(status) && out[0] == '\0',
                  "systemd-analyze verify %s (ExecStart: the built toposd): %s",
                  what, tail(out, 1500));
    free(out);
    if (with_gpu) {
      double level = exposure(copy);
      ck_assert_msg(level <= 3.0,
                    "systemd-analyze rates the unit with %s %.1f (more than "
                    "3.0)",
                    gpu, level);
    }
  }
  daemon_cleanup(&d);
}
END_TEST

START_TEST(test_deploy_unit_notify) {
  /* Type=notify, NotifyAccess=main, WatchdogSec: toposd sends READY=1
   * from its main process once it serves, and WATCHDOG=1 at least every
   * $WATCHDOG_USEC/2 while it runs, as systemd will expect. */
  daemon_proc d;
  memset(&d, 0, sizeof d);
  daemon_dir(&d);
  char sock_path[400];
  snprintf(sock_path, sizeof sock_path, "%s/notify", d.dir);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(sock_path), sizeof a.sun_path);
  strcpy(a.sun_path, sock_path);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  int one = 1;
  ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one),
                   0);
  static char env_sock[500];
  snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", sock_path);
  const char *env[] = {env_sock, "WATCHDOG_USEC=1000000", NULL};
  cJSON *args = cJSON_CreateArray();
  const char *flags[] = {"--listen",    "127.0.0.1:0", "--http",
                         "127.0.0.1:0", "--store",     "x"};
  for (int i = 0; i < 6; i++)
    cJSON_AddItemToArray(args, cJSON_CreateString(flags[i]));
  start_with(&d, args, NULL, env);
  cJSON_Delete(args);

  /* Every datagram until both are seen (or 10 s pass). */
  bool ready = false;
  int pings = 0;
  double until = now_s() + 10, first_ping = 0, last_ping = 0;
  char seen[2048] = "";
  while ((!ready || pings < 3) && now_s() < until) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[1024];
    union {
      struct cmsghdr h;
      char space[CMSG_SPACE(sizeof(struct ucred))];
    } control;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = &control,
                       .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &m, 0);
    if (n <= 0) continue;
    buf[n] = '\0';
    pid_t from = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
        from = ((struct ucred *)(void *)CMSG_DATA(c))->pid;
    ck_assert_msg(from == d.pid,
                  "a notification from pid %d, not toposd's %d (NotifyAccess="
                  "main would drop it): %s",
                  (int)from, (int)d.pid, buf);
    size_t used = strlen(seen);
    snprintf(seen + used, sizeof seen - used, "[%s] ", buf);
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
      if (strcmp(line, "READY=1") == 0) ready = true;
      if (strcmp(line, "WATCHDOG=1") == 0) {
        if (pings == 0) first_ping = now_s();
        last_ping = now_s();
        pings++;
      }
    }
  }
  close(fd);
  ck_assert_msg(ready, "no READY=1 from toposd within 10 s (got: %s)", seen);
  ck_assert_msg(pings >= 3,
                "%d WATCHDOG=1 in 10 s with WATCHDOG_USEC=1000000 (got: %s)",
                pings, seen);
  ck_assert_msg((last_ping - first_ping) / (pings - 1) <= 0.6,
                "WATCHDOG=1 every %.2f s: more than half of WATCHDOG_USEC",
                (last_ping - first_ping) / (pings - 1));
  /* READY=1 meant serving. */
  grpc_init();
  ck_assert_int_eq(health_check(d.port, ""), SERVING);
  grpc_shutdown();
  assert_clean_exit(daemon_stop(&d, SIGTERM, 30), 30);
  daemon_cleanup(&d);
}
END_TEST

Suite *deploy_suite(void) {
  Suite *s = suite_create("deploy");
  TCase *files = tcase_create("files");
  tcase_set_timeout(files, 120);
  tcase_add_test(files, test_deploy_yaml_parses);
  tcase_add_test(files, test_deploy_flags);
  tcase_add_test(files, test_deploy_unit_security);
  tcase_add_test(files, test_deploy_unit_verify);
  suite_add_tcase(s, files);
  TCase *live = tcase_create("live");
  tcase_set_timeout(live, 180);
  tcase_add_test(live, test_deploy_probes);
  tcase_add_test(live, test_deploy_init_seeds);
  tcase_add_test(live, test_deploy_probes_drain);
  tcase_add_test(live, test_deploy_unit_notify);
  suite_add_tcase(s, live);
  return s;
}
