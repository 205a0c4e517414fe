/* src/gateway/transport.h - a byte stream over a connected TCP handle,
 * plain or TLS, for one loop thread.
 *
 * The owner (a client connection of the listener, a pooled upstream
 * connection) sees plaintext only, through five callbacks, and writes
 * plaintext; under a TLS transport, the session of src/core/tls.h sits
 * between the owner and the socket and the transport moves the ciphertext.
 *
 *   on_ready    the stream may be used as a peer's: for TLS, the handshake
 *               is done (the peer's certificate, ALPN and resumption are
 *               known through idem__transport_tls); for plain, on the first
 *               loop turn after init.  Always before any on_read or on_eof.
 *   on_read     plaintext from the peer (p valid until it returns)
 *   on_eof      the peer has finished sending (a TCP FIN, or TLS close_notify;
 *               idem__transport_eof_clean says which for TLS); no on_read after
 *   on_error    the stream failed: a read or write error, a TLS failure
 *               (a handshake refused, a certificate that did not verify, an
 *               EOF during the handshake), out of memory.  Reason: one line,
 *               valid until it returns.  No on_read, on_eof or on_written after
 *   on_written  n bytes of the owner's plaintext have been handed to the
 *               kernel (for the owner's backpressure counts)
 *
 * ORDERING: no callback ever runs inside a function of this file that the
 * owner called: what such a function finds (an error, data held while
 * reading was stopped) is reported from the loop, by the transport's own
 * idle handle, on a later turn.  Callbacks run from libuv's read and write
 * callbacks and from that idle handle.  The owner may call any function of
 * this file, idem__transport_close included, from inside any callback; after
 * idem__transport_close no callback runs but close_cb.
 *
 * Reading: nothing is read from the socket until idem__transport_read_start,
 * and nothing after idem__transport_read_stop, the TLS handshake included
 * (it progresses only while reading is started; the first flight of a client
 * goes out anyway).  On read_stop inside on_read, the rest of what was
 * already read is held (at most one socket read, 64 KiB, as ciphertext) and
 * delivered after read_start.
 *
 * Time: the transport has no timer.  The owner bounds the handshake as it
 * bounds a request head (header_timeout): a peer that stops mid-handshake
 * holds the connection until the owner closes it.
 *
 * Writing: idem__transport_write copies.  For TLS, what is written before the
 * handshake is done is held and sent once it is.  idem__transport_queued
 * counts every byte held for writing and not yet handed to the kernel,
 * bookkeeping included: the owner caps its memory with it.
 *
 * THREADING: the loop's thread only.
 */
#ifndef IDEM_GATEWAY_TRANSPORT_H
#define IDEM_GATEWAY_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "core/tls.h"

typedef struct idem_transport idem_transport_t;

typedef struct idem_transport_cbs {
    void (*on_ready)(void *data);                           /* may be NULL */
    void (*on_read)(void *data, const char *p, size_t n);   /* required */
    void (*on_eof)(void *data);                             /* required */
    void (*on_error)(void *data, const char *reason);       /* required */
    void (*on_written)(void *data, size_t n);               /* may be NULL */
} idem_transport_cbs_t;

typedef void (*idem_transport_close_cb)(idem_transport_t *t);

/* Caller-allocated (embed it in the connection); the fields are the
 * transport's own. */
struct idem_transport {
    uv_loop_t *loop;
    uv_tcp_t *tcp;   /* the owner's handle; its data points here while in use */
    idem_tls_t *tls; /* NULL for plain */
    const idem_transport_cbs_t *cbs;
    void *data;       /* the callbacks' argument */
    uv_idle_t defer;  /* runs what must not run on the owner's stack */
    uv_shutdown_t shutdown_req;
    idem_transport_close_cb close_cb;
    struct idem_transport_held *held, **held_tail; /* TLS: plaintext written before the handshake */
    size_t queued;    /* bytes held for writing, overhead included */
    size_t plain_acc; /* TLS: plaintext encrypted since the last flush */
    int open_handles; /* handles not yet closed, while closing */
    bool reading;     /* the owner wants to read */
    bool sock_reading; /* uv_read_start is in effect */
    bool ready;       /* on_ready ran (or was owed and is now done) */
    bool eof;         /* on_eof ran, or is owed */
    bool eof_clean;
    bool failed;      /* on_error ran or is owed */
    bool error_sent;
    bool shutdown_wanted, shutdown_sent;
    bool closing;
    char reason[200]; /* why it failed */
};

/** Start a plain transport over tcp (connected or accepted, not reading).
 * tcp->data is the transport's from now until close.
 * @return 0 (the only outcome). */
int idem__transport_init_plain(idem_transport_t *t, uv_loop_t *loop, uv_tcp_t *tcp,
                               const idem_transport_cbs_t *cbs, void *data);

/** Start a TLS transport over tcp with the session tls (from
 * idem__tls_create_server or _create_client, fresh), which it takes and
 * destroys at close.  A client's first flight is sent from the loop.
 * @return 0 (the only outcome). */
int idem__transport_init_tls(idem_transport_t *t, uv_loop_t *loop, uv_tcp_t *tcp, idem_tls_t *tls,
                             const idem_transport_cbs_t *cbs, void *data);

/** Read from the socket (again); data held while stopped is delivered from
 * the loop first.  Nothing after on_eof or on_error. */
void idem__transport_read_start(idem_transport_t *t);
/** Stop reading from the socket, now (also from inside on_read). */
void idem__transport_read_stop(idem_transport_t *t);

/** Send the n buffers (copied).
 * @return 0, or -1: out of memory (nothing of it is queued), or the
 *         transport has failed, is shut down or closing. */
int idem__transport_write(idem_transport_t *t, const uv_buf_t *bufs, unsigned n);

/** Bytes held for writing and not yet handed to the kernel, overhead
 * included (plaintext held before the handshake, ciphertext in flight). */
size_t idem__transport_queued(const idem_transport_t *t);

/** End our side: for TLS, close_notify (after the handshake: if it is not
 * done yet, once it is), then a FIN once everything queued is written.
 * Writes are refused after it; reading goes on. */
void idem__transport_shutdown(idem_transport_t *t);

/** Close the TCP handle (and the transport's own): close_cb(t) runs from
 * the loop once both are closed, after which the owner may free the memory
 * of t and of the tcp handle.  Safe from inside any callback; no other
 * callback runs after it.  Twice is a no-op. */
void idem__transport_close(idem_transport_t *t, idem_transport_close_cb close_cb);

/** The TLS session (peer certificate, ALPN, resumption), or NULL for plain.
 * Valid until close_cb. */
idem_tls_t *idem__transport_tls(idem_transport_t *t);

/** After on_eof: true when the peer ended cleanly (plain: always; TLS: it
 * sent close_notify, rather than a bare FIN that could be a truncation). */
bool idem__transport_eof_clean(const idem_transport_t *t);

#endif /* IDEM_GATEWAY_TRANSPORT_H */
