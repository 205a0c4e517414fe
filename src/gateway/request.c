/* src/gateway/request.c - the life of a request: dispatch, answering, the
 * store round trips, lease renewal, the upstream's outcome, streaming, and
 * the request's end.
 *
 * conn.c hands over a whole request, its target normalised, and
 * idem__req_dispatch follows docs/protocol.md sections 2-7.  Every decision
 * before the store (the refusals, the route, key, scope and fingerprint) is
 * a loop-free step of request_plan.c, called here where the loop gets to
 * it:
 *
 *   route -> key -> scope -> fingerprint -> fast read of the record
 *     completed/mismatch/in-flight: answer at once (no writer round trip)
 *     none/expired lease: CLAIM through the writer (decide + write atomically)
 *       forward (renewing the lease every lease/3) -> upstream outcome
 *       -> COMPLETE / RELEASE / HOLD through the writer (fenced)
 *       -> answer the client only once the outcome is durable.
 *
 * The store work goes through the worker (idem__worker_submit, worker.c),
 * the upstream call through the worker's upstream client (upstream.h), the
 * answer to the client through conn.c; a `mode: token` route's steps are
 * tokens.c's.  Every answer, whatever it is (a problem, a replay, the
 * upstream's response relayed or streamed, a token), is written by
 * src/http's idem__http_write_head or idem__http_write_response, all or
 * nothing: one that cannot be written becomes a 500, or the connection
 * closes, never half a head.
 *
 * A request is re-framed on its way up (idem__gw_upstream_head, in the
 * loop-free request_plan.c, which the fuzzer runs too): its decoded body
 * goes with a Content-Length of our own, hop-by-hop fields (Upgrade and
 * Connection among them) and Expect are dropped, any Idempotency-Fence the
 * client sent is dropped, and a keyed request gets `Idempotency-Fence: N`
 * for the claim that forwards it.  So the upstream never sees the client's
 * framing, which closes the door to smuggling.  The response body is
 * captured up to max_response_bytes; past that the call pauses until the
 * outcome is recorded, then the rest is relayed to the client as it comes,
 * paced by the client's send queue (IDEM_STREAM_HIGH_MARK).
 *
 * A request's life is a state that only moves forward and a count of what
 * holds it (req_state.h): the connection, each writer job, the fingerprint
 * in the thread pool, the upstream call, the armed timer, and each entry
 * point while it runs (IDEM_HOLD_CALL), since an answer given on its stack
 * lets the connection's hold go.  Whoever gives back the last hold ends the
 * request (req_end: logged, counted if it was never answered, freed); no
 * flag decides it.  Every callback that holds a request gives its hold back
 * as the last thing it does, and touches the request no more after that.
 *
 * INVARIANTS: a request is answered at most once; its store work is finished
 * (completed, released or left to its lease) even when its client has gone;
 * a request ends exactly once, when nothing holds it: no connection, writer
 * job, fingerprint, upstream call or armed timer.
 * THREADING: the worker's loop thread only (a large body's fingerprint is
 * computed in libuv's thread pool, reading only the request's own data).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/handler.h"
#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/policy.h"
#include "gateway/problem.h"
#include "gateway/request.h"
#include "gateway/worker.h"
#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/random.h"

#define WAIT_POLL_MS 25           /* on_conflict: wait re-reads the record this often */

static void req_claim(idem_req_t *req);
static void req_refuse(idem_req_t *req, const idem_gw_refusal_t *r);

/* ---- the request's life (req_state.h) ------------------------------------------ */

static void req_end(idem_req_t *req);

static void req_hold(idem_req_t *req, idem_hold_t h) { idem__life_hold(&req->life, h); }

void idem__req_release(idem_req_t *req, idem_hold_t h)
{
    if (idem__life_release(&req->life, h))
        req_end(req);
}

/* The row of the metrics req counts in (metrics.h): 0 when no route
 * matched (or before routing), 1 + its index in the configuration it was
 * routed by.  A reload that swaps the configuration must keep the one a
 * request was routed by alive until it ends (req->route points into it). */
static size_t req_route_slot(const idem_req_t *req)
{
    const idem_config_t *cfg = req->cfg; /* the config req->route belongs to */
    if (cfg == NULL || req->route == NULL || req->route < cfg->routes || req->route >= cfg->routes + cfg->n_routes)
        return 0;
    return (size_t)(req->route - cfg->routes) + 1;
}

/* Move req on to state s (never back).  The move that answers it counts its
 * outcome, so that the metrics see an answer when the client does, however
 * long the store work after it lasts (completion retries). */
void idem__req_enter(idem_req_t *req, idem_req_state_t s)
{
    if (req->life.state < IDEM_REQ_RELAYING && s >= IDEM_REQ_RELAYING)
        idem__metrics_count(&req_gw(req)->metrics, req_route_slot(req),
                            idem__metrics_proto(req->proto), req->outcome);
    idem__life_advance(&req->life, s);
}

/* Whether the client has its answer, or the head of it. */
static bool req_answered(const idem_req_t *req) { return req->life.state >= IDEM_REQ_RELAYING; }

/* ---- the connection, as the request sees it (handler.h) ------------------------------- */

/* The answer is complete (or cut): the connection calls the request no
 * more, and the request never touches the stream again.  The connection's
 * hold goes; the caller holds the request otherwise (every entry point
 * does), so req stays valid until the caller returns. */
static void req_stream_over(idem_req_t *req)
{
    if (req->os == NULL)
        return;
    req->os = NULL;
    idem__req_release(req, IDEM_HOLD_CONN);
}

/* on_gone: the client has gone (closed, broke, timed out).  The request
 * goes on without it, its store work included, and keeps its place in
 * max_connections until it ends. */
static void proxy_on_gone(idem_hreq_t *r)
{
    idem_req_t *req = r;
    req->os = NULL;
    req->holds_slot = true;
    req_hold(req, IDEM_HOLD_CALL);
    /* A relay has no one to relay to; a capture goes on, and is stored. */
    if (req->streaming)
        idem__req_abort_upstream(req);
    idem__req_release(req, IDEM_HOLD_CONN);
    idem__req_release(req, IDEM_HOLD_CALL);
}

/* ---- a request is made ------------------------------------------------------ */

/* ---- traces (otlp.h) ----------------------------------------------------------- */

/* A stand-in as long as any traceparent idemd sends: idem__gw_upstream_fits
 * measures the head with it. */
static const char trace_placeholder[] =
    "00-00000000000000000000000000000000-0000000000000000-00";

/* The trace a request belongs to, when tracing is on: the client's
 * traceparent continued when there is exactly one and it parses (its
 * sampled flag decides), else a new trace sampled at otlp_sample_ratio.
 * One draw of the kernel's generator gives every id the request needs. */
static void req_trace_begin(idem_req_t *req)
{
    idem_gw_t *gw = req_gw(req);
    if (gw->otlp == NULL)
        return;
    req->trace_on = true;
    req->t_start_unix_ns = idem__otlp_now_unix_ns();
    const idem_http_field_t *tp = NULL;
    size_t n_tp = 0;
    for (size_t i = 0; i < req->msg.n_fields; i++)
        if (idem__slice_eq_ci(req->msg.fields[i].name, "traceparent")) {
            tp = &req->msg.fields[i];
            n_tp++;
        }
    struct {
        uint8_t trace_id[IDEM_TRACE_ID_LEN];
        uint8_t span_id[IDEM_SPAN_ID_LEN];
        uint8_t up_span_id[IDEM_SPAN_ID_LEN];
        uint64_t draw;
    } r;
    if (idem_random_bytes(&r, sizeof r) != IDEM_OK) {
        req->trace_on = false; /* no ids: this request goes untraced */
        return;
    }
    r.span_id[0] |= 1; /* never the all-zero (invalid) id */
    r.up_span_id[0] |= 1;
    memcpy(req->span_id, r.span_id, sizeof req->span_id);
    memcpy(req->up_span_id, r.up_span_id, sizeof req->up_span_id);
    if (n_tp == 1 && idem__otlp_traceparent_parse(tp->value.ptr, tp->value.len, &req->trace)) {
        req->trace_parent = true;
        req->traced = (req->trace.flags & IDEM_TRACE_FLAG_SAMPLED) != 0;
        return;
    }
    r.trace_id[0] |= 1;
    memcpy(req->trace.trace_id, r.trace_id, sizeof req->trace.trace_id);
    double ratio = gw->cfg->otlp_sample_ratio;
    /* draw / 2^64 < ratio, in doubles: ratio 1 always, 0 never. */
    req->traced = ratio >= 1.0 || (double)(r.draw >> 11) < ratio * (double)(UINT64_C(1) << 53);
    req->trace.flags = req->traced ? IDEM_TRACE_FLAG_SAMPLED : 0;
}

/* The request's spans, queued for export: the server span, and the client
 * span of its upstream call when one was sent.  Neither holds the key or
 * the scope: idem.key_hash is SHA-256 of scope, NUL, key. */
