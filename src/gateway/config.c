/* src/gateway/config.c - idemd's configuration: docs/protocol.md section 14's defaults,
 * the YAML file laid over them, and the route table a request is matched on.
 *
 * The file is read whole (at most 1 MiB) and composed with libyaml's
 * document API, so a syntax error anywhere is reported before anything is
 * applied, and every node still carries its position: errors print the
 * 1-based line of the node at fault ("idem.yaml:7: defaults.lease: not a
 * duration: '3x'").  The walk over the document is not recursive beyond the
 * fixed shape of the file (top level -> defaults / routes[i] -> list items),
 * and every list is bounded (IDEM_CONFIG_MAX_LIST, IDEM_CONFIG_MAX_ROUTES),
 * so a hostile file costs at most its 1 MiB.  Aliases are resolved by
 * libyaml into shared nodes, which the walk simply reads again.
 *
 * Strictness is deliberate: an unknown or repeated key, a list where one
 * value belongs, an empty value, an enum word not in its set, all fail with
 * the dotted name of the key, because a policy silently not applied is worse
 * than a daemon that does not start.
 *
 * Inheritance: `defaults` may come before or after `routes` in the file, so
 * route policies are finished only once the whole document has been walked.
 * While walking, each route records in a bit set which policy keys it wrote
 * itself; afterwards every other policy key is copied from the (final)
 * defaults.  When the file has no `routes`, the routes already in cfg (the
 * built-in POST/PATCH route) simply take the file's defaults.
 *
 * INVARIANTS: cfg is valid at every step, even after a failure halfway:
 * every string it points to is owned by it (idem_malloc family) and every
 * count matches its array, so idem__config_cleanup can always run.
 *
 * THREADING: none; idemd loads its configuration once, before it starts any
 * thread, and afterwards only reads it (idem__config_match is read-only).
 */
#include "gateway/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "http/http.h"
#include "idem/alloc.h"
#include "idem/units.h"

#define MAX_FILE_BYTES (1024 * 1024)
#define MAX_WORKERS 64
#define MAX_LOCAL_CACHE 1000000u
#define MAX_CONNECTIONS 1000000u
/* Durations stop at ten years so that now + duration can never overflow. */
#define MAX_DURATION_MS (3650LL * 24 * 3600 * 1000)

/* ---- small helpers ----------------------------------------------------- */

/* RFC 9110 tchar: what a method or a header field name is made of. */
static bool is_tchar(unsigned char ch)
{
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
        return true;
    return ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static bool is_token(const char *s)
{
    if (s == NULL || *s == '\0')
        return false;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s))
            return false;
    return true;
}

