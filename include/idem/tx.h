/* include/idem/tx.h - key records written inside the caller's own database
 * transaction (docs/protocol.md section 16), for SQLite and PostgreSQL.
 *
 * A gateway cannot make a business write and its key record commit
 * together; a service can.  The service opens a transaction on its own
 * connection, calls idem_tx_begin, does its business writes on the same
 * connection, calls idem_tx_complete with the response it will send, and
 * commits.  The key record and the business writes then commit or roll back
 * together: a rollback leaves no trace of the key, and a commit makes every
 * repeat replay the stored response.
 *
 *     BEGIN IMMEDIATE            (SQLite; PostgreSQL: BEGIN, READ COMMITTED)
 *     idem_tx_begin(tx, &id, fp, now, now + lease, now + ttl, &b)
 *       CLAIM/TAKEOVER  -> do the business writes, idem_tx_complete(...), COMMIT
 *       REPLAY          -> ROLLBACK, answer b.record.response
 *       IN_FLIGHT       -> ROLLBACK, answer 409 (another transaction holds the key)
 *       MISMATCH        -> ROLLBACK, answer 422
 *
 * The record is the one of idem/record.h and the decision is idem_decide's,
 * so a key behaves here exactly as it does in idemd's stores.  A record is
 * in_progress only when a caller commits between begin and complete (a
 * two-step use: claim, call something outside, complete in a second
 * transaction); its lease then protects it as in the gateway.
 *
 * Concurrency.  PostgreSQL: begin first takes a transaction-scoped advisory
 * lock on the key without waiting (pg_try_advisory_xact_lock); if another
 * open transaction holds the key the answer is IN_FLIGHT at once.  SQLite:
 * one writer at a time is SQLite's own rule; start the transaction with
 * BEGIN IMMEDIATE so a second writer waits at BEGIN (busy_timeout) instead
 * of failing later.  When the database refuses the transaction (SQLITE_BUSY,
 * a PostgreSQL serialization failure or deadlock) the call returns
 * IDEM_E_RETRY: roll back and run the whole transaction again.
 *
 * The handle borrows the connection: it never opens, begins, commits, rolls
 * back or closes it (free the handle before closing a SQLite connection: it
 * keeps prepared statements on it).  One handle per connection; a handle is
 * used by one thread at a time, as the connection is.  Called outside a
 * transaction, each statement commits on its own: the key stays correct
 * (every write is a compare-and-set), but the business writes no longer
 * commit with it.  After IDEM_E_RETRY or IDEM_E_IO on PostgreSQL the
 * caller's transaction is aborted: roll it back.
 *
 * The table (default "idem_keys"; idem_tx_migrate creates it):
 *   scope TEXT, key TEXT, state TEXT ('in_progress' | 'completed'),
 *   fence BIGINT, expires_at BIGINT (ms since the epoch),
 *   record BLOB/BYTEA (idem_record_encode), PRIMARY KEY (scope, key)
 */
#ifndef IDEM_TX_H
#define IDEM_TX_H

#include <stddef.h>
#include <stdint.h>

#include "idem/engine.h"
#include "idem/error.h"
#include "idem/extern.h"
#include "idem/key.h"
#include "idem/record.h"

struct sqlite3;  /* sqlite3.h: typedef struct sqlite3 sqlite3 */
struct pg_conn;  /* libpq-fe.h: typedef struct pg_conn PGconn */

typedef struct idem_tx idem_tx_t;

#define IDEM_TX_TABLE_DEFAULT "idem_keys"
#define IDEM_TX_TABLE_MAX 63 /* characters of a table name: [A-Za-z_][A-Za-z0-9_]* */
#define IDEM_TX_RESPONSE_MAX (64u * 1024u * 1024u) /* bytes of an encoded completed record */
#define IDEM_TX_SWEEP_MAX 10000 /* records one idem_tx_sweep removes at most */

/** Wrap an open SQLite connection.
 * @param[in]  db     borrowed; must outlive the handle.
 * @param[in]  table  NULL for IDEM_TX_TABLE_DEFAULT.
 * @param[out] out    the handle (idem_tx_free); NULL on failure.
 * @return IDEM_OK, IDEM_E_INVAL (bad table name), IDEM_E_NOMEM,
 *         IDEM_E_UNSUPPORTED (this libidem was built without SQLite). */
IDEM_EXTERN idem_err_t idem_tx_sqlite(struct sqlite3 *db, const char *table, idem_tx_t **out);

