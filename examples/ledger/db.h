/* examples/ledger/db.h - the ledger's few needs of a SQL database, for
 * SQLite and PostgreSQL alike.
 *
 * The ledger writes its SQL once, with $1, $2 ... placeholders (SQLite reads
 * them as ?1, ?2 ...), and reads at most one row per statement.  What differs
 * between the two databases stays here: how a transaction starts (BEGIN
 * IMMEDIATE on SQLite, so a second writer waits at BEGIN instead of failing
 * half-way), and which errors mean "run the transaction again" (SQLITE_BUSY,
 * a PostgreSQL serialization failure or deadlock) or "that row exists"
 * (a unique violation).
 *
 * THREADING: a db_t is used by one thread at a time, as its connection is.
 */
#ifndef LEDGER_DB_H
#define LEDGER_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum db_kind {
    DB_SQLITE = 1,
    DB_POSTGRES = 2,
} db_kind_t;

typedef enum db_rc {
    DB_OK = 0,
    DB_RETRY = 1,    /* busy, serialization failure, deadlock: roll back, run again */
    DB_CONFLICT = 2, /* unique violation */
    DB_ERROR = 3,    /* anything else; db_errstr says what */
} db_rc_t;

typedef struct db db_t;

/** One statement parameter: text (s non-NULL) or an integer. */
typedef struct db_arg {
    const char *s;
    int64_t i;
} db_arg_t;

#define DB_TEXT(v) ((db_arg_t){.s = (v), .i = 0})
#define DB_INT(v) ((db_arg_t){.s = NULL, .i = (v)})

#define DB_MAX_COLS 8
#define DB_TEXT_MAX 128 /* bytes kept of a text column, NUL included */

/** The first row of a result. */
typedef struct db_row {
    int n_cols;
    char text[DB_MAX_COLS][DB_TEXT_MAX]; /* every column as text (truncated) */
    int64_t num[DB_MAX_COLS];            /* and as an integer (0 when it is not one) */
} db_row_t;

/** Open a connection: "sqlite:PATH" or "postgres://..." / "postgresql://...".
 * @param[out] out  NULL on failure, with err naming the problem.
 * @return DB_OK or DB_ERROR. */
db_rc_t db_open(const char *url, db_t **out, char *err, size_t errlen);

/** Close; NULL is a no-op. */
void db_close(db_t *db);

db_kind_t db_kind(const db_t *db);

/** The driver's handle: sqlite3 * or PGconn *. */
void *db_handle(db_t *db);

/** Run SQL without parameters or result (several statements allowed). */
db_rc_t db_exec(db_t *db, const char *sql);

/** Run one statement.
 * @param[out] row      optional: the first row, if any.
 * @param[out] found    optional: whether there was a row.
 * @param[out] changes  optional: rows inserted, updated or deleted. */
db_rc_t db_query(db_t *db, const char *sql, const db_arg_t *args, int n_args, db_row_t *row,
                 bool *found, int64_t *changes);

/** BEGIN IMMEDIATE (SQLite) or BEGIN (PostgreSQL, READ COMMITTED). */
db_rc_t db_begin(db_t *db);
db_rc_t db_commit(db_t *db);
/** Roll back whatever is open; harmless when nothing is. */
void db_rollback(db_t *db);

/** Whether the connection is usable; a broken PostgreSQL connection is
 * reset here (once), so a pool can heal after the server restarts.
 * @param[out] was_reset  whether it was reset (what was prepared on it,
 *                        e.g. by an idem_tx_t, is gone). */
bool db_healthy(db_t *db, bool *was_reset);

/** The last error message; never NULL. */
const char *db_errstr(const db_t *db);

#endif /* LEDGER_DB_H */
