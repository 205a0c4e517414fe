/* src/gateway/upstream.h - the upstream client: HTTP/1.1 calls to one
 * upstream address over a pool of keep-alive connections.
 *
 * The client knows nothing of idemd's requests: request.c is one caller,
 * tests/unit/test_upstream.c another.  A caller owns an idem_upstream_t per
 * loop (the pool) and an idem_upstream_req_t per call (the shape of libuv's
 * requests): the call sends a head and a body, and tells what came back
 * through four callbacks (the shape of h2o's httpclient):
 *
 *   on_head     the final response head is in ur->resp (1xx are skipped)
 *   on_body     a piece of the body, as it comes; may pause the call
 *   on_done     the whole response came: the call has ended
 *   on_failure  it did not, and why: the call has ended
 *
 * Exactly one of on_done and on_failure ends a call that is not cancelled,
 * and no callback ever runs inside the function that started or resumed the
 * work: a failure found there (out of memory, a connect refused at once, a
 * head the caller could not build) is reported from the loop, by the
 * client's own idle handle, on a later turn.
 *
 * The outcomes (docs/protocol.md section 7): nothing was sent (connect
 * failed); sent, and the connection broke, or no whole response came within
 * the timeout, or the answer was not HTTP (a 101 included: the client never
 * asks for a protocol switch).  A call that broke or timed out after it was
 * sent is an unknown outcome even on a reused connection: the upstream may
 * have acted on it, so the client never sends it again by itself.
 *
 * "Sent" means: at least one byte of the request was taken by the kernel.
 * The request is written at once (uv_try_write), so the client knows when
 * none was.  A connection fails with nothing sent when the write is refused
 * before its first byte (EPIPE, ECONNRESET: the upstream had closed it), or
 * when the upstream speaks or closes before that byte left (a peek at the
 * socket right before the write, and any read while the whole request still
 * waits in libuv's queue).  Then:
 *   - a pooled connection is closed and the call goes on a new connection,
 *     once, without telling the caller (nginx's proxy_next_upstream for
 *     "nothing sent"); the timeout starts again with the connect;
 *   - a new connection's call fails with IDEM_UP_CONNECT_FAILED.
 * A pooled connection found talking or closed by the peek is not even
 * tried: the next one, or a new one, is taken.  Once a byte has left, a
 * break is IDEM_UP_BROKEN, whatever it was (a write error after a partial
 * write included): the client cannot know how much the upstream read.
 *
 * The timeout bounds the whole response from the send (or the connect) on.
 * A call the caller paused (idem__upstream_req_pause) runs no timeout until
 * it is resumed; from the first resume on, the call is relaying and the
 * timeout bounds each silence between pieces instead (of the upstream, or
 * of a caller too slow to take what it sent).  An on_body that answers
 * IDEM_UP_BODY_PAUSE stops the reading but not the clock.
 *
 * TLS (idem__upstream_set_tls, SPEC section 16): a client given a TLS
 * context speaks TLS on every connection, through src/gateway/transport.h;
 * plain connections stay on the socket as above.  The handshake runs after
 * the connect and before the request is written, under the same timeout
 * (from the connect on); a handshake that fails or a certificate that does
 * not verify means nothing was sent: IDEM_UP_CONNECT_FAILED, with the
 * reason in ur->reason (idem__upstream_req_reason).  Each client keeps the
 * last session the upstream gave it, so a new connection resumes it; a
 * pooled connection needs no new handshake at all.  Over TLS, "sent" is
 * counted from the moment the request is handed to the transport after the
 * handshake (the transport writes it at once): a break after that is
 * IDEM_UP_BROKEN even when the kernel may have taken nothing, which holds a
 * key that could have been released, never the other way round.  One
 * exception: on a new connection that has heard nothing, an alert by which
 * a server refuses a handshake (our client certificate missing or refused:
 * with TLS 1.3 the server says so after the client is done and has sent)
 * is IDEM_UP_CONNECT_FAILED too, as the server's application never saw
 * the request.  Only the alert says so: if the upstream's reset (its close
 * with our request unread) overtakes the alert, the call is IDEM_UP_BROKEN,
 * the safe side.  Session
 * tickets an upstream sends after the handshake are read and consumed by
 * the TLS engine, idle or not; plaintext or an end (close_notify or FIN) on
 * an idle connection closes it, as on a plain one.  A close-delimited body
 * over TLS ends only at close_notify: a bare FIN there may be a truncation,
 * and is IDEM_UP_BROKEN.  The request body is encrypted into the
 * transport's buffers, so over TLS it is copied once.
 *
 * INVARIANTS: a connection serves one call at a time and goes back to the
 * pool only after a whole response with keep-alive whose end is not in
 * doubt (not close-delimited; not a 204, 304 or answer to HEAD that
 * carries Transfer-Encoding or a Content-Length other than 0; not an
 * answer to HEAD with neither; no interim 1xx with either), no byte beyond
 * it, and the request wholly written; a request is written only on a
 * connection with no unread byte and no end in its socket; at most
 * idle_max connections wait in the pool, each for at most
 * IDEM_UPSTREAM_IDLE_MS.
 * THREADING: one loop thread per idem_upstream_t, and its calls.
 */
