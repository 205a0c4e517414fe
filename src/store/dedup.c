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
 * The identity of an id and the verdict of a decision are
 * src/core/dedup_id.c's, shared with the in-transaction form.
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
#include "store/store_impl.h"

#define LEASE_MAX_MS 86400000ll             /* one day */
#define RETENTION_MAX_MS 315360000000ll     /* ten years */
#define CLAIM_KEPT_MS (7 * 86400000ll)      /* a claim outlives its lease by a week */


static bool time_ok(int64_t now_ms)
{
    return now_ms >= 0 && now_ms <= IDEM_LOCK_TIME_MAX;
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
    if (store == NULL || idem_dedup_id(ns, msg_id, id_len, &op.id) != IDEM_OK ||
        !time_ok(now_ms) ||
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

    err = idem_dedup_verdict(&op.decision, out);
    if (err == IDEM_OK && out->verdict == IDEM_DEDUP_IN_PROGRESS)
        out->retry_after_ms =
            idem__store_wait_for_lease(store, &op.id, now_ms, op.decision.retry_after_s);
    return err;
}

idem_err_t idem_dedup_done(idem_store_t *store, const char *ns, const char *msg_id,
                           size_t id_len, uint64_t fence, int64_t now_ms,
                           int64_t retention_ms)
{
    idem_key_id_t id;
    if (store == NULL || idem_dedup_id(ns, msg_id, id_len, &id) != IDEM_OK || fence == 0 ||
        !time_ok(now_ms) ||
        retention_ms < 1 || retention_ms > RETENTION_MAX_MS)
        return IDEM_E_INVAL;
    const idem_response_t done = {.status = 200};
    return idem_store_complete(store, &id, fence, &done, 0, now_ms + retention_ms);
}

idem_err_t idem_dedup_abandon(idem_store_t *store, const char *ns, const char *msg_id,
                              size_t id_len, uint64_t fence)
{
    idem_key_id_t id;
    if (store == NULL || idem_dedup_id(ns, msg_id, id_len, &id) != IDEM_OK || fence == 0)
        return IDEM_E_INVAL;
    /* The lease ends "now": at the earliest possible time, since abandon
     * is given no clock.  RENEW keeps expires_at. */
    return idem_store_renew(store, &id, fence, 0);
}
