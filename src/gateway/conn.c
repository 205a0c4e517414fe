/* src/gateway/conn.c - idemd's HTTP connections: accepting, reading,
 * parsing, timers, 100-continue, writing to a client, and the body budget,
 * for the public listener of each worker and for the admin listener.
 *
 * Each worker thread runs one uv_loop_t watching its own dup() of the one
 * listening socket main.c bound (whichever loop accepts first takes the
 * connection; no SO_REUSEPORT, so a second process cannot share the port).
 * A client connection reads and parses one request at a time (pipelined
 * requests wait in the read buffer), refuses a target that is not origin-
 * or absolute-form or whose path has no single reading (docs/protocol.md
 * section 5), buffers its body up to max_request_bytes, and hands the whole
 * request, with its target normalised, to idem__req_dispatch (request.c).
 * The refusals before a request exists are loop-free steps of
 * request_plan.c, called here where the loop gets to them.  Once a request
 * is answered, the next one pipelined behind it is parsed from the loop
 * (its listener's parse_idle), never on the stack of what answered it (a
 * store job, the upstream), so a connection's requests never nest.
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
 * The admin listener (admin.c, docs/protocol.md section 13) runs the same
 * connections on its own thread and loop, so a flood of clients never hides
 * /healthz; its listener's kind changes only who answers and a few limits.
 * Its budget is its own (IDEM_ADMIN_MAX_CONNS, not max_connections); its
 * requests carry at most ADMIN_BODY_MAX of body, read and dropped (chunked
 * is refused); a whole request is answered at once by admin.c's endpoints
 * (idem__admin_answer) and written here; answers queued past
 * ADMIN_WRITE_HIGH stop its parsing; a closing answer not taken within
 * ADMIN_CLOSE_MS is cut; nothing there is counted among the requests.
 *
 * INVARIANTS: a connection carries at most one request (c->req, or on the
 * admin listener c->held), the one being read or answered; a public request
 * is held (IDEM_HOLD_CONN) until the connection lets go through
 * idem__req_detach_conn, _client_gone or _drop, and one that outlives its
 * connection takes its max_connections place with it.
 * THREADING: the loop thread of the connection's listener only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/problem.h"
#include "gateway/rbuf.h"
#include "gateway/request.h"
#include "gateway/worker.h"
#include "idem/alloc.h"

#define READ_CHUNK (64 * 1024)
#define CONN_DRAIN_MS 2000        /* after an error answer, reading what the client still sends */
#define RBUF_PAUSE (256 * 1024)   /* stop reading a busy connection past this much pipelined input */
#define WRITE_HIGH_MARK (4u << 20)  /* answers queued to a client that does not read: stop parsing */
#define ADMIN_BODY_MAX (64 * 1024)  /* an admin request's body, read and dropped */
#define ADMIN_WRITE_HIGH (1u << 20) /* WRITE_HIGH_MARK of the admin listener */
#define ADMIN_CLOSE_MS 5000         /* an admin answer that closes, not taken by then: cut */

typedef enum { CS_HEAD, CS_BODY, CS_BUSY, CS_DRAIN, CS_CLOSED } conn_state_t;

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
    CT_CLOSE, /* admin: the end of a closing answer's time to be taken */
} conn_timer_t;

/* ADMIN: the request being read, its head copied (msg points into head). */
typedef struct {
    idem_http_msg_t msg;
    char head[];
} conn_held_t;

struct idem_conn {
    uv_tcp_t tcp;
    idem_listener_t *l;     /* whose connection this is */
    idem_worker_t *w;       /* PUBLIC: l->w; NULL on the admin listener */
    idem_link_t link;       /* in l->conns */
    idem_link_t parse_link; /* in l->parse_q while pipelined input waits to be parsed */
    idem_rbuf_t in;    /* unparsed input */
    idem_http_head_state_t hs;
    conn_state_t state;
    idem_http_body_t body;
    idem_req_t *req;   /* PUBLIC: the request being read or answered */
    conn_held_t *held; /* ADMIN: the request being read or answered */
    bool reading;
    bool keep_alive;   /* for the response being written */
    bool close_after;  /* close once the queued writes are done */
    size_t queued;     /* bytes in uv_write requests not yet done */
    int writes;        /* uv_write requests not yet done */
    int closes;        /* handles (tcp, timer) whose close callback is pending */
    bool processing;   /* inside conn_process: answers made now loop, not recurse */
    bool peer_eof;     /* the client half-closed after its request: answer, then close */
    bool write_blocked;/* too much queued for a client that does not read: parsing waits */
    bool slot_moved;   /* its max_connections place went to the request that outlived it
                          (public only: an admin connection carries no request) */
    conn_timer_t waiting; /* what timer is armed for */
    uv_timer_t timer;
};