/* A whole decimal number, nothing else (no sign, no space). */
static bool parse_uint(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (*s == '\0')
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* A copy of s fit to quote in a one-line message: printable ASCII only
 * (anything else becomes '?'), cut at 60 characters. */
static void show(char *out, size_t outlen, const char *s)
{
    size_t i = 0;
    for (; *s && i + 4 < outlen && i < 60; s++)
        out[i++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    if (*s && i + 4 <= outlen) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

static void free_strings(char **v, size_t *n)
{
    for (size_t i = 0; i < *n; i++) {
        idem_free(v[i]);
        v[i] = NULL;
    }
    *n = 0;
}

/* Replace dst[0..*ndst) with copies of src[0..nsrc). */
static int copy_strings(char **dst, size_t *ndst, char *const *src, size_t nsrc)
{
    char *tmp[IDEM_CONFIG_MAX_LIST];
    for (size_t i = 0; i < nsrc; i++) {
        tmp[i] = idem_strdup(src[i]);
        if (tmp[i] == NULL) {
            free_strings(tmp, &i);
            return -1;
        }
    }
    free_strings(dst, ndst);
    memcpy(dst, tmp, nsrc * sizeof *tmp);
    *ndst = nsrc;
    return 0;
}

int idem__config_set_string(char **slot, const char *value)
{
    char *copy = NULL;
    if (value != NULL && (copy = idem_strdup(value)) == NULL)
        return -1;
    idem_free(*slot);
    *slot = copy;
    return 0;
}

/* ---- policies and routes ----------------------------------------------- */

/* The policy keys, in the order of their bit in a route's "set" mask. */
#define POLICY_KEYS(X)                           \
    X(P_KEY_TTL, "key_ttl")                      \
    X(P_FAILURE_TTL, "failure_ttl")              \
    X(P_LEASE, "lease")                          \
    X(P_ON_CONFLICT, "on_conflict")              \
    X(P_ON_UNKNOWN, "on_unknown_outcome")        \
    X(P_WAIT_TIMEOUT, "wait_timeout")            \
    X(P_FP_BODY, "fingerprint_body")             \
    X(P_FP_HEADERS, "fingerprint_headers")       \
    X(P_FP_IGNORE, "fingerprint_ignore")         \
    X(P_MAX_RESPONSE, "max_response_bytes")      \
    X(P_RELEASE, "release_statuses")             \
    X(P_KEY_FROM, "key_from")                    \
    X(P_REPLAY_DROP, "replay_drop_headers")      \
    X(P_REPLAY_MARKER, "replay_marker")          \
    X(P_RECONCILE_URL, "reconcile_url")          \
    X(P_RECONCILE_AFTER, "reconcile_after")

enum {
#define X(id, name) id,
    POLICY_KEYS(X)
#undef X
    P_COUNT
};

static void policy_cleanup(idem_policy_t *p)
{
    free_strings(p->fingerprint_headers, &p->n_fingerprint_headers);
    free_strings(p->fingerprint_ignore, &p->n_fingerprint_ignore);
    free_strings(p->replay_drop_headers, &p->n_replay_drop_headers);
    free_strings(p->replay_marker, &p->n_replay_marker);
    idem_free(p->key_from_arg);
    p->key_from_arg = NULL;
    idem_free(p->reconcile_url);
    p->reconcile_url = NULL;
}

/* @return 0, or -1 when out of memory (p is then left for policy_cleanup). */
static int policy_defaults(idem_policy_t *p)
{
    static char *const drop[] = {"set-cookie"};
    static char *const marker[] = {"X-Idempotent-Replay"};
    memset(p, 0, sizeof *p);
    p->key_ttl_ms = 24LL * 3600 * 1000;
    p->failure_ttl_ms = 5 * 60 * 1000;
    p->lease_ms = 30 * 1000;
    p->on_conflict = IDEM_CONFLICT_REJECT;
    p->on_unknown_outcome = IDEM_UNKNOWN_EXPIRE;
    p->wait_timeout_ms = 10 * 1000;
    p->fingerprint_body = IDEM_FPBODY_RAW;
    p->max_response_bytes = 1024 * 1024;
    p->release_statuses[0] = 429;
    p->release_statuses[1] = 503;
    p->n_release_statuses = 2;
    p->reconcile_after_ms = 5 * 1000;
    p->key_from = IDEM_KEY_FROM_HEADER;
    if (idem__config_set_string(&p->key_from_arg, "Idempotency-Key") != 0 ||
        copy_strings(p->replay_drop_headers, &p->n_replay_drop_headers, drop, 1) != 0 ||
        copy_strings(p->replay_marker, &p->n_replay_marker, marker, 1) != 0)
        return -1;
    return 0;
}

/* Copy one policy key (a P_* index) from src to dst. */
static int policy_copy_key(idem_policy_t *dst, const idem_policy_t *src, int key)
{
    switch (key) {
    case P_KEY_TTL: dst->key_ttl_ms = src->key_ttl_ms; break;
    case P_FAILURE_TTL: dst->failure_ttl_ms = src->failure_ttl_ms; break;
    case P_LEASE: dst->lease_ms = src->lease_ms; break;
    case P_ON_CONFLICT: dst->on_conflict = src->on_conflict; break;
    case P_ON_UNKNOWN: dst->on_unknown_outcome = src->on_unknown_outcome; break;
    case P_WAIT_TIMEOUT: dst->wait_timeout_ms = src->wait_timeout_ms; break;
    case P_FP_BODY: dst->fingerprint_body = src->fingerprint_body; break;
    case P_FP_HEADERS:
        return copy_strings(dst->fingerprint_headers, &dst->n_fingerprint_headers,
                            src->fingerprint_headers, src->n_fingerprint_headers);
    case P_FP_IGNORE:
        return copy_strings(dst->fingerprint_ignore, &dst->n_fingerprint_ignore,
                            src->fingerprint_ignore, src->n_fingerprint_ignore);
    case P_MAX_RESPONSE: dst->max_response_bytes = src->max_response_bytes; break;
    case P_RELEASE:
        memcpy(dst->release_statuses, src->release_statuses, sizeof src->release_statuses);
        dst->n_release_statuses = src->n_release_statuses;
        break;
    case P_KEY_FROM:
        dst->key_from = src->key_from;
        return idem__config_set_string(&dst->key_from_arg, src->key_from_arg);
    case P_REPLAY_DROP:
        return copy_strings(dst->replay_drop_headers, &dst->n_replay_drop_headers,
                            src->replay_drop_headers, src->n_replay_drop_headers);
    case P_REPLAY_MARKER:
        return copy_strings(dst->replay_marker, &dst->n_replay_marker, src->replay_marker,
                            src->n_replay_marker);
    case P_RECONCILE_URL: return idem__config_set_string(&dst->reconcile_url, src->reconcile_url);
    case P_RECONCILE_AFTER: dst->reconcile_after_ms = src->reconcile_after_ms; break;
    default: break;
    }
    return 0;
}

/* Copy the keys of src not in the mask `keep` into dst. */
static int policy_inherit(idem_policy_t *dst, const idem_policy_t *src, uint32_t keep)
{
    for (int k = 0; k < P_COUNT; k++)
        if (!(keep & (1u << k)) && policy_copy_key(dst, src, k) != 0)
            return -1;
    return 0;
}

static void route_cleanup(idem_route_t *r)
{
    free_strings(r->methods, &r->n_methods);
    idem_free(r->path);
    r->path = NULL;
    idem_free(r->name);
    r->name = NULL;
    policy_cleanup(&r->policy);
}

/* The route of docs/protocol.md section 5 when nothing is configured: POST and PATCH on
 * every path, key required.  Also what a route of the file starts from. */
static int route_defaults(idem_route_t *r)
{
    static char *const methods[] = {"POST", "PATCH"};
    memset(r, 0, sizeof *r);
    r->mode = IDEM_MODE_REQUIRED;
    if (copy_strings(r->methods, &r->n_methods, methods, 2) != 0 ||
        idem__config_set_string(&r->path, "/") != 0) {
        route_cleanup(r);
        return -1;
    }
    return 0;
}

int idem__config_defaults(idem_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->workers = IDEM_WORKERS_AUTO;
    cfg->upstream_timeout_ms = 60 * 1000;
    cfg->max_request_bytes = 10 * 1024 * 1024;
    cfg->on_store_error = IDEM_STORE_ERR_CLOSED;
    cfg->local_cache = 0;
    cfg->token_ttl_ms = 5 * 60 * 1000;
    cfg->header_timeout_ms = 10 * 1000;
    cfg->body_timeout_ms = 30 * 1000;
    cfg->idle_timeout_ms = 60 * 1000;
    cfg->max_connections = 10000;
    cfg->max_buffered_bytes = 256u * 1024 * 1024;
    cfg->max_queued_bytes = 64u * 1024 * 1024;
    cfg->max_connections_per_address = 0;
    cfg->upstream_tls_verify = true;
    cfg->otlp_sample_ratio = 1.0;
    cfg->otlp_queue_spans = 4096;
    cfg->otlp_timeout_ms = 2000;
    if (policy_defaults(&cfg->defaults) != 0)
        goto nomem;
    if (idem__config_set_string(&cfg->listen, "127.0.0.1:8080") != 0 ||
        idem__config_set_string(&cfg->admin, "127.0.0.1:8081") != 0 ||
        idem__config_set_string(&cfg->upstream, "http://127.0.0.1:9000") != 0 ||
        idem__config_set_string(&cfg->store, "lmdb:./idem-data") != 0 ||
        idem__config_set_string(&cfg->replay_header, "X-Idempotent-Replay") != 0 ||
        idem__config_set_string(&cfg->scope_header, "Authorization") != 0 ||
        idem__config_set_string(&cfg->log_format, "text") != 0 ||
        idem__config_set_string(&cfg->otlp_service_name, "idemd") != 0)
        goto nomem;
    if (route_defaults(&cfg->routes[0]) != 0)
        goto nomem;
    cfg->n_routes = 1;
    if (policy_inherit(&cfg->routes[0].policy, &cfg->defaults, 0) != 0)
        goto nomem;
    return 0;
nomem:
    idem__config_cleanup(cfg);
    return -1;
}

void idem__config_cleanup(idem_config_t *cfg)
{
    if (cfg == NULL)
        return;
    char **strings[] = {
        &cfg->listen, &cfg->admin, &cfg->upstream, &cfg->store, &cfg->replay_header,
        &cfg->scope_header, &cfg->log_format, &cfg->listen_tls_address,
        &cfg->listen_tls_cert_file, &cfg->listen_tls_key_file, &cfg->listen_tls_client_ca_file,
        &cfg->upstream_tls_ca_file, &cfg->upstream_tls_cert_file, &cfg->upstream_tls_key_file,
        &cfg->upstream_tls_server_name, &cfg->policy_link, &cfg->jwt_keys, &cfg->jwt_secret_file,
        &cfg->admin_token_file, &cfg->otlp_endpoint, &cfg->otlp_service_name,
    };
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++) {
        idem_free(*strings[i]);
        *strings[i] = NULL;
    }
    free_strings(cfg->admin_hosts, &cfg->n_admin_hosts);
    policy_cleanup(&cfg->defaults);
    for (size_t i = 0; i < cfg->n_routes; i++)
        route_cleanup(&cfg->routes[i]);
    cfg->n_routes = 0;
}

/* ---- addresses --------------------------------------------------------- */

int idem__config_parse_addr(const char *addr, char *host, size_t hostlen, int *port)
{
    const char *h, *hend, *p;
    if (host != NULL && hostlen > 0)
        host[0] = '\0';
    if (port != NULL)
        *port = 0;
    if (addr == NULL || host == NULL || hostlen == 0 || port == NULL)
        return -1;

    bool v6 = addr[0] == '[';
    if (v6) {
        h = addr + 1;
        hend = strchr(h, ']');
        if (hend == NULL || hend[1] != ':')
            return -1;
        p = hend + 2;
    } else {
        h = addr;
        hend = strrchr(addr, ':');
        if (hend == NULL)
            return -1;
        p = hend + 1;
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl >= hostlen || hl > 253)
        return -1;

    bool dotted_digits = true;
    for (size_t i = 0; i < hl; i++) {
        unsigned char ch = (unsigned char)h[i];
        bool digit = ch >= '0' && ch <= '9';
        bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        bool ok = v6 ? (digit || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F') ||
                        ch == ':' || ch == '.')
                     : (digit || alpha || ch == '-' || ch == '.' || ch == '_');
        if (!ok)
            return -1;
        if (!digit && ch != '.')
            dotted_digits = false;
    }

    uint64_t pv;
    if (strlen(p) > 5 || !parse_uint(p, &pv) || pv < 1 || pv > 65535)
        return -1;

    char tmp[256];
    memcpy(tmp, h, hl);
    tmp[hl] = '\0';
    unsigned char bin[16];
    /* Only what inet_pton takes is an address; "999.1.1.1" is not a name. */
    if (v6 && inet_pton(AF_INET6, tmp, bin) != 1)
        return -1;
    if (!v6 && dotted_digits && inet_pton(AF_INET, tmp, bin) != 1)
        return -1;

    memcpy(host, tmp, hl + 1);
    *port = (int)pv;
    return 0;
}

/* Why url is not an upstream idemd can use, or NULL when it is (*tls: https). */
static const char *upstream_problem(const char *url, char *host, size_t hostlen, int *port,
                                    bool *tls)
{
    size_t skip;
    if (strncasecmp(url, "https://", 8) == 0)
        skip = 8;
    else if (strncasecmp(url, "http://", 7) == 0)
        skip = 7;
    else
        return "must be http://HOST:PORT or https://HOST:PORT";
    *tls = skip == 8;
    const char *auth = url + skip;
    size_t n = strcspn(auth, "/?#");
    if (auth[n] != '\0' && strcmp(auth + n, "/") != 0)
        return "must be http(s)://HOST:PORT with no path, query or fragment";
    if (memchr(auth, '@', n) != NULL)
        return "must not contain user information";
    char a[300];
    if (n >= sizeof a)
        return "host name too long";
    memcpy(a, auth, n);
    a[n] = '\0';
    if (idem__config_parse_addr(a, host, hostlen, port) != 0)
        return "must be http(s)://HOST:PORT (the port written, 1-65535; IPv6 in brackets)";
    return NULL;
}

int idem__config_parse_upstream_url(const char *url, char *host, size_t hostlen, int *port,
                                    bool *tls)
{
    bool dummy;
    if (tls == NULL)
        tls = &dummy;
    *tls = false;
    if (url == NULL)
        return -1;
    if (upstream_problem(url, host, hostlen, port, tls) == NULL)
        return 0;
    *tls = false;
    return -1;
}

int idem__config_parse_upstream(const char *url, char *host, size_t hostlen, int *port)
{
    bool tls;
    if (idem__config_parse_upstream_url(url, host, hostlen, port, &tls) != 0)
        return -1;
    return tls ? -1 : 0;
}

/* ---- the YAML walk ----------------------------------------------------- */

typedef struct ctx {
    yaml_document_t *doc;
    const char *file;
    char *err;
    size_t errlen;
    idem_config_t *cfg;
    bool routes_seen;   /* the file had `routes:` (they replaced cfg's) */
    bool defaults_seen; /* the file had `defaults:` */
    const yaml_node_t *defaults_marker; /* defaults.replay_marker's key, if written */
    const yaml_node_t *replay_header;   /* replay_header's value, if written */
    uint32_t route_set[IDEM_CONFIG_MAX_ROUTES]; /* P_* bits each file route set itself */
} ctx_t;

/* Report "<file>:<line>: <key>: <problem>" at node n.  Always -1. */
__attribute__((format(printf, 4, 5))) static int fail(ctx_t *c, const yaml_node_t *n,
                                                      const char *key, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->err != NULL && c->errlen > 0)
        snprintf(c->err, c->errlen, "%s:%lu: %s: %s", c->file,
                 (unsigned long)n->start_mark.line + 1, key, msg);
    return -1;
}

static int nomem(ctx_t *c, const yaml_node_t *n, const char *key)
{
    return fail(c, n, key, "out of memory");
}

static yaml_node_t *node(ctx_t *c, int index)
{
    return yaml_document_get_node(c->doc, index);
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

static const char *type_name(const yaml_node_t *n)
{
    return n->type == YAML_SEQUENCE_NODE ? "a list"
           : n->type == YAML_MAPPING_NODE ? "a mapping"
                                          : "a single value";
}

/* The text of a scalar node, or NULL (error set) for anything else. */
static const char *scalar(ctx_t *c, const yaml_node_t *n, const char *key)
{
    if (n->type != YAML_SCALAR_NODE)
        return fail(c, n, key, "expected a single value, found %s", type_name(n)), NULL;
    if (is_null(n))
        return fail(c, n, key, "missing value"), NULL;
    const char *v = (const char *)n->data.scalar.value;
    if (strlen(v) != n->data.scalar.length)
        return fail(c, n, key, "contains a NUL character"), NULL;
    return v;
}

static int want_list(ctx_t *c, const yaml_node_t *n, const char *key, size_t max, size_t *count)
{
    if (n->type != YAML_SEQUENCE_NODE) {
        if (is_null(n))
            return fail(c, n, key, "expected a list (write [] for none)");
        return fail(c, n, key, "expected a list, found %s", type_name(n));
    }
    size_t k = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (k > max)
        return fail(c, n, key, "too many entries (at most %zu)", max);
    *count = k;
    return 0;
}

static int want_mapping(ctx_t *c, const yaml_node_t *n, const char *key)
{
    if (n->type == YAML_MAPPING_NODE)
        return 0;
    if (is_null(n))
        return fail(c, n, key, "expected a mapping of keys, found nothing");
    return fail(c, n, key, "expected a mapping of keys, found %s", type_name(n));
}

/* Look the key of a mapping pair up in names[]; build its dotted path into
 * path ("prefix.name", or "name" at the top level); refuse an unknown or a
 * repeated key.  @return the index, or -1 with the error set. */
static int lookup_key(ctx_t *c, const yaml_node_t *k, const char *prefix,
                      const char *const *names, int count, uint64_t *seen, char *path,
                      size_t pathlen)
{
    char shown[80];
    const char *dot = *prefix ? "." : "";
    if (k->type != YAML_SCALAR_NODE || is_null(k)) {
        snprintf(path, pathlen, "%s", *prefix ? prefix : "(top level)");
        return fail(c, k, path, "keys must be plain names");
    }
    const char *name = (const char *)k->data.scalar.value;
    for (int i = 0; i < count; i++) {
        if (strcmp(name, names[i]) != 0)
            continue;
        snprintf(path, pathlen, "%s%s%s", prefix, dot, names[i]);
        if (*seen & (UINT64_C(1) << i))
            return fail(c, k, path, "key given twice");
        *seen |= UINT64_C(1) << i;
        return i;
    }
    show(shown, sizeof shown, name);
    snprintf(path, pathlen, "%s%s%s", prefix, dot, shown);
    return fail(c, k, path, "unknown key");
}

static int duration(ctx_t *c, const yaml_node_t *n, const char *key, bool zero_ok, int64_t *out)
{
    char shown[80];
    int64_t ms;
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (idem_parse_duration(v, &ms) != IDEM_OK) {
        show(shown, sizeof shown, v);
        return fail(c, n, key, "not a duration: '%s'", shown);
    }
    if (ms == 0 && !zero_ok)
        return fail(c, n, key, "must be longer than 0");
    if (ms > MAX_DURATION_MS)
        return fail(c, n, key, "must be at most 3650d");
    *out = ms;
    return 0;
}

/* A size; zero_ok is false where 0 would read as "no limit" downstream. */
static int size(ctx_t *c, const yaml_node_t *n, const char *key, bool zero_ok, uint64_t *out)
{
    char shown[80];
    uint64_t bytes;
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (idem_parse_size(v, &bytes) != IDEM_OK) {
        show(shown, sizeof shown, v);
        return fail(c, n, key, "not a size: '%s'", shown);
    }
    if (bytes == 0 && !zero_ok)
        return fail(c, n, key, "must be at least 1 byte");
    *out = bytes;
    return 0;
}

static int number(ctx_t *c, const yaml_node_t *n, const char *key, uint64_t lo, uint64_t hi,
                  uint64_t *out)
{
    uint64_t v;
    const char *s = scalar(c, n, key);
    if (s == NULL)
        return -1;
    if (!parse_uint(s, &v) || v < lo || v > hi)
        return fail(c, n, key, "must be a whole number from %llu to %llu",
                    (unsigned long long)lo, (unsigned long long)hi);
    *out = v;
    return 0;
}

/* One word of names[], its index into *out. */
static int choice(ctx_t *c, const yaml_node_t *n, const char *key, const char *const *names,
                  int count, int *out)
{
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    for (int i = 0; i < count; i++) {
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    char list[128] = "";
    size_t used = 0;
    for (int i = 0; i < count && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 names[i]);
    return fail(c, n, key, "must be one of %s", list);
}

/* RFC 6901: "" or "/" followed by reference tokens, '~' only as ~0 or ~1. */
static bool is_json_pointer(const char *s)
{
    if (*s != '\0' && *s != '/')
        return false;
    for (; *s; s++)
        if (*s == '~' && s[1] != '0' && s[1] != '1')
            return false;
    return true;
}

/* An admin_hosts entry: a host name (letters, digits, '-', '.', '_') or an
 * IPv6 address in brackets, without a port. */
static bool is_host_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253)
        return false;
    if (s[0] == '[') {
        char tmp[64];
        unsigned char bin[16];
        if (n < 3 || s[n - 1] != ']' || n - 2 >= sizeof tmp)
            return false;
        memcpy(tmp, s + 1, n - 2);
        tmp[n - 2] = '\0';
        return inet_pton(AF_INET6, tmp, bin) == 1;
    }
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '.' || ch == '_'))
            return false;
    }
    return true;
}

