/* src/core/url.c - cutting a URL into its parts, and percent-decoding.
 *
 * The URLs read here are the stores' (redis://, redis+sentinel://, the
 * query of lmdb:, memory: and postgres:), written by an operator into a
 * config file, so the grammar is RFC 3986's generic syntax with the few
 * choices a careful operator expects and nothing a store does not need:
 *
 *   [scheme ":"] "//" [userinfo "@"] hosts [path] ["?" query]
 *
 *   - The query starts at the first '?' and runs to the end: there is no
 *     fragment, so a '#' is an ordinary byte that the part's own checks
 *     refuse where it does not belong.
 *   - The authority ends at the first '/' before the query; the path is
 *     the rest up to the query, its '/' included.
 *   - The userinfo ends at the authority's LAST '@', so a password that
 *     holds an unescaped '@' still reads as the operator meant; the user
 *     ends at the userinfo's first ':' (a user name has none, a password
 *     may).  Both are percent-decoded by their reader, never here.
 *   - hosts is left as written: one "host[:port]" for most stores, a
 *     comma-separated list for redis+sentinel://; idem__url_host_port reads
 *     one.  A host is a name (letters, digits, '.', '-', '_') or an IPv4
 *     address, or an IPv6 address in brackets; no percent-escapes, no
 *     zone ids, no other bytes, so a host that reaches a resolver is one
 *     nobody can misread.  A port is 1..65535 in at most 5 digits.
 *
 * Percent-decoding takes '%' and two hex digits, either case, and refuses
 * rather than guesses: a '%' without two hex digits (also one cut off by
 * the end), an escape that decodes to NUL (every consumer wants a C
 * string) and output that does not fit.  '+' is a plus sign: form encoding
 * is not URL encoding, and passwords may hold '+'.
 *
 * Limits: a host is at most IDEM__URL_HOST_MAX bytes, a port 5 digits, a
 * number IDEM__URL_DIGITS_MAX digits, decoded text what the caller's buffer
 * holds.  The URL itself has no limit here: nothing is copied or
 * allocated, and every function reads its input once from left to right,
 * so a long URL costs its length; a store that keeps a copy caps it.
 *
 * src/http/target.c has a decoder of its own for request targets (with
 * other rules: the normalisation of paths): src/http depends on nothing of
 * ours, so it cannot use this one.
 *
 * THREADING: no state; reentrant.
 */
#include <string.h>

#include "core/url.h"

static bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool scheme_char(char c)
{
    return is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.';
}

static bool name_char(char c)
{
    return is_alpha(c) || is_digit(c) || c == '.' || c == '-' || c == '_';
}

int idem__url_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

idem__url_status_t idem__url_parse(const char *s, size_t len, idem__url_t *u)
{
    size_t i = 0;

    memset(u, 0, sizeof *u);
    if (!(len >= 2 && s[0] == '/' && s[1] == '/')) {
        if (len == 0 || !is_alpha(s[0]))
            return IDEM__URL_E_SCHEME;
        while (i < len && scheme_char(s[i]))
            i++;
        if (i == len || s[i] != ':')
            return IDEM__URL_E_SCHEME;
        if (len - i - 1 < 2 || s[i + 1] != '/' || s[i + 2] != '/')
            return IDEM__URL_E_NO_SLASHES;
        u->scheme = s;
        u->scheme_len = i;
        i++;
    }
    i += 2;

    const char *rest = s + i, *end = s + len;
    const char *q = memchr(rest, '?', (size_t)(end - rest));
    const char *hier_end = q != NULL ? q : end;
    if (q != NULL) {
        u->has_query = true;
        u->query = q + 1;
        u->query_len = (size_t)(end - q - 1);
    } else {
        u->query = end;
    }
    const char *slash = memchr(rest, '/', (size_t)(hier_end - rest));
    const char *auth_end = slash != NULL ? slash : hier_end;
    u->path = auth_end;
    u->path_len = (size_t)(hier_end - auth_end);

    const char *at = NULL;
    for (const char *p = rest; p < auth_end; p++)
        if (*p == '@')
            at = p;
    u->hosts = rest;
    if (at != NULL) {
        u->has_userinfo = true;
        u->userinfo = rest;
        u->userinfo_len = (size_t)(at - rest);
        const char *colon = memchr(rest, ':', u->userinfo_len);
        u->user = rest;
        u->user_len = colon != NULL ? (size_t)(colon - rest) : u->userinfo_len;
        if (colon != NULL) {
            u->has_password = true;
            u->password = colon + 1;
            u->password_len = (size_t)(at - colon - 1);
        }
        u->hosts = at + 1;
    }
    u->hosts_len = (size_t)(auth_end - u->hosts);
    return IDEM__URL_OK;
}

