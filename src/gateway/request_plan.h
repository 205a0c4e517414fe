/* src/gateway/request_plan.h - what idemd decides about a request before it
 * touches the store, and the head it sends upstream; no loop, no socket.
 *
 * A request's path through idemd, up to the store (docs/protocol.md
 * sections 2-5, 8, 10 and 11), is a row of steps, each one of the functions
 * below:
 *
 *   parse the head (src/http)            refused: 400, 431, 505  idem__gw_refuse_parse
 *   Host, CONNECT, a method in another   refused: 400, 501, 413  idem__gw_check_head
 *     case than a route's, Content-Length cap
 *   normalise the target (src/http)      refused: 400            idem__gw_refuse_target
 *   (Expect: 100-continue and no body byte yet: classify here, before the body)
 *   decode the body (src/http)           refused: 400, 413       idem__gw_refuse_body
 *   classify: token issue, policy, route, refused: 400, 405      idem__gw_classify
 *     mode, key or token
 *   a key in the JSON body (key_from:    refused: 400            idem__gw_key_from_body
 *     json:), after the whole body
 *   the upstream head within limits,     refused: 431            idem__gw_upstream_fits
 *     all but token issue
 *   scope (scope.c), token kinds and     refused: 400, 500       idem__gw_refuse_scope
 *     keyed
 *   (scope_rate_limit: request.c, since it holds state)
 *   fingerprint, keyed                   refused: 500            idem__gw_fingerprint
 *   -> the store: claim, token use or issue
 *   -> the upstream gets idem__gw_upstream_head and the decoded body.
 *   <- of its answer's fields, idem__gw_response_field_relayed says which
 *      the client gets, idem__gw_response_field_stored which a replay
 *      repeats.
 *
 * conn.c and request.c call each step where the loop gets to it (the
 * head's checks as soon as the head is in, a large body's fingerprint in
 * the thread pool), and request.c builds what it sends with
 * idem__gw_upstream_head.
 * idem__gw_plan_request runs the same steps in the same order over input
 * that has all arrived, for the fuzzer (fuzz/fuzz_request_path.c) and the
 * unit tests: what it says is what idemd does, up to what only the running
 * process knows (the store's answer, max_buffered_bytes, scope_rate_limit,
 * timeouts, running out of memory).
 *
 * THREADING: no state; every function is reentrant.
 */
#ifndef IDEM_GATEWAY_REQUEST_PLAN_H
#define IDEM_GATEWAY_REQUEST_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/config.h"
#include "gateway/outcome.h"
#include "gateway/scope.h"
#include "http/http.h"
#include "idem/error.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/token.h"

#define IDEM_GW_TOKENS_PATH "/_idem/tokens" /* POST here issues a token (section 8) */
#define IDEM_GW_POLICY_PATH IDEM_POLICY_PATH  /* GET here reads the policy (SPEC 18) */

/** What a request is, once its head is checked. */
typedef enum idem_gw_kind {
    IDEM_GW_PASS = 0,        /* forwarded as it is; the store is not touched */
    IDEM_GW_TOKEN_ISSUE = 1, /* POST /_idem/tokens: idemd issues a token itself */
    IDEM_GW_TOKEN = 2,       /* a token route's request: its token is spent, then forwarded */
    IDEM_GW_KEYED = 3,       /* its key is claimed, then it is forwarded with the fence */
    IDEM_GW_POLICY = 4,      /* GET or HEAD /_idem/policy: idemd answers with its policy */
} idem_gw_kind_t;

/** An answer of idemd's own that ends a request before the store. */
typedef struct idem_gw_refusal {
    int status;             /* 400, 405, 413, 431, 500, 501 or 505 */
    const char *type;       /* the problem type ("missing-key"), a static string */
    char detail[256];       /* the problem's detail */
    idem_outcome_t outcome; /* what the request counts as; IDEM_OUT__COUNT: none of its own
                             * (a 500 keeps the outcome the request had) */
    bool allow_post;        /* a 405 of /_idem/tokens: answered with Allow: POST */
    bool allow_get;         /* a 405 of /_idem/policy: answered with Allow: GET, HEAD */
} idem_gw_refusal_t;

