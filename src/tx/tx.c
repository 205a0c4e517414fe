/* src/tx/tx.c - key records in the caller's own transaction: the rules.
 *
 * Every decision is idem_decide's on the record the row holds, and every
 * record is idem_record_encode's, so a key behaves here as in idemd's
 * stores.  The backends (tx_sqlite.c, tx_postgres.c) only run statements;
 * what to run, and what the answer means, is decided here.
 *
 * begin reads the row (on PostgreSQL after a non-waiting advisory lock on
 * the key, and FOR UPDATE), decides, and on CLAIM/TAKEOVER writes the
 * in_progress record: an INSERT that does nothing on conflict when there was
 * no row, or an UPDATE that is a compare-and-set on the fence and state it
 * read.  Either may find that someone else wrote first (no row changed);
 * begin then reads again and decides again, a few rounds at most, then
 * answers IDEM_E_RETRY.  Inside a write transaction (SQLite BEGIN IMMEDIATE,
 * or PostgreSQL with the row locked) that cannot happen; outside one (each
 * statement its own transaction) it keeps begin correct all the same.
 *
 * complete, renew and release are fenced the same way: the row must still
 * be in_progress with the caller's fence, or the answer is IDEM_E_FENCE.
 *
 * INVARIANTS: the state, fence and expires_at columns always equal the
 * record's own fields (written together, by this file only).
 * THREADING: none of its own; a handle is used by one thread at a time.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/utf8.h"
#include "idem/alloc.h"
#include "idem/tx.h"
#include "tx/tx_impl.h"

#define BEGIN_ROUNDS 4 /* reads and writes of one begin before IDEM_E_RETRY */

static const char *state_name(idem_state_t s)
{
    return s == IDEM_STATE_COMPLETED ? "completed" : "in_progress";
}

