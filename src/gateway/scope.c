/* src/gateway/scope.c - who the caller is: the sources of its scope.
 *
 * See scope.h for the rules.  The choices made here are written in
 * docs/configuration.md:
 *
 * - An empty value counts as absent.  An empty header or cookie identifies
 *   nobody, and hashing it would put every caller that sends one into one
 *   more shared scope, as "anonymous" is.  (The old `scope_header` rule,
 *   used when `scope:` is not written, hashes an empty value as before, so
 *   existing records keep their scope.)
 * - A header that names the caller may not come twice.  Which of two
 *   Authorization values counts is exactly what a client could exploit if
 *   idemd and the upstream chose differently, so the request is refused
 *   (400 ambiguous-scope) rather than guessed at.  The cookie a source
 *   names is such a value too: given twice across the Cookie fields, even
 *   once empty ("sid=; sid=abc"), it is refused the same way.
 * - A fallback lives in a space of its own (IDEM_SCOPE_FALLBACK_TAG before
 *   Authorization), so a caller that leaves out the configured source, or
 *   sends a JWT that fails, never lands in the scope of a caller whose
 *   source holds the same text.
 * - Authorization is read normalised (scope.h): the scheme is
 *   case-insensitive in RFC 9110, so two spellings of it must not make two
 *   callers; the registry's spelling keeps "Bearer K" hashing as before.
 *
 * INVARIANTS: the work is linear in the request head, which the parser has
 * already bounded (IDEM_HTTP_MAX_HEAD, IDEM_HTTP_MAX_HEADERS), plus one JWT
 * verification per jwt: source (src/core/jwt.c, bounded by its 8 KiB
 * token cap); values are hashed piece by piece, so nothing is allocated
 * here.
 */
#include "gateway/scope.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "core/jwt.h"

/* RFC 9110 tchar: what a header or cookie name is made of. */
static bool is_tchar(unsigned char ch)
{
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
        return true;
    return ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static bool is_token(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s))
            return false;
    return true;
}

/* A claim path: names of letters, digits, '_' and '-', joined by '.'. */
static bool is_claim_path(const char *s)
{
    bool name_started = false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '.') {
            if (!name_started)
                return false;
            name_started = false;
        } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-') {
            name_started = true;
        } else {
            return false;
        }
    }
    return name_started;
}

int idem__gw_scope_parse_source(const char *text, idem_scope_source_t *out, char *why,
                                size_t whylen)
{
    memset(out, 0, sizeof *out);
    if (text == NULL) {
        snprintf(why, whylen, "missing");
        return -1;
    }
    static const struct {
        const char *prefix;
        idem_scope_kind_t kind;
    } named[] = {
        {"header:", IDEM_SCOPE_SRC_HEADER},
        {"cookie:", IDEM_SCOPE_SRC_COOKIE},
        {"jwt:", IDEM_SCOPE_SRC_JWT},
    };
    if (strcmp(text, "authorization") == 0) {
        out->kind = IDEM_SCOPE_SRC_AUTHORIZATION;
        return 0;
    }
    if (strcmp(text, "client_cert") == 0) {
        out->kind = IDEM_SCOPE_SRC_CLIENT_CERT;
        return 0;
    }
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        size_t pl = strlen(named[i].prefix);
        if (strncmp(text, named[i].prefix, pl) != 0)
            continue;
        const char *name = text + pl;
        size_t nl = strlen(name);
        if (nl == 0) {
            snprintf(why, whylen, "%s needs a name after the colon", named[i].prefix);
            return -1;
        }
        if (nl > IDEM_SCOPE_NAME_MAX) {
            snprintf(why, whylen, "the name after %s is longer than %d characters",
                     named[i].prefix, IDEM_SCOPE_NAME_MAX);
            return -1;
        }
        bool ok = named[i].kind == IDEM_SCOPE_SRC_JWT ? is_claim_path(name) : is_token(name);
        if (!ok) {
            snprintf(why, whylen, "%s",
                     named[i].kind == IDEM_SCOPE_SRC_JWT
                         ? "not a claim name or dotted path (sub, org.id)"
                     : named[i].kind == IDEM_SCOPE_SRC_HEADER ? "not a header name"
                                                              : "not a cookie name");
            return -1;
        }
        if (named[i].kind == IDEM_SCOPE_SRC_HEADER && strcasecmp(name, "authorization") == 0) {
            out->kind = IDEM_SCOPE_SRC_AUTHORIZATION;
            return 0;
        }
        out->kind = named[i].kind;
        memcpy(out->name, name, nl + 1);
        return 0;
    }
    snprintf(why, whylen,
             "not a scope source (authorization, header:NAME, cookie:NAME, jwt:CLAIM, "
             "client_cert)");
    return -1;
}

