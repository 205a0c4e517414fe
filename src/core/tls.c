/* src/core/tls.c - TLS sessions over memory BIOs (tls.h says what a
 * caller sees).
 *
 * A session is an SSL with two memory BIOs: `in` holds the ciphertext fed
 * from the peer, `out` what OpenSSL wrote for the peer.  `in` answers "retry"
 * when empty (BIO_set_mem_eof_return -1), so OpenSSL asks for more input
 * (SSL_ERROR_WANT_READ) instead of seeing an end of stream; `out` grows as
 * OpenSSL writes, so OpenSSL never waits to write.  The caller's feed is
 * refused beyond IDEM_TLS_MAX_HELD unconsumed bytes.
 *
 * OpenSSL's error queue is per thread: every operation clears it first and
 * turns what it finds into the session's one-line errstr, so nothing of one
 * session shows in another's message.  Errors are sticky: a failed session
 * answers every later call with the same code.
 *
 * Contexts: the server's keeps no session cache of its own (resumption is by
 * stateless tickets, under keys of the context: a reload starts afresh), so a
 * flood of handshakes costs no memory that outlives the connections.  The
 * client's keeps none either (SSL_SESS_CACHE_NO_INTERNAL_STORE): new
 * sessions go through the new-session callback into the session's
 * idem_tls_session_cache_t, found through the SSL's app data.
 *
 * THREADING: tls.h.
 */
#include "core/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "idem/alloc.h"

struct idem_tls_ctx {
    SSL_CTX *ssl;
    atomic_int refs;
    bool server;
    bool verify; /* a client context that checks the server; a server context with client_ca_file */
    /* The ALPN list in wire format (length-prefixed names). */
    unsigned char alpn[256];
    unsigned alpn_len;
};

struct idem_tls_session_cache {
    SSL_SESSION *sess; /* the last good session, or NULL */
};

struct idem_tls {
    SSL *ssl;
    BIO *in;  /* peer -> OpenSSL */
    BIO *out; /* OpenSSL -> peer */
    idem_tls_ctx_t *ctx;
    idem_tls_session_cache_t *cache; /* client: where new sessions go; or NULL */
    int err;                         /* 0, or the sticky idem_tls_err_t */
    bool done;                       /* the handshake completed */
    bool shut;                       /* idem__tls_shutdown ran */
    char alpn[64];                   /* the protocol agreed, or "" */
    char errstr[200];
};

static const char *const default_alpn[] = {"http/1.1", NULL};

/* ---- messages ----------------------------------------------------------- */

/* The reason of the first error in OpenSSL's queue ("no start line"), and the
 * queue emptied; fallback when the queue is empty. */
static const char *ossl_reason(const char *fallback)
{
    unsigned long e = ERR_peek_error(); /* the first: the cause, not "PEM lib" */
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return r ? r : fallback;
}

static void file_err(char *err, size_t errlen, const char *name, const char *field,
                     const char *path, const char *why)
{
    if (errlen)
        snprintf(err, errlen, "%s.%s: %s: %s", name, field, path, why);
}

/* Check that path can be opened, so that a missing file reads as the
 * system's reason rather than OpenSSL's "system lib". */
static bool file_readable(char *err, size_t errlen, const char *name, const char *field,
                          const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        file_err(err, errlen, name, field, path, strerror(errno));
        return false;
    }
    fclose(f);
    return true;
}

/* Never prompt for a passphrase on a terminal: an encrypted key fails. */
static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* ---- contexts ----------------------------------------------------------- */

