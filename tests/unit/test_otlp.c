/* tests/unit/test_otlp.c - the W3C traceparent reader and writer, spans and
 * their OTLP JSON encoding, the traces URL, and the exporter's bounded queue
 * (src/gateway/otlp.c).
 *
 * The exporter's POSTs are tested through the real binaries
 * (tests/blackbox/test_otlp.py, a collector of its own); here its queue is
 * filled with no thread running, so the drop count is exact.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "gateway/otlp.h"

static const char *const TID = "4bf92f3577b34da6a3ce929d0e0e4736";
static const char *const PID = "00f067aa0ba902b7";

static bool parse(const char *v, idem_trace_ctx_t *c)
{
    return idem__otlp_traceparent_parse(v, strlen(v), c);
}

Test(otlp, traceparent_valid_is_read_and_written_back)
{
    idem_trace_ctx_t c;
    cr_assert(parse(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\t", &c));
    cr_expect_eq(c.trace_id[0], 0x4b);
    cr_expect_eq(c.trace_id[15], 0x36);
    cr_expect_eq(c.span_id[7], 0xb7);
    cr_expect_eq(c.flags, 1);
    char out[IDEM_TRACEPARENT_LEN + 1];
    idem__otlp_traceparent_format(&c, out);
    cr_expect_str_eq(out, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

Test(otlp, traceparent_malformed_is_refused)
{
    char v[128];
    /* Each with TID and PID where a traceparent has them. */
    const char *bad[] = {
        "", "00", "01-" "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-001",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0G",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
    };
    idem_trace_ctx_t c;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect(!parse(bad[i], &c), "accepted %s", bad[i]);
    snprintf(v, sizeof v, "00-%s-%s-01", "4BF92F3577B34DA6A3CE929D0E0E4736", PID);
    cr_expect(!parse(v, &c), "uppercase hex");
    snprintf(v, sizeof v, "00-%s-%s-01", "00000000000000000000000000000000", PID);
    cr_expect(!parse(v, &c), "zero trace id");
    snprintf(v, sizeof v, "00-%s-%s-01", TID, "0000000000000000");
    cr_expect(!parse(v, &c), "zero parent id");
    cr_expect_eq(c.flags, 0); /* zeroed on refusal */
}

Test(otlp, traces_url_appends_the_path_only_to_a_bare_endpoint)
{
    char out[128];
    cr_assert_eq(idem__otlp_traces_url("http://c:4318", out, sizeof out), 0);
    cr_expect_str_eq(out, "http://c:4318/v1/traces");
    cr_assert_eq(idem__otlp_traces_url("http://c:4318/", out, sizeof out), 0);
    cr_expect_str_eq(out, "http://c:4318/v1/traces");
    cr_assert_eq(idem__otlp_traces_url("https://c/otlp/v1/traces", out, sizeof out), 0);
    cr_expect_str_eq(out, "https://c/otlp/v1/traces");
    cr_expect_eq(idem__otlp_traces_url("http://c:4318", out, 10), -1);
}

static void make_span(idem_span_t *s, const char *path)
{
    uint8_t t[16], id[8], parent[8];
    memset(t, 0xab, sizeof t);
    memset(id, 0x01, sizeof id);
    memset(parent, 0x02, sizeof parent);
    idem__span_init(s, t, id, parent, IDEM_SPAN_KIND_SERVER, "idem POST /", 11);
    s->start_unix_ns = 1700000000000000000ull;
    s->end_unix_ns = 1700000000000001000ull;
    idem__span_attr_str(s, "url.path", path, strlen(path));
    idem__span_attr_int(s, "http.response.status_code", 503);
    idem__span_error(s, "store_error");
}

