/* tests/unit/test_upstream.c - the upstream client (src/gateway/upstream.c)
 * against a real upstream on a loopback socket.
 *
 * The upstream is a small server of the test's own: a thread accepts, and a
 * thread per connection reads each request (its head, then a body of its
 * Content-Length) and does what the test scripted: answer with given bytes,
 * close, or say nothing.  It counts connections and requests, so that a
 * test sees whether the client reused a pooled connection.
 *
 * A second upstream (mis_t) misbehaves on purpose: its first connection
 * sends bytes out of turn (after a complete response, or before any
 * request) at a moment the test chooses by events, a pipe each way, and
 * the test waits for those bytes to be in the client's socket (poll) before
 * it goes on; every other connection answers FRESH_ANSWER.  So a test sees
 * whether late bytes are ever taken as another call's answer.
 *
 * A third (tsrv_t) speaks TLS with OpenSSL, with the certificates of
 * tests/certs.py, for the client set up with idem__upstream_set_tls.
 *
 * The client runs on the test's own uv loop.  Each callback records itself
 * in order, and whether it ran inside idem__upstream_req_start or _resume:
 * none may.  No verdict depends on timing: a timeout test uses an upstream
 * that never answers, where a timeout is the only possible end.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "cert_fixture.h"
#include "gateway/upstream.h"
#include "net_fixture.h"

/* ---- the upstream -------------------------------------------------------- */

typedef enum {
    SRV_ANSWER, /* read each request, send the script's answer */
    SRV_CLOSE,  /* read the request, close without a word */
    SRV_SILENT, /* read the request, say nothing until the client goes */
} srv_mode_t;

typedef struct {
    tnet_server_t net; /* port, accepts */
    srv_mode_t mode;
    const char *answer; /* SRV_ANSWER: sent after each request */
    bool close_after;   /* SRV_ANSWER: close once it is sent */
    /* From the second request on (any connection): this answer instead, or
     * silence when later_silent. */
    const char *later_answer;
    bool later_silent;
    atomic_int requests;
    char last_request[4096]; /* the last request head and body, NUL-terminated */
    pthread_mutex_t mu;
} srv_t;

static void srv_serve(void *ctx, int fd, int index)
{
    (void)index;
    srv_t *s = ctx;
    char buf[4096];
    for (;;) {
        size_t n = tnet_read_request(fd, buf, sizeof buf);
        if (n == 0)
            break;
        atomic_fetch_add(&s->requests, 1);
        pthread_mutex_lock(&s->mu);
        memcpy(s->last_request, buf, n + 1);
        pthread_mutex_unlock(&s->mu);
        bool later = atomic_load(&s->requests) > 1;
        if (s->mode == SRV_CLOSE)
            break;
        if (s->mode == SRV_SILENT || (later && s->later_silent)) {
            while (read(fd, buf, sizeof buf) > 0) {
            }
            break;
        }
        const char *answer = later && s->later_answer ? s->later_answer : s->answer;
        if (!tnet_write_all(fd, answer, strlen(answer)))
            break;
        if (s->close_after)
            break;
    }
    close(fd);
}

static void srv_start(srv_t *s, srv_mode_t mode, const char *answer, bool close_after)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->mode = mode;
    s->answer = answer;
    s->close_after = close_after;
    tnet_server_start(&s->net, srv_serve, s);
}

/* After the client has closed every connection: join every thread. */
static void srv_stop(srv_t *s)
{
    tnet_server_stop(&s->net);
    pthread_mutex_destroy(&s->mu);
}

/* ---- the client, and what its callbacks saw ------------------------------- */

typedef struct {
    char order[32]; /* 'h' head, 'b' body, 'd' done, 'f' failure, in order */
    size_t n;
    idem_up_result_t why;
    char body[8192];
    size_t body_len;
    bool inside_call;   /* set around start/resume */
    bool ran_inside;    /* a callback ran while inside_call */
    bool ended;
    int status;         /* ur->resp.status at on_head */
    /* on_body's answers: pause after this many pieces (0: never) */
    int pause_after;
    bool pause_hold;    /* pause with idem__upstream_req_pause, not by answer */
    bool cancel_in_body;
    int pieces;
} rec_t;

static void note(rec_t *r, char what)
{
    if (r->inside_call)
        r->ran_inside = true;
    if (r->n < sizeof r->order - 1)
        r->order[r->n++] = what;
}

static void cb_head(idem_upstream_req_t *ur)
{
    rec_t *r = ur->data;
    note(r, 'h');
    r->status = ur->resp.status;
}

static idem_up_body_t cb_body(idem_upstream_req_t *ur, const char *p, size_t n)
{
    rec_t *r = ur->data;
    note(r, 'b');
    cr_assert_leq(r->body_len + n, sizeof r->body);
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->pieces++;
    if (r->cancel_in_body) {
        idem__upstream_req_cancel(ur);
        r->ended = true;
        return IDEM_UP_BODY_MORE;
    }
    if (r->pause_after > 0 && r->pieces == r->pause_after) {
        if (r->pause_hold) {
            idem__upstream_req_pause(ur);
            return IDEM_UP_BODY_MORE;
        }
        return IDEM_UP_BODY_PAUSE;
    }
    return IDEM_UP_BODY_MORE;
}

static void cb_done(idem_upstream_req_t *ur)
{
    rec_t *r = ur->data;
    note(r, 'd');
    cr_assert(!idem__upstream_req_active(ur), "the call has ended before on_done");
    r->ended = true;
}

static void cb_failure(idem_upstream_req_t *ur, idem_up_result_t why)
{
    rec_t *r = ur->data;
    note(r, 'f');
    cr_assert(!idem__upstream_req_active(ur), "the call has ended before on_failure");
    r->why = why;
    r->ended = true;
}

static const idem_upstream_cbs_t cbs = {
    .on_head = cb_head,
    .on_body = cb_body,
    .on_done = cb_done,
    .on_failure = cb_failure,
};

