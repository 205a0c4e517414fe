/* examples/consumer/consumer.c - idem-consumer: payments from a Redis stream
 * applied to SQLite exactly once, with libidem's in-transaction message
 * de-duplication (idem/dedup.h, idem/tx.h).
 *
 * A Redis consumer group delivers at least once: a message read with
 * XREADGROUP stays in the consumer's pending list until it is XACKed, and is
 * delivered again after a crash (to the same consumer name, which re-reads its
 * pending entries at start, or to any other, which takes entries idle longer
 * than --claim-idle-ms with XAUTOCLAIM).  A producer that retried XADD after a
 * timeout also puts the same payment in the stream twice, under two entry
 * ids.  So each message is applied in one SQLite transaction:
 *
 *     BEGIN IMMEDIATE
 *     idem_dedup_tx_begin(tx, "payments", payment_id)
 *       NEW       -> UPDATE the balance, INSERT the payment,
 *                    idem_dedup_tx_done, COMMIT
 *       DUPLICATE -> note it in `skipped`, COMMIT (nothing else)
 *     ... and, once the whole batch is applied, one XACK for it.
 *
 * The de-duplication key is the business key (payment_id), not the entry
 * id, so both kinds of repeat are caught.  The mark and the effect commit
 * together, so a crash anywhere (before the COMMIT: nothing happened; after
 * it, before the XACK: the redelivery is a DUPLICATE and is acked) leaves
 * every payment applied exactly once.  Acking per batch rather than per
 * message saves round trips and widens the window a crash test aims at.
 *
 * A malformed message (a field missing or repeated, an amount that is not an
 * integer or is out of range, a bad account name) cannot crash the consumer
 * and is not retried forever: it is recorded in `rejected` and acked.  Its
 * payment_id cannot be trusted, so its de-duplication key is its entry id (in
 * the namespace "rejected"): a redelivery is not recorded twice.
 *
 * Failures.  SQLite's "busy" (IDEM_E_RETRY, SQLITE_BUSY) rolls back and runs
 * the transaction again with a jittered backoff; after RETRY_MAX attempts the
 * message is left unacked, to come back through XAUTOCLAIM.  Any other
 * database error ends the process (exit 1): the message stays pending.  A
 * Redis failure (refused, closed, timed out, an error reply) drops the
 * connection and reconnects with exponential backoff and full jitter; the
 * pending list is then read again from the start, since a batch read just
 * before the failure may not have been acked.  SIGTERM and SIGINT finish the
 * message being applied, ack what was applied, and exit 0.
 *
 * Limits on what input controls: --batch up to BATCH_MAX entries; one Redis
 * reply up to REPLY_MAX bytes (a bigger one is dropped, the batch size falls
 * to 1, and an entry too big even alone is found with XPENDING, rejected and
 * acked); a message up to FIELDS_MAX fields; payment_id 1 to IDEM_KEY_MAX
 * visible ASCII characters; account 1 to ACCOUNT_MAX of [A-Za-z0-9_.:-];
 * amount a decimal integer of magnitude at most AMOUNT_MAX, and a balance
 * that would leave int64 is rejected.  Names given on the command line are
 * bounded too (see usage).
 *
 * THREADING: one thread; one Redis connection and one SQLite connection.
 * Several processes may share a group and a database file (WAL mode; writers
 * take turns at BEGIN IMMEDIATE).
 */
#include <errno.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "idem/clock.h"
#include "idem/dedup.h"
#include "idem/error.h"
#include "idem/key.h"
#include "idem/retry.h"
#include "idem/tx.h"

#define PROG "idem-consumer"

#define BATCH_MAX 1000
#define BATCH_DEFAULT 16
#define REPLY_MAX (8u * 1024 * 1024) /* bytes of one Redis reply */
#define FIELDS_MAX 64                /* fields (not pairs) of one message */
#define ACCOUNT_MAX 64
#define AMOUNT_MAX INT64_C(1000000000000) /* 10^12 minor units */
#define ID_MAX 48                         /* a stream id: two 20-digit numbers and '-' */
#define HOST_MAX 253
#define NAME_MAX_LEN 200 /* --stream, --group, --consumer */
#define PATH_MAX_LEN 4096
#define MS_MAX (INT64_C(7) * 24 * 3600 * 1000) /* a week: claim-idle, exit-when-idle */
#define BLOCK_MS_MAX 60000
#define WORK_MS_MAX 1000
#define RETENTION_DEFAULT_MS (INT64_C(30) * 24 * 3600 * 1000)
#define RETENTION_MAX_MS (INT64_C(3660) * 24 * 3600 * 1000) /* ten years */
#define RETRY_MAX 50      /* attempts of one message's transaction */
#define SWEEP_EVERY_MS 60000
#define SWEEP_ROWS 1000
#define BUSY_TIMEOUT_MS 30000
#define REDIS_SLACK_MS 5000 /* a reply may come this long after --block-ms */

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* ---- options ------------------------------------------------------------ */

typedef struct opts {
    char host[HOST_MAX + 1];
    int port;
    int db;
    const char *stream;
    const char *group;
    const char *consumer;
    const char *db_path; /* after "sqlite:" */
    long batch;
    int64_t claim_idle_ms;
    int64_t block_ms;
    int64_t exit_idle_ms; /* 0: never */
    int64_t retention_ms; /* how long a payment_id is remembered */
    int64_t work_ms;      /* simulated work inside each transaction */
    bool dedup;           /* false only to show what goes wrong without it */
    bool verbose;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --redis redis://HOST[:PORT][/DB] --stream NAME --group NAME\n"
            "                     --consumer NAME --db sqlite:PATH [--batch N (1-%d, %d)]\n"
            "                     [--claim-idle-ms MS (1-%" PRId64 ", 30000)] [--block-ms MS (1-%d, 1000)]\n"
            "                     [--exit-when-idle MS] [--retention-ms MS] [--work-ms MS (0-%d)]\n"
            "                     [--dedup on|off] [--verbose]\n",
            BATCH_MAX, BATCH_DEFAULT, MS_MAX, BLOCK_MS_MAX, WORK_MS_MAX);
}

