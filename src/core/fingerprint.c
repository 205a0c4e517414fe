/* src/core/fingerprint.c - what makes two requests "the same request".
 *
 * A fingerprint is SHA-256 over a byte stream of frames.  A frame is
 *
 *     tag (1 byte) | length (8 bytes, big-endian) | that many bytes
 *
 * and the stream is, in this order:
 *
 *     'V' "idem-fp-1"               the version of this encoding
 *     'M' method                    as received (methods are case-sensitive)
 *     'T' target                    path and query, as received
 *     per configured header, in the configured order:
 *       'N' name                    ASCII-lowercased, so Content-Type and
 *                                   content-type are one header
 *       'P' value                   when the request carries the header, or
 *       'A' (empty)                 when it does not: absent is not ""
 *     'J' canonical JSON            with body_json, when the body is JSON, or
 *     'B' body                      the raw bytes otherwise
 *
 * Every frame says how long it is and the tags say where in the grammar it
 * stands, so the stream can be cut back into its fields in exactly one way:
 * method "POST" with target "/a" and method "POS" with target "T/a" hash
 * different streams, and so do a header that is absent and one that is
 * empty.  A change to this encoding changes every fingerprint, and stored
 * records would then answer 422 to honest retries across an upgrade: bump
 * the version frame and say so in the release notes.
 *
 * Canonical JSON ('J', idem_json_canonicalize) is written by src/core/json.c,
 * which says what it is and what counts as JSON.  In the fingerprint, "not
 * JSON" means the body is hashed raw (frame 'B'), as docs/protocol.md
 * section 4 says.  The canonical form is streamed into the hash, never held
 * in memory: the parse measures its length for the frame's head first.
 *
 * The version frame stayed "idem-fp-1" when json.c replaced jansson: the
 * frames did not change, and neither did the canonical form of strings and
 * of int64 integers, so the fingerprints of raw bodies and of JSON bodies
 * whose numbers are all integers are what they were (a unit test pins
 * one).  A JSON body with a number such as 1.0, 0.1 or 1e3 gets a new one,
 * since jansson wrote those through a double ("1.0", "0.10000000000000001",
 * "1000.0"); so does a body jansson refused and json.c takes (an integer
 * beyond int64, "\u0000"), which moves from 'B' to 'J'.  Bumping the
 * version would have changed every fingerprint instead, turning every
 * retry across an upgrade into a 422.  The one thing the old form can
 * still do until its records expire (key_ttl after the upgrade): a record
 * of a number jansson rounded, such as 0.1000000000000000055 written as
 * "0.10000000000000001", matches a request that spells the rounded value.
 *
 * THREADING: reentrant; the one-time lookup of SHA-256 is guarded by
 * pthread_once.
 */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/json.h"
#include "idem/fingerprint.h"

#define FP_VERSION "idem-fp-1"

static const char hexdigits[] = "0123456789abcdef";

static void to_hex(const uint8_t *b, size_t n, char *out)
{
    size_t i;

    for (i = 0; i < n; i++) {
        out[2 * i] = hexdigits[b[i] >> 4];
        out[2 * i + 1] = hexdigits[b[i] & 0x0F];
    }
    out[2 * n] = '\0';
}

void idem_fp_hex(const uint8_t fp[IDEM_FP_LEN], char *out)
{
    to_hex(fp, IDEM_FP_LEN, out);
}

/* OpenSSL 3 looks the algorithm up in its provider tables on every
 * EVP_DigestInit with EVP_sha256(); fetching it once saves that lookup on
 * every request (it showed as half the cost of a fingerprint).  The fetched
 * object lives until exit, like OpenSSL's own tables. */
static pthread_once_t md_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void fetch_sha256(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_md(void)
{
    pthread_once(&md_once, fetch_sha256);
    return sha256_fetched ? sha256_fetched : EVP_sha256();
}

void idem_sha256_hex(const void *data, size_t len, char *out)
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;

    if (data == NULL)
        data = "";
    if (!EVP_Digest(data, len, md, &md_len, sha256_md(), NULL) || md_len != 32) {
        out[0] = '\0';
        return;
    }
    to_hex(md, 32, out);
}

/* ---- the fingerprint ------------------------------------------------------ */

