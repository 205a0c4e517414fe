/* src/cli/conformance.c - idemctl conformance: does an HTTP API keep the Idempotency-Key contract?
 *
 * The command speaks to any HTTP API (idemd, or a service's own idempotency
 * layer) as a careful client would, and checks each answer against the IETF
 * draft "The Idempotency-Key HTTP Header Field" (-09) and against what the
 * service publishes about itself (SPEC section 18: GET /_idem/policy, the
 * Link: rel="describedby" of its problem responses).  The exchanges, in
 * order, all on the one operation URL (--path) with the one method:
 *
 *   1. GET {origin}/_idem/policy, the published policy if there is one (and
 *      whether the URL answers at all: no answer is exit 2);
 *   2. the request without a key                       -> missing-key;
 *   3. 8 copies of one request with one fresh key, sent at once on a curl
 *      multi handle                                    -> concurrent;
 *   4. the same request once more                      -> replay, replay-marker;
 *   5. the key again with another payload              -> key-reuse;
 *   6. the URL a problem response links to, if no policy came from 1.
 *
 * and then the verdicts that look at everything seen: problem-json, policy,
 * policy-claims, link.  The table `checks` below says which are required
 * (the draft's MUST, and its SHOULDs that make a key worth sending: a
 * repeat must not run again) and which recommended; a required check is
 * never skipped, a recommended one is skipped when the service publishes
 * nothing it could be checked against.  The verdict is one line per check,
 * "PASS name", "FAIL name: what was seen" or "SKIP name: why" (or with
 * --json one JSON document); exit 0 when no check failed, 1 when one did,
 * 2 for a usage error or a URL that does not answer.
 *
 * Bounds: every exchange has --timeout (default 10 s) for the whole of it,
 * an answer's head is kept up to 64 KiB and its body up to 4 MiB (past
 * either it counts as no answer), a policy document up to 1 MiB, at most
 * CONF_FIELDS header fields of an answer are compared, and a replay answered
 * 409 (the first answer not yet stored) is asked again for at most one
 * more --timeout.  So the command ends within about 8 timeouts whatever the
 * server does (the 8 concurrent copies share one).
 *
 * THREADING: one thread; the concurrent requests are one curl multi loop.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/transfer.h"
#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/key.h"

#define CONF_DUPLICATES 8                   /* the concurrent copies of one request */
#define CONF_MAX_HEAD ((size_t)64 * 1024)   /* bytes of an answer's head */
#define CONF_MAX_BODY ((size_t)4 << 20)     /* bytes of an answer's body */
#define CONF_MAX_POLICY ((size_t)1 << 20)   /* bytes of a policy document */
#define CONF_FIELDS 200                     /* header fields of an answer compared */
#define CONF_DETAIL 512                     /* bytes of a verdict's detail */
#define CONF_URL_MAX 2048                   /* bytes of a linked URL kept */
#define CONF_SNIPPET 60                     /* bytes of a body quoted in a detail */

typedef enum check_id {
    C_MISSING_KEY,
    C_CONCURRENT,
    C_REPLAY,
    C_REPLAY_MARKER,
    C_KEY_REUSE,
    C_PROBLEM_JSON,
    C_POLICY,
    C_POLICY_CLAIMS,
    C_LINK,
    C_COUNT,
} check_id_t;

static const struct {
    const char *name;
    bool required;
} checks[C_COUNT] = {
    [C_MISSING_KEY] = {"missing-key", true},
    [C_CONCURRENT] = {"concurrent", true},
    [C_REPLAY] = {"replay", true},
    [C_REPLAY_MARKER] = {"replay-marker", false},
    [C_KEY_REUSE] = {"key-reuse", true},
    [C_PROBLEM_JSON] = {"problem-json", false},
    [C_POLICY] = {"policy", false},
    [C_POLICY_CLAIMS] = {"policy-claims", false},
    [C_LINK] = {"link", false},
};

typedef enum verdict { V_NONE = 0, V_PASS, V_FAIL, V_SKIP } verdict_t;

/* One header field of an answer's head, borrowed from it. */
typedef struct field {
    const char *name, *value;
    size_t name_len, value_len;
} field_t;

typedef struct conf {
    const idem_cli_args_t *a;
    char *target;               /* the operation's URL (curl_free) */
    char *policy_url;           /* {origin}/_idem/policy (curl_free) */
    CURLU *base;                /* the operation's URL, for resolving links */
    struct curl_slist *hdrs;    /* the user's -H, Expect:, a Content-Type */
    char key_header[258];       /* "Idempotency-Key", or the policy's header:NAME */
    char key[IDEM_KEY_MAX + 1]; /* the key of the concurrent, replay and reuse checks */
    verdict_t v[C_COUNT];
    char detail[C_COUNT][CONF_DETAIL];
    /* What the checks saw, for the verdicts over all of them. */
    int missing_status;         /* status of the keyless request; 0: no answer */
    json_t *policy;             /* a JSON policy document, or NULL */
    char policy_from[CONF_URL_MAX]; /* where it came from */
    char docs_url[CONF_URL_MAX];    /* a linked URL that answered 2xx but not JSON */
    char policy_note[CONF_DETAIL];  /* why there is no policy */
    const json_t *route;        /* the policy's route for METHOD path, or NULL */
    bool reached;               /* GET /_idem/policy got an HTTP answer */
    unsigned problems;          /* error answers (4xx) seen */
    unsigned problems_not_json; /* of them, not application/problem+json */
    char problem_bad[CONF_DETAIL];
    unsigned linked;            /* problem responses with a describedby Link */
    unsigned unlinked;
    char unlinked_what[64];     /* the first answer without one */
    char link[CONF_URL_MAX];    /* the first describedby target */
    idem_cli_answer_t first;    /* the first answer of the key */
    bool have_first;
    bool marks;                 /* some answer carried the marker */
} conf_t;

/* ---- small helpers ------------------------------------------------------- */

