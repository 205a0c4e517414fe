/* tests/store/test_store_faults.c - every store, failing at every step.
 *
 * SQLite's and curl's torture discipline over the store API.  A scenario is
 * a short fixed sequence of calls (open, exec batches, get, sweep, ping)
 * that covers one area of the store contract.  For each backend, each
 * scenario and each kind of fault, the driver runs the scenario with fault
 * number n armed, for n = 1, 2, ... until a run completes without the fault
 * being hit, so every allocation and every I/O point the scenario reaches
 * fails once in some run.  The kinds:
 *
 *   alloc      idem_alloc_fail_after(n): the nth allocation of libidem and
 *              every later one fail (out of memory for good);
 *   io         idem__store_fail_io_after(n): the nth store I/O fails once
 *              (an LMDB call gives EIO; a Redis or PostgreSQL connection is
 *              lost right after the server answered, the hardest case);
 *   io_sticky  idem__store_fail_io_from(n): that I/O and every later one
 *              fail, so reconnects fail too (the server went away).
 *
 * What each run checks:
 *   (a) every call returns IDEM_OK or a clean error (IDEM_E_NOMEM, _IO,
 *       _STORE_DOWN, _STORE_FULL), or the semantic answer the contract
 *       gives (FENCE, NOTFOUND, EXISTS), never a crash, an abort or a hang;
 *       an op that failed never says it forwards;
 *   (b) every answer agrees with a model: idem__store_apply (the semantics
 *       every backend must have) run over a copy of the records in the
 *       test.  A batch that failed is not applied; on Redis and PostgreSQL
 *       a batch whose answer was lost may or may not have been applied, as
 *       a whole, so the model then keeps both possible worlds and later
 *       answers tell them apart.  After the run the fault is disarmed, and
 *       the store must work again (Redis and PostgreSQL after their
 *       backoff): every key the scenario touched reads back as one of the
 *       worlds (a batch applied whole or not at all), and a fresh key can be
 *       claimed and completed;
 *   (c) no leak: the ASan build's LeakSanitizer checks each test process.
 *
 * Why these scenarios rather than the 233 conformance cases: those assert
 * exact answers, which a fault changes by design, and running each at every
 * n would take hours.  The scenarios below reach every op kind, every
 * decision path (claim, in-flight, replay, mismatch, takeover), batches of
 * several ops over several keys, get, sweep, ping, open, and on the network
 * stores the reconnect after a lost connection and after a failed connect.
 *
 * The run count per (backend, scenario, kind) is printed on stderr.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/store.h"
#include "store/store_impl.h" /* idem__store_apply, idem__store_fail_io_* */
#include "store_fixture.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#endif

#define LEASE 30000ll
#define TTL 86400000ll
#define NKEYS 6         /* keys a scenario may touch */
#define MAX_OPS 4       /* ops in one step's batch */
#define MAX_STEPS 12
#define WORLDS_MAX 4096 /* possible states the model keeps at once */
#define RUNS_MAX 3000   /* n beyond this: the scenario never stops hitting faults */
#define RECOVER_MS 8000 /* the longest a network store may stay down after disarm */

enum backend { B_memory, B_lmdb, B_redis, B_postgres, B_rocksdb };
enum fault { F_alloc, F_io, F_io_sticky };
static const char *const backend_name[] = {"memory", "lmdb", "redis", "postgres", "rocksdb"};
static const char *const fault_name[] = {"alloc", "io", "io_sticky"};

/* ---- checks ------------------------------------------------------------------
 *
 * The scenarios run on a thread of their own, not on Criterion's, and each
 * test asks LeakSanitizer itself, so a leak fails the very (backend, n) run
 * that made it, whatever the runner makes of the report.  Criterion's assertions
 * must not fire on another thread, so CHECK records the failure and jumps
 * back to the thread's start, and the test thread asserts on it. */

static jmp_buf bail;
static char failure[1024];