/** A request as the steps read it.  Every pointer is borrowed. */
typedef struct idem_gw_request {
    const idem_http_msg_t *msg; /* the parsed head, as received */
    const char *target;         /* normalised, origin-form (idem__http_target_normalize) */
    size_t target_len;
    size_t path_len;            /* target[0..path_len) is the path */
    idem_slice_t authority;     /* an absolute-form target's authority; else empty */
    const uint8_t *body;        /* the decoded body (chunked coding removed) */
    size_t body_len;
    const char *traceparent;    /* tracing on (otlp_endpoint): the traceparent sent upstream
                                 * in place of any the client sent; NULL: the client's
                                 * fields go as they are */
} idem_gw_request_t;

/** What idem__gw_classify found. */
typedef struct idem_gw_class {
    idem_gw_kind_t kind;
    const idem_route_t *route;      /* the route matched; NULL for none (off) and token issue */
    const idem_policy_t *policy;    /* the route's, else cfg->defaults */
    char key[IDEM_KEY_MAX + 1];     /* KEYED: the key, unquoted; else "" */
    bool key_in_body;               /* KEYED on a key_from: json: route: key is "" until
                                     * idem__gw_key_from_body has read the body */
    char token[IDEM_TOKEN_LEN + 1]; /* TOKEN: the token, lowercase; else "" */
} idem_gw_class_t;

/** The refusal of a head the parser refused (parse_rc < 0: an IDEM_HTTP_E_*
 * code): 431 headers-too-large, 505 version-not-supported, else 400
 * bad-request.  The connection is closed after it. */
void idem__gw_refuse_parse(int parse_rc, idem_gw_refusal_t *r);

/** The checks of a parsed head besides the parser's own: an HTTP/1.1
 * request needs Host (400), CONNECT opens no tunnel (501), a method that is
 * a case variant of one a route names ("post", "Post" when a route names
 * POST: equal to it but for case, not byte for byte) is 400 invalid-method
 * whatever its path, a Content-Length over max_request_bytes is 413.
 * @return true when the head passes; else false with r filled (the
 * connection is closed after it). */
bool idem__gw_check_head(const idem_config_t *cfg, const idem_http_msg_t *m,
                         idem_gw_refusal_t *r);

/** The refusal of a target the normaliser refused (an IDEM_TARGET_E_*
 * code): 400 invalid-target, the detail saying why. */
void idem__gw_refuse_target(int target_rc, idem_gw_refusal_t *r);

/** The refusal of a body the decoder refused (an IDEM_HTTP_E_* code):
 * 413 request-too-large for IDEM_HTTP_E_BODY_TOO_LARGE, else 400. */
void idem__gw_refuse_body(int body_rc, idem_gw_refusal_t *r);

/** Classify a request by its head (docs/protocol.md sections 5 and 8): the
 * tokens path and the policy path (any spelling that normalises to them),
 * else the first route matching method and path, its mode, and the key or
 * token it needs.  The key is read from the field the route's key_from
 * names (Idempotency-Key by default), parsed as idem_key_parse parses it;
 * a route whose key_from is json: is KEYED with cls->key_in_body, its key
 * read by idem__gw_key_from_body once the body is in.
 * Reads rq's msg, target and path_len (not the body).
 * @param[out] cls  always filled, also on refusal (kind, route and policy
 *                  say what was refused).
 * @param[out] r    on refusal: 405 (a method other than POST on the tokens
 *                  path, other than GET or HEAD on the policy path), 400
 *                  missing-token or invalid-token (token route), 400
 *                  missing-key or invalid-key (required route, or a key
 *                  given on an optional one).
 * @return true when the request goes on as cls->kind. */
bool idem__gw_classify(const idem_config_t *cfg, const idem_gw_request_t *rq,
                       idem_gw_class_t *cls, idem_gw_refusal_t *r);

