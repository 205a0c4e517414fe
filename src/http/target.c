/* src/http/target.c - request targets: their form, their normal spelling,
 * percent-escapes and query parameters.
 *
 * Normalisation (docs/protocol.md section 5).  A gateway that matches routes on one
 * spelling of a path while its upstream reads another can be walked around:
 * `/%70ayments` is `/payments` to most servers, `/x/../payments` too, and
 * `/pay%2Fments`, `//payments`, `/;x/payments` or `/pay\ments` are
 * `/payments` to some.  So a target is accepted only in origin-form
 * (`/path?query`) or absolute-form (`http[s]://authority/path?query`), and
 * its path is brought to one spelling that every upstream reads the same
 * way:
 *   - escapes of unreserved characters (ALPHA DIGIT - . _ ~) are decoded and
 *     the hex digits of every other escape are made upper case (RFC 3986
 *     section 6.2.2: the spelling changes, the URI does not);
 *   - what servers disagree on is refused rather than guessed: a `.` or `..`
 *     segment (however spelt: `%2e` is `.`), an escaped `/` or `\` (`%2F`,
 *     `%5C`) and a literal `\`, an escaped NUL (`%00`), an empty segment
 *     (`//`: merged by nginx and Tomcat, kept by others), a `;` (path
 *     parameters, which Tomcat and Jetty cut out), a `#`, and a `%` that is
 *     not followed by two hex digits.
 * The query is kept as received: its meaning is the application's.
 *
 * Route prefixes are compared on the decoded bytes of both sides
 * (idem__http_path_has_prefix), so `/a:b` and `/a%3Ab`, which an upstream
 * that decodes reads alike, fall under the same route.
 *
 * Decoding (idem__http_pct_decode, idem__http_query_param) serves the admin
 * listener (keys in /keys/{key}?scope=S) and the demo upstream
 * (/count?key=K).  A '+' is a plus sign: form encoding is not URL encoding,
 * and keys may hold '+'.  Decoding refuses a bad escape, a decoded NUL (keys
 * and scopes are C strings) and output that would not fit, rather than
 * guess.
 *
 * THREADING: no state; reentrant.
 */
#include <string.h>

#include "http/http.h"

int idem__http_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long idem__http_pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = idem__http_hexval((unsigned char)s[i + 1]);
            int lo = idem__http_hexval((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            ch = (char)(hi * 16 + lo);
            i += 2;
        }
        if (ch == '\0' || k + 1 >= cap)
            return -1;
        out[k++] = ch;
    }
    if (cap == 0)
        return -1;
    out[k] = '\0';
    return (long)k;
}

long idem__http_query_param(const char *q, size_t n, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && q[j] != '&')
            j++;
        if (j - i > nl && memcmp(q + i, name, nl) == 0 && q[i + nl] == '=')
            return idem__http_pct_decode(q + i + nl + 1, j - i - nl - 1, out, cap);
        i = j + 1;
    }
    return -2;
}

/* ---- normalisation ---------------------------------------------------------- */

static bool is_alpha(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* RFC 3986 section 2.3. */
static bool is_unreserved(unsigned char c)
{
    return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static bool is_sub_delim(unsigned char c)
{
    return c != 0 && strchr("!$&'()*+,;=", c) != NULL;
}

/* out[from..to) is "." or "..". */
static bool is_dot_segment(const char *out, size_t from, size_t to)
{
    size_t n = to - from;
    return (n == 1 && out[from] == '.') || (n == 2 && out[from] == '.' && out[from + 1] == '.');
}

long idem__http_path_normalize(const char *in, size_t n, bool prefix, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n == 0 || in[0] != '/')
        return IDEM_TARGET_E_FORM;
    if (cap < 2)
        return IDEM_TARGET_E_SPACE;
    size_t k = 0, seg = 1; /* out[seg..k) is the segment being written */
    out[k++] = '/';
    for (size_t i = 1; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == '%') {
            if (n - i < 3)
                return IDEM_TARGET_E_ESCAPE;
            int hi = idem__http_hexval((unsigned char)in[i + 1]);
            int lo = idem__http_hexval((unsigned char)in[i + 2]);
            if (hi < 0 || lo < 0)
                return IDEM_TARGET_E_ESCAPE;
            unsigned char v = (unsigned char)(hi * 16 + lo);
            i += 2;
            if (v == 0)
                return IDEM_TARGET_E_NUL;
            if (v == '/' || v == '\\')
                return IDEM_TARGET_E_SLASH;
            if (is_unreserved(v)) {
                if (cap - k < 2)
                    return IDEM_TARGET_E_SPACE;
                out[k++] = (char)v;
            } else {
                if (cap - k < 4)
                    return IDEM_TARGET_E_SPACE;
                out[k++] = '%';
                out[k++] = hex[v >> 4];
                out[k++] = hex[v & 15];
            }
            continue;
        }
        if (c == '/') {
            if (k == seg)
                return IDEM_TARGET_E_EMPTY;
            if (is_dot_segment(out, seg, k))
                return IDEM_TARGET_E_DOT;
            seg = k + 1;
        } else if (c == '\\') {
            return IDEM_TARGET_E_SLASH;
        } else if (c == ';') {
            return IDEM_TARGET_E_PARAM;
        } else if (c == '#') {
            return IDEM_TARGET_E_FRAGMENT;
        } else if (c == '?' || c <= 0x20 || c >= 0x7f) {
            return IDEM_TARGET_E_FORM; /* the caller cut the query; the parser refuses the rest */
        }
        if (cap - k < 2)
            return IDEM_TARGET_E_SPACE;
        out[k++] = (char)c;
    }
    /* A prefix may end inside a segment ("/pay" covers "/payments"), so
     * only a whole path has its last segment checked. */
    if (!prefix && is_dot_segment(out, seg, k))
        return IDEM_TARGET_E_DOT;
    out[k] = '\0';
    return (long)k;
}

