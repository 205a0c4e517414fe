/* tests/store/test_redis_layout.c - the Redis store's record layouts: a
 * store written by an idemd before issue 20's layout 2 is still read
 * correctly, and a value of neither layout is refused, never taken.
 *
 * Layout 1 (idemd up to git 3c61ec7) kept a record as a hash: fields st,
 * fl, fp, fe, lu, ex and, when completed with a response, r (the encoded
 * record, its fingerprint spliced in after encoding), with PEXPIREAT ex.
 * Layout 2 (src/store/redis.c) is one string.  Each case writes layout 1
 * records here exactly as the old scripts did (HSET, then PEXPIREAT), on
 * the server of $IDEM_TEST_REDIS_URL (redis:// or redis+cluster://, where
 * each key is written on its slot's master) under a prefix of the test's own, and
 * then drives the store through its API: get, claim (each decision),
 * complete, tokens, sweep, listing and bulk delete read the old records as
 * they were; a write turns the record into layout 2.  A string that is not
 * a layout 2 record (another version byte, too short) is IDEM_E_CORRUPT for
 * every op and get, and can be deleted.
 */
#include "store_fixture.h"

#include "idem/token.h"

#define TTL 86400000ll
#define LEASE 60000ll
#define FP_AT 9 /* an encoded record's fingerprint (record.h's layout) */

static const char body[] = "{\"layout\":1}";
static const idem_header_t hdrs[] = {{"content-type", 12, "application/json", 16}};
static const idem_response_t resp = {201, hdrs, 1, (const uint8_t *)body, sizeof body - 1};

static void fp_fill(uint8_t *fp, int seed)
{
    for (int i = 0; i < IDEM_FP_LEN; i++)
        fp[i] = (uint8_t)(seed * 31 + i);
}

/* The Redis key of id under the test's prefix (redis.c's make_key). */
static void rkey(const idem_key_id_t *id, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s:%s", fx_redis_prefix, id->scope, id->key);
}

/* argv's answer from the server that holds the key argv[1]: the one of
 * $IDEM_TEST_REDIS_URL, or on a cluster (redis+cluster://) the first seed,
 * then the node each MOVED names. */
static redisReply *on_key(int argc, const char **argv, const size_t *len)
{
    const char *u = fx_getenv("IDEM_TEST_REDIS_URL");
    char host[256];
    int port;
    if (u != NULL && sscanf(u, "redis+cluster://%255[^:]:%d", host, &port) == 2) {
        for (int hop = 0; hop < 4; hop++) {
            struct timeval tv = {5, 0};
            redisContext *c = redisConnectWithTimeout(host, port, tv);
            cr_assert(c != NULL && c->err == 0, "no connection to %s:%d", host, port);
            redisReply *r = redisCommandArgv(c, argc, argv, len);
            redisFree(c);
            if (r == NULL || r->type != REDIS_REPLY_ERROR || strncmp(r->str, "MOVED ", 6) != 0)
                return r;
            cr_assert_eq(sscanf(r->str, "MOVED %*d %255[^:]:%d", host, &port), 2, "%s", r->str);
            freeReplyObject(r);
        }
        cr_assert_fail("%s: MOVED too often", argv[1]);
    }
    redisContext *c = fx_redis_connect();
    cr_assert(c != NULL, "no connection to $IDEM_TEST_REDIS_URL");
    redisReply *r = redisCommandArgv(c, argc, argv, len);
    redisFree(c);
    return r;
}

/* Write a layout 1 record as idemd before layout 2 did: HSET of the
 * fields (r when rsp is given: encoded with a zero fingerprint, the
 * fingerprint spliced in), PEXPIREAT ex. */
