/* src/store/store_impl.h - what a store backend provides, and what it gets.
 *
 * The public API (include/idem/store.h) is a thin dispatcher in store.c over
 * one vtable per backend.  A backend defines a `const struct idem_store_ops`
 * with designated initialisers and a struct whose FIRST member is a
 * `struct idem_store` (so a backend's handle is also an idem_store_t *), and
 * is listed in the scheme table of store.c.  Adding a backend is one new
 * file plus one line in that table; a networked one borrows its
 * connections from src/store/pool.h (as redis.c and postgres.c do) and
 * reads its URL with src/core/url.h.
 *
 * What store.c does before a backend sees a call, so backends need not:
 *   - open: the URL is split at the first ':' and the scheme picks the
 *     backend; open gets the rest ("./dir?sync=always" for "lmdb:./dir?...").
 *   - exec: n is 1..IDEM_STORE_BATCH_MAX and every op has been checked:
 *     outputs are reset (err, decision, record zeroed), and an op store.c
 *     refuses (bad kind, empty or unterminated scope/key, a completion that
 *     cannot be encoded) has its err set already.  A backend applies exactly
 *     the ops whose err is IDEM_OK on entry and leaves the others alone.
 *   - get: id is checked, rec zeroed.
 *
 * What a backend promises: exec applies the ops in order, in one atomic
 * transaction (a later op of a batch sees what an earlier one wrote), with the
 * semantics of idem__store_apply below, so that all backends that decide in C
 * behave the same; a batch-level failure (the whole transaction was not
 * written) is returned as the result, and store.c then makes every op's err
 * that code and frees any replayed record.  Backend details go to
 * idem__store_seterr, read back by idem_store_errstr.
 *
 * THREADING: every op except open and close may be called from any number of
 * threads at once on one handle; a backend serialises what it must.
 */
#ifndef IDEM_STORE_IMPL_H
#define IDEM_STORE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/store.h"

/* Most operations one exec accepts; a larger batch is IDEM_E_INVAL. */
#define IDEM_STORE_BATCH_MAX 10000
/* Bytes of a (scope, key) identity as backends key it: scope '\0' key. */
#define IDEM_STORE_KEY_MAX (IDEM_SCOPE_MAX + 1 + IDEM_KEY_MAX)
/* Longest option name and value accepted in a store URL's query. */
#define IDEM_STORE_OPT_MAX 64

struct idem__list; /* a listing in progress (below) */
struct idem__watch_sink;

struct idem_store_ops {
    const char *name;   /* "memory", "lmdb": idem_store_name() */
    const char *scheme; /* the URL scheme before ':' that selects this backend */
    /* rest: the URL after "scheme:"; on failure *out stays NULL and errbuf
     * (errlen bytes, may be NULL) names the problem. */
    idem_err_t (*open)(const char *rest, idem_store_t **out, char *errbuf, size_t errlen);
    void (*close)(idem_store_t *store);
    idem_err_t (*exec)(idem_store_t *store, idem_op_t *ops, size_t n);
    idem_err_t (*get)(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                      idem_record_t *rec);
    idem_err_t (*sweep)(idem_store_t *store, int64_t now_ms, size_t max, size_t *removed);
    idem_err_t (*ping)(idem_store_t *store);
    /* Optional: the room left on disk (idem_store_space); NULL is
     * IDEM_E_UNSUPPORTED. */
    idem_err_t (*space)(idem_store_t *store, idem_store_space_t *out);
    /* Optional: the backend keeps its own error text (e.g. a client
     * library's); NULL means the text set with idem__store_seterr. */
    const char *(*errstr)(idem_store_t *store);
    /* Optional: one page of a listing (idem_store_list), below; NULL is
     * IDEM_E_UNSUPPORTED. */
    idem_err_t (*list)(idem_store_t *store, struct idem__list *l);
    /* Optional: idem_store_delete_listed's conditional deletes done by the
     * backend (n is 1..IDEM_STORE_LIST_MAX; set removed[i] for each record
     * removed).  NULL: store.c runs them through exec as IDEM__OP_DELETE_IF
     * ops, which a backend that decides with idem__store_apply applies. */
    idem_err_t (*delete_if)(idem_store_t *store, const idem_store_listed_t *items, size_t n,
                            bool *removed);
    /* Optional, for stores several processes share over a network (the
     * invalidations of local_cache; see "Invalidations" below).  publish
     * sends msg (len bytes, at most IDEM__INVAL_MSG_MAX) to every process
     * that watches this store, itself included; NULL: nothing to tell
     * anyone (idem_store_publish_* are then IDEM_OK).  watch_session runs
     * one session of the watch on store.c's watch thread: connect, subscribe,
     * idem__watch_up once every later message will be seen, then
     * idem__watch_message for each; it returns when its connection fails or
     * stop_fd becomes readable, and store.c then reports the watch down and
     * starts another after a pause.  NULL: idem_store_watch is
     * IDEM_E_UNSUPPORTED. */
    idem_err_t (*publish)(idem_store_t *store, const char *msg, size_t len);
    void (*watch_session)(idem_store_t *store, int stop_fd, struct idem__watch_sink *sink);

};

