/* tests/unit/test_engine.c - the decision of src/core/engine.c, rule by rule.
 *
 * Each test builds the record a store would hold and checks the decision,
 * including the order of the rules (expiry before mismatch, held before the
 * lease, ...) and the edges of every time comparison.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "idem/engine.h"

#define NOW 1700000000000ll

static uint8_t fp_a[IDEM_FP_LEN], fp_b[IDEM_FP_LEN];

static void init_fps(void)
{
    memset(fp_a, 0xAA, sizeof fp_a);
    memset(fp_b, 0xAA, sizeof fp_b);
    fp_b[31] = 0xAB; /* differs in the last byte only */
}

TestSuite(engine, .init = init_fps);

static idem_record_t rec(idem_state_t state, uint32_t flags, uint64_t fence, int64_t lease,
                         int64_t expires)
{
    idem_record_t r = {.state = state, .flags = flags, .fence = fence,
                       .lease_until_ms = lease, .expires_at_ms = expires};
    memcpy(r.fingerprint, fp_a, IDEM_FP_LEN);
    return r;
}

static idem_record_t live(uint64_t fence, int64_t lease_ms_left)
{
    return rec(IDEM_STATE_IN_PROGRESS, 0, fence, NOW + lease_ms_left, NOW + 86400000);
}

Test(engine, no_record_claims_with_fence_1)
{
    idem_decision_t d = idem_decide(NULL, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 1);
}

Test(engine, record_at_its_expiry_claims_with_next_fence)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 4, 0, NOW);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 5);
}

Test(engine, record_one_ms_before_expiry_is_still_there)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 4, 0, NOW + 1);
    cr_expect_eq(idem_decide(&r, fp_a, NOW).kind, IDEM_DECIDE_REPLAY);
}

Test(engine, expiry_comes_before_mismatch)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 2, 0, NOW - 1);
    idem_decision_t d = idem_decide(&r, fp_b, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_CLAIM);
    cr_expect_eq(d.fence, 3);
}

Test(engine, other_fingerprint_on_completed_is_mismatch)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 2, 0, NOW + 1000);
    idem_decision_t d = idem_decide(&r, fp_b, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_MISMATCH);
    cr_expect_eq(d.fence, 2);
}

Test(engine, other_fingerprint_in_flight_is_mismatch)
{
    idem_record_t r = live(1, 5000);
    cr_expect_eq(idem_decide(&r, fp_b, NOW).kind, IDEM_DECIDE_MISMATCH);
}

Test(engine, other_fingerprint_with_expired_lease_is_mismatch_not_takeover)
{
    idem_record_t r = live(1, -5000);
    cr_expect_eq(idem_decide(&r, fp_b, NOW).kind, IDEM_DECIDE_MISMATCH);
}

Test(engine, held_is_in_flight_unknown_until_retention)
{
    idem_record_t r = rec(IDEM_STATE_IN_PROGRESS, IDEM_REC_HELD, 3, NOW + 10500, NOW + 10500);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT_UNKNOWN);
    cr_expect_eq(d.fence, 3);
    cr_expect_eq(d.retry_after_s, 11); /* 10.5 s rounded up */
}

Test(engine, held_past_its_lease_is_reconciled_never_taken_over)
{
    /* A held record's lease has run out (its asker is gone): the claim
     * takes the lease to ask again, and never forwards. */
    idem_record_t r = rec(IDEM_STATE_IN_PROGRESS, IDEM_REC_HELD, 3, NOW - 60000, NOW + 1000);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_RECONCILE);
    cr_expect_eq(d.fence, 4);
    cr_expect_eq(d.retry_after_s, 1); /* until the hold's retention ends */
    cr_expect_not(idem_decision_forwards(d.kind));
    cr_expect_str_eq(idem_decision_name(d.kind), "reconcile");
}