/** The key of a request that idem__gw_classify left with key_in_body
 * (SPEC section 15): the value at the route's JSON pointer in rq's body,
 * a string or an integer written in decimal, then checked as a key is
 * (1 to 255 characters of 0x20-0x7E; any of them, comma included, since no
 * intermediary joins JSON values).  A value that is not there is a missing
 * key: on a required route 400 missing-key, on an optional one the request
 * passes (cls->kind becomes IDEM_GW_PASS).  A body that is not JSON (as
 * src/core/json.c reads it: strict RFC 8259, no duplicate member, bounded
 * depth), a value of another type or a bad key are 400 invalid-key.  Does
 * nothing for any other request.  Costs a parse of the body: linear, and
 * run off the loop for a large body (request.c).
 * @return true when the request goes on as cls->kind (cls->key filled for
 *         KEYED, key_in_body cleared); false with r filled, or with r's
 *         status 500 when out of memory. */
bool idem__gw_key_from_body(const idem_gw_request_t *rq, idem_gw_class_t *cls,
                            idem_gw_refusal_t *r);

/** Whether the result of idem__gw_scope_compute refuses the request:
 * AMBIGUOUS is 400 ambiguous-scope (dup names the header given twice, or
 * NULL for Authorization), NOMEM is 500.  @return true with r filled when
 * refused. */
bool idem__gw_refuse_scope(idem_scope_result_t rc, const char *dup, idem_gw_refusal_t *r);

/** The fingerprint of a keyed request (docs/protocol.md section 4): method,
 * normalised target, the policy's fingerprint_headers, and the body (raw,
 * or canonical JSON with fingerprint_body: json).
 * @return IDEM_OK, or IDEM_E_NOMEM (fp zeroed). */
idem_err_t idem__gw_fingerprint(const idem_policy_t *p, const idem_gw_request_t *rq,
                                uint8_t fp[IDEM_FP_LEN]);

/** Append the head idemd sends upstream for rq (docs/protocol.md section 2)
 * to out; the decoded body (rq->body_len bytes) goes after it.  HTTP/1.1,
 * the method as received, the normalised target; the client's fields in
 * order minus the hop-by-hop ones (Connection, Keep-Alive, TE, Trailer,
 * Transfer-Encoding and Upgrade always; Proxy-* and those the client's
 * Connection names unless they are Idempotency-Key, Idempotency-Token,
 * Host or a header the scope is read from), Content-Length, Expect and any
 * Idempotency-Fence;
 * Host from an absolute-form target's authority, else
 * the client's, else upstream_host; then Idempotency-Fence: fence when
 * keyed, and Content-Length when there is a body or the client framed one.
 * With rq->traceparent set, every traceparent field of the client's is
 * left out and `traceparent: rq->traceparent` goes last (tracestate is
 * the client's, as received).
 * @return 0, or -1 when out of memory or out's cap was reached (out may
 *         then hold part of the head). */
int idem__gw_upstream_head(idem_buf_t *out, const idem_config_t *cfg, const char *upstream_host,
                           const idem_gw_request_t *rq, bool keyed, uint64_t fence);

/** Whether the head idem__gw_upstream_head makes for rq, with the longest
 * fence there is, keeps within idemd's own limits on a request head
 * (IDEM_HTTP_MAX_HEADERS fields, IDEM_HTTP_MAX_HEAD bytes), which the
 * fields idemd adds could otherwise pass: so an idemd, or any upstream with
 * idemd's limits, never refuses what idemd forwards after claiming its key.
 * Checked before the store.  @return true, or false with r filled (431
 * headers-too-large). */
bool idem__gw_upstream_fits(const idem_config_t *cfg, const char *upstream_host,
                            const idem_gw_request_t *rq, bool keyed, idem_gw_refusal_t *r);

/* ---- the upstream's answer ------------------------------------------------- */

/** Whether the upstream response field name (of resp, the upstream's
 * parsed head) is kept in the record and repeated by every replay: not a
 * hop-by-hop field (the fixed list, or one resp's Connection names), not
 * Content-Length (the answer is framed anew), not one of the policy's
 * replay_marker names (an upstream's own replay marker would be repeated
 * beside idemd's) and not one of its replay_drop_headers (Set-Cookie by
 * default: never stored, so a session cookie is not kept in the store nor
 * handed to a retry).  Names compare case-insensitively.  Linear over a
 * message's fields, for a name that is one of resp's fields (see
 * idem__http_is_hop_by_hop). */