typedef struct {
    uv_loop_t loop;
    idem_upstream_t client;
} fix_t;

static void fix_init(fix_t *f, int port, uint64_t timeout_ms, size_t idle_max)
{
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    idem__upstream_init(&f->client, &f->loop, (const struct sockaddr *)&a, timeout_ms, idle_max);
}

/* Close the client and run the loop dry: every handle closed, nothing left
 * (ASan's leak check sees the rest). */
static void fix_cleanup(fix_t *f)
{
    idem__upstream_close(&f->client);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a handle of the client is still open");
}

static const char *const GET = "GET /x HTTP/1.1\r\nHost: up\r\n\r\n";

/* Start a call of req (a head, a body) with r as its data, and check that
 * no callback ran inside the start. */
static void start(fix_t *f, idem_upstream_req_t *ur, rec_t *r, const char *head, const char *body)
{
    memset(ur, 0, sizeof *ur);
    ur->data = r;
    idem_buf_t h;
    idem__buf_init(&h, 0);
    cr_assert_eq(idem__buf_append_str(&h, head), 0);
    const char *sp = strchr(head, ' ');
    idem_slice_t method = {head, (size_t)(sp - head)};
    r->inside_call = true;
    idem__upstream_req_start(&f->client, ur, &cbs, &h, body, body ? strlen(body) : 0, method);
    r->inside_call = false;
    cr_assert_eq(h.len, 0, "the head is taken by the call");
    idem__buf_cleanup(&h);
    cr_assert_eq(r->n, 0, "a callback ran inside idem__upstream_req_start");
    cr_assert(idem__upstream_req_active(ur));
}

static void run_until_ended(fix_t *f, rec_t *r)
{
    while (!r->ended)
        uv_run(&f->loop, UV_RUN_ONCE);
}

/* A port on loopback that nothing listens on: bound (so no one else takes
 * it while the test runs) but not listening, so a connect is refused. */
static int dead_port(int *fd_out)
{
    int port;
    *fd_out = tnet_bind_loopback(&port);
    return port;
}

/* A test upstream, a client of it, and one call on it that has ended:
 * the test looks at r, ur and the client, then one_end. */
typedef struct {
    srv_t s;
    fix_t f;
    idem_upstream_req_t ur;
    rec_t r;
} one_t;

/* Start an upstream (srv_start's mode, answer, close_after), and make the
 * call of head and body on a new client until it ends. */
static void one_call(one_t *o, srv_mode_t mode, const char *answer, bool close_after,
                     const char *head, const char *body)
{
    srv_start(&o->s, mode, answer, close_after);
    fix_init(&o->f, o->s.net.port, 5000, 8);
    memset(&o->r, 0, sizeof o->r);
    start(&o->f, &o->ur, &o->r, head, body);
    run_until_ended(&o->f, &o->r);
}

static void one_end(one_t *o)
{
    idem__upstream_req_cleanup(&o->ur);
    fix_cleanup(&o->f);
    srv_stop(&o->s);
}

/* ---- the outcomes ------------------------------------------------------------- */

Test(upstream, connect_refused_is_reported_later)
{
    int dfd;
    fix_t f;
    fix_init(&f, dead_port(&dfd), 5000, 8);
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    run_until_ended(&f, &r);
    cr_assert_str_eq(r.order, "f");
    cr_assert_eq(r.why, IDEM_UP_CONNECT_FAILED);
    cr_assert(!r.ran_inside);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    close(dfd);
}

Test(upstream, unbuilt_head_fails_later_as_connect_failed)
{
    int dfd;
    fix_t f;
    fix_init(&f, dead_port(&dfd), 5000, 8);
    idem_upstream_req_t ur;
    memset(&ur, 0, sizeof ur);
    rec_t r = {0};
    ur.data = &r;
    r.inside_call = true;
    idem__upstream_req_start(&f.client, &ur, &cbs, NULL, NULL, 0, (idem_slice_t){"GET", 3});
    r.inside_call = false;
    cr_assert_eq(r.n, 0, "the failure was reported inside idem__upstream_req_start");
    run_until_ended(&f, &r);
    cr_assert_str_eq(r.order, "f");
    cr_assert_eq(r.why, IDEM_UP_CONNECT_FAILED);
    fix_cleanup(&f);
    close(dfd);
}

Test(upstream, cancelled_before_its_failure_is_reported_hears_nothing)
{
    int dfd;
    fix_t f;
    fix_init(&f, dead_port(&dfd), 5000, 8);
    idem_upstream_req_t ur;
    memset(&ur, 0, sizeof ur);
    rec_t r = {0};
    ur.data = &r;
    idem__upstream_req_start(&f.client, &ur, &cbs, NULL, NULL, 0, (idem_slice_t){"GET", 3});
    idem__upstream_req_cancel(&ur);
    cr_assert(!idem__upstream_req_active(&ur));
    uv_run(&f.loop, UV_RUN_NOWAIT);
    fix_cleanup(&f);
    cr_assert_eq(r.n, 0, "a cancelled call's callback ran");
    close(dfd);
}

Test(upstream, success_runs_head_body_done_in_order)
{
    one_t o;
    one_call(&o, SRV_ANSWER, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
             false, "POST /p HTTP/1.1\r\nHost: up\r\nContent-Length: 3\r\n\r\n", "abc");
    cr_assert_str_eq(o.r.order, "hbd");
    cr_assert_eq(o.r.status, 201);
    cr_assert_eq(o.r.body_len, 5);
    cr_assert_arr_eq(o.r.body, "hello", 5);
    cr_assert_eq(o.ur.resp.n_fields, 2);
    cr_assert(o.ur.resp.fields[1].value.ptr >= o.ur.resp_head,
              "resp points into the call's copy");
    cr_assert(!o.r.ran_inside);
    pthread_mutex_lock(&o.s.mu);
    cr_assert(strstr(o.s.last_request, "\r\n\r\nabc") != NULL, "the body went after the head");
    pthread_mutex_unlock(&o.s.mu);
    one_end(&o);
}

