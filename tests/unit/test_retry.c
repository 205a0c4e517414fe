/* tests/unit/test_retry.c - the retry policy (src/core/retry.c).
 *
 * Time and randomness are injected: every call gets an explicit now_ms and,
 * where a delay is drawn, a source whose numbers the test chose, so a
 * jittered delay is known exactly and nothing sleeps.  A backoff's range is
 * pinned from both ends: the number `ceiling` gives the ceiling, and
 * `ceiling + 1` gives 0, which holds only when the draw is below exactly
 * ceiling + 1.  The budget is also taken from by eight threads at once, to
 * show that the bucket neither goes below zero nor hands out more than it
 * holds, and neither passes its capacity when refilled concurrently.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "idem/retry.h"

/* ---- helpers ---- */

/* A draw below a bound rejects the numbers under 2^64 mod bound, which is
 * less than the bound: a test that wants result x for sure gives bound + x. */

/* Returns its values in turn, then UINT64_MAX (which every bound accepts,
 * so a draw that rejects too much ends instead of looping), counting calls. */
struct seq {
    const uint64_t *v;
    size_t n, calls;
};

static uint64_t seq_next(void *ctx)
{
    struct seq *s = ctx;
    size_t i = s->calls++;

    return i < s->n ? s->v[i] : UINT64_MAX;
}

/* The backoff before retry `attempt` when the source's first number is v. */
static int64_t backoff_with(const idem_retry_policy_t *p, unsigned attempt, uint64_t v)
{
    struct seq s = {&v, 1, 0};
    idem_rng_t rng = {seq_next, &s};
    int64_t d = idem_retry_backoff(p, attempt, &rng);

    cr_expect_eq(s.calls, 1, "attempt %u, number %llu: %zu draws", attempt,
                 (unsigned long long)v, s.calls);
    return d;
}

/* The draw is uniform on [0, ceiling]: ceiling and 0 are both reached, by the
 * numbers that prove the bound is ceiling + 1 exactly. */
static void expect_ceiling(const idem_retry_policy_t *p, unsigned attempt, int64_t ceiling)
{
    uint64_t c = (uint64_t)ceiling, bound = c + 1;

    cr_expect_eq(backoff_with(p, attempt, c), ceiling, "attempt %u: max not %lld", attempt,
                 (long long)ceiling);
    cr_expect_eq(backoff_with(p, attempt, bound), 0, "attempt %u: bound not %lld", attempt,
                 (long long)ceiling + 1);
    /* The largest numbers a source gives land on both ends too. */
    cr_expect_eq(backoff_with(p, attempt, UINT64_MAX - (UINT64_MAX - c) % bound), ceiling);
    cr_expect_eq(backoff_with(p, attempt, UINT64_MAX - UINT64_MAX % bound), 0);
}

static idem_retry_policy_t policy(int64_t base, int64_t cap, unsigned max, int64_t deadline)
{
    idem_retry_policy_t p = {base, cap, max, deadline};

    return p;
}

static void budget_set(idem_retry_budget_t *b, int64_t capacity, int64_t retry_cost,
                       int64_t timeout_cost, int64_t refill)
{
    idem_retry_budget_init(b);
    b->capacity = capacity;
    b->retry_cost = retry_cost;
    b->timeout_cost = timeout_cost;
    b->success_refill = refill;
    atomic_store(&b->tokens, capacity);
}

static idem_attempt_t status(int code)
{
    idem_attempt_t a = {IDEM_TRANSPORT_OK, code, NULL, 0, NULL};

    return a;
}

static idem_attempt_t transport(idem_transport_t t)
{
    idem_attempt_t a = {t, 0, NULL, 0, NULL};

    return a;
}

static idem_attempt_t with_retry_after(int code, const char *value)
{
    idem_attempt_t a = status(code);

    a.retry_after = value;
    a.retry_after_len = strlen(value);
    return a;
}

/* Parse value at now_ms: its delay, or -1 when refused (delay then 0). */
static int64_t after(const char *value, int64_t now_ms)
{
    int64_t d = 12345;

    if (idem_retry_after_parse(value, strlen(value), now_ms, &d) != IDEM_OK) {
        cr_expect_eq(d, 0, "delay not cleared on failure for [%s]", value);
        return -1;
    }
    cr_expect_geq(d, 0, "negative delay for [%s]", value);
    return d;
}

static void refused(const char *value)
{
    cr_expect_eq(after(value, 0), -1, "accepted [%s]", value);
}

/* Epoch milliseconds of the tests' dates (from `date -u -d ... +%s`). */
#define MS(s) (INT64_C(s) * 1000)
#define NOV_6_1994 MS(784111777)   /* Sun, 06 Nov 1994 08:49:37 GMT */
#define JUN_1_2026 MS(1780272000)  /* Mon, 01 Jun 2026 00:00:00 GMT */

/* ---- classification ---- */

Test(retry, every_status_from_100_to_599_is_classified)
{
    static const int retryable[] = {408, 409, 425, 429, 500, 502, 503, 504};
    int code;

    for (code = 100; code <= 599; code++) {
        idem_attempt_t a = status(code);
        bool expected = false;
        size_t i;

        for (i = 0; i < sizeof retryable / sizeof retryable[0]; i++)
            expected = expected || retryable[i] == code;
        cr_expect_eq(idem_retry_retryable(&a), expected, "status %d", code);
    }
}

Test(retry, transport_failures_are_retryable)
{
    idem_attempt_t c = transport(IDEM_TRANSPORT_CONNECT), t = transport(IDEM_TRANSPORT_TIMEOUT),
                   b = transport(IDEM_TRANSPORT_BROKEN);

    cr_expect(idem_retry_retryable(&c));
    cr_expect(idem_retry_retryable(&t));
    cr_expect(idem_retry_retryable(&b));
}

Test(retry, an_unknown_transport_or_no_attempt_is_not_retryable)
{
    idem_attempt_t a = transport((idem_transport_t)7);

    cr_expect_not(idem_retry_retryable(&a));
    cr_expect_not(idem_retry_retryable(NULL));
}

