/* src/http/writer.c - a bounded growable buffer and the HTTP/1.1 writers
 * that append to it (status line, field lines, chunks, whole response heads),
 * plus reason phrases.
 *
 * idem_buf_t follows curl's dynbuf: it grows by doubling but never holds more
 * than its max bytes, and every append is all or nothing, so a refused append
 * (over the cap, out of memory, or a field that would break the message)
 * leaves the buffer exactly as it was.  Each writer computes its whole size
 * first, reserves it, then copies.  The writers refuse field names that are
 * not tokens and values or reasons containing CR, LF or NUL, so data from a
 * client or an upstream can never inject a header line.
 *
 * idem__http_write_head is the one place a response head is written: every
 * answer idemd sends (its own problems and JSON, a replay, a relayed
 * upstream response, a streamed one, 100 Continue, the admin endpoints)
 * goes through it.  It owns the fields that frame a message and say what
 * becomes of the connection (Content-Length, Transfer-Encoding, Connection),
 * deriving them from the framing the caller names and the request being
 * answered (HTTP/1.0 keep-alive, HEAD, 1xx/204/304), so no caller can write
 * a head that disagrees with the body that follows, or half a head: it
 * checks and measures everything, reserves the whole size once, and only
 * then copies (h2o's flatten_headers and curl's dynbuf are the models).
 *
 * src/http uses nothing of ours outside src/http, so memory comes from the C
 * library's malloc directly rather than the idem_malloc hook.
 *
 * INVARIANTS: b->len <= b->max when max != 0; b->len <= b->cap; a writer that
 * fails leaves b->len and b->data[0..len) as they were.
 * THREADING: a buffer belongs to one thread at a time.
 */
#include "http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_ALLOC 256

void idem__buf_init(idem_buf_t *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

void idem__buf_cleanup(idem_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void idem__buf_reset(idem_buf_t *b)
{
    b->len = 0;
}

/* Make room for n more bytes plus one spare byte (vsnprintf writes a NUL).
 * The spare byte is allocation only: len still never passes max. */
static int reserve(idem_buf_t *b, size_t n)
{
    if (n > SIZE_MAX - 1 - b->len)
        return -1;
    size_t need = b->len + n;
    if (b->max != 0 && need > b->max)
        return -1;
    if (need + 1 <= b->cap)
        return 0;
    size_t cap = b->cap < MIN_ALLOC ? MIN_ALLOC : b->cap;
    while (cap < need + 1)
        cap = cap > SIZE_MAX / 2 ? need + 1 : cap * 2;
    if (b->max != 0 && b->max < SIZE_MAX && cap > b->max + 1)
        cap = b->max + 1;
    char *p = realloc(b->data, cap);
    if (p == NULL)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int idem__buf_append(idem_buf_t *b, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (reserve(b, n) != 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int idem__buf_append_str(idem_buf_t *b, const char *s)
{
    return idem__buf_append(b, s, strlen(s));
}

int idem__buf_appendf(idem_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n) != 0)
        return -1;
    va_start(ap, fmt);
    int m = vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    if (m != n)
        return -1;
    b->len += (size_t)n;
    return 0;
}

void idem__buf_consume(idem_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

int idem__http_write_status(idem_buf_t *b, int status)
{
    if (status < 100 || status > 999)
        return -1;
    return idem__buf_appendf(b, "HTTP/1.1 %d %s\r\n", status, idem__http_reason(status));
}

int idem__http_write_field(idem_buf_t *b, const char *name, size_t name_len, const char *value,
                           size_t value_len)
{
    if (name_len == 0)
        return -1;
    for (size_t i = 0; i < name_len; i++)
        if (!is_tchar((unsigned char)name[i]))
            return -1;
    for (size_t i = 0; i < value_len; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c == '\r' || c == '\n' || c == '\0')
            return -1;
    }
    if (name_len > SIZE_MAX - 4 - value_len || reserve(b, name_len + value_len + 4) != 0)
        return -1;
    char *p = b->data + b->len;
    memcpy(p, name, name_len);
    p += name_len;
    memcpy(p, ": ", 2);
    p += 2;
    if (value_len > 0)
        memcpy(p, value, value_len);
    p += value_len;
    memcpy(p, "\r\n", 2);
    b->len += name_len + value_len + 4;
    return 0;
}

int idem__http_write_chunk(idem_buf_t *b, const void *data, size_t n)
{
    if (n == 0)
        return 0;
    char size[2 * sizeof(size_t) + 3];
    int k = snprintf(size, sizeof size, "%zx\r\n", n);
    if (k < 0 || (size_t)k >= sizeof size || n > SIZE_MAX - (size_t)k - 2 ||
        reserve(b, (size_t)k + n + 2) != 0)
        return -1;
    char *p = b->data + b->len;
    memcpy(p, size, (size_t)k);
    memcpy(p + k, data, n);
    memcpy(p + k + n, "\r\n", 2);
    b->len += (size_t)k + n + 2;
    return 0;
}

int idem__http_write_last_chunk(idem_buf_t *b)
{
    return idem__buf_append(b, "0\r\n\r\n", 5);
}

/* ---- whole response heads ---------------------------------------------- */

/* Whether v[0..n) may be a field value or a reason phrase on the wire. */
static bool value_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c == '\r' || c == '\n' || c == '\0')
            return false;
    }
    return true;
}

