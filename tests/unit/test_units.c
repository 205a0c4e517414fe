/* tests/unit/test_units.c - durations and sizes of src/core/units.c. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "idem/units.h"

static int64_t dur(const char *s)
{
    int64_t ms = -1;
    cr_assert_eq(idem_parse_duration(s, &ms), IDEM_OK, "duration \"%s\" refused", s);
    return ms;
}

static void dur_bad(const char *s)
{
    int64_t ms = -1;
    cr_expect_eq(idem_parse_duration(s, &ms), IDEM_E_INVAL, "duration \"%s\" accepted", s);
    cr_expect_eq(ms, 0, "duration \"%s\": out not zeroed", s);
}

static uint64_t size(const char *s)
{
    uint64_t b = 1;
    cr_assert_eq(idem_parse_size(s, &b), IDEM_OK, "size \"%s\" refused", s);
    return b;
}

static void size_bad(const char *s)
{
    uint64_t b = 1;
    cr_expect_eq(idem_parse_size(s, &b), IDEM_E_INVAL, "size \"%s\" accepted", s);
    cr_expect_eq(b, 0, "size \"%s\": out not zeroed", s);
}

Test(units, duration_milliseconds)
{
    cr_expect_eq(dur("250ms"), 250);
}

Test(units, duration_seconds)
{
    cr_expect_eq(dur("30s"), 30000);
}

Test(units, duration_minutes)
{
    cr_expect_eq(dur("5m"), 300000);
}

Test(units, duration_hours)
{
    cr_expect_eq(dur("24h"), 86400000);
}

Test(units, duration_days)
{
    cr_expect_eq(dur("7d"), 604800000);
}

Test(units, duration_zero_is_allowed)
{
    cr_expect_eq(dur("0s"), 0);
    cr_expect_eq(dur("0ms"), 0);
}

Test(units, duration_largest_that_fits)
{
    cr_expect_eq(dur("9223372036854775807ms"), INT64_MAX);
}

Test(units, duration_overflow_refused)
{
    dur_bad("9223372036854775808ms");
    dur_bad("9223372036854776s");
    dur_bad("106751991167301d");
    dur_bad("99999999999999999999999999s");
}

Test(units, duration_without_unit_refused)
{
    dur_bad("30");
}

Test(units, duration_unknown_unit_refused)
{
    dur_bad("5x");
    dur_bad("5sec");
    dur_bad("30S");
    dur_bad("5M");
    dur_bad("1w");
}

Test(units, duration_empty_refused)
{
    dur_bad("");
    dur_bad(NULL);
}

Test(units, duration_white_space_refused)
{
    dur_bad(" 5s");
    dur_bad("5s ");
    dur_bad("5 s");
    dur_bad("\t5s");
}

Test(units, duration_negative_or_signed_refused)
{
    dur_bad("-5s");
    dur_bad("+5s");
}

Test(units, duration_fraction_refused)
{
    dur_bad("1.5s");
    dur_bad("1e3ms");
}

Test(units, duration_unit_alone_refused)
{
    dur_bad("s");
    dur_bad("ms");
}

Test(units, size_plain_bytes)
{
    cr_expect_eq(size("512"), 512);
    cr_expect_eq(size("0"), 0);
}

Test(units, size_b_suffix)
{
    cr_expect_eq(size("512B"), 512);
}

Test(units, size_kib)
{
    cr_expect_eq(size("64KiB"), 65536);
    cr_expect_eq(size("64KB"), 65536);
    cr_expect_eq(size("64kB"), 65536);
    cr_expect_eq(size("64K"), 65536);
    cr_expect_eq(size("64k"), 65536);
}

Test(units, size_mib)
{
    cr_expect_eq(size("1MiB"), 1048576);
    cr_expect_eq(size("1MB"), 1048576);
    cr_expect_eq(size("10M"), 10485760);
}

Test(units, size_gib)
{
    cr_expect_eq(size("1GiB"), UINT64_C(1073741824));
    cr_expect_eq(size("2GB"), UINT64_C(2147483648));
    cr_expect_eq(size("3G"), UINT64_C(3221225472));
}

Test(units, size_largest_that_fits)
{
    cr_expect_eq(size("18446744073709551615"), UINT64_MAX);
    cr_expect_eq(size("17179869183GiB"), UINT64_C(17179869183) << 30);
}

Test(units, size_overflow_refused)
{
    size_bad("18446744073709551616");
    size_bad("17179869184GiB");
    size_bad("18014398509481984KiB");
}

Test(units, size_unknown_unit_refused)
{
    size_bad("1TiB");
    size_bad("1m");
    size_bad("1mb");
    size_bad("1b");
    size_bad("1KiBB");
}

Test(units, size_empty_refused)
{
    size_bad("");
    size_bad(NULL);
}

Test(units, size_white_space_refused)
{
    size_bad(" 1MiB");
    size_bad("1MiB ");
    size_bad("1 MiB");
}

Test(units, size_negative_or_signed_refused)
{
    size_bad("-1");
    size_bad("+1");
    size_bad("-1MiB");
}

Test(units, size_fraction_refused)
{
    size_bad("1.5MiB");
    size_bad("0.5");
}

Test(units, size_unit_alone_refused)
{
    size_bad("MiB");
    size_bad("B");
}
