/* include/idem/random.h - randomness for libidem: the kernel's, or an injected one.
 *
 * Tokens, fresh keys and retry jitter need random numbers.  Production code
 * takes them from the kernel (getrandom(2)); tests inject an idem_rng_t so a
 * jittered delay or a generated key is known in advance.
 *
 * THREADING: idem_random_bytes and the kernel source are thread-safe; an
 * injected source is as safe as its next_u64.
 */
#ifndef IDEM_RANDOM_H
#define IDEM_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"

/** A source of uniformly distributed 64-bit numbers. */
typedef struct idem_rng {
    uint64_t (*next_u64)(void *ctx); /* returns the next number */
    void *ctx;                       /* passed to next_u64 */
} idem_rng_t;

/** Fill buf with n bytes from the kernel's generator (getrandom(2)).
 * @return IDEM_OK, or IDEM_E_IO when the kernel gave none (buf is then zeroed). */
IDEM_EXTERN idem_err_t idem_random_bytes(void *buf, size_t n);

/** The next number of rng, or of the kernel's generator when rng is NULL (a
 * kernel failure, which getrandom does not have once the pool is seeded,
 * gives a number from the clock rather than none). */
IDEM_EXTERN uint64_t idem_rng_u64(const idem_rng_t *rng);

/** A uniformly distributed number in [0, bound), without modulo bias;
 * 0 when bound is 0.  It draws again while the number falls in the few at
 * the bottom of the range that would bias it, so an injected source must
 * vary (one that always returns 0 never ends for a bound that is not a
 * power of two). */
IDEM_EXTERN uint64_t idem_rng_below(const idem_rng_t *rng, uint64_t bound);

#endif /* IDEM_RANDOM_H */