/* The head of every backend's handle. */
struct idem_store {
    const struct idem_store_ops *ops;
    /* exec returns in microseconds, never waiting for a disk flush or a
     * network round trip (memory:, lmdb with sync=interval).  Zero (the
     * safe default) for every backend that does not say so. */
    bool exec_is_cheap;
    /* get reads local memory or a local file (memory:, lmdb:), never the
     * network, so a caller may read on a latency-sensitive thread. */
    bool reads_are_local;
    /* The watch thread of idem_store_watch (store.c), stopped by
     * idem_store_close before the backend closes; NULL without. */
    struct idem__watch *watch;
};

/* The backends store.c knows (one per file). */
extern const struct idem_store_ops idem__store_memory_ops;
extern const struct idem_store_ops idem__store_lmdb_ops;
extern const struct idem_store_ops idem__store_rocksdb_ops;        /* rocksdb: */
extern const struct idem_store_ops idem__store_redis_ops;          /* redis:// */
extern const struct idem_store_ops idem__store_redis_sentinel_ops; /* redis+sentinel:// */
extern const struct idem_store_ops idem__store_rediss_ops;          /* rediss:// (TLS) */
extern const struct idem_store_ops idem__store_rediss_sentinel_ops; /* rediss+sentinel:// */
extern const struct idem_store_ops idem__store_redis_cluster_ops;   /* redis+cluster:// */
extern const struct idem_store_ops idem__store_rediss_cluster_ops;  /* rediss+cluster:// */
extern const struct idem_store_ops idem__store_postgres_ops, idem__store_postgresql_ops;

/* ---- listing (idem_store_list) -------------------------------------------
 *
 * store.c checks the filter and the cursor, then calls the backend's list
 * with an idem__list_t.  An ordered backend (keys sorted as scope '\0' key,
 * which sorts by scope then key) visits its keys from idem__store_list_start
 * on, in order, skips the key equal to the start when *exclusive says so,
 * stops at the first key for which idem__store_list_in_range is 0, and
 * offers every other key with idem__store_list_offer; when that returns 1 it
 * calls idem__store_list_resume_after with that key and stops.  A backend
 * that runs out of keys leaves the page's cursor "" (the listing is
 * complete).  A backend with a cursor of its own (Redis SCAN) reads
 * l->raw and writes page->cursor itself (text that does not begin with
 * 'k', which is the ordered cursor's mark). */
typedef struct idem__list {
    const idem_store_filter_t *f;
    idem_store_page_t *page;
    size_t limit;    /* records wanted on this page */
    size_t budget;   /* records a page may visit before it stops with a cursor */
    size_t visited;
    const char *raw; /* the cursor as given; "" at the start */
    bool has_after;  /* an ordered cursor: resume strictly after `after` */
    size_t after_len;
    char after[IDEM_STORE_KEY_MAX];
    idem_err_t err;  /* IDEM_E_NOMEM when an item could not be kept */
} idem__list_t;

