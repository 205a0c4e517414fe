/* tests/unit/net_fixture.c - loopback sockets, threaded test servers and
 * request reading shared by the unit tests (see net_fixture.h). */
#include "net_fixture.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int tnet_bind_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

int tnet_listen_loopback(int backlog, int *port)
{
    int fd = tnet_bind_loopback(port);
    cr_assert_eq(listen(fd, backlog), 0);
    return fd;
}

typedef struct {
    tnet_server_t *s;
    int fd;
    int index;
} conn_arg_t;

static void *conn_main(void *arg)
{
    conn_arg_t *c = arg;
    c->s->serve(c->s->ctx, c->fd, c->index);
    free(c);
    return NULL;
}

static void *accept_main(void *arg)
{
    tnet_server_t *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) {
            if (atomic_load(&s->stopping))
                return NULL;
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        atomic_fetch_add(&s->accepts, 1);
        int i = atomic_fetch_add(&s->n_conns, 1);
        conn_arg_t *c = i < TNET_MAX_CONNS ? malloc(sizeof *c) : NULL;
        if (c == NULL) {
            close(fd);
            continue;
        }
        *c = (conn_arg_t){.s = s, .fd = fd, .index = i};
        if (pthread_create(&s->conns[i], NULL, conn_main, c) != 0)
            abort(); /* the test cannot go on without its server */
    }
}

void tnet_server_start(tnet_server_t *s, tnet_serve_fn serve, void *ctx)
{
    s->serve = serve;
    s->ctx = ctx;
    atomic_store(&s->accepts, 0);
    atomic_store(&s->n_conns, 0);
    atomic_store(&s->stopping, false);
    s->lfd = tnet_listen_loopback(64, &s->port);
    cr_assert_eq(pthread_create(&s->acceptor, NULL, accept_main, s), 0);
}

void tnet_server_stop(tnet_server_t *s)
{
    atomic_store(&s->stopping, true);
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    int n = atomic_load(&s->n_conns);
    for (int i = 0; i < n && i < TNET_MAX_CONNS; i++)
        pthread_join(s->conns[i], NULL);
}

size_t tnet_read_request_from(tnet_read_fn rd, void *src, char *buf, size_t cap)
{
    size_t len = 0;
    char *end = NULL;
    size_t want = 0;
    for (;;) {
        if (end != NULL && len >= want)
            return len;
        if (len + 1 >= cap)
            return 0;
        ssize_t n = rd(src, buf + len, cap - 1 - len);
        if (n <= 0)
            return 0;
        len += (size_t)n;
        buf[len] = '\0';
        if (end == NULL && (end = strstr(buf, "\r\n\r\n")) != NULL) {
            want = (size_t)(end - buf) + 4;
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            if (cl != NULL && cl < end)
                want += strtoul(cl + 17, NULL, 10);
        }
    }
}

static ssize_t fd_read(void *src, char *buf, size_t cap)
{
    return read(*(int *)src, buf, cap);
}

size_t tnet_read_request(int fd, char *buf, size_t cap)
{
    return tnet_read_request_from(fd_read, &fd, buf, cap);
}

bool tnet_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

void tnet_loop_wait(uv_loop_t *loop)
{
    struct pollfd p = {.fd = uv_backend_fd(loop), .events = POLLIN};
    int t = uv_backend_timeout(loop);
    poll(&p, 1, t < 0 || t > 2 ? 2 : t);
}
