/* include/idem/retry.h - when and how long to wait before sending a request again.
 *
 * A client that sends an idempotency key may retry freely with the same key,
 * but it should still retry politely: only answers that say "try again",
 * after a delay that grows and is spread out so that a fleet of clients does
 * not retry in lockstep, never past a deadline, and not at all once the
 * fleet's retries are failing (the retry budget).
 *
 *   delay(attempt) = random(0, min(cap, base * 2^attempt))    full jitter
 *
 * where attempt is 0 after the first failure.  A Retry-After on the answer
 * replaces that delay (it is the server's word), but no delay ever carries
 * past the deadline: when it would, the caller stops and keeps the last
 * answer.
 *
 * The budget is a token bucket shared by every request of a client (the
 * AWS SDKs' "retry quota"): each retry takes retry_cost tokens (timeout_cost
 * after a timeout or connection failure); a request that succeeds gives
 * back what its retries took, and one that succeeds on its first attempt
 * adds success_refill.  An empty bucket means a retry is not made, so an
 * outage costs one attempt per request instead of max_attempts.
 *
 * Usage:
 *   idem_retry_t r;
 *   idem_retry_begin(&r, &policy, &budget, idem_clock_now(NULL));
 *   for (;;) {
 *       idem_attempt_t a = send_once(...);
 *       int64_t delay;
 *       if (idem_retry_next(&r, &a, idem_clock_now(NULL), NULL, &delay) != IDEM_RETRY_AGAIN)
 *           break;                        // a's answer is the final one
 *       sleep_ms(delay);
 *   }
 *
 * Nothing here sleeps or reads a socket: the caller does, with the clock and
 * random source it passes in, so tests run without waiting.
 *
 * THREADING: an idem_retry_t belongs to one request; an idem_retry_budget_t
 * may be shared by any number of threads (its counter is atomic).
 */
#ifndef IDEM_RETRY_H
#define IDEM_RETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/random.h"

/* The defaults (docs/client.md explains them). */
#define IDEM_RETRY_DEFAULT_BASE_MS 200
#define IDEM_RETRY_DEFAULT_CAP_MS 10000
#define IDEM_RETRY_DEFAULT_MAX_ATTEMPTS 5    /* the first attempt and 4 retries */
#define IDEM_RETRY_DEFAULT_DEADLINE_MS 60000 /* from the start of the first attempt */
#define IDEM_RETRY_BUDGET_DEFAULT_CAPACITY 500
#define IDEM_RETRY_BUDGET_DEFAULT_RETRY_COST 5
#define IDEM_RETRY_BUDGET_DEFAULT_TIMEOUT_COST 10
#define IDEM_RETRY_BUDGET_DEFAULT_SUCCESS_REFILL 1

/* Limits on what a caller may set (idem_retry_policy_check). */
#define IDEM_RETRY_MAX_ATTEMPTS_LIMIT 100
#define IDEM_RETRY_MAX_MS_LIMIT (INT64_C(24) * 3600 * 1000) /* base, cap, deadline */
/* The largest Retry-After in seconds that is parsed as a number (a day);
 * more is clamped to it (the deadline bounds it anyway). */
#define IDEM_RETRY_AFTER_MAX_S 86400

typedef struct idem_retry_policy {
    int64_t base_ms;       /* first backoff ceiling; > 0 */
    int64_t cap_ms;        /* no backoff above this; >= base_ms */
    unsigned max_attempts; /* attempts in all, the first included; >= 1 */
    int64_t deadline_ms;   /* no attempt starts this long after the first; > 0 */
} idem_retry_policy_t;

/** The policy with the IDEM_RETRY_DEFAULT_* values. */
IDEM_EXTERN void idem_retry_policy_init(idem_retry_policy_t *p);

/** Whether p is within the limits above.
 * @return IDEM_OK, or IDEM_E_INVAL with errbuf naming the field (may be NULL). */
IDEM_EXTERN idem_err_t idem_retry_policy_check(const idem_retry_policy_t *p, char *errbuf,
                                               size_t errlen);

/** A token bucket shared by a client's requests. */
typedef struct idem_retry_budget {
    int64_t capacity;       /* tokens when full, and at the start */
    int64_t retry_cost;     /* taken by a retry after an HTTP answer */
    int64_t timeout_cost;   /* taken by a retry after a timeout or a connection failure */
    int64_t success_refill; /* added by a request that succeeds on its first attempt */
    _Atomic int64_t tokens; /* what is left; read it with idem_retry_budget_available */
} idem_retry_budget_t;

/** A full budget with the IDEM_RETRY_BUDGET_DEFAULT_* values. */
IDEM_EXTERN void idem_retry_budget_init(idem_retry_budget_t *b);

/** A full budget with the given values (a negative one is taken as 0; a
 * capacity of 0 allows no retries at all). */
IDEM_EXTERN void idem_retry_budget_init_with(idem_retry_budget_t *b, int64_t capacity,
                                             int64_t retry_cost, int64_t timeout_cost,
                                             int64_t success_refill);

