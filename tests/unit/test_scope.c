/* tests/unit/test_scope.c - the caller's scope from its sources (src/gateway/scope.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "gateway/scope.h"
#include "idem/fingerprint.h"

static char head[8192];
static idem_http_msg_t msg;

/* Parse a request whose header lines are given (each without CRLF). */
static const idem_http_msg_t *req(const char *const *lines, size_t n)
{
    size_t o = (size_t)snprintf(head, sizeof head, "POST /pay HTTP/1.1\r\nHost: x\r\n");
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(head + o, sizeof head - o, "%s\r\n", lines[i]);
    o += (size_t)snprintf(head + o, sizeof head - o, "\r\n");
    idem_http_head_state_t st;
    memset(&st, 0, sizeof st);
    memset(&msg, 0, sizeof msg);
    cr_assert_gt(idem__http_parse_request(&st, head, o, IDEM_HTTP_MAX_HEAD, &msg), 0);
    return &msg;
}
#define REQ(...) req((const char *const[]){__VA_ARGS__}, sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))
#define NOREQ() req(NULL, 0)

static idem_scope_source_t src(const char *text)
{
    idem_scope_source_t s;
    char why[160];
    cr_assert_eq(idem__gw_scope_parse_source(text, &s, why, sizeof why), 0, "%s: %s", text, why);
    return s;
}

static void sha(const char *v, char *out) { idem_sha256_hex(v, strlen(v), out); }

/* ---- parsing sources ------------------------------------------------------ */

Test(scope, parse_every_source_kind)
{
    idem_scope_source_t s = src("authorization");
    cr_expect_eq(s.kind, IDEM_SCOPE_SRC_AUTHORIZATION);
    s = src("header:X-User");
    cr_expect_eq(s.kind, IDEM_SCOPE_SRC_HEADER);
    cr_expect_str_eq(s.name, "X-User");
    s = src("cookie:session_id");
    cr_expect_eq(s.kind, IDEM_SCOPE_SRC_COOKIE);
    cr_expect_str_eq(s.name, "session_id");
    s = src("jwt:org.id");
    cr_expect_eq(s.kind, IDEM_SCOPE_SRC_JWT);
    cr_expect_str_eq(s.name, "org.id");
    s = src("client_cert");
    cr_expect_eq(s.kind, IDEM_SCOPE_SRC_CLIENT_CERT);
}

Test(scope, header_authorization_is_the_authorization_source)
{
    cr_expect_eq(src("header:authorization").kind, IDEM_SCOPE_SRC_AUTHORIZATION);
    cr_expect_eq(src("header:AUTHORIZATION").kind, IDEM_SCOPE_SRC_AUTHORIZATION);
}

Test(scope, parse_refuses_what_is_not_a_source)
{
    const char *bad[] = {"", "Authorization", "header:", "header:a b", "header:x:y",
                         "cookie:", "cookie:a=b", "cookie:a;b", "jwt:", "jwt:.a", "jwt:a.",
                         "jwt:a..b", "jwt:a/b", "client_cert:x", "bearer", "header"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_scope_source_t s;
        char why[160] = "";
        cr_expect_eq(idem__gw_scope_parse_source(bad[i], &s, why, sizeof why), -1, "%s", bad[i]);
        cr_expect_neq(why[0], '\0', "%s", bad[i]);
    }
}

Test(scope, parse_refuses_a_name_over_the_limit)
{
    char text[IDEM_SCOPE_NAME_MAX + 16];
    idem_scope_source_t s;
    char why[160];
    memcpy(text, "header:", 7);
    memset(text + 7, 'a', IDEM_SCOPE_NAME_MAX);
    text[7 + IDEM_SCOPE_NAME_MAX] = '\0';
    cr_expect_eq(idem__gw_scope_parse_source(text, &s, why, sizeof why), 0);
    text[7 + IDEM_SCOPE_NAME_MAX] = 'a';
    text[8 + IDEM_SCOPE_NAME_MAX] = '\0';
    cr_expect_eq(idem__gw_scope_parse_source(text, &s, why, sizeof why), -1);
}

Test(scope, every_source_kind_is_supported)
{
    cr_expect_null(idem__gw_scope_unsupported(IDEM_SCOPE_SRC_AUTHORIZATION));
    cr_expect_null(idem__gw_scope_unsupported(IDEM_SCOPE_SRC_HEADER));
    cr_expect_null(idem__gw_scope_unsupported(IDEM_SCOPE_SRC_COOKIE));
    cr_expect_null(idem__gw_scope_unsupported(IDEM_SCOPE_SRC_JWT));
    cr_expect_null(idem__gw_scope_unsupported(IDEM_SCOPE_SRC_CLIENT_CERT));
}

