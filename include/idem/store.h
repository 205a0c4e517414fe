/* include/idem/store.h - durable homes for key records, behind one API.
 *
 * A store is opened from a URL: "memory:", "lmdb:PATH?sync=always&map_size=1GiB",
 * "redis://[user:password@]host[:port][/db]", "redis+sentinel://..." or
 * "postgres://..." (docs/stores.md has every backend and option; a backend
 * left out of the build refuses its URL).  Every change goes through
 * idem_store_exec, which applies a batch of operations in one transaction:
 * each claim decides (idem_decide) and writes atomically, so of any number of
 * concurrent claims of one (scope, key), in any number of threads or
 * processes sharing the store, exactly one forwards.  Fenced operations
 * (complete, hold, release, renew) change a record only if it still carries
 * the caller's fence; otherwise that op's err is IDEM_E_FENCE and nothing is
 * written.  Prevention tokens (idem/token.h) are records too, issued, spent
 * and given back by the TOKEN_* ops, each deciding and writing atomically.  A batch is durable when exec returns (per the store's sync mode).
 *
 * THREADING: a store handle may be used from any number of threads at once
 * (open and close excepted).  Whether exec calls wait for each other is the
 * backend's business, and every batch is atomic either way: memory: applies
 * one batch at a time under its mutex, and lmdb: one write transaction at a
 * time (LMDB's writer lock); redis: and postgres: run concurrent exec calls
 * at once, each on its own connection from the handle's pool (nothing in
 * the library serialises them): Redis runs each batch as one MULTI/EXEC,
 * one after another in the server, and PostgreSQL each as one transaction
 * that locks its rows, so there only batches that touch the same keys wait
 * for each other.  get never waits for a writer on
 * lmdb: (LMDB readers are wait-free); on memory: it takes the mutex
 * briefly; on redis: and postgres: it is one round trip on a pooled
 * connection.
 */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/engine.h"
#include "idem/error.h"
#include "idem/extern.h"
#include "idem/key.h"
#include "idem/record.h"
#include "idem/token.h"

typedef struct idem_store idem_store_t;

typedef enum idem_op_kind {
    IDEM_OP_CLAIM = 1,    /* decide; on CLAIM/TAKEOVER write in_progress */
    IDEM_OP_COMPLETE = 2, /* fenced: write completed with response */
    IDEM_OP_HOLD = 3,     /* fenced: keep in_progress, held, until expires_at */
    IDEM_OP_RELEASE = 4,  /* fenced: delete */
    IDEM_OP_RENEW = 5,    /* fenced: move lease_until */
    IDEM_OP_DELETE = 6,   /* unconditional delete (admin) */
    IDEM_OP_TOKEN_ISSUE = 7,   /* write an unused token record until expires_at */
    IDEM_OP_TOKEN_USE = 8,     /* idem_token_decide; on FIRST_USE mark the token used */
    IDEM_OP_TOKEN_RESTORE = 9, /* give a used, unexpired token back (its request did nothing) */
} idem_op_kind_t;

/** One operation of a batch.  Inputs are set by the caller; outputs by exec. */
typedef struct idem_op {
    idem_op_kind_t kind;
    idem_key_id_t id;
    /* inputs */
    uint8_t fp[IDEM_FP_LEN];   /* CLAIM */
    int64_t now_ms;            /* CLAIM, TOKEN_*: the time of the decision */
    int64_t lease_until_ms;    /* CLAIM, RENEW, HOLD */
    int64_t expires_at_ms;     /* CLAIM (retention of an in_progress record), COMPLETE, HOLD,
                                * TOKEN_ISSUE (the token's end) */
    uint64_t fence;            /* COMPLETE, HOLD, RELEASE, RENEW */
    uint32_t flags;            /* COMPLETE: IDEM_REC_NOT_RETAINED when the body was not kept */
    const idem_response_t *response; /* COMPLETE; borrowed for the call */
    /* outputs */
    idem_err_t err;            /* IDEM_OK, IDEM_E_FENCE (also TOKEN_RESTORE of a token
                                * not in use), IDEM_E_NOTFOUND (DELETE), IDEM_E_EXISTS
                                * (TOKEN_ISSUE of a live token) */
    idem_token_verdict_t token; /* TOKEN_USE */
    idem_decision_t decision;  /* CLAIM */
    idem_record_t record;      /* CLAIM with REPLAY: the stored record; caller cleans up */
} idem_op_t;

