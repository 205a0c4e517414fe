/* src/core/retry.c - the retry policy: what to retry, how long to wait, when to stop.
 *
 * Every decision is a function of what the caller passes in (the attempt's
 * outcome, the time, a random source) and of the shared budget, so tests
 * drive it with made-up clocks and numbers.  The choices the header leaves
 * open are made here:
 *
 * - Classification.  A status is retried only when it is one of 408, 409,
 *   425, 429, 500, 502, 503, 504.  A 409 is retried when it carries no
 *   problem type or exactly "urn:idem:problem:in-flight" (compared byte for
 *   byte, as idem writes it).  A transport value outside the enum is not
 *   retried: what is not understood is not repeated.
 *
 * - Retry-After.  Optional white space (SP, HTAB) around the value is
 *   trimmed; nothing else is.  delta-seconds is one or more ASCII digits and
 *   nothing else (no sign, no fraction, no inner space); leading zeros are
 *   fine, and any number of digits is read without overflow, clamped to
 *   IDEM_RETRY_AFTER_MAX_S.  A date is one of the three forms of RFC 9110
 *   section 5.6.7, case-sensitive as the grammar is, with single spaces where
 *   the grammar has them, a day of the month that exists in that month and
 *   year, hours 00-23, minutes 00-59, seconds 00-60 (a leap second counts as
 *   the next second).  The weekday must be a valid name of the form's kind
 *   (Sun or Sunday) but need not agree with the date: the date fields say
 *   when, the name is redundant, and RFC 9110 asks recipients to be robust.
 *   An RFC 850 two-digit year is the year with those last two digits from
 *   49 years before the current year (now_ms's) to 50 years after it: one
 *   more than 50 years ahead is the most recent such year in the past, as
 *   RFC 9110 asks, and one 50 or more years back is taken in the next
 *   century (the RFC does not say; a server that still writes RFC 850
 *   dates means a time near now either way).  Epoch seconds are computed
 *   here from the civil date (proleptic Gregorian, no locale, no time
 *   zone).  A date's delay is not clamped: idem_retry_next compares it with
 *   the deadline without overflow.
 *
 * - Backoff.  The draw is idem_rng_below(ceiling + 1), so both 0 and the
 *   ceiling are possible; the ceiling is found by comparing base with
 *   cap >> attempt, which never overflows, so any attempt up to UINT_MAX
 *   simply reaches the cap.
 *
 * - idem_retry_next.  A Retry-After that does not parse is ignored and the
 *   backoff used instead.  A wait that would end at or after start +
 *   deadline gives up ("no attempt starts this long after the first").  The
 *   budget is charged only when the verdict is AGAIN: a request that gives
 *   up for attempts or the deadline takes nothing.  A 2xx that ends the
 *   request gives back what the request took (its `spent`, then zeroed so a
 *   repeated report gives back nothing more) or, when it took nothing, adds
 *   success_refill; the bucket never passes its capacity.  A 1xx or 3xx
 *   answer is final but refills nothing.  NULL r, a or policy give DONE:
 *   the caller keeps what it has and sends nothing more.
 *
 * THREADING: an idem_retry_t is used by one thread at a time; a budget's
 * tokens change only by compare-and-exchange, so any number of threads may
 * share it and the tokens never go below zero or above capacity.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "idem/retry.h"

#define IN_FLIGHT_TYPE "urn:idem:problem:in-flight"
#define MS_PER_DAY INT64_C(86400000)

/* ---- policy and budget ---- */

void idem_retry_policy_init(idem_retry_policy_t *p)
{
    p->base_ms = IDEM_RETRY_DEFAULT_BASE_MS;
    p->cap_ms = IDEM_RETRY_DEFAULT_CAP_MS;
    p->max_attempts = IDEM_RETRY_DEFAULT_MAX_ATTEMPTS;
    p->deadline_ms = IDEM_RETRY_DEFAULT_DEADLINE_MS;
}

