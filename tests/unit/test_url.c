/* tests/unit/test_url.c - cutting a URL into its parts, reading a host and
 * its port, percent-decoding and query items (src/core/url.c), with the
 * edge cases and the limits the store URLs rely on. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/url.h"

static idem__url_status_t parse(const char *s, idem__url_t *u)
{
    return idem__url_parse(s, strlen(s), u);
}

/* Whether the slice p[0..n) is the text want. */
static bool is(const char *p, size_t n, const char *want)
{
    return n == strlen(want) && (n == 0 || memcmp(p, want, n) == 0);
}

Test(url, every_part_of_a_full_url)
{
    idem__url_t u;
    cr_assert_eq(parse("redis://us%40r:p:w@[::1]:6379/2?prefix=a:b&pool=3", &u), IDEM__URL_OK);
    cr_expect(is(u.scheme, u.scheme_len, "redis"));
    cr_expect(u.has_userinfo);
    cr_expect(is(u.userinfo, u.userinfo_len, "us%40r:p:w"));
    cr_expect(is(u.user, u.user_len, "us%40r"), "not decoded here");
    cr_expect(u.has_password);
    cr_expect(is(u.password, u.password_len, "p:w"), "the first ':' ends the user");
    cr_expect(is(u.hosts, u.hosts_len, "[::1]:6379"));
    cr_expect(is(u.path, u.path_len, "/2"));
    cr_expect(u.has_query);
    cr_expect(is(u.query, u.query_len, "prefix=a:b&pool=3"));
}

Test(url, the_smallest_urls)
{
    idem__url_t u;
    cr_assert_eq(parse("redis://h", &u), IDEM__URL_OK);
    cr_expect(is(u.hosts, u.hosts_len, "h"));
    cr_expect_not(u.has_userinfo);
    cr_expect_not(u.has_password);
    cr_expect_eq(u.path_len, 0);
    cr_expect_not(u.has_query);
    cr_expect_eq(u.query_len, 0);
    cr_expect_str_eq(u.query, "", "the query points at the end");

    cr_assert_eq(parse("//", &u), IDEM__URL_OK, "no scheme: the text starts with //");
    cr_expect_eq(u.scheme_len, 0);
    cr_expect_eq(u.hosts_len, 0);
    cr_assert_eq(parse("//h?", &u), IDEM__URL_OK);
    cr_expect(u.has_query);
    cr_expect_eq(u.query_len, 0);
    cr_assert_eq(parse("redis+sentinel.v-2://a:1,b:2/m/3", &u), IDEM__URL_OK);
    cr_expect(is(u.scheme, u.scheme_len, "redis+sentinel.v-2"));
    cr_expect(is(u.hosts, u.hosts_len, "a:1,b:2"), "a host list is left as written");
    cr_expect(is(u.path, u.path_len, "/m/3"));
}