static _Noreturn void check_failed(int line, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static _Noreturn void check_failed(int line, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(failure, sizeof failure, "line %d: ", line);
    va_start(ap, fmt);
    vsnprintf(failure + n, sizeof failure - (size_t)n, fmt, ap);
    va_end(ap);
    longjmp(bail, 1);
}

#define CHECK(cond, ...)                           \
    do {                                           \
        if (!(cond))                               \
            check_failed(__LINE__, __VA_ARGS__);   \
    } while (0)

/* ---- scenarios ------------------------------------------------------------ */

/* One op of a step.  Times are offsets from the run's t0. */
struct opdef {
    idem_op_kind_t kind;
    int key;       /* index into the scenario's keys */
    int fp;        /* CLAIM: fingerprint byte */
    int64_t now;   /* CLAIM, TOKEN_* */
    int64_t lease; /* CLAIM, RENEW, HOLD */
    int64_t exp;   /* CLAIM, COMPLETE, HOLD, TOKEN_ISSUE */
    uint64_t fence;
};

enum step_kind { S_EXEC = 1, S_GET, S_SWEEP, S_PING };

struct step {
    enum step_kind kind;
    int nops;
    struct opdef ops[MAX_OPS];
    int key;     /* S_GET */
    int64_t now; /* S_GET, S_SWEEP */
};

struct scenario {
    const char *name;
    int arm_before_open; /* the faults cover opening the store too */
    int nsteps;
    struct step steps[MAX_STEPS];
};

#define CLAIM(k, f, t) {IDEM_OP_CLAIM, k, f, t, (t) + LEASE, TTL, 0}
#define CLAIM_EXP(k, f, t, e) {IDEM_OP_CLAIM, k, f, t, (t) + LEASE, e, 0}
#define COMPLETE(k, fe) {IDEM_OP_COMPLETE, k, 0, 0, 0, TTL, fe}
#define RENEW(k, fe, l) {IDEM_OP_RENEW, k, 0, 0, l, 0, fe}
#define HOLD(k, fe) {IDEM_OP_HOLD, k, 0, 0, LEASE, TTL, fe}
#define RELEASE(k, fe) {IDEM_OP_RELEASE, k, 0, 0, 0, 0, fe}
#define DELETE(k) {IDEM_OP_DELETE, k, 0, 0, 0, 0, 0}
#define TISSUE(k, t) {IDEM_OP_TOKEN_ISSUE, k, 0, t, 0, TTL, 0}
#define TUSE(k, t) {IDEM_OP_TOKEN_USE, k, 0, t, 0, 0, 0}
#define TRESTORE(k, t) {IDEM_OP_TOKEN_RESTORE, k, 0, t, 0, 0, 0}
#define EXEC1(o) {S_EXEC, 1, {o}, 0, 0}
#define EXECN(n, ...) {S_EXEC, n, {__VA_ARGS__}, 0, 0}
#define GET(k, t) {S_GET, 0, {{0}}, k, t}
#define SWEEP(t) {S_SWEEP, 0, {{0}}, 0, t}
#define PING {S_PING, 0, {{0}}, 0, 0}

enum { A, B, C, D, T }; /* key indices; NKEYS - 1 is the verification's fresh key */

static const struct scenario scen_open_close = {
    "open_close", 1, 3, {PING, EXEC1(CLAIM(A, 1, 0)), GET(A, 1)}};

static const struct scenario scen_claim_complete_replay = {
    "claim_complete_replay", 0, 5,
    {EXEC1(CLAIM(A, 1, 0)), EXEC1(CLAIM(A, 1, 10)), EXEC1(COMPLETE(A, 1)),
     EXEC1(CLAIM(A, 1, 20)), EXEC1(CLAIM(A, 2, 30))}};

static const struct scenario scen_takeover = {
    "takeover", 0, 5,
    {EXEC1(CLAIM(A, 1, 0)), EXEC1(CLAIM(A, 1, LEASE)), EXEC1(COMPLETE(A, 1)),
     EXEC1(COMPLETE(A, 2)), EXEC1(CLAIM(A, 1, LEASE + 1))}};

static const struct scenario scen_renew_hold_release = {
    "renew_hold_release", 0, 7,
    {EXEC1(CLAIM(A, 1, 0)), EXEC1(RENEW(A, 1, 2 * LEASE)), EXEC1(CLAIM(A, 1, LEASE)),
     EXEC1(CLAIM(B, 1, 0)), EXEC1(HOLD(B, 1)), EXEC1(RELEASE(A, 1)),
     EXEC1(CLAIM(A, 1, LEASE + 2))}};

static const struct scenario scen_delete_get = {
    "delete_get", 0, 6,
    {EXEC1(CLAIM(A, 1, 0)), EXEC1(COMPLETE(A, 1)), GET(A, 5), EXEC1(DELETE(A)),
     EXEC1(DELETE(A)), GET(A, 6)}};

static const struct scenario scen_tokens = {
    "tokens", 0, 6,
    {EXEC1(TISSUE(T, 0)), EXEC1(TISSUE(T, 1)), EXEC1(TUSE(T, 2)), EXEC1(TUSE(T, 3)),
     EXEC1(TRESTORE(T, 4)), EXEC1(TUSE(T, 5))}};

static const struct scenario scen_batches = {
    "batches", 0, 4,
    {EXECN(3, CLAIM(A, 1, 0), CLAIM(B, 1, 0), CLAIM(C, 1, 0)),
     EXECN(4, COMPLETE(A, 1), RENEW(B, 1, 2 * LEASE), RELEASE(C, 1), CLAIM(D, 1, 0)),
     EXECN(4, CLAIM(A, 1, 5), CLAIM(A, 2, 5), DELETE(B), TISSUE(T, 5)),
     EXECN(4, CLAIM(C, 3, 6), COMPLETE(C, 1), TUSE(T, 6), COMPLETE(D, 1))}};

/* Sweep last: after it, an expired record and a swept one look alike to get. */
static const struct scenario scen_sweep = {
    "sweep", 0, 4,
    {EXECN(2, CLAIM_EXP(A, 1, 0, 1000), CLAIM_EXP(B, 1, 0, 1000)), EXEC1(CLAIM(C, 1, 0)),
     PING, SWEEP(2000)}};

/* ---- the model: idem__store_apply over records kept in the test ----------- */

/* One possible state of the scenario's keys: each an encoded record or absent. */
struct world {
    uint8_t *v[NKEYS];
    size_t l[NKEYS];
};

static struct world *worlds;
static size_t nworlds;

static void world_free(struct world *w)
{
    for (int k = 0; k < NKEYS; k++)
        free(w->v[k]);
    memset(w, 0, sizeof *w);
}

static struct world world_copy(const struct world *w)
{
    struct world c;
    memset(&c, 0, sizeof c);
    for (int k = 0; k < NKEYS; k++) {
        if (w->v[k] != NULL) {
            c.v[k] = malloc(w->l[k]);
            CHECK(c.v[k] != NULL, "out of memory in the test");
            memcpy(c.v[k], w->v[k], w->l[k]);
            c.l[k] = w->l[k];
        }
    }
    return c;
}

static int world_eq(const struct world *a, const struct world *b)
{
    for (int k = 0; k < NKEYS; k++) {
        if ((a->v[k] == NULL) != (b->v[k] == NULL) || a->l[k] != b->l[k])
            return 0;
        if (a->v[k] != NULL && memcmp(a->v[k], b->v[k], a->l[k]) != 0)
            return 0;
    }
    return 1;
}

/* Add w to the next set unless an equal world is there (takes ownership). */
static void world_add(struct world *set, size_t *n, struct world *w)
{
    for (size_t i = 0; i < *n; i++) {
        if (world_eq(&set[i], w)) {
            world_free(w);
            return;
        }
    }
    CHECK((*n) < (WORLDS_MAX), "the model holds too many possible worlds");
    set[(*n)++] = *w;
}

/* A malloc'd encoding of rec (the test's own memory: never under injection). */
static uint8_t *encode(const idem_record_t *rec, size_t *len)
{
    *len = idem_record_encoded_size(rec);
    CHECK(*len > 0, "a record that cannot be encoded");
    uint8_t *b = malloc(*len);
    CHECK(b != NULL, "out of memory in the test");
    idem_record_encode_into(rec, b);
    return b;
}

/* Whether key k holds a record live at now (get would return it). */
static int live(const struct world *w, int k, int64_t now)
{
    idem_record_t h;
    return w->v[k] != NULL && idem_record_decode_head(w->v[k], w->l[k], &h) == IDEM_OK &&
           h.expires_at_ms > now;
}

/* ---- a run -------------------------------------------------------------------- */

static const idem_header_t hdrs[] = {{"Content-Type", 12, "text/plain", 10},
                                     {"X-Bin", 5, "\x00\xff", 2}};
static const idem_response_t resp = {201, hdrs, 2, (const uint8_t *)"made\0it", 7};

struct run {
    enum backend be;
    const struct scenario *sc;
    enum fault kind;
    long n;
    int64_t t0;
    char keys[NKEYS][64];
    idem_store_t *st;
    char where[160]; /* for messages */
};

static int fault_class(idem_err_t e)
{
    return e == IDEM_E_NOMEM || e == IDEM_E_IO || e == IDEM_E_STORE_DOWN ||
           e == IDEM_E_STORE_FULL;
}

/* The backends whose failed batch may have been applied (a lost answer). */
static int outcome_may_be_unknown(const struct run *r, idem_err_t rc)
{
    return (r->be == B_redis || r->be == B_postgres) && rc != IDEM_E_NOMEM;
}

static idem_key_id_t key_id(const struct run *r, int k)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "anonymous");
    snprintf(id.key, sizeof id.key, "%s", r->keys[k]);
    return id;
}