static bool alpn_wire(idem_tls_ctx_t *c, const char *const *list)
{
    c->alpn_len = 0;
    for (const char *const *p = list ? list : default_alpn; *p; p++) {
        size_t n = strlen(*p);
        if (n == 0 || n > 255 || c->alpn_len + 1 + n > sizeof c->alpn)
            return false;
        c->alpn[c->alpn_len++] = (unsigned char)n;
        memcpy(c->alpn + c->alpn_len, *p, n);
        c->alpn_len += (unsigned)n;
    }
    return true;
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    idem_tls_ctx_t *c = arg;
    unsigned char *sel = NULL;
    unsigned char sel_len = 0;
    /* Our order of preference first: SSL_select_next_proto walks its first
     * list and takes the first name the second one has. */
    if (SSL_select_next_proto(&sel, &sel_len, c->alpn, c->alpn_len, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    *outlen = sel_len;
    return SSL_TLSEXT_ERR_OK;
}

static int new_session(SSL *ssl, SSL_SESSION *sess)
{
    idem_tls_t *t = SSL_get_app_data(ssl);
    if (!t || !t->cache || t->err || !SSL_SESSION_is_resumable(sess))
        return 0;
    if (t->cache->sess)
        SSL_SESSION_free(t->cache->sess);
    t->cache->sess = sess;
    return 1; /* the reference is the cache's now */
}

static idem_tls_ctx_t *ctx_new(bool server, char *err, size_t errlen, const char *name)
{
    idem_tls_ctx_t *c = idem_calloc(1, sizeof *c);
    if (!c) {
        if (errlen)
            snprintf(err, errlen, "%s: out of memory", name);
        return NULL;
    }
    ERR_clear_error();
    c->ssl = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!c->ssl) {
        if (errlen)
            snprintf(err, errlen, "%s: %s", name, ossl_reason("out of memory"));
        idem_free(c);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->server = server;
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(c->ssl, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                                    (server ? SSL_OP_CIPHER_SERVER_PREFERENCE : 0));
    /* Idle sessions give their buffers back. */
    SSL_CTX_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_default_passwd_cb(c->ssl, no_password);
    return c;
}

/* Load the certificate chain and its key into c, checking they match. */
static bool load_pair(idem_tls_ctx_t *c, const char *name, const char *cert_file,
                      const char *key_file, char *err, size_t errlen)
{
    if (!file_readable(err, errlen, name, "cert_file", cert_file))
        return false;
    if (!file_readable(err, errlen, name, "key_file", key_file))
        return false;
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(c->ssl, cert_file) != 1) {
        file_err(err, errlen, name, "cert_file", cert_file, ossl_reason("not a PEM certificate"));
        return false;
    }
    BIO *b = BIO_new_file(key_file, "r");
    if (!b) {
        file_err(err, errlen, name, "key_file", key_file, ossl_reason("cannot open"));
        return false;
    }
    EVP_PKEY *key = PEM_read_bio_PrivateKey(b, NULL, no_password, NULL);
    BIO_free(b);
    if (!key) {
        ERR_clear_error(); /* OpenSSL 3's decoders say only "unsupported" */
        file_err(err, errlen, name, "key_file", key_file, "no unencrypted PEM private key in it");
        return false;
    }
    X509 *cert = SSL_CTX_get0_certificate(c->ssl);
    if (!cert || X509_check_private_key(cert, key) != 1) {
        ERR_clear_error();
        EVP_PKEY_free(key);
        file_err(err, errlen, name, "key_file", key_file, "key does not match certificate");
        return false;
    }
    int ok = SSL_CTX_use_PrivateKey(c->ssl, key);
    EVP_PKEY_free(key);
    if (ok != 1) {
        file_err(err, errlen, name, "key_file", key_file, ossl_reason("key refused"));
        return false;
    }
    return true;
}

int idem__tls_server_ctx_create(const idem_tls_server_opts_t *o, idem_tls_ctx_t **out, char *err,
                                size_t errlen)
{
    *out = NULL;
    const char *name = o->name ? o->name : "listen_tls";
    if (!o->cert_file || !o->key_file) {
        if (errlen)
            snprintf(err, errlen, "%s: cert_file and key_file are both needed", name);
        return -1;
    }
    idem_tls_ctx_t *c = ctx_new(true, err, errlen, name);
    if (!c)
        return -1;
    if (!alpn_wire(c, o->alpn)) {
        if (errlen)
            snprintf(err, errlen, "%s: an ALPN name is empty or too long", name);
        goto fail;
    }
    if (!load_pair(c, name, o->cert_file, o->key_file, err, errlen))
        goto fail;
    if (o->client_ca_file) {
        if (!file_readable(err, errlen, name, "client_ca_file", o->client_ca_file))
            goto fail;
        ERR_clear_error();
        if (SSL_CTX_load_verify_locations(c->ssl, o->client_ca_file, NULL) != 1) {
            file_err(err, errlen, name, "client_ca_file", o->client_ca_file,
                     ossl_reason("no certificate in it"));
            goto fail;
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca_file);
        if (!names) {
            file_err(err, errlen, name, "client_ca_file", o->client_ca_file,
                     ossl_reason("no certificate in it"));
            goto fail;
        }
        SSL_CTX_set_client_CA_list(c->ssl, names);
        SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        c->verify = true;
    }
    /* A resumed session must belong to this kind of listener; OpenSSL
     * refuses to resume under SSL_VERIFY_PEER without an id context. */
    static const unsigned char sid[] = "idemd";
    SSL_CTX_set_session_id_context(c->ssl, sid, sizeof sid - 1);
    SSL_CTX_set_session_cache_mode(c->ssl, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_alpn_select_cb(c->ssl, alpn_select, c);
    ERR_clear_error();
    *out = c;
    return 0;
fail:
    idem__tls_ctx_unref(c);
    return -1;
}

int idem__tls_client_ctx_create(const idem_tls_client_opts_t *o, idem_tls_ctx_t **out, char *err,
                                size_t errlen)
{
    *out = NULL;
    const char *name = o->name ? o->name : "upstream_tls";
    if (!o->cert_file != !o->key_file) {
        if (errlen)
            snprintf(err, errlen, "%s: cert_file and key_file go together", name);
        return -1;
    }
    idem_tls_ctx_t *c = ctx_new(false, err, errlen, name);
    if (!c)
        return -1;
    if (!alpn_wire(c, o->alpn)) {
        if (errlen)
            snprintf(err, errlen, "%s: an ALPN name is empty or too long", name);
        goto fail;
    }
    if (o->cert_file && !load_pair(c, name, o->cert_file, o->key_file, err, errlen))
        goto fail;
    if (o->ca_file) {
        if (!file_readable(err, errlen, name, "ca_file", o->ca_file))
            goto fail;
        ERR_clear_error();
        if (SSL_CTX_load_verify_locations(c->ssl, o->ca_file, NULL) != 1) {
            file_err(err, errlen, name, "ca_file", o->ca_file, ossl_reason("no certificate in it"));
            goto fail;
        }
    } else if (!o->no_verify) {
        ERR_clear_error();
        if (SSL_CTX_set_default_verify_paths(c->ssl) != 1) {
            if (errlen)
                snprintf(err, errlen, "%s: the system's trust store: %s", name,
                         ossl_reason("cannot be loaded"));
            goto fail;
        }
    }
    c->verify = !o->no_verify;
    SSL_CTX_set_verify(c->ssl, c->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (SSL_CTX_set_alpn_protos(c->ssl, c->alpn, c->alpn_len) != 0) {
        if (errlen)
            snprintf(err, errlen, "%s: out of memory", name);
        goto fail;
    }
    SSL_CTX_set_session_cache_mode(c->ssl, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(c->ssl, new_session);
    ERR_clear_error();
    *out = c;
    return 0;
fail:
    idem__tls_ctx_unref(c);
    return -1;
}

idem_tls_ctx_t *idem__tls_ctx_ref(idem_tls_ctx_t *ctx)
{
    atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
    return ctx;
}

void idem__tls_ctx_unref(idem_tls_ctx_t *ctx)
{
    if (!ctx || atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) != 1)
        return;
    SSL_CTX_free(ctx->ssl);
    idem_free(ctx);
}

/* ---- the listener's holder ---------------------------------------------- */

static void holder_free_copies(idem_tls_server_t *s)
{
    idem_free(s->name);
    idem_free(s->cert_file);
    idem_free(s->key_file);
    idem_free(s->client_ca_file);
    if (s->alpn) {
        for (char **p = s->alpn; *p; p++)
            idem_free(*p);
        idem_free(s->alpn);
    }
    s->name = s->cert_file = s->key_file = s->client_ca_file = NULL;
    s->alpn = NULL;
}

static bool dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    return !src || (*dst = idem_strdup(src)) != NULL;
}

static idem_tls_server_opts_t holder_opts(const idem_tls_server_t *s)
{
    return (idem_tls_server_opts_t){
        .name = s->name,
        .cert_file = s->cert_file,
        .key_file = s->key_file,
        .client_ca_file = s->client_ca_file,
        .alpn = (const char *const *)s->alpn,
    };
}

int idem__tls_server_init(idem_tls_server_t *s, const idem_tls_server_opts_t *o, char *err,
                          size_t errlen)
{
    memset(s, 0, sizeof *s);
    bool ok = dup_opt(&s->name, o->name ? o->name : "listen_tls") &&
              dup_opt(&s->cert_file, o->cert_file) && dup_opt(&s->key_file, o->key_file) &&
              dup_opt(&s->client_ca_file, o->client_ca_file);
    if (ok && o->alpn) {
        size_t n = 0;
        while (o->alpn[n])
            n++;
        s->alpn = idem_calloc(n + 1, sizeof *s->alpn);
        ok = s->alpn != NULL;
        for (size_t i = 0; ok && i < n; i++)
            ok = (s->alpn[i] = idem_strdup(o->alpn[i])) != NULL;
    }
    if (!ok) {
        holder_free_copies(s);
        if (errlen)
            snprintf(err, errlen, "%s: out of memory", o->name ? o->name : "listen_tls");
        return -1;
    }
    idem_tls_server_opts_t copy = holder_opts(s);
    if (idem__tls_server_ctx_create(&copy, &s->cur, err, errlen) != 0) {
        holder_free_copies(s);
        return -1;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        idem__tls_ctx_unref(s->cur);
        s->cur = NULL;
        holder_free_copies(s);
        if (errlen)
            snprintf(err, errlen, "%s: cannot make a mutex", o->name ? o->name : "listen_tls");
        return -1;
    }
    return 0;
}

idem_tls_ctx_t *idem__tls_server_current(idem_tls_server_t *s)
{
    pthread_mutex_lock(&s->mu);
    idem_tls_ctx_t *c = idem__tls_ctx_ref(s->cur);
    pthread_mutex_unlock(&s->mu);
    return c;
}

int idem__tls_server_reload(idem_tls_server_t *s, char *err, size_t errlen)
{
    idem_tls_server_opts_t o = holder_opts(s);
    idem_tls_ctx_t *fresh;
    if (idem__tls_server_ctx_create(&o, &fresh, err, errlen) != 0)
        return -1;
    pthread_mutex_lock(&s->mu);
    idem_tls_ctx_t *old = s->cur;
    s->cur = fresh;
    pthread_mutex_unlock(&s->mu);
    idem__tls_ctx_unref(old);
    return 0;
}

void idem__tls_server_swap(idem_tls_server_t *s, idem_tls_ctx_t *fresh)
{
    pthread_mutex_lock(&s->mu);
    idem_tls_ctx_t *old = s->cur;
    s->cur = fresh;
    pthread_mutex_unlock(&s->mu);
    idem__tls_ctx_unref(old);
}

void idem__tls_server_cleanup(idem_tls_server_t *s)
{
    if (!s->cur)
        return;
    idem__tls_ctx_unref(s->cur);
    s->cur = NULL;
    pthread_mutex_destroy(&s->mu);
    holder_free_copies(s);
}

/* ---- the session cache -------------------------------------------------- */

idem_tls_session_cache_t *idem__tls_session_cache_create(void)
{
    return idem_calloc(1, sizeof(idem_tls_session_cache_t));
}

void idem__tls_session_cache_clear(idem_tls_session_cache_t *c)
{
    if (c && c->sess) {
        SSL_SESSION_free(c->sess);
        c->sess = NULL;
    }
}

void idem__tls_session_cache_destroy(idem_tls_session_cache_t *c)
{
    if (!c)
        return;
    idem__tls_session_cache_clear(c);
    idem_free(c);
}

/* ---- sessions ----------------------------------------------------------- */

static idem_tls_t *session_new(idem_tls_ctx_t *ctx)
{
    idem_tls_t *t = idem_calloc(1, sizeof *t);
    if (!t)
        return NULL;
    ERR_clear_error();
    t->ssl = SSL_new(ctx->ssl);
    t->in = BIO_new(BIO_s_mem());
    t->out = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->in || !t->out) {
        SSL_free(t->ssl);
        BIO_free(t->in);
        BIO_free(t->out);
        idem_free(t);
        ERR_clear_error();
        return NULL;
    }
    BIO_set_mem_eof_return(t->in, -1);
    BIO_set_mem_eof_return(t->out, -1);
    SSL_set_bio(t->ssl, t->in, t->out); /* the SSL owns both now */
    SSL_set_app_data(t->ssl, t);
    t->ctx = idem__tls_ctx_ref(ctx);
    return t;
}

idem_tls_t *idem__tls_create_server(idem_tls_ctx_t *ctx)
{
    if (!ctx->server)
        return NULL;
    idem_tls_t *t = session_new(ctx);
    if (t)
        SSL_set_accept_state(t->ssl);
    return t;
}

idem_tls_t *idem__tls_create_client(idem_tls_ctx_t *ctx, const char *server_name,
                                    idem_tls_session_cache_t *cache)
{
    if (ctx->server || (ctx->verify && (!server_name || !*server_name)))
        return NULL;
    idem_tls_t *t = session_new(ctx);
    if (!t)
        return NULL;
    SSL_set_connect_state(t->ssl);
    t->cache = cache;
    ERR_clear_error();
    if (server_name && *server_name) {
        unsigned char addr[16];
        bool is_ip = inet_pton(AF_INET, server_name, addr) == 1 ||
                     inet_pton(AF_INET6, server_name, addr) == 1;
        bool ok = true;
        if (is_ip) {
            if (ctx->verify)
                ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), server_name) == 1;
        } else {
            ok = SSL_set_tlsext_host_name(t->ssl, server_name) == 1;
            if (ok && ctx->verify) {
                SSL_set_hostflags(t->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
                ok = SSL_set1_host(t->ssl, server_name) == 1;
            }
        }
        if (!ok) {
            ERR_clear_error();
            idem__tls_destroy(t);
            return NULL;
        }
    }
    if (cache && cache->sess && SSL_SESSION_is_resumable(cache->sess))
        SSL_set_session(t->ssl, cache->sess); /* takes its own reference */
    ERR_clear_error();
    return t;
}