/* "field: must be LOW to HIGH" in errbuf. */
static idem_err_t out_of_range(char *errbuf, size_t errlen, const char *field, const char *low,
                               int64_t high)
{
    if (errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen, "%s: must be %s to %" PRId64, field, low, high);
    return IDEM_E_INVAL;
}

idem_err_t idem_retry_policy_check(const idem_retry_policy_t *p, char *errbuf, size_t errlen)
{
    if (errbuf != NULL && errlen > 0)
        errbuf[0] = '\0';
    if (p == NULL) {
        if (errbuf != NULL && errlen > 0)
            snprintf(errbuf, errlen, "policy: missing");
        return IDEM_E_INVAL;
    }
    if (p->base_ms <= 0 || p->base_ms > IDEM_RETRY_MAX_MS_LIMIT)
        return out_of_range(errbuf, errlen, "base_ms", "1", IDEM_RETRY_MAX_MS_LIMIT);
    if (p->cap_ms < p->base_ms || p->cap_ms > IDEM_RETRY_MAX_MS_LIMIT)
        return out_of_range(errbuf, errlen, "cap_ms", "base_ms", IDEM_RETRY_MAX_MS_LIMIT);
    if (p->deadline_ms <= 0 || p->deadline_ms > IDEM_RETRY_MAX_MS_LIMIT)
        return out_of_range(errbuf, errlen, "deadline_ms", "1", IDEM_RETRY_MAX_MS_LIMIT);
    if (p->max_attempts < 1 || p->max_attempts > IDEM_RETRY_MAX_ATTEMPTS_LIMIT)
        return out_of_range(errbuf, errlen, "max_attempts", "1", IDEM_RETRY_MAX_ATTEMPTS_LIMIT);
    return IDEM_OK;
}

void idem_retry_budget_init(idem_retry_budget_t *b)
{
    b->capacity = IDEM_RETRY_BUDGET_DEFAULT_CAPACITY;
    b->retry_cost = IDEM_RETRY_BUDGET_DEFAULT_RETRY_COST;
    b->timeout_cost = IDEM_RETRY_BUDGET_DEFAULT_TIMEOUT_COST;
    b->success_refill = IDEM_RETRY_BUDGET_DEFAULT_SUCCESS_REFILL;
    atomic_init(&b->tokens, b->capacity);
}

int64_t idem_retry_budget_available(const idem_retry_budget_t *b)
{
    return atomic_load(&b->tokens);
}

/* Take cost tokens if that many are left. */
static bool budget_take(idem_retry_budget_t *b, int64_t cost)
{
    int64_t cur = atomic_load(&b->tokens);

    do {
        if (cur < cost)
            return false;
    } while (!atomic_compare_exchange_weak(&b->tokens, &cur, cur - cost));
    return true;
}

/* Add n tokens (n > 0), stopping at capacity; a bucket already at or above
 * capacity is left as it is. */
static void budget_give(idem_retry_budget_t *b, int64_t n)
{
    int64_t cur = atomic_load(&b->tokens), next;

    do {
        if (cur >= b->capacity)
            return;
        next = n > b->capacity - cur ? b->capacity : cur + n;
    } while (!atomic_compare_exchange_weak(&b->tokens, &cur, next));
}

/* ---- classification ---- */

bool idem_retry_retryable(const idem_attempt_t *a)
{
    if (a == NULL)
        return false;
    switch (a->transport) {
    case IDEM_TRANSPORT_CONNECT:
    case IDEM_TRANSPORT_TIMEOUT:
    case IDEM_TRANSPORT_BROKEN:
        return true;
    case IDEM_TRANSPORT_OK:
        break;
    default:
        return false;
    }
    switch (a->status) {
    case 408:
    case 425:
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
        return true;
    case 409:
        return a->problem_type == NULL || strcmp(a->problem_type, IN_FLIGHT_TYPE) == 0;
    default:
        return false;
    }
}

/* ---- Retry-After ---- */

