/* src/gateway/gateway.h - the shared types of idemd.
 *
 * idemd is one process with N worker threads, each running its own uv_loop_t
 * with its own dup() of the one listening socket, client connections and pool of
 * keep-alive upstream connections; one store writer thread that applies
 * every queued claim, completion, renewal and release in one transaction
 * (group commit) and posts results back to the worker that asked; and one
 * admin thread with its own loop for /healthz, /readyz, /metrics and /keys.
 *
 * A request lives in a req_t from the moment its head is parsed until its
 * outcome is stored and its response written (or its client has gone).  A
 * request outlives its client connection: a client that hangs up does not
 * stop the upstream call, and its result is still stored, so the repeat the
 * client sends next gets the answer.
 *
 * THREADING: everything in a worker is touched only by its loop thread,
 * except the done list (the writer thread pushes to it under its mutex) and
 * the metrics (atomics).  The config and the store handle are shared,
 * read-only and thread-safe respectively.
 */
#ifndef IDEM_GATEWAY_H
#define IDEM_GATEWAY_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "gateway/cache.h"
#include "gateway/config.h"
#include "gateway/list.h"
#include "gateway/outcome.h"
#include "gateway/ratelimit.h"
#include "gateway/rbuf.h"
#include "gateway/req_state.h"
#include "gateway/request_plan.h"
#include "gateway/upstream.h"
#include "http/http.h"
#include "idem/engine.h"
#include "idem/key.h"
#include "idem/record.h"
#include "idem/store.h"

typedef struct idem_gw idem_gw_t;
typedef struct idem_worker idem_worker_t;
typedef struct idem_conn idem_conn_t;
typedef struct idem_req idem_req_t;
typedef struct idem_wjob idem_wjob_t;

/* ---- metrics ------------------------------------------------------------ */

#define IDEM_HIST_BUCKETS 14

typedef struct idem_hist {
    _Atomic uint64_t buckets[IDEM_HIST_BUCKETS + 1]; /* last: +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
} idem_hist_t;

typedef struct idem_metrics {
    _Atomic uint64_t requests[IDEM_OUT__COUNT];
    _Atomic int64_t in_flight;        /* requests being processed now */
    _Atomic uint64_t store_batches;   /* writer transactions */
    _Atomic uint64_t store_ops;       /* operations in them */
    _Atomic uint64_t store_errors;
    _Atomic uint64_t store_gets;      /* idem_store_get calls (reads outside the writer) */
    _Atomic uint64_t cache_hits;      /* answers from local_cache */
    /* Resources clients hold (docs/protocol.md section 11): the gauges are
     * also the counters max_connections and max_buffered_bytes are checked on. */
    _Atomic uint64_t connections;     /* public connections, and requests that outlived theirs */
    _Atomic uint64_t conns_refused;   /* public connections closed at once: max_connections */
    _Atomic uint64_t admin_conns_refused; /* admin connections over IDEM_ADMIN_MAX_CONNS */
    _Atomic uint64_t buffered_bytes;  /* request body bytes charged, all workers */
    _Atomic uint64_t scope_fallback_authorization; /* a scope source absent: SHA-256 of Authorization */
    _Atomic uint64_t scope_fallback_anonymous;     /* ... and no Authorization: "anonymous" */
    _Atomic bool store_full;          /* the store refused a write for want of room, and
                                       * none as large has succeeded since (readyz) */
    _Atomic uint64_t store_full_bytes; /* the largest response payload it refused */
    idem_hist_t upstream_latency;
    idem_hist_t store_latency;        /* one writer transaction */
    idem_hist_t request_latency;
} idem_metrics_t;

void idem_metrics_count(idem_metrics_t *m, idem_outcome_t o);
void idem_hist_observe(idem_hist_t *h, uint64_t ns);
/** Render Prometheus text into out.  @return 0 or -1 (out full). */
int idem_metrics_render(idem_metrics_t *m, idem_buf_t *out);
const char *idem_outcome_name(idem_outcome_t o);

/* ---- the store writer ---------------------------------------------------- */

typedef void (*idem_wjob_cb)(idem_wjob_t *job);

/** One operation queued for the writer thread.  Owned by whoever queued it;
 * it must stay alive until its callback runs on the owner's loop thread. */
struct idem_wjob {
    idem_op_t op;
    idem_err_t batch_err;  /* the batch's own result (store down, full ...) */
    idem_wjob_cb cb;       /* runs on the worker's loop thread */
    void *data;
    idem_worker_t *worker; /* whose loop gets the result */
    idem_link_t link;
};

typedef struct idem_writer {
    idem_store_t *store;
    idem_metrics_t *metrics;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    idem_link_t queue;
    bool stopping;
    bool started;
} idem_writer_t;

#define IDEM_JOBS_BATCH_MAX 256

/* Descriptors besides client connections, for fitting RLIMIT_NOFILE (main.c). */
#define IDEM_ADMIN_MAX_CONNS 64 /* admin connections at once: a budget of its own */
#define IDEM_UP_IDLE_MAX 512    /* idle pooled upstream connections per worker */

