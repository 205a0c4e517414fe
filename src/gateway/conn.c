/* src/gateway/conn.c - idemd's HTTP/1.1 connections: accepting, reading,
 * parsing, timers, 100-continue, framing and writing the answers, and the
 * budgets a client holds, for every listener (the public ones of each
 * worker, the admin's).
 *
 * Each worker thread runs one uv_loop_t watching its own dup() of the one
 * listening socket main.c bound (whichever loop accepts first takes the
 * connection; no SO_REUSEPORT, so a second process cannot share the port).
 * A connection reads and parses one request head at a time (pipelined
 * requests wait in the read buffer) and hands it to its listener's handler
 * (handler.h) with an output stream of its own, feeds the handler the
 * decoded body, and writes what the request answers through the stream:
 * the head by src/http's writer, framed as this connection decides
 * (Content-Length, chunked, or a body its close delimits for an HTTP/1.0
 * client), and whether the connection stays open.  It never names what
 * answers (the proxy, the admin endpoints): a listener carries its handler.
 *
 * Calls go one way.  The connection calls its request only from the loop:
 * its read, write, timer and idle callbacks.  A stream function the request
 * calls never calls the request back and never frees anything the request
 * holds: a write that cannot be queued marks the connection broken, and the
 * listener's idle handle closes it on a later turn, telling the request
 * on_gone then.  Once an answer is complete, the next request pipelined
 * behind it is parsed from the loop too (the listener's parse_idle), never
 * on the stack of what answered it (a store job, the upstream); an answer
 * given inside one of the connection's own calls to the handler (a
 * refusal, a replay from on_body_end) lets the connection's own parsing
 * loop go on once that call has returned.
 *
 * What a client holds is bounded (docs/protocol.md section 11): each
 * connection has one timer, armed for what it waits for (conn_timer): a new
 * connection's first head, or a head once its first byte came
 * (header_timeout, never restarted by later bytes); the next byte of a body
 * (body_timeout); the next request on a keep-alive connection
 * (idle_timeout); a queue of answers that its client does not take
 * (body_timeout without progress); on an HTTP/2 connection, the earliest
 * of its streams' own limits (idem__h2conn_deadline).  max_connections counts connections
 * across workers, and a request whose client hung up keeps its connection's
 * place until it ends when its handler says requests outlive their clients
 * (it still holds an upstream connection).  max_queued_bytes counts what is
 * queued to every client of every worker, each write's overhead included:
 * past it, a connection whose answers still wait reads no further request,
 * and a streamed answer is asked to wait.  max_connections_per_address
 * bounds one client address.  The body budget (max_buffered_bytes) is the
 * handler's: it refuses a body piece it cannot hold.
 *
 * INVARIANTS: a connection carries at most one request (c->req), the one
 * being read or answered, and calls it only until it answered its last
 * byte or was told on_gone; an answer is framed once and either completes
 * or is cut where the client can see it.
 * THREADING: the loop thread of the connection's listener only; the budgets
 * shared by every loop are atomics (metrics) or a locked table (addrlimit).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/addrlimit.h"
#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/h2conn.h"
#include "gateway/problem.h"
#include "gateway/rbuf.h"
#include "gateway/request_plan.h"
#include "gateway/transport.h"
#include "idem/alloc.h"
#include "idem/clock.h"

#define READ_CHUNK (64 * 1024)
#define CONN_DRAIN_MS 2000      /* after an error answer, reading what the client still sends */
#define RBUF_PAUSE (256 * 1024) /* stop reading a busy connection past this much pipelined input */

/* CS_H2: an HTTP/2 connection; its h2conn.c does the rest. */
typedef enum { CS_HEAD, CS_BODY, CS_BUSY, CS_DRAIN, CS_CLOSED, CS_H2 } conn_state_t;

/* An answer of the connection's own (a refusal, a timeout): to no request
 * in particular, and the connection ends after it. */
static const idem_http_reply_t CLOSING_REPLY = {.version_minor = 1, .keep_alive = false};

/* What the connection's timer is waiting for. */
typedef enum {
    CT_NONE,  /* nothing: a request is being answered */
    CT_IDLE,  /* a keep-alive connection's next request (idle_timeout) */
    CT_HEAD,  /* the rest of a request head (header_timeout from its start) */
    CT_BODY,  /* the next byte of a request body (body_timeout) */
    CT_DRAIN, /* the end of draining after an error answer */
    CT_CLOSE, /* the end of a closing answer's time to be taken (close_linger_ms) */
    CT_QUEUE, /* answers its client does not take: progress within body_timeout */
    CT_H2,    /* the earliest time limit of an HTTP/2 connection's streams (h2_by) */
} conn_timer_t;

struct idem_conn {
    uv_tcp_t tcp;           /* first: a refused connection frees c as its handle */
    idem_transport_t tr;    /* the byte stream over tcp: plain, or TLS (transport.h) */
    idem_ostream_t os;      /* what its request answers through */
    idem_listener_t *l;     /* whose connection this is */
    idem_link_t link;       /* in l->conns, the most recently active last */
    idem_link_t parse_link; /* in l->parse_q while pipelined input waits to be parsed */
    idem_link_t gone_link;  /* in l->gone_q while it waits to be closed (broken) */
    idem_rbuf_t in;         /* unparsed input */
    idem_http_head_state_t hs;
    conn_state_t state;
    idem_http_body_t body;
    idem_hreq_t *req;       /* the request being read or answered; NULL once it ended its
                               answer or was told on_gone */
    idem_conn_facts_t facts;
    char cert_hex[65];      /* the verified client certificate's SHA-256, for facts */
    bool tls_ready;         /* a TLS connection's handshake is done */
    bool tls_counted;       /* its failed handshake is counted */
    struct sockaddr_storage peer; /* for max_connections_per_address */
    bool peer_counted;      /* the address holds a place in the per-address table */
    /* The request being answered, as its head said. */
    int version_minor;
    bool head_method;       /* HEAD: an answer without its body */
    bool req_keep_alive;    /* its version and Connection allow another request */
    /* The answer being written. */
    idem_buf_t out;         /* bytes framed and not yet handed to a write */
    bool answering;         /* started, not yet complete */
    bool ans_chunked;       /* the body goes in chunks */
    bool ans_nobody;        /* the body is not sent (HEAD, 204, 304) */
    bool ans_keep_alive;    /* the connection stays open after it */
    bool ans_drain;         /* a refusal: read and drop what follows, then close */
    bool want_proceed;      /* a send answered false: on_proceed once the queue drains */
    bool reading;
    bool close_after;       /* close once the queued writes are done */
    bool broken;            /* a write could not be queued: closed from the loop */
    size_t queued;          /* what its transport holds for writing, overhead included, as
                               last counted in max_queued_bytes (conn_sync_queued) */
    int closes;             /* handles (tcp, timer) whose close callback is pending */
    bool processing;        /* inside conn_process: answers made now loop, not recurse */
    bool peer_eof;          /* the client half-closed after its request: answer, then close */
    bool write_blocked;     /* its answers are not taken: parsing waits */
    bool answered;          /* the request being handed over was answered already */
    bool slot_moved;        /* its max_connections place went to the request that outlived it */
    conn_timer_t waiting;   /* what timer is armed for */
    uv_timer_t timer;
    bool h2_possible;       /* HTTP/2 with prior knowledge may still begin (plain, http2) */
    idem_h2conn_t *h2;      /* CS_H2: the HTTP/2 connection it carries */
    int64_t h2_by;          /* CT_H2: when (idem__h2conn_deadline) */
};