static void set(conf_t *c, check_id_t id, verdict_t v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void set(conf_t *c, check_id_t id, verdict_t v, const char *fmt, ...)
{
    va_list ap;
    c->v[id] = v;
    va_start(ap, fmt);
    vsnprintf(c->detail[id], sizeof c->detail[id], fmt, ap);
    va_end(ap);
    /* The server's bytes may be in it: one line of visible characters. */
    for (char *p = c->detail[id]; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
}

/* A body as a short quote: the first CONF_SNIPPET bytes, "..." after. */
static void snippet(const idem_buf_t *b, char *out, size_t cap)
{
    size_t n = b->len < CONF_SNIPPET ? b->len : CONF_SNIPPET;
    snprintf(out, cap, "%.*s%s", (int)n, b->data ? b->data : "", b->len > n ? "..." : "");
}

static void answer_init(idem_cli_answer_t *a)
{
    idem__cli_answer_init(a);
    idem__buf_init(&a->head, CONF_MAX_HEAD);
    idem__buf_init(&a->body, CONF_MAX_BODY);
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The header fields of a head (after its status line), at most cap. */
static size_t fields_of(const idem_buf_t *head, field_t *out, size_t cap)
{
    const char *p = head->data, *end = head->data + head->len;
    size_t n = 0;
    if (p == NULL)
        return 0;
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    p = nl ? nl + 1 : end;
    while (p < end && n < cap) {
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *colon = memchr(p, ':', (size_t)(le - p));
        if (colon != NULL && colon > p) {
            const char *vb = colon + 1, *ve = le;
            while (vb < ve && is_ws(*vb))
                vb++;
            while (ve > vb && is_ws(ve[-1]))
                ve--;
            out[n++] = (field_t){.name = p, .name_len = (size_t)(colon - p), .value = vb,
                                 .value_len = (size_t)(ve - vb)};
        }
        p = nl ? nl + 1 : end;
    }
    return n;
}

static bool name_eq(const field_t *f, const char *name)
{
    return f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0;
}

/* The value of the first field called name, or NULL. */
static const field_t *field_get(const field_t *fs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (name_eq(&fs[i], name))
            return &fs[i];
    return NULL;
}

static bool value_is_true(const field_t *f)
{
    return f != NULL && f->value_len == 4 && strncasecmp(f->value, "true", 4) == 0;
}

static bool media_type_is(const idem_cli_answer_t *ans, const char *mt)
{
    if (!ans->has_ctype)
        return false;
    const char *v = ans->head.data + ans->ctype_off;
    size_t m = 0;
    while (m < ans->ctype_len && v[m] != ';')
        m++;
    while (m > 0 && is_ws(v[m - 1]))
        m--;
    return m == strlen(mt) && strncasecmp(v, mt, m) == 0;
}

/* application/json or any application/...+json. */
static bool is_json_type(const idem_cli_answer_t *ans)
{
    if (media_type_is(ans, "application/json"))
        return true;
    if (!ans->has_ctype)
        return false;
    const char *v = ans->head.data + ans->ctype_off;
    size_t m = 0;
    while (m < ans->ctype_len && v[m] != ';' && !is_ws(v[m]))
        m++;
    return m > 17 && strncasecmp(v, "application/", 12) == 0 &&
           strncasecmp(v + m - 5, "+json", 5) == 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* ---- what is sent -------------------------------------------------------- */

static idem_cli_send_t base_send(const conf_t *c, const char *method, const char *url,
                                 struct curl_slist *hdrs, const char *body)
{
    idem_cli_send_t s = {
        .method = method,
        .url = url,
        .headers = hdrs,
        .body = body,
        .body_len = body ? strlen(body) : 0,
        .has_body = body != NULL,
        .user_agent = IDEM_CLI_USER_AGENT,
        .timeout_ms = c->a->max_time_ms,
    };
    return s;
}

/* The request's headers plus "key_header: key" (no key when key is NULL). */
static struct curl_slist *with_key(const conf_t *c, const char *key)
{
    struct curl_slist *l = NULL;
    for (const struct curl_slist *p = c->hdrs; p; p = p->next)
        if (!idem__cli_header_add(&l, p->data))
            return NULL;
    if (key != NULL) {
        char line[sizeof c->key_header + 2 + IDEM_KEY_MAX + 1];
        snprintf(line, sizeof line, "%s: %s", c->key_header, key);
        if (!idem__cli_header_add(&l, line))
            return NULL;
    }
    return l;
}

/* One exchange; false when memory ran out (ans then holds no answer). */
static bool exchange(const idem_cli_send_t *s, idem_cli_answer_t *ans)
{
    CURL *h = curl_easy_init();
    if (h == NULL)
        return false;
    idem__cli_exchange(h, s, ans);
    curl_easy_cleanup(h);
    return true;
}

static bool answered(const idem_cli_answer_t *ans)
{
    return ans->transport == IDEM_TRANSPORT_OK && !ans->too_big;
}

static void describe(const idem_cli_answer_t *ans, char *out, size_t cap)
{
    if (ans->too_big)
        snprintf(out, cap, "an answer larger than %zu KiB", CONF_MAX_BODY / 1024);
    else
        idem__cli_answer_describe(ans, out, cap);
}

/* ---- what the error answers say (problem-json, link) ------------------- */

/* Whether one Link field value holds a link with rel describedby; its
 * target into out.  RFC 8288: link-value *( "," link-value ), each
 * "<" URI-Reference ">" *( ";" param ), rel a space-separated list. */
static bool link_describedby(const char *v, size_t n, char *out, size_t cap)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (is_ws(v[i]) || v[i] == ','))
            i++;
        if (i >= n || v[i] != '<')
            return false;
        size_t ub = ++i;
        while (i < n && v[i] != '>')
            i++;
        if (i >= n)
            return false;
        size_t ue = i++;
        bool found = false;
        /* The parameters, up to the next comma outside quotes. */
        while (i < n && v[i] != ',') {
            while (i < n && (is_ws(v[i]) || v[i] == ';'))
                i++;
            size_t nb = i;
            while (i < n && v[i] != '=' && v[i] != ';' && v[i] != ',' && !is_ws(v[i]))
                i++;
            size_t ne = i;
            while (i < n && is_ws(v[i]))
                i++;
            const char *val = "";
            size_t vl = 0;
            if (i < n && v[i] == '=') {
                i++;
                while (i < n && is_ws(v[i]))
                    i++;
                if (i < n && v[i] == '"') {
                    val = v + ++i;
                    while (i < n && v[i] != '"')
                        i += (v[i] == '\\' && i + 1 < n) ? 2 : 1;
                    vl = (size_t)(v + i - val);
                    if (i < n)
                        i++;
                } else {
                    val = v + i;
                    while (i < n && v[i] != ';' && v[i] != ',' && !is_ws(v[i]))
                        i++;
                    vl = (size_t)(v + i - val);
                }
            }
            if (ne - nb == 3 && strncasecmp(v + nb, "rel", 3) == 0) {
                for (size_t k = 0; k < vl;) {
                    while (k < vl && is_ws(val[k]))
                        k++;
                    size_t b = k;
                    while (k < vl && !is_ws(val[k]))
                        k++;
                    if (k - b == 11 && strncasecmp(val + b, "describedby", 11) == 0)
                        found = true;
                }
            }
            if (ne == nb && (i >= n || v[i] != ';'))
                break; /* nothing we can read: stop at the next comma */
        }
        if (found) {
            snprintf(out, cap, "%.*s", (int)(ue - ub), v + ub);
            return true;
        }
    }
    return false;
}

/* Note an error answer (4xx) of the checks: is it a problem+json, does it link. */
static void saw_error(conf_t *c, const idem_cli_answer_t *ans, const char *what)
{
    if (!answered(ans) || ans->status < 400 || ans->status > 499)
        return;
    c->problems++;
    bool ok = media_type_is(ans, "application/problem+json");
    char why[160] = "";
    if (!ok) {
        snprintf(why, sizeof why, "Content-Type %.*s", (int)(ans->has_ctype ? ans->ctype_len : 6),
                 ans->has_ctype ? ans->head.data + ans->ctype_off : "absent");
    } else {
        json_error_t jerr;
        json_t *doc = json_loadb(ans->body.data ? ans->body.data : "", ans->body.len, 0, &jerr);
        json_t *st = json_object_get(doc, "status");
        if (!json_is_object(doc)) {
            ok = false;
            snprintf(why, sizeof why, "a body that is not a JSON object");
        } else if (st != NULL && (!json_is_integer(st) || json_integer_value(st) != ans->status)) {
            ok = false;
            snprintf(why, sizeof why, "\"status\" is not %d", ans->status);
        }
        json_decref(doc);
    }
    if (!ok && c->problems_not_json++ == 0)
        snprintf(c->problem_bad, sizeof c->problem_bad, "the %d of %s: %s", ans->status, what, why);

    field_t fs[CONF_FIELDS];
    size_t n = fields_of(&ans->head, fs, CONF_FIELDS);
    char url[CONF_URL_MAX];
    bool linked = false;
    for (size_t i = 0; i < n && !linked; i++)
        if (name_eq(&fs[i], "Link") && link_describedby(fs[i].value, fs[i].value_len, url, sizeof url))
            linked = true;
    if (linked) {
        if (c->linked++ == 0)
            memcpy(c->link, url, strlen(url) + 1);
    } else if (c->unlinked++ == 0) {
        snprintf(c->unlinked_what, sizeof c->unlinked_what, "the %d of %s", ans->status, what);
    }
}

/* ---- the policy ---------------------------------------------------------- */

/* Resolve a (maybe relative) URL against the operation's.  curl_free. */
static char *resolve(conf_t *c, const char *ref)
{
    CURLU *u = curl_url_dup(c->base);
    char *out = NULL;
    if (u != NULL && curl_url_set(u, CURLUPART_URL, ref, 0) == CURLUE_OK)
        curl_url_get(u, CURLUPART_URL, &out, 0);
    curl_url_cleanup(u);
    return out;
}

/* GET url; a JSON answer becomes the policy, another 2xx the docs. */
static bool fetch_policy(conf_t *c, const char *url, bool from_link)
{
    idem_cli_answer_t ans;
    answer_init(&ans);
    idem__buf_init(&ans.body, CONF_MAX_POLICY);
    idem_cli_send_t s = base_send(c, "GET", url, NULL, NULL);
    bool ok = exchange(&s, &ans);
    if (!ok) {
        idem__cli_answer_cleanup(&ans);
        return false;
    }
    char desc[320];
    describe(&ans, desc, sizeof desc);
    if (!from_link)
        c->reached = ans.transport == IDEM_TRANSPORT_OK;
    if (!answered(&ans)) {
        snprintf(c->policy_note, sizeof c->policy_note, "%s", desc);
    } else if (ans.status == 200 && is_json_type(&ans)) {
        json_error_t jerr;
        c->policy = json_loadb(ans.body.data ? ans.body.data : "", ans.body.len, 0, &jerr);
        snprintf(c->policy_from, sizeof c->policy_from, "%s", url);
        if (c->policy == NULL)
            c->policy = json_string("not JSON"); /* the shape check says so */
    } else if (from_link && ans.status >= 200 && ans.status <= 299) {
        snprintf(c->docs_url, sizeof c->docs_url, "%s", url);
    } else {
        snprintf(c->policy_note, sizeof c->policy_note, "GET %.200s answered %.120s%s", url, desc,
                 ans.status == 200 ? " (not JSON)" : "");
    }
    idem__cli_answer_cleanup(&ans);
    return true;
}

static bool str_in(const char *s, const char *const *set)
{
    for (; *set; set++)
        if (strcmp(s, *set) == 0)
            return true;
    return false;
}

/* Whether the document has SPEC section 18's shape; why not into why. */
static bool policy_shape(const json_t *doc, char *why, size_t cap)
{
    static const char *const modes[] = {"required", "optional", "token", "off", NULL};
    static const char *const conflicts[] = {"reject", "wait", NULL};
    static const char *const fps[] = {"raw", "json", NULL};
    static const char *const counts[] = {"key_ttl", "failure_ttl", "lease", "max_response_bytes",
                                         NULL};
    const json_t *routes = json_object_get(doc, "routes");
    if (!json_is_object(doc)) {
        snprintf(why, cap, "not a JSON object");
        return false;
    }
    if (!json_is_array(routes)) {
        snprintf(why, cap, "no \"routes\" array");
        return false;
    }
    size_t i;
    const json_t *r;
    json_array_foreach(routes, i, r) {
        const json_t *ms = json_object_get(r, "methods"), *m;
        const char *path = json_string_value(json_object_get(r, "path"));
        const char *mode = json_string_value(json_object_get(r, "mode"));
        size_t k;
        if (!json_is_object(r)) {
            snprintf(why, cap, "routes[%zu] is not an object", i);
            return false;
        }
        if (!json_is_array(ms) || json_array_size(ms) == 0) {
            snprintf(why, cap, "routes[%zu].methods is not a list of methods", i);
            return false;
        }
        json_array_foreach(ms, k, m) {
            const char *s = json_string_value(m);
            if (s == NULL || !idem__cli_is_token(s, strlen(s))) {
                snprintf(why, cap, "routes[%zu].methods[%zu] is not a method", i, k);
                return false;
            }
        }
        if (path == NULL || path[0] != '/') {
            snprintf(why, cap, "routes[%zu].path is not a path", i);
            return false;
        }
        if (mode == NULL || !str_in(mode, modes)) {
            snprintf(why, cap, "routes[%zu].mode is not required, optional, token or off", i);
            return false;
        }
        for (const char *const *f = counts; *f; f++) {
            const json_t *v = json_object_get(r, *f);
            if (v != NULL && (!json_is_integer(v) || json_integer_value(v) < 0)) {
                snprintf(why, cap, "routes[%zu].%s is not a whole number >= 0", i, *f);
                return false;
            }
        }
        /* The draft: the published policy MUST include the keys' expiry. */
        if (strcmp(mode, "off") != 0 && json_object_get(r, "key_ttl") == NULL) {
            snprintf(why, cap, "routes[%zu] (mode %s) says nothing of key_ttl, how long keys "
                     "are kept", i, mode);
            return false;
        }
        const json_t *v = json_object_get(r, "on_conflict");
        if (v != NULL && (!json_is_string(v) || !str_in(json_string_value(v), conflicts))) {
            snprintf(why, cap, "routes[%zu].on_conflict is not reject or wait", i);
            return false;
        }
        v = json_object_get(r, "fingerprint_body");
        if (v != NULL && (!json_is_string(v) || !str_in(json_string_value(v), fps))) {
            snprintf(why, cap, "routes[%zu].fingerprint_body is not raw or json", i);
            return false;
        }
        v = json_object_get(r, "key_from");
        if (v != NULL && !json_is_string(v)) {
            snprintf(why, cap, "routes[%zu].key_from is not a string", i);
            return false;
        }
        v = json_object_get(r, "release_statuses");
        if (v != NULL) {
            const json_t *st;
            if (!json_is_array(v)) {
                snprintf(why, cap, "routes[%zu].release_statuses is not a list", i);
                return false;
            }
            json_array_foreach(v, k, st) {
                if (!json_is_integer(st) || json_integer_value(st) < 100 ||
                    json_integer_value(st) > 599) {
                    snprintf(why, cap, "routes[%zu].release_statuses[%zu] is not a status", i, k);
                    return false;
                }
            }
        }
        const char *lists[] = {"replay_marker", "replay_drop_headers"};
        for (size_t l = 0; l < 2; l++) {
            v = json_object_get(r, lists[l]);
            const json_t *s;
            if (v == NULL)
                continue;
            if (!json_is_array(v)) {
                snprintf(why, cap, "routes[%zu].%s is not a list of header names", i, lists[l]);
                return false;
            }
            json_array_foreach(v, k, s) {
                const char *hn = json_string_value(s);
                if (hn == NULL || !idem__cli_is_token(hn, strlen(hn))) {
                    snprintf(why, cap, "routes[%zu].%s[%zu] is not a header name", i, lists[l], k);
                    return false;
                }
            }
        }
    }
    return true;
}

/* The request path of the target (up to '?'), into out. */
static void target_path(const conf_t *c, char *out, size_t cap)
{
    char *p = NULL;
    out[0] = '\0';
    if (curl_url_get(c->base, CURLUPART_PATH, &p, 0) == CURLUE_OK)
        snprintf(out, cap, "%s", p);
    curl_free(p);
}

/* The first route of the policy for METHOD path (routes match in order,
 * the method exactly, the path as a prefix); NULL when none matches. */
static const json_t *policy_route(const conf_t *c)
{
    char path[CONF_URL_MAX];
    const json_t *routes = json_object_get(c->policy, "routes"), *r;
    size_t i;
    target_path(c, path, sizeof path);
    json_array_foreach(routes, i, r) {
        const json_t *ms = json_object_get(r, "methods"), *m;
        const char *rp = json_string_value(json_object_get(r, "path"));
        size_t k;
        bool method = false;
        json_array_foreach(ms, k, m) {
            const char *s = json_string_value(m);
            if (s != NULL && strcmp(s, c->a->method) == 0)
                method = true;
        }
        if (method && rp != NULL && strncmp(path, rp, strlen(rp)) == 0)
            return r;
    }
    return NULL;
}

static const char *route_mode(const conf_t *c)
{
    if (c->route == NULL)
        return "off";
    const char *m = json_string_value(json_object_get(c->route, "mode"));
    return m ? m : "off";
}

/* Whether name is in the route's list (case-insensitive). */
static bool route_lists(const conf_t *c, const char *list, const char *name, size_t n)
{
    const json_t *v = json_object_get(c->route, list), *s;
    size_t k;
    json_array_foreach(v, k, s) {
        const char *hn = json_string_value(s);
        if (hn != NULL && strlen(hn) == n && strncasecmp(hn, name, n) == 0)
            return true;
    }
    return false;
}

/* ---- the checks ----------------------------------------------------------- */

static void check_missing_key(conf_t *c)
{
    idem_cli_answer_t ans;
    char desc[320];
    answer_init(&ans);
    idem_cli_send_t s = base_send(c, c->a->method, c->target, c->hdrs, c->a->body);
    if (!exchange(&s, &ans)) {
        set(c, C_MISSING_KEY, V_FAIL, "out of memory");
        goto out;
    }
    describe(&ans, desc, sizeof desc);
    c->missing_status = answered(&ans) ? ans.status : 0;
    saw_error(c, &ans, "the request without a key");
    bool optional = c->policy != NULL && strcmp(route_mode(c), "optional") == 0;
    if (optional)
        set(c, C_MISSING_KEY, V_SKIP, "the policy says a key is optional on %s %s", c->a->method,
            c->target);
    else if (!answered(&ans))
        set(c, C_MISSING_KEY, V_FAIL, "no answer: %s", desc);
    else if (ans.status == 400)
        set(c, C_MISSING_KEY, V_PASS, "400");
    else if (ans.status >= 200 && ans.status <= 299)
        set(c, C_MISSING_KEY, V_FAIL, "%s: the request ran without a key; expected 400", desc);
    else
        set(c, C_MISSING_KEY, V_FAIL, "%s; expected 400", desc);
    /* No policy at the well-known place: perhaps the problem links to one. */
    if (c->policy == NULL && c->docs_url[0] == '\0' && c->linked > 0) {
        char *u = resolve(c, c->link);
        if (u != NULL)
            fetch_policy(c, u, true);
        curl_free(u);
        if (c->policy != NULL)
            c->route = policy_route(c);
    }
out:
    idem__cli_answer_cleanup(&ans);
}

/* Two answers are one answer: the same status and body. */
static bool same_answer(const idem_cli_answer_t *x, const idem_cli_answer_t *y)
{
    return x->status == y->status && x->body.len == y->body.len &&
           (x->body.len == 0 || memcmp(x->body.data, y->body.data, x->body.len) == 0);
}

static bool has_marker(const conf_t *c, const idem_cli_answer_t *ans)
{
    field_t fs[CONF_FIELDS];
    size_t n = fields_of(&ans->head, fs, CONF_FIELDS);
    return value_is_true(field_get(fs, n, c->a->marker));
}

static void check_concurrent(conf_t *c)
{
    CURLM *m = curl_multi_init();
    CURL *hs[CONF_DUPLICATES] = {0};
    idem_cli_answer_t ans[CONF_DUPLICATES];
    bool done[CONF_DUPLICATES] = {0};
    struct curl_slist *hdrs = with_key(c, c->key);
    size_t i;

    for (i = 0; i < CONF_DUPLICATES; i++)
        answer_init(&ans[i]);
    if (m == NULL || hdrs == NULL) {
        set(c, C_CONCURRENT, V_FAIL, "out of memory");
        goto out;
    }
    idem_cli_send_t s = base_send(c, c->a->method, c->target, hdrs, c->a->body);
    for (i = 0; i < CONF_DUPLICATES; i++) {
        if ((hs[i] = curl_easy_init()) == NULL) {
            set(c, C_CONCURRENT, V_FAIL, "out of memory");
            goto out;
        }
        idem__cli_exchange_prepare(hs[i], &s, &ans[i]);
    }
    /* All added before the first perform: every connection starts at once. */
    for (i = 0; i < CONF_DUPLICATES; i++)
        curl_multi_add_handle(m, hs[i]);
    int running = CONF_DUPLICATES;
    while (running > 0) {
        if (curl_multi_perform(m, &running) != CURLM_OK)
            break;
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            for (i = 0; i < CONF_DUPLICATES; i++)
                if (hs[i] == msg->easy_handle && !done[i]) {
                    idem__cli_exchange_finish(hs[i], msg->data.result, &ans[i]);
                    done[i] = true;
                }
        }
        if (running > 0 && curl_multi_poll(m, NULL, 0, 1000, NULL) != CURLM_OK)
            break;
    }
    for (i = 0; i < CONF_DUPLICATES; i++)
        if (!done[i])
            idem__cli_exchange_finish(hs[i], CURLE_OPERATION_TIMEDOUT, &ans[i]);

    /* The verdict: every copy answered; the answers other than 409 are all
     * one answer (a second execution gives a second answer); when the
     * server marks replays, exactly one of them is unmarked. */
    size_t other = 0, unmarked = 0, conflicts = 0;
    const idem_cli_answer_t *first = NULL, *diff = NULL;
    char desc[320], q1[CONF_SNIPPET + 8], q2[CONF_SNIPPET + 8];
    for (i = 0; i < CONF_DUPLICATES; i++) {
        if (!answered(&ans[i])) {
            describe(&ans[i], desc, sizeof desc);
            set(c, C_CONCURRENT, V_FAIL, "copy %zu of %d: no answer: %s", i + 1, CONF_DUPLICATES,
                desc);
            goto out;
        }
        saw_error(c, &ans[i], "a concurrent copy");
        if (ans[i].status == 409) {
            conflicts++;
            continue;
        }
        other++;
        bool marked = has_marker(c, &ans[i]);
        c->marks = c->marks || marked;
        /* The first answer: the unmarked one, else any. */
        if (first == NULL || (!marked && has_marker(c, first)))
            first = &ans[i];
        if (!marked)
            unmarked++;
    }
    for (i = 0; i < CONF_DUPLICATES && first != NULL; i++)
        if (ans[i].status != 409 && !same_answer(first, &ans[i]) && diff == NULL)
            diff = &ans[i];
    if (first == NULL) {
        set(c, C_CONCURRENT, V_FAIL, "all %d copies got 409: none was answered", CONF_DUPLICATES);
    } else if (diff != NULL) {
        snippet(&first->body, q1, sizeof q1);
        snippet(&diff->body, q2, sizeof q2);
        set(c, C_CONCURRENT, V_FAIL, "two different answers to one key: %d '%s' and %d '%s' "
            "(ran more than once?)", first->status, q1, diff->status, q2);
    } else if (c->marks && unmarked != 1) {
        set(c, C_CONCURRENT, V_FAIL, "%zu answers without %s: true, as if each ran", unmarked,
            c->a->marker);
    } else {
        set(c, C_CONCURRENT, V_PASS, "%zu of %d answered %d, %zu got 409", other,
            CONF_DUPLICATES, first->status, conflicts);
    }
    if (first != NULL) {
        /* Keep the first answer for the replay check. */
        idem_cli_answer_t *f = &c->first;
        if (idem__buf_append(&f->head, first->head.data, first->head.len) == 0 &&
            idem__buf_append(&f->body, first->body.data, first->body.len) == 0) {
            f->status = first->status;
            f->transport = first->transport;
            c->have_first = true;
        }
    }
out:
    for (i = 0; i < CONF_DUPLICATES; i++) {
        if (hs[i] != NULL) {
            curl_multi_remove_handle(m, hs[i]);
            curl_easy_cleanup(hs[i]);
        }
        idem__cli_answer_cleanup(&ans[i]);
    }
    curl_multi_cleanup(m);
    curl_slist_free_all(hdrs);
}

