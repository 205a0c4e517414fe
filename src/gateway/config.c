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
 * Every key is one row of a table (keys[], "the table of keys" below): its
 * name, the mapping it belongs to, its parser, its field, its default as
 * YAML text, whether SIGHUP applies it, and its one-line doc.  The walk of
 * every mapping, "unknown key" and "key given twice", the defaults (the
 * rows' default texts parsed by the same parsers, so a default can never
 * say other than its doc), a route's inheritance from `defaults`, SIGHUP's
 * restart check and `idemd --list-config-keys` all read that table.
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
 * THREADING: loading is one thread's; a loaded configuration is read-only
 * and may be shared (idem__config_new/ref/unref: SIGHUP publishes a new one
 * while requests finish under the one they began with).
 */
#include "gateway/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
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

static void route_cleanup(idem_route_t *r); /* by the table, below */

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

/* Where a key may be written: the mapping it belongs to (a row's `where`). */
enum {
    W_TOP = IDEM_CFG_IN_TOP,
    W_DEFAULTS = IDEM_CFG_IN_DEFAULTS,
    W_ROUTE = IDEM_CFG_IN_ROUTE,
    W_LISTEN_TLS = IDEM_CFG_IN_LISTEN_TLS,
    W_UPSTREAM_TLS = IDEM_CFG_IN_UPSTREAM_TLS,
};
#define W_POLICY (W_DEFAULTS | W_ROUTE) /* a policy key: in defaults, and per route */

#define MAX_KEYS 256 /* rows of the table; a mapping's seen set holds them all */
typedef struct keyset {
    uint64_t w[MAX_KEYS / 64];
} keyset_t;

