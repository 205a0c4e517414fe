/* src/gateway/problem.h - idemd's own error answers: RFC 9457
 * application/problem+json (problem.c).
 *
 * Every refusal idemd makes itself, on the public listener and on the
 * admin, is a problem; its type names are part of the contract
 * (docs/protocol.md section 10).  idem__problem_respond writes the whole
 * answer through src/http's one response writer; the body alone serves an
 * answer framed elsewhere.  Nothing here knows a loop or a connection.
 *
 * A problem of the public listener carries `Link: <URL>; rel="describedby"`
 * (SPEC section 18), URL being the published policy (/_idem/policy) or the
 * operator's policy_link: the caller passes it (the handler's
 * problem_link, idem__config_policy_link); NULL (the admin listener) adds
 * no Link.
 */
#ifndef IDEM_GATEWAY_PROBLEM_H
#define IDEM_GATEWAY_PROBLEM_H

#include <stdint.h>

#include "http/http.h"

#define IDEM_PROBLEM_LINK_MAX 1024 /* characters of a link's URL (config.h's policy_link) */

/** Append a whole problem+json response answering `to` to out (the head
 * alone for HEAD), all or nothing.
 * @param retry_after  seconds for a Retry-After header, or 0 for none.
 * @param link         the URL of Link: <link>; rel="describedby", or NULL
 *                     for none.
 * @return 0, or -1 (out of memory, out's cap, a link over
 *         IDEM_PROBLEM_LINK_MAX) with out unchanged. */
int idem__problem_respond(idem_buf_t *out, int status, const char *type, const char *detail,
                          int64_t retry_after, const char *link, idem_http_reply_t to);
/** A problem answer, framed by whoever sends it: its head (resp, whose
 * fields point into this struct: do not copy it) and its body.  The last
 * of fields is room for one field of the caller's (resp.fields[n_fields++],
 * e.g. Allow). */
typedef struct idem_problem {
    idem_http_response_t resp;
    idem_http_field_t fields[4]; /* Content-Type, Retry-After when asked, Link when
                                  * given, and one of the caller's */
    char seconds[24];
    char link[IDEM_PROBLEM_LINK_MAX + 32]; /* "<URL>; rel=\"describedby\"" */
    char *body;                  /* owned (idem__problem_cleanup) */
    size_t body_len;
} idem_problem_t;

/** Fill p with the problem's head and body.
 * @param retry_after  seconds for a Retry-After header, or 0 for none.
 * @param link         as idem__problem_respond's.
 * @return 0, or -1 when out of memory or link is too long (p needs no
 *         cleanup then). */
int idem__problem_init(idem_problem_t *p, int status, const char *type, const char *detail,
                       int64_t retry_after, const char *link);
void idem__problem_cleanup(idem_problem_t *p);
const char *idem__problem_title(const char *type);
/** The JSON body of a problem; free() it.  NULL when out of memory. */
char *idem__problem_body(int status, const char *type, const char *detail);

#endif /* IDEM_GATEWAY_PROBLEM_H */
