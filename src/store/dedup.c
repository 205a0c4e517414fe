/* src/store/dedup.c - message de-duplication on a store (the store half of
 * include/idem/dedup.h; the in-transaction half is src/tx/).
 *
 * A message id is a record under (scope "dedup:" ns, key id) with an
 * all-zero fingerprint, and each step is one store op whose meaning
 * idem__store_apply fixes for every backend:
 *
 *   begin    CLAIM at now with lease now + lease.  CLAIM or TAKEOVER (a
 *            crashed consumer's lease ended: fence + 1) -> NEW with the
 *            fence; REPLAY or NOT_RETAINED (done) -> DUPLICATE; IN_FLIGHT
 *            (another consumer's lease is live) -> IN_PROGRESS with the time
 *            until that lease ends.  A record with another fingerprint is
 *            none of ours: IDEM_E_CORRUPT.
 *   done     COMPLETE with the claim's fence: an empty 200 response, kept
 *            until now + retention.
 *   abandon  RENEW with the claim's fence and lease_until = now: the lease
 *            ends at once, so a redelivery is NEW again (a TAKEOVER), and
 *            the record stays, so its fence goes on growing.  Deleting it
 *            (RELEASE) would restart the fence at 1, and a consumer whose
 *            older claim was taken over while it stalled could then mark a
 *            later consumer's claim done with its stale fence 1.
 *
 * A claim is kept (expires_at) for CLAIM_KEPT_MS after its lease, so that
 * the fence of a crashed consumer's claim is still there to be taken over
 * with fence + 1: a record that ended with the lease (Redis deletes it at
 * expires_at) would give the next consumer fence 1 again, equal to the dead
 * one's.
 *
 * Ids.  dedup.h allows 1 to IDEM_KEY_MAX bytes without NUL.  LMDB, memory:
 * and Redis keys take any such bytes, but PostgreSQL keeps keys in a text
 * column that takes only valid UTF-8, so every backend refuses an id that is
 * not UTF-8 (IDEM_E_INVAL): the ids a consumer may use do not depend on the
 * store it moves to.  Binary ids (a Kafka key, a hash) go in hex or base64.
 *
 * Limits: lease 1 ms .. LEASE_MAX_MS, retention 1 ms .. RETENTION_MAX_MS,
 * now_ms 0 .. IDEM_LOCK_TIME_MAX (so that every sum stays exact in Redis's
 * Lua doubles); anything else is IDEM_E_INVAL.
 *
 * THREADING: as thread-safe as the store.
 */
#include "idem/dedup.h"

#include <stdbool.h>
#include <string.h>

#include "idem/lock.h" /* IDEM_LOCK_TIME_MAX */

#define SCOPE_PREFIX "dedup:"
#define LEASE_MAX_MS 86400000ll             /* one day */
#define RETENTION_MAX_MS 315360000000ll     /* ten years */
#define CLAIM_KEPT_MS (7 * 86400000ll)      /* a claim outlives its lease by a week */

_Static_assert(sizeof SCOPE_PREFIX - 1 + IDEM_DEDUP_NS_MAX <= IDEM_SCOPE_MAX,
               "dedup: + ns fits a scope");

