/* src/gateway/worker.c - a worker thread: its loop, its store jobs, its
 * start and stop.
 *
 * idemd runs N workers (worker.h), each a thread with its own uv_loop_t,
 * listener, client connections (conn.c), requests (request.c) and upstream
 * client (upstream.c).  A request's store work is a job: it goes to the one
 * writer thread (writer.c), which applies it in a group commit and hands it
 * back on the worker's done list, or, when the store's commits are cheap
 * (idem_store_exec_is_cheap), is applied on this loop once per loop turn in
 * a batch of its own.  Either way its callback runs on this loop, never
 * inside the call that queued it.
 *
 * Each request starts with the worker's latest view of the live
 * configuration (idem__worker_cfg), which SIGHUP may have replaced; it
 * keeps that one to its end.
 *
 * Once per loop turn (the log check) the worker applies its inline jobs
 * and flushes its log lines.  A request is freed by whatever lets go of it
 * last (request.c); a connection's pipelined requests are parsed from the
 * loop (its listener's parse_idle, conn.c).  Stopping closes the listener
 * and the idle connections at once, lets the busy ones finish, and after
 * upstream_timeout + 5 s closes what is left.
 *
 * THREADING: the worker's loop thread, except the done list, which the
 * writer thread fills under done_mu, and idem__worker_request_stop, which any
 * thread may call.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/request.h"
#include "gateway/worker.h"

/* ---- the configuration ------------------------------------------------------ */

const idem_config_t *idem__worker_cfg(idem_worker_t *w)
{
    idem_gw_t *gw = w->gw;
    if (atomic_load_explicit(&gw->live_gen, memory_order_acquire) == w->cfg_gen)
        return w->cfg;
    pthread_mutex_lock(&gw->live_mu);
    const idem_config_t *now = idem__config_ref(gw->live);
    w->cfg_gen = atomic_load_explicit(&gw->live_gen, memory_order_relaxed);
    pthread_mutex_unlock(&gw->live_mu);
    idem__config_unref(w->cfg);
    w->cfg = now;
    return now;
}

/* ---- the writer round trip ------------------------------------------------ */

static void on_inline_idle(uv_idle_t *h);

void idem__worker_submit(idem_worker_t *w, idem_wjob_t *job)
{
    job->worker = w;
    if (w->inline_store) {
        /* Applied at the end of this loop turn (log_check), or at the start
         * of the next (inline_idle) when queued outside the I/O phase. */
        idem_list_push(&w->inline_q, &job->link);
        uv_idle_start(&w->inline_idle, on_inline_idle);
        return;
    }
    idem__writer_submit(&w->gw->writer, job);
}


/* A job is back: a request's, or one with no request behind it
 * (reconcile.c). */
static void job_done(idem_wjob_t *job)
{
    if (job->plain)
        job->cb(job);
    else
        idem__req_job_done(job);
}

/* Apply this loop's queued jobs, a batch per transaction.  Callbacks may
 * queue more (a release after a failed connect); a few rounds take those
 * too, the idle handle the rest. */
static void run_inline(idem_worker_t *w)
{
    for (int round = 0; round < 4 && !idem_list_empty(&w->inline_q); round++) {
        idem_wjob_t *jobs[IDEM_JOBS_BATCH_MAX];
        size_t n = 0;
        while (!idem_list_empty(&w->inline_q) && n < IDEM_JOBS_BATCH_MAX) {
            idem_link_t *l = w->inline_q.next;
            idem_list_remove(l);
            jobs[n++] = IDEM_CONTAINER(l, idem_wjob_t, link);
        }
        idem__writer_jobs_apply(w->gw->store, &w->gw->metrics, jobs, n);
        for (size_t i = 0; i < n; i++)
            job_done(jobs[i]);
    }
    if (idem_list_empty(&w->inline_q))
        uv_idle_stop(&w->inline_idle);
}

static void on_inline_idle(uv_idle_t *h)
{
    run_inline(h->data);
}