typedef struct ctx {
    yaml_document_t *doc;
    const char *file;
    char *err;
    size_t errlen;
    idem_config_t *cfg;
    bool builtin;       /* reading the table's own defaults, not a file */
    bool in_defaults;   /* walking `defaults` (not a route) */
    bool routes_seen;   /* the file had `routes:` (they replaced cfg's) */
    bool defaults_seen; /* the file had `defaults:` */
    const yaml_node_t *cur_key;         /* the key node of the pair being parsed */
    const yaml_node_t *defaults_marker; /* defaults.replay_marker's key, if written */
    const yaml_node_t *replay_header;   /* replay_header's value, if written */
    const yaml_node_t *scope_node;      /* scope's value, if written */
    keyset_t route_set[IDEM_CONFIG_MAX_ROUTES]; /* policy rows each file route set itself */
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

static int status_list(ctx_t *c, const yaml_node_t *n, const char *key, int *dst, size_t *ndst)
{
    int tmp[IDEM_CONFIG_MAX_LIST];
    size_t count;
    char item_key[160];
    if (want_list(c, n, key, IDEM_CONFIG_MAX_LIST, &count) != 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        uint64_t v = 0;
        snprintf(item_key, sizeof item_key, "%s[%zu]", key, i);
        if (number(c, node(c, n->data.sequence.items.start[i]), item_key, 100, 599, &v) != 0)
            return -1;
        tmp[i] = (int)v;
    }
    memcpy(dst, tmp, count * sizeof *tmp);
    *ndst = count;
    return 0;
}

/* ---- the table of keys ---------------------------------------------------
 *
 * Every key of the file is one row of keys[] below: its name, the mapping
 * it belongs to, its parser, the field it fills, its default (as YAML text,
 * which idem__config_defaults parses with the same parsers), whether SIGHUP
 * applies a change to it, and one line of documentation.  The walk, the
 * "unknown key" and "key given twice" errors, the defaults, a route's
 * inheritance from `defaults`, SIGHUP's restart check and `idemd
 * --list-config-keys` all read the table.  Adding a key is one row, plus a
 * parser when none of those below fits. */

/* How a row's field is stored, so that it can be copied (a route inherits
 * it, SIGHUP keeps the running value) and compared without a switch per key. */
typedef enum {
    F_NONE,     /* a mapping or list of other keys: no field of its own */
    F_STR,      /* char *, owned */
    F_I64,      /* int64_t (durations in ms) */
    F_U64,      /* uint64_t (sizes, counts) */
    F_INT,      /* int, or an enum of int size */
    F_BOOL,     /* bool */
    F_STRLIST,  /* char *[IDEM_CONFIG_MAX_LIST] at off, its count (size_t) at off_n */
    F_STATUSES, /* int[IDEM_CONFIG_MAX_LIST] at off, its count at off_n */
    F_KEYFROM,  /* idem_key_from_t at off, its argument (char *) at off_n */
    F_SCOPE,    /* idem_scope_source_t[IDEM_SCOPE_MAX_SOURCES] at off, count at off_n */
    F_RATE,     /* idem_rate_t */
    F_DBL,      /* double */
} field_t;

_Static_assert(sizeof(idem_on_conflict_t) == sizeof(int) && sizeof(idem_on_unknown_t) == sizeof(int) &&
                   sizeof(idem_fp_body_t) == sizeof(int) &&
                   sizeof(idem_on_store_error_t) == sizeof(int) &&
                   sizeof(idem_route_mode_t) == sizeof(int) &&
                   sizeof(idem_scope_missing_t) == sizeof(int) &&
                   sizeof(idem_key_from_t) == sizeof(int),
               "enum fields are copied as int");

typedef struct cfgkey cfgkey_t;
/* Parse the value n of key (its dotted path) into the row's field of obj
 * (idem_config_t, idem_policy_t or idem_route_t, as the row's `where`
 * says).  @return 0, or -1 with the error set. */
typedef int (*parse_fn)(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                        void *obj);

struct cfgkey {
    const char *name;
    unsigned where;   /* W_*: the mapping(s) it may be written in */
    parse_fn parse;
    field_t field;
    size_t off, off_n;
    int64_t lo, hi;            /* number: bounds; duration, size: lo 1 = 0 allowed;
                                * a list: its list_kind_t */
    const char *const *words;  /* a choice: its words, NULL-terminated */
    unsigned block;            /* a mapping of the keys of this W_* (F_NONE rows) */
    bool required;             /* must be written when its mapping is */
    const char *def;           /* the default as YAML text; NULL: none (zero) */
    const char *shown;         /* the default as the docs say it, when def says less */
    idem_config_reload_t reload;
    const char *doc;
};

static void *at(const void *obj, size_t off) { return (char *)obj + off; }

static int field_copy(void *dst, const void *src, const cfgkey_t *k)
{
    switch (k->field) {
    case F_STR: return idem__config_set_string(at(dst, k->off), *(char *const *)at(src, k->off));
    case F_I64: memcpy(at(dst, k->off), at(src, k->off), sizeof(int64_t)); break;
    case F_U64: memcpy(at(dst, k->off), at(src, k->off), sizeof(uint64_t)); break;
    case F_INT: memcpy(at(dst, k->off), at(src, k->off), sizeof(int)); break;
    case F_BOOL: memcpy(at(dst, k->off), at(src, k->off), sizeof(bool)); break;
    case F_RATE: memcpy(at(dst, k->off), at(src, k->off), sizeof(idem_rate_t)); break;
    case F_DBL: memcpy(at(dst, k->off), at(src, k->off), sizeof(double)); break;
    case F_STRLIST:
        return copy_strings(at(dst, k->off), at(dst, k->off_n), at(src, k->off),
                            *(const size_t *)at(src, k->off_n));
    case F_STATUSES:
        memcpy(at(dst, k->off), at(src, k->off), IDEM_CONFIG_MAX_LIST * sizeof(int));
        memcpy(at(dst, k->off_n), at(src, k->off_n), sizeof(size_t));
        break;
    case F_SCOPE:
        memcpy(at(dst, k->off), at(src, k->off),
               IDEM_SCOPE_MAX_SOURCES * sizeof(idem_scope_source_t));
        memcpy(at(dst, k->off_n), at(src, k->off_n), sizeof(size_t));
        break;
    case F_KEYFROM:
        memcpy(at(dst, k->off), at(src, k->off), sizeof(int));
        return idem__config_set_string(at(dst, k->off_n), *(char *const *)at(src, k->off_n));
    case F_NONE: break;
    }
    return 0;
}

static bool str_eq(const char *a, const char *b)
{
    return (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
}

static bool field_equal(const void *a, const void *b, const cfgkey_t *k)
{
    switch (k->field) {
    case F_STR: return str_eq(*(char *const *)at(a, k->off), *(char *const *)at(b, k->off));
    case F_I64: return memcmp(at(a, k->off), at(b, k->off), sizeof(int64_t)) == 0;
    case F_U64: return memcmp(at(a, k->off), at(b, k->off), sizeof(uint64_t)) == 0;
    case F_INT: return memcmp(at(a, k->off), at(b, k->off), sizeof(int)) == 0;
    case F_BOOL: return *(const bool *)at(a, k->off) == *(const bool *)at(b, k->off);
    case F_DBL: return *(const double *)at(a, k->off) == *(const double *)at(b, k->off);
    case F_RATE: {
        const idem_rate_t *x = at(a, k->off), *y = at(b, k->off);
        return x->count == y->count && (x->count == 0 || x->period_ms == y->period_ms);
    }
    case F_STRLIST:
    case F_STATUSES:
    case F_SCOPE: {
        size_t n = *(const size_t *)at(a, k->off_n);
        if (n != *(const size_t *)at(b, k->off_n))
            return false;
        for (size_t i = 0; i < n; i++) {
            if (k->field == F_STRLIST &&
                !str_eq(((char *const *)at(a, k->off))[i], ((char *const *)at(b, k->off))[i]))
                return false;
            if (k->field == F_STATUSES &&
                ((const int *)at(a, k->off))[i] != ((const int *)at(b, k->off))[i])
                return false;
            if (k->field == F_SCOPE) {
                const idem_scope_source_t *x = at(a, k->off), *y = at(b, k->off);
                if (x[i].kind != y[i].kind || strcmp(x[i].name, y[i].name) != 0)
                    return false;
            }
        }
        return true;
    }
    case F_KEYFROM:
        return memcmp(at(a, k->off), at(b, k->off), sizeof(int)) == 0 &&
               str_eq(*(char *const *)at(a, k->off_n), *(char *const *)at(b, k->off_n));
    case F_NONE: break;
    }
    return true;
}

/* ---- the parsers the rows name ----------------------------------------- */

static int walk(ctx_t *c, const yaml_node_t *n, const char *prefix, unsigned where, void *obj,
                void *pobj, keyset_t *seen);

static int p_duration(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    return duration(c, n, key, k->lo == 1, at(obj, k->off));
}

static int p_size(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return size(c, n, key, k->lo == 1, at(obj, k->off));
}

static int p_number(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    uint64_t v = 0;
    if (number(c, n, key, (uint64_t)k->lo, (uint64_t)k->hi, &v) != 0)
        return -1;
    if (k->field == F_INT)
        *(int *)at(obj, k->off) = (int)v;
    else
        *(uint64_t *)at(obj, k->off) = v;
    return 0;
}

/* max_connections: a value written in the file is never lowered to fit the
 * open-files limit (main.c); the built-in one may be. */
static int p_max_connections(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                             void *obj)
{
    if (p_number(c, n, key, k, obj) != 0)
        return -1;
    if (!c->builtin)
        ((idem_config_t *)obj)->max_connections_set = true;
    return 0;
}

/* One of k->words: its index (F_INT), whether it is the second (F_BOOL:
 * false, true), or the word itself (F_STR). */
static int p_choice(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    int count = 0, e = 0;
    while (k->words[count] != NULL)
        count++;
    if (choice(c, n, key, k->words, count, &e) != 0)
        return -1;
    if (k->field == F_BOOL)
        *(bool *)at(obj, k->off) = e == 1;
    else if (k->field == F_STR) {
        if (idem__config_set_string(at(obj, k->off), k->words[e]) != 0)
            return nomem(c, n, key);
    } else
        *(int *)at(obj, k->off) = e;
    return 0;
}

static int p_list(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return string_list(c, n, key, (list_kind_t)k->lo, at(obj, k->off), at(obj, k->off_n));
}

/* defaults.replay_marker: remembered, since replay_header says the same. */
static int p_marker(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    if (c->in_defaults)
        c->defaults_marker = c->cur_key;
    return p_list(c, n, key, k, obj);
}

static int p_statuses(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    return status_list(c, n, key, at(obj, k->off), at(obj, k->off_n));
}

static int p_key_from(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    (void)k;
    return key_from(c, n, key, obj);
}

/* Any single value (checked later, as reconcile_url is in idem__config_validate). */
static int p_text(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (idem__config_set_string(at(obj, k->off), v) != 0)
        return nomem(c, n, key);
    return 0;
}

static int p_file(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return file_name(c, n, key, at(obj, k->off));
}

/* A single value that ok() accepts, kept as text; any other is the problem
 * `what` with the value quoted.  The keys that are a string of some form
 * (an address, a header name, a host, a link, the otlp strings) differ only
 * in ok() and what. */
static int p_checked(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                     void *obj, bool (*ok)(const char *), const char *what)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    if (!ok(v)) {
        show(shown, sizeof shown, v);
        return fail(c, n, key, "%s: '%s'", what, shown);
    }
    return p_text(c, n, key, k, obj);
}

static bool is_addr(const char *s)
{
    char host[256];
    int port;
    return idem__config_parse_addr(s, host, sizeof host, &port) == 0;
}

static int p_addr(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return p_checked(c, n, key, k, obj, is_addr,
                     "not HOST:PORT (port 1-65535, IPv6 in brackets)");
}

static int p_upstream(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    char shown[80], host[256];
    int port;
    bool tls;
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    const char *why = upstream_problem(v, host, sizeof host, &port, &tls);
    if (why != NULL)
        return fail(c, n, key, "%s: '%s'", why, shown);
    return p_text(c, n, key, k, obj);
}

static int p_nonempty(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    /* scalar() refuses a plain empty value; a quoted one ("") is text. */
    if (*v == '\0')
        return fail(c, n, key, "must not be empty");
    return p_text(c, n, key, k, obj);
}

static int p_header(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return p_checked(c, n, key, k, obj, is_token, "not a header name");
}

/* replay_header: the older spelling of defaults.replay_marker: [NAME]. */
static int p_replay_header(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                           void *obj)
{
    char shown[80];
    const char *v = scalar(c, n, key);
    if (v == NULL)
        return -1;
    show(shown, sizeof shown, v);
    if (is_token(v) && is_framing_field(v))
        return fail(c, n, key, "a field that frames the message cannot mark a replay: '%s'",
                    shown);
    if (p_header(c, n, key, k, obj) != 0)
        return -1;
    if (!c->builtin)
        c->replay_header = n;
    return 0;
}

static int p_link(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    char what[128];
    snprintf(what, sizeof what,
             "not a URI reference (at most %d characters of letters, digits and "
             "-._~:/?#[]@!$&'()*+,;=%%)",
             IDEM_CONFIG_MAX_LINK);
    return p_checked(c, n, key, k, obj, is_link_target, what);
}

static int p_host(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return p_checked(c, n, key, k, obj, is_host_name,
                     "not a host name or [IPv6] address without a port");
}

static int p_scope(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    (void)k;
    (void)obj;
    c->scope_node = n;
    return scope_list(c, n, key);
}

static int p_rate(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    return rate_limit(c, n, key, at(obj, k->off));
}

static int p_path(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    (void)k;
    return route_path(c, n, key, obj);
}

static int p_defaults(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                      void *obj)
{
    keyset_t seen = {{0}};
    (void)obj;
    if (want_mapping(c, n, key) != 0)
        return -1;
    c->defaults_seen = true;
    c->in_defaults = true;
    int rc = walk(c, n, key, k->block, c->cfg, &c->cfg->defaults, &seen);
    c->in_defaults = false;
    return rc;
}

static int p_routes(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj);

/* The rows of `where` named in list_names: "a, b and c". */
static void join_required(unsigned where, char *out, size_t outlen);

/* listen_tls, upstream_tls: a mapping of the keys of k->block into obj. */
static int p_block(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj);

/* ---- the rows ------------------------------------------------------------ */

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

static int p_route_name(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                        void *obj)
{
    char shown[80];
    idem_route_t *r = obj;
    const char *v = scalar(c, n, key);
    (void)k;
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

/* `workers:` a whole number from 1 to MAX_WORKERS, or `auto` (one per CPU,
 * resolved by main.c). */
static int p_workers(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                     void *obj)
{
    const char *v = scalar(c, n, key);
    uint64_t w;
    if (v == NULL)
        return -1;
    if (strcmp(v, "auto") == 0)
        w = IDEM_WORKERS_AUTO;
    else if (!parse_uint(v, &w) || w < 1 || w > MAX_WORKERS)
        return fail(c, n, key, "must be auto or a whole number from 1 to %d", MAX_WORKERS);
    *(int *)at(obj, k->off) = (int)w;
    return 0;
}

/* otlp_endpoint: http://HOST:PORT or https://, a path optional. */
static bool is_otlp_endpoint(const char *s)
{
    const char *rest = strncmp(s, "http://", 7) == 0    ? s + 7
                       : strncmp(s, "https://", 8) == 0 ? s + 8
                                                        : NULL;
    bool ok = rest != NULL && *rest != '\0' && *rest != '/' && strlen(s) <= 1000;
    for (const char *p = s; ok && *p; p++)
        ok = *p > ' ' && *p < 0x7f;
    return ok;
}

static int p_otlp_endpoint(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                           void *obj)
{
    return p_checked(c, n, key, k, obj, is_otlp_endpoint,
                     "not an http:// or https:// URL of a collector");
}

/* otlp_service_name: 1 to 100 printable ASCII characters. */
static bool is_service_name(const char *s)
{
    bool ok = *s != '\0' && strlen(s) <= 100;
    for (const char *p = s; ok && *p; p++)
        ok = *p >= ' ' && *p < 0x7f;
    return ok;
}

static int p_service_name(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k,
                          void *obj)
{
    return p_checked(c, n, key, k, obj, is_service_name,
                     "not 1 to 100 printable ASCII characters");
}

/* A decimal from 0 to 1 (otlp_sample_ratio). */
static int p_ratio(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    char shown[80];
    char *end;
    const char *s = scalar(c, n, key);
    if (s == NULL)
        return -1;
    show(shown, sizeof shown, s);
    errno = 0;
    double r = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno != 0 || !(r >= 0.0 && r <= 1.0))
        return fail(c, n, key, "not a ratio from 0 to 1: '%s'", shown);
    *(double *)at(obj, k->off) = r;
    return 0;
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

#define CFG(m, kind) .field = kind, .off = offsetof(idem_config_t, m)
#define POL(m, kind) .field = kind, .off = offsetof(idem_policy_t, m)
#define ROUTE(m, kind) .field = kind, .off = offsetof(idem_route_t, m)
#define CFG_LIST(m, n) .field = F_STRLIST, .off = offsetof(idem_config_t, m), \
                       .off_n = offsetof(idem_config_t, n)
#define POL_LIST(m, n) .field = F_STRLIST, .off = offsetof(idem_policy_t, m), \
                       .off_n = offsetof(idem_policy_t, n)
#define WORDS(...) .words = (const char *const[]){__VA_ARGS__, NULL}
#define RELOAD .reload = IDEM_CONFIG_RELOAD
#define RESTART .reload = IDEM_CONFIG_RESTART

static const cfgkey_t keys[] = {
    /* top level */
    {"listen", W_TOP, p_addr, CFG(listen, F_STR), .def = "127.0.0.1:8080", RESTART,
     .doc = "the public listener clients connect to"},
    {"admin", W_TOP, p_addr, CFG(admin, F_STR), .def = "127.0.0.1:8081", RESTART,
     .doc = "the admin listener (/healthz, /readyz, /metrics, /keys)"},
    {"upstream", W_TOP, p_upstream, CFG(upstream, F_STR), .def = "http://127.0.0.1:9000",
     RESTART, .doc = "the service behind idemd: http(s)://HOST:PORT"},
    {"store", W_TOP, p_nonempty, CFG(store, F_STR), .def = "lmdb:./idem-data", RESTART,
     .doc = "where key records live (a store URL)"},
    {"workers", W_TOP, p_workers, CFG(workers, F_INT), .def = "auto", RESTART,
     .doc = "worker threads, each with its own event loop: 1 to 64, or auto (one per CPU)"},
    {"upstream_timeout", W_TOP, p_duration, CFG(upstream_timeout_ms, F_I64), .def = "60s",
     RESTART, .doc = "how long to wait for the upstream's complete response"},
    {"max_request_bytes", W_TOP, p_size, CFG(max_request_bytes, F_U64), .def = "10MiB",
     RESTART, .doc = "the largest request body accepted"},
    {"on_store_error", W_TOP, p_choice, CFG(on_store_error, F_INT), WORDS("closed", "open"),
     .def = "closed", RELOAD, .doc = "what a request gets when the store fails"},
    {"replay_header", W_TOP, p_replay_header, CFG(replay_header, F_STR),
     .def = "X-Idempotent-Replay", RELOAD,
     .doc = "the older spelling of defaults.replay_marker: [NAME]"},
    {"policy_link", W_TOP, p_link, CFG(policy_link, F_STR), .shown = "none (/_idem/policy)",
     RESTART, .doc = "the URL problems name in Link: rel=\"describedby\""},
    {"scope_header", W_TOP, p_header, CFG(scope_header, F_STR), .def = "Authorization", RELOAD,
     .doc = "the header that scopes keys to a caller (scope generalises it)"},
    {"scope", W_TOP, p_scope, .field = F_SCOPE, .off = offsetof(idem_config_t, scope),
     .off_n = offsetof(idem_config_t, n_scope), .shown = "[authorization]", RELOAD,
     .doc = "the sources that name the caller"},
    {"jwt_keys", W_TOP, p_file, CFG(jwt_keys, F_STR), RELOAD,
     .doc = "PEM public keys or a JWKS that jwt: sources verify with"},
    {"jwt_secret_file", W_TOP, p_file, CFG(jwt_secret_file, F_STR), RELOAD,
     .doc = "the HS256 secret that jwt: sources verify with"},
    {"scope_missing", W_TOP, p_choice, CFG(scope_missing, F_INT), WORDS("fallback", "reject"),
     .def = "fallback", RELOAD, .doc = "what a request whose scope source is absent gets"},
    {"scope_rate_limit", W_TOP, p_rate, CFG(scope_rate_limit, F_RATE), .def = "off", RESTART,
     .doc = "the most keyed requests one caller may send per second, minute or hour"},
    {"local_cache", W_TOP, p_number, CFG(local_cache, F_U64), .lo = 0, .hi = MAX_LOCAL_CACHE,
     .def = "0", RESTART, .doc = "completed records cached in process (entries; 0: off)"},
    {"token_ttl", W_TOP, p_duration, CFG(token_ttl_ms, F_I64), .def = "5m", RELOAD,
     .doc = "lifetime of a prevention token"},
    {"log_format", W_TOP, p_choice, CFG(log_format, F_STR), WORDS("json", "text"),
     .def = "text", RELOAD, .doc = "the log format on stderr"},
    {"header_timeout", W_TOP, p_duration, CFG(header_timeout_ms, F_I64), .def = "10s", RESTART,
     .doc = "a request head must be whole within this"},
    {"body_timeout", W_TOP, p_duration, CFG(body_timeout_ms, F_I64), .def = "30s", RESTART,
     .doc = "the longest pause between bytes of a request body"},
    {"idle_timeout", W_TOP, p_duration, CFG(idle_timeout_ms, F_I64), .def = "60s", RESTART,
     .doc = "how long a keep-alive connection may wait for its next request"},
    {"max_connections", W_TOP, p_max_connections, CFG(max_connections, F_U64), .lo = 1,
     .hi = MAX_CONNECTIONS, .def = "10000", RESTART,
     .doc = "client connections at once, all workers together"},
    {"max_buffered_bytes", W_TOP, p_size, CFG(max_buffered_bytes, F_U64), .def = "256MiB",
     RESTART, .doc = "request bodies held in memory at once"},
    {"max_queued_bytes", W_TOP, p_size, CFG(max_queued_bytes, F_U64), .def = "64MiB", RESTART,
     .doc = "answers queued to clients that do not read them"},
    {"max_connections_per_address", W_TOP, p_number, CFG(max_connections_per_address, F_U64),
     .lo = 0, .hi = MAX_CONNECTIONS, .def = "0", RESTART,
     .doc = "client connections one IP address may hold at once (0: off)"},
    {"http2", W_TOP, p_choice, CFG(http2, F_BOOL), WORDS("false", "true"), .def = "false",
     RESTART, .doc = "HTTP/2 too: with prior knowledge on listen, by ALPN h2 on listen_tls"},
    {"http2_max_concurrent_streams", W_TOP, p_number, CFG(http2_max_concurrent_streams, F_U64),
     .lo = 1, .hi = 10000, .def = "100", RESTART,
     .doc = "HTTP/2 streams one connection may have open at once (advertised in SETTINGS)"},
    {"listen_tls", W_TOP, p_block, .block = W_LISTEN_TLS, .shown = "none",
     .reload = IDEM_CONFIG_PARTLY, .doc = "an extra public listener that speaks TLS"},
    {"upstream_tls", W_TOP, p_block, .block = W_UPSTREAM_TLS, .shown = "none", RESTART,
     .doc = "how an https:// upstream is spoken to"},
    {"admin_hosts", W_TOP, p_list, CFG_LIST(admin_hosts, n_admin_hosts), .lo = L_HOST,
     .def = "[]", RESTART, .doc = "Host names the admin listener answers besides loopback's"},
    {"admin_token_file", W_TOP, p_file, CFG(admin_token_file, F_STR), .shown = "none", RESTART,
     .doc = "a file holding the admin listener's bearer token"},
    {"otlp_endpoint", W_TOP, p_otlp_endpoint, CFG(otlp_endpoint, F_STR), .shown = "none",
     RESTART, .doc = "the OTLP/HTTP collector spans are sent to"},
    {"otlp_service_name", W_TOP, p_service_name, CFG(otlp_service_name, F_STR), .def = "idemd",
     RESTART, .doc = "the service.name of idemd's spans"},
    {"otlp_sample_ratio", W_TOP, p_ratio, CFG(otlp_sample_ratio, F_DBL), .def = "1", RESTART,
     .doc = "the share of new traces recorded"},
    {"otlp_queue_spans", W_TOP, p_number, CFG(otlp_queue_spans, F_U64), .lo = 1, .hi = 1000000,
     .def = "4096", RESTART, .doc = "spans waiting for export at most; more are dropped"},
    {"otlp_timeout", W_TOP, p_duration, CFG(otlp_timeout_ms, F_I64), .def = "2s", RESTART,
     .doc = "one export POST at most"},
    {"defaults", W_TOP, p_defaults, .block = W_DEFAULTS, RELOAD,
     .doc = "the policy every route inherits"},
    {"routes", W_TOP, p_routes, .block = W_ROUTE, RELOAD,
     .doc = "which requests are handled how; first match wins"},

    /* listen_tls: */
    {"address", W_LISTEN_TLS, p_addr, CFG(listen_tls_address, F_STR), .required = true,
     .shown = "none", RESTART, .doc = "HOST:PORT of the TLS listener"},
    {"cert_file", W_LISTEN_TLS, p_file, CFG(listen_tls_cert_file, F_STR), .required = true,
     RELOAD, .doc = "the server certificate (PEM, chain after it)"},
    {"key_file", W_LISTEN_TLS, p_file, CFG(listen_tls_key_file, F_STR), .required = true,
     RELOAD, .doc = "its private key (PEM)"},
    {"client_ca_file", W_LISTEN_TLS, p_file, CFG(listen_tls_client_ca_file, F_STR), RELOAD,
     .doc = "CAs client certificates are verified against; asks for one"},

    /* upstream_tls: */
    {"ca_file", W_UPSTREAM_TLS, p_file, CFG(upstream_tls_ca_file, F_STR),
     .shown = "the system's trust store", RESTART,
     .doc = "CAs the upstream's certificate is verified against"},
    {"cert_file", W_UPSTREAM_TLS, p_file, CFG(upstream_tls_cert_file, F_STR), RESTART,
     .doc = "a client certificate idemd presents (with key_file)"},
    {"key_file", W_UPSTREAM_TLS, p_file, CFG(upstream_tls_key_file, F_STR), RESTART,
     .doc = "its private key (with cert_file)"},
    {"server_name", W_UPSTREAM_TLS, p_host, CFG(upstream_tls_server_name, F_STR),
     .shown = "the upstream URL's host", RESTART, .doc = "the name sent in SNI and verified"},
    {"verify", W_UPSTREAM_TLS, p_choice, CFG(upstream_tls_verify, F_BOOL),
     WORDS("false", "true"), .def = "true", RESTART,
     .doc = "false skips verifying the upstream's certificate"},

    /* a route's own keys */
    {"methods", W_ROUTE, p_list, ROUTE(methods, F_STRLIST),
     .off_n = offsetof(idem_route_t, n_methods), .lo = L_METHOD, .def = "[POST, PATCH]",
     RELOAD, .doc = "the methods the route applies to"},
    {"path", W_ROUTE, p_path, ROUTE(path, F_STR), .def = "/", RELOAD,
     .doc = "the path prefix the route applies to"},
    {"name", W_ROUTE, p_route_name, ROUTE(name, F_STR), .shown = "the route's index", RELOAD,
     .doc = "the route's label in /metrics"},
    {"mode", W_ROUTE, p_choice, ROUTE(mode, F_INT),
     WORDS("required", "optional", "token", "off"), .def = "required", RELOAD,
     .doc = "required, optional, token or off"},

    /* the policy: in defaults, and in any route */
    {"key_ttl", W_POLICY, p_duration, POL(key_ttl_ms, F_I64), .def = "24h", RELOAD,
     .doc = "how long a completed record is kept and replayed"},
    {"failure_ttl", W_POLICY, p_duration, POL(failure_ttl_ms, F_I64), .lo = 1, .def = "5m",
     RELOAD, .doc = "how long a 5xx answer is kept and replayed"},
    {"lease", W_POLICY, p_duration, POL(lease_ms, F_I64), .def = "30s", RELOAD,
     .doc = "how long a claim holds a key while its request runs"},
    {"on_conflict", W_POLICY, p_choice, POL(on_conflict, F_INT), WORDS("reject", "wait"),
     .def = "reject", RELOAD, .doc = "a repeat while the first runs: 409, or wait"},
    {"on_unknown_outcome", W_POLICY, p_choice, POL(on_unknown_outcome, F_INT),
     WORDS("expire", "hold", "reconcile"), .def = "expire", RELOAD,
     .doc = "when no complete answer came: expire, hold or reconcile"},
    {"wait_timeout", W_POLICY, p_duration, POL(wait_timeout_ms, F_I64), .lo = 1, .def = "10s",
     RELOAD, .doc = "with on_conflict: wait, the longest a repeat is held"},
    {"fingerprint_body", W_POLICY, p_choice, POL(fingerprint_body, F_INT), WORDS("raw", "json"),
     .def = "raw", RELOAD, .doc = "hash the body bytes, or its canonical JSON"},
    {"fingerprint_headers", W_POLICY, p_list, POL_LIST(fingerprint_headers, n_fingerprint_headers),
     .lo = L_HEADER, .def = "[]", RELOAD, .doc = "request headers part of the fingerprint"},
    {"fingerprint_ignore", W_POLICY, p_list, POL_LIST(fingerprint_ignore, n_fingerprint_ignore),
     .lo = L_POINTER, .def = "[]", RELOAD, .doc = "JSON fields left out of the fingerprint"},
    {"max_response_bytes", W_POLICY, p_size, POL(max_response_bytes, F_U64), .lo = 1,
     .def = "1MiB", RELOAD, .doc = "the largest response body stored for replay"},
    {"release_statuses", W_POLICY, p_statuses, .field = F_STATUSES,
     .off = offsetof(idem_policy_t, release_statuses),
     .off_n = offsetof(idem_policy_t, n_release_statuses), .def = "[429, 503]", RELOAD,
     .doc = "upstream statuses that mean nothing was done"},
    {"key_from", W_POLICY, p_key_from, .field = F_KEYFROM, .off = offsetof(idem_policy_t, key_from),
     .off_n = offsetof(idem_policy_t, key_from_arg), .def = "header:Idempotency-Key", RELOAD,
     .doc = "where the key is read: header:NAME or json:/pointer"},
    {"replay_drop_headers", W_POLICY, p_list,
     POL_LIST(replay_drop_headers, n_replay_drop_headers), .lo = L_HEADER,
     .def = "[Set-Cookie]", RELOAD, .doc = "response fields never stored nor replayed"},
    {"replay_marker", W_POLICY, p_marker, POL_LIST(replay_marker, n_replay_marker),
     .lo = L_FIELD, .def = "[X-Idempotent-Replay]", RELOAD,
     .doc = "fields set to true on every replay"},
    {"reconcile_url", W_POLICY, p_text, POL(reconcile_url, F_STR), RELOAD,
     .doc = "with reconcile: the upstream's status endpoint ({key} replaced)"},
    {"reconcile_after", W_POLICY, p_duration, POL(reconcile_after_ms, F_I64), .def = "5s",
     RELOAD, .doc = "with reconcile: when the first question goes"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])
_Static_assert(sizeof keys / sizeof keys[0] <= MAX_KEYS, "keyset_t holds every row");

/* Free what row k owns in obj (a string, a list). */
static void field_free(void *obj, const cfgkey_t *k)
{
    char **slot = NULL;
    if (k->field == F_STR)
        slot = at(obj, k->off);
    else if (k->field == F_KEYFROM)
        slot = at(obj, k->off_n);
    else if (k->field == F_STRLIST)
        free_strings(at(obj, k->off), at(obj, k->off_n));
    if (slot != NULL) {
        idem_free(*slot);
        *slot = NULL;
    }
}

static void policy_cleanup(idem_policy_t *p)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].where & W_DEFAULTS)
            field_free(p, &keys[i]);
}