/** Apply n jobs (n <= IDEM_JOBS_BATCH_MAX) in one store transaction: set
 * each job's op outputs and batch_err, count the batch in metrics.
 * @return the batch's error (IDEM_OK when it committed). */
idem_err_t idem_jobs_apply(idem_store_t *store, idem_metrics_t *metrics, idem_wjob_t **jobs,
                           size_t n);

/** Keep metrics->store_full up to date after a batch of ops that exec
 * answered err: set on IDEM_E_STORE_FULL (store_full_bytes: the largest
 * response payload it refused), cleared by a committed batch that added a
 * record at least that large (a claim that forwards, a completion, a token
 * issue). */
/** The response bytes (body and header names and values) an op writes. */
uint64_t idem_op_payload(const idem_op_t *op);
void idem_store_full_note(idem_metrics_t *metrics, idem_err_t err, const idem_op_t *ops,
                          size_t n);

int idem_writer_start(idem_writer_t *w, idem_store_t *store, idem_metrics_t *metrics);
/** Queue a job; its callback runs later on job->worker's loop. */
void idem_writer_submit(idem_writer_t *w, idem_wjob_t *job);
/** Apply what is queued, then stop the thread. */
void idem_writer_stop(idem_writer_t *w);

/* ---- listeners: the HTTP connections of one loop (conn.c) ---------------- */

typedef struct idem_admin idem_admin_t;

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

/* ---- the process ----------------------------------------------------- */

struct idem_gw {
    idem_config_t *cfg;
    idem_store_t *store;
    idem_cache_t *cache;                   /* local_cache; NULL when off */
    idem_ratelimit_t *ratelimit;           /* scope_rate_limit; NULL when off */
    idem_writer_t writer;
    idem_metrics_t metrics;
    struct sockaddr_storage upstream_addr; /* resolved once at start */
    char upstream_hostport[300];           /* for logs */
    int nworkers;
    idem_worker_t *workers;
    _Atomic bool stopping;
    bool log_json;
};

struct idem_worker {
    idem_gw_t *gw;
    int index;
    uv_loop_t loop;
    idem_listener_t listener; /* the public listener and its client connections */
    uv_async_t done_async;  /* the writer posted results */
    uv_async_t stop_async;  /* the main thread asks us to stop */
    uv_check_t log_check;   /* flushes the log buffer once per loop turn */
    uv_timer_t shutdown_timer;
    pthread_mutex_t done_mu;
    idem_link_t done;       /* idem_wjob_t, filled by the writer thread */
    idem_upstream_t up;     /* the upstream client: its pool of keep-alive connections */
    idem_link_t reqs;       /* requests in progress */
    bool inline_store;      /* the store's commits are cheap: apply jobs on this loop */
    idem_link_t inline_q;   /* jobs waiting for this loop's next commit */
    uv_idle_t inline_idle;  /* keeps the loop from sleeping while inline_q has jobs */
    idem_buf_t log;         /* pending log lines */
    bool stopping;
    pthread_t thread;
};

/* request.c */
/** idem_store_get, counted in the metrics (every read of the store outside
 * the writer goes through here, so a test can see that a cached replay made
 * none). */
idem_err_t idem_gw_store_get(idem_gw_t *gw, const idem_key_id_t *id, int64_t now_ms,
                             idem_record_t *rec);
#define IDEM_LISTEN_BACKLOG 1024  /* public listener */
#define IDEM_ADMIN_BACKLOG 128    /* admin listener */

/** Bind and listen on host:port (an IPv4 or IPv6 literal), without
 * SO_REUSEPORT: an address another process listens on fails (EADDRINUSE).
 * @param what  the flag named in a failure ("--listen").
 * @return the listening socket (close-on-exec, owned by the caller), or -1
 *         with err set ("--listen: cannot listen on H:P: address already in use"). */
int idem_listen_socket(const char *host, int port, int backlog, const char *what, char *err,
                       size_t errlen);
/** Watch a dup() of the listening socket listen_fd with tcp on loop; the
 * caller keeps listen_fd (and may close it: the dup keeps the socket open).
 * Several loops may each open the same listening socket: each connection is
 * accepted by one of them.
 * @return 0, or -1 with err set; tcp may then be initialised and must be closed. */
int idem_tcp_open_listener(uv_loop_t *loop, uv_tcp_t *tcp, void *data, int listen_fd, int backlog,
                           uv_connection_cb cb, const char *what, char *err, size_t errlen);
/** Set up worker index to accept on listen_fd (see idem_tcp_open_listener). */
int idem_worker_init(idem_worker_t *w, idem_gw_t *gw, int index, int listen_fd, char *err,
                     size_t errlen);
void *idem_worker_main(void *arg);
/** Ask a worker to stop: close its listener, finish what is in flight. */
void idem_worker_request_stop(idem_worker_t *w);
void idem_worker_cleanup(idem_worker_t *w);
/** Queue a job for the writer on behalf of req's worker. */
void idem_worker_submit(idem_worker_t *w, idem_wjob_t *job);

