/* fuzz/fuzz_jwt.c - libFuzzer target for the JWS verifier of the jwt:CLAIM
 * scope source (src/core/jwt.c) and its key loader.
 *
 * The first byte picks what the rest is:
 *   0 mod 3  a compact token, verified against a fixed set (an HS256
 *            secret, and an EC P-256 and an Ed25519 key made at start);
 *   1 mod 3  "HEADER\nPAYLOAD": two JSON texts that the target encodes and
 *            signs with the HS256 secret, so that the fuzzer reaches what
 *            comes after the signature (times, the claim path, types);
 *   2 mod 3  a key file (PEM or JWKS) for idem__jwt_keys_parse.
 * The claim path is "sub" or "org.id", by the second byte.
 * Properties checked:
 *   - the status is one of idem__jwt_status_t; verifying twice gives the
 *     same status and value (no hidden state);
 *   - on IDEM__JWT_OK the value is 1..IDEM__JWT_MAX_CLAIM bytes without a
 *     NUL, NUL-terminated; otherwise it is "" and its length 0;
 *   - a token over IDEM__JWT_MAX_TOKEN bytes never verifies;
 *   - in mode 1, a header whose alg is not HS256 never verifies, and a
 *     token accepted has the payload's claim;
 *   - a key file that loads holds 1..IDEM__JWT_MAX_KEYS keys; one that
 *     does not says why.
 * The value buffer is a heap block of exactly IDEM__JWT_MAX_CLAIM + 1
 * bytes, so a write past it is caught by AddressSanitizer.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include "core/jwt.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NOW INT64_C(1700000000)

static const unsigned char secret[] = "fuzz-secret-fuzz-secret-fuzz-secret!";
static idem__jwt_keys_t *keys;

static void append_pem(char *buf, size_t cap, size_t *len, EVP_PKEY *k)
{
    BIO *b = BIO_new(BIO_s_mem());
    CHECK(b != NULL && PEM_write_bio_PUBKEY(b, k) == 1);
    int n = BIO_read(b, buf + *len, (int)(cap - *len - 1));
    CHECK(n > 0);
    *len += (size_t)n;
    BIO_free(b);
}

static void init_keys(void)
{
    if (keys != NULL)
        return;
    char pem[4096];
    size_t len = 0;
    EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    EVP_PKEY *ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    CHECK(ec != NULL && ed != NULL);
    append_pem(pem, sizeof pem, &len, ec);
    append_pem(pem, sizeof pem, &len, ed);
    EVP_PKEY_free(ec);
    EVP_PKEY_free(ed);
    char why[300];
    CHECK(idem__jwt_keys_parse(pem, len, secret, sizeof secret - 1, &keys, why, sizeof why) ==
          IDEM_OK);
}

static size_t b64url(const unsigned char *in, size_t n, char *out)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        size_t chars = i + 2 < n ? 4 : i + 1 < n ? 3 : 2;
        for (size_t c = 0; c < chars; c++)
            out[o++] = tab[(v >> (18 - 6 * c)) & 63];
    }
    return o;
}

/* Verify tok[0..len) twice and check the properties; returns the status. */
static idem__jwt_status_t verify(const char *tok, size_t len, const char *path, char **value)
{
    char *in = malloc(len ? len : 1);
    char *out = malloc(IDEM__JWT_MAX_CLAIM + 1), *again = malloc(IDEM__JWT_MAX_CLAIM + 1);
    CHECK(in != NULL && out != NULL && again != NULL);
    memcpy(in, tok, len);
    size_t ol = 99, al = 99;
    idem__jwt_status_t st =
        idem__jwt_verify_claim(keys, in, len, path, NOW, out, IDEM__JWT_MAX_CLAIM + 1, &ol);
    idem__jwt_status_t st2 =
        idem__jwt_verify_claim(keys, in, len, path, NOW, again, IDEM__JWT_MAX_CLAIM + 1, &al);
    free(in);
    CHECK((unsigned)st < IDEM__JWT__COUNT && st != IDEM__JWT_NOMEM);
    CHECK(st == st2 && ol == al && memcmp(out, again, ol + 1) == 0);
    if (st == IDEM__JWT_OK) {
        CHECK(len <= IDEM__JWT_MAX_TOKEN);
        CHECK(ol >= 1 && ol <= IDEM__JWT_MAX_CLAIM && out[ol] == '\0');
        CHECK(memchr(out, '\0', ol) == NULL);
    } else {
        CHECK(ol == 0 && out[0] == '\0');
    }
    free(again);
    *value = out;
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init_keys();
    if (size < 2)
        return 0;
    unsigned mode = data[0] % 3;
    const char *path = data[1] & 1 ? "org.id" : "sub";
    const char *rest = (const char *)data + 2;
    size_t n = size - 2;
    char *value = NULL;

    if (mode == 0) {
        (void)verify(rest, n, path, &value);
    } else if (mode == 1) {
        const char *nl = memchr(rest, '\n', n);
        if (nl == NULL || n > 6000)
            return 0;
        size_t hl = (size_t)(nl - rest), pl = n - hl - 1;
        char *tok = malloc(2 * n + 200);
        CHECK(tok != NULL);
        size_t t = b64url((const unsigned char *)rest, hl, tok);
        tok[t++] = '.';
        t += b64url((const unsigned char *)nl + 1, pl, tok + t);
        unsigned char mac[32];
        unsigned int ml = 0;
        CHECK(HMAC(EVP_sha256(), secret, (int)sizeof secret - 1, (const unsigned char *)tok, t,
                   mac, &ml) != NULL);
        tok[t++] = '.';
        t += b64url(mac, ml, tok + t);
        idem__jwt_status_t st = verify(tok, t, path, &value);
        /* Only HS256 is signed here: any other alg must fail. */
        if (st == IDEM__JWT_OK)
            CHECK(memmem(rest, hl, "HS256", 5) != NULL ||
                  memchr(rest, '\\', hl) != NULL); /* "HS\u0032..." spells it too */
        if (st == IDEM__JWT_OK && strcmp(path, "sub") == 0)
            CHECK(memmem(nl + 1, pl, "sub", 3) != NULL || memchr(nl + 1, '\\', pl) != NULL);
        free(tok);
    } else {
        idem__jwt_keys_t *k = NULL;
        char why[300] = "";
        char *in = malloc(n ? n : 1);
        CHECK(in != NULL);
        memcpy(in, rest, n);
        idem_err_t e = idem__jwt_keys_parse(in, n, NULL, 0, &k, why, sizeof why);
        free(in);
        CHECK(e == IDEM_OK || e == IDEM_E_INVAL || e == IDEM_E_NOMEM);
        if (e == IDEM_OK) {
            CHECK(idem__jwt_keys_count(k) >= 1 && idem__jwt_keys_count(k) <= IDEM__JWT_MAX_KEYS);
        } else {
            CHECK(k == NULL);
            CHECK(e == IDEM_E_NOMEM || why[0] != '\0');
        }
        idem__jwt_keys_unref(k);
    }
    free(value);
    return 0;
}
