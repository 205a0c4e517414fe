/* src/cli/transfer.c - one HTTP exchange with libcurl, as idemctl's commands see it.
 *
 * libcurl does the HTTP; this file decides what idemctl keeps of it.  The
 * header callback keeps the head of the final response only: every status
 * line starts the head afresh, so the Retry-After and Content-Type looked at
 * are never those of a 100 Continue or of a proxy's CONNECT answer.  The
 * body is kept whole (up to IDEM_CLI_MAX_BODY) because the retry decision
 * may need it (the problem type of a 409) and the final one is printed.
 *
 * How a failed exchange maps onto retry.h's idem_transport_t:
 *
 *   CURLE_COULDNT_CONNECT, COULDNT_RESOLVE_HOST, COULDNT_RESOLVE_PROXY,
 *   SSL_CONNECT_ERROR                                    CONNECT  nothing was sent
 *   CURLE_OPERATION_TIMEDOUT                             TIMEOUT
 *   anything else (RECV_ERROR, SEND_ERROR, GOT_NOTHING,
 *   PARTIAL_FILE, ...)                                   BROKEN   it may have been sent
 *
 * A TLS handshake failure counts as CONNECT because no request byte went out.
 *
 * THREADING: an answer and the CURL handle belong to one thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/transfer.h"

void idem__cli_answer_init(idem_cli_answer_t *a)
{
    memset(a, 0, sizeof *a);
    idem__buf_init(&a->head, IDEM_CLI_MAX_HEAD);
    idem__buf_init(&a->body, IDEM_CLI_MAX_BODY);
}

void idem__cli_answer_cleanup(idem_cli_answer_t *a)
{
    idem__buf_cleanup(&a->head);
    idem__buf_cleanup(&a->body);
}

/* Forget the head fields seen so far (a new status line came, or a new exchange). */
static void reset_head(idem_cli_answer_t *a)
{
    idem__buf_reset(&a->head);
    a->has_retry_after = a->has_ctype = false;
    a->retry_after_off = a->retry_after_len = a->ctype_off = a->ctype_len = 0;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* If the line at head[off..off+n) is "name: value", the trimmed value's place. */
static bool field_value(const idem_buf_t *head, size_t off, size_t n, const char *name,
                        size_t *voff, size_t *vlen)
{
    size_t nl = strlen(name);
    const char *line = head->data + off;
    if (n <= nl || line[nl] != ':' || strncasecmp(line, name, nl) != 0)
        return false;
    size_t b = nl + 1, e = n;
    while (b < e && is_ws(line[b]))
        b++;
    while (e > b && is_ws(line[e - 1]))
        e--;
    *voff = off + b;
    *vlen = e - b;
    return true;
}

static size_t on_header(char *data, size_t size, size_t nitems, void *ud)
{
    idem_cli_answer_t *a = ud;
    size_t n = size * nitems;

    if (n >= 5 && memcmp(data, "HTTP/", 5) == 0)
        reset_head(a);
    size_t off = a->head.len;
    if (idem__buf_append(&a->head, data, n) != 0) {
        a->too_big = true;
        return 0; /* stops the transfer (CURLE_WRITE_ERROR) */
    }
    if (!a->has_retry_after &&
        field_value(&a->head, off, n, "Retry-After", &a->retry_after_off, &a->retry_after_len))
        a->has_retry_after = true;
    if (!a->has_ctype && field_value(&a->head, off, n, "Content-Type", &a->ctype_off, &a->ctype_len))
        a->has_ctype = true;
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    idem_cli_answer_t *a = ud;
    size_t n = size * nmemb;

    if (idem__buf_append(&a->body, data, n) != 0) {
        a->too_big = true;
        return 0;
    }
    return n;
}

static idem_transport_t classify(CURLcode code)
{
    switch (code) {
    case CURLE_OK:
        return IDEM_TRANSPORT_OK;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
        return IDEM_TRANSPORT_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        return IDEM_TRANSPORT_TIMEOUT;
    default:
        return IDEM_TRANSPORT_BROKEN;
    }
}

/* Copy a JSON string member into out (cap bytes) on one line; "" if absent. */
static void copy_member(json_t *doc, const char *name, char *out, size_t cap)
{
    const char *s = json_string_value(json_object_get(doc, name));
    size_t i = 0;
    out[0] = '\0';
    if (s == NULL)
        return;
    for (; s[i] != '\0' && i + 1 < cap; i++)
        out[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? ' ' : s[i];
    out[i] = '\0';
}

static bool is_problem(const idem_cli_answer_t *a)
{
    static const char mt[] = "application/problem+json";
    if (!a->has_ctype)
        return false;
    const char *v = a->head.data + a->ctype_off;
    size_t n = a->ctype_len;
    size_t m = 0;
    while (m < n && v[m] != ';')
        m++;
    while (m > 0 && is_ws(v[m - 1]))
        m--;
    return m == sizeof mt - 1 && strncasecmp(v, mt, m) == 0;
}

static void read_problem(idem_cli_answer_t *a)
{
    if (!is_problem(a) || a->body.len == 0)
        return;
    json_error_t jerr;
    json_t *doc = json_loadb(a->body.data, a->body.len, 0, &jerr);
    if (doc == NULL)
        return;
    if (json_is_object(doc)) {
        copy_member(doc, "type", a->problem_type, sizeof a->problem_type);
        copy_member(doc, "detail", a->problem_detail, sizeof a->problem_detail);
    }
    json_decref(doc);
}

void idem__cli_exchange_prepare(CURL *h, const idem_cli_send_t *s, idem_cli_answer_t *ans)
{
    bool post = s->has_body;
    bool head = strcmp(s->method, "HEAD") == 0;

    reset_head(ans);
    idem__buf_reset(&ans->body);
    ans->transport = IDEM_TRANSPORT_BROKEN;
    ans->status = 0;
    ans->too_big = false;
    ans->code = CURLE_OK;
    ans->os_errno = 0;
    ans->errbuf[0] = ans->problem_type[0] = ans->problem_detail[0] = '\0';

    long timeout = s->timeout_ms > 0 ? (long)s->timeout_ms : 1;
    curl_easy_setopt(h, CURLOPT_URL, s->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    /* A fresh connection for every exchange: on a reused one that the server
     * closed, libcurl silently sends the request again, an attempt the retry
     * policy would never count. */
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout < 10000 ? timeout : 10000L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, s->headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, s->user_agent);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, ans);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, ans);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ans->errbuf);
    /* The method: a body makes libcurl's POST, renamed unless the method is
     * POST; HEAD must not wait for a body; anything else is a GET renamed. */
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(h, CURLOPT_NOBODY, 0L);
    if (post) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)s->body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, s->body ? s->body : "");
    } else if (head) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }
    if (strcmp(s->method, post ? "POST" : head ? "HEAD" : "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, s->method);

}

void idem__cli_exchange_finish(CURL *h, CURLcode code, idem_cli_answer_t *ans)
{
    ans->code = code;
    ans->transport = classify(ans->code);
    if (ans->code == CURLE_COULDNT_CONNECT)
        curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &ans->os_errno);
    if (ans->transport == IDEM_TRANSPORT_OK) {
        long st = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
        ans->status = (int)st;
        read_problem(ans);
    }
    /* The strings lent to the handle die with this call. */
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
}

