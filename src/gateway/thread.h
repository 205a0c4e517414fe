/* src/gateway/thread.h - how idemd starts its threads: one call that every
 * start goes through (workers, writers, the sweeper, the admin thread), so
 * that a test can make a chosen one fail.
 *
 * A thread that does not start is an error its caller handles (exit 2 at
 * start-up, one line naming it); it is never joined.  In a build with test
 * hooks (-Dtests=enabled, IDEM_TEST_HOOKS) the environment variable
 * IDEM_TEST_THREAD_FAIL names a thread ("sweeper", "writer", "admin",
 * "worker") whose start fails as pthread_create would (EAGAIN), every one
 * of that name, or with ":N" (worker:2) only the Nth; other builds never
 * read it.
 *
 * THREADING: any thread.
 */
#ifndef IDEM_GATEWAY_THREAD_H
#define IDEM_GATEWAY_THREAD_H

#include <pthread.h>

/* The environment variable of the test hook. */
#define IDEM_THREAD_FAIL_ENV "IDEM_TEST_THREAD_FAIL"

/** Start fn(arg) on a new thread, *t its handle.  what names the thread's
 * role ("sweeper", "writer", "admin", "worker": the test hook matches it).
 * @return 0, or the error number pthread_create gave (the hook: EAGAIN). */
int idem__thread_create(pthread_t *t, const char *what, void *(*fn)(void *), void *arg);

#endif /* IDEM_GATEWAY_THREAD_H */
