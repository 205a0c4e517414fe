/* tests/store/test_dedup.c - message de-duplication on a store, on every
 * backend (src/store/dedup.c: idem_dedup_begin, _done, _abandon).
 *
 * Each BACKEND_CASE runs against memory:, lmdb:, Redis and PostgreSQL
 * (store_fixture.h), with time passed explicitly from T0.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "idem/dedup.h"
#include "store_fixture.h"

#define LEASE 30000ll
#define RETENTION 3600000ll

static idem_dedup_claim_t begin(const char *ns, const char *id, int64_t now)
{
    idem_dedup_claim_t c;
    memset(&c, 0x5a, sizeof c);
    idem_err_t rc = idem_dedup_begin(st, ns, id, strlen(id), now, LEASE, &c);
    cr_assert_eq(rc, IDEM_OK, "begin %s/%s: %s (%s)", ns, id, idem_err_name(rc),
                 idem_store_errstr(st));
    return c;
}

static uint64_t expect_new(const char *ns, const char *id, int64_t now)
{
    idem_dedup_claim_t c = begin(ns, id, now);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW, "%s/%s", ns, id);
    cr_assert_geq(c.fence, 1);
    cr_assert_eq(c.retry_after_ms, 0);
    return c.fence;
}

static void expect_duplicate(const char *ns, const char *id, int64_t now)
{
    idem_dedup_claim_t c = begin(ns, id, now);
    cr_assert_eq(c.verdict, IDEM_DEDUP_DUPLICATE, "%s/%s", ns, id);
    cr_assert_eq(c.fence, 0);
    cr_assert_eq(c.retry_after_ms, 0);
}

static void expect_in_progress(const char *ns, const char *id, int64_t now, int64_t retry)
{
    idem_dedup_claim_t c = begin(ns, id, now);
    cr_assert_eq(c.verdict, IDEM_DEDUP_IN_PROGRESS, "%s/%s", ns, id);
    cr_assert_eq(c.fence, 0);
    cr_assert_eq(c.retry_after_ms, retry);
}

static idem_err_t done(const char *ns, const char *id, uint64_t fence, int64_t now)
{
    return idem_dedup_done(st, ns, id, strlen(id), fence, now, RETENTION);
}

BACKEND_CASE(dedup, new_then_done_then_duplicate)
{
    uint64_t f = expect_new("orders", "msg-1", T0);
    cr_assert_eq(f, 1);
    cr_assert_eq(done("orders", "msg-1", f, T0 + 10), IDEM_OK);
    expect_duplicate("orders", "msg-1", T0 + 20);
    expect_duplicate("orders", "msg-1", T0 + RETENTION); /* the last ms is still kept */
    /* done twice is refused: the claim is over. */
    cr_assert_eq(done("orders", "msg-1", f, T0 + 30), IDEM_E_FENCE);
    /* Another id, and the same id in another namespace, are new. */
    cr_assert_eq(expect_new("orders", "msg-2", T0), 1);
    cr_assert_eq(expect_new("payments", "msg-1", T0), 1);
}

BACKEND_CASE(dedup, in_progress_while_another_consumer_holds_it)
{
    uint64_t f = expect_new("q", "m", T0);
    expect_in_progress("q", "m", T0, LEASE);
    expect_in_progress("q", "m", T0 + LEASE - 1, 1);
    cr_assert_eq(done("q", "m", f, T0 + 100), IDEM_OK);
    expect_duplicate("q", "m", T0 + 200);
}

BACKEND_CASE(dedup, abandon_makes_a_redelivery_new_again)
{
    uint64_t f1 = expect_new("q", "m", T0);
    cr_assert_eq(idem_dedup_abandon(st, "q", "m", 1, f1), IDEM_OK);
    uint64_t f2 = expect_new("q", "m", T0 + 1);
    cr_assert_gt(f2, f1, "the fence goes on growing after an abandon");
    /* The abandoned claim's fence can neither finish nor abandon it now. */
    cr_assert_eq(done("q", "m", f1, T0 + 2), IDEM_E_FENCE);
    cr_assert_eq(idem_dedup_abandon(st, "q", "m", 1, f1), IDEM_E_FENCE);
    expect_in_progress("q", "m", T0 + 2, LEASE - 1);
    cr_assert_eq(done("q", "m", f2, T0 + 3), IDEM_OK);
    expect_duplicate("q", "m", T0 + 4);
    /* A done id cannot be abandoned. */
    cr_assert_eq(idem_dedup_abandon(st, "q", "m", 1, f2), IDEM_E_FENCE);
    expect_duplicate("q", "m", T0 + 5);
}

