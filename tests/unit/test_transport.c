/* tests/unit/test_transport.c - the plain and TLS byte stream
 * (src/gateway/transport.c) over real loopback sockets on a uv loop.
 *
 * A client and a server transport run on the test's own loop, one
 * connection per test.  Every call the test makes into the transport goes
 * through a wrapper that marks "inside a call", and every callback asserts
 * that it is not: no callback may run on the owner's stack.  The certificates
 * come from tests/certs.py ($IDEM_TEST_CERTS, tests/unit/meson.build).
 *
 * No verdict depends on timing: the backpressure test pauses the client's
 * reading until the server has had to stop its own (an event), with socket
 * buffers made small so that several MiB cannot hide in the kernel.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "cert_fixture.h"
#include "gateway/transport.h"
#include "idem/alloc.h"

#define HIGH (256 * 1024) /* the server stops reading above this queued */
#define LOW (64 * 1024)   /* and starts again below this */

typedef struct peer {
    const char *name;
    uv_tcp_t tcp;
    idem_transport_t tr;
    bool inited;
    bool is_server;
    bool echo;
    bool ready, eof, error, closed;
    char reason[256];
    char peer_hash[65];
    char alpn[32];
    char *got;
    size_t got_n, got_cap;
    size_t written; /* sum of on_written */
    size_t sent;    /* bytes given to write */
    bool reading;
    int stops;       /* server: times backpressure stopped the reading */
    size_t pause_at; /* client: stop reading once this much came (0: never) */
    bool paused;
    size_t expect; /* client: shut down once this much came back */
} peer_t;

static uv_loop_t loop;
static uv_tcp_t listener;
static peer_t srv, cli;
static int in_call;
static idem_tls_ctx_t *server_tls, *client_tls;
static const char *client_name = "localhost";
static char *payload;
static size_t payload_n;

/* ---- wrappers: every call into the transport is marked ------------------- */

static void w_read_start(peer_t *p)
{
    in_call++;
    p->reading = true;
    idem__transport_read_start(&p->tr);
    in_call--;
}

static void w_read_stop(peer_t *p)
{
    in_call++;
    p->reading = false;
    idem__transport_read_stop(&p->tr);
    in_call--;
}

static void w_write(peer_t *p, const char *d, size_t n)
{
    in_call++;
    uv_buf_t b = uv_buf_init((char *)d, (unsigned)n);
    cr_assert_eq(idem__transport_write(&p->tr, &b, 1), 0, "%s: write refused", p->name);
    p->sent += n;
    in_call--;
}

static void w_shutdown(peer_t *p)
{
    in_call++;
    idem__transport_shutdown(&p->tr);
    in_call--;
}

static void closed_cb(idem_transport_t *t)
{
    peer_t *p = t == &srv.tr ? &srv : &cli;
    cr_assert_not(p->closed);
    p->closed = true;
    cr_assert_eq(idem__transport_queued(t), 0, "%s: nothing held after close", p->name);
    /* The client's end ends the test: the server goes next, once it has
     * heard of the end itself. */
    if (p == &cli && srv.inited && !srv.tr.closing && (srv.eof || srv.error)) {
        in_call++;
        idem__transport_close(&srv.tr, closed_cb);
        in_call--;
    }
}

static void w_close(peer_t *p)
{
    in_call++;
    idem__transport_close(&p->tr, closed_cb);
    idem__transport_close(&p->tr, closed_cb); /* twice: a no-op */
    in_call--;
}

/* ---- the callbacks ------------------------------------------------------- */

static void on_ready(void *data)
{
    peer_t *p = data;
    cr_assert_eq(in_call, 0, "%s: on_ready inside a call", p->name);
    cr_assert_not(p->ready || p->closed);
    p->ready = true;
    idem_tls_t *t = idem__transport_tls(&p->tr);
    if (t) {
        cr_assert(idem__tls_handshake_done(t));
        (void)idem__tls_peer_cert_sha256_hex(t, p->peer_hash);
        const char *a = idem__tls_alpn(t);
        snprintf(p->alpn, sizeof p->alpn, "%s", a ? a : "");
    }
}

