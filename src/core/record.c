/* src/core/record.c - the binary form of a key record.
 *
 * Every store keeps a record as one byte string in the layout documented in
 * include/idem/record.h: a fixed head of 69 bytes (magic "IDR", version,
 * flags, state, fingerprint, fence, lease end, retention end, status, header
 * count), then the response headers, each framed by its lengths, then the
 * body, framed by its length, then (version 2) the CRC32C of everything
 * before it.  Integers are little-endian whatever the host, so a data
 * directory can move between machines.
 *
 * Versions.  Encode writes version 2.  Decode takes version 2, whose
 * checksum it verifies on every decode (a flipped bit anywhere, the body
 * included, is IDEM_E_CORRUPT: a damaged record is an error, never a wrong
 * answer), and version 1, the same layout without the checksum, written
 * before checksums existed: such records keep working until they expire,
 * checked only for their framing.  Version 2 keeps version 1's head byte for
 * byte, so code that reads the head at fixed offsets (Redis's completion
 * script splices the fingerprint into bytes 10..41) is unchanged.  The
 * checksum is CRC32C (src/core/crc32c.h): one SSE4.2 instruction per 8 bytes
 * on x86-64, a slicing-by-8 table elsewhere.
 *
 * Decoding trusts nothing: a value may be truncated, damaged on disk, or
 * written by a later version.  One scan (scan()) walks the value checking
 * every length against what remains of the buffer before anything is read
 * or allocated; any short, long, corrupt or foreign value is IDEM_E_CORRUPT.
 * Only then does idem_record_decode copy the headers and body into ONE
 * allocation (header array, then each name and value NUL-terminated, then
 * the body NUL-terminated), which idem_record_cleanup frees at once.  The
 * NULs are not part of any length; they only make the strings easy to print.
 *
 * INVARIANTS: a value decodes iff scan() accepts it; idem_record_decode_head
 * accepts exactly the values idem_record_decode accepts (it scans and
 * checksums the whole value too, but copies nothing); encode(decode(v)) == v
 * for every accepted version 2 v.
 *
 * THREADING: pure functions; a record may be read from many threads, and
 * must be cleaned up by one.
 */
#include "idem/record.h"

#include <limits.h>
#include <pthread.h>
#include <string.h>

#include "core/crc32c.h"
#include "idem/alloc.h"
#include "core/record_splice.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define HAVE_CRC_SSE42 1
#endif

#define REC_VERSION 2    /* what encode writes */
#define REC_VERSION_V1 1 /* no checksum; still decoded */
#define REC_SUM_LEN 4u   /* version 2's trailing CRC32C */
#define REC_FP_AT 9u     /* the fingerprint's offset in the head */
#define REC_HEAD_LEN 69u /* magic 3, version 1, flags 4, state 1, fp 32,
                          * fence 8, lease 8, expires 8, status 2, n_headers 2 */
#define REC_KNOWN_FLAGS (IDEM_REC_HELD | IDEM_REC_NOT_RETAINED | IDEM_REC_TOKEN)

static const uint8_t magic[3] = {'I', 'D', 'R'};

/* ---- little-endian primitives ------------------------------------------ */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- CRC32C --------------------------------------------------------------- */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_tab[8][256]; /* slicing-by-8: tab[k][b] = b's CRC shifted k bytes */
static pthread_once_t crc_tab_once = PTHREAD_ONCE_INIT;

static void crc_tab_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            crc_tab[k][i] = (crc_tab[k - 1][i] >> 8) ^ crc_tab[0][crc_tab[k - 1][i] & 0xffu];
}

uint32_t idem__crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t c = ~crc;

    pthread_once(&crc_tab_once, crc_tab_init);
    for (; len >= 8; p += 8, len -= 8) {
        uint32_t lo = c ^ get32(p), hi = get32(p + 4);
        c = crc_tab[7][lo & 0xffu] ^ crc_tab[6][(lo >> 8) & 0xffu] ^
            crc_tab[5][(lo >> 16) & 0xffu] ^ crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xffu] ^
            crc_tab[2][(hi >> 8) & 0xffu] ^ crc_tab[1][(hi >> 16) & 0xffu] ^ crc_tab[0][hi >> 24];
    }
    for (; len > 0; p++, len--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p) & 0xffu];
    return ~c;
}

