/* src/gateway/handler.h - the one interface between a connection and the
 * requests it carries: a handler the listener carries, and an output stream
 * the connection supplies.
 *
 * The shape is h2o's (handler->on_req, h2o_start_response/h2o_send,
 * generator->proceed).  A listener is made with a handler: the proxy
 * (request.c, idem__proxy_handler_init) on the public listeners, the admin
 * endpoints (admin.c) on the admin listener.  A connection (conn.c: HTTP/1.1
 * over TCP or TLS; h2conn.c: each HTTP/2 stream) parses a request head and hands
 * it to handler->on_head with an idem_ostream_t of its own; it then feeds the
 * body (on_body, on_body_end, or on_body_error) and tells the request when
 * its client can take more (on_proceed) or has gone (on_gone).  The request
 * answers through the stream: start a response, send body pieces (told when
 * to send more), end it, or abort it.  Framing (Content-Length, chunked,
 * close-delimited) and keep-alive are the connection's decisions; the request
 * only says what its answer is and whether the connection must end after it
 * (IDEM_OS_CLOSE: a refusal whose body may still be on its way).
 *
 * WHO CALLS WHOM, AND WHO MAY FREE WHAT:
 *   - The connection calls the handler's callbacks only from the loop (its
 *     own read, write, timer and idle callbacks), never from inside one of
 *     the stream functions below.  A stream function that finds the client
 *     gone (a write that cannot be queued) marks the connection broken and
 *     says so later, from the loop, with on_gone.  So a request may go on
 *     using itself after any stream call.
 *   - From on_head's return (a request was taken) until the request ends its
 *     answer (send with final, or abort) or on_gone is called, whichever
 *     comes first, the connection may call the request and the request may
 *     use the stream.  After that neither touches the other: the request
 *     gives back whatever it held for the connection, and the connection
 *     forgets the request.  A request that answered its final byte is never
 *     told on_gone.
 *   - The connection owns the stream; the request never frees it.
 *
 * THREADING: the loop thread of the listener that accepted the connection.
 */
#ifndef IDEM_GATEWAY_HANDLER_H
#define IDEM_GATEWAY_HANDLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

typedef struct idem_ostream idem_ostream_t;
typedef struct idem_handler idem_handler_t;

/* Flags of idem_ostream_ops_t.start. */
#define IDEM_OS_CLOSE 1u /* the connection ends after this answer (a refusal) */

/** What a connection says about itself to a request: facts the request may
 * use (the scope source client_cert, the access log).  Valid while the
 * connection may call the request. */
typedef struct idem_conn_facts {
    const char *client_cert_sha256; /* lowercase hex of the verified client certificate, or NULL */
    bool tls;                       /* the request came over TLS */
    const char *proto;              /* the protocol that carried it: "HTTP/1.1" (1.0
                                     * too) or "HTTP/2", for the access log and the
                                     * metrics; a static string */
} idem_conn_facts_t;

typedef struct idem_ostream_ops {
    /** Begin the answer with the head r: status, reason, fields (none of them
     * framing fields), and how long the body is: r->framing
     * IDEM_HTTP_BODY_LENGTH with r->content_length, IDEM_HTTP_BODY_EOF when
     * the length is not known yet (the connection frames it: chunked, or a
     * body the connection's end delimits), IDEM_HTTP_BODY_NONE for none.  A
     * response to HEAD, or with a status that has no body, keeps its
     * Content-Length and sends no body whatever follows.
     * @param flags  IDEM_OS_CLOSE or 0.
     * @return 0, or -1 when the head cannot be written (a field the writer
     *         refuses, out of memory): nothing was, and the request may
     *         start another answer (a 500). */
    int (*start)(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags);
    /** Send p[0..n) of the body (copied); final: that was the last of it,
     * and the answer is complete.
     * @return true while the client takes what it is sent; false when the
     *         request should wait for on_proceed before sending more (a
     *         broken client also answers false, and on_gone follows). */
    bool (*send)(idem_ostream_t *os, const void *p, size_t n, bool final);
    /** The answer cannot be completed (its source broke): the client must
     * see it cut, never a short body that looks whole.  It ends the answer
     * as final does. */
    void (*abort)(idem_ostream_t *os);
} idem_ostream_ops_t;

