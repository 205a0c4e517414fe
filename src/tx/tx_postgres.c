/* src/tx/tx_postgres.c - idem_tx_t on a caller's PostgreSQL connection.
 *
 * Every statement is one PQexecParams: values travel as parameters (the
 * record as binary bytea), never in the SQL text; only the table name,
 * checked by idem__tx_name_ok and quoted, is.  Parameter types are left to
 * the server to infer from the columns they meet, so fsm.c's id and state
 * values fit whatever type the caller's columns have (integer, text, an
 * enum).  Results come back in binary format: bytea and text are their
 * bytes, a boolean is one byte.
 *
 * Concurrency.  begin first runs pg_try_advisory_xact_lock on a 64-bit hash
 * of (table, scope, key) (tx.c): a key another open transaction is using is
 * IN_FLIGHT at once, without waiting.  The row is then read FOR UPDATE, so
 * a complete, renew or release running in another transaction (which take
 * no advisory lock) is waited for, and the decision is made on the newest
 * committed row.  40001 (serialization_failure, e.g. under REPEATABLE READ
 * when a row committed after the snapshot), 40P01 (deadlock_detected) and
 * 55P03 (lock_not_available, the caller's lock_timeout) are IDEM_E_RETRY;
 * every other error is IDEM_E_IO with libpq's message in idem_tx_errstr.
 * After any error the caller's transaction is aborted: roll it back.
 *
 * THREADING: one thread at a time per handle, as the connection.
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"
#include "tx/tx_impl.h"

static const char *const pg_sql[IDEM__TX_SQL_N] = {
    [IDEM__TX_SQL_CREATE] = "CREATE TABLE IF NOT EXISTS \"%s\" ("
                            "scope TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL, "
                            "fence BIGINT NOT NULL, expires_at BIGINT NOT NULL, "
                            "record BYTEA NOT NULL, PRIMARY KEY (scope, key))",
    [IDEM__TX_SQL_INDEX] = "CREATE INDEX IF NOT EXISTS \"%s_expires\" ON \"%s\" (expires_at)",
    [IDEM__TX_SQL_LOCK] = "SELECT pg_try_advisory_xact_lock($1::bigint)",
    [IDEM__TX_SQL_READ] = "SELECT record FROM \"%s\" WHERE scope = $1 AND key = $2 FOR UPDATE",
    [IDEM__TX_SQL_GET] = "SELECT record FROM \"%s\" WHERE scope = $1 AND key = $2",
    [IDEM__TX_SQL_INSERT] = "INSERT INTO \"%s\" (scope, key, state, fence, expires_at, record) "
                            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (scope, key) DO NOTHING",
    [IDEM__TX_SQL_UPDATE] = "UPDATE \"%s\" SET state = $3, fence = $4, expires_at = $5, "
                            "record = $6 WHERE scope = $1 AND key = $2 AND fence = $7 "
                            "AND state = $8",
    [IDEM__TX_SQL_DELETE] = "DELETE FROM \"%s\" WHERE scope = $1 AND key = $2 AND fence = $3 "
                            "AND state = 'in_progress'",
    /* Rows another transaction holds are skipped: it is deciding on them. */
    [IDEM__TX_SQL_SWEEP] = "DELETE FROM \"%s\" WHERE ctid IN (SELECT ctid FROM \"%s\" "
                           "WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) "
                           "AND expires_at <= $1",
};

/* Turn a failed result into an error code and tx->err. */
static idem_err_t fail(idem_tx_t *tx, PGresult *r)
{
    PGconn *conn = tx->conn;
    const char *state = r != NULL ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r != NULL ? PQresultErrorMessage(r) : "";
    if (msg == NULL || msg[0] == '\0')
        msg = PQerrorMessage(conn);
    idem__tx_seterr(tx, "postgres: %s%s%s%s", msg, state ? " (SQLSTATE " : "", state ? state : "",
                    state ? ")" : "");
    if (state != NULL && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
                          strcmp(state, "55P03") == 0))
        return IDEM_E_RETRY;
    if (r == NULL && PQstatus(conn) == CONNECTION_OK)
        return IDEM_E_NOMEM; /* libpq returns no result only when out of memory */
    return IDEM_E_IO;
}

