/* fuzz/fuzz_record.c - libFuzzer target for the record codec
 * (src/core/record.c): what a store hands back is decoded, whatever it is.
 *
 * The whole input is a stored value.  Properties checked:
 *   - idem_record_decode and idem_record_decode_head accept exactly the
 *     same values, give the same fixed fields, and zero the record when
 *     they refuse one (IDEM_E_CORRUPT, nothing else on plain bytes);
 *   - a decoded record is in range: a known state, only known flags, a
 *     status that fits 16 bits, every header and the body NUL-terminated
 *     just past their lengths (the codec promises that for printing);
 *   - round trip: encoded_size of the record is the input's length, and
 *     encoding it gives the input back byte for byte (a version 1 input
 *     comes back as version 2: the same bytes with the version byte 2 and
 *     a 4-byte checksum after them); decoding that again, and encoding a
 *     deep copy (idem_record_copy), give the same fields;
 *   - with the first allocation made to fail, decode is IDEM_E_NOMEM for a
 *     value that owns headers or a body (and zeroes the record, leaking
 *     nothing), or decodes as before for one that owns neither.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "idem/alloc.h"
#include "idem/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether out is what encode must make of the accepted value data. */
static bool same_encoding(const uint8_t *out, size_t out_len, const uint8_t *data, size_t size)
{
    if (data[3] != 1)
        return out_len == size && memcmp(out, data, size) == 0;
    return out_len == size + 4 && memcmp(out, data, 3) == 0 && out[3] == 2 &&
           memcmp(out + 4, data + 4, size - 4) == 0;
}

static bool is_zero(const idem_record_t *r)
{
    static const idem_record_t zero;
    return memcmp(r, &zero, sizeof zero) == 0;
}

/* The fields that idem_record_decode_head fills. */
static void same_head(const idem_record_t *a, const idem_record_t *b)
{
    CHECK(a->state == b->state && a->flags == b->flags);
    CHECK(memcmp(a->fingerprint, b->fingerprint, IDEM_FP_LEN) == 0);
    CHECK(a->fence == b->fence && a->lease_until_ms == b->lease_until_ms);
    CHECK(a->expires_at_ms == b->expires_at_ms);
    CHECK(a->response.status == b->response.status);
}

static void same_record(const idem_record_t *a, const idem_record_t *b)
{
    same_head(a, b);
    const idem_response_t *x = &a->response, *y = &b->response;
    CHECK(x->n_headers == y->n_headers && x->body_len == y->body_len);
    for (size_t i = 0; i < x->n_headers; i++) {
        const idem_header_t *h = &x->headers[i], *k = &y->headers[i];
        CHECK(h->name_len == k->name_len && h->value_len == k->value_len);
        CHECK(memcmp(h->name, k->name, h->name_len) == 0);
        CHECK(memcmp(h->value, k->value, h->value_len) == 0);
    }
    CHECK(x->body_len == 0 || memcmp(x->body, y->body, x->body_len) == 0);
}

static void check_ranges(const idem_record_t *r)
{
    const idem_response_t *x = &r->response;
    CHECK(r->state == IDEM_STATE_IN_PROGRESS || r->state == IDEM_STATE_COMPLETED);
    CHECK((r->flags & ~(uint32_t)(IDEM_REC_HELD | IDEM_REC_NOT_RETAINED | IDEM_REC_TOKEN)) == 0);
    CHECK(x->status >= 0 && x->status <= UINT16_MAX);
    CHECK(x->n_headers <= UINT16_MAX && x->body_len <= UINT32_MAX);
    CHECK((x->n_headers == 0) == (x->headers == NULL));
    CHECK((r->owned == NULL) == (x->n_headers == 0 && x->body_len == 0));
    for (size_t i = 0; i < x->n_headers; i++) {
        CHECK(x->headers[i].name[x->headers[i].name_len] == '\0');
        CHECK(x->headers[i].value[x->headers[i].value_len] == '\0');
    }
    if (x->body != NULL)
        CHECK(x->body[x->body_len] == '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    idem_record_t rec, head, again, copy;

    memset(&head, 0xA5, sizeof head); /* decode must overwrite all of it */
    idem_err_t eh = idem_record_decode_head(data, size, &head);
    memset(&rec, 0xA5, sizeof rec);
    idem_err_t err = idem_record_decode(data, size, &rec);
    CHECK(err == IDEM_OK || err == IDEM_E_CORRUPT);
    CHECK(eh == err);
    if (err != IDEM_OK) {
        CHECK(is_zero(&rec) && is_zero(&head));
        return 0;
    }
    check_ranges(&rec);
    same_head(&rec, &head);
    CHECK(head.response.n_headers == 0 && head.response.body_len == 0 && head.owned == NULL);

    /* encode(decode(v)) == v */
    CHECK(idem_record_encoded_size(&rec) == size + (data[3] == 1 ? 4 : 0));
    uint8_t *out;
    size_t out_len;
    CHECK(idem_record_encode(&rec, &out, &out_len) == IDEM_OK);
    CHECK(same_encoding(out, out_len, data, size));
    CHECK(idem_record_decode(out, out_len, &again) == IDEM_OK);
    same_record(&rec, &again);
    idem_record_cleanup(&again);
    idem_free(out);

    CHECK(idem_record_copy(&copy, &rec) == IDEM_OK);
    check_ranges(&copy);
    same_record(&rec, &copy);
    CHECK(idem_record_encode(&copy, &out, &out_len) == IDEM_OK);
    CHECK(same_encoding(out, out_len, data, size));
    idem_free(out);
    idem_record_cleanup(&copy);

    /* Out of memory: the one allocation decode makes fails. */
    bool owns = rec.owned != NULL;
    idem_alloc_fail_after(1);
    err = idem_record_decode(data, size, &again);
    idem_alloc_fail_after(0);
    if (owns) {
        CHECK(err == IDEM_E_NOMEM && is_zero(&again));
    } else {
        CHECK(err == IDEM_OK);
        same_record(&rec, &again);
        idem_record_cleanup(&again);
    }
    idem_record_cleanup(&rec);
    CHECK(is_zero(&rec));
    return 0;
}