/* Header fields a replay need not repeat: the date, hop-by-hop fields, the
 * framing (the body is compared), the marker (--marker, idem's and
 * Stripe's), and what the service says it drops from replays (Set-Cookie
 * by default, SPEC section 15). */
static bool ignored_field(const conf_t *c, const field_t *f)
{
    static const char *const names[] = {"Date", "Connection", "Keep-Alive", "Transfer-Encoding",
                                        "TE", "Trailer", "Upgrade", "Content-Length",
                                        "Set-Cookie", "X-Idempotent-Replay",
                                        "Idempotent-Replayed", NULL};
    for (const char *const *n = names; *n; n++)
        if (name_eq(f, *n))
            return true;
    if (f->name_len >= 6 && strncasecmp(f->name, "Proxy-", 6) == 0)
        return true;
    if (name_eq(f, c->a->marker))
        return true;
    return c->route != NULL && (route_lists(c, "replay_marker", f->name, f->name_len) ||
                                route_lists(c, "replay_drop_headers", f->name, f->name_len));
}

/* The first field of x that y lacks (as a multiset), or NULL. */
static const field_t *missing_field(const conf_t *c, const field_t *x, size_t nx,
                                    const field_t *y, size_t ny)
{
    bool used[CONF_FIELDS] = {0};
    for (size_t i = 0; i < nx; i++) {
        if (ignored_field(c, &x[i]))
            continue;
        bool found = false;
        for (size_t k = 0; k < ny && !found; k++) {
            if (used[k] || x[i].name_len != y[k].name_len || x[i].value_len != y[k].value_len ||
                strncasecmp(x[i].name, y[k].name, x[i].name_len) != 0 ||
                memcmp(x[i].value, y[k].value, x[i].value_len) != 0)
                continue;
            used[k] = found = true;
        }
        if (!found)
            return &x[i];
    }
    return NULL;
}

