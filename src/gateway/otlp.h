/* src/gateway/otlp.h - traces: W3C trace context, spans, and their export
 * over OTLP/HTTP with the JSON encoding (SPEC section 19, docs/admin.md
 * "Traces").
 *
 * There is no OpenTelemetry SDK for C in Debian 12, so this is a small one
 * of our own, in three parts:
 *
 *   - the W3C trace context: idem__otlp_traceparent_parse reads an incoming
 *     `traceparent` strictly, idem__otlp_traceparent_format writes the one
 *     idemd forwards upstream;
 *   - a span (idem_span_t): a fixed-size value, with its attributes' text
 *     in an arena of its own, so it is copied into the queue whole and never
 *     points at a request that has ended; idem__otlp_encode writes spans as
 *     an ExportTraceServiceRequest in the OTLP JSON mapping (ids in hex,
 *     times and integers as strings);
 *   - the exporter (idem_otlp_t): a bounded queue that the request path
 *     fills under a short lock (one copy of a span) and a thread of its own
 *     that takes a batch (up to 512 spans, or what is there each second) and
 *     POSTs it with libcurl, with a timeout.  A full queue drops the span and
 *     counts it; a collector that is down, slow or refusing only costs that
 *     thread time and the spans of its batch (counted too).  Nothing on the
 *     request path ever waits for the collector.
 *
 * INVARIANTS: idem__otlp_enqueue never blocks on I/O and never allocates;
 * every span handed to it is exported, or counted in
 * idem_otlp_spans_dropped_total.
 * THREADING: idem__otlp_enqueue from any thread; create/start/destroy from
 * one thread (main.c), destroy after every thread that enqueues has stopped.
 * The parse, format and encode functions are pure and reentrant.
 */
#ifndef IDEM_GATEWAY_OTLP_H
#define IDEM_GATEWAY_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/metrics.h"
#include "http/http.h"
#include "idem/error.h"

#define IDEM_TRACE_ID_LEN 16
#define IDEM_SPAN_ID_LEN 8
#define IDEM_TRACEPARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */
#define IDEM_TRACE_FLAG_SAMPLED 0x01u

#define IDEM_SPAN_MAX_ATTRS 16
#define IDEM_SPAN_TEXT 640 /* bytes of attribute text (and name) a span holds */
#define IDEM_SPAN_VALUE_MAX 256 /* a longer string attribute (url.path) is cut */

#define IDEM_OTLP_QUEUE_DEFAULT 4096
#define IDEM_OTLP_QUEUE_MAX 1000000
#define IDEM_OTLP_BATCH 512       /* spans in one POST at most */
#define IDEM_OTLP_INTERVAL_MS 1000 /* a batch leaves at least this often */

/* Span kinds, as OTLP numbers them (trace.proto SpanKind). */
#define IDEM_SPAN_KIND_SERVER 2
#define IDEM_SPAN_KIND_CLIENT 3

/** A W3C trace context: what a `traceparent` carries. */
typedef struct idem_trace_ctx {
    uint8_t trace_id[IDEM_TRACE_ID_LEN];
    uint8_t span_id[IDEM_SPAN_ID_LEN]; /* the parent's span (incoming), or ours (outgoing) */
    uint8_t flags;                     /* IDEM_TRACE_FLAG_SAMPLED, other bits kept */
} idem_trace_ctx_t;

/** Parse a `traceparent` value (W3C Trace Context, level 1) strictly:
 * version "00", then exactly 32 lowercase hex digits of trace id (not all
 * zero), 16 of parent id (not all zero) and 2 of flags, separated by '-',
 * nothing before or after but optional spaces and tabs.  A version other
 * than 00 is refused too (idemd does not guess at a later format).
 * @return true with out filled; false (out zeroed) when v is malformed: the
 *         caller then starts a new trace. */
bool idem__otlp_traceparent_parse(const char *v, size_t n, idem_trace_ctx_t *out);

/** Write ctx as a `traceparent` value, version 00, NUL-terminated. */
void idem__otlp_traceparent_format(const idem_trace_ctx_t *ctx, char out[IDEM_TRACEPARENT_LEN + 1]);

/** One attribute of a span: a string (into the span's text) or an integer. */
typedef struct idem_span_attr {
    const char *key;  /* a static string ("http.request.method") */
    bool is_int;
    int64_t i;        /* is_int */
    uint16_t off;     /* !is_int: the value is text[off..off+len) */
    uint16_t len;
} idem_span_attr_t;

