/* tests/unit/test_metrics.c - the Prometheus text of /metrics (docs/protocol.md section 13).
 *
 * Counters must appear with every outcome label, histograms must be
 * cumulative with a +Inf bucket equal to their count, and the in-flight
 * gauge must be there, since dashboards and alerts are written against them.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "gateway/config.h"
#include "gateway/metrics.h"

static char *render(idem_metrics_t *m)
{
    idem_buf_t b;
    idem__buf_init(&b, 1u << 20);
    cr_assert_eq(idem__metrics_render(m, NULL, &b), 0);
    cr_assert(idem__buf_append(&b, "", 1) == 0);
    return b.data; /* freed by the test */
}

/* The value on the line that starts with prefix, or -1. */
static long long value_of(const char *text, const char *prefix)
{
    const char *p = text;
    size_t n = strlen(prefix);
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtoll(p + n + 1, NULL, 10);
        p += n;
    }
    return -1;
}

Test(metrics, counts_each_outcome_under_its_label)
{
    static idem_metrics_t m;
    memset(&m, 0, sizeof m);
    idem__metrics_count(&m, 0, IDEM_PROTO_HTTP1, IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, IDEM_PROTO_HTTP1, IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, IDEM_PROTO_HTTP1, IDEM_OUT_REPLAY);
    char *t = render(&m);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"none\",proto=\"http1\"}"),
                 2);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"replay\",route=\"none\",proto=\"http1\"}"),
                 1);
    static const char *const spec[] = {"new", "replay", "in_flight", "mismatch", "missing_key",
                                       "invalid_key", "passthrough", "store_error"};
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        char label[96];
        snprintf(label, sizeof label,
                 "idem_requests_total{outcome=\"%s\",route=\"none\",proto=\"http1\"}", spec[i]);
        cr_expect_geq(value_of(t, label), 0, "missing outcome %s", spec[i]);
    }
    cr_expect_eq(value_of(t, "idem_in_flight"), 0);
    free(t);
}

/* Each route's row carries its name, or its index when it has none; a
 * request no route matched is route="none"; nothing else is a label. */
Test(metrics, route_label_is_name_or_index)
{
    static idem_metrics_t m;
    static idem_config_t cfg;
    memset(&m, 0, sizeof m);
    cr_assert_eq(idem__config_defaults(&cfg), 0);
    cr_assert_eq(cfg.n_routes, 1);
    idem__metrics_count(&m, 1, IDEM_PROTO_HTTP1, IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, IDEM_PROTO_HTTP1, IDEM_OUT_PASSTHROUGH);
    idem__metrics_count(&m, 9999, IDEM_PROTO_HTTP1, IDEM_OUT_PASSTHROUGH); /* out of range: none */
    idem_buf_t b;
    idem__buf_init(&b, 1 << 20);
    cr_assert_eq(idem__metrics_render(&m, &cfg, &b), 0);
    cr_assert_eq(idem__buf_append(&b, "", 1), 0);
    const char *t = (const char *)b.data;
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"0\",proto=\"http1\"}"),
                 1);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"passthrough\",route=\"none\",proto=\"http1\"}"),
                 2);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"none\",proto=\"http1\"}"),
                 0);
    idem__buf_cleanup(&b);
    cr_assert_eq(idem__config_set_string(&cfg.routes[0].name, "payments"), 0);
    idem__buf_init(&b, 1 << 20);
    cr_assert_eq(idem__metrics_render(&m, &cfg, &b), 0);
    cr_assert_eq(idem__buf_append(&b, "", 1), 0);
    t = (const char *)b.data;
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"payments\",proto=\"http1\"}"),
                 1);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"0\",proto=\"http1\"}"),
                 -1);
    idem__buf_cleanup(&b);
    idem__config_cleanup(&cfg);
}

/* The protocol that carried a request is a label of its own: HTTP/2's
 * counts never show under http1, nor the reverse. */
