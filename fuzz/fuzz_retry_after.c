/* fuzz/fuzz_retry_after.c - libFuzzer target for the Retry-After parser
 * (idem_retry_after_parse, src/core/retry.c): delta-seconds and the three
 * HTTP-date forms of RFC 9110 section 5.6.7.
 *
 * The whole input is the header value, parsed against several clocks: far
 * before year 0 (so every date is in the future and the delay gives the
 * date itself back), the epoch, a date in 2025, the end of year 9999, and
 * INT64_MIN / INT64_MAX (the overflow edges).  Properties checked:
 *   - the result is IDEM_OK or IDEM_E_INVAL whatever the clock, the delay
 *     is >= 0, and 0 on failure;
 *   - delta-seconds (the value starts with a digit) does not depend on the
 *     clock, is a whole number of seconds and at most IDEM_RETRY_AFTER_MAX_S;
 *   - an IMF-fixdate or asctime date D gives max(0, D - now) (saturated) for
 *     every clock, and D written back by gmtime_r as IMF-fixdate and as
 *     asctime parses to D again (RFC 850 dates depend on the clock's
 *     century, so they get only the first property).
 */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fuzz_check.h"
#include "idem/retry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Before 1 January of year 0 (-62167219200000 ms) by a wide margin. */
#define FAR_PAST (-(INT64_C(1) << 50))

static const int64_t clocks[] = {
    FAR_PAST, 0, INT64_C(1750000000000), INT64_C(253402300799000), INT64_MIN, INT64_MAX,
};

static idem_err_t parse(const char *value, size_t len, int64_t now, int64_t *delay)
{
    char *in = malloc(len ? len : 1); /* its own block: a read past it is caught */
    CHECK(in != NULL);
    memcpy(in, value, len);
    *delay = -1;
    idem_err_t err = idem_retry_after_parse(in, len, now, delay);
    free(in);
    CHECK(err == IDEM_OK || err == IDEM_E_INVAL);
    CHECK(*delay >= 0);
    if (err != IDEM_OK)
        CHECK(*delay == 0);
    return err;
}

static int64_t expected_delay(int64_t date, int64_t now)
{
    int64_t d;
    if (now >= date)
        return 0;
    return __builtin_sub_overflow(date, now, &d) ? INT64_MAX : d;
}

/* D written back in a form the parser must read as D. */
static void reparse(const char *fmt_imf_or_asc, int64_t date_ms)
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = (time_t)(date_ms / 1000);
    struct tm tm;
    char buf[64];
    int n;
    CHECK(date_ms % 1000 == 0);
    CHECK(gmtime_r(&t, &tm) != NULL);
    if (tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999)
        return;
    if (fmt_imf_or_asc[0] == 'i')
        n = snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday],
                     tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                     tm.tm_sec);
    else
        n = snprintf(buf, sizeof buf, "%s %s %2d %02d:%02d:%02d %04d", days[tm.tm_wday],
                     months[tm.tm_mon], tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     tm.tm_year + 1900);
    CHECK(n > 0 && (size_t)n < sizeof buf);
    int64_t delay;
    CHECK(parse(buf, (size_t)n, FAR_PAST, &delay) == IDEM_OK);
    CHECK(delay + FAR_PAST == date_ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *value = (const char *)data;
    size_t n_clocks = sizeof clocks / sizeof *clocks;
    idem_err_t err[sizeof clocks / sizeof *clocks];
    int64_t delay[sizeof clocks / sizeof *clocks];

    for (size_t i = 0; i < n_clocks; i++)
        err[i] = parse(value, size, clocks[i], &delay[i]);

    size_t start = 0;
    while (start < size && (value[start] == ' ' || value[start] == '\t'))
        start++;
    if (start < size && value[start] >= '0' && value[start] <= '9') {
        for (size_t i = 0; i < n_clocks; i++) {
            CHECK(err[i] == err[0] && delay[i] == delay[0]);
            CHECK(delay[i] % 1000 == 0 && delay[i] <= INT64_C(1000) * IDEM_RETRY_AFTER_MAX_S);
        }
        return 0;
    }
    /* RFC 850 spells the day name in full; the two other forms do not. */
    bool rfc850 = size - start > 4 && memchr(value + start, ',', size - start) != NULL &&
                  value[start + 3] != ',';
    if (rfc850 || err[0] != IDEM_OK) {
        if (!rfc850)
            for (size_t i = 0; i < n_clocks; i++)
                CHECK(err[i] == IDEM_E_INVAL);
        return 0;
    }
    int64_t date = delay[0] + FAR_PAST;
    for (size_t i = 0; i < n_clocks; i++) {
        CHECK(err[i] == IDEM_OK);
        CHECK(delay[i] == expected_delay(date, clocks[i]));
    }
    reparse("imf", date);
    reparse("asctime", date);
    return 0;
}