void idem__cli_exchange(CURL *h, const idem_cli_send_t *s, idem_cli_answer_t *ans)
{
    idem__cli_exchange_prepare(h, s, ans);
    idem__cli_exchange_finish(h, curl_easy_perform(h), ans);
}

bool idem__cli_header_add(struct curl_slist **l, const char *line)
{
    struct curl_slist *t = curl_slist_append(*l, line);
    if (t == NULL) {
        curl_slist_free_all(*l);
        *l = NULL;
        return false;
    }
    *l = t;
    return true;
}

idem_attempt_t idem__cli_attempt(const idem_cli_answer_t *ans)
{
    idem_attempt_t at = {.transport = ans->transport, .status = ans->status};
    if (ans->transport == IDEM_TRANSPORT_OK) {
        if (ans->has_retry_after) {
            at.retry_after = ans->head.data + ans->retry_after_off;
            at.retry_after_len = ans->retry_after_len;
        }
        if (ans->problem_type[0] != '\0')
            at.problem_type = ans->problem_type;
    }
    return at;
}

void idem__cli_answer_describe(const idem_cli_answer_t *ans, char *out, size_t cap)
{
    static const char prefix[] = "urn:idem:problem:";
    const char *detail = ans->errbuf[0] ? ans->errbuf : curl_easy_strerror(ans->code);

    switch (ans->transport) {
    case IDEM_TRANSPORT_OK: {
        const char *t = ans->problem_type;
        if (strncmp(t, prefix, sizeof prefix - 1) == 0)
            t += sizeof prefix - 1;
        snprintf(out, cap, "%d%s%s", ans->status, *t ? " " : "", t);
        return;
    }
    case IDEM_TRANSPORT_CONNECT:
        if (ans->code == CURLE_COULDNT_CONNECT && ans->os_errno == ECONNREFUSED)
            snprintf(out, cap, "connection refused");
        else if (ans->code == CURLE_COULDNT_RESOLVE_HOST)
            snprintf(out, cap, "could not resolve the host");
        else if (ans->code == CURLE_COULDNT_RESOLVE_PROXY)
            snprintf(out, cap, "could not resolve the proxy");
        else
            snprintf(out, cap, "could not connect: %s", detail);
        return;
    case IDEM_TRANSPORT_TIMEOUT:
        snprintf(out, cap, "timed out");
        return;
    default:
        snprintf(out, cap, "connection broken: %s", detail);
        return;
    }
}

