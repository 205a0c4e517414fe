/* src/tx/tx_sqlite.c - idem_tx_t on a caller's SQLite connection.
 *
 * The statements on the key table are prepared on first use with
 * SQLITE_PREPARE_PERSISTENT and kept in the handle until idem_tx_free;
 * ad-hoc statements (fsm.c) are prepared and finalized per call.  Values are
 * bound, never written into the SQL text; only the table name, checked by
 * idem__tx_name_ok and quoted, is.
 *
 * SQLite has one writer at a time.  A caller that opened its transaction
 * with BEGIN IMMEDIATE holds the write lock from the start, so begin's read
 * and write cannot be interleaved with another writer's.  After a deferred
 * BEGIN the first write may find another writer (SQLITE_BUSY) or that the
 * snapshot it read is stale (SQLITE_BUSY_SNAPSHOT in WAL mode): both, and
 * SQLITE_LOCKED (shared cache), are IDEM_E_RETRY, meaning roll back and run
 * the transaction again.  The handle never sets busy_timeout: that is the
 * connection's owner's choice.
 *
 * THREADING: one thread at a time per handle, as the connection.
 * Free the handle before sqlite3_close (it holds prepared statements).
 */
#include <sqlite3.h>
#include <string.h>

#include "idem/alloc.h"
#include "tx/tx_impl.h"

static const char *const sqlite_sql[IDEM__TX_SQL_N] = {
    [IDEM__TX_SQL_CREATE] = "CREATE TABLE IF NOT EXISTS \"%s\" ("
                            "scope TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL, "
                            "fence INTEGER NOT NULL, expires_at INTEGER NOT NULL, "
                            "record BLOB NOT NULL, PRIMARY KEY (scope, key))",
    [IDEM__TX_SQL_INDEX] = "CREATE INDEX IF NOT EXISTS \"%s_expires\" ON \"%s\" (expires_at)",
    [IDEM__TX_SQL_LOCK] = NULL,
    [IDEM__TX_SQL_READ] = "SELECT record FROM \"%s\" WHERE scope = ?1 AND key = ?2",
    [IDEM__TX_SQL_GET] = "SELECT record FROM \"%s\" WHERE scope = ?1 AND key = ?2",
    [IDEM__TX_SQL_INSERT] = "INSERT INTO \"%s\" (scope, key, state, fence, expires_at, record) "
                            "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (scope, key) DO NOTHING",
    [IDEM__TX_SQL_UPDATE] = "UPDATE \"%s\" SET state = ?3, fence = ?4, expires_at = ?5, "
                            "record = ?6 WHERE scope = ?1 AND key = ?2 AND fence = ?7 "
                            "AND state = ?8",
    [IDEM__TX_SQL_DELETE] = "DELETE FROM \"%s\" WHERE scope = ?1 AND key = ?2 AND fence = ?3 "
                            "AND state = 'in_progress'",
    [IDEM__TX_SQL_SWEEP] = "DELETE FROM \"%s\" WHERE rowid IN (SELECT rowid FROM \"%s\" "
                           "WHERE expires_at <= ?1 LIMIT ?2)",
};

static idem_err_t fail(idem_tx_t *tx, int rc)
{
    sqlite3 *db = tx->conn;
    idem__tx_seterr(tx, "sqlite: %s (%s)", sqlite3_errmsg(db), sqlite3_errstr(rc));
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return IDEM_E_RETRY;
    case SQLITE_NOMEM:
        return IDEM_E_NOMEM;
    case SQLITE_TOOBIG:
        return IDEM_E_TOOBIG;
    default:
        return IDEM_E_IO;
    }
}

