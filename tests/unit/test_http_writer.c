/* tests/unit/test_http_writer.c - the bounded buffer and the writers of
 * src/http/writer.c: appends, the cap that refuses without changing the
 * buffer, status lines, field lines (and the refusal of injected CR/LF),
 * chunks, reason phrases, and whole response heads (each framing, HEAD,
 * HTTP/1.0 keep-alive, refusals, all or nothing under a cap). */
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
    idem__buf_init(&b, 0);
    char big[1000];
    memset(big, 'x', sizeof big);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(idem__buf_append(&b, big, sizeof big), 0);
    cr_expect_eq(b.len, 10000);
    cr_expect_geq(b.cap, b.len);
    cr_expect_eq(b.data[9999], 'x');
    cr_assert_eq(idem__buf_append_str(&b, "end"), 0);
    cr_expect_eq(memcmp(b.data + 10000, "end", 3), 0);
    idem__buf_cleanup(&b);
    cr_expect_null(b.data);
    cr_expect_eq(b.len, 0);
}

Test(http_writer, append_up_to_cap_accepted)
{
    idem_buf_t b;
    idem__buf_init(&b, 8);
    cr_expect_eq(idem__buf_append(&b, "12345678", 8), 0);
    cr_expect(buf_is(&b, "12345678"));
    idem__buf_cleanup(&b);
}

Test(http_writer, append_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 8);
    cr_assert_eq(idem__buf_append(&b, "12345", 5), 0);
    cr_expect_eq(idem__buf_append(&b, "6789", 4), -1);
    cr_expect(buf_is(&b, "12345"));
    cr_expect_eq(idem__buf_append_str(&b, "6789"), -1);
    cr_expect(buf_is(&b, "12345"));
    cr_expect_eq(idem__buf_append(&b, "678", 3), 0);
    cr_expect(buf_is(&b, "12345678"));
    cr_expect_eq(idem__buf_append(&b, "9", 1), -1);
    cr_expect(buf_is(&b, "12345678"));
    idem__buf_cleanup(&b);
}

Test(http_writer, appendf_formats)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__buf_appendf(&b, "a=%d ", 42), 0);
    cr_assert_eq(idem__buf_appendf(&b, "%s|%zu", "str", (size_t)7), 0);
    cr_expect(buf_is(&b, "a=42 str|7"));
    char big[600];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(idem__buf_appendf(&b, "[%s]", big), 0);
    cr_expect_eq(b.len, 10 + 601);
    cr_expect_eq(b.data[b.len - 1], ']');
    idem__buf_cleanup(&b);
}

Test(http_writer, appendf_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 10);
    cr_assert_eq(idem__buf_appendf(&b, "%s", "abcdef"), 0);
    cr_expect_eq(idem__buf_appendf(&b, "%d", 12345), -1);
    cr_expect(buf_is(&b, "abcdef"));
    cr_expect_eq(idem__buf_appendf(&b, "%d", 1234), 0);
    cr_expect(buf_is(&b, "abcdef1234"));
    idem__buf_cleanup(&b);
}

Test(http_writer, consume_removes_prefix)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__buf_append_str(&b, "hello world"), 0);
    idem__buf_consume(&b, 6);
    cr_expect(buf_is(&b, "world"));
    idem__buf_consume(&b, 100);
    cr_expect_eq(b.len, 0);
    idem__buf_cleanup(&b);
}

Test(http_writer, reset_keeps_memory)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__buf_append_str(&b, "hello"), 0);
    char *data = b.data;
    size_t cap = b.cap;
    idem__buf_reset(&b);
    cr_expect_eq(b.len, 0);
    cr_expect_eq(b.data, data);
    cr_expect_eq(b.cap, cap);
    idem__buf_cleanup(&b);
}

/* ---- writers ----------------------------------------------------------- */

Test(http_writer, status_line)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__http_write_status(&b, 200), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\n"));
    idem__buf_reset(&b);
    cr_assert_eq(idem__http_write_status(&b, 431), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 431 Request Header Fields Too Large\r\n"));
    idem__buf_reset(&b);
    cr_assert_eq(idem__http_write_status(&b, 299), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 299 Unknown\r\n"));
    idem__buf_reset(&b);
    cr_expect_eq(idem__http_write_status(&b, 99), -1);
    cr_expect_eq(idem__http_write_status(&b, 1000), -1);
    cr_expect_eq(b.len, 0);
    idem__buf_cleanup(&b);
}

Test(http_writer, status_line_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 20);
    cr_assert_eq(idem__buf_append_str(&b, "xx"), 0);
    cr_expect_eq(idem__http_write_status(&b, 503), -1);
    cr_expect(buf_is(&b, "xx"));
    idem__buf_cleanup(&b);
}

