/* examples/ledger/ledger.c - idem-ledger: accounts, transfers and orders over
 * HTTP, made safe to retry with libidem's in-transaction keys and state
 * machine.
 *
 * A transfer is the classic case of a request that must not run twice: the
 * client's connection breaks after the money moved, the client cannot know,
 * and it sends the transfer again.  Here every POST /transfers carries an
 * Idempotency-Key, and the key record is written in the same database
 * transaction as the debit, the credit and the transfer row
 * (include/idem/tx.h):
 *
 *     BEGIN IMMEDIATE / BEGIN
 *     idem_tx_begin            CLAIM    -> debit, credit, insert, build the
 *                                          answer, idem_tx_complete, COMMIT
 *                              REPLAY   -> ROLLBACK, send the stored answer
 *                              IN_FLIGHT-> ROLLBACK, 409 in-flight
 *                              MISMATCH -> ROLLBACK, 422 key-reused
 *
 * so the key and the money commit together or not at all: there is no
 * moment at which the transfer is applied but its key is not recorded, or
 * the reverse.  A business refusal (unknown account, insufficient funds) is
 * an answer too, and is stored under the key like a success.  When the
 * database refuses the transaction (SQLite busy, a PostgreSQL serialization
 * failure or deadlock) the whole transaction runs again, a bounded number
 * of times.  With --keys off the key is ignored: the double charging that
 * the keys prevent can then be watched happening.
 *
 * Orders are idempotent by their state instead (include/idem/fsm.h):
 * created -> paid -> shipped -> delivered, created|paid -> cancelled.  Paying
 * debits the account in the transaction that moves the order to paid;
 * paying a paid order is a success that changes nothing; cancelling a paid
 * order refunds it.  Order numbers and account ids are unique: creating one
 * again with the same fields answers the existing one.
 *
 * The HTTP side is server.c, the database side db.c.  Every database
 * connection (--threads of them) has its own idem_tx_t; a request borrows
 * one for the length of its transaction.
 *
 * THREADING: handlers run on the connection threads; the pool is the only
 * shared state and is guarded by its mutex.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "idem/clock.h"
#include "idem/engine.h"
#include "idem/fingerprint.h"
#include "idem/fsm.h"
#include "idem/key.h"
#include "idem/tx.h"
#include "server.h"

#define PROG "idem-ledger"
#define DEFAULT_LISTEN "127.0.0.1:8090"
#define DEFAULT_DB "sqlite:./ledger.db"
#define THREADS_MAX 64
#define ID_MAX 64                          /* characters of an account id or order number */
#define AMOUNT_MAX 1000000000000LL         /* cents in one transfer or order */
#define BALANCE_MAX 1000000000000000LL     /* cents in one account */
#define KEY_TTL_MS (24LL * 3600 * 1000)    /* how long an answer is kept for its key */
#define LEASE_MS (30LL * 1000)             /* only matters for a committed in_progress record */
#define TX_ATTEMPTS 20                     /* runs of one transaction before 503 */
#define BORROW_TIMEOUT_S 10                /* waiting for a database connection */
#define SWEEP_EVERY_MS 60000
#define SWEEP_BATCH 1000
#define REPLAY_HEADER "X-Idempotent-Replay" /* docs/protocol.md section 2, idemd's default */

/* ---- the connection pool ------------------------------------------------ */

typedef struct slot {
    db_t *db;
    idem_tx_t *tx; /* key records and order transitions on db's connection */
} slot_t;

typedef struct app {
    bool keys;             /* --keys on */
    slot_t *slots;
    int n_slots;
    int *free_slots;       /* a stack of indexes into slots */
    int n_free;
    pthread_mutex_t mu;
    pthread_cond_t freed;
} app_t;

static const idem_fsm_transition_t ORDER_TRANSITIONS[] = {
    {"created", "paid"},     {"paid", "shipped"},       {"shipped", "delivered"},
    {"created", "cancelled"}, {"paid", "cancelled"},
};

static const idem_fsm_t ORDER_FSM = {
    .table = "orders",
    .id_column = "number",
    .state_column = "state",
    .transitions = ORDER_TRANSITIONS,
    .n_transitions = sizeof ORDER_TRANSITIONS / sizeof ORDER_TRANSITIONS[0],
};

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS accounts ("
    " id TEXT PRIMARY KEY,"
    " balance BIGINT NOT NULL CHECK (balance >= 0),"
    " opening_balance BIGINT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS transfers ("
    " id TEXT PRIMARY KEY,"
    " from_id TEXT NOT NULL,"
    " to_id TEXT NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " idem_key TEXT,"
    " created_at BIGINT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS orders ("
    " number TEXT PRIMARY KEY,"
    " account TEXT NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " state TEXT NOT NULL,"
    " created_at BIGINT NOT NULL);";

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s\n", line);
}

static int slot_open(slot_t *s, const char *url, char *err, size_t errlen)
{
    if (db_open(url, &s->db, err, errlen) != DB_OK)
        return -1;
    idem_err_t e = db_kind(s->db) == DB_SQLITE
                       ? idem_tx_sqlite(db_handle(s->db), NULL, &s->tx)
                       : idem_tx_postgres(db_handle(s->db), NULL, &s->tx);
    if (e != IDEM_OK) {
        snprintf(err, errlen, "idem_tx: %s", idem_strerror(e));
        db_close(s->db);
        s->db = NULL;
        return -1;
    }
    return 0;
}

static void slot_close(slot_t *s)
{
    idem_tx_free(s->tx);
    db_close(s->db);
    s->tx = NULL;
    s->db = NULL;
}

/* A connection for one transaction, or NULL when none frees up in time or
 * the database cannot be reached. */
