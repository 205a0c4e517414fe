/* src/tx/dedup_tx.c - message de-duplication in the caller's transaction
 * (the second half of idem/dedup.h; the store half is src/store/dedup.c).
 *
 * A message id is a key record (scope "dedup:" ns, key msg_id) in the
 * idem_tx_t's table, with an all-zero fingerprint, so the decision is
 * idem_decide's: no record (or one past its retention) is CLAIM -> NEW; a
 * completed one is REPLAY -> DUPLICATE; one another open PostgreSQL
 * transaction holds is IN_FLIGHT -> IN_PROGRESS.  begin writes the record
 * in_progress with a lease of IDEM_DEDUP_TX_LEASE_MS that is also its
 * retention; done completes it with an empty 200 response, kept for the
 * caller's retention.  Both go in the transaction that applies the message,
 * so the mark commits (or rolls back) with the effect.  Should a caller
 * commit between begin and done, the lease protects the id for 5 minutes,
 * after which a redelivery is NEW again (TAKEOVER).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "idem/dedup.h"
#include "tx/tx_impl.h"

idem_err_t idem_dedup_tx_begin(idem_tx_t *tx, const char *ns, const char *msg_id,
                               size_t id_len, int64_t now_ms, idem_dedup_claim_t *out)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    idem_key_id_t id;
    if (tx == NULL || out == NULL || now_ms < 0 || now_ms > INT64_MAX - IDEM_DEDUP_TX_LEASE_MS ||
        idem_dedup_id(ns, msg_id, id_len, &id) != IDEM_OK)
        return IDEM_E_INVAL;
    static const uint8_t zero_fp[IDEM_FP_LEN];
    int64_t lease_until = now_ms + IDEM_DEDUP_TX_LEASE_MS;
    idem_tx_begin_t b;
    idem_err_t rc = idem_tx_begin(tx, &id, zero_fp, now_ms, lease_until, lease_until, &b);
    if (rc != IDEM_OK)
        return rc;
    idem_record_cleanup(&b.record);
    rc = idem_dedup_verdict(&b.decision, out);
    if (rc == IDEM_E_CORRUPT)
        idem__tx_seterr(tx, "the record of (%s, %s) was not written by idem_dedup_tx_begin",
                        id.scope, id.key);
    return rc;
}

idem_err_t idem_dedup_tx_done(idem_tx_t *tx, const char *ns, const char *msg_id,
                              size_t id_len, uint64_t fence, int64_t now_ms,
                              int64_t retention_ms)
{
    idem_key_id_t id;
    if (tx == NULL || retention_ms < 1 || now_ms < 0 || now_ms > INT64_MAX - retention_ms ||
        idem_dedup_id(ns, msg_id, id_len, &id) != IDEM_OK)
        return IDEM_E_INVAL;
    const idem_response_t done = {.status = 200};
    return idem_tx_complete(tx, &id, fence, &done, 0, now_ms + retention_ms);
}
