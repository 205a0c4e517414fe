/* src/gateway/request.h - the request's life, as the other parts of a
 * worker call it (request.c, tokens.c).
 *
 * request.c is the proxy handler of the public listeners (handler.h): a
 * connection hands it a request head (on_head), feeds it the body, and
 * tells it when its client can take more or has gone; the request answers
 * through the output stream the connection supplied (req->os) and never
 * names the connection.  request.c follows docs/protocol.md sections 2-7
 * from there; tokens.c is the `mode: token` part of it (section 8) and uses
 * request.c's answers and store round trips.
 *
 * THREADING: the worker's loop thread only.
 */
#ifndef IDEM_GATEWAY_REQUEST_H
#define IDEM_GATEWAY_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "gateway/gateway.h"
#include "gateway/handler.h"
#include "gateway/list.h"
#include "gateway/otlp.h"
#include "gateway/outcome.h"
#include "gateway/req_state.h"
#include "gateway/request_plan.h"
#include "gateway/upstream.h"
#include "gateway/worker.h"
#include "gateway/writer.h"
#include "http/http.h"
#include "idem/engine.h"
#include "idem/key.h"
#include "idem/record.h"

typedef struct idem_req idem_req_t;

struct idem_req {
    idem_worker_t *w;
    idem_ostream_t *os;           /* the connection's, while the request holds IDEM_HOLD_CONN:
                                     NULL once its answer is complete, or its client has gone */
    bool tls;                     /* it came over TLS */
    const char *proto;            /* the protocol that carried it (facts.proto), static */
    char client_cert[65];         /* the verified client certificate's SHA-256 (hex), or "" */
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
    const idem_config_t *cfg;     /* the configuration it began with, a reference
                                   * (idem__worker_cfg): route and policy are its */
    const idem_route_t *route;    /* NULL: no route (off) */
    const idem_policy_t *policy;  /* route's or defaults */
    bool keyed;                   /* goes through the store */
    bool bypassed;                /* store down, forwarded anyway (on_store_error: open) */
    bool token_spent;             /* a token route's request spent its token (id names it) */
    idem_gw_kind_t kind;          /* what the head's checks decided (idem__gw_classify) */
    char token[IDEM_TOKEN_LEN + 1]; /* a token route's token, as those checks parsed it */
    bool key_in_body;             /* KEYED, key_from: json:, the key not read yet */
    bool body_key_ok;             /* what reading it said (request.c, req_read_body_key) */
    idem_gw_class_t body_key;     /* the kind and key read from the body */
    idem_gw_refusal_t body_key_refusal; /* why the body's key was refused */
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
    uint64_t cache_gen;           /* local_cache's generation before our read (cache.h) */
    bool renewing;                /* the timer renews the lease (claimed until the outcome is
                                     written, or the upstream failed) */
    bool lapse_logged;            /* said that our lease ended before a renewal came back */
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
    /* Traces (otlp.h), all zero while gw->otlp is NULL. */
    bool trace_on;                /* tracing is on: a traceparent goes upstream */
    bool traced;                  /* sampled: its spans are exported at its end */
    bool trace_parent;            /* trace continues a client's traceparent */
    idem_trace_ctx_t trace;       /* the trace, the client's span (trace_parent), flags */
    uint8_t span_id[IDEM_SPAN_ID_LEN];    /* the server span, the request's */
    uint8_t up_span_id[IDEM_SPAN_ID_LEN]; /* the client span of its upstream call */
    uint64_t t_start_unix_ns;     /* t_start_ns on the wall clock */
    uint64_t t_up_end_ns;         /* the upstream call ended (mono); 0: not yet or never */
    uint64_t t_job_ns;            /* req->job went to the writer (mono) */
    uint64_t store_ns;            /* writer round trips of req->job, summed */
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


static inline idem_gw_t *req_gw(const idem_req_t *req) { return req->w->gw; }

/* request.c: the proxy handler, and the request's life. */
/** The handler of w's public listeners (handler.h). */
void idem__proxy_handler_init(idem_handler_t *h, idem_worker_t *w);
/** The checks the head alone decides (route, key or token).  @return true
 * when the request goes on; false when it has been answered. */
bool idem__req_check_head(idem_req_t *req);
/** The whole request is read: follow docs/protocol.md sections 2-7. */
void idem__req_dispatch(idem_req_t *req);
/** A writer job of a request is back on its loop: run its callback, then
 * give back the job's hold. */
void idem__req_job_done(idem_wjob_t *job);
/** Move req on to state s (req_state.h; never back).  The move into an
 * answered state (RELAYING or later) counts the request's outcome. */
void idem__req_enter(idem_req_t *req, idem_req_state_t s);
/** Give back a hold of kind h (req_state.h); the last one ends req: it is
 * logged, counted and freed, and must not be touched after. */
void idem__req_release(idem_req_t *req, idem_hold_t h);

/* request.c: answers and store round trips, for tokens.c. */
void idem__req_problem(idem_req_t *req, int status, const char *type, const char *detail,
                       int64_t retry_after);
/** A response of idemd's own with a JSON body (body_type says which),
 * Cache-Control: no-store, and one more field when extra is not NULL. */
void idem__req_send_json(idem_req_t *req, int status, const char *body_type, const char *body,
                         const idem_http_field_t *extra);
void idem__req_store_unavailable(idem_req_t *req, const char *detail);
void idem__req_store_error(idem_req_t *req, idem_err_t err);
void idem__req_respond_upstream(idem_req_t *req);
void idem__req_answer_failure(idem_req_t *req, idem_up_result_t why);
void idem__req_start_stream(idem_req_t *req);
void idem__req_forward(idem_req_t *req);
/** The shutdown deadline: end the request's upstream call and its timer
 * now; it ends once what the store owes it comes back (req may end inside). */
void idem__req_shutdown_now(idem_req_t *req);
/** End the request's upstream call, if it runs (client gone, shutdown). */
void idem__req_abort_upstream(idem_req_t *req);
bool idem__req_scope_admit(idem_req_t *req, char *out);
void idem__req_job_init(idem_req_t *req, idem_wjob_t *job, idem_op_kind_t kind);
void idem__req_submit(idem_req_t *req, idem_wjob_t *job, idem_wjob_cb cb);

/* tokens.c: prevention tokens (docs/protocol.md section 8). */
/** POST /_idem/tokens: issue a token bound to the caller's scope. */
void idem__req_issue_token(idem_req_t *req);
/** A `mode: token` request with a well-formed token: spend it, then forward. */
void idem__req_spend_token(idem_req_t *req);
/** The upstream did nothing with a token's request: restore the token, then answer. */
void idem__req_give_token_back(idem_req_t *req);

#endif /* IDEM_GATEWAY_REQUEST_H */
