/* src/gateway/conn.h - what the rest of a worker asks of a client connection.
 *
 * conn.c owns struct idem_conn: reading, parsing and writing to a client.
 * request.c answers through idem_conn_write (gateway.h) and hands the
 * connection back with idem__conn_response_done once an answer is wholly
 * queued; worker.c accepts with idem__conn_on_connection and closes
 * connections when it stops.  Nothing outside conn.c looks inside a
 * connection.
 *
 * THREADING: the worker's loop thread only.
 */
#ifndef IDEM_GATEWAY_CONN_H
#define IDEM_GATEWAY_CONN_H

#include "gateway/gateway.h"

/* A streamed response pauses its upstream when the client lags this much;
 * the upstream reads again once the client's queue is under half of it. */
#define IDEM_STREAM_HIGH_MARK (1u << 20)

/** The listener's connection callback: accept one client (max_connections). */
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
/** Stopping: close every connection of w that carries no request (after
 * what is queued on it is written). */
void idem__conns_close_idle(idem_worker_t *w);
/** The shutdown deadline: close every connection of w now. */
void idem__conns_close_all(idem_worker_t *w);

#endif /* IDEM_GATEWAY_CONN_H */