Test(scope, source_text_is_what_was_written)
{
    const char *texts[] = {"authorization", "header:X-User", "cookie:sid", "jwt:sub",
                           "client_cert"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        idem_scope_source_t s = src(texts[i]);
        char out[200];
        idem__gw_scope_source_text(&s, out, sizeof out);
        cr_expect_str_eq(out, texts[i]);
    }
}

/* ---- cookies ---------------------------------------------------------------- */

static const char *cookie(const char *hdr, const char *name)
{
    static char v[256];
    idem_slice_t s;
    if (!idem__gw_cookie_get(hdr, strlen(hdr), name, &s))
        return NULL;
    snprintf(v, sizeof v, "%.*s", (int)s.len, s.ptr);
    return v;
}

Test(scope, cookie_pairs_are_found_by_exact_name)
{
    cr_expect_str_eq(cookie("a=1; sid=abc; b=2", "sid"), "abc");
    cr_expect_str_eq(cookie("sid=abc", "sid"), "abc");
    cr_expect_str_eq(cookie("a=1;sid=abc", "sid"), "abc");
    cr_expect_str_eq(cookie(" sid = abc ;x=1", "sid"), "abc");
    cr_expect_null(cookie("SID=abc", "sid"));
    cr_expect_null(cookie("xsid=abc; sidx=1", "sid"));
    cr_expect_null(cookie("a=sid=1", "sid"));
    cr_expect_null(cookie("", "sid"));
}

Test(scope, cookie_first_of_a_name_wins)
{
    cr_expect_str_eq(cookie("sid=first; sid=second", "sid"), "first");
}

Test(scope, cookie_value_is_kept_as_sent)
{
    cr_expect_str_eq(cookie("sid=\"quoted value\"", "sid"), "\"quoted value\"");
    cr_expect_str_eq(cookie("sid=a=b", "sid"), "a=b");
    cr_expect_str_eq(cookie("sid=", "sid"), "");
}

Test(scope, cookie_pairs_without_equals_are_skipped)
{
    cr_expect_str_eq(cookie("junk; ;;sid=1", "sid"), "1");
    cr_expect_null(cookie("sid", "sid"));
}

/* ---- computing the scope ----------------------------------------------------- */

Test(scope, legacy_rule_is_the_old_one)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "Authorization", NOREQ(), NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    cr_expect_str_eq(out, "anonymous");
    sha("Bearer a", want);
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "Authorization", REQ("Authorization: Bearer a"),
                                        NULL, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
    /* scope_header: X-Api-Key ignores Authorization, and without it is anonymous. */
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "X-Api-Key", REQ("Authorization: Bearer a"),
                                        NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    cr_expect_str_eq(out, "anonymous");
    sha("k1", want);
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "X-Api-Key", REQ("x-api-key: k1"), NULL, out,
                                        NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
    /* An empty value is hashed, as before. */
    sha("", want);
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "X-Api-Key", REQ("X-Api-Key:"), NULL, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
}

Test(scope, one_source_gives_the_values_of_scope_header)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s = src("authorization");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: Bearer a"),
                                        NULL, a, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    idem__gw_scope_compute(NULL, 0, "Authorization", REQ("Authorization: Bearer a"), NULL, b,
                           NULL);
    cr_expect_str_eq(a, b);
    s = src("header:X-User");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("X-User: u1"), NULL, a, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    idem__gw_scope_compute(NULL, 0, "X-User", REQ("X-User: u1"), NULL, b, NULL);
    cr_expect_str_eq(a, b);
}

/* The certificate's hex SHA-256, as the TLS connection hands it in. */
#define CERT_A "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
#define CERT_B "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"

Test(scope, client_cert_hashes_the_certificates_hex_sha256)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("client_cert");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", NOREQ(), CERT_A, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    sha(CERT_A, want);
    cr_expect_str_eq(out, want, "one source: the SHA-256 of its value, the hex string");
    /* Two certificates, two scopes; Authorization does not enter into it. */
    char b[IDEM_SCOPE_MAX + 1];
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: Bearer a"),
                                        CERT_B, b, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_neq(out, b);
    sha(CERT_B, want);
    cr_expect_str_eq(b, want);
}

