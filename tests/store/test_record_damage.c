/* tests/store/test_record_damage.c - a damaged record is an error on every store.
 *
 * Issue 20 item 7: a record whose bytes were damaged where the store keeps
 * them (a disk, a copy, a server's memory) must never be answered as if it
 * were right.  Each case completes a key with a known body, then changes one
 * bit of that body where the backend keeps it, by the backend's own means
 * and not through idem's store: lmdb and rocksdb with their own libraries
 * while the store is closed, Redis with SET of the record's value,
 * PostgreSQL with an UPDATE of the record column.  Then a get, and a claim
 * of the same request (which would replay the record), are IDEM_E_CORRUPT;
 * the key can be deleted and claimed afresh; and a key next to it is not
 * disturbed.  The record's checksum (src/core/record.c, version 2) is what
 * makes this so; without it each store replayed the damaged body.
 *
 * memory: keeps its records in this process and is not in the list.
 */
#include <lmdb.h>
#if IDEM_HAVE_ROCKSDB
#include <rocksdb/c.h>
#endif

#include "idem/record.h"
#include "store/store_impl.h"
#include "store_fixture.h"

#define TTL 60000
#define LEASE 30000

static const char body[] = "the body of a completed request, 0123456789";

static idem_op_t claim_op(const char *key)
{
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    op.id = fx_key(key);
    memset(op.fp, 0x42, sizeof op.fp);
    op.now_ms = T0;
    op.lease_until_ms = T0 + LEASE;
    op.expires_at_ms = T0 + TTL;
    return op;
}

/* Claim and complete key with body. */
static void complete_key(const char *key)
{
    static const idem_header_t h[] = {{"Content-Type", 12, "text/plain", 10}};
    idem_op_t op = claim_op(key);
    fx_claim_at_t0(&op, LEASE, TTL);
    cr_assert_eq(op.decision.kind, IDEM_DECIDE_CLAIM);
    idem_response_t resp = {201, h, 1, (const uint8_t *)body, sizeof body - 1};
    idem_key_id_t id = fx_key(key);
    cr_assert_eq(idem_store_complete(st, &id, op.decision.fence, &resp, 0, T0 + TTL), IDEM_OK);
}

/* Flip one bit of the body in an encoded record (the body ends 4 bytes
 * before the value, ahead of the checksum). */
static void flip_body(uint8_t *v, size_t len)
{
    const size_t at = len - 4 - 5;
    cr_assert(len > 4 + sizeof body);
    cr_assert_eq(memcmp(v + len - 4 - (sizeof body - 1), body, sizeof body - 1), 0,
                 "the body is not where the layout puts it");
    v[at] ^= 0x08;
}

/* ---- damage, by each backend's own means --------------------------------- */

static void damage_lmdb(const char *key)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    char k[IDEM_STORE_KEY_MAX];
    size_t kl = (size_t)snprintf(k, sizeof k, "anonymous%c%s", 0, key);
    MDB_val mk = {kl, k}, mv = {0, NULL};

    idem_store_close(st);
    st = NULL;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 3);
    cr_assert_eq(mdb_env_open(env, fx_dir, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "records", 0, &dbi), 0);
    cr_assert_eq(mdb_get(txn, dbi, &mk, &mv), 0);
    uint8_t *copy = malloc(mv.mv_size);
    memcpy(copy, mv.mv_data, mv.mv_size);
    flip_body(copy, mv.mv_size);
    mv.mv_data = copy;
    cr_assert_eq(mdb_put(txn, dbi, &mk, &mv, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    free(copy);
    fx_open_url(fx_url);
}

#if IDEM_HAVE_ROCKSDB
static void damage_rocksdb(const char *key)
{
    char k[IDEM_STORE_KEY_MAX];
    size_t kl = (size_t)snprintf(k, sizeof k, "anonymous%c%s", 0, key), vl;
    char *err = NULL;

    idem_store_close(st);
    st = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    const char *names[2] = {"default", "expiry"};
    const rocksdb_options_t *cfo[2] = {o, o};
    rocksdb_column_family_handle_t *cfh[2] = {NULL, NULL};
    rocksdb_t *db = rocksdb_open_column_families(o, fx_dir, 2, names, cfo, cfh, &err);
    cr_assert_null(err, "rocksdb open: %s", err);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    char *v = rocksdb_get_cf(db, ro, cfh[0], k, kl, &vl, &err);
    cr_assert_null(err, "rocksdb get: %s", err);
    cr_assert_not_null(v);
    flip_body((uint8_t *)v, vl);
    rocksdb_put_cf(db, wo, cfh[0], k, kl, v, vl, &err);
    cr_assert_null(err, "rocksdb put: %s", err);
    rocksdb_free(v);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_column_family_handle_destroy(cfh[0]);
    rocksdb_column_family_handle_destroy(cfh[1]);
    rocksdb_close(db);
    rocksdb_options_destroy(o);
    fx_open_url(fx_url);
}
#endif

static void damage_redis(const char *key)
{
    char k[256];
    snprintf(k, sizeof k, "%sanonymous:%s", fx_redis_prefix, key);
    redisContext *c = fx_redis_connect();
    cr_assert_not_null(c);
    redisReply *r = redisCommand(c, "GET %s", k);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STRING, "GET %s", k);
    uint8_t *v = malloc(r->len);
    size_t len = r->len;
    memcpy(v, r->str, len);
    freeReplyObject(r);
    flip_body(v, len);
    r = redisCommand(c, "SET %s %b KEEPTTL", k, v, len);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS, "SET %s", k);
    freeReplyObject(r);
    free(v);
    redisFree(c);
}