static void route_cleanup(idem_route_t *r)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].where == W_ROUTE)
            field_free(r, &keys[i]);
    policy_cleanup(&r->policy);
}

void idem__config_cleanup(idem_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].where & (W_TOP | W_LISTEN_TLS | W_UPSTREAM_TLS))
            field_free(cfg, &keys[i]);
    policy_cleanup(&cfg->defaults);
    for (size_t i = 0; i < cfg->n_routes; i++)
        route_cleanup(&cfg->routes[i]);
    cfg->n_routes = 0;
}

static bool keyset_has(const keyset_t *s, size_t i) { return (s->w[i / 64] >> (i % 64)) & 1u; }
static void keyset_add(keyset_t *s, size_t i) { s->w[i / 64] |= UINT64_C(1) << (i % 64); }

/* The row named name in where (it exists: a name in this file). */
static size_t row(const char *name, unsigned where)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if ((keys[i].where & where) && strcmp(keys[i].name, name) == 0)
            return i;
    return 0;
}

/* Look the key of a mapping pair up among the rows of where; build its
 * dotted path into path ("prefix.name", or "name" at the top level); refuse
 * an unknown or a repeated key.  @return the row, or -1 with the error set. */
static int lookup_key(ctx_t *c, const yaml_node_t *k, const char *prefix, unsigned where,
                      keyset_t *seen, char *path, size_t pathlen)
{
    char shown[80];
    const char *dot = *prefix ? "." : "";
    if (k->type != YAML_SCALAR_NODE || is_null(k)) {
        snprintf(path, pathlen, "%s", *prefix ? prefix : "(top level)");
        return fail(c, k, path, "keys must be plain names");
    }
    const char *name = (const char *)k->data.scalar.value;
    for (size_t i = 0; i < N_KEYS; i++) {
        if (!(keys[i].where & where) || strcmp(name, keys[i].name) != 0)
            continue;
        snprintf(path, pathlen, "%s%s%s", prefix, dot, keys[i].name);
        if (keyset_has(seen, i))
            return fail(c, k, path, "key given twice");
        keyset_add(seen, i);
        return (int)i;
    }
    show(shown, sizeof shown, name);
    snprintf(path, pathlen, "%s%s%s", prefix, dot, shown);
    return fail(c, k, path, "unknown key");
}

