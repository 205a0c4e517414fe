/* src/core/jwt.c - a small JWS verifier for the jwt:CLAIM scope source.
 *
 * WHY OUR OWN
 * Debian 12 ships libjwt 1.10.  It takes one key buffer and lets the
 * token's own `alg` decide how that buffer is used (so a public key can be
 * offered to it as an HMAC secret unless the caller checks first), it has
 * no JWKS and no EdDSA (both came with libjwt 3), it needs jansson, and its
 * HMAC compare was not constant-time before CVE-2024-25189 was fixed.  What
 * a verifier needs beyond that is small: base64url, a JSON reader (the
 * project's own, src/core/json.c, which refuses duplicate members) and the
 * signature primitives, which come from OpenSSL's EVP interface.  So the
 * cryptography is OpenSSL's and only the framing is ours, and it is fuzzed
 * (fuzz/fuzz_jwt.c).
 *
 * WHAT A TOKEN MUST BE
 *   - Three parts of strict base64url (no padding, no other characters, the
 *     unused bits of the last character zero), at most IDEM__JWT_MAX_TOKEN
 *     bytes in all.
 *   - A header that is a JSON object with `alg` one of RS256, ES256, EdDSA,
 *     HS256; no `crit` (we understand no extension); `kid`, when present, a
 *     string.
 *   - A signature that one candidate key verifies.  The algorithm decides
 *     the key type and never the other way round: RS256 only with RSA keys
 *     (2048 bits or more), ES256 only with P-256 keys, EdDSA only with
 *     Ed25519 keys, HS256 only with the jwt_secret_file secret.  A public
 *     key is never an HMAC secret, and `alg: none` names no key type, so it
 *     never passes.  The candidates are the keys of that type that carry the
 *     token's `kid`, and those that carry none (PEM keys, the secret); a
 *     token with a `kid` that none of them carries is IDEM__JWT_UNKNOWN_KID.
 *     A JWKS key whose `alg` names another algorithm, or whose `use` is not
 *     "sig", is not loaded.
 *   - A payload that is a JSON object; `exp` and `nbf`, when present, are
 *     numbers (a fraction is cut off) and hold with IDEM__JWT_LEEWAY_S of
 *     leeway: expired when now >= exp + 60, not yet valid when now + 60 <
 *     nbf.  A token without `exp` does not expire here (the issuer decides).
 *   - The claim, found by following the dotted path through objects, is a
 *     non-empty string (without a NUL) or an integer of at most
 *     IDEM__JWT_MAX_CLAIM bytes.
 * The signature is checked before anything of the payload is read.  The
 * HS256 compare is CRYPTO_memcmp.  ES256 signatures are r || s (RFC 7518
 * 3.4); they are turned into the DER that EVP expects.
 *
 * KEYS
 * A PEM file holds `-----BEGIN PUBLIC KEY-----` blocks (what `openssl pkey
 * -pubout` writes); blocks of other names (a certificate, a private key) are
 * passed over, and text between blocks is ignored.  A JWKS is {"keys":
 * [...]} with RSA (n, e), EC P-256 (x, y) and OKP Ed25519 (x) keys, built
 * with EVP_PKEY_fromdata; keys of other types ("oct" included: the HS256
 * secret comes only from jwt_secret_file) are passed over.  A set without a
 * usable key, or with a key that is malformed or of a refused size, is an
 * error: the operator hears it at start or on SIGHUP.
 *
 * INVARIANTS: every buffer is bounded by IDEM__JWT_MAX_TOKEN or the file cap;
 * no allocation depends on the token but the JSON parses of its two parts.
 *
 * THREADING: see jwt.h.
 */
#include "core/jwt.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include "core/json.h"
#include "idem/alloc.h"

enum ktype { K_RSA = 0, K_EC, K_ED25519, K_SECRET };

#define KID_MAX 256