/* One line naming the problem, then exit 2 (the house rule for bad usage). */
static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static _Noreturn void bad_usage(const char *fmt, ...)
{
    va_list ap;
    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    if (*s == '\0' || *s == ' ' || *s == '+')
        return false;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = (int64_t)v;
    return true;
}

static int64_t opt_ms(const char *name, const char *val, int64_t lo, int64_t hi)
{
    int64_t v;
    if (!parse_i64(val, lo, hi, &v))
        bad_usage("%s: \"%.40s\" is not an integer from %" PRId64 " to %" PRId64, name, val, lo, hi);
    return v;
}

/* A name sent to Redis or written in rows: visible ASCII, bounded. */
static void opt_name(const char *opt, const char *val)
{
    size_t n = strlen(val);
    if (n == 0 || n > NAME_MAX_LEN)
        bad_usage("%s: must be 1 to %d characters", opt, NAME_MAX_LEN);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)val[i] < 0x21 || (unsigned char)val[i] > 0x7e)
            bad_usage("%s: only visible ASCII characters (no spaces)", opt);
}

/* redis://HOST[:PORT][/DB]; HOST a name or an IPv4 address. */
static void parse_redis_url(const char *url, opts_t *o)
{
    static const char prefix[] = "redis://";
    if (strncmp(url, prefix, sizeof prefix - 1) != 0)
        bad_usage("--redis: \"%.60s\" does not start with redis://", url);
    const char *h = url + sizeof prefix - 1;
    size_t hl = strcspn(h, ":/");
    if (hl == 0 || hl > HOST_MAX)
        bad_usage("--redis: the host must be 1 to %d characters", HOST_MAX);
    for (size_t i = 0; i < hl; i++) {
        char ch = h[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '-' || ch == '_'))
            bad_usage("--redis: bad character in the host \"%.*s\"", (int)hl, h);
    }
    memcpy(o->host, h, hl);
    o->host[hl] = '\0';
    const char *p = h + hl;
    o->port = 6379;
    o->db = 0;
    char num[16];
    if (*p == ':') {
        size_t nl = strcspn(p + 1, "/");
        int64_t v;
        if (nl == 0 || nl >= sizeof num)
            bad_usage("--redis: the port must be a number from 1 to 65535");
        memcpy(num, p + 1, nl);
        num[nl] = '\0';
        if (!parse_i64(num, 1, 65535, &v))
            bad_usage("--redis: the port must be a number from 1 to 65535");
        o->port = (int)v;
        p += 1 + nl;
    }
    if (*p == '/') {
        int64_t v;
        size_t nl = strlen(p + 1);
        if (nl == 0)
            return;
        if (nl >= sizeof num)
            bad_usage("--redis: the database must be a number from 0 to 65535");
        memcpy(num, p + 1, nl + 1);
        if (!parse_i64(num, 0, 65535, &v))
            bad_usage("--redis: the database must be a number from 0 to 65535");
        o->db = (int)v;
    } else if (*p != '\0') {
        bad_usage("--redis: unexpected \"%.40s\" after the host", p);
    }
}

static void parse_args(int argc, char **argv, opts_t *o)
{
    enum { O_REDIS = 256, O_STREAM, O_GROUP, O_CONSUMER, O_DB, O_BATCH, O_CLAIM, O_BLOCK,
           O_IDLE, O_RETENTION, O_WORK, O_DEDUP, O_VERBOSE, O_HELP };
    static const struct option longs[] = {
        {"redis", required_argument, NULL, O_REDIS},
        {"stream", required_argument, NULL, O_STREAM},
        {"group", required_argument, NULL, O_GROUP},
        {"consumer", required_argument, NULL, O_CONSUMER},
        {"db", required_argument, NULL, O_DB},
        {"batch", required_argument, NULL, O_BATCH},
        {"claim-idle-ms", required_argument, NULL, O_CLAIM},
        {"block-ms", required_argument, NULL, O_BLOCK},
        {"exit-when-idle", required_argument, NULL, O_IDLE},
        {"retention-ms", required_argument, NULL, O_RETENTION},
        {"work-ms", required_argument, NULL, O_WORK},
        {"dedup", required_argument, NULL, O_DEDUP},
        {"verbose", no_argument, NULL, O_VERBOSE},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *redis = NULL;
    memset(o, 0, sizeof *o);
    o->batch = BATCH_DEFAULT;
    o->claim_idle_ms = 30000;
    o->block_ms = 1000;
    o->retention_ms = RETENTION_DEFAULT_MS;
    o->dedup = true;
    opterr = 0;
    for (;;) {
        int prev = optind;
        int c = getopt_long(argc, argv, ":v", longs, NULL);
        if (c == -1)
            break;
        switch (c) {
        case O_REDIS: redis = optarg; break;
        case O_STREAM: opt_name("--stream", optarg); o->stream = optarg; break;
        case O_GROUP: opt_name("--group", optarg); o->group = optarg; break;
        case O_CONSUMER: opt_name("--consumer", optarg); o->consumer = optarg; break;
        case O_DB:
            if (strncmp(optarg, "sqlite:", 7) != 0 || optarg[7] == '\0')
                bad_usage("--db: \"%.60s\" is not sqlite:PATH", optarg);
            if (strlen(optarg + 7) > PATH_MAX_LEN)
                bad_usage("--db: the path is longer than %d characters", PATH_MAX_LEN);
            o->db_path = optarg + 7;
            break;
        case O_BATCH: o->batch = (long)opt_ms("--batch", optarg, 1, BATCH_MAX); break;
        case O_CLAIM: o->claim_idle_ms = opt_ms("--claim-idle-ms", optarg, 1, MS_MAX); break;
        case O_BLOCK: o->block_ms = opt_ms("--block-ms", optarg, 1, BLOCK_MS_MAX); break;
        case O_IDLE: o->exit_idle_ms = opt_ms("--exit-when-idle", optarg, 1, MS_MAX); break;
        case O_RETENTION:
            o->retention_ms = opt_ms("--retention-ms", optarg, 1000, RETENTION_MAX_MS);
            break;
        case O_WORK: o->work_ms = opt_ms("--work-ms", optarg, 0, WORK_MS_MAX); break;
        case O_DEDUP:
            if (strcmp(optarg, "on") == 0)
                o->dedup = true;
            else if (strcmp(optarg, "off") == 0)
                o->dedup = false;
            else
                bad_usage("--dedup: \"%.20s\" is neither on nor off", optarg);
            break;
        case 'v':
        case O_VERBOSE: o->verbose = true; break;
        case O_HELP: usage(stdout); exit(0);
        case ':': bad_usage("%.60s: needs a value", argv[prev]);
        default: bad_usage("unknown option \"%.60s\"", argv[prev]);
        }
    }
    if (optind < argc)
        bad_usage("unexpected argument \"%.60s\"", argv[optind]);
    if (redis == NULL)
        bad_usage("--redis is required");
    parse_redis_url(redis, o);
    if (o->stream == NULL)
        bad_usage("--stream is required");
    if (o->group == NULL)
        bad_usage("--group is required");
    if (o->consumer == NULL)
        bad_usage("--consumer is required");
    if (o->db_path == NULL)
        bad_usage("--db is required");
}

/* ---- the consumer --------------------------------------------------------- */

/* Where a batch came from (written in every row, so a test can see each
 * path taken). */
typedef enum via { VIA_PENDING, VIA_CLAIMED, VIA_NEW } via_t;
static const char *const via_names[] = {"pending", "claimed", "new"};

/* What applying one message came to. */
typedef enum outcome {
    OUT_APPLIED,   /* committed: ack it */
    OUT_DUPLICATE, /* done before: ack it */
    OUT_REJECTED,  /* malformed, recorded: ack it */
    OUT_LEFT,      /* retries exhausted: leave it pending */
    OUT_FATAL,     /* the database failed: stop */
} outcome_t;

typedef struct consumer {
    opts_t o;
    redisContext *rc;
    sqlite3 *db;
    idem_tx_t *tx;
    sqlite3_stmt *st_begin, *st_commit, *st_rollback;
    sqlite3_stmt *st_bal_get, *st_bal_put, *st_pay_ins, *st_rej_ins, *st_skip_ins;
    bool pend_done;          /* the pending list was read through since connecting */
    char pend_cursor[ID_MAX + 1];  /* last pending entry seen */
    char claim_cursor[ID_MAX + 1]; /* XAUTOCLAIM's next start */
    long batch;              /* the batch size now: o.batch, or 1 after a reply too big */
    bool oversize;           /* the last reply was too big: find the entry */
    char (*acks)[ID_MAX + 1]; /* entry ids to ack after this batch */
    size_t nacks;
    uint64_t applied, duplicates, rejected, left, reconnects;
    idem_retry_policy_t redis_backoff, db_backoff;
} consumer_t;

static void logf_(const consumer_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void logf_(const consumer_t *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG "[%s]: %s\n", c->o.consumer, line);
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_stop) {
    }
}