Test(metrics, proto_label)
{
    static idem_metrics_t m;
    memset(&m, 0, sizeof m);
    cr_expect_eq(idem__metrics_proto("HTTP/2"), IDEM_PROTO_H2);
    cr_expect_eq(idem__metrics_proto("HTTP/1.1"), IDEM_PROTO_HTTP1);
    cr_expect_eq(idem__metrics_proto(NULL), IDEM_PROTO_HTTP1);
    idem__metrics_count(&m, 0, idem__metrics_proto("HTTP/2"), IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, idem__metrics_proto("HTTP/2"), IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, idem__metrics_proto("HTTP/1.1"), IDEM_OUT_NEW);
    idem__metrics_count(&m, 0, (idem_proto_t)7, IDEM_OUT_REPLAY); /* out of range: http1 */
    char *t = render(&m);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"none\",proto=\"h2\"}"),
                 2);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"new\",route=\"none\",proto=\"http1\"}"),
                 1);
    cr_expect_eq(
        value_of(t, "idem_requests_total{outcome=\"replay\",route=\"none\",proto=\"http1\"}"), 1);
    cr_expect_eq(value_of(t, "idem_requests_total{outcome=\"replay\",route=\"none\",proto=\"h2\"}"),
                 0);
    free(t);
}

Test(metrics, histograms_are_cumulative)
{
    static idem_metrics_t m;
    memset(&m, 0, sizeof m);
    idem__hist_observe(&m.upstream_latency, 50 * 1000ull);               /* 50 us */
    idem__hist_observe(&m.upstream_latency, 3 * 1000 * 1000ull);         /* 3 ms */
    idem__hist_observe(&m.upstream_latency, 60ull * 1000 * 1000 * 1000); /* 60 s */
    char *t = render(&m);
    cr_expect_eq(value_of(t, "idem_upstream_duration_seconds_bucket{le=\"0.0001\"}"), 1);
    cr_expect_eq(value_of(t, "idem_upstream_duration_seconds_bucket{le=\"0.005\"}"), 2);
    cr_expect_eq(value_of(t, "idem_upstream_duration_seconds_bucket{le=\"5\"}"), 2);
    cr_expect_eq(value_of(t, "idem_upstream_duration_seconds_bucket{le=\"+Inf\"}"), 3);
    cr_expect_eq(value_of(t, "idem_upstream_duration_seconds_count"), 3);
    cr_expect_geq(value_of(t, "idem_store_commit_duration_seconds_count"), 0);
    free(t);
}

Test(metrics, names_outcomes)
{
    cr_expect_str_eq(idem__outcome_name(IDEM_OUT_IN_FLIGHT), "in_flight");
    cr_expect_str_eq(idem__outcome_name((idem_outcome_t)9999), "unknown");
}

Test(metrics, scope_fallbacks_by_where_to_and_why)
{
    static idem_metrics_t m;
    memset(&m, 0, sizeof m);
    m.scope_fallback[0][IDEM_SCOPE_WHY_ABSENT] = 3;
    m.scope_fallback[0][5] = 2; /* IDEM__JWT_EXPIRED */
    m.scope_fallback[1][IDEM_SCOPE_WHY_ABSENT] = 1;
    char *t = render(&m);
    cr_expect_eq(value_of(t, "idem_scope_fallback_total{to=\"authorization\",reason=\"absent\"}"),
                 3);
    cr_expect_eq(value_of(t, "idem_scope_fallback_total{to=\"authorization\",reason=\"expired\"}"),
                 2);
    cr_expect_eq(value_of(t, "idem_scope_fallback_total{to=\"anonymous\",reason=\"absent\"}"), 1);
    static const char *const reasons[] = {"absent", "malformed", "algorithm", "unknown_kid",
                                          "signature", "expired", "not_yet_valid", "claim"};
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++) {
        char label[128];
        snprintf(label, sizeof label, "idem_scope_fallback_total{to=\"anonymous\",reason=\"%s\"}",
                 reasons[i]);
        cr_expect_geq(value_of(t, label), 0, "missing reason %s", reasons[i]);
    }
    free(t);
}