BACKEND_CASE(dedup, a_crashed_consumers_claim_is_taken_over_after_its_lease)
{
    uint64_t f1 = expect_new("q", "crash", T0); /* consumer 1 dies before done */
    expect_in_progress("q", "crash", T0 + LEASE - 1, 1);
    uint64_t f2 = expect_new("q", "crash", T0 + LEASE);
    cr_assert_eq(f2, f1 + 1);
    /* Consumer 1 was only stalled: its late done is refused. */
    cr_assert_eq(done("q", "crash", f1, T0 + LEASE + 1), IDEM_E_FENCE);
    expect_in_progress("q", "crash", T0 + LEASE + 1, LEASE - 1);
    cr_assert_eq(done("q", "crash", f2, T0 + LEASE + 2), IDEM_OK);
    expect_duplicate("q", "crash", T0 + LEASE + 3);
}

BACKEND_CASE(dedup, an_id_is_new_again_after_its_retention)
{
    uint64_t f = expect_new("q", "old", T0);
    cr_assert_eq(done("q", "old", f, T0), IDEM_OK);
    expect_duplicate("q", "old", T0 + RETENTION - 1);
    uint64_t f2 = expect_new("q", "old", T0 + RETENTION);
    cr_assert_eq(done("q", "old", f2, T0 + RETENTION), IDEM_OK);
    expect_duplicate("q", "old", T0 + RETENTION + 1);
}

BACKEND_CASE(dedup, ids_are_bytes_counted_by_length)
{
    /* Not NUL-terminated at id_len: only the first id_len bytes count. */
    idem_dedup_claim_t c;
    cr_assert_eq(idem_dedup_begin(st, "q", "abcdef", 3, T0, LEASE, &c), IDEM_OK);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_assert_eq(idem_dedup_done(st, "q", "abcXYZ", 3, c.fence, T0, RETENTION), IDEM_OK);
    expect_duplicate("q", "abc", T0 + 1);
    expect_new("q", "abcdef", T0 + 1);

    /* UTF-8, spaces, control characters, ':' and the longest id and namespace
     * are stored by every backend. */
    const char *ids[] = {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "a b:c", "\x01tok:x",
                         "tab\tnl\n", "dedup:q:x"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        uint64_t f = expect_new("q", ids[i], T0);
        cr_assert_eq(done("q", ids[i], f, T0), IDEM_OK, "id %zu", i);
        expect_duplicate("q", ids[i], T0 + 1);
    }
    char longest[IDEM_KEY_MAX + 1], ns[IDEM_DEDUP_NS_MAX + 1];
    memset(longest, 'i', IDEM_KEY_MAX);
    longest[IDEM_KEY_MAX] = '\0';
    memset(ns, 'N', IDEM_DEDUP_NS_MAX);
    ns[IDEM_DEDUP_NS_MAX] = '\0';
    uint64_t f = expect_new(ns, longest, T0);
    cr_assert_eq(done(ns, longest, f, T0), IDEM_OK);
    expect_duplicate(ns, longest, T0 + 1);
    expect_new("A-z_0.9", "x", T0);
}