static int64_t now_ms(void)
{
    return idem_clock_now(NULL);
}

/* ---- Redis ---------------------------------------------------------------- */

typedef enum rstat {
    RS_OK,
    RS_DOWN,    /* the connection failed or Redis answered an error: reconnect */
    RS_TOOBIG,  /* the reply passed REPLY_MAX: reconnect, then look for the entry */
    RS_STOPPED, /* a signal came during a blocking read */
} rstat_t;

static void redis_drop(consumer_t *c)
{
    if (c->rc != NULL) {
        redisFree(c->rc);
        c->rc = NULL;
    }
}

/* Send one command and read its reply, counting the bytes so that no reply
 * can make the process grow past REPLY_MAX.  The read is done here rather
 * than in redisGetReply so that the count is possible and a blocking read
 * can give way to SIGTERM.  An error reply is RS_DOWN with *out set (the
 * caller looks at it and frees it); otherwise *out is the reply on RS_OK. */
static rstat_t redis_call(consumer_t *c, redisReply **out, bool interruptible, int argc,
                          const char **argv, const size_t *lens)
{
    *out = NULL;
    if (c->rc == NULL)
        return RS_DOWN;
    if (redisAppendCommandArgv(c->rc, argc, argv, lens) != REDIS_OK) {
        logf_(c, "redis: %s", c->rc->errstr);
        return RS_DOWN;
    }
    int done = 0;
    while (!done) {
        if (redisBufferWrite(c->rc, &done) != REDIS_OK) {
            logf_(c, "redis: write: %s", c->rc->errstr);
            return RS_DOWN;
        }
    }
    size_t fed = 0;
    void *reply = NULL;
    for (;;) {
        if (redisReaderGetReply(c->rc->reader, &reply) != REDIS_OK) {
            logf_(c, "redis: bad reply: %s", c->rc->reader->errstr);
            return RS_DOWN;
        }
        if (reply != NULL)
            break;
        if (interruptible && g_stop)
            return RS_STOPPED;
        char buf[16384];
        ssize_t n = read(c->rc->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            logf_(c, "redis: read: %s", errno == EAGAIN || errno == EWOULDBLOCK
                                            ? "timed out" : strerror(errno));
            return RS_DOWN;
        }
        if (n == 0) {
            logf_(c, "redis: the server closed the connection");
            return RS_DOWN;
        }
        fed += (size_t)n;
        if (fed > REPLY_MAX) {
            logf_(c, "redis: a reply passed %u bytes; dropped", REPLY_MAX);
            return RS_TOOBIG;
        }
        if (redisReaderFeed(c->rc->reader, buf, (size_t)n) != REDIS_OK) {
            logf_(c, "redis: bad reply: %s", c->rc->reader->errstr);
            return RS_DOWN;
        }
    }
    *out = reply;
    if ((*out)->type == REDIS_REPLY_ERROR)
        return RS_DOWN;
    return RS_OK;
}

/* redis_call with argv of NUL-terminated strings. */
static rstat_t redis_cmd(consumer_t *c, redisReply **out, bool interruptible, int argc,
                         const char **argv)
{
    size_t lens[16];
    if (argc > 16)
        return RS_DOWN;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    return redis_call(c, out, interruptible, argc, argv, lens);
}

/* Log and free a reply that ended a call with RS_DOWN. */
static void redis_log_error(consumer_t *c, const char *what, redisReply *r)
{
    if (r != NULL && r->type == REDIS_REPLY_ERROR)
        logf_(c, "redis: %s: %.200s", what, r->str);
    if (r != NULL)
        freeReplyObject(r);
}

