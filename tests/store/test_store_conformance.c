/* tests/store/test_store_conformance.c - one contract, every backend.
 *
 * Each STORE_CASE below is compiled into one Criterion test per backend
 * listed in BACKENDS: the same claims, fences, leases and expiries must give
 * the same answers from memory: and lmdb: (and, when they exist, redis://
 * and postgres://: one line in BACKENDS plus a setup function that opens a
 * fresh, empty store).  Time is passed explicitly to every op, so leases and
 * retentions run out without sleeping.  Tests that only make sense for one
 * backend (durability across reopen, processes sharing a directory, a full
 * map) follow the shared cases.
 *
 * Each test runs in its own process (Criterion), with the store `st` opened
 * by the backend's setup and closed (and its directory removed) by teardown.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <glob.h>
#include <limits.h>
#include <libpq-fe.h>
#include <lmdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/store.h"
#include "core/record_splice.h"
#include "store/store_impl.h" /* IDEM_STORE_BATCH_MAX, IDEM_STORE_KEY_MAX */
#include "store_fixture.h"

/* The cases' time, T0 (store_fixture.h).  memory: and lmdb: keep a fixed
 * date; Redis expires records by the wall clock (PEXPIREAT), so a Redis
 * setup moves T0 to a few seconds after the real time (fx_t0_from_clock),
 * and a record kept until T0 + 1 s is still there while its case runs. */
#define LEASE 30000ll
#define TTL 86400000ll

/* st, the test's store, is the fixture's. */
static char dir[64];          /* the backend's temporary directory, or "" */
static char url[128];

/* ---- fixtures (store_fixture.c) ------------------------------------------ */

static void open_store(void)
{
    fx_open_url(url);
}

static void make_dir(void)
{
    fx_mkdtemp(dir, sizeof dir, "store-test");
}

static void setup_memory(void)
{
    dir[0] = '\0';
    snprintf(url, sizeof url, "memory:");
    open_store();
}

static void setup_lmdb(void)
{
    make_dir();
    snprintf(url, sizeof url, "lmdb:%s", dir);
    open_store();
}

static void setup_rocksdb(void)
{
    make_dir();
    snprintf(url, sizeof url, "rocksdb:%s/db", dir);
    open_store();
}

/* ---- Redis fixtures: the server of $IDEM_TEST_REDIS_URL -------------------- */

static char redis_prefix[64]; /* this test's keys; deleted at exit */

/* A direct connection to the server of $IDEM_TEST_REDIS_URL. */
static redisContext *redis_direct_shared(void)
{
    const char *base = fx_env("IDEM_TEST_REDIS_URL");
    redisContext *c = fx_redis_connect();
    cr_assert(c != NULL, "no connection to %s (the tests read IDEM_TEST_REDIS_URL as "
              "redis://host:port[/db])", base);
    return c;
}

static void redis_cleanup(void)
{
    fx_redis_delete_prefix(redis_prefix);
}

static void setup_redis(void)
{
    const char *base = fx_env("IDEM_TEST_REDIS_URL");
    dir[0] = '\0';
    fx_t0_from_clock();
    fx_unique(redis_prefix, sizeof redis_prefix, "idemtest:", ":");
    cr_assert_eq(fx_url_with(url, sizeof url, base, "prefix", redis_prefix, NULL), 0,
                 "IDEM_TEST_REDIS_URL is too long");
    atexit(redis_cleanup);
    open_store();
}
static void pg_drop_tables(void);
static void setup_postgres(void);

static void teardown(void)
{
    idem_store_close(st);
    st = NULL;
    if (dir[0] != '\0')
        fx_rm_tree(dir);
    pg_drop_tables();
}

/* One Test per backend for each STORE_CASE.  A new backend is one X line. */
#define BACKENDS(X, name) \
    X(memory, name)       \
    X(lmdb, name)         \
    X(rocksdb, name)      \
    X(redis, name)        \
    X(postgres, name)

#define STORE_TEST_FOR(backend, name)                                           \
    Test(store_##backend, name, .init = setup_##backend, .fini = teardown)      \
    {                                                                           \
        name##_case();                                                          \
    }

#define STORE_CASE(name)              \
    static void name##_case(void);    \
    BACKENDS(STORE_TEST_FOR, name)    \
    static void name##_case(void)

/* ---- helpers ------------------------------------------------------------- */

static idem_key_id_t kid_in(const char *scope, const char *key)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "%s", scope);
    snprintf(id.key, sizeof id.key, "%s", key);
    return id;
}

static idem_key_id_t kid(const char *key)
{
    return kid_in("anonymous", key);
}

static void fp_fill(uint8_t *fp, int c)
{
    memset(fp, c, IDEM_FP_LEN);
}

static idem_op_t claim_op_in(const char *scope, const char *key, int fpc, int64_t now)
{
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    op.id = kid_in(scope, key);
    fp_fill(op.fp, fpc);
    op.now_ms = now;
    op.lease_until_ms = now + LEASE;
    op.expires_at_ms = now + TTL;
    return op;
}

static idem_op_t claim_op(const char *key, int fpc, int64_t now)
{
    return claim_op_in("anonymous", key, fpc, now);
}

/* Claim on st and return the decision (replayed record cleaned up). */
static idem_decision_t claim_on(idem_store_t *s, const char *key, int fpc, int64_t now)
{
    idem_op_t op = claim_op(key, fpc, now);
    idem_err_t rc = idem_store_claim(s, &op);
    cr_assert_eq(rc, IDEM_OK, "claim %s: %s (%s)", key, idem_err_name(rc),
                 idem_store_errstr(s));
    idem_record_cleanup(&op.record);
    return op.decision;
}

static idem_decision_t claim(const char *key, int fpc, int64_t now)
{
    return claim_on(st, key, fpc, now);
}

static const idem_header_t resp_headers[] = {
    {"Content-Type", 12, "application/json", 16},
    {"X-Bin", 5, "\x00\xff\r\n", 4},
    {"Empty", 5, "", 0},
};
static const uint8_t resp_body[] = "{\"id\":1,\"nul\":\"\x00\",\"end\":true}";
static const idem_response_t resp = {201, resp_headers, 3, resp_body, sizeof resp_body - 1};

static idem_err_t complete(const char *key, uint64_t fence, int64_t expires)
{
    idem_key_id_t id = kid(key);
    return idem_store_complete(st, &id, fence, &resp, 0, expires);
}

static idem_err_t get(const char *key, int64_t now, idem_record_t *rec)
{
    idem_key_id_t id = kid(key);
    return idem_store_get(st, &id, now, rec);
}

static void expect_resp_eq(const idem_response_t *a, const idem_response_t *b)
{
    cr_expect_eq(a->status, b->status);
    cr_assert_eq(a->n_headers, b->n_headers);
    for (size_t i = 0; i < a->n_headers; i++) {
        cr_assert_eq(a->headers[i].name_len, b->headers[i].name_len);
        cr_assert_eq(a->headers[i].value_len, b->headers[i].value_len);
        cr_expect_eq(memcmp(a->headers[i].name, b->headers[i].name, a->headers[i].name_len), 0);
        cr_expect_eq(memcmp(a->headers[i].value, b->headers[i].value, a->headers[i].value_len),
                     0);
    }
    cr_assert_eq(a->body_len, b->body_len);
    cr_expect_eq(memcmp(a->body, b->body, a->body_len), 0);
}

/* ---- the shared cases ---------------------------------------------------- */

STORE_CASE(first_claim_forwards_with_fence_1)
{
    idem_decision_t d = claim("k", 1, T0);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 1);
}

STORE_CASE(repeat_in_flight_is_in_flight_with_retry_after)
{
    claim("k", 1, T0);
    idem_decision_t d = claim("k", 1, T0 + 10500);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(d.fence, 1);
    cr_expect_eq(d.retry_after_s, 20); /* 19.5 s left, rounded up */
}

STORE_CASE(complete_then_claim_replays_byte_exact)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    idem_op_t op = claim_op("k", 1, T0 + 5);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_REPLAY);
    cr_expect_eq(op.decision.fence, 1);
    cr_expect_eq(op.record.state, IDEM_STATE_COMPLETED);
    cr_expect_eq(op.record.fence, 1);
    cr_expect_eq(op.record.expires_at_ms, T0 + TTL);
    expect_resp_eq(&op.record.response, &resp);
    idem_record_cleanup(&op.record);
}

STORE_CASE(other_fingerprint_on_completed_is_mismatch)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    cr_expect_eq(claim("k", 2, T0 + 5).kind, IDEM_DECIDE_MISMATCH);
}

STORE_CASE(other_fingerprint_in_flight_is_mismatch)
{
    claim("k", 1, T0);
    cr_expect_eq(claim("k", 2, T0 + 5).kind, IDEM_DECIDE_MISMATCH);
}

STORE_CASE(expired_lease_is_taken_over_with_fence_2)
{
    claim("k", 1, T0);
    idem_decision_t d = claim("k", 1, T0 + LEASE);
    cr_expect_eq(d.kind, IDEM_DECIDE_TAKEOVER);
    cr_expect_eq(d.fence, 2);
    /* The new owner holds a fresh lease. */
    cr_expect_eq(claim("k", 1, T0 + LEASE + 1).kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(stale_complete_after_takeover_is_refused_and_changes_nothing)
{
    claim("k", 1, T0);
    claim("k", 1, T0 + LEASE);
    cr_expect_eq(complete("k", 1, T0 + TTL), IDEM_E_FENCE);

    idem_record_t rec;
    cr_assert_eq(get("k", T0 + LEASE + 1, &rec), IDEM_OK);
    cr_expect_eq(rec.state, IDEM_STATE_IN_PROGRESS);
    cr_expect_eq(rec.fence, 2);
    cr_expect_eq(rec.lease_until_ms, T0 + LEASE + LEASE);
    cr_expect_eq(rec.response.body_len, 0);
    idem_record_cleanup(&rec);
}

STORE_CASE(new_owner_completes_after_takeover)
{
    claim("k", 1, T0);
    claim("k", 1, T0 + LEASE);
    cr_expect_eq(complete("k", 2, T0 + TTL), IDEM_OK);
    cr_expect_eq(complete("k", 1, T0 + TTL), IDEM_E_FENCE);
    cr_expect_eq(claim("k", 1, T0 + LEASE + 1).kind, IDEM_DECIDE_REPLAY);
}

STORE_CASE(second_complete_is_refused_and_first_result_kept)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    idem_key_id_t id = kid("k");
    idem_response_t other = {500, NULL, 0, (const uint8_t *)"x", 1};
    cr_expect_eq(idem_store_complete(st, &id, 1, &other, 0, T0 + TTL), IDEM_E_FENCE);
    idem_record_t rec;
    cr_assert_eq(get("k", T0, &rec), IDEM_OK);
    expect_resp_eq(&rec.response, &resp);
    idem_record_cleanup(&rec);
}

STORE_CASE(complete_of_missing_key_is_fence)
{
    cr_expect_eq(complete("nobody", 1, T0 + TTL), IDEM_E_FENCE);
    idem_record_t rec;
    cr_expect_eq(get("nobody", T0, &rec), IDEM_E_NOTFOUND);
}

STORE_CASE(renew_moves_the_lease)
{
    claim("k", 1, T0);
    idem_key_id_t id = kid("k");
    cr_assert_eq(idem_store_renew(st, &id, 1, T0 + 2 * LEASE), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + LEASE).kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(claim("k", 1, T0 + 2 * LEASE).kind, IDEM_DECIDE_TAKEOVER);
}

STORE_CASE(renew_past_retention_keeps_the_record)
{
    idem_op_t op = claim_op("k", 1, T0);
    op.expires_at_ms = T0 + LEASE; /* retention no longer than the lease */
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    idem_key_id_t id = kid("k");
    cr_assert_eq(idem_store_renew(st, &id, 1, T0 + 3 * LEASE), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 2 * LEASE).kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(renew_with_stale_fence_is_refused)
{
    claim("k", 1, T0);
    claim("k", 1, T0 + LEASE); /* fence 2, lease to T0 + 2 LEASE */
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_renew(st, &id, 1, T0 + 10 * LEASE), IDEM_E_FENCE);
    idem_record_t rec;
    cr_assert_eq(get("k", T0 + LEASE, &rec), IDEM_OK);
    cr_expect_eq(rec.lease_until_ms, T0 + 2 * LEASE);
    idem_record_cleanup(&rec);
}

STORE_CASE(renew_of_completed_is_refused)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_renew(st, &id, 1, T0 + 2 * LEASE), IDEM_E_FENCE);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_REPLAY);
}

STORE_CASE(release_deletes_so_the_next_claim_forwards)
{
    claim("k", 1, T0);
    idem_key_id_t id = kid("k");
    cr_assert_eq(idem_store_release(st, &id, 1), IDEM_OK);
    idem_decision_t d = claim("k", 1, T0 + 1);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 1);
}

STORE_CASE(stale_release_is_refused)
{
    claim("k", 1, T0);
    claim("k", 1, T0 + LEASE);
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_release(st, &id, 1), IDEM_E_FENCE);
    cr_expect_eq(claim("k", 1, T0 + LEASE + 1).kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(release_of_missing_key_is_fence)
{
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_release(st, &id, 1), IDEM_E_FENCE);
}

STORE_CASE(hold_gives_in_flight_unknown_after_the_lease)
{
    claim("k", 1, T0);
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_HOLD;
    op.id = kid("k");
    op.fence = 1;
    op.lease_until_ms = T0 + LEASE;
    op.expires_at_ms = T0 + TTL;
    cr_assert_eq(idem_store_exec(st, &op, 1), IDEM_OK);
    cr_assert_eq(op.err, IDEM_OK);
    /* Within the hold's lease: its owner asks; a repeat is told so. */
    idem_decision_t d = claim("k", 1, T0 + LEASE - 1);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT_UNKNOWN);
    cr_expect_eq(d.fence, 1);
    /* Past it: one claim takes the lease with fence + 1 (on_unknown_outcome:
     * reconcile), atomically, and the hold and its retention stay. */
    d = claim("k", 1, T0 + 2 * LEASE);
    cr_expect_eq(d.kind, IDEM_DECIDE_RECONCILE);
    cr_expect_eq(d.fence, 2);
    cr_expect_eq(d.retry_after_s, (TTL - 2 * LEASE) / 1000);
    d = claim("k", 1, T0 + 2 * LEASE + 1);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT_UNKNOWN);
    cr_expect_eq(d.fence, 2);
    idem_key_id_t id = kid("k");
    idem_record_t rec;
    cr_assert_eq(idem_store_get(st, &id, T0 + 2 * LEASE + 1, &rec), IDEM_OK);
    cr_expect_eq(rec.state, IDEM_STATE_IN_PROGRESS);
    cr_expect(rec.flags & IDEM_REC_HELD);
    cr_expect_eq(rec.fence, 2);
    cr_expect_eq(rec.expires_at_ms, T0 + TTL);
    idem_record_cleanup(&rec);
    /* The old asker's late answer is refused; the new one's is stored. */
    idem_response_t r = {200, NULL, 0, (const uint8_t *)"ok", 2};
    cr_expect_eq(idem_store_complete(st, &id, 1, &r, 0, T0 + TTL), IDEM_E_FENCE);
    cr_expect_eq(idem_store_complete(st, &id, 2, &r, 0, T0 + TTL), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 2 * LEASE + 2).kind, IDEM_DECIDE_REPLAY);
}

STORE_CASE(stale_hold_is_refused)
{
    claim("k", 1, T0);
    claim("k", 1, T0 + LEASE);
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_HOLD;
    op.id = kid("k");
    op.fence = 1;
    op.expires_at_ms = T0 + TTL;
    cr_assert_eq(idem_store_exec(st, &op, 1), IDEM_OK);
    cr_expect_eq(op.err, IDEM_E_FENCE);
}

STORE_CASE(not_retained_flag_gives_not_retained)
{
    claim("k", 1, T0);
    idem_key_id_t id = kid("k");
    idem_response_t nobody = {200, NULL, 0, NULL, 0};
    cr_assert_eq(idem_store_complete(st, &id, 1, &nobody, IDEM_REC_NOT_RETAINED, T0 + TTL),
                 IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_NOT_RETAINED);
}

STORE_CASE(completed_past_retention_is_claimed_with_next_fence)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + 1000), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 999).kind, IDEM_DECIDE_REPLAY);
    idem_decision_t d = claim("k", 1, T0 + 1000);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 2);
}

STORE_CASE(get_returns_the_record_until_retention_then_notfound)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + 1000), IDEM_OK);
    idem_record_t rec;
    cr_assert_eq(get("k", T0 + 999, &rec), IDEM_OK);
    cr_expect_eq(rec.state, IDEM_STATE_COMPLETED);
    cr_expect_eq(rec.fence, 1);
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 1);
    cr_expect_eq(memcmp(rec.fingerprint, fp, IDEM_FP_LEN), 0);
    expect_resp_eq(&rec.response, &resp);
    idem_record_cleanup(&rec);
    cr_expect_eq(get("k", T0 + 1000, &rec), IDEM_E_NOTFOUND);
    cr_expect_null(rec.owned);
}

STORE_CASE(get_of_missing_key_is_notfound)
{
    idem_record_t rec;
    cr_expect_eq(get("nothing", T0, &rec), IDEM_E_NOTFOUND);
}

STORE_CASE(sweep_removes_expired_and_keeps_live_in_bounded_steps)
{
    char key[32];
    idem_op_t ops[300];
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "sweep-%d", i);
        ops[i] = claim_op(key, 1, T0);
        ops[i].expires_at_ms = (i % 2) ? T0 + TTL : T0 + 1000;
    }
    cr_assert_eq(idem_store_exec(st, ops, 300), IDEM_OK);

    size_t total = 0, removed, calls = 0;
    while (total < 150 && calls < 100) {
        cr_assert_eq(idem_store_sweep(st, T0 + 2000, 40, &removed), IDEM_OK);
        cr_assert_leq(removed, 40);
        total += removed;
        calls++;
    }
    cr_expect_eq(total, 150);
    /* Another full pass finds nothing more to remove. */
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(idem_store_sweep(st, T0 + 2000, 40, &removed), IDEM_OK);
        cr_expect_eq(removed, 0);
    }
    /* Read at T0, when every record was live: only the odd ones are left. */
    for (int i = 0; i < 300; i++) {
        idem_record_t rec;
        snprintf(key, sizeof key, "sweep-%d", i);
        idem_err_t rc = get(key, T0, &rec);
        cr_expect_eq(rc, (i % 2) ? IDEM_OK : IDEM_E_NOTFOUND, "key %s", key);
        idem_record_cleanup(&rec);
    }
}

