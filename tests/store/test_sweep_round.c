/* tests/store/test_sweep_round.c - the sweeper keeps pace, on every backend.
 *
 * idemd's sweeper (src/gateway/writer.c) runs one round of
 * src/gateway/sweep.c a second.  A round must remove more than one step
 * when more than one step has expired, or a store that takes more new keys
 * a second than a step grows without end: these cases fill a store with
 * several steps' worth of expired records and count the calls (never the
 * time) one round needs to empty it, leaving the live records alone.
 *
 * Redis is left out of the rounds: it removes each record itself at its own
 * expires_at (PEXPIREAT), so idemd's rounds there are one TIME round trip
 * that removes nothing, and its sweep scans only for a caller whose clock
 * runs ahead (as these cases' T0 does), visiting keys in hash-table order
 * among every other key on the shared server: not a pace to count.
 *
 * Expiry order: PostgreSQL's sweep deletes the oldest expired first (its
 * expires_at index; lmdb:'s and rocksdb:'s expiry index is checked in
 * test_store_conformance.c); on Redis, each key's PEXPIRETIME is its record's
 * expires_at, and the sweep at the real time removes nothing.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "gateway/sweep.h"
#include "store_fixture.h"

#define TTL 86400000ll

/* One test per backend that sweeps by itself (see above: not Redis). */
#define ROUND_CASE(name)                     \
    static void name##_case(void);           \
    FX_TEST_FOR(sweep_round, memory, name)   \
    FX_TEST_FOR(sweep_round, lmdb, name)     \
    FX_TEST_FOR(sweep_round, rocksdb, name)  \
    FX_TEST_FOR(sweep_round, postgres, name) \
    static void name##_case(void)
#define EXPIRED 10000
#define LIVE 500
#define STEP 2000

/* A claim of key at T0 that is kept until expires. */
static idem_op_t claim_until(const char *key, int64_t expires)
{
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    op.id = fx_key(key);
    memset(op.fp, 7, IDEM_FP_LEN);
    op.now_ms = T0;
    op.lease_until_ms = T0 + 30000;
    op.expires_at_ms = expires;
    return op;
}

/* Write n records "<head>-<i>", record i expiring at expires(i). */
static void fill(const char *head, int n, int64_t (*expires)(int))
{
    static idem_op_t ops[1000];
    char key[48];
    for (int at = 0; at < n; at += 1000) {
        int m = n - at < 1000 ? n - at : 1000;
        for (int i = 0; i < m; i++) {
            snprintf(key, sizeof key, "%s-%d", head, at + i);
            ops[i] = claim_until(key, expires(at + i));
        }
        cr_assert_eq(idem_store_exec(st, ops, (size_t)m), IDEM_OK, "%s", idem_store_errstr(st));
    }
}

static int64_t soon(int i)
{
    (void)i;
    return T0 + 1000;
}

static int64_t late(int i)
{
    (void)i;
    return T0 + TTL;
}

static bool present(const char *key, int64_t now)
{
    idem_record_t rec;
    idem_key_id_t id = fx_key(key);
    idem_err_t rc = idem_store_get(st, &id, now, &rec);
    cr_assert(rc == IDEM_OK || rc == IDEM_E_NOTFOUND, "%s: %s", key, idem_err_name(rc));
    idem_record_cleanup(&rec);
    return rc == IDEM_OK;
}

