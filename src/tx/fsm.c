/* src/tx/fsm.c - the state-machine helper (idem/fsm.h).
 *
 * A transition is a read and a compare-and-set:
 *
 *     SELECT <state> FROM <table> WHERE <id> = :id
 *     UPDATE <table> SET <state> = :to WHERE <id> = :id AND <state> = :read
 *
 * When the UPDATE changes nothing, someone moved the row between the two
 * statements; we read it again and decide again (ROUNDS times at most, then
 * IDEM_E_RETRY), so two racing transitions of one row never both apply.
 * Under PostgreSQL READ COMMITTED the loser's UPDATE waits for the winner's
 * transaction and then finds the state changed; under REPEATABLE READ or
 * SERIALIZABLE it fails with 40001, which is IDEM_E_RETRY.  On SQLite the
 * writers are serialised by the database.
 *
 * The statements are built per call from names idem_fsm_validate checked,
 * quoted (so they are used as written: on PostgreSQL write them as the
 * catalog has them, usually lowercase; on SQLite they are quoted [x], since
 * a misspelled "x" would silently be a string), and prepared per call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "idem/fsm.h"
#include "tx/tx_impl.h"

#define ROUNDS 8 /* reads of one transition before IDEM_E_RETRY */
#define SQL_MAX 512