static void req_trace_end(idem_req_t *req)
{
    if (!req->traced)
        return;
    idem_gw_t *gw = req_gw(req);
    uint64_t now = idem_clock_mono_ns();
    idem_span_t *s = idem_malloc(sizeof *s);
    if (s == NULL) {
        atomic_fetch_add_explicit(&gw->metrics.otlp_spans_dropped, 1 + (req->t_up_ns != 0),
                                  memory_order_relaxed);
        return;
    }
    char name[200];
    const idem_slice_t *method = &req->msg.method;
    int nl = req->route != NULL ? snprintf(name, sizeof name, "idem %.*s %s", (int)method->len,
                                           method->ptr, req->route->path)
                                : snprintf(name, sizeof name, "idem %.*s", (int)method->len,
                                           method->ptr);
    if (nl < 0)
        nl = 0;
    if ((size_t)nl >= sizeof name)
        nl = (int)sizeof name - 1;
    const idem_config_t *cfg = req->cfg; /* the config req->route belongs to */
    idem__span_init(s, req->trace.trace_id, req->span_id,
                    req->trace_parent ? req->trace.span_id : NULL, IDEM_SPAN_KIND_SERVER, name,
                    (size_t)nl);
    s->start_unix_ns = req->t_start_unix_ns;
    s->end_unix_ns = req->t_start_unix_ns + (now - req->t_start_ns);
    idem__span_attr_str(s, "http.request.method", method->ptr, method->len);
    idem__span_attr_str(s, "url.path", req->target, req->path_len);
    if (req->status > 0)
        idem__span_attr_int(s, "http.response.status_code", req->status);
    const char *outcome = idem__outcome_name(req->outcome);
    idem__span_attr_str(s, "idem.outcome", outcome, strlen(outcome));
    if (req->route != NULL) {
        char idx[24];
        int il = snprintf(idx, sizeof idx, "%zu", (size_t)(req->route - cfg->routes));
        idem__span_attr_str(s, "idem.route", idx, (size_t)il);
        idem__span_attr_str(s, "http.route", req->route->path, strlen(req->route->path));
    }
    if (req->keyed && req->id.key[0] != '\0') {
        char both[sizeof req->id.scope + sizeof req->id.key], digest[65];
        size_t sl = strlen(req->id.scope), kl = strlen(req->id.key);
        memcpy(both, req->id.scope, sl + 1); /* the NUL separates them */
        memcpy(both + sl + 1, req->id.key, kl);
        idem_sha256_hex(both, sl + 1 + kl, digest);
        idem__span_attr_str(s, "idem.key_hash", digest, 64);
    }
    if (req->fence > 0)
        idem__span_attr_int(s, "idem.fence", (int64_t)req->fence);
    if (req->store_ns > 0)
        idem__span_attr_int(s, "idem.store_time_us", (int64_t)(req->store_ns / 1000));
    uint64_t up_end = req->t_up_end_ns != 0 ? req->t_up_end_ns : now;
    if (req->t_up_ns != 0)
        idem__span_attr_int(s, "idem.upstream_time_us", (int64_t)((up_end - req->t_up_ns) / 1000));
    if (req->status >= 500)
        idem__span_error(s, outcome);
    idem__otlp_enqueue(gw->otlp, s);
    if (req->t_up_ns != 0) {
        nl = snprintf(name, sizeof name, "idem upstream %.*s", (int)method->len, method->ptr);
        if ((size_t)nl >= sizeof name)
            nl = (int)sizeof name - 1;
        idem__span_init(s, req->trace.trace_id, req->up_span_id, req->span_id,
                        IDEM_SPAN_KIND_CLIENT, name, (size_t)nl);
        s->start_unix_ns = req->t_start_unix_ns + (req->t_up_ns - req->t_start_ns);
        s->end_unix_ns = req->t_start_unix_ns + (up_end - req->t_start_ns);
        idem__span_attr_str(s, "http.request.method", method->ptr, method->len);
        idem__span_attr_str(s, "server.address", gw->upstream_host, strlen(gw->upstream_host));
        idem__span_attr_str(s, "url.path", req->target, req->path_len);
        int up_status = req->up.resp.status;
        if (up_status > 0)
            idem__span_attr_int(s, "http.response.status_code", up_status);
        if (req->up_result != IDEM_UP_OK || up_status <= 0)
            idem__span_error(s, req->up_result == IDEM_UP_CONNECT_FAILED ? "connect_failed"
                                : req->up_result == IDEM_UP_TIMEOUT      ? "timeout"
                                : req->up_result == IDEM_UP_BAD_RESPONSE ? "bad_response"
                                                                         : "broken");
        else if (up_status >= 500)
            idem__span_error(s, "5xx");
        idem__otlp_enqueue(gw->otlp, s);
    }
    idem_free(s);
}

/* A request of w from the head_len bytes at head (copied), answering
 * through os, with its target normalised.  NULL when out of memory, or
 * when the target is refused (*target_rc < 0). */
static idem_req_t *req_create(idem_worker_t *w, idem_ostream_t *os, const idem_conn_facts_t *facts,
                              const char *head, size_t head_len, size_t target_len,
                              int *target_rc)
{
    *target_rc = IDEM_TARGET_OK;
    idem_req_t *req = idem_calloc(1, sizeof *req);
    if (!req)
        return NULL;
    /* The normal form is never longer than the target (+2: '/' for an
     * absolute-form target without path, and the NUL). */
    size_t tcap = target_len + 2;
    req->head = idem_malloc(head_len + tcap);
    if (!req->head) {
        idem_free(req);
        return NULL;
    }
    memcpy(req->head, head, head_len);
    idem_http_head_state_t hs = {0};
    int rc = idem__http_parse_request(&hs, req->head, head_len, IDEM_HTTP_MAX_HEAD, &req->msg);
    idem_http_target_t t;
    if (rc > 0) {
        char *norm = req->head + head_len;
        *target_rc =
            idem__http_target_normalize(req->msg.target.ptr, req->msg.target.len, norm, tcap, &t);
        req->target = norm;
        req->target_len = t.len;
        req->path_len = t.path_len;
        req->authority = t.authority;
    }
    if (rc <= 0 || *target_rc != IDEM_TARGET_OK) {
        idem_free(req->head);
        idem_free(req);
        return NULL;
    }
    idem__life_init(&req->life, IDEM_HOLD_CONN); /* the connection's, until on_gone or the end */
    req->w = w;
    req->cfg = idem__config_ref(idem__worker_cfg(w));
    req->os = os;
    req->tls = facts->tls;
    req->proto = facts->proto != NULL ? facts->proto : "HTTP/1.1";
    if (facts->client_cert_sha256 != NULL)
        snprintf(req->client_cert, sizeof req->client_cert, "%s", facts->client_cert_sha256);
    req->t_start_ns = idem_clock_mono_ns();
    req_trace_begin(req);
    req->outcome = IDEM_OUT_PASSTHROUGH;
    idem__buf_init(&req->body, w->gw->cfg->max_request_bytes);
    /* A body of a known length never needs a larger buffer (a buffer's max
     * 0 means no cap). */
    if (req->msg.framing == IDEM_HTTP_BODY_LENGTH && req->msg.content_length > 0)
        req->body.max = (size_t)req->msg.content_length;
    idem__buf_init(&req->resp_body, 0);
    idem_list_push(&w->reqs, &req->link);
    atomic_fetch_add(&w->gw->metrics.in_flight, 1);
    return req;
}

/* ---- answering a request ------------------------------------------------ */

/* Answer req with idemd's own problem; flags IDEM_OS_CLOSE for a refusal
 * after which the connection must end. */
static void req_problem_flags(idem_req_t *req, int status, const char *type, const char *detail,
                              int64_t retry_after, unsigned flags)
{
    req->status = status;
    idem__req_enter(req, IDEM_REQ_ANSWERED);
    idem_ostream_t *os = req->os;
    if (os == NULL)
        return;
    /* Out of memory: the client must not wait for an answer forever. */
    if (idem__ostream_problem(os, status, type, detail, retry_after,
                              idem__config_policy_link(req->cfg), flags) != 0)
        os->ops->abort(os);
    req_stream_over(req);
}

void idem__req_problem(idem_req_t *req, int status, const char *type, const char *detail,
                       int64_t retry_after)
{
    req_problem_flags(req, status, type, detail, retry_after, 0);
}

/* Send r with body[0..n) as the whole answer of req.  One that cannot be
 * written (a field the writer refuses, out of memory) was not written at
 * all: a 500 goes instead, or the connection closes, never half an answer. */
static void req_respond(idem_req_t *req, const idem_http_response_t *r, const void *body,
                        size_t n)
{
    idem_ostream_t *os = req->os;
    if (os == NULL) {
        req->status = r->status;
        idem__req_enter(req, IDEM_REQ_ANSWERED);
        return;
    }
    if (idem__ostream_respond(os, r, 0, body, n) != 0) {
        idem__req_problem(req, 500, "internal", "the response could not be written", 0);
        return;
    }
    req->status = r->status;
    idem__req_enter(req, IDEM_REQ_ANSWERED);
    req_stream_over(req);
}

#define REPLAY_FIELDS_LOCAL 32 /* a replay with more fields lists them on the heap */

/* Replay a stored response (docs/protocol.md section 6, completed), with
 * each of the route's replay_marker fields set to true.  A field of
 * replay_drop_headers is not there to repeat: it was never stored
 * (idem__gw_response_field_stored); one a record from before the policy
 * named it holds is left out here too. */
static void req_replay(idem_req_t *req, const idem_record_t *rec)
{
    const idem_response_t *r = &rec->response;
    const idem_policy_t *p = req->policy;
    idem_http_field_t local[REPLAY_FIELDS_LOCAL];
    size_t n = r->n_headers + p->n_replay_marker;
    idem_http_field_t *f = n <= REPLAY_FIELDS_LOCAL ? local : calloc(n, sizeof *f);
    if (f == NULL) {
        idem__req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < r->n_headers; i++) {
        idem_slice_t name = {r->headers[i].name, r->headers[i].name_len};
        bool dropped = false;
        for (size_t d = 0; d < p->n_replay_drop_headers && !dropped; d++)
            dropped = idem__slice_eq_ci(name, p->replay_drop_headers[d]);
        for (size_t d = 0; d < p->n_replay_marker && !dropped; d++)
            dropped = idem__slice_eq_ci(name, p->replay_marker[d]);
        if (!dropped)
            f[k++] = (idem_http_field_t){name, {r->headers[i].value, r->headers[i].value_len}};
    }
    for (size_t i = 0; i < p->n_replay_marker; i++)
        f[k++] = (idem_http_field_t){{p->replay_marker[i], strlen(p->replay_marker[i])},
                                     {"true", 4}};
    n = k;
    /* The standard reason phrase: a record keeps the status, not the upstream's words. */
    idem_http_response_t resp = {.status = r->status, .fields = f, .n_fields = n};
    req_respond(req, &resp, r->body, r->body_len);
    if (f != local)
        free(f);
}

/* The upstream's fields that its answer to the client carries, into f (room
 * for IDEM_HTTP_MAX_HEADERS + 1): hop-by-hop fields and Content-Length are
 * left out (the writer frames the answer itself), Idempotency-Bypassed is
 * added when the store was passed by.  @return how many. */