bool idem__gw_response_field_stored(const idem_policy_t *p, const idem_http_msg_t *resp,
                                    idem_slice_t name);

/** Whether the upstream response field name is relayed to the client on the
 * first answer (relayed or streamed): as idem__gw_response_field_stored but
 * for replay_drop_headers, which the first answer carries.  The replay
 * marker is dropped here too: a first answer never says it is a replay. */
bool idem__gw_response_field_relayed(const idem_policy_t *p, const idem_http_msg_t *resp,
                                     idem_slice_t name);

/* ---- the whole path at once ------------------------------------------------ */

/** Where idem__gw_plan_request left a request. */
typedef enum idem_gw_verdict {
    IDEM_GW_INCOMPLETE = 0, /* the message is not all there: idemd waits for the rest */
    IDEM_GW_REFUSED = 1,    /* idemd answers plan.refusal; nothing is forwarded, no store */
    IDEM_GW_ISSUE = 2,      /* idemd issues a token (after the store); nothing is forwarded */
    IDEM_GW_FORWARD = 3,    /* forwarded (for TOKEN and KEYED after the store) as
                             * plan.upstream then the decoded body */
    IDEM_GW_PUBLISH = 4,    /* idemd answers with its policy; nothing is forwarded */
} idem_gw_verdict_t;

/** What idemd decides about one request, and what it sends upstream. */
typedef struct idem_gw_plan {
    idem_gw_verdict_t verdict;
    idem_gw_refusal_t refusal; /* REFUSED */
    int parse_rc;              /* the head parser's result: the head's length, INCOMPLETE
                                * or an IDEM_HTTP_E_* code */
    int target_rc;             /* IDEM_TARGET_OK, or the normaliser's error */
    int body_rc;               /* IDEM_HTTP_BODY_DONE, INCOMPLETE, an IDEM_HTTP_E_* code,
                                * or 0 when the body was not reached */
    size_t used;               /* bytes of the input the message took (head and body) */
    bool invite;               /* idemd sends 100 Continue before the body */
    idem_http_msg_t msg;       /* the head; its slices point into the input */
    char *target;              /* the normalised target, NUL-terminated (owned); NULL
                                * until normalised */
    idem_http_target_t t;      /* its lengths and the authority */
    idem_buf_t body;           /* the decoded body */
    bool classified;           /* cls is filled */
    idem_gw_class_t cls;
    bool scoped;               /* scope_rc and scope are filled (token kinds, keyed) */
    idem_scope_result_t scope_rc;
    char scope[IDEM_SCOPE_MAX + 1];
    bool fingerprinted;        /* fp is filled (keyed) */
    uint8_t fp[IDEM_FP_LEN];
    idem_buf_t upstream;       /* FORWARD: the head sent upstream */
} idem_gw_plan_t;

/** Run the request path over in[0..len): the bytes a client sent, a head
 * then its body in its framing (bytes after the message are the next
 * request's, and are left alone).  The input is taken as arrived at once,
 * so Expect: 100-continue is honoured only when nothing follows the head.
 * @param upstream_host  the upstream's host:port (Host when the client sent
 *                       none).
 * @param fence          the fence a claim gave a keyed request.
 * @param[out] out       filled; release with idem__gw_plan_cleanup (also on
 *                       failure).  Its slices point into in.
 * @return IDEM_OK (out->verdict says the rest), or IDEM_E_NOMEM. */
idem_err_t idem__gw_plan_request(const idem_config_t *cfg, const char *upstream_host,
                                 uint64_t fence, const char *in, size_t len, idem_gw_plan_t *out);

/** Free what a plan owns; the plan is zeroed.  NULL does nothing. */
void idem__gw_plan_cleanup(idem_gw_plan_t *plan);

#endif /* IDEM_GATEWAY_REQUEST_PLAN_H */
