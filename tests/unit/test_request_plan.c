/* tests/unit/test_request_plan.c - the loop-free request path
 * (src/gateway/request_plan.c): what idemd decides before the store, and the
 * bytes it sends upstream.
 *
 * The golden tests hold the bytes idemd sent upstream, byte for byte, for
 * sample requests before the upstream head was built in request_plan.c
 * (captured from the real idemd of commit 8ce786a with a raw-socket upstream,
 * a fresh LMDB store, so fence 1); the builder must send the same.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/request_plan.h"
#include "idem/fingerprint.h"

#define UP "127.0.0.1:9000"

static idem_config_t cfg;
static idem_gw_plan_t plan;
static char dir[64];
static char path[128];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/idem-plan-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/idem.yaml", dir);
    cr_assert_eq(idem__config_defaults(&cfg), 0);
    memset(&plan, 0, sizeof plan);
}

static void teardown(void)
{
    idem__gw_plan_cleanup(&plan);
    idem__config_cleanup(&cfg);
    unlink(path);
    rmdir(dir);
}

TestSuite(request_plan, .init = setup, .fini = teardown);

/* Overlay yaml on the defaults. */
static void config(const char *yaml)
{
    char err[512];
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(yaml, 1, strlen(yaml), f), strlen(yaml));
    fclose(f);
    cr_assert_eq(idem__config_load_file(&cfg, path, err, sizeof err), 0, "%s", err);
}

/* Plan the request text (NUL-terminated; n bytes when given). */
static idem_gw_plan_t *run_n(const char *text, size_t n, uint64_t fence)
{
    idem__gw_plan_cleanup(&plan);
    cr_assert_eq(idem__gw_plan_request(&cfg, UP, fence, text, n, &plan), IDEM_OK);
    return &plan;
}
static idem_gw_plan_t *run(const char *text) { return run_n(text, strlen(text), 1); }

/* The upstream head and body as one string. */
static char *wire(const idem_gw_plan_t *p)
{
    char *s = malloc(p->upstream.len + p->body.len + 1);
    cr_assert_not_null(s);
    memcpy(s, p->upstream.data, p->upstream.len);
    if (p->body.len)
        memcpy(s + p->upstream.len, p->body.data, p->body.len);
    s[p->upstream.len + p->body.len] = '\0';
    return s;
}

static void expect_wire(const char *request, const char *sent)
{
    idem_gw_plan_t *p = run(request);
    cr_assert_eq(p->verdict, IDEM_GW_FORWARD, "not forwarded: %s", request);
    char *w = wire(p);
    cr_expect_str_eq(w, sent);
    free(w);
}

static void expect_refused(const char *request, int status, const char *type,
                           idem_outcome_t outcome)
{
    idem_gw_plan_t *p = run(request);
    cr_assert_eq(p->verdict, IDEM_GW_REFUSED, "not refused: %s", request);
    cr_expect_eq(p->refusal.status, status, "%s: %d", request, p->refusal.status);
    cr_expect_str_eq(p->refusal.type, type);
    cr_expect_eq(p->refusal.outcome, outcome);
    cr_expect_neq(p->refusal.detail[0], '\0');
    cr_expect_eq(p->upstream.len, 0);
}

/* ---- golden: the bytes proxy.c sent before the extraction ------------------- */

Test(request_plan, golden_keyed_post)
{
    expect_wire("POST /pay?x=1 HTTP/1.1\r\nHost: api\r\nIdempotency-Key: \"k1\"\r\n"
                "Content-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"amount\": 100}",
                "POST /pay?x=1 HTTP/1.1\r\nHost: api\r\nIdempotency-Key: \"k1\"\r\n"
                "Content-Type: application/json\r\nIdempotency-Fence: 1\r\nContent-Length: 15\r\n"
                "\r\n{\"amount\": 100}");
}

Test(request_plan, golden_absolute_form_chunked_connection_named)
{
    expect_wire("POST http://example.com:81/a/%7Euser/b%2a?q=%41 HTTP/1.1\r\nHost: other\r\n"
                "Connection: keep-alive, X-Drop, Idempotency-Key\r\nX-Drop: 1\r\nKeep-Alive: 5\r\n"
                "TE: trailers\r\nIdempotency-Key: k2\r\nIdempotency-Fence: 99\r\n"
                "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                "POST /a/~user/b%2A?q=%41 HTTP/1.1\r\nHost: example.com:81\r\n"
                "Idempotency-Key: k2\r\nIdempotency-Fence: 1\r\nContent-Length: 5\r\n\r\nhello");
}

Test(request_plan, golden_http10_without_host)
{
    expect_wire("GET /x HTTP/1.0\r\nUser-Agent: t\r\nProxy-Authorization: p\r\n"
                "Upgrade: websocket\r\n\r\n",
                "GET /x HTTP/1.1\r\nUser-Agent: t\r\nHost: " UP "\r\n\r\n");
}

