/* src/gateway/metrics.c - counters and histograms for /metrics.
 *
 * Every counter is an atomic that any thread bumps without a lock; the admin
 * thread reads them when scraped and renders Prometheus' text format.  The
 * histograms have fixed buckets (seconds), enough to see a p50 and a p99 of
 * an upstream or a store commit without per-thread merging.
 */
#include <stdio.h>
#include <string.h>

#include "gateway/config.h"
#include "gateway/metrics.h"

_Static_assert(IDEM_METRICS_ROUTE_SLOTS == IDEM_CONFIG_MAX_ROUTES + 1,
               "a row of requests[][] per route and one for none");

static const char *const outcome_names[] = {
#define IDEM__OUTCOME_NAME(name, text) text,
    IDEM_OUTCOMES(IDEM__OUTCOME_NAME)
#undef IDEM__OUTCOME_NAME
};

/* Upper bounds of the buckets in microseconds. */
static const uint64_t bucket_us[IDEM_HIST_BUCKETS] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
    5000000,
};

const char *idem__outcome_name(idem_outcome_t o)
{
    return (unsigned)o < IDEM_OUT__COUNT ? outcome_names[o] : "unknown";
}

static const char *const proto_names[IDEM_PROTO__COUNT] = {"http1", "h2"};

idem_proto_t idem__metrics_proto(const char *proto)
{
    return proto != NULL && strcmp(proto, "HTTP/2") == 0 ? IDEM_PROTO_H2 : IDEM_PROTO_HTTP1;
}

void idem__metrics_count(idem_metrics_t *m, size_t route, idem_proto_t proto, idem_outcome_t o)
{
    if (route >= IDEM_METRICS_ROUTE_SLOTS)
        route = 0;
    if ((unsigned)proto >= IDEM_PROTO__COUNT)
        proto = IDEM_PROTO_HTTP1;
    if ((unsigned)o < IDEM_OUT__COUNT)
        atomic_fetch_add_explicit(&m->requests[route][proto][o], 1, memory_order_relaxed);
}

/* The idem_requests_total rows: route="none", then each route of cfg.  A
 * row past cfg's routes (none while routes only change at a restart) is
 * folded into "none" so that no count is lost from the sum. */
static int render_requests(idem_metrics_t *m, const idem_config_t *cfg, idem_buf_t *out)
{
    size_t n_routes = cfg != NULL ? cfg->n_routes : 0;
    int rc = 0;
    for (size_t slot = 0; slot <= n_routes; slot++) {
        char ix[24];
        const char *label = slot == 0 ? "none" : idem__config_route_label(cfg, slot - 1, ix,
                                                                           sizeof ix);
        for (int p = 0; p < IDEM_PROTO__COUNT; p++) {
            for (int i = 0; i < IDEM_OUT__COUNT; i++) {
                uint64_t v = atomic_load_explicit(&m->requests[slot][p][i], memory_order_relaxed);
                for (size_t extra = n_routes + 1; slot == 0 && extra < IDEM_METRICS_ROUTE_SLOTS;
                     extra++)
                    v += atomic_load_explicit(&m->requests[extra][p][i], memory_order_relaxed);
                rc |= idem__buf_appendf(
                    out, "idem_requests_total{outcome=\"%s\",route=\"%s\",proto=\"%s\"} %llu\n",
                    outcome_names[i], label, proto_names[p], (unsigned long long)v);
            }
        }
    }
    return rc;
}

void idem__hist_observe(idem_hist_t *h, uint64_t ns)
{
    uint64_t us = ns / 1000;
    size_t i = 0;
    while (i < IDEM_HIST_BUCKETS && us > bucket_us[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

static int render_hist(idem_buf_t *out, const char *name, const char *help, idem_hist_t *h)
{
    int rc = idem__buf_appendf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= IDEM_HIST_BUCKETS; i++) {
        cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i < IDEM_HIST_BUCKETS)
            rc |= idem__buf_appendf(out, "%s_bucket{le=\"%g\"} %llu\n", name,
                                    (double)bucket_us[i] / 1e6, (unsigned long long)cum);
        else
            rc |= idem__buf_appendf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                                    (unsigned long long)cum);
    }
    rc |= idem__buf_appendf(out, "%s_sum %.6f\n%s_count %llu\n", name,
                            (double)atomic_load(&h->sum_us) / 1e6, name,
                            (unsigned long long)atomic_load(&h->count));
    return rc;
}

