/* tests/unit/test_record.c - the record codec of src/core/record.c.
 *
 * The codec is what every store writes to disk, so these tests pin the byte
 * layout (a golden value), the round trip, and above all that decoding
 * damaged or foreign bytes is IDEM_E_CORRUPT and never reads out of bounds:
 * each candidate value is copied into a heap buffer of exactly its length,
 * so the sanitizer build catches any overread.  Version 2's checksum: any
 * flipped bit is IDEM_E_CORRUPT, and the framing checks behind it are
 * exercised by damaging a value and sealing it again with a right checksum.
 * Version 1 values (no checksum) still decode.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32c.h"
#include "idem/alloc.h"
#include "idem/record.h"
#include "core/record_splice.h"

static const idem_header_t hdrs[] = {
    {"Content-Type", 12, "application/json", 16},
    {"X-Empty", 7, "", 0},
    {"Set-Cookie", 10, "a=\0b", 4}, /* bytes, not C strings */
};
static const uint8_t body[] = "{\"id\":42,\"ok\":true}\n";

static idem_record_t completed(void)
{
    idem_record_t r = {
        .state = IDEM_STATE_COMPLETED,
        .flags = 0,
        .fence = 7,
        .lease_until_ms = 1700000000123,
        .expires_at_ms = 1700086400123,
        .response = {201, hdrs, 3, body, sizeof body - 1},
    };
    for (int i = 0; i < IDEM_FP_LEN; i++)
        r.fingerprint[i] = (uint8_t)(0xA0 + i);
    return r;
}

static idem_record_t in_progress(void)
{
    idem_record_t r = {
        .state = IDEM_STATE_IN_PROGRESS,
        .fence = 3,
        .lease_until_ms = 1000,
        .expires_at_ms = 2000,
    };
    memset(r.fingerprint, 0x5A, IDEM_FP_LEN);
    return r;
}

/* Encode rec into an exact-size heap buffer. */
static uint8_t *enc(const idem_record_t *rec, size_t *len)
{
    uint8_t *buf = NULL;
    cr_assert_eq(idem_record_encode(rec, &buf, len), IDEM_OK);
    return buf;
}

/* Decode a copy of buf[0..len) in a buffer of exactly len bytes. */
static idem_err_t dec_exact(const uint8_t *buf, size_t len, idem_record_t *rec)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    if (len)
        memcpy(copy, buf, len);
    idem_err_t err = idem_record_decode(copy, len, rec);
    free(copy);
    return err;
}

static void expect_same_response(const idem_record_t *a, const idem_record_t *b)
{
    cr_expect_eq(a->response.status, b->response.status);
    cr_assert_eq(a->response.n_headers, b->response.n_headers);
    for (size_t i = 0; i < a->response.n_headers; i++) {
        const idem_header_t *x = &a->response.headers[i], *y = &b->response.headers[i];
        cr_assert_eq(x->name_len, y->name_len);
        cr_assert_eq(x->value_len, y->value_len);
        cr_expect_eq(memcmp(x->name, y->name, x->name_len), 0);
        cr_expect_eq(memcmp(x->value, y->value, x->value_len), 0);
    }
    cr_assert_eq(a->response.body_len, b->response.body_len);
    cr_expect_eq(memcmp(a->response.body, b->response.body, a->response.body_len), 0);
}

static int is_zero(const idem_record_t *r)
{
    static const idem_record_t z;
    return memcmp(r, &z, sizeof z) == 0;
}

Test(record, roundtrip_keeps_every_field_and_byte)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);

    cr_assert_eq(dec_exact(buf, len, &out), IDEM_OK);
    cr_expect_eq(out.state, in.state);
    cr_expect_eq(out.flags, in.flags);
    cr_expect_eq(memcmp(out.fingerprint, in.fingerprint, IDEM_FP_LEN), 0);
    cr_expect_eq(out.fence, in.fence);
    cr_expect_eq(out.lease_until_ms, in.lease_until_ms);
    cr_expect_eq(out.expires_at_ms, in.expires_at_ms);
    expect_same_response(&out, &in);
    idem_record_cleanup(&out);
    idem_free(buf);
}