void idem__tls_destroy(idem_tls_t *t)
{
    if (!t)
        return;
    /* OpenSSL marks the session of a connection freed without a shutdown
     * "not resumable", and with TLS 1.3 that session is the ticket the
     * cache holds.  A connection that did not fail (a pooled one closed
     * while idle) leaves its session good. */
    if (!t->err || t->err == IDEM_TLS_E_CLOSED)
        SSL_set_shutdown(t->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    SSL_free(t->ssl); /* and both BIOs */
    idem__tls_ctx_unref(t->ctx);
    idem_free(t);
}

/* Record a failure: its code and one line saying why (a then b). */
static int fail(idem_tls_t *t, int code, const char *a, const char *b)
{
    if (t->err)
        return t->err;
    t->err = code;
    snprintf(t->errstr, sizeof t->errstr, "%s%s", a, b);
    if (t->cache && code != IDEM_TLS_E_CLOSED)
        idem__tls_session_cache_clear(t->cache); /* maybe stale: start afresh next time */
    return code;
}

/* Turn the result r of an SSL call into a code (0 for "more input"). */
static int after(idem_tls_t *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        ERR_clear_error();
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        ERR_clear_error();
        return fail(t, IDEM_TLS_E_CLOSED, "closed by the peer", "");
    default:
        break;
    }
    unsigned long ec = ERR_peek_last_error();
    long vr = SSL_get_verify_result(t->ssl);
    if (ERR_GET_LIB(ec) == ERR_LIB_SSL && ERR_GET_REASON(ec) == SSL_R_CERTIFICATE_VERIFY_FAILED &&
        vr != X509_V_OK) {
        ERR_clear_error();
        return fail(t, IDEM_TLS_E_VERIFY, "certificate verify failed: ",
                    X509_verify_cert_error_string(vr));
    }
    if (ERR_GET_LIB(ec) == ERR_LIB_SSL &&
        ERR_GET_REASON(ec) == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
        ERR_clear_error();
        return fail(t, IDEM_TLS_E_VERIFY, "the peer sent no certificate", "");
    }
    if (ERR_GET_LIB(ec) == ERR_LIB_SSL && ERR_GET_REASON(ec) == ERR_R_MALLOC_FAILURE) {
        ERR_clear_error();
        return fail(t, IDEM_TLS_E_NOMEM, "out of memory", "");
    }
    const char *why = ossl_reason(e == SSL_ERROR_SYSCALL ? "unexpected end of stream" : "TLS error");
    return fail(t, IDEM_TLS_E_PROTOCOL, why, "");
}