static void conn_drain(idem_conn_t *c);
static void conn_timer(idem_conn_t *c, conn_timer_t what);
static void conn_slot_give(idem_listener_t *l);
static void conn_process(idem_conn_t *c);
static void conn_start_reading(idem_conn_t *c);
static void conn_close(idem_conn_t *c);
static void conn_schedule_parse(idem_conn_t *c);
static void conn_response_done(idem_conn_t *c);
static void conn_stop_reading(idem_conn_t *c);
static void conn_h2_result(idem_conn_t *c, int rc);
static void conn_h2_start(idem_conn_t *c);

static const idem_ostream_ops_t conn_os_ops;

static idem_conn_t *conn_of(idem_ostream_t *os) { return IDEM_CONTAINER(os, idem_conn_t, os); }

/* ---- max_queued_bytes ------------------------------------------------------- */

static bool queued_over_cap(const idem_listener_t *l)
{
    if (!l->limits.count_queued)
        return false;
    return atomic_load_explicit(&l->gw->metrics.queued_bytes, memory_order_relaxed) >
           l->gw->cfg->max_queued_bytes;
}

/* Whether c's client takes its answers too slowly for another request to
 * be read now: its own queue is past write_high, or answers wait on it
 * while every client's together are past max_queued_bytes. */
static bool conn_lagging(const idem_conn_t *c)
{
    return c->queued > c->l->limits.write_high || (c->queued > 0 && queued_over_cap(c->l));
}

/* Whether c's client has taken enough that a waiting request or stream may
 * go on. */
static bool conn_caught_up(const idem_conn_t *c)
{
    return c->queued == 0 ||
           (c->queued < c->l->limits.write_high / 2 && !queued_over_cap(c->l));
}

/* ---- writing to a client ---------------------------------------------- */

/* The request is told no more: from here on the connection never calls it,
 * and it never touches the stream. */
static idem_hreq_t *conn_detach(idem_conn_t *c)
{
    idem_hreq_t *r = c->req;
    c->req = NULL;
    c->want_proceed = false;
    return r;
}

/* A write could not be queued: the client is gone for us.  Closed from the
 * loop (the listener's idle), so that whoever is on the stack (a request
 * answering) is never called back from inside its own call. */
static void conn_break(idem_conn_t *c)
{
    if (c->broken || c->state == CS_CLOSED)
        return;
    c->broken = true;
    idem__buf_cleanup(&c->out);
    idem_list_remove(&c->gone_link);
    idem_list_push(&c->l->gone_q, &c->gone_link);
    conn_schedule_parse(c); /* starts the idle that closes it */
}

/* Count again what c's transport holds for writing, in c->queued and in
 * max_queued_bytes. */
static void conn_sync_queued(idem_conn_t *c)
{
    size_t now = c->state == CS_CLOSED ? 0 : idem__transport_queued(&c->tr);
    if (c->l->limits.count_queued && now != c->queued) {
        if (now > c->queued)
            atomic_fetch_add(&c->l->gw->metrics.queued_bytes, now - c->queued);
        else
            atomic_fetch_sub(&c->l->gw->metrics.queued_bytes, c->queued - now);
    }
    c->queued = now;
}

/* The transport handed some of what was written to the kernel. */
static void on_tr_written(void *data, size_t n)
{
    idem_conn_t *c = data;
    (void)n;
    conn_sync_queued(c);
    if (c->state == CS_CLOSED)
        return;
    if (c->state == CS_H2) {
        if (c->waiting == CT_QUEUE)
            conn_timer(c, CT_QUEUE); /* progress: another body_timeout */
        if (c->close_after) {
            if (c->queued == 0)
                conn_close(c);
            return;
        }
        conn_h2_result(c, idem__h2conn_run(c->h2));
        return;
    }
    if (c->waiting == CT_QUEUE)
        conn_timer(c, CT_QUEUE); /* progress: another body_timeout */
    if (c->want_proceed && c->req &&
        (c->queued == 0 || (c->queued < IDEM_STREAM_HIGH_MARK / 2 && !queued_over_cap(c->l)))) {
        c->want_proceed = false;
        if (c->waiting == CT_QUEUE && c->state == CS_BUSY)
            conn_timer(c, CT_NONE);
        c->l->handler->ops->on_proceed(c->req);
        if (c->state == CS_CLOSED)
            return;
    }
    if (c->close_after && c->queued == 0) {
        conn_close(c);
        return;
    }
    if (c->write_blocked && conn_caught_up(c) && c->state == CS_HEAD) {
        c->write_blocked = false;
        conn_timer(c, c->in.len > 0 ? CT_HEAD : CT_IDLE);
        if (!c->peer_eof)
            conn_start_reading(c);
        conn_process(c);
    }
}

/* Hand what c->out holds to the transport.  @return false when it could
 * not be queued (the connection is then broken). */
static bool conn_flush(idem_conn_t *c)
{
    if (c->out.len == 0)
        return true;
    if (c->broken || c->state == CS_CLOSED) {
        idem__buf_reset(&c->out);
        return false;
    }
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    int rc = idem__transport_write(&c->tr, &b, 1);
    /* A large answer's buffer is not kept for the next one. */
    if (c->out.cap > 64 * 1024)
        idem__buf_cleanup(&c->out);
    else
        idem__buf_reset(&c->out);
    if (rc != 0) {
        conn_break(c);
        return false;
    }
    conn_sync_queued(c);
    return true;
}