#ifndef IDEM_GATEWAY_UPSTREAM_H
#define IDEM_GATEWAY_UPSTREAM_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "gateway/list.h"
#include "core/tls.h"
#include "http/http.h"

/* A pooled connection idle this long is closed by us first: upstreams close
 * idle keep-alive connections too (Node.js after 5 s), and a request sent
 * on one they are closing is an unknown outcome. */
#define IDEM_UPSTREAM_IDLE_MS 4000

typedef enum {
    IDEM_UP_OK = 0,
    IDEM_UP_CONNECT_FAILED, /* nothing was sent */
    IDEM_UP_BROKEN,         /* sent, the connection broke before a whole response */
    IDEM_UP_TIMEOUT,        /* sent, no whole response before the timeout */
    IDEM_UP_BAD_RESPONSE,   /* sent, the answer was not valid HTTP */
} idem_up_result_t;

/** What on_body asks of the call after a piece. */
typedef enum {
    IDEM_UP_BODY_MORE,   /* go on reading */
    IDEM_UP_BODY_PAUSE,  /* stop reading until idem__upstream_req_resume */
    IDEM_UP_BODY_REFUSE, /* the piece could not be taken: the call fails (IDEM_UP_BROKEN) */
} idem_up_body_t;

typedef struct idem_upstream idem_upstream_t;
typedef struct idem_upstream_req idem_upstream_req_t;
typedef struct idem_upconn idem_upconn_t;

typedef struct idem_upstream_cbs {
    /** The final response head is in ur->resp.  May be NULL. */
    void (*on_head)(idem_upstream_req_t *ur);
    /** A piece of the decoded body (p valid until it returns). */
    idem_up_body_t (*on_body)(idem_upstream_req_t *ur, const char *p, size_t n);
    /** The whole response came; the call has ended (ur may be freed). */
    void (*on_done)(idem_upstream_req_t *ur);
    /** No whole response; the call has ended (ur may be freed). */
    void (*on_failure)(idem_upstream_req_t *ur, idem_up_result_t why);
} idem_upstream_cbs_t;

/** One call, owned by the caller.  Zero it before its start; it must stay
 * where it is until the call has ended (a callback said so, or
 * idem__upstream_req_cancel), and then be cleaned up. */
struct idem_upstream_req {
    void *data; /* the caller's */
    /* Out: the final response head, from on_head until
     * idem__upstream_req_cleanup; resp's slices point into resp_head. */
    idem_http_msg_t resp;
    char *resp_head;
    /* The client's own. */
    idem_upstream_t *client;
    const idem_upstream_cbs_t *cbs;
    idem_upconn_t *conn;       /* while the call has a connection */
    idem_slice_t method;       /* the request's (a HEAD response has no body) */
    const char *body;          /* the request body, the caller's, sent as it is */
    size_t body_len;
    idem_link_t defer_link;    /* in client->deferred while a step waits for the loop */
    bool deferred;             /* defer_link is in that list */
    bool defer_fail;           /* the step that waits: a failure (else reading on) */
    idem_up_result_t defer_why;
    bool active;               /* started, and neither ended nor cancelled */
    bool relaying;             /* resumed once: the timeout bounds each silence */
    /* Out, over TLS: whether the call's connection resumed a session (a new
     * connection that resumed, or a pooled one whose handshake had). */
    bool tls_resumed;
    /* Out: why the call failed, one line, when the client knows more than
     * the result (a TLS handshake refused, a certificate that did not
     * verify, a TLS stream that failed); "" otherwise.  Set on failure. */
    char reason[200];
};

