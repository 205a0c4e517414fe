/* tests/unit/test_tls.c - TLS sessions over memory (src/core/tls.c).
 *
 * A client session and a server session are driven against each other in
 * memory: shuttle() reads each side (which drives its handshake) and moves
 * the ciphertext each produced to the other, until nothing moves.  The
 * certificates come from tests/certs.py, made by the build into the
 * directory $IDEM_TEST_CERTS (tests/unit/meson.build).  The TLS 1.1 client
 * and the SHA-256 of a certificate's DER are made with OpenSSL directly, so
 * that the code under test does not check itself.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "cert_fixture.h"
#include "core/tls.h"
#include "idem/alloc.h"

/* ---- fixtures ----------------------------------------------------------- */

static idem_tls_ctx_t *server_ctx(const char *crt, const char *key, const char *client_ca)
{
    idem_tls_server_opts_t o = {.cert_file = tcert(crt), .key_file = tcert(key),
                                .client_ca_file = client_ca ? tcert(client_ca) : NULL};
    idem_tls_ctx_t *c = NULL;
    char err[256];
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), 0, "%s", err);
    return c;
}

static idem_tls_ctx_t *client_ctx(const char *ca, const char *crt, const char *key)
{
    idem_tls_client_opts_t o = {.ca_file = tcert(ca), .cert_file = crt ? tcert(crt) : NULL,
                                .key_file = key ? tcert(key) : NULL};
    idem_tls_ctx_t *c = NULL;
    char err[256];
    cr_assert_eq(idem__tls_client_ctx_create(&o, &c, err, sizeof err), 0, "%s", err);
    return c;
}

typedef struct {
    idem_tls_t *t;
    int rc; /* 0, or the first negative code a read gave */
    char got[65536];
    size_t got_n;
} side_t;

/* Read what a can, and move what it produced to b; true if anything moved. */
static bool step(side_t *a, side_t *b)
{
    bool moved = false;
    if (a->rc == 0) {
        int n;
        while ((n = idem__tls_read(a->t, a->got + a->got_n, sizeof a->got - a->got_n)) > 0) {
            a->got_n += (size_t)n;
            moved = true;
        }
        if (n < 0)
            a->rc = n;
    }
    size_t p = idem__tls_pending(a->t);
    if (p) {
        char *c = malloc(p);
        cr_assert(c);
        cr_assert_eq(idem__tls_take(a->t, c, p), p);
        (void)idem__tls_feed(b->t, c, p);
        free(c);
        moved = true;
    }
    return moved;
}

static void shuttle(side_t *c, side_t *s)
{
    for (int i = 0; i < 64; i++) {
        bool m1 = step(c, s);
        bool m2 = step(s, c);
        if (!m1 && !m2)
            return;
    }
    cr_assert_fail("the sessions never settled");
}

static void pair(side_t *c, side_t *s, idem_tls_ctx_t *cctx, const char *name, idem_tls_ctx_t *sctx,
                 idem_tls_session_cache_t *cache)
{
    memset(c, 0, sizeof *c);
    memset(s, 0, sizeof *s);
    c->t = idem__tls_create_client(cctx, name, cache);
    s->t = idem__tls_create_server(sctx);
    cr_assert(c->t && s->t);
    shuttle(c, s);
}

static void unpair(side_t *c, side_t *s)
{
    idem__tls_destroy(c->t);
    idem__tls_destroy(s->t);
}

/* Pair c and s (client context cctx asking for name, server sctx) in a
 * handshake that the client refuses when it verifies the server. */
static void client_refuses(side_t *c, side_t *s, idem_tls_ctx_t *cctx, const char *name,
                           idem_tls_ctx_t *sctx)
{
    pair(c, s, cctx, name, sctx, NULL);
    cr_assert_eq(c->rc, IDEM_TLS_E_VERIFY, "%d %s", c->rc, idem__tls_errstr(c->t));
}