static void check_replay(conf_t *c)
{
    idem_cli_answer_t ans;
    struct curl_slist *hdrs = with_key(c, c->key);
    char desc[320], q1[CONF_SNIPPET + 8], q2[CONF_SNIPPET + 8];

    answer_init(&ans);
    if (!c->have_first) {
        set(c, C_REPLAY, V_FAIL, "no first answer to compare with (see concurrent)");
        set(c, C_REPLAY_MARKER, V_FAIL, "no first answer to compare with (see concurrent)");
        goto out;
    }
    if (hdrs == NULL) {
        set(c, C_REPLAY, V_FAIL, "out of memory");
        set(c, C_REPLAY_MARKER, V_FAIL, "out of memory");
        goto out;
    }
    idem_cli_send_t s = base_send(c, c->a->method, c->target, hdrs, c->a->body);
    /* The first answer may reach the client before it is stored: a 409 in
     * between is asked again, 0.1 s later and doubling up to 1 s, for at
     * most --timeout in all. */
    uint64_t t0 = idem_clock_mono_ns();
    for (long wait = 100;; wait = wait < 500 ? wait * 2 : 1000) {
        if (!exchange(&s, &ans)) {
            set(c, C_REPLAY, V_FAIL, "out of memory");
            set(c, C_REPLAY_MARKER, V_FAIL, "out of memory");
            goto out;
        }
        if (!answered(&ans) || ans.status != 409 || c->first.status == 409)
            break;
        int64_t left = c->a->max_time_ms - (int64_t)((idem_clock_mono_ns() - t0) / 1000000u);
        if (left <= wait)
            break;
        saw_error(c, &ans, "the replay");
        sleep_ms(wait);
    }
    describe(&ans, desc, sizeof desc);
    if (!answered(&ans)) {
        set(c, C_REPLAY, V_FAIL, "no answer: %s", desc);
        set(c, C_REPLAY_MARKER, V_FAIL, "no answer to the replay: %s", desc);
        goto out;
    }
    saw_error(c, &ans, "the replay");

    field_t f1[CONF_FIELDS], f2[CONF_FIELDS];
    size_t n1 = fields_of(&c->first.head, f1, CONF_FIELDS);
    size_t n2 = fields_of(&ans.head, f2, CONF_FIELDS);
    const field_t *lost = missing_field(c, f1, n1, f2, n2);
    const field_t *added = missing_field(c, f2, n2, f1, n1);
    if (ans.status != c->first.status) {
        set(c, C_REPLAY, V_FAIL, "status %s, the first answer's %d", desc, c->first.status);
    } else if (!same_answer(&c->first, &ans)) {
        snippet(&c->first.body, q1, sizeof q1);
        snippet(&ans.body, q2, sizeof q2);
        set(c, C_REPLAY, V_FAIL, "another body: '%s', the first answer's '%s'", q2, q1);
    } else if (lost != NULL) {
        set(c, C_REPLAY, V_FAIL, "the first answer's '%.*s: %.*s' is not repeated",
            (int)(lost->name_len < 80 ? lost->name_len : 80), lost->name,
            (int)(lost->value_len < 120 ? lost->value_len : 120), lost->value);
    } else if (added != NULL) {
        set(c, C_REPLAY, V_FAIL, "'%.*s: %.*s' that the first answer did not have",
            (int)(added->name_len < 80 ? added->name_len : 80), added->name,
            (int)(added->value_len < 120 ? added->value_len : 120), added->value);
    } else {
        set(c, C_REPLAY, V_PASS, "%d, %zu bytes, the same header fields", ans.status,
            ans.body.len);
    }

    const field_t *mk = field_get(f2, n2, c->a->marker);
    const field_t *mk1 = field_get(f1, n1, c->a->marker);
    if (value_is_true(mk1))
        set(c, C_REPLAY_MARKER, V_FAIL, "the first answer carries %s: true as well", c->a->marker);
    else if (value_is_true(mk))
        set(c, C_REPLAY_MARKER, V_PASS, "%s: true", c->a->marker);
    else if (mk != NULL)
        set(c, C_REPLAY_MARKER, V_FAIL, "%s: %.*s, not true", c->a->marker,
            (int)(mk->value_len < 80 ? mk->value_len : 80), mk->value);
    else
        set(c, C_REPLAY_MARKER, V_FAIL, "the replay has no %s header", c->a->marker);
    c->marks = c->marks || value_is_true(mk);

    /* What the policy says of replays: each marker set, each dropped header absent. */
    if (c->route != NULL) {
        const json_t *v = json_object_get(c->route, "replay_marker"), *sv;
        size_t k;
        json_array_foreach(v, k, sv) {
            const char *hn = json_string_value(sv);
            if (hn != NULL && !value_is_true(field_get(f2, n2, hn)) &&
                c->v[C_POLICY_CLAIMS] == V_NONE)
                set(c, C_POLICY_CLAIMS, V_FAIL, "the policy's replay_marker %s is not on the "
                    "replay", hn);
        }
        v = json_object_get(c->route, "replay_drop_headers");
        json_array_foreach(v, k, sv) {
            const char *hn = json_string_value(sv);
            if (hn != NULL && field_get(f2, n2, hn) != NULL && c->v[C_POLICY_CLAIMS] == V_NONE)
                set(c, C_POLICY_CLAIMS, V_FAIL, "the replay carries %s, which the policy's "
                    "replay_drop_headers drops", hn);
        }
    }
out:
    curl_slist_free_all(hdrs);
    idem__cli_answer_cleanup(&ans);
}