Test(request_plan, golden_keyed_without_body)
{
    expect_wire("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k4\r\n"
                "Authorization: Bearer a\r\n\r\n",
                "POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k4\r\n"
                "Authorization: Bearer a\r\nIdempotency-Fence: 1\r\n\r\n");
}

Test(request_plan, golden_scope_headers_named_by_connection)
{
    config("scope: [header:X-User, cookie:sid]\n");
    expect_wire("POST /pay HTTP/1.1\r\nHost: h\r\n"
                "Connection: X-User, Cookie, Authorization, Trailer\r\nX-User: alice\r\n"
                "Cookie: sid=1; a=2\r\nAuthorization: Bearer x\r\nIdempotency-Key: k3\r\n"
                "Content-Length: 0\r\n\r\n",
                "POST /pay HTTP/1.1\r\nHost: h\r\nX-User: alice\r\nCookie: sid=1; a=2\r\n"
                "Authorization: Bearer x\r\nIdempotency-Key: k3\r\nIdempotency-Fence: 1\r\n"
                "Content-Length: 0\r\n\r\n");
}

/* ---- the upstream head ------------------------------------------------------ */

Test(request_plan, fence_is_the_claims)
{
    static const char req[] = "POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n";
    idem_gw_plan_t *p = run_n(req, sizeof req - 1, 18446744073709551615u);
    cr_assert_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_not_null(memmem(p->upstream.data, p->upstream.len,
                              "\r\nIdempotency-Fence: 18446744073709551615\r\n", 42));
}

Test(request_plan, pass_and_token_requests_get_no_fence)
{
    config("routes:\n  - methods: [POST]\n    path: /tok\n    mode: token\n");
    expect_wire("GET /a HTTP/1.1\r\nHost: h\r\nIdempotency-Fence: 3\r\nIdempotency-Key: k\r\n\r\n",
                "GET /a HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n");
    expect_wire("POST /tok HTTP/1.1\r\nHost: h\r\n"
                "Idempotency-Token: 0123456789abcdef0123456789ABCDEF\r\nIdempotency-Fence: 3\r\n"
                "Content-Length: 0\r\n\r\n",
                "POST /tok HTTP/1.1\r\nHost: h\r\n"
                "Idempotency-Token: 0123456789abcdef0123456789ABCDEF\r\nContent-Length: 0\r\n\r\n");
}

