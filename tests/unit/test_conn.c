/* tests/unit/test_conn.c - idemd's HTTP/1.1 connections (src/gateway/conn.c)
 * against a handler of the test's own, over real loopback sockets.
 *
 * A listener on 127.0.0.1:0 runs on the test's own uv loop with a test
 * handler (handler.h) that records every call made to it (on_head, each body
 * piece, on_body_end, on_expect, on_proceed, on_gone) in one event string,
 * and answers as the request's path says: at once in on_head with
 * IDEM_OS_CLOSE, at once in on_body_end, later from a uv timer, streamed
 * with several sends that honour backpressure, or aborted.  The clients are
 * plain non-blocking sockets of the test thread, read between turns of the
 * loop (pump); a client that "does not read" is simply not read.
 *
 * Every call of the connection into the handler checks that no stream call
 * of the handler is running (in_stream): the connection must call its
 * request only from the loop.  No verdict depends on timing: the loop is run
 * until an event (run_until, whose deadline only bounds a hang), and "does
 * not happen" is checked after the loop has had turns to do it: a write
 * libuv completed is reported on the next turn whatever the load.  The
 * listening socket's send buffer and the clients' receive buffers are small,
 * so an answer of a MiB waits in the connection's own queue until its
 * client reads.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "gateway/config.h"
#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/handler.h"
#include "idem/alloc.h"
#include "net_fixture.h"

/* ---- the test handler ------------------------------------------------------- */

typedef enum {
    M_END,        /* answer at once in on_body_end: 200, the path as body */
    M_CLOSE,      /* refuse at once in on_head with IDEM_OS_CLOSE (413) */
    M_LATER,      /* answer from a uv timer after on_body_end */
    M_EOF,        /* unknown length, "abc" then "def" */
    M_STREAM,     /* unknown length, STREAM_TOTAL bytes in pieces, with backpressure */
    M_BIG,        /* BIG_TOTAL bytes with a Content-Length, one send */
    M_ABORT_LEN,  /* Content-Length 1000, 100 bytes, abort */
    M_ABORT_CHUNK,/* unknown length, "abc" twice, abort */
    M_EXPECT_NO,  /* on_expect refuses with 417 and IDEM_OS_CLOSE */
} tmode_t;

#define PIECE (64 * 1024)
#define STREAM_TOTAL (8u << 20)
#define BIG_TOTAL (1u << 20)

typedef struct treq {
    idem_ostream_t *os;
    char path[128];
    tmode_t mode;
    bool over;       /* its answer ended (final or abort): the connection forgets it */
    bool gone;       /* told on_gone */
    bool timer_on;   /* a uv timer of its own is armed or closing */
    uv_timer_t timer;
    size_t sent;     /* body bytes sent */
    size_t total;
    int waits;       /* sends answered false */
    int proceeds;
    int body_ends;
} treq_t;

static struct {
    char events[16384];
    size_t ev_len;
    bool in_stream;       /* a stream call of the handler is running */
    int reentered;        /* handler calls made while in_stream */
    int after_over;       /* calls about a request after its answer ended or on_gone */
    int gone;
    int heads;
    int proceeds;         /* on_proceed calls, every request together */
    int ended;            /* answers ended (final or abort) */
    char body[8192];      /* the body pieces of every request, in order */
    size_t body_len;
    int pieces;
    int expects;
    bool expect_saw_bytes; /* the client had bytes from us when on_expect ran */
    int expect_client;     /* the client fd on_expect peeks at */
    long lag_at_proceed;   /* body bytes sent and not yet read by clients[0] at the first
                              on_proceed; -1: none yet */
    treq_t *last;          /* the last request made */
    int live;              /* requests not yet freed */
} H;

static uv_loop_t loop;
static size_t client0_read(void);

static void ev(const char *what, const char *path)
{
    int n = snprintf(H.events + H.ev_len, sizeof H.events - H.ev_len, "%s%s;", what, path);
    if (n > 0 && (size_t)n < sizeof H.events - H.ev_len)
        H.ev_len += (size_t)n;
}

static void enter(treq_t *q)
{
    if (H.in_stream)
        H.reentered++;
    if (q != NULL && (q->over || q->gone))
        H.after_over++;
}