/* Queue bytes of the connection's own (a refusal, 100 Continue). */
static void conn_write_own(idem_conn_t *c, const idem_buf_t *b)
{
    if (idem__buf_append(&c->out, b->data, b->len) != 0) {
        conn_break(c);
        return;
    }
    conn_flush(c);
}

/* ---- the output stream (handler.h) ------------------------------------------ */

static int os_start(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags)
{
    idem_conn_t *c = conn_of(os);
    bool close = (flags & IDEM_OS_CLOSE) != 0;
    idem_http_reply_t to = {
        .version_minor = c->version_minor,
        .head = c->head_method,
        /* An answer before the body was read ends the connection: no later
         * request can be told from the rest of that body. */
        .keep_alive = c->req_keep_alive && !close && !c->l->stopping && c->state != CS_BODY,
    };
    idem_http_response_t h = *r;
    bool bodiless = idem__http_status_bodiless(r->status);
    if (h.framing == IDEM_HTTP_BODY_EOF) {
        if (bodiless || to.head) {
            h.framing = IDEM_HTTP_BODY_NONE;
        } else if (c->version_minor >= 1) {
            h.framing = IDEM_HTTP_BODY_CHUNKED;
        } else {
            to.keep_alive = false; /* an HTTP/1.0 client: the close ends the body */
        }
    }
    if (c->broken || c->state == CS_CLOSED) {
        c->answering = true; /* nothing goes out; on_gone follows from the loop */
        c->ans_nobody = true;
        return 0;
    }
    if (idem__http_write_head(&c->out, &h, to) != 0)
        return -1; /* nothing was written */
    c->answering = true;
    c->ans_chunked = h.framing == IDEM_HTTP_BODY_CHUNKED;
    c->ans_nobody = to.head || bodiless || h.framing == IDEM_HTTP_BODY_NONE;
    c->ans_keep_alive = to.keep_alive;
    c->ans_drain = close;
    return 0;
}

static bool os_send(idem_ostream_t *os, const void *p, size_t n, bool final)
{
    idem_conn_t *c = conn_of(os);
    if (!c->answering)
        return false;
    if (!c->broken && c->state != CS_CLOSED && n > 0 && !c->ans_nobody) {
        int rc = c->ans_chunked ? idem__http_write_chunk(&c->out, p, n)
                                : idem__buf_append(&c->out, p, n);
        if (rc != 0) {
            /* Out of memory: a piece left out would corrupt the body, so
             * the client sees the connection end instead. */
            conn_break(c);
        }
    }
    if (final && c->ans_chunked && !c->broken && idem__http_write_last_chunk(&c->out) != 0)
        conn_break(c);
    conn_flush(c);
    if (final) {
        conn_response_done(c);
        return false;
    }
    if (c->broken || c->state == CS_CLOSED)
        return false;
    if (c->queued > IDEM_STREAM_HIGH_MARK || queued_over_cap(c->l)) {
        c->want_proceed = true;
        /* A client that takes nothing more is closed after body_timeout
         * without progress (each write done re-arms it). */
        if (c->waiting == CT_NONE)
            conn_timer(c, CT_QUEUE);
        return false;
    }
    return true;
}

static void os_abort(idem_ostream_t *os)
{
    idem_conn_t *c = conn_of(os);
    conn_detach(c);
    c->answering = false;
    if (c->state == CS_CLOSED)
        return;
    /* What was framed goes out, then the close: the client sees the cut,
     * never a short body that looks whole. */
    conn_flush(c);
    c->close_after = true;
    conn_stop_reading(c);
    if (c->queued == 0 && !c->broken)
        conn_close(c);
    else if (!c->broken)
        conn_timer(c, CT_QUEUE);
}

static const idem_ostream_ops_t conn_os_ops = {
    .start = os_start,
    .send = os_send,
    .abort = os_abort,
};

/* ---- HTTP/2 (h2conn.h) ------------------------------------------------------ */

static void conn_h2_schedule(void *owner) { conn_schedule_parse(owner); }

static const idem_h2_carrier_t conn_h2_carrier = {.schedule = conn_h2_schedule};

/* What an idem__h2conn_* call said of c: go on, end once what is queued is
 * written, or close now.  Its timer waits for idle_timeout while no stream
 * is open; a client that takes nothing of a full queue is not read. */
static void conn_h2_result(idem_conn_t *c, int rc)
{
    if (c->state != CS_H2)
        return;
    if (rc == IDEM_H2_FAIL) {
        conn_close(c);
        return;
    }
    conn_sync_queued(c);
    if (rc == IDEM_H2_END) {
        c->close_after = true;
        conn_stop_reading(c);
        if (c->queued == 0)
            conn_close(c);
        else
            conn_timer(c, CT_QUEUE);
        return;
    }
    if (c->queued > c->l->limits.write_high) {
        conn_stop_reading(c);
        if (c->waiting != CT_QUEUE)
            conn_timer(c, CT_QUEUE);
        return;
    }
    if (!c->peer_eof && c->queued < c->l->limits.write_high / 2)
        conn_start_reading(c);
    if (idem__h2conn_idle(c->h2)) {
        if (c->waiting != CT_IDLE)
            conn_timer(c, CT_IDLE);
        return;
    }
    /* Streams open: the earliest of their time limits (header_timeout,
     * body_timeout), or none while they are being answered. */
    int64_t by = idem__h2conn_deadline(c->h2);
    if (by == 0) {
        if (c->waiting != CT_NONE)
            conn_timer(c, CT_NONE);
    } else if (c->waiting != CT_H2 || c->h2_by != by) {
        c->h2_by = by;
        conn_timer(c, CT_H2);
    }
}

/* c speaks HTTP/2 from here on: what it read so far (the preface, and
 * whatever followed) goes to its h2conn. */
static void conn_h2_start(idem_conn_t *c)
{
    c->h2_possible = false;
    c->h2 = idem__h2conn_create(c->l, &c->tr, &c->facts, &conn_h2_carrier, c);
    if (c->h2 == NULL) {
        conn_close(c);
        return;
    }
    c->state = CS_H2;
    int rc = IDEM_H2_GO_ON;
    if (c->in.len > 0)
        rc = idem__h2conn_read(c->h2, c->in.data, c->in.len);
    else
        rc = idem__h2conn_run(c->h2);
    idem_rbuf_cleanup(&c->in);
    conn_timer(c, CT_NONE);
    conn_h2_result(c, rc);
}

