/* src/gateway/otlp.c - W3C trace context, spans, their OTLP/JSON encoding,
 * and the exporter thread that POSTs them to the collector (otlp.h).
 *
 * The queue is a ring of whole spans, allocated once at its bound.  The
 * request path takes its mutex only to copy one span in (a few hundred
 * bytes): the exporter holds it only to copy a batch out, never across a
 * POST, so a collector that hangs holds up nobody but the exporter.  A span
 * that finds the ring full is dropped and counted
 * (idem_otlp_spans_dropped_total): tracing loses spans before it slows a
 * request.
 *
 * The exporter wakes when a batch is full (IDEM_OTLP_BATCH) or a second has
 * passed, encodes the batch (idem__otlp_encode) and POSTs it with libcurl
 * under otlp_timeout.  An answer other than 2xx, or none, counts one export
 * failure and drops the batch's spans: traces are best effort, and retrying
 * a batch a collector refused would only grow the queue.  On shutdown
 * (idem__otlp_destroy) a POST in progress is cut short through curl's
 * progress callback, and what is queued is sent once more, with a one second
 * limit, so a stop never waits on a dead collector for long.
 *
 * THREADING: see otlp.h.  The exporter thread owns its curl handle and its
 * batch buffer; everything the request path touches is under o->lock or
 * atomic.
 */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/utf8.h"
#include "gateway/otlp.h"
#include "gateway/thread.h"
#include "idem/alloc.h"
#include "idem/random.h"
#include "idem/version.h"

#define FINAL_FLUSH_MS 1000 /* the last POST at shutdown, at most */

/* ---- W3C trace context ------------------------------------------------------ */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* uppercase hex is invalid in a traceparent */
}