/** Wrap an open PostgreSQL connection (the same rules; IDEM_E_UNSUPPORTED
 * when this libidem was built without PostgreSQL). */
IDEM_EXTERN idem_err_t idem_tx_postgres(struct pg_conn *conn, const char *table, idem_tx_t **out);

/** Free the handle (and its prepared statements); the connection stays open.
 * NULL is a no-op. */
IDEM_EXTERN void idem_tx_free(idem_tx_t *tx);

/** Create the table and its expiry index if they do not exist.  Call it
 * once at start, inside or outside a transaction.
 * @return IDEM_OK, IDEM_E_IO (idem_tx_errstr says why). */
IDEM_EXTERN idem_err_t idem_tx_migrate(idem_tx_t *tx);

/** What idem_tx_begin found. */
typedef struct idem_tx_begin {
    idem_decision_t decision; /* kind and fence, as idem_decide gives them */
    idem_record_t record;     /* REPLAY (and NOT_RETAINED): the stored record;
                               * the caller calls idem_record_cleanup */
} idem_tx_begin_t;

/** Insert or find the key record inside the caller's open transaction.
 * On CLAIM/TAKEOVER the record is written in_progress with the new fence
 * (visible to others only when the caller commits).
 * @param[in]  id             the identity; scope and key as in idem/key.h.
 * @param[in]  fp             the request's fingerprint (idem/fingerprint.h).
 * @param[in]  lease_until_ms the lease, should the caller commit before complete.
 * @param[in]  expires_at_ms  the retention of an in_progress record.
 * @param[out] out            zeroed, then filled.
 * @return IDEM_OK (look at out->decision), IDEM_E_INVAL (empty key or scope;
 *         on PostgreSQL also one that is not valid UTF-8),
 *         IDEM_E_RETRY, IDEM_E_CORRUPT (a row that does not decode),
 *         IDEM_E_IO, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_tx_begin(idem_tx_t *tx, const idem_key_id_t *id,
                                     const uint8_t fp[IDEM_FP_LEN], int64_t now_ms,
                                     int64_t lease_until_ms, int64_t expires_at_ms,
                                     idem_tx_begin_t *out);

/** Store the response under the key, in the same transaction, fenced.
 * @param[in] flags          IDEM_REC_NOT_RETAINED when the body is not kept.
 * @param[in] expires_at_ms  the retention of the completed record.
 * @return IDEM_OK, IDEM_E_INVAL, IDEM_E_FENCE (no in_progress record with
 *         this fence: it was taken over, released or already completed),
 *         IDEM_E_TOOBIG (the record would exceed IDEM_TX_RESPONSE_MAX
 *         bytes), IDEM_E_RETRY, IDEM_E_CORRUPT, IDEM_E_IO, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_tx_complete(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence,
                                        const idem_response_t *response, uint32_t flags,
                                        int64_t expires_at_ms);

/** Move the lease of an in_progress record this caller owns (two-step use).
 * @return IDEM_OK, IDEM_E_FENCE, IDEM_E_RETRY, IDEM_E_IO. */
IDEM_EXTERN idem_err_t idem_tx_renew(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence,
                                     int64_t lease_until_ms);

/** Remove an in_progress record this caller owns, so that a retry runs
 * again (two-step use; inside one transaction a rollback does the same).
 * @return IDEM_OK, IDEM_E_FENCE, IDEM_E_RETRY, IDEM_E_IO. */
IDEM_EXTERN idem_err_t idem_tx_release(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence);

/** Read a record without writing.  @param[out] rec  idem_record_cleanup.
 * @return IDEM_OK, IDEM_E_NOTFOUND (none, or past its retention at now_ms),
 *         IDEM_E_CORRUPT, IDEM_E_IO, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_tx_get(idem_tx_t *tx, const idem_key_id_t *id, int64_t now_ms,
                                   idem_record_t *rec);

/** Delete up to max (at most IDEM_TX_SWEEP_MAX per call) records whose
 * retention ended at or before now_ms.  On PostgreSQL rows another open
 * transaction has locked are skipped.
 * @param[out] removed  how many.  @return IDEM_OK, IDEM_E_INVAL, IDEM_E_RETRY,
 *         IDEM_E_IO. */
IDEM_EXTERN idem_err_t idem_tx_sweep(idem_tx_t *tx, int64_t now_ms, size_t max, size_t *removed);

/** The database's last error message for this handle; never NULL. */
IDEM_EXTERN const char *idem_tx_errstr(const idem_tx_t *tx);

#endif /* IDEM_TX_H */
