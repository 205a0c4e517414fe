/* src/gateway/reconcile.c - the questions to reconcile_url about a held key
 * (reconcile.h has what they promise; SPEC section 18).
 *
 * Each tracked key is a struct recon_key on its worker's list, with one
 * timer.  The timer fires for the next lease renewal (every lease / 3) or
 * the next question, whichever comes first.  A due question waits in
 * r->ready for one of IDEM_RECONCILE_ASKING_MAX slots, then goes out
 * through the worker's upstream client (idem__upstream_req_start): the
 * same connections, timeout and TLS as forwarded requests.  What the
 * answer says goes to the store as a fenced job on the worker's usual path
 * (idem__worker_submit, a `plain` job: no request behind it):
 *
 *   404                 RELEASE  -> the next retry runs
 *   other 2xx-4xx       COMPLETE -> replayed from now on
 *   5xx, no answer      asked again after the backoff (doubling, capped)
 *
 * A key leaves the list (dropped) when it is settled, when its lease was
 * taken by another asker (a fenced write or renewal refused), when its hold
 * ends (key_ttl), or when the worker stops; its memory goes once nothing of
 * it is in flight (no job, no call, timer closed).
 *
 * THREADING: the worker's loop thread.
 */
#include "gateway/reconcile.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/request_plan.h"
#include "gateway/upstream.h"
#include "gateway/worker.h"
#include "gateway/writer.h"
#include "idem/alloc.h"
#include "idem/clock.h"

enum { K_WAITING, K_READY, K_ASKING, K_STORING };

struct recon_key {
    idem_link_t link;       /* in r->keys */
    idem_link_t ready_link; /* in r->ready while K_READY */
    idem_reconcile_t *r;
    const idem_config_t *cfg;   /* a reference: policy is one of its */
    const idem_policy_t *policy;
    idem_key_id_t id;
    uint64_t fence;
    int64_t expires_at_ms; /* the hold's retention: no question after it */
    int64_t next_ask_ms;
    int64_t backoff_ms;
    int64_t next_renew_ms;
    int state;
    bool dropped;
    bool timer_closed;
    uv_timer_t timer;
    idem_wjob_t job; /* the answer's write */
    bool job_busy;
    idem_wjob_t renew_job;
    bool renew_busy;
    idem_upstream_req_t up;
    bool up_busy;
    idem_buf_t body;
    bool too_big;
    idem_header_t *headers;
    idem_response_t resp;
};

typedef struct recon_key recon_key_t;

static void key_arm(recon_key_t *k);
static void pump(idem_reconcile_t *r);

static idem_gw_t *key_gw(const recon_key_t *k) { return k->r->w->gw; }

/* ---- lifetime ------------------------------------------------------------- */

static void key_free(recon_key_t *k)
{
    idem_list_remove(&k->link);
    idem__buf_cleanup(&k->body);
    idem_free(k->headers);
    if (!idem__upstream_req_active(&k->up))
        idem__upstream_req_cleanup(&k->up);
    idem__config_unref(k->cfg);
    idem_free(k);
}

static void key_maybe_free(recon_key_t *k)
{
    if (k->dropped && k->timer_closed && !k->job_busy && !k->renew_busy && !k->up_busy)
        key_free(k);
}

static void on_timer_closed(uv_handle_t *h)
{
    recon_key_t *k = h->data;
    k->timer_closed = true;
    key_maybe_free(k);
}

/* Stop tracking k; its memory goes once nothing of it is in flight. */
static void key_drop(recon_key_t *k)
{
    if (k->dropped)
        return;
    k->dropped = true;
    k->r->n_keys--;
    if (k->state == K_READY)
        idem_list_remove(&k->ready_link);
    if (k->up_busy) {
        idem__upstream_req_cancel(&k->up);
        k->up_busy = false;
        k->r->asking--;
    }
    uv_close((uv_handle_t *)&k->timer, on_timer_closed);
    pump(k->r);
}