static void on_done_async(uv_async_t *a)
{
    idem_worker_t *w = a->data;
    idem_link_t done;
    idem_list_init(&done);
    pthread_mutex_lock(&w->done_mu);
    if (!idem_list_empty(&w->done)) {
        done.next = w->done.next;
        done.prev = w->done.prev;
        done.next->prev = &done;
        done.prev->next = &done;
        idem_list_init(&w->done);
    }
    pthread_mutex_unlock(&w->done_mu);
    while (!idem_list_empty(&done)) {
        idem_link_t *l = done.next;
        idem_list_remove(l);
        job_done(IDEM_CONTAINER(l, idem_wjob_t, link));
    }
}

/* ---- the worker ------------------------------------------------------------ */

static void on_log_check(uv_check_t *h)
{
    idem_worker_t *w = h->data;
    if (w->inline_store)
        run_inline(w);
    if (w->log.len)
        idem__log_flush(w);
    if (w->stopping)
        idem__worker_maybe_exit(w);
}

static void close_if_open(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void idem__worker_maybe_exit(idem_worker_t *w)
{
    if (!w->stopping || !idem_list_empty(&w->reqs) || !idem_list_empty(&w->listener.conns) ||
        (w->has_tls && !idem_list_empty(&w->tls_listener.conns)))
        return;
    idem__upstream_close(&w->up);
    close_if_open((uv_handle_t *)&w->done_async);
    close_if_open((uv_handle_t *)&w->stop_async);
    close_if_open((uv_handle_t *)&w->shutdown_timer);
    close_if_open((uv_handle_t *)&w->inline_idle);
    idem__listener_close_handles(&w->listener);
    if (w->has_tls)
        idem__listener_close_handles(&w->tls_listener);
    /* log_check is unreferenced: it flushes until the loop ends. */
}

/* A line the connections of a listener log. */
static void on_listener_log(idem_listener_t *l, const char *level, const char *line)
{
    idem__log(l->gw, level, "%s", line);
}

/* A connection of the listener is gone: a stopping loop may end now. */
static void on_listener_conn_freed(idem_listener_t *l) { idem__worker_maybe_exit(l->data); }

static void on_shutdown_timer(uv_timer_t *t)
{
    /* In-flight work took too long: close every client and end every
     * upstream call (a key whose call is cut keeps its lease, which runs
     * out by itself) and every request's timer.  What the store still owes
     * a request comes back from the writer, which stops only after the
     * workers: each request then ends, logged and freed, as any other. */
    idem_worker_t *w = t->data;
    size_t n = 0;
    for (idem_link_t *l = w->reqs.next; l != &w->reqs; l = l->next)
        n++;
    idem__log(w->gw, "warn",
              "worker %d: shutdown deadline reached with %zu requests in flight: closing "
              "connections, ending upstream calls",
              w->index, n);
    idem__conns_close_all(&w->listener);
    if (w->has_tls)
        idem__conns_close_all(&w->tls_listener);
    idem_link_t *l = w->reqs.next;
    while (l != &w->reqs) {
        idem_req_t *req = IDEM_CONTAINER(l, idem_req_t, link);
        l = l->next;
        idem__req_shutdown_now(req); /* may end req: l is already past it */
    }
    idem__worker_maybe_exit(w);
}

static void on_stop_async(uv_async_t *a)
{
    idem_worker_t *w = a->data;
    if (w->stopping)
        return;
    w->stopping = true;
    w->listener.stopping = true;
    close_if_open((uv_handle_t *)&w->listener.tcp);
    if (w->has_tls) {
        w->tls_listener.stopping = true;
        close_if_open((uv_handle_t *)&w->tls_listener.tcp);
        idem__conns_close_idle(&w->tls_listener);
    }
    /* Idle connections close now; busy ones after their response. */
    idem__conns_close_idle(&w->listener);
    idem__reconcile_stop(&w->recon);
    idem__upstream_stop(&w->up);
    uint64_t grace = (uint64_t)w->gw->cfg->upstream_timeout_ms + 5000;
    uv_timer_start(&w->shutdown_timer, on_shutdown_timer, grace, 0);
    uv_unref((uv_handle_t *)&w->shutdown_timer);
    idem__worker_maybe_exit(w);
}

void idem__worker_request_stop(idem_worker_t *w)
{
    uv_async_send(&w->stop_async);
}

int idem__worker_init(idem_worker_t *w, idem_gw_t *gw, int index, int listen_fd, int tls_fd,
                      char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->gw = gw;
    w->index = index;
    pthread_mutex_lock(&gw->live_mu);
    w->cfg = idem__config_ref(gw->live);
    w->cfg_gen = atomic_load(&gw->live_gen);
    pthread_mutex_unlock(&gw->live_mu);
    idem__reconcile_init(&w->recon, w);
    idem_list_init(&w->done);
    idem_list_init(&w->reqs);
    idem_list_init(&w->inline_q);
    w->inline_store = idem_store_exec_is_cheap(gw->store);
    idem__buf_init(&w->log, 1u << 20);
    pthread_mutex_init(&w->done_mu, NULL);
    uv_loop_init(&w->loop);
    uv_async_init(&w->loop, &w->done_async, on_done_async);
    w->done_async.data = w;
    uv_async_init(&w->loop, &w->stop_async, on_stop_async);
    w->stop_async.data = w;
    uv_check_init(&w->loop, &w->log_check);
    w->log_check.data = w;
    uv_check_start(&w->log_check, on_log_check);
    uv_unref((uv_handle_t *)&w->log_check);
    uv_timer_init(&w->loop, &w->shutdown_timer);
    w->shutdown_timer.data = w;
    uv_idle_init(&w->loop, &w->inline_idle);
    w->inline_idle.data = w;
    idem__upstream_init(&w->up, &w->loop, (const struct sockaddr *)&gw->upstream_addr,
                        (uint64_t)gw->cfg->upstream_timeout_ms, IDEM_UP_IDLE_MAX);
    if (gw->upstream_tls_ctx) {
        /* https://: the name sent as SNI and verified is server_name, else
         * the URL's host (SPEC section 16). */
        const char *sni = gw->cfg->upstream_tls_server_name ? gw->cfg->upstream_tls_server_name
                                                            : gw->upstream_host;
        if (idem__upstream_set_tls(&w->up, gw->upstream_tls_ctx, sni) != 0) {
            snprintf(err, errlen, "upstream_tls: out of memory");
            return -1;
        }
    }

    idem__proxy_handler_init(&w->handler, w);
    const idem_listen_limits_t limits = {
        .max_conns = 0, /* max_connections, every worker together */
        .write_high = IDEM_CONN_WRITE_HIGH,
        .count_queued = true,
        .per_address = true,
        .http2 = gw->cfg->http2,
    };
    idem__listener_init(&w->listener, gw, &w->loop, &w->handler, &limits);
    w->listener.data = w;
    w->listener.on_conn_freed = on_listener_conn_freed;
    if (idem__tcp_open_listener(&w->loop, &w->listener.tcp, &w->listener, listen_fd,
                                IDEM_LISTEN_BACKLOG, idem__conn_on_connection, "--listen", err,
                                errlen) != 0)
        return -1;
    if (tls_fd < 0)
        return 0;
    /* listen_tls: the same handler and budgets, with TLS under each
     * connection. */
    idem__listener_init(&w->tls_listener, gw, &w->loop, &w->handler, &limits);
    w->tls_listener.data = w;
    w->tls_listener.on_conn_freed = on_listener_conn_freed;
    w->tls_listener.log = on_listener_log;
    w->tls_listener.tls = &gw->tls_server;
    w->has_tls = true;
    return idem__tcp_open_listener(&w->loop, &w->tls_listener.tcp, &w->tls_listener, tls_fd,
                                   IDEM_LISTEN_BACKLOG, idem__conn_on_connection,
                                   "listen_tls.address", err, errlen);
}

void *idem__worker_main(void *arg)
{
    idem_worker_t *w = arg;
    char name[16];
    snprintf(name, sizeof name, "idem-worker-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    idem__log_flush(w);
    return NULL;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void idem__worker_cleanup(idem_worker_t *w)
{
    uv_walk(&w->loop, close_any, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    idem__reconcile_cleanup(&w->recon);
    idem__config_unref(w->cfg);
    w->cfg = NULL;
    uv_loop_close(&w->loop);
    idem__log_flush(w);
    pthread_mutex_destroy(&w->done_mu);
    idem__buf_cleanup(&w->log);
}
