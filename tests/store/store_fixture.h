/* tests/store/store_fixture.h - the one fixture of tests/store/ (store_fixture.c).
 *
 * Redis and PostgreSQL URLs from $IDEM_TEST_REDIS_URL / $IDEM_TEST_PG_URL (a
 * network test FAILS, it does not skip, when its variable is unset:
 * scripts/services.sh starts both servers) with a key prefix or table of the
 * test's own; direct connections that delete that prefix or drop that table
 * (never anything else on the shared servers); LMDB mkdtemp directories.
 * The primitives never assert, so test_store_faults.c may call them off the
 * Criterion thread; the fx_ calls below them fail the test instead.
 *
 * BACKEND_CASE(suite, name) { ... } defines one Criterion test per backend
 * (suite_memory, _lmdb, _rocksdb, _redis, _postgres), each with a fresh empty store in
 * `st`.  Redis deletes a record at its expires_at by the wall clock, so those
 * setups move T0 to a few seconds after the real time; until a setup moves
 * it, T0 is a fixed date (the conformance suite's memory: and lmdb:).
 */
#ifndef IDEM_TEST_STORE_FIXTURE_H
#define IDEM_TEST_STORE_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/store.h"

/* ---- primitives: no assertions ------------------------------------------- */

/* The wall clock in milliseconds. */
int64_t fx_real_ms(void);

/* The value of environment variable name.
 * @return it, or NULL when it is unset or empty */
const char *fx_getenv(const char *name);

/* A fresh private directory /tmp/idem-<name>-XXXXXX in buf.
 * @param buf  receives the path (len bytes, 64 are enough for a short name)
 * @return 0, or -1 with errno set (buf then holds no directory) */
int fx_make_dir(char *buf, size_t len, const char *name);

/* Remove path and everything below it; a missing path is no error. */
void fx_rm_tree(const char *path);

/* A name unique to this process and moment: head, pid, nanoseconds, tail. */
void fx_unique(char *buf, size_t len, const char *head, const char *tail);

/* The key id of key in the anonymous scope (the cases' usual one). */
idem_key_id_t fx_key(const char *key);

/* base with option param=value added ('?' or '&' as base needs), then extra
 * (more options, "&a=b..."; NULL for none).
 * @return 0, or -1 when it does not fit in len bytes */
int fx_url_with(char *out, size_t len, const char *base, const char *param, const char *value,
                const char *extra);

/* A direct connection (not through the store) to the server of
 * $IDEM_TEST_REDIS_URL (redis://host:port[/db], no password), its db
 * selected, with 5 s timeouts.  When the store URL is a rediss:// one,
 * $IDEM_TEST_REDIS_DIRECT_URL names the same server's plain port (hiredis
 * 0.14 has no TLS), and is used instead.
 * @return the connection (redisFree it), or NULL when the variable is unset
 *         or not of that form, or the server does not answer */
redisContext *fx_redis_connect(void);

/* Delete every key starting with prefix on the server of $IDEM_TEST_REDIS_URL;
 * nothing when prefix is empty or the server cannot be reached. */
void fx_redis_delete_prefix(const char *prefix);

/* A direct libpq connection to $IDEM_TEST_PG_URL, its notices silenced.
 * @return the connection (PQfinish it; check PQstatus), or NULL when the
 *         variable is unset */
PGconn *fx_pg_connect(void);

/* DROP TABLE IF EXISTS table on the server of $IDEM_TEST_PG_URL; nothing
 * when table is empty or the server cannot be reached. */
void fx_pg_drop(const char *table);

/* ---- on a Criterion test's thread: failures fail the test ---------------- */

/* $name, failing the test with how to start the servers when it is unset. */
const char *fx_env(const char *name);

/* fx_make_dir that fails the test when mkdtemp fails. */
void fx_mkdtemp(char *buf, size_t len, const char *name);

/* Open url into st, failing the test on any error. */
void fx_open_url(const char *url);

/* Move T0 to a whole second a few seconds after the real time. */
void fx_t0_from_clock(void);

/* ---- BACKEND_CASE ------------------------------------------------------- */

extern idem_store_t *st;         /* the test's store */
extern int64_t fx_t0;            /* the cases' time */
extern char fx_url[256];         /* st's URL */
extern char fx_dir[64];          /* lmdb's or rocksdb's directory, or "" */
extern char fx_redis_prefix[64]; /* this test's Redis keys, or "" */
extern char fx_pg_table[64];     /* this test's table, or "" */

#define T0 fx_t0

/* The setups of each backend (a fresh empty store in st at T0 on the
 * clock) and the one teardown (closes st, deletes what the setup made). */
void fx_setup_memory(void);
void fx_setup_lmdb(void);
void fx_setup_rocksdb(void);
void fx_setup_redis(void);
void fx_setup_postgres(void);
void fx_teardown(void);

/* Claim op (its id and fingerprint set by the caller) at T0 with a lease of
 * lease ms and a retention of keep ms, failing the test unless it worked:
 * a record that some other module wrote. */
void fx_claim_at_t0(idem_op_t *op, int64_t lease, int64_t keep);

#define FX_THREADS_MAX 64

/* Run fn(NULL) on n threads at once (n <= FX_THREADS_MAX) and wait for all. */
void fx_run_threads(int n, void *(*fn)(void *));

#define FX_TEST_FOR(suite, backend, name)                                          \
    Test(suite##_##backend, name, .init = fx_setup_##backend, .fini = fx_teardown) \
    {                                                                              \
        name##_case();                                                             \
    }

#define BACKEND_CASE(suite, name)      \
    static void name##_case(void);     \
    FX_TEST_FOR(suite, memory, name)   \
    FX_TEST_FOR(suite, lmdb, name)     \
    FX_TEST_FOR(suite, rocksdb, name)  \
    FX_TEST_FOR(suite, redis, name)    \
    FX_TEST_FOR(suite, postgres, name) \
    static void name##_case(void)

#endif /* IDEM_TEST_STORE_FIXTURE_H */
