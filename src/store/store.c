/* src/store/store.c - the one store API over every backend.
 *
 * idem_store_open picks a backend by the URL's scheme from a table (one line
 * per scheme: "memory:", "lmdb:", "rocksdb:", "redis:", "redis+sentinel:", "rediss:",
 * "rediss+sentinel:", "redis+cluster:", "rediss+cluster:", "postgres:", "postgresql:")
 * and hands it the rest of the URL.  RocksDB,
 * Redis and PostgreSQL are optional parts of the build (meson_options.txt):
 * a scheme whose backend
 * was left out is still known by name, so its URL is refused with a sentence
 * saying so rather than as an unknown scheme.  Every other public function
 * checks its arguments once here and calls through the backend's vtable, so
 * backends see only well-formed calls (see store_impl.h for exactly what is
 * checked).  The conveniences (claim, complete, release, renew, delete) are
 * batches of one op.
 *
 * The semantics of each op on a stored record are written once, in
 * idem__store_apply, on top of idem_decide: a backend that decides in C
 * reads the current value inside its transaction, calls it, and writes what
 * it says.  That is how memory and LMDB (and later PostgreSQL) cannot
 * disagree.
 *
 * Error details: idem__store_seterr writes a thread-local buffer tagged with
 * the store it belongs to, so idem_store_errstr(store) gives the detail of
 * the last failure of that store in the calling thread, or "".
 *
 * I/O fault injection for tests (idem__store_fail_io_after, store_impl.h)
 * keeps its counter here; the backends call idem__store_io_fault() at each
 * of their I/O points.
 *
 * THREADING: nothing here has shared mutable state except the thread-local
 * error buffer and the atomic fault-injection counters; see each backend
 * for its locking.
 */
#include "store/store_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/url.h"
#include "idem/alloc.h"
#include "idem/units.h"

static const struct idem_store_ops *const backends[] = {
    &idem__store_memory_ops,
    &idem__store_lmdb_ops,
#if IDEM_HAVE_ROCKSDB
    &idem__store_rocksdb_ops,
#endif
#if IDEM_HAVE_REDIS
    &idem__store_redis_ops,
    &idem__store_redis_sentinel_ops,
    &idem__store_rediss_ops,
    &idem__store_rediss_sentinel_ops,
    &idem__store_redis_cluster_ops,
    &idem__store_rediss_cluster_ops,
#endif
#if IDEM_HAVE_POSTGRES
    &idem__store_postgres_ops,
    &idem__store_postgresql_ops,
#endif
};

/* The schemes of the backends this build left out, and the meson option
 * that builds each. */
static const struct {
    const char *scheme, *form, *name, *library, *option;
} absent_backends[] = {
#if !IDEM_HAVE_ROCKSDB
    {"rocksdb", ":", "RocksDB", "librocksdb", "rocksdb"},
#endif
#if !IDEM_HAVE_REDIS
    {"redis", "://", "Redis", "hiredis", "redis"},
    {"redis+sentinel", "://", "Redis", "hiredis", "redis"},
    {"rediss", "://", "Redis", "hiredis", "redis"},
    {"rediss+sentinel", "://", "Redis", "hiredis", "redis"},
    {"redis+cluster", "://", "Redis", "hiredis", "redis"},
    {"rediss+cluster", "://", "Redis", "hiredis", "redis"},
#endif
#if !IDEM_HAVE_POSTGRES
    {"postgres", "://", "PostgreSQL", "libpq", "postgres"},
    {"postgresql", "://", "PostgreSQL", "libpq", "postgres"},
#endif
    {NULL, NULL, NULL, NULL, NULL},
};

#define SCHEME_MAX 32

static _Thread_local struct {
    const idem_store_t *owner; /* the store the text belongs to */
    char text[256];
} tls_err;

/* ---- helpers for backends ----------------------------------------------- */

void idem__store_seterr(idem_store_t *store, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_err.text, sizeof tls_err.text, fmt, ap);
    va_end(ap);
    tls_err.owner = store;
}

int64_t idem__store_wait_for_lease(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                                   int64_t retry_after_s)
{
    idem_record_t rec;
    int64_t wait = retry_after_s * 1000;
    if (idem_store_get(store, id, now_ms, &rec) == IDEM_OK) {
        if (rec.state == IDEM_STATE_IN_PROGRESS && rec.lease_until_ms > now_ms &&
            (rec.flags & IDEM_REC_HELD) == 0)
            wait = rec.lease_until_ms - now_ms;
        idem_record_cleanup(&rec);
    }
    return wait >= 1 ? wait : 1;
}

