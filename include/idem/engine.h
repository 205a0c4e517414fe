/* include/idem/engine.h - the decision of docs/protocol.md section 6, as a pure function.
 *
 * Given the record a store holds for (scope, key) (or none), the fingerprint
 * of the new request and the time, idem_decide says what happens: claim the
 * key, take it over from a dead owner, replay the stored response, answer
 * in-flight, or refuse a reused key.  Every store that decides in C calls
 * this inside its own transaction; a Redis script must decide the same way.
 *
 * Order of the rules:
 *   1. no record, or now >= expires_at             -> CLAIM (fence = old + 1, or 1)
 *   2. fingerprint differs                         -> MISMATCH
 *   3. in_progress, held, now <  lease_until       -> IN_FLIGHT_UNKNOWN
 *   3b. in_progress, held, now >= lease_until      -> RECONCILE (fence + 1)
 *   4. in_progress, now <  lease_until             -> IN_FLIGHT (retry_after)
 *   5. in_progress, now >= lease_until             -> TAKEOVER (fence + 1)
 *   6. completed, body not retained                -> NOT_RETAINED
 *   7. completed                                   -> REPLAY
 */
#ifndef IDEM_ENGINE_H
#define IDEM_ENGINE_H

#include <stdint.h>

#include "idem/extern.h"
#include "idem/record.h"

typedef enum idem_decision_kind {
    IDEM_DECIDE_CLAIM = 1,         /* new key: forward with fence */
    IDEM_DECIDE_TAKEOVER = 2,      /* lease expired: forward with fence */
    IDEM_DECIDE_REPLAY = 3,        /* answer with the stored response */
    IDEM_DECIDE_IN_FLIGHT = 4,     /* 409 in-flight, Retry-After */
    IDEM_DECIDE_MISMATCH = 5,      /* 422 key-reused */
    IDEM_DECIDE_IN_FLIGHT_UNKNOWN = 6, /* 409 upstream-outcome-unknown (held) */
    IDEM_DECIDE_NOT_RETAINED = 7,  /* 409 response-not-retained */
    /* held, and its owner's lease ended (on_unknown_outcome: reconcile): the
     * claim takes the lease with fence + 1, keeps the hold and its
     * retention, and the caller asks the upstream what happened; the
     * request itself is answered as IN_FLIGHT_UNKNOWN.  A hold written by
     * `hold` leases the key until its retention ends, so never gets here. */
    IDEM_DECIDE_RECONCILE = 8,
} idem_decision_kind_t;

typedef struct idem_decision {
    idem_decision_kind_t kind;
    uint64_t fence;       /* CLAIM/TAKEOVER: the new fence; else the record's */
    int64_t retry_after_s; /* IN_FLIGHT: whole seconds until the lease ends, >= 1;
                            * IN_FLIGHT_UNKNOWN, RECONCILE: until the hold's retention ends */
} idem_decision_t;

/** Decide.  @param rec  the record held, or NULL when there is none.
 * @param fp the new request's fingerprint.  Never fails. */
IDEM_EXTERN idem_decision_t idem_decide(const idem_record_t *rec, const uint8_t fp[IDEM_FP_LEN],
                                        int64_t now_ms);

/** Name of a decision kind ("claim", "replay", ...), static storage. */
IDEM_EXTERN const char *idem_decision_name(idem_decision_kind_t kind);

/** Whether a decision forwards the request (CLAIM or TAKEOVER). */
static inline int idem_decision_forwards(idem_decision_kind_t k)
{
    return k == IDEM_DECIDE_CLAIM || k == IDEM_DECIDE_TAKEOVER;
}

#endif /* IDEM_ENGINE_H */
