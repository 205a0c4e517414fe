/* src/gateway/takeover.c - inherited listening sockets (systemd's
 * LISTEN_FDS, a running idemd's over --takeover) and the control socket
 * that hands this process's over; takeover.h says what and why.
 *
 * The exchange on the control socket (SOCK_STREAM, abstract namespace):
 *   old -> new   "idemd-takeover 1 PID MASK\n" with SCM_RIGHTS: one
 *                descriptor for each bit of MASK (1 public, 2 admin,
 *                4 listen_tls), in that order
 *   new -> old   "ok\n" when every socket checked out, else "no\n"
 *   old          on "ok": closes the control socket (its name is free),
 *                then the connection; it serves on until SIGTERM
 *   new          reads to the end of the connection, so the name is free
 *                when it binds it once it serves
 * Both ends time out after TK_TIMEOUT_S of silence.
 */
#include "gateway/takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "gateway/config.h"
#include "gateway/conn.h"
#include "gateway/log.h"
#include "gateway/thread.h"

#define TK_TIMEOUT_S 10
#define TK_MAGIC "idemd-takeover 1"

static const char *const kind_name[IDEM_TK_N] = {"listen", "admin", "listen_tls"};

/* ---- addresses ------------------------------------------------------------ */

/* "ADDR:PORT" (an IP literal, as idem__listen_socket takes) as a sockaddr. */
static bool parse_addr(const char *text, struct sockaddr_storage *ss)
{
    char host[256];
    int port;
    if (text == NULL || idem__config_parse_addr(text, host, sizeof host, &port) != 0)
        return false;
    memset(ss, 0, sizeof *ss);
    return uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0 ||
           uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0;
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
    }
    return false;
}

/* "ADDR:PORT" of a socket address, "[ADDR]:PORT" for IPv6. */
static void addr_text(const struct sockaddr_storage *ss, char *out, size_t outlen)
{
    char ip[64] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)ss, ip, sizeof ip);
        port = ntohs(((const struct sockaddr_in *)ss)->sin_port);
        snprintf(out, outlen, "%s:%d", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)ss, ip, sizeof ip);
        port = ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
        snprintf(out, outlen, "[%s]:%d", ip, port);
    } else {
        snprintf(out, outlen, "(not an IP socket)");
    }
}

/* Is fd a listening TCP socket?  Its address in *ss. */
static bool listening_tcp(int fd, struct sockaddr_storage *ss)
{
    int v = 0;
    socklen_t len = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) != 0 || v != SOCK_STREAM)
        return false;
    len = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0 || v != 1)
        return false;
    len = sizeof *ss;
    memset(ss, 0, sizeof *ss);
    if (getsockname(fd, (struct sockaddr *)ss, &len) != 0)
        return false;
    return ss->ss_family == AF_INET || ss->ss_family == AF_INET6;
}

/* The listener whose configured address is ss, or -1. */
static int kind_of(const idem_takeover_t *t, const struct sockaddr_storage *ss)
{
    for (int k = 0; k < IDEM_TK_N; k++) {
        struct sockaddr_storage want;
        if (parse_addr(t->addr[k], &want) && same_addr(&want, ss))
            return k;
    }
    return -1;
}

/* ---- set-up --------------------------------------------------------------- */

void idem__takeover_init(idem_takeover_t *t, const char *listen, const char *admin,
                         const char *tls)
{
    memset(t, 0, sizeof *t);
    t->addr[IDEM_TK_PUBLIC] = listen;
    t->addr[IDEM_TK_ADMIN] = admin;
    t->addr[IDEM_TK_TLS] = tls;
    for (int k = 0; k < IDEM_TK_N; k++)
        t->fd[k] = t->serve_fd[k] = -1;
    t->ctl_fd = t->wake_fd = -1;
    struct sockaddr_storage ss;
    char text[96] = "";
    if (parse_addr(listen, &ss))
        addr_text(&ss, text, sizeof text);
    snprintf(t->ctl_name, sizeof t->ctl_name, "idemd-takeover:%s", text);
}

void idem__takeover_discard(idem_takeover_t *t)
{
    for (int k = 0; k < IDEM_TK_N; k++)
        if (t->fd[k] >= 0) {
            close(t->fd[k]);
            t->fd[k] = -1;
        }
}