static slot_t *pool_borrow(app_t *app)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += BORROW_TIMEOUT_S;
    pthread_mutex_lock(&app->mu);
    while (app->n_free == 0)
        if (pthread_cond_timedwait(&app->freed, &app->mu, &deadline) != 0)
            break;
    slot_t *s = app->n_free > 0 ? &app->slots[app->free_slots[--app->n_free]] : NULL;
    pthread_mutex_unlock(&app->mu);
    if (s == NULL)
        return NULL;
    bool reset = false;
    bool ok = db_healthy(s->db, &reset);
    if (ok && reset) {
        /* what the handle prepared on the old session is gone */
        idem_tx_free(s->tx);
        s->tx = NULL;
        ok = idem_tx_postgres(db_handle(s->db), NULL, &s->tx) == IDEM_OK;
    }
    if (!ok) {
        log_line("database unavailable: %s", db_errstr(s->db));
        pthread_mutex_lock(&app->mu);
        app->free_slots[app->n_free++] = (int)(s - app->slots);
        pthread_cond_signal(&app->freed);
        pthread_mutex_unlock(&app->mu);
        return NULL;
    }
    return s;
}

static void pool_return(app_t *app, slot_t *s)
{
    pthread_mutex_lock(&app->mu);
    app->free_slots[app->n_free++] = (int)(s - app->slots);
    pthread_cond_signal(&app->freed);
    pthread_mutex_unlock(&app->mu);
}

/* ---- answers ------------------------------------------------------------ */

#define REPLY_MAX_HEADERS 8

/* An answer being built: what is sent, and for a keyed transfer what is
 * stored under the key (the very same status, headers and body). */
typedef struct reply {
    int status;
    idem_header_t headers[REPLY_MAX_HEADERS];
    size_t n_headers;
    char *owned[REPLY_MAX_HEADERS * 2]; /* copies behind headers */
    char *body;                         /* owned */
    size_t body_len;
    bool failed;                        /* out of memory or room: answer 500 */
} reply_t;

