/* src/gateway/ratelimit.h - scope_rate_limit: a token bucket per caller.
 *
 * Without credentials one client can issue thousands of tokens and claim
 * thousands of new keys a second, and fill the store for everybody.
 * `scope_rate_limit: 200/s` caps what each scope (docs/protocol.md sections
 * 3 and 11) may ask of the store through one idemd process: keyed requests,
 * token issues and token-route requests.  Beyond it idemd answers 429
 * rate-limited with Retry-After.  Every caller in the "anonymous" scope
 * shares one bucket.
 *
 * Each scope has a bucket of N requests that refills at N per period: a
 * caller may send N at once, then N per period.  The state of a bucket is
 * one number, its theoretical arrival time (GCRA, the Generic Cell Rate
 * Algorithm): a bucket whose time is in the past is full and carries no
 * information, so it may be forgotten at no cost.
 *
 * Memory is bounded: at most max_scopes buckets are tracked (idemd uses
 * IDEM_RATELIMIT_MAX_SCOPES, about 14 MiB).  Buckets sit in a hash table
 * with a least-recently-used list; full ones at the old end are dropped as
 * new scopes arrive, and when the table is at its bound the least recently
 * used bucket is dropped even if not full (its caller gets a full bucket
 * again).  So a client that makes up a new Authorization value for every
 * request grows the table only to the bound, and evicts only the buckets of
 * callers who have been quiet longest.  The hash is seeded from the kernel,
 * so scopes cannot be chosen to collide.
 *
 * THREADING: one mutex, held for a lookup and a few additions; any thread
 * may call.  One table serves every worker of the process, so the limit is
 * per process ("per instance"), whatever `workers` is.
 */
#ifndef IDEM_GATEWAY_RATELIMIT_H
#define IDEM_GATEWAY_RATELIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IDEM_RATELIMIT_MAX_SCOPES 100000u /* buckets one idemd tracks at most */
#define IDEM_RATE_MAX_COUNT 1000000u      /* the largest N of "N/s" */

/** A rate: count requests per period_ms; count 0 is "off". */
typedef struct idem_rate {
    uint32_t count;
    int64_t period_ms; /* 1000, 60000 or 3600000 */
} idem_rate_t;

/** Parse "N/s", "N/m" or "N/h" (N a whole number 1..IDEM_RATE_MAX_COUNT), or
 * "off".  @return 0, or -1 (out zeroed). */
int idem__rate_parse(const char *s, idem_rate_t *out);

typedef struct idem_ratelimit idem_ratelimit_t;

/** A limiter of rate per scope, tracking at most max_scopes scopes.
 * @return NULL when out of memory, or when rate is off or max_scopes is 0. */
idem_ratelimit_t *idem__ratelimit_create(idem_rate_t rate, size_t max_scopes);
void idem__ratelimit_destroy(idem_ratelimit_t *rl); /* NULL is a no-op */

/** Take one request from scope's bucket at now_ns (a monotonic clock).
 * @param[out] retry_after_s  when refused: whole seconds until one request
 *                            fits again, at least 1; else 0.
 * @return true when the request may go on.  NULL rl allows everything;
 *         out of memory allows (the limit is a protection, not a gate that
 *         fails closed). */
bool idem__ratelimit_take(idem_ratelimit_t *rl, const char *scope, uint64_t now_ns,
                          int64_t *retry_after_s);

/** Scopes tracked now. */
size_t idem__ratelimit_tracked(idem_ratelimit_t *rl);

#endif /* IDEM_GATEWAY_RATELIMIT_H */
