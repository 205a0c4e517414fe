/* src/gateway/writer.c - the store writer threads: group commit, batches
 * in flight, and the sweeper.
 *
 * Worker loops never write to the store themselves.  They queue an
 * idem_wjob_t here; a writer thread takes everything queued (up to a batch
 * limit), applies it with one idem_store_exec call (one transaction, one
 * fsync with LMDB's sync=always), and hands each job back to the loop that
 * queued it through that worker's done list and uv_async.  Under load the
 * queue grows while a commit is in progress, so the next batch is larger
 * and the cost of durability per request falls by itself: no timer, no
 * tuning knob.
 *
 * Batches in flight.  A network store (Redis, PostgreSQL) spends most of a
 * batch waiting: a round trip, and for PostgreSQL three plus a WAL flush.
 * With one thread every new key waited for the batches queued before it
 * and then for its own, in series.  So for those stores there are
 * IDEM_WRITER_NET_INFLIGHT threads on the one queue, each applying its own
 * batch on its own pooled connection (the pools serve concurrent execs).
 * The first batch starts as soon as a job is queued; another starts only
 * while at least split_min (IDEM_WRITER_SPLIT_MIN) jobs wait behind the
 * batches in flight.  Measured on a 2-core machine that runs the store
 * too, every batch costs the server a fixed amount of CPU (PostgreSQL
 * about 0.7 ms: a transaction, three round trips, a commit), so waking a
 * thread for every job split the batches from 16 ops to 4-7 and cut
 * throughput by half; with the threshold batches stay large where the
 * store is CPU-bound, and several go in flight where it is latency-bound
 * (a store on another host) or the queue outgrows one batch.  A busy
 * thread takes what queued meanwhile when its batch is back, and whenever
 * the last batch in flight returns, its thread takes what is queued, so no
 * job waits for more than the batches ahead of it.  Concurrent batches are safe for
 * the store: each decides atomically (a Redis MULTI/EXEC, a PostgreSQL
 * transaction that locks its rows in key order and retries a deadlock),
 * exactly as batches from several idemd processes are.  For one key,
 * request.c queues a completion, release or hold only once its claim is
 * back, so none can be applied before the claim; a renewal still in flight
 * when the completion is queued may now be applied after it, and is then
 * refused (IDEM_E_FENCE on a completed record), which request.c ignores
 * once it has stopped renewing.  A local store with synchronous commits
 * (lmdb or rocksdb, sync=always) keeps one thread: it group-commits
 * inside the store, and a second thread would only split its batches.
 *
 * The sweeper has a thread of its own, so that a long round never holds up
 * a batch: once a second (sooner when a batch found the store full, or the
 * last round stopped at its limits) it runs a paced round (sweep.c) that
 * goes on in steps of SWEEP_STEP while they come back busy, for at most
 * SWEEP_STEPS_MAX steps or SWEEP_BUDGET_MS, so records leave at least as
 * fast as they arrive (up to SWEEP_STEP * SWEEP_STEPS_MAX a round).
 *
 * Every batch also tells metrics.store_full whether the store refused it for
 * want of room, which /readyz reports (admin.c probes the store while it is
 * set, so the flag cannot outlive the condition).  The sweeper thread also
 * asks the store for its room on disk, once a second (SPACE_EVERY_MS, and
 * at its start), for the gauges and the log lines of space.c: a thread
 * that already wakes once a second and never holds a request up.
 *
 * A store whose commits do not wait for the disk (memory:, lmdb with
 * sync=interval) is not worth two thread hand-offs per operation: there
 * each worker applies its own queue once per loop turn (worker.c), with
 * idem__writer_jobs_apply below, and the writer thread stays idle.
 *
 * INVARIANTS: a job is handed back exactly once, after its batch was
 * applied; jobs of one batch are handed back in the order they were
 * applied (batches on different threads complete in any order); stop
 * applies everything already queued.
 * THREADING: submit from any thread; mu guards the queue, the idle count
 * and the flags; everything else on the writer and sweeper threads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/space.h"
#include "gateway/sweep.h"
#include "gateway/thread.h"
#include "gateway/worker.h"
#include "gateway/writer.h"
#include "idem/clock.h"

#define WRITER_BATCH_MAX IDEM_JOBS_BATCH_MAX
#define SWEEP_EVERY_MS 1000
#define SWEEP_STEP 2000     /* records one sweep call may remove */
#define SWEEP_STEPS_MAX 64  /* calls in one round: 128,000 records */
#define SWEEP_BUDGET_MS 500 /* and at most this long */
#define SPACE_EVERY_MS 1000 /* the store's room is asked at most this often */