static idem_err_t bind_all(idem_tx_t *tx, sqlite3_stmt *st, const idem__tx_param_t *p, int n)
{
    for (int i = 0; i < n; i++) {
        int rc;
        if (p[i].kind != IDEM__TXP_INT && p[i].len > IDEM__TX_VALUE_MAX)
            return IDEM_E_TOOBIG;
        switch (p[i].kind) {
        case IDEM__TXP_INT:
            rc = sqlite3_bind_int64(st, i + 1, p[i].i);
            break;
        case IDEM__TXP_TEXT:
            rc = sqlite3_bind_text(st, i + 1, p[i].p, (int)p[i].len, SQLITE_STATIC);
            break;
        default:
            rc = sqlite3_bind_blob(st, i + 1, p[i].len > 0 ? p[i].p : "", (int)p[i].len,
                                   SQLITE_STATIC);
            break;
        }
        if (rc != SQLITE_OK)
            return fail(tx, rc);
    }
    return IDEM_OK;
}

static idem_err_t run(idem_tx_t *tx, sqlite3_stmt *st, const idem__tx_param_t *p, int n,
                      idem__tx_result_t *res)
{
    sqlite3 *db = tx->conn;
    idem_err_t err = bind_all(tx, st, p, n);
    if (err != IDEM_OK)
        return err;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        res->row = 1;
        if (sqlite3_column_type(st, 0) == SQLITE_NULL) {
            res->col_null = 1;
        } else {
            const void *b = sqlite3_column_blob(st, 0);
            int len = sqlite3_column_bytes(st, 0);
            if (len < 0 || (size_t)len > IDEM__TX_VALUE_MAX)
                return IDEM_E_TOOBIG;
            if (b == NULL && len > 0)
                return IDEM_E_NOMEM;
            res->col = idem_malloc((size_t)len + 1);
            if (res->col == NULL)
                return IDEM_E_NOMEM;
            if (len > 0)
                memcpy(res->col, b, (size_t)len);
            res->col[len] = '\0';
            res->col_len = (size_t)len;
        }
        return IDEM_OK;
    }
    if (rc != SQLITE_DONE)
        return fail(tx, rc);
    res->changes = sqlite3_changes64(db);
    return IDEM_OK;
}

static idem_err_t sqlite_exec(idem_tx_t *tx, int stmt, const char *text,
                              const idem__tx_param_t *p, int n, idem__tx_result_t *res)
{
    sqlite3 *db = tx->conn;
    sqlite3_stmt *st = NULL;
    memset(res, 0, sizeof *res);
    if (stmt >= 0) {
        st = tx->stmts[stmt];
        if (st == NULL) {
            int rc = sqlite3_prepare_v3(db, tx->sql[stmt], -1, SQLITE_PREPARE_PERSISTENT, &st,
                                        NULL);
            if (rc != SQLITE_OK)
                return fail(tx, rc);
            tx->stmts[stmt] = st;
        }
    } else {
        int rc = sqlite3_prepare_v2(db, text, -1, &st, NULL);
        if (rc != SQLITE_OK)
            return fail(tx, rc);
    }
    idem_err_t err = run(tx, st, p, n, res);
    if (err != IDEM_OK)
        idem__tx_result_cleanup(res);
    if (stmt >= 0) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    } else {
        sqlite3_finalize(st);
    }
    return err;
}

static void sqlite_release(idem_tx_t *tx)
{
    for (int i = 0; i < IDEM__TX_SQL_N; i++)
        sqlite3_finalize(tx->stmts[i]); /* NULL is a no-op */
}

static const struct idem_tx_ops sqlite_ops = {
    .name = "sqlite",
    .param_mark = '?',
    .quote_open = '[',
    .quote_close = ']',
    .sql = sqlite_sql,
    .exec = sqlite_exec,
    .release = sqlite_release,
};

idem_err_t idem_tx_sqlite(struct sqlite3 *db, const char *table, idem_tx_t **out)
{
    if (out == NULL)
        return IDEM_E_INVAL;
    *out = NULL;
    if (table == NULL)
        table = IDEM_TX_TABLE_DEFAULT;
    if (db == NULL || !idem__tx_name_ok(table))
        return IDEM_E_INVAL;
    return idem__tx_create(&sqlite_ops, db, table, out);
}
