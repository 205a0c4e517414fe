/* src/store/postgres.c - the PostgreSQL store ("postgres://..." or "postgresql://...").
 *
 * One table (default idem_records; DDL in docs/stores.md) with one row per
 * (scope, key): the record as src/core/record.c encodes it in `record`, and
 * copies of its fields (state, flags, fingerprint, fence, lease_until,
 * expires_at, all times in ms) in columns, so that get and the sweeper can
 * filter on expires_at and an operator can read the table with SQL.  The
 * table is created on first open with CREATE TABLE IF NOT EXISTS inside a
 * transaction that holds pg_advisory_xact_lock, so many idemd starting at
 * once do not race on the catalog; a table that exists is used as it is.
 *
 * URL.  Any libpq connection URI, plus three options of ours that are
 * removed before the rest goes to libpq (which refuses options it does not
 * know): table=NAME ([a-z_][a-z0-9_]{0,62}, always quoted in SQL), pool=N
 * (connections, 1..64, default 4) and timeout=D (connect_timeout and
 * statement_timeout, 100ms..60s, default 5s).  Every other option (sslmode,
 * application_name, ...) is libpq's; PQconninfoParse checks the result, so
 * idem_store_check_url refuses an option libpq does not know without
 * contacting anything.
 *
 * Semantics.  Nothing is decided in SQL: exec reads the rows of the batch,
 * runs idem__store_apply (the code memory: and lmdb: run) on the `record`
 * bytes in C, and writes what it says, only if every row it writes still
 * holds what was read (a compare-and-set):
 *
 *   round trip 1  SELECT scope, key, fence, record ... JOIN
 *                 unnest($scopes, $keys) (one statement for the whole
 *                 batch, no lock, its own implicit transaction)
 *   in C          apply every op in order against an in-memory map of this
 *                 batch's keys (a later op sees an earlier op's result)
 *   round trip 2  only when something changed: at most three statements,
 *                 each for all rows at once from arrays, in one implicit
 *                 transaction that the server commits at the flight's Sync:
 *                 INSERT for keys that were absent; UPDATE ... WHERE scope,
 *                 key, fence and record = what was read; DELETE likewise
 *
 * so a batch that writes costs two round trips and one WAL flush (the
 * group commit of the writer thread), and a batch that only reads (repeats,
 * replays) one round trip, no transaction of its own to end and no WAL.
 * Most batches skip round trip 1 (next paragraph).
 *
 * One round trip.  Most keys of a busy idemd's batches are new (a claim)
 * or were claimed by this process a moment ago (the completion), so what
 * round trip 1 would return is known.  The store remembers the row it last
 * read or committed for a key (SPEC_SLOTS slots by hash, records up to
 * SPEC_REC_MAX bytes; a key it has no slot for is believed absent), and the
 * first attempt at a batch applies the ops in C to that belief instead of
 * reading, then sends round trip 2 with the same checks, plus one for every
 * key it does not write: ST_ABSENT (no row) for keys believed absent,
 * ST_SAME (the fence and record bytes believed) for the others.  The
 * flight commits only if every key held exactly what its ops were applied
 * to, the condition of a batch that read first; if any check fails
 * (unique_violation, or a count that divides by zero) the server rolls the
 * flight back at its Sync, nothing is written, and the batch runs again at
 * once, reading first (R_MISS).  After a miss the next 1, 2, 4 ... up to
 * SPEC_PENALTY_MAX batches read first (a hit resets it), so a workload of
 * repeats of keys this process has not seen (a replay after a restart,
 * keys claimed by another idemd) pays a wasted flight rarely.  A belief
 * is never an answer: it only saves the read when the server confirms it.
 * An idle connection with something to read (the server closed it) reads
 * first, so a stale connection is still found before anything is sent
 * that could commit (see "Pool and outages").
 * Until issue 20 a batch was BEGIN and SELECT ... FOR UPDATE, the writes,
 * then COMMIT: three round trips, a lock written to every row read (WAL
 * too) and two more statements; measured, that took about a fifth more of
 * the server's and idemd's CPU per new key (bench/README.md).  Values
 * travel in binary (arrays in PostgreSQL's binary array format), statements
 * are prepared once per connection, and each round trip is one libpq
 * pipeline segment.
 *
 * Plans.  Our connections run with enable_seqscan = off and, where the
 * server has it (PostgreSQL 12 and later), plan_cache_mode =
 * force_generic_plan.  A prepared statement planned while the table was
 * nearly empty is a sequential scan and a hash join, kept as the table
 * grows to millions of rows (measured: a one-op batch went from 0.7 to
 * 15 ms at 70,000 rows).  Every statement here finds its rows by the
 * primary key or the expires_at index, so forbidding sequential scans only
 * keeps the plans on the indexes; the connections run nothing else.  And
 * left to choose, PostgreSQL plans a statement whose arrays are short
 * (small batches: a lightly loaded idemd) afresh at every execution, the
 * custom plan looking cheaper than the generic one for two rows (measured:
 * pg_prepared_statements said 8 custom plans and no generic one after 8
 * runs with 2 keys): planning took about half of the server's CPU per new
 * key at 4 connections.  The generic plans are the same index plans.
 *
 * Why the compare-and-set is enough.  A decision is a function of the ops
 * and the record bytes they were applied to, nothing else.  The write
 * flight inserts a key only where none exists (the primary key refuses the
 * INSERT otherwise) and updates or deletes a row only where it still holds
 * the fence and the record bytes the batch read; the UPDATE and the DELETE
 * check in the same statement that they touched every row they were
 * given.  So when the flight commits, every key it writes held, at that
 * moment, exactly what its ops were applied to, and the decisions are the
 * ones that would be made on the rows as they are then: the batch is
 * linearised at its commit.  A key the batch only reads is linearised at
 * the read, a committed version (READ COMMITTED), like a get.  If another
 * transaction changed or inserted a row in between, its lock makes our
 * statement wait until it ends (READ COMMITTED then rechecks the WHERE on
 * the newest version); the statement fails (unique_violation, or the
 * count check's division by zero), the server skips the rest of the flight
 * and rolls it back at the Sync, nothing of the batch is written, and exec
 * runs the whole batch again from the read, which sees the winner's row
 * (BATCH_TRIES times).  So of any number of claims of one key in any
 * number of processes, exactly one forwards, and a takeover, a completion
 * or a token spent races the same way.  Ops on different keys do not
 * depend on each other, so SERIALIZABLE would add aborts, not safety.  Rows
 * are written in (scope, key) order (COLLATE "C", byte order), so
 * concurrent batches of several idemd do not deadlock in the common case;
 * a deadlock_detected or serialization_failure that happens anyway retries
 * the whole batch too.
 *
 * Pool and outages.  Up to pool=N blocking connections in the pool of
 * src/store/pool.c (shared with redis.c); exec, get, sweep and ping each
 * borrow one.  libpq runs in non-blocking pipeline mode and every wait is a
 * poll() with a deadline (timeout + 1 s), so a server that hangs cannot
 * hang a caller.  A connection that breaks or
 * times out is closed; a broken one also closes the idle ones (after a
 * server restart they are all stale) and, if nothing was committed yet, the
 * call is retried once on a fresh connection, so a restart costs no error.
 * When a connect fails, or the server stops answering within the deadline
 * (idem__pool_mark_down), the store is down: for the pool's backoff of
 * 100 ms doubling to 5 s (jittered) every call fails at once with
 * IDEM_E_STORE_DOWN (an outage costs microseconds per request, not a
 * connect timeout), then one caller tries to connect while the others go
 * on failing fast; the first success ends the outage.  Any connection or
 * server error is IDEM_E_STORE_DOWN (disk full, SQLSTATE 53100, is
 * IDEM_E_STORE_FULL), with libpq's text in idem_store_errstr.  A write
 * flight whose answer was lost (the connection broke after it was sent)
 * has an unknown outcome: exec returns STORE_DOWN although the batch may
 * have committed.
 *
 * Durability is the server's: a batch is durable when the server answers
 * its write flight's Sync, which it does after the commit, with the
 * server's synchronous_commit (default on).  get reads a row with
 * expires_at > now; sweep deletes rows with expires_at <= now (the same
 * boundaries as memory: and lmdb:), oldest first, in transactions of at most
 * SWEEP_CHUNK rows, skipping rows a batch's write flight holds locked.  An
 * allocation failure in exec fails the whole batch (IDEM_E_NOMEM, nothing
 * written).
 *
 * Limits of this backend: a scope or key must be valid UTF-8 (it is a text
 * column; the client encoding is UTF8; the check is src/core/utf8.c, the
 * one dedup ids and in-transaction keys use), else that op is IDEM_E_INVAL; a
 * record must fit a bytea (under 1 GiB), else that op is IDEM_E_TOOBIG.
 *
 * THREADING: any number of threads may call exec, get, sweep and ping at
 * once; each holds its own connection while it runs, and nothing
 * serialises them: concurrent batches are concurrent transactions, ordered
 * by PostgreSQL's row locks (see "Why the compare-and-set is enough").  The
 * pool's mutex guards the idle list, the counts and the outage state.
 * After fork() a child must open its own store and neither use nor close
 * its parent's (closing would end the parent's sessions).
 */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/url.h"
#include "core/utf8.h"
#include "idem/alloc.h"
#include "idem/units.h"
#include "store/pool.h"
#include "store/store_impl.h"

#define DEFAULT_TABLE "idem_records"
#define TABLE_MAX 63 /* PostgreSQL's identifier length */
#define POOL_DEFAULT 4
#define POOL_MAX 64
#define TIMEOUT_DEFAULT_MS 5000
#define TIMEOUT_MIN_MS 100
#define TIMEOUT_MAX_MS 60000
#define DEADLINE_SLACK_MS 1000 /* the client waits this much longer than the server */
#define URL_MAX 2048
#define BATCH_TRIES 8     /* whole-batch attempts (deadlock, lost races, stale connection) */
#define SWEEP_CHUNK 1000  /* rows deleted per sweep transaction */
#define VALUE_MAX 0x3fffff00u /* a bytea value (1 GiB) less some slack */
#define SPEC_SLOTS 4096   /* rows remembered for speculation (a power of two) */
#define SPEC_REC_MAX 2048 /* longest record remembered */
#define SPEC_PENALTY_MAX 64 /* most batches read first after a speculation missed */

/* Type OIDs of the binary array elements we send (pg_type.h). */
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_TEXT 25

enum { ST_SEL, ST_INS, ST_UPD, ST_DEL, ST_GET, ST_SWEEP, ST_ABSENT, ST_SAME, ST_COUNT };
static const char *const stmt_name[ST_COUNT] = {"idem_sel",   "idem_ins",   "idem_upd",
                                                "idem_del",   "idem_get",   "idem_sweep",
                                                "idem_absent", "idem_same"};
#define SQL_MAX 1024

/* What a URL says. */
struct cfg {
    char table[TABLE_MAX + 1];
    int pool;
    int64_t timeout_ms;
    char *uri; /* "postgresql:" + the URL without our options; idem_malloc'd */
};

/* A row this process last read or committed, for speculation ("One round
 * trip" in the opening comment): scope '\0' key '\0' then the record bytes,
 * in one allocation. */
