/*
 * ex.h - what the training examples share: the common flags, where steps
 * and evaluations run (in-process or on a daemon), checkpoints, finding
 * data files, progress on a terminal, metrics as CSV, and a seeded
 * generator.  Each example keeps its model, data and loop; this is the
 * plumbing that would otherwise be written once per example.
 *
 * Nothing here holds training state between calls: parameters and
 * optimizer state stay the example's (caller-owned values), so the same
 * loop gives the same bits locally and against toposd.
 */
#ifndef TOPOS_EX_H
#define TOPOS_EX_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "topos.h"

/* ------------------------------------------------------------------ flags */

/* The flags every training example takes.  Zero-initialise, call ex_arg
 * for each argument the example does not know itself, then ex_args_done. */
typedef struct ex_args {
  const char *prog;      /* for messages: the example's name */
  const char *server;    /* --server ADDRESS, else $TOPOS_SERVER, else NULL */
  topos_exec exec;       /* --backend NAME, --fast, --threads N */
  const char *save;      /* --save FILE: a checkpoint at the end */
  const char *save_spec; /* --save-spec FILE: the training network's
                            canonical encoding (`topos record FILE`) */
  const char *resume;    /* --resume FILE: start from a checkpoint */
  const char *metrics;   /* --metrics FILE: CSV rows (ex_metrics) */
  const char *data;      /* --data PATH: where the data set is */
  int64_t stop_at;       /* --stop-at K: stop after step K as if interrupted
                            (0: run to the end); with --save, the checkpoint a
                            later --resume continues from */
  bool no_progress;      /* --no-progress */
} ex_args;

/* The usage text of the common flags (one line per flag, indented). */
extern const char ex_args_usage[];

/*
 * Reads the common flag at argv[*i] (advancing *i past its value).
 * Returns 1 when it was one, 0 when it is not a common flag (the example
 * decides), -1 when it is one but malformed (the message is printed).
 */
int ex_arg(ex_args *a, int argc, char **argv, int *i);
/* Writes net's canonical encoding (topos_network_encode) to path: what
 * `topos record FILE` stores.  --save-spec does it through the session
 * (ex_trainer, ex_eval_new). */
int ex_save_spec(const char *path, const topos_network *net, topos_error *err);
/* Fills what the flags left unset ($TOPOS_SERVER); 0, or -1 with a message. */
int ex_args_done(ex_args *a);

/* Parses a whole positive integer flag value; -1 with a message if not. */
int ex_parse_count(const ex_args *a, const char *flag, const char *text,
                   int64_t max, int64_t *out);

/* ------------------------------------------------------------- data files */

/*
 * Finds a data file or directory: `given` (a flag's value) as it is when
 * not NULL; otherwise `rel`, a path relative to the source tree, looked up
 * under $TOPOS_DATA_ROOT, the current directory, the tree the example was
 * built from, and two levels above the executable (build/examples/x).
 * Writes the first that exists to out; 0, or -1 (out holds `rel`).
 */
int ex_find_data(const char *given, const char *rel, char *out, size_t cap);

/* ---------------------------------------------------------------- session */

/* Where steps and evaluations run: in-process, or on a toposd daemon. */
typedef struct ex_session ex_session;

/* A session for the flags: connects to a->server when set.  NULL with err. */
ex_session *ex_session_open(const ex_args *a, topos_error *err);
void ex_session_close(ex_session *s);
bool ex_session_remote(const ex_session *s);
/* "local" or "remote ADDRESS", for the examples' first lines. */
const char *ex_session_where(const ex_session *s);

/* A trainer for net's rank-0 `loss`: the training plan lowered here, or
 * the network recorded on the daemon and stepped there (the session's
 * exec either way).  Borrowing the session, which must outlive it. */
topos_trainer *ex_trainer(ex_session *s, const topos_network *net,
                          topos_value loss, topos_error *err);

/*
 * An evaluator: the forward values `roots` of net for given parameters
 * and feeds, locally (a forward plan lowered once) or on the daemon (the
 * parameters uploaded once per ex_eval_params as a blob, so each batch
 * sends only its feeds).  Bits equal either way.
 */
typedef struct ex_eval ex_eval;
ex_eval *ex_eval_new(ex_session *s, const topos_network *net,
                     const topos_value *roots, int nroots, topos_error *err);
void ex_eval_free(ex_eval *e);
/* The parameters the following runs use (borrowed until the next call or
 * ex_eval_free; NULL: the network's initials).  Returns a topos_status. */
int ex_eval_params(ex_eval *e, const topos_params *params, topos_error *err);
/* Runs: out[0..nroots) become new tensors (release each).  Returns a
 * topos_status; on failure out is all NULL. */
int ex_eval_run(ex_eval *e, const topos_feed *feeds, int nfeeds,
                topos_tensor **out, topos_error *err);

/* ------------------------------------------------------------ checkpoints */

/*
 * A checkpoint is one safetensors file (docs/checkpoints.md): each
 * parameter under its name in the network ("param.<slot>" when unnamed),
 * the optimizer state as "optimizer.m.<name>" and "optimizer.v.<name>"
 * where it has moments, the optimizer's step as "optimizer.step" and the
 * training loop's position as "train.step" (each I32[2], low and high
 * halves of an int64).  Loading checks every name, dtype and shape
 * against the network, so a checkpoint of another model is refused with
 * the first disagreement named.
 */