struct jkey {
    enum ktype type;
    EVP_PKEY *pkey;          /* NULL for K_SECRET */
    bool has_kid;
    char kid[KID_MAX + 1];
};

struct idem__jwt_keys {
    _Atomic unsigned refs;
    struct jkey keys[IDEM__JWT_MAX_KEYS];
    size_t n;
    unsigned char *secret; /* idem_malloc'd, secret_len bytes; NULL without */
    size_t secret_len;
};

const char *idem__jwt_status_name(idem__jwt_status_t st)
{
    static const char *const names[IDEM__JWT__COUNT] = {
        [IDEM__JWT_OK] = "ok",
        [IDEM__JWT_MALFORMED] = "malformed",
        [IDEM__JWT_ALGORITHM] = "algorithm",
        [IDEM__JWT_UNKNOWN_KID] = "unknown_kid",
        [IDEM__JWT_SIGNATURE] = "signature",
        [IDEM__JWT_EXPIRED] = "expired",
        [IDEM__JWT_NOT_YET_VALID] = "not_yet_valid",
        [IDEM__JWT_CLAIM] = "claim",
        [IDEM__JWT_NOMEM] = "nomem",
    };
    return (unsigned)st < IDEM__JWT__COUNT ? names[st] : "?";
}

/* ---- base64url ------------------------------------------------------------- */

static int b64url_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

/* Strict base64url without padding: in[0..len) into out (cap bytes).
 * Returns the decoded length, or -1 (a bad character, a length of 1 mod 4,
 * unused bits set, or more than cap bytes). */