Test(record, golden_layout_is_stable)
{
    /* One header, a 2-byte body: the documented layout, little-endian. */
    static const idem_header_t h[] = {{"A", 1, "bc", 2}};
    idem_record_t r = {
        .state = IDEM_STATE_COMPLETED,
        .flags = IDEM_REC_NOT_RETAINED,
        .fence = 0x0102030405060708ull,
        .lease_until_ms = -1,
        .expires_at_ms = 0x1122334455667788ll,
        .response = {200, h, 1, (const uint8_t *)"hi", 2},
    };
    memset(r.fingerprint, 0xEE, IDEM_FP_LEN);
    uint8_t expect[69 + 6 + 3 + 4 + 2 + 4];
    uint8_t *p = expect;
    memcpy(p, "IDR\x02", 4);
    memcpy(p + 4, "\x02\x00\x00\x00", 4);
    p[8] = 2;
    memset(p + 9, 0xEE, 32);
    memcpy(p + 41, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
    memset(p + 49, 0xFF, 8);
    memcpy(p + 57, "\x88\x77\x66\x55\x44\x33\x22\x11", 8);
    memcpy(p + 65, "\xC8\x00\x01\x00", 4);
    memcpy(p + 69, "\x01\x00\x02\x00\x00\x00" "Abc", 9);
    memcpy(p + 78, "\x02\x00\x00\x00" "hi", 6);
    memcpy(p + 84, "\x42\x75\x69\x44", 4); /* CRC32C of bytes 0..83, by another program */

    size_t len;
    uint8_t *buf = enc(&r, &len);
    cr_assert_eq(len, sizeof expect);
    cr_expect_eq(memcmp(buf, expect, len), 0);
    idem_free(buf);
}

Test(record, encoded_size_matches_encode)
{
    idem_record_t r = completed();
    size_t len;
    uint8_t *buf = enc(&r, &len);
    cr_expect_eq(idem_record_encoded_size(&r), len);
    idem_free(buf);
}

Test(record, encode_into_writes_what_encode_writes)
{
    idem_record_t r = completed();
    size_t len;
    uint8_t *buf = enc(&r, &len);
    uint8_t *into = malloc(len);
    idem_record_encode_into(&r, into);
    cr_expect_eq(memcmp(buf, into, len), 0);
    free(into);
    idem_free(buf);
}

Test(record, in_progress_decodes_without_allocating)
{
    idem_record_t in = in_progress(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    cr_assert_eq(dec_exact(buf, len, &out), IDEM_OK);
    cr_expect_null(out.owned);
    cr_expect_eq(out.response.n_headers, 0);
    cr_expect_eq(out.response.body_len, 0);
    cr_expect_eq(out.fence, 3);
    idem_free(buf);
}

Test(record, decoded_strings_are_nul_terminated)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    cr_assert_eq(dec_exact(buf, len, &out), IDEM_OK);
    cr_expect_str_eq(out.response.headers[0].name, "Content-Type");
    cr_expect_str_eq(out.response.headers[1].value, "");
    cr_expect_eq(out.response.body[out.response.body_len], '\0');
    idem_record_cleanup(&out);
    idem_free(buf);
}

Test(record, every_truncation_is_corrupt)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    for (size_t n = 0; n < len; n++) {
        cr_expect_eq(dec_exact(buf, n, &out), IDEM_E_CORRUPT, "prefix of %zu bytes", n);
        cr_expect(is_zero(&out));
    }
    idem_free(buf);
}

Test(record, trailing_bytes_are_corrupt)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    uint8_t *longer = calloc(1, len + 1);
    memcpy(longer, buf, len);
    cr_expect_eq(dec_exact(longer, len + 1, &out), IDEM_E_CORRUPT);
    free(longer);
    idem_free(buf);
}

Test(record, null_buffer_is_corrupt)
{
    idem_record_t out;
    cr_expect_eq(idem_record_decode(NULL, 0, &out), IDEM_E_CORRUPT);
}

/* Encode completed(), let damage() change it, decode: expect CORRUPT. */
static void expect_corrupt_after(void (*damage)(uint8_t *buf, size_t len))
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    damage(buf, len);
    /* Seal it again, so that what rejects it is the framing check. */
    uint32_t sum = idem__crc32c(0, buf, len - 4);
    for (int i = 0; i < 4; i++)
        buf[len - 4 + i] = (uint8_t)(sum >> (8 * i));
    cr_expect_eq(dec_exact(buf, len, &out), IDEM_E_CORRUPT);
    cr_expect_eq(idem_record_decode_head(buf, len, &out), IDEM_E_CORRUPT);
    cr_expect(is_zero(&out));
    idem_free(buf);
}