struct spec_slot {
    uint8_t *buf; /* NULL: empty */
    size_t slen, klen, len;
    int64_t fence;
};

/* What the speculation remembers, and how often it was wrong lately. */
struct spec {
    pthread_mutex_t mu;
    struct spec_slot *slots; /* SPEC_SLOTS, or NULL: never speculate */
    unsigned penalty;        /* batches to read first after the next miss */
    unsigned wait;           /* batches left that read first */
};

/* One pooled connection. */
struct pgc {
    struct idem__pool_conn pc; /* first: the pool lends out a pgc as this */
    PGconn *pq;
};

struct pg_store {
    struct idem_store base; /* first: a pg_store is an idem_store */
    struct cfg cfg;
    char connect_timeout[24];     /* whole seconds, for libpq */
    char sql[ST_COUNT][SQL_MAX];  /* the prepared statements' text */
    char settings[384];           /* the session settings (statement_timeout, ...) */
    idem__pool_t pool;            /* the connections and the outage state (pool.c) */
    struct spec spec;             /* the rows a batch may skip reading */
};

/* How a piece of work on a connection ended. */
enum outcome {
    R_OK,     /* done */
    R_RETRY,  /* deadlock, serialization failure, too many lost races: run it again */
    R_STALE,  /* the connection broke before anything could have committed */
    R_BROKEN, /* the connection broke or timed out: close it */
    R_FAIL,   /* a server error; the connection is fine */
    R_MISS,   /* a speculation was wrong: nothing written; read and run again */
};

/* A libpq message as one line, capped at MSG_MAX bytes: libpq writes some
 * on several lines ("Connection refused\n\tIs the server running ...", or
 * one failure per address a host name resolved to, each on its own line),
 * and every problem idem logs or prints at start-up is one line.  A run of
 * white space that holds a line break becomes "; ", a tab a space, and the
 * trailing line break goes.  Used as flat(m).s inside one expression.  The
 * cap leaves room for a few hosts' failures in the start-up line (pg_open);
 * the texts idem__store_seterr and the pool keep are shorter (256). */
#define MSG_MAX 600
struct flat_msg {
    char s[MSG_MAX + 1];
};

static struct flat_msg flat(const char *m)
{
    struct flat_msg f;
    size_t n = 0;
    if (m == NULL)
        m = "";
    while (*m != '\0' && n < MSG_MAX) {
        if (*m == ' ' || *m == '\t' || *m == '\n' || *m == '\r') {
            bool brk = false;
            const char *e = m;
            for (; *e == ' ' || *e == '\t' || *e == '\n' || *e == '\r'; e++)
                brk = brk || *e == '\n' || *e == '\r';
            if (*e == '\0')
                break; /* trailing white space */
            if (brk && n + 2 <= MSG_MAX) {
                f.s[n++] = ';';
                f.s[n++] = ' ';
                m = e;
                continue;
            }
            if (brk)
                break;
            for (; m < e && n < MSG_MAX; m++)
                f.s[n++] = ' ';
            continue;
        }
        f.s[n++] = *m++;
    }
    f.s[n] = '\0';
    return f;
}

/* ---- binary encoding -------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* A one-dimensional array parameter in PostgreSQL's binary array format:
 * ndim, has-nulls, element type, length, lower bound, then length-prefixed
 * elements.  The buffer is reused across statements. */
struct arr {
    uint8_t *p;
    size_t len, cap;
    uint32_t n;
    bool nomem;
};

static void arr_grow(struct arr *a, size_t more)
{
    if (a->nomem || a->len + more <= a->cap)
        return;
    size_t cap = a->cap > 0 ? a->cap : 256;
    while (cap < a->len + more)
        cap *= 2;
    uint8_t *p = idem_realloc(a->p, cap);
    if (p == NULL) {
        a->nomem = true;
        return;
    }
    a->p = p;
    a->cap = cap;
}

static void arr_start(struct arr *a, uint32_t oid)
{
    a->len = 0;
    a->n = 0;
    arr_grow(a, 20);
    if (a->nomem)
        return;
    put32(a->p, 1);      /* ndim */
    put32(a->p + 4, 0);  /* no NULLs */
    put32(a->p + 8, oid);
    put32(a->p + 12, 0); /* length, set by arr_end */
    put32(a->p + 16, 1); /* lower bound */
    a->len = 20;
}

static void arr_add(struct arr *a, const void *v, size_t len)
{
    arr_grow(a, 4 + len);
    if (a->nomem)
        return;
    put32(a->p + a->len, (uint32_t)len);
    if (len > 0)
        memcpy(a->p + a->len + 4, v, len);
    a->len += 4 + len;
    a->n++;
}

static void arr_i64(struct arr *a, int64_t v)
{
    uint8_t b[8];
    put64(b, (uint64_t)v);
    arr_add(a, b, 8);
}

static void arr_i32(struct arr *a, int32_t v)
{
    uint8_t b[4];
    put32(b, (uint32_t)v);
    arr_add(a, b, 4);
}

static void arr_i16(struct arr *a, int16_t v)
{
    uint8_t b[2] = {(uint8_t)((uint16_t)v >> 8), (uint8_t)v};
    arr_add(a, b, 2);
}

static void arr_end(struct arr *a)
{
    if (!a->nomem)
        put32(a->p + 12, a->n);
}

/* ---- libpq I/O with deadlines -------------------------------------------- */

/* Wait until the socket is ready for events; -1 on timeout or error. */
static int wait_sock(PGconn *pq, short events, int64_t deadline, short *revents)
{
    int fd = PQsocket(pq);
    if (fd < 0)
        return -1;
    for (;;) {
        int64_t left = deadline - idem__pool_mono_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)left);
        if (r > 0) {
            if (revents != NULL)
                *revents = p.revents;
            return 0;
        }
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Push everything libpq has queued to the server. */
static int flush_out(PGconn *pq, int64_t deadline)
{
    for (;;) {
        int r = PQflush(pq);
        if (r == 0)
            return 0;
        if (r < 0)
            return -1;
        short rev = 0;
        if (wait_sock(pq, POLLIN | POLLOUT, deadline, &rev) != 0)
            return -1;
        /* The server may be waiting for us to read before it reads more. */
        if ((rev & POLLIN) && !PQconsumeInput(pq))
            return -1;
    }
}

/* The next result (NULL separates the results of two queries). */
static int next_result(PGconn *pq, int64_t deadline, PGresult **out)
{
    while (PQisBusy(pq)) {
        if (wait_sock(pq, POLLIN, deadline, NULL) != 0 || !PQconsumeInput(pq))
            return -1;
    }
    *out = PQgetResult(pq);
    return 0;
}

/* End a pipeline segment of nq queued queries, send it and collect their
 * results in order (res[i], each to PQclear).  Returns R_OK, or R_BROKEN
 * (the connection is lost, confused or too slow; res all NULL). */
static enum outcome seg_run(struct pg_store *s, PGconn *pq, int nq, PGresult **res)
{
    int64_t deadline = idem__pool_mono_ms() + s->cfg.timeout_ms + DEADLINE_SLACK_MS;
    int got = 0, nulls = 0;
    bool late;

    for (int i = 0; i < nq; i++)
        res[i] = NULL;
    if (!PQpipelineSync(pq) || flush_out(pq, deadline) != 0)
        goto broken;
    for (;;) {
        PGresult *r;
        if (PQstatus(pq) == CONNECTION_BAD)
            goto broken;
        if (next_result(pq, deadline, &r) != 0)
            goto broken;
        if (r == NULL) {
            if (++nulls > 1)
                goto broken; /* nothing pending: the protocol lost its way */
            continue;
        }
        nulls = 0;
        if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            break;
        }
        if (got == nq) {
            PQclear(r);
            goto broken;
        }
        res[got++] = r;
    }
    /* Fault injection (store_impl.h): the connection is lost after the
     * server answered, so what it did stays done (or, inside a transaction,
     * is rolled back when the connection is closed). */
    if (got == nq && PQstatus(pq) != CONNECTION_BAD && !idem__store_io_fault())
        return R_OK;

broken:
    late = PQstatus(pq) != CONNECTION_BAD && idem__pool_mono_ms() >= deadline;
    if (late) {
        /* A server that stopped answering is down: let the others fail fast. */
        char why[64];
        snprintf(why, sizeof why, "no answer within %lld ms",
                 (long long)(s->cfg.timeout_ms + DEADLINE_SLACK_MS));
        idem__pool_mark_down(&s->pool, why);
        idem__store_seterr(&s->base, "postgres: %s", why);
    } else
        idem__store_seterr(&s->base, "postgres: connection lost: %s", flat(PQerrorMessage(pq)).s);
    for (int i = 0; i < got; i++) {
        PQclear(res[i]);
        res[i] = NULL;
    }
    return R_BROKEN;
}

/* Queue a statement without parameters (BEGIN, COMMIT, SET, ...). */
static bool send_plain(PGconn *pq, const char *sql)
{
    return PQsendQueryParams(pq, sql, 0, NULL, NULL, NULL, NULL, 1) == 1;
}

/* Queue a prepared statement whose parameters are all binary. */
static bool send_prepared(PGconn *pq, int st, int np, struct arr *a)
{
    const char *values[11];
    int lengths[11], formats[11];
    for (int i = 0; i < np; i++) {
        values[i] = (const char *)a[i].p;
        lengths[i] = (int)a[i].len;
        formats[i] = 1;
    }
    return PQsendQueryPrepared(pq, stmt_name[st], np, values, lengths, formats, 1) == 1;
}

/* What a failed result means; the detail goes to errstr.  *err gets the
 * code for R_FAIL. */
static enum outcome classify(struct pg_store *s, PGconn *pq, const PGresult *r,
                             const char *what, idem_err_t *err)
{
    const char *state = r != NULL ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r != NULL ? PQresultErrorMessage(r) : PQerrorMessage(pq);

    if (r != NULL && PQresultStatus(r) == PGRES_PIPELINE_ABORTED)
        msg = "pipeline aborted";
    idem__store_seterr(&s->base, "postgres %s: %s%s%s%s", what, flat(msg).s,
                       state ? " (SQLSTATE " : "", state ? state : "", state ? ")" : "");
    *err = IDEM_E_STORE_DOWN;
    if (PQstatus(pq) == CONNECTION_BAD)
        return R_BROKEN;
    if (state == NULL)
        return R_FAIL;
    if (strcmp(state, "40P01") == 0 || strcmp(state, "40001") == 0)
        return R_RETRY;
    if (strncmp(state, "08", 2) == 0 || strncmp(state, "57P0", 4) == 0)
        return R_BROKEN; /* connection exception, server shutting down */
    if (strcmp(state, "53100") == 0)
        *err = IDEM_E_STORE_FULL; /* disk_full */
    return R_FAIL;
}

/* Send one statement alone and wait for it (outside a batch). */
static enum outcome run_one(struct pg_store *s, PGconn *pq, const char *sql, PGresult **out)
{
    *out = NULL;
    if (!send_plain(pq, sql)) {
        idem__store_seterr(&s->base, "postgres: %s", flat(PQerrorMessage(pq)).s);
        return R_BROKEN;
    }
    return seg_run(s, pq, 1, out);
}

