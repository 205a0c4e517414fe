/* fuzz/fuzz_http_request.c - libFuzzer target for the request side of
 * src/http: the head parser and the body decoder, on pipelined input.
 *
 * The first input byte chooses the split point and the piece size; the rest
 * is parsed as a sequence of requests, one after another, as a
 * connection would deliver them.  For each head the parse is done at once
 * and also in two pieces (a prefix of a length chosen by the first byte,
 * copied to its own allocation so that reading past it is caught, then the
 * whole buffer with the same state); both must agree.  Each body is decoded
 * at once and again in small pieces; both must agree byte for byte.
 * Invariants checked: slices lie inside the head, head_len <= len and the
 * limit, n_fields within bounds, decoded bytes never exceed the input, data
 * slices lie inside what was consumed, and every call makes progress.  Each
 * target is also normalised (src/http/target.c) into a buffer of exactly the
 * size the gateway gives it: the normal form fits, starts with '/', is no
 * longer than the target, and is its own normal form.
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

static void check_target(idem_slice_t target)
{
    size_t cap = target.len + 2;
    char *norm = malloc(cap), *again = malloc(cap);
    CHECK(norm != NULL && again != NULL);
    idem_http_target_t t, t2;
    int rc = idem__http_target_normalize(target.ptr, target.len, norm, cap, &t);
    CHECK(rc <= 0 && rc != IDEM_TARGET_E_SPACE);
    if (rc == IDEM_TARGET_OK) {
        CHECK(t.len <= target.len && t.path_len <= t.len && norm[0] == '/' && norm[t.len] == 0);
        CHECK(t.authority.len == 0 || inside(t.authority, target.ptr, target.len));
        CHECK(idem__http_target_normalize(norm, t.len, again, cap, &t2) == IDEM_TARGET_OK);
        CHECK(t2.len == t.len && t2.path_len == t.path_len && memcmp(norm, again, t.len) == 0);
        CHECK(idem__http_path_has_prefix(norm, t.path_len, norm, t.path_len));
    }
    free(norm);
    free(again);
}

static void check_msg(const idem_http_msg_t *m, int rc, const char *buf, size_t len)
{
    CHECK(rc > 0 && (size_t)rc == m->head_len);
    CHECK(m->head_len <= len && m->head_len <= MAX_HEAD);
    CHECK(m->method.len > 0 && inside(m->method, buf, m->head_len));
    CHECK(m->target.len > 0 && inside(m->target, buf, m->head_len));
    CHECK(m->version_minor == 0 || m->version_minor == 1);
    CHECK(m->n_fields <= IDEM_HTTP_MAX_HEADERS);
    for (size_t i = 0; i < m->n_fields; i++) {
        CHECK(m->fields[i].name.len > 0);
        CHECK(inside(m->fields[i].name, buf, m->head_len));
        CHECK(inside(m->fields[i].value, buf, m->head_len));
    }
    CHECK(m->framing == IDEM_HTTP_BODY_NONE || m->framing == IDEM_HTTP_BODY_LENGTH ||
          m->framing == IDEM_HTTP_BODY_CHUNKED);
    CHECK(m->framing == IDEM_HTTP_BODY_LENGTH || m->content_length == 0);
    CHECK(m->content_length <= ((uint64_t)1 << 53));
    CHECK(!m->expect_continue || m->version_minor == 1);
    CHECK(m->framing != IDEM_HTTP_BODY_CHUNKED || m->version_minor == 1);
    CHECK(idem__http_count(m, "content-length") <= 1);
    check_target(m->target);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static idem_http_msg_t m;
    static const head_parser_t parser = {{NULL, 0}, check_msg};
    const char *buf = (const char *)data;
    if (size < 1)
        return 0;
    size_t split_byte = data[0], piece = (size_t)(data[0] % 13) + 1;
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
