/* tests/unit/test_http_target.c - request targets (src/http/target.c):
 * their form and normal spelling (docs/protocol.md section 5: no spelling
 * of a path escapes its route), route prefixes, and the percent-decoding and query
 * parameters the admin listener uses for /keys/{key}. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "http/http.h"

Test(http_target, hex_digits)
{
    cr_expect_eq(idem__http_hexval('0'), 0);
    cr_expect_eq(idem__http_hexval('9'), 9);
    cr_expect_eq(idem__http_hexval('a'), 10);
    cr_expect_eq(idem__http_hexval('F'), 15);
    cr_expect_eq(idem__http_hexval('g'), -1);
    cr_expect_eq(idem__http_hexval(' '), -1);
}

Test(http_target, decodes_escapes_and_keeps_plus)
{
    char out[32];
    const char *in = "a%20b%2Fc+d%25";
    cr_assert_eq(idem__http_pct_decode(in, strlen(in), out, sizeof out), 8);
    cr_expect_str_eq(out, "a b/c+d%");
}

Test(http_target, refuses_bad_escapes_nul_and_overflow)
{
    char out[4];
    cr_expect_eq(idem__http_pct_decode("%2", 2, out, sizeof out), -1);
    cr_expect_eq(idem__http_pct_decode("%zz", 3, out, sizeof out), -1);
    cr_expect_eq(idem__http_pct_decode("a%00", 4, out, sizeof out), -1);
    cr_expect_eq(idem__http_pct_decode("abcd", 4, out, sizeof out), -1, "no room for the NUL");
    cr_expect_eq(idem__http_pct_decode("abc", 3, out, sizeof out), 3);
    cr_expect_eq(idem__http_pct_decode("", 0, out, 0), -1);
}

Test(http_target, finds_the_named_parameter_only)
{
    char out[32];
    const char *q = "xscope=1&scope=anonymous&scope=2";
    cr_assert_eq(idem__http_query_param(q, strlen(q), "scope", out, sizeof out), 9);
    cr_expect_str_eq(out, "anonymous");
    cr_expect_eq(idem__http_query_param(q, strlen(q), "key", out, sizeof out), -2);
    cr_expect_eq(idem__http_query_param("key=%G1", 7, "key", out, sizeof out), -1);
    cr_expect_eq(idem__http_query_param("key", 3, "key", out, sizeof out), -2, "no '=': absent");
}

/* ---- normalisation ---------------------------------------------------------- */

static char out[512];
static idem_http_target_t tg;

/* Normalise target; return the code. */
static int norm(const char *target)
{
    memset(out, 0x5a, sizeof out);
    return idem__http_target_normalize(target, strlen(target), out, sizeof out, &tg);
}

/* target normalises to want (origin-form), with path_len up to the '?'. */
static void norm_is(const char *target, const char *want)
{
    int rc = norm(target);
    cr_assert_eq(rc, IDEM_TARGET_OK, "%s: %s", target, idem__http_target_strerror(rc));
    cr_expect_eq(tg.len, strlen(want), "%s: length %zu", target, tg.len);
    cr_expect_str_eq(out, want, "%s", target);
    const char *q = strchr(want, '?');
    cr_expect_eq(tg.path_len, q ? (size_t)(q - want) : strlen(want), "%s: path_len", target);
}

static void norm_fails(const char *target, int code)
{
    int rc = norm(target);
    cr_expect_eq(rc, code, "%s: got %d (%s), want %d", target, rc, idem__http_target_strerror(rc),
                 code);
}

Test(http_target, origin_form_is_kept)
{
    norm_is("/", "/");
    norm_is("/payments", "/payments");
    norm_is("/a/b/", "/a/b/");
    norm_is("/a/b?x=1&y=2", "/a/b?x=1&y=2");
    norm_is("/?", "/?");
    norm_is("/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,=");
    cr_expect_eq(tg.authority.len, 0);
}

Test(http_target, escaped_unreserved_characters_are_decoded)
{
    norm_is("/%70ayments", "/payments");
    norm_is("/%70%61%79%6D%65%6E%74%73", "/payments");
    norm_is("/%41%5a%30%39%2d%5F%7e", "/AZ09-_~");
    norm_is("/a%2Eb", "/a.b");
}

