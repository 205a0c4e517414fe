/* tests/unit/test_jwt.c - the JWS verifier of the jwt:CLAIM scope source
 * (src/core/jwt.c).
 *
 * Every key is generated here with OpenSSL and every token signed here, so
 * no key file is committed and the code under test never checks itself: a
 * token is built byte by byte (base64url of the JSON written in the test)
 * and signed with EVP_DigestSign directly.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include "core/json.h"
#include "core/jwt.h"
#include "idem/alloc.h"

#define NOW INT64_C(1700000000)

/* ---- making keys and tokens --------------------------------------------------- */

static EVP_PKEY *gen(const char *type)
{
    EVP_PKEY *k = NULL;
    if (strcmp(type, "RSA") == 0)
        k = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
    else if (strcmp(type, "RSA1024") == 0)
        k = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
    else if (strcmp(type, "EC") == 0)
        k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    else if (strcmp(type, "P384") == 0)
        k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-384");
    else
        k = EVP_PKEY_Q_keygen(NULL, NULL, type);
    cr_assert_not_null(k, "keygen %s", type);
    return k;
}

/* Keys generated once per process: RSA keygen takes a moment. */
static EVP_PKEY *rsa1, *rsa2, *ec1, *ec2, *ed1, *ed2;

static void keys_once(void)
{
    if (rsa1 != NULL)
        return;
    rsa1 = gen("RSA");
    rsa2 = gen("RSA");
    ec1 = gen("EC");
    ec2 = gen("EC");
    ed1 = gen("ED25519");
    ed2 = gen("ED25519");
}

static void b64url(const unsigned char *in, size_t n, char *out, size_t cap)
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
        for (size_t c = 0; c < chars; c++) {
            cr_assert_lt(o + 1, cap);
            out[o++] = tab[(v >> (18 - 6 * c)) & 63];
        }
    }
    out[o] = '\0';
}

static char pembuf[8][4096];
static int pem_next;

/* The SubjectPublicKeyInfo PEM of k. */
static const char *pem(EVP_PKEY *k)
{
    BIO *b = BIO_new(BIO_s_mem());
    cr_assert_eq(PEM_write_bio_PUBKEY(b, k), 1);
    char *p = pembuf[pem_next++ % 8];
    int n = BIO_read(b, p, 4095);
    cr_assert_gt(n, 0);
    p[n] = '\0';
    BIO_free(b);
    return p;
}

/* The signature of msg with k by alg (for ES256 r || s, as JWS has it). */
static size_t sign(const char *alg, EVP_PKEY *k, const unsigned char *secret, size_t slen,
                   const char *msg, unsigned char *sig)
{
    size_t ml = strlen(msg);
    if (strcmp(alg, "HS256") == 0) {
        unsigned int l = 0;
        HMAC(EVP_sha256(), secret, (int)slen, (const unsigned char *)msg, ml, sig, &l);
        return l;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char der[600];
    size_t dl = sizeof der;
    cr_assert_eq(EVP_DigestSignInit(ctx, NULL, strcmp(alg, "EdDSA") == 0 ? NULL : EVP_sha256(),
                                    NULL, k),
                 1);
    cr_assert_eq(EVP_DigestSign(ctx, der, &dl, (const unsigned char *)msg, ml), 1);
    EVP_MD_CTX_free(ctx);
    if (strcmp(alg, "ES256") != 0) {
        memcpy(sig, der, dl);
        return dl;
    }
    const unsigned char *p = der;
    ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)dl);
    cr_assert_not_null(es);
    memset(sig, 0, 64);
    BN_bn2binpad(ECDSA_SIG_get0_r(es), sig, 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(es), sig + 32, 32);
    ECDSA_SIG_free(es);
    return 64;
}

/* Append src to dst (cap bytes in all). */
static void append(char *dst, size_t cap, const char *src)
{
    size_t dl = strlen(dst), sl = strlen(src);
    cr_assert_lt(dl + sl, cap);
    memcpy(dst + dl, src, sl + 1);
}

static char tokbuf[4][16384];
static int tok_next;

/* A compact JWS of the header and payload JSON texts, signed by signer
 * with alg (which may differ from the header's, to forge). */