/* L_FIELD: a header name idemd writes itself, kept as written; L_HEADER is
 * one it only compares, lowercased. */
/* policy_link: a URI reference (RFC 3986 characters, no space, no '<' or
 * '>' that would end it inside Link: <...>), not empty, bounded. */
static bool is_link_target(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > IDEM_CONFIG_MAX_LINK)
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("-._~:/?#[]@!$&'()*+,;=%", ch) != NULL))
            return false;
    }
    return true;
}

typedef enum { L_METHOD, L_HEADER, L_POINTER, L_HOST, L_FIELD } list_kind_t;

/* Fields a replay marker may not be: those that frame the answer or the
 * connection, which the writer sets itself (or refuses). */
static bool is_framing_field(const char *name)
{
    static const char *const names[] = {
        "content-length", "transfer-encoding", "connection", "keep-alive",
        "te", "trailer", "upgrade", "proxy-connection",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(name, names[i]) == 0)
            return true;
    return false;
}

/* A list of strings of one kind into dst/ndst (replaced only on success). */
static int string_list(ctx_t *c, const yaml_node_t *n, const char *key, list_kind_t kind,
                       char **dst, size_t *ndst)
{
    char *tmp[IDEM_CONFIG_MAX_LIST];
    size_t count, got = 0;
    char item_key[160], shown[80];
    if (want_list(c, n, key, IDEM_CONFIG_MAX_LIST, &count) != 0)
        return -1;
    if (kind == L_METHOD && count == 0)
        return fail(c, n, key, "must list at least one method");
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *item = node(c, n->data.sequence.items.start[i]);
        snprintf(item_key, sizeof item_key, "%s[%zu]", key, i);
        const char *v = scalar(c, item, item_key);
        if (v == NULL)
            goto fail;
        show(shown, sizeof shown, v);
        if (kind == L_METHOD) {
            bool ok = is_token(v);
            for (const char *p = v; ok && *p; p++)
                ok = !(*p >= 'a' && *p <= 'z');
            if (!ok) {
                fail(c, item, item_key, "not an uppercase method name: '%s'", shown);
                goto fail;
            }
        } else if ((kind == L_HEADER || kind == L_FIELD) && !is_token(v)) {
            fail(c, item, item_key, "not a header name: '%s'", shown);
            goto fail;
        } else if (kind == L_FIELD && is_framing_field(v)) {
            fail(c, item, item_key, "a field that frames the message cannot mark a replay: '%s'",
                 shown);
            goto fail;
        } else if (kind == L_POINTER && !is_json_pointer(v)) {
            fail(c, item, item_key, "not a JSON pointer (\"\" or starting with /): '%s'", shown);
            goto fail;
        } else if (kind == L_HOST && !is_host_name(v)) {
            fail(c, item, item_key, "not a host name or [IPv6] address without a port: '%s'",
                 shown);
            goto fail;
        }
        if ((tmp[got] = idem_strdup(v)) == NULL) {
            nomem(c, item, item_key);
            goto fail;
        }
        if (kind == L_HEADER || kind == L_HOST)
            for (char *p = tmp[got]; *p; p++)
                if (*p >= 'A' && *p <= 'Z')
                    *p = (char)(*p - 'A' + 'a');
        got++;
    }
    free_strings(dst, ndst);
    memcpy(dst, tmp, got * sizeof *tmp);
    *ndst = got;
    return 0;
