/* src/tx/tx_impl.h - what a database backend of idem_tx_t provides.
 *
 * tx.c holds every rule (validation, idem_decide, the record's encoding,
 * the fenced compare-and-set); a backend only runs one statement with
 * bound values and hands back at most the first column of the first row.
 * Statements are named by idem__tx_stmt_t and each backend keeps its own
 * text for them (placeholders, BLOB or BYTEA, FOR UPDATE, rowid or ctid).
 * fsm.c runs statements of its own text (stmt IDEM__TX_SQL_ADHOC), built
 * from names it has checked, with placeholders written as ops->param_mark
 * followed by the number.
 *
 * THREADING: a handle is used by one thread at a time, as its connection.
 */
#ifndef IDEM_TX_IMPL_H
#define IDEM_TX_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "idem/tx.h"

/* The statements on the key table; each backend's text has one "%s" where
 * the quoted table name goes (two for the index). */
typedef enum idem__tx_stmt {
    IDEM__TX_SQL_CREATE = 0, /* CREATE TABLE IF NOT EXISTS */
    IDEM__TX_SQL_INDEX,      /* CREATE INDEX IF NOT EXISTS on expires_at */
    IDEM__TX_SQL_LOCK,       /* $1 lock id -> one boolean; NULL text: no key locks */
    IDEM__TX_SQL_READ,       /* $1 scope, $2 key -> record (locked for update) */
    IDEM__TX_SQL_GET,        /* $1 scope, $2 key -> record (plain read) */
    IDEM__TX_SQL_INSERT,     /* $1..$6 scope key state fence expires record; nothing on conflict */
    IDEM__TX_SQL_UPDATE,     /* $1..$6 as INSERT, where fence = $7 and state = $8 */
    IDEM__TX_SQL_DELETE,     /* $1 scope, $2 key, $3 fence; in_progress only */
    IDEM__TX_SQL_SWEEP,      /* $1 now, $2 max: expires_at <= now */
    IDEM__TX_SQL_N,
    IDEM__TX_SQL_ADHOC = -1, /* the text is passed to exec, prepared for this call only */
} idem__tx_stmt_t;

typedef enum idem__tx_param_kind {
    IDEM__TXP_TEXT = 1,
    IDEM__TXP_INT = 2,
    IDEM__TXP_BLOB = 3,
} idem__tx_param_kind_t;

/* One bound value; p/len for TEXT and BLOB (len <= IDEM_TX_VALUE_MAX), i for INT. */
typedef struct idem__tx_param {
    idem__tx_param_kind_t kind;
    const void *p;
    size_t len;
    int64_t i;
} idem__tx_param_t;

#define IDEM__TX_PARAMS_MAX 8
/* The largest value bound or read: an encoded record of a response of
 * IDEM_TX_RESPONSE_MAX and its headers, with room to spare. */
#define IDEM__TX_VALUE_MAX ((size_t)IDEM_TX_RESPONSE_MAX + 4096u)

/* What one statement gave. */
typedef struct idem__tx_result {
    int64_t changes; /* rows inserted, updated or deleted */
    int row;         /* 1 when the statement returned a row */
    int col_null;    /* row: its first column is NULL */
    uint8_t *col;    /* row: the first column's bytes (idem_malloc, NUL-terminated
                      * after col_len for convenience); NULL when col_null */
    size_t col_len;
} idem__tx_result_t;

struct idem_tx_ops {
    const char *name;
    char param_mark; /* '$' (PostgreSQL) or '?' (SQLite), before a parameter's number */
    /* How a caller's identifier is quoted: "x" on PostgreSQL, [x] on SQLite,
     * where a double-quoted name that matches no column silently becomes a
     * string literal (SQLite's "double-quoted string" compatibility rule). */
    char quote_open, quote_close;
    /* Whether TEXT must be valid UTF-8 (PostgreSQL in a UTF8 database refuses
     * anything else): scopes and keys are then checked before use. */
    int utf8_text;
    /* The texts of the statements on the key table, with "%s" for the table. */
    const char *const *sql;
    /* Run one statement.  stmt >= 0: tx->sql[stmt] (prepared once and kept
     * when the backend can); IDEM__TX_SQL_ADHOC: text.  n <= IDEM__TX_PARAMS_MAX.
     * res is zeroed first; on success the caller calls idem__tx_result_cleanup.
     * @return IDEM_OK, IDEM_E_RETRY, IDEM_E_IO (tx->err says why), IDEM_E_NOMEM,
     *         IDEM_E_TOOBIG (a value read is larger than IDEM__TX_VALUE_MAX). */
    idem_err_t (*exec)(idem_tx_t *tx, int stmt, const char *text, const idem__tx_param_t *p,
                       int n, idem__tx_result_t *res);
    /* Release what the backend keeps in the handle (not the connection). */
    void (*release)(idem_tx_t *tx);
};

#define IDEM__TX_ERR_MAX 512

struct idem_tx {
    const struct idem_tx_ops *ops;
    void *conn;                       /* sqlite3 * or PGconn *, borrowed */
    char table[IDEM_TX_TABLE_MAX + 1];
    char *sql[IDEM__TX_SQL_N];        /* the statements with the table filled in; NULL: none */
    void *stmts[IDEM__TX_SQL_N];      /* SQLite: the prepared statements, lazily */
    char err[IDEM__TX_ERR_MAX];       /* idem_tx_errstr */
};

/** Whether name is [A-Za-z_][A-Za-z0-9_]* of 1..IDEM_TX_TABLE_MAX characters. */
int idem__tx_name_ok(const char *name);

/** Allocate a handle of ops on conn for table (already checked) and fill
 * tx->sql from ops->sql.  @return IDEM_OK or IDEM_E_NOMEM. */
idem_err_t idem__tx_create(const struct idem_tx_ops *ops, void *conn, const char *table,
                           idem_tx_t **out);

/** Set tx->err (printf format). */
void idem__tx_seterr(idem_tx_t *tx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Free what res holds and zero it. */
void idem__tx_result_cleanup(idem__tx_result_t *res);

#endif /* IDEM_TX_IMPL_H */