Test(otlp, encode_is_the_otlp_json_mapping)
{
    static idem_span_t s;
    make_span(&s, "/p\"a\\t\x01h\xff");
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__otlp_encode(&s, 1, "svc", &b), 0);
    json_error_t e;
    json_t *doc = json_loadb(b.data, b.len, 0, &e);
    cr_assert_not_null(doc, "not JSON: %s: %.*s", e.text, (int)b.len, b.data);
    json_t *rs = json_array_get(json_object_get(doc, "resourceSpans"), 0);
    json_t *res = json_array_get(json_object_get(json_object_get(rs, "resource"), "attributes"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(res, "key")), "service.name");
    json_t *span = json_array_get(
        json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(span, "traceId")),
                     "abababababababababababababababab");
    cr_expect_str_eq(json_string_value(json_object_get(span, "spanId")), "0101010101010101");
    cr_expect_str_eq(json_string_value(json_object_get(span, "parentSpanId")), "0202020202020202");
    cr_expect_eq(json_integer_value(json_object_get(span, "kind")), 2);
    cr_expect_str_eq(json_string_value(json_object_get(span, "startTimeUnixNano")),
                     "1700000000000000000");
    json_t *attrs = json_object_get(span, "attributes");
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_object_get(json_array_get(attrs, 0), "value"), "stringValue")),
                     "/p\"a\\t\x01h?"); /* escaped; the invalid byte replaced */
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_object_get(json_array_get(attrs, 1), "value"), "intValue")),
                     "503");
    json_t *status = json_object_get(span, "status");
    cr_expect_eq(json_integer_value(json_object_get(status, "code")), 2);
    cr_expect_str_eq(json_string_value(json_object_get(status, "message")), "store_error");
    json_decref(doc);
    idem__buf_cleanup(&b);
}

Test(otlp, long_values_are_cut_and_a_full_span_drops_attributes)
{
    static idem_span_t s;
    char big[1000];
    memset(big, 'x', sizeof big);
    uint8_t t[16] = {1}, id[8] = {1};
    idem__span_init(&s, t, id, NULL, IDEM_SPAN_KIND_CLIENT, "n", 1);
    idem__span_attr_str(&s, "url.path", big, sizeof big);
    cr_expect_eq(s.attrs[0].len, IDEM_SPAN_VALUE_MAX);
    for (int i = 0; i < 40; i++)
        idem__span_attr_str(&s, "k", big, sizeof big);
    cr_expect_leq(s.n_attrs, IDEM_SPAN_MAX_ATTRS);
    cr_expect_leq(s.text_len, IDEM_SPAN_TEXT);
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__otlp_encode(&s, 1, "svc", &b), 0);
    json_t *doc = json_loadb(b.data, b.len, 0, NULL);
    cr_expect_not_null(doc);
    json_decref(doc);
    idem__buf_cleanup(&b);
}

Test(otlp, full_queue_drops_and_counts)
{
    static idem_metrics_t m;
    memset(&m, 0, sizeof m);
    idem_otlp_opts_t o = {.url = "http://127.0.0.1:1/v1/traces", .service_name = "idemd",
                          .queue_spans = 3, .timeout_ms = 100};
    idem_otlp_t *x;
    cr_assert_eq(idem__otlp_create(&o, &m, &x), IDEM_OK);
    static idem_span_t s;
    make_span(&s, "/");
    for (int i = 0; i < 10; i++)
        idem__otlp_enqueue(x, &s); /* no thread: nothing leaves the queue */
    cr_expect_eq(atomic_load(&m.otlp_spans_dropped), 7);
    /* destroy tries the queue once (port 1 refuses): 3 more dropped. */
    idem__otlp_destroy(x);
    cr_expect_eq(atomic_load(&m.otlp_spans_dropped), 10);
    cr_expect_eq(atomic_load(&m.otlp_export_failures), 1);
    cr_expect_eq(atomic_load(&m.otlp_spans_exported), 0);
    idem__otlp_enqueue(NULL, &s); /* tracing off: nothing */
    idem__otlp_destroy(NULL);
}

Test(otlp, create_refuses_bad_options)
{
    static idem_metrics_t m;
    idem_otlp_t *x = (idem_otlp_t *)&m;
    idem_otlp_opts_t o = {.url = "http://c/", .service_name = "s", .queue_spans = 0,
                          .timeout_ms = 100};
    cr_expect_eq(idem__otlp_create(&o, &m, &x), IDEM_E_INVAL);
    cr_expect_null(x);
}