static idem_op_t make_op(const struct run *r, const struct opdef *d)
{
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = d->kind;
    op.id = key_id(r, d->key);
    memset(op.fp, d->fp, IDEM_FP_LEN);
    op.now_ms = r->t0 + d->now;
    op.lease_until_ms = r->t0 + d->lease;
    op.expires_at_ms = r->t0 + d->exp;
    op.fence = d->fence;
    if (d->kind == IDEM_OP_COMPLETE)
        op.response = &resp;
    return op;
}

/* Apply def to world w (in place) as every backend must.  With obs, also
 * check that the store's answer obs agrees; returns 0 when it does not. */
static int model_op(const struct run *r, const struct opdef *d, struct world *w,
                    const idem_op_t *obs)
{
    idem_op_t m = make_op(r, d);
    idem_record_t next;
    int k = d->key;
    idem__store_action_t act = idem__store_apply(&m, w->v[k], w->l[k], &next);

    /* A replay's decoded copy is the model's own (and may fail under the
     * injection, which is not the store's answer): compare bytes instead. */
    int replay = m.kind == IDEM_OP_CLAIM && m.decision.kind == IDEM_DECIDE_REPLAY;
    idem_record_cleanup(&m.record);
    if (replay)
        m.err = IDEM_OK;
    if (obs != NULL) {
        if (obs->err != m.err || obs->token != m.token ||
            obs->decision.kind != m.decision.kind || obs->decision.fence != m.decision.fence ||
            obs->decision.retry_after_s != m.decision.retry_after_s)
            return 0;
        if (replay) {
            size_t len;
            uint8_t *b = encode(&obs->record, &len);
            int same = len == w->l[k] && memcmp(b, w->v[k], len) == 0;
            free(b);
            if (!same)
                return 0;
        }
    }
    if (act == IDEM__STORE_PUT) {
        size_t len;
        uint8_t *b = encode(&next, &len);
        free(w->v[k]);
        w->v[k] = b;
        w->l[k] = len;
    } else if (act == IDEM__STORE_DEL) {
        free(w->v[k]);
        w->v[k] = NULL;
        w->l[k] = 0;
    }
    return 1;
}