static void bad_magic(uint8_t *b, size_t n)
{
    b[0] = 'X';
}
static void bad_version(uint8_t *b, size_t n)
{
    b[3] = 3;
}
static void bad_state(uint8_t *b, size_t n)
{
    b[8] = 3;
}
static void unknown_flag(uint8_t *b, size_t n)
{
    b[4] |= 0x80;
}
static void value_len_past_end(uint8_t *b, size_t n)
{
    memset(b + 69 + 2, 0xFF, 4); /* first header's value_len */
}
static void name_len_past_end(uint8_t *b, size_t n)
{
    memset(b + 69, 0xFF, 2);
}
static void too_many_headers(uint8_t *b, size_t n)
{
    b[67] = 4;
}
static void body_len_past_end(uint8_t *b, size_t n)
{
    memset(b + n - 4 - (sizeof body - 1) - 4, 0xFF, 4);
}
static void body_len_short(uint8_t *b, size_t n)
{
    b[n - 4 - (sizeof body - 1) - 4] -= 1;
}

Test(record, foreign_magic_is_corrupt)
{
    expect_corrupt_after(bad_magic);
}

Test(record, other_version_is_corrupt)
{
    expect_corrupt_after(bad_version);
}

Test(record, unknown_state_is_corrupt)
{
    expect_corrupt_after(bad_state);
}

Test(record, unknown_flag_is_corrupt)
{
    expect_corrupt_after(unknown_flag);
}

Test(record, header_value_length_past_end_is_corrupt)
{
    expect_corrupt_after(value_len_past_end);
}

Test(record, header_name_length_past_end_is_corrupt)
{
    expect_corrupt_after(name_len_past_end);
}

Test(record, header_count_past_end_is_corrupt)
{
    expect_corrupt_after(too_many_headers);
}

Test(record, body_length_past_end_is_corrupt)
{
    expect_corrupt_after(body_len_past_end);
}

Test(record, body_length_short_of_end_is_corrupt)
{
    expect_corrupt_after(body_len_short);
}

Test(record, random_damage_never_reads_out_of_bounds)
{
    /* Every outcome is allowed except a crash or an overread (ASan): a
     * damaged value decodes, or it is CORRUPT. */
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    uint8_t *work = malloc(len);
    srand(12345);
    for (int round = 0; round < 20000; round++) {
        memcpy(work, buf, len);
        int flips = 1 + rand() % 4;
        for (int i = 0; i < flips; i++)
            work[(size_t)rand() % len] = (uint8_t)rand();
        size_t cut = len - (size_t)(rand() % 3 == 0 ? rand() % (int)len : 0);
        idem_err_t err = dec_exact(work, cut, &out);
        cr_assert(err == IDEM_OK || err == IDEM_E_CORRUPT);
        idem_record_cleanup(&out);
        idem_err_t herr = idem_record_decode_head(work, cut, &out);
        cr_assert_eq(herr, err, "decode_head and decode disagree");
        idem_record_cleanup(&out);
    }
    free(work);
    idem_free(buf);
}

Test(record, decode_head_reads_head_and_allocates_nothing)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    idem_alloc_fail_after(1); /* any allocation would fail */
    cr_assert_eq(idem_record_decode_head(buf, len, &out), IDEM_OK);
    idem_alloc_fail_after(0);
    cr_expect_null(out.owned);
    cr_expect_eq(out.fence, 7);
    cr_expect_eq(out.state, IDEM_STATE_COMPLETED);
    cr_expect_eq(out.expires_at_ms, in.expires_at_ms);
    cr_expect_eq(out.response.status, 201);
    cr_expect_eq(out.response.n_headers, 0);
    cr_expect_eq(out.response.body_len, 0);
    idem_free(buf);
}

Test(record, decode_out_of_memory_is_nomem_and_zeroes)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    idem_alloc_fail_after(1);
    idem_err_t err = idem_record_decode(buf, len, &out);
    idem_alloc_fail_after(0);
    cr_expect_eq(err, IDEM_E_NOMEM);
    cr_expect(is_zero(&out));
    idem_free(buf);
}

Test(record, encode_out_of_memory_is_nomem)
{
    idem_record_t in = completed();
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    idem_alloc_fail_after(1);
    idem_err_t err = idem_record_encode(&in, &buf, &len);
    idem_alloc_fail_after(0);
    cr_expect_eq(err, IDEM_E_NOMEM);
    cr_expect_null(buf);
    cr_expect_eq(len, 0);
}

