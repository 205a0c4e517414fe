/* include/idem/fsm.h - a state-machine helper for a service's own rows.
 *
 * Many operations are made idempotent by their state rather than by a key:
 * paying an order that is already paid should succeed without charging
 * again, and shipping a cancelled order must fail.  A service declares its
 * transition table once; idem_fsm_transition then moves one row with a
 * conditional update,
 *
 *     UPDATE <table> SET <state_column> = :to
 *      WHERE <id_column> = :id AND <state_column> = :from
 *
 * where :from is the state just read, so two racing transitions of one row
 * cannot both apply: the loser re-reads and decides again.  Asking for the
 * state the row is already in succeeds without effect (IDEM_FSM_ALREADY);
 * a transition the table does not declare is IDEM_E_INVAL with a sentence
 * naming both states ("invalid transition from 'delivered' to 'cancelled'").
 *
 * It runs on the connection of an idem_tx_t (idem/tx.h), SQLite or
 * PostgreSQL, inside or outside the caller's transaction; run it inside the
 * transaction that does the transition's other writes, so they commit
 * together.  The table, column and state names are the caller's constants;
 * table and column names are checked ([A-Za-z_][A-Za-z0-9_]*, at most 63)
 * and quoted in the SQL, so they are used exactly as written (on PostgreSQL,
 * as the catalog spells them: usually lowercase).  The id column must be
 * unique (a primary key); the id and states are bound as values.
 */
#ifndef IDEM_FSM_H
#define IDEM_FSM_H

#include <stdbool.h>
#include <stddef.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/tx.h"

#define IDEM_FSM_STATE_MAX 63 /* characters of a state name */
#define IDEM_FSM_ID_MAX 255 /* characters of a row id */
#define IDEM_FSM_TRANSITIONS_MAX 1024 /* transitions in one table */

typedef struct idem_fsm_transition {
    const char *from;
    const char *to;
} idem_fsm_transition_t;

typedef struct idem_fsm {
    const char *table;        /* e.g. "orders" */
    const char *id_column;    /* e.g. "id" */
    const char *state_column; /* e.g. "state" */
    const idem_fsm_transition_t *transitions;
    size_t n_transitions;
} idem_fsm_t;

typedef enum idem_fsm_outcome {
    IDEM_FSM_CHANGED = 1, /* the row moved from its state to the one asked for */
    IDEM_FSM_ALREADY = 2, /* the row was already in that state; nothing written */
} idem_fsm_outcome_t;

/** Check a declaration: names valid, no empty state, no transition listed
 * twice.  @return IDEM_OK or IDEM_E_INVAL with errbuf naming the problem. */
IDEM_EXTERN idem_err_t idem_fsm_validate(const idem_fsm_t *fsm, char *errbuf, size_t errlen);

/** Whether the table allows from -> to (from == to is always allowed: it
 * is the no-effect case).  Pure; never touches a database. */
IDEM_EXTERN bool idem_fsm_allows(const idem_fsm_t *fsm, const char *from, const char *to);

/** Move row id to state to.
 * @param[in]  id        the row's id as text (a number is compared as one).
 * @param[out] outcome   CHANGED or ALREADY on IDEM_OK.
 * @param[out] from      optional, IDEM_FSM_STATE_MAX + 1 bytes: the state
 *                       found (before the change); also set on an
 *                       undeclared transition; "" otherwise.
 * @param[out] errbuf, errlen  a sentence naming the problem on failure.
 * @return IDEM_OK; IDEM_E_INVAL (a transition the table does not declare,
 *         errbuf names both states; or a bad declaration); IDEM_E_NOTFOUND
 *         (no such row); IDEM_E_RETRY (the database refused the transaction,
 *         or the row kept changing under us); IDEM_E_IO; IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_fsm_transition(idem_tx_t *db, const idem_fsm_t *fsm, const char *id,
                                           const char *to, idem_fsm_outcome_t *outcome,
                                           char *from, char *errbuf, size_t errlen);

#endif /* IDEM_FSM_H */