/* http or https, case-insensitively (RFC 3986 section 3.1). */
static bool is_http_scheme(const char *s, size_t n)
{
    static const char http[] = "https";
    if (n != 4 && n != 5)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((s[i] | 0x20) != http[i])
            return false;
    return true;
}

/* host [":" port] of an http URI: reg-name, IPv4 or an IP literal in
 * brackets; no user information (RFC 9110 section 4.2.4). */
static bool authority_ok(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(is_unreserved(c) || is_sub_delim(c) || c == ':' || c == '[' || c == ']' ||
              c == '%'))
            return false;
    }
    return true;
}

int idem__http_target_normalize(const char *in, size_t n, char *out, size_t cap,
                                idem_http_target_t *t)
{
    memset(t, 0, sizeof *t);
    size_t p = 0;
    if (n == 0)
        return IDEM_TARGET_E_FORM;
    if (in[0] != '/') {
        /* absolute-form: scheme "://" authority path-abempty ["?" query] */
        size_t i = 0;
        while (i < n && (is_alpha((unsigned char)in[i]) ||
                         (i > 0 && (is_digit((unsigned char)in[i]) || in[i] == '+' ||
                                    in[i] == '-' || in[i] == '.'))))
            i++;
        if (i == 0 || !is_http_scheme(in, i) || n - i < 3 || memcmp(in + i, "://", 3) != 0)
            return IDEM_TARGET_E_FORM;
        size_t a = i + 3, e = a;
        while (e < n && in[e] != '/' && in[e] != '?' && in[e] != '#')
            e++;
        if (!authority_ok(in + a, e - a))
            return IDEM_TARGET_E_FORM;
        if (e < n && in[e] == '#')
            return IDEM_TARGET_E_FRAGMENT;
        t->authority = (idem_slice_t){in + a, e - a};
        p = e;
    }
    size_t q = p;
    while (q < n && in[q] != '?')
        q++;
    long plen;
    if (q == p) { /* "http://host" or "http://host?q": the path is "/" */
        if (cap < 2)
            return IDEM_TARGET_E_SPACE;
        out[0] = '/';
        out[1] = '\0';
        plen = 1;
    } else {
        plen = idem__http_path_normalize(in + p, q - p, false, out, cap);
        if (plen < 0)
            return (int)plen;
    }
    size_t k = (size_t)plen;
    t->path_len = k;
    if (q < n) {
        if (memchr(in + q, '#', n - q) != NULL)
            return IDEM_TARGET_E_FRAGMENT;
        if (cap - k <= n - q)
            return IDEM_TARGET_E_SPACE;
        memcpy(out + k, in + q, n - q);
        k += n - q;
        out[k] = '\0';
    }
    t->len = k;
    return IDEM_TARGET_OK;
}

/* The next byte of a normalised path, decoded; advances *i. */
static unsigned char next_decoded(const char *s, size_t n, size_t *i)
{
    unsigned char c = (unsigned char)s[*i];
    if (c == '%' && n - *i >= 3) {
        int hi = idem__http_hexval((unsigned char)s[*i + 1]);
        int lo = idem__http_hexval((unsigned char)s[*i + 2]);
        if (hi >= 0 && lo >= 0) {
            *i += 3;
            return (unsigned char)(hi * 16 + lo);
        }
    }
    *i += 1;
    return c;
}

bool idem__http_path_has_prefix(const char *path, size_t n, const char *prefix, size_t plen)
{
    size_t i = 0, j = 0;
    while (j < plen) {
        if (i >= n)
            return false;
        if (next_decoded(path, n, &i) != next_decoded(prefix, plen, &j))
            return false;
    }
    return true;
}

const char *idem__http_target_strerror(int rc)
{
    switch (rc) {
    case IDEM_TARGET_OK:
        return "no error";
    case IDEM_TARGET_E_FORM:
        return "the request target must be origin-form (/path?query) or absolute-form "
               "(http://host/path?query)";
    case IDEM_TARGET_E_ESCAPE:
        return "the request path has a '%' that is not followed by two hex digits";
    case IDEM_TARGET_E_DOT:
        return "the request path has a '.' or '..' segment";
    case IDEM_TARGET_E_SLASH:
        return "the request path has an encoded '/' or '\\' (%2F, %5C) or a literal '\\'";
    case IDEM_TARGET_E_NUL:
        return "the request path has an encoded NUL (%00)";
    case IDEM_TARGET_E_EMPTY:
        return "the request path has an empty segment ('//')";
    case IDEM_TARGET_E_PARAM:
        return "the request path has a ';' (path parameters are not accepted; send %3B)";
    case IDEM_TARGET_E_FRAGMENT:
        return "the request target has a fragment ('#')";
    case IDEM_TARGET_E_SPACE:
        return "the request target is too long";
    default:
        return "invalid request target";
    }
}