/* Replace the worlds by those that agree with what one exec answered. */
static void model_exec(struct run *r, const struct step *s, const idem_op_t *ops, idem_err_t rc,
                       int i_step)
{
    struct world *next = calloc(WORLDS_MAX, sizeof *next);
    size_t nnext = 0;
    CHECK(next != NULL, "out of memory in the test");

    for (size_t wi = 0; wi < nworlds; wi++) {
        if (rc != IDEM_OK) {
            /* Nothing written, or (a lost answer) maybe the whole batch. */
            struct world same = world_copy(&worlds[wi]);
            world_add(next, &nnext, &same);
            if (outcome_may_be_unknown(r, rc)) {
                struct world all = world_copy(&worlds[wi]);
                for (int i = 0; i < s->nops; i++)
                    model_op(r, &s->ops[i], &all, NULL);
                world_add(next, &nnext, &all);
            }
            continue;
        }
        struct world w = world_copy(&worlds[wi]);
        int ok = 1;
        for (int i = 0; i < s->nops && ok; i++) {
            if (fault_class(ops[i].err))
                continue; /* this op failed alone and wrote nothing */
            ok = model_op(r, &s->ops[i], &w, &ops[i]);
        }
        if (ok)
            world_add(next, &nnext, &w);
        else
            world_free(&w);
    }
    CHECK((nnext) > (0),
                 "%s: step %d: the store's answers agree with no state the batch could "
                 "have left (rc %s)",
                 r->where, i_step, idem_err_name(rc));
    for (size_t i = 0; i < nworlds; i++)
        world_free(&worlds[i]);
    free(worlds);
    worlds = next;
    nworlds = nnext;
}

