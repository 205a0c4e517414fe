/* src/gateway/transport.c - a plain or TLS byte stream over a uv_tcp_t
 * (transport.h says what the owner sees).
 *
 * Plain: reads go to on_read as they come, writes are copied into one
 * uv_write each.  TLS: what the socket gives is fed to the session and
 * pump() reads plaintext out of it (driving the handshake on the way) until
 * the session wants more input, the owner stops reading, or the stream
 * ends; after every step of the session, flush() moves the ciphertext it
 * produced into one uv_write.  A write request remembers how much of the
 * owner's plaintext went into it, so on_written counts the owner's bytes
 * in either mode.
 *
 * Deferral: a function the owner calls never calls back.  What it finds is
 * noted (t->failed with t->reason; data held while reading was stopped)
 * and t->defer, an idle handle, runs it on the next loop turn: on_error,
 * the plain on_ready, and pump() for data held or a client's first flight.
 * Every callback is followed by a look at t->closing, so that an owner that
 * closed inside it gets no other.
 *
 * Memory: a socket read goes into one per-thread buffer of 64 KiB (used
 * only within the read callback), decrypted plaintext into another of
 * 16 KiB: an idle connection costs no read buffer.  What the session holds
 * is bounded by tls.c (IDEM_TLS_MAX_HELD); while reading is stopped, the
 * socket is not read, so at most one read's worth waits there.
 *
 * THREADING: the loop's thread only.
 */
#include "gateway/transport.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "idem/alloc.h"

#define READ_BUF 65536
#define PLAIN_BUF 16384

/* A write in flight: the bytes handed to uv_write live here. */
typedef struct wreq {
    uv_write_t req;
    idem_transport_t *t;
    size_t size;  /* of data */
    size_t plain; /* the owner's bytes in it, for on_written */
    char data[];
} wreq_t;

/* Plaintext written before the TLS handshake was done. */
struct idem_transport_held {
    struct idem_transport_held *next;
    size_t n;
    char data[];
};

static _Thread_local char read_buf[READ_BUF];
static _Thread_local char plain_buf[PLAIN_BUF];

static void pump(idem_transport_t *t);

/* ---- state -------------------------------------------------------------- */

static void update_reading(idem_transport_t *t);

static void on_defer(uv_idle_t *h);

static void defer_start(idem_transport_t *t)
{
    if (!t->closing)
        uv_idle_start(&t->defer, on_defer);
}

