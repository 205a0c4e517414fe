/* examples/ledger/server.c - the ledger's HTTP/1.1 server: blocking sockets,
 * a thread per connection, libidem's parser.
 *
 * A connection thread reads into one bounded buffer (head limit + body
 * limit + one read), parses the head each time more bytes arrive (the
 * parser remembers how far it looked), refuses what the ledger does not
 * take (chunked bodies: 411; a body over SRV_BODY_MAX: 413; malformed
 * HTTP: 400, 431 or 505, then the connection closes), waits for the whole
 * Content-Length body, parses the head again (the buffer may have moved
 * while the body arrived, and the slices must point into it), calls the
 * handler, sends its answer and consumes the request.  Whatever follows in
 * the buffer is the next, pipelined, request.
 *
 * Shutdown: srv_stop writes a byte to a pipe the accepting thread polls.
 * It then closes the listener and shuts down the reading side of every open
 * connection: a thread waiting for a request sees end-of-file and leaves;
 * a thread inside the handler finishes, sends its answer (with
 * "Connection: close") and leaves.  srv_run returns when all have left.
 * A connection thread is detached, so it frees what OpenSSL keeps per
 * thread (libidem hashes fingerprints with it) before it says it
 * left: otherwise the process could exit between that word and the
 * thread's own end, and LeakSanitizer saw the state as leaked.
 *
 * THREADING: the state below is the one server of the process; the
 * connection table is guarded by its mutex, stopping is atomic.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_SIZE (16 * 1024)
#define IN_MAX (SRV_HEAD_MAX + SRV_BODY_MAX + READ_SIZE)
#define DRAIN_TIMEOUT_S 30
#define THREAD_STACK (512 * 1024)

static struct {
    int listen_fd;
    int wake[2];           /* srv_stop writes to wake[1] */
    atomic_bool stopping;
    pthread_mutex_t mu;
    pthread_cond_t idle;   /* signalled when a connection leaves */
    int *fds;              /* open connections, -1 for a free slot */
    int max_conns;
    int n_conns;
    const srv_config_t *cfg;
} srv = {.listen_fd = -1, .wake = {-1, -1}, .mu = PTHREAD_MUTEX_INITIALIZER,
         .idle = PTHREAD_COND_INITIALIZER};

/* ---- writing ------------------------------------------------------------ */

int srv_write(srv_response_t *resp, int status, const idem_header_t *headers, size_t n_headers,
              const void *body, size_t body_len)
{
    idem_buf_t *b = resp->out;
    size_t mark = b->len;
    int rc = idem__http_write_status(b, status);
    for (size_t i = 0; rc == 0 && i < n_headers; i++)
        rc = idem__http_write_field(b, headers[i].name, headers[i].name_len, headers[i].value,
                                    headers[i].value_len);
    if (rc == 0)
        rc = idem__buf_appendf(b, "Content-Length: %zu\r\n%s\r\n", body_len,
                               resp->close ? "Connection: close\r\n" : "");
    if (rc == 0 && body_len > 0 && !resp->head_only)
        rc = idem__buf_append(b, body, body_len);
    if (rc != 0) {
        b->len = mark; /* nothing half-written goes out */
        return -1;
    }
    resp->written = true;
    return 0;
}

int srv_problem(srv_response_t *resp, int status, const char *type, const char *title,
                const char *detail, long retry_after)
{
    char urn[96];
    snprintf(urn, sizeof urn, "urn:idem:problem:%s", type);
    json_t *j = json_pack("{s:s, s:s, s:i, s:s}", "type", urn, "title", title, "status", status,
                          "detail", detail ? detail : title);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (text == NULL)
        return -1;
    char ra[24];
    int n_ra = snprintf(ra, sizeof ra, "%ld", retry_after);
    idem_header_t h[2] = {
        {"Content-Type", 12, "application/problem+json", 24},
        {"Retry-After", 11, ra, (size_t)n_ra},
    };
    int rc = srv_write(resp, status, h, retry_after > 0 ? 2 : 1, text, strlen(text));
    free(text);
    return rc;
}

/* ---- one connection ----------------------------------------------------- */

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read once more into in.  @return bytes read, 0 at end of file, -1 on an
 * error or the idle timeout. */
static ssize_t read_more(int fd, idem_buf_t *in)
{
    char tmp[READ_SIZE];
    size_t room = in->max - in->len;
    if (room == 0)
        return -1;
    for (;;) {
        ssize_t r = recv(fd, tmp, room < sizeof tmp ? room : sizeof tmp, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && idem__buf_append(in, tmp, (size_t)r) != 0)
            return -1;
        return r;
    }
}