static void hand_back(idem_wjob_t *job)
{
    idem_worker_t *w = job->worker;
    pthread_mutex_lock(&w->done_mu);
    idem_list_push(&w->done, &job->link);
    pthread_mutex_unlock(&w->done_mu);
    uv_async_send(&w->done_async);
}

#define BATCH_FAILURE_LOG_MS 5000 /* at most one line about failed batches this often */

/* A batch the store refused: the store's own reason (a Redis WAIT that
 * timed out, a connection refused, a READONLY replica), which the requests
 * only see as an error code, goes to the log, at most every
 * BATCH_FAILURE_LOG_MS so that an outage logs a line, not one per batch. */
static void writer_log_failure(idem_store_t *store, idem_wjob_t **jobs, size_t n, idem_err_t err)
{
    static _Atomic int64_t last_ms;
    static _Atomic uint64_t unlogged;
    int64_t now = (int64_t)(idem_clock_mono_ns() / 1000000);
    int64_t prev = atomic_load(&last_ms);
    if ((prev != 0 && now - prev < BATCH_FAILURE_LOG_MS) ||
        !atomic_compare_exchange_strong(&last_ms, &prev, now)) {
        atomic_fetch_add(&unlogged, 1);
        return;
    }
    if (n == 0 || jobs[0]->worker == NULL)
        return;
    const char *why = idem_store_errstr(store);
    idem__log(jobs[0]->worker->gw, "error",
              "store: a batch of %zu ops failed: %s%s%s (%llu more failed batches not logged)", n,
              idem_strerror(err), why && *why ? ": " : "", why ? why : "",
              (unsigned long long)atomic_exchange(&unlogged, 0));
}

idem_err_t idem__writer_jobs_apply(idem_store_t *store, idem_metrics_t *metrics,
                                   idem_wjob_t **jobs, size_t n)
{
    idem_op_t ops[IDEM_JOBS_BATCH_MAX];
    for (size_t i = 0; i < n; i++)
        ops[i] = jobs[i]->op;
    uint64_t t0 = idem_clock_mono_ns();
    idem_err_t err = idem_store_exec(store, ops, n);
    idem__hist_observe(&metrics->store_latency, idem_clock_mono_ns() - t0);
    atomic_fetch_add(&metrics->store_batches, 1);
    atomic_fetch_add(&metrics->store_ops, n);
    if (err != IDEM_OK) {
        atomic_fetch_add(&metrics->store_errors, 1);
        writer_log_failure(store, jobs, n, err);
    }
    for (size_t i = 0; i < n; i++) {
        jobs[i]->op = ops[i];
        jobs[i]->batch_err = err;
    }
    idem__writer_store_full_note(metrics, err, ops, n);
    return err;
}

uint64_t idem__writer_op_payload(const idem_op_t *op)
{
    if (op->kind != IDEM_OP_COMPLETE || op->response == NULL)
        return 0;
    uint64_t n = op->response->body_len;
    for (size_t i = 0; i < op->response->n_headers; i++)
        n += op->response->headers[i].name_len + op->response->headers[i].value_len;
    return n;
}

void idem__writer_store_full_note(idem_metrics_t *metrics, idem_err_t err, const idem_op_t *ops,
                                  size_t n)
{
    if (err == IDEM_E_STORE_FULL) {
        /* Remember the largest response that did not fit: room for less
         * does not make the store usable again.  And at least
         * IDEM_STORE_FULL_MIN_NEED, whatever was refused: a refused claim,
         * token issue or renewal writes no response, and a store at its
         * edge still takes the odd small record (an LMDB map whose last
         * pages are gone can put one in a leaf that has room), so room for
         * nothing would end the note at once, /readyz 200 with every token
         * issue refused. */
        uint64_t need = IDEM_STORE_FULL_MIN_NEED;
        for (size_t i = 0; i < n; i++) {
            uint64_t b = idem__writer_op_payload(&ops[i]);
            need = b > need ? b : need;
        }
        uint64_t had = atomic_load(&metrics->store_full_bytes);
        if (!atomic_load(&metrics->store_full) || need > had)
            atomic_store(&metrics->store_full_bytes, need);
        atomic_store(&metrics->store_full, true);
        return;
    }
    if (err != IDEM_OK || !atomic_load_explicit(&metrics->store_full, memory_order_relaxed))
        return;
    /* Only a write that added at least as much as the one refused shows
     * there is room again: a replay, a renewal or a release commits without
     * needing any. */
    uint64_t need = atomic_load(&metrics->store_full_bytes);
    for (size_t i = 0; i < n; i++) {
        bool grew = (ops[i].kind == IDEM_OP_CLAIM && idem_decision_forwards(ops[i].decision.kind)) ||
                    ((ops[i].kind == IDEM_OP_COMPLETE || ops[i].kind == IDEM_OP_TOKEN_ISSUE) &&
                     ops[i].err == IDEM_OK);
        if (grew && idem__writer_op_payload(&ops[i]) >= need) {
            atomic_store(&metrics->store_full, false);
            return;
        }
    }
}

