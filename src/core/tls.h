/* src/core/tls.h - TLS sessions over memory, for the listener and the
 * upstream client (SPEC section 16).
 *
 * This file knows no socket and no loop.  A session (idem_tls_t) is an
 * OpenSSL engine between two memory buffers: the caller feeds it the
 * ciphertext it read from the peer (idem__tls_feed), asks it for plaintext
 * (idem__tls_read, which also drives the handshake), gives it plaintext to
 * send (idem__tls_write), and takes the ciphertext it produced
 * (idem__tls_pending, idem__tls_take) to write to the peer itself.  After
 * every feed, read, write and shutdown, the caller takes what is pending:
 * the handshake answers, alerts and tickets come out that way too.
 * src/gateway/transport.c is the caller that puts a session under a
 * libuv stream.
 *
 * A context (idem_tls_ctx_t) holds the certificates and the rules: TLS 1.2
 * minimum, no renegotiation, no compression; a server context offers the
 * ALPN protocols of its options (http/1.1 by default), and asks for and
 * verifies client certificates when given client_ca_file.  Contexts are
 * reference counted: a session holds one, so a listener can swap its
 * context (idem_tls_server_t, on SIGHUP) while open sessions keep theirs.
 *
 * A session never buffers more than IDEM_TLS_MAX_HELD bytes of ciphertext
 * that it has not consumed (idem__tls_feed refuses more), and OpenSSL
 * bounds a handshake message itself, so a peer that sends garbage or stops
 * mid-handshake costs a bounded amount of memory.
 *
 * Error messages are one line, with no newline: for a file, the option
 * name, the path and OpenSSL's reason ("listen_tls.cert_file: /x.pem: No
 * such file or directory"); for a session, a reason a log line can carry
 * ("certificate verify failed: certificate has expired").
 *
 * THREADING: a context may be shared by any number of threads (its
 * reference count is atomic); a session and a session cache belong to one
 * thread at a time.  idem_tls_server_t's functions may be called from any
 * thread.
 */
#ifndef IDEM_CORE_TLS_H
#define IDEM_CORE_TLS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* The most ciphertext a session holds unconsumed: a few TLS records (at
 * most 16 KiB + 2 KiB + 5 each) and a socket read of 64 KiB, with room. */
#define IDEM_TLS_MAX_HELD (256 * 1024)

/* What idem__tls_read (and the other operations) return when negative.
 * Once a session has failed, every later operation returns the same code. */
typedef enum {
    IDEM_TLS_E_CLOSED = -1,   /* the peer sent close_notify: a clean end */
    IDEM_TLS_E_PROTOCOL = -2, /* not TLS, a version or cipher refused, an alert */
    IDEM_TLS_E_VERIFY = -3,   /* the peer's certificate did not verify, or was missing */
    IDEM_TLS_E_NOMEM = -4,    /* out of memory */
    IDEM_TLS_E_TOOBIG = -5,   /* idem__tls_feed: more than IDEM_TLS_MAX_HELD held */
} idem_tls_err_t;

typedef struct idem_tls_ctx idem_tls_ctx_t;
typedef struct idem_tls idem_tls_t;
typedef struct idem_tls_session_cache idem_tls_session_cache_t;

/* ---- contexts ----------------------------------------------------------- */

typedef struct idem_tls_server_opts {
    /* Messages name the options as "<name>.cert_file"; NULL: "listen_tls". */
    const char *name;
    const char *cert_file; /* PEM: the certificate, then its chain */
    const char *key_file;  /* PEM, unencrypted: the certificate's private key */
    /* PEM: the CAs that sign client certificates.  When set, every client
     * must present a certificate that verifies against them; NULL: no
     * client certificate is asked for. */
    const char *client_ca_file;
    /* The ALPN protocols accepted, most preferred first, NULL-terminated;
     * NULL means { "http/1.1", NULL }.  A client that offers ALPN with none
     * of them is refused (no_application_protocol); a client that offers
     * none is served. */
    const char *const *alpn;
} idem_tls_server_opts_t;

