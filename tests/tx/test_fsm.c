/* tests/tx/test_fsm.c - the state-machine helper on SQLite and PostgreSQL.
 *
 * An orders table of the test's own (id INTEGER PRIMARY KEY, state TEXT)
 * and the machine pending -> paid -> shipped -> delivered, pending ->
 * cancelled.  Each TX_CASE runs on both backends (tx_fixture.h).
 */
#include <pthread.h>

#include "idem/fsm.h"
#include "tx_fixture.h"

static const idem_fsm_transition_t ORDER_T[] = {
    {"pending", "paid"},
    {"pending", "cancelled"},
    {"paid", "shipped"},
    {"shipped", "delivered"},
};

static char orders[64];
static idem_fsm_t M;

static void make_orders(int n)
{
    snprintf(orders, sizeof orders, "%.40s_orders", table);
    snprintf(extra_tables[n_extra++], sizeof extra_tables[0], "%s", orders);
    tconn_sql(&C, "CREATE TABLE \"%s\" (id INTEGER PRIMARY KEY, state TEXT NOT NULL)", orders);
    for (int i = 1; i <= n; i++)
        tconn_sql(&C, "INSERT INTO \"%s\" VALUES (%d, 'pending')", orders, i);
    M = (idem_fsm_t){.table = orders, .id_column = "id", .state_column = "state",
                     .transitions = ORDER_T, .n_transitions = 4};
}

static void state_is(int id, const char *want)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT state FROM \"%s\" WHERE id = %d", orders, id);
    if (C.db != NULL) {
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(C.db, sql, -1, &st, NULL), SQLITE_OK);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_expect_str_eq((const char *)sqlite3_column_text(st, 0), want, "row %d", id);
        sqlite3_finalize(st);
        return;
    }
    PGresult *r = PQexec(C.pg, sql);
    cr_assert_eq(PQntuples(r), 1);
    cr_expect_str_eq(PQgetvalue(r, 0, 0), want, "row %d", id);
    PQclear(r);
}

/* Something that changes when the row is written, even to the same value. */
static long long row_version(int id)
{
    if (C.db != NULL)
        return sqlite3_total_changes64(C.db);
    return tconn_num(&C, "SELECT xmin::text::bigint FROM \"%s\" WHERE id = %d", orders, id);
}

static idem_err_t move(idem_tx_t *tx, const char *id, const char *to, idem_fsm_outcome_t *out,
                       char *from, char *err, size_t errlen)
{
    return idem_fsm_transition(tx, &M, id, to, out, from, err, errlen);
}

