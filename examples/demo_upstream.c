/* examples/demo_upstream.c - the demo service `make run` puts behind idemd.
 *
 * A small single-threaded HTTP/1.1 server (libuv) that answers every request
 * with 200 and a JSON account of what it saw:
 *
 *   {"key": <Idempotency-Key or null>, "fence": <Idempotency-Fence or null>,
 *    "executions": <times this key was executed, this one included, or null
 *    without a key>, "method": "POST", "path": "/payments", "body_bytes": N}
 *
 * so that a demo (or a test) can see that a retried request reached it only
 * once.  `GET /count?key=K` answers {"key": K, "executions": N} without
 * counting.  Keys are counted exactly as the header value arrives (idemd
 * forwards it unchanged); the table holds at most MAX_KEYS keys and forgets
 * the oldest first.
 *
 * It is also an example of driving src/http/http.h from an event loop: the
 * head is parsed from the bytes received so far (idem__http_parse_request
 * answers INCOMPLETE until it is whole), copied aside so its slices stay
 * valid, and consumed; the body is then fed through idem_http_body_t as it
 * arrives and only counted, never stored, so a connection holds at most one
 * head plus one read of input whatever the body size (capped at 10 MiB).
 * Keep-alive and pipelining come from the loop in process(): every complete
 * request in the input is answered, in order, and the answers of one read go
 * out in one write.  A client that pipelines without reading its answers
 * is paused (reading stops) while more than WRITE_HIGH bytes wait to be sent.
 * Malformed input gets an error status, "Connection: close", and the
 * connection is closed once the answer is sent.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "http/http.h"

#define MAX_BODY (10u * 1024 * 1024)
#define READ_SIZE (64 * 1024)
#define IN_MAX (IDEM_HTTP_MAX_HEAD + READ_SIZE) /* one unfinished head + one read */
#define OUT_MAX (16u * 1024 * 1024)
#define WRITE_HIGH (1024 * 1024) /* pause reading above this much unsent */
#define MAX_KEYS 100000
#define BUCKETS 131072           /* power of two, > MAX_KEYS */

/* ---- execution counts: a hash table, oldest key evicted first ---------- */

typedef struct entry {
    struct entry *chain;        /* next in the bucket */
    struct entry *newer;        /* insertion order: oldest at counts.oldest */
    uint64_t executions;
    size_t len;
    char key[];
} entry_t;

static struct {
    entry_t *bucket[BUCKETS];
    entry_t *oldest, *newest;
    size_t n;
} counts;

static size_t hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return (size_t)(h & (BUCKETS - 1));
}

static entry_t **find(const char *key, size_t len)
{
    entry_t **p = &counts.bucket[hash(key, len)];
    while (*p && !((*p)->len == len && memcmp((*p)->key, key, len) == 0))
        p = &(*p)->chain;
    return p;
}

static void evict_oldest(void)
{
    entry_t *e = counts.oldest;
    *find(e->key, e->len) = e->chain;
    counts.oldest = e->newer;
    if (counts.oldest == NULL)
        counts.newest = NULL;
    counts.n--;
    free(e);
}

/* Count one execution of key; returns the new count (0: out of memory). */
static uint64_t count_execution(const char *key, size_t len)
{
    entry_t **p = find(key, len);
    if (*p)
        return ++(*p)->executions;
    if (counts.n >= MAX_KEYS) {
        evict_oldest();
        p = find(key, len); /* the chain may have changed */
    }
    entry_t *e = malloc(sizeof *e + len);
    if (e == NULL)
        return 0;
    memcpy(e->key, key, len);
    e->len = len;
    e->executions = 1;
    e->chain = NULL;
    e->newer = NULL;
    *p = e;
    if (counts.newest)
        counts.newest->newer = e;
    else
        counts.oldest = e;
    counts.newest = e;
    counts.n++;
    return 1;
}

static uint64_t executions_of(const char *key, size_t len)
{
    entry_t *e = *find(key, len);
    return e ? e->executions : 0;
}

/* ---- connections -------------------------------------------------------- */

typedef struct conn {
    uv_tcp_t tcp;
    uv_shutdown_t shut;
    idem_buf_t in;            /* received, not yet consumed */
    idem_buf_t head;          /* copy of the current request's head */
    idem_buf_t out;           /* answers not yet handed to libuv */
    idem_http_head_state_t hs;
    idem_http_msg_t msg;      /* the current request; slices into head */
    idem_http_body_t body;
    bool in_body;             /* head done, body being read */
    bool closing;             /* answer queued with Connection: close */
    bool paused;              /* reading stopped for backpressure */
    bool shutting;            /* uv_shutdown queued; closes when it ends */
} conn_t;

typedef struct wreq {
    uv_write_t req;
    idem_buf_t buf;
} wreq_t;

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void on_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    idem__buf_cleanup(&c->in);
    idem__buf_cleanup(&c->head);
    idem__buf_cleanup(&c->out);
    free(c);
}

static void conn_close(conn_t *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* Close after everything queued has been written (shutdown waits for it). */
static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_close(req->data);
}

