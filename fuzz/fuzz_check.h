/* fuzz/fuzz_check.h - the one thing every fuzz target shares: CHECK, which
 * prints the failed condition and aborts, so that libFuzzer records the
 * input as a crash (a violated property is a finding like any other).
 * Header-only; fuzz_common.h adds what the HTTP targets share on top.
 */
#ifndef IDEM_FUZZ_CHECK_H
#define IDEM_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                               \
        }                                                                          \
    } while (0)

/* FNV-1a of the input: a stable per-input choice (an allocation to fail, a
 * clock to use) that does not take bytes away from the parser's input. */
static inline unsigned long fuzz_hash(const unsigned char *p, size_t n)
{
    unsigned long h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

#endif /* IDEM_FUZZ_CHECK_H */