/** Tokens left now. */
IDEM_EXTERN int64_t idem_retry_budget_available(const idem_retry_budget_t *b);

/** How an attempt ended, as far as the transport knows. */
typedef enum idem_transport {
    IDEM_TRANSPORT_OK = 0,      /* an HTTP answer came; status is set */
    IDEM_TRANSPORT_CONNECT = 1, /* no connection (refused, unreachable, DNS): nothing was sent */
    IDEM_TRANSPORT_TIMEOUT = 2, /* no complete answer in time */
    IDEM_TRANSPORT_BROKEN = 3,  /* the connection failed after the request was sent */
} idem_transport_t;

/** One attempt's outcome.  Strings are borrowed for the call. */
typedef struct idem_attempt {
    idem_transport_t transport;
    int status;                 /* the HTTP status when transport is OK, else 0 */
    const char *retry_after;    /* the Retry-After value, not NUL-terminated; NULL if absent */
    size_t retry_after_len;
    const char *problem_type;   /* NUL-terminated "type" of an application/problem+json
                                 * body ("urn:idem:problem:in-flight"); NULL if none */
} idem_attempt_t;

/** Whether an attempt's outcome is worth retrying with the same key:
 * connection failures, timeouts, broken connections, and the statuses 408,
 * 409, 425, 429, 500, 502, 503, 504.  A 409 is retried only when it has no
 * problem type or the type is urn:idem:problem:in-flight (idem's other 409s,
 * token-used, response-not-retained and upstream-outcome-unknown, will not
 * change by waiting).  Never any other 4xx, never 1xx-3xx. */
IDEM_EXTERN bool idem_retry_retryable(const idem_attempt_t *a);

/** Parse a Retry-After value: delta-seconds ("120") or an HTTP-date in any of
 * the three forms of RFC 9110 section 5.6.7 (IMF-fixdate, RFC 850, asctime).
 * @param[in]  now_ms    the current time, for a date.
 * @param[out] delay_ms  milliseconds to wait, >= 0 (a date in the past is 0;
 *                       seconds above IDEM_RETRY_AFTER_MAX_S are clamped).
 * @return IDEM_OK or IDEM_E_INVAL (delay_ms is then 0). */
IDEM_EXTERN idem_err_t idem_retry_after_parse(const char *value, size_t len, int64_t now_ms,
                                              int64_t *delay_ms);

/** The full-jitter backoff before retry number attempt (0 for the first retry):
 * uniform in [0, min(cap, base * 2^attempt)], without overflow for any attempt. */
IDEM_EXTERN int64_t idem_retry_backoff(const idem_retry_policy_t *p, unsigned attempt,
                                       const idem_rng_t *rng);

/** What to do after an attempt. */
typedef enum idem_retry_verdict {
    IDEM_RETRY_AGAIN = 0,         /* wait *delay_ms, then send again with the same key */
    IDEM_RETRY_DONE = 1,          /* the answer is final (success or not retryable) */
    IDEM_RETRY_GIVE_UP_ATTEMPTS = 2, /* retryable, but max_attempts were made */
    IDEM_RETRY_GIVE_UP_DEADLINE = 3, /* retryable, but the wait would pass the deadline */
    IDEM_RETRY_GIVE_UP_BUDGET = 4,   /* retryable, but the budget is empty */
} idem_retry_verdict_t;

/** One request's retry state; the caller allocates it. */
typedef struct idem_retry {
    const idem_retry_policy_t *policy; /* borrowed for the request's life */
    idem_retry_budget_t *budget;       /* borrowed; NULL for no budget */
    int64_t start_ms;                  /* when the first attempt started */
    unsigned attempts;                 /* attempts reported to idem_retry_next so far */
    int64_t spent;                     /* tokens this request took from the budget */
} idem_retry_t;

/** Start a request's retries at now_ms, before its first attempt. */
IDEM_EXTERN void idem_retry_begin(idem_retry_t *r, const idem_retry_policy_t *policy,
                                  idem_retry_budget_t *budget, int64_t now_ms);

/** Report an attempt's outcome and learn what to do next.
 * On IDEM_RETRY_AGAIN, *delay_ms is the wait (the Retry-After, if a valid one
 * came, else the backoff), and the budget has been charged.  On any other
 * verdict *delay_ms is 0; on DONE with a 2xx answer the budget is refilled.
 * @param[in] now_ms  when the attempt ended.
 * @param[in] rng     the jitter's source; NULL for the kernel's. */
IDEM_EXTERN idem_retry_verdict_t idem_retry_next(idem_retry_t *r, const idem_attempt_t *a,
                                                 int64_t now_ms, const idem_rng_t *rng,
                                                 int64_t *delay_ms);

/** A short name for a verdict ("again", "done", "attempts", "deadline", "budget"). */
IDEM_EXTERN const char *idem_retry_verdict_name(idem_retry_verdict_t v);

#endif /* IDEM_RETRY_H */
