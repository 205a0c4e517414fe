/* src/gateway/conn.h - what the rest of idemd asks of an HTTP connection,
 * and what conn.c asks of the admin endpoints.
 *
 * conn.c owns struct idem_conn: reading, parsing and writing to a client,
 * for both kinds of listener (idem_listener_t, gateway.h).  On the public
 * listener request.c answers through idem_conn_write (gateway.h) and hands
 * the connection back with idem__conn_response_done once an answer is
 * wholly queued; worker.c accepts with idem__conn_on_connection and closes
 * connections when it stops.  On the admin listener conn.c asks admin.c for
 * an idem_answer_t (idem__admin_answer) and writes it itself; admin.c sets
 * the listener up and closes its connections when it stops.  Nothing
 * outside conn.c looks inside a connection.
 *
 * THREADING: the loop thread of the connection's listener only.
 */
#ifndef IDEM_GATEWAY_CONN_H
#define IDEM_GATEWAY_CONN_H

#include "gateway/gateway.h"

/* A streamed response pauses its upstream when the client lags this much;
 * the upstream reads again once the client's queue is under half of it. */
#define IDEM_STREAM_HIGH_MARK (1u << 20)

/** Set up l, of kind, for connections on loop, and the parsing of their
 * pipelined requests from the loop (l->parse_q, l->parse_idle, which the
 * loop's owner closes).  Its tcp is the caller's to open, with l as its
 * data.  The caller sets l->w or l->admin. */
void idem__listener_init(idem_listener_t *l, idem_listen_kind_t kind, idem_gw_t *gw,
                         uv_loop_t *loop);
/** The listener's connection callback (server->data is its idem_listener_t):
 * accept one client within the listener's budget (max_connections, or
 * IDEM_ADMIN_MAX_CONNS for the admin). */
void idem__conn_on_connection(uv_stream_t *server, int status);
/** Close c at once; a request it carries goes on without it. */
void idem__conn_close(idem_conn_t *c);
/** The response of c's request is wholly queued: detach the request, then
 * read the next one (keep_alive) or close once the answer is out.  c may be
 * NULL or closed. */
void idem__conn_response_done(idem_conn_t *c, bool keep_alive);
/** Whether c is still reading its request's body (an answer now ends c). */
bool idem__conn_reading_body(const idem_conn_t *c);
/** A response cut short: detach c's request, close c once what is queued is
 * written (the client sees the cut, not a short body). */
void idem__conn_close_when_written(idem_conn_t *c);
/** Stopping: close every connection of l that carries no request (after
 * what is queued on it is written). */
void idem__conns_close_idle(idem_listener_t *l);
/** The shutdown deadline: close every connection of l now. */
void idem__conns_close_all(idem_listener_t *l);

/* ---- admin.c: the admin endpoints, as conn.c calls them ------------------ */

/** An answer made at once, without the store or the upstream: what an admin
 * endpoint says.  conn.c writes it with idem_http_write_response. */
typedef struct idem_answer {
    int status;               /* 0: none could be made (out of memory): the connection closes */
    const char *content_type; /* NULL: no Content-Type (204); a static string */
    idem_buf_t body;          /* owned by the answer (idem__answer_cleanup) */
    bool close;               /* the request was refused at its head: the connection ends */
} idem_answer_t;

void idem__answer_init(idem_answer_t *a);
void idem__answer_cleanup(idem_answer_t *a);

/** Answer one whole admin request m (a body it had was read and dropped):
 * the Host checks, then the endpoint its target names.  Runs on the admin
 * thread; it may read the store. */
void idem__admin_answer(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *out);

#endif /* IDEM_GATEWAY_CONN_H */
