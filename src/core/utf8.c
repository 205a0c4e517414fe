/* src/core/utf8.c - well-formed UTF-8, as RFC 3629 and PostgreSQL define it.
 *
 * The table of RFC 3629 section 4 decides from the lead byte how many
 * continuation bytes follow and narrows the range of the first of them,
 * which is what excludes overlong forms (E0 80..9F, F0 80..8F), surrogates
 * (ED A0..BF) and code points above U+10FFFF (F4 90..BF, F5..FF); C0 and
 * C1 can only start overlong two-byte forms and are never valid.  No code
 * point is assembled, so there is nothing to overflow.  See utf8.h for who
 * uses it and why.
 *
 * THREADING: no state; reentrant.
 */
#include <stdint.h>

#include "core/utf8.h"

size_t idem__utf8_seq(const void *s, size_t n)
{
    const uint8_t *p = s;
    uint8_t lo = 0x80, hi = 0xbf; /* the range of the first continuation byte */
    size_t more;

    if (n == 0)
        return 0;
    uint8_t c = p[0];
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        more = 2;
        if (c == 0xe0)
            lo = 0xa0; /* below: overlong */
        else if (c == 0xed)
            hi = 0x9f; /* above: surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        more = 3;
        if (c == 0xf0)
            lo = 0x90; /* below: overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above: past U+10FFFF */
    } else {
        return 0; /* a continuation byte, C0, C1 or F5..FF */
    }
    if (n - 1 < more)
        return 0; /* cut short */
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t j = 2; j <= more; j++)
        if (p[j] < 0x80 || p[j] > 0xbf)
            return 0;
    return more + 1;
}

bool idem__utf8_valid(const void *s, size_t len)
{
    const uint8_t *p = s;

    for (size_t i = 0; i < len;) {
        size_t k = idem__utf8_seq(p + i, len - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}
