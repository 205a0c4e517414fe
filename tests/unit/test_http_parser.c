/* tests/unit/test_http_parser.c - the head parser of src/http/parser.c:
 * request and status lines, field syntax, limits (431), framing and the
 * smuggling refusals, persistence flags, hop-by-hop names, and incremental
 * parsing: every split point of whole messages (with bodies, pipelined) gives
 * the same result as parsing them at once. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

static idem_http_msg_t msg;

static int req_n(const char *s, size_t n)
{
    idem_http_head_state_t st = {0};
    return idem__http_parse_request(&st, s, n, IDEM_HTTP_MAX_HEAD, &msg);
}

static int req(const char *s)
{
    return req_n(s, strlen(s));
}

static int resp_to(const char *s, const char *method)
{
    idem_http_head_state_t st = {0};
    return idem__http_parse_response(&st, s, strlen(s), IDEM_HTTP_MAX_HEAD,
                                     (idem_slice_t){method, strlen(method)}, &msg);
}

static int resp(const char *s)
{
    return resp_to(s, "GET");
}

static bool slice_is(idem_slice_t s, const char *str)
{
    return s.len == strlen(str) && memcmp(s.ptr, str, s.len) == 0;
}

static void req_is(const char *s, int want)
{
    int rc = req(s);
    cr_expect_eq(rc, want, "request %s: got %d, want %d", s, rc, want);
}

#define SMUGGLE IDEM_HTTP_E_SMUGGLE
#define BAD IDEM_HTTP_E_BAD

/* ---- request line ------------------------------------------------------ */

Test(http_parser, request_line_parsed)
{
    const char *s = "POST /pay?x=1 HTTP/1.1\r\nHost: a\r\n\r\n";
    cr_assert_eq(req(s), (int)strlen(s));
    cr_expect(slice_is(msg.method, "POST"));
    cr_expect(slice_is(msg.target, "/pay?x=1"));
    cr_expect_eq(msg.version_minor, 1);
    cr_expect_eq(msg.head_len, strlen(s));
    cr_expect_eq(msg.n_fields, 1);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
}

Test(http_parser, method_must_be_token)
{
    req_is("GE(T / HTTP/1.1\r\n\r\n", BAD);
    req_is("G@T / HTTP/1.1\r\n\r\n", BAD);
    req_is(" / HTTP/1.1\r\n\r\n", BAD);
    req_is("M-SEARCH / HTTP/1.1\r\n\r\n", (int)strlen("M-SEARCH / HTTP/1.1\r\n\r\n"));
}

Test(http_parser, separators_are_single_spaces)
{
    req_is("GET  / HTTP/1.1\r\n\r\n", BAD);
    req_is("GET /  HTTP/1.1\r\n\r\n", BAD);
    req_is("GET\t/ HTTP/1.1\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1 \r\n\r\n", BAD);
    req_is("GET /\r\n\r\n", BAD);
}

Test(http_parser, target_visible_ascii_only)
{
    req_is("GET /a\x01 HTTP/1.1\r\n\r\n", BAD);
    req_is("GET /\xc3\xa9 HTTP/1.1\r\n\r\n", BAD);
    req_is("GET /a\x7f HTTP/1.1\r\n\r\n", BAD);
}

Test(http_parser, target_forms)
{
    const char *abs = "GET http://example.com/x HTTP/1.1\r\n\r\n";
    cr_expect_eq(req(abs), (int)strlen(abs));
    cr_expect(slice_is(msg.target, "http://example.com/x"));
    const char *star = "OPTIONS * HTTP/1.1\r\n\r\n";
    cr_expect_eq(req(star), (int)strlen(star));
    const char *auth = "CONNECT example.com:443 HTTP/1.1\r\n\r\n";
    cr_expect_eq(req(auth), (int)strlen(auth));
    req_is("GET * HTTP/1.1\r\n\r\n", BAD);
    req_is("GET relative HTTP/1.1\r\n\r\n", BAD);
    req_is("GET ?q HTTP/1.1\r\n\r\n", BAD);
}

Test(http_parser, version_1_0)
{
    cr_assert_gt(req("GET / HTTP/1.0\r\n\r\n"), 0);
    cr_expect_eq(msg.version_minor, 0);
}

Test(http_parser, other_version_is_e_version)
{
    req_is("GET / HTTP/2.0\r\n\r\n", IDEM_HTTP_E_VERSION);
    req_is("GET / HTTP/1.2\r\n\r\n", IDEM_HTTP_E_VERSION);
    req_is("GET / HTTP/0.9\r\n\r\n", IDEM_HTTP_E_VERSION);
}

