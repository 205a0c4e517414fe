/* src/core/key.c - the Idempotency-Key header value, and the caller's scope.
 *
 * docs/protocol.md section 2 accepts a key in two spellings, and both give the same key:
 *
 *   bare token   Idempotency-Key: 8e03978e-40d5     what most clients send
 *   SF string    Idempotency-Key: "8e03978e-40d5"   RFC 8941 sf-string, IETF draft
 *
 * Optional white space (SP, HTAB) around the value is trimmed first.  Then a
 * value that starts with a double quote is an sf-string: the characters
 * 0x20-0x7E up to the closing quote, where \" and \\ stand for " and \ and
 * any other backslash is an error, and nothing may follow the closing quote.
 * Any other value is a bare token: every character 0x21-0x7E (so no space, no
 * control character, no DEL, no byte >= 0x80) but the comma: "a, b" or
 * "a,b" is what an intermediary writes when it joins two Idempotency-Key
 * fields into one (RFC 9110 section 5.3), so a bare key with a comma is
 * refused rather than taken as one key that neither client sent.  A quoted
 * key may hold a comma: inside an sf-string it is unambiguous.  A quote or
 * backslash inside a bare token is kept as it is.  Either way the resulting key has 1 to
 * IDEM_KEY_MAX characters; a quoted key may hold spaces, even only spaces,
 * since docs/protocol.md section 2 allows space in a quoted string.
 *
 * Scope: the SHA-256 of the scope header's exact bytes in lowercase hex, or
 * "anonymous" when the header is absent.  An empty but present header is
 * hashed like any other value, so it is not anonymous.  Hashing keeps the raw
 * credential out of the store and the logs (docs/protocol.md section 3).
 *
 * THREADING: pure functions.
 */
#include <string.h>

#include "idem/fingerprint.h"
#include "idem/key.h"

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* The sf-string at p[0..n), p[0] being the opening quote. */
static idem_err_t parse_quoted(const unsigned char *p, size_t n, char *out)
{
    size_t i, len = 0;

    for (i = 1; i < n; i++) {
        unsigned char c = p[i];

        if (c == '"')
            break;
        if (c == '\\') {
            if (++i == n || (p[i] != '"' && p[i] != '\\'))
                return IDEM_E_INVAL;
            c = p[i];
        } else if (c < 0x20 || c > 0x7E) {
            return IDEM_E_INVAL;
        }
        if (len == IDEM_KEY_MAX)
            return IDEM_E_INVAL;
        out[len++] = (char)c;
    }
    /* Unterminated, trailing bytes after the closing quote, or "". */
    if (i != n - 1 || len == 0)
        return IDEM_E_INVAL;
    out[len] = '\0';
    return IDEM_OK;
}

static idem_err_t parse_bare(const unsigned char *p, size_t n, char *out)
{
    size_t i;

    if (n == 0 || n > IDEM_KEY_MAX)
        return IDEM_E_INVAL;
    for (i = 0; i < n; i++)
        if (p[i] < 0x21 || p[i] > 0x7E || p[i] == ',')
            return IDEM_E_INVAL;
    memcpy(out, p, n);
    out[n] = '\0';
    return IDEM_OK;
}

idem_err_t idem_key_parse(const char *value, size_t len, char *out)
{
    idem_err_t err;

    if (out == NULL)
        return IDEM_E_INVAL;
    out[0] = '\0';
    if (value == NULL)
        return IDEM_E_INVAL;
    while (len > 0 && is_ows(value[0])) {
        value++;
        len--;
    }
    while (len > 0 && is_ows(value[len - 1]))
        len--;
    if (len == 0)
        return IDEM_E_INVAL;
    if (value[0] == '"')
        err = parse_quoted((const unsigned char *)value, len, out);
    else
        err = parse_bare((const unsigned char *)value, len, out);
    if (err)
        out[0] = '\0';
    return err;
}

void idem_scope_from_header(const char *value, size_t len, char *out)
{
    if (value == NULL) {
        memcpy(out, "anonymous", sizeof "anonymous");
        return;
    }
    idem_sha256_hex(value, len, out);
}

int idem_scope_valid(const char *s)
{
    size_t i;

    if (s == NULL)
        return 0;
    if (strcmp(s, "anonymous") == 0)
        return 1;
    for (i = 0; i < IDEM_SCOPE_MAX; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[IDEM_SCOPE_MAX] == '\0';
}

/* UUIDv7 layout (RFC 9562 section 5.7), most significant bit first:
 * unix_ts_ms:48 | ver:4 = 0111 | rand_a:12 | var:2 = 10 | rand_b:62. */
void idem_key_generate(int64_t now_ms, const idem_rng_t *rng, char *out)
{
    static const char hex[] = "0123456789abcdef";
    uint64_t ts = (uint64_t)(now_ms < 0 ? 0 : now_ms) & UINT64_C(0xFFFFFFFFFFFF);
    uint64_t ra = idem_rng_u64(rng), rb = idem_rng_u64(rng);
    unsigned char b[16];
    size_t i, o = 0;

    for (i = 0; i < 6; i++)
        b[i] = (unsigned char)(ts >> (40 - 8 * i));
    b[6] = (unsigned char)(0x70 | ((ra >> 8) & 0x0F));
    b[7] = (unsigned char)ra;
    b[8] = (unsigned char)(0x80 | ((rb >> 56) & 0x3F));
    for (i = 9; i < 16; i++)
        b[i] = (unsigned char)(rb >> (8 * (15 - i)));
    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 0x0F];
    }
    out[o] = '\0';
}
