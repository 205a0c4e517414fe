/* examples/ledger/server.h - a small blocking HTTP/1.1 server for the ledger.
 *
 * One thread per connection, at most max_conns of them (a connection past
 * the cap is answered 503 and closed).  Requests are read with libidem's
 * incremental, strict parser (src/http/http.h): keep-alive and pipelining,
 * Content-Length bodies only (chunked is refused with 411), a 16 KiB head
 * and a body limit, an idle timeout.  The handler gets a whole request and
 * writes one response with srv_write; the server sends it and goes on with
 * the next request of the connection.
 *
 * THREADING: the handler runs on many connection threads at once.
 * srv_run returns after srv_stop (async-signal-safe) was called and every
 * connection has finished the request it was serving.
 */
#ifndef LEDGER_SERVER_H
#define LEDGER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http.h"
#include "idem/record.h"

#define SRV_HEAD_MAX IDEM_HTTP_MAX_HEAD
#define SRV_BODY_MAX (64 * 1024)        /* request body bytes; more is 413 */
#define SRV_OUT_MAX (1024 * 1024)       /* one response, head included */
#define SRV_IDLE_TIMEOUT_S 30           /* a silent connection is closed after this */
#define SRV_MAX_CONNS_LIMIT 4096

typedef struct srv_request {
    const idem_http_msg_t *msg; /* the head; slices valid during the handler */
    idem_slice_t path;          /* target without the query */
    idem_slice_t query;         /* after '?', empty when none */
    const char *body;           /* body bytes (not NUL-terminated) */
    size_t body_len;
} srv_request_t;

typedef struct srv_response {
    idem_buf_t *out;   /* where the response goes */
    bool close;        /* the connection closes after it ("Connection: close") */
    bool head_only;    /* a HEAD request: the body is left out (its length is not) */
    bool written;      /* srv_write succeeded */
} srv_response_t;

typedef void (*srv_handler_fn)(void *ctx, const srv_request_t *req, srv_response_t *resp);

/** Write a whole response (status line, headers, Content-Length, body).
 * headers may not include Content-Length or Connection.
 * @return 0, or -1 when it does not fit (the server then answers 500). */
int srv_write(srv_response_t *resp, int status, const idem_header_t *headers, size_t n_headers,
              const void *body, size_t body_len);

/** Write an RFC 9457 problem: type is the part after "urn:idem:problem:".
 * retry_after > 0 adds Retry-After. */
int srv_problem(srv_response_t *resp, int status, const char *type, const char *title,
                const char *detail, long retry_after);

typedef struct srv_config {
    const char *listen;   /* HOST:PORT; HOST an IPv4 address, [IPv6] or localhost */
    int max_conns;        /* 1..SRV_MAX_CONNS_LIMIT */
    srv_handler_fn handler;
    void *ctx;
    /* called every tick_ms from the accepting thread (maintenance), or NULL */
    void (*tick)(void *ctx);
    int tick_ms;
} srv_config_t;

/** Bind the listener (so that "cannot listen" is reported before anything
 * else starts).  @return 0; -2 when cfg->listen is not HOST:PORT, -1 when
 * it cannot be bound; err says which. */
int srv_listen(const srv_config_t *cfg, char *err, size_t errlen);

/** Accept and serve until srv_stop; then stop accepting, let every
 * connection finish the request it is serving (at most 30 s) and return 0. */
int srv_run(const srv_config_t *cfg);

/** Ask srv_run to return; safe in a signal handler. */
void srv_stop(void);

#endif /* LEDGER_SERVER_H */
