/* tests/unit/test_http_body.c - the body decoder of src/http/body.c:
 * Content-Length, read-until-close and chunked framing, chunk extensions and
 * trailers with their bounds, the caller's body limit, and chunked bodies fed
 * in pieces of every size. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

static idem_http_msg_t msg_framed(idem_http_framing_t framing, uint64_t length)
{
    idem_http_msg_t m;
    memset(&m, 0, sizeof m);
    m.framing = framing;
    m.content_length = length;
    return m;
}

/* Decode in[0..len) arriving in pieces of `piece` bytes (0: all at once).
 * Returns the final result (DONE, INCOMPLETE when the input ran out, or an
 * error); the decoded bytes go to out, *used is how much input was taken. */
static int decode_n(idem_http_body_t *b, const char *in, size_t len, size_t piece, char *out,
                    size_t *out_len, size_t *used)
{
    size_t off = 0, avail = 0;
    *out_len = 0;
    for (;;) {
        if (avail < len && (avail == off || piece == 0))
            avail = (piece == 0 || len - avail < piece) ? len : avail + piece;
        size_t c = 0;
        idem_slice_t d;
        int rc = idem__http_body_feed(b, in + off, avail - off, &c, &d);
        cr_assert_leq(c, avail - off);
        off += c;
        if (rc == IDEM_HTTP_BODY_DATA) {
            cr_assert_gt(d.len, 0);
            cr_assert_geq(d.ptr, in);
            cr_assert_leq(d.ptr + d.len, in + off);
            if (out != NULL)
                memcpy(out + *out_len, d.ptr, d.len);
            *out_len += d.len;
        } else if (rc == IDEM_HTTP_INCOMPLETE && avail < len) {
            continue;
        } else {
            if (used != NULL)
                *used = off;
            return rc;
        }
    }
}

/* Decode a chunked body given at once; out must hold strlen(in) bytes. */
static int chunked(const char *in, uint64_t limit, char *out, size_t *out_len, size_t *used)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, limit);
    return decode_n(&b, in, strlen(in), 0, out, out_len, used);
}

static void chunked_is(const char *in, const char *want)
{
    char out[256];
    size_t n = 0, used = 0;
    int rc = chunked(in, 0, out, &n, &used);
    cr_assert_eq(rc, IDEM_HTTP_BODY_DONE, "chunked %s: got %d", in, rc);
    cr_expect_eq(n, strlen(want), "chunked %s", in);
    cr_expect_eq(memcmp(out, want, n), 0, "chunked %s", in);
    cr_expect_eq(used, strlen(in), "chunked %s", in);
}

static void chunked_rc(const char *in, int want)
{
    char *out = malloc(strlen(in) + 1);
    cr_assert_not_null(out);
    size_t n = 0;
    int rc = chunked(in, 0, out, &n, NULL);
    free(out);
    cr_expect_eq(rc, want, "chunked %.60s: got %d, want %d", in, rc, want);
}

/* ---- no body, Content-Length, EOF -------------------------------------- */

Test(http_body, none_is_done_at_once)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_NONE, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c = 99;
    idem_slice_t d;
    cr_expect_eq(idem__http_body_feed(&b, "GET", 3, &c, &d), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(c, 0);
}

Test(http_body, length_takes_exactly_its_bytes)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_LENGTH, 5);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    const char *in = "helloGET / HTTP/1.1";
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, in, strlen(in), &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(c, 5);
    cr_expect_eq(d.ptr, in);
    cr_expect_eq(d.len, 5);
    cr_expect_eq(idem__http_body_feed(&b, in + 5, strlen(in) - 5, &c, &d), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(c, 0);
}

Test(http_body, length_in_pieces)
{
    const char *in = "0123456789";
    for (size_t piece = 1; piece <= 10; piece++) {
        idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_LENGTH, 10);
        idem_http_body_t b;
        idem__http_body_init(&b, &m, 0);
        char out[16];
        size_t n, used;
        cr_assert_eq(decode_n(&b, in, 10, piece, out, &n, &used), IDEM_HTTP_BODY_DONE);
        cr_expect_eq(n, 10);
        cr_expect_eq(memcmp(out, in, 10), 0);
    }
}

Test(http_body, length_incomplete_then_eof_is_error)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_LENGTH, 5);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, "hel", 3, &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(idem__http_body_feed(&b, "", 0, &c, &d), IDEM_HTTP_INCOMPLETE);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_E_BODY);
}

Test(http_body, length_zero_is_done)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_LENGTH, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_expect_eq(idem__http_body_feed(&b, "x", 1, &c, &d), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(c, 0);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_BODY_DONE);
}

