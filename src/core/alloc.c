/* src/core/alloc.c - every allocation of libidem, and how tests make it fail.
 *
 * These are thin wrappers over the C library's malloc family and add no
 * header of their own, so a pointer from idem_malloc may be given to free()
 * and one from malloc() to idem_free: a caller that hands idem_malloc and
 * idem_free to a library with a process-wide allocator setting (jansson's
 * json_set_alloc_funcs) may do so without tracking which one made a block.
 *
 * Fault injection (SQLite's and curl's torture discipline): after
 * idem_alloc_fail_after(n), the nth allocation from then on and every later
 * one return NULL, until idem_alloc_fail_after(0).  A test loops n = 1, 2, ...
 * over an operation until it succeeds, and checks at each step that the
 * failure comes back as IDEM_E_NOMEM with nothing leaked (ASan).
 *
 * INVARIANTS: a request for 0 bytes is served as a request for 1, so
 * idem_malloc(0), idem_calloc(0, n) and idem_realloc(p, 0) return a unique
 * pointer (or NULL when memory is short) and never the C library's
 * implementation-defined answer; idem_realloc(p, 0) does not free p.
 * A failed idem_realloc leaves ptr valid and unchanged.
 *
 * THREADING: the injection state is atomic, so any thread may allocate while
 * a test arms or disarms it.  The failure count of idem_alloc_failures() is
 * per thread, so one thread's out-of-memory cannot be mistaken for another's.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"

/* Nonzero while injection is armed; then left counts the allocations still
 * allowed to succeed (it goes to zero and below: all of those fail). */
static atomic_int armed;
static atomic_long left;
static _Thread_local unsigned long failures;

void idem_alloc_fail_after(long n)
{
    if (n <= 0) {
        atomic_store(&armed, 0);
        return;
    }
    atomic_store(&left, n - 1);
    atomic_store(&armed, 1);
}

unsigned long idem_alloc_failures(void)
{
    return failures;
}

/* Whether this allocation is to fail by injection.  Once left is used up it
 * stays negative; a long cannot wrap in any test's lifetime. */
static int injected(void)
{
    if (!atomic_load_explicit(&armed, memory_order_relaxed))
        return 0;
    return atomic_fetch_sub(&left, 1) <= 0;
}

/* The common exit: count a NULL so idem_alloc_failures() sees it. */
static void *counted(void *p)
{
    if (p == NULL)
        failures++;
    return p;
}

void *idem_malloc(size_t size)
{
    if (injected())
        return counted(NULL);
    return counted(malloc(size ? size : 1));
}

void *idem_calloc(size_t n, size_t size)
{
    if (injected())
        return counted(NULL);
    if (n == 0 || size == 0)
        n = size = 1;
    /* Checked here, not left to calloc: a sanitizer's calloc aborts. */
    if (n > SIZE_MAX / size)
        return counted(NULL);
    return counted(calloc(n, size));
}

void *idem_realloc(void *ptr, size_t size)
{
    if (injected())
        return counted(NULL);
    return counted(realloc(ptr, size ? size : 1));
}

void idem_free(void *ptr)
{
    free(ptr);
}

char *idem_strndup(const char *s, size_t n)
{
    char *d;

    if (s == NULL && n > 0)
        return NULL;
    if (n == SIZE_MAX)
        return counted(NULL);
    d = idem_malloc(n + 1);
    if (d == NULL)
        return NULL;
    if (n > 0)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *idem_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    return idem_strndup(s, strlen(s));
}