bool idem__url_number(const char *s, size_t len, size_t max_digits, uint64_t *out)
{
    uint64_t v = 0;
    if (max_digits > IDEM__URL_DIGITS_MAX)
        max_digits = IDEM__URL_DIGITS_MAX;
    if (len == 0 || len > max_digits)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (!is_digit(s[i]))
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

bool idem__url_port(const char *s, size_t len, int *port)
{
    uint64_t v;
    if (!idem__url_number(s, len, 5, &v) || v < 1 || v > 65535)
        return false;
    *port = (int)v;
    return true;
}

idem__url_status_t idem__url_host_port(const char *s, size_t len, idem__url_host_t *h)
{
    const char *end = s + len;

    memset(h, 0, sizeof *h);
    h->host = s;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL)
            return IDEM__URL_E_BRACKET;
        h->ipv6 = true;
        h->host = s + 1;
        h->host_len = (size_t)(close - h->host);
        if (close + 1 < end) {
            if (close[1] != ':')
                return IDEM__URL_E_AFTER_BRACKET;
            h->has_port = true;
            h->port_text = close + 2;
            h->port_len = (size_t)(end - close - 2);
        }
        for (size_t i = 0; i < h->host_len; i++) {
            char c = h->host[i];
            if (!(idem__url_hexval(c) >= 0 || c == ':' || c == '.')) {
                h->bad = c;
                return IDEM__URL_E_IPV6;
            }
        }
    } else {
        const char *colon = memchr(s, ':', len);
        h->host_len = colon != NULL ? (size_t)(colon - s) : len;
        if (colon != NULL) {
            h->has_port = true;
            h->port_text = colon + 1;
            h->port_len = (size_t)(end - colon - 1);
        }
        for (size_t i = 0; i < h->host_len; i++) {
            if (!name_char(s[i])) {
                h->bad = s[i];
                return IDEM__URL_E_HOST_CHAR;
            }
        }
    }
    if (h->host_len == 0)
        return IDEM__URL_E_NO_HOST;
    if (h->host_len > IDEM__URL_HOST_MAX)
        return IDEM__URL_E_HOST_LONG;
    if (h->has_port && !idem__url_port(h->port_text, h->port_len, &h->port))
        return IDEM__URL_E_PORT;
    return IDEM__URL_OK;
}

idem__url_status_t idem__url_decode(const char *s, size_t len, char *out, size_t cap,
                                    size_t *out_len)
{
    size_t o = 0;
    idem__url_status_t st = IDEM__URL_OK;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            int a = i + 1 < len ? idem__url_hexval(s[i + 1]) : -1;
            int b = i + 2 < len ? idem__url_hexval(s[i + 2]) : -1;
            if (a < 0 || b < 0) {
                st = IDEM__URL_E_ESCAPE;
                break;
            }
            c = (char)(a * 16 + b);
            if (c == '\0') {
                st = IDEM__URL_E_NUL;
                break;
            }
            i += 2;
        }
        if (o + 1 >= cap) {
            st = IDEM__URL_E_SPACE;
            break;
        }
        out[o++] = c;
    }
    if (st != IDEM__URL_OK)
        o = 0;
    if (cap > 0)
        out[o] = '\0';
    else if (st == IDEM__URL_OK)
        st = IDEM__URL_E_SPACE; /* not even room for the NUL */
    if (out_len != NULL)
        *out_len = o;
    return st;
}

bool idem__url_next_param(const char **cursor, const char *end, idem__url_param_t *p)
{
    const char *q = *cursor;

    memset(p, 0, sizeof *p);
    if (end != NULL ? q >= end : *q == '\0')
        return false;
    const char *e = q;
    while ((end != NULL ? e < end : *e != '\0') && *e != '&')
        e++;
    p->item = q;
    p->item_len = (size_t)(e - q);
    const char *eq = memchr(q, '=', p->item_len);
    p->name = q;
    p->name_len = eq != NULL ? (size_t)(eq - q) : p->item_len;
    if (eq != NULL) {
        p->has_value = true;
        p->value = eq + 1;
        p->value_len = (size_t)(e - eq - 1);
    }
    if ((end != NULL ? e < end : *e != '\0') && *e == '&')
        e++;
    *cursor = e;
    return true;
}
