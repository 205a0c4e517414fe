/* include/idem/units.h - durations and sizes as people write them.
 *
 * Durations: a whole number followed by ms, s, m, h or d ("250ms", "30s",
 * "5m", "24h"); sizes: a whole number alone (bytes) or followed by B, KiB,
 * MiB, GiB (also KB/MB/GB meaning the same powers of 1024, and kB, k/K/M/G).
 * White space around is not accepted; overflow is an error.
 */
#ifndef IDEM_UNITS_H
#define IDEM_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"

/** Parse a duration.  @param[in] s NUL-terminated.  @param[out] ms 0 on
 * failure.  @return IDEM_OK or IDEM_E_INVAL (no unit, unknown unit, not a
 * number, negative, overflow). */
IDEM_EXTERN idem_err_t idem_parse_duration(const char *s, int64_t *ms);

/** Parse a size.  @param[out] bytes 0 on failure.
 * @return IDEM_OK or IDEM_E_INVAL. */
IDEM_EXTERN idem_err_t idem_parse_size(const char *s, uint64_t *bytes);

#endif /* IDEM_UNITS_H */