typedef struct idem_tls_client_opts {
    /* Messages name the options as "<name>.ca_file"; NULL: "upstream_tls". */
    const char *name;
    const char *ca_file;   /* PEM: the CAs trusted; NULL: the system's trust store */
    const char *cert_file; /* client certificate (mutual TLS), with key_file; or NULL */
    const char *key_file;
    /* true only when the configuration says `verify: false`: the server's
     * certificate and name are then not checked.  A zeroed struct verifies. */
    bool no_verify;
    /* The ALPN protocols offered, NULL-terminated; NULL: { "http/1.1", NULL }. */
    const char *const *alpn;
} idem_tls_client_opts_t;

/** Make a server context from the files of o (read now, not retained).
 * @param[out] out  the context with one reference, or NULL on failure.
 * @param[out] err  on failure, one line naming the option, the file and the
 *                  reason (errlen bytes at most, NUL-terminated).
 * @return 0, or -1 (a file missing or unreadable, not PEM, a key that does
 *         not match the certificate, out of memory). */
int idem__tls_server_ctx_create(const idem_tls_server_opts_t *o, idem_tls_ctx_t **out, char *err,
                                size_t errlen);

/** Make a client context (for an upstream) from o; as above. */
int idem__tls_client_ctx_create(const idem_tls_client_opts_t *o, idem_tls_ctx_t **out, char *err,
                                size_t errlen);

/** One more reference to ctx (returned, for chaining).  Any thread. */
idem_tls_ctx_t *idem__tls_ctx_ref(idem_tls_ctx_t *ctx);
/** Drop a reference; the last one frees the context.  NULL is a no-op. */
void idem__tls_ctx_unref(idem_tls_ctx_t *ctx);

/* ---- the listener's context, reloadable --------------------------------- */

/* Caller-allocated; the fields are the holder's own. */
typedef struct idem_tls_server {
    pthread_mutex_t mu;  /* guards cur */
    idem_tls_ctx_t *cur; /* the context new connections get */
    /* Copies of the options given to init, read again by reload. */
    char *name, *cert_file, *key_file, *client_ca_file;
    char **alpn; /* NULL-terminated copy, or NULL */
} idem_tls_server_t;

/** Load the files of o and hold the context.  o is copied.
 * @return 0, or -1 with err (then s needs no cleanup). */
int idem__tls_server_init(idem_tls_server_t *s, const idem_tls_server_opts_t *o, char *err,
                          size_t errlen);
/** The context for a new connection: a reference the caller unrefs (or hands
 * to idem__tls_create_server and then unrefs).  Never NULL after a
 * successful init.  Any thread. */
idem_tls_ctx_t *idem__tls_server_current(idem_tls_server_t *s);
/** Read the files again (SIGHUP).  On success new connections get the new
 * context; open sessions keep the old one until they end.  On failure the
 * running context is kept, and err says why.  Any thread.
 * @return 0, or -1 with err. */
int idem__tls_server_reload(idem_tls_server_t *s, char *err, size_t errlen);
/** Give new connections fresh (its reference is taken over) instead of the
 * running context, as reload does, for a context made from other files
 * (SIGHUP with a changed listen_tls).  Open sessions keep theirs.  Any
 * thread. */
void idem__tls_server_swap(idem_tls_server_t *s, idem_tls_ctx_t *fresh);
/** Drop the holder's reference and its copies.  Sessions may outlive it. */
void idem__tls_server_cleanup(idem_tls_server_t *s);

/* ---- client session resumption ------------------------------------------ */

/** The last good session with one upstream, to resume on the next
 * connection: one per upstream client per loop thread.  Sessions created
 * with a cache save into it every session (TLS 1.2) or ticket (TLS 1.3,
 * which arrive after the handshake, while reading) the server gives them;
 * a session that fails clears it.  The cache must outlive every session
 * created with it.  NULL when out of memory. */
