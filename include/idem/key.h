/* include/idem/key.h - the Idempotency-Key header and the caller's scope.
 *
 * A key arrives as a Structured Field string ("abc", with \" and \\ escapes)
 * or as a bare token (abc).  Either way it is 1 to 255 characters of visible
 * ASCII (0x21-0x7E); a quoted key may also hold spaces.  The stored identity
 * is (scope, key), where scope is the lowercase hex SHA-256 of the caller's
 * Authorization value, or "anonymous".
 */
#ifndef IDEM_KEY_H
#define IDEM_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/random.h"

#define IDEM_KEY_MAX 255  /* characters in a key */
#define IDEM_SCOPE_MAX 64 /* characters in a scope (hex SHA-256) */

/** The identity of a record.  Both strings are NUL-terminated; neither a key
 * nor a scope can contain NUL. */
typedef struct idem_key_id {
    char scope[IDEM_SCOPE_MAX + 1];
    char key[IDEM_KEY_MAX + 1];
} idem_key_id_t;

/** Parse the value of one Idempotency-Key header (optional white space
 * around it is already trimmed by the caller or is trimmed here).
 * @param[in]  value, len  the raw header value, not NUL-terminated.
 * @param[out] out         IDEM_KEY_MAX + 1 bytes; the unescaped key, NUL-
 *                         terminated; "" on failure.
 * @return IDEM_OK or IDEM_E_INVAL (empty, too long, bad character, bad quoting,
 *         trailing garbage, a comma in a bare key: two fields joined). */
IDEM_EXTERN idem_err_t idem_key_parse(const char *value, size_t len, char *out);

/** The scope of a caller.
 * @param[in]  value, len  the scope header's value; value NULL when the
 *                         header is absent.
 * @param[out] out         IDEM_SCOPE_MAX + 1 bytes, NUL-terminated; "" (not
 *                         a valid scope) in the out-of-memory case that
 *                         libcrypto cannot hash, which a caller must refuse. */
IDEM_EXTERN void idem_scope_from_header(const char *value, size_t len, char *out);

/** Whether s (NUL-terminated) is a valid scope string as an admin may pass
 * it: "anonymous" or 64 lowercase hex digits. */
IDEM_EXTERN int idem_scope_valid(const char *s);

#define IDEM_UUID_LEN 36 /* characters of a UUID string, without the NUL */

/** A fresh key for a new operation: a UUIDv7 (RFC 9562 section 5.7), whose
 * first 48 bits are now_ms so keys sort by creation time, and whose other
 * 74 free bits are random.
 * @param[in]  now_ms  milliseconds since the epoch (idem_clock_now).
 * @param[in]  rng     the random source; NULL for the kernel's.
 * @param[out] out     IDEM_UUID_LEN + 1 bytes: lowercase 8-4-4-4-12 hex, NUL-terminated. */
IDEM_EXTERN void idem_key_generate(int64_t now_ms, const idem_rng_t *rng, char *out);

#endif /* IDEM_KEY_H */
