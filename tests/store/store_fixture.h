/* tests/store/store_fixture.h - a fresh store of each backend for a test
 * (test_lock.c, test_dedup.c).
 *
 * BACKEND_CASE(suite, name) { ... } defines one Criterion test per backend
 * (suite_memory, suite_lmdb, suite_redis, suite_postgres), each opening a
 * fresh empty store in `st` and closing it after: memory:, lmdb: in a
 * mkdtemp directory, Redis on $IDEM_TEST_REDIS_URL under a prefix of its
 * own, PostgreSQL on $IDEM_TEST_PG_URL in a table of its own.  A network
 * test FAILS (it does not skip) when its variable is unset, as the
 * conformance suite does: scripts/services.sh starts both servers.
 *
 * Time: Redis deletes a record at its expires_at by the wall clock, so every
 * backend's cases run at T0, a few seconds after the real time of setup, and
 * move forward from there by adding to it.
 */
#ifndef IDEM_TEST_STORE_FIXTURE_H
#define IDEM_TEST_STORE_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/store.h"

static idem_store_t *st;
static char fx_url[256];
static char fx_dir[64];          /* lmdb's directory, or "" */
static char fx_redis_prefix[64]; /* this test's Redis keys, or "" */
static char fx_pg_table[64];     /* this test's table, or "" */
static int64_t T0;

static int64_t fx_real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fx_open(void)
{
    char err[256] = "";
    T0 = (fx_real_ms() / 1000 + 5) * 1000;
    idem_err_t rc = idem_store_open(fx_url, &st, err, sizeof err);
    cr_assert_eq(rc, IDEM_OK, "open %s: %s (%s)", fx_url, idem_err_name(rc), err);
}

/* A fresh temporary directory in buf (64 bytes). */
static void fx_mkdtemp(char *buf)
{
    snprintf(buf, 64, "/tmp/idem-lock-test-XXXXXX");
    cr_assert_not_null(mkdtemp(buf), "mkdtemp: %s", strerror(errno));
}

static void fx_rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *de;
    char p[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            fx_rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(path);
}

/* A name unique to this process and moment, for a prefix or a table. */
static void fx_unique(char *buf, size_t len, const char *head, const char *tail)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(buf, len, "%s%d_%lx%s", head, (int)getpid(), (unsigned long)ts.tv_nsec, tail);
}

static const char *fx_env(const char *name)
{
    const char *v = getenv(name);
    cr_assert(v != NULL && v[0] != '\0',
              "%s is not set: start the servers with `scripts/services.sh start DIR` and "
              "export what it prints",
              name);
    return v;
}

static void setup_memory(void)
{
    snprintf(fx_url, sizeof fx_url, "memory:");
    fx_open();
}

static void setup_lmdb(void)
{
    fx_mkdtemp(fx_dir);
    snprintf(fx_url, sizeof fx_url, "lmdb:%s", fx_dir);
    fx_open();
}

static void setup_redis(void)
{
    const char *base = fx_env("IDEM_TEST_REDIS_URL");
    fx_unique(fx_redis_prefix, sizeof fx_redis_prefix, "idemlocktest:", ":");
    int n = snprintf(fx_url, sizeof fx_url, "%s%cprefix=%s", base,
                     strchr(base, '?') ? '&' : '?', fx_redis_prefix);
    cr_assert(n > 0 && (size_t)n < sizeof fx_url, "IDEM_TEST_REDIS_URL is too long");
    fx_open();
}

static void setup_postgres(void)
{
    const char *base = fx_env("IDEM_TEST_PG_URL");
    fx_unique(fx_pg_table, sizeof fx_pg_table, "idem_lt_", "");
    int n = snprintf(fx_url, sizeof fx_url, "%s%ctable=%s", base,
                     strchr(base, '?') ? '&' : '?', fx_pg_table);
    cr_assert(n > 0 && (size_t)n < sizeof fx_url, "IDEM_TEST_PG_URL is too long");
    fx_open();
}

/* Delete this test's Redis keys (never anything else on the shared server). */
static void fx_redis_cleanup(void)
{
    char host[256], pattern[80], cursor[32] = "0";
    int port = 0, db = 0;
    const char *base = getenv("IDEM_TEST_REDIS_URL");
    if (base == NULL || sscanf(base, "redis://%255[^:/]:%d/%d", host, &port, &db) < 2)
        return;
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err != 0) {
        redisFree(c);
        return;
    }
    freeReplyObject(redisCommand(c, "SELECT %d", db));
    snprintf(pattern, sizeof pattern, "%s*", fx_redis_prefix);
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++)
            freeReplyObject(redisCommand(c, "DEL %b", r->element[1]->element[i]->str,
                                         r->element[1]->element[i]->len));
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    redisFree(c);
}

static void fx_pg_quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static void fx_pg_drop(void)
{
    PGconn *c = PQconnectdb(getenv("IDEM_TEST_PG_URL"));
    if (PQstatus(c) == CONNECTION_OK) {
        char sql[128];
        PQsetNoticeProcessor(c, fx_pg_quiet, NULL);
        snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS \"%s\"", fx_pg_table);
        PQclear(PQexec(c, sql));
    }
    PQfinish(c);
}

static void teardown(void)
{
    idem_store_close(st);
    st = NULL;
    if (fx_dir[0] != '\0')
        fx_rm_tree(fx_dir);
    if (fx_redis_prefix[0] != '\0')
        fx_redis_cleanup();
    if (fx_pg_table[0] != '\0')
        fx_pg_drop();
    fx_dir[0] = fx_redis_prefix[0] = fx_pg_table[0] = '\0';
}

#define FX_TEST_FOR(suite, backend, name)                                          \
    Test(suite##_##backend, name, .init = setup_##backend, .fini = teardown)       \
    {                                                                              \
        name##_case();                                                             \
    }

#define BACKEND_CASE(suite, name)           \
    static void name##_case(void);          \
    FX_TEST_FOR(suite, memory, name)        \
    FX_TEST_FOR(suite, lmdb, name)          \
    FX_TEST_FOR(suite, redis, name)         \
    FX_TEST_FOR(suite, postgres, name)      \
    static void name##_case(void)

#endif /* IDEM_TEST_STORE_FIXTURE_H */
