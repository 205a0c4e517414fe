/* include/idem/clock.h - time as libidem sees it.
 *
 * All times are wall-clock milliseconds since the Unix epoch, because records
 * are shared between processes and outlive restarts.  Whoever decides on
 * time takes an idem_clock_t, so tests can run a lease or a retention out
 * without sleeping.
 */
#ifndef IDEM_CLOCK_H
#define IDEM_CLOCK_H

#include <stdint.h>

#include "idem/extern.h"

typedef struct idem_clock {
    int64_t (*now_ms)(void *ctx); /* returns the current time */
    void *ctx;                    /* passed to now_ms */
} idem_clock_t;

/** The time by clock, or the real time (CLOCK_REALTIME) when clock is NULL. */
IDEM_EXTERN int64_t idem_clock_now(const idem_clock_t *clock);

/** A monotonic reading in nanoseconds, for measuring latencies only. */
IDEM_EXTERN uint64_t idem_clock_mono_ns(void);

#endif /* IDEM_CLOCK_H */
