/* tests/tx/tx_fixture.h - the databases the tx, fsm and dedup_tx tests run on.
 *
 * Each test runs in its own process (Criterion) on one backend: a fresh
 * SQLite file in a mkdtemp directory (removed by teardown), or the
 * PostgreSQL of IDEM_TEST_PG_URL with tables named after the process (the
 * test fails, it does not skip, when the variable is not set; teardown drops
 * the tables).  A TX_CASE is compiled into one test per backend.
 *
 * Connections (tconn_t) are the test's own, opened directly with sqlite3 or
 * libpq; the library under test only borrows them.
 */
#ifndef IDEM_TESTS_TX_FIXTURE_H
#define IDEM_TESTS_TX_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <libpq-fe.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/tx.h"

enum { BK_SQLITE = 1, BK_PG = 2 };

static int bk;                 /* this test's backend */
static char dir[64];           /* SQLite: the temporary directory */
static char dbpath[128];       /* SQLite: the database file */
static char table[64];         /* the key table */
static char biz[64];           /* a business table of the test's */

typedef struct tconn {
    sqlite3 *db;
    PGconn *pg;
} tconn_t;

static void pg_quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message; /* "table ... does not exist, skipping" */
}

static const char *pg_url(void)
{
    const char *u = getenv("IDEM_TEST_PG_URL");
    cr_assert(u != NULL && u[0] != '\0',
              "IDEM_TEST_PG_URL is not set: run `scripts/services.sh start DIR` and export "
              "what it prints (e.g. postgres://postgres@127.0.0.1:5441/idem_test)");
    return u;
}