Test(retry, a_409_is_retried_only_while_in_flight)
{
    static const struct {
        const char *type;
        bool retryable;
    } cases[] = {
        {NULL, true},
        {"urn:idem:problem:in-flight", true},
        {"urn:idem:problem:token-used", false},
        {"urn:idem:problem:response-not-retained", false},
        {"urn:idem:problem:upstream-outcome-unknown", false},
        {"urn:idem:problem:fingerprint-mismatch", false},
        {"about:blank", false},
        {"", false},
        {"urn:idem:problem:in-flight-x", false},
        {"urn:idem:problem:in-fligh", false},
        {"URN:IDEM:PROBLEM:IN-FLIGHT", false},
    };
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        idem_attempt_t a = status(409);

        a.problem_type = cases[i].type;
        cr_expect_eq(idem_retry_retryable(&a), cases[i].retryable, "409 with type [%s]",
                     cases[i].type ? cases[i].type : "(none)");
    }
}

Test(retry, a_problem_type_does_not_change_other_statuses)
{
    idem_attempt_t busy = status(503), bad = status(400);

    busy.problem_type = "urn:idem:problem:token-used";
    bad.problem_type = "urn:idem:problem:in-flight";
    cr_expect(idem_retry_retryable(&busy));
    cr_expect_not(idem_retry_retryable(&bad));
}

/* ---- policy ---- */

Test(retry, policy_defaults_are_the_documented_ones_and_valid)
{
    idem_retry_policy_t p;
    char err[128] = "x";

    idem_retry_policy_init(&p);
    cr_expect_eq(p.base_ms, IDEM_RETRY_DEFAULT_BASE_MS);
    cr_expect_eq(p.cap_ms, IDEM_RETRY_DEFAULT_CAP_MS);
    cr_expect_eq(p.max_attempts, IDEM_RETRY_DEFAULT_MAX_ATTEMPTS);
    cr_expect_eq(p.deadline_ms, IDEM_RETRY_DEFAULT_DEADLINE_MS);
    cr_expect_eq(idem_retry_policy_check(&p, err, sizeof err), IDEM_OK);
    cr_expect_str_empty(err);
}

Test(retry, policy_limits_themselves_are_valid)
{
    idem_retry_policy_t hi = policy(IDEM_RETRY_MAX_MS_LIMIT, IDEM_RETRY_MAX_MS_LIMIT,
                                    IDEM_RETRY_MAX_ATTEMPTS_LIMIT, IDEM_RETRY_MAX_MS_LIMIT);
    idem_retry_policy_t lo = policy(1, 1, 1, 1);

    cr_expect_eq(idem_retry_policy_check(&hi, NULL, 0), IDEM_OK);
    cr_expect_eq(idem_retry_policy_check(&lo, NULL, 0), IDEM_OK);
}

static void check_refused(idem_retry_policy_t p, const char *message)
{
    char err[128] = "";

    cr_expect_eq(idem_retry_policy_check(&p, err, sizeof err), IDEM_E_INVAL, "%s", message);
    cr_expect_str_eq(err, message);
    cr_expect_eq(idem_retry_policy_check(&p, NULL, 0), IDEM_E_INVAL);
}

Test(retry, policy_check_names_the_field_out_of_range)
{
    const int64_t L = IDEM_RETRY_MAX_MS_LIMIT;

    check_refused(policy(0, 100, 5, 1000), "base_ms: must be 1 to 86400000");
    check_refused(policy(-5, 100, 5, 1000), "base_ms: must be 1 to 86400000");
    check_refused(policy(L + 1, L + 1, 5, 1000), "base_ms: must be 1 to 86400000");
    check_refused(policy(100, 99, 5, 1000), "cap_ms: must be base_ms to 86400000");
    check_refused(policy(100, L + 1, 5, 1000), "cap_ms: must be base_ms to 86400000");
    check_refused(policy(100, 100, 5, 0), "deadline_ms: must be 1 to 86400000");
    check_refused(policy(100, 100, 5, -1), "deadline_ms: must be 1 to 86400000");
    check_refused(policy(100, 100, 5, L + 1), "deadline_ms: must be 1 to 86400000");
    check_refused(policy(100, 100, 0, 1000), "max_attempts: must be 1 to 100");
    check_refused(policy(100, 100, 101, 1000), "max_attempts: must be 1 to 100");
    check_refused(policy(100, 100, UINT_MAX, 1000), "max_attempts: must be 1 to 100");
}

Test(retry, policy_check_truncates_its_message_and_refuses_null)
{
    idem_retry_policy_t p = policy(100, 100, 0, 1000);
    char err[8];

    cr_expect_eq(idem_retry_policy_check(&p, err, sizeof err), IDEM_E_INVAL);
    cr_expect_str_eq(err, "max_att");
    cr_expect_eq(idem_retry_policy_check(NULL, err, sizeof err), IDEM_E_INVAL);
    cr_expect_str_eq(err, "policy:");
}

Test(retry, budget_starts_full_with_the_defaults)
{
    idem_retry_budget_t b;

    idem_retry_budget_init(&b);
    cr_expect_eq(b.capacity, IDEM_RETRY_BUDGET_DEFAULT_CAPACITY);
    cr_expect_eq(b.retry_cost, IDEM_RETRY_BUDGET_DEFAULT_RETRY_COST);
    cr_expect_eq(b.timeout_cost, IDEM_RETRY_BUDGET_DEFAULT_TIMEOUT_COST);
    cr_expect_eq(b.success_refill, IDEM_RETRY_BUDGET_DEFAULT_SUCCESS_REFILL);
    cr_expect_eq(idem_retry_budget_available(&b), IDEM_RETRY_BUDGET_DEFAULT_CAPACITY);
}

/* ---- backoff ---- */

Test(retry, backoff_first_retry_spans_zero_to_base)
{
    idem_retry_policy_t p = policy(100, 10000, 5, 60000);

    expect_ceiling(&p, 0, 100);
}

