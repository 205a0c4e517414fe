/* src/gateway/req_state.h - the life of a request as a state and a count of
 * what holds it.
 *
 * A request (request.c) moves through its states in one direction:
 *
 *   PARSED -> CHECKED -> DECIDING -> FORWARDING -> RECORDING -> RELAYING
 *          -> ANSWERED -> DONE
 *
 * skipping those it has no use for (a replay goes from DECIDING to
 * ANSWERED).  It stays alive while something holds it: its client
 * connection, each writer job, its fingerprint in the thread pool, its
 * upstream call, its armed timer, and the code on the stack that may end it.
 * Each holder takes a hold of its kind when it starts and gives it back
 * when it is done with the request; when the last hold is given back the
 * request is DONE and its owner ends it (logs, counts, frees), exactly
 * once.  Nothing else decides when a request may be freed.
 *
 * The holds are counted by kind, so that "is a renewal in flight" or "does
 * the connection still hold it" is a question of the count, not a flag kept
 * beside it, and a hold given back that was never taken changes nothing.
 *
 * This file knows nothing of loops or sockets: tests/unit/test_req_state.c
 * drives it alone.
 * THREADING: one thread (the request's loop).
 */
#ifndef IDEM_GATEWAY_REQ_STATE_H
#define IDEM_GATEWAY_REQ_STATE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    IDEM_REQ_PARSED,     /* its head is parsed; its body is being read */
    IDEM_REQ_CHECKED,    /* the head's own checks passed (route, key or token) */
    IDEM_REQ_DECIDING,   /* whole: scope, fingerprint, the store's read, a claim or token use */
    IDEM_REQ_FORWARDING, /* its upstream call runs (a keyed one renews its lease) */
    IDEM_REQ_RECORDING,  /* the upstream's outcome is being written to the store */
    IDEM_REQ_RELAYING,   /* a large response's head went to the client; its body follows */
    IDEM_REQ_ANSWERED,   /* its whole answer is queued, or there was no one to answer */
    IDEM_REQ_DONE,       /* nothing holds it: it is being logged, counted and freed */
} idem_req_state_t;

typedef enum {
    IDEM_HOLD_CONN,        /* the client connection reading or awaiting its answer */
    IDEM_HOLD_CALL,        /* code on the stack that may end the request, until it returns */
    IDEM_HOLD_JOB,         /* a writer job (claim, completion, release, hold, token) */
    IDEM_HOLD_RENEW,       /* a lease renewal with the writer */
    IDEM_HOLD_FINGERPRINT, /* the body's fingerprint in libuv's thread pool */
    IDEM_HOLD_UPSTREAM,    /* the upstream call, until it ends or is cancelled */
    IDEM_HOLD_TIMER,       /* the request's timer, while armed or in its callback */
    IDEM_HOLD__COUNT
} idem_hold_t;

typedef struct idem_req_life {
    idem_req_state_t state;
    idem_req_state_t ended_in;        /* once DONE: the state it was in before */
    uint32_t holds[IDEM_HOLD__COUNT];
    uint32_t total;                   /* the sum of holds */
} idem_req_life_t;

/** A life in PARSED, held once by first. */
void idem__life_init(idem_req_life_t *l, idem_hold_t first);
/** Take a hold of kind h.  A DONE life takes none.  @return whether it did. */
bool idem__life_hold(idem_req_life_t *l, idem_hold_t h);
/** Give back a hold of kind h (none held: nothing happens).
 * @return true exactly once: when this was the last hold, and the life is
 *         now DONE (its owner must end it). */
bool idem__life_release(idem_req_life_t *l, idem_hold_t h);
/** Move to state to, unless that is backwards, or DONE (which only the
 * last release reaches).  Staying where it is counts as a move.
 * @return whether the life is now in state to. */
bool idem__life_advance(idem_req_life_t *l, idem_req_state_t to);
/** How many holds of kind h the life has. */
static inline uint32_t idem__life_holds(const idem_req_life_t *l, idem_hold_t h)
{
    return l->holds[h];
}
/** The state's name, for logs ("forwarding"). */
const char *idem__req_state_name(idem_req_state_t s);

#endif /* IDEM_GATEWAY_REQ_STATE_H */
