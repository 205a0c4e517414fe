/* src/gateway/proxy.c - the upstream side of a request: a pool of keep-alive
 * connections per worker, sending a request, reading its response.
 *
 * A request is re-framed on its way up (idem_gw_upstream_head, in the
 * loop-free request_plan.c, which the fuzzer runs too): its decoded body
 * goes with a Content-Length of our own, hop-by-hop fields and Expect are
 * dropped, any Idempotency-Fence the client sent is dropped, and a keyed
 * request gets `Idempotency-Fence: N` for the claim that forwards it.  So
 * the upstream never sees the client's framing, which closes the door to
 * smuggling.
 *
 * Upgrade and Connection are hop-by-hop and never forwarded, so idemd never
 * asks for a protocol switch and a 101 answer is a broken response (502).
 *
 * The response head is parsed with our parser, its body collected into the
 * request up to the capture limit (max_response_bytes).  A body that stays
 * under the limit ends in idem_req_upstream_done; one that passes it ends
 * in idem_req_upstream_overflow, after which reading pauses until the server
 * calls idem_proxy_resume and every further piece goes to the client as it
 * comes (idem_req_stream_data), paced by the client's send queue.
 *
 * A connection that broke or timed out after the request was sent is an
 * unknown outcome, even on a reused keep-alive connection: the upstream may
 * have acted on it, so it is never silently sent again.
 *
 * THREADING: the worker's loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gateway.h"
#include "idem/clock.h"

#define UP_READ_CHUNK (64 * 1024)
#define UP_IDLE_MAX IDEM_UP_IDLE_MAX
/* A pooled connection idle this long is closed by us first: upstreams close
 * idle keep-alive connections too (Node.js after 5 s), and a request sent
 * on one they are closing is an unknown outcome. */
#define UP_IDLE_MS 4000

typedef enum { UP_CONNECTING, UP_HEAD, UP_BODY, UP_IDLE, UP_CLOSED } up_state_t;

struct idem_upconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t connect;
    uv_write_t wr;
    idem_worker_t *w;
    idem_link_t link;       /* in w->idle_up while idle */
    idem_req_t *req;
    idem_buf_t out;         /* the request bytes being written */
    idem_rbuf_t in;         /* the response, read and not yet parsed */
    idem_http_head_state_t hs;
    idem_http_body_t body;
    up_state_t state;
    bool reading;
    bool paused;            /* waiting for the store or for a slow client */
    bool writing;
    bool write_failed;      /* the upstream stopped reading: never reuse */
    int closes;
};

static void up_read_start(idem_upconn_t *u);
static void up_process(idem_upconn_t *u);
static void on_up_timeout(uv_timer_t *t);

/* ---- closing ------------------------------------------------------------ */

static void on_up_closed(uv_handle_t *h)
{
    idem_upconn_t *u = h->data;
    if (--u->closes > 0)
        return;
    idem_buf_cleanup(&u->out);
    free(u->in.data);
    free(u);
}

static void up_close(idem_upconn_t *u)
{
    if (u->state == UP_CLOSED)
        return;
    if (u->state == UP_IDLE) {
        idem_list_remove(&u->link);
        u->w->n_idle_up--;
    }
    u->state = UP_CLOSED;
    u->closes = 2;
    uv_close((uv_handle_t *)&u->tcp, on_up_closed);
    uv_close((uv_handle_t *)&u->timer, on_up_closed);
}

/* Detach u from its request, which fails with why. */
static void up_fail(idem_upconn_t *u, idem_up_result_t why)
{
    idem_req_t *req = u->req;
    u->req = NULL;
    up_close(u);
    if (!req)
        return;
    req->up = NULL;
    if (req->streaming)
        idem_req_stream_end(req, false);
    else
        idem_req_upstream_failed(req, why);
}

/* ---- idle pool ------------------------------------------------------------- */

static void on_idle_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    idem_upconn_t *u = s->data;
    /* An idle connection has nothing to say: any byte or EOF ends it. */
    if (nread != 0)
        up_close(u);
}

static void on_up_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    idem_upconn_t *u = h->data;
    (void)suggested;
    idem_rbuf_alloc(&u->in, UP_READ_CHUNK, buf);
}

static void on_up_idle_timeout(uv_timer_t *t)
{
    up_close(t->data);
}

static void up_to_pool(idem_upconn_t *u)
{
    idem_worker_t *w = u->w;
    u->req = NULL;
    uv_timer_stop(&u->timer);
    if (w->stopping || w->n_idle_up >= UP_IDLE_MAX || u->in.len != 0) {
        up_close(u);
        return;
    }
    u->state = UP_IDLE;
    idem_list_push(&w->idle_up, &u->link);
    w->n_idle_up++;
    if (u->reading)
        uv_read_stop((uv_stream_t *)&u->tcp);
    u->reading = uv_read_start((uv_stream_t *)&u->tcp, on_up_alloc, on_idle_read) == 0;
    uv_timer_start(&u->timer, on_up_idle_timeout, UP_IDLE_MS, 0);
}