/* End the transaction of a failed batch so the connection can be reused. */
static enum outcome rollback(struct pg_store *s, PGconn *pq)
{
    if (PQtransactionStatus(pq) == PQTRANS_IDLE)
        return R_OK;
    PGresult *r;
    if (run_one(s, pq, "ROLLBACK", &r) != R_OK)
        return R_BROKEN;
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok && PQtransactionStatus(pq) == PQTRANS_IDLE ? R_OK : R_BROKEN;
}

/* ---- connections -------------------------------------------------------- */

static void ignore_notice(void *arg, const PGresult *r)
{
    (void)arg;
    (void)r; /* "relation already exists, skipping" and the like: the library never prints */
}

/* Create the table if it does not exist, under an advisory lock so that
 * several processes opening one table at once do not race on the catalog. */
static enum outcome ensure_schema(struct pg_store *s, PGconn *pq, char *why, size_t whylen)
{
    char lockname[TABLE_MAX + 16], qualified[TABLE_MAX + 3], ddl[1024];
    const char *params[2] = {lockname, qualified};
    PGresult *res[3];
    idem_err_t err;

    snprintf(lockname, sizeof lockname, "idem_store:%s", s->cfg.table);
    snprintf(qualified, sizeof qualified, "\"%s\"", s->cfg.table);
    if (!send_plain(pq, "BEGIN") ||
        PQsendQueryParams(pq, "SELECT pg_advisory_xact_lock(hashtext($1))", 1, NULL, params,
                          NULL, NULL, 0) != 1 ||
        PQsendQueryParams(pq, "SELECT to_regclass($1) IS NOT NULL", 1, NULL, params + 1, NULL,
                          NULL, 0) != 1 ||
        seg_run(s, pq, 3, res) != R_OK) {
        snprintf(why, whylen, "%s", idem_store_errstr(&s->base));
        return R_BROKEN;
    }
    enum outcome o = R_OK;
    for (int i = 0; i < 3 && o == R_OK; i++) {
        ExecStatusType want = i == 0 ? PGRES_COMMAND_OK : PGRES_TUPLES_OK;
        if (PQresultStatus(res[i]) != want)
            o = classify(s, pq, res[i], "creating the table", &err);
    }
    bool exists = o == R_OK && PQntuples(res[2]) == 1 &&
                  strcmp(PQgetvalue(res[2], 0, 0), "t") == 0;
    for (int i = 0; i < 3; i++)
        PQclear(res[i]);
    if (o != R_OK) {
        snprintf(why, whylen, "%s", idem_store_errstr(&s->base));
        return o == R_BROKEN ? o : R_FAIL;
    }

    int nq = 1;
    if (!exists) {
        /* The index name must fit 63 bytes and differ between tables. */
        char index[TABLE_MAX + 1];
        if (strlen(s->cfg.table) + strlen("_expires_at") <= TABLE_MAX) {
            snprintf(index, sizeof index, "%s_expires_at", s->cfg.table);
        } else {
            uint32_t h = 2166136261u; /* FNV-1a */
            for (const char *p = s->cfg.table; *p != '\0'; p++)
                h = (h ^ (uint8_t)*p) * 16777619u;
            snprintf(index, sizeof index, "%.42s_%08x_expires_at", s->cfg.table, h);
        }
        snprintf(ddl, sizeof ddl,
                 "CREATE TABLE IF NOT EXISTS \"%s\" ("
                 "scope text COLLATE \"C\" NOT NULL, key text COLLATE \"C\" NOT NULL, "
                 "state smallint NOT NULL, flags integer NOT NULL, fingerprint bytea NOT NULL, "
                 "fence bigint NOT NULL, lease_until bigint NOT NULL, "
                 "expires_at bigint NOT NULL, record bytea NOT NULL, "
                 "PRIMARY KEY (scope, key))",
                 s->cfg.table);
        if (!send_plain(pq, ddl))
            goto lost;
        snprintf(ddl, sizeof ddl, "CREATE INDEX IF NOT EXISTS \"%s\" ON \"%s\" (expires_at)",
                 index, s->cfg.table);
        if (!send_plain(pq, ddl))
            goto lost;
        nq = 3;
    }
    if (!send_plain(pq, "COMMIT") || seg_run(s, pq, nq, res) != R_OK)
        goto lost;
    for (int i = 0; i < nq && o == R_OK; i++)
        if (PQresultStatus(res[i]) != PGRES_COMMAND_OK)
            o = classify(s, pq, res[i], "creating the table", &err);
    for (int i = 0; i < nq; i++)
        PQclear(res[i]);
    if (o != R_OK) {
        snprintf(why, whylen, "%s", idem_store_errstr(&s->base));
        return o == R_BROKEN ? o : R_FAIL; /* the caller closes the connection */
    }
    return R_OK;

lost:
    snprintf(why, whylen, "postgres: connection lost: %s", flat(PQerrorMessage(pq)).s);
    return R_BROKEN;
}

/* Open one connection, ready for use: pipeline mode, statement_timeout,
 * prepared statements (and the table first when schema is set).  Returns
 * R_OK, R_BROKEN (could not reach the server; why says so) or R_FAIL (the
 * server refused something: a missing privilege, a table of another shape). */
static enum outcome conn_open(struct pg_store *s, bool schema, struct pgc **out, char *why,
                              size_t whylen)
{
    /* Earlier entries are overridden by the URI, later ones override it. */
    const char *keys[] = {"connect_timeout", "fallback_application_name", "dbname",
                          "client_encoding", NULL};
    const char *vals[] = {s->connect_timeout, "idem", s->cfg.uri, "UTF8", NULL};
    PGresult *res[ST_COUNT + 1];
    idem_err_t err;

    *out = NULL;
    PGconn *pq = PQconnectdbParams(keys, vals, 1);
    if (pq == NULL) {
        snprintf(why, whylen, "postgres: out of memory connecting");
        return R_BROKEN;
    }
    bool refused = PQstatus(pq) != CONNECTION_OK;
    if (refused || idem__store_io_fault()) {
        const char *m = refused ? PQerrorMessage(pq) : "connection refused (injected fault)";
        snprintf(why, whylen, "postgres: cannot connect: %s", flat(m).s);
        PQfinish(pq);
        return R_BROKEN;
    }
    PQsetNoticeReceiver(pq, ignore_notice, NULL);
    if (PQsetnonblocking(pq, 1) != 0 || PQenterPipelineMode(pq) != 1) {
        snprintf(why, whylen, "postgres: cannot enter pipeline mode: %s",
                 flat(PQerrorMessage(pq)).s);
        PQfinish(pq);
        return R_BROKEN;
    }
    enum outcome o = R_OK;
    if (schema)
        o = ensure_schema(s, pq, why, whylen);
    if (o != R_OK) {
        PQfinish(pq);
        return o;
    }
    bool sent = send_plain(pq, s->settings);
    for (int i = 0; i < ST_COUNT && sent; i++)
        sent = PQsendPrepare(pq, stmt_name[i], s->sql[i], 0, NULL) == 1;
    if (!sent || seg_run(s, pq, ST_COUNT + 1, res) != R_OK) {
        snprintf(why, whylen, "postgres: connection lost: %s", flat(PQerrorMessage(pq)).s);
        PQfinish(pq);
        return R_BROKEN;
    }
    for (int i = 0; i <= ST_COUNT && o == R_OK; i++) {
        if (PQresultStatus(res[i]) != (i == 0 ? PGRES_TUPLES_OK : PGRES_COMMAND_OK)) {
            o = classify(s, pq, res[i], i == 0 ? "applying the session settings"
                                               : "preparing statements", &err);
            snprintf(why, whylen, "%s", idem_store_errstr(&s->base));
        }
    }
    for (int i = 0; i <= ST_COUNT; i++)
        PQclear(res[i]);
    if (o != R_OK) {
        PQfinish(pq);
        return o == R_BROKEN ? o : R_FAIL;
    }
    struct pgc *c = idem_calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(why, whylen, "postgres: out of memory");
        PQfinish(pq);
        return R_FAIL;
    }
    c->pq = pq;
    *out = c;
    return R_OK;
}

/* The pool's callbacks (pool.h). */
static idem_err_t pool_connect(void *ctx, struct idem__pool_conn **out, char *why, size_t whylen)
{
    struct pgc *c;
    enum outcome o = conn_open(ctx, false, &c, why, whylen);
    *out = o == R_OK ? &c->pc : NULL;
    return o == R_OK ? IDEM_OK : IDEM_E_STORE_DOWN;
}

static void pool_close(void *ctx, struct idem__pool_conn *pc)
{
    struct pgc *c = (struct pgc *)pc;
    (void)ctx;
    PQfinish(c->pq);
    idem_free(c);
}

static const struct idem__pool_ops pool_ops = {
    .connect = pool_connect,
    .close = pool_close,
};

/* Borrow a connection (pool.c: an idle one, else a new one if the pool has
 * room and the store is not in backoff, else wait for one to come back).
 * *fresh says whether it was just opened.  IDEM_OK or IDEM_E_STORE_DOWN. */
static idem_err_t borrow(struct pg_store *s, struct pgc **out, bool *fresh)
{
    struct idem__pool_conn *c;
    idem__pool_fail_t f;
    idem_err_t err = idem__pool_borrow(&s->pool, &c, fresh, &f);

    *out = (struct pgc *)c;
    if (err == IDEM_OK)
        return IDEM_OK;
    switch (f.kind) {
    case IDEM__POOL_DOWN:
        idem__store_seterr(&s->base, "postgres: server unreachable, next attempt in %lld ms (%s)",
                           (long long)f.retry_in_ms, f.why);
        break;
    case IDEM__POOL_CONNECT:
        idem__store_seterr(&s->base, "%s", f.why);
        break;
    case IDEM__POOL_BUSY:
        idem__store_seterr(&s->base, "postgres: all %d connections stayed busy for %lld ms",
                           s->cfg.pool, (long long)s->cfg.timeout_ms);
        break;
    }
    return IDEM_E_STORE_DOWN;
}

/* Give a connection back; a broken one is closed, and the idle ones with
 * it (when one broke, the others are probably stale too). */
static void give_back(struct pg_store *s, struct pgc *c, enum outcome o)
{
    idem__pool_give_back(&s->pool, &c->pc, o == R_BROKEN || o == R_STALE);
}

/* ---- the batch ------------------------------------------------------------ */

#define NO_KEY SIZE_MAX

/* One distinct (scope, key) of a batch. */
struct kent {
    const char *scope, *key; /* into the first op's id */
    size_t slen, klen;
    /* what the transaction read */
    const uint8_t *orig; /* into the held result or spec; NULL when absent */
    size_t orig_len;
    int64_t orig_fence;  /* the fence column */
    /* this batch's view after the ops applied so far */
    const uint8_t *cur; /* orig, owned, or NULL (absent) */
    size_t cur_len;
    uint8_t *owned;     /* an encoded record of ours */
    uint8_t *spec;      /* a copy of the remembered row that orig points into */
    bool changed;       /* an op wrote or deleted it */
};

/* Where each write statement's parameters live in batch.a (the SELECT's
 * use the first two), and a speculative flight's checks (ST_ABSENT,
 * ST_SAME): each has its own, so that every array is built before anything
 * is queued (queue_writes). */
enum { A_INS = 0, A_UPD = 9, A_DEL = 20, A_ABSENT = 24, A_SAME = 26, A_COUNT = 30 };

