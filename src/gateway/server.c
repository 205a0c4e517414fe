/* src/gateway/server.c - a worker's loop: client connections and the life of
 * a request.
 *
 * Each worker thread runs one uv_loop_t watching its own dup() of the one
 * listening socket main.c bound (whichever loop accepts first takes the
 * connection; no SO_REUSEPORT, so a second process cannot share the port).
 * A client connection reads and parses one request at a time (pipelined
 * requests wait in the read buffer), refuses a target that is not origin-
 * or absolute-form or whose path has no single reading (docs/protocol.md
 * section 5), buffers its body up to max_request_bytes, and hands the whole
 * request, with its target normalised, to req_dispatch, which follows
 * docs/protocol.md sections 2-7.  Every decision before the store (the
 * refusals, the route, key, scope and fingerprint) is a loop-free step of
 * request_plan.c, called here where the loop gets to it:
 *
 *   route -> key -> scope -> fingerprint -> fast read of the record
 *     completed/mismatch/in-flight: answer at once (no writer round trip)
 *     none/expired lease: CLAIM through the writer (decide + write atomically)
 *       forward (renewing the lease every lease/3) -> upstream outcome
 *       -> COMPLETE / RELEASE / HOLD through the writer (fenced)
 *       -> answer the client only once the outcome is durable.
 *
 * What a client holds is bounded (docs/protocol.md section 11): each
 * connection has one timer, armed for what it waits for (conn_timer): a new
 * connection's first head, or a head once its first byte came
 * (header_timeout, never restarted by later bytes); the next byte of a body
 * (body_timeout); the next request on a keep-alive connection
 * (idle_timeout).  max_connections counts connections across workers, and a
 * request whose client hung up keeps its connection's place until it ends
 * (it still holds an upstream connection).  max_buffered_bytes counts the
 * request body buffers of every worker: a body is charged before it is read
 * (its Content-Length, or a chunked body's buffer as it grows), so a body
 * that does not fit is refused (503) rather than one in progress starved.
 * A request with `Expect: 100-continue` is checked (route, key, budget)
 * before it is invited to send its body; one refused then is answered at
 * once and its connection closed, since its body may follow anyway.
 *
 * INVARIANTS: a request is answered at most once; its store work is finished
 * (completed, released or left to its lease) even when its client has gone;
 * a request is freed only when it has no writer job, no timer and no
 * upstream connection left.
 * THREADING: everything here runs on the worker's loop thread, except the
 * writer's hand-back into w->done (under done_mu).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/gateway.h"
#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/token.h"

#define READ_CHUNK (64 * 1024)
#define CONN_DRAIN_MS 2000        /* after an error answer, reading what the client still sends */
#define STREAM_HIGH_MARK (1u << 20) /* pause the upstream when the client lags this much */
#define WAIT_POLL_MS 25           /* on_conflict: wait re-reads the record this often */
#define RBUF_PAUSE (256 * 1024)   /* stop reading a busy connection past this much pipelined input */
#define WRITE_HIGH_MARK (4u << 20)  /* answers queued to a client that does not read: stop parsing */

typedef enum { CS_HEAD, CS_BODY, CS_BUSY, CS_DRAIN, CS_CLOSED } conn_state_t;

/* What the connection's timer is waiting for. */
typedef enum {
    CT_NONE,  /* nothing: a request is being answered */
    CT_IDLE,  /* a keep-alive connection's next request (idle_timeout) */
    CT_HEAD,  /* the rest of a request head (header_timeout from its start) */
    CT_BODY,  /* the next byte of a request body (body_timeout) */
    CT_DRAIN, /* the end of draining after an error answer */
} conn_timer_t;

struct idem_conn {
    uv_tcp_t tcp;
    idem_worker_t *w;
    idem_link_t link;
    idem_rbuf_t in;    /* unparsed input */
    idem_http_head_state_t hs;
    conn_state_t state;
    idem_http_body_t body;
    idem_req_t *req;   /* the request being read or answered */
    bool reading;
    bool keep_alive;   /* for the response being written */
    bool close_after;  /* close once the queued writes are done */
    size_t queued;     /* bytes in uv_write requests not yet done */
    int writes;        /* uv_write requests not yet done */
    int closes;        /* handles (tcp, timer) whose close callback is pending */
    bool processing;   /* inside conn_process: answers made now loop, not recurse */
    bool peer_eof;     /* the client half-closed after its request: answer, then close */
    bool write_blocked;/* too much queued for a client that does not read: parsing waits */
    bool slot_moved;   /* its max_connections place went to the request that outlived it */
    conn_timer_t waiting; /* what timer is armed for */
    uv_timer_t timer;
};

typedef struct {
    uv_write_t wr;
    idem_conn_t *conn;
    size_t len;
    char data[];
} write_req_t;

static void conn_close(idem_conn_t *c);
static void conn_drain(idem_conn_t *c);
static void conn_timer(idem_conn_t *c, conn_timer_t what);
static void conn_process(idem_conn_t *c);
static void conn_start_reading(idem_conn_t *c);
static void conn_response_done(idem_conn_t *c, bool keep_alive);
static void req_dispatch(idem_req_t *req);
static bool req_check_head(idem_req_t *req);
static bool req_admit_body(idem_req_t *req);
static bool req_charge_body(idem_req_t *req);
static void req_claim(idem_req_t *req);
static void req_refuse(idem_req_t *req, const idem_gw_refusal_t *r);
static void req_maybe_free(idem_req_t *req);
static void on_inline_idle(uv_idle_t *h);
static void worker_maybe_exit(idem_worker_t *w);

static idem_gw_t *req_gw(const idem_req_t *req) { return req->w->gw; }

/* ---- writing to a client ---------------------------------------------- */

static void on_write(uv_write_t *wr, int status)
{
    write_req_t *r = (write_req_t *)wr;
    idem_conn_t *c = r->conn;
    c->queued -= r->len;
    c->writes--;
    free(r);
    if (status < 0 && c->state != CS_CLOSED) {
        conn_close(c);
        return;
    }
    if (c->req && c->req->stream_started && c->queued < STREAM_HIGH_MARK / 2)
        idem_proxy_on_client_drain(c->req);
    if (c->close_after && c->writes == 0 && c->state != CS_CLOSED) {
        conn_close(c);
        return;
    }
    if (c->write_blocked && c->queued < WRITE_HIGH_MARK / 2 && c->state == CS_HEAD) {
        c->write_blocked = false;
        if (!c->peer_eof)
            conn_start_reading(c);
        conn_process(c);
    }
}

void idem_conn_write(idem_conn_t *c, const void *p, size_t n)
{
    if (!c || c->state == CS_CLOSED || n == 0)
        return;
    write_req_t *r = malloc(sizeof *r + n);
    if (!r) {
        conn_close(c);
        return;
    }
    r->conn = c;
    r->len = n;
    memcpy(r->data, p, n);
    uv_buf_t b = uv_buf_init(r->data, (unsigned)n);
    if (uv_write(&r->wr, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        free(r);
        conn_close(c);
        return;
    }
    c->queued += n;
    c->writes++;
}

size_t idem_conn_queue_size(idem_conn_t *c) { return c ? c->queued : 0; }

/* ---- connections --------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    idem_conn_t *c = h->data;
    /* Two handles (tcp and timer) close; free on the second. */
    if (--c->closes > 0)
        return;
    idem_worker_t *w = c->w;
    if (!c->slot_moved)
        atomic_fetch_sub(&w->gw->metrics.connections, 1);
    free(c->in.data);
    free(c);
    worker_maybe_exit(w);
}