static const char *token_as(const char *header, const char *payload, const char *alg,
                            EVP_PKEY *k, const unsigned char *secret, size_t slen)
{
    char *t = tokbuf[tok_next++ % 4];
    char part[12000];
    b64url((const unsigned char *)header, strlen(header), t, 6000);
    append(t, 16384, ".");
    b64url((const unsigned char *)payload, strlen(payload), part, sizeof part);
    append(t, 16384, part);
    unsigned char sig[600];
    size_t sl = alg == NULL ? 0 : sign(alg, k, secret, slen, t, sig);
    append(t, 16384, ".");
    b64url(sig, sl, part, sizeof part);
    append(t, 16384, part);
    return t;
}

static const char *token(const char *alg, const char *kid, const char *payload, EVP_PKEY *k)
{
    char header[200];
    if (kid != NULL)
        snprintf(header, sizeof header, "{\"alg\":\"%s\",\"typ\":\"JWT\",\"kid\":\"%s\"}", alg,
                 kid);
    else
        snprintf(header, sizeof header, "{\"alg\":\"%s\",\"typ\":\"JWT\"}", alg);
    return token_as(header, payload, alg, k, NULL, 0);
}

static const unsigned char SECRET[] = "0123456789abcdef0123456789abcdef-hs256";
#define SECRET_LEN (sizeof SECRET - 1)

static const char *hs_token(const char *payload, const unsigned char *secret, size_t slen)
{
    return token_as("{\"alg\":\"HS256\"}", payload, "HS256", NULL, secret, slen);
}

static idem__jwt_keys_t *keys_of(const char *text, const unsigned char *secret, size_t slen)
{
    idem__jwt_keys_t *k = NULL;
    char why[300] = "";
    cr_assert_eq(idem__jwt_keys_parse(text, text ? strlen(text) : 0, secret, slen, &k, why,
                                      sizeof why),
                 IDEM_OK, "%s", why);
    return k;
}

static idem__jwt_status_t check(const idem__jwt_keys_t *k, const char *tok, const char *path,
                                char *out)
{
    size_t l = 0;
    return idem__jwt_verify_claim(k, tok, strlen(tok), path, NOW, out, IDEM__JWT_MAX_CLAIM + 1,
                                  &l);
}

/* A JWK of the public key k with its kid (and alg when given). */
static void jwk(EVP_PKEY *k, const char *kid, const char *alg, char *out, size_t cap)
{
    char a[64] = "";
    if (alg != NULL)
        snprintf(a, sizeof a, ",\"alg\":\"%s\"", alg);
    if (EVP_PKEY_get_base_id(k) == EVP_PKEY_RSA) {
        BIGNUM *n = NULL, *e = NULL;
        unsigned char nb[512], eb[8];
        char n64[800], e64[16];
        EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_RSA_N, &n);
        EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_RSA_E, &e);
        int nl = BN_bn2bin(n, nb), el = BN_bn2bin(e, eb);
        b64url(nb, (size_t)nl, n64, sizeof n64);
        b64url(eb, (size_t)el, e64, sizeof e64);
        snprintf(out, cap, "{\"kty\":\"RSA\",\"kid\":\"%s\",\"n\":\"%s\",\"e\":\"%s\"%s}", kid, n64,
                 e64, a);
        BN_free(n);
        BN_free(e);
    } else if (EVP_PKEY_get_base_id(k) == EVP_PKEY_EC) {
        unsigned char pub[65];
        size_t pl = 0;
        char x[64], y[64];
        EVP_PKEY_get_octet_string_param(k, OSSL_PKEY_PARAM_PUB_KEY, pub, sizeof pub, &pl);
        if (pl != 65) { /* a compressed form: ask for the uncompressed one */
            EVP_PKEY_set_utf8_string_param(k, OSSL_PKEY_PARAM_EC_POINT_CONVERSION_FORMAT,
                                           "uncompressed");
            EVP_PKEY_get_octet_string_param(k, OSSL_PKEY_PARAM_PUB_KEY, pub, sizeof pub, &pl);
        }
        cr_assert_eq(pl, 65);
        b64url(pub + 1, 32, x, sizeof x);
        b64url(pub + 33, 32, y, sizeof y);
        snprintf(out, cap,
                 "{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"%s\",\"x\":\"%s\",\"y\":\"%s\"%s}",
                 kid, x, y, a);
    } else {
        unsigned char pub[32];
        size_t pl = sizeof pub;
        char x[64];
        EVP_PKEY_get_raw_public_key(k, pub, &pl);
        b64url(pub, pl, x, sizeof x);
        snprintf(out, cap, "{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"kid\":\"%s\",\"x\":\"%s\"%s}",
                 kid, x, a);
    }
}

