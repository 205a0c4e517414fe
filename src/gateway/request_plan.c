/* src/gateway/request_plan.c - the loop-free steps of idemd's request path,
 * and idem__gw_plan_request, which runs them all over input that is all there.
 *
 * See request_plan.h for the steps and who calls them.  Every answer idemd
 * makes before the store, and every byte of the head it sends upstream, is
 * decided here, so that conn.c and request.c (on the loop) and
 * the fuzzer and the unit tests (without one) run one code.  The order of
 * the steps in idem__gw_plan_request is conn.c's and request.c's order; a
 * change to one is a change to the other.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request_plan.h"

#include "core/json.h"

static void refuse(idem_gw_refusal_t *r, int status, const char *type, idem_outcome_t outcome,
                   const char *detail)
{
    r->status = status;
    r->type = type;
    r->outcome = outcome;
    r->allow_post = false;
    r->allow_get = false;
    snprintf(r->detail, sizeof r->detail, "%s", detail);
}

static bool is_method(const idem_http_msg_t *m, const char *name)
{
    size_t n = strlen(name);
    return m->method.len == n && memcmp(m->method.ptr, name, n) == 0;
}

/* ---- the head ------------------------------------------------------------ */

void idem__gw_refuse_parse(int parse_rc, idem_gw_refusal_t *r)
{
    switch (parse_rc) {
    case IDEM_HTTP_E_HEAD_TOO_LARGE:
        refuse(r, 431, "headers-too-large", IDEM_OUT_TOO_LARGE,
               "the request head is larger than 16 KiB");
        return;
    case IDEM_HTTP_E_TOO_MANY_HEADERS:
        refuse(r, 431, "headers-too-large", IDEM_OUT_TOO_LARGE,
               "the request has more than 100 header fields");
        return;
    case IDEM_HTTP_E_VERSION:
        refuse(r, 505, "version-not-supported", IDEM_OUT_BAD_REQUEST,
               "only HTTP/1.0 and HTTP/1.1 are supported");
        return;
    case IDEM_HTTP_E_SMUGGLE:
        refuse(r, 400, "bad-request", IDEM_OUT_BAD_REQUEST,
               "ambiguous message framing (Content-Length / Transfer-Encoding)");
        return;
    default:
        refuse(r, 400, "bad-request", IDEM_OUT_BAD_REQUEST, "malformed HTTP request");
        return;
    }
}

/* Whether the method m is a case variant of one a route names: equal to it
 * but for the case of letters, and not the same bytes.  Route methods are
 * upper case (config.h), so a method without a lower-case letter is none,
 * and the usual request costs one pass over its method. */
static bool method_case_variant(const idem_config_t *cfg, idem_slice_t m)
{
    bool lower = false;
    for (size_t i = 0; i < m.len && !lower; i++)
        lower = m.ptr[i] >= 'a' && m.ptr[i] <= 'z';
    if (!lower)
        return false;
    for (size_t i = 0; i < cfg->n_routes; i++) {
        const idem_route_t *rt = &cfg->routes[i];
        for (size_t k = 0; k < rt->n_methods; k++) {
            const char *rm = rt->methods[k];
            if (strlen(rm) == m.len && idem__slice_eq_ci(m, rm) && memcmp(rm, m.ptr, m.len) != 0)
                return true;
        }
    }
    return false;
}

bool idem__gw_check_head(const idem_config_t *cfg, const idem_http_msg_t *m, idem_gw_refusal_t *r)
{
    if (m->version_minor == 1 && idem__http_count(m, "Host") == 0) {
        /* RFC 9112 section 3.2: a 1.1 request without Host is refused. */
        refuse(r, 400, "bad-request", IDEM_OUT_BAD_REQUEST,
               "an HTTP/1.1 request needs a Host header");
        return false;
    }
    if (is_method(m, "CONNECT")) {
        /* A reverse proxy opens no tunnels (docs/protocol.md section 5). */
        refuse(r, 501, "not-implemented", IDEM_OUT_BAD_REQUEST,
               "idemd is a reverse proxy: CONNECT is not supported");
        return false;
    }
    if (method_case_variant(cfg, m->method)) {
        /* Methods are case-sensitive, so "post" matches no POST route and
         * would pass its mode by; but many frameworks upper-case methods
         * and run it as POST (docs/protocol.md section 5). */
        refuse(r, 400, "invalid-method", IDEM_OUT_BAD_REQUEST, "");
        snprintf(r->detail, sizeof r->detail,
                 "the method '%.*s' differs only in case from one a route names; methods are "
                 "case-sensitive: send it in upper case",
                 (int)(m->method.len > 32 ? 32 : m->method.len), m->method.ptr);
        return false;
    }
    if (m->framing == IDEM_HTTP_BODY_LENGTH && m->content_length > cfg->max_request_bytes) {
        refuse(r, 413, "request-too-large", IDEM_OUT_TOO_LARGE,
               "the request body is larger than max_request_bytes");
        return false;
    }
    return true;
}