static void conn_close(idem_conn_t *c)
{
    if (c->state == CS_CLOSED)
        return;
    conn_state_t was = c->state;
    c->state = CS_CLOSED;
    idem_list_remove(&c->link);
    if (c->req) {
        /* A dispatched request goes on without its client: its outcome is
         * still stored.  One whose body never arrived is simply dropped. */
        idem_req_t *req = c->req;
        c->req = NULL;
        req->conn = NULL;
        /* Its upstream connection is still open: it keeps this one's place
         * in max_connections until it ends (req_free). */
        req->holds_slot = true;
        c->slot_moved = true;
        if (was == CS_BODY || was == CS_HEAD) {
            req->finished = true;
            req->responded = true;
        }
        if (req->streaming)
            idem_proxy_abort(req);
        req_maybe_free(req);
    }
    uv_timer_stop(&c->timer);
    c->closes = 2;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

static void conn_fail(idem_conn_t *c, int status, const char *type, const char *detail);
static void conn_fail_body(idem_conn_t *c, int status, idem_outcome_t outcome, const char *type,
                           const char *detail, int64_t retry_after);

static void on_conn_timer(uv_timer_t *t)
{
    idem_conn_t *c = t->data;
    if (c->state == CS_BUSY || c->state == CS_CLOSED)
        return;
    if (c->waiting == CT_HEAD && c->state == CS_HEAD && c->in.len > 0) {
        /* A head begun and not finished in time: the client hears why. */
        idem_metrics_count(&c->w->gw->metrics, IDEM_OUT_REQUEST_TIMEOUT);
        conn_fail(c, 408, "request-timeout",
                  "the request head did not arrive within header_timeout");
        return;
    }
    if (c->waiting == CT_BODY && c->state == CS_BODY && c->req) {
        conn_fail_body(c, 408, IDEM_OUT_REQUEST_TIMEOUT, "request-timeout",
                       "the request body paused for longer than body_timeout", 0);
        return;
    }
    /* Idle keep-alive, a new connection that sent nothing, or the end of
     * draining after an error: closed without a word (RFC 9112 9.5). */
    conn_close(c);
}

/* Arm the connection's one timer for what it now waits for (see CT_*). */
static void conn_timer(idem_conn_t *c, conn_timer_t what)
{
    const idem_config_t *cfg = c->w->gw->cfg;
    int64_t ms;
    switch (what) {
    case CT_IDLE: ms = cfg->idle_timeout_ms; break;
    case CT_HEAD: ms = cfg->header_timeout_ms; break;
    case CT_BODY: ms = cfg->body_timeout_ms; break;
    case CT_DRAIN: ms = CONN_DRAIN_MS; break;
    default:
        c->waiting = CT_NONE;
        uv_timer_stop(&c->timer);
        return;
    }
    c->waiting = what;
    uv_timer_start(&c->timer, on_conn_timer, (uint64_t)ms, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    idem_conn_t *c = h->data;
    (void)suggested;
    if (c->state == CS_DRAIN) {
        static __thread char sink[16384];
        *buf = uv_buf_init(sink, sizeof sink);
        return;
    }
    idem_rbuf_alloc(&c->in, READ_CHUNK, buf);
}

static void conn_stop_reading(idem_conn_t *c)
{
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    idem_conn_t *c = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread == UV_EOF && c->state == CS_BUSY) {
            /* A client may half-close once its request is sent: it still
             * gets its answer. */
            c->peer_eof = true;
            conn_stop_reading(c);
            return;
        }
        /* EOF or error: a request still being answered keeps running. */
        conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (c->state == CS_DRAIN)
        return;
    c->in.len += (size_t)nread;
    if (c->state == CS_BUSY) {
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

static void conn_start_reading(idem_conn_t *c)
{
    if (!c->reading && c->state != CS_CLOSED) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
            c->reading = true;
    }
}

static void on_shutdown_done(uv_shutdown_t *sd, int status)
{
    (void)status;
    free(sd);
}

/* Take no more requests on c: send FIN once what is queued is out, and read
 * (and drop) what the client may still be sending for a while, so that it
 * sees its answer rather than a reset; then close. */
static void conn_drain(idem_conn_t *c)
{
    if (c->state == CS_CLOSED)
        return;
    c->state = CS_DRAIN;
    c->in.len = 0;
    uv_shutdown_t *sd = malloc(sizeof *sd);
    if (sd && uv_shutdown(sd, (uv_stream_t *)&c->tcp, on_shutdown_done) != 0)
        free(sd);
    conn_start_reading(c);
    conn_timer(c, CT_DRAIN);
}

/* Answer with an error of idemd's own and close the connection (drained). */
static void conn_fail_retry(idem_conn_t *c, int status, const char *type, const char *detail,
                            int64_t retry_after)
{
    idem_buf_t out;
    idem_buf_init(&out, 0);
    if (idem_problem_write(&out, status, type, detail, retry_after, true, false) == 0)
        idem_conn_write(c, out.data, out.len);
    idem_buf_cleanup(&out);
    conn_drain(c);
}

static void conn_fail(idem_conn_t *c, int status, const char *type, const char *detail)
{
    conn_fail_retry(c, status, type, detail, 0);
}

/* The body being read is refused (too large, malformed, too slow, over the
 * budget): its request is dropped before it reached the store, so no key is
 * claimed for it, and the connection ends. */
static void conn_fail_body(idem_conn_t *c, int status, idem_outcome_t outcome, const char *type,
                           const char *detail, int64_t retry_after)
{
    idem_req_t *req = c->req;
    c->req = NULL;
    req->conn = NULL;
    req->finished = true;
    req->responded = true;
    req->status = status;
    req->outcome = outcome;
    req_maybe_free(req);
    conn_fail_retry(c, status, type, detail, retry_after);
}

/* A refusal of the request being read, before it reached the store: counted,
 * answered, and the connection closed (drained). */
static void conn_refuse_request(idem_conn_t *c, const idem_gw_refusal_t *r)
{
    idem_metrics_count(&c->w->gw->metrics, r->outcome);
    conn_fail(c, r->status, r->type, r->detail);
}

/* A request of the head parsed from c->in, with its target normalised.
 * NULL when out of memory, or when the target is refused (*target_rc < 0). */
static idem_req_t *req_create(idem_conn_t *c, size_t head_len, size_t target_len, int *target_rc)
{
    idem_worker_t *w = c->w;
    *target_rc = IDEM_TARGET_OK;
    idem_req_t *req = calloc(1, sizeof *req);
    if (!req)
        return NULL;
    /* The normal form is never longer than the target (+2: '/' for an
     * absolute-form target without path, and the NUL). */
    size_t tcap = target_len + 2;
    req->head = malloc(head_len + tcap);
    if (!req->head) {
        free(req);
        return NULL;
    }
    memcpy(req->head, c->in.data, head_len);
    idem_http_head_state_t hs = {0};
    int rc = idem_http_parse_request(&hs, req->head, head_len, IDEM_HTTP_MAX_HEAD, &req->msg);
    idem_http_target_t t;
    if (rc > 0) {
        char *norm = req->head + head_len;
        *target_rc =
            idem_http_target_normalize(req->msg.target.ptr, req->msg.target.len, norm, tcap, &t);
        req->target = norm;
        req->target_len = t.len;
        req->path_len = t.path_len;
        req->authority = t.authority;
    }
    if (rc <= 0 || *target_rc != IDEM_TARGET_OK) {
        free(req->head);
        free(req);
        return NULL;
    }
    req->w = w;
    req->conn = c;
    req->t_start_ns = idem_clock_mono_ns();
    req->outcome = IDEM_OUT_PASSTHROUGH;
    idem_buf_init(&req->body, w->gw->cfg->max_request_bytes);
    idem_buf_init(&req->resp_body, 0);
    idem_list_push(&w->reqs, &req->link);
    atomic_fetch_add(&w->gw->metrics.in_flight, 1);
    return req;
}

/* Parse and collect as much of the current request as the buffer holds. */
static void conn_process_loop(idem_conn_t *c);

static void conn_process(idem_conn_t *c)
{
    if (c->processing)
        return;
    c->processing = true;
    conn_process_loop(c);
    c->processing = false;
}

static void conn_process_loop(idem_conn_t *c)
{
    idem_worker_t *w = c->w;
    const idem_config_t *cfg = w->gw->cfg;
    for (;;) {
        if (c->state == CS_HEAD) {
            if (c->in.len == 0) {
                if (c->peer_eof)
                    conn_close(c);
                return;
            }
            if (c->queued > WRITE_HIGH_MARK) {
                /* A client that pipelines without reading its answers must
                 * not make us queue them without bound; nor hold us longer
                 * than an idle connection would. */
                c->write_blocked = true;
                conn_stop_reading(c);
                conn_timer(c, CT_IDLE);
                return;
            }
            idem_http_msg_t msg;
            int rc = idem_http_parse_request(&c->hs, c->in.data, c->in.len, IDEM_HTTP_MAX_HEAD, &msg);
            if (rc == IDEM_HTTP_INCOMPLETE) {
                if (c->peer_eof)
                    conn_close(c); /* the rest can never come */
                else if (c->waiting != CT_HEAD)
                    conn_timer(c, CT_HEAD); /* header_timeout from the head's first byte */
                return;
            }
            /* The steps before the store are request_plan.c's, in its order. */
            idem_gw_refusal_t refusal;
            if (rc < 0) {
                idem_gw_refuse_parse(rc, &refusal);
                conn_refuse_request(c, &refusal);
                return;
            }
            size_t head_len = (size_t)rc;
            memset(&c->hs, 0, sizeof c->hs);
            if (!idem_gw_check_head(cfg, &msg, &refusal)) {
                conn_refuse_request(c, &refusal);
                return;
            }
            int target_rc;
            idem_req_t *req = req_create(c, head_len, msg.target.len, &target_rc);
            if (!req && target_rc != IDEM_TARGET_OK) {
                idem_gw_refuse_target(target_rc, &refusal);
                conn_refuse_request(c, &refusal);
                return;
            }
            if (!req) {
                conn_fail(c, 500, "internal", "out of memory");
                return;
            }
            idem_rbuf_consume(&c->in, head_len);
            c->req = req;
            if (req->msg.framing == IDEM_HTTP_BODY_NONE) {
                c->state = CS_BUSY;
                conn_timer(c, CT_NONE);
            } else {
                idem_http_body_init(&c->body, &req->msg, cfg->max_request_bytes);
                c->state = CS_BODY;
                conn_timer(c, CT_BODY);
                /* A client waiting for 100 Continue is invited only once the
                 * head passed every check it can (docs/protocol.md section
                 * 11); refused, it gets its answer and the connection closes. */
                bool invite = req->msg.expect_continue && req->msg.version_minor == 1 &&
                              c->in.len == 0;
                if (invite && !req_check_head(req))
                    return;
                if (!req_admit_body(req))
                    return;
                if (invite)
                    idem_conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
            }
        }
        if (c->state == CS_BODY) {
            idem_req_t *req = c->req;
            size_t off = 0;
            bool over_budget = false;
            int rc;
            for (;;) {
                size_t used = 0;
                idem_slice_t data = {0};
                rc = idem_http_body_feed(&c->body, c->in.data + off, c->in.len - off, &used, &data);
                off += used;
                if (rc == IDEM_HTTP_BODY_DATA) {
                    if (idem_buf_append(&req->body, data.ptr, data.len) != 0) {
                        rc = IDEM_HTTP_E_BODY_TOO_LARGE;
                        break;
                    }
                    if (!req_charge_body(req)) {
                        over_budget = true;
                        break;
                    }
                    continue;
                }
                break;
            }
            idem_rbuf_consume(&c->in, off);
            if (over_budget) {
                conn_fail_body(c, 503, IDEM_OUT_OVERLOADED, "overloaded",
                               "too many request bodies are held at once (max_buffered_bytes); "
                               "send a Content-Length to reserve room, or retry",
                               1);
                return;
            }
            if (rc == IDEM_HTTP_INCOMPLETE) {
                if (c->peer_eof)
                    conn_close(c);
                return;
            }
            if (rc < 0) {
                idem_gw_refusal_t refusal;
                idem_gw_refuse_body(rc, &refusal);
                conn_fail_body(c, refusal.status, refusal.outcome, refusal.type, refusal.detail, 0);
                return;
            }
            c->state = CS_BUSY; /* IDEM_HTTP_BODY_DONE */
            conn_timer(c, CT_NONE);
        }
        if (c->state == CS_BUSY) {
            /* One request at a time: later pipelined ones wait in c->in.
             * The idle timer ignores a busy connection. */
            req_dispatch(c->req);
            /* Answered at once (a replay, an error): go on with what is
             * pipelined behind it, in this loop rather than recursively. */
            if (c->state == CS_HEAD && c->in.len > 0)
                continue;
            return;
        }
        return;
    }
}

/* The response of c->req is wholly queued. */
static void conn_response_done(idem_conn_t *c, bool keep_alive)
{
    if (!c || c->state == CS_CLOSED)
        return;
    idem_req_t *req = c->req;
    c->req = NULL;
    if (req) {
        req->conn = NULL;
        req_maybe_free(req);
    }
    if (c->state == CS_BODY) {
        /* Answered before its body was read (refused at the head): the body
         * may follow anyway, so no later request can be told from it. */
        conn_drain(c);
        return;
    }
    if (!keep_alive || c->w->stopping || (c->peer_eof && c->in.len == 0)) {
        c->close_after = true;
        if (c->writes == 0)
            conn_close(c);
        return;
    }
    c->state = CS_HEAD;
    conn_timer(c, c->in.len > 0 ? CT_HEAD : CT_IDLE);
    /* After a half-close, requests already received are still answered. */
    if (!c->peer_eof)
        conn_start_reading(c);
    if (c->in.len > 0 && !c->processing)
        conn_process(c);
}

/* A place among max_connections (all workers). */
static bool conn_slot_take(idem_gw_t *gw)
{
    uint64_t n = atomic_load(&gw->metrics.connections);
    do {
        if (n >= gw->cfg->max_connections)
            return false;
    } while (!atomic_compare_exchange_weak(&gw->metrics.connections, &n, n + 1));
    return true;
}

/* Over max_connections: accept (a connection left in the kernel's queue
 * would stop the listener) and close at once, saying 503 if the socket
 * takes it without waiting.  The descriptor is back before this returns. */
static void conn_refuse(idem_worker_t *w, uv_stream_t *server)
{
    atomic_fetch_add(&w->gw->metrics.conns_refused, 1);
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t)
        return;
    uv_tcp_init(&w->loop, t);
    if (uv_accept(server, (uv_stream_t *)t) == 0) {
        idem_buf_t out;
        idem_buf_init(&out, 0);
        if (idem_problem_write(&out, 503, "overloaded",
                               "too many connections (max_connections); retry", 1, true,
                               false) == 0) {
            uv_buf_t b = uv_buf_init(out.data, (unsigned)out.len);
            (void)uv_try_write((uv_stream_t *)t, &b, 1);
        }
        idem_buf_cleanup(&out);
    }
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
}

static void on_connection(uv_stream_t *server, int status)
{
    idem_worker_t *w = server->data;
    if (status < 0)
        return;
    if (!conn_slot_take(w->gw)) {
        conn_refuse(w, server);
        return;
    }
    idem_conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        atomic_fetch_sub(&w->gw->metrics.connections, 1);
        return;
    }
    c->w = w;
    uv_tcp_init(&w->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        atomic_fetch_sub(&w->gw->metrics.connections, 1);
        uv_close((uv_handle_t *)&c->tcp, (uv_close_cb)free);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_init(&w->loop, &c->timer);
    c->timer.data = c;
    c->state = CS_HEAD;
    idem_list_push(&w->conns, &c->link);
    /* A new connection's first head must come within header_timeout. */
    conn_timer(c, CT_HEAD);
    conn_start_reading(c);
}

/* ---- answering a request ------------------------------------------------ */

static bool client_keep_alive(const idem_req_t *req)
{
    /* An answer before the body was read ends the connection. */
    return req->msg.keep_alive && !req->w->stopping &&
           !(req->conn != NULL && req->conn->state == CS_BODY);
}

/* Queue buf as the whole response of req and finish the connection's turn. */
static void req_send(idem_req_t *req, idem_buf_t *buf, int status)
{
    req->status = status;
    req->responded = true;
    idem_conn_t *c = req->conn;
    if (c) {
        idem_conn_write(c, buf->data, buf->len);
        conn_response_done(c, client_keep_alive(req));
    } else {
        req_maybe_free(req);
    }
}

static void req_problem(idem_req_t *req, int status, const char *type, const char *detail,
                        int64_t retry_after)
{
    idem_buf_t out;
    idem_buf_init(&out, 0);
    bool ka = client_keep_alive(req);
    if (idem_problem_write(&out, status, type, detail, retry_after, !ka,
                           ka && req->msg.version_minor == 0) == 0) {
        if (idem_slice_eq_ci(req->msg.method, "HEAD")) {
            /* The answer to HEAD is the head alone (its Content-Length is still the body's). */
            const char *end = memmem(out.data, out.len, "\r\n\r\n", 4);
            if (end != NULL)
                out.len = (size_t)(end - out.data) + 4;
        }
        req_send(req, &out, status);
    } else {
        /* Out of memory: the client must not wait for an answer forever. */
        req->status = status;
        req->responded = true;
        if (req->conn)
            conn_close(req->conn);
        else
            req_maybe_free(req);
    }
    idem_buf_cleanup(&out);
}

static void write_connection_header(const idem_req_t *req, idem_buf_t *out)
{
    if (!client_keep_alive(req))
        idem_buf_append_str(out, "Connection: close\r\n");
    else if (req->msg.version_minor == 0)
        idem_buf_append_str(out, "Connection: keep-alive\r\n");
}

/* Replay a stored response (docs/protocol.md section 6, completed). */
static void req_replay(idem_req_t *req, const idem_record_t *rec)
{
    const idem_response_t *r = &rec->response;
    const idem_config_t *cfg = req_gw(req)->cfg;
    idem_buf_t out;
    idem_buf_init(&out, 0);
    idem_http_write_status(&out, r->status);
    for (size_t i = 0; i < r->n_headers; i++)
        idem_http_write_field(&out, r->headers[i].name, r->headers[i].name_len, r->headers[i].value,
                              r->headers[i].value_len);
    idem_buf_appendf(&out, "%s: true\r\n", cfg->replay_header);
    bool bodiless = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    if (!bodiless)
        idem_buf_appendf(&out, "Content-Length: %zu\r\n", r->body_len);
    write_connection_header(req, &out);
    idem_buf_append_str(&out, "\r\n");
    if (!bodiless && !idem_slice_eq_ci(req->msg.method, "HEAD"))
        idem_buf_append(&out, r->body, r->body_len);
    req_send(req, &out, r->status);
    idem_buf_cleanup(&out);
}

/* The upstream's captured response, relayed as the client's answer. */
static void req_respond_upstream(idem_req_t *req)
{
    idem_buf_t out;
    idem_buf_init(&out, 0);
    const idem_http_msg_t *m = &req->resp;
    bool head_req = idem_slice_eq_ci(req->msg.method, "HEAD");
    bool bodiless = m->framing == IDEM_HTTP_BODY_NONE;
    idem_buf_appendf(&out, "HTTP/1.1 %d %.*s\r\n", m->status, (int)m->reason.len, m->reason.ptr);
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (idem_http_is_hop_by_hop(m, f->name))
            continue;
        /* A bodiless answer keeps the upstream's Content-Length (HEAD tells the
         * size of what GET would send); otherwise ours replaces it. */
        if (idem_slice_eq_ci(f->name, "Content-Length") && !(bodiless && head_req))
            continue;
        idem_http_write_field(&out, f->name.ptr, f->name.len, f->value.ptr, f->value.len);
    }
    if (req->bypassed)
        idem_buf_append_str(&out, "Idempotency-Bypassed: store-unavailable\r\n");
    if (!bodiless)
        idem_buf_appendf(&out, "Content-Length: %zu\r\n", req->resp_body.len);
    write_connection_header(req, &out);
    idem_buf_append_str(&out, "\r\n");
    if (!bodiless && !head_req)
        idem_buf_append(&out, req->resp_body.data, req->resp_body.len);
    req_send(req, &out, m->status);
    idem_buf_cleanup(&out);
}

