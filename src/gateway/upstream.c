/* src/gateway/upstream.c - the upstream client: a pool of keep-alive
 * connections, sending a call's request, reading its response.
 *
 * upstream.h says what a caller sees.  Inside, a connection (idem_upconn_t,
 * the client's own) goes CONNECTING -> HEAD -> BODY, then back to the pool
 * (IDLE) or CLOSED.  The request goes out in one write, the head from the
 * connection's buffer and the body straight from the caller: a body is
 * never copied, so what the caller counts as held is what is held.  The
 * response head is parsed with src/http's parser (1xx skipped, a 101
 * refused), copied into the call (ur->resp_head, with ur->resp re-parsed to
 * point into it), and the body decoded and handed over piece by piece.
 *
 * What the caller does in a callback may end the call (cancel) or free it,
 * so after each callback the client looks at its connection, never at the
 * call, to see whether the call is still there.  A failure found inside
 * idem__upstream_req_start, and the reading on after
 * idem__upstream_req_resume, are steps "deferred": the call goes on
 * client->deferred and the client's idle handle runs the step at the start
 * of the next loop turn, so that a callback never runs on its caller's
 * stack.
 *
 * A connection is reused only after a whole response with keep-alive whose
 * end no one could doubt (up_reusable), no byte beyond it, and our request
 * wholly written (an upstream may answer before it has read all of it: the
 * answer is the outcome, but the connection is not reused).  An idle
 * connection that says anything, or closes, is closed; so is one idle
 * longer than IDEM_UPSTREAM_IDLE_MS.  Bytes an upstream sends after its
 * response would otherwise be read as the next call's answer, another
 * client's: so a connection is also looked at (up_quiet, a peek at its
 * socket) right before a request is written on it, pooled or new, and one
 * that has something to say or has closed is never used.
 *
 * The request goes out first with uv_try_write, so that the client knows
 * whether any byte of it reached the kernel: a write refused before the
 * first byte sent nothing, and a pooled connection that does so is given up
 * for a new one, once (upstream.h).  What uv_try_write could not take is
 * queued with uv_write; a failure after that is the unknown outcome.
 *
 * TLS: a connection of a client given a TLS context (idem__upstream_set_tls)
 * runs over a transport (src/gateway/transport.h) from its connect on; the
 * same states, parsing and pool serve it, and the few steps that touch the
 * socket (reading, writing, closing) go through the transport instead.
 * Its handshake is part of CONNECTING (u->handshaking): the request is
 * written from on_ready, and a failure before it is "nothing sent".  The
 * peek of up_quiet works on the TLS socket too: idle connections keep
 * reading, so a session ticket that came after the last response has been
 * consumed by the TLS engine already, and what still waits unread right
 * before a reuse is treated as talk (the connection is given up, at worst
 * for a late ticket).  Plain connections stay off the transport: their
 * "nothing sent" is exact (uv_try_write says how much the kernel took, and
 * the body is never copied), which a copying transport could not keep.
 *
 * THREADING: the client's loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "gateway/rbuf.h"
#include "gateway/transport.h"
#include "gateway/upstream.h"
#include "idem/alloc.h"

#define UP_READ_CHUNK (64 * 1024)

typedef enum { UP_CONNECTING, UP_HEAD, UP_BODY, UP_IDLE, UP_CLOSED } up_state_t;

struct idem_upconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t connect;
    uv_write_t wr;
    idem_upstream_t *client;
    idem_link_t link;          /* in client->idle while idle */
    idem_upstream_req_t *call; /* the call it serves; NULL when idle or closed */
    idem_buf_t out;            /* the request head being written */
    idem_rbuf_t in;            /* the response, read and not yet parsed */
    idem_http_head_state_t hs;
    idem_http_body_t body;
    up_state_t state;
    bool reading;
    bool paused;               /* the caller holds the response, or cannot take more */
    bool writing;
    bool write_failed;         /* the upstream stopped reading: never reuse */
    bool eof_seen;             /* the upstream closed: the end of a close-delimited body */
    bool reused;               /* taken from the pool (else made for its call) */
    bool doubtful;             /* an interim answer carried framing: never reuse */
    bool nothing_out;          /* no byte of the request has left yet (see queued) */
    size_t queued;             /* bytes given to uv_write, while nothing_out */
    int closes;
    /* TLS: the stream over tcp, from the connect on (tr_on). */
    idem_transport_t tr;
    bool tls;                  /* the client spoke TLS when u was made */
    bool tr_on;                /* tr is initialised: tcp is the transport's */
    bool handshaking;          /* TLS: connected, the handshake not yet done */
    bool tls_resumed;          /* TLS: the handshake resumed a session */
    bool heard;                /* TLS: plaintext came since the handshake */
};