/* Every pair of the mapping n by its row: a policy row into pobj, any other
 * into obj. */
static int walk(ctx_t *c, const yaml_node_t *n, const char *prefix, unsigned where, void *obj,
                void *pobj, keyset_t *seen)
{
    char key[160];
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *kn = node(c, pr->key);
        int i = lookup_key(c, kn, prefix, where, seen, key, sizeof key);
        if (i < 0)
            return -1;
        const cfgkey_t *k = &keys[i];
        c->cur_key = kn;
        if (k->parse(c, node(c, pr->value), key, k, (k->where & W_DEFAULTS) ? pobj : obj) != 0)
            return -1;
    }
    return 0;
}

static void join_required(unsigned where, char *out, size_t outlen)
{
    size_t n = 0, total = 0, used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++)
        total += (keys[i].where & where) && keys[i].required;
    for (size_t i = 0; i < N_KEYS && used < outlen; i++) {
        if (!(keys[i].where & where) || !keys[i].required)
            continue;
        n++;
        const char *sep = n == 1 ? "" : n == total ? " and " : ", ";
        used += (size_t)snprintf(out + used, outlen - used, "%s%s", sep, keys[i].name);
    }
}

static int p_block(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    keyset_t seen = {{0}};
    char need[128];
    if (want_mapping(c, n, key) != 0 || walk(c, n, key, k->block, obj, obj, &seen) != 0)
        return -1;
    for (size_t i = 0; i < N_KEYS; i++)
        if ((keys[i].where & k->block) && keys[i].required && !keyset_has(&seen, i)) {
            join_required(k->block, need, sizeof need);
            return fail(c, n, key, "needs %s (%s missing)", need, keys[i].name);
        }
    if (k->block == W_UPSTREAM_TLS && keyset_has(&seen, row("cert_file", W_UPSTREAM_TLS)) !=
                                          keyset_has(&seen, row("key_file", W_UPSTREAM_TLS)))
        return fail(c, n, key,
                    "cert_file and key_file go together (a client "
                    "certificate and its key): write both or neither");
    return 0;
}

