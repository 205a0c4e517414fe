/* src/core/units.c - durations and sizes as people write them in a config.
 *
 * Both are a whole decimal number followed by a unit with nothing between,
 * before or after: "250ms", "30s", "5m", "24h", "7d"; "512", "512B", "64KiB",
 * "1MiB", "1GiB".  Size units are powers of 1024 however they are spelled
 * (KiB, KB, kB, K, k; MiB, MB, M; GiB, GB, G), because a config writer who
 * says 1MB for a body limit means the 1 MiB everybody else means.  Unit
 * names are case-sensitive: "5M" is 5 MiB, "5m" is not a size; "30S" is not
 * a duration.
 *
 * Refused: an empty string, white space anywhere, a sign (so no negative
 * value), a fraction or exponent ("1.5s", "1e3"), a duration without unit
 * ("30"), an unknown unit, and a value that does not fit the result (int64
 * milliseconds, uint64 bytes).  Zero is fine ("0s", "0").
 *
 * THREADING: pure functions.
 */
#include <stdint.h>
#include <string.h>

#include "idem/units.h"

struct unit {
    const char *name;
    uint64_t scale;
};

static const struct unit durations[] = {
    {"ms", 1},
    {"s", 1000},
    {"m", 60 * 1000},
    {"h", 60 * 60 * 1000},
    {"d", 24 * 60 * 60 * 1000},
};

#define KIB UINT64_C(1024)
static const struct unit sizes[] = {
    {"", 1},
    {"B", 1},
    {"k", KIB},
    {"K", KIB},
    {"kB", KIB},
    {"KB", KIB},
    {"KiB", KIB},
    {"M", KIB * KIB},
    {"MB", KIB * KIB},
    {"MiB", KIB * KIB},
    {"G", KIB * KIB * KIB},
    {"GB", KIB * KIB * KIB},
    {"GiB", KIB * KIB * KIB},
};

/* The number at the start of s, times the scale its unit names, capped at
 * max.  IDEM_E_INVAL for anything but digits followed by one of the units. */
static idem_err_t parse(const char *s, const struct unit *units, size_t n_units, uint64_t max,
                        uint64_t *out)
{
    uint64_t num = 0;
    const char *p = s;
    size_t i;

    *out = 0;
    if (s == NULL || *p < '0' || *p > '9')
        return IDEM_E_INVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (num > (UINT64_MAX - d) / 10)
            return IDEM_E_INVAL;
        num = num * 10 + d;
    }
    for (i = 0; i < n_units; i++) {
        if (strcmp(p, units[i].name) != 0)
            continue;
        if (num > max / units[i].scale)
            return IDEM_E_INVAL;
        *out = num * units[i].scale;
        return IDEM_OK;
    }
    return IDEM_E_INVAL;
}

idem_err_t idem_parse_duration(const char *s, int64_t *ms)
{
    uint64_t v;
    idem_err_t err = parse(s, durations, sizeof durations / sizeof durations[0],
                           (uint64_t)INT64_MAX, &v);

    if (ms != NULL)
        *ms = err ? 0 : (int64_t)v;
    return ms == NULL ? IDEM_E_INVAL : err;
}

idem_err_t idem_parse_size(const char *s, uint64_t *bytes)
{
    uint64_t v;
    idem_err_t err = parse(s, sizes, sizeof sizes / sizeof sizes[0], UINT64_MAX, &v);

    if (bytes != NULL)
        *bytes = err ? 0 : v;
    return bytes == NULL ? IDEM_E_INVAL : err;
}