/* Another payload than body: a JSON object gets one more member, anything
 * else a few more bytes. */
static char *other_body(const char *body)
{
    json_error_t jerr;
    json_t *doc = json_loads(body, 0, &jerr);
    char *out = NULL;
    if (json_is_object(doc) &&
        json_object_set_new(doc, "idemctl_conformance", json_string("another payload")) == 0) {
        char *s = json_dumps(doc, JSON_COMPACT);
        if (s != NULL) {
            out = idem_malloc(strlen(s) + 1);
            if (out != NULL)
                memcpy(out, s, strlen(s) + 1);
            free(s);
        }
    } else {
        size_t n = strlen(body);
        out = idem_malloc(n + sizeof "-another");
        if (out != NULL) {
            memcpy(out, body, n);
            memcpy(out + n, "-another", sizeof "-another");
        }
    }
    json_decref(doc);
    return out;
}

static void check_key_reuse(conf_t *c)
{
    idem_cli_answer_t ans;
    struct curl_slist *hdrs = with_key(c, c->key);
    char *body = other_body(c->a->body);
    char desc[320];

    answer_init(&ans);
    if (hdrs == NULL || body == NULL) {
        set(c, C_KEY_REUSE, V_FAIL, "out of memory");
        goto out;
    }
    idem_cli_send_t s = base_send(c, c->a->method, c->target, hdrs, body);
    if (!exchange(&s, &ans)) {
        set(c, C_KEY_REUSE, V_FAIL, "out of memory");
        goto out;
    }
    describe(&ans, desc, sizeof desc);
    saw_error(c, &ans, "the reused key");
    if (!answered(&ans))
        set(c, C_KEY_REUSE, V_FAIL, "no answer: %s", desc);
    else if (ans.status == 422)
        set(c, C_KEY_REUSE, V_PASS, "422");
    else if (c->have_first && same_answer(&c->first, &ans))
        set(c, C_KEY_REUSE, V_FAIL, "%s, the first answer replayed to another payload; expected "
            "422", desc);
    else if (ans.status >= 200 && ans.status <= 299)
        set(c, C_KEY_REUSE, V_FAIL, "%s: another payload ran under a used key; expected 422",
            desc);
    else
        set(c, C_KEY_REUSE, V_FAIL, "%s; expected 422", desc);
out:
    idem_free(body);
    curl_slist_free_all(hdrs);
    idem__cli_answer_cleanup(&ans);
}

