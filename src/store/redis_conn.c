/* src/store/redis_conn.c - one blocking Redis connection over a
 * non-blocking socket, plain or TLS (redis_conn.h says what a caller sees).
 *
 * Output: commands are formatted by hiredis into one buffer, sent whole
 * before the next reply is read (so a pipeline of MULTI, EVALSHA..., EXEC
 * leaves in one write, or one TLS record run).  Input: the socket's bytes
 * go to the redisReader (plain), or to the TLS session and its plaintext
 * to the reader (TLS); the reader says when a whole reply is there.  Under
 * TLS, whatever the session has pending (handshake messages, alerts,
 * answers to key updates) is written after every step that may make some.
 *
 * THREADING: redis_conn.h.
 */
#include "store/redis_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "store/store_impl.h"

#define IO_CHUNK 16384

struct idem__rconn {
    int fd;
    int timeout_ms;
    idem_tls_t *tls; /* or NULL */
    redisReader *reader;
    char *obuf; /* formatted commands not sent yet */
    size_t olen, ocap;
    idem__rconn_err_t err;
    char errstr[200];
};

static void set_err(idem__rconn_t *c, idem__rconn_err_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(idem__rconn_t *c, idem__rconn_err_t kind, const char *fmt, ...)
{
    if (c->err)
        return; /* the first failure is the one that says why */
    c->err = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof c->errstr, fmt, ap);
    va_end(ap);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events, at most the timeout.  1 ready, 0 on
 * timeout (set), -1 on an error (set). */
static int wait_fd(idem__rconn_t *c, short events)
{
    int64_t end = mono_ms() + c->timeout_ms;
    for (;;) {
        int64_t left = end - mono_ms();
        if (left < 0)
            left = 0;
        struct pollfd p = {.fd = c->fd, .events = events};
        int r = poll(&p, 1, (int)left);
        if (r > 0)
            return 1;
        if (r == 0) {
            set_err(c, IDEM__RCONN_E_TIMEOUT, "no answer within %d ms", c->timeout_ms);
            return 0;
        }
        if (errno != EINTR) {
            set_err(c, IDEM__RCONN_E_IO, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

/* The server closed a TLS connection while we wrote: what it said before
 * (an alert: "certificate required", "unknown ca") is in the socket's
 * receive queue, ahead of the reset, and is a better reason than
 * "Connection reset by peer".  Sets the session's failure if it finds one. */
static void salvage_alert(idem__rconn_t *c)
{
    char buf[IO_CHUNK], pt[256];
    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0 || idem__tls_feed(c->tls, buf, (size_t)n) < 0)
            break;
    }
    int r;
    while ((r = idem__tls_read(c->tls, pt, sizeof pt)) > 0)
        ;
    if (r < 0 && r != IDEM_TLS_E_CLOSED && r != IDEM_TLS_E_TOOBIG)
        set_err(c, IDEM__RCONN_E_TLS, "TLS: %s", idem__tls_errstr(c->tls));
}

static int send_all(idem__rconn_t *c, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(c, POLLOUT) != 1)
                return -1;
        } else if (w < 0 && errno != EINTR) {
            int e = errno;
            if (c->tls != NULL && (e == ECONNRESET || e == EPIPE))
                salvage_alert(c);
            set_err(c, IDEM__RCONN_E_IO, "%s", strerror(e));
            return -1;
        }
    }
    return 0;
}

/* Read what the socket has, waiting for some.  The count (> 0), or -1. */
static ssize_t recv_some(idem__rconn_t *c, char *buf, size_t cap)
{
    for (;;) {
        ssize_t r = recv(c->fd, buf, cap, 0);
        if (r > 0)
            return r;
        if (r == 0) {
            set_err(c, IDEM__RCONN_E_EOF, "Server closed the connection");
            return -1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(c, POLLIN) != 1)
                return -1;
        } else if (errno != EINTR) {
            set_err(c, IDEM__RCONN_E_IO, "%s", strerror(errno));
            return -1;
        }
    }
}

/* A session's failure as the connection's. */
static int tls_failed(idem__rconn_t *c, int code)
{
    if (code == IDEM_TLS_E_CLOSED)
        set_err(c, IDEM__RCONN_E_EOF, "Server closed the connection");
    else if (code == IDEM_TLS_E_NOMEM)
        set_err(c, IDEM__RCONN_E_NOMEM, "out of memory");
    else
        set_err(c, IDEM__RCONN_E_TLS, "TLS: %s", idem__tls_errstr(c->tls));
    return -1;
}

