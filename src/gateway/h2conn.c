/* src/gateway/h2conn.c - idemd's HTTP/2 connections (h2conn.h): nghttp2
 * does the framing, HPACK and flow control over memory; conn.c's transport
 * and loop do the I/O; each stream is a request of the listener's handler
 * (handler.h), exactly as an HTTP/1.1 request of conn.c is.
 *
 * A stream becomes a request once its header block is whole: its fields
 * are written as an HTTP/1.1 head ("METHOD path HTTP/1.1", Host from
 * :authority, the fields as received; Transfer-Encoding: chunked when a
 * body follows without a Content-Length) and parsed by src/http, so that
 * every rule of a head (its size and field count: 431; its target; Host)
 * holds as over HTTP/1.1, and the handler parses the same head again as it
 * always does.  DATA feeds on_body; END_STREAM is on_body_end; a stream the
 * client resets, or a connection that ends, tells an attached request
 * on_gone, so a body cut short is never forwarded and no key is claimed
 * for it.
 *
 * An answer is queued per stream (its pending bytes count in
 * max_queued_bytes, as what conn.c queues does) and given to nghttp2 by a
 * data provider as the client's flow-control windows allow; send answers
 * false past IDEM_STREAM_HIGH_MARK (or max_queued_bytes), and on_proceed
 * follows once the stream drained to half of it.
 *
 * The attacks HTTP/2 brought (docs/protocol.md): nghttp2 enforces the
 * advertised SETTINGS_MAX_CONCURRENT_STREAMS (REFUSED_STREAM past it),
 * refuses connection-specific fields, upper-case names and missing or
 * misplaced pseudo-fields (PROTOCOL_ERROR), and bounds CONTINUATION frames
 * per block (nghttp2_option_set_max_continuations).  h2conn.c bounds what a
 * header block decodes to (IDEM_H2_MAX_BLOCK: an HPACK bomb ends the
 * connection) and RST_STREAM frames per second (IDEM_H2_MAX_RESETS_PER_SEC:
 * rapid reset ends the connection); a request that outlives its reset
 * stream takes a place in max_connections, so resets cannot start work
 * without bound.
 *
 * Calls go one way (h2conn.h): requests are called from idem__h2conn_read,
 * _run and _destroy only, which conn.c calls from the loop; nghttp2's
 * callbacks run inside nghttp2_session_mem_recv and _mem_send, which only
 * those call.  A stream function (start, send, abort) only queues and
 * submits, and asks the carrier to schedule a run.
 *
 * THREADING: the loop thread of the connection's listener only.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "gateway/gateway.h"
#include "gateway/h2conn.h"
#include "gateway/request_plan.h"
#include "idem/alloc.h"
#include "idem/clock.h"

#define SEND_BATCH (64 * 1024) /* frames gathered into one transport write */

typedef struct h2stream h2stream_t;

struct h2stream {
    idem_ostream_t os;      /* what its request answers through */
    idem_h2conn_t *h;
    int32_t id;
    idem_link_t link;       /* in h->streams */
    idem_hreq_t *req;       /* attached until it ended its answer or was told on_gone */
    /* The header block, while it comes. */
    idem_buf_t line;        /* "METHOD path HTTP/1.1\r\n" and Host */
    idem_buf_t fields;      /* the other fields, as HTTP/1.1 lines */
    char *method, *path, *authority;
    size_t head_bytes;      /* the HTTP/1.1 head it makes so far */
    bool too_large;         /* past IDEM_HTTP_MAX_HEAD: 431 */
    bool has_length;        /* a content-length field came */
    bool head_method;       /* HEAD: an answer without its body */
    /* The body. */
    bool body_done;         /* END_STREAM came */
    bool body_refused;      /* the request refused a piece: the rest is dropped */
    /* The answer. */
    bool started;           /* start was called */
    bool submitted;         /* a response is submitted to nghttp2 */
    bool nobody;            /* no body goes out (HEAD, 204, 304, NONE) */
    bool final;             /* its last byte is queued */
    bool deferred;          /* the data provider waits for send */
    bool want_proceed;      /* send answered false: on_proceed once drained */
    bool rst_after;         /* a refusal: RST_STREAM NO_ERROR once its answer is out */
    bool closed;            /* nghttp2 closed the stream */
    idem_buf_t out;         /* answer bytes not yet taken by nghttp2 */
    size_t out_off;
    /* Its time limits (monotonic ms, 0: none), the earliest of every
     * stream's arming conn.c's one timer (idem__h2conn_deadline). */
    int64_t head_by;        /* its header block whole: header_timeout from HEADERS */
    int64_t body_by;        /* the next DATA of its body: body_timeout */
    int64_t out_by;         /* progress of its queued answer: body_timeout */
};