/** Open a store from a URL.
 * @param[in]  url  not retained.
 * @param[out] out  the new store, owned by the caller; NULL on failure.
 * @param[out] errbuf, errlen  a sentence naming the problem on failure (may be NULL).
 * @return IDEM_OK, IDEM_E_INVAL (bad URL or option), IDEM_E_STORE_DOWN,
 *         IDEM_E_IO, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_store_open(const char *url, idem_store_t **out, char *errbuf,
                                       size_t errlen);

/** Check a store URL as idem_store_open would, without opening anything
 * (no directory is made, no server is contacted).
 * @return IDEM_OK, or IDEM_E_INVAL with errbuf naming the problem. */
IDEM_EXTERN idem_err_t idem_store_check_url(const char *url, char *errbuf, size_t errlen);

/** Close a store; NULL is a no-op.  Pending data is flushed first. */
IDEM_EXTERN void idem_store_close(idem_store_t *store);

/** Apply n operations in one transaction.  Each op's outputs are set.
 * @return IDEM_OK when the batch committed (look at each op's err);
 *         IDEM_E_STORE_DOWN, IDEM_E_STORE_FULL, IDEM_E_IO, IDEM_E_NOMEM when
 *         nothing was written (every op's err is set to the same code). */
IDEM_EXTERN idem_err_t idem_store_exec(idem_store_t *store, idem_op_t *ops, size_t n);

/** Read a record without writing.
 * @param[out] rec  owned by the caller (idem_record_cleanup); zeroed unless IDEM_OK.
 * @return IDEM_OK, IDEM_E_NOTFOUND (none, or past its retention at now_ms),
 *         IDEM_E_STORE_DOWN, IDEM_E_CORRUPT, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_store_get(idem_store_t *store, const idem_key_id_t *id,
                                      int64_t now_ms, idem_record_t *rec);

/** Remove up to max records whose retention ended before now_ms.
 * @param[out] removed  how many were removed.  Resumes where the last call
 * stopped, so repeated calls visit the whole store in bounded steps. */
IDEM_EXTERN idem_err_t idem_store_sweep(idem_store_t *store, int64_t now_ms, size_t max,
                                        size_t *removed);

/** Whether the store answers now: IDEM_OK or IDEM_E_STORE_DOWN. */
IDEM_EXTERN idem_err_t idem_store_ping(idem_store_t *store);

/** The room of a store on this machine's disk (lmdb:, rocksdb:). */
typedef struct idem_store_space {
    /** Bytes the store's files take on disk now. */
    uint64_t used_bytes;
    /** Bytes of new data the store can still take before it refuses new
     * records as IDEM_E_STORE_FULL: the smaller of what the filesystem has
     * free and what the store's own limit (LMDB's map) leaves, less the
     * room kept for deletes.  0 when full. */
    uint64_t free_bytes;
} idem_store_space_t;

/** How much room the store has left, for a metric and a warning before it
 * runs out.  Cheap (a statvfs and a few reads); any thread.
 * @return IDEM_OK; IDEM_E_UNSUPPORTED for stores whose room is a server's
 *         (redis://, postgres://) or memory's (memory:); IDEM_E_IO when the
 *         filesystem cannot be asked. */
IDEM_EXTERN idem_err_t idem_store_space(idem_store_t *store, idem_store_space_t *out);

/** Whether idem_store_exec returns without waiting for a disk flush or a
 * network round trip (memory:, lmdb with sync=interval), so that a caller
 * may run it on a latency-sensitive thread.  False when store is NULL. */
IDEM_EXTERN bool idem_store_exec_is_cheap(const idem_store_t *store);

/** Whether idem_store_get reads local memory or a local file (memory:, lmdb:)
 * rather than asking a server over the network.  False when store is NULL. */
IDEM_EXTERN bool idem_store_reads_are_local(const idem_store_t *store);

/** The backend's name ("memory", "lmdb"). */
IDEM_EXTERN const char *idem_store_name(const idem_store_t *store);

/** The backend's last error detail (an LMDB message, ...); never NULL.
 * Valid until the next call on the store from the same thread. */
IDEM_EXTERN const char *idem_store_errstr(idem_store_t *store);