struct batch {
    idem_op_t *ops;
    size_t n;
    size_t *op_key; /* the kent of each op, NO_KEY for ops not applied here */
    struct kent *keys;
    size_t nkeys;
    PGresult *held; /* the SELECT's result, which the kents point into */
    struct arr a[A_COUNT]; /* parameter buffers */
};

static int cmp_bytes(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

static int cmp_id(const char *as, size_t asl, const char *ak, size_t akl, const char *bs,
                  size_t bsl, const char *bk, size_t bkl)
{
    int c = cmp_bytes(as, asl, bs, bsl);
    return c != 0 ? c : cmp_bytes(ak, akl, bk, bkl);
}

struct ref {
    const char *scope, *key;
    size_t slen, klen, op;
};

static int ref_cmp(const void *pa, const void *pb)
{
    const struct ref *a = pa, *b = pb;
    int c = cmp_id(a->scope, a->slen, a->key, a->klen, b->scope, b->slen, b->key, b->klen);
    return c != 0 ? c : (a->op > b->op) - (a->op < b->op);
}

/* The kent of (scope, key), or NULL. */
static struct kent *find_key(struct batch *b, const char *scope, size_t slen, const char *key,
                             size_t klen)
{
    size_t lo = 0, hi = b->nkeys;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        struct kent *k = &b->keys[mid];
        int c = cmp_id(scope, slen, key, klen, k->scope, k->slen, k->key, k->klen);
        if (c == 0)
            return k;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* Whether a text column can hold id (core/utf8.h). */
static bool id_is_text(const idem_key_id_t *id)
{
    return idem__utf8_valid(id->scope, strlen(id->scope)) &&
           idem__utf8_valid(id->key, strlen(id->key));
}

/* Group the ops that this backend applies by key.  Ops it cannot store get
 * their own err here.  IDEM_OK or IDEM_E_NOMEM. */
static idem_err_t batch_init(struct batch *b, idem_op_t *ops, size_t n)
{
    memset(b, 0, sizeof *b);
    b->ops = ops;
    b->n = n;
    b->op_key = idem_malloc(n * sizeof *b->op_key);
    struct ref *refs = idem_malloc(n * sizeof *refs);
    if (b->op_key == NULL || refs == NULL) {
        idem_free(refs);
        return IDEM_E_NOMEM;
    }
    size_t nref = 0;
    for (size_t i = 0; i < n; i++) {
        idem_op_t *op = &ops[i];
        b->op_key[i] = NO_KEY;
        if (op->err != IDEM_OK)
            continue;
        if (!id_is_text(&op->id)) {
            op->err = IDEM_E_INVAL; /* a text column holds UTF-8 only */
            continue;
        }
        if (op->kind == IDEM_OP_COMPLETE) {
            idem_record_t probe = {.response = *op->response};
            if (idem_record_encoded_size(&probe) > VALUE_MAX) {
                op->err = IDEM_E_TOOBIG;
                continue;
            }
        }
        refs[nref++] = (struct ref){op->id.scope, op->id.key, strlen(op->id.scope),
                                    strlen(op->id.key), i};
    }
    qsort(refs, nref, sizeof *refs, ref_cmp);
    b->keys = idem_calloc(nref > 0 ? nref : 1, sizeof *b->keys);
    if (b->keys == NULL) {
        idem_free(refs);
        return IDEM_E_NOMEM;
    }
    for (size_t i = 0; i < nref; i++) {
        const struct ref *r = &refs[i];
        if (b->nkeys == 0 || cmp_id(r->scope, r->slen, r->key, r->klen,
                                    b->keys[b->nkeys - 1].scope, b->keys[b->nkeys - 1].slen,
                                    b->keys[b->nkeys - 1].key, b->keys[b->nkeys - 1].klen) != 0) {
            struct kent *k = &b->keys[b->nkeys++];
            k->scope = r->scope;
            k->slen = r->slen;
            k->key = r->key;
            k->klen = r->klen;
        }
        b->op_key[r->op] = b->nkeys - 1;
    }
    idem_free(refs);
    return IDEM_OK;
}

/* Forget what the ops decided and what was read, so that the batch can run
 * again from the start. */
static void batch_reset(struct batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->op_key[i] == NO_KEY)
            continue;
        idem_op_t *op = &b->ops[i];
        idem_record_cleanup(&op->record);
        memset(&op->decision, 0, sizeof op->decision);
        op->token = IDEM_TOKEN_NONE;
        op->err = IDEM_OK;
    }
    for (size_t i = 0; i < b->nkeys; i++) {
        struct kent *k = &b->keys[i];
        idem_free(k->owned);
        idem_free(k->spec);
        k->owned = k->spec = NULL;
        k->orig = k->cur = NULL;
        k->orig_len = k->cur_len = 0;
        k->orig_fence = 0;
        k->changed = false;
    }
    PQclear(b->held);
    b->held = NULL;
}

static void batch_free(struct batch *b)
{
    for (size_t i = 0; i < b->nkeys; i++) {
        idem_free(b->keys[i].owned);
        idem_free(b->keys[i].spec);
    }
    PQclear(b->held);
    for (size_t i = 0; i < sizeof b->a / sizeof b->a[0]; i++)
        idem_free(b->a[i].p);
    idem_free(b->keys);
    idem_free(b->op_key);
}

/* ---- speculation: the rows this process last saw ------------------------------ */

static size_t spec_hash(const struct kent *k)
{
    uint32_t h = 2166136261u; /* FNV-1a over scope '\0' key */
    for (size_t i = 0; i < k->slen; i++)
        h = (h ^ (uint8_t)k->scope[i]) * 16777619u;
    h = (h ^ 0u) * 16777619u;
    for (size_t i = 0; i < k->klen; i++)
        h = (h ^ (uint8_t)k->key[i]) * 16777619u;
    return h & (SPEC_SLOTS - 1);
}

static bool spec_is(const struct spec_slot *e, const struct kent *k)
{
    return e->buf != NULL && e->slen == k->slen && e->klen == k->klen &&
           memcmp(e->buf, k->scope, k->slen) == 0 &&
           memcmp(e->buf + k->slen + 1, k->key, k->klen) == 0;
}

/* Whether this batch should skip the read: not while a recent miss's
 * penalty lasts (a workload of repeats and takeovers reads first), and not
 * on a connection with something to read while idle.  That is mostly a
 * connection the server closed (a restart): the read finds it out before
 * anything is sent that could commit, and the batch runs again on a fresh
 * connection, where a write flight that broke would have an unknown
 * outcome. */
static bool spec_try(struct pg_store *s, PGconn *pq)
{
    if (s->spec.slots == NULL)
        return false;
    struct pollfd p = {.fd = PQsocket(pq), .events = POLLIN};
    if (p.fd < 0 || poll(&p, 1, 0) != 0)
        return false;
    pthread_mutex_lock(&s->spec.mu);
    bool go = s->spec.wait == 0;
    if (!go)
        s->spec.wait--;
    pthread_mutex_unlock(&s->spec.mu);
    return go;
}

/* A speculation held (hit) or was wrong (miss): after a miss the next
 * 1, 2, 4 ... SPEC_PENALTY_MAX batches read first, and a hit resets it. */
static void spec_result(struct pg_store *s, bool hit)
{
    pthread_mutex_lock(&s->spec.mu);
    if (hit) {
        s->spec.penalty = 0;
    } else {
        s->spec.penalty = s->spec.penalty == 0 ? 1 : s->spec.penalty * 2;
        if (s->spec.penalty > SPEC_PENALTY_MAX)
            s->spec.penalty = SPEC_PENALTY_MAX;
        s->spec.wait = s->spec.penalty;
    }
    pthread_mutex_unlock(&s->spec.mu);
}

/* Take what the rows of the batch are believed to hold: a copy of the row
 * remembered for the key, else absent.  false when out of memory (the
 * caller then reads first). */
static bool spec_fill(struct pg_store *s, struct batch *b)
{
    bool ok = true;
    pthread_mutex_lock(&s->spec.mu);
    for (size_t i = 0; i < b->nkeys && ok; i++) {
        struct kent *k = &b->keys[i];
        const struct spec_slot *e = &s->spec.slots[spec_hash(k)];
        if (!spec_is(e, k))
            continue;
        k->spec = idem_malloc(e->len);
        if (k->spec == NULL) {
            ok = false;
            break;
        }
        memcpy(k->spec, e->buf + e->slen + e->klen + 2, e->len);
        k->orig = k->spec;
        k->orig_len = e->len;
        k->orig_fence = e->fence;
    }
    pthread_mutex_unlock(&s->spec.mu);
    for (size_t i = 0; i < b->nkeys; i++) {
        b->keys[i].cur = b->keys[i].orig;
        b->keys[i].cur_len = b->keys[i].orig_len;
    }
    return ok;
}

/* Remember that k's row holds rec (len bytes, fence), or that it holds
 * nothing we know of (rec NULL: the slot is emptied if it is k's).  A
 * record too long to remember, or no memory, forgets the key instead. */
static void spec_put(struct pg_store *s, const struct kent *k, const uint8_t *rec, size_t len,
                     int64_t fence)
{
    uint8_t *buf = NULL;
    if (rec != NULL && len <= SPEC_REC_MAX) {
        buf = idem_malloc(k->slen + k->klen + 2 + len);
        if (buf != NULL) {
            memcpy(buf, k->scope, k->slen);
            buf[k->slen] = '\0';
            memcpy(buf + k->slen + 1, k->key, k->klen);
            buf[k->slen + 1 + k->klen] = '\0';
            memcpy(buf + k->slen + k->klen + 2, rec, len);
        }
    }
    uint8_t *old = NULL;
    pthread_mutex_lock(&s->spec.mu);
    struct spec_slot *e = &s->spec.slots[spec_hash(k)];
    if (buf != NULL || spec_is(e, k)) {
        old = e->buf; /* another key's row is replaced by this one's */
        *e = (struct spec_slot){buf, k->slen, k->klen, len, fence};
    }
    pthread_mutex_unlock(&s->spec.mu);
    idem_free(old);
}

/* After a batch committed: remember what each of its rows holds now (what
 * it wrote, or what it read or verified).  After a flight whose outcome is
 * unknown (committed is false): forget the rows it may have written. */
static void spec_update(struct pg_store *s, const struct batch *b, bool committed)
{
    if (s->spec.slots == NULL)
        return;
    for (size_t i = 0; i < b->nkeys; i++) {
        const struct kent *k = &b->keys[i];
        if (!committed) {
            if (k->changed)
                spec_put(s, k, NULL, 0, 0);
            continue;
        }
        if (!k->changed && k->spec != NULL)
            continue; /* verified as remembered */
        int64_t fence = k->orig_fence;
        if (k->changed && k->cur != NULL) {
            idem_record_t h;
            memset(&h, 0, sizeof h);
            (void)idem_record_decode_head(k->cur, k->cur_len, &h); /* we encoded it */
            fence = (int64_t)h.fence;
        }
        spec_put(s, k, k->cur, k->cur_len, fence);
    }
}

static void spec_free(struct spec *sp)
{
    if (sp->slots == NULL)
        return;
    for (size_t i = 0; i < SPEC_SLOTS; i++)
        idem_free(sp->slots[i].buf);
    idem_free(sp->slots);
    sp->slots = NULL;
    pthread_mutex_destroy(&sp->mu);
}

