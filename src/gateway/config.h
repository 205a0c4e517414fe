/* src/gateway/config.h - idemd's configuration: defaults, YAML file, flags.
 *
 * idem__config_defaults() fills every key with docs/protocol.md section 14's default;
 * idem__config_load_file() then overlays a YAML file, and the command line is
 * applied over that by main.c.  Every error names the file, the line and the
 * key ("idem.yaml:12: defaults.lease: not a duration: '3x'"), so a user can
 * fix it without guessing.  Unknown keys are errors: a misspelt key silently
 * ignored is a policy silently not applied.
 */
#ifndef IDEM_GATEWAY_CONFIG_H
#define IDEM_GATEWAY_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gateway/ratelimit.h"
#include "gateway/scope.h"

#define IDEM_CONFIG_MAX_ROUTES 256
#define IDEM_CONFIG_MAX_ROUTE_NAME 64 /* characters of a route's `name:` */
#define IDEM_WORKERS_AUTO 0           /* `workers: auto`, the default: one per CPU */
#define IDEM_CONFIG_MAX_LIST 32   /* entries in a list (methods, headers, pointers, statuses) */

typedef enum { IDEM_CONFLICT_REJECT = 0, IDEM_CONFLICT_WAIT = 1 } idem_on_conflict_t;
typedef enum {
    IDEM_UNKNOWN_EXPIRE = 0,
    IDEM_UNKNOWN_HOLD = 1,
    IDEM_UNKNOWN_RECONCILE = 2, /* hold, and ask reconcile_url (reconcile.h) */
} idem_on_unknown_t;
typedef enum { IDEM_FPBODY_RAW = 0, IDEM_FPBODY_JSON = 1 } idem_fp_body_t;
typedef enum { IDEM_STORE_ERR_CLOSED = 0, IDEM_STORE_ERR_OPEN = 1 } idem_on_store_error_t;
/* Where a route's key comes from (`key_from`, docs/configuration.md). */
typedef enum { IDEM_KEY_FROM_HEADER = 0, IDEM_KEY_FROM_JSON = 1 } idem_key_from_t;

#define IDEM_CONFIG_MAX_LINK 1024 /* characters of policy_link */
#define IDEM_POLICY_PATH "/_idem/policy" /* the published policy; policy_link's default */
typedef enum {
    IDEM_MODE_REQUIRED = 0,
    IDEM_MODE_OPTIONAL = 1,
    IDEM_MODE_TOKEN = 2,
    IDEM_MODE_OFF = 3,
} idem_route_mode_t;

/** The per-route policy: the keys of `defaults`, each overridable per route. */
typedef struct idem_policy {
    int64_t key_ttl_ms;
    int64_t failure_ttl_ms;
    int64_t lease_ms;
    idem_on_conflict_t on_conflict;
    idem_on_unknown_t on_unknown_outcome;
    int64_t wait_timeout_ms;
    idem_fp_body_t fingerprint_body;
    char *fingerprint_headers[IDEM_CONFIG_MAX_LIST]; /* lowercased names */
    size_t n_fingerprint_headers;
    char *fingerprint_ignore[IDEM_CONFIG_MAX_LIST];  /* JSON pointers */
    size_t n_fingerprint_ignore;
    uint64_t max_response_bytes;
    int release_statuses[IDEM_CONFIG_MAX_LIST];
    size_t n_release_statuses;
    /* Where the key is read, what a replay leaves out and how it is marked
     * (SPEC section 15). */
    idem_key_from_t key_from;
    char *key_from_arg;    /* HEADER: the field name as written ("Idempotency-Key");
                            * JSON: the RFC 6901 pointer ("/id"), never "" */
    char *replay_drop_headers[IDEM_CONFIG_MAX_LIST]; /* lowercased; never stored */
    size_t n_replay_drop_headers;
    char *replay_marker[IDEM_CONFIG_MAX_LIST]; /* as written; "true" on a replay */
    size_t n_replay_marker;
    /* on_unknown_outcome: reconcile (SPEC section 18, reconcile.h). */
    char *reconcile_url;        /* http(s)://upstream's origin/path, "{key}" encoded */
    int64_t reconcile_after_ms; /* the first question; later ones back off */
} idem_policy_t;