void idem__store_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
{
    if (errbuf == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

size_t idem__store_key(const idem_key_id_t *id, char *buf)
{
    size_t sl = strlen(id->scope), kl = strlen(id->key);
    memcpy(buf, id->scope, sl);
    buf[sl] = '\0';
    memcpy(buf + sl + 1, id->key, kl);
    return sl + 1 + kl;
}

void idem__store_split(const char *rest, size_t *path_len, const char **query)
{
    const char *q = strchr(rest, '?');
    if (q == NULL) {
        *path_len = strlen(rest);
        *query = rest + *path_len;
    } else {
        *path_len = (size_t)(q - rest);
        *query = q + 1;
    }
}

int idem__store_next_opt(const char **query, char *name, char *value, char *errbuf,
                         size_t errlen)
{
    idem__url_param_t p;
    if (!idem__url_next_param(query, NULL, &p)) /* core/url.c */
        return 0;
    if (!p.has_value || p.name_len == 0) {
        idem__store_errbuf(errbuf, errlen, "store URL option \"%.*s\" is not name=value",
                           (int)(p.item_len > 64 ? 64 : p.item_len), p.item);
        return -1;
    }
    if (p.name_len > IDEM_STORE_OPT_MAX || p.value_len > IDEM_STORE_OPT_MAX) {
        idem__store_errbuf(errbuf, errlen, "store URL option \"%.*s\" is too long",
                           (int)(p.name_len > 64 ? 64 : p.name_len), p.name);
        return -1;
    }
    memcpy(name, p.name, p.name_len);
    name[p.name_len] = '\0';
    memcpy(value, p.value, p.value_len);
    value[p.value_len] = '\0';
    return 1;
}

/* ---- I/O fault injection (store_impl.h) ----------------------------------- */

atomic_ulong idem__store_sweep_visits;
atomic_int idem__store_io_armed;
static atomic_int io_sticky;     /* every I/O after the nth fails too */
static atomic_long io_left;      /* I/Os still allowed before the fault */
static atomic_ulong io_injected; /* faults injected so far */

static void io_arm(long n, int sticky)
{
    if (n <= 0) {
        atomic_store(&idem__store_io_armed, 0);
        return;
    }
    atomic_store(&io_sticky, sticky);
    atomic_store(&io_left, n - 1);
    atomic_store(&idem__store_io_armed, 1);
}

void idem__store_fail_io_after(long n)
{
    io_arm(n, 0);
}

void idem__store_fail_io_from(long n)
{
    io_arm(n, 1);
}

unsigned long idem__store_io_injected(void)
{
    return atomic_load(&io_injected);
}

bool idem__store_io_fault_slow(void)
{
    /* Exactly one caller sees 0; below it the fault has fired already.  A
     * long cannot wrap in any test's lifetime. */
    long left = atomic_fetch_sub(&io_left, 1);
    if (left > 0 || (left < 0 && !atomic_load(&io_sticky)))
        return false;
    if (!atomic_load(&io_sticky))
        atomic_store(&idem__store_io_armed, 0);
    atomic_fetch_add(&io_injected, 1);
    return true;
}

/* ---- the semantics of one op --------------------------------------------- */

/* The fenced ops' common check; head is the decoded head of cur. */
static int owns(idem_op_t *op, const uint8_t *cur, size_t cur_len, idem_record_t *head)
{
    if (cur == NULL) {
        op->err = IDEM_E_FENCE;
        return 0;
    }
    if (idem_record_decode_head(cur, cur_len, head) != IDEM_OK) {
        op->err = IDEM_E_CORRUPT;
        return 0;
    }
    if (head->state != IDEM_STATE_IN_PROGRESS || head->fence != op->fence) {
        op->err = IDEM_E_FENCE;
        return 0;
    }
    return 1;
}

/* The TOKEN_* ops (see store_impl.h). */
static idem__store_action_t apply_token(idem_op_t *op, const uint8_t *cur, size_t cur_len,
                                        idem_record_t *next)
{
    idem_record_t head;
    const idem_record_t *rec = NULL;

    if (cur != NULL) {
        if (idem_record_decode_head(cur, cur_len, &head) == IDEM_OK) {
            rec = &head;
        } else if (op->kind != IDEM_OP_TOKEN_ISSUE) {
            op->err = IDEM_E_CORRUPT;
            return IDEM__STORE_KEEP;
        }
    }
    switch (op->kind) {
    case IDEM_OP_TOKEN_ISSUE:
        if (rec != NULL && op->now_ms < rec->expires_at_ms) {
            op->err = IDEM_E_EXISTS;
            return IDEM__STORE_KEEP;
        }
        next->state = IDEM_STATE_IN_PROGRESS;
        next->flags = IDEM_REC_TOKEN;
        next->fence = 1;
        next->lease_until_ms = op->expires_at_ms;
        next->expires_at_ms = op->expires_at_ms;
        return IDEM__STORE_PUT;
    case IDEM_OP_TOKEN_USE:
        op->token = idem_token_decide(rec, op->now_ms);
        if (op->token != IDEM_TOKEN_FIRST_USE)
            return IDEM__STORE_KEEP;
        *next = head;
        next->state = IDEM_STATE_COMPLETED;
        return IDEM__STORE_PUT;
    default: /* IDEM_OP_TOKEN_RESTORE */
        if (idem_token_decide(rec, op->now_ms) != IDEM_TOKEN_USED) {
            op->err = IDEM_E_FENCE;
            return IDEM__STORE_KEEP;
        }
        *next = head;
        next->state = IDEM_STATE_IN_PROGRESS;
        return IDEM__STORE_PUT;
    }
}

idem__store_action_t idem__store_apply(idem_op_t *op, const uint8_t *cur, size_t cur_len,
                                       idem_record_t *next)
{
    idem_record_t head;

    memset(next, 0, sizeof *next);
    switch ((int)op->kind) { /* int: IDEM__OP_DELETE_IF is not in the enum */
    case IDEM_OP_CLAIM:
        if (cur != NULL && idem_record_decode_head(cur, cur_len, &head) != IDEM_OK) {
            op->err = IDEM_E_CORRUPT;
            return IDEM__STORE_KEEP;
        }
        op->decision = idem_decide(cur ? &head : NULL, op->fp, op->now_ms);
        if (idem_decision_forwards(op->decision.kind)) {
            next->state = IDEM_STATE_IN_PROGRESS;
            memcpy(next->fingerprint, op->fp, IDEM_FP_LEN);
            next->fence = op->decision.fence;
            next->lease_until_ms = op->lease_until_ms;
            next->expires_at_ms = op->expires_at_ms;
            return IDEM__STORE_PUT;
        }
        if (op->decision.kind == IDEM_DECIDE_RECONCILE) {
            /* The hold stays, with its retention; the lease and fence are
             * the claimant's, who asks the upstream what happened. */
            *next = head;
            next->fence = op->decision.fence;
            next->lease_until_ms = op->lease_until_ms;
            return IDEM__STORE_PUT;
        }
        if (op->decision.kind == IDEM_DECIDE_REPLAY)
            op->err = idem_record_decode(cur, cur_len, &op->record);
        return IDEM__STORE_KEEP;

    case IDEM_OP_COMPLETE:
        if (!owns(op, cur, cur_len, &head))
            return IDEM__STORE_KEEP;
        *next = head;
        next->state = IDEM_STATE_COMPLETED;
        next->flags = op->flags;
        next->lease_until_ms = 0;
        next->expires_at_ms = op->expires_at_ms;
        next->response = *op->response;
        return IDEM__STORE_PUT;

    case IDEM_OP_HOLD:
        if (!owns(op, cur, cur_len, &head))
            return IDEM__STORE_KEEP;
        *next = head;
        next->flags |= IDEM_REC_HELD;
        next->lease_until_ms = op->lease_until_ms;
        next->expires_at_ms = op->expires_at_ms;
        return IDEM__STORE_PUT;

    case IDEM_OP_RENEW:
        if (!owns(op, cur, cur_len, &head))
            return IDEM__STORE_KEEP;
        *next = head;
        next->lease_until_ms = op->lease_until_ms;
        if (next->expires_at_ms < op->lease_until_ms)
            next->expires_at_ms = op->lease_until_ms;
        return IDEM__STORE_PUT;

    case IDEM_OP_RELEASE:
        return owns(op, cur, cur_len, &head) ? IDEM__STORE_DEL : IDEM__STORE_KEEP;

    case IDEM_OP_DELETE:
        if (cur == NULL) {
            op->err = IDEM_E_NOTFOUND;
            return IDEM__STORE_KEEP;
        }
        return IDEM__STORE_DEL;

    case IDEM__OP_DELETE_IF:
        if (cur == NULL) {
            op->err = IDEM_E_FENCE;
            return IDEM__STORE_KEEP;
        }
        if (idem_record_decode_head(cur, cur_len, &head) != IDEM_OK) {
            op->err = IDEM_E_CORRUPT;
            return IDEM__STORE_KEEP;
        }
        if (head.fence != op->fence || (uint32_t)head.state != op->flags ||
            (head.flags & IDEM_REC_TOKEN)) {
            op->err = IDEM_E_FENCE;
            return IDEM__STORE_KEEP;
        }
        return IDEM__STORE_DEL;

    case IDEM_OP_TOKEN_ISSUE:
    case IDEM_OP_TOKEN_USE:
    case IDEM_OP_TOKEN_RESTORE:
        return apply_token(op, cur, cur_len, next);
    }
    op->err = IDEM_E_INVAL; /* store.c refuses unknown kinds; never reached */
    return IDEM__STORE_KEEP;
}

/* ---- argument checks ---------------------------------------------------- */

static int id_ok(const idem_key_id_t *id)
{
    return id->scope[0] != '\0' && id->key[0] != '\0' &&
           memchr(id->scope, '\0', sizeof id->scope) != NULL &&
           memchr(id->key, '\0', sizeof id->key) != NULL;
}

static idem_err_t check_op(const idem_op_t *op)
{
    if (op->kind < IDEM_OP_CLAIM || op->kind > IDEM_OP_TOKEN_RESTORE || !id_ok(&op->id))
        return IDEM_E_INVAL;
    if (op->kind == IDEM_OP_COMPLETE) {
        const idem_response_t *r = op->response;
        if (r == NULL || (op->flags & ~IDEM_REC_NOT_RETAINED) != 0 ||
            (r->n_headers > 0 && r->headers == NULL) || (r->body_len > 0 && r->body == NULL) ||
            r->status < 0)
            return IDEM_E_INVAL;
        idem_record_t probe = {.response = *r};
        if (idem_record_encoded_size(&probe) == 0)
            return IDEM_E_TOOBIG;
    }
    return IDEM_OK;
}

/* ---- the public API ----------------------------------------------------- */

/* Open (out != NULL) or only check (out == NULL) a store URL: each backend's
 * open parses everything first and stops there when out is NULL. */
static idem_err_t open_or_check(const char *url, idem_store_t **out, char *errbuf, size_t errlen)
{
    if (out != NULL)
        *out = NULL;
    if (errbuf != NULL && errlen > 0)
        errbuf[0] = '\0';
    if (url == NULL) {
        idem__store_errbuf(errbuf, errlen, "no store URL given");
        return IDEM_E_INVAL;
    }
    const char *colon = strchr(url, ':');
    if (colon == NULL || colon == url || colon - url > SCHEME_MAX) {
        idem__store_errbuf(errbuf, errlen,
                           "store URL \"%.64s\" has no scheme (expected lmdb:PATH, rocksdb:PATH, redis://, "
                           "redis+sentinel://, postgres:// or memory:)",
                           url);
        return IDEM_E_INVAL;
    }
    size_t sl = (size_t)(colon - url);
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        const struct idem_store_ops *ops = backends[i];
        if (strlen(ops->scheme) == sl && memcmp(ops->scheme, url, sl) == 0) {
            idem_err_t err = ops->open(colon + 1, out, errbuf, errlen);
            /* A backend out of memory may not have said so in words. */
            if (err != IDEM_OK && errbuf != NULL && errlen > 0 && errbuf[0] == '\0')
                idem__store_errbuf(errbuf, errlen, "store %s: %s", ops->name,
                                   idem_strerror(err));
            return err;
        }
    }
    for (size_t i = 0; absent_backends[i].scheme != NULL; i++) {
        if (strlen(absent_backends[i].scheme) == sl &&
            memcmp(absent_backends[i].scheme, url, sl) == 0) {
            idem__store_errbuf(errbuf, errlen,
                               "%.*s%s URLs need the %s store, which this build of idem left "
                               "out (built without %s; rebuild with it, or meson -D%s=enabled)",
                               (int)sl, url, absent_backends[i].form, absent_backends[i].name,
                               absent_backends[i].library,
                               absent_backends[i].option);
            return IDEM_E_UNSUPPORTED;
        }
    }
    idem__store_errbuf(errbuf, errlen,
                       "unknown store scheme \"%.*s\" (this build knows lmdb:%s%s%s and memory:)",
                       (int)sl, url, IDEM_HAVE_ROCKSDB ? ", rocksdb:" : "",
                       IDEM_HAVE_REDIS ? ", redis://, redis+sentinel://, rediss://, rediss+sentinel://, "
                                         "redis+cluster://, rediss+cluster://" : "",
                       IDEM_HAVE_POSTGRES ? ", postgres://, postgresql://" : "");
    return IDEM_E_INVAL;
}

idem_err_t idem_store_open(const char *url, idem_store_t **out, char *errbuf, size_t errlen)
{
    if (out == NULL) {
        idem__store_errbuf(errbuf, errlen, "no place for the store was given");
        return IDEM_E_INVAL;
    }
    return open_or_check(url, out, errbuf, errlen);
}

idem_err_t idem_store_check_url(const char *url, char *errbuf, size_t errlen)
{
    return open_or_check(url, NULL, errbuf, errlen);
}

void idem_store_close(idem_store_t *store)
{
    if (store != NULL) {
        idem_store_unwatch(store); /* its session uses the store */
        store->ops->close(store);
    }
}

idem_err_t idem_store_exec(idem_store_t *store, idem_op_t *ops, size_t n)
{
    if (n == 0)
        return IDEM_OK;
    if (ops == NULL)
        return IDEM_E_INVAL;

    idem_err_t err = IDEM_OK;
    if (store == NULL || n > IDEM_STORE_BATCH_MAX)
        err = IDEM_E_INVAL;
    size_t valid = 0;
    for (size_t i = 0; i < n; i++) {
        ops[i].err = err == IDEM_OK ? check_op(&ops[i]) : err;
        memset(&ops[i].decision, 0, sizeof ops[i].decision);
        memset(&ops[i].record, 0, sizeof ops[i].record);
        ops[i].token = IDEM_TOKEN_NONE;
        valid += ops[i].err == IDEM_OK;
    }
    if (err != IDEM_OK)
        return err;
    if (valid == 0)
        return IDEM_OK; /* nothing to apply: no transaction needed */

    err = store->ops->exec(store, ops, n);
    if (err != IDEM_OK) {
        for (size_t i = 0; i < n; i++) {
            idem_record_cleanup(&ops[i].record);
            memset(&ops[i].decision, 0, sizeof ops[i].decision);
            ops[i].token = IDEM_TOKEN_NONE;
            ops[i].err = err;
        }
    }
    return err;
}

idem_err_t idem_store_get(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                          idem_record_t *rec)
{
    memset(rec, 0, sizeof *rec);
    if (store == NULL || id == NULL || !id_ok(id))
        return IDEM_E_INVAL;
    return store->ops->get(store, id, now_ms, rec);
}

idem_err_t idem_store_sweep(idem_store_t *store, int64_t now_ms, size_t max, size_t *removed)
{
    *removed = 0;
    if (store == NULL)
        return IDEM_E_INVAL;
    if (max == 0)
        return IDEM_OK;
    return store->ops->sweep(store, now_ms, max, removed);
}

idem_err_t idem_store_ping(idem_store_t *store)
{
    return store == NULL ? IDEM_E_INVAL : store->ops->ping(store);
}

idem_err_t idem__store_dir(const char *scheme, const char *rest, char *dir, size_t dirlen,
                           const char **query, char *errbuf, size_t errlen)
{
    size_t path_len;
    idem__store_split(rest, &path_len, query);
    if (path_len == 0) {
        idem__store_errbuf(errbuf, errlen, "store URL %s: needs a directory (%s:PATH)", scheme,
                           scheme);
        return IDEM_E_INVAL;
    }
    if (path_len >= dirlen) {
        idem__store_errbuf(errbuf, errlen, "%s store path is longer than %zu bytes", scheme,
                           dirlen - 1);
        return IDEM_E_INVAL;
    }
    memcpy(dir, rest, path_len);
    dir[path_len] = '\0';
    return IDEM_OK;
}

int idem__store_sync_opt(const char *scheme, const char *value, int *nosync, char *errbuf,
                         size_t errlen)
{
    if (strcmp(value, "always") == 0 || strcmp(value, "interval") == 0) {
        *nosync = value[0] == 'i';
        return 0;
    }
    idem__store_errbuf(errbuf, errlen, "%s store option sync=%s: expected always or interval",
                       scheme, value);
    return -1;
}

int idem__store_size_opt(const char *store, const char *name, const char *value, uint64_t lo,
                         uint64_t hi, const char *range, uint64_t *out, char *errbuf,
                         size_t errlen)
{
    uint64_t v;
    if (idem_parse_size(value, &v) != IDEM_OK || v < lo || v > hi) {
        idem__store_errbuf(errbuf, errlen, "%s store option %s=%s: expected a size %s", store,
                           name, value, range);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- the flusher (sync=interval) ---------------------------------------- */

static void *flusher_main(void *arg)
{
    idem__flusher_t *f = arg;
    struct timespec at;

    pthread_mutex_lock(&f->lock);
    clock_gettime(CLOCK_MONOTONIC, &at);
    while (!f->stopping) {
        at.tv_nsec += f->interval_ns;
        while (at.tv_nsec >= 1000000000L) {
            at.tv_sec++;
            at.tv_nsec -= 1000000000L;
        }
        while (!f->stopping && pthread_cond_timedwait(&f->cond, &f->lock, &at) != ETIMEDOUT)
            ;
        pthread_mutex_unlock(&f->lock);
        atomic_store(&f->failed, f->flush(f->arg) != 0); /* also once more when stopping */
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

int idem__flusher_start(idem__flusher_t *f, long interval_ns, int (*flush)(void *arg),
                        void *arg)
{
    pthread_condattr_t ca;

    f->stopping = 0;
    f->interval_ns = interval_ns;
    f->flush = flush;
    f->arg = arg;
    atomic_init(&f->failed, 0);
    pthread_mutex_init(&f->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* a wall-clock step cannot stretch a wait */
    pthread_cond_init(&f->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&f->thread, NULL, flusher_main, f) != 0) {
        pthread_cond_destroy(&f->cond);
        pthread_mutex_destroy(&f->lock);
        return -1;
    }
    return 0;
}

void idem__flusher_stop(idem__flusher_t *f)
{
    pthread_mutex_lock(&f->lock);
    f->stopping = 1;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->thread, NULL);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
}

idem_err_t idem_store_space(idem_store_t *store, idem_store_space_t *out)
{
    if (out != NULL)
        memset(out, 0, sizeof *out); /* zero on every failure too */
    if (store == NULL || out == NULL)
        return IDEM_E_INVAL;
    return store->ops->space == NULL ? IDEM_E_UNSUPPORTED : store->ops->space(store, out);
}

bool idem_store_exec_is_cheap(const idem_store_t *store)
{
    return store != NULL && store->exec_is_cheap;
}

bool idem_store_reads_are_local(const idem_store_t *store)
{
    return store != NULL && store->reads_are_local;
}

const char *idem_store_name(const idem_store_t *store)
{
    return store == NULL ? "none" : store->ops->name;
}

const char *idem_store_errstr(idem_store_t *store)
{
    if (store == NULL)
        return "";
    if (store->ops->errstr != NULL)
        return store->ops->errstr(store);
    return tls_err.owner == store ? tls_err.text : "";
}

/* ---- conveniences: batches of one --------------------------------------- */

static idem_err_t one(idem_store_t *store, idem_op_t *op)
{
    idem_err_t err = idem_store_exec(store, op, 1);
    return err != IDEM_OK ? err : op->err;
}

idem_err_t idem_store_claim(idem_store_t *store, idem_op_t *op)
{
    op->kind = IDEM_OP_CLAIM;
    return one(store, op);
}

static void init_op(idem_op_t *op, idem_op_kind_t kind, const idem_key_id_t *id)
{
    memset(op, 0, sizeof *op);
    op->kind = kind;
    if (id != NULL)
        op->id = *id;
}

idem_err_t idem_store_complete(idem_store_t *store, const idem_key_id_t *id, uint64_t fence,
                               const idem_response_t *response, uint32_t flags,
                               int64_t expires_at_ms)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_COMPLETE, id);
    op.fence = fence;
    op.response = response;
    op.flags = flags;
    op.expires_at_ms = expires_at_ms;
    return one(store, &op);
}

idem_err_t idem_store_release(idem_store_t *store, const idem_key_id_t *id, uint64_t fence)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_RELEASE, id);
    op.fence = fence;
    return one(store, &op);
}

