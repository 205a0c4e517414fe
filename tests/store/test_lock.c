/* tests/store/test_lock.c - locks with a lease and a fencing token, on every
 * backend (src/store/lock.c).
 *
 * Each BACKEND_CASE runs against memory:, lmdb:, rocksdb:, Redis and PostgreSQL
 * (store_fixture.h).  Time is passed to every call, so leases run out by
 * adding to T0; only the watchdog cases run on the real clock.  The fencing
 * demo protects a real resource: a row in a SQLite file that takes a write
 * only with a token higher than the last one it saw.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>

#include "idem/lock.h"
#include "store_fixture.h"

#define LEASE 10000ll
#define DAY 86400000ll

static idem_lock_t acquire_ok(const char *name, int64_t now, int64_t lease)
{
    idem_lock_t l;
    int64_t retry = -1;
    idem_err_t rc = idem_lock_acquire(st, name, now, lease, &l, &retry);
    cr_assert_eq(rc, IDEM_OK, "acquire %s at T0%+lld: %s (%s)", name, (long long)(now - T0),
                 idem_err_name(rc), idem_store_errstr(st));
    cr_assert_eq(retry, 0);
    cr_assert_eq(l.store, st);
    cr_assert_eq(l.lease_until_ms, now + lease);
    cr_assert_eq(idem_lock_fence(&l), l.fence);
    return l;
}

static void expect_busy(const char *name, int64_t now, int64_t retry_expected)
{
    idem_lock_t l;
    int64_t retry = -1;
    cr_assert_eq(idem_lock_acquire(st, name, now, LEASE, &l, &retry), IDEM_E_EXISTS);
    cr_assert_eq(l.fence, 0, "a busy acquire leaves the lock zeroed");
    cr_assert_eq(l.store, NULL);
    cr_assert_eq(retry, retry_expected);
}

/* ---- acquire, busy, renew, release ------------------------------------------ */

BACKEND_CASE(lock, acquire_busy_renew_release)
{
    idem_lock_t a = acquire_ok("job", T0, LEASE);
    cr_assert_eq(a.fence, 1);
    expect_busy("job", T0, LEASE);
    expect_busy("job", T0 + 2500, LEASE - 2500);

    /* Renewed near the end, it outlives its first lease. */
    cr_assert_eq(idem_lock_renew(&a, T0 + LEASE - 1, LEASE), IDEM_OK);
    cr_assert_eq(a.lease_until_ms, T0 + 2 * LEASE - 1);
    cr_assert_eq(a.fence, 1, "renewing keeps the token");
    expect_busy("job", T0 + LEASE, LEASE - 1);

    /* Another name is another lock. */
    idem_lock_t other = acquire_ok("job2", T0, LEASE);
    cr_assert_eq(other.fence, 1);

    cr_assert_eq(idem_lock_release(&a, T0 + LEASE + 5), IDEM_OK);
    cr_assert_eq(a.fence, 0, "a released lock has no token");
    cr_assert_eq(idem_lock_fence(&a), 0);
    idem_lock_t b = acquire_ok("job", T0 + LEASE + 5, LEASE);
    cr_assert_eq(b.fence, 2, "the count goes on after a release");

    /* A released lock cannot be renewed or released again. */
    cr_assert_eq(idem_lock_renew(&a, T0 + LEASE + 6, LEASE), IDEM_E_INVAL);
    cr_assert_eq(idem_lock_release(&a, T0 + LEASE + 6), IDEM_E_INVAL);
    expect_busy("job", T0 + LEASE + 6, LEASE - 1);
}

BACKEND_CASE(lock, fence_grows_across_acquire_release_acquire)
{
    for (uint64_t i = 1; i <= 6; i++) {
        int64_t now = T0 + (int64_t)i * 10;
        idem_lock_t l = acquire_ok("fenced", now, LEASE);
        cr_assert_eq(l.fence, i);
        cr_assert_eq(idem_lock_release(&l, now + 1), IDEM_OK);
    }
}