#ifdef HAVE_CRC_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p,
                                                            size_t len)
{
    uint64_t c = (uint32_t)~crc;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* the host's order is little-endian, as CRC32C reads */
        c = _mm_crc32_u64(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    for (; len > 0; p++, len--)
        c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}
#endif

uint32_t idem__crc32c(uint32_t crc, const void *buf, size_t len)
{
#ifdef HAVE_CRC_SSE42
    if (__builtin_cpu_supports("sse4.2"))
        return crc_sse42(crc, buf, len);
#endif
    return idem__crc32c_portable(crc, buf, len);
}

/* A value's checksum: bytes [0, n), where (spliced) the fingerprint counts
 * as zeros, as it was when the value was encoded. */
static uint32_t value_sum(const uint8_t *buf, size_t n, int spliced)
{
    static const uint8_t zeros[IDEM_FP_LEN];

    if (!spliced)
        return idem__crc32c(0, buf, n);
    uint32_t c = idem__crc32c(0, buf, REC_FP_AT);
    c = idem__crc32c(c, zeros, IDEM_FP_LEN);
    return idem__crc32c(c, buf + REC_FP_AT + IDEM_FP_LEN, n - REC_FP_AT - IDEM_FP_LEN);
}

/* ---- encoding ----------------------------------------------------------- */

/* Whether rec fits the layout's length prefixes; *size gets the encoded size. */
static int fits(const idem_record_t *rec, size_t *size)
{
    const idem_response_t *r = &rec->response;
    size_t n = REC_HEAD_LEN + 4 + REC_SUM_LEN;

    if (r->status < 0 || r->status > UINT16_MAX || r->n_headers > UINT16_MAX)
        return 0;
    if (r->n_headers > 0 && r->headers == NULL)
        return 0;
    if (r->body_len > UINT32_MAX || (r->body_len > 0 && r->body == NULL))
        return 0;
    for (size_t i = 0; i < r->n_headers; i++) {
        const idem_header_t *h = &r->headers[i];
        if (h->name_len > UINT16_MAX || h->value_len > UINT32_MAX)
            return 0;
        n += 6 + h->name_len + h->value_len; /* cannot overflow: each term is bounded */
    }
    n += r->body_len;
    *size = n;
    return 1;
}

/* Returns 0 when rec cannot be encoded (a field does not fit its prefix). */
size_t idem_record_encoded_size(const idem_record_t *rec)
{
    size_t n;
    return fits(rec, &n) ? n : 0;
}

void idem_record_encode_into(const idem_record_t *rec, uint8_t *buf)
{
    const idem_response_t *r = &rec->response;
    uint8_t *p = buf;

    memcpy(p, magic, 3);
    p[3] = REC_VERSION;
    put32(p + 4, rec->flags);
    p[8] = (uint8_t)rec->state;
    memcpy(p + 9, rec->fingerprint, IDEM_FP_LEN);
    put64(p + 41, rec->fence);
    put64(p + 49, (uint64_t)rec->lease_until_ms);
    put64(p + 57, (uint64_t)rec->expires_at_ms);
    put16(p + 65, (uint16_t)r->status);
    put16(p + 67, (uint16_t)r->n_headers);
    p += REC_HEAD_LEN;
    for (size_t i = 0; i < r->n_headers; i++) {
        const idem_header_t *h = &r->headers[i];
        put16(p, (uint16_t)h->name_len);
        put32(p + 2, (uint32_t)h->value_len);
        p += 6;
        if (h->name_len)
            memcpy(p, h->name, h->name_len);
        p += h->name_len;
        if (h->value_len)
            memcpy(p, h->value, h->value_len);
        p += h->value_len;
    }
    put32(p, (uint32_t)r->body_len);
    if (r->body_len)
        memcpy(p + 4, r->body, r->body_len);
    p += 4 + r->body_len;
    put32(p, idem__crc32c(0, buf, (size_t)(p - buf)));
}

idem_err_t idem_record_encode(const idem_record_t *rec, uint8_t **out, size_t *out_len)
{
    size_t n;

    *out = NULL;
    *out_len = 0;
    if (!fits(rec, &n))
        return IDEM_E_TOOBIG;
    uint8_t *buf = idem_malloc(n);
    if (buf == NULL)
        return IDEM_E_NOMEM;
    idem_record_encode_into(rec, buf);
    *out = buf;
    *out_len = n;
    return IDEM_OK;
}

/* ---- decoding ----------------------------------------------------------- */

/* Check the whole value and read its fixed head into rec (no pointers set).
 * *strings gets the bytes the headers' names and values take, without NULs. */
static idem_err_t scan(const uint8_t *buf, size_t len, int spliced, idem_record_t *rec,
                       size_t *strings)
{
    if (buf == NULL || len < REC_HEAD_LEN + 4 || memcmp(buf, magic, 3) != 0)
        return IDEM_E_CORRUPT;
    if (buf[3] == REC_VERSION) {
        /* The checksum first: nothing of a damaged value is believed. */
        if (len < REC_HEAD_LEN + 4 + REC_SUM_LEN)
            return IDEM_E_CORRUPT;
        len -= REC_SUM_LEN;
        if (value_sum(buf, len, spliced) != get32(buf + len))
            return IDEM_E_CORRUPT;
    } else if (buf[3] != REC_VERSION_V1) {
        return IDEM_E_CORRUPT;
    }

    uint32_t flags = get32(buf + 4);
    uint8_t state = buf[8];
    if ((flags & ~REC_KNOWN_FLAGS) != 0 ||
        (state != IDEM_STATE_IN_PROGRESS && state != IDEM_STATE_COMPLETED))
        return IDEM_E_CORRUPT;

    size_t n_headers = get16(buf + 67);
    size_t pos = REC_HEAD_LEN, sum = 0;
    for (size_t i = 0; i < n_headers; i++) {
        if (len - pos < 6)
            return IDEM_E_CORRUPT;
        size_t nl = get16(buf + pos), vl = get32(buf + pos + 2);
        pos += 6;
        /* Compared one at a time so that nl + vl cannot wrap. */
        if (len - pos < nl || len - pos - nl < vl)
            return IDEM_E_CORRUPT;
        pos += nl + vl;
        sum += nl + vl;
    }
    if (len - pos < 4)
        return IDEM_E_CORRUPT;
    size_t body_len = get32(buf + pos);
    pos += 4;
    if (len - pos != body_len) /* trailing bytes are as wrong as missing ones */
        return IDEM_E_CORRUPT;

    memset(rec, 0, sizeof *rec);
    rec->flags = flags;
    rec->state = (idem_state_t)state;
    memcpy(rec->fingerprint, buf + 9, IDEM_FP_LEN);
    rec->fence = get64(buf + 41);
    rec->lease_until_ms = (int64_t)get64(buf + 49);
    rec->expires_at_ms = (int64_t)get64(buf + 57);
    rec->response.status = get16(buf + 65);
    rec->response.n_headers = n_headers;
    rec->response.body_len = body_len;
    *strings = sum;
    return IDEM_OK;
}

idem_err_t idem_record_decode_head(const uint8_t *buf, size_t len, idem_record_t *rec)
{
    size_t strings;
    idem_err_t err = scan(buf, len, 0, rec, &strings);

    if (err != IDEM_OK) {
        memset(rec, 0, sizeof *rec);
        return err;
    }
    rec->response.n_headers = 0;
    rec->response.body_len = 0;
    return IDEM_OK;
}

/* Reader of the serialised headers for pack(): fills h from the value. */
struct wire {
    const uint8_t *p;
};

/* Copy n headers and a body into one allocation owned by rec.  The source
 * is either an array (src_headers) or the serialised form (w), whichever is
 * non-NULL.  strings is the sum of all name and value lengths. */
static idem_err_t pack(idem_record_t *rec, const idem_header_t *src_headers, struct wire *w,
                       size_t n, size_t strings, const uint8_t *body, size_t body_len)
{
    rec->owned = NULL;
    rec->response.headers = NULL;
    rec->response.body = NULL;
    if (n == 0 && body_len == 0)
        return IDEM_OK; /* an in_progress record owns nothing */

    /* Every term is bounded by a 32-bit length times a 16-bit count, so the
     * sum fits a 64-bit size_t. */
    size_t total = n * sizeof(idem_header_t) + strings + 2 * n + body_len + 1;
    uint8_t *mem = idem_malloc(total);
    if (mem == NULL)
        return IDEM_E_NOMEM;

    idem_header_t *hs = (idem_header_t *)(void *)mem;
    char *s = (char *)(mem + n * sizeof(idem_header_t));
    for (size_t i = 0; i < n; i++) {
        const char *name, *value;
        size_t nl, vl;
        if (src_headers != NULL) {
            name = src_headers[i].name;
            nl = src_headers[i].name_len;
            value = src_headers[i].value;
            vl = src_headers[i].value_len;
        } else {
            nl = get16(w->p);
            vl = get32(w->p + 2);
            name = (const char *)w->p + 6;
            value = name + nl;
            w->p += 6 + nl + vl;
        }
        hs[i].name = s;
        hs[i].name_len = nl;
        if (nl)
            memcpy(s, name, nl);
        s[nl] = '\0';
        s += nl + 1;
        hs[i].value = s;
        hs[i].value_len = vl;
        if (vl)
            memcpy(s, value, vl);
        s[vl] = '\0';
        s += vl + 1;
    }
    if (body_len)
        memcpy(s, body, body_len);
    s[body_len] = '\0';

    rec->owned = mem;
    rec->response.headers = n ? hs : NULL;
    rec->response.n_headers = n;
    rec->response.body = (const uint8_t *)s;
    rec->response.body_len = body_len;
    return IDEM_OK;
}

static idem_err_t decode(const uint8_t *buf, size_t len, int spliced, idem_record_t *rec)
{
    size_t strings;
    idem_err_t err = scan(buf, len, spliced, rec, &strings);

    if (err == IDEM_OK) {
        struct wire w = {buf + REC_HEAD_LEN};
        size_t n = rec->response.n_headers, body_len = rec->response.body_len;
        size_t end = buf[3] == REC_VERSION ? len - REC_SUM_LEN : len;
        const uint8_t *body = buf + end - body_len;
        err = pack(rec, NULL, &w, n, strings, body, body_len);
    }
    if (err != IDEM_OK)
        memset(rec, 0, sizeof *rec);
    return err;
}

idem_err_t idem_record_decode(const uint8_t *buf, size_t len, idem_record_t *rec)
{
    return decode(buf, len, 0, rec);
}

idem_err_t idem__record_decode_spliced(const uint8_t *buf, size_t len, idem_record_t *rec)
{
    return decode(buf, len, 1, rec);
}

idem_err_t idem_record_copy(idem_record_t *dst, const idem_record_t *src)
{
    const idem_response_t *r = &src->response;
    size_t size, strings = 0;

    memset(dst, 0, sizeof *dst);
    if (!fits(src, &size))
        return IDEM_E_TOOBIG; /* the same limits as a stored record */
    for (size_t i = 0; i < r->n_headers; i++)
        strings += r->headers[i].name_len + r->headers[i].value_len;

    *dst = *src;
    idem_err_t err = pack(dst, r->headers, NULL, r->n_headers, strings, r->body, r->body_len);
    if (err != IDEM_OK)
        memset(dst, 0, sizeof *dst);
    return err;
}

void idem_record_cleanup(idem_record_t *rec)
{
    if (rec == NULL)
        return;
    idem_free(rec->owned);
    memset(rec, 0, sizeof *rec);
}