static size_t relayed_fields(const idem_req_t *req, idem_http_field_t *f)
{
    const idem_http_msg_t *m = &req->up.resp;
    size_t n = 0;
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *uf = &m->fields[i];
        if (idem__gw_response_field_relayed(req->policy, m, uf->name))
            f[n++] = *uf;
    }
    if (req->bypassed)
        f[n++] = (idem_http_field_t){{"Idempotency-Bypassed", 20}, {"store-unavailable", 17}};
    return n;
}

/* The upstream's Content-Length of m, which the parser checked (one field,
 * digits, at most 2^53).  @return whether m has one. */
static bool upstream_length(const idem_http_msg_t *m, uint64_t *out)
{
    const idem_http_field_t *cl = idem__http_find(m, "Content-Length");
    if (cl == NULL || cl->value.len == 0)
        return false;
    uint64_t n = 0;
    for (size_t i = 0; i < cl->value.len; i++) {
        if (cl->value.ptr[i] < '0' || cl->value.ptr[i] > '9' || n > (UINT64_MAX - 9) / 10)
            return false;
        n = n * 10 + (uint64_t)(cl->value.ptr[i] - '0');
    }
    *out = n;
    return true;
}

/* The upstream's captured response, relayed as the client's answer. */
void idem__req_respond_upstream(idem_req_t *req)
{
    const idem_http_msg_t *m = &req->up.resp;
    idem_http_field_t f[IDEM_HTTP_MAX_HEADERS + 1];
    idem_http_response_t r = {.status = m->status, .reason = m->reason, .fields = f,
                              .n_fields = relayed_fields(req, f)};
    if (m->framing != IDEM_HTTP_BODY_NONE) {
        req_respond(req, &r, req->resp_body.data, req->resp_body.len);
        return;
    }
    /* No body (HEAD, 1xx, 204, 304).  The answer to HEAD keeps the
     * upstream's length: it tells the size of what GET would send. */
    if (upstream_length(m, &r.content_length))
        r.framing = IDEM_HTTP_BODY_LENGTH;
    idem_ostream_t *os = req->os;
    if (os != NULL && os->ops->start(os, &r, 0) != 0) {
        idem__req_problem(req, 500, "internal", "the response could not be written", 0);
        return;
    }
    req->status = m->status;
    idem__req_enter(req, IDEM_REQ_ANSWERED);
    if (os != NULL) {
        os->ops->send(os, NULL, 0, true);
        req_stream_over(req);
    }
}

/* Answer as a repeat of req would be answered, from the decision on rec. */
static void req_answer_decision(idem_req_t *req, idem_decision_t d, const idem_record_t *rec)
{
    switch (d.kind) {
    case IDEM_DECIDE_REPLAY:
        req->outcome = IDEM_OUT_REPLAY;
        req->fence = rec->fence;
        req_replay(req, rec);
        break;
    case IDEM_DECIDE_MISMATCH:
        req->outcome = IDEM_OUT_MISMATCH;
        idem__req_problem(req, 422, "key-reused",
                          "this Idempotency-Key was used with a different request", 0);
        break;
    case IDEM_DECIDE_IN_FLIGHT:
        req->outcome = IDEM_OUT_IN_FLIGHT;
        idem__req_problem(req, 409, "in-flight",
                          "a request with this Idempotency-Key is still being processed",
                          d.retry_after_s);
        break;
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
    case IDEM_DECIDE_RECONCILE:
        req->outcome = IDEM_OUT_OUTCOME_UNKNOWN;
        if (req->policy->on_unknown_outcome == IDEM_UNKNOWN_RECONCILE)
            idem__req_problem(req, 409, "upstream-outcome-unknown",
                              "the outcome of the first request with this key is unknown; "
                              "idemd is asking the upstream what became of it: retry later",
                              1);
        else
            idem__req_problem(req, 409, "upstream-outcome-unknown",
                              "the outcome of the first request with this key is unknown; an "
                              "operator "
                              "must remove the key before it can run again",
                              d.retry_after_s);
        break;
    case IDEM_DECIDE_NOT_RETAINED:
        req->outcome = IDEM_OUT_NOT_RETAINED;
        idem__req_problem(req, 409, "response-not-retained",
                          "the first response with this key was too large to keep; it is not run "
                          "again",
                          0);
        break;
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        /* Only reachable when a stale owner re-reads: the key is free again
         * but this request already ran, so it must not run again here. */
        req->outcome = IDEM_OUT_IN_FLIGHT;
        idem__req_problem(req, 409, "in-flight", "the lease on this key was lost; retry", 1);
        break;
    }
}

/* The stored record of req's key does not decode (its checksum or framing
 * is wrong: damaged on disk or in the store).  Never a wrong answer, and
 * never a second run either (not even with on_store_error: open): 500,
 * logged with the key, counted, until an operator removes the record. */
static void req_corrupt_record(idem_req_t *req)
{
    req->outcome = IDEM_OUT_CORRUPT_RECORD;
    req->keyed = false;
    idem__log(req->w->gw, "error",
              "the stored record of key %s (scope %.12s) is damaged (its checksum or framing "
              "does not match); it is not replayed and not run again: remove it with "
              "DELETE /keys/{key}?scope= on the admin listener to let the key run again",
              req->id.key, req->id.scope);
    idem__req_problem(req, 500, "record-damaged",
                      "the stored record of this Idempotency-Key is damaged; it is neither "
                      "replayed nor run again until an operator removes it",
                      0);
}

void idem__req_store_unavailable(idem_req_t *req, const char *detail)
{
    req->outcome = IDEM_OUT_STORE_ERROR;
    idem__req_problem(req, 503, "store-unavailable", detail, 1);
}

/* ---- reading the store ------------------------------------------------------ */

idem_err_t idem__gw_store_get(idem_gw_t *gw, const idem_key_id_t *id, int64_t now_ms,
                              idem_record_t *rec)
{
    atomic_fetch_add_explicit(&gw->metrics.store_gets, 1, memory_order_relaxed);
    return idem_store_get(gw->store, id, now_ms, rec);
}

/* A completed record came from the store or was just written: keep it for
 * the next repeat (local_cache), unless a delete was heard since the lookup
 * began (it may be this record's). */
static void req_cache_record(idem_req_t *req, const idem_record_t *rec)
{
    if (rec->state == IDEM_STATE_COMPLETED)
        idem__cache_put_since(req_gw(req)->cache, req->cache_gen, &req->id, rec);
}

/* ---- the writer round trip ------------------------------------------------ */

/* The hold a job of req takes: a renewal is told apart, the rest are one kind. */
static idem_hold_t job_hold(const idem_req_t *req, const idem_wjob_t *job)
{
    return job == &req->renew_job ? IDEM_HOLD_RENEW : IDEM_HOLD_JOB;
}

void idem__req_submit(idem_req_t *req, idem_wjob_t *job, idem_wjob_cb cb)
{
    job->cb = cb;
    job->data = req;
    if (req->traced && job == &req->job)
        req->t_job_ns = idem_clock_mono_ns();
    req_hold(req, job_hold(req, job));
    idem__worker_submit(req->w, job);
}

void idem__req_job_init(idem_req_t *req, idem_wjob_t *job, idem_op_kind_t kind)
{
    memset(&job->op, 0, sizeof job->op);
    job->op.kind = kind;
    job->op.id = req->id;
    job->op.fence = req->fence;
}

/* A job is back from the store: run its callback on this loop. */
void idem__req_job_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    idem_hold_t h = job_hold(req, job); /* the callback may queue the job again */
    if (req->traced && job == &req->job)
        req->store_ns += idem_clock_mono_ns() - req->t_job_ns;
    job->cb(job);
    idem__req_release(req, h);
}

/* ---- lease renewal ---------------------------------------------------------- */

static idem_err_t job_store_err(const idem_wjob_t *job);

/* The lines logged here and by the completion below name the key and the
 * fence, so that a second run of a key can be told apart by what its owner
 * logged (tests/chaos/chaos_history.py): a lease that could not be renewed
 * (the store failed, or answered only after the lease had ended) or was
 * lost, a completion the store refused. */

/* Our lease has ended by our clock and no renewal has come back to extend
 * it: the store failed to renew it in time (an outage, a failover, a store
 * too slow to answer within the lease), and another idemd may now take
 * the key over and run it again (docs/guarantees.md).  Said once. */
static void req_lease_lapsed(idem_req_t *req, int64_t now)
{
    if (req->lapse_logged || now < req->lease_until_ms)
        return;
    req->lapse_logged = true;
    idem__log(req->w->gw, "warn",
              "could not renew the lease on key %s (fence %llu) in time: it ended %lld ms ago "
              "with no renewal back from the store; another idemd may take the key over",
              req->id.key, (unsigned long long)req->fence,
              (long long)(now - req->lease_until_ms));
}

/* The store refused our fence (what) while our claim was still ours to
 * use: another claim took the key.  After our lease had ended unrenewed,
 * that is the store failing to renew it in time; before, the lease was lost
 * while it was live: an operator removed the record, or the store lost our
 * writes. */
static void req_log_lease_lost(idem_req_t *req, const char *what)
{
    int64_t now = idem_clock_now(NULL);
    if (now >= req->lease_until_ms) {
        req_lease_lapsed(req, now);
        idem__log(req->w->gw, "warn", "key %s (fence %llu) was taken over after its lease ended: %s",
                  req->id.key, (unsigned long long)req->fence, what);
    } else {
        idem__log(req->w->gw, "warn", "lease on key %s (fence %llu) was lost while its request "
                  "ran: %s", req->id.key, (unsigned long long)req->fence, what);
    }
}

