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
    switch (op->kind) {
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
    if (store != NULL)
        store->ops->close(store);
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
