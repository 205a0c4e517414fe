/* tests/unit/test_http_target.c - percent-decoding and query parameters
 * (src/http/target.c), as the admin listener uses them for /keys/{key}. */
#include <criterion/criterion.h>
#include <string.h>

#include "http/http.h"

Test(http_target, hex_digits)
{
    cr_expect_eq(idem_http_hexval('0'), 0);
    cr_expect_eq(idem_http_hexval('9'), 9);
    cr_expect_eq(idem_http_hexval('a'), 10);
    cr_expect_eq(idem_http_hexval('F'), 15);
    cr_expect_eq(idem_http_hexval('g'), -1);
    cr_expect_eq(idem_http_hexval(' '), -1);
}

Test(http_target, decodes_escapes_and_keeps_plus)
{
    char out[32];
    const char *in = "a%20b%2Fc+d%25";
    cr_assert_eq(idem_http_pct_decode(in, strlen(in), out, sizeof out), 8);
    cr_expect_str_eq(out, "a b/c+d%");
}

Test(http_target, refuses_bad_escapes_nul_and_overflow)
{
    char out[4];
    cr_expect_eq(idem_http_pct_decode("%2", 2, out, sizeof out), -1);
    cr_expect_eq(idem_http_pct_decode("%zz", 3, out, sizeof out), -1);
    cr_expect_eq(idem_http_pct_decode("a%00", 4, out, sizeof out), -1);
    cr_expect_eq(idem_http_pct_decode("abcd", 4, out, sizeof out), -1, "no room for the NUL");
    cr_expect_eq(idem_http_pct_decode("abc", 3, out, sizeof out), 3);
    cr_expect_eq(idem_http_pct_decode("", 0, out, 0), -1);
}

Test(http_target, finds_the_named_parameter_only)
{
    char out[32];
    const char *q = "xscope=1&scope=anonymous&scope=2";
    cr_assert_eq(idem_http_query_param(q, strlen(q), "scope", out, sizeof out), 9);
    cr_expect_str_eq(out, "anonymous");
    cr_expect_eq(idem_http_query_param(q, strlen(q), "key", out, sizeof out), -2);
    cr_expect_eq(idem_http_query_param("key=%G1", 7, "key", out, sizeof out), -1);
    cr_expect_eq(idem_http_query_param("key", 3, "key", out, sizeof out), -2, "no '=': absent");
}
