/* tests/unit/test_pool.c - the network stores' connection pool and outage
 * backoff (src/store/pool.c), over a fake backend whose connects succeed or
 * fail on command, with the pool's clock and random source injected so that
 * no test sleeps through a backoff. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/pool.h"

struct fconn {
    struct idem__pool_conn pc; /* first */
    int id;
    bool healthy;
};

struct fake {
    int connects, closes, next_id;
    idem_err_t fail_with; /* IDEM_OK: connects succeed */
    int64_t now;          /* the injected clock, ms */
    uint64_t draw;        /* what the injected random source returns */
    /* A connect that waits until released (the probe test). */
    bool block;
    bool in_connect, go;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static idem_err_t f_connect(void *ctx, struct idem__pool_conn **out, char *why, size_t whylen)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->connects++;
    if (f->block) {
        f->in_connect = true;
        pthread_cond_broadcast(&f->cv);
        while (!f->go)
            pthread_cond_wait(&f->cv, &f->mu);
    }
    idem_err_t err = f->fail_with;
    pthread_mutex_unlock(&f->mu);
    if (err != IDEM_OK) {
        snprintf(why, whylen, "refused #%d", f->connects);
        *out = NULL;
        return err;
    }
    struct fconn *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->id = ++f->next_id;
    c->healthy = true;
    *out = &c->pc;
    return IDEM_OK;
}

static void f_close(void *ctx, struct idem__pool_conn *c)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->closes++;
    pthread_mutex_unlock(&f->mu);
    free(c);
}

static bool f_healthy(void *ctx, struct idem__pool_conn *c)
{
    (void)ctx;
    return ((struct fconn *)c)->healthy;
}

static const struct idem__pool_ops fake_ops = {f_connect, f_close, f_healthy};

static int64_t f_now(void *ctx)
{
    return ((struct fake *)ctx)->now;
}

static uint64_t f_draw(void *ctx)
{
    return ((struct fake *)ctx)->draw;
}

/* The draw that idem_rng_below(rng, bound) turns into bound - 1. */
static uint64_t top_draw(uint64_t bound)
{
    return UINT64_MAX - UINT64_MAX % bound - 1;
}

static struct fake fk;
static idem_clock_t clk = {f_now, &fk};
static idem_rng_t rng = {f_draw, &fk};
static idem__pool_t pool;

static void start(int max, int64_t wait_ms)
{
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    pthread_cond_init(&fk.cv, NULL);
    fk.now = 1000000;
    fk.draw = top_draw(51); /* the top of the first backoff's range */
    idem__pool_cfg_t cfg = {.ops = &fake_ops, .ctx = &fk, .max = max, .wait_ms = wait_ms,
                            .clock = &clk, .rng = &rng};
    cr_assert_eq(idem__pool_init(&pool, &cfg), IDEM_OK);
}

/* Close the pool: every connection ever opened has been closed. */
static void stop(void)
{
    idem__pool_cleanup(&pool);
    cr_expect_eq(fk.closes, fk.next_id, "%d opened, %d closed", fk.next_id, fk.closes);
}

static struct fconn *borrow(idem_err_t want, bool *fresh, idem__pool_fail_t *f)
{
    struct idem__pool_conn *c = (struct idem__pool_conn *)1;
    idem_err_t err = idem__pool_borrow(&pool, &c, fresh, f);
    cr_assert_eq(err, want, "borrow: %d, not %d", err, want);
    if (want != IDEM_OK)
        cr_assert_null(c);
    return (struct fconn *)c;
}