/* Create the group (from the start of the stream, creating the stream);
 * one that exists already is fine. */
static rstat_t redis_group(consumer_t *c)
{
    const char *argv[] = {"XGROUP", "CREATE", c->o.stream, c->o.group, "0", "MKSTREAM"};
    redisReply *r;
    rstat_t s = redis_cmd(c, &r, false, 6, argv);
    if (s == RS_DOWN && r != NULL && r->type == REDIS_REPLY_ERROR &&
        strncmp(r->str, "BUSYGROUP", 9) == 0)
        s = RS_OK;
    if (s == RS_OK) {
        freeReplyObject(r);
        return RS_OK;
    }
    redis_log_error(c, "XGROUP CREATE", r);
    return s;
}

/* Connect, SELECT, create the group; back off between failures until it
 * works or a signal asks to stop. */
static void redis_connect(consumer_t *c)
{
    for (unsigned attempt = 0; !g_stop; attempt++) {
        if (attempt > 0) {
            unsigned a = attempt - 1 > 30 ? 30 : attempt - 1;
            sleep_ms(idem_retry_backoff(&c->redis_backoff, a, NULL));
            if (g_stop)
                return;
        }
        struct timeval tv = {.tv_sec = 5, .tv_usec = 0};
        c->rc = redisConnectWithTimeout(c->o.host, c->o.port, tv);
        if (c->rc == NULL) {
            logf_(c, "redis: out of memory");
            continue;
        }
        if (c->rc->err) {
            if (attempt == 0 || c->o.verbose)
                logf_(c, "redis: connect %s:%d: %s", c->o.host, c->o.port, c->rc->errstr);
            redis_drop(c);
            continue;
        }
        int64_t to = c->o.block_ms + REDIS_SLACK_MS;
        tv.tv_sec = (time_t)(to / 1000);
        tv.tv_usec = (suseconds_t)(to % 1000) * 1000;
        if (redisSetTimeout(c->rc, tv) != REDIS_OK) {
            redis_drop(c);
            continue;
        }
        if (c->o.db != 0) {
            char dbs[16];
            snprintf(dbs, sizeof dbs, "%d", c->o.db);
            const char *argv[] = {"SELECT", dbs};
            redisReply *r;
            rstat_t s = redis_cmd(c, &r, false, 2, argv);
            if (s != RS_OK) {
                redis_log_error(c, "SELECT", r);
                redis_drop(c);
                continue;
            }
            freeReplyObject(r);
        }
        if (redis_group(c) != RS_OK) {
            redis_drop(c);
            continue;
        }
        if (c->reconnects > 0 || attempt > 0)
            logf_(c, "redis: connected again (attempt %u)", attempt + 1);
        /* Acks that did not get through are dropped: those entries come
         * again with the pending list and are DUPLICATEs then. */
        c->nacks = 0;
        c->pend_done = false;
        snprintf(c->pend_cursor, sizeof c->pend_cursor, "0");
        snprintf(c->claim_cursor, sizeof c->claim_cursor, "0-0");
        return;
    }
}