/* Open a connection of this test's backend; 0 on failure (for threads). */
static int tconn_try_open(tconn_t *c)
{
    memset(c, 0, sizeof *c);
    if (bk == BK_SQLITE) {
        if (sqlite3_open_v2(dbpath, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
            SQLITE_OK) {
            sqlite3_close(c->db);
            c->db = NULL;
            return 0;
        }
        sqlite3_busy_timeout(c->db, 10000);
        sqlite3_exec(c->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
        return 1;
    }
    const char *u = getenv("IDEM_TEST_PG_URL");
    if (u == NULL)
        return 0;
    c->pg = PQconnectdb(u);
    if (PQstatus(c->pg) != CONNECTION_OK) {
        PQfinish(c->pg);
        c->pg = NULL;
        return 0;
    }
    PQsetNoticeProcessor(c->pg, pg_quiet, NULL);
    return 1;
}

static void tconn_open(tconn_t *c)
{
    if (bk == BK_PG)
        pg_url();
    cr_assert(tconn_try_open(c), "cannot open a connection to the %s database",
              bk == BK_PG ? "PostgreSQL" : "SQLite");
}

static void tconn_close(tconn_t *c)
{
    if (c->db != NULL)
        sqlite3_close(c->db);
    if (c->pg != NULL)
        PQfinish(c->pg);
    memset(c, 0, sizeof *c);
}

/* Run sql; 1 when it worked.  err (optional) gets the message. */
static int tconn_try(tconn_t *c, const char *sql, char *err, size_t errlen)
{
    if (c->db != NULL) {
        char *msg = NULL;
        int rc = sqlite3_exec(c->db, sql, NULL, NULL, &msg);
        if (err != NULL)
            snprintf(err, errlen, "%s", msg != NULL ? msg : "");
        sqlite3_free(msg);
        return rc == SQLITE_OK;
    }
    PGresult *r = PQexec(c->pg, sql);
    ExecStatusType s = PQresultStatus(r);
    if (err != NULL)
        snprintf(err, errlen, "%s", PQresultErrorMessage(r));
    PQclear(r);
    return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
}

static void tconn_sql(tconn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tconn_sql(tconn_t *c, const char *fmt, ...)
{
    char sql[1024], err[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    cr_assert(tconn_try(c, sql, err, sizeof err), "%s: %s", sql, err);
}

/* The first column of the first row, as a number (0 when NULL). */
static long long tconn_num(tconn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static long long tconn_num(tconn_t *c, const char *fmt, ...)
{
    char sql[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    long long v = 0;
    if (c->db != NULL) {
        sqlite3_stmt *st = NULL;
        cr_assert_eq(sqlite3_prepare_v2(c->db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                     sqlite3_errmsg(c->db));
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(c->db));
        v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return v;
    }
    PGresult *r = PQexec(c->pg, sql);
    cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s: %s", sql, PQresultErrorMessage(r));
    cr_assert_eq(PQntuples(r), 1, "%s", sql);
    v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* BEGIN IMMEDIATE (SQLite) or BEGIN (PostgreSQL, READ COMMITTED). */
static int tconn_begin(tconn_t *c)
{
    return tconn_try(c, c->db != NULL ? "BEGIN IMMEDIATE" : "BEGIN", NULL, 0);
}

static int tconn_commit(tconn_t *c)
{
    return tconn_try(c, "COMMIT", NULL, 0);
}

static void tconn_rollback(tconn_t *c)
{
    tconn_try(c, "ROLLBACK", NULL, 0);
}

static idem_tx_t *tconn_tx(tconn_t *c)
{
    idem_tx_t *tx = NULL;
    idem_err_t rc = c->db != NULL ? idem_tx_sqlite(c->db, table, &tx)
                                  : idem_tx_postgres(c->pg, table, &tx);
    cr_assert_eq(rc, IDEM_OK, "%s", idem_err_name(rc));
    return tx;
}

/* ---- fixtures ----------------------------------------------------------- */

static tconn_t C;     /* the test's main connection */
static idem_tx_t *T;  /* the handle on C */

static void name_tables(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(table, sizeof table, "idem_keys_t_%d_%lx", (int)getpid(),
             (unsigned long)(ts.tv_nsec & 0xfffff));
    snprintf(biz, sizeof biz, "idem_biz_t_%d_%lx", (int)getpid(),
             (unsigned long)(ts.tv_nsec & 0xfffff));
}

static void open_main(void)
{
    tconn_open(&C);
    T = tconn_tx(&C);
    idem_err_t rc = idem_tx_migrate(T);
    cr_assert_eq(rc, IDEM_OK, "migrate: %s %s", idem_err_name(rc), idem_tx_errstr(T));
    tconn_sql(&C, "CREATE TABLE \"%s\" (k TEXT NOT NULL, who TEXT NOT NULL)", biz);
}

static void setup_sqlite(void)
{
    bk = BK_SQLITE;
    snprintf(dir, sizeof dir, "/tmp/idem-tx-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(dbpath, sizeof dbpath, "%s/db.sqlite", dir);
    name_tables();
    open_main();
}

static void setup_pg(void)
{
    bk = BK_PG;
    dir[0] = '\0';
    name_tables();
    open_main();
}

static void rm_dir(void)
{
    if (dir[0] == '\0')
        return;
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *de;
        char p[PATH_MAX];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    dir[0] = '\0';
}

/* Extra tables a test made (dropped by teardown on PostgreSQL). */
static char extra_tables[4][64];
static int n_extra;

static void teardown(void)
{
    idem_tx_free(T);
    T = NULL;
    tconn_close(&C);
    if (bk == BK_PG && table[0] != '\0') {
        tconn_t c;
        if (tconn_try_open(&c)) {
            char sql[320];
            snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS \"%s\", \"%s\"", table, biz);
            tconn_try(&c, sql, NULL, 0);
            for (int i = 0; i < n_extra; i++) {
                snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS \"%s\"", extra_tables[i]);
                tconn_try(&c, sql, NULL, 0);
            }
            tconn_close(&c);
        }
    }
    rm_dir();
}

/* One case, two tests: Test(tx_sqlite, name) and Test(tx_postgres, name). */
#define TX_CASE(suite, name)                                                            \
    static void case_##name(void);                                                      \
    Test(suite##_sqlite, name, .init = setup_sqlite, .fini = teardown) { case_##name(); } \
    Test(suite##_postgres, name, .init = setup_pg, .fini = teardown) { case_##name(); }   \
    static void case_##name(void)

#endif /* IDEM_TESTS_TX_FIXTURE_H */