/* ---- defaults from the table ------------------------------------------- */

/* Append to b (cap bytes, *used so far) the defaults of the rows of where
 * as YAML block lines indented by indent; a route's policy rows are left
 * out (a route inherits them from `defaults`).  @return false when b is
 * too small. */
static bool emit(char *b, size_t cap, size_t *used, unsigned where, int indent)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const cfgkey_t *k = &keys[i];
        if (!(k->where & where) || (where == W_ROUTE && (k->where & W_DEFAULTS)))
            continue;
        char inner[4096];
        size_t n = 0;
        int w;
        if (k->block != 0) {
            bool list = k->block == W_ROUTE;
            if (!emit(inner, sizeof inner, &n, k->block, indent + (list ? 4 : 2)))
                return false;
            if (n == 0)
                continue;
            if (list) /* one list item: its first line starts "- " */
                memcpy(inner + indent + 2, "- ", 2);
            w = snprintf(b + *used, cap - *used, "%*s%s:\n%s", indent, "", k->name, inner);
        } else if (k->def != NULL) {
            w = snprintf(b + *used, cap - *used, "%*s%s: %s\n", indent, "", k->name, k->def);
        } else {
            continue;
        }
        if (w < 0 || (size_t)w >= cap - *used)
            return false;
        *used += (size_t)w;
    }
    return true;
}