/* Answer as a repeat of req would be answered, from the decision on rec. */
static void req_answer_decision(idem_req_t *req, idem_decision_t d, const idem_record_t *rec)
{
    switch (d.kind) {
    case IDEM_DECIDE_REPLAY:
        req->outcome = IDEM_OUT_REPLAY;
        req->fence = rec->fence;
        req_replay(req, rec);
        break;
    case IDEM_DECIDE_MISMATCH:
        req->outcome = IDEM_OUT_MISMATCH;
        req_problem(req, 422, "key-reused",
                    "this Idempotency-Key was used with a different request", 0);
        break;
    case IDEM_DECIDE_IN_FLIGHT:
        req->outcome = IDEM_OUT_IN_FLIGHT;
        req_problem(req, 409, "in-flight",
                    "a request with this Idempotency-Key is still being processed", d.retry_after_s);
        break;
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        req->outcome = IDEM_OUT_OUTCOME_UNKNOWN;
        req_problem(req, 409, "upstream-outcome-unknown",
                    "the outcome of the first request with this key is unknown; an operator "
                    "must remove the key before it can run again",
                    d.retry_after_s);
        break;
    case IDEM_DECIDE_NOT_RETAINED:
        req->outcome = IDEM_OUT_NOT_RETAINED;
        req_problem(req, 409, "response-not-retained",
                    "the first response with this key was too large to keep; it is not run again",
                    0);
        break;
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        /* Only reachable when a stale owner re-reads: the key is free again
         * but this request already ran, so it must not run again here. */
        req->outcome = IDEM_OUT_IN_FLIGHT;
        req_problem(req, 409, "in-flight", "the lease on this key was lost; retry", 1);
        break;
    }
}