/* ---- connections --------------------------------------------------------- */

static void conn_freed_part(idem_conn_t *c)
{
    /* Two parts (the transport with its tcp, the timer) close; free on the second. */
    if (--c->closes > 0)
        return;
    idem_listener_t *l = c->l;
    if (!c->slot_moved)
        conn_slot_give(l);
    if (c->peer_counted)
        idem__addrlimit_give(l->gw->addrlimit, (const struct sockaddr *)&c->peer);
    idem_rbuf_cleanup(&c->in);
    idem__buf_cleanup(&c->out);
    idem_free(c);
    if (l->on_conn_freed != NULL)
        l->on_conn_freed(l);
}

static void on_timer_closed(uv_handle_t *h) { conn_freed_part(h->data); }

static void on_tr_closed(idem_transport_t *t) { conn_freed_part(t->data); }

/* Close c now.  Called only from the loop (never inside a stream function
 * while the request is still attached): a request still carried is told
 * on_gone and goes on without its client. */
static void conn_close(idem_conn_t *c)
{
    if (c->state == CS_CLOSED)
        return;
    if (c->l->tls != NULL && !c->tls_ready && c->state != CS_CLOSED && !c->tls_counted) {
        c->tls_counted = true; /* timed out or left mid-handshake */
        atomic_fetch_add_explicit(&c->l->gw->metrics.tls_handshake_failures, 1,
                                  memory_order_relaxed);
    }
    c->state = CS_CLOSED;
    idem_list_remove(&c->link);
    idem_list_remove(&c->parse_link);
    idem_list_remove(&c->gone_link);
    uv_timer_stop(&c->timer);
    c->closes = 2;
    idem__transport_close(&c->tr, on_tr_closed);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
    conn_sync_queued(c); /* nothing of it counts any more */
    if (c->h2 != NULL) {
        /* Its streams' requests are told on_gone there. */
        idem_h2conn_t *h2 = c->h2;
        c->h2 = NULL;
        idem__h2conn_destroy(h2);
    }
    idem_hreq_t *r = conn_detach(c);
    if (r != NULL) {
        /* The request may outlive its client (its outcome is still
         * stored); it then keeps this connection's place in
         * max_connections until it ends. */
        if (c->l->handler->request_outlives)
            c->slot_moved = true;
        c->l->handler->ops->on_gone(r);
    }
}

static void conn_refused_count(idem_conn_t *c, int outcome)
{
    const idem_handler_t *h = c->l->handler;
    if (h->ops->on_refused != NULL)
        h->ops->on_refused(c->l->handler, outcome, &c->facts);
}

/* Answer with an error of the connection's own and close (drained).  No
 * request is attached (the head did not parse, or timed out). */
static void conn_fail(idem_conn_t *c, int status, const char *type, const char *detail,
                      int64_t retry_after)
{
    idem_buf_t out;
    idem__buf_init(&out, 0);
    /* Out of memory: nothing at all, rather than half an answer; the drain
     * still ends the connection. */
    if (idem__problem_respond(&out, status, type, detail, retry_after,
                              c->l->handler->problem_link, CLOSING_REPLY) == 0)
        conn_write_own(c, &out);
    idem__buf_cleanup(&out);
    conn_drain(c);
}

static void on_conn_timer(uv_timer_t *t)
{
    idem_conn_t *c = t->data;
    if (c->state == CS_CLOSED)
        return;
    if (c->waiting == CT_CLOSE || c->waiting == CT_QUEUE) {
        conn_close(c); /* answers its client does not take */
        return;
    }
    if (c->state == CS_BUSY)
        return;
    if (c->waiting == CT_H2 && c->state == CS_H2) {
        c->waiting = CT_NONE;
        conn_h2_result(c, idem__h2conn_expire(c->h2));
        return;
    }
    if (c->waiting == CT_HEAD && c->state == CS_HEAD && c->in.len > 0) {
        /* A head begun and not finished in time: the client hears why. */
        conn_refused_count(c, IDEM_OUT_REQUEST_TIMEOUT);
        conn_fail(c, 408, "request-timeout",
                  "the request head did not arrive within header_timeout", 0);
        return;
    }
    if (c->waiting == CT_BODY && c->state == CS_BODY && c->req) {
        c->l->handler->ops->on_body_error(c->req, IDEM_CONN_E_BODY_TIMEOUT);
        if (c->req != NULL) { /* it did not end its answer: end it here */
            conn_detach(c);
            conn_drain(c);
        }
        return;
    }
    /* Idle keep-alive, a new connection that sent nothing, or the end of
     * draining after an error: closed without a word (RFC 9112 9.5). */
    conn_close(c);
}

/* Arm the connection's one timer for what it now waits for (see CT_*). */
static void conn_timer(idem_conn_t *c, conn_timer_t what)
{
    const idem_config_t *cfg = c->l->gw->cfg;
    int64_t ms;
    switch (what) {
    case CT_IDLE: ms = cfg->idle_timeout_ms; break;
    case CT_HEAD: ms = cfg->header_timeout_ms; break;
    case CT_BODY: ms = cfg->body_timeout_ms; break;
    case CT_QUEUE: ms = cfg->body_timeout_ms; break;
    case CT_DRAIN: ms = CONN_DRAIN_MS; break;
    case CT_CLOSE: ms = c->l->limits.close_linger_ms; break;
    case CT_H2: {
        int64_t now = (int64_t)(idem_clock_mono_ns() / 1000000);
        ms = c->h2_by > now ? c->h2_by - now : 0;
        break;
    }
    default:
        c->waiting = CT_NONE;
        uv_timer_stop(&c->timer);
        return;
    }
    c->waiting = what;
    uv_timer_start(&c->timer, on_conn_timer, (uint64_t)ms, 0);
}

static void conn_stop_reading(idem_conn_t *c)
{
    if (c->reading) {
        idem__transport_read_stop(&c->tr);
        c->reading = false;
    }
}

