/* tests/unit/test_req_state.c - a request's life (src/gateway/req_state.c):
 * its state only moves forward, and it ends exactly once, when the last
 * hold is given back.
 *
 * request.c ends a request (logs, counts, frees it) when
 * idem__life_release says so; an owner here counts those ends instead of
 * freeing, and the holders of request.c (connection, jobs, upstream call,
 * timer, the code on the stack) are played in every order a seeded random
 * walk finds.
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "gateway/req_state.h"

/* An owner that counts its ends, as request.c's req_end frees. */
typedef struct {
    idem_req_life_t life;
    int ended;
} owner_t;

static void release(owner_t *o, idem_hold_t h)
{
    if (idem__life_release(&o->life, h))
        o->ended++;
}

Test(req_state, starts_parsed_held_by_its_maker)
{
    owner_t o = {0};
    idem__life_init(&o.life, IDEM_HOLD_CONN);
    cr_assert_eq(o.life.state, IDEM_REQ_PARSED);
    cr_assert_eq(idem__life_holds(&o.life, IDEM_HOLD_CONN), 1);
    cr_assert_eq(o.life.total, 1);
}

Test(req_state, ends_once_when_the_last_hold_goes)
{
    owner_t o = {0};
    idem__life_init(&o.life, IDEM_HOLD_CONN);
    idem__life_hold(&o.life, IDEM_HOLD_JOB);
    idem__life_hold(&o.life, IDEM_HOLD_UPSTREAM);
    release(&o, IDEM_HOLD_CONN);
    release(&o, IDEM_HOLD_UPSTREAM);
    cr_assert_eq(o.ended, 0, "ended while a job still held it");
    cr_assert_neq(o.life.state, IDEM_REQ_DONE);
    release(&o, IDEM_HOLD_JOB);
    cr_assert_eq(o.ended, 1);
    cr_assert_eq(o.life.state, IDEM_REQ_DONE);
    /* Nothing more ends it, nor holds it again. */
    release(&o, IDEM_HOLD_JOB);
    cr_assert_not(idem__life_hold(&o.life, IDEM_HOLD_TIMER));
    release(&o, IDEM_HOLD_TIMER);
    cr_assert_eq(o.ended, 1);
}

Test(req_state, a_hold_never_taken_gives_nothing_back)
{
    owner_t o = {0};
    idem__life_init(&o.life, IDEM_HOLD_CONN);
    release(&o, IDEM_HOLD_UPSTREAM); /* an abort of a call that never ran */
    cr_assert_eq(o.life.total, 1);
    cr_assert_eq(o.ended, 0);
    release(&o, IDEM_HOLD_CONN);
    cr_assert_eq(o.ended, 1);
}

Test(req_state, holds_of_a_kind_are_counted)
{
    owner_t o = {0};
    idem__life_init(&o.life, IDEM_HOLD_CONN);
    /* A one-shot timer re-armed in its own callback: two timer holds. */
    idem__life_hold(&o.life, IDEM_HOLD_TIMER);
    idem__life_hold(&o.life, IDEM_HOLD_TIMER);
    cr_assert_eq(idem__life_holds(&o.life, IDEM_HOLD_TIMER), 2);
    release(&o, IDEM_HOLD_CONN);
    release(&o, IDEM_HOLD_TIMER);
    cr_assert_eq(o.ended, 0);
    cr_assert_eq(idem__life_holds(&o.life, IDEM_HOLD_TIMER), 1);
    release(&o, IDEM_HOLD_TIMER);
    cr_assert_eq(o.ended, 1);
}

Test(req_state, states_only_move_forward)
{
    idem_req_life_t l;
    idem__life_init(&l, IDEM_HOLD_CONN);
    cr_assert(idem__life_advance(&l, IDEM_REQ_CHECKED));
    cr_assert(idem__life_advance(&l, IDEM_REQ_FORWARDING)); /* skipping is fine */
    cr_assert(idem__life_advance(&l, IDEM_REQ_FORWARDING)); /* so is staying */
    cr_assert_not(idem__life_advance(&l, IDEM_REQ_DECIDING));
    cr_assert_eq(l.state, IDEM_REQ_FORWARDING, "a move back changed the state");
    cr_assert(idem__life_advance(&l, IDEM_REQ_ANSWERED));
    cr_assert_not(idem__life_advance(&l, IDEM_REQ_RELAYING));
    cr_assert_eq(l.state, IDEM_REQ_ANSWERED);
}

Test(req_state, done_is_reached_only_by_the_last_release)
{
    owner_t o = {0};
    idem__life_init(&o.life, IDEM_HOLD_CONN);
    cr_assert_not(idem__life_advance(&o.life, IDEM_REQ_DONE));
    cr_assert_eq(o.life.state, IDEM_REQ_PARSED);
    idem__life_advance(&o.life, IDEM_REQ_RECORDING);
    release(&o, IDEM_HOLD_CONN);
    cr_assert_eq(o.life.state, IDEM_REQ_DONE);
    cr_assert_eq(o.life.ended_in, IDEM_REQ_RECORDING, "where it ended is kept");
    cr_assert_not(idem__life_advance(&o.life, IDEM_REQ_ANSWERED), "a done life moved");
}

Test(req_state, every_state_has_a_name)
{
    for (int s = IDEM_REQ_PARSED; s <= IDEM_REQ_DONE; s++)
        cr_assert_str_neq(idem__req_state_name((idem_req_state_t)s), "unknown");
}

/* xorshift64*: the walk below is the same on every run. */
static uint64_t next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

/* Holders come and go in random order, the state moves by random steps:
 * the life ends exactly once, at the release that leaves no hold, never
 * before, and its state never goes back. */
Test(req_state, random_holders_end_it_exactly_once)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 2000; round++) {
        owner_t o = {0};
        uint32_t held[IDEM_HOLD__COUNT] = {0};
        uint32_t total = 1;
        idem__life_init(&o.life, IDEM_HOLD_CONN);
        held[IDEM_HOLD_CONN] = 1;
        idem_req_state_t seen = o.life.state;
        while (o.ended == 0) {
            uint64_t r = next(&seed);
            idem_hold_t h = (idem_hold_t)(r % IDEM_HOLD__COUNT);
            if ((r >> 8) % 3 == 0 && total < 8) {
                cr_assert(idem__life_hold(&o.life, h));
                held[h]++;
                total++;
            } else if ((r >> 8) % 3 == 1) {
                idem__life_advance(&o.life, (idem_req_state_t)((r >> 16) % IDEM_REQ_DONE));
            } else {
                int before = o.ended;
                release(&o, h);
                if (held[h] > 0) {
                    held[h]--;
                    total--;
                }
                cr_assert_eq(o.ended - before, total == 0 ? 1 : 0,
                             "round %d: ended with %u holds left", round, total);
            }
            cr_assert_geq(o.life.state, seen, "round %d: the state went back", round);
            seen = o.life.state;
            cr_assert_eq(o.life.total, total);
        }
        cr_assert_eq(o.life.state, IDEM_REQ_DONE);
        for (int h = 0; h < IDEM_HOLD__COUNT; h++)
            release(&o, (idem_hold_t)h);
        cr_assert_eq(o.ended, 1, "round %d: ended twice", round);
    }
}