Test(scope, client_cert_absent_falls_back_like_other_sources)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("client_cert");
    /* A plain listener's request: no verified certificate. */
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", NOREQ(), NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    cr_expect_str_eq(out, "anonymous");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: Bearer a"),
                                        NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_AUTHORIZATION);
    idem_scope_result_t fb =
        idem__gw_scope_compute(&(idem_scope_source_t){.kind = IDEM_SCOPE_SRC_HEADER,
                                                      .name = "X-None"},
                               1, "Authorization", REQ("Authorization: Bearer a"), NULL, want,
                               NULL);
    cr_expect_eq(fb, IDEM_SCOPE_FALLBACK_AUTHORIZATION);
    cr_expect_str_eq(out, want, "the same fallback as an absent header");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", NOREQ(), "", out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS, "an empty value is absent");
    /* A certificate given to a scope that does not read one changes nothing. */
    idem_scope_source_t a = src("authorization");
    char x[IDEM_SCOPE_MAX + 1], y[IDEM_SCOPE_MAX + 1];
    idem__gw_scope_compute(&a, 1, "Authorization", REQ("Authorization: Bearer a"), CERT_A, x,
                           NULL);
    idem__gw_scope_compute(&a, 1, "Authorization", REQ("Authorization: Bearer a"), NULL, y, NULL);
    cr_expect_str_eq(x, y);
}

Test(scope, client_cert_with_another_source_is_framed)
{
    idem_scope_source_t s[2] = {src("client_cert"), src("header:X-Org")};
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    cr_expect_eq(idem__gw_scope_compute(s, 2, "Authorization", REQ("X-Org: o1"), CERT_A, a, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_eq(idem__gw_scope_compute(s, 2, "Authorization", REQ("X-Org: o1"), CERT_B, b, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_neq(a, b);
    /* The frame: 4-byte length then the value, for each source in order. */
    unsigned char buf[4 + 64 + 4 + 2] = {0, 0, 0, 64};
    memcpy(buf + 4, CERT_A, 64);
    memcpy(buf + 68, (unsigned char[]){0, 0, 0, 2, 'o', '1'}, 6);
    char want[65];
    idem_sha256_hex(buf, sizeof buf, want);
    cr_expect_str_eq(a, want);
}

Test(scope, cookie_source_hashes_the_cookie_value)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("cookie:sid");
    sha("alice-session", want);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Cookie: theme=dark; sid=alice-session"), NULL, out,
                                        NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
}

Test(scope, cookie_headers_are_read_as_one_list)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("cookie:sid");
    sha("one", want);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Cookie: a=1", "Cookie: b=2; sid=one", "Cookie: c=3"),
                                        NULL, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
}

/* The fallback's value: the tagged SHA-256 of Authorization. */
static void fallback_sha(const char *auth, char *out)
{
    char buf[256];
    memcpy(buf, IDEM_SCOPE_FALLBACK_TAG, IDEM_SCOPE_FALLBACK_TAG_LEN);
    memcpy(buf + IDEM_SCOPE_FALLBACK_TAG_LEN, auth, strlen(auth));
    idem_sha256_hex(buf, IDEM_SCOPE_FALLBACK_TAG_LEN + strlen(auth), out);
}

Test(scope, named_cookie_twice_across_fields_is_ambiguous)
{
    char out[IDEM_SCOPE_MAX + 1];
    const char *dup = NULL;
    idem_scope_source_t s = src("cookie:sid");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Cookie: a=1", "Cookie: sid=one", "Cookie: sid=two"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS_COOKIE);
    cr_expect_str_eq(dup, "sid");
    /* An empty first value does not hide the second. */
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=; sid=abc"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS_COOKIE);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=a; x=1; sid=a"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS_COOKIE);
    /* Another cookie of the same prefix is not the named one. */
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=a; sid2=b"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_FROM_SOURCES);
}

Test(scope, quoted_cookie_is_its_unquoted_value)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s = src("cookie:sid");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=\"abc\""), NULL,
                                        a, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=abc"), NULL, b, NULL);
    cr_expect_str_eq(a, b);
    /* "" is empty, so absent. */
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid=\"\""), NULL, a,
                                        NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
}