struct idem_h2conn {
    nghttp2_session *s;
    idem_listener_t *l;
    idem_transport_t *tr;
    const idem_h2_carrier_t *cr;
    void *owner;
    idem_conn_facts_t facts;
    idem_link_t streams;    /* open streams (h2stream_t.link) */
    size_t n_streams;
    size_t pending;         /* bytes in the streams' out buffers, counted in max_queued_bytes */
    size_t block_bytes;     /* what the header block being read decoded to so far */
    int64_t reset_window_ms; /* the second RST_STREAM frames are counted in */
    unsigned resets;        /* ... and how many came in it */
    idem_buf_t wbuf;        /* frames gathered for one transport write */
    bool goaway;            /* GOAWAY submitted (stopping, or an attack) */
    bool peer_eof;          /* the client sent its last byte */
    bool failed;            /* nghttp2 or a write failed: close */
    bool destroying;        /* nghttp2's callbacks do nothing any more */
};

static const idem_ostream_ops_t h2_os_ops;

static h2stream_t *stream_of(idem_ostream_t *os) { return IDEM_CONTAINER(os, h2stream_t, os); }

/* ---- memory: nghttp2 allocates through idem_malloc --------------------------- */

static void *mem_malloc(size_t n, void *ud)
{
    (void)ud;
    return idem_malloc(n);
}
static void mem_free(void *p, void *ud)
{
    (void)ud;
    idem_free(p);
}
static void *mem_calloc(size_t n, size_t sz, void *ud)
{
    (void)ud;
    return idem_calloc(n, sz);
}
static void *mem_realloc(void *p, size_t n, void *ud)
{
    (void)ud;
    return idem_realloc(p, n);
}

/* ---- max_queued_bytes --------------------------------------------------------- */

static bool over_cap(const idem_h2conn_t *h)
{
    if (!h->l->limits.count_queued)
        return false;
    return atomic_load_explicit(&h->l->gw->metrics.queued_bytes, memory_order_relaxed) >
           h->l->gw->cfg->max_queued_bytes;
}

static void charge(idem_h2conn_t *h, size_t n)
{
    h->pending += n;
    if (h->l->limits.count_queued)
        atomic_fetch_add(&h->l->gw->metrics.queued_bytes, n);
}

static void uncharge(idem_h2conn_t *h, size_t n)
{
    h->pending -= n;
    if (h->l->limits.count_queued)
        atomic_fetch_sub(&h->l->gw->metrics.queued_bytes, n);
}

static size_t stream_pending(const h2stream_t *st) { return st->out.len - st->out_off; }

/* ---- time limits -------------------------------------------------------------- */

static int64_t now_ms(void) { return (int64_t)(idem_clock_mono_ns() / 1000000); }

static int64_t after_ms(int64_t ms) { return now_ms() + (ms > 0 ? ms : 0) + 1; }

static int64_t body_timeout(const idem_h2conn_t *h) { return h->l->gw->cfg->body_timeout_ms; }

/* ---- streams ------------------------------------------------------------------ */

static h2stream_t *stream_new(idem_h2conn_t *h, int32_t id)
{
    h2stream_t *st = idem_calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->os.ops = &h2_os_ops;
    st->h = h;
    st->id = id;
    /* A head is never kept past its bound: the rest is only counted. */
    idem__buf_init(&st->line, IDEM_HTTP_MAX_HEAD);
    idem__buf_init(&st->fields, IDEM_HTTP_MAX_HEAD);
    idem__buf_init(&st->out, 0);
    st->head_by = after_ms(h->l->gw->cfg->header_timeout_ms);
    idem_list_push(&h->streams, &st->link);
    h->n_streams++;
    return st;
}

static void stream_free_head(h2stream_t *st)
{
    idem__buf_cleanup(&st->line);
    idem__buf_cleanup(&st->fields);
    idem_free(st->method);
    idem_free(st->path);
    idem_free(st->authority);
    st->method = st->path = st->authority = NULL;
}

