/* src/gateway/takeover.h - listening sockets that idemd does not bind
 * itself: inherited from systemd (socket activation) or handed over by a
 * running idemd (--takeover), and the control socket through which a
 * running idemd hands its own over (SPEC section 19, docs/operations.md).
 *
 * A plain start binds every listener (conn.h idem__listen_socket, no
 * SO_REUSEPORT), so a second idemd started by mistake on an address in use
 * still fails with EADDRINUSE.  A start with --takeover first asks the
 * idemd that serves the same public address for its listening sockets over
 * a Unix socket in the abstract namespace, "@idemd-takeover:ADDR:PORT"
 * (the public address as getsockname would print it): the running one
 * sends them with SCM_RIGHTS, the new one checks each (a listening TCP
 * socket, getsockname the configured address) and answers "ok"; the
 * running one then gives up the control socket's name and serves on; the
 * new one binds that name once it serves, ready for the next upgrade.
 * Both accept on the same sockets until SIGTERM drains the old one, so
 * every connection is accepted by one of them: none is refused.  Nothing
 * listening at that name (no idemd runs) is not an error: the new process
 * binds its listeners itself.  Only a peer of the same user (or root) is
 * answered (SO_PEERCRED).
 *
 * systemd: LISTEN_PID (this process), LISTEN_FDS (N, the sockets are
 * descriptors 3 .. 3+N-1) and LISTEN_FDNAMES (optional, ':'-separated) are
 * read without libsystemd.  Each socket goes to the listener whose
 * configured address getsockname gives; a name "listen", "admin" or
 * "listen_tls" must agree with that address.  A socket that is not
 * listening, or whose address is none of the configured ones, is an error
 * (one line, exit 2).  The variables are removed once read.
 *
 * THREADING: init, inherit, listener and discard in the main thread
 * before any other starts; serve starts one thread (the control socket's)
 * that stop, from the main thread, ends and joins.
 */
#ifndef IDEM_GATEWAY_TAKEOVER_H
#define IDEM_GATEWAY_TAKEOVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "gateway/gateway.h"

/* The listeners, in the order they are handed over. */
enum { IDEM_TK_PUBLIC, IDEM_TK_ADMIN, IDEM_TK_TLS, IDEM_TK_N };

typedef struct {
    const char *addr[IDEM_TK_N]; /* the configured "ADDR:PORT", NULL when unused */
    int fd[IDEM_TK_N];           /* an inherited listening socket, or -1 */
    pid_t old_pid;               /* the idemd that handed them over, or 0 */
    char from[64];               /* where they came from ("systemd", "idemd pid N"), or "" */
    char note[256];              /* a line for the log once idemd serves, or "" */
    char ctl_name[128];          /* the control socket's abstract name, without its '\0' */
    /* The control socket, while this process may hand its listeners over. */
    idem_gw_t *gw;
    int ctl_fd, wake_fd;
    int serve_fd[IDEM_TK_N];
    pthread_t thread;
    bool running;
} idem_takeover_t;

/** Record the configured addresses (tls NULL without listen_tls); no
 * socket is touched.  The strings must outlive t. */
void idem__takeover_init(idem_takeover_t *t, const char *listen, const char *admin,
                         const char *tls);

/** Take the sockets systemd passed (LISTEN_FDS), then, when ask, those
 * of the running idemd for the listeners still without one.
 * @return 0 (t->fd[] holds what was inherited; note says what happened
 * when there was nothing to take over), or -1 with err set (every
 * inherited socket closed). */
int idem__takeover_inherit(idem_takeover_t *t, bool ask, char *err, size_t errlen);

/** The socket of listener which: the inherited one (t gives it up), else
 * a new one bound by idem__listen_socket(backlog, what).
 * @return the descriptor, or -1 with err set. */
int idem__takeover_listener(idem_takeover_t *t, int which, int backlog, const char *what,
                            char *err, size_t errlen);

/** Close the inherited sockets not taken by idem__takeover_listener. */
void idem__takeover_discard(idem_takeover_t *t);

/** Start handing fds[] (IDEM_TK_N, -1 for a listener not used; each is
 * dup'ed, the caller keeps its own) over to a later --takeover.  A name
 * already bound (another process serves it) is logged and skipped.
 * @return 0, or -1 with err set (the control thread did not start). */
int idem__takeover_serve(idem_takeover_t *t, idem_gw_t *gw, const int fds[IDEM_TK_N], char *err,
                         size_t errlen);

/** Stop answering --takeover (before a drain) and join the thread. */
void idem__takeover_stop(idem_takeover_t *t);

/** After a store that did not open: when the listeners came from a running
 * idemd, wait for it to exit (an embedded store it holds, rocksdb:, is
 * free then) and return true for one more try; else false at once. */
bool idem__takeover_wait_old(idem_takeover_t *t);

#endif /* IDEM_GATEWAY_TAKEOVER_H */