Test(url, schemes_and_slashes)
{
    idem__url_t u;
    cr_expect_eq(parse("", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse("/host", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse("1redis://h", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse("re dis://h", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse("redis", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse(":", &u), IDEM__URL_E_SCHEME);
    cr_expect_eq(parse("redis:", &u), IDEM__URL_E_NO_SLASHES);
    cr_expect_eq(parse("redis:/h", &u), IDEM__URL_E_NO_SLASHES);
    cr_expect_eq(parse("host:6379", &u), IDEM__URL_E_NO_SLASHES);
    cr_expect_eq(u.hosts, NULL, "a refused URL leaves nothing behind");
    /* The length is the caller's. */
    cr_expect_eq(idem__url_parse("redis://h", 8, &u), IDEM__URL_OK);
    cr_expect_eq(u.hosts_len, 0);
    cr_expect_eq(idem__url_parse("redis://h", 7, &u), IDEM__URL_E_NO_SLASHES);
}

Test(url, the_last_at_sign_ends_the_userinfo)
{
    idem__url_t u;
    cr_assert_eq(parse("redis://:p@ss@h:1", &u), IDEM__URL_OK);
    cr_expect(is(u.userinfo, u.userinfo_len, ":p@ss"));
    cr_expect(is(u.user, u.user_len, ""));
    cr_expect(is(u.password, u.password_len, "p@ss"));
    cr_expect(is(u.hosts, u.hosts_len, "h:1"));
    cr_assert_eq(parse("redis://user@h", &u), IDEM__URL_OK);
    cr_expect(u.has_userinfo);
    cr_expect_not(u.has_password);
    cr_expect(is(u.user, u.user_len, "user"));
    cr_assert_eq(parse("redis://@h", &u), IDEM__URL_OK);
    cr_expect(u.has_userinfo);
    cr_expect_eq(u.userinfo_len, 0);
    /* An '@' after the authority is not the userinfo's. */
    cr_assert_eq(parse("redis://h/a@b?c@d", &u), IDEM__URL_OK);
    cr_expect_not(u.has_userinfo);
    cr_expect(is(u.path, u.path_len, "/a@b"));
}

Test(url, the_first_question_mark_starts_the_query)
{
    idem__url_t u;
    cr_assert_eq(parse("redis://h?x=/a?b#c", &u), IDEM__URL_OK);
    cr_expect_eq(u.path_len, 0, "a '/' in the query is not a path");
    cr_expect(is(u.query, u.query_len, "x=/a?b#c"), "no fragment: '#' is a byte");
    cr_assert_eq(parse("redis://:pa?ss@h", &u), IDEM__URL_OK);
    cr_expect_not(u.has_userinfo, "the '?' ends the authority");
    cr_expect(is(u.hosts, u.hosts_len, ":pa"));
    cr_expect(is(u.query, u.query_len, "ss@h"));
}

static idem__url_status_t hp(const char *s, idem__url_host_t *h)
{
    return idem__url_host_port(s, strlen(s), h);
}

Test(url, hosts_and_ports)
{
    idem__url_host_t h;
    cr_assert_eq(hp("cache-1.example_net", &h), IDEM__URL_OK);
    cr_expect(is(h.host, h.host_len, "cache-1.example_net"));
    cr_expect_not(h.has_port);
    cr_expect_eq(h.port, 0);
    cr_expect_not(h.ipv6);
    cr_assert_eq(hp("10.0.0.1:6379", &h), IDEM__URL_OK);
    cr_expect(is(h.host, h.host_len, "10.0.0.1"));
    cr_expect_eq(h.port, 6379);
    cr_assert_eq(hp("[::1]:26379", &h), IDEM__URL_OK);
    cr_expect(h.ipv6);
    cr_expect(is(h.host, h.host_len, "::1"));
    cr_expect_eq(h.port, 26379);
    cr_assert_eq(hp("[fe80::1:2.3.4.5]", &h), IDEM__URL_OK);
    cr_expect(is(h.host, h.host_len, "fe80::1:2.3.4.5"));
    cr_expect_not(h.has_port);
    cr_assert_eq(hp("h:00080", &h), IDEM__URL_OK, "five digits, leading zeros");
    cr_expect_eq(h.port, 80);
}

Test(url, hosts_that_are_refused)
{
    idem__url_host_t h;
    cr_expect_eq(hp("", &h), IDEM__URL_E_NO_HOST);
    cr_expect_eq(hp(":6379", &h), IDEM__URL_E_NO_HOST);
    cr_expect_eq(hp("[]:1", &h), IDEM__URL_E_NO_HOST);
    cr_expect_eq(hp("[::1", &h), IDEM__URL_E_BRACKET);
    cr_expect_eq(hp("[::1:6379", &h), IDEM__URL_E_BRACKET);
    cr_expect_eq(hp("[::1]6379", &h), IDEM__URL_E_AFTER_BRACKET);
    cr_expect_eq(hp("[::1]]", &h), IDEM__URL_E_AFTER_BRACKET);
    cr_expect_eq(hp("[::g]", &h), IDEM__URL_E_IPV6);
    cr_expect_eq(h.bad, 'g');
    cr_expect_eq(hp("[::1%eth0]", &h), IDEM__URL_E_IPV6, "no zone ids");
    cr_expect_eq(h.bad, '%');
    cr_expect_eq(hp("h h:1", &h), IDEM__URL_E_HOST_CHAR);
    cr_expect_eq(h.bad, ' ');
    cr_expect(is(h.host, h.host_len, "h h"), "the host is there to quote");
    const char bad[] = "%@/?#[]!$&'()*+,;=\\\"";
    for (size_t i = 0; i < sizeof bad - 1; i++) {
        char s[4] = {'a', bad[i], 'b', '\0'};
        cr_expect_eq(hp(s, &h), IDEM__URL_E_HOST_CHAR, "%s", s);
        cr_expect_eq(h.bad, bad[i]);
    }
    cr_expect_eq(hp("a\x80" "b", &h), IDEM__URL_E_HOST_CHAR, "no raw UTF-8 names");
    /* Characters are checked before the port. */
    cr_expect_eq(hp("h h:0", &h), IDEM__URL_E_HOST_CHAR);
    cr_expect_eq(hp(":0", &h), IDEM__URL_E_NO_HOST);
}

Test(url, the_limits_of_a_host_and_a_port)
{
    idem__url_host_t h;
    char name[IDEM__URL_HOST_MAX + 8];
    memset(name, 'a', IDEM__URL_HOST_MAX);
    memcpy(name + IDEM__URL_HOST_MAX, ":1", 3);
    cr_expect_eq(hp(name, &h), IDEM__URL_OK);
    cr_expect_eq(h.host_len, IDEM__URL_HOST_MAX);
    name[IDEM__URL_HOST_MAX] = 'a';
    memcpy(name + IDEM__URL_HOST_MAX + 1, ":1", 3);
    cr_expect_eq(hp(name, &h), IDEM__URL_E_HOST_LONG);
    cr_expect_eq(hp(name + IDEM__URL_HOST_MAX, &h), IDEM__URL_OK);

    const char *ports_ok[] = {"h:1", "h:65535", "h:00001"};
    for (size_t i = 0; i < 3; i++)
        cr_expect_eq(hp(ports_ok[i], &h), IDEM__URL_OK, "%s", ports_ok[i]);
    const char *ports_bad[] = {"h:", "h:0", "h:00000", "h:65536", "h:99999", "h:000080",
                               "h:+1", "h:-1", "h: 1", "h:1 ", "h:0x10", "h:1:2",
                               "[::1]:", "[::1]:70000"};
    for (size_t i = 0; i < sizeof ports_bad / sizeof ports_bad[0]; i++) {
        cr_expect_eq(hp(ports_bad[i], &h), IDEM__URL_E_PORT, "%s", ports_bad[i]);
        cr_expect(h.has_port);
    }
    cr_expect_eq(hp("h:12x", &h), IDEM__URL_E_PORT);
    cr_expect(is(h.port_text, h.port_len, "12x"), "the port is there to quote");
}

Test(url, numbers)
{
    uint64_t v = 7;
    int port = 7;
    cr_expect(idem__url_number("0", 1, 10, &v));
    cr_expect_eq(v, 0);
    cr_expect(idem__url_number("2147483647", 10, 10, &v));
    cr_expect_eq(v, 2147483647u);
    cr_expect_not(idem__url_number("12345678901", 11, 10, &v));
    cr_expect_not(idem__url_number("", 0, 10, &v));
    cr_expect_not(idem__url_number("-1", 2, 10, &v));
    cr_expect_not(idem__url_number("1a", 2, 10, &v));
    cr_expect_eq(v, 2147483647u, "a refused number leaves *out alone");
    /* No overflow: more than IDEM__URL_DIGITS_MAX digits are never read. */
    cr_expect(idem__url_number("999999999999999999", 18, 40, &v));
    cr_expect_eq(v, 999999999999999999u);
    cr_expect_not(idem__url_number("99999999999999999999", 20, 40, &v));
    cr_expect(idem__url_port("443", 3, &port));
    cr_expect_eq(port, 443);
    cr_expect_not(idem__url_port("0", 1, &port));
    cr_expect_not(idem__url_port("65536", 5, &port));
    cr_expect_eq(port, 443);
    cr_expect_eq(idem__url_hexval('0'), 0);
    cr_expect_eq(idem__url_hexval('f'), 15);
    cr_expect_eq(idem__url_hexval('F'), 15);
    cr_expect_eq(idem__url_hexval('g'), -1);
    cr_expect_eq(idem__url_hexval('\0'), -1);
}

static idem__url_status_t dec(const char *s, char *out, size_t cap, size_t *n)
{
    return idem__url_decode(s, strlen(s), out, cap, n);
}

Test(url, percent_decoding)
{
    char out[32];
    size_t n = 99;
    cr_expect_eq(dec("", out, sizeof out, &n), IDEM__URL_OK);
    cr_expect_str_eq(out, "");
    cr_expect_eq(n, 0);
    cr_expect_eq(dec("p%40ss%3Aw%2frd", out, sizeof out, &n), IDEM__URL_OK);
    cr_expect_str_eq(out, "p@ss:w/rd");
    cr_expect_eq(n, 9);
    cr_expect_eq(dec("a+b%2B%20", out, sizeof out, NULL), IDEM__URL_OK);
    cr_expect_str_eq(out, "a+b+ ", "'+' is a plus sign, not a space");
    cr_expect_eq(dec("%2541", out, sizeof out, NULL), IDEM__URL_OK);
    cr_expect_str_eq(out, "%41", "decoded once, never twice");
    cr_expect_eq(dec("%ff%C3%A9", out, sizeof out, &n), IDEM__URL_OK);
    cr_expect_eq(n, 3);
    cr_expect_eq(memcmp(out, "\xff\xc3\xa9", 4), 0, "any byte but NUL");
}

Test(url, bad_escapes_are_refused)
{
    char out[32];
    size_t n = 99;
    const char *bad[] = {"%", "%4", "a%", "%zz", "%4g", "%g4", "% 41", "%%41", "%-1", "%+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(out, 'x', sizeof out);
        cr_expect_eq(dec(bad[i], out, sizeof out, &n), IDEM__URL_E_ESCAPE, "%s", bad[i]);
        cr_expect_str_eq(out, "", "%s leaves out empty", bad[i]);
        cr_expect_eq(n, 0);
    }
    cr_expect_eq(dec("%00", out, sizeof out, &n), IDEM__URL_E_NUL);
    cr_expect_eq(dec("ab%00cd", out, sizeof out, &n), IDEM__URL_E_NUL);
    cr_expect_str_eq(out, "");
    /* An escape cut off by the length the caller gives is bad too. */
    cr_expect_eq(idem__url_decode("%41", 2, out, sizeof out, &n), IDEM__URL_E_ESCAPE);
    cr_expect_eq(idem__url_decode("a%41", 1, out, sizeof out, &n), IDEM__URL_OK);
    cr_expect_str_eq(out, "a");
    /* The first problem in reading order is the one reported. */
    cr_expect_eq(dec("%00%zz", out, sizeof out, NULL), IDEM__URL_E_NUL);
    cr_expect_eq(dec("%zz%00", out, sizeof out, NULL), IDEM__URL_E_ESCAPE);
    cr_expect_eq(dec("abcd%zz", out, 3, NULL), IDEM__URL_E_SPACE);
    cr_expect_eq(dec("a%zzbcd", out, 3, NULL), IDEM__URL_E_ESCAPE);
}

Test(url, decoded_text_must_fit_with_its_nul)
{
    char out[4];
    size_t n;
    cr_expect_eq(dec("abc", out, 4, &n), IDEM__URL_OK);
    cr_expect_str_eq(out, "abc");
    cr_expect_eq(dec("abcd", out, 4, &n), IDEM__URL_E_SPACE);
    cr_expect_str_eq(out, "");
    cr_expect_eq(dec("%41%42%43", out, 4, &n), IDEM__URL_OK, "escapes count decoded");
    cr_expect_str_eq(out, "ABC");
    cr_expect_eq(dec("%41%42%43%44", out, 4, &n), IDEM__URL_E_SPACE);
    cr_expect_eq(dec("a", out, 1, &n), IDEM__URL_E_SPACE);
    cr_expect_eq(dec("", out, 1, &n), IDEM__URL_OK);
    cr_expect_eq(dec("", NULL, 0, &n), IDEM__URL_E_SPACE, "no room even for the NUL");
    cr_expect_eq(dec("a", NULL, 0, &n), IDEM__URL_E_SPACE);
}

Test(url, query_items)
{
    const char *q = "a=1&b=&c&&=v&d=x=y&";
    idem__url_param_t p;
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect(is(p.name, p.name_len, "a"));
    cr_expect(p.has_value);
    cr_expect(is(p.value, p.value_len, "1"));
    cr_expect(is(p.item, p.item_len, "a=1"));
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect(is(p.name, p.name_len, "b"));
    cr_expect(p.has_value);
    cr_expect_eq(p.value_len, 0);
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect(is(p.name, p.name_len, "c"));
    cr_expect_not(p.has_value);
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect_eq(p.item_len, 0, "an empty item is an item");
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect_eq(p.name_len, 0);
    cr_expect(is(p.value, p.value_len, "v"));
    cr_assert(idem__url_next_param(&q, NULL, &p));
    cr_expect(is(p.name, p.name_len, "d"));
    cr_expect(is(p.value, p.value_len, "x=y"), "the first '=' splits");
    cr_expect_not(idem__url_next_param(&q, NULL, &p), "a final '&' makes no item");
    cr_expect_not(idem__url_next_param(&q, NULL, &p), "and the end stays the end");

    const char *e = "";
    cr_expect_not(idem__url_next_param(&e, NULL, &p));
    const char *lead = "&a=1";
    cr_assert(idem__url_next_param(&lead, NULL, &p));
    cr_expect_eq(p.item_len, 0);
    cr_assert(idem__url_next_param(&lead, NULL, &p));
    cr_expect(is(p.item, p.item_len, "a=1"));

    /* With an end, the query stops there. */
    const char *text = "a=1&b=2", *c = text;
    cr_assert(idem__url_next_param(&c, text + 3, &p));
    cr_expect(is(p.item, p.item_len, "a=1"));
    cr_expect_not(idem__url_next_param(&c, text + 3, &p));
    c = text;
    cr_assert(idem__url_next_param(&c, text + 5, &p));
    cr_assert(idem__url_next_param(&c, text + 5, &p));
    cr_expect(is(p.item, p.item_len, "b"));
    cr_expect_not(idem__url_next_param(&c, text + 5, &p));
}