/* ---- store jobs ------------------------------------------------------------ */

static void job_init(recon_key_t *k, idem_wjob_t *job, idem_op_kind_t kind)
{
    memset(&job->op, 0, sizeof job->op);
    job->op.kind = kind;
    job->op.id = k->id;
    job->op.fence = k->fence;
    job->data = k;
    job->plain = true;
}

static void on_renew_done(idem_wjob_t *job)
{
    recon_key_t *k = job->data;
    k->renew_busy = false;
    if (!k->dropped && job->batch_err == IDEM_OK && job->op.err == IDEM_E_FENCE &&
        job->op.fence == k->fence) {
        /* Another asker holds the key now (or it was settled or removed):
         * it is theirs to ask about. */
        idem__log(key_gw(k), "info", "reconcile: key %s was taken by another asker", k->id.key);
        key_drop(k);
    }
    key_maybe_free(k);
}

static void key_renew(recon_key_t *k, int64_t now)
{
    k->next_renew_ms = now + k->policy->lease_ms / 3;
    if (k->renew_busy)
        return; /* one at a time: a slow store skips a beat */
    job_init(k, &k->renew_job, IDEM_OP_RENEW);
    k->renew_job.op.lease_until_ms = now + k->policy->lease_ms;
    k->renew_job.cb = on_renew_done;
    k->renew_busy = true;
    idem__worker_submit(k->r->w, &k->renew_job);
}

/* ---- scheduling ---------------------------------------------------------- */

static void on_key_timer(uv_timer_t *t)
{
    recon_key_t *k = t->data;
    int64_t now = idem_clock_now(NULL);
    if (k->dropped)
        return;
    if (now >= k->expires_at_ms) {
        idem__log(key_gw(k), "warn",
                  "reconcile: no answer settled key %s before its hold ended (key_ttl); the "
                  "key is free again",
                  k->id.key);
        key_drop(k);
        return;
    }
    if (now >= k->next_renew_ms)
        key_renew(k, now);
    if (k->state == K_WAITING && now >= k->next_ask_ms) {
        k->state = K_READY;
        idem_list_push(&k->r->ready, &k->ready_link);
        pump(k->r);
    }
    if (!k->dropped)
        key_arm(k);
}

/* Arm k's timer for its next renewal or question. */
static void key_arm(recon_key_t *k)
{
    int64_t now = idem_clock_now(NULL);
    int64_t at = k->next_renew_ms;
    if (k->state == K_WAITING && k->next_ask_ms < at)
        at = k->next_ask_ms;
    if (k->expires_at_ms < at)
        at = k->expires_at_ms;
    uv_timer_start(&k->timer, on_key_timer, at > now ? (uint64_t)(at - now) : 0, 0);
}

/* The answer settled nothing: ask again after the backoff. */
static void key_retry(recon_key_t *k, const char *why)
{
    idem_reconcile_t *r = k->r;
    atomic_fetch_add_explicit(&key_gw(k)->metrics.reconcile_retry, 1, memory_order_relaxed);
    int64_t cap = IDEM_RECONCILE_BACKOFF_MAX_MS;
    if (k->policy->reconcile_after_ms > cap)
        cap = k->policy->reconcile_after_ms;
    int64_t now = idem_clock_now(NULL);
    k->next_ask_ms = now + k->backoff_ms;
    idem__log(key_gw(k), "info", "reconcile: key %s: %s; asking again in %lld ms", k->id.key,
              why, (long long)k->backoff_ms);
    k->backoff_ms = k->backoff_ms > cap / 2 ? cap : k->backoff_ms * 2;
    k->state = K_WAITING;
    if (!k->dropped && !r->stopping)
        key_arm(k);
}

/* ---- the answer's write -------------------------------------------------- */

