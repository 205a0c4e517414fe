/* src/gateway/selfcheck.c - the start-up self-check of idemd's store.
 *
 * See selfcheck.h for what is checked and why.  The steps run in a fixed
 * order, each one store call, with no retry: the store was just opened, so
 * a step that does not answer as a store must is a fact about the store,
 * not bad luck, and idemd must not serve on it.  Each step says what it
 * expected and what came back; where the answer has one meaning (two
 * claims that both forward, a stale fence obeyed) the line says it too.
 * The stale completion comes while the record is still in progress, so a
 * store that checks the state but not the fence is caught as well.
 *
 *   claim                        CLAIM, fresh key     -> claim, fence 1
 *   claim again                  CLAIM, same fp       -> in_flight, fence 1
 *   read                         GET                  -> in_progress, fence 1, our fp
 *   complete with a stale fence  COMPLETE fence 2     -> IDEM_E_FENCE
 *   complete                     COMPLETE fence 1     -> written (200, BODY)
 *   read after complete          GET                  -> completed, fence 1, 200, BODY
 *   delete                       DELETE               -> done
 *   read after delete            GET                  -> not found
 *
 * A batch-level failure (a read-only replica's READONLY, a cluster's
 * CLUSTERDOWN, a refused script) comes back as the error's words and the
 * store's own detail (idem_store_errstr), so the line names the problem in
 * the server's words.
 */
#include "gateway/selfcheck.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "idem/token.h"

#define PREFIX "store self-check failed: "
/* What the check stores as its response, and what a stale completion tries. */
#define BODY "idemd self-check"
#define STALE_BODY "stale"

/* The fingerprint of the check's requests: any fixed value will do. */
static const uint8_t check_fp[IDEM_FP_LEN] = {
    0x69, 0x64, 0x65, 0x6d, 0x64, 0x2d, 0x73, 0x65, 0x6c, 0x66, 0x63,
    0x68, 0x65, 0x63, 0x6b, 0x00, 0x5a, 0xa5, 0x5a, 0xa5, 0x01, 0x02,
    0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c,
};

struct check {
    idem_store_t *store;
    idem_key_id_t id;
    int64_t now;
    char *err;
    size_t errlen;
};

/* Make err one line: a server's detail may carry newlines (libpq's DETAIL). */
static void one_line(char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = ' ';
}