static long b64url_decode(const char *in, size_t len, unsigned char *out, size_t cap)
{
    size_t o = 0;
    uint32_t acc = 0;
    unsigned bits = 0;

    if (len % 4 == 1)
        return -1;
    for (size_t i = 0; i < len; i++) {
        int v = b64url_val((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap)
                return -1;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0) /* the unused low bits of the last character */
        return -1;
    return (long)o;
}

/* ---- key sets -------------------------------------------------------------- */

static idem__jwt_keys_t *set_new(void)
{
    idem__jwt_keys_t *k = idem_calloc(1, sizeof *k);
    if (k != NULL)
        atomic_init(&k->refs, 1);
    return k;
}

static void set_free(idem__jwt_keys_t *k)
{
    if (k == NULL)
        return;
    for (size_t i = 0; i < k->n; i++)
        EVP_PKEY_free(k->keys[i].pkey);
    if (k->secret != NULL) {
        OPENSSL_cleanse(k->secret, k->secret_len);
        idem_free(k->secret);
    }
    idem_free(k);
}

idem__jwt_keys_t *idem__jwt_keys_ref(idem__jwt_keys_t *k)
{
    if (k != NULL)
        atomic_fetch_add_explicit(&k->refs, 1, memory_order_relaxed);
    return k;
}

void idem__jwt_keys_unref(idem__jwt_keys_t *k)
{
    if (k != NULL && atomic_fetch_sub_explicit(&k->refs, 1, memory_order_acq_rel) == 1)
        set_free(k);
}

size_t idem__jwt_keys_count(const idem__jwt_keys_t *k)
{
    return k == NULL ? 0 : k->n;
}

/* Whether pkey is of a type and size we verify with; its type in *t. */
static int classify(EVP_PKEY *pkey, enum ktype *t, char *why, size_t whylen)
{
    switch (EVP_PKEY_get_base_id(pkey)) {
    case EVP_PKEY_RSA:
        if (EVP_PKEY_get_bits(pkey) < 2048) {
            snprintf(why, whylen, "an RSA key of %d bits (2048 at least)",
                     EVP_PKEY_get_bits(pkey));
            return -1;
        }
        *t = K_RSA;
        return 0;
    case EVP_PKEY_EC: {
        char group[64];
        size_t gl = 0;
        if (EVP_PKEY_get_group_name(pkey, group, sizeof group, &gl) != 1 ||
            strcmp(group, "prime256v1") != 0) {
            snprintf(why, whylen, "an EC key not on P-256 (ES256 only)");
            return -1;
        }
        *t = K_EC;
        return 0;
    }
    case EVP_PKEY_ED25519: *t = K_ED25519; return 0;
    default:
        snprintf(why, whylen, "a key that is not RSA, EC P-256 or Ed25519");
        return -1;
    }
}

static int add_key(idem__jwt_keys_t *k, EVP_PKEY *pkey, const char *kid, size_t kidlen,
                   char *why, size_t whylen)
{
    enum ktype t;
    if (classify(pkey, &t, why, whylen) != 0) {
        EVP_PKEY_free(pkey);
        return -1;
    }
    if (k->n >= IDEM__JWT_MAX_KEYS) {
        EVP_PKEY_free(pkey);
        snprintf(why, whylen, "more than %d keys", IDEM__JWT_MAX_KEYS);
        return -1;
    }
    struct jkey *j = &k->keys[k->n++];
    j->type = t;
    j->pkey = pkey;
    if (kid != NULL) {
        j->has_kid = true;
        memcpy(j->kid, kid, kidlen);
        j->kid[kidlen] = '\0';
    }
    return 0;
}

static int load_pem(idem__jwt_keys_t *k, const char *text, size_t len, char *why, size_t whylen)
{
    BIO *bio = BIO_new_mem_buf(text, (int)len);
    if (bio == NULL) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    size_t before = k->n;
    int rc = 0;
    for (;;) {
        char *name = NULL, *header = NULL;
        unsigned char *data = NULL;
        long dl = 0;
        if (PEM_read_bio(bio, &name, &header, &data, &dl) != 1) {
            /* The end of the text (no more start lines), or a block that is
             * not PEM. */
            unsigned long e = ERR_peek_last_error();
            if (!(ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE)) {
                snprintf(why, whylen, "a PEM block that does not parse");
                rc = -1;
            }
            break;
        }
        if (strcmp(name, "PUBLIC KEY") == 0) {
            const unsigned char *p = data;
            EVP_PKEY *pkey = d2i_PUBKEY(NULL, &p, dl);
            if (pkey == NULL || p != data + dl) {
                EVP_PKEY_free(pkey);
                snprintf(why, whylen, "a PUBLIC KEY block that does not parse");
                rc = -1;
            } else if (add_key(k, pkey, NULL, 0, why, whylen) != 0) {
                rc = -1;
            }
        }
        OPENSSL_free(name);
        OPENSSL_free(header);
        OPENSSL_free(data);
        if (rc != 0)
            break;
    }
    ERR_clear_error();
    BIO_free(bio);
    if (rc == 0 && k->n == before) {
        snprintf(why, whylen, "no PEM PUBLIC KEY block and not a JWKS");
        rc = -1;
    }
    return rc;
}

/* ---- JWKS ------------------------------------------------------------------ */

/* The string member name of object obj into buf; 1 found, 0 absent, -1 not
 * a string or too long. */
static int member_str(const idem__json_t *d, size_t obj, const char *name, char *buf,
                      size_t cap, size_t *len)
{
    size_t v;
    if (idem__json_member(d, obj, name, strlen(name), &v) != 0)
        return 0;
    if (idem__json_string(d, v, buf, cap, len) != IDEM_OK || *len >= cap)
        return -1;
    return 1;
}

/* The base64url member name of obj, decoded into out (cap bytes). */
static long member_b64(const idem__json_t *d, size_t obj, const char *name, unsigned char *out,
                       size_t cap)
{
    char text[1400];
    size_t tl;
    if (member_str(d, obj, name, text, sizeof text, &tl) != 1)
        return -1;
    return b64url_decode(text, tl, out, cap);
}

static EVP_PKEY *from_params(const char *type, OSSL_PARAM *params)
{
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    if (ctx != NULL && EVP_PKEY_fromdata_init(ctx) == 1)
        (void)EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params);
    EVP_PKEY_CTX_free(ctx);
    return pkey;
}