static void on_tr_read(void *data, const char *p, size_t n)
{
    idem_conn_t *c = data;
    if (n == 0 || c->state == CS_DRAIN || c->state == CS_CLOSED)
        return; /* draining: read and dropped */
    if (c->state == CS_H2) {
        conn_h2_result(c, idem__h2conn_read(c->h2, p, n));
        return;
    }
    while (c->in.cap - c->in.len < n) {
        uv_buf_t room;
        idem_rbuf_alloc(&c->in, n > READ_CHUNK ? n : READ_CHUNK, &room);
        if (room.base == NULL) {
            conn_close(c); /* out of memory: from the loop */
            return;
        }
    }
    memcpy(c->in.data + c->in.len, p, n);
    c->in.len += n;
    if (c->state == CS_BUSY || c->write_blocked) {
        /* Pipelined input waits for the current answer.  Reading goes on
         * (stopping and restarting costs two epoll_ctl calls per request)
         * until a bound. */
        if (c->in.len >= RBUF_PAUSE)
            conn_stop_reading(c);
        return;
    }
    /* Each byte of a body restarts body_timeout; a head's deadline is set
     * by its first byte (conn_process_loop) and no later one moves it. */
    if (c->state == CS_BODY)
        conn_timer(c, CT_BODY);
    conn_process(c);
}

static void on_tr_eof(void *data)
{
    idem_conn_t *c = data;
    if (c->state == CS_DRAIN || c->state == CS_CLOSED) {
        if (c->state == CS_DRAIN)
            conn_close(c);
        return;
    }
    if (c->state == CS_H2) {
        /* Streams already whole are still answered. */
        c->peer_eof = true;
        conn_stop_reading(c);
        idem__h2conn_eof(c->h2);
        conn_h2_result(c, idem__h2conn_run(c->h2));
        return;
    }
    if (c->state == CS_BUSY || c->write_blocked || (c->state == CS_HEAD && c->in.len > 0) ||
        c->close_after) {
        /* A client may half-close once its request is sent: it still gets
         * its answer (and those of what it pipelined before). */
        c->peer_eof = true;
        conn_stop_reading(c);
        if (c->state == CS_HEAD && !c->write_blocked && !c->close_after)
            conn_process(c);
        return;
    }
    /* The client is gone: a request still being answered keeps running. */
    conn_close(c);
}

#define TLS_REFUSAL_LOG_MS 10000 /* at most one line about refused handshakes this often */

/* A handshake refused (a client certificate that does not verify, a
 * protocol idemd does not speak, garbage): the client saw the alert, and
 * the operator gets one line naming the reason, at most every
 * TLS_REFUSAL_LOG_MS per listener with the count of those not logged, so
 * that a flood of bad handshakes cannot flood the log. */
static void conn_log_tls_refusal(idem_conn_t *c, const char *reason)
{
    idem_listener_t *l = c->l;
    int64_t now = idem_clock_mono_ns() / 1000000;
    if (l->tls_log_ms != 0 && now - l->tls_log_ms < TLS_REFUSAL_LOG_MS) {
        l->tls_unlogged++;
        return;
    }
    char addr[INET6_ADDRSTRLEN] = "?";
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            uv_ip4_name((struct sockaddr_in *)&ss, addr, sizeof addr);
        else if (ss.ss_family == AF_INET6)
            uv_ip6_name((struct sockaddr_in6 *)&ss, addr, sizeof addr);
    }
    if (l->log != NULL) {
        char line[400];
        snprintf(line, sizeof line, "listen_tls: handshake with %s refused: %s (%llu more not logged)",
                 addr, reason, (unsigned long long)l->tls_unlogged);
        l->log(l, "warn", line);
    }
    l->tls_log_ms = now;
    l->tls_unlogged = 0;
}

static void on_tr_error(void *data, const char *reason)
{
    idem_conn_t *c = data;
    if (c->l->tls != NULL && !c->tls_ready)
        conn_log_tls_refusal(c, reason);
    conn_close(c); /* counted there when the handshake was not done */
}

/* A TLS handshake is done: the verified client certificate, if any, is a
 * fact its requests may use (the scope source client_cert). */
static void on_tr_ready(void *data)
{
    idem_conn_t *c = data;
    idem_tls_t *tls = idem__transport_tls(&c->tr);
    if (tls == NULL)
        return;
    c->tls_ready = true;
    atomic_fetch_add_explicit(&c->l->gw->metrics.tls_handshakes, 1, memory_order_relaxed);
    if (idem__tls_peer_cert_sha256_hex(tls, c->cert_hex))
        c->facts.client_cert_sha256 = c->cert_hex;
    const char *alpn = idem__tls_alpn(tls);
    if (c->l->limits.http2 && alpn != NULL && strcmp(alpn, "h2") == 0)
        conn_h2_start(c); /* ALPN chose HTTP/2 */
}

static const idem_transport_cbs_t conn_tr_cbs = {
    .on_ready = on_tr_ready,
    .on_read = on_tr_read,
    .on_eof = on_tr_eof,
    .on_error = on_tr_error,
    .on_written = on_tr_written,
};

static void conn_start_reading(idem_conn_t *c)
{
    if (!c->reading && c->state != CS_CLOSED && !c->broken) {
        idem__transport_read_start(&c->tr);
        c->reading = true;
    }
}

/* The close callback of a handle allocated alone (idem_malloc). */
static void on_handle_closed_free(uv_handle_t *h) { idem_free(h); }

/* Take no more requests on c: send FIN once what is queued is out, and read
 * (and drop) what the client may still be sending for a while, so that it
 * sees its answer rather than a reset; then close. */
static void conn_drain(idem_conn_t *c)
{
    if (c->state == CS_CLOSED || c->state == CS_DRAIN)
        return;
    c->state = CS_DRAIN;
    c->in.len = 0;
    if (c->broken)
        return; /* closing from the loop already */
    idem__transport_shutdown(&c->tr);
    conn_start_reading(c);
    conn_timer(c, CT_DRAIN);
}

/* The answer of c's request is complete (its last byte is queued, or there
 * was no one to send it to): the request is told no more; read the next
 * request, or end the connection.  Runs inside the request's call, so it
 * calls no request and parses nothing: a pipelined request waits for the
 * loop (or for conn_process's own loop when that is what is on the stack). */