Test(http_parser, garbage_version_is_bad)
{
    req_is("GET / http/1.1\r\n\r\n", BAD);
    req_is("GET / HTTP/1\r\n\r\n", BAD);
    req_is("GET / HTTP/1.10\r\n\r\n", BAD);
    req_is("GET / HTTP/a.b\r\n\r\n", BAD);
    req_is("GET / FOO\r\n\r\n", BAD);
}

Test(http_parser, two_leading_empty_lines_skipped)
{
    const char *s = "\r\n\nGET / HTTP/1.1\r\n\r\n";
    cr_assert_eq(req(s), (int)strlen(s));
    cr_expect(slice_is(msg.method, "GET"));
}

Test(http_parser, three_leading_empty_lines_refused)
{
    req_is("\r\n\r\n\r\nGET / HTTP/1.1\r\n\r\n", BAD);
}

Test(http_parser, incomplete_head)
{
    req_is("GET / HTTP/1.1\r\nHost: a\r\n", IDEM_HTTP_INCOMPLETE);
    req_is("GET / HTTP/1.1\r\nHost: a\r\n\r", IDEM_HTTP_INCOMPLETE);
    req_is("", IDEM_HTTP_INCOMPLETE);
    req_is("\r\n", IDEM_HTTP_INCOMPLETE);
}

/* ---- field lines ------------------------------------------------------- */

Test(http_parser, field_value_ows_trimmed)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-A: \t a b \t \r\nX-B:c\r\nX-C:   \r\n\r\n"), 0);
    cr_assert_eq(msg.n_fields, 3);
    cr_expect(slice_is(msg.fields[0].name, "X-A"));
    cr_expect(slice_is(msg.fields[0].value, "a b"));
    cr_expect(slice_is(msg.fields[1].value, "c"));
    cr_expect(slice_is(msg.fields[2].value, ""));
}

Test(http_parser, obs_fold_refused)
{
    req_is("GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n", BAD);
}

Test(http_parser, first_field_starting_with_space_refused)
{
    req_is("POST / HTTP/1.1\r\n Content-Length: 5\r\n\r\nhello", BAD);
}

Test(http_parser, space_before_colon_refused)
{
    req_is("GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A\t: 5\r\n\r\n", BAD);
}

Test(http_parser, field_name_must_be_token)
{
    req_is("GET / HTTP/1.1\r\n: empty\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX(A): 1\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nno colon\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX\xc3\xa9: 1\r\n\r\n", BAD);
}

Test(http_parser, nul_refused)
{
    static const char v[] = "GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n";
    cr_expect_eq(req_n(v, sizeof v - 1), BAD);
    static const char n[] = "GET / HTTP/1.1\r\nX\0A: ab\r\n\r\n";
    cr_expect_eq(req_n(n, sizeof n - 1), BAD);
    static const char t[] = "GET /\0 HTTP/1.1\r\n\r\n";
    cr_expect_eq(req_n(t, sizeof t - 1), BAD);
}

Test(http_parser, control_chars_in_value_refused)
{
    req_is("GET / HTTP/1.1\r\nX-A: a\x01" "b\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A: a\x7f\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A: a\x0b" "5\r\n\r\n", BAD);
}

Test(http_parser, htab_inside_value_kept)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-A: a\tb\r\n\r\n"), 0);
    cr_expect(slice_is(msg.fields[0].value, "a\tb"));
}

Test(http_parser, obs_text_in_value_allowed)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-A: caf\xc3\xa9\xff\r\n\r\n"), 0);
    cr_expect(slice_is(msg.fields[0].value, "caf\xc3\xa9\xff"));
}

Test(http_parser, bare_cr_refused)
{
    req_is("GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A: a\r\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\rX-A: a\r\n\r\n", BAD);
    req_is("GET / HTTP/1.1\r\nX-A: a\r\n\r\r\n\r\n", BAD);
    req_is("\rGET / HTTP/1.1\r\n\r\n", BAD);
    req_is("GET /\r HTTP/1.1\r\n\r\n", BAD);
}

Test(http_parser, bare_lf_accepted)
{
    const char *s = "POST / HTTP/1.1\nHost: a\nContent-Length: 3\n\nabc";
    cr_assert_eq(req(s), (int)strlen(s) - 3);
    cr_expect_eq(msg.n_fields, 2);
    cr_expect(slice_is(msg.fields[0].value, "a"));
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_LENGTH);
    cr_expect_eq(msg.content_length, 3);
}

Test(http_parser, mixed_line_endings_accepted)
{
    const char *s = "GET / HTTP/1.1\nA: 1\r\nB: 2\n\r\n";
    cr_assert_eq(req(s), (int)strlen(s));
    cr_expect(slice_is(msg.fields[1].value, "2"));
}

Test(http_parser, second_host_refused)
{
    req_is("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", BAD);
}

