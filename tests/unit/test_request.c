/* tests/unit/test_request.c - the proxy handler (src/gateway/request.c)
 * driven through the handler interface (handler.h) with a test output
 * stream, on a real worker loop with the `memory:` store and a real upstream
 * on loopback.
 *
 * The test plays the connection: it parses a request head, hands it to the
 * worker's handler (on_head, on_body, on_body_end) with an idem_ostream_t of
 * its own that records start, each send and abort, and answers "wait" when
 * the test turns backpressure on; it tells the request on_proceed and
 * on_gone from the loop (between turns), never inside one of the request's
 * calls, as conn.c does.  The upstream is a tiny HTTP/1.1 server of the
 * test's own (a thread per connection, blocking sockets) that counts what it
 * executes and answers 201, or a body of BIG bytes for /big, written with
 * blocking writes so that a paused relay holds it back.
 *
 * The allocation-failure sweep makes the Nth allocation from the head on
 * fail (idem_alloc_fail_after(N)) for N = 1, 2, ... until a request's whole
 * life runs without an injected failure, for a new key, a replay and a
 * streamed answer; each time the request must end (the loop never hangs:
 * upstream_timeout and the lease are small), with an answer (start and a
 * final send, or abort) or nothing at all on the output, and, under ASan
 * (build-asan), no leak and no use-after-free.  No verdict depends on
 * timing: the loop runs until an event; deadlines only bound a hang.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/config.h"
#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/handler.h"
#include "gateway/request.h"
#include "gateway/worker.h"
#include "idem/alloc.h"
#include "idem/store.h"
#include "net_fixture.h"

#define BIG (2u << 20)          /* the /big answer's body */
#define CAPTURE 4096            /* max_response_bytes: /big is streamed */

/* ---- the upstream ------------------------------------------------------------- */

static struct {
    tnet_server_t net;
    atomic_int executions; /* requests executed */
} up;

static void up_serve(void *ctx, int fd, int index)
{
    (void)ctx;
    (void)index;
    char buf[8192];
    static char big[BIG];
    memset(big, 'q', sizeof big);
    for (;;) {
        if (tnet_read_request(fd, buf, sizeof buf) == 0)
            break;
        atomic_fetch_add(&up.executions, 1);
        if (strncmp(buf, "POST /big", 9) == 0) {
            char head[128];
            int n = snprintf(head, sizeof head,
                             "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             "Content-Length: %u\r\n\r\n",
                             BIG);
            if (!tnet_write_all(fd, head, (size_t)n))
                break;
            bool ok = true;
            for (size_t off = 0; ok && off < BIG; off += 65536)
                ok = tnet_write_all(fd, big + off, BIG - off < 65536 ? BIG - off : 65536);
            if (!ok)
                break;
        } else {
            const char *a = "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                            "Content-Length: 7\r\n\r\ncreated";
            if (!tnet_write_all(fd, a, strlen(a)))
                break;
        }
    }
    shutdown(fd, SHUT_RDWR);
    close(fd);
}

static void up_start(void)
{
    memset(&up, 0, sizeof up);
    tnet_server_start(&up.net, up_serve, NULL);
}

/* Once idemd's side of every connection is closed. */
static void up_stop(void) { tnet_server_stop(&up.net); }

/* ---- the test output ----------------------------------------------------------- */

typedef struct {
    idem_ostream_t os;
    int starts;
    int status;
    unsigned flags;
    idem_http_framing_t framing;
    uint64_t content_length;
    bool replay;         /* the replay header was among the fields */
    char *body;
    size_t len, cap;
    int sends;
    int finals;
    int aborts;
    bool ended;          /* final or abort: the request may not touch it again */
    int after_end;       /* calls after that */
    bool backpressure;   /* send answers false ("wait") */
    bool waiting;        /* told the request to wait; on_proceed not yet given */
    int sends_while_waiting;
    int proceeds;
} tout_t;

static const char *replay_header;

static int to_start(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags)
{
    tout_t *o = (tout_t *)os;
    if (o->ended)
        o->after_end++;
    o->starts++;
    o->status = r->status;
    o->flags = flags;
    o->framing = r->framing;
    o->content_length = r->content_length;
    for (size_t i = 0; i < r->n_fields; i++)
        if (r->fields[i].name.len == strlen(replay_header) &&
            strncasecmp(r->fields[i].name.ptr, replay_header, r->fields[i].name.len) == 0)
            o->replay = true;
    return 0;
}