/* A read position in a value that is not NUL-terminated. */
struct cursor {
    const char *s;
    size_t len, at;
};

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Exactly the bytes of lit. */
static bool take_lit(struct cursor *c, const char *lit)
{
    size_t n = strlen(lit);

    if (c->len - c->at < n || memcmp(c->s + c->at, lit, n) != 0)
        return false;
    c->at += n;
    return true;
}

/* Exactly n digits (n <= 4), their value in *v. */
static bool take_digits(struct cursor *c, size_t n, int *v)
{
    size_t i;

    if (c->len - c->at < n)
        return false;
    *v = 0;
    for (i = 0; i < n; i++) {
        char d = c->s[c->at + i];

        if (!is_digit(d))
            return false;
        *v = *v * 10 + (d - '0');
    }
    c->at += n;
    return true;
}

/* One of the count names, its index in *idx. */
static bool take_name(struct cursor *c, const char *const *names, int count, int *idx)
{
    int i;

    for (i = 0; i < count; i++) {
        if (take_lit(c, names[i])) {
            *idx = i;
            return true;
        }
    }
    return false;
}

static const char *const short_days[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
static const char *const long_days[] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                        "Friday", "Saturday", "Sunday"};
static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static bool take_month(struct cursor *c, int *month)
{
    int i;

    if (!take_name(c, months, 12, &i))
        return false;
    *month = i + 1;
    return true;
}

/* "HH:MM:SS", each field in range. */
static bool take_time(struct cursor *c, int *h, int *m, int *s)
{
    return take_digits(c, 2, h) && *h <= 23 && take_lit(c, ":") && take_digits(c, 2, m) &&
           *m <= 59 && take_lit(c, ":") && take_digits(c, 2, s) && *s <= 60;
}

static bool leap_year(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int month_days(int y, int m)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

    return m == 2 && leap_year(y) ? 29 : days[m - 1];
}

/* Days from 1 January of year 0 (proleptic Gregorian) to 1 January of year
 * y >= 0: 365 a year plus one for each leap year before y,
 * which are the multiples of 4 in [0, y) less the multiples of 100 plus the
 * multiples of 400, and [0, y) holds ceil(y / k) multiples of k. */
static int64_t days_before_year(int64_t y)
{
    return 365 * y + (y + 3) / 4 - (y + 99) / 100 + (y + 399) / 400;
}

