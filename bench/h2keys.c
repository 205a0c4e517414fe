/* bench/h2keys.c - idem-h2keys: a load generator that gives every request
 * its own Idempotency-Key, over HTTP/2 (h2c, prior knowledge) or HTTP/1.1.
 *
 * h2load (bench/h2.sh's client) sends the same header list on every
 * request, so it can measure replays but not new keys.  This tool sends
 * the request bench/post.lua sends (POST, Content-Type: application/json,
 * the same 66-byte JSON body) with the key PREFIX-<connection>-<counter>,
 * so that no two requests of a run share a key; PREFIX defaults to one made
 * of the pid and the time, and bench/h2.sh passes one per row and round.
 *
 *   HTTP/2    N connections, each with M streams open at once: a stream that
 *             closes is replaced by a new one.  nghttp2 does the framing
 *             (nghttp2_session_mem_send / mem_recv); the I/O is ours.
 *   --h1      N keep-alive connections, each with up to M requests written
 *             ahead of their answers (pipelined, as `h2load --h1 -m M`
 *             does), answers read in order by Content-Length.
 *
 * One thread, nonblocking sockets, one poll() loop.  New requests stop after
 * D seconds; those in flight are then awaited (at most 5 s more, after which
 * they count as errors).  It prints, one per line, "completed N",
 * "errors N", "seconds S", "req/s R", "client-cpu-us/req U" (its own CPU,
 * getrusage, per answer: the load generator's share of the cores) and
 * "status CODE N" for each status seen, and exits 0 only when every request got a 2xx answer (1 when not,
 * 2 on a usage error).  A bench tool (bench/meson.build), not part of
 * idemd: it allocates with calloc/realloc like bench/storebench.c.
 *
 * Usage: idem-h2keys [--h1] [-c N] [-m M] [-d SECS] [-k PREFIX]
 *                    [-p PATH] HOST PORT
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <nghttp2/nghttp2.h>

#define BODY "{\"amount\":1250,\"currency\":\"EUR\",\"account\":\"acct_1\",\"note\":\"bench\"}"
#define BODY_LEN (sizeof BODY - 1)
#define IN_CAP 65536
#define DRAIN_SECONDS 5.0

/* One HTTP/2 stream of a connection: its answer's status. */
struct slot {
    bool used;
    int status;
};

struct conn {
    int id;
    int fd;
    bool dead;
    unsigned in_flight;
    uint64_t counter;        /* keys sent on this connection */
    nghttp2_session *h2;     /* NULL with --h1 */
    struct slot *slots;      /* M of them (HTTP/2) */
    uint8_t *out;            /* bytes to write: out[off..len) */
    size_t out_len, out_off, out_cap;
    char in[IN_CAP];         /* HTTP/1.1 answers not yet parsed */
    size_t in_len;
};

