/* src/gateway/problem.c - RFC 9457 problem+json responses made by idemd.
 *
 * Every error idemd itself answers is one of these, so a client can always
 * tell idemd's word from the upstream's: Content-Type
 * application/problem+json and a body
 * {"type":"urn:idem:problem:<type>","title":...,"status":N,"detail":...}.
 * The type names are part of the contract (docs/protocol.md section 10); the titles are
 * fixed per type, the detail says what happened to this request.  The
 * response around it is written by src/http's idem__http_write_response, so a
 * problem is framed like every other answer (HEAD, HTTP/1.0 keep-alive) and
 * is never half written.  The Link to the published policy (SPEC section
 * 18) is the caller's to give: problem.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/problem.h"

static const struct {
    const char *type;
    const char *title;
} titles[] = {
    {"invalid-key", "Invalid Idempotency-Key"},
    {"missing-key", "Idempotency-Key required"},
    {"key-reused", "Idempotency-Key reused with another request"},
    {"in-flight", "A request with this Idempotency-Key is in progress"},
    {"upstream-unreachable", "Upstream unreachable"},
    {"upstream-outcome-unknown", "Outcome of the upstream request unknown"},
    {"response-not-retained", "Response too large to be retained"},
    {"store-unavailable", "Idempotency store unavailable"},
    {"store-full", "Idempotency store full"},
    {"ambiguous-scope", "Caller identity given more than once"},
    {"missing-scope", "Caller identity required"},
    {"rate-limited", "Too many requests for this caller"},
    {"request-too-large", "Request body too large"},
    {"headers-too-large", "Request header fields too large"},
    {"bad-request", "Malformed HTTP request"},
    {"invalid-target", "Request target not accepted"},
    {"not-implemented", "Not implemented"},
    {"version-not-supported", "HTTP version not supported"},
    {"missing-token", "Idempotency-Token required"},
    {"invalid-token", "Invalid Idempotency-Token"},
    {"token-used", "Idempotency-Token already used"},
    {"not-found", "Not found"},
    {"method-not-allowed", "Method not allowed"},
    {"invalid-method", "Method differs from a routed one only in case"},
    {"internal", "Internal error"},
    {"request-timeout", "Request not received in time"},
    {"overloaded", "Too busy to take this request now"},
    {"misdirected-request", "Host not served by this listener"},
    {"record-damaged", "Stored record damaged"},
};

const char *idem__problem_title(const char *type)
{
    for (size_t i = 0; i < sizeof titles / sizeof titles[0]; i++)
        if (strcmp(titles[i].type, type) == 0)
            return titles[i].title;
    return "Error";
}

char *idem__problem_body(int status, const char *type, const char *detail)
{
    char typebuf[96];
    snprintf(typebuf, sizeof typebuf, "urn:idem:problem:%s", type);
    json_t *obj = json_pack("{s:s, s:s, s:i, s:s}", "type", typebuf, "title",
                            idem__problem_title(type), "status", status, "detail",
                            detail ? detail : "");
    if (!obj)
        return NULL;
    char *body = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    return body;
}

int idem__problem_init(idem_problem_t *p, int status, const char *type, const char *detail,
                       int64_t retry_after, const char *link)
{
    memset(p, 0, sizeof *p);
    if (link != NULL && strlen(link) > IDEM_PROBLEM_LINK_MAX)
        return -1;
    p->body = idem__problem_body(status, type, detail);
    if (!p->body)
        return -1;
    p->body_len = strlen(p->body);
    p->fields[0] = (idem_http_field_t){{"Content-Type", 12}, {"application/problem+json", 24}};
    size_t n = 1;
    if (retry_after > 0) {
        int k = snprintf(p->seconds, sizeof p->seconds, "%lld", (long long)retry_after);
        p->fields[n++] = (idem_http_field_t){{"Retry-After", 11}, {p->seconds, (size_t)k}};
    }
    if (link != NULL) {
        int k = snprintf(p->link, sizeof p->link, "<%s>; rel=\"describedby\"", link);
        p->fields[n++] = (idem_http_field_t){{"Link", 4}, {p->link, (size_t)k}};
    }
    p->resp = (idem_http_response_t){.status = status, .fields = p->fields, .n_fields = n};
    return 0;
}

void idem__problem_cleanup(idem_problem_t *p)
{
    free(p->body);
    p->body = NULL;
}

int idem__problem_respond(idem_buf_t *out, int status, const char *type, const char *detail,
                          int64_t retry_after, const char *link, idem_http_reply_t to)
{
    idem_problem_t p;
    if (idem__problem_init(&p, status, type, detail, retry_after, link) != 0)
        return -1;
    int rc = idem__http_write_response(out, &p.resp, to, p.body, p.body_len);
    idem__problem_cleanup(&p);
    return rc;
}