Test(http_body, length_over_limit_refused)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_LENGTH, 11);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 10);
    size_t c;
    idem_slice_t d;
    cr_expect_eq(idem__http_body_feed(&b, "abc", 3, &c, &d), IDEM_HTTP_E_BODY_TOO_LARGE);
    m = msg_framed(IDEM_HTTP_BODY_LENGTH, 10);
    idem__http_body_init(&b, &m, 10);
    cr_expect_eq(idem__http_body_feed(&b, "abc", 3, &c, &d), IDEM_HTTP_BODY_DATA);
}

Test(http_body, eof_framing_until_close)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_EOF, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, "abc", 3, &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(c, 3);
    cr_expect_eq(d.len, 3);
    cr_assert_eq(idem__http_body_feed(&b, "", 0, &c, &d), IDEM_HTTP_INCOMPLETE);
    cr_assert_eq(idem__http_body_feed(&b, "de", 2, &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(b.total, 5);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_BODY_DONE);
}

Test(http_body, eof_framing_over_limit_refused)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_EOF, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 4);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, "abc", 3, &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(idem__http_body_feed(&b, "de", 2, &c, &d), IDEM_HTTP_E_BODY_TOO_LARGE);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_E_BODY_TOO_LARGE);
}

/* ---- chunked ----------------------------------------------------------- */

Test(http_body, chunked_decoded)
{
    chunked_is("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n", "Wikipedia");
    chunked_is("0\r\n\r\n", "");
}

Test(http_body, chunked_hex_sizes)
{
    chunked_is("A\r\n0123456789\r\n0\r\n\r\n", "0123456789");
    chunked_is("a\r\n0123456789\r\n0\r\n\r\n", "0123456789");
    chunked_is("0000000000000000000001\r\nx\r\n000\r\n\r\n", "x");
    chunked_is("1F\r\n0123456789012345678901234567890\r\n0\r\n\r\n",
               "0123456789012345678901234567890");
}

Test(http_body, chunked_stops_at_message_end)
{
    const char *in = "2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    char out[64];
    size_t n, used;
    cr_assert_eq(chunked(in, 0, out, &n, &used), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(used, strlen("2\r\nhi\r\n0\r\n\r\n"));
}

Test(http_body, chunk_extensions_accepted)
{
    chunked_is("4;name=value\r\nWiki\r\n5;a;b=\"q s\"\r\npedia\r\n0;last\r\n\r\n", "Wikipedia");
    chunked_is("4 ;x\r\nWiki\r\n0\t; y\r\n\r\n", "Wiki");
}

Test(http_body, chunk_extension_line_bounded)
{
    static const char tail[] = "\r\nWiki\r\n0\r\n\r\n";
    size_t n = 5000;
    char *in = malloc(n + 32);
    cr_assert_not_null(in);
    memcpy(in, "4;", 2);
    memset(in + 2, 'x', n);
    memcpy(in + 2 + n, tail, sizeof tail);
    chunked_rc(in, IDEM_HTTP_E_BODY);
    /* a line under the bound passes */
    memcpy(in + 2 + 4000, tail, sizeof tail);
    chunked_rc(in, IDEM_HTTP_BODY_DONE);
    free(in);
}

Test(http_body, chunk_extension_control_chars_refused)
{
    chunked_rc("4;a\x01\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4;a\rb\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
}

Test(http_body, chunk_size_syntax)
{
    chunked_rc("\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("g\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0x4\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("-4\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("+4\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc(" 4\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4 \r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4 4\r\nWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4\rWiki\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
}

Test(http_body, chunk_size_overflow_refused)
{
    chunked_rc("10000000000000000\r\nx\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("fffffffffffffffff\r\nx\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
}

Test(http_body, chunk_size_bare_lf_accepted)
{
    chunked_is("4\nWiki\r\n0\n\n", "Wiki");
}

Test(http_body, crlf_after_chunk_data_required)
{
    chunked_rc("4\r\nWikiX\r\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4\r\nWiki\n0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4\r\nWiki0\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("4\r\nWiki\rX0\r\n\r\n", IDEM_HTTP_E_BODY);
}

Test(http_body, trailers_discarded)
{
    chunked_is("4\r\nWiki\r\n0\r\nX-Check: abc\r\nX-Other:\t1 2\r\n\r\n", "Wiki");
    chunked_is("4\r\nWiki\r\n0\nX-Check: abc\n\n", "Wiki");
}

Test(http_body, malformed_trailers_refused)
{
    chunked_rc("0\r\nno colon\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0\r\nX-A : 1\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0\r\nX-A: 1\r\n folded\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0\r\nX-A: a\x01\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0\r\nX-A: a\rb\r\n\r\n", IDEM_HTTP_E_BODY);
    chunked_rc("0\r\n\rX\r\n", IDEM_HTTP_E_BODY);
}

Test(http_body, trailer_section_bounded)
{
    size_t n = 17 * 1024;
    char *in = malloc(n + 64);
    cr_assert_not_null(in);
    memcpy(in, "0\r\nX-Big: ", 10);
    memset(in + 10, 'v', n);
    memcpy(in + 10 + n, "\r\n\r\n", 5);
    chunked_rc(in, IDEM_HTTP_E_BODY);
    /* many small trailer fields count together */
    size_t p = 3;
    memcpy(in, "0\r\n", 3);
    while (p < n) {
        memcpy(in + p, "X: 0123456789\r\n", 15);
        p += 15;
    }
    memcpy(in + p, "\r\n", 3);
    chunked_rc(in, IDEM_HTTP_E_BODY);
    free(in);
    chunked_rc("0\r\nX: 0123456789\r\nX: 0123456789\r\n\r\n", IDEM_HTTP_BODY_DONE);
}

Test(http_body, chunked_limit_checked_before_data)
{
    char out[64];
    size_t n;
    /* the second chunk's size line alone passes the limit of 6 */
    cr_expect_eq(chunked("4\r\nWiki\r\n5\r\n", 6, out, &n, NULL), IDEM_HTTP_E_BODY_TOO_LARGE);
    cr_expect_eq(n, 4);
    cr_expect_eq(chunked("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n", 9, out, &n, NULL),
                 IDEM_HTTP_BODY_DONE);
    cr_expect_eq(chunked("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n", 8, out, &n, NULL),
                 IDEM_HTTP_E_BODY_TOO_LARGE);
}

Test(http_body, errors_are_sticky)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, "z", 1, &c, &d), IDEM_HTTP_E_BODY);
    cr_expect_eq(idem__http_body_feed(&b, "0\r\n\r\n", 5, &c, &d), IDEM_HTTP_E_BODY);
    cr_expect_eq(c, 0);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_E_BODY);
}

Test(http_body, done_is_sticky)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, "0\r\n\r\n", 5, &c, &d), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(c, 5);
    cr_expect_eq(idem__http_body_feed(&b, "4\r\n", 3, &c, &d), IDEM_HTTP_BODY_DONE);
    cr_expect_eq(c, 0);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_BODY_DONE);
}