static void on_read(void *data, const char *d, size_t n)
{
    peer_t *p = data;
    cr_assert_eq(in_call, 0, "%s: on_read inside a call", p->name);
    cr_assert(p->ready, "%s: on_ready comes first", p->name);
    cr_assert(p->reading, "%s: on_read while stopped", p->name);
    cr_assert_not(p->eof || p->closed);
    if (p->got_n + n > p->got_cap) {
        p->got_cap = (p->got_n + n) * 2;
        p->got = realloc(p->got, p->got_cap);
        cr_assert(p->got);
    }
    memcpy(p->got + p->got_n, d, n);
    p->got_n += n;
    if (p->echo) {
        w_write(p, d, n);
        if (idem__transport_queued(&p->tr) > HIGH) {
            w_read_stop(p);
            p->stops++;
            if (cli.paused) { /* the event the client waits for */
                cli.paused = false;
                w_read_start(&cli);
            }
        }
    }
    if (p->pause_at && p->got_n >= p->pause_at) {
        p->pause_at = 0;
        p->paused = true;
        w_read_stop(p);
    }
    if (p->expect && p->got_n == p->expect)
        w_shutdown(p);
}

static void on_eof(void *data)
{
    peer_t *p = data;
    cr_assert_eq(in_call, 0, "%s: on_eof inside a call", p->name);
    cr_assert(p->ready);
    cr_assert_not(p->eof || p->closed);
    p->eof = true;
    if (!p->is_server)
        w_close(p);
    else if (cli.closed)
        w_close(p);
    else
        w_shutdown(p);
}

static void on_error(void *data, const char *reason)
{
    peer_t *p = data;
    cr_assert_eq(in_call, 0, "%s: on_error inside a call", p->name);
    cr_assert_not(p->error || p->closed);
    p->error = true;
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    if (p == &cli)
        w_close(p); /* closed_cb closes the server */
    else if (!cli.inited || cli.closed)
        w_close(p);
}

static void on_written(void *data, size_t n)
{
    peer_t *p = data;
    cr_assert_eq(in_call, 0, "%s: on_written inside a call", p->name);
    cr_assert_not(p->closed);
    p->written += n;
    cr_assert(p->written <= p->sent);
    if (p->echo && !p->reading && !p->eof && idem__transport_queued(&p->tr) < LOW)
        w_read_start(p);
    if (p == &cli && cli.paused && cli.written == cli.sent) {
        cli.paused = false; /* all of it left: nothing more can come */
        w_read_start(&cli);
    }
}

static const idem_transport_cbs_t cbs = {
    .on_ready = on_ready,
    .on_read = on_read,
    .on_eof = on_eof,
    .on_error = on_error,
    .on_written = on_written,
};

/* ---- set-up -------------------------------------------------------------- */

static void small_buffers(uv_handle_t *h)
{
    int v = 32 * 1024;
    cr_assert_eq(uv_send_buffer_size(h, &v), 0);
    v = 32 * 1024;
    cr_assert_eq(uv_recv_buffer_size(h, &v), 0);
}

static void on_connection(uv_stream_t *l, int status)
{
    cr_assert_eq(status, 0);
    cr_assert_eq(uv_tcp_init(&loop, &srv.tcp), 0);
    cr_assert_eq(uv_accept(l, (uv_stream_t *)&srv.tcp), 0);
    uv_close((uv_handle_t *)l, NULL);
    srv.inited = true;
    in_call++;
    if (server_tls) {
        idem_tls_t *t = idem__tls_create_server(server_tls);
        cr_assert(t);
        cr_assert_eq(idem__transport_init_tls(&srv.tr, &loop, &srv.tcp, t, &cbs, &srv), 0);
    } else {
        cr_assert_eq(idem__transport_init_plain(&srv.tr, &loop, &srv.tcp, &cbs, &srv), 0);
    }
    in_call--;
    w_read_start(&srv);
}

static void start_server(struct sockaddr_in *addr)
{
    cr_assert_eq(uv_loop_init(&loop), 0);
    cr_assert_eq(uv_tcp_init(&loop, &listener), 0);
    cr_assert_eq(uv_ip4_addr("127.0.0.1", 0, addr), 0);
    cr_assert_eq(uv_tcp_bind(&listener, (const struct sockaddr *)addr, 0), 0);
    small_buffers((uv_handle_t *)&listener);
    cr_assert_eq(uv_listen((uv_stream_t *)&listener, 8, on_connection), 0);
    int len = sizeof *addr;
    cr_assert_eq(uv_tcp_getsockname(&listener, (struct sockaddr *)addr, &len), 0);
    srv = (peer_t){.name = "server", .is_server = true, .echo = true};
}