static EVP_PKEY *jwk_rsa(const idem__json_t *d, size_t obj)
{
    unsigned char n[1024], e[16]; /* up to 8192-bit moduli */
    long nl = member_b64(d, obj, "n", n, sizeof n), el = member_b64(d, obj, "e", e, sizeof e);
    if (nl <= 0 || el <= 0)
        return NULL;
    BIGNUM *bn = BN_bin2bn(n, (int)nl, NULL), *be = BN_bin2bn(e, (int)el, NULL);
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    OSSL_PARAM *params = NULL;
    EVP_PKEY *pkey = NULL;
    if (bn != NULL && be != NULL && bld != NULL &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) == 1 &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) == 1 &&
        (params = OSSL_PARAM_BLD_to_param(bld)) != NULL)
        pkey = from_params("RSA", params);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    return pkey;
}

static EVP_PKEY *jwk_ec(const idem__json_t *d, size_t obj)
{
    unsigned char pub[65];
    char crv[16];
    size_t cl;
    if (member_str(d, obj, "crv", crv, sizeof crv, &cl) != 1 || strcmp(crv, "P-256") != 0)
        return NULL;
    pub[0] = 0x04; /* uncompressed point: 04 || x || y */
    if (member_b64(d, obj, "x", pub + 1, 32) != 32 || member_b64(d, obj, "y", pub + 33, 32) != 32)
        return NULL;
    char group[] = "prime256v1";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, group, 0),
        OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, pub, sizeof pub),
        OSSL_PARAM_construct_end(),
    };
    return from_params("EC", params);
}

static EVP_PKEY *jwk_okp(const idem__json_t *d, size_t obj)
{
    unsigned char pub[32];
    char crv[16];
    size_t cl;
    if (member_str(d, obj, "crv", crv, sizeof crv, &cl) != 1 || strcmp(crv, "Ed25519") != 0)
        return NULL;
    if (member_b64(d, obj, "x", pub, sizeof pub) != 32)
        return NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, pub, sizeof pub),
        OSSL_PARAM_construct_end(),
    };
    return from_params("ED25519", params);
}

static int load_jwks(idem__jwt_keys_t *k, const char *text, size_t len, char *why,
                     size_t whylen)
{
    idem__json_t *d = NULL;
    idem_err_t e = idem__json_parse(text, len, NULL, 0, &d);
    if (e != IDEM_OK) {
        snprintf(why, whylen, e == IDEM_E_NOMEM ? "out of memory" : "a JWKS that is not JSON");
        return -1;
    }
    size_t keys, cursor = 0, obj;
    int rc = 0;
    if (idem__json_member(d, idem__json_root(d), "keys", 4, &keys) != 0 ||
        idem__json_type(d, keys) != IDEM__JSON_ARRAY) {
        snprintf(why, whylen, "a JWKS without a keys array");
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && idem__json_next(d, keys, &cursor, &obj) == 0; i++) {
        char kty[16], use[16], alg[16], kid[KID_MAX + 1];
        size_t l, kidlen = 0;
        int has_kid;
        if (idem__json_type(d, obj) != IDEM__JSON_OBJECT ||
            member_str(d, obj, "kty", kty, sizeof kty, &l) != 1) {
            snprintf(why, whylen, "JWKS key %zu has no kty", i);
            rc = -1;
            break;
        }
        int ru = member_str(d, obj, "use", use, sizeof use, &l);
        int ra = member_str(d, obj, "alg", alg, sizeof alg, &l);
        has_kid = member_str(d, obj, "kid", kid, sizeof kid, &kidlen);
        if (ru < 0 || ra < 0 || has_kid < 0) {
            snprintf(why, whylen, "JWKS key %zu: use, alg or kid is not a short string", i);
            rc = -1;
            break;
        }
        if (ru == 1 && strcmp(use, "sig") != 0)
            continue; /* an encryption key */
        const char *want = strcmp(kty, "RSA") == 0   ? "RS256"
                           : strcmp(kty, "EC") == 0  ? "ES256"
                           : strcmp(kty, "OKP") == 0 ? "EdDSA"
                                                     : NULL;
        if (want == NULL || (ra == 1 && strcmp(alg, want) != 0))
            continue; /* not a key type or algorithm we verify with */
        EVP_PKEY *pkey = want[0] == 'R' ? jwk_rsa(d, obj)
                         : want[0] == 'E' && want[1] == 'S' ? jwk_ec(d, obj)
                                                            : jwk_okp(d, obj);
        if (pkey == NULL) {
            snprintf(why, whylen, "JWKS key %zu (%s) is malformed", i, kty);
            rc = -1;
            break;
        }
        char kwhy[128];
        if (add_key(k, pkey, has_kid == 1 ? kid : NULL, kidlen, kwhy, sizeof kwhy) != 0) {
            snprintf(why, whylen, "JWKS key %zu: %s", i, kwhy);
            rc = -1;
        }
    }
    ERR_clear_error();
    idem__json_destroy(d);
    if (rc == 0 && k->n == 0) {
        snprintf(why, whylen, "a JWKS without an RSA, EC P-256 or Ed25519 signing key");
        rc = -1;
    }
    return rc;
}