Test(upstream, chunked_body_comes_whole_and_interim_answers_are_skipped)
{
    one_t o;
    one_call(&o, SRV_ANSWER,
             "HTTP/1.1 100 Continue\r\n\r\n"
             "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
             false, GET, NULL);
    cr_assert_eq(o.r.order[0], 'h');
    cr_assert_eq(o.r.order[o.r.n - 1], 'd');
    for (size_t i = 1; i + 1 < o.r.n; i++)
        cr_assert_eq(o.r.order[i], 'b', "%s", o.r.order);
    cr_assert_eq(o.r.status, 200);
    cr_assert_eq(o.r.body_len, 7);
    cr_assert_arr_eq(o.r.body, "abcdefg", 7);
    one_end(&o);
}

Test(upstream, close_delimited_body_ends_at_close)
{
    one_t o;
    one_call(&o, SRV_ANSWER, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", true,
             GET, NULL);
    cr_assert_eq(o.r.order[o.r.n - 1], 'd', "%s", o.r.order);
    cr_assert_eq(o.r.body_len, 13);
    cr_assert_eq(idem__upstream_idle_count(&o.f.client), 0, "a closed connection is not pooled");
    one_end(&o);
}

Test(upstream, close_before_an_answer_is_broken)
{
    one_t o;
    one_call(&o, SRV_CLOSE, NULL, false, GET, NULL);
    cr_assert_str_eq(o.r.order, "f");
    cr_assert_eq(o.r.why, IDEM_UP_BROKEN);
    one_end(&o);
}

Test(upstream, close_inside_a_body_is_broken)
{
    one_t o;
    one_call(&o, SRV_ANSWER, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", true, GET,
             NULL);
    cr_assert_eq(o.r.order[0], 'h');
    cr_assert_eq(o.r.order[o.r.n - 1], 'f', "%s", o.r.order);
    cr_assert_eq(o.r.why, IDEM_UP_BROKEN);
    one_end(&o);
}

static void call_once(fix_t *f, rec_t *r);

Test(upstream, silence_is_a_timeout)
{
    /* The silent call goes on a pooled connection, so that its timer starts
     * with the send: no connect that a loaded machine makes slow comes
     * first, and a timeout is its only possible end. */
    srv_t s;
    srv_start(&s, SRV_ANSWER, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false);
    s.later_silent = true;
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    f.client.timeout_ms = 100;
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    run_until_ended(&f, &r);
    cr_assert_str_eq(r.order, "f");
    cr_assert_eq(r.why, IDEM_UP_TIMEOUT);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    srv_stop(&s);
    cr_assert_eq(atomic_load(&s.requests), 2, "the request was sent before the timeout");
    cr_assert_eq(atomic_load(&s.net.accepts), 1);
}

Test(upstream, garbage_is_a_bad_response)
{
    one_t o;
    one_call(&o, SRV_ANSWER, "this is not HTTP\r\n\r\n", false, GET, NULL);
    cr_assert_str_eq(o.r.order, "f");
    cr_assert_eq(o.r.why, IDEM_UP_BAD_RESPONSE);
    one_end(&o);
}

Test(upstream, switching_protocols_is_a_bad_response)
{
    one_t o;
    one_call(&o, SRV_ANSWER, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", false, GET,
             NULL);
    cr_assert_str_eq(o.r.order, "f");
    cr_assert_eq(o.r.why, IDEM_UP_BAD_RESPONSE);
    one_end(&o);
}

/* ---- the pool ---------------------------------------------------------------- */

#define OK_ANSWER "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

static void call_once(fix_t *f, rec_t *r)
{
    idem_upstream_req_t ur;
    start(f, &ur, r, GET, NULL);
    run_until_ended(f, r);
    cr_assert_eq(r->order[r->n - 1], 'd', "%s", r->order);
    idem__upstream_req_cleanup(&ur);
}

Test(upstream, keep_alive_connection_is_reused)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, OK_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    rec_t r1 = {0}, r2 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    call_once(&f, &r2);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    cr_assert_eq(atomic_load(&s.requests), 2);
    cr_assert_eq(atomic_load(&s.net.accepts), 1, "the second call took the pooled connection");
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, connection_close_answer_is_not_pooled)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
              true);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    rec_t r1 = {0}, r2 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0);
    call_once(&f, &r2);
    cr_assert_eq(atomic_load(&s.net.accepts), 2);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, pool_keeps_at_most_idle_max)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, OK_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 0);
    rec_t r1 = {0}, r2 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0);
    call_once(&f, &r2);
    cr_assert_eq(atomic_load(&s.net.accepts), 2);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, stopped_client_pools_nothing)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, OK_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    rec_t r1 = {0}, r2 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    idem__upstream_stop(&f.client);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0);
    call_once(&f, &r2);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0);
    fix_cleanup(&f);
    srv_stop(&s);
}

/* ---- pausing, resuming, cancelling ---------------------------------------------- */

/* A body sent in pieces the client reads apart: chunked, one chunk per
 * write would still be one read at times, so the test only relies on the
 * pause taking effect after the first piece, whatever it holds. */
#define CHUNKED_ANSWER                                                                             \
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"                                        \
    "5\r\nfirst\r\n6\r\nsecond\r\n5\r\nthird\r\n0\r\n\r\n"

static void paused_then_resumed(bool hold)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, CHUNKED_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    idem_upstream_req_t ur;
    rec_t r = {.pause_after = 1, .pause_hold = hold};
    start(&f, &ur, &r, GET, NULL);
    while (r.pieces < 1 && !r.ended)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(r.pieces, 1);
    /* Paused: the loop turns, nothing more is delivered. */
    for (int i = 0; i < 5; i++)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(r.pieces, 1, "a paused call delivered more");
    cr_assert(!r.ended);
    size_t before = r.n;
    r.inside_call = true;
    idem__upstream_req_resume(&ur);
    r.inside_call = false;
    cr_assert_eq(r.n, before, "a callback ran inside idem__upstream_req_resume");
    run_until_ended(&f, &r);
    cr_assert(!r.ran_inside);
    cr_assert_eq(r.order[r.n - 1], 'd', "%s", r.order);
    cr_assert_eq(r.body_len, 16);
    cr_assert_arr_eq(r.body, "firstsecondthird", 16);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, body_paused_by_answer_resumes_later)
{
    paused_then_resumed(false);
}

