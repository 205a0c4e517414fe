/* tests/unit/test_selfcheck.c - the start-up self-check (src/gateway/selfcheck.c).
 *
 * A working store passes: memory: and a real LMDB directory, and the
 * check's record is gone afterwards.  Then stores that answer every call
 * but do not do what idemd relies on, each made by wrapping a memory:
 * store in a vtable of this file (src/store/store_impl.h, the way a backend
 * is built): one that refuses every write as a Redis read-only replica
 * does, one whose claims are not exclusive (a claim overwrites whatever is
 * there), one that ignores fences, one that says it wrote a claim and
 * kept nothing, one whose reads see none of its writes, one whose delete
 * does nothing.  Each is refused with the
 * exact line idemd prints, and the wrapper's inner store is left empty
 * wherever the store lets the check delete its record.  A full store (one
 * that refuses writes for want of room) is not refused: the check says it
 * could not finish (1), and idemd starts with that warning.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/selfcheck.h"
#include "idem/alloc.h"
#include "store/store_impl.h"

#define T0 1700000000000LL

/* ---- a store that misbehaves ------------------------------------------------ */

typedef enum breakage {
    READONLY = 1,  /* every write refused, as a Redis replica answers */
    NOT_EXCLUSIVE, /* a claim overwrites whatever the key holds */
    NO_FENCE,      /* a completion is written whatever its fence */
    LOSES_WRITES,  /* a claim says "claim" and writes nothing */
    NO_DELETE,     /* a delete says done and does nothing */
    EMPTY_READS,   /* reads come from somewhere that has none of the writes */
    FULL,          /* every write refused for want of room, as Redis at maxmemory */
} breakage_t;

struct broken {
    struct idem_store base; /* first: a struct broken * is an idem_store_t * */
    idem_store_t *inner;    /* a memory: store that keeps the records */
    breakage_t mode;
};

static void b_close(idem_store_t *s)
{
    struct broken *b = (struct broken *)s;
    idem_store_close(b->inner);
    free(b);
}

/* One op on the inner store, bent by the mode. */
static void b_one(struct broken *b, idem_op_t *op)
{
    if (b->mode == NOT_EXCLUSIVE && op->kind == IDEM_OP_CLAIM)
        (void)idem_store_delete(b->inner, &op->id);
    if (b->mode == NO_FENCE && op->kind == IDEM_OP_COMPLETE) {
        idem_record_t rec;
        if (idem_store_get(b->inner, &op->id, op->now_ms, &rec) == IDEM_OK)
            op->fence = rec.fence;
        idem_record_cleanup(&rec);
    }
    if (b->mode == LOSES_WRITES && op->kind == IDEM_OP_CLAIM) {
        op->err = IDEM_OK;
        op->decision = (idem_decision_t){.kind = IDEM_DECIDE_CLAIM, .fence = 1};
        return;
    }
    if (b->mode == NO_DELETE && op->kind == IDEM_OP_DELETE) {
        op->err = IDEM_OK;
        return;
    }
    (void)idem_store_exec(b->inner, op, 1);
}

static idem_err_t b_exec(idem_store_t *s, idem_op_t *ops, size_t n)
{
    struct broken *b = (struct broken *)s;
    if (b->mode == FULL) {
        idem__store_seterr(s, "OOM command not allowed when used memory > 'maxmemory'.");
        return IDEM_E_STORE_FULL;
    }
    if (b->mode == READONLY) {
        /* libpq and Redis may say more than one line; the check prints one */
        idem__store_seterr(s, "READONLY You can't write against a read only replica.\nagain");
        return IDEM_E_STORE_DOWN;
    }
    for (size_t i = 0; i < n; i++)
        if (ops[i].err == IDEM_OK)
            b_one(b, &ops[i]);
    return IDEM_OK;
}

static idem_err_t b_get(idem_store_t *s, const idem_key_id_t *id, int64_t now_ms,
                        idem_record_t *rec)
{
    if (((struct broken *)s)->mode == EMPTY_READS)
        return IDEM_E_NOTFOUND;
    return idem_store_get(((struct broken *)s)->inner, id, now_ms, rec);
}

static idem_err_t b_sweep(idem_store_t *s, int64_t now_ms, size_t max, size_t *removed)
{
    return idem_store_sweep(((struct broken *)s)->inner, now_ms, max, removed);
}

static idem_err_t b_ping(idem_store_t *s)
{
    return idem_store_ping(((struct broken *)s)->inner);
}

static const struct idem_store_ops broken_ops = {
    .name = "broken",
    .scheme = "broken",
    .open = NULL, /* made by broken_store(), never from a URL */
    .close = b_close,
    .exec = b_exec,
    .get = b_get,
    .sweep = b_sweep,
    .ping = b_ping,
};

static idem_store_t *broken_store(breakage_t mode)
{
    struct broken *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->base.ops = &broken_ops;
    b->mode = mode;
    char err[256] = "";
    cr_assert_eq(idem_store_open("memory:", &b->inner, err, sizeof err), IDEM_OK, "%s", err);
    return &b->base;
}