Test(http_parser, find_and_count_ignore_case)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-Tag: 1\r\nx-tag: 2\r\nOther: 3\r\n\r\n"), 0);
    const idem_http_field_t *f = idem__http_find(&msg, "X-TAG");
    cr_assert_not_null(f);
    cr_expect(slice_is(f->value, "1"));
    cr_expect_eq(idem__http_count(&msg, "x-Tag"), 2);
    cr_expect_eq(idem__http_count(&msg, "missing"), 0);
    cr_expect_null(idem__http_find(&msg, "missing"));
}

Test(http_parser, slice_eq_ci)
{
    const char *s = "Content-LENGTH";
    cr_expect(idem__slice_eq_ci((idem_slice_t){s, strlen(s)}, "content-length"));
    cr_expect_not(idem__slice_eq_ci((idem_slice_t){s, 7}, "content-length"));
    cr_expect(idem__slice_eq_ci((idem_slice_t){s, 0}, ""));
}

/* ---- limits ------------------------------------------------------------ */

/* A request head of exactly n bytes: padding in one field. */
static char *head_of(size_t n)
{
    const char *pre = "GET / HTTP/1.1\r\nX-Pad: ";
    const char *post = "\r\n\r\n";
    size_t fixed = strlen(pre) + strlen(post);
    cr_assert_geq(n, fixed);
    char *s = malloc(n + 1);
    cr_assert_not_null(s);
    memcpy(s, pre, strlen(pre));
    memset(s + strlen(pre), 'a', n - fixed);
    memcpy(s + n - strlen(post), post, strlen(post) + 1);
    return s;
}

Test(http_parser, head_at_limit_accepted)
{
    char *s = head_of(IDEM_HTTP_MAX_HEAD);
    cr_expect_eq(req(s), IDEM_HTTP_MAX_HEAD);
    free(s);
}

Test(http_parser, head_over_limit_refused)
{
    char *s = head_of(IDEM_HTTP_MAX_HEAD + 1);
    cr_expect_eq(req(s), IDEM_HTTP_E_HEAD_TOO_LARGE);
    free(s);
}

Test(http_parser, incomplete_head_over_limit_refused_at_once)
{
    char *s = head_of(IDEM_HTTP_MAX_HEAD + 100);
    /* no blank line yet, but already more than the limit */
    cr_expect_eq(req_n(s, IDEM_HTTP_MAX_HEAD + 1), IDEM_HTTP_E_HEAD_TOO_LARGE);
    cr_expect_eq(req_n(s, IDEM_HTTP_MAX_HEAD - 1), IDEM_HTTP_INCOMPLETE);
    free(s);
}

Test(http_parser, caller_limit_honoured)
{
    const char *s = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    idem_http_head_state_t st = {0};
    size_t n = strlen(s);
    cr_expect_eq(idem__http_parse_request(&st, s, n, n - 1, &msg), IDEM_HTTP_E_HEAD_TOO_LARGE);
    st = (idem_http_head_state_t){0};
    cr_expect_eq(idem__http_parse_request(&st, s, n, n, &msg), (int)n);
}

/* A head with n fields. */
static char *fields_of(size_t n)
{
    char *s = malloc(32 + n * 16);
    cr_assert_not_null(s);
    size_t p = (size_t)snprintf(s, 32, "GET / HTTP/1.1\r\n");
    for (size_t i = 0; i < n; i++)
        p += (size_t)snprintf(s + p, 16, "X-%zu: v\r\n", i);
    memcpy(s + p, "\r\n", 3);
    return s;
}

Test(http_parser, max_headers_accepted)
{
    char *s = fields_of(IDEM_HTTP_MAX_HEADERS);
    cr_expect_eq(req(s), (int)strlen(s));
    cr_expect_eq(msg.n_fields, IDEM_HTTP_MAX_HEADERS);
    free(s);
}

Test(http_parser, too_many_headers_refused)
{
    char *s = fields_of(IDEM_HTTP_MAX_HEADERS + 1);
    cr_expect_eq(req(s), IDEM_HTTP_E_TOO_MANY_HEADERS);
    free(s);
}

/* ---- request framing --------------------------------------------------- */

Test(http_parser, no_length_means_no_body)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
}

Test(http_parser, content_length_framing)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length: 42\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_LENGTH);
    cr_expect_eq(msg.content_length, 42);
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_LENGTH);
    cr_expect_eq(msg.content_length, 0);
}

Test(http_parser, content_length_ows_trimmed)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length:\t 5 \r\n\r\n"), 0);
    cr_expect_eq(msg.content_length, 5);
}

Test(http_parser, content_length_limits)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length: 9007199254740992\r\n\r\n"), 0);
    cr_expect_eq(msg.content_length, 9007199254740992ull);
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length: 000000000000000000000007\r\n\r\n"), 0);
    cr_expect_eq(msg.content_length, 7);
    req_is("POST / HTTP/1.1\r\nContent-Length: 9007199254740993\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999999\r\n\r\n", SMUGGLE);
}