BACKEND_CASE(lock, fence_grows_across_lease_expiry_takeover)
{
    idem_lock_t a = acquire_ok("tk", T0, LEASE);
    expect_busy("tk", T0 + LEASE - 1, 1);
    idem_lock_t b = acquire_ok("tk", T0 + LEASE, LEASE); /* a died: its lease ran out */
    cr_assert_eq(b.fence, a.fence + 1);
    idem_lock_t c = acquire_ok("tk", T0 + 3 * LEASE, LEASE);
    cr_assert_eq(c.fence, 3);
    /* Released after a takeover chain, the count still goes on. */
    cr_assert_eq(idem_lock_release(&c, T0 + 3 * LEASE + 1), IDEM_OK);
    cr_assert_eq(acquire_ok("tk", T0 + 3 * LEASE + 1, LEASE).fence, 4);
}

BACKEND_CASE(lock, stale_holder_cannot_renew_or_release)
{
    idem_lock_t a = acquire_ok("st", T0, LEASE);
    idem_lock_t b = acquire_ok("st", T0 + LEASE + 1, LEASE);
    cr_assert_eq(idem_lock_renew(&a, T0 + LEASE + 2, LEASE), IDEM_E_FENCE);
    cr_assert_eq(idem_lock_release(&a, T0 + LEASE + 2), IDEM_E_FENCE);
    cr_assert_eq(a.fence, 1, "a refused release leaves the token to look at");
    /* b still holds it, with its lease untouched by a's attempts. */
    expect_busy("st", T0 + LEASE + 2, LEASE - 1);
    cr_assert_eq(idem_lock_renew(&b, T0 + LEASE + 3, LEASE), IDEM_OK);

    /* A forged lock with a token that was never handed out is refused too. */
    idem_lock_t forged = b;
    forged.fence = b.fence + 1;
    cr_assert_eq(idem_lock_release(&forged, T0 + LEASE + 4), IDEM_E_FENCE);
    forged.fence = b.fence - 1;
    cr_assert_eq(idem_lock_renew(&forged, T0 + LEASE + 4, LEASE), IDEM_E_FENCE);
    expect_busy("st", T0 + LEASE + 4, LEASE - 1);
}

BACKEND_CASE(lock, renew_after_the_lease_ended_keeps_the_lock_when_nobody_took_it)
{
    idem_lock_t a = acquire_ok("late", T0, LEASE);
    cr_assert_eq(idem_lock_renew(&a, T0 + 3 * LEASE, LEASE), IDEM_OK);
    cr_assert_eq(a.fence, 1);
    expect_busy("late", T0 + 3 * LEASE + 1, LEASE - 1);
}

BACKEND_CASE(lock, a_long_hold_moves_the_retention_on)
{
    idem_key_id_t id = {.scope = IDEM_LOCK_SCOPE, .key = "long"};
    idem_record_t rec;
    idem_lock_t a = acquire_ok("long", T0, LEASE);
    cr_assert_eq(idem_store_get(st, &id, T0, &rec), IDEM_OK);
    cr_assert_eq(rec.expires_at_ms, T0 + IDEM_LOCK_RETENTION_MS);
    idem_record_cleanup(&rec);

    /* Renewed every day for 20 days: from the 15th on, retention runs low. */
    for (int64_t d = 1; d <= 20; d++)
        cr_assert_eq(idem_lock_renew(&a, T0 + d * DAY, LEASE), IDEM_OK);
    cr_assert_eq(a.lease_until_ms, T0 + 20 * DAY + LEASE);
    cr_assert_eq(idem_store_get(st, &id, T0 + 20 * DAY, &rec), IDEM_OK);
    cr_assert_geq(rec.expires_at_ms, T0 + 20 * DAY + IDEM_LOCK_RETENTION_MS / 2);
    cr_assert_eq(rec.lease_until_ms, T0 + 20 * DAY + LEASE, "the lease is the one asked for");
    idem_record_cleanup(&rec);
    expect_busy("long", T0 + 20 * DAY + 1, LEASE - 1);

    /* Released on day 20, the record is still there on day 40 (past the
     * first retention) and the count goes on. */
    cr_assert_eq(idem_lock_release(&a, T0 + 20 * DAY), IDEM_OK);
    cr_assert_eq(idem_store_get(st, &id, T0 + 40 * DAY, &rec), IDEM_OK);
    idem_record_cleanup(&rec);
    cr_assert_eq(acquire_ok("long", T0 + 40 * DAY, LEASE).fence, 2);
}

