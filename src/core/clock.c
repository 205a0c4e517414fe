/* src/core/clock.c - the real clocks behind idem_clock_t.
 *
 * Records carry wall-clock milliseconds since the Unix epoch (CLOCK_REALTIME)
 * because they are shared between processes and hosts and outlive restarts;
 * a monotonic clock would mean nothing to another process.  Latencies, which
 * never leave the process, are measured on CLOCK_MONOTONIC in nanoseconds so
 * that a wall-clock step cannot make them negative.
 *
 * Code that decides on time takes an idem_clock_t so that tests inject the
 * time instead of sleeping; idem_clock_now(NULL) is the real time.
 *
 * THREADING: reentrant; the injected now_ms must be safe for its callers.
 */
#include <time.h>

#include "idem/clock.h"

int64_t idem_clock_now(const idem_clock_t *clock)
{
    struct timespec ts;

    if (clock != NULL && clock->now_ms != NULL)
        return clock->now_ms(clock->ctx);
    /* clock_gettime cannot fail for CLOCK_REALTIME with a valid pointer. */
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

uint64_t idem_clock_mono_ns(void)
{
    struct timespec ts;

    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}