static void conn_response_done(idem_conn_t *c)
{
    conn_detach(c);
    c->answering = false;
    c->answered = true;
    if (c->state == CS_CLOSED || c->broken)
        return;
    if (c->ans_drain || c->state == CS_BODY) {
        /* A refusal, or an answer before the body was read: the body may
         * follow anyway, so no later request can be told from it. */
        conn_drain(c);
        return;
    }
    if (!c->ans_keep_alive || c->l->stopping || (c->peer_eof && c->in.len == 0)) {
        c->close_after = true;
        conn_stop_reading(c);
        if (c->queued == 0)
            conn_close(c); /* no request is attached: nothing is called */
        else
            conn_timer(c, c->l->limits.close_linger_ms > 0 ? CT_CLOSE : CT_QUEUE);
        return;
    }
    c->state = CS_HEAD;
    if (conn_lagging(c)) {
        /* Its client does not take its answers: the next request waits
         * until it does, and the connection ends if it never does. */
        c->write_blocked = true;
        conn_stop_reading(c);
        conn_timer(c, CT_QUEUE);
        return;
    }
    conn_timer(c, c->in.len > 0 ? CT_HEAD : CT_IDLE);
    /* After a half-close, requests already received are still answered. */
    if (!c->peer_eof)
        conn_start_reading(c);
    if (c->in.len > 0 && !c->processing)
        conn_schedule_parse(c);
}

/* Invite c's client to send its body: 100 Continue. */
static void conn_write_continue(idem_conn_t *c)
{
    idem_buf_t out;
    idem__buf_init(&out, 0);
    idem_http_response_t r = {.status = 100};
    if (idem__http_write_head(&out, &r, CLOSING_REPLY) == 0)
        conn_write_own(c, &out);
    else
        conn_break(c);
    idem__buf_cleanup(&out);
}

/* Parse and collect as much of the current request as the buffer holds. */
static void conn_process_loop(idem_conn_t *c);

static void conn_process(idem_conn_t *c)
{
    if (c->processing || c->broken)
        return;
    c->processing = true;
    conn_process_loop(c);
    c->processing = false;
}

/* From the loop: close the broken connections, then parse what waits in
 * those whose answer went out with pipelined input behind it.  Only that
 * snapshot: a connection queued meanwhile waits for the next loop turn. */
static void on_parse_idle(uv_idle_t *h)
{
    idem_listener_t *l = h->data;
    while (!idem_list_empty(&l->gone_q)) {
        idem_conn_t *c = IDEM_CONTAINER(l->gone_q.next, idem_conn_t, gone_link);
        idem_list_remove(&c->gone_link);
        conn_close(c);
    }
    idem_link_t batch;
    idem_list_move(&batch, &l->parse_q);
    while (!idem_list_empty(&batch)) {
        idem_conn_t *c = IDEM_CONTAINER(batch.next, idem_conn_t, parse_link);
        idem_list_remove(&c->parse_link);
        if (c->state == CS_H2) {
            conn_h2_result(c, idem__h2conn_run(c->h2));
            continue;
        }
        /* Read since (on_read parsed it), closed, or busy: nothing to do. */
        if (c->state == CS_HEAD && c->in.len > 0 && !c->write_blocked)
            conn_process(c);
    }
    if (idem_list_empty(&l->parse_q) && idem_list_empty(&l->gone_q))
        uv_idle_stop(h);
}

static void conn_schedule_parse(idem_conn_t *c)
{
    if (!c->broken && c->parse_link.next == &c->parse_link)
        idem_list_push(&c->l->parse_q, &c->parse_link);
    uv_idle_start(&c->l->parse_idle, on_parse_idle);
}

/* A head parsed as msg (head_len bytes at the front of c->in): hand it to
 * the handler.  @return false when c is answered, draining or closed. */
static bool conn_hand_head(idem_conn_t *c, const idem_http_msg_t *msg, size_t head_len)
{
    idem_handler_t *h = c->l->handler;
    c->version_minor = msg->version_minor;
    c->head_method = idem__slice_eq_ci(msg->method, "HEAD");
    c->req_keep_alive = msg->keep_alive;
    c->ans_drain = false;
    c->answered = false;
    /* The most recently active last: reuse_idle closes from the front. */
    idem_list_remove(&c->link);
    idem_list_push(&c->l->conns, &c->link);
    bool invite = msg->expect_continue && msg->version_minor == 1 && c->in.len == head_len;
    idem_http_framing_t framing = msg->framing;
    idem_http_body_t body;
    if (framing != IDEM_HTTP_BODY_NONE)
        idem__http_body_init(&body, msg, h->body_max);
    /* The answer may come inside on_head (a refusal): the head's bytes stay
     * in c->in until it returns, and the state says a request is read. */
    c->state = framing == IDEM_HTTP_BODY_NONE ? CS_BUSY : CS_BODY;
    idem_hreq_t *r = h->ops->on_head(h, msg, c->in.data, head_len, &c->os, &c->facts);
    if (c->state == CS_CLOSED || c->state == CS_DRAIN)
        return false; /* refused at its head */
    if (r == NULL && c->answered && c->state == CS_HEAD) {
        /* Answered at once and kept alive (a head that needs no body). */
        idem_rbuf_consume(&c->in, head_len);
        return true;
    }
    if (r == NULL) {
        if (!c->answered && !c->broken && c->state != CS_CLOSED)
            conn_fail(c, 500, "internal", "out of memory", 0);
        return false;
    }
    idem_rbuf_consume(&c->in, head_len);
    c->req = r;
    if (framing == IDEM_HTTP_BODY_NONE) {
        conn_timer(c, CT_NONE);
        return true;
    }
    c->body = body;
    conn_timer(c, CT_BODY);
    if (invite) {
        /* A client waiting for 100 Continue is invited only once the head
         * passed every check it can (docs/protocol.md section 11); refused,
         * it gets its answer and the connection closes. */
        if (!h->ops->on_expect(r))
            return false;
        if (c->state != CS_BODY)
            return false;
        conn_write_continue(c);
    }
    return !c->broken;
}

/* Feed the body bytes in c->in to the request.  @return false when c is
 * answered, draining or closed, or the body is not complete yet. */
static bool conn_feed_body(idem_conn_t *c)
{
    idem_handler_t *h = c->l->handler;
    size_t off = 0;
    int rc;
    for (;;) {
        size_t used = 0;
        idem_slice_t data = {0};
        rc = idem__http_body_feed(&c->body, c->in.data + off, c->in.len - off, &used, &data);
        off += used;
        if (rc != IDEM_HTTP_BODY_DATA)
            break;
        if (!h->ops->on_body(c->req, data.ptr, data.len))
            return false; /* refused (its budget) and answered: the connection drains */
        if (c->state != CS_BODY)
            return false;
    }
    idem_rbuf_consume(&c->in, off);
    if (rc == IDEM_HTTP_INCOMPLETE) {
        if (c->peer_eof)
            conn_close(c);
        return false;
    }
    if (rc < 0) {
        h->ops->on_body_error(c->req, rc);
        if (c->req != NULL && c->state == CS_BODY) { /* it did not end its answer */
            conn_detach(c);
            conn_drain(c);
        }
        return false;
    }
    c->state = CS_BUSY; /* IDEM_HTTP_BODY_DONE */
    conn_timer(c, CT_NONE);
    return true;
}