BACKEND_CASE(lock, the_count_restarts_only_when_the_record_is_removed)
{
    idem_key_id_t id = {.scope = IDEM_LOCK_SCOPE, .key = "gone"};
    idem_lock_t a = acquire_ok("gone", T0, LEASE);
    cr_assert_eq(idem_lock_release(&a, T0 + 1), IDEM_OK);
    cr_assert_eq(acquire_ok("gone", T0 + 2, LEASE).fence, 2);
    cr_assert_eq(idem_store_delete(st, &id), IDEM_OK);
    cr_assert_eq(acquire_ok("gone", T0 + 3, LEASE).fence, 1);
}

BACKEND_CASE(lock, a_record_that_is_not_a_lock_is_corrupt)
{
    idem_op_t op = {.id = {.scope = IDEM_LOCK_SCOPE, .key = "foreign"}};
    op.fp[0] = 1;
    fx_claim_at_t0(&op, LEASE, DAY);
    idem_lock_t l;
    int64_t retry = -1;
    cr_assert_eq(idem_lock_acquire(st, "foreign", T0 + 1, LEASE, &l, &retry), IDEM_E_CORRUPT);
    cr_assert_eq(retry, 0);
    cr_assert_eq(l.fence, 0);
}

BACKEND_CASE(lock, bad_arguments_are_inval_and_write_nothing)
{
    idem_lock_t l;
    int64_t retry = -1;
    char long_name[IDEM_LOCK_NAME_MAX + 2];
    memset(long_name, 'n', sizeof long_name);
    long_name[IDEM_LOCK_NAME_MAX + 1] = '\0';

    const char *bad_names[] = {"", "a b", "tab\there", "\x7f", "caf\xc3\xa9", "\x01tok:x",
                               long_name, NULL};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        memset(&l, 0xab, sizeof l);
        cr_expect_eq(idem_lock_acquire(st, bad_names[i], T0, LEASE, &l, &retry), IDEM_E_INVAL,
                     "name %zu", i);
        cr_expect_eq(l.fence, 0);
        cr_expect_eq(l.store, NULL);
        cr_expect_eq(retry, 0);
    }
    cr_expect_eq(idem_lock_acquire(st, "ok", T0, 0, &l, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(st, "ok", T0, -5, &l, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(st, "ok", T0, IDEM_LOCK_LEASE_MAX_MS + 1, &l, NULL),
                 IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(st, "ok", -1, LEASE, &l, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(st, "ok", IDEM_LOCK_TIME_MAX + 1, LEASE, &l, NULL),
                 IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(NULL, "ok", T0, LEASE, &l, NULL), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_acquire(st, "ok", T0, LEASE, NULL, &retry), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_renew(NULL, T0, LEASE), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_release(NULL, T0), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_fence(NULL), 0);

    /* None of that wrote anything: "ok" is acquired with token 1. */
    long_name[IDEM_LOCK_NAME_MAX] = '\0';
    cr_assert_eq(acquire_ok(long_name, T0, IDEM_LOCK_LEASE_MAX_MS).fence, 1);
    idem_lock_t ok = acquire_ok("ok", T0, IDEM_LOCK_LEASE_MIN_MS);
    cr_assert_eq(ok.fence, 1);
    cr_expect_eq(idem_lock_renew(&ok, T0, 0), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_renew(&ok, T0, IDEM_LOCK_LEASE_MAX_MS + 1), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_renew(&ok, -1, LEASE), IDEM_E_INVAL);
    cr_expect_eq(idem_lock_release(&ok, -1), IDEM_E_INVAL);
    cr_expect_eq(ok.lease_until_ms, T0 + 1, "a refused renew changes nothing");
    expect_busy("ok", T0, 1);
}

/* ---- racing acquirers ------------------------------------------------------- */

#define RACERS 8
#define ROUNDS 12

static pthread_barrier_t race_start, race_end;
static atomic_int race_winners[ROUNDS];
static atomic_ullong race_fence[ROUNDS];
static atomic_int race_errors;

static void *racer(void *arg)
{
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_barrier_wait(&race_start);
        /* Every round starts where the last one's lease ends: a takeover. */
        int64_t now = T0 + (int64_t)r * LEASE;
        idem_lock_t l;
        int64_t retry = 0;
        idem_err_t rc = idem_lock_acquire(st, "race", now, LEASE, &l, &retry);
        if (rc == IDEM_OK) {
            atomic_fetch_add(&race_winners[r], 1);
            atomic_store(&race_fence[r], l.fence);
        } else if (rc != IDEM_E_EXISTS || retry < 1 || retry > LEASE) {
            atomic_fetch_add(&race_errors, 1);
        }
        pthread_barrier_wait(&race_end);
        /* When all have tried, half the winners release (a released lock is
         * free at once); the others let the lease run out. */
        if (rc == IDEM_OK && r % 2 == 1 && idem_lock_release(&l, now + 1) != IDEM_OK)
            atomic_fetch_add(&race_errors, 1);
    }
    return NULL;
}

BACKEND_CASE(lock, racing_threads_get_exactly_one_holder_each_round)
{
    pthread_barrier_init(&race_start, NULL, RACERS);
    pthread_barrier_init(&race_end, NULL, RACERS);
    fx_run_threads(RACERS, racer);
    pthread_barrier_destroy(&race_start);
    pthread_barrier_destroy(&race_end);
    cr_assert_eq(atomic_load(&race_errors), 0);
    for (int r = 0; r < ROUNDS; r++) {
        cr_expect_eq(atomic_load(&race_winners[r]), 1, "round %d", r);
        cr_expect_eq(atomic_load(&race_fence[r]), (unsigned long long)r + 1, "round %d", r);
    }
}

/* ---- the fencing demo ------------------------------------------------------- */

/* The protected resource: one row of a SQLite file that keeps the highest
 * token it has seen and refuses a write that carries a lower or equal one. */
static sqlite3 *resource_open(const char *path)
{
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    cr_assert_eq(sqlite3_exec(db,
                              "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, "
                              "owner TEXT NOT NULL, fence INTEGER NOT NULL);"
                              "INSERT OR IGNORE INTO account VALUES (1, 'nobody', 0);",
                              NULL, NULL, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(db));
    return db;
}

/* Write owner with token fence; whether the resource took it. */
static bool resource_write(sqlite3 *db, const char *owner, uint64_t fence)
{
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "UPDATE account SET owner = ?1, fence = ?2 "
                                    "WHERE id = 1 AND fence < ?2",
                                    -1, &s, NULL),
                 SQLITE_OK);
    sqlite3_bind_text(s, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, (sqlite3_int64)fence);
    cr_assert_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    return sqlite3_changes(db) == 1;
}