static bool slice_is(idem_slice_t s, const char *lower)
{
    size_t n = strlen(lower);
    if (s.len != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c - 'A' + 'a');
        if (c != (unsigned char)lower[i])
            return false;
    }
    return true;
}

bool idem__http_status_bodiless(int status)
{
    return (status >= 100 && status < 200) || status == 204 || status == 304;
}

/* A head checked and measured, ready to be copied: what
 * idem__http_write_head decided, so that copying cannot fail. */
typedef struct {
    idem_slice_t reason;
    char length[48];       /* "Content-Length: n\r\n", or empty */
    size_t length_len;
    const char *framing;   /* "Transfer-Encoding: chunked\r\n", or "" */
    const char *connection; /* "Connection: ...\r\n", or "" */
    size_t size;           /* the whole head, blank line included */
} head_plan_t;

static int plan_head(const idem_http_response_t *r, idem_http_reply_t to, head_plan_t *p)
{
    if (r->status < 100 || r->status > 999)
        return -1;
    p->reason = r->reason;
    if (p->reason.ptr == NULL) {
        const char *std = idem__http_reason(r->status);
        p->reason = (idem_slice_t){std, strlen(std)};
    } else if (p->reason.len > SIZE_MAX / 4 || !value_ok(p->reason.ptr, p->reason.len)) {
        return -1;
    }
    /* "HTTP/1.1 " + three digits + " " + reason + CRLF, and the blank line. */
    size_t size = 9 + 3 + 1 + p->reason.len + 2 + 2;
    for (size_t i = 0; i < r->n_fields; i++) {
        idem_slice_t name = r->fields[i].name, value = r->fields[i].value;
        if (name.len == 0 || !value_ok(value.ptr, value.len))
            return -1;
        for (size_t k = 0; k < name.len; k++)
            if (!is_tchar((unsigned char)name.ptr[k]))
                return -1;
        /* The framing and the connection's fate are this function's to say:
         * a second Content-Length from a caller is a smuggling vector. */
        if (slice_is(name, "content-length") || slice_is(name, "transfer-encoding") ||
            slice_is(name, "connection"))
            return -1;
        if (name.len > SIZE_MAX / 4 || value.len > SIZE_MAX / 4 ||
            size > SIZE_MAX / 2 - name.len - value.len - 4)
            return -1;
        size += name.len + value.len + 4; /* ": " and CRLF */
    }
    bool interim = r->status < 200;
    idem_http_framing_t framing =
        idem__http_status_bodiless(r->status) ? IDEM_HTTP_BODY_NONE : r->framing;
    if (framing == IDEM_HTTP_BODY_CHUNKED && to.version_minor == 0)
        return -1; /* HTTP/1.0 has no chunked coding (RFC 9112 section 7) */
    if (framing == IDEM_HTTP_BODY_EOF && to.keep_alive)
        return -1; /* the body ends when the connection does */
    p->length_len = 0;
    p->framing = "";
    if (framing == IDEM_HTTP_BODY_LENGTH) {
        int k = snprintf(p->length, sizeof p->length, "Content-Length: %llu\r\n",
                         (unsigned long long)r->content_length);
        if (k < 0 || (size_t)k >= sizeof p->length)
            return -1;
        p->length_len = (size_t)k;
    } else if (framing == IDEM_HTTP_BODY_CHUNKED) {
        p->framing = "Transfer-Encoding: chunked\r\n";
    }
    if (interim)
        p->connection = ""; /* the final response says what becomes of the connection */
    else if (!to.keep_alive)
        p->connection = "Connection: close\r\n";
    else if (to.version_minor == 0)
        p->connection = "Connection: keep-alive\r\n";
    else
        p->connection = "";
    size += p->length_len + strlen(p->framing) + strlen(p->connection);
    p->size = size;
    return 0;
}