/* The stream failed: stop reading, and tell the owner from the loop. */
static void fail(idem_transport_t *t, const char *reason)
{
    if (t->failed || t->closing)
        return;
    t->failed = true;
    snprintf(t->reason, sizeof t->reason, "%s", reason && *reason ? reason : "error");
    update_reading(t);
    defer_start(t);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h, (void)suggested;
    *buf = uv_buf_init(read_buf, sizeof read_buf);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void update_reading(idem_transport_t *t)
{
    bool want = t->reading && !t->failed && !t->eof && !t->closing;
    if (want && !t->sock_reading) {
        int r = uv_read_start((uv_stream_t *)t->tcp, alloc_cb, read_cb);
        if (r != 0) {
            fail(t, uv_strerror(r));
            return;
        }
        t->sock_reading = true;
    } else if (!want && t->sock_reading) {
        uv_read_stop((uv_stream_t *)t->tcp);
        t->sock_reading = false;
    }
}

/* ---- writing ------------------------------------------------------------ */

static void write_cb(uv_write_t *req, int status)
{
    wreq_t *w = (wreq_t *)req;
    idem_transport_t *t = w->t;
    size_t plain = w->plain;
    t->queued -= sizeof *w + w->size;
    idem_free(w);
    if (t->closing)
        return;
    if (status < 0) {
        fail(t, uv_strerror(status));
        return;
    }
    if (plain && !t->failed && t->cbs->on_written)
        t->cbs->on_written(t->data, plain);
}

/* Hand w (filled) to the socket. */
static int send_wreq(idem_transport_t *t, wreq_t *w)
{
    w->t = t;
    uv_buf_t b = uv_buf_init(w->data, (unsigned)w->size);
    int r = uv_write(&w->req, (uv_stream_t *)t->tcp, &b, 1, write_cb);
    if (r != 0) {
        idem_free(w);
        fail(t, uv_strerror(r));
        return -1;
    }
    t->queued += sizeof *w + w->size;
    return 0;
}

/* Send the ciphertext the session has produced. */
static int flush(idem_transport_t *t)
{
    size_t n = idem__tls_pending(t->tls);
    if (n == 0 || t->closing)
        return 0;
    wreq_t *w = idem_malloc(sizeof *w + n);
    if (!w) {
        fail(t, "out of memory");
        return -1;
    }
    w->size = idem__tls_take(t->tls, w->data, n);
    w->plain = t->plain_acc;
    t->plain_acc = 0;
    return send_wreq(t, w);
}

/* Encrypt what the owner wrote before the handshake was done. */
static int flush_held(idem_transport_t *t)
{
    while (t->held) {
        struct idem_transport_held *h = t->held;
        int r = idem__tls_write(t->tls, h->data, h->n);
        if (r != 0) {
            fail(t, idem__tls_errstr(t->tls));
            return -1;
        }
        t->plain_acc += h->n;
        t->queued -= sizeof *h + h->n;
        t->held = h->next;
        idem_free(h);
    }
    t->held_tail = &t->held;
    return 0;
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    (void)req, (void)status; /* a FIN that could not go: the owner closes anyway */
}

static void do_shutdown(idem_transport_t *t)
{
    if (t->shutdown_sent || t->closing)
        return;
    t->shutdown_sent = true;
    if (t->tls && !t->failed) {
        if (idem__tls_shutdown(t->tls) != 0) {
            fail(t, idem__tls_errstr(t->tls));
        }
        flush(t);
    }
    /* After every queued write; an error here (not connected) is moot. */
    (void)uv_shutdown(&t->shutdown_req, (uv_stream_t *)t->tcp, shutdown_cb);
}

/* Pieces of one write up to this much in all are gathered into one TLS
 * record (the largest a record holds). */
#define TLS_GATHER_MAX (16 * 1024)

int idem__transport_write(idem_transport_t *t, const uv_buf_t *bufs, unsigned n)
{
    if (t->closing || t->failed || t->shutdown_wanted)
        return -1;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (total == 0)
        return 0;
    if (total > UINT_MAX / 2)
        return -1; /* one uv_buf_t must hold it (and its ciphertext) */
    if (t->tls && idem__tls_handshake_done(t->tls) && n > 1 && total <= TLS_GATHER_MAX) {
        /* Small pieces (a head, then its body) go as one TLS record, not
         * one each: a record costs its header, its tag and a cipher call. */
        char gather[TLS_GATHER_MAX];
        size_t off = 0;
        for (unsigned i = 0; i < n; i++) {
            memcpy(gather + off, bufs[i].base, bufs[i].len);
            off += bufs[i].len;
        }
        if (idem__tls_write(t->tls, gather, off) != 0) {
            fail(t, idem__tls_errstr(t->tls));
            return -1;
        }
        t->plain_acc += off;
        return flush(t);
    }
    if (t->tls && idem__tls_handshake_done(t->tls)) {
        for (unsigned i = 0; i < n; i++) {
            if (idem__tls_write(t->tls, bufs[i].base, bufs[i].len) != 0) {
                fail(t, idem__tls_errstr(t->tls));
                return -1;
            }
            t->plain_acc += bufs[i].len;
        }
        return flush(t);
    }
    char *dst;
    if (t->tls) {
        struct idem_transport_held *h = idem_malloc(sizeof *h + total);
        if (!h)
            return -1;
        h->next = NULL;
        h->n = total;
        *t->held_tail = h;
        t->held_tail = &h->next;
        t->queued += sizeof *h + total;
        dst = h->data;
    } else {
        wreq_t *w = idem_malloc(sizeof *w + total);
        if (!w)
            return -1;
        w->size = total;
        w->plain = total;
        dst = w->data;
        for (unsigned i = 0; i < n; i++) {
            memcpy(dst, bufs[i].base, bufs[i].len);
            dst += bufs[i].len;
        }
        return send_wreq(t, w);
    }
    for (unsigned i = 0; i < n; i++) {
        memcpy(dst, bufs[i].base, bufs[i].len);
        dst += bufs[i].len;
    }
    return 0;
}

size_t idem__transport_queued(const idem_transport_t *t)
{
    return t->queued;
}

void idem__transport_shutdown(idem_transport_t *t)
{
    if (t->closing || t->shutdown_wanted)
        return;
    t->shutdown_wanted = true;
    if (t->tls && !idem__tls_handshake_done(t->tls) && !t->failed)
        return; /* pump() does it once the handshake is done */
    do_shutdown(t);
}

/* ---- reading ------------------------------------------------------------ */

static void ready(idem_transport_t *t)
{
    if (t->ready)
        return;
    t->ready = true;
    if (t->cbs->on_ready)
        t->cbs->on_ready(t->data);
}

/* Read plaintext out of the session until it needs more input. */
static void pump(idem_transport_t *t)
{
    while (!t->closing && !t->failed && !t->eof) {
        bool was_done = idem__tls_handshake_done(t->tls);
        if (was_done && !t->reading)
            break;
        /* During the handshake, no plaintext: on_ready comes first, and may
         * stop the reading. */
        int n = idem__tls_read(t->tls, plain_buf, was_done ? sizeof plain_buf : 0);
        if (!was_done && idem__tls_handshake_done(t->tls)) {
            if (flush_held(t) != 0)
                break;
            if (t->shutdown_wanted)
                do_shutdown(t);
            if (flush(t) != 0)
                break;
            ready(t);
            continue;
        }
        if (n > 0) {
            if (flush(t) != 0) /* a key update answered, say */
                break;
            t->cbs->on_read(t->data, plain_buf, (size_t)n);
            continue;
        }
        if (n == 0)
            break;
        flush(t); /* the alert that says why, to the peer */
        if (n == IDEM_TLS_E_CLOSED) {
            t->eof = true;
            t->eof_clean = true;
            update_reading(t);
            t->cbs->on_eof(t->data);
        } else {
            fail(t, idem__tls_errstr(t->tls));
        }
        return;
    }
    if (!t->closing && !t->failed)
        flush(t);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    idem_transport_t *t = s->data;
    if (nread == 0 || t->closing)
        return;
    if (nread < 0) {
        if (nread != UV_EOF) {
            fail(t, uv_strerror((int)nread));
            return;
        }
        if (t->tls && !idem__tls_handshake_done(t->tls)) {
            fail(t, "the peer closed the connection during the TLS handshake");
            return;
        }
        /* What was held while reading was stopped comes before the end
         * (reading may have started again on this same loop turn). */
        if (t->tls) {
            pump(t);
            if (t->eof || t->failed || t->closing)
                return;
        }
        t->eof = true;
        t->eof_clean = !t->tls;
        update_reading(t);
        ready(t);
        if (!t->closing)
            t->cbs->on_eof(t->data);
        return;
    }
    if (!t->tls) {
        ready(t);
        if (!t->closing)
            t->cbs->on_read(t->data, buf->base, (size_t)nread);
        return;
    }
    if (idem__tls_feed(t->tls, buf->base, (size_t)nread) != 0) {
        fail(t, idem__tls_errstr(t->tls));
        return;
    }
    pump(t);
}

void idem__transport_read_start(idem_transport_t *t)
{
    if (t->closing || t->reading)
        return;
    t->reading = true;
    update_reading(t);
    if (t->tls)
        defer_start(t); /* what was held while stopped comes first */
}

void idem__transport_read_stop(idem_transport_t *t)
{
    t->reading = false;
    update_reading(t);
}

/* ---- the deferred steps ------------------------------------------------- */

static void on_defer(uv_idle_t *h)
{
    idem_transport_t *t = h->data;
    uv_idle_stop(h);
    if (t->closing)
        return;
    if (t->failed) {
        if (!t->error_sent) {
            t->error_sent = true;
            t->cbs->on_error(t->data, t->reason);
        }
        return;
    }
    if (!t->tls) {
        ready(t);
        return;
    }
    pump(t);
}

/* ---- life --------------------------------------------------------------- */

static int init(idem_transport_t *t, uv_loop_t *loop, uv_tcp_t *tcp, idem_tls_t *tls,
                const idem_transport_cbs_t *cbs, void *data)
{
    memset(t, 0, sizeof *t);
    t->loop = loop;
    t->tcp = tcp;
    t->tls = tls;
    t->cbs = cbs;
    t->data = data;
    t->held_tail = &t->held;
    tcp->data = t;
    uv_idle_init(loop, &t->defer); /* cannot fail */
    t->defer.data = t;
    defer_start(t); /* plain: on_ready; TLS: a client's first flight */
    return 0;
}

int idem__transport_init_plain(idem_transport_t *t, uv_loop_t *loop, uv_tcp_t *tcp,
                               const idem_transport_cbs_t *cbs, void *data)
{
    return init(t, loop, tcp, NULL, cbs, data);
}

int idem__transport_init_tls(idem_transport_t *t, uv_loop_t *loop, uv_tcp_t *tcp, idem_tls_t *tls,
                             const idem_transport_cbs_t *cbs, void *data)
{
    return init(t, loop, tcp, tls, cbs, data);
}

static void one_closed(uv_handle_t *h)
{
    idem_transport_t *t = h->data;
    if (--t->open_handles > 0)
        return;
    while (t->held) {
        struct idem_transport_held *next = t->held->next;
        t->queued -= sizeof *t->held + t->held->n;
        idem_free(t->held);
        t->held = next;
    }
    t->held_tail = &t->held;
    idem__tls_destroy(t->tls);
    t->tls = NULL;
    if (t->close_cb)
        t->close_cb(t);
}

void idem__transport_close(idem_transport_t *t, idem_transport_close_cb close_cb)
{
    if (t->closing)
        return;
    t->closing = true;
    t->close_cb = close_cb;
    t->open_handles = 2;
    uv_idle_stop(&t->defer);
    uv_close((uv_handle_t *)t->tcp, one_closed);
    uv_close((uv_handle_t *)&t->defer, one_closed);
}

idem_tls_t *idem__transport_tls(idem_transport_t *t)
{
    return t->tls;
}

bool idem__transport_eof_clean(const idem_transport_t *t)
{
    return t->eof && t->eof_clean;
}