Test(pool, opens_lazily_and_reuses_what_comes_back)
{
    start(2, 1000);
    cr_expect_eq(fk.connects, 0, "nothing is opened before it is needed");
    bool fresh = false;
    struct fconn *a = borrow(IDEM_OK, &fresh, NULL);
    cr_expect(fresh);
    idem__pool_give_back(&pool, &a->pc, false);
    struct fconn *b = borrow(IDEM_OK, &fresh, NULL);
    cr_expect_eq(b, a);
    cr_expect_not(fresh);
    cr_expect_eq(fk.connects, 1);
    struct fconn *c = borrow(IDEM_OK, &fresh, NULL);
    cr_expect_neq(c, a, "a second caller gets a second connection");
    cr_expect(fresh);
    idem__pool_give_back(&pool, &b->pc, false);
    idem__pool_give_back(&pool, &c->pc, false);
    cr_expect_eq(borrow(IDEM_OK, NULL, NULL), c, "the newest idle one first");
    idem__pool_give_back(&pool, &c->pc, false);
    idem__pool_cleanup(&pool);
    cr_expect_eq(fk.closes, 2, "cleanup closes the idle ones");
}

Test(pool, at_most_max_then_busy)
{
    start(1, 20);
    struct fconn *a = borrow(IDEM_OK, NULL, NULL);
    idem__pool_fail_t f;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_BUSY);
    cr_expect_eq(fk.connects, 1);
    idem__pool_give_back(&pool, &a->pc, false);
    stop();
}

static void *borrow_in_thread(void *arg)
{
    (void)arg;
    struct idem__pool_conn *c = NULL;
    idem_err_t err = idem__pool_borrow(&pool, &c, NULL, NULL);
    return err == IDEM_OK ? c : NULL;
}

Test(pool, a_waiter_gets_the_connection_that_comes_back)
{
    start(1, 60000);
    struct fconn *a = borrow(IDEM_OK, NULL, NULL);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, borrow_in_thread, NULL), 0);
    idem__pool_give_back(&pool, &a->pc, false); /* before or after it waits: either way */
    void *got;
    pthread_join(t, &got);
    cr_expect_eq(got, &a->pc);
    cr_expect_eq(fk.connects, 1);
    idem__pool_give_back(&pool, got, false);
    stop();
}

Test(pool, a_broken_connection_takes_the_idle_and_the_older_ones_with_it)
{
    start(4, 20);
    struct fconn *a = borrow(IDEM_OK, NULL, NULL);
    struct fconn *b = borrow(IDEM_OK, NULL, NULL);
    struct fconn *c = borrow(IDEM_OK, NULL, NULL);
    struct fconn *d = borrow(IDEM_OK, NULL, NULL);
    idem__pool_give_back(&pool, &b->pc, false);
    idem__pool_give_back(&pool, &c->pc, false);
    idem__pool_give_back(&pool, &a->pc, true);
    cr_expect_eq(fk.closes, 3, "a, and b and c that were idle");
    idem__pool_give_back(&pool, &d->pc, false);
    cr_expect_eq(fk.closes, 4, "d was lent out before the break: closed when it comes back");
    bool fresh;
    struct fconn *e = borrow(IDEM_OK, &fresh, NULL);
    cr_expect(fresh);
    cr_expect_eq(fk.connects, 5);
    /* A break on a connection of an older generation starts nothing new. */
    struct fconn *g = borrow(IDEM_OK, NULL, NULL);
    idem__pool_give_back(&pool, &e->pc, true);
    idem__pool_give_back(&pool, &g->pc, true);
    cr_expect_eq(fk.closes, 6);
    struct fconn *k = borrow(IDEM_OK, &fresh, NULL);
    cr_expect_eq(k->id, 7);
    cr_expect(fresh);
    idem__pool_give_back(&pool, &k->pc, false);
    /* All four may be open again: the counts came back right. */
    struct fconn *h[4];
    for (int i = 0; i < 4; i++)
        h[i] = borrow(IDEM_OK, NULL, NULL);
    idem__pool_fail_t f;
    fk.connects = 0;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_BUSY, "and no more than four");
    for (int i = 0; i < 4; i++)
        idem__pool_give_back(&pool, &h[i]->pc, false);
    stop();
}

