/* src/store/pool.c - one connection pool and one outage backoff for the
 * network stores.
 *
 * Redis and PostgreSQL had a pool each, with the same job and small
 * differences; this is the one they share (pool.h has the API).
 *
 * Connections.  At most cfg.max are open at once, counting those being
 * opened.  A borrow takes an idle one (newest first: it is the likeliest to
 * be alive and warm), else opens one if there is room, else waits for one
 * to come back, at most cfg.wait_ms.  Before an idle connection is lent
 * out it must be of the current generation and, if the backend has a
 * healthy callback, pass it (Redis: the server did not close it while it
 * sat idle); one that fails is closed and the next one tried.  When a
 * connection breaks mid-call, the server has probably restarted or failed
 * over, so the idle ones are closed with it and the generation moves on:
 * a connection lent out before the break is closed when it comes back.
 *
 * Outages.  A failed connect (other than out of memory) puts the store
 * down, and so may the backend (idem__pool_mark_down: PostgreSQL when a
 * server stops answering within its deadline).  While down, a borrow that
 * finds no idle connection fails at once with IDEM__POOL_DOWN until
 * retry_at; the first borrow after it is the probe that tries to connect
 * while every other caller goes on failing fast, and its success ends the
 * outage.  The backoff's ceiling starts at 100 ms and doubles with every
 * failure up to 5 s; a success resets it.  The wait itself is "equal
 * jitter": half the ceiling plus a random part of the other half, so the
 * many processes that share a server that restarted do not all come back
 * in the same millisecond, and no wait is longer than the ceiling (idemd's
 * recovery time stays bounded by 5 s).
 *
 * Fault injection (store_impl.h) stays in the backends: the pool does no
 * I/O and allocates nothing; a connect callback that hits an injected
 * fault fails like any other connect.
 *
 * THREADING: mu guards the idle list, the counts, the generation and the
 * outage state; cv is signalled when a connection comes back and broadcast
 * when the counts or the outage state change.  Callbacks run without mu.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "store/pool.h"

static int64_t now_ms(const idem__pool_t *p)
{
    if (p->cfg.clock != NULL)
        return idem_clock_now(p->cfg.clock);
    return idem__pool_mono_ms();
}

/* Enter or extend the outage (mu held). */
static void go_down(idem__pool_t *p, const char *why)
{
    int64_t ceiling = p->ceiling_ms, half = ceiling / 2;
    int64_t wait = half + (int64_t)idem_rng_below(p->cfg.rng, (uint64_t)(ceiling - half) + 1);
    p->down = true;
    p->retry_at_ms = now_ms(p) + wait;
    p->ceiling_ms = ceiling * 2 > IDEM__POOL_BACKOFF_MAX_MS ? IDEM__POOL_BACKOFF_MAX_MS
                                                             : ceiling * 2;
    snprintf(p->why, sizeof p->why, "%s", why);
    pthread_cond_broadcast(&p->cv);
}

idem_err_t idem__pool_init(idem__pool_t *p, const idem__pool_cfg_t *cfg)
{
    pthread_condattr_t ca;

    memset(p, 0, sizeof *p);
    p->cfg = *cfg;
    p->ceiling_ms = IDEM__POOL_BACKOFF_MIN_MS;
    if (pthread_condattr_init(&ca) != 0)
        return IDEM_E_NOMEM;
    /* The waits' deadlines are monotonic: a wall-clock step cannot stretch one. */
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return IDEM_E_NOMEM;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        pthread_cond_destroy(&p->cv);
        return IDEM_E_NOMEM;
    }
    return IDEM_OK;
}

/* Close a list of connections (mu not held). */
static void close_list(idem__pool_t *p, struct idem__pool_conn *list)
{
    while (list != NULL) {
        struct idem__pool_conn *next = list->next;
        p->cfg.ops->close(p->cfg.ctx, list);
        list = next;
    }
}