Test(http_parser, content_length_must_be_digits)
{
    req_is("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 5 5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 5.0\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: \"5\"\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 5,\r\n\r\n", SMUGGLE);
}

Test(http_parser, content_length_list_refused)
{
    req_is("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 5,6\r\n\r\n", SMUGGLE);
}

Test(http_parser, duplicate_content_length_refused)
{
    req_is("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n", SMUGGLE);
}

Test(http_parser, chunked_framing)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_CHUNKED);
    cr_assert_gt(req("POST / HTTP/1.1\r\ntransfer-encoding:  ChUnKeD \r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_CHUNKED);
}

Test(http_parser, content_length_with_transfer_encoding_refused)
{
    req_is("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", SMUGGLE);
}

Test(http_parser, transfer_encoding_twice_refused)
{
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
           SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
           SMUGGLE);
}

Test(http_parser, transfer_encoding_other_than_chunked_refused)
{
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n", SMUGGLE);
    req_is("POST / HTTP/1.1\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", SMUGGLE);
}

Test(http_parser, transfer_encoding_in_http10_refused)
{
    req_is("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", SMUGGLE);
}

/* ---- persistence and flags --------------------------------------------- */

Test(http_parser, keep_alive_http11_default_on)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\n\r\n"), 0);
    cr_expect(msg.keep_alive);
}

Test(http_parser, connection_close_turns_keep_alive_off)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: close\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: foo, CLOSE\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: Close\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: closed\r\n\r\n"), 0);
    cr_expect(msg.keep_alive);
}

Test(http_parser, keep_alive_http10_default_off)
{
    cr_assert_gt(req("GET / HTTP/1.0\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"), 0);
    cr_expect(msg.keep_alive);
    cr_assert_gt(req("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
}

Test(http_parser, expect_continue)
{
    cr_assert_gt(req("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n"), 0);
    cr_expect(msg.expect_continue);
    cr_assert_gt(req("POST / HTTP/1.1\r\nContent-Length: 1\r\n\r\n"), 0);
    cr_expect_not(msg.expect_continue);
    cr_assert_gt(req("POST / HTTP/1.1\r\nExpect: something\r\n\r\n"), 0);
    cr_expect_not(msg.expect_continue);
    /* RFC 9110 10.1.1: ignored in an HTTP/1.0 request */
    cr_assert_gt(req("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n"), 0);
    cr_expect_not(msg.expect_continue);
}

Test(http_parser, upgrade_flag)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"), 0);
    cr_expect(msg.upgrade);
    cr_assert_gt(req("GET / HTTP/1.1\r\n\r\n"), 0);
    cr_expect_not(msg.upgrade);
}

/* ---- hop-by-hop -------------------------------------------------------- */

static bool hop(const char *name)
{
    return idem__http_is_hop_by_hop(&msg, (idem_slice_t){name, strlen(name)});
}

Test(http_parser, hop_by_hop_fixed_names)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\n\r\n"), 0);
    cr_expect(hop("Connection"));
    cr_expect(hop("keep-alive"));
    cr_expect(hop("TE"));
    cr_expect(hop("Trailer"));
    cr_expect(hop("Transfer-Encoding"));
    cr_expect(hop("upgrade"));
    cr_expect(hop("Proxy-Authorization"));
    cr_expect(hop("proxy-connection"));
    cr_expect_not(hop("Content-Length"));
    cr_expect_not(hop("Idempotency-Key"));
    cr_expect_not(hop("Proxy"));
    cr_expect_not(hop("Trailers"));
}

Test(http_parser, hop_by_hop_connection_listed)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: X-Secret, close\r\nconnection: x-other\r\n\r\n"), 0);
    cr_expect(hop("x-secret"));
    cr_expect(hop("X-Other"));
    cr_expect_not(hop("X-Secre"));
    cr_expect_not(hop("X-Public"));
    cr_expect(idem__http_is_hop_by_hop(NULL, (idem_slice_t){"TE", 2}));
    cr_expect_not(idem__http_is_hop_by_hop(NULL, (idem_slice_t){"X-Secret", 8}));
}

/* The answer of the slow way (the Connection list walked for the name),
 * which the parser's index must always give. */
static bool hop_walked(const idem_http_msg_t *m, size_t i)
{
    idem_http_msg_t *copy = malloc(sizeof *copy);
    cr_assert_not_null(copy);
    *copy = *m;
    copy->conn_indexed = false;
    bool r = idem__http_field_is_hop_by_hop(copy, i);
    cr_expect_eq(r, idem__http_is_hop_by_hop(copy, copy->fields[i].name));
    free(copy);
    return r;
}