int idem__tx_name_ok(const char *name)
{
    if (name == NULL || name[0] == '\0' || (name[0] >= '0' && name[0] <= '9'))
        return 0;
    size_t i = 0;
    for (; name[i] != '\0'; i++) {
        char c = name[i];
        if (i >= IDEM_TX_TABLE_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return 1;
}

void idem__tx_seterr(idem_tx_t *tx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tx->err, sizeof tx->err, fmt, ap);
    va_end(ap);
    /* libpq's messages end with a newline; keep the sentence on one line. */
    size_t n = strlen(tx->err);
    while (n > 0 && (tx->err[n - 1] == '\n' || tx->err[n - 1] == ' '))
        tx->err[--n] = '\0';
}

void idem__tx_result_cleanup(idem__tx_result_t *res)
{
    idem_free(res->col);
    memset(res, 0, sizeof *res);
}

idem_err_t idem__tx_create(const struct idem_tx_ops *ops, void *conn, const char *table,
                           idem_tx_t **out)
{
    idem_tx_t *tx = idem_calloc(1, sizeof *tx);
    if (tx == NULL)
        return IDEM_E_NOMEM;
    tx->ops = ops;
    tx->conn = conn;
    snprintf(tx->table, sizeof tx->table, "%s", table);
    for (int i = 0; i < IDEM__TX_SQL_N; i++) {
        const char *t = ops->sql[i];
        if (t == NULL)
            continue;
        /* Every "%s" of a text is the table; the index's name is <table>_expires. */
        size_t n = strlen(t) + 4 * (IDEM_TX_TABLE_MAX + 2) + 1;
        tx->sql[i] = idem_malloc(n);
        if (tx->sql[i] == NULL) {
            idem_tx_free(tx);
            return IDEM_E_NOMEM;
        }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(tx->sql[i], n, t, tx->table, tx->table);
#pragma GCC diagnostic pop
    }
    *out = tx;
    return IDEM_OK;
}

void idem_tx_free(idem_tx_t *tx)
{
    if (tx == NULL)
        return;
    tx->ops->release(tx);
    for (int i = 0; i < IDEM__TX_SQL_N; i++)
        idem_free(tx->sql[i]);
    idem_free(tx);
}

const char *idem_tx_errstr(const idem_tx_t *tx)
{
    if (tx == NULL)
        return "no handle";
    return tx->err;
}

idem_err_t idem_tx_migrate(idem_tx_t *tx)
{
    if (tx == NULL)
        return IDEM_E_INVAL;
    idem__tx_result_t res;
    idem_err_t rc = tx->ops->exec(tx, IDEM__TX_SQL_CREATE, NULL, NULL, 0, &res);
    if (rc != IDEM_OK)
        return rc;
    idem__tx_result_cleanup(&res);
    rc = tx->ops->exec(tx, IDEM__TX_SQL_INDEX, NULL, NULL, 0, &res);
    if (rc == IDEM_OK)
        idem__tx_result_cleanup(&res);
    return rc;
}

/* ---- helpers -------------------------------------------------------------- */

static int id_ok_for(const idem_tx_t *tx, const idem_key_id_t *id)
{
    if (id == NULL || id->scope[0] == '\0' || id->key[0] == '\0' ||
        memchr(id->scope, '\0', sizeof id->scope) == NULL ||
        memchr(id->key, '\0', sizeof id->key) == NULL)
        return 0;
    if (tx->ops->utf8_text && (!idem__utf8_valid(id->scope, strlen(id->scope)) ||
                                 !idem__utf8_valid(id->key, strlen(id->key)))) {
        idem__tx_seterr((idem_tx_t *)tx, "on %s a scope and a key must be valid UTF-8",
                        tx->ops->name);
        return 0;
    }
    return 1;
}

static idem__tx_param_t text_param(const char *s)
{
    return (idem__tx_param_t){.kind = IDEM__TXP_TEXT, .p = s, .len = strlen(s)};
}

static idem__tx_param_t int_param(int64_t v)
{
    return (idem__tx_param_t){.kind = IDEM__TXP_INT, .i = v};
}

/* The advisory lock's id: FNV-1a (64 bits) of table, scope and key, each
 * followed by a NUL so that ("ab","c") and ("a","bc") differ. */
static int64_t lock_id(const char *table, const idem_key_id_t *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const char *parts[3] = {table, id->scope, id->key};
    for (int p = 0; p < 3; p++) {
        const unsigned char *s = (const unsigned char *)parts[p];
        for (size_t i = 0;; i++) {
            h ^= s[i];
            h *= 0x100000001b3ull;
            if (s[i] == '\0')
                break;
        }
    }
    return (int64_t)h;
}

/* Read the row of id: READ (locked) or GET.  *found 0 when there is none;
 * else res holds the record bytes and head their decoded fixed part. */
static idem_err_t read_row(idem_tx_t *tx, int stmt, const idem_key_id_t *id,
                           idem__tx_result_t *res, idem_record_t *head, int *found)
{
    idem__tx_param_t p[2] = {text_param(id->scope), text_param(id->key)};
    *found = 0;
    idem_err_t rc = tx->ops->exec(tx, stmt, NULL, p, 2, res);
    if (rc != IDEM_OK)
        return rc;
    if (!res->row)
        return IDEM_OK;
    if (res->col_null || idem_record_decode_head(res->col, res->col_len, head) != IDEM_OK) {
        idem__tx_seterr(tx, "the record of (%s, %s) in %s does not decode", id->scope, id->key,
                        tx->table);
        idem__tx_result_cleanup(res);
        return IDEM_E_CORRUPT;
    }
    *found = 1;
    return IDEM_OK;
}

/* Write rec under id: INSERT when old is NULL, else the compare-and-set
 * UPDATE on old's fence and state.  *changed 0 when another writer was first. */
static idem_err_t write_row(idem_tx_t *tx, const idem_key_id_t *id, const idem_record_t *rec,
                            const idem_record_t *old, int *changed)
{
    uint8_t *blob = NULL;
    size_t blob_len = 0;
    *changed = 0;
    idem_err_t rc = idem_record_encode(rec, &blob, &blob_len);
    if (rc != IDEM_OK)
        return rc;
    if (blob_len > IDEM__TX_VALUE_MAX) {
        idem_free(blob);
        return IDEM_E_TOOBIG;
    }
    idem__tx_param_t p[8] = {
        text_param(id->scope),
        text_param(id->key),
        text_param(state_name(rec->state)),
        int_param((int64_t)rec->fence),
        int_param(rec->expires_at_ms),
        {.kind = IDEM__TXP_BLOB, .p = blob, .len = blob_len},
        int_param(old != NULL ? (int64_t)old->fence : 0),
        text_param(old != NULL ? state_name(old->state) : ""),
    };
    idem__tx_result_t res;
    if (old == NULL)
        rc = tx->ops->exec(tx, IDEM__TX_SQL_INSERT, NULL, p, 6, &res);
    else
        rc = tx->ops->exec(tx, IDEM__TX_SQL_UPDATE, NULL, p, 8, &res);
    idem_free(blob);
    if (rc != IDEM_OK)
        return rc;
    *changed = res.changes > 0;
    idem__tx_result_cleanup(&res);
    return IDEM_OK;
}

/* ---- the key's life -------------------------------------------------------- */

idem_err_t idem_tx_begin(idem_tx_t *tx, const idem_key_id_t *id, const uint8_t fp[IDEM_FP_LEN],
                         int64_t now_ms, int64_t lease_until_ms, int64_t expires_at_ms,
                         idem_tx_begin_t *out)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (tx == NULL || out == NULL || fp == NULL || !id_ok_for(tx, id))
        return IDEM_E_INVAL;

    if (tx->sql[IDEM__TX_SQL_LOCK] != NULL) {
        idem__tx_param_t p = int_param(lock_id(tx->table, id));
        idem__tx_result_t res;
        idem_err_t rc = tx->ops->exec(tx, IDEM__TX_SQL_LOCK, NULL, &p, 1, &res);
        if (rc != IDEM_OK)
            return rc;
        int got = res.row && !res.col_null && res.col_len >= 1 &&
                  (res.col[0] == 1 || res.col[0] == 't');
        idem__tx_result_cleanup(&res);
        if (!got) {
            /* Another open transaction holds the key: its outcome is not
             * known yet, and the row may not even exist for us to read. */
            out->decision.kind = IDEM_DECIDE_IN_FLIGHT;
            out->decision.retry_after_s = 1;
            return IDEM_OK;
        }
    }

    for (int round = 0; round < BEGIN_ROUNDS; round++) {
        idem__tx_result_t res;
        idem_record_t head;
        int found;
        idem_err_t rc = read_row(tx, IDEM__TX_SQL_READ, id, &res, &head, &found);
        if (rc != IDEM_OK)
            return rc;
        idem_decision_t d = idem_decide(found ? &head : NULL, fp, now_ms);
        if (idem_decision_forwards(d.kind)) {
            idem_record_t next = {
                .state = IDEM_STATE_IN_PROGRESS,
                .fence = d.fence,
                .lease_until_ms = lease_until_ms,
                .expires_at_ms = expires_at_ms,
            };
            memcpy(next.fingerprint, fp, IDEM_FP_LEN);
            int changed;
            rc = write_row(tx, id, &next, found ? &head : NULL, &changed);
            idem__tx_result_cleanup(&res);
            if (rc != IDEM_OK)
                return rc;
            if (!changed)
                continue; /* another writer was first: read it and decide again */
            out->decision = d;
            return IDEM_OK;
        }
        if (d.kind == IDEM_DECIDE_REPLAY || d.kind == IDEM_DECIDE_NOT_RETAINED) {
            rc = idem_record_decode(res.col, res.col_len, &out->record);
            idem__tx_result_cleanup(&res);
            if (rc != IDEM_OK) {
                if (rc == IDEM_E_CORRUPT)
                    idem__tx_seterr(tx, "the record of (%s, %s) in %s does not decode",
                                    id->scope, id->key, tx->table);
                return rc;
            }
        } else {
            idem__tx_result_cleanup(&res);
        }
        out->decision = d;
        return IDEM_OK;
    }
    idem__tx_seterr(tx, "the record of (%s, %s) kept changing under begin", id->scope, id->key);
    return IDEM_E_RETRY;
}