static void put_v1(const idem_key_id_t *id, int st_, unsigned fl, const uint8_t *fp, uint64_t fe,
                   int64_t lu, int64_t ex, const idem_response_t *rsp)
{
    char k[512], sst[8], sfl[8], sfe[24], slu[24], sex[24];
    rkey(id, k, sizeof k);
    snprintf(sst, sizeof sst, "%d", st_);
    snprintf(sfl, sizeof sfl, "%u", fl);
    snprintf(sfe, sizeof sfe, "%llu", (unsigned long long)fe);
    snprintf(slu, sizeof slu, "%lld", (long long)lu);
    snprintf(sex, sizeof sex, "%lld", (long long)ex);
    uint8_t *enc = NULL;
    size_t enclen = 0;
    if (rsp != NULL) {
        idem_record_t rec = {.state = IDEM_STATE_COMPLETED,
                             .flags = fl,
                             .fence = fe,
                             .lease_until_ms = lu,
                             .expires_at_ms = ex,
                             .response = *rsp};
        enclen = idem_record_encoded_size(&rec);
        cr_assert(enclen > FP_AT + IDEM_FP_LEN);
        enc = malloc(enclen);
        cr_assert_not_null(enc);
        idem_record_encode_into(&rec, enc);
        memcpy(enc + FP_AT, fp, IDEM_FP_LEN);
    }
    const char *argv[16] = {"HSET", k,   "st", sst, "fl", sfl, "fp", (const char *)fp,
                            "fe",   sfe, "lu", slu, "ex", sex, "r",  (const char *)enc};
    size_t len[16] = {4, strlen(k),   2, strlen(sst), 2, strlen(sfl), 2, IDEM_FP_LEN,
                      2, strlen(sfe), 2, strlen(slu), 2, strlen(sex), 1, enclen};
    redisReply *r = on_key(enc != NULL ? 16 : 14, argv, len);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER, "HSET %s", k);
    freeReplyObject(r);
    const char *pargv[] = {"PEXPIREAT", k, sex};
    size_t plen[] = {9, strlen(k), strlen(sex)};
    r = on_key(3, pargv, plen);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    free(enc);
}

/* TYPE of id's Redis key: "hash", "string" or "none". */
static void expect_type(const idem_key_id_t *id, const char *want)
{
    char k[512];
    rkey(id, k, sizeof k);
    const char *argv[] = {"TYPE", k};
    size_t len[] = {4, strlen(k)};
    redisReply *r = on_key(2, argv, len);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS);
    cr_expect_str_eq(r->str, want, "TYPE %s", k);
    freeReplyObject(r);
}

static idem_op_t claim_at(const char *key, int seed, int64_t now)
{
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    op.id = fx_key(key);
    fp_fill(op.fp, seed);
    op.now_ms = now;
    op.lease_until_ms = now + LEASE;
    op.expires_at_ms = now + TTL;
    cr_assert_eq(idem_store_claim(st, &op), IDEM_OK, "%s", idem_store_errstr(st));
    return op;
}

static void expect_resp(const idem_record_t *rec)
{
    cr_expect_eq(rec->response.status, resp.status);
    cr_expect_eq(rec->response.body_len, resp.body_len);
    cr_expect_eq(memcmp(rec->response.body, resp.body, resp.body_len), 0);
    cr_assert_eq(rec->response.n_headers, 1);
    cr_expect_eq(memcmp(rec->response.headers[0].value, "application/json", 16), 0);
}

TestSuite(redis_layout, .init = fx_setup_redis, .fini = fx_teardown);

/* An in_progress record of layout 1: read, decided on, fenced; its
 * completion writes layout 2, which replays. */
Test(redis_layout, an_old_in_progress_record_is_read_decided_and_completed)
{
    idem_key_id_t id = fx_key("v1-inprogress");
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 1);
    put_v1(&id, 1, 0, fp, 3, T0 + LEASE, T0 + TTL, NULL);

    idem_record_t rec;
    cr_assert_eq(idem_store_get(st, &id, T0, &rec), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(rec.state, IDEM_STATE_IN_PROGRESS);
    cr_expect_eq(rec.fence, 3);
    cr_expect_eq(rec.lease_until_ms, T0 + LEASE);
    cr_expect_eq(rec.expires_at_ms, T0 + TTL);
    cr_expect_eq(memcmp(rec.fingerprint, fp, IDEM_FP_LEN), 0);
    idem_record_cleanup(&rec);

    idem_op_t op = claim_at("v1-inprogress", 1, T0 + 1);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(op.decision.fence, 3);
    op = claim_at("v1-inprogress", 2, T0 + 1);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_MISMATCH);
    expect_type(&id, "hash"); /* decisions that write nothing leave it as it is */

    cr_expect_eq(idem_store_complete(st, &id, 2, &resp, 0, T0 + TTL), IDEM_E_FENCE);
    cr_assert_eq(idem_store_complete(st, &id, 3, &resp, 0, T0 + TTL), IDEM_OK, "%s",
                 idem_store_errstr(st));
    expect_type(&id, "string");
    op = claim_at("v1-inprogress", 1, T0 + 2);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_REPLAY);
    cr_expect_eq(op.record.fence, 3);
    expect_resp(&op.record);
    idem_record_cleanup(&op.record);
}