/* Keep the worlds in which get(key, now) answers what the store answered. */
static void model_get(struct run *r, int k, int64_t now, idem_err_t rc, const idem_record_t *rec,
                      const char *when)
{
    uint8_t *b = NULL;
    size_t len = 0;
    if (rc == IDEM_OK)
        b = encode(rec, &len);
    size_t keep = 0;
    for (size_t i = 0; i < nworlds; i++) {
        struct world *w = &worlds[i];
        int agree = rc == IDEM_OK
                        ? live(w, k, now) && w->l[k] == len && memcmp(w->v[k], b, len) == 0
                        : !live(w, k, now);
        if (agree)
            worlds[keep++] = *w;
        else
            world_free(w);
    }
    free(b);
    nworlds = keep;
    CHECK((nworlds) > (0), "%s: %s: get of key %d answered %s, which no possible state gives",
                 r->where, when, k, idem_err_name(rc));
}

/* A sweep at now removes what expired; get cannot tell that from absent. */
static void model_sweep(int64_t now)
{
    for (size_t i = 0; i < nworlds; i++) {
        for (int k = 0; k < NKEYS; k++) {
            idem_record_t h;
            if (worlds[i].v[k] != NULL &&
                idem_record_decode_head(worlds[i].v[k], worlds[i].l[k], &h) == IDEM_OK &&
                h.expires_at_ms <= now) {
                free(worlds[i].v[k]);
                worlds[i].v[k] = NULL;
                worlds[i].l[k] = 0;
            }
        }
    }
}

static void models_reset(void)
{
    for (size_t i = 0; i < nworlds; i++)
        world_free(&worlds[i]);
    free(worlds);
    worlds = calloc(WORLDS_MAX, sizeof *worlds);
    CHECK(worlds != NULL, "out of memory in the test");
    nworlds = 1; /* one world: every key absent */
}

/* ---- backends --------------------------------------------------------------- */

static char lmdb_dir[64];
static char redis_prefix[64];
static char pg_table[64];

static void redis_cleanup(void)
{
    fx_redis_delete_prefix(redis_prefix);
}

static void pg_cleanup(void)
{
    fx_pg_drop(pg_table);
}

static int lmdb_atexit;

static void lmdb_cleanup(void)
{
    if (lmdb_dir[0] != '\0')
        fx_rm_tree(lmdb_dir);
    lmdb_dir[0] = '\0';
}

static const char *env_url(const char *var)
{
    const char *u = fx_getenv(var);
    CHECK(u != NULL,
              "%s is not set: run `scripts/services.sh start DIR` and export what it prints",
              var);
    return u;
}

/* The store URL of a backend: a directory per run, one prefix or table per
 * test process (a table per run when fresh: the open makes it under the
 * faults), and keys that differ per run. */
