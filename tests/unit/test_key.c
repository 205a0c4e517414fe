/* tests/unit/test_key.c - Idempotency-Key values and scopes (src/core/key.c).
 *
 * Every way docs/protocol.md section 2 lets a key be wrong is refused here, both
 * spellings of a good key give the same key, and the scope never contains
 * the credential it stands for.  A fresh key is a UUIDv7 whose every
 * character is known when the random source is injected.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/key.h"

static char got[IDEM_KEY_MAX + 1];

/* Parse len bytes at s; the key, or NULL when refused. */
static const char *parse_n(const char *s, size_t len)
{
    memset(got, 'x', sizeof got);
    if (idem_key_parse(s, len, got) != IDEM_OK) {
        cr_expect_eq(got[0], '\0', "out not cleared on failure");
        return NULL;
    }
    return got;
}

static const char *parse(const char *s)
{
    return parse_n(s, strlen(s));
}

static void refused(const char *s)
{
    cr_expect_null(parse(s), "accepted [%s]", s);
}

static void accepted(const char *s, const char *key)
{
    const char *k = parse(s);
    cr_assert_not_null(k, "refused [%s]", s);
    cr_expect_str_eq(k, key);
}

/* n copies of c between prefix and suffix, in buf. */
static const char *build(char *buf, const char *prefix, char c, size_t n, const char *suffix)
{
    size_t p = strlen(prefix), s = strlen(suffix);

    memcpy(buf, prefix, p);
    memset(buf + p, c, n);
    memcpy(buf + p + n, suffix, s + 1);
    return buf;
}

/* ---- the bare token form ---- */

Test(key, bare_token_accepted)
{
    accepted("8e03978e-40d5", "8e03978e-40d5");
}

Test(key, bare_token_takes_every_visible_ascii_character_but_the_comma)
{
    char all[0x7E - 0x21 + 1];
    size_t n = 0;
    for (int c = 0x21; c <= 0x7E; c++)
        if (c != ',')
            all[n++] = (char)c;
    all[n] = '\0';
    /* It starts with '!', so it is a bare token although it holds '"'. */
    accepted(all, all);
}

/* "a, b" is what an intermediary makes of two Idempotency-Key fields. */
Test(key, comma_in_bare_token_refused)
{
    refused("a,b");
    refused("a, b");
    refused(",");
    refused("abc,");
    refused(",abc");
}

Test(key, comma_in_quoted_string_accepted)
{
    accepted("\"a,b\"", "a,b");
    accepted("\"a, b\"", "a, b");
}

Test(key, bare_token_keeps_quote_and_backslash_after_first_character)
{
    accepted("ab\"c\\d", "ab\"c\\d");
}

Test(key, bare_token_of_one_character_accepted)
{
    accepted("a", "a");
}

Test(key, bare_token_of_255_characters_accepted)
{
    char in[300], want[300];
    accepted(build(in, "", 'k', 255, ""), build(want, "", 'k', 255, ""));
}

Test(key, bare_token_of_256_characters_refused)
{
    char in[300];
    refused(build(in, "", 'k', 256, ""));
}

Test(key, space_inside_bare_token_refused)
{
    refused("ab cd");
    refused("ab\tcd");
}

Test(key, surrounding_white_space_trimmed)
{
    accepted("  abc", "abc");
    accepted("abc \t ", "abc");
    accepted("\t abc\t", "abc");
    accepted(" \"abc\" ", "abc");
}

Test(key, trimming_does_not_count_toward_the_limit)
{
    char in[300];
    cr_expect_not_null(parse(build(in, "  ", 'k', 255, "\t ")));
}

/* ---- the sf-string form ---- */

Test(key, quoted_string_accepted)
{
    accepted("\"8e03978e-40d5\"", "8e03978e-40d5");
}

Test(key, both_forms_give_the_same_key)
{
    char a[IDEM_KEY_MAX + 1];
    cr_assert_not_null(parse("abc-123"));
    memcpy(a, got, sizeof a);
    cr_assert_not_null(parse("\"abc-123\""));
    cr_expect_str_eq(got, a);
}

Test(key, quoted_string_may_hold_spaces)
{
    accepted("\"a b c\"", "a b c");
    accepted("\" lead and trail \"", " lead and trail ");
    accepted("\" \"", " ");
}

Test(key, escaped_quote_unescaped)
{
    accepted("\"a\\\"b\"", "a\"b");
}

Test(key, escaped_backslash_unescaped)
{
    accepted("\"a\\\\b\"", "a\\b");
}

Test(key, escaped_quote_at_both_ends)
{
    accepted("\"\\\"x\\\"\"", "\"x\"");
}

Test(key, quoted_key_of_255_characters_accepted)
{
    char in[300], want[300];
    accepted(build(in, "\"", 'q', 255, "\""), build(want, "", 'q', 255, ""));
}

Test(key, quoted_key_of_256_characters_refused)
{
    char in[300];
    refused(build(in, "\"", 'q', 256, "\""));
}