idem_err_t idem__jwt_keys_parse(const char *keys, size_t keys_len, const unsigned char *secret,
                                size_t secret_len, idem__jwt_keys_t **out, char *why,
                                size_t whylen)
{
    *out = NULL;
    why[0] = '\0';
    if (keys == NULL && secret == NULL) {
        snprintf(why, whylen, "no key");
        return IDEM_E_INVAL;
    }
    idem__jwt_keys_t *k = set_new();
    if (k == NULL)
        return IDEM_E_NOMEM;
    if (keys != NULL) {
        size_t i = 0;
        while (i < keys_len && (keys[i] == ' ' || keys[i] == '\t' || keys[i] == '\r' ||
                                keys[i] == '\n'))
            i++;
        int rc = i < keys_len && keys[i] == '{' ? load_jwks(k, keys, keys_len, why, whylen)
                                                : load_pem(k, keys, keys_len, why, whylen);
        if (rc != 0) {
            set_free(k);
            return IDEM_E_INVAL;
        }
    }
    if (secret != NULL) {
        if (secret_len < IDEM__JWT_MIN_SECRET) {
            snprintf(why, whylen, "an HS256 secret of %zu bytes (%d at least)", secret_len,
                     IDEM__JWT_MIN_SECRET);
            set_free(k);
            return IDEM_E_INVAL;
        }
        if (k->n >= IDEM__JWT_MAX_KEYS || (k->secret = idem_malloc(secret_len)) == NULL) {
            set_free(k);
            return IDEM_E_NOMEM;
        }
        memcpy(k->secret, secret, secret_len);
        k->secret_len = secret_len;
        k->keys[k->n++] = (struct jkey){.type = K_SECRET};
    }
    *out = k;
    return IDEM_OK;
}

/* The whole file at path into a new buffer (*len bytes), or NULL and why. */
static char *read_file(const char *path, size_t *len, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(why, whylen, "%s: cannot be read", path);
        return NULL;
    }
    char *buf = idem_malloc(IDEM__JWT_MAX_FILE + 1);
    size_t n = buf != NULL ? fread(buf, 1, IDEM__JWT_MAX_FILE + 1, f) : 0;
    bool err = ferror(f) != 0;
    fclose(f);
    if (buf == NULL || err || n > IDEM__JWT_MAX_FILE || n == 0) {
        snprintf(why, whylen, "%s: %s", path,
                 buf == NULL ? "out of memory"
                 : err       ? "cannot be read"
                 : n == 0    ? "is empty"
                             : "is larger than 1 MiB");
        if (buf != NULL) {
            OPENSSL_cleanse(buf, n);
            idem_free(buf);
        }
        return NULL;
    }
    *len = n;
    return buf;
}

