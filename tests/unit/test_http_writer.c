/* tests/unit/test_http_writer.c - the bounded buffer and the writers of
 * src/http/writer.c: appends, the cap that refuses without changing the
 * buffer, status lines, field lines (and the refusal of injected CR/LF),
 * chunks, and reason phrases. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

static bool buf_is(const idem_buf_t *b, const char *s)
{
    return b->len == strlen(s) && (b->len == 0 || memcmp(b->data, s, b->len) == 0);
}

/* ---- idem_buf_t -------------------------------------------------------- */

Test(http_writer, append_grows)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    char big[1000];
    memset(big, 'x', sizeof big);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(idem_buf_append(&b, big, sizeof big), 0);
    cr_expect_eq(b.len, 10000);
    cr_expect_geq(b.cap, b.len);
    cr_expect_eq(b.data[9999], 'x');
    cr_assert_eq(idem_buf_append_str(&b, "end"), 0);
    cr_expect_eq(memcmp(b.data + 10000, "end", 3), 0);
    idem_buf_cleanup(&b);
    cr_expect_null(b.data);
    cr_expect_eq(b.len, 0);
}

Test(http_writer, append_up_to_cap_accepted)
{
    idem_buf_t b;
    idem_buf_init(&b, 8);
    cr_expect_eq(idem_buf_append(&b, "12345678", 8), 0);
    cr_expect(buf_is(&b, "12345678"));
    idem_buf_cleanup(&b);
}

Test(http_writer, append_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 8);
    cr_assert_eq(idem_buf_append(&b, "12345", 5), 0);
    cr_expect_eq(idem_buf_append(&b, "6789", 4), -1);
    cr_expect(buf_is(&b, "12345"));
    cr_expect_eq(idem_buf_append_str(&b, "6789"), -1);
    cr_expect(buf_is(&b, "12345"));
    cr_expect_eq(idem_buf_append(&b, "678", 3), 0);
    cr_expect(buf_is(&b, "12345678"));
    cr_expect_eq(idem_buf_append(&b, "9", 1), -1);
    cr_expect(buf_is(&b, "12345678"));
    idem_buf_cleanup(&b);
}

Test(http_writer, appendf_formats)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_buf_appendf(&b, "a=%d ", 42), 0);
    cr_assert_eq(idem_buf_appendf(&b, "%s|%zu", "str", (size_t)7), 0);
    cr_expect(buf_is(&b, "a=42 str|7"));
    char big[600];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(idem_buf_appendf(&b, "[%s]", big), 0);
    cr_expect_eq(b.len, 10 + 601);
    cr_expect_eq(b.data[b.len - 1], ']');
    idem_buf_cleanup(&b);
}

Test(http_writer, appendf_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 10);
    cr_assert_eq(idem_buf_appendf(&b, "%s", "abcdef"), 0);
    cr_expect_eq(idem_buf_appendf(&b, "%d", 12345), -1);
    cr_expect(buf_is(&b, "abcdef"));
    cr_expect_eq(idem_buf_appendf(&b, "%d", 1234), 0);
    cr_expect(buf_is(&b, "abcdef1234"));
    idem_buf_cleanup(&b);
}

Test(http_writer, consume_removes_prefix)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_buf_append_str(&b, "hello world"), 0);
    idem_buf_consume(&b, 6);
    cr_expect(buf_is(&b, "world"));
    idem_buf_consume(&b, 100);
    cr_expect_eq(b.len, 0);
    idem_buf_cleanup(&b);
}

Test(http_writer, reset_keeps_memory)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_buf_append_str(&b, "hello"), 0);
    char *data = b.data;
    size_t cap = b.cap;
    idem_buf_reset(&b);
    cr_expect_eq(b.len, 0);
    cr_expect_eq(b.data, data);
    cr_expect_eq(b.cap, cap);
    idem_buf_cleanup(&b);
}

/* ---- writers ----------------------------------------------------------- */

Test(http_writer, status_line)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_http_write_status(&b, 200), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\n"));
    idem_buf_reset(&b);
    cr_assert_eq(idem_http_write_status(&b, 431), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 431 Request Header Fields Too Large\r\n"));
    idem_buf_reset(&b);
    cr_assert_eq(idem_http_write_status(&b, 299), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 299 Unknown\r\n"));
    idem_buf_reset(&b);
    cr_expect_eq(idem_http_write_status(&b, 99), -1);
    cr_expect_eq(idem_http_write_status(&b, 1000), -1);
    cr_expect_eq(b.len, 0);
    idem_buf_cleanup(&b);
}

Test(http_writer, status_line_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 20);
    cr_assert_eq(idem_buf_append_str(&b, "xx"), 0);
    cr_expect_eq(idem_http_write_status(&b, 503), -1);
    cr_expect(buf_is(&b, "xx"));
    idem_buf_cleanup(&b);
}