static void treq_free_cb(uv_handle_t *h)
{
    treq_t *q = h->data;
    free(q);
    H.live--;
}

/* Free q once the connection forgets it and its timer is not armed. */
static void treq_maybe_free(treq_t *q)
{
    if (!(q->over || q->gone) || q->timer_on)
        return;
    if (q->timer.data == NULL) { /* no timer was ever made */
        free(q);
        H.live--;
        return;
    }
    uv_close((uv_handle_t *)&q->timer, treq_free_cb);
}

static int t_start(treq_t *q, int status, idem_http_framing_t framing, uint64_t len,
                   unsigned flags)
{
    idem_http_field_t f[1] = {{{"X-Test", 6}, {"1", 1}}};
    idem_http_response_t r = {.status = status, .fields = f, .n_fields = 1, .framing = framing,
                              .content_length = len};
    H.in_stream = true;
    int rc = q->os->ops->start(q->os, &r, flags);
    H.in_stream = false;
    return rc;
}

static bool t_send(treq_t *q, const void *p, size_t n, bool final)
{
    H.in_stream = true;
    bool ok = q->os->ops->send(q->os, p, n, final);
    H.in_stream = false;
    q->sent += n;
    if (final) {
        q->over = true;
        H.ended++;
        ev("A", q->path);
    }
    return ok;
}

static void t_abort(treq_t *q)
{
    H.in_stream = true;
    q->os->ops->abort(q->os);
    H.in_stream = false;
    q->over = true;
    H.ended++;
    ev("X", q->path);
}

static void answer_whole(treq_t *q, int status, const char *body, unsigned flags)
{
    size_t n = strlen(body);
    cr_assert_eq(t_start(q, status, IDEM_HTTP_BODY_LENGTH, n, flags), 0);
    t_send(q, body, n, true);
}

static char piece_buf[PIECE];

/* Send the stream's pieces until it is done or told to wait. */
static void pump_stream(treq_t *q)
{
    while (!q->over && !q->gone) {
        size_t n = q->total - q->sent < PIECE ? q->total - q->sent : PIECE;
        bool final = q->sent + n == q->total;
        memset(piece_buf, 'a' + (int)((q->sent / PIECE) % 26), n);
        if (!t_send(q, piece_buf, n, final) && !final) {
            q->waits++;
            return;
        }
    }
}

static void answer(treq_t *q)
{
    switch (q->mode) {
    case M_END:
    case M_LATER: answer_whole(q, 200, q->path + 1, 0); break;
    case M_EOF:
        cr_assert_eq(t_start(q, 200, IDEM_HTTP_BODY_EOF, 0, 0), 0);
        t_send(q, "abc", 3, false);
        t_send(q, "def", 3, true);
        break;
    case M_STREAM:
        cr_assert_eq(t_start(q, 200, IDEM_HTTP_BODY_EOF, 0, 0), 0);
        q->total = STREAM_TOTAL;
        pump_stream(q);
        break;
    case M_BIG: {
        char *b = malloc(BIG_TOTAL);
        cr_assert_not_null(b);
        memset(b, 'b', BIG_TOTAL);
        cr_assert_eq(t_start(q, 200, IDEM_HTTP_BODY_LENGTH, BIG_TOTAL, 0), 0);
        t_send(q, b, BIG_TOTAL, true);
        free(b);
        break;
    }
    case M_ABORT_LEN: {
        char b[100];
        memset(b, 'z', sizeof b);
        cr_assert_eq(t_start(q, 200, IDEM_HTTP_BODY_LENGTH, 1000, 0), 0);
        t_send(q, b, sizeof b, false);
        t_abort(q);
        break;
    }
    case M_ABORT_CHUNK:
        cr_assert_eq(t_start(q, 200, IDEM_HTTP_BODY_EOF, 0, 0), 0);
        t_send(q, "abc", 3, false);
        t_send(q, "abc", 3, false);
        t_abort(q);
        break;
    default: cr_assert_fail("no answer for mode %d", q->mode);
    }
}

static void on_later(uv_timer_t *t)
{
    treq_t *q = t->data;
    enter(NULL);
    q->timer_on = false;
    if (!q->gone)
        answer(q);
    treq_maybe_free(q);
}