typedef struct idem_route {
    char *methods[IDEM_CONFIG_MAX_LIST]; /* uppercase method names */
    size_t n_methods;
    char *path;                          /* a normalised path prefix, starts with '/' */
    char *name;                          /* `name:`, the route label of /metrics; NULL:
                                          * its index ("0", "1", ...) */
    idem_route_mode_t mode;
    idem_policy_t policy;                /* defaults overlaid with the route's keys */
} idem_route_t;

typedef struct idem_config {
    char *listen;          /* "127.0.0.1:8080" */
    char *admin;           /* "127.0.0.1:8081" */
    char *upstream;        /* "http://127.0.0.1:9000" */
    char *store;           /* "lmdb:./idem-data" */
    int workers;           /* 1..64; IDEM_WORKERS_AUTO (0): one per CPU (main.c) */
    int64_t upstream_timeout_ms;
    uint64_t max_request_bytes;
    idem_on_store_error_t on_store_error;
    char *replay_header;   /* "X-Idempotent-Replay"; the older spelling of
                            * defaults.replay_marker: [NAME], which it sets */
    char *policy_link;     /* Link: rel="describedby" of problems; NULL: IDEM_POLICY_PATH */
    char *scope_header;    /* "Authorization"; used only when n_scope is 0 */
    idem_scope_source_t scope[IDEM_SCOPE_MAX_SOURCES]; /* `scope:`, see scope.h */
    size_t n_scope;        /* 0: `scope:` not written, scope_header decides */
    idem_rate_t scope_rate_limit; /* per scope and process; count 0: off */
    char *jwt_keys;        /* PEM public keys or a JWKS for jwt: sources; NULL: none */
    char *jwt_secret_file; /* the HS256 secret for jwt: sources; NULL: none */
    idem_scope_missing_t scope_missing; /* an absent source or failed JWT: fall back or 400 */
    uint64_t local_cache;  /* entries */
    int64_t token_ttl_ms;
    char *log_format;      /* "text" or "json" */
    /* What one client can hold (docs/protocol.md section 11). */
    int64_t header_timeout_ms;   /* a request head completes within this of its first byte */
    int64_t body_timeout_ms;     /* the longest pause between bytes of a request body */
    int64_t idle_timeout_ms;     /* a keep-alive connection waiting for its next request */
    uint64_t max_connections;    /* client connections at once, all workers */
    bool max_connections_set;    /* written in the file: never lowered to fit the fd limit */
    uint64_t max_buffered_bytes; /* request bodies held at once, all workers */
    uint64_t max_queued_bytes;   /* answers queued to clients at once, all workers,
                                  * each write's overhead included (default 64 MiB) */
    uint64_t max_connections_per_address; /* client connections from one address at
                                           * once; 0: off (the default) */
    bool http2;                  /* HTTP/2 on the public listeners (h2c, ALPN h2) */
    uint64_t http2_max_concurrent_streams; /* SETTINGS_MAX_CONCURRENT_STREAMS (default 100) */
    /* `listen_tls:` an extra public listener speaking TLS (docs/configuration.md,
     * "TLS").  listen_tls_address NULL: none; else cert and key are set. */
    char *listen_tls_address;        /* HOST:PORT, as listen */
    char *listen_tls_cert_file;      /* PEM certificate (chain) */
    char *listen_tls_key_file;       /* PEM private key */
    char *listen_tls_client_ca_file; /* NULL: no client certificate asked for; else
                                      * asked for and verified against these CAs */
    /* `upstream_tls:` how an https:// upstream is spoken to.  Each is NULL
     * when not written. */
    char *upstream_tls_ca_file;   /* NULL: the system's trust store */
    char *upstream_tls_cert_file; /* a client certificate (mutual TLS); set with key */
    char *upstream_tls_key_file;
    char *upstream_tls_server_name; /* SNI and the name verified; NULL: the URL's host */
    bool upstream_tls_verify;       /* default true; false only when written */
    /* Issue 22 (SPEC section 19): who may use the admin listener.  NULL: no
     * token (allowed only with a loopback admin address). */
    char *admin_token_file;
    /* Traces (SPEC section 19, otlp.h): the otlp_* keys.  otlp_endpoint
     * NULL: no tracing at all. */
    char *otlp_endpoint;          /* http(s)://HOST:PORT[/PATH] of an OTLP/HTTP collector */
    char *otlp_service_name;      /* resource service.name; "idemd" */
    double otlp_sample_ratio;     /* of new traces, the share recorded: 0..1, default 1 */
    uint64_t otlp_queue_spans;    /* spans queued for export at most; 4096 */
    int64_t otlp_timeout_ms;      /* one export POST at most; 2 s */
    /* Host names the admin listener answers besides loopback's, lower case. */
    char *admin_hosts[IDEM_CONFIG_MAX_LIST];
    size_t n_admin_hosts;
    idem_policy_t defaults;
    idem_route_t routes[IDEM_CONFIG_MAX_ROUTES];
    size_t n_routes;
} idem_config_t;