/* The same, refused by the server when it verifies the client. */
static void server_refuses(side_t *c, side_t *s, idem_tls_ctx_t *cctx, const char *name,
                           idem_tls_ctx_t *sctx)
{
    pair(c, s, cctx, name, sctx, NULL);
    cr_assert_eq(s->rc, IDEM_TLS_E_VERIFY, "%d %s", s->rc, idem__tls_errstr(s->t));
}

/* ---- tests -------------------------------------------------------------- */

Test(tls, handshake_data_alpn_and_client_certificate)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", "ca.pem");
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", "client-a.pem", "client-a.key");
    static side_t c, s;
    pair(&c, &s, cctx, "localhost", sctx, NULL);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert_eq(s.rc, 0, "%s", idem__tls_errstr(s.t));
    cr_assert(idem__tls_handshake_done(c.t) && idem__tls_handshake_done(s.t));
    cr_assert(idem__tls_is_server(s.t) && !idem__tls_is_server(c.t));

    cr_assert_eq(idem__tls_write(c.t, "hello", 5), 0);
    shuttle(&c, &s);
    cr_assert_eq(s.got_n, 5);
    cr_assert(memcmp(s.got, "hello", 5) == 0);
    cr_assert_eq(idem__tls_write(s.t, "world!", 6), 0);
    shuttle(&c, &s);
    cr_assert_eq(c.got_n, 6);
    cr_assert(memcmp(c.got, "world!", 6) == 0);

    cr_assert_str_eq(idem__tls_alpn(s.t), "http/1.1");
    cr_assert_str_eq(idem__tls_alpn(c.t), "http/1.1");

    char want[65], got[65];
    tcert_der_sha256(tcert("client-a.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(s.t, got));
    cr_assert_str_eq(got, want);
    tcert_der_sha256(tcert("server.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(c.t, got));
    cr_assert_str_eq(got, want);

    /* close_notify: the other side reads a clean end. */
    cr_assert_eq(idem__tls_shutdown(c.t), 0);
    shuttle(&c, &s);
    cr_assert_eq(s.rc, IDEM_TLS_E_CLOSED);
    cr_assert(idem__tls_write(c.t, "x", 1) < 0, "no write after shutdown");
    /* The server may still answer on its half. */
    cr_assert_eq(idem__tls_write(s.t, "bye", 3), 0);
    shuttle(&c, &s);
    cr_assert_eq(c.got_n, 9);
    cr_assert(memcmp(c.got + 6, "bye", 3) == 0);
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, no_client_certificate_asked_means_no_peer_hash)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", "client-a.pem", "client-a.key");
    static side_t c, s;
    cr_assert_not(idem__tls_handshake_done(s.t = idem__tls_create_server(sctx)));
    idem__tls_destroy(s.t);
    pair(&c, &s, cctx, "127.0.0.1", sctx, NULL); /* an IP name, against the IP SAN */
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert(idem__tls_handshake_done(s.t));
    char h[65];
    cr_assert_not(idem__tls_peer_cert_sha256_hex(s.t, h));
    cr_assert_str_eq(h, "");
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, client_certificate_required)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", "ca.pem");
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", NULL, NULL);
    static side_t c, s;
    server_refuses(&c, &s, cctx, "localhost", sctx);
    cr_assert(strstr(idem__tls_errstr(s.t), "no certificate"), "%s", idem__tls_errstr(s.t));
    cr_assert(c.rc < 0, "the client hears the alert");
    cr_assert_eq(s.got_n, 0);
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);

    /* A client certificate by another CA. */
    cctx = client_ctx("ca.pem", "client-other.pem", "client-other.key");
    server_refuses(&c, &s, cctx, "localhost", sctx);
    cr_assert(strstr(idem__tls_errstr(s.t), "certificate verify failed: "), "%s",
              idem__tls_errstr(s.t));
    char h[65];
    cr_assert_not(idem__tls_peer_cert_sha256_hex(s.t, h));
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, wrong_ca_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    idem_tls_ctx_t *cctx = client_ctx("other-ca.pem", NULL, NULL);
    static side_t c, s;
    client_refuses(&c, &s, cctx, "localhost", sctx);
    cr_assert(strstr(idem__tls_errstr(c.t), "certificate verify failed: unable to get local issuer"),
              "%s", idem__tls_errstr(c.t));
    cr_assert_not(idem__tls_handshake_done(c.t));
    cr_assert(idem__tls_write(c.t, "x", 1) < 0, "nothing is sent");
    cr_assert(s.rc < 0, "the server hears the alert");
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, wrong_name_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("wrong-name.pem", "wrong-name.key", NULL);
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", NULL, NULL);
    static side_t c, s;
    client_refuses(&c, &s, cctx, "localhost", sctx);
    cr_assert_str_eq(idem__tls_errstr(c.t), "certificate verify failed: hostname mismatch");
    unpair(&c, &s);
    client_refuses(&c, &s, cctx, "127.0.0.1", sctx);
    cr_assert(strstr(idem__tls_errstr(c.t), "mismatch"), "%s", idem__tls_errstr(c.t));
    unpair(&c, &s);
    pair(&c, &s, cctx, "other.invalid", sctx, NULL);
    cr_assert_eq(c.rc, 0, "the right name verifies: %s", idem__tls_errstr(c.t));
    unpair(&c, &s);
    /* A verifying client needs a name. */
    cr_assert_null(idem__tls_create_client(cctx, NULL, NULL));
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, expired_certificate_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("expired.pem", "expired.key", NULL);
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", NULL, NULL);
    static side_t c, s;
    client_refuses(&c, &s, cctx, "localhost", sctx);
    cr_assert_str_eq(idem__tls_errstr(c.t), "certificate verify failed: certificate has expired");
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);

    /* no_verify takes it, and then no peer hash is claimed. */
    idem_tls_client_opts_t o = {.no_verify = true};
    char err[256];
    cr_assert_eq(idem__tls_client_ctx_create(&o, &cctx, err, sizeof err), 0, "%s", err);
    pair(&c, &s, cctx, "localhost", sctx, NULL);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert(idem__tls_handshake_done(c.t));
    char h[65];
    cr_assert_not(idem__tls_peer_cert_sha256_hex(c.t, h));
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, tls11_client_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    SSL_CTX *old = SSL_CTX_new(TLS_client_method());
    cr_assert(old);
    SSL_CTX_set_security_level(old, 0);
    cr_assert(SSL_CTX_set_min_proto_version(old, TLS1_VERSION));
    cr_assert(SSL_CTX_set_max_proto_version(old, TLS1_1_VERSION));
    cr_assert(SSL_CTX_set_cipher_list(old, "ALL:@SECLEVEL=0"));
    SSL *ssl = SSL_new(old);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, in, out);
    SSL_set_connect_state(ssl);
    cr_assert(SSL_do_handshake(ssl) <= 0);
    char hello[4096];
    int n = BIO_read(out, hello, sizeof hello);
    cr_assert(n > 0, "the TLS 1.1 client sent a ClientHello");
    idem_tls_t *s = idem__tls_create_server(sctx);
    cr_assert_eq(idem__tls_feed(s, hello, (size_t)n), 0);
    char buf[64];
    cr_assert_eq(idem__tls_read(s, buf, sizeof buf), IDEM_TLS_E_PROTOCOL);
    cr_assert(strstr(idem__tls_errstr(s), "protocol"), "%s", idem__tls_errstr(s));
    cr_assert_not(idem__tls_handshake_done(s));
    /* Sticky. */
    cr_assert_eq(idem__tls_read(s, buf, sizeof buf), IDEM_TLS_E_PROTOCOL);
    idem__tls_destroy(s);
    SSL_free(ssl);
    SSL_CTX_free(old);
    idem__tls_ctx_unref(sctx);
}