static void req_store_unavailable(idem_req_t *req, const char *detail)
{
    req->outcome = IDEM_OUT_STORE_ERROR;
    req_problem(req, 503, "store-unavailable", detail, 1);
}

/* ---- reading the store ------------------------------------------------------ */

idem_err_t idem_gw_store_get(idem_gw_t *gw, const idem_key_id_t *id, int64_t now_ms,
                             idem_record_t *rec)
{
    atomic_fetch_add_explicit(&gw->metrics.store_gets, 1, memory_order_relaxed);
    return idem_store_get(gw->store, id, now_ms, rec);
}

/* A completed record came from the store or was just written: keep it for
 * the next repeat (local_cache). */
static void req_cache_record(idem_req_t *req, const idem_record_t *rec)
{
    if (rec->state == IDEM_STATE_COMPLETED)
        idem_cache_put(req_gw(req)->cache, &req->id, rec);
}

/* ---- the writer round trip ------------------------------------------------ */

void idem_worker_submit(idem_worker_t *w, idem_wjob_t *job)
{
    job->worker = w;
    if (w->inline_store) {
        /* Applied at the end of this loop turn (log_check), or at the start
         * of the next (inline_idle) when queued outside the I/O phase. */
        idem_list_push(&w->inline_q, &job->link);
        uv_idle_start(&w->inline_idle, on_inline_idle);
        return;
    }
    idem_writer_submit(&w->gw->writer, job);
}

static void req_submit(idem_req_t *req, idem_wjob_t *job, idem_wjob_cb cb)
{
    job->cb = cb;
    job->data = req;
    req->pending_jobs++;
    idem_worker_submit(req->w, job);
}

static void job_init(idem_req_t *req, idem_wjob_t *job, idem_op_kind_t kind)
{
    memset(&job->op, 0, sizeof job->op);
    job->op.kind = kind;
    job->op.id = req->id;
    job->op.fence = req->fence;
}

/* A job is back from the store: run its callback on this loop. */
static void job_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    req->pending_jobs--;
    job->cb(job);
    req_maybe_free(req);
}

/* Apply this loop's queued jobs, a batch per transaction.  Callbacks may
 * queue more (a release after a failed connect); a few rounds take those
 * too, the idle handle the rest. */
static void run_inline(idem_worker_t *w)
{
    for (int round = 0; round < 4 && !idem_list_empty(&w->inline_q); round++) {
        idem_wjob_t *jobs[IDEM_JOBS_BATCH_MAX];
        size_t n = 0;
        while (!idem_list_empty(&w->inline_q) && n < IDEM_JOBS_BATCH_MAX) {
            idem_link_t *l = w->inline_q.next;
            idem_list_remove(l);
            jobs[n++] = IDEM_CONTAINER(l, idem_wjob_t, link);
        }
        idem_jobs_apply(w->gw->store, &w->gw->metrics, jobs, n);
        for (size_t i = 0; i < n; i++)
            job_done(jobs[i]);
    }
    if (idem_list_empty(&w->inline_q))
        uv_idle_stop(&w->inline_idle);
}

static void on_inline_idle(uv_idle_t *h)
{
    run_inline(h->data);
}

static void on_done_async(uv_async_t *a)
{
    idem_worker_t *w = a->data;
    idem_link_t done;
    idem_list_init(&done);
    pthread_mutex_lock(&w->done_mu);
    if (!idem_list_empty(&w->done)) {
        done.next = w->done.next;
        done.prev = w->done.prev;
        done.next->prev = &done;
        done.prev->next = &done;
        idem_list_init(&w->done);
    }
    pthread_mutex_unlock(&w->done_mu);
    while (!idem_list_empty(&done)) {
        idem_link_t *l = done.next;
        idem_list_remove(l);
        job_done(IDEM_CONTAINER(l, idem_wjob_t, link));
    }
}

/* ---- lease renewal ---------------------------------------------------------- */

static void on_renew_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    req->renew_busy = false;
    if (job->batch_err == IDEM_OK && job->op.err == IDEM_OK)
        req->lease_until_ms = job->op.lease_until_ms;
    if (job->batch_err == IDEM_OK && job->op.err == IDEM_E_FENCE && req->renewing)
        idem_log(req->w->gw, "warn", "lease on key %s was lost while its request ran",
                 req->id.key);
}

static void on_renew_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    if (req->renew_busy || !req->renewing)
        return;
    job_init(req, &req->renew_job, IDEM_OP_RENEW);
    req->renew_job.op.lease_until_ms = idem_clock_now(NULL) + req->policy->lease_ms;
    req->renew_busy = true;
    req_submit(req, &req->renew_job, on_renew_done);
}

/* The request's timer (renewal, or polling while waiting), made on first use:
 * most requests never need one. */
static void req_timer_start(idem_req_t *req, uv_timer_cb cb, uint64_t timeout, uint64_t repeat)
{
    if (!req->timer_open) {
        uv_timer_init(&req->w->loop, &req->timer);
        req->timer.data = req;
        req->timer_open = true;
    }
    uv_timer_start(&req->timer, cb, timeout, repeat);
}

static void req_start_renewing(idem_req_t *req)
{
    uint64_t every = (uint64_t)(req->policy->lease_ms / 3);
    if (every < 10)
        every = 10;
    req->renewing = true;
    req_timer_start(req, on_renew_timer, every, every);
}

static void req_stop_renewing(idem_req_t *req)
{
    if (req->renewing) {
        req->renewing = false;
        if (req->timer_open)
            uv_timer_stop(&req->timer);
    }
}

/* ---- the upstream's outcome ------------------------------------------------- */

static bool is_release_status(const idem_policy_t *p, int status)
{
    for (size_t i = 0; i < p->n_release_statuses; i++)
        if (p->release_statuses[i] == status)
            return true;
    return false;
}

/* The record was taken over while this request ran: answer as a repeat. */
static void req_answer_as_repeat(idem_req_t *req)
{
    idem_record_t rec;
    int64_t now = idem_clock_now(NULL);
    idem_err_t err = idem_gw_store_get(req_gw(req), &req->id, now, &rec);
    if (err == IDEM_OK) {
        idem_decision_t d = idem_decide(&rec, req->fp, now);
        req_answer_decision(req, d, &rec);
        idem_record_cleanup(&rec);
    } else if (err == IDEM_E_NOTFOUND) {
        req->outcome = IDEM_OUT_IN_FLIGHT;
        req_problem(req, 409, "in-flight", "the lease on this key was lost; retry", 1);
    } else {
        req_store_unavailable(req, "the store did not answer");
    }
}

static void req_start_stream(idem_req_t *req);

/* Our completion was written: keep the record for repeats (local_cache). */
static void req_cache_completion(idem_req_t *req, const idem_wjob_t *job)
{
    if (job->op.kind != IDEM_OP_COMPLETE || req_gw(req)->cache == NULL)
        return;
    idem_record_t done = {
        .state = IDEM_STATE_COMPLETED,
        .flags = job->op.flags,
        .fence = req->fence,
        .expires_at_ms = job->op.expires_at_ms,
        .response = req->store_resp,
    };
    memcpy(done.fingerprint, req->fp, IDEM_FP_LEN);
    req_cache_record(req, &done);
}

static void on_outcome_stored(idem_wjob_t *job);

#define COMPLETE_RETRY_FIRST_MS 100
#define COMPLETE_RETRY_MAX_MS 2000

static void on_complete_retry_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    req_submit(req, &req->job, on_outcome_stored);
}

/* The upstream answered but the store refused the completion: answer the
 * client now (503), and keep offering the completion to the store while our
 * lease lasts.  No one else can claim the key before the lease ends, so if
 * the store comes back in time the record is completed as if nothing had
 * happened and a retry (409 until then) gets the replay; only an outage
 * longer than the lease leaves the key to run again (docs/guarantees.md). */