static const char *GOOD = "{\"sub\":\"alice\",\"exp\":1700000600,\"nbf\":1699999000,"
                          "\"org\":{\"id\":42,\"name\":\"acme\"},\"n\":1.5,\"list\":[1]}";

/* ---- each algorithm, good and bad ----------------------------------------------- */

Test(jwt, rs256_good_and_bad)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(pem(rsa1), NULL, 0);
    cr_expect_eq(check(k, token("RS256", NULL, GOOD, rsa1), "sub", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "alice");
    cr_expect_eq(check(k, token("RS256", NULL, GOOD, rsa2), "sub", out), IDEM__JWT_SIGNATURE);
    cr_expect_str_eq(out, "");
    idem__jwt_keys_unref(k);
}

Test(jwt, es256_good_and_bad)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(pem(ec1), NULL, 0);
    cr_expect_eq(check(k, token("ES256", NULL, GOOD, ec1), "sub", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "alice");
    cr_expect_eq(check(k, token("ES256", NULL, GOOD, ec2), "sub", out), IDEM__JWT_SIGNATURE);
    idem__jwt_keys_unref(k);
}

Test(jwt, es256_der_signature_is_refused)
{
    /* JWS carries r || s; a DER ECDSA-Sig-Value (what some signers emit by
     * mistake) is not a signature here. */
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1], t[4096], sig64[200];
    idem__jwt_keys_t *k = keys_of(pem(ec1), NULL, 0);
    const char *good = token("ES256", NULL, GOOD, ec1);
    const char *dot = strrchr(good, '.');
    size_t head = (size_t)(dot - good);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char der[100];
    size_t dl = sizeof der;
    memcpy(t, good, head);
    t[head] = '\0';
    EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, ec1);
    EVP_DigestSign(ctx, der, &dl, (const unsigned char *)t, head);
    EVP_MD_CTX_free(ctx);
    b64url(der, dl, sig64, sizeof sig64);
    snprintf(t + head, sizeof t - head, ".%s", sig64);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_SIGNATURE);
    idem__jwt_keys_unref(k);
}

Test(jwt, eddsa_good_and_bad)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(pem(ed1), NULL, 0);
    cr_expect_eq(check(k, token("EdDSA", NULL, GOOD, ed1), "sub", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "alice");
    cr_expect_eq(check(k, token("EdDSA", NULL, GOOD, ed2), "sub", out), IDEM__JWT_SIGNATURE);
    idem__jwt_keys_unref(k);
}