/* n hex digits at p into n/2 bytes; false on any other character. */
static bool unhex(const char *p, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval(p[i]), lo = hexval(p[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

bool idem__otlp_traceparent_parse(const char *v, size_t n, idem_trace_ctx_t *out)
{
    memset(out, 0, sizeof *out);
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    idem_trace_ctx_t c;
    uint8_t version, flags;
    if (n != IDEM_TRACEPARENT_LEN || v[2] != '-' || v[35] != '-' || v[52] != '-' ||
        !unhex(v, 2, &version) || version != 0 || !unhex(v + 3, 32, c.trace_id) ||
        !unhex(v + 36, 16, c.span_id) || !unhex(v + 53, 2, &flags) ||
        all_zero(c.trace_id, sizeof c.trace_id) || all_zero(c.span_id, sizeof c.span_id))
        return false;
    c.flags = flags;
    *out = c;
    return true;
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

void idem__otlp_traceparent_format(const idem_trace_ctx_t *ctx, char out[IDEM_TRACEPARENT_LEN + 1])
{
    char t[33], s[17], f[3];
    hex(ctx->trace_id, sizeof ctx->trace_id, t);
    hex(ctx->span_id, sizeof ctx->span_id, s);
    hex(&ctx->flags, 1, f);
    snprintf(out, IDEM_TRACEPARENT_LEN + 1, "00-%s-%s-%s", t, s, f);
}

static idem_err_t new_id(uint8_t *id, size_t n)
{
    /* All zero is the invalid id: draw again (one chance in 2^64 or less). */
    for (int tries = 0; tries < 4; tries++) {
        idem_err_t rc = idem_random_bytes(id, n);
        if (rc != IDEM_OK)
            return rc;
        if (!all_zero(id, n))
            return IDEM_OK;
    }
    id[n - 1] = 1;
    return IDEM_OK;
}

idem_err_t idem__otlp_new_trace_id(uint8_t id[IDEM_TRACE_ID_LEN])
{
    return new_id(id, IDEM_TRACE_ID_LEN);
}

idem_err_t idem__otlp_new_span_id(uint8_t id[IDEM_SPAN_ID_LEN])
{
    return new_id(id, IDEM_SPAN_ID_LEN);
}

uint64_t idem__otlp_now_unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int idem__otlp_traces_url(const char *endpoint, char *out, size_t outlen)
{
    const char *rest = strstr(endpoint, "://");
    rest = rest ? rest + 3 : endpoint;
    const char *path = strchr(rest, '/');
    bool bare = path == NULL || strcmp(path, "/") == 0;
    size_t base = path ? (size_t)(path - endpoint) : strlen(endpoint);
    int n = bare ? snprintf(out, outlen, "%.*s/v1/traces", (int)base, endpoint)
                 : snprintf(out, outlen, "%s", endpoint);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* ---- spans --------------------------------------------------------------------- */

/* Copy at most max bytes of v into s's text; false when none fit.  A cut
 * never splits a UTF-8 sequence that was whole. */
static bool span_text(idem_span_t *s, const char *v, size_t n, size_t max, uint16_t *off,
                      uint16_t *len)
{
    size_t room = sizeof s->text - s->text_len;
    if (n > max)
        n = max;
    if (n > room)
        n = room;
    if (n == 0 && room == 0)
        return false;
    /* Back off to the start of a sequence when the cut fell inside one. */
    while (n > 0 && n < max && ((unsigned char)v[n] & 0xC0) == 0x80)
        n--;
    memcpy(s->text + s->text_len, v, n);
    *off = s->text_len;
    *len = (uint16_t)n;
    s->text_len = (uint16_t)(s->text_len + n);
    return true;
}

void idem__span_init(idem_span_t *s, const uint8_t trace_id[IDEM_TRACE_ID_LEN],
                     const uint8_t span_id[IDEM_SPAN_ID_LEN], const uint8_t *parent_id,
                     int kind, const char *name, size_t name_len)
{
    memset(s, 0, offsetof(idem_span_t, text));
    memcpy(s->trace_id, trace_id, IDEM_TRACE_ID_LEN);
    memcpy(s->span_id, span_id, IDEM_SPAN_ID_LEN);
    if (parent_id != NULL) {
        memcpy(s->parent_id, parent_id, IDEM_SPAN_ID_LEN);
        s->has_parent = true;
    }
    s->kind = (uint8_t)kind;
    uint16_t off;
    span_text(s, name, name_len, 128, &off, &s->name_len);
}

void idem__span_attr_str(idem_span_t *s, const char *key, const char *v, size_t n)
{
    if (s->n_attrs >= IDEM_SPAN_MAX_ATTRS)
        return;
    idem_span_attr_t *a = &s->attrs[s->n_attrs];
    if (!span_text(s, v, n, IDEM_SPAN_VALUE_MAX, &a->off, &a->len))
        return;
    a->key = key;
    a->is_int = false;
    s->n_attrs++;
}

void idem__span_attr_int(idem_span_t *s, const char *key, int64_t v)
{
    if (s->n_attrs >= IDEM_SPAN_MAX_ATTRS)
        return;
    s->attrs[s->n_attrs++] = (idem_span_attr_t){.key = key, .is_int = true, .i = v};
}

void idem__span_error(idem_span_t *s, const char *msg)
{
    s->error = true;
    span_text(s, msg, strlen(msg), 96, &s->status_off, &s->status_len);
}

/* ---- the OTLP JSON mapping ------------------------------------------------------ */

/* A JSON string.  Text that is not UTF-8 (a path is bytes) has each byte
 * over 0x7F written as U+FFFD's replacement '?', so the document is valid. */
static int json_str(idem_buf_t *b, const char *p, size_t n)
{
    bool utf8 = idem__utf8_valid(p, n);
    int rc = idem__buf_append(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, pending */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        } else if (c >= 0x80 && !utf8)
            esc = "?";
        if (esc == NULL) {
            run++;
            continue;
        }
        rc |= idem__buf_append(b, p + i - run, run);
        run = 0;
        rc |= idem__buf_append_str(b, esc);
    }
    rc |= idem__buf_append(b, p + n - run, run);
    rc |= idem__buf_append(b, "\"", 1);
    return rc;
}

static int encode_span(const idem_span_t *s, idem_buf_t *b)
{
    char t[33], id[17], parent[17];
    hex(s->trace_id, sizeof s->trace_id, t);
    hex(s->span_id, sizeof s->span_id, id);
    int rc = idem__buf_appendf(b, "{\"traceId\":\"%s\",\"spanId\":\"%s\",", t, id);
    if (s->has_parent) {
        hex(s->parent_id, sizeof s->parent_id, parent);
        rc |= idem__buf_appendf(b, "\"parentSpanId\":\"%s\",", parent);
    }
    rc |= idem__buf_append_str(b, "\"name\":");
    rc |= json_str(b, s->text, s->name_len);
    rc |= idem__buf_appendf(b,
                            ",\"kind\":%u,\"startTimeUnixNano\":\"%llu\","
                            "\"endTimeUnixNano\":\"%llu\",\"attributes\":[",
                            (unsigned)s->kind, (unsigned long long)s->start_unix_ns,
                            (unsigned long long)s->end_unix_ns);
    for (size_t i = 0; i < s->n_attrs; i++) {
        const idem_span_attr_t *a = &s->attrs[i];
        rc |= idem__buf_append_str(b, i ? ",{\"key\":" : "{\"key\":");
        rc |= json_str(b, a->key, strlen(a->key));
        if (a->is_int) {
            rc |= idem__buf_appendf(b, ",\"value\":{\"intValue\":\"%lld\"}}", (long long)a->i);
        } else {
            rc |= idem__buf_append_str(b, ",\"value\":{\"stringValue\":");
            rc |= json_str(b, s->text + a->off, a->len);
            rc |= idem__buf_append_str(b, "}}");
        }
    }
    rc |= idem__buf_append_str(b, "],\"status\":{");
    if (s->error) {
        rc |= idem__buf_append_str(b, "\"code\":2,\"message\":");
        rc |= json_str(b, s->text + s->status_off, s->status_len);
    }
    rc |= idem__buf_append_str(b, "}}");
    return rc;
}

int idem__otlp_encode(const idem_span_t *spans, size_t n, const char *service, idem_buf_t *out)
{
    int rc = idem__buf_append_str(out, "{\"resourceSpans\":[{\"resource\":{\"attributes\":["
                                       "{\"key\":\"service.name\",\"value\":{\"stringValue\":");
    rc |= json_str(out, service, strlen(service));
    rc |= idem__buf_appendf(out,
                            "}}]},\"scopeSpans\":[{\"scope\":{\"name\":\"idemd\",\"version\":"
                            "\"%s\"},\"spans\":[",
                            IDEM_VERSION_STRING);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (i > 0)
            rc |= idem__buf_append(out, ",", 1);
        rc |= encode_span(&spans[i], out);
    }
    rc |= idem__buf_append_str(out, "]}]}]}");
    return rc ? -1 : 0;
}

/* ---- the exporter ---------------------------------------------------------------- */

struct idem_otlp {
    char *url;
    char *service;
    int64_t timeout_ms;
    idem_metrics_t *m;
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* a batch is full, or stop */
    idem_span_t *ring;          /* cap spans */
    size_t cap, head, count;    /* the oldest is ring[head] */
    bool stop;                  /* under lock: the thread ends */
    _Atomic bool cut;           /* a POST in progress ends now (shutdown) */
    bool started;
    pthread_t thread;
    idem_span_t *batch;         /* the exporter's copy of one batch */
    size_t batch_max;
    CURL *curl;
    idem_buf_t body;
};

idem_err_t idem__otlp_create(const idem_otlp_opts_t *opts, idem_metrics_t *m, idem_otlp_t **out)
{
    *out = NULL;
    if (opts->url == NULL || opts->service_name == NULL || opts->queue_spans == 0 ||
        opts->queue_spans > IDEM_OTLP_QUEUE_MAX || opts->timeout_ms <= 0)
        return IDEM_E_INVAL;
    idem_otlp_t *o = idem_calloc(1, sizeof *o);
    if (o == NULL)
        return IDEM_E_NOMEM;
    o->m = m;
    o->timeout_ms = opts->timeout_ms;
    o->cap = opts->queue_spans;
    o->batch_max = o->cap < IDEM_OTLP_BATCH ? o->cap : IDEM_OTLP_BATCH;
    size_t ul = strlen(opts->url) + 1, sl = strlen(opts->service_name) + 1;
    o->url = idem_malloc(ul);
    o->service = idem_malloc(sl);
    o->ring = idem_calloc(o->cap, sizeof *o->ring);
    o->batch = idem_calloc(o->batch_max, sizeof *o->batch);
    idem__buf_init(&o->body, 0);
    if (o->url == NULL || o->service == NULL || o->ring == NULL || o->batch == NULL)
        goto nomem;
    /* Before any thread uses curl (main.c creates the exporter at start-up,
     * before the workers); idem__otlp_destroy undoes it. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto nomem;
    memcpy(o->url, opts->url, ul);
    memcpy(o->service, opts->service_name, sl);
    if (pthread_mutex_init(&o->lock, NULL) != 0) {
        curl_global_cleanup();
        goto nomem;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int crc = pthread_cond_init(&o->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (crc != 0) {
        pthread_mutex_destroy(&o->lock);
        curl_global_cleanup();
        goto nomem;
    }
    *out = o;
    return IDEM_OK;
nomem:
    idem_free(o->url);
    idem_free(o->service);
    idem_free(o->ring);
    idem_free(o->batch);
    idem_free(o);
    return IDEM_E_NOMEM;
}

void idem__otlp_enqueue(idem_otlp_t *o, const idem_span_t *s)
{
    if (o == NULL)
        return;
    pthread_mutex_lock(&o->lock);
    if (o->count == o->cap || o->stop) {
        pthread_mutex_unlock(&o->lock);
        atomic_fetch_add_explicit(&o->m->otlp_spans_dropped, 1, memory_order_relaxed);
        return;
    }
    idem_span_t *slot = &o->ring[(o->head + o->count) % o->cap];
    /* The text only as far as it is used: most of a span's arena is empty. */
    memcpy(slot, s, offsetof(idem_span_t, text) + s->text_len);
    o->count++;
    bool full = o->count >= o->batch_max;
    pthread_mutex_unlock(&o->lock);
    if (full)
        pthread_cond_signal(&o->wake);
}

static size_t discard_answer(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
}

/* curl asks this often during a transfer: non-zero ends it (shutdown). */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    idem_otlp_t *o = arg;
    return atomic_load(&o->cut) ? 1 : 0;
}

/* POST batch[0..n) once.  @return true when the collector took it (2xx). */
static bool post(idem_otlp_t *o, size_t n, int64_t timeout_ms)
{
    idem__buf_reset(&o->body);
    if (idem__otlp_encode(o->batch, n, o->service, &o->body) != 0)
        return false;
    if (o->curl == NULL) {
        o->curl = curl_easy_init();
        if (o->curl == NULL)
            return false;
    }
    CURL *c = o->curl;
    curl_easy_reset(c);
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (hdrs == NULL)
        return false;
    curl_easy_setopt(c, CURLOPT_URL, o->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, o->body.data);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->body.len);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard_answer);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, o);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    return rc == CURLE_OK && status >= 200 && status < 300;
}

