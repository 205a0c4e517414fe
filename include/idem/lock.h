/* include/idem/lock.h - a named lock with a lease and a fencing token
 * (docs/protocol.md section 16), on any store.
 *
 * A service that must do one thing at a time across processes (run a
 * scheduled job, own a shard, compact a ledger) takes a lock by name.  The
 * holder gets a lease: if it dies, the lock frees itself when the lease runs
 * out, and a holder that works longer renews it (by hand, or with the
 * watchdog below, every third of the lease).  A lease alone cannot make a
 * lock safe: a holder that stalls (a GC pause, a swapped-out VM, a slow
 * disk) past its lease still believes it holds the lock while another one
 * does.  So every acquisition also gets a FENCING TOKEN, a number that grows
 * by one with every acquisition of the name.  Pass it along with every write
 * to the protected resource, and let the resource refuse a write whose token
 * is lower than one it has already seen (for example
 * `UPDATE t SET v = $1, fence = $2 WHERE id = $3 AND fence < $2`): the
 * stalled holder's late writes are then refused.
 *
 * In the store a lock is an ordinary record under (scope "lock", key name)
 * with an all-zero fingerprint, so it works alike on every backend (lmdb,
 * redis, postgres, memory): acquire is a claim (a new record, or a takeover
 * of one whose lease has ended, either way with the fence + 1), renew moves
 * the lease with the holder's fence, and release ends the lease at once but
 * keeps the record, so that the next acquisition continues the count.
 *
 * The count restarts at 1 only if the lock's record was removed: by its
 * retention, which ends IDEM_LOCK_RETENTION_MS after the lock was last
 * acquired (a holder that keeps it for weeks moves the retention on as it
 * renews, so a record always outlives its last renew or release by at
 * least half of IDEM_LOCK_RETENTION_MS), or by hand (idem_store_delete).  A
 * resource that keeps the highest token it saw would then refuse the new,
 * lower tokens: after a month of silence, or a deletion, reset its token
 * too.
 *
 * Renewing is allowed after the lease ended as long as nobody acquired the
 * lock in between (the fence is unchanged, so nothing was lost); once
 * someone did, the old holder's renew and release are IDEM_E_FENCE.
 *
 * Time is the caller's (now_ms, milliseconds since the epoch, as
 * idem_clock_now gives), so tests can run leases out without sleeping; a
 * Redis store expires records by the wall clock, so use real time there.
 *
 * THREADING: an idem_lock_t is used by one thread at a time (or by its
 * watchdog alone while one runs); different locks, on one store or not, may
 * be used from any threads at once.
 */
#ifndef IDEM_LOCK_H
#define IDEM_LOCK_H

#include <stdint.h>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/extern.h"
#include "idem/key.h"
#include "idem/store.h"

#define IDEM_LOCK_SCOPE "lock"                /* the store scope of every lock */
#define IDEM_LOCK_NAME_MAX IDEM_KEY_MAX        /* characters in a lock name */
#define IDEM_LOCK_LEASE_MIN_MS 1ll             /* shortest lease */
#define IDEM_LOCK_LEASE_MAX_MS 86400000ll      /* longest lease: one day */
#define IDEM_LOCK_RETENTION_MS 2592000000ll    /* a lock's record outlives its last use by 30 days */
#define IDEM_LOCK_TIME_MAX 4000000000000000ll  /* latest now_ms accepted (year ~128,700) */

/** A lock as its holder sees it.  Allocated by the caller; filled by
 * idem_lock_acquire; the fields are read-only for the caller. */
typedef struct idem_lock {
    idem_store_t *store;    /* borrowed: must outlive the lock */
    idem_key_id_t id;       /* (IDEM_LOCK_SCOPE, name) */
    uint64_t fence;         /* the fencing token of this acquisition (>= 1); 0 once released */
    int64_t lease_until_ms; /* the lease ends then, as last acquired or renewed */
    int64_t kept_until_ms;  /* internal: the record's retention as last written */
} idem_lock_t;

/** Try to take the lock called name, for lease_ms from now_ms.  Does not wait.
 * @param[in]  store  the store to keep the lock in; borrowed by *out.
 * @param[in]  name   NUL-terminated, 1 to IDEM_LOCK_NAME_MAX characters of
 *                    visible ASCII (0x21-0x7E); not retained.
 * @param[in]  now_ms 0 .. IDEM_LOCK_TIME_MAX.
 * @param[in]  lease_ms IDEM_LOCK_LEASE_MIN_MS .. IDEM_LOCK_LEASE_MAX_MS.
 * @param[out] out    on IDEM_OK the held lock, with its fencing token in
 *                    out->fence; zeroed otherwise.
 * @param[out] retry_after_ms  may be NULL; on IDEM_E_EXISTS the time until
 *                    the holder's lease ends (>= 1), else 0.
 * @return IDEM_OK (held), IDEM_E_EXISTS (another holder's lease is live),
 *         IDEM_E_INVAL (bad argument), IDEM_E_CORRUPT (the store holds a
 *         record under this name that is not a lock), or a store error
 *         (IDEM_E_STORE_DOWN, IDEM_E_STORE_FULL, IDEM_E_IO, IDEM_E_NOMEM:
 *         not held; a STORE_DOWN from a network store may hide an
 *         acquisition that landed, which then runs out with its lease). */
