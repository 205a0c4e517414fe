/* src/store/lock.c - named locks with a lease and a fencing token, on the
 * store's own ops (include/idem/lock.h).
 *
 * Nothing here is backend-specific: a lock is a record under
 * (IDEM_LOCK_SCOPE, name) with an all-zero fingerprint, and every step is one
 * idem_store_exec batch of ops whose meaning idem__store_apply (and the
 * Redis scripts, which the conformance suite holds to it) already fixes:
 *
 *   acquire   CLAIM at now, lease now + lease, retention now + RETENTION.
 *             idem_decide says CLAIM (no record, or one past its retention:
 *             fence = old + 1, or 1 when there is none) or TAKEOVER (the
 *             lease ended: fence + 1) -> held; IN_FLIGHT -> busy.  Anything
 *             else means a record that no lock operation writes (completed,
 *             held, another fingerprint): IDEM_E_CORRUPT.
 *   renew     RENEW with the holder's fence (state in_progress and the same
 *             fence, else IDEM_E_FENCE): lease_until moves, the record and
 *             its fence stay.
 *   release   the same RENEW with lease_until = now: the lease is over, the
 *             record stays, so the next acquire is a TAKEOVER with fence + 1,
 *             and only the holder's fence can do it.  (RELEASE would delete
 *             the record and restart the count at 1.)
 *
 * Retention.  RENEW raises a record's expires_at to its new lease end but
 * never sets it otherwise, so a holder whose retention is running low
 * (less than RETENTION / 2 left after the new lease) sends two RENEWs in one
 * batch: the first to now + RETENTION (which raises expires_at there), the
 * second to the lease it wants.  Both land or neither does on memory:, lmdb:
 * and postgres:// (one transaction); on Redis the batch is MULTI/EXEC, and
 * only an OOM refusal of the second script could split it, which leaves a
 * long lease that the holder's next renew or release corrects (the error is
 * returned and lease_until_ms says what the store holds).  This happens
 * once per RETENTION / 2 of continuous holding, never on a lock held for
 * less.
 *
 * The watchdog is one thread per watched lock that sleeps on a condition
 * variable (CLOCK_MONOTONIC, so a wall-clock step does not stretch a sleep)
 * for a third of the lease and renews a private copy of the lock; stop
 * signals it, joins it and copies the lease back.  Loss is recorded in an
 * atomic and reported once through the callback, outside the mutex.
 *
 * THREADING: acquire/renew/release are as thread-safe as the store; a lock
 * struct belongs to one thread at a time.  A watchdog's mutex guards its stop
 * flag; its lock copy is touched only by its thread until the join.
 */
#include "idem/lock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "idem/alloc.h"
#include "store/store_impl.h"

/* ---- arguments ------------------------------------------------------------ */

static bool name_ok(const char *name)
{
    if (name == NULL)
        return false;
    size_t len = strnlen(name, IDEM_LOCK_NAME_MAX + 1);
    if (len == 0 || len > IDEM_LOCK_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x21 || c > 0x7e)
            return false;
    }
    return true;
}

static bool lease_ok(int64_t lease_ms)
{
    return lease_ms >= IDEM_LOCK_LEASE_MIN_MS && lease_ms <= IDEM_LOCK_LEASE_MAX_MS;
}

static bool time_ok(int64_t now_ms)
{
    return now_ms >= 0 && now_ms <= IDEM_LOCK_TIME_MAX;
}

static bool held(const idem_lock_t *lock)
{
    return lock != NULL && lock->store != NULL && lock->fence != 0;
}

/* ---- acquire, renew, release ---------------------------------------------- */