/* The internal op idem_store_delete_listed runs through exec on a backend
 * without delete_if: delete the record if present with op->fence and the
 * state op->flags (an idem_state_t); else err IDEM_E_FENCE.  Never accepted
 * from idem_store_exec's callers. */
#define IDEM__OP_DELETE_IF ((idem_op_kind_t)64)

/* Where an ordered walk starts: the larger of the filter's range start
 * (scope '\0' prefix) and the cursor, into buf (IDEM_STORE_KEY_MAX bytes);
 * *exclusive when it is the cursor's key, to be skipped.  Returns the length
 * (0: the first key of the store). */
size_t idem__store_list_start(const idem__list_t *l, char *buf, bool *exclusive);

/* Whether store key k (scope '\0' key) may still match: 0 once an ordered
 * walk is past the filter's range (scope and prefix), so it stops. */
int idem__store_list_in_range(const idem__list_t *l, const char *k, size_t klen);

/* Offer the record stored under k with value val to the page: kept when it
 * matches the filter.  Returns 1 when the backend must stop after it (the
 * page is full or the budget spent), else 0. */
int idem__store_list_offer(idem__list_t *l, const char *k, size_t klen, const uint8_t *val,
                           size_t vlen);

/* The same with the record's head already read (no headers or body are
 * kept; head NULL: a value that did not decode, which is skipped). */
int idem__store_list_offer_head(idem__list_t *l, const char *k, size_t klen,
                                const idem_record_t *head);

/* Set the page's cursor to resume strictly after store key k. */
void idem__store_list_resume_after(idem__list_t *l, const char *k, size_t klen);

/** The value of a lower-case hex digit, -1 for any other character: the
 * digits of the list cursors (store.c's and redis_list.c's). */
int idem__store_hexval(int c);

/* Whether a record head matches the filter's state and age (not its
 * scope or prefix); for backends that read heads otherwise (Redis). */
bool idem__store_list_match(const idem_store_filter_t *f, const idem_record_t *head);
/* ---- Invalidations (local_cache across processes) --------------------------
 *
 * A message is "d:" scope ":" key (a record was deleted) or "c:" (forget
 * every record), at most IDEM__INVAL_MSG_MAX bytes; scope is "anonymous" or
 * 64 lowercase hex digits, so the key is everything after the second ':'.
 * store.c builds and checks them: a backend only carries the bytes, and a
 * message that does not parse (a stranger on the channel) is counted and
 * ignored, never trusted. */
#define IDEM__INVAL_MSG_MAX (2 + IDEM_SCOPE_MAX + 1 + IDEM_KEY_MAX)

/* What a watch session reports to (store.c); any call from the session's
 * thread only. */
typedef struct idem__watch_sink idem__watch_sink_t;
/* Subscribed: every message published from now on will arrive. */
void idem__watch_up(idem__watch_sink_t *sink);
/* One message as it came (checked by store.c). */
void idem__watch_message(idem__watch_sink_t *sink, const char *msg, size_t len);

/* Stop and free a watch (idem_store_close, before the backend closes);
 * NULL: nothing. */
void idem__watch_stop(struct idem__watch *w);

/* postgres_sub.c: one LISTEN session on channel for postgres.c, connecting
 * with the store's libpq URL and connect_timeout (whole seconds). */
void idem__pg_watch_session(const char *uri, const char *connect_timeout, const char *channel,
                            int64_t timeout_ms, int stop_fd, idem__watch_sink_t *sink);

/* The message for id (id NULL: "forget everything") into buf
 * (IDEM__INVAL_MSG_MAX bytes); its length. */
size_t idem__inval_encode(const idem_key_id_t *id, char *buf);
/* Read a message: 1 with *id set ("d:"), 2 for "c:", 0 when malformed. */
int idem__inval_decode(const char *msg, size_t len, idem_key_id_t *id);