idem_tls_session_cache_t *idem__tls_session_cache_create(void);
void idem__tls_session_cache_destroy(idem_tls_session_cache_t *c); /* NULL: no-op */
/** Forget the saved session (the upstream's configuration changed). */
void idem__tls_session_cache_clear(idem_tls_session_cache_t *c);

/* ---- sessions ----------------------------------------------------------- */

/** A server session under ctx (which it references: the caller keeps its
 * own reference).  NULL when out of memory or ctx is a client context. */
idem_tls_t *idem__tls_create_server(idem_tls_ctx_t *ctx);

/** A client session under ctx.
 * @param server_name  the upstream's name, sent as SNI and checked against
 *                     its certificate; an IP address (v4 or v6) is checked
 *                     against the certificate's IP addresses and sent as no
 *                     SNI.  Copied.  NULL only with no_verify (no SNI).
 * @param cache        resume from and save into it; may be NULL.
 * @return the session, or NULL (out of memory, a server context, or no
 *         server_name while verifying). */
idem_tls_t *idem__tls_create_client(idem_tls_ctx_t *ctx, const char *server_name,
                                    idem_tls_session_cache_t *cache);
void idem__tls_destroy(idem_tls_t *t); /* NULL: no-op */

/** Give the session n bytes of ciphertext read from the peer (copied).
 * @return 0, or IDEM_TLS_E_TOOBIG when it would hold more than
 *         IDEM_TLS_MAX_HELD unconsumed bytes (nothing is taken; the session
 *         has failed), IDEM_TLS_E_NOMEM, or the session's earlier error. */
int idem__tls_feed(idem_tls_t *t, const char *p, size_t n);

/** Progress the handshake, then read plaintext into buf.
 * @return the bytes read (> 0); 0 when it needs more input (the handshake
 *         may have just completed: see idem__tls_handshake_done); or a
 *         negative idem_tls_err_t (IDEM_TLS_E_CLOSED for close_notify).  In
 *         every case, ciphertext may be pending. */
int idem__tls_read(idem_tls_t *t, char *buf, size_t cap);

/** Encrypt n bytes of plaintext; the handshake must be done.  Allowed after
 * the peer's close_notify (IDEM_TLS_E_CLOSED): that ends its half only.
 * @return 0 (all of it is now pending ciphertext), or a negative
 *         idem_tls_err_t (IDEM_TLS_E_PROTOCOL before the handshake is done
 *         or after a shutdown). */
int idem__tls_write(idem_tls_t *t, const char *p, size_t n);

/** Ciphertext waiting to be sent, in bytes. */
size_t idem__tls_pending(const idem_tls_t *t);
/** Move up to cap bytes of pending ciphertext into buf; the count moved. */
size_t idem__tls_take(idem_tls_t *t, char *buf, size_t cap);

bool idem__tls_handshake_done(const idem_tls_t *t);

/** Send close_notify (pending after it); nothing before the handshake is
 * done, nothing the second time.  Writes are refused after it.
 * @return 0, or a negative idem_tls_err_t. */
int idem__tls_shutdown(idem_tls_t *t);

/** Why the session failed, one line; "" while it has not.  Valid until the
 * session is destroyed. */
const char *idem__tls_errstr(const idem_tls_t *t);

/** The lowercase hex SHA-256 of the DER of the peer's verified certificate
 * into out (64 digits and a NUL).  false, and out "", when there is none:
 * the handshake is not done, the peer sent none, or it was not verified
 * (a client context with no_verify). */
bool idem__tls_peer_cert_sha256_hex(const idem_tls_t *t, char out[65]);

/** The ALPN protocol agreed ("http/1.1"), or NULL when none was. */
const char *idem__tls_alpn(const idem_tls_t *t);

/** true when the handshake resumed an earlier session. */
bool idem__tls_session_reused(const idem_tls_t *t);

/** true for a session made by idem__tls_create_server. */
bool idem__tls_is_server(const idem_tls_t *t);

#endif /* IDEM_CORE_TLS_H */