static struct {
    bool h1;
    unsigned conns, streams;
    double seconds;
    const char *prefix, *path, *host, *port;
    char authority[300];
    char prefix_buf[64];
    bool stopping;
    uint64_t completed, errors;
    uint64_t status[600];
} g = {.conns = 32, .streams = 10, .seconds = 5, .path = "/"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void count_answer(int status)
{
    g.completed++;
    if (status >= 100 && status < 600)
        g.status[status]++;
    else
        g.errors++;
}

static int out_append(struct conn *c, const void *p, size_t n)
{
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 16384;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *b = realloc(c->out, cap);
        if (!b)
            return -1;
        c->out = b;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 0;
}

/* The connection failed: what it had in flight counts as errors. */
static void conn_fail(struct conn *c, const char *why)
{
    if (c->dead)
        return;
    fprintf(stderr, "h2keys: connection %d: %s\n", c->id, why);
    g.errors += c->in_flight;
    c->in_flight = 0;
    c->dead = true;
    close(c->fd);
    c->fd = -1;
}

/* ---- HTTP/2 ---------------------------------------------------------- */

static ssize_t body_read(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)s, (void)sid, (void)src, (void)ud;
    if (len < BODY_LEN)
        return NGHTTP2_ERR_CALLBACK_FAILURE; /* never: frames hold 16 KiB */
    memcpy(buf, BODY, BODY_LEN);
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)BODY_LEN;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *ud)
{
    (void)flags, (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS || namelen != 7 || memcmp(name, ":status", 7) != 0)
        return 0;
    struct slot *sl = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (sl && valuelen == 3)
        sl->status = (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0');
    return 0;
}

static int on_close(nghttp2_session *s, int32_t sid, uint32_t error_code, void *ud)
{
    struct conn *c = ud;
    struct slot *sl = nghttp2_session_get_stream_user_data(s, sid);
    if (!sl)
        return 0;
    if (error_code != NGHTTP2_NO_ERROR || sl->status == 0) {
        g.errors++;
        fprintf(stderr, "h2keys: connection %d stream %d: closed with error %u\n", c->id,
                (int)sid, error_code);
    } else {
        count_answer(sl->status);
    }
    sl->used = false;
    c->in_flight--;
    return 0;
}

static int h2_submit(struct conn *c)
{
    struct slot *sl = NULL;
    for (unsigned i = 0; i < g.streams; i++)
        if (!c->slots[i].used) {
            sl = &c->slots[i];
            break;
        }
    if (!sl)
        return -1;
    char key[128], clen[16];
    int kl = snprintf(key, sizeof key, "%s-%d-%" PRIu64, g.prefix, c->id, ++c->counter);
    int cl = snprintf(clen, sizeof clen, "%zu", BODY_LEN);
#define NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (size_t)(vl), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv nv[] = {
        NV(":method", "POST", 4),
        NV(":scheme", "http", 4),
        NV(":authority", g.authority, strlen(g.authority)),
        NV(":path", g.path, strlen(g.path)),
        NV("content-type", "application/json", 16),
        NV("content-length", clen, cl),
        NV("idempotency-key", key, kl),
    };
#undef NV
    nghttp2_data_provider dp = {.read_callback = body_read};
    int32_t sid = nghttp2_submit_request(c->h2, NULL, nv, sizeof nv / sizeof nv[0], &dp, sl);
    if (sid < 0)
        return -1;
    sl->used = true;
    sl->status = 0;
    c->in_flight++;
    return 0;
}

/* Frames nghttp2 has ready go into the output buffer. */
static int h2_pump(struct conn *c)
{
    for (;;) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->h2, &data);
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (out_append(c, data, (size_t)n) != 0)
            return -1;
    }
}

static int h2_open(struct conn *c)
{
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return -1;
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    int rv = nghttp2_session_client_new(&c->h2, cb, c);
    nghttp2_session_callbacks_del(cb);
    if (rv != 0)
        return -1;
    c->slots = calloc(g.streams, sizeof *c->slots);
    if (!c->slots)
        return -1;
    nghttp2_settings_entry s[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
    return nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, s, 1) == 0 ? 0 : -1;
}

/* ---- HTTP/1.1 -------------------------------------------------------- */

static int h1_submit(struct conn *c)
{
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nIdempotency-Key: %s-%d-%" PRIu64 "\r\n\r\n%s",
                     g.path, g.authority, BODY_LEN, g.prefix, c->id, ++c->counter, BODY);
    if (n < 0 || (size_t)n >= sizeof req || out_append(c, req, (size_t)n) != 0)
        return -1;
    c->in_flight++;
    return 0;
}

/* The value of header NAME in the head [p, end), or NULL. */
static const char *h1_field(const char *p, const char *end, const char *name)
{
    size_t nl = strlen(name);
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            return NULL;
        if ((size_t)(eol - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            p += nl + 1;
            while (*p == ' ' || *p == '\t')
                p++;
            return p;
        }
        p = eol + 1;
    }
    return NULL;
}

