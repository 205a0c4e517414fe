/* tests/tx/test_tx.c - key records in the caller's own transaction.
 *
 * Every TX_CASE runs twice: on a SQLite file and on the PostgreSQL of
 * IDEM_TEST_PG_URL (tx_fixture.h).  Time is passed to every call, so leases
 * and retentions run out without sleeping.  The race tests use two real
 * connections in two threads.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "tx_fixture.h"

#define T0 1700000000000ll
#define LEASE 30000ll
#define TTL 86400000ll

static void fp_of(uint8_t fp[IDEM_FP_LEN], int n)
{
    memset(fp, 0, IDEM_FP_LEN);
    fp[0] = (uint8_t)n;
    fp[31] = 0xa5;
}

static idem_key_id_t kid(const char *key)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "anonymous");
    snprintf(id.key, sizeof id.key, "%s", key);
    return id;
}

static idem_tx_begin_t begin_on(idem_tx_t *tx, const char *key, int fpn, int64_t now)
{
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, fpn);
    idem_key_id_t id = kid(key);
    idem_tx_begin_t b;
    idem_err_t rc = idem_tx_begin(tx, &id, fp, now, now + LEASE, now + TTL, &b);
    cr_assert_eq(rc, IDEM_OK, "begin %s: %s %s", key, idem_err_name(rc), idem_tx_errstr(tx));
    return b;
}

static const idem_header_t HDRS[2] = {
    {"content-type", 12, "application/json", 16},
    {"x-empty", 7, "", 0},
};

static idem_response_t resp(const char *body)
{
    return (idem_response_t){.status = 201, .headers = HDRS, .n_headers = 2,
                             .body = (const uint8_t *)body, .body_len = strlen(body)};
}

static void complete_on(idem_tx_t *tx, const char *key, uint64_t fence, const char *body,
                        int64_t expires)
{
    idem_key_id_t id = kid(key);
    idem_response_t r = resp(body);
    idem_err_t rc = idem_tx_complete(tx, &id, fence, &r, 0, expires);
    cr_assert_eq(rc, IDEM_OK, "complete %s: %s %s", key, idem_err_name(rc), idem_tx_errstr(tx));
}

static void expect_response(const idem_record_t *rec, const char *body)
{
    cr_assert_eq(rec->state, IDEM_STATE_COMPLETED);
    cr_expect_eq(rec->response.status, 201);
    cr_assert_eq(rec->response.n_headers, 2);
    for (size_t i = 0; i < 2; i++) {
        cr_expect_eq(rec->response.headers[i].name_len, HDRS[i].name_len);
        cr_expect_eq(memcmp(rec->response.headers[i].name, HDRS[i].name, HDRS[i].name_len), 0);
        cr_expect_eq(rec->response.headers[i].value_len, HDRS[i].value_len);
        if (HDRS[i].value_len > 0)
            cr_expect_eq(memcmp(rec->response.headers[i].value, HDRS[i].value,
                                HDRS[i].value_len), 0);
    }
    cr_assert_eq(rec->response.body_len, strlen(body));
    cr_expect_eq(memcmp(rec->response.body, body, strlen(body)), 0);
}

static long long biz_rows(const char *key)
{
    return tconn_num(&C, "SELECT count(*) FROM \"%s\" WHERE k = '%s'", biz, key);
}

/* ---- the key's life ---------------------------------------------------- */