Test(tls, garbage_is_a_protocol_error)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    idem_tls_t *s = idem__tls_create_server(sctx);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(idem__tls_feed(s, http, strlen(http)), 0);
    char buf[64];
    cr_assert_eq(idem__tls_read(s, buf, sizeof buf), IDEM_TLS_E_PROTOCOL);
    cr_assert_neq(idem__tls_errstr(s)[0], '\0');
    idem__tls_destroy(s);

    /* Random bytes, many times: an error or a wait, never a crash. */
    srand(19);
    for (int round = 0; round < 200; round++) {
        s = idem__tls_create_server(sctx);
        char junk[512];
        size_t len = 1 + (size_t)(rand() % (int)sizeof junk);
        for (size_t i = 0; i < len; i++)
            junk[i] = (char)rand();
        if (round % 2)
            junk[0] = 0x16; /* a handshake record, to go deeper */
        (void)idem__tls_feed(s, junk, len);
        int r = idem__tls_read(s, buf, sizeof buf);
        cr_assert(r <= 0);
        idem__tls_destroy(s);
    }
    idem__tls_ctx_unref(sctx);
}

Test(tls, truncated_handshake_waits_within_a_bound)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", NULL, NULL);
    idem_tls_t *c = idem__tls_create_client(cctx, "localhost", NULL);
    idem_tls_t *s = idem__tls_create_server(sctx);
    char buf[64];
    cr_assert_eq(idem__tls_read(c, buf, sizeof buf), 0);
    size_t n = idem__tls_pending(c);
    cr_assert(n > 10);
    char hello[4096];
    cr_assert_eq(idem__tls_take(c, hello, sizeof hello), n);
    cr_assert_eq(idem__tls_feed(s, hello, n / 2), 0);
    cr_assert_eq(idem__tls_read(s, buf, sizeof buf), 0, "half a hello: more input needed");
    cr_assert_eq(idem__tls_pending(s), 0);
    cr_assert_not(idem__tls_handshake_done(s));
    idem__tls_destroy(s);

    /* A peer that sends without the session consuming: refused past the cap. */
    s = idem__tls_create_server(sctx);
    char *big = calloc(1, IDEM_TLS_MAX_HELD);
    cr_assert(big);
    cr_assert_eq(idem__tls_feed(s, big, IDEM_TLS_MAX_HELD), 0);
    cr_assert_eq(idem__tls_feed(s, "x", 1), IDEM_TLS_E_TOOBIG);
    cr_assert_eq(idem__tls_read(s, buf, sizeof buf), IDEM_TLS_E_TOOBIG, "sticky");
    idem__tls_destroy(s);
    /* A record header that announces the most a record may hold, and then a
     * trickle: the session waits, holding what came and no more. */
    s = idem__tls_create_server(sctx);
    const unsigned char hdr[5] = {0x16, 0x03, 0x01, 0x48, 0x00};
    cr_assert_eq(idem__tls_feed(s, (const char *)hdr, 5), 0);
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(idem__tls_feed(s, big, 100), 0);
        int r = idem__tls_read(s, buf, sizeof buf);
        cr_assert(r == 0 || r == IDEM_TLS_E_PROTOCOL, "%d", r);
        if (r)
            break;
    }
    free(big);
    idem__tls_destroy(s);
    idem__tls_destroy(c);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, session_resumed_on_a_second_connection)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", "ca.pem");
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", "client-b.pem", "client-b.key");
    idem_tls_session_cache_t *cache = idem__tls_session_cache_create();
    cr_assert(cache);
    static side_t c, s;
    pair(&c, &s, cctx, "localhost", sctx, cache);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert_not(idem__tls_session_reused(c.t));
    /* TLS 1.3 tickets come after the handshake: an exchange reads them. */
    cr_assert_eq(idem__tls_write(c.t, "ping", 4), 0);
    shuttle(&c, &s);
    cr_assert_eq(idem__tls_write(s.t, "pong", 4), 0);
    shuttle(&c, &s);
    cr_assert_eq(c.got_n, 4);
    unpair(&c, &s);

    pair(&c, &s, cctx, "localhost", sctx, cache);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert(idem__tls_session_reused(c.t), "the client resumed");
    cr_assert(idem__tls_session_reused(s.t), "the server resumed");
    char want[65], got[65];
    tcert_der_sha256(tcert("client-b.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(s.t, got), "a resumed session knows its client");
    cr_assert_str_eq(got, want);
    cr_assert_eq(idem__tls_write(c.t, "again", 5), 0);
    shuttle(&c, &s);
    cr_assert_eq(s.got_n, 5);
    unpair(&c, &s);

    /* A cleared cache: a full handshake. */
    idem__tls_session_cache_clear(cache);
    pair(&c, &s, cctx, "localhost", sctx, cache);
    cr_assert_not(idem__tls_session_reused(c.t));
    unpair(&c, &s);
    idem__tls_session_cache_destroy(cache);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb");
    FILE *b = fopen(to, "wb");
    cr_assert(a && b);
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, b), n);
    fclose(a);
    cr_assert_eq(fclose(b), 0);
}