fail:
    free_strings(tmp, &got);
    return -1;
}

static int status_list(ctx_t *c, const yaml_node_t *n, const char *key, idem_policy_t *p)
{
    int tmp[IDEM_CONFIG_MAX_LIST];
    size_t count;
    char item_key[160];
    if (want_list(c, n, key, IDEM_CONFIG_MAX_LIST, &count) != 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        uint64_t v;
        snprintf(item_key, sizeof item_key, "%s[%zu]", key, i);
        if (number(c, node(c, n->data.sequence.items.start[i]), item_key, 100, 599, &v) != 0)
            return -1;
        tmp[i] = (int)v;
    }
    memcpy(p->release_statuses, tmp, count * sizeof *tmp);
    p->n_release_statuses = count;
    return 0;
}

static const char *const conflict_names[] = {"reject", "wait"};
static const char *const unknown_names[] = {"expire", "hold", "reconcile"};
static const char *const fpbody_names[] = {"raw", "json"};
static const char *const store_error_names[] = {"closed", "open"};
static const char *const mode_names[] = {"required", "optional", "token", "off"};
static const char *const log_format_names[] = {"json", "text"};

/* `key_from`: header:NAME (a field name) or json:/pointer (RFC 6901, not
 * the whole document: a key is a string or a number, never the body). */
static int key_from(ctx_t *c, const yaml_node_t *n, const char *key, idem_policy_t *p)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    if (strlen(v) > 256)
        return fail(c, n, key, "longer than 256 characters: '%s'", shown);
    idem_key_from_t kind;
    const char *arg;
    if (strncmp(v, "header:", 7) == 0) {
        kind = IDEM_KEY_FROM_HEADER;
        arg = v + 7;
        if (!is_token(arg))
            return fail(c, n, key, "header:NAME needs a header name: '%s'", shown);
    } else if (strncmp(v, "json:", 5) == 0) {
        kind = IDEM_KEY_FROM_JSON;
        arg = v + 5;
        if (arg[0] != '/' || !is_json_pointer(arg))
            return fail(c, n, key,
                        "json:POINTER needs a JSON pointer starting with / (~0 for ~, ~1 "
                        "for /): '%s'",
                        shown);
    } else {
        return fail(c, n, key, "must be header:NAME or json:/pointer: '%s'", shown);
    }
    if (idem__config_set_string(&p->key_from_arg, arg) != 0)
        return nomem(c, n, key);
    p->key_from = kind;
    return 0;
}

/* One key of `defaults` or of a route (index P_*) into p. */
static int policy_key(ctx_t *c, const yaml_node_t *v, const char *key, int index,
                      idem_policy_t *p)
{
    int e = 0;
    switch (index) {
    case P_KEY_TTL: return duration(c, v, key, false, &p->key_ttl_ms);
    case P_FAILURE_TTL: return duration(c, v, key, true, &p->failure_ttl_ms);
    case P_LEASE: return duration(c, v, key, false, &p->lease_ms);
    case P_WAIT_TIMEOUT: return duration(c, v, key, true, &p->wait_timeout_ms);
    case P_MAX_RESPONSE: return size(c, v, key, true, &p->max_response_bytes);
    case P_RELEASE: return status_list(c, v, key, p);
    case P_FP_HEADERS:
        return string_list(c, v, key, L_HEADER, p->fingerprint_headers,
                           &p->n_fingerprint_headers);
    case P_FP_IGNORE:
        return string_list(c, v, key, L_POINTER, p->fingerprint_ignore,
                           &p->n_fingerprint_ignore);
    case P_ON_CONFLICT:
        if (choice(c, v, key, conflict_names, 2, &e) != 0)
            return -1;
        p->on_conflict = (idem_on_conflict_t)e;
        return 0;
    case P_ON_UNKNOWN:
        if (choice(c, v, key, unknown_names, 3, &e) != 0)
            return -1;
        p->on_unknown_outcome = (idem_on_unknown_t)e;
        return 0;
    case P_RECONCILE_AFTER: return duration(c, v, key, false, &p->reconcile_after_ms);
    case P_RECONCILE_URL: {
        const char *u = scalar(c, v, key);
        if (u == NULL)
            return -1;
        if (idem__config_set_string(&p->reconcile_url, u) != 0)
            return nomem(c, v, key);
        return 0; /* checked against upstream in idem__config_validate */
    }
    case P_FP_BODY:
        if (choice(c, v, key, fpbody_names, 2, &e) != 0)
            return -1;
        p->fingerprint_body = (idem_fp_body_t)e;
        return 0;
    case P_KEY_FROM: return key_from(c, v, key, p);
    case P_REPLAY_DROP:
        return string_list(c, v, key, L_HEADER, p->replay_drop_headers,
                           &p->n_replay_drop_headers);
    case P_REPLAY_MARKER:
        return string_list(c, v, key, L_FIELD, p->replay_marker, &p->n_replay_marker);
    default: return -1;
    }
}

static const char *const policy_names[] = {
#define X(id, name) name,
    POLICY_KEYS(X)
#undef X
};

/* A route's own keys come first, then the policy keys (index - R_POLICY). */
enum { R_METHODS, R_PATH, R_MODE, R_NAME, R_POLICY };
static const char *const route_names[] = {
    "methods", "path", "mode", "name",
#define X(id, name) name,
    POLICY_KEYS(X)
#undef X
};

static int parse_defaults(ctx_t *c, const yaml_node_t *n)
{
    char key[160];
    uint64_t seen = 0;
    if (want_mapping(c, n, "defaults") != 0)
        return -1;
    c->defaults_seen = true;
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top;
         pr++) {
        int i = lookup_key(c, node(c, pr->key), "defaults", policy_names, P_COUNT, &seen, key,
                           sizeof key);
        if (i < 0 || policy_key(c, node(c, pr->value), key, i, &c->cfg->defaults) != 0)
            return -1;
        if (i == P_REPLAY_MARKER)
            c->defaults_marker = node(c, pr->key);
    }
    return 0;
}

static int route_path(ctx_t *c, const yaml_node_t *n, const char *key, idem_route_t *r)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    if (v[0] != '/')
        return fail(c, n, key, "must start with '/': '%s'", shown);
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || *p == '?' || *p == '#')
            return fail(c, n, key, "must be a plain path prefix (no spaces, '?' or '#'): '%s'",
                        shown);
    /* Kept in the spelling requests are matched in (docs/protocol.md section 5), and
     * refused when no request path could ever be matched by it. */
    size_t len = strlen(v);
    char *norm = idem_malloc(len + 1);
    if (norm == NULL)
        return nomem(c, n, key);
    long rc = idem__http_path_normalize(v, len, true, norm, len + 1);
    if (rc < 0) {
        idem_free(norm);
        const char *why = rc == IDEM_TARGET_E_ESCAPE  ? "has a '%' not followed by two hex digits"
                          : rc == IDEM_TARGET_E_DOT   ? "has a '.' or '..' segment"
                          : rc == IDEM_TARGET_E_SLASH ? "has an encoded '/' or a '\\'"
                          : rc == IDEM_TARGET_E_NUL   ? "has an encoded NUL (%00)"
                          : rc == IDEM_TARGET_E_EMPTY ? "has an empty segment ('//')"
                          : rc == IDEM_TARGET_E_PARAM ? "has a ';' (path parameters)"
                                                      : "is not a path prefix";
        return fail(c, n, key, "%s, which no request path can have: '%s'", why, shown);
    }
    idem_free(r->path);
    r->path = norm;
    return 0;
}

/* ---- issue 22: admin_token_file, workers: auto, a route's name ----------
 *
 * Kept together so that the table of keys (issue 22 item 1) can take them
 * over as rows:
 *   admin_token_file  top level  file_name      default none   "a file holding the admin
 *                                                              listener's bearer token"
 *   workers           top level  workers_value  default auto   "worker threads: a number
 *                                                              from 1 to 64, or auto"
 *   name              routes[i]  route_name     default index  "the route label of
 *                                                              /metrics" */

/* `workers:` a whole number from 1 to MAX_WORKERS, or `auto` (one per CPU,
 * resolved by main.c). */
static int workers_value(ctx_t *c, const yaml_node_t *n, const char *key, int *out)
{
    const char *v = scalar(c, n, key);
    uint64_t w;
    if (v == NULL)
        return -1;
    if (strcmp(v, "auto") == 0) {
        *out = IDEM_WORKERS_AUTO;
        return 0;
    }
    if (!parse_uint(v, &w) || w < 1 || w > MAX_WORKERS)
        return fail(c, n, key, "must be auto or a whole number from 1 to %d", MAX_WORKERS);
    *out = (int)w;
    return 0;
}

/* Whether s can be a route's name: 1 to IDEM_CONFIG_MAX_ROUTE_NAME of
 * [A-Za-z0-9_.-], not all digits (those are the labels of unnamed routes)
 * and not "none" (requests no route matches).  So it is a label value
 * without escapes, and no two label values can mean different routes. */
