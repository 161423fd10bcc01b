/*
 * names.c - the makemore data set (names.h).
 */
#include "names.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ex.h"

int ex_names_index(int c) {
  if (c >= 'a' && c <= 'z') return c - 'a' + 1;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 1;
  return c == '.' ? 0 : -1;
}

char ex_names_char(int index) {
  if (index == 0) return '.';
  return index >= 1 && index <= 26 ? (char)('a' + index - 1) : '?';
}

const char *ex_split_name(ex_split s) {
  static const char *const names[] = {"train", "dev", "test"};
  return s >= EX_TRAIN && s <= EX_TEST ? names[s] : "?";
}

void ex_names_free(ex_names *d) {
  if (d == NULL) return;
  for (int64_t i = 0; i < d->n; i++) free(d->words[i]);
  free(d->words);
  memset(d, 0, sizeof *d);
}

static int fail(topos_error *err, int code, const char *path, const char *what,
                long long line) {
  err->code = code;
  if (line > 0)
    snprintf(err->message, sizeof err->message, "%s:%lld: %s", path, line,
             what);
  else
    snprintf(err->message, sizeof err->message, "%s: %s", path, what);
  return code;
}

int ex_names_load(const char *path, uint64_t seed, ex_names *out,
                  topos_error *err) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return fail(err, errno == ENOENT ? TOPOS_ERR_NOT_FOUND : TOPOS_ERR_IO, path,
                strerror(errno), 0);
  char **words = NULL;
  int64_t n = 0, cap = 0, dropped = 0;
  int max_len = 0, rc = TOPOS_OK;
  char line[4096];
  long long lineno = 0;
  while (rc == TOPOS_OK && fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strcspn(line, "\r\n");
    if (line[len] == '\0' && !feof(f)) {
      rc = fail(err, TOPOS_ERR_CORRUPT, path, "line too long", lineno);
      break;
    }
    char word[EX_NAMES_MAX_LEN + 1];
    int w = 0;
    for (size_t i = 0; i < len && rc == TOPOS_OK; i++) {
      int c = ex_names_index((unsigned char)line[i]);
      if (c <= 0) {
        dropped++;
        continue;
      }
      if (w == EX_NAMES_MAX_LEN) {
        char msg[96];
        snprintf(msg, sizeof msg, "a name longer than %d characters",
                 EX_NAMES_MAX_LEN);
        rc = fail(err, TOPOS_ERR_CORRUPT, path, msg, lineno);
        break;
      }
      word[w++] = ex_names_char(c);
    }
    if (rc != TOPOS_OK || w == 0) continue;
    word[w] = '\0';
    if (n == cap) {
      int64_t ncap = cap ? cap * 2 : 1024;
      char **nw = realloc(words, sizeof *nw * (size_t)ncap);
      if (nw == NULL) {
        rc = fail(err, TOPOS_ERR_MEMORY, path, "out of memory", 0);
        break;
      }
      words = nw;
      cap = ncap;
    }
    words[n] = strdup(word);
    if (words[n] == NULL) {
      rc = fail(err, TOPOS_ERR_MEMORY, path, "out of memory", 0);
      break;
    }
    n++;
    if (w > max_len) max_len = w;
  }
  if (rc == TOPOS_OK && ferror(f))
    rc = fail(err, TOPOS_ERR_IO, path, "read error", 0);
  fclose(f);
  if (rc == TOPOS_OK && n < 3)
    rc = fail(err, TOPOS_ERR_CORRUPT, path,
              "fewer than 3 names: nothing to split", 0);
  int64_t *perm = rc == TOPOS_OK ? malloc(sizeof *perm * (size_t)n) : NULL;
  char **shuffled =
      rc == TOPOS_OK ? malloc(sizeof *shuffled * (size_t)n) : NULL;
  if (rc == TOPOS_OK && (perm == NULL || shuffled == NULL))
    rc = fail(err, TOPOS_ERR_MEMORY, path, "out of memory", 0);
  if (rc != TOPOS_OK) {
    for (int64_t i = 0; i < n; i++) free(words[i]);
    free(words);
    free(perm);
    free(shuffled);
    return rc;
  }
  ex_shuffle(perm, n, seed);
  for (int64_t i = 0; i < n; i++) shuffled[i] = words[perm[i]];
  free(words);
  free(perm);
  out->words = shuffled;
  out->n = n;
  out->end[0] = n * 8 / 10;
  out->end[1] = n * 9 / 10;
  out->end[2] = n;
  out->max_len = max_len;
  out->dropped = dropped;
  return TOPOS_OK;
}