static void resource_expect(sqlite3 *db, const char *owner, uint64_t fence)
{
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "SELECT owner, fence FROM account WHERE id = 1", -1, &s,
                                    NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_expect_str_eq((const char *)sqlite3_column_text(s, 0), owner);
    cr_expect_eq((uint64_t)sqlite3_column_int64(s, 1), fence);
    sqlite3_finalize(s);
}

BACKEND_CASE(lock, fencing_demo_a_stalled_holder_is_refused_by_the_resource)
{
    char rdir[64], path[128];
    fx_mkdtemp(rdir, sizeof rdir, "lock-test");
    snprintf(path, sizeof path, "%s/resource.db", rdir);
    sqlite3 *a_db = resource_open(path); /* each holder has its own connection */
    sqlite3 *b_db = resource_open(path);

    /* A takes the lock (token 1) and writes under it. */
    idem_lock_t a = acquire_ok("account-1", T0, LEASE);
    cr_assert_eq(a.fence, 1);
    cr_assert(resource_write(a_db, "A", a.fence));

    /* A stalls past its lease; B takes the lock (token 2) and writes. */
    int64_t later = T0 + LEASE + 100;
    idem_lock_t b = acquire_ok("account-1", later, LEASE);
    cr_assert_eq(b.fence, 2);
    cr_assert(resource_write(b_db, "B", b.fence));

    /* A wakes up still believing it holds the lock: its write is refused. */
    cr_assert_not(resource_write(a_db, "A-late", a.fence));
    resource_expect(b_db, "B", 2);
    cr_assert_eq(idem_lock_renew(&a, later + 1, LEASE), IDEM_E_FENCE);
    cr_assert_eq(idem_lock_release(&a, later + 1), IDEM_E_FENCE);

    /* B goes on, and after B releases, C's higher token is taken. */
    cr_assert(resource_write(b_db, "B2", b.fence) == false, "equal tokens are refused too");
    cr_assert_eq(idem_lock_release(&b, later + 2), IDEM_OK);
    idem_lock_t c = acquire_ok("account-1", later + 3, LEASE);
    cr_assert_eq(c.fence, 3);
    cr_assert(resource_write(a_db, "C", c.fence));
    resource_expect(b_db, "C", 3);

    sqlite3_close(a_db);
    sqlite3_close(b_db);
    fx_rm_tree(rdir);
}