static void on_answer_stored(idem_wjob_t *job)
{
    recon_key_t *k = job->data;
    k->job_busy = false;
    idem_free(k->headers);
    k->headers = NULL;
    idem__buf_cleanup(&k->body);
    idem__upstream_req_cleanup(&k->up);
    if (k->dropped) {
        key_maybe_free(k);
        return;
    }
    idem_metrics_t *m = &key_gw(k)->metrics;
    bool release = job->op.kind == IDEM_OP_RELEASE;
    if (job->batch_err != IDEM_OK ||
        (job->op.err != IDEM_OK && job->op.err != IDEM_E_FENCE &&
         !(release && job->op.err == IDEM_E_NOTFOUND))) {
        idem_err_t e = job->batch_err != IDEM_OK ? job->batch_err : job->op.err;
        char why[160];
        snprintf(why, sizeof why, "the answer could not be stored (%s)", idem_strerror(e));
        key_retry(k, why);
        return;
    }
    if (job->op.err == IDEM_E_FENCE) {
        idem__log(key_gw(k), "info",
                  "reconcile: key %s: the answer came after another asker took the key; "
                  "not stored",
                  k->id.key);
    } else if (release) {
        atomic_fetch_add_explicit(&m->reconcile_not_applied, 1, memory_order_relaxed);
        idem__log(key_gw(k), "info",
                  "reconcile: key %s: the upstream says the request never took effect; "
                  "released",
                  k->id.key);
    } else {
        atomic_fetch_add_explicit(&m->reconcile_applied, 1, memory_order_relaxed);
        idem__log(key_gw(k), "info",
                  "reconcile: key %s: stored the upstream's account of the request (status "
                  "%d)",
                  k->id.key, job->op.response ? job->op.response->status : 0);
    }
    key_drop(k);
}

/* Store what a 2xx-4xx answer (other than 404) says the request did. */
static void key_store_answer(recon_key_t *k)
{
    const idem_http_msg_t *m = &k->up.resp;
    k->headers = idem_calloc(m->n_fields ? m->n_fields : 1, sizeof *k->headers);
    if (k->headers == NULL) {
        key_retry(k, "out of memory");
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (idem__gw_response_field_stored(k->policy, m, f->name))
            k->headers[n++] = (idem_header_t){f->name.ptr, f->name.len, f->value.ptr,
                                              f->value.len};
    }
    k->resp = (idem_response_t){.status = m->status, .headers = k->headers, .n_headers = n};
    if (!k->too_big) {
        k->resp.body = (const uint8_t *)k->body.data;
        k->resp.body_len = k->body.len;
    }
    job_init(k, &k->job, IDEM_OP_COMPLETE);
    k->job.op.response = &k->resp;
    k->job.op.flags = k->too_big ? IDEM_REC_NOT_RETAINED : 0;
    k->job.op.expires_at_ms = idem_clock_now(NULL) + k->policy->key_ttl_ms;
    k->job.cb = on_answer_stored;
    k->job_busy = true;
    k->state = K_STORING;
    idem__worker_submit(k->r->w, &k->job);
}

/* ---- the question -------------------------------------------------------- */

static idem_up_body_t on_up_body(idem_upstream_req_t *ur, const char *p, size_t n)
{
    recon_key_t *k = ur->data;
    if (k->too_big)
        return IDEM_UP_BODY_MORE; /* read to its end, keep none of it */
    if (k->body.len + n > k->policy->max_response_bytes ||
        idem__buf_append(&k->body, p, n) != 0) {
        k->too_big = true;
        idem__buf_cleanup(&k->body);
    }
    return IDEM_UP_BODY_MORE;
}

/* A question ended: its slot goes to the next one. */
static void question_over(recon_key_t *k)
{
    k->up_busy = false;
    k->r->asking--;
    pump(k->r);
}

