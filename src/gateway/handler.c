/* src/gateway/handler.c - the answers every handler gives the same way,
 * through the output stream its connection supplies (handler.h): a whole
 * response at once, and idemd's own problem+json (problem.h).  Loop-free:
 * it only calls the stream's functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/handler.h"
#include "gateway/problem.h"

int idem__ostream_respond(idem_ostream_t *os, const idem_http_response_t *r, unsigned flags,
                          const void *body, size_t n)
{
    idem_http_response_t whole = *r;
    whole.framing = IDEM_HTTP_BODY_LENGTH;
    whole.content_length = n;
    if (os->ops->start(os, &whole, flags) != 0)
        return -1;
    os->ops->send(os, body, n, true);
    return 0;
}

int idem__ostream_problem(idem_ostream_t *os, int status, const char *type, const char *detail,
                          int64_t retry_after, const char *link, unsigned flags)
{
    idem_problem_t p;
    if (idem__problem_init(&p, status, type, detail, retry_after, link) != 0)
        return -1;
    int rc = idem__ostream_respond(os, &p.resp, flags, p.body, p.body_len);
    idem__problem_cleanup(&p);
    return rc;
}
