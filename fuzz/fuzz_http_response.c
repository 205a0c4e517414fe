/* fuzz/fuzz_http_response.c - libFuzzer target for the response side of
 * src/http: the status-line/head parser and the body decoder, including
 * read-until-close framing and answers to HEAD.
 *
 * The first input byte chooses the split point, the piece size and whether
 * the request was a HEAD (bit 7); the rest is parsed as a sequence of
 * responses, as an upstream connection would deliver them.  For each head
 * the parse is done at once and also in two pieces (a prefix of a length
 * chosen by the first byte, copied to its own allocation so that reading past
 * it is caught, then the whole buffer with the same state); both must agree.  Each body is decoded
 * at once and again in small pieces; both must agree byte for byte.
 * Invariants checked: slices lie inside the head, head_len <= len and the
 * limit, n_fields within bounds, decoded bytes never exceed the input, data
 * slices lie inside what was consumed, and every call makes progress.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEAD 2048          /* small, so the 431 path is reached */
#define BODY_LIMIT (64 * 1024) /* the 413 path too */

#include "fuzz_common.h"
#define MAX_MESSAGES 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_msg(const idem_http_msg_t *m, int rc, const char *buf, size_t len)
{
    CHECK(rc > 0 && (size_t)rc == m->head_len);
    CHECK(m->head_len <= len && m->head_len <= MAX_HEAD);
    CHECK(m->status >= 100 && m->status <= 599);
    CHECK(inside(m->reason, buf, m->head_len));
    CHECK(m->method.len == 0 && m->target.len == 0);
    CHECK(m->version_minor == 0 || m->version_minor == 1);
    CHECK(m->n_fields <= IDEM_HTTP_MAX_HEADERS);
    for (size_t i = 0; i < m->n_fields; i++) {
        CHECK(m->fields[i].name.len > 0);
        CHECK(inside(m->fields[i].name, buf, m->head_len));
        CHECK(inside(m->fields[i].value, buf, m->head_len));
    }
    CHECK(m->framing == IDEM_HTTP_BODY_NONE || m->framing == IDEM_HTTP_BODY_LENGTH ||
          m->framing == IDEM_HTTP_BODY_CHUNKED || m->framing == IDEM_HTTP_BODY_EOF);
    CHECK(m->framing != IDEM_HTTP_BODY_EOF || !m->keep_alive);
    CHECK(m->framing == IDEM_HTTP_BODY_NONE || m->status >= 200);
    CHECK(m->framing == IDEM_HTTP_BODY_LENGTH || m->content_length == 0);
    CHECK(m->content_length <= ((uint64_t)1 << 53));
    CHECK(!m->expect_continue);
    CHECK(m->framing != IDEM_HTTP_BODY_CHUNKED || m->version_minor == 1);
    CHECK(idem__http_count(m, "content-length") <= 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static idem_http_msg_t m;
    const char *buf = (const char *)data;
    if (size < 1)
        return 0;
    size_t split_byte = data[0], piece = (size_t)(data[0] % 13) + 1;
    idem_slice_t method = (data[0] & 0x80) ? (idem_slice_t){"HEAD", 4} : (idem_slice_t){"POST", 4};
    const head_parser_t parser = {method, check_msg};
    buf += 1;
    size -= 1;

    char *out1 = malloc(size + 1), *out2 = malloc(size + 1);
    CHECK(out1 != NULL && out2 != NULL);
    size_t off = 0;
    for (int n = 0; n < MAX_MESSAGES && off < size; n++) {
        size_t left = size - off;
        int rc = parse_head(&parser, buf + off, left, split_byte * left / 255, &m);
        if (rc <= 0)
            break;
        (void)idem__http_is_hop_by_hop(&m, (idem_slice_t){"x-a", 3});
        off += (size_t)rc;
        size_t used = decode_both_ways(&m, buf + off, size - off, piece, out1, out2);
        if (used == SIZE_MAX)
            break;
        off += used;
    }
    free(out1);
    free(out2);
    return 0;
}