void idem__pool_cleanup(idem__pool_t *p)
{
    struct idem__pool_conn *list = p->idle;
    p->idle = NULL;
    close_list(p, list);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

/* The monotonic deadline wait_ms from now, for pthread_cond_timedwait. */
static struct timespec deadline_after(int64_t wait_ms)
{
    uint64_t ns = idem_clock_mono_ns() + (uint64_t)wait_ms * 1000000u;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    return ts;
}

idem_err_t idem__pool_borrow(idem__pool_t *p, struct idem__pool_conn **out, bool *fresh,
                             idem__pool_fail_t *fail)
{
    idem__pool_fail_t ignored;
    struct timespec until;
    bool have_deadline = false;

    if (fail == NULL)
        fail = &ignored;
    memset(fail, 0, sizeof *fail);
    *out = NULL;
    if (fresh != NULL)
        *fresh = false;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->idle != NULL) {
            struct idem__pool_conn *c = p->idle;
            p->idle = c->next;
            c->next = NULL;
            if (c->gen == p->gen) {
                if (p->cfg.ops->healthy == NULL) {
                    pthread_mutex_unlock(&p->mu);
                    *out = c;
                    return IDEM_OK;
                }
                pthread_mutex_unlock(&p->mu);
                if (p->cfg.ops->healthy(p->cfg.ctx, c)) {
                    *out = c;
                    return IDEM_OK;
                }
                pthread_mutex_lock(&p->mu);
            }
            p->open--;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            p->cfg.ops->close(p->cfg.ctx, c);
            pthread_mutex_lock(&p->mu);
        }
        if (p->down) {
            int64_t left = p->retry_at_ms - now_ms(p);
            if (left > 0 || p->probing) {
                fail->kind = IDEM__POOL_DOWN;
                fail->retry_in_ms = left > 0 ? left : 0;
                snprintf(fail->why, sizeof fail->why, "%s", p->why);
                pthread_mutex_unlock(&p->mu);
                return IDEM_E_STORE_DOWN;
            }
        }
        if (p->open < p->cfg.max) {
            bool probe = p->down; /* the one caller that tries while down */
            unsigned long gen = p->gen;
            p->open++;
            p->probing = p->probing || probe;
            pthread_mutex_unlock(&p->mu);

            struct idem__pool_conn *c = NULL;
            fail->why[0] = '\0';
            idem_err_t err = p->cfg.ops->connect(p->cfg.ctx, &c, fail->why, sizeof fail->why);

            pthread_mutex_lock(&p->mu);
            if (probe)
                p->probing = false;
            if (err != IDEM_OK || c == NULL) {
                if (err == IDEM_OK)
                    err = IDEM_E_STORE_DOWN; /* cannot happen: a callback that said nothing */
                p->open--;
                if (err != IDEM_E_NOMEM)
                    go_down(p, fail->why);
                else
                    pthread_cond_broadcast(&p->cv);
                pthread_mutex_unlock(&p->mu);
                fail->kind = IDEM__POOL_CONNECT;
                return err;
            }
            c->next = NULL;
            c->gen = gen;
            if (p->down) {
                p->down = false;
                p->why[0] = '\0';
            }
            p->ceiling_ms = IDEM__POOL_BACKOFF_MIN_MS;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            *out = c;
            if (fresh != NULL)
                *fresh = true;
            return IDEM_OK;
        }
        /* Every connection is lent out: wait for one, at most wait_ms in all. */
        if (!have_deadline) {
            until = deadline_after(p->cfg.wait_ms);
            have_deadline = true;
        }
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT && p->idle == NULL &&
            p->open >= p->cfg.max) {
            fail->kind = IDEM__POOL_BUSY;
            pthread_mutex_unlock(&p->mu);
            return IDEM_E_STORE_DOWN;
        }
    }
}

void idem__pool_give_back(idem__pool_t *p, struct idem__pool_conn *c, bool broken)
{
    struct idem__pool_conn *stale = NULL;

    pthread_mutex_lock(&p->mu);
    if (broken || c->gen != p->gen) {
        if (broken && c->gen == p->gen) {
            p->gen++;
            for (struct idem__pool_conn *i = p->idle; i != NULL; i = i->next)
                p->open--;
            stale = p->idle;
            p->idle = NULL;
        }
        p->open--;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        p->cfg.ops->close(p->cfg.ctx, c);
        close_list(p, stale);
        return;
    }
    c->next = p->idle;
    p->idle = c;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void idem__pool_adopt(idem__pool_t *p, struct idem__pool_conn *c)
{
    pthread_mutex_lock(&p->mu);
    p->open++;
    c->gen = p->gen;
    c->next = p->idle;
    p->idle = c;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void idem__pool_mark_down(idem__pool_t *p, const char *why)
{
    pthread_mutex_lock(&p->mu);
    go_down(p, why);
    pthread_mutex_unlock(&p->mu);
}
