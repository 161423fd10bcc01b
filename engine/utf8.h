/*
 * utf8.h - the one UTF-8 rule for every string topos stores: node names
 * (topos_name, the canonical decoding) and every string field of a
 * daemon request (proto/wire.c's wire_check_strings).  proto3 `string`
 * fields must hold UTF-8, so a name that passed this check can go back
 * out in any reply and parse in every standard client.
 *
 * Internal to the engine and the layers above it (wire.c); not part of
 * topos.h, and not installed.  Exported (TOPOS_API) because the client
 * library links the engine's shared library and checks with it.
 */
#ifndef TOPOS_UTF8_H
#define TOPOS_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "topos.h" /* TOPOS_API */

/*
 * Checks the n bytes at s (NULL with n == 0 is the empty string): valid
 * when they are well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates U+D800..U+DFFF, nothing above U+10FFFF, no sequence cut
 * short) and hold no NUL byte.  Returns true when valid; otherwise false
 * with *at the offset of the first offending byte and *why a static
 * phrase for messages, either "contains NUL" or "not valid UTF-8 (...)"
 * with the fault in the parentheses ("an overlong encoding", "a
 * surrogate", "above U+10FFFF", "a truncated sequence", "a stray
 * continuation byte", "byte 0xff cannot start a character").  Either
 * out-pointer may be NULL.
 */
TOPOS_API bool topos_utf8_check(const char *s, size_t n, size_t *at,
                                const char **why);

#endif /* TOPOS_UTF8_H */