Test(record, header_name_over_64KiB_is_toobig)
{
    static char big[70000];
    idem_header_t h = {big, sizeof big, "v", 1};
    idem_record_t r = completed();
    r.response.headers = &h;
    r.response.n_headers = 1;
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    cr_expect_eq(idem_record_encode(&r, &buf, &len), IDEM_E_TOOBIG);
    cr_expect_null(buf);
    cr_expect_eq(idem_record_encoded_size(&r), 0);
}

Test(record, over_65535_headers_is_toobig)
{
    idem_record_t r = completed();
    r.response.n_headers = 65536; /* refused before any header is read */
    uint8_t *buf;
    size_t len;
    cr_expect_eq(idem_record_encode(&r, &buf, &len), IDEM_E_TOOBIG);
}

Test(record, status_beyond_16_bits_is_toobig)
{
    idem_record_t r = completed();
    r.response.status = 70000;
    uint8_t *buf;
    size_t len;
    cr_expect_eq(idem_record_encode(&r, &buf, &len), IDEM_E_TOOBIG);
}

Test(record, copy_is_deep)
{
    char name[] = "X-Thing", value[] = "one";
    uint8_t b[] = "payload";
    idem_header_t h = {name, 7, value, 3};
    idem_record_t src = completed(), dst;
    src.response.headers = &h;
    src.response.n_headers = 1;
    src.response.body = b;
    src.response.body_len = 7;

    cr_assert_eq(idem_record_copy(&dst, &src), IDEM_OK);
    memset(name, '?', 7);
    memset(value, '?', 3);
    memset(b, '?', 7);
    cr_expect_eq(memcmp(dst.response.headers[0].name, "X-Thing", 7), 0);
    cr_expect_eq(memcmp(dst.response.headers[0].value, "one", 3), 0);
    cr_expect_eq(memcmp(dst.response.body, "payload", 7), 0);
    cr_expect_eq(dst.fence, src.fence);
    cr_expect_eq(memcmp(dst.fingerprint, src.fingerprint, IDEM_FP_LEN), 0);
    idem_record_cleanup(&dst);
}

Test(record, copy_of_decoded_outlives_original)
{
    idem_record_t in = completed(), a, b;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    cr_assert_eq(dec_exact(buf, len, &a), IDEM_OK);
    cr_assert_eq(idem_record_copy(&b, &a), IDEM_OK);
    idem_record_cleanup(&a);
    expect_same_response(&b, &in);
    idem_record_cleanup(&b);
    idem_free(buf);
}

Test(record, copy_out_of_memory_is_nomem_and_zeroes)
{
    idem_record_t src = completed(), dst;
    idem_alloc_fail_after(1);
    idem_err_t err = idem_record_copy(&dst, &src);
    idem_alloc_fail_after(0);
    cr_expect_eq(err, IDEM_E_NOMEM);
    cr_expect(is_zero(&dst));
}

Test(record, cleanup_zeroes_and_a_zeroed_record_is_a_noop)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    cr_assert_eq(dec_exact(buf, len, &out), IDEM_OK);
    idem_record_cleanup(&out);
    cr_expect(is_zero(&out));
    idem_record_cleanup(&out); /* twice: no double free */
    idem_record_cleanup(NULL);
    idem_free(buf);
}

/* ---- the checksum (version 2) --------------------------------------------- */