idem_err_t idem__jwt_keys_load(const char *keys_path, const char *secret_path,
                               idem__jwt_keys_t **out, char *why, size_t whylen)
{
    char *keys = NULL, *secret = NULL;
    size_t kl = 0, sl = 0;
    *out = NULL;
    if (keys_path != NULL && (keys = read_file(keys_path, &kl, why, whylen)) == NULL)
        return IDEM_E_INVAL;
    if (secret_path != NULL && (secret = read_file(secret_path, &sl, why, whylen)) == NULL) {
        idem_free(keys);
        return IDEM_E_INVAL;
    }
    size_t slen = sl;
    if (secret != NULL && slen > 0 && secret[slen - 1] == '\n') {
        slen--;
        if (slen > 0 && secret[slen - 1] == '\r')
            slen--;
    }
    char kwhy[300];
    idem_err_t e = idem__jwt_keys_parse(keys, kl, (const unsigned char *)secret, slen, out, kwhy,
                                        sizeof kwhy);
    if (e != IDEM_OK)
        snprintf(why, whylen, "%s: %s",
                 keys_path != NULL && (secret_path == NULL || strstr(kwhy, "HS256") == NULL)
                     ? keys_path
                     : secret_path,
                 kwhy[0] ? kwhy : "out of memory");
    idem_free(keys);
    if (secret != NULL) {
        OPENSSL_cleanse(secret, sl);
        idem_free(secret);
    }
    return e;
}

/* ---- verifying ------------------------------------------------------------- */

enum alg { A_RS256 = 0, A_ES256, A_EDDSA, A_HS256 };

static const struct {
    const char *name;
    enum ktype type;
} algs[] = {
    [A_RS256] = {"RS256", K_RSA},
    [A_ES256] = {"ES256", K_EC},
    [A_EDDSA] = {"EdDSA", K_ED25519},
    [A_HS256] = {"HS256", K_SECRET},
};

static bool verify_one(const idem__jwt_keys_t *ks, const struct jkey *key, enum alg a,
                       const unsigned char *msg, size_t msglen, const unsigned char *sig,
                       size_t siglen)
{
    if (a == A_HS256) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int maclen = 0;
        if (siglen != 32 || HMAC(EVP_sha256(), ks->secret, (int)ks->secret_len, msg, msglen,
                                 mac, &maclen) == NULL || maclen != 32)
            return false;
        return CRYPTO_memcmp(mac, sig, 32) == 0;
    }
    unsigned char der[80];
    const unsigned char *s = sig;
    size_t sl = siglen;
    if (a == A_ES256) {
        /* r || s, 32 bytes each, into an ECDSA-Sig-Value. */
        if (siglen != 64)
            return false;
        ECDSA_SIG *es = ECDSA_SIG_new();
        BIGNUM *r = BN_bin2bn(sig, 32, NULL), *ss = BN_bin2bn(sig + 32, 32, NULL);
        if (es == NULL || r == NULL || ss == NULL || ECDSA_SIG_set0(es, r, ss) != 1) {
            ECDSA_SIG_free(es);
            BN_free(r);
            BN_free(ss);
            return false;
        }
        int need = i2d_ECDSA_SIG(es, NULL);
        unsigned char *p = der;
        int dl = need > 0 && (size_t)need <= sizeof der ? i2d_ECDSA_SIG(es, &p) : -1;
        ECDSA_SIG_free(es);
        if (dl <= 0)
            return false;
        s = der;
        sl = (size_t)dl;
    } else if (a == A_EDDSA && siglen != 64) {
        return false;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx != NULL &&
              EVP_DigestVerifyInit(ctx, NULL, a == A_EDDSA ? NULL : EVP_sha256(), NULL,
                                   key->pkey) == 1 &&
              EVP_DigestVerify(ctx, s, sl, msg, msglen) == 1;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error();
    return ok;
}