void idem_proxy_close_idle(idem_worker_t *w)
{
    while (!idem_list_empty(&w->idle_up))
        up_close(IDEM_CONTAINER(w->idle_up.next, idem_upconn_t, link));
}

/* ---- reading the response ------------------------------------------------ */

static void up_finish(idem_upconn_t *u, bool reusable)
{
    idem_req_t *req = u->req;
    req->up = NULL;
    if (reusable)
        up_to_pool(u);
    else {
        u->req = NULL;
        up_close(u);
    }
    if (req->streaming)
        idem_req_stream_end(req, true);
    else
        idem_req_upstream_done(req);
}

static void up_pause(idem_upconn_t *u)
{
    u->paused = true;
    if (u->reading) {
        uv_read_stop((uv_stream_t *)&u->tcp);
        u->reading = false;
    }
}

static void up_process(idem_upconn_t *u)
{
    idem_req_t *req = u->req;
    while (u->state == UP_HEAD) {
        idem_slice_t method = req->msg.method;
        int rc = idem_http_parse_response(&u->hs, u->in.data, u->in.len, IDEM_HTTP_MAX_HEAD * 4, method,
                                          &req->resp);
        if (rc == IDEM_HTTP_INCOMPLETE)
            return;
        if (rc < 0) {
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return;
        }
        size_t head_len = (size_t)rc;
        memset(&u->hs, 0, sizeof u->hs);
        if (req->resp.status == 101) {
            /* idemd never forwards Upgrade (a hop-by-hop field), so a 101
             * was asked for by no one: what follows it is not HTTP we may
             * store or relay.  A broken response (docs/protocol.md section 7). */
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return;
        }
        if (req->resp.status < 200) {
            /* 100 Continue, 102, 103: interim, the real answer follows. */
            idem_rbuf_consume(&u->in, head_len);
            continue;
        }
        free(req->resp_head);
        req->resp_head = malloc(head_len);
        if (!req->resp_head) {
            up_fail(u, IDEM_UP_BROKEN);
            return;
        }
        memcpy(req->resp_head, u->in.data, head_len);
        idem_http_head_state_t hs = {0};
        rc = idem_http_parse_response(&hs, req->resp_head, head_len, IDEM_HTTP_MAX_HEAD * 4, method,
                                      &req->resp);
        idem_rbuf_consume(&u->in, head_len);
        if (rc <= 0) {
            up_fail(u, IDEM_UP_BAD_RESPONSE);
            return;
        }
        idem_http_body_init(&u->body, &req->resp, 0);
        u->state = UP_BODY;
    }
    if (u->state != UP_BODY || u->paused)
        return;
    size_t off = 0;
    int rc;
    for (;;) {
        size_t used = 0;
        idem_slice_t data = {0};
        rc = idem_http_body_feed(&u->body, u->in.data + off, u->in.len - off, &used, &data);
        off += used;
        if (rc != IDEM_HTTP_BODY_DATA)
            break;
        if (req->streaming) {
            /* While relaying, upstream_timeout bounds each silence (of the
             * upstream, or of a client too slow to take what it sent). */
            uv_timer_start(&u->timer, on_up_timeout, (uint64_t)u->w->gw->cfg->upstream_timeout_ms, 0);
            if (idem_req_stream_data(req, data.ptr, data.len)) {
                idem_rbuf_consume(&u->in, off);
                up_pause(u);
                return;
            }
            continue;
        }
        if (idem_buf_append(&req->resp_body, data.ptr, data.len) != 0) {
            idem_rbuf_consume(&u->in, off);
            up_fail(u, IDEM_UP_BROKEN);
            return;
        }
        if (req->resp_body.len > req->capture_limit) {
            /* Too large to keep: the rest goes straight to the client once
             * the server has recorded the outcome. */
            idem_rbuf_consume(&u->in, off);
            uv_timer_stop(&u->timer);
            up_pause(u);
            idem_req_upstream_overflow(req);
            return;
        }
    }
    idem_rbuf_consume(&u->in, off);
    if (rc == IDEM_HTTP_BODY_DONE) {
        /* Not while our request is still being written to it (the upstream
         * answered early): that write still owns u->wr and u->out. */
        bool reusable = req->resp.keep_alive && u->in.len == 0 &&
                        req->resp.framing != IDEM_HTTP_BODY_EOF && !u->writing &&
                        !u->write_failed;
        up_finish(u, reusable);
        return;
    }
    if (rc < 0)
        up_fail(u, IDEM_UP_BAD_RESPONSE);
}

static void on_up_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    idem_upconn_t *u = s->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (u->state == UP_BODY && nread == UV_EOF && u->body.framing == IDEM_HTTP_BODY_EOF &&
            !u->paused) {
            up_process(u); /* what is buffered first */
            if (u->state == UP_BODY && u->req && idem_http_body_eof(&u->body) == IDEM_HTTP_BODY_DONE) {
                up_finish(u, false);
                return;
            }
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
    if (!u->reading && u->state != UP_CLOSED)
        u->reading = uv_read_start((uv_stream_t *)&u->tcp, on_up_alloc, on_up_read) == 0;
}