static bool arrs_nomem(const struct arr *a, int np)
{
    for (int i = 0; i < np; i++)
        if (a[i].nomem)
            return true;
    return false;
}

/* Fill a[0..1] with the batch's keys, for ST_SEL.  false when out of memory. */
static bool build_select(struct batch *b)
{
    arr_start(&b->a[0], OID_TEXT);
    arr_start(&b->a[1], OID_TEXT);
    for (size_t i = 0; i < b->nkeys; i++) {
        arr_add(&b->a[0], b->keys[i].scope, b->keys[i].slen);
        arr_add(&b->a[1], b->keys[i].key, b->keys[i].klen);
    }
    arr_end(&b->a[0]);
    arr_end(&b->a[1]);
    return !arrs_nomem(b->a, 2);
}

/* Take the rows of the batch's SELECT (scope, key, fence, record):
 * the keys that have one exist, the others are absent. */
static void take_rows(struct batch *b, PGresult *r)
{
    b->held = r;
    for (int row = 0; row < PQntuples(r); row++) {
        struct kent *k = find_key(b, PQgetvalue(r, row, 0), (size_t)PQgetlength(r, row, 0),
                                  PQgetvalue(r, row, 1), (size_t)PQgetlength(r, row, 1));
        if (k == NULL || PQgetlength(r, row, 2) != 8)
            continue; /* not asked for: cannot happen */
        k->orig_fence = (int64_t)get64((const uint8_t *)PQgetvalue(r, row, 2));
        k->orig = (const uint8_t *)PQgetvalue(r, row, 3);
        k->orig_len = (size_t)PQgetlength(r, row, 3);
    }
    for (size_t i = 0; i < b->nkeys; i++) {
        b->keys[i].cur = b->keys[i].orig;
        b->keys[i].cur_len = b->keys[i].orig_len;
    }
}

/* Apply every op in order.  IDEM_OK or IDEM_E_NOMEM (a new record could
 * not be encoded). */
static idem_err_t apply_ops(struct batch *b)
{
    idem_record_t next;

    for (size_t i = 0; i < b->n; i++) {
        if (b->op_key[i] == NO_KEY)
            continue;
        struct kent *k = &b->keys[b->op_key[i]];
        idem_op_t *op = &b->ops[i];
        switch (idem__store_apply(op, k->cur, k->cur_len, &next)) {
        case IDEM__STORE_KEEP:
            break;
        case IDEM__STORE_PUT: {
            size_t size = idem_record_encoded_size(&next);
            uint8_t *buf = size > 0 ? idem_malloc(size) : NULL;
            if (buf == NULL)
                return IDEM_E_NOMEM;
            idem_record_encode_into(&next, buf); /* next never points into cur */
            idem_free(k->owned);
            k->owned = buf;
            k->cur = buf;
            k->cur_len = size;
            k->changed = true;
            break;
        }
        case IDEM__STORE_DEL:
            idem_free(k->owned);
            k->owned = NULL;
            k->cur = NULL;
            k->cur_len = 0;
            k->changed = true;
            break;
        }
    }
    return IDEM_OK;
}

/* The element types of the INSERT's and the UPDATE's array parameters. */
static const uint32_t ins_types[9] = {OID_TEXT, OID_TEXT, OID_INT2, OID_INT4, OID_BYTEA,
                                      OID_INT8, OID_INT8, OID_INT8, OID_BYTEA};
static const uint32_t upd_types[11] = {OID_TEXT, OID_TEXT, OID_INT8, OID_INT2, OID_INT4,
                                       OID_BYTEA, OID_INT8, OID_INT8, OID_INT8, OID_BYTEA,
                                       OID_BYTEA};

/* Add kent k's new record to the column arrays a[first..first+6]:
 * state, flags, fingerprint, fence, lease_until, expires_at, record. */
static void add_record(struct arr *a, const struct kent *k)
{
    idem_record_t h;
    memset(&h, 0, sizeof h);
    (void)idem_record_decode_head(k->cur, k->cur_len, &h); /* we encoded it */
    arr_i16(&a[0], (int16_t)h.state);
    arr_i32(&a[1], (int32_t)h.flags);
    arr_add(&a[2], h.fingerprint, IDEM_FP_LEN);
    arr_i64(&a[3], (int64_t)h.fence);
    arr_i64(&a[4], h.lease_until_ms);
    arr_i64(&a[5], h.expires_at_ms);
    arr_add(&a[6], k->cur, k->cur_len);
}

/* Which statements the write flight queued: the index of each one's result
 * (-1 when not sent) and how many there are. */
struct flight {
    int ins, upd, del, absent, same, nq;
};

/* Queue what the ops changed: INSERT for keys that were absent, UPDATE and
 * DELETE (where the row still holds the fence and the record read, each
 * checking in SQL that it touched every row they were given) for keys that
 * existed.  A speculative flight (spec: nothing was read, "One round trip"
 * in the opening comment) also checks the keys it does not write: absent
 * (ST_ABSENT) or holding what was believed (ST_SAME).  Every parameter is
 * built first, so that running out of memory queues nothing (a statement
 * queued without its Sync would run with the next flight).  R_OK, R_FAIL
 * (out of memory, *err set) or R_STALE (libpq could not queue: the
 * connection must be closed, which discards it). */
static enum outcome queue_writes(struct pg_store *s, PGconn *pq, struct batch *b, bool spec,
                                 struct flight *f, idem_err_t *err)
{
    struct arr *ins = &b->a[A_INS], *upd = &b->a[A_UPD], *del = &b->a[A_DEL];
    struct arr *absent = &b->a[A_ABSENT], *same = &b->a[A_SAME];
    size_t nins = 0, nupd = 0, ndel = 0, nabsent = 0, nsame = 0;

    *f = (struct flight){-1, -1, -1, -1, -1, 0};
    for (size_t i = 0; i < b->nkeys; i++) {
        const struct kent *k = &b->keys[i];
        if (!k->changed || (k->orig == NULL && k->cur == NULL)) {
            nabsent += spec && k->orig == NULL;
            nsame += spec && k->orig != NULL;
        } else if (k->orig == NULL) {
            nins++;
        } else if (k->cur != NULL) {
            nupd++;
        } else {
            ndel++;
        }
    }
    for (int c = 0; c < 9 && nins > 0; c++)
        arr_start(&ins[c], ins_types[c]);
    for (int c = 0; c < 11 && nupd > 0; c++)
        arr_start(&upd[c], upd_types[c]);
    if (ndel > 0) {
        arr_start(&del[0], OID_TEXT);
        arr_start(&del[1], OID_TEXT);
        arr_start(&del[2], OID_INT8);
        arr_start(&del[3], OID_BYTEA);
    }
    if (nabsent > 0) {
        arr_start(&absent[0], OID_TEXT);
        arr_start(&absent[1], OID_TEXT);
    }
    if (nsame > 0) {
        arr_start(&same[0], OID_TEXT);
        arr_start(&same[1], OID_TEXT);
        arr_start(&same[2], OID_INT8);
        arr_start(&same[3], OID_BYTEA);
    }
    for (size_t i = 0; i < b->nkeys; i++) {
        const struct kent *k = &b->keys[i];
        struct arr *a;
        if (!k->changed || (k->orig == NULL && k->cur == NULL)) {
            if (!spec)
                continue;
            a = k->orig == NULL ? absent : same;
        } else {
            a = k->orig == NULL ? ins : k->cur != NULL ? upd : del;
        }
        arr_add(&a[0], k->scope, k->slen);
        arr_add(&a[1], k->key, k->klen);
        if (a == ins) {
            add_record(&a[2], k);
            continue;
        }
        if (a == absent)
            continue;
        arr_i64(&a[2], k->orig_fence);
        if (a == upd) {
            add_record(&a[3], k);
            arr_add(&a[10], k->orig, k->orig_len);
        } else {
            arr_add(&a[3], k->orig, k->orig_len); /* del, same */
        }
    }
    for (int c = 0; c < 9 && nins > 0; c++)
        arr_end(&ins[c]);
    for (int c = 0; c < 11 && nupd > 0; c++)
        arr_end(&upd[c]);
    for (int c = 0; c < 4 && ndel > 0; c++)
        arr_end(&del[c]);
    for (int c = 0; c < 2 && nabsent > 0; c++)
        arr_end(&absent[c]);
    for (int c = 0; c < 4 && nsame > 0; c++)
        arr_end(&same[c]);
    if ((nins > 0 && arrs_nomem(ins, 9)) || (nupd > 0 && arrs_nomem(upd, 11)) ||
        (ndel > 0 && arrs_nomem(del, 4)) || (nabsent > 0 && arrs_nomem(absent, 2)) ||
        (nsame > 0 && arrs_nomem(same, 4))) {
        *err = IDEM_E_NOMEM;
        idem__store_seterr(&s->base, "postgres: out of memory building the batch");
        return R_FAIL;
    }
    if (nabsent > 0) {
        if (!send_prepared(pq, ST_ABSENT, 2, absent))
            goto lost;
        f->absent = f->nq++;
    }
    if (nsame > 0) {
        if (!send_prepared(pq, ST_SAME, 4, same))
            goto lost;
        f->same = f->nq++;
    }
    if (nins > 0) {
        if (!send_prepared(pq, ST_INS, 9, ins))
            goto lost;
        f->ins = f->nq++;
    }
    if (nupd > 0) {
        if (!send_prepared(pq, ST_UPD, 11, upd))
            goto lost;
        f->upd = f->nq++;
    }
    if (ndel > 0) {
        if (!send_prepared(pq, ST_DEL, 4, del))
            goto lost;
        f->del = f->nq++;
    }
    return R_OK;

lost:
    idem__store_seterr(&s->base, "postgres: %s", flat(PQerrorMessage(pq)).s);
    return R_STALE;
}

/* What the failed statement q of the write flight means.  The server
 * skipped the statements after it and rolled the flight's implicit
 * transaction back at its Sync: nothing was written.  A row that was not
 * what the batch decided on is R_RETRY after a read, R_MISS after a
 * speculation. */
static enum outcome write_failed(struct pg_store *s, PGconn *pq, const PGresult *r, int q,
                                 const struct flight *f, bool spec, idem_err_t *err)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (q == f->ins && state != NULL && strcmp(state, "23505") == 0) {
        /* unique_violation: a key that was absent when read was inserted
         * by another transaction, which has committed since. */
        idem__store_seterr(&s->base, "postgres: a key of this batch was claimed by another "
                                     "transaction at the same time");
        *err = IDEM_E_STORE_DOWN;
        return spec ? R_MISS : R_RETRY;
    }
    if ((q == f->upd || q == f->del || q == f->absent || q == f->same) && state != NULL &&
        strcmp(state, "22012") == 0) {
        /* The statement's check (build_sql): a row changed since it was
         * read, by a transaction that has committed since. */
        idem__store_seterr(&s->base, "postgres: a row of this batch changed since it was read");
        *err = IDEM_E_STORE_DOWN;
        return spec ? R_MISS : R_RETRY;
    }
    return classify(s, pq, r, "writing", err);
}