/* Write the session's pending ciphertext. */
static int flush_tls(idem__rconn_t *c)
{
    char buf[IO_CHUNK];
    while (idem__tls_pending(c->tls) > 0) {
        size_t n = idem__tls_take(c->tls, buf, sizeof buf);
        if (n == 0 || send_all(c, buf, n) != 0)
            return n == 0 ? 0 : -1;
    }
    return 0;
}

/* ---- connect -------------------------------------------------------------- */

static void tune_socket(int fd)
{
    int one = 1, idle = 15, intvl = 5, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* Connect c->fd to one of host's addresses. */
static int tcp_connect(idem__rconn_t *c, const char *host, int port)
{
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0) {
        set_err(c, IDEM__RCONN_E_IO, "%s", gai_strerror(gr));
        return -1;
    }
    idem__rconn_err_t last = IDEM__RCONN_E_IO;
    char why[200] = "no address";
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        a->ai_protocol);
        if (fd < 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            continue;
        }
        c->fd = fd;
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            int w = wait_fd(c, POLLOUT);
            if (w == 1) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
                    soerr = errno;
                r = soerr == 0 ? 0 : -1;
                errno = soerr;
            } else {
                /* wait_fd set the error: keep it as this address's reason */
                last = c->err;
                snprintf(why, sizeof why, "%s", c->errstr);
                c->err = IDEM__RCONN_OK;
                c->errstr[0] = '\0';
                close(fd);
                c->fd = -1;
                continue;
            }
        }
        if (r == 0) {
            freeaddrinfo(res);
            tune_socket(fd);
            return 0;
        }
        last = IDEM__RCONN_E_IO;
        snprintf(why, sizeof why, "%s", strerror(errno));
        close(fd);
        c->fd = -1;
    }
    freeaddrinfo(res);
    set_err(c, last, "%s", why);
    return -1;
}

static int tls_handshake(idem__rconn_t *c, idem_tls_ctx_t *ctx, const char *name)
{
    c->tls = idem__tls_create_client(ctx, name, NULL);
    if (c->tls == NULL) {
        set_err(c, IDEM__RCONN_E_NOMEM, "TLS: cannot start a session with \"%s\"", name);
        return -1;
    }
    char buf[IO_CHUNK];
    for (;;) {
        int r = idem__tls_read(c->tls, NULL, 0); /* the handshake only */
        if (flush_tls(c) != 0)
            return -1;
        if (r < 0)
            return tls_failed(c, r);
        if (idem__tls_handshake_done(c->tls))
            return 0;
        ssize_t n = recv_some(c, buf, sizeof buf);
        if (n < 0) {
            if (c->err == IDEM__RCONN_E_EOF)
                snprintf(c->errstr, sizeof c->errstr,
                         "TLS: the server closed the connection during the handshake");
            return -1;
        }
        int fr = idem__tls_feed(c->tls, buf, (size_t)n);
        if (fr < 0)
            return tls_failed(c, fr);
    }
}

idem__rconn_t *idem__rconn_connect(const idem__rconn_cfg_t *cfg)
{
    idem__rconn_t *c = idem_calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->fd = -1;
    c->timeout_ms = cfg->timeout_ms;
    c->reader = redisReaderCreate();
    if (c->reader == NULL) {
        idem_free(c);
        return NULL;
    }
    if (tcp_connect(c, cfg->host, cfg->port) != 0)
        return c;
    if (idem__store_io_fault()) {
        set_err(c, IDEM__RCONN_E_IO, "Connection refused (injected fault)");
        return c;
    }
    if (cfg->tls != NULL) {
        const char *name = cfg->server_name && cfg->server_name[0] ? cfg->server_name : cfg->host;
        tls_handshake(c, cfg->tls, name);
    }
    return c;
}

void idem__rconn_free(idem__rconn_t *c)
{
    if (c == NULL)
        return;
    if (c->tls != NULL && !c->err && idem__tls_shutdown(c->tls) == 0) {
        /* close_notify, if the socket takes it now; never a wait */
        char buf[512];
        size_t n = idem__tls_take(c->tls, buf, sizeof buf);
        if (n > 0) {
            ssize_t w = send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w; /* the connection is going anyway */
        }
    }
    idem__tls_destroy(c->tls);
    if (c->fd >= 0)
        close(c->fd);
    redisReaderFree(c->reader);
    idem_free(c->obuf);
    idem_free(c);
}

/* ---- commands and replies -------------------------------------------------- */

