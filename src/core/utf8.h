/* src/core/utf8.h - the one UTF-8 check of libidem.
 *
 * Every store takes the same scopes, keys and message ids, and PostgreSQL
 * keeps them in text columns that take only well-formed UTF-8, so every
 * place that refuses an identity for its encoding (message ids in
 * src/core/dedup_id.c, the PostgreSQL store, in-transaction keys in
 * src/tx/tx.c) asks this one function and they cannot disagree.  Not
 * installed: internal to libidem.
 *
 * THREADING: no state; reentrant.
 */
#ifndef IDEM_CORE_UTF8_H
#define IDEM_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/** Whether the len bytes at s are well-formed UTF-8 (RFC 3629 section 4,
 * which is what PostgreSQL takes): no overlong form, no surrogate
 * (U+D800..U+DFFF), nothing above U+10FFFF, no sequence cut short by the
 * end.  A NUL byte is U+0000 and valid here; callers that hold C strings
 * pass strlen.  The empty string is valid. */
bool idem__utf8_valid(const void *s, size_t len);

/* The length (1-4) of the one well-formed UTF-8 sequence that starts s (n
 * bytes available), or 0 when none does: what idem__utf8_valid checks, one
 * sequence at a time (src/core/json.c reads strings with it). */
size_t idem__utf8_seq(const void *s, size_t n);

#endif /* IDEM_CORE_UTF8_H */
