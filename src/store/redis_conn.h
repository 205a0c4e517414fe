/* src/store/redis_conn.h - one blocking connection to a Redis server, plain
 * TCP or TLS, for src/store/redis.c.
 *
 * Debian 12's hiredis (0.14) speaks no TLS, so the store does its own I/O
 * here and keeps hiredis for what it does well: redisFormatCommandArgv
 * makes the commands and a redisReader turns the bytes that come back into
 * redisReply trees.  Under TLS, a session of src/core/tls.h sits between
 * the commands and the socket: plaintext goes in, the ciphertext it makes is
 * written to the socket, what the socket gives is fed back to it.
 *
 * The socket is non-blocking and every wait is a poll of at most the
 * connection's timeout: a connect, a handshake step, a write or a read
 * that makes no progress for that long fails with IDEM__RCONN_E_TIMEOUT,
 * as hiredis's socket timeouts did.  Writes use MSG_NOSIGNAL, so a server
 * that closed the connection never raises SIGPIPE in the caller.
 *
 * Errors are sticky: once a connection has failed, every later call fails
 * at once with the same kind and message; the caller drops it.
 *
 * Fault injection (store_impl.h): a connect, and every reply read, is one
 * store I/O.  An injected connect fault reads as a refused connection; an
 * injected read fault as a connection lost just after the reply arrived
 * (the server did what it was asked and the caller never learns it).
 *
 * THREADING: a connection belongs to one thread at a time; the TLS context
 * it was made with may be shared (core/tls.h).
 */
#ifndef IDEM_STORE_REDIS_CONN_H
#define IDEM_STORE_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/tls.h"

typedef enum {
    IDEM__RCONN_OK = 0,
    IDEM__RCONN_E_IO,       /* refused, reset, unresolvable: errstr says which */
    IDEM__RCONN_E_EOF,      /* the server closed the connection */
    IDEM__RCONN_E_TIMEOUT,  /* no progress within the timeout */
    IDEM__RCONN_E_TLS,      /* the handshake or a TLS record failed ("TLS: ...") */
    IDEM__RCONN_E_PROTOCOL, /* what came back is not RESP */
    IDEM__RCONN_E_NOMEM,
} idem__rconn_err_t;

typedef struct idem__rconn idem__rconn_t;

typedef struct idem__rconn_cfg {
    const char *host; /* a name or an address, without IPv6 brackets */
    int port;
    int timeout_ms;      /* >= 1 */
    idem_tls_ctx_t *tls; /* a client context: speak TLS; NULL: plain TCP */
    /* TLS: the name sent as SNI and checked against the certificate; NULL
     * or "": host (an address is checked against the IP names and sends no
     * SNI, core/tls.h). */
    const char *server_name;
} idem__rconn_cfg_t;

/** Connect (and, with cfg->tls, complete the handshake).
 * @return a connection, NULL only when out of memory.  A connection that
 *         failed has idem__rconn_err != 0 and a message; free it. */
idem__rconn_t *idem__rconn_connect(const idem__rconn_cfg_t *cfg);
void idem__rconn_free(idem__rconn_t *c); /* NULL: no-op */

/** Append one command (binary-safe arguments) to the output buffer.
 * @return 0, or -1 when out of memory (the connection has failed). */
int idem__rconn_append(idem__rconn_t *c, int argc, const char **argv, const size_t *len);

/** Send what is buffered without waiting for a reply (redis_cluster.c
 * writes every node's pipeline before it reads any).
 * @return 0, or -1 (the connection has failed). */
int idem__rconn_flush(idem__rconn_t *c);

/** Send what is buffered, then read the next reply.
 * @return 0 with *out (freeReplyObject), or -1 with *out NULL (the
 *         connection has failed: idem__rconn_err, idem__rconn_errstr). */
int idem__rconn_get_reply(idem__rconn_t *c, redisReply **out);

/** Whether an idle connection may still be used: the server has not closed
 * it nor sent anything unasked (a TLS session ticket is not a reply). */
bool idem__rconn_idle_ok(idem__rconn_t *c);

/** Wait at most ms for something to read (a subscriber, redis_sub.c),
 * without reading it: 1 when a reply may be there (get_reply then reads it,
 * within the timeout), 0 when nothing came, 2 when stop_fd (-1: none)
 * became readable first, -1 when the connection has failed. */
int idem__rconn_wait(idem__rconn_t *c, int stop_fd, int ms);

/** Change the timeout of every later wait (>= 1 ms): redis.c lengthens it
 * around a command the server itself may hold for the URL's timeout
 * (WAIT), so that the server's answer comes before the socket gives up. */
void idem__rconn_set_timeout(idem__rconn_t *c, int timeout_ms);

idem__rconn_err_t idem__rconn_err(const idem__rconn_t *c);
/** Why it failed, one line ("Connection refused", "TLS: certificate verify
 * failed: certificate has expired"); "" while it has not. */
const char *idem__rconn_errstr(const idem__rconn_t *c);

#endif /* IDEM_STORE_REDIS_CONN_H */