idem_err_t idem_store_renew(idem_store_t *store, const idem_key_id_t *id, uint64_t fence,
                            int64_t lease_until_ms)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_RENEW, id);
    op.fence = fence;
    op.lease_until_ms = lease_until_ms;
    return one(store, &op);
}

idem_err_t idem_store_delete(idem_store_t *store, const idem_key_id_t *id)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_DELETE, id);
    return one(store, &op);
}

idem_err_t idem_store_token_issue(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                                  int64_t expires_at_ms)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_TOKEN_ISSUE, id);
    op.now_ms = now_ms;
    op.expires_at_ms = expires_at_ms;
    return one(store, &op);
}

idem_err_t idem_store_token_use(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                                idem_token_verdict_t *verdict)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_TOKEN_USE, id);
    op.now_ms = now_ms;
    idem_err_t err = one(store, &op);
    *verdict = op.token;
    return err;
}

idem_err_t idem_store_token_restore(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms)
{
    idem_op_t op;
    init_op(&op, IDEM_OP_TOKEN_RESTORE, id);
    op.now_ms = now_ms;
    return one(store, &op);
}

/* ---- listing and removing in bulk ---------------------------------------- */

/* Records a page may visit before it stops with a cursor, so that a filter
 * that matches little never makes one call walk a whole large store. */