static int frame_head(EVP_MD_CTX *ctx, char tag, size_t len)
{
    unsigned char h[9];
    uint64_t n = (uint64_t)len;
    int i;

    h[0] = (unsigned char)tag;
    for (i = 8; i >= 1; i--) {
        h[i] = (unsigned char)(n & 0xFF);
        n >>= 8;
    }
    return EVP_DigestUpdate(ctx, h, sizeof h);
}

static int frame(EVP_MD_CTX *ctx, char tag, const void *data, size_t len)
{
    if (!frame_head(ctx, tag, len))
        return 0;
    return len == 0 || EVP_DigestUpdate(ctx, data, len);
}

/* The 'N' frame: the name lowercased in pieces, so no copy is needed. */
static int frame_lower(EVP_MD_CTX *ctx, char tag, const char *s, size_t len)
{
    char chunk[64];
    size_t i, n;

    if (!frame_head(ctx, tag, len))
        return 0;
    while (len > 0) {
        n = len < sizeof chunk ? len : sizeof chunk;
        for (i = 0; i < n; i++)
            chunk[i] = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] - 'A' + 'a') : s[i];
        if (!EVP_DigestUpdate(ctx, chunk, n))
            return 0;
        s += n;
        len -= n;
    }
    return 1;
}

static int input_ok(const idem_fp_input_t *in)
{
    size_t i;

    if ((in->method == NULL && in->method_len > 0) || (in->target == NULL && in->target_len > 0) ||
        (in->body == NULL && in->body_len > 0) || (in->headers == NULL && in->n_headers > 0) ||
        (in->ignore == NULL && in->n_ignore > 0))
        return 0;
    for (i = 0; i < in->n_headers; i++) {
        const idem_fp_header_t *h = &in->headers[i];
        if ((h->name == NULL && h->name_len > 0) || (h->value == NULL && h->value_len > 0))
            return 0;
    }
    return 1;
}

static int digest_sink(void *ctx, const void *data, size_t len)
{
    return EVP_DigestUpdate(ctx, data, len);
}

idem_err_t idem_fingerprint(const idem_fp_input_t *in, uint8_t out[IDEM_FP_LEN])
{
    EVP_MD_CTX *ctx;
    idem__json_t *doc = NULL;
    size_t i;
    unsigned int md_len = 0;
    idem_err_t err = IDEM_OK;
    int ok;

    if (out != NULL)
        memset(out, 0, IDEM_FP_LEN);
    if (in == NULL || out == NULL || !input_ok(in))
        return IDEM_E_INVAL;
    if (in->body_json) {
        err = idem__json_parse((const char *)in->body, in->body_len, in->ignore, in->n_ignore,
                               &doc);
        if (err == IDEM_E_NOMEM)
            return err;
    }
    ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        idem__json_destroy(doc);
        return IDEM_E_NOMEM;
    }
    ok = EVP_DigestInit_ex(ctx, sha256_md(), NULL) &&
         frame(ctx, 'V', FP_VERSION, sizeof FP_VERSION - 1) &&
         frame(ctx, 'M', in->method, in->method_len) &&
         frame(ctx, 'T', in->target, in->target_len);
    for (i = 0; ok && i < in->n_headers; i++) {
        const idem_fp_header_t *h = &in->headers[i];
        ok = frame_lower(ctx, 'N', h->name, h->name_len) &&
             (h->value != NULL ? frame(ctx, 'P', h->value, h->value_len)
                               : frame(ctx, 'A', NULL, 0));
    }
    if (ok && doc != NULL)
        ok = frame_head(ctx, 'J', idem__json_canonical_len(doc)) &&
             idem__json_emit(doc, digest_sink, ctx);
    else if (ok)
        ok = frame(ctx, 'B', in->body, in->body_len);
    ok = ok && EVP_DigestFinal_ex(ctx, out, &md_len) && md_len == IDEM_FP_LEN;
    EVP_MD_CTX_free(ctx);
    idem__json_destroy(doc);
    if (!ok) {
        memset(out, 0, IDEM_FP_LEN);
        return IDEM_E_NOMEM; /* libcrypto fails only when memory is short */
    }
    return IDEM_OK;
}