/* The fenced ops' common part: read the row locked and check that it is
 * in_progress with fence.  On IDEM_OK head is the record's fixed part. */
static idem_err_t read_owned(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence,
                             idem_record_t *head)
{
    idem__tx_result_t res;
    int found;
    idem_err_t rc = read_row(tx, IDEM__TX_SQL_READ, id, &res, head, &found);
    if (rc != IDEM_OK)
        return rc;
    idem__tx_result_cleanup(&res);
    if (!found || head->state != IDEM_STATE_IN_PROGRESS || head->fence != fence)
        return IDEM_E_FENCE;
    return IDEM_OK;
}

/* Write next over an in_progress record with next->fence; IDEM_E_FENCE if
 * it is no longer there. */
static idem_err_t replace_owned(idem_tx_t *tx, const idem_key_id_t *id, const idem_record_t *next)
{
    idem_record_t old = {.state = IDEM_STATE_IN_PROGRESS, .fence = next->fence};
    int changed;
    idem_err_t rc = write_row(tx, id, next, &old, &changed);
    if (rc != IDEM_OK)
        return rc;
    return changed ? IDEM_OK : IDEM_E_FENCE;
}

idem_err_t idem_tx_complete(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence,
                            const idem_response_t *r, uint32_t flags, int64_t expires_at_ms)
{
    if (tx == NULL || !id_ok_for(tx, id) || r == NULL || (flags & ~IDEM_REC_NOT_RETAINED) != 0 ||
        (r->n_headers > 0 && r->headers == NULL) || (r->body_len > 0 && r->body == NULL) ||
        r->status < 0)
        return IDEM_E_INVAL;
    for (size_t i = 0; i < r->n_headers; i++)
        if ((r->headers[i].name_len > 0 && r->headers[i].name == NULL) ||
            (r->headers[i].value_len > 0 && r->headers[i].value == NULL))
            return IDEM_E_INVAL;
    idem_record_t probe = {.state = IDEM_STATE_COMPLETED, .response = *r};
    size_t size = idem_record_encoded_size(&probe);
    if (size == 0 || size > IDEM_TX_RESPONSE_MAX) {
        idem__tx_seterr(tx, "the response is larger than %u bytes encoded",
                        (unsigned)IDEM_TX_RESPONSE_MAX);
        return IDEM_E_TOOBIG;
    }
    idem_record_t head;
    idem_err_t rc = read_owned(tx, id, fence, &head);
    if (rc != IDEM_OK)
        return rc;
    idem_record_t next = head;
    next.state = IDEM_STATE_COMPLETED;
    next.flags = flags;
    next.lease_until_ms = 0;
    next.expires_at_ms = expires_at_ms;
    next.response = *r;
    next.owned = NULL;
    return replace_owned(tx, id, &next);
}