static int http_error_status(int rc)
{
    switch (rc) {
    case IDEM_HTTP_E_HEAD_TOO_LARGE:
    case IDEM_HTTP_E_TOO_MANY_HEADERS: return 431;
    case IDEM_HTTP_E_VERSION: return 505;
    case IDEM_HTTP_E_BODY_TOO_LARGE: return 413;
    default: return 400;
    }
}

/* Answer with a problem, send it, and tell the caller to close. */
static void fail_conn(int fd, idem_buf_t *out, int status, const char *type, const char *title,
                      const char *detail)
{
    srv_response_t resp = {.out = out, .close = true};
    idem__buf_reset(out);
    if (srv_problem(&resp, status, type, title, detail, 0) == 0)
        send_all(fd, out->data, out->len);
}

static void serve(int fd, idem_buf_t *in, idem_buf_t *out, idem_http_msg_t *msg)
{
    for (;;) {
        /* the head */
        idem_http_head_state_t hs = {0};
        int rc;
        while ((rc = idem__http_parse_request(&hs, in->data, in->len, SRV_HEAD_MAX, msg)) ==
               IDEM_HTTP_INCOMPLETE) {
            if (in->len == 0 && atomic_load(&srv.stopping))
                return;
            if (read_more(fd, in) <= 0)
                return;
        }
        if (rc < 0) {
            int status = http_error_status(rc);
            fail_conn(fd, out, status,
                      status == 431 ? "head-too-large" : status == 505 ? "version" : "bad-request",
                      "Malformed request", "the request is not HTTP/1.1 this server accepts");
            return;
        }
        size_t head_len = (size_t)rc;
        if (msg->framing == IDEM_HTTP_BODY_CHUNKED) {
            fail_conn(fd, out, 411, "length-required", "Length Required",
                      "send the body with Content-Length, not chunked");
            return;
        }
        uint64_t clen = msg->framing == IDEM_HTTP_BODY_LENGTH ? msg->content_length : 0;
        if (clen > SRV_BODY_MAX) {
            char detail[96];
            snprintf(detail, sizeof detail, "the body is %llu bytes; at most %d are accepted",
                     (unsigned long long)clen, SRV_BODY_MAX);
            fail_conn(fd, out, 413, "body-too-large", "Body too large", detail);
            return;
        }
        if (msg->expect_continue && clen > 0 && in->len < head_len + clen) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            if (send_all(fd, cont, sizeof cont - 1) != 0)
                return;
        }
        /* the body */
        size_t need = head_len + (size_t)clen;
        while (in->len < need)
            if (read_more(fd, in) <= 0)
                return;
        hs = (idem_http_head_state_t){0};
        if (idem__http_parse_request(&hs, in->data, in->len, SRV_HEAD_MAX, msg) != (int)head_len)
            return; /* cannot happen: the same bytes parsed a moment ago */

        srv_request_t req = {.msg = msg, .body = in->data + head_len, .body_len = (size_t)clen};
        const char *q = memchr(msg->target.ptr, '?', msg->target.len);
        req.path.ptr = msg->target.ptr;
        req.path.len = q ? (size_t)(q - msg->target.ptr) : msg->target.len;
        req.query.ptr = q ? q + 1 : msg->target.ptr + msg->target.len;
        req.query.len = msg->target.len - req.path.len - (q ? 1 : 0);

        idem__buf_reset(out);
        srv_response_t resp = {.out = out,
                               .close = !msg->keep_alive || atomic_load(&srv.stopping),
                               .head_only = idem__slice_eq_ci(msg->method, "HEAD")};
        srv.cfg->handler(srv.cfg->ctx, &req, &resp);
        if (!resp.written) {
            resp.close = true;
            idem__buf_reset(out);
            srv_problem(&resp, 500, "internal", "Internal error", "the answer did not fit", 0);
        }
        if (send_all(fd, out->data, out->len) != 0 || resp.close)
            return;
        idem__buf_consume(in, need);
    }
}

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = SRV_IDLE_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

typedef struct conn_arg {
    int fd;
    int slot;
} conn_arg_t;

static void *conn_main(void *p)
{
    conn_arg_t a = *(conn_arg_t *)p;
    free(p);
    idem_buf_t in, out;
    idem__buf_init(&in, IN_MAX);
    idem__buf_init(&out, SRV_OUT_MAX);
    idem_http_msg_t *msg = malloc(sizeof *msg);
    if (msg != NULL) {
        set_timeouts(a.fd);
        serve(a.fd, &in, &out, msg);
    }
    free(msg);
    idem__buf_cleanup(&in);
    idem__buf_cleanup(&out);
    OPENSSL_thread_stop();
    pthread_mutex_lock(&srv.mu);
    srv.fds[a.slot] = -1;
    srv.n_conns--;
    close(a.fd);
    pthread_cond_broadcast(&srv.idle);
    pthread_mutex_unlock(&srv.mu);
    return NULL;
}