Test(retry, backoff_ceiling_doubles_then_stays_at_the_cap)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);

    expect_ceiling(&p, 0, 100);
    expect_ceiling(&p, 1, 200);
    expect_ceiling(&p, 2, 400);
    expect_ceiling(&p, 3, 800);
    expect_ceiling(&p, 4, 1000); /* 1600 capped */
    expect_ceiling(&p, 5, 1000);
    expect_ceiling(&p, 40, 1000);
}

Test(retry, backoff_ceiling_reaching_the_cap_exactly)
{
    idem_retry_policy_t p = policy(125, 1000, 5, 60000);

    expect_ceiling(&p, 3, 1000);
    expect_ceiling(&p, 4, 1000);
}

Test(retry, backoff_huge_attempts_saturate_at_the_cap)
{
    const int64_t L = IDEM_RETRY_MAX_MS_LIMIT;
    idem_retry_policy_t one = policy(1, L, 5, L), top = policy(L, L, 5, L);
    static const unsigned attempts[] = {27, 31, 32, 62, 63, 64, 65, 1000, UINT_MAX - 1, UINT_MAX};
    size_t i;

    expect_ceiling(&one, 26, INT64_C(1) << 26); /* 67108864, below the limit */
    for (i = 0; i < sizeof attempts / sizeof attempts[0]; i++) {
        expect_ceiling(&one, attempts[i], L);
        expect_ceiling(&top, attempts[i], L);
    }
}

Test(retry, backoff_does_not_overflow_past_the_limits)
{
    /* Not a valid policy, but the arithmetic must still hold (UBSan watches). */
    idem_retry_policy_t p = policy(INT64_C(1) << 62, INT64_MAX, 5, 1);

    expect_ceiling(&p, 0, INT64_C(1) << 62);
    cr_expect_eq(backoff_with(&p, 1, INT64_MAX), INT64_MAX);
    cr_expect_eq(backoff_with(&p, UINT_MAX, 0), 0);
}

Test(retry, backoff_with_no_positive_range_is_zero)
{
    idem_retry_policy_t zero = policy(0, 100, 5, 1000), neg = policy(100, -1, 5, 1000);

    cr_expect_eq(idem_retry_backoff(&zero, 0, NULL), 0);
    cr_expect_eq(idem_retry_backoff(&neg, 3, NULL), 0);
    cr_expect_eq(idem_retry_backoff(NULL, 0, NULL), 0);
}

Test(retry, backoff_from_the_kernel_stays_in_range)
{
    idem_retry_policy_t p = policy(10, 80, 5, 1000);
    unsigned attempt;
    int i;

    for (attempt = 0; attempt < 6; attempt++) {
        int64_t ceiling = attempt >= 3 ? 80 : 10 << attempt;

        for (i = 0; i < 500; i++) {
            int64_t d = idem_retry_backoff(&p, attempt, NULL);

            cr_assert(d >= 0 && d <= ceiling, "attempt %u: %lld", attempt, (long long)d);
        }
    }
}

/* ---- Retry-After: seconds ---- */

Test(retry, after_seconds)
{
    cr_expect_eq(after("0", 0), 0);
    cr_expect_eq(after("1", 0), 1000);
    cr_expect_eq(after("120", 0), 120000);
    cr_expect_eq(after("120", NOV_6_1994), 120000, "seconds depend on now");
}

Test(retry, after_seconds_with_leading_zeros)
{
    cr_expect_eq(after("007", 0), 7000);
    cr_expect_eq(after("0000", 0), 0);
    cr_expect_eq(after("000000000000000000000000000000000000000042", 0), 42000);
}

Test(retry, after_seconds_trims_optional_white_space)
{
    cr_expect_eq(after(" 5", 0), 5000);
    cr_expect_eq(after("5 ", 0), 5000);
    cr_expect_eq(after(" \t 5 \t ", 0), 5000);
}

Test(retry, after_seconds_are_clamped_to_a_day)
{
    cr_expect_eq(after("86400", 0), MS(86400));
    cr_expect_eq(after("86401", 0), MS(86400));
    cr_expect_eq(after("9223372036854775807", 0), MS(86400));
    cr_expect_eq(after("9223372036854775808", 0), MS(86400));
    cr_expect_eq(after("99999999999999999999999999999999999999999999999999", 0), MS(86400));
}

Test(retry, after_reads_only_len_bytes)
{
    int64_t d = -1;

    cr_expect_eq(idem_retry_after_parse("120junk", 3, 0, &d), IDEM_OK);
    cr_expect_eq(d, 120000);
    cr_expect_eq(idem_retry_after_parse("Sun, 06 Nov 1994 08:49:37 GMTxyz", 29, 0, &d), IDEM_OK);
    cr_expect_eq(d, NOV_6_1994);
}

Test(retry, after_refuses_what_is_not_a_number_or_a_date)
{
    int64_t d = 7;

    refused("");
    refused(" ");
    refused(" \t ");
    refused("-1");
    refused("+1");
    refused("1.5");
    refused("1 2");
    refused("12a");
    refused("0x10");
    refused("1e3");
    refused("soon");
    refused("5\r");
    cr_expect_eq(idem_retry_after_parse(NULL, 0, 0, &d), IDEM_E_INVAL);
    cr_expect_eq(d, 0);
    cr_expect_eq(idem_retry_after_parse("5", 1, 0, NULL), IDEM_E_INVAL);
}

/* ---- Retry-After: dates ---- */

Test(retry, after_date_in_each_of_the_three_forms)
{
    int64_t now = NOV_6_1994 - 5000;

    cr_expect_eq(after("Sun, 06 Nov 1994 08:49:37 GMT", now), 5000);
    cr_expect_eq(after("Sunday, 06-Nov-94 08:49:37 GMT", now), 5000);
    cr_expect_eq(after("Sun Nov  6 08:49:37 1994", now), 5000);
    cr_expect_eq(after("Sun Nov 06 08:49:37 1994", now), 5000, "asctime 2DIGIT day");
}