/* Acknowledge the ids collected in c->acks (one XACK). */
static rstat_t redis_ack(consumer_t *c)
{
    if (c->nacks == 0)
        return RS_OK;
    size_t argc = 3 + c->nacks;
    const char **argv = malloc(argc * sizeof *argv);
    size_t *lens = malloc(argc * sizeof *lens);
    rstat_t s = RS_DOWN;
    if (argv != NULL && lens != NULL) {
        argv[0] = "XACK";
        argv[1] = c->o.stream;
        argv[2] = c->o.group;
        for (size_t i = 0; i < c->nacks; i++)
            argv[3 + i] = c->acks[i];
        for (size_t i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        redisReply *r;
        s = redis_call(c, &r, false, (int)argc, argv, lens);
        if (s == RS_OK)
            freeReplyObject(r);
        else
            redis_log_error(c, "XACK", r);
    } else {
        logf_(c, "out of memory acking");
    }
    free(argv);
    free(lens);
    if (s == RS_OK)
        c->nacks = 0;
    return s;
}

/* ---- SQLite ---------------------------------------------------------------- */

static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS accounts ("
    "  account TEXT PRIMARY KEY, balance INTEGER NOT NULL);"
    /* No UNIQUE on payment_id, on purpose: the de-duplication is what keeps
     * a payment from being applied twice, and --dedup off shows it. */
    "CREATE TABLE IF NOT EXISTS payments ("
    "  seq INTEGER PRIMARY KEY, payment_id TEXT NOT NULL, account TEXT NOT NULL,"
    "  amount INTEGER NOT NULL, stream_id TEXT NOT NULL, consumer TEXT NOT NULL,"
    "  via TEXT NOT NULL, applied_at_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS rejected ("
    "  seq INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, reason TEXT NOT NULL,"
    "  payment_id TEXT, consumer TEXT NOT NULL, via TEXT NOT NULL, at_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS skipped ("
    "  seq INTEGER PRIMARY KEY, ns TEXT NOT NULL, dedup_key TEXT NOT NULL,"
    "  stream_id TEXT NOT NULL, consumer TEXT NOT NULL, via TEXT NOT NULL,"
    "  at_ms INTEGER NOT NULL);";

static bool db_prepare(consumer_t *c, sqlite3_stmt **st, const char *sql)
{
    if (sqlite3_prepare_v2(c->db, sql, -1, st, NULL) != SQLITE_OK) {
        logf_(c, "sqlite: %s: %s", sql, sqlite3_errmsg(c->db));
        return false;
    }
    return true;
}

/* Run a prepared statement that returns no row to keep; reset it after. */
static int db_step(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

static bool db_exec(consumer_t *c, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        logf_(c, "sqlite: %.60s: %s", sql, err != NULL ? err : sqlite3_errmsg(c->db));
        sqlite3_free(err);
        return false;
    }
    return true;
}

/* Switch a database to WAL.  Two consumers that open a new file at the same
 * moment both ask for the switch, and SQLite answers the loser SQLITE_BUSY
 * at once, without calling the busy handler (the switch needs the file to
 * itself); so retry it here for as long as the busy timeout would wait. */
static bool db_use_wal(consumer_t *c)
{
    for (int64_t waited = 0;; waited += 20) {
        int rc = sqlite3_exec(c->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            return true;
        if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
            break;
        if (waited >= BUSY_TIMEOUT_MS || g_stop)
            break;
        sleep_ms(20);
    }
    logf_(c, "sqlite: PRAGMA journal_mode=WAL: %s", sqlite3_errmsg(c->db));
    return false;
}

static bool db_open(consumer_t *c)
{
    if (sqlite3_open_v2(c->o.db_path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                        NULL) != SQLITE_OK) {
        logf_(c, "sqlite: open %s: %s", c->o.db_path,
              c->db != NULL ? sqlite3_errmsg(c->db) : "out of memory");
        return false;
    }
    sqlite3_busy_timeout(c->db, BUSY_TIMEOUT_MS);
    /* WAL lets readers (a test, a report) look while writers take turns;
     * synchronous=FULL makes a commit durable before the XACK that follows. */
    if (!db_use_wal(c) || !db_exec(c, "PRAGMA synchronous=FULL"))
        return false;
    idem_err_t e = idem_tx_sqlite(c->db, NULL, &c->tx);
    if (e != IDEM_OK) {
        logf_(c, "idem_tx_sqlite: %s", idem_strerror(e));
        return false;
    }
    /* Two consumers starting together create the tables one after the other. */
    if (!db_exec(c, "BEGIN IMMEDIATE"))
        return false;
    if (!db_exec(c, schema_sql)) {
        db_exec(c, "ROLLBACK");
        return false;
    }
    e = idem_tx_migrate(c->tx);
    if (e != IDEM_OK) {
        logf_(c, "idem_tx_migrate: %s: %s", idem_strerror(e), idem_tx_errstr(c->tx));
        db_exec(c, "ROLLBACK");
        return false;
    }
    if (!db_exec(c, "COMMIT"))
        return false;
    return db_prepare(c, &c->st_begin, "BEGIN IMMEDIATE") &&
           db_prepare(c, &c->st_commit, "COMMIT") &&
           db_prepare(c, &c->st_rollback, "ROLLBACK") &&
           db_prepare(c, &c->st_bal_get, "SELECT balance FROM accounts WHERE account = ?1") &&
           db_prepare(c, &c->st_bal_put,
                      "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                      " ON CONFLICT (account) DO UPDATE SET balance = excluded.balance") &&
           db_prepare(c, &c->st_pay_ins,
                      "INSERT INTO payments (payment_id, account, amount, stream_id, consumer,"
                      " via, applied_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)") &&
           db_prepare(c, &c->st_rej_ins,
                      "INSERT INTO rejected (stream_id, reason, payment_id, consumer, via, at_ms)"
                      " VALUES (?1, ?2, ?3, ?4, ?5, ?6)") &&
           db_prepare(c, &c->st_skip_ins,
                      "INSERT INTO skipped (ns, dedup_key, stream_id, consumer, via, at_ms)"
                      " VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
}

static void db_close(consumer_t *c)
{
    sqlite3_stmt *all[] = {c->st_begin, c->st_commit, c->st_rollback, c->st_bal_get,
                           c->st_bal_put, c->st_pay_ins, c->st_rej_ins, c->st_skip_ins};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        sqlite3_finalize(all[i]);
    idem_tx_free(c->tx);
    c->tx = NULL;
    if (c->db != NULL)
        sqlite3_close(c->db);
    c->db = NULL;
}

/* Delete de-duplication records past their retention, now and then. */
static void db_sweep(consumer_t *c)
{
    if (db_step(c->st_begin) != SQLITE_DONE)
        return;
    size_t removed = 0;
    idem_err_t e = idem_tx_sweep(c->tx, now_ms(), SWEEP_ROWS, &removed);
    if (e == IDEM_OK && db_step(c->st_commit) == SQLITE_DONE) {
        if (removed > 0 && c->o.verbose)
            logf_(c, "swept %zu expired de-duplication records", removed);
        return;
    }
    db_step(c->st_rollback);
}

/* ---- one message ---------------------------------------------------------- */

/* A message's payment, when it is well formed. */
typedef struct payment {
    const char *id;
    size_t id_len;
    const char *account;
    size_t account_len;
    int64_t amount;
} payment_t;

/* Parse an amount: an optional '-', then 1 to 13 digits, |v| <= AMOUNT_MAX. */
static bool parse_amount(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (n > 0 && s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == n || n - i > 13)
        return false;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v > AMOUNT_MAX)
        return false;
    *out = neg ? -v : v;
    return true;
}

/* Check a message's fields; on failure *reason says why (static text). */
static bool parse_payment(const redisReply *fields, payment_t *p, const char **reason)
{
    const redisReply *vid = NULL, *vacc = NULL, *vamt = NULL;
    memset(p, 0, sizeof *p);
    if (fields == NULL || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2 != 0) {
        *reason = "fields are not name/value pairs";
        return false;
    }
    if (fields->elements > FIELDS_MAX) {
        *reason = "too many fields";
        return false;
    }
    for (size_t i = 0; i < fields->elements; i += 2) {
        const redisReply *k = fields->element[i], *v = fields->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
            *reason = "a field is not a string";
            return false;
        }
        const redisReply **slot = NULL;
        if (k->len == 10 && memcmp(k->str, "payment_id", 10) == 0)
            slot = &vid;
        else if (k->len == 7 && memcmp(k->str, "account", 7) == 0)
            slot = &vacc;
        else if (k->len == 6 && memcmp(k->str, "amount", 6) == 0)
            slot = &vamt;
        if (slot == NULL)
            continue;
        if (*slot != NULL) {
            *reason = "a field is given twice";
            return false;
        }
        *slot = v;
    }
    if (vid == NULL || vacc == NULL || vamt == NULL) {
        *reason = vid == NULL ? "payment_id is missing"
                  : vacc == NULL ? "account is missing" : "amount is missing";
        return false;
    }
    if (vid->len == 0 || vid->len > IDEM_KEY_MAX) {
        *reason = "payment_id is empty or too long";
        return false;
    }
    for (size_t i = 0; i < vid->len; i++)
        if ((unsigned char)vid->str[i] < 0x21 || (unsigned char)vid->str[i] > 0x7e) {
            *reason = "payment_id has a character that is not visible ASCII";
            return false;
        }
    if (vacc->len == 0 || vacc->len > ACCOUNT_MAX) {
        *reason = "account is empty or too long";
        return false;
    }
    for (size_t i = 0; i < vacc->len; i++) {
        char ch = vacc->str[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == ':' || ch == '-')) {
            *reason = "account has a character outside [A-Za-z0-9_.:-]";
            return false;
        }
    }
    if (!parse_amount(vamt->str, vamt->len, &p->amount)) {
        *reason = "amount is not an integer from -10^12 to 10^12";
        return false;
    }
    p->id = vid->str;
    p->id_len = vid->len;
    p->account = vacc->str;
    p->account_len = vacc->len;
    return true;
}

typedef enum step { S_OK, S_RETRY, S_FATAL } step_t;

static step_t sql_result(consumer_t *c, int rc, const char *what)
{
    if (rc == SQLITE_DONE || rc == SQLITE_OK)
        return S_OK;
    if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
        return S_RETRY;
    logf_(c, "sqlite: %s: %s", what, sqlite3_errmsg(c->db));
    return S_FATAL;
}

static step_t idem_result(consumer_t *c, idem_err_t e, const char *what)
{
    if (e == IDEM_OK)
        return S_OK;
    if (e == IDEM_E_RETRY)
        return S_RETRY;
    logf_(c, "%s: %s: %s", what, idem_strerror(e), idem_tx_errstr(c->tx));
    return S_FATAL;
}

/* Bind the three columns every row the consumer writes ends with (consumer,
 * via, at_ms) to st's parameters first, first + 1 and first + 2. */
static void bind_origin(consumer_t *c, sqlite3_stmt *st, int first, via_t via, int64_t t)
{
    sqlite3_bind_text(st, first, c->o.consumer, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, first + 1, via_names[via], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, first + 2, t);
}

/* The business write of a good payment: the balance, then the row.  A
 * balance that would leave int64 turns the payment into a rejection. */
static step_t apply_payment(consumer_t *c, const payment_t *p, const char *sid, via_t via,
                            int64_t t, const char **reason)
{
    int64_t balance = 0, next;
    sqlite3_bind_text(c->st_bal_get, 1, p->account, (int)p->account_len, SQLITE_STATIC);
    int rc = sqlite3_step(c->st_bal_get);
    if (rc == SQLITE_ROW)
        balance = sqlite3_column_int64(c->st_bal_get, 0);
    sqlite3_reset(c->st_bal_get);
    sqlite3_clear_bindings(c->st_bal_get);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return sql_result(c, rc, "read the balance");
    if (__builtin_add_overflow(balance, p->amount, &next)) {
        *reason = "the balance would leave the range of int64";
        return S_OK;
    }
    sqlite3_bind_text(c->st_bal_put, 1, p->account, (int)p->account_len, SQLITE_STATIC);
    sqlite3_bind_int64(c->st_bal_put, 2, next);
    step_t s = sql_result(c, db_step(c->st_bal_put), "update the balance");
    if (s != S_OK)
        return s;
    sqlite3_stmt *st = c->st_pay_ins;
    sqlite3_bind_text(st, 1, p->id, (int)p->id_len, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, p->account, (int)p->account_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, p->amount);
    sqlite3_bind_text(st, 4, sid, -1, SQLITE_STATIC);
    bind_origin(c, st, 5, via, t);
    return sql_result(c, db_step(st), "insert the payment");
}

static step_t record_rejected(consumer_t *c, const char *sid, const char *reason,
                              const payment_t *p, const redisReply *fields, via_t via, int64_t t)
{
    sqlite3_stmt *st = c->st_rej_ins;
    sqlite3_bind_text(st, 1, sid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    /* The payment_id as sent, when there was a usable one (for a person
     * reading the table; it is not the de-duplication key). */
    if (p->id != NULL) {
        sqlite3_bind_text(st, 3, p->id, (int)p->id_len, SQLITE_STATIC);
    } else if (fields != NULL && fields->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i + 1 < fields->elements; i += 2) {
            const redisReply *k = fields->element[i], *v = fields->element[i + 1];
            if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING && k->len == 10 &&
                memcmp(k->str, "payment_id", 10) == 0 && v->len <= IDEM_KEY_MAX) {
                sqlite3_bind_blob(st, 3, v->str, (int)v->len, SQLITE_STATIC);
                break;
            }
        }
    }
    bind_origin(c, st, 4, via, t);
    return sql_result(c, db_step(st), "insert the rejection");
}

/* One attempt at the message's transaction.  With forced, the message is
 * rejected for that reason without being parsed.  On S_OK, *out is the
 * outcome. */
static step_t apply_once(consumer_t *c, const char *sid, const redisReply *fields, via_t via,
                         const char *forced, outcome_t *out)
{
    payment_t p = {0};
    const char *reason = forced;
    bool good = forced == NULL && parse_payment(fields, &p, &reason);
    /* A good payment is de-duplicated by its business key; a malformed
     * message has none to trust, so by its entry id. */
    const char *ns = good ? "payments" : "rejected";
    const char *key = good ? p.id : sid;
    size_t key_len = good ? p.id_len : strlen(sid);
    int64_t t = now_ms();
    idem_dedup_claim_t claim = {0};
    outcome_t outcome;

    step_t s = sql_result(c, db_step(c->st_begin), "BEGIN IMMEDIATE");
    if (s != S_OK)
        return s;
    if (c->o.dedup) {
        s = idem_result(c, idem_dedup_tx_begin(c->tx, ns, key, key_len, t, &claim),
                        "idem_dedup_tx_begin");
        if (s == S_OK && claim.verdict == IDEM_DEDUP_IN_PROGRESS)
            s = S_RETRY; /* not on SQLite; treated as busy all the same */
        if (s != S_OK)
            goto rollback;
        if (claim.verdict == IDEM_DEDUP_DUPLICATE) {
            sqlite3_stmt *st = c->st_skip_ins;
            sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, key, (int)key_len, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, sid, -1, SQLITE_STATIC);
            bind_origin(c, st, 4, via, t);
            s = sql_result(c, db_step(st), "insert the skip");
            if (s != S_OK)
                goto rollback;
            outcome = OUT_DUPLICATE;
            goto commit;
        }
    }
    if (good) {
        s = apply_payment(c, &p, sid, via, t, &reason);
        if (s != S_OK)
            goto rollback;
    }
    if (reason != NULL) {
        s = record_rejected(c, sid, reason, &p, fields, via, t);
        if (s != S_OK)
            goto rollback;
    }
    sleep_ms(c->o.work_ms);
    if (c->o.dedup) {
        s = idem_result(c, idem_dedup_tx_done(c->tx, ns, key, key_len, claim.fence, t,
                                              c->o.retention_ms),
                        "idem_dedup_tx_done");
        if (s != S_OK)
            goto rollback;
    }
    outcome = reason != NULL ? OUT_REJECTED : OUT_APPLIED;
commit:
    s = sql_result(c, db_step(c->st_commit), "COMMIT");
    if (s != S_OK)
        goto rollback;
    *out = outcome;
    if (c->o.verbose && outcome == OUT_DUPLICATE)
        logf_(c, "duplicate %s (%s): %s %.*s done before", sid, via_names[via], ns, (int)key_len,
              key);
    else if (c->o.verbose)
        logf_(c, "%s %s (%s)%s%s", outcome == OUT_APPLIED ? "applied" : "rejected", sid,
              via_names[via], reason != NULL ? ": " : "", reason != NULL ? reason : "");
    return S_OK;
rollback:
    if (sqlite3_get_autocommit(c->db) == 0)
        db_step(c->st_rollback);
    return s;
}