static void reply_reset(reply_t *r)
{
    for (size_t i = 0; i < REPLY_MAX_HEADERS * 2; i++)
        free(r->owned[i]);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static void reply_header(reply_t *r, const char *name, size_t name_len, const char *value,
                         size_t value_len)
{
    if (r->n_headers >= REPLY_MAX_HEADERS) {
        r->failed = true;
        return;
    }
    size_t i = r->n_headers;
    char *n = strndup(name, name_len);
    char *v = strndup(value, value_len);
    r->owned[2 * i] = n;
    r->owned[2 * i + 1] = v;
    if (n == NULL || v == NULL) {
        r->failed = true;
        return;
    }
    r->headers[i] = (idem_header_t){n, name_len, v, value_len};
    r->n_headers++;
}

static void reply_header_str(reply_t *r, const char *name, const char *value)
{
    reply_header(r, name, strlen(name), value, strlen(value));
}

/* Set the status and a JSON body (takes the reference to j). */
static void reply_json(reply_t *r, int status, const char *ctype, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (text == NULL) {
        r->failed = true;
        return;
    }
    r->status = status;
    free(r->body);
    r->body = text;
    r->body_len = strlen(text);
    reply_header_str(r, "Content-Type", ctype);
}

static void reply_problem(reply_t *r, int status, const char *type, const char *title,
                          long retry_after, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void reply_problem(reply_t *r, int status, const char *type, const char *title,
                          long retry_after, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    char urn[96];
    snprintf(urn, sizeof urn, "urn:idem:problem:%s", type);
    reply_json(r, status, "application/problem+json",
               json_pack("{s:s, s:s, s:i, s:s}", "type", urn, "title", title, "status", status,
                         "detail", detail));
    if (retry_after > 0) {
        char ra[24];
        snprintf(ra, sizeof ra, "%ld", retry_after);
        reply_header_str(r, "Retry-After", ra);
    }
}

static void reply_send(reply_t *r, srv_response_t *resp)
{
    if (r->failed || r->status == 0 ||
        srv_write(resp, r->status, r->headers, r->n_headers, r->body, r->body_len) != 0) {
        resp->close = true;
        srv_problem(resp, 500, "internal", "Internal error", "the answer could not be built",
                    0);
    }
}

/* ---- request bodies ----------------------------------------------------- */

static bool id_valid(const char *s, size_t n)
{
    if (n == 0 || n > ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* The body as a JSON object, or NULL with a 400 in r. */
static json_t *body_object(const srv_request_t *req, reply_t *r)
{
    json_error_t jerr;
    json_t *j = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        reply_problem(r, 400, "invalid-json", "Invalid JSON", 0,
                      "the body is not JSON: %s (position %d)", jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        reply_problem(r, 400, "invalid-json", "Invalid JSON", 0, "the body is not a JSON object");
        return NULL;
    }
    return j;
}

/* An id field (letters, digits, '_', '-', '.'; 1 to ID_MAX); false with a 400. */
static bool field_id(json_t *o, const char *name, const char **out, reply_t *r)
{
    json_t *v = json_object_get(o, name);
    if (v == NULL) {
        reply_problem(r, 400, "invalid-field", "Invalid field", 0, "missing field '%s'", name);
        return false;
    }
    if (!json_is_string(v) || !id_valid(json_string_value(v), json_string_length(v))) {
        reply_problem(r, 400, "invalid-field", "Invalid field", 0,
                      "field '%s' must be a string of 1 to %d letters, digits, '_', '-' or '.'",
                      name, ID_MAX);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* An integer field in [min, max] (cents); false with a 400. */
static bool field_cents(json_t *o, const char *name, int64_t min, int64_t max, int64_t *out,
                        reply_t *r)
{
    json_t *v = json_object_get(o, name);
    if (v == NULL) {
        reply_problem(r, 400, "invalid-field", "Invalid field", 0, "missing field '%s'", name);
        return false;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        reply_problem(r, 400, "invalid-field", "Invalid field", 0,
                      "field '%s' must be a whole number of cents from %lld to %lld", name,
                      (long long)min, (long long)max);
        return false;
    }
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* ---- transactions ------------------------------------------------------- */

typedef enum step {
    STEP_GO = 0,       /* no end yet: the body goes on (row_find found its row) */
    STEP_COMMIT = 1,   /* commit, then send the reply */
    STEP_ROLLBACK = 2, /* roll back, then send the reply */
    STEP_RETRY = 3,    /* the database refused: roll back and run again */
    STEP_FAIL = 4,     /* roll back and answer 500 (the cause is logged) */
} step_t;

typedef step_t (*tx_body_fn)(app_t *app, slot_t *s, void *arg, reply_t *r);

static void backoff(int attempt)
{
    /* 1, 2, 4 ... 64 ms, plus up to 3 ms so racing retries spread out */
    long ms = 1L << (attempt < 6 ? attempt : 6);
    ms += (long)(idem_clock_mono_ns() % 4);
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Run fn inside a transaction, again while the database asks for it, and
 * send its reply. */
static void run_tx(app_t *app, tx_body_fn fn, void *arg, srv_response_t *resp)
{
    reply_t r = {0};
    slot_t *s = pool_borrow(app);
    if (s == NULL) {
        reply_problem(&r, 503, "database-unavailable", "Database unavailable", 1,
                      "no database connection is available; retry later");
        reply_send(&r, resp);
        reply_reset(&r);
        return;
    }
    bool done = false;
    for (int attempt = 0; attempt < TX_ATTEMPTS && !done; attempt++) {
        reply_reset(&r);
        if (attempt > 0)
            backoff(attempt);
        db_rc_t rc = db_begin(s->db);
        if (rc == DB_RETRY) {
            db_rollback(s->db);
            continue;
        }
        if (rc != DB_OK) {
            log_line("BEGIN: %s", db_errstr(s->db));
            db_rollback(s->db);
            reply_problem(&r, 503, "database-unavailable", "Database unavailable", 1,
                          "the database refused to start a transaction");
            break;
        }
        step_t st = fn(app, s, arg, &r);
        if (st == STEP_COMMIT) {
            rc = db_commit(s->db);
            if (rc == DB_OK) {
                done = true;
                continue;
            }
            db_rollback(s->db);
            if (rc == DB_RETRY)
                continue;
            log_line("COMMIT: %s", db_errstr(s->db));
            st = STEP_FAIL;
        }
        db_rollback(s->db);
        if (st == STEP_RETRY)
            continue;
        if (st == STEP_FAIL) {
            reply_reset(&r);
            reply_problem(&r, 500, "internal", "Internal error", 0,
                          "the database failed; nothing was applied");
        }
        done = true;
    }
    pool_return(app, s);
    if (!done && r.status != 503) {
        reply_reset(&r);
        reply_problem(&r, 503, "database-busy", "Database busy", 1,
                      "the transaction kept conflicting with others; nothing was applied");
    }
    reply_send(&r, resp);
    reply_reset(&r);
}

/* Map a database result inside a transaction body: OK goes on. */
#define DB_STEP(rc) ((rc) == DB_RETRY ? STEP_RETRY : STEP_FAIL)

static step_t db_failed(slot_t *s, db_rc_t rc, const char *what)
{
    if (rc != DB_RETRY)
        log_line("%s: %s", what, db_errstr(s->db));
    return DB_STEP(rc);
}

/* Select the one row sql (whose $1 is id) finds, into *row (NULL: only
 * whether it is there).  Returns STEP_GO when it is found; db_failed's step
 * when the query failed (what names it in the log); `missing` when there is
 * no such row, r then holding the 404 "unknown-<noun>" problem. */
static step_t row_find(slot_t *s, const char *sql, const char *id, const char *noun,
                       const char *what, step_t missing, db_row_t *row, reply_t *r)
{
    db_arg_t p[] = {DB_TEXT(id)};
    bool found;
    db_rc_t rc = db_query(s->db, sql, p, 1, row, &found, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, what);
    if (found)
        return STEP_GO;
    char type[32];
    char title[32];
    snprintf(type, sizeof type, "unknown-%s", noun);
    snprintf(title, sizeof title, "Unknown %s", noun);
    reply_problem(r, 404, type, title, 0, "no %s '%s'", noun, id);
    return missing;
}

/* ---- accounts ----------------------------------------------------------- */

typedef struct account_arg {
    const char *id;
    int64_t balance;
} account_arg_t;

static json_t *account_json(const char *id, int64_t balance)
{
    return json_pack("{s:s, s:I}", "id", id, "balance", (json_int_t)balance);
}

static step_t account_create(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    account_arg_t *a = arg;
    int64_t changes;
    db_arg_t p[] = {DB_TEXT(a->id), DB_INT(a->balance)};
    db_rc_t rc = db_query(s->db,
                          "INSERT INTO accounts (id, balance, opening_balance) VALUES ($1, $2, $2)"
                          " ON CONFLICT (id) DO NOTHING",
                          p, 2, NULL, NULL, &changes);
    if (rc != DB_OK)
        return db_failed(s, rc, "insert account");
    if (changes == 1) {
        reply_json(r, 201, "application/json", account_json(a->id, a->balance));
        char loc[16 + ID_MAX];
        snprintf(loc, sizeof loc, "/accounts/%s", a->id);
        reply_header_str(r, "Location", loc);
        return STEP_COMMIT;
    }
    db_row_t row;
    bool found;
    rc = db_query(s->db, "SELECT balance, opening_balance FROM accounts WHERE id = $1", p, 1,
                  &row, &found, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, "select account");
    if (!found)
        return STEP_RETRY; /* removed in between: cannot happen here, but harmless */
    if (row.num[1] != a->balance) {
        reply_problem(r, 409, "account-exists", "Account exists", 0,
                      "account '%s' exists with an opening balance of %lld, not %lld", a->id,
                      (long long)row.num[1], (long long)a->balance);
        return STEP_ROLLBACK;
    }
    reply_json(r, 200, "application/json", account_json(a->id, row.num[0]));
    return STEP_ROLLBACK;
}

static step_t account_get(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    const char *id = arg;
    db_row_t row;
    step_t st = row_find(s, "SELECT balance FROM accounts WHERE id = $1", id, "account",
                         "select account", STEP_ROLLBACK, &row, r);
    if (st != STEP_GO)
        return st;
    reply_json(r, 200, "application/json", account_json(id, row.num[0]));
    return STEP_ROLLBACK;
}

/* ---- transfers ---------------------------------------------------------- */

typedef struct transfer_arg {
    const char *from;
    const char *to;
    int64_t amount;
    bool keyed;                 /* the key decides (--keys on) */
    idem_key_id_t id;           /* with keyed */
    uint8_t fp[IDEM_FP_LEN];    /* with keyed */
    const char *key;            /* the key as parsed, kept on the row; NULL when none */
} transfer_arg_t;

/* The money moves: lock both rows (in id order, so two opposite transfers
 * cannot deadlock on PostgreSQL), check, write, and build the answer. */
static step_t transfer_apply(slot_t *s, const transfer_arg_t *a, reply_t *r)
{
    bool pg = db_kind(s->db) == DB_POSTGRES;
    const char *lock_sql = pg ? "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE"
                              : "SELECT balance FROM accounts WHERE id = $1";
    bool from_first = strcmp(a->from, a->to) < 0;
    const char *order[2] = {from_first ? a->from : a->to, from_first ? a->to : a->from};
    int64_t bal[2];
    for (int i = 0; i < 2; i++) {
        db_row_t row;
        /* a missing account: an answer like any other, stored under the key */
        step_t st = row_find(s, lock_sql, order[i], "account", "lock account", STEP_COMMIT,
                             &row, r);
        if (st != STEP_GO)
            return st;
        bal[i] = row.num[0];
    }
    int64_t from_bal = from_first ? bal[0] : bal[1];
    int64_t to_bal = from_first ? bal[1] : bal[0];
    if (from_bal < a->amount) {
        reply_problem(r, 409, "insufficient-funds", "Insufficient funds", 0,
                      "account '%s' holds %lld cents; the transfer needs %lld", a->from,
                      (long long)from_bal, (long long)a->amount);
        return STEP_COMMIT;
    }
    if (to_bal > BALANCE_MAX - a->amount) {
        reply_problem(r, 409, "balance-limit", "Balance limit", 0,
                      "account '%s' would hold more than %lld cents", a->to,
                      (long long)BALANCE_MAX);
        return STEP_COMMIT;
    }
    db_arg_t debit[] = {DB_TEXT(a->from), DB_INT(a->amount)};
    db_arg_t credit[] = {DB_TEXT(a->to), DB_INT(a->amount)};
    db_rc_t rc = db_query(s->db, "UPDATE accounts SET balance = balance - $2 WHERE id = $1",
                          debit, 2, NULL, NULL, NULL);
    if (rc == DB_OK)
        rc = db_query(s->db, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", credit,
                      2, NULL, NULL, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, "update balances");
    int64_t now = idem_clock_now(NULL);
    char tid[IDEM_UUID_LEN + 1];
    idem_key_generate(now, NULL, tid);
    db_arg_t ins[] = {DB_TEXT(tid),      DB_TEXT(a->from), DB_TEXT(a->to),
                      DB_INT(a->amount), a->key ? DB_TEXT(a->key) : DB_TEXT(""),
                      DB_INT(now)};
    rc = db_query(s->db,
                  "INSERT INTO transfers (id, from_id, to_id, amount, idem_key, created_at)"
                  " VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6)",
                  ins, 6, NULL, NULL, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, "insert transfer");
    reply_json(r, 201, "application/json",
               json_pack("{s:s, s:s, s:s, s:I, s:I, s:I}", "id", tid, "from", a->from, "to",
                         a->to, "amount", (json_int_t)a->amount, "from_balance",
                         (json_int_t)(from_bal - a->amount), "to_balance",
                         (json_int_t)(to_bal + a->amount)));
    char loc[16 + IDEM_UUID_LEN];
    snprintf(loc, sizeof loc, "/transfers/%s", tid);
    reply_header_str(r, "Location", loc);
    return STEP_COMMIT;
}

/* The stored answer, as it was first sent, marked as a replay. */
static void reply_replay(reply_t *r, const idem_response_t *stored)
{
    r->status = stored->status;
    for (size_t i = 0; i < stored->n_headers; i++)
        reply_header(r, stored->headers[i].name, stored->headers[i].name_len,
                     stored->headers[i].value, stored->headers[i].value_len);
    reply_header_str(r, REPLAY_HEADER, "true");
    r->body = malloc(stored->body_len + 1);
    if (r->body == NULL) {
        r->failed = true;
        return;
    }
    if (stored->body_len > 0)
        memcpy(r->body, stored->body, stored->body_len);
    r->body_len = stored->body_len;
}

static step_t transfer_create(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    transfer_arg_t *a = arg;
    int64_t now = idem_clock_now(NULL);
    uint64_t fence = 0;
    if (a->keyed) {
        idem_tx_begin_t b;
        idem_err_t e = idem_tx_begin(s->tx, &a->id, a->fp, now, now + LEASE_MS,
                                     now + KEY_TTL_MS, &b);
        if (e == IDEM_E_RETRY)
            return STEP_RETRY;
        if (e != IDEM_OK) {
            log_line("idem_tx_begin: %s: %s", idem_strerror(e), idem_tx_errstr(s->tx));
            return STEP_FAIL;
        }
        bool claimed = false;
        switch (b.decision.kind) {
        case IDEM_DECIDE_CLAIM:
        case IDEM_DECIDE_TAKEOVER:
            claimed = true;
            fence = b.decision.fence;
            break;
        case IDEM_DECIDE_REPLAY:
            reply_replay(r, &b.record.response);
            break;
        case IDEM_DECIDE_IN_FLIGHT:
        case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
            reply_problem(r, 409, "in-flight", "Request in flight",
                          b.decision.retry_after_s > 0 ? (long)b.decision.retry_after_s : 1,
                          "a request with this Idempotency-Key is being processed");
            break;
        case IDEM_DECIDE_MISMATCH:
            reply_problem(r, 422, "key-reused", "Key reused", 0,
                          "this Idempotency-Key was used with a different request");
            break;
        case IDEM_DECIDE_NOT_RETAINED:
        default:
            reply_problem(r, 409, "response-not-retained", "Response not retained", 0,
                          "this key's request ran, but its answer was not kept");
            break;
        }
        idem_record_cleanup(&b.record);
        if (!claimed)
            return STEP_ROLLBACK;
    }
    step_t st = transfer_apply(s, a, r);
    if (st != STEP_COMMIT || !a->keyed)
        return st;
    if (r->failed)
        return STEP_FAIL;
    idem_response_t stored = {
        .status = r->status,
        .headers = r->headers,
        .n_headers = r->n_headers,
        .body = (const uint8_t *)r->body,
        .body_len = r->body_len,
    };
    idem_err_t e = idem_tx_complete(s->tx, &a->id, fence, &stored, 0, now + KEY_TTL_MS);
    if (e == IDEM_E_RETRY || e == IDEM_E_FENCE)
        return STEP_RETRY; /* FENCE: taken over; the next run sees by whom */
    if (e != IDEM_OK) {
        log_line("idem_tx_complete: %s: %s", idem_strerror(e), idem_tx_errstr(s->tx));
        return STEP_FAIL;
    }
    return STEP_COMMIT;
}

static step_t transfer_get(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    const char *id = arg;
    db_row_t row;
    step_t st = row_find(s,
                         "SELECT from_id, to_id, amount, created_at FROM transfers WHERE id = $1",
                         id, "transfer", "select transfer", STEP_ROLLBACK, &row, r);
    if (st != STEP_GO)
        return st;
    reply_json(r, 200, "application/json",
               json_pack("{s:s, s:s, s:s, s:I, s:I}", "id", id, "from", row.text[0], "to",
                         row.text[1], "amount", (json_int_t)row.num[2], "created_at",
                         (json_int_t)row.num[3]));
    return STEP_ROLLBACK;
}

static step_t stats_get(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    db_row_t acc, tr, ord;
    db_rc_t rc = db_query(s->db, "SELECT COUNT(*), COALESCE(SUM(balance), 0) FROM accounts",
                          NULL, 0, &acc, NULL, NULL);
    if (rc == DB_OK)
        rc = db_query(s->db, "SELECT COUNT(*), COUNT(DISTINCT idem_key) FROM transfers", NULL, 0,
                      &tr, NULL, NULL);
    if (rc == DB_OK)
        rc = db_query(s->db, "SELECT COUNT(*) FROM orders", NULL, 0, &ord, NULL, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, "stats");
    reply_json(r, 200, "application/json",
               json_pack("{s:I, s:I, s:I, s:I, s:I, s:b}", "accounts", (json_int_t)acc.num[0],
                         "total_balance", (json_int_t)acc.num[1], "transfers",
                         (json_int_t)tr.num[0], "transfer_keys", (json_int_t)tr.num[1],
                         "orders", (json_int_t)ord.num[0], "keys", app->keys));
    return STEP_ROLLBACK;
}

/* ---- orders ------------------------------------------------------------- */

typedef struct order_arg {
    const char *number;
    const char *account; /* create */
    int64_t amount;      /* create */
    const char *to;      /* action: the state asked for */
} order_arg_t;

static json_t *order_json(const char *number, const char *account, int64_t amount,
                          const char *state)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "number", number, "account", account, "amount",
                     (json_int_t)amount, "state", state);
}

static step_t order_create(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    order_arg_t *a = arg;
    step_t st = row_find(s, "SELECT 1 FROM accounts WHERE id = $1", a->account, "account",
                         "select account", STEP_ROLLBACK, NULL, r);
    if (st != STEP_GO)
        return st;
    bool found;
    int64_t changes;
    db_arg_t p[] = {DB_TEXT(a->number), DB_TEXT(a->account), DB_INT(a->amount),
                    DB_INT(idem_clock_now(NULL))};
    db_rc_t rc = db_query(s->db,
                  "INSERT INTO orders (number, account, amount, state, created_at)"
                  " VALUES ($1, $2, $3, 'created', $4) ON CONFLICT (number) DO NOTHING",
                  p, 4, NULL, NULL, &changes);
    if (rc != DB_OK)
        return db_failed(s, rc, "insert order");
    if (changes == 1) {
        reply_json(r, 201, "application/json",
                   order_json(a->number, a->account, a->amount, "created"));
        char loc[16 + ID_MAX];
        snprintf(loc, sizeof loc, "/orders/%s", a->number);
        reply_header_str(r, "Location", loc);
        return STEP_COMMIT;
    }
    db_row_t row;
    rc = db_query(s->db, "SELECT account, amount, state FROM orders WHERE number = $1", p, 1,
                  &row, &found, NULL);
    if (rc != DB_OK)
        return db_failed(s, rc, "select order");
    if (!found)
        return STEP_RETRY;
    if (strcmp(row.text[0], a->account) != 0 || row.num[1] != a->amount) {
        reply_problem(r, 409, "order-exists", "Order exists", 0,
                      "order '%s' exists for account '%s' and %lld cents", a->number,
                      row.text[0], (long long)row.num[1]);
        return STEP_ROLLBACK;
    }
    reply_json(r, 200, "application/json",
               order_json(a->number, row.text[0], row.num[1], row.text[2]));
    return STEP_ROLLBACK;
}

static step_t order_get(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    order_arg_t *a = arg;
    db_row_t row;
    step_t st = row_find(s, "SELECT account, amount, state FROM orders WHERE number = $1",
                         a->number, "order", "select order", STEP_ROLLBACK, &row, r);
    if (st != STEP_GO)
        return st;
    reply_json(r, 200, "application/json",
               order_json(a->number, row.text[0], row.num[1], row.text[2]));
    return STEP_ROLLBACK;
}

/* pay, ship, deliver, cancel: one transition, and the money it moves, in
 * one transaction. */
static step_t order_move(app_t *app, slot_t *s, void *arg, reply_t *r)
{
    order_arg_t *a = arg;
    db_row_t order;
    step_t st = row_find(s, "SELECT account, amount FROM orders WHERE number = $1", a->number,
                         "order", "select order", STEP_ROLLBACK, &order, r);
    if (st != STEP_GO)
        return st;
    db_rc_t rc;
    idem_fsm_outcome_t outcome;
    char from[IDEM_FSM_STATE_MAX + 1] = "";
    char why[256] = "";
    idem_err_t e = idem_fsm_transition(s->tx, &ORDER_FSM, a->number, a->to, &outcome, from, why,
                                       sizeof why);
    switch (e) {
    case IDEM_OK: break;
    case IDEM_E_RETRY: return STEP_RETRY;
    case IDEM_E_INVAL:
        reply_problem(r, 409, "invalid-transition", "Invalid transition", 0, "order '%s': %s",
                      a->number, why);
        return STEP_ROLLBACK;
    case IDEM_E_NOTFOUND:
        reply_problem(r, 404, "unknown-order", "Unknown order", 0, "no order '%s'", a->number);
        return STEP_ROLLBACK;
    default:
        log_line("idem_fsm_transition: %s: %s %s", idem_strerror(e), why, idem_tx_errstr(s->tx));
        return STEP_FAIL;
    }
    const char *account = order.text[0];
    int64_t amount = order.num[1];
    if (outcome == IDEM_FSM_CHANGED && strcmp(a->to, "paid") == 0) {
        int64_t changes;
        db_arg_t debit[] = {DB_TEXT(account), DB_INT(amount)};
        rc = db_query(s->db,
                      "UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2",
                      debit, 2, NULL, NULL, &changes);
        if (rc != DB_OK)
            return db_failed(s, rc, "debit");
        if (changes != 1) {
            /* rolling back also leaves the order as it was */
            reply_problem(r, 409, "insufficient-funds", "Insufficient funds", 0,
                          "account '%s' cannot pay %lld cents for order '%s'", account,
                          (long long)amount, a->number);
            return STEP_ROLLBACK;
        }
    }
    if (outcome == IDEM_FSM_CHANGED && strcmp(a->to, "cancelled") == 0 &&
        strcmp(from, "paid") == 0) {
        db_arg_t refund[] = {DB_TEXT(account), DB_INT(amount)};
        rc = db_query(s->db, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", refund,
                      2, NULL, NULL, NULL);
        if (rc != DB_OK)
            return db_failed(s, rc, "refund");
    }
    json_t *j = order_json(a->number, account, amount, a->to);
    json_object_set_new(j, "changed", json_boolean(outcome == IDEM_FSM_CHANGED));
    reply_json(r, 200, "application/json", j);
    return outcome == IDEM_FSM_CHANGED ? STEP_COMMIT : STEP_ROLLBACK;
}

/* ---- routing ------------------------------------------------------------ */

#define MAX_SEGS 4
#define SEG_MAX 128

/* Split "/a/b/c" into its segments; -1 when there are too many or one is
 * too long (no route has such a path). */
static int split_path(idem_slice_t path, char segs[MAX_SEGS][SEG_MAX])
{
    int n = 0;
    size_t i = 0;
    if (path.len == 0 || path.ptr[0] != '/')
        return -1;
    while (i < path.len) {
        i++; /* the '/' */
        size_t start = i;
        while (i < path.len && path.ptr[i] != '/')
            i++;
        if (n == MAX_SEGS || i - start >= SEG_MAX)
            return -1;
        memcpy(segs[n], path.ptr + start, i - start);
        segs[n][i - start] = '\0';
        n++;
    }
    return n;
}

static void not_found(reply_t *r, const srv_request_t *req)
{
    reply_problem(r, 404, "not-found", "Not found", 0, "no such resource: %.*s",
                  (int)(req->path.len > 200 ? 200 : req->path.len), req->path.ptr);
}

static void method_not_allowed(reply_t *r, const char *allow)
{
    reply_problem(r, 405, "method-not-allowed", "Method not allowed", 0,
                  "this resource takes %s", allow);
    reply_header_str(r, "Allow", allow);
}

/* The key, scope and fingerprint of a keyed transfer; false with a 400. */
static bool transfer_key(const srv_request_t *req, transfer_arg_t *a, reply_t *r)
{
    const idem_http_msg_t *m = req->msg;
    size_t n = idem__http_count(m, "Idempotency-Key");
    if (n == 0) {
        reply_problem(r, 400, "missing-key", "Missing Idempotency-Key", 0,
                      "POST /transfers needs an Idempotency-Key header");
        return false;
    }
    const idem_http_field_t *f = idem__http_find(m, "Idempotency-Key");
    if (n > 1 || idem_key_parse(f->value.ptr, f->value.len, a->id.key) != IDEM_OK) {
        reply_problem(r, 400, "invalid-key", "Invalid Idempotency-Key", 0,
                      "the key must be given once, 1 to %d visible ASCII characters",
                      IDEM_KEY_MAX);
        return false;
    }
    const idem_http_field_t *auth = idem__http_find(m, "Authorization");
    idem_scope_from_header(auth ? auth->value.ptr : NULL, auth ? auth->value.len : 0,
                           a->id.scope);
    idem_fp_input_t in = {
        .method = m->method.ptr,
        .method_len = m->method.len,
        .target = m->target.ptr,
        .target_len = m->target.len,
        .body = (const uint8_t *)req->body,
        .body_len = req->body_len,
        .body_json = 1,
    };
    if (a->id.scope[0] == '\0' || idem_fingerprint(&in, a->fp) != IDEM_OK) {
        reply_problem(r, 500, "internal", "Internal error", 0, "cannot hash the request");
        return false;
    }
    a->key = a->id.key;
    a->keyed = true;
    return true;
}

static void handle(void *ctx, const srv_request_t *req, srv_response_t *resp)
{
    app_t *app = ctx;
    reply_t r = {0};
    char segs[MAX_SEGS][SEG_MAX];
    int n = split_path(req->path, segs);
    bool get = idem__slice_eq_ci(req->msg->method, "GET");
    bool post = idem__slice_eq_ci(req->msg->method, "POST");
    json_t *body = NULL;

    if (n == 1 && strcmp(segs[0], "healthz") == 0) {
        if (!get)
            method_not_allowed(&r, "GET");
        else
            reply_json(&r, 200, "application/json", json_pack("{s:s}", "status", "ok"));
    } else if (n == 1 && strcmp(segs[0], "stats") == 0) {
        if (!get)
            method_not_allowed(&r, "GET");
        else
            {
            run_tx(app, stats_get, NULL, resp);
            return;
        }
    } else if (n == 1 && strcmp(segs[0], "accounts") == 0) {
        account_arg_t a;
        if (!post)
            method_not_allowed(&r, "POST");
        else if ((body = body_object(req, &r)) != NULL && field_id(body, "id", &a.id, &r) &&
                 field_cents(body, "balance", 0, BALANCE_MAX, &a.balance, &r)) {
            run_tx(app, account_create, &a, resp);
            json_decref(body);
            return;
        }
    } else if (n == 2 && strcmp(segs[0], "accounts") == 0) {
        if (!get)
            method_not_allowed(&r, "GET");
        else if (!id_valid(segs[1], strlen(segs[1])))
            reply_problem(&r, 404, "unknown-account", "Unknown account", 0, "no such account");
        else
            {
            run_tx(app, account_get, segs[1], resp);
            return;
        }
    } else if (n == 1 && strcmp(segs[0], "transfers") == 0) {
        transfer_arg_t a;
        memset(&a, 0, sizeof a);
        if (!post) {
            method_not_allowed(&r, "POST");
        } else if ((!app->keys || transfer_key(req, &a, &r)) &&
                   (body = body_object(req, &r)) != NULL && field_id(body, "from", &a.from, &r) &&
                   field_id(body, "to", &a.to, &r) &&
                   field_cents(body, "amount", 1, AMOUNT_MAX, &a.amount, &r)) {
            if (strcmp(a.from, a.to) == 0) {
                reply_problem(&r, 400, "invalid-field", "Invalid field", 0,
                              "'from' and 'to' are the same account");
            } else {
                if (!app->keys) {
                    /* kept on the row only, so double charges can be counted */
                    const idem_http_field_t *f = idem__http_find(req->msg, "Idempotency-Key");
                    if (f && idem_key_parse(f->value.ptr, f->value.len, a.id.key) == IDEM_OK)
                        a.key = a.id.key;
                }
                run_tx(app, transfer_create, &a, resp);
                json_decref(body);
                return;
            }
        }
    } else if (n == 2 && strcmp(segs[0], "transfers") == 0) {
        if (!get)
            method_not_allowed(&r, "GET");
        else if (strlen(segs[1]) != IDEM_UUID_LEN)
            reply_problem(&r, 404, "unknown-transfer", "Unknown transfer", 0,
                          "no such transfer");
        else
            {
            run_tx(app, transfer_get, segs[1], resp);
            return;
        }
    } else if (n == 1 && strcmp(segs[0], "orders") == 0) {
        order_arg_t a = {0};
        if (!post)
            method_not_allowed(&r, "POST");
        else if ((body = body_object(req, &r)) != NULL &&
                 field_id(body, "number", &a.number, &r) &&
                 field_id(body, "account", &a.account, &r) &&
                 field_cents(body, "amount", 1, AMOUNT_MAX, &a.amount, &r)) {
            run_tx(app, order_create, &a, resp);
            json_decref(body);
            return;
        }
    } else if ((n == 2 || n == 3) && strcmp(segs[0], "orders") == 0 &&
               id_valid(segs[1], strlen(segs[1]))) {
        order_arg_t a = {.number = segs[1]};
        if (n == 2) {
            if (!get)
                method_not_allowed(&r, "GET");
            else
                {
            run_tx(app, order_get, &a, resp);
            return;
        }
        } else {
            static const char *const actions[][2] = {
                {"pay", "paid"}, {"ship", "shipped"}, {"deliver", "delivered"},
                {"cancel", "cancelled"}};
            for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++)
                if (strcmp(segs[2], actions[i][0]) == 0)
                    a.to = actions[i][1];
            if (a.to == NULL)
                not_found(&r, req);
            else if (!post)
                method_not_allowed(&r, "POST");
            else
                {
            run_tx(app, order_move, &a, resp);
            return;
        }
        }
    } else {
        not_found(&r, req);
    }
    json_decref(body);
    reply_send(&r, resp);
    reply_reset(&r);
}

/* ---- maintenance -------------------------------------------------------- */

/* Remove key records past their retention, a batch at a time. */
static void sweep(void *ctx)
{
    app_t *app = ctx;
    if (!app->keys)
        return;
    slot_t *s = pool_borrow(app);
    if (s == NULL)
        return;
    size_t removed = 0;
    if (db_begin(s->db) == DB_OK &&
        idem_tx_sweep(s->tx, idem_clock_now(NULL), SWEEP_BATCH, &removed) == IDEM_OK &&
        db_commit(s->db) == DB_OK) {
        if (removed > 0)
            log_line("swept %zu expired keys", removed);
    }
    db_rollback(s->db);
    pool_return(app, s);
}

/* ---- main --------------------------------------------------------------- */

static void on_signal(int sig)
{
    (void)sig;
    srv_stop();
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--listen HOST:PORT] [--db sqlite:PATH | --db postgres://...]\n"
               "                   [--keys on|off] [--threads N] [--max-conns N]\n"
               "defaults: --listen " DEFAULT_LISTEN " --db " DEFAULT_DB
               " --keys on --threads 4 --max-conns 256\n");
}

static int parse_int(const char *s, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *listen = DEFAULT_LISTEN;
    const char *url = DEFAULT_DB;
    const char *keys = "on";
    const char *threads_s = "4";
    const char *conns_s = "256";
    for (int i = 1; i < argc; i++) {
        static const char *const names[] = {"--listen", "--db", "--keys", "--threads",
                                            "--max-conns"};
        const char **vals[] = {&listen, &url, &keys, &threads_s, &conns_s};
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        bool matched = false;
        for (size_t k = 0; k < sizeof names / sizeof names[0] && !matched; k++) {
            size_t nl = strlen(names[k]);
            if (strcmp(argv[i], names[k]) == 0) {
                if (i + 1 >= argc) {
                    fprintf(stderr, PROG ": %s needs a value\n", names[k]);
                    return 2;
                }
                *vals[k] = argv[++i];
                matched = true;
            } else if (strncmp(argv[i], names[k], nl) == 0 && argv[i][nl] == '=') {
                *vals[k] = argv[i] + nl + 1;
                matched = true;
            }
        }
        if (!matched) {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    app_t app = {.mu = PTHREAD_MUTEX_INITIALIZER, .freed = PTHREAD_COND_INITIALIZER};
    int max_conns;
    if (strcmp(keys, "on") == 0 || strcmp(keys, "off") == 0) {
        app.keys = strcmp(keys, "on") == 0;
    } else {
        fprintf(stderr, PROG ": --keys: want on or off, not '%s'\n", keys);
        return 2;
    }
    if (parse_int(threads_s, 1, THREADS_MAX, &app.n_slots) != 0) {
        fprintf(stderr, PROG ": --threads: want a number from 1 to %d, not '%s'\n", THREADS_MAX,
                threads_s);
        return 2;
    }
    if (parse_int(conns_s, 1, SRV_MAX_CONNS_LIMIT, &max_conns) != 0) {
        fprintf(stderr, PROG ": --max-conns: want a number from 1 to %d, not '%s'\n",
                SRV_MAX_CONNS_LIMIT, conns_s);
        return 2;
    }
    bool is_sqlite = strncmp(url, "sqlite:", 7) == 0 && url[7] != '\0';
    bool is_pg = strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0;
    if (!is_sqlite && !is_pg) {
        fprintf(stderr, PROG ": --db: want sqlite:PATH or postgres://..., not '%s'\n", url);
        return 2;
    }
    char err[512];
    if (idem_fsm_validate(&ORDER_FSM, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, PROG ": order states: %s\n", err);
        return 1;
    }

    srv_config_t cfg = {.listen = listen, .max_conns = max_conns, .handler = handle,
                        .ctx = &app, .tick = sweep, .tick_ms = SWEEP_EVERY_MS};
    int lrc = srv_listen(&cfg, err, sizeof err);
    if (lrc != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return lrc == -2 ? 2 : 1;
    }

    app.slots = calloc((size_t)app.n_slots, sizeof *app.slots);
    app.free_slots = calloc((size_t)app.n_slots, sizeof *app.free_slots);
    if (app.slots == NULL || app.free_slots == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int status = 0;
    for (int i = 0; i < app.n_slots && status == 0; i++) {
        if (slot_open(&app.slots[i], url, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s\n", err);
            status = 1;
            break;
        }
        app.free_slots[app.n_free++] = i;
        if (i > 0)
            continue;
        /* the schema, once, from the first connection */
        if (db_exec(app.slots[0].db, SCHEMA) != DB_OK) {
            fprintf(stderr, PROG ": cannot create the schema: %s\n",
                    db_errstr(app.slots[0].db));
            status = 1;
        } else if (idem_tx_migrate(app.slots[0].tx) != IDEM_OK) {
            fprintf(stderr, PROG ": cannot create the key table: %s\n",
                    idem_tx_errstr(app.slots[0].tx));
            status = 1;
        }
    }
    if (status == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        log_line("listening on %s (%s, keys %s, %d database connections)", listen,
              is_sqlite ? "SQLite" : "PostgreSQL", app.keys ? "on" : "off", app.n_slots);
        if (srv_run(&cfg) != 0) {
            log_line("stopped with connections still busy");
            return 1; /* their threads may still hold database connections */
        }
        log_line("stopped");
    }
    for (int i = 0; i < app.n_slots; i++)
        slot_close(&app.slots[i]);
    free(app.slots);
    free(app.free_slots);
    return status;
}