Test(request_plan, framing_fields_the_scope_reads_are_never_forwarded)
{
    /* Found by fuzz_request_path: the client's Transfer-Encoding went up
     * next to idemd's Content-Length. */
    config("scope: [header:Transfer-Encoding, header:Upgrade, header:Proxy-User]\n");
    idem_gw_plan_t *p = run("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                            "Transfer-Encoding: chunked\r\nUpgrade: h2c\r\nProxy-User: u\r\n"
                            "Connection: Upgrade, Proxy-User\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    cr_assert_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->scope_rc, IDEM_SCOPE_FROM_SOURCES);
    char *w = wire(p);
    cr_expect_str_eq(w, "POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                        "Proxy-User: u\r\nIdempotency-Fence: 1\r\nContent-Length: 3\r\n\r\nabc");
    free(w);
}

Test(request_plan, token_named_in_connection_is_forwarded)
{
    /* Found by fuzz_request_path: the token went missing upstream, so the
     * upstream head, sent to idemd again, was a missing-token. */
    config("routes:\n  - methods: [POST]\n    path: /tok\n    mode: token\n");
    expect_wire("POST /tok HTTP/1.1\r\nHost: h\r\nConnection: Idempotency-Token\r\n"
                "Idempotency-Token: 0123456789abcdef0123456789abcdef\r\n\r\n",
                "POST /tok HTTP/1.1\r\nHost: h\r\n"
                "Idempotency-Token: 0123456789abcdef0123456789abcdef\r\n\r\n");
}

/* A keyed request of n header fields: Host, the key and fillers, each
 * filler with a value of fill bytes. */
static char *fields(size_t n, size_t fill, const char *version)
{
    size_t cap = 64 + n * (fill + 16);
    char *s = malloc(cap);
    cr_assert_not_null(s);
    size_t o = (size_t)snprintf(s, cap, "POST /pay %s\r\nHost: h\r\nIdempotency-Key: k\r\n",
                                version);
    for (size_t i = 2; i < n; i++) {
        o += (size_t)snprintf(s + o, cap - o, "X-%03zu: ", i);
        memset(s + o, 'v', fill);
        o += fill;
        o += (size_t)snprintf(s + o, cap - o, "\r\n");
    }
    snprintf(s + o, cap - o, "\r\n");
    return s;
}

Test(request_plan, forwarded_head_keeps_within_idemds_own_limits)
{
    /* Found by fuzz_request_path: 100 fields and the Idempotency-Fence
     * idemd adds went upstream as 101, more than idemd itself takes. */
    char *r = fields(100, 1, "HTTP/1.1");
    expect_refused(r, 431, "headers-too-large", IDEM_OUT_TOO_LARGE);
    free(r);
    r = fields(99, 1, "HTTP/1.1");
    cr_expect_eq(run(r)->verdict, IDEM_GW_FORWARD);
    free(r);
    /* HTTP/1.0 without Host gets one as well: two added. */
    r = fields(99, 1, "HTTP/1.0");
    memcpy(strstr(r, "Host: h"), "X-Hos: h", 8);
    expect_refused(r, 431, "headers-too-large", IDEM_OUT_TOO_LARGE);
    free(r);
    /* Size: a head that fits 16 KiB, but not with the fence (the longest
     * one, whatever the claim's) and Content-Length. */
    size_t fill = (IDEM_HTTP_MAX_HEAD - 200) / 10;
    r = fields(12, fill, "HTTP/1.1");
    size_t len = strlen(r);
    cr_assert_lt(len, IDEM_HTTP_MAX_HEAD);
    /* Pad the last filler to leave less room than the fence takes. */
    char *big = malloc(IDEM_HTTP_MAX_HEAD + 1);
    cr_assert_not_null(big);
    size_t pad = IDEM_HTTP_MAX_HEAD - len - 20;
    memcpy(big, r, len - 4);
    memset(big + len - 4, 'w', pad);
    memcpy(big + len - 4 + pad, "\r\n\r\n", 5);
    cr_assert_eq(strlen(big), IDEM_HTTP_MAX_HEAD - 20);
    expect_refused(big, 431, "headers-too-large", IDEM_OUT_TOO_LARGE);
    cr_expect_not_null(strstr(plan.refusal.detail, "16 KiB"));
    /* Not keyed (a method no route takes), no fence added: forwarded. */
    memcpy(big, "PUTS", 4);
    cr_expect_eq(run(big)->verdict, IDEM_GW_FORWARD);
    free(big);
    free(r);
}

Test(request_plan, upstream_head_built_on_its_own)
{
    /* The builder proxy.c calls, from a request view alone. */
    static const char head[] = "PATCH /o HTTP/1.1\r\nhost: h\r\nExpect: 100-continue\r\n"
                               "Content-Length: 2\r\n\r\n";
    idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    cr_assert_eq(idem__http_parse_request(&hs, head, sizeof head - 1, IDEM_HTTP_MAX_HEAD, &m),
                 (int)sizeof head - 1);
    idem_gw_request_t rq = {.msg = &m, .target = "/o", .target_len = 2, .path_len = 2,
                            .body = (const uint8_t *)"{}", .body_len = 2};
    idem_buf_t out;
    idem__buf_init(&out, 0);
    cr_assert_eq(idem__gw_upstream_head(&out, &cfg, UP, &rq, true, 7), 0);
    cr_expect_eq(out.len, strlen("PATCH /o HTTP/1.1\r\nhost: h\r\nIdempotency-Fence: 7\r\n"
                                 "Content-Length: 2\r\n\r\n"));
    cr_expect_eq(memcmp(out.data, "PATCH /o HTTP/1.1\r\nhost: h\r\nIdempotency-Fence: 7\r\n"
                                  "Content-Length: 2\r\n\r\n", out.len), 0);
    idem__buf_cleanup(&out);
    /* A cap it cannot fit in is a failure, never a head cut short silently. */
    idem__buf_init(&out, 20);
    cr_expect_eq(idem__gw_upstream_head(&out, &cfg, UP, &rq, true, 7), -1);
    idem__buf_cleanup(&out);
}

/* ---- refusals ------------------------------------------------------------- */

Test(request_plan, parser_refusals)
{
    expect_refused("POST /pay HTTP/2.0\r\nHost: h\r\n\r\n", 505, "version-not-supported",
                   IDEM_OUT_BAD_REQUEST);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n",
                   400, "bad-request", IDEM_OUT_BAD_REQUEST);
    expect_refused("POST /pay HTTP/1.1\r\nHost : h\r\n\r\n", 400, "bad-request",
                   IDEM_OUT_BAD_REQUEST);
    static char big[IDEM_HTTP_MAX_HEAD + 64];
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    expect_refused(big, 431, "headers-too-large", IDEM_OUT_TOO_LARGE);
    cr_expect_eq(plan.parse_rc, IDEM_HTTP_E_HEAD_TOO_LARGE);
}

Test(request_plan, head_check_refusals)
{
    config("max_request_bytes: 10\n");
    expect_refused("POST /pay HTTP/1.1\r\nIdempotency-Key: k\r\n\r\n", 400, "bad-request",
                   IDEM_OUT_BAD_REQUEST);
    expect_refused("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n", 501, "not-implemented",
                   IDEM_OUT_BAD_REQUEST);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n", 413,
                   "request-too-large", IDEM_OUT_TOO_LARGE);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                   "Transfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n",
                   413, "request-too-large", IDEM_OUT_TOO_LARGE);
}