/* Apply one message, running its transaction again while the database is
 * busy.  forced: see apply_once. */
static outcome_t apply_message(consumer_t *c, const char *sid, const redisReply *fields,
                               via_t via, const char *forced)
{
    for (unsigned attempt = 0; attempt < RETRY_MAX; attempt++) {
        outcome_t out = OUT_FATAL;
        step_t s = apply_once(c, sid, fields, via, forced, &out);
        if (s == S_OK)
            return out;
        if (s == S_FATAL)
            return OUT_FATAL;
        sleep_ms(idem_retry_backoff(&c->db_backoff, attempt > 10 ? 10 : attempt, NULL));
    }
    logf_(c, "%s: the database stayed busy for %d attempts; left pending", sid, RETRY_MAX);
    return OUT_LEFT;
}

/* ---- batches ---------------------------------------------------------------- */

typedef enum bstat { B_OK, B_FATAL, B_REDIS } bstat_t;

/* Apply the entries of one reply ([[id, [field, value, ...] | nil], ...])
 * in order, then ack them.  *got counts the entries seen.  The last id is
 * kept in last (the pending cursor). */
static bstat_t run_batch(consumer_t *c, const redisReply *entries, via_t via, size_t *got,
                         char *last)
{
    *got = 0;
    bstat_t st = B_OK;
    if (entries == NULL || entries->type != REDIS_REPLY_ARRAY)
        return B_OK;
    for (size_t i = 0; i < entries->elements && !g_stop; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len == 0 ||
            e->element[0]->len > ID_MAX)
            continue; /* a deleted entry without an id (Redis 6.2's XAUTOCLAIM) */
        char sid[ID_MAX + 1];
        memcpy(sid, e->element[0]->str, e->element[0]->len);
        sid[e->element[0]->len] = '\0';
        (*got)++;
        if (last != NULL)
            snprintf(last, ID_MAX + 1, "%s", sid);
        outcome_t out;
        if (e->element[1]->type == REDIS_REPLY_NIL) {
            out = OUT_DUPLICATE; /* deleted from the stream while pending: nothing to apply */
        } else {
            out = apply_message(c, sid, e->element[1], via, NULL);
        }
        switch (out) {
        case OUT_APPLIED: c->applied++; break;
        case OUT_DUPLICATE: c->duplicates++; break;
        case OUT_REJECTED: c->rejected++; break;
        case OUT_LEFT: c->left++; continue;
        case OUT_FATAL: st = B_FATAL; break;
        }
        if (st == B_FATAL)
            break;
        if (c->nacks == BATCH_MAX && redis_ack(c) != RS_OK) {
            st = B_REDIS; /* more entries than asked for: ack as they come */
            break;
        }
        memcpy(c->acks[c->nacks++], sid, sizeof sid);
    }
    if (st != B_REDIS && redis_ack(c) != RS_OK && st == B_OK)
        st = B_REDIS;
    return st;
}