TX_CASE(tx, new_complete_commit_replays_the_exact_response)
{
    cr_assert(tconn_begin(&C));
    idem_tx_begin_t b = begin_on(T, "k1", 1, T0);
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert_eq(b.decision.fence, 1);
    tconn_sql(&C, "INSERT INTO \"%s\" VALUES ('k1', 'me')", biz);
    complete_on(T, "k1", 1, "{\"id\":42}", T0 + TTL);
    cr_assert(tconn_commit(&C));

    cr_assert(tconn_begin(&C));
    b = begin_on(T, "k1", 1, T0 + 1000);
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_REPLAY, "%s", idem_decision_name(b.decision.kind));
    cr_expect_eq(b.decision.fence, 1);
    expect_response(&b.record, "{\"id\":42}");
    idem_record_cleanup(&b.record);
    tconn_rollback(&C);

    idem_key_id_t id = kid("k1");
    idem_record_t rec;
    cr_assert_eq(idem_tx_get(T, &id, T0 + 1000, &rec), IDEM_OK);
    expect_response(&rec, "{\"id\":42}");
    idem_record_cleanup(&rec);
    cr_expect_eq(biz_rows("k1"), 1);
    cr_expect_eq(tconn_num(&C, "SELECT count(*) FROM \"%s\" WHERE state = 'completed' AND "
                               "fence = 1 AND expires_at = %lld", table, T0 + TTL), 1);
}

TX_CASE(tx, another_fingerprint_is_a_mismatch)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "k", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&C));
    /* in_progress, other fingerprint */
    cr_assert(tconn_begin(&C));
    cr_expect_eq(begin_on(T, "k", 2, T0 + 1).decision.kind, IDEM_DECIDE_MISMATCH);
    tconn_rollback(&C);
    cr_assert(tconn_begin(&C));
    complete_on(T, "k", 1, "done", T0 + TTL);
    cr_assert(tconn_commit(&C));
    /* completed, other fingerprint */
    cr_assert(tconn_begin(&C));
    idem_tx_begin_t b = begin_on(T, "k", 2, T0 + 2);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_MISMATCH);
    cr_expect_null(b.record.owned);
    tconn_rollback(&C);
}

TX_CASE(tx, rollback_leaves_no_trace)
{
    cr_assert(tconn_begin(&C));
    idem_tx_begin_t b = begin_on(T, "gone", 1, T0);
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
    tconn_sql(&C, "INSERT INTO \"%s\" VALUES ('gone', 'me')", biz);
    complete_on(T, "gone", 1, "x", T0 + TTL);
    tconn_rollback(&C);

    idem_key_id_t id = kid("gone");
    idem_record_t rec;
    cr_expect_eq(idem_tx_get(T, &id, T0, &rec), IDEM_E_NOTFOUND);
    cr_expect_eq(biz_rows("gone"), 0);
    cr_expect_eq(tconn_num(&C, "SELECT count(*) FROM \"%s\"", table), 0);
    cr_assert(tconn_begin(&C));
    b = begin_on(T, "gone", 1, T0 + 1);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(b.decision.fence, 1);
    tconn_rollback(&C);
}

TX_CASE(tx, commit_without_complete_holds_the_lease_then_is_taken_over)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "two", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&C));

    idem_key_id_t id = kid("two");
    idem_record_t rec;
    cr_assert_eq(idem_tx_get(T, &id, T0, &rec), IDEM_OK);
    cr_expect_eq(rec.state, IDEM_STATE_IN_PROGRESS);
    cr_expect_eq(rec.lease_until_ms, T0 + LEASE);
    idem_record_cleanup(&rec);

    cr_assert(tconn_begin(&C));
    idem_tx_begin_t b = begin_on(T, "two", 1, T0 + 1000);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(b.decision.retry_after_s, 29);
    tconn_rollback(&C);
    cr_assert(tconn_begin(&C));
    cr_expect_eq(begin_on(T, "two", 1, T0 + LEASE - 1).decision.kind, IDEM_DECIDE_IN_FLIGHT);
    tconn_rollback(&C);

    cr_assert(tconn_begin(&C));
    b = begin_on(T, "two", 1, T0 + LEASE);
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_TAKEOVER);
    cr_assert_eq(b.decision.fence, 2);
    cr_assert(tconn_commit(&C));

    /* The first owner comes back late: its completion is refused. */
    cr_assert(tconn_begin(&C));
    idem_response_t r = resp("late");
    cr_expect_eq(idem_tx_complete(T, &id, 1, &r, 0, T0 + TTL), IDEM_E_FENCE);
    tconn_rollback(&C);

    cr_assert(tconn_begin(&C));
    complete_on(T, "two", 2, "second", T0 + TTL);
    cr_assert(tconn_commit(&C));
    cr_assert(tconn_begin(&C));
    b = begin_on(T, "two", 1, T0 + LEASE + 1);
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_REPLAY);
    expect_response(&b.record, "second");
    idem_record_cleanup(&b.record);
    tconn_rollback(&C);
    /* A completed record cannot be completed again, even with its fence. */
    cr_expect_eq(idem_tx_complete(T, &id, 2, &r, 0, T0 + TTL), IDEM_E_FENCE);
}