static void on_connect(uv_connect_t *req, int status)
{
    cr_assert_eq(status, 0);
    (void)req;
    cli.inited = true;
    in_call++;
    if (client_tls) {
        idem_tls_t *t = idem__tls_create_client(client_tls, client_name, NULL);
        cr_assert(t);
        cr_assert_eq(idem__transport_init_tls(&cli.tr, &loop, &cli.tcp, t, &cbs, &cli), 0);
    } else {
        cr_assert_eq(idem__transport_init_plain(&cli.tr, &loop, &cli.tcp, &cbs, &cli), 0);
    }
    in_call--;
    w_read_start(&cli);
    /* Out of memory: the write is refused whole, and the stream goes on. */
    in_call++;
    idem_alloc_fail_after(1);
    uv_buf_t b = uv_buf_init((char *)"lost", 4);
    cr_assert_eq(idem__transport_write(&cli.tr, &b, 1), -1);
    idem_alloc_fail_after(0);
    cr_assert_eq(idem__transport_queued(&cli.tr), 0);
    in_call--;
    /* Written before the handshake (TLS): held, then sent. */
    for (size_t off = 0; off < payload_n; off += 65536)
        w_write(&cli, payload + off, payload_n - off < 65536 ? payload_n - off : 65536);
}

/* Echo n bytes: the client writes them, the server sends them back; the
 * client stops reading at pause_at (0: never) until the server has had to
 * stop its own. */
static void run(size_t n, size_t pause_at)
{
    payload_n = n;
    payload = malloc(n);
    cr_assert(payload);
    for (size_t i = 0; i < n; i++)
        payload[i] = (char)(i * 7 + (i >> 11));
    struct sockaddr_in addr;
    start_server(&addr);
    cli = (peer_t){.name = "client", .expect = n, .pause_at = pause_at};
    cr_assert_eq(uv_tcp_init_ex(&loop, &cli.tcp, AF_INET), 0); /* a socket now, for its buffers */
    small_buffers((uv_handle_t *)&cli.tcp);
    static uv_connect_t creq;
    cr_assert_eq(uv_tcp_connect(&creq, &cli.tcp, (const struct sockaddr *)&addr, on_connect), 0);
    cr_assert_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    cr_assert_eq(uv_loop_close(&loop), 0, "every handle closed");
}

static void make_tls(const char *client_ca)
{
    idem_tls_server_opts_t so = {.cert_file = tcert("server.pem"),
                                 .key_file = tcert("server.key"),
                                 .client_ca_file = client_ca ? tcert(client_ca) : NULL};
    char err[256];
    cr_assert_eq(idem__tls_server_ctx_create(&so, &server_tls, err, sizeof err), 0, "%s", err);
    idem_tls_client_opts_t co = {.ca_file = tcert("ca.pem"), .cert_file = tcert("client-a.pem"),
                                 .key_file = tcert("client-a.key")};
    cr_assert_eq(idem__tls_client_ctx_create(&co, &client_tls, err, sizeof err), 0, "%s", err);
}

static void drop_tls(void)
{
    idem__tls_ctx_unref(server_tls);
    idem__tls_ctx_unref(client_tls);
    server_tls = client_tls = NULL;
}

static void check_echo(void)
{
    cr_assert_not(cli.error, "client: %s", cli.reason);
    cr_assert_not(srv.error, "server: %s", srv.reason);
    cr_assert(cli.ready && srv.ready);
    cr_assert(cli.eof && srv.eof && cli.closed && srv.closed);
    cr_assert_eq(srv.got_n, payload_n);
    cr_assert_eq(cli.got_n, payload_n);
    cr_assert(memcmp(cli.got, payload, payload_n) == 0, "the echo came back whole and in order");
    cr_assert_eq(cli.written, payload_n, "on_written counts the owner's bytes");
    cr_assert_eq(srv.written, payload_n);
    free(cli.got);
    free(srv.got);
    free(payload);
}

/* ---- tests --------------------------------------------------------------- */

Test(transport, plain_echo, .timeout = 60)
{
    run(100000, 0);
    cr_assert(idem__transport_eof_clean(&cli.tr));
    cr_assert_null(idem__transport_tls(&cli.tr));
    check_echo();
}

