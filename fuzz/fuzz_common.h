/* fuzz/fuzz_common.h - what the HTTP fuzz targets share: a check that
 * aborts (so libFuzzer records the input; CHECK, from fuzz_check.h), a
 * bounds test for slices, and a body decoder driver that feeds input in
 * pieces and checks the decoder's invariants.  Each target defines MAX_HEAD
 * and BODY_LIMIT before including this header.  Header-only: every target
 * is one translation unit.
 */
#ifndef IDEM_FUZZ_COMMON_H
#define IDEM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "http/http.h"

static bool inside(idem_slice_t s, const char *buf, size_t len)
{
    if (s.len == 0)
        return true;
    return s.ptr >= buf && s.len <= len && (size_t)(s.ptr - buf) <= len - s.len;
}

/* Decode the body in in[0..len) arriving in pieces of `piece` bytes (0: at
 * once); decoded bytes go to out.  Returns the decoder's last result. */
static int decode(const idem_http_msg_t *m, const char *in, size_t len, size_t piece, char *out,
                  size_t *out_len, size_t *used)
{
    idem_http_body_t b;
    idem__http_body_init(&b, m, BODY_LIMIT);
    size_t off = 0, avail = 0;
    *out_len = 0;
    for (;;) {
        if (avail < len && (avail == off || piece == 0))
            avail = (piece == 0 || len - avail < piece) ? len : avail + piece;
        size_t c = 0;
        idem_slice_t d;
        int rc = idem__http_body_feed(&b, in + off, avail - off, &c, &d);
        CHECK(c <= avail - off);
        off += c;
        if (rc == IDEM_HTTP_BODY_DATA) {
            CHECK(d.len > 0 && c > 0);
            CHECK(d.ptr >= in && d.ptr + d.len <= in + off);
            memcpy(out + *out_len, d.ptr, d.len);
            *out_len += d.len;
            CHECK(*out_len <= off && *out_len <= BODY_LIMIT);
            CHECK(b.total == *out_len);
        } else if (rc == IDEM_HTTP_INCOMPLETE && avail < len) {
            CHECK(off == avail);
        } else {
            CHECK(rc == IDEM_HTTP_BODY_DONE || rc == IDEM_HTTP_INCOMPLETE ||
                  rc == IDEM_HTTP_E_BODY || rc == IDEM_HTTP_E_BODY_TOO_LARGE);
            if (rc == IDEM_HTTP_INCOMPLETE) {
                CHECK(off == len);
                CHECK(
                    idem__http_body_eof(&b) ==
                    (m->framing == IDEM_HTTP_BODY_EOF ? IDEM_HTTP_BODY_DONE : IDEM_HTTP_E_BODY));
            }
            *used = off;
            return rc;
        }
    }
}

/* Parse buf[0..len) as a head at once and in two pieces; both must agree. */

/* Decode the body after a head at once and in pieces of `piece` bytes; both
 * must agree.  Returns the bytes the body used, or SIZE_MAX when it did not
 * end cleanly (the message sequence stops there). */
static size_t decode_both_ways(const idem_http_msg_t *m, const char *in, size_t len, size_t piece,
                               char *out1, char *out2)
{
    size_t len1 = 0, len2 = 0, used1 = 0, used2 = 0;
    int b1 = decode(m, in, len, 0, out1, &len1, &used1);
    int b2 = decode(m, in, len, piece, out2, &len2, &used2);
    CHECK(b1 == b2);
    CHECK(len1 == len2 && memcmp(out1, out2, len1) == 0);
    CHECK(used1 == used2);
    CHECK(len1 <= used1);
    if (m->framing == IDEM_HTTP_BODY_NONE)
        CHECK(b1 == IDEM_HTTP_BODY_DONE && used1 == 0);
    return b1 == IDEM_HTTP_BODY_DONE ? used1 : SIZE_MAX;
}

/* Which head parser a target exercises: requests (method.ptr NULL), or
 * responses to a request with that method; check validates a parsed head. */
typedef struct head_parser {
    idem_slice_t method;
    void (*check)(const idem_http_msg_t *m, int rc, const char *buf, size_t len);
} head_parser_t;

static int run_parser(const head_parser_t *p, idem_http_head_state_t *st, const char *buf,
                      size_t len, idem_http_msg_t *m)
{
    return p->method.ptr ? idem__http_parse_response(st, buf, len, MAX_HEAD, p->method, m)
                         : idem__http_parse_request(st, buf, len, MAX_HEAD, m);
}

/* Parse a head at once, then again as a prefix of `split` bytes (in its own
 * allocation, so a read past it is caught) followed by the whole: the two
 * must agree. */
static int parse_head(const head_parser_t *p, const char *buf, size_t len, size_t split,
                      idem_http_msg_t *m)
{
    idem_http_head_state_t st = {0};
    int rc = run_parser(p, &st, buf, len, m);
    CHECK(rc <= (int)len);
    if (rc > 0)
        p->check(m, rc, buf, len);

    if (split > len)
        split = len;
    char *prefix = malloc(split ? split : 1);
    CHECK(prefix != NULL);
    memcpy(prefix, buf, split);
    static idem_http_msg_t m2;
    idem_http_head_state_t st2 = {0};
    int rc1 = run_parser(p, &st2, prefix, split, &m2);
    free(prefix);
    CHECK(st2.scanned <= split);
    if (rc1 == IDEM_HTTP_INCOMPLETE) {
        int rc2 = run_parser(p, &st2, buf, len, &m2);
        CHECK(rc2 == rc);
        if (rc2 > 0) {
            CHECK(m2.n_fields == m->n_fields && m2.framing == m->framing &&
                  m2.content_length == m->content_length && m2.keep_alive == m->keep_alive);
        }
    } else {
        /* a verdict on the prefix is the verdict on the whole */
        CHECK(rc1 == rc);
    }
    return rc;
}

#endif /* IDEM_FUZZ_COMMON_H */