/* The request is told no more: the connection never calls it again. */
static idem_hreq_t *stream_detach(h2stream_t *st)
{
    idem_hreq_t *r = st->req;
    st->req = NULL;
    st->want_proceed = false;
    return r;
}

/* The client is gone for the stream's request: it goes on without it, and
 * when requests outlive their clients it takes a place in max_connections
 * (which it gives back when it ends, as conn.c's request does). */
static void stream_gone(h2stream_t *st)
{
    idem_hreq_t *r = stream_detach(st);
    if (r == NULL)
        return;
    idem_listener_t *l = st->h->l;
    if (l->handler->request_outlives && l->limits.max_conns == 0)
        atomic_fetch_add(&l->gw->metrics.connections, 1);
    l->handler->ops->on_gone(r);
}

static void stream_free(h2stream_t *st)
{
    idem_h2conn_t *h = st->h;
    uncharge(h, stream_pending(st));
    idem__buf_cleanup(&st->out);
    stream_free_head(st);
    idem_list_remove(&st->link);
    h->n_streams--;
    idem_free(st);
}

/* ---- the output stream (handler.h) --------------------------------------------- */

static bool conn_specific(const char *name, size_t n)
{
    static const char *const names[] = {"connection", "keep-alive", "proxy-connection",
                                        "transfer-encoding", "upgrade", "te", "content-length"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && strncasecmp(names[i], name, n) == 0)
            return true;
    return false;
}

static ssize_t data_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    (void)s;
    (void)id;
    (void)user_data;
    h2stream_t *st = source->ptr;
    size_t avail = stream_pending(st);
    size_t n = avail < length ? avail : length;
    if (n > 0) {
        memcpy(buf, st->out.data + st->out_off, n);
        st->out_off += n;
        uncharge(st->h, n);
        /* Progress: another body_timeout for the rest. */
        st->out_by = stream_pending(st) > 0 ? after_ms(body_timeout(st->h)) : 0;
    }
    if (st->out_off == st->out.len) {
        /* A large answer's buffer is not kept between pieces. */
        if (st->out.cap > 256 * 1024)
            idem__buf_cleanup(&st->out);
        else
            idem__buf_reset(&st->out);
        st->out_off = 0;
        if (st->final) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        } else if (n == 0) {
            st->deferred = true;
            return NGHTTP2_ERR_DEFERRED;
        }
    }
    return (ssize_t)n;
}

static int os_start(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags)
{
    h2stream_t *st = stream_of(os);
    idem_h2conn_t *h = st->h;
    if (st->started)
        return -1;
    if (st->closed || h->failed) {
        st->started = true; /* nothing goes out; on_gone follows from the loop */
        st->nobody = true;
        return 0;
    }
    bool bodiless = idem__http_status_bodiless(r->status);
    /* :status, the fields, content-length. */
    size_t n_nv = 0, cap = r->n_fields + 2;
    nghttp2_nv *nv = idem_calloc(cap, sizeof *nv);
    char status[4], len[24];
    if (!nv || r->status < 200 || r->status > 999) {
        idem_free(nv);
        return -1;
    }
    snprintf(status, sizeof status, "%d", r->status);
    nv[n_nv++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, NGHTTP2_NV_FLAG_NONE};
    /* Names go lower-case (RFC 9113 8.2.1), into one buffer. */
    size_t total = 0, used = 0;
    for (size_t i = 0; i < r->n_fields; i++)
        total += r->fields[i].name.len;
    char *names = idem_malloc(total > 0 ? total : 1);
    if (!names) {
        idem_free(nv);
        return -1;
    }
    for (size_t i = 0; i < r->n_fields; i++) {
        const idem_http_field_t *f = &r->fields[i];
        if (conn_specific(f->name.ptr, f->name.len))
            continue;
        char *lo = names + used;
        for (size_t k = 0; k < f->name.len; k++) {
            char c = f->name.ptr[k];
            lo[k] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
        used += f->name.len;
        nv[n_nv++] = (nghttp2_nv){(uint8_t *)lo, (uint8_t *)f->value.ptr, f->name.len,
                                  f->value.len, NGHTTP2_NV_FLAG_NONE};
    }
    if (r->framing == IDEM_HTTP_BODY_LENGTH && !bodiless) {
        int k = snprintf(len, sizeof len, "%llu", (unsigned long long)r->content_length);
        nv[n_nv++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)len, 14, (size_t)k,
                                  NGHTTP2_NV_FLAG_NONE};
    }
    st->nobody = st->head_method || bodiless || r->framing == IDEM_HTTP_BODY_NONE ||
                 (r->framing == IDEM_HTTP_BODY_LENGTH && r->content_length == 0);
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read};
    /* nghttp2 copies the fields. */
    int rc = nghttp2_submit_response(h->s, st->id, nv, n_nv, st->nobody ? NULL : &prd);
    idem_free(nv);
    idem_free(names);
    if (rc != 0)
        return -1;
    st->started = true;
    st->submitted = true;
    /* A refusal before the body was read: the client may stop sending it
     * once the answer is out (RFC 9113 8.1). */
    st->rst_after = (flags & IDEM_OS_CLOSE) != 0 && !st->body_done;
    h->cr->schedule(h->owner);
    return 0;
}