/* How a request went to the kernel (up_send). */
typedef enum {
    SEND_OK,      /* under way: bytes left, or are queued with nothing amiss */
    SEND_NOTHING, /* refused before any byte left: nothing was sent */
    SEND_BROKEN,  /* refused after some bytes left */
} send_rc_t;

static void up_process(idem_upconn_t *u);
static void up_read_start(idem_upconn_t *u);
static void on_up_timeout(uv_timer_t *t);
static void up_connect_new(idem_upstream_t *c, idem_upstream_req_t *ur, idem_buf_t *head);

/* ---- the steps that wait for the loop ------------------------------------ */

static void on_defer_idle(uv_idle_t *h);

static void defer(idem_upstream_req_t *ur, bool fail, idem_up_result_t why)
{
    idem_upstream_t *c = ur->client;
    ur->defer_fail = fail;
    ur->defer_why = why;
    if (!ur->deferred) {
        ur->deferred = true;
        idem_list_push(&c->deferred, &ur->defer_link);
        uv_idle_start(&c->defer_idle, on_defer_idle);
    }
}

/* The call has ended (or was cancelled): nothing of it waits any more. */
static void call_end(idem_upstream_req_t *ur)
{
    ur->active = false;
    ur->conn = NULL;
    if (ur->deferred) {
        ur->deferred = false;
        idem_list_remove(&ur->defer_link);
    }
}

/* ---- closing ------------------------------------------------------------ */

/* The TLS state of a client is freed once it is closed and no connection
 * is left whose session could still save into the cache. */
static void client_tls_maybe_free(idem_upstream_t *c)
{
    if (!c->closed || c->n_conns != 0)
        return;
    idem__tls_session_cache_destroy(c->tls_cache);
    c->tls_cache = NULL;
    idem__tls_ctx_unref(c->tls_ctx);
    c->tls_ctx = NULL;
    idem_free(c->tls_server_name);
    c->tls_server_name = NULL;
}

static void up_closed_one(idem_upconn_t *u)
{
    if (--u->closes > 0)
        return;
    idem_upstream_t *c = u->client;
    idem__buf_cleanup(&u->out);
    idem_rbuf_cleanup(&u->in);
    idem_free(u);
    c->n_conns--;
    client_tls_maybe_free(c);
}

static void on_up_closed(uv_handle_t *h) { up_closed_one(h->data); }

static void on_tr_closed(idem_transport_t *t)
{
    up_closed_one(IDEM_CONTAINER(t, idem_upconn_t, tr));
}

static void up_close(idem_upconn_t *u)
{
    if (u->state == UP_CLOSED)
        return;
    if (u->state == UP_IDLE) {
        idem_list_remove(&u->link);
        u->client->n_idle--;
    }
    u->state = UP_CLOSED;
    u->call = NULL;
    u->closes = 2;
    if (u->tr_on)
        idem__transport_close(&u->tr, on_tr_closed); /* closes tcp too */
    else
        uv_close((uv_handle_t *)&u->tcp, on_up_closed);
    uv_close((uv_handle_t *)&u->timer, on_up_closed);
}

/* The call of u fails with why; u is closed. */
static void up_fail(idem_upconn_t *u, idem_up_result_t why)
{
    idem_upstream_req_t *ur = u->call;
    up_close(u);
    if (!ur)
        return;
    call_end(ur);
    ur->cbs->on_failure(ur, why);
}

/* As up_fail, saying why (ur->reason). */
static void up_fail_reason(idem_upconn_t *u, idem_up_result_t why, const char *reason)
{
    if (u->call && reason && *reason)
        snprintf(u->call->reason, sizeof u->call->reason, "%s", reason);
    up_fail(u, why);
}

/* The call fails with why, reported on a later loop turn; its connection,
 * if it has one, is closed now. */
static void fail_later(idem_upstream_req_t *ur, idem_up_result_t why)
{
    if (ur->conn) {
        idem_upconn_t *u = ur->conn;
        ur->conn = NULL;
        up_close(u);
    }
    defer(ur, true, why);
}