static void conn_process_loop(idem_conn_t *c)
{
    idem_handler_t *h = c->l->handler;
    for (;;) {
        if (c->state == CS_HEAD) {
            if (c->in.len == 0) {
                if (c->peer_eof)
                    conn_close(c);
                return;
            }
            if (c->h2_possible) {
                /* HTTP/2 with prior knowledge begins with its preface; any
                 * other first bytes are HTTP/1.1's. */
                size_t n = c->in.len < IDEM_H2_PREFACE_LEN ? c->in.len : IDEM_H2_PREFACE_LEN;
                if (memcmp(c->in.data, IDEM_H2_PREFACE, n) == 0) {
                    if (n == IDEM_H2_PREFACE_LEN)
                        conn_h2_start(c);
                    else if (c->peer_eof)
                        conn_close(c);
                    else if (c->waiting != CT_HEAD)
                        conn_timer(c, CT_HEAD);
                    return;
                }
                c->h2_possible = false;
            }
            if (conn_lagging(c)) {
                /* A client that pipelines without reading its answers must
                 * not make us queue them without bound. */
                c->write_blocked = true;
                conn_stop_reading(c);
                conn_timer(c, CT_QUEUE);
                return;
            }
            idem_http_msg_t msg;
            int rc =
                idem__http_parse_request(&c->hs, c->in.data, c->in.len, IDEM_HTTP_MAX_HEAD, &msg);
            if (rc == IDEM_HTTP_INCOMPLETE) {
                if (c->peer_eof)
                    conn_close(c); /* the rest can never come */
                else if (c->waiting != CT_HEAD)
                    conn_timer(c, CT_HEAD); /* header_timeout from the head's first byte */
                return;
            }
            if (rc < 0) {
                idem_gw_refusal_t refusal;
                idem__gw_refuse_parse(rc, &refusal);
                conn_refused_count(c, refusal.outcome);
                conn_fail(c, refusal.status, refusal.type, refusal.detail, 0);
                return;
            }
            memset(&c->hs, 0, sizeof c->hs);
            if (!conn_hand_head(c, &msg, (size_t)rc))
                return;
            if (c->state == CS_HEAD)
                continue; /* answered at its head, and kept alive */
        }
        if (c->state == CS_BODY && !conn_feed_body(c))
            return;
        if (c->state == CS_BUSY && c->req != NULL) {
            /* One request at a time: later pipelined ones wait in c->in. */
            h->ops->on_body_end(c->req);
            /* Answered at once (a replay, an error): go on with what is
             * pipelined behind it, in this loop rather than recursively. */
            if (c->state == CS_HEAD && c->in.len > 0 && !c->write_blocked)
                continue;
            return;
        }
        return;
    }
}

/* A place in l's budget: max_connections across workers, or the
 * listener's own max_conns. */
static bool conn_slot_take(idem_listener_t *l)
{
    if (l->limits.max_conns > 0) {
        if (l->n_conns >= l->limits.max_conns)
            return false;
        l->n_conns++;
        return true;
    }
    idem_gw_t *gw = l->gw;
    uint64_t n = atomic_load(&gw->metrics.connections);
    do {
        if (n >= gw->cfg->max_connections)
            return false;
    } while (!atomic_compare_exchange_weak(&gw->metrics.connections, &n, n + 1));
    return true;
}

static void conn_slot_give(idem_listener_t *l)
{
    if (l->limits.max_conns > 0)
        l->n_conns--;
    else
        atomic_fetch_sub(&l->gw->metrics.connections, 1);
}

/* At the budget of a listener that reuses idle connections: close the one
 * idle longest (no request, nothing queued, no input), so that a probe is
 * never refused because idle clients hold every place.  Its place comes
 * back when its handles are closed, so the new connection takes a place
 * beyond the budget until then (one at a time). */
static bool conn_evict_idle(idem_listener_t *l)
{
    for (idem_link_t *k = l->conns.next; k != &l->conns; k = k->next) {
        idem_conn_t *c = IDEM_CONTAINER(k, idem_conn_t, link);
        if (c->state == CS_HEAD && c->req == NULL && c->in.len == 0 && c->queued == 0 &&
            !c->answering) {
            conn_close(c);
            return true;
        }
    }
    return false;
}

/* Say 503 on a connection about to be closed, if the socket takes it at
 * once (a plain listener only). */
static void refuse_write(uv_tcp_t *t, const char *detail, const char *link)
{
    idem_buf_t out;
    idem__buf_init(&out, 0);
    if (idem__problem_respond(&out, 503, "overloaded", detail, 1, link, CLOSING_REPLY) == 0) {
        uv_buf_t b = uv_buf_init(out.data, (unsigned)out.len);
        (void)uv_try_write((uv_stream_t *)t, &b, 1);
    }
    idem__buf_cleanup(&out);
}

/* Over the budget: accept (a connection left in the kernel's queue would
 * stop the listener) and close at once, saying 503 if the socket takes it
 * without waiting.  The descriptor is back before this returns. */
static void conn_refuse(idem_listener_t *l, uv_stream_t *server, const char *detail)
{
    if (l->limits.max_conns > 0)
        atomic_fetch_add(&l->gw->metrics.admin_conns_refused, 1);
    else
        atomic_fetch_add(&l->gw->metrics.conns_refused, 1);
    uv_tcp_t *t = idem_malloc(sizeof *t);
    if (!t)
        return;
    uv_tcp_init(l->loop, t);
    if (uv_accept(server, (uv_stream_t *)t) == 0 && l->tls == NULL)
        refuse_write(t, detail, l->handler->problem_link);
    uv_close((uv_handle_t *)t, on_handle_closed_free);
}

void idem__listener_init(idem_listener_t *l, idem_gw_t *gw, uv_loop_t *loop,
                         idem_handler_t *handler, const idem_listen_limits_t *limits)
{
    memset(l, 0, sizeof *l);
    l->gw = gw;
    l->loop = loop;
    l->handler = handler;
    l->limits = *limits;
    idem_list_init(&l->conns);
    idem_list_init(&l->parse_q);
    idem_list_init(&l->gone_q);
    uv_idle_init(loop, &l->parse_idle);
    l->parse_idle.data = l;
}