int idem__rconn_append(idem__rconn_t *c, int argc, const char **argv, const size_t *len)
{
    char *cmd = NULL;
    int n = redisFormatCommandArgv(&cmd, argc, argv, len);
    if (n < 0) {
        set_err(c, IDEM__RCONN_E_NOMEM, "out of memory");
        return -1;
    }
    if (c->olen + (size_t)n > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + (size_t)n)
            cap *= 2;
        char *p = idem_realloc(c->obuf, cap);
        if (p == NULL) {
            redisFreeCommand(cmd);
            set_err(c, IDEM__RCONN_E_NOMEM, "out of memory");
            return -1;
        }
        c->obuf = p;
        c->ocap = cap;
    }
    memcpy(c->obuf + c->olen, cmd, (size_t)n);
    c->olen += (size_t)n;
    redisFreeCommand(cmd);
    return 0;
}

static int write_out(idem__rconn_t *c)
{
    if (c->olen == 0)
        return 0;
    size_t n = c->olen;
    c->olen = 0;
    if (c->tls == NULL)
        return send_all(c, c->obuf, n);
    int r = idem__tls_write(c->tls, c->obuf, n);
    if (r < 0)
        return tls_failed(c, r);
    return flush_tls(c);
}

int idem__rconn_flush(idem__rconn_t *c)
{
    return c->err || write_out(c) != 0 ? -1 : 0;
}

static int feed_reader(idem__rconn_t *c, const char *p, size_t n)
{
    if (redisReaderFeed(c->reader, p, n) != REDIS_OK) {
        set_err(c, IDEM__RCONN_E_NOMEM, "out of memory");
        return -1;
    }
    return 0;
}

int idem__rconn_get_reply(idem__rconn_t *c, redisReply **out)
{
    *out = NULL;
    if (c->err || write_out(c) != 0)
        return -1;
    char buf[IO_CHUNK];
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            set_err(c, IDEM__RCONN_E_PROTOCOL, "Protocol error: %s", c->reader->errstr);
            return -1;
        }
        if (r != NULL) {
            if (idem__store_io_fault()) {
                freeReplyObject(r);
                set_err(c, IDEM__RCONN_E_EOF, "Server closed the connection (injected fault)");
                return -1;
            }
            *out = r;
            return 0;
        }
        if (c->tls != NULL) {
            /* Plaintext the session already holds comes first. */
            int n = idem__tls_read(c->tls, buf, sizeof buf);
            if (flush_tls(c) != 0)
                return -1;
            if (n < 0)
                return tls_failed(c, n);
            if (n > 0) {
                if (feed_reader(c, buf, (size_t)n) != 0)
                    return -1;
                continue;
            }
        }
        ssize_t got = recv_some(c, buf, sizeof buf);
        if (got < 0)
            return -1;
        if (c->tls != NULL) {
            int fr = idem__tls_feed(c->tls, buf, (size_t)got);
            if (fr < 0)
                return tls_failed(c, fr);
        } else if (feed_reader(c, buf, (size_t)got) != 0) {
            return -1;
        }
    }
}

bool idem__rconn_idle_ok(idem__rconn_t *c)
{
    if (c->err)
        return false;
    for (;;) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&p, 1, 0);
        if (pr == 0)
            return true;
        if (pr < 0)
            return errno == EINTR ? true : false;
        char buf[IO_CHUNK];
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return true;
        if (n <= 0 || c->tls == NULL)
            return false; /* closed, reset, or a plain server's unasked bytes */
        /* TLS: tickets and key updates are the session's business; any
         * plaintext, alert or close is not. */
        if (idem__tls_feed(c->tls, buf, (size_t)n) < 0)
            return false;
        char pt[64];
        int r = idem__tls_read(c->tls, pt, sizeof pt);
        if (r != 0 || flush_tls(c) != 0)
            return false;
    }
}

int idem__rconn_wait(idem__rconn_t *c, int stop_fd, int ms)
{
    if (c->err)
        return -1;
    /* Bytes the reader holds already (two replies came in one read). */
    if (c->reader->pos < c->reader->len)
        return 1;
    struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
    int r = poll(p, stop_fd >= 0 ? 2 : 1, ms);
    if (r < 0)
        return errno == EINTR ? 0 : (set_err(c, IDEM__RCONN_E_IO, "poll: %s", strerror(errno)), -1);
    if (r > 0 && stop_fd >= 0 && (p[1].revents & POLLIN))
        return 2;
    return r > 0 ? 1 : 0;
}

void idem__rconn_set_timeout(idem__rconn_t *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms < 1 ? 1 : timeout_ms;
}

idem__rconn_err_t idem__rconn_err(const idem__rconn_t *c)
{
    return c->err;
}

const char *idem__rconn_errstr(const idem__rconn_t *c)
{
    return c->errstr;
}