static void say(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(char *errbuf, size_t errlen, const char *fmt, ...)
{
    if (errbuf == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

/* A state name: 1..IDEM_FSM_STATE_MAX bytes. */
static int state_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && memchr(s, '\0', IDEM_FSM_STATE_MAX + 1) != NULL;
}

idem_err_t idem_fsm_validate(const idem_fsm_t *fsm, char *errbuf, size_t errlen)
{
    say(errbuf, errlen, "%s", "");
    if (fsm == NULL) {
        say(errbuf, errlen, "no state machine given");
        return IDEM_E_INVAL;
    }
    const char *names[3] = {fsm->table, fsm->id_column, fsm->state_column};
    const char *what[3] = {"table", "id column", "state column"};
    for (int i = 0; i < 3; i++)
        if (!idem__tx_name_ok(names[i])) {
            say(errbuf, errlen,
                "the %s name \"%.64s\" is not 1 to %d characters of [A-Za-z0-9_] "
                "starting with a letter or _",
                what[i], names[i] ? names[i] : "(null)", IDEM_TX_TABLE_MAX);
            return IDEM_E_INVAL;
        }
    if (fsm->n_transitions > IDEM_FSM_TRANSITIONS_MAX ||
        (fsm->n_transitions > 0 && fsm->transitions == NULL)) {
        say(errbuf, errlen, "the table must list 0 to %d transitions", IDEM_FSM_TRANSITIONS_MAX);
        return IDEM_E_INVAL;
    }
    for (size_t i = 0; i < fsm->n_transitions; i++) {
        const idem_fsm_transition_t *t = &fsm->transitions[i];
        if (!state_ok(t->from) || !state_ok(t->to)) {
            say(errbuf, errlen, "transition %zu: a state name must be 1 to %d characters", i + 1,
                IDEM_FSM_STATE_MAX);
            return IDEM_E_INVAL;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(fsm->transitions[j].from, t->from) == 0 &&
                strcmp(fsm->transitions[j].to, t->to) == 0) {
                say(errbuf, errlen, "the transition from '%s' to '%s' is listed twice", t->from,
                    t->to);
                return IDEM_E_INVAL;
            }
    }
    return IDEM_OK;
}

bool idem_fsm_allows(const idem_fsm_t *fsm, const char *from, const char *to)
{
    if (fsm == NULL || from == NULL || to == NULL)
        return false;
    if (strcmp(from, to) == 0)
        return true;
    if (fsm->transitions == NULL || fsm->n_transitions > IDEM_FSM_TRANSITIONS_MAX)
        return false;
    for (size_t i = 0; i < fsm->n_transitions; i++) {
        const idem_fsm_transition_t *t = &fsm->transitions[i];
        if (t->from != NULL && t->to != NULL && strcmp(t->from, from) == 0 &&
            strcmp(t->to, to) == 0)
            return true;
    }
    return false;
}

idem_err_t idem_fsm_transition(idem_tx_t *db, const idem_fsm_t *fsm, const char *id,
                               const char *to, idem_fsm_outcome_t *outcome, char *from,
                               char *errbuf, size_t errlen)
{
    if (outcome != NULL)
        *outcome = 0;
    if (from != NULL)
        from[0] = '\0';
    if (db == NULL || outcome == NULL) {
        say(errbuf, errlen, "no connection or no place for the outcome given");
        return IDEM_E_INVAL;
    }
    idem_err_t rc = idem_fsm_validate(fsm, errbuf, errlen);
    if (rc != IDEM_OK)
        return rc;
    if (!state_ok(to)) {
        say(errbuf, errlen, "the target state must be 1 to %d characters", IDEM_FSM_STATE_MAX);
        return IDEM_E_INVAL;
    }
    if (id == NULL || id[0] == '\0' || memchr(id, '\0', IDEM_FSM_ID_MAX + 1) == NULL) {
        say(errbuf, errlen, "the row id must be 1 to %d characters", IDEM_FSM_ID_MAX);
        return IDEM_E_INVAL;
    }

    char m = db->ops->param_mark, qo = db->ops->quote_open, qc = db->ops->quote_close;
    char sel[SQL_MAX], upd[SQL_MAX];
    snprintf(sel, sizeof sel, "SELECT %c%s%c FROM %c%s%c WHERE %c%s%c = %c1", qo,
             fsm->state_column, qc, qo, fsm->table, qc, qo, fsm->id_column, qc, m);
    snprintf(upd, sizeof upd,
             "UPDATE %c%s%c SET %c%s%c = %c2 WHERE %c%s%c = %c1 AND %c%s%c = %c3", qo,
             fsm->table, qc, qo, fsm->state_column, qc, m, qo, fsm->id_column, qc, m, qo,
             fsm->state_column, qc, m);

    for (int round = 0; round < ROUNDS; round++) {
        idem__tx_param_t p[3] = {
            {.kind = IDEM__TXP_TEXT, .p = id, .len = strlen(id)},
            {.kind = IDEM__TXP_TEXT, .p = to, .len = strlen(to)},
        };
        idem__tx_result_t res;
        rc = db->ops->exec(db, IDEM__TX_SQL_ADHOC, sel, p, 1, &res);
        if (rc != IDEM_OK) {
            say(errbuf, errlen, "%s", idem_tx_errstr(db));
            return rc;
        }
        if (!res.row) {
            say(errbuf, errlen, "no row of %s has %s '%s'", fsm->table, fsm->id_column, id);
            return IDEM_E_NOTFOUND;
        }
        char cur[IDEM_FSM_STATE_MAX + 1];
        if (res.col_null || res.col_len == 0 || res.col_len > IDEM_FSM_STATE_MAX ||
            memchr(res.col, '\0', res.col_len) != NULL) {
            say(errbuf, errlen, "the row of %s '%s' has no valid state (%s)", fsm->id_column, id,
                res.col_null ? "NULL" : "empty or too long");
            idem__tx_result_cleanup(&res);
            return IDEM_E_INVAL;
        }
        memcpy(cur, res.col, res.col_len);
        cur[res.col_len] = '\0';
        idem__tx_result_cleanup(&res);
        if (from != NULL)
            memcpy(from, cur, strlen(cur) + 1);
        if (strcmp(cur, to) == 0) {
            *outcome = IDEM_FSM_ALREADY;
            return IDEM_OK;
        }
        if (!idem_fsm_allows(fsm, cur, to)) {
            say(errbuf, errlen, "invalid transition from '%s' to '%s'", cur, to);
            return IDEM_E_INVAL;
        }
        p[2] = (idem__tx_param_t){.kind = IDEM__TXP_TEXT, .p = cur, .len = strlen(cur)};
        rc = db->ops->exec(db, IDEM__TX_SQL_ADHOC, upd, p, 3, &res);
        if (rc != IDEM_OK) {
            say(errbuf, errlen, "%s", idem_tx_errstr(db));
            return rc;
        }
        int changed = res.changes > 0;
        idem__tx_result_cleanup(&res);
        if (changed) {
            *outcome = IDEM_FSM_CHANGED;
            return IDEM_OK;
        }
        /* The row moved between the read and the update: decide again. */
    }
    say(errbuf, errlen, "the row of %s '%s' kept changing", fsm->id_column, id);
    return IDEM_E_RETRY;
}