Test(http_body, chunked_cut_short_is_error_at_eof)
{
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    char out[16];
    size_t n;
    cr_assert_eq(decode_n(&b, "4\r\nWi", 5, 0, out, &n, NULL), IDEM_HTTP_INCOMPLETE);
    cr_expect_eq(n, 2);
    cr_expect_eq(idem__http_body_eof(&b), IDEM_HTTP_E_BODY);
}

Test(http_body, chunked_every_piece_size)
{
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n", "Wikipedia"},
        {"3;a=b\r\nabc\r\n1 ; c\r\nd\r\n0\r\nT: x\r\nU: y\r\n\r\n", "abcd"},
        {"1\nx\r\n10\r\n0123456789abcdef\r\n0\n\n", "x0123456789abcdef"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len = strlen(cases[k].in);
        for (size_t piece = 1; piece <= len; piece++) {
            idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
            idem_http_body_t b;
            idem__http_body_init(&b, &m, 0);
            char out[64];
            size_t n, used;
            cr_assert_eq(decode_n(&b, cases[k].in, len, piece, out, &n, &used),
                         IDEM_HTTP_BODY_DONE, "case %zu piece %zu", k, piece);
            cr_assert_eq(n, strlen(cases[k].want), "case %zu piece %zu", k, piece);
            cr_assert_eq(memcmp(out, cases[k].want, n), 0, "case %zu piece %zu", k, piece);
            cr_assert_eq(used, len, "case %zu piece %zu", k, piece);
        }
    }
}

Test(http_body, chunked_large_chunk_not_copied)
{
    size_t size = 100000;
    char *in = malloc(size + 32);
    cr_assert_not_null(in);
    int h = snprintf(in, 32, "%zx\r\n", size);
    memset(in + h, 'q', size);
    memcpy(in + (size_t)h + size, "\r\n0\r\n\r\n", 8);
    idem_http_msg_t m = msg_framed(IDEM_HTTP_BODY_CHUNKED, 0);
    idem_http_body_t b;
    idem__http_body_init(&b, &m, 0);
    size_t c;
    idem_slice_t d;
    cr_assert_eq(idem__http_body_feed(&b, in, strlen(in), &c, &d), IDEM_HTTP_BODY_DATA);
    cr_expect_eq(d.ptr, in + h);
    cr_expect_eq(d.len, size);
    cr_expect_eq(c, (size_t)h + size);
    free(in);
}
