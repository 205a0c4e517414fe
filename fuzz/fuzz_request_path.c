/* fuzz/fuzz_request_path.c - libFuzzer target for idemd's request path as a
 * whole: request bytes in, a decision and the bytes sent upstream out
 * (idem__gw_plan_request, src/gateway/request_plan.c, whose steps conn.c and
 * request.c call on the loop).
 *
 * The input's first byte picks one of four configurations (below); the
 * rest is what a client sends on one connection: a request head, its body in
 * its framing, and perhaps pipelined requests after it (up to three are
 * planned).  Properties checked beyond "no crash, no leak, no hang":
 *   - deterministic: planning the same bytes twice gives the same plan;
 *   - split: the bytes arriving as a prefix first never forward or issue
 *     anything before the prefix holds the whole message, and then plan as
 *     the whole does (a decision does not depend on how the bytes came);
 *   - refused input is never forwarded: a head our parser refuses, a target
 *     the normaliser refuses, a body the decoder refuses, a method that is
 *     a case variant of a routed one;
 *   - a forwarded request's upstream head and body re-parse with our own
 *     parser, under idemd's own limits on a head (16 KiB, 100 fields), as
 *     exactly one request with no byte left over, HTTP/1.1, the
 *     method as received, an origin-form target equal to the normalised one
 *     (which normalises to itself and matches the same route), one Host
 *     (the absolute-form authority, else the client's, else the upstream's),
 *     a Content-Length framing of the decoded body; no field that frames
 *     the client's connection (Connection, Transfer-Encoding, Upgrade ...),
 *     and of Proxy-* and those the client's Connection names only the kept
 *     ones (Idempotency-Key, Idempotency-Token, Host, the scope's headers);
 *     no Expect;
 *     every end-to-end field of the client's in its order; Idempotency-Key
 *     fields exactly as received; exactly one Idempotency-Fence, with the
 *     claim's fence, when keyed and none otherwise, whatever the client sent;
 *   - what idemd sends upstream, sent to idemd again, is planned the same
 *     and forwarded byte for byte the same (the upstream head is a fixed
 *     point of the builder);
 *   - with fingerprint_body: json a keyed request's fingerprint is that of
 *     its body's canonical form, and of that form spaced out.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "gateway/config.h"
#include "gateway/request_plan.h"
#include "idem/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define UPSTREAM_HOST "127.0.0.1:9000"
#define MAX_MESSAGES 3

/* The configurations, picked by the input's first byte. */
static const char *const yaml[] = {
    /* 0: the defaults (POST and PATCH on every path required). */
    "",
    /* 1: every mode, canonical JSON with ignored members, a header in the
     * fingerprint, a small body limit. */
    "max_request_bytes: 4KiB\n"
    "defaults:\n"
    "  fingerprint_body: json\n"
    "  fingerprint_ignore: [/client_time, /meta/trace]\n"
    "  fingerprint_headers: [content-type]\n"
    "routes:\n"
    "  - methods: [POST]\n"
    "    path: /pay\n"
    "    mode: required\n"
    "  - methods: [POST, PUT, PATCH]\n"
    "    path: /opt\n"
    "    mode: optional\n"
    "  - methods: [POST, DELETE]\n"
    "    path: /tok\n"
    "    mode: token\n"
    "  - methods: [POST]\n"
    "    path: /off\n"
    "    mode: off\n"
    "  - methods: [PATCH, POST]\n"
    "    path: /caf%C3%A9/\n"
    "    mode: required\n"
    "    fingerprint_body: raw\n",
    /* 2: the caller named by a header and a cookie. */
    "scope: [header:X-User, cookie:sid]\n"
    "defaults:\n"
    "  fingerprint_body: json\n",
    /* 3: an odd configuration the loader accepts: the caller named by
     * hop-by-hop fields.  Whatever it names, the upstream's framing is
     * idemd's own. */
    "scope: [header:Transfer-Encoding, header:Upgrade, header:Proxy-User]\n"
    "max_request_bytes: 512\n"
    "routes:\n"
    "  - methods: [POST, PUT]\n"
    "    path: /\n"
    "    mode: required\n",
};
#define N_CONFIGS (sizeof yaml / sizeof yaml[0])

static idem_config_t configs[N_CONFIGS];
static bool loaded;