static void on_renew_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    idem_err_t store_err = job_store_err(job);
    int64_t now = idem_clock_now(NULL);
    if (job->batch_err == IDEM_OK && job->op.err == IDEM_OK) {
        if (req->renewing && now >= req->lease_until_ms)
            idem__log(req->w->gw, "warn",
                      "the renewal of key %s (fence %llu) came back %lld ms after the lease had "
                      "ended, and was written: the store is slow",
                      req->id.key, (unsigned long long)req->fence,
                      (long long)(now - req->lease_until_ms));
        req->lease_until_ms = job->op.lease_until_ms;
    }
    if (job->batch_err == IDEM_OK && job->op.err == IDEM_E_FENCE &&
        req->life.state == IDEM_REQ_FORWARDING)
        req_log_lease_lost(req, "its renewal was refused");
    else if (store_err != IDEM_OK && req->renewing)
        idem__log(req->w->gw, "warn",
                  "could not renew the lease on key %s (fence %llu): %s; it ends in %lld ms "
                  "unless a renewal gets through",
                  req->id.key, (unsigned long long)req->fence, idem_strerror(store_err),
                  (long long)(req->lease_until_ms - idem_clock_now(NULL)));
}

static void on_renew_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    /* One renewal at a time: a slow store skips a beat rather than queue,
     * and is named once the lease has ended while it kept the renewal. */
    if (idem__life_holds(&req->life, IDEM_HOLD_RENEW) > 0) {
        req_lease_lapsed(req, idem_clock_now(NULL));
        return;
    }
    idem__req_job_init(req, &req->renew_job, IDEM_OP_RENEW);
    req->renew_job.op.lease_until_ms = idem_clock_now(NULL) + req->policy->lease_ms;
    idem__req_submit(req, &req->renew_job, on_renew_done);
}

/* The request's one timer (renewal, polling while waiting, completion
 * retries: never two at once), made on first use: most requests never need
 * one.  An armed timer holds the request; a one-shot timer's callback keeps
 * that hold until it returns (req_timer_fired). */
static void req_timer_start(idem_req_t *req, uv_timer_cb cb, uint64_t timeout, uint64_t repeat)
{
    if (!req->timer_made) {
        uv_timer_init(&req->w->loop, &req->timer);
        req->timer.data = req;
        req->timer_made = true;
    }
    if (!uv_is_active((uv_handle_t *)&req->timer))
        req_hold(req, IDEM_HOLD_TIMER);
    uv_timer_start(&req->timer, cb, timeout, repeat);
}

static void req_timer_stop(idem_req_t *req)
{
    if (req->timer_made && uv_is_active((uv_handle_t *)&req->timer)) {
        uv_timer_stop(&req->timer);
        idem__req_release(req, IDEM_HOLD_TIMER);
    }
}

/* The end of a one-shot timer's callback: the hold it kept goes. */
static void req_timer_fired(idem_req_t *req) { idem__req_release(req, IDEM_HOLD_TIMER); }

static void req_start_renewing(idem_req_t *req)
{
    uint64_t every = (uint64_t)(req->policy->lease_ms / 3);
    if (every < 10)
        every = 10;
    req->renewing = true;
    req_timer_start(req, on_renew_timer, every, every);
}

/* The lease needs no more renewing: the upstream failed, or its outcome is
 * written.  (While a completion waits for the store, the lease is still
 * renewed: a commit slower than what is left of the lease must not let
 * another instance take the key over and run it again.) */
static void req_stop_renewing(idem_req_t *req)
{
    if (!req->renewing)
        return;
    req->renewing = false;
    req_timer_stop(req);
}

/* ---- the upstream's outcome ------------------------------------------------- */

static bool is_release_status(const idem_policy_t *p, int status)
{
    for (size_t i = 0; i < p->n_release_statuses; i++)
        if (p->release_statuses[i] == status)
            return true;
    return false;
}

/* The record was taken over while this request ran: answer as a repeat. */
static void req_answer_as_repeat(idem_req_t *req)
{
    idem_record_t rec;
    int64_t now = idem_clock_now(NULL);
    idem_err_t err = idem__gw_store_get(req_gw(req), &req->id, now, &rec);
    if (err == IDEM_OK) {
        idem_decision_t d = idem_decide(&rec, req->fp, now);
        req_answer_decision(req, d, &rec);
        idem_record_cleanup(&rec);
    } else if (err == IDEM_E_NOTFOUND) {
        req->outcome = IDEM_OUT_IN_FLIGHT;
        idem__req_problem(req, 409, "in-flight", "the lease on this key was lost; retry", 1);
    } else if (err == IDEM_E_CORRUPT) {
        req_corrupt_record(req);
    } else {
        idem__req_store_unavailable(req, "the store did not answer");
    }
}


/* Our completion was written: keep the record for repeats (local_cache). */
static void req_cache_completion(idem_req_t *req, const idem_wjob_t *job)
{
    if (job->op.kind != IDEM_OP_COMPLETE || req_gw(req)->cache == NULL)
        return;
    idem_record_t done = {
        .state = IDEM_STATE_COMPLETED,
        .flags = job->op.flags,
        .fence = req->fence,
        .expires_at_ms = job->op.expires_at_ms,
        .response = req->store_resp,
    };
    memcpy(done.fingerprint, req->fp, IDEM_FP_LEN);
    req_cache_record(req, &done);
}

static void on_outcome_stored(idem_wjob_t *job);

#define COMPLETE_RETRY_FIRST_MS 100
#define COMPLETE_RETRY_MAX_MS 2000

static void on_complete_retry_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    idem__req_submit(req, &req->job, on_outcome_stored);
    req_timer_fired(req);
}

/* The upstream answered but the store refused the completion: answer the
 * client now (503), and keep offering the completion to the store while our
 * lease lasts.  No one else can claim the key before the lease ends, so if
 * the store comes back in time the record is completed as if nothing had
 * happened and a retry (409 until then) gets the replay; only an outage
 * longer than the lease leaves the key to run again (docs/guarantees.md). */
static void req_complete_later(idem_req_t *req, idem_err_t err)
{
    if (!req_answered(req)) {
        idem__log(req->w->gw, "error",
                  "could not store the outcome of key %s (fence %llu): %s; retrying while the "
                  "lease lasts",
                  req->id.key, (unsigned long long)req->fence, idem_strerror(err));
        if (req->streaming)
            idem__req_abort_upstream(req);
        idem__req_store_unavailable(req, "the upstream answered but its response could not be "
                                         "recorded yet; a retry gets the recorded answer once "
                                         "the store is back");
    }
    int64_t delay = COMPLETE_RETRY_FIRST_MS
                    << (req->complete_tries < 5 ? req->complete_tries : 5);
    if (delay > COMPLETE_RETRY_MAX_MS)
        delay = COMPLETE_RETRY_MAX_MS;
    req->complete_tries++;
    if (req->w->stopping || idem_clock_now(NULL) + delay >= req->lease_until_ms) {
        idem__log(req->w->gw, "error",
                  "gave up storing the outcome of key %s (fence %llu) after %d tries: it stays "
                  "in progress until its lease ends",
                  req->id.key, (unsigned long long)req->fence, req->complete_tries);
        return;
    }
    req_timer_start(req, on_complete_retry_timer, (uint64_t)delay, 0);
}

/* What a job's store work came to: the batch's error, else its own op's
 * (an op the store refused alone: out of memory, too large, full), where a
 * fence lost and a release of a record already gone are outcomes, not
 * errors. */
static idem_err_t job_store_err(const idem_wjob_t *job)
{
    if (job->batch_err != IDEM_OK)
        return job->batch_err;
    idem_err_t e = job->op.err;
    if (e == IDEM_E_FENCE || (job->op.kind == IDEM_OP_RELEASE && e == IDEM_E_NOTFOUND))
        return IDEM_OK;
    return e;
}

static void on_outcome_stored(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    req_stop_renewing(req); /* written, or refused: the lease's renewal ends either way */
    idem_err_t err = job_store_err(job);
    if (err != IDEM_OK && job->op.kind == IDEM_OP_COMPLETE) {
        req_complete_later(req, err);
        return;
    }
    if (req_answered(req)) {
        /* A late completion after a store failure: the client has its 503. */
        if (job->batch_err == IDEM_OK && job->op.err == IDEM_OK) {
            idem__log(req->w->gw, "info",
                      "stored the outcome of key %s (fence %llu) after %d tries", req->id.key,
                      (unsigned long long)req->fence, req->complete_tries + 1);
            req_cache_completion(req, job);
        } else if (job->batch_err == IDEM_OK && job->op.err == IDEM_E_FENCE) {
            req_log_lease_lost(req, "its completion was refused");
        }
        return;
    }
    if (err != IDEM_OK) {
        idem__log(req->w->gw, "error", "could not store the outcome of key %s: %s", req->id.key,
                  idem_strerror(err));
        if (req->streaming)
            idem__req_abort_upstream(req);
        idem__req_store_unavailable(req, "the upstream answered but its response could not be "
                                         "recorded");
        return;
    }
    if (job->op.err == IDEM_E_FENCE) {
        req_log_lease_lost(req, job->op.kind == IDEM_OP_COMPLETE
                                    ? "its completion was refused; answered as a repeat"
                                    : "its release was refused; answered as a repeat");
        if (req->streaming)
            idem__req_abort_upstream(req);
        req_answer_as_repeat(req);
        return;
    }
    req_cache_completion(req, job);
    if (req->streaming)
        idem__req_start_stream(req);
    else
        idem__req_respond_upstream(req);
}

/* Build the list of response headers that a replay repeats. */
static int req_collect_store_headers(idem_req_t *req)
{
    const idem_http_msg_t *m = &req->up.resp;
    req->store_headers = idem_calloc(m->n_fields ? m->n_fields : 1, sizeof *req->store_headers);
    if (!req->store_headers)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        if (!idem__gw_response_field_stored(req->policy, m, f->name))
            continue;
        req->store_headers[n++] = (idem_header_t){f->name.ptr, f->name.len, f->value.ptr, f->value.len};
    }
    req->n_store_headers = n;
    return 0;
}

