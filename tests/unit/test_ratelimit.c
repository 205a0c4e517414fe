/* tests/unit/test_ratelimit.c - scope_rate_limit's buckets (src/gateway/ratelimit.c).
 *
 * Time is passed in, so nothing here sleeps. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gateway/ratelimit.h"

#define S 1000000000ull /* one second in ns */

static idem_rate_t rate(const char *text)
{
    idem_rate_t r;
    cr_assert_eq(idem__rate_parse(text, &r), 0, "%s", text);
    return r;
}

Test(ratelimit, parse_rates)
{
    idem_rate_t r = rate("200/s");
    cr_expect_eq(r.count, 200);
    cr_expect_eq(r.period_ms, 1000);
    r = rate("3/m");
    cr_expect_eq(r.count, 3);
    cr_expect_eq(r.period_ms, 60000);
    r = rate("1/h");
    cr_expect_eq(r.count, 1);
    cr_expect_eq(r.period_ms, 3600000);
    r = rate("1000000/s");
    cr_expect_eq(r.count, 1000000);
    r = rate("off");
    cr_expect_eq(r.count, 0);
}

Test(ratelimit, parse_refuses_other_text)
{
    const char *bad[] = {"", "200", "200/", "/s", "0/s", "-1/s", "1.5/s", "200/sec", "200/d",
                         "200 /s", "200/ s", "1000001/s", "99999999999999999999/s", "Off",
                         "200/S", "+2/s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_rate_t r;
        cr_expect_eq(idem__rate_parse(bad[i], &r), -1, "%s", bad[i]);
        cr_expect_eq(r.count, 0);
    }
}

Test(ratelimit, off_or_empty_bound_is_no_limiter_and_null_allows)
{
    cr_expect_null(idem__ratelimit_create(rate("off"), 10));
    cr_expect_null(idem__ratelimit_create(rate("1/s"), 0));
    int64_t ra = 7;
    cr_expect(idem__ratelimit_take(NULL, "anonymous", 0, &ra));
    cr_expect_eq(ra, 0);
    idem__ratelimit_destroy(NULL);
    cr_expect_eq(idem__ratelimit_tracked(NULL), 0);
}

Test(ratelimit, a_burst_of_exactly_n_then_refused)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("3/h"), 100);
    uint64_t now = 5 * S;
    int64_t ra;
    for (int i = 0; i < 3; i++)
        cr_expect(idem__ratelimit_take(rl, "anonymous", now, &ra), "request %d", i);
    cr_expect_not(idem__ratelimit_take(rl, "anonymous", now, &ra));
    cr_expect_eq(ra, 1200); /* one request's share of an hour */
    cr_expect_not(idem__ratelimit_take(rl, "anonymous", now + 1199 * S, &ra));
    cr_expect_eq(ra, 1);
    cr_expect(idem__ratelimit_take(rl, "anonymous", now + 1200 * S, &ra));
    cr_expect_not(idem__ratelimit_take(rl, "anonymous", now + 1200 * S, &ra));
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, refusals_cost_nothing)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("1/s"), 100);
    int64_t ra;
    cr_expect(idem__ratelimit_take(rl, "a", S, &ra));
    for (int i = 0; i < 100; i++)
        cr_expect_not(idem__ratelimit_take(rl, "a", S + S / 2, &ra));
    cr_expect(idem__ratelimit_take(rl, "a", 2 * S, &ra));
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, sustained_rate_is_n_per_period)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("10/s"), 100);
    int64_t ra;
    int passed = 0;
    /* 1000 attempts a second for 10 s: the burst of 10, then 10 a second. */
    for (uint64_t t = S; t < 11 * S; t += S / 1000)
        passed += idem__ratelimit_take(rl, "a", t, &ra);
    cr_expect_geq(passed, 109);
    cr_expect_leq(passed, 111);
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, scopes_have_buckets_of_their_own)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("1/m"), 100);
    int64_t ra;
    cr_expect(idem__ratelimit_take(rl, "alice", S, &ra));
    cr_expect_not(idem__ratelimit_take(rl, "alice", S, &ra));
    cr_expect(idem__ratelimit_take(rl, "bob", S, &ra));
    cr_expect(idem__ratelimit_take(rl, "anonymous", S, &ra));
    cr_expect_not(idem__ratelimit_take(rl, "anonymous", S, &ra));
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, tracked_scopes_stay_within_the_bound)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("1/h"), 50);
    char scope[32];
    int64_t ra;
    for (int i = 0; i < 10000; i++) {
        snprintf(scope, sizeof scope, "s%d", i);
        cr_expect(idem__ratelimit_take(rl, scope, S, &ra)); /* each new one has a full bucket */
        cr_assert_leq(idem__ratelimit_tracked(rl), 50);
    }
    cr_expect_eq(idem__ratelimit_tracked(rl), 50);
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, the_most_recently_used_survive_eviction)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("1/h"), 10);
    char scope[32];
    int64_t ra;
    cr_expect(idem__ratelimit_take(rl, "busy", S, &ra));
    for (int i = 0; i < 100; i++) {
        snprintf(scope, sizeof scope, "s%d", i);
        idem__ratelimit_take(rl, scope, S, &ra);
        /* busy keeps asking, so it is never the least recently used. */
        cr_expect_not(idem__ratelimit_take(rl, "busy", S, &ra), "round %d", i);
    }
    idem__ratelimit_destroy(rl);
}

Test(ratelimit, full_buckets_are_forgotten)
{
    idem_ratelimit_t *rl = idem__ratelimit_create(rate("10/s"), 1000);
    char scope[32];
    int64_t ra;
    for (int i = 0; i < 100; i++) {
        snprintf(scope, sizeof scope, "s%d", i);
        idem__ratelimit_take(rl, scope, S, &ra);
    }
    cr_expect_eq(idem__ratelimit_tracked(rl), 100);
    /* Much later every old bucket is full again: new scopes push them out. */
    for (int i = 0; i < 60; i++) {
        snprintf(scope, sizeof scope, "t%d", i);
        idem__ratelimit_take(rl, scope, 100 * S, &ra);
    }
    cr_expect_lt(idem__ratelimit_tracked(rl), 100);
    idem__ratelimit_destroy(rl);
}

static idem_ratelimit_t *shared;
static int allowed[4];

static void *hammer(void *arg)
{
    int id = *(int *)arg;
    int64_t ra;
    for (int i = 0; i < 10000; i++)
        allowed[id] += idem__ratelimit_take(shared, "anonymous", S, &ra);
    return NULL;
}

Test(ratelimit, threads_share_one_bucket)
{
    shared = idem__ratelimit_create(rate("1000/h"), 100);
    pthread_t t[4];
    int ids[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer, &ids[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(allowed[0] + allowed[1] + allowed[2] + allowed[3], 1000);
    idem__ratelimit_destroy(shared);
}