/* The mappings a key may be written in (the table in config.c). */
enum {
    IDEM_CFG_IN_TOP = 1,
    IDEM_CFG_IN_DEFAULTS = 2,
    IDEM_CFG_IN_ROUTE = 4,
    IDEM_CFG_IN_LISTEN_TLS = 8,
    IDEM_CFG_IN_UPSTREAM_TLS = 16,
};
/** What SIGHUP does to a key: leaves it (needs a restart), applies it, or,
 * for a mapping, as each of its keys says. */
typedef enum {
    IDEM_CONFIG_RESTART = 0,
    IDEM_CONFIG_RELOAD = 1,
    IDEM_CONFIG_PARTLY = 2,
} idem_config_reload_t;

/** Fill cfg with the defaults of docs/protocol.md section 14 (one route: POST, PATCH on
 * "/" required; log_format "text").  cfg need not be initialised; its strings
 * are then owned by it (replace them with idem__config_set_string, free them
 * with idem__config_cleanup).  @return 0, or -1 when out of memory (cfg is
 * then cleaned up). */
int idem__config_defaults(idem_config_t *cfg);

/** Overlay the YAML file at path on cfg (which holds defaults).  When the
 * file has `routes`, they replace the default route; each route starts from
 * the file's `defaults` (wherever `defaults` stands in the file) and keeps
 * the keys it sets itself.  Strict: unknown or repeated keys, wrong shapes,
 * empty values, files over 1 MiB and a second YAML document are errors.
 * See docs/configuration.md.
 * @param[out] err  on failure a one-line message naming file, line and key.
 * @return 0, or -1 with err set (cfg is then left valid but partly updated). */
int idem__config_load_file(idem_config_t *cfg, const char *path, char *err, size_t errlen);

/** Check values that depend on each other (listen/admin addresses parse,
 * upstream URL is http(s)://host:port, workers in range, listen_tls has its
 * certificate and key, upstream_tls only with https, scope client_cert only
 * with listen_tls.client_ca_file ...).  Files named are not opened here:
 * the TLS loader reports those.  Run it after the
 * flags are applied: the message names the key, not where it came from.
 * @return 0, or -1 with err set ("listen: not HOST:PORT ...: 'x'"). */
int idem__config_validate(const idem_config_t *cfg, char *err, size_t errlen);

/** The URL every problem of the public listener links to with
 * `Link: <URL>; rel="describedby"`: policy_link, else IDEM_POLICY_PATH. */
const char *idem__config_policy_link(const idem_config_t *cfg);