Test(http_writer, field_line)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_http_write_field(&b, "Content-Type", 12, "text/plain", 10), 0);
    cr_assert_eq(idem_http_write_field(&b, "X-Empty", 7, "", 0), 0);
    cr_expect(buf_is(&b, "Content-Type: text/plain\r\nX-Empty: \r\n"));
    idem_buf_cleanup(&b);
}

Test(http_writer, field_injection_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_buf_append_str(&b, "start"), 0);
    cr_expect_eq(idem_http_write_field(&b, "X-A", 3, "a\r\nX-Evil: 1", 13), -1);
    cr_expect_eq(idem_http_write_field(&b, "X-A", 3, "a\nb", 3), -1);
    cr_expect_eq(idem_http_write_field(&b, "X-A", 3, "a\0b", 3), -1);
    cr_expect_eq(idem_http_write_field(&b, "X A", 3, "v", 1), -1);
    cr_expect_eq(idem_http_write_field(&b, "X:A", 3, "v", 1), -1);
    cr_expect_eq(idem_http_write_field(&b, "", 0, "v", 1), -1);
    cr_expect(buf_is(&b, "start"));
    idem_buf_cleanup(&b);
}

Test(http_writer, field_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 12);
    cr_assert_eq(idem_buf_append_str(&b, "ab"), 0);
    cr_expect_eq(idem_http_write_field(&b, "Name", 4, "valu", 4), -1); /* 14 bytes */
    cr_expect(buf_is(&b, "ab"));
    cr_expect_eq(idem_http_write_field(&b, "Nam", 3, "val", 3), 0); /* 12 bytes */
    cr_expect(buf_is(&b, "abNam: val\r\n"));
    idem_buf_cleanup(&b);
}

Test(http_writer, chunks)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_http_write_chunk(&b, "Wiki", 4), 0);
    cr_assert_eq(idem_http_write_chunk(&b, "", 0), 0);
    char big[26];
    memset(big, 'z', sizeof big);
    cr_assert_eq(idem_http_write_chunk(&b, big, sizeof big), 0);
    cr_assert_eq(idem_http_write_last_chunk(&b), 0);
    cr_expect(buf_is(&b, "4\r\nWiki\r\n1a\r\nzzzzzzzzzzzzzzzzzzzzzzzzzz\r\n0\r\n\r\n"));
    idem_buf_cleanup(&b);
}

Test(http_writer, chunk_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem_buf_init(&b, 10);
    cr_assert_eq(idem_buf_append_str(&b, "ab"), 0);
    cr_expect_eq(idem_http_write_chunk(&b, "Wiki", 4), -1); /* 9 more */
    cr_expect(buf_is(&b, "ab"));
    cr_expect_eq(idem_http_write_chunk(&b, "Wik", 3), 0); /* 8 more */
    cr_expect_eq(idem_http_write_last_chunk(&b), -1);
    cr_expect(buf_is(&b, "ab3\r\nWik\r\n"));
    idem_buf_cleanup(&b);
}

Test(http_writer, written_chunks_decode)
{
    idem_buf_t b;
    idem_buf_init(&b, 0);
    cr_assert_eq(idem_http_write_chunk(&b, "hello ", 6), 0);
    cr_assert_eq(idem_http_write_chunk(&b, "world", 5), 0);
    cr_assert_eq(idem_http_write_last_chunk(&b), 0);
    idem_http_msg_t m;
    memset(&m, 0, sizeof m);
    m.framing = IDEM_HTTP_BODY_CHUNKED;
    idem_http_body_t body;
    idem_http_body_init(&body, &m, 0);
    char out[16];
    size_t n = 0, off = 0, c;
    idem_slice_t d;
    int rc;
    while ((rc = idem_http_body_feed(&body, b.data + off, b.len - off, &c, &d)) ==
           IDEM_HTTP_BODY_DATA) {
        memcpy(out + n, d.ptr, d.len);
        n += d.len;
        off += c;
    }
    cr_expect_eq(rc, IDEM_HTTP_BODY_DONE);
    cr_expect_eq(n, 11);
    cr_expect_eq(memcmp(out, "hello world", 11), 0);
    idem_buf_cleanup(&b);
}

Test(http_writer, reason_phrases)
{
    cr_expect_str_eq(idem_http_reason(200), "OK");
    cr_expect_str_eq(idem_http_reason(409), "Conflict");
    cr_expect_str_eq(idem_http_reason(413), "Content Too Large");
    cr_expect_str_eq(idem_http_reason(422), "Unprocessable Content");
    cr_expect_str_eq(idem_http_reason(503), "Service Unavailable");
    cr_expect_str_eq(idem_http_reason(599), "Unknown");
    cr_expect_str_eq(idem_http_reason(-1), "Unknown");
    static const int known[] = {100, 101, 200, 201, 202, 204, 206, 301, 302, 303, 304, 307,
                                308, 400, 401, 403, 404, 405, 408, 409, 410, 411, 412, 413,
                                414, 415, 417, 421, 422, 425, 426, 428, 429, 431, 500, 501,
                                502, 503, 504, 505};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        cr_expect_str_neq(idem_http_reason(known[i]), "Unknown", "status %d", known[i]);
}