/* Record the upstream's answer (fenced), then answer the client. */
static void req_store_outcome(idem_req_t *req, bool retained)
{
    const idem_policy_t *p = req->policy;
    int status = req->up.resp.status;
    idem__req_enter(req, IDEM_REQ_RECORDING);
    int64_t now = idem_clock_now(NULL);
    if (is_release_status(p, status)) {
        idem__req_job_init(req, &req->job, IDEM_OP_RELEASE);
        idem__req_submit(req, &req->job, on_outcome_stored);
        return;
    }
    if (req_collect_store_headers(req) != 0) {
        req_stop_renewing(req); /* nothing will be written: the lease runs out */
        if (req->streaming)
            idem__req_abort_upstream(req);
        idem__req_store_unavailable(req, "out of memory");
        return;
    }
    idem_response_t *resp = &req->store_resp;
    resp->status = status;
    resp->headers = req->store_headers;
    resp->n_headers = req->n_store_headers;
    if (retained) {
        resp->body = (const uint8_t *)req->resp_body.data;
        resp->body_len = req->resp_body.len;
    }
    idem__req_job_init(req, &req->job, IDEM_OP_COMPLETE);
    req->job.op.response = resp;
    req->job.op.flags = retained ? 0 : IDEM_REC_NOT_RETAINED;
    req->job.op.expires_at_ms = now + (status >= 500 ? p->failure_ttl_ms : p->key_ttl_ms);
    idem__req_submit(req, &req->job, on_outcome_stored);
}


/* The upstream answered: whole (captured within the limit), or its head
 * came with a body over the capture limit, to be streamed after a
 * body-less completion. */
static void req_upstream_answered(idem_req_t *req, bool whole)
{
    if (whole)
        idem__hist_observe(&req_gw(req)->metrics.upstream_latency,
                           idem_clock_mono_ns() - req->t_up_ns);
    else
        req->streaming = true;
    if (req->token_spent && is_release_status(req->policy, req->up.resp.status)) {
        idem__req_give_token_back(req);
        return;
    }
    if (!req->keyed) {
        if (whole)
            idem__req_respond_upstream(req);
        else
            idem__req_start_stream(req);
        return;
    }
    req_store_outcome(req, whole);
}

/* The answer to a request whose upstream call failed (docs/protocol.md section 7). */
void idem__req_answer_failure(idem_req_t *req, idem_up_result_t why)
{
    if (why == IDEM_UP_CONNECT_FAILED)
        idem__req_problem(req, 502, "upstream-unreachable", "could not connect to the upstream",
                          0);
    else if (why == IDEM_UP_TIMEOUT)
        idem__req_problem(req, 504, "upstream-outcome-unknown",
                          "the upstream did not answer within upstream_timeout; the request may "
                          "or may not have taken effect",
                          0);
    else
        idem__req_problem(req, 502, "upstream-outcome-unknown",
                          why == IDEM_UP_BAD_RESPONSE
                              ? "the upstream's answer was not valid HTTP; the request may or "
                                "may not "
                                "have taken effect"
                              : "the connection to the upstream broke before a whole response; "
                                "the "
                                "request may or may not have taken effect",
                          0);
}

/* A release (nothing sent) or hold (outcome unknown) was applied: only now
 * is the client answered, so that a retry after the answer finds the key
 * free (release) or held (hold), never still in flight. */
static void on_failure_recorded(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    idem_err_t err = job_store_err(job);
    if (err != IDEM_OK) {
        /* The key is left in progress (a retry gets 409 until its lease
         * ends) and a hold was not written: say so rather than 502/504. */
        idem__log(req->w->gw, "error", "could not record the failure of key %s: %s", req->id.key,
                  idem_strerror(err));
        idem__req_store_unavailable(req,
                                    "the upstream call failed and the store could not record it");
        return;
    }
    if (job->batch_err == IDEM_OK && job->op.err == IDEM_E_FENCE)
        req_log_lease_lost(req, job->op.kind == IDEM_OP_HOLD ? "its hold was refused"
                                                              : "its release was refused");
    else if (job->op.kind == IDEM_OP_HOLD &&
             req->policy->on_unknown_outcome == IDEM_UNKNOWN_RECONCILE)
        idem__reconcile_track(&req->w->recon, req->cfg, req->policy, &req->id, req->fence,
                              job->op.expires_at_ms, false);
    idem__req_answer_failure(req, req->up_result);
}

static void req_upstream_failed(idem_req_t *req, idem_up_result_t why)
{
    req_stop_renewing(req);
    idem__req_enter(req, IDEM_REQ_RECORDING);
    req->up_result = why;
    req->outcome = why == IDEM_UP_CONNECT_FAILED ? IDEM_OUT_UPSTREAM_UNREACHABLE
                                                 : IDEM_OUT_OUTCOME_UNKNOWN;
    if (req->token_spent && why == IDEM_UP_CONNECT_FAILED) {
        idem__req_give_token_back(req);
        return;
    }
    if (req->keyed && why == IDEM_UP_CONNECT_FAILED) {
        /* Nothing was sent: the key is free to run again. */
        idem__req_job_init(req, &req->job, IDEM_OP_RELEASE);
        idem__req_submit(req, &req->job, on_failure_recorded);
        return;
    }
    if (req->keyed && req->policy->on_unknown_outcome == IDEM_UNKNOWN_RECONCILE) {
        /* Held under our lease, which reconcile.c renews while it asks. */
        int64_t now = idem_clock_now(NULL);
        idem__req_job_init(req, &req->job, IDEM_OP_HOLD);
        req->job.op.lease_until_ms = now + req->policy->lease_ms;
        req->job.op.expires_at_ms = now + req->policy->key_ttl_ms;
        idem__req_submit(req, &req->job, on_failure_recorded);
        return;
    }
    if (req->keyed && req->policy->on_unknown_outcome == IDEM_UNKNOWN_HOLD) {
        int64_t now = idem_clock_now(NULL);
        idem__req_job_init(req, &req->job, IDEM_OP_HOLD);
        req->job.op.lease_until_ms = now + req->policy->key_ttl_ms;
        req->job.op.expires_at_ms = now + req->policy->key_ttl_ms;
        idem__req_submit(req, &req->job, on_failure_recorded);
        return;
    }
    /* Not keyed, or expire: the record stays in_progress until its lease
     * runs out, and nothing needs writing. */
    idem__req_answer_failure(req, why);
}

/* ---- streaming a response over the capture limit --------------------------- */

static bool req_stream_data(idem_req_t *req, const char *p, size_t n);

void idem__req_start_stream(idem_req_t *req)
{
    idem_ostream_t *os = req->os;
    if (!os) {
        idem__req_abort_upstream(req); /* no one to relay to */
        return;
    }
    const idem_http_msg_t *m = &req->up.resp;
    idem_http_field_t f[IDEM_HTTP_MAX_HEADERS + 1];
    idem_http_response_t r = {.status = m->status, .reason = m->reason, .fields = f,
                              .n_fields = relayed_fields(req, f),
                              .content_length = m->content_length};
    /* The upstream's length when it sent one; else the connection frames
     * a body whose length it does not know (chunked, or to its close). */
    r.framing = m->framing == IDEM_HTTP_BODY_LENGTH ? IDEM_HTTP_BODY_LENGTH : IDEM_HTTP_BODY_EOF;
    if (os->ops->start(os, &r, 0) != 0) {
        /* Nothing went to the client yet: it hears why instead of half a head. */
        idem__req_abort_upstream(req);
        idem__req_problem(req, 500, "internal", "the response could not be written", 0);
        return;
    }
    req->status = m->status;
    idem__req_enter(req, IDEM_REQ_RELAYING);
    /* The captured piece first; the upstream reads on only if the client
     * takes it (else on_proceed resumes it). */
    bool wait = req->resp_body.len > 0 &&
                req_stream_data(req, req->resp_body.data, req->resp_body.len);
    idem__buf_cleanup(&req->resp_body);
    if (!wait)
        idem__upstream_req_resume(&req->up);
}

/* Relay a piece of a streamed body.  @return true when the client lags and
 * the upstream should pause until on_proceed. */
static bool req_stream_data(idem_req_t *req, const char *p, size_t n)
{
    idem_ostream_t *os = req->os;
    if (!os)
        return false;
    return !os->ops->send(os, p, n, false);
}

static void req_stream_end(idem_req_t *req, bool complete)
{
    idem__req_enter(req, IDEM_REQ_ANSWERED);
    idem_ostream_t *os = req->os;
    if (!os)
        return;
    if (complete)
        os->ops->send(os, NULL, 0, true);
    else
        os->ops->abort(os); /* the body was cut short: the client must see that */
    req_stream_over(req);
}

/* ---- the upstream call ------------------------------------------------------- */

void idem__req_abort_upstream(idem_req_t *req)
{
    if (!idem__upstream_req_active(&req->up))
        return;
    idem__upstream_req_cancel(&req->up);
    idem__req_release(req, IDEM_HOLD_UPSTREAM);
}

static idem_up_body_t on_up_body(idem_upstream_req_t *ur, const char *p, size_t n)
{
    idem_req_t *req = ur->data;
    idem_up_body_t want = IDEM_UP_BODY_MORE;
    /* What follows may end the call (a client gone), and the request with it. */
    req_hold(req, IDEM_HOLD_CALL);
    if (req->streaming) { /* relaying, after the outcome was stored */
        if (req_stream_data(req, p, n))
            want = IDEM_UP_BODY_PAUSE;
    } else if (idem__buf_append(&req->resp_body, p, n) != 0) {
        want = IDEM_UP_BODY_REFUSE;
    } else if (req->resp_body.len > req->capture_limit) {
        /* Too large to keep: the rest goes straight to the client once the
         * outcome is recorded; no timeout runs meanwhile.  The pause is
         * the explicit one, not an answer of PAUSE: a keyless answer
         * starts its stream right here, and when the client takes the
         * captured piece at once the stream resumes the call before this
         * returns; an answer of PAUSE would then stop it again, with
         * nothing left to resume it.  upstream.c stops after this piece
         * while the call is still paused (the outcome being stored, or a
         * client that did not take the piece), and reads on if not. */
        idem__upstream_req_pause(ur);
        req_upstream_answered(req, false);
    }
    idem__req_release(req, IDEM_HOLD_CALL);
    return want;
}