/* One attempt at a batch on connection pq: one round trip for a batch that
 * writes nothing or that speculates, two for one that reads and writes
 * (see the opening comment).  spec: the kents already hold what the rows
 * are believed to hold (spec_fill); the read is skipped and the flight
 * checks every key. */
static enum outcome run_batch(struct pg_store *s, PGconn *pq, struct batch *b, bool spec,
                              idem_err_t *err)
{
    PGresult *res[5];
    struct flight f;
    enum outcome o;

    /* Round trip 1: read every row of the batch (no lock). */
    if (!spec) {
        if (!build_select(b))
            goto nomem;
        if (!send_prepared(pq, ST_SEL, 2, b->a)) {
            idem__store_seterr(&s->base, "postgres: %s", flat(PQerrorMessage(pq)).s);
            return R_STALE;
        }
        if (seg_run(s, pq, 1, res) != R_OK)
            return R_STALE;
        if (PQresultStatus(res[0]) != PGRES_TUPLES_OK) {
            o = classify(s, pq, res[0], "reading the batch's rows", err);
            PQclear(res[0]);
            return o == R_BROKEN ? R_STALE : o; /* nothing was written */
        }
        take_rows(b, res[0]);
    }

    /* In C: every op in order, a later op seeing an earlier one's result. */
    if ((*err = apply_ops(b)) != IDEM_OK) {
        idem__store_seterr(&s->base, "postgres: out of memory applying the batch");
        return R_FAIL;
    }

    /* Round trip 2, when anything changed (or the only one, speculating):
     * the writes and checks, one implicit transaction that the server
     * commits at the flight's Sync, before it answers the Sync (with its
     * synchronous_commit). */
    if ((o = queue_writes(s, pq, b, spec, &f, err)) != R_OK)
        return o;
    if (f.nq == 0)
        return R_OK;
    if (seg_run(s, pq, f.nq, res) != R_OK) {
        char why[256]; /* what seg_run said: lost, or no answer in time */
        snprintf(why, sizeof why, "%s", idem_store_errstr(&s->base));
        idem__store_seterr(&s->base, "%s, during the commit: the batch may or may not have been "
                                     "written", why);
        return R_BROKEN;
    }
    o = R_OK;
    for (int q = 0; q < f.nq && o == R_OK; q++) {
        ExecStatusType want = q == f.ins ? PGRES_COMMAND_OK : PGRES_TUPLES_OK;
        if (PQresultStatus(res[q]) != want)
            o = write_failed(s, pq, res[q], q, &f, spec, err);
    }
    for (int q = 0; q < f.nq; q++)
        PQclear(res[q]);
    if ((o == R_OK || o == R_MISS) && PQtransactionStatus(pq) != PQTRANS_IDLE) {
        idem__store_seterr(&s->base, "postgres: the write flight left a transaction open");
        *err = IDEM_E_STORE_DOWN;
        return R_BROKEN;
    }
    return o;

nomem:
    *err = IDEM_E_NOMEM;
    idem__store_seterr(&s->base, "postgres: out of memory building the batch");
    return R_FAIL;
}

static idem_err_t pg_exec(idem_store_t *base, idem_op_t *ops, size_t n)
{
    struct pg_store *s = (struct pg_store *)base;
    struct batch b;
    idem_err_t err = batch_init(&b, ops, n);
    bool retried_stale = false;

    if (err != IDEM_OK) {
        batch_free(&b);
        idem__store_seterr(base, "postgres: out of memory");
        return err;
    }
    if (b.nkeys == 0) {
        batch_free(&b);
        return IDEM_OK; /* every op refused alone: no transaction needed */
    }
    for (int attempt = 0;; attempt++) {
        struct pgc *c;
        bool fresh;
        if ((err = borrow(s, &c, &fresh)) != IDEM_OK)
            break;
        err = IDEM_E_STORE_DOWN;
        /* The first attempt skips the read when it may (spec_try), on
         * what this process last saw of the rows; a miss wrote nothing
         * and runs the batch again at once, reading first. */
        bool spec = attempt == 0 && spec_try(s, c->pq);
        if (spec && !spec_fill(s, &b)) {
            batch_reset(&b);
            spec = false;
        }
        enum outcome o = run_batch(s, c->pq, &b, spec, &err);
        if (spec && (o == R_OK || o == R_MISS))
            spec_result(s, o == R_OK);
        if (o == R_MISS) {
            batch_reset(&b);
            err = IDEM_E_STORE_DOWN;
            o = run_batch(s, c->pq, &b, false, &err);
        }
        if (o == R_OK || o == R_BROKEN)
            spec_update(s, &b, o == R_OK);
        if (o == R_FAIL || o == R_RETRY) {
            if (rollback(s, c->pq) != R_OK)
                o = o == R_RETRY ? R_STALE : R_BROKEN;
        }
        give_back(s, c, o);
        if (o == R_OK) {
            err = IDEM_OK;
            break;
        }
        /* A stale idle connection (the server restarted since it was last
         * used) is worth one more try on a fresh one. */
        bool again = (o == R_RETRY && attempt + 1 < BATCH_TRIES) ||
                     (o == R_STALE && !fresh && !retried_stale);
        if (!again) {
            if (o != R_FAIL)
                err = IDEM_E_STORE_DOWN;
            break;
        }
        retried_stale = retried_stale || o == R_STALE;
        batch_reset(&b);
    }
    batch_free(&b);
    return err;
}

/* ---- get, sweep, ping ------------------------------------------------------ */

/* Run fn on a borrowed connection, once more on a fresh one if the first
 * broke (get, ping and one sweep step may always run again).  fn returns
 * an outcome and sets *err for R_FAIL. */
typedef enum outcome (*work_fn)(struct pg_store *s, PGconn *pq, void *arg, idem_err_t *err);

static idem_err_t with_conn(struct pg_store *s, work_fn fn, void *arg)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        struct pgc *c;
        bool fresh;
        idem_err_t err = borrow(s, &c, &fresh);
        if (err != IDEM_OK)
            return err;
        err = IDEM_E_STORE_DOWN;
        enum outcome o = fn(s, c->pq, arg, &err);
        give_back(s, c, o);
        if (o == R_OK || o == R_FAIL)
            return o == R_OK ? IDEM_OK : err;
        if (fresh)
            return IDEM_E_STORE_DOWN;
    }
    return IDEM_E_STORE_DOWN;
}

struct get_arg {
    const idem_key_id_t *id;
    int64_t now_ms;
    idem_record_t *rec;
    idem_err_t result; /* NOTFOUND, CORRUPT, NOMEM, OK */
};

static enum outcome get_work(struct pg_store *s, PGconn *pq, void *argp, idem_err_t *err)
{
    struct get_arg *g = argp;
    uint8_t now[8];
    put64(now, (uint64_t)g->now_ms);
    const char *values[3] = {g->id->scope, g->id->key, (const char *)now};
    int lengths[3] = {(int)strlen(g->id->scope), (int)strlen(g->id->key), 8};
    int formats[3] = {1, 1, 1};
    PGresult *r;

    if (PQsendQueryPrepared(pq, stmt_name[ST_GET], 3, values, lengths, formats, 1) != 1 ||
        seg_run(s, pq, 1, &r) != R_OK)
        return R_STALE;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        enum outcome o = classify(s, pq, r, "get", err);
        PQclear(r);
        return o == R_RETRY ? R_FAIL : o;
    }
    g->result = IDEM_E_NOTFOUND;
    if (PQntuples(r) == 1) {
        g->result = idem_record_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                       (size_t)PQgetlength(r, 0, 0), g->rec);
        if (g->result == IDEM_OK && g->rec->expires_at_ms <= g->now_ms) {
            idem_record_cleanup(g->rec); /* the column and the record disagree */
            g->result = IDEM_E_NOTFOUND;
        }
    }
    PQclear(r);
    return R_OK;
}

static idem_err_t pg_get(idem_store_t *base, const idem_key_id_t *id, int64_t now_ms,
                         idem_record_t *rec)
{
    struct pg_store *s = (struct pg_store *)base;
    if (!id_is_text(id))
        return IDEM_E_NOTFOUND; /* no such key can be stored here */
    struct get_arg g = {id, now_ms, rec, IDEM_E_NOTFOUND};
    idem_err_t err = with_conn(s, get_work, &g);
    return err != IDEM_OK ? err : g.result;
}

/* ---- listing (idem_store_list) ------------------------------------------
 *
 * One statement per page, every filter in its WHERE: the scope, the prefix
 * (as a range, key >= p AND key < p's successor) and the cursor ((scope,
 * key) > the last row of the page before) are ranges of the primary key's
 * index, which also gives the order; state, held and age are checked on
 * the rows of that range (without a scope, on the whole index).  The
 * record itself is not read, only its status bytes (offset 65 of every
 * version of the layout, include/idem/record.h). */

#define LIST_SQL_MAX 1536
#define LIST_PARAMS 10

struct list_arg {
    idem__list_t *l;
    char sql[LIST_SQL_MAX];
    const char *values[LIST_PARAMS];
    char nums[LIST_PARAMS][24];
    char after_scope[IDEM_SCOPE_MAX + 1], after_key[IDEM_KEY_MAX + 1];
    char succ[IDEM_KEY_MAX + 1];
    int np;
};

static int be_i32(const char *p)
{
    const uint8_t *u = (const uint8_t *)p;
    return (int)((uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3]);
}

/* Add a parameter; returns its number for the SQL. */
static int list_param(struct list_arg *a, const char *v)
{
    a->values[a->np] = v;
    return ++a->np;
}

static int list_num(struct list_arg *a, long long v)
{
    snprintf(a->nums[a->np], sizeof a->nums[a->np], "%lld", v);
    return list_param(a, a->nums[a->np]);
}

static void list_sql(struct pg_store *s, struct list_arg *a)
{
    const idem_store_filter_t *f = a->l->f;
    size_t n = 0;
    char *q = a->sql;
#define ADD(...) (n += (size_t)snprintf(q + n, n < LIST_SQL_MAX ? LIST_SQL_MAX - n : 0, __VA_ARGS__))
    int now = list_num(a, (long long)f->now_ms);
    ADD("SELECT scope, key, state, flags, fingerprint, fence, lease_until, expires_at, "
        "(get_byte(record, 65) + 256 * get_byte(record, 66))::int4 FROM \"%s\" "
        "WHERE expires_at > $%d::int8 AND (flags & %u) = 0",
        s->cfg.table, now, IDEM_REC_TOKEN);
    if (f->scope != NULL)
        ADD(" AND scope = $%d::text", list_param(a, f->scope));
    if (f->prefix != NULL && f->prefix[0] != '\0') {
        size_t pl = strlen(f->prefix);
        memcpy(a->succ, f->prefix, pl + 1);
        a->succ[pl - 1] = (char)(a->succ[pl - 1] + 1); /* printable: no overflow */
        int p1 = list_param(a, f->prefix);
        ADD(" AND key >= $%d::text AND key < $%d::text", p1, list_param(a, a->succ));
    }
    if (a->l->has_after) {
        int p1 = list_param(a, a->after_scope);
        ADD(" AND (scope, key) > ($%d::text, $%d::text)", p1, list_param(a, a->after_key));
    }
    switch (f->state) {
    case IDEM_LIST_ANY:
        if (f->spare_in_flight)
            ADD(" AND NOT (state = %d AND ((flags & %u) <> 0 OR lease_until > $%d::int8))",
                IDEM_STATE_IN_PROGRESS, IDEM_REC_HELD, now);
        break;
    case IDEM_LIST_IN_PROGRESS:
        ADD(" AND state = %d", IDEM_STATE_IN_PROGRESS);
        break;
    case IDEM_LIST_COMPLETED:
        ADD(" AND state = %d", IDEM_STATE_COMPLETED);
        break;
    case IDEM_LIST_HELD:
        ADD(" AND state = %d AND (flags & %u) <> 0", IDEM_STATE_IN_PROGRESS, IDEM_REC_HELD);
        break;
    }
    if (f->written_before_ms != 0) {
        int pl = list_num(a, (long long)f->lease_ms), pt = list_num(a, (long long)f->ttl_ms);
        ADD(" AND (CASE WHEN state = %d THEN lease_until - $%d::int8 ELSE expires_at - $%d::int8 "
            "END) < $%d::int8",
            IDEM_STATE_IN_PROGRESS, pl, pt, list_num(a, (long long)f->written_before_ms));
    }
    ADD(" ORDER BY scope, key LIMIT $%d::int8", list_num(a, (long long)a->l->limit));
#undef ADD
}

