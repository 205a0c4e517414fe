/* examples/ledger/db.c - SQLite and PostgreSQL behind db.h.
 *
 * SQLite: WAL journal with synchronous=FULL (a commit is on disk before the
 * ledger answers), a busy timeout so BEGIN IMMEDIATE waits for the writer
 * ahead of it, statements prepared per call (the ledger's are few and
 * short).  PostgreSQL: libpq with text parameters; a result's SQLSTATE
 * decides between DB_RETRY (40001, 40P01, 55P03), DB_CONFLICT (23505) and
 * DB_ERROR.
 */
#include "db.h"

#include <errno.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUSY_TIMEOUT_MS 10000
#define SQL_MAX 2048 /* bytes of one statement after placeholder rewriting */

struct db {
    db_kind_t kind;
    sqlite3 *lite;
    PGconn *pg;
    char err[256];
};

static void set_err(db_t *db, const char *what, const char *detail)
{
    snprintf(db->err, sizeof db->err, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    /* libpq messages end with a newline; a log line should not */
    size_t n = strlen(db->err);
    while (n > 0 && (db->err[n - 1] == '\n' || db->err[n - 1] == '\r'))
        db->err[--n] = '\0';
}

db_kind_t db_kind(const db_t *db)
{
    return db->kind;
}

void *db_handle(db_t *db)
{
    return db->kind == DB_SQLITE ? (void *)db->lite : (void *)db->pg;
}

const char *db_errstr(const db_t *db)
{
    return db->err;
}

static db_rc_t lite_rc(db_t *db, int rc)
{
    int primary = rc & 0xff;
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
        return set_err(db, "sqlite busy", sqlite3_errmsg(db->lite)), DB_RETRY;
    if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY)
        return set_err(db, "sqlite", sqlite3_errmsg(db->lite)), DB_CONFLICT;
    set_err(db, "sqlite", sqlite3_errmsg(db->lite));
    return DB_ERROR;
}

static db_rc_t pg_rc(db_t *db, const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    set_err(db, "postgres", res ? PQresultErrorMessage(res) : PQerrorMessage(db->pg));
    if (state != NULL && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
                          strcmp(state, "55P03") == 0))
        return DB_RETRY;
    if (state != NULL && strcmp(state, "23505") == 0)
        return DB_CONFLICT;
    return DB_ERROR;
}

db_rc_t db_open(const char *url, db_t **out, char *err, size_t errlen)
{
    *out = NULL;
    db_t *db = calloc(1, sizeof *db);
    if (db == NULL) {
        snprintf(err, errlen, "out of memory");
        return DB_ERROR;
    }
    if (strncmp(url, "sqlite:", 7) == 0) {
        const char *path = url + 7;
        if (*path == '\0') {
            snprintf(err, errlen, "--db sqlite: needs a path (sqlite:./ledger.db)");
            free(db);
            return DB_ERROR;
        }
        db->kind = DB_SQLITE;
        int rc = sqlite3_open_v2(path, &db->lite,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 NULL);
        if (rc != SQLITE_OK) {
            snprintf(err, errlen, "cannot open %s: %s", path,
                     db->lite ? sqlite3_errmsg(db->lite) : sqlite3_errstr(rc));
            db_close(db);
            return DB_ERROR;
        }
        sqlite3_busy_timeout(db->lite, BUSY_TIMEOUT_MS);
        /* journal_mode answers a row; sqlite3_exec ignores it */
        if (db_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;") != DB_OK) {
            snprintf(err, errlen, "cannot set up %s: %s", path, db->err);
            db_close(db);
            return DB_ERROR;
        }
    } else if (strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0) {
        db->kind = DB_POSTGRES;
        db->pg = PQconnectdb(url);
        if (db->pg == NULL || PQstatus(db->pg) != CONNECTION_OK) {
            snprintf(err, errlen, "cannot connect to PostgreSQL: %s",
                     db->pg ? PQerrorMessage(db->pg) : "out of memory");
            size_t n = strlen(err);
            while (n > 0 && err[n - 1] == '\n')
                err[--n] = '\0';
            db_close(db);
            return DB_ERROR;
        }
        if (db_exec(db, "SET client_min_messages = warning") != DB_OK) {
            snprintf(err, errlen, "cannot set up the PostgreSQL session: %s", db->err);
            db_close(db);
            return DB_ERROR;
        }
    } else {
        snprintf(err, errlen, "--db: not sqlite:PATH or postgres://...: '%s'", url);
        free(db);
        return DB_ERROR;
    }
    *out = db;
    return DB_OK;
}

void db_close(db_t *db)
{
    if (db == NULL)
        return;
    if (db->lite)
        sqlite3_close_v2(db->lite);
    if (db->pg)
        PQfinish(db->pg);
    free(db);
}

db_rc_t db_exec(db_t *db, const char *sql)
{
    if (db->kind == DB_SQLITE) {
        char *msg = NULL;
        int rc = sqlite3_exec(db->lite, sql, NULL, NULL, &msg);
        sqlite3_free(msg);
        return rc == SQLITE_OK ? DB_OK : lite_rc(db, sqlite3_extended_errcode(db->lite));
    }
    PGresult *res = PQexec(db->pg, sql);
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    db_rc_t rc = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? DB_OK : pg_rc(db, res);
    PQclear(res);
    return rc;
}