const char *idem__gw_scope_unsupported(idem_scope_kind_t k)
{
    (void)k; /* every kind is read now; what each needs is checked in config.c */
    return NULL;
}

void idem__gw_scope_source_text(const idem_scope_source_t *s, char *out, size_t outlen)
{
    switch (s->kind) {
    case IDEM_SCOPE_SRC_AUTHORIZATION: snprintf(out, outlen, "authorization"); break;
    case IDEM_SCOPE_SRC_HEADER: snprintf(out, outlen, "header:%s", s->name); break;
    case IDEM_SCOPE_SRC_COOKIE: snprintf(out, outlen, "cookie:%s", s->name); break;
    case IDEM_SCOPE_SRC_JWT: snprintf(out, outlen, "jwt:%s", s->name); break;
    case IDEM_SCOPE_SRC_CLIENT_CERT: snprintf(out, outlen, "client_cert"); break;
    default: snprintf(out, outlen, "?"); break;
    }
}

/* ---- cookies ------------------------------------------------------------- */

static bool is_ws(char c) { return c == ' ' || c == '\t'; }

bool idem__gw_cookie_get(const char *hdr, size_t len, const char *name, idem_slice_t *out)
{
    size_t nl = strlen(name);
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end < len && hdr[end] != ';')
            end++;
        /* One pair: hdr[i..end). */
        size_t a = i, b = end;
        while (a < b && is_ws(hdr[a]))
            a++;
        const char *eq = memchr(hdr + a, '=', b - a);
        if (eq != NULL) {
            size_t ne = (size_t)(eq - hdr);
            while (ne > a && is_ws(hdr[ne - 1]))
                ne--;
            if (ne - a == nl && memcmp(hdr + a, name, nl) == 0) {
                size_t va = (size_t)(eq - hdr) + 1;
                while (va < b && is_ws(hdr[va]))
                    va++;
                while (b > va && is_ws(hdr[b - 1]))
                    b--;
                out->ptr = hdr + va;
                out->len = b - va;
                return true;
            }
        }
        i = end + 1;
    }
    return false;
}

/* The first cookie named name in the Cookie fields (in order), and how many
 * times it comes in all of them (empty values included). */
static size_t cookie_find(const idem_http_msg_t *m, const char *name, idem_slice_t *out)
{
    size_t count = 0;
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (!idem__slice_eq_ci(f->name, "cookie"))
            continue;
        const char *p = f->value.ptr;
        size_t len = f->value.len;
        idem_slice_t v;
        while (idem__gw_cookie_get(p, len, name, &v)) {
            if (count++ == 0)
                *out = v;
            /* Go on after this pair: past the ';' that ends it. */
            const char *semi = memchr(v.ptr + v.len, ';', len - (size_t)(v.ptr + v.len - p));
            if (semi == NULL)
                break;
            len -= (size_t)(semi + 1 - p);
            p = semi + 1;
        }
    }
    return count;
}

/* ---- Authorization, normalised --------------------------------------------- */

/* The IANA HTTP Authentication Scheme Registry's spellings: a scheme found
 * here (case-insensitively) is written so, others in lower case, so that
 * the usual forms ("Bearer K", "Basic dXNlcg==") hash as they always have. */
static const char *const registered_schemes[] = {
    "Basic", "Bearer", "Concealed", "Digest", "DPoP", "GNAP", "HOBA", "Mutual",
    "Negotiate", "OAuth", "PrivateToken", "SCRAM-SHA-1", "SCRAM-SHA-256", "vapid",
};