static void on_up_done(idem_upstream_req_t *ur)
{
    recon_key_t *k = ur->data;
    question_over(k);
    int status = ur->resp.status;
    if (status == 404) {
        idem__upstream_req_cleanup(&k->up);
        idem__buf_cleanup(&k->body);
        job_init(k, &k->job, IDEM_OP_RELEASE);
        k->job.cb = on_answer_stored;
        k->job_busy = true;
        k->state = K_STORING;
        idem__worker_submit(k->r->w, &k->job);
        return;
    }
    if (status >= 200 && status <= 499) {
        key_store_answer(k); /* the response head stays in k->up until stored */
        return;
    }
    char why[64];
    snprintf(why, sizeof why, "reconcile_url answered %d", status);
    idem__upstream_req_cleanup(&k->up);
    idem__buf_cleanup(&k->body);
    key_retry(k, why);
}

static void on_up_failure(idem_upstream_req_t *ur, idem_up_result_t why)
{
    recon_key_t *k = ur->data;
    question_over(k);
    idem__upstream_req_cleanup(&k->up);
    idem__buf_cleanup(&k->body);
    key_retry(k, why == IDEM_UP_CONNECT_FAILED ? "reconcile_url could not be reached"
                 : why == IDEM_UP_TIMEOUT      ? "reconcile_url did not answer in time"
                                               : "reconcile_url gave no whole answer");
}

static const idem_upstream_cbs_t up_cbs = {
    .on_body = on_up_body,
    .on_done = on_up_done,
    .on_failure = on_up_failure,
};

