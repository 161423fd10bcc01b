/*
 * bpe.h - GPT-2's byte-level BPE tokenizer: OpenAI's encoder.py (the same
 * as Hugging Face's slow GPT2Tokenizer) in C, from the released
 * vocabulary (data/gpt2: encoder.json and vocab.bpe).
 *
 * Encoding splits the text with GPT-2's pre-tokenisation regex
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * matched by hand over the text read as UTF-8 (the character classes are
 * bpe_unicode.c's, generated from Unicode tables), then merges each
 * piece's BYTES by rank and reads the ids off encoder.json.
 *
 * Any bytes encode, not only valid UTF-8.  A byte that does not begin a
 * well-formed UTF-8 sequence (Unicode's table 3-7: no overlong forms, no
 * surrogates, nothing above U+10FFFF, no truncated sequence) reads as one
 * character of its own, of class "other" (not a letter, number or space),
 * exactly as Python's bytes.decode("utf-8", "surrogateescape") would hand
 * it to the regex.  The pieces are still cut from the original bytes, so
 * ex_bpe_decode(ex_bpe_encode(x)) == x for every byte string x.
 *
 * A loaded ex_bpe is immutable: encoding and decoding only read it (each
 * call keeps its own scratch space and cache), so one may be shared by
 * threads.
 */
#ifndef TOPOS_EX_BPE_H
#define TOPOS_EX_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "topos.h"

typedef struct ex_bpe ex_bpe;

/*
 * Loads dir/encoder.json (token string -> id) and dir/vocab.bpe (the
 * merges, in rank order after a "#version" line).  New, or NULL with err:
 * TOPOS_ERR_NOT_FOUND for a missing file, TOPOS_ERR_IO when one cannot be
 * read, TOPOS_ERR_CORRUPT for a malformed one (the message names the file
 * and, for vocab.bpe, the line).  Beyond the JSON syntax, encoder.json's ids
 * must be 0..n-1, each once, its strings distinct and in GPT-2's byte
 * alphabet, every single byte a token; every merge's two parts and their
 * concatenation must be tokens.
 */
ex_bpe *ex_bpe_load(const char *dir, topos_error *err);
void ex_bpe_free(ex_bpe *b);

/* The number of ids (50257 for GPT-2); -1 for NULL. */
int ex_bpe_vocab_size(const ex_bpe *b);

/*
 * Encodes len bytes of text (any bytes; text may be NULL when len is 0)
 * into ids.  On success *out is new (free()), never NULL, and *n is the
 * number of ids; returns 0.  Otherwise -1 with err (TOPOS_ERR_ARGUMENT,
 * TOPOS_ERR_MEMORY), *out NULL and *n 0.
 */
int ex_bpe_encode(const ex_bpe *b, const char *text, size_t len, int32_t **out,
                  size_t *n, topos_error *err);

/*
 * Decodes n ids into their bytes.  On success *out is new (free()),
 * NUL-terminated, and *len is its length without the NUL (the bytes may
 * hold NULs of their own); returns 0.  Otherwise -1 with err:
 * TOPOS_ERR_RANGE naming the first id outside [0, vocab), or
 * TOPOS_ERR_ARGUMENT / TOPOS_ERR_MEMORY; *out NULL and *len 0.
 */
int ex_bpe_decode(const ex_bpe *b, const int32_t *ids, size_t n, char **out,
                  size_t *len, topos_error *err);

/* ------------------------------------------------------- character classes */

/* A code point's class for the pre-tokenisation regex (bpe_unicode.c). */
typedef enum ex_bpe_class {
  EX_BPE_OTHER = 0,  /* [^\s\p{L}\p{N}] */
  EX_BPE_LETTER = 1, /* \p{L}: Lu Ll Lt Lm Lo */
  EX_BPE_NUMBER = 2, /* \p{N}: Nd Nl No */
  EX_BPE_SPACE = 3   /* \s: the White_Space property */
} ex_bpe_class;

ex_bpe_class ex_bpe_char_class(uint32_t cp);
/* The Unicode version the classes were generated from ("14.0.0"). */
extern const char ex_bpe_unicode_version[];

#endif
