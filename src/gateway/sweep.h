/* src/gateway/sweep.h - one round of the sweeper, paced by what it finds.
 *
 * The writer's sweeper thread (writer.c) runs a round once a second; this
 * is the round, kept apart from any thread so that a test can run it on a
 * real store and count its steps.  See sweep.c for the pacing rule.
 *
 * THREADING: a round runs on the caller's thread; the store is thread-safe.
 */
#ifndef IDEM_GATEWAY_SWEEP_H
#define IDEM_GATEWAY_SWEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/store.h"

/** How much one round may do. */
typedef struct idem_sweep_limits {
    size_t step;        /* records one idem_store_sweep call may remove (> 0) */
    size_t max_steps;   /* calls in one round (> 0) */
    uint64_t budget_ns; /* a round stops after this long; 0: no time limit */
} idem_sweep_limits_t;

/** What one round did. */
typedef struct idem_sweep_result {
    size_t removed; /* records removed, all steps */
    size_t steps;   /* idem_store_sweep calls */
    bool behind;    /* it stopped at a limit while steps still came back busy */
    idem_err_t err; /* the first failed call's error, else IDEM_OK */
} idem_sweep_result_t;

/** Sweep records whose retention ended at or before now_ms, in steps of
 * lim->step, for as long as each step comes back at least a quarter full
 * and the limits allow.  Never fails as a whole: a failed step ends the
 * round and is reported in out->err. */
void idem__sweep_round(idem_store_t *store, int64_t now_ms, const idem_sweep_limits_t *lim,
                       idem_sweep_result_t *out);

#endif