static bool route_name_ok(const char *s)
{
    size_t n = strlen(s);
    bool digits = true;
    if (n == 0 || n > IDEM_CONFIG_MAX_ROUTE_NAME || strcmp(s, "none") == 0)
        return false;
    for (const char *p = s; *p; p++) {
        bool d = *p >= '0' && *p <= '9';
        if (!d && !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                    *p == '.' || *p == '-'))
            return false;
        digits = digits && d;
    }
    return !digits;
}

static int route_name(ctx_t *c, const yaml_node_t *n, const char *key, idem_route_t *r)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    if (!route_name_ok(v))
        return fail(c, n, key,
                    "must be 1 to %d of A-Z a-z 0-9 _ . -, not only digits and not 'none': '%s'",
                    IDEM_CONFIG_MAX_ROUTE_NAME, shown);
    for (size_t i = 0; i + 1 < c->cfg->n_routes; i++)
        if (c->cfg->routes[i].name != NULL && strcmp(c->cfg->routes[i].name, v) == 0)
            return fail(c, n, key, "routes[%zu] has this name already: '%s'", i, shown);
    return idem__config_set_string(&r->name, v) != 0 ? nomem(c, n, key) : 0;
}

bool idem__config_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

const char *idem__config_route_label(const idem_config_t *cfg, size_t i, char *buf,
                                     size_t bufsize)
{
    if (i < cfg->n_routes && cfg->routes[i].name != NULL)
        return cfg->routes[i].name;
    snprintf(buf, bufsize, "%zu", i);
    return buf;
}

/* The checks of these keys in idem__config_validate: an admin address
 * that is not loopback needs admin_token_file (SPEC section 19).
 * @return NULL, or the problem (static or in buf). */
static const char *ops_problem(const idem_config_t *cfg, char *buf, size_t buflen)
{
    char admin_host[256];
    int admin_port;
    if (idem__config_parse_addr(cfg->admin, admin_host, sizeof admin_host, &admin_port) != 0)
        return "admin: not HOST:PORT"; /* checked before: cannot happen */
    if (cfg->workers != IDEM_WORKERS_AUTO && (cfg->workers < 1 || cfg->workers > MAX_WORKERS)) {
        snprintf(buf, buflen, "workers: must be auto or a whole number from 1 to %d",
                 MAX_WORKERS);
        return buf;
    }
    if (cfg->admin_token_file != NULL && cfg->admin_token_file[0] == '\0')
        return "admin_token_file: must not be empty";
    if (cfg->admin_token_file == NULL && !idem__config_host_is_loopback(admin_host)) {
        char shown[80];
        show(shown, sizeof shown, cfg->admin);
        snprintf(buf, buflen,
                 "admin: '%s' is not a loopback address: set admin_token_file, or listen on "
                 "127.0.0.1 or [::1]",
                 shown);
        return buf;
    }
    return NULL;
}

static int parse_route(ctx_t *c, const yaml_node_t *n, size_t index)
{
    char prefix[32], key[160];
    uint64_t seen = 0;
    int e;
    snprintf(prefix, sizeof prefix, "routes[%zu]", index);
    if (want_mapping(c, n, prefix) != 0)
        return -1;
    idem_route_t *r = &c->cfg->routes[c->cfg->n_routes];
    if (route_defaults(r) != 0)
        return nomem(c, n, prefix);
    c->cfg->n_routes++;
    c->route_set[index] = 0;
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top;
         pr++) {
        int i = lookup_key(c, node(c, pr->key), prefix, route_names,
                           (int)(sizeof route_names / sizeof *route_names), &seen, key,
                           sizeof key);
        if (i < 0)
            return -1;
        const yaml_node_t *v = node(c, pr->value);
        int rc;
        if (i == R_METHODS) {
            rc = string_list(c, v, key, L_METHOD, r->methods, &r->n_methods);
        } else if (i == R_PATH) {
            rc = route_path(c, v, key, r);
        } else if (i == R_NAME) {
            rc = route_name(c, v, key, r);
        } else if (i == R_MODE) {
            rc = choice(c, v, key, mode_names, 4, &e);
            if (rc == 0)
                r->mode = (idem_route_mode_t)e;
        } else {
            rc = policy_key(c, v, key, i - R_POLICY, &r->policy);
            c->route_set[index] |= 1u << (i - R_POLICY);
        }
        if (rc != 0)
            return -1;
    }
    return 0;
}

static int parse_routes(ctx_t *c, const yaml_node_t *n)
{
    size_t count;
    if (n->type == YAML_SEQUENCE_NODE &&
        n->data.sequence.items.top - n->data.sequence.items.start > IDEM_CONFIG_MAX_ROUTES)
        return fail(c, n, "routes", "too many routes (at most %d)", IDEM_CONFIG_MAX_ROUTES);
    if (want_list(c, n, "routes", IDEM_CONFIG_MAX_ROUTES, &count) != 0)
        return -1;
    for (size_t i = 0; i < c->cfg->n_routes; i++)
        route_cleanup(&c->cfg->routes[i]);
    c->cfg->n_routes = 0;
    c->routes_seen = true;
    for (size_t i = 0; i < count; i++)
        if (parse_route(c, node(c, n->data.sequence.items.start[i]), i) != 0)
            return -1;
    return 0;
}

enum {
    T_LISTEN, T_ADMIN, T_UPSTREAM, T_STORE, T_WORKERS, T_UPSTREAM_TIMEOUT, T_MAX_REQUEST,
    T_ON_STORE_ERROR, T_REPLAY_HEADER, T_SCOPE_HEADER, T_LOCAL_CACHE, T_TOKEN_TTL,
    T_LOG_FORMAT, T_HEADER_TIMEOUT, T_BODY_TIMEOUT, T_IDLE_TIMEOUT, T_MAX_CONNECTIONS,
    T_MAX_BUFFERED, T_ADMIN_HOSTS, T_DEFAULTS, T_ROUTES, T_SCOPE, T_SCOPE_RATE_LIMIT,
    T_MAX_QUEUED, T_MAX_PER_ADDRESS, T_LISTEN_TLS, T_UPSTREAM_TLS, T_POLICY_LINK,
    /* Who the caller is: what jwt: sources verify with, what a missing one does. */
    T_JWT_KEYS, T_JWT_SECRET_FILE, T_SCOPE_MISSING,
    T_ADMIN_TOKEN_FILE, /* issue 22 */
    /* Traces: otlp_key() reads them all. */
    T_OTLP_ENDPOINT, T_OTLP_SERVICE_NAME, T_OTLP_SAMPLE_RATIO, T_OTLP_QUEUE_SPANS,
    T_OTLP_TIMEOUT,
    T_COUNT
};
static const char *const top_names[] = {
    "listen", "admin", "upstream", "store", "workers", "upstream_timeout",
    "max_request_bytes", "on_store_error", "replay_header", "scope_header", "local_cache",
    "token_ttl", "log_format", "header_timeout", "body_timeout", "idle_timeout",
    "max_connections", "max_buffered_bytes", "admin_hosts", "defaults", "routes", "scope",
    "scope_rate_limit", "max_queued_bytes", "max_connections_per_address", "listen_tls",
    "upstream_tls", "policy_link",
    "jwt_keys", "jwt_secret_file", "scope_missing",
    "admin_token_file",
    "otlp_endpoint", "otlp_service_name", "otlp_sample_ratio", "otlp_queue_spans",
    "otlp_timeout",
};
_Static_assert(T_COUNT <= 64, "lookup_key's seen set holds 64 keys");

/* A file name: any non-empty text (opened by the TLS loader, not here). */
static int file_name(ctx_t *c, const yaml_node_t *n, const char *key, char **slot)
{
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (*v == '\0')
        return fail(c, n, key, "must not be empty");
    if (idem__config_set_string(slot, v) != 0)
        return nomem(c, n, key);
    return 0;
}

/* `listen_tls:`, a mapping of address, cert_file, key_file, client_ca_file. */
static int listen_tls(ctx_t *c, const yaml_node_t *n)
{
    enum { LT_ADDRESS, LT_CERT, LT_KEY, LT_CLIENT_CA, LT_COUNT };
    static const char *const names[] = {"address", "cert_file", "key_file", "client_ca_file"};
    idem_config_t *cfg = c->cfg;
    char key[160], host[256], shown[80];
    int port;
    uint64_t seen = 0;
    if (want_mapping(c, n, "listen_tls") != 0)
        return -1;
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top;
         pr++) {
        int i = lookup_key(c, node(c, pr->key), "listen_tls", names, LT_COUNT, &seen, key,
                           sizeof key);
        if (i < 0)
            return -1;
        const yaml_node_t *v = node(c, pr->value);
        int rc;
        switch (i) {
        case LT_ADDRESS: {
            const char *a = scalar(c, v, key);
            if (a == NULL)
                return -1;
            show(shown, sizeof shown, a);
            if (idem__config_parse_addr(a, host, sizeof host, &port) != 0)
                return fail(c, v, key, "not HOST:PORT (port 1-65535, IPv6 in brackets): '%s'",
                            shown);
            rc = idem__config_set_string(&cfg->listen_tls_address, a) != 0 ? nomem(c, v, key) : 0;
            break;
        }
        case LT_CERT: rc = file_name(c, v, key, &cfg->listen_tls_cert_file); break;
        case LT_KEY: rc = file_name(c, v, key, &cfg->listen_tls_key_file); break;
        default: rc = file_name(c, v, key, &cfg->listen_tls_client_ca_file); break;
        }
        if (rc != 0)
            return -1;
    }
    for (int i = 0; i < LT_CLIENT_CA; i++)
        if (!(seen & (1u << i)))
            return fail(c, n, "listen_tls", "needs address, cert_file and key_file (%s missing)",
                        names[i]);
    return 0;
}