/* The answer is complete: the request is told no more. */
static void stream_answered(h2stream_t *st)
{
    stream_detach(st);
    st->final = true;
}

static bool os_send(idem_ostream_t *os, const void *p, size_t n, bool final)
{
    h2stream_t *st = stream_of(os);
    idem_h2conn_t *h = st->h;
    if (!st->started)
        return false;
    bool live = !st->closed && !h->failed && st->submitted;
    if (live && n > 0 && !st->nobody) {
        if (idem__buf_append(&st->out, p, n) != 0) {
            /* Out of memory: a piece left out would corrupt the body, so the
             * client sees the stream reset instead. */
            nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
            st->nobody = true;
        } else {
            charge(h, n);
            if (st->out_by == 0) /* queued now: taken within body_timeout */
                st->out_by = after_ms(body_timeout(h));
        }
    }
    if (final)
        stream_answered(st);
    if (live && !st->nobody && st->deferred) {
        st->deferred = false;
        nghttp2_session_resume_data(h->s, st->id);
    }
    if (live)
        h->cr->schedule(h->owner);
    if (final || !live)
        return false;
    if (stream_pending(st) > IDEM_STREAM_HIGH_MARK || over_cap(h)) {
        st->want_proceed = true;
        return false;
    }
    return true;
}

static void os_abort(idem_ostream_t *os)
{
    h2stream_t *st = stream_of(os);
    idem_h2conn_t *h = st->h;
    stream_detach(st);
    st->final = true;
    if (st->closed || h->failed)
        return;
    /* The client sees the stream cut, never a short body that looks whole. */
    nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    h->cr->schedule(h->owner);
}

static const idem_ostream_ops_t h2_os_ops = {
    .start = os_start,
    .send = os_send,
    .abort = os_abort,
};

/* ---- a stream's head ----------------------------------------------------------- */

static char *dup_bytes(const uint8_t *p, size_t n) { return idem_strndup((const char *)p, n); }

/* Append one "name: value\r\n" line of the head being made, or note that
 * the head is past its bound. */
static void head_line(h2stream_t *st, idem_buf_t *b, const char *name, size_t nlen,
                      const char *value, size_t vlen)
{
    st->head_bytes += nlen + vlen + 4;
    if (st->too_large || st->head_bytes > IDEM_HTTP_MAX_HEAD) {
        st->too_large = true;
        return;
    }
    if (idem__buf_append(b, name, nlen) != 0 || idem__buf_append(b, ": ", 2) != 0 ||
        idem__buf_append(b, value, vlen) != 0 || idem__buf_append(b, "\r\n", 2) != 0)
        st->too_large = true;
}

/* Connection-level trouble: GOAWAY with code, and the connection ends once
 * it is written. */