/* The verdicts over everything seen. */
static void check_published(conf_t *c)
{
    char why[CONF_DETAIL];

    if (c->problems == 0)
        set(c, C_PROBLEM_JSON, V_SKIP, "no 4xx answer was seen");
    else if (c->problems_not_json > 0)
        set(c, C_PROBLEM_JSON, V_FAIL, "%s (%u of %u error answers)", c->problem_bad,
            c->problems_not_json, c->problems);
    else
        set(c, C_PROBLEM_JSON, V_PASS, "%u error answers, all application/problem+json",
            c->problems);

    bool shaped = false;
    if (c->policy != NULL) {
        shaped = policy_shape(c->policy, why, sizeof why);
        if (shaped)
            set(c, C_POLICY, V_PASS, "%s", c->policy_from);
        else
            set(c, C_POLICY, V_FAIL, "%s: %s", c->policy_from, why);
    } else if (c->docs_url[0] != '\0') {
        set(c, C_POLICY, V_PASS, "documented at %s (not JSON: its claims are not checked)",
            c->docs_url);
    } else {
        set(c, C_POLICY, V_SKIP, "not published: %s, and no problem response links to a policy",
            c->policy_note);
    }

    if (!shaped) {
        if (c->v[C_POLICY_CLAIMS] == V_NONE)
            set(c, C_POLICY_CLAIMS, V_SKIP, "no JSON policy to check");
    } else if (c->v[C_POLICY_CLAIMS] == V_NONE) {
        const char *mode = route_mode(c);
        bool required = strcmp(mode, "required") == 0;
        if (c->route == NULL)
            set(c, C_POLICY_CLAIMS, V_FAIL, "no route of the policy covers %s %s, which is "
                "keyed", c->a->method, c->target);
        else if (c->missing_status == 0)
            set(c, C_POLICY_CLAIMS, V_FAIL, "the request without a key got no answer");
        else if (required && c->missing_status != 400)
            set(c, C_POLICY_CLAIMS, V_FAIL, "the policy says mode required, but the request "
                "without a key got %d", c->missing_status);
        else if (!required && c->missing_status == 400)
            set(c, C_POLICY_CLAIMS, V_FAIL, "the policy says mode %s, but the request without a "
                "key got 400", mode);
        else
            set(c, C_POLICY_CLAIMS, V_PASS, "mode %s, key_ttl %lld s", mode,
                (long long)json_integer_value(json_object_get(c->route, "key_ttl")));
    }

    /* The link: every problem response, once a policy is published. */
    bool published = c->policy != NULL || c->docs_url[0] != '\0';
    if (c->problems == 0) {
        set(c, C_LINK, V_SKIP, "no problem response was seen");
    } else if (c->linked == 0 && !published) {
        set(c, C_LINK, V_SKIP, "no policy is published and no problem response links to one");
    } else if (c->unlinked > 0) {
        set(c, C_LINK, V_FAIL, "%s has no Link: <...>; rel=\"describedby\" (%u of %u)",
            c->unlinked_what, c->unlinked, c->linked + c->unlinked);
    } else {
        char *u = resolve(c, c->link);
        idem_cli_answer_t ans;
        answer_init(&ans);
        idem_cli_send_t s = base_send(c, "GET", u ? u : "", NULL, NULL);
        char desc[320];
        if (u == NULL) {
            set(c, C_LINK, V_FAIL, "the link <%.200s> is not a URL", c->link);
        } else if (!exchange(&s, &ans)) {
            set(c, C_LINK, V_FAIL, "out of memory");
        } else if (!answered(&ans) || ans.status < 200 || ans.status > 299) {
            describe(&ans, desc, sizeof desc);
            set(c, C_LINK, V_FAIL, "the link <%.200s> answers %s", u, desc);
        } else {
            set(c, C_LINK, V_PASS, "%u problem responses link to %.200s", c->linked, u);
        }
        idem__cli_answer_cleanup(&ans);
        curl_free(u);
    }
}