/* Take a slot for fd and start its thread; 503 when the cap is reached. */
static void admit(int fd)
{
    pthread_mutex_lock(&srv.mu);
    int slot = -1;
    if (srv.n_conns < srv.max_conns)
        for (int i = 0; i < srv.max_conns; i++)
            if (srv.fds[i] < 0) {
                slot = i;
                break;
            }
    conn_arg_t *a = slot >= 0 ? malloc(sizeof *a) : NULL;
    if (a != NULL) {
        a->fd = fd;
        a->slot = slot;
        srv.fds[slot] = fd;
        srv.n_conns++;
    }
    pthread_mutex_unlock(&srv.mu);
    if (a == NULL) {
        idem_buf_t out;
        idem__buf_init(&out, 4096);
        fail_conn(fd, &out, 503, "too-many-connections", "Too many connections",
                  "the server is at its connection limit; retry later");
        idem__buf_cleanup(&out);
        close(fd);
        return;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    pthread_t t;
    int rc = pthread_create(&t, &attr, conn_main, a);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&srv.mu);
        srv.fds[slot] = -1;
        srv.n_conns--;
        pthread_mutex_unlock(&srv.mu);
        free(a);
        close(fd);
    }
}

/* ---- listening ---------------------------------------------------------- */

static int parse_listen(const char *s, struct sockaddr_storage *sa, socklen_t *len)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || port < 1 || port > 65535)
        return -1;
    memset(sa, 0, sizeof *sa);
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)sa;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
        return inet_pton(AF_INET6, host + 1, &a6->sin6_addr) == 1 ? 0 : -1;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)sa;
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *len = sizeof *a4;
    return inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host,
                     &a4->sin_addr) == 1
               ? 0
               : -1;
}

int srv_listen(const srv_config_t *cfg, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    if (parse_listen(cfg->listen, &sa, &salen) != 0) {
        snprintf(err, errlen, "--listen: not HOST:PORT: '%s'", cfg->listen);
        return -2;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, salen) != 0 || listen(fd, 511) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", cfg->listen, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (pipe2(srv.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        close(fd);
        return -1;
    }
    srv.listen_fd = fd;
    return 0;
}

void srv_stop(void)
{
    atomic_store(&srv.stopping, true);
    if (srv.wake[1] >= 0) {
        ssize_t w = write(srv.wake[1], "x", 1);
        (void)w;
    }
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int srv_run(const srv_config_t *cfg)
{
    srv.cfg = cfg;
    srv.max_conns = cfg->max_conns;
    srv.fds = malloc(sizeof *srv.fds * (size_t)cfg->max_conns);
    if (srv.fds == NULL)
        return -1;
    for (int i = 0; i < cfg->max_conns; i++)
        srv.fds[i] = -1;
    struct pollfd pf[2] = {{.fd = srv.listen_fd, .events = POLLIN},
                           {.fd = srv.wake[0], .events = POLLIN}};
    uint64_t next_tick = mono_ms() + (uint64_t)cfg->tick_ms;
    while (!atomic_load(&srv.stopping)) {
        int timeout = -1;
        if (cfg->tick) {
            uint64_t now = mono_ms();
            if (now >= next_tick) {
                cfg->tick(cfg->ctx);
                next_tick = now + (uint64_t)cfg->tick_ms;
            }
            uint64_t left = next_tick > now ? next_tick - now : 0;
            timeout = (int)(left < (uint64_t)cfg->tick_ms ? left : (uint64_t)cfg->tick_ms);
        }
        int n = poll(pf, 2, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 && (pf[0].revents & POLLIN)) {
            int fd = accept4(srv.listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                admit(fd);
            else if (errno == EMFILE || errno == ENFILE)
                usleep(10000); /* let connections close before trying again */
        }
    }
    close(srv.listen_fd);
    srv.listen_fd = -1;

    /* wake the connections waiting for a request; let the busy ones finish */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += DRAIN_TIMEOUT_S;
    pthread_mutex_lock(&srv.mu);
    for (int i = 0; i < srv.max_conns; i++)
        if (srv.fds[i] >= 0)
            shutdown(srv.fds[i], SHUT_RD);
    while (srv.n_conns > 0)
        if (pthread_cond_timedwait(&srv.idle, &srv.mu, &deadline) != 0)
            break;
    int left = srv.n_conns;
    pthread_mutex_unlock(&srv.mu);
    if (left > 0)
        return -1; /* their threads still use srv.fds: leave it */
    free(srv.fds);
    srv.fds = NULL;
    close(srv.wake[0]);
    close(srv.wake[1]);
    srv.wake[0] = srv.wake[1] = -1;
    return 0;
}
