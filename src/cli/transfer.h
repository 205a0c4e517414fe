/* src/cli/transfer.h - one HTTP exchange with libcurl, as idemctl's commands see it.
 *
 * Every idemctl command sends a request and looks at one answer: its status,
 * the headers of the final response (a 100 Continue or a proxy's CONNECT
 * answer is forgotten when the next status line comes), its Retry-After,
 * and when it is an RFC 9457 problem its "type" and "detail".  This layer
 * does that exchange and says how it ended in the terms of retry.h
 * (idem_transport_t), so the commands never look at a CURLcode.
 *
 * Bounds: the response head is capped at IDEM_CLI_MAX_HEAD and the body at
 * IDEM_CLI_MAX_BODY; past either the transfer is stopped and the answer is
 * marked too_big.  Redirects are not followed (curl's default).
 *
 * THREADING: an answer and the CURL handle belong to one thread.
 */
#ifndef IDEM_CLI_TRANSFER_H
#define IDEM_CLI_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "http/http.h"
#include "idem/retry.h"

#define IDEM_CLI_MAX_HEAD ((size_t)256 * 1024) /* bytes of the final response's head */
#define IDEM_CLI_PROBLEM_MAX 256               /* bytes kept of a problem's type and detail */

/** What to send.  Everything is borrowed for the call. */
typedef struct idem_cli_send {
    const char *method;              /* "POST", "GET", ... */
    const char *url;                 /* checked by idem__cli_url_check */
    struct curl_slist *headers;      /* "Name: value" lines; NULL for none */
    const char *body;                /* sent when has_body; may be NULL when body_len is 0 */
    size_t body_len;
    bool has_body;                   /* send a body (Content-Length: body_len) */
    const char *user_agent;
    int64_t timeout_ms;              /* the whole exchange; > 0 */
} idem_cli_send_t;

/** What came back. */
typedef struct idem_cli_answer {
    idem_transport_t transport; /* OK when an HTTP answer came whole */
    int status;                 /* the HTTP status when transport is OK, else 0 */
    idem_buf_t head;            /* the final response's status line and fields as received */
    idem_buf_t body;            /* the final response's body */
    size_t retry_after_off;     /* the Retry-After value in head, trimmed ... */
    size_t retry_after_len;     /* ... has_retry_after says whether there is one */
    bool has_retry_after;
    size_t ctype_off, ctype_len; /* the Content-Type value in head, trimmed */
    bool has_ctype;
    bool too_big;               /* the head or the body passed its cap: the transfer stopped */
    CURLcode code;              /* libcurl's result */
    long os_errno;              /* the errno of a failed connect, else 0 */
    char errbuf[CURL_ERROR_SIZE]; /* libcurl's message, "" when none */
    char problem_type[IDEM_CLI_PROBLEM_MAX];   /* "type" of a problem+json body, "" if none */
    char problem_detail[IDEM_CLI_PROBLEM_MAX]; /* its "detail" on one line, "" if none */
} idem_cli_answer_t;

void idem__cli_answer_init(idem_cli_answer_t *a);
void idem__cli_answer_cleanup(idem_cli_answer_t *a);

/** Send s on h, on a new connection (libcurl resends a request on its own
 * when a reused connection turns out closed, an attempt nobody would
 * count), and fill ans, which is reset first.  Never fails
 * as a function: every failure is an ans->transport other than OK, or
 * ans->too_big. */
void idem__cli_exchange(CURL *h, const idem_cli_send_t *s, idem_cli_answer_t *ans);

/** idem__cli_exchange in two halves, for a caller that runs several
 * transfers at once on a curl multi handle: prepare sets h up to send s
 * into ans (s and its strings must live until finish); finish, given the
 * CURLcode the transfer ended with, fills in the rest of ans and unlends
 * what prepare lent the handle. */
void idem__cli_exchange_prepare(CURL *h, const idem_cli_send_t *s, idem_cli_answer_t *ans);
void idem__cli_exchange_finish(CURL *h, CURLcode code, idem_cli_answer_t *ans);

/** Append a copy of line to the header list *l.  When memory runs out the
 * whole list is freed and *l is NULL, so a caller building a list stops at
 * the first false and has nothing to free.
 * @return true when line was appended. */
bool idem__cli_header_add(struct curl_slist **l, const char *line);

/** The answer as retry.h wants it; borrows from ans. */
idem_attempt_t idem__cli_attempt(const idem_cli_answer_t *ans);

/** A short description: "503", "409 in-flight", "connection refused",
 * "timed out", "connection broken: Server returned nothing ...". */
void idem__cli_answer_describe(const idem_cli_answer_t *ans, char *out, size_t cap);

/** Check a URL the way curl reads one (a missing scheme is guessed, so
 * "localhost:8080/pay" is http://localhost:8080/pay) and allow only http
 * and https.  base: the URL is one idemctl appends a path to (--admin,
 * --url), so it may carry no query or fragment, and its trailing slashes
 * are removed.
 * @param[out] out  the normalised URL, malloc'd (free()); NULL on failure.
 * @param[out] err  on failure, the problem in one line.
 * @return IDEM_OK, IDEM_E_INVAL, IDEM_E_NOMEM. */
idem_err_t idem__cli_url_check(const char *in, bool base, char **out, char *err, size_t errlen);

#endif /* IDEM_CLI_TRANSFER_H */