Test(retry, after_date_is_epoch_time_computed_exactly)
{
    cr_expect_eq(after("Thu, 01 Jan 1970 00:00:00 GMT", INT64_MIN / 2), -(INT64_MIN / 2));
    cr_expect_eq(after("Thu, 01 Jan 1970 00:00:01 GMT", 0), 1000);
    cr_expect_eq(after("Thu, 29 Feb 2024 00:00:00 GMT", 0), MS(1709164800));
    cr_expect_eq(after("Tue, 29 Feb 2000 13:14:15 GMT", 0), MS(951830055));
    cr_expect_eq(after("Tue, 01 Jan 2030 00:00:00 GMT", 0), MS(1893456000));
    cr_expect_eq(after("Fri, 31 Dec 9999 23:59:59 GMT", 0), MS(253402300799));
    /* A leap second is the second after 59. */
    cr_expect_eq(after("Fri, 31 Dec 9999 23:59:60 GMT", 0), MS(253402300800));
}

Test(retry, after_date_past_or_now_is_no_wait)
{
    cr_expect_eq(after("Sun, 06 Nov 1994 08:49:37 GMT", NOV_6_1994), 0);
    cr_expect_eq(after("Sun, 06 Nov 1994 08:49:37 GMT", NOV_6_1994 + 1), 0);
    cr_expect_eq(after("Sun, 06 Nov 1994 08:49:37 GMT", NOV_6_1994 - 1), 1);
    cr_expect_eq(after("Sun, 06 Nov 1994 08:49:37 GMT", JUN_1_2026), 0);
    cr_expect_eq(after("Sat, 01 Jan 0000 00:00:00 GMT", 0), 0);
}

Test(retry, after_date_far_from_an_extreme_clock_does_not_overflow)
{
    cr_expect_eq(after("Fri, 31 Dec 9999 23:59:59 GMT", INT64_MIN), INT64_MAX);
    cr_expect_eq(after("Fri, 31 Dec 9999 23:59:59 GMT", INT64_MAX), 0);
}

Test(retry, after_date_checks_the_day_of_the_month)
{
    cr_expect_geq(after("Thu, 29 Feb 2024 00:00:00 GMT", 0), 0, "leap year");
    cr_expect_geq(after("Tue, 29 Feb 2000 00:00:00 GMT", 0), 0, "divisible by 400");
    refused("Wed, 29 Feb 2023 00:00:00 GMT");
    refused("Thu, 29 Feb 1900 00:00:00 GMT"); /* divisible by 100 */
    refused("Thu, 30 Feb 2024 00:00:00 GMT");
    refused("Fri, 31 Apr 2026 00:00:00 GMT");
    refused("Mon, 00 Jun 2026 00:00:00 GMT");
    refused("Mon, 32 Jan 2026 00:00:00 GMT");
    refused("Mon Jun  0 00:00:00 2026");
    refused("Wednesday, 29-Feb-23 00:00:00 GMT");
}

Test(retry, after_date_refuses_bad_fields)
{
    refused("Sun, 06 Foo 1994 08:49:37 GMT");  /* no such month */
    refused("Sun, 06 nov 1994 08:49:37 GMT");  /* names are case-sensitive */
    refused("Sun, 06 NOV 1994 08:49:37 GMT");
    refused("sun, 06 Nov 1994 08:49:37 GMT");
    refused("Sux, 06 Nov 1994 08:49:37 GMT");  /* no such day */
    refused("Sun, 06 Nov 1994 24:00:00 GMT");  /* hour 24 */
    refused("Sun, 06 Nov 1994 08:60:37 GMT");
    refused("Sun, 06 Nov 1994 08:49:61 GMT");
    refused("Sun, 06 Nov 1994 8:49:37 GMT");
    refused("Sun, 06 Nov 1994 08:49 GMT");
    refused("Sunday, 06-Nov-94 24:49:37 GMT");
    refused("Sun Nov  6 24:49:37 1994");
    refused("Sun Dez  6 08:49:37 1994");
}

Test(retry, after_date_refuses_a_wrong_zone_or_trailing_junk)
{
    refused("Sun, 06 Nov 1994 08:49:37");      /* GMT missing */
    refused("Sun, 06 Nov 1994 08:49:37 UTC");
    refused("Sun, 06 Nov 1994 08:49:37 gmt");
    refused("Sun, 06 Nov 1994 08:49:37 +0000");
    refused("Sun, 06 Nov 1994 08:49:37 GMT x"); /* trailing junk */
    refused("Sun, 06 Nov 1994 08:49:37 GMTx");
    refused("Sun, 06 Nov 1994 08:49:37 GMT GMT");
    refused("Sunday, 06-Nov-94 08:49:37");
    refused("Sunday, 06-Nov-94 08:49:37 GMT.");
    refused("Sun Nov  6 08:49:37 1994 GMT");
    refused("Sun Nov  6 08:49:37 19945");
    refused("x Sun, 06 Nov 1994 08:49:37 GMT");
}

Test(retry, after_date_refuses_a_mixed_or_loose_form)
{
    refused("Sunday, 06 Nov 1994 08:49:37 GMT"); /* long name in IMF */
    refused("Sun, 06-Nov-94 08:49:37 GMT");      /* short name in RFC 850 */
    refused("Sunday Nov  6 08:49:37 1994");      /* long name in asctime */
    refused("Sun 06 Nov 1994 08:49:37 GMT");     /* comma missing */
    refused("Sun,  06 Nov 1994 08:49:37 GMT");   /* two spaces */
    refused("Sun, 6 Nov 1994 08:49:37 GMT");     /* one-digit day */
    refused("Sun, 06 Nov 94 08:49:37 GMT");      /* two-digit year in IMF */
    refused("Sunday, 06-Nov-1994 08:49:37 GMT"); /* four-digit year in RFC 850 */
    refused("Sun Nov 6 08:49:37 1994");          /* asctime one-digit day without its space */
    refused("Sun Nov   6 08:49:37 1994");
    refused("Sun, 06 Nov 1994 08:49:37  GMT");
    refused("Sun,\t06 Nov 1994 08:49:37 GMT");
}

