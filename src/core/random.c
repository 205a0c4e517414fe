/* src/core/random.c - the kernel's random numbers, and uniform draws from any source.
 *
 * getrandom(2) with no flags blocks only until the kernel's pool is first
 * seeded, which happens early in boot, and then never fails for requests of
 * up to 256 bytes; it can still be interrupted by a signal, so it is called
 * in a loop.  idem_rng_below draws without modulo bias by rejecting the few
 * numbers above the largest multiple of the bound (Lemire's threshold), so
 * a jittered delay is uniform over its whole range.
 *
 * THREADING: reentrant.
 */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "idem/clock.h"
#include "idem/random.h"

idem_err_t idem_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    size_t got = 0;

    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, 0);

        if (r < 0) {
            if (errno == EINTR)
                continue;
            memset(buf, 0, n);
            return IDEM_E_IO;
        }
        got += (size_t)r;
    }
    return IDEM_OK;
}

uint64_t idem_rng_u64(const idem_rng_t *rng)
{
    uint64_t v;

    if (rng != NULL && rng->next_u64 != NULL)
        return rng->next_u64(rng->ctx);
    if (idem_random_bytes(&v, sizeof v) != IDEM_OK)
        v = idem_clock_mono_ns() * UINT64_C(0x9E3779B97F4A7C15);
    return v;
}

uint64_t idem_rng_below(const idem_rng_t *rng, uint64_t bound)
{
    /* Numbers below `threshold` would make some results more likely than
     * others; (2^64 - bound) % bound of them exist, computed without 2^64. */
    uint64_t threshold, v;

    if (bound == 0)
        return 0;
    threshold = (0 - bound) % bound;
    do {
        v = idem_rng_u64(rng);
    } while (v < threshold);
    return v % bound;
}
