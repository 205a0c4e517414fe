/* include/idem/fingerprint.h - what makes two requests "the same request".
 *
 * SHA-256 over the method, the target (path and query), the selected
 * request headers and the body, each framed with its length so that no two
 * different inputs hash the same byte stream.  With json body mode the body
 * is first reduced to canonical JSON (sorted object keys, no insignificant
 * white space, one spelling per string and per number, the members named by
 * JSON pointers removed); a body that is not valid JSON is hashed raw.
 * Numbers are exact decimals, never binary floats: 1, 1.0 and 1e0 are one
 * number, 9007199254740993.0 and 9007199254740992.0 two.
 */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"

#define IDEM_FP_LEN 32
#define IDEM_JSON_MAX_DEPTH 64 /* nested arrays/objects; deeper is not JSON here */

typedef struct idem_fp_header {
    const char *name; /* lowercase or not: names are compared and hashed lowercased */
    size_t name_len;
    const char *value; /* NULL when the request does not carry the header */
    size_t value_len;
} idem_fp_header_t;

typedef struct idem_fp_input {
    const char *method;
    size_t method_len;
    const char *target; /* path with query string, as received */
    size_t target_len;
    const idem_fp_header_t *headers; /* in the configured order */
    size_t n_headers;
    const uint8_t *body;
    size_t body_len;
    int body_json;              /* nonzero: canonicalise the body as JSON */
    const char *const *ignore;  /* JSON pointers to drop, with body_json */
    size_t n_ignore;
} idem_fp_input_t;

/** Fingerprint a request.  The exact byte stream hashed is described at the
 * top of src/core/fingerprint.c.  @param[out] out IDEM_FP_LEN bytes; zero on
 * failure.
 * @return IDEM_OK, IDEM_E_NOMEM, IDEM_E_INVAL (in or out NULL, or a NULL
 *         pointer with a nonzero length). */
IDEM_EXTERN idem_err_t idem_fingerprint(const idem_fp_input_t *in, uint8_t out[IDEM_FP_LEN]);

/** Canonical JSON of text (RFC 8259), object keys sorted by their decoded
 * UTF-8 bytes, no white space, strings with the fewest escapes, numbers as
 * exact decimals in one form (1, 1.0, 1e0 and 10e-1 are all "1"; 1e21 is
 * "1e+21"), members at the JSON pointers in ignore removed (a pointer that
 * names nothing is skipped, and so are "" and a malformed one).  Anything
 * RFC 8259 refuses, a duplicate object key, nesting deeper than
 * IDEM_JSON_MAX_DEPTH, a number whose exponent is beyond +-10^18 and a text
 * of 4 GiB or more count as not JSON.  The form and the limits are
 * described at the top of src/core/json.c.
 * @param[out] out, out_len  a NUL-terminated string owned by the caller (free
 *                           with idem_free); NULL/0 on failure.  The text
 *                           holds no NUL ("\u0000" stays escaped).
 * @return IDEM_OK, IDEM_E_INVAL (not JSON, or a NULL argument), IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_json_canonicalize(const char *text, size_t len,
                                              const char *const *ignore, size_t n_ignore,
                                              char **out, size_t *out_len);

/** Whether ptr is a well-formed RFC 6901 JSON pointer: "" or "/" followed by
 * tokens in which every "~" is followed by "0" or "1".  For config checks. */
IDEM_EXTERN int idem_json_pointer_valid(const char *ptr);

/** Lowercase hex of a fingerprint into out (2*IDEM_FP_LEN + 1 bytes). */
IDEM_EXTERN void idem_fp_hex(const uint8_t fp[IDEM_FP_LEN], char *out);

/** Lowercase hex SHA-256 of data into out (65 bytes); "" in the (out of
 * memory) case that libcrypto fails. */
IDEM_EXTERN void idem_sha256_hex(const void *data, size_t len, char *out);

#endif /* IDEM_FINGERPRINT_H */