#define LIST_BUDGET_MIN 10000u

int idem__store_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int cmp_keys(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}

size_t idem__store_list_start(const idem__list_t *l, char *buf, bool *exclusive)
{
    size_t n = 0;
    *exclusive = false;
    if (l->f->scope != NULL) {
        size_t sl = strlen(l->f->scope), pl = l->f->prefix ? strlen(l->f->prefix) : 0;
        memcpy(buf, l->f->scope, sl);
        buf[sl] = '\0';
        memcpy(buf + sl + 1, l->f->prefix ? l->f->prefix : "", pl);
        n = sl + 1 + pl;
    }
    if (l->has_after && cmp_keys(l->after, l->after_len, buf, n) >= 0) {
        memcpy(buf, l->after, l->after_len);
        n = l->after_len;
        *exclusive = true;
    }
    return n;
}

int idem__store_list_in_range(const idem__list_t *l, const char *k, size_t klen)
{
    if (l->f->scope == NULL)
        return 1;
    size_t sl = strlen(l->f->scope), pl = l->f->prefix ? strlen(l->f->prefix) : 0;
    if (klen < sl + 1 + pl || memcmp(k, l->f->scope, sl) != 0 || k[sl] != '\0')
        return 0;
    return pl == 0 || memcmp(k + sl + 1, l->f->prefix, pl) == 0;
}

