/* src/http/writer.c - a bounded growable buffer and the HTTP/1.1 writers
 * that append to it (status line, field lines, chunks), plus reason phrases.
 *
 * idem_buf_t follows curl's dynbuf: it grows by doubling but never holds more
 * than its max bytes, and every append is all or nothing, so a refused append
 * (over the cap, out of memory, or a field that would break the message)
 * leaves the buffer exactly as it was.  Each writer computes its whole size
 * first, reserves it, then copies.  The writers refuse field names that are
 * not tokens and values or reasons containing CR, LF or NUL, so data from a
 * client or an upstream can never inject a header line.
 *
 * src/http uses nothing of ours outside src/http, so memory comes from the C
 * library's malloc directly rather than the idem_malloc hook.
 *
 * INVARIANTS: b->len <= b->max when max != 0; b->len <= b->cap.
 * THREADING: a buffer belongs to one thread at a time.
 */
#include "http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_ALLOC 256

void idem_buf_init(idem_buf_t *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

void idem_buf_cleanup(idem_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void idem_buf_reset(idem_buf_t *b)
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

int idem_buf_append(idem_buf_t *b, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (reserve(b, n) != 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int idem_buf_append_str(idem_buf_t *b, const char *s)
{
    return idem_buf_append(b, s, strlen(s));
}

int idem_buf_appendf(idem_buf_t *b, const char *fmt, ...)
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

void idem_buf_consume(idem_buf_t *b, size_t n)
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

int idem_http_write_status(idem_buf_t *b, int status)
{
    if (status < 100 || status > 999)
        return -1;
    return idem_buf_appendf(b, "HTTP/1.1 %d %s\r\n", status, idem_http_reason(status));
}

int idem_http_write_field(idem_buf_t *b, const char *name, size_t name_len, const char *value,
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

int idem_http_write_chunk(idem_buf_t *b, const void *data, size_t n)
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

int idem_http_write_last_chunk(idem_buf_t *b)
{
    return idem_buf_append(b, "0\r\n\r\n", 5);
}

const char *idem_http_reason(int status)
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
