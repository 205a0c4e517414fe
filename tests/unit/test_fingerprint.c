/* tests/unit/test_fingerprint.c - fingerprints and canonical JSON
 * (src/core/fingerprint.c and src/core/json.c).
 *
 * What must be equal is equal (the same request; reordered or re-spaced JSON;
 * one number or string however it is spelled; ignored members; header names
 * in any case) and what must differ differs (any field; field boundaries;
 * absent versus empty header; numbers that differ in any digit, however far
 * down).  What RFC 8259 refuses is not JSON, and neither are duplicate keys;
 * the memory a document takes stays within its stated bound.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "idem/alloc.h"
#include "idem/fingerprint.h"

/* A request to vary: POST /orders?x=1 with a small JSON body. */
static idem_fp_input_t req(const char *method, const char *target, const char *body)
{
    idem_fp_input_t in = {0};
    in.method = method;
    in.method_len = strlen(method);
    in.target = target;
    in.target_len = strlen(target);
    in.body = (const uint8_t *)body;
    in.body_len = strlen(body);
    return in;
}

static idem_fp_input_t base(void)
{
    return req("POST", "/orders?x=1", "{\"amount\":100,\"currency\":\"EUR\"}");
}

static void fp(const idem_fp_input_t *in, uint8_t out[IDEM_FP_LEN])
{
    cr_assert_eq(idem_fingerprint(in, out), IDEM_OK);
}

static int same(const idem_fp_input_t *a, const idem_fp_input_t *b)
{
    uint8_t x[IDEM_FP_LEN], y[IDEM_FP_LEN];
    fp(a, x);
    fp(b, y);
    return memcmp(x, y, IDEM_FP_LEN) == 0;
}

/* Canonical form of text with the given pointers; asserts success. */
static char canon_buf[16384];
static const char *canon(const char *text, const char *const *ignore, size_t n_ignore)
{
    char *out = NULL;
    size_t len = 0;
    idem_err_t err = idem_json_canonicalize(text, strlen(text), ignore, n_ignore, &out, &len);
    cr_assert_eq(err, IDEM_OK, "canonicalize [%s]: %s", text, idem_err_name(err));
    cr_assert_not_null(out);
    cr_assert_eq(len, strlen(out));
    cr_assert_lt(len, sizeof canon_buf);
    memcpy(canon_buf, out, len + 1);
    idem_free(out);
    return canon_buf;
}

static void not_json(const char *text, size_t len)
{
    char *out = (char *)1;
    size_t out_len = 1;
    cr_expect_eq(idem_json_canonicalize(text, len, NULL, 0, &out, &out_len), IDEM_E_INVAL,
                 "[%.*s] taken for JSON", (int)len, text);
    cr_expect_null(out);
    cr_expect_eq(out_len, 0);
}

/* ---- the fingerprint ---- */

Test(fingerprint, same_request_same_fingerprint)
{
    idem_fp_input_t a = base(), b = base();
    cr_expect(same(&a, &b));
}