idem_err_t idem_tx_renew(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence,
                         int64_t lease_until_ms)
{
    if (tx == NULL || !id_ok_for(tx, id))
        return IDEM_E_INVAL;
    idem_record_t head;
    idem_err_t rc = read_owned(tx, id, fence, &head);
    if (rc != IDEM_OK)
        return rc;
    idem_record_t next = head;
    next.lease_until_ms = lease_until_ms;
    if (next.expires_at_ms < lease_until_ms)
        next.expires_at_ms = lease_until_ms;
    return replace_owned(tx, id, &next);
}

idem_err_t idem_tx_release(idem_tx_t *tx, const idem_key_id_t *id, uint64_t fence)
{
    if (tx == NULL || !id_ok_for(tx, id))
        return IDEM_E_INVAL;
    idem__tx_param_t p[3] = {text_param(id->scope), text_param(id->key),
                             int_param((int64_t)fence)};
    idem__tx_result_t res;
    idem_err_t rc = tx->ops->exec(tx, IDEM__TX_SQL_DELETE, NULL, p, 3, &res);
    if (rc != IDEM_OK)
        return rc;
    int changed = res.changes > 0;
    idem__tx_result_cleanup(&res);
    return changed ? IDEM_OK : IDEM_E_FENCE;
}

idem_err_t idem_tx_get(idem_tx_t *tx, const idem_key_id_t *id, int64_t now_ms,
                       idem_record_t *rec)
{
    if (rec != NULL)
        memset(rec, 0, sizeof *rec);
    if (tx == NULL || rec == NULL || !id_ok_for(tx, id))
        return IDEM_E_INVAL;
    idem__tx_result_t res;
    idem_record_t head;
    int found;
    idem_err_t rc = read_row(tx, IDEM__TX_SQL_GET, id, &res, &head, &found);
    if (rc != IDEM_OK)
        return rc;
    if (!found)
        return IDEM_E_NOTFOUND;
    if (now_ms >= head.expires_at_ms) {
        idem__tx_result_cleanup(&res);
        return IDEM_E_NOTFOUND;
    }
    rc = idem_record_decode(res.col, res.col_len, rec);
    idem__tx_result_cleanup(&res);
    return rc;
}

idem_err_t idem_tx_sweep(idem_tx_t *tx, int64_t now_ms, size_t max, size_t *removed)
{
    if (removed != NULL)
        *removed = 0;
    if (tx == NULL || removed == NULL)
        return IDEM_E_INVAL;
    if (max == 0)
        return IDEM_OK;
    if (max > IDEM_TX_SWEEP_MAX)
        max = IDEM_TX_SWEEP_MAX;
    idem__tx_param_t p[2] = {int_param(now_ms), int_param((int64_t)max)};
    idem__tx_result_t res;
    idem_err_t rc = tx->ops->exec(tx, IDEM__TX_SQL_SWEEP, NULL, p, 2, &res);
    if (rc != IDEM_OK)
        return rc;
    *removed = res.changes > 0 ? (size_t)res.changes : 0;
    idem__tx_result_cleanup(&res);
    return IDEM_OK;
}

/* ---- databases this build left out ---------------------------------------
 * A library built without SQLite or PostgreSQL (meson -Dsqlite=disabled,
 * -Dpostgres=disabled) keeps the entry point, so every build exports the
 * same symbols; it only says that the database is not there. */

#if !IDEM_HAVE_SQLITE
idem_err_t idem_tx_sqlite(struct sqlite3 *db, const char *table, idem_tx_t **out)
{
    (void)db;
    (void)table;
    if (out != NULL)
        *out = NULL;
    return IDEM_E_UNSUPPORTED;
}
#endif

#if !IDEM_HAVE_POSTGRES
idem_err_t idem_tx_postgres(struct pg_conn *conn, const char *table, idem_tx_t **out)
{
    (void)conn;
    (void)table;
    if (out != NULL)
        *out = NULL;
    return IDEM_E_UNSUPPORTED;
}
#endif