Test(upstream, body_held_by_pause_resumes_later)
{
    paused_then_resumed(true);
}

static void on_test_timer(uv_timer_t *t)
{
    (void)t; /* a one-shot timer stops by itself */
}

Test(upstream, held_call_runs_no_timeout)
{
    /* The first chunk comes, then nothing: held, the call is not timed out
     * however long the loop turns; resumed, the silence is.  The call goes
     * on a pooled connection (no connect inside its timeout). */
    srv_t s;
    srv_start(&s, SRV_ANSWER, OK_ANSWER, false);
    s.later_answer = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n";
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    f.client.timeout_ms = 1000;
    idem_upstream_req_t ur;
    rec_t r = {.pause_after = 1, .pause_hold = true};
    start(&f, &ur, &r, GET, NULL);
    while (r.pieces < 1 && !r.ended)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(r.pieces, 1);
    /* A timer of the test's own, due after any call timeout started before
     * it: libuv runs due timers in order, so a running call timeout would
     * fire first. */
    uv_timer_t t;
    uv_timer_init(&f.loop, &t);
    uv_timer_start(&t, on_test_timer, 1100, 0);
    while (uv_is_active((uv_handle_t *)&t))
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert(!r.ended, "a held call timed out");
    uv_close((uv_handle_t *)&t, NULL);
    f.client.timeout_ms = 50; /* the silence after the resume */
    idem__upstream_req_resume(&ur);
    run_until_ended(&f, &r);
    cr_assert_eq(r.order[r.n - 1], 'f');
    cr_assert_eq(r.why, IDEM_UP_TIMEOUT);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, cancel_inside_on_body_ends_the_call)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, CHUNKED_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    idem_upstream_req_t ur;
    rec_t r = {.cancel_in_body = true};
    start(&f, &ur, &r, GET, NULL);
    run_until_ended(&f, &r);
    cr_assert(!idem__upstream_req_active(&ur));
    for (int i = 0; i < 5; i++)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_str_eq(r.order, "hb", "nothing after the cancel");
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0,
                 "a cancelled call's connection is closed");
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream, cancel_while_connecting_hears_nothing)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, OK_ANSWER, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    idem__upstream_req_cancel(&ur);
    idem__upstream_req_cancel(&ur); /* twice: nothing more */
    fix_cleanup(&f);
    cr_assert_eq(r.n, 0, "a cancelled call's callback ran");
    idem__upstream_req_cleanup(&ur);
    srv_stop(&s);
}

/* ---- a misbehaving upstream: bytes out of turn ------------------------------------ */

/* An upstream whose first connection answers its first request with `first`
 * and then sends `late`, bytes that answer nothing, at a moment the test
 * decides by events: when the test says go, or when a next request comes
 * on that connection (the worst moment: the client has just reused it).
 * Every other connection answers each request with FRESH_ANSWER.  The
 * first connection, its script played, reads to its end and then holds
 * until mis_stop, so that a close the test sees is the client's own. */
typedef enum {
    MIS_LATE_ON_GO,     /* after first: wait for go, send late, then say done */
    MIS_LATE_ON_NEXT,   /* after first: a next request on it gets late */
    MIS_CLOSE,          /* after first: close (no Connection: close said), say done */
    MIS_CLOSE_ON_NEXT,  /* after first: read a next request, close without a word */
    MIS_HOLD,           /* after first: say nothing */
    MIS_SPEAK_FIRST,    /* at accept, before reading: send late, say done */
} mis_mode_t;

#define FRESH_ANSWER "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh"
#define STOLEN "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstolen" /* 44 bytes */

typedef struct {
    tnet_server_t net; /* port, accepts */
    mis_mode_t mode;
    const char *first;
    const char *late;
    int go[2];   /* the test writes a byte: send late now */
    int done[2]; /* the upstream writes a byte: late is sent, or the connection closed */
    int stop[2]; /* mis_stop closes its write end */
    atomic_int requests;       /* on every connection */
    atomic_int first_requests; /* on the first connection */
} mis_t;

static void signal_byte(int fd)
{
    ssize_t w = write(fd, "x", 1);
    (void)w; /* the reader fails its wait if this is lost */
}

static void wait_byte(int fd)
{
    char b;
    while (read(fd, &b, 1) < 0) {
    }
}

static void mis_first_conn(mis_t *m, int fd)
{
    char buf[4096];
    if (m->mode == MIS_SPEAK_FIRST) {
        tnet_write_all(fd, m->late, strlen(m->late));
        signal_byte(m->done[1]);
    } else if (tnet_read_request(fd, buf, sizeof buf) > 0) {
        atomic_fetch_add(&m->requests, 1);
        atomic_fetch_add(&m->first_requests, 1);
        tnet_write_all(fd, m->first, strlen(m->first));
        switch (m->mode) {
        case MIS_LATE_ON_GO:
            wait_byte(m->go[0]);
            tnet_write_all(fd, m->late, strlen(m->late));
            signal_byte(m->done[1]);
            break;
        case MIS_LATE_ON_NEXT:
        case MIS_CLOSE_ON_NEXT:
            if (tnet_read_request(fd, buf, sizeof buf) > 0) {
                atomic_fetch_add(&m->requests, 1);
                atomic_fetch_add(&m->first_requests, 1);
                if (m->mode == MIS_CLOSE_ON_NEXT) {
                    close(fd);
                    return;
                }
                tnet_write_all(fd, m->late, strlen(m->late));
            }
            break;
        case MIS_CLOSE:
            close(fd);
            signal_byte(m->done[1]);
            return;
        default:
            break;
        }
    }
    /* To the end of what the client sends (counting requests), then hold. */
    while (tnet_read_request(fd, buf, sizeof buf) > 0) {
        atomic_fetch_add(&m->requests, 1);
        atomic_fetch_add(&m->first_requests, 1);
    }
    wait_byte(m->stop[0]); /* 0 bytes at mis_stop */
    close(fd);
}

