/* tests/store/store_fixture.c - the fixture of tests/store/, compiled into
 * each of its executables; store_fixture.h describes it. */
#include "store_fixture.h"

idem_store_t *st;
int64_t fx_t0 = 1700000000000ll;
char fx_url[256];
char fx_dir[64];
char fx_redis_prefix[64];
char fx_pg_table[64];

/* ---- primitives ---------------------------------------------------------- */

int64_t fx_real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *fx_getenv(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

int fx_make_dir(char *buf, size_t len, const char *name)
{
    int n = snprintf(buf, len, "/tmp/idem-%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        errno = ENAMETOOLONG;
        return -1;
    }
    if (mkdtemp(buf) == NULL) {
        int e = errno;
        buf[0] = '\0';
        errno = e;
        return -1;
    }
    return 0;
}

void fx_rm_tree(const char *path)
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

void fx_unique(char *buf, size_t len, const char *head, const char *tail)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(buf, len, "%s%d_%lx%s", head, (int)getpid(), (unsigned long)ts.tv_nsec, tail);
}

idem_key_id_t fx_key(const char *key)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "anonymous");
    snprintf(id.key, sizeof id.key, "%s", key);
    return id;
}

int fx_url_with(char *out, size_t len, const char *base, const char *param, const char *value,
                const char *extra)
{
    int n = snprintf(out, len, "%s%c%s=%s%s", base, strchr(base, '?') ? '&' : '?', param, value,
                     extra != NULL ? extra : "");
    return n > 0 && (size_t)n < len ? 0 : -1;
}

redisContext *fx_redis_connect(void)
{
    char host[256];
    int port = 0, db = 0;
    /* A rediss:// store URL: the same server's plain port, for hiredis. */
    const char *base = fx_getenv("IDEM_TEST_REDIS_DIRECT_URL");
    if (base == NULL)
        base = fx_getenv("IDEM_TEST_REDIS_URL");
    if (base == NULL || sscanf(base, "redis://%255[^:/]:%d/%d", host, &port, &db) < 2)
        return NULL;
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err != 0) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "SELECT %d", db);
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

void fx_redis_delete_prefix(const char *prefix)
{
    if (prefix[0] == '\0')
        return;
    redisContext *c = fx_redis_connect();
    if (c == NULL)
        return;
    char cursor[32] = "0";
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s* COUNT 1000", cursor, prefix);
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
    (void)message; /* "table ... does not exist, skipping" */
}

PGconn *fx_pg_connect(void)
{
    const char *u = fx_getenv("IDEM_TEST_PG_URL");
    if (u == NULL)
        return NULL;
    PGconn *c = PQconnectdb(u);
    if (c != NULL)
        PQsetNoticeProcessor(c, fx_pg_quiet, NULL);
    return c;
}

void fx_pg_drop(const char *table)
{
    if (table[0] == '\0')
        return;
    PGconn *c = fx_pg_connect();
    if (c != NULL && PQstatus(c) == CONNECTION_OK) {
        char sql[128];
        snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS \"%s\"", table);
        PQclear(PQexec(c, sql));
    }
    PQfinish(c);
}

/* ---- with assertions ----------------------------------------------------- */

const char *fx_env(const char *name)
{
    const char *v = fx_getenv(name);
    cr_assert(v != NULL,
              "%s is not set: start the servers with `scripts/services.sh start DIR` and "
              "export what it prints",
              name);
    return v;
}

void fx_mkdtemp(char *buf, size_t len, const char *name)
{
    cr_assert_eq(fx_make_dir(buf, len, name), 0, "mkdtemp: %s", strerror(errno));
}

void fx_open_url(const char *url)
{
    char err[256] = "";
    idem_err_t rc = idem_store_open(url, &st, err, sizeof err);
    cr_assert_eq(rc, IDEM_OK, "open %s: %s (%s)", url, idem_err_name(rc), err);
}

void fx_t0_from_clock(void)
{
    fx_t0 = (fx_real_ms() / 1000 + 5) * 1000;
}

/* ---- BACKEND_CASE -------------------------------------------------------- */

static void fx_open(void)
{
    fx_t0_from_clock();
    fx_open_url(fx_url);
}

void fx_setup_memory(void)
{
    snprintf(fx_url, sizeof fx_url, "memory:");
    fx_open();
}

void fx_setup_lmdb(void)
{
    fx_mkdtemp(fx_dir, sizeof fx_dir, "lock-test");
    snprintf(fx_url, sizeof fx_url, "lmdb:%s", fx_dir);
    fx_open();
}

void fx_setup_rocksdb(void)
{
    fx_mkdtemp(fx_dir, sizeof fx_dir, "lock-test");
    snprintf(fx_url, sizeof fx_url, "rocksdb:%s", fx_dir);
    fx_open();
}

/* A network store: the URL in $var with param=<a name of this test's own>. */
static void fx_setup_network(const char *var, const char *param, char *name, size_t name_len,
                             const char *head, const char *tail)
{
    const char *base = fx_env(var);
    fx_unique(name, name_len, head, tail);
    cr_assert_eq(fx_url_with(fx_url, sizeof fx_url, base, param, name, NULL), 0, "%s is too long",
                 var);
    fx_open();
}

void fx_setup_redis(void)
{
    fx_setup_network("IDEM_TEST_REDIS_URL", "prefix", fx_redis_prefix, sizeof fx_redis_prefix,
                     "idemlocktest:", ":");
}

void fx_setup_postgres(void)
{
    fx_setup_network("IDEM_TEST_PG_URL", "table", fx_pg_table, sizeof fx_pg_table, "idem_lt_",
                     "");
}

void fx_teardown(void)
{
    idem_store_close(st);
    st = NULL;
    if (fx_dir[0] != '\0')
        fx_rm_tree(fx_dir);
    fx_redis_delete_prefix(fx_redis_prefix);
    fx_pg_drop(fx_pg_table);
    fx_dir[0] = fx_redis_prefix[0] = fx_pg_table[0] = '\0';
}

void fx_claim_at_t0(idem_op_t *op, int64_t lease, int64_t keep)
{
    op->now_ms = T0;
    op->lease_until_ms = T0 + lease;
    op->expires_at_ms = T0 + keep;
    cr_assert_eq(idem_store_claim(st, op), IDEM_OK);
}

void fx_run_threads(int n, void *(*fn)(void *))
{
    pthread_t t[FX_THREADS_MAX];
    cr_assert(n > 0 && n <= FX_THREADS_MAX, "%d threads", n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fn, NULL), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}
