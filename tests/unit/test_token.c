/* tests/unit/test_token.c - prevention tokens: generation, parsing, identity, decision. */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/token.h"

static uint64_t fixed_next(void *ctx)
{
    uint64_t *v = ctx;
    return (*v)++;
}

Test(token, generate_from_the_kernel_is_32_hex_and_fresh)
{
    char a[IDEM_TOKEN_LEN + 1], b[IDEM_TOKEN_LEN + 1];
    cr_assert_eq(idem_token_generate(NULL, a), IDEM_OK);
    cr_assert_eq(idem_token_generate(NULL, b), IDEM_OK);
    cr_expect_eq(strlen(a), IDEM_TOKEN_LEN);
    cr_expect_eq(strspn(a, "0123456789abcdef"), IDEM_TOKEN_LEN);
    cr_expect_str_neq(a, b);
}

Test(token, generate_from_an_injected_source_is_known)
{
    uint64_t v = 0x0807060504030201ull;
    idem_rng_t rng = {fixed_next, &v};
    char t[IDEM_TOKEN_LEN + 1];
    cr_assert_eq(idem_token_generate(&rng, t), IDEM_OK);
    cr_expect_str_eq(t, "01020304050607080202030405060708");
}

Test(token, parse_accepts_bare_quoted_padded_and_upper_case)
{
    char out[IDEM_TOKEN_LEN + 1];
    const char *tok = "0123456789abcdef0123456789abcdef";
    cr_expect_eq(idem_token_parse(tok, strlen(tok), out), IDEM_OK);
    cr_expect_str_eq(out, tok);
    const char *q = "  \"0123456789ABCDEF0123456789abcdef\"\t";
    cr_expect_eq(idem_token_parse(q, strlen(q), out), IDEM_OK);
    cr_expect_str_eq(out, tok);
}

Test(token, parse_refuses_anything_else)
{
    static const char *const bad[] = {
        "", "   ", "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0",
        "0123456789abcdef0123456789abcdeg", "0123456789abcdef 123456789abcdef",
        "\"0123456789abcdef0123456789abcdef", "0x23456789abcdef0123456789abcdef",
    };
    char out[IDEM_TOKEN_LEN + 1];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(idem_token_parse(bad[i], strlen(bad[i]), out), IDEM_E_INVAL, "\"%s\"", bad[i]);
        cr_expect_str_eq(out, "");
    }
    cr_expect_eq(idem_token_parse(NULL, 0, out), IDEM_E_INVAL);
}

Test(token, id_is_outside_every_key)
{
    idem_key_id_t id;
    char key[IDEM_KEY_MAX + 1];
    idem_token_id("anonymous", "0123456789abcdef0123456789abcdef", &id);
    cr_expect_str_eq(id.scope, "anonymous");
    cr_expect_str_eq(id.key, IDEM_TOKEN_PREFIX "0123456789abcdef0123456789abcdef");
    /* No Idempotency-Key value parses to a key that begins with the prefix. */
    cr_expect_eq(idem_key_parse(id.key, strlen(id.key), key), IDEM_E_INVAL);
}

Test(token, decide_table)
{
    idem_record_t r;
    memset(&r, 0, sizeof r);
    r.flags = IDEM_REC_TOKEN;
    r.state = IDEM_STATE_IN_PROGRESS;
    r.expires_at_ms = 1000;
    cr_expect_eq(idem_token_decide(NULL, 0), IDEM_TOKEN_INVALID);
    cr_expect_eq(idem_token_decide(&r, 999), IDEM_TOKEN_FIRST_USE);
    cr_expect_eq(idem_token_decide(&r, 1000), IDEM_TOKEN_INVALID);
    r.state = IDEM_STATE_COMPLETED;
    cr_expect_eq(idem_token_decide(&r, 999), IDEM_TOKEN_USED);
    cr_expect_eq(idem_token_decide(&r, 1000), IDEM_TOKEN_INVALID);
    r.flags = 0;
    r.state = IDEM_STATE_IN_PROGRESS;
    cr_expect_eq(idem_token_decide(&r, 1), IDEM_TOKEN_INVALID, "a key record is not a token");
    cr_expect_str_eq(idem_token_verdict_name(IDEM_TOKEN_USED), "used");
}