Test(retry, after_date_accepts_a_weekday_that_disagrees_with_the_date)
{
    /* A choice: the name must be a real one, but the date fields decide. */
    int64_t now = NOV_6_1994 - 5000;

    cr_expect_eq(after("Mon, 06 Nov 1994 08:49:37 GMT", now), 5000);
    cr_expect_eq(after("Friday, 06-Nov-94 08:49:37 GMT", now), 5000);
    cr_expect_eq(after("Wed Nov  6 08:49:37 1994", now), 5000);
}

Test(retry, after_rfc850_year_is_within_fifty_years_of_now)
{
    /* Now is 2026: 30 is 2030, 76 (50 years ahead) is 2076, 77 would be 51
     * years ahead so it is 1977, and 94 is 1994. */
    cr_expect_eq(after("Tuesday, 01-Jan-30 00:00:00 GMT", JUN_1_2026), MS(1893456000) - JUN_1_2026);
    cr_expect_eq(after("Wednesday, 01-Jan-76 00:00:00 GMT", JUN_1_2026),
                 MS(3345062400) - JUN_1_2026);
    cr_expect_eq(after("Saturday, 01-Jan-77 00:00:00 GMT", MS(220924800) - 1000), 1000);
    cr_expect_eq(after("Saturday, 01-Jan-77 00:00:00 GMT", JUN_1_2026), 0);
    cr_expect_eq(after("Monday, 01-Jun-26 00:00:10 GMT", JUN_1_2026), 10000);
    cr_expect_eq(after("Sunday, 06-Nov-94 08:49:37 GMT", JUN_1_2026), 0);
}

Test(retry, after_rfc850_year_far_behind_now_is_the_next_century)
{
    /* Now is 1970: the window is 1921 to 2020, so 20 is 2020 and 21 is 1921. */
    cr_expect_eq(after("Wednesday, 01-Jan-20 00:00:00 GMT", 0), MS(1577836800));
    cr_expect_eq(after("Saturday, 01-Jan-21 00:00:00 GMT", 0), 0, "1921 is past");
    cr_expect_eq(after("Saturday, 01-Jan-21 00:00:00 GMT", MS(-1546300800) - 1000), 1000);
    cr_expect_eq(after("Tuesday, 29-Feb-00 00:00:00 GMT", 0), MS(951782400), "leap 2000");
}

/* ---- one request ---- */

Test(retry, verdict_names)
{
    cr_expect_str_eq(idem_retry_verdict_name(IDEM_RETRY_AGAIN), "again");
    cr_expect_str_eq(idem_retry_verdict_name(IDEM_RETRY_DONE), "done");
    cr_expect_str_eq(idem_retry_verdict_name(IDEM_RETRY_GIVE_UP_ATTEMPTS), "attempts");
    cr_expect_str_eq(idem_retry_verdict_name(IDEM_RETRY_GIVE_UP_DEADLINE), "deadline");
    cr_expect_str_eq(idem_retry_verdict_name(IDEM_RETRY_GIVE_UP_BUDGET), "budget");
    cr_expect_str_eq(idem_retry_verdict_name((idem_retry_verdict_t)99), "unknown");
}

Test(retry, begin_starts_clean)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;

    memset(&r, 0xA5, sizeof r);
    idem_retry_budget_init(&b);
    idem_retry_begin(&r, &p, &b, 1234);
    cr_expect_eq(r.policy, &p);
    cr_expect_eq(r.budget, &b);
    cr_expect_eq(r.start_ms, 1234);
    cr_expect_eq(r.attempts, 0);
    cr_expect_eq(r.spent, 0);
}