TX_CASE(tx, renew_and_release_are_fenced)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "r", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&C));
    idem_key_id_t id = kid("r");
    cr_expect_eq(idem_tx_renew(T, &id, 2, T0 + 99999), IDEM_E_FENCE);
    cr_assert_eq(idem_tx_renew(T, &id, 1, T0 + 2 * TTL), IDEM_OK, "%s", idem_tx_errstr(T));
    idem_record_t rec;
    cr_assert_eq(idem_tx_get(T, &id, T0, &rec), IDEM_OK);
    cr_expect_eq(rec.lease_until_ms, T0 + 2 * TTL);
    cr_expect_eq(rec.expires_at_ms, T0 + 2 * TTL);
    idem_record_cleanup(&rec);
    cr_expect_eq(idem_tx_release(T, &id, 2), IDEM_E_FENCE);
    cr_assert_eq(idem_tx_release(T, &id, 1), IDEM_OK);
    cr_expect_eq(idem_tx_get(T, &id, T0, &rec), IDEM_E_NOTFOUND);
    cr_expect_eq(idem_tx_release(T, &id, 1), IDEM_E_FENCE);
    idem_key_id_t none = kid("none");
    cr_expect_eq(idem_tx_renew(T, &none, 1, T0), IDEM_E_FENCE);
    idem_response_t r = resp("x");
    cr_expect_eq(idem_tx_complete(T, &none, 1, &r, 0, T0), IDEM_E_FENCE);
}

TX_CASE(tx, a_record_past_its_retention_is_absent)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "e", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    complete_on(T, "e", 1, "old", T0 + 5000);
    cr_assert(tconn_commit(&C));
    idem_key_id_t id = kid("e");
    idem_record_t rec;
    cr_assert_eq(idem_tx_get(T, &id, T0 + 4999, &rec), IDEM_OK);
    idem_record_cleanup(&rec);
    cr_expect_eq(idem_tx_get(T, &id, T0 + 5000, &rec), IDEM_E_NOTFOUND);

    cr_assert(tconn_begin(&C));
    idem_tx_begin_t b = begin_on(T, "e", 1, T0 + 4999);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_REPLAY);
    idem_record_cleanup(&b.record);
    tconn_rollback(&C);
    /* Past it, even another fingerprint claims the key again. */
    cr_assert(tconn_begin(&C));
    b = begin_on(T, "e", 7, T0 + 5000);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(b.decision.fence, 2);
    complete_on(T, "e", 2, "new", T0 + TTL);
    cr_assert(tconn_commit(&C));
    cr_assert_eq(idem_tx_get(T, &id, T0 + 6000, &rec), IDEM_OK);
    expect_response(&rec, "new");
    idem_record_cleanup(&rec);
}

