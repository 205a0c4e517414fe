/* fuzz/fuzz_h2.c - libFuzzer target for idemd's HTTP/2 connections
 * (src/gateway/h2conn.c): frames in, decisions and bytes out, as
 * fuzz_request_path.c fuzzes the HTTP/1.1 request path.
 *
 * The input is what a client sends after a valid client preface and an
 * empty SETTINGS frame (both prepended here): any frames.  Its first byte
 * picks how the bytes arrive (in pieces of 1 to 255 bytes, or at once) and
 * how the test handler answers.  The connection runs over a real plain
 * transport (transport.c) on one end of a socketpair on a loop of the
 * target's own, no network; idem__h2conn_read gets the bytes, the carrier's
 * schedule is run as conn.c runs it, and what idemd writes is read from the
 * other end.  Properties checked beyond "no crash, no leak, no hang":
 *   - every stream handed to the handler as a request ends exactly once:
 *     its answer's last piece, or on_gone, never both, never a call after
 *     it; at the connection's end none is left;
 *   - a request's body is what its DATA frames carried, and on_body_end
 *     comes once, after every piece;
 *   - what idemd writes is its SETTINGS first, then whole frames of at most
 *     the default SETTINGS_MAX_FRAME_SIZE, and nothing after a GOAWAY but
 *     frames of streams it already took;
 *   - what the connection holds for its streams (idem__h2conn_pending) and
 *     what the transport queues stay bounded.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>
#include <uv.h>

#include "fuzz_check.h"
#include "gateway/config.h"
#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/h2conn.h"
#include "gateway/transport.h"
#include "idem/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ANSWER_PIECE 4096
#define MAX_REQS 512

/* ---- the test handler -------------------------------------------------------- */

typedef struct freq {
    idem_ostream_t *os;
    size_t body;         /* bytes of body received */
    size_t to_send;      /* answer bytes still to send */
    bool body_ended;     /* on_body_end came */
    bool ended;          /* its last piece was sent, or on_gone came */
    bool answering;
} freq_t;

static freq_t reqs[MAX_REQS];
static size_t n_reqs;
static unsigned mode; /* from the input's first byte */

static void answer_more(freq_t *r)
{
    while (!r->ended && r->to_send > 0) {
        static char piece[ANSWER_PIECE];
        size_t n = r->to_send < sizeof piece ? r->to_send : sizeof piece;
        memset(piece, 'a', n);
        r->to_send -= n;
        bool last = r->to_send == 0;
        if (last)
            r->ended = true; /* the connection calls it no more */
        if (!r->os->ops->send(r->os, piece, n, last))
            return; /* on_proceed follows (or it ended) */
    }
}

static void answer(freq_t *r, int status, size_t len)
{
    CHECK(!r->ended && !r->answering);
    r->answering = true;
    idem_http_field_t f = {{"content-type", 12}, {"text/plain", 10}};
    idem_http_response_t resp = {.status = status, .fields = &f, .n_fields = 1,
                                 .framing = IDEM_HTTP_BODY_LENGTH, .content_length = len};
    if (r->os->ops->start(r->os, &resp, 0) != 0) {
        r->os->ops->abort(r->os);
        r->ended = true;
        return;
    }
    if (len == 0) {
        r->ended = true;
        r->os->ops->send(r->os, NULL, 0, true);
        return;
    }
    r->to_send = len;
    answer_more(r);
}

static idem_hreq_t *h_on_head(idem_handler_t *hd, const idem_http_msg_t *m, const char *head,
                              size_t head_len, idem_ostream_t *os, const idem_conn_facts_t *facts)
{
    (void)hd;
    (void)head;
    CHECK(head_len > 0 && m->method.len > 0);
    CHECK(facts->proto != NULL && strcmp(facts->proto, "HTTP/2") == 0);
    if (n_reqs == MAX_REQS) {
        (void)idem__ostream_problem(os, 503, "overloaded", "fuzz", 0, NULL, IDEM_OS_CLOSE);
        return NULL;
    }
    freq_t *r = &reqs[n_reqs++];
    memset(r, 0, sizeof *r);
    r->os = os;
    /* Answered at once (a refusal), for one path in four. */
    if ((mode & 3) == 1 && m->target.len > 1 && m->target.ptr[1] == 'r') {
        r->ended = true;
        r->answering = true;
        (void)idem__ostream_problem(os, 409, "in-flight", "fuzz", 0, NULL, 0);
        return r;
    }
    return r;
}