/* ---- helpers for backends (store.c) -------------------------------------- */

/* Record a detail for idem_store_errstr(store) in the calling thread. */
void idem__store_seterr(idem_store_t *store, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* How long until the lease of the in_progress record under id ends, for a
 * busy answer (locks, de-duplication): exact from the record when it can be
 * read, else the decision's whole seconds; at least 1 ms.  A held record
 * (IDEM_REC_HELD) has no lease to wait for: the decision's figure. */
int64_t idem__store_wait_for_lease(idem_store_t *store, const idem_key_id_t *id, int64_t now_ms,
                                   int64_t retry_after_s);

/* snprintf into an open() error buffer; errbuf may be NULL. */
void idem__store_errbuf(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Write id as backends key it (scope '\0' key) into buf, which holds
 * IDEM_STORE_KEY_MAX bytes; returns the length. */
size_t idem__store_key(const idem_key_id_t *id, char *buf);

/* Split a URL rest "PATH?opt=v&opt=v" at '?': *path_len is the length of
 * PATH and *query points after the '?' (or at the final NUL). */
void idem__store_split(const char *rest, size_t *path_len, const char **query);

/* Take the next "name=value" of a query into name and value (each
 * IDEM_STORE_OPT_MAX + 1 bytes, NUL-terminated) and advance *query.
 * Returns 1 for an option, 0 at the end, -1 for a malformed one (no '=',
 * empty name, too long), with a sentence in errbuf. */
int idem__store_next_opt(const char **query, char *name, char *value, char *errbuf,
                         size_t errlen);

/* The directory of an embedded store's URL rest "PATH?query" into dir
 * (dirlen bytes) and *query after it; IDEM_E_INVAL with a sentence when
 * PATH is empty or too long.  scheme names the store in the sentence. */
idem_err_t idem__store_dir(const char *scheme, const char *rest, char *dir, size_t dirlen,
                           const char **query, char *errbuf, size_t errlen);

/* The value of an embedded store's sync option: "always" (*nosync 0) or
 * "interval" (1); 0, or -1 with a sentence naming the store. */
int idem__store_sync_opt(const char *scheme, const char *value, int *nosync, char *errbuf,
                         size_t errlen);

/* Read a size option ("64MiB") between lo and hi into *out; 0, or -1 with a
 * sentence "<store> store option <name>=<value>: expected a size <range>". */
int idem__store_size_opt(const char *store, const char *name, const char *value, uint64_t lo,
                         uint64_t hi, const char *range, uint64_t *out, char *errbuf,
                         size_t errlen);

/* The background flush of an embedded store with sync=interval (lmdb:,
 * rocksdb:): a thread that calls flush(arg) every interval_ns and once
 * more when stopped, and keeps whether the last call failed (nonzero),
 * which the store's ping reports. */
typedef struct idem__flusher {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stopping; /* guarded by lock */
    long interval_ns;
    int (*flush)(void *arg);
    void *arg;
    atomic_int failed; /* the last flush failed */
} idem__flusher_t;

/* Start f's thread; 0, or -1 when it cannot start (nothing to stop then). */
int idem__flusher_start(idem__flusher_t *f, long interval_ns, int (*flush)(void *arg),
                        void *arg);

/* Stop f's thread after one last flush, and wait for it. */
void idem__flusher_stop(idem__flusher_t *f);

/* What the backend must do with the stored value after idem__store_apply. */
typedef enum idem__store_action {
    IDEM__STORE_KEEP = 0, /* write nothing */
    IDEM__STORE_PUT = 1,  /* store idem_record_encode_into(next) under the key */
    IDEM__STORE_DEL = 2,  /* delete the key */
} idem__store_action_t;

/* Apply one op (err IDEM_OK on entry) to the value the store holds for its
 * key (cur, cur_len; cur NULL when there is none).  Sets op->err,
 * op->decision and, for a replay, op->record, and says what to write.  On
 * PUT, *next is the record to store; it may point at op->response (borrowed)
 * but never into cur, so a backend may overwrite cur's storage while it
 * encodes next.
 *
 *   CLAIM     idem_decide; CLAIM/TAKEOVER -> PUT a fresh in_progress record
 *             (op's fp, lease_until, expires_at, the new fence); REPLAY -> the
 *             whole record decoded into op->record (err NOMEM if that fails).
 *   COMPLETE  record present, in_progress, same fence -> PUT completed with
 *             op's response, flags and expires_at; else err IDEM_E_FENCE.
 *   HOLD      same check -> PUT in_progress + IDEM_REC_HELD, op's lease_until
 *             and expires_at.
 *   RENEW     same check -> PUT with op's lease_until; expires_at is raised to
 *             the new lease end if it was earlier, so a record never expires
 *             under a live lease.
 *   RELEASE   same check -> DEL.
 *   DELETE    present -> DEL; absent -> err IDEM_E_NOTFOUND.
 *   TOKEN_ISSUE  a live record there -> err IDEM_E_EXISTS; else PUT an unused
 *             token (in_progress, IDEM_REC_TOKEN, fence 1, expires_at).
 *   TOKEN_USE  op->token = idem_token_decide; FIRST_USE -> PUT it completed.
 *   TOKEN_RESTORE  a used token before its expiry -> PUT it in_progress;
 *             else err IDEM_E_FENCE.
 * A stored value that does not decode makes the op IDEM_E_CORRUPT (DELETE
 * still removes it).  Retention is not checked by fenced ops: a record past
 * expires_at that is still present and still carries the caller's fence was
 * claimed by nobody else, so its owner may still finish it. */
idem__store_action_t idem__store_apply(idem_op_t *op, const uint8_t *cur, size_t cur_len,
                                       idem_record_t *next);

/* How many records the sweeps of every embedded store (lmdb:, rocksdb:)
 * have read since the process started: a test of expiry order checks
 * that a sweep reads the records that leave and no live one.  Relaxed
 * increments; tests only read it. */
extern atomic_ulong idem__store_sweep_visits;

/* ---- I/O fault injection (tests only) ----------------------------------
 *
 * The I/O counterpart of idem_alloc_fail_after (SQLite's I/O-error tests):
 * after idem__store_fail_io_after(n), the nth store I/O from then on fails,
 * once, and the later ones go through (idem__store_fail_io_from(n): it and
 * every later one fail).  A store I/O is one call that reaches
 * a disk or a server: an LMDB transaction begin, get, put, delete, cursor
 * step or commit; a Redis connect or reply read; a PostgreSQL connect or
 * pipeline round; the memory store's exec (its "commit").  Each backend
 * calls idem__store_io_fault() at those points and, when it says so, acts
 * exactly as if the library call had failed there (LMDB EIO, a Redis or
 * PostgreSQL connection lost after the request went out), so the error paths
 * that run are the real ones.  Not public: the tests include this header.
 *
 * Off, the check is one relaxed load of a global and a predicted branch.
 *
 * THREADING: the state is atomic; any thread may hit a fault point while a
 * test arms or disarms it, and exactly one caller gets the nth fault. */

/* Arm (n >= 1: the nth I/O from now fails, once) or disarm (n <= 0). */
void idem__store_fail_io_after(long n);

/* Arm so that the nth I/O from now and every later one fail (a server that
 * went away: reconnects fail too), until idem__store_fail_io_after(0). */
void idem__store_fail_io_from(long n);

/* How many faults have been injected since the process started. */
unsigned long idem__store_io_injected(void);

/* Nonzero while armed (do not use directly). */
extern atomic_int idem__store_io_armed;

/* The slow path of idem__store_io_fault (store.c). */
bool idem__store_io_fault_slow(void);

/* Whether this I/O is to fail by injection. */
static inline bool idem__store_io_fault(void)
{
    if (__builtin_expect(!atomic_load_explicit(&idem__store_io_armed, memory_order_relaxed), 1))
        return false;
    return idem__store_io_fault_slow();
}

#endif /* IDEM_STORE_IMPL_H */