/* Export what take() copied, and count how it went. */
static void export_batch(idem_otlp_t *o, size_t n, int64_t timeout_ms)
{
    if (post(o, n, timeout_ms)) {
        atomic_fetch_add_explicit(&o->m->otlp_spans_exported, n, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&o->m->otlp_export_failures, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&o->m->otlp_spans_dropped, n, memory_order_relaxed);
    }
}

/* Copy up to a batch out of the ring (under o->lock). */
static size_t take(idem_otlp_t *o)
{
    size_t n = o->count < o->batch_max ? o->count : o->batch_max;
    for (size_t i = 0; i < n; i++) {
        const idem_span_t *s = &o->ring[(o->head + i) % o->cap];
        memcpy(&o->batch[i], s, offsetof(idem_span_t, text) + s->text_len);
    }
    o->head = (o->head + n) % o->cap;
    o->count -= n;
    return n;
}

static void *exporter_main(void *arg)
{
    idem_otlp_t *o = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&o->lock);
    while (!o->stop) {
        next.tv_sec += IDEM_OTLP_INTERVAL_MS / 1000;
        next.tv_nsec += (long)(IDEM_OTLP_INTERVAL_MS % 1000) * 1000000L;
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        while (!o->stop && o->count < o->batch_max) {
            int rc = pthread_cond_timedwait(&o->wake, &o->lock, &next);
            if (rc == ETIMEDOUT)
                break;
        }
        /* Drain in batches: a full ring needs several POSTs per wake. */
        size_t n;
        while (!o->stop && (n = take(o)) > 0) {
            pthread_mutex_unlock(&o->lock);
            export_batch(o, n, o->timeout_ms);
            pthread_mutex_lock(&o->lock);
            if (o->count < o->batch_max)
                break;
        }
        clock_gettime(CLOCK_MONOTONIC, &next);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

int idem__otlp_start(idem_otlp_t *o)
{
    int rc = idem__thread_create(&o->thread, "otlp", exporter_main, o);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    o->started = true;
    return 0;
}

void idem__otlp_destroy(idem_otlp_t *o)
{
    if (o == NULL)
        return;
    pthread_mutex_lock(&o->lock);
    o->stop = true;
    pthread_mutex_unlock(&o->lock);
    atomic_store(&o->cut, true);
    pthread_cond_signal(&o->wake);
    if (o->started)
        pthread_join(o->thread, NULL);
    /* One last batch of what is queued, within FINAL_FLUSH_MS; the rest is
     * counted as dropped. */
    atomic_store(&o->cut, false);
    size_t n = take(o);
    if (n > 0)
        export_batch(o, n, o->timeout_ms < FINAL_FLUSH_MS ? o->timeout_ms : FINAL_FLUSH_MS);
    if (o->count > 0)
        atomic_fetch_add_explicit(&o->m->otlp_spans_dropped, o->count, memory_order_relaxed);
    if (o->curl != NULL)
        curl_easy_cleanup(o->curl);
    curl_global_cleanup();
    idem__buf_cleanup(&o->body);
    pthread_cond_destroy(&o->wake);
    pthread_mutex_destroy(&o->lock);
    idem_free(o->url);
    idem_free(o->service);
    idem_free(o->ring);
    idem_free(o->batch);
    idem_free(o);
}