/* Give inherited socket fd to listener k after checking it; else err. */
static int adopt(idem_takeover_t *t, int fd, int k, const char *src, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    char got[96];
    if (!listening_tcp(fd, &ss)) {
        snprintf(err, errlen, "%s: descriptor %d is not a listening TCP socket", src, fd);
        return -1;
    }
    addr_text(&ss, got, sizeof got);
    int match = kind_of(t, &ss);
    if (k < 0)
        k = match;
    if (k < 0 || match != k || t->addr[k] == NULL) {
        if (k >= 0 && t->addr[k] != NULL)
            snprintf(err, errlen,
                     "%s: the %s socket listens on %s, but %s is %s (the addresses must "
                     "match; restart idemd to change them)",
                     src, kind_name[k], got, kind_name[k], t->addr[k]);
        else
            snprintf(err, errlen,
                     "%s: a socket listens on %s, which is none of listen, admin, listen_tls",
                     src, got);
        return -1;
    }
    if (t->fd[k] >= 0) {
        snprintf(err, errlen, "%s: two sockets for %s (%s)", src, kind_name[k], got);
        return -1;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    t->fd[k] = fd;
    return 0;
}

/* The k-th ':'-separated name of names, as a listener, or -1 (any). */
static int named_kind(const char *names, int k)
{
    if (names == NULL)
        return -1;
    const char *p = names;
    for (int i = 0; i < k; i++) {
        p = strchr(p, ':');
        if (p == NULL)
            return -1;
        p++;
    }
    size_t n = strcspn(p, ":");
    for (int j = 0; j < IDEM_TK_N; j++)
        if (strlen(kind_name[j]) == n && strncmp(p, kind_name[j], n) == 0)
            return j;
    return -1;
}

/* sd_listen_fds(3), without libsystemd. */
static int from_systemd(idem_takeover_t *t, char *err, size_t errlen)
{
    const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
    if (pid_s == NULL || fds_s == NULL)
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(pid_s, &end, 10);
    if (errno || *end || pid != (long)getpid())
        return 0; /* meant for another process */
    errno = 0;
    long n = strtol(fds_s, &end, 10);
    const char *names = getenv("LISTEN_FDNAMES");
    int rc = 0;
    if (errno || *end || n < 0 || n > IDEM_TK_N) {
        snprintf(err, errlen,
                 "LISTEN_FDS: expected 0 to %d sockets (listen, admin, "
                 "listen_tls), got '%s'",
                 IDEM_TK_N, fds_s);
        rc = -1;
    }
    for (long i = 0; rc == 0 && i < n; i++)
        rc = adopt(t, 3 + (int)i, named_kind(names, (int)i), "LISTEN_FDS", err, errlen);
    if (rc == 0 && n > 0)
        snprintf(t->from, sizeof t->from, "systemd");
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    return rc;
}

static void ctl_address(const idem_takeover_t *t, struct sockaddr_un *sun, socklen_t *len)
{
    memset(sun, 0, sizeof *sun);
    sun->sun_family = AF_UNIX;
    size_t n = strlen(t->ctl_name);
    if (n > sizeof sun->sun_path - 1)
        n = sizeof sun->sun_path - 1;
    memcpy(sun->sun_path + 1, t->ctl_name, n); /* sun_path[0] '\0': abstract */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = TK_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Ask the running idemd for its listeners (--takeover). */
static int from_running(idem_takeover_t *t, char *err, size_t errlen)
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        snprintf(err, errlen, "--takeover: socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_un sun;
    socklen_t sunlen;
    ctl_address(t, &sun, &sunlen);
    if (connect(s, (struct sockaddr *)&sun, sunlen) != 0) {
        int e = errno;
        close(s);
        if (e == ECONNREFUSED || e == ENOENT) {
            snprintf(t->note, sizeof t->note,
                     "--takeover: no idemd answers at @%s; listening afresh", t->ctl_name);
            return 0;
        }
        snprintf(err, errlen, "--takeover: cannot reach @%s: %s", t->ctl_name, strerror(e));
        return -1;
    }
    set_timeouts(s);

    char head[128];
    size_t got = 0;
    int fds[IDEM_TK_N];
    int nfds = 0;
    while (got < sizeof head - 1 && memchr(head, '\n', got) == NULL) {
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * IDEM_TK_N)];
        } c;
        struct iovec iov = {.iov_base = head + got, .iov_len = sizeof head - 1 - got};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = c.buf,
                           .msg_controllen = sizeof c.buf};
        ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        if (r <= 0) {
            snprintf(err, errlen,
                     "--takeover: the running idemd did not hand its sockets "
                     "over: %s",
                     r == 0 ? "it closed the connection" : strerror(errno));
            goto fail;
        }
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
            if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
                continue;
            size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < n; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
                if (nfds < IDEM_TK_N)
                    fds[nfds++] = fd;
                else
                    close(fd);
            }
        }
        if (m.msg_flags & MSG_CTRUNC) {
            snprintf(err, errlen, "--takeover: the sockets handed over were cut short");
            goto fail;
        }
        got += (size_t)r;
    }
    head[got] = '\0';
    long pid = 0;
    unsigned mask = 0;
    if (strncmp(head, TK_MAGIC " ", sizeof TK_MAGIC) != 0 ||
        sscanf(head + sizeof TK_MAGIC, "%ld %u", &pid, &mask) != 2 || pid <= 0 ||
        mask >= (1u << IDEM_TK_N)) {
        snprintf(err, errlen, "--takeover: @%s answered something that is not idemd",
                 t->ctl_name);
        goto fail;
    }
    char src[64];
    snprintf(src, sizeof src, "--takeover (idemd pid %ld)", pid);
    int i = 0;
    for (int k = 0; k < IDEM_TK_N; k++) {
        if (!(mask & (1u << k)))
            continue;
        if (i >= nfds) {
            snprintf(err, errlen, "%s: a socket is missing", src);
            goto fail;
        }
        int fd = fds[i];
        fds[i++] = -1;
        if (t->addr[k] == NULL || t->fd[k] >= 0) {
            close(fd); /* not used here (no listen_tls), or systemd's is */
            continue;
        }
        if (adopt(t, fd, k, src, err, errlen) != 0) {
            close(fd);
            goto fail;
        }
    }
    for (; i < nfds; i++)
        close(fds[i]);
    nfds = 0;
    if (write(s, "ok\n", 3) != 3) {
        snprintf(err, errlen, "%s: cannot confirm: %s", src, strerror(errno));
        goto fail;
    }
    /* The end of the connection: the old process has let go of the name. */
    char c;
    while (read(s, &c, 1) > 0)
        ;
    close(s);
    t->old_pid = (pid_t)pid;
    snprintf(t->from, sizeof t->from, "idemd pid %ld", pid);
    return 0;