static void expect_index_agrees(void)
{
    cr_assert(msg.conn_indexed);
    for (size_t i = 0; i < msg.n_fields; i++) {
        bool want = hop_walked(&msg, i);
        cr_expect_eq(idem__http_field_is_hop_by_hop(&msg, i), want, "field %zu (%.*s)", i,
                     (int)msg.fields[i].name.len, msg.fields[i].name.ptr);
        cr_expect_eq(idem__http_is_hop_by_hop(&msg, msg.fields[i].name), want, "field %zu", i);
    }
}

Test(http_parser, hop_by_hop_connection_items_case_commas_and_white_space)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-A: 1\r\nx-b: 2\r\nConnection: ,, \tx-A\t ,,X-B , ,\r\n"
                     "X-C: 3\r\nx-a: 4\r\nX-D: 5\r\nconnection: x-d,\r\nHost: h\r\n\r\n"),
                 0);
    /* fields: 0 X-A, 1 x-b, 2 Connection, 3 X-C, 4 x-a, 5 X-D, 6 connection, 7 Host */
    bool want[] = {true, true, true, false, true, true, true, false};
    cr_assert_eq(msg.n_fields, 8);
    for (size_t i = 0; i < msg.n_fields; i++)
        cr_expect_eq(idem__http_field_is_hop_by_hop(&msg, i), want[i], "field %zu", i);
    expect_index_agrees();
    /* Names asked from elsewhere, in any case; one no field has. */
    cr_expect(hop("X-a"));
    cr_expect(hop("X-B"));
    cr_expect(hop("x-D"));
    cr_expect_not(hop("x-c"));
    cr_expect_not(hop("x-"));
    cr_expect_not(hop(""));
    cr_assert_gt(req("GET / HTTP/1.1\r\nConnection: x-absent\r\n\r\n"), 0);
    cr_expect(hop("X-Absent"), "a listed name that no field has is still hop-by-hop");
    idem__http_field_is_hop_by_hop(&msg, 99); /* out of range: no read past n_fields */
    cr_expect_not(idem__http_field_is_hop_by_hop(&msg, 99));
}

Test(http_parser, hop_by_hop_empty_connection_lists_name_nothing)
{
    cr_assert_gt(req("GET / HTTP/1.1\r\nX-A: 1\r\nConnection:\r\nConnection: , ,\t,\r\n\r\n"), 0);
    cr_expect_not(idem__http_field_is_hop_by_hop(&msg, 0));
    cr_expect(idem__http_field_is_hop_by_hop(&msg, 1));
    expect_index_agrees();
}

Test(http_parser, hop_by_hop_index_of_a_response)
{
    cr_assert_gt(resp("HTTP/1.1 200 OK\r\nConnection: X-Up\r\nX-Up: 1\r\nX-Other: 2\r\n"
                      "Content-Length: 0\r\n\r\n"),
                 0);
    cr_expect(idem__http_field_is_hop_by_hop(&msg, 1));
    cr_expect_not(idem__http_field_is_hop_by_hop(&msg, 2));
    expect_index_agrees();
}

/* A head of `fields` header fields named by name(i) and one Connection
 * field listing `items` items named by item(k), at most 16 KiB. */
static char *long_connection_head(size_t fields, const char *(*name)(size_t), size_t items,
                                  const char *(*item)(size_t))
{
    size_t cap = IDEM_HTTP_MAX_HEAD + 1, n = 0;
    char *h = malloc(cap);
    cr_assert_not_null(h);
    n += (size_t)snprintf(h + n, cap - n, "POST /pay HTTP/1.1\r\nHost: h\r\n");
    for (size_t i = 0; i < fields; i++)
        n += (size_t)snprintf(h + n, cap - n, "%s: v\r\n", name(i));
    n += (size_t)snprintf(h + n, cap - n, "Connection: ");
    for (size_t k = 0; k < items && n < cap; k++)
        n += (size_t)snprintf(h + n, cap - n, "%s%s", k ? "," : "", item(k));
    cr_assert_lt(n, cap - 8, "the head fits in 16 KiB");
    n += (size_t)snprintf(h + n, cap - n, "\r\n\r\n");
    cr_assert_lt(n, cap - 1, "the head fits in 16 KiB");
    return h;
}

static const char *field_numbered(size_t i)
{
    static char b[16];
    snprintf(b, sizeof b, "X-F%02zu", i);
    return b;
}

static const char *item_one_letter(size_t k)
{
    static const char *const l[] = {"a", "b", "c", "d"};
    return l[k % 4];
}

static const char *field_x_a(size_t i)
{
    (void)i;
    return "X-A";
}