TX_CASE(fsm, a_declared_transition_changes_the_row)
{
    make_orders(1);
    idem_fsm_outcome_t out;
    char from[IDEM_FSM_STATE_MAX + 1], err[256];
    idem_err_t rc = move(T, "1", "paid", &out, from, err, sizeof err);
    cr_assert_eq(rc, IDEM_OK, "%s: %s", idem_err_name(rc), err);
    cr_expect_eq(out, IDEM_FSM_CHANGED);
    cr_expect_str_eq(from, "pending");
    state_is(1, "paid");
    cr_assert_eq(move(T, "1", "shipped", &out, NULL, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(out, IDEM_FSM_CHANGED);
    state_is(1, "shipped");
}

TX_CASE(fsm, the_state_it_is_in_is_already_without_a_write)
{
    make_orders(1);
    idem_fsm_outcome_t out;
    char from[IDEM_FSM_STATE_MAX + 1], err[256];
    cr_assert_eq(move(T, "1", "paid", &out, from, err, sizeof err), IDEM_OK, "%s", err);
    long long v = row_version(1);
    cr_assert_eq(move(T, "1", "paid", &out, from, err, sizeof err), IDEM_OK, "%s", err);
    cr_expect_eq(out, IDEM_FSM_ALREADY);
    cr_expect_str_eq(from, "paid");
    cr_expect_eq(row_version(1), v, "the row was written");
    /* Also for a state the table never mentions as a target. */
    cr_assert_eq(move(T, "1", "paid", &out, NULL, NULL, 0), IDEM_OK);
}

TX_CASE(fsm, an_undeclared_transition_names_both_states)
{
    make_orders(1);
    idem_fsm_outcome_t out;
    char from[IDEM_FSM_STATE_MAX + 1], err[256];
    const char *path[3] = {"paid", "shipped", "delivered"};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(move(T, "1", path[i], &out, NULL, err, sizeof err), IDEM_OK, "%s", err);
    long long v = row_version(1);
    cr_expect_eq(move(T, "1", "cancelled", &out, from, err, sizeof err), IDEM_E_INVAL);
    cr_expect_str_eq(err, "invalid transition from 'delivered' to 'cancelled'");
    cr_expect_str_eq(from, "delivered");
    cr_expect_eq(out, 0);
    cr_expect_eq(row_version(1), v);
    state_is(1, "delivered");
    /* a short errbuf is cut, not overrun */
    char small[8];
    cr_expect_eq(move(T, "1", "pending", &out, NULL, small, sizeof small), IDEM_E_INVAL);
    cr_expect_str_eq(small, "invalid");
}

TX_CASE(fsm, a_missing_row_is_notfound)
{
    make_orders(1);
    idem_fsm_outcome_t out;
    char err[256];
    cr_expect_eq(move(T, "999", "paid", &out, NULL, err, sizeof err), IDEM_E_NOTFOUND);
    cr_expect_neq(strstr(err, "999"), NULL, "%s", err);
}

TX_CASE(fsm, it_commits_and_rolls_back_with_the_transaction)
{
    make_orders(1);
    idem_fsm_outcome_t out;
    char err[256];
    cr_assert(tconn_begin(&C));
    cr_assert_eq(move(T, "1", "paid", &out, NULL, err, sizeof err), IDEM_OK, "%s", err);
    tconn_rollback(&C);
    state_is(1, "pending");
    cr_assert(tconn_begin(&C));
    cr_assert_eq(move(T, "1", "cancelled", &out, NULL, err, sizeof err), IDEM_OK, "%s", err);
    cr_assert(tconn_commit(&C));
    state_is(1, "cancelled");
}

TX_CASE(fsm, bad_declarations_and_arguments_are_inval)
{
    make_orders(1);
    char err[256];
    idem_fsm_outcome_t out;
    cr_expect_eq(idem_fsm_validate(&M, err, sizeof err), IDEM_OK, "%s", err);
    idem_fsm_t bad = M;
    bad.table = "orders; drop table x";
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    cr_expect_neq(strstr(err, "table name"), NULL, "%s", err);
    cr_expect_eq(move(T, "1", "paid", &out, NULL, NULL, 0), IDEM_OK); /* M is fine */
    cr_expect_eq(idem_fsm_transition(T, &bad, "1", "paid", &out, NULL, err, sizeof err),
                 IDEM_E_INVAL);
    bad = M;
    bad.state_column = "";
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    bad = M;
    bad.id_column = NULL;
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    static const idem_fsm_transition_t twice[] = {{"a", "b"}, {"a", "c"}, {"a", "b"}};
    bad = M;
    bad.transitions = twice;
    bad.n_transitions = 3;
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    cr_expect_str_eq(err, "the transition from 'a' to 'b' is listed twice");
    static const idem_fsm_transition_t empty[] = {{"a", ""}};
    bad.transitions = empty;
    bad.n_transitions = 1;
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    bad.transitions = NULL;
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    bad.n_transitions = IDEM_FSM_TRANSITIONS_MAX + 1;
    bad.transitions = ORDER_T;
    cr_expect_eq(idem_fsm_validate(&bad, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(idem_fsm_validate(NULL, err, sizeof err), IDEM_E_INVAL);

    char longstate[IDEM_FSM_STATE_MAX + 2];
    memset(longstate, 's', sizeof longstate - 1);
    longstate[sizeof longstate - 1] = '\0';
    cr_expect_eq(move(T, "1", longstate, &out, NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(move(T, "1", "", &out, NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(move(T, "", "paid", &out, NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(move(T, NULL, "paid", &out, NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(move(NULL, "1", "paid", &out, NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_eq(move(T, "1", "paid", NULL, NULL, err, sizeof err), IDEM_E_INVAL);
    char longid[IDEM_FSM_ID_MAX + 2];
    memset(longid, '1', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    cr_expect_eq(move(T, longid, "paid", &out, NULL, err, sizeof err), IDEM_E_INVAL);
    /* a state column that does not exist is the database's error */
    bad = M;
    bad.state_column = "no_such_column";
    cr_expect_eq(idem_fsm_transition(T, &bad, "1", "paid", &out, NULL, err, sizeof err),
                 IDEM_E_IO);
    cr_expect_neq(strstr(err, "no_such_column"), NULL, "%s", err);
}

Test(fsm, allows_is_the_declared_table_plus_staying)
{
    idem_fsm_t m = {.table = "o", .id_column = "id", .state_column = "s",
                    .transitions = ORDER_T, .n_transitions = 4};
    cr_expect(idem_fsm_allows(&m, "pending", "paid"));
    cr_expect(idem_fsm_allows(&m, "paid", "paid"));
    cr_expect(idem_fsm_allows(&m, "nowhere", "nowhere"));
    cr_expect_not(idem_fsm_allows(&m, "paid", "pending"));
    cr_expect_not(idem_fsm_allows(&m, "delivered", "cancelled"));
    cr_expect_not(idem_fsm_allows(&m, "pending", "shipped"));
    cr_expect_not(idem_fsm_allows(NULL, "a", "a"));
    cr_expect_not(idem_fsm_allows(&m, NULL, "paid"));
    m.n_transitions = 0;
    m.transitions = NULL;
    cr_expect_not(idem_fsm_allows(&m, "pending", "paid"));
}

/* ---- two connections racing transitions of the same rows ----------------- */

#define RACE_ROWS 40

static pthread_barrier_t race_bar;

struct mover {
    const char *to[RACE_ROWS];        /* per row: the state this thread asks for */
    idem_err_t rc[RACE_ROWS];
    idem_fsm_outcome_t out[RACE_ROWS];
    char fail[300];
};

static void *move_thread(void *arg)
{
    struct mover *me = arg;
    tconn_t c;
    int ok = tconn_try_open(&c);
    idem_tx_t *tx = NULL;
    if (ok && (c.db != NULL ? idem_tx_sqlite(c.db, table, &tx)
                            : idem_tx_postgres(c.pg, table, &tx)) != IDEM_OK)
        ok = 0;
    if (!ok)
        snprintf(me->fail, sizeof me->fail, "cannot connect");
    for (int i = 0; i < RACE_ROWS; i++) {
        pthread_barrier_wait(&race_bar); /* both start each row together */
        if (!ok)
            continue;
        char id[16], err[200];
        snprintf(id, sizeof id, "%d", i + 1);
        for (int attempt = 0; attempt < 1000; attempt++) {
            if (!tconn_begin(&c)) {
                tconn_rollback(&c);
                continue;
            }
            idem_err_t rc = idem_fsm_transition(tx, &M, id, me->to[i], &me->out[i], NULL, err,
                                                sizeof err);
            if (rc == IDEM_E_RETRY) {
                tconn_rollback(&c);
                continue;
            }
            if (rc == IDEM_OK && !tconn_commit(&c)) {
                tconn_rollback(&c);
                continue;
            }
            if (rc != IDEM_OK)
                tconn_rollback(&c);
            me->rc[i] = rc;
            if (rc != IDEM_OK && rc != IDEM_E_INVAL && me->fail[0] == '\0')
                snprintf(me->fail, sizeof me->fail, "row %s: %s %s", id, idem_err_name(rc), err);
            break;
        }
    }
    idem_tx_free(tx);
    tconn_close(&c);
    return NULL;
}

TX_CASE(fsm, racing_transitions_of_one_row_apply_once)
{
    make_orders(RACE_ROWS);
    static struct mover mv[2];
    memset(mv, 0, sizeof mv);
    /* Even rows: both ask for paid (one CHANGED, one ALREADY).  Odd rows:
     * paid against cancelled (one CHANGED, the other INVALID: neither
     * may follow the other). */
    for (int i = 0; i < RACE_ROWS; i++) {
        mv[0].to[i] = "paid";
        mv[1].to[i] = i % 2 == 0 ? "paid" : "cancelled";
    }
    pthread_barrier_init(&race_bar, NULL, 2);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, move_thread, &mv[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&race_bar);
    for (int i = 0; i < 2; i++)
        cr_assert_str_empty(mv[i].fail, "thread %d: %s", i + 1, mv[i].fail);
    for (int i = 0; i < RACE_ROWS; i++) {
        int changed = 0, already = 0, invalid = 0, winner = -1;
        for (int t = 0; t < 2; t++) {
            if (mv[t].rc[i] == IDEM_E_INVAL) {
                invalid++;
            } else if (mv[t].out[i] == IDEM_FSM_CHANGED) {
                changed++;
                winner = t;
            } else if (mv[t].out[i] == IDEM_FSM_ALREADY) {
                already++;
            }
        }
        cr_expect_eq(changed, 1, "row %d", i + 1);
        if (i % 2 == 0)
            cr_expect_eq(already, 1, "row %d", i + 1);
        else
            cr_expect_eq(invalid, 1, "row %d", i + 1);
        if (winner >= 0)
            state_is(i + 1, mv[winner].to[i]);
    }
}