static void req_complete_later(idem_req_t *req, idem_err_t err)
{
    if (!req->responded) {
        idem_log(req->w->gw, "error",
                 "could not store the outcome of key %s: %s; retrying while the lease lasts",
                 req->id.key, idem_strerror(err));
        if (req->streaming)
            idem_proxy_abort(req);
        req_store_unavailable(req, "the upstream answered but its response could not be recorded "
                                   "yet; a retry gets the recorded answer once the store is back");
        /* Counted now, not when the retries end a lease later. */
        idem_metrics_count(&req_gw(req)->metrics, req->outcome);
        req->counted = true;
    }
    int64_t delay = COMPLETE_RETRY_FIRST_MS << (req->complete_tries < 5 ? req->complete_tries : 5);
    if (delay > COMPLETE_RETRY_MAX_MS)
        delay = COMPLETE_RETRY_MAX_MS;
    req->complete_tries++;
    if (req->w->stopping || idem_clock_now(NULL) + delay >= req->lease_until_ms) {
        idem_log(req->w->gw, "error",
                 "gave up storing the outcome of key %s after %d tries: it stays in progress "
                 "until its lease ends", req->id.key, req->complete_tries);
        req->finished = true;
        req_maybe_free(req);
        return;
    }
    req_timer_start(req, on_complete_retry_timer, (uint64_t)delay, 0);
}

static void on_outcome_stored(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    if (job->batch_err != IDEM_OK && job->op.kind == IDEM_OP_COMPLETE) {
        req_complete_later(req, job->batch_err);
        return;
    }
    req->finished = true;
    if (req->responded) {
        /* A late completion after a store failure: the client has its 503. */
        if (job->batch_err == IDEM_OK && job->op.err == IDEM_OK) {
            idem_log(req->w->gw, "info", "stored the outcome of key %s after %d tries",
                     req->id.key, req->complete_tries + 1);
            req_cache_completion(req, job);
        }
        req_maybe_free(req);
        return;
    }
    if (job->batch_err != IDEM_OK) {
        idem_log(req->w->gw, "error", "could not store the outcome of key %s: %s", req->id.key,
                 idem_strerror(job->batch_err));
        if (req->streaming)
            idem_proxy_abort(req);
        req_store_unavailable(req, "the upstream answered but its response could not be recorded");
        return;
    }
    if (job->op.err == IDEM_E_FENCE) {
        if (req->streaming)
            idem_proxy_abort(req);
        req_answer_as_repeat(req);
        return;
    }
    req_cache_completion(req, job);
    if (req->streaming)
        req_start_stream(req);
    else
        req_respond_upstream(req);
}

/* Build the list of response headers that a replay repeats. */
static int req_collect_store_headers(idem_req_t *req)
{
    const idem_http_msg_t *m = &req->resp;
    req->store_headers = calloc(m->n_fields ? m->n_fields : 1, sizeof *req->store_headers);
    if (!req->store_headers)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (idem_http_is_hop_by_hop(m, f->name) || idem_slice_eq_ci(f->name, "Content-Length"))
            continue;
        req->store_headers[n++] = (idem_header_t){f->name.ptr, f->name.len, f->value.ptr, f->value.len};
    }
    req->n_store_headers = n;
    return 0;
}

/* Record the upstream's answer (fenced), then answer the client. */
static void req_store_outcome(idem_req_t *req, bool retained)
{
    const idem_policy_t *p = req->policy;
    int status = req->resp.status;
    req_stop_renewing(req);
    int64_t now = idem_clock_now(NULL);
    if (is_release_status(p, status)) {
        job_init(req, &req->job, IDEM_OP_RELEASE);
        req_submit(req, &req->job, on_outcome_stored);
        return;
    }
    if (req_collect_store_headers(req) != 0) {
        req->finished = true;
        if (req->streaming)
            idem_proxy_abort(req);
        req_store_unavailable(req, "out of memory");
        return;
    }
    idem_response_t *resp = &req->store_resp;
    resp->status = status;
    resp->headers = req->store_headers;
    resp->n_headers = req->n_store_headers;
    if (retained) {
        resp->body = (const uint8_t *)req->resp_body.data;
        resp->body_len = req->resp_body.len;
    }
    job_init(req, &req->job, IDEM_OP_COMPLETE);
    req->job.op.response = resp;
    req->job.op.flags = retained ? 0 : IDEM_REC_NOT_RETAINED;
    req->job.op.expires_at_ms = now + (status >= 500 ? p->failure_ttl_ms : p->key_ttl_ms);
    req_submit(req, &req->job, on_outcome_stored);
}

static void req_give_token_back(idem_req_t *req);

void idem_req_upstream_done(idem_req_t *req)
{
    idem_hist_observe(&req_gw(req)->metrics.upstream_latency, idem_clock_mono_ns() - req->t_up_ns);
    if (req->token_spent && is_release_status(req->policy, req->resp.status)) {
        req_give_token_back(req);
        return;
    }
    if (!req->keyed) {
        req->finished = true;
        req_respond_upstream(req);
        return;
    }
    req_store_outcome(req, true);
}

void idem_req_upstream_overflow(idem_req_t *req)
{
    req->streaming = true;
    if (req->token_spent && is_release_status(req->policy, req->resp.status)) {
        req_give_token_back(req);
        return;
    }
    if (!req->keyed) {
        req->finished = true;
        req_start_stream(req);
        return;
    }
    req_store_outcome(req, false);
}

/* The answer to a request whose upstream call failed (docs/protocol.md section 7). */
static void req_answer_failure(idem_req_t *req, idem_up_result_t why)
{
    if (why == IDEM_UP_CONNECT_FAILED)
        req_problem(req, 502, "upstream-unreachable", "could not connect to the upstream", 0);
    else if (why == IDEM_UP_TIMEOUT)
        req_problem(req, 504, "upstream-outcome-unknown",
                    "the upstream did not answer within upstream_timeout; the request may "
                    "or may not have taken effect",
                    0);
    else
        req_problem(req, 502, "upstream-outcome-unknown",
                    why == IDEM_UP_BAD_RESPONSE
                        ? "the upstream's answer was not valid HTTP; the request may or may not "
                          "have taken effect"
                        : "the connection to the upstream broke before a whole response; the "
                          "request may or may not have taken effect",
                    0);
}

/* A release (nothing sent) or hold (outcome unknown) was applied: only now
 * is the client answered, so that a retry after the answer finds the key
 * free (release) or held (hold), never still in flight. */
static void on_failure_recorded(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    req->finished = true;
    if (job->batch_err != IDEM_OK) {
        /* The key is left in progress (a retry gets 409 until its lease
         * ends) and a hold was not written: say so rather than 502/504. */
        idem_log(req->w->gw, "error", "could not record the failure of key %s: %s", req->id.key,
                 idem_strerror(job->batch_err));
        req_store_unavailable(req, "the upstream call failed and the store could not record it");
        return;
    }
    req_answer_failure(req, req->up_result);
}

void idem_req_upstream_failed(idem_req_t *req, idem_up_result_t why)
{
    req_stop_renewing(req);
    req->up_result = why;
    req->outcome = why == IDEM_UP_CONNECT_FAILED ? IDEM_OUT_UPSTREAM_UNREACHABLE
                                                 : IDEM_OUT_OUTCOME_UNKNOWN;
    if (req->token_spent && why == IDEM_UP_CONNECT_FAILED) {
        req_give_token_back(req);
        return;
    }
    if (req->keyed && why == IDEM_UP_CONNECT_FAILED) {
        /* Nothing was sent: the key is free to run again. */
        job_init(req, &req->job, IDEM_OP_RELEASE);
        req_submit(req, &req->job, on_failure_recorded);
        return;
    }
    if (req->keyed && req->policy->on_unknown_outcome == IDEM_UNKNOWN_HOLD) {
        int64_t now = idem_clock_now(NULL);
        job_init(req, &req->job, IDEM_OP_HOLD);
        req->job.op.lease_until_ms = now + req->policy->key_ttl_ms;
        req->job.op.expires_at_ms = now + req->policy->key_ttl_ms;
        req_submit(req, &req->job, on_failure_recorded);
        return;
    }
    /* Not keyed, or expire: the record stays in_progress until its lease
     * runs out, and nothing needs writing. */
    req->finished = true;
    req_answer_failure(req, why);
}

/* ---- streaming a response over the capture limit --------------------------- */

static void req_start_stream(idem_req_t *req)
{
    idem_conn_t *c = req->conn;
    if (!c) {
        idem_proxy_abort(req);
        req_maybe_free(req);
        return;
    }
    const idem_http_msg_t *m = &req->resp;
    idem_buf_t out;
    idem_buf_init(&out, 0);
    idem_buf_appendf(&out, "HTTP/1.1 %d %.*s\r\n", m->status, (int)m->reason.len, m->reason.ptr);
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (idem_http_is_hop_by_hop(m, f->name) || idem_slice_eq_ci(f->name, "Content-Length"))
            continue;
        idem_http_write_field(&out, f->name.ptr, f->name.len, f->value.ptr, f->value.len);
    }
    if (req->bypassed)
        idem_buf_append_str(&out, "Idempotency-Bypassed: store-unavailable\r\n");
    if (m->framing == IDEM_HTTP_BODY_LENGTH) {
        idem_buf_appendf(&out, "Content-Length: %llu\r\n", (unsigned long long)m->content_length);
        write_connection_header(req, &out);
    } else if (req->msg.version_minor == 1) {
        req->stream_chunked = true;
        idem_buf_append_str(&out, "Transfer-Encoding: chunked\r\n");
        write_connection_header(req, &out);
    } else {
        req->stream_close = true;
        idem_buf_append_str(&out, "Connection: close\r\n");
    }
    idem_buf_append_str(&out, "\r\n");
    req->status = m->status;
    req->responded = true;
    req->stream_started = true;
    idem_conn_write(c, out.data, out.len);
    idem_buf_cleanup(&out);
    if (req->resp_body.len)
        idem_req_stream_data(req, req->resp_body.data, req->resp_body.len);
    idem_buf_cleanup(&req->resp_body);
    idem_proxy_resume(req);
}

