/* tests/unit/test_fingerprint.c - fingerprints and canonical JSON
 * (src/core/fingerprint.c).
 *
 * What must be equal is equal (the same request; reordered or re-spaced JSON;
 * ignored members; header names in any case) and what must differ differs
 * (any field; field boundaries; absent versus empty header).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

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
static char canon_buf[4096];
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
     *   J"{\"a\":[1.0],\"b\":1}"
     * each as tag, 8-byte big-endian length, bytes.  Changing the encoding
     * changes every stored fingerprint: this value moves only on purpose. */
    idem_fp_header_t hs[2] = {{"X-Tenant", 8, "acme", 4}, {"X-Absent", 8, NULL, 0}};
    idem_fp_input_t in = req("POST", "/a?b=1", "{ \"b\": 1, \"a\": [1.0] }");
    uint8_t out[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    in.headers = hs;
    in.n_headers = 2;
    in.body_json = 1;
    fp(&in, out);
    idem_fp_hex(out, hex);
    cr_expect_str_eq(hex, "2ed81307765f340e3a0a3aa97a04a3b9d6c7faf3235de229ca79a706dd88d0ce");
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

Test(fingerprint, canonical_keeps_integer_and_real_apart)
{
    cr_expect_str_eq(canon("[1, 1.0, 1.00, 1e0, 100e-2]", NULL, 0), "[1,1.0,1.0,1.0,1.0]");
}

Test(fingerprint, canonical_reals_round_trip)
{
    cr_expect_str_eq(canon("[0.1]", NULL, 0), canon("[0.10000000000000001]", NULL, 0));
}

Test(fingerprint, not_json_is_refused)
{
    not_json("", 0);
    not_json("{", 1);
    not_json("{\"a\":1}x", 8);
    not_json("{'a':1}", 7);
    not_json("[1,]", 4);
    not_json("{\"a\":1} {\"a\":1}", 15);
}

Test(fingerprint, duplicate_keys_are_not_json)
{
    not_json("{\"a\":1,\"a\":2}", 13);
    not_json("{\"x\":{\"a\":1,\"a\":1}}", 19);
}

Test(fingerprint, nul_and_bad_utf8_are_not_json)
{
    not_json("[\"\\u0000\"]", 10);
    not_json("[\"a\0b\"]", 7);
    not_json("[\"\xff\"]", 5);
}

Test(fingerprint, number_beyond_range_is_not_json)
{
    not_json("[99999999999999999999]", 22);
    not_json("[1e400]", 7);
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
