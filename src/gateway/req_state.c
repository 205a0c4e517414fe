/* src/gateway/req_state.c - a request's state and holds (req_state.h says
 * what they mean and who holds what).
 *
 * INVARIANTS: total is the sum of holds; the state never moves backwards;
 * DONE is reached once, by the release that takes total to zero, and a
 * DONE life takes no hold.
 */
#include "gateway/req_state.h"

void idem__life_init(idem_req_life_t *l, idem_hold_t first)
{
    *l = (idem_req_life_t){.state = IDEM_REQ_PARSED};
    l->holds[first] = 1;
    l->total = 1;
}

bool idem__life_hold(idem_req_life_t *l, idem_hold_t h)
{
    if (l->state == IDEM_REQ_DONE)
        return false;
    l->holds[h]++;
    l->total++;
    return true;
}

bool idem__life_release(idem_req_life_t *l, idem_hold_t h)
{
    if (l->holds[h] == 0)
        return false;
    l->holds[h]--;
    if (--l->total > 0)
        return false;
    l->ended_in = l->state;
    l->state = IDEM_REQ_DONE;
    return true;
}

bool idem__life_advance(idem_req_life_t *l, idem_req_state_t to)
{
    if (to < l->state || to == IDEM_REQ_DONE)
        return false;
    l->state = to;
    return true;
}

const char *idem__req_state_name(idem_req_state_t s)
{
    switch (s) {
    case IDEM_REQ_PARSED: return "parsed";
    case IDEM_REQ_CHECKED: return "checked";
    case IDEM_REQ_DECIDING: return "deciding";
    case IDEM_REQ_FORWARDING: return "forwarding";
    case IDEM_REQ_RECORDING: return "recording";
    case IDEM_REQ_RELAYING: return "relaying";
    case IDEM_REQ_ANSWERED: return "answered";
    case IDEM_REQ_DONE: return "done";
    }
    return "unknown";
}