#define SCHEME_MAX 64

/* A value as up to three pieces hashed one after the other. */
struct val {
    idem_slice_t part[3];
    size_t np, len;
    char scheme[SCHEME_MAX + 1];
};

static void val_one(struct val *v, idem_slice_t s)
{
    v->part[0] = s;
    v->np = 1;
    v->len = s.len;
}

/* Authorization's value a[0..len) as scope.h says: scheme, one space,
 * credentials. */
static void auth_norm(idem_slice_t a, struct val *v)
{
    size_t i = 0;
    val_one(v, a);
    while (i < a.len && a.ptr[i] != ' ' && a.ptr[i] != '\t')
        i++;
    if (i == 0 || i == a.len || i > SCHEME_MAX)
        return;
    for (size_t j = 0; j < i; j++)
        if (!is_tchar((unsigned char)a.ptr[j]))
            return;
    size_t c = i;
    while (c < a.len && (a.ptr[c] == ' ' || a.ptr[c] == '\t'))
        c++;
    if (c == a.len)
        return;
    const char *canon = NULL;
    for (size_t k = 0; k < sizeof registered_schemes / sizeof registered_schemes[0]; k++)
        if (strlen(registered_schemes[k]) == i && strncasecmp(registered_schemes[k], a.ptr, i) == 0)
            canon = registered_schemes[k];
    for (size_t j = 0; j < i; j++) {
        char ch = canon != NULL ? canon[j] : a.ptr[j];
        v->scheme[j] = (ch >= 'A' && ch <= 'Z' && canon == NULL) ? (char)(ch - 'A' + 'a') : ch;
    }
    v->part[0] = (idem_slice_t){v->scheme, i};
    v->part[1] = (idem_slice_t){" ", 1};
    v->part[2] = (idem_slice_t){a.ptr + c, a.len - c};
    v->np = 3;
    v->len = i + 1 + (a.len - c);
}

/* The Bearer credentials of Authorization a, or false. */
static bool bearer_token(idem_slice_t a, idem_slice_t *tok)
{
    if (a.len < 7 || strncasecmp(a.ptr, "bearer", 6) != 0 || (a.ptr[6] != ' ' && a.ptr[6] != '\t'))
        return false;
    size_t c = 6;
    while (c < a.len && (a.ptr[c] == ' ' || a.ptr[c] == '\t'))
        c++;
    *tok = (idem_slice_t){a.ptr + c, a.len - c};
    return tok->len > 0;
}

const char *idem__gw_scope_why_name(unsigned why)
{
    return why == IDEM_SCOPE_WHY_ABSENT ? "absent"
           : why < IDEM_SCOPE_N_WHY    ? idem__jwt_status_name((idem__jwt_status_t)why)
                                       : "?";
}

/* ---- hashing ----------------------------------------------------------------- */

struct hasher {
    EVP_MD_CTX *ctx;
    bool ok;
};

static void h_begin(struct hasher *h)
{
    h->ctx = EVP_MD_CTX_new();
    h->ok = h->ctx != NULL && EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) == 1;
}

static void h_put(struct hasher *h, const void *p, size_t n)
{
    if (h->ok && n > 0)
        h->ok = EVP_DigestUpdate(h->ctx, p, n) == 1;
}

static void h_val(struct hasher *h, const struct val *v)
{
    for (size_t i = 0; i < v->np; i++)
        h_put(h, v->part[i].ptr, v->part[i].len);
}

