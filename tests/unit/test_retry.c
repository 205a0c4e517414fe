/* tests/unit/test_retry.c - the retry policy (src/core/retry.c). */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/retry.h"

Test(retry, sequence_503_503_200)
{
    idem_retry_policy_t p;
    idem_retry_budget_t b;
    idem_retry_t r;
    idem_attempt_t a = {IDEM_TRANSPORT_OK, 503, NULL, 0, NULL};
    int64_t d;

    idem_retry_policy_init(&p);
    idem_retry_budget_init(&b);
    idem_retry_begin(&r, &p, &b, 1000);
    cr_assert_eq(idem_retry_next(&r, &a, 1100, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect(d >= 0 && d <= 200);
    cr_assert_eq(idem_retry_next(&r, &a, 1500, NULL, &d), IDEM_RETRY_AGAIN);
    cr_expect(d >= 0 && d <= 400);
    cr_expect_eq(idem_retry_budget_available(&b), 490);
    a.status = 200;
    cr_assert_eq(idem_retry_next(&r, &a, 2000, NULL, &d), IDEM_RETRY_DONE);
    cr_expect_eq(idem_retry_budget_available(&b), 500);
}