idem_err_t idem_lock_acquire(idem_store_t *store, const char *name, int64_t now_ms,
                             int64_t lease_ms, idem_lock_t *out, int64_t *retry_after_ms)
{
    if (retry_after_ms != NULL)
        *retry_after_ms = 0;
    if (out == NULL)
        return IDEM_E_INVAL;
    memset(out, 0, sizeof *out);
    if (store == NULL || !name_ok(name) || !time_ok(now_ms) || !lease_ok(lease_ms))
        return IDEM_E_INVAL;

    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    memcpy(op.id.scope, IDEM_LOCK_SCOPE, sizeof IDEM_LOCK_SCOPE);
    memcpy(op.id.key, name, strlen(name) + 1);
    op.now_ms = now_ms;
    op.lease_until_ms = now_ms + lease_ms;
    op.expires_at_ms = now_ms + IDEM_LOCK_RETENTION_MS;

    idem_err_t err = idem_store_claim(store, &op);
    idem_record_cleanup(&op.record);
    if (err != IDEM_OK)
        return err;
    switch (op.decision.kind) {
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        out->store = store;
        out->id = op.id;
        out->fence = op.decision.fence;
        out->lease_until_ms = op.lease_until_ms;
        out->kept_until_ms = op.expires_at_ms;
        return IDEM_OK;
    case IDEM_DECIDE_IN_FLIGHT:
        if (retry_after_ms != NULL)
            *retry_after_ms =
                idem__store_wait_for_lease(store, &op.id, now_ms, op.decision.retry_after_s);
        return IDEM_E_EXISTS;
    default: /* REPLAY, MISMATCH, IN_FLIGHT_UNKNOWN, NOT_RETAINED: not a lock's record */
        return IDEM_E_CORRUPT;
    }
}

/* Move the lease to lease_until (see "Retention" above). */
static idem_err_t set_lease(idem_lock_t *lock, int64_t now_ms, int64_t lease_until)
{
    idem_op_t ops[2];
    size_t n = 0;
    int64_t kept = lock->kept_until_ms;

    memset(ops, 0, sizeof ops);
    if (kept - lease_until < IDEM_LOCK_RETENTION_MS / 2) {
        kept = now_ms + IDEM_LOCK_RETENTION_MS;
        ops[n].kind = IDEM_OP_RENEW;
        ops[n].id = lock->id;
        ops[n].fence = lock->fence;
        ops[n].lease_until_ms = kept;
        n++;
    }
    ops[n].kind = IDEM_OP_RENEW;
    ops[n].id = lock->id;
    ops[n].fence = lock->fence;
    ops[n].lease_until_ms = lease_until;
    n++;

    idem_err_t err = idem_store_exec(lock->store, ops, n);
    if (err != IDEM_OK)
        return err;
    if (ops[0].err != IDEM_OK)
        return ops[0].err;
    if (n == 2) {
        lock->kept_until_ms = kept;
        lock->lease_until_ms = kept; /* what the store holds unless the second lands */
    }
    if (ops[n - 1].err != IDEM_OK)
        return ops[n - 1].err;
    lock->lease_until_ms = lease_until;
    return IDEM_OK;
}

idem_err_t idem_lock_renew(idem_lock_t *lock, int64_t now_ms, int64_t lease_ms)
{
    if (!held(lock) || !time_ok(now_ms) || !lease_ok(lease_ms))
        return IDEM_E_INVAL;
    return set_lease(lock, now_ms, now_ms + lease_ms);
}

idem_err_t idem_lock_release(idem_lock_t *lock, int64_t now_ms)
{
    if (!held(lock) || !time_ok(now_ms))
        return IDEM_E_INVAL;
    idem_err_t err = set_lease(lock, now_ms, now_ms);
    if (err == IDEM_OK)
        lock->fence = 0;
    return err;
}

uint64_t idem_lock_fence(const idem_lock_t *lock)
{
    return lock == NULL ? 0 : lock->fence;
}

/* ---- the watchdog --------------------------------------------------------- */

struct idem_lock_watchdog {
    idem_lock_t *lock;          /* the caller's; written back at stop */
    idem_lock_t copy;           /* what the thread renews */
    int64_t lease_ms;
    const idem_clock_t *clock;  /* NULL: real time */
    idem_lock_lost_fn on_lost;
    void *ctx;
    pthread_t thread;
    pthread_mutex_t mu;         /* guards stop */
    pthread_cond_t cond;        /* signalled by stop */
    bool stop;
    _Atomic int lost;           /* IDEM_OK, or why the lock was lost */
};