Test(scope, fallback_never_equals_a_source_value)
{
    /* Authorization: 42 without X-User-Id must not reach X-User-Id: 42. */
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("header:X-User-Id");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: 42"), NULL, a,
                                        NULL),
                 IDEM_SCOPE_FALLBACK_AUTHORIZATION);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("X-User-Id: 42"), NULL, b,
                                        NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_neq(a, b);
    fallback_sha("42", want);
    cr_expect_str_eq(a, want);
    /* Nor the authorization source's value of the same text. */
    idem_scope_source_t au = src("authorization");
    idem__gw_scope_compute(&au, 1, "Authorization", REQ("Authorization: 42"), NULL, b, NULL);
    cr_expect_str_neq(a, b);
}

Test(scope, scope_missing_reject_refuses_instead_of_falling_back)
{
    char out[IDEM_SCOPE_MAX + 1];
    unsigned why = 99;
    idem_scope_source_t s = src("header:X-User-Id");
    idem_scope_env_t env = {.missing = IDEM_SCOPE_MISSING_REJECT};
    cr_expect_eq(idem__gw_scope_compute_env(&s, 1, "Authorization", REQ("Authorization: 42"),
                                            &env, out, NULL, &why),
                 IDEM_SCOPE_MISSING);
    cr_expect_eq(why, IDEM_SCOPE_WHY_ABSENT);
    cr_expect_eq(idem__gw_scope_compute_env(&s, 1, "Authorization", NOREQ(), &env, out, NULL,
                                            &why),
                 IDEM_SCOPE_MISSING);
    cr_expect_eq(idem__gw_scope_compute_env(&s, 1, "Authorization", REQ("X-User-Id: 42"), &env,
                                            out, NULL, &why),
                 IDEM_SCOPE_FROM_SOURCES);
    /* Without scope:, the scope_header is the source that may be missing. */
    cr_expect_eq(idem__gw_scope_compute_env(NULL, 0, "Authorization", NOREQ(), &env, out, NULL,
                                            &why),
                 IDEM_SCOPE_MISSING);
}

Test(scope, authorization_scheme_case_and_space_are_one_caller)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("authorization");
    sha("Bearer K", want);
    const char *forms[] = {"Authorization: Bearer K", "Authorization: bearer K",
                           "Authorization: BEARER  K", "Authorization: Bearer \t K"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        idem__gw_scope_compute(&s, 1, "Authorization", REQ(forms[i]), NULL, a, NULL);
        cr_expect_str_eq(a, want, "%s", forms[i]);
        /* The default rule (scope_header: Authorization) reads it so too. */
        idem__gw_scope_compute(NULL, 0, "Authorization", REQ(forms[i]), NULL, b, NULL);
        cr_expect_str_eq(b, want, "%s", forms[i]);
    }
    /* The credentials keep their case; an unregistered scheme is lower case. */
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: Bearer k"), NULL, a, NULL);
    cr_expect_str_neq(a, want);
    sha("mac id=1", want);
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: MAC  id=1"), NULL, a, NULL);
    cr_expect_str_eq(a, want);
    /* A value without white space is an opaque key: its case is kept. */
    sha("AbC", want);
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: AbC"), NULL, a, NULL);
    cr_expect_str_eq(a, want);
    /* scope_header naming another header is not normalised. */
    sha("bearer  K", want);
    idem__gw_scope_compute(NULL, 0, "X-Key", REQ("X-Key: bearer  K"), NULL, a, NULL);
    cr_expect_str_eq(a, want);
}

Test(scope, fallback_reads_authorization_normalised)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s = src("header:X-User-Id");
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: bearer  K"), NULL, a, NULL);
    idem__gw_scope_compute(&s, 1, "Authorization", REQ("Authorization: Bearer K"), NULL, b, NULL);
    cr_expect_str_eq(a, b);
}

Test(scope, absent_source_falls_back_to_authorization_then_anonymous)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s = src("cookie:sid");
    fallback_sha("Bearer a", want);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Authorization: Bearer a", "Cookie: other=1"), NULL,
                                        out, NULL),
                 IDEM_SCOPE_FALLBACK_AUTHORIZATION);
    cr_expect_str_eq(out, want);
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", NOREQ(), NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    cr_expect_str_eq(out, "anonymous");
}