/* A completed record of layout 1 replays its response, exactly. */
Test(redis_layout, an_old_completed_record_replays)
{
    idem_key_id_t id = fx_key("v1-completed");
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 4);
    put_v1(&id, 2, 0, fp, 2, 0, T0 + TTL, &resp);

    idem_record_t rec;
    cr_assert_eq(idem_store_get(st, &id, T0, &rec), IDEM_OK, "%s", idem_store_errstr(st));
    cr_expect_eq(rec.state, IDEM_STATE_COMPLETED);
    cr_expect_eq(rec.fence, 2);
    expect_resp(&rec);
    idem_record_cleanup(&rec);

    idem_op_t op = claim_at("v1-completed", 4, T0 + 1);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_REPLAY, "%d", op.decision.kind);
    cr_expect_eq(op.record.fence, 2);
    cr_expect_eq(memcmp(op.record.fingerprint, fp, IDEM_FP_LEN), 0);
    expect_resp(&op.record);
    idem_record_cleanup(&op.record);
    expect_type(&id, "hash");
}

/* Past its retention, a layout 1 record is claimed afresh (fence + 1),
 * as layout 2; a layout 1 lease that ended is taken over. */
Test(redis_layout, an_old_record_is_taken_over_and_expires_as_before)
{
    idem_key_id_t a = fx_key("v1-expired"), b = fx_key("v1-lease-over");
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 5);
    put_v1(&a, 2, 0, fp, 7, 0, T0 + 1000, &resp);
    put_v1(&b, 1, 0, fp, 4, T0 + 10, T0 + TTL, NULL);

    idem_op_t op = claim_at("v1-expired", 6, T0 + 1000);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(op.decision.fence, 8);
    expect_type(&a, "string");
    op = claim_at("v1-lease-over", 5, T0 + 11);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_TAKEOVER);
    cr_expect_eq(op.decision.fence, 5);
    cr_expect_eq(idem_store_release(st, &b, 5), IDEM_OK);
    idem_record_t rec;
    cr_expect_eq(idem_store_get(st, &b, T0 + 12, &rec), IDEM_E_NOTFOUND);
}

/* A used token of layout 1 stays used; an unused one is spent once. */
Test(redis_layout, old_tokens_keep_their_state)
{
    static const uint8_t zero[IDEM_FP_LEN];
    idem_key_id_t used, fresh;
    idem_token_id("anonymous", "00000000000000000000000000000001", &used);
    idem_token_id("anonymous", "00000000000000000000000000000002", &fresh);
    put_v1(&used, 2, IDEM_REC_TOKEN, zero, 1, T0 + TTL, T0 + TTL, NULL);
    put_v1(&fresh, 1, IDEM_REC_TOKEN, zero, 1, T0 + TTL, T0 + TTL, NULL);

    idem_token_verdict_t v = IDEM_TOKEN_NONE;
    cr_assert_eq(idem_store_token_use(st, &used, T0, &v), IDEM_OK);
    cr_expect_eq(v, IDEM_TOKEN_USED);
    cr_assert_eq(idem_store_token_use(st, &fresh, T0, &v), IDEM_OK);
    cr_expect_eq(v, IDEM_TOKEN_FIRST_USE);
    cr_assert_eq(idem_store_token_use(st, &fresh, T0 + 1, &v), IDEM_OK);
    cr_expect_eq(v, IDEM_TOKEN_USED);
    cr_expect_eq(idem_store_token_issue(st, &used, T0, T0 + TTL), IDEM_E_EXISTS);
}

/* The listing and its bulk delete see layout 1 and 2 records alike, and
 * the sweep removes both once past their retention. */
