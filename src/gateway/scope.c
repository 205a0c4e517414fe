/* src/gateway/scope.c - who the caller is: the sources of its scope.
 *
 * See scope.h for the rules.  Two choices are made here and written in
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
 *   (400 ambiguous-scope) rather than guessed at.
 *
 * INVARIANTS: the work is linear in the request head, which the parser has
 * already bounded (IDEM_HTTP_MAX_HEAD, IDEM_HTTP_MAX_HEADERS); one
 * allocation, of the framed values, only for several sources.
 */
#include "gateway/scope.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idem/alloc.h"
#include "idem/fingerprint.h"

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
    switch (k) {
    case IDEM_SCOPE_SRC_JWT:
        return "not supported yet (verified JWT claims need jwt_keys, which this idemd "
               "does not have)";
    default: return NULL;
    }
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

static bool cookie_find(const idem_http_msg_t *m, const char *name, idem_slice_t *out)
{
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (idem__slice_eq_ci(f->name, "cookie") &&
            idem__gw_cookie_get(f->value.ptr, f->value.len, name, out))
            return true;
    }
    return false;
}

/* ---- the scope ----------------------------------------------------------- */

/* The value of one source; false when it is absent or empty. */
static bool source_value(const idem_scope_source_t *s, const idem_http_msg_t *m,
                         const char *client_cert_hex, idem_slice_t *v)
{
    const idem_http_field_t *f = NULL;
    switch (s->kind) {
    case IDEM_SCOPE_SRC_AUTHORIZATION:
        f = idem__http_find(m, "Authorization");
        break;
    case IDEM_SCOPE_SRC_HEADER:
        f = idem__http_find(m, s->name);
        break;
    case IDEM_SCOPE_SRC_COOKIE:
        if (!cookie_find(m, s->name, v))
            return false;
        return v->len > 0;
    case IDEM_SCOPE_SRC_CLIENT_CERT:
        /* The hex SHA-256 of the certificate the TLS listener verified;
         * none on a plain listener, or when the client sent none. */
        if (client_cert_hex == NULL)
            return false;
        *v = (idem_slice_t){client_cert_hex, strlen(client_cert_hex)};
        return v->len > 0;
    default:
        return false; /* jwt: refused at config load until supported */
    }
    if (f == NULL)
        return false;
    *v = f->value;
    return v->len > 0;
}

static idem_scope_result_t hash_into(const void *p, size_t n, char *out,
                                     idem_scope_result_t ok)
{
    idem_sha256_hex(p, n, out);
    return out[0] != '\0' ? ok : IDEM_SCOPE_NOMEM;
}

/* The default: SHA-256 of Authorization, or "anonymous". */
static idem_scope_result_t fallback(const idem_http_msg_t *m, char *out)
{
    const idem_http_field_t *a = idem__http_find(m, "Authorization");
    if (a == NULL) {
        memcpy(out, "anonymous", sizeof "anonymous");
        return IDEM_SCOPE_FALLBACK_ANONYMOUS;
    }
    return hash_into(a->value.ptr, a->value.len, out, IDEM_SCOPE_FALLBACK_AUTHORIZATION);
}

idem_scope_result_t idem__gw_scope_compute(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const char *client_cert_hex, char *out, const char **dup)
{
    const char *dummy;
    if (dup == NULL)
        dup = &dummy;
    *dup = NULL;
    out[0] = '\0';
    if (idem__http_count(m, "Authorization") > 1) {
        *dup = "Authorization";
        return IDEM_SCOPE_AMBIGUOUS;
    }
    if (n == 0) {
        /* `scope_header`, exactly as before `scope:` existed. */
        if (idem__http_count(m, legacy_header) > 1) {
            *dup = legacy_header;
            return IDEM_SCOPE_AMBIGUOUS;
        }
        const idem_http_field_t *f = idem__http_find(m, legacy_header);
        if (f == NULL) {
            memcpy(out, "anonymous", sizeof "anonymous");
            return IDEM_SCOPE_FALLBACK_ANONYMOUS;
        }
        return hash_into(f->value.ptr, f->value.len, out, IDEM_SCOPE_FROM_SOURCES);
    }
    if (n > IDEM_SCOPE_MAX_SOURCES)
        n = IDEM_SCOPE_MAX_SOURCES;
    for (size_t i = 0; i < n; i++) {
        if (sources[i].kind == IDEM_SCOPE_SRC_HEADER &&
            idem__http_count(m, sources[i].name) > 1) {
            *dup = sources[i].name;
            return IDEM_SCOPE_AMBIGUOUS;
        }
    }
    idem_slice_t v[IDEM_SCOPE_MAX_SOURCES];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!source_value(&sources[i], m, client_cert_hex, &v[i]))
            return fallback(m, out);
        total += 4 + v[i].len;
    }
    if (n == 1)
        return hash_into(v[0].ptr, v[0].len, out, IDEM_SCOPE_FROM_SOURCES);
    uint8_t *buf = idem_malloc(total);
    if (buf == NULL)
        return IDEM_SCOPE_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)v[i].len;
        buf[o++] = (uint8_t)(l >> 24);
        buf[o++] = (uint8_t)(l >> 16);
        buf[o++] = (uint8_t)(l >> 8);
        buf[o++] = (uint8_t)l;
        memcpy(buf + o, v[i].ptr, v[i].len);
        o += v[i].len;
    }
    idem_scope_result_t r = hash_into(buf, total, out, IDEM_SCOPE_FROM_SOURCES);
    idem_free(buf);
    return r;
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