/* ---- the watchdog (real time) ---------------------------------------------- */

struct lost_seen {
    atomic_int calls;
    atomic_int why;
};

static void on_lost(void *ctx, idem_err_t why)
{
    struct lost_seen *seen = ctx;
    atomic_fetch_add(&seen->calls, 1);
    atomic_store(&seen->why, (int)why);
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000l};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Renewed every third of it, a lease lapses only if the watchdog thread
 * misses two renewals in a row: 2 s leaves it 1.3 s of stall (ASan on a busy
 * two-core machine) where 600 ms left 400 ms. */
#define WD_LEASE 2000ll

BACKEND_CASE(lock, watchdog_keeps_the_lock_past_several_leases)
{
    struct lost_seen seen = {0};
    idem_lock_t a = acquire_ok("wd", fx_real_ms(), WD_LEASE);
    idem_lock_watchdog_t *wd = NULL;
    cr_assert_eq(idem_lock_watchdog_start(&a, WD_LEASE, NULL, on_lost, &seen, &wd), IDEM_OK);
    cr_assert_not_null(wd);
    for (int i = 0; i < 5; i++) {
        sleep_ms(WD_LEASE / 2 + 50);
        idem_lock_t b;
        int64_t retry = 0;
        cr_assert_eq(idem_lock_acquire(st, "wd", fx_real_ms(), WD_LEASE, &b, &retry),
                     IDEM_E_EXISTS, "after %lld ms", (long long)(i + 1) * (WD_LEASE / 2 + 50));
        cr_assert(retry >= 1 && retry <= WD_LEASE);
        cr_assert_eq(idem_lock_watchdog_lost(wd), IDEM_OK);
    }
    int64_t before_stop = fx_real_ms();
    cr_assert_eq(idem_lock_watchdog_stop(wd), IDEM_OK);
    cr_assert_gt(a.lease_until_ms, before_stop, "stop copied the renewed lease back");
    cr_assert_eq(atomic_load(&seen.calls), 0);
    cr_assert_eq(a.fence, 1);
    cr_assert_eq(idem_lock_release(&a, fx_real_ms()), IDEM_OK);
    cr_assert_eq(acquire_ok("wd", fx_real_ms(), WD_LEASE).fence, 2);
}