static void finish(conn_t *c)
{
    if (c->shutting || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    c->shutting = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    static char space[READ_SIZE]; /* single thread: used up by on_read at once */
    *buf = uv_buf_init(space, sizeof space);
}

static void on_written(uv_write_t *req, int status)
{
    wreq_t *w = (wreq_t *)req;
    conn_t *c = req->handle->data;
    idem__buf_cleanup(&w->buf);
    free(w);
    if (status != 0) {
        conn_close(c);
        return;
    }
    uv_stream_t *s = (uv_stream_t *)&c->tcp;
    if (c->paused && !c->shutting && !uv_is_closing((uv_handle_t *)s) &&
        uv_stream_get_write_queue_size(s) < WRITE_HIGH / 4) {
        c->paused = false;
        uv_read_start(s, on_alloc, on_read);
    }
}

/* Hand the answers gathered so far to libuv as one write. */
static void flush(conn_t *c)
{
    if (c->out.len == 0 || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    wreq_t *w = malloc(sizeof *w);
    if (w == NULL) {
        conn_close(c);
        return;
    }
    w->buf = c->out;
    idem__buf_init(&c->out, OUT_MAX);
    uv_buf_t b = uv_buf_init(w->buf.data, (unsigned)w->buf.len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        idem__buf_cleanup(&w->buf);
        free(w);
        conn_close(c);
        return;
    }
    if (!c->closing && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > WRITE_HIGH) {
        c->paused = true;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
}

/* ---- answers ------------------------------------------------------------ */

/* A JSON string of s, or null when s is NULL.  Bytes that are not ASCII
 * become '?', so odd header bytes cannot make the answer invalid JSON. */
static json_t *jstr(const char *s, size_t n)
{
    if (s == NULL)
        return json_null();
    char *copy = malloc(n + 1);
    if (copy == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        copy[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    json_t *j = json_stringn(copy, n);
    free(copy);
    return j;
}

static void reply(conn_t *c, int status, json_t *body, bool head_only)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL) {
        status = 500;
        c->closing = true;
    }
    size_t len = text ? strlen(text) : 0;
    if (idem__http_write_status(&c->out, status) != 0 ||
        idem__buf_append_str(&c->out, "Content-Type: application/json\r\n") != 0 ||
        idem__buf_appendf(&c->out, "Content-Length: %zu\r\n%s\r\n", len + 1,
                          c->closing ? "Connection: close\r\n" : "") != 0 ||
        (!head_only &&
         (idem__buf_append(&c->out, text, len) != 0 || idem__buf_append(&c->out, "\n", 1) != 0)))
        c->closing = true; /* out of room: drop the connection */
    free(text);
}

static void reply_error(conn_t *c, int status, const char *what)
{
    c->closing = true;
    reply(c, status, json_pack("{s:s}", "error", what), false);
}

static const char *field(const idem_http_msg_t *m, const char *name, size_t *len)
{
    const idem_http_field_t *f = idem__http_find(m, name);
    *len = f ? f->value.len : 0;
    return f ? f->value.ptr : NULL;
}

/* The request in c->msg is complete (body_bytes of body): answer it. */
static void answer(conn_t *c)
{
    const idem_http_msg_t *m = &c->msg;
    const char *target = m->target.ptr;
    const char *qmark = memchr(target, '?', m->target.len);
    size_t path_len = qmark ? (size_t)(qmark - target) : m->target.len;
    bool head_only = m->method.len == 4 && memcmp(m->method.ptr, "HEAD", 4) == 0;
    bool is_get = head_only || (m->method.len == 3 && memcmp(m->method.ptr, "GET", 3) == 0);
    if (!m->keep_alive)
        c->closing = true;

    if (is_get && path_len == 6 && memcmp(target, "/count", 6) == 0) {
        char key[IDEM_HTTP_MAX_HEAD];
        long n = qmark ? idem__http_query_param(qmark + 1, m->target.len - path_len - 1, "key",
                                                key, sizeof key)
                       : -1;
        if (n < 0) {
            reply(c, 400, json_pack("{s:s}", "error", "want /count?key=K"), head_only);
            return;
        }
        reply(c, 200,
              json_pack("{s:o, s:I}", "key", jstr(key, (size_t)n), "executions",
                        (json_int_t)executions_of(key, (size_t)n)),
              head_only);
        return;
    }

    size_t klen, flen;
    const char *key = field(m, "Idempotency-Key", &klen);
    const char *fence = field(m, "Idempotency-Fence", &flen);
    json_t *executions = json_null();
    if (key != NULL) {
        uint64_t n = count_execution(key, klen);
        executions = n ? json_integer((json_int_t)n) : json_null();
    }
    /* The fence is a number; show it as one when it is (up to 18 digits). */
    json_int_t fence_num = 0;
    size_t digits = 0;
    while (fence != NULL && digits < flen && digits < 18 && fence[digits] >= '0' &&
           fence[digits] <= '9')
        fence_num = fence_num * 10 + (fence[digits++] - '0');
    json_t *jfence = flen > 0 && digits == flen ? json_integer(fence_num) : jstr(fence, flen);
    reply(c, 200,
          json_pack("{s:o, s:o, s:o, s:o, s:o, s:I}", "key", jstr(key, klen), "fence", jfence,
                    "executions", executions, "method", jstr(m->method.ptr, m->method.len),
                    "path", jstr(target, path_len), "body_bytes", (json_int_t)c->body.total),
          head_only);
}

/* A head of length head_len is at the start of c->in: keep a copy whose
 * slices stay valid while the body streams through c->in. */
static int start_request(conn_t *c, size_t head_len)
{
    idem__buf_reset(&c->head);
    if (idem__buf_append(&c->head, c->in.data, head_len) != 0)
        return -1;
    idem__buf_consume(&c->in, head_len);
    idem_http_head_state_t st = {0};
    if (idem__http_parse_request(&st, c->head.data, c->head.len, IDEM_HTTP_MAX_HEAD, &c->msg) <=
        0)
        return -1;
    memset(&c->hs, 0, sizeof c->hs);
    idem__http_body_init(&c->body, &c->msg, MAX_BODY);
    c->in_body = true;
    if (c->msg.expect_continue && c->msg.framing != IDEM_HTTP_BODY_NONE &&
        c->msg.content_length <= MAX_BODY)
        idem__buf_append_str(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
    return 0;
}

static int error_status(int rc)
{
    switch (rc) {
    case IDEM_HTTP_E_HEAD_TOO_LARGE:
    case IDEM_HTTP_E_TOO_MANY_HEADERS: return 431;
    case IDEM_HTTP_E_VERSION: return 505;
    case IDEM_HTTP_E_BODY_TOO_LARGE: return 413;
    default: return 400;
    }
}

/* Answer every complete request in c->in, in order. */
static void process(conn_t *c)
{
    while (!c->closing) {
        if (!c->in_body) {
            int rc = idem__http_parse_request(&c->hs, c->in.data, c->in.len, IDEM_HTTP_MAX_HEAD,
                                              &c->msg);
            if (rc == IDEM_HTTP_INCOMPLETE)
                break;
            if (rc < 0) {
                reply_error(c, error_status(rc), "malformed request");
                break;
            }
            if (c->msg.framing == IDEM_HTTP_BODY_LENGTH && c->msg.content_length > MAX_BODY) {
                reply_error(c, 413, "body larger than 10 MiB");
                break;
            }
            if (start_request(c, (size_t)rc) != 0) {
                reply_error(c, 500, "out of memory");
                break;
            }
        }
        size_t used;
        idem_slice_t data;
        int rc = idem__http_body_feed(&c->body, c->in.data, c->in.len, &used, &data);
        idem__buf_consume(&c->in, used);
        if (rc == IDEM_HTTP_BODY_DATA)
            continue; /* only counted (c->body.total) */
        if (rc == IDEM_HTTP_INCOMPLETE)
            break;
        if (rc == IDEM_HTTP_BODY_DONE) {
            c->in_body = false;
            answer(c);
            continue;
        }
        reply_error(c, error_status(rc), "malformed body");
    }
    flush(c);
    if (c->closing)
        finish(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (nread == UV_EOF) {
        finish(c); /* let what is queued go out, then close */
        return;
    }
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (c->closing)
        return;
    if (idem__buf_append(&c->in, buf->base, (size_t)nread) != 0) {
        reply_error(c, 431, "request head too large");
        flush(c);
        finish(c);
        return;
    }
    process(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    if (status != 0)
        return;
    conn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    idem__buf_init(&c->in, IN_MAX);
    idem__buf_init(&c->head, IDEM_HTTP_MAX_HEAD);
    idem__buf_init(&c->out, OUT_MAX);
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
}

/* ---- main --------------------------------------------------------------- */

/* "HOST:PORT" with a numeric IPv4 host, [IPv6] or localhost. */
static int parse_listen(const char *s, struct sockaddr_storage *sa)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || port < 1 || port > 65535)
        return -1;
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)sa);
    }
    if (strcmp(host, "localhost") == 0)
        return uv_ip4_addr("127.0.0.1", (int)port, (struct sockaddr_in *)sa);
    return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)sa);
}

int main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:9000";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
            listen = argv[++i];
        } else if (strncmp(argv[i], "--listen=", 9) == 0) {
            listen = argv[i] + 9;
        } else {
            fprintf(stderr, "usage: demo-upstream [--listen HOST:PORT]  (default 127.0.0.1:9000)\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    if (parse_listen(listen, &sa) != 0) {
        fprintf(stderr, "demo-upstream: --listen: not HOST:PORT: '%s'\n", listen);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    uv_loop_t *loop = uv_default_loop();
    uv_tcp_t server;
    uv_tcp_init(loop, &server);
    int rc = uv_tcp_bind(&server, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&server, 511, on_connection);
    if (rc != 0) {
        fprintf(stderr, "demo-upstream: cannot listen on %s: %s\n", listen, uv_strerror(rc));
        return 1;
    }
    fprintf(stderr, "demo-upstream: listening on %s\n", listen);
    return uv_run(loop, UV_RUN_DEFAULT);
}