/* Returns whether the store said it is full. */
static bool apply_batch(idem_writer_t *wr, idem_wjob_t **jobs, size_t n)
{
    idem_err_t err = idem__writer_jobs_apply(wr->store, wr->metrics, jobs, n);
    for (size_t i = 0; i < n; i++)
        hand_back(jobs[i]);
    return err == IDEM_E_STORE_FULL;
}

/* Whether a writer thread may take a batch now (mu held): always the
 * first batch in flight; another only once enough has queued to be worth
 * a batch of its own (see the opening comment); anything while stopping. */
static bool may_take(const idem_writer_t *wr)
{
    if (idem_list_empty(&wr->queue))
        return false;
    return wr->inflight == 0 || wr->queued >= wr->split_min || wr->stopping;
}

/* A writer thread: take what is queued, apply it, hand it back; until stop
 * finds the queue empty. */
static void *writer_main(void *arg)
{
    idem_writer_t *wr = arg;
    pthread_setname_np(pthread_self(), "idem-writer");
    idem_wjob_t *jobs[WRITER_BATCH_MAX];
    pthread_mutex_lock(&wr->mu);
    for (;;) {
        while (!may_take(wr) && !(wr->stopping && idem_list_empty(&wr->queue))) {
            wr->idle++;
            pthread_cond_wait(&wr->cv, &wr->mu);
            wr->idle--;
        }
        if (idem_list_empty(&wr->queue))
            break; /* stopping, and nothing left to apply */
        size_t n = 0;
        while (!idem_list_empty(&wr->queue) && n < WRITER_BATCH_MAX) {
            idem_link_t *l = wr->queue.next;
            idem_list_remove(l);
            jobs[n++] = IDEM_CONTAINER(l, idem_wjob_t, link);
        }
        wr->queued -= n;
        wr->inflight++;
        /* A full batch left more than a batch's worth behind: let an idle
         * thread take it now rather than after this round trip. */
        if (wr->idle > 0 && may_take(wr))
            pthread_cond_signal(&wr->cv);
        pthread_mutex_unlock(&wr->mu);
        bool full = apply_batch(wr, jobs, n);
        pthread_mutex_lock(&wr->mu);
        wr->inflight--;
        if (full && !wr->sweep_now) {
            wr->sweep_now = true; /* make room now, not at the next tick */
            pthread_cond_signal(&wr->sweep_cv);
        }
    }
    pthread_mutex_unlock(&wr->mu);
    return NULL;
}

/* Ask the store for its room if a second has passed, and log a change. */
static void look_at_space(idem_writer_t *wr)
{
    idem_space_note_t note;
    idem__space_look(&wr->space, wr->store, wr->metrics, idem_clock_mono_ns(),
                     (uint64_t)SPACE_EVERY_MS * 1000000u, &note);
    if (note.level != NULL)
        idem__log(wr->gw, note.level, "%s", note.line);
}

/* The sweeper thread: a paced round (sweep.c) once a second, sooner when a
 * batch found the store full or the last round stopped at its limits; and
 * the store's room, at start and then once a second. */