/** A response stream: what the connection supplies for one request. */
struct idem_ostream {
    const idem_ostream_ops_t *ops;
};

/** A handler's request, opaque to the connection. */
typedef void idem_hreq_t;

/* Codes of on_body_error besides src/http's IDEM_HTTP_E_* body codes. */
#define IDEM_CONN_E_BODY_TIMEOUT (-1000) /* the body paused longer than body_timeout */

typedef struct idem_handler_ops {
    /** A request head was parsed: m and head[0..head_len) (the bytes m
     * points into) are valid during the call only.
     * @return the request, which the connection then feeds; NULL when it
     *         was answered on os at once (a refusal with IDEM_OS_CLOSE), or
     *         could not be (out of memory: nothing was written, and the
     *         connection closes). */
    idem_hreq_t *(*on_head)(idem_handler_t *h, const idem_http_msg_t *m, const char *head,
                            size_t head_len, idem_ostream_t *os, const idem_conn_facts_t *facts);
    /** The client waits for 100 Continue before its body: run the checks the
     * head alone decides.  @return true to invite the body; false when the
     * request was answered on os. */
    bool (*on_expect)(idem_hreq_t *r);
    /** A decoded piece of the body (p valid during the call).
     * @return true; false when the request refuses it (its body budget) and
     *         has answered on os. */
    bool (*on_body)(idem_hreq_t *r, const char *p, size_t n);
    /** The whole body is in (or there was none): the request runs. */
    void (*on_body_end)(idem_hreq_t *r);
    /** The body cannot be read: rc is an IDEM_HTTP_E_* code of the body
     * decoder or IDEM_CONN_E_BODY_TIMEOUT.  The request answers on os (with
     * IDEM_OS_CLOSE) and ends without reaching the store. */
    void (*on_body_error)(idem_hreq_t *r, int rc);
    /** The client took what it was sent: the request may send more. */
    void (*on_proceed)(idem_hreq_t *r);
    /** The client has gone: the request goes on without it (its store work
     * included) and never touches the stream again. */
    void (*on_gone)(idem_hreq_t *r);
    /** A request the connection refused by itself before any handler saw it
     * (a head that does not parse, header_timeout): for the counts, with
     * the facts of the connection that refused it.  May be NULL. */
    void (*on_refused)(idem_handler_t *h, int status, const idem_conn_facts_t *facts);
} idem_handler_ops_t;

/** A handler: its callbacks and what they need (the worker, the admin). */
struct idem_handler {
    const idem_handler_ops_t *ops;
    void *data;
    uint64_t body_max;      /* the largest request body (max_request_bytes) */
    bool request_outlives;  /* a request goes on after its client left, and takes the
                               connection's place in max_connections with it */
    const char *problem_link; /* the Link: rel="describedby" URL of the problems the
                               * connection answers by itself (problem.h); NULL: none */
};

/** Answer at once with a whole response: start, then send(final) of
 * body[0..n).  @return 0, or -1 when the head could not be written (nothing
 * was). */
int idem__ostream_respond(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags,
                          const void *body, size_t n);
/** Answer with idemd's own problem+json (problem.h).
 * @param retry_after  seconds for Retry-After, 0 for none.
 * @param link         the URL its Link: rel="describedby" names (the
 *                     handler's problem_link), or NULL for none.
 * @return 0, or -1 when it could not be written (out of memory). */
int idem__ostream_problem(idem_ostream_t *os, int status, const char *type, const char *detail,
                          int64_t retry_after, const char *link, unsigned flags);

#endif /* IDEM_GATEWAY_HANDLER_H */