/* `upstream_tls:`, a mapping of ca_file, cert_file, key_file, server_name,
 * verify. */
static int upstream_tls(ctx_t *c, const yaml_node_t *n)
{
    enum { UT_CA, UT_CERT, UT_KEY, UT_SERVER_NAME, UT_VERIFY, UT_COUNT };
    static const char *const names[] = {"ca_file", "cert_file", "key_file", "server_name",
                                        "verify"};
    static const char *const bool_names[] = {"false", "true"};
    idem_config_t *cfg = c->cfg;
    char key[160], shown[80];
    uint64_t seen = 0;
    int e;
    if (want_mapping(c, n, "upstream_tls") != 0)
        return -1;
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top;
         pr++) {
        int i = lookup_key(c, node(c, pr->key), "upstream_tls", names, UT_COUNT, &seen, key,
                           sizeof key);
        if (i < 0)
            return -1;
        const yaml_node_t *v = node(c, pr->value);
        int rc;
        switch (i) {
        case UT_CA: rc = file_name(c, v, key, &cfg->upstream_tls_ca_file); break;
        case UT_CERT: rc = file_name(c, v, key, &cfg->upstream_tls_cert_file); break;
        case UT_KEY: rc = file_name(c, v, key, &cfg->upstream_tls_key_file); break;
        case UT_SERVER_NAME: {
            const char *s = scalar(c, v, key);
            if (s == NULL)
                return -1;
            show(shown, sizeof shown, s);
            if (!is_host_name(s))
                return fail(c, v, key, "not a host name or [IPv6] address without a port: '%s'",
                            shown);
            rc = idem__config_set_string(&cfg->upstream_tls_server_name, s) != 0
                     ? nomem(c, v, key)
                     : 0;
            break;
        }
        default:
            rc = choice(c, v, key, bool_names, 2, &e);
            if (rc == 0)
                cfg->upstream_tls_verify = e == 1;
            break;
        }
        if (rc != 0)
            return -1;
    }
    if (((seen >> UT_CERT) & 1u) != ((seen >> UT_KEY) & 1u))
        return fail(c, n, "upstream_tls",
                    "cert_file and key_file go together (a client "
                    "certificate and its key): write both or neither");
    return 0;
}

/* `scope:`, the list of sources that name the caller (scope.h). */
static int scope_list(ctx_t *c, const yaml_node_t *n, const char *key)
{
    idem_scope_source_t tmp[IDEM_SCOPE_MAX_SOURCES];
    size_t count;
    char item_key[200], shown[80], why[160];
    if (want_list(c, n, key, IDEM_SCOPE_MAX_SOURCES, &count) != 0)
        return -1;
    if (count == 0)
        return fail(c, n, key, "must list at least one source ([authorization] is the default)");
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *item = node(c, n->data.sequence.items.start[i]);
        snprintf(item_key, sizeof item_key, "%s[%zu]", key, i);
        const char *v = scalar(c, item, item_key);
        if (v == NULL)
            return -1;
        show(shown, sizeof shown, v);
        if (idem__gw_scope_parse_source(v, &tmp[i], why, sizeof why) != 0)
            return fail(c, item, item_key, "%s: '%s'", why, shown);
        const char *no = idem__gw_scope_unsupported(tmp[i].kind);
        if (no != NULL)
            return fail(c, item, item_key, "%s: %s", shown, no);
        for (size_t j = 0; j < i; j++) {
            /* Header names compare without case, cookie names with it. */
            bool same = tmp[j].kind == tmp[i].kind &&
                        (tmp[i].kind == IDEM_SCOPE_SRC_COOKIE
                             ? strcmp(tmp[j].name, tmp[i].name) == 0
                             : strcasecmp(tmp[j].name, tmp[i].name) == 0);
            if (same)
                return fail(c, item, item_key, "source given twice: '%s'", shown);
        }
    }
    memcpy(c->cfg->scope, tmp, count * sizeof *tmp);
    c->cfg->n_scope = count;
    return 0;
}

static int rate_limit(ctx_t *c, const yaml_node_t *n, const char *key, idem_rate_t *out)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (idem__rate_parse(v, out) != 0) {
        show(shown, sizeof shown, v);
        return fail(c, n, key, "not a rate (N/s, N/m or N/h with N from 1 to %u, or off): '%s'",
                    IDEM_RATE_MAX_COUNT, shown);
    }
    return 0;
}

/* A string-valued top-level key, checked where it can be on its own. */
static int top_string(ctx_t *c, const yaml_node_t *n, const char *key, int index)
{
    idem_config_t *cfg = c->cfg;
    char shown[80], host[256];
    int port, e;
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    char **slot = NULL;
    switch (index) {
    case T_LISTEN:
    case T_ADMIN:
        if (idem__config_parse_addr(v, host, sizeof host, &port) != 0)
            return fail(c, n, key, "not HOST:PORT (port 1-65535, IPv6 in brackets): '%s'",
                        shown);
        slot = index == T_LISTEN ? &cfg->listen : &cfg->admin;
        break;
    case T_UPSTREAM: {
        bool tls;
        const char *why = upstream_problem(v, host, sizeof host, &port, &tls);
        if (why != NULL)
            return fail(c, n, key, "%s: '%s'", why, shown);
        slot = &cfg->upstream;
        break;
    }
    case T_STORE:
        /* scalar() refuses a plain empty value; a quoted one ("") is text. */
        if (*v == '\0')
            return fail(c, n, key, "must not be empty");
        slot = &cfg->store;
        break;
    case T_REPLAY_HEADER:
    case T_SCOPE_HEADER:
        if (!is_token(v))
            return fail(c, n, key, "not a header name: '%s'", shown);
        if (index == T_REPLAY_HEADER && is_framing_field(v))
            return fail(c, n, key, "a field that frames the message cannot mark a replay: '%s'",
                        shown);
        if (index == T_REPLAY_HEADER)
            c->replay_header = n;
        slot = index == T_REPLAY_HEADER ? &cfg->replay_header : &cfg->scope_header;
        break;
    case T_POLICY_LINK:
        if (!is_link_target(v))
            return fail(c, n, key,
                        "not a URI reference (at most %d characters of letters, digits and "
                        "-._~:/?#[]@!$&'()*+,;=%%): '%s'",
                        IDEM_CONFIG_MAX_LINK, shown);
        slot = &cfg->policy_link;
        break;
    case T_LOG_FORMAT:
        if (choice(c, n, key, log_format_names, 2, &e) != 0)
            return -1;
        slot = &cfg->log_format;
        break;
    default: return -1;
    }
    if (idem__config_set_string(slot, v) != 0)
        return nomem(c, n, key);
    return 0;
}

/* The otlp_* keys (traces, SPEC section 19), all in one place:
 *   otlp_endpoint      http://HOST:PORT or https://, a path optional  NULL (off)
 *   otlp_service_name  1-100 printable ASCII characters              "idemd"
 *   otlp_sample_ratio  a decimal from 0 to 1                         1
 *   otlp_queue_spans   1 to IDEM_OTLP_QUEUE_MAX (1000000)            4096
 *   otlp_timeout       a duration over 0                             2s */
static int otlp_key(ctx_t *c, const yaml_node_t *n, const char *key, int index)
{
    idem_config_t *cfg = c->cfg;
    char shown[80];
    uint64_t v;
    if (index == T_OTLP_QUEUE_SPANS) {
        if (number(c, n, key, 1, 1000000, &v) != 0)
            return -1;
        cfg->otlp_queue_spans = v;
        return 0;
    }
    if (index == T_OTLP_TIMEOUT)
        return duration(c, n, key, false, &cfg->otlp_timeout_ms);
    const char *s = scalar(c, n, key);
    if (s == NULL)
        return -1;
    show(shown, sizeof shown, s);
    if (index == T_OTLP_SAMPLE_RATIO) {
        char *end;
        errno = 0;
        double r = strtod(s, &end);
        if (*s == '\0' || *end != '\0' || errno != 0 || !(r >= 0.0 && r <= 1.0))
            return fail(c, n, key, "not a ratio from 0 to 1: '%s'", shown);
        cfg->otlp_sample_ratio = r;
        return 0;
    }
    char **slot = &cfg->otlp_service_name;
    if (index == T_OTLP_ENDPOINT) {
        const char *rest = strncmp(s, "http://", 7) == 0    ? s + 7
                           : strncmp(s, "https://", 8) == 0 ? s + 8
                                                            : NULL;
        bool ok = rest != NULL && *rest != '\0' && *rest != '/' && strlen(s) <= 1000;
        for (const char *p = s; ok && *p; p++)
            ok = *p > ' ' && *p < 0x7f;
        if (!ok)
            return fail(c, n, key, "not an http:// or https:// URL of a collector: '%s'", shown);
        slot = &cfg->otlp_endpoint;
    } else {
        bool ok = *s != '\0' && strlen(s) <= 100;
        for (const char *p = s; ok && *p; p++)
            ok = *p >= ' ' && *p < 0x7f;
        if (!ok)
            return fail(c, n, key, "not 1 to 100 printable ASCII characters: '%s'", shown);
    }
    if (idem__config_set_string(slot, s) != 0)
        return nomem(c, n, key);
    return 0;
}