bool idem_req_stream_data(idem_req_t *req, const char *p, size_t n)
{
    idem_conn_t *c = req->conn;
    if (!c)
        return false;
    if (req->stream_chunked) {
        idem_buf_t out;
        idem_buf_init(&out, 0);
        idem_http_write_chunk(&out, p, n);
        idem_conn_write(c, out.data, out.len);
        idem_buf_cleanup(&out);
    } else {
        idem_conn_write(c, p, n);
    }
    return idem_conn_queue_size(c) > STREAM_HIGH_MARK;
}

void idem_req_stream_end(idem_req_t *req, bool complete)
{
    req->streaming = false;
    req->stream_started = false;
    idem_conn_t *c = req->conn;
    if (!c) {
        req_maybe_free(req);
        return;
    }
    if (!complete) {
        /* The body was cut short: the client must see that, not a short body. */
        c->req = NULL;
        req->conn = NULL;
        c->close_after = true;
        if (c->writes == 0)
            conn_close(c);
        req_maybe_free(req);
        return;
    }
    if (req->stream_chunked)
        idem_conn_write(c, "0\r\n\r\n", 5);
    conn_response_done(c, client_keep_alive(req) && !req->stream_close);
}

/* ---- dispatch: docs/protocol.md sections 2-7 ------------------------------ */

static void req_forward(idem_req_t *req)
{
    req->t_up_ns = idem_clock_mono_ns();
    const idem_policy_t *p = req->policy;
    req->capture_limit = p->max_response_bytes;
    idem_proxy_forward(req);
}

static void req_passthrough(idem_req_t *req)
{
    req->keyed = false;
    req->finished = false;
    if (req->outcome != IDEM_OUT_BYPASSED)
        req->outcome = IDEM_OUT_PASSTHROUGH;
    req_forward(req);
}

static void on_store_error(idem_req_t *req, idem_err_t err)
{
    if (req_gw(req)->cfg->on_store_error == IDEM_STORE_ERR_OPEN) {
        req->bypassed = true;
        req->outcome = IDEM_OUT_BYPASSED;
        req_passthrough(req);
        return;
    }
    req->finished = true;
    req_store_unavailable(req, err == IDEM_E_STORE_FULL ? "the idempotency store is full"
                                                        : "the idempotency store did not answer");
}

static void on_wait_timer(uv_timer_t *t);

/* A repeat found its key in flight. */
static void req_in_flight(idem_req_t *req, idem_decision_t d)
{
    int64_t now = idem_clock_now(NULL);
    if (req->policy->on_conflict == IDEM_CONFLICT_WAIT && d.kind == IDEM_DECIDE_IN_FLIGHT) {
        if (req->wait_deadline_ms == 0)
            req->wait_deadline_ms = now + req->policy->wait_timeout_ms;
        if (now < req->wait_deadline_ms && !req->w->stopping) {
            req_timer_start(req, on_wait_timer, WAIT_POLL_MS, 0);
            return;
        }
        /* Waited long enough: answer in-flight with the time left. */
    }
    req->finished = true;
    req_answer_decision(req, d, NULL);
}

static void on_claim_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    if (job->batch_err != IDEM_OK) {
        idem_log(req->w->gw, "error", "store: %s", idem_strerror(job->batch_err));
        on_store_error(req, job->batch_err);
        return;
    }
    idem_decision_t d = job->op.decision;
    /* Take the record out of the job first: acting on the decision may
     * queue the same job again (a release after a failed connect). */
    idem_record_t rec = job->op.record;
    memset(&job->op.record, 0, sizeof job->op.record);
    switch (d.kind) {
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        req->fence = d.fence;
        req->outcome = d.kind == IDEM_DECIDE_CLAIM ? IDEM_OUT_NEW : IDEM_OUT_TAKEOVER;
        if (req->wait_deadline_ms)
            req->outcome = IDEM_OUT_NEW;
        req_start_renewing(req);
        req_forward(req);
        break;
    case IDEM_DECIDE_IN_FLIGHT:
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        req_in_flight(req, d);
        break;
    default:
        if (d.kind == IDEM_DECIDE_REPLAY)
            req_cache_record(req, &rec);
        req->finished = true;
        req_answer_decision(req, d, &rec);
        break;
    }
    idem_record_cleanup(&rec);
}

static void req_claim(idem_req_t *req)
{
    const idem_policy_t *p = req->policy;
    int64_t now = idem_clock_now(NULL);
    job_init(req, &req->job, IDEM_OP_CLAIM);
    memcpy(req->job.op.fp, req->fp, IDEM_FP_LEN);
    req->job.op.now_ms = now;
    req->job.op.lease_until_ms = now + p->lease_ms;
    req->job.op.expires_at_ms = now + p->key_ttl_ms;
    req->lease_until_ms = req->job.op.lease_until_ms;
    req_submit(req, &req->job, on_claim_done);
}

/* Read the record without the writer: most repeats end here.  A completed
 * record in local_cache answers without the store; a network store is not
 * read here at all (that would block this loop on a round trip): the claim,
 * which the writer sends anyway, decides and brings back what a read would. */
static void req_lookup(idem_req_t *req)
{
    idem_record_t rec;
    idem_gw_t *gw = req_gw(req);
    int64_t now = idem_clock_now(NULL);
    if (idem_cache_get(gw->cache, &req->id, now, &rec) == IDEM_OK) {
        idem_decision_t d = idem_decide(&rec, req->fp, now);
        atomic_fetch_add_explicit(&gw->metrics.cache_hits, 1, memory_order_relaxed);
        req->finished = true;
        req_answer_decision(req, d, &rec);
        idem_record_cleanup(&rec);
        return;
    }
    if (!idem_store_reads_are_local(gw->store)) {
        req_claim(req);
        return;
    }
    idem_err_t err = idem_gw_store_get(gw, &req->id, now, &rec);
    if (err == IDEM_E_NOTFOUND) {
        req_claim(req);
        return;
    }
    if (err != IDEM_OK) {
        on_store_error(req, err);
        return;
    }
    idem_decision_t d = idem_decide(&rec, req->fp, now);
    if (idem_decision_forwards(d.kind)) {
        idem_record_cleanup(&rec);
        req_claim(req); /* the writer decides again, atomically */
        return;
    }
    if (d.kind == IDEM_DECIDE_IN_FLIGHT || d.kind == IDEM_DECIDE_IN_FLIGHT_UNKNOWN) {
        idem_record_cleanup(&rec);
        req_in_flight(req, d);
        return;
    }
    req_cache_record(req, &rec);
    req->finished = true;
    req_answer_decision(req, d, &rec);
    idem_record_cleanup(&rec);
}

static void on_wait_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    req_lookup(req);
}

static int req_fingerprint(idem_req_t *req)
{
    idem_gw_request_t rq = idem_req_view(req);
    return idem_gw_fingerprint(req->policy, &rq, req->fp) == IDEM_OK ? 0 : -1;
}

/* The caller's scope (docs/protocol.md section 3, scope.h) into out
 * (IDEM_SCOPE_MAX + 1 bytes), then its share of scope_rate_limit.  When the
 * request may not go on it is answered here (400 ambiguous-scope, 429
 * rate-limited, 500 out of memory) and false is returned. */
static bool req_scope_admit(idem_req_t *req, char *out)
{
    idem_gw_t *gw = req_gw(req);
    const idem_config_t *cfg = gw->cfg;
    const char *dup = NULL;
    idem_scope_result_t rc =
        idem_gw_scope_compute(cfg->scope, cfg->n_scope, cfg->scope_header, &req->msg, out, &dup);
    if (rc == IDEM_SCOPE_FALLBACK_AUTHORIZATION)
        atomic_fetch_add_explicit(&gw->metrics.scope_fallback_authorization, 1,
                                  memory_order_relaxed);
    else if (rc == IDEM_SCOPE_FALLBACK_ANONYMOUS)
        atomic_fetch_add_explicit(&gw->metrics.scope_fallback_anonymous, 1, memory_order_relaxed);
    idem_gw_refusal_t refusal;
    if (idem_gw_refuse_scope(rc, dup, &refusal)) {
        req_refuse(req, &refusal);
        return false;
    }
    int64_t retry_after = 0;
    if (!idem_ratelimit_take(gw->ratelimit, out, idem_clock_mono_ns(), &retry_after)) {
        req->finished = true;
        req->outcome = IDEM_OUT_RATE_LIMITED;
        req_problem(req, 429, "rate-limited",
                    "this caller sent more keyed requests and token issues than "
                    "scope_rate_limit allows; retry after Retry-After seconds",
                    retry_after);
        return false;
    }
    return true;
}

/* ---- prevention tokens (docs/protocol.md section 8) ----------------------- */