static bool h_on_body(idem_hreq_t *hr, const char *p, size_t n)
{
    freq_t *r = hr;
    CHECK(!r->ended && !r->body_ended && n > 0 && p != NULL);
    r->body += n;
    if ((mode & 4) && r->body > 1000) {
        answer(r, 413, 10); /* refused: the rest of the body is dropped */
        return false;
    }
    return true;
}

static void h_on_body_end(idem_hreq_t *hr)
{
    freq_t *r = hr;
    CHECK(!r->ended && !r->body_ended);
    r->body_ended = true;
    if (r->answering)
        return;
    /* Large answers now and then, to meet flow control. */
    size_t len = (mode & 8) ? 70000 + r->body : r->body % 300;
    answer(r, 200, len);
}

static void h_on_body_error(idem_hreq_t *hr, int rc)
{
    freq_t *r = hr;
    (void)rc;
    CHECK(!r->ended && !r->answering);
    answer(r, 408, 5);
}

static void h_on_proceed(idem_hreq_t *hr)
{
    freq_t *r = hr;
    CHECK(!r->ended);
    answer_more(r);
}

static void h_on_gone(idem_hreq_t *hr)
{
    freq_t *r = hr;
    CHECK(!r->ended);
    r->ended = true;
}

static const idem_handler_ops_t ops = {
    .on_head = h_on_head,
    .on_body = h_on_body,
    .on_body_end = h_on_body_end,
    .on_body_error = h_on_body_error,
    .on_proceed = h_on_proceed,
    .on_gone = h_on_gone,
};

/* ---- the connection around it -------------------------------------------------- */

static uv_loop_t loop;
static idem_config_t cfg;
static idem_gw_t gw;
static idem_handler_t handler = {.ops = &ops};
static idem_listener_t listener;
static bool ready;
static bool scheduled;

static void on_sched(void *owner)
{
    (void)owner;
    scheduled = true;
}
static const idem_h2_carrier_t carrier = {.schedule = on_sched};

static void tr_read(void *d, const char *p, size_t n)
{
    (void)d;
    (void)p;
    (void)n;
}
static void tr_eof(void *d) { (void)d; }
static void tr_error(void *d, const char *reason)
{
    (void)d;
    (void)reason;
}
static const idem_transport_cbs_t tr_cbs = {.on_read = tr_read, .on_eof = tr_eof,
                                            .on_error = tr_error};

static void setup(void)
{
    CHECK(uv_loop_init(&loop) == 0);
    CHECK(idem__config_defaults(&cfg) == 0);
    cfg.http2 = true;
    gw.cfg = &cfg;
    listener.gw = &gw;
    listener.loop = &loop;
    listener.handler = &handler;
    listener.limits.write_high = IDEM_CONN_WRITE_HIGH;
    listener.limits.count_queued = true;
    listener.limits.http2 = true;
    ready = true;
}

/* What idemd wrote, checked as frames. */
typedef struct out {
    uint8_t buf[32 * 1024];
    size_t len;
    bool first; /* the first frame was seen */
    bool goaway;
    uint32_t last_id; /* GOAWAY's last stream id */
    size_t total;
} out_t;