static bool to_send(idem_ostream_t *os, const void *p, size_t n, bool final)
{
    tout_t *o = (tout_t *)os;
    if (o->ended)
        o->after_end++;
    if (o->waiting)
        o->sends_while_waiting++;
    o->sends++;
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->body = realloc(o->body, o->cap);
        cr_assert_not_null(o->body);
    }
    if (n > 0)
        memcpy(o->body + o->len, p, n);
    o->len += n;
    o->body[o->len] = '\0';
    if (final) {
        o->finals++;
        o->ended = true;
        return false;
    }
    if (o->backpressure) {
        o->waiting = true;
        return false;
    }
    return true;
}

static void to_abort(idem_ostream_t *os)
{
    tout_t *o = (tout_t *)os;
    if (o->ended)
        o->after_end++;
    o->aborts++;
    o->ended = true;
}

static const idem_ostream_ops_t to_ops = {.start = to_start, .send = to_send, .abort = to_abort};

static void tout_init(tout_t *o)
{
    memset(o, 0, sizeof *o);
    o->os.ops = &to_ops;
}

static void tout_cleanup(tout_t *o) { free(o->body); }

/* ---- the worker ------------------------------------------------------------------ */

static idem_config_t *cfg; /* shared: the worker and each request hold it */
static idem_gw_t gw;
static idem_worker_t w;

static void set_policy(idem_policy_t *p)
{
    p->max_response_bytes = CAPTURE;
    p->lease_ms = 600;
}

static void setup(void)
{
    up_start();
    cfg = idem__config_new();
    cr_assert_not_null(cfg);
    cfg->upstream_timeout_ms = 1500;
    set_policy(&cfg->defaults);
    for (size_t i = 0; i < cfg->n_routes; i++)
        set_policy(&cfg->routes[i].policy);
    memset(&gw, 0, sizeof gw);
    gw.cfg = cfg;
    gw.live = cfg;
    replay_header = cfg->replay_header;
    char err[256] = "";
    cr_assert_eq(idem_store_open("memory:", &gw.store, err, sizeof err), IDEM_OK, "%s", err);
    struct sockaddr_in *sa = (struct sockaddr_in *)&gw.upstream_addr;
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)up.net.port);
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    snprintf(gw.upstream_hostport, sizeof gw.upstream_hostport, "127.0.0.1:%d", up.net.port);
    snprintf(gw.upstream_host, sizeof gw.upstream_host, "127.0.0.1");
    gw.nworkers = 1;
    gw.workers = &w;
    int lfd = idem__listen_socket("127.0.0.1", 0, 16, "test", err, sizeof err);
    cr_assert_geq(lfd, 0, "%s", err);
    cr_assert_eq(idem__worker_init(&w, &gw, 0, lfd, -1, err, sizeof err), 0, "%s", err);
    close(lfd);
    cr_assert(w.inline_store, "memory: applies its jobs on the loop");
}

static bool may_call(void);
static void hang_up(void);

static void teardown(void)
{
    idem_alloc_fail_after(0);
    /* A request still attached (a case that failed) is told its client
     * left, as conn.c does when it closes, so that the worker can stop. */
    if (may_call())
        hang_up();
    idem__worker_request_stop(&w);
    uv_run(&w.loop, UV_RUN_DEFAULT);
    idem__worker_cleanup(&w);
    up_stop();
    idem_store_close(gw.store);
    cr_expect_eq(atomic_load(&gw.metrics.in_flight), 0);
    cr_expect_eq(atomic_load(&gw.metrics.buffered_bytes), 0, "every body's charge given back");
    cr_expect_eq(atomic_load(&gw.metrics.connections), 0, "every outlived slot given back");
    idem__config_unref(cfg);
}

TestSuite(request, .init = setup, .fini = teardown, .timeout = 300);

/* ---- driving a request ------------------------------------------------------------ */

/* The request the output o is attached to, while it may be called. */
typedef struct {
    tout_t *o;
    idem_hreq_t *r;
    bool gone;
} drive_t;

static drive_t cur;

static bool may_call(void) { return cur.r != NULL && !cur.gone && !cur.o->ended; }