static enum outcome list_work(struct pg_store *s, PGconn *pq, void *argp, idem_err_t *err)
{
    struct list_arg *a = argp;
    idem__list_t *l = a->l;
    PGresult *r;

    if (PQsendQueryParams(pq, a->sql, a->np, NULL, a->values, NULL, NULL, 1) != 1 ||
        seg_run(s, pq, 1, &r) != R_OK)
        return R_STALE;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        enum outcome o = classify(s, pq, r, "listing", err);
        PQclear(r);
        return o == R_RETRY ? R_FAIL : o;
    }
    l->page->n = 0;
    l->visited = 0;
    l->page->cursor[0] = '\0';
    int rows = PQntuples(r);
    char k[IDEM_STORE_KEY_MAX];
    size_t klen = 0;
    for (int i = 0; i < rows; i++) {
        size_t sl = (size_t)PQgetlength(r, i, 0), kl = (size_t)PQgetlength(r, i, 1);
        if (sl > IDEM_SCOPE_MAX || kl > IDEM_KEY_MAX || PQgetlength(r, i, 4) != IDEM_FP_LEN)
            continue; /* not a row idemd wrote */
        memcpy(k, PQgetvalue(r, i, 0), sl);
        k[sl] = '\0';
        memcpy(k + sl + 1, PQgetvalue(r, i, 1), kl);
        klen = sl + 1 + kl;
        idem_record_t head;
        memset(&head, 0, sizeof head);
        head.state = (idem_state_t)(((uint8_t)PQgetvalue(r, i, 2)[0] << 8) |
                                    (uint8_t)PQgetvalue(r, i, 2)[1]);
        head.flags = (uint32_t)be_i32(PQgetvalue(r, i, 3));
        memcpy(head.fingerprint, PQgetvalue(r, i, 4), IDEM_FP_LEN);
        head.fence = get64((const uint8_t *)PQgetvalue(r, i, 5));
        head.lease_until_ms = (int64_t)get64((const uint8_t *)PQgetvalue(r, i, 6));
        head.expires_at_ms = (int64_t)get64((const uint8_t *)PQgetvalue(r, i, 7));
        head.response.status = be_i32(PQgetvalue(r, i, 8));
        idem__store_list_offer_head(l, k, klen, &head);
    }
    if ((size_t)rows == l->limit && klen > 0)
        idem__store_list_resume_after(l, k, klen);
    PQclear(r);
    return R_OK;
}

static idem_err_t pg_list(idem_store_t *base, idem__list_t *l)
{
    struct pg_store *s = (struct pg_store *)base;
    const idem_store_filter_t *f = l->f;
    struct list_arg *a = idem_calloc(1, sizeof *a);
    if (a == NULL)
        return IDEM_E_NOMEM;
    a->l = l;
    if (l->raw[0] != '\0' && !l->has_after) {
        idem_free(a);
        return IDEM_E_INVAL;
    }
    if (l->has_after) {
        const char *z = memchr(l->after, '\0', l->after_len);
        size_t sl = z ? (size_t)(z - l->after) : 0;
        if (z == NULL || sl > IDEM_SCOPE_MAX || l->after_len - sl - 1 > IDEM_KEY_MAX ||
            memchr(z + 1, '\0', l->after_len - sl - 1) != NULL) {
            idem_free(a);
            return IDEM_E_INVAL;
        }
        memcpy(a->after_scope, l->after, sl);
        memcpy(a->after_key, z + 1, l->after_len - sl - 1);
    }
    if (f->prefix != NULL)
        for (const char *p = f->prefix; *p != '\0'; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) {
                idem_free(a);
                return IDEM_E_INVAL; /* no stored key has it */
            }
    list_sql(s, a);
    idem_err_t err = with_conn(s, list_work, a);
    idem_free(a);
    return err;
}

struct sweep_arg {
    int64_t now_ms;
    size_t want;
    size_t removed;
};

static enum outcome sweep_work(struct pg_store *s, PGconn *pq, void *argp, idem_err_t *err)
{
    struct sweep_arg *w = argp;
    uint8_t now[8], lim[8];
    put64(now, (uint64_t)w->now_ms);
    put64(lim, (uint64_t)w->want);
    const char *values[2] = {(const char *)now, (const char *)lim};
    int lengths[2] = {8, 8}, formats[2] = {1, 1};
    PGresult *r;

    /* One statement between syncs: its own implicit transaction. */
    if (PQsendQueryPrepared(pq, stmt_name[ST_SWEEP], 2, values, lengths, formats, 1) != 1 ||
        seg_run(s, pq, 1, &r) != R_OK)
        return R_STALE;
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        enum outcome o = classify(s, pq, r, "sweep", err);
        PQclear(r);
        return o == R_RETRY ? R_FAIL : o;
    }
    w->removed = (size_t)strtoull(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return R_OK;
}

static idem_err_t pg_sweep(idem_store_t *base, int64_t now_ms, size_t max, size_t *removed)
{
    struct pg_store *s = (struct pg_store *)base;
    size_t total = 0;
    idem_err_t err = IDEM_OK;

    while (total < max) {
        struct sweep_arg w = {now_ms, max - total < SWEEP_CHUNK ? max - total : SWEEP_CHUNK, 0};
        if ((err = with_conn(s, sweep_work, &w)) != IDEM_OK)
            break;
        total += w.removed;
        if (w.removed < w.want)
            break; /* nothing more has expired (or the rest is locked by a batch) */
    }
    *removed = total;
    return err;
}

static enum outcome ping_work(struct pg_store *s, PGconn *pq, void *argp, idem_err_t *err)
{
    PGresult *r;
    (void)argp;
    if (run_one(s, pq, "SELECT 1", &r) != R_OK)
        return R_STALE;
    enum outcome o = R_OK;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        o = classify(s, pq, r, "ping", err);
    PQclear(r);
    if (o == R_RETRY || o == R_FAIL) {
        *err = IDEM_E_STORE_DOWN;
        o = R_FAIL;
    }
    return o;
}

static idem_err_t pg_ping(idem_store_t *base)
{
    struct pg_store *s = (struct pg_store *)base;
    return with_conn(s, ping_work, NULL) == IDEM_OK ? IDEM_OK : IDEM_E_STORE_DOWN;
}

/* ---- invalidations (postgres_sub.c) ------------------------------------------ */

/* The NOTIFY channel of the store's table: "<table>_invalidate", the table
 * cut to 52 bytes so that it fits an identifier (63 bytes). */
static void channel_name(const struct pg_store *s, char *buf, size_t len)
{
    snprintf(buf, len, "%.52s_invalidate", s->cfg.table);
}

struct notify_arg {
    const char *msg;
};

static enum outcome notify_work(struct pg_store *s, PGconn *pq, void *argp, idem_err_t *err)
{
    const struct notify_arg *a = argp;
    char chan[64];
    channel_name(s, chan, sizeof chan);
    const char *values[2] = {chan, a->msg};
    if (PQsendQueryParams(pq, "SELECT pg_notify($1::text, $2::text)", 2, NULL, values, NULL,
                          NULL, 1) != 1)
        return R_BROKEN;
    PGresult *r;
    if (seg_run(s, pq, 1, &r) != R_OK)
        return R_STALE;
    enum outcome o = R_OK;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        o = classify(s, pq, r, "NOTIFY", err);
    PQclear(r);
    if (o == R_RETRY || o == R_FAIL) {
        *err = IDEM_E_STORE_DOWN;
        o = R_FAIL;
    }
    return o;
}

/* NOTIFY every listener (the delete it follows has committed). */
static idem_err_t pg_publish(idem_store_t *base, const char *msg, size_t len)
{
    char text[IDEM__INVAL_MSG_MAX + 1];
    if (len > IDEM__INVAL_MSG_MAX)
        return IDEM_E_INVAL;
    memcpy(text, msg, len);
    text[len] = '\0';
    struct notify_arg a = {.msg = text};
    return with_conn((struct pg_store *)base, notify_work, &a) == IDEM_OK ? IDEM_OK
                                                                          : IDEM_E_STORE_DOWN;
}

static void pg_watch_session(idem_store_t *base, int stop_fd, idem__watch_sink_t *sink)
{
    struct pg_store *s = (struct pg_store *)base;
    char chan[64];
    channel_name(s, chan, sizeof chan);
    idem__pg_watch_session(s->cfg.uri, s->connect_timeout, chan,
                           s->cfg.timeout_ms + DEADLINE_SLACK_MS, stop_fd, sink);
}

/* ---- opening ----------------------------------------------------------------- */

