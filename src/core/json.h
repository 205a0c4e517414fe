/* src/core/json.h - canonical JSON for fingerprints, inside libidem.
 *
 * The parser and the canonical writer behind idem_json_canonicalize and the
 * 'J' frame of idem_fingerprint (include/idem/fingerprint.h).  The design,
 * the canonical form and the limits are described at the top of
 * src/core/json.c.  Not installed: the public face is fingerprint.h.
 *
 * THREADING: a document is immutable once parsed; any thread may emit it,
 * one thread destroys it.
 */
#ifndef IDEM_CORE_JSON_H
#define IDEM_CORE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"

/* The longest text taken as JSON: offsets into it are 32-bit. */
#define IDEM__JSON_MAX_LEN ((size_t)UINT32_MAX - 1)

/* The largest |x| of a nonzero number written d.ddd x 10^x (so 1e5 has
 * x = 5 and 0.01 has x = -2); beyond it the text is not JSON here. */
#define IDEM__JSON_MAX_EXP INT64_C(999999999999999999)

typedef struct idem__json idem__json_t;

/** Parse text (RFC 8259, strictly; see json.c for what is refused) and
 * resolve the JSON pointers in ignore against it.
 * @param[in]  text  len bytes, not copied: it must outlive *out.
 * @param[in]  ignore, n_ignore  pointers, not retained; malformed ones, ""
 *                   and those naming nothing are skipped.
 * @param[out] out   the document, destroyed with idem__json_destroy; NULL
 *                   on failure.
 * @return IDEM_OK, IDEM_E_INVAL (not JSON, or text NULL or empty),
 *         IDEM_E_NOMEM. */
idem_err_t idem__json_parse(const char *text, size_t len, const char *const *ignore,
                            size_t n_ignore, idem__json_t **out);

/** The length of the canonical form in bytes (known after the parse). */
size_t idem__json_canonical_len(const idem__json_t *doc);

/** The bytes the parse of doc allocated (its tables, and the bitmap it has
 * freed already), for tests of the memory bound. */
size_t idem__json_memory(const idem__json_t *doc);

/* Receives the canonical form piece by piece, in order; returns nonzero to
 * go on, 0 to stop (emitting then fails). */
typedef int (*idem__json_sink_fn)(void *arg, const void *data, size_t len);

/** Write the canonical form of doc to sink in pieces of at most a few KiB,
 * idem__json_canonical_len(doc) bytes in all.  Allocates nothing.
 * @return 1, or 0 when the sink stopped it. */
int idem__json_emit(const idem__json_t *doc, idem__json_sink_fn sink, void *arg);

/** What a value is (idem__json_find, idem__json_type). */
typedef enum idem__json_type {
    IDEM__JSON_NONE = 0, /* idem__json_find: the pointer names nothing (or is malformed) */
    IDEM__JSON_OBJECT,
    IDEM__JSON_ARRAY,
    IDEM__JSON_STRING,
    IDEM__JSON_NUMBER,
    IDEM__JSON_TRUE,
    IDEM__JSON_FALSE,
    IDEM__JSON_NULL,
} idem__json_type_t;

/** Look up the value an RFC 6901 pointer names in doc, as received (the
 * parse's fingerprint_ignore pointers drop nothing here): "/a/b" is member
 * b of member a, ~1 and ~0 stand for / and ~ in a token, a token on an
 * array is an index (no leading zero; "-" names nothing), "" is the whole
 * document.  A document has no two members of one key (the parse refuses
 * them), so a member is never ambiguous.  Reads each byte of the text at
 * most once; allocates nothing.
 * @param[out] off, len  the value's text: doc's text[*off .. *off + *len)
 *                       (0 and 0 for NONE).
 * @return its kind, or IDEM__JSON_NONE. */
idem__json_type_t idem__json_find(const idem__json_t *doc, const char *pointer, size_t *off,
                                  size_t *len);

/* The decoded bytes of a string value found so: idem__json_string below. */

void idem__json_destroy(idem__json_t *doc); /* NULL is a no-op */

/* ---- reading values (src/core/jwt.c reads JWT headers, claims and JWKS) ----
 * A value is named by its offset in the text; every offset handed out
 * points at a value the parse checked.  An object never holds two members
 * of one key (the parse refuses them), so a lookup is never ambiguous. */


/** The offset of the top-level value. */
size_t idem__json_root(const idem__json_t *doc);

/** The type of the value at offset at. */
idem__json_type_t idem__json_type(const idem__json_t *doc, size_t at);

/** The value of the member of the object at obj whose decoded key is the
 * klen bytes at key.  @return 0 and *val, or -1 (obj is not an object, or
 * it has no such member). */
int idem__json_member(const idem__json_t *doc, size_t obj, const char *key, size_t klen,
                      size_t *val);

/** Step through the array at arr: *cursor 0 the first time; each call
 * gives the next element in *val.  @return 0, or -1 past the last (or when
 * arr is not an array). */
int idem__json_next(const idem__json_t *doc, size_t arr, size_t *cursor, size_t *val);

/** The decoded bytes (UTF-8, escapes resolved, "\u0000" a NUL byte) of the
 * string at at, into buf (cap bytes; NUL-terminated when room is left).
 * @return IDEM_OK, IDEM_E_INVAL (not a string), IDEM_E_TOOBIG (more than
 *         cap bytes; *len is then 0). */
idem_err_t idem__json_string(const idem__json_t *doc, size_t at, char *buf, size_t cap,
                             size_t *len);

/** The number at at as an int64 when it is written as one: an optional '-'
 * and digits, no fraction, no exponent, within the range; *text and *tlen
 * give its characters.  @return 0, or -1. */
int idem__json_int(const idem__json_t *doc, size_t at, int64_t *v, const char **text,
                   size_t *tlen);

/** The integer part of the number at at (a fraction is cut off, so 10.9
 * is 10 and -0.5 is 0), for NumericDate claims; a number written with an
 * exponent, or outside int64, is refused.  @return 0, or -1. */
int idem__json_int_trunc(const idem__json_t *doc, size_t at, int64_t *v);

#endif /* IDEM_CORE_JSON_H */
