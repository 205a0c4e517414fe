/* src/gateway/metrics.h - idemd's counters and histograms, and the names of
 * the outcomes they count (metrics.c).
 *
 * One idem_metrics_t per process (gw->metrics): every thread bumps it with
 * atomics, and the admin thread renders it for /metrics and reads it for
 * /readyz.  Some gauges are also the budgets they report: max_connections is
 * checked on connections and max_buffered_bytes on buffered_bytes (conn.c).
 * Nothing here knows a loop.
 *
 * THREADING: any thread (atomics, no lock).
 */
#ifndef IDEM_GATEWAY_METRICS_H
#define IDEM_GATEWAY_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gateway/outcome.h"
#include "gateway/scope.h"
#include "http/http.h"

#define IDEM_HIST_BUCKETS 14
/* Rows of requests[][]: [0] requests no route matched (or refused before
 * routing), [1 + i] the configuration's routes[i]; IDEM_CONFIG_MAX_ROUTES + 1
 * (metrics.c checks it). */
#define IDEM_METRICS_ROUTE_SLOTS 257

/* The protocol that carried a request: idem_requests_total's proto label
 * ("http1": HTTP/1.1 and 1.0; "h2": HTTP/2, SPEC section 20). */
typedef enum { IDEM_PROTO_HTTP1, IDEM_PROTO_H2, IDEM_PROTO__COUNT } idem_proto_t;

typedef struct idem_hist {
    _Atomic uint64_t buckets[IDEM_HIST_BUCKETS + 1]; /* last: +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
} idem_hist_t;

typedef struct idem_metrics {
    /* By route (IDEM_METRICS_ROUTE_SLOTS), protocol and outcome: the label
     * is the route's name or index, never a request's path, so the series
     * are at most (routes + 1) x protocols x outcomes. */
    _Atomic uint64_t requests[IDEM_METRICS_ROUTE_SLOTS][IDEM_PROTO__COUNT][IDEM_OUT__COUNT];
    _Atomic uint32_t workers;         /* worker threads running (workers: auto resolved) */
    _Atomic uint64_t admin_unauthorized; /* admin requests refused 401 (admin_token_file) */
    _Atomic int64_t in_flight;        /* requests being processed now */
    _Atomic uint64_t store_batches;   /* writer transactions */
    _Atomic uint64_t store_ops;       /* operations in them */
    _Atomic uint64_t store_errors;
    _Atomic uint64_t store_gets;      /* idem_store_get calls (reads outside the writer) */
    _Atomic uint64_t store_swept;     /* records the sweeper removed */
    _Atomic uint64_t sweep_rounds;    /* sweeper rounds finished (a test waits for them) */
    _Atomic uint64_t tls_handshakes;  /* TLS listener: handshakes done */
    _Atomic uint64_t tls_handshake_failures; /* TLS listener: connections that ended before
                                              * their handshake was done (garbage, a
                                              * certificate refused, a client that left) */
    _Atomic uint64_t cache_hits;      /* answers from local_cache */
    /* local_cache invalidations from other instances (invalidate.c): the
     * messages applied and those that did not parse; the watch's state:
     * 0 no watch (cache off or an embedded store), 1 down, 2 up. */
    _Atomic uint64_t cache_inval_applied;
    _Atomic uint64_t cache_inval_malformed;
    _Atomic uint32_t cache_watch;
    /* Questions to reconcile_url (reconcile.c), by what they came to:
     * the answer stored, the key released (404), asked again later. */
    _Atomic uint64_t reconcile_applied;
    _Atomic uint64_t reconcile_not_applied;
    _Atomic uint64_t reconcile_retry;
    /* Resources clients hold (docs/protocol.md section 11): the gauges are
     * also the counters max_connections and max_buffered_bytes are checked on. */
    _Atomic uint64_t connections;     /* public connections, and requests that outlived theirs */
    _Atomic uint64_t conns_refused;   /* public connections closed at once: max_connections */
    _Atomic uint64_t admin_conns_refused; /* admin connections over IDEM_ADMIN_MAX_CONNS */
    _Atomic uint64_t buffered_bytes;  /* request body bytes charged, all workers */
    _Atomic uint64_t queued_bytes;    /* answers queued to clients, overhead included, all
                                       * workers: max_queued_bytes is checked on it */
    /* Scopes that fell back, by what to ([0]: the tagged SHA-256 of
     * Authorization, [1]: "anonymous") and why (scope.h IDEM_SCOPE_WHY_*:
     * absent, or the JWT check that failed). */
    _Atomic uint64_t scope_fallback[2][IDEM_SCOPE_N_WHY];
    _Atomic bool store_full;          /* the store refused a write for want of room, and
                                       * none as large has succeeded since (readyz) */
    _Atomic uint64_t store_full_bytes; /* the largest response payload it refused */
    /* The store's room on disk (space.c), as the sweeper last saw it;
     * rendered only once known (never for stores that cannot say). */
    _Atomic bool store_space_known;
    _Atomic uint64_t store_used_bytes;
    _Atomic uint64_t store_free_bytes;
    /* Traces (otlp.c): spans the collector took, spans dropped (queue full,
     * or in a batch the collector did not take), POSTs that failed. */
    _Atomic uint64_t otlp_spans_exported;
    _Atomic uint64_t otlp_spans_dropped;
    _Atomic uint64_t otlp_export_failures;
    idem_hist_t upstream_latency;
    idem_hist_t store_latency;        /* one writer transaction */
    idem_hist_t request_latency;
} idem_metrics_t;

/** Count one request of route slot `route` (0: none matched, 1 + i:
 * routes[i]; a slot out of range counts as 0), carried by proto, with
 * outcome o. */
void idem__metrics_count(idem_metrics_t *m, size_t route, idem_proto_t proto, idem_outcome_t o);
/** The proto label of idem_conn_facts_t.proto ("HTTP/2": h2; anything
 * else, NULL included: http1). */
idem_proto_t idem__metrics_proto(const char *proto);
void idem__hist_observe(idem_hist_t *h, uint64_t ns);
struct idem_config;
/** Render Prometheus text into out.  idem_requests_total has a row per
 * outcome and protocol for route="none" and for each route of cfg (labelled with
 * idem__config_route_label); cfg NULL: route="none" only, every route's
 * counts folded into it.  @return 0 or -1 (out full). */
int idem__metrics_render(idem_metrics_t *m, const struct idem_config *cfg, idem_buf_t *out);
const char *idem__outcome_name(idem_outcome_t o);

#endif /* IDEM_GATEWAY_METRICS_H */