bool idem__store_list_match(const idem_store_filter_t *f, const idem_record_t *head)
{
    if (head->flags & IDEM_REC_TOKEN)
        return false;
    if (head->expires_at_ms <= f->now_ms)
        return false;
    bool in_progress = head->state == IDEM_STATE_IN_PROGRESS;
    bool held = in_progress && (head->flags & IDEM_REC_HELD);
    switch (f->state) {
    case IDEM_LIST_ANY:
        if (f->spare_in_flight && in_progress && (held || head->lease_until_ms > f->now_ms))
            return false;
        break;
    case IDEM_LIST_IN_PROGRESS:
        if (!in_progress)
            return false;
        break;
    case IDEM_LIST_COMPLETED:
        if (head->state != IDEM_STATE_COMPLETED)
            return false;
        break;
    case IDEM_LIST_HELD:
        if (!held)
            return false;
        break;
    }
    if (f->written_before_ms != 0) {
        int64_t written = in_progress ? head->lease_until_ms - f->lease_ms
                                      : head->expires_at_ms - f->ttl_ms;
        if (written >= f->written_before_ms)
            return false;
    }
    return true;
}

int idem__store_list_offer_head(idem__list_t *l, const char *k, size_t klen,
                                const idem_record_t *head)
{
    l->visited++;
    const char *z = memchr(k, '\0', klen);
    size_t sl = z ? (size_t)(z - k) : 0, kl = z ? klen - sl - 1 : 0;
    const idem_store_filter_t *f = l->f;
    bool take = head != NULL && z != NULL && sl >= 1 && sl <= IDEM_SCOPE_MAX && kl >= 1 &&
                kl <= IDEM_KEY_MAX && memchr(k + sl + 1, '\0', kl) == NULL;
    if (take && f->scope != NULL && (strlen(f->scope) != sl || memcmp(f->scope, k, sl) != 0))
        take = false;
    if (take && f->prefix != NULL) {
        size_t pl = strlen(f->prefix);
        take = kl >= pl && memcmp(k + sl + 1, f->prefix, pl) == 0;
    }
    if (take && idem__store_list_match(f, head)) {
        idem_store_listed_t *it = &l->page->items[l->page->n++];
        memset(it, 0, sizeof *it);
        memcpy(it->id.scope, k, sl);
        memcpy(it->id.key, k + sl + 1, kl);
        it->rec = *head;
        it->rec.response.headers = NULL;
        it->rec.response.body = NULL;
        it->rec.owned = NULL;
    }
    return l->page->n >= l->limit || l->visited >= l->budget;
}