/** The key_from value of p as written ("header:Idempotency-Key",
 * "json:/id") into out (outlen bytes, truncated).  @return out. */
const char *idem__config_key_from_text(const idem_policy_t *p, char *out, size_t outlen);

/** Whether the host of an admin address (as idem__config_parse_addr gives
 * it) is loopback: "localhost", 127.0.0.0/8, ::1.  A name other than
 * localhost is not (it could resolve anywhere). */
bool idem__config_host_is_loopback(const char *host);

/** The route label of /metrics for cfg->routes[i]: its name, or its index
 * written into buf (bufsize bytes).  @return name or buf. */
const char *idem__config_route_label(const idem_config_t *cfg, size_t i, char *buf,
                                     size_t bufsize);

/** Free everything cfg owns. */
void idem__config_cleanup(idem_config_t *cfg);

/** Replace the string *slot with a copy of value. @return 0 or -1 (no memory). */
int idem__config_set_string(char **slot, const char *value);

/** Parse "HOST:PORT" (IPv4, [IPv6] or a name like localhost).
 * @param[out] host  NUL-terminated, hostlen bytes.  @return 0 or -1. */
int idem__config_parse_addr(const char *addr, char *host, size_t hostlen, int *port);

/** Parse an upstream URL "http://HOST:PORT" or "https://HOST:PORT", with or
 * without a final "/" (the scheme case-insensitive; the port is required
 * for both; no user information, path, query or fragment).
 * @param[out] host  as idem__config_parse_addr.
 * @param[out] tls   true for https (may be NULL).
 * @return 0 or -1. */
int idem__config_parse_upstream_url(const char *url, char *host, size_t hostlen, int *port,
                                    bool *tls);

/** idem__config_parse_upstream_url for callers that speak plain HTTP only:
 * an https:// URL is -1. */
int idem__config_parse_upstream(const char *url, char *host, size_t hostlen, int *port);

/** The route a request matches (first match wins), or NULL (mode off).
 * @param path  the request's normalised origin-form target
 *              (idem__http_target_normalize); a query is ignored.  A route
 *              matches when its prefix and the path decode to bytes of which
 *              the one begins the other (idem__http_path_has_prefix).  A path
 *              that does not begin with '/' matches nothing. */
const idem_route_t *idem__config_match(const idem_config_t *cfg, const char *method,
                                       size_t method_len, const char *path, size_t path_len);

/** Print every key of the table to f, one a line, four fields separated by
 * tabs: the dotted name ("listen", "defaults.key_ttl", "routes[].path",
 * "listen_tls.address"), what SIGHUP does ("yes", "restart" or "partly"),
 * the default as the docs say it ("none", "-" for a mapping) and one line
 * of documentation.  `idemd --list-config-keys` prints this; the docs are
 * checked against it (tests/blackbox/test_config_keys.py). */
void idem__config_list_keys(FILE *f);

/** For SIGHUP: give next (the file read again) the running value of every
 * key SIGHUP cannot change, and name each that differed in changed
 * ("listen, workers", changedlen bytes, truncated; "" when none).
 * @return 0, or -1 when out of memory (next stays valid). */
int idem__config_keep_restart_keys(idem_config_t *next, const idem_config_t *running,
                                   char *changed, size_t changedlen);

/** A configuration on the heap, shared by threads and freed when the last
 * holder lets go: it starts with the defaults and one reference.  Only a
 * configuration made here may be passed to idem__config_ref/unref.
 * @return NULL when out of memory. */
idem_config_t *idem__config_new(void);
/** One more reference to cfg (returned).  Any thread. */
const idem_config_t *idem__config_ref(const idem_config_t *cfg);
/** Drop a reference; the last frees cfg (idem__config_cleanup).  NULL is a
 * no-op.  Any thread. */
void idem__config_unref(const idem_config_t *cfg);

#endif /* IDEM_GATEWAY_CONFIG_H */