static bool table_ok(const char *t)
{
    size_t n = strlen(t);
    if (n == 0 || n > TABLE_MAX || !((t[0] >= 'a' && t[0] <= 'z') || t[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((t[i] >= 'a' && t[i] <= 'z') || (t[i] >= '0' && t[i] <= '9') || t[i] == '_'))
            return false;
    return true;
}

/* Handle one of our options; 1 when name is ours, 0 when it is libpq's,
 * -1 for a bad value. */
static int our_option(struct cfg *c, const char *name, size_t nl, const char *value, size_t vl,
                      unsigned *seen, char *errbuf, size_t errlen)
{
    static const char *const ours[] = {"table", "pool", "timeout"};
    int which = -1;
    for (int i = 0; i < 3; i++)
        if (strlen(ours[i]) == nl && memcmp(ours[i], name, nl) == 0)
            which = i;
    if (which < 0)
        return 0;
    if (*seen & (1u << which)) {
        idem__store_errbuf(errbuf, errlen, "postgres store option %s= is given twice",
                           ours[which]);
        return -1;
    }
    *seen |= 1u << which;
    char v[IDEM_STORE_OPT_MAX + 1];
    if (vl > IDEM_STORE_OPT_MAX) {
        idem__store_errbuf(errbuf, errlen, "postgres store option %s= is too long", ours[which]);
        return -1;
    }
    memcpy(v, value, vl);
    v[vl] = '\0';
    switch (which) {
    case 0:
        if (!table_ok(v)) {
            idem__store_errbuf(errbuf, errlen,
                               "postgres store option table=%s: expected a name of 1 to 63 "
                               "characters a-z, 0-9 and _, not starting with a digit",
                               v);
            return -1;
        }
        memcpy(c->table, v, vl + 1);
        return 1;
    case 1: {
        char *end;
        errno = 0;
        long p = vl > 0 && v[0] >= '0' && v[0] <= '9' ? strtol(v, &end, 10) : -1;
        if (p < 1 || p > POOL_MAX || errno != 0 || *end != '\0') {
            idem__store_errbuf(errbuf, errlen,
                               "postgres store option pool=%s: expected 1 to %d connections", v,
                               POOL_MAX);
            return -1;
        }
        c->pool = (int)p;
        return 1;
    }
    default: {
        int64_t ms;
        if (idem_parse_duration(v, &ms) != IDEM_OK || ms < TIMEOUT_MIN_MS || ms > TIMEOUT_MAX_MS) {
            idem__store_errbuf(errbuf, errlen,
                               "postgres store option timeout=%s: expected a duration from "
                               "100ms to 60s, e.g. 5s",
                               v);
            return -1;
        }
        c->timeout_ms = ms;
        return 1;
    }
    }
}

/* Parse "//...?..." into c (c->uri allocated on success). */
static idem_err_t parse_url(const char *rest, struct cfg *c, char *errbuf, size_t errlen)
{
    static const char prefix[] = "postgresql:";
    size_t path_len, rl = strlen(rest);
    const char *q;
    unsigned seen = 0;

    memset(c, 0, sizeof *c);
    snprintf(c->table, sizeof c->table, "%s", DEFAULT_TABLE);
    c->pool = POOL_DEFAULT;
    c->timeout_ms = TIMEOUT_DEFAULT_MS;
    if (strncmp(rest, "//", 2) != 0) {
        idem__store_errbuf(errbuf, errlen,
                           "a postgres store URL is postgres://[user[:password]@]host[:port]"
                           "/dbname[?options]");
        return IDEM_E_INVAL;
    }
    if (rl > URL_MAX) {
        idem__store_errbuf(errbuf, errlen, "postgres store URL is longer than %d bytes",
                           URL_MAX);
        return IDEM_E_INVAL;
    }
    char *uri = idem_malloc(sizeof prefix + rl + 1);
    if (uri == NULL)
        return IDEM_E_NOMEM;
    idem__store_split(rest, &path_len, &q);
    memcpy(uri, prefix, sizeof prefix - 1);
    size_t ul = sizeof prefix - 1;
    memcpy(uri + ul, rest, path_len);
    ul += path_len;
    char sep = '?';
    idem__url_param_t o;
    while (idem__url_next_param(&q, NULL, &o)) { /* core/url.c */
        int r = 0;
        if (o.item_len > 0 && o.has_value)
            r = our_option(c, o.name, o.name_len, o.value, o.value_len, &seen, errbuf, errlen);
        if (r < 0) {
            idem_free(uri);
            return IDEM_E_INVAL;
        }
        if (r == 0 && o.item_len > 0) { /* libpq's: passed on as written */
            uri[ul++] = sep;
            memcpy(uri + ul, o.item, o.item_len);
            ul += o.item_len;
            sep = '&';
        }
    }
    uri[ul] = '\0';

    char *msg = NULL;
    PQconninfoOption *opts = PQconninfoParse(uri, &msg);
    if (opts == NULL) {
        if (msg == NULL) {
            idem_free(uri);
            return IDEM_E_NOMEM;
        }
        idem__store_errbuf(errbuf, errlen, "postgres store URL: %s", flat(msg).s);
        PQfreemem(msg);
        idem_free(uri);
        return IDEM_E_INVAL;
    }
    PQconninfoFree(opts);
    c->uri = uri;
    return IDEM_OK;
}

static void pg_close(idem_store_t *base)
{
    struct pg_store *s = (struct pg_store *)base;
    idem__pool_cleanup(&s->pool); /* every connection is idle when the store is closed */
    spec_free(&s->spec);
    idem_free(s->cfg.uri);
    idem_free(s);
}

static void build_sql(struct pg_store *s)
{
    const char *t = s->cfg.table;
    snprintf(s->sql[ST_SEL], SQL_MAX,
             "SELECT t.scope, t.key, t.fence, t.record FROM \"%s\" t "
             "JOIN unnest($1::text[], $2::text[]) AS u(s, k) ON t.scope = u.s AND t.key = u.k",
             t);
    /* A key some other transaction inserted since it was read makes the
     * INSERT fail (unique_violation), and with it the whole write flight:
     * the batch runs again (write_failed). */
    snprintf(s->sql[ST_INS], SQL_MAX,
             "INSERT INTO \"%s\" (scope, key, state, flags, fingerprint, fence, lease_until, "
             "expires_at, record) SELECT * FROM unnest($1::text[], $2::text[], $3::int2[], "
             "$4::int4[], $5::bytea[], $6::int8[], $7::int8[], $8::int8[], $9::bytea[])",
             t);
    /* The UPDATE and the DELETE touch a row only if it still holds the
     * fence and the record bytes the batch read, and check in the same
     * statement that they touched every row they were given: a row that
     * changed since it was read makes a shortfall, which divides by zero
     * and fails the whole write flight, so the batch runs again
     * (write_failed). */
    snprintf(s->sql[ST_UPD], SQL_MAX,
             "WITH w AS (UPDATE \"%s\" t SET state = u.state, flags = u.flags, fingerprint = u.fp, "
             "fence = u.fence, lease_until = u.lease, expires_at = u.exp, record = u.rec "
             "FROM unnest($1::text[], $2::text[], $3::int8[], $4::int2[], $5::int4[], "
             "$6::bytea[], $7::int8[], $8::int8[], $9::int8[], $10::bytea[], $11::bytea[]) "
             "AS u(s, k, old, state, flags, fp, fence, lease, exp, rec, was) "
             "WHERE t.scope = u.s AND t.key = u.k AND t.fence = u.old AND t.record = u.was "
             "RETURNING 1) "
             "SELECT 1 / (count(*) = cardinality($1::text[]))::int FROM w",
             t);
    snprintf(s->sql[ST_DEL], SQL_MAX,
             "WITH w AS (DELETE FROM \"%s\" t USING unnest($1::text[], $2::text[], $3::int8[], "
             "$4::bytea[]) AS d(s, k, f, was) WHERE t.scope = d.s AND t.key = d.k AND t.fence = d.f "
             "AND t.record = d.was RETURNING 1) "
             "SELECT 1 / (count(*) = cardinality($1::text[]))::int FROM w",
             t);
    /* A speculative flight's checks of the keys it does not write: none
     * of them has a row, or each holds the fence and the record believed;
     * else a division by zero fails the flight (write_failed). */
    snprintf(s->sql[ST_ABSENT], SQL_MAX,
             "SELECT 1 / (NOT EXISTS (SELECT FROM \"%s\" t JOIN unnest($1::text[], $2::text[]) "
             "AS u(s, k) ON t.scope = u.s AND t.key = u.k))::int",
             t);
    snprintf(s->sql[ST_SAME], SQL_MAX,
             "SELECT 1 / (count(*) = cardinality($1::text[]))::int FROM \"%s\" t "
             "JOIN unnest($1::text[], $2::text[], $3::int8[], $4::bytea[]) AS u(s, k, f, was) "
             "ON t.scope = u.s AND t.key = u.k WHERE t.fence = u.f AND t.record = u.was",
             t);
    snprintf(s->sql[ST_GET], SQL_MAX,
             "SELECT record FROM \"%s\" WHERE scope = $1::text AND key = $2::text "
             "AND expires_at > $3::int8",
             t);
    snprintf(s->sql[ST_SWEEP], SQL_MAX,
             "DELETE FROM \"%s\" WHERE ctid = ANY (ARRAY(SELECT ctid FROM \"%s\" "
             "WHERE expires_at <= $1::int8 ORDER BY expires_at LIMIT $2::int8 "
             "FOR UPDATE SKIP LOCKED))",
             t, t);
    /* enable_seqscan and plan_cache_mode (PostgreSQL 12 and later, set
     * where the server has it): see "Plans" in the opening comment. */
    snprintf(s->settings, sizeof s->settings,
             "SELECT set_config('statement_timeout', '%lld', false), "
             "set_config('enable_seqscan', 'off', false), "
             "(SELECT set_config(name, 'force_generic_plan', false) FROM pg_settings "
             "WHERE name = 'plan_cache_mode')",
             (long long)s->cfg.timeout_ms);
    snprintf(s->connect_timeout, sizeof s->connect_timeout, "%lld",
             (long long)((s->cfg.timeout_ms + 999) / 1000));
}

static idem_err_t pg_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    struct cfg c;
    idem_err_t err = parse_url(rest, &c, errbuf, errlen);
    if (err != IDEM_OK)
        return err;
    if (out == NULL) {
        idem_free(c.uri);
        return IDEM_OK; /* idem_store_check_url: the URL is good */
    }

    struct pg_store *s = idem_calloc(1, sizeof *s);
    if (s == NULL) {
        idem_free(c.uri);
        return IDEM_E_NOMEM;
    }
    s->base.ops = &idem__store_postgres_ops;
    s->cfg = c;
    build_sql(s);
    idem__pool_cfg_t pc = {.ops = &pool_ops, .ctx = s, .max = c.pool, .wait_ms = c.timeout_ms};
    if (idem__pool_init(&s->pool, &pc) != IDEM_OK) {
        idem_free(c.uri);
        idem_free(s);
        return IDEM_E_NOMEM;
    }
    /* Without room to remember rows, every batch reads first. */
    s->spec.slots = idem_calloc(SPEC_SLOTS, sizeof *s->spec.slots);
    if (s->spec.slots != NULL && pthread_mutex_init(&s->spec.mu, NULL) != 0) {
        idem_free(s->spec.slots);
        s->spec.slots = NULL;
    }

    /* The first connection makes the table: a wrong URL, password or
     * privilege fails here, at start-up, not at the first request.  Room
     * for all of libpq's message: with several hosts it names each one. */
    char why[MSG_MAX + 64];
    struct pgc *first;
    enum outcome o = conn_open(s, true, &first, why, sizeof why);
    if (o != R_OK) {
        idem__store_errbuf(errbuf, errlen, "%s", why);
        pg_close(&s->base);
        return IDEM_E_STORE_DOWN;
    }
    idem__pool_adopt(&s->pool, &first->pc);
    *out = &s->base;
    return IDEM_OK;
}

const struct idem_store_ops idem__store_postgres_ops = {
    .name = "postgres",
    .scheme = "postgres",
    .open = pg_open,
    .close = pg_close,
    .exec = pg_exec,
    .get = pg_get,
    .sweep = pg_sweep,
    .ping = pg_ping,
    .list = pg_list,
    .publish = pg_publish,
    .watch_session = pg_watch_session,
};

/* The same backend under libpq's other scheme name. */
const struct idem_store_ops idem__store_postgresql_ops = {
    .name = "postgres",
    .scheme = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .exec = pg_exec,
    .get = pg_get,
    .sweep = pg_sweep,
    .ping = pg_ping,
    .list = pg_list,
    .publish = pg_publish,
    .watch_session = pg_watch_session,
};