Test(http_writer, field_line)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__http_write_field(&b, "Content-Type", 12, "text/plain", 10), 0);
    cr_assert_eq(idem__http_write_field(&b, "X-Empty", 7, "", 0), 0);
    cr_expect(buf_is(&b, "Content-Type: text/plain\r\nX-Empty: \r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, field_injection_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__buf_append_str(&b, "start"), 0);
    cr_expect_eq(idem__http_write_field(&b, "X-A", 3, "a\r\nX-Evil: 1", 13), -1);
    cr_expect_eq(idem__http_write_field(&b, "X-A", 3, "a\nb", 3), -1);
    cr_expect_eq(idem__http_write_field(&b, "X-A", 3, "a\0b", 3), -1);
    cr_expect_eq(idem__http_write_field(&b, "X A", 3, "v", 1), -1);
    cr_expect_eq(idem__http_write_field(&b, "X:A", 3, "v", 1), -1);
    cr_expect_eq(idem__http_write_field(&b, "", 0, "v", 1), -1);
    cr_expect(buf_is(&b, "start"));
    idem__buf_cleanup(&b);
}

Test(http_writer, field_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 12);
    cr_assert_eq(idem__buf_append_str(&b, "ab"), 0);
    cr_expect_eq(idem__http_write_field(&b, "Name", 4, "valu", 4), -1); /* 14 bytes */
    cr_expect(buf_is(&b, "ab"));
    cr_expect_eq(idem__http_write_field(&b, "Nam", 3, "val", 3), 0); /* 12 bytes */
    cr_expect(buf_is(&b, "abNam: val\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, chunks)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__http_write_chunk(&b, "Wiki", 4), 0);
    cr_assert_eq(idem__http_write_chunk(&b, "", 0), 0);
    char big[26];
    memset(big, 'z', sizeof big);
    cr_assert_eq(idem__http_write_chunk(&b, big, sizeof big), 0);
    cr_assert_eq(idem__http_write_last_chunk(&b), 0);
    cr_expect(buf_is(&b, "4\r\nWiki\r\n1a\r\nzzzzzzzzzzzzzzzzzzzzzzzzzz\r\n0\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, chunk_past_cap_refused_unchanged)
{
    idem_buf_t b;
    idem__buf_init(&b, 10);
    cr_assert_eq(idem__buf_append_str(&b, "ab"), 0);
    cr_expect_eq(idem__http_write_chunk(&b, "Wiki", 4), -1); /* 9 more */
    cr_expect(buf_is(&b, "ab"));
    cr_expect_eq(idem__http_write_chunk(&b, "Wik", 3), 0); /* 8 more */
    cr_expect_eq(idem__http_write_last_chunk(&b), -1);
    cr_expect(buf_is(&b, "ab3\r\nWik\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, written_chunks_decode)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__http_write_chunk(&b, "hello ", 6), 0);
    cr_assert_eq(idem__http_write_chunk(&b, "world", 5), 0);
    cr_assert_eq(idem__http_write_last_chunk(&b), 0);
    idem_http_msg_t m;
    memset(&m, 0, sizeof m);
    m.framing = IDEM_HTTP_BODY_CHUNKED;
    idem_http_body_t body;
    idem__http_body_init(&body, &m, 0);
    char out[16];
    size_t n = 0, off = 0, c;
    idem_slice_t d;
    int rc;
    while ((rc = idem__http_body_feed(&body, b.data + off, b.len - off, &c, &d)) ==
           IDEM_HTTP_BODY_DATA) {
        memcpy(out + n, d.ptr, d.len);
        n += d.len;
        off += c;
    }
    cr_expect_eq(rc, IDEM_HTTP_BODY_DONE);
    cr_expect_eq(n, 11);
    cr_expect_eq(memcmp(out, "hello world", 11), 0);
    idem__buf_cleanup(&b);
}

Test(http_writer, reason_phrases)
{
    cr_expect_str_eq(idem__http_reason(200), "OK");
    cr_expect_str_eq(idem__http_reason(409), "Conflict");
    cr_expect_str_eq(idem__http_reason(413), "Content Too Large");
    cr_expect_str_eq(idem__http_reason(422), "Unprocessable Content");
    cr_expect_str_eq(idem__http_reason(503), "Service Unavailable");
    cr_expect_str_eq(idem__http_reason(599), "Unknown");
    cr_expect_str_eq(idem__http_reason(-1), "Unknown");
    static const int known[] = {100, 101, 200, 201, 202, 204, 206, 301, 302, 303, 304, 307,
                                308, 400, 401, 403, 404, 405, 408, 409, 410, 411, 412, 413,
                                414, 415, 417, 421, 422, 425, 426, 428, 429, 431, 500, 501,
                                502, 503, 504, 505};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        cr_expect_str_neq(idem__http_reason(known[i]), "Unknown", "status %d", known[i]);
}

/* ---- whole response heads ---------------------------------------------- */

static const idem_http_reply_t KEEP_11 = {.version_minor = 1, .keep_alive = true};
static const idem_http_reply_t CLOSE_11 = {.version_minor = 1, .keep_alive = false};

#define FIELD(n, v) {{n, sizeof n - 1}, {v, sizeof v - 1}}

Test(http_writer, head_with_length)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_field_t f[] = {FIELD("Content-Type", "text/plain"), FIELD("X-Empty", "")};
    idem_http_response_t r = {.status = 201, .fields = f, .n_fields = 2,
                              .framing = IDEM_HTTP_BODY_LENGTH, .content_length = 12345};
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-Empty: \r\n"
                         "Content-Length: 12345\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_chunked)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 200, .framing = IDEM_HTTP_BODY_CHUNKED};
    cr_assert_eq(idem__http_write_head(&b, &r, CLOSE_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_chunked_refused_to_http10)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 200, .framing = IDEM_HTTP_BODY_CHUNKED};
    idem_http_reply_t to = {.version_minor = 0, .keep_alive = true};
    cr_expect_eq(idem__http_write_head(&b, &r, to), -1);
    to.keep_alive = false;
    cr_expect_eq(idem__http_write_head(&b, &r, to), -1);
    cr_expect_eq(b.len, 0);
    idem__buf_cleanup(&b);
}

Test(http_writer, head_close_delimited)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 200, .framing = IDEM_HTTP_BODY_EOF};
    idem_http_reply_t to = {.version_minor = 0, .keep_alive = false};
    cr_assert_eq(idem__http_write_head(&b, &r, to), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"));
    /* Such a body ends only when the connection does. */
    cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_without_framing)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 200, .framing = IDEM_HTTP_BODY_NONE};
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_bodiless_statuses_have_no_framing)
{
    static const int statuses[] = {204, 304};
    for (size_t i = 0; i < 2; i++) {
        idem_buf_t b;
        idem__buf_init(&b, 0);
        idem_http_response_t r = {.status = statuses[i], .framing = IDEM_HTTP_BODY_LENGTH,
                                  .content_length = 7};
        cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
        cr_expect_null(memmem(b.data, b.len, "Content-Length", 14), "status %d", statuses[i]);
        idem__buf_reset(&b);
        r.framing = IDEM_HTTP_BODY_CHUNKED;
        cr_assert_eq(idem__http_write_head(&b, &r, CLOSE_11), 0);
        cr_expect_null(memmem(b.data, b.len, "Transfer-Encoding", 17), "status %d", statuses[i]);
        cr_expect_not_null(memmem(b.data, b.len, "Connection: close", 17));
        idem__buf_cleanup(&b);
    }
    cr_expect(idem__http_status_bodiless(100));
    cr_expect(idem__http_status_bodiless(199));
    cr_expect(idem__http_status_bodiless(204));
    cr_expect(idem__http_status_bodiless(304));
    cr_expect_not(idem__http_status_bodiless(200));
    cr_expect_not(idem__http_status_bodiless(205));
    cr_expect_not(idem__http_status_bodiless(404));
}

Test(http_writer, head_interim_is_the_status_line_alone)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 100, .framing = IDEM_HTTP_BODY_LENGTH, .content_length = 3};
    cr_assert_eq(idem__http_write_head(&b, &r, CLOSE_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 100 Continue\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_connection_per_version)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 200, .framing = IDEM_HTTP_BODY_LENGTH, .content_length = 0};
    idem_http_reply_t ka10 = {.version_minor = 0, .keep_alive = true};
    cr_assert_eq(idem__http_write_head(&b, &r, ka10), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"));
    idem__buf_reset(&b);
    idem_http_reply_t close10 = {.version_minor = 0, .keep_alive = false};
    cr_assert_eq(idem__http_write_head(&b, &r, close10), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
    idem__buf_reset(&b);
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
    idem__buf_reset(&b);
    idem_http_reply_t zero = {0};
    cr_assert_eq(idem__http_write_head(&b, &r, zero), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
              "a zeroed reply closes");
    idem__buf_cleanup(&b);
}

Test(http_writer, head_reason_given_or_standard)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 299, .reason = {"Fine Indeed", 11},
                              .framing = IDEM_HTTP_BODY_NONE};
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 299 Fine Indeed\r\n\r\n"));
    idem__buf_reset(&b);
    r.reason = (idem_slice_t){"", 0}; /* an upstream may send none */
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 299 \r\n\r\n"));
    idem__buf_reset(&b);
    r.reason = (idem_slice_t){NULL, 0};
    cr_assert_eq(idem__http_write_head(&b, &r, KEEP_11), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 299 Unknown\r\n\r\n"));
    idem__buf_cleanup(&b);
}

Test(http_writer, head_refuses_injection_and_framing_fields)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__buf_append_str(&b, "start"), 0);
    idem_http_field_t bad[][1] = {
        {FIELD("X-A", "a\r\nX-Evil: 1")}, {FIELD("X-A", "a\nb")}, {FIELD("X-A", "a\0b")},
        {FIELD("X A", "v")}, {FIELD("X:A", "v")}, {FIELD("", "v")},
        {FIELD("Content-Length", "0")}, {FIELD("content-LENGTH", "0")},
        {FIELD("Transfer-Encoding", "chunked")}, {FIELD("Connection", "keep-alive")},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_http_response_t r = {.status = 200, .fields = bad[i], .n_fields = 1,
                                  .framing = IDEM_HTTP_BODY_LENGTH};
        cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1, "field %zu", i);
        cr_expect_eq(idem__http_write_response(&b, &r, KEEP_11, "x", 1), -1, "field %zu", i);
    }
    static const char *reasons[] = {"OK\r\nX-Evil: 1", "OK\n", "O\rK"};
    for (size_t i = 0; i < 3; i++) {
        idem_http_response_t r = {.status = 200, .reason = {reasons[i], strlen(reasons[i])}};
        cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1, "reason %zu", i);
    }
    idem_http_response_t r = {.status = 200, .reason = {"O\0K", 3}};
    cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1);
    r = (idem_http_response_t){.status = 99};
    cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1);
    r.status = 1000;
    cr_expect_eq(idem__http_write_head(&b, &r, KEEP_11), -1);
    cr_expect(buf_is(&b, "start"));
    idem__buf_cleanup(&b);
}

