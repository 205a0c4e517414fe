/* src/core/jwt.h - verifying a Bearer JWT and reading one claim (internal).
 *
 * The `jwt:CLAIM` scope source (src/gateway/scope.c, SPEC section 14)
 * names the caller by a claim of the JWT in Authorization, so the token is
 * believed only after its signature, `exp` and `nbf` pass against the keys
 * the operator configured: public keys (`jwt_keys`: PEM or JWKS; RS256,
 * ES256, EdDSA with Ed25519) or a shared secret (`jwt_secret_file`: HS256).
 * The design and what is refused are written at the top of jwt.c.  Not
 * installed: the gateway and the fuzzer use it.
 *
 * THREADING: a key set is immutable once made; any thread may verify with
 * it while it holds a reference.  References are counted atomically, so
 * the gateway can swap in a set read again on SIGHUP while workers still
 * verify with the old one.
 */
#ifndef IDEM_CORE_JWT_H
#define IDEM_CORE_JWT_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"

#define IDEM__JWT_MAX_TOKEN 8192      /* bytes of a compact JWS; longer is refused */
#define IDEM__JWT_LEEWAY_S 60         /* seconds of clock skew allowed on exp and nbf */
#define IDEM__JWT_MAX_CLAIM 1024      /* bytes of a claim's value */
#define IDEM__JWT_MAX_KEYS 64         /* keys in one set */
#define IDEM__JWT_MAX_FILE (1u << 20) /* bytes of a key or secret file */
#define IDEM__JWT_MIN_SECRET 32       /* bytes of an HS256 secret (RFC 7518 3.2) */

typedef struct idem__jwt_keys idem__jwt_keys_t;

/** Why a token was not believed; each is a `reason` of
 * idem_scope_fallback_total.  The list only grows. */
typedef enum idem__jwt_status {
    IDEM__JWT_OK = 0,
    IDEM__JWT_MALFORMED,     /* not a Bearer token of three base64url parts of JSON objects,
                              * longer than IDEM__JWT_MAX_TOKEN, a crit header, or a
                              * wrongly typed kid, exp or nbf */
    IDEM__JWT_ALGORITHM,     /* alg none, unknown, or one no configured key is for */
    IDEM__JWT_UNKNOWN_KID,   /* a kid that names no key (and no key without kid fits) */
    IDEM__JWT_SIGNATURE,     /* no candidate key verifies the signature */
    IDEM__JWT_EXPIRED,       /* now >= exp + leeway */
    IDEM__JWT_NOT_YET_VALID, /* now + leeway < nbf */
    IDEM__JWT_CLAIM,         /* the claim is absent, not a string or an integer, too long,
                              * or a string holding a NUL */
    IDEM__JWT_NOMEM,
    IDEM__JWT__COUNT
} idem__jwt_status_t;

/** A short lowercase name of a status ("signature", "expired", ...). */
const char *idem__jwt_status_name(idem__jwt_status_t st);

/** Make a key set from texts in memory.
 * @param[in] keys, keys_len      a PEM text of one or more `PUBLIC KEY` blocks, or a JWKS
 *                                (a JSON object with a `keys` array); NULL: none.
 * @param[in] secret, secret_len  the HS256 secret; NULL: none.
 * @param[out] out   the set (one reference, dropped with idem__jwt_keys_unref); NULL on
 *                   failure.
 * @param[out] why   on failure one phrase naming the problem.
 * @return IDEM_OK, IDEM_E_INVAL (no key, a key of an unsupported type or size, a
 *         malformed JWKS key, a secret shorter than IDEM__JWT_MIN_SECRET), IDEM_E_NOMEM. */
idem_err_t idem__jwt_keys_parse(const char *keys, size_t keys_len, const unsigned char *secret,
                                size_t secret_len, idem__jwt_keys_t **out, char *why,
                                size_t whylen);

/** Read the files and make a key set (idem__jwt_keys_parse).  The secret
 * file's bytes are the secret, one trailing newline (LF or CRLF) left out.
 * @param[in] keys_path, secret_path  either may be NULL, not both.
 * @return as idem__jwt_keys_parse, and IDEM_E_INVAL for a file that cannot be read
 *         or is larger than IDEM__JWT_MAX_FILE (why names the file). */
idem_err_t idem__jwt_keys_load(const char *keys_path, const char *secret_path,
                               idem__jwt_keys_t **out, char *why, size_t whylen);

/** Take one more reference (returns k), or drop one (the last frees the
 * set).  NULL is a no-op for both. */
idem__jwt_keys_t *idem__jwt_keys_ref(idem__jwt_keys_t *k);
void idem__jwt_keys_unref(idem__jwt_keys_t *k);

/** How many keys the set holds (the secret counts as one). */
size_t idem__jwt_keys_count(const idem__jwt_keys_t *k);

/** Verify the compact JWS token[0..len) (the credentials after "Bearer ")
 * against keys at time now_s (seconds since the epoch), then read the
 * claim at path ("sub", "org.id": a dotted path of member names).
 * @param[out] out, cap  the claim's value: a string's decoded bytes, or an
 *                       integer's digits as written; NUL-terminated.  cap must be at
 *                       least IDEM__JWT_MAX_CLAIM + 1.
 * @param[out] outlen    its length; 0 unless IDEM__JWT_OK.
 * @return IDEM__JWT_OK or why the token is not believed. */
idem__jwt_status_t idem__jwt_verify_claim(const idem__jwt_keys_t *keys, const char *token,
                                          size_t len, const char *path, int64_t now_s,
                                          char *out, size_t cap, size_t *outlen);

#endif /* IDEM_CORE_JWT_H */