/* Days from 1970-01-01 to y-m-d (a valid date, year 0 to 9999). */
static int64_t days_from_civil(int y, int m, int d)
{
    static const int before_month[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int64_t days = days_before_year(y) - days_before_year(1970) + before_month[m - 1] + d - 1;

    if (m > 2 && leap_year(y))
        days++;
    return days;
}

/* The year (clamped to 0..9999) that holds the instant now_ms. */
static int year_of(int64_t now_ms)
{
    int64_t days = now_ms / MS_PER_DAY, y;

    if (now_ms % MS_PER_DAY < 0)
        days--;
    if (days < -days_before_year(1970))
        return 0;
    if (days >= days_before_year(10000) - days_before_year(1970))
        return 9999;
    /* An estimate from the mean Gregorian year, then corrected. */
    y = 1970 + days * 400 / 146097;
    if (y < 0)
        y = 0;
    if (y > 9999)
        y = 9999;
    while (y > 0 && days_before_year(y) - days_before_year(1970) > days)
        y--;
    while (y < 9999 && days_before_year(y + 1) - days_before_year(1970) <= days)
        y++;
    return (int)y;
}

/* The fields of a date, before they are checked against each other. */
struct date {
    int year, month, day, hour, min, sec;
};

/* "Sun, 06 Nov 1994 08:49:37 GMT", after the day name. */
static bool parse_imf(struct cursor *c, struct date *t)
{
    return take_lit(c, ", ") && take_digits(c, 2, &t->day) && take_lit(c, " ") &&
           take_month(c, &t->month) && take_lit(c, " ") && take_digits(c, 4, &t->year) &&
           take_lit(c, " ") && take_time(c, &t->hour, &t->min, &t->sec) && take_lit(c, " GMT");
}

/* "Sunday, 06-Nov-94 08:49:37 GMT", after the day name. */
static bool parse_rfc850(struct cursor *c, int64_t now_ms, struct date *t)
{
    int yy, now_year;

    if (!(take_lit(c, ", ") && take_digits(c, 2, &t->day) && take_lit(c, "-") &&
          take_month(c, &t->month) && take_lit(c, "-") && take_digits(c, 2, &yy) &&
          take_lit(c, " ") && take_time(c, &t->hour, &t->min, &t->sec) && take_lit(c, " GMT")))
        return false;
    now_year = year_of(now_ms);
    t->year = now_year - now_year % 100 + yy;
    if (t->year > now_year + 50)
        t->year -= 100;
    else if (t->year <= now_year - 50)
        t->year += 100;
    return t->year >= 0;
}

/* "Sun Nov  6 08:49:37 1994", after the day name. */
static bool parse_asctime(struct cursor *c, struct date *t)
{
    if (!(take_lit(c, " ") && take_month(c, &t->month) && take_lit(c, " ")))
        return false;
    /* The day is two digits, or a space and one digit ("Nov  6"). */
    if (take_lit(c, " ")) {
        if (!take_digits(c, 1, &t->day))
            return false;
    } else if (!take_digits(c, 2, &t->day)) {
        return false;
    }
    return take_lit(c, " ") && take_time(c, &t->hour, &t->min, &t->sec) && take_lit(c, " ") &&
           take_digits(c, 4, &t->year);
}

/* An HTTP-date as milliseconds since the epoch. */
static bool parse_date(struct cursor *c, int64_t now_ms, int64_t *date_ms)
{
    struct date t;
    int wday;
    bool ok;
    int64_t secs;

    if (take_name(c, long_days, 7, &wday))
        ok = parse_rfc850(c, now_ms, &t);
    else if (take_name(c, short_days, 7, &wday))
        ok = c->at < c->len && c->s[c->at] == ',' ? parse_imf(c, &t) : parse_asctime(c, &t);
    else
        return false;
    if (!ok || c->at != c->len)
        return false;
    if (t.day < 1 || t.day > month_days(t.year, t.month))
        return false;
    secs = days_from_civil(t.year, t.month, t.day) * 86400 + t.hour * 3600 + t.min * 60 + t.sec;
    *date_ms = secs * 1000;
    return true;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

idem_err_t idem_retry_after_parse(const char *value, size_t len, int64_t now_ms, int64_t *delay_ms)
{
    struct cursor c;
    int64_t date_ms;

    if (delay_ms == NULL)
        return IDEM_E_INVAL;
    *delay_ms = 0;
    if (value == NULL)
        return IDEM_E_INVAL;
    while (len > 0 && is_ows(value[len - 1]))
        len--;
    while (len > 0 && is_ows(value[0])) {
        value++;
        len--;
    }
    if (len == 0)
        return IDEM_E_INVAL;

    if (is_digit(value[0])) {
        int64_t secs = 0;
        size_t i;

        for (i = 0; i < len; i++) {
            if (!is_digit(value[i]))
                return IDEM_E_INVAL;
            /* Past the maximum the value only needs to stay past it. */
            if (secs <= IDEM_RETRY_AFTER_MAX_S)
                secs = secs * 10 + (value[i] - '0');
        }
        if (secs > IDEM_RETRY_AFTER_MAX_S)
            secs = IDEM_RETRY_AFTER_MAX_S;
        *delay_ms = secs * 1000;
        return IDEM_OK;
    }

    c.s = value;
    c.len = len;
    c.at = 0;
    if (!parse_date(&c, now_ms, &date_ms))
        return IDEM_E_INVAL;
    /* date_ms is within a few 10^14 of zero, so only a now_ms near INT64_MIN
     * can make the difference overflow, and only when date_ms is positive
     * (date_ms - INT64_MAX does not overflow then). */
    if (now_ms >= date_ms)
        *delay_ms = 0;
    else if (date_ms > 0 && now_ms < date_ms - INT64_MAX)
        *delay_ms = INT64_MAX;
    else
        *delay_ms = date_ms - now_ms;
    return IDEM_OK;
}

/* ---- backoff ---- */

int64_t idem_retry_backoff(const idem_retry_policy_t *p, unsigned attempt, const idem_rng_t *rng)
{
    int64_t ceiling;

    if (p == NULL || p->base_ms <= 0 || p->cap_ms <= 0)
        return 0;
    /* base * 2^attempt > cap exactly when base > cap / 2^attempt (integer
     * division), and past 62 doublings any positive base is above any cap. */
    if (attempt >= 63 || p->base_ms > (p->cap_ms >> attempt))
        ceiling = p->cap_ms;
    else
        ceiling = p->base_ms << attempt;
    return (int64_t)idem_rng_below(rng, (uint64_t)ceiling + 1);
}

/* ---- one request ---- */

void idem_retry_begin(idem_retry_t *r, const idem_retry_policy_t *policy,
                      idem_retry_budget_t *budget, int64_t now_ms)
{
    r->policy = policy;
    r->budget = budget;
    r->start_ms = now_ms;
    r->attempts = 0;
    r->spent = 0;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

idem_retry_verdict_t idem_retry_next(idem_retry_t *r, const idem_attempt_t *a, int64_t now_ms,
                                     const idem_rng_t *rng, int64_t *delay_ms)
{
    const idem_retry_policy_t *p;
    int64_t delay, cost;

    if (delay_ms != NULL)
        *delay_ms = 0;
    if (r == NULL || a == NULL || r->policy == NULL)
        return IDEM_RETRY_DONE;
    p = r->policy;
    if (r->attempts < UINT_MAX)
        r->attempts++;

    if (!idem_retry_retryable(a)) {
        if (a->transport == IDEM_TRANSPORT_OK && a->status >= 200 && a->status <= 299 &&
            r->budget != NULL) {
            int64_t back = r->spent > 0 ? r->spent : r->budget->success_refill;

            r->spent = 0;
            if (back > 0)
                budget_give(r->budget, back);
        }
        return IDEM_RETRY_DONE;
    }
    if (r->attempts >= p->max_attempts)
        return IDEM_RETRY_GIVE_UP_ATTEMPTS;

    if (a->retry_after == NULL ||
        idem_retry_after_parse(a->retry_after, a->retry_after_len, now_ms, &delay) != IDEM_OK)
        delay = idem_retry_backoff(p, r->attempts - 1, rng);
    if (sat_add(now_ms, delay) >= sat_add(r->start_ms, p->deadline_ms))
        return IDEM_RETRY_GIVE_UP_DEADLINE;

    if (r->budget != NULL) {
        cost = a->transport == IDEM_TRANSPORT_OK ? r->budget->retry_cost : r->budget->timeout_cost;
        if (cost > 0) {
            if (!budget_take(r->budget, cost))
                return IDEM_RETRY_GIVE_UP_BUDGET;
            r->spent = sat_add(r->spent, cost);
        }
    }
    if (delay_ms != NULL)
        *delay_ms = delay;
    return IDEM_RETRY_AGAIN;
}

const char *idem_retry_verdict_name(idem_retry_verdict_t v)
{
    switch (v) {
    case IDEM_RETRY_AGAIN:
        return "again";
    case IDEM_RETRY_DONE:
        return "done";
    case IDEM_RETRY_GIVE_UP_ATTEMPTS:
        return "attempts";
    case IDEM_RETRY_GIVE_UP_DEADLINE:
        return "deadline";
    case IDEM_RETRY_GIVE_UP_BUDGET:
        return "budget";
    }
    return "unknown";
}