/* ---- the report ------------------------------------------------------------ */

static int report(const conf_t *c)
{
    bool failed = false;
    idem_buf_t out;
    int rc = 0;

    idem__buf_init(&out, 0);
    for (size_t i = 0; i < C_COUNT; i++)
        failed = failed || c->v[i] == V_FAIL;
    if (c->a->json) {
        json_t *doc = json_object(), *list = json_array();
        static const char *const words[] = {"none", "pass", "fail", "skip"};
        json_object_set_new(doc, "url", json_string(c->target));
        json_object_set_new(doc, "method", json_string(c->a->method));
        for (size_t i = 0; i < C_COUNT; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "name", json_string(checks[i].name));
            json_object_set_new(e, "level",
                                json_string(checks[i].required ? "required" : "recommended"));
            json_object_set_new(e, "result", json_string(words[c->v[i]]));
            json_object_set_new(e, "detail", json_string(c->detail[i]));
            json_array_append_new(list, e);
        }
        json_object_set_new(doc, "checks", list);
        json_object_set_new(doc, "passed", json_boolean(!failed));
        char *s = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
        if (s == NULL || idem__buf_append_str(&out, s) != 0 || idem__buf_append(&out, "\n", 1) != 0)
            rc = -1;
        free(s);
    } else {
        for (size_t i = 0; i < C_COUNT && rc == 0; i++) {
            if (c->v[i] == V_PASS)
                rc = idem__buf_appendf(&out, "PASS %s\n", checks[i].name);
            else
                rc = idem__buf_appendf(&out, "%s %s: %s\n", c->v[i] == V_FAIL ? "FAIL" : "SKIP",
                                       checks[i].name, c->detail[i]);
        }
    }
    if (rc != 0) {
        idem__buf_cleanup(&out);
        fprintf(stderr, "idemctl: out of memory\n");
        return IDEM_CLI_EXIT_NOMEM;
    }
    rc = idem__cli_write_out(out.data, out.len) != 0 ? IDEM_CLI_EXIT_WRITE : 0;
    idem__buf_cleanup(&out);
    if (rc != 0)
        return rc;
    if (!failed)
        return IDEM_CLI_EXIT_OK;
    char names[256] = "";
    for (size_t i = 0; i < C_COUNT; i++)
        if (c->v[i] == V_FAIL) {
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", checks[i].name);
        }
    fprintf(stderr, "idemctl: conformance: failed: %s\n", names);
    return IDEM_CLI_EXIT_CONFORMANCE;
}