/* The client leaves: on_gone from the loop, and the connection's place in
 * max_connections goes to the request that outlives it (request_outlives),
 * as conn.c does. */
static void hang_up(void)
{
    cur.gone = true;
    atomic_fetch_add(&gw.metrics.connections, 1);
    w.handler.ops->on_gone(cur.r);
}

/* One turn of the loop; then, from the loop as a connection would, the
 * on_proceed a waiting output owes (when auto_proceed). */
static bool auto_proceed;

static void pump(void)
{
    uv_run(&w.loop, UV_RUN_NOWAIT);
    if (auto_proceed && cur.o != NULL && cur.o->waiting && may_call()) {
        cur.o->waiting = false;
        cur.o->proceeds++;
        w.handler.ops->on_proceed(cur.r);
    }
    tnet_loop_wait(&w.loop);
}

static void pump_n(int n)
{
    for (int i = 0; i < n; i++)
        pump();
}

static long sweep_n;
static bool no_requests(void);
static const char *req_dump(void);
#define RUN_UNTIL(cond)                                                                  \
    TNET_RUN_UNTIL(cond, pump(),                                                         \
                   "hang waiting for: %s (sweep n=%ld; requests %s; output: %d "         \
                   "starts, status %d, %d finals, %d aborts, %d sends)",                 \
                   #cond, sweep_n, req_dump(), cur.o ? cur.o->starts : -1,               \
                   cur.o ? cur.o->status : -1, cur.o ? cur.o->finals : -1,               \
                   cur.o ? cur.o->aborts : -1, cur.o ? cur.o->sends : -1)

static bool no_requests(void) { return idem_list_empty(&w.reqs); }

/* The first live request's state and holds, for a hang's message. */
static const char *req_dump(void)
{
    static char out[256];
    if (no_requests())
        return "none";
    const idem_req_t *req = IDEM_CONTAINER(w.reqs.next, idem_req_t, link);
    int k = snprintf(out, sizeof out, "%s, holds", idem__req_state_name(req->life.state));
    for (int h = 0; h < IDEM_HOLD__COUNT && k > 0 && (size_t)k < sizeof out; h++)
        k += snprintf(out + k, sizeof out - (size_t)k, " %u", req->life.holds[h]);
    return out;
}

/* Hand a POST to path with Idempotency-Key key and body to the proxy, as a
 * connection would, answering through o. */
static void drive(tout_t *o, const char *path, const char *key, const char *body)
{
    static char head[1024];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: test\r\nIdempotency-Key: %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     path, key, strlen(body));
    idem_http_head_state_t hs = {0};
    idem_http_msg_t msg;
    int rc = idem__http_parse_request(&hs, head, (size_t)n, IDEM_HTTP_MAX_HEAD, &msg);
    cr_assert_eq(rc, n);
    idem_conn_facts_t facts = {0};
    cur = (drive_t){.o = o};
    idem_hreq_t *r = w.handler.ops->on_head(&w.handler, &msg, head, (size_t)n, &o->os, &facts);
    if (r == NULL)
        return;
    cur.r = r;
    if (!w.handler.ops->on_body(r, body, strlen(body)))
        return;
    if (!may_call())
        return;
    w.handler.ops->on_body_end(r);
}

/* Drive a request to its end: answered and freed. */
static void drive_all(tout_t *o, const char *path, const char *key, const char *body)
{
    drive(o, path, key, body);
    RUN_UNTIL(no_requests() && (o->ended || cur.r == NULL || cur.gone));
    pump_n(2);
}

/* ---- the cases --------------------------------------------------------------------- */

Test(request, a_new_key_is_forwarded_once_and_a_repeat_replayed)
{
    static tout_t a, b; /* outlives the case: teardown may look at it */
    tout_init(&a);
    drive_all(&a, "/pay", "k-new", "{\"n\":1}");
    cr_expect_eq(a.starts, 1);
    cr_expect_eq(a.status, 201);
    cr_expect_eq(a.finals, 1);
    cr_expect_str_eq(a.body, "created");
    cr_expect(!a.replay);
    cr_expect_eq(atomic_load(&up.executions), 1);
    tout_init(&b);
    drive_all(&b, "/pay", "k-new", "{\"n\":1}");
    cr_expect_eq(b.status, 201);
    cr_expect(b.replay, "a replay says so");
    cr_expect_str_eq(b.body, "created");
    cr_expect_eq(atomic_load(&up.executions), 1, "a repeat is not forwarded");
    cr_expect_eq(a.after_end + b.after_end, 0);
    tout_cleanup(&a);
    tout_cleanup(&b);
}

