/* tests/unit/test_random.c - the kernel's random numbers and uniform draws (src/core/random.c).
 *
 * The kernel source is checked for what can be checked without statistics
 * that flake: it fills what it is asked to and two draws differ.  Draws
 * below a bound are checked exactly with injected sources: every value is
 * reached, none is out of range, and the few numbers that would bias the
 * result are rejected rather than folded in.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/random.h"

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

/* 0, 1, 2, ... */
static uint64_t counter_next(void *ctx)
{
    uint64_t *c = ctx;

    return (*c)++;
}

Test(random, bytes_fill_and_two_draws_differ)
{
    unsigned char a[32], b[32], zero[32] = {0};

    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    cr_assert_eq(idem_random_bytes(a, sizeof a), IDEM_OK);
    cr_assert_eq(idem_random_bytes(b, sizeof b), IDEM_OK);
    cr_expect_neq(memcmp(a, b, sizeof a), 0, "two 32-byte draws are equal");
    cr_expect_neq(memcmp(a, zero, sizeof a), 0, "32 bytes left zero");
    cr_expect_neq(memcmp(b, zero, sizeof b), 0, "32 bytes left zero");
}

Test(random, bytes_fill_a_large_buffer_to_its_end)
{
    /* More than one getrandom call may serve 4096 bytes; its last 32 must be
     * written too. */
    static unsigned char buf[4096];
    unsigned char zero[32] = {0};

    cr_assert_eq(idem_random_bytes(buf, sizeof buf), IDEM_OK);
    cr_expect_neq(memcmp(buf + sizeof buf - 32, zero, 32), 0);
}

Test(random, bytes_of_zero_length_is_ok)
{
    unsigned char c = 0xAB;

    cr_expect_eq(idem_random_bytes(&c, 0), IDEM_OK);
    cr_expect_eq(c, 0xAB);
}

Test(random, u64_from_the_kernel_differs)
{
    cr_expect_neq(idem_rng_u64(NULL), idem_rng_u64(NULL));
}

Test(random, u64_from_an_injected_source_is_its_number)
{
    const uint64_t v[] = {42, UINT64_MAX, 0};
    struct seq s = {v, 3, 0};
    idem_rng_t rng = {seq_next, &s};

    cr_expect_eq(idem_rng_u64(&rng), 42);
    cr_expect_eq(idem_rng_u64(&rng), UINT64_MAX);
    cr_expect_eq(idem_rng_u64(&rng), 0);
    cr_expect_eq(s.calls, 3);
}

Test(random, u64_without_a_function_uses_the_kernel)
{
    idem_rng_t rng = {NULL, NULL};

    cr_expect_neq(idem_rng_u64(&rng), idem_rng_u64(&rng));
}

Test(random, below_zero_is_zero_without_a_draw)
{
    struct seq s = {NULL, 0, 0};
    idem_rng_t rng = {seq_next, &s};

    cr_expect_eq(idem_rng_below(&rng, 0), 0);
    cr_expect_eq(s.calls, 0);
    cr_expect_eq(idem_rng_below(NULL, 0), 0);
}

Test(random, below_one_is_always_zero)
{
    int i;

    for (i = 0; i < 100; i++)
        cr_expect_eq(idem_rng_below(NULL, 1), 0);
}

Test(random, below_small_bounds_stays_below)
{
    uint64_t bound, c = 0;
    idem_rng_t counter = {counter_next, &c};
    int i;

    for (bound = 1; bound <= 64; bound++) {
        for (i = 0; i < 200; i++) {
            uint64_t k = idem_rng_below(NULL, bound), n = idem_rng_below(&counter, bound);

            cr_assert_lt(k, bound, "kernel draw %llu for bound %llu", (unsigned long long)k,
                         (unsigned long long)bound);
            cr_assert_lt(n, bound, "counter draw %llu for bound %llu", (unsigned long long)n,
                         (unsigned long long)bound);
        }
    }
}

Test(random, below_three_with_a_counter_reaches_every_value)
{
    /* 2^64 mod 3 is 1, so 0 is the one number rejected; 1, 2, 3 give 1, 2, 0. */
    uint64_t c = 0;
    idem_rng_t rng = {counter_next, &c};
    int seen[3] = {0, 0, 0};

    seen[idem_rng_below(&rng, 3)]++;
    seen[idem_rng_below(&rng, 3)]++;
    seen[idem_rng_below(&rng, 3)]++;
    cr_expect_eq(seen[0], 1);
    cr_expect_eq(seen[1], 1);
    cr_expect_eq(seen[2], 1);
    cr_expect_eq(c, 4, "drew %llu numbers, expected 4 (0 rejected)", (unsigned long long)c);
}

Test(random, below_rejects_the_numbers_that_would_bias)
{
    /* For bound 2^63 + 1, the numbers below 2^63 - 1 would make the results
     * below 2^63 - 1 twice as likely as the others: they are drawn again. */
    const uint64_t bound = (UINT64_C(1) << 63) + 1;
    const uint64_t v[] = {0, (UINT64_C(1) << 63) - 2, (UINT64_C(1) << 63) - 1};
    struct seq s = {v, 3, 0};
    idem_rng_t rng = {seq_next, &s};

    cr_expect_eq(idem_rng_below(&rng, bound), (UINT64_C(1) << 63) - 1);
    cr_expect_eq(s.calls, 3);
}

Test(random, below_a_power_of_two_takes_every_number)
{
    const uint64_t v[] = {0, 5, UINT64_MAX};
    struct seq s = {v, 3, 0};
    idem_rng_t rng = {seq_next, &s};

    cr_expect_eq(idem_rng_below(&rng, 4), 0);
    cr_expect_eq(idem_rng_below(&rng, 4), 1);
    cr_expect_eq(idem_rng_below(&rng, 4), 3);
    cr_expect_eq(s.calls, 3);
}

Test(random, below_the_largest_bound)
{
    /* 2^64 mod (2^64 - 1) is 1: only 0 is rejected, and UINT64_MAX - 1 is the
     * largest result. */
    const uint64_t v[] = {0, UINT64_MAX - 1, UINT64_MAX};
    struct seq s = {v, 3, 0};
    idem_rng_t rng = {seq_next, &s};

    cr_expect_eq(idem_rng_below(&rng, UINT64_MAX), UINT64_MAX - 1);
    cr_expect_eq(s.calls, 2);
    cr_expect_eq(idem_rng_below(&rng, UINT64_MAX), 0);
}

Test(random, below_three_from_the_kernel_is_roughly_even)
{
    /* 30000 draws: each count is 10000 +- 82 (one standard deviation); the
     * bounds below are twelve of those, so a fair source never misses them. */
    int seen[3] = {0, 0, 0}, i;

    for (i = 0; i < 30000; i++)
        seen[idem_rng_below(NULL, 3)]++;
    for (i = 0; i < 3; i++)
        cr_expect(seen[i] > 9000 && seen[i] < 11000, "value %d drawn %d times", i, seen[i]);
}