BACKEND_CASE(dedup, bad_namespaces_ids_and_limits_are_inval)
{
    idem_dedup_claim_t c;
    char long_ns[IDEM_DEDUP_NS_MAX + 2], long_id[IDEM_KEY_MAX + 1];
    memset(long_ns, 'n', sizeof long_ns - 1);
    long_ns[IDEM_DEDUP_NS_MAX + 1] = '\0';
    memset(long_id, 'i', sizeof long_id);

    const char *bad_ns[] = {"", "a:b", "a b", "a/b", "caf\xc3\xa9", "\x01", long_ns, NULL};
    for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0]; i++) {
        memset(&c, 0x5a, sizeof c);
        cr_expect_eq(idem_dedup_begin(st, bad_ns[i], "m", 1, T0, LEASE, &c), IDEM_E_INVAL,
                     "ns %zu", i);
        cr_expect_eq(c.verdict, 0);
        cr_expect_eq(c.fence, 0);
        cr_expect_eq(c.retry_after_ms, 0);
        cr_expect_eq(idem_dedup_done(st, bad_ns[i], "m", 1, 1, T0, RETENTION), IDEM_E_INVAL);
        cr_expect_eq(idem_dedup_abandon(st, bad_ns[i], "m", 1, 1), IDEM_E_INVAL);
    }

    struct {
        const char *id;
        size_t len;
    } bad_id[] = {
        {"", 0},               /* empty */
        {NULL, 1},             /* no id */
        {long_id, IDEM_KEY_MAX + 1}, /* too long */
        {"a\0b", 3},           /* NUL inside */
        {"\xff", 1},           /* never UTF-8 */
        {"\xc0\x80", 2},       /* overlong NUL */
        {"\xe0\x80\xaf", 3},   /* overlong '/' */
        {"\xed\xa0\x80", 3},   /* a surrogate */
        {"\xf4\x90\x80\x80", 4}, /* above U+10FFFF */
        {"ab\xc3", 3},         /* cut short */
        {"\x80", 1},           /* a lone continuation byte */
    };
    for (size_t i = 0; i < sizeof bad_id / sizeof bad_id[0]; i++) {
        cr_expect_eq(idem_dedup_begin(st, "q", bad_id[i].id, bad_id[i].len, T0, LEASE, &c),
                     IDEM_E_INVAL, "id %zu", i);
        cr_expect_eq(idem_dedup_done(st, "q", bad_id[i].id, bad_id[i].len, 1, T0, RETENTION),
                     IDEM_E_INVAL, "id %zu", i);
        cr_expect_eq(idem_dedup_abandon(st, "q", bad_id[i].id, bad_id[i].len, 1), IDEM_E_INVAL,
                     "id %zu", i);
    }

    cr_expect_eq(idem_dedup_begin(st, "q", "m", 1, T0, 0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_begin(st, "q", "m", 1, T0, 86400001, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_begin(st, "q", "m", 1, -1, LEASE, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_begin(NULL, "q", "m", 1, T0, LEASE, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_begin(st, "q", "m", 1, T0, LEASE, NULL), IDEM_E_INVAL);

    /* None of the above wrote anything. */
    uint64_t f = expect_new("q", "m", T0);
    cr_assert_eq(f, 1);
    cr_expect_eq(idem_dedup_done(st, "q", "m", 1, f, T0, 0), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_done(st, "q", "m", 1, f, T0, 315360000001ll), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_done(st, "q", "m", 1, 0, T0, RETENTION), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_done(st, "q", "m", 1, f, -1, RETENTION), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_done(NULL, "q", "m", 1, f, T0, RETENTION), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_abandon(st, "q", "m", 1, 0), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_abandon(NULL, "q", "m", 1, f), IDEM_E_INVAL);
    expect_in_progress("q", "m", T0, LEASE);
    cr_assert_eq(done("q", "m", f, T0), IDEM_OK);
}

BACKEND_CASE(dedup, a_record_of_something_else_is_corrupt)
{
    idem_op_t op = {.id = {.scope = "dedup:q", .key = "foreign"}};
    op.fp[3] = 7;
    fx_claim_at_t0(&op, LEASE, RETENTION);
    idem_dedup_claim_t c;
    cr_assert_eq(idem_dedup_begin(st, "q", "foreign", 7, T0 + 1, LEASE, &c), IDEM_E_CORRUPT);
    cr_assert_eq(c.verdict, 0);
}

/* ---- racing consumers --------------------------------------------------------- */

#define CONSUMERS 8
#define RACE_IDS 20

static pthread_barrier_t race_go;
static atomic_int race_new[RACE_IDS], race_busy[RACE_IDS], race_errors;

static void *consumer(void *arg)
{
    (void)arg;
    for (int i = 0; i < RACE_IDS; i++) {
        char id[32];
        snprintf(id, sizeof id, "race-%d", i);
        pthread_barrier_wait(&race_go);
        idem_dedup_claim_t c;
        idem_err_t rc = idem_dedup_begin(st, "race", id, strlen(id), T0, LEASE, &c);
        if (rc != IDEM_OK)
            atomic_fetch_add(&race_errors, 1);
        else if (c.verdict == IDEM_DEDUP_NEW)
            atomic_fetch_add(&race_new[i], c.fence == 1 ? 1 : 100);
        else if (c.verdict == IDEM_DEDUP_IN_PROGRESS && c.retry_after_ms == LEASE)
            atomic_fetch_add(&race_busy[i], 1);
        else
            atomic_fetch_add(&race_errors, 1);
    }
    return NULL;
}

BACKEND_CASE(dedup, racing_consumers_get_exactly_one_new)
{
    pthread_barrier_init(&race_go, NULL, CONSUMERS);
    fx_run_threads(CONSUMERS, consumer);
    pthread_barrier_destroy(&race_go);
    cr_assert_eq(atomic_load(&race_errors), 0);
    for (int i = 0; i < RACE_IDS; i++) {
        cr_expect_eq(atomic_load(&race_new[i]), 1, "id %d", i);
        cr_expect_eq(atomic_load(&race_busy[i]), CONSUMERS - 1, "id %d", i);
    }
}

Test(dedup, begin_out_of_memory_is_nomem_and_claims_nothing)
{
    idem_store_t *s = NULL;
    cr_assert_eq(idem_store_open("memory:", &s, NULL, 0), IDEM_OK);
    idem_dedup_claim_t c;
    idem_err_t rc = IDEM_E_NOMEM;
    long n;
    for (n = 1; n < 50 && rc == IDEM_E_NOMEM; n++) {
        idem_alloc_fail_after(n);
        rc = idem_dedup_begin(s, "q", "m", 1, 1000, 100, &c);
        idem_alloc_fail_after(0);
        if (rc == IDEM_E_NOMEM)
            cr_assert_eq(c.verdict, 0);
    }
    cr_assert_eq(rc, IDEM_OK);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_assert_eq(c.fence, 1, "a failed begin claimed nothing");
    idem_store_close(s);
}
