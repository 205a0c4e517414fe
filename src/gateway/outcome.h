/* src/gateway/outcome.h - what became of a request: the outcomes counted in
 * idem_requests_total{outcome="..."} and written in the access log.
 *
 * Apart from metrics.h, which counts them, so that the loop-free parts of
 * idemd (request_plan.h) can name an outcome with nothing else.  The list
 * only grows.
 */
#ifndef IDEM_GATEWAY_OUTCOME_H
#define IDEM_GATEWAY_OUTCOME_H

#define IDEM_OUTCOMES(X)                                                                     \
    X(NEW, "new") X(TAKEOVER, "takeover") X(REPLAY, "replay") X(IN_FLIGHT, "in_flight")    \
    X(MISMATCH, "mismatch") X(MISSING_KEY, "missing_key") X(INVALID_KEY, "invalid_key")    \
    X(PASSTHROUGH, "passthrough") X(STORE_ERROR, "store_error") X(BYPASSED, "bypassed")    \
    X(NOT_RETAINED, "not_retained") X(OUTCOME_UNKNOWN, "outcome_unknown")                  \
    X(UPSTREAM_UNREACHABLE, "upstream_unreachable") X(BAD_REQUEST, "bad_request")          \
    X(TOO_LARGE, "too_large") X(TOKEN_ISSUED, "token_issued")                             \
    X(TOKEN_ACCEPTED, "token_accepted") X(TOKEN_USED, "token_used")                        \
    X(INVALID_TOKEN, "invalid_token") X(MISSING_TOKEN, "missing_token")                    \
    X(OVERLOADED, "overloaded") X(REQUEST_TIMEOUT, "request_timeout")                  \
    X(RATE_LIMITED, "rate_limited")                                                           \
    X(CORRUPT_RECORD, "corrupt_record") /* 500: the key's stored record is damaged */

typedef enum {
#define IDEM__OUTCOME_ENUM(name, text) IDEM_OUT_##name,
    IDEM_OUTCOMES(IDEM__OUTCOME_ENUM)
#undef IDEM__OUTCOME_ENUM
    IDEM_OUT__COUNT
} idem_outcome_t;

#endif /* IDEM_GATEWAY_OUTCOME_H */