/** A finished span, self-contained (no pointer but to static keys). */
typedef struct idem_span {
    uint8_t trace_id[IDEM_TRACE_ID_LEN];
    uint8_t span_id[IDEM_SPAN_ID_LEN];
    uint8_t parent_id[IDEM_SPAN_ID_LEN];
    bool has_parent;
    uint8_t kind;            /* IDEM_SPAN_KIND_* */
    bool error;              /* status ERROR; else UNSET */
    uint64_t start_unix_ns;
    uint64_t end_unix_ns;
    uint16_t name_len;       /* the name is text[0..name_len) */
    uint16_t status_off;     /* error: its message is text[status_off..+status_len) */
    uint16_t status_len;
    uint16_t text_len;       /* bytes of text used */
    idem_span_attr_t attrs[IDEM_SPAN_MAX_ATTRS];
    uint8_t n_attrs;
    char text[IDEM_SPAN_TEXT];
} idem_span_t;

/** Start s: zeroed, with its ids, kind and name (cut to fit). */
void idem__span_init(idem_span_t *s, const uint8_t trace_id[IDEM_TRACE_ID_LEN],
                     const uint8_t span_id[IDEM_SPAN_ID_LEN], const uint8_t *parent_id,
                     int kind, const char *name, size_t name_len);
/** Add a string attribute (key static), cut to IDEM_SPAN_VALUE_MAX bytes
 * and to the room left; one that does not fit at all is left out. */
void idem__span_attr_str(idem_span_t *s, const char *key, const char *v, size_t n);
/** Add an integer attribute (key static); left out when the span is full. */
void idem__span_attr_int(idem_span_t *s, const char *key, int64_t v);
/** Mark s as failed (status ERROR) with a short message. */
void idem__span_error(idem_span_t *s, const char *msg);

/** Append one ExportTraceServiceRequest in the OTLP JSON mapping, holding
 * spans[0..n) under one resource (service.name = service) and one scope
 * ("idemd", its version), to out.
 * @return 0, or -1 when out of memory or out's cap was reached. */
int idem__otlp_encode(const idem_span_t *spans, size_t n, const char *service, idem_buf_t *out);

/** Fresh random ids (idem_random_bytes), never all zero.
 * @return IDEM_OK or the random source's error (the ids are then zero). */
idem_err_t idem__otlp_new_trace_id(uint8_t id[IDEM_TRACE_ID_LEN]);
idem_err_t idem__otlp_new_span_id(uint8_t id[IDEM_SPAN_ID_LEN]);

/** The wall clock in nanoseconds since the Unix epoch (span times). */
uint64_t idem__otlp_now_unix_ns(void);

/** The URL spans are POSTed to, from `otlp_endpoint`: the endpoint as
 * written when it has a path, else with "/v1/traces" appended (so both
 * http://collector:4318 and http://collector:4318/v1/traces work).
 * @return 0, or -1 when out is too small. */
int idem__otlp_traces_url(const char *endpoint, char *out, size_t outlen);

/** How the exporter runs. */
typedef struct idem_otlp_opts {
    const char *url;          /* where spans are POSTed (idem__otlp_traces_url) */
    const char *service_name; /* resource service.name */
    size_t queue_spans;       /* the queue's bound (1..IDEM_OTLP_QUEUE_MAX) */
    int64_t timeout_ms;       /* one POST, connection included */
} idem_otlp_opts_t;

typedef struct idem_otlp idem_otlp_t;

/** An exporter, its queue allocated, its thread not started.  opts' strings
 * are copied.  m (borrowed, outlives the exporter) gets its counters.
 * @return IDEM_OK, IDEM_E_NOMEM or IDEM_E_INVAL (bad opts); *out NULL on
 *         failure. */
idem_err_t idem__otlp_create(const idem_otlp_opts_t *opts, idem_metrics_t *m, idem_otlp_t **out);
/** Start the export thread.  @return 0, or -1 (errno set) when it cannot. */
int idem__otlp_start(idem_otlp_t *o);
/** Queue a copy of s.  Never blocks on the collector: when the queue is
 * full s is dropped and counted.  o NULL does nothing. */
void idem__otlp_enqueue(idem_otlp_t *o, const idem_span_t *s);
/** Stop the thread (a POST in progress is cut short), send what is queued
 * once more within a second, and free everything.  NULL does nothing. */
void idem__otlp_destroy(idem_otlp_t *o);

#endif /* IDEM_GATEWAY_OTLP_H */