int idem__store_list_offer(idem__list_t *l, const char *k, size_t klen, const uint8_t *val,
                           size_t vlen)
{
    idem_record_t head;
    bool ok = idem_record_decode_head(val, vlen, &head) == IDEM_OK;
    return idem__store_list_offer_head(l, k, klen, ok ? &head : NULL);
}

void idem__store_list_resume_after(idem__list_t *l, const char *k, size_t klen)
{
    static const char hex[] = "0123456789abcdef";
    char *c = l->page->cursor;
    if (2 * klen + 1 > IDEM_STORE_CURSOR_MAX)
        klen = (IDEM_STORE_CURSOR_MAX - 1) / 2; /* cannot happen: keys are shorter */
    *c++ = 'k';
    for (size_t i = 0; i < klen; i++) {
        *c++ = hex[(unsigned char)k[i] >> 4];
        *c++ = hex[(unsigned char)k[i] & 15];
    }
    *c = '\0';
}

static bool filter_ok(const idem_store_filter_t *f)
{
    if (f->scope != NULL && (f->scope[0] == '\0' || strlen(f->scope) > IDEM_SCOPE_MAX))
        return false;
    if (f->prefix != NULL && strlen(f->prefix) > IDEM_KEY_MAX)
        return false;
    if (f->state < IDEM_LIST_ANY || f->state > IDEM_LIST_HELD)
        return false;
    return f->lease_ms >= 0 && f->ttl_ms >= 0;
}

