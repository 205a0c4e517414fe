/* tests/tx/test_dedup_tx.c - message de-duplication in the caller's own
 * transaction, on SQLite and PostgreSQL (tx_fixture.h).  The effect of
 * applying a message is a row of the test's business table, written in the
 * same transaction as the mark.
 */
#include "idem/dedup.h"
#include "tx_fixture.h"

#define T0 1700000000000ll
#define RETAIN (7ll * 86400000)

static idem_dedup_claim_t dbegin(idem_tx_t *tx, const char *ns, const char *id, int64_t now)
{
    idem_dedup_claim_t c;
    idem_err_t rc = idem_dedup_tx_begin(tx, ns, id, strlen(id), now, &c);
    cr_assert_eq(rc, IDEM_OK, "begin %s/%s: %s %s", ns, id, idem_err_name(rc),
                 idem_tx_errstr(tx));
    return c;
}

static void apply(tconn_t *c, const char *id)
{
    tconn_sql(c, "INSERT INTO \"%s\" VALUES ('%s', 'consumer')", biz, id);
}

static long long applied(const char *id)
{
    return tconn_num(&C, "SELECT count(*) FROM \"%s\" WHERE k = '%s'", biz, id);
}

TX_CASE(dedup_tx, new_then_commit_then_duplicate)
{
    cr_assert(tconn_begin(&C));
    idem_dedup_claim_t c = dbegin(T, "orders.v1", "msg-1", T0);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_assert_eq(c.fence, 1);
    apply(&C, "msg-1");
    cr_assert_eq(idem_dedup_tx_done(T, "orders.v1", "msg-1", 5, c.fence, T0, RETAIN), IDEM_OK,
                 "%s", idem_tx_errstr(T));
    cr_assert(tconn_commit(&C));

    /* Redelivered later, even after the in-transaction lease. */
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "orders.v1", "msg-1", T0 + 3600000);
    cr_expect_eq(c.verdict, IDEM_DEDUP_DUPLICATE);
    cr_expect_eq(c.fence, 0);
    tconn_rollback(&C);
    cr_expect_eq(applied("msg-1"), 1);
    /* The record is (scope "dedup:" ns, key id), completed, kept for the retention. */
    cr_expect_eq(tconn_num(&C, "SELECT count(*) FROM \"%s\" WHERE scope = 'dedup:orders.v1' AND "
                               "key = 'msg-1' AND state = 'completed' AND expires_at = %lld",
                           table, T0 + RETAIN), 1);
    /* Another namespace is another id. */
    cr_assert(tconn_begin(&C));
    cr_expect_eq(dbegin(T, "orders.v2", "msg-1", T0).verdict, IDEM_DEDUP_NEW);
    tconn_rollback(&C);
    /* Past the retention it is new again. */
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "orders.v1", "msg-1", T0 + RETAIN);
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_expect_eq(c.fence, 2);
    tconn_rollback(&C);
}

TX_CASE(dedup_tx, new_then_rollback_is_new_again)
{
    cr_assert(tconn_begin(&C));
    idem_dedup_claim_t c = dbegin(T, "q", "m", T0);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    apply(&C, "m");
    cr_assert_eq(idem_dedup_tx_done(T, "q", "m", 1, c.fence, T0, RETAIN), IDEM_OK);
    tconn_rollback(&C); /* the effect failed: nothing happened */
    cr_expect_eq(applied("m"), 0);
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "q", "m", T0 + 1);
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_expect_eq(c.fence, 1);
    tconn_rollback(&C);
}

TX_CASE(dedup_tx, a_commit_without_done_holds_the_id_for_the_lease)
{
    cr_assert(tconn_begin(&C));
    idem_dedup_claim_t c = dbegin(T, "q", "m", T0);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_assert(tconn_commit(&C));
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "q", "m", T0 + 1000);
    cr_expect_eq(c.verdict, IDEM_DEDUP_IN_PROGRESS);
    cr_expect_eq(c.retry_after_ms, (IDEM_DEDUP_TX_LEASE_MS - 1000) / 1000 * 1000);
    tconn_rollback(&C);
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "q", "m", T0 + IDEM_DEDUP_TX_LEASE_MS);
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_expect_eq(c.fence, 2);
    cr_expect_eq(idem_dedup_tx_done(T, "q", "m", 1, 1, T0, RETAIN), IDEM_E_FENCE);
    cr_expect_eq(idem_dedup_tx_done(T, "q", "m", 1, 2, T0, RETAIN), IDEM_OK);
    cr_assert(tconn_commit(&C));
}