static int load_text(ctx_t *c, const char *text, size_t len, const char *file, unsigned where,
                     void *obj, void *pobj, const char *prefix);

/* A route before its own keys: the route rows' defaults (POST and PATCH on
 * every path, key required; docs/protocol.md section 5). */
static int route_defaults(ctx_t *c, idem_route_t *r)
{
    char text[512];
    size_t n = 0;
    memset(r, 0, sizeof *r);
    if (!emit(text, sizeof text, &n, W_ROUTE, 0))
        return -1;
    if (load_text(c, text, n, "(built-in route)", W_ROUTE, r, &r->policy, "routes[]") != 0) {
        route_cleanup(r);
        return -1;
    }
    return 0;
}

static int parse_route(ctx_t *c, const yaml_node_t *n, size_t index)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "routes[%zu]", index);
    if (want_mapping(c, n, prefix) != 0)
        return -1;
    idem_route_t *r = &c->cfg->routes[c->cfg->n_routes];
    if (route_defaults(c, r) != 0)
        return nomem(c, n, prefix);
    c->cfg->n_routes++;
    memset(&c->route_set[index], 0, sizeof c->route_set[index]);
    return walk(c, n, prefix, W_ROUTE, r, &r->policy, &c->route_set[index]);
}

static int p_routes(ctx_t *c, const yaml_node_t *n, const char *key, const cfgkey_t *k, void *obj)
{
    size_t count;
    (void)k;
    (void)obj;
    if (n->type == YAML_SEQUENCE_NODE &&
        n->data.sequence.items.top - n->data.sequence.items.start > IDEM_CONFIG_MAX_ROUTES)
        return fail(c, n, key, "too many routes (at most %d)", IDEM_CONFIG_MAX_ROUTES);
    if (want_list(c, n, key, IDEM_CONFIG_MAX_ROUTES, &count) != 0)
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

/* Copy the policy rows of src not in keep into dst. */
static int policy_inherit(idem_policy_t *dst, const idem_policy_t *src, const keyset_t *keep)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if ((keys[i].where & W_DEFAULTS) && !(keep && keyset_has(keep, i)) &&
            field_copy(dst, src, &keys[i]) != 0)
            return -1;
    return 0;
}