/* Parse the complete answers in c->in; -1 when one cannot be read. */
static int h1_parse(struct conn *c)
{
    size_t off = 0;
    while (c->in_flight > 0) {
        char *head = c->in + off;
        size_t avail = c->in_len - off;
        char *eoh = NULL;
        for (size_t i = 3; i < avail; i++)
            if (memcmp(head + i - 3, "\r\n\r\n", 4) == 0) {
                eoh = head + i + 1;
                break;
            }
        if (!eoh)
            break;
        if (avail < 12 || memcmp(head, "HTTP/1.", 7) != 0)
            return -1;
        int status = (head[9] - '0') * 100 + (head[10] - '0') * 10 + (head[11] - '0');
        const char *cl = h1_field(head, eoh, "Content-Length");
        size_t body = 0;
        if (cl) {
            char *e;
            unsigned long v = strtoul(cl, &e, 10);
            if (e == cl)
                return -1;
            body = v;
        } else if (status != 204 && status != 304 && status >= 200) {
            return -1; /* idemd and nginx answer with Content-Length here */
        }
        size_t total = (size_t)(eoh - head) + body;
        if (total > avail)
            break;
        off += total;
        c->in_flight--;
        count_answer(status);
    }
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    return c->in_len == IN_CAP ? -1 : 0;
}

/* ---- the loop -------------------------------------------------------- */

static void conn_fill(struct conn *c)
{
    if (c->dead)
        return;
    if (!g.stopping)
        while (c->in_flight < g.streams)
            if ((c->h2 ? h2_submit(c) : h1_submit(c)) != 0) {
                conn_fail(c, "cannot submit a request");
                return;
            }
    if (c->h2 && h2_pump(c) != 0)
        conn_fail(c, "nghttp2 send failed");
}

static void conn_write(struct conn *c)
{
    while (!c->dead && c->out_off < c->out_len) {
        ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                conn_fail(c, strerror(errno));
            return;
        }
    }
}

static void conn_read(struct conn *c)
{
    uint8_t buf[IN_CAP];
    while (!c->dead) {
        uint8_t *dst = c->h2 ? buf : (uint8_t *)c->in + c->in_len;
        size_t cap = c->h2 ? sizeof buf : IN_CAP - c->in_len;
        ssize_t n = read(c->fd, dst, cap);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            conn_fail(c, n == 0 ? "closed by the server" : strerror(errno));
            return;
        }
        if (c->h2) {
            if (nghttp2_session_mem_recv(c->h2, buf, (size_t)n) != n)
                conn_fail(c, "nghttp2 receive failed");
        } else {
            c->in_len += (size_t)n;
            if (h1_parse(c) != 0)
                conn_fail(c, "unreadable HTTP/1.1 answer");
        }
    }
}

static int conn_open(struct conn *c, const struct addrinfo *ai)
{
    c->fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "h2keys: connect %s:%s: %s\n", g.host, g.port, strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    if (!g.h1 && h2_open(c) != 0) {
        fprintf(stderr, "h2keys: nghttp2 session failed\n");
        return -1;
    }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: idem-h2keys [--h1] [-c N] [-m M] [-d SECS] [-k PREFIX] [-p PATH] "
                    "HOST PORT\n");
    return 2;
}