void ex_names_range(const ex_names *d, ex_split s, int64_t *begin,
                    int64_t *end) {
  *begin = s == EX_TRAIN ? 0 : d->end[s - 1];
  *end = d->end[s];
}

int ex_names_windows(const ex_names *d, ex_split s, int context, int32_t **x,
                     int32_t **y, int64_t *n, topos_error *err) {
  if (context < 1 || context > EX_NAMES_MAX_LEN) {
    err->code = TOPOS_ERR_ARGUMENT;
    snprintf(err->message, sizeof err->message,
             "a context of %d characters (1..%d)", context, EX_NAMES_MAX_LEN);
    return TOPOS_ERR_ARGUMENT;
  }
  int64_t b, e, total = 0;
  ex_names_range(d, s, &b, &e);
  for (int64_t i = b; i < e; i++) total += (int64_t)strlen(d->words[i]) + 1;
  *x = malloc(sizeof(int32_t) * (size_t)(total * context + 1));
  *y = malloc(sizeof(int32_t) * (size_t)(total + 1));
  if (*x == NULL || *y == NULL) {
    free(*x);
    free(*y);
    *x = *y = NULL;
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "out of memory");
    return TOPOS_ERR_MEMORY;
  }
  int64_t k = 0;
  for (int64_t i = b; i < e; i++) {
    int32_t ctx[EX_NAMES_MAX_LEN + 1] = {0};
    const char *w = d->words[i];
    size_t len = strlen(w);
    for (size_t j = 0; j <= len; j++) {
      int32_t next = j < len ? ex_names_index((unsigned char)w[j]) : 0;
      memcpy(*x + k * context, ctx, sizeof(int32_t) * (size_t)context);
      (*y)[k++] = next;
      memmove(ctx, ctx + 1, sizeof(int32_t) * (size_t)(context - 1));
      ctx[context - 1] = next;
    }
  }
  *n = k;
  return TOPOS_OK;
}

/* A new i32 tensor of `batch` rows of `context` indices (or [batch]). */
static topos_tensor *index_tensor(const int32_t *v, int xrank, int context,
                                  int64_t batch, topos_error *err) {
  int64_t shape[2] = {batch, context};
  return topos_tensor_from(TOPOS_I32, xrank, shape, v, err);
}

int ex_names_score(ex_eval *ev, topos_value x, int xrank, int context,
                   int64_t batch, const int32_t *xs, const int32_t *ys,
                   int64_t n, double *loss, double *accuracy,
                   topos_error *err) {
  int32_t *bx = calloc((size_t)(batch * context), sizeof *bx);
  if (bx == NULL) {
    err->code = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "out of memory");
    return TOPOS_ERR_MEMORY;
  }
  double loss_sum = 0;
  int64_t correct = 0;
  int rc = TOPOS_OK;
  for (int64_t at = 0; at < n && rc == TOPOS_OK; at += batch) {
    int64_t rows = n - at < batch ? n - at : batch;
    memset(bx, 0, sizeof *bx * (size_t)(batch * context));
    memcpy(bx, xs + at * context, sizeof *bx * (size_t)(rows * context));
    topos_tensor *xt = index_tensor(bx, xrank, context, batch, err);
    if (xt == NULL) {
      rc = err->code;
      break;
    }
    topos_feed feed = {x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(ev, &feed, 1, &logits, err);
    if (rc == TOPOS_OK) ex_score(logits, ys + at, rows, &loss_sum, &correct);
    topos_tensor_release(logits);
    topos_tensor_release(xt);
  }
  free(bx);
  if (rc != TOPOS_OK) return rc;
  if (loss) *loss = loss_sum / (double)n;
  if (accuracy) *accuracy = (double)correct / (double)n;
  return TOPOS_OK;
}