Test(key, limit_counts_unescaped_characters)
{
    char in[600], want[300];
    /* 255 escaped backslashes: 510 characters quoted, 255 in the key. */
    build(in, "\"", '\\', 510, "\"");
    accepted(in, build(want, "", '\\', 255, ""));
    build(in, "\"", '\\', 512, "\"");
    refused(in);
}

Test(key, quoted_empty_string_refused)
{
    refused("\"\"");
}

Test(key, lone_quote_refused)
{
    refused("\"");
}

Test(key, unterminated_quote_refused)
{
    refused("\"abc");
    refused("\"abc\\\""); /* the last quote is escaped */
}

Test(key, bad_escape_refused)
{
    refused("\"a\\nb\"");
    refused("\"a\\tb\"");
    refused("\"a\\u0041\"");
    refused("\"a\\ b\"");
}

Test(key, backslash_at_end_refused)
{
    refused("\"abc\\");
}

Test(key, trailing_garbage_after_quote_refused)
{
    refused("\"abc\"def");
    refused("\"abc\" x");
    refused("\"abc\"\"");
    refused("\"a\",\"b\"");
}

Test(key, control_character_in_quoted_string_refused)
{
    refused("\"a\tb\"");
    refused("\"a\x01" "b\"");
}

Test(key, del_in_quoted_string_refused)
{
    refused("\"a\x7f" "b\"");
}

Test(key, non_ascii_in_quoted_string_refused)
{
    refused("\"caf\xc3\xa9\"");
}

/* ---- what is refused in any form ---- */

Test(key, empty_value_refused)
{
    refused("");
    cr_expect_null(parse_n(NULL, 0));
}

Test(key, only_white_space_refused)
{
    refused(" ");
    refused("   \t ");
}

Test(key, control_character_refused)
{
    refused("ab\x01" "cd");
    refused("ab\rcd");
    refused("ab\ncd");
}

Test(key, nul_byte_refused)
{
    cr_expect_null(parse_n("ab\0cd", 5));
    cr_expect_null(parse_n("\"ab\0cd\"", 7));
}

Test(key, del_refused)
{
    refused("ab\x7f" "cd");
}

Test(key, non_ascii_byte_refused)
{
    refused("caf\xc3\xa9");
    refused("\x80");
    refused("\xff");
}

Test(key, value_is_not_read_past_len)
{
    /* len says "abc"; the rest must not be read. */
    cr_assert_not_null(parse_n("abc def", 3));
    cr_expect_str_eq(got, "abc");
    cr_assert_not_null(parse_n("\"ab\"garbage", 4));
    cr_expect_str_eq(got, "ab");
}

/* ---- scopes ---- */

Test(key, absent_scope_header_is_anonymous)
{
    char scope[IDEM_SCOPE_MAX + 1];
    idem_scope_from_header(NULL, 0, scope);
    cr_expect_str_eq(scope, "anonymous");
}