static void mis_serve(void *ctx, int fd, int index)
{
    mis_t *m = ctx;
    if (index == 0) {
        mis_first_conn(m, fd);
        return;
    }
    char buf[4096];
    while (tnet_read_request(fd, buf, sizeof buf) > 0) {
        atomic_fetch_add(&m->requests, 1);
        tnet_write_all(fd, FRESH_ANSWER, strlen(FRESH_ANSWER));
    }
    close(fd);
}

static void mis_start(mis_t *m, mis_mode_t mode, const char *first, const char *late)
{
    memset(m, 0, sizeof *m);
    m->mode = mode;
    m->first = first;
    m->late = late;
    cr_assert_eq(pipe(m->go), 0);
    cr_assert_eq(pipe(m->done), 0);
    cr_assert_eq(pipe(m->stop), 0);
    tnet_server_start(&m->net, mis_serve, m);
}

/* After the client has closed every connection. */
static void mis_stop(mis_t *m)
{
    close(m->stop[1]);
    tnet_server_stop(&m->net);
    close(m->stop[0]);
    close(m->go[0]);
    close(m->go[1]);
    close(m->done[0]);
    close(m->done[1]);
}

static void find_tcp(uv_handle_t *h, void *arg)
{
    uv_os_fd_t fd;
    if (h->type == UV_TCP && !uv_is_closing(h) && uv_fileno(h, &fd) == 0)
        *(int *)arg = fd;
}

/* The socket of the client's one open connection. */
static int client_fd(fix_t *f)
{
    int fd = -1;
    uv_walk(&f->loop, find_tcp, &fd);
    cr_assert_geq(fd, 0, "the client has no open connection");
    return fd;
}

/* Until fd has something to read, or its end: the event, not a time.  The
 * bound only ends a test whose event never comes. */
static void wait_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 30000), 1, "the upstream's bytes never reached the client");
}

/* A second call: it must get FRESH_ANSWER, from a new connection. */
static void second_call_is_answered_fresh(fix_t *f, mis_t *m, const char *head)
{
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(f, &ur, &r, head, NULL);
    run_until_ended(f, &r);
    cr_assert_eq(r.order[r.n - 1], 'd', "%s (why %d)", r.order, (int)r.why);
    cr_assert_eq(r.body_len, 5, "the second call got %.*s", (int)r.body_len, r.body);
    cr_assert_arr_eq(r.body, "fresh", 5);
    cr_assert_eq(atomic_load(&m->net.accepts), 2, "the second call went on a new connection");
    idem__upstream_req_cleanup(&ur);
}

/* The bytes are in the pooled connection's socket, unread, when the next
 * call starts (the loop has not turned since): the peek before the write
 * sees them, the connection is closed, and the call goes on a new one. */
static void late_bytes_waiting(const char *first, const char *late)
{
    mis_t m;
    mis_start(&m, MIS_LATE_ON_GO, first, late);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    signal_byte(m.go[1]);
    wait_byte(m.done[0]);
    wait_readable(client_fd(&f));
    second_call_is_answered_fresh(&f, &m, GET);
    cr_assert_eq(atomic_load(&m.first_requests), 1, "a request was sent on the talking connection");
    fix_cleanup(&f);
    mis_stop(&m);
}

Test(upstream_mixing, extra_response_waiting_in_a_pooled_connection_is_no_answer)
{
    late_bytes_waiting(OK_ANSWER, STOLEN);
}

Test(upstream_mixing, body_longer_than_its_length_is_no_answer)
{
    /* The upstream's body is "ok" and more than its Content-Length says. */
    late_bytes_waiting("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", STOLEN);
}

Test(upstream_mixing, body_after_a_204_without_framing_is_no_answer)
{
    late_bytes_waiting("HTTP/1.1 204 No Content\r\n\r\n", STOLEN);
}

/* The response's framing leaves doubt: the bytes that follow come only once
 * the connection carries the next request (the worst moment).  The
 * connection must not have been pooled at all. */
static void doubtful_framing(const char *method_head, const char *first)
{
    mis_t m;
    mis_start(&m, MIS_LATE_ON_NEXT, first, STOLEN);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    idem_upstream_req_t ur;
    rec_t r1 = {0};
    start(&f, &ur, &r1, method_head, NULL);
    run_until_ended(&f, &r1);
    cr_assert_eq(r1.order[r1.n - 1], 'd', "%s", r1.order);
    idem__upstream_req_cleanup(&ur);
    size_t pooled = idem__upstream_idle_count(&f.client);
    second_call_is_answered_fresh(&f, &m, GET);
    cr_assert_eq(pooled, 0, "a doubtful connection was pooled");
    fix_cleanup(&f);
    mis_stop(&m);
}

static const char *const HEAD_REQ = "HEAD /x HTTP/1.1\r\nHost: up\r\n\r\n";

Test(upstream_mixing, no_reuse_after_a_204_with_a_length)
{
    doubtful_framing(GET, "HTTP/1.1 204 No Content\r\nContent-Length: 44\r\n\r\n");
}

Test(upstream_mixing, no_reuse_after_a_304_with_chunked)
{
    doubtful_framing(GET, "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n");
}

Test(upstream_mixing, no_reuse_after_a_head_answer_with_a_length)
{
    doubtful_framing(HEAD_REQ, "HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n");
}

Test(upstream_mixing, no_reuse_after_a_head_answer_without_framing)
{
    doubtful_framing(HEAD_REQ, "HTTP/1.1 200 OK\r\n\r\n");
}

