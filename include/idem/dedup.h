/* include/idem/dedup.h - message de-duplication for consumers of queues that
 * redeliver (docs/protocol.md section 16).
 *
 * A broker delivers at least once: after a consumer crash, a lost ack or a
 * redelivery timeout the same message comes again.  Before applying a
 * message the consumer asks begin on its message id (or, better, its
 * business key: a producer's retry gets a new message id but keeps the
 * business key); after applying it, done.  A message whose id is done is a
 * DUPLICATE: ack it and skip it.  Ids are remembered for the retention,
 * which must be at least the longest time the broker may redeliver.
 *
 * Two forms:
 *   - on a store (any idem_store_t: lmdb, redis, postgres, memory): begin
 *     claims the id with a lease (another consumer handling it now gets
 *     IN_PROGRESS), done marks it done, abandon gives it up so that a
 *     redelivery runs again.  The effect and the mark are two writes: a crash
 *     between them applies the message again after the lease, so use this
 *     form when applying is itself idempotent or outside your database.
 *   - in the caller's own SQLite or PostgreSQL transaction (idem/tx.h): the
 *     mark commits with the effect, so a message is applied exactly once
 *     whatever crashes.  begin and done go inside the transaction that
 *     applies the message; a rollback forgets both.
 *
 * Ids are 1 to IDEM_KEY_MAX bytes of valid UTF-8 without NUL (PostgreSQL
 * keeps them as text, and an id must mean the same on every store: put a
 * binary id in hex or base64); a namespace (one per consumer group or
 * message kind) is 1 to IDEM_DEDUP_NS_MAX characters of [A-Za-z0-9_.-].
 * Either form keeps an id as the record (scope "dedup:" ns, key id).
 * Limits of the store form: lease 1 ms to 1 day, retention 1 ms to 10 years.
 */
#ifndef IDEM_DEDUP_H
#define IDEM_DEDUP_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/store.h"
#include "idem/tx.h"

#define IDEM_DEDUP_NS_MAX 58 /* "dedup:" + ns fits IDEM_SCOPE_MAX */
/* In-transaction form: the lease (and retention) of an id claimed by a
 * transaction that commits before idem_dedup_tx_done (5 minutes). */
#define IDEM_DEDUP_TX_LEASE_MS (5ll * 60 * 1000)

typedef enum idem_dedup_verdict {
    IDEM_DEDUP_NEW = 1,         /* apply it, then done */
    IDEM_DEDUP_DUPLICATE = 2,   /* already done: ack and skip */
    IDEM_DEDUP_IN_PROGRESS = 3, /* store form: another consumer holds it now; retry later */
} idem_dedup_verdict_t;

/** What begin says, and what done needs. */
typedef struct idem_dedup_claim {
    idem_dedup_verdict_t verdict;
    uint64_t fence;          /* NEW: pass to done/abandon */
    int64_t retry_after_ms;  /* IN_PROGRESS: until the holder's lease ends */
} idem_dedup_claim_t;

/* ---- shared by both forms ---------------------------------------------- */

/** The record identity of msg_id in namespace ns: (scope "dedup:" ns, key
 * msg_id).  Ids must be valid UTF-8 (PostgreSQL keeps them as text), so an
 * id that works on one store works on all.
 * @return IDEM_OK, or IDEM_E_INVAL (out zeroed) for a bad ns or id. */
IDEM_EXTERN idem_err_t idem_dedup_id(const char *ns, const char *msg_id, size_t id_len,
                                     idem_key_id_t *out);

/** The verdict of a claim's decision: CLAIM/TAKEOVER -> NEW with the fence,
 * REPLAY/NOT_RETAINED -> DUPLICATE, IN_FLIGHT* -> IN_PROGRESS (retry_after_ms
 * from the decision's whole seconds).  @return IDEM_OK, or IDEM_E_CORRUPT for
 * MISMATCH: a record that is not a message id's sits under the identity. */
IDEM_EXTERN idem_err_t idem_dedup_verdict(const idem_decision_t *d, idem_dedup_claim_t *out);

/* ---- on a store ------------------------------------------------------- */

/** Claim msg_id in namespace ns at now_ms, with a lease of lease_ms (the
 * longest the consumer takes to apply one message; a crashed consumer's
 * claim is taken over after it).
 * @return IDEM_OK (look at out->verdict), IDEM_E_INVAL (bad ns or id,
 *         lease_ms < 1), or a store error (nothing written). */
IDEM_EXTERN idem_err_t idem_dedup_begin(idem_store_t *store, const char *ns, const char *msg_id,
                                        size_t id_len, int64_t now_ms, int64_t lease_ms,
                                        idem_dedup_claim_t *out);

/** Mark msg_id done, remembered until now_ms + retention_ms.
 * @return IDEM_OK, IDEM_E_FENCE (the claim was taken over after its lease:
 *         another consumer may apply it too), IDEM_E_INVAL, a store error. */
IDEM_EXTERN idem_err_t idem_dedup_done(idem_store_t *store, const char *ns, const char *msg_id,
                                       size_t id_len, uint64_t fence, int64_t now_ms,
                                       int64_t retention_ms);

/** Give the claim up (applying failed and nothing was done), so that a
 * redelivery is NEW again.  @return IDEM_OK, IDEM_E_FENCE, a store error. */
IDEM_EXTERN idem_err_t idem_dedup_abandon(idem_store_t *store, const char *ns, const char *msg_id,
                                          size_t id_len, uint64_t fence);

/* ---- in the caller's transaction --------------------------------------- */

/** Inside the caller's open transaction: NEW (the id is claimed in this
 * transaction; apply the message, then idem_dedup_tx_done, then commit) or
 * DUPLICATE (committed as done before: skip it).  IN_PROGRESS only on
 * PostgreSQL, when another open transaction holds the id (retry_after_ms
 * 1000).  The id is written in_progress with a lease (and retention) of
 * IDEM_DEDUP_TX_LEASE_MS, which only matters if the caller commits before
 * done: a redelivery after the lease is NEW again.
 * @return IDEM_OK, IDEM_E_INVAL, IDEM_E_RETRY, IDEM_E_IO, IDEM_E_NOMEM,
 *         IDEM_E_CORRUPT (the row under the id does not decode, or was
 *         written by something other than idem_dedup_tx_begin). */
IDEM_EXTERN idem_err_t idem_dedup_tx_begin(idem_tx_t *tx, const char *ns, const char *msg_id,
                                           size_t id_len, int64_t now_ms,
                                           idem_dedup_claim_t *out);

/** Mark the id done in the same transaction, remembered until now_ms +
 * retention_ms (>= 1).  @return IDEM_OK, IDEM_E_INVAL, IDEM_E_FENCE,
 * IDEM_E_RETRY, IDEM_E_IO, IDEM_E_CORRUPT, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_dedup_tx_done(idem_tx_t *tx, const char *ns, const char *msg_id,
                                          size_t id_len, uint64_t fence, int64_t now_ms,
                                          int64_t retention_ms);

#endif /* IDEM_DEDUP_H */