IDEM_EXTERN idem_err_t idem_lock_acquire(idem_store_t *store, const char *name, int64_t now_ms,
                                         int64_t lease_ms, idem_lock_t *out,
                                         int64_t *retry_after_ms);

/** Extend the lease to now_ms + lease_ms.
 * @param[in,out] lock  a held lock; lease_until_ms is moved on IDEM_OK.
 * @return IDEM_OK, IDEM_E_FENCE (someone else acquired the lock since: it
 *         is lost, stop working under it), IDEM_E_INVAL (bad argument, or
 *         a released lock), or a store error (the lease is unchanged; retry
 *         before it ends). */
IDEM_EXTERN idem_err_t idem_lock_renew(idem_lock_t *lock, int64_t now_ms, int64_t lease_ms);

/** Give the lock up: its lease ends at now_ms, and the next acquisition
 * gets the fence + 1.  On IDEM_OK lock->fence becomes 0 and the lock
 * cannot be renewed or released again.
 * @return IDEM_OK, IDEM_E_FENCE (it was lost already), IDEM_E_INVAL,
 *         or a store error (the lock is still held; retry, or let the
 *         lease run out). */
IDEM_EXTERN idem_err_t idem_lock_release(idem_lock_t *lock, int64_t now_ms);

/** The fencing token of a held lock, 0 for NULL or a released lock. */
IDEM_EXTERN uint64_t idem_lock_fence(const idem_lock_t *lock);

/* ---- the watchdog: renew on a thread of its own ------------------------ */

typedef struct idem_lock_watchdog idem_lock_watchdog_t;

/** Called once, on the watchdog's thread, when the lock is lost.
 * @param ctx  as given to idem_lock_watchdog_start.
 * @param why  IDEM_E_FENCE (someone else acquired it) or the store error that
 *             kept every renewal from landing until the lease ended.
 * Must not call idem_lock_watchdog_stop (which waits for this thread). */
typedef void (*idem_lock_lost_fn)(void *ctx, idem_err_t why);

/** Renew lock every third of lease_ms on a new thread, until stopped or lost.
 * A renewal that fails for a store error is tried again (every tenth of the
 * lease) until the lease ends; then, or at the first IDEM_E_FENCE, the lock
 * is lost: the watchdog stops renewing, records why (idem_lock_watchdog_lost)
 * and calls on_lost.  While it runs the watchdog renews a copy of *lock;
 * the caller may read lock->fence but must not renew or release the lock
 * until idem_lock_watchdog_stop.
 * @param[in] lock     a held lock; must outlive the watchdog.
 * @param[in] lease_ms each renewal's lease, IDEM_LOCK_LEASE_MIN_MS ..
 *                     IDEM_LOCK_LEASE_MAX_MS (renewals at most every 1 ms).
 * @param[in] clock    the time of the renewals; NULL for the real time.
 *                     Borrowed until stop.
 * @param[in] on_lost, ctx  may be NULL.
 * @param[out] out     the running watchdog, owned by the caller (stop it);
 *                     NULL on failure.
 * @return IDEM_OK, IDEM_E_INVAL (bad argument or a released lock),
 *         IDEM_E_NOMEM, IDEM_E_IO (no thread could be started). */
IDEM_EXTERN idem_err_t idem_lock_watchdog_start(idem_lock_t *lock, int64_t lease_ms,
                                                const idem_clock_t *clock,
                                                idem_lock_lost_fn on_lost, void *ctx,
                                                idem_lock_watchdog_t **out);

/** Whether the lock was lost: IDEM_OK while the watchdog still holds it,
 * else why it was lost (as on_lost is told).  Any thread may ask; IDEM_OK
 * for NULL. */
IDEM_EXTERN idem_err_t idem_lock_watchdog_lost(const idem_lock_watchdog_t *wd);

/** Stop renewing, wait for the thread, copy the latest lease end into the
 * lock and free the watchdog; NULL is a no-op.  Returns at once (it does not
 * wait out a renewal interval), but a renewal in flight is finished first.
 * @return what idem_lock_watchdog_lost said at the end. */
IDEM_EXTERN idem_err_t idem_lock_watchdog_stop(idem_lock_watchdog_t *wd);

#endif /* IDEM_LOCK_H */