int idem__reconcile_path(const char *url, const char *key, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    const char *sep = strstr(url, "://");
    const char *p = sep ? strchr(sep + 3, '/') : NULL;
    size_t n = 0;
    if (p == NULL || outlen == 0)
        return -1;
    while (*p) {
        if (strncmp(p, "{key}", 5) == 0) {
            for (const unsigned char *c = (const unsigned char *)key; *c; c++) {
                bool plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
                             (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' || *c == '_' ||
                             *c == '~';
                if (n + 3 >= outlen)
                    return -1;
                if (plain) {
                    out[n++] = (char)*c;
                } else {
                    out[n++] = '%';
                    out[n++] = hex[*c >> 4];
                    out[n++] = hex[*c & 15];
                }
            }
            p += 5;
            continue;
        }
        if (n + 1 >= outlen)
            return -1;
        out[n++] = *p++;
    }
    out[n] = '\0';
    return (int)n;
}

/* Idempotency-Key as a Structured Field string unless the bare form says
 * the same (no space, quote, backslash or comma). */
static int append_key(idem_buf_t *b, const char *key)
{
    if (strpbrk(key, " \",\\") == NULL)
        return idem__buf_append_str(b, key);
    int rc = idem__buf_append(b, "\"", 1);
    for (const char *c = key; *c; c++) {
        if (*c == '"' || *c == '\\')
            rc |= idem__buf_append(b, "\\", 1);
        rc |= idem__buf_append(b, c, 1);
    }
    return rc | idem__buf_append(b, "\"", 1);
}

static void key_ask(recon_key_t *k)
{
    idem_gw_t *gw = key_gw(k);
    char path[IDEM_KEY_MAX * 3 + 2048];
    idem_buf_t head;
    idem__buf_init(&head, 0);
    bool built = idem__reconcile_path(k->policy->reconcile_url, k->id.key, path, sizeof path) >= 0;
    if (built) {
        int rc = idem__buf_appendf(&head, "GET %s HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: ",
                                   path, gw->upstream_hostport);
        rc |= append_key(&head, k->id.key);
        rc |= idem__buf_appendf(&head,
                                "\r\nIdempotency-Fence: %llu\r\nIdempotency-Scope: %s\r\n"
                                "Accept: */*\r\n\r\n",
                                (unsigned long long)k->fence, k->id.scope);
        built = rc == 0;
    }
    if (!built)
        idem__buf_cleanup(&head); /* the call then fails: asked again later */
    k->state = K_ASKING;
    k->too_big = false;
    idem__upstream_req_cleanup(&k->up);
    idem__buf_cleanup(&k->body);
    idem__buf_init(&k->body, 0);
    k->up_busy = true;
    k->r->asking++;
    k->up.data = k;
    idem__upstream_req_start(&k->r->w->up, &k->up, &up_cbs, built ? &head : NULL, NULL, 0,
                             (idem_slice_t){"GET", 3});
}

/* Start due questions while there are slots. */
static void pump(idem_reconcile_t *r)
{
    while (!r->stopping && r->asking < IDEM_RECONCILE_ASKING_MAX && !idem_list_empty(&r->ready)) {
        idem_link_t *l = r->ready.next;
        idem_list_remove(l);
        key_ask(IDEM_CONTAINER(l, recon_key_t, ready_link));
    }
}

/* ---- the interface -------------------------------------------------------- */

void idem__reconcile_init(idem_reconcile_t *r, idem_worker_t *w)
{
    memset(r, 0, sizeof *r);
    r->w = w;
    idem_list_init(&r->keys);
    idem_list_init(&r->ready);
}

void idem__reconcile_track(idem_reconcile_t *r, const idem_config_t *cfg,
                           const idem_policy_t *policy,
                           const idem_key_id_t *id, uint64_t fence, int64_t expires_at_ms,
                           bool ask_now)
{
    if (r->stopping || policy->reconcile_url == NULL)
        return;
    int64_t now = idem_clock_now(NULL);
    for (idem_link_t *l = r->keys.next; l != &r->keys; l = l->next) {
        recon_key_t *k = IDEM_CONTAINER(l, recon_key_t, link);
        if (k->dropped || strcmp(k->id.key, id->key) != 0 || strcmp(k->id.scope, id->scope) != 0)
            continue;
        if (fence > k->fence) {
            /* Our own lease ran out and a repeat took the key back. */
            k->fence = fence;
            k->expires_at_ms = expires_at_ms;
            if (ask_now && k->state == K_WAITING) {
                k->next_ask_ms = now;
                key_arm(k);
            }
        }
        return;
    }
    if (r->n_keys >= IDEM_RECONCILE_KEYS_MAX) {
        idem__log(r->w->gw, "warn",
                  "reconcile: %d keys tracked already; key %s stays held and a later repeat "
                  "asks about it once its lease ends",
                  IDEM_RECONCILE_KEYS_MAX, id->key);
        return;
    }
    recon_key_t *k = idem_calloc(1, sizeof *k);
    if (k == NULL) {
        idem__log(r->w->gw, "error",
                  "reconcile: out of memory; key %s stays held until a repeat asks", id->key);
        return;
    }
    k->r = r;
    k->cfg = idem__config_ref(cfg);
    k->policy = policy;
    k->id = *id;
    k->fence = fence;
    k->expires_at_ms = expires_at_ms;
    k->backoff_ms = policy->reconcile_after_ms;
    k->next_ask_ms = ask_now ? now : now + policy->reconcile_after_ms;
    k->next_renew_ms = now + policy->lease_ms / 3;
    k->state = K_WAITING;
    idem__buf_init(&k->body, 0);
    uv_timer_init(&r->w->loop, &k->timer);
    k->timer.data = k;
    idem_list_push(&r->keys, &k->link);
    r->n_keys++;
    key_arm(k);
}

void idem__reconcile_stop(idem_reconcile_t *r)
{
    if (r->stopping)
        return;
    r->stopping = true;
    for (idem_link_t *l = r->keys.next; l != &r->keys;) {
        recon_key_t *k = IDEM_CONTAINER(l, recon_key_t, link);
        l = l->next; /* key_drop may free k */
        if (!k->dropped)
            key_drop(k);
    }
}

void idem__reconcile_cleanup(idem_reconcile_t *r)
{
    while (!idem_list_empty(&r->keys))
        key_free(IDEM_CONTAINER(r->keys.next, recon_key_t, link));
}