Test(request, a_different_body_with_the_same_key_is_422)
{
    static tout_t a, b; /* outlives the case: teardown may look at it */
    tout_init(&a);
    drive_all(&a, "/pay", "k-diff", "{\"n\":1}");
    cr_expect_eq(a.status, 201);
    tout_init(&b);
    drive_all(&b, "/pay", "k-diff", "{\"n\":2}");
    cr_expect_eq(b.status, 422);
    cr_expect_eq(b.finals, 1);
    cr_expect_eq(atomic_load(&up.executions), 1);
    tout_cleanup(&a);
    tout_cleanup(&b);
}

static void check_big_body(const tout_t *o)
{
    cr_expect_eq(o->len, BIG);
    bool same = true;
    for (size_t i = 0; i < o->len && same; i++)
        same = o->body[i] == 'q';
    cr_expect(same, "the body relayed as the upstream sent it");
}

Test(request, a_streamed_answer_honours_backpressure)
{
    static tout_t o; /* outlives the case: teardown may look at it */
    tout_init(&o);
    o.backpressure = true;
    drive(&o, "/big", "k-big", "{}");
    int rounds = 0;
    while (!o.ended) {
        RUN_UNTIL(o.waiting || o.ended);
        if (o.ended)
            break;
        /* Told to wait: the relay must send nothing until on_proceed. */
        pump_n(10);
        cr_assert_eq(o.sends_while_waiting, 0, "sent while told to wait (round %d)", rounds);
        o.waiting = false;
        o.proceeds++;
        rounds++;
        w.handler.ops->on_proceed(cur.r);
    }
    RUN_UNTIL(no_requests());
    cr_expect_eq(o.starts, 1);
    cr_expect_eq(o.status, 200);
    cr_expect_eq(o.framing, IDEM_HTTP_BODY_LENGTH);
    cr_expect_eq(o.content_length, BIG);
    cr_expect_eq(o.finals, 1);
    cr_expect_gt(rounds, 1, "the answer came in pieces");
    check_big_body(&o);
    cr_expect_eq(atomic_load(&up.executions), 1);
    tout_cleanup(&o);
}

/* Drive a POST /big with key through o, which answers "wait" from the first
 * send, until the request is told to wait. */
static void big_until_told_to_wait(tout_t *o, const char *key)
{
    tout_init(o);
    o->backpressure = true;
    drive(o, "/big", key, "{}");
    RUN_UNTIL(o->waiting || o->ended);
    cr_assert(!o->ended);
}

Test(request, the_first_captured_piece_waiting_keeps_the_upstream_paused)
{
    /* idem__req_start_stream relays what was captured, then must not read
     * on if the output said wait. */
    static tout_t o; /* outlives the case: teardown may look at it */
    big_until_told_to_wait(&o, "k-first");
    pump_n(20);
    cr_expect_eq(o.sends_while_waiting, 0, "%d sends after the first wait (%zu bytes in all)",
                 o.sends_while_waiting, o.len);
    o.backpressure = false;
    o.waiting = false;
    w.handler.ops->on_proceed(cur.r);
    RUN_UNTIL(o.ended && no_requests());
    check_big_body(&o);
    tout_cleanup(&o);
}

Test(request, on_gone_mid_stream_cancels_the_relay_and_the_request_ends)
{
    static tout_t o; /* outlives the case: teardown may look at it */
    big_until_told_to_wait(&o, "k-gone");
    size_t at_gone = o.len;
    hang_up();
    RUN_UNTIL(no_requests());
    pump_n(5);
    cr_expect_eq(o.len, at_gone, "nothing sent after on_gone");
    cr_expect_eq(o.after_end, 0);
    cr_expect_lt(o.len, BIG);
    /* The outcome was recorded before the relay: a repeat is told so. */
    static tout_t r; /* outlives the case: teardown may look at it */
    tout_init(&r);
    drive_all(&r, "/big", "k-gone", "{}");
    cr_expect_eq(r.status, 409);
    cr_expect_eq(atomic_load(&up.executions), 1);
    tout_cleanup(&o);
    tout_cleanup(&r);
}