void idem__gw_refuse_target(int target_rc, idem_gw_refusal_t *r)
{
    /* Not origin- or absolute-form, or a path with no single reading
     * (docs/protocol.md section 5): never forwarded. */
    refuse(r, 400, "invalid-target", IDEM_OUT_BAD_REQUEST, idem__http_target_strerror(target_rc));
}

void idem__gw_refuse_body(int body_rc, idem_gw_refusal_t *r)
{
    if (body_rc == IDEM_HTTP_E_BODY_TOO_LARGE)
        refuse(r, 413, "request-too-large", IDEM_OUT_TOO_LARGE,
               "the request body is larger than max_request_bytes");
    else
        refuse(r, 400, "bad-request", IDEM_OUT_BAD_REQUEST, "malformed request body");
}

/* ---- what the request is --------------------------------------------------- */

bool idem__gw_classify(const idem_config_t *cfg, const idem_gw_request_t *rq,
                       idem_gw_class_t *cls, idem_gw_refusal_t *r)
{
    const idem_http_msg_t *m = rq->msg;
    memset(cls, 0, sizeof *cls);
    /* Every path is the normalised one: /_idem/tokens in absolute-form or
     * with escapes is still idemd's own. */
    if (rq->path_len == sizeof IDEM_GW_TOKENS_PATH - 1 &&
        memcmp(rq->target, IDEM_GW_TOKENS_PATH, rq->path_len) == 0) {
        cls->kind = IDEM_GW_TOKEN_ISSUE;
        cls->policy = &cfg->defaults;
        if (is_method(m, "POST"))
            return true;
        refuse(r, 405, "method-not-allowed", IDEM_OUT_BAD_REQUEST,
               "tokens are issued by POST " IDEM_GW_TOKENS_PATH);
        r->allow_post = true;
        return false;
    }
    if (rq->path_len == sizeof IDEM_GW_POLICY_PATH - 1 &&
        memcmp(rq->target, IDEM_GW_POLICY_PATH, rq->path_len) == 0) {
        cls->kind = IDEM_GW_POLICY;
        cls->policy = &cfg->defaults;
        if (is_method(m, "GET") || is_method(m, "HEAD"))
            return true;
        refuse(r, 405, "method-not-allowed", IDEM_OUT_BAD_REQUEST,
               "the policy is read with GET " IDEM_GW_POLICY_PATH);
        r->allow_get = true;
        return false;
    }
    cls->route = idem__config_match(cfg, m->method.ptr, m->method.len, rq->target, rq->path_len);
    cls->policy = cls->route ? &cls->route->policy : &cfg->defaults;
    if (!cls->route || cls->route->mode == IDEM_MODE_OFF) {
        cls->kind = IDEM_GW_PASS;
        return true;
    }
    if (cls->route->mode == IDEM_MODE_TOKEN) {
        cls->kind = IDEM_GW_TOKEN;
        size_t n = idem__http_count(m, "Idempotency-Token");
        if (n == 0) {
            refuse(r, 400, "missing-token", IDEM_OUT_MISSING_TOKEN,
                   "this route requires an Idempotency-Token header from "
                   "POST " IDEM_GW_TOKENS_PATH);
            return false;
        }
        const idem_http_field_t *tf = idem__http_find(m, "Idempotency-Token");
        if (n > 1 || idem_token_parse(tf->value.ptr, tf->value.len, cls->token) != IDEM_OK) {
            cls->token[0] = '\0';
            refuse(r, 400, "invalid-token", IDEM_OUT_INVALID_TOKEN,
                   n > 1 ? "the Idempotency-Token header was given more than once"
                         : "an Idempotency-Token is the 32 hex digits POST " IDEM_GW_TOKENS_PATH
                           " returned");
            return false;
        }
        return true;
    }
    const idem_policy_t *p = cls->policy;
    if (p->key_from == IDEM_KEY_FROM_JSON) {
        /* Known only once the body is in: nothing is claimed before. */
        cls->kind = IDEM_GW_KEYED;
        cls->key_in_body = true;
        return true;
    }
    const char *name = p->key_from_arg;
    size_t n_keys = idem__http_count(m, name);
    if (n_keys == 0) {
        if (cls->route->mode == IDEM_MODE_OPTIONAL) {
            cls->kind = IDEM_GW_PASS;
            return true;
        }
        cls->kind = IDEM_GW_KEYED;
        refuse(r, 400, "missing-key", IDEM_OUT_MISSING_KEY, "");
        snprintf(r->detail, sizeof r->detail,
                 "this route requires an idempotency key in the %.64s header", name);
        return false;
    }
    cls->kind = IDEM_GW_KEYED;
    const idem_http_field_t *kf = idem__http_find(m, name);
    if (n_keys > 1 || idem_key_parse(kf->value.ptr, kf->value.len, cls->key) != IDEM_OK) {
        cls->key[0] = '\0';
        refuse(r, 400, "invalid-key", IDEM_OUT_INVALID_KEY, "");
        if (n_keys > 1)
            snprintf(r->detail, sizeof r->detail, "the %.64s header was given more than once",
                     name);
        else
            snprintf(r->detail, sizeof r->detail,
                     "an idempotency key (%.64s) is 1 to 255 visible ASCII characters, bare "
                     "(without a comma) or as a quoted string",
                     name);
        return false;
    }
    return true;
}