Test(http_writer, response_with_body)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_field_t f[] = {FIELD("Content-Type", "application/json")};
    idem_http_response_t r = {.status = 200, .fields = f, .n_fields = 1,
                              .framing = IDEM_HTTP_BODY_CHUNKED /* not read */};
    cr_assert_eq(idem__http_write_response(&b, &r, KEEP_11, "{}", 2), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: 2\r\n\r\n{}"));
    idem__buf_cleanup(&b);
}

Test(http_writer, response_to_head_is_the_head_alone)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 404};
    idem_http_reply_t to = {.version_minor = 1, .head = true, .keep_alive = true};
    cr_assert_eq(idem__http_write_response(&b, &r, to, "missing", 7), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 404 Not Found\r\nContent-Length: 7\r\n\r\n"),
              "HEAD keeps the length of the body it does not get");
    idem__buf_cleanup(&b);
}

Test(http_writer, response_bodiless_status_drops_the_body)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_response_t r = {.status = 204};
    cr_assert_eq(idem__http_write_response(&b, &r, CLOSE_11, "ignored", 7), 0);
    cr_expect(buf_is(&b, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"));
    idem__buf_cleanup(&b);
}

/* Every cap short of the whole answer refuses it and leaves the buffer as
 * it was; the exact size fits.  So a head is never queued without its
 * final blank line, nor a body without its head. */
Test(http_writer, head_and_response_all_or_nothing_under_a_cap)
{
    idem_http_field_t f[] = {FIELD("Content-Type", "text/plain"), FIELD("Retry-After", "3")};
    idem_http_response_t r = {.status = 503, .fields = f, .n_fields = 2,
                              .framing = IDEM_HTTP_BODY_LENGTH, .content_length = 4};
    idem_http_reply_t to = {.version_minor = 0, .keep_alive = true};
    for (int which = 0; which < 2; which++) {
        idem_buf_t full;
        idem__buf_init(&full, 0);
        int rc = which == 0 ? idem__http_write_head(&full, &r, to)
                            : idem__http_write_response(&full, &r, to, "down", 4);
        cr_assert_eq(rc, 0);
        for (size_t cap = 2; cap <= full.len + 2; cap++) {
            idem_buf_t b;
            idem__buf_init(&b, cap);
            cr_assert_eq(idem__buf_append(&b, "xx", 2), 0);
            rc = which == 0 ? idem__http_write_head(&b, &r, to)
                            : idem__http_write_response(&b, &r, to, "down", 4);
            if (cap < full.len + 2) {
                cr_expect_eq(rc, -1, "cap %zu", cap);
                cr_expect(buf_is(&b, "xx"), "cap %zu changed the buffer", cap);
            } else {
                cr_expect_eq(rc, 0);
                cr_expect_eq(b.len, full.len + 2);
                cr_expect_eq(memcmp(b.data + 2, full.data, full.len), 0);
            }
            idem__buf_cleanup(&b);
        }
        idem__buf_cleanup(&full);
    }
}

/* What the writer says is what a recipient reads: each framing, parsed
 * back, gives the framing, length and persistence asked for. */
Test(http_writer, heads_parse_back_as_written)
{
    static const struct {
        int status;
        idem_http_framing_t framing;
        int minor;
        bool keep_alive;
        idem_http_framing_t want;
    } cases[] = {
        {200, IDEM_HTTP_BODY_LENGTH, 1, true, IDEM_HTTP_BODY_LENGTH},
        {200, IDEM_HTTP_BODY_LENGTH, 0, true, IDEM_HTTP_BODY_LENGTH},
        {200, IDEM_HTTP_BODY_LENGTH, 0, false, IDEM_HTTP_BODY_LENGTH},
        {200, IDEM_HTTP_BODY_CHUNKED, 1, true, IDEM_HTTP_BODY_CHUNKED},
        {200, IDEM_HTTP_BODY_CHUNKED, 1, false, IDEM_HTTP_BODY_CHUNKED},
        {200, IDEM_HTTP_BODY_EOF, 1, false, IDEM_HTTP_BODY_EOF},
        {200, IDEM_HTTP_BODY_EOF, 0, false, IDEM_HTTP_BODY_EOF},
        {204, IDEM_HTTP_BODY_LENGTH, 1, true, IDEM_HTTP_BODY_NONE},
        {304, IDEM_HTTP_BODY_CHUNKED, 1, false, IDEM_HTTP_BODY_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        idem_buf_t b;
        idem__buf_init(&b, 0);
        idem_http_response_t r = {.status = cases[i].status, .framing = cases[i].framing,
                                  .content_length = 42};
        idem_http_reply_t to = {.version_minor = cases[i].minor, .keep_alive = cases[i].keep_alive};
        cr_assert_eq(idem__http_write_head(&b, &r, to), 0, "case %zu", i);
        idem_http_head_state_t hs = {0};
        idem_http_msg_t m;
        /* The parser reads what a client of that version would. */
        char *copy = malloc(b.len);
        memcpy(copy, b.data, b.len);
        if (cases[i].minor == 0)
            copy[7] = '0';
        int rc = idem__http_parse_response(&hs, copy, b.len, IDEM_HTTP_MAX_HEAD,
                                           (idem_slice_t){"GET", 3}, &m);
        cr_assert_eq((size_t)rc, b.len, "case %zu: %d", i, rc);
        cr_expect_eq(m.framing, cases[i].want, "case %zu", i);
        if (cases[i].want == IDEM_HTTP_BODY_LENGTH)
            cr_expect_eq(m.content_length, 42);
        cr_expect_eq(m.keep_alive, cases[i].keep_alive, "case %zu", i);
        free(copy);
        idem__buf_cleanup(&b);
    }
}