Test(transport, tls_echo_with_a_client_certificate, .timeout = 60)
{
    make_tls("ca.pem");
    run(100000, 0);
    char want[65];
    tcert_der_sha256(tcert("client-a.pem"), want);
    cr_assert_str_eq(srv.peer_hash, want, "the server knows the client's certificate at on_ready");
    tcert_der_sha256(tcert("server.pem"), want);
    cr_assert_str_eq(cli.peer_hash, want);
    cr_assert_str_eq(srv.alpn, "http/1.1");
    cr_assert(idem__transport_eof_clean(&cli.tr), "the server sent close_notify");
    check_echo();
    drop_tls();
}

Test(transport, plain_large_write_with_backpressure, .timeout = 120)
{
    run(8u << 20, 1u << 20);
    cr_assert(srv.stops > 0, "the server had to stop reading");
    check_echo();
}

Test(transport, tls_large_write_with_backpressure, .timeout = 120)
{
    make_tls(NULL);
    run(8u << 20, 1u << 20);
    cr_assert(srv.stops > 0, "the server had to stop reading");
    check_echo();
    drop_tls();
}

Test(transport, tls_wrong_name_sends_nothing, .timeout = 60)
{
    idem_tls_server_opts_t so = {.cert_file = tcert("wrong-name.pem"),
                                 .key_file = tcert("wrong-name.key")};
    char err[256];
    cr_assert_eq(idem__tls_server_ctx_create(&so, &server_tls, err, sizeof err), 0, "%s", err);
    idem_tls_client_opts_t co = {.ca_file = tcert("ca.pem")};
    cr_assert_eq(idem__tls_client_ctx_create(&co, &client_tls, err, sizeof err), 0, "%s", err);
    run(1000, 0);
    cr_assert(cli.error);
    cr_assert_str_eq(cli.reason, "certificate verify failed: hostname mismatch");
    cr_assert_not(cli.ready);
    cr_assert_eq(cli.written, 0);
    cr_assert_eq(srv.got_n, 0, "nothing of the held write reached the server");
    cr_assert(srv.error || srv.eof, "the server hears of it");
    cr_assert(cli.closed && srv.closed);
    free(payload);
    free(srv.got);
    drop_tls();
}

/* ---- a raw peer that stops mid-handshake --------------------------------- */

static uv_tcp_t raw;
static uv_write_t raw_w;
static char raw_buf[4096];
static size_t raw_len;

static void raw_closed(uv_handle_t *h)
{
    (void)h;
}

static void raw_written(uv_write_t *req, int status)
{
    cr_assert_eq(status, 0);
    uv_close((uv_handle_t *)req->handle, raw_closed); /* mid-handshake */
}

static void raw_connected(uv_connect_t *req, int status)
{
    cr_assert_eq(status, 0);
    uv_buf_t b = uv_buf_init(raw_buf, (unsigned)raw_len);
    cr_assert_eq(uv_write(&raw_w, req->handle, &b, 1, raw_written), 0);
}

static void raw_peer(const char *bytes, size_t n)
{
    cr_assert(n <= sizeof raw_buf);
    memcpy(raw_buf, bytes, n);
    raw_len = n;
    struct sockaddr_in addr;
    start_server(&addr);
    cli = (peer_t){.name = "raw", .closed = true};
    cr_assert_eq(uv_tcp_init(&loop, &raw), 0);
    static uv_connect_t creq;
    cr_assert_eq(uv_tcp_connect(&creq, &raw, (const struct sockaddr *)&addr, raw_connected), 0);
    cr_assert_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    cr_assert_eq(uv_loop_close(&loop), 0, "every handle closed");
    cr_assert(srv.closed);
    cr_assert_not(srv.ready);
    cr_assert_eq(srv.got_n, 0);
}

Test(transport, peer_closes_mid_handshake, .timeout = 60)
{
    make_tls(NULL);
    idem_tls_t *c = idem__tls_create_client(client_tls, "localhost", NULL);
    char tmp[64];
    cr_assert_eq(idem__tls_read(c, tmp, sizeof tmp), 0);
    char hello[4096];
    size_t n = idem__tls_take(c, hello, sizeof hello);
    cr_assert(n > 20);
    idem__tls_destroy(c);
    raw_peer(hello, n / 2);
    cr_assert(srv.error);
    cr_assert_str_eq(srv.reason, "the peer closed the connection during the TLS handshake");
    drop_tls();
}

Test(transport, garbage_is_an_error, .timeout = 60)
{
    make_tls(NULL);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_peer(http, strlen(http));
    cr_assert(srv.error);
    cr_assert_neq(srv.reason[0], '\0');
    drop_tls();
}