/* ---- Invalidations: what other processes delete (local_cache) ----------
 *
 * A process that keeps records in memory in front of a shared store (idemd's
 * local_cache) must forget a record that any process deletes.  The deleting
 * process calls idem_store_publish_delete after each delete (or
 * idem_store_publish_clear after many); every process that watches the
 * store hears it within about a second: Redis pub/sub on the channel
 * "<prefix>invalidate", PostgreSQL NOTIFY on "<table>_invalidate".
 * Embedded stores (memory:, lmdb:, rocksdb:) publish nothing and cannot be
 * watched (IDEM_E_UNSUPPORTED). */

/** What a watch reports, on its own thread (a callback must be quick and
 * thread-safe).  Any member may be NULL. */
typedef struct idem_store_watch_cbs {
    /** A record was deleted by some process: forget id; id NULL: forget
     * every record. */
    void (*deleted)(void *arg, const idem_key_id_t *id);
    /** up: subscribed, every later delete will be reported (one missed
     * while down was not: forget everything before trusting memory again);
     * !up: the connection is lost, deletes may be missed until up again.
     * A watch starts down. */
    void (*state)(void *arg, bool up);
    /** A message on the channel that is not one of ours (ignored). */
    void (*malformed)(void *arg);
    void *arg;
} idem_store_watch_cbs_t;

/** Start watching store's deletes on a thread of its own, which reconnects
 * (after a pause of up to a second) whenever its connection drops;
 * idem_store_close stops it.  One watch per handle.
 * @return IDEM_OK; IDEM_E_UNSUPPORTED for an embedded store; IDEM_E_EXISTS
 *         when already watched; IDEM_E_NOMEM, IDEM_E_IO (no thread). */
IDEM_EXTERN idem_err_t idem_store_watch(idem_store_t *store, const idem_store_watch_cbs_t *cbs);

/** Stop the watch of store, if any, and wait for its thread: no callback
 * runs after it returns. */
IDEM_EXTERN void idem_store_unwatch(idem_store_t *store);

/** Tell every watcher of the store (every process, this one included) that
 * the record id was deleted.  Call it after each successful delete.
 * @return IDEM_OK (also for an embedded store: nothing to tell), or
 *         IDEM_E_STORE_DOWN when the message could not be sent (watchers
 *         whose connection dropped forget everything when they reconnect). */
IDEM_EXTERN idem_err_t idem_store_publish_delete(idem_store_t *store, const idem_key_id_t *id);

/** As idem_store_publish_delete for every record at once (after a bulk
 * delete too large to name each key). */
IDEM_EXTERN idem_err_t idem_store_publish_clear(idem_store_t *store);

/* Conveniences: a batch of one. */
IDEM_EXTERN idem_err_t idem_store_claim(idem_store_t *store, idem_op_t *op);
IDEM_EXTERN idem_err_t idem_store_complete(idem_store_t *store, const idem_key_id_t *id,
                                           uint64_t fence, const idem_response_t *response,
                                           uint32_t flags, int64_t expires_at_ms);
IDEM_EXTERN idem_err_t idem_store_release(idem_store_t *store, const idem_key_id_t *id,
                                          uint64_t fence);
IDEM_EXTERN idem_err_t idem_store_renew(idem_store_t *store, const idem_key_id_t *id,
                                        uint64_t fence, int64_t lease_until_ms);
IDEM_EXTERN idem_err_t idem_store_delete(idem_store_t *store, const idem_key_id_t *id);
/** Keep a new token (idem_token_id) until expires_at_ms.
 * @return IDEM_OK, IDEM_E_EXISTS (a live token has this id), or a batch error. */
IDEM_EXTERN idem_err_t idem_store_token_issue(idem_store_t *store, const idem_key_id_t *id,
                                              int64_t now_ms, int64_t expires_at_ms);
/** Spend a token at now_ms.  @param[out] verdict  what the use found.
 * @return IDEM_OK (look at verdict), or a batch error (verdict NONE). */
IDEM_EXTERN idem_err_t idem_store_token_use(idem_store_t *store, const idem_key_id_t *id,
                                            int64_t now_ms, idem_token_verdict_t *verdict);
/** Give back a spent token whose request did nothing.
 * @return IDEM_OK, IDEM_E_FENCE (no used, live token there), or a batch error. */