/* admin.c */
/** Start the admin thread, accepting on a dup() of the listening socket
 * listen_fd (idem_listen_socket; the caller keeps listen_fd). */
int idem_admin_start(idem_gw_t *gw, int listen_fd, idem_admin_t **out, char *err, size_t errlen);
void idem_admin_stop(idem_admin_t *a);

/* log.c */
void idem_log(idem_gw_t *gw, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** One access-log line for a finished request into the worker's buffer. */
void idem_log_request(idem_worker_t *w, const idem_req_t *req);
void idem_log_flush(idem_worker_t *w);

/* problem.c */
/** Append a whole problem+json response answering `to` to out (the head
 * alone for HEAD), all or nothing.
 * @param retry_after  seconds for a Retry-After header, or 0 for none.
 * @return 0, or -1 (out of memory, out's cap) with out unchanged. */
int idem_problem_respond(idem_buf_t *out, int status, const char *type, const char *detail,
                         int64_t retry_after, idem_http_reply_t to);
const char *idem_problem_title(const char *type);
/** The JSON body of a problem; free() it.  NULL when out of memory. */
char *idem_problem_body(int status, const char *type, const char *detail);

/* ---- a request ---------------------------------------------------------- */

struct idem_req {
    idem_worker_t *w;
    idem_conn_t *conn;            /* NULL once answered, or once the client has gone */
    idem_link_t link;             /* in w->reqs */
    idem_req_life_t life;         /* its state, and what holds it (req_state.h) */
    char *head;                   /* a copy of the request head; msg points into it */
    idem_http_msg_t msg;
    /* The normalised origin-form target (docs/protocol.md section 5), in head's
     * allocation: what routes match, the fingerprint hashes and the
     * upstream is sent.  msg.target stays as received (for the log). */
    const char *target;
    size_t target_len;
    size_t path_len;              /* target[0..path_len) is the path */
    idem_slice_t authority;       /* an absolute-form target's authority (into head), else empty */
    idem_buf_t body;              /* the decoded request body */
    const idem_route_t *route;    /* NULL: no route (off) */
    const idem_policy_t *policy;  /* route's or defaults */
    bool keyed;                   /* goes through the store */
    bool bypassed;                /* store down, forwarded anyway (on_store_error: open) */
    bool token_spent;             /* a token route's request spent its token (id names it) */
    idem_gw_kind_t kind;          /* what the head's checks decided (idem_gw_classify) */
    char token[IDEM_TOKEN_LEN + 1]; /* a token route's token, as those checks parsed it */
    uint64_t body_charge;         /* bytes of max_buffered_bytes this request holds */
    bool holds_slot;              /* outlived its connection: counts in max_connections */
    idem_key_id_t id;
    uint8_t fp[IDEM_FP_LEN];
    uint64_t fence;
    uint64_t t_start_ns;
    int64_t wait_deadline_ms;     /* on_conflict: wait */
    idem_outcome_t outcome;
    int status;                   /* what the client was answered */
    uv_timer_t timer;             /* renewal, waiting for a repeat's owner, completion retries */
    bool timer_made;              /* timer initialised (on first use: most requests need none) */
    uv_work_t fp_work;            /* a large body's fingerprint, in libuv's thread pool */
    int fp_rc;                    /* what req_fingerprint returned there */
    idem_wjob_t job;              /* claim/complete/release/hold/token */
    idem_wjob_t renew_job;        /* in flight while the life holds IDEM_HOLD_RENEW */
    int64_t lease_until_ms;       /* our lease ends (claim, then each renewal) */
    int complete_tries;           /* completions refused by a failing store so far */
    /* upstream */
    idem_upstream_req_t up;       /* the upstream call; up.resp is the response head */
    idem_up_result_t up_result;   /* why the upstream call failed */
    uint64_t t_up_ns;
    idem_buf_t resp_body;         /* captured (bounded) body */
    uint64_t capture_limit;
    bool streaming;               /* body over the capture limit: relayed as it comes */
    bool stream_chunked;          /* the client gets chunked coding */
    bool stream_close;            /* the client gets close-delimited body */
    idem_header_t *store_headers; /* response headers kept for replay */
    size_t n_store_headers;
    idem_response_t store_resp;   /* what COMPLETE stores; points into resp_head/resp_body */
};

/** The request as the loop-free steps read it (request_plan.h): valid while
 * req lives and its head and body do not change. */
static inline idem_gw_request_t idem_req_view(const idem_req_t *req)
{
    return (idem_gw_request_t){
        .msg = &req->msg,
        .target = req->target,
        .target_len = req->target_len,
        .path_len = req->path_len,
        .authority = req->authority,
        .body = (const uint8_t *)req->body.data,
        .body_len = req->body.len,
    };
}

/* conn.c: writing to a client. */
/** Queue bytes (copied) on the request's client; no-op if the client left. */
void idem_conn_write(idem_conn_t *c, const void *p, size_t n);
size_t idem_conn_queue_size(idem_conn_t *c);

#endif /* IDEM_GATEWAY_H */