typedef struct {
    uv_write_t wr;
    idem_conn_t *conn;
    size_t len;
    char data[];
} write_req_t;

static void conn_drain(idem_conn_t *c);
static void conn_timer(idem_conn_t *c, conn_timer_t what);
static void conn_admin_answer(idem_conn_t *c);
static bool conn_write_continue(idem_conn_t *c);
static void conn_slot_give(idem_listener_t *l);
static void conn_process(idem_conn_t *c);
static void conn_start_reading(idem_conn_t *c);
static bool req_admit_body(idem_req_t *req);
static bool req_charge_body(idem_req_t *req);

/* Answers queued to a client that does not read them past this: parsing waits. */
static size_t conn_write_high(const idem_conn_t *c)
{
    return c->l->kind == IDEM_LISTEN_ADMIN ? ADMIN_WRITE_HIGH : WRITE_HIGH_MARK;
}

/* ---- writing to a client ---------------------------------------------- */

static void on_write(uv_write_t *wr, int status)
{
    write_req_t *r = (write_req_t *)wr;
    idem_conn_t *c = r->conn;
    c->queued -= r->len;
    c->writes--;
    idem_free(r);
    if (status < 0 && c->state != CS_CLOSED) {
        idem__conn_close(c);
        return;
    }
    if (c->req && c->queued < IDEM_STREAM_HIGH_MARK / 2)
        idem__req_client_drained(c->req); /* a relay paused for this client reads on */
    if (c->close_after && c->writes == 0 && c->state != CS_CLOSED) {
        idem__conn_close(c);
        return;
    }
    if (c->write_blocked && c->queued < conn_write_high(c) / 2 && c->state == CS_HEAD) {
        c->write_blocked = false;
        if (!c->peer_eof)
            conn_start_reading(c);
        conn_process(c);
    }
}

void idem__conn_write(idem_conn_t *c, const void *p, size_t n)
{
    if (!c || c->state == CS_CLOSED || n == 0)
        return;
    write_req_t *r = idem_malloc(sizeof *r + n);
    if (!r) {
        idem__conn_close(c);
        return;
    }
    r->conn = c;
    r->len = n;
    memcpy(r->data, p, n);
    uv_buf_t b = uv_buf_init(r->data, (unsigned)n);
    if (uv_write(&r->wr, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        idem_free(r);
        idem__conn_close(c);
        return;
    }
    c->queued += n;
    c->writes++;
}

size_t idem__conn_queue_size(idem_conn_t *c)
{
    return c ? c->queued : 0;
}

/* ---- connections --------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    idem_conn_t *c = h->data;
    /* Two handles (tcp and timer) close; free on the second. */
    if (--c->closes > 0)
        return;
    idem_listener_t *l = c->l;
    if (!c->slot_moved)
        conn_slot_give(l);
    idem_free(c->held);
    idem_rbuf_cleanup(&c->in);
    idem_free(c);
    if (l->w != NULL)
        idem__worker_maybe_exit(l->w);
}