Test(upstream_mixing, no_reuse_after_an_interim_answer_with_a_length)
{
    doubtful_framing(GET, "HTTP/1.1 100 Continue\r\nContent-Length: 44\r\n\r\n" OK_ANSWER);
}

/* Bodiless answers whose end no one can doubt are still reused. */
static void reused_after(const char *method_head, const char *answer)
{
    srv_t s;
    srv_start(&s, SRV_ANSWER, answer, false);
    fix_t f;
    fix_init(&f, s.net.port, 5000, 8);
    for (int i = 0; i < 2; i++) {
        idem_upstream_req_t ur;
        rec_t r = {0};
        start(&f, &ur, &r, method_head, NULL);
        run_until_ended(&f, &r);
        cr_assert_eq(r.order[r.n - 1], 'd', "%s", r.order);
        idem__upstream_req_cleanup(&ur);
        cr_assert_eq(idem__upstream_idle_count(&f.client), 1, "%s", answer);
    }
    cr_assert_eq(atomic_load(&s.net.accepts), 1, "not reused after %s", answer);
    fix_cleanup(&f);
    srv_stop(&s);
}

Test(upstream_mixing, bodiless_answers_without_doubt_are_reused)
{
    reused_after(GET, "HTTP/1.1 204 No Content\r\n\r\n");
    reused_after(GET, "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
    reused_after(GET, "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n");
    reused_after(HEAD_REQ, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
}

Test(upstream_mixing, fresh_connection_that_speaks_first_sends_nothing)
{
    /* The upstream sends before it has read anything: whatever it says
     * answers no request of ours.  The connect completes on the loop, which
     * the test turns only once the bytes are in the client's socket. */
    mis_t m;
    mis_start(&m, MIS_SPEAK_FIRST, NULL, STOLEN);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    wait_byte(m.done[0]);
    wait_readable(client_fd(&f));
    run_until_ended(&f, &r);
    cr_assert_str_eq(r.order, "f", "the upstream's first words were taken as an answer");
    cr_assert_eq(r.why, IDEM_UP_CONNECT_FAILED);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    mis_stop(&m);
    cr_assert_eq(atomic_load(&m.requests), 0, "the request was sent");
}

/* ---- nothing sent on a pooled connection ------------------------------------------ */

Test(upstream_unsent, pooled_connection_closed_by_the_upstream_is_not_used)
{
    /* The upstream closes its end right after a keep-alive answer; the
     * close is in the client's socket when the next call starts. */
    mis_t m;
    mis_start(&m, MIS_CLOSE, OK_ANSWER, NULL);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    wait_byte(m.done[0]);
    wait_readable(client_fd(&f));
    second_call_is_answered_fresh(&f, &m, GET);
    fix_cleanup(&f);
    mis_stop(&m);
}

Test(upstream_unsent, write_refused_before_any_byte_is_retried_on_a_new_connection)
{
    /* The pooled connection looks quiet (the upstream says nothing and keeps
     * it open) but refuses the first byte: the client's end was shut for
     * writing.  Nothing was sent, so the call goes on a new connection. */
    signal(SIGPIPE, SIG_IGN);
    mis_t m;
    mis_start(&m, MIS_HOLD, OK_ANSWER, NULL);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    cr_assert_eq(shutdown(client_fd(&f), SHUT_WR), 0);
    second_call_is_answered_fresh(&f, &m, GET);
    cr_assert_eq(atomic_load(&m.first_requests), 1);
    fix_cleanup(&f);
    mis_stop(&m);
}

Test(upstream_unsent, break_after_the_request_left_stays_broken)
{
    /* The request reached the upstream on a pooled connection, which then
     * closed: an unknown outcome, never sent again. */
    mis_t m;
    mis_start(&m, MIS_CLOSE_ON_NEXT, OK_ANSWER, NULL);
    fix_t f;
    fix_init(&f, m.net.port, 5000, 8);
    rec_t r1 = {0};
    call_once(&f, &r1);
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    run_until_ended(&f, &r);
    cr_assert_str_eq(r.order, "f");
    cr_assert_eq(r.why, IDEM_UP_BROKEN);
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    mis_stop(&m);
    cr_assert_eq(atomic_load(&m.net.accepts), 1, "the call was sent again");
    cr_assert_eq(atomic_load(&m.requests), 2);
}

/* ---- TLS to the upstream (SPEC section 16) ------------------------------------
 *
 * The upstream is an OpenSSL server of the test's own (blocking sockets, a
 * thread per connection) with certificates from tests/certs.py
 * ($IDEM_TEST_CERTS).  It counts handshakes, resumed handshakes, requests
 * and every byte of plaintext it read, so that a test sees that a refused
 * handshake delivered not one byte of the request. */

typedef struct {
    tnet_server_t net; /* port, accepts */
    SSL_CTX *ctx;
    atomic_int handshakes;
    atomic_int resumed;
    atomic_int requests;
    atomic_long plain_in;
    bool shutdown_after; /* end each connection with close_notify after one answer */
    bool bare_close_after; /* end each connection with a bare FIN after one answer */
    const char *answer;    /* instead of OK_ANSWER when set */
} tsrv_t;

typedef struct {
    tsrv_t *s;
    SSL *ssl;
} tsrv_src_t;

/* A tnet_read_fn over a TLS session: every byte read is counted in
 * plain_in. */
static ssize_t tsrv_read(void *src, char *buf, size_t cap)
{
    tsrv_src_t *t = src;
    int n = SSL_read(t->ssl, buf, (int)cap);
    if (n > 0)
        atomic_fetch_add(&t->s->plain_in, n);
    return n;
}

static void tsrv_serve(void *ctx, int fd, int index)
{
    (void)index;
    tsrv_t *s = ctx;
    SSL *ssl = SSL_new(s->ctx);
    cr_assert(ssl);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
        atomic_fetch_add(&s->handshakes, 1);
        if (SSL_session_reused(ssl))
            atomic_fetch_add(&s->resumed, 1);
        char buf[4096];
        tsrv_src_t src = {.s = s, .ssl = ssl};
        while (tnet_read_request_from(tsrv_read, &src, buf, sizeof buf) > 0) {
            atomic_fetch_add(&s->requests, 1);
            const char *answer = s->answer ? s->answer : OK_ANSWER;
            if (SSL_write(ssl, answer, (int)strlen(answer)) <= 0)
                break;
            if (s->bare_close_after)
                break; /* SSL_free sends no close_notify: a bare FIN */
            if (s->shutdown_after) {
                SSL_shutdown(ssl);
                break;
            }
        }
    } else {
        /* A refused handshake: the alert has gone; read what the client
         * sent on until it closes, so that our close sends no reset that
         * could overtake the alert (with TLS 1.3 a client has sent its
         * request by the time it hears of a refused certificate). */
        char junk[4096];
        while (read(fd, junk, sizeof junk) > 0) {
        }
    }
    SSL_free(ssl);
    ERR_clear_error();
    close(fd);
}

/* A TLS upstream with the certificate cert (and key) of the test set; with
 * client_ca, it requires a client certificate signed by it. */
static void tsrv_start(tsrv_t *s, const char *cert, const char *key, const char *client_ca)
{
    memset(s, 0, sizeof *s);
    signal(SIGPIPE, SIG_IGN);
    s->ctx = SSL_CTX_new(TLS_server_method());
    cr_assert(s->ctx);
    SSL_CTX_set_min_proto_version(s->ctx, TLS1_2_VERSION);
    cr_assert_eq(SSL_CTX_use_certificate_chain_file(s->ctx, tcert(cert)), 1);
    cr_assert_eq(SSL_CTX_use_PrivateKey_file(s->ctx, tcert(key), SSL_FILETYPE_PEM), 1);
    SSL_CTX_set_session_id_context(s->ctx, (const unsigned char *)"t", 1);
    if (client_ca) {
        const char *p = tcert(client_ca);
        cr_assert_eq(SSL_CTX_load_verify_locations(s->ctx, p, NULL), 1);
        SSL_CTX_set_client_CA_list(s->ctx, SSL_load_client_CA_file(p));
        SSL_CTX_set_verify(s->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    tnet_server_start(&s->net, tsrv_serve, s);
}

static void tsrv_stop(tsrv_t *s)
{
    tnet_server_stop(&s->net);
    SSL_CTX_free(s->ctx);
}

/* A client of port that speaks TLS: trusting ca (a file of the test set),
 * with the client certificate client (and its key) when not NULL, checking
 * the name server_name. */
static void tls_fix_init(fix_t *f, int port, uint64_t timeout_ms, const char *ca,
                         const char *client, const char *client_key, const char *server_name,
                         bool verify)
{
    idem_tls_client_opts_t o = {
        .ca_file = tcert(ca),
        .cert_file = client ? tcert(client) : NULL,
        .key_file = client ? tcert(client_key) : NULL,
        .no_verify = !verify,
    };
    idem_tls_ctx_t *ctx = NULL;
    char err[256];
    cr_assert_eq(idem__tls_client_ctx_create(&o, &ctx, err, sizeof err), 0, "%s", err);
    fix_init(f, port, timeout_ms, 8);
    cr_assert_eq(idem__upstream_set_tls(&f->client, ctx, server_name), 0);
    idem__tls_ctx_unref(ctx); /* the client holds its own */
}

/* One call; returns its result (IDEM_UP_OK for a whole response), with its
 * reason and whether it resumed a TLS session. */
static idem_up_result_t tls_call(fix_t *f, char *reason, size_t cap, bool *resumed)
{
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(f, &ur, &r, "POST /pay HTTP/1.1\r\nHost: up\r\nContent-Length: 5\r\n\r\n", "hello");
    run_until_ended(f, &r);
    cr_assert_not(r.ran_inside);
    idem_up_result_t why = IDEM_UP_OK;
    if (r.order[r.n - 1] == 'd') {
        cr_assert_str_eq(r.order, "hbd");
        cr_assert_eq(r.status, 200);
        cr_assert_eq(r.body_len, 2);
        cr_assert_eq(memcmp(r.body, "ok", 2), 0);
        cr_assert_str_eq(idem__upstream_req_reason(&ur), "");
    } else {
        cr_assert_str_eq(r.order, "f");
        why = r.why;
    }
    if (reason)
        snprintf(reason, cap, "%s", idem__upstream_req_reason(&ur));
    if (resumed)
        *resumed = ur.tls_resumed;
    idem__upstream_req_cleanup(&ur);
    return why;
}

Test(upstream_tls, call_over_tls_succeeds)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", NULL);
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", NULL, NULL, "localhost", true);
    cr_assert_eq(tls_call(&f, NULL, 0, NULL), IDEM_UP_OK);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 1);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.requests), 1);
    cr_assert_eq(atomic_load(&s.handshakes), 1);
}