static void on_up_done(idem_upstream_req_t *ur)
{
    idem_req_t *req = ur->data;
    if (req->traced)
        req->t_up_end_ns = idem_clock_mono_ns();
    if (req->streaming)
        req_stream_end(req, true);
    else
        req_upstream_answered(req, true);
    idem__req_release(req, IDEM_HOLD_UPSTREAM);
}

static void on_up_failure(idem_upstream_req_t *ur, idem_up_result_t why)
{
    idem_req_t *req = ur->data;
    if (req->traced)
        req->t_up_end_ns = idem_clock_mono_ns();
    if (idem__upstream_req_reason(ur)[0] != '\0') /* a TLS failure says why */
        idem__log(req->w->gw, "warn", "upstream %s: %s", req->w->gw->upstream_hostport,
                  idem__upstream_req_reason(ur));
    if (req->streaming)
        req_stream_end(req, false);
    else
        req_upstream_failed(req, why);
    idem__req_release(req, IDEM_HOLD_UPSTREAM);
}

static const idem_upstream_cbs_t up_cbs = {
    .on_body = on_up_body,
    .on_done = on_up_done,
    .on_failure = on_up_failure,
};

/* Send req to the upstream: the head as request_plan.c rewrites it, then
 * the decoded body, from the request's own buffer.  What comes back arrives
 * in the callbacks above, on a later loop turn. */
void idem__req_forward(idem_req_t *req)
{
    idem_gw_t *gw = req_gw(req);
    req->t_up_ns = idem_clock_mono_ns();
    req->capture_limit = req->policy->max_response_bytes;
    idem_buf_t head;
    idem__buf_init(&head, 0);
    idem_gw_request_t rq = idem_req_view(req);
    /* Tracing on: the upstream's parent is idemd's client span. */
    char traceparent[IDEM_TRACEPARENT_LEN + 1];
    if (req->trace_on) {
        idem_trace_ctx_t up = req->trace;
        memcpy(up.span_id, req->up_span_id, sizeof up.span_id);
        idem__otlp_traceparent_format(&up, traceparent);
        rq.traceparent = traceparent;
    }
    bool built = idem__gw_upstream_head(&head, req->cfg, gw->upstream_hostport, &rq, req->keyed,
                                        req->fence) == 0;
    if (!built)
        idem__buf_cleanup(&head); /* out of memory: the call fails, nothing sent */
    idem__req_enter(req, IDEM_REQ_FORWARDING);
    req_hold(req, IDEM_HOLD_UPSTREAM);
    req->up.data = req;
    idem__upstream_req_start(&req->w->up, &req->up, &up_cbs, built ? &head : NULL, req->body.data,
                             req->body.len, req->msg.method);
}

/* ---- dispatch: docs/protocol.md sections 2-7 ------------------------------ */

static void req_passthrough(idem_req_t *req)
{
    req->keyed = false;
    if (req->outcome != IDEM_OUT_BYPASSED)
        req->outcome = IDEM_OUT_PASSTHROUGH;
    idem__req_forward(req);
}

void idem__req_store_error(idem_req_t *req, idem_err_t err)
{
    if (req->cfg->on_store_error == IDEM_STORE_ERR_OPEN) {
        req->bypassed = true;
        req->outcome = IDEM_OUT_BYPASSED;
        req_passthrough(req);
        return;
    }
    idem__req_store_unavailable(req, err == IDEM_E_STORE_FULL
                                         ? "the idempotency store is full"
                                         : "the idempotency store did not answer");
}

static void on_wait_timer(uv_timer_t *t);

/* A repeat found its key in flight. */
static void req_in_flight(idem_req_t *req, idem_decision_t d)
{
    int64_t now = idem_clock_now(NULL);
    if (req->policy->on_conflict == IDEM_CONFLICT_WAIT && d.kind == IDEM_DECIDE_IN_FLIGHT) {
        if (req->wait_deadline_ms == 0)
            req->wait_deadline_ms = now + req->policy->wait_timeout_ms;
        if (now < req->wait_deadline_ms && !req->w->stopping) {
            req_timer_start(req, on_wait_timer, WAIT_POLL_MS, 0);
            return;
        }
        /* Waited long enough: answer in-flight with the time left. */
    }
    req_answer_decision(req, d, NULL);
}

/* A claim that comes back from the store with less of its lease left than
 * a renewal period (a store that queued it for seconds: a failover, a
 * restart) is not forwarded: before the first renewal could land, another
 * instance may take the key over and run it again while this one runs it
 * (docs/guarantees.md allows a second run only after the owner died or
 * lost its store while the request was at the upstream).  Nothing was
 * sent; the client gets 503 and its retry takes the key over once the
 * lease has ended.  true when the request was answered so. */
static bool req_claim_too_late(idem_req_t *req)
{
    int64_t left = req->lease_until_ms - idem_clock_now(NULL);
    if (left > req->policy->lease_ms / 3)
        return false;
    idem__log(req->w->gw, "warn",
              "the claim of key %s (fence %llu) came back from the store with %lld ms of its "
              "lease left; not forwarded",
              req->id.key, (unsigned long long)req->fence, (long long)left);
    idem__req_store_unavailable(req, "the idempotency store answered too late to hold the key; "
                                     "retry");
    return true;
}

static void on_claim_done(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    if (job->batch_err != IDEM_OK) {
        idem__log(req->w->gw, "error", "store: %s", idem_strerror(job->batch_err));
        idem__req_store_error(req, job->batch_err);
        return;
    }
    if (job->op.err == IDEM_E_CORRUPT) {
        req_corrupt_record(req);
        return;
    }
    if (job->op.err != IDEM_OK) {
        /* The store refused this op alone (out of memory, full): its
         * decision is empty, and answering it would answer nothing. */
        idem__log(req->w->gw, "error", "store: claim of key %s: %s", req->id.key,
                  idem_strerror(job->op.err));
        idem_record_cleanup(&job->op.record);
        idem__req_store_error(req, job->op.err);
        return;
    }
    idem_decision_t d = job->op.decision;
    /* Take the record out of the job first: acting on the decision may
     * queue the same job again (a release after a failed connect). */
    idem_record_t rec = job->op.record;
    memset(&job->op.record, 0, sizeof job->op.record);
    switch (d.kind) {
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        req->fence = d.fence;
        if (req_claim_too_late(req)) {
            idem_record_cleanup(&rec);
            return;
        }
        req->outcome = d.kind == IDEM_DECIDE_CLAIM ? IDEM_OUT_NEW : IDEM_OUT_TAKEOVER;
        if (req->wait_deadline_ms)
            req->outcome = IDEM_OUT_NEW;
        req_start_renewing(req);
        idem__req_forward(req);
        break;
    case IDEM_DECIDE_IN_FLIGHT:
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        req_in_flight(req, d);
        break;
    case IDEM_DECIDE_RECONCILE:
        /* The held key's owner is gone: this claim took its lease, and this
         * worker asks the upstream now; the repeat itself is answered as
         * the hold's would be. */
        idem__reconcile_track(&req->w->recon, req->cfg, req->policy, &req->id, d.fence,
                              idem_clock_now(NULL) + d.retry_after_s * 1000, true);
        req_in_flight(req, d);
        break;
    default:
        if (d.kind == IDEM_DECIDE_REPLAY)
            req_cache_record(req, &rec);
        req_answer_decision(req, d, &rec);
        break;
    }
    idem_record_cleanup(&rec);
}

static void req_claim(idem_req_t *req)
{
    const idem_policy_t *p = req->policy;
    int64_t now = idem_clock_now(NULL);
    idem__req_job_init(req, &req->job, IDEM_OP_CLAIM);
    memcpy(req->job.op.fp, req->fp, IDEM_FP_LEN);
    req->job.op.now_ms = now;
    req->job.op.lease_until_ms = now + p->lease_ms;
    req->job.op.expires_at_ms = now + p->key_ttl_ms;
    req->lease_until_ms = req->job.op.lease_until_ms;
    idem__req_submit(req, &req->job, on_claim_done);
}

/* Read the record without the writer: most repeats end here.  A completed
 * record in local_cache answers without the store; a network store is not
 * read here at all (that would block this loop on a round trip): the claim,
 * which the writer sends anyway, decides and brings back what a read would. */
static void req_lookup(idem_req_t *req)
{
    idem_record_t rec;
    idem_gw_t *gw = req_gw(req);
    int64_t now = idem_clock_now(NULL);
    req->cache_gen = idem__cache_gen(gw->cache);
    if (idem__cache_get(gw->cache, &req->id, now, &rec) == IDEM_OK) {
        idem_decision_t d = idem_decide(&rec, req->fp, now);
        atomic_fetch_add_explicit(&gw->metrics.cache_hits, 1, memory_order_relaxed);
        req_answer_decision(req, d, &rec);
        idem_record_cleanup(&rec);
        return;
    }
    if (!idem_store_reads_are_local(gw->store)) {
        req_claim(req);
        return;
    }
    idem_err_t err = idem__gw_store_get(gw, &req->id, now, &rec);
    if (err == IDEM_E_NOTFOUND) {
        req_claim(req);
        return;
    }
    if (err == IDEM_E_CORRUPT) {
        req_corrupt_record(req);
        return;
    }
    if (err != IDEM_OK) {
        idem__req_store_error(req, err);
        return;
    }
    idem_decision_t d = idem_decide(&rec, req->fp, now);
    if (idem_decision_forwards(d.kind) || d.kind == IDEM_DECIDE_RECONCILE) {
        idem_record_cleanup(&rec);
        req_claim(req); /* the writer decides again, atomically */
        return;
    }
    if (d.kind == IDEM_DECIDE_IN_FLIGHT || d.kind == IDEM_DECIDE_IN_FLIGHT_UNKNOWN) {
        idem_record_cleanup(&rec);
        req_in_flight(req, d);
        return;
    }
    req_cache_record(req, &rec);
    req_answer_decision(req, d, &rec);
    idem_record_cleanup(&rec);
}

static void on_wait_timer(uv_timer_t *t)
{
    idem_req_t *req = t->data;
    req_lookup(req);
    req_timer_fired(req);
}

