/* src/gateway/thread.c - idem__thread_create: pthread_create, and in a
 * build with test hooks a start that fails on demand (thread.h).
 *
 * The hook is how the black-box tests reach the paths where a thread does
 * not start (test_startup.py): a process limit would fail whichever thread
 * came first, and not at all as root.
 *
 * THREADING: any thread; the environment is only read.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/thread.h"

#ifndef IDEM_TEST_HOOKS
#define IDEM_TEST_HOOKS 0
#endif

#if IDEM_TEST_HOOKS
static atomic_long starts_named; /* starts of the thread the hook names */
#endif

/* Whether the test hook says this start is to fail: IDEM_TEST_THREAD_FAIL
 * is NAME (every start of that thread) or NAME:N (its Nth start only,
 * counting from 1). */
static int hook_fails(const char *what)
{
#if IDEM_TEST_HOOKS
    const char *v = getenv(IDEM_THREAD_FAIL_ENV);
    if (v == NULL || what == NULL)
        return 0;
    size_t n = strlen(what);
    if (strncmp(v, what, n) != 0 || (v[n] != '\0' && v[n] != ':'))
        return 0;
    long nth = atomic_fetch_add(&starts_named, 1) + 1;
    if (v[n] == '\0')
        return 1;
    char *end;
    long want = strtol(v + n + 1, &end, 10);
    return *end == '\0' && want == nth;
#else
    (void)what;
    return 0;
#endif
}

int idem__thread_create(pthread_t *t, const char *what, void *(*fn)(void *), void *arg)
{
    if (hook_fails(what))
        return EAGAIN;
    return pthread_create(t, NULL, fn, arg);
}