fail:
    for (int j = 0; j < nfds; j++)
        if (fds[j] >= 0)
            close(fds[j]);
    if (write(s, "no\n", 3) < 0) {
        /* the old process serves on either way */
    }
    close(s);
    idem__takeover_discard(t);
    return -1;
}

int idem__takeover_inherit(idem_takeover_t *t, bool ask, char *err, size_t errlen)
{
    if (from_systemd(t, err, errlen) != 0) {
        idem__takeover_discard(t);
        return -1;
    }
    if (!ask)
        return 0;
    bool missing = false;
    for (int k = 0; k < IDEM_TK_N; k++)
        missing |= t->addr[k] != NULL && t->fd[k] < 0;
    return missing ? from_running(t, err, errlen) : 0;
}

int idem__takeover_listener(idem_takeover_t *t, int which, int backlog, const char *what,
                            char *err, size_t errlen)
{
    if (t->fd[which] >= 0) {
        int fd = t->fd[which];
        t->fd[which] = -1;
        return fd;
    }
    char host[256];
    int port;
    if (idem__config_parse_addr(t->addr[which], host, sizeof host, &port) != 0) {
        snprintf(err, errlen, "%s: not ADDR:PORT: '%s'", what, t->addr[which]);
        return -1;
    }
    return idem__listen_socket(host, port, backlog, what, err, errlen);
}

/* ---- handing over --------------------------------------------------------- */