Test(tls, reload_keeps_the_old_context_on_a_bad_file)
{
    char dir[] = "/tmp/idem-tls-XXXXXX";
    cr_assert(mkdtemp(dir));
    char crt[512], key[512];
    snprintf(crt, sizeof crt, "%s/live.pem", dir);
    snprintf(key, sizeof key, "%s/live.key", dir);
    copy_file(tcert("server.pem"), crt);
    copy_file(tcert("server.key"), key);

    idem_tls_server_t holder;
    idem_tls_server_opts_t o = {.cert_file = crt, .key_file = key};
    char err[256];
    cr_assert_eq(idem__tls_server_init(&holder, &o, err, sizeof err), 0, "%s", err);
    idem_tls_ctx_t *first = idem__tls_server_current(&holder);
    idem_tls_ctx_t *cctx = client_ctx("ca.pem", NULL, NULL);
    static side_t c, s;
    char want[65], got[65];

    /* A file that does not load: the running context stays. */
    FILE *f = fopen(crt, "w");
    cr_assert(f);
    fputs("not a certificate\n", f);
    fclose(f);
    cr_assert_eq(idem__tls_server_reload(&holder, err, sizeof err), -1);
    cr_assert(strstr(err, "listen_tls.cert_file: ") && strstr(err, crt), "%s", err);
    cr_assert_null(strchr(err, '\n'));
    idem_tls_ctx_t *still = idem__tls_server_current(&holder);
    cr_assert_eq(still, first);
    pair(&c, &s, cctx, "localhost", still, NULL);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    tcert_der_sha256(tcert("server.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(c.t, got));
    cr_assert_str_eq(got, want);
    unpair(&c, &s);
    idem__tls_ctx_unref(still);

    /* A session made before the reload keeps the old certificate. */
    idem_tls_t *old_s = idem__tls_create_server(first);
    idem__tls_ctx_unref(first);

    /* A good new pair: new sessions get it. */
    copy_file(tcert("wrong-name.pem"), crt);
    copy_file(tcert("wrong-name.key"), key);
    cr_assert_eq(idem__tls_server_reload(&holder, err, sizeof err), 0, "%s", err);
    idem_tls_ctx_t *fresh = idem__tls_server_current(&holder);
    cr_assert_neq(fresh, first);
    pair(&c, &s, cctx, "other.invalid", fresh, NULL);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    tcert_der_sha256(tcert("wrong-name.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(c.t, got));
    cr_assert_str_eq(got, want);
    unpair(&c, &s);
    idem__tls_ctx_unref(fresh);

    memset(&c, 0, sizeof c);
    memset(&s, 0, sizeof s);
    c.t = idem__tls_create_client(cctx, "localhost", NULL);
    s.t = old_s;
    shuttle(&c, &s);
    cr_assert_eq(c.rc, 0, "the old session still has its certificate: %s", idem__tls_errstr(c.t));
    tcert_der_sha256(tcert("server.pem"), want);
    cr_assert(idem__tls_peer_cert_sha256_hex(c.t, got));
    cr_assert_str_eq(got, want);
    idem__tls_server_cleanup(&holder); /* sessions outlive the holder */
    cr_assert_eq(idem__tls_write(s.t, "late", 4), 0);
    shuttle(&c, &s);
    cr_assert_eq(c.got_n, 4);
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    unlink(crt);
    unlink(key);
    rmdir(dir);
}

Test(tls, file_errors_name_the_file_and_the_reason)
{
    idem_tls_ctx_t *c = NULL;
    char err[256];
    idem_tls_server_opts_t o = {.cert_file = "/nonexistent/x.pem", .key_file = tcert("server.key")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert_null(c);
    cr_assert_str_eq(err, "listen_tls.cert_file: /nonexistent/x.pem: No such file or directory");

    o = (idem_tls_server_opts_t){.cert_file = tcert("server.pem"),
                                 .key_file = tcert("client-a.key")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert(strstr(err, "listen_tls.key_file: ") && strstr(err, "client-a.key: key does not match certificate"),
              "%s", err);

    o = (idem_tls_server_opts_t){.cert_file = tcert("server.key"), .key_file = tcert("server.key")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert(strstr(err, "listen_tls.cert_file: ") && strstr(err, "server.key: no start line"), "%s",
              err);
    cr_assert_null(strchr(err, '\n'));

    o = (idem_tls_server_opts_t){.cert_file = tcert("server.pem"), .key_file = tcert("server.pem")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert(strstr(err, "server.pem: no unencrypted PEM private key in it"), "%s", err);

    o = (idem_tls_server_opts_t){.cert_file = tcert("server.pem"), .key_file = tcert("server.key"),
                                 .client_ca_file = tcert("server.key")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert(strstr(err, "listen_tls.client_ca_file: ") && strstr(err, "server.key: "), "%s", err);

    idem_tls_client_opts_t co = {.name = "upstream_tls", .ca_file = "/nonexistent/ca.pem"};
    cr_assert_eq(idem__tls_client_ctx_create(&co, &c, err, sizeof err), -1);
    cr_assert_str_eq(err, "upstream_tls.ca_file: /nonexistent/ca.pem: No such file or directory");
    co = (idem_tls_client_opts_t){.cert_file = tcert("client-a.pem")};
    cr_assert_eq(idem__tls_client_ctx_create(&co, &c, err, sizeof err), -1, "a cert without a key");
}

Test(tls, alpn_without_a_common_protocol_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    const char *const h2[] = {"h2", NULL};
    idem_tls_client_opts_t o = {.ca_file = tcert("ca.pem"), .alpn = h2};
    idem_tls_ctx_t *cctx = NULL;
    char err[256];
    cr_assert_eq(idem__tls_client_ctx_create(&o, &cctx, err, sizeof err), 0, "%s", err);
    static side_t c, s;
    pair(&c, &s, cctx, "localhost", sctx, NULL);
    cr_assert(s.rc < 0 && c.rc < 0);
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);

    /* A server that also accepts h2 picks it for such a client. */
    const char *const both[] = {"h2", "http/1.1", NULL};
    idem_tls_server_opts_t so = {.cert_file = tcert("server.pem"), .key_file = tcert("server.key"),
                                 .alpn = both};
    cr_assert_eq(idem__tls_server_ctx_create(&so, &sctx, err, sizeof err), 0, "%s", err);
    cr_assert_eq(idem__tls_client_ctx_create(&o, &cctx, err, sizeof err), 0, "%s", err);
    pair(&c, &s, cctx, "localhost", sctx, NULL);
    cr_assert_eq(c.rc, 0, "%s", idem__tls_errstr(c.t));
    cr_assert_str_eq(idem__tls_alpn(s.t), "h2");
    unpair(&c, &s);
    idem__tls_ctx_unref(cctx);
    idem__tls_ctx_unref(sctx);
}

Test(tls, out_of_memory_is_an_error)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    idem_alloc_fail_after(1);
    cr_assert_null(idem__tls_create_server(sctx));
    idem_tls_ctx_t *c = NULL;
    char err[256];
    idem_tls_server_opts_t o = {.cert_file = tcert("server.pem"), .key_file = tcert("server.key")};
    cr_assert_eq(idem__tls_server_ctx_create(&o, &c, err, sizeof err), -1);
    cr_assert_str_eq(err, "listen_tls: out of memory");
    idem_tls_server_t holder;
    cr_assert_eq(idem__tls_server_init(&holder, &o, err, sizeof err), -1);
    cr_assert_null(idem__tls_session_cache_create());
    idem_alloc_fail_after(0);
    idem__tls_ctx_unref(sctx);
}

Test(tls, renegotiation_refused)
{
    idem_tls_ctx_t *sctx = server_ctx("server.pem", "server.key", NULL);
    SSL_CTX *old = SSL_CTX_new(TLS_client_method());
    cr_assert(old);
    cr_assert(SSL_CTX_set_max_proto_version(old, TLS1_2_VERSION));
    SSL_CTX_set_verify(old, SSL_VERIFY_NONE, NULL);
    SSL *ssl = SSL_new(old);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    BIO_set_mem_eof_return(in, -1);
    SSL_set_bio(ssl, in, out);
    SSL_set_connect_state(ssl);
    idem_tls_t *s = idem__tls_create_server(sctx);
    char buf[4096];
    int hs = 0;
    /* Move bytes both ways until the client's handshake settles. */
    for (int i = 0; i < 20; i++) {
        hs = SSL_do_handshake(ssl);
        int n;
        while ((n = BIO_read(out, buf, sizeof buf)) > 0)
            cr_assert_eq(idem__tls_feed(s, buf, (size_t)n), 0);
        cr_assert(idem__tls_read(s, buf, sizeof buf) >= 0, "%s", idem__tls_errstr(s));
        size_t p;
        while ((p = idem__tls_take(s, buf, sizeof buf)) > 0)
            BIO_write(in, buf, (int)p);
        if (hs == 1 && idem__tls_handshake_done(s))
            break;
    }
    cr_assert_eq(hs, 1, "a TLS 1.2 handshake");
    cr_assert_eq(SSL_version(ssl), TLS1_2_VERSION);

    /* The client asks to renegotiate; the server refuses and stays whole. */
    cr_assert_eq(SSL_renegotiate(ssl), 1);
    int r = 0;
    bool refused = false;
    for (int i = 0; i < 20 && !refused; i++) {
        r = SSL_do_handshake(ssl);
        int n;
        while ((n = BIO_read(out, buf, sizeof buf)) > 0)
            (void)idem__tls_feed(s, buf, (size_t)n);
        int sr = idem__tls_read(s, buf, sizeof buf);
        cr_assert(sr == 0 || sr < 0);
        size_t p;
        while ((p = idem__tls_take(s, buf, sizeof buf)) > 0)
            BIO_write(in, buf, (int)p);
        char rd[16];
        if (SSL_read(ssl, rd, sizeof rd) <= 0 &&
            SSL_get_error(ssl, -1) == SSL_ERROR_SSL)
            refused = true;
        if (r <= 0 && SSL_get_error(ssl, r) == SSL_ERROR_SSL)
            refused = true;
    }
    cr_assert(refused, "the renegotiation never completed");
    cr_assert_eq(SSL_renegotiate_pending(ssl), 1);
    idem__tls_destroy(s);
    SSL_free(ssl);
    SSL_CTX_free(old);
    idem__tls_ctx_unref(sctx);
}