static void backend_url(enum backend be, int fresh, char *url, size_t len)
{
    const char *base;
    switch (be) {
    case B_memory:
        snprintf(url, len, "memory:");
        return;
    case B_lmdb:
        /* A directory per run: a sweep visits the whole store. */
        lmdb_cleanup();
        CHECK(fx_make_dir(lmdb_dir, sizeof lmdb_dir, "faults") == 0, "mkdtemp: %s",
              strerror(errno));
        if (!lmdb_atexit++)
            atexit(lmdb_cleanup);
        snprintf(url, len, "lmdb:%s", lmdb_dir);
        return;
    case B_rocksdb:
        lmdb_cleanup(); /* a directory per run, as lmdb's */
        CHECK(fx_make_dir(lmdb_dir, sizeof lmdb_dir, "faults") == 0, "mkdtemp: %s",
              strerror(errno));
        if (!lmdb_atexit++)
            atexit(lmdb_cleanup);
        snprintf(url, len, "rocksdb:%s", lmdb_dir);
        return;
    case B_redis:
        base = env_url("IDEM_TEST_REDIS_URL");
        if (redis_prefix[0] == '\0') {
            snprintf(redis_prefix, sizeof redis_prefix, "idemfault:%d:", (int)getpid());
            atexit(redis_cleanup);
        }
        CHECK(fx_url_with(url, len, base, "prefix", redis_prefix, NULL) == 0,
              "IDEM_TEST_REDIS_URL is too long");
        return;
    case B_postgres:
        base = env_url("IDEM_TEST_PG_URL");
        if (fresh || pg_table[0] == '\0') {
            /* A scenario that opens under faults creates its table each run. */
            static unsigned tables;
            pg_cleanup();
            snprintf(pg_table, sizeof pg_table, "idem_fault_%d_%u", (int)getpid(), tables);
            if (tables++ == 0)
                atexit(pg_cleanup);
        }
        CHECK(fx_url_with(url, len, base, "table", pg_table, NULL) == 0,
              "IDEM_TEST_PG_URL is too long");
        return;
    }
}

/* ---- the driver ----------------------------------------------------------------- */

static void arm(enum fault kind, long n)
{
    if (kind == F_alloc)
        idem_alloc_fail_after(n);
    else if (kind == F_io)
        idem__store_fail_io_after(n);
    else
        idem__store_fail_io_from(n);
}

static void disarm(void)
{
    idem_alloc_fail_after(0);
    idem__store_fail_io_after(0);
}

/* How many faults have fired so far (of any kind). */
static unsigned long fired(void)
{
    return idem_alloc_failures() + idem__store_io_injected();
}

static void check_rc(const struct run *r, int i_step, const char *what, idem_err_t rc)
{
    CHECK(rc == IDEM_OK || fault_class(rc), "%s: step %d: %s returned %s (%s)", r->where,
              i_step, what, idem_err_name(rc), idem_store_errstr(r->st));
}

static void run_step(struct run *r, int i, const struct step *s)
{
    idem_err_t rc;
    switch (s->kind) {
    case S_EXEC: {
        idem_op_t ops[MAX_OPS];
        for (int j = 0; j < s->nops; j++)
            ops[j] = make_op(r, &s->ops[j]);
        rc = idem_store_exec(r->st, ops, (size_t)s->nops);
        check_rc(r, i, "exec", rc);
        for (int j = 0; j < s->nops; j++) {
            idem_err_t e = ops[j].err;
            CHECK(e == IDEM_OK || fault_class(e) || e == IDEM_E_FENCE ||
                          e == IDEM_E_NOTFOUND || e == IDEM_E_EXISTS,
                      "%s: step %d op %d: err %s", r->where, i, j, idem_err_name(e));
            if (e != IDEM_OK) {
                CHECK(!idem_decision_forwards(ops[j].decision.kind),
                          "%s: step %d op %d failed (%s) but says it forwards", r->where, i, j,
                          idem_err_name(e));
                CHECK(ops[j].record.owned == NULL, "%s: step %d op %d: a failed op holds "
                      "a record", r->where, i, j);
            }
            if (rc != IDEM_OK)
                CHECK((e) == (rc), "%s: step %d: a failed batch's op has err %s", r->where,
                             i, idem_err_name(e));
        }
        model_exec(r, s, ops, rc, i);
        for (int j = 0; j < s->nops; j++)
            idem_record_cleanup(&ops[j].record);
        return;
    }
    case S_GET: {
        idem_record_t rec;
        idem_key_id_t id = key_id(r, s->key);
        rc = idem_store_get(r->st, &id, r->t0 + s->now, &rec);
        CHECK(rc == IDEM_OK || rc == IDEM_E_NOTFOUND || fault_class(rc),
                  "%s: step %d: get returned %s", r->where, i, idem_err_name(rc));
        if (!fault_class(rc))
            model_get(r, s->key, r->t0 + s->now, rc, &rec, "get");
        idem_record_cleanup(&rec);
        return;
    }
    case S_SWEEP: {
        size_t removed = 99;
        rc = idem_store_sweep(r->st, r->t0 + s->now, 100, &removed);
        check_rc(r, i, "sweep", rc);
        CHECK(removed <= 100, "%s: step %d: sweep removed %zu > max", r->where, i, removed);
        model_sweep(r->t0 + s->now);
        return;
    }
    case S_PING:
        rc = idem_store_ping(r->st);
        CHECK(rc == IDEM_OK || rc == IDEM_E_STORE_DOWN, "%s: step %d: ping returned %s",
                  r->where, i, idem_err_name(rc));
        return;
    }
}

