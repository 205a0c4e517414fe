/* src/http/target.c - decoding request targets: percent-escapes and query
 * parameters.
 *
 * Used by the admin listener (keys in /keys/{key}?scope=S), the demo
 * upstream (/count?key=K) and the chunk-size parser (hex digits).  A '+' is
 * a plus sign: form encoding is not URL encoding, and keys may hold '+'.
 * Decoding refuses a bad escape, a decoded NUL (keys and scopes are C
 * strings) and output that would not fit, rather than guess.
 *
 * THREADING: no state; reentrant.
 */
#include <string.h>

#include "http/http.h"

int idem_http_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long idem_http_pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = idem_http_hexval((unsigned char)s[i + 1]);
            int lo = idem_http_hexval((unsigned char)s[i + 2]);
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

long idem_http_query_param(const char *q, size_t n, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && q[j] != '&')
            j++;
        if (j - i > nl && memcmp(q + i, name, nl) == 0 && q[i + nl] == '=')
            return idem_http_pct_decode(q + i + nl + 1, j - i - nl - 1, out, cap);
        i = j + 1;
    }
    return -2;
}
