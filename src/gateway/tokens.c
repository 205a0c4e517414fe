/* src/gateway/tokens.c - prevention tokens (docs/protocol.md section 8).
 *
 * POST /_idem/tokens issues a single-use token bound to the caller's scope
 * (a TOKEN_ISSUE through the writer); a request on a `mode: token` route
 * spends its token atomically (TOKEN_USE) and is forwarded only on its
 * first use.  When the upstream did nothing with it (could not connect, or
 * a release status) the token is given back (TOKEN_RESTORE) before the
 * client is answered, so that it may retry with the same token.  The
 * answers, the store round trips and the forwarding are request.c's.
 *
 * THREADING: the worker's loop thread only.
 */
#include <stdio.h>
#include <string.h>

#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/request.h"
#include "idem/clock.h"
#include "idem/token.h"

static void on_token_issued(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    const idem_config_t *cfg = req->cfg;
    if (job->batch_err != IDEM_OK) {
        idem__log(req->w->gw, "error", "store: could not issue a token: %s",
                  idem_strerror(job->batch_err));
        idem__req_store_unavailable(req, job->batch_err == IDEM_E_STORE_FULL
                                             ? "the idempotency store is full"
                                             : "the idempotency store did not answer");
        return;
    }
    if (job->op.err != IDEM_OK) { /* IDEM_E_EXISTS: 128 random bits met a live token */
        idem__req_problem(req, 500, "internal", "could not issue a token; try again", 0);
        return;
    }
    char body[128];
    snprintf(body, sizeof body, "{\"token\":\"%s\",\"expires_in\":%lld}",
             req->id.key + sizeof IDEM_TOKEN_PREFIX - 1, (long long)(cfg->token_ttl_ms / 1000));
    req->outcome = IDEM_OUT_TOKEN_ISSUED;
    idem__req_send_json(req, 201, "application/json", body, NULL);
}

/* POST /_idem/tokens: a single-use token bound to the caller's scope. */
void idem__req_issue_token(idem_req_t *req)
{
    const idem_config_t *cfg = req->cfg;
    char token[IDEM_TOKEN_LEN + 1], scope[IDEM_SCOPE_MAX + 1];

    req->policy = &cfg->defaults;
    if (!idem__req_scope_admit(req, scope))
        return;
    if (idem_token_generate(NULL, token) != IDEM_OK) {
        idem__req_problem(req, 500, "internal", "no random bytes from the kernel", 0);
        return;
    }
    idem_token_id(scope, token, &req->id);
    int64_t now = idem_clock_now(NULL);
    idem__req_job_init(req, &req->job, IDEM_OP_TOKEN_ISSUE);
    req->job.op.now_ms = now;
    req->job.op.expires_at_ms = now + cfg->token_ttl_ms;
    idem__req_submit(req, &req->job, on_token_issued);
}

static void on_token_restored(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    if (job->batch_err != IDEM_OK)
        idem__log(req->w->gw, "warn", "store: a token whose request did nothing stays used: %s",
                  idem_strerror(job->batch_err));
    if (req->up_result != IDEM_UP_OK)
        idem__req_answer_failure(req, req->up_result);
    else if (req->streaming)
        idem__req_start_stream(req);
    else
        idem__req_respond_upstream(req);
}

/* The upstream did nothing with a token's request (could not connect, or a
 * release status): give the token back before answering, so the client may
 * retry with it; the answer goes out once that is written. */
void idem__req_give_token_back(idem_req_t *req)
{
    req->token_spent = false;
    idem__req_enter(req, IDEM_REQ_RECORDING);
    idem__req_job_init(req, &req->job, IDEM_OP_TOKEN_RESTORE);
    req->job.op.now_ms = idem_clock_now(NULL);
    idem__req_submit(req, &req->job, on_token_restored);
}

static void on_token_used(idem_wjob_t *job)
{
    idem_req_t *req = job->data;
    /* A spend the store refused (the batch, or this op alone: out of
     * memory, down) is a store error, not an invalid token; "unknown",
     * "exists" and "fence" are the spend's own answers (op.token). */
    idem_err_t err = job->batch_err;
    if (err == IDEM_OK && job->op.err != IDEM_OK && job->op.err != IDEM_E_NOTFOUND &&
        job->op.err != IDEM_E_EXISTS && job->op.err != IDEM_E_FENCE)
        err = job->op.err;
    if (err != IDEM_OK) {
        idem__log(req->w->gw, "error", "store: %s", idem_strerror(err));
        idem__req_store_error(req, err);
        return;
    }
    switch (job->op.token) {
    case IDEM_TOKEN_FIRST_USE:
        req->token_spent = true;
        req->keyed = false;
        req->outcome = IDEM_OUT_TOKEN_ACCEPTED;
        idem__req_forward(req);
        return;
    case IDEM_TOKEN_USED:
        req->outcome = IDEM_OUT_TOKEN_USED;
        idem__req_problem(req, 409, "token-used",
                          "this Idempotency-Token was already used; get a new one from "
                          "POST " IDEM_GW_TOKENS_PATH,
                          0);
        return;
    default:
        req->outcome = IDEM_OUT_INVALID_TOKEN;
        idem__req_problem(req, 400, "invalid-token",
                          "this Idempotency-Token is unknown, expired, or was issued to another "
                          "caller",
                          0);
        return;
    }
}

/* A request on a `mode: token` route whose head carried one well-formed
 * token (req->token, idem__gw_classify): spend it atomically, then forward. */
void idem__req_spend_token(idem_req_t *req)
{
    char scope[IDEM_SCOPE_MAX + 1];
    if (!idem__req_scope_admit(req, scope))
        return;
    idem_token_id(scope, req->token, &req->id);
    idem__req_job_init(req, &req->job, IDEM_OP_TOKEN_USE);
    req->job.op.now_ms = idem_clock_now(NULL);
    idem__req_submit(req, &req->job, on_token_used);
}