Test(http_target, other_escapes_get_upper_case_hex)
{
    norm_is("/a%3ab", "/a%3Ab");
    norm_is("/caf%c3%a9", "/caf%C3%A9");
    norm_is("/a%20b%25", "/a%20b%25");
    norm_is("/a%3Bb", "/a%3Bb");
    norm_is("/a%3f?b", "/a%3F?b");
}

Test(http_target, the_query_is_kept_as_received)
{
    norm_is("/a?%70=%2F&x=../..//;\\", "/a?%70=%2F&x=../..//;\\");
    norm_is("/a??b", "/a??b");
}

Test(http_target, dot_segments_are_refused_however_spelt)
{
    const char *bad[] = {"/.",          "/..",     "/a/.",      "/a/..",   "/./a",    "/../a",
                         "/a/./b",      "/a/../b", "/%2e",      "/%2E%2e", "/.%2e/a", "/a/%2e/b",
                         "/a/%2E%2E/b", "/a/.?x",  "/a/..?x=1", "/%2e?"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        norm_fails(bad[i], IDEM_TARGET_E_DOT);
}

Test(http_target, dots_inside_a_segment_are_fine)
{
    norm_is("/...", "/...");
    norm_is("/.a/a./..b/b..", "/.a/a./..b/b..");
    norm_is("/.well-known/x", "/.well-known/x");
    norm_is("/v1.2/%2e%2e%2e", "/v1.2/...");
}

Test(http_target, encoded_slash_and_backslash_are_refused)
{
    const char *bad[] = {"/a%2Fb", "/a%2fb", "/%2F", "/a%5Cb",
                         "/a%5cb", "/a\\b",  "/\\",  "/a/%2f/"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        norm_fails(bad[i], IDEM_TARGET_E_SLASH);
}

Test(http_target, encoded_nul_is_refused)
{
    norm_fails("/a%00", IDEM_TARGET_E_NUL);
    norm_fails("/%00/a", IDEM_TARGET_E_NUL);
}

Test(http_target, empty_segments_are_refused)
{
    norm_fails("//", IDEM_TARGET_E_EMPTY);
    norm_fails("//payments", IDEM_TARGET_E_EMPTY);
    norm_fails("/a//b", IDEM_TARGET_E_EMPTY);
    norm_fails("/a/b//", IDEM_TARGET_E_EMPTY);
    norm_fails("http://h//a", IDEM_TARGET_E_EMPTY);
}

Test(http_target, path_parameters_are_refused)
{
    norm_fails("/a;b", IDEM_TARGET_E_PARAM);
    norm_fails("/;x/payments", IDEM_TARGET_E_PARAM);
    norm_fails("/payments;jsessionid=1", IDEM_TARGET_E_PARAM);
}

Test(http_target, fragments_are_refused)
{
    norm_fails("/a#b", IDEM_TARGET_E_FRAGMENT);
    norm_fails("/a?x#y", IDEM_TARGET_E_FRAGMENT);
    norm_fails("http://h#f", IDEM_TARGET_E_FRAGMENT);
    norm_fails("http://h/#", IDEM_TARGET_E_FRAGMENT);
}

Test(http_target, bad_escapes_are_refused)
{
    const char *bad[] = {"/%", "/a%", "/%2", "/a%2?x", "/%zz", "/%g0", "/%0g", "/% 1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        norm_fails(bad[i], IDEM_TARGET_E_ESCAPE);
}

Test(http_target, absolute_form_becomes_origin_form)
{
    norm_is("http://example.com/a/b?x", "/a/b?x");
    cr_expect_eq(tg.authority.len, strlen("example.com"));
    cr_expect(memcmp(tg.authority.ptr, "example.com", tg.authority.len) == 0);
    norm_is("HTTPS://Example.com:8443/x", "/x");
    norm_is("hTtP://h", "/");
    cr_expect_eq(tg.authority.len, 1);
    norm_is("http://h?q=1", "/?q=1");
    norm_is("http://[::1]:80/x", "/x");
    norm_is("http://h/%70ayments", "/payments");
    norm_is("http://x/_idem/tokens", "/_idem/tokens");
    norm_fails("http://h/a/../b", IDEM_TARGET_E_DOT);
}

Test(http_target, other_forms_are_refused)
{
    const char *bad[] =
        {"",
         "*",
         "payments",
         "http:/payments",
         "payments:/payments",
         "http:payments",
         "ftp://h/x",
         "httpx://h/",
         "http//h/x",
         "http://",
         "http:///x",
         "http://?x",
         "http://user@h/x",
         "http://u:p@h/x",
         "http://h\"/x",
         "example.com:443",
         "1http://h/",
         "?x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        norm_fails(bad[i], IDEM_TARGET_E_FORM);
}

Test(http_target, too_small_an_output_is_refused_and_n_plus_2_always_fits)
{
    char small[4];
    idem_http_target_t t;
    cr_expect_eq(idem__http_target_normalize("/abcd", 5, small, sizeof small, &t),
                 IDEM_TARGET_E_SPACE);
    cr_expect_eq(idem__http_target_normalize("/a?bcd", 6, small, sizeof small, &t),
                 IDEM_TARGET_E_SPACE);
    cr_expect_eq(idem__http_target_normalize("/%C3", 4, small, sizeof small, &t),
                 IDEM_TARGET_E_SPACE);
    cr_expect_eq(idem__http_target_normalize("/abc", 4, small, 0, &t), IDEM_TARGET_E_SPACE);
    const char *fits[] = {"/", "/%41", "/%c3", "/a?b", "http://h", "http://h?q", "/a%2e"};
    for (size_t i = 0; i < sizeof fits / sizeof *fits; i++) {
        size_t n = strlen(fits[i]);
        char buf[32];
        cr_expect_eq(idem__http_target_normalize(fits[i], n, buf, n + 2, &t), IDEM_TARGET_OK,
                     "%s", fits[i]);
    }
}

/* A small PRNG, so the random cases are the same on every run. */
static uint64_t rng = 0x9e3779b97f4a7c15u;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* Decode a normalised path fully (every escape). */
static size_t decode_all(const char *p, size_t n, char *dst)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '%' && i + 2 < n) {
            dst[k++] = (char)(idem__http_hexval(p[i + 1]) * 16 + idem__http_hexval(p[i + 2]));
            i += 2;
        } else {
            dst[k++] = p[i];
        }
    }
    return k;
}

/* Over random targets built from the characters that matter: an accepted
 * target's normal form is no longer than it, is its own normal form, holds
 * only valid upper-case escapes of characters that are not unreserved, and
 * its decoded path has no "." / ".." / empty segment, no '\', ';' or NUL,
 * and no '/' that was escaped. */
Test(http_target, normal_forms_are_fixed_points_without_ambiguity)
{
    static const char *const atoms[] = {"/",   "/",   "a",   "B",      ".",        "..",  "%2e",
                                        "%2E", "%2f", "%2F", "%5c",    "%00",      "%41", "%61",
                                        "%3a", "%3A", "%25", "%",      "%g",       ";",   "\\",
                                        "?",   "#",   "~",   "-",      "_",        ":",   "@",
                                        "!",   "%7e", "%20", "%c3%a9", "http://h", "x"};
    char target[256], again[300], dec[300];
    size_t accepted = 0;
    for (int round = 0; round < 200000; round++) {
        size_t n = 0;
        unsigned parts = 1 + rnd(8);
        for (unsigned k = 0; k < parts; k++) {
            const char *a = atoms[rnd(sizeof atoms / sizeof *atoms)];
            size_t al = strlen(a);
            if (n + al >= sizeof target)
                break;
            memcpy(target + n, a, al);
            n += al;
        }
        target[n] = '\0';
        idem_http_target_t t, t2;
        if (idem__http_target_normalize(target, n, out, sizeof out, &t) != IDEM_TARGET_OK)
            continue;
        accepted++;
        cr_assert_leq(t.len, n, "%s", target);
        cr_assert_eq(out[t.len], '\0');
        cr_assert_eq(out[0], '/', "%s", target);
        cr_assert_eq(idem__http_target_normalize(out, t.len, again, sizeof again, &t2),
                     IDEM_TARGET_OK, "%s -> %s", target, out);
        cr_assert_eq(t2.len, t.len, "%s -> %s -> %s", target, out, again);
        cr_assert(memcmp(out, again, t.len) == 0, "%s -> %s -> %s", target, out, again);
        for (size_t i = 0; i < t.path_len; i++) {
            char c = out[i];
            cr_assert(c != '\\' && c != ';' && c != '#', "%s -> %s", target, out);
            if (c == '%') {
                cr_assert(i + 2 < t.path_len, "%s -> %s", target, out);
                int v = idem__http_hexval(out[i + 1]) * 16 + idem__http_hexval(out[i + 2]);
                cr_assert(strchr("0123456789ABCDEF", out[i + 1]) &&
                              strchr("0123456789ABCDEF", out[i + 2]),
                          "%s -> %s", target, out);
                cr_assert(v != 0 && v != '/' && v != '\\', "%s -> %s", target, out);
                cr_assert(!((v >= 'a' && v <= 'z') || (v >= 'A' && v <= 'Z') ||
                            (v >= '0' && v <= '9') || v == '-' || v == '.' || v == '_' ||
                            v == '~'),
                          "%s -> %s", target, out);
            }
        }
        size_t dn = decode_all(out, t.path_len, dec);
        dec[dn] = '\0';
        cr_assert_null(strstr(dec, "//"), "%s -> %s", target, out);
        cr_assert_null(strstr(dec, "/./"), "%s -> %s", target, out);
        cr_assert_null(strstr(dec, "/../"), "%s -> %s", target, out);
        cr_assert(!(dn >= 2 && strcmp(dec + dn - 2, "/.") == 0), "%s -> %s", target, out);
        cr_assert(!(dn >= 3 && strcmp(dec + dn - 3, "/..") == 0), "%s -> %s", target, out);
        cr_assert(idem__http_path_has_prefix(out, t.path_len, out, t.path_len));
    }
    cr_expect_gt(accepted, 1000, "the random targets must exercise the accepting side too");
}

/* ---- route prefixes ------------------------------------------------------ */

static long prefix_norm(const char *p)
{
    return idem__http_path_normalize(p, strlen(p), true, out, sizeof out);
}

Test(http_target, a_prefix_may_end_inside_a_segment)
{
    cr_expect_eq(prefix_norm("/pay"), 4);
    cr_expect_str_eq(out, "/pay");
    cr_expect_eq(prefix_norm("/a/."), 4, "'/a/.' covers /a/.well-known");
    cr_expect_eq(prefix_norm("/%2e"), 2);
    cr_expect_str_eq(out, "/.");
    cr_expect_eq(prefix_norm("/v1/%70ay"), 7);
    cr_expect_str_eq(out, "/v1/pay");
    cr_expect_eq(prefix_norm("/a/./"), IDEM_TARGET_E_DOT);
    cr_expect_eq(prefix_norm("/a/../b"), IDEM_TARGET_E_DOT);
    cr_expect_eq(prefix_norm("/a//"), IDEM_TARGET_E_EMPTY);
    cr_expect_eq(prefix_norm("/a%2f"), IDEM_TARGET_E_SLASH);
    cr_expect_eq(prefix_norm("/a;"), IDEM_TARGET_E_PARAM);
    cr_expect_eq(prefix_norm("/a%"), IDEM_TARGET_E_ESCAPE);
    cr_expect_eq(prefix_norm("pay"), IDEM_TARGET_E_FORM);
    cr_expect_eq(prefix_norm(""), IDEM_TARGET_E_FORM);
    cr_expect_eq(idem__http_path_normalize("/", 1, false, out, 1), IDEM_TARGET_E_SPACE);
}

static bool has_prefix(const char *path, const char *prefix)
{
    return idem__http_path_has_prefix(path, strlen(path), prefix, strlen(prefix));
}

Test(http_target, prefixes_compare_decoded_bytes)
{
    cr_expect(has_prefix("/payments", "/pay"));
    cr_expect(has_prefix("/payments", "/payments"));
    cr_expect(has_prefix("/payments", ""));
    cr_expect_not(has_prefix("/pay", "/payments"));
    cr_expect_not(has_prefix("/Payments", "/pay"));
    cr_expect(has_prefix("/v1/orders:cancel", "/v1/orders%3Acancel"));
    cr_expect(has_prefix("/v1/orders%3Acancel", "/v1/orders:c"));
    cr_expect(has_prefix("/caf%C3%A9/x", "/caf%C3"));
    cr_expect_not(has_prefix("/caf%C3%A9", "/caf%C3%A8"));
    cr_expect_not(has_prefix("/a%3A", "/a%3B"));
}