/* After the faults: the store works again and holds one of the worlds. */
static void verify(struct run *r, int64_t t_end)
{
    int64_t give_up = fx_real_ms() + RECOVER_MS;
    idem_err_t rc;
    while ((rc = idem_store_ping(r->st)) != IDEM_OK && fx_real_ms() < give_up)
        usleep(20000); /* a network store waits out its backoff */
    CHECK((rc) == (IDEM_OK), "%s: the store did not recover: %s", r->where,
                 idem_store_errstr(r->st));

    for (int k = 0; k < NKEYS - 1; k++) {
        idem_record_t rec;
        idem_key_id_t id = key_id(r, k);
        rc = idem_store_get(r->st, &id, t_end, &rec);
        CHECK(rc == IDEM_OK || rc == IDEM_E_NOTFOUND, "%s: reading key %d back: %s (%s)",
                  r->where, k, idem_err_name(rc), idem_store_errstr(r->st));
        model_get(r, k, t_end, rc, &rec, "after the run");
        idem_record_cleanup(&rec);
    }

    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    op.id = key_id(r, NKEYS - 1);
    op.now_ms = t_end;
    op.lease_until_ms = t_end + LEASE;
    op.expires_at_ms = t_end + TTL;
    rc = idem_store_claim(r->st, &op);
    CHECK((rc) == (IDEM_OK), "%s: a fresh claim after the run: %s (%s)", r->where,
                 idem_err_name(rc), idem_store_errstr(r->st));
    CHECK((op.decision.kind) == (IDEM_DECIDE_CLAIM), "%s: a fresh key is not new", r->where);
    rc = idem_store_complete(r->st, &op.id, op.decision.fence, &resp, 0, t_end + TTL);
    CHECK((rc) == (IDEM_OK), "%s: completing the fresh key: %s", r->where, idem_err_name(rc));
}

static unsigned run_serial;