static void on_up_timeout(uv_timer_t *t)
{
    idem_upconn_t *u = t->data;
    /* A connection never made means nothing was sent. */
    up_fail(u, u->state == UP_CONNECTING ? IDEM_UP_CONNECT_FAILED : IDEM_UP_TIMEOUT);
}

/* ---- sending the request ------------------------------------------------- */

static void on_up_written(uv_write_t *wr, int status)
{
    idem_upconn_t *u = wr->data;
    u->writing = false;
    idem_buf_cleanup(&u->out);
    if (status < 0 && u->state != UP_CLOSED) {
        /* An upstream may answer (413, say) and stop reading before the
         * body is all sent: its answer is the outcome, so keep reading.  If
         * none comes, the read side sees the break, or the timer fires. */
        u->write_failed = true;
    }
}

/* The head from u->out, the body straight from the request: a body is never
 * copied, so what max_buffered_bytes counts is what is held.  The request
 * outlives the write (it is freed only once u lets go of it, and up_close
 * cancels a write before that). */
static void up_send(idem_upconn_t *u)
{
    const idem_buf_t *body = &u->req->body;
    uv_buf_t b[2] = {uv_buf_init(u->out.data, (unsigned)u->out.len),
                     uv_buf_init(body->data, (unsigned)body->len)};
    u->wr.data = u;
    u->state = UP_HEAD;
    u->paused = false;
    u->write_failed = false;
    memset(&u->hs, 0, sizeof u->hs);
    if (uv_write(&u->wr, (uv_stream_t *)&u->tcp, b, body->len > 0 ? 2 : 1, on_up_written) != 0) {
        up_fail(u, IDEM_UP_BROKEN);
        return;
    }
    u->writing = true;
    uv_timer_start(&u->timer, on_up_timeout, (uint64_t)u->w->gw->cfg->upstream_timeout_ms, 0);
    if (u->reading) {
        uv_read_stop((uv_stream_t *)&u->tcp);
        u->reading = false;
    }
    up_read_start(u);
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
    up_send(u);
}

/* The head of req as the upstream gets it (request_plan.c says what changes
 * on the way), followed on the wire by the decoded body. */
static int build_request(idem_req_t *req, idem_buf_t *out)
{
    const idem_gw_t *gw = req->w->gw;
    idem_gw_request_t rq = idem_req_view(req);
    return idem_gw_upstream_head(out, gw->cfg, gw->upstream_hostport, &rq, req->keyed, req->fence);
}

void idem_proxy_forward(idem_req_t *req)
{
    idem_worker_t *w = req->w;
    idem_upconn_t *u;
    bool fresh = idem_list_empty(&w->idle_up);
    if (!fresh) {
        /* The most recently used connection is the least likely to have
         * been closed by the upstream's idle timeout. */
        idem_link_t *l = w->idle_up.prev;
        idem_list_remove(l);
        w->n_idle_up--;
        u = IDEM_CONTAINER(l, idem_upconn_t, link);
        uv_timer_stop(&u->timer);
        if (u->reading) {
            uv_read_stop((uv_stream_t *)&u->tcp);
            u->reading = false;
        }
    } else {
        u = calloc(1, sizeof *u);
        if (!u) {
            idem_req_upstream_failed(req, IDEM_UP_CONNECT_FAILED);
            return;
        }
        u->w = w;
        uv_tcp_init(&w->loop, &u->tcp);
        u->tcp.data = u;
        uv_timer_init(&w->loop, &u->timer);
        u->timer.data = u;
        idem_list_init(&u->link);
        idem_buf_init(&u->out, 0);
    }
    u->req = req;
    req->up = u;
    idem_buf_init(&u->out, 0);
    if (build_request(req, &u->out) != 0) {
        up_fail(u, IDEM_UP_CONNECT_FAILED);
        return;
    }
    if (!fresh) {
        up_send(u);
        return;
    }
    u->state = UP_CONNECTING;
    u->connect.data = u;
    int rc = uv_tcp_connect(&u->connect, &u->tcp, (const struct sockaddr *)&w->gw->upstream_addr,
                            on_up_connect);
    if (rc != 0)
        up_fail(u, IDEM_UP_CONNECT_FAILED);
    else
        uv_timer_start(&u->timer, on_up_timeout, (uint64_t)w->gw->cfg->upstream_timeout_ms, 0);
}

void idem_proxy_resume(idem_req_t *req)
{
    idem_upconn_t *u = req->up;
    if (!u)
        return;
    u->paused = false;
    uv_timer_start(&u->timer, on_up_timeout, (uint64_t)u->w->gw->cfg->upstream_timeout_ms, 0);
    up_process(u);
    if (u->state == UP_BODY && !u->paused)
        up_read_start(u);
}

void idem_proxy_on_client_drain(idem_req_t *req)
{
    idem_upconn_t *u = req->up;
    if (u && u->paused && req->stream_started)
        idem_proxy_resume(req);
}

void idem_proxy_abort(idem_req_t *req)
{
    idem_upconn_t *u = req->up;
    req->streaming = false;
    if (!u)
        return;
    req->up = NULL;
    u->req = NULL;
    up_close(u);
}