static const struct {
    const char *prefix;
    tmode_t mode;
} MODES[] = {
    {"/close", M_CLOSE},       {"/later", M_LATER},         {"/eof", M_EOF},
    {"/stream", M_STREAM},     {"/big", M_BIG},             {"/abortlen", M_ABORT_LEN},
    {"/abortchunk", M_ABORT_CHUNK}, {"/expectno", M_EXPECT_NO},
};

static idem_hreq_t *th_on_head(idem_handler_t *h, const idem_http_msg_t *m, const char *head,
                               size_t head_len, idem_ostream_t *os, const idem_conn_facts_t *facts)
{
    (void)h;
    (void)head;
    (void)head_len;
    (void)facts;
    enter(NULL);
    H.heads++;
    treq_t *q = calloc(1, sizeof *q);
    cr_assert_not_null(q);
    H.live++;
    q->os = os;
    size_t n = m->target.len < sizeof q->path - 1 ? m->target.len : sizeof q->path - 1;
    memcpy(q->path, m->target.ptr, n);
    q->mode = M_END;
    for (size_t i = 0; i < sizeof MODES / sizeof MODES[0]; i++)
        if (strncmp(q->path, MODES[i].prefix, strlen(MODES[i].prefix)) == 0)
            q->mode = MODES[i].mode;
    ev("H", q->path);
    H.last = q;
    if (q->mode == M_CLOSE) {
        answer_whole(q, 413, "refused", IDEM_OS_CLOSE);
        treq_maybe_free(q);
        H.last = NULL;
        return NULL;
    }
    return q;
}

static bool th_on_expect(idem_hreq_t *r)
{
    treq_t *q = r;
    enter(q);
    H.expects++;
    ev("C", q->path);
    char b;
    ssize_t n = recv(H.expect_client, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0)
        H.expect_saw_bytes = true;
    if (q->mode == M_EXPECT_NO) {
        answer_whole(q, 417, "no", IDEM_OS_CLOSE);
        treq_maybe_free(q);
        return false;
    }
    return true;
}

static bool th_on_body(idem_hreq_t *r, const char *p, size_t n)
{
    treq_t *q = r;
    enter(q);
    H.pieces++;
    if (H.body_len + n <= sizeof H.body) {
        memcpy(H.body + H.body_len, p, n);
        H.body_len += n;
    }
    return true;
}

static void th_on_body_end(idem_hreq_t *r)
{
    treq_t *q = r;
    enter(q);
    q->body_ends++;
    ev("E", q->path);
    if (q->mode == M_LATER) {
        uv_timer_init(&loop, &q->timer);
        q->timer.data = q;
        q->timer_on = true;
        uv_timer_start(&q->timer, on_later, 1, 0);
        return;
    }
    answer(q);
    treq_maybe_free(q);
}

static void th_on_body_error(idem_hreq_t *r, int rc)
{
    treq_t *q = r;
    (void)rc;
    enter(q);
    ev("R", q->path);
    answer_whole(q, 400, "bad body", IDEM_OS_CLOSE);
    treq_maybe_free(q);
}

static void th_on_proceed(idem_hreq_t *r)
{
    treq_t *q = r;
    enter(q);
    H.proceeds++;
    if (q->proceeds++ == 0)
        H.lag_at_proceed = (long)q->sent - (long)client0_read();
    pump_stream(q);
    treq_maybe_free(q);
}

static void th_on_gone(idem_hreq_t *r)
{
    treq_t *q = r;
    enter(q);
    H.gone++;
    q->gone = true;
    ev("G", q->path);
    treq_maybe_free(q);
}

static const idem_handler_ops_t th_ops = {
    .on_head = th_on_head,
    .on_expect = th_on_expect,
    .on_body = th_on_body,
    .on_body_end = th_on_body_end,
    .on_body_error = th_on_body_error,
    .on_proceed = th_on_proceed,
    .on_gone = th_on_gone,
};

/* ---- the listener ---------------------------------------------------------- */

static idem_config_t cfg;
static idem_gw_t gw;
static idem_handler_t handler;
static idem_listener_t listener;
static int lfd = -1;
static int port;

#define SMALL_BUF 16384