Test(fingerprint, known_value_pins_the_encoding)
{
    /* The stream of the file comment of fingerprint.c, computed apart:
     *   V"idem-fp-1" M"POST" T"/a?b=1" N"x-tenant" P"acme" N"x-absent" A""
     *   J"{\"a\":[1],\"b\":1}"
     * each as tag, 8-byte big-endian length, bytes.  Changing the encoding
     * changes every stored fingerprint: this value moves only on purpose.
     * (It moved when json.c replaced jansson, which wrote 1.0 as "1.0".) */
    idem_fp_header_t hs[2] = {{"X-Tenant", 8, "acme", 4}, {"X-Absent", 8, NULL, 0}};
    idem_fp_input_t in = req("POST", "/a?b=1", "{ \"b\": 1, \"a\": [1.0] }");
    uint8_t out[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    in.headers = hs;
    in.n_headers = 2;
    in.body_json = 1;
    fp(&in, out);
    idem_fp_hex(out, hex);
    cr_expect_str_eq(hex, "7403d3576ea847d81aa1472e39e1063ecd26808241a152249f79739ce7de0b80");
}

Test(fingerprint, json_bodies_of_integers_and_strings_keep_their_fingerprint)
{
    /* The value jansson gave this body before json.c replaced it (a Python
     * script hashing the stream of frames agrees): records stored before the
     * change still match honest retries of bodies whose numbers are all
     * integers. */
    idem_fp_input_t in = req("POST", "/a", "{ \"s\": \"\\u00e9\\n\\u001f\\/\", "
                                           "\"a\": [-12, -0, 9223372036854775807] }");
    uint8_t out[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    in.body_json = 1;
    fp(&in, out);
    idem_fp_hex(out, hex);
    cr_expect_str_eq(hex, "868f08c854c0aa3a32abd87b5afc619671cad2932faa23bc7018cf0b0cf19ec2");
}

Test(fingerprint, method_changes_fingerprint)
{
    idem_fp_input_t a = base(), b = base();
    b.method = "PATCH";
    b.method_len = 5;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, target_changes_fingerprint)
{
    idem_fp_input_t a = base(), b = base();
    b.target = "/orders?x=2";
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, body_changes_fingerprint)
{
    idem_fp_input_t a = base();
    idem_fp_input_t b = req("POST", "/orders?x=1", "{\"amount\":101,\"currency\":\"EUR\"}");
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, header_value_changes_fingerprint)
{
    idem_fp_header_t h1 = {"X-Tenant", 8, "a", 1}, h2 = {"X-Tenant", 8, "b", 1};
    idem_fp_input_t a = base(), b = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, header_name_changes_fingerprint)
{
    idem_fp_header_t h1 = {"X-Tenant", 8, "a", 1}, h2 = {"X-Tenanz", 8, "a", 1};
    idem_fp_input_t a = base(), b = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, header_name_is_case_insensitive)
{
    idem_fp_header_t h1 = {"Content-Type", 12, "application/json", 16};
    idem_fp_header_t h2 = {"content-TYPE", 12, "application/json", 16};
    idem_fp_input_t a = base(), b = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    cr_expect(same(&a, &b));
}

Test(fingerprint, long_header_name_is_lowercased_throughout)
{
    /* Longer than the 64-byte piece the name is lowercased in. */
    char up[200], low[200];
    memset(up, 'A', 150);
    memset(low, 'a', 150);
    idem_fp_header_t h1 = {up, 150, "v", 1}, h2 = {low, 150, "v", 1}, h3 = {low, 150, "w", 1};
    idem_fp_input_t a = base(), b = base(), c = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    c.headers = &h3;
    c.n_headers = 1;
    cr_expect(same(&a, &b));
    cr_expect_not(same(&b, &c));
}

Test(fingerprint, absent_and_empty_header_differ)
{
    idem_fp_header_t absent = {"x-tenant", 8, NULL, 0}, empty = {"x-tenant", 8, "", 0};
    idem_fp_input_t a = base(), b = base(), none = base();
    a.headers = &absent;
    a.n_headers = 1;
    b.headers = &empty;
    b.n_headers = 1;
    cr_expect_not(same(&a, &b));
    /* A configured header that is absent still differs from no header
     * configured at all. */
    cr_expect_not(same(&a, &none));
}

Test(fingerprint, header_value_case_matters)
{
    idem_fp_header_t h1 = {"x-tenant", 8, "Acme", 4}, h2 = {"x-tenant", 8, "acme", 4};
    idem_fp_input_t a = base(), b = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, header_boundaries_are_unambiguous)
{
    /* name "ab" value "c" against name "a" value "bc", and one header
     * against two whose bytes run together. */
    idem_fp_header_t h1 = {"ab", 2, "c", 1}, h2 = {"a", 1, "bc", 2};
    idem_fp_header_t two[2] = {{"a", 1, "b", 1}, {"c", 1, "d", 1}}, one = {"a", 1, "bcd", 3};
    idem_fp_input_t a = base(), b = base(), c = base(), d = base();
    a.headers = &h1;
    a.n_headers = 1;
    b.headers = &h2;
    b.n_headers = 1;
    c.headers = two;
    c.n_headers = 2;
    d.headers = &one;
    d.n_headers = 1;
    cr_expect_not(same(&a, &b));
    cr_expect_not(same(&c, &d));
}

Test(fingerprint, method_target_boundary_is_unambiguous)
{
    idem_fp_input_t a = req("POST", "/a", ""), b = req("POS", "T/a", "");
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, target_body_boundary_is_unambiguous)
{
    idem_fp_input_t a = req("POST", "/ab", "c"), b = req("POST", "/a", "bc");
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, method_is_case_sensitive)
{
    idem_fp_input_t a = req("POST", "/a", ""), b = req("post", "/a", "");
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, raw_mode_hashes_json_bytes_as_they_are)
{
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1,\"b\":2}");
    idem_fp_input_t b = req("POST", "/a", "{\"b\":2,\"a\":1}");
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, json_mode_reordered_and_respaced_is_the_same)
{
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1,\"b\":[1,2,{\"c\":null,\"d\":true}]}");
    idem_fp_input_t b = req("POST", "/a",
                            " {\n  \"b\" : [ 1 , 2 , { \"d\" : true , \"c\" : null } ] ,"
                            "\t\"a\" : 1 }\r\n");
    a.body_json = b.body_json = 1;
    cr_expect(same(&a, &b));
}

Test(fingerprint, json_mode_value_change_differs)
{
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1}"), b = req("POST", "/a", "{\"a\":2}");
    a.body_json = b.body_json = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, json_mode_ignored_member_does_not_count)
{
    const char *ignore[] = {"/client_time"};
    idem_fp_input_t a = req("POST", "/a", "{\"amount\":1,\"client_time\":\"10:00\"}");
    idem_fp_input_t b = req("POST", "/a", "{\"client_time\":\"10:05\",\"amount\":1}");
    idem_fp_input_t c = req("POST", "/a", "{\"amount\":1}");
    a.body_json = b.body_json = c.body_json = 1;
    a.ignore = b.ignore = c.ignore = ignore;
    a.n_ignore = b.n_ignore = c.n_ignore = 1;
    cr_expect(same(&a, &b));
    cr_expect(same(&a, &c));
}

Test(fingerprint, json_mode_ignore_does_not_hide_other_changes)
{
    const char *ignore[] = {"/client_time"};
    idem_fp_input_t a = req("POST", "/a", "{\"amount\":1,\"client_time\":\"10:00\"}");
    idem_fp_input_t b = req("POST", "/a", "{\"amount\":2,\"client_time\":\"10:00\"}");
    a.body_json = b.body_json = 1;
    a.ignore = b.ignore = ignore;
    a.n_ignore = b.n_ignore = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, json_mode_invalid_json_hashed_raw)
{
    idem_fp_input_t a = req("POST", "/a", "{not json"), b = req("POST", "/a", "{not json");
    idem_fp_input_t c = req("POST", "/a", "{not  json");
    a.body_json = b.body_json = c.body_json = 1;
    cr_expect(same(&a, &b));
    cr_expect_not(same(&a, &c));
    /* Hashed raw means: like raw mode. */
    b.body_json = 0;
    cr_expect(same(&a, &b));
}

Test(fingerprint, json_mode_canonical_body_differs_from_the_same_bytes_raw)
{
    /* A canonical body and a raw body are framed apart ('J' and 'B'). */
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1}"), b = req("POST", "/a", "{\"a\":1}");
    a.body_json = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, json_mode_duplicate_keys_hashed_raw)
{
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1,\"a\":2}");
    idem_fp_input_t b = req("POST", "/a", "{\"a\":1,\"a\":2}");
    a.body_json = 1;
    cr_expect(same(&a, &b));
}

Test(fingerprint, json_mode_too_deep_hashed_raw)
{
    char body[200];
    memset(body, '[', 65);
    memset(body + 65, ']', 65);
    body[130] = '\0';
    idem_fp_input_t a = req("POST", "/a", body), b = req("POST", "/a", body);
    a.body_json = 1;
    cr_expect(same(&a, &b));
}

Test(fingerprint, empty_body_in_json_mode_is_hashed_raw)
{
    idem_fp_input_t a = req("POST", "/a", ""), b = req("POST", "/a", "");
    a.body_json = 1;
    a.body = NULL;
    cr_expect(same(&a, &b));
}