BACKEND_CASE(lock, watchdog_reports_the_loss_when_the_lock_is_taken_over)
{
    struct lost_seen seen = {0};
    int64_t now = fx_real_ms();
    idem_lock_t a = acquire_ok("wdlost", now, WD_LEASE);
    idem_lock_watchdog_t *wd = NULL;
    cr_assert_eq(idem_lock_watchdog_start(&a, WD_LEASE, NULL, on_lost, &seen, &wd), IDEM_OK);

    /* B's clock runs ahead of A's lease (or A's renewals stalled): B takes
     * the lock over, and A's watchdog finds out at its next renewal. */
    idem_lock_t b = acquire_ok("wdlost", now + 10 * WD_LEASE, WD_LEASE);
    cr_assert_eq(b.fence, 2);
    for (int i = 0; i < 3000 && atomic_load(&seen.calls) == 0; i++) /* 30 s at most */
        sleep_ms(10);
    cr_assert_eq(atomic_load(&seen.calls), 1);
    cr_assert_eq(atomic_load(&seen.why), IDEM_E_FENCE);
    cr_assert_eq(idem_lock_watchdog_lost(wd), IDEM_E_FENCE);
    sleep_ms(WD_LEASE / 2);
    cr_assert_eq(atomic_load(&seen.calls), 1, "reported once");
    cr_assert_eq(idem_lock_watchdog_stop(wd), IDEM_E_FENCE);
    cr_assert_eq(idem_lock_release(&a, fx_real_ms()), IDEM_E_FENCE);
    cr_assert_eq(idem_lock_release(&b, now + 10 * WD_LEASE), IDEM_OK);
}

/* A clock that a test moves by hand. */
static _Atomic int64_t fake_now;
static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return atomic_load(&fake_now);
}

BACKEND_CASE(lock, watchdog_renews_by_its_clock_and_stops_at_once)
{
    idem_clock_t clock = {.now_ms = fake_clock, .ctx = NULL};
    atomic_store(&fake_now, T0);
    idem_lock_t a = acquire_ok("wdclock", T0, DAY);
    idem_lock_watchdog_t *wd = NULL;
    /* A one-day lease renews every eight hours: stop must not wait for it. */
    cr_assert_eq(idem_lock_watchdog_start(&a, DAY, &clock, NULL, NULL, &wd), IDEM_OK);
    uint64_t t = idem_clock_mono_ns();
    cr_assert_eq(idem_lock_watchdog_stop(wd), IDEM_OK);
    cr_assert_lt(idem_clock_mono_ns() - t, 2000000000ull);
    cr_assert_eq(a.lease_until_ms, T0 + DAY, "nothing was renewed");

    /* A short lease renews on the injected clock's time: wait for the
     * record to show a renewal (not a fixed 200 ms, which a busy machine
     * can spend without running the watchdog once). */
    atomic_store(&fake_now, T0 + 5000);
    cr_assert_eq(idem_lock_watchdog_start(&a, 30, &clock, NULL, NULL, &wd), IDEM_OK);
    idem_record_t rec;
    idem_key_id_t id = {.scope = IDEM_LOCK_SCOPE, .key = "wdclock"};
    int64_t lease_seen = 0;
    for (int i = 0; i < 3000 && lease_seen != T0 + 5030; i++) { /* 30 s at most */
        cr_assert_eq(idem_store_get(st, &id, T0 + 5000, &rec), IDEM_OK);
        lease_seen = rec.lease_until_ms;
        idem_record_cleanup(&rec);
        if (lease_seen != T0 + 5030)
            sleep_ms(10);
    }
    cr_assert_eq(lease_seen, T0 + 5030, "never renewed on the injected clock's time");
    cr_assert_eq(idem_lock_watchdog_stop(wd), IDEM_OK);
    cr_assert_eq(a.lease_until_ms, T0 + 5030);
    cr_assert_eq(idem_store_get(st, &id, T0 + 5000, &rec), IDEM_OK);
    cr_assert_eq(rec.lease_until_ms, T0 + 5030);
    idem_record_cleanup(&rec);
}