/* After a reply too big: the entry at the head of what this consumer holds
 * beyond the pending cursor is the one.  It is rejected (by its entry id)
 * and acked without ever being read. */
static bstat_t reject_oversize(consumer_t *c)
{
    char start[ID_MAX + 2];
    if (strcmp(c->pend_cursor, "0") == 0)
        snprintf(start, sizeof start, "-");
    else
        snprintf(start, sizeof start, "(%s", c->pend_cursor);
    const char *argv[] = {"XPENDING", c->o.stream, c->o.group, start, "+", "1", c->o.consumer};
    redisReply *r;
    if (redis_cmd(c, &r, false, 7, argv) != RS_OK) {
        redis_log_error(c, "XPENDING", r);
        return B_REDIS;
    }
    bstat_t b = B_OK;
    /* [[id, consumer, idle, deliveries]] */
    const redisReply *e = r->type == REDIS_REPLY_ARRAY && r->elements == 1 ? r->element[0] : NULL;
    if (e != NULL && e->type == REDIS_REPLY_ARRAY && e->elements >= 1 &&
        e->element[0]->type == REDIS_REPLY_STRING && e->element[0]->len <= ID_MAX) {
        char sid[ID_MAX + 1];
        memcpy(sid, e->element[0]->str, e->element[0]->len);
        sid[e->element[0]->len] = '\0';
        logf_(c, "%s: larger than %u bytes: rejected unread", sid, REPLY_MAX);
        switch (apply_message(c, sid, NULL, VIA_PENDING,
                              "the message is larger than the consumer reads")) {
        case OUT_REJECTED: c->rejected++; break;
        case OUT_DUPLICATE: c->duplicates++; break;
        case OUT_APPLIED: break; /* not with a forced reason */
        case OUT_LEFT: c->left++; break;
        case OUT_FATAL: b = B_FATAL; break;
        }
        if (b == B_OK && c->nacks < BATCH_MAX)
            memcpy(c->acks[c->nacks++], sid, sizeof sid);
        if (b == B_OK && redis_ack(c) != RS_OK)
            b = B_REDIS;
    }
    freeReplyObject(r);
    if (b == B_OK)
        c->oversize = false;
    return b;
}