static void conn_calm(idem_h2conn_t *h, uint32_t code)
{
    if (!h->goaway) {
        h->goaway = true;
        nghttp2_session_terminate_session(h->s, code);
    }
}

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *frame, void *user_data)
{
    idem_h2conn_t *h = user_data;
    h->block_bytes = 0;
    if (h->destroying || frame->hd.type != NGHTTP2_HEADERS ||
        frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2stream_t *st = stream_new(h, frame->hd.stream_id);
    if (!st)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(s, frame->hd.stream_id, st);
    return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    (void)flags;
    idem_h2conn_t *h = user_data;
    if (h->destroying)
        return 0;
    /* An HPACK bomb: a few bytes that decode to a huge list.  Bounded per
     * block, whatever stream it is for. */
    h->block_bytes += namelen + valuelen + 32;
    if (h->block_bytes > IDEM_H2_MAX_BLOCK) {
        conn_calm(h, NGHTTP2_ENHANCE_YOUR_CALM);
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    h2stream_t *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (!st || frame->headers.cat != NGHTTP2_HCAT_REQUEST || st->too_large)
        return 0; /* trailers are dropped, as over HTTP/1.1 */
    const char *nm = (const char *)name, *val = (const char *)value;
    if (namelen > 0 && nm[0] == ':') {
        /* nghttp2 checked them: each once, before the fields, no other. */
        char **slot = namelen == 7 && memcmp(nm, ":method", 7) == 0      ? &st->method
                      : namelen == 5 && memcmp(nm, ":path", 5) == 0      ? &st->path
                      : namelen == 10 && memcmp(nm, ":authority", 10) == 0 ? &st->authority
                                                                           : NULL;
        st->head_bytes += valuelen + 2;
        if (slot != NULL && *slot == NULL && !(*slot = dup_bytes(value, valuelen)))
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        return 0;
    }
    /* Host comes from :authority when there is one (RFC 9113 8.3.1);
     * 100-continue is no HTTP/2 matter. */
    if ((namelen == 4 && memcmp(nm, "host", 4) == 0 && st->authority != NULL) ||
        (namelen == 6 && memcmp(nm, "expect", 6) == 0))
        return 0;
    if (namelen == 14 && memcmp(nm, "content-length", 14) == 0)
        st->has_length = true;
    head_line(st, &st->fields, nm, namelen, val, valuelen);
    return 0;
}

/* The stream's header block is whole: make its HTTP/1.1 head and hand it to
 * the handler. */
static void stream_head_done(idem_h2conn_t *h, h2stream_t *st, bool end_stream)
{
    idem_handler_t *hd = h->l->handler;
    st->body_done = end_stream;
    st->head_by = 0;
    st->body_by = end_stream ? 0 : after_ms(body_timeout(h));
    idem_buf_t head;
    idem__buf_init(&head, 0);
    int rc = -1;
    if (st->method && st->path && !st->too_large) {
        st->head_method = strcmp(st->method, "HEAD") == 0;
        rc = idem__buf_appendf(&head, "%s %s HTTP/1.1\r\n", st->method, st->path);
        if (rc == 0 && st->authority)
            rc = idem__buf_appendf(&head, "Host: %s\r\n", st->authority);
        if (rc == 0 && st->fields.len > 0)
            rc = idem__buf_append(&head, st->fields.data, st->fields.len);
        /* A body without a length is framed for the handler as HTTP/1.1
         * frames one; its pieces come from DATA all the same. */
        if (rc == 0 && !end_stream && !st->has_length)
            rc = idem__buf_append_str(&head, "Transfer-Encoding: chunked\r\n");
        if (rc == 0)
            rc = idem__buf_append(&head, "\r\n", 2);
    }
    stream_free_head(st);
    idem_http_msg_t msg;
    int prc = IDEM_HTTP_E_HEAD_TOO_LARGE;
    if (rc == 0) {
        idem_http_head_state_t hs = {0};
        size_t max = head.len > IDEM_HTTP_MAX_HEAD ? IDEM_HTTP_MAX_HEAD : head.len + 1;
        prc = idem__http_parse_request(&hs, head.data, head.len, max, &msg);
        if (prc == IDEM_HTTP_INCOMPLETE)
            prc = IDEM_HTTP_E_HEAD_TOO_LARGE;
    } else if (!st->too_large && (st->method == NULL || st->path == NULL)) {
        prc = IDEM_HTTP_E_BAD;
    }
    if (prc < 0) {
        /* Refused at its head, as conn.c refuses one. */
        idem_gw_refusal_t ref;
        idem__gw_refuse_parse(prc, &ref);
        if (hd->ops->on_refused != NULL)
            hd->ops->on_refused(hd, ref.outcome, &h->facts);
        if (idem__ostream_problem(&st->os, ref.status, ref.type, ref.detail, 0, hd->problem_link,
                                  IDEM_OS_CLOSE) != 0)
            nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
        idem__buf_cleanup(&head);
        return;
    }
    idem_hreq_t *r = hd->ops->on_head(hd, &msg, head.data, (size_t)prc, &st->os, &h->facts);
    idem__buf_cleanup(&head);
    if (r == NULL) {
        if (!st->started) /* out of memory: nothing was answered */
            nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
        st->body_refused = true;
        return;
    }
    if (st->final) /* answered at once */
        return;
    st->req = r;
    if (end_stream)
        hd->ops->on_body_end(r);
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *frame, void *user_data)
{
    idem_h2conn_t *h = user_data;
    if (h->destroying)
        return 0;
    bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    h2stream_t *st = frame->hd.stream_id != 0
                         ? nghttp2_session_get_stream_user_data(s, frame->hd.stream_id)
                         : NULL;
    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        h->block_bytes = 0;
        if (!st)
            return 0;
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
            stream_head_done(h, st, end_stream);
            return 0;
        }
        break; /* trailers: maybe the end of the body */
    case NGHTTP2_DATA:
        if (!st)
            return 0;
        break;
    case NGHTTP2_RST_STREAM: {
        /* Rapid reset (CVE-2023-44487): more than a bound a second ends the
         * connection. */
        int64_t now = idem_clock_mono_ns() / 1000000;
        if (now - h->reset_window_ms >= 1000) {
            h->reset_window_ms = now;
            h->resets = 0;
        }
        if (++h->resets > IDEM_H2_MAX_RESETS_PER_SEC)
            conn_calm(h, NGHTTP2_ENHANCE_YOUR_CALM);
        return 0;
    }
    default:
        return 0;
    }
    if (end_stream && !st->body_done) {
        st->body_done = true;
        st->body_by = 0;
        if (st->req && !st->body_refused)
            h->l->handler->ops->on_body_end(st->req);
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *user_data)
{
    (void)flags;
    idem_h2conn_t *h = user_data;
    if (h->destroying)
        return 0;
    h2stream_t *st = nghttp2_session_get_stream_user_data(s, id);
    if (st && !st->body_done)
        st->body_by = after_ms(body_timeout(h)); /* each piece: another body_timeout */
    if (!st || !st->req || st->body_refused || st->body_done || len == 0)
        return 0;
    if (!h->l->handler->ops->on_body(st->req, (const char *)data, len))
        st->body_refused = true; /* answered: the rest is dropped */
    return 0;
}

static int on_frame_send(nghttp2_session *s, const nghttp2_frame *frame, void *user_data)
{
    idem_h2conn_t *h = user_data;
    if (h->destroying || frame->hd.stream_id == 0 ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    h2stream_t *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (st && st->rst_after && !st->body_done) {
        st->rst_after = false;
        nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t error_code, void *user_data)
{
    (void)error_code;
    idem_h2conn_t *h = user_data;
    if (h->destroying)
        return 0;
    h2stream_t *st = nghttp2_session_get_stream_user_data(s, id);
    if (!st)
        return 0;
    st->closed = true;
    nghttp2_session_set_stream_user_data(s, id, NULL);
    /* Reset before its body was whole: never forwarded (the request was
     * not dispatched) and no key claimed; after: the request goes on. */
    stream_gone(st);
    stream_free(st);
    return 0;
}

/* ---- the connection ------------------------------------------------------------- */

idem_h2conn_t *idem__h2conn_create(idem_listener_t *l, idem_transport_t *tr,
                                   const idem_conn_facts_t *facts, const idem_h2_carrier_t *cr,
                                   void *owner)
{
    idem_h2conn_t *h = idem_calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->l = l;
    h->tr = tr;
    h->cr = cr;
    h->owner = owner;
    h->facts = *facts;
    h->facts.proto = "HTTP/2";
    idem_list_init(&h->streams);
    idem__buf_init(&h->wbuf, 0);
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_option *opt = NULL;
    nghttp2_mem mem = {NULL, mem_malloc, mem_free, mem_calloc, mem_realloc};
    int rc = nghttp2_session_callbacks_new(&cbs);
    if (rc == 0)
        rc = nghttp2_option_new(&opt);
    if (rc == 0) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
        nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
        nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
        nghttp2_option_set_max_continuations(opt, IDEM_H2_MAX_CONTINUATIONS);
        /* nghttp2's own bucket sits behind ours (IDEM_H2_MAX_RESETS_PER_SEC). */
        nghttp2_option_set_stream_reset_rate_limit(opt, 4 * IDEM_H2_MAX_RESETS_PER_SEC,
                                                   IDEM_H2_MAX_RESETS_PER_SEC);
        rc = nghttp2_session_server_new3(&h->s, cbs, h, opt, &mem);
    }
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rc == 0) {
        nghttp2_settings_entry iv[] = {
            {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
             (uint32_t)l->gw->cfg->http2_max_concurrent_streams},
            {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, IDEM_HTTP_MAX_HEAD},
            {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        };
        rc = nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    }
    if (rc != 0) {
        if (h->s)
            nghttp2_session_del(h->s);
        idem_free(h);
        return NULL;
    }
    if (l->stopping)
        idem__h2conn_shutdown(h);
    return h;
}

/* What the connection's state says to conn.c. */
static int h2_verdict(idem_h2conn_t *h)
{
    if (h->failed)
        return IDEM_H2_FAIL;
    bool want = nghttp2_session_want_read(h->s) || nghttp2_session_want_write(h->s);
    if (!want)
        return IDEM_H2_END;
    if ((h->goaway || h->peer_eof) && h->n_streams == 0 && !nghttp2_session_want_write(h->s))
        return IDEM_H2_END;
    return IDEM_H2_GO_ON;
}

/* Hand wbuf to the transport. */
static bool h2_flush(idem_h2conn_t *h)
{
    if (h->wbuf.len == 0)
        return true;
    uv_buf_t b = uv_buf_init(h->wbuf.data, (unsigned)h->wbuf.len);
    int rc = idem__transport_write(h->tr, &b, 1);
    if (h->wbuf.cap > 2 * SEND_BATCH)
        idem__buf_cleanup(&h->wbuf);
    else
        idem__buf_reset(&h->wbuf);
    if (rc != 0)
        h->failed = true;
    return rc == 0;
}

/* Give the transport what nghttp2 has to send, up to write_high queued. */
static void h2_pump(idem_h2conn_t *h)
{
    while (!h->failed && idem__transport_queued(h->tr) < h->l->limits.write_high) {
        const uint8_t *p = NULL;
        ssize_t n = nghttp2_session_mem_send(h->s, &p);
        if (n < 0) {
            h->failed = true;
            return;
        }
        if (n == 0)
            break;
        if (idem__buf_append(&h->wbuf, p, (size_t)n) != 0) {
            h->failed = true;
            return;
        }
        if (h->wbuf.len >= SEND_BATCH && !h2_flush(h))
            return;
    }
    h2_flush(h);
}

int idem__h2conn_read(idem_h2conn_t *h, const char *p, size_t n)
{
    if (h->failed)
        return IDEM_H2_FAIL;
    ssize_t rc = nghttp2_session_mem_recv(h->s, (const uint8_t *)p, n);
    if (rc < 0) {
        /* A protocol error nghttp2 could not answer on a stream, or one of
         * our bounds: GOAWAY (queued by nghttp2 or conn_calm), then the
         * end. */
        if (!h->goaway) {
            h->goaway = true;
            nghttp2_session_terminate_session(h->s, rc == NGHTTP2_ERR_BAD_CLIENT_MAGIC
                                                        ? NGHTTP2_PROTOCOL_ERROR
                                                        : NGHTTP2_INTERNAL_ERROR);
        }
        h2_pump(h);
        return h->failed ? IDEM_H2_FAIL : IDEM_H2_END;
    }
    return idem__h2conn_run(h);
}

int idem__h2conn_run(idem_h2conn_t *h)
{
    for (int round = 0; round < 4 && !h->failed; round++) {
        h2_pump(h);
        /* Streams drained enough: their requests may send more.  One of
         * them may be freed only by nghttp2, never by on_proceed. */
        bool woke = false;
        /* Past max_queued_bytes, a connection with nothing queued may
         * still answer one more piece (as conn.c's may): else a stream
         * would wait for an event that never comes to it. */
        bool empty = h->pending == 0 && idem__transport_queued(h->tr) == 0;
        for (idem_link_t *k = h->streams.next; k != &h->streams; k = k->next) {
            h2stream_t *st = IDEM_CONTAINER(k, h2stream_t, link);
            if (st->want_proceed && st->req &&
                stream_pending(st) < IDEM_STREAM_HIGH_MARK / 2 && (empty || !over_cap(h))) {
                st->want_proceed = false;
                woke = true;
                h->l->handler->ops->on_proceed(st->req);
            }
        }
        if (!woke)
            break;
    }
    return h2_verdict(h);
}

/* The earliest of a stream's time limits, 0 when it has none. */
static int64_t stream_deadline(const h2stream_t *st)
{
    int64_t d = 0;
    const int64_t all[] = {st->head_by, st->body_by, st->out_by};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] != 0 && (d == 0 || all[i] < d))
            d = all[i];
    return d;
}