Test(fingerprint, null_arguments_refused)
{
    uint8_t out[IDEM_FP_LEN];
    idem_fp_input_t in = base();
    cr_expect_eq(idem_fingerprint(NULL, out), IDEM_E_INVAL);
    cr_expect_eq(idem_fingerprint(&in, NULL), IDEM_E_INVAL);
    in.target = NULL;
    cr_expect_eq(idem_fingerprint(&in, out), IDEM_E_INVAL);
}

Test(fingerprint, survives_every_allocation_failure)
{
    /* Out of memory anywhere must be IDEM_E_NOMEM, never a fingerprint of a
     * different stream (jansson failing would otherwise look like "not JSON"
     * and the body would be hashed raw). */
    const char *ignore[] = {"/b/0", "/c/d"};
    idem_fp_input_t in = req("POST", "/a",
                             "{\"c\":{\"d\":1,\"e\":\"text text text\"},\"b\":[1,2,3],\"a\":1.5}");
    uint8_t want[IDEM_FP_LEN], out[IDEM_FP_LEN];
    in.body_json = 1;
    in.ignore = ignore;
    in.n_ignore = 2;
    fp(&in, want);
    for (long n = 1;; n++) {
        idem_alloc_fail_after(n);
        idem_err_t err = idem_fingerprint(&in, out);
        idem_alloc_fail_after(0);
        if (err == IDEM_OK) {
            cr_expect_arr_eq(out, want, IDEM_FP_LEN, "n=%ld", n);
            break;
        }
        cr_assert_eq(err, IDEM_E_NOMEM, "n=%ld: %s", n, idem_err_name(err));
        cr_assert_lt(n, 1000);
    }
}

/* ---- canonical JSON ---- */

Test(fingerprint, canonical_sorts_keys_and_drops_white_space)
{
    cr_expect_str_eq(canon(" { \"b\" : 1 , \"a\" : [ 2 , { \"d\" : 3 , \"c\" : 4 } ] } ", NULL, 0),
                     "{\"a\":[2,{\"c\":4,\"d\":3}],\"b\":1}");
}

Test(fingerprint, canonical_sorts_keys_by_bytes)
{
    cr_expect_str_eq(canon("{\"z\":1,\"\xc3\xa9\":2,\"a\":3,\"A\":4,\"ab\":5,\"\":6}", NULL, 0),
                     "{\"\":6,\"A\":4,\"a\":3,\"ab\":5,\"z\":1,\"\xc3\xa9\":2}");
}

Test(fingerprint, canonical_accepts_any_top_level_value)
{
    cr_expect_str_eq(canon(" 42 ", NULL, 0), "42");
    cr_expect_str_eq(canon("\"s\"", NULL, 0), "\"s\"");
    cr_expect_str_eq(canon("null", NULL, 0), "null");
}

Test(fingerprint, canonical_unifies_string_escapes)
{
    cr_expect_str_eq(canon("[\"\\u00e9\\/\"]", NULL, 0), "[\"\xc3\xa9/\"]");
    cr_expect_str_eq(canon("[\"\xc3\xa9/\"]", NULL, 0), "[\"\xc3\xa9/\"]");
}

/* ---- numbers: exact decimals ---- */

/* canon() of each of texts[0..n) is want. */
static void all_canon_to(const char *want, const char *const *texts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_expect_str_eq(canon(texts[i], NULL, 0), want, "[%s]", texts[i]);
}

Test(fingerprint, money_amounts_beyond_a_double_stay_apart)
{
    /* Both are the double 9007199254740992: through a binary float they
     * were one amount (docs/protocol.md section 4). */
    cr_expect_str_eq(canon("{\"amount\":9007199254740993.0}", NULL, 0),
                     "{\"amount\":9007199254740993}");
    cr_expect_str_eq(canon("{\"amount\":9007199254740992.0}", NULL, 0),
                     "{\"amount\":9007199254740992}");
    cr_expect_str_eq(canon("[0.1]", NULL, 0), "[0.1]");
    cr_expect_str_eq(canon("[0.10000000000000001]", NULL, 0), "[0.10000000000000001]");
    cr_expect_str_eq(canon("[123456789012345678901234567890.123456789]", NULL, 0),
                     "[1.23456789012345678901234567890123456789e+29]");
}

Test(fingerprint, money_amounts_beyond_a_double_fingerprint_apart)
{
    idem_fp_input_t a = req("POST", "/pay", "{\"amount\":9007199254740993.0}");
    idem_fp_input_t b = req("POST", "/pay", "{\"amount\":9007199254740992.0}");
    idem_fp_input_t c = req("POST", "/pay", "{\"amount\":9007199254740993}");
    a.body_json = b.body_json = c.body_json = 1;
    cr_expect_not(same(&a, &b));
    cr_expect(same(&a, &c));
}

Test(fingerprint, one_number_however_spelled)
{
    static const char *const one[] = {"1", "1.0", "1.000", "1e0", "1E0", "1e+0", "1e-0",
                                      "10e-1", "0.1e1", "100e-2", "0.00001e5", "1e00000",
                                      "0.0000000000000000000001e22"};
    static const char *const zero[] = {"0", "-0", "0.0", "-0.0", "0e5", "-0e-5", "0.000e99",
                                       "0e999999999999999999999999"};
    static const char *const half[] = {"0.5", "5e-1", "0.50", "50e-2", "0.05e1"};
    static const char *const big[] = {"1500", "1.5e3", "15e2", "1500.000", "0.15e4"};
    all_canon_to("1", one, sizeof one / sizeof *one);
    all_canon_to("0", zero, sizeof zero / sizeof *zero);
    all_canon_to("0.5", half, sizeof half / sizeof *half);
    all_canon_to("1500", big, sizeof big / sizeof *big);
}

Test(fingerprint, one_number_however_spelled_fingerprints_alike)
{
    idem_fp_input_t a = req("POST", "/a", "{\"n\":1}"), b = req("POST", "/a", "{\"n\":1.0}");
    idem_fp_input_t c = req("POST", "/a", "{\"n\":1e0}"), d = req("POST", "/a", "{\"n\":2}");
    a.body_json = b.body_json = c.body_json = d.body_json = 1;
    cr_expect(same(&a, &b));
    cr_expect(same(&a, &c));
    cr_expect_not(same(&a, &d));
}