static void *sweeper_main(void *arg)
{
    idem_writer_t *wr = arg;
    pthread_setname_np(pthread_self(), "idem-sweeper");
    const idem_sweep_limits_t lim = {SWEEP_STEP, SWEEP_STEPS_MAX,
                                     (uint64_t)SWEEP_BUDGET_MS * 1000000u};
    int64_t wait_ms = SWEEP_EVERY_MS;
    look_at_space(wr);
    pthread_mutex_lock(&wr->mu);
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!wr->stopping && !wr->sweep_now) {
            if (pthread_cond_timedwait(&wr->sweep_cv, &wr->mu, &until) == ETIMEDOUT)
                break;
        }
        if (wr->stopping)
            break;
        wr->sweep_now = false;
        pthread_mutex_unlock(&wr->mu);
        idem_sweep_result_t res;
        idem__sweep_round(wr->store, idem_clock_now(NULL), &lim, &res);
        atomic_fetch_add(&wr->metrics->store_swept, res.removed);
        atomic_fetch_add(&wr->metrics->sweep_rounds, 1);
        look_at_space(wr);
        /* Behind: go again after a pause as long as the round (the
         * sweeper takes at most half of the time); else once a second. */
        wait_ms = res.behind ? SWEEP_BUDGET_MS : SWEEP_EVERY_MS;
        pthread_mutex_lock(&wr->mu);
    }
    pthread_mutex_unlock(&wr->mu);
    return NULL;
}

size_t idem__writer_threads_for(const idem_store_t *store)
{
    /* A network store answers a batch after a round trip (and PostgreSQL
     * after a WAL flush) and serves concurrent batches on separate pooled
     * connections, so several batches in flight hide the latency.  A local
     * store with synchronous commits group-commits inside the store, and a
     * store whose exec is cheap is applied on the worker loops (worker.c):
     * one thread is enough there. */
    if (!idem_store_exec_is_cheap(store) && !idem_store_reads_are_local(store))
        return IDEM_WRITER_NET_INFLIGHT;
    return 1;
}

static void stop_threads(idem_writer_t *wr)
{
    pthread_mutex_lock(&wr->mu);
    wr->stopping = true;
    pthread_cond_broadcast(&wr->cv);
    pthread_cond_broadcast(&wr->sweep_cv);
    pthread_mutex_unlock(&wr->mu);
    for (size_t i = 0; i < wr->n_threads; i++)
        pthread_join(wr->threads[i], NULL);
    if (wr->sweeper_started)
        pthread_join(wr->sweeper, NULL);
    wr->n_threads = 0;
    wr->sweeper_started = false;
}

int idem__writer_start(idem_writer_t *wr, idem_store_t *store, idem_metrics_t *metrics,
                       idem_gw_t *gw, char *err, size_t errlen)
{
    int rc;
    pthread_condattr_t ca;
    memset(wr, 0, sizeof *wr);
    wr->store = store;
    wr->metrics = metrics;
    wr->gw = gw;
    idem_list_init(&wr->queue);
    pthread_mutex_init(&wr->mu, NULL);
    pthread_cond_init(&wr->cv, NULL);
    /* The sweeper's waits are monotonic: a wall-clock step cannot stretch one. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wr->sweep_cv, &ca);
    pthread_condattr_destroy(&ca);
    wr->started = true;
    wr->split_min = IDEM_WRITER_SPLIT_MIN;
    size_t want = idem__writer_threads_for(store);
    for (size_t i = 0; i < want; i++) {
        if ((rc = idem__thread_create(&wr->threads[i], "writer", writer_main, wr)) != 0) {
            snprintf(err, errlen, "cannot start the store writer thread: %s", strerror(rc));
            goto fail;
        }
        wr->n_threads++;
    }
    if ((rc = idem__thread_create(&wr->sweeper, "sweeper", sweeper_main, wr)) != 0) {
        snprintf(err, errlen, "cannot start the sweeper thread: %s", strerror(rc));
        goto fail;
    }
    wr->sweeper_started = true;
    return 0;

fail:
    /* Only the threads that started are joined (stop_threads). */
    idem__writer_stop(wr);
    return -1;
}

void idem__writer_submit(idem_writer_t *wr, idem_wjob_t *job)
{
    pthread_mutex_lock(&wr->mu);
    idem_list_push(&wr->queue, &job->link);
    wr->queued++;
    /* Wake one idle thread when this job makes a batch takeable: the first
     * job with nothing in flight, or the split_min-th while batches are.  A
     * busy thread takes whatever has queued meanwhile when its batch is back. */
    if (wr->idle > 0 && (wr->inflight == 0 ? wr->queued == 1 : wr->queued == wr->split_min))
        pthread_cond_signal(&wr->cv);
    pthread_mutex_unlock(&wr->mu);
}

void idem__writer_stop(idem_writer_t *wr)
{
    if (!wr->started)
        return;
    stop_threads(wr);
    pthread_mutex_destroy(&wr->mu);
    pthread_cond_destroy(&wr->cv);
    pthread_cond_destroy(&wr->sweep_cv);
    wr->started = false;
}