static bool whole(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *e;
    errno = 0;
    unsigned long v = strtoul(s, &e, 10);
    if (errno || e == s || *e || v < lo || v > hi)
        return false;
    *out = (unsigned)v;
    return true;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--h1") == 0) {
            g.h1 = true;
            continue;
        }
        if (i + 1 >= argc)
            return usage();
        const char *v = argv[++i];
        unsigned secs;
        if (strcmp(o, "-c") == 0 && whole(v, 1, 10000, &g.conns))
            continue;
        if (strcmp(o, "-m") == 0 && whole(v, 1, 1000, &g.streams))
            continue;
        if (strcmp(o, "-d") == 0 && whole(v, 1, 3600, &secs)) {
            g.seconds = secs;
            continue;
        }
        if (strcmp(o, "-k") == 0 && *v && strlen(v) < 64) {
            g.prefix = v;
            continue;
        }
        if (strcmp(o, "-p") == 0 && v[0] == '/' && strlen(v) < 200) {
            g.path = v;
            continue;
        }
        return usage();
    }
    if (argc - i != 2)
        return usage();
    g.host = argv[i];
    g.port = argv[i + 1];
    if (strlen(g.host) > 250)
        return usage();
    snprintf(g.authority, sizeof g.authority, "%s:%s", g.host, g.port);
    if (!g.prefix) {
        snprintf(g.prefix_buf, sizeof g.prefix_buf, "h2k%ld-%ld", (long)getpid(), (long)time(NULL));
        g.prefix = g.prefix_buf;
    }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int rv = getaddrinfo(g.host, g.port, &hints, &ai);
    if (rv != 0) {
        fprintf(stderr, "h2keys: %s:%s: %s\n", g.host, g.port, gai_strerror(rv));
        return 1;
    }
    struct conn *cs = calloc(g.conns, sizeof *cs);
    struct pollfd *pf = calloc(g.conns, sizeof *pf);
    if (!cs || !pf)
        return 1;
    for (unsigned k = 0; k < g.conns; k++) {
        cs[k].id = (int)k;
        if (conn_open(&cs[k], ai) != 0)
            return 1;
    }
    freeaddrinfo(ai);

    double start = now_s(), end = start + g.seconds, stopped = 0;
    for (;;) {
        double t = now_s();
        if (!g.stopping && t >= end) {
            g.stopping = true;
            stopped = t;
        }
        unsigned busy = 0;
        for (unsigned k = 0; k < g.conns; k++) {
            struct conn *c = &cs[k];
            conn_fill(c);
            conn_write(c);
            busy += !c->dead && c->in_flight > 0;
            pf[k].fd = c->dead ? -1 : c->fd;
            pf[k].events = (short)(POLLIN | (c->out_off < c->out_len ? POLLOUT : 0));
            pf[k].revents = 0;
        }
        if (g.stopping && busy == 0)
            break;
        if (g.stopping && t - stopped > DRAIN_SECONDS) {
            for (unsigned k = 0; k < g.conns; k++)
                conn_fail(&cs[k], "answers still missing after the run");
            break;
        }
        if (poll(pf, g.conns, 100) < 0 && errno != EINTR) {
            perror("h2keys: poll");
            return 1;
        }
        for (unsigned k = 0; k < g.conns; k++)
            if (pf[k].fd >= 0 && (pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                conn_read(&cs[k]);
    }
    double took = now_s() - start;

    printf("protocol %s\nconnections %u\nstreams %u\n", g.h1 ? "http/1.1" : "h2", g.conns,
           g.streams);
    printf("completed %" PRIu64 "\nerrors %" PRIu64 "\nseconds %.3f\nreq/s %.0f\n", g.completed,
           g.errors, took, (double)g.completed / took);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                 ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
    printf("client-cpu-us/req %.1f\n", g.completed ? cpu * 1e6 / (double)g.completed : 0.0);
    bool all_2xx = g.errors == 0 && g.completed > 0;
    for (int s = 0; s < 600; s++)
        if (g.status[s]) {
            printf("status %d %" PRIu64 "\n", s, g.status[s]);
            if (s < 200 || s > 299)
                all_2xx = false;
        }
    for (unsigned k = 0; k < g.conns; k++) {
        if (!cs[k].dead)
            close(cs[k].fd);
        if (cs[k].h2)
            nghttp2_session_del(cs[k].h2);
        free(cs[k].slots);
        free(cs[k].out);
    }
    free(cs);
    free(pf);
    return all_2xx ? 0 : 1;
}
