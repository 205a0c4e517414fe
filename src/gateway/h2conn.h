/* src/gateway/h2conn.h - HTTP/2 on a client connection (h2conn.c): one more
 * kind of connection under the request interface of handler.h.
 *
 * conn.c accepts every client connection and owns its socket, transport
 * (plain or TLS), timer and budgets.  When a public listener has http2 on
 * and a connection turns out to speak HTTP/2 (the client preface "PRI *
 * HTTP/2.0" as its first bytes on the plain listener; ALPN h2 on the TLS
 * one), conn.c makes an idem_h2conn_t and hands it every byte read; the
 * HTTP/2 connection writes through the same transport.  nghttp2 does the
 * framing, flow control and HPACK; h2conn.c turns each stream into a
 * request of the listener's handler, exactly as conn.c does an HTTP/1.1
 * request: an HTTP/1.1 head made from the stream's fields (so the handler
 * parses and sees what it always does), its DATA as on_body, END_STREAM as
 * on_body_end, a reset as on_gone.  The handler never learns which protocol
 * carried a request but through idem_conn_facts_t.proto.
 *
 * Calls go one way, as in conn.c: h2conn.c calls a request only from the
 * functions below that conn.c calls from the loop (read, run, destroy); a
 * stream function the request calls queues and asks conn.c to call
 * idem__h2conn_run from the loop (carrier schedule).
 *
 * THREADING: the loop thread of the connection's listener only.
 */
#ifndef IDEM_GATEWAY_H2CONN_H
#define IDEM_GATEWAY_H2CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/conn.h"
#include "gateway/handler.h"
#include "gateway/transport.h"

typedef struct idem_h2conn idem_h2conn_t;

/* The client preface an HTTP/2 connection opens with (RFC 9113 3.4). */
#define IDEM_H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define IDEM_H2_PREFACE_LEN 24

/* Past this many RST_STREAM frames from one client within a second, its
 * connection ends with GOAWAY ENHANCE_YOUR_CALM (rapid reset,
 * CVE-2023-44487). */
#define IDEM_H2_MAX_RESETS_PER_SEC 100
/* The most a header block may decode to (its fields' names and values,
 * 32 bytes each besides) before the connection ends with GOAWAY
 * ENHANCE_YOUR_CALM: an HPACK bomb costs bounded CPU and memory.  A block
 * past IDEM_HTTP_MAX_HEAD but under this is answered 431 on its stream. */
#define IDEM_H2_MAX_BLOCK (4 * IDEM_HTTP_MAX_HEAD)
/* CONTINUATION frames after one HEADERS at most (nghttp2's option). */
#define IDEM_H2_MAX_CONTINUATIONS 8

/* What the idem__h2conn_* functions that conn.c calls from the loop say of
 * the connection afterwards. */
#define IDEM_H2_GO_ON 0 /* it goes on */
#define IDEM_H2_END 1   /* it is over once what is queued is written: close then */
#define IDEM_H2_FAIL -1 /* close it now (a write could not be queued, out of memory) */

/** What the HTTP/2 connection asks of the connection that carries it
 * (conn.c). */
typedef struct idem_h2_carrier {
    /** Call idem__h2conn_run from the loop soon (never from inside this
     * call): a stream function queued something. */
    void (*schedule)(void *owner);
} idem_h2_carrier_t;

/** Start HTTP/2 on a connection of l whose bytes go through tr, its
 * SETTINGS queued (max_concurrent_streams, the header list bound); nothing
 * is written until idem__h2conn_run.  On a stopping listener, GOAWAY follows
 * at once.
 * @return the connection, or NULL when out of memory. */
idem_h2conn_t *idem__h2conn_create(idem_listener_t *l, idem_transport_t *tr,
                                   const idem_conn_facts_t *facts, const idem_h2_carrier_t *cr,
                                   void *owner);

/** Bytes from the client (the preface first), handed to nghttp2; streams
 * whose heads are whole go to the handler.  From the loop only.
 * @return IDEM_H2_GO_ON, IDEM_H2_END or IDEM_H2_FAIL. */
int idem__h2conn_read(idem_h2conn_t *h, const char *p, size_t n);

/** Write what nghttp2 has to send, as far as the transport's queue allows
 * (the listener's write_high), and tell the requests whose streams drained
 * on_proceed.  From the loop only: after a carrier schedule, and whenever
 * the transport wrote something.
 * @return IDEM_H2_GO_ON, IDEM_H2_END or IDEM_H2_FAIL. */
int idem__h2conn_run(idem_h2conn_t *h);

/** When the earliest time limit of its streams falls, in idem_clock_mono_ns
 * milliseconds (0: none): a header block not whole within header_timeout
 * of its HEADERS, a body that paused longer than body_timeout, an answer
 * whose client took none of it for body_timeout.  conn.c arms its one
 * timer for it while a stream is open, and calls idem__h2conn_expire then. */
int64_t idem__h2conn_deadline(const idem_h2conn_t *h);

/** The time limits that fell: a stalled body's request answers 408
 * request-timeout (its key never claimed) and its stream ends; a header
 * block not whole, or an answer not taken, ends the connection (GOAWAY
 * CANCEL, then close).  From the loop only.
 * @return IDEM_H2_GO_ON, IDEM_H2_END or IDEM_H2_FAIL. */
int idem__h2conn_expire(idem_h2conn_t *h);

/** The client sent its last byte (EOF): the connection ends once its open
 * streams are answered. */
void idem__h2conn_eof(idem_h2conn_t *h);

/** Stopping: GOAWAY with the last stream id taken; streams already started
 * finish, later ones are refused.  Then idem__h2conn_run answers
 * IDEM_H2_END once none is open. */
void idem__h2conn_shutdown(idem_h2conn_t *h);

/** Whether no stream is open (an idle connection, for idle_timeout). */
bool idem__h2conn_idle(const idem_h2conn_t *h);

/** Bytes answered to streams and not yet taken by nghttp2 (they count in
 * max_queued_bytes besides what the transport holds). */
size_t idem__h2conn_pending(const idem_h2conn_t *h);

/** The connection is closing: every request still attached is told on_gone
 * (and, when requests outlive their clients, takes a place in
 * max_connections as conn.c's own request does), and everything is freed.
 * From the loop only. */
void idem__h2conn_destroy(idem_h2conn_t *h);

#endif /* IDEM_GATEWAY_H2CONN_H */