Test(pool, an_unhealthy_idle_connection_is_replaced)
{
    start(1, 1000);
    struct fconn *a = borrow(IDEM_OK, NULL, NULL);
    a->healthy = false;
    idem__pool_give_back(&pool, &a->pc, false);
    bool fresh;
    struct fconn *b = borrow(IDEM_OK, &fresh, NULL);
    cr_expect(fresh);
    cr_expect_eq(fk.closes, 1);
    cr_expect_eq(fk.connects, 2, "room for a new one although max is 1");
    idem__pool_give_back(&pool, &b->pc, false);
    stop();
}

Test(pool, a_failed_connect_starts_an_outage_that_fails_fast)
{
    start(2, 1000);
    fk.fail_with = IDEM_E_STORE_DOWN;
    idem__pool_fail_t f;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_CONNECT);
    cr_expect_str_eq(f.why, "refused #1");
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_DOWN);
    cr_expect_eq(fk.connects, 1, "no connect during the backoff");
    cr_expect_eq(f.retry_in_ms, 100, "the whole first ceiling (the draw is at the top)");
    cr_expect_str_eq(f.why, "refused #1");
    fk.now += 99;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.retry_in_ms, 1);
    fk.now += 1;
    fk.fail_with = IDEM_OK;
    bool fresh;
    struct fconn *a = borrow(IDEM_OK, &fresh, NULL);
    cr_expect(fresh, "the backoff over, the next borrow tries and the outage ends");
    fk.fail_with = IDEM_E_STORE_DOWN;
    borrow(IDEM_E_STORE_DOWN, NULL, &f); /* room for a second: it fails */
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.retry_in_ms, 100, "a success reset the ceiling");
    /* An idle connection is still lent out during an outage. */
    idem__pool_give_back(&pool, &a->pc, false);
    cr_expect_eq(borrow(IDEM_OK, NULL, NULL), a);
    idem__pool_give_back(&pool, &a->pc, false);
    stop();
}

Test(pool, the_backoff_doubles_to_5s_with_jitter_in_its_upper_half)
{
    const int64_t ceilings[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000};
    for (int top = 0; top < 2; top++) {
        start(1, 1000);
        fk.fail_with = IDEM_E_STORE_DOWN;
        idem__pool_fail_t f;
        for (size_t i = 0; i < sizeof ceilings / sizeof ceilings[0]; i++) {
            int64_t c = ceilings[i], half = c / 2, bound = c - half + 1;
            /* The draw that gives the top (bound - 1) or the bottom (0). */
            fk.draw = top ? top_draw((uint64_t)bound) : UINT64_MAX - UINT64_MAX % (uint64_t)bound;
            borrow(IDEM_E_STORE_DOWN, NULL, &f);
            cr_expect_eq(f.kind, IDEM__POOL_CONNECT);
            borrow(IDEM_E_STORE_DOWN, NULL, &f);
            cr_expect_eq(f.kind, IDEM__POOL_DOWN);
            cr_expect_eq(f.retry_in_ms, top ? c : half, "failure %zu: %lld", i,
                         (long long)f.retry_in_ms);
            fk.now += f.retry_in_ms;
        }
        cr_expect_eq(fk.connects, 9);
        stop();
    }
    /* From the kernel's generator: always within [ceiling / 2, ceiling]. */
    memset(&fk, 0, sizeof fk);
    fk.now = 5;
    idem__pool_cfg_t cfg = {.ops = &fake_ops, .ctx = &fk, .max = 1, .wait_ms = 10,
                            .clock = &clk};
    cr_assert_eq(idem__pool_init(&pool, &cfg), IDEM_OK);
    fk.fail_with = IDEM_E_STORE_DOWN;
    for (int i = 0; i < 200; i++) {
        idem__pool_fail_t f;
        borrow(IDEM_E_STORE_DOWN, NULL, &f);
        borrow(IDEM_E_STORE_DOWN, NULL, &f);
        int64_t c = i < 6 ? (int64_t)100 << i : 5000;
        cr_expect(f.retry_in_ms >= c / 2 && f.retry_in_ms <= c, "%d: %lld", i,
                  (long long)f.retry_in_ms);
        fk.now += f.retry_in_ms;
    }
    idem__pool_cleanup(&pool);
}