/* Write PREFIX "<step>: expected <expected>, got " and fmt into err. */
static int fail(struct check *c, const char *step, const char *expected, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(struct check *c, const char *step, const char *expected, const char *fmt, ...)
{
    if (c->err == NULL || c->errlen == 0)
        return -1;
    int n = snprintf(c->err, c->errlen, PREFIX "%s: expected %s, got ", step, expected);
    if (n >= 0 && (size_t)n < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    one_line(c->err);
    return -1;
}

/* A store error as "<words> (<the store's detail>)".  A full store is not a
 * broken one: it refuses new records until room is made, which idemd
 * reports and rides out like any time it fills up (/readyz store-full,
 * 503 store-unavailable), so the check stops there and says so (1). */
static int fail_err(struct check *c, const char *step, const char *expected, idem_err_t e)
{
    const char *detail = idem_store_errstr(c->store);
    char why[480];
    if (detail[0] == '\0')
        snprintf(why, sizeof why, "%s", idem_strerror(e));
    else
        snprintf(why, sizeof why, "%s (%.400s)", idem_strerror(e), detail);
    if (e != IDEM_E_STORE_FULL)
        return fail(c, step, expected, "%s", why);
    if (c->err != NULL && c->errlen > 0) {
        snprintf(c->err, c->errlen,
                 "store self-check not finished: %s: the store has no room for the check's "
                 "record: %s; starting without it",
                 step, why);
        one_line(c->err);
    }
    return 1;
}

/* A record in words, into buf. */
static const char *describe(const idem_record_t *r, char *buf, size_t len)
{
    if (r->state == IDEM_STATE_COMPLETED)
        snprintf(buf, len, "a completed record with fence %llu and status %d",
                 (unsigned long long)r->fence, r->response.status);
    else if (r->state == IDEM_STATE_IN_PROGRESS)
        snprintf(buf, len, "an in_progress record with fence %llu",
                 (unsigned long long)r->fence);
    else
        snprintf(buf, len, "a record in state %d", (int)r->state);
    return buf;
}

static void claim_op(const struct check *c, idem_op_t *op)
{
    memset(op, 0, sizeof *op);
    op->kind = IDEM_OP_CLAIM;
    op->id = c->id;
    memcpy(op->fp, check_fp, sizeof op->fp);
    op->now_ms = c->now;
    op->lease_until_ms = c->now + IDEM_SELFCHECK_TTL_MS;
    op->expires_at_ms = c->now + IDEM_SELFCHECK_TTL_MS;
}

/* Run one claim; 0 with *d set, else fail_err's answer. */
static int run_claim(struct check *c, const char *step, const char *expected,
                     idem_decision_t *d)
{
    idem_op_t op;
    claim_op(c, &op);
    idem_err_t e = idem_store_exec(c->store, &op, 1);
    idem_record_cleanup(&op.record);
    if (e == IDEM_OK)
        e = op.err;
    if (e != IDEM_OK)
        return fail_err(c, step, expected, e);
    *d = op.decision;
    return 0;
}

/* Run one completion with fence and status; the op's error, or the batch's. */
static idem_err_t run_complete(struct check *c, uint64_t fence, int status, const char *body)
{
    idem_response_t resp = {
        .status = status, .body = (const uint8_t *)body, .body_len = strlen(body)};
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_COMPLETE;
    op.id = c->id;
    op.fence = fence;
    op.response = &resp;
    op.expires_at_ms = c->now + IDEM_SELFCHECK_TTL_MS;
    idem_err_t e = idem_store_exec(c->store, &op, 1);
    return e != IDEM_OK ? e : op.err;
}

/* The eight steps, in order: 0, or at the first that fails -1 (or 1 when
 * the store is full). */
static int steps(struct check *c)
{
    char what[160];
    idem_decision_t d = {0};

    /* 1. A fresh key is claimed with the first fence. */
    const char *want = "a claim with fence 1";
    int rc = run_claim(c, "claim", want, &d);
    if (rc != 0)
        return rc;
    if (d.kind != IDEM_DECIDE_CLAIM || d.fence != 1)
        return fail(c, "claim", want, "%s with fence %llu", idem_decision_name(d.kind),
                    (unsigned long long)d.fence);

    /* 2. The same request again while the lease runs: the first holds it. */
    want = "in_flight with fence 1 (the first claim holds the key)";
    rc = run_claim(c, "claim again", want, &d);
    if (rc != 0)
        return rc;
    if (idem_decision_forwards(d.kind))
        return fail(c, "claim again", want,
                    "%s with fence %llu: two claims of one key both forward, the store does "
                    "not make a claim exclusive",
                    idem_decision_name(d.kind), (unsigned long long)d.fence);
    if (d.kind != IDEM_DECIDE_IN_FLIGHT || d.fence != 1)
        return fail(c, "claim again", want, "%s with fence %llu", idem_decision_name(d.kind),
                    (unsigned long long)d.fence);

    /* 3. The claim is there to be read. */
    idem_record_t rec;
    want = "an in_progress record with fence 1";
    idem_err_t e = idem_store_get(c->store, &c->id, c->now, &rec);
    if (e == IDEM_E_NOTFOUND)
        return fail(c, "read", want, "no record: the claim cannot be read back");
    if (e != IDEM_OK)
        return fail_err(c, "read", want, e);
    int ok = rec.state == IDEM_STATE_IN_PROGRESS && rec.fence == 1 &&
             memcmp(rec.fingerprint, check_fp, IDEM_FP_LEN) == 0;
    if (!ok && rec.state == IDEM_STATE_IN_PROGRESS && rec.fence == 1)
        snprintf(what, sizeof what, "one with another fingerprint");
    else
        describe(&rec, what, sizeof what);
    idem_record_cleanup(&rec);
    if (!ok)
        return fail(c, "read", want, "%s", what);

    /* 4. A stale owner (a fence that is not the record's) is refused
     * while the record is in progress: only the fence tells the two apart. */
    want = "a fence refusal";
    e = run_complete(c, 2, 500, STALE_BODY);
    if (e == IDEM_OK)
        return fail(c, "complete with a stale fence", want,
                    "the completion written: the store does not check fences");
    if (e != IDEM_E_FENCE)
        return fail_err(c, "complete with a stale fence", want, e);

    /* 5. The owner completes it. */
    want = "the completion with fence 1 written";
    e = run_complete(c, 1, 200, BODY);
    if (e == IDEM_E_FENCE)
        return fail(c, "complete", want, "a fence refusal: the store lost the claim's fence");
    if (e != IDEM_OK)
        return fail_err(c, "complete", want, e);

    /* 6. The owner's completion is what is stored. */
    want = "a completed record with fence 1 and status 200";
    e = idem_store_get(c->store, &c->id, c->now, &rec);
    if (e == IDEM_E_NOTFOUND)
        return fail(c, "read after complete", want,
                    "no record: the store did not keep the completion");
    if (e != IDEM_OK)
        return fail_err(c, "read after complete", want, e);
    ok = rec.state == IDEM_STATE_COMPLETED && rec.fence == 1 && rec.response.status == 200 &&
         rec.response.body_len == strlen(BODY) &&
         memcmp(rec.response.body, BODY, strlen(BODY)) == 0;
    if (!ok && rec.state == IDEM_STATE_COMPLETED && rec.fence == 1 &&
        rec.response.status == 200)
        snprintf(what, sizeof what, "one with another body (%zu bytes)", rec.response.body_len);
    else
        describe(&rec, what, sizeof what);
    idem_record_cleanup(&rec);
    if (!ok)
        return fail(c, "read after complete", want, "%s", what);

    /* 7. and 8. An operator's delete removes it. */
    want = "the record deleted";
    e = idem_store_delete(c->store, &c->id);
    if (e == IDEM_E_NOTFOUND)
        return fail(c, "delete", want, "not found: the store did not keep the record");
    if (e != IDEM_OK)
        return fail_err(c, "delete", want, e);
    want = "no record";
    e = idem_store_get(c->store, &c->id, c->now, &rec);
    if (e == IDEM_OK) {
        describe(&rec, what, sizeof what);
        idem_record_cleanup(&rec);
        return fail(c, "read after delete", want, "%s: the store did not delete it", what);
    }
    if (e != IDEM_E_NOTFOUND)
        return fail_err(c, "read after delete", want, e);
    return 0;
}

int idem__selfcheck_run(idem_store_t *store, int64_t now_ms, char *err, size_t errlen)
{
    struct check c = {.store = store, .now = now_ms, .err = err, .errlen = errlen};
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    char token[IDEM_TOKEN_LEN + 1];
    idem_err_t e = idem_token_generate(NULL, token);
    if (e != IDEM_OK)
        return fail(&c, "key", "random bytes for the check's key", "%s", idem_strerror(e));
    snprintf(c.id.scope, sizeof c.id.scope, "%s", IDEM_SELFCHECK_SCOPE);
    snprintf(c.id.key, sizeof c.id.key, "%ld-%s", (long)getpid(), token);
    int rc = steps(&c);
    if (rc == 0)
        return 0;
    /* Leave nothing behind that need not be: a store that took the claim
     * and failed later may still delete it (else it expires). */
    (void)idem_store_delete(store, &c.id);
    return rc;
}
