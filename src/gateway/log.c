/* src/gateway/log.c - idemd's log: process events and one line per request.
 *
 * Lines go to stderr, as text (key=value) or JSON (--log-format json).
 * Process events are written at once.  Request lines are appended to the
 * worker's buffer and written once per loop turn (or when the buffer is
 * large), so logging costs a write per batch of requests, not per request.
 * The raw Authorization value is never logged: only the scope (its hash)
 * and only its first 12 hex digits.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/request.h"
#include "gateway/worker.h"
#include "idem/clock.h"

#define LOG_FLUSH_AT (32 * 1024)

/* RFC 3339 UTC with milliseconds.  The date and time of day are formatted
 * once per second per thread; a request line only adds the milliseconds. */
static void timestamp(char *out, size_t n)
{
    static __thread time_t cached_sec = -1;
    static __thread char cached[32];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != cached_sec) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(cached, sizeof cached, "%Y-%m-%dT%H:%M:%S", &tm);
        cached_sec = ts.tv_sec;
    }
    unsigned ms = (unsigned)(ts.tv_nsec / 1000000) % 1000u;
    size_t k = strnlen(cached, sizeof cached);
    if (n < k + 6)
        return;
    memcpy(out, cached, k);
    out[k] = '.';
    out[k + 1] = (char)('0' + ms / 100);
    out[k + 2] = (char)('0' + ms / 10 % 10);
    out[k + 3] = (char)('0' + ms % 10);
    out[k + 4] = 'Z';
    out[k + 5] = '\0';
}

/* Append s (n bytes) as the inside of a JSON string. */
static void json_escape(idem_buf_t *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            idem__buf_append(b, e, 2);
        } else if (c < 0x20 || c >= 0x7f) {
            idem__buf_appendf(b, "\\u%04x", c);
        } else {
            idem__buf_append(b, &s[i], 1);
        }
    }
}

/* Append s as a text-format value: quoted when it holds a space or quote. */
static void text_value(idem_buf_t *b, const char *s, size_t n)
{
    bool plain = n > 0;
    for (size_t i = 0; i < n && plain; i++)
        if (s[i] == ' ' || s[i] == '"' || s[i] == '=' || (unsigned char)s[i] < 0x21)
            plain = false;
    if (plain) {
        idem__buf_append(b, s, n);
        return;
    }
    idem__buf_append(b, "\"", 1);
    json_escape(b, s, n);
    idem__buf_append(b, "\"", 1);
}

void idem__log(idem_gw_t *gw, const char *level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char ts[40];
    timestamp(ts, sizeof ts);
    idem_buf_t b;
    idem__buf_init(&b, 4096);
    if (gw && gw->log_json) {
        idem__buf_appendf(&b, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts, level);
        json_escape(&b, msg, strlen(msg));
        idem__buf_append_str(&b, "\"}\n");
    } else {
        idem__buf_appendf(&b, "%s %s idemd: %s\n", ts, level, msg);
    }
    if (b.len && write(STDERR_FILENO, b.data, b.len) < 0) {
        /* Nothing sensible to do when stderr is gone. */
    }
    idem__buf_cleanup(&b);
}

void idem__log_request(idem_worker_t *w, const idem_req_t *req)
{
    idem_buf_t *b = &w->log;
    char ts[40];
    timestamp(ts, sizeof ts);
    /* Milliseconds with three decimals, without floating-point printing. */
    unsigned long long us = (unsigned long long)((idem_clock_mono_ns() - req->t_start_ns) / 1000);
    unsigned long long ms_int = us / 1000, ms_frac = us % 1000;
    const char *outcome = idem__outcome_name(req->outcome);
    size_t before = b->len;
    int rc;
    if (w->gw->log_json) {
        rc = idem__buf_appendf(b, "{\"ts\":\"%s\",\"level\":\"info\",\"method\":\"", ts);
        json_escape(b, req->msg.method.ptr, req->msg.method.len);
        idem__buf_append_str(b, "\",\"path\":\"");
        json_escape(b, req->msg.target.ptr, req->msg.target.len);
        idem__buf_appendf(b, "\",\"status\":%d,\"outcome\":\"%s\",\"proto\":\"%s\"",
                          req->status, outcome, req->proto);
        if (req->keyed) {
            idem__buf_append_str(b, ",\"key\":\"");
            json_escape(b, req->id.key, strlen(req->id.key));
            idem__buf_appendf(b, "\",\"scope\":\"%.12s\",\"fence\":%llu", req->id.scope,
                              (unsigned long long)req->fence);
        }
        rc |= idem__buf_appendf(b, ",\"ms\":%llu.%03llu}\n", ms_int, ms_frac);
    } else {
        rc = idem__buf_appendf(b, "%s info request method=%.*s path=", ts,
                               (int)req->msg.method.len, req->msg.method.ptr);
        text_value(b, req->msg.target.ptr, req->msg.target.len);
        idem__buf_appendf(b, " status=%d outcome=%s proto=%s", req->status, outcome,
                          req->proto);
        if (req->keyed) {
            idem__buf_append_str(b, " key=");
            text_value(b, req->id.key, strlen(req->id.key));
            idem__buf_appendf(b, " scope=%.12s fence=%llu", req->id.scope,
                              (unsigned long long)req->fence);
        }
        rc |= idem__buf_appendf(b, " ms=%llu.%03llu\n", ms_int, ms_frac);
    }
    if (rc != 0) {
        /* The buffer is full: drop this line rather than grow without bound. */
        b->len = before;
        idem__log_flush(w);
    }
    if (b->len >= LOG_FLUSH_AT)
        idem__log_flush(w);
}

void idem__log_flush(idem_worker_t *w)
{
    size_t off = 0;
    while (off < w->log.len) {
        ssize_t n = write(STDERR_FILENO, w->log.data + off, w->log.len - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    idem__buf_reset(&w->log);
}