TX_CASE(tx, sweep_removes_only_records_past_their_retention)
{
    const char *keys[4] = {"s1", "s2", "s3", "s4"};
    cr_assert(tconn_begin(&C));
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(begin_on(T, keys[i], 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
        complete_on(T, keys[i], 1, "b", T0 + 10 * (i + 1));
    }
    cr_assert(tconn_commit(&C));
    size_t removed = 99;
    cr_assert_eq(idem_tx_sweep(T, T0 + 20, 0, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    cr_assert_eq(idem_tx_sweep(T, T0 + 9, 100, &removed), IDEM_OK);
    cr_expect_eq(removed, 0);
    cr_assert_eq(idem_tx_sweep(T, T0 + 30, 1, &removed), IDEM_OK);
    cr_expect_eq(removed, 1);
    cr_assert_eq(idem_tx_sweep(T, T0 + 30, 100, &removed), IDEM_OK, "%s", idem_tx_errstr(T));
    cr_expect_eq(removed, 2);
    cr_expect_eq(tconn_num(&C, "SELECT count(*) FROM \"%s\"", table), 1);
    cr_expect_eq(tconn_num(&C, "SELECT count(*) FROM \"%s\" WHERE key = 's4'", table), 1);
    cr_expect_eq(idem_tx_sweep(T, T0, 1, NULL), IDEM_E_INVAL);
}

TX_CASE(tx, bad_arguments_are_inval)
{
    idem_tx_t *tx = (idem_tx_t *)&tx; /* not NULL: must be set to NULL on failure */
    const char *bad[] = {"", "1abc", "a-b", "a;drop table x", "a b", "\"q\"",
                         "a123456789012345678901234567890123456789012345678901234567890123"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_err_t rc = C.db != NULL ? idem_tx_sqlite(C.db, bad[i], &tx)
                                     : idem_tx_postgres(C.pg, bad[i], &tx);
        cr_expect_eq(rc, IDEM_E_INVAL, "table \"%s\"", bad[i]);
        cr_expect_null(tx);
        tx = (idem_tx_t *)&tx;
    }
    char good[IDEM_TX_TABLE_MAX + 1];
    memset(good, 'A', IDEM_TX_TABLE_MAX);
    good[IDEM_TX_TABLE_MAX] = '\0';
    idem_err_t rc =
        C.db != NULL ? idem_tx_sqlite(C.db, good, &tx) : idem_tx_postgres(C.pg, good, &tx);
    cr_expect_eq(rc, IDEM_OK);
    idem_tx_free(tx);
    rc = C.db != NULL ? idem_tx_sqlite(C.db, NULL, &tx) : idem_tx_postgres(C.pg, NULL, &tx);
    cr_expect_eq(rc, IDEM_OK);
    idem_tx_free(tx);
    cr_expect_eq(idem_tx_sqlite(NULL, NULL, &tx), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_postgres(NULL, NULL, &tx), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_sqlite(C.db, NULL, NULL), IDEM_E_INVAL);
    idem_tx_free(NULL);

    uint8_t fp[IDEM_FP_LEN] = {0};
    idem_tx_begin_t b;
    idem_key_id_t id = kid("");
    cr_expect_eq(idem_tx_begin(T, &id, fp, T0, T0, T0, &b), IDEM_E_INVAL);
    id = kid("k");
    id.scope[0] = '\0';
    cr_expect_eq(idem_tx_begin(T, &id, fp, T0, T0, T0, &b), IDEM_E_INVAL);
    memset(id.key, 'a', sizeof id.key); /* no NUL */
    snprintf(id.scope, sizeof id.scope, "anonymous");
    cr_expect_eq(idem_tx_begin(T, &id, fp, T0, T0, T0, &b), IDEM_E_INVAL);
    id = kid("k");
    cr_expect_eq(idem_tx_begin(T, &id, NULL, T0, T0, T0, &b), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_begin(T, &id, fp, T0, T0, T0, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_begin(NULL, &id, fp, T0, T0, T0, &b), IDEM_E_INVAL);
    idem_response_t r = resp("x");
    cr_expect_eq(idem_tx_complete(T, &id, 1, NULL, 0, T0), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_complete(T, &id, 1, &r, 0x80, T0), IDEM_E_INVAL);
    r.body = NULL;
    cr_expect_eq(idem_tx_complete(T, &id, 1, &r, 0, T0), IDEM_E_INVAL);
    idem_record_t rec;
    cr_expect_eq(idem_tx_get(T, &id, T0, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_tx_get(NULL, &id, T0, &rec), IDEM_E_INVAL);
    cr_expect_str_eq(idem_tx_errstr(NULL), "no handle");
}

TX_CASE(tx, a_response_over_the_limit_is_toobig)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "big", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    size_t n = (size_t)IDEM_TX_RESPONSE_MAX + 1;
    uint8_t *body = calloc(1, n);
    cr_assert_not_null(body);
    idem_response_t r = {.status = 200, .body = body, .body_len = n};
    idem_key_id_t id = kid("big");
    cr_expect_eq(idem_tx_complete(T, &id, 1, &r, 0, T0 + TTL), IDEM_E_TOOBIG);
    /* A large one under it is kept whole. */
    r.body_len = 4u * 1024 * 1024;
    memset(body, 'z', r.body_len);
    cr_assert_eq(idem_tx_complete(T, &id, 1, &r, 0, T0 + TTL), IDEM_OK, "%s", idem_tx_errstr(T));
    cr_assert(tconn_commit(&C));
    idem_record_t rec;
    cr_assert_eq(idem_tx_get(T, &id, T0, &rec), IDEM_OK);
    cr_expect_eq(rec.response.body_len, r.body_len);
    cr_expect_eq(memcmp(rec.response.body, body, r.body_len), 0);
    idem_record_cleanup(&rec);
    free(body);
}

TX_CASE(tx, a_corrupt_row_is_corrupt_not_a_crash)
{
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "bad", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    complete_on(T, "bad", 1, "ok", T0 + TTL);
    cr_assert(tconn_commit(&C));
    tconn_sql(&C, "UPDATE \"%s\" SET record = %s WHERE key = 'bad'", table,
              C.db != NULL ? "x'4944520102'" : "'\\x4944520102'::bytea");
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, 1);
    idem_key_id_t id = kid("bad");
    idem_tx_begin_t b;
    cr_assert(tconn_begin(&C));
    cr_expect_eq(idem_tx_begin(T, &id, fp, T0, T0 + LEASE, T0 + TTL, &b), IDEM_E_CORRUPT);
    cr_expect_eq(b.decision.kind, 0);
    cr_expect_neq(strstr(idem_tx_errstr(T), "does not decode"), NULL, "%s", idem_tx_errstr(T));
    tconn_rollback(&C);
    idem_record_t rec;
    cr_expect_eq(idem_tx_get(T, &id, T0, &rec), IDEM_E_CORRUPT);
    idem_response_t r = resp("x");
    cr_expect_eq(idem_tx_complete(T, &id, 1, &r, 0, T0), IDEM_E_CORRUPT);
    /* An empty value too. */
    tconn_sql(&C, "UPDATE \"%s\" SET record = %s WHERE key = 'bad'", table,
              C.db != NULL ? "x''" : "''::bytea");
    cr_expect_eq(idem_tx_get(T, &id, T0, &rec), IDEM_E_CORRUPT);
}

TX_CASE(tx, a_missing_table_is_io_with_the_database_message)
{
    idem_tx_t *tx;
    idem_err_t rc = C.db != NULL ? idem_tx_sqlite(C.db, "no_such_table_here", &tx)
                                 : idem_tx_postgres(C.pg, "no_such_table_here", &tx);
    cr_assert_eq(rc, IDEM_OK);
    idem_key_id_t id = kid("k");
    idem_record_t rec;
    cr_expect_eq(idem_tx_get(tx, &id, T0, &rec), IDEM_E_IO);
    cr_expect_neq(strstr(idem_tx_errstr(tx), "no_such_table_here"), NULL, "%s",
                  idem_tx_errstr(tx));
    idem_tx_free(tx);
}

TX_CASE(tx, migrate_twice_is_harmless)
{
    cr_expect_eq(idem_tx_migrate(T), IDEM_OK, "%s", idem_tx_errstr(T));
    cr_expect_eq(idem_tx_migrate(NULL), IDEM_E_INVAL);
}

/* ---- two connections racing one key ------------------------------------ */

#define RACE_KEYS 50

static pthread_barrier_t race_bar;

struct racer {
    int who;
    char answer[RACE_KEYS][64]; /* the body this thread ended up with, per key */
    char fail[256];             /* the first thing that went wrong, or "" */
    int forwarded;
};

static void *race_thread(void *arg)
{
    struct racer *me = arg;
    tconn_t c;
    if (!tconn_try_open(&c))
        snprintf(me->fail, sizeof me->fail, "cannot connect");
    idem_tx_t *tx = NULL;
    if (me->fail[0] == '\0' &&
        (c.db != NULL ? idem_tx_sqlite(c.db, table, &tx) : idem_tx_postgres(c.pg, table, &tx)) !=
            IDEM_OK)
        snprintf(me->fail, sizeof me->fail, "no handle");
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, 1);
    for (int k = 0; k < RACE_KEYS; k++) {
        pthread_barrier_wait(&race_bar); /* both start each key together */
        if (me->fail[0] != '\0')
            continue;
        char key[32], body[64], sql[256];
        snprintf(key, sizeof key, "race-%d", k);
        snprintf(body, sizeof body, "done %s by %d", key, me->who);
        idem_key_id_t id = kid(key);
        for (int attempt = 0;; attempt++) {
            if (attempt > 20000) {
                snprintf(me->fail, sizeof me->fail, "%s: no answer after %d attempts", key,
                         attempt);
                break;
            }
            if (!tconn_begin(&c)) {
                tconn_rollback(&c);
                continue;
            }
            idem_tx_begin_t b;
            idem_err_t rc = idem_tx_begin(tx, &id, fp, T0, T0 + LEASE, T0 + TTL, &b);
            if (rc == IDEM_E_RETRY) {
                tconn_rollback(&c);
                continue;
            }
            if (rc != IDEM_OK) {
                snprintf(me->fail, sizeof me->fail, "%s: begin %s %s", key, idem_err_name(rc),
                         idem_tx_errstr(tx));
                tconn_rollback(&c);
                break;
            }
            if (b.decision.kind == IDEM_DECIDE_IN_FLIGHT) {
                tconn_rollback(&c);
                usleep(200);
                continue;
            }
            if (b.decision.kind == IDEM_DECIDE_REPLAY) {
                snprintf(me->answer[k], sizeof me->answer[k], "%.*s",
                         (int)b.record.response.body_len, (const char *)b.record.response.body);
                idem_record_cleanup(&b.record);
                tconn_rollback(&c);
                break;
            }
            if (b.decision.kind != IDEM_DECIDE_CLAIM) {
                snprintf(me->fail, sizeof me->fail, "%s: %s", key,
                         idem_decision_name(b.decision.kind));
                tconn_rollback(&c);
                break;
            }
            snprintf(sql, sizeof sql, "INSERT INTO \"%s\" VALUES ('%s', '%d')", biz, key, me->who);
            if (!tconn_try(&c, sql, NULL, 0)) {
                tconn_rollback(&c);
                continue;
            }
            idem_response_t r = {.status = 200, .body = (const uint8_t *)body,
                                 .body_len = strlen(body)};
            rc = idem_tx_complete(tx, &id, b.decision.fence, &r, 0, T0 + TTL);
            if (rc != IDEM_OK) {
                tconn_rollback(&c);
                if (rc == IDEM_E_RETRY)
                    continue;
                snprintf(me->fail, sizeof me->fail, "%s: complete %s %s", key,
                         idem_err_name(rc), idem_tx_errstr(tx));
                break;
            }
            if (!tconn_commit(&c)) {
                tconn_rollback(&c);
                continue;
            }
            me->forwarded++;
            snprintf(me->answer[k], sizeof me->answer[k], "%s", body);
            break;
        }
    }
    idem_tx_free(tx);
    tconn_close(&c);
    return NULL;
}

TX_CASE(tx, two_connections_racing_one_key_apply_it_once)
{
    static struct racer r[2];
    memset(r, 0, sizeof r);
    pthread_barrier_init(&race_bar, NULL, 2);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i].who = i + 1;
        cr_assert_eq(pthread_create(&th[i], NULL, race_thread, &r[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&race_bar);
    for (int i = 0; i < 2; i++)
        cr_assert_str_empty(r[i].fail, "thread %d: %s", i + 1, r[i].fail);
    cr_expect_eq(r[0].forwarded + r[1].forwarded, RACE_KEYS);
    for (int k = 0; k < RACE_KEYS; k++) {
        char key[32];
        snprintf(key, sizeof key, "race-%d", k);
        cr_expect_eq(biz_rows(key), 1, "%s", key);
        idem_key_id_t id = kid(key);
        idem_record_t rec;
        cr_assert_eq(idem_tx_get(T, &id, T0, &rec), IDEM_OK, "%s", key);
        char stored[64];
        snprintf(stored, sizeof stored, "%.*s", (int)rec.response.body_len,
                 (const char *)rec.response.body);
        idem_record_cleanup(&rec);
        cr_expect_str_eq(r[0].answer[k], stored, "%s", key);
        cr_expect_str_eq(r[1].answer[k], stored, "%s", key);
    }
}

/* ---- one backend only ---------------------------------------------------- */

/* PostgreSQL: a key another open transaction holds is IN_FLIGHT at once. */
Test(tx_postgres, a_key_held_by_an_open_transaction_is_in_flight, .init = setup_pg,
     .fini = teardown)
{
    tconn_t c2;
    tconn_open(&c2);
    idem_tx_t *t2 = tconn_tx(&c2);
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "held", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_begin(&c2));
    idem_tx_begin_t b = begin_on(t2, "held", 1, T0);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(b.decision.retry_after_s, 1);
    /* another key is not held */
    cr_expect_eq(begin_on(t2, "other", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    tconn_rollback(&c2);
    complete_on(T, "held", 1, "first", T0 + TTL);
    cr_assert(tconn_commit(&C));
    cr_assert(tconn_begin(&c2));
    b = begin_on(t2, "held", 1, T0);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_REPLAY);
    idem_record_cleanup(&b.record);
    tconn_rollback(&c2);
    idem_tx_free(t2);
    tconn_close(&c2);
}

/* PostgreSQL: a serialization failure is IDEM_E_RETRY. */
Test(tx_postgres, a_serialization_failure_is_retry, .init = setup_pg, .fini = teardown)
{
    tconn_t c2;
    tconn_open(&c2);
    idem_tx_t *t2 = tconn_tx(&c2);
    /* c2's snapshot is taken before C's key commits. */
    tconn_sql(&c2, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    tconn_num(&c2, "SELECT count(*) FROM \"%s\"", table);
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "ser", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&C));
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, 1);
    idem_key_id_t id = kid("ser");
    idem_tx_begin_t b;
    idem_err_t rc = idem_tx_begin(t2, &id, fp, T0, T0 + LEASE, T0 + TTL, &b);
    cr_expect_eq(rc, IDEM_E_RETRY, "%s %s", idem_err_name(rc), idem_tx_errstr(t2));
    cr_expect_neq(strstr(idem_tx_errstr(t2), "40001"), NULL, "%s", idem_tx_errstr(t2));
    tconn_rollback(&c2);
    idem_tx_free(t2);
    tconn_close(&c2);
}

/* SQLite: after a deferred BEGIN, a write on a stale snapshot is IDEM_E_RETRY. */
Test(tx_sqlite, a_stale_deferred_transaction_is_retry, .init = setup_sqlite, .fini = teardown)
{
    tconn_t c2;
    tconn_open(&c2);
    sqlite3_busy_timeout(c2.db, 50);
    idem_tx_t *t2 = tconn_tx(&c2);
    tconn_sql(&c2, "BEGIN");
    tconn_num(&c2, "SELECT count(*) FROM \"%s\"", table); /* c2 now reads a snapshot */
    cr_assert(tconn_begin(&C));
    cr_assert_eq(begin_on(T, "a", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&C));
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, 1);
    idem_key_id_t id = kid("b");
    idem_tx_begin_t b;
    idem_err_t rc = idem_tx_begin(t2, &id, fp, T0, T0 + LEASE, T0 + TTL, &b);
    cr_expect_eq(rc, IDEM_E_RETRY, "%s %s", idem_err_name(rc), idem_tx_errstr(t2));
    tconn_rollback(&c2);
    /* Run again, it works. */
    cr_assert(tconn_begin(&c2));
    cr_expect_eq(begin_on(t2, "b", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert(tconn_commit(&c2));
    idem_tx_free(t2);
    tconn_close(&c2);
}

/* SQLite: begin outside any transaction is still correct (each statement commits). */
Test(tx_sqlite, begin_in_autocommit_commits_at_once, .init = setup_sqlite, .fini = teardown)
{
    cr_assert_eq(begin_on(T, "auto", 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(begin_on(T, "auto", 1, T0 + 1).decision.kind, IDEM_DECIDE_IN_FLIGHT);
    complete_on(T, "auto", 1, "a", T0 + TTL);
    idem_tx_begin_t b = begin_on(T, "auto", 1, T0 + 2);
    cr_expect_eq(b.decision.kind, IDEM_DECIDE_REPLAY);
    idem_record_cleanup(&b.record);
}

/* ---- out of memory ----------------------------------------------------------
 * Each call with its Nth allocation failing, for N = 1, 2, ... until it
 * works: every failure is IDEM_E_NOMEM, nothing leaks (the sanitizer build),
 * and the call then works as if nothing had happened. */

#define OOM_LOOP(call, what)                                                              \
    for (long n = 1;; n++) {                                                              \
        cr_assert_lt(n, 100, "%s never succeeded", what);                                 \
        idem_alloc_fail_after(n);                                                         \
        idem_err_t oom_rc = (call);                                                       \
        idem_alloc_fail_after(0);                                                         \
        if (oom_rc == IDEM_OK)                                                            \
            break;                                                                        \
        cr_assert_eq(oom_rc, IDEM_E_NOMEM, "%s, allocation %ld: %s", what, n,             \
                     idem_err_name(oom_rc));                                              \
    }

TX_CASE(tx, every_failed_allocation_is_nomem)
{
    idem_tx_t *tx = NULL;
    OOM_LOOP(C.db != NULL ? idem_tx_sqlite(C.db, table, &tx) : idem_tx_postgres(C.pg, table, &tx),
             "create");
    uint8_t fp[IDEM_FP_LEN];
    fp_of(fp, 1);
    idem_key_id_t id = kid("oom");
    idem_tx_begin_t b;
    cr_assert(tconn_begin(&C));
    OOM_LOOP(idem_tx_begin(tx, &id, fp, T0, T0 + LEASE, T0 + TTL, &b), "begin");
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_CLAIM);
    cr_assert_eq(b.decision.fence, 1);
    idem_response_t r = resp("body");
    OOM_LOOP(idem_tx_complete(tx, &id, 1, &r, 0, T0 + TTL), "complete");
    cr_assert(tconn_commit(&C));
    cr_assert(tconn_begin(&C));
    OOM_LOOP(idem_tx_begin(tx, &id, fp, T0 + 1, T0 + LEASE, T0 + TTL, &b), "replay");
    cr_assert_eq(b.decision.kind, IDEM_DECIDE_REPLAY);
    expect_response(&b.record, "body");
    idem_record_cleanup(&b.record);
    tconn_rollback(&C);
    idem_record_t rec;
    OOM_LOOP(idem_tx_get(tx, &id, T0 + 1, &rec), "get");
    expect_response(&rec, "body");
    idem_record_cleanup(&rec);
    idem_tx_free(tx);
}
