/* src/gateway/gateway.h - idemd the process: what its threads share.
 *
 * idemd is one process with N worker threads, each running its own uv_loop_t
 * with its own dup() of the one listening socket, client connections and pool of
 * keep-alive upstream connections (worker.h); one store writer thread that
 * applies every queued claim, completion, renewal and release in one
 * transaction (group commit) and posts results back to the worker that asked
 * (writer.h); and one admin thread with its own loop for /healthz, /readyz,
 * /metrics and /keys (admin.c, on conn.c's connections).  struct idem_gw is
 * what they all see: the config, the store, the cache, the rate limiter, the
 * writer and the metrics.
 *
 * The rest of idemd's declarations live by concern, each header with only
 * what it needs, so that the parts which never touch a loop never see
 * libuv: metrics.h, writer.h, problem.h and log.h are loop-free like this
 * one; worker.h (a worker), conn.h (listeners and connections), request.h
 * (a request's life) and upstream.h (the upstream client) are the loop's.
 *
 * A request lives in an idem_req_t (request.h) from the moment its head is
 * parsed until its outcome is stored and its response written (or its
 * client has gone).  A request outlives its client connection: a client that
 * hangs up does not stop the upstream call, and its result is still stored,
 * so the repeat the client sends next gets the answer.
 *
 * THREADING: everything in a worker is touched only by its loop thread,
 * except the done list (the writer thread pushes to it under its mutex) and
 * the metrics (atomics).  A config is shared read-only and reference
 * counted (SIGHUP replaces the live one, see live below); the store handle
 * is thread-safe.
 */
#ifndef IDEM_GATEWAY_H
#define IDEM_GATEWAY_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/addrlimit.h"
#include "gateway/cache.h"
#include "gateway/config.h"
#include "gateway/metrics.h"
#include "gateway/ratelimit.h"
#include "core/tls.h"
#include "gateway/writer.h"
#include "idem/key.h"
#include "idem/record.h"
#include "idem/store.h"

typedef struct idem_gw idem_gw_t;
typedef struct idem_worker idem_worker_t;
typedef struct idem_admin idem_admin_t;

struct idem_gw {
    /* The configuration idemd started with.  Read it only for keys SIGHUP
     * cannot change (listen, store, workers, the connection limits ...:
     * IDEM_CONFIG_RESTART in config.c's table): those are the same in every
     * later configuration. */
    idem_config_t *cfg;
    /* The configuration new requests start with: the start's, then each
     * good SIGHUP's (main.c publishes it under live_mu and bumps live_gen).
     * A worker holds the latest it has seen (idem__worker_cfg), each request
     * the one it began with (idem_req_t.cfg), a reconcile question the one
     * of its request; the last holder frees it (idem__config_unref). */
    pthread_mutex_t live_mu;
    const idem_config_t *live; /* guarded by live_mu */
    _Atomic uint64_t live_gen;
    idem_store_t *store;
    idem_cache_t *cache;                   /* local_cache; NULL when off */
    idem_ratelimit_t *ratelimit;           /* scope_rate_limit; NULL when off */
    idem_addrlimit_t *addrlimit;           /* max_connections_per_address; NULL when off */
    idem_tls_server_t tls_server;          /* listen_tls's certificate, reloaded on SIGHUP */
    bool has_tls_listener;                 /* listen_tls is configured */
    /* jwt_keys/jwt_secret_file as read at start or the last good SIGHUP;
     * NULL without.  Workers load it per request; main.c swaps it.  A set
     * it replaces is kept in jwt_retired until exit, because a worker may
     * still be verifying with it (SIGHUPs are few and a set is small). */
    struct idem__jwt_keys *_Atomic jwt_keys;
    struct idem__jwt_keys **jwt_retired;
    size_t n_jwt_retired;
    idem_writer_t writer;
    idem_metrics_t metrics;
    struct idem_otlp *otlp;                /* the span exporter (otlp.h); NULL: otlp_endpoint
                                            * not set, no tracing at all */
    struct sockaddr_storage upstream_addr; /* resolved once at start */
    char upstream_hostport[300];           /* HOST:PORT, the Host sent upstream and for logs */
    char upstream_host[256];               /* HOST alone (the name TLS verifies by default) */
    bool upstream_tls;                     /* an https:// upstream */
    idem_tls_ctx_t *upstream_tls_ctx;      /* its client context (upstream_tls_*); else NULL */
    int nworkers;
    idem_worker_t *workers;
    /* admin_token_file (SPEC section 19): the SHA-256 of the token, read
     * once at start (idem__admin_token_load); admin_token_set false: none. */
    bool admin_token_set;
    uint8_t admin_token_sha256[32];
    _Atomic bool stopping;
    _Atomic bool log_json; /* log_format: json; SIGHUP may change it */
};

/** idem_store_get, counted in the metrics (every read of the store outside
 * the writer goes through here, so a test can see that a cached replay made
 * none). */
idem_err_t idem__gw_store_get(idem_gw_t *gw, const idem_key_id_t *id, int64_t now_ms,
                              idem_record_t *rec);

/* invalidate.c */
/** Watch the store's deletes for local_cache (SPEC section 19): the cache
 * is bypassed until the watch is up, emptied whenever it comes up.
 * @return 0 watching; 1 nothing to watch (no cache, or an embedded store:
 *         the cache is used as it is); -1 with err set (no thread). */
int idem__inval_start(idem_gw_t *gw, char *err, size_t errlen);
/** Stop the watch (before the cache is destroyed); no watch: nothing. */
void idem__inval_stop(idem_gw_t *gw);

/* admin.c */
/** Start the admin thread, accepting on a dup() of the listening socket
 * listen_fd (idem__listen_socket; the caller keeps listen_fd). */
int idem__admin_start(idem_gw_t *gw, int listen_fd, idem_admin_t **out, char *err, size_t errlen);
void idem__admin_stop(idem_admin_t *a);

/** Read the admin token from path: the whole file, trailing CR and LF
 * removed.  Refused: a file that cannot be read, that is not a regular
 * file, that other users may read or write (mode & 006), an empty token,
 * one over 4096 bytes, or one with a byte outside visible ASCII (it could
 * not be sent in an Authorization header).
 * @param[out] sha256  the SHA-256 of the token (what requests are compared to).
 * @return 0, or -1 with err set to one line naming admin_token_file. */
int idem__admin_token_load(const char *path, uint8_t sha256[32], char *err, size_t errlen);

#endif /* IDEM_GATEWAY_H */