idem_err_t idem__cli_url_check(const char *in, bool base, char **out, char *err, size_t errlen)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *part = NULL, *full = NULL;
    idem_err_t rc = IDEM_E_INVAL;
    CURLUcode uc;

    *out = NULL;
    if (u == NULL) {
        snprintf(err, errlen, "out of memory");
        return IDEM_E_NOMEM;
    }
    uc = curl_url_set(u, CURLUPART_URL, in, CURLU_GUESS_SCHEME);
    if (uc != CURLUE_OK) {
        snprintf(err, errlen, "bad URL '%.80s': %s", in, curl_url_strerror(uc));
        goto done;
    }
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)) {
        snprintf(err, errlen, "bad URL '%.80s': only http and https", in);
        goto done;
    }
    if (base && (curl_url_get(u, CURLUPART_QUERY, &part, 0) != CURLUE_NO_QUERY ||
                 curl_url_get(u, CURLUPART_FRAGMENT, &part, 0) != CURLUE_NO_FRAGMENT)) {
        snprintf(err, errlen, "bad URL '%.80s': no query or fragment here", in);
        goto done;
    }
    if (curl_url_get(u, CURLUPART_URL, &full, 0) != CURLUE_OK) {
        snprintf(err, errlen, "bad URL '%.80s'", in);
        goto done;
    }
    size_t n = strlen(full);
    while (base && n > 0 && full[n - 1] == '/')
        n--;
    *out = malloc(n + 1);
    if (*out == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = IDEM_E_NOMEM;
        goto done;
    }
    memcpy(*out, full, n);
    (*out)[n] = '\0';
    rc = IDEM_OK;
done:
    for (char *p = err; rc != IDEM_OK && *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
            *p = '?';
    curl_free(scheme);
    curl_free(part);
    curl_free(full);
    curl_url_cleanup(u);
    return rc;
}