int64_t idem__h2conn_deadline(const idem_h2conn_t *h)
{
    if (h->failed)
        return 0; /* closing now */
    int64_t d = 0;
    for (const idem_link_t *k = h->streams.next; k != &h->streams; k = k->next) {
        int64_t sd = stream_deadline(IDEM_CONTAINER(k, const h2stream_t, link));
        if (sd != 0 && (d == 0 || sd < d))
            d = sd;
    }
    return d;
}

/* Its body paused past body_timeout: as conn.c ends such an HTTP/1.1
 * request, the request answers (408 request-timeout, no key claimed) and
 * the client may stop sending the rest (RST_STREAM NO_ERROR after the
 * answer); a stream with no request to tell, or whose answer began, is
 * reset. */
static void stream_body_timeout(idem_h2conn_t *h, h2stream_t *st)
{
    st->body_by = 0;
    st->body_refused = true;
    if (st->req != NULL && !st->started) {
        h->l->handler->ops->on_body_error(st->req, IDEM_CONN_E_BODY_TIMEOUT);
        if (st->started && !st->closed) {
            st->rst_after = true;
            if (st->req != NULL) /* it did not end its answer: ended here */
                stream_detach(st);
            return;
        }
        stream_detach(st);
    }
    if (!st->closed)
        nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
}