/* "$12" -> "?12" for SQLite.  The ledger's SQL has no '$' anywhere else. */
static int to_sqlite_sql(const char *sql, char *out, size_t cap)
{
    size_t n = strlen(sql);
    if (n + 1 > cap)
        return -1;
    for (size_t i = 0; i <= n; i++)
        out[i] = (sql[i] == '$' && sql[i + 1] >= '0' && sql[i + 1] <= '9') ? '?' : sql[i];
    return 0;
}

static void fill_col(db_row_t *row, int c, const char *text)
{
    if (text == NULL)
        text = "";
    snprintf(row->text[c], DB_TEXT_MAX, "%s", text);
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    row->num[c] = (errno == 0 && end != text && *end == '\0') ? (int64_t)v : 0;
}

static db_rc_t lite_query(db_t *db, const char *sql, const db_arg_t *args, int n_args,
                          db_row_t *row, bool *found, int64_t *changes)
{
    char text[SQL_MAX];
    if (to_sqlite_sql(sql, text, sizeof text) != 0) {
        set_err(db, "statement too long", NULL);
        return DB_ERROR;
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->lite, text, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return lite_rc(db, sqlite3_extended_errcode(db->lite));
    for (int i = 0; i < n_args && rc == SQLITE_OK; i++)
        rc = args[i].s ? sqlite3_bind_text(st, i + 1, args[i].s, -1, SQLITE_TRANSIENT)
                       : sqlite3_bind_int64(st, i + 1, args[i].i);
    if (rc != SQLITE_OK) {
        db_rc_t r = lite_rc(db, rc);
        sqlite3_finalize(st);
        return r;
    }
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (found)
            *found = true;
        if (row) {
            int n = sqlite3_column_count(st);
            row->n_cols = n < DB_MAX_COLS ? n : DB_MAX_COLS;
            for (int c = 0; c < row->n_cols; c++)
                fill_col(row, c, (const char *)sqlite3_column_text(st, c));
        }
        /* drain, so that an UPDATE ... RETURNING finishes its work */
        while ((rc = sqlite3_step(st)) == SQLITE_ROW)
            ;
    }
    if (rc != SQLITE_DONE) {
        db_rc_t r = lite_rc(db, sqlite3_extended_errcode(db->lite));
        sqlite3_finalize(st);
        return r;
    }
    if (changes)
        *changes = sqlite3_changes64(db->lite);
    sqlite3_finalize(st);
    return DB_OK;
}

static db_rc_t pg_query(db_t *db, const char *sql, const db_arg_t *args, int n_args,
                        db_row_t *row, bool *found, int64_t *changes)
{
    char nums[DB_MAX_COLS * 2][24];
    const char *values[DB_MAX_COLS * 2];
    if (n_args > DB_MAX_COLS * 2) {
        set_err(db, "too many parameters", NULL);
        return DB_ERROR;
    }
    for (int i = 0; i < n_args; i++) {
        if (args[i].s) {
            values[i] = args[i].s;
        } else {
            snprintf(nums[i], sizeof nums[i], "%lld", (long long)args[i].i);
            values[i] = nums[i];
        }
    }
    PGresult *res = PQexecParams(db->pg, sql, n_args, NULL, values, NULL, NULL, 0);
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        db_rc_t r = pg_rc(db, res);
        PQclear(res);
        return r;
    }
    if (st == PGRES_TUPLES_OK && PQntuples(res) > 0) {
        if (found)
            *found = true;
        if (row) {
            int n = PQnfields(res);
            row->n_cols = n < DB_MAX_COLS ? n : DB_MAX_COLS;
            for (int c = 0; c < row->n_cols; c++)
                fill_col(row, c, PQgetisnull(res, 0, c) ? NULL : PQgetvalue(res, 0, c));
        }
    }
    if (changes) {
        const char *t = PQcmdTuples(res);
        *changes = (t && *t) ? strtoll(t, NULL, 10) : 0;
    }
    PQclear(res);
    return DB_OK;
}

db_rc_t db_query(db_t *db, const char *sql, const db_arg_t *args, int n_args, db_row_t *row,
                 bool *found, int64_t *changes)
{
    if (found)
        *found = false;
    if (changes)
        *changes = 0;
    if (row)
        memset(row, 0, sizeof *row);
    return db->kind == DB_SQLITE ? lite_query(db, sql, args, n_args, row, found, changes)
                                 : pg_query(db, sql, args, n_args, row, found, changes);
}

db_rc_t db_begin(db_t *db)
{
    return db_exec(db, db->kind == DB_SQLITE ? "BEGIN IMMEDIATE" : "BEGIN");
}

db_rc_t db_commit(db_t *db)
{
    return db_exec(db, "COMMIT");
}

void db_rollback(db_t *db)
{
    if (db->kind == DB_SQLITE) {
        if (!sqlite3_get_autocommit(db->lite))
            sqlite3_exec(db->lite, "ROLLBACK", NULL, NULL, NULL);
        return;
    }
    if (PQtransactionStatus(db->pg) != PQTRANS_IDLE) {
        PGresult *res = PQexec(db->pg, "ROLLBACK");
        PQclear(res);
    }
}

bool db_healthy(db_t *db, bool *was_reset)
{
    *was_reset = false;
    if (db->kind == DB_SQLITE)
        return true;
    if (PQstatus(db->pg) == CONNECTION_OK)
        return true;
    PQreset(db->pg);
    *was_reset = true;
    if (PQstatus(db->pg) != CONNECTION_OK) {
        set_err(db, "postgres", PQerrorMessage(db->pg));
        return false;
    }
    return db_exec(db, "SET client_min_messages = warning") == DB_OK;
}
