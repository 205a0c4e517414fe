/* src/core/engine.c - what a claim of a key does, decided once for all stores.
 *
 * idem_decide is the state machine of docs/protocol.md section 6 as a pure function of
 * the record a store holds (or none), the new request's fingerprint and the
 * time.  The rules are tried in the order listed in include/idem/engine.h;
 * the first that matches decides.  The store that calls it applies the
 * decision inside the same transaction in which it read the record, which
 * is what makes claims atomic.
 *
 * INVARIANTS: a decision that forwards always carries a fence greater than
 * the fence of the record it replaces, so fences never go backwards for a key
 * while any record of it exists (an expired record that is still present is
 * replaced with fence + 1, not 1); Retry-After is never less than 1 second.
 *
 * THREADING: pure; call from anywhere.
 */
#include "idem/engine.h"

#include <string.h>

/* Whole seconds from now until `until`, rounded up, at least 1. */
static int64_t seconds_until(int64_t until, int64_t now)
{
    if (until <= now)
        return 1;
    /* Not (d + 999) / 1000: d may be close to INT64_MAX; until - now itself
     * cannot overflow because until > now. */
    uint64_t d = (uint64_t)until - (uint64_t)now;
    uint64_t s = d / 1000 + (d % 1000 != 0);
    return s > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)s;
}

idem_decision_t idem_decide(const idem_record_t *rec, const uint8_t fp[IDEM_FP_LEN],
                            int64_t now_ms)
{
    idem_decision_t d = {0};

    if (rec == NULL) {
        d.kind = IDEM_DECIDE_CLAIM;
        d.fence = 1;
        return d;
    }
    if (now_ms >= rec->expires_at_ms) {
        d.kind = IDEM_DECIDE_CLAIM;
        d.fence = rec->fence + 1;
        return d;
    }
    d.fence = rec->fence;
    if (memcmp(rec->fingerprint, fp, IDEM_FP_LEN) != 0) {
        d.kind = IDEM_DECIDE_MISMATCH;
    } else if (rec->state == IDEM_STATE_IN_PROGRESS) {
        if ((rec->flags & IDEM_REC_HELD) && now_ms >= rec->lease_until_ms) {
            d.kind = IDEM_DECIDE_RECONCILE;
            d.fence = rec->fence + 1;
            d.retry_after_s = seconds_until(rec->expires_at_ms, now_ms);
        } else if (rec->flags & IDEM_REC_HELD) {
            d.kind = IDEM_DECIDE_IN_FLIGHT_UNKNOWN;
            d.retry_after_s = seconds_until(rec->expires_at_ms, now_ms);
        } else if (now_ms < rec->lease_until_ms) {
            d.kind = IDEM_DECIDE_IN_FLIGHT;
            d.retry_after_s = seconds_until(rec->lease_until_ms, now_ms);
        } else {
            d.kind = IDEM_DECIDE_TAKEOVER;
            d.fence = rec->fence + 1;
        }
    } else if (rec->flags & IDEM_REC_NOT_RETAINED) {
        d.kind = IDEM_DECIDE_NOT_RETAINED;
    } else {
        d.kind = IDEM_DECIDE_REPLAY;
    }
    return d;
}

const char *idem_decision_name(idem_decision_kind_t kind)
{
    switch (kind) {
    case IDEM_DECIDE_CLAIM:
        return "claim";
    case IDEM_DECIDE_TAKEOVER:
        return "takeover";
    case IDEM_DECIDE_REPLAY:
        return "replay";
    case IDEM_DECIDE_IN_FLIGHT:
        return "in_flight";
    case IDEM_DECIDE_MISMATCH:
        return "mismatch";
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        return "in_flight_unknown";
    case IDEM_DECIDE_NOT_RETAINED:
        return "not_retained";
    case IDEM_DECIDE_RECONCILE:
        return "reconcile";
    }
    return "unknown";
}
