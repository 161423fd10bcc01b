/*
 * names.h - the makemore data set: one name per line, characters a-z
 * (case folded; anything else is dropped), split into train, dev and test
 * sets by a seeded shuffle (80/10/10, as makemore splits it).  Index 0 is
 * '.', which pads the start of a context and ends a name; a-z are 1..26.
 */
#ifndef TOPOS_EX_NAMES_H
#define TOPOS_EX_NAMES_H

#include <stdint.h>

#include "ex.h"
#include "topos.h"

enum { EX_NAMES_VOCAB = 27, EX_NAMES_MAX_LEN = 64 };

typedef enum ex_split { EX_TRAIN = 0, EX_DEV = 1, EX_TEST = 2 } ex_split;

typedef struct ex_names {
  char **words;    /* every name, in shuffled order */
  int64_t n;       /* how many */
  int64_t end[3];  /* split s is words[s ? end[s-1] : 0 .. end[s]) */
  int max_len;     /* the longest name */
  int64_t dropped; /* characters dropped (not a-z) */
} ex_names;

/* Reads path (one name per line; empty lines skipped; a name longer than
 * EX_NAMES_MAX_LEN is refused) and splits it with `seed`.  0, or a
 * topos_status with err. */
int ex_names_load(const char *path, uint64_t seed, ex_names *out,
                  topos_error *err);
void ex_names_free(ex_names *d);
/* The split's range of words. */
void ex_names_range(const ex_names *d, ex_split s, int64_t *begin,
                    int64_t *end);
/* Every (context, next) pair of the split's names: for each character of
 * each name and once more for its end, the `context` indices before it
 * (0-padded) in x[i*context ..] and the index in y[i].  New arrays (free). */
int ex_names_windows(const ex_names *d, ex_split s, int context, int32_t **x,
                     int32_t **y, int64_t *n, topos_error *err);
int ex_names_index(int c);             /* a-z/A-Z -> 1..26, '.' -> 0, else -1 */
char ex_names_char(int index);         /* 0 -> '.', 1..26 -> a..z, else '?' */
const char *ex_split_name(ex_split s); /* "train", "dev", "test" */

/*
 * The makemore programs' start: reads the common flags (ex_arg) and
 * `--steps N` (*steps holds the default), finds the names file
 * (--data, else examples/makemore/names.txt wherever the program runs
 * from) and loads it split with `seed`.  Returns 0 to go on, else the
 * exit status (2 for a usage error, 1 for the data) with the message
 * printed; *d is loaded only on 0.
 */
int ex_names_main(ex_args *a, int argc, char **argv, int64_t *steps,
                  uint64_t seed, ex_names *d, char *path, size_t path_cap);

/*
 * Scores a window model over n (context, next) pairs: `ev` evaluates
 * logits [batch, 27] from the input `x` ([batch] when xrank is 1, else
 * [batch, context]); the pairs go through in batches, the last one padded
 * and only its real rows counted.  *loss is the mean cross entropy,
 * *accuracy the fraction predicted (either may be NULL).
 */
int ex_names_score(ex_eval *ev, topos_value x, int xrank, int context,
                   int64_t batch, const int32_t *xs, const int32_t *ys,
                   int64_t n, double *loss, double *accuracy, topos_error *err);
/*
 * Samples `count` names at once from a window model: `ev` evaluates
 * logits [count, 27] from `x` as above; every name starts from an all-'.'
 * context and ends at '.' (or EX_NAMES_MAX_LEN characters).  Prints them
 * one per line, indented.  Returns a topos_status.
 */
int ex_names_sample(ex_eval *ev, topos_value x, int xrank, int context,
                    int count, uint64_t seed, topos_error *err);

#endif /* TOPOS_EX_NAMES_H */