Test(scope, empty_source_value_counts_as_absent)
{
    char out[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s = src("cookie:sid");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("Cookie: sid="), NULL, out,
                                        NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    s = src("header:X-User");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("X-User:"), NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
    cr_expect_str_eq(out, "anonymous");
}

Test(scope, several_sources_hash_their_length_framed_values)
{
    char out[IDEM_SCOPE_MAX + 1], want[65];
    idem_scope_source_t s[2] = {src("header:X-Org"), src("cookie:sid")};
    /* "\0\0\0\x02" "o1" "\0\0\0\x03" "abc" */
    const char framed[] = {0, 0, 0, 2, 'o', '1', 0, 0, 0, 3, 'a', 'b', 'c'};
    idem_sha256_hex(framed, sizeof framed, want);
    cr_expect_eq(idem__gw_scope_compute(s, 2, "Authorization",
                                        REQ("X-Org: o1", "Cookie: sid=abc"), NULL, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
    cr_expect_str_eq(out, want);
}

Test(scope, framing_keeps_value_boundaries_apart)
{
    char a[IDEM_SCOPE_MAX + 1], b[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s[2] = {src("header:X-A"), src("header:X-B")};
    idem__gw_scope_compute(s, 2, "Authorization", REQ("X-A: ab", "X-B: c"), NULL, a, NULL);
    idem__gw_scope_compute(s, 2, "Authorization", REQ("X-A: a", "X-B: bc"), NULL, b, NULL);
    cr_expect_str_neq(a, b);
}

Test(scope, one_of_several_absent_falls_back)
{
    char out[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s[2] = {src("header:X-Org"), src("cookie:sid")};
    cr_expect_eq(idem__gw_scope_compute(s, 2, "Authorization", REQ("X-Org: o1"), NULL, out, NULL),
                 IDEM_SCOPE_FALLBACK_ANONYMOUS);
}

Test(scope, authorization_twice_is_ambiguous)
{
    char out[IDEM_SCOPE_MAX + 1];
    const char *dup = NULL;
    idem_scope_source_t s = src("cookie:sid");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Authorization: a", "Cookie: sid=1",
                                            "Authorization: b"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS);
    cr_expect_str_eq(dup, "Authorization");
    cr_expect_str_eq(out, "");
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "Authorization",
                                        REQ("Authorization: a", "authorization: a"), NULL, out,
                                        &dup),
                 IDEM_SCOPE_AMBIGUOUS);
}

Test(scope, source_header_twice_is_ambiguous)
{
    char out[IDEM_SCOPE_MAX + 1];
    const char *dup = NULL;
    idem_scope_source_t s = src("header:X-User");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization", REQ("X-User: a", "x-user: b"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS);
    cr_expect_str_eq(dup, "X-User");
    cr_expect_eq(idem__gw_scope_compute(NULL, 0, "X-Api-Key", REQ("X-Api-Key: a", "X-Api-Key: a"),
                                        NULL, out, &dup),
                 IDEM_SCOPE_AMBIGUOUS);
    cr_expect_str_eq(dup, "X-Api-Key");
}

Test(scope, cookie_header_twice_without_the_named_cookie_twice_is_not_ambiguous)
{
    char out[IDEM_SCOPE_MAX + 1];
    idem_scope_source_t s = src("cookie:sid");
    cr_expect_eq(idem__gw_scope_compute(&s, 1, "Authorization",
                                        REQ("Cookie: a=1", "Cookie: sid=2"), NULL, out, NULL),
                 IDEM_SCOPE_FROM_SOURCES);
}

/* ---- forwarding ------------------------------------------------------------ */

static bool uses(const idem_scope_source_t *s, size_t n, const char *legacy, const char *name)
{
    return idem__gw_scope_uses_header(s, n, legacy, (idem_slice_t){name, strlen(name)});
}

Test(scope, headers_the_scope_reads_are_known)
{
    cr_expect(uses(NULL, 0, "Authorization", "authorization"));
    cr_expect(uses(NULL, 0, "X-Api-Key", "x-api-key"));
    cr_expect(uses(NULL, 0, "X-Api-Key", "Authorization"));
    cr_expect_not(uses(NULL, 0, "Authorization", "Cookie"));
    idem_scope_source_t s[2] = {src("header:X-Org"), src("cookie:sid")};
    cr_expect(uses(s, 2, "Authorization", "X-ORG"));
    cr_expect(uses(s, 2, "Authorization", "cookie"));
    cr_expect(uses(s, 2, "Authorization", "Authorization"));
    cr_expect_not(uses(s, 2, "Authorization", "X-Other"));
    cr_expect_not(uses(s, 2, "X-Api-Key", "X-Api-Key")); /* scope_header is not used with scope: */
}