/* One run with fault n armed; returns whether any fault fired. */
static int run_once(enum backend be, const struct scenario *sc, enum fault kind, long n)
{
    struct run r = {.be = be, .sc = sc, .kind = kind, .n = n};
    char url[512], err[256] = "";

    snprintf(r.where, sizeof r.where, "%s/%s/%s n=%ld", backend_name[be], sc->name,
             fault_name[kind], n);
    /* Redis expires records by the wall clock: keep its times just ahead of it. */
    r.t0 = be == B_redis ? (fx_real_ms() / 1000 + 5) * 1000 : 1700000000000ll;
    run_serial++;
    for (int k = 0; k < NKEYS; k++)
        snprintf(r.keys[k], sizeof r.keys[k], "r%u-%c", run_serial, "abcdtf"[k]);
    backend_url(be, sc->arm_before_open, url, sizeof url);
    models_reset();

    unsigned long before = fired();
    if (sc->arm_before_open)
        arm(kind, n);
    idem_err_t rc = idem_store_open(url, &r.st, err, sizeof err);
    if (rc != IDEM_OK) {
        CHECK(sc->arm_before_open && fault_class(rc), "%s: open: %s (%s)", r.where,
                  idem_err_name(rc), err);
        CHECK(r.st == NULL, "%s: a failed open gave a handle", r.where);
        CHECK((err[0]) != ('\0'), "%s: a failed open says nothing", r.where);
    } else {
        if (!sc->arm_before_open)
            arm(kind, n);
        for (int i = 0; i < sc->nsteps; i++)
            run_step(&r, i, &sc->steps[i]);
    }
    int hit = fired() != before;
    disarm();

    if (r.st == NULL) {
        rc = idem_store_open(url, &r.st, err, sizeof err);
        CHECK((rc) == (IDEM_OK), "%s: open after the fault: %s (%s)", r.where,
                     idem_err_name(rc), err);
    }
    int64_t t_end = r.t0 + 2 * LEASE + 100;
    verify(&r, t_end);
    idem_store_close(r.st);
    return hit;
}

static void drive(enum backend be, const struct scenario *sc, enum fault kind)
{
    struct timespec a, b;
    long n;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (n = 1; n <= RUNS_MAX; n++)
        if (!run_once(be, sc, kind, n))
            break;
    CHECK((n) <= (RUNS_MAX), "%s/%s/%s: still hitting faults after %d runs",
                  backend_name[be], sc->name, fault_name[kind], RUNS_MAX);
    clock_gettime(CLOCK_MONOTONIC, &b);
    fprintf(stderr, "faults %s/%s/%s: %ld runs (%ld faults), %.2f s\n", backend_name[be],
            sc->name, fault_name[kind], n, n - 1,
            (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9);
    for (size_t i = 0; i < nworlds; i++)
        world_free(&worlds[i]);
    free(worlds);
    worlds = NULL;
    nworlds = 0;
}

/* ---- the tests: scenario x backend x fault kind --------------------------------- */

struct job {
    enum backend be;
    const struct scenario *sc;
    enum fault kind;
};

static void *job_main(void *arg)
{
    const struct job *j = arg;
    if (setjmp(bail) == 0)
        drive(j->be, j->sc, j->kind);
    disarm();
    return NULL;
}

static void run_job(enum backend be, const struct scenario *sc, enum fault kind)
{
    struct job j = {be, sc, kind};
    pthread_t t;
    failure[0] = '\0';
    cr_assert_eq(pthread_create(&t, NULL, job_main, &j), 0);
    pthread_join(t, NULL);
    cr_assert_eq(failure[0], '\0', "%s", failure);
#ifdef HAVE_LSAN
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,
                 "%s/%s/%s: LeakSanitizer found leaks (see above)", backend_name[be], sc->name,
                 fault_name[kind]);
#endif
}

#define FAULT_TEST(be, sc, kind)                                    \
    Test(faults_##be, sc##_##kind, .timeout = 300)                  \
    {                                                               \
        run_job(B_##be, &scen_##sc, F_##kind);                      \
    }

#define FOR_BACKENDS(sc, kind)         \
    FAULT_TEST(memory, sc, kind)       \
    FAULT_TEST(lmdb, sc, kind)         \
    FAULT_TEST(rocksdb, sc, kind)      \
    FAULT_TEST(redis, sc, kind)        \
    FAULT_TEST(postgres, sc, kind)

#define FOR_KINDS(sc)          \
    FOR_BACKENDS(sc, alloc)    \
    FOR_BACKENDS(sc, io)

FOR_KINDS(open_close)
FOR_KINDS(claim_complete_replay)
FOR_KINDS(takeover)
FOR_KINDS(renew_hold_release)
FOR_KINDS(delete_get)
FOR_KINDS(tokens)
FOR_KINDS(batches)
FOR_KINDS(sweep)

/* Every I/O from the nth on fails: reconnects fail, the network stores go
 * into their backoff, and must come back once the faults stop. */
FOR_BACKENDS(open_close, io_sticky)
FOR_BACKENDS(batches, io_sticky)