Test(upstream_tls, pooled_connection_is_reused_and_a_new_one_resumes)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", NULL);
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", NULL, NULL, "localhost", true);
    bool resumed = true;
    cr_assert_eq(tls_call(&f, NULL, 0, &resumed), IDEM_UP_OK);
    cr_assert_not(resumed, "the first connection had nothing to resume");
    cr_assert_eq(tls_call(&f, NULL, 0, &resumed), IDEM_UP_OK);
    cr_assert_eq(atomic_load(&s.net.accepts), 1, "the second call took the pooled connection");
    cr_assert_eq(atomic_load(&s.handshakes), 1);
    /* A new connection, once the pooled one is gone: it resumes. */
    idem__upstream_close_idle(&f.client);
    cr_assert_eq(tls_call(&f, NULL, 0, &resumed), IDEM_UP_OK);
    cr_assert(resumed, "the new connection resumed the session");
    cr_assert_eq(atomic_load(&s.net.accepts), 2);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.requests), 3);
    cr_assert_eq(atomic_load(&s.resumed), 1, "the server saw the resumption");
}

/* A handshake the client refuses: nothing sent, a reason, and the upstream
 * read not one byte of the request. */
static void refused(const char *cert, const char *key, const char *ca, const char *name,
                    const char *want)
{
    tsrv_t s;
    tsrv_start(&s, cert, key, NULL);
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, ca, NULL, NULL, name, true);
    char reason[256];
    cr_assert_eq(tls_call(&f, reason, sizeof reason, NULL), IDEM_UP_CONNECT_FAILED);
    cr_assert(strstr(reason, want) != NULL, "reason '%s' names '%s'", reason, want);
    cr_assert_eq(idem__upstream_idle_count(&f.client), 0);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.plain_in), 0, "the upstream read a byte of the request");
    cr_assert_eq(atomic_load(&s.requests), 0);
}

