/* src/store/pool.h - the connection pool and the outage state of the
 * network stores (redis.c, postgres.c).
 *
 * A store handle is called from several threads and each call needs a
 * connection of its own for its round trips, so a handle keeps a pool:
 * borrow an idle connection or open a new one (at most max at once), give
 * it back when done.  The pool knows nothing of Redis or PostgreSQL: the
 * backend's connection struct embeds a struct idem__pool_conn, and the
 * backend hands the pool three callbacks, connect, close and (optional)
 * healthy, in the manner of h2o's socket pool and curl's connection cache.
 * The pool owns the outage state: when a connect fails the store is down,
 * and for one backoff every borrow fails at once, so an outage costs
 * microseconds per call rather than a connect timeout.  The design is
 * described at the top of src/store/pool.c.
 *
 * Messages are the backend's: a borrow that fails says why in an
 * idem__pool_fail_t, and the backend words it for idem_store_errstr.
 *
 * THREADING: every function but init and cleanup may be called from any
 * number of threads at once; callbacks run without the pool's lock held.
 */
#ifndef IDEM_STORE_POOL_H
#define IDEM_STORE_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/random.h"

/* The backoff after a failed connect: its ceiling starts here, doubles with
 * every failure up to the most, and is reset by a success; the wait is
 * jittered between half the ceiling and all of it. */
#define IDEM__POOL_BACKOFF_MIN_MS 100
#define IDEM__POOL_BACKOFF_MAX_MS 5000
/* Longest reason kept for a failed connect. */
#define IDEM__POOL_WHY_MAX 256

/* The head of a backend's connection struct; the pool's only. */
struct idem__pool_conn {
    struct idem__pool_conn *next; /* the idle list */
    unsigned long gen;            /* the pool's generation when it was opened */
};

struct idem__pool_ops {
    /* Open one connection.  On failure *out stays NULL, why says what failed
     * (NUL-terminated, whylen bytes), and the result is the error a borrow
     * returns: IDEM_E_NOMEM leaves the store up (nothing is known about the
     * server), any other error starts or extends an outage. */
    idem_err_t (*connect)(void *ctx, struct idem__pool_conn **out, char *why, size_t whylen);
    /* Close a connection the pool no longer wants. */
    void (*close)(void *ctx, struct idem__pool_conn *c);
    /* Optional: whether an idle connection may still be used (the server did
     * not close it meanwhile); NULL: always. */
    bool (*healthy)(void *ctx, struct idem__pool_conn *c);
};

/* How long a borrow may wait and how the pool behaves. */
typedef struct idem__pool_cfg {
    const struct idem__pool_ops *ops;
    void *ctx;       /* passed to the callbacks */
    int max;         /* connections open at once, >= 1 */
    int64_t wait_ms; /* longest wait for a connection when all are lent out */
    /* Tests only: a clock in monotonic milliseconds and the jitter's random
     * source; NULL for the real ones (idem_clock_mono_ns, the kernel). */
    const idem_clock_t *clock;
    const idem_rng_t *rng;
} idem__pool_cfg_t;

typedef struct idem__pool {
    idem__pool_cfg_t cfg;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* a connection came back, or the outage state changed */
    struct idem__pool_conn *idle; /* guarded by mu, and so is everything below */
    int open;                     /* connections open or being opened */
    unsigned long gen;            /* bumped when a connection breaks */
    /* The outage state. */
    bool down;                    /* the last connect failed, or the server stopped answering */
    bool probing;                 /* a caller is connecting while down */
    int64_t retry_at_ms;          /* while down: no connect before this (monotonic) */
    int64_t ceiling_ms;           /* the next backoff's ceiling */
    char why[IDEM__POOL_WHY_MAX]; /* why it is down */
} idem__pool_t;

/* Why a borrow failed. */
typedef enum idem__pool_failure {
    IDEM__POOL_DOWN = 1, /* in an outage's backoff (or another caller is trying): no attempt */
    IDEM__POOL_CONNECT,  /* this borrow tried to connect and failed */
    IDEM__POOL_BUSY,     /* every connection stayed lent out for wait_ms */
} idem__pool_failure_t;

typedef struct idem__pool_fail {
    idem__pool_failure_t kind;
    int64_t retry_in_ms;          /* DOWN: until the next attempt is allowed (>= 0) */
    char why[IDEM__POOL_WHY_MAX]; /* DOWN: why the store is down; CONNECT: why it failed */
} idem__pool_fail_t;

/** Set up an empty pool.  cfg is copied.  Returns IDEM_OK or IDEM_E_NOMEM. */
idem_err_t idem__pool_init(idem__pool_t *p, const idem__pool_cfg_t *cfg);

/** Close every idle connection and free the pool's resources.  No
 * connection may be lent out. */
void idem__pool_cleanup(idem__pool_t *p);

/** Borrow a connection: an idle healthy one of the current generation,
 * else a new one if fewer than max are open and the store is not in an
 * outage's backoff, else wait up to wait_ms for one to come back.  While
 * down, the first caller after the backoff tries to connect and the others
 * fail at once.
 * @param[out] out    the connection, NULL on failure.
 * @param[out] fresh  (may be NULL) whether it was opened by this call.
 * @param[out] fail   (may be NULL) why it failed.
 * @return IDEM_OK; IDEM_E_STORE_DOWN (DOWN, BUSY, or a failed connect);
 *         or what connect returned (IDEM_E_NOMEM). */
idem_err_t idem__pool_borrow(idem__pool_t *p, struct idem__pool_conn **out, bool *fresh,
                             idem__pool_fail_t *fail);

/** Give a borrowed connection back.  broken: close it, and the idle ones
 * with it (after a server restart or failover they are all stale): the
 * pool's generation moves on, and a connection of an older generation
 * that comes back later is closed too. */
void idem__pool_give_back(idem__pool_t *p, struct idem__pool_conn *c, bool broken);

/** Add a connection the backend opened itself (postgres.c's first, which
 * also makes the table) to the idle ones, counted against max. */
void idem__pool_adopt(idem__pool_t *p, struct idem__pool_conn *c);

/** Start or extend an outage without a failed connect (a server that
 * stopped answering within its deadline): as a failed connect does. */
void idem__pool_mark_down(idem__pool_t *p, const char *why);

/** The monotonic clock in milliseconds (idem_clock_mono_ns), for the
 * deadlines of the backends' waits. */
static inline int64_t idem__pool_mono_ms(void)
{
    return (int64_t)(idem_clock_mono_ns() / 1000000u);
}

#endif /* IDEM_STORE_POOL_H */