Test(lock, watchdog_arguments_are_checked)
{
    idem_store_t *s = NULL;
    cr_assert_eq(idem_store_open("memory:", &s, NULL, 0), IDEM_OK);
    idem_lock_t l, released;
    idem_lock_watchdog_t *wd = (idem_lock_watchdog_t *)&l;
    cr_assert_eq(idem_lock_acquire(s, "w", 1000, 100, &l, NULL), IDEM_OK);
    cr_assert_eq(idem_lock_watchdog_start(&l, 0, NULL, NULL, NULL, &wd), IDEM_E_INVAL);
    cr_assert_null(wd);
    cr_assert_eq(idem_lock_watchdog_start(&l, IDEM_LOCK_LEASE_MAX_MS + 1, NULL, NULL, NULL, &wd),
                 IDEM_E_INVAL);
    cr_assert_eq(idem_lock_watchdog_start(NULL, 100, NULL, NULL, NULL, &wd), IDEM_E_INVAL);
    cr_assert_eq(idem_lock_watchdog_start(&l, 100, NULL, NULL, NULL, NULL), IDEM_E_INVAL);
    cr_assert_eq(idem_lock_acquire(s, "r", 1000, 100, &released, NULL), IDEM_OK);
    cr_assert_eq(idem_lock_release(&released, 1000), IDEM_OK);
    cr_assert_eq(idem_lock_watchdog_start(&released, 100, NULL, NULL, NULL, &wd), IDEM_E_INVAL);
    cr_assert_eq(idem_lock_watchdog_lost(NULL), IDEM_OK);
    cr_assert_eq(idem_lock_watchdog_stop(NULL), IDEM_OK);
    idem_store_close(s);
}

Test(lock, watchdog_start_out_of_memory_is_nomem)
{
    idem_store_t *s = NULL;
    cr_assert_eq(idem_store_open("memory:", &s, NULL, 0), IDEM_OK);
    idem_lock_t l;
    cr_assert_eq(idem_lock_acquire(s, "w", 1000, 100, &l, NULL), IDEM_OK);
    idem_lock_watchdog_t *wd = NULL;
    idem_alloc_fail_after(1);
    cr_assert_eq(idem_lock_watchdog_start(&l, 100, NULL, NULL, NULL, &wd), IDEM_E_NOMEM);
    idem_alloc_fail_after(0);
    cr_assert_null(wd);
    idem_store_close(s);
}

/* A store error is retried while the lease lasts, and is the reason for the
 * loss once it has ended: the table under the store is dropped. */
Test(lock_postgres, watchdog_reports_a_store_that_fails_until_the_lease_ends,
     .init = fx_setup_postgres, .fini = fx_teardown)
{
    struct lost_seen seen = {0};
    idem_lock_t a = acquire_ok("wdfail", fx_real_ms(), WD_LEASE);
    idem_lock_watchdog_t *wd = NULL;
    cr_assert_eq(idem_lock_watchdog_start(&a, WD_LEASE, NULL, on_lost, &seen, &wd), IDEM_OK);
    sleep_ms(WD_LEASE / 2); /* a renewal or so */

    PGconn *c = PQconnectdb(getenv("IDEM_TEST_PG_URL"));
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    char sql[128];
    snprintf(sql, sizeof sql, "DROP TABLE \"%s\"", fx_pg_table);
    PGresult *r = PQexec(c, sql);
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    int64_t dropped = fx_real_ms();

    for (int i = 0; i < 3000 && atomic_load(&seen.calls) == 0; i++) /* 30 s at most */
        sleep_ms(10);
    int64_t lost_at = fx_real_ms();
    cr_assert_eq(atomic_load(&seen.calls), 1);
    cr_assert_eq(atomic_load(&seen.why), IDEM_E_STORE_DOWN);
    cr_assert_eq(idem_lock_watchdog_lost(wd), IDEM_E_STORE_DOWN);
    cr_assert_eq(idem_lock_watchdog_stop(wd), IDEM_E_STORE_DOWN);
    cr_assert_geq(lost_at, a.lease_until_ms, "not given up before the lease ended");
    cr_assert_lt(lost_at - dropped, 2 * WD_LEASE);
}