void idem__conn_close(idem_conn_t *c)
{
    if (c->state == CS_CLOSED)
        return;
    c->state = CS_CLOSED;
    idem_list_remove(&c->link);
    idem_list_remove(&c->parse_link);
    if (c->req) {
        /* A dispatched request goes on without its client: its outcome is
         * still stored, and it keeps this connection's place in
         * max_connections until it ends.  One whose body never arrived
         * ends here. */
        idem_req_t *req = c->req;
        c->req = NULL;
        c->slot_moved = true;
        idem__req_client_gone(req);
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
    if (c->waiting == CT_CLOSE && c->state != CS_CLOSED) {
        idem__conn_close(c); /* a closing answer its client did not take */
        return;
    }
    if (c->state == CS_BUSY || c->state == CS_CLOSED)
        return;
    if (c->waiting == CT_HEAD && c->state == CS_HEAD && c->in.len > 0) {
        /* A head begun and not finished in time: the client hears why. */
        if (c->w != NULL)
            idem__metrics_count(&c->w->gw->metrics, IDEM_OUT_REQUEST_TIMEOUT);
        conn_fail(c, 408, "request-timeout",
                  "the request head did not arrive within header_timeout");
        return;
    }
    if (c->waiting == CT_BODY && c->state == CS_BODY && c->req) {
        conn_fail_body(c, 408, IDEM_OUT_REQUEST_TIMEOUT, "request-timeout",
                       "the request body paused for longer than body_timeout", 0);
        return;
    }
    if (c->waiting == CT_BODY && c->state == CS_BODY && c->held) {
        conn_fail(c, 408, "request-timeout",
                  "the request body paused for longer than body_timeout");
        return;
    }
    /* Idle keep-alive, a new connection that sent nothing, or the end of
     * draining after an error: closed without a word (RFC 9112 9.5). */
    idem__conn_close(c);
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
    case CT_DRAIN: ms = CONN_DRAIN_MS; break;
    case CT_CLOSE: ms = ADMIN_CLOSE_MS; break;
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
        idem__conn_close(c);
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

/* The close callback of a handle allocated alone (idem_malloc). */
static void on_handle_closed_free(uv_handle_t *h) { idem_free(h); }

static void on_shutdown_done(uv_shutdown_t *sd, int status)
{
    (void)status;
    idem_free(sd);
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
    uv_shutdown_t *sd = idem_malloc(sizeof *sd);
    if (sd && uv_shutdown(sd, (uv_stream_t *)&c->tcp, on_shutdown_done) != 0)
        idem_free(sd);
    conn_start_reading(c);
    conn_timer(c, CT_DRAIN);
}

/* Answer with an error of idemd's own and close the connection (drained). */
static void conn_fail_retry(idem_conn_t *c, int status, const char *type, const char *detail,
                            int64_t retry_after)
{
    idem_buf_t out;
    idem__buf_init(&out, 0);
    /* Out of memory: nothing at all, rather than half an answer; the drain
     * still ends the connection. */
    if (idem__problem_respond(&out, status, type, detail, retry_after, CLOSING_REPLY) == 0)
        idem__conn_write(c, out.data, out.len);
    idem__buf_cleanup(&out);
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
    idem__req_drop(req, status, outcome);
    conn_fail_retry(c, status, type, detail, retry_after);
}

/* A refusal of the request being read, before it reached the store: counted,
 * answered, and the connection closed (drained). */
static void conn_refuse_request(idem_conn_t *c, const idem_gw_refusal_t *r)
{
    if (c->w != NULL) /* admin requests are not counted among idemd's */
        idem__metrics_count(&c->w->gw->metrics, r->outcome);
    conn_fail(c, r->status, r->type, r->detail);
}

/* ADMIN: a head parsed as m (head_len bytes at the front of c->in): refuse
 * a body it may not have, else hold the request until its body (read and
 * dropped) is in.  @return false when c has been answered or closed. */
static bool conn_admin_head(idem_conn_t *c, const idem_http_msg_t *m, size_t head_len)
{
    if (m->framing == IDEM_HTTP_BODY_CHUNKED ||
        (m->framing == IDEM_HTTP_BODY_LENGTH && m->content_length > ADMIN_BODY_MAX)) {
        conn_fail(c, 413, "request-too-large", "admin requests carry no body");
        return false;
    }
    conn_held_t *h = idem_malloc(sizeof *h + head_len);
    idem_http_head_state_t hs = {0};
    if (h != NULL) {
        memcpy(h->head, c->in.data, head_len);
        if (idem__http_parse_request(&hs, h->head, head_len, IDEM_HTTP_MAX_HEAD, &h->msg) <= 0) {
            idem_free(h);
            h = NULL;
        }
    }
    if (h == NULL) {
        conn_fail(c, 500, "internal", "out of memory");
        return false;
    }
    idem_rbuf_consume(&c->in, head_len);
    c->held = h;
    if (h->msg.framing == IDEM_HTTP_BODY_NONE) {
        c->state = CS_BUSY;
        conn_timer(c, CT_NONE);
        return true;
    }
    idem__http_body_init(&c->body, &h->msg, ADMIN_BODY_MAX);
    c->state = CS_BODY;
    conn_timer(c, CT_BODY);
    bool invite = h->msg.expect_continue && c->in.len == 0;
    return !invite || conn_write_continue(c);
}

/* Invite c's client to send its body: 100 Continue.  @return false when
 * it could not be written (out of memory): then c is closed. */
static bool conn_write_continue(idem_conn_t *c)
{
    idem_buf_t out;
    idem__buf_init(&out, 0);
    idem_http_response_t r = {.status = 100};
    bool ok = idem__http_write_head(&out, &r, CLOSING_REPLY) == 0;
    if (ok)
        idem__conn_write(c, out.data, out.len);
    else
        idem__conn_close(c);
    idem__buf_cleanup(&out);
    return ok;
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

/* Parse what waits in the connections of parse_q: those whose answer went
 * out with pipelined input behind it.  Only that snapshot: a connection
 * queued meanwhile waits for the next loop turn. */
static void on_parse_idle(uv_idle_t *h)
{
    idem_listener_t *l = h->data;
    idem_link_t batch;
    idem_list_move(&batch, &l->parse_q);
    while (!idem_list_empty(&batch)) {
        idem_conn_t *c = IDEM_CONTAINER(batch.next, idem_conn_t, parse_link);
        idem_list_remove(&c->parse_link);
        /* Read since (on_read parsed it), closed, or busy: nothing to do. */
        if (c->state == CS_HEAD && c->in.len > 0)
            conn_process(c);
    }
    if (idem_list_empty(&l->parse_q))
        uv_idle_stop(h);
}

static void conn_schedule_parse(idem_conn_t *c)
{
    if (c->parse_link.next != &c->parse_link)
        return; /* queued already */
    idem_list_push(&c->l->parse_q, &c->parse_link);
    uv_idle_start(&c->l->parse_idle, on_parse_idle);
}

static void conn_process_loop(idem_conn_t *c)
{
    idem_worker_t *w = c->w;
    const idem_config_t *cfg = c->l->gw->cfg;
    for (;;) {
        if (c->state == CS_HEAD) {
            if (c->in.len == 0) {
                if (c->peer_eof)
                    idem__conn_close(c);
                return;
            }
            if (c->queued > conn_write_high(c)) {
                /* A client that pipelines without reading its answers must
                 * not make us queue them without bound; nor hold us longer
                 * than an idle connection would. */
                c->write_blocked = true;
                conn_stop_reading(c);
                conn_timer(c, CT_IDLE);
                return;
            }
            idem_http_msg_t msg;
            int rc =
                idem__http_parse_request(&c->hs, c->in.data, c->in.len, IDEM_HTTP_MAX_HEAD, &msg);
            if (rc == IDEM_HTTP_INCOMPLETE) {
                if (c->peer_eof)
                    idem__conn_close(c); /* the rest can never come */
                else if (c->waiting != CT_HEAD)
                    conn_timer(c, CT_HEAD); /* header_timeout from the head's first byte */
                return;
            }
            /* The steps before the store are request_plan.c's, in its order. */
            idem_gw_refusal_t refusal;
            if (rc < 0 && c->l->kind == IDEM_LISTEN_ADMIN) {
                bool big = rc == IDEM_HTTP_E_HEAD_TOO_LARGE || rc == IDEM_HTTP_E_TOO_MANY_HEADERS;
                conn_fail(c, big ? 431 : 400, big ? "headers-too-large" : "bad-request",
                          "malformed admin request");
                return;
            }
            if (rc < 0) {
                idem__gw_refuse_parse(rc, &refusal);
                conn_refuse_request(c, &refusal);
                return;
            }
            size_t head_len = (size_t)rc;
            memset(&c->hs, 0, sizeof c->hs);
            if (c->l->kind == IDEM_LISTEN_ADMIN) {
                /* Held until its body is in, then answered (CS_BUSY). */
                if (!conn_admin_head(c, &msg, head_len))
                    return;
                continue;
            }
            if (!idem__gw_check_head(cfg, &msg, &refusal)) {
                conn_refuse_request(c, &refusal);
                return;
            }
            int target_rc;
            idem_req_t *req =
                idem__req_create(w, c, c->in.data, head_len, msg.target.len, &target_rc);
            if (!req && target_rc != IDEM_TARGET_OK) {
                idem__gw_refuse_target(target_rc, &refusal);
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
                idem__http_body_init(&c->body, &req->msg, cfg->max_request_bytes);
                c->state = CS_BODY;
                conn_timer(c, CT_BODY);
                /* A client waiting for 100 Continue is invited only once the
                 * head passed every check it can (docs/protocol.md section
                 * 11); refused, it gets its answer and the connection closes. */
                bool invite = req->msg.expect_continue && req->msg.version_minor == 1 &&
                              c->in.len == 0;
                if (invite && !idem__req_check_head(req))
                    return;
                if (!req_admit_body(req))
                    return;
                if (invite && !conn_write_continue(c))
                    return;
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
                rc = idem__http_body_feed(&c->body, c->in.data + off, c->in.len - off, &used,
                                          &data);
                off += used;
                if (rc == IDEM_HTTP_BODY_DATA) {
                    if (req == NULL)
                        continue; /* ADMIN: a body is read and dropped */
                    if (idem__buf_append(&req->body, data.ptr, data.len) != 0) {
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
                    idem__conn_close(c);
                return;
            }
            if (rc < 0) {
                idem_gw_refusal_t refusal;
                idem__gw_refuse_body(rc, &refusal);
                if (req == NULL)
                    conn_fail(c, refusal.status, refusal.type, refusal.detail);
                else
                    conn_fail_body(c, refusal.status, refusal.outcome, refusal.type,
                                   refusal.detail, 0);
                return;
            }
            c->state = CS_BUSY; /* IDEM_HTTP_BODY_DONE */
            conn_timer(c, CT_NONE);
        }
        if (c->state == CS_BUSY) {
            /* One request at a time: later pipelined ones wait in c->in.
             * The idle timer ignores a busy connection. */
            if (c->held != NULL)
                conn_admin_answer(c);
            else
                idem__req_dispatch(c->req);
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
void idem__conn_response_done(idem_conn_t *c, bool keep_alive)
{
    if (!c || c->state == CS_CLOSED)
        return;
    idem_req_t *req = c->req;
    c->req = NULL;
    if (req)
        idem__req_detach_conn(req);
    if (c->state == CS_BODY) {
        /* Answered before its body was read (refused at the head): the body
         * may follow anyway, so no later request can be told from it. */
        conn_drain(c);
        return;
    }
    if (!keep_alive || c->l->stopping || (c->peer_eof && c->in.len == 0)) {
        c->close_after = true;
        if (c->writes == 0)
            idem__conn_close(c);
        else if (c->l->kind == IDEM_LISTEN_ADMIN)
            conn_timer(c, CT_CLOSE);
        return;
    }
    c->state = CS_HEAD;
    conn_timer(c, c->in.len > 0 ? CT_HEAD : CT_IDLE);
    /* After a half-close, requests already received are still answered. */
    if (!c->peer_eof)
        conn_start_reading(c);
    /* A request pipelined behind this one is parsed from the loop, not on
     * the stack of whatever answered (a store job, the upstream): inside
     * conn_process the loop there goes on by itself. */
    if (c->in.len > 0 && !c->processing)
        conn_schedule_parse(c);
}

/* ADMIN: answer the request held on c at once, with admin.c's endpoints,
 * and write the answer.  One that cannot be written becomes a 500 that
 * closes; one that cannot even be that, or no answer at all, closes c. */
static void conn_admin_answer(idem_conn_t *c)
{
    conn_held_t *h = c->held;
    c->held = NULL;
    idem_answer_t a;
    idem__answer_init(&a);
    idem__admin_answer(c->l->admin, &h->msg, &a);
    idem_http_reply_t to = {.version_minor = h->msg.version_minor,
                            .head = idem__slice_eq_ci(h->msg.method, "HEAD"),
                            .keep_alive = h->msg.keep_alive && !a.close && !c->l->stopping};
    idem_free(h);
    idem_buf_t out;
    idem__buf_init(&out, 0);
    int rc = -1;
    if (a.status != 0) {
        idem_http_field_t type;
        idem_http_response_t r = {.status = a.status};
        if (a.content_type != NULL) {
            type = (idem_http_field_t){{"Content-Type", 12},
                                       {a.content_type, strlen(a.content_type)}};
            r.fields = &type;
            r.n_fields = 1;
        }
        rc = idem__http_write_response(&out, &r, to, a.body.data, a.body.len);
        if (rc != 0) {
            to.keep_alive = false;
            rc = idem__problem_respond(&out, 500, "internal", "the answer could not be written",
                                       0, to);
        }
    }
    idem__answer_cleanup(&a);
    if (rc != 0) {
        idem__buf_cleanup(&out);
        idem__conn_close(c);
        return;
    }
    idem__conn_write(c, out.data, out.len);
    idem__buf_cleanup(&out);
    idem__conn_response_done(c, to.keep_alive);
}

/* A place in l's budget: max_connections across workers for the public
 * listener, IDEM_ADMIN_MAX_CONNS of its own for the admin. */
static bool conn_slot_take(idem_listener_t *l)
{
    if (l->kind == IDEM_LISTEN_ADMIN) {
        if (l->n_conns >= IDEM_ADMIN_MAX_CONNS)
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
    if (l->kind == IDEM_LISTEN_ADMIN)
        l->n_conns--;
    else
        atomic_fetch_sub(&l->gw->metrics.connections, 1);
}

/* Over the budget: accept (a connection left in the kernel's queue would
 * stop the listener) and close at once, saying 503 if the socket takes it
 * without waiting.  The descriptor is back before this returns. */
static void conn_refuse(idem_listener_t *l, uv_stream_t *server)
{
    bool admin = l->kind == IDEM_LISTEN_ADMIN;
    atomic_fetch_add(admin ? &l->gw->metrics.admin_conns_refused : &l->gw->metrics.conns_refused,
                     1);
    uv_tcp_t *t = idem_malloc(sizeof *t);
    if (!t)
        return;
    uv_tcp_init(l->loop, t);
    if (uv_accept(server, (uv_stream_t *)t) == 0) {
        idem_buf_t out;
        idem__buf_init(&out, 0);
        if (idem__problem_respond(&out, 503, "overloaded",
                                  admin ? "too many admin connections; retry"
                                        : "too many connections (max_connections); retry",
                                  1, CLOSING_REPLY) == 0) {
            uv_buf_t b = uv_buf_init(out.data, (unsigned)out.len);
            (void)uv_try_write((uv_stream_t *)t, &b, 1);
        }
        idem__buf_cleanup(&out);
    }
    uv_close((uv_handle_t *)t, on_handle_closed_free);
}

void idem__listener_init(idem_listener_t *l, idem_listen_kind_t kind, idem_gw_t *gw,
                         uv_loop_t *loop)
{
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->gw = gw;
    l->loop = loop;
    idem_list_init(&l->conns);
    idem_list_init(&l->parse_q);
    uv_idle_init(loop, &l->parse_idle);
    l->parse_idle.data = l;
}

void idem__conn_on_connection(uv_stream_t *server, int status)
{
    idem_listener_t *l = server->data;
    if (status < 0)
        return;
    if (!conn_slot_take(l)) {
        conn_refuse(l, server);
        return;
    }
    idem_conn_t *c = idem_calloc(1, sizeof *c);
    if (!c) {
        conn_slot_give(l);
        return;
    }
    c->l = l;
    c->w = l->w;
    uv_tcp_init(l->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_slot_give(l);
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed_free);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_init(l->loop, &c->timer);
    c->timer.data = c;
    c->state = CS_HEAD;
    idem_list_init(&c->parse_link);
    idem_list_push(&l->conns, &c->link);
    /* A new connection's first head must come within header_timeout. */
    conn_timer(c, CT_HEAD);
    conn_start_reading(c);
}

bool idem__conn_reading_body(const idem_conn_t *c) { return c != NULL && c->state == CS_BODY; }

void idem__conn_close_when_written(idem_conn_t *c)
{
    idem_req_t *req = c->req;
    c->req = NULL;
    if (req)
        idem__req_detach_conn(req);
    c->close_after = true;
    if (c->writes == 0)
        idem__conn_close(c);
}

void idem__conns_close_idle(idem_listener_t *ls)
{
    idem_link_t *l = ls->conns.next;
    while (l != &ls->conns) {
        idem_conn_t *c = IDEM_CONTAINER(l, idem_conn_t, link);
        l = l->next;
        if (c->req)
            continue;
        if (c->writes > 0)
            c->close_after = true; /* an answer is still on its way out */
        else
            idem__conn_close(c);
    }
}

void idem__conns_close_all(idem_listener_t *l)
{
    while (!idem_list_empty(&l->conns))
        idem__conn_close(IDEM_CONTAINER(l->conns.next, idem_conn_t, link));
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
    req->outcome = IDEM_OUT_OVERLOADED;
    idem__req_problem(req, 503, "overloaded",
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