Test(jwt, hs256_good_and_bad)
{
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(NULL, SECRET, SECRET_LEN);
    cr_expect_eq(check(k, hs_token(GOOD, SECRET, SECRET_LEN), "sub", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "alice");
    const unsigned char other[] = "0123456789abcdef0123456789abcdef-other";
    cr_expect_eq(check(k, hs_token(GOOD, other, sizeof other - 1), "sub", out),
                 IDEM__JWT_SIGNATURE);
    /* One byte short of the secret: a different key. */
    cr_expect_eq(check(k, hs_token(GOOD, SECRET, SECRET_LEN - 1), "sub", out),
                 IDEM__JWT_SIGNATURE);
    idem__jwt_keys_unref(k);
}

Test(jwt, a_short_hs256_secret_is_refused)
{
    idem__jwt_keys_t *k = NULL;
    char why[200] = "";
    cr_expect_eq(idem__jwt_keys_parse(NULL, 0, SECRET, 31, &k, why, sizeof why), IDEM_E_INVAL);
    cr_expect_null(k);
    cr_expect_not_null(strstr(why, "32"));
}

/* ---- algorithm confusion -------------------------------------------------------- */

Test(jwt, alg_none_never_passes)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(pem(rsa1), SECRET, SECRET_LEN);
    const char *t = token_as("{\"alg\":\"none\"}", GOOD, NULL, NULL, NULL, 0);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    t = token_as("{\"alg\":\"None\"}", GOOD, NULL, NULL, NULL, 0);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    /* A none token carrying some signature all the same. */
    t = token_as("{\"alg\":\"none\"}", GOOD, "HS256", NULL, SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    t = token_as("{\"typ\":\"JWT\"}", GOOD, "HS256", NULL, SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    idem__jwt_keys_unref(k);
}

Test(jwt, rsa_public_key_as_hs256_secret_fails)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    const char *p = pem(rsa1);
    /* Only the RSA key: no HS256 key at all. */
    idem__jwt_keys_t *k = keys_of(p, NULL, 0);
    const char *forged = hs_token(GOOD, (const unsigned char *)p, strlen(p));
    cr_expect_eq(check(k, forged, "sub", out), IDEM__JWT_ALGORITHM);
    idem__jwt_keys_unref(k);
    /* With a real secret too, the public key is still not it. */
    k = keys_of(p, SECRET, SECRET_LEN);
    cr_expect_eq(check(k, forged, "sub", out), IDEM__JWT_SIGNATURE);
    idem__jwt_keys_unref(k);
}

Test(jwt, algorithm_other_than_the_key_type_fails)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(pem(rsa1), NULL, 0);
    /* An RS256 signature under a header that says ES256 or EdDSA. */
    const char *t = token_as("{\"alg\":\"ES256\"}", GOOD, "RS256", rsa1, NULL, 0);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    t = token_as("{\"alg\":\"RS384\"}", GOOD, "RS256", rsa1, NULL, 0);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    t = token_as("{\"alg\":\"PS256\"}", GOOD, "RS256", rsa1, NULL, 0);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_ALGORITHM);
    idem__jwt_keys_unref(k);
}

/* ---- JWKS and kid ------------------------------------------------------------------ */

static idem__jwt_keys_t *jwks3(void)
{
    char a[1500], b[400], c[300], text[2600];
    jwk(rsa1, "r1", "RS256", a, sizeof a);
    jwk(ec1, "e1", NULL, b, sizeof b);
    jwk(ed1, "d1", NULL, c, sizeof c);
    snprintf(text, sizeof text,
             "{\"keys\":[%s,%s,%s,{\"kty\":\"oct\",\"k\":\"c2VjcmV0\"},"
             "{\"kty\":\"RSA\",\"use\":\"enc\",\"n\":\"AQAB\",\"e\":\"AQAB\"}]}",
             a, b, c);
    return keys_of(text, NULL, 0);
}

Test(jwt, jwks_with_several_keys_and_kids)
{
    keys_once();
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = jwks3();
    cr_expect_eq(idem__jwt_keys_count(k), 3); /* oct and enc keys passed over */
    cr_expect_eq(check(k, token("RS256", "r1", GOOD, rsa1), "sub", out), IDEM__JWT_OK);
    cr_expect_eq(check(k, token("ES256", "e1", GOOD, ec1), "sub", out), IDEM__JWT_OK);
    cr_expect_eq(check(k, token("EdDSA", "d1", GOOD, ed1), "sub", out), IDEM__JWT_OK);
    /* Without a kid every key of the type is tried. */
    cr_expect_eq(check(k, token("ES256", NULL, GOOD, ec1), "sub", out), IDEM__JWT_OK);
    /* A kid that names no key; a kid of another key's type. */
    cr_expect_eq(check(k, token("RS256", "nope", GOOD, rsa1), "sub", out),
                 IDEM__JWT_UNKNOWN_KID);
    cr_expect_eq(check(k, token("RS256", "e1", GOOD, rsa1), "sub", out), IDEM__JWT_UNKNOWN_KID);
    /* The right kid, the wrong signer. */
    cr_expect_eq(check(k, token("RS256", "r1", GOOD, rsa2), "sub", out), IDEM__JWT_SIGNATURE);
    /* No HS256 key in a JWKS, even with an oct key in it. */
    const unsigned char sec[] = "secret";
    cr_expect_eq(check(k, hs_token(GOOD, sec, 6), "sub", out), IDEM__JWT_ALGORITHM);
    idem__jwt_keys_unref(k);
}

