/* src/gateway/writer.c - the store writer thread: group commit.
 *
 * Worker loops never write to the store themselves.  They queue an
 * idem_wjob_t here; this thread takes everything queued (up to a batch
 * limit), applies it with one idem_store_exec call (one transaction, one
 * fsync with LMDB's sync=always), and hands each job back to the loop that
 * queued it through that worker's done list and uv_async.  Under load the
 * queue grows while a commit is in progress, so the next batch is larger
 * and the cost of durability per request falls by itself: no timer, no
 * tuning knob.
 *
 * Once a second, loaded or not, the thread also runs the sweeper, a bounded
 * step that removes records past their retention.
 *
 * Every batch also tells metrics.store_full whether the store refused it for
 * want of room, which /readyz reports (admin.c probes the store while it is
 * set, so the flag cannot outlive the condition).
 *
 * A store whose commits do not wait for the disk (memory:, lmdb with
 * sync=interval) is not worth two thread hand-offs per operation: there
 * each worker applies its own queue once per loop turn (worker.c), with
 * idem__writer_jobs_apply below, and this thread only sweeps.
 *
 * INVARIANTS: a job is handed back exactly once; jobs are handed back in
 * the order they were applied; stop applies everything already queued.
 * THREADING: submit from any thread; everything else on the writer thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/gateway.h"
#include "gateway/worker.h"
#include "gateway/writer.h"
#include "idem/clock.h"

#define WRITER_BATCH_MAX IDEM_JOBS_BATCH_MAX
#define SWEEP_EVERY_MS 1000
#define SWEEP_STEP 2000
/* Steps one tick may take while each removes a full SWEEP_STEP: the
 * embedded stores sweep from an expiry index, so a step costs the records
 * that leave, and 2,000 a second would fall behind a busy gateway. */
#define SWEEP_ROUNDS_MAX 16

static void hand_back(idem_wjob_t *job)
{
    idem_worker_t *w = job->worker;
    pthread_mutex_lock(&w->done_mu);
    idem_list_push(&w->done, &job->link);
    pthread_mutex_unlock(&w->done_mu);
    uv_async_send(&w->done_async);
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
    if (err != IDEM_OK)
        atomic_fetch_add(&metrics->store_errors, 1);
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
         * does not make the store usable again. */
        uint64_t need = 0;
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

static void *writer_main(void *arg)
{
    idem_writer_t *wr = arg;
    pthread_setname_np(pthread_self(), "idem-writer");
    idem_wjob_t *jobs[WRITER_BATCH_MAX];
    int64_t last_sweep = idem_clock_now(NULL);
    pthread_mutex_lock(&wr->mu);
    for (;;) {
        while (idem_list_empty(&wr->queue) && !wr->stopping) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            int rc = pthread_cond_timedwait(&wr->cv, &wr->mu, &until);
            if (rc == ETIMEDOUT)
                break;
        }
        /* The sweeper runs once a second whatever the load: under steady
         * traffic the queue is never empty for long, and a store that is
         * full of expired records must still make room. */
        int64_t now = idem_clock_now(NULL);
        if (now - last_sweep >= SWEEP_EVERY_MS && !wr->stopping) {
            last_sweep = now;
            pthread_mutex_unlock(&wr->mu);
            size_t removed = SWEEP_STEP;
            for (int r = 0; r < SWEEP_ROUNDS_MAX && removed == SWEEP_STEP; r++) {
                removed = 0;
                if (idem_store_sweep(wr->store, now, SWEEP_STEP, &removed) != IDEM_OK)
                    break;
            }
            pthread_mutex_lock(&wr->mu);
        }
        if (idem_list_empty(&wr->queue)) {
            if (wr->stopping)
                break;
            continue;
        }
        size_t n = 0;
        while (!idem_list_empty(&wr->queue) && n < WRITER_BATCH_MAX) {
            idem_link_t *l = wr->queue.next;
            idem_list_remove(l);
            jobs[n++] = IDEM_CONTAINER(l, idem_wjob_t, link);
        }
        pthread_mutex_unlock(&wr->mu);
        if (apply_batch(wr, jobs, n))
            last_sweep = 0; /* full: make room now, not at the next tick */
        pthread_mutex_lock(&wr->mu);
    }
    pthread_mutex_unlock(&wr->mu);
    return NULL;
}

int idem__writer_start(idem_writer_t *wr, idem_store_t *store, idem_metrics_t *metrics)
{
    memset(wr, 0, sizeof *wr);
    wr->store = store;
    wr->metrics = metrics;
    idem_list_init(&wr->queue);
    pthread_mutex_init(&wr->mu, NULL);
    pthread_cond_init(&wr->cv, NULL);
    if (pthread_create(&wr->thread, NULL, writer_main, wr) != 0)
        return -1;
    wr->started = true;
    return 0;
}

void idem__writer_submit(idem_writer_t *wr, idem_wjob_t *job)
{
    pthread_mutex_lock(&wr->mu);
    bool was_empty = idem_list_empty(&wr->queue);
    idem_list_push(&wr->queue, &job->link);
    pthread_mutex_unlock(&wr->mu);
    if (was_empty)
        pthread_cond_signal(&wr->cv);
}

void idem__writer_stop(idem_writer_t *wr)
{
    if (!wr->started)
        return;
    pthread_mutex_lock(&wr->mu);
    wr->stopping = true;
    pthread_cond_signal(&wr->cv);
    pthread_mutex_unlock(&wr->mu);
    pthread_join(wr->thread, NULL);
    pthread_mutex_destroy(&wr->mu);
    pthread_cond_destroy(&wr->cv);
    wr->started = false;
}