static int parse_top(ctx_t *c, const yaml_node_t *root)
{
    idem_config_t *cfg = c->cfg;
    char key[160];
    uint64_t seen = 0;
    uint64_t v;
    int e;
    const yaml_node_t *scope_node = root;
    if (is_null(root))
        return 0; /* "---" alone: an empty document */
    if (root->type != YAML_MAPPING_NODE) {
        if (c->err != NULL && c->errlen > 0)
            snprintf(c->err, c->errlen, "%s:%lu: the top level must be a mapping of keys",
                     c->file, (unsigned long)root->start_mark.line + 1);
        return -1;
    }
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
         pr < root->data.mapping.pairs.top; pr++) {
        int i = lookup_key(c, node(c, pr->key), "", top_names, T_COUNT, &seen, key, sizeof key);
        if (i < 0)
            return -1;
        const yaml_node_t *n = node(c, pr->value);
        int rc;
        switch (i) {
        case T_WORKERS: rc = workers_value(c, n, key, &cfg->workers); break;
        case T_ADMIN_TOKEN_FILE: rc = file_name(c, n, key, &cfg->admin_token_file); break;
        case T_LOCAL_CACHE:
            rc = number(c, n, key, 0, MAX_LOCAL_CACHE, &v);
            if (rc == 0)
                cfg->local_cache = v;
            break;
        case T_UPSTREAM_TIMEOUT: rc = duration(c, n, key, false, &cfg->upstream_timeout_ms); break;
        case T_TOKEN_TTL: rc = duration(c, n, key, false, &cfg->token_ttl_ms); break;
        case T_MAX_REQUEST: rc = size(c, n, key, false, &cfg->max_request_bytes); break;
        case T_HEADER_TIMEOUT: rc = duration(c, n, key, false, &cfg->header_timeout_ms); break;
        case T_BODY_TIMEOUT: rc = duration(c, n, key, false, &cfg->body_timeout_ms); break;
        case T_IDLE_TIMEOUT: rc = duration(c, n, key, false, &cfg->idle_timeout_ms); break;
        case T_MAX_CONNECTIONS:
            rc = number(c, n, key, 1, MAX_CONNECTIONS, &v);
            if (rc == 0) {
                cfg->max_connections = v;
                cfg->max_connections_set = true;
            }
            break;
        case T_MAX_BUFFERED: rc = size(c, n, key, false, &cfg->max_buffered_bytes); break;
        case T_ADMIN_HOSTS:
            rc = string_list(c, n, key, L_HOST, cfg->admin_hosts, &cfg->n_admin_hosts);
            break;
        case T_ON_STORE_ERROR:
            rc = choice(c, n, key, store_error_names, 2, &e);
            if (rc == 0)
                cfg->on_store_error = (idem_on_store_error_t)e;
            break;
        case T_DEFAULTS: rc = parse_defaults(c, n); break;
        case T_ROUTES: rc = parse_routes(c, n); break;
        case T_SCOPE:
            rc = scope_list(c, n, key);
            scope_node = n;
            break;
        case T_SCOPE_RATE_LIMIT: rc = rate_limit(c, n, key, &cfg->scope_rate_limit); break;
        case T_MAX_QUEUED: rc = size(c, n, key, false, &cfg->max_queued_bytes); break;
        case T_MAX_PER_ADDRESS:
            rc = number(c, n, key, 0, MAX_CONNECTIONS, &v);
            if (rc == 0)
                cfg->max_connections_per_address = v;
            break;
        case T_LISTEN_TLS: rc = listen_tls(c, n); break;
        case T_UPSTREAM_TLS: rc = upstream_tls(c, n); break;
        case T_JWT_KEYS: rc = file_name(c, n, key, &cfg->jwt_keys); break;
        case T_JWT_SECRET_FILE: rc = file_name(c, n, key, &cfg->jwt_secret_file); break;
        case T_OTLP_ENDPOINT:
        case T_OTLP_SERVICE_NAME:
        case T_OTLP_SAMPLE_RATIO:
        case T_OTLP_QUEUE_SPANS:
        case T_OTLP_TIMEOUT: rc = otlp_key(c, n, key, i); break;
        case T_SCOPE_MISSING: {
            static const char *const missing_names[] = {"fallback", "reject"};
            rc = choice(c, n, key, missing_names, 2, &e);
            if (rc == 0)
                cfg->scope_missing = (idem_scope_missing_t)e;
            break;
        }
        default: rc = top_string(c, n, key, i); break;
        }
        if (rc != 0)
            return -1;
    }
    /* Two answers to "who is the caller" would leave one silently unused. */
    if ((seen & (1u << T_SCOPE)) && (seen & (1u << T_SCOPE_HEADER)))
        return fail(c, scope_node, "scope",
                    "scope and scope_header both name the caller; write scope_header: X "
                    "as scope: [header:X]");
    return 0;
}

/* Routes take the file's defaults for every policy key they did not set.
 * Runs after the whole file, since `defaults` may follow `routes`.
 * replay_header: X is the older spelling of defaults.replay_marker: [X]. */
static int finish_routes(ctx_t *c)
{
    idem_config_t *cfg = c->cfg;
    if (c->replay_header != NULL) {
        char *one[] = {cfg->replay_header};
        if (c->defaults_marker != NULL)
            return fail(c, c->defaults_marker, "defaults.replay_marker",
                        "replay_header and defaults.replay_marker both name the replay "
                        "marker; write replay_header: X as defaults.replay_marker: [X]");
        if (copy_strings(cfg->defaults.replay_marker, &cfg->defaults.n_replay_marker, one,
                         1) != 0)
            return nomem(c, c->replay_header, "replay_header");
    }
    if (!c->routes_seen && !c->defaults_seen && c->replay_header == NULL)
        return 0;
    for (size_t i = 0; i < cfg->n_routes; i++) {
        uint32_t keep = c->routes_seen ? c->route_set[i] : 0;
        if (policy_inherit(&cfg->routes[i].policy, &cfg->defaults, keep) != 0) {
            snprintf(c->err, c->errlen, "%s: out of memory", c->file);
            return -1;
        }
    }
    return 0;
}

/* Read the whole file, refusing more than MAX_FILE_BYTES. */
static int slurp(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    char *buf = idem_malloc(MAX_FILE_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    size_t n = fread(buf, 1, MAX_FILE_BYTES + 1, f);
    int read_errno = errno;
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(read_errno));
    } else if (n > MAX_FILE_BYTES) {
        snprintf(err, errlen, "%s: larger than 1 MiB", path);
        bad = true;
    }
    if (bad) {
        idem_free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* "<file>:<line>: YAML: <problem> (<context>)" from a failed parser. */
static void syntax_error(const yaml_parser_t *p, const char *file, const char *buf,
                         char *err, size_t errlen)
{
    size_t line;
    if (p->error == YAML_MEMORY_ERROR) {
        snprintf(err, errlen, "%s: out of memory", file);
        return;
    }
    if (p->error == YAML_READER_ERROR) {
        line = 1;
        for (size_t i = 0; i < p->problem_offset; i++)
            line += buf[i] == '\n';
    } else {
        line = p->problem_mark.line + 1;
    }
    snprintf(err, errlen, "%s:%zu: YAML syntax error: %s%s%s%s", file, line,
             p->problem ? p->problem : "cannot parse", p->context ? " (" : "",
             p->context ? p->context : "", p->context ? ")" : "");
}

int idem__config_load_file(idem_config_t *cfg, const char *path, char *err, size_t errlen)
{
    char dummy[8];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    char *buf;
    size_t len;
    if (slurp(path, &buf, &len, err, errlen) != 0)
        return -1;

    ctx_t *c = idem_calloc(1, sizeof *c);
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    int rc = -1;
    if (c == NULL || !yaml_parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: out of memory", path);
        idem_free(c);
        idem_free(buf);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    if (!yaml_parser_load(&parser, &doc)) {
        syntax_error(&parser, path, buf, err, errlen);
        goto out;
    }
    c->doc = &doc;
    c->file = path;
    c->err = err;
    c->errlen = errlen;
    c->cfg = cfg;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root != NULL && (parse_top(c, root) != 0 || finish_routes(c) != 0))
        goto out_doc;
    /* A second document would be silently ignored: refuse it. */
    if (!yaml_parser_load(&parser, &extra)) {
        syntax_error(&parser, path, buf, err, errlen);
        goto out_doc;
    }
    const yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
    if (extra_root != NULL)
        snprintf(err, errlen, "%s:%lu: only one YAML document is allowed", path,
                 (unsigned long)extra_root->start_mark.line + 1);
    else
        rc = 0;
    yaml_document_delete(&extra);
out_doc:
    yaml_document_delete(&doc);
out:
    yaml_parser_delete(&parser);
    idem_free(c);
    idem_free(buf);
    return rc;
}

/* ---- validation and matching ------------------------------------------- */

/* What is wrong with p's reconcile_url for an upstream at host:port (tls:
 * https), or NULL: with on_unknown_outcome: reconcile it is required, and
 * it names the upstream's own origin (the question goes through the
 * upstream client, reconcile.c) and a path of visible ASCII. */
static const char *reconcile_problem(const idem_policy_t *p, const char *host, int port,
                                     bool tls)
{
    const char *u = p->reconcile_url;
    if (u == NULL)
        return p->on_unknown_outcome == IDEM_UNKNOWN_RECONCILE
                   ? "needed by on_unknown_outcome: reconcile"
                   : NULL;
    const char *sep = strstr(u, "://");
    const char *path = sep ? strchr(sep + 3, '/') : NULL;
    if (path == NULL)
        return "not http(s)://HOST:PORT/PATH";
    char origin[300], rhost[256];
    int rport;
    bool rtls = false;
    if ((size_t)(path - u) >= sizeof origin)
        return "not http(s)://HOST:PORT/PATH";
    memcpy(origin, u, (size_t)(path - u));
    origin[path - u] = '\0';
    if (idem__config_parse_upstream_url(origin, rhost, sizeof rhost, &rport, &rtls) != 0)
        return "not http(s)://HOST:PORT/PATH";
    if (rport != port || rtls != tls || strcasecmp(rhost, host) != 0)
        return "must name the upstream's own scheme, host and port";
    for (const char *q = path; *q; q++)
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f)
            return "the path must be visible ASCII";
    return NULL;
}