Test(jwt, jwks_key_with_another_alg_is_not_loaded)
{
    keys_once();
    char a[1500], b[400], text[2000];
    jwk(rsa1, "r1", "HS256", a, sizeof a);
    jwk(ec1, "e1", NULL, b, sizeof b);
    snprintf(text, sizeof text, "{\"keys\":[%s,%s]}", a, b);
    idem__jwt_keys_t *k = keys_of(text, NULL, 0);
    cr_expect_eq(idem__jwt_keys_count(k), 1);
    char out[IDEM__JWT_MAX_CLAIM + 1];
    cr_expect_eq(check(k, token("RS256", "r1", GOOD, rsa1), "sub", out), IDEM__JWT_ALGORITHM);
    idem__jwt_keys_unref(k);
}

Test(jwt, pem_with_several_keys)
{
    keys_once();
    char text[8000];
    snprintf(text, sizeof text, "# comment lines are passed over\n%s%s%s", pem(rsa1), pem(ec1),
             pem(ed2));
    idem__jwt_keys_t *k = keys_of(text, NULL, 0);
    cr_expect_eq(idem__jwt_keys_count(k), 3);
    char out[IDEM__JWT_MAX_CLAIM + 1];
    cr_expect_eq(check(k, token("EdDSA", NULL, GOOD, ed2), "sub", out), IDEM__JWT_OK);
    cr_expect_eq(check(k, token("EdDSA", NULL, GOOD, ed1), "sub", out), IDEM__JWT_SIGNATURE);
    /* A token with a kid still meets a PEM key (which has none). */
    cr_expect_eq(check(k, token("RS256", "any", GOOD, rsa1), "sub", out), IDEM__JWT_OK);
    idem__jwt_keys_unref(k);
}

Test(jwt, key_files_that_do_not_load)
{
    keys_once();
    idem__jwt_keys_t *k = NULL;
    char why[300];
    EVP_PKEY *small = gen("RSA1024"), *p384 = gen("P384");
    const char *bad[] = {
        "", "not a key", "{\"keys\":[]}", "{\"nokeys\":1}", "{\"keys\":[{\"kty\":\"RSA\"}]}",
        "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AA\",\"y\":\"AA\"}]}",
        "{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"!!\"}]}", "{\"keys\":",
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
        pem(small), pem(p384),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        cr_expect_eq(idem__jwt_keys_parse(bad[i], strlen(bad[i]), NULL, 0, &k, why, sizeof why),
                     IDEM_E_INVAL, "%zu", i);
        cr_expect_null(k);
        cr_expect_neq(why[0], '\0', "%zu", i);
    }
    EVP_PKEY_free(small);
    EVP_PKEY_free(p384);
}

Test(jwt, keys_load_reads_files_and_names_the_unreadable_one)
{
    keys_once();
    char dir[] = "/tmp/test_jwt_XXXXXX", kp[64], sp[64], why[400];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(kp, sizeof kp, "%s/keys.pem", dir);
    snprintf(sp, sizeof sp, "%s/secret", dir);
    FILE *f = fopen(kp, "w");
    fputs(pem(ec1), f);
    fclose(f);
    f = fopen(sp, "w");
    fprintf(f, "%s\n", SECRET); /* one trailing newline is not the secret's */
    fclose(f);
    idem__jwt_keys_t *k = NULL;
    cr_assert_eq(idem__jwt_keys_load(kp, sp, &k, why, sizeof why), IDEM_OK, "%s", why);
    char out[IDEM__JWT_MAX_CLAIM + 1];
    cr_expect_eq(check(k, hs_token(GOOD, SECRET, SECRET_LEN), "sub", out), IDEM__JWT_OK);
    cr_expect_eq(check(k, token("ES256", NULL, GOOD, ec1), "sub", out), IDEM__JWT_OK);
    idem__jwt_keys_unref(k);
    cr_expect_eq(idem__jwt_keys_load("/nonexistent/keys", NULL, &k, why, sizeof why),
                 IDEM_E_INVAL);
    cr_expect_not_null(strstr(why, "/nonexistent/keys"));
    remove(kp);
    remove(sp);
    remove(dir);
}