static int req_fingerprint(idem_req_t *req)
{
    idem_gw_request_t rq = idem_req_view(req);
    return idem__gw_fingerprint(req->policy, &rq, req->fp) == IDEM_OK ? 0 : -1;
}

/* The caller's scope (docs/protocol.md section 3, scope.h) into out
 * (IDEM_SCOPE_MAX + 1 bytes), then its share of scope_rate_limit.  When the
 * request may not go on it is answered here (400 ambiguous-scope, 429
 * rate-limited, 500 out of memory) and false is returned. */
bool idem__req_scope_admit(idem_req_t *req, char *out)
{
    idem_gw_t *gw = req_gw(req);
    const idem_config_t *cfg = req->cfg;
    const char *dup = NULL;
    unsigned why = IDEM_SCOPE_WHY_ABSENT;
    idem_scope_env_t env = {
        .client_cert_hex = req->client_cert[0] ? req->client_cert : NULL,
        .jwt = atomic_load_explicit(&gw->jwt_keys, memory_order_acquire),
        .now_s = idem_clock_now(NULL) / 1000,
        .missing = cfg->scope_missing,
    };
    idem_scope_result_t rc = idem__gw_scope_compute_env(cfg->scope, cfg->n_scope,
                                                        cfg->scope_header, &req->msg, &env, out,
                                                        &dup, &why);
    if ((rc == IDEM_SCOPE_FALLBACK_AUTHORIZATION || rc == IDEM_SCOPE_FALLBACK_ANONYMOUS) &&
        why < IDEM_SCOPE_N_WHY)
        atomic_fetch_add_explicit(
            &gw->metrics.scope_fallback[rc == IDEM_SCOPE_FALLBACK_AUTHORIZATION ? 0 : 1][why], 1,
            memory_order_relaxed);
    idem_gw_refusal_t refusal;
    if (idem__gw_refuse_scope(rc, dup, &refusal)) {
        req_refuse(req, &refusal);
        return false;
    }
    int64_t retry_after = 0;
    if (!idem__ratelimit_take(gw->ratelimit, out, idem_clock_mono_ns(), &retry_after)) {
        req->outcome = IDEM_OUT_RATE_LIMITED;
        idem__req_problem(req, 429, "rate-limited",
                          "this caller sent more keyed requests and token issues than "
                          "scope_rate_limit allows; retry after Retry-After seconds",
                          retry_after);
        return false;
    }
    return true;
}

/* A response idemd makes itself with a JSON body (body_type says which). */
void idem__req_send_json(idem_req_t *req, int status, const char *body_type, const char *body,
                         const idem_http_field_t *extra)
{
    idem_http_field_t f[3] = {
        {{"Content-Type", 12}, {body_type, strlen(body_type)}},
        {{"Cache-Control", 13}, {"no-store", 8}},
    };
    size_t n = 2;
    if (extra != NULL)
        f[n++] = *extra;
    idem_http_response_t r = {.status = status, .fields = f, .n_fields = n};
    req_respond(req, &r, body, strlen(body));
}

/* A refusal of the loop-free steps (request_plan.h) after the request was
 * made: its store work is done (there was none), its outcome set, and it is
 * answered. */