/* The lowercase hex digest into out; ok unless hashing failed. */
static idem_scope_result_t h_end(struct hasher *h, char *out, idem_scope_result_t ok)
{
    unsigned char md[32];
    unsigned int ml = 0;
    if (h->ok)
        h->ok = EVP_DigestFinal_ex(h->ctx, md, &ml) == 1 && ml == 32;
    EVP_MD_CTX_free(h->ctx);
    if (!h->ok) {
        out[0] = '\0';
        return IDEM_SCOPE_NOMEM;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
    return ok;
}

/* ---- the scope ----------------------------------------------------------- */

/* The value of one source; false when it is absent or empty, or its JWT
 * fails (*why then says which check).  claim: IDEM__JWT_MAX_CLAIM + 1
 * bytes for a jwt: source's value. */
static bool source_value(const idem_scope_source_t *s, const idem_http_msg_t *m,
                         const idem_scope_env_t *env, struct val *v, char *claim,
                         unsigned *why, bool *nomem)
{
    const idem_http_field_t *f = NULL;
    idem_slice_t sl;
    *why = IDEM_SCOPE_WHY_ABSENT;
    switch (s->kind) {
    case IDEM_SCOPE_SRC_AUTHORIZATION:
        f = idem__http_find(m, "Authorization");
        if (f == NULL || f->value.len == 0)
            return false;
        auth_norm(f->value, v);
        return true;
    case IDEM_SCOPE_SRC_HEADER:
        f = idem__http_find(m, s->name);
        break;
    case IDEM_SCOPE_SRC_COOKIE:
        if (cookie_find(m, s->name, &sl) == 0)
            return false;
        /* A quoted value (RFC 6265 cookie-value) is the value inside. */
        if (sl.len >= 2 && sl.ptr[0] == '"' && sl.ptr[sl.len - 1] == '"') {
            sl.ptr++;
            sl.len -= 2;
        }
        val_one(v, sl);
        return sl.len > 0;
    case IDEM_SCOPE_SRC_CLIENT_CERT:
        /* The hex SHA-256 of the certificate the TLS listener verified;
         * none on a plain listener, or when the client sent none. */
        if (env->client_cert_hex == NULL)
            return false;
        val_one(v, (idem_slice_t){env->client_cert_hex, strlen(env->client_cert_hex)});
        return v->len > 0;
    case IDEM_SCOPE_SRC_JWT: {
        f = idem__http_find(m, "Authorization");
        if (f == NULL || f->value.len == 0)
            return false;
        idem_slice_t tok;
        if (!bearer_token(f->value, &tok)) {
            *why = IDEM__JWT_MALFORMED;
            return false;
        }
        size_t cl = 0;
        idem__jwt_status_t st = idem__jwt_verify_claim(env->jwt, tok.ptr, tok.len, s->name,
                                                       env->now_s, claim,
                                                       IDEM__JWT_MAX_CLAIM + 1, &cl);
        if (st == IDEM__JWT_NOMEM) {
            *nomem = true;
            return false;
        }
        if (st != IDEM__JWT_OK) {
            *why = (unsigned)st;
            return false;
        }
        val_one(v, (idem_slice_t){claim, cl});
        return cl > 0;
    }
    default:
        return false;
    }
    if (f == NULL)
        return false;
    val_one(v, f->value);
    return v->len > 0;
}

/* The default in its own space: SHA-256 of the tag and Authorization, or
 * "anonymous"; or MISSING when scope_missing is reject. */
static idem_scope_result_t fallback(const idem_http_msg_t *m, const idem_scope_env_t *env,
                                    char *out)
{
    if (env->missing == IDEM_SCOPE_MISSING_REJECT)
        return IDEM_SCOPE_MISSING;
    const idem_http_field_t *a = idem__http_find(m, "Authorization");
    if (a == NULL) {
        memcpy(out, "anonymous", sizeof "anonymous");
        return IDEM_SCOPE_FALLBACK_ANONYMOUS;
    }
    struct val v;
    struct hasher h;
    auth_norm(a->value, &v);
    h_begin(&h);
    h_put(&h, IDEM_SCOPE_FALLBACK_TAG, IDEM_SCOPE_FALLBACK_TAG_LEN);
    h_val(&h, &v);
    return h_end(&h, out, IDEM_SCOPE_FALLBACK_AUTHORIZATION);
}

idem_scope_result_t idem__gw_scope_compute(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const char *client_cert_hex, char *out, const char **dup)
{
    idem_scope_env_t env = {.client_cert_hex = client_cert_hex};
    return idem__gw_scope_compute_env(sources, n, legacy_header, m, &env, out, dup, NULL);
}

idem_scope_result_t idem__gw_scope_compute_env(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const idem_scope_env_t *env, char *out, const char **dup,
    unsigned *why)
{
    const char *dummy;
    unsigned why_dummy;
    if (dup == NULL)
        dup = &dummy;
    if (why == NULL)
        why = &why_dummy;
    *dup = NULL;
    *why = IDEM_SCOPE_WHY_ABSENT;
    out[0] = '\0';
    if (idem__http_count(m, "Authorization") > 1) {
        *dup = "Authorization";
        return IDEM_SCOPE_AMBIGUOUS;
    }
    struct hasher h;
    struct val v[IDEM_SCOPE_MAX_SOURCES];
    if (n == 0) {
        /* `scope_header`, as before `scope:` existed; Authorization read
         * normalised, which leaves its usual form as it was. */
        if (idem__http_count(m, legacy_header) > 1) {
            *dup = legacy_header;
            return IDEM_SCOPE_AMBIGUOUS;
        }
        const idem_http_field_t *f = idem__http_find(m, legacy_header);
        if (f == NULL) {
            if (env->missing == IDEM_SCOPE_MISSING_REJECT)
                return IDEM_SCOPE_MISSING;
            memcpy(out, "anonymous", sizeof "anonymous");
            return IDEM_SCOPE_FALLBACK_ANONYMOUS;
        }
        if (strcasecmp(legacy_header, "Authorization") == 0)
            auth_norm(f->value, &v[0]);
        else
            val_one(&v[0], f->value);
        h_begin(&h);
        h_val(&h, &v[0]);
        return h_end(&h, out, IDEM_SCOPE_FROM_SOURCES);
    }
    if (n > IDEM_SCOPE_MAX_SOURCES)
        n = IDEM_SCOPE_MAX_SOURCES;
    for (size_t i = 0; i < n; i++) {
        if (sources[i].kind == IDEM_SCOPE_SRC_HEADER &&
            idem__http_count(m, sources[i].name) > 1) {
            *dup = sources[i].name;
            return IDEM_SCOPE_AMBIGUOUS;
        }
        idem_slice_t first;
        if (sources[i].kind == IDEM_SCOPE_SRC_COOKIE && cookie_find(m, sources[i].name, &first) > 1) {
            *dup = sources[i].name;
            return IDEM_SCOPE_AMBIGUOUS_COOKIE;
        }
    }
    char claims[IDEM_SCOPE_MAX_SOURCES][IDEM__JWT_MAX_CLAIM + 1];
    for (size_t i = 0; i < n; i++) {
        bool nomem = false;
        if (!source_value(&sources[i], m, env, &v[i], claims[i], why, &nomem))
            return nomem ? IDEM_SCOPE_NOMEM : fallback(m, env, out);
    }
    h_begin(&h);
    if (n == 1)
        h_val(&h, &v[0]);
    else
        for (size_t i = 0; i < n; i++) {
            uint32_t l = (uint32_t)v[i].len;
            uint8_t be[4] = {(uint8_t)(l >> 24), (uint8_t)(l >> 16), (uint8_t)(l >> 8),
                             (uint8_t)l};
            h_put(&h, be, 4);
            h_val(&h, &v[i]);
        }
    return h_end(&h, out, IDEM_SCOPE_FROM_SOURCES);
}

bool idem__gw_scope_uses_header(const idem_scope_source_t *sources, size_t n,
                                const char *legacy_header, idem_slice_t name)
{
    if (idem__slice_eq_ci(name, "authorization"))
        return true;
    if (n == 0)
        return legacy_header != NULL && idem__slice_eq_ci(name, legacy_header);
    for (size_t i = 0; i < n && i < IDEM_SCOPE_MAX_SOURCES; i++) {
        if (sources[i].kind == IDEM_SCOPE_SRC_HEADER && idem__slice_eq_ci(name, sources[i].name))
            return true;
        if (sources[i].kind == IDEM_SCOPE_SRC_COOKIE && idem__slice_eq_ci(name, "cookie"))
            return true;
    }
    return false;
}