idem_err_t idem_store_list(idem_store_t *store, const idem_store_filter_t *f, const char *cursor,
                           size_t limit, idem_store_page_t *page)
{
    memset(page, 0, sizeof *page);
    if (store == NULL || f == NULL || limit == 0 || limit > IDEM_STORE_LIST_MAX || !filter_ok(f))
        return IDEM_E_INVAL;
    if (store->ops->list == NULL)
        return IDEM_E_UNSUPPORTED;
    idem__list_t l;
    memset(&l, 0, sizeof l);
    l.f = f;
    l.page = page;
    l.limit = limit;
    l.budget = limit * 10 > LIST_BUDGET_MIN ? limit * 10 : LIST_BUDGET_MIN;
    l.raw = cursor ? cursor : "";
    if (strlen(l.raw) > IDEM_STORE_CURSOR_MAX)
        return IDEM_E_INVAL;
    if (l.raw[0] == 'k') {
        size_t hl = strlen(l.raw + 1);
        if (hl % 2 != 0 || hl / 2 > sizeof l.after)
            return IDEM_E_INVAL;
        for (size_t i = 0; i < hl / 2; i++) {
            int hi = idem__store_hexval(l.raw[1 + 2 * i]);
            int lo = idem__store_hexval(l.raw[2 + 2 * i]);
            if (hi < 0 || lo < 0)
                return IDEM_E_INVAL;
            l.after[i] = (char)(hi << 4 | lo);
        }
        l.after_len = hl / 2;
        l.has_after = true;
    } else if (l.raw[0] != '\0' && l.raw[0] != 'r') {
        return IDEM_E_INVAL; /* 'k': an ordered cursor; 'r': a SCAN cursor's mark */
    }
    page->items = idem_calloc(limit, sizeof *page->items);
    if (page->items == NULL)
        return IDEM_E_NOMEM;
    idem_err_t err = store->ops->list(store, &l);
    if (err == IDEM_OK)
        err = l.err;
    if (err != IDEM_OK)
        idem_store_page_cleanup(page);
    return err;
}