/* ---- the command ------------------------------------------------------------ */

static struct curl_slist *request_headers(const idem_cli_args_t *a)
{
    struct curl_slist *l = NULL;
    json_error_t jerr;
    json_t *doc = json_loads(a->body, JSON_DECODE_ANY, &jerr);
    const char *ctype = doc != NULL ? "Content-Type: application/json" : NULL;
    json_decref(doc);
    for (size_t i = 0; i < a->n_headers; i++)
        if (!idem__cli_header_add(&l, a->headers[i]))
            return NULL;
    if (!idem__cli_header_add(&l, "Expect:"))
        return NULL;
    if (!a->has_content_type && ctype != NULL && !idem__cli_header_add(&l, ctype))
        return NULL;
    return l;
}

int idem__cli_conformance(const idem_cli_args_t *a)
{
    conf_t c = {.a = a};
    char err[512], *url = NULL;
    int rc = IDEM_CLI_EXIT_USAGE;

    answer_init(&c.first);
    memcpy(c.key_header, "Idempotency-Key", sizeof "Idempotency-Key");
    if (idem__cli_url_check(a->url, false, &url, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: %s\n", err);
        goto out;
    }
    if ((c.base = curl_url()) == NULL || curl_url_set(c.base, CURLUPART_URL, url, 0) != CURLUE_OK ||
        (a->path != NULL && curl_url_set(c.base, CURLUPART_URL, a->path, 0) != CURLUE_OK) ||
        curl_url_get(c.base, CURLUPART_URL, &c.target, 0) != CURLUE_OK ||
        (c.policy_url = resolve(&c, "/_idem/policy")) == NULL) {
        fprintf(stderr, "idemctl: conformance: bad URL or --path\n");
        goto out;
    }
    if ((c.hdrs = request_headers(a)) == NULL) {
        fprintf(stderr, "idemctl: out of memory\n");
        rc = IDEM_CLI_EXIT_NOMEM;
        goto out;
    }
    idem_key_generate(idem_clock_now(NULL), NULL, c.key);

    /* The published policy, and whether anything answers at all. */
    if (!fetch_policy(&c, c.policy_url, false)) {
        fprintf(stderr, "idemctl: out of memory\n");
        rc = IDEM_CLI_EXIT_NOMEM;
        goto out;
    }
    if (!c.reached) {
        fprintf(stderr, "idemctl: conformance: no answer from %s: %s\n", url, c.policy_note);
        goto out;
    }
    if (c.policy != NULL)
        c.route = policy_route(&c);
    if (c.route != NULL) {
        const char *mode = route_mode(&c);
        const char *from = json_string_value(json_object_get(c.route, "key_from"));
        if (strcmp(mode, "required") != 0 && strcmp(mode, "optional") != 0) {
            fprintf(stderr, "idemctl: conformance: the policy says %s %s is in mode %s: choose a "
                    "route whose requests carry keys (--path, --method)\n", a->method, c.target,
                    mode);
            goto out;
        }
        if (from != NULL && strncmp(from, "header:", 7) == 0 &&
            idem__cli_is_token(from + 7, strlen(from + 7)) && strlen(from + 7) < 256) {
            memcpy(c.key_header, from + 7, strlen(from + 7) + 1);
        } else if (from != NULL) {
            fprintf(stderr, "idemctl: conformance: the policy says the key of %s %s comes from "
                    "%.100s; conformance sends keys in a header only\n", a->method, c.target,
                    from);
            goto out;
        }
    }

    check_missing_key(&c);
    check_concurrent(&c);
    check_replay(&c);
    check_key_reuse(&c);
    check_published(&c);
    rc = report(&c);
out:
    json_decref(c.policy);
    idem__cli_answer_cleanup(&c.first);
    curl_slist_free_all(c.hdrs);
    curl_free(c.target);
    curl_free(c.policy_url);
    curl_url_cleanup(c.base);
    free(url);
    return rc;
}
