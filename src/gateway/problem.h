/* src/gateway/problem.h - idemd's own error answers: RFC 9457
 * application/problem+json (problem.c).
 *
 * Every refusal idemd makes itself, on the public listener and on the
 * admin, is a problem; its type names are part of the contract
 * (docs/protocol.md section 10).  idem__problem_respond writes the whole
 * answer through src/http's one response writer; the body alone serves an
 * answer framed elsewhere.  Nothing here knows a loop or a connection.
 */
#ifndef IDEM_GATEWAY_PROBLEM_H
#define IDEM_GATEWAY_PROBLEM_H

#include <stdint.h>

#include "http/http.h"

/** Append a whole problem+json response answering `to` to out (the head
 * alone for HEAD), all or nothing.
 * @param retry_after  seconds for a Retry-After header, or 0 for none.
 * @return 0, or -1 (out of memory, out's cap) with out unchanged. */
int idem__problem_respond(idem_buf_t *out, int status, const char *type, const char *detail,
                          int64_t retry_after, idem_http_reply_t to);
/** A problem answer, framed by whoever sends it: its head (resp, whose
 * fields point into this struct: do not copy it) and its body. */
typedef struct idem_problem {
    idem_http_response_t resp;
    idem_http_field_t fields[2]; /* Content-Type, and Retry-After when asked */
    char seconds[24];
    char *body;                  /* owned (idem__problem_cleanup) */
    size_t body_len;
} idem_problem_t;

/** Fill p with the problem's head and body.
 * @param retry_after  seconds for a Retry-After header, or 0 for none.
 * @return 0, or -1 when out of memory (p needs no cleanup then). */
int idem__problem_init(idem_problem_t *p, int status, const char *type, const char *detail,
                       int64_t retry_after);
void idem__problem_cleanup(idem_problem_t *p);
const char *idem__problem_title(const char *type);
/** The JSON body of a problem; free() it.  NULL when out of memory. */
char *idem__problem_body(int status, const char *type, const char *detail);

#endif /* IDEM_GATEWAY_PROBLEM_H */
