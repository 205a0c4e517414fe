/* src/gateway/conn.h - listeners and their HTTP/1.1 connections (conn.c).
 *
 * A listener is one listening socket watched on one loop, with the handler
 * (handler.h) that answers the requests of its connections: the proxy on a
 * worker's public listener, the admin endpoints on the admin thread's.
 * conn.c owns struct idem_conn: accepting within the listener's budget,
 * reading, parsing, timers, 100-continue, writing, draining and closing.  It
 * hands each request to the listener's handler and supplies the output
 * stream the request answers through; it knows nothing of what the handler
 * does (it never names request.c or admin.c).  worker.c and admin.c make
 * their listeners with idem__listener_init and close their connections when
 * they stop.  Nothing outside conn.c looks inside a connection.
 *
 * THREADING: the loop thread of the connection's listener only, except the
 * budgets shared by every loop (max_connections, max_queued_bytes,
 * max_connections_per_address: atomics or a locked table).
 */
#ifndef IDEM_GATEWAY_CONN_H
#define IDEM_GATEWAY_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gateway/handler.h"
#include "gateway/list.h"
#include "core/tls.h"
#include "http/http.h"

typedef struct idem_gw idem_gw_t;
typedef struct idem_conn idem_conn_t;
typedef struct idem_listener idem_listener_t;

/** What differs between listeners besides the handler: their budgets. */
typedef struct idem_listen_limits {
    /* 0: the process-wide max_connections (metrics.connections, every
     * public listener of every worker together); else this listener's own
     * count, at most this many. */
    int max_conns;
    size_t write_high;       /* answers queued to a client past this: its requests wait */
    int64_t close_linger_ms; /* a closing answer not taken by then is cut; 0: none */
    bool reuse_idle;         /* at the budget, close the longest-idle connection for a new one */
    bool count_queued;       /* queued answers count in max_queued_bytes */
    bool per_address;        /* max_connections_per_address applies */
    bool http2;              /* HTTP/2 too: with prior knowledge (plain), ALPN h2 (TLS) */
} idem_listen_limits_t;

/** One listening socket watched on one loop, and the connections it
 * accepted there. */
struct idem_listener {
    idem_gw_t *gw;
    uv_loop_t *loop;
    idem_handler_t *handler;   /* answers its requests; the maker's */
    idem_tls_server_t *tls;    /* a TLS listener's certificate (reloadable); NULL: plain */
    idem_listen_limits_t limits;
    uv_tcp_t tcp;              /* watches a dup() of the listening socket */
    idem_link_t conns;         /* open connections, the most recently active last */
    idem_link_t parse_q;       /* connections with pipelined input to parse */
    idem_link_t gone_q;        /* broken connections to close from the loop */
    uv_idle_t parse_idle;      /* runs parse_q and gone_q from the loop */
    int n_conns;               /* open connections (a listener with its own max_conns) */
    bool stopping;             /* the loop is stopping: no connection is kept alive */
    int64_t tls_log_ms;        /* when a refused handshake was last logged (monotonic ms) */
    uint64_t tls_unlogged;     /* refused handshakes since, not logged */
    /* Called once a connection's handles are closed and it is freed: a
     * stopping loop may end now.  May be NULL. */
    void (*on_conn_freed)(idem_listener_t *l);
    /* Writes one line of the process's log (conn.c knows no log of its
     * own).  May be NULL: nothing is logged. */
    void (*log)(idem_listener_t *l, const char *level, const char *line);
    void *data;                /* the maker's (the worker, the admin) */
};

/* The admin's budget, apart from max_connections; main.c fits RLIMIT_NOFILE to it. */
#define IDEM_ADMIN_MAX_CONNS 64  /* admin connections at once */
#define IDEM_LISTEN_BACKLOG 1024 /* public listener */
#define IDEM_ADMIN_BACKLOG 128   /* admin listener */

/* A streamed answer waits (send answers false) when its client lags this
 * much; on_proceed comes once the client's queue is under half of it. */
#define IDEM_STREAM_HIGH_MARK (1u << 20)
/* Answers queued to one client that does not read them past this: its
 * next request waits (the public listeners' write_high). */
#define IDEM_CONN_WRITE_HIGH (4u << 20)

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

/** Set up l for connections on loop, answered by handler, within limits.
 * Its tcp is the caller's to open (idem__tcp_open_listener with l as its
 * data and idem__conn_on_connection); its tcp and parse_idle are the
 * caller's to close (idem__listener_close_handles). */
void idem__listener_init(idem_listener_t *l, idem_gw_t *gw, uv_loop_t *loop,
                         idem_handler_t *handler, const idem_listen_limits_t *limits);
/** Close l's own handles (its tcp, its idle); its connections stay. */
void idem__listener_close_handles(idem_listener_t *l);
/** The listener's connection callback (server->data is its idem_listener_t):
 * accept one client within the listener's budget. */
void idem__conn_on_connection(uv_stream_t *server, int status);
/** Stopping: close every connection of l that carries no request (after
 * what is queued on it is written), but not one whose request head is
 * awaited (new, or partly read): that one is answered, then closed. */
void idem__conns_close_idle(idem_listener_t *l);
/** The shutdown deadline: close every connection of l now (their requests
 * are told on_gone). */
void idem__conns_close_all(idem_listener_t *l);

#endif /* IDEM_GATEWAY_CONN_H */