TX_CASE(dedup_tx, bad_namespaces_and_ids_are_inval)
{
    idem_dedup_claim_t c;
    char ns_long[IDEM_DEDUP_NS_MAX + 2];
    memset(ns_long, 'n', sizeof ns_long - 1);
    ns_long[sizeof ns_long - 1] = '\0';
    const char *bad_ns[] = {"", "a b", "a/b", "a:b", "ü", ns_long};
    for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0]; i++) {
        cr_expect_eq(idem_dedup_tx_begin(T, bad_ns[i], "m", 1, T0, &c), IDEM_E_INVAL, "%s",
                     bad_ns[i]);
        cr_expect_eq(idem_dedup_tx_done(T, bad_ns[i], "m", 1, 1, T0, RETAIN), IDEM_E_INVAL);
    }
    ns_long[IDEM_DEDUP_NS_MAX] = '\0'; /* exactly the limit */
    cr_assert(tconn_begin(&C));
    cr_expect_eq(dbegin(T, ns_long, "m", T0).verdict, IDEM_DEDUP_NEW);
    tconn_rollback(&C);
    char id[IDEM_KEY_MAX + 1];
    memset(id, 'i', sizeof id);
    cr_expect_eq(idem_dedup_tx_begin(T, "q", id, IDEM_KEY_MAX + 1, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(T, "q", id, 0, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(T, "q", "a\0b", 3, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(T, "q", NULL, 1, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(T, NULL, "m", 1, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(T, "q", "m", 1, T0, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_begin(NULL, "q", "m", 1, T0, &c), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_done(T, "q", "m", 1, 1, T0, 0), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_tx_done(T, "q", "m", 1, 1, INT64_MAX - 5, 10), IDEM_E_INVAL);
    /* A binary id of the full length is fine (not NUL-terminated). */
    id[0] = '\x01';
    cr_assert(tconn_begin(&C));
    c = dbegin(T, "q", "x", T0); /* sanity */
    cr_expect_eq(idem_dedup_tx_begin(T, "q", id, IDEM_KEY_MAX, T0, &c), IDEM_OK,
                 "%s", idem_tx_errstr(T));
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    tconn_rollback(&C);
    /* Bytes that are not UTF-8: PostgreSQL's TEXT cannot hold them, so no
     * form takes them (an id means the same everywhere). */
    cr_assert(tconn_begin(&C));
    idem_err_t rc = idem_dedup_tx_begin(T, "q", "\xff\xfe", 2, T0, &c);
    cr_expect_eq(rc, IDEM_E_INVAL, "%s", idem_err_name(rc));
    tconn_rollback(&C);
}

TX_CASE(dedup_tx, a_foreign_record_under_the_id_is_corrupt)
{
    /* An idem_tx key with a real fingerprint written under a dedup scope. */
    idem_key_id_t kid;
    memset(&kid, 0, sizeof kid);
    snprintf(kid.scope, sizeof kid.scope, "dedup:q");
    snprintf(kid.key, sizeof kid.key, "m");
    uint8_t fp[IDEM_FP_LEN];
    memset(fp, 7, sizeof fp);
    idem_tx_begin_t b;
    cr_assert_eq(idem_tx_begin(T, &kid, fp, T0, T0 + 1000, T0 + 1000, &b), IDEM_OK);
    idem_dedup_claim_t c;
    cr_expect_eq(idem_dedup_tx_begin(T, "q", "m", 1, T0, &c), IDEM_E_CORRUPT);
    cr_expect_eq(c.verdict, 0);
}

/* PostgreSQL: an id another open transaction is applying is IN_PROGRESS. */
Test(dedup_tx_postgres, an_id_held_by_an_open_transaction_is_in_progress, .init = setup_pg,
     .fini = teardown)
{
    tconn_t c2;
    tconn_open(&c2);
    idem_tx_t *t2 = tconn_tx(&c2);
    cr_assert(tconn_begin(&C));
    idem_dedup_claim_t c = dbegin(T, "q", "m", T0);
    cr_assert_eq(c.verdict, IDEM_DEDUP_NEW);
    apply(&C, "m");
    cr_assert(tconn_begin(&c2));
    idem_dedup_claim_t c2c = dbegin(t2, "q", "m", T0);
    cr_expect_eq(c2c.verdict, IDEM_DEDUP_IN_PROGRESS);
    cr_expect_eq(c2c.retry_after_ms, 1000);
    tconn_rollback(&c2);
    cr_assert_eq(idem_dedup_tx_done(T, "q", "m", 1, c.fence, T0, RETAIN), IDEM_OK);
    cr_assert(tconn_commit(&C));
    cr_assert(tconn_begin(&c2));
    cr_expect_eq(dbegin(t2, "q", "m", T0 + 1).verdict, IDEM_DEDUP_DUPLICATE);
    tconn_rollback(&c2);
    cr_expect_eq(applied("m"), 1);
    idem_tx_free(t2);
    tconn_close(&c2);
}