Test(record, crc32c_standard_check_value)
{
    cr_expect_eq(idem__crc32c(0, "123456789", 9), 0xE3069283u);
    cr_expect_eq(idem__crc32c_portable(0, "123456789", 9), 0xE3069283u);
    cr_expect_eq(idem__crc32c(0, "", 0), 0u);
    /* Extending in pieces is the same as all at once. */
    cr_expect_eq(idem__crc32c(idem__crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

Test(record, crc32c_hardware_and_table_agree)
{
    uint8_t buf[4096 + 8];
    srand(777);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rand();
    for (int round = 0; round < 2000; round++) {
        size_t off = (size_t)(rand() % 8), n = (size_t)(rand() % 4096);
        uint32_t seed = (uint32_t)rand();
        cr_assert_eq(idem__crc32c(seed, buf + off, n), idem__crc32c_portable(seed, buf + off, n),
                     "offset %zu, %zu bytes", off, n);
    }
}

Test(record, every_flipped_bit_is_corrupt)
{
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            cr_expect_eq(dec_exact(buf, len, &out), IDEM_E_CORRUPT, "byte %zu bit %d", i, bit);
            cr_expect(is_zero(&out));
            cr_expect_eq(idem_record_decode_head(buf, len, &out), IDEM_E_CORRUPT);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    }
    cr_expect_eq(dec_exact(buf, len, &out), IDEM_OK); /* undamaged again */
    idem_record_cleanup(&out);
    idem_free(buf);
}

Test(record, a_damaged_body_is_corrupt_not_replayed)
{
    /* The bug of issue 20: a body byte damaged on disk was replayed. */
    idem_record_t in = completed(), out;
    size_t len;
    uint8_t *buf = enc(&in, &len);
    uint8_t *b = memmem(buf, len, "\"id\":42", 7);
    cr_assert_not_null(b);
    b[5] = '3';
    cr_expect_eq(dec_exact(buf, len, &out), IDEM_E_CORRUPT);
    idem_free(buf);
}

/* The version 1 form of a version 2 value: no checksum, version byte 1. */
static uint8_t *as_v1(const uint8_t *v2, size_t len, size_t *v1_len)
{
    uint8_t *v1 = malloc(len - 4);
    cr_assert_not_null(v1);
    memcpy(v1, v2, len - 4);
    v1[3] = 1;
    *v1_len = len - 4;
    return v1;
}

Test(record, version_1_still_decodes)
{
    idem_record_t in = completed(), out;
    size_t len, len1;
    uint8_t *buf = enc(&in, &len);
    uint8_t *v1 = as_v1(buf, len, &len1);

    cr_assert_eq(dec_exact(v1, len1, &out), IDEM_OK);
    cr_expect_eq(out.state, in.state);
    cr_expect_eq(out.fence, in.fence);
    cr_expect_eq(memcmp(out.fingerprint, in.fingerprint, IDEM_FP_LEN), 0);
    expect_same_response(&out, &in);
    idem_record_cleanup(&out);
    cr_expect_eq(idem_record_decode_head(v1, len1, &out), IDEM_OK);

    /* Its framing is still checked; a version 1 value with a checksum
     * appended is as wrong as any trailing bytes. */
    cr_expect_eq(dec_exact(v1, len1 - 1, &out), IDEM_E_CORRUPT);
    uint8_t *longer = malloc(len);
    memcpy(longer, buf, len);
    longer[3] = 1;
    cr_expect_eq(dec_exact(longer, len, &out), IDEM_E_CORRUPT);

    /* Re-encoding a version 1 record writes version 2. */
    cr_assert_eq(dec_exact(v1, len1, &out), IDEM_OK);
    size_t len2;
    uint8_t *again = enc(&out, &len2);
    cr_expect_eq(len2, len);
    cr_expect_eq(memcmp(again, buf, len), 0);
    idem_record_cleanup(&out);
    idem_free(again);
    free(longer);
    free(v1);
    idem_free(buf);
}

Test(record, spliced_fingerprint_is_checked_as_zero)
{
    /* Redis: encoded with a zero fingerprint, the stored one spliced in. */
    idem_record_t in = completed(), out;
    memset(in.fingerprint, 0, IDEM_FP_LEN);
    size_t len;
    uint8_t *buf = enc(&in, &len);
    memset(buf + 9, 0x5A, IDEM_FP_LEN);

    cr_expect_eq(dec_exact(buf, len, &out), IDEM_E_CORRUPT); /* not as encoded */
    cr_assert_eq(idem__record_decode_spliced(buf, len, &out), IDEM_OK);
    uint8_t fp[IDEM_FP_LEN];
    memset(fp, 0x5A, IDEM_FP_LEN);
    cr_expect_eq(memcmp(out.fingerprint, fp, IDEM_FP_LEN), 0);
    expect_same_response(&out, &in);
    idem_record_cleanup(&out);

    /* Any other damaged byte is still caught. */
    for (size_t i = 0; i < len; i++) {
        if (i >= 9 && i < 9 + IDEM_FP_LEN)
            continue;
        buf[i] ^= 0x10;
        cr_expect_eq(idem__record_decode_spliced(buf, len, &out), IDEM_E_CORRUPT, "byte %zu", i);
        buf[i] ^= 0x10;
    }
    idem_free(buf);
}
