/* src/gateway/sweep.c - one round of the sweeper, paced by what it finds.
 *
 * Records must leave the store at least as fast as they arrive, or a store
 * that keeps them for key_ttl grows without bound at any rate above what
 * one sweep call removes per round.  A fixed step (the old 2,000 records a
 * second) is the wrong shape: it is too much work when little has expired
 * and too little under sustained load.  So a round repeats bounded steps
 * (idem_store_sweep with max = step) while they come back busy, and stops
 * when one comes back less than a quarter full, or at a step or time
 * limit, whichever is first.
 *
 * Why a quarter and not "full": a store that keeps an expiry index
 * (PostgreSQL's expires_at index, lmdb:'s and rocksdb:'s expiry index, all
 * in expiry order) removes a full step whenever that many have expired, and
 * a step less than full means it is done.  A store that scans in key order
 * instead (memory:) visits `step` records and removes the expired among
 * them, so its step is rarely full; with the quarter rule it goes on while
 * at least a quarter of what it visits has expired, which bounds the
 * expired backlog to about a third of the live records whatever the
 * arrival rate (up to the round's limits), where a fixed step let it grow
 * without end.  Under steady arrivals an indexed store's steps find what
 * expired since the last one; requiring a quarter keeps a round from
 * spinning on single records.
 *
 * Each step is its own store transaction, so writes interleave between
 * steps (the sweeper runs on its own thread; writer.c); the round yields
 * the CPU between steps as well.
 *
 * THREADING: runs on the caller's thread.
 */
#include <sched.h>

#include "gateway/sweep.h"
#include "idem/clock.h"

void idem__sweep_round(idem_store_t *store, int64_t now_ms, const idem_sweep_limits_t *lim,
                       idem_sweep_result_t *out)
{
    out->removed = 0;
    out->steps = 0;
    out->behind = false;
    out->err = IDEM_OK;
    if (lim->step == 0 || lim->max_steps == 0)
        return;
    uint64_t t0 = idem_clock_mono_ns();
    for (;;) {
        size_t removed = 0;
        idem_err_t err = idem_store_sweep(store, now_ms, lim->step, &removed);
        out->steps++;
        out->removed += removed;
        if (err != IDEM_OK) {
            out->err = err;
            return;
        }
        if (removed * 4 < lim->step)
            return; /* caught up */
        if (out->steps >= lim->max_steps ||
            (lim->budget_ns != 0 && idem_clock_mono_ns() - t0 >= lim->budget_ns)) {
            out->behind = true;
            return;
        }
        sched_yield();
    }
}