/* Parse a decoded part as a JSON object. */
static idem__jwt_status_t parse_part(const unsigned char *buf, long len, idem__json_t **d)
{
    *d = NULL;
    if (len <= 0)
        return IDEM__JWT_MALFORMED;
    idem_err_t e = idem__json_parse((const char *)buf, (size_t)len, NULL, 0, d);
    if (e == IDEM_E_NOMEM)
        return IDEM__JWT_NOMEM;
    if (e != IDEM_OK)
        return IDEM__JWT_MALFORMED;
    if (idem__json_type(*d, idem__json_root(*d)) != IDEM__JSON_OBJECT) {
        idem__json_destroy(*d);
        *d = NULL;
        return IDEM__JWT_MALFORMED;
    }
    return IDEM__JWT_OK;
}

/* The header: the algorithm and the kid. */
static idem__jwt_status_t read_header(const idem__json_t *h, enum alg *a, char *kid,
                                      size_t *kidlen, bool *has_kid)
{
    size_t root = idem__json_root(h), v;
    char name[16];
    size_t nl;
    if (idem__json_member(h, root, "crit", 4, &v) == 0)
        return IDEM__JWT_MALFORMED;
    if (idem__json_member(h, root, "alg", 3, &v) != 0 ||
        idem__json_string(h, v, name, sizeof name, &nl) != IDEM_OK || nl >= sizeof name)
        return IDEM__JWT_ALGORITHM;
    size_t i = 0;
    while (i < sizeof algs / sizeof algs[0] &&
           (strlen(algs[i].name) != nl || memcmp(algs[i].name, name, nl) != 0))
        i++;
    if (i == sizeof algs / sizeof algs[0])
        return IDEM__JWT_ALGORITHM; /* none, and everything we do not verify */
    *a = (enum alg)i;
    *has_kid = false;
    if (idem__json_member(h, root, "kid", 3, &v) == 0) {
        if (idem__json_string(h, v, kid, KID_MAX + 1, kidlen) != IDEM_OK || *kidlen > KID_MAX)
            return IDEM__JWT_MALFORMED;
        *has_kid = true;
    }
    return IDEM__JWT_OK;
}

static idem__jwt_status_t check_times(const idem__json_t *p, int64_t now)
{
    size_t root = idem__json_root(p), v;
    int64_t t;
    if (idem__json_member(p, root, "exp", 3, &v) == 0) {
        if (idem__json_int_trunc(p, v, &t) != 0)
            return IDEM__JWT_MALFORMED;
        if (t <= INT64_MAX - IDEM__JWT_LEEWAY_S && now >= t + IDEM__JWT_LEEWAY_S)
            return IDEM__JWT_EXPIRED;
    }
    if (idem__json_member(p, root, "nbf", 3, &v) == 0) {
        if (idem__json_int_trunc(p, v, &t) != 0)
            return IDEM__JWT_MALFORMED;
        if (now <= INT64_MAX - IDEM__JWT_LEEWAY_S && now + IDEM__JWT_LEEWAY_S < t)
            return IDEM__JWT_NOT_YET_VALID;
    }
    return IDEM__JWT_OK;
}

static idem__jwt_status_t read_claim(const idem__json_t *p, const char *path, char *out,
                                     size_t cap, size_t *outlen)
{
    size_t v = idem__json_root(p);
    const char *s = path;
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t nl = dot != NULL ? (size_t)(dot - s) : strlen(s);
        if (idem__json_member(p, v, s, nl, &v) != 0)
            return IDEM__JWT_CLAIM;
        if (dot == NULL)
            break;
        s = dot + 1;
    }
    size_t l;
    if (idem__json_type(p, v) == IDEM__JSON_STRING) {
        /* An empty string names no one: every token that carries it would
         * share one scope (and one set of keys) by accident. */
        if (idem__json_string(p, v, out, cap, &l) != IDEM_OK || l == 0 ||
            l > IDEM__JWT_MAX_CLAIM || l >= cap || memchr(out, '\0', l) != NULL)
            return IDEM__JWT_CLAIM;
    } else {
        int64_t iv;
        const char *text;
        if (idem__json_int(p, v, &iv, &text, &l) != 0 || l >= cap)
            return IDEM__JWT_CLAIM;
        memcpy(out, text, l);
        out[l] = '\0';
    }
    *outlen = l;
    return IDEM__JWT_OK;
}