ROUND_CASE(one_round_removes_many_steps_of_expired_records)
{
    fill("old", EXPIRED, soon);
    fill("live", LIVE, late);

    idem_sweep_limits_t lim = {STEP, 64, 0};
    idem_sweep_result_t res;
    idem__sweep_round(st, T0 + 2000, &lim, &res);
    cr_assert_eq(res.err, IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(res.removed, (size_t)EXPIRED, "one round removed %zu in %zu steps", res.removed,
                 res.steps);
    cr_expect_gt(res.removed, (size_t)STEP, "more than one step in one round");
    cr_expect_leq(res.steps, 12, "%zu steps", res.steps);
    cr_expect(!res.behind);

    /* Nothing left to remove: the next round is one step that finds nothing. */
    idem__sweep_round(st, T0 + 2000, &lim, &res);
    cr_expect_eq(res.err, IDEM_OK);
    cr_expect_eq(res.removed, 0);
    cr_expect_eq(res.steps, 1);

    /* Read at T0, when every record was live: only the live ones are left. */
    char key[48];
    for (int i = 0; i < EXPIRED; i += 97) {
        snprintf(key, sizeof key, "old-%d", i);
        cr_expect(!present(key, T0), "%s", key);
    }
    for (int i = 0; i < LIVE; i++) {
        snprintf(key, sizeof key, "live-%d", i);
        cr_expect(present(key, T0), "%s", key);
    }
}

ROUND_CASE(a_round_stops_at_its_step_limit_and_says_it_is_behind)
{
    fill("old", EXPIRED, soon);
    idem_sweep_limits_t lim = {1000, 3, 0};
    idem_sweep_result_t res;
    idem__sweep_round(st, T0 + 2000, &lim, &res);
    cr_assert_eq(res.err, IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(res.steps, 3);
    cr_expect_eq(res.removed, 3000);
    cr_expect(res.behind);
}

/* ---- expiry order ---------------------------------------------------------- */

#define ORDERED 400

/* Key i expires at T0 + 1000 + (ORDERED - 1 - i): the last key goes first. */
static int64_t reversed(int i)
{
    return T0 + 1000 + (ORDERED - 1 - i);
}

Test(sweep_order, postgres_removes_the_oldest_expired_first, .init = fx_setup_postgres,
     .fini = fx_teardown)
{
    fill("o", ORDERED, reversed);
    size_t removed = 0;
    /* Everything has expired; a sweep of half takes the older half. */
    cr_assert_eq(idem_store_sweep(st, T0 + 1000 + ORDERED, ORDERED / 2, &removed), IDEM_OK, "%s",
                 idem_store_errstr(st));
    cr_expect_eq(removed, ORDERED / 2);
    char key[48];
    for (int i = 0; i < ORDERED; i++) {
        snprintf(key, sizeof key, "o-%d", i);
        bool older = i >= ORDERED / 2; /* expires before the other half */
        cr_expect_eq(present(key, T0), !older, "%s expires at T0+%lld", key,
                     (long long)(reversed(i) - T0));
    }
}

Test(sweep_order, redis_expires_each_record_natively_at_its_expires_at, .init = fx_setup_redis,
     .fini = fx_teardown)
{
    fill("o", ORDERED, reversed);
    /* A completion moves the retention: PEXPIREAT follows it. */
    idem_response_t resp = {200, NULL, 0, (const uint8_t *)"ok", 2};
    idem_key_id_t id = fx_key("o-0");
    cr_assert_eq(idem_store_complete(st, &id, 1, &resp, 0, T0 + 5000), IDEM_OK, "%s",
                 idem_store_errstr(st));

    redisContext *c = fx_redis_connect();
    cr_assert_not_null(c);
    for (int i = 0; i < ORDERED; i++) {
        char name[160];
        snprintf(name, sizeof name, "%sanonymous:o-%d", fx_redis_prefix, i);
        redisReply *r = redisCommand(c, "PEXPIRETIME %s", name);
        cr_assert_not_null(r);
        cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "%s", name);
        long long want = i == 0 ? T0 + 5000 : reversed(i);
        cr_expect_eq(r->integer, want, "%s: PEXPIRETIME %lld, expires_at %lld", name, r->integer,
                     want);
        freeReplyObject(r);
    }
    redisFree(c);

    /* At the real time (T0 is a few seconds ahead of it) Redis expires what
     * is due by itself: the sweep removes nothing and leaves every record. */
    size_t removed = 99;
    cr_assert_eq(idem_store_sweep(st, fx_real_ms(), 100000, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    char key[48];
    for (int i = 0; i < ORDERED; i += 37) {
        snprintf(key, sizeof key, "o-%d", i);
        cr_expect(present(key, T0), "%s", key);
    }
}