static void on_defer_idle(uv_idle_t *h)
{
    idem_upstream_t *c = h->data;
    /* Only what waits now: steps deferred by the callbacks below wait for
     * the next turn. */
    idem_link_t batch;
    idem_list_move(&batch, &c->deferred);
    while (!idem_list_empty(&batch)) {
        idem_upstream_req_t *ur = IDEM_CONTAINER(batch.next, idem_upstream_req_t, defer_link);
        idem_list_remove(&ur->defer_link);
        ur->deferred = false;
        if (ur->defer_fail) {
            call_end(ur);
            ur->cbs->on_failure(ur, ur->defer_why);
            continue;
        }
        idem_upconn_t *u = ur->conn;
        if (u == NULL || u->paused)
            continue;
        up_process(u);
        if (u->call == ur && u->state == UP_BODY && !u->paused)
            up_read_start(u);
    }
    if (idem_list_empty(&c->deferred))
        uv_idle_stop(h);
}

/* ---- the idle pool ---------------------------------------------------------- */

static void on_up_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    idem_upconn_t *u = h->data;
    (void)suggested;
    idem_rbuf_alloc(&u->in, UP_READ_CHUNK, buf);
}

static void on_up_idle_timeout(uv_timer_t *t) { up_close(t->data); }

static void up_read_stop(idem_upconn_t *u)
{
    if (u->reading) {
        if (u->tr_on)
            idem__transport_read_stop(&u->tr);
        else
            uv_read_stop((uv_stream_t *)&u->tcp);
        u->reading = false;
    }
}

static void up_to_pool(idem_upconn_t *u)
{
    idem_upstream_t *c = u->client;
    u->call = NULL;
    uv_timer_stop(&u->timer);
    if (c->stopping || c->n_idle >= c->idle_max || u->in.len != 0) {
        up_close(u);
        return;
    }
    u->state = UP_IDLE;
    idem_list_push(&c->idle, &u->link);
    c->n_idle++;
    /* An idle connection keeps reading (on_up_read closes it at any byte
     * or EOF): one read callback for both states, so that a connection
     * going to the pool and back costs no epoll_ctl. */
    u->paused = false;
    up_read_start(u);
    uv_timer_start(&u->timer, on_up_idle_timeout, IDEM_UPSTREAM_IDLE_MS, 0);
}

/* Whether u has nothing to say: no byte waits in its socket and the
 * upstream has not closed it.  Looked at right before a request is written
 * on u: a byte there now came before the request, so it answers nothing
 * of ours (it is what an upstream sent after its last response, late), and
 * a connection at its end would take the request and lose it. */
