/* src/gateway/worker.h - a worker thread: its loop and what runs on it
 * (worker.c).
 *
 * Each worker runs one uv_loop_t with its public listener and the client
 * connections it accepted (conn.h), its requests (request.h), its upstream
 * client and pool (upstream.h), the results the store writer hands back
 * (its done list and done_async), and its access-log buffer.  main.c makes
 * gw->nworkers of them and stops them; request.c and tokens.c queue their
 * store work through idem__worker_submit.
 *
 * THREADING: the worker's loop thread, except the done list (the writer
 * thread fills it under done_mu) and idem__worker_request_stop (any thread).
 */
#ifndef IDEM_GATEWAY_WORKER_H
#define IDEM_GATEWAY_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/list.h"
#include "gateway/reconcile.h"
#include "gateway/upstream.h"
#include "gateway/writer.h"
#include "http/http.h"

/* Idle pooled upstream connections per worker; main.c fits RLIMIT_NOFILE to it. */
#define IDEM_UP_IDLE_MAX 512

struct idem_worker {
    idem_gw_t *gw;
    int index;
    uv_loop_t loop;
    idem_handler_t handler;   /* the proxy (request.c), which answers the listener's requests */
    idem_listener_t listener; /* the public listener and its client connections */
    idem_listener_t tls_listener; /* listen_tls's, when has_tls */
    bool has_tls;
    uv_async_t done_async;  /* the writer posted results */
    uv_async_t stop_async;  /* the main thread asks us to stop */
    uv_check_t log_check;   /* flushes the log buffer once per loop turn */
    uv_timer_t shutdown_timer;
    pthread_mutex_t done_mu;
    idem_link_t done;       /* idem_wjob_t, filled by the writer thread */
    idem_upstream_t up;     /* the upstream client: its pool of keep-alive connections */
    idem_reconcile_t recon; /* questions about held keys (on_unknown_outcome: reconcile) */
    idem_link_t reqs;       /* requests in progress */
    bool inline_store;      /* the store's commits are cheap: apply jobs on this loop */
    idem_link_t inline_q;   /* jobs waiting for this loop's next commit */
    uv_idle_t inline_idle;  /* keeps the loop from sleeping while inline_q has jobs */
    idem_buf_t log;         /* pending log lines */
    bool stopping;
    pthread_t thread;
    const idem_config_t *cfg; /* a reference to the latest live config seen */
    uint64_t cfg_gen;         /* gw->live_gen when cfg was taken */
};

/** Set up worker index to accept on listen_fd, and on tls_fd with TLS
 * (gw->tls_server) unless it is -1 (see idem__tcp_open_listener). */
int idem__worker_init(idem_worker_t *w, idem_gw_t *gw, int index, int listen_fd, int tls_fd,
                      char *err, size_t errlen);
void *idem__worker_main(void *arg);
/** Ask a worker to stop: close its listener, finish what is in flight. */
void idem__worker_request_stop(idem_worker_t *w);
void idem__worker_cleanup(idem_worker_t *w);
/** The configuration a request starting now on w gets: gw->live, taken
 * again when SIGHUP has published a new one (the old one is let go).  The
 * pointer stays valid until the next call on this loop; a request keeps
 * its own reference (idem__config_ref).  The worker's loop thread only. */
const idem_config_t *idem__worker_cfg(idem_worker_t *w);
/** Queue a job for the writer on behalf of req's worker. */
void idem__worker_submit(idem_worker_t *w, idem_wjob_t *job);

/** A stopping worker's loop ends once its last request and connection have. */
void idem__worker_maybe_exit(idem_worker_t *w);

#endif /* IDEM_GATEWAY_WORKER_H */
