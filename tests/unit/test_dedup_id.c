/* tests/unit/test_dedup_id.c - the identity of a message id and the verdict
 * of a decision (src/core/dedup_id.c), shared by both de-duplication forms. */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/dedup.h"

Test(dedup_id, names_the_record_dedup_ns_and_the_id)
{
    idem_key_id_t id;
    cr_assert_eq(idem_dedup_id("payments", "pay-1", 5, &id), IDEM_OK);
    cr_expect_str_eq(id.scope, "dedup:payments");
    cr_expect_str_eq(id.key, "pay-1");
    /* The length is the caller's: the id need not be NUL-terminated. */
    cr_assert_eq(idem_dedup_id("q", "abcdef", 3, &id), IDEM_OK);
    cr_expect_str_eq(id.key, "abc");
}

Test(dedup_id, refuses_bad_namespaces)
{
    idem_key_id_t id;
    char longest[IDEM_DEDUP_NS_MAX + 2];
    memset(longest, 'n', sizeof longest);
    longest[IDEM_DEDUP_NS_MAX] = '\0';
    cr_expect_eq(idem_dedup_id(longest, "m", 1, &id), IDEM_OK);
    longest[IDEM_DEDUP_NS_MAX] = 'n';
    longest[IDEM_DEDUP_NS_MAX + 1] = '\0';
    cr_expect_eq(idem_dedup_id(longest, "m", 1, &id), IDEM_E_INVAL);
    cr_expect_str_eq(id.scope, "");
    const char *bad[] = {"", "a:b", "a b", "a/b", "\xc3\xa9", "a\tb"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(idem_dedup_id(bad[i], "m", 1, &id), IDEM_E_INVAL, "ns %zu", i);
    cr_expect_eq(idem_dedup_id(NULL, "m", 1, &id), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_id("Aa0_.-", "m", 1, &id), IDEM_OK);
}

Test(dedup_id, ids_are_1_to_255_bytes_of_utf8_without_nul)
{
    idem_key_id_t id;
    char big[IDEM_KEY_MAX + 1];
    memset(big, 'x', sizeof big);
    cr_expect_eq(idem_dedup_id("q", big, IDEM_KEY_MAX, &id), IDEM_OK);
    cr_expect_eq(strlen(id.key), (size_t)IDEM_KEY_MAX);
    cr_expect_eq(idem_dedup_id("q", big, IDEM_KEY_MAX + 1, &id), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_id("q", big, 0, &id), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_id("q", "a\0b", 3, &id), IDEM_E_INVAL);
    cr_expect_eq(idem_dedup_id("q", NULL, 1, &id), IDEM_E_INVAL);
    /* Well-formed UTF-8 of every length is taken. */
    const char *good = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x92\xb8";
    cr_expect_eq(idem_dedup_id("q", good, strlen(good), &id), IDEM_OK);
    /* Not UTF-8: a stray continuation, an overlong form, a surrogate, past
     * U+10FFFF, a cut sequence. */
    const char *bad[] = {"\x80", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(idem_dedup_id("q", bad[i], strlen(bad[i]), &id), IDEM_E_INVAL, "id %zu", i);
}

Test(dedup_id, a_decision_reads_as_a_verdict)
{
    idem_dedup_claim_t c;
    idem_decision_t d = {.kind = IDEM_DECIDE_CLAIM, .fence = 1};
    cr_assert_eq(idem_dedup_verdict(&d, &c), IDEM_OK);
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_expect_eq(c.fence, 1);
    d = (idem_decision_t){.kind = IDEM_DECIDE_TAKEOVER, .fence = 4};
    cr_assert_eq(idem_dedup_verdict(&d, &c), IDEM_OK);
    cr_expect_eq(c.verdict, IDEM_DEDUP_NEW);
    cr_expect_eq(c.fence, 4);
    d = (idem_decision_t){.kind = IDEM_DECIDE_REPLAY, .fence = 4};
    cr_assert_eq(idem_dedup_verdict(&d, &c), IDEM_OK);
    cr_expect_eq(c.verdict, IDEM_DEDUP_DUPLICATE);
    cr_expect_eq(c.fence, 0);
    d = (idem_decision_t){.kind = IDEM_DECIDE_IN_FLIGHT, .fence = 2, .retry_after_s = 3};
    cr_assert_eq(idem_dedup_verdict(&d, &c), IDEM_OK);
    cr_expect_eq(c.verdict, IDEM_DEDUP_IN_PROGRESS);
    cr_expect_eq(c.retry_after_ms, 3000);
    d = (idem_decision_t){.kind = IDEM_DECIDE_MISMATCH, .fence = 2};
    cr_expect_eq(idem_dedup_verdict(&d, &c), IDEM_E_CORRUPT);
}