static bool up_quiet(idem_upconn_t *u)
{
    uv_os_fd_t fd;
    if (u->in.len != 0 || uv_fileno((const uv_handle_t *)&u->tcp, &fd) != 0)
        return false;
    char b;
    ssize_t n;
    do {
        n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void idem__upstream_close_idle(idem_upstream_t *c)
{
    while (!idem_list_empty(&c->idle))
        up_close(IDEM_CONTAINER(c->idle.next, idem_upconn_t, link));
}

size_t idem__upstream_idle_count(const idem_upstream_t *c) { return c->n_idle; }

/* ---- reading the response ------------------------------------------------ */

static void up_finish(idem_upconn_t *u, bool reusable)
{
    idem_upstream_req_t *ur = u->call;
    if (reusable)
        up_to_pool(u);
    else
        up_close(u);
    call_end(ur);
    ur->cbs->on_done(ur);
}

/* Whether the response that just ended leaves no doubt about where it
 * ended, so that the next byte on u can only answer the next request.  Not
 * after a close-delimited body (the end is the close), nor after an answer
 * that has no body by the rules (204, 304, a response to HEAD) but carries
 * Transfer-Encoding or a Content-Length other than 0: the upstream may
 * think a body follows, and send it late, into the next call.  A response
 * to HEAD with neither is doubtful too: its GET would have been
 * close-delimited.  Nor after an interim answer (1xx) with framing.  The
 * caller checks the rest: keep-alive, no byte beyond, the request written. */
static bool up_reusable(const idem_upconn_t *u, const idem_upstream_req_t *ur)
{
    const idem_http_msg_t *m = &ur->resp;
    if (!m->keep_alive || u->doubtful || m->framing == IDEM_HTTP_BODY_EOF)
        return false;
    if (m->framing != IDEM_HTTP_BODY_NONE)
        return true;
    if (idem__http_find(m, "transfer-encoding") != NULL)
        return false;
    const idem_http_field_t *cl = idem__http_find(m, "content-length");
    if (cl != NULL) {
        for (size_t i = 0; i < cl->value.len; i++) {
            if (cl->value.ptr[i] != '0')
                return false;
        }
        return true; /* the parser took it for a length: digits, at least one */
    }
    return !idem__slice_eq_ci(ur->method, "HEAD");
}

static void up_pause(idem_upconn_t *u)
{
    u->paused = true;
    up_read_stop(u);
}

/* Parse the head, when it is not yet; returns false when the call is no
 * longer u's (it failed, or the caller ended it in on_head). */
static bool up_head(idem_upconn_t *u)
{
    idem_upstream_req_t *ur = u->call;
    while (u->state == UP_HEAD) {
        int rc = idem__http_parse_response(&u->hs, u->in.data, u->in.len, IDEM_HTTP_MAX_HEAD * 4,
                                           ur->method, &ur->resp);
        if (rc == IDEM_HTTP_INCOMPLETE)
            return true;
        if (rc < 0) {
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return false;
        }
        size_t head_len = (size_t)rc;
        memset(&u->hs, 0, sizeof u->hs);
        if (ur->resp.status == 101) {
            /* The client never sends Upgrade (request.c drops it as
             * hop-by-hop), so a 101 was asked for by no one: what follows
             * it is not HTTP we may store or relay.  A broken response
             * (docs/protocol.md section 7). */
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return false;
        }
        if (ur->resp.status < 200) {
            /* 100 Continue, 102, 103: interim, the real answer follows.  One
             * that says it has a body has framing no one can trust. */
            if (idem__http_find(&ur->resp, "content-length") != NULL ||
                idem__http_find(&ur->resp, "transfer-encoding") != NULL)
                u->doubtful = true;
            idem_rbuf_consume(&u->in, head_len);
            continue;
        }
        idem_free(ur->resp_head);
        ur->resp_head = idem_malloc(head_len);
        if (!ur->resp_head) {
            up_fail(u, IDEM_UP_BROKEN);
            return false;
        }
        memcpy(ur->resp_head, u->in.data, head_len);
        idem_http_head_state_t hs = {0};
        rc = idem__http_parse_response(&hs, ur->resp_head, head_len, IDEM_HTTP_MAX_HEAD * 4,
                                       ur->method, &ur->resp);
        idem_rbuf_consume(&u->in, head_len);
        if (rc <= 0) {
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return false;
        }
        idem__http_body_init(&u->body, &ur->resp, 0);
        u->state = UP_BODY;
        if (ur->cbs->on_head) {
            ur->cbs->on_head(ur);
            if (u->call != ur)
                return false;
        }
    }
    return true;
}

static void up_process(idem_upconn_t *u)
{
    idem_upstream_req_t *ur = u->call;
    if (!up_head(u))
        return;
    if (u->state != UP_BODY || u->paused)
        return;
    size_t off = 0;
    int rc;
    for (;;) {
        size_t used = 0;
        idem_slice_t data = {0};
        rc = idem__http_body_feed(&u->body, u->in.data + off, u->in.len - off, &used, &data);
        off += used;
        if (rc != IDEM_HTTP_BODY_DATA)
            break;
        if (ur->relaying) {
            /* Each silence is bounded, of the upstream or of the caller. */
            uv_timer_start(&u->timer, on_up_timeout, u->client->timeout_ms, 0);
        }
        idem_up_body_t want = ur->cbs->on_body(ur, data.ptr, data.len);
        if (u->call != ur) {
            /* Ended by the caller: u is closed, its input no one's. */
            return;
        }
        if (want == IDEM_UP_BODY_REFUSE) {
            idem_rbuf_consume(&u->in, off);
            up_fail(u, IDEM_UP_BROKEN);
            return;
        }
        if (want == IDEM_UP_BODY_PAUSE || u->paused) {
            idem_rbuf_consume(&u->in, off);
            up_pause(u);
            return;
        }
    }
    idem_rbuf_consume(&u->in, off);
    if (rc == IDEM_HTTP_INCOMPLETE && u->eof_seen)
        rc = idem__http_body_eof(&u->body); /* all delivered: the close ends it */
    if (rc == IDEM_HTTP_BODY_DONE) {
        /* Not while our request is still being written to it (the upstream
         * answered early): that write still owns u->wr and u->out. */
        bool writing = u->tr_on ? idem__transport_queued(&u->tr) != 0 : u->writing;
        bool reusable = up_reusable(u, ur) && u->in.len == 0 && !writing && !u->write_failed;
        up_finish(u, reusable);
        return;
    }
    if (rc < 0)
        up_fail(u, IDEM_UP_BAD_RESPONSE);
}

/* u failed before any byte of its call's request left (the upstream spoke
 * or closed first, or refused the first write): nothing was sent.  A pooled
 * connection is given up for a new one, once; a new one's call fails as a
 * connect that failed.  Not inside idem__upstream_req_start. */
static void up_unsent(idem_upconn_t *u)
{
    idem_upstream_req_t *ur = u->call;
    if (!u->reused || !ur) {
        up_fail(u, IDEM_UP_CONNECT_FAILED);
        return;
    }
    /* The head is whole (no byte of it left): it goes to the new one.  A
     * write still queued on u is cancelled by the close, and reads no more
     * of it. */
    idem_buf_t head = u->out;
    idem__buf_init(&u->out, 0);
    u->call = NULL;
    ur->conn = NULL;
    up_close(u);
    up_connect_new(ur->client, ur, &head);
}

/* Whether no byte of the request on u has left yet: uv_try_write took none
 * and uv_write has written none of what it was given. */
static bool up_nothing_out(idem_upconn_t *u)
{
    return u->nothing_out && u->writing &&
           uv_stream_get_write_queue_size((const uv_stream_t *)&u->tcp) == u->queued;
}

static void on_up_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    idem_upconn_t *u = s->data;
    if (nread == 0)
        return;
    if (u->state == UP_IDLE) {
        /* An idle connection has nothing to say: any byte or EOF ends it. */
        up_close(u);
        return;
    }
    if (u->state == UP_HEAD && up_nothing_out(u)) {
        /* Said before our request left: it answers nothing of ours. */
        up_unsent(u);
        return;
    }
    if (nread < 0) {
        if (u->state == UP_BODY && nread == UV_EOF && u->body.framing == IDEM_HTTP_BODY_EOF &&
            !u->paused) {
            /* What is buffered first, then the end; if the caller pauses on
             * the last pieces, the end waits for its resume. */
            u->eof_seen = true;
            up_read_stop(u);
            up_process(u);
            return;
        }
        if (u->state != UP_CLOSED)
            up_fail(u, IDEM_UP_BROKEN);
        return;
    }
    u->in.len += (size_t)nread;
    up_process(u);
}

static void up_read_start(idem_upconn_t *u)
{
    if (u->reading || u->state == UP_CLOSED)
        return;
    if (u->tr_on) {
        idem__transport_read_start(&u->tr); /* what it finds comes from the loop */
        u->reading = true;
        return;
    }
    u->reading = uv_read_start((uv_stream_t *)&u->tcp, on_up_alloc, on_up_read) == 0;
}

static void on_up_timeout(uv_timer_t *t)
{
    idem_upconn_t *u = t->data;
    /* A connection never made (or never through its handshake) means
     * nothing was sent. */
    if (u->handshaking)
        up_fail_reason(u, IDEM_UP_CONNECT_FAILED, "TLS handshake timed out");
    else
        up_fail(u, u->state == UP_CONNECTING ? IDEM_UP_CONNECT_FAILED : IDEM_UP_TIMEOUT);
}

/* ---- the TLS transport's callbacks ------------------------------------------ */

static send_rc_t up_send(idem_upconn_t *u);

/* The handshake is done: the request goes out now. */
static void on_tr_ready(void *data)
{
    idem_upconn_t *u = data;
    u->handshaking = false;
    u->tls_resumed = idem__tls_session_reused(idem__transport_tls(&u->tr));
    if (u->call)
        u->call->tls_resumed = u->tls_resumed;
    send_rc_t rc = up_send(u);
    if (rc != SEND_OK)
        up_fail_reason(u, rc == SEND_NOTHING ? IDEM_UP_CONNECT_FAILED : IDEM_UP_BROKEN,
                       "out of memory");
}

/* Plaintext from the upstream: as a plain read would bring it. */
static void on_tr_read(void *data, const char *p, size_t n)
{
    idem_upconn_t *u = data;
    if (u->state == UP_IDLE) {
        up_close(u); /* an idle connection has nothing to say */
        return;
    }
    u->heard = true;
    while (n > 0) {
        uv_buf_t b;
        idem_rbuf_alloc(&u->in, UP_READ_CHUNK, &b);
        if (b.len == 0) {
            up_fail_reason(u, IDEM_UP_BROKEN, "out of memory");
            return;
        }
        size_t k = n < b.len ? n : b.len;
        memcpy(b.base, p, k);
        u->in.len += k;
        p += k;
        n -= k;
    }
    up_process(u);
}

static void on_tr_eof(void *data)
{
    idem_upconn_t *u = data;
    if (u->state == UP_IDLE) {
        up_close(u);
        return;
    }
    if (u->state == UP_BODY && u->body.framing == IDEM_HTTP_BODY_EOF && !u->paused) {
        if (!idem__transport_eof_clean(&u->tr)) {
            /* Without close_notify, the end of a close-delimited body may
             * be a truncation by anyone on the path. */
            up_fail_reason(u, IDEM_UP_BROKEN,
                           "the upstream ended a close-delimited body without TLS close_notify");
            return;
        }
        u->eof_seen = true;
        up_read_stop(u);
        up_process(u);
        return;
    }
    if (u->state != UP_CLOSED)
        up_fail(u, IDEM_UP_BROKEN);
}

/* Whether reason is an alert a server sends only to refuse a handshake
 * (OpenSSL's words for them): our certificate missing or refused, no
 * common ground.  No renegotiation or post-handshake authentication is
 * offered, so a server can send one only before its side of the handshake
 * is done, when its application has read nothing. */
static bool handshake_refusal(const char *reason)
{
    static const char *const alerts[] = {
        "alert certificate required",    "alert bad certificate",
        "alert unknown ca",              "alert handshake failure",
        "alert certificate unknown",     "alert certificate expired",
        "alert certificate revoked",     "alert unsupported certificate",
        "alert access denied",
    };
    for (size_t i = 0; i < sizeof alerts / sizeof alerts[0]; i++) {
        if (strstr(reason, alerts[i]) != NULL)
            return true;
    }
    return false;
}

static void on_tr_error(void *data, const char *reason)
{
    idem_upconn_t *u = data;
    if (u->state == UP_IDLE) {
        up_close(u);
        return;
    }
    /* Before the handshake was done, nothing of the request went out.
     * After it, on a new connection that has heard nothing: with TLS 1.3
     * the client is done before the server has checked its certificate,
     * so a server that refuses it does so after our request left, but
     * its application never saw the request. */
    bool unsent = u->handshaking ||
                  (!u->reused && !u->heard && u->state == UP_HEAD && handshake_refusal(reason));
    up_fail_reason(u, unsent ? IDEM_UP_CONNECT_FAILED : IDEM_UP_BROKEN, reason);
}

static const idem_transport_cbs_t tr_cbs = {
    .on_ready = on_tr_ready,
    .on_read = on_tr_read,
    .on_eof = on_tr_eof,
    .on_error = on_tr_error,
};

/* ---- sending the request ------------------------------------------------- */

static void on_up_written(uv_write_t *wr, int status)
{
    idem_upconn_t *u = wr->data;
    u->writing = false;
    idem__buf_cleanup(&u->out);
    if (status < 0 && u->state != UP_CLOSED) {
        /* An upstream may answer (413, say) and stop reading before the
         * body is all sent: its answer is the outcome, so keep reading.  If
         * none comes, the read side sees the break, or the timer fires. */
        u->write_failed = true;
    }
}

/* The head from u->out, the body straight from the call: as much as the
 * kernel takes now (uv_try_write), the rest queued.  The caller keeps the
 * body until the call ends, and up_close cancels the write before that.
 * On SEND_NOTHING u->out still holds the whole head. */
static send_rc_t up_send(idem_upconn_t *u)
{
    idem_upstream_req_t *ur = u->call;
    uv_buf_t b[2] = {uv_buf_init(u->out.data, (unsigned)u->out.len),
                     uv_buf_init((char *)ur->body, (unsigned)ur->body_len)};
    unsigned nb = ur->body_len > 0 ? 2 : 1;
    u->wr.data = u;
    u->state = UP_HEAD;
    u->paused = false;
    u->write_failed = false;
    u->eof_seen = false;
    u->doubtful = false;
    memset(&u->hs, 0, sizeof u->hs);
    if (u->tr_on) {
        /* Copied, and written at once; from here on the request counts as
         * sent (upstream.h). */
        if (idem__transport_write(&u->tr, b, nb) != 0)
            return SEND_NOTHING;
        idem__buf_cleanup(&u->out);
        u->nothing_out = false;
        u->writing = false;
        uv_timer_start(&u->timer, on_up_timeout, u->client->timeout_ms, 0);
        up_read_start(u);
        return SEND_OK;
    }
    int n = uv_try_write((uv_stream_t *)&u->tcp, b, nb);
    if (n < 0 && n != UV_EAGAIN)
        return SEND_NOTHING; /* EPIPE, ECONNRESET ...: not one byte was taken */
    size_t sent = n > 0 ? (size_t)n : 0;
    u->nothing_out = sent == 0;
    /* What the kernel did not take: the head's rest, then the body's. */
    unsigned first = 0;
    while (first < nb && sent >= b[first].len) {
        sent -= b[first].len;
        first++;
    }
    if (first < nb) {
        b[first].base += sent;
        b[first].len -= sent;
        u->queued = b[first].len + (first + 1 < nb ? b[first + 1].len : 0);
        if (uv_write(&u->wr, (uv_stream_t *)&u->tcp, b + first, nb - first, on_up_written) != 0)
            return u->nothing_out ? SEND_NOTHING : SEND_BROKEN;
        u->writing = true;
    } else {
        idem__buf_cleanup(&u->out); /* all taken */
    }
    uv_timer_start(&u->timer, on_up_timeout, u->client->timeout_ms, 0);
    up_read_start(u); /* a pooled connection reads already */
    return SEND_OK;
}

static void on_up_connect(uv_connect_t *cr, int status)
{
    idem_upconn_t *u = cr->data;
    if (u->state == UP_CLOSED)
        return;
    if (status < 0) {
        up_fail(u, IDEM_UP_CONNECT_FAILED);
        return;
    }
    uv_tcp_nodelay(&u->tcp, 1);
    if (u->tls) {
        /* The handshake first, under the timer that runs since the
         * connect; the request goes from on_tr_ready. */
        idem_upstream_t *c = u->client;
        idem_tls_t *t = idem__tls_create_client(c->tls_ctx, c->tls_server_name, c->tls_cache);
        if (!t) {
            up_fail_reason(u, IDEM_UP_CONNECT_FAILED, "TLS: out of memory");
            return;
        }
        idem__transport_init_tls(&u->tr, c->loop, &u->tcp, t, &tr_cbs, u);
        u->tr_on = true;
        u->handshaking = true;
        idem__transport_read_start(&u->tr); /* the handshake progresses while reading */
        u->reading = true;
        return;
    }
    if (!up_quiet(u)) {
        /* The upstream spoke, or closed, before our request: nothing of it
         * would answer the request, and nothing was sent. */
        up_fail(u, IDEM_UP_CONNECT_FAILED);
        return;
    }
    send_rc_t rc = up_send(u);
    if (rc != SEND_OK)
        up_fail(u, rc == SEND_NOTHING ? IDEM_UP_CONNECT_FAILED : IDEM_UP_BROKEN);
}

/* ---- the client's API ------------------------------------------------------- */

void idem__upstream_init(idem_upstream_t *c, uv_loop_t *loop, const struct sockaddr *addr,
                         uint64_t timeout_ms, size_t idle_max)
{
    memset(c, 0, sizeof *c);
    c->loop = loop;
    memcpy(&c->addr, addr,
           addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    c->timeout_ms = timeout_ms;
    c->idle_max = idle_max;
    idem_list_init(&c->idle);
    idem_list_init(&c->deferred);
    uv_idle_init(loop, &c->defer_idle);
    c->defer_idle.data = c;
}

void idem__upstream_stop(idem_upstream_t *c)
{
    c->stopping = true;
    idem__upstream_close_idle(c);
}

int idem__upstream_set_tls(idem_upstream_t *c, idem_tls_ctx_t *ctx, const char *server_name)
{
    char *name = NULL;
    if (server_name) {
        size_t n = strlen(server_name);
        name = idem_malloc(n + 1);
        if (!name)
            return -1;
        memcpy(name, server_name, n + 1);
    }
    /* Without a cache the client works, only resuming nothing. */
    idem_tls_session_cache_t *cache = idem__tls_session_cache_create();
    if (!cache) {
        idem_free(name);
        return -1;
    }
    idem__tls_session_cache_destroy(c->tls_cache);
    idem__tls_ctx_unref(c->tls_ctx);
    idem_free(c->tls_server_name);
    c->tls_ctx = idem__tls_ctx_ref(ctx);
    c->tls_server_name = name;
    c->tls_cache = cache;
    return 0;
}

void idem__upstream_close(idem_upstream_t *c)
{
    idem__upstream_stop(c);
    if (!c->closed) {
        c->closed = true;
        if (!uv_is_closing((uv_handle_t *)&c->defer_idle))
            uv_close((uv_handle_t *)&c->defer_idle, NULL);
        client_tls_maybe_free(c);
    }
}

void idem__upstream_req_start(idem_upstream_t *c, idem_upstream_req_t *ur,
                              const idem_upstream_cbs_t *cbs, idem_buf_t *head, const char *body,
                              size_t body_len, idem_slice_t method)
{
    ur->client = c;
    ur->cbs = cbs;
    ur->conn = NULL;
    ur->method = method;
    ur->body = body;
    ur->body_len = body_len;
    ur->deferred = false;
    idem_list_init(&ur->defer_link);
    ur->active = true;
    ur->relaying = false;
    ur->tls_resumed = false;
    ur->reason[0] = '\0';
    if (head == NULL) {
        fail_later(ur, IDEM_UP_CONNECT_FAILED);
        return;
    }
    idem_buf_t h = *head;
    idem__buf_init(head, 0);
    /* The most recently used connection is the least likely to have been
     * closed by the upstream's idle timeout.  One that is not quiet is
     * closed, and the next one looked at. */
    while (!idem_list_empty(&c->idle)) {
        idem_upconn_t *u = IDEM_CONTAINER(c->idle.prev, idem_upconn_t, link);
        if (!up_quiet(u)) {
            up_close(u);
            continue;
        }
        idem_list_remove(&u->link);
        c->n_idle--;
        uv_timer_stop(&u->timer);
        u->reused = true;
        u->call = ur;
        ur->conn = u;
        ur->tls_resumed = u->tls_resumed;
        idem__buf_cleanup(&u->out);
        u->out = h;
        send_rc_t rc = up_send(u);
        if (rc == SEND_OK)
            return;
        ur->conn = NULL;
        u->call = NULL;
        if (rc == SEND_BROKEN) {
            up_close(u);
            defer(ur, true, IDEM_UP_BROKEN);
            return;
        }
        /* Not one byte left: the head is whole, and goes to a new
         * connection (once: a new one is not given up for another). */
        h = u->out;
        idem__buf_init(&u->out, 0);
        up_close(u);
        break;
    }
    up_connect_new(c, ur, &h);
}

/* Make a new connection for ur, its request head taken from head. */
static void up_connect_new(idem_upstream_t *c, idem_upstream_req_t *ur, idem_buf_t *head)
{
    idem_upconn_t *u = idem_calloc(1, sizeof *u);
    if (!u) {
        idem__buf_cleanup(head);
        fail_later(ur, IDEM_UP_CONNECT_FAILED);
        return;
    }
    u->client = c;
    c->n_conns++;
    u->tls = c->tls_ctx != NULL;
    uv_tcp_init(c->loop, &u->tcp);
    u->tcp.data = u;
    uv_timer_init(c->loop, &u->timer);
    u->timer.data = u;
    idem_list_init(&u->link);
    u->call = ur;
    ur->conn = u;
    u->out = *head;
    idem__buf_init(head, 0);
    u->state = UP_CONNECTING;
    u->connect.data = u;
    if (uv_tcp_connect(&u->connect, &u->tcp, (const struct sockaddr *)&c->addr, on_up_connect) != 0)
        fail_later(ur, IDEM_UP_CONNECT_FAILED);
    else
        uv_timer_start(&u->timer, on_up_timeout, c->timeout_ms, 0);
}

void idem__upstream_req_pause(idem_upstream_req_t *ur)
{
    idem_upconn_t *u = ur->conn;
    if (!u)
        return;
    uv_timer_stop(&u->timer);
    up_pause(u);
}

void idem__upstream_req_resume(idem_upstream_req_t *ur)
{
    idem_upconn_t *u = ur->conn;
    if (!u || !u->paused)
        return;
    u->paused = false;
    ur->relaying = true;
    uv_timer_start(&u->timer, on_up_timeout, u->client->timeout_ms, 0);
    defer(ur, false, IDEM_UP_OK);
}

void idem__upstream_req_cancel(idem_upstream_req_t *ur)
{
    if (!ur->active)
        return;
    idem_upconn_t *u = ur->conn;
    call_end(ur);
    if (u)
        up_close(u);
}

void idem__upstream_req_cleanup(idem_upstream_req_t *ur)
{
    idem_free(ur->resp_head);
    ur->resp_head = NULL;
}
