/* tests/unit/test_alloc.c - the allocation hook and its fault injection
 * (src/core/alloc.c).
 *
 * Every fault test in the project rests on idem_alloc_fail_after failing
 * exactly the nth allocation and every later one, so that is pinned here,
 * along with the zero-size and copy behaviour the wrappers promise.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "idem/alloc.h"

/* Each test leaves injection off, whatever it asserted. */
static void off(void)
{
    idem_alloc_fail_after(0);
}

TestSuite(alloc, .fini = off);

Test(alloc, nth_allocation_fails)
{
    void *a, *b, *c;
    idem_alloc_fail_after(3);
    a = idem_malloc(8);
    b = idem_malloc(8);
    c = idem_malloc(8);
    off();
    cr_expect_not_null(a);
    cr_expect_not_null(b);
    cr_expect_null(c);
    idem_free(a);
    idem_free(b);
}

Test(alloc, every_allocation_after_the_nth_fails)
{
    idem_alloc_fail_after(1);
    cr_expect_null(idem_malloc(8));
    cr_expect_null(idem_malloc(8));
    cr_expect_null(idem_calloc(1, 8));
    cr_expect_null(idem_realloc(NULL, 8));
    cr_expect_null(idem_strdup("x"));
    cr_expect_null(idem_strndup("x", 1));
}

Test(alloc, zero_turns_injection_off)
{
    void *p;
    idem_alloc_fail_after(1);
    cr_assert_null(idem_malloc(8));
    idem_alloc_fail_after(0);
    p = idem_malloc(8);
    cr_expect_not_null(p);
    idem_free(p);
}

Test(alloc, every_allocator_counts_toward_n)
{
    void *a, *b, *d, *e;
    char *c;
    idem_alloc_fail_after(5);
    a = idem_malloc(4);
    b = idem_calloc(2, 4);
    c = idem_strdup("abc");
    d = idem_realloc(NULL, 4);
    e = idem_strndup("abc", 2);
    off();
    cr_expect_not_null(a);
    cr_expect_not_null(b);
    cr_expect_not_null(c);
    cr_expect_not_null(d);
    cr_expect_null(e);
    idem_free(a);
    idem_free(b);
    idem_free(c);
    idem_free(d);
}

Test(alloc, failed_realloc_keeps_the_old_block)
{
    char *p = idem_malloc(4), *q;
    cr_assert_not_null(p);
    memcpy(p, "abc", 4);
    idem_alloc_fail_after(1);
    q = idem_realloc(p, 4096);
    off();
    cr_expect_null(q);
    cr_expect_str_eq(p, "abc");
    idem_free(p);
}

Test(alloc, failures_are_counted)
{
    unsigned long before = idem_alloc_failures();
    void *p = idem_malloc(1);
    cr_expect_eq(idem_alloc_failures(), before);
    idem_free(p);
    idem_alloc_fail_after(1);
    cr_expect_null(idem_malloc(1));
    cr_expect_null(idem_calloc(1, 1));
    off();
    cr_expect_eq(idem_alloc_failures(), before + 2);
}

Test(alloc, zero_size_gives_unique_pointers)
{
    void *a = idem_malloc(0), *b = idem_malloc(0), *c = idem_calloc(0, 8);
    cr_expect_not_null(a);
    cr_expect_not_null(b);
    cr_expect_not_null(c);
    cr_expect_neq(a, b);
    idem_free(a);
    idem_free(b);
    idem_free(c);
}

Test(alloc, realloc_to_zero_keeps_a_block)
{
    void *p = idem_malloc(16), *q;
    cr_assert_not_null(p);
    q = idem_realloc(p, 0);
    cr_expect_not_null(q);
    idem_free(q);
}

Test(alloc, calloc_zeroes_and_refuses_overflow)
{
    unsigned char *p = idem_calloc(16, 4);
    cr_assert_not_null(p);
    for (int i = 0; i < 64; i++)
        cr_expect_eq(p[i], 0);
    idem_free(p);
    cr_expect_null(idem_calloc(SIZE_MAX / 2, 4));
}

Test(alloc, free_null_is_a_no_op)
{
    idem_free(NULL);
}

Test(alloc, strndup_copies_exactly_n_bytes)
{
    char *s = idem_strndup("ab\0cd", 5);
    cr_assert_not_null(s);
    cr_expect_eq(memcmp(s, "ab\0cd", 6), 0);
    idem_free(s);
    s = idem_strndup("abcdef", 3);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "abc");
    idem_free(s);
}

Test(alloc, strndup_of_nothing_is_empty_string)
{
    char *s = idem_strndup(NULL, 0);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "");
    idem_free(s);
}

Test(alloc, strdup_copies)
{
    const char *src = "hello";
    char *s = idem_strdup(src);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, src);
    cr_expect_neq((void *)s, (void *)src);
    idem_free(s);
    cr_expect_null(idem_strdup(NULL));
}