Test(pool, out_of_memory_in_a_connect_is_no_outage)
{
    start(1, 1000);
    fk.fail_with = IDEM_E_NOMEM;
    idem__pool_fail_t f;
    borrow(IDEM_E_NOMEM, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_CONNECT);
    borrow(IDEM_E_NOMEM, NULL, &f);
    cr_expect_eq(fk.connects, 2, "the next borrow tries again at once");
    fk.fail_with = IDEM_OK;
    idem__pool_give_back(&pool, &borrow(IDEM_OK, NULL, NULL)->pc, false);
    stop();
}

Test(pool, mark_down_starts_an_outage_without_a_connect)
{
    start(2, 1000);
    struct fconn *a = borrow(IDEM_OK, NULL, NULL);
    idem__pool_mark_down(&pool, "no answer within 6000 ms");
    idem__pool_fail_t f;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_DOWN);
    cr_expect_str_eq(f.why, "no answer within 6000 ms");
    cr_expect_eq(f.retry_in_ms, 100);
    idem__pool_give_back(&pool, &a->pc, false);
    cr_expect_eq(borrow(IDEM_OK, NULL, NULL), a, "an idle one is lent all the same");
    idem__pool_give_back(&pool, &a->pc, false);
    stop();
}

Test(pool, an_adopted_connection_counts_against_max)
{
    start(1, 10);
    struct fconn *own = calloc(1, sizeof *own);
    cr_assert_not_null(own);
    own->healthy = true;
    fk.next_id = 1; /* as if the backend's own connect had been ours */
    idem__pool_adopt(&pool, &own->pc);
    bool fresh = true;
    cr_expect_eq(borrow(IDEM_OK, &fresh, NULL), own);
    cr_expect_not(fresh);
    idem__pool_fail_t f;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_BUSY);
    idem__pool_give_back(&pool, &own->pc, false);
    stop();
}

static void *probe_thread(void *arg)
{
    (void)arg;
    struct idem__pool_conn *c = NULL;
    idem_err_t err = idem__pool_borrow(&pool, &c, NULL, NULL);
    return err == IDEM_OK ? c : NULL;
}

Test(pool, while_one_caller_probes_the_others_fail_fast)
{
    start(4, 60000);
    fk.fail_with = IDEM_E_STORE_DOWN;
    idem__pool_fail_t f;
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    fk.now += 100;
    fk.fail_with = IDEM_OK;
    fk.block = true;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, probe_thread, NULL), 0);
    pthread_mutex_lock(&fk.mu);
    while (!fk.in_connect)
        pthread_cond_wait(&fk.cv, &fk.mu);
    pthread_mutex_unlock(&fk.mu);
    borrow(IDEM_E_STORE_DOWN, NULL, &f);
    cr_expect_eq(f.kind, IDEM__POOL_DOWN);
    cr_expect_eq(f.retry_in_ms, 0, "past the backoff, but someone is trying");
    cr_expect_eq(fk.connects, 2);
    pthread_mutex_lock(&fk.mu);
    fk.go = true;
    fk.block = false;
    pthread_cond_broadcast(&fk.cv);
    pthread_mutex_unlock(&fk.mu);
    void *got;
    pthread_join(t, &got);
    cr_assert_not_null(got);
    struct fconn *b = borrow(IDEM_OK, NULL, NULL);
    cr_expect_neq(&b->pc, got, "the outage is over: a second connection opens");
    idem__pool_give_back(&pool, got, false);
    idem__pool_give_back(&pool, &b->pc, false);
    stop();
}