static idem_err_t pg_exec(idem_tx_t *tx, int stmt, const char *text, const idem__tx_param_t *p,
                          int n, idem__tx_result_t *res)
{
    PGconn *conn = tx->conn;
    const char *values[IDEM__TX_PARAMS_MAX];
    int lengths[IDEM__TX_PARAMS_MAX];
    int formats[IDEM__TX_PARAMS_MAX];
    char ints[IDEM__TX_PARAMS_MAX][24];
    memset(res, 0, sizeof *res);
    if (n < 0 || n > IDEM__TX_PARAMS_MAX)
        return IDEM_E_INVAL;
    for (int i = 0; i < n; i++) {
        formats[i] = 0;
        lengths[i] = 0;
        switch (p[i].kind) {
        case IDEM__TXP_INT:
            snprintf(ints[i], sizeof ints[i], "%" PRId64, p[i].i);
            values[i] = ints[i];
            break;
        case IDEM__TXP_TEXT:
            /* Text parameters are NUL-terminated strings in libpq: every text
             * bound here is one (a key, a scope, a state, an id). */
            values[i] = p[i].p;
            break;
        default:
            if (p[i].len > IDEM__TX_VALUE_MAX)
                return IDEM_E_TOOBIG;
            values[i] = p[i].len > 0 ? p[i].p : "";
            lengths[i] = (int)p[i].len;
            formats[i] = 1;
            break;
        }
    }
    const char *sql = stmt >= 0 ? tx->sql[stmt] : text;
    PGresult *r = PQexecParams(conn, sql, n, NULL, values, lengths, formats, 1);
    ExecStatusType s = r != NULL ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        idem_err_t err = fail(tx, r);
        PQclear(r);
        return err;
    }
    if (s == PGRES_TUPLES_OK && PQntuples(r) > 0 && PQnfields(r) > 0) {
        res->row = 1;
        if (PQgetisnull(r, 0, 0)) {
            res->col_null = 1;
        } else {
            int len = PQgetlength(r, 0, 0);
            if (len < 0 || (size_t)len > IDEM__TX_VALUE_MAX) {
                PQclear(r);
                return IDEM_E_TOOBIG;
            }
            res->col = idem_malloc((size_t)len + 1);
            if (res->col == NULL) {
                PQclear(r);
                return IDEM_E_NOMEM;
            }
            memcpy(res->col, PQgetvalue(r, 0, 0), (size_t)len);
            res->col[len] = '\0';
            res->col_len = (size_t)len;
        }
    }
    const char *tuples = PQcmdTuples(r);
    if (tuples != NULL && tuples[0] != '\0' && s == PGRES_COMMAND_OK)
        res->changes = strtoll(tuples, NULL, 10);
    PQclear(r);
    return IDEM_OK;
}

static void pg_release(idem_tx_t *tx)
{
    (void)tx; /* nothing is prepared on the server */
}

static const struct idem_tx_ops pg_ops = {
    .name = "postgres",
    .param_mark = '$',
    .quote_open = '"',
    .quote_close = '"',
    .utf8_text = 1,
    .sql = pg_sql,
    .exec = pg_exec,
    .release = pg_release,
};

idem_err_t idem_tx_postgres(struct pg_conn *conn, const char *table, idem_tx_t **out)
{
    if (out == NULL)
        return IDEM_E_INVAL;
    *out = NULL;
    if (table == NULL)
        table = IDEM_TX_TABLE_DEFAULT;
    if (conn == NULL || !idem__tx_name_ok(table))
        return IDEM_E_INVAL;
    return idem__tx_create(&pg_ops, conn, table, out);
}