static const char *item_x_a(size_t k)
{
    return k % 2 ? "x-a" : "X-A";
}

/* The work of parsing a head and asking whether each of its fields is
 * hop-by-hop, in name comparisons: it must grow with the items, not with
 * items x fields (the attack: a 7,000-item list beside ~100 fields). */
static uint64_t hop_work(const char *head, size_t *n_fields, uint64_t *asking)
{
    uint64_t before = idem__http_hop_compares();
    cr_assert_gt(req(head), 0);
    uint64_t parsed = idem__http_hop_compares();
    for (size_t i = 0; i < msg.n_fields; i++) {
        (void)idem__http_field_is_hop_by_hop(&msg, i);
        (void)idem__http_is_hop_by_hop(&msg, msg.fields[i].name);
    }
    *n_fields = msg.n_fields;
    *asking = idem__http_hop_compares() - parsed;
    return idem__http_hop_compares() - before;
}

Test(http_parser, hop_by_hop_work_is_linear_in_a_long_connection_list)
{
    size_t nf;
    uint64_t asking;
    /* 97 distinct fields, 6,000 one-letter items none of them names. */
    char *h = long_connection_head(97, field_numbered, 6000, item_one_letter);
    uint64_t work = hop_work(h, &nf, &asking);
    cr_assert_eq(nf, 99);
    /* Each item: a binary search over <= 100 names (<= 8 comparisons), plus
     * the sort of the names; walking the list per field would be 99 x 6000. */
    cr_expect_leq(work, 9 * 6000 + 1000, "%llu comparisons", (unsigned long long)work);
    cr_expect_eq(asking, 0, "a field's answer is its bit: %llu comparisons",
                 (unsigned long long)asking);
    for (size_t i = 0; i < nf; i++)
        cr_expect_eq(idem__http_field_is_hop_by_hop(&msg, i), i == nf - 1);
    free(h);

    /* 98 fields of one name, and 3,500 items that all name it. */
    h = long_connection_head(98, field_x_a, 3500, item_x_a);
    work = hop_work(h, &nf, &asking);
    cr_assert_eq(nf, 100);
    cr_expect_leq(work, 9 * 3500 + 1000, "%llu comparisons", (unsigned long long)work);
    cr_expect_eq(asking, 0);
    for (size_t i = 0; i < nf; i++)
        cr_expect_eq(idem__http_field_is_hop_by_hop(&msg, i), i != 0, "field %zu", i);
    expect_index_agrees();
    free(h);
}

/* Random heads: the index and the walk always agree. */
Test(http_parser, hop_by_hop_index_agrees_with_the_walk)
{
    static const char *const names[] = {"x-a",        "X-A",     "x-b", "X-b",  "x-c",
                                        "Keep-Alive", "Proxy-X", "te",  "x-ab", "x-a "};
    unsigned seed = 12345;
    for (int round = 0; round < 300; round++) {
        char h[2048];
        size_t n = (size_t)snprintf(h, sizeof h, "GET / HTTP/1.1\r\n");
        int nfields = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 12;
        for (int i = 0; i < nfields; i++) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 3 == 0) {
                n += (size_t)snprintf(h + n, sizeof h - n, "Connection:");
                int items = (int)((seed >> 8) % 5);
                for (int k = 0; k < items; k++) {
                    seed = seed * 1103515245u + 12345u;
                    n += (size_t)snprintf(h + n, sizeof h - n, "%s%s", k ? " ,\t" : " ",
                                          names[(seed >> 16) % 10]);
                }
                n += (size_t)snprintf(h + n, sizeof h - n, "\r\n");
            } else {
                const char *nm = names[(seed >> 16) % 10];
                if (nm[strlen(nm) - 1] == ' ')
                    nm = "x-d";
                n += (size_t)snprintf(h + n, sizeof h - n, "%s: v\r\n", nm);
            }
        }
        n += (size_t)snprintf(h + n, sizeof h - n, "\r\n");
        cr_assert_gt(req(h), 0, "%s", h);
        expect_index_agrees();
    }
}

/* ---- responses --------------------------------------------------------- */

Test(http_parser, status_line_parsed)
{
    const char *s = "HTTP/1.1 201 Created Now\r\nContent-Length: 2\r\n\r\nok";
    cr_assert_eq(resp(s), (int)strlen(s) - 2);
    cr_expect_eq(msg.status, 201);
    cr_expect(slice_is(msg.reason, "Created Now"));
    cr_expect_eq(msg.version_minor, 1);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_LENGTH);
    cr_expect_eq(msg.content_length, 2);
    cr_expect(msg.keep_alive);
}