static void damage_postgres(const char *key)
{
    char sql[512];
    PGconn *c = fx_pg_connect();
    cr_assert(c != NULL && PQstatus(c) == CONNECTION_OK);
    /* The same byte flip_body changes: 9 from the end (0-based offset). */
    snprintf(sql, sizeof sql,
             "UPDATE \"%s\" SET record = set_byte(record, length(record) - 9, "
             "get_byte(record, length(record) - 9) # 8) WHERE key = '%s'",
             fx_pg_table, key);
    PGresult *r = PQexec(c, sql);
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(c));
    cr_assert_str_eq(PQcmdTuples(r), "1");
    PQclear(r);
    PQfinish(c);
}

/* ---- the case ------------------------------------------------------------- */

static void damaged_record_is_an_error(void (*damage)(const char *key))
{
    complete_key("damaged");
    complete_key("neighbour");
    damage("damaged");

    idem_record_t rec;
    idem_key_id_t id = fx_key("damaged");
    cr_expect_eq(idem_store_get(st, &id, T0, &rec), IDEM_E_CORRUPT, "get");
    idem_op_t op = claim_op("damaged");
    idem_err_t rc = idem_store_claim(st, &op);
    cr_expect_eq(rc, IDEM_E_CORRUPT, "the claim of a repeat: %s", idem_err_name(rc));
    if (rc == IDEM_OK) {
        cr_expect_neq(op.decision.kind, IDEM_DECIDE_REPLAY, "the damaged record was replayed");
        idem_record_cleanup(&op.record);
    }

    /* The neighbour is intact. */
    idem_key_id_t nid = fx_key("neighbour");
    cr_assert_eq(idem_store_get(st, &nid, T0, &rec), IDEM_OK);
    cr_expect_eq(rec.response.body_len, sizeof body - 1);
    cr_expect_eq(memcmp(rec.response.body, body, sizeof body - 1), 0);
    idem_record_cleanup(&rec);

    /* An operator can remove it; the key is then new. */
    cr_expect_eq(idem_store_delete(st, &id), IDEM_OK);
    op = claim_op("damaged");
    cr_expect_eq(idem_store_claim(st, &op), IDEM_OK);
    cr_expect_eq(op.decision.kind, IDEM_DECIDE_CLAIM);
}

Test(record_damage_lmdb, damaged_record_is_an_error, .init = fx_setup_lmdb, .fini = fx_teardown)
{
    damaged_record_is_an_error(damage_lmdb);
}

#if IDEM_HAVE_ROCKSDB
Test(record_damage_rocksdb, damaged_record_is_an_error, .init = fx_setup_rocksdb,
     .fini = fx_teardown)
{
    damaged_record_is_an_error(damage_rocksdb);
}
#endif

Test(record_damage_redis, damaged_record_is_an_error, .init = fx_setup_redis, .fini = fx_teardown)
{
    damaged_record_is_an_error(damage_redis);
}

Test(record_damage_postgres, damaged_record_is_an_error, .init = fx_setup_postgres,
     .fini = fx_teardown)
{
    damaged_record_is_an_error(damage_postgres);
}