int idem__h2conn_expire(idem_h2conn_t *h)
{
    if (h->failed)
        return IDEM_H2_FAIL;
    int64_t now = now_ms();
    for (idem_link_t *k = h->streams.next; k != &h->streams; k = k->next) {
        h2stream_t *st = IDEM_CONTAINER(k, h2stream_t, link);
        if (st->head_by != 0 && st->head_by <= now) {
            /* A header block never finished (CONTINUATION that never
             * ends): nothing else may come on the connection meanwhile, so
             * it ends, as an HTTP/1.1 head past header_timeout does. */
            idem_handler_t *hd = h->l->handler;
            if (hd->ops->on_refused != NULL)
                hd->ops->on_refused(hd, IDEM_OUT_REQUEST_TIMEOUT, &h->facts);
            st->head_by = 0;
            conn_calm(h, NGHTTP2_CANCEL);
        } else if (st->out_by != 0 && st->out_by <= now &&
                   (nghttp2_session_get_stream_remote_window_size(h->s, st->id) > 0 &&
                    nghttp2_session_get_remote_window_size(h->s) > 0)) {
            /* Its windows are open: what holds it is the transport's queue,
             * which conn.c bounds (body_timeout without a write done). */
            st->out_by = after_ms(body_timeout(h));
        } else if (st->out_by != 0 && st->out_by <= now) {
            /* An answer its client does not take (its flow-control window
             * stays shut): the connection ends, as conn.c ends one whose
             * queue makes no progress, and what it held is given back. */
            st->out_by = 0;
            conn_calm(h, NGHTTP2_CANCEL);
        } else if (st->body_by != 0 && st->body_by <= now) {
            stream_body_timeout(h, st);
        }
    }
    return idem__h2conn_run(h);
}

void idem__h2conn_eof(idem_h2conn_t *h) { h->peer_eof = true; }

void idem__h2conn_shutdown(idem_h2conn_t *h)
{
    if (h->goaway)
        return;
    h->goaway = true;
    /* Streams up to the last one taken finish; nghttp2 refuses later ones. */
    nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(h->s),
                          NGHTTP2_NO_ERROR, NULL, 0);
    h->cr->schedule(h->owner);
}

bool idem__h2conn_idle(const idem_h2conn_t *h) { return h->n_streams == 0; }

size_t idem__h2conn_pending(const idem_h2conn_t *h) { return h->pending; }

void idem__h2conn_destroy(idem_h2conn_t *h)
{
    if (!h)
        return;
    h->destroying = true;
    while (!idem_list_empty(&h->streams)) {
        h2stream_t *st = IDEM_CONTAINER(h->streams.next, h2stream_t, link);
        st->closed = true;
        stream_gone(st);
        stream_free(st);
    }
    nghttp2_session_del(h->s);
    idem__buf_cleanup(&h->wbuf);
    idem_free(h);
}