static void check_frames(out_t *o)
{
    size_t off = 0;
    while (o->len - off >= 9) {
        const uint8_t *f = o->buf + off;
        size_t n = ((size_t)f[0] << 16) | ((size_t)f[1] << 8) | f[2];
        CHECK(n <= 16384); /* the default SETTINGS_MAX_FRAME_SIZE: we never raised it */
        if (o->len - off < 9 + n)
            break;
        uint8_t type = f[3];
        uint32_t id = (((uint32_t)f[5] & 0x7f) << 24) | ((uint32_t)f[6] << 16) |
                      ((uint32_t)f[7] << 8) | f[8];
        if (!o->first) {
            CHECK(type == 4 && id == 0); /* SETTINGS first */
            o->first = true;
        }
        CHECK(type <= 9);
        CHECK(type != 5); /* no PUSH_PROMISE, ever */
        if (type == 0 || type == 1 || type == 3)
            CHECK(id != 0 && (id & 1) == 1); /* on client streams only */
        if (o->goaway && (type == 0 || type == 1))
            CHECK(id <= o->last_id);
        if (type == 7) {
            CHECK(id == 0 && n >= 8);
            uint32_t last = (((uint32_t)f[9] & 0x7f) << 24) | ((uint32_t)f[10] << 16) |
                            ((uint32_t)f[11] << 8) | f[12];
            if (o->goaway)
                CHECK(last <= o->last_id); /* a later GOAWAY never raises it */
            o->goaway = true;
            o->last_id = last;
        }
        off += 9 + n;
    }
    memmove(o->buf, o->buf + off, o->len - off);
    o->len -= off;
}

static void drain(int fd, out_t *o)
{
    for (;;) {
        if (o->len == sizeof o->buf) {
            /* One frame larger than the buffer cannot be: it is checked. */
            check_frames(o);
            CHECK(o->len < sizeof o->buf);
        }
        ssize_t n = read(fd, o->buf + o->len, sizeof o->buf - o->len);
        if (n <= 0)
            return;
        o->len += (size_t)n;
        o->total += (size_t)n;
        check_frames(o);
    }
}

/* Run the loop until it has nothing to do at once; drain what was written. */
static void spin(int peer, out_t *o)
{
    for (int i = 0; i < 4; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        drain(peer, o);
    }
}

static int step(idem_h2conn_t *h, int rc, int peer, out_t *o)
{
    for (int round = 0; rc == IDEM_H2_GO_ON && round < 64; round++) {
        spin(peer, o);
        CHECK(idem__h2conn_pending(h) <= (size_t)n_reqs * (IDEM_STREAM_HIGH_MARK + ANSWER_PIECE));
        if (!scheduled)
            break;
        scheduled = false;
        rc = idem__h2conn_run(h);
    }
    return rc;
}

static void on_closed(idem_transport_t *t) { (void)t; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready)
        setup();
    if (size < 1)
        return 0;
    mode = data[0];
    size_t piece = data[0] >> 4 ? (size_t)(data[0] >> 4) * 16 - 15 : 0; /* 0: at once */
    data++;
    size--;
    n_reqs = 0;
    scheduled = false;

    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
    uv_tcp_t *tcp = calloc(1, sizeof *tcp);
    idem_transport_t *tr = calloc(1, sizeof *tr);
    CHECK(tcp && tr);
    CHECK(uv_tcp_init(&loop, tcp) == 0);
    CHECK(uv_tcp_open(tcp, sv[0]) == 0);
    idem__transport_init_plain(tr, &loop, tcp, &tr_cbs, NULL);
    idem_conn_facts_t facts = {.proto = "HTTP/1.1"};
    idem_h2conn_t *h = idem__h2conn_create(&listener, tr, &facts, &carrier, NULL);
    out_t *o = calloc(1, sizeof *o);
    CHECK(o != NULL);
    if (h != NULL) {
        static const char pre[] = IDEM_H2_PREFACE "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        int rc = idem__h2conn_read(h, pre, IDEM_H2_PREFACE_LEN + 9);
        rc = step(h, rc, sv[1], o);
        size_t off = 0;
        while (rc == IDEM_H2_GO_ON && off < size) {
            size_t n = piece == 0 || size - off < piece ? size - off : piece;
            rc = idem__h2conn_read(h, (const char *)data + off, n);
            off += n;
            rc = step(h, rc, sv[1], o);
        }
        if (rc == IDEM_H2_GO_ON) {
            /* The client's end: the streams already whole are answered. */
            idem__h2conn_eof(h);
            rc = step(h, idem__h2conn_run(h), sv[1], o);
        }
        idem__h2conn_destroy(h);
        for (size_t i = 0; i < n_reqs; i++)
            CHECK(reqs[i].ended); /* each ended once (the handler checks "once") */
    }
    idem__transport_close(tr, on_closed);
    close(sv[1]);
    uv_run(&loop, UV_RUN_DEFAULT);
    free(tr);
    free(tcp);
    free(o);
    return 0;
}
