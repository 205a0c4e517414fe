/* include/idem/token.h - single-use prevention tokens (docs/protocol.md section 8).
 *
 * A token is 128 random bits from the kernel, written as 32 lowercase hex
 * digits.  The server issues it to a caller (bound to the caller's scope),
 * keeps it in the store for token_ttl, and lets exactly one request spend it;
 * a client cannot make the server keep a token it did not issue.
 *
 * In the store a token is an ordinary record under (scope, IDEM_TOKEN_PREFIX
 * token), so every backend keeps, expires and sweeps it like a key.  The
 * prefix begins with a control character, which no Idempotency-Key may
 * contain, so a key can never name a token's record or the other way round.
 * The record has the IDEM_REC_TOKEN flag; in_progress means unused and
 * completed means used.  A used token is kept until its expiry so that a
 * second use is told "used", not "unknown".
 */
#ifndef IDEM_TOKEN_H
#define IDEM_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/key.h"
#include "idem/random.h"
#include "idem/record.h"

#define IDEM_TOKEN_BYTES 16 /* random bytes in a token */
#define IDEM_TOKEN_LEN 32   /* characters of a token (hex) */
#define IDEM_TOKEN_PREFIX "\001tok:" /* a token's key in the store: prefix + token */

/** A fresh token.
 * @param[in]  rng  NULL for the kernel's generator (production); a test may inject one.
 * @param[out] out  IDEM_TOKEN_LEN + 1 bytes, NUL-terminated lowercase hex.
 * @return IDEM_OK, or IDEM_E_IO when the kernel gave no random bytes (out is ""). */
IDEM_EXTERN idem_err_t idem_token_generate(const idem_rng_t *rng, char *out);

/** Parse an Idempotency-Token header value: 32 hex digits (either case,
 * stored lowercase), bare or as a Structured Field string, with optional white
 * space around it.
 * @param[out] out  IDEM_TOKEN_LEN + 1 bytes; "" on failure.
 * @return IDEM_OK or IDEM_E_INVAL. */
IDEM_EXTERN idem_err_t idem_token_parse(const char *value, size_t len, char *out);

/** The store identity of a token issued to scope. */
IDEM_EXTERN void idem_token_id(const char *scope, const char *token, idem_key_id_t *out);

/** What spending a token finds. */
typedef enum idem_token_verdict {
    IDEM_TOKEN_NONE = 0,      /* not decided (op not applied) */
    IDEM_TOKEN_FIRST_USE = 1, /* valid and unused: spend it and forward */
    IDEM_TOKEN_USED = 2,      /* spent before: 409 token-used */
    IDEM_TOKEN_INVALID = 3,   /* unknown, expired, or not a token: 400 invalid-token */
} idem_token_verdict_t;

/** Decide a use of the token whose record is rec (NULL when the store has
 * none for the caller's scope) at now_ms.  Pure; never fails. */
IDEM_EXTERN idem_token_verdict_t idem_token_decide(const idem_record_t *rec, int64_t now_ms);

/** A short name of a verdict ("first_use", "used", "invalid", "none"). */
IDEM_EXTERN const char *idem_token_verdict_name(idem_token_verdict_t v);

#endif /* IDEM_TOKEN_H */