int idem__tls_feed(idem_tls_t *t, const char *p, size_t n)
{
    if (t->err)
        return t->err;
    if (n == 0)
        return 0;
    size_t held = BIO_ctrl_pending(t->in);
    if (n > IDEM_TLS_MAX_HELD || held > IDEM_TLS_MAX_HELD - n)
        return fail(t, IDEM_TLS_E_TOOBIG, "the peer sent more than can be held", "");
    ERR_clear_error();
    int w = BIO_write(t->in, p, (int)n);
    if (w != (int)n) {
        ERR_clear_error();
        return fail(t, IDEM_TLS_E_NOMEM, "out of memory", "");
    }
    return 0;
}

static void on_handshake_done(idem_tls_t *t)
{
    t->done = true;
    const unsigned char *a = NULL;
    unsigned alen = 0;
    SSL_get0_alpn_selected(t->ssl, &a, &alen);
    if (a && alen < sizeof t->alpn) {
        memcpy(t->alpn, a, alen);
        t->alpn[alen] = '\0';
    }
}

int idem__tls_read(idem_tls_t *t, char *buf, size_t cap)
{
    if (t->err)
        return t->err;
    ERR_clear_error();
    if (!t->done) {
        int r = SSL_do_handshake(t->ssl);
        if (r != 1)
            return after(t, r);
        on_handshake_done(t);
    }
    if (cap == 0)
        return 0;
    ERR_clear_error();
    int r = SSL_read(t->ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
    if (r > 0)
        return r;
    return after(t, r);
}

int idem__tls_write(idem_tls_t *t, const char *p, size_t n)
{
    /* The peer's close_notify ends its half only: an answer may follow. */
    if (t->err && t->err != IDEM_TLS_E_CLOSED)
        return t->err;
    if (!t->done || t->shut)
        return IDEM_TLS_E_PROTOCOL;
    while (n > 0) {
        int chunk = n > (1u << 30) ? 1 << 30 : (int)n;
        ERR_clear_error();
        int r = SSL_write(t->ssl, p, chunk);
        if (r <= 0) {
            int code = after(t, r);
            return code ? code : fail(t, IDEM_TLS_E_NOMEM, "out of memory", "");
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

size_t idem__tls_pending(const idem_tls_t *t)
{
    return BIO_ctrl_pending(t->out);
}

size_t idem__tls_take(idem_tls_t *t, char *buf, size_t cap)
{
    size_t got = 0;
    while (got < cap) {
        size_t want = cap - got;
        int r = BIO_read(t->out, buf + got, want > INT_MAX ? INT_MAX : (int)want);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

bool idem__tls_handshake_done(const idem_tls_t *t)
{
    return t->done;
}

int idem__tls_shutdown(idem_tls_t *t)
{
    if (t->shut || !t->done)
        return 0;
    if (t->err && t->err != IDEM_TLS_E_CLOSED)
        return t->err;
    t->shut = true;
    ERR_clear_error();
    int r = SSL_shutdown(t->ssl);
    if (r < 0) {
        int code = after(t, r);
        return code == IDEM_TLS_E_CLOSED ? 0 : code;
    }
    return 0;
}

const char *idem__tls_errstr(const idem_tls_t *t)
{
    return t->errstr;
}

bool idem__tls_peer_cert_sha256_hex(const idem_tls_t *t, char out[65])
{
    out[0] = '\0';
    if (!t->done || !t->ctx->verify || SSL_get_verify_result(t->ssl) != X509_V_OK)
        return false;
    X509 *cert = SSL_get0_peer_certificate(t->ssl);
    if (!cert)
        return false;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (X509_digest(cert, EVP_sha256(), md, &len) != 1 || len != 32) {
        ERR_clear_error();
        return false;
    }
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < len; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
    return true;
}

const char *idem__tls_alpn(const idem_tls_t *t)
{
    return t->alpn[0] ? t->alpn : NULL;
}

bool idem__tls_session_reused(const idem_tls_t *t)
{
    return t->done && SSL_session_reused(t->ssl) == 1;
}

bool idem__tls_is_server(const idem_tls_t *t)
{
    return t->ctx->server;
}