/* Copy a planned head to dst, which has room for p->size bytes. */
static void emit_head(char *dst, const idem_http_response_t *r, const head_plan_t *p)
{
    char *o = dst;
    memcpy(o, "HTTP/1.1 ", 9);
    o[9] = (char)('0' + r->status / 100);
    o[10] = (char)('0' + r->status / 10 % 10);
    o[11] = (char)('0' + r->status % 10);
    o[12] = ' ';
    o += 13;
    if (p->reason.len > 0)
        memcpy(o, p->reason.ptr, p->reason.len);
    o += p->reason.len;
    memcpy(o, "\r\n", 2);
    o += 2;
    for (size_t i = 0; i < r->n_fields; i++) {
        idem_slice_t name = r->fields[i].name, value = r->fields[i].value;
        memcpy(o, name.ptr, name.len);
        o += name.len;
        memcpy(o, ": ", 2);
        o += 2;
        if (value.len > 0)
            memcpy(o, value.ptr, value.len);
        o += value.len;
        memcpy(o, "\r\n", 2);
        o += 2;
    }
    memcpy(o, p->length, p->length_len);
    o += p->length_len;
    size_t n = strlen(p->framing);
    memcpy(o, p->framing, n);
    o += n;
    n = strlen(p->connection);
    memcpy(o, p->connection, n);
    o += n;
    memcpy(o, "\r\n", 2);
}

int idem__http_write_head(idem_buf_t *b, const idem_http_response_t *r, idem_http_reply_t to)
{
    head_plan_t p;
    if (plan_head(r, to, &p) != 0 || reserve(b, p.size) != 0)
        return -1;
    emit_head(b->data + b->len, r, &p);
    b->len += p.size;
    return 0;
}

int idem__http_write_response(idem_buf_t *b, const idem_http_response_t *r, idem_http_reply_t to,
                              const void *body, size_t n)
{
    idem_http_response_t framed = *r;
    framed.framing = IDEM_HTTP_BODY_LENGTH;
    framed.content_length = n;
    head_plan_t p;
    if (plan_head(&framed, to, &p) != 0)
        return -1;
    if (to.head || idem__http_status_bodiless(r->status))
        n = 0;
    if (n > SIZE_MAX - p.size || reserve(b, p.size + n) != 0)
        return -1;
    emit_head(b->data + b->len, &framed, &p);
    if (n > 0)
        memcpy(b->data + b->len + p.size, body, n);
    b->len += p.size + n;
    return 0;
}

const char *idem__http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