static void load_configs(void)
{
    int fd = memfd_create("idem-fuzz-request-path", MFD_CLOEXEC);
    CHECK(fd >= 0);
    char path[64], err[512];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    for (size_t i = 0; i < N_CONFIGS; i++) {
        size_t n = strlen(yaml[i]);
        CHECK(ftruncate(fd, 0) == 0);
        CHECK(n == 0 || pwrite(fd, yaml[i], n, 0) == (ssize_t)n);
        CHECK(idem__config_defaults(&configs[i]) == 0);
        if (n > 0 && idem__config_load_file(&configs[i], path, err, sizeof err) != 0) {
            fprintf(stderr, "config %zu: %s\n", i, err);
            CHECK(0);
        }
    }
    close(fd);
    loaded = true;
}

/* ---- helpers ------------------------------------------------------------- */

static bool slice_eq(idem_slice_t a, idem_slice_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static bool slice_is(idem_slice_t a, const char *s, size_t n)
{
    return a.len == n && (n == 0 || memcmp(a.ptr, s, n) == 0);
}

static bool names_eq(idem_slice_t a, idem_slice_t b)
{
    if (a.len != b.len)
        return false;
    for (size_t i = 0; i < a.len; i++) {
        char x = a.ptr[i], y = b.ptr[i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (char)(y - 'A' + 'a');
        if (x != y)
            return false;
    }
    return true;
}

/* A copy of p[0..n) in an allocation of exactly n bytes, so that a read
 * past the end is caught. */
static char *exact_copy(const char *p, size_t n)
{
    char *c = malloc(n ? n : 1);
    CHECK(c != NULL);
    if (n)
        memcpy(c, p, n);
    return c;
}

static void plan(const idem_config_t *cfg, uint64_t fence, const char *in, size_t len,
                 idem_gw_plan_t *out)
{
    CHECK(idem__gw_plan_request(cfg, UPSTREAM_HOST, fence, in, len, out) == IDEM_OK);
}

/* Two plans of one message agree on everything (but the 100 Continue
 * invitation when invite_too is false: it depends on what followed). */
static void same_plan(const idem_gw_plan_t *a, const idem_gw_plan_t *b, bool invite_too)
{
    CHECK(a->verdict == b->verdict);
    CHECK(a->parse_rc == b->parse_rc && a->target_rc == b->target_rc && a->body_rc == b->body_rc);
    CHECK(a->used == b->used);
    if (invite_too)
        CHECK(a->invite == b->invite);
    if (a->verdict == IDEM_GW_REFUSED) {
        CHECK(a->refusal.status == b->refusal.status);
        CHECK(strcmp(a->refusal.type, b->refusal.type) == 0);
        CHECK(strcmp(a->refusal.detail, b->refusal.detail) == 0);
        CHECK(a->refusal.outcome == b->refusal.outcome);
        CHECK(a->refusal.allow_post == b->refusal.allow_post);
        CHECK(a->refusal.allow_get == b->refusal.allow_get);
    }
    CHECK((a->target == NULL) == (b->target == NULL));
    if (a->target && a->target_rc == IDEM_TARGET_OK) {
        CHECK(a->t.len == b->t.len && a->t.path_len == b->t.path_len);
        CHECK(memcmp(a->target, b->target, a->t.len) == 0);
        CHECK(a->t.authority.len == b->t.authority.len);
    }
    CHECK(a->body.len == b->body.len);
    CHECK(a->body.len == 0 || memcmp(a->body.data, b->body.data, a->body.len) == 0);
    CHECK(a->classified == b->classified);
    if (a->classified) {
        CHECK(a->cls.kind == b->cls.kind);
        CHECK(a->cls.route == b->cls.route && a->cls.policy == b->cls.policy);
        CHECK(strcmp(a->cls.key, b->cls.key) == 0 && strcmp(a->cls.token, b->cls.token) == 0);
    }
    CHECK(a->scoped == b->scoped);
    if (a->scoped)
        CHECK(a->scope_rc == b->scope_rc && strcmp(a->scope, b->scope) == 0);
    CHECK(a->fingerprinted == b->fingerprinted);
    if (a->fingerprinted)
        CHECK(memcmp(a->fp, b->fp, IDEM_FP_LEN) == 0);
    CHECK(a->upstream.len == b->upstream.len);
    CHECK(a->upstream.len == 0 || memcmp(a->upstream.data, b->upstream.data, a->upstream.len) == 0);
}

/* ---- a forwarded request, as the upstream reads it ------------------------- */

static bool is_kept(const idem_config_t *cfg, idem_slice_t name)
{
    return idem__slice_eq_ci(name, "Idempotency-Key") ||
           idem__slice_eq_ci(name, "Idempotency-Token") || idem__slice_eq_ci(name, "Host") ||
           idem__gw_scope_uses_header(cfg->scope, cfg->n_scope, cfg->scope_header, name);
}

/* The hop-by-hop fields that frame a connection: never forwarded. */
static bool frames_connection(idem_slice_t name)
{
    return idem__http_is_hop_by_hop(NULL, name) &&
           !(name.len >= 6 && idem__slice_eq_ci((idem_slice_t){name.ptr, 6}, "proxy-"));
}

/* Whether the client's field f is one the upstream must get unchanged. */
static bool end_to_end(const idem_config_t *cfg, const idem_http_msg_t *m,
                       const idem_http_field_t *f, bool absolute)
{
    if (idem__slice_eq_ci(f->name, "Content-Length") || idem__slice_eq_ci(f->name, "Expect") ||
        idem__slice_eq_ci(f->name, "Idempotency-Fence"))
        return false;
    if (frames_connection(f->name))
        return false;
    if (idem__slice_eq_ci(f->name, "Host"))
        return !absolute;
    return is_kept(cfg, f->name) || !idem__http_is_hop_by_hop(m, f->name);
}

/* Whether method equals one a route names but for case, not byte for byte
 * (docs/protocol.md section 5): such a method is never forwarded. */
static bool case_variant_of_a_route(const idem_config_t *cfg, idem_slice_t method)
{
    for (size_t i = 0; i < cfg->n_routes; i++)
        for (size_t k = 0; k < cfg->routes[i].n_methods; k++) {
            const char *rm = cfg->routes[i].methods[k];
            if (idem__slice_eq_ci(method, rm) && memcmp(rm, method.ptr, method.len) != 0)
                return true;
        }
    return false;
}

static void check_forwarded(const idem_config_t *cfg, const idem_gw_plan_t *p, uint64_t fence)
{
    const idem_http_msg_t *cm = &p->msg;
    bool keyed = p->cls.kind == IDEM_GW_KEYED;
    bool absolute = p->t.authority.len > 0;
    CHECK(p->upstream.len > 0);

    /* The wire: the head, then the decoded body. */
    size_t wlen = p->upstream.len + p->body.len;
    char *wire = malloc(wlen);
    CHECK(wire != NULL);
    memcpy(wire, p->upstream.data, p->upstream.len);
    if (p->body.len)
        memcpy(wire + p->upstream.len, p->body.data, p->body.len);

    static idem_http_msg_t um;
    idem_http_head_state_t hs = {0};
    int rc = idem__http_parse_request(&hs, wire, wlen, IDEM_HTTP_MAX_HEAD, &um);
    if (rc != (int)p->upstream.len) {
        fprintf(stderr, "upstream head re-parses as %d, not %zu:\n%.*s\n", rc, p->upstream.len,
                (int)p->upstream.len, p->upstream.data);
        CHECK(0);
    }
    CHECK(um.version_minor == 1);
    CHECK(slice_eq(um.method, cm->method));
    /* Origin-form, the normalised target, which normalises to itself. */
    CHECK(um.target.len > 0 && um.target.ptr[0] == '/');
    CHECK(slice_is(um.target, p->target, p->t.len));
    char *again = malloc(um.target.len + 2);
    CHECK(again != NULL);
    idem_http_target_t t2;
    CHECK(idem__http_target_normalize(um.target.ptr, um.target.len, again, um.target.len + 2,
                                      &t2) == IDEM_TARGET_OK);
    CHECK(t2.len == p->t.len && t2.path_len == p->t.path_len && t2.authority.len == 0);
    CHECK(memcmp(again, p->target, t2.len) == 0);
    free(again);
    if (p->cls.kind != IDEM_GW_TOKEN_ISSUE)
        CHECK(idem__config_match(cfg, um.method.ptr, um.method.len, um.target.ptr, t2.path_len) ==
              p->cls.route);

    /* Framing: Content-Length of the decoded body, and nothing after it. */
    if (p->body.len > 0 || cm->framing != IDEM_HTTP_BODY_NONE) {
        CHECK(um.framing == IDEM_HTTP_BODY_LENGTH && um.content_length == p->body.len);
        CHECK(idem__http_count(&um, "Content-Length") == 1);
    } else {
        CHECK(um.framing == IDEM_HTTP_BODY_NONE);
    }
    idem_http_body_t b;
    idem__http_body_init(&b, &um, 0);
    size_t off = (size_t)rc, got = 0;
    int brc;
    for (;;) {
        size_t used = 0;
        idem_slice_t d = {0};
        brc = idem__http_body_feed(&b, wire + off, wlen - off, &used, &d);
        off += used;
        if (brc != IDEM_HTTP_BODY_DATA)
            break;
        CHECK(got + d.len <= p->body.len && memcmp(d.ptr, p->body.data + got, d.len) == 0);
        got += d.len;
    }
    CHECK(brc == IDEM_HTTP_BODY_DONE);
    CHECK(got == p->body.len && off == wlen);

    /* Host: one, the authority, else the client's, else the upstream's. */
    CHECK(idem__http_count(&um, "Host") == 1);
    const idem_http_field_t *host = idem__http_find(&um, "Host");
    const idem_http_field_t *chost = idem__http_find(cm, "Host");
    if (absolute)
        CHECK(slice_eq(host->value, p->t.authority));
    else if (chost)
        CHECK(slice_eq(host->value, chost->value));
    else
        CHECK(slice_is(host->value, UPSTREAM_HOST, strlen(UPSTREAM_HOST)));

    /* Fields idemd drops or adds. */
    CHECK(idem__http_count(&um, "Expect") == 0);
    CHECK(idem__http_count(&um, "Transfer-Encoding") == 0);
    CHECK(!um.expect_continue && !um.upgrade);
    for (size_t i = 0; i < um.n_fields; i++) {
        const idem_http_field_t *f = &um.fields[i];
        CHECK(!frames_connection(f->name));
        if (idem__http_is_hop_by_hop(cm, f->name))
            CHECK(is_kept(cfg, f->name));
    }
    CHECK(idem__http_count(&um, "Idempotency-Fence") == (keyed ? 1u : 0u));
    if (keyed) {
        char want[32];
        int n = snprintf(want, sizeof want, "%llu", (unsigned long long)fence);
        CHECK(slice_is(idem__http_find(&um, "Idempotency-Fence")->value, want, (size_t)n));
        CHECK(idem__http_count(&um, "Idempotency-Key") == 1);
        char key[IDEM_KEY_MAX + 1];
        const idem_http_field_t *k = idem__http_find(&um, "Idempotency-Key");
        CHECK(idem_key_parse(k->value.ptr, k->value.len, key) == IDEM_OK);
        CHECK(strcmp(key, p->cls.key) == 0);
    }
    /* Every end-to-end field of the client's, in its order, unchanged; the
     * Idempotency-Key fields, all of them. */
    size_t j = 0;
    for (size_t i = 0; i < cm->n_fields; i++) {
        const idem_http_field_t *f = &cm->fields[i];
        if (!end_to_end(cfg, cm, f, absolute))
            continue;
        while (j < um.n_fields &&
               !(names_eq(um.fields[j].name, f->name) && slice_eq(um.fields[j].value, f->value)))
            j++;
        if (j == um.n_fields) {
            fprintf(stderr, "client field %.*s not forwarded\n", (int)f->name.len, f->name.ptr);
            CHECK(0);
        }
        j++;
    }
    CHECK(idem__http_count(&um, "Idempotency-Key") == idem__http_count(cm, "Idempotency-Key"));
    free(wire);
}

/* What idemd sends upstream, sent to idemd again: the same plan, the same
 * bytes upstream. */
static void check_fixed_point(const idem_config_t *cfg, const idem_gw_plan_t *p, uint64_t fence,
                              bool same_scope)
{
    size_t wlen = p->upstream.len + p->body.len;
    char *wire = malloc(wlen);
    CHECK(wire != NULL);
    memcpy(wire, p->upstream.data, p->upstream.len);
    if (p->body.len)
        memcpy(wire + p->upstream.len, p->body.data, p->body.len);
    static idem_gw_plan_t q;
    plan(cfg, fence, wire, wlen, &q);
    CHECK(q.verdict == IDEM_GW_FORWARD);
    CHECK(q.used == wlen);
    CHECK(q.cls.kind == p->cls.kind && q.cls.route == p->cls.route);
    CHECK(strcmp(q.cls.key, p->cls.key) == 0 && strcmp(q.cls.token, p->cls.token) == 0);
    if (same_scope && p->scoped)
        CHECK(q.scope_rc == p->scope_rc && strcmp(q.scope, p->scope) == 0);
    if (p->fingerprinted && idem__http_count(&p->msg, "Connection") == 0)
        CHECK(memcmp(q.fp, p->fp, IDEM_FP_LEN) == 0);
    if (q.upstream.len != p->upstream.len ||
        memcmp(q.upstream.data, p->upstream.data, p->upstream.len) != 0) {
        fprintf(stderr, "upstream head is not a fixed point:\n%.*s\n---\n%.*s\n",
                (int)p->upstream.len, p->upstream.data, (int)q.upstream.len, q.upstream.data);
        CHECK(0);
    }
    idem__gw_plan_cleanup(&q);
    free(wire);
}

/* The canonical form c[0..n) with a space after every ':' and ',' and
 * around it, outside strings. */
static char *spaced(const char *c, size_t n, size_t *out_len)
{
    char *s = malloc(3 * n + 3);
    CHECK(s != NULL);
    size_t k = 0;
    bool in_str = false, esc = false;
    s[k++] = ' ';
    for (size_t i = 0; i < n; i++) {
        char ch = c[i];
        s[k++] = ch;
        if (in_str) {
            if (esc)
                esc = false;
            else if (ch == '\\')
                esc = true;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == ':' || ch == ',') {
            s[k++] = '\n';
        }
    }
    s[k++] = '\t';
    *out_len = k;
    return s;
}

static void check_json_respelling(const idem_gw_plan_t *p)
{
    const idem_policy_t *pol = p->cls.policy;
    if (!p->fingerprinted || pol->fingerprint_body != IDEM_FPBODY_JSON)
        return;
    char *canon = NULL;
    size_t clen = 0;
    if (idem_json_canonicalize(p->body.data ? p->body.data : "", p->body.len, NULL, 0, &canon,
                               &clen) != IDEM_OK)
        return; /* not JSON: hashed raw */
    idem_gw_request_t rq = {
        .msg = &p->msg,
        .target = p->target,
        .target_len = p->t.len,
        .path_len = p->t.path_len,
        .authority = p->t.authority,
        .body = (const uint8_t *)canon,
        .body_len = clen,
    };
    uint8_t fp[IDEM_FP_LEN];
    CHECK(idem__gw_fingerprint(pol, &rq, fp) == IDEM_OK);
    CHECK(memcmp(fp, p->fp, IDEM_FP_LEN) == 0);
    size_t slen;
    char *s = spaced(canon, clen, &slen);
    rq.body = (const uint8_t *)s;
    rq.body_len = slen;
    CHECK(idem__gw_fingerprint(pol, &rq, fp) == IDEM_OK);
    CHECK(memcmp(fp, p->fp, IDEM_FP_LEN) == 0);
    free(s);
    idem_free(canon);
}

/* ---- one message ----------------------------------------------------------- */

static void check_plan(size_t ci, const idem_gw_plan_t *p, const char *in, size_t len,
                       uint64_t fence)
{
    const idem_config_t *cfg = &configs[ci];
    /* What our parser refuses is refused. */
    static idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    int rc = idem__http_parse_request(&hs, in, len, IDEM_HTTP_MAX_HEAD, &m);
    CHECK(rc == p->parse_rc);
    if (rc == IDEM_HTTP_INCOMPLETE)
        CHECK(p->verdict == IDEM_GW_INCOMPLETE);
    if (rc < 0 || p->target_rc != IDEM_TARGET_OK || p->body_rc < 0)
        CHECK(p->verdict == IDEM_GW_REFUSED);
    CHECK(p->used <= len);
    switch (p->verdict) {
    case IDEM_GW_INCOMPLETE:
        CHECK(p->upstream.len == 0);
        return;
    case IDEM_GW_REFUSED: {
        int s = p->refusal.status;
        CHECK(s == 400 || s == 405 || s == 413 || s == 431 || s == 500 || s == 501 || s == 505);
        CHECK(p->refusal.type != NULL && p->refusal.type[0] != '\0');
        CHECK(p->refusal.detail[0] != '\0');
        CHECK((p->refusal.allow_post || p->refusal.allow_get) == (s == 405));
        CHECK(!(p->refusal.allow_post && p->refusal.allow_get));
        CHECK(p->upstream.len == 0);
        return;
    }
    case IDEM_GW_ISSUE:
        CHECK(p->classified && p->cls.kind == IDEM_GW_TOKEN_ISSUE);
        CHECK(slice_is(p->msg.method, "POST", 4));
        CHECK(p->t.path_len == strlen(IDEM_GW_TOKENS_PATH) &&
              memcmp(p->target, IDEM_GW_TOKENS_PATH, p->t.path_len) == 0);
        CHECK(p->scoped && p->scope[0] != '\0');
        CHECK(p->upstream.len == 0);
        return;
    case IDEM_GW_PUBLISH:
        CHECK(p->classified && p->cls.kind == IDEM_GW_POLICY);
        CHECK(slice_is(p->msg.method, "GET", 3) || slice_is(p->msg.method, "HEAD", 4));
        CHECK(p->t.path_len == strlen(IDEM_GW_POLICY_PATH) &&
              memcmp(p->target, IDEM_GW_POLICY_PATH, p->t.path_len) == 0);
        CHECK(!p->scoped && p->upstream.len == 0);
        return;
    case IDEM_GW_FORWARD:
        break;
    }
    CHECK(rc > 0 && p->body_rc == IDEM_HTTP_BODY_DONE && p->classified);
    CHECK(!case_variant_of_a_route(cfg, p->msg.method));
    CHECK(p->cls.kind == IDEM_GW_PASS || p->cls.kind == IDEM_GW_TOKEN ||
          p->cls.kind == IDEM_GW_KEYED);
    CHECK(p->fingerprinted == (p->cls.kind == IDEM_GW_KEYED));
    if (p->cls.kind == IDEM_GW_KEYED)
        CHECK(p->cls.key[0] != '\0' && p->scoped && p->scope[0] != '\0');
    if (p->cls.kind == IDEM_GW_TOKEN)
        CHECK(strlen(p->cls.token) == IDEM_TOKEN_LEN && p->scoped && p->scope[0] != '\0');
    check_forwarded(cfg, p, fence);
    check_fixed_point(cfg, p, fence, ci != 3);
    check_json_respelling(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!loaded)
        load_configs();
    if (size < 1)
        return 0;
    size_t ci = data[0] % N_CONFIGS;
    const idem_config_t *cfg = &configs[ci];
    unsigned long h = fuzz_hash(data, size);
    uint64_t fence = (h & 1) ? 1 : (uint64_t)h * 2654435761u;
    char *all = exact_copy((const char *)data + 1, size - 1);
    size_t len = size - 1, off = 0;
    static idem_gw_plan_t a, b, c;

    for (int n = 0; n < MAX_MESSAGES; n++) {
        const char *in = all + off;
        size_t left = len - off;
        char *msg = exact_copy(in, left);
        plan(cfg, fence, msg, left, &a);
        plan(cfg, fence, msg, left, &b);
        same_plan(&a, &b, true);
        check_plan(ci, &a, msg, left, fence);

        /* The same bytes arriving as a prefix first. */
        size_t k = (size_t)((h >> 8) % (left + 1));
        char *prefix = exact_copy(msg, k);
        plan(cfg, fence, prefix, k, &c);
        if (c.verdict == IDEM_GW_FORWARD || c.verdict == IDEM_GW_ISSUE ||
            c.verdict == IDEM_GW_PUBLISH) {
            CHECK(a.verdict == c.verdict && k >= a.used);
            same_plan(&a, &c, false);
        } else if (a.verdict == IDEM_GW_FORWARD || a.verdict == IDEM_GW_ISSUE ||
                   a.verdict == IDEM_GW_PUBLISH) {
            CHECK(k < a.used && c.verdict == IDEM_GW_INCOMPLETE);
        }
        idem__gw_plan_cleanup(&c);
        free(prefix);

        bool more = (a.verdict == IDEM_GW_FORWARD || a.verdict == IDEM_GW_ISSUE ||
                     a.verdict == IDEM_GW_PUBLISH) &&
                    a.msg.keep_alive && a.used < left;
        size_t used = a.used;
        idem__gw_plan_cleanup(&a);
        idem__gw_plan_cleanup(&b);
        free(msg);
        if (!more)
            break;
        off += used;
        h = h * 31 + 7;
    }
    free(all);
    return 0;
}