/* How many records store holds (every one is past its retention by then). */
static size_t records_left(idem_store_t *store)
{
    size_t removed = 0;
    cr_assert_eq(idem_store_sweep(store, T0 + 10 * IDEM_SELFCHECK_TTL_MS, 1000, &removed),
                 IDEM_OK);
    return removed;
}

/* Run the check on a broken store and expect exactly line. */
static void expect_refused(breakage_t mode, const char *line, size_t left)
{
    idem_store_t *s = broken_store(mode);
    char err[1024];
    cr_expect_eq(idem__selfcheck_run(s, T0, err, sizeof err), -1);
    cr_expect_str_eq(err, line);
    cr_expect_eq(records_left(((struct broken *)s)->inner), left,
                 "records the check left behind");
    idem_store_close(s);
}

/* ---- working stores ------------------------------------------------------- */

Test(selfcheck, memory_store_passes_and_keeps_nothing)
{
    idem_store_t *s = NULL;
    char err[1024] = "unset";
    cr_assert_eq(idem_store_open("memory:", &s, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(idem__selfcheck_run(s, T0, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(err, "");
    cr_expect_eq(records_left(s), 0);
    /* twice, as a second idemd on the same store would */
    cr_expect_eq(idem__selfcheck_run(s, T0, err, sizeof err), 0, "%s", err);
    idem_store_close(s);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

Test(selfcheck, lmdb_store_passes_and_keeps_nothing)
{
    char dir[] = "/tmp/idem-selfcheck-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char url[128], err[1024];
    snprintf(url, sizeof url, "lmdb:%s/data", dir);
    idem_store_t *s = NULL;
    cr_assert_eq(idem_store_open(url, &s, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(idem__selfcheck_run(s, T0, err, sizeof err), 0, "%s", err);
    cr_expect_eq(records_left(s), 0);
    idem_store_close(s);
    nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- stores that must be refused --------------------------------------------- */

Test(selfcheck, read_only_replica_is_refused_in_its_own_words_on_one_line)
{
    expect_refused(READONLY,
                   "store self-check failed: claim: expected a claim with fence 1, got store "
                   "unavailable (READONLY You can't write against a read only replica. again)",
                   0);
}

Test(selfcheck, claims_that_are_not_exclusive_are_refused)
{
    expect_refused(NOT_EXCLUSIVE,
                   "store self-check failed: claim again: expected in_flight with fence 1 (the "
                   "first claim holds the key), got claim with fence 1: two claims of one key "
                   "both forward, the store does not make a claim exclusive",
                   0);
}

Test(selfcheck, a_store_that_ignores_fences_is_refused)
{
    expect_refused(NO_FENCE,
                   "store self-check failed: complete with a stale fence: expected a fence "
                   "refusal, got the completion written: the store does not check fences",
                   0);
}

Test(selfcheck, a_claim_that_was_not_kept_is_refused)
{
    /* a proxy that answers every claim with "claim" and drops the script */
    expect_refused(LOSES_WRITES,
                   "store self-check failed: claim again: expected in_flight with fence 1 (the "
                   "first claim holds the key), got claim with fence 1: two claims of one key "
                   "both forward, the store does not make a claim exclusive",
                   0);
}

Test(selfcheck, reads_that_do_not_see_the_writes_are_refused)
{
    /* a read replica that lags, behind a proxy; the claim it did write
     * is deleted by the check on its way out */
    expect_refused(EMPTY_READS,
                   "store self-check failed: read: expected an in_progress record with fence "
                   "1, got no record: the claim cannot be read back",
                   0);
}

Test(selfcheck, a_delete_that_does_nothing_is_refused)
{
    /* the record stays (the store would not delete it): it expires */
    expect_refused(NO_DELETE,
                   "store self-check failed: read after delete: expected no record, got a "
                   "completed record with fence 1 and status 200: the store did not delete it",
                   1);
}

Test(selfcheck, a_full_store_is_not_checked_but_not_refused)
{
    idem_store_t *s = broken_store(FULL);
    char err[1024];
    cr_expect_eq(idem__selfcheck_run(s, T0, err, sizeof err), 1);
    cr_expect_str_eq(err, "store self-check not finished: claim: the store has no room for the "
                          "check's record: store full (OOM command not allowed when used memory "
                          "> 'maxmemory'.); starting without it");
    idem_store_close(s);
}

/* ---- out of memory ------------------------------------------------------------ */

/* Every allocation of a check fails in turn: each run passes or fails with
 * the line's prefix, and nothing leaks (the sanitizer build says so). */
Test(selfcheck, each_failed_allocation_is_a_line_or_a_pass)
{
    idem_store_t *s = NULL;
    char err[1024];
    cr_assert_eq(idem_store_open("memory:", &s, err, sizeof err), IDEM_OK, "%s", err);
    int passed = 0;
    for (long n = 1; n <= 200 && !passed; n++) {
        idem_alloc_fail_after(n);
        int rc = idem__selfcheck_run(s, T0, err, sizeof err);
        idem_alloc_fail_after(0);
        if (rc == 0)
            passed = 1;
        else
            cr_expect(strncmp(err, "store self-check failed: ", 25) == 0, "n=%ld: %s", n, err);
    }
    cr_expect(passed, "the check never passed with enough allocations");
    idem_store_close(s);
}