static void setup(void)
{
    /* As idemd does (main.c): a write to a client that reset is an error
     * the connection handles, not a signal that ends the process. */
    signal(SIGPIPE, SIG_IGN);
    memset(&H, 0, sizeof H);
    H.expect_client = -1;
    H.lag_at_proceed = -1;
    cr_assert_eq(idem__config_defaults(&cfg), 0);
    memset(&gw, 0, sizeof gw);
    gw.cfg = &cfg;
    cr_assert_eq(uv_loop_init(&loop), 0);
    char err[256];
    lfd = idem__listen_socket("127.0.0.1", 0, 128, "test", err, sizeof err);
    cr_assert_geq(lfd, 0, "%s", err);
    int sz = SMALL_BUF; /* accepted sockets inherit it */
    setsockopt(lfd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    port = ntohs(sa.sin_port);
    handler = (idem_handler_t){.ops = &th_ops, .body_max = 1u << 20};
    const idem_listen_limits_t limits = {
        .write_high = IDEM_CONN_WRITE_HIGH,
        .count_queued = true,
    };
    idem__listener_init(&listener, &gw, &loop, &handler, &limits);
    cr_assert_eq(idem__tcp_open_listener(&loop, &listener.tcp, &listener, lfd, 128,
                                         idem__conn_on_connection, "test", err, sizeof err),
                 0, "%s", err);
}

#define MAX_CLIENTS 8

typedef struct {
    int fd;
    bool reading;
    bool eof;
    char *in;
    size_t len, cap;
} client_t;

static client_t clients[MAX_CLIENTS];
static int n_clients;

static size_t client0_read(void) { return n_clients > 0 ? clients[0].len : 0; }

static void teardown(void)
{
    for (int i = 0; i < n_clients; i++) {
        if (clients[i].fd >= 0)
            close(clients[i].fd);
        free(clients[i].in);
    }
    n_clients = 0;
    idem__conns_close_all(&listener);
    idem__listener_close_handles(&listener);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_eq(H.live, 0, "every request was let go of and freed");
    cr_expect_eq(uv_loop_close(&loop), 0);
    close(lfd);
    idem__config_cleanup(&cfg);
    cr_expect_eq(atomic_load(&gw.metrics.connections), 0);
    cr_expect_eq(atomic_load(&gw.metrics.queued_bytes), 0);
}

TestSuite(conn, .init = setup, .fini = teardown, .timeout = 60);

/* ---- the clients ------------------------------------------------------------ */

static client_t *client_new(bool small_rcvbuf)
{
    cr_assert_lt(n_clients, MAX_CLIENTS);
    client_t *c = &clients[n_clients++];
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(c->fd, 0);
    if (small_rcvbuf) {
        int sz = SMALL_BUF;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    fcntl(c->fd, F_SETFL, O_NONBLOCK);
    c->reading = true;
    return c;
}

static void client_recv(client_t *c)
{
    while (c->reading && !c->eof && c->fd >= 0) {
        if (c->cap - c->len < 65536) {
            c->cap = c->cap ? c->cap * 2 : 1u << 17;
            c->in = realloc(c->in, c->cap);
            cr_assert_not_null(c->in);
        }
        ssize_t n = recv(c->fd, c->in + c->len, c->cap - c->len - 1, 0);
        if (n > 0) {
            c->len += (size_t)n;
            c->in[c->len] = '\0';
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            c->eof = true;
        } else {
            return;
        }
    }
}

/* One turn of the loop, then what the reading clients can read. */
static void pump(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
    for (int i = 0; i < n_clients; i++)
        client_recv(&clients[i]);
    tnet_loop_wait(&loop);
}

/* Turns of the loop for a while, for something that must not happen. */
static void pump_n(int n)
{
    for (int i = 0; i < n; i++)
        pump();
}

#define RUN_UNTIL(cond)                                                                      \
    TNET_RUN_UNTIL(cond, pump(), "hang waiting for: %s (events %s)", #cond, H.events)

static void client_send(client_t *c, const char *s, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(c->fd, s + off, n - off, MSG_NOSIGNAL);
        if (w > 0)
            off += (size_t)w;
        else {
            cr_assert(errno == EAGAIN, "send: %s", strerror(errno));
            pump();
        }
    }
}

static void client_puts(client_t *c, const char *s) { client_send(c, s, strlen(s)); }

/* ---- reading the answers ------------------------------------------------------ */

typedef struct {
    int status;
    bool has_length;
    uint64_t length;
    bool chunked;
    bool closes;         /* Connection: close */
    bool complete;       /* its framing says it is whole */
    bool last_chunk;
    char body[256];      /* the first bytes of the decoded body */
    size_t body_len;     /* decoded body bytes */
    size_t consumed;
} resp_t;

static const char *find(const char *p, size_t n, const char *s)
{
    return memmem(p, n, s, strlen(s));
}

static void body_add(resp_t *r, const char *p, size_t n)
{
    size_t room = sizeof r->body - 1 - (r->body_len < sizeof r->body ? r->body_len : sizeof r->body - 1);
    size_t k = n < room ? n : room;
    if (r->body_len < sizeof r->body - 1)
        memcpy(r->body + r->body_len, p, k);
    r->body_len += n;
    r->body[r->body_len < sizeof r->body - 1 ? r->body_len : sizeof r->body - 1] = '\0';
}

/* Parse the response at p[0..n).  head: it answers HEAD.  eof: nothing more
 * will come.  @return whether a head was there (r->complete says whether
 * its body is whole). */
static bool parse_resp(const char *p, size_t n, bool head, bool eof, resp_t *r)
{
    memset(r, 0, sizeof *r);
    const char *end = find(p, n, "\r\n\r\n");
    if (end == NULL)
        return false;
    size_t hl = (size_t)(end - p) + 4;
    cr_assert_eq(strncmp(p, "HTTP/1.1 ", 9), 0, "a status line: %.40s", p);
    r->status = (int)strtol(p + 9, NULL, 10);
    const char *cl = find(p, hl, "\r\nContent-Length: ");
    if (cl != NULL) {
        r->has_length = true;
        r->length = strtoull(cl + 18, NULL, 10);
    }
    r->chunked = find(p, hl, "\r\nTransfer-Encoding: chunked\r\n") != NULL;
    r->closes = find(p, hl, "\r\nConnection: close\r\n") != NULL;
    const char *b = p + hl;
    size_t bn = n - hl;
    if (head || r->status == 204 || r->status == 304 || r->status == 100) {
        r->complete = true;
        r->consumed = hl;
    } else if (r->chunked) {
        size_t off = 0;
        for (;;) {
            const char *le = find(b + off, bn - off, "\r\n");
            if (le == NULL)
                break;
            size_t sz = strtoul(b + off, NULL, 16);
            size_t at = (size_t)(le - b) + 2;
            if (sz == 0) {
                if (bn - at >= 2) {
                    r->last_chunk = true;
                    r->complete = true;
                    off = at + 2;
                }
                break;
            }
            if (bn - at < sz + 2)
                break;
            body_add(r, b + at, sz);
            off = at + sz + 2;
        }
        r->consumed = hl + off;
    } else if (r->has_length) {
        size_t k = bn < r->length ? bn : (size_t)r->length;
        body_add(r, b, k);
        r->complete = k == r->length;
        r->consumed = hl + k;
    } else {
        body_add(r, b, bn);
        r->complete = eof;
        r->consumed = n;
    }
    return true;
}

/* The responses of c, in order, as far as they are complete. */
static int responses(const client_t *c, const bool *head, resp_t *out, int max)
{
    size_t off = 0;
    int k = 0;
    while (k < max && off < c->len) {
        resp_t r;
        if (!parse_resp(c->in + off, c->len - off, head ? head[k] : false, c->eof, &r) ||
            !r.complete)
            break;
        out[k++] = r;
        off += r.consumed;
    }
    return k;
}

static int count_resp(const client_t *c, int max)
{
    resp_t r[8];
    return responses(c, NULL, r, max);
}

/* A new client sends req; once the connection has closed, its one answer
 * is parsed into r. */
static client_t *send_until_eof(const char *req, resp_t *r)
{
    client_t *c = client_new(false);
    client_puts(c, req);
    RUN_UNTIL(c->eof);
    cr_assert(parse_resp(c->in, c->len, false, true, r));
    return c;
}

/* A client (with a small receive buffer) that asks for /stream and reads
 * nothing, until the handler has been told to wait. */
static client_t *stream_told_to_wait(void)
{
    client_t *c = client_new(true);
    client_puts(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    c->reading = false;
    RUN_UNTIL(H.last != NULL && H.last->waits > 0);
    return c;
}

/* ---- the cases --------------------------------------------------------------- */

Test(conn, pipelined_requests_are_answered_in_order_one_at_a_time)
{
    client_t *c = client_new(false);
    client_puts(c, "GET /later/1 HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /later/2 HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /later/3 HTTP/1.1\r\nHost: x\r\n\r\n");
    RUN_UNTIL(count_resp(c, 3) == 3);
    resp_t r[3];
    cr_assert_eq(responses(c, NULL, r, 3), 3);
    for (int i = 0; i < 3; i++) {
        char want[16];
        snprintf(want, sizeof want, "later/%d", i + 1);
        cr_expect_str_eq(r[i].body, want);
        cr_expect(!r[i].closes);
    }
    /* Each head is handed over only once the answer before it is complete. */
    cr_expect_str_eq(H.events, "H/later/1;E/later/1;A/later/1;H/later/2;E/later/2;A/later/2;"
                               "H/later/3;E/later/3;A/later/3;");
    cr_expect(!c->eof, "the connection stays open");
    client_puts(c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n");
    RUN_UNTIL(count_resp(c, 4) == 4);
    cr_expect_eq(H.reentered, 0);
    cr_expect_eq(H.after_over, 0);
}

Test(conn, http10_unknown_length_is_close_delimited)
{
    resp_t r;
    send_until_eof("GET /eof HTTP/1.0\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect(!r.has_length && !r.chunked, "neither length nor chunks for HTTP/1.0");
    cr_expect_str_eq(r.body, "abcdef");
}

Test(conn, http10_known_length_has_content_length_and_closes)
{
    resp_t r;
    client_t *c = send_until_eof("GET /end/x HTTP/1.0\r\n\r\nGET /end/y HTTP/1.0\r\n\r\n", &r);
    cr_expect(r.has_length);
    cr_expect_eq(r.length, 5);
    cr_expect_str_eq(r.body, "end/x");
    cr_expect_eq(r.consumed, c->len, "one answer, then the close");
    cr_expect_eq(H.heads, 1);
}

Test(conn, unknown_length_to_http11_is_chunked_and_kept_alive)
{
    client_t *c = client_new(false);
    client_puts(c, "GET /eof HTTP/1.1\r\nHost: x\r\n\r\nGET /end/2 HTTP/1.1\r\nHost: x\r\n\r\n");
    RUN_UNTIL(count_resp(c, 2) == 2);
    resp_t r[2];
    responses(c, NULL, r, 2);
    cr_expect(r[0].chunked && !r[0].has_length);
    cr_expect(r[0].last_chunk);
    cr_expect_str_eq(r[0].body, "abcdef");
    cr_expect_str_eq(r[1].body, "end/2");
}

Test(conn, head_gets_no_body_but_keeps_content_length)
{
    client_t *c = client_new(false);
    client_puts(c, "HEAD /end/hello HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /end/2 HTTP/1.1\r\nHost: x\r\n\r\n"
                   "HEAD /eof HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /end/4 HTTP/1.1\r\nHost: x\r\n\r\n");
    const bool head[4] = {true, false, true, false};
    resp_t r[4];
    RUN_UNTIL(responses(c, head, r, 4) == 4);
    cr_expect(r[0].has_length);
    cr_expect_eq(r[0].length, 9);
    cr_expect_eq(r[0].body_len, 0);
    cr_expect_str_eq(r[1].body, "end/2", "the next answer starts right after the head");
    cr_expect(!r[2].chunked, "no chunks announced for a body that is not sent");
    cr_expect_str_eq(r[3].body, "end/4");
}

Test(conn, refusal_at_the_head_closes_and_its_body_is_never_a_request)
{
    const char *smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    char req[256];
    snprintf(req, sizeof req, "POST /close HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(smuggled), smuggled);
    resp_t r;
    client_t *c = send_until_eof(req, &r);
    cr_expect_eq(r.status, 413);
    cr_expect(r.closes);
    cr_expect_eq(r.consumed, c->len, "nothing follows the refusal");
    cr_expect_str_eq(H.events, "H/close;A/close;");
    cr_expect_eq(H.heads, 1);
}

Test(conn, body_pieces_arrive_in_order_and_the_end_once)
{
    client_t *c = client_new(false);
    client_puts(c, "POST /end/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n");
    RUN_UNTIL(H.body_len == 5);
    client_puts(c, "5\r\n worl\r\n");
    RUN_UNTIL(H.body_len == 10);
    client_puts(c, "1\r\nd\r\n0\r\n\r\n");
    RUN_UNTIL(count_resp(c, 1) == 1);
    cr_expect_eq(H.body_len, 11, "%zu %.*s events %s", H.body_len, (int)H.body_len, H.body, H.events);
    cr_expect_eq(memcmp(H.body, "hello world", 11), 0);
    cr_expect_geq(H.pieces, 3);
    cr_expect_str_eq(H.events, "H/end/b;E/end/b;A/end/b;", "one end, after every piece");
}

Test(conn, client_gone_mid_body_is_told_once_from_the_loop)
{
    client_t *c = client_new(false);
    client_puts(c, "POST /end/g HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
    RUN_UNTIL(H.body_len == 10);
    close(c->fd);
    c->fd = -1;
    RUN_UNTIL(H.gone == 1);
    pump_n(20);
    cr_expect_eq(H.gone, 1);
    cr_expect_str_eq(H.events, "H/end/g;G/end/g;");
    cr_expect_eq(H.reentered, 0);
    cr_expect_eq(H.after_over, 0);
}

Test(conn, client_reset_mid_stream_is_told_once_from_the_loop)
{
    client_t *c = stream_told_to_wait();
    /* An abortive close: the connection's next write fails. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(c->fd);
    c->fd = -1;
    RUN_UNTIL(H.gone == 1);
    pump_n(20);
    cr_expect_eq(H.gone, 1);
    cr_expect_eq(H.reentered, 0, "never called inside its own stream call");
    cr_expect_eq(H.after_over, 0);
}

Test(conn, a_send_the_client_does_not_read_waits_for_on_proceed)
{
    client_t *c = stream_told_to_wait();
    treq_t *q = H.last;
    size_t sent_at_wait = q->sent;
    /* The mark counts what is queued with its overhead (a write's buffer
     * capacity, up to twice its payload). */
    cr_expect_geq(sent_at_wait, IDEM_STREAM_HIGH_MARK / 4,
                  "told to wait at the high mark, not before: %zu", sent_at_wait);
    cr_expect_leq(sent_at_wait, IDEM_STREAM_HIGH_MARK + PIECE, "told to wait past the mark: %zu",
                  sent_at_wait);
    /* The client reads nothing: the queue cannot drain below half the mark,
     * so the handler must not be told to go on. */
    pump_n(50);
    cr_expect_eq(q->proceeds, 0, "on_proceed while the client read nothing (sent %zu)", q->sent);
    cr_expect_lt(q->sent, STREAM_TOTAL);
    c->reading = true;
    RUN_UNTIL(count_resp(c, 1) == 1);
    resp_t r;
    cr_assert(parse_resp(c->in, c->len, false, c->eof, &r));
    cr_expect(r.chunked && r.last_chunk);
    cr_expect_eq(r.body_len, STREAM_TOTAL);
    cr_expect_gt(H.proceeds, 0); /* q is freed: its answer ended */
    cr_expect_eq(H.reentered, 0);
}

Test(conn, on_proceed_comes_once_the_queue_is_under_half_the_mark)
{
    /* conn.h: "on_proceed comes once the client's queue is under half of
     * it [IDEM_STREAM_HIGH_MARK]".  Told to wait with about the mark
     * queued, the stream must not be told to go on after the client has
     * read only a piece: what the client has not read at on_proceed is at
     * most half the mark (counted with overhead, so less payload) plus the
     * sockets' small buffers. */
    client_t *c = stream_told_to_wait();
    treq_t *q = H.last;
    size_t sent_at_wait = q->sent;
    c->reading = true;
    RUN_UNTIL(H.proceeds > 0 || H.ended > 0);
    /* What idemd holds is under half the mark; the kernel's buffers of the
     * two sockets (kept small here) hold the rest of what is unread. */
    cr_expect_lt(H.lag_at_proceed, (long)(IDEM_STREAM_HIGH_MARK / 2 + 128 * 1024),
                 "on_proceed with %ld bytes not yet read (%zu sent at the wait)",
                 H.lag_at_proceed, sent_at_wait);
    RUN_UNTIL(count_resp(c, 1) == 1);
}

Test(conn, abort_with_a_length_shows_a_short_body_then_eof)
{
    resp_t r;
    send_until_eof("GET /abortlen HTTP/1.1\r\nHost: x\r\n\r\n", &r);
    cr_expect(r.has_length);
    cr_expect_eq(r.length, 1000);
    cr_expect_eq(r.body_len, 100);
    cr_expect(!r.complete);
}

Test(conn, abort_chunked_has_no_last_chunk_then_eof)
{
    resp_t r;
    send_until_eof("GET /abortchunk HTTP/1.1\r\nHost: x\r\n\r\n", &r);
    cr_expect(r.chunked);
    cr_expect(!r.last_chunk);
    cr_expect_str_eq(r.body, "abcabc");
}

Test(conn, continue_is_invited_only_after_on_expect_says_yes)
{
    client_t *c = client_new(false);
    H.expect_client = c->fd;
    client_puts(c, "POST /end/e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   "Expect: 100-continue\r\n\r\n");
    RUN_UNTIL(find(c->in ? c->in : "", c->len, "\r\n\r\n") != NULL);
    cr_expect_eq(H.expects, 1);
    cr_expect(!H.expect_saw_bytes, "nothing was sent before on_expect decided");
    cr_assert_eq(strncmp(c->in, "HTTP/1.1 100 Continue\r\n", 23), 0, "%s", c->in);
    size_t cont = (size_t)(find(c->in, c->len, "\r\n\r\n") - c->in) + 4;
    client_puts(c, "hello");
    RUN_UNTIL(c->len > cont && find(c->in + cont, c->len - cont, "end/e") != NULL);
    cr_expect_eq(memcmp(H.body, "hello", 5), 0);
    cr_expect_str_eq(H.events, "H/end/e;C/end/e;E/end/e;A/end/e;");
}

Test(conn, continue_is_not_sent_when_on_expect_refuses)
{
    client_t *c = client_new(false);
    H.expect_client = c->fd;
    client_puts(c, "POST /expectno HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   "Expect: 100-continue\r\n\r\n");
    RUN_UNTIL(c->eof);
    resp_t r;
    cr_assert(parse_resp(c->in, c->len, false, true, &r));
    cr_expect_eq(r.status, 417, "no 100 first: %s", c->in);
    cr_expect_eq(H.body_len, 0);
}

/* Pipelined behind an answer of BIG_TOTAL bytes its client does not read. */
static client_t *big_then_second(void)
{
    client_t *c = client_new(true);
    client_puts(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /end/second HTTP/1.1\r\nHost: x\r\n\r\n");
    c->reading = false;
    RUN_UNTIL(strstr(H.events, "A/big;") != NULL);
    pump_n(50);
    return c;
}

Test(conn, past_max_queued_bytes_the_next_request_waits_for_the_client)
{
    cfg.max_queued_bytes = 1;
    client_t *c = big_then_second();
    cr_expect_null(strstr(H.events, "H/end/second"),
                   "handed its next request while its answers wait: %s", H.events);
    c->reading = true;
    RUN_UNTIL(count_resp(c, 2) == 2);
    cr_expect_str_eq(H.events, "H/big;E/big;A/big;H/end/second;E/end/second;A/end/second;");
}

Test(conn, within_max_queued_bytes_the_next_request_goes_on)
{
    /* The control of the case above: the same connection under the default
     * cap is handed its next request although its client reads nothing. */
    client_t *c = big_then_second();
    RUN_UNTIL(strstr(H.events, "A/end/second;") != NULL);
    c->reading = true;
    RUN_UNTIL(count_resp(c, 2) == 2);
}