int idem__config_validate(const idem_config_t *cfg, char *err, size_t errlen)
{
    char host[256], shown[80], lhost[256];
    int port, lport;
    char dummy[8];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
#define BAD(...) return snprintf(err, errlen, __VA_ARGS__), -1
    show(shown, sizeof shown, cfg->listen ? cfg->listen : "");
    if (cfg->listen == NULL || idem__config_parse_addr(cfg->listen, lhost, sizeof lhost, &lport))
        BAD("listen: not HOST:PORT (port 1-65535, IPv6 in brackets): '%s'", shown);
    show(shown, sizeof shown, cfg->admin ? cfg->admin : "");
    if (cfg->admin == NULL || idem__config_parse_addr(cfg->admin, host, sizeof host, &port))
        BAD("admin: not HOST:PORT (port 1-65535, IPv6 in brackets): '%s'", shown);
    if (port == lport && strcasecmp(host, lhost) == 0)
        BAD("admin: must not be the same address as listen: '%s'", shown);
    if (cfg->listen_tls_address != NULL) {
        char thost[256];
        int tport;
        show(shown, sizeof shown, cfg->listen_tls_address);
        if (idem__config_parse_addr(cfg->listen_tls_address, thost, sizeof thost, &tport))
            BAD("listen_tls.address: not HOST:PORT (port 1-65535, IPv6 in brackets): '%s'",
                shown);
        if ((tport == lport && strcasecmp(thost, lhost) == 0) ||
            (tport == port && strcasecmp(thost, host) == 0))
            BAD("listen_tls.address: must not be the same address as listen or admin: '%s'",
                shown);
        if (cfg->listen_tls_cert_file == NULL || cfg->listen_tls_key_file == NULL)
            BAD("listen_tls: needs cert_file and key_file with address");
    } else if (cfg->listen_tls_cert_file || cfg->listen_tls_key_file ||
               cfg->listen_tls_client_ca_file) {
        BAD("listen_tls: needs address");
    }
    for (size_t i = 0; i < cfg->n_scope && i < IDEM_SCOPE_MAX_SOURCES; i++)
        if (cfg->scope[i].kind == IDEM_SCOPE_SRC_CLIENT_CERT &&
            (cfg->listen_tls_address == NULL || cfg->listen_tls_client_ca_file == NULL))
            BAD("scope: client_cert needs listen_tls.client_ca_file");
    for (size_t i = 0; i < cfg->n_scope && i < IDEM_SCOPE_MAX_SOURCES; i++)
        if (cfg->scope[i].kind == IDEM_SCOPE_SRC_JWT && cfg->jwt_keys == NULL &&
            cfg->jwt_secret_file == NULL)
            BAD("scope: jwt:%s needs jwt_keys or jwt_secret_file to verify tokens with",
                cfg->scope[i].name);
    show(shown, sizeof shown, cfg->upstream ? cfg->upstream : "");
    bool tls = false;
    const char *why = cfg->upstream
                          ? upstream_problem(cfg->upstream, host, sizeof host, &port, &tls)
                          : "missing";
    if (why != NULL)
        BAD("upstream: %s: '%s'", why, shown);
    if ((cfg->upstream_tls_cert_file == NULL) != (cfg->upstream_tls_key_file == NULL))
        BAD("upstream_tls: cert_file and key_file go together: write both or neither");
    if (!tls &&
        (cfg->upstream_tls_ca_file || cfg->upstream_tls_cert_file || cfg->upstream_tls_key_file ||
         cfg->upstream_tls_server_name || !cfg->upstream_tls_verify))
        BAD("upstream_tls: written, but the upstream is not https://: '%s'", shown);
    if (cfg->store == NULL || cfg->store[0] == '\0')
        BAD("store: must not be empty");
    if (cfg->max_request_bytes == 0)
        BAD("max_request_bytes: must be at least 1 byte");
    /* Else a body max_request_bytes allows would be refused (503) forever. */
    if (cfg->max_buffered_bytes < cfg->max_request_bytes)
        BAD("max_buffered_bytes: must be at least max_request_bytes (%llu bytes)",
            (unsigned long long)cfg->max_request_bytes);
    if (cfg->max_queued_bytes == 0)
        BAD("max_queued_bytes: must be at least 1 byte");
    if (cfg->max_connections_per_address > MAX_CONNECTIONS)
        BAD("max_connections_per_address: must be a whole number from 0 to %u", MAX_CONNECTIONS);
    if (cfg->max_connections < 1 || cfg->max_connections > MAX_CONNECTIONS)
        BAD("max_connections: must be a whole number from 1 to %u", MAX_CONNECTIONS);
    if (cfg->header_timeout_ms <= 0 || cfg->body_timeout_ms <= 0 || cfg->idle_timeout_ms <= 0)
        BAD("header_timeout, body_timeout, idle_timeout: must be longer than 0");
    {
        char why_buf[200];
        const char *ops = ops_problem(cfg, why_buf, sizeof why_buf);
        if (ops != NULL)
            BAD("%s", ops);
    }
    show(shown, sizeof shown, cfg->replay_header ? cfg->replay_header : "");
    if (!is_token(cfg->replay_header))
        BAD("replay_header: not a header name: '%s'", shown);
    show(shown, sizeof shown, cfg->scope_header ? cfg->scope_header : "");
    if (!is_token(cfg->scope_header))
        BAD("scope_header: not a header name: '%s'", shown);
    if (cfg->log_format == NULL ||
        (strcmp(cfg->log_format, "json") != 0 && strcmp(cfg->log_format, "text") != 0))
        BAD("log_format: must be one of json, text");
    if (cfg->n_routes > IDEM_CONFIG_MAX_ROUTES)
        BAD("routes: too many routes (at most %d)", IDEM_CONFIG_MAX_ROUTES);
    for (size_t i = 0; i <= cfg->n_routes; i++) {
        const idem_policy_t *p = i == 0 ? &cfg->defaults : &cfg->routes[i - 1].policy;
        char where[40];
        if (i == 0)
            snprintf(where, sizeof where, "defaults");
        else
            snprintf(where, sizeof where, "routes[%zu]", i - 1);
        why = reconcile_problem(p, host, port, tls);
        if (why != NULL) {
            show(shown, sizeof shown, p->reconcile_url ? p->reconcile_url : "");
            BAD("%s.reconcile_url: %s: '%s'", where, why, shown);
        }
    }
#undef BAD
    return 0;
}

const idem_route_t *idem__config_match(const idem_config_t *cfg, const char *method,
                                       size_t method_len, const char *path, size_t path_len)
{
    const char *q = memchr(path, '?', path_len);
    if (q != NULL)
        path_len = (size_t)(q - path);
    /* Only a normalised origin-form path can match: anything else is the
     * caller's to normalise (idem__http_target_normalize) or refuse. */
    if (path_len == 0 || path[0] != '/')
        return NULL;
    for (size_t i = 0; i < cfg->n_routes; i++) {
        const idem_route_t *r = &cfg->routes[i];
        bool method_ok = false;
        for (size_t m = 0; m < r->n_methods && !method_ok; m++)
            method_ok = strlen(r->methods[m]) == method_len &&
                        memcmp(r->methods[m], method, method_len) == 0;
        if (!method_ok)
            continue;
        if (idem__http_path_has_prefix(path, path_len, r->path, strlen(r->path)))
            return r;
    }
    return NULL;
}

const char *idem__config_policy_link(const idem_config_t *cfg)
{
    return cfg->policy_link != NULL ? cfg->policy_link : IDEM_POLICY_PATH;
}

const char *idem__config_key_from_text(const idem_policy_t *p, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s:%s", p->key_from == IDEM_KEY_FROM_JSON ? "json" : "header",
             p->key_from_arg != NULL ? p->key_from_arg : "Idempotency-Key");
    return out;
}