idem__jwt_status_t idem__jwt_verify_claim(const idem__jwt_keys_t *keys, const char *token,
                                          size_t len, const char *path, int64_t now_s,
                                          char *out, size_t cap, size_t *outlen)
{
    *outlen = 0;
    if (cap > 0)
        out[0] = '\0';
    if (keys == NULL)
        return IDEM__JWT_ALGORITHM;
    if (len == 0 || len > IDEM__JWT_MAX_TOKEN)
        return IDEM__JWT_MALFORMED;
    const char *d1 = memchr(token, '.', len);
    const char *d2 = d1 != NULL ? memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token)) : NULL;
    if (d2 == NULL || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - token)) != NULL)
        return IDEM__JWT_MALFORMED;
    size_t hl = (size_t)(d1 - token), pl = (size_t)(d2 - d1 - 1);
    size_t sl = len - (size_t)(d2 + 1 - token);

    /* Decoded parts are shorter than the token: one buffer of its size each. */
    unsigned char hbuf[IDEM__JWT_MAX_TOKEN], pbuf[IDEM__JWT_MAX_TOKEN], sig[IDEM__JWT_MAX_TOKEN];
    long hn = b64url_decode(token, hl, hbuf, sizeof hbuf);
    long pn = b64url_decode(d1 + 1, pl, pbuf, sizeof pbuf);
    long sn = b64url_decode(d2 + 1, sl, sig, sizeof sig);
    if (hn <= 0 || pn <= 0 || sn < 0) /* an empty signature fails below */
        return IDEM__JWT_MALFORMED;

    idem__json_t *h = NULL, *p = NULL;
    idem__jwt_status_t st = parse_part(hbuf, hn, &h);
    if (st != IDEM__JWT_OK)
        return st;
    enum alg a = A_RS256;
    char kid[KID_MAX + 1];
    size_t kidlen = 0;
    bool has_kid = false;
    st = read_header(h, &a, kid, &kidlen, &has_kid);
    idem__json_destroy(h);
    if (st != IDEM__JWT_OK)
        return st;

    /* The algorithm chose the key type; the kid chooses among those keys. */
    size_t n_type = 0, n_cand = 0;
    bool ok = false;
    for (size_t i = 0; i < keys->n && !ok; i++) {
        const struct jkey *k = &keys->keys[i];
        if (k->type != algs[a].type)
            continue;
        n_type++;
        if (has_kid && k->has_kid &&
            (strlen(k->kid) != kidlen || memcmp(k->kid, kid, kidlen) != 0))
            continue;
        n_cand++;
        ok = verify_one(keys, k, a, (const unsigned char *)token, (size_t)(d2 - token), sig,
                        (size_t)sn);
    }
    if (n_type == 0)
        return IDEM__JWT_ALGORITHM;
    if (n_cand == 0)
        return IDEM__JWT_UNKNOWN_KID;
    if (!ok)
        return IDEM__JWT_SIGNATURE;

    st = parse_part(pbuf, pn, &p);
    if (st != IDEM__JWT_OK)
        return st;
    st = check_times(p, now_s);
    if (st == IDEM__JWT_OK)
        st = read_claim(p, path, out, cap, outlen);
    idem__json_destroy(p);
    if (st != IDEM__JWT_OK) {
        *outlen = 0;
        if (cap > 0)
            out[0] = '\0';
    }
    return st;
}