/* ---- time ------------------------------------------------------------------------- */

Test(jwt, exp_and_nbf_with_leeway)
{
    char out[IDEM__JWT_MAX_CLAIM + 1], p[200];
    idem__jwt_keys_t *k = keys_of(NULL, SECRET, SECRET_LEN);
    struct {
        const char *claim; /* "exp" or "nbf" */
        int64_t at;
        const char *suffix; /* after the number */
        idem__jwt_status_t want;
    } cases[] = {
        {"exp", NOW - 61, "", IDEM__JWT_EXPIRED},
        {"exp", NOW - 60, "", IDEM__JWT_EXPIRED},
        {"exp", NOW - 59, "", IDEM__JWT_OK},
        {"exp", NOW - 60, ".9", IDEM__JWT_EXPIRED},
        {"nbf", NOW + 61, "", IDEM__JWT_NOT_YET_VALID},
        {"nbf", NOW + 60, "", IDEM__JWT_OK},
        {"exp", NOW + 600, "\"", IDEM__JWT_MALFORMED}, /* written as a string below */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool str = cases[i].suffix[0] == '"';
        snprintf(p, sizeof p, "{\"sub\":\"a\",\"%s\":%s%lld%s}", cases[i].claim, str ? "\"" : "",
                 (long long)cases[i].at, cases[i].suffix);
        cr_expect_eq(check(k, hs_token(p, SECRET, SECRET_LEN), "sub", out), cases[i].want,
                     "%s", p);
    }
    cr_expect_eq(check(k, hs_token("{\"sub\":\"a\",\"exp\":1e10}", SECRET, SECRET_LEN), "sub",
                       out),
                 IDEM__JWT_MALFORMED);
    cr_expect_eq(check(k, hs_token("{\"sub\":\"a\",\"exp\":99999999999999999999999}", SECRET,
                                   SECRET_LEN),
                       "sub", out),
                 IDEM__JWT_MALFORMED);
    /* No exp: the issuer chose a token that does not expire. */
    cr_expect_eq(check(k, hs_token("{\"sub\":\"a\"}", SECRET, SECRET_LEN), "sub", out),
                 IDEM__JWT_OK);
    idem__jwt_keys_unref(k);
}

/* ---- claims ------------------------------------------------------------------------ */

