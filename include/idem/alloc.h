/* include/idem/alloc.h - the one allocation hook of libidem.
 *
 * Every allocation libidem makes goes through these functions, so a test can
 * make the Nth allocation fail (idem_alloc_fail_after) and check that each
 * caller turns the failure into IDEM_E_NOMEM without leaking.
 *
 * THREADING: the counters are atomic; the hook itself is set once at start.
 */
#ifndef IDEM_ALLOC_H
#define IDEM_ALLOC_H

#include <stddef.h>

#include "idem/extern.h"

IDEM_EXTERN void *idem_malloc(size_t size);
IDEM_EXTERN void *idem_calloc(size_t n, size_t size);
IDEM_EXTERN void *idem_realloc(void *ptr, size_t size);
IDEM_EXTERN void idem_free(void *ptr);
/** A copy of the n bytes at s, NUL-terminated; NULL when out of memory.
 * Unlike POSIX strndup it copies exactly n bytes and does not stop at a NUL,
 * so s must have n readable bytes.  Free both with idem_free. */
IDEM_EXTERN char *idem_strndup(const char *s, size_t n);
IDEM_EXTERN char *idem_strdup(const char *s);

/** Fault injection for tests: the nth allocation from now on (1-based) and
 * every one after it fail; n = 0 turns the injection off. */
IDEM_EXTERN void idem_alloc_fail_after(long n);

/** How many allocations have failed on the calling thread since it started,
 * injected or real.  A caller that hands idem_malloc to a library which does
 * not report out-of-memory as such (jansson says "invalid token") compares
 * this before and after the call to tell out-of-memory from bad input. */
IDEM_EXTERN unsigned long idem_alloc_failures(void);

#endif /* IDEM_ALLOC_H */