/* ---- the allocation-failure sweep ----------------------------------------------------- */

typedef enum { SW_NEW, SW_REPLAY, SW_STREAM } sweep_t;

/* One life with the nth allocation on failing.  @return whether a failure
 * was injected (false: the life ran whole). */
static bool sweep_once(sweep_t kind, long n)
{
    char key[64];
    snprintf(key, sizeof key, kind == SW_REPLAY ? "sweep-replay" : "sweep-%d-%ld", (int)kind, n);
    const char *path = kind == SW_STREAM ? "/big" : "/pay";
    int before = atomic_load(&up.executions);
    static tout_t o; /* outlives the case: teardown may look at it */
    tout_init(&o);
    o.backpressure = kind == SW_STREAM;
    auto_proceed = true;
    unsigned long failures = idem_alloc_failures();
    sweep_n = n;
    idem_alloc_fail_after(n);
    drive(&o, path, key, "{\"a\":1}");
    RUN_UNTIL(no_requests() && (o.ended || cur.r == NULL || cur.gone || o.starts == 0));
    idem_alloc_fail_after(0);
    bool injected = idem_alloc_failures() != failures;
    pump_n(2);
    int ran = atomic_load(&up.executions) - before;
    /* An answer, or nothing at all: never a start left open. */
    cr_assert_eq(o.after_end, 0, "n=%ld: the output used after its end", n);
    cr_assert_leq(o.finals + o.aborts, 1, "n=%ld", n);
    if (o.starts > 0)
        cr_assert(o.ended, "n=%ld: a started answer neither ended nor aborted (status %d)", n,
                  o.status);
    else
        cr_assert_eq(o.sends + o.aborts, 0, "n=%ld: a body without a head", n);
    if (cur.r != NULL && !cur.gone)
        cr_assert(o.ended, "n=%ld: the request ended while its output still held it", n);
    cr_assert_leq(o.starts, 1, "n=%ld: two heads", n);
    if (kind == SW_REPLAY)
        cr_assert_eq(ran, 0, "n=%ld: a replay was executed again", n);
    else
        cr_assert_leq(ran, 1, "n=%ld", n);
    if (kind == SW_NEW && o.finals == 1 && o.status == 201) {
        /* Told the upstream's answer: it was recorded first, so a repeat
         * replays it and never runs again. */
        static tout_t r; /* outlives the case: teardown may look at it */
        tout_init(&r);
        drive_all(&r, path, key, "{\"a\":1}");
        cr_assert(r.status == 201 && r.replay,
                  "n=%ld: answered 201 but a repeat got %d%s: the outcome was not recorded", n,
                  r.status, r.replay ? " (replay)" : "");
        cr_assert_eq(atomic_load(&up.executions) - before, 1, "n=%ld", n);
        tout_cleanup(&r);
    }
    if (!injected) {
        /* The whole life ran: its answer is the real one. */
        cr_assert_eq(o.finals, 1, "n=%ld", n);
        cr_assert_eq(o.status, kind == SW_STREAM ? 200 : 201, "n=%ld", n);
        if (kind == SW_REPLAY)
            cr_assert(o.replay);
        if (kind == SW_STREAM)
            check_big_body(&o);
    }
    tout_cleanup(&o);
    cur = (drive_t){0};
    return injected;
}

static void sweep(sweep_t kind)
{
    long n = 1;
    while (sweep_once(kind, n)) {
        n++;
        cr_assert_lt(n, 5000, "the sweep never ran a whole life");
    }
    cr_log_info("sweep %d: %ld allocations in a whole life", (int)kind, n - 1);
}

Test(request, alloc_failure_sweep_new_key)
{
    sweep(SW_NEW);
}

Test(request, alloc_failure_sweep_replay)
{
    static tout_t o; /* outlives the case: teardown may look at it */
    tout_init(&o);
    drive_all(&o, "/pay", "sweep-replay", "{\"a\":1}");
    cr_assert_eq(o.status, 201);
    tout_cleanup(&o);
    sweep(SW_REPLAY);
}

Test(request, alloc_failure_sweep_streamed_answer)
{
    sweep(SW_STREAM);
}