Test(fingerprint, canonical_number_forms)
{
    /* ECMAScript's Number::toString layout, on the exact digits. */
    static const char *const cases[][2] = {
        {"123", "123"}, {"-123", "-123"}, {"-1.50", "-1.5"}, {"12345e-3", "12.345"},
        {"100000000000000000000", "100000000000000000000"},           /* k = 21 */
        {"1e20", "100000000000000000000"},
        {"123456789012345678901", "123456789012345678901"},           /* 21 digits */
        {"1e21", "1e+21"}, {"1234567890123456789012", "1.234567890123456789012e+21"},
        {"-9223372036854775808", "-9223372036854775808"},
        {"18446744073709551616", "18446744073709551616"},
        {"0.000001", "0.000001"}, {"0.0000001", "1e-7"}, {"1.5e-7", "1.5e-7"},
        {"0.00000123", "0.00000123"}, {"-0.0000012", "-0.0000012"},
        {"1.2345e25", "1.2345e+25"}, {"-7e-10", "-7e-10"}, {"4.2E+1", "42"},
        {"0.000123400", "0.0001234"}, {"120.0340", "120.034"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_expect_str_eq(canon(cases[i][0], NULL, 0), cases[i][1], "[%s]", cases[i][0]);
}

Test(fingerprint, canonical_numbers_are_a_fixed_point)
{
    static const char *const texts[] = {"1e+21", "1e-7", "1.5e-7", "0.000001", "-0.5",
                                        "100000000000000000000", "1.2345e+25", "12.345"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        cr_expect_str_eq(canon(texts[i], NULL, 0), texts[i]);
}

Test(fingerprint, long_digit_strings_are_kept_exactly)
{
    /* No digit is lost however many there are: 4000 sevens are an integer
     * of 4000 digits, written d.ddd e+3999; with a point after the first
     * they are plain. */
    static char text[4100], want[4100];
    memset(text, '7', 4000);
    text[4000] = '\0';
    want[0] = '7';
    want[1] = '.';
    memset(want + 2, '7', 3999);
    memcpy(want + 4001, "e+3999", 7);
    cr_expect_str_eq(canon(text, NULL, 0), want);
    want[4001] = '\0';
    cr_expect_str_eq(canon(want, NULL, 0), want);
    /* One digit changed far down is another number. */
    want[3000] = '8';
    cr_expect_str_eq(canon(want, NULL, 0), want);
    memcpy(text, want, 4002);
    want[3000] = '7';
    cr_expect_str_neq(canon(text, NULL, 0), want);
}

Test(fingerprint, huge_exponents_are_bounded)
{
    /* The exponent x of d.ddd x 10^x may be up to 10^18 - 1 either way. */
    cr_expect_str_eq(canon("1e999999999999999999", NULL, 0), "1e+999999999999999999");
    cr_expect_str_eq(canon("10e999999999999999998", NULL, 0), "1e+999999999999999999");
    cr_expect_str_eq(canon("-1e-999999999999999999", NULL, 0), "-1e-999999999999999999");
    cr_expect_str_eq(canon("0.1e-999999999999999998", NULL, 0), "1e-999999999999999999");
    cr_expect_str_eq(canon("1e0000000000000000000000000000001", NULL, 0), "10");
    not_json("1e1000000000000000000", 21);
    not_json("10e999999999999999999", 21);
    not_json("1e-1000000000000000000", 22);
    not_json("0.01e-999999999999999998", 24);
    not_json("1e99999999999999999999999999999999999999", 40);
    not_json("[1e-99999999999999999999999999999999999999]", 43);
}

Test(fingerprint, malformed_numbers_are_not_json)
{
    static const char *const bad[] = {"01", "-01", "00", "1.", "-1.", ".5", "-.5", "+1", "-",
                                      "1e", "1e+", "1E-", "1.e1", "1.5e", "NaN", "Infinity",
                                      "-Infinity", "0x10", "1_000", "1,5", "--1", "1e1.5",
                                      "[01]", "[1.]", "[.5]", "[+1]", "[-]", "{\"a\":01}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        not_json(bad[i], strlen(bad[i]));
}

/* ---- strings ---- */

Test(fingerprint, string_escapes_are_unified)
{
    static const char *const a[] = {"\"A\"", "\"\\u0041\"", "\"\\u0041\""};
    static const char *const slash[] = {"\"/\"", "\"\\/\"", "\"\\u002f\"", "\"\\u002F\""};
    static const char *const e_acute[] = {"\"\xc3\xa9\"", "\"\\u00e9\"", "\"\\u00E9\""};
    static const char *const emoji[] = {"\"\xf0\x9f\x98\x80\"", "\"\\ud83d\\ude00\"",
                                        "\"\\uD83D\\uDE00\""};
    all_canon_to("\"A\"", a, 3);
    all_canon_to("\"/\"", slash, 4);
    all_canon_to("\"\xc3\xa9\"", e_acute, 3);
    all_canon_to("\"\xf0\x9f\x98\x80\"", emoji, 3);
}

Test(fingerprint, string_escapes_have_one_canonical_form)
{
    /* The short escapes where JSON has one, \u00XX in upper case for the
     * other control characters, everything else as itself: DEL, U+2028. */
    cr_expect_str_eq(canon("\"\\u0008\\u000c\\u000A\\u000d\\u0009\"", NULL, 0),
                     "\"\\b\\f\\n\\r\\t\"");
    cr_expect_str_eq(canon("\"\\u0001\\u001f\\u001F\\u0000\"", NULL, 0),
                     "\"\\u0001\\u001F\\u001F\\u0000\"");
    cr_expect_str_eq(canon("\"\\u0022\\u005c\\\"\\\\\"", NULL, 0), "\"\\\"\\\\\\\"\\\\\"");
    cr_expect_str_eq(canon("\"\\u007f\\u2028\\u0020\"", NULL, 0), "\"\x7f\xe2\x80\xa8 \"");
}

Test(fingerprint, nul_is_an_ordinary_character)
{
    cr_expect_str_eq(canon("[\"a\\u0000b\"]", NULL, 0), "[\"a\\u0000b\"]");
    cr_expect_str_neq(canon("[\"a\\u0000b\"]", NULL, 0), "[\"a\"]");
}

Test(fingerprint, bad_strings_are_not_json)
{
    static const char *const bad[] = {
        "\"\\ud800\"",          /* a lone high surrogate */
        "\"\\udc00\"",          /* a lone low surrogate */
        "\"\\ud800\\u0041\"",   /* a high surrogate and no low one */
        "\"\\ud800\\ud800\"",
        "\"\\ud800x\"",
        "\"\\x41\"", "\"\\a\"", "\"\\'\"", "\"\\U0041\"", /* unknown escapes */
        "\"\\u12\"", "\"\\u12g4\"", "\"\\u\"",            /* short or bad \u */
        "\"\t\"", "\"a\nb\"", "\"\x1f\"",                 /* raw control characters */
        "\"abc", "\"\\\"", "'a'",                          /* unterminated, single quotes */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        not_json(bad[i], strlen(bad[i]));
    not_json("[\"a\0b\"]", 7);
}

Test(fingerprint, invalid_utf8_is_not_json)
{
    static const char *const bad[] = {
        "\"\xff\"", "\"\xfe\"", "\"\x80\"", "\"\xbf\"",  /* never a first byte, stray */
        "\"\xc0\xaf\"", "\"\xc1\xbf\"",                     /* overlong 2 bytes */
        "\"\xe0\x80\xaf\"", "\"\xe0\x9f\xbf\"",             /* overlong 3 bytes */
        "\"\xf0\x80\x80\xaf\"", "\"\xf0\x8f\xbf\xbf\"",     /* overlong 4 bytes */
        "\"\xed\xa0\x80\"", "\"\xed\xbf\xbf\"",             /* UTF-16 surrogates */
        "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"",     /* beyond U+10FFFF */
        "\"\xc3\"", "\"\xe2\x82\"", "\"\xf0\x9f\x98\"",     /* truncated */
        "\"\xc3\x28\"", "\"\xe2\x28\xa1\"",                 /* bad continuation */
        "{\"\xc3\":1}",                                     /* in a key */
        "\xc3\xa9", "[1]\xc2\xa0",                           /* outside strings */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        not_json(bad[i], strlen(bad[i]));
}

Test(fingerprint, valid_utf8_edges_are_kept)
{
    static const char *const ok[] = {"\"\xc2\x80\"", "\"\xdf\xbf\"", "\"\xe0\xa0\x80\"",
                                     "\"\xed\x9f\xbf\"", "\"\xee\x80\x80\"", "\"\xef\xbf\xbf\"",
                                     "\"\xf0\x90\x80\x80\"", "\"\xf4\x8f\xbf\xbf\""};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        cr_expect_str_eq(canon(ok[i], NULL, 0), ok[i]);
}

/* ---- keys, white space, structure ---- */

Test(fingerprint, keys_sort_by_their_decoded_bytes)
{
    cr_expect_str_eq(canon("{\"\\u0062\":1,\"a\":2,\"\\u00e9\":3,\"z\":4,\"\\u0041\":5}", NULL, 0),
                     "{\"A\":5,\"a\":2,\"b\":1,\"z\":4,\"\xc3\xa9\":3}");
    /* A shorter key first; the escaped spelling sorts where its decoding does. */
    cr_expect_str_eq(canon("{\"ab\":1,\"a\\u0062c\":2,\"a\":3}", NULL, 0),
                     "{\"a\":3,\"ab\":1,\"abc\":2}");
    /* Code-point order, which UTF-8 byte order is: U+FFFF before U+10000. */
    cr_expect_str_eq(canon("{\"\\ud800\\udc00\":1,\"\\uffff\":2}", NULL, 0),
                     "{\"\xef\xbf\xbf\":2,\"\xf0\x90\x80\x80\":1}");
}

Test(fingerprint, many_keys_sort)
{
    /* Enough members for the merge sort to take several rounds, given in
     * reverse; the order written is ascending. */
    char text[8192], want[8192];
    size_t t = 0, w = 0;
    text[t++] = '{';
    want[w++] = '{';
    for (int i = 299; i >= 0; i--)
        t += (size_t)snprintf(text + t, sizeof text - t, "%s\"k%03d\":%d", i < 299 ? "," : "", i,
                              i);
    for (int i = 0; i < 300; i++)
        w += (size_t)snprintf(want + w, sizeof want - w, "%s\"k%03d\":%d", i ? "," : "", i, i);
    memcpy(text + t, "}", 2);
    memcpy(want + w, "}", 2);
    cr_expect_str_eq(canon(text, NULL, 0), want);
}

Test(fingerprint, duplicate_keys_are_not_json)
{
    not_json("{\"a\":1,\"a\":2}", 13);
    not_json("{\"x\":{\"a\":1,\"a\":1}}", 19);
    not_json("{\"a\":1,\"\\u0061\":2}", 18); /* one key once decoded */
    not_json("{\"\":1,\"\":1}", 11);
    not_json("[{\"a\":1},{\"b\":1,\"c\":2,\"b\":3}]", 29);
}

Test(fingerprint, duplicate_keys_among_many_are_not_json)
{
    char text[8192];
    size_t t = 0;
    text[t++] = '{';
    for (int i = 0; i < 300; i++)
        t += (size_t)snprintf(text + t, sizeof text - t, "%s\"k%03d\":%d", i ? "," : "", i, i);
    t += (size_t)snprintf(text + t, sizeof text - t, ",\"k150\":0}");
    not_json(text, t);
}

Test(fingerprint, duplicate_keys_never_merge_payloads)
{
    /* JSON.parse reads the first as {"a":2}, some parsers as {"a":1}: hashed
     * raw, none of these is the same request as another. */
    idem_fp_input_t a = req("POST", "/a", "{\"a\":1,\"a\":2}");
    idem_fp_input_t b = req("POST", "/a", "{\"a\":2,\"a\":1}");
    idem_fp_input_t c = req("POST", "/a", "{\"a\":2}");
    idem_fp_input_t d = req("POST", "/a", "{\"a\":1}");
    idem_fp_input_t e = req("POST", "/a", "{\"a\":1, \"a\":2}");
    const char *ignore[] = {"/a"};
    a.body_json = b.body_json = c.body_json = d.body_json = e.body_json = 1;
    cr_expect_not(same(&a, &b));
    cr_expect_not(same(&a, &c));
    cr_expect_not(same(&a, &d));
    cr_expect_not(same(&b, &c));
    cr_expect_not(same(&a, &e));
    /* Ignoring the key does not make it JSON either. */
    a.ignore = b.ignore = ignore;
    a.n_ignore = b.n_ignore = 1;
    cr_expect_not(same(&a, &b));
}

Test(fingerprint, only_json_white_space_is_insignificant)
{
    cr_expect_str_eq(canon(" \t\r\n[ \t\r\n1 \t\r\n, \t\r\n{ \"a\" \n: 2 } ] \t\r\n", NULL, 0),
                     "[1,{\"a\":2}]");
    not_json("[1,\f2]", 6);
    not_json("[1,\v2]", 6);
    not_json("[1,\xc2\xa0" "2]", 7); /* U+00A0 */
    not_json("\xef\xbb\xbf[1]", 6);     /* a byte order mark */
    not_json("", 0);
    not_json(" ", 1);
    not_json("\n\t", 2);
}

Test(fingerprint, malformed_structure_is_not_json)
{
    static const char *const bad[] = {
        "[", "]", "{", "}", "[1", "[1,", "[1,]", "[,1]", "[1 2]", "{\"a\"}", "{\"a\":}",
        "{\"a\" 1}", "{\"a\":1,}", "{,}", "{1:1}", "{a:1}", "{'a':1}", "{\"a\":1 \"b\":2}",
        "[1]]", "[1]x", "1 2", "[] []", "tru", "truex", "nul", "False", "NULL",
        "/* c */ 1", "1 // c", "[1]\0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        not_json(bad[i], strlen(bad[i]) + (i + 1 == sizeof bad / sizeof *bad));
}

Test(fingerprint, any_value_may_stand_at_the_top)
{
    cr_expect_str_eq(canon(" true ", NULL, 0), "true");
    cr_expect_str_eq(canon("false", NULL, 0), "false");
    cr_expect_str_eq(canon("-1.5e1", NULL, 0), "-15");
    cr_expect_str_eq(canon("[]", NULL, 0), "[]");
    cr_expect_str_eq(canon("{ }", NULL, 0), "{}");
}

Test(fingerprint, nesting_to_the_limit_accepted)
{
    char text[200];
    memset(text, '[', IDEM_JSON_MAX_DEPTH);
    memset(text + IDEM_JSON_MAX_DEPTH, ']', IDEM_JSON_MAX_DEPTH);
    text[2 * IDEM_JSON_MAX_DEPTH] = '\0';
    cr_expect_str_eq(canon(text, NULL, 0), text);
}

Test(fingerprint, nesting_beyond_the_limit_refused)
{
    char text[200];
    memset(text, '[', IDEM_JSON_MAX_DEPTH + 1);
    memset(text + IDEM_JSON_MAX_DEPTH + 1, ']', IDEM_JSON_MAX_DEPTH + 1);
    not_json(text, 2 * (IDEM_JSON_MAX_DEPTH + 1));
}

Test(fingerprint, brackets_inside_strings_do_not_count_as_nesting)
{
    char text[200];
    text[0] = '"';
    memset(text + 1, '[', 100);
    memcpy(text + 101, "\\\"\"", 4);
    cr_expect_str_eq(canon(text, NULL, 0), text);
}

Test(fingerprint, ignore_top_level_member)
{
    const char *ig[] = {"/t"};
    cr_expect_str_eq(canon("{\"t\":1,\"a\":2}", ig, 1), "{\"a\":2}");
}

Test(fingerprint, ignore_nested_member)
{
    const char *ig[] = {"/meta/request_id"};
    cr_expect_str_eq(canon("{\"meta\":{\"request_id\":\"r1\",\"v\":1},\"request_id\":5}", ig, 1),
                     "{\"meta\":{\"v\":1},\"request_id\":5}");
}

Test(fingerprint, ignore_array_element)
{
    const char *ig[] = {"/items/1"};
    cr_expect_str_eq(canon("{\"items\":[\"a\",\"b\",\"c\"]}", ig, 1), "{\"items\":[\"a\",\"c\"]}");
}

Test(fingerprint, ignore_member_inside_array_element)
{
    const char *ig[] = {"/items/0/ts"};
    cr_expect_str_eq(canon("[0]", NULL, 0), "[0]");
    cr_expect_str_eq(canon("{\"items\":[{\"ts\":1,\"id\":7},{\"ts\":2}]}", ig, 1),
                     "{\"items\":[{\"id\":7},{\"ts\":2}]}");
}

Test(fingerprint, ignore_several_array_elements_by_original_index)
{
    const char *ig[] = {"/0", "/2", "/2"};
    const char *rev[] = {"/2", "/0"};
    cr_expect_str_eq(canon("[10,11,12,13]", ig, 3), "[11,13]");
    cr_expect_str_eq(canon("[10,11,12,13]", rev, 2), "[11,13]");
}

Test(fingerprint, ignore_unescapes_tilde_one_as_slash)
{
    const char *ig[] = {"/a~1b"};
    cr_expect_str_eq(canon("{\"a/b\":1,\"a\":{\"b\":2}}", ig, 1), "{\"a\":{\"b\":2}}");
}

Test(fingerprint, ignore_unescapes_tilde_zero_as_tilde)
{
    const char *ig[] = {"/m~0n", "/~01"};
    cr_expect_str_eq(canon("{\"m~n\":1,\"~1\":2,\"/\":3,\"x\":4}", ig, 2), "{\"/\":3,\"x\":4}");
}

Test(fingerprint, ignore_empty_token_names_the_empty_key)
{
    const char *ig[] = {"/"};
    cr_expect_str_eq(canon("{\"\":1,\"a\":2}", ig, 1), "{\"a\":2}");
}

Test(fingerprint, ignore_pointer_naming_nothing_is_skipped)
{
    const char *ig[] = {"/nope", "/a/b/c", "/arr/9", "/arr/-", "/arr/x", "/arr/01", "/s/0"};
    const char *doc = "{\"a\":{\"b\":1},\"arr\":[1,2],\"s\":\"str\"}";
    cr_expect_str_eq(canon(doc, ig, 7), "{\"a\":{\"b\":1},\"arr\":[1,2],\"s\":\"str\"}");
}

Test(fingerprint, ignore_whole_document_pointer_is_skipped)
{
    const char *ig[] = {""};
    cr_expect_str_eq(canon("{\"a\":1}", ig, 1), "{\"a\":1}");
}

Test(fingerprint, ignore_malformed_pointer_is_skipped)
{
    const char *ig[] = {"a", "/a~2", "/a~"};
    cr_expect_str_eq(canon("{\"a\":1,\"a~2\":2,\"a~\":3}", ig, 3), "{\"a\":1,\"a~\":3,\"a~2\":2}");
}

Test(fingerprint, ignore_parent_and_child_together)
{
    const char *ig[] = {"/a/b", "/a"};
    cr_expect_str_eq(canon("{\"a\":{\"b\":1},\"c\":2}", ig, 2), "{\"c\":2}");
}

Test(fingerprint, ignore_huge_array_index_names_nothing)
{
    const char *ig[] = {"/99999999999999999999999999"};
    cr_expect_str_eq(canon("[1]", ig, 1), "[1]");
}

Test(fingerprint, ignore_matches_keys_once_decoded)
{
    const char *ig[] = {"/a~1b", "/\xc3\xa9"};
    cr_expect_str_eq(canon("{\"a\\/b\":1,\"\\u00e9\":2,\"c\":3}", ig, 2), "{\"c\":3}");
}

Test(fingerprint, ignore_in_sorted_and_single_member_objects)
{
    /* Objects of one member are read in place, of more through their
     * sorted members: a pointer finds its member in both. */
    const char *ig[] = {"/z/only", "/m/y", "/m/0"};
    cr_expect_str_eq(canon("{\"z\":{\"only\":1},\"m\":{\"y\":1,\"x\":2,\"0\":3},\"a\":[]}", ig, 3),
                     "{\"a\":[],\"m\":{\"x\":2},\"z\":{}}");
}

Test(fingerprint, ignore_every_member_or_element_leaves_it_empty)
{
    const char *ig[] = {"/o/a", "/o/b", "/l/0", "/l/1", "/l/2"};
    cr_expect_str_eq(canon("{\"o\":{\"a\":1,\"b\":2},\"l\":[1,2,3],\"k\":0}", ig, 5),
                     "{\"k\":0,\"l\":[],\"o\":{}}");
}

Test(fingerprint, ignore_object_key_that_looks_like_an_index)
{
    const char *ig[] = {"/0", "/01"};
    cr_expect_str_eq(canon("{\"0\":1,\"01\":2,\"1\":3}", ig, 2), "{\"1\":3}");
}

Test(fingerprint, ignore_many_pointers_through_one_array)
{
    /* Every pointer goes through the same array: it is walked once for
     * all of them, and each drops its own element. */
    const char *ig[] = {"/a/5/x", "/a/1", "/a/5/y", "/a/3/0", "/a/1/q", "/a/7"};
    cr_expect_str_eq(canon("{\"a\":[0,1,2,[30,31],4,{\"x\":1,\"y\":2,\"z\":3},6,7,8]}", ig, 6),
                     "{\"a\":[0,2,[31],4,{\"z\":3},6,8]}");
}

Test(fingerprint, ignore_values_with_escapes_and_numbers)
{
    /* What a dropped value would have written is taken off the canonical
     * length exactly, whatever it holds. */
    const char *ig[] = {"/s", "/n", "/o"};
    cr_expect_str_eq(canon("{\"s\":\"\\u00e9\\n\\/\",\"n\":1.0e1,"
                           "\"o\":{\"\\u0062\":[1e30],\"a\":0},\"k\":\"\\u0041\"}", ig, 3),
                     "{\"k\":\"A\"}");
}

Test(fingerprint, deep_objects_to_the_limit)
{
    char text[2048], want[2048];
    size_t t = 0, w = 0;
    for (int i = 0; i < IDEM_JSON_MAX_DEPTH; i++) {
        t += (size_t)snprintf(text + t, sizeof text - t, "{ \"b\" : 1 , \"a\" :");
        w += (size_t)snprintf(want + w, sizeof want - w, "{\"a\":");
    }
    t += (size_t)snprintf(text + t, sizeof text - t, "null");
    w += (size_t)snprintf(want + w, sizeof want - w, "null");
    for (int i = 0; i < IDEM_JSON_MAX_DEPTH; i++) {
        text[t++] = '}';
        w += (size_t)snprintf(want + w, sizeof want - w, ",\"b\":1}");
    }
    text[t] = '\0';
    cr_expect_str_eq(canon(text, NULL, 0), want);
    /* One more level is not JSON. */
    memmove(text + 1, text, t + 1);
    text[0] = '[';
    memcpy(text + t + 1, "]", 2);
    not_json(text, t + 2);
}

/* ---- the cost of a document ---- */

/* The text of n copies of unit joined by sep inside open/close. */
static char *repeat(const char *open, const char *unit, const char *sep, const char *close,
                    size_t n, size_t *len)
{
    size_t lu = strlen(unit), ls = strlen(sep), lo = strlen(open), lc = strlen(close);
    char *t = malloc(lo + n * (lu + ls) + lc + 1);
    size_t at = 0;
    cr_assert_not_null(t);
    memcpy(t, open, lo);
    at = lo;
    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            memcpy(t + at, sep, ls);
            at += ls;
        }
        memcpy(t + at, unit, lu);
        at += lu;
    }
    memcpy(t + at, close, lc + 1);
    *len = at + lc;
    return t;
}

static size_t memory_of(const char *text, size_t len)
{
    idem__json_t *doc = NULL;
    size_t m;
    cr_assert_eq(idem__json_parse(text, len, NULL, 0, &doc), IDEM_OK);
    m = idem__json_memory(doc);
    idem__json_destroy(doc);
    return m;
}

/* A full binary tree of objects of two members, depth levels, into t. */
static size_t binary_tree(char *t, int depth)
{
    size_t at = 0;
    if (depth == 0) {
        t[0] = '0';
        return 1;
    }
    memcpy(t, "{\"\":", 4);
    at = 4 + binary_tree(t + 4, depth - 1);
    memcpy(t + at, ",\"a\":", 5);
    at += 5 + binary_tree(t + at + 5, depth - 1);
    t[at] = '}';
    return at + 1;
}

Test(fingerprint, memory_stays_under_its_bound)
{
    /* The shapes that cost the most for their size: small objects of two
     * members, alone, nested and as members of one big object, and one
     * object of many short keys.  json.c states at most 2.25 bytes of
     * tables a byte of text (a binary tree of such objects comes near). */
    static const char *const shapes[][4] = {
        {"[", "{\"\":0,\"a\":0}", ",", "]"},
        {"[", "{\"\":{\"\":0,\"a\":0},\"a\":{\"\":0,\"a\":0}}", ",", "]"},
        {"[", "{\"a\":[],\"b\":[]}", ",", "]"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        size_t len;
        char *t = repeat(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 20000, &len);
        size_t m = memory_of(t, len);
        cr_expect_leq(m * 4, 9 * len + 4096, "shape %zu: %zu bytes for %zu", i, m, len);
        free(t);
    }
    char *tree = malloc(1 << 20);
    cr_assert_not_null(tree);
    size_t tree_len = binary_tree(tree, 15);
    size_t tm = memory_of(tree, tree_len);
    cr_expect_leq(tm * 4, 9 * tree_len + 4096, "tree: %zu bytes for %zu", tm, tree_len);
    cr_expect_geq(tm * 2, 4 * tree_len, "tree: %zu bytes for %zu: the worst case moved", tm,
                  tree_len);
    free(tree);
    /* One object of 100000 distinct keys, each as short as can be. */
    char *big = malloc(100000 * 12 + 16);
    size_t at = 0;
    cr_assert_not_null(big);
    big[at++] = '{';
    for (int i = 0; i < 100000; i++)
        at += (size_t)snprintf(big + at, 16, "%s\"%x\":0", i ? "," : "", (unsigned)i);
    big[at++] = '}';
    size_t m = memory_of(big, at);
    cr_expect_leq(m * 4, 9 * at + 4096, "big object: %zu bytes for %zu", m, at);
    free(big);
}

Test(fingerprint, memory_of_empty_objects_is_only_their_bitmap)
{
    /* The body that took jansson 800 MiB: [{},{},...], 1 MiB of it here.
     * Nothing to sort, so only the bit per object (len/16) is allocated. */
    size_t len;
    char *t = repeat("[", "{}", ",", "]", 350000, &len);
    size_t m = memory_of(t, len);
    cr_expect_leq(m, len / 16 + 1024, "%zu bytes for %zu", m, len);
    free(t);
}

Test(fingerprint, a_large_document_fingerprints)
{
    /* 4 MiB through the fingerprint, and the same document with its members
     * reordered and spaced out fingerprints alike. */
    size_t la, lb;
    char *a = repeat("[", "{\"id\":12,\"amount\":\"10.50\",\"tags\":[\"x\",\"y\"],\"ok\":true}",
                     ",", "]", 70000, &la);
    char *b = repeat("[ ", "{ \"ok\" : true , \"tags\" : [ \"x\" , \"y\" ] , \"amount\" : "
                     "\"10.50\" , \"id\" : 1.2e1 }", " , ", " ]", 70000, &lb);
    idem_fp_input_t x = req("POST", "/a", a), y = req("POST", "/a", b);
    x.body_json = y.body_json = 1;
    cr_expect(same(&x, &y));
    free(a);
    free(b);
}

Test(fingerprint, canonicalize_survives_every_allocation_failure)
{
    const char *ig[] = {"/b/1", "/c/d"};
    const char *text = "{\"c\":{\"d\":1,\"e\":\"x\"},\"b\":[1,2,3],\"a\":[true,null]}";
    for (long n = 1;; n++) {
        char *out = NULL;
        size_t len = 0;
        idem_alloc_fail_after(n);
        idem_err_t err = idem_json_canonicalize(text, strlen(text), ig, 2, &out, &len);
        idem_alloc_fail_after(0);
        if (err == IDEM_OK) {
            cr_expect_str_eq(out, "{\"a\":[true,null],\"b\":[1,3],\"c\":{\"e\":\"x\"}}");
            idem_free(out);
            break;
        }
        cr_assert_eq(err, IDEM_E_NOMEM, "n=%ld: %s", n, idem_err_name(err));
        cr_assert_null(out);
        cr_assert_lt(n, 1000);
    }
}

Test(fingerprint, pointer_validity)
{
    cr_expect(idem_json_pointer_valid(""));
    cr_expect(idem_json_pointer_valid("/"));
    cr_expect(idem_json_pointer_valid("/a/0/~0~1"));
    cr_expect_not(idem_json_pointer_valid(NULL));
    cr_expect_not(idem_json_pointer_valid("a"));
    cr_expect_not(idem_json_pointer_valid("/a~"));
    cr_expect_not(idem_json_pointer_valid("/a~2"));
}

/* ---- hex ---- */

Test(fingerprint, sha256_hex_of_known_input)
{
    char hex[65];
    idem_sha256_hex("abc", 3, hex);
    cr_expect_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    idem_sha256_hex(NULL, 0, hex);
    cr_expect_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

Test(fingerprint, fp_hex_is_lowercase_and_ordered)
{
    uint8_t fpv[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    for (int i = 0; i < IDEM_FP_LEN; i++)
        fpv[i] = (uint8_t)(i * 8 + 0x0A);
    idem_fp_hex(fpv, hex);
    cr_expect_eq(strlen(hex), 2 * IDEM_FP_LEN);
    cr_expect_eq(strncmp(hex, "0a121a222a323a42", 16), 0, "%s", hex);
    cr_expect_str_eq(hex + 60, "fa02");
}