/* A response idemd makes itself with a JSON body (body_type says which). */
static void req_send_json(idem_req_t *req, int status, const char *body_type, const char *body,
                          const char *extra_headers)
{
    idem_buf_t out;
    size_t blen = strlen(body);
    idem_buf_init(&out, 0);
    idem_http_write_status(&out, status);
    idem_buf_appendf(&out, "Content-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n%s",
                     body_type, blen, extra_headers);
    write_connection_header(req, &out);
    idem_buf_append_str(&out, "\r\n");
    if (!idem_slice_eq_ci(req->msg.method, "HEAD"))
        idem_buf_append(&out, body, blen);
    req_send(req, &out, status);
    idem_buf_cleanup(&out);
}

/* A refusal of the loop-free steps (request_plan.h) after the request was
 * made: its store work is done (there was none), its outcome set, and it is
 * answered. */
static void req_refuse(idem_req_t *req, const idem_gw_refusal_t *r)
{
    req->finished = true;
    if (r->outcome != IDEM_OUT__COUNT)
        req->outcome = r->outcome;
    if (!r->allow_post) {
        req_problem(req, r->status, r->type, r->detail, 0);
        return;
    }
    char *body = idem_problem_body(r->status, r->type, r->detail);
    if (body == NULL) {
        req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    req_send_json(req, r->status, "application/problem+json", body, "Allow: POST\r\n");
    free(body);
}

static void on_token_issued(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    const idem_config_t *cfg = req_gw(req)->cfg;
    req->finished = true;
    if (job->batch_err != IDEM_OK) {
        idem_log(req->w->gw, "error", "store: could not issue a token: %s",
                 idem_strerror(job->batch_err));
        req_store_unavailable(req, job->batch_err == IDEM_E_STORE_FULL
                                       ? "the idempotency store is full"
                                       : "the idempotency store did not answer");
        return;
    }
    if (job->op.err != IDEM_OK) { /* IDEM_E_EXISTS: 128 random bits met a live token */
        req_problem(req, 500, "internal", "could not issue a token; try again", 0);
        return;
    }
    char body[128];
    snprintf(body, sizeof body, "{\"token\":\"%s\",\"expires_in\":%lld}",
             req->id.key + sizeof IDEM_TOKEN_PREFIX - 1, (long long)(cfg->token_ttl_ms / 1000));
    req->outcome = IDEM_OUT_TOKEN_ISSUED;
    req_send_json(req, 201, "application/json", body, "");
}

/* POST /_idem/tokens: a single-use token bound to the caller's scope. */
static void req_issue_token(idem_req_t *req)
{
    const idem_config_t *cfg = req_gw(req)->cfg;
    char token[IDEM_TOKEN_LEN + 1], scope[IDEM_SCOPE_MAX + 1];

    req->policy = &cfg->defaults;
    if (!req_scope_admit(req, scope))
        return;
    if (idem_token_generate(NULL, token) != IDEM_OK) {
        req->finished = true;
        req_problem(req, 500, "internal", "no random bytes from the kernel", 0);
        return;
    }
    idem_token_id(scope, token, &req->id);
    int64_t now = idem_clock_now(NULL);
    job_init(req, &req->job, IDEM_OP_TOKEN_ISSUE);
    req->job.op.now_ms = now;
    req->job.op.expires_at_ms = now + cfg->token_ttl_ms;
    req_submit(req, &req->job, on_token_issued);
}

static void on_token_restored(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    req->finished = true;
    if (job->batch_err != IDEM_OK)
        idem_log(req->w->gw, "warn", "store: a token whose request did nothing stays used: %s",
                 idem_strerror(job->batch_err));
    if (req->up_result != IDEM_UP_OK)
        req_answer_failure(req, req->up_result);
    else if (req->streaming)
        req_start_stream(req);
    else
        req_respond_upstream(req);
}

/* The upstream did nothing with a token's request (could not connect, or a
 * release status): give the token back before answering, so the client may
 * retry with it; the answer goes out once that is written. */
static void req_give_token_back(idem_req_t *req)
{
    req->token_spent = false;
    job_init(req, &req->job, IDEM_OP_TOKEN_RESTORE);
    req->job.op.now_ms = idem_clock_now(NULL);
    req_submit(req, &req->job, on_token_restored);
}

static void on_token_used(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    if (job->batch_err != IDEM_OK) {
        idem_log(req->w->gw, "error", "store: %s", idem_strerror(job->batch_err));
        on_store_error(req, job->batch_err);
        return;
    }
    switch (job->op.token) {
    case IDEM_TOKEN_FIRST_USE:
        req->token_spent = true;
        req->keyed = false;
        req->finished = false;
        req->outcome = IDEM_OUT_TOKEN_ACCEPTED;
        req_forward(req);
        return;
    case IDEM_TOKEN_USED:
        req->finished = true;
        req->outcome = IDEM_OUT_TOKEN_USED;
        req_problem(req, 409, "token-used",
                    "this Idempotency-Token was already used; get a new one from POST "
                    IDEM_GW_TOKENS_PATH,
                    0);
        return;
    default:
        req->finished = true;
        req->outcome = IDEM_OUT_INVALID_TOKEN;
        req_problem(req, 400, "invalid-token",
                    "this Idempotency-Token is unknown, expired, or was issued to another caller",
                    0);
        return;
    }
}

/* A request on a `mode: token` route whose head carried one well-formed
 * token (req->token, idem_gw_classify): spend it atomically, then forward. */
static void req_spend_token(idem_req_t *req)
{
    char scope[IDEM_SCOPE_MAX + 1];
    if (!req_scope_admit(req, scope))
        return;
    idem_token_id(scope, req->token, &req->id);
    job_init(req, &req->job, IDEM_OP_TOKEN_USE);
    req->job.op.now_ms = idem_clock_now(NULL);
    req_submit(req, &req->job, on_token_used);
}

/* The checks a request's head alone decides (idem_gw_classify): its route,
 * and a key or a token that is missing or malformed.  They run before the
 * body is read when the client waits for 100 Continue, else at dispatch.
 * Nothing here touches the store.  @return true when the request goes on
 * (req->kind says as what); false when it has been answered. */
static bool req_check_head(idem_req_t *req)
{
    idem_gw_request_t rq = idem_req_view(req);
    idem_gw_class_t cls;
    idem_gw_refusal_t refusal;
    req->head_checked = true;
    bool ok = idem_gw_classify(req_gw(req)->cfg, &rq, &cls, &refusal);
    req->kind = cls.kind;
    req->route = cls.route;
    req->policy = cls.policy;
    memcpy(req->id.key, cls.key, sizeof req->id.key);
    memcpy(req->token, cls.token, sizeof req->token);
    if (!ok)
        req_refuse(req, &refusal);
    return ok;
}

/* A body at least this large is fingerprinted in libuv's thread pool, not
 * on the worker's loop: canonical JSON costs 4-22 ms a MiB (src/core/json.c),
 * and the loop serves every other connection of the worker meanwhile
 * (docs/protocol.md section 4).  Below it the hand-off costs more than the
 * work. */
#define FP_OFF_LOOP_BYTES (64 * 1024)

/* The request's fingerprint is in req->fp (fp_rc 0): on to the store. */
static void req_fingerprinted(idem_req_t *req)
{
    if (req->fp_rc != 0) {
        req->keyed = false;
        req->finished = true;
        req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    req_lookup(req);
}

/* In the thread pool: only the request's own head, body and (immutable)
 * policy are read, and only req->fp and req->fp_rc written. */
static void fp_work(uv_work_t *work)
{
    idem_req_t *req = work->data;
    req->fp_rc = req_fingerprint(req);
}

static void fp_after_work(uv_work_t *work, int status)
{
    idem_req_t *req = work->data;
    req->pending_jobs--;
    if (status != 0)
        req->fp_rc = -1; /* cancelled: never done, as nothing cancels it */
    req_fingerprinted(req);
}

static void req_dispatch(idem_req_t *req)
{
    if (!req->head_checked && !req_check_head(req))
        return;
    if (req->kind != IDEM_GW_TOKEN_ISSUE) {
        idem_gw_request_t rq = idem_req_view(req);
        idem_gw_refusal_t refusal;
        if (!idem_gw_upstream_fits(req_gw(req)->cfg, req_gw(req)->upstream_hostport, &rq,
                                   req->kind == IDEM_GW_KEYED, &refusal)) {
            req_refuse(req, &refusal);
            return;
        }
    }
    switch (req->kind) {
    case IDEM_GW_TOKEN_ISSUE: req_issue_token(req); return;
    case IDEM_GW_TOKEN: req_spend_token(req); return;
    case IDEM_GW_PASS: req_passthrough(req); return;
    case IDEM_GW_KEYED: break;
    }
    if (!req_scope_admit(req, req->id.scope))
        return;
    req->keyed = true;
    if (req->body.len >= FP_OFF_LOOP_BYTES) {
        /* The request waits on its fingerprint like on a store job: it is
         * not freed meanwhile (pending_jobs), and nothing else reads or
         * writes its head, body or policy until fp_after_work. */
        req->pending_jobs++;
        req->fp_work.data = req;
        if (uv_queue_work(&req->w->loop, &req->fp_work, fp_work, fp_after_work) == 0)
            return;
        req->pending_jobs--;
        req->fp_rc = req_fingerprint(req); /* the pool refused: on the loop after all */
    } else {
        req->fp_rc = req_fingerprint(req);
    }
    req_fingerprinted(req);
}

/* ---- max_buffered_bytes ---------------------------------------------------- */

#define BODY_FIRST_CHARGE (64 * 1024) /* a chunked body's first room */

/* Charge n bytes to the process's body budget, if they fit. */
static bool budget_take(idem_gw_t *gw, uint64_t n)
{
    uint64_t max = gw->cfg->max_buffered_bytes;
    uint64_t cur = atomic_load(&gw->metrics.buffered_bytes);
    do {
        if (n > max || cur > max - n)
            return false;
    } while (!atomic_compare_exchange_weak(&gw->metrics.buffered_bytes, &cur, cur + n));
    return true;
}

/* Charge a body before any of it is read: a Content-Length body its whole
 * length (its buffer never grows past it, so it is never refused later); a
 * chunked body a first piece, the rest as its buffer grows
 * (req_charge_body).  @return false when it does not fit: then it has been
 * answered 503. */
static bool req_admit_body(idem_req_t *req)
{
    idem_gw_t *gw = req_gw(req);
    uint64_t n;
    if (req->msg.framing == IDEM_HTTP_BODY_LENGTH) {
        n = req->msg.content_length;
        if (n > 0)
            req->body.max = (size_t)n; /* a buffer's max 0 means no cap */
    } else {
        n = BODY_FIRST_CHARGE < gw->cfg->max_request_bytes ? BODY_FIRST_CHARGE
                                                            : gw->cfg->max_request_bytes;
    }
    if (budget_take(gw, n)) {
        req->body_charge = n;
        return true;
    }
    req->finished = true;
    req->outcome = IDEM_OUT_OVERLOADED;
    req_problem(req, 503, "overloaded",
                "too many request bodies are held at once (max_buffered_bytes); retry", 1);
    return false;
}

/* After an append: charge what the body's buffer grew by beyond its charge.
 * @return false when that does not fit (only a chunked body can grow so). */
static bool req_charge_body(idem_req_t *req)
{
    uint64_t room = req->body.cap > 0 ? req->body.cap - 1 : 0; /* one spare byte for a NUL */
    if (room <= req->body_charge)
        return true;
    if (!budget_take(req_gw(req), room - req->body_charge))
        return false;
    req->body_charge = room;
    return true;
}

/* ---- a request's end ----------------------------------------------------- */

static void req_free(idem_req_t *req)
{
    idem_metrics_t *m = &req->w->gw->metrics;
    if (req->body_charge > 0)
        atomic_fetch_sub(&m->buffered_bytes, req->body_charge);
    if (req->holds_slot)
        atomic_fetch_sub(&m->connections, 1);
    free(req->head);
    idem_buf_cleanup(&req->body);
    idem_buf_cleanup(&req->resp_body);
    free(req->resp_head);
    free(req->store_headers);
    free(req);
}

static void on_req_timer_closed(uv_handle_t *h)
{
    idem_req_t *req = h->data;
    idem_worker_t *w = req->w;
    req_free(req);
    worker_maybe_exit(w);
}

/* Free the requests that ended during this loop turn.  They are not freed
 * where they end, because the code that ended them may still look at them
 * on its way out. */
static void free_graveyard(idem_worker_t *w)
{
    while (!idem_list_empty(&w->graveyard)) {
        idem_link_t *l = w->graveyard.next;
        idem_list_remove(l);
        req_free(IDEM_CONTAINER(l, idem_req_t, link));
    }
}

static void req_maybe_free(idem_req_t *req)
{
    if (req->conn || req->pending_jobs > 0 || req->up || req->streaming)
        return;
    if (!req->responded && !req->finished)
        return;
    if (req->keyed && !req->finished)
        return;
    if (req->dead)
        return;
    req->dead = true;
    /* This request is done: log it, count it, free it. */
    idem_gw_t *gw = req->w->gw;
    if (!req->counted)
        idem_metrics_count(&gw->metrics, req->outcome);
    idem_hist_observe(&gw->metrics.request_latency, idem_clock_mono_ns() - req->t_start_ns);
    atomic_fetch_sub(&gw->metrics.in_flight, 1);
    idem_log_request(req->w, req);
    idem_list_remove(&req->link);
    req->renewing = false;
    if (req->timer_open) {
        uv_timer_stop(&req->timer);
        uv_close((uv_handle_t *)&req->timer, on_req_timer_closed);
    } else {
        idem_list_push(&req->w->graveyard, &req->link);
    }
}

/* ---- the worker ------------------------------------------------------------ */

static void on_log_check(uv_check_t *h)
{
    idem_worker_t *w = h->data;
    if (w->inline_store)
        run_inline(w);
    if (w->log.len)
        idem_log_flush(w);
    free_graveyard(w);
    if (w->stopping)
        worker_maybe_exit(w);
}

static void close_if_open(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void worker_maybe_exit(idem_worker_t *w)
{
    if (!w->stopping || !idem_list_empty(&w->reqs) || !idem_list_empty(&w->conns))
        return;
    idem_proxy_close_idle(w);
    close_if_open((uv_handle_t *)&w->done_async);
    close_if_open((uv_handle_t *)&w->stop_async);
    close_if_open((uv_handle_t *)&w->shutdown_timer);
    close_if_open((uv_handle_t *)&w->inline_idle);
    /* log_check is unreferenced: it flushes and frees until the loop ends. */
}

static void on_shutdown_timer(uv_timer_t *t)
{
    /* In-flight work took too long: close every client.  Requests still
     * waiting for their upstream keep their lease; it runs out by itself. */
    idem_worker_t *w = t->data;
    idem_log(w->gw, "warn", "worker %d: shutdown deadline reached, closing connections", w->index);
    while (!idem_list_empty(&w->conns))
        conn_close(IDEM_CONTAINER(w->conns.next, idem_conn_t, link));
    idem_link_t *l = w->reqs.next;
    while (l != &w->reqs) {
        idem_req_t *req = IDEM_CONTAINER(l, idem_req_t, link);
        l = l->next;
        if (req->up || req->streaming)
            idem_proxy_abort(req);
    }
    uv_stop(&w->loop);
}

static void on_stop_async(uv_async_t *a)
{
    idem_worker_t *w = a->data;
    if (w->stopping)
        return;
    w->stopping = true;
    close_if_open((uv_handle_t *)&w->listener);
    /* Idle connections close now; busy ones after their response. */
    idem_link_t *l = w->conns.next;
    while (l != &w->conns) {
        idem_conn_t *c = IDEM_CONTAINER(l, idem_conn_t, link);
        l = l->next;
        if (c->req)
            continue;
        if (c->writes > 0)
            c->close_after = true; /* an answer is still on its way out */
        else
            conn_close(c);
    }
    idem_proxy_close_idle(w);
    uint64_t grace = (uint64_t)w->gw->cfg->upstream_timeout_ms + 5000;
    uv_timer_start(&w->shutdown_timer, on_shutdown_timer, grace, 0);
    uv_unref((uv_handle_t *)&w->shutdown_timer);
    worker_maybe_exit(w);
}

void idem_worker_request_stop(idem_worker_t *w) { uv_async_send(&w->stop_async); }

int idem_worker_init(idem_worker_t *w, idem_gw_t *gw, int index, int listen_fd, char *err,
                     size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->gw = gw;
    w->index = index;
    idem_list_init(&w->done);
    idem_list_init(&w->conns);
    idem_list_init(&w->idle_up);
    idem_list_init(&w->reqs);
    idem_list_init(&w->graveyard);
    idem_list_init(&w->inline_q);
    w->inline_store = idem_store_exec_is_cheap(gw->store);
    idem_buf_init(&w->log, 1u << 20);
    pthread_mutex_init(&w->done_mu, NULL);
    uv_loop_init(&w->loop);
    uv_async_init(&w->loop, &w->done_async, on_done_async);
    w->done_async.data = w;
    uv_async_init(&w->loop, &w->stop_async, on_stop_async);
    w->stop_async.data = w;
    uv_check_init(&w->loop, &w->log_check);
    w->log_check.data = w;
    uv_check_start(&w->log_check, on_log_check);
    uv_unref((uv_handle_t *)&w->log_check);
    uv_timer_init(&w->loop, &w->shutdown_timer);
    w->shutdown_timer.data = w;
    uv_idle_init(&w->loop, &w->inline_idle);
    w->inline_idle.data = w;

    return idem_tcp_open_listener(&w->loop, &w->listener, w, listen_fd, IDEM_LISTEN_BACKLOG,
                                  on_connection, "--listen", err, errlen);
}

int idem_listen_socket(const char *host, int port, int backlog, const char *what, char *err,
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

int idem_tcp_open_listener(uv_loop_t *loop, uv_tcp_t *tcp, void *data, int listen_fd, int backlog,
                           uv_connection_cb cb, const char *what, char *err, size_t errlen)
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

void *idem_worker_main(void *arg)
{
    idem_worker_t *w = arg;
    char name[16];
    snprintf(name, sizeof name, "idem-worker-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    idem_log_flush(w);
    free_graveyard(w);
    return NULL;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void idem_worker_cleanup(idem_worker_t *w)
{
    uv_walk(&w->loop, close_any, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_loop_close(&w->loop);
    free_graveyard(w);
    idem_log_flush(w);
    pthread_mutex_destroy(&w->done_mu);
    idem_buf_cleanup(&w->log);
}