Test(retry, sequence_503_503_200)
{
    const uint64_t v[] = {101 + 37, 201 + 150};
    struct seq s = {v, 2, 0};
    idem_rng_t rng = {seq_next, &s};
    idem_retry_policy_t p = policy(100, 10000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t busy = status(503), ok = status(200);
    int64_t d = -1;

    idem_retry_budget_init(&b);
    idem_retry_begin(&r, &p, &b, 1000);

    cr_assert_eq(idem_retry_next(&r, &busy, 1100, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 37, "backoff(0) draws below 101");
    cr_expect_eq(r.attempts, 1);
    cr_expect_eq(r.spent, 5);
    cr_expect_eq(idem_retry_budget_available(&b), 495);

    cr_assert_eq(idem_retry_next(&r, &busy, 1300, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 150, "backoff(1) draws below 201");
    cr_expect_eq(r.attempts, 2);
    cr_expect_eq(r.spent, 10);
    cr_expect_eq(idem_retry_budget_available(&b), 490);

    cr_assert_eq(idem_retry_next(&r, &ok, 1600, &rng, &d), IDEM_RETRY_DONE);
    cr_expect_eq(d, 0);
    cr_expect_eq(r.attempts, 3);
    cr_expect_eq(idem_retry_budget_available(&b), 500, "the retries' tokens come back");
    cr_expect_eq(s.calls, 2, "a final answer draws nothing");
}

Test(retry, success_on_the_first_attempt_adds_the_refill)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t ok = status(201);
    int64_t d;

    budget_set(&b, 500, 5, 10, 3);
    atomic_store(&b.tokens, 400);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &ok, 10, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(idem_retry_budget_available(&b), 403);
}

Test(retry, refill_never_passes_capacity)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t busy = status(503), ok = status(204);
    int64_t d;

    /* A first-attempt success on a full bucket. */
    budget_set(&b, 500, 5, 10, 1);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &ok, 10, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(idem_retry_budget_available(&b), 500);

    /* Giving back 10 when others have already refilled to 495. */
    idem_retry_begin(&r, &p, &b, 0);
    cr_assert_eq(idem_retry_next(&r, &busy, 10, NULL, &d), IDEM_RETRY_AGAIN);
    cr_assert_eq(idem_retry_next(&r, &busy, 20, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_budget_available(&b), 490);
    atomic_store(&b.tokens, 495);
    cr_expect_eq(idem_retry_next(&r, &ok, 30, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(idem_retry_budget_available(&b), 500);
    cr_expect_eq(r.spent, 0);

    /* A second report of the same success gives nothing more back. */
    atomic_store(&b.tokens, 480);
    cr_expect_eq(idem_retry_next(&r, &ok, 40, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(idem_retry_budget_available(&b), 481, "only the success refill");
}

Test(retry, final_answers_that_are_not_2xx_refill_nothing)
{
    static const int codes[] = {101, 304, 400, 404, 409, 422, 501, 505};
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    size_t i;

    budget_set(&b, 500, 5, 10, 1);
    for (i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        idem_attempt_t busy = status(503), last = status(codes[i]);
        int64_t d = -1;

        if (codes[i] == 409)
            last.problem_type = "urn:idem:problem:token-used";
        atomic_store(&b.tokens, 300);
        idem_retry_begin(&r, &p, &b, 0);
        cr_assert_eq(idem_retry_next(&r, &busy, 10, NULL, &d), IDEM_RETRY_AGAIN);
        cr_expect_eq(idem_retry_next(&r, &last, 20, NULL, &d), IDEM_RETRY_DONE, "%d", codes[i]);
        cr_expect_eq(d, 0);
        cr_expect_eq(idem_retry_budget_available(&b), 295, "status %d refilled", codes[i]);
    }
}

Test(retry, attempts_run_out)
{
    idem_retry_policy_t p = policy(100, 1000, 3, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t busy = status(503);
    int64_t d = -1;

    idem_retry_budget_init(&b);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &busy, 10, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_next(&r, &busy, 20, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_next(&r, &busy, 30, NULL, &d), IDEM_RETRY_GIVE_UP_ATTEMPTS);
    cr_expect_eq(d, 0);
    cr_expect_eq(r.attempts, 3);
    cr_expect_eq(idem_retry_budget_available(&b), 490, "giving up takes nothing");
}

Test(retry, one_attempt_allowed_means_no_retry)
{
    idem_retry_policy_t p = policy(100, 1000, 1, 60000);
    idem_retry_t r;
    idem_attempt_t t = transport(IDEM_TRANSPORT_TIMEOUT), ok = status(200);
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(&r, &t, 10, NULL, &d), IDEM_RETRY_GIVE_UP_ATTEMPTS);
    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(&r, &ok, 10, NULL, &d), IDEM_RETRY_DONE);
}

Test(retry, retry_after_replaces_the_backoff)
{
    struct seq s = {NULL, 0, 0};
    idem_rng_t rng = {seq_next, &s};
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r;
    idem_attempt_t secs = with_retry_after(429, "7"), date = status(503);
    int64_t d = -1;

    date.retry_after = "Sun, 06 Nov 1994 08:49:47 GMTjunk";
    date.retry_after_len = 29;
    idem_retry_begin(&r, &p, NULL, NOV_6_1994 - 1000);
    cr_expect_eq(idem_retry_next(&r, &secs, NOV_6_1994, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 7000);
    cr_expect_eq(idem_retry_next(&r, &date, NOV_6_1994, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 10000);
    cr_expect_eq(s.calls, 0, "no jitter drawn");
}

Test(retry, retry_after_in_the_past_means_now)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r;
    idem_attempt_t a = with_retry_after(503, "Sun, 06 Nov 1994 08:49:37 GMT");
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, JUN_1_2026);
    cr_expect_eq(idem_retry_next(&r, &a, JUN_1_2026 + 5, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 0);
}

Test(retry, a_bad_retry_after_falls_back_to_the_backoff)
{
    const uint64_t v[] = {101 + 88};
    struct seq s = {v, 1, 0};
    idem_rng_t rng = {seq_next, &s};
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r;
    idem_attempt_t a = with_retry_after(503, "in a while");
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(&r, &a, 10, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 88);
}

Test(retry, retry_after_past_the_deadline_gives_up)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t far = with_retry_after(503, "120"), edge = with_retry_after(503, "59"),
                   fits = with_retry_after(503, "58");
    int64_t d = -1;

    idem_retry_budget_init(&b);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &far, 1000, NULL, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
    cr_expect_eq(d, 0);
    cr_expect_eq(idem_retry_budget_available(&b), 500, "giving up takes nothing");

    /* Waking exactly at the deadline is too late; a millisecond before is not. */
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &edge, 1000, NULL, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &fits, 1000, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 58000);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &fits, 1999, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 58000);
}

Test(retry, a_date_retry_after_past_the_deadline_gives_up)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r;
    idem_attempt_t a = with_retry_after(503, "Fri, 31 Dec 9999 23:59:59 GMT");
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, JUN_1_2026);
    cr_expect_eq(idem_retry_next(&r, &a, JUN_1_2026 + 10, NULL, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
    idem_retry_begin(&r, &p, NULL, INT64_MIN);
    cr_expect_eq(idem_retry_next(&r, &a, INT64_MIN, NULL, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
}

Test(retry, a_backoff_past_the_deadline_gives_up)
{
    const uint64_t v[] = {100, 101 + 99};
    struct seq s = {v, 2, 0};
    idem_rng_t rng = {seq_next, &s};
    idem_retry_policy_t p = policy(100, 1000, 5, 1000);
    idem_retry_t r;
    idem_attempt_t a = status(502);
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(&r, &a, 900, &rng, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(&r, &a, 900, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 99);
}

Test(retry, a_clock_at_its_end_does_not_overflow)
{
    /* start + deadline is past INT64_MAX: a wait that also goes past it is
     * too late, one that ends before it is not (UBSan watches the sums). */
    const uint64_t v[] = {101};
    struct seq s = {v, 1, 0};
    idem_rng_t rng = {seq_next, &s};
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r;
    idem_attempt_t late = with_retry_after(503, "1"), busy = status(503);
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, INT64_MAX - 10);
    cr_expect_eq(idem_retry_next(&r, &late, INT64_MAX - 5, NULL, &d), IDEM_RETRY_GIVE_UP_DEADLINE);
    idem_retry_begin(&r, &p, NULL, INT64_MAX - 10);
    cr_expect_eq(idem_retry_next(&r, &busy, INT64_MAX - 5, &rng, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(d, 0);
}

Test(retry, timeouts_and_connection_failures_cost_more)
{
    static const idem_transport_t kinds[] = {IDEM_TRANSPORT_TIMEOUT, IDEM_TRANSPORT_CONNECT,
                                             IDEM_TRANSPORT_BROKEN};
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    size_t i;

    budget_set(&b, 100, 5, 10, 1);
    for (i = 0; i < 3; i++) {
        idem_attempt_t a = transport(kinds[i]);
        int64_t d;

        idem_retry_begin(&r, &p, &b, 0);
        cr_expect_eq(idem_retry_next(&r, &a, 10, NULL, &d), IDEM_RETRY_AGAIN);
        cr_expect_eq(r.spent, 10);
        cr_expect_eq(idem_retry_budget_available(&b), 100 - 10 * (int64_t)(i + 1));
    }
}

Test(retry, an_empty_budget_stops_retries)
{
    idem_retry_policy_t p = policy(100, 1000, 10, 60000);
    idem_retry_budget_t b;
    idem_retry_t r, other;
    idem_attempt_t busy = status(503), t = transport(IDEM_TRANSPORT_TIMEOUT);
    int64_t d = -1;

    budget_set(&b, 12, 5, 10, 1);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &busy, 10, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_budget_available(&b), 7);
    cr_expect_eq(idem_retry_next(&r, &t, 20, NULL, &d), IDEM_RETRY_GIVE_UP_BUDGET, "10 > 7");
    cr_expect_eq(d, 0);
    cr_expect_eq(idem_retry_budget_available(&b), 7, "a refused take takes nothing");

    /* The bucket is shared: another request gets what is left, then nothing. */
    idem_retry_begin(&other, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&other, &busy, 10, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_budget_available(&b), 2);
    cr_expect_eq(idem_retry_next(&other, &busy, 20, NULL, &d), IDEM_RETRY_GIVE_UP_BUDGET);
    cr_expect_eq(idem_retry_budget_available(&b), 2);
    cr_expect_eq(other.spent, 5);
}

Test(retry, no_budget_never_runs_dry)
{
    idem_retry_policy_t p = policy(1, 1, 100, 60000);
    idem_retry_t r;
    idem_attempt_t t = transport(IDEM_TRANSPORT_CONNECT), ok = status(200);
    int64_t d;
    int i;

    idem_retry_begin(&r, &p, NULL, 0);
    for (i = 0; i < 99; i++)
        cr_assert_eq(idem_retry_next(&r, &t, i, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_next(&r, &ok, 100, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(r.spent, 0);
}

Test(retry, a_zero_cost_takes_nothing)
{
    idem_retry_policy_t p = policy(1, 1, 5, 60000);
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t busy = status(503);
    int64_t d;

    budget_set(&b, 0, 0, 0, 0);
    idem_retry_begin(&r, &p, &b, 0);
    cr_expect_eq(idem_retry_next(&r, &busy, 1, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect_eq(idem_retry_budget_available(&b), 0);
}

Test(retry, missing_arguments_end_the_request)
{
    idem_retry_policy_t p = policy(100, 1000, 5, 60000);
    idem_retry_t r, unset;
    idem_attempt_t busy = status(503);
    int64_t d = -1;

    idem_retry_begin(&r, &p, NULL, 0);
    cr_expect_eq(idem_retry_next(NULL, &busy, 0, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(d, 0);
    cr_expect_eq(idem_retry_next(&r, NULL, 0, NULL, &d), IDEM_RETRY_DONE);
    idem_retry_begin(&unset, NULL, NULL, 0);
    cr_expect_eq(idem_retry_next(&unset, &busy, 0, NULL, &d), IDEM_RETRY_DONE);
    /* The delay is optional. */
    cr_expect_eq(idem_retry_next(&r, &busy, 0, NULL, NULL), IDEM_RETRY_AGAIN);
    cr_expect_eq(r.attempts, 1);
}

/* ---- the budget under threads ---- */

#define THREADS 8
#define DRAIN_CAPACITY 1000003 /* not a multiple of either cost */

/* The largest number, always: no system call per draw, so the threads spend
 * their time on the bucket, and safe to share (no state). */
static uint64_t top_next(void *ctx)
{
    (void)ctx;
    return UINT64_MAX;
}

static const idem_rng_t top_rng = {top_next, NULL};

struct drain {
    idem_retry_budget_t *budget;
    const idem_retry_policy_t *policy;
    pthread_barrier_t *start;
    int64_t spent;     /* tokens this thread's requests took */
    long retries[2];   /* AGAIN verdicts after a 503, after a timeout */
    int ended;         /* 1 when it stopped on GIVE_UP_BUDGET */
};

/* Requests that fail every attempt, alternating 503 and timeouts, until a
 * 503's retry is refused for want of tokens. */
static void *drain_run(void *arg)
{
    struct drain *w = arg;
    idem_attempt_t kinds[2] = {status(503), transport(IDEM_TRANSPORT_TIMEOUT)};
    long n = 0;

    pthread_barrier_wait(w->start);
    for (;;) {
        idem_retry_t r;
        idem_retry_verdict_t v;
        int k;

        idem_retry_begin(&r, w->policy, w->budget, 0);
        do {
            k = (int)(n++ % 2);
            v = idem_retry_next(&r, &kinds[k], 0, &top_rng, NULL);
            if (v == IDEM_RETRY_AGAIN)
                w->retries[k]++;
        } while (v == IDEM_RETRY_AGAIN);
        w->spent += r.spent;
        if (v == IDEM_RETRY_GIVE_UP_BUDGET && k == 0) {
            w->ended = 1;
            return NULL;
        }
        if (v != IDEM_RETRY_GIVE_UP_ATTEMPTS && v != IDEM_RETRY_GIVE_UP_BUDGET)
            return NULL; /* ended stays 0: the main thread fails the test */
    }
}

/* One round: THREADS threads drain a full bucket of DRAIN_CAPACITY. */
static void drain_round(int round)
{
    idem_retry_policy_t p = policy(1, 1, 7, 60000);
    idem_retry_budget_t b;
    pthread_barrier_t start;
    pthread_t th[THREADS];
    struct drain w[THREADS];
    int64_t spent = 0, counted = 0, left;
    int i;

    budget_set(&b, DRAIN_CAPACITY, 5, 10, 1);
    cr_assert_eq(pthread_barrier_init(&start, NULL, THREADS), 0);
    for (i = 0; i < THREADS; i++) {
        w[i] = (struct drain){&b, &p, &start, 0, {0, 0}, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, drain_run, &w[i]), 0);
    }
    for (i = 0; i < THREADS; i++) {
        cr_assert_eq(pthread_join(th[i], NULL), 0);
        cr_expect_eq(w[i].ended, 1, "round %d: thread %d stopped for another reason", round, i);
        spent += w[i].spent;
        counted += 5 * w[i].retries[0] + 10 * w[i].retries[1];
    }
    pthread_barrier_destroy(&start);
    left = idem_retry_budget_available(&b);
    cr_expect_eq(spent, counted, "round %d: spent %lld, retries were worth %lld", round,
                 (long long)spent, (long long)counted);
    cr_expect(left >= 0 && left < 5, "round %d: %lld tokens left", round, (long long)left);
    cr_assert_eq(spent + left, DRAIN_CAPACITY, "round %d: %lld tokens taken twice", round,
                 (long long)(spent + left - DRAIN_CAPACITY));
}

Test(retry, threads_draining_one_budget_never_take_more_than_it_holds)
{
    /* A race shows up in most rounds when there is one; ten make it certain. */
    int round;

    for (round = 0; round < 10; round++)
        drain_round(round);
}

struct churn {
    idem_retry_budget_t *budget;
    const idem_retry_policy_t *policy;
    pthread_barrier_t *start;
    int64_t max_seen; /* the most tokens this thread saw */
    int bad;          /* a verdict other than the expected ones */
};

/* Requests that retry once then succeed, and first-attempt successes, on a
 * nearly full bucket: every token goes back, and the refills push at the
 * capacity from all sides. */
static void *churn_run(void *arg)
{
    struct churn *w = arg;
    idem_attempt_t busy = status(503), ok = status(200);
    int i;

    pthread_barrier_wait(w->start);
    for (i = 0; i < 100000; i++) {
        idem_retry_t r;
        idem_retry_verdict_t v;
        int64_t seen;

        idem_retry_begin(&r, w->policy, w->budget, 0);
        if (i % 2 == 0) {
            v = idem_retry_next(&r, &busy, 0, &top_rng, NULL);
            if (v != IDEM_RETRY_AGAIN && v != IDEM_RETRY_GIVE_UP_BUDGET)
                w->bad = 1;
        }
        if (idem_retry_next(&r, &ok, 0, &top_rng, NULL) != IDEM_RETRY_DONE)
            w->bad = 1;
        seen = idem_retry_budget_available(w->budget);
        if (seen > w->max_seen)
            w->max_seen = seen;
    }
    return NULL;
}

Test(retry, threads_refilling_one_budget_never_pass_its_capacity)
{
    idem_retry_policy_t p = policy(1, 1, 5, 60000);
    idem_retry_budget_t b;
    pthread_barrier_t start;
    pthread_t th[THREADS];
    struct churn w[THREADS];
    int i;

    budget_set(&b, 40, 5, 10, 3);
    cr_assert_eq(pthread_barrier_init(&start, NULL, THREADS), 0);
    for (i = 0; i < THREADS; i++) {
        w[i] = (struct churn){&b, &p, &start, 0, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, churn_run, &w[i]), 0);
    }
    for (i = 0; i < THREADS; i++) {
        cr_assert_eq(pthread_join(th[i], NULL), 0);
        cr_expect_eq(w[i].bad, 0, "thread %d saw an unexpected verdict", i);
        cr_expect_leq(w[i].max_seen, 40, "thread %d saw %lld tokens", i,
                      (long long)w[i].max_seen);
    }
    pthread_barrier_destroy(&start);
    cr_expect_eq(idem_retry_budget_available(&b), 40, "every token came back");
}

struct pair {
    idem_retry_budget_t *budget;
    const idem_retry_policy_t *policy;
    pthread_barrier_t *start;
    int bad; /* a verdict other than AGAIN then DONE */
};

/* Requests that retry once and then succeed: each takes 5 and gives 5 back. */
static void *pair_run(void *arg)
{
    struct pair *w = arg;
    idem_attempt_t busy = status(503), ok = status(200);
    int i;

    pthread_barrier_wait(w->start);
    for (i = 0; i < 300000; i++) {
        idem_retry_t r;

        idem_retry_begin(&r, w->policy, w->budget, 0);
        if (idem_retry_next(&r, &busy, 0, &top_rng, NULL) != IDEM_RETRY_AGAIN ||
            idem_retry_next(&r, &ok, 0, &top_rng, NULL) != IDEM_RETRY_DONE)
            w->bad = 1;
    }
    return NULL;
}

Test(retry, threads_taking_and_giving_back_lose_no_tokens)
{
    /* The bucket never reaches its capacity while a take is out, so no
     * give-back is cut short: a lost update in either direction shows. */
    idem_retry_policy_t p = policy(1, 1, 5, 60000);
    idem_retry_budget_t b;
    pthread_barrier_t start;
    pthread_t th[THREADS];
    struct pair w[THREADS];
    int i;

    budget_set(&b, 1000000, 5, 10, 0);
    cr_assert_eq(pthread_barrier_init(&start, NULL, THREADS), 0);
    for (i = 0; i < THREADS; i++) {
        w[i] = (struct pair){&b, &p, &start, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, pair_run, &w[i]), 0);
    }
    for (i = 0; i < THREADS; i++) {
        cr_assert_eq(pthread_join(th[i], NULL), 0);
        cr_expect_eq(w[i].bad, 0, "thread %d saw an unexpected verdict", i);
    }
    pthread_barrier_destroy(&start);
    cr_expect_eq(idem_retry_budget_available(&b), 1000000);
}
