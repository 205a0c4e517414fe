/* src/gateway/conn.h - what the rest of idemd asks of an HTTP connection,
 * and what conn.c asks of the admin endpoints.
 *
 * conn.c owns struct idem_conn: reading, parsing and writing to a client,
 * for both kinds of listener (idem_listener_t, below).  On the public
 * listener request.c answers through idem__conn_write and hands
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

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "gateway/list.h"
#include "http/http.h"

typedef struct idem_gw idem_gw_t;
typedef struct idem_worker idem_worker_t;
typedef struct idem_conn idem_conn_t;
typedef struct idem_admin idem_admin_t;

/* ---- listeners: the HTTP connections of one loop -------------------------- */

/** What a listener serves.  Its connections run the same code (conn.c:
 * accept, budget, read, parse, timers, limits, write queue, drain, close);
 * the kind says who answers a request and the few limits that differ. */
typedef enum {
    IDEM_LISTEN_PUBLIC = 0, /* idemd's clients: a request goes to request.c */
    IDEM_LISTEN_ADMIN = 1,  /* the admin endpoints: answered at once by admin.c */
} idem_listen_kind_t;

/** One listening socket watched on one loop, and the connections it
 * accepted there: a worker's public listener, or the admin listener on the
 * admin thread. */
typedef struct idem_listener {
    idem_listen_kind_t kind;
    idem_gw_t *gw;
    uv_loop_t *loop;
    uv_tcp_t tcp;         /* watches a dup() of the listening socket */
    idem_link_t conns;    /* open connections */
    idem_link_t parse_q;  /* connections with pipelined input to parse */
    uv_idle_t parse_idle; /* runs parse_q from the loop, never on an answer's stack */
    int n_conns;          /* ADMIN: open connections, at most IDEM_ADMIN_MAX_CONNS (the public
                             budget, max_connections, is metrics.connections, all workers) */
    bool stopping;        /* the loop is stopping: no connection is kept alive */
    idem_worker_t *w;     /* PUBLIC: the worker whose requests these are */
    idem_admin_t *admin;  /* ADMIN: whose endpoints answer */
} idem_listener_t;

/* The admin's budget, apart from max_connections; main.c fits RLIMIT_NOFILE to it. */
#define IDEM_ADMIN_MAX_CONNS 64  /* admin connections at once */
#define IDEM_LISTEN_BACKLOG 1024 /* public listener */
#define IDEM_ADMIN_BACKLOG 128   /* admin listener */

/** Bind and listen on host:port (an IPv4 or IPv6 literal), without
 * SO_REUSEPORT: an address another process listens on fails (EADDRINUSE).
 * @param what  the flag named in a failure ("--listen").
 * @return the listening socket (close-on-exec, owned by the caller), or -1
 *         with err set ("--listen: cannot listen on H:P: address already in use"). */
int idem__listen_socket(const char *host, int port, int backlog, const char *what, char *err,
                        size_t errlen);
/** Watch a dup() of the listening socket listen_fd with tcp on loop; the
 * caller keeps listen_fd (and may close it: the dup keeps the socket open).
 * Several loops may each open the same listening socket: each connection is
 * accepted by one of them.
 * @return 0, or -1 with err set; tcp may then be initialised and must be closed. */
int idem__tcp_open_listener(uv_loop_t *loop, uv_tcp_t *tcp, void *data, int listen_fd,
                            int backlog, uv_connection_cb cb, const char *what, char *err,
                            size_t errlen);

/* ---- connections ------------------------------------------------------------ */

/** Queue bytes (copied) on the request's client; no-op if the client left. */
void idem__conn_write(idem_conn_t *c, const void *p, size_t n);
size_t idem__conn_queue_size(idem_conn_t *c);

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
 * endpoint says.  conn.c writes it with idem__http_write_response. */
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