STORE_CASE(sweep_with_nothing_expired_removes_nothing)
{
    claim("k", 1, T0);
    size_t removed = 99;
    cr_assert_eq(idem_store_sweep(st, T0 + 1, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    cr_expect_eq(claim("k", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(delete_removes_a_record_and_missing_is_notfound)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_delete(st, &id), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_CLAIM);
    idem_key_id_t none = kid("none");
    cr_expect_eq(idem_store_delete(st, &none), IDEM_E_NOTFOUND);
}

STORE_CASE(batch_with_two_claims_of_one_key_forwards_once)
{
    idem_op_t ops[2] = {claim_op("k", 1, T0), claim_op("k", 1, T0)};
    cr_assert_eq(idem_store_exec(st, ops, 2), IDEM_OK);
    cr_expect_eq(ops[0].err, IDEM_OK);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[0].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(ops[1].decision.kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(batch_applies_ops_in_order_with_their_own_results)
{
    claim("done", 1, T0);
    idem_op_t ops[4];
    memset(ops, 0, sizeof ops);
    ops[0] = claim_op("a", 1, T0);
    ops[1].kind = IDEM_OP_COMPLETE; /* completes the claim made by ops[0] */
    ops[1].id = kid("a");
    ops[1].fence = 1;
    ops[1].response = &resp;
    ops[1].expires_at_ms = T0 + TTL;
    ops[2].kind = IDEM_OP_COMPLETE; /* stale: refused alone */
    ops[2].id = kid("done");
    ops[2].fence = 7;
    ops[2].response = &resp;
    ops[2].expires_at_ms = T0 + TTL;
    ops[3] = claim_op("a", 1, T0 + 1);
    cr_assert_eq(idem_store_exec(st, ops, 4), IDEM_OK);
    cr_expect_eq(ops[0].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[2].err, IDEM_E_FENCE);
    cr_expect_eq(ops[3].decision.kind, IDEM_DECIDE_REPLAY);
    expect_resp_eq(&ops[3].record.response, &resp);
    idem_record_cleanup(&ops[3].record);
}

STORE_CASE(invalid_op_is_refused_alone)
{
    idem_op_t ops[3] = {claim_op("", 1, T0), claim_op("ok", 1, T0), claim_op("x", 1, T0)};
    ops[2].kind = (idem_op_kind_t)42;
    cr_assert_eq(idem_store_exec(st, ops, 3), IDEM_OK);
    cr_expect_eq(ops[0].err, IDEM_E_INVAL);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[1].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(ops[2].err, IDEM_E_INVAL);
}

STORE_CASE(complete_without_response_is_inval)
{
    claim("k", 1, T0);
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_complete(st, &id, 1, NULL, 0, T0 + TTL), IDEM_E_INVAL);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(oversized_batch_is_inval)
{
    static idem_op_t ops[IDEM_STORE_BATCH_MAX + 1];
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        ops[i] = claim_op("k", 1, T0);
    cr_expect_eq(idem_store_exec(st, ops, sizeof ops / sizeof ops[0]), IDEM_E_INVAL);
    cr_expect_eq(ops[0].err, IDEM_E_INVAL);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
}

STORE_CASE(scopes_isolate_keys)
{
    idem_op_t a = claim_op_in("anonymous", "k", 1, T0);
    idem_op_t b = claim_op_in("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                              "k", 2, T0);
    cr_assert_eq(idem_store_claim(st, &a), IDEM_OK);
    cr_assert_eq(idem_store_claim(st, &b), IDEM_OK);
    cr_expect_eq(a.decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
}

STORE_CASE(longest_scope_and_key_round_trip)
{
    char key[IDEM_KEY_MAX + 1];
    memset(key, 'k', IDEM_KEY_MAX);
    key[IDEM_KEY_MAX] = '\0';
    const char *scope = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    idem_op_t op = claim_op_in(scope, key, 1, T0);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_CLAIM);
    op = claim_op_in(scope, key, 1, T0 + 1);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_IN_FLIGHT);
}

STORE_CASE(replay_out_of_memory_is_nomem_and_changes_nothing)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    idem_op_t op = claim_op("k", 1, T0 + 1);
    idem_alloc_fail_after(1);
    idem_err_t rc = idem_store_claim(st, &op);
    idem_alloc_fail_after(0);
    cr_expect_eq(rc, IDEM_E_NOMEM);
    cr_expect_null(op.record.owned);
    cr_expect_eq(claim("k", 1, T0 + 2).kind, IDEM_DECIDE_REPLAY);
}

STORE_CASE(ping_answers)
{
    cr_expect_eq(idem_store_ping(st), IDEM_OK);
}

#define RACE_THREADS 8
#define RACE_CLAIMS 200
#define RACE_KEYS 50

struct race {
    idem_store_t *stores[2]; /* thread i uses stores[i % 2] */
    atomic_int forwarded[RACE_KEYS];
    atomic_int failures;
    atomic_int next;           /* hands out thread numbers */
    pthread_barrier_t barrier; /* all threads claim each key at once */
};

static void *race_thread(void *arg)
{
    struct race *r = arg;
    int me = atomic_fetch_add(&r->next, 1);
    idem_store_t *s = r->stores[me % 2];
    char key[32];
    for (int i = 0; i < RACE_CLAIMS; i++) {
        int k = i % RACE_KEYS;
        snprintf(key, sizeof key, "race-%d", k);
        idem_op_t op = claim_op(key, 1, T0);
        pthread_barrier_wait(&r->barrier);
        if (idem_store_claim(s, &op) != IDEM_OK) {
            atomic_fetch_add(&r->failures, 1);
            continue;
        }
        if (idem_decision_forwards(op.decision.kind))
            atomic_fetch_add(&r->forwarded[k], 1);
        idem_record_cleanup(&op.record);
    }
    return NULL;
}

static void race(idem_store_t *a, idem_store_t *b)
{
    static struct race r; /* zeroed */
    pthread_t t[RACE_THREADS];
    r.stores[0] = a;
    r.stores[1] = b;
    pthread_barrier_init(&r.barrier, NULL, RACE_THREADS);
    for (int i = 0; i < RACE_THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, race_thread, &r), 0);
    for (int i = 0; i < RACE_THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&r.barrier);
    cr_expect_eq(atomic_load(&r.failures), 0);
    for (int k = 0; k < RACE_KEYS; k++)
        cr_expect_eq(atomic_load(&r.forwarded[k]), 1, "key race-%d forwarded %d times", k,
                     atomic_load(&r.forwarded[k]));
}

#define BATCH_THREADS 8
#define BATCH_ROUNDS 20
#define BATCH_OPS 10

static void *batch_thread(void *arg)
{
    long t = (long)arg;
    char key[32];
    for (int r = 0; r < BATCH_ROUNDS; r++) {
        idem_op_t ops[2 * BATCH_OPS];
        memset(ops, 0, sizeof ops);
        for (int i = 0; i < BATCH_OPS; i++) {
            snprintf(key, sizeof key, "b-%ld-%d-%d", t, r, i);
            ops[i] = claim_op(key, 1, T0);
            ops[BATCH_OPS + i].kind = IDEM_OP_COMPLETE;
            ops[BATCH_OPS + i].id = ops[i].id;
            ops[BATCH_OPS + i].fence = 1;
            ops[BATCH_OPS + i].response = &resp;
            ops[BATCH_OPS + i].expires_at_ms = T0 + TTL;
        }
        if (idem_store_exec(st, ops, 2 * BATCH_OPS) != IDEM_OK)
            return (void *)1;
        for (int i = 0; i < 2 * BATCH_OPS; i++)
            if (ops[i].err != IDEM_OK || (i < BATCH_OPS && ops[i].decision.kind != IDEM_DECIDE_CLAIM))
                return (void *)2;
    }
    return NULL;
}

STORE_CASE(concurrent_batches_all_apply_with_their_own_results)
{
    pthread_t t[BATCH_THREADS];
    for (long i = 0; i < BATCH_THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, batch_thread, (void *)i), 0);
    for (int i = 0; i < BATCH_THREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_expect_null(ret, "thread %d failed (%p)", i, ret);
    }
    char key[32];
    for (int i = 0; i < BATCH_THREADS; i++) {
        for (int r = 0; r < BATCH_ROUNDS; r++) {
            for (int j = 0; j < BATCH_OPS; j++) {
                snprintf(key, sizeof key, "b-%d-%d-%d", i, r, j);
                cr_expect_eq(claim(key, 1, T0 + 1).kind, IDEM_DECIDE_REPLAY, "key %s", key);
            }
        }
    }
}

STORE_CASE(claim_race_forwards_each_key_exactly_once)
{
    race(st, st);
}

/* ---- prevention tokens (docs/protocol.md section 8) ------------------------ */

#define TOKEN_TTL 300000ll
#define TOK "0123456789abcdef0123456789abcdef"

static idem_key_id_t tok_id(const char *scope, const char *token)
{
    idem_key_id_t id;
    idem_token_id(scope, token, &id);
    return id;
}

static idem_token_verdict_t use(const char *scope, const char *token, int64_t now)
{
    idem_key_id_t id = tok_id(scope, token);
    idem_token_verdict_t v = IDEM_TOKEN_NONE;
    cr_assert_eq(idem_store_token_use(st, &id, now, &v), IDEM_OK);
    return v;
}

STORE_CASE(token_first_use_then_used)
{
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(use("anonymous", TOK, T0 + 1), IDEM_TOKEN_FIRST_USE);
    cr_expect_eq(use("anonymous", TOK, T0 + 2), IDEM_TOKEN_USED);
    cr_expect_eq(use("anonymous", TOK, T0 + 3), IDEM_TOKEN_USED);
}

STORE_CASE(token_unknown_expired_and_foreign_are_invalid)
{
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(use("anonymous", "ffffffffffffffffffffffffffffffff", T0 + 1), IDEM_TOKEN_INVALID);
    char other[IDEM_SCOPE_MAX + 1];
    memset(other, 'a', IDEM_SCOPE_MAX);
    other[IDEM_SCOPE_MAX] = '\0';
    cr_expect_eq(use(other, TOK, T0 + 1), IDEM_TOKEN_INVALID, "another caller's token");
    cr_expect_eq(use("anonymous", TOK, T0 + TOKEN_TTL), IDEM_TOKEN_INVALID, "expired");
}

STORE_CASE(token_used_stays_used_until_expiry_then_invalid)
{
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(use("anonymous", TOK, T0), IDEM_TOKEN_FIRST_USE);
    cr_expect_eq(use("anonymous", TOK, T0 + TOKEN_TTL - 1), IDEM_TOKEN_USED);
    cr_expect_eq(use("anonymous", TOK, T0 + TOKEN_TTL), IDEM_TOKEN_INVALID);
    /* A sweep resumes where the last stopped (store.h): on a shared Redis
     * holding many other keys one call may not reach ours, so the test sweeps
     * on until it did, as the sweeper does. */
    size_t total = 0;
    for (int i = 0; i < 10000 && total == 0; i++) {
        size_t removed = 0;
        cr_assert_eq(idem_store_sweep(st, T0 + TOKEN_TTL + 1, 100, &removed), IDEM_OK);
        total += removed;
    }
    cr_expect_eq(total, 1, "the sweeper removes an expired token");
}

STORE_CASE(token_issue_of_a_live_token_is_exists_and_changes_nothing)
{
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(use("anonymous", TOK, T0 + 1), IDEM_TOKEN_FIRST_USE);
    cr_expect_eq(idem_store_token_issue(st, &id, T0 + 2, T0 + 2 + TOKEN_TTL), IDEM_E_EXISTS);
    cr_expect_eq(use("anonymous", TOK, T0 + 3), IDEM_TOKEN_USED, "a reissue must not revive it");
    cr_expect_eq(idem_store_token_issue(st, &id, T0 + TOKEN_TTL, T0 + 2 * TOKEN_TTL), IDEM_OK,
                 "an expired id may be issued again");
    cr_expect_eq(use("anonymous", TOK, T0 + TOKEN_TTL + 1), IDEM_TOKEN_FIRST_USE);
}

STORE_CASE(token_restore_gives_back_only_a_used_live_token)
{
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_expect_eq(idem_store_token_restore(st, &id, T0), IDEM_E_FENCE, "none issued");
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(idem_store_token_restore(st, &id, T0), IDEM_E_FENCE, "not used yet");
    cr_expect_eq(use("anonymous", TOK, T0 + 1), IDEM_TOKEN_FIRST_USE);
    cr_expect_eq(idem_store_token_restore(st, &id, T0 + 2), IDEM_OK);
    cr_expect_eq(use("anonymous", TOK, T0 + 3), IDEM_TOKEN_FIRST_USE, "usable once more");
    cr_expect_eq(idem_store_token_restore(st, &id, T0 + TOKEN_TTL), IDEM_E_FENCE, "expired");
}

STORE_CASE(token_and_key_namespaces_never_meet)
{
    /* A key spelled like the token's hex is a different record. */
    idem_key_id_t id = tok_id("anonymous", TOK);
    cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    cr_expect_eq(claim(TOK, 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(use("anonymous", TOK, T0 + 1), IDEM_TOKEN_FIRST_USE);
    /* A claimed key's record is not a token. */
    idem_key_id_t kid_tok = kid("k-plain");
    cr_expect_eq(claim("k-plain", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_token_verdict_t v = IDEM_TOKEN_NONE;
    cr_expect_eq(idem_store_token_use(st, &kid_tok, T0 + 1, &v), IDEM_OK);
    cr_expect_eq(v, IDEM_TOKEN_INVALID);
}

#define TOKEN_RACE_THREADS 8
#define TOKEN_RACE_TOKENS 50

struct token_race {
    atomic_int first[TOKEN_RACE_TOKENS];
    atomic_int failures;
    pthread_barrier_t barrier;
};

static void *token_race_thread(void *arg)
{
    struct token_race *r = arg;
    char tok[IDEM_TOKEN_LEN + 1];
    for (int k = 0; k < TOKEN_RACE_TOKENS; k++) {
        snprintf(tok, sizeof tok, "%032x", k);
        idem_key_id_t id = tok_id("anonymous", tok);
        idem_token_verdict_t v = IDEM_TOKEN_NONE;
        pthread_barrier_wait(&r->barrier);
        if (idem_store_token_use(st, &id, T0 + 1, &v) != IDEM_OK)
            atomic_fetch_add(&r->failures, 1);
        else if (v == IDEM_TOKEN_FIRST_USE)
            atomic_fetch_add(&r->first[k], 1);
        else if (v != IDEM_TOKEN_USED)
            atomic_fetch_add(&r->failures, 1);
    }
    return NULL;
}

STORE_CASE(token_race_spends_each_token_exactly_once)
{
    static struct token_race r;
    char tok[IDEM_TOKEN_LEN + 1];
    for (int k = 0; k < TOKEN_RACE_TOKENS; k++) {
        snprintf(tok, sizeof tok, "%032x", k);
        idem_key_id_t id = tok_id("anonymous", tok);
        cr_assert_eq(idem_store_token_issue(st, &id, T0, T0 + TOKEN_TTL), IDEM_OK);
    }
    pthread_t t[TOKEN_RACE_THREADS];
    pthread_barrier_init(&r.barrier, NULL, TOKEN_RACE_THREADS);
    for (int i = 0; i < TOKEN_RACE_THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, token_race_thread, &r), 0);
    for (int i = 0; i < TOKEN_RACE_THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&r.barrier);
    cr_expect_eq(atomic_load(&r.failures), 0);
    for (int k = 0; k < TOKEN_RACE_TOKENS; k++)
        cr_expect_eq(atomic_load(&r.first[k]), 1, "token %d spent %d times", k,
                     atomic_load(&r.first[k]));
}

/* ---- any backend: URLs ---------------------------------------------------- */

static void expect_bad_url(const char *u)
{
    char err[256] = "";
    idem_store_t *s = (idem_store_t *)&err; /* must be reset to NULL */
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_INVAL, "url %s", u);
    cr_expect_null(s, "url %s", u);
    cr_expect_neq(err[0], '\0', "no message for url %s", u);
}

Test(store, bad_urls_are_inval_with_a_message)
{
    expect_bad_url(NULL);
    expect_bad_url("");
    expect_bad_url("memory");
    expect_bad_url("nosuch://host");
    expect_bad_url("memory:extra");
    expect_bad_url("memory:?size=1");
    expect_bad_url("lmdb:");
    expect_bad_url("lmdb:?sync=always");
    expect_bad_url("lmdb:/tmp/idem-never-created?sync=sometimes");
    expect_bad_url("lmdb:/tmp/idem-never-created?sync");
    expect_bad_url("lmdb:/tmp/idem-never-created?=always");
    expect_bad_url("lmdb:/tmp/idem-never-created?map_size=lots");
    expect_bad_url("lmdb:/tmp/idem-never-created?map_size=1KiB");
    expect_bad_url("lmdb:/tmp/idem-never-created?map_size=-1");
    expect_bad_url("lmdb:/tmp/idem-never-created?bogus=1");
    expect_bad_url("lmdb:/tmp/idem-never-created?sync=always&bogus=1");
    struct stat sb;
    cr_expect_neq(stat("/tmp/idem-never-created", &sb), 0, "a bad URL created its directory");
}

Test(store, unknown_scheme_names_it)
{
    char err[256] = "";
    idem_store_t *s;
    cr_assert_eq(idem_store_open("nosuch://host", &s, err, sizeof err), IDEM_E_INVAL);
    cr_expect(strstr(err, "unknown store scheme") != NULL, "message: %s", err);
    cr_expect(strstr(err, "nosuch") != NULL, "message: %s", err);
}

Test(store, unknown_option_names_it)
{
    char err[256] = "";
    idem_store_t *s;
    cr_assert_eq(idem_store_open("lmdb:/tmp/idem-never-created?colour=red", &s, err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect(strstr(err, "colour") != NULL, "message: %s", err);
}

Test(store, null_store_calls_are_safe)
{
    idem_op_t op = claim_op("k", 1, T0);
    size_t removed = 1;
    idem_record_t rec;
    idem_key_id_t id = kid("k");
    cr_expect_eq(idem_store_exec(NULL, &op, 1), IDEM_E_INVAL);
    cr_expect_eq(idem_store_get(NULL, &id, T0, &rec), IDEM_E_INVAL);
    cr_expect_eq(idem_store_sweep(NULL, T0, 10, &removed), IDEM_E_INVAL);
    cr_expect_eq(removed, 0);
    cr_expect_eq(idem_store_ping(NULL), IDEM_E_INVAL);
    idem_store_space_t sp = {1, 1};
    cr_expect_eq(idem_store_space(NULL, &sp), IDEM_E_INVAL);
    cr_expect_eq(sp.used_bytes, 0);
    cr_expect_eq(sp.free_bytes, 0);
    idem_store_close(NULL);
}

Test(store_memory, has_no_disk_to_report, .init = setup_memory, .fini = teardown)
{
    idem_store_space_t sp = {1, 1};
    cr_expect_eq(idem_store_space(st, &sp), IDEM_E_UNSUPPORTED);
    cr_expect_eq(sp.used_bytes, 0);
    cr_expect_eq(sp.free_bytes, 0);
    cr_expect_eq(idem_store_space(st, NULL), IDEM_E_INVAL);
}

Test(store_memory, is_named_memory, .init = setup_memory, .fini = teardown)
{
    cr_expect_str_eq(idem_store_name(st), "memory");
}

Test(store_memory, claim_out_of_memory_is_nomem_alone, .init = setup_memory,
     .fini = teardown)
{
    idem_op_t ops[2] = {claim_op("a", 1, T0), claim_op("b", 1, T0)};
    idem_alloc_fail_after(1); /* the first op's new entry */
    idem_err_t rc = idem_store_exec(st, ops, 2);
    idem_alloc_fail_after(0);
    cr_assert_eq(rc, IDEM_OK);
    cr_expect_eq(ops[0].err, IDEM_E_NOMEM);
    cr_expect_eq(ops[0].decision.kind, 0, "a failed claim must not say it forwards");
    cr_expect_eq(ops[1].err, IDEM_E_NOMEM); /* every allocation after fails too */
    idem_decision_t d = claim("a", 1, T0 + 1);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 1);
}

/* ---- LMDB only ------------------------------------------------------------ */

Test(store_lmdb, is_named_lmdb, .init = setup_lmdb, .fini = teardown)
{
    cr_expect_str_eq(idem_store_name(st), "lmdb");
}

Test(store_lmdb, creates_missing_directory_private, .init = setup_lmdb, .fini = teardown)
{
    char sub[PATH_MAX], u[PATH_MAX + 16];
    snprintf(sub, sizeof sub, "%s/new", dir);
    snprintf(u, sizeof u, "lmdb:%s", sub);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    struct stat sb;
    cr_assert_eq(stat(sub, &sb), 0);
    cr_expect(S_ISDIR(sb.st_mode));
    cr_expect_eq(sb.st_mode & 0777, 0700);
    idem_store_close(s);
}

Test(store_lmdb, directory_that_cannot_be_made_is_io, .init = setup_lmdb, .fini = teardown)
{
    char u[PATH_MAX + 32], err[256] = "";
    snprintf(u, sizeof u, "lmdb:%s/missing/deeper", dir);
    idem_store_t *s;
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_IO);
    cr_expect_null(s);
    cr_expect_neq(err[0], '\0');
}

Test(store_lmdb, two_handles_on_one_directory_never_both_forward, .init = setup_lmdb,
     .fini = teardown)
{
    idem_store_t *second;
    cr_assert_eq(idem_store_open(url, &second, NULL, 0), IDEM_OK);
    race(st, second);
    /* What one handle wrote, the other reads. */
    cr_expect_eq(claim_on(second, "race-0", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    idem_store_close(second);
    cr_expect_eq(claim("race-0", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
}

Test(store_lmdb, other_sync_mode_on_open_directory_is_refused, .init = setup_lmdb,
     .fini = teardown)
{
    char u[PATH_MAX + 32], err[256] = "";
    snprintf(u, sizeof u, "%s?sync=interval", url);
    idem_store_t *s;
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_INVAL);
    cr_expect(strstr(err, "sync") != NULL, "message: %s", err);
}

#define FORK_KEYS 300

/* Claim every fork key on s; out[k] = 1 when this side forwarded it. */
static int claim_all(idem_store_t *s, uint8_t *out, int reverse)
{
    char key[32];
    for (int i = 0; i < FORK_KEYS; i++) {
        int k = reverse ? FORK_KEYS - 1 - i : i;
        snprintf(key, sizeof key, "fork-%d", k);
        idem_op_t op = claim_op(key, 1, T0);
        if (idem_store_claim(s, &op) != IDEM_OK)
            return -1;
        out[k] = (uint8_t)idem_decision_forwards(op.decision.kind);
        /* LMDB's writer mutex is not fair: a process that commits in a
         * tight loop can take it back before the other one wakes.  A pause
         * now and then lets both really interleave. */
        if (i % 8 == 7)
            usleep(300);
    }
    return 0;
}

Test(store_lmdb, another_process_never_forwards_a_key_we_forwarded, .init = setup_lmdb,
     .fini = teardown)
{
    int res[2], go[2];
    cr_assert_eq(pipe(res), 0);
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* The child: its own handle (never the parent's), claims, reports. */
        uint8_t mine[FORK_KEYS] = {0};
        idem_store_t *s;
        char c;
        close(res[0]);
        close(go[1]);
        if (idem_store_open(url, &s, NULL, 0) != IDEM_OK)
            _exit(2);
        /* Ready: the parent starts only now, so both claim at once even when
         * opening is slow (a sanitizer build). */
        if (write(res[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
            _exit(3);
        if (claim_all(s, mine, 1) != 0)
            _exit(4);
        idem_store_close(s);
        if (write(res[1], mine, sizeof mine) != (ssize_t)sizeof mine)
            _exit(5);
        _exit(0);
    }
    close(res[1]);
    close(go[0]);
    uint8_t ours[FORK_KEYS] = {0}, theirs[FORK_KEYS] = {0};
    char ready;
    cr_assert_eq(read(res[0], &ready, 1), 1, "the child could not open the store");
    cr_assert_eq(write(go[1], "g", 1), 1);
    cr_assert_eq(claim_all(st, ours, 0), 0);
    size_t got = 0;
    ssize_t n;
    while (got < sizeof theirs && (n = read(res[0], theirs + got, sizeof theirs - got)) > 0)
        got += (size_t)n;
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    cr_assert_eq(got, sizeof theirs);
    int both = 0, shared = 0;
    for (int k = 0; k < FORK_KEYS; k++) {
        cr_expect_eq(ours[k] + theirs[k], 1, "key fork-%d forwarded %d times", k,
                     ours[k] + theirs[k]);
        both += ours[k] && theirs[k];
        shared += theirs[k];
    }
    cr_expect_eq(both, 0);
    cr_expect_gt(shared, 0, "the child forwarded nothing: no real contention");
}

Test(store_lmdb, full_map_is_store_full_and_reads_still_work, .init = setup_lmdb,
     .fini = teardown)
{
    char u[PATH_MAX + 64], key[32];
    /* 64 pages: the records, their expiry index and the 16 pages kept free
     * for deletes (lmdb.c's reserve) need more than the 16 of 64 KiB. */
    snprintf(u, sizeof u, "lmdb:%s/small?map_size=256KiB", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);

    static uint8_t big[6000];
    memset(big, 'b', sizeof big);
    idem_response_t r = {200, NULL, 0, big, sizeof big};
    idem_err_t rc = IDEM_OK;
    int i, stored = 0;
    for (i = 0; i < 100 && rc == IDEM_OK; i++) {
        snprintf(key, sizeof key, "big-%d", i);
        idem_op_t ops[2] = {claim_op(key, 1, T0)};
        ops[1].kind = IDEM_OP_COMPLETE;
        ops[1].id = ops[0].id;
        ops[1].fence = 1;
        ops[1].response = &r;
        ops[1].expires_at_ms = T0 + TTL;
        rc = idem_store_exec(s, ops, 2);
        if (rc == IDEM_OK)
            stored++;
        else
            cr_expect_eq(ops[0].err, rc, "op errors not set to the batch error");
    }
    cr_assert_eq(rc, IDEM_E_STORE_FULL, "after %d batches: %s", i, idem_err_name(rc));
    cr_expect(strstr(idem_store_errstr(s), "MAP_FULL") != NULL, "errstr: %s",
              idem_store_errstr(s));
    cr_assert_gt(stored, 0);

    /* The failed batch left nothing behind. */
    idem_key_id_t id = kid(key);
    idem_record_t rec;
    cr_expect_eq(idem_store_get(s, &id, T0, &rec), IDEM_E_NOTFOUND);
    /* Reads go on working. */
    id = kid("big-0");
    cr_assert_eq(idem_store_get(s, &id, T0, &rec), IDEM_OK);
    cr_expect_eq(rec.response.body_len, sizeof big);
    idem_record_cleanup(&rec);
    cr_expect_eq(claim_on(s, "big-0", 1, T0 + 1).kind, IDEM_DECIDE_REPLAY);
    cr_expect_eq(idem_store_ping(s), IDEM_OK);
    /* Deleting makes room again. */
    for (int j = 0; j < stored; j++) {
        snprintf(key, sizeof key, "big-%d", j);
        id = kid(key);
        cr_expect_eq(idem_store_delete(s, &id), IDEM_OK, "delete %s: %s", key,
                     idem_store_errstr(s));
    }
    cr_expect_eq(claim_on(s, "after", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(s);
}

/* A delete needs fresh pages too, so a sweep of a full map must work in
 * small transactions; otherwise a full store never gets its space back. */
Test(store_lmdb, sweep_of_a_full_map_gives_the_space_back, .init = setup_lmdb,
     .fini = teardown)
{
    char u[PATH_MAX + 64], key[32];
    snprintf(u, sizeof u, "lmdb:%s/fullsweep?map_size=256KiB", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);

    static uint8_t body[300];
    memset(body, 'x', sizeof body);
    idem_response_t r = {200, NULL, 0, body, sizeof body};
    idem_err_t rc = IDEM_OK;
    int stored = 0;
    for (int i = 0; i < 100000 && rc == IDEM_OK; i++) {
        snprintf(key, sizeof key, "fill-%d", i);
        idem_op_t ops[2] = {claim_op(key, 1, T0)};
        ops[1].kind = IDEM_OP_COMPLETE;
        ops[1].id = ops[0].id;
        ops[1].fence = 1;
        ops[1].response = &r;
        ops[1].expires_at_ms = T0 + TTL;
        rc = idem_store_exec(s, ops, 2);
        stored += rc == IDEM_OK;
    }
    cr_assert_eq(rc, IDEM_E_STORE_FULL, "%s", idem_err_name(rc));
    cr_assert_gt(stored, 50);

    /* Everything has expired: one sweep call removes it all, full map or not. */
    size_t removed = 0;
    cr_assert_eq(idem_store_sweep(s, T0 + TTL + 1, 1000000, &removed), IDEM_OK, "%s",
                 idem_store_errstr(s));
    cr_expect_eq(removed, (size_t)stored);
    for (int i = 0; i < stored / 2; i++) {
        snprintf(key, sizeof key, "again-%d", i);
        cr_expect_eq(claim_on(s, key, 1, T0 + TTL + 2).kind, IDEM_DECIDE_CLAIM, "%s", key);
    }
    idem_store_close(s);
}

/* The room left (idem_store_space): what the map and the disk allow.  A
 * store filled until it refuses says it has (almost) nothing left; after
 * the sweep it has room again. */
Test(store_lmdb, space_says_how_much_room_is_left, .init = setup_lmdb, .fini = teardown)
{
    char u[PATH_MAX + 64], key[32];
    snprintf(u, sizeof u, "lmdb:%s/room?map_size=1MiB", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    idem_store_space_t sp;
    cr_assert_eq(idem_store_space(s, &sp), IDEM_OK, "%s", idem_store_errstr(s));
    cr_expect_gt(sp.used_bytes, 0);
    cr_expect(sp.free_bytes > 512 * 1024 && sp.free_bytes < 1024 * 1024, "free %llu of a 1 MiB map",
              (unsigned long long)sp.free_bytes);
    uint64_t empty_free = sp.free_bytes;

    static uint8_t body[2000];
    memset(body, 'r', sizeof body);
    idem_response_t r = {200, NULL, 0, body, sizeof body};
    idem_err_t rc = IDEM_OK;
    for (int i = 0; i < 100000 && rc == IDEM_OK; i++) {
        snprintf(key, sizeof key, "room-%d", i);
        idem_op_t ops[2] = {claim_op(key, 1, T0)};
        ops[1].kind = IDEM_OP_COMPLETE;
        ops[1].id = ops[0].id;
        ops[1].fence = 1;
        ops[1].response = &r;
        ops[1].expires_at_ms = T0 + TTL;
        rc = idem_store_exec(s, ops, 2);
    }
    cr_assert_eq(rc, IDEM_E_STORE_FULL, "%s", idem_err_name(rc));
    cr_assert_eq(idem_store_space(s, &sp), IDEM_OK);
    /* less than the refused batch needed: a record and a few pages of path */
    cr_expect_lt(sp.free_bytes, 64 * 1024, "free %llu after a refusal",
                 (unsigned long long)sp.free_bytes);
    size_t removed;
    cr_assert_eq(idem_store_sweep(s, T0 + TTL + 1, 1000000, &removed), IDEM_OK);
    cr_assert_gt(removed, 0);
    cr_assert_eq(idem_store_space(s, &sp), IDEM_OK);
    cr_expect_gt(sp.free_bytes, empty_free / 2, "free %llu after the sweep",
                 (unsigned long long)sp.free_bytes);
    idem_store_close(s);
    /* The network and memory stores have no disk of their own to tell of. */
    idem_store_t *m;
    cr_assert_eq(idem_store_open("memory:", &m, NULL, 0), IDEM_OK);
    cr_expect_eq(idem_store_space(m, &sp), IDEM_E_UNSUPPORTED);
    idem_store_close(m);
    cr_expect_eq(idem_store_space(NULL, &sp), IDEM_E_INVAL);
}

/* Without map_size the map is the filesystem's size (it was 1 GiB): the
 * store grows with its data up to what the disk holds, and the room it
 * reports is the disk's, less the reserve. */
Test(store_lmdb, default_map_grows_to_what_the_disk_holds, .init = setup_lmdb, .fini = teardown)
{
    struct statvfs v;
    cr_assert_eq(statvfs(dir, &v), 0);
    uint64_t disk_free = (uint64_t)v.f_bavail * v.f_frsize;
    if (disk_free < (3ull << 30))
        cr_skip_test("the filesystem of %s has less than 3 GiB free", dir);
    idem_store_space_t sp;
    cr_assert_eq(idem_store_space(st, &sp), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_gt(sp.free_bytes, 2ull << 30, "free %llu: the map is not the disk's size",
                 (unsigned long long)sp.free_bytes);
    cr_expect_leq(sp.free_bytes, disk_free + (1ull << 20));
    /* the file is as large as what was written, not the map */
    cr_expect_lt(sp.used_bytes, 16ull << 20, "used %llu", (unsigned long long)sp.used_bytes);
}

/* The pages of the map this process holds (its RSS), from /proc/self/smaps:
 * the Rss of the mapping of path. */
static uint64_t mapped_rss(const char *path)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert(f != NULL);
    char line[PATH_MAX + 256];
    int in = 0;
    uint64_t total = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long a, b;
        unsigned long long kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            in = strstr(line, path) != NULL; /* a mapping's first line */
        else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1)
            total += kb * 1024;
    }
    fclose(f);
    return total;
}

/* Reading touches pages of the map, which stay in the RSS; above
 * max_resident the sweep hands them back (they stay in the page cache). */
Test(store_lmdb, sweep_hands_back_the_pages_reads_touched, .init = setup_lmdb, .fini = teardown)
{
    char u[PATH_MAX + 64], key[32], data[PATH_MAX + 32];
    snprintf(u, sizeof u, "lmdb:%s/rss?max_resident=1MiB", dir);
    snprintf(data, sizeof data, "%s/rss/data.mdb", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    static uint8_t body[3000];
    memset(body, 'm', sizeof body);
    idem_response_t r = {200, NULL, 0, body, sizeof body};
    enum { N = 4000, B = 100 };
    for (int i = 0; i < N; i += B) {
        idem_op_t ops[2 * B];
        for (int j = 0; j < B; j++) {
            snprintf(key, sizeof key, "rss-%d", i + j);
            ops[2 * j] = claim_op(key, 1, T0);
            ops[2 * j + 1] = (idem_op_t){.kind = IDEM_OP_COMPLETE, .id = ops[2 * j].id,
                                         .fence = 1, .response = &r,
                                         .expires_at_ms = T0 + TTL};
        }
        cr_assert_eq(idem_store_exec(s, ops, 2 * B), IDEM_OK, "%s", idem_store_errstr(s));
    }
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "rss-%d", i);
        idem_key_id_t id = kid(key);
        idem_record_t rec;
        cr_assert_eq(idem_store_get(s, &id, T0, &rec), IDEM_OK);
        idem_record_cleanup(&rec);
    }
    uint64_t before = mapped_rss(data);
    cr_assert_gt(before, 8ull << 20, "reading %d records of 3 KB mapped only %llu bytes", N,
                 (unsigned long long)before);
    size_t removed;
    cr_assert_eq(idem_store_sweep(s, T0, 1000, &removed), IDEM_OK);
    uint64_t after = mapped_rss(data);
    cr_expect_lt(after, 1ull << 20, "after the sweep the map still holds %llu bytes (was %llu)",
                 (unsigned long long)after, (unsigned long long)before);
    /* and every record still reads back */
    for (int i = 0; i < N; i += 97) {
        snprintf(key, sizeof key, "rss-%d", i);
        idem_key_id_t id = kid(key);
        idem_record_t rec;
        cr_expect_eq(idem_store_get(s, &id, T0, &rec), IDEM_OK, "%s", key);
        idem_record_cleanup(&rec);
    }
    idem_store_close(s);
}

Test(store_lmdb, sync_interval_works_and_flushes_at_close, .init = setup_lmdb,
     .fini = teardown)
{
    char u[PATH_MAX + 64];
    snprintf(u, sizeof u, "lmdb:%s/interval?sync=interval", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    cr_expect_eq(claim_on(s, "k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(s);
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    cr_expect_eq(claim_on(s, "k", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    idem_store_close(s);
}

/* Write a raw value under (anonymous, key) with LMDB directly, the store closed. */
static void put_raw(const char *key, const void *val, size_t len)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    char k[IDEM_STORE_KEY_MAX];
    size_t kl = (size_t)snprintf(k, sizeof k, "anonymous%c%s", 0, key);
    MDB_val mk = {kl, k}, mv = {len, (void *)val};
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 2);
    cr_assert_eq(mdb_env_open(env, dir, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "records", 0, &dbi), 0);
    cr_assert_eq(mdb_put(txn, dbi, &mk, &mv, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(store_lmdb, corrupt_value_is_corrupt_and_can_be_deleted, .init = setup_lmdb,
     .fini = teardown)
{
    idem_store_close(st);
    st = NULL;
    put_raw("bad", "IDR\x01garbage", 11);
    open_store();
    idem_op_t op = claim_op("bad", 1, T0);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_E_CORRUPT);
    idem_record_t rec;
    cr_expect_eq(get("bad", T0, &rec), IDEM_E_CORRUPT);
    cr_expect_eq(complete("bad", 1, T0 + TTL), IDEM_E_CORRUPT);
    size_t removed;
    cr_expect_eq(idem_store_sweep(st, T0 + 2 * TTL, 100, &removed), IDEM_OK);
    idem_key_id_t id = kid("bad");
    cr_expect_eq(idem_store_delete(st, &id), IDEM_OK);
    cr_expect_eq(claim("bad", 1, T0).kind, IDEM_DECIDE_CLAIM);
}

static int present(const char *key); /* below, with the expiry cases */

Test(store_lmdb, a_directory_without_the_index_gets_it_at_open, .init = setup_lmdb,
     .fini = teardown)
{
    /* A store written before the expiry index: records only. */
    idem_store_close(st);
    st = NULL;
    fx_rm_tree(dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 2);
    cr_assert_eq(mdb_env_open(env, dir, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "records", MDB_CREATE, &dbi), 0);
    for (int i = 0; i < 10; i++) {
        idem_record_t rec = {.state = IDEM_STATE_COMPLETED, .fence = 1,
                             .expires_at_ms = T0 + 100 - i, .response = resp};
        uint8_t buf[512];
        cr_assert_leq(idem_record_encoded_size(&rec), sizeof buf);
        idem_record_encode_into(&rec, buf);
        char k[IDEM_STORE_KEY_MAX];
        size_t kl = (size_t)snprintf(k, sizeof k, "anonymous%cold-%d", 0, i);
        MDB_val mk = {kl, k}, mv = {idem_record_encoded_size(&rec), buf};
        cr_assert_eq(mdb_put(txn, dbi, &mk, &mv, 0), 0);
    }
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    open_store();
    size_t removed;
    cr_assert_eq(idem_store_sweep(st, T0 + 95, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 5); /* old-5 .. old-9: expires_at T0 + 95 .. T0 + 91 */
    cr_expect(present("old-0"));
    cr_expect(present("old-4"));
    cr_expect(!present("old-5"));
}

Test(store_lmdb, sweep_resumes_across_a_reopened_handle, .init = setup_lmdb, .fini = teardown)
{
    /* A fresh handle starts at the beginning and still finds everything. */
    char key[32];
    idem_op_t ops[100];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "s-%03d", i);
        ops[i] = claim_op(key, 1, T0);
        ops[i].expires_at_ms = T0 + 1;
    }
    cr_assert_eq(idem_store_exec(st, ops, 100), IDEM_OK);
    size_t removed, total = 0;
    cr_assert_eq(idem_store_sweep(st, T0 + 5, 30, &removed), IDEM_OK);
    total += removed;
    idem_store_close(st);
    st = NULL;
    open_store();
    for (int i = 0; i < 10 && total < 100; i++) {
        cr_assert_eq(idem_store_sweep(st, T0 + 5, 30, &removed), IDEM_OK);
        total += removed;
    }
    cr_expect_eq(total, 100);
}

/* ---- the embedded stores: expiry order ----------------------------------------
 *
 * lmdb: and rocksdb: keep an expiry index beside the records, and a sweep
 * walks it from the oldest entry: records leave in the order of their
 * expires_at, and a sweep reads exactly the records that leave, never a
 * live one (idem__store_sweep_visits counts the records sweeps read). */

#define EMBEDDED_CASE(name)                                                        \
    static void name##_case(void);                                                 \
    Test(store_lmdb, name, .init = setup_lmdb, .fini = teardown) { name##_case(); } \
    Test(store_rocksdb, name, .init = setup_rocksdb, .fini = teardown)             \
    {                                                                              \
        name##_case();                                                             \
    }                                                                              \
    static void name##_case(void)

static unsigned long visits(void)
{
    return atomic_load(&idem__store_sweep_visits);
}

/* Whether key's record is there at T0 (its expiry not yet reached). */
static int present(const char *key)
{
    idem_record_t rec;
    idem_err_t rc = get(key, T0, &rec);
    idem_record_cleanup(&rec);
    cr_assert(rc == IDEM_OK || rc == IDEM_E_NOTFOUND, "get %s: %s", key, idem_err_name(rc));
    return rc == IDEM_OK;
}

/* A completed record replays and an open claim is still in flight after
 * the store is closed and opened again (the stores that outlive a
 * process: lmdb, rocksdb, postgres). */
static void survives_reopen(void)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    claim("open", 1, T0);
    idem_store_close(st);
    st = NULL;
    open_store();
    idem_op_t op = claim_op("k", 1, T0 + 1);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_REPLAY);
    expect_resp_eq(&op.record.response, &resp);
    idem_record_cleanup(&op.record);
    cr_expect_eq(claim("open", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
}

EMBEDDED_CASE(data_survives_close_and_reopen) { survives_reopen(); }

EMBEDDED_CASE(sweep_reads_no_live_record)
{
    char key[32];
    idem_op_t ops[250];
    for (int i = 0; i < 250; i++) {
        snprintf(key, sizeof key, "k-%03d", i);
        ops[i] = claim_op(key, 1, T0);
        /* every fifth expires at T0 + 1..50; the others live a day */
        ops[i].expires_at_ms = i % 5 == 0 ? T0 + 1 + i / 5 : T0 + TTL;
    }
    cr_assert_eq(idem_store_exec(st, ops, 250), IDEM_OK);
    size_t removed;
    unsigned long v0 = visits();
    cr_assert_eq(idem_store_sweep(st, T0 + 50, 10000, &removed), IDEM_OK);
    cr_expect_eq(removed, 50);
    cr_expect_eq(visits() - v0, 50, "the sweep read %lu records for 50 expired",
                 visits() - v0);
    v0 = visits();
    cr_assert_eq(idem_store_sweep(st, T0 + 50, 10000, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    cr_expect_eq(visits() - v0, 0, "a sweep with nothing expired read %lu records",
                 visits() - v0);
    for (int i = 0; i < 250; i++) {
        snprintf(key, sizeof key, "k-%03d", i);
        cr_expect_eq(present(key), i % 5 != 0, "%s", key);
    }
}

EMBEDDED_CASE(records_leave_in_expiry_order)
{
    /* Key names sort against expiry order, so a scan in key order would
     * take the youngest first. */
    enum { N = 60, STEP = 7 };
    char key[32];
    idem_op_t ops[N];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "o-%03d", i);
        ops[i] = claim_op(key, 1, T0);
        ops[i].expires_at_ms = T0 + 1 + (N - 1 - i) * 10; /* o-059 first */
    }
    cr_assert_eq(idem_store_exec(st, ops, N), IDEM_OK);
    size_t gone = 0, removed;
    while (gone < N) {
        cr_assert_eq(idem_store_sweep(st, T0 + 100000, STEP, &removed), IDEM_OK);
        cr_assert(removed > 0 && removed <= STEP, "removed %zu", removed);
        gone += removed;
        for (int i = 0; i < N; i++) {
            snprintf(key, sizeof key, "o-%03d", i);
            /* the gone ones are exactly the `gone` earliest expiries */
            cr_expect_eq(present(key), (size_t)(N - 1 - i) >= gone, "%s after %zu", key, gone);
        }
    }
}

EMBEDDED_CASE(overwrite_and_delete_move_the_index)
{
    /* Completing with a later expiry, renewing past it, releasing and
     * deleting each leave no index entry behind that a sweep would read. */
    claim("c", 1, T0);
    cr_assert_eq(complete("c", 1, T0 + 1000), IDEM_OK);
    claim("r", 1, T0);
    idem_key_id_t r = kid("r"), d = kid("d"), c = kid("c");
    cr_assert_eq(idem_store_release(st, &r, 1), IDEM_OK);
    claim("d", 1, T0);
    cr_assert_eq(idem_store_delete(st, &d), IDEM_OK);
    claim("n", 1, T0); /* expires at T0 + TTL */
    idem_key_id_t n = kid("n");
    cr_assert_eq(idem_store_renew(st, &n, 1, T0 + 2 * TTL), IDEM_OK);
    size_t removed;
    unsigned long v0 = visits();
    cr_assert_eq(idem_store_sweep(st, T0 + TTL, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 1); /* c, at T0 + 1000 */
    cr_expect_eq(visits() - v0, 1);
    idem_record_t rec;
    cr_expect_eq(idem_store_get(st, &c, T0, &rec), IDEM_E_NOTFOUND);
    cr_expect_eq(idem_store_get(st, &n, T0, &rec), IDEM_OK);
    idem_record_cleanup(&rec);
    cr_assert_eq(idem_store_sweep(st, T0 + 2 * TTL, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 1); /* n, at its renewed lease end */
}

EMBEDDED_CASE(a_record_indexed_below_the_last_sweep_still_leaves)
{
    size_t removed;
    claim("late", 1, T0);
    cr_assert_eq(idem_store_sweep(st, T0 + 500, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    /* a completion whose retention ended before the sweep's time */
    cr_assert_eq(complete("late", 1, T0 + 100), IDEM_OK);
    cr_assert_eq(idem_store_sweep(st, T0 + 500, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 1);
}

EMBEDDED_CASE(index_survives_close_and_reopen)
{
    char key[32];
    idem_op_t ops[20];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "p-%02d", i);
        ops[i] = claim_op(key, 1, T0);
        ops[i].expires_at_ms = T0 + 1 + i;
    }
    cr_assert_eq(idem_store_exec(st, ops, 20), IDEM_OK);
    idem_store_close(st);
    st = NULL;
    open_store();
    size_t removed;
    unsigned long v0 = visits();
    cr_assert_eq(idem_store_sweep(st, T0 + 10, 1000, &removed), IDEM_OK);
    cr_expect_eq(removed, 10);
    cr_expect_eq(visits() - v0, 10);
}

/* Bytes the filesystem of path has for an unprivileged writer. */
static uint64_t fs_avail(const char *path)
{
    struct statvfs v;
    cr_assert_eq(statvfs(path, &v), 0, "statvfs %s: %s", path, strerror(errno));
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* The room of an embedded store: its files, and what its filesystem has
 * left above the store's reserve.  (lmdb: reports it once lmdb.c has the
 * op; until then this case skips there.) */
EMBEDDED_CASE(space_reports_the_files_and_the_room_left)
{
    char key[32];
    idem_op_t ops[100];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "s-%03d", i);
        ops[i] = claim_op(key, 1, T0);
    }
    cr_assert_eq(idem_store_exec(st, ops, 100), IDEM_OK);
    idem_store_space_t sp;
    idem_err_t rc = idem_store_space(st, &sp);
    if (rc == IDEM_E_UNSUPPORTED && strcmp(idem_store_name(st), "lmdb") == 0)
        cr_skip_test("lmdb: does not report its room in this build");
    cr_assert_eq(rc, IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_gt(sp.used_bytes, 0);
    uint64_t avail = fs_avail(dir);
    if (avail < (2ull << 30))
        cr_skip_test("the test's filesystem has under 2 GiB free");
    cr_expect_gt(sp.free_bytes, 0);
    /* free is what the disk has left less a reserve: never more (the
     * disk moves between the two reads, by a little) */
    cr_expect_leq(sp.free_bytes, avail + (64ull << 20));
    cr_expect_eq(idem_store_space(st, NULL), IDEM_E_INVAL);
}

/* ---- RocksDB only ------------------------------------------------------------ */

Test(store, bad_rocksdb_urls_are_inval_with_a_message)
{
    expect_bad_url("rocksdb:");
    expect_bad_url("rocksdb:?sync=always");
    expect_bad_url("rocksdb:/tmp/idem-never-created?sync=sometimes");
    expect_bad_url("rocksdb:/tmp/idem-never-created?cache_size=lots");
    expect_bad_url("rocksdb:/tmp/idem-never-created?cache_size=1KiB");
    expect_bad_url("rocksdb:/tmp/idem-never-created?cache_size=1TiB");
    expect_bad_url("rocksdb:/tmp/idem-never-created?write_buffer_size=2GiB");
    expect_bad_url("rocksdb:/tmp/idem-never-created?map_size=1GiB");
    expect_bad_url("rocksdb:/tmp/idem-never-created?min_free=lots");
    expect_bad_url("rocksdb:/tmp/idem-never-created?min_free=-1");
    expect_bad_url("rocksdb:/tmp/idem-never-created?min_free=16385GiB");
    cr_expect_eq(idem_store_check_url("rocksdb:/tmp/idem-never-created?min_free=0", NULL, 0),
                 IDEM_OK);
    cr_expect_eq(idem_store_check_url("rocksdb:/tmp/idem-never-created?min_free=16384GiB",
                                      NULL, 0),
                 IDEM_OK);
    struct stat sb;
    cr_expect_neq(stat("/tmp/idem-never-created", &sb), 0, "a bad URL created its directory");
}

Test(store_rocksdb, is_named_rocksdb, .init = setup_rocksdb, .fini = teardown)
{
    cr_expect_str_eq(idem_store_name(st), "rocksdb");
}

Test(store_rocksdb, a_second_open_of_the_directory_is_refused, .init = setup_rocksdb,
     .fini = teardown)
{
    char err[512] = "";
    idem_store_t *s = NULL;
    cr_expect_eq(idem_store_open(url, &s, err, sizeof err), IDEM_E_IO);
    cr_expect_null(s);
    cr_expect(strstr(err, "lock") != NULL || strstr(err, "LOCK") != NULL, "message: %s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM); /* the first still works */
}

Test(store_rocksdb, sync_interval_works_and_flushes_at_close, .init = setup_rocksdb,
     .fini = teardown)
{
    char u[PATH_MAX + 64];
    snprintf(u, sizeof u, "rocksdb:%s/interval?sync=interval&cache_size=4MiB", dir);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    cr_expect(idem_store_exec_is_cheap(s));
    cr_expect_eq(claim_on(s, "k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(s);
    cr_assert_eq(idem_store_open(u, &s, NULL, 0), IDEM_OK);
    cr_expect_eq(claim_on(s, "k", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(idem_store_ping(s), IDEM_OK);
    idem_store_close(s);
}

Test(store_rocksdb, directory_that_cannot_be_made_is_io, .init = setup_rocksdb,
     .fini = teardown)
{
    char u[PATH_MAX + 64], err[256] = "";
    idem_store_t *s = NULL;
    snprintf(u, sizeof u, "rocksdb:%s/missing/deeper", dir);
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_IO);
    cr_expect_null(s);
    cr_expect_neq(err[0], '\0');
}

/* A reserve larger than the disk: the store is full at once, as it is when
 * the disk really has less than the reserve left (which a test cannot
 * make).  Skips on a filesystem with 16 TiB free. */
#define MIN_FREE_ABOVE_ANY_DISK "16384GiB"

/* The fixture's store again, with a reserve above the disk's size. */
static idem_store_t *open_full(void)
{
    char u[PATH_MAX + 64];
    if (fs_avail(dir) >= (16ull << 40))
        cr_skip_test("the test's filesystem has 16 TiB free");
    snprintf(u, sizeof u, "%s?min_free=" MIN_FREE_ABOVE_ANY_DISK, url);
    idem_store_t *s = NULL;
    char err[256] = "";
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_OK, "%s", err);
    return s;
}

EMBEDDED_CASE(min_free_above_the_disk_refuses_new_records_alone)
{
    bool lmdb = strcmp(idem_store_name(st), "lmdb") == 0;
    idem_key_id_t done = kid("done"), open = kid("open"), old = kid("old");
    claim("done", 1, T0);
    cr_assert_eq(complete("done", 1, T0 + TTL), IDEM_OK);
    claim("open", 1, T0);
    idem_op_t op = claim_op("old", 1, T0);
    op.expires_at_ms = T0 + 10;
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    idem_store_close(st);
    st = NULL;
    st = open_full();

    idem_store_space_t sp;
    cr_assert_eq(idem_store_space(st, &sp), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_gt(sp.used_bytes, 0);
    cr_expect_eq(sp.free_bytes, 0);

    /* what would add a record or make one larger is refused, with a reason */
    op = claim_op("new", 1, T0 + 1);
    cr_expect_eq(idem_store_claim(st, &op), IDEM_E_STORE_FULL);
    cr_expect(strstr(idem_store_errstr(st), "no room") != NULL, "%s", idem_store_errstr(st));
    /* rocksdb refuses a completion, which makes a record larger; lmdb
     * takes one that fits the pages it has (this one does), so that a
     * request in flight can still finish: there "open" must stay open for
     * the checks below. */
    if (!lmdb)
        cr_expect_eq(complete("open", 1, T0 + TTL), IDEM_E_STORE_FULL);
    idem_record_t rec;
    cr_expect_eq(get("new", T0 + 1, &rec), IDEM_E_NOTFOUND);
    /* a batch is refused whole: its renewal is not applied either */
    idem_op_t two[2];
    memset(two, 0, sizeof two);
    two[0].kind = IDEM_OP_RENEW;
    two[0].id = open;
    two[0].fence = 1;
    two[0].lease_until_ms = T0 + 2 * LEASE;
    two[1] = claim_op("new2", 1, T0 + 1);
    cr_expect_eq(idem_store_exec(st, two, 2), IDEM_E_STORE_FULL);
    cr_expect_eq(two[0].err, IDEM_E_STORE_FULL);
    cr_assert_eq(get("open", T0 + 1, &rec), IDEM_OK);
    cr_expect_eq(rec.lease_until_ms, T0 + LEASE);
    idem_record_cleanup(&rec);

    /* what does not grow the store goes on: replays, renewals, releases,
     * deletes and the sweep */
    op = claim_op("done", 1, T0 + 2);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_REPLAY);
    idem_record_cleanup(&op.record);
    cr_expect_eq(idem_store_renew(st, &open, 1, T0 + 2 * LEASE), IDEM_OK);
    cr_expect_eq(idem_store_release(st, &open, 1), IDEM_OK);
    cr_expect_eq(idem_store_delete(st, &done), IDEM_OK);
    size_t removed = 0;
    cr_expect_eq(idem_store_sweep(st, T0 + 10, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 1);
    cr_expect_eq(idem_store_get(st, &old, T0, &rec), IDEM_E_NOTFOUND);
    cr_expect_eq(idem_store_ping(st), IDEM_OK);

    /* with the default reserve the same directory takes new keys again */
    idem_store_close(st);
    st = NULL;
    open_store();
    cr_expect_eq(claim("new", 1, T0 + 3).kind, IDEM_DECIDE_CLAIM);
}

/* Concurrent callers share a group commit; one that is refused for want of
 * room takes only its own writes out of the group.  Whichever way the
 * calls are grouped, every renewal commits and every new claim fails. */
struct full_race {
    idem_store_t *s;
    atomic_int renew_fail, claim_ok;
};

static void *full_renewer(void *arg)
{
    struct full_race *r = arg;
    idem_key_id_t id = kid("open");
    for (int i = 1; i <= 200; i++)
        if (idem_store_renew(r->s, &id, 1, T0 + LEASE + i) != IDEM_OK)
            atomic_fetch_add(&r->renew_fail, 1);
    return NULL;
}

/* A batch of a replay and a new claim: refused whole, and the replay's
 * record (decoded when the batch ran) freed once, never decoded twice
 * (LeakSanitizer checks the ASan build). */
static void *full_claimer(void *arg)
{
    struct full_race *r = arg;
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "n-%p-%d", (void *)pthread_self(), i);
        idem_op_t ops[2] = {claim_op("done", 1, T0), claim_op(key, 1, T0)};
        if (idem_store_exec(r->s, ops, 2) != IDEM_E_STORE_FULL ||
            ops[0].err != IDEM_E_STORE_FULL || ops[1].err != IDEM_E_STORE_FULL)
            atomic_fetch_add(&r->claim_ok, 1);
        idem_record_cleanup(&ops[0].record);
        idem_record_cleanup(&ops[1].record);
    }
    return NULL;
}

EMBEDDED_CASE(a_refused_batch_leaves_the_rest_of_its_group_alone)
{
    claim("open", 1, T0);
    claim("done", 1, T0);
    cr_assert_eq(complete("done", 1, T0 + TTL), IDEM_OK);
    idem_store_close(st);
    st = NULL;
    st = open_full();
    struct full_race r = {.s = st};
    atomic_init(&r.renew_fail, 0);
    atomic_init(&r.claim_ok, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, i % 2 ? full_claimer : full_renewer, &r), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&r.renew_fail), 0);
    cr_expect_eq(atomic_load(&r.claim_ok), 0);
    idem_record_t rec;
    cr_assert_eq(get("open", T0, &rec), IDEM_OK);
    cr_expect_geq(rec.lease_until_ms, T0 + LEASE + 1);
    idem_record_cleanup(&rec);
}

/* ---- Redis only ------------------------------------------------------------ */

/* The Redis key of (anonymous, key) in this test's store. */
static void redis_key(const char *key, char *out, size_t len)
{
    snprintf(out, len, "%sanonymous:%s", redis_prefix, key);
}

Test(store_redis, is_named_redis, .init = setup_redis, .fini = teardown)
{
    cr_expect_str_eq(idem_store_name(st), "redis");
    cr_expect_not(idem_store_exec_is_cheap(st));
}

/* A record is one string (layout 2, src/store/redis.c): a version byte 2,
 * st, fl, then fe, lu and ex as little-endian 64-bit numbers, the 32
 * fingerprint bytes, and only when completed the encoded record; with a
 * PXAT at its retention end: Redis itself removes it then. */
static int64_t le64_at(const char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | (uint8_t)p[i];
    return (int64_t)v;
}

Test(store_redis, record_layout_and_native_ttl, .init = setup_redis, .fini = teardown)
{
    redisContext *c = redis_direct_shared();
    char key[256];
    redis_key("ttl", key, sizeof key);
    int64_t now = fx_real_ms();
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 1);

    idem_op_t op = claim_op("ttl", 1, now);
    op.expires_at_ms = now + 1000;
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK, "%s", idem_store_errstr(st));
    redisReply *r = redisCommand(c, "GET %s", key);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STRING, "a record is a string");
    cr_expect_eq(r->len, 27 + IDEM_FP_LEN, "an in_progress record has no encoded record");
    cr_expect_eq(r->str[0], 2, "layout 2");
    cr_expect_eq(r->str[1], 1, "st");
    cr_expect_eq(r->str[2], 0, "fl");
    cr_expect_eq(le64_at(r->str + 3), 1, "fe");
    cr_expect_eq(le64_at(r->str + 11), op.lease_until_ms, "lu");
    cr_expect_eq(le64_at(r->str + 19), now + 1000, "ex");
    cr_expect_eq(memcmp(r->str + 27, fp, IDEM_FP_LEN), 0, "fp");
    freeReplyObject(r);
    r = redisCommand(c, "PEXPIRETIME %s", key);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER);
    cr_expect_eq(r->integer, now + 1000, "PXAT is the record's expires_at");
    freeReplyObject(r);

    idem_key_id_t id = kid("ttl");
    cr_assert_eq(idem_store_complete(st, &id, 1, &resp, 0, now + 1000), IDEM_OK);
    r = redisCommand(c, "GET %s", key);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STRING && r->len > 27 + IDEM_FP_LEN);
    cr_expect_eq(r->str[1], 2, "st");
    cr_expect_eq(le64_at(r->str + 11), 0, "lu");
    /* The encoded record is the exact record, fingerprint included:
     * spliced in by the script, so its checksum was computed with a zero
     * fingerprint. */
    const uint8_t *enc = (const uint8_t *)r->str + 27 + IDEM_FP_LEN;
    size_t enclen = r->len - 27 - IDEM_FP_LEN;
    idem_record_t rec;
    cr_assert_eq(idem__record_decode_spliced(enc, enclen, &rec), IDEM_OK);
    cr_expect_eq(memcmp(rec.fingerprint, fp, IDEM_FP_LEN), 0);
    cr_expect_eq(rec.fence, 1);
    expect_resp_eq(&rec.response, &resp);
    idem_record_cleanup(&rec);
    cr_expect_eq(idem_record_decode(enc, enclen, &rec), IDEM_E_CORRUPT,
                 "not as it was encoded");
    freeReplyObject(r);

    usleep(1300 * 1000);
    r = redisCommand(c, "EXISTS %s", key);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER);
    cr_expect_eq(r->integer, 0, "Redis did not remove the record at its expires_at");
    freeReplyObject(r);
    redisFree(c);
}

Test(store_redis, times_beyond_2_53_are_refused_alone, .init = setup_redis, .fini = teardown)
{
    idem_op_t ops[2] = {claim_op("big", 1, (int64_t)1 << 53), claim_op("ok", 1, T0)};
    cr_assert_eq(idem_store_exec(st, ops, 2), IDEM_OK);
    cr_expect_eq(ops[0].err, IDEM_E_INVAL);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[1].decision.kind, IDEM_DECIDE_CLAIM);
    idem_record_t rec;
    cr_expect_eq(get("big", T0, &rec), IDEM_E_NOTFOUND);
}

Test(store_redis, foreign_values_are_corrupt_and_can_be_deleted, .init = setup_redis,
     .fini = teardown)
{
    redisContext *c = redis_direct_shared();
    char k1[256], k2[256], k3[256];
    redis_key("badhash", k1, sizeof k1);
    redis_key("string", k2, sizeof k2);
    redis_key("badr", k3, sizeof k3);
    freeReplyObject(redisCommand(c, "HSET %s st 9 fl 0", k1));
    freeReplyObject(redisCommand(c, "SET %s x", k2));
    /* Fields of a completed record whose r does not agree with them. */
    freeReplyObject(redisCommand(c, "HSET %s st 2 fl 0 fp %b fe 1 lu 0 ex %lld r garbage", k3,
                                 "0123456789abcdef0123456789abcdef", (size_t)32,
                                 (long long)(T0 + TTL)));
    const char *keys[] = {"badhash", "string", "badr"};
    for (int i = 0; i < 3; i++) {
        idem_record_t rec;
        idem_op_t op = claim_op(keys[i], 1, T0);
        idem_err_t rc = idem_store_claim(st, &op);
        if (i < 2) /* badr: the fields decide (mismatch); only get and replay read r */
            cr_expect_eq(rc, IDEM_E_CORRUPT, "claim %s: %s", keys[i], idem_err_name(rc));
        cr_expect_eq(get(keys[i], T0, &rec), IDEM_E_CORRUPT, "get %s", keys[i]);
        if (i < 2)
            cr_expect_eq(complete(keys[i], 1, T0 + TTL), IDEM_E_CORRUPT, "complete %s", keys[i]);
        idem_key_id_t id = kid(keys[i]);
        cr_expect_eq(idem_store_delete(st, &id), IDEM_OK, "delete %s", keys[i]);
        cr_expect_eq(claim(keys[i], 1, T0).kind, IDEM_DECIDE_CLAIM, "claim %s after delete",
                     keys[i]);
    }
    redisFree(c);
}

/* ---- Redis URLs (nothing is contacted) ------------------------------------ */

static void expect_bad_url_saying(const char *u, const char *word)
{
    char err[256] = "";
    cr_expect_eq(idem_store_check_url(u, err, sizeof err), IDEM_E_INVAL, "url %s", u);
    cr_expect(strstr(err, word) != NULL, "url %s: message \"%s\" does not say %s", u, err, word);
}

Test(store, redis_urls_are_checked_with_a_message)
{
    expect_bad_url_saying("redis:", "redis://");
    expect_bad_url_saying("redis:/host", "redis://");
    expect_bad_url_saying("redis://", "host");
    expect_bad_url_saying("redis://:6379", "host");
    expect_bad_url_saying("redis://h:0", "port");
    expect_bad_url_saying("redis://h:65536", "port");
    expect_bad_url_saying("redis://h:63a9", "port");
    expect_bad_url_saying("redis://h:", "port");
    expect_bad_url_saying("redis://h h:1", "host");
    expect_bad_url_saying("redis://[::1:6379", "]");
    expect_bad_url_saying("redis://a:1,b:2", "one host");
    expect_bad_url_saying("redis://h:6379/x", "database");
    expect_bad_url_saying("redis://h:6379/-1", "database");
    expect_bad_url_saying("redis://h:6379/2147483648", "database");
    expect_bad_url_saying("redis://h:6379/0/1", "database");
    expect_bad_url_saying("redis://user@h:6379", "password");
    expect_bad_url_saying("redis://:%zz@h:6379", "percent");
    expect_bad_url_saying("redis://:%00@h:6379", "percent");
    expect_bad_url_saying("redis://:pw%4@h:6379", "percent");
    expect_bad_url_saying("redis://h?pool=0", "pool");
    expect_bad_url_saying("redis://h?pool=65", "pool");
    expect_bad_url_saying("redis://h?pool=many", "pool");
    expect_bad_url_saying("redis://h?timeout=0ms", "timeout");
    expect_bad_url_saying("redis://h?timeout=61s", "timeout");
    expect_bad_url_saying("redis://h?timeout=2", "timeout");
    expect_bad_url_saying("redis://h?prefix=", "prefix");
    expect_bad_url_saying("redis://h?prefix=a\x01", "prefix");
    expect_bad_url_saying("redis://h?colour=red", "colour");
    expect_bad_url_saying("redis://h?pool", "name=value");
    expect_bad_url_saying("redis+sentinel://h:26379", "master");
    expect_bad_url_saying("redis+sentinel://h:26379/", "master");
    expect_bad_url_saying("redis+sentinel://h:26379/my master", "master");
    expect_bad_url_saying("redis+sentinel://h:26379/m/x", "database");
    expect_bad_url_saying("redis+sentinel://a:1,:2/m", "host");
    expect_bad_url_saying("redis+sentinel://a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q/m", "sentinels");

    char long_pw[700] = "redis://:";
    memset(long_pw + 9, 'p', 600);
    memcpy(long_pw + 609, "@h", 3);
    expect_bad_url_saying(long_pw, "password");

    const char *good[] = {
        "redis://localhost",
        "redis://127.0.0.1:6379/0",
        "redis://:p%40ss%3Aw%2Frd@127.0.0.1:6379/15?prefix=app:idem:&pool=64&timeout=60s",
        "redis://user:pw@[::1]:6379/2147483647?timeout=1ms&pool=1",
        "redis+sentinel://a:1,b:2,[::1]:3/mymaster/2?pool=2",
        "redis+sentinel://sentinel/my-master.1",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char err[256] = "";
        cr_expect_eq(idem_store_check_url(good[i], err, sizeof err), IDEM_OK, "%s: %s", good[i],
                     err);
    }
}

/* rediss:// (TLS): each refusal names its parameter; the files are read
 * by the check too.  tests/blackbox/test_redis_tls.py talks to servers. */
Test(store, rediss_urls_are_checked_with_a_message)
{
    expect_bad_url_saying("redis://h?ca=/etc/ssl/certs/ca-certificates.crt", "rediss://");
    expect_bad_url_saying("redis+sentinel://h/m?verify=false", "rediss://");
    expect_bad_url_saying("rediss://h?verify=maybe", "verify=maybe");
    expect_bad_url_saying("rediss://h?verify=", "verify=");
    expect_bad_url_saying("rediss://h?ca=", "ca=");
    expect_bad_url_saying("rediss://h?cert=/x.pem", "key=");
    expect_bad_url_saying("rediss://h?key=/x.key", "cert=");
    expect_bad_url_saying("rediss://h?sni=a%20b", "sni=");
    expect_bad_url_saying("rediss://h?ca=/no/such/ca.pem", "ca=/no/such/ca.pem: No such file");
    expect_bad_url_saying("rediss://h?ca=%2Fno%20such.pem", "ca=/no such.pem");
    expect_bad_url_saying("rediss://h?ca=%zz", "percent");
    expect_bad_url_saying("rediss://h?cert=/no/c.pem&key=/no/k.pem", "cert=/no/c.pem");
    expect_bad_url_saying("rediss://h?colour=red", "verify");
    expect_bad_url_saying("rediss://a:1,b:2", "rediss+sentinel://");

    char long_ca[1100] = "rediss://h?ca=/";
    memset(long_ca + 15, 'c', 1030);
    expect_bad_url_saying(long_ca, "ca=");

    const char *good[] = {
        "rediss://localhost:6380/0",
        "rediss://127.0.0.1:6380?verify=false",
        "rediss://h?sni=redis.internal&verify=true&prefix=x:&pool=2&timeout=1s",
        "rediss+sentinel://a:1,b:2/mymaster/2?verify=0",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char err[256] = "";
        cr_expect_eq(idem_store_check_url(good[i], err, sizeof err), IDEM_OK, "%s: %s", good[i],
                     err);
    }
}

/* ---- Redis servers the tests own -------------------------------------------- */

#define OWN_MAX 4

static pid_t own_pids[OWN_MAX];
static int own_ports[OWN_MAX];

/* ---- PostgreSQL only -------------------------------------------------------
 *
 * The shared cases run against the server named by IDEM_TEST_PG_URL
 * (scripts/services.sh starts one), each test in a table of its own that
 * teardown drops.  The outage test starts a cluster of its own. */

#define PG_TABLES_MAX 8

static char pg_tables[PG_TABLES_MAX][64]; /* tables this test made; teardown drops them */
static int pg_ntables;

/* A fresh table name for this test, and a store URL on it (extra: more options). */
static const char *pg_new_table(char *u, size_t ulen, const char *extra)
{
    char tail[16];
    cr_assert_lt(pg_ntables, PG_TABLES_MAX);
    char *t = pg_tables[pg_ntables++];
    snprintf(tail, sizeof tail, "_%d", pg_ntables);
    fx_unique(t, sizeof pg_tables[0], "idem_t_", tail);
    const char *base = fx_env("IDEM_TEST_PG_URL");
    cr_assert_eq(fx_url_with(u, ulen, base, "table", t, extra), 0,
                 "IDEM_TEST_PG_URL is too long");
    return t;
}

static void setup_postgres(void)
{
    dir[0] = '\0';
    pg_new_table(url, sizeof url, NULL);
    open_store();
}

/* A direct libpq connection to the shared server (not through the store). */
static PGconn *pg_direct(void)
{
    fx_env("IDEM_TEST_PG_URL");
    PGconn *c = fx_pg_connect();
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    return c;
}

/* Run sql on c; returns the result (caller clears) after checking it worked. */
static PGresult *pg_run(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType s = PQresultStatus(r);
    cr_assert(s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK, "%s: %s", sql,
              PQresultErrorMessage(r));
    return r;
}

static void pg_sql(PGconn *c, const char *sql)
{
    PQclear(pg_run(c, sql));
}

/* The first column of the first row of a query, as a number. */
static long long pg_num(PGconn *c, const char *sql)
{
    PGresult *r = pg_run(c, sql);
    cr_assert_eq(PQntuples(r), 1, "%s", sql);
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void pg_drop_tables(void)
{
    for (int i = 0; i < pg_ntables; i++)
        fx_pg_drop(pg_tables[i]);
    pg_ntables = 0;
}

Test(store_postgres, is_named_postgres_under_both_schemes, .init = setup_postgres,
     .fini = teardown)
{
    cr_expect_str_eq(idem_store_name(st), "postgres");
    cr_expect_not(idem_store_exec_is_cheap(st));
    char u[512];
    pg_new_table(u, sizeof u, NULL);
    cr_assert_eq(strncmp(u, "postgres://", 11), 0, "IDEM_TEST_PG_URL: %s", u);
    char alias[520];
    snprintf(alias, sizeof alias, "postgresql://%s", u + 11);
    idem_store_t *s;
    char err[256] = "";
    cr_assert_eq(idem_store_open(alias, &s, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_str_eq(idem_store_name(s), "postgres");
    cr_expect_eq(claim_on(s, "k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(s);
}

Test(store_postgres, bad_urls_are_inval_with_a_message)
{
    expect_bad_url("postgres:");
    expect_bad_url("postgres:host/db");
    expect_bad_url("postgresql:/host/db");
    expect_bad_url("postgres://h/db?table=");
    expect_bad_url("postgres://h/db?table=Records");
    expect_bad_url("postgres://h/db?table=1records");
    expect_bad_url("postgres://h/db?table=idem-records");
    expect_bad_url("postgres://h/db?table=a%20b");
    expect_bad_url("postgres://h/db?table=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    expect_bad_url("postgres://h/db?table=a&table=b");
    expect_bad_url("postgres://h/db?pool=0");
    expect_bad_url("postgres://h/db?pool=65");
    expect_bad_url("postgres://h/db?pool=4x");
    expect_bad_url("postgres://h/db?pool=-1");
    expect_bad_url("postgres://h/db?pool=");
    expect_bad_url("postgres://h/db?timeout=0s");
    expect_bad_url("postgres://h/db?timeout=99ms");
    expect_bad_url("postgres://h/db?timeout=61s");
    expect_bad_url("postgres://h/db?timeout=5");
    expect_bad_url("postgres://h/db?timeout");
    expect_bad_url("postgres://h/db?colour=red");
    static char longest[3000];
    memset(longest, 'a', sizeof longest - 1);
    memcpy(longest, "postgres://h/db?application_name=", 33);
    expect_bad_url(longest);

    /* Good URLs check without contacting anything (host h does not exist). */
    char err[256] = "";
    cr_expect_eq(idem_store_check_url("postgres://u:pw@h:5432/db", err, sizeof err), IDEM_OK,
                 "%s", err);
    cr_expect_eq(idem_store_check_url("postgresql://h/db?table=_x9&pool=64&timeout=60s"
                                      "&sslmode=disable&application_name=idemd",
                                      err, sizeof err),
                 IDEM_OK, "%s", err);
    cr_expect_eq(idem_store_check_url("postgres://h/db?timeout=100ms&pool=1&table=aaaaaaaaaaaaaaa"
                                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                      err, sizeof err),
                 IDEM_OK, "%s", err);
}

Test(store_postgres, messages_name_the_problem)
{
    char err[256] = "";
    idem_store_t *s;
    /* An option libpq does not know is refused with libpq's own words,
     * both when checking and when opening. */
    cr_assert_eq(idem_store_check_url("postgres://h/db?colour=red", err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect(strstr(err, "colour") != NULL, "message: %s", err);
    err[0] = '\0';
    cr_assert_eq(idem_store_open("postgres://h/db?table=x&colour=red", &s, err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect_null(s);
    cr_expect(strstr(err, "colour") != NULL, "message: %s", err);
    cr_assert_eq(idem_store_check_url("postgres://h/db?pool=100", err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect(strstr(err, "pool") != NULL, "message: %s", err);
    cr_assert_eq(idem_store_check_url("postgres://h/db?table=Bad", err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect(strstr(err, "table") != NULL, "message: %s", err);
    cr_assert_eq(idem_store_check_url("postgres://h/db?timeout=2m", err, sizeof err),
                 IDEM_E_INVAL);
    cr_expect(strstr(err, "timeout") != NULL, "message: %s", err);
}

/* A value libpq checks only when it connects is refused at open, in its words. */
Test(store_postgres, bad_libpq_value_is_refused_at_open_with_libpqs_message,
     .fini = teardown)
{
    char u[512], err[256] = "";
    pg_new_table(u, sizeof u, "&sslmode=sometimes");
    idem_store_t *s;
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_null(s);
    cr_expect(strstr(err, "sslmode") != NULL, "message: %s", err);
}

/* libpq's TLS parameters reach libpq: the shared test server speaks no TLS,
 * so sslmode=require is refused at open, in libpq's words, on one line
 * (tests/blackbox/test_pg_tls.py runs a server that does). */
Test(store_postgres, tls_parameters_reach_libpq, .fini = teardown)
{
    char u[512], err[512] = "";
    pg_new_table(u, sizeof u, "&sslmode=require&sslrootcert=/nonexistent/ca.pem");
    idem_store_t *s;
    cr_expect_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_null(s);
    cr_expect(strstr(err, "does not support SSL") != NULL, "message: %s", err);
    cr_expect(strchr(err, '\n') == NULL, "not one line: %s", err);
}

/* A loopback port nothing listens on (just closed). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_direct(int port)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    cr_assert(c != NULL && c->err == 0, "connect to port %d: %s", port, c ? c->errstr : "");
    redisSetTimeout(c, tv);
    return c;
}

/* Whether something answers PING (or NOAUTH) on port. */
static int answers(int port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    int ok = 0;
    if (c != NULL && c->err == 0) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "PING");
        ok = r != NULL && (r->type == REDIS_REPLY_STATUS ||
                           (r->type == REDIS_REPLY_ERROR && strstr(r->str, "NOAUTH") != NULL));
        freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

/* Start a redis-server on port with argv extra (NULL-terminated) after the
 * defaults; slot says which own_pids entry it takes.  Waits until it answers. */
static void start_server(int slot, int port, const char *const *extra)
{
    char p[16];
    const char *argv[40] = {"redis-server"};
    int argc = 1;
    snprintf(p, sizeof p, "%d", port);
    if (extra != NULL && extra[0] != NULL && strcmp(extra[0], "--sentinel-conf") == 0) {
        argv[argc++] = extra[1]; /* a config file, then --sentinel */
        argv[argc++] = "--sentinel";
        extra += 2;
    }
    const char *defaults[] = {"--port", p, "--bind", "127.0.0.1", "--save", "",
                              "--dir", dir, "--logfile", "", "--loglevel", "warning",
                              "--daemonize", "no", NULL};
    for (int i = 0; defaults[i] != NULL; i++)
        argv[argc++] = defaults[i];
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 39; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    own_pids[slot] = pid;
    own_ports[slot] = port;
    for (int i = 0; i < 100 && !answers(port); i++)
        usleep(50 * 1000);
    cr_assert(answers(port), "redis-server on port %d did not start (is redis-server installed?)",
              port);
}

static void stop_server(int slot, int sig)
{
    if (own_pids[slot] > 0) {
        kill(own_pids[slot], sig);
        waitpid(own_pids[slot], NULL, 0);
        own_pids[slot] = 0;
    }
}

static void setup_own(void)
{
    make_dir();
    fx_t0_from_clock();
}

static void teardown_own(void)
{
    idem_store_close(st);
    st = NULL;
    for (int i = 0; i < OWN_MAX; i++)
        stop_server(i, SIGKILL);
    fx_rm_tree(dir);
}

static idem_err_t open_url(const char *u, idem_store_t **out, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    return idem_store_open(u, out, err, errlen);
}

Test(store_redis, auth_with_password_from_the_url, .init = setup_own, .fini = teardown_own)
{
    int port = free_port();
    const char *extra[] = {"--requirepass", "s3cr@t:pw/x", NULL};
    start_server(0, port, extra);
    char u[256], err[256];

    snprintf(u, sizeof u, "redis://:s3cr%%40t%%3Apw%%2Fx@127.0.0.1:%d", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(st);
    st = NULL;

    /* The ACL form: AUTH user password. */
    snprintf(u, sizeof u, "redis://default:s3cr%%40t%%3Apw%%2Fx@127.0.0.1:%d/0", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    idem_store_close(st);
    st = NULL;

    idem_store_t *s = NULL;
    snprintf(u, sizeof u, "redis://:wrong@127.0.0.1:%d", port);
    cr_expect_eq(open_url(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_null(s);
    cr_expect(strstr(err, "AUTH") != NULL && strstr(err, "WRONGPASS") != NULL,
              "message: %s", err);

    snprintf(u, sizeof u, "redis://127.0.0.1:%d", port);
    cr_expect_eq(open_url(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect(strstr(err, "NOAUTH") != NULL, "message: %s", err);
}

Test(store_redis, db_from_the_url, .init = setup_own, .fini = teardown_own)
{
    int port = free_port();
    start_server(0, port, NULL);
    char u[256], err[256];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/3?prefix=p:", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);

    redisContext *c = redis_direct(port);
    redisReply *r = redisCommand(c, "EXISTS p:anonymous:k");
    cr_expect_eq(r->integer, 0, "written to db 0");
    freeReplyObject(r);
    freeReplyObject(redisCommand(c, "SELECT 3"));
    r = redisCommand(c, "EXISTS p:anonymous:k");
    cr_expect_eq(r->integer, 1, "not written to db 3");
    freeReplyObject(r);
    redisFree(c);

    /* A db the server does not have: its refusal, verbatim. */
    idem_store_t *s = NULL;
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/16", port);
    cr_expect_eq(open_url(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect(strstr(err, "SELECT") != NULL && strstr(err, "out of range") != NULL,
              "message: %s", err);
}

Test(store_redis, nothing_listening_is_store_down_with_the_reason, .init = setup_own,
     .fini = teardown_own)
{
    char u[128], err[256];
    idem_store_t *s = NULL;
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", free_port());
    cr_expect_eq(open_url(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_null(s);
    cr_expect(strstr(err, "refused") != NULL, "message: %s", err);
}

/* A sentinel config on port for master name at 127.0.0.1:master_port.
 * The sentinel never fails over by itself: with a quorum of one, a server
 * that left its PINGs unanswered for down-after-milliseconds (it was 1 s)
 * on a loaded machine made the sentinel fail over on its own, at a moment
 * of its choosing (a write could land on a master while its replica was
 * being promoted, and the test's own SENTINEL FAILOVER then fail back over
 * to the server that had lost it).  An hour is never reached by a test, so
 * the only failover is the one a test asks for; and a failover that is
 * slow on a loaded machine is not aborted for time (failover-timeout). */
static void write_sentinel_conf(const char *path, int master_port)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "sentinel monitor mymaster 127.0.0.1 %d 1\n"
               "sentinel down-after-milliseconds mymaster 3600000\n"
               "sentinel failover-timeout mymaster 600000\n",
            master_port);
    fclose(f);
}

static int64_t mono_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Ask the server on port cmd (hiredis splits it on spaces; no '%') every
 * 100 ms, each time on a new connection, until ok(reply, arg) holds (1) or
 * seconds have passed on the clock (0).  A deadline, not a number of tries:
 * on a loaded machine one try (a connect and a command) can take far longer
 * than its 100 ms pause. */
static int redis_poll(int port, const char *cmd, int (*ok)(const redisReply *r, int arg),
                      int arg, int seconds)
{
    int64_t deadline = mono_now_ms() + (int64_t)seconds * 1000;
    for (;;) {
        redisContext *c = redis_direct(port);
        redisReply *r = redisCommand(c, cmd);
        int done = r != NULL && ok(r, arg);
        freeReplyObject(r);
        redisFree(c);
        if (done)
            return 1;
        if (mono_now_ms() >= deadline)
            return 0;
        usleep(100 * 1000);
    }
}

static int names_master(const redisReply *r, int master_port)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
           strtol(r->element[1]->str, NULL, 10) == master_port;
}

/* Wait until the sentinel on port names master_port as mymaster's address. */
static int sentinel_says(int port, int master_port, int seconds)
{
    return redis_poll(port, "SENTINEL get-master-addr-by-name mymaster", names_master,
                      master_port, seconds);
}

static int has_online_replica(const redisReply *r, int unused)
{
    (void)unused;
    return r->type == REDIS_REPLY_STRING && strstr(r->str, "connected_slaves:1") != NULL &&
           strstr(r->str, "state=online") != NULL;
}

/* Wait until the master on port has a replica whose link is online (the
 * replica's first full sync can take seconds on a loaded machine). */
static int replica_online(int port, int seconds)
{
    return redis_poll(port, "INFO replication", has_online_replica, 0, seconds);
}

Test(store_redis, sentinel_discovers_the_master, .init = setup_own, .fini = teardown_own)
{
    int mport = free_port(), sport = free_port();
    char conf[PATH_MAX], u[256], err[256];
    start_server(0, mport, NULL);
    snprintf(conf, sizeof conf, "%s/sentinel.conf", dir);
    write_sentinel_conf(conf, mport);
    const char *extra[] = {"--sentinel-conf", conf, NULL};
    start_server(1, sport, extra);
    cr_assert(sentinel_says(sport, mport, 10));

    /* The first sentinel listed is dead: the next one is asked. */
    snprintf(u, sizeof u, "redis+sentinel://127.0.0.1:%d,127.0.0.1:%d/mymaster?prefix=s:",
             free_port(), sport);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_expect_str_eq(idem_store_name(st), "redis");
    redisContext *c = redis_direct(mport);
    redisReply *r = redisCommand(c, "EXISTS s:anonymous:k");
    cr_expect_eq(r->integer, 1, "the record is not on the master");
    freeReplyObject(r);
    redisFree(c);

    idem_store_t *s = NULL;
    snprintf(u, sizeof u, "redis+sentinel://127.0.0.1:%d/othermaster", sport);
    cr_expect_eq(open_url(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect(strstr(err, "does not know master othermaster") != NULL, "message: %s", err);
}

static int is_status(const redisReply *r, int unused)
{
    (void)unused;
    return r->type == REDIS_REPLY_STATUS;
}

/* ROLE says master. */
static int is_master(const redisReply *r, int unused)
{
    (void)unused;
    return r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
}

/* ROLE says replica of 127.0.0.1:master_port. */
static int is_replica_of(const redisReply *r, int master_port)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 3 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "slave") == 0 &&
           r->element[2]->type == REDIS_REPLY_INTEGER && r->element[2]->integer == master_port;
}

/* The integer field name of SENTINEL MASTER's flat name/value answer, or -1. */
static long long sentinel_master_field(int sentinel_port, const char *name)
{
    long long v = -1;
    redisContext *c = redis_direct(sentinel_port);
    redisReply *r = redisCommand(c, "SENTINEL MASTER mymaster");
    for (size_t i = 0; r != NULL && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING && strcmp(r->element[i]->str, name) == 0 &&
            r->element[i + 1]->type == REDIS_REPLY_STRING)
            v = strtoll(r->element[i + 1]->str, NULL, 10);
    freeReplyObject(r);
    redisFree(c);
    return v;
}

/* How long each event of a failover may take before the test says it did
 * not come: far above what it takes (seconds), for a loaded machine under
 * the sanitizers.  Only a failure waits this long. */
#define FAILOVER_EVENT_S 60

/* Assert that the completed record key, written on the master on
 * master_port, is on the replica on replica_port before the failover.
 * WAIT counts the acknowledgements of the writes made on its own
 * connection only (on a fresh connection it answers at once, whatever the
 * replica has), and the store's writes were made on the store's
 * connection: so the test writes a marker of its own on the master and
 * WAITs on that same connection; the replica applies the stream in order,
 * so its acknowledgement of the marker covers every write before it.  Then
 * the record is read on the replica itself: the same bytes as on the
 * master (read there after the completion, before the marker). */
static void expect_on_replica(int master_port, int replica_port, const char *key)
{
    redisContext *c = redis_direct(master_port);
    /* The WAIT's own timeout decides, not the connection's 5 s. */
    redisSetTimeout(c, (struct timeval){FAILOVER_EVENT_S + 10, 0});
    redisReply *want = redisCommand(c, "GET %s", key);
    cr_assert(want != NULL && want->type == REDIS_REPLY_STRING && want->len > 0,
              "the master does not have %s", key);
    redisReply *r = redisCommand(c, "SET test:marker 1");
    cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS, "the marker was not written");
    freeReplyObject(r);
    r = redisCommand(c, "WAIT 1 %d", FAILOVER_EVENT_S * 1000);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1,
              "the replica did not acknowledge the writes within %d s (%s)", FAILOVER_EVENT_S,
              r == NULL                        ? c->errstr
              : r->type == REDIS_REPLY_ERROR   ? r->str
              : r->type == REDIS_REPLY_INTEGER ? "WAIT counted no replica"
                                               : "unexpected answer");
    freeReplyObject(r);
    redisFree(c);

    c = redis_direct(replica_port);
    r = redisCommand(c, "GET %s", key);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STRING && r->len == want->len &&
                  memcmp(r->str, want->str, want->len) == 0,
              "the replica does not have %s as the master has it", key);
    freeReplyObject(r);
    freeReplyObject(want);
    redisFree(c);
}

/* The test waits for events, never for a time.  Before the failover: the
 * completed record is on the replica (expect_on_replica).  Then: the
 * sentinel has seen the replica (it accepts SENTINEL FAILOVER), it names
 * the replica as the master, the replica says it is a master (ROLE), and
 * the sentinel has made the old master a replica of it (which it does on
 * its own schedule: it waits to see the old master still claim the role
 * for 8 s, on INFO it asks every 10 s, so this alone takes 10 to 20 s; in
 * the same transaction it closes the old master's clients, the store's
 * pooled connection among them).  The sentinel fails over only when asked
 * (write_sentinel_conf), and its config epoch is 1 at the end: exactly one
 * failover happened.  The times of the ops are fixed (T0, T0 + 1), so no
 * lease or retention runs out however slow the failover is.  Then the
 * store must follow at once, in a bounded number of calls with no pause
 * between them: the first call may still find its pooled connection to
 * the old master (closed, or answered READONLY), which is
 * IDEM_E_STORE_DOWN and drops it; the next opens a new connection, asks
 * the sentinel and lands on the new master.  The store's timeout is its
 * default, so that a slow answer on a loaded machine is not a failed
 * connect, whose backoff (up to 5 s) would make the store refuse calls
 * for a time instead of for an event. */
Test(store_redis, sentinel_failover_is_followed, .init = setup_own, .fini = teardown_own,
     .timeout = 8 * FAILOVER_EVENT_S)
{
    int mport = free_port(), rport, sport;
    char conf[PATH_MAX], u[256], err[256], rof[32];
    do /* the kernel may hand out a port it just handed out */
        rport = free_port();
    while (rport == mport);
    do
        sport = free_port();
    while (sport == mport || sport == rport);
    start_server(0, mport, NULL);
    snprintf(rof, sizeof rof, "%d", mport);
    const char *replica[] = {"--replicaof", "127.0.0.1", rof, NULL};
    start_server(1, rport, replica);
    snprintf(conf, sizeof conf, "%s/sentinel.conf", dir);
    write_sentinel_conf(conf, mport);
    const char *extra[] = {"--sentinel-conf", conf, NULL};
    start_server(2, sport, extra);
    cr_assert(sentinel_says(sport, mport, FAILOVER_EVENT_S));
    cr_assert(replica_online(mport, FAILOVER_EVENT_S),
              "the replica never finished its first sync");

    snprintf(u, sizeof u, "redis+sentinel://127.0.0.1:%d/mymaster", sport);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    expect_on_replica(mport, rport, "idem:anonymous:k");

    /* The sentinel must have seen the replica (in the master's INFO, asked
     * every 10 s) before it accepts to promote it. */
    cr_assert(redis_poll(sport, "SENTINEL FAILOVER mymaster", is_status, 0, FAILOVER_EVENT_S),
              "the sentinel would not fail over");
    cr_assert(sentinel_says(sport, rport, FAILOVER_EVENT_S), "the replica was not promoted");
    cr_assert(redis_poll(rport, "ROLE", is_master, 0, FAILOVER_EVENT_S),
              "the promoted replica does not say it is a master");
    /* Until the sentinel turns the old master into a replica, it still takes
     * writes (Redis's own split-brain window), and a pooled connection to
     * it would still be used: wait for that event. */
    cr_assert(redis_poll(mport, "ROLE", is_replica_of, rport, FAILOVER_EVENT_S),
              "the old master was not made a replica of the new one");

    /* The store follows within two calls, back to back. */
    idem_decision_t d = {0};
    idem_err_t got[2] = {IDEM_E_IO, IDEM_E_IO};
    char why[2][256] = {"", ""};
    int calls = 0;
    for (; calls < 2 && (calls == 0 || got[calls - 1] != IDEM_OK); calls++) {
        idem_op_t op = claim_op("k", 1, T0 + 1);
        got[calls] = idem_store_claim(st, &op);
        snprintf(why[calls], sizeof why[calls], "%s", idem_store_errstr(st));
        d = op.decision;
        idem_record_cleanup(&op.record);
    }
    cr_assert_eq(got[calls - 1], IDEM_OK, "the store did not follow the failover in 2 calls: %s",
                 why[calls - 1]);
    if (calls == 2)
        cr_expect_eq(got[0], IDEM_E_STORE_DOWN, "the call on the old connection: %s (%s)",
                     idem_strerror(got[0]), why[0]);
    cr_expect_eq(d.kind, IDEM_DECIDE_REPLAY,
                 "the record made before the failover: decision %s after %d call(s) (%s)",
                 idem_decision_name(d.kind), calls, why[calls - 1]);
    cr_expect_eq(claim("new", 1, T0).kind, IDEM_DECIDE_CLAIM);
    redisContext *c = redis_direct(rport);
    redisReply *r = redisCommand(c, "EXISTS idem:anonymous:new");
    cr_expect_eq(r->integer, 1, "the new record is not on the new master");
    freeReplyObject(r);
    redisFree(c);
    cr_expect_eq(sentinel_master_field(sport, "config-epoch"), 1,
                 "not exactly one failover (the sentinel's config epoch)");
}

Test(store_redis, outage_fails_fast_and_recovers_by_itself, .init = setup_own,
     .fini = teardown_own, .timeout = 60)
{
    int port = free_port();
    const char *aof[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    start_server(0, port, aof);
    char u[128], err[256];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d?timeout=500ms", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);

    stop_server(0, SIGKILL);
    int64_t t = mono_now_ms();
    idem_op_t op = claim_op("k", 1, T0 + 1);
    cr_expect_eq(idem_store_claim(st, &op), IDEM_E_STORE_DOWN);
    cr_expect_eq(op.decision.kind, 0);
    cr_expect_eq(idem_store_ping(st), IDEM_E_STORE_DOWN);
    idem_record_t rec;
    cr_expect_eq(get("k", T0, &rec), IDEM_E_STORE_DOWN);
    cr_expect(strstr(idem_store_errstr(st), "refused") != NULL, "errstr: %s",
              idem_store_errstr(st));
    /* While the backoff runs, a call costs microseconds, not a connect. */
    for (int i = 0; i < 1000; i++) {
        op = claim_op("k", 1, T0 + 1);
        cr_assert_eq(idem_store_claim(st, &op), IDEM_E_STORE_DOWN);
    }
    cr_expect_lt(mono_now_ms() - t, 500, "1000 calls during an outage took %lld ms",
                 (long long)(mono_now_ms() - t));

    start_server(0, port, aof);
    int64_t back = mono_now_ms();
    int ok = 0;
    while (!ok && mono_now_ms() - back < 10000) {
        op = claim_op("k", 1, T0 + 2);
        ok = idem_store_claim(st, &op) == IDEM_OK;
        if (!ok)
            usleep(20 * 1000);
    }
    cr_assert(ok, "no recovery: %s", idem_store_errstr(st));
    /* The longest backoff (5 s), a reconnect, and 1.5 s for a busy machine
     * (ASan, two cores): a backoff that grew past its cap (6.4 s next) or
     * no attempt at all still fails. */
    cr_expect_leq(mono_now_ms() - back, 5000 + 1500, "recovery took longer than the backoff");
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_REPLAY, "the record did not survive (AOF)");
    expect_resp_eq(&op.record.response, &resp);
    idem_record_cleanup(&op.record);
    cr_expect_eq(idem_store_ping(st), IDEM_OK);
}

Test(store_redis, killed_connections_are_replaced_unseen, .init = setup_own,
     .fini = teardown_own)
{
    int port = free_port();
    start_server(0, port, NULL);
    char u[128], err[256];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    redisContext *c = redis_direct(port);
    freeReplyObject(redisCommand(c, "CLIENT KILL TYPE normal SKIPME yes"));
    redisFree(c);
    usleep(50 * 1000);
    /* The pool's connection was closed by the server while idle. */
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
}

Test(store_redis, a_stalled_server_times_out, .init = setup_own, .fini = teardown_own,
     .timeout = 30)
{
    int port = free_port();
    start_server(0, port, NULL);
    char u[128], err[256];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d?timeout=200ms", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);

    kill(own_pids[0], SIGSTOP);
    int64_t t = mono_now_ms();
    idem_op_t op = claim_op("k2", 1, T0);
    cr_expect_eq(idem_store_claim(st, &op), IDEM_E_STORE_DOWN);
    int64_t took = mono_now_ms() - t;
    cr_expect_geq(took, 150);
    cr_expect_lt(took, 2000, "a 200 ms timeout took %lld ms", (long long)took);
    cr_expect(strstr(idem_store_errstr(st), "unknown") != NULL, "errstr: %s",
              idem_store_errstr(st));
    kill(own_pids[0], SIGCONT);

    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        op = claim_op("k", 1, T0 + 1);
        ok = idem_store_claim(st, &op) == IDEM_OK;
        if (!ok)
            usleep(50 * 1000);
    }
    cr_assert(ok, "%s", idem_store_errstr(st));
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_IN_FLIGHT);
}

Test(store_redis, scripts_flushed_between_calls_are_loaded_again, .init = setup_own,
     .fini = teardown_own)
{
    int port = free_port();
    start_server(0, port, NULL);
    char u[128], err[256];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d?pool=1", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(claim("a", 1, T0).kind, IDEM_DECIDE_CLAIM);

    redisContext *c = redis_direct(port);
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    cr_expect_eq(claim("a", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);

    /* A whole batch, in order, after another flush. */
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    idem_op_t ops[3] = {claim_op("b", 1, T0)};
    ops[1].kind = IDEM_OP_COMPLETE;
    ops[1].id = kid("b");
    ops[1].fence = 1;
    ops[1].response = &resp;
    ops[1].expires_at_ms = T0 + TTL;
    ops[2] = claim_op("b", 1, T0 + 1);
    cr_assert_eq(idem_store_exec(st, ops, 3), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(ops[0].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[2].decision.kind, IDEM_DECIDE_REPLAY);
    idem_record_cleanup(&ops[2].record);

    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    size_t removed = 0;
    cr_expect_eq(idem_store_sweep(st, T0 + 2 * TTL, 100, &removed), IDEM_OK, "%s",
                 idem_store_errstr(st));
    cr_expect_eq(removed, 2);
    redisFree(c);
}

Test(store_redis, one_connection_serves_many_threads, .init = setup_redis, .fini = teardown)
{
    char u[256];
    idem_store_t *one;
    snprintf(u, sizeof u, "%s&pool=1&prefix=%sone:", url, redis_prefix);
    /* The later prefix= wins. */
    cr_assert_eq(idem_store_open(u, &one, NULL, 0), IDEM_OK);
    race(one, one);
    idem_store_close(one);
}

/* ---- Redis decides as the C code does: random ops, side by side ----------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(uint64_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state % n;
}

/* A random op at now; its fence is mostly the one mem holds for the key, so
 * that completions, holds and renewals also succeed. */
static void random_op(idem_store_t *mem, idem_op_t *op, int64_t now)
{
    static const char *const keys[] = {"a", "b", "c"};
    static const char *const toks[] = {"00000000000000000000000000000001",
                                       "00000000000000000000000000000002"};
    static const idem_response_t small = {200, NULL, 0, (const uint8_t *)"ok", 2};
    memset(op, 0, sizeof *op);
    op->kind = (idem_op_kind_t)(1 + rnd(9));
    if (op->kind >= IDEM_OP_TOKEN_ISSUE && rnd(4) != 0)
        op->id = tok_id("anonymous", toks[rnd(2)]);
    else
        op->id = kid(keys[rnd(3)]);
    fp_fill(op->fp, 1 + (int)rnd(2));
    op->now_ms = now;
    /* Whole seconds, some a millisecond off, while now moves in whole
     * seconds: boundaries (now == lease end, now == retention end, 0, 1 or
     * 999 ms left for Retry-After) come up all the time. */
    static const int64_t off[] = {0, 0, 1, -1};
    op->lease_until_ms = now + 1000 * (int64_t)rnd(5) + off[rnd(4)];
    op->expires_at_ms = now + 1000 * (int64_t)rnd(30) + off[rnd(4)];
    op->fence = rnd(5);
    idem_record_t cur;
    if (rnd(4) != 0 && idem_store_get(mem, &op->id, now - 100000, &cur) == IDEM_OK) {
        op->fence = cur.fence;
        idem_record_cleanup(&cur);
    }
    op->flags = rnd(3) == 0 ? IDEM_REC_NOT_RETAINED : 0;
    op->response = rnd(2) ? &resp : &small;
}

static void expect_same_record(const idem_record_t *a, const idem_record_t *b, const char *what)
{
    cr_expect_eq(a->state, b->state, "%s: state", what);
    cr_expect_eq(a->flags, b->flags, "%s: flags", what);
    cr_expect_eq(memcmp(a->fingerprint, b->fingerprint, IDEM_FP_LEN), 0, "%s: fp", what);
    cr_expect_eq(a->fence, b->fence, "%s: fence", what);
    cr_expect_eq(a->lease_until_ms, b->lease_until_ms, "%s: lease", what);
    cr_expect_eq(a->expires_at_ms, b->expires_at_ms, "%s: expires", what);
    cr_expect_eq(a->response.status, b->response.status, "%s: status", what);
    cr_expect_eq(a->response.body_len, b->response.body_len, "%s: body", what);
    if (a->response.body_len > 0 || a->response.n_headers > 0)
        expect_resp_eq(&a->response, &b->response);
}

Test(store_redis, decides_like_the_c_code_on_random_ops, .init = setup_redis, .fini = teardown,
     .timeout = 120)
{
    idem_store_t *mem;
    cr_assert_eq(idem_store_open("memory:", &mem, NULL, 0), IDEM_OK);
    /* Far enough ahead that Redis expires nothing while the test runs. */
    int64_t now = fx_real_ms() + 600000;
    char what[96];
    int kinds[IDEM_DECIDE_RECONCILE + 1] = {0}, verdicts[4] = {0}, errs[16] = {0};
    for (int round = 0; round < 3000; round++) {
        idem_op_t a[4], b[4];
        size_t n = 1 + rnd(4);
        for (size_t i = 0; i < n; i++) {
            random_op(mem, &a[i], now);
            b[i] = a[i];
        }
        idem_err_t ra = idem_store_exec(mem, a, n), rb = idem_store_exec(st, b, n);
        cr_assert_eq(ra, IDEM_OK);
        cr_assert_eq(rb, IDEM_OK, "%s", idem_store_errstr(st));
        for (size_t i = 0; i < n; i++) {
            snprintf(what, sizeof what, "round %d op %zu (kind %d, key %s)", round, i,
                     a[i].kind, a[i].id.key);
            cr_expect_eq(b[i].err, a[i].err, "%s: err %s, C says %s", what,
                         idem_err_name(b[i].err), idem_err_name(a[i].err));
            cr_expect_eq(b[i].decision.kind, a[i].decision.kind, "%s: decision", what);
            cr_expect_eq(b[i].decision.fence, a[i].decision.fence, "%s: fence", what);
            cr_expect_eq(b[i].decision.retry_after_s, a[i].decision.retry_after_s,
                         "%s: retry_after", what);
            cr_expect_eq(b[i].token, a[i].token, "%s: token", what);
            cr_assert(a[i].decision.kind <= IDEM_DECIDE_RECONCILE && a[i].token < 4 &&
                          a[i].err >= 0 && a[i].err < 16,
                      "%s: a value this test does not count", what);
            kinds[a[i].decision.kind]++;
            verdicts[a[i].token]++;
            errs[a[i].err]++;
            if (a[i].decision.kind == IDEM_DECIDE_REPLAY && a[i].err == IDEM_OK)
                expect_same_record(&b[i].record, &a[i].record, what);
            idem_record_cleanup(&a[i].record);
            idem_record_cleanup(&b[i].record);
        }
        /* Every identity reads the same from both. */
        const char *ids[] = {"a", "b", "c"};
        for (int i = 0; i < 5; i++) {
            idem_key_id_t id = i < 3 ? kid(ids[i])
                                     : tok_id("anonymous", i == 3
                                                               ? "00000000000000000000000000000001"
                                                               : "00000000000000000000000000000002");
            idem_record_t x, y;
            idem_err_t ga = idem_store_get(mem, &id, now, &x), gb = idem_store_get(st, &id, now, &y);
            snprintf(what, sizeof what, "round %d get %d", round, i);
            cr_expect_eq(gb, ga, "%s: %s, C says %s", what, idem_err_name(gb), idem_err_name(ga));
            if (ga == IDEM_OK && gb == IDEM_OK)
                expect_same_record(&y, &x, what);
            idem_record_cleanup(&x);
            idem_record_cleanup(&y);
        }
        if (rnd(10) == 0) {
            size_t da = 0, db = 0;
            cr_assert_eq(idem_store_sweep(mem, now, 1000, &da), IDEM_OK);
            cr_assert_eq(idem_store_sweep(st, now, 1000, &db), IDEM_OK, "%s",
                         idem_store_errstr(st));
            /* Redis's sweep walks the whole database a budget at a time
             * (SCAN), and the shared test database holds other tests' keys:
             * it is swept on until it has removed what C removed, or far
             * more rounds than its records need, never beyond. */
            for (int more = 0; db < da && more < 2000; more++) {
                size_t d2 = 0;
                cr_assert_eq(idem_store_sweep(st, now, 1000, &d2), IDEM_OK, "%s",
                             idem_store_errstr(st));
                db += d2;
            }
            cr_expect_eq(db, da, "round %d: sweep removed %zu, C %zu", round, db, da);
        }
        now += 1000 * (int64_t)rnd(3);
    }
    idem_store_close(mem);
    /* The sequence must have reached every rule, or it proves little. */
    for (int k = IDEM_DECIDE_CLAIM; k <= IDEM_DECIDE_NOT_RETAINED; k++)
        cr_expect_gt(kinds[k], 0, "no decision %s was made", idem_decision_name(k));
    for (int v = IDEM_TOKEN_FIRST_USE; v <= IDEM_TOKEN_INVALID; v++)
        cr_expect_gt(verdicts[v], 0, "no token verdict %d", v);
    cr_expect_gt(errs[IDEM_E_FENCE], 0);
    cr_expect_gt(errs[IDEM_E_EXISTS], 0);
    cr_expect_gt(errs[IDEM_E_NOTFOUND], 0);
}

Test(store_redis, a_replica_refuses_writes_as_store_down, .init = setup_own,
     .fini = teardown_own)
{
    int mport = free_port(), rport = free_port();
    char rof[32], u[128], err[256];
    start_server(0, mport, NULL);
    snprintf(rof, sizeof rof, "%d", mport);
    const char *replica[] = {"--replicaof", "127.0.0.1", rof, NULL};
    start_server(1, rport, replica);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", rport);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);
    idem_op_t ops[2] = {claim_op("a", 1, T0), claim_op("b", 1, T0)};
    cr_expect_eq(idem_store_exec(st, ops, 2), IDEM_E_STORE_DOWN);
    cr_expect_eq(ops[0].err, IDEM_E_STORE_DOWN);
    cr_expect_eq(ops[0].decision.kind, 0);
    cr_expect(strstr(idem_store_errstr(st), "READONLY") != NULL, "errstr: %s",
              idem_store_errstr(st));
    idem_record_t rec;
    cr_expect_eq(get("a", T0, &rec), IDEM_E_NOTFOUND, "reads still work");
}

Test(store_redis, maxmemory_is_store_full_and_deleting_makes_room, .init = setup_own,
     .fini = teardown_own, .timeout = 60)
{
    int port = free_port();
    const char *limit[] = {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction", NULL};
    start_server(0, port, limit);
    char u[128], err[256], key[32];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", port);
    cr_assert_eq(open_url(u, &st, err, sizeof err), IDEM_OK, "%s", err);

    static uint8_t big[100000];
    memset(big, 'b', sizeof big);
    idem_response_t r = {200, NULL, 0, big, sizeof big};
    idem_err_t rc = IDEM_OK;
    int i, stored = 0;
    for (i = 0; i < 200 && rc == IDEM_OK; i++) {
        snprintf(key, sizeof key, "big-%d", i);
        idem_op_t ops[2] = {claim_op(key, 1, T0)};
        ops[1].kind = IDEM_OP_COMPLETE;
        ops[1].id = ops[0].id;
        ops[1].fence = 1;
        ops[1].response = &r;
        ops[1].expires_at_ms = T0 + TTL;
        rc = idem_store_exec(st, ops, 2);
        if (rc == IDEM_OK && ops[0].err == IDEM_OK && ops[1].err == IDEM_OK)
            stored++;
        else if (rc == IDEM_OK)
            rc = ops[0].err != IDEM_OK ? ops[0].err : ops[1].err;
    }
    cr_assert_eq(rc, IDEM_E_STORE_FULL, "after %d batches: %s (%s)", i, idem_err_name(rc),
                 idem_store_errstr(st));
    cr_expect(strstr(idem_store_errstr(st), "OOM") != NULL, "errstr: %s", idem_store_errstr(st));
    cr_assert_gt(stored, 0);
    idem_record_t rec;
    cr_expect_eq(get("big-0", T0, &rec), IDEM_OK, "reads go on working");
    idem_record_cleanup(&rec);
    /* and replays: over maxmemory, a claim's first write (SET NX, for a
     * new key) is refused with OOM, and the claim then reads the record it
     * replays */
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    cr_assert(c != NULL && c->err == 0);
    freeReplyObject(redisCommand(c, "CONFIG SET maxmemory 1"));
    idem_op_t again = claim_op("big-0", 1, T0);
    cr_expect_eq(idem_store_claim(st, &again), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(again.decision.kind, IDEM_DECIDE_REPLAY, "a full Redis still replays");
    idem_record_cleanup(&again.record);
    again = claim_op("new-when-full", 1, T0);
    cr_expect_eq(idem_store_claim(st, &again), IDEM_E_STORE_FULL, "a new key is refused");
    freeReplyObject(redisCommand(c, "CONFIG SET maxmemory 3mb"));
    redisFree(c);
    cr_expect_eq(idem_store_ping(st), IDEM_OK);
    for (int j = 0; j < stored; j++) {
        snprintf(key, sizeof key, "big-%d", j);
        idem_key_id_t id = kid(key);
        cr_expect_eq(idem_store_delete(st, &id), IDEM_OK, "delete %s: %s", key,
                     idem_store_errstr(st));
    }
    cr_expect_eq(claim("after", 1, T0).kind, IDEM_DECIDE_CLAIM);
}

Test(store_postgres, no_server_is_store_down_at_open_with_a_message)
{
    char u[128], err[256] = "";
    snprintf(u, sizeof u, "postgres://postgres@127.0.0.1:%d/idem_test?timeout=2s", free_port());
    idem_store_t *s;
    int64_t started = mono_now_ms();
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_lt(mono_now_ms() - started, 3000);
    cr_expect_null(s);
    cr_expect(strstr(err, "connect") != NULL, "message: %s", err);
}

Test(store_postgres, table_of_another_shape_is_refused_at_open, .fini = teardown)
{
    char u[512], sql[256], err[512] = "";
    const char *t = pg_new_table(u, sizeof u, NULL);
    PGconn *c = pg_direct();
    snprintf(sql, sizeof sql, "CREATE TABLE \"%s\" (scope text, key text)", t);
    pg_sql(c, sql);
    PQfinish(c);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_E_STORE_DOWN);
    cr_expect_null(s);
    cr_expect(strstr(err, "does not exist") != NULL, "message: %s", err);
}

Test(store_postgres, columns_mirror_the_record, .init = setup_postgres, .fini = teardown)
{
    claim("k", 1, T0);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    claim("open", 2, T0);
    PGconn *c = pg_direct();
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT state, flags, fence, lease_until, expires_at, length(fingerprint), "
             "get_byte(fingerprint, 0), substr(record, 1, 3) = 'IDR'::bytea, scope "
             "FROM \"%s\" ORDER BY key",
             pg_tables[0]);
    PGresult *r = pg_run(c, sql);
    cr_assert_eq(PQntuples(r), 2);
    /* "k": completed */
    cr_expect_str_eq(PQgetvalue(r, 0, 0), "2");
    cr_expect_str_eq(PQgetvalue(r, 0, 1), "0");
    cr_expect_str_eq(PQgetvalue(r, 0, 2), "1");
    cr_expect_str_eq(PQgetvalue(r, 0, 3), "0");
    cr_expect_eq(strtoll(PQgetvalue(r, 0, 4), NULL, 10), T0 + TTL);
    cr_expect_str_eq(PQgetvalue(r, 0, 5), "32");
    cr_expect_str_eq(PQgetvalue(r, 0, 6), "1");
    cr_expect_str_eq(PQgetvalue(r, 0, 7), "t");
    cr_expect_str_eq(PQgetvalue(r, 0, 8), "anonymous");
    /* "open": in progress */
    cr_expect_str_eq(PQgetvalue(r, 1, 0), "1");
    cr_expect_eq(strtoll(PQgetvalue(r, 1, 3), NULL, 10), T0 + LEASE);
    cr_expect_str_eq(PQgetvalue(r, 1, 6), "2");
    PQclear(r);
    PQfinish(c);
}

Test(store_postgres, data_survives_close_and_reopen, .init = setup_postgres, .fini = teardown)
{
    survives_reopen();
}

Test(store_postgres, key_that_is_not_utf8_is_refused_alone, .init = setup_postgres,
     .fini = teardown)
{
    idem_op_t ops[2] = {claim_op("bad\xff", 1, T0), claim_op("good", 1, T0)};
    cr_assert_eq(idem_store_exec(st, ops, 2), IDEM_OK);
    cr_expect_eq(ops[0].err, IDEM_E_INVAL);
    cr_expect_eq(ops[1].err, IDEM_OK);
    cr_expect_eq(ops[1].decision.kind, IDEM_DECIDE_CLAIM);
    /* Multi-byte UTF-8 is fine. */
    cr_expect_eq(claim("cl\xc3\xa9", 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(claim("cl\xc3\xa9", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    idem_record_t rec;
    cr_expect_eq(get("bad\xff", T0, &rec), IDEM_E_NOTFOUND);
}

Test(store_postgres, two_handles_on_one_table_never_both_forward, .init = setup_postgres,
     .fini = teardown)
{
    idem_store_t *second;
    cr_assert_eq(idem_store_open(url, &second, NULL, 0), IDEM_OK);
    race(st, second);
    cr_expect_eq(claim_on(second, "race-0", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    idem_store_close(second);
    cr_expect_eq(claim("race-0", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
}

Test(store_postgres, another_process_never_forwards_a_key_we_forwarded, .init = setup_postgres,
     .fini = teardown)
{
    int res[2], go[2];
    cr_assert_eq(pipe(res), 0);
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        uint8_t mine[FORK_KEYS] = {0};
        idem_store_t *s;
        char c;
        close(res[0]);
        close(go[1]);
        if (idem_store_open(url, &s, NULL, 0) != IDEM_OK)
            _exit(2);
        if (read(go[0], &c, 1) != 1)
            _exit(3);
        if (claim_all(s, mine, 1) != 0)
            _exit(4);
        idem_store_close(s);
        if (write(res[1], mine, sizeof mine) != (ssize_t)sizeof mine)
            _exit(5);
        _exit(0);
    }
    close(res[1]);
    close(go[0]);
    uint8_t ours[FORK_KEYS] = {0}, theirs[FORK_KEYS] = {0};
    cr_assert_eq(write(go[1], "g", 1), 1);
    cr_assert_eq(claim_all(st, ours, 0), 0);
    size_t got = 0;
    ssize_t n;
    while (got < sizeof theirs && (n = read(res[0], theirs + got, sizeof theirs - got)) > 0)
        got += (size_t)n;
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    cr_assert_eq(got, sizeof theirs);
    for (int k = 0; k < FORK_KEYS; k++)
        cr_expect_eq(ours[k] + theirs[k], 1, "key fork-%d forwarded %d times", k,
                     ours[k] + theirs[k]);
}

#define CREATORS 6

/* Many processes opening one new table at once all succeed (the advisory
 * lock keeps their CREATE TABLEs apart), and exactly one claims the key. */
Test(store_postgres, processes_creating_the_table_at_once_all_succeed, .fini = teardown)
{
    char u[512];
    pg_new_table(u, sizeof u, NULL);
    int go[2], res[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(res), 0);
    pid_t pids[CREATORS];
    for (int i = 0; i < CREATORS; i++) {
        pids[i] = fork();
        cr_assert_neq(pids[i], -1);
        if (pids[i] == 0) {
            char c, err[256] = "";
            idem_store_t *s;
            close(go[1]);
            if (read(go[0], &c, 1) != 1)
                _exit(3);
            if (idem_store_open(u, &s, err, sizeof err) != IDEM_OK) {
                fprintf(stderr, "child open: %s\n", err);
                _exit(2);
            }
            idem_op_t op = claim_op("k", 1, T0);
            if (idem_store_claim(s, &op) != IDEM_OK)
                _exit(4);
            char f = (char)idem_decision_forwards(op.decision.kind);
            idem_store_close(s);
            _exit(write(res[1], &f, 1) == 1 ? 0 : 5);
        }
    }
    close(go[0]);
    close(res[1]);
    char gos[CREATORS];
    memset(gos, 'g', sizeof gos);
    cr_assert_eq(write(go[1], gos, sizeof gos), (ssize_t)sizeof gos);
    int ok = 0;
    for (int i = 0; i < CREATORS; i++) {
        int status = 0;
        waitpid(pids[i], &status, 0);
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    cr_expect_eq(ok, CREATORS);
    char f[CREATORS];
    ssize_t got = read(res[0], f, sizeof f);
    cr_assert_eq(got, CREATORS);
    int forwarded = 0;
    for (int i = 0; i < CREATORS; i++)
        forwarded += f[i];
    cr_expect_eq(forwarded, 1);
}

struct pg_claimer {
    idem_op_t ops[3];
    size_t n; /* ops in the batch */
    idem_err_t rc;
    char err[256]; /* idem_store_errstr of the claiming thread (it is per thread) */
};

static void *pg_claimer_main(void *arg)
{
    struct pg_claimer *c = arg;
    c->rc = idem_store_exec(st, c->ops, c->n);
    snprintf(c->err, sizeof c->err, "%s", idem_store_errstr(st));
    return NULL;
}

/* Wait until a session waits for a lock on an INSERT into our table. */
static void wait_for_blocked_insert(PGconn *c)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
             "AND query LIKE 'INSERT INTO \"%s\"%%'",
             pg_tables[0]);
    for (int i = 0; i < 500; i++) {
        if (pg_num(c, sql) > 0)
            return;
        usleep(10000);
    }
    cr_assert_fail("the store's INSERT never waited for the other transaction");
}

/* Write a claim of key as if another idemd did, in c's open transaction. */
static void pg_insert_claim(PGconn *c, const char *key, int fpc, uint64_t fence, int64_t lease)
{
    idem_record_t rec;
    memset(&rec, 0, sizeof rec);
    rec.state = IDEM_STATE_IN_PROGRESS;
    fp_fill(rec.fingerprint, fpc);
    rec.fence = fence;
    rec.lease_until_ms = lease;
    rec.expires_at_ms = T0 + TTL;
    uint8_t *val;
    size_t len;
    cr_assert_eq(idem_record_encode(&rec, &val, &len), IDEM_OK);
    char sql[256], fence_s[24], lease_s[24], exp_s[24];
    snprintf(sql, sizeof sql,
             "INSERT INTO \"%s\" VALUES ('anonymous', $1, 1, 0, $2, $3, $4, $5, $6)",
             pg_tables[0]);
    snprintf(fence_s, sizeof fence_s, "%llu", (unsigned long long)fence);
    snprintf(lease_s, sizeof lease_s, "%lld", (long long)lease);
    snprintf(exp_s, sizeof exp_s, "%lld", (long long)(T0 + TTL));
    const char *vals[6] = {key, (const char *)rec.fingerprint, fence_s, lease_s, exp_s,
                           (const char *)val};
    int lens[6] = {0, IDEM_FP_LEN, 0, 0, 0, (int)len};
    int fmts[6] = {0, 1, 0, 0, 0, 1};
    PGresult *r = PQexecParams(c, sql, 6, NULL, vals, lens, fmts, 0);
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQresultErrorMessage(r));
    PQclear(r);
    idem_free(val);
}

/* The store's INSERT of a new key waits for another transaction that
 * inserted it first; when that one commits, the store reads the key again
 * and decides on what the other wrote, and its other key still commits. */
/* Another connection inserts "contested" (fence 7) in an open transaction;
 * the store claims "contested" and "free" in one batch, which blocks on that
 * insert; then the other transaction ends with finish (COMMIT or ROLLBACK). */
static void race_against_an_open_insert(const char *finish, struct pg_claimer *c)
{
    PGconn *other = pg_direct(), *watch = pg_direct();
    pg_sql(other, "BEGIN");
    pg_insert_claim(other, "contested", 1, 7, T0 + LEASE);
    c->ops[0] = claim_op("contested", 1, T0 + 1);
    c->ops[1] = claim_op("free", 1, T0 + 1);
    c->n = 2;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pg_claimer_main, c), 0);
    wait_for_blocked_insert(watch);
    pg_sql(other, finish);
    pthread_join(t, NULL);
    PQfinish(other);
    PQfinish(watch);
}

Test(store_postgres, lost_insert_race_reads_the_winner_again, .init = setup_postgres,
     .fini = teardown)
{
    struct pg_claimer c;
    memset(&c, 0, sizeof c);
    race_against_an_open_insert("COMMIT", &c);
    cr_assert_eq(c.rc, IDEM_OK, "%s", c.err);
    cr_expect_eq(c.ops[0].err, IDEM_OK);
    cr_expect_eq(c.ops[0].decision.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(c.ops[0].decision.fence, 7);
    cr_expect_eq(c.ops[1].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(claim("free", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
    /* The winner's lease runs out: a takeover with its fence + 1. */
    idem_decision_t d = claim("contested", 1, T0 + LEASE);
    cr_expect_eq(d.kind, IDEM_DECIDE_TAKEOVER);
    cr_expect_eq(d.fence, 8);
}

Test(store_postgres, insert_race_against_a_rolled_back_insert_claims, .init = setup_postgres,
     .fini = teardown)
{
    struct pg_claimer c;
    memset(&c, 0, sizeof c);
    race_against_an_open_insert("ROLLBACK", &c);
    cr_assert_eq(c.rc, IDEM_OK, "%s", c.err);
    cr_expect_eq(c.ops[0].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(c.ops[0].decision.fence, 1);
    cr_expect_eq(c.ops[1].decision.kind, IDEM_DECIDE_CLAIM);
}

/* The store reads without locking and writes a row only if it still holds
 * what was read: here the row changes between the read and the write (the
 * store's UPDATE waits for another transaction that deleted it and wrote a
 * claim of its own, fence 7).  The batch then runs again, decides on what
 * the other wrote, and its other key is claimed exactly once. */
Test(store_postgres, lost_update_race_reads_the_winner_again, .init = setup_postgres,
     .fini = teardown)
{
    char sql[256];
    cr_assert_eq(claim("contested", 1, T0).kind, IDEM_DECIDE_CLAIM);
    PGconn *other = pg_direct(), *watch = pg_direct();
    pg_sql(other, "BEGIN");
    snprintf(sql, sizeof sql, "DELETE FROM \"%s\" WHERE key = 'contested'", pg_tables[0]);
    pg_sql(other, sql);

    /* The lease is over: a takeover (fence 2) of contested, a claim of free. */
    struct pg_claimer c;
    memset(&c, 0, sizeof c);
    c.ops[0] = claim_op("contested", 1, T0 + LEASE);
    c.ops[1] = claim_op("free", 1, T0 + LEASE);
    c.n = 2;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pg_claimer_main, &c), 0);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
             "AND query LIKE 'WITH w AS (UPDATE \"%s\"%%'",
             pg_tables[0]);
    int i = 0;
    for (; i < 500 && pg_num(watch, sql) == 0; i++)
        usleep(10000);
    cr_assert_lt(i, 500, "the store's UPDATE never waited for the other transaction");
    pg_insert_claim(other, "contested", 1, 7, T0 + 3 * LEASE);
    pg_sql(other, "COMMIT");
    pthread_join(t, NULL);

    cr_assert_eq(c.rc, IDEM_OK, "%s", c.err);
    cr_expect_eq(c.ops[0].decision.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(c.ops[0].decision.fence, 7);
    cr_expect_eq(c.ops[1].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(c.ops[1].decision.fence, 1);
    for (int k = 0; k < 2; k++)
        idem_record_cleanup(&c.ops[k].record);
    cr_expect_eq(claim("free", 1, T0 + LEASE + 1).kind, IDEM_DECIDE_IN_FLIGHT);
    PQfinish(other);
    PQfinish(watch);
}

/* A batch may skip its read and decide on what the store last saw of its
 * rows (postgres.c, "One round trip"); the write flight then checks every
 * row against that, so a row another process changed since is read again,
 * never decided on as it was.  Each case fails if a check is missing. */

/* Remembered completed, deleted behind the store's back: a claim, not a
 * replay (the check of a row read but not written, ST_SAME). */
Test(store_postgres, a_remembered_row_deleted_since_is_claimed_not_replayed,
     .init = setup_postgres, .fini = teardown)
{
    char sql[256];
    cr_assert_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    cr_assert_eq(complete("k", 1, T0 + TTL), IDEM_OK);
    cr_assert_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_REPLAY);
    PGconn *other = pg_direct();
    snprintf(sql, sizeof sql, "DELETE FROM \"%s\" WHERE key = 'k'", pg_tables[0]);
    pg_sql(other, sql);
    idem_decision_t d = claim("k", 1, T0 + 2);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 1);
    cr_expect_eq(claim("k", 1, T0 + 3).kind, IDEM_DECIDE_IN_FLIGHT);
    PQfinish(other);
}

/* Remembered as our claim (fence 1), replaced by another idemd's (fence 7):
 * our completion is refused and theirs applies (the UPDATE's check). */
Test(store_postgres, a_remembered_claim_taken_over_since_refuses_our_completion,
     .init = setup_postgres, .fini = teardown)
{
    char sql[256];
    cr_assert_eq(claim("k", 1, T0).kind, IDEM_DECIDE_CLAIM);
    PGconn *other = pg_direct();
    pg_sql(other, "BEGIN");
    snprintf(sql, sizeof sql, "DELETE FROM \"%s\" WHERE key = 'k'", pg_tables[0]);
    pg_sql(other, sql);
    pg_insert_claim(other, "k", 1, 7, T0 + LEASE);
    pg_sql(other, "COMMIT");
    cr_expect_eq(complete("k", 1, T0 + TTL), IDEM_E_FENCE);
    cr_expect_eq(complete("k", 7, T0 + TTL), IDEM_OK);
    cr_expect_eq(claim("k", 1, T0 + 1).kind, IDEM_DECIDE_REPLAY);
    PQfinish(other);
}

/* Never seen by the store, so believed absent, but claimed by another
 * idemd (fence 7): its completion through this store is applied, not
 * refused as the completion of a missing key (the check of a row believed
 * absent and not written, ST_ABSENT); a release likewise. */
Test(store_postgres, a_row_the_store_never_saw_is_read_before_it_is_refused,
     .init = setup_postgres, .fini = teardown)
{
    PGconn *other = pg_direct();
    pg_insert_claim(other, "theirs", 1, 7, T0 + LEASE);
    pg_insert_claim(other, "released", 1, 3, T0 + LEASE);
    cr_expect_eq(complete("theirs", 7, T0 + TTL), IDEM_OK);
    cr_expect_eq(claim("theirs", 1, T0 + 1).kind, IDEM_DECIDE_REPLAY);
    idem_key_id_t id = kid("released");
    cr_expect_eq(idem_store_release(st, &id, 3), IDEM_OK);
    idem_decision_t d = claim("released", 1, T0 + 2);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    PQfinish(other);
}

/* A batch's writes travel in one flight, one transaction: a write the
 * server refuses (here a CHECK the test adds, on the second statement,
 * after the INSERT of another key ran) must leave nothing of the batch
 * committed and the connection fit for the next batch. */
Test(store_postgres, a_refused_write_commits_nothing_of_its_batch, .init = setup_postgres,
     .fini = teardown)
{
    char sql[512];
    cr_assert_eq(claim("held", 1, T0).kind, IDEM_DECIDE_CLAIM);
    PGconn *c = pg_direct();
    snprintf(sql, sizeof sql,
             "ALTER TABLE \"%s\" ADD CONSTRAINT no_second_fence CHECK (key <> 'held' OR fence < 2)",
             pg_tables[0]);
    pg_sql(c, sql);

    /* An INSERT (fresh) and, the lease over, a takeover's UPDATE (held, fence 2). */
    idem_op_t ops[2] = {claim_op("fresh", 1, T0 + LEASE), claim_op("held", 1, T0 + LEASE)};
    idem_err_t rc = idem_store_exec(st, ops, 2);
    cr_expect_neq(rc, IDEM_OK);
    cr_expect_neq(strstr(idem_store_errstr(st), "no_second_fence"), NULL, "%s",
                  idem_store_errstr(st));
    for (int i = 0; i < 2; i++)
        idem_record_cleanup(&ops[i].record);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM \"%s\" WHERE key = 'fresh'", pg_tables[0]);
    cr_expect_eq(pg_num(c, sql), 0, "the INSERT before the refused UPDATE was committed");
    snprintf(sql, sizeof sql, "SELECT fence FROM \"%s\" WHERE key = 'held'", pg_tables[0]);
    cr_expect_eq(pg_num(c, sql), 1);

    snprintf(sql, sizeof sql, "ALTER TABLE \"%s\" DROP CONSTRAINT no_second_fence",
             pg_tables[0]);
    pg_sql(c, sql);
    PQfinish(c);
    ops[0] = claim_op("fresh", 1, T0 + LEASE);
    ops[1] = claim_op("held", 1, T0 + LEASE);
    cr_assert_eq(idem_store_exec(st, ops, 2), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(ops[0].decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(ops[0].decision.fence, 1);
    cr_expect_eq(ops[1].decision.kind, IDEM_DECIDE_TAKEOVER);
    cr_expect_eq(ops[1].decision.fence, 2);
    for (int i = 0; i < 2; i++)
        idem_record_cleanup(&ops[i].record);
}

Test(store_postgres, sweep_deletes_in_bounded_batches_and_skips_locked_rows,
     .init = setup_postgres, .fini = teardown)
{
    char key[32];
    static idem_op_t ops[2510];
    for (int i = 0; i < 2510; i++) {
        snprintf(key, sizeof key, "s-%d", i);
        ops[i] = claim_op(key, 1, T0);
        ops[i].expires_at_ms = i < 2500 ? T0 + 1000 + i : T0 + TTL;
    }
    cr_assert_eq(idem_store_exec(st, ops, 2510), IDEM_OK, "%s", idem_store_errstr(st));

    /* Another transaction holds one expired row (the oldest) locked. */
    PGconn *other = pg_direct();
    char sql[256];
    pg_sql(other, "BEGIN");
    snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" WHERE key = 's-0' FOR UPDATE", pg_tables[0]);
    pg_sql(other, sql);

    size_t removed = 0;
    int64_t started = mono_now_ms();
    cr_assert_eq(idem_store_sweep(st, T0 + 1000 + 2500, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 100);
    /* Waiting for the row would last until statement_timeout (5 s) and fail. */
    cr_expect_lt(mono_now_ms() - started, 4000, "the sweep waited for the locked row");
    cr_assert_eq(idem_store_sweep(st, T0 + 1000 + 2500, 100000, &removed), IDEM_OK);
    cr_expect_eq(removed, 2399, "more than one chunk in one call");
    cr_assert_eq(idem_store_sweep(st, T0 + 1000 + 2500, 100000, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    pg_sql(other, "COMMIT");
    cr_assert_eq(idem_store_sweep(st, T0 + 1000 + 2500, 100000, &removed), IDEM_OK);
    cr_expect_eq(removed, 1, "the row is swept once it is no longer locked");
    PQfinish(other);

    /* The boundary: a record whose expires_at equals now is swept. */
    idem_op_t op = claim_op("edge", 1, T0);
    op.expires_at_ms = T0 + 5000;
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_assert_eq(idem_store_sweep(st, T0 + 4999, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    cr_assert_eq(idem_store_sweep(st, T0 + 5000, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 1);
    for (int i = 2500; i < 2510; i++) {
        idem_record_t rec;
        snprintf(key, sizeof key, "s-%d", i);
        cr_expect_eq(get(key, T0 + TTL - 1, &rec), IDEM_OK, "%s", key);
        idem_record_cleanup(&rec);
    }
}

Test(store_postgres, corrupt_value_is_corrupt_and_can_be_deleted, .init = setup_postgres,
     .fini = teardown)
{
    claim("bad", 1, T0);
    PGconn *c = pg_direct();
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE \"%s\" SET record = '\\x4944520167617262616765'::bytea WHERE key = 'bad'",
             pg_tables[0]);
    pg_sql(c, sql);
    PQfinish(c);
    idem_op_t op = claim_op("bad", 1, T0);
    cr_assert_eq(idem_store_claim(st, &op), IDEM_E_CORRUPT);
    idem_record_t rec;
    cr_expect_eq(get("bad", T0, &rec), IDEM_E_CORRUPT);
    cr_expect_eq(complete("bad", 1, T0 + TTL), IDEM_E_CORRUPT);
    idem_key_id_t id = kid("bad");
    cr_expect_eq(idem_store_renew(st, &id, 1, T0 + LEASE), IDEM_E_CORRUPT);
    cr_expect_eq(idem_store_delete(st, &id), IDEM_OK);
    cr_expect_eq(claim("bad", 1, T0).kind, IDEM_DECIDE_CLAIM);
}

/* ---- a cluster of the test's own, to stop and start ---- */

struct cluster {
    char dir[64];
    char bin[256]; /* PostgreSQL's bin directory */
    int port;
};

static void cluster_sh(const struct cluster *c, const char *what, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s%s/%s %s >>%s/sh.log 2>&1",
             geteuid() == 0 ? "runuser -u postgres -- " : "", c->bin, what, args, c->dir);
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "%s failed (%d); see %s/sh.log", cmd, rc, c->dir);
}

static void cluster_ctl(const struct cluster *c, const char *verb)
{
    char args[512];
    snprintf(args, sizeof args,
             "-D %s/data -l %s/log -w -t 60 -m fast -o '-c listen_addresses=127.0.0.1 -p %d "
             "-k %s -c fsync=off' %s",
             c->dir, c->dir, c->port, c->dir, verb);
    cluster_sh(c, "pg_ctl", args);
}

static struct cluster *live_cluster; /* stopped by cluster_teardown if a test fails */

static void cluster_init(struct cluster *c)
{
    glob_t g;
    cr_assert_eq(glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g), 0,
                 "no PostgreSQL server binaries (apt-get install postgresql)");
    snprintf(c->bin, sizeof c->bin, "%.*s", (int)(strlen(g.gl_pathv[g.gl_pathc - 1]) - 7),
             g.gl_pathv[g.gl_pathc - 1]);
    globfree(&g);
    snprintf(c->dir, sizeof c->dir, "/tmp/idem-pg-outage-XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir));
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        cr_assert_not_null(pw, "running as root needs the postgres user");
        cr_assert_eq(chown(c->dir, pw->pw_uid, pw->pw_gid), 0);
    }
    c->port = free_port();
    live_cluster = c;
    char args[256];
    snprintf(args, sizeof args, "-D %s/data -U postgres -A trust --no-sync", c->dir);
    cluster_sh(c, "initdb", args);
    cluster_ctl(c, "start");
}

static void cluster_destroy(struct cluster *c)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s%s/pg_ctl -D %s/data -m immediate -w stop >/dev/null 2>&1",
             geteuid() == 0 ? "runuser -u postgres -- " : "", c->bin, c->dir);
    if (system(cmd) != 0) {
        /* already stopped */
    }
    fx_rm_tree(c->dir);
    live_cluster = NULL;
}

/* The .fini of tests with a cluster: stop it even when an assertion failed. */
static void cluster_teardown(void)
{
    if (live_cluster != NULL)
        cluster_destroy(live_cluster);
    teardown();
}

Test(store_postgres, outage_fails_fast_and_recovers_by_itself, .fini = cluster_teardown,
     .timeout = 120)
{
    static struct cluster c; /* static: cluster_teardown may need it after a failure */
    cluster_init(&c);
    char u[256], err[256] = "";
    /* timeout=10s: a call that waited for a connect or an answer instead of
     * failing at once would take seconds, far from the bounds below. */
    snprintf(u, sizeof u, "postgres://postgres@127.0.0.1:%d/postgres?timeout=10s&pool=2",
             c.port);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_OK, "%s", err);
    cr_assert_eq(claim_on(s, "before", 1, T0).kind, IDEM_DECIDE_CLAIM);
    idem_key_id_t id = kid("before");
    cr_assert_eq(idem_store_complete(s, &id, 1, &resp, 0, T0 + TTL), IDEM_OK);
    cr_assert_eq(claim_on(s, "open", 1, T0).kind, IDEM_DECIDE_CLAIM);

    /* A restart between two calls costs no error: the stale connection
     * is replaced by a fresh one. */
    cluster_ctl(&c, "restart");
    cr_expect_eq(claim_on(s, "open", 1, T0 + 1).kind, IDEM_DECIDE_IN_FLIGHT);

    cluster_ctl(&c, "stop");
    int64_t started = mono_now_ms();
    idem_op_t op = claim_op("during", 1, T0 + 2);
    cr_expect_eq(idem_store_claim(s, &op), IDEM_E_STORE_DOWN);
    cr_expect_lt(mono_now_ms() - started, 3000);
    cr_expect_neq(idem_store_errstr(s)[0], '\0');
    /* While down, every call fails at once. */
    started = mono_now_ms();
    for (int i = 0; i < 200; i++) {
        op = claim_op("during", 1, T0 + 2);
        cr_expect_eq(idem_store_claim(s, &op), IDEM_E_STORE_DOWN);
        cr_expect_eq(op.err, IDEM_E_STORE_DOWN);
    }
    cr_expect_lt(mono_now_ms() - started, 500, "200 calls during an outage took %lld ms",
                 (long long)(mono_now_ms() - started));
    cr_expect_eq(idem_store_ping(s), IDEM_E_STORE_DOWN);
    idem_record_t rec;
    cr_expect_eq(idem_store_get(s, &id, T0, &rec), IDEM_E_STORE_DOWN);
    size_t removed;
    cr_expect_eq(idem_store_sweep(s, T0, 10, &removed), IDEM_E_STORE_DOWN);
    usleep(1500000); /* the backoff grows while the calls go on failing */
    cr_expect_eq(idem_store_ping(s), IDEM_E_STORE_DOWN);

    /* Back up: it recovers by itself within the backoff (at most 5 s). */
    cluster_ctl(&c, "start");
    started = mono_now_ms();
    while (idem_store_ping(s) != IDEM_OK && mono_now_ms() - started < 15000)
        usleep(20000);
    cr_expect_eq(idem_store_ping(s), IDEM_OK);
    /* The longest backoff (5 s), a reconnect, and 1.5 s for a busy machine. */
    cr_expect_leq(mono_now_ms() - started, 6500, "recovery took %lld ms",
                  (long long)(mono_now_ms() - started));
    /* What was written before the outage is still there. */
    op = claim_op("before", 1, T0 + 3);
    cr_assert_eq(idem_store_claim(s, &op), IDEM_OK, "%s", idem_store_errstr(s));
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_REPLAY);
    expect_resp_eq(&op.record.response, &resp);
    idem_record_cleanup(&op.record);
    cr_expect_eq(claim_on(s, "open", 1, T0 + 3).kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(claim_on(s, "during", 1, T0 + 3).kind, IDEM_DECIDE_CLAIM);
    idem_store_close(s);
    cluster_destroy(&c);
}

/* The pid of the one backend serving the store's connection (pool=1). */
static int backend_pid(PGconn *c, const char *app)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT pid FROM pg_stat_activity WHERE application_name = '%s'",
             app);
    for (int i = 0; i < 100; i++) {
        PGresult *r = pg_run(c, sql);
        int pid = PQntuples(r) == 1 ? (int)strtol(PQgetvalue(r, 0, 0), NULL, 10) : 0;
        PQclear(r);
        if (pid > 0)
            return pid;
        usleep(10000);
    }
    cr_assert_fail("no backend for application_name %s", app);
    return 0;
}

/* A server that stops answering (its backend frozen) costs a caller at most
 * timeout + 1 s, then the store is down and calls fail at once; when it
 * answers again the store recovers by itself. */
Test(store_postgres, hung_server_times_out_and_fails_fast, .fini = cluster_teardown,
     .timeout = 120)
{
    static struct cluster c; /* static: cluster_teardown may need it after a failure */
    cluster_init(&c);
    char u[256], err[256] = "", app[32];
    snprintf(app, sizeof app, "idem_hung_%d", (int)getpid());
    snprintf(u, sizeof u,
             "postgres://postgres@127.0.0.1:%d/postgres?timeout=500ms&pool=1"
             "&application_name=%s",
             c.port, app);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_OK, "%s", err);
    cr_assert_eq(claim_on(s, "k", 1, T0).kind, IDEM_DECIDE_CLAIM);

    char du[128];
    snprintf(du, sizeof du, "postgres://postgres@127.0.0.1:%d/postgres", c.port);
    PGconn *direct = PQconnectdb(du);
    cr_assert_eq(PQstatus(direct), CONNECTION_OK, "%s", PQerrorMessage(direct));
    int pid = backend_pid(direct, app);
    cr_assert_eq(kill(pid, SIGSTOP), 0);

    int64_t started = mono_now_ms();
    idem_op_t op = claim_op("k", 1, T0 + 1);
    cr_expect_eq(idem_store_claim(s, &op), IDEM_E_STORE_DOWN);
    int64_t took = mono_now_ms() - started;
    cr_expect(took >= 1400 && took < 3000, "a hung server cost %lld ms", (long long)took);
    cr_expect(strstr(idem_store_errstr(s), "no answer") != NULL, "errstr: %s",
              idem_store_errstr(s));
    started = mono_now_ms();
    cr_expect_eq(idem_store_ping(s), IDEM_E_STORE_DOWN);
    /* At once: not the 1.5 s deadline of a call that waits for the server
     * (50 ms was within reach of a preempted thread on a busy machine). */
    cr_expect_lt(mono_now_ms() - started, 750, "in backoff a call must fail at once");

    kill(pid, SIGCONT);
    started = mono_now_ms();
    while (idem_store_ping(s) != IDEM_OK && mono_now_ms() - started < 10000)
        usleep(20000);
    cr_expect_eq(idem_store_ping(s), IDEM_OK);
    cr_expect_eq(claim_on(s, "k", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
    PQfinish(direct);
    idem_store_close(s);
    cluster_destroy(&c);
}

/* Wait until a session that blocker blocks waits for a lock (pg_blocking_pids:
 * precise, whatever other tests run on the server meanwhile). */
static void wait_for_blocked_by(PGconn *watch, PGconn *blocker, const char *what)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE %d = ANY (pg_blocking_pids(pid))",
             PQbackendPID(blocker));
    for (int i = 0; i < 3000; i++) { /* 30 s: a busy machine, not a lost wait */
        if (pg_num(watch, sql) > 0)
            return;
        usleep(10000);
    }
    cr_assert_fail("%s never waited for a lock", what);
}

/* Wait until the session of c waits for a lock. */
static void wait_until_blocked(PGconn *watch, PGconn *c, const char *what)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT cardinality(pg_blocking_pids(%d))", PQbackendPID(c));
    for (int i = 0; i < 3000; i++) {
        if (pg_num(watch, sql) > 0)
            return;
        usleep(10000);
    }
    cr_assert_fail("%s never waited for a lock", what);
}

/* A deadlock with another transaction: PostgreSQL aborts the store's batch
 * (40P01), which runs again and succeeds once the other transaction is
 * through, applied once.
 *
 * Which side PostgreSQL aborts is not left to the timing.  A waiting backend
 * runs the deadlock check once, deadlock_timeout after it began to wait, and
 * the one that finds the cycle aborts itself.  So: the other transaction
 * never checks (deadlock_timeout of an hour on its session), and the
 * store's batch is the one that closes the cycle, so that its check (the
 * server's deadlock_timeout, 1 s, after its last wait began) cannot run
 * before the cycle exists:
 *   other holds c, third holds b;
 *   the store's batch (a, b, c, locked in that order) locks a, waits for b;
 *   other asks for a: it waits for the store (seen before going on);
 *   third commits: the store locks b and waits for c: the cycle.
 * The other's lock on a is granted only when the store's transaction ends,
 * and that transaction cannot commit while other holds c: so other's query
 * succeeding and the batch answering OK means the batch was aborted and run
 * again.  Without the retry the batch fails with 40P01; with a retry that
 * keeps the aborted attempt's decisions or applies twice, the fences are not
 * 2. */
Test(store_postgres, deadlocked_batch_runs_again, .init = setup_postgres, .fini = teardown,
     .timeout = 120)
{
    const char *keys[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(claim(keys[i], 1, T0).kind, IDEM_DECIDE_CLAIM);
    PGconn *other = pg_direct(), *third = pg_direct(), *watch = pg_direct();
    char sql[256];
    pg_sql(other, "SET deadlock_timeout = '1h'");
    pg_sql(other, "BEGIN");
    snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" WHERE key = 'c' FOR UPDATE", pg_tables[0]);
    pg_sql(other, sql);
    pg_sql(third, "BEGIN");
    snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" WHERE key = 'b' FOR UPDATE", pg_tables[0]);
    pg_sql(third, sql);

    /* Takeovers (the leases ran out): each writes the record, fence 2. */
    struct pg_claimer cl = {
        {claim_op("a", 1, T0 + LEASE), claim_op("b", 1, T0 + LEASE),
         claim_op("c", 1, T0 + LEASE)},
        3, IDEM_OK, ""};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pg_claimer_main, &cl), 0);
    wait_for_blocked_by(watch, third, "the store's batch (on b)");
    snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" WHERE key = 'a' FOR UPDATE", pg_tables[0]);
    cr_assert_eq(PQsendQuery(other, sql), 1);
    wait_until_blocked(watch, other, "the other transaction (on a)");
    pg_sql(third, "COMMIT");

    /* Returns once the store's transaction is gone: aborted by the check. */
    PGresult *r;
    char failed[512] = "";
    while ((r = PQgetResult(other)) != NULL) {
        if (PQresultStatus(r) == PGRES_FATAL_ERROR)
            snprintf(failed, sizeof failed, "%s", PQresultErrorMessage(r));
        PQclear(r);
    }
    cr_expect_str_empty(failed, "PostgreSQL aborted the other transaction: %s", failed);
    pg_sql(other, "COMMIT");
    pthread_join(t, NULL);
    cr_assert_eq(cl.rc, IDEM_OK, "%s", cl.err);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(cl.ops[i].err, IDEM_OK, "%s", keys[i]);
        cr_expect_eq(cl.ops[i].decision.kind, IDEM_DECIDE_TAKEOVER, "%s", keys[i]);
        cr_expect_eq(cl.ops[i].decision.fence, 2, "%s", keys[i]);
        idem_record_t rec;
        cr_assert_eq(get(keys[i], T0 + LEASE + 1, &rec), IDEM_OK, "%s", keys[i]);
        cr_expect_eq(rec.fence, 2, "%s", keys[i]);
        cr_expect_eq(rec.lease_until_ms, T0 + LEASE + LEASE, "%s", keys[i]);
        idem_record_cleanup(&rec);
    }
    PQfinish(other);
    PQfinish(third);
    PQfinish(watch);
}

/* A lock held longer than timeout on a row the batch writes: the batch
 * fails (statement_timeout) but the store is not down, and the next batch
 * works at once.  (Reading takes no lock: a batch that only reads the
 * locked row answers from its last committed version.) */
Test(store_postgres, lock_held_past_the_timeout_fails_the_batch_alone, .init = setup_postgres,
     .fini = teardown)
{
    claim("a", 1, T0);
    idem_store_t *s;
    char u[512], err[256] = "";
    snprintf(u, sizeof u, "%s&timeout=200ms", url);
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_OK, "%s", err);
    PGconn *other = pg_direct();
    char sql[256];
    pg_sql(other, "BEGIN");
    snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" WHERE key = 'a' FOR UPDATE", pg_tables[0]);
    pg_sql(other, sql);
    int64_t started = mono_now_ms();
    idem_op_t op = claim_op("a", 1, T0 + 1);
    cr_expect_eq(idem_store_claim(s, &op), IDEM_OK, "%s", idem_store_errstr(s));
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_IN_FLIGHT);
    idem_record_cleanup(&op.record);
    started = mono_now_ms();
    op = claim_op("a", 1, T0 + LEASE); /* a takeover: writes the row */
    cr_expect_eq(idem_store_claim(s, &op), IDEM_E_STORE_DOWN);
    /* 57014 is what shows the server's statement_timeout ended it (the
     * client's deadline, 1.2 s, says "no answer"); the time only has to
     * show the lock was not waited for. */
    cr_expect_lt(mono_now_ms() - started, 3000);
    cr_expect(strstr(idem_store_errstr(s), "57014") != NULL, "errstr: %s",
              idem_store_errstr(s));
    pg_sql(other, "COMMIT");
    cr_expect_eq(claim_on(s, "a", 1, T0 + 2).kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(claim_on(s, "new", 1, T0 + 2).kind, IDEM_DECIDE_CLAIM);
    PQfinish(other);
    idem_store_close(s);
}

struct pool_watch {
    const char *app;
    atomic_int stop;
    int most; /* the most connections seen at once */
};

static void *pool_watch_main(void *arg)
{
    struct pool_watch *w = arg;
    PGconn *c = PQconnectdb(getenv("IDEM_TEST_PG_URL"));
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'", w->app);
    while (PQstatus(c) == CONNECTION_OK && !atomic_load(&w->stop)) {
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            int n = (int)strtol(PQgetvalue(r, 0, 0), NULL, 10);
            if (n > w->most)
                w->most = n;
        }
        PQclear(r);
        usleep(2000);
    }
    PQfinish(c);
    return NULL;
}

static void *pool_claims_main(void *arg)
{
    idem_store_t *s = arg;
    char key[32];
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof key, "p-%lx-%d", (unsigned long)pthread_self(), i);
        idem_op_t op = claim_op(key, 1, T0);
        if (idem_store_claim(s, &op) != IDEM_OK)
            return (void *)1;
    }
    return NULL;
}

Test(store_postgres, pool_bounds_the_connections, .init = setup_postgres, .fini = teardown)
{
    char u[512], err[256] = "", app[48];
    snprintf(app, sizeof app, "idem_pool_%d", (int)getpid());
    snprintf(u, sizeof u, "%s&pool=2&application_name=%s", url, app);
    idem_store_t *s;
    cr_assert_eq(idem_store_open(u, &s, err, sizeof err), IDEM_OK, "%s", err);
    struct pool_watch w = {.app = app};
    pthread_t wt, t[8];
    cr_assert_eq(pthread_create(&wt, NULL, pool_watch_main, &w), 0);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, pool_claims_main, s), 0);
    for (int i = 0; i < 8; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_expect_null(ret);
    }
    atomic_store(&w.stop, 1);
    pthread_join(wt, NULL);
    cr_expect_eq(w.most, 2, "at most %d connections at once", w.most);
    idem_store_close(s);
}