void idem__listener_close_handles(idem_listener_t *l)
{
    if (!uv_is_closing((uv_handle_t *)&l->tcp))
        uv_close((uv_handle_t *)&l->tcp, NULL);
    if (!uv_is_closing((uv_handle_t *)&l->parse_idle))
        uv_close((uv_handle_t *)&l->parse_idle, NULL);
}

void idem__conn_on_connection(uv_stream_t *server, int status)
{
    idem_listener_t *l = server->data;
    if (status < 0)
        return;
    if (!conn_slot_take(l)) {
        if (!l->limits.reuse_idle || !conn_evict_idle(l)) {
            conn_refuse(l, server,
                        l->limits.max_conns > 0 ? "too many admin connections; retry"
                                                : "too many connections (max_connections); retry");
            return;
        }
        /* The evicted connection gives its place back once closed. */
        l->n_conns++;
    }
    idem_conn_t *c = idem_calloc(1, sizeof *c);
    if (!c) {
        conn_slot_give(l);
        return;
    }
    c->l = l;
    c->os.ops = &conn_os_ops;
    c->facts.proto = "HTTP/1.1";
    c->h2_possible = l->limits.http2 && l->tls == NULL;
    idem__buf_init(&c->out, 0);
    idem_list_init(&c->parse_link);
    idem_list_init(&c->gone_link);
    uv_tcp_init(l->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_slot_give(l);
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed_free); /* tcp is c's first member */
        return;
    }
    if (l->limits.per_address && l->gw->addrlimit != NULL) {
        int len = sizeof c->peer;
        if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &len) == 0) {
            if (!idem__addrlimit_take(l->gw->addrlimit, (const struct sockaddr *)&c->peer)) {
                /* One address holds its share: this one is refused. */
                conn_slot_give(l);
                atomic_fetch_add(&l->gw->metrics.conns_refused, 1);
                if (l->tls == NULL) /* a TLS client would read it as garbage */
                    refuse_write(&c->tcp,
                                 "too many connections from this address "
                                 "(max_connections_per_address); retry",
                                 l->handler->problem_link);
                uv_close((uv_handle_t *)&c->tcp, on_handle_closed_free);
                return;
            }
            c->peer_counted = true;
        }
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (l->tls != NULL) {
        /* The handshake runs under header_timeout, and the connection
         * counts in max_connections from its accept. */
        idem_tls_ctx_t *ctx = idem__tls_server_current(l->tls);
        idem_tls_t *tls = idem__tls_create_server(ctx);
        idem__tls_ctx_unref(ctx);
        if (tls == NULL) {
            if (c->peer_counted)
                idem__addrlimit_give(l->gw->addrlimit, (const struct sockaddr *)&c->peer);
            conn_slot_give(l);
            uv_close((uv_handle_t *)&c->tcp, on_handle_closed_free);
            return;
        }
        idem__transport_init_tls(&c->tr, l->loop, &c->tcp, tls, &conn_tr_cbs, c);
        c->facts.tls = true;
    } else {
        idem__transport_init_plain(&c->tr, l->loop, &c->tcp, &conn_tr_cbs, c);
    }
    uv_timer_init(l->loop, &c->timer);
    c->timer.data = c;
    c->state = CS_HEAD;
    idem_list_push(&l->conns, &c->link);
    /* A new connection's first head must come within header_timeout. */
    conn_timer(c, CT_HEAD);
    conn_start_reading(c);
}

void idem__conns_close_idle(idem_listener_t *ls)
{
    idem_link_t *l = ls->conns.next;
    while (l != &ls->conns) {
        idem_conn_t *c = IDEM_CONTAINER(l, idem_conn_t, link);
        l = l->next;
        if (c->state == CS_H2) {
            /* GOAWAY: its streams finish, later ones are refused. */
            idem__h2conn_shutdown(c->h2);
            continue;
        }
        if (c->req || c->state == CS_BUSY || c->state == CS_BODY)
            continue;
        /* A connection whose head is awaited (new, or part of a head read)
         * has a request on its way: it is answered, with Connection: close,
         * within header_timeout.  Closing it would fail a request the client
         * sent to a socket another process now serves too (--takeover).
         * Only keep-alive connections between requests are idle. */
        if (c->waiting == CT_HEAD && c->queued == 0)
            continue;
        if (c->queued > 0) {
            c->close_after = true; /* an answer is still on its way out */
            conn_stop_reading(c);
        } else {
            conn_close(c);
        }
    }
}

void idem__conns_close_all(idem_listener_t *l)
{
    while (!idem_list_empty(&l->conns))
        conn_close(IDEM_CONTAINER(l->conns.next, idem_conn_t, link));
}

/* ---- listening ------------------------------------------------------------ */

int idem__listen_socket(const char *host, int port, int backlog, const char *what, char *err,
                        size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(struct sockaddr_in);
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&ss);
    if (rc != 0) {
        rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss);
        sslen = sizeof(struct sockaddr_in6);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s: not an IP address: %s", what, host);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot listen on %s:%d: %s", what, host, port,
                 uv_strerror(uv_translate_sys_error(errno)));
        return -1;
    }
    /* SO_REUSEADDR lets a restart bind past connections in TIME_WAIT; on
     * Linux it never lets two sockets listen on one address.  No
     * SO_REUSEPORT: that would let a second idemd (another store, perhaps)
     * bind the same port without error and take half the connections. */
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6) /* [::] takes IPv4 too, as libuv's bind does */
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (const struct sockaddr *)&ss, sslen) != 0 || listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "%s: cannot listen on %s:%d: %s", what, host, port,
                 uv_strerror(uv_translate_sys_error(e)));
        return -1;
    }
    return fd;
}

int idem__tcp_open_listener(uv_loop_t *loop, uv_tcp_t *tcp, void *data, int listen_fd,
                            int backlog, uv_connection_cb cb, const char *what, char *err,
                            size_t errlen)
{
    int fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot use the listening socket: %s", what, strerror(errno));
        return -1;
    }
    uv_tcp_init(loop, tcp);
    tcp->data = data;
    int rc = uv_tcp_open(tcp, fd);
    if (rc != 0) {
        close(fd);
    } else {
        /* Already listening; this only starts watching it on this loop. */
        rc = uv_listen((uv_stream_t *)tcp, backlog, cb);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s: cannot use the listening socket: %s", what, uv_strerror(rc));
        return -1;
    }
    return 0;
}