Test(key, scope_is_lowercase_hex_sha256_of_the_value)
{
    char scope[IDEM_SCOPE_MAX + 1];
    /* sha256("abc"), FIPS 180-2 appendix B.1 */
    idem_scope_from_header("abc", 3, scope);
    cr_expect_str_eq(scope, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

Test(key, scope_hashes_exactly_len_bytes)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_from_header("abcdef", 3, a);
    idem_scope_from_header("abc", 3, b);
    cr_expect_str_eq(a, b);
}

Test(key, empty_scope_header_is_not_anonymous)
{
    char scope[IDEM_SCOPE_MAX + 1];
    idem_scope_from_header("", 0, scope);
    cr_expect_str_eq(scope, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

Test(key, different_credentials_give_different_scopes)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_from_header("Bearer alice", 12, a);
    idem_scope_from_header("Bearer bob", 10, b);
    cr_expect_str_neq(a, b);
    cr_expect(idem_scope_valid(a));
    cr_expect_null(strstr(a, "alice"));
}

Test(key, scope_valid_accepts_anonymous_and_64_lowercase_hex)
{
    cr_expect(idem_scope_valid("anonymous"));
    cr_expect(idem_scope_valid("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
}

Test(key, scope_valid_refuses_everything_else)
{
    static const char good[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    char s[80];

    cr_expect_not(idem_scope_valid(NULL));
    cr_expect_not(idem_scope_valid(""));
    cr_expect_not(idem_scope_valid("Anonymous"));
    cr_expect_not(idem_scope_valid("anonymous "));
    cr_expect_not(idem_scope_valid("../../etc/passwd"));
    /* 63 and 65 digits */
    cr_expect_not(idem_scope_valid(good + 1));
    memcpy(s, good, 64);
    memcpy(s + 64, "0", 2);
    cr_expect_not(idem_scope_valid(s));
    /* one uppercase or non-hex digit */
    memcpy(s, good, 65);
    s[0] = 'B';
    cr_expect_not(idem_scope_valid(s));
    s[0] = 'g';
    cr_expect_not(idem_scope_valid(s));
}

/* ---- fresh keys (UUIDv7) ---- */

/* Returns its two numbers in turn, then repeats the second. */
struct two {
    uint64_t a, b;
    int calls;
};

static uint64_t two_next(void *ctx)
{
    struct two *t = ctx;

    return t->calls++ == 0 ? t->a : t->b;
}

static const char *generate(int64_t now_ms, uint64_t a, uint64_t b)
{
    static char out[IDEM_UUID_LEN + 8];
    struct two t = {a, b, 0};
    idem_rng_t rng = {two_next, &t};

    memset(out, 'x', sizeof out);
    idem_key_generate(now_ms, &rng, out);
    return out;
}

/* Lowercase 8-4-4-4-12 hex, version 7, variant 10. */
static void expect_uuidv7(const char *u)
{
    size_t i;

    cr_assert_eq(strlen(u), IDEM_UUID_LEN, "[%s]", u);
    for (i = 0; i < IDEM_UUID_LEN; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            cr_expect_eq(u[i], '-', "[%s] at %zu", u, i);
        else
            cr_expect((u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f'),
                      "[%s] at %zu", u, i);
    }
    cr_expect_eq(u[14], '7', "version of [%s]", u);
    cr_expect(u[19] == '8' || u[19] == '9' || u[19] == 'a' || u[19] == 'b', "variant of [%s]", u);
}

/* The first 48 bits of u, from its first 12 hex digits. */
static int64_t uuid_time(const char *u)
{
    int64_t t = 0;
    size_t i;

    for (i = 0; i < 13; i++) {
        if (u[i] == '-')
            continue;
        t = t * 16 + (u[i] <= '9' ? u[i] - '0' : u[i] - 'a' + 10);
    }
    return t;
}

Test(key, generate_with_an_injected_source_is_known)
{
    cr_expect_str_eq(generate(INT64_C(0x0123456789AB), 0xCDE, UINT64_C(0x3F11223344556677)),
                     "01234567-89ab-7cde-bf11-223344556677");
}

Test(key, generate_sets_version_and_variant_whatever_the_numbers)
{
    cr_expect_str_eq(generate(0, 0, 0), "00000000-0000-7000-8000-000000000000");
    cr_expect_str_eq(generate(0, UINT64_MAX, UINT64_MAX), "00000000-0000-7fff-bfff-ffffffffffff");
    expect_uuidv7(generate(0, 0, 0));
    expect_uuidv7(generate(0, UINT64_MAX, UINT64_MAX));
}

Test(key, generate_starts_with_the_time)
{
    static const int64_t times[] = {0, 1, 1000, INT64_C(1780272000000), INT64_C(0xFFFFFFFFFFFF)};
    size_t i;

    for (i = 0; i < sizeof times / sizeof times[0]; i++) {
        const char *u = generate(times[i], 0x123, 0x456);

        expect_uuidv7(u);
        cr_expect_eq(uuid_time(u), times[i], "[%s] for %lld", u, (long long)times[i]);
    }
    cr_expect_str_eq(generate(INT64_C(0xFFFFFFFFFFFF), 0, 0), "ffffffff-ffff-7000-8000-000000000000");
}

Test(key, generate_from_any_clock_is_well_formed)
{
    expect_uuidv7(generate(-1, 1, 2));
    expect_uuidv7(generate(INT64_MIN, 1, 2));
    expect_uuidv7(generate(INT64_MAX, 1, 2));
}

Test(key, generated_keys_sort_by_time)
{
    char a[IDEM_UUID_LEN + 1], b[IDEM_UUID_LEN + 1];

    idem_key_generate(INT64_C(1780272000000), NULL, a);
    idem_key_generate(INT64_C(1780272000001), NULL, b);
    cr_expect_lt(strcmp(a, b), 0, "[%s] not before [%s]", a, b);
}

Test(key, generated_keys_from_the_kernel_differ_and_are_valid_keys)
{
    char a[IDEM_UUID_LEN + 1], b[IDEM_UUID_LEN + 1];
    int variants[4] = {0, 0, 0, 0}, i;

    idem_key_generate(1000, NULL, a);
    idem_key_generate(1000, NULL, b);
    expect_uuidv7(a);
    expect_uuidv7(b);
    cr_expect_str_neq(a, b, "two fresh keys in the same millisecond are equal");
    cr_expect_str_eq(parse(a), a, "a fresh key is not a valid Idempotency-Key");
    /* The variant's free bits are random: all four digits turn up. */
    for (i = 0; i < 400; i++) {
        idem_key_generate(1000, NULL, a);
        expect_uuidv7(a);
        if (a[19] != '\0' && strchr("89ab", a[19]) != NULL)
            variants[strchr("89ab", a[19]) - "89ab"]++;
    }
    for (i = 0; i < 4; i++)
        cr_expect_gt(variants[i], 0, "variant digit %d never drawn", i);
}