/* Whether the len bytes at s are well-formed UTF-8 as PostgreSQL takes it:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_ok(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        unsigned lo = 0x80, hi = 0xbf;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else {
            return false;
        }
        if (len - i - 1 < n)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= n; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xbf)
                return false;
        i += n + 1;
    }
    return true;
}

/* The store identity of (ns, msg_id), or false when either is not allowed. */
static bool make_id(const char *ns, const char *msg_id, size_t id_len, idem_key_id_t *id)
{
    if (ns == NULL || msg_id == NULL || id_len == 0 || id_len > IDEM_KEY_MAX)
        return false;
    size_t nl = strnlen(ns, IDEM_DEDUP_NS_MAX + 1);
    if (nl == 0 || nl > IDEM_DEDUP_NS_MAX)
        return false;
    for (size_t i = 0; i < nl; i++) {
        char c = ns[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    if (memchr(msg_id, '\0', id_len) != NULL ||
        !utf8_ok((const unsigned char *)msg_id, id_len))
        return false;

    memset(id, 0, sizeof *id);
    memcpy(id->scope, SCOPE_PREFIX, sizeof SCOPE_PREFIX - 1);
    memcpy(id->scope + sizeof SCOPE_PREFIX - 1, ns, nl);
    memcpy(id->key, msg_id, id_len);
    return true;
}

static bool time_ok(int64_t now_ms)
{
    return now_ms >= 0 && now_ms <= IDEM_LOCK_TIME_MAX;
}

/* How long until the holder's lease ends: exact from the record when it can
 * be read, else the decision's whole seconds. */
static int64_t wait_for_lease(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                              int64_t retry_after_s)
{
    idem_record_t rec;
    int64_t wait = retry_after_s * 1000;
    if (idem_store_get(store, id, now_ms, &rec) == IDEM_OK) {
        if (rec.state == IDEM_STATE_IN_PROGRESS && rec.lease_until_ms > now_ms &&
            (rec.flags & IDEM_REC_HELD) == 0)
            wait = rec.lease_until_ms - now_ms;
        idem_record_cleanup(&rec);
    }
    return wait >= 1 ? wait : 1;
}

idem_err_t idem_dedup_begin(idem_store_t *store, const char *ns, const char *msg_id,
                            size_t id_len, int64_t now_ms, int64_t lease_ms,
                            idem_dedup_claim_t *out)
{
    if (out == NULL)
        return IDEM_E_INVAL;
    memset(out, 0, sizeof *out);
    idem_op_t op;
    memset(&op, 0, sizeof op);
    if (store == NULL || !make_id(ns, msg_id, id_len, &op.id) || !time_ok(now_ms) ||
        lease_ms < 1 || lease_ms > LEASE_MAX_MS)
        return IDEM_E_INVAL;

    op.kind = IDEM_OP_CLAIM;
    op.now_ms = now_ms;
    op.lease_until_ms = now_ms + lease_ms;
    op.expires_at_ms = op.lease_until_ms + CLAIM_KEPT_MS;
    idem_err_t err = idem_store_claim(store, &op);
    idem_record_cleanup(&op.record); /* a replay's response: not needed */
    if (err != IDEM_OK)
        return err;

    switch (op.decision.kind) {
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        out->verdict = IDEM_DEDUP_NEW;
        out->fence = op.decision.fence;
        return IDEM_OK;
    case IDEM_DECIDE_REPLAY:
    case IDEM_DECIDE_NOT_RETAINED:
        out->verdict = IDEM_DEDUP_DUPLICATE;
        return IDEM_OK;
    case IDEM_DECIDE_IN_FLIGHT:
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        out->verdict = IDEM_DEDUP_IN_PROGRESS;
        out->retry_after_ms = wait_for_lease(store, &op.id, now_ms, op.decision.retry_after_s);
        return IDEM_OK;
    default: /* MISMATCH: a record of something else under this identity */
        return IDEM_E_CORRUPT;
    }
}

idem_err_t idem_dedup_done(idem_store_t *store, const char *ns, const char *msg_id,
                           size_t id_len, uint64_t fence, int64_t now_ms,
                           int64_t retention_ms)
{
    idem_key_id_t id;
    if (store == NULL || !make_id(ns, msg_id, id_len, &id) || fence == 0 || !time_ok(now_ms) ||
        retention_ms < 1 || retention_ms > RETENTION_MAX_MS)
        return IDEM_E_INVAL;
    const idem_response_t done = {.status = 200};
    return idem_store_complete(store, &id, fence, &done, 0, now_ms + retention_ms);
}

idem_err_t idem_dedup_abandon(idem_store_t *store, const char *ns, const char *msg_id,
                              size_t id_len, uint64_t fence)
{
    idem_key_id_t id;
    if (store == NULL || !make_id(ns, msg_id, id_len, &id) || fence == 0)
        return IDEM_E_INVAL;
    /* The lease ends "now": at the earliest possible time, since abandon
     * is given no clock.  RENEW keeps expires_at. */
    return idem_store_renew(store, &id, fence, 0);
}