Test(redis_layout, listing_bulk_delete_and_sweep_read_both_layouts)
{
    idem_key_id_t old = fx_key("both-old");
    uint8_t fp[IDEM_FP_LEN];
    fp_fill(fp, 9);
    put_v1(&old, 2, 0, fp, 1, 0, T0 + TTL, &resp);
    idem_op_t op = claim_at("both-new", 9, T0);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_CLAIM);
    idem_key_id_t nw = fx_key("both-new");
    cr_assert_eq(idem_store_complete(st, &nw, 1, &resp, 0, T0 + TTL), IDEM_OK);
    expect_type(&old, "hash");
    expect_type(&nw, "string");

    idem_store_filter_t f = {.scope = "anonymous", .prefix = "both-", .now_ms = T0};
    idem_store_page_t page;
    size_t seen = 0;
    char cursor[IDEM_STORE_CURSOR_MAX + 1] = "";
    idem_store_listed_t items[4];
    do {
        cr_assert_eq(idem_store_list(st, &f, cursor, 100, &page), IDEM_OK, "%s",
                     idem_store_errstr(st));
        for (size_t i = 0; i < page.n; i++) {
            cr_assert_lt(seen, 4);
            cr_expect_eq(page.items[i].rec.state, IDEM_STATE_COMPLETED);
            cr_expect_eq(page.items[i].rec.response.status, resp.status);
            items[seen++] = page.items[i];
        }
        snprintf(cursor, sizeof cursor, "%s", page.cursor);
        idem_store_page_cleanup(&page);
    } while (cursor[0] != '\0');
    cr_assert_eq(seen, 2, "both records listed");

    size_t deleted = 0;
    cr_assert_eq(idem_store_delete_listed(st, items, seen, &deleted, NULL), IDEM_OK);
    cr_expect_eq(deleted, 2, "both records deleted");
    expect_type(&old, "none");
    expect_type(&nw, "none");

    /* The sweep, with the caller's clock far ahead of Redis's (it scans). */
    put_v1(&old, 1, 0, fp, 1, T0 + 10, T0 + 20, NULL);
    op = claim_at("both-new", 9, T0);
    size_t removed = 0, total = 0;
    for (int i = 0; i < 64 && total < 2; i++) {
        cr_assert_eq(idem_store_sweep(st, T0 + 2 * TTL, 1000, &removed), IDEM_OK);
        total += removed;
    }
    cr_expect_eq(total, 2, "the sweep removes both layouts");
}

/* What is neither layout: refused by every op and by get, deletable. */
Test(redis_layout, a_value_of_no_known_layout_is_corrupt)
{
    static const char *names[] = {"v3", "short", "badstate"};
    char v3[59], bad[59];
    memset(v3, 0, sizeof v3);
    v3[0] = 3; /* a layout this idemd does not know (a newer idemd's) */
    v3[1] = 1;
    memset(bad, 0, sizeof bad);
    bad[0] = 2;
    bad[1] = 9; /* st */
    for (int i = 0; i < 3; i++) {
        idem_key_id_t id = fx_key(names[i]);
        char k[512];
        rkey(&id, k, sizeof k);
        const char *argv[] = {"SET", k, i == 0 ? v3 : i == 1 ? "\002\001" : bad};
        size_t len[] = {3, strlen(k), i == 1 ? 2 : 59};
        redisReply *r = on_key(3, argv, len);
        cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS, "SET %s", k);
        freeReplyObject(r);
    }
    for (int i = 0; i < 3; i++) {
        idem_key_id_t id = fx_key(names[i]);
        idem_op_t op;
        memset(&op, 0, sizeof op);
        op.kind = IDEM_OP_CLAIM;
        op.id = id;
        op.now_ms = T0;
        op.lease_until_ms = T0 + LEASE;
        op.expires_at_ms = T0 + TTL;
        cr_expect_eq(idem_store_claim(st, &op), IDEM_E_CORRUPT, "claim %s", names[i]);
        cr_expect_eq(idem_store_complete(st, &id, 1, &resp, 0, T0 + TTL), IDEM_E_CORRUPT,
                     "complete %s", names[i]);
        idem_record_t rec;
        cr_expect_eq(idem_store_get(st, &id, T0, &rec), IDEM_E_CORRUPT, "get %s", names[i]);
        if (i == 0)
            cr_expect(strstr(idem_store_errstr(st), "layout 3") != NULL, "%s",
                      idem_store_errstr(st));
        cr_expect_eq(idem_store_delete(st, &id), IDEM_OK, "delete %s", names[i]);
        cr_expect_eq(claim_at(names[i], 1, T0).decision.kind, IDEM_DECIDE_CLAIM);
    }
}