/* Read and apply one batch from one of the three sources.  *got is how many
 * entries came. */
static bstat_t poll_once(consumer_t *c, via_t via, size_t *got)
{
    char count[16], block[24];
    snprintf(count, sizeof count, "%ld", c->batch);
    snprintf(block, sizeof block, "%" PRId64, c->o.block_ms);
    char idle[24];
    snprintf(idle, sizeof idle, "%" PRId64, c->o.claim_idle_ms);
    redisReply *r = NULL;
    rstat_t s;
    *got = 0;
    if (via == VIA_PENDING) {
        const char *argv[] = {"XREADGROUP", "GROUP", c->o.group, c->o.consumer, "COUNT", count,
                              "STREAMS", c->o.stream, c->pend_cursor};
        s = redis_cmd(c, &r, false, 9, argv);
    } else if (via == VIA_CLAIMED) {
        const char *argv[] = {"XAUTOCLAIM", c->o.stream, c->o.group, c->o.consumer, idle,
                              c->claim_cursor, "COUNT", count};
        s = redis_cmd(c, &r, false, 8, argv);
    } else {
        const char *argv[] = {"XREADGROUP", "GROUP", c->o.group, c->o.consumer, "COUNT", count,
                              "BLOCK", block, "STREAMS", c->o.stream, ">"};
        s = redis_cmd(c, &r, true, 11, argv);
    }
    if (s == RS_STOPPED)
        return B_OK;
    if (s == RS_TOOBIG) {
        if (c->batch == 1 && via == VIA_PENDING)
            c->oversize = true;
        c->batch = 1;
        return B_REDIS;
    }
    if (s != RS_OK) {
        if (r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOGROUP", 7) == 0)
            logf_(c, "redis: the group or the stream is gone; creating it again");
        redis_log_error(c, via == VIA_CLAIMED ? "XAUTOCLAIM" : "XREADGROUP", r);
        return B_REDIS;
    }
    const redisReply *entries = NULL;
    if (via == VIA_CLAIMED) {
        /* [next cursor, entries, (Redis 7) deleted ids] */
        if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
            r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len <= ID_MAX) {
            memcpy(c->claim_cursor, r->element[0]->str, r->element[0]->len);
            c->claim_cursor[r->element[0]->len] = '\0';
            entries = r->element[1];
        }
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
               r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2) {
        /* [[stream, entries]]; nil when a blocking read timed out */
        entries = r->element[0]->element[1];
    }
    bstat_t b = run_batch(c, entries, via, got, via == VIA_PENDING ? c->pend_cursor : NULL);
    if (via == VIA_PENDING && *got == 0 && b == B_OK)
        c->pend_done = true;
    if (*got > 0 && c->batch < c->o.batch && b == B_OK && via != VIA_PENDING)
        c->batch = c->o.batch; /* past the entry too big (the pending list is
                                * walked one by one to find it) */
    freeReplyObject(r);
    return b;
}

static int run(consumer_t *c)
{
    int64_t last_work = now_ms(), last_sweep = 0;
    logf_(c, "consuming %s as %s/%s into %s%s", c->o.stream, c->o.group, c->o.consumer,
          c->o.db_path, c->o.dedup ? "" : " WITHOUT de-duplication");
    while (!g_stop) {
        if (c->rc == NULL) {
            redis_connect(c);
            if (c->rc == NULL)
                break;
        }
        int64_t t = now_ms();
        if (t - last_sweep >= SWEEP_EVERY_MS && c->o.dedup) {
            db_sweep(c);
            last_sweep = t;
        }
        if (c->oversize) {
            bstat_t b = reject_oversize(c);
            if (b == B_FATAL)
                return 1;
            if (b == B_REDIS) {
                c->reconnects++;
                redis_drop(c);
                continue;
            }
        }
        size_t got = 0;
        bstat_t b;
        if (!c->pend_done) {
            b = poll_once(c, VIA_PENDING, &got);
        } else {
            b = poll_once(c, VIA_CLAIMED, &got);
            if (b == B_OK && got == 0 && !g_stop)
                b = poll_once(c, VIA_NEW, &got);
        }
        if (b == B_FATAL)
            return 1;
        if (b == B_REDIS) {
            c->reconnects++;
            redis_drop(c);
            continue;
        }
        t = now_ms();
        if (got > 0)
            last_work = t;
        else if (c->o.exit_idle_ms > 0 && t - last_work >= c->o.exit_idle_ms && c->pend_done)
            break;
    }
    return 0;
}

int main(int argc, char **argv)
{
    consumer_t c;
    memset(&c, 0, sizeof c);
    parse_args(argc, argv, &c.o);
    c.batch = c.o.batch;
    c.redis_backoff = (idem_retry_policy_t){.base_ms = 100, .cap_ms = 5000,
                                            .max_attempts = 1, .deadline_ms = 1};
    c.db_backoff = (idem_retry_policy_t){.base_ms = 2, .cap_ms = 200,
                                         .max_attempts = 1, .deadline_ms = 1};
    c.acks = calloc((size_t)BATCH_MAX, sizeof *c.acks);
    if (c.acks == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a blocking read gives way */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    if (db_open(&c))
        rc = run(&c);
    redis_drop(&c);
    db_close(&c);
    free(c.acks);
    logf_(&c, "exit %d: applied %" PRIu64 ", duplicates %" PRIu64 ", rejected %" PRIu64
              ", left pending %" PRIu64 ", reconnects %" PRIu64,
          rc, c.applied, c.duplicates, c.rejected, c.left, c.reconnects);
    return rc;
}