static int parse_top(ctx_t *c, const yaml_node_t *root)
{
    keyset_t seen = {{0}};
    if (is_null(root))
        return 0; /* "---" alone: an empty document */
    if (root->type != YAML_MAPPING_NODE) {
        if (c->err != NULL && c->errlen > 0)
            snprintf(c->err, c->errlen, "%s:%lu: the top level must be a mapping of keys",
                     c->file, (unsigned long)root->start_mark.line + 1);
        return -1;
    }
    if (walk(c, root, "", W_TOP, c->cfg, NULL, &seen) != 0)
        return -1;
    /* Two answers to "who is the caller" would leave one silently unused. */
    if (keyset_has(&seen, row("scope", W_TOP)) && keyset_has(&seen, row("scope_header", W_TOP)))
        return fail(c, c->scope_node, "scope",
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
        const keyset_t *keep = c->routes_seen ? &c->route_set[i] : NULL;
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


/* Parse text (len bytes, named file in messages) as one YAML document and
 * walk it: the whole file when where is W_TOP, else one mapping of the rows
 * of where into obj and pobj (named prefix).  Nested calls (a route's
 * defaults while its file is read) leave c as they found it. */
static int load_text(ctx_t *c, const char *text, size_t len, const char *file, unsigned where,
                     void *obj, void *pobj, const char *prefix)
{
    yaml_document_t *saved_doc = c->doc;
    const char *saved_file = c->file;
    const yaml_node_t *saved_key = c->cur_key;
    bool saved_builtin = c->builtin, saved_in_defaults = c->in_defaults;
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(c->err, c->errlen, "%s: out of memory", file);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        syntax_error(&parser, file, text, c->err, c->errlen);
        goto out;
    }
    c->doc = &doc;
    c->file = file;
    c->builtin = saved_builtin || file[0] == '(';
    c->in_defaults = false;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (where != W_TOP) {
        keyset_t seen = {{0}};
        if (root == NULL || (want_mapping(c, root, prefix) == 0 &&
                             walk(c, root, prefix, where, obj, pobj, &seen) == 0))
            rc = 0;
        goto out_doc;
    }
    if (root != NULL && (parse_top(c, root) != 0 || finish_routes(c) != 0))
        goto out_doc;
    /* A second document would be silently ignored: refuse it. */
    if (!yaml_parser_load(&parser, &extra)) {
        syntax_error(&parser, file, text, c->err, c->errlen);
        goto out_doc;
    }
    const yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
    if (extra_root != NULL)
        snprintf(c->err, c->errlen, "%s:%lu: only one YAML document is allowed", file,
                 (unsigned long)extra_root->start_mark.line + 1);
    else
        rc = 0;
    yaml_document_delete(&extra);
out_doc:
    yaml_document_delete(&doc);
out:
    yaml_parser_delete(&parser);
    c->doc = saved_doc;
    c->file = saved_file;
    c->cur_key = saved_key;
    c->builtin = saved_builtin;
    c->in_defaults = saved_in_defaults;
    return rc;
}

int idem__config_defaults(idem_config_t *cfg)
{
    /* The table's defaults as one YAML document (about 1.5 KiB): a table
     * that outgrew this would fail every start and every test at once. */
    char text[8192], err[256];
    size_t n = 0;
    memset(cfg, 0, sizeof *cfg);
    ctx_t *c = idem_calloc(1, sizeof *c);
    if (c == NULL)
        return -1;
    c->cfg = cfg;
    c->err = err;
    c->errlen = sizeof err;
    c->builtin = true;
    int rc = emit(text, sizeof text, &n, W_TOP, 0)
                 ? load_text(c, text, n, "(built-in defaults)", W_TOP, cfg, NULL, "")
                 : -1;
    idem_free(c);
    if (rc != 0)
        idem__config_cleanup(cfg);
    return rc;
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
    if (c == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        idem_free(buf);
        return -1;
    }
    c->err = err;
    c->errlen = errlen;
    c->cfg = cfg;
    int rc = load_text(c, buf, len, path, W_TOP, cfg, NULL, "");
    idem_free(c);
    idem_free(buf);
    return rc;
}

/* ---- the table, outside --------------------------------------------------- */

/* The dotted name of row k for people: "listen", "defaults.key_ttl",
 * "routes[].path", "listen_tls.address". */
static void dotted(const cfgkey_t *k, char *out, size_t outlen)
{
    const char *prefix = (k->where & W_DEFAULTS)       ? "defaults."
                         : (k->where & W_ROUTE)        ? "routes[]."
                         : (k->where & W_LISTEN_TLS)   ? "listen_tls."
                         : (k->where & W_UPSTREAM_TLS) ? "upstream_tls."
                                                       : "";
    snprintf(out, outlen, "%s%s", prefix, k->name);
}

void idem__config_list_keys(FILE *f)
{
    static const char *const reload_names[] = {"restart", "yes", "partly"};
    char name[80];
    for (size_t i = 0; i < N_KEYS; i++) {
        const cfgkey_t *k = &keys[i];
        dotted(k, name, sizeof name);
        const char *def = k->shown ? k->shown : k->def ? k->def : k->block ? "-" : "none";
        fprintf(f, "%s\t%s\t%s\t%s\n", name, reload_names[k->reload], def, k->doc);
    }
}

int idem__config_keep_restart_keys(idem_config_t *next, const idem_config_t *running,
                                   char *changed, size_t changedlen)
{
    char name[80];
    size_t used = 0;
    if (changedlen > 0)
        changed[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++) {
        const cfgkey_t *k = &keys[i];
        if (k->reload != IDEM_CONFIG_RESTART || k->field == F_NONE ||
            (k->where & (W_DEFAULTS | W_ROUTE)) || field_equal(next, running, k))
            continue;
        dotted(k, name, sizeof name);
        if (used < changedlen)
            used += (size_t)snprintf(changed + used, changedlen - used, "%s%s",
                                     used ? ", " : "", name);
        if (field_copy(next, running, k) != 0)
            return -1;
    }
    next->max_connections_set = running->max_connections_set;
    return 0;
}

/* A configuration shared by threads: the one a request began with stays
 * until its last holder lets it go. */
typedef struct shared_cfg {
    idem_config_t cfg; /* first: a config's address is its holder's */
    atomic_uint refs;
} shared_cfg_t;

idem_config_t *idem__config_new(void)
{
    shared_cfg_t *s = idem_calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    if (idem__config_defaults(&s->cfg) != 0) {
        idem_free(s);
        return NULL;
    }
    atomic_init(&s->refs, 1);
    return &s->cfg;
}

const idem_config_t *idem__config_ref(const idem_config_t *cfg)
{
    if (cfg != NULL)
        atomic_fetch_add_explicit(&((shared_cfg_t *)(void *)(uintptr_t)cfg)->refs, 1,
                                  memory_order_relaxed);
    return cfg;
}

void idem__config_unref(const idem_config_t *cfg)
{
    if (cfg == NULL)
        return;
    shared_cfg_t *s = (shared_cfg_t *)(void *)(uintptr_t)cfg;
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    idem__config_cleanup(&s->cfg);
    idem_free(s);
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