/* The monotonic time delay_ms from now, for pthread_cond_timedwait. */
static struct timespec mono_after(int64_t delay_ms)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(delay_ms / 1000);
    ts.tv_nsec += (long)(delay_ms % 1000) * 1000000l;
    if (ts.tv_nsec >= 1000000000l) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000l;
    }
    return ts;
}

static void *watchdog_main(void *arg)
{
    idem_lock_watchdog_t *wd = arg;
    int64_t every = wd->lease_ms / 3 > 0 ? wd->lease_ms / 3 : 1;
    int64_t retry = wd->lease_ms / 10 > 0 ? wd->lease_ms / 10 : 1;
    int64_t wait = every;
    idem_err_t lost = IDEM_OK;

    pthread_mutex_lock(&wd->mu);
    for (;;) {
        struct timespec until = mono_after(wait);
        while (!wd->stop && pthread_cond_timedwait(&wd->cond, &wd->mu, &until) == 0)
            ;
        if (wd->stop)
            break;
        pthread_mutex_unlock(&wd->mu);

        idem_err_t err = idem_lock_renew(&wd->copy, idem_clock_now(wd->clock), wd->lease_ms);
        if (err == IDEM_OK) {
            wait = every;
        } else if (err == IDEM_E_FENCE || err == IDEM_E_INVAL || err == IDEM_E_CORRUPT ||
                   idem_clock_now(wd->clock) >= wd->copy.lease_until_ms) {
            lost = err;
        } else {
            wait = retry; /* a store error: try again while the lease lasts */
        }

        pthread_mutex_lock(&wd->mu);
        if (lost != IDEM_OK)
            break;
    }
    pthread_mutex_unlock(&wd->mu);

    if (lost != IDEM_OK) {
        atomic_store(&wd->lost, (int)lost);
        if (wd->on_lost != NULL)
            wd->on_lost(wd->ctx, lost);
    }
    return NULL;
}

idem_err_t idem_lock_watchdog_start(idem_lock_t *lock, int64_t lease_ms, const idem_clock_t *clock,
                                    idem_lock_lost_fn on_lost, void *ctx,
                                    idem_lock_watchdog_t **out)
{
    if (out == NULL)
        return IDEM_E_INVAL;
    *out = NULL;
    if (!held(lock) || !lease_ok(lease_ms))
        return IDEM_E_INVAL;

    idem_lock_watchdog_t *wd = idem_calloc(1, sizeof *wd);
    if (wd == NULL)
        return IDEM_E_NOMEM;
    wd->lock = lock;
    wd->copy = *lock;
    wd->lease_ms = lease_ms;
    wd->clock = clock;
    wd->on_lost = on_lost;
    wd->ctx = ctx;
    atomic_init(&wd->lost, IDEM_OK);

    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        idem_free(wd);
        return IDEM_E_NOMEM;
    }
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&wd->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        idem_free(wd);
        return IDEM_E_NOMEM;
    }
    if (pthread_mutex_init(&wd->mu, NULL) != 0) {
        pthread_cond_destroy(&wd->cond);
        idem_free(wd);
        return IDEM_E_NOMEM;
    }
    if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
        pthread_mutex_destroy(&wd->mu);
        pthread_cond_destroy(&wd->cond);
        idem_free(wd);
        return IDEM_E_IO;
    }
    *out = wd;
    return IDEM_OK;
}

idem_err_t idem_lock_watchdog_lost(const idem_lock_watchdog_t *wd)
{
    return wd == NULL ? IDEM_OK : (idem_err_t)atomic_load(&wd->lost);
}

idem_err_t idem_lock_watchdog_stop(idem_lock_watchdog_t *wd)
{
    if (wd == NULL)
        return IDEM_OK;
    pthread_mutex_lock(&wd->mu);
    wd->stop = true;
    pthread_cond_signal(&wd->cond);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);

    idem_err_t lost = (idem_err_t)atomic_load(&wd->lost);
    wd->lock->lease_until_ms = wd->copy.lease_until_ms;
    wd->lock->kept_until_ms = wd->copy.kept_until_ms;
    pthread_mutex_destroy(&wd->mu);
    pthread_cond_destroy(&wd->cond);
    idem_free(wd);
    return lost;
}