/* docs/protocol.md section 5: "post" matches no POST route, so it would pass
 * the route's mode by, and a framework that upper-cases methods runs it. */
Test(request_plan, method_case_variants_of_a_routed_method_are_refused)
{
    config("routes:\n"
           "  - {methods: [POST], path: /pay, mode: required}\n"
           "  - {methods: [PUT, DELETE], path: /tok, mode: token}\n"
           "  - {methods: [GET], path: /free, mode: off}\n");
    static const char *const variants[] = {"post", "Post", "pOST", "put", "Delete", "get"};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char req[128];
        /* Whatever the path: a route elsewhere names the method. */
        snprintf(req, sizeof req, "%s /anywhere HTTP/1.1\r\nHost: h\r\n\r\n", variants[i]);
        expect_refused(req, 400, "invalid-method", IDEM_OUT_BAD_REQUEST);
        cr_expect_not_null(strstr(plan.refusal.detail, variants[i]), "%s", plan.refusal.detail);
        cr_expect_not(plan.classified, "refused at the head, before any route or key");
    }
    /* With a body: refused before it is read, as the head's other checks. */
    expect_refused("post /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                   "Content-Length: 3\r\n\r\nabc",
                   400, "invalid-method", IDEM_OUT_BAD_REQUEST);
    cr_expect_eq(plan.body_rc, 0);
    /* The exact spelling, and methods no route names in any case, go on. */
    cr_expect_eq(run("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n")->verdict,
                 IDEM_GW_FORWARD);
    cr_expect_eq(run("patch /pay HTTP/1.1\r\nHost: h\r\n\r\n")->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(run("Posts /pay HTTP/1.1\r\nHost: h\r\n\r\n")->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(run("OPTIONS /pay HTTP/1.1\r\nHost: h\r\n\r\n")->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(run("pos /pay HTTP/1.1\r\nHost: h\r\n\r\n")->verdict, IDEM_GW_FORWARD);
}

Test(request_plan, method_case_variants_of_the_default_route)
{
    /* No routes written: POST and PATCH on every path. */
    expect_refused("post /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n", 400,
                   "invalid-method", IDEM_OUT_BAD_REQUEST);
    expect_refused("Patch /x HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid-method",
                   IDEM_OUT_BAD_REQUEST);
    /* The tokens path too: "post" there is not POST. */
    expect_refused("post /_idem/tokens HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid-method",
                   IDEM_OUT_BAD_REQUEST);
    cr_expect_eq(run("get /x HTTP/1.1\r\nHost: h\r\n\r\n")->verdict, IDEM_GW_FORWARD);
    /* idem__gw_check_head on its own, as conn.c calls it. */
    idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    static const char head[] = "pOsT / HTTP/1.1\r\nHost: h\r\n\r\n";
    cr_assert_gt(idem__http_parse_request(&hs, head, sizeof head - 1, IDEM_HTTP_MAX_HEAD, &m), 0);
    idem_gw_refusal_t r;
    cr_expect_not(idem__gw_check_head(&cfg, &m, &r));
    cr_expect_eq(r.status, 400);
    cr_expect_str_eq(r.type, "invalid-method");
}

/* ---- the upstream's answer -------------------------------------------------- */

static bool stored(const idem_http_msg_t *m, const char *name)
{
    return idem__gw_response_field_stored(&cfg.routes[0].policy, m,
                                          (idem_slice_t){name, strlen(name)});
}

static bool relayed(const idem_http_msg_t *m, const char *name)
{
    return idem__gw_response_field_relayed(&cfg.routes[0].policy, m,
                                           (idem_slice_t){name, strlen(name)});
}

Test(request_plan, upstream_fields_stored_and_relayed)
{
    static const char head[] = "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                               "X-Idempotent-Replay: true\r\nConnection: X-Hop\r\n"
                               "X-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n"
                               "Set-Cookie: a=b\r\nProxy-Thing: p\r\n\r\n";
    idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    cr_assert_gt(idem__http_parse_response(&hs, head, sizeof head - 1, IDEM_HTTP_MAX_HEAD,
                                           (idem_slice_t){"POST", 4}, &m),
                 0);
    static const struct {
        const char *name;
        bool stored, relayed;
    } want[] = {
        {"Content-Type", true, true},    {"X-Idempotent-Replay", false, false},
        {"Connection", false, false},    {"X-Hop", false, false},
        {"Keep-Alive", false, false},    {"Content-Length", false, false},
        {"Set-Cookie", false, true},     {"Proxy-Thing", false, false},
    };
    const idem_policy_t *p = &cfg.routes[0].policy;
    cr_assert_eq(m.n_fields, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < m.n_fields; i++) {
        cr_expect_eq(idem__gw_response_field_stored(p, &m, m.fields[i].name), want[i].stored,
                     "stored %s", want[i].name);
        cr_expect_eq(idem__gw_response_field_relayed(p, &m, m.fields[i].name), want[i].relayed,
                     "relayed %s", want[i].name);
    }
    /* Case-insensitive, and asked by a name from elsewhere. */
    cr_expect_not(stored(&m, "x-idempotent-REPLAY"));
    cr_expect_not(relayed(&m, "x-idempotent-REPLAY"));
    cr_expect_not(stored(&m, "x-hop"));
    cr_expect_not(stored(&m, "transfer-encoding"));
    cr_expect_not(relayed(&m, "content-length"));
    cr_expect(stored(&m, "x-idempotent-replayed"));
    cr_expect(relayed(&m, "Idempotent-Replayed"));
    /* Set-Cookie (replay_drop_headers' default): on the first answer only. */
    cr_expect_not(stored(&m, "set-COOKIE"));
    cr_expect(relayed(&m, "set-COOKIE"));
}

Test(request_plan, replay_drop_headers_and_markers_are_the_routes)
{
    config("defaults: {replay_drop_headers: [X-Csrf], replay_marker: [Idempotent-Replayed, "
           "X-Replayed]}\n"
           "routes:\n"
           "  - {methods: [POST], path: /a}\n"
           "  - {methods: [POST], path: /b, replay_drop_headers: [], replay_marker: [X-R]}\n");
    static const char head[] = "HTTP/1.1 200 OK\r\nSet-Cookie: s=1\r\nX-CSRF: t\r\n"
                               "Idempotent-Replayed: x\r\nX-R: y\r\nContent-Length: 0\r\n\r\n";
    idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    cr_assert_gt(idem__http_parse_response(&hs, head, sizeof head - 1, IDEM_HTTP_MAX_HEAD,
                                           (idem_slice_t){"POST", 4}, &m),
                 0);
    const idem_policy_t *a = &cfg.routes[0].policy, *b = &cfg.routes[1].policy;
    idem_slice_t cookie = {"Set-Cookie", 10}, csrf = {"x-csrf", 6},
                 stripe = {"IDEMPOTENT-REPLAYED", 19}, xr = {"X-R", 3};
    /* /a: Set-Cookie no longer dropped (the list was replaced), X-Csrf is. */
    cr_expect(idem__gw_response_field_stored(a, &m, cookie));
    cr_expect_not(idem__gw_response_field_stored(a, &m, csrf));
    cr_expect(idem__gw_response_field_relayed(a, &m, csrf));
    cr_expect_not(idem__gw_response_field_stored(a, &m, stripe));
    cr_expect_not(idem__gw_response_field_relayed(a, &m, stripe));
    cr_expect(idem__gw_response_field_stored(a, &m, xr));
    /* /b: nothing dropped, its own marker. */
    cr_expect(idem__gw_response_field_stored(b, &m, cookie));
    cr_expect(idem__gw_response_field_stored(b, &m, csrf));
    cr_expect(idem__gw_response_field_stored(b, &m, stripe));
    cr_expect_not(idem__gw_response_field_stored(b, &m, xr));
    cr_expect_not(idem__gw_response_field_relayed(b, &m, xr));
}

Test(request_plan, upstream_replay_marker_is_the_configured_one)
{
    config("replay_header: Idempotent-Replayed\n");
    static const char head[] = "HTTP/1.1 200 OK\r\nIdempotent-Replayed: true\r\n"
                               "X-Idempotent-Replay: true\r\nContent-Length: 0\r\n\r\n";
    idem_http_msg_t m;
    idem_http_head_state_t hs = {0};
    cr_assert_gt(idem__http_parse_response(&hs, head, sizeof head - 1, IDEM_HTTP_MAX_HEAD,
                                           (idem_slice_t){"POST", 4}, &m),
                 0);
    cr_expect_not(stored(&m, "idempotent-replayed"));
    cr_expect_not(relayed(&m, "Idempotent-Replayed"));
    /* Not idemd's marker here: the upstream's own header, kept. */
    cr_expect(stored(&m, "X-Idempotent-Replay"));
    cr_expect(relayed(&m, "X-Idempotent-Replay"));
}

Test(request_plan, target_and_body_refusals)
{
    expect_refused("POST /a/%2e%2E/b HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n", 400,
                   "invalid-target", IDEM_OUT_BAD_REQUEST);
    cr_expect_eq(plan.target_rc, IDEM_TARGET_E_DOT);
    expect_refused("GET http://h/x%2fy HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid-target",
                   IDEM_OUT_BAD_REQUEST);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                   "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
                   400, "bad-request", IDEM_OUT_BAD_REQUEST);
    cr_expect_str_eq(plan.refusal.detail, "malformed request body");
}

Test(request_plan, classification_refusals)
{
    config("routes:\n"
           "  - {methods: [POST], path: /pay, mode: required}\n"
           "  - {methods: [POST], path: /tok, mode: token}\n");
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\n\r\n", 400, "missing-key",
                   IDEM_OUT_MISSING_KEY);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: a b\r\n\r\n", 400,
                   "invalid-key", IDEM_OUT_INVALID_KEY);
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: a\r\nIdempotency-Key: a\r\n\r\n",
                   400, "invalid-key", IDEM_OUT_INVALID_KEY);
    cr_expect_str_eq(plan.refusal.detail, "the Idempotency-Key header was given more than once");
    expect_refused("POST /tok HTTP/1.1\r\nHost: h\r\n\r\n", 400, "missing-token",
                   IDEM_OUT_MISSING_TOKEN);
    expect_refused("POST /tok HTTP/1.1\r\nHost: h\r\nIdempotency-Token: abc\r\n\r\n", 400,
                   "invalid-token", IDEM_OUT_INVALID_TOKEN);
    expect_refused("GET /_idem/tokens HTTP/1.1\r\nHost: h\r\n\r\n", 405, "method-not-allowed",
                   IDEM_OUT_BAD_REQUEST);
    cr_expect(plan.refusal.allow_post);
    cr_expect_eq(plan.cls.kind, IDEM_GW_TOKEN_ISSUE);
}