void idem_store_page_cleanup(idem_store_page_t *page)
{
    if (page == NULL)
        return;
    idem_free(page->items);
    memset(page, 0, sizeof *page);
}

idem_err_t idem_store_delete_listed(idem_store_t *store, const idem_store_listed_t *items,
                                    size_t n, size_t *deleted, bool *removed)
{
    if (deleted != NULL)
        *deleted = 0;
    if (n == 0)
        return IDEM_OK;
    if (store == NULL || items == NULL || n > IDEM_STORE_LIST_MAX)
        return IDEM_E_INVAL;
    for (size_t i = 0; i < n; i++)
        if (!id_ok(&items[i].id))
            return IDEM_E_INVAL;
    bool *got = idem_calloc(n, sizeof *got);
    if (got == NULL)
        return IDEM_E_NOMEM;
    idem_err_t err;
    if (store->ops->delete_if != NULL) {
        err = store->ops->delete_if(store, items, n, got);
    } else {
        idem_op_t *ops = idem_calloc(n, sizeof *ops);
        if (ops == NULL) {
            idem_free(got);
            return IDEM_E_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            ops[i].kind = IDEM__OP_DELETE_IF;
            ops[i].id = items[i].id;
            ops[i].fence = items[i].rec.fence;
            ops[i].flags = (uint32_t)items[i].rec.state;
        }
        err = store->ops->exec(store, ops, n);
        for (size_t i = 0; i < n && err == IDEM_OK; i++)
            got[i] = ops[i].err == IDEM_OK;
        idem_free(ops);
    }
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        count += got[i];
        if (removed != NULL)
            removed[i] = got[i];
    }
    if (deleted != NULL)
        *deleted = count;
    idem_free(got);
    return err;
}