/* One --takeover on connection c: true when the new process took them. */
static bool hand_over(idem_takeover_t *t, int c)
{
    struct ucred cred = {0};
    socklen_t len = sizeof cred;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        idem__log(t->gw, "warn", "takeover: refused a process of another user (uid %ld)",
                  (long)cred.uid);
        return false;
    }
    set_timeouts(c);
    char head[64];
    unsigned mask = 0;
    int fds[IDEM_TK_N], n = 0;
    for (int k = 0; k < IDEM_TK_N; k++)
        if (t->serve_fd[k] >= 0) {
            mask |= 1u << k;
            fds[n++] = t->serve_fd[k];
        }
    int hl = snprintf(head, sizeof head, TK_MAGIC " %ld %u\n", (long)getpid(), mask);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * IDEM_TK_N)];
    } cm;
    memset(&cm, 0, sizeof cm);
    struct iovec iov = {.iov_base = head, .iov_len = (size_t)hl};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = cm.buf,
                       .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(h), fds, sizeof(int) * (size_t)n);
    if (sendmsg(c, &m, MSG_NOSIGNAL) != hl) {
        idem__log(t->gw, "warn", "takeover: cannot send the sockets to pid %ld: %s",
                  (long)cred.pid, strerror(errno));
        return false;
    }
    char reply[4] = "";
    size_t got = 0;
    while (got < 3) {
        ssize_t r = read(c, reply + got, 3 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got != 3 || memcmp(reply, "ok\n", 3) != 0) {
        idem__log(t->gw, "warn", "takeover: pid %ld did not take the sockets; serving on",
                  (long)cred.pid);
        return false;
    }
    idem__log(t->gw, "info",
              "takeover: pid %ld took the listeners over; both serve until SIGTERM drains "
              "this process",
              (long)cred.pid);
    return true;
}

static void *ctl_main(void *arg)
{
    idem_takeover_t *t = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = t->ctl_fd, .events = POLLIN},
                              {.fd = t->wake_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (!p[0].revents)
            continue;
        int c = accept4(t->ctl_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        bool done = hand_over(t, c);
        if (done) {
            /* The name goes before the connection ends: the new process
             * binds it once it has read that end. */
            close(t->ctl_fd);
            t->ctl_fd = -1;
        }
        close(c);
        if (done)
            break;
    }
    return NULL;
}

int idem__takeover_serve(idem_takeover_t *t, idem_gw_t *gw, const int fds[IDEM_TK_N], char *err,
                         size_t errlen)
{
    t->gw = gw;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        snprintf(err, errlen, "takeover: socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_un sun;
    socklen_t sunlen;
    ctl_address(t, &sun, &sunlen);
    if (bind(s, (struct sockaddr *)&sun, sunlen) != 0 || listen(s, 4) != 0) {
        /* Another process answers for these listeners (two systemd
         * services on one socket unit): this one cannot be taken over. */
        idem__log(gw, "warn",
                  "takeover: cannot listen on @%s (%s); this process cannot be "
                  "taken over",
                  t->ctl_name, strerror(errno));
        close(s);
        return 0;
    }
    t->wake_fd = eventfd(0, EFD_CLOEXEC);
    int rc = t->wake_fd < 0 ? errno : 0;
    for (int k = 0; k < IDEM_TK_N && rc == 0; k++)
        if (fds[k] >= 0 && (t->serve_fd[k] = fcntl(fds[k], F_DUPFD_CLOEXEC, 0)) < 0)
            rc = errno;
    t->ctl_fd = s;
    if (rc == 0)
        rc = idem__thread_create(&t->thread, "takeover", ctl_main, t);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the takeover thread: %s", strerror(rc));
        idem__takeover_stop(t);
        return -1;
    }
    t->running = true;
    return 0;
}

void idem__takeover_stop(idem_takeover_t *t)
{
    if (t->running) {
        uint64_t one = 1;
        if (write(t->wake_fd, &one, sizeof one) < 0) {
            /* an eventfd write fails only past 2^64-2 */
        }
        pthread_join(t->thread, NULL);
        t->running = false;
    }
    if (t->ctl_fd >= 0)
        close(t->ctl_fd);
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    t->ctl_fd = t->wake_fd = -1;
    for (int k = 0; k < IDEM_TK_N; k++)
        if (t->serve_fd[k] >= 0) {
            close(t->serve_fd[k]);
            t->serve_fd[k] = -1;
        }
}

bool idem__takeover_wait_old(idem_takeover_t *t)
{
    if (t->old_pid <= 0)
        return false;
    pid_t old = t->old_pid;
    t->old_pid = 0; /* one more try, not more */
    int pfd = (int)syscall(SYS_pidfd_open, old, 0);
    if (pfd < 0)
        return errno == ESRCH; /* gone already */
    /* SIGTERM or SIGINT (blocked in every thread, main.c) ends the wait:
     * this process then stops as a start that failed. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    int sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
    struct pollfd p[2] = {{.fd = pfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    while (poll(p, sfd >= 0 ? 2 : 1, -1) < 0 && errno == EINTR)
        ;
    bool exited = p[0].revents != 0;
    close(pfd);
    if (sfd >= 0)
        close(sfd);
    return exited;
}