Test(http_parser, empty_reason_accepted)
{
    cr_assert_gt(resp("HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect_eq(msg.status, 200);
    cr_expect_eq(msg.reason.len, 0);
    cr_assert_gt(resp("HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect_eq(msg.status, 404);
    cr_expect_eq(msg.reason.len, 0);
}

Test(http_parser, bad_status_lines_refused)
{
    cr_expect_eq(resp("HTTP/1.1 20 OK\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1 2000 OK\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1 099 X\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1 600 X\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1 2x0 X\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1  200 OK\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1 200 O\x01K\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/1.1\r\n\r\n"), BAD);
    cr_expect_eq(resp("GARBAGE\r\n\r\n"), BAD);
    cr_expect_eq(resp("HTTP/2.0 200 OK\r\n\r\n"), IDEM_HTTP_E_VERSION);
    cr_expect_eq(resp("HTTP/2.0\r\n\r\n"), IDEM_HTTP_E_VERSION);
}

Test(http_parser, response_without_length_reads_to_eof)
{
    cr_assert_gt(resp("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_EOF);
    cr_expect_not(msg.keep_alive);
}

Test(http_parser, response_chunked)
{
    cr_assert_gt(resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_CHUNKED);
    cr_expect(msg.keep_alive);
}

Test(http_parser, response_to_head_has_no_body)
{
    cr_assert_gt(resp_to("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", "HEAD"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
    cr_expect_eq(msg.content_length, 0);
    cr_expect(msg.keep_alive);
    cr_assert_gt(resp_to("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "head"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
}

Test(http_parser, status_204_304_1xx_have_no_body)
{
    cr_assert_gt(resp("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
    cr_assert_gt(resp("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
    cr_assert_gt(resp("HTTP/1.1 100 Continue\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
    cr_expect_eq(msg.status, 100);
    cr_assert_gt(resp("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_NONE);
    cr_expect(msg.upgrade);
    cr_assert_gt(resp("HTTP/1.1 205 Reset Content\r\n\r\n"), 0);
    cr_expect_eq(msg.framing, IDEM_HTTP_BODY_EOF);
}

Test(http_parser, response_smuggling_refused)
{
    cr_expect_eq(resp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"),
                 SMUGGLE);
    cr_expect_eq(resp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n"), SMUGGLE);
    cr_expect_eq(resp("HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n"), SMUGGLE);
    cr_expect_eq(resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"), SMUGGLE);
    cr_expect_eq(resp("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), SMUGGLE);
}

Test(http_parser, response_keep_alive)
{
    cr_assert_gt(resp("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(resp("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect_not(msg.keep_alive);
    cr_assert_gt(resp("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"), 0);
    cr_expect(msg.keep_alive);
}

/* ---- incremental parsing ----------------------------------------------- */

Test(http_parser, search_resumes_where_it_left_off)
{
    char *s = head_of(4000);
    idem_http_head_state_t st = {0};
    cr_assert_eq(idem__http_parse_request(&st, s, 3000, IDEM_HTTP_MAX_HEAD, &msg),
                 IDEM_HTTP_INCOMPLETE);
    cr_expect_geq(st.scanned, 2990, "scanned %zu", st.scanned);
    cr_expect_leq(st.scanned, 3000);
    cr_expect_eq(idem__http_parse_request(&st, s, 4000, IDEM_HTTP_MAX_HEAD, &msg), 4000);
    free(s);
}

Test(http_parser, byte_by_byte_equals_whole)
{
    const char *s = "\r\nPOST /a HTTP/1.1\r\nHost: h\nX-A:  v \r\nContent-Length: 3\r\n\r\nabc";
    size_t head = strlen(s) - 3;
    idem_http_head_state_t st = {0};
    for (size_t i = 0; i < head; i++)
        cr_assert_eq(idem__http_parse_request(&st, s, i, IDEM_HTTP_MAX_HEAD, &msg),
                     IDEM_HTTP_INCOMPLETE, "prefix %zu", i);
    cr_assert_eq(idem__http_parse_request(&st, s, head, IDEM_HTTP_MAX_HEAD, &msg), (int)head);
    cr_expect(slice_is(msg.fields[1].value, "v"));
    cr_expect_eq(msg.content_length, 3);
}

/* Decode a whole body with the input arriving in pieces of `piece` bytes;
 * returns the decoder's final result and the decoded bytes in out. */
static int decode(const idem_http_msg_t *m, const char *in, size_t len, size_t piece,
                  char *out, size_t *out_len, size_t *used)
{
    idem_http_body_t b;
    idem__http_body_init(&b, m, 0);
    size_t off = 0, avail = 0;
    *out_len = 0;
    for (;;) {
        if (avail < len && (avail == off || piece == 0))
            avail = (piece == 0 || len - avail < piece) ? len : avail + piece;
        size_t c = 0;
        idem_slice_t d;
        int rc = idem__http_body_feed(&b, in + off, avail - off, &c, &d);
        cr_assert_leq(c, avail - off);
        off += c;
        if (rc == IDEM_HTTP_BODY_DATA) {
            cr_assert_geq(d.ptr, in);
            cr_assert_leq(d.ptr + d.len, in + off);
            memcpy(out + *out_len, d.ptr, d.len);
            *out_len += d.len;
        } else if (rc == IDEM_HTTP_INCOMPLETE && avail < len) {
            continue;
        } else {
            *used = off;
            return rc;
        }
    }
}

/* Messages whose every split point is checked; body is the decoded body of
 * the first message, next the offset of a pipelined second one (0: none). */
static const struct whole {
    const char *text;
    const char *body;
    size_t next;
} wholes[] = {
    {"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", "hello", 0},
    {"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
     "5;ext=1\r\nhello\r\n1\r\n \r\n05\r\nworld\r\n0\r\nX-T: 1\r\n\r\n",
     "hello world", 0},
    {"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
     "GET /b HTTP/1.1\r\nHost: b\r\n\r\n",
     "hi", 41},
    {"POST /a HTTP/1.1\nTransfer-Encoding: chunked\n\n2\nhi\r\n0\n\n"
     "POST /b HTTP/1.1\r\nContent-Length: 1\r\n\r\nZ",
     "hi", 54},
};

Test(http_parser, every_split_point_same_result)
{
    for (size_t w = 0; w < sizeof wholes / sizeof wholes[0]; w++) {
        const char *s = wholes[w].text;
        size_t len = strlen(s);
        idem_http_msg_t ref;
        idem_http_head_state_t st = {0};
        int head = idem__http_parse_request(&st, s, len, IDEM_HTTP_MAX_HEAD, &ref);
        cr_assert_gt(head, 0, "message %zu", w);
        char out[128];
        size_t out_len = 0, used = 0;
        cr_assert_eq(decode(&ref, s + head, len - (size_t)head, 0, out, &out_len, &used),
                     IDEM_HTTP_BODY_DONE, "message %zu", w);
        cr_assert_eq(out_len, strlen(wholes[w].body));
        cr_assert_eq(memcmp(out, wholes[w].body, out_len), 0);
        if (wholes[w].next != 0)
            cr_assert_eq((size_t)head + used, wholes[w].next, "message %zu", w);
        else
            cr_assert_eq((size_t)head + used, len, "message %zu", w);

        for (size_t i = 0; i <= len; i++) {
            st = (idem_http_head_state_t){0};
            int rc = idem__http_parse_request(&st, s, i, IDEM_HTTP_MAX_HEAD, &msg);
            if (i < (size_t)head)
                cr_assert_eq(rc, IDEM_HTTP_INCOMPLETE, "message %zu split %zu", w, i);
            else
                cr_assert_eq(rc, head, "message %zu split %zu", w, i);
            cr_assert_eq(idem__http_parse_request(&st, s, len, IDEM_HTTP_MAX_HEAD, &msg), head);
            cr_assert_eq(msg.n_fields, ref.n_fields);
            cr_assert_eq(msg.framing, ref.framing);
            cr_assert_eq(msg.content_length, ref.content_length);
            cr_assert_eq(msg.method.ptr, ref.method.ptr);
            cr_assert_eq(msg.target.len, ref.target.len);
            for (size_t f = 0; f < ref.n_fields; f++) {
                cr_assert_eq(msg.fields[f].name.ptr, ref.fields[f].name.ptr);
                cr_assert_eq(msg.fields[f].value.ptr, ref.fields[f].value.ptr);
                cr_assert_eq(msg.fields[f].value.len, ref.fields[f].value.len);
            }
            /* the body arriving in pieces of i bytes */
            size_t body_len = len - (size_t)head;
            size_t piece = i == 0 ? body_len : (i < body_len ? i : body_len);
            char out2[128];
            size_t out2_len = 0, used2 = 0;
            cr_assert_eq(decode(&msg, s + head, body_len, piece, out2, &out2_len, &used2),
                         IDEM_HTTP_BODY_DONE, "message %zu split %zu", w, i);
            cr_assert_eq(out2_len, out_len);
            cr_assert_eq(memcmp(out2, out, out_len), 0);
            cr_assert_eq(used2, used);
        }

        if (wholes[w].next != 0) {
            /* the pipelined second request parses from where the first ended */
            st = (idem_http_head_state_t){0};
            size_t at = wholes[w].next;
            int rc = idem__http_parse_request(&st, s + at, len - at, IDEM_HTTP_MAX_HEAD, &msg);
            cr_assert_gt(rc, 0, "second of message %zu", w);
            cr_expect_eq(msg.method.ptr, s + at);
            cr_expect(slice_is(msg.target, "/b"));
        }
    }
}