int idem__metrics_render(idem_metrics_t *m, const idem_config_t *cfg, idem_buf_t *out)
{
    int rc = idem__buf_append_str(out, "# HELP idem_requests_total Requests by what idemd did "
                                       "with them and the route they matched (its name or "
                                       "index; none: no route) and the protocol "
                                       "that carried them (http1, h2).\n"
                                       "# TYPE idem_requests_total counter\n");
    rc |= render_requests(m, cfg, out);
    rc |= idem__buf_appendf(out,
                            "# HELP idem_workers Worker threads serving the public listener.\n"
                            "# TYPE idem_workers gauge\nidem_workers %u\n"
                            "# HELP idem_admin_unauthorized_total Admin requests refused 401 "
                            "for want of the admin token.\n"
                            "# TYPE idem_admin_unauthorized_total counter\n"
                            "idem_admin_unauthorized_total %llu\n",
                            (unsigned)atomic_load(&m->workers),
                            (unsigned long long)atomic_load(&m->admin_unauthorized));
    rc |= idem__buf_appendf(out,
                            "# HELP idem_in_flight Requests being processed now.\n"
                            "# TYPE idem_in_flight gauge\nidem_in_flight %lld\n",
                            (long long)atomic_load(&m->in_flight));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_store_batches_total Store writer transactions.\n"
        "# TYPE idem_store_batches_total counter\nidem_store_batches_total %llu\n"
        "# HELP idem_store_ops_total Operations applied by the store writer.\n"
        "# TYPE idem_store_ops_total counter\nidem_store_ops_total %llu\n"
        "# HELP idem_store_errors_total Store writer transactions that failed.\n"
        "# TYPE idem_store_errors_total counter\nidem_store_errors_total %llu\n",
        (unsigned long long)atomic_load(&m->store_batches),
        (unsigned long long)atomic_load(&m->store_ops),
        (unsigned long long)atomic_load(&m->store_errors));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_store_gets_total Records read from the store outside the writer.\n"
        "# TYPE idem_store_gets_total counter\nidem_store_gets_total %llu\n"
        "# HELP idem_local_cache_hits_total Requests answered from local_cache.\n"
        "# TYPE idem_local_cache_hits_total counter\nidem_local_cache_hits_total %llu\n"
        "# HELP idem_store_swept_total Expired records the sweeper removed.\n"
        "# TYPE idem_store_swept_total counter\nidem_store_swept_total %llu\n"
        "# HELP idem_sweep_rounds_total Sweeper rounds finished.\n"
        "# TYPE idem_sweep_rounds_total counter\nidem_sweep_rounds_total %llu\n"
        "# HELP idem_tls_handshakes_total TLS listener connections by how their handshake "
        "ended.\n"
        "# TYPE idem_tls_handshakes_total counter\n"
        "idem_tls_handshakes_total{result=\"done\"} %llu\n"
        "idem_tls_handshakes_total{result=\"failed\"} %llu\n",
        (unsigned long long)atomic_load(&m->store_gets),
        (unsigned long long)atomic_load(&m->cache_hits),
        (unsigned long long)atomic_load(&m->store_swept),
        (unsigned long long)atomic_load(&m->sweep_rounds),
        (unsigned long long)atomic_load(&m->tls_handshakes),
        (unsigned long long)atomic_load(&m->tls_handshake_failures));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_cache_invalidations_total Invalidation messages from the store's "
        "channel (deletes through any idemd) applied to local_cache, or ignored as "
        "malformed.\n"
        "# TYPE idem_cache_invalidations_total counter\n"
        "idem_cache_invalidations_total{result=\"applied\"} %llu\n"
        "idem_cache_invalidations_total{result=\"malformed\"} %llu\n",
        (unsigned long long)atomic_load(&m->cache_inval_applied),
        (unsigned long long)atomic_load(&m->cache_inval_malformed));
    if (atomic_load(&m->cache_watch) != 0)
        rc |= idem__buf_appendf(
            out,
            "# HELP idem_cache_invalidation_connected Whether local_cache's subscriber to "
            "the store's invalidations is connected (0: local_cache is bypassed).\n"
            "# TYPE idem_cache_invalidation_connected gauge\n"
            "idem_cache_invalidation_connected %u\n",
            atomic_load(&m->cache_watch) == 2 ? 1u : 0u);
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_connections Open client connections (with requests that "
        "outlived theirs), counted against max_connections.\n"
        "# TYPE idem_connections gauge\nidem_connections %llu\n"
        "# HELP idem_connections_refused_total Connections closed at once: over "
        "max_connections (public) or the admin listener's cap.\n"
        "# TYPE idem_connections_refused_total counter\n"
        "idem_connections_refused_total{listener=\"public\"} %llu\n"
        "idem_connections_refused_total{listener=\"admin\"} %llu\n"
        "# HELP idem_buffered_body_bytes Request body bytes held, counted "
        "against max_buffered_bytes.\n"
        "# TYPE idem_buffered_body_bytes gauge\nidem_buffered_body_bytes %llu\n"
        "# HELP idem_queued_answer_bytes Answer bytes queued to clients, overhead "
        "included, counted against max_queued_bytes.\n"
        "# TYPE idem_queued_answer_bytes gauge\nidem_queued_answer_bytes %llu\n",
        (unsigned long long)atomic_load(&m->connections),
        (unsigned long long)atomic_load(&m->conns_refused),
        (unsigned long long)atomic_load(&m->admin_conns_refused),
        (unsigned long long)atomic_load(&m->buffered_bytes),
        (unsigned long long)atomic_load(&m->queued_bytes));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_scope_fallback_total Keyed and token requests whose scope "
        "source was absent or whose JWT failed a check, by the scope they fell back "
        "to and why.\n"
        "# TYPE idem_scope_fallback_total counter\n");
    for (unsigned to = 0; to < 2; to++)
        for (unsigned why = 0; why < IDEM_SCOPE_N_WHY; why++)
            rc |= idem__buf_appendf(out,
                                    "idem_scope_fallback_total{to=\"%s\",reason=\"%s\"} %llu\n",
                                    to == 0 ? "authorization" : "anonymous",
                                    idem__gw_scope_why_name(why),
                                    (unsigned long long)atomic_load(&m->scope_fallback[to][why]));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_store_full 1 while the store refuses writes for want of room.\n"
        "# TYPE idem_store_full gauge\nidem_store_full %d\n",
        atomic_load(&m->store_full) ? 1 : 0);
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_reconcile_total Questions to reconcile_url about an unknown outcome, "
        "by result: applied (the answer was stored), not_applied (404: the key was "
        "released), retry (asked again later).\n"
        "# TYPE idem_reconcile_total counter\n"
        "idem_reconcile_total{result=\"applied\"} %llu\n"
        "idem_reconcile_total{result=\"not_applied\"} %llu\n"
        "idem_reconcile_total{result=\"retry\"} %llu\n",
        (unsigned long long)atomic_load(&m->reconcile_applied),
        (unsigned long long)atomic_load(&m->reconcile_not_applied),
        (unsigned long long)atomic_load(&m->reconcile_retry));
    if (atomic_load(&m->store_space_known))
        rc |= idem__buf_appendf(
            out,
            "# HELP idem_store_used_bytes Bytes the embedded store's files take on disk.\n"
            "# TYPE idem_store_used_bytes gauge\nidem_store_used_bytes %llu\n"
            "# HELP idem_store_free_bytes Bytes of new records the embedded store can still "
            "take; 0: it refuses new records.\n"
            "# TYPE idem_store_free_bytes gauge\nidem_store_free_bytes %llu\n",
            (unsigned long long)atomic_load(&m->store_used_bytes),
            (unsigned long long)atomic_load(&m->store_free_bytes));
    rc |= idem__buf_appendf(
        out,
        "# HELP idem_otlp_spans_exported_total Spans the OTLP collector accepted.\n"
        "# TYPE idem_otlp_spans_exported_total counter\nidem_otlp_spans_exported_total %llu\n"
        "# HELP idem_otlp_spans_dropped_total Spans never exported: the queue was full, or "
        "the collector did not take their batch.\n"
        "# TYPE idem_otlp_spans_dropped_total counter\nidem_otlp_spans_dropped_total %llu\n"
        "# HELP idem_otlp_export_failures_total Batches of spans the collector did not "
        "accept (no answer in otlp_timeout, or not 2xx).\n"
        "# TYPE idem_otlp_export_failures_total counter\nidem_otlp_export_failures_total "
        "%llu\n",
        (unsigned long long)atomic_load(&m->otlp_spans_exported),
        (unsigned long long)atomic_load(&m->otlp_spans_dropped),
        (unsigned long long)atomic_load(&m->otlp_export_failures));
    rc |= render_hist(out, "idem_upstream_duration_seconds",
                      "Time from forwarding a request to its whole response.", &m->upstream_latency);
    rc |= render_hist(out, "idem_store_commit_duration_seconds",
                      "Time of one store writer transaction.", &m->store_latency);
    rc |= render_hist(out, "idem_request_duration_seconds",
                      "Time from a request's head to its response.", &m->request_latency);
    return rc ? -1 : 0;
}
