/* src/gateway/writer.h - the store writer: the jobs a worker queues for the
 * store, and the thread that applies them in batches (writer.c).
 *
 * A job (idem_wjob_t) is one store operation, its result, and a callback
 * that runs back on the loop of the worker that queued it.  idem__writer_jobs_apply
 * is where a batch meets the store: the writer thread calls it, and so does
 * a worker whose store commits cheaply (worker.c's inline queue).  Nothing
 * here knows a loop: handing a job back to its worker's loop is writer.c's.
 *
 * THREADING: idem__writer_submit from any thread; a job's callback on the
 * loop thread of job->worker; idem__writer_jobs_apply on whichever thread applies.
 */
#ifndef IDEM_GATEWAY_WRITER_H
#define IDEM_GATEWAY_WRITER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/list.h"
#include "gateway/metrics.h"
#include "gateway/space.h"
#include "idem/store.h"

typedef struct idem_gw idem_gw_t;
typedef struct idem_worker idem_worker_t;
typedef struct idem_wjob idem_wjob_t;

typedef void (*idem_wjob_cb)(idem_wjob_t *job);

/** One operation queued for the writer thread.  Owned by whoever queued it;
 * it must stay alive until its callback runs on the owner's loop thread. */
struct idem_wjob {
    idem_op_t op;
    idem_err_t batch_err;  /* the batch's own result (store down, full ...) */
    idem_wjob_cb cb;       /* runs on the worker's loop thread */
    void *data;
    idem_worker_t *worker; /* whose loop gets the result */
    bool plain;            /* no request behind it (reconcile.c): cb alone, on the loop */
    idem_link_t link;
};

/* Writer threads on a network store: batches in flight at once (writer.c). */
#define IDEM_WRITER_NET_INFLIGHT 4
/* Jobs queued behind a batch in flight before another batch may start. */
#define IDEM_WRITER_SPLIT_MIN 16

typedef struct idem_writer {
    idem_store_t *store;
    idem_metrics_t *metrics;
    idem_gw_t *gw;            /* for the sweeper's log lines (idem__log); may be NULL */
    idem_space_watch_t space; /* the store's room; the sweeper thread's own */
    pthread_t threads[IDEM_WRITER_NET_INFLIGHT];
    size_t n_threads;
    size_t idle;             /* writer threads waiting for work */
    size_t inflight;         /* batches being applied */
    size_t queued;           /* jobs in queue */
    size_t split_min;        /* jobs queued before a second batch goes in flight */
    pthread_t sweeper;
    bool sweeper_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work queued, or stopping */
    pthread_cond_t sweep_cv; /* sweep now, or stopping (monotonic clock) */
    idem_link_t queue;
    bool sweep_now;          /* a batch found the store full */
    bool stopping;
    bool started;
} idem_writer_t;

#define IDEM_JOBS_BATCH_MAX 256

/** Apply n jobs (n <= IDEM_JOBS_BATCH_MAX) in one store transaction: set
 * each job's op outputs and batch_err, count the batch in metrics.
 * @return the batch's error (IDEM_OK when it committed). */
idem_err_t idem__writer_jobs_apply(idem_store_t *store, idem_metrics_t *metrics,
                                   idem_wjob_t **jobs, size_t n);

/** The response bytes (body and header names and values) an op writes. */
uint64_t idem__writer_op_payload(const idem_op_t *op);
/** The least room a write refused for want of room asks back before the
 * store counts as having room again (store_full_bytes): a page's worth,
 * what an answer of ordinary size takes. */
#define IDEM_STORE_FULL_MIN_NEED 4096u
/** Keep metrics->store_full up to date after a batch of ops that exec
 * answered err: set on IDEM_E_STORE_FULL (store_full_bytes: the largest
 * response payload it refused, at least IDEM_STORE_FULL_MIN_NEED), cleared
 * by a committed batch that added a record at least that large (a claim
 * that forwards, a completion, a token issue). */
void idem__writer_store_full_note(idem_metrics_t *metrics, idem_err_t err, const idem_op_t *ops,
                                  size_t n);

/** How many writer threads idem__writer_start runs for store: several for a
 * network store (batches in flight), else one. */
size_t idem__writer_threads_for(const idem_store_t *store);
/** Start the writer and sweeper threads; gw is where the sweeper logs (see
 * space.h), NULL for plain text lines.  @return 0, or -1 with err naming the
 * thread that did not start (those that did are stopped and joined). */
int idem__writer_start(idem_writer_t *w, idem_store_t *store, idem_metrics_t *metrics,
                       idem_gw_t *gw, char *err, size_t errlen);
/** Queue a job; its callback runs later on job->worker's loop. */
void idem__writer_submit(idem_writer_t *w, idem_wjob_t *job);
/** Apply what is queued, then stop the thread. */
void idem__writer_stop(idem_writer_t *w);

#endif /* IDEM_GATEWAY_WRITER_H */