/* A JSON integer written in decimal: -?(0|[1-9][0-9]*), no fraction, no
 * exponent ("1.0" and "1e3" are numbers, not integers written in decimal). */
static bool is_decimal_integer(const char *s, size_t n)
{
    size_t i = s[0] == '-' ? 1 : 0;
    if (i == n || (s[i] == '0' && n - i > 1))
        return false;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

bool idem__gw_key_from_body(const idem_gw_request_t *rq, idem_gw_class_t *cls,
                            idem_gw_refusal_t *r)
{
    if (cls->kind != IDEM_GW_KEYED || !cls->key_in_body)
        return true;
    const idem_policy_t *p = cls->policy;
    const char *ptr = p->key_from_arg;
    cls->key[0] = '\0';
    idem__json_t *doc = NULL;
    idem_err_t err = rq->body_len == 0
                         ? IDEM_E_INVAL
                         : idem__json_parse((const char *)rq->body, rq->body_len, NULL, 0, &doc);
    if (err == IDEM_E_NOMEM) {
        refuse(r, 500, "internal", IDEM_OUT__COUNT, "out of memory");
        return false;
    }
    if (err != IDEM_OK) {
        refuse(r, 400, "invalid-key", IDEM_OUT_INVALID_KEY, "");
        snprintf(r->detail, sizeof r->detail,
                 "this route reads its idempotency key from the JSON body at %.64s, and the "
                 "body is not JSON",
                 ptr);
        return false;
    }
    size_t off, len, n = 0;
    idem__json_type_t kind = idem__json_find(doc, ptr, &off, &len);
    bool ok = false;
    if (kind == IDEM__JSON_STRING) {
        ok = idem__json_string(doc, off, cls->key, IDEM_KEY_MAX + 1, &n) == IDEM_OK &&
             n >= 1 && n <= IDEM_KEY_MAX;
        for (size_t i = 0; ok && i < n; i++)
            ok = cls->key[i] >= 0x20 && cls->key[i] <= 0x7E;
    } else if (kind == IDEM__JSON_NUMBER) {
        const char *t = (const char *)rq->body + off;
        ok = len <= IDEM_KEY_MAX && is_decimal_integer(t, len);
        if (ok) {
            memcpy(cls->key, t, len);
            n = len;
        }
    }
    idem__json_destroy(doc);
    if (ok) {
        cls->key[n] = '\0';
        cls->key_in_body = false;
        return true;
    }
    cls->key[0] = '\0';
    if (kind == IDEM__JSON_NONE) {
        if (cls->route != NULL && cls->route->mode == IDEM_MODE_OPTIONAL) {
            cls->kind = IDEM_GW_PASS;
            cls->key_in_body = false;
            return true;
        }
        refuse(r, 400, "missing-key", IDEM_OUT_MISSING_KEY, "");
        snprintf(r->detail, sizeof r->detail,
                 "this route requires an idempotency key in the JSON body at %.64s", ptr);
        return false;
    }
    refuse(r, 400, "invalid-key", IDEM_OUT_INVALID_KEY, "");
    snprintf(r->detail, sizeof r->detail,
             "the idempotency key at %.64s in the JSON body must be a string of 1 to 255 "
             "printable ASCII characters or an integer written in decimal",
             ptr);
    return false;
}

bool idem__gw_refuse_scope(idem_scope_result_t rc, const char *dup, idem_gw_refusal_t *r)
{
    switch (rc) {
    case IDEM_SCOPE_FROM_SOURCES:
    case IDEM_SCOPE_FALLBACK_AUTHORIZATION:
    case IDEM_SCOPE_FALLBACK_ANONYMOUS:
        return false;
    case IDEM_SCOPE_AMBIGUOUS:
        refuse(r, 400, "ambiguous-scope", IDEM_OUT_BAD_REQUEST, "");
        snprintf(r->detail, sizeof r->detail,
                 "the %s header was given more than once, so the caller is ambiguous",
                 dup ? dup : "Authorization");
        return true;
    case IDEM_SCOPE_AMBIGUOUS_COOKIE:
        refuse(r, 400, "ambiguous-scope", IDEM_OUT_BAD_REQUEST, "");
        snprintf(r->detail, sizeof r->detail,
                 "the cookie %s was given more than once in the Cookie fields, so the caller "
                 "is ambiguous",
                 dup ? dup : "");
        return true;
    case IDEM_SCOPE_MISSING:
        refuse(r, 400, "missing-scope", IDEM_OUT_BAD_REQUEST,
               "a source of the caller's scope is absent or its JWT did not verify, and "
               "scope_missing is reject");
        return true;
    default:
        refuse(r, 500, "internal", IDEM_OUT__COUNT, "out of memory");
        return true;
    }
}

idem_err_t idem__gw_fingerprint(const idem_policy_t *p, const idem_gw_request_t *rq,
                                uint8_t fp[IDEM_FP_LEN])
{
    idem_fp_header_t hdrs[IDEM_CONFIG_MAX_LIST];
    for (size_t i = 0; i < p->n_fingerprint_headers; i++) {
        const idem_http_field_t *f = idem__http_find(rq->msg, p->fingerprint_headers[i]);
        hdrs[i].name = p->fingerprint_headers[i];
        hdrs[i].name_len = strlen(p->fingerprint_headers[i]);
        hdrs[i].value = f ? f->value.ptr : NULL;
        hdrs[i].value_len = f ? f->value.len : 0;
    }
    idem_fp_input_t in = {
        .method = rq->msg->method.ptr,
        .method_len = rq->msg->method.len,
        /* Normalised: two spellings of one target are one request. */
        .target = rq->target,
        .target_len = rq->target_len,
        .headers = hdrs,
        .n_headers = p->n_fingerprint_headers,
        .body = rq->body,
        .body_len = rq->body_len,
        .body_json = p->fingerprint_body == IDEM_FPBODY_JSON,
        .ignore = (const char *const *)p->fingerprint_ignore,
        .n_ignore = p->n_fingerprint_ignore,
    };
    return idem_fingerprint(&in, fp) == IDEM_OK ? IDEM_OK : IDEM_E_NOMEM;
}

/* ---- what goes upstream ---------------------------------------------------- */

/* Whether name frames this connection's message or names its protocol: the
 * fixed hop-by-hop list but Proxy-*.  Never forwarded, even when the scope
 * reads it: the upstream gets idemd's framing only, and a client's
 * Transfer-Encoding next to our Content-Length would be a smuggling. */
static bool frames_connection(idem_slice_t name)
{
    static const char *const names[] = {
        "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (idem__slice_eq_ci(name, names[i]))
            return true;
    return false;
}

/* Where the upstream head goes: appended to out, or (out NULL) only measured. */
typedef struct head_sink {
    idem_buf_t *out;
    size_t len;    /* bytes of the head so far */
    size_t fields; /* header fields so far */
    int rc;        /* nonzero once an append failed */
} head_sink_t;

static void sink_raw(head_sink_t *s, const char *p, size_t n)
{
    s->len += n;
    if (s->out)
        s->rc |= idem__buf_append(s->out, p, n);
}

static void sink_field(head_sink_t *s, const char *name, size_t name_len, const char *value,
                       size_t value_len)
{
    s->fields++;
    s->len += name_len + 2 + value_len + 2; /* "Name: value\r\n" */
    if (s->out)
        s->rc |= idem__http_write_field(s->out, name, name_len, value, value_len);
}

/* Whether some route reads its key from the field name (key_from:
 * header:NAME): a client listing it in Connection does not get it
 * stripped, as it does not Idempotency-Key.  Asked only of a field that is
 * hop-by-hop, which is rare. */
static bool is_key_header(const idem_config_t *cfg, idem_slice_t name)
{
    for (size_t i = 0; i < cfg->n_routes; i++) {
        const idem_policy_t *p = &cfg->routes[i].policy;
        if (p->key_from == IDEM_KEY_FROM_HEADER && idem__slice_eq_ci(name, p->key_from_arg))
            return true;
    }
    return false;
}

static void build_head(head_sink_t *s, const idem_config_t *cfg, const char *upstream_host,
                       const idem_gw_request_t *rq, bool keyed, uint64_t fence)
{
    const idem_http_msg_t *m = rq->msg;
    char num[24];
    /* The normalised target, in origin-form: the path the route was
     * matched on and the fingerprint hashed, so an upstream that would read
     * another spelling differently never gets one. */
    sink_raw(s, m->method.ptr, m->method.len);
    sink_raw(s, " ", 1);
    sink_raw(s, rq->target, rq->target_len);
    sink_raw(s, " HTTP/1.1\r\n", 11);
    /* An absolute-form target's authority replaces Host (RFC 9112 section
     * 3.2.2). */
    bool has_host = rq->authority.len > 0;
    if (has_host)
        sink_field(s, "Host", 4, rq->authority.ptr, rq->authority.len);
    for (size_t i = 0; i < m->n_fields; i++) {
        const idem_http_field_t *f = &m->fields[i];
        bool host = idem__slice_eq_ci(f->name, "Host");
        /* A client listing Idempotency-Key, Idempotency-Token or Host in
         * Connection does not get them stripped: the upstream must see the
         * key and the token as received.  Nor the headers that named the
         * caller (docs/protocol.md section 2): the upstream must
         * authenticate the caller idemd scoped the key to. */
        bool kept =
            idem__slice_eq_ci(f->name, "Idempotency-Key") ||
            idem__slice_eq_ci(f->name, "Idempotency-Token") || host ||
            idem__gw_scope_uses_header(cfg->scope, cfg->n_scope, cfg->scope_header, f->name);
        if (frames_connection(f->name) ||
            (!kept && idem__http_field_is_hop_by_hop(m, i) && !is_key_header(cfg, f->name)) ||
            idem__slice_eq_ci(f->name, "Content-Length") ||
            idem__slice_eq_ci(f->name, "Expect") ||
            idem__slice_eq_ci(f->name, "Idempotency-Fence") || (host && rq->authority.len > 0) ||
            (rq->traceparent != NULL && idem__slice_eq_ci(f->name, "traceparent")))
            continue;
        if (host)
            has_host = true;
        sink_field(s, f->name.ptr, f->name.len, f->value.ptr, f->value.len);
    }
    if (!has_host)
        sink_field(s, "Host", 4, upstream_host, strlen(upstream_host));
    if (keyed) {
        int n = snprintf(num, sizeof num, "%llu", (unsigned long long)fence);
        sink_field(s, "Idempotency-Fence", 17, num, (size_t)n);
    }
    if (rq->body_len > 0 || m->framing != IDEM_HTTP_BODY_NONE) {
        int n = snprintf(num, sizeof num, "%zu", rq->body_len);
        sink_field(s, "Content-Length", 14, num, (size_t)n);
    }
    if (rq->traceparent != NULL)
        sink_field(s, "traceparent", 11, rq->traceparent, strlen(rq->traceparent));
    sink_raw(s, "\r\n", 2);
}

int idem__gw_upstream_head(idem_buf_t *out, const idem_config_t *cfg, const char *upstream_host,
                           const idem_gw_request_t *rq, bool keyed, uint64_t fence)
{
    head_sink_t s = {.out = out};
    build_head(&s, cfg, upstream_host, rq, keyed, fence);
    return s.rc ? -1 : 0;
}

bool idem__gw_upstream_fits(const idem_config_t *cfg, const char *upstream_host,
                            const idem_gw_request_t *rq, bool keyed, idem_gw_refusal_t *r)
{
    head_sink_t s = {0};
    /* The longest fence there can be: the bound holds for every claim. */
    build_head(&s, cfg, upstream_host, rq, keyed, UINT64_MAX);
    if (s.fields <= IDEM_HTTP_MAX_HEADERS && s.len <= IDEM_HTTP_MAX_HEAD)
        return true;
    refuse(r, 431, "headers-too-large", IDEM_OUT_TOO_LARGE,
           s.fields > IDEM_HTTP_MAX_HEADERS
               ? "with the fields idemd adds (Idempotency-Fence, Host, Content-Length) the "
                 "request would have more than 100 header fields"
               : "with the fields idemd adds (Idempotency-Fence, Host, Content-Length) the "
                 "request head would be larger than 16 KiB");
    return false;
}

/* ---- what comes back ------------------------------------------------------ */

static bool name_in(idem_slice_t name, char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (idem__slice_eq_ci(name, names[i]))
            return true;
    return false;
}

/* The upstream fields neither stored nor relayed: those that frame the
 * upstream's connection (the writer frames the answer itself) and the
 * replay markers, which only idemd may set. */
static bool response_field_dropped(const idem_policy_t *p, const idem_http_msg_t *resp,
                                   idem_slice_t name)
{
    return idem__http_is_hop_by_hop(resp, name) || idem__slice_eq_ci(name, "Content-Length") ||
           name_in(name, p->replay_marker, p->n_replay_marker);
}

bool idem__gw_response_field_stored(const idem_policy_t *p, const idem_http_msg_t *resp,
                                    idem_slice_t name)
{
    return !response_field_dropped(p, resp, name) &&
           !name_in(name, p->replay_drop_headers, p->n_replay_drop_headers);
}

bool idem__gw_response_field_relayed(const idem_policy_t *p, const idem_http_msg_t *resp,
                                     idem_slice_t name)
{
    return !response_field_dropped(p, resp, name);
}

/* ---- the whole path -------------------------------------------------------- */

static idem_gw_request_t plan_view(const idem_gw_plan_t *p)
{
    return (idem_gw_request_t){
        .msg = &p->msg,
        .target = p->target,
        .target_len = p->t.len,
        .path_len = p->t.path_len,
        .authority = p->t.authority,
        .body = (const uint8_t *)p->body.data,
        .body_len = p->body.len,
    };
}

static idem_err_t plan_refused(idem_gw_plan_t *p, const idem_gw_refusal_t *r)
{
    p->verdict = IDEM_GW_REFUSED;
    if (r != &p->refusal)
        p->refusal = *r;
    return IDEM_OK;
}

static void plan_classify(const idem_config_t *cfg, idem_gw_plan_t *p, bool *ok)
{
    idem_gw_request_t rq = plan_view(p);
    p->classified = true;
    *ok = idem__gw_classify(cfg, &rq, &p->cls, &p->refusal);
}

/* Decode the body that follows the head, as conn.c's conn_process_loop
 * does (the same limit on the decoder and on the buffer). */
static void plan_body(const idem_config_t *cfg, idem_gw_plan_t *p, const char *in, size_t len)
{
    idem_http_body_t b;
    idem__http_body_init(&b, &p->msg, cfg->max_request_bytes);
    size_t off = p->used;
    int rc;
    for (;;) {
        size_t used = 0;
        idem_slice_t data = {0};
        rc = idem__http_body_feed(&b, in + off, len - off, &used, &data);
        off += used;
        if (rc != IDEM_HTTP_BODY_DATA)
            break;
        if (idem__buf_append(&p->body, data.ptr, data.len) != 0) {
            rc = IDEM_HTTP_E_BODY_TOO_LARGE;
            break;
        }
    }
    p->body_rc = rc;
    p->used = off;
}

idem_err_t idem__gw_plan_request(const idem_config_t *cfg, const char *upstream_host,
                                 uint64_t fence, const char *in, size_t len, idem_gw_plan_t *out)
{
    idem_gw_plan_t *p = out;
    memset(p, 0, sizeof *p);
    idem__buf_init(&p->body, cfg->max_request_bytes);
    idem__buf_init(&p->upstream, 0);
    p->target_rc = IDEM_TARGET_OK;

    idem_http_head_state_t hs = {0};
    p->parse_rc = idem__http_parse_request(&hs, in, len, IDEM_HTTP_MAX_HEAD, &p->msg);
    if (p->parse_rc == IDEM_HTTP_INCOMPLETE)
        return IDEM_OK;
    if (p->parse_rc < 0) {
        idem__gw_refuse_parse(p->parse_rc, &p->refusal);
        return plan_refused(p, &p->refusal);
    }
    size_t head_len = (size_t)p->parse_rc;
    p->used = head_len;
    if (!idem__gw_check_head(cfg, &p->msg, &p->refusal))
        return plan_refused(p, &p->refusal);
    /* The normal form is never longer than the target (+2: '/' for an
     * absolute-form target without path, and the NUL). */
    size_t tcap = p->msg.target.len + 2;
    p->target = malloc(tcap);
    if (!p->target)
        return IDEM_E_NOMEM;
    p->target_rc =
        idem__http_target_normalize(p->msg.target.ptr, p->msg.target.len, p->target, tcap, &p->t);
    if (p->target_rc != IDEM_TARGET_OK) {
        idem__gw_refuse_target(p->target_rc, &p->refusal);
        return plan_refused(p, &p->refusal);
    }

    bool ok = true;
    if (p->msg.framing == IDEM_HTTP_BODY_NONE) {
        p->body_rc = IDEM_HTTP_BODY_DONE;
    } else {
        /* A client waiting for 100 Continue is invited only once the head
         * passed every check it can; refused, it is answered at once. */
        bool invite = p->msg.expect_continue && p->msg.version_minor == 1 && len == head_len;
        if (invite) {
            plan_classify(cfg, p, &ok);
            if (!ok)
                return plan_refused(p, &p->refusal);
            p->invite = true;
        }
        plan_body(cfg, p, in, len);
        if (p->body_rc == IDEM_HTTP_INCOMPLETE)
            return IDEM_OK;
        if (p->body_rc < 0) {
            idem__gw_refuse_body(p->body_rc, &p->refusal);
            return plan_refused(p, &p->refusal);
        }
    }

    /* Dispatch (request.c's idem__req_dispatch). */
    if (!p->classified) {
        plan_classify(cfg, p, &ok);
        if (!ok)
            return plan_refused(p, &p->refusal);
    }
    idem_gw_request_t rq = plan_view(p);
    if (p->cls.kind == IDEM_GW_POLICY) {
        p->verdict = IDEM_GW_PUBLISH;
        return IDEM_OK;
    }
    if (!idem__gw_key_from_body(&rq, &p->cls, &p->refusal))
        return plan_refused(p, &p->refusal);
    bool keyed = p->cls.kind == IDEM_GW_KEYED;
    if (p->cls.kind != IDEM_GW_TOKEN_ISSUE &&
        !idem__gw_upstream_fits(cfg, upstream_host, &rq, keyed, &p->refusal))
        return plan_refused(p, &p->refusal);
    if (p->cls.kind != IDEM_GW_PASS) {
        const char *dup = NULL;
        p->scoped = true;
        /* No connection here: no verified client certificate; and no JWT
         * keys (the running process holds them), so a jwt: source fails
         * as with a token no key verifies. */
        idem_scope_env_t env = {.missing = cfg->scope_missing};
        p->scope_rc = idem__gw_scope_compute_env(cfg->scope, cfg->n_scope, cfg->scope_header,
                                                 &p->msg, &env, p->scope, &dup, NULL);
        if (idem__gw_refuse_scope(p->scope_rc, dup, &p->refusal))
            return plan_refused(p, &p->refusal);
    }
    if (p->cls.kind == IDEM_GW_TOKEN_ISSUE) {
        p->verdict = IDEM_GW_ISSUE;
        return IDEM_OK;
    }
    if (keyed) {
        if (idem__gw_fingerprint(p->cls.policy, &rq, p->fp) != IDEM_OK) {
            idem_gw_refusal_t r;
            refuse(&r, 500, "internal", IDEM_OUT__COUNT, "out of memory");
            return plan_refused(p, &r);
        }
        p->fingerprinted = true;
    }
    if (idem__gw_upstream_head(&p->upstream, cfg, upstream_host, &rq, keyed, fence) != 0)
        return IDEM_E_NOMEM;
    p->verdict = IDEM_GW_FORWARD;
    return IDEM_OK;
}

void idem__gw_plan_cleanup(idem_gw_plan_t *plan)
{
    if (!plan)
        return;
    free(plan->target);
    idem__buf_cleanup(&plan->body);
    idem__buf_cleanup(&plan->upstream);
    memset(plan, 0, sizeof *plan);
}