int ex_names_sample(ex_eval *ev, topos_value x, int xrank, int context,
                    int count, uint64_t seed, topos_error *err) {
  int32_t *ctx = calloc((size_t)(count * context), sizeof *ctx);
  char(*out)[EX_NAMES_MAX_LEN + 1] = calloc((size_t)count, sizeof *out);
  float *lg = calloc((size_t)count * EX_NAMES_VOCAB, sizeof *lg);
  bool *done = calloc((size_t)count, sizeof *done);
  int rc = TOPOS_OK;
  if (ctx == NULL || out == NULL || lg == NULL || done == NULL) {
    err->code = rc = TOPOS_ERR_MEMORY;
    snprintf(err->message, sizeof err->message, "out of memory");
  }
  uint64_t rng = seed;
  int ndone = 0;
  for (int len = 0; rc == TOPOS_OK && ndone < count && len < EX_NAMES_MAX_LEN;
       len++) {
    topos_tensor *xt = index_tensor(ctx, xrank, context, count, err);
    if (xt == NULL) {
      rc = err->code;
      break;
    }
    topos_feed feed = {x, xt};
    topos_tensor *logits = NULL;
    rc = ex_eval_run(ev, &feed, 1, &logits, err);
    topos_tensor_release(xt);
    if (rc == TOPOS_OK)
      rc = topos_tensor_read(logits, lg,
                             sizeof *lg * (size_t)count * EX_NAMES_VOCAB, err);
    topos_tensor_release(logits);
    for (int i = 0; rc == TOPOS_OK && i < count; i++) {
      /* Every row draws, finished or not, so a name's characters do not
       * depend on when the others end. */
      int c = ex_sample_logits(lg + (size_t)i * EX_NAMES_VOCAB, EX_NAMES_VOCAB,
                               1.0, &rng);
      if (done[i]) continue;
      int32_t *row = ctx + (size_t)i * (size_t)context;
      memmove(row, row + 1, sizeof *row * (size_t)(context - 1));
      row[context - 1] = c;
      if (c == 0) {
        done[i] = true;
        ndone++;
      } else {
        out[i][len] = ex_names_char(c);
      }
    }
  }
  for (int i = 0; rc == TOPOS_OK && i < count; i++) printf("  %s\n", out[i]);
  free(ctx);
  free(out);
  free(lg);
  free(done);
  return rc;
}

int ex_names_main(ex_args *a, int argc, char **argv, int64_t *steps,
                  uint64_t seed, ex_names *d, char *path, size_t path_cap) {
  for (int i = 1; i < argc; i++) {
    int got = ex_arg(a, argc, argv, &i);
    if (got < 0) return 2;
    if (got > 0) continue;
    if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      if (ex_parse_count(a, "--steps", argv[++i], 1000000000, steps) != 0)
        return 2;
    } else {
      fprintf(stderr, "usage: %s [--steps N] [flags]\n%s", a->prog,
              ex_args_usage);
      return 2;
    }
  }
  if (ex_args_done(a) != 0) return 2;
  if (ex_find_data(a->data, "examples/makemore/names.txt", path, path_cap)) {
    fprintf(stderr, "%s: cannot read names from %s (give --data PATH)\n",
            a->prog, path);
    return 1;
  }
  topos_error err = {0};
  if (ex_names_load(path, seed, d, &err) != TOPOS_OK)
    return ex_fail(a, "reading names", &err);
  return 0;
}