Test(request_plan, ambiguous_scope)
{
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nAuthorization: a\r\nAuthorization: b\r\n"
                   "Idempotency-Key: k\r\n\r\n",
                   400, "ambiguous-scope", IDEM_OUT_BAD_REQUEST);
    cr_expect_str_eq(plan.refusal.detail, "the Authorization header was given more than once, "
                                          "so the caller is ambiguous");
    /* A request that goes through without the store never reads the scope. */
    cr_expect_eq(run("GET /pay HTTP/1.1\r\nHost: h\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n")
                     ->verdict,
                 IDEM_GW_FORWARD);
    cr_expect(!plan.scoped);
}

/* ---- decisions ----------------------------------------------------------- */

Test(request_plan, kinds)
{
    config("routes:\n"
           "  - {methods: [POST], path: /pay, mode: required}\n"
           "  - {methods: [PUT], path: /opt, mode: optional}\n"
           "  - {methods: [POST], path: /tok, mode: token}\n"
           "  - {methods: [POST], path: /off, mode: off}\n");
    idem_gw_plan_t *p = run("POST /pay/1 HTTP/1.1\r\nHost: h\r\nIdempotency-Key: \"a\\\"b\"\r\n\r\n");
    cr_assert_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->cls.kind, IDEM_GW_KEYED);
    cr_expect_str_eq(p->cls.key, "a\"b");
    cr_expect_str_eq(p->cls.route->path, "/pay");
    cr_expect(p->fingerprinted && p->scoped);
    cr_expect_str_eq(p->scope, "anonymous");
    cr_expect_eq(p->scope_rc, IDEM_SCOPE_FALLBACK_ANONYMOUS);

    p = run("PUT /opt HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->cls.kind, IDEM_GW_PASS);
    cr_expect(!p->fingerprinted && !p->scoped);

    p = run("POST /off HTTP/1.1\r\nHost: h\r\nIdempotency-Key: a b c\r\n\r\n");
    cr_expect_eq(p->cls.kind, IDEM_GW_PASS);
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);

    p = run("POST /tok HTTP/1.1\r\nHost: h\r\nIdempotency-Token: \"0123456789ABCDEF0123456789abcdef\"\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->cls.kind, IDEM_GW_TOKEN);
    cr_expect_str_eq(p->cls.token, "0123456789abcdef0123456789abcdef");

    p = run("POST http://h/_id%65m/tokens HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_ISSUE);
    cr_expect_eq(p->cls.kind, IDEM_GW_TOKEN_ISSUE);
    cr_expect_eq(p->upstream.len, 0);

    p = run("DELETE /nowhere HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->cls.kind, IDEM_GW_PASS);
    cr_expect_null(p->cls.route);
    cr_expect_eq(p->cls.policy, &cfg.defaults);
}

Test(request_plan, one_fingerprint_for_spellings_of_a_request)
{
    config("defaults:\n  fingerprint_body: json\n  fingerprint_ignore: [/t]\n");
    uint8_t fp[IDEM_FP_LEN];
    idem_gw_plan_t *p = run("POST /a/~b?q=1 HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                            "Content-Length: 22\r\n\r\n{\"x\":1.0,\"y\":[],\"t\":1}");
    cr_assert(p->fingerprinted);
    memcpy(fp, p->fp, sizeof fp);
    p = run("POST http://other/a/%7Eb?q=1 HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
            "10\r\n{ \"t\": 2, \"y\": [\r\na\r\n ], \"x\":1}\r\n0\r\n\r\n");
    cr_assert(p->fingerprinted);
    cr_expect_eq(memcmp(fp, p->fp, sizeof fp), 0);
    /* Another number is another request. */
    p = run("POST /a/~b?q=1 HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
            "Content-Length: 22\r\n\r\n{\"x\":1.1,\"y\":[],\"t\":1}");
    cr_expect_neq(memcmp(fp, p->fp, sizeof fp), 0);
}

Test(request_plan, expect_continue_checks_the_head_first)
{
    /* Nothing after the head: the head is checked and the client invited. */
    idem_gw_plan_t *p = run("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                            "Expect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_INCOMPLETE);
    cr_expect(p->invite && p->classified);
    /* Refused at the head: answered at once, before any body. */
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
                   400, "missing-key", IDEM_OUT_MISSING_KEY);
    cr_expect(!plan.invite);
    /* The body came with the head: no invitation, the body is read first. */
    expect_refused("POST /pay HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                   "Transfer-Encoding: chunked\r\n\r\nzz\r\n",
                   400, "bad-request", IDEM_OUT_BAD_REQUEST);
    cr_expect(!plan.invite);
}

Test(request_plan, incomplete_and_pipelined)
{
    cr_expect_eq(run("POST /pay HTTP/1.1\r\nHost: h\r\n")->verdict, IDEM_GW_INCOMPLETE);
    cr_expect_eq(plan.parse_rc, IDEM_HTTP_INCOMPLETE);
    cr_expect_eq(run("POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\nContent-Length: 5\r\n\r\nab")
                     ->verdict,
                 IDEM_GW_INCOMPLETE);
    cr_expect_eq(plan.body_rc, IDEM_HTTP_INCOMPLETE);
    static const char two[] = "POST /pay HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n"
                              "Content-Length: 2\r\n\r\nabGET / HTTP/1.1\r\nHost: h\r\n\r\n";
    idem_gw_plan_t *p = run(two);
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->used, strlen(two) - strlen("GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
    cr_expect_eq(p->body.len, 2);
}

Test(request_plan, cleanup_of_null_and_twice)
{
    idem__gw_plan_cleanup(NULL);
    run("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    idem__gw_plan_cleanup(&plan);
    idem__gw_plan_cleanup(&plan);
}

/* ---- where the key comes from (key_from) ------------------------------------ */

/* A POST to path with the extra header lines and the body. */
static idem_gw_plan_t *post(const char *to, const char *headers, const char *body)
{
    static char text[4096];
    snprintf(text, sizeof text, "POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %zu\r\n\r\n%s",
             to, headers, strlen(body), body);
    return run(text);
}

static void expect_key(const idem_gw_plan_t *p, const char *key)
{
    cr_assert_eq(p->verdict, IDEM_GW_FORWARD, "refused: %s", p->refusal.detail);
    cr_expect_eq(p->cls.kind, IDEM_GW_KEYED);
    cr_expect_str_eq(p->cls.key, key);
    cr_expect_not(p->cls.key_in_body);
    cr_expect(p->fingerprinted);
}

static void expect_refusal(const idem_gw_plan_t *p, int status, const char *type)
{
    cr_assert_eq(p->verdict, IDEM_GW_REFUSED, "not refused");
    cr_expect_eq(p->refusal.status, status);
    cr_expect_str_eq(p->refusal.type, type);
    cr_expect_eq(p->upstream.len, 0);
    cr_expect_not(p->fingerprinted);
}

Test(request_plan, key_from_another_header)
{
    config("routes:\n"
           "  - {methods: [POST], path: /pp, key_from: header:PayPal-Request-Id}\n"
           "  - {methods: [POST], path: /opt, mode: optional, key_from: header:X-Request-Id}\n");
    expect_key(post("/pp", "PayPal-Request-Id: abc\r\n", ""), "abc");
    expect_key(post("/pp", "paypal-request-id: \"q,1\"\r\n", ""), "q,1");
    /* Idempotency-Key is no key here: it is forwarded as any field. */
    expect_refusal(post("/pp", "Idempotency-Key: abc\r\n", ""), 400, "missing-key");
    cr_expect(strstr(plan.refusal.detail, "PayPal-Request-Id") != NULL, "%s", plan.refusal.detail);
    expect_refusal(post("/pp", "PayPal-Request-Id: a,b\r\n", ""), 400, "invalid-key");
    expect_refusal(post("/pp", "PayPal-Request-Id: a\r\nPayPal-Request-Id: a\r\n", ""), 400,
                   "invalid-key");
    cr_expect_str_eq(plan.refusal.detail, "the PayPal-Request-Id header was given more than once");
    /* Optional: no key, no store. */
    idem_gw_plan_t *p = post("/opt", "Idempotency-Key: abc\r\n", "");
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->cls.kind, IDEM_GW_PASS);
    expect_key(post("/opt", "X-Request-Id: r-1\r\n", ""), "r-1");
}

Test(request_plan, key_from_a_json_pointer)
{
    config("defaults: {key_from: \"json:/data/events/1/id\"}\n"
           "routes:\n"
           "  - {methods: [POST], path: /hook}\n"
           "  - {methods: [POST], path: /opt, mode: optional}\n"
           "  - {methods: [POST], path: /tilde, key_from: \"json:/a~1b/m~0n\"}\n");
    expect_key(post("/hook", "", "{\"data\":{\"events\":[{\"id\":\"x\"},{\"id\":\"evt_2\"}]}}"),
               "evt_2");
    expect_key(post("/hook", "", "{\"data\":{\"events\":[0,{\"id\":-42}]}}"), "-42");
    expect_key(post("/hook", "", "{\"data\":{\"events\":[0,{\"id\":\"a,b c\"}]}}"), "a,b c");
    expect_key(post("/tilde", "", "{\"a/b\":{\"m~n\":7}}"), "7");
    /* Missing: 400 missing-key when required, passed when optional. */
    expect_refusal(post("/hook", "", "{\"data\":{\"events\":[{\"id\":\"x\"}]}}"), 400,
                   "missing-key");
    expect_refusal(post("/hook", "Idempotency-Key: k\r\n", "{}"), 400, "missing-key");
    idem_gw_plan_t *p = post("/opt", "", "{\"data\":{}}");
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
    cr_expect_eq(p->cls.kind, IDEM_GW_PASS);
    cr_expect_not(p->fingerprinted);
    /* Not JSON, or the wrong type: 400 invalid-key, even when optional. */
    expect_refusal(post("/hook", "", "id=1"), 400, "invalid-key");
    expect_refusal(post("/hook", "", ""), 400, "invalid-key");
    expect_refusal(post("/opt", "", "{\"a\":1,\"a\":2}"), 400, "invalid-key");
    static const char *const wrong[] = {"true", "null", "1.5", "1e3", "1.0", "{}", "[]",
                                        "\"\"", "\"\\u00e9\"", "\"a\\nb\"", "01"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"data\":{\"events\":[0,{\"id\":%s}]}}", wrong[i]);
        p = post("/hook", "", body);
        if (strcmp(wrong[i], "01") == 0) { /* not JSON at all */
            expect_refusal(p, 400, "invalid-key");
            continue;
        }
        cr_expect_eq(p->verdict, IDEM_GW_REFUSED, "%s accepted", wrong[i]);
        cr_expect_str_eq(p->refusal.type, "invalid-key", "%s", wrong[i]);
    }
    /* 255 characters pass, 256 do not. */
    char body[600], id[300];
    memset(id, 'k', 256);
    id[255] = '\0';
    snprintf(body, sizeof body, "{\"data\":{\"events\":[0,{\"id\":\"%s\"}]}}", id);
    expect_key(post("/hook", "", body), id);
    id[255] = 'k';
    id[256] = '\0';
    snprintf(body, sizeof body, "{\"data\":{\"events\":[0,{\"id\":\"%s\"}]}}", id);
    expect_refusal(post("/hook", "", body), 400, "invalid-key");
}

Test(request_plan, key_from_json_waits_for_the_body_after_100_continue)
{
    config("defaults: {key_from: \"json:/id\"}\n");
    /* The head alone: invited (the key is not known yet), nothing refused. */
    idem_gw_plan_t *p = run("POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                            "Content-Length: 10\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_INCOMPLETE);
    cr_expect(p->invite);
    cr_expect(p->cls.key_in_body);
    cr_expect_str_eq(p->cls.key, "");
}

Test(request_plan, the_policy_path_is_idemds_own)
{
    config("routes:\n  - {methods: [POST], path: /}\n");
    idem_gw_plan_t *p = run("GET /_idem/policy HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_PUBLISH);
    cr_expect_eq(p->cls.kind, IDEM_GW_POLICY);
    cr_expect_eq(p->upstream.len, 0);
    p = run("HEAD /_idem/%70olicy HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_PUBLISH);
    expect_refused("POST /_idem/policy HTTP/1.1\r\nHost: h\r\nIdempotency-Key: k\r\n\r\n", 405,
                   "method-not-allowed", IDEM_OUT_BAD_REQUEST);
    cr_expect(plan.refusal.allow_get);
    cr_expect_not(plan.refusal.allow_post);
    /* Only that path: below it is the upstream's. */
    p = run("GET /_idem/policy/x HTTP/1.1\r\nHost: h\r\n\r\n");
    cr_expect_eq(p->verdict, IDEM_GW_FORWARD);
}