static void req_refuse(idem_req_t *req, const idem_gw_refusal_t *r)
{
    if (r->outcome != IDEM_OUT__COUNT)
        req->outcome = r->outcome;
    if (!r->allow_post && !r->allow_get) {
        idem__req_problem(req, r->status, r->type, r->detail, 0);
        return;
    }
    idem_problem_t p;
    if (idem__problem_init(&p, r->status, r->type, r->detail, 0,
                           idem__config_policy_link(req->cfg)) != 0) {
        idem__req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    p.fields[p.resp.n_fields++] = r->allow_post
                                      ? (idem_http_field_t){{"Allow", 5}, {"POST", 4}}
                                      : (idem_http_field_t){{"Allow", 5}, {"GET, HEAD", 9}};
    req_respond(req, &p.resp, p.body, p.body_len);
    idem__problem_cleanup(&p);
}

/* GET /_idem/policy: the published policy (SPEC section 18, policy.h). */
static void req_publish_policy(idem_req_t *req)
{
    char *body = idem__policy_document(req->cfg);
    if (body == NULL) {
        idem__req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    idem__req_send_json(req, 200, "application/json", body, NULL);
    free(body);
}

/* The checks a request's head alone decides (idem__gw_classify): its route,
 * and a key or a token that is missing or malformed.  They run before the
 * body is read when the client waits for 100 Continue, else at dispatch.
 * Nothing here touches the store.  @return true when the request goes on
 * (req->kind says as what); false when it has been answered. */
static bool req_check_head(idem_req_t *req)
{
    idem_gw_request_t rq = idem_req_view(req);
    idem_gw_class_t cls;
    idem_gw_refusal_t refusal;
    bool ok = idem__gw_classify(req->cfg, &rq, &cls, &refusal);
    req->kind = cls.kind;
    req->route = cls.route;
    req->policy = cls.policy;
    req->key_in_body = cls.key_in_body;
    memcpy(req->id.key, cls.key, sizeof req->id.key);
    memcpy(req->token, cls.token, sizeof req->token);
    if (ok)
        idem__req_enter(req, IDEM_REQ_CHECKED);
    else
        req_refuse(req, &refusal);
    return ok;
}

/* A body at least this large is fingerprinted in libuv's thread pool, not
 * on the worker's loop: canonical JSON costs 4-22 ms a MiB (src/core/json.c),
 * and the loop serves every other connection of the worker meanwhile
 * (docs/protocol.md section 4).  Below it the hand-off costs more than the
 * work. */
#define FP_OFF_LOOP_BYTES (64 * 1024)

/* The request's fingerprint is in req->fp (fp_rc 0): on to the store. */
static void req_fingerprinted(idem_req_t *req)
{
    if (req->fp_rc != 0) {
        req->keyed = false;
        idem__req_problem(req, 500, "internal", "out of memory", 0);
        return;
    }
    req_lookup(req);
}

/* In the thread pool: only the request's own head, body and (immutable)
 * policy are read, and only req->fp and req->fp_rc written. */
static void fp_work(uv_work_t *work)
{
    idem_req_t *req = work->data;
    req->fp_rc = req_fingerprint(req);
}

static void fp_after_work(uv_work_t *work, int status)
{
    idem_req_t *req = work->data;
    if (status != 0)
        req->fp_rc = -1; /* cancelled: never done, as nothing cancels it */
    req_fingerprinted(req);
    idem__req_release(req, IDEM_HOLD_FINGERPRINT);
}

static void req_route(idem_req_t *req);

/* key_from: json: the key in the body (idem__gw_key_from_body), into
 * req->body_key and req->body_key_refusal; req->body_key_ok says which.
 * Reads only the request's own body and (immutable) policy and route, so
 * it may run in the thread pool. */
static void req_read_body_key(idem_req_t *req)
{
    idem_gw_request_t rq = idem_req_view(req);
    req->body_key = (idem_gw_class_t){.kind = req->kind, .route = req->route,
                                      .policy = req->policy, .key_in_body = true};
    req->body_key_ok = idem__gw_key_from_body(&rq, &req->body_key, &req->body_key_refusal);
}

/* The body's key is read: refused, passed (an optional route without one),
 * or on as keyed with it; no key was claimed before this. */
static void req_body_key_read(idem_req_t *req)
{
    req->key_in_body = false;
    if (!req->body_key_ok) {
        req_refuse(req, &req->body_key_refusal);
        return;
    }
    req->kind = req->body_key.kind;
    memcpy(req->id.key, req->body_key.key, sizeof req->id.key);
    req_route(req);
}

static void key_work(uv_work_t *work)
{
    req_read_body_key(work->data);
}

static void key_after_work(uv_work_t *work, int status)
{
    idem_req_t *req = work->data;
    if (status != 0) {
        req->body_key_ok = false;
        req->body_key_refusal = (idem_gw_refusal_t){.status = 500, .type = "internal",
                                                    .outcome = IDEM_OUT__COUNT,
                                                    .detail = "the key could not be read"};
    }
    req_body_key_read(req);
    idem__req_release(req, IDEM_HOLD_FINGERPRINT);
}

static void req_dispatch(idem_req_t *req)
{
    if (req->life.state < IDEM_REQ_CHECKED && !req_check_head(req))
        return;
    idem__req_enter(req, IDEM_REQ_DECIDING);
    if (req->kind == IDEM_GW_POLICY) {
        req_publish_policy(req);
        return;
    }
    if (req->key_in_body) {
        /* A JSON parse of the body: off the loop when it is large, as the
         * fingerprint is, under the same hold (work on the body in the
         * thread pool); fp_work is free, the fingerprint comes after. */
        if (req->body.len >= FP_OFF_LOOP_BYTES) {
            req_hold(req, IDEM_HOLD_FINGERPRINT);
            req->fp_work.data = req;
            if (uv_queue_work(&req->w->loop, &req->fp_work, key_work, key_after_work) == 0)
                return;
            idem__req_release(req, IDEM_HOLD_FINGERPRINT); /* the CALL hold keeps it */
        }
        req_read_body_key(req);
        req_body_key_read(req);
        return;
    }
    req_route(req);
}

/* The request's kind and key are known: on to the store, the tokens, or
 * the upstream. */
static void req_route(idem_req_t *req)
{
    if (req->kind != IDEM_GW_TOKEN_ISSUE) {
        idem_gw_request_t rq = idem_req_view(req);
        if (req->trace_on)
            rq.traceparent = trace_placeholder;
        idem_gw_refusal_t refusal;
        if (!idem__gw_upstream_fits(req->cfg, req_gw(req)->upstream_hostport, &rq,
                                    req->kind == IDEM_GW_KEYED, &refusal)) {
            req_refuse(req, &refusal);
            return;
        }
    }
    switch (req->kind) {
    case IDEM_GW_TOKEN_ISSUE: idem__req_issue_token(req); return;
    case IDEM_GW_TOKEN: idem__req_spend_token(req); return;
    case IDEM_GW_PASS: req_passthrough(req); return;
    case IDEM_GW_KEYED: break;
    case IDEM_GW_POLICY: req_publish_policy(req); return; /* handled at dispatch */
    }
    if (!idem__req_scope_admit(req, req->id.scope))
        return;
    req->keyed = true;
    if (req->body.len >= FP_OFF_LOOP_BYTES) {
        /* The request waits on its fingerprint like on a store job: it is
         * held meanwhile, and nothing else reads or writes its head, body
         * or policy until fp_after_work. */
        req_hold(req, IDEM_HOLD_FINGERPRINT);
        req->fp_work.data = req;
        if (uv_queue_work(&req->w->loop, &req->fp_work, fp_work, fp_after_work) == 0)
            return;
        idem__req_release(req, IDEM_HOLD_FINGERPRINT); /* the CALL hold keeps it */
        req->fp_rc = req_fingerprint(req); /* the pool refused: on the loop after all */
    } else {
        req->fp_rc = req_fingerprint(req);
    }
    req_fingerprinted(req);
}

/* ---- a request's end ----------------------------------------------------- */

static void req_free(idem_req_t *req)
{
    idem_metrics_t *m = &req->w->gw->metrics;
    if (req->body_charge > 0)
        atomic_fetch_sub(&m->buffered_bytes, req->body_charge);
    if (req->holds_slot)
        atomic_fetch_sub(&m->connections, 1);
    idem_free(req->head);
    idem__buf_cleanup(&req->body);
    idem__buf_cleanup(&req->resp_body);
    idem__upstream_req_cleanup(&req->up);
    idem_free(req->store_headers);
    idem__config_unref(req->cfg);
    idem_free(req);
}

static void on_req_timer_closed(uv_handle_t *h)
{
    idem_req_t *req = h->data;
    idem_worker_t *w = req->w;
    req_free(req);
    idem__worker_maybe_exit(w);
}

/* The last hold is gone: nothing can reach req any more.  Log it, count it
 * if it was never answered (a client that left before its body was read),
 * and free it; its timer, if it has one, closes first. */
static void req_end(idem_req_t *req)
{
    idem_gw_t *gw = req->w->gw;
    if (req->life.ended_in < IDEM_REQ_RELAYING)
        idem__metrics_count(&gw->metrics, req_route_slot(req), idem__metrics_proto(req->proto),
                            req->outcome);
    idem__hist_observe(&gw->metrics.request_latency, idem_clock_mono_ns() - req->t_start_ns);
    atomic_fetch_sub(&gw->metrics.in_flight, 1);
    req_trace_end(req);
    idem__log_request(req->w, req);
    idem_list_remove(&req->link);
    if (req->timer_made)
        uv_close((uv_handle_t *)&req->timer, on_req_timer_closed);
    else
        req_free(req);
}

/* ---- shutdown ------------------------------------------------------------------ */

void idem__req_shutdown_now(idem_req_t *req)
{
    req_hold(req, IDEM_HOLD_CALL);
    idem__req_abort_upstream(req);
    req_timer_stop(req);
    idem__req_release(req, IDEM_HOLD_CALL);
}

/* ---- the body budget (max_buffered_bytes) ---------------------------------- */

/* Charge n more bytes to the process's body budget, if they fit. */
static bool budget_take(idem_gw_t *gw, uint64_t n)
{
    uint64_t max = gw->cfg->max_buffered_bytes;
    uint64_t cur = atomic_load(&gw->metrics.buffered_bytes);
    do {
        if (n > max || cur > max - n)
            return false;
    } while (!atomic_compare_exchange_weak(&gw->metrics.buffered_bytes, &cur, cur + n));
    return true;
}

/* After an append: charge what the body's buffer grew by beyond its charge.
 * A body is charged for what has arrived (its buffer), never for what its
 * head declares: a client that declares 10 MiB and sends a byte a minute
 * holds a byte's buffer, so no few slow clients take the budget from the
 * rest.  @return false when the growth does not fit. */
static bool req_charge_body(idem_req_t *req)
{
    uint64_t room = req->body.cap > 0 ? req->body.cap - 1 : 0; /* one spare byte for a NUL */
    if (room <= req->body_charge)
        return true;
    if (!budget_take(req_gw(req), room - req->body_charge))
        return false;
    req->body_charge = room;
    return true;
}

/* ---- the proxy handler: what the connection calls (handler.h) ---------------- */

/* Each entry point holds the request while it runs: an answer it gives lets
 * the connection's hold go. */

bool idem__req_check_head(idem_req_t *req)
{
    req_hold(req, IDEM_HOLD_CALL);
    bool ok = req_check_head(req);
    idem__req_release(req, IDEM_HOLD_CALL);
    return ok;
}

void idem__req_dispatch(idem_req_t *req)
{
    req_hold(req, IDEM_HOLD_CALL);
    req_dispatch(req);
    idem__req_release(req, IDEM_HOLD_CALL);
}

/* A refusal before a request exists (the head's own checks, the target):
 * counted, answered, and the connection ends after it. */
static void proxy_refuse_head(idem_worker_t *w, idem_ostream_t *os, const idem_gw_refusal_t *r,
                              const idem_conn_facts_t *facts)
{
    idem__metrics_count(&w->gw->metrics, 0, idem__metrics_proto(facts->proto), r->outcome);
    (void)idem__ostream_problem(os, r->status, r->type, r->detail, 0,
                                idem__config_policy_link(w->gw->cfg), IDEM_OS_CLOSE);
}

static idem_hreq_t *proxy_on_head(idem_handler_t *h, const idem_http_msg_t *m, const char *head,
                                  size_t head_len, idem_ostream_t *os,
                                  const idem_conn_facts_t *facts)
{
    idem_worker_t *w = h->data;
    idem_gw_refusal_t refusal;
    if (!idem__gw_check_head(idem__worker_cfg(w), m, &refusal)) {
        proxy_refuse_head(w, os, &refusal, facts);
        return NULL;
    }
    int target_rc;
    idem_req_t *req = req_create(w, os, facts, head, head_len, m->target.len, &target_rc);
    if (!req && target_rc != IDEM_TARGET_OK) {
        idem__gw_refuse_target(target_rc, &refusal);
        proxy_refuse_head(w, os, &refusal, facts);
    }
    return req; /* NULL and no answer: out of memory, the connection says so */
}

static bool proxy_on_expect(idem_hreq_t *r) { return idem__req_check_head(r); }

static bool proxy_on_body(idem_hreq_t *r, const char *p, size_t n)
{
    idem_req_t *req = r;
    if (idem__buf_append(&req->body, p, n) != 0) {
        /* Past its cap (max_request_bytes, or its Content-Length), or out of
         * memory. */
        bool too_large = req->body.max > 0 && req->body.len + n > req->body.max;
        req_hold(req, IDEM_HOLD_CALL);
        req->outcome = too_large ? IDEM_OUT_TOO_LARGE : IDEM_OUT_OVERLOADED;
        if (too_large)
            req_problem_flags(req, 413, "request-too-large",
                              "the request body is larger than max_request_bytes", 0,
                              IDEM_OS_CLOSE);
        else
            req_problem_flags(req, 503, "overloaded", "out of memory for the request body", 1,
                              IDEM_OS_CLOSE);
        idem__req_release(req, IDEM_HOLD_CALL);
        return false;
    }
    if (!req_charge_body(req)) {
        req_hold(req, IDEM_HOLD_CALL);
        req->outcome = IDEM_OUT_OVERLOADED;
        req_problem_flags(req, 503, "overloaded",
                          "too many request bodies are held at once (max_buffered_bytes); retry",
                          1, IDEM_OS_CLOSE);
        idem__req_release(req, IDEM_HOLD_CALL);
        return false;
    }
    return true;
}

static void proxy_on_body_end(idem_hreq_t *r) { idem__req_dispatch(r); }

/* The body cannot be read: the request ends before the store, so no key is
 * claimed for it, and the connection ends after the answer. */
static void proxy_on_body_error(idem_hreq_t *r, int rc)
{
    idem_req_t *req = r;
    idem_gw_refusal_t refusal;
    if (rc == IDEM_CONN_E_BODY_TIMEOUT)
        refusal = (idem_gw_refusal_t){.status = 408, .type = "request-timeout",
                                      .outcome = IDEM_OUT_REQUEST_TIMEOUT,
                                      .detail = "the request body paused for longer than "
                                                "body_timeout"};
    else
        idem__gw_refuse_body(rc, &refusal);
    req_hold(req, IDEM_HOLD_CALL);
    req->outcome = refusal.outcome;
    req_problem_flags(req, refusal.status, refusal.type, refusal.detail, 0, IDEM_OS_CLOSE);
    idem__req_release(req, IDEM_HOLD_CALL);
}

/* on_proceed: the client's queue drained: a relay paused for it reads on. */
static void proxy_on_proceed(idem_hreq_t *r)
{
    idem_req_t *req = r;
    if (req->life.state == IDEM_REQ_RELAYING)
        idem__upstream_req_resume(&req->up);
}

static void proxy_on_refused(idem_handler_t *h, int outcome, const idem_conn_facts_t *facts)
{
    idem_worker_t *w = h->data;
    idem__metrics_count(&w->gw->metrics, 0, idem__metrics_proto(facts->proto),
                        (idem_outcome_t)outcome);
}

static const idem_handler_ops_t proxy_ops = {
    .on_head = proxy_on_head,
    .on_expect = proxy_on_expect,
    .on_body = proxy_on_body,
    .on_body_end = proxy_on_body_end,
    .on_body_error = proxy_on_body_error,
    .on_proceed = proxy_on_proceed,
    .on_gone = proxy_on_gone,
    .on_refused = proxy_on_refused,
};

void idem__proxy_handler_init(idem_handler_t *h, idem_worker_t *w)
{
    *h = (idem_handler_t){
        .ops = &proxy_ops,
        .data = w,
        .body_max = w->gw->cfg->max_request_bytes,
        .request_outlives = true,
        .problem_link = idem__config_policy_link(w->gw->cfg),
    };
}