IDEM_EXTERN idem_err_t idem_store_token_restore(idem_store_t *store, const idem_key_id_t *id,
                                                int64_t now_ms);

/* ---- listing and removing records in bulk (the admin's GET/DELETE /keys) --
 *
 * A listing visits records in pages: each call returns up to `limit` of
 * them and, while there may be more, a cursor that the next call resumes
 * strictly after.  Ordered stores (memory:, lmdb:, rocksdb:, postgres://)
 * go in (scope, key) order, so a key present for the whole listing is
 * returned exactly once however many keys are added or removed meanwhile.
 * Redis walks with SCAN (see docs/admin.md for what that guarantees).
 * Where the store can, the scope and prefix filters bound the walk (a
 * range of an ordered store, a MATCH pattern of SCAN); state and age are
 * checked on each record visited.  Prevention tokens and records past
 * their retention are never listed. */

/** Which records a listing takes, by state. */
typedef enum idem_list_state {
    IDEM_LIST_ANY = 0,         /* every state */
    IDEM_LIST_IN_PROGRESS = 1, /* in_progress, held or not */
    IDEM_LIST_COMPLETED = 2,
    IDEM_LIST_HELD = 3,        /* in_progress and held (IDEM_REC_HELD) */
} idem_list_state_t;

/** What a listing takes.  Zeroed: every live record. */
typedef struct idem_store_filter {
    const char *scope;       /* NULL: every scope */
    const char *prefix;      /* NULL or "": every key; else keys that begin with it */
    idem_list_state_t state;
    /* leave out in_progress records whose owner's lease is still live and
     * held ones, unless state names them (a bulk delete without state) */
    bool spare_in_flight;
    int64_t now_ms;          /* records past expires_at at now_ms are left out */
    /* Age: when nonzero, only records last written before it.  The time of
     * the last write is the lease end less lease_ms for in_progress records
     * (a claim, renewal or hold sets the lease to that time plus the
     * lease), and expires_at less ttl_ms for completed ones. */
    int64_t written_before_ms;
    int64_t lease_ms, ttl_ms;
} idem_store_filter_t;

/** One listed record: its id and the record's head (no headers or body;
 * response.status is set for a completed record).  Nothing to free. */
typedef struct idem_store_listed {
    idem_key_id_t id;
    idem_record_t rec;
} idem_store_listed_t;

/** A resume point: opaque text, NUL-terminated, safe in a URL query. */
#define IDEM_STORE_CURSOR_MAX 1024

/** One page of a listing. */
typedef struct idem_store_page {
    idem_store_listed_t *items; /* n of them, owned (idem_store_page_cleanup) */
    size_t n;
    /** "" when the listing is complete; else where the next call resumes
     * (possibly with no item on this page: a page also stops after a
     * bounded number of records visited). */
    char cursor[IDEM_STORE_CURSOR_MAX + 1];
} idem_store_page_t;

/** The most records one page may hold. */
#define IDEM_STORE_LIST_MAX 1000

/** List one page of the records that match f.
 * @param cursor  NULL or "" to start; else a page's cursor from the same filter.
 * @param limit   1..IDEM_STORE_LIST_MAX.
 * @param[out] page  zeroed first; cleaned with idem_store_page_cleanup.
 * @return IDEM_OK, IDEM_E_INVAL (bad filter, limit or cursor),
 *         IDEM_E_STORE_DOWN, IDEM_E_IO, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_store_list(idem_store_t *store, const idem_store_filter_t *f,
                                       const char *cursor, size_t limit,
                                       idem_store_page_t *page);

/** Free what a page holds and zero it. */
IDEM_EXTERN void idem_store_page_cleanup(idem_store_page_t *page);

/** Remove listed records that are still as listed: each one only if the
 * store still holds a record under its id with the same state and fence
 * (so one claimed again, or completed, since it was listed stays).
 * @param n  at most IDEM_STORE_LIST_MAX.
 * @param[out] deleted  how many were removed (NULL allowed); removed[i]
 *             (NULL allowed, n entries) says which.
 * @return IDEM_OK, or a store error (then *deleted counts what a partial
 *         run removed, which may be fewer than were). */
IDEM_EXTERN idem_err_t idem_store_delete_listed(idem_store_t *store,
                                                const idem_store_listed_t *items, size_t n,
                                                size_t *deleted, bool *removed);

#endif /* IDEM_STORE_H */