Test(engine, held_with_lease_until_retention_stays_in_flight_unknown)
{
    /* on_unknown_outcome: hold leases the key until its retention ends. */
    idem_record_t r = rec(IDEM_STATE_IN_PROGRESS, IDEM_REC_HELD, 3, NOW + 5000, NOW + 5000);
    cr_expect_eq(idem_decide(&r, fp_a, NOW).kind, IDEM_DECIDE_IN_FLIGHT_UNKNOWN);
}

Test(engine, live_lease_is_in_flight_with_record_fence)
{
    idem_record_t r = live(2, 30000);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(d.fence, 2);
    cr_expect_eq(d.retry_after_s, 30);
}

Test(engine, retry_after_rounds_up)
{
    idem_record_t r = live(1, 1001);
    cr_expect_eq(idem_decide(&r, fp_a, NOW).retry_after_s, 2);
}

Test(engine, retry_after_of_exact_second_is_that_second)
{
    idem_record_t r = live(1, 1000);
    cr_expect_eq(idem_decide(&r, fp_a, NOW).retry_after_s, 1);
}

Test(engine, retry_after_is_at_least_1)
{
    idem_record_t r = live(1, 1);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_eq(d.retry_after_s, 1);
}

Test(engine, retry_after_of_far_lease_does_not_overflow)
{
    idem_record_t r = rec(IDEM_STATE_IN_PROGRESS, 0, 1, INT64_MAX, INT64_MAX);
    idem_decision_t d = idem_decide(&r, fp_a, INT64_MIN + 1);
    cr_expect_eq(d.kind, IDEM_DECIDE_IN_FLIGHT);
    cr_expect_gt(d.retry_after_s, 0);
}

Test(engine, lease_end_reached_is_takeover_with_next_fence)
{
    idem_record_t r = live(6, 0); /* now == lease_until */
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_TAKEOVER);
    cr_expect_eq(d.fence, 7);
    cr_expect_eq(d.retry_after_s, 0);
}

Test(engine, completed_without_body_is_not_retained)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, IDEM_REC_NOT_RETAINED, 2, 0, NOW + 1000);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_NOT_RETAINED);
    cr_expect_eq(d.fence, 2);
}

Test(engine, completed_is_replay_with_record_fence)
{
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 9, 0, NOW + 1000);
    idem_decision_t d = idem_decide(&r, fp_a, NOW);
    cr_expect_eq(d.kind, IDEM_DECIDE_REPLAY);
    cr_expect_eq(d.fence, 9);
}

Test(engine, completed_ignores_a_stale_lease_field)
{
    /* The lease means nothing once completed: no takeover of a result. */
    idem_record_t r = rec(IDEM_STATE_COMPLETED, 0, 1, NOW - 1, NOW + 1000);
    cr_expect_eq(idem_decide(&r, fp_a, NOW).kind, IDEM_DECIDE_REPLAY);
}

Test(engine, only_claim_and_takeover_forward)
{
    for (int k = IDEM_DECIDE_CLAIM; k <= IDEM_DECIDE_NOT_RETAINED; k++)
        cr_expect_eq(idem_decision_forwards((idem_decision_kind_t)k),
                     k == IDEM_DECIDE_CLAIM || k == IDEM_DECIDE_TAKEOVER, "kind %d", k);
}

Test(engine, every_kind_has_its_own_name)
{
    const char *seen[8] = {0};
    for (int k = IDEM_DECIDE_CLAIM; k <= IDEM_DECIDE_NOT_RETAINED; k++) {
        seen[k] = idem_decision_name((idem_decision_kind_t)k);
        cr_assert_str_neq(seen[k], "unknown");
        for (int j = IDEM_DECIDE_CLAIM; j < k; j++)
            cr_expect_str_neq(seen[j], seen[k]);
    }
    cr_expect_str_eq(idem_decision_name(IDEM_DECIDE_REPLAY), "replay");
    cr_expect_str_eq(idem_decision_name((idem_decision_kind_t)99), "unknown");
}