/** The client of one loop: the upstream's address, the timeout, the pool. */
struct idem_upstream {
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    uint64_t timeout_ms;
    size_t idle_max;
    idem_link_t idle;       /* idle connections, the most recently used last */
    size_t n_idle;
    idem_link_t deferred;   /* calls whose next step waits for the loop */
    uv_idle_t defer_idle;   /* runs those steps; active only while there are some */
    bool stopping;          /* pool nothing more */
    bool closed;
    /* TLS (idem__upstream_set_tls); tls_ctx NULL: plain. */
    idem_tls_ctx_t *tls_ctx;            /* referenced */
    char *tls_server_name;              /* SNI and the name verified; NULL only without verify */
    idem_tls_session_cache_t *tls_cache; /* the session new connections resume; may be NULL */
    size_t n_conns;                     /* connections not yet freed (the cache outlives them) */
};

/** Set up a client on loop for the upstream at addr (copied).
 * @param timeout_ms  bounds a call (see the file comment).
 * @param idle_max    idle connections kept at most. */
void idem__upstream_init(idem_upstream_t *c, uv_loop_t *loop, const struct sockaddr *addr,
                         uint64_t timeout_ms, size_t idle_max);
/** Close the idle connections and pool no more (calls running go on). */
void idem__upstream_stop(idem_upstream_t *c);
/** Speak TLS to the upstream on every connection made from now on (call it
 * right after idem__upstream_init, before any call).
 * @param ctx          a client context (idem__tls_client_ctx_create);
 *                     the client takes a reference of its own.
 * @param server_name  sent as SNI and verified against the certificate
 *                     (copied); NULL only when ctx does not verify.
 * @return 0, or -1 when out of memory (the client stays plain). */
int idem__upstream_set_tls(idem_upstream_t *c, idem_tls_ctx_t *ctx, const char *server_name);
/** Stop, and close the client's own handle: once no call runs, nothing of
 * the client keeps the loop alive.  No call may start afterwards. */
void idem__upstream_close(idem_upstream_t *c);
/** Close every idle connection. */
void idem__upstream_close_idle(idem_upstream_t *c);
/** How many connections wait in the pool. */
size_t idem__upstream_idle_count(const idem_upstream_t *c);

/** Start a call: send head, then body, over a pooled connection (the most
 * recently used that is quiet) or a new one; the request is written here
 * when the connection is pooled.  Its callbacks run later on the loop,
 * never inside this function.
 * @param ur    zeroed, or cleaned up after an earlier call; ur->data is kept.
 * @param cbs   must outlive the call.
 * @param head  the request head, taken (left empty); NULL when the caller
 *              could not build one: the call then fails with
 *              IDEM_UP_CONNECT_FAILED, as nothing was sent.
 * @param body  sent as it is, not copied: valid until the call has ended.
 * @param method the request's method (a response to HEAD has no body);
 *              valid until the call has ended. */
void idem__upstream_req_start(idem_upstream_t *c, idem_upstream_req_t *ur,
                              const idem_upstream_cbs_t *cbs, idem_buf_t *head, const char *body,
                              size_t body_len, idem_slice_t method);
/** Stop reading, and the timeout, until idem__upstream_req_resume (the
 * caller holds the response, waiting for something of its own).  May be
 * called from on_body. */
void idem__upstream_req_pause(idem_upstream_req_t *ur);
/** Read on after a pause (either kind), relaying from now on: what is
 * buffered is delivered on a later loop turn, never inside this call.  A
 * call that is not paused is left as it is. */
void idem__upstream_req_resume(idem_upstream_req_t *ur);
/** End the call now, without a callback: its connection is closed (what was
 * sent may have been acted on).  May be called from any callback, and on a
 * call that has ended (nothing happens). */
void idem__upstream_req_cancel(idem_upstream_req_t *ur);
/** Whether the call has started and not yet ended. */
static inline bool idem__upstream_req_active(const idem_upstream_req_t *ur) { return ur->active; }
/** Why the call failed, one line, or "" (see ur->reason). */
static inline const char *idem__upstream_req_reason(const idem_upstream_req_t *ur)
{
    return ur->reason;
}
/** Free what the call holds (its response head).  Not while it is active. */
void idem__upstream_req_cleanup(idem_upstream_req_t *ur);

#endif /* IDEM_GATEWAY_UPSTREAM_H */