Test(jwt, claim_paths_and_types)
{
    char out[IDEM__JWT_MAX_CLAIM + 1];
    idem__jwt_keys_t *k = keys_of(NULL, SECRET, SECRET_LEN);
    const char *t = hs_token(GOOD, SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "org.id", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "42");
    cr_expect_eq(check(k, t, "org.name", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "acme");
    cr_expect_eq(check(k, t, "org", out), IDEM__JWT_CLAIM);      /* an object */
    cr_expect_eq(check(k, t, "n", out), IDEM__JWT_CLAIM);        /* not an integer */
    cr_expect_eq(check(k, t, "list", out), IDEM__JWT_CLAIM);     /* an array */
    cr_expect_eq(check(k, t, "missing", out), IDEM__JWT_CLAIM);
    cr_expect_eq(check(k, t, "sub.x", out), IDEM__JWT_CLAIM);
    cr_expect_eq(check(k, t, "org.id.x", out), IDEM__JWT_CLAIM);
    /* Escapes are decoded; a NUL inside is refused. */
    t = hs_token("{\"sub\":\"al\\u0069ce\",\"x\":\"a\\u0000b\",\"b\":true}", SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_OK);
    cr_expect_str_eq(out, "alice");
    cr_expect_eq(check(k, t, "x", out), IDEM__JWT_CLAIM);
    cr_expect_eq(check(k, t, "b", out), IDEM__JWT_CLAIM);
    /* An empty string names no one (found by fuzz_jwt): refused, so every
     * token with "sub":"" does not share one scope. */
    t = hs_token("{\"sub\":\"\",\"org\":{\"id\":\"\"}}", SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_CLAIM);
    cr_expect_eq(check(k, t, "org.id", out), IDEM__JWT_CLAIM);
    /* Two members of one name: the payload is not JSON here. */
    t = hs_token("{\"sub\":\"alice\",\"sub\":\"mallory\"}", SECRET, SECRET_LEN);
    cr_expect_eq(check(k, t, "sub", out), IDEM__JWT_MALFORMED);
    idem__jwt_keys_unref(k);
}

Test(jwt, a_claim_over_the_limit_is_refused)
{
    char out[IDEM__JWT_MAX_CLAIM + 1], p[2000];
    idem__jwt_keys_t *k = keys_of(NULL, SECRET, SECRET_LEN);
    int n = snprintf(p, sizeof p, "{\"sub\":\"");
    memset(p + n, 'a', IDEM__JWT_MAX_CLAIM + 1);
    snprintf(p + n + IDEM__JWT_MAX_CLAIM + 1, sizeof p - (size_t)n - IDEM__JWT_MAX_CLAIM - 1,
             "\"}");
    cr_expect_eq(check(k, hs_token(p, SECRET, SECRET_LEN), "sub", out), IDEM__JWT_CLAIM);
    idem__jwt_keys_unref(k);
}

/* ---- malformed tokens ----------------------------------------------------------------- */

Test(jwt, malformed_tokens)
{
    char out[IDEM__JWT_MAX_CLAIM + 1], t[12000];
    idem__jwt_keys_t *k = keys_of(NULL, SECRET, SECRET_LEN);
    const char *good = hs_token(GOOD, SECRET, SECRET_LEN);
    const char *bad[] = {"", "a", "a.b", "a.b.c.d", "..", "!!!.e30.", "e30.!!!.",
                         "eyJhbGciOiJIUzI1NiJ9.e30=.AAAA",     /* padding */
                         "eyJhbGciOiJIUzI1NiJ9.e31.AAAA",      /* unused bits set */
                         "bm90IGpzb24.e30.AAAA",               /* header not JSON */
                         "WzFd.e30.AAAA",                      /* header an array */
                         "eyJhbGciOiJIUzI1NiIsImNyaXQiOlsieCJdfQ.e30.AAAA", /* crit */
                         "eyJhbGciOiJIUzI1NiIsImtpZCI6MX0.e30.AAAA"};       /* kid: 1 */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(check(k, bad[i], "sub", out), IDEM__JWT_MALFORMED, "%s", bad[i]);
    /* A good token with a character changed in each part. */
    for (int part = 0; part < 3; part++) {
        snprintf(t, sizeof t, "%s", good);
        char *p = t;
        for (int d = 0; d < part; d++)
            p = strchr(p, '.') + 1;
        p[1] = p[1] == 'A' ? 'B' : 'A';
        cr_expect_neq(check(k, t, "sub", out), IDEM__JWT_OK, "part %d", part);
    }
    /* Over 8 KiB is refused before anything is decoded. */
    char big[IDEM__JWT_MAX_TOKEN + 100];
    char p[IDEM__JWT_MAX_TOKEN];
    memset(p, 0, sizeof p);
    int n = snprintf(p, sizeof p, "{\"sub\":\"alice\",\"pad\":\"");
    memset(p + n, 'x', 6200);
    append(p, sizeof p, "\"}");
    snprintf(big, sizeof big, "%s", hs_token(p, SECRET, SECRET_LEN));
    cr_expect_gt(strlen(big), IDEM__JWT_MAX_TOKEN);
    cr_expect_eq(check(k, big, "sub", out), IDEM__JWT_MALFORMED);
    idem__jwt_keys_unref(k);
}

Test(jwt, no_keys_verify_nothing)
{
    char out[IDEM__JWT_MAX_CLAIM + 1];
    cr_expect_eq(check(NULL, hs_token(GOOD, SECRET, SECRET_LEN), "sub", out),
                 IDEM__JWT_ALGORITHM);
}

Test(jwt, status_names)
{
    cr_expect_str_eq(idem__jwt_status_name(IDEM__JWT_SIGNATURE), "signature");
    cr_expect_str_eq(idem__jwt_status_name(IDEM__JWT_UNKNOWN_KID), "unknown_kid");
    cr_expect_str_eq(idem__jwt_status_name(IDEM__JWT__COUNT), "?");
}

/* ---- the JSON reader jwt.c stands on (src/core/json.c) -------------------------------- */

static idem__json_t *doc_of(const char *text)
{
    idem__json_t *d = NULL;
    cr_assert_eq(idem__json_parse(text, strlen(text), NULL, 0, &d), IDEM_OK, "%s", text);
    return d;
}

Test(jwt, json_member_in_objects_of_every_size)
{
    idem__json_t *d = doc_of("{\"a\":{},\"b\":{\"x\":1},\"c\\u0064\":\"v\",\"e\":[]}");
    size_t root = idem__json_root(d), v, w;
    cr_expect_eq(idem__json_member(d, root, "cd", 2, &v), 0); /* an escaped key */
    cr_expect_eq(idem__json_type(d, v), IDEM__JSON_STRING);
    cr_expect_eq(idem__json_member(d, root, "c", 1, &v), -1); /* a prefix is not the key */
    cr_expect_eq(idem__json_member(d, root, "a", 1, &v), 0);
    cr_expect_eq(idem__json_member(d, v, "x", 1, &w), -1);   /* no member */
    cr_expect_eq(idem__json_member(d, root, "b", 1, &v), 0);
    cr_expect_eq(idem__json_member(d, v, "x", 1, &w), 0);    /* one member */
    cr_expect_eq(idem__json_type(d, w), IDEM__JSON_NUMBER);
    cr_expect_eq(idem__json_member(d, w, "x", 1, &w), -1);   /* not an object */
    idem__json_destroy(d);
}

Test(jwt, json_next_walks_arrays)
{
    idem__json_t *d = doc_of("[ 1 , \"two\" , [3] , {\"f\":4} ]");
    size_t cur = 0, v, n = 0;
    idem__json_type_t want[] = {IDEM__JSON_NUMBER, IDEM__JSON_STRING, IDEM__JSON_ARRAY,
                                IDEM__JSON_OBJECT};
    while (idem__json_next(d, idem__json_root(d), &cur, &v) == 0) {
        cr_assert_lt(n, 4);
        cr_expect_eq(idem__json_type(d, v), want[n]);
        n++;
    }
    cr_expect_eq(n, 4);
    idem__json_destroy(d);
    d = doc_of("[]");
    cur = 0;
    cr_expect_eq(idem__json_next(d, idem__json_root(d), &cur, &v), -1);
    idem__json_destroy(d);
}

Test(jwt, json_string_and_integers)
{
    idem__json_t *d = doc_of("[\"a\\u00e9\\n\", -9223372036854775808, 9223372036854775808, "
                             "12.75, -0.5, 1e3, 7]");
    size_t cur = 0, v, l;
    char buf[8];
    int64_t i;
    const char *t;
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_string(d, v, buf, sizeof buf, &l), IDEM_OK);
    cr_expect_eq(l, 4);
    cr_expect_eq(memcmp(buf, "a\xc3\xa9\n", 4), 0);
    cr_expect_eq(idem__json_string(d, v, buf, 3, &l), IDEM_E_TOOBIG);
    cr_expect_eq(l, 0);
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int(d, v, &i, &t, &l), 0);
    cr_expect_eq(i, INT64_MIN);
    cr_expect_eq(l, 20);
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int(d, v, &i, &t, &l), -1); /* beyond int64 */
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int(d, v, &i, &t, &l), -1); /* a fraction */
    cr_expect_eq(idem__json_int_trunc(d, v, &i), 0);
    cr_expect_eq(i, 12);
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int_trunc(d, v, &i), 0);
    cr_expect_eq(i, 0);
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int_trunc(d, v, &i), -1); /* an exponent */
    cr_assert_eq(idem__json_next(d, idem__json_root(d), &cur, &v), 0);
    cr_expect_eq(idem__json_int(d, v, &i, &t, &l), 0);
    cr_expect_eq(i, 7);
    cr_expect_eq(idem__json_next(d, idem__json_root(d), &cur, &v), -1);
    idem__json_destroy(d);
}