int ex_checkpoint_save(const char *path, const topos_network *net,
                       const topos_params *params, const topos_opt_state *state,
                       int64_t step, topos_error *err);
/* *params, *state (NULL when the file holds none: a fresh state) and
 * *step are new on success.  Returns a topos_status. */
int ex_checkpoint_load(const char *path, const topos_network *net,
                       topos_params **params, topos_opt_state **state,
                       int64_t *step, topos_error *err);

/* ------------------------------------------------------------ the loop */

enum { EX_MAX_FEEDS = 8 };

/*
 * A training loop, written once: resume from a checkpoint, step the
 * trainer `steps` times (stopping early at --stop-at), show progress, and
 * save a checkpoint at the end.  Each step's minibatch and learning rate
 * are pure functions of the step index (the example's callbacks), so a
 * resumed run gives the same bits as an uninterrupted one.
 */
typedef struct ex_loop {
  /* Set by the example. */
  const ex_args *args;
  ex_session *session;
  const topos_network *net;
  topos_value loss;
  topos_optimizer opt; /* its lr is lr(step) when lr is set */
  int64_t steps;       /* the whole run (the schedule's horizon) */
  const char *unit;    /* progress unit, "steps" by default */
  void *ctx;           /* the callbacks' */
  double (*lr)(int64_t step, void *ctx);
  /* Fills feeds[0..*nfeeds) for `step` with new tensors (the loop
   * releases them).  Returns a topos_status. */
  int (*batch)(int64_t step, topos_feed *feeds, int *nfeeds, void *ctx,
               topos_error *err);
  /* After step `step` (1-based count of steps done) with the new
   * parameters and the step's loss: where the example evaluates and
   * prints.  NULL: nothing.  Returns a topos_status. */
  int (*after)(int64_t step, const topos_params *params, double loss, void *ctx,
               topos_error *err);
  /* Out: where the run stopped, owned by the loop until ex_loop_clear. */
  int64_t step;         /* steps done (== steps unless --stop-at) */
  topos_params *params; /* NULL: never stepped (the initials) */
  topos_opt_state *state;
  double seconds; /* time spent stepping */
  bool stopped;   /* --stop-at ended it early */
} ex_loop;

int ex_loop_run(ex_loop *l, topos_error *err);
void ex_loop_clear(ex_loop *l);

/* --------------------------------------------------------------- progress */

/*
 * Progress through `total` units: on a terminal (stderr is a TTY) a bar
 * redrawn in place with the rate and the time left; otherwise a plain
 * line at every tenth.  Disabled (silent) when `on` is false.
 */
typedef struct ex_progress {
  const char *label, *unit;
  int64_t total, done;
  double t0, last_draw;
  int last_tenth;
  bool tty, on, drawn;
} ex_progress;

void ex_progress_start(ex_progress *p, bool on, const char *label,
                       const char *unit, int64_t total);
/* done units so far; `note` (may be NULL) is shown after the bar. */
void ex_progress_update(ex_progress *p, int64_t done, const char *note);
/* Clears the bar (a terminal) so the example's next line starts clean. */
void ex_progress_end(ex_progress *p);

/* ---------------------------------------------------------------- metrics */

/*
 * Metrics as CSV, one schema for every example so one script plots them
 * (tools/plot_metrics.sh): step,epoch,split,loss,accuracy,seconds.  An
 * unknown value is written empty (pass NAN).  ex_metrics_open(NULL) gives
 * a sink that writes nothing, so examples call ex_metrics_row
 * unconditionally.
 */
typedef struct ex_metrics ex_metrics;
ex_metrics *ex_metrics_open(const char *path, topos_error *err);
/* Appends one row and flushes it (a crash keeps what was measured). */
void ex_metrics_row(ex_metrics *m, int64_t step, double epoch,
                    const char *split, double loss, double accuracy,
                    double seconds);
int ex_metrics_close(ex_metrics *m, topos_error *err);

/* ------------------------------------------------------------ randomness */

/* splitmix64: the examples' own generator (data order, sampling),
 * independent of the engine's initialisers. */
uint64_t ex_rand_u64(uint64_t *state);
/* Uniform in [0, 1) with 53 random bits. */
double ex_rand_unit(uint64_t *state);
/* A uniform integer in [0, n), unbiased (n > 0). */
uint64_t ex_rand_below(uint64_t *state, uint64_t n);
/* perm becomes a seeded Fisher-Yates shuffle of 0..n-1. */
void ex_shuffle(int64_t *perm, int64_t n, uint64_t seed);
/* Draws an index from softmax(logits / temperature) over n logits
 * (temperature > 0; computed in double).  The largest when temperature is
 * 0 (greedy). */
int ex_sample_logits(const float *logits, int n, double temperature,
                     uint64_t *state);

/* ------------------------------------------------------------------ misc */

double ex_now_s(void); /* monotonic seconds */
/* Prints "<prog>: <what>: <message>" to stderr and returns 1. */
int ex_fail(const ex_args *a, const char *what, const topos_error *err);
/* Scores the first n rows of logits [.., k] (f32) against labels: adds
 * their cross entropies (computed in double) to *loss_sum and the rows
 * whose largest logit is the label to *correct.  NULL pointers are
 * skipped; a tensor that cannot be read makes *loss_sum NaN. */
void ex_score(const topos_tensor *logits, const int32_t *labels, int64_t n,
              double *loss_sum, int64_t *correct);

#endif /* TOPOS_EX_H */