Test(upstream_tls, wrong_ca_sends_nothing)
{
    refused("server.pem", "server.key", "other-ca.pem", "localhost", "certificate verify failed");
}

Test(upstream_tls, wrong_name_sends_nothing)
{
    refused("wrong-name.pem", "wrong-name.key", "ca.pem", "localhost", "hostname mismatch");
}

Test(upstream_tls, expired_certificate_sends_nothing)
{
    refused("expired.pem", "expired.key", "ca.pem", "localhost", "expired");
}

Test(upstream_tls, verify_false_accepts_a_wrong_name)
{
    tsrv_t s;
    tsrv_start(&s, "wrong-name.pem", "wrong-name.key", NULL);
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "other-ca.pem", NULL, NULL, "localhost", false);
    cr_assert_eq(tls_call(&f, NULL, 0, NULL), IDEM_UP_OK);
    fix_cleanup(&f);
    tsrv_stop(&s);
}

Test(upstream_tls, client_certificate_when_required)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", "ca.pem");
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", "client-a.pem", "client-a.key", "localhost", true);
    cr_assert_eq(tls_call(&f, NULL, 0, NULL), IDEM_UP_OK);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.requests), 1);
}

Test(upstream_tls, no_client_certificate_when_required_sends_nothing)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", "ca.pem");
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", NULL, NULL, "localhost", true);
    char reason[256];
    cr_assert_eq(tls_call(&f, reason, sizeof reason, NULL), IDEM_UP_CONNECT_FAILED);
    cr_assert(strstr(reason, "alert") != NULL, "reason '%s'", reason);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.plain_in), 0);
    cr_assert_eq(atomic_load(&s.handshakes), 0);
}

Test(upstream_tls, client_certificate_of_another_ca_sends_nothing)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", "ca.pem");
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", "client-other.pem", "client-other.key",
                 "localhost", true);
    char reason[256];
    cr_assert_eq(tls_call(&f, reason, sizeof reason, NULL), IDEM_UP_CONNECT_FAILED);
    cr_assert(strstr(reason, "alert") != NULL, "reason '%s'", reason);
    fix_cleanup(&f);
    tsrv_stop(&s);
    cr_assert_eq(atomic_load(&s.plain_in), 0);
}

/* An upstream that takes the connection and never answers the handshake:
 * the timeout is the only possible end, and it means nothing was sent. */
Test(upstream_tls, stalled_handshake_times_out_as_nothing_sent)
{
    srv_t s;
    srv_start(&s, SRV_SILENT, NULL, false);
    fix_t f;
    tls_fix_init(&f, s.net.port, 200, "ca.pem", NULL, NULL, "localhost", true);
    char reason[256];
    cr_assert_eq(tls_call(&f, reason, sizeof reason, NULL), IDEM_UP_CONNECT_FAILED);
    cr_assert_str_eq(reason, "TLS handshake timed out");
    fix_cleanup(&f);
    srv_stop(&s);
    cr_assert_eq(atomic_load(&s.requests), 0);
}

/* An upstream that ends an idle pooled connection with close_notify: the
 * client closes it, and the next call goes on a new connection. */
Test(upstream_tls, pooled_connection_closed_by_the_upstream_is_not_used)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", NULL);
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", NULL, NULL, "localhost", true);
    s.shutdown_after = true;
    /* The server ends the connection right after its answer: a close_notify
     * and FIN reach the connection, idle by then, which reads them and
     * closes. */
    cr_assert_eq(tls_call(&f, NULL, 0, NULL), IDEM_UP_OK);
    while (idem__upstream_idle_count(&f.client) != 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(tls_call(&f, NULL, 0, NULL), IDEM_UP_OK);
    cr_assert_eq(atomic_load(&s.net.accepts), 2);
    fix_cleanup(&f);
    tsrv_stop(&s);
}

/* A close-delimited body over TLS ends at close_notify; a bare FIN there may
 * be a truncation, and is a broken call. */
static void close_delimited(bool clean)
{
    tsrv_t s;
    tsrv_start(&s, "server.pem", "server.key", NULL);
    s.answer = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end";
    s.shutdown_after = clean;
    s.bare_close_after = !clean;
    fix_t f;
    tls_fix_init(&f, s.net.port, 5000, "ca.pem", NULL, NULL, "localhost", true);
    idem_upstream_req_t ur;
    rec_t r = {0};
    start(&f, &ur, &r, GET, NULL);
    run_until_ended(&f, &r);
    if (clean) {
        cr_assert_eq(r.order[r.n - 1], 'd', "%s", r.order);
        cr_assert_eq(r.body_len, strlen("until the end"));
    } else {
        cr_assert_eq(r.order[r.n - 1], 'f', "%s", r.order);
        cr_assert_eq(r.why, IDEM_UP_BROKEN);
        cr_assert(strstr(idem__upstream_req_reason(&ur), "close_notify") != NULL, "%s",
                  idem__upstream_req_reason(&ur));
    }
    idem__upstream_req_cleanup(&ur);
    fix_cleanup(&f);
    tsrv_stop(&s);
}

Test(upstream_tls, close_delimited_body_ends_at_close_notify) { close_delimited(true); }

Test(upstream_tls, close_delimited_body_cut_by_a_bare_fin_is_broken) { close_delimited(false); }
