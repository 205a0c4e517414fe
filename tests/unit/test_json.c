/* tests/unit/test_json.c - looking one value up in a parsed JSON document
 * (idem__json_find and idem__json_string, src/core/json.c), what idemd's
 * `key_from: json:/pointer` reads a key with.
 *
 * The canonical form itself is tested through the fingerprint
 * (test_fingerprint.c); here: RFC 6901 pointers (members, ~0 and ~1, array
 * indexes, objects of one member and of many, escapes in keys), what names
 * nothing, the kind of what is found, and a string's decoded bytes.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/json.h"

static idem__json_t *doc;
static const char *text;

static void load(const char *t)
{
    idem__json_destroy(doc);
    doc = NULL;
    text = t;
    cr_assert_eq(idem__json_parse(t, strlen(t), NULL, 0, &doc), IDEM_OK, "not JSON: %s", t);
}

static void cleanup(void)
{
    idem__json_destroy(doc);
    doc = NULL;
}

TestSuite(json, .fini = cleanup);

/* The text of what ptr names, and its kind in *kind. */
static const char *find(const char *ptr, idem__json_type_t *kind)
{
    static char buf[256];
    size_t off, len;
    *kind = idem__json_find(doc, ptr, &off, &len);
    if (*kind == IDEM__JSON_NONE) {
        cr_expect_eq(off, 0);
        cr_expect_eq(len, 0);
        return NULL;
    }
    cr_assert_lt(len, sizeof buf);
    memcpy(buf, text + off, len);
    buf[len] = '\0';
    return buf;
}

static void expect(const char *ptr, idem__json_type_t kind, const char *value)
{
    idem__json_type_t k;
    const char *v = find(ptr, &k);
    cr_expect_eq(k, kind, "%s: kind %d, not %d", ptr, (int)k, (int)kind);
    if (value != NULL && v != NULL)
        cr_expect_str_eq(v, value, "%s", ptr);
}

static void nothing(const char *ptr)
{
    idem__json_type_t k;
    cr_expect_null(find(ptr, &k), "%s named something", ptr);
    cr_expect_eq(k, IDEM__JSON_NONE);
}

Test(json, find_names_members_of_objects_of_many_and_of_one)
{
    load("{\"id\": \"evt_1\", \"data\": {\"object\": {\"id\": 42}}, \"n\": null}");
    expect("/id", IDEM__JSON_STRING, "\"evt_1\"");
    expect("/data/object/id", IDEM__JSON_NUMBER, "42");
    expect("/data/object", IDEM__JSON_OBJECT, "{\"id\": 42}");
    expect("/n", IDEM__JSON_NULL, "null");
    expect("", IDEM__JSON_OBJECT, NULL);
    nothing("/ID");
    nothing("/data/id");
    nothing("/id/0");
    nothing("/data/object/id/x");
    nothing("/missing");
}

Test(json, find_unescapes_tilde_zero_and_tilde_one)
{
    load("{\"a/b\": 1, \"m~n\": 2, \"~1\": 3, \"\": 4}");
    expect("/a~1b", IDEM__JSON_NUMBER, "1");
    expect("/m~0n", IDEM__JSON_NUMBER, "2");
    expect("/~01", IDEM__JSON_NUMBER, "3");
    expect("/", IDEM__JSON_NUMBER, "4");
    nothing("/a/b");
    nothing("/m~1n");
}

Test(json, find_compares_keys_after_their_escapes_are_decoded)
{
    load("{\"\\u0069d\": \"x\", \"z\": 0}");
    expect("/id", IDEM__JSON_STRING, "\"x\"");
    load("{\"\\u0069d\": \"x\"}"); /* one member: no sorted table */
    expect("/id", IDEM__JSON_STRING, "\"x\"");
}

Test(json, find_indexes_arrays)
{
    load("{\"events\": [{\"id\": \"a\"}, {\"id\": \"b\"}, [true, false]], \"e\": []}");
    expect("/events/0/id", IDEM__JSON_STRING, "\"a\"");
    expect("/events/1/id", IDEM__JSON_STRING, "\"b\"");
    expect("/events/2/0", IDEM__JSON_TRUE, "true");
    expect("/events/2/1", IDEM__JSON_FALSE, "false");
    expect("/events/2", IDEM__JSON_ARRAY, "[true, false]");
    nothing("/events/3");
    nothing("/events/-");
    nothing("/events/01");
    nothing("/events/id");
    nothing("/e/0");
    nothing("/events/99999999999999999999999");
}

Test(json, find_on_a_scalar_document)
{
    load("\"just a string\"");
    expect("", IDEM__JSON_STRING, "\"just a string\"");
    nothing("/0");
    load("17");
    expect("", IDEM__JSON_NUMBER, "17");
}

Test(json, find_refuses_a_malformed_pointer)
{
    load("{\"a\": 1}");
    nothing("a");
    nothing("/~2");
    nothing("/a~");
}

Test(json, string_decodes_escapes)
{
    char out[16];
    size_t off, len;
    load("{\"k\": \"a\\\"b\\\\c\\u0041\\/\"}");
    cr_assert_eq(idem__json_find(doc, "/k", &off, &len), IDEM__JSON_STRING);
    size_t n;
    cr_assert_eq(idem__json_string(doc, off, out, sizeof out, &n), IDEM_OK);
    cr_assert_eq(n, 7);
    cr_expect_eq(memcmp(out, "a\"b\\cA/", 7), 0);
    cr_expect_eq(idem__json_string(doc, off, out, 6, &n), IDEM_E_TOOBIG, "does not fit in 6");
    cr_expect_eq(idem__json_string(doc, off, out, 7, &n), IDEM_OK, "fits in 7 exactly");
    cr_expect_eq(n, 7);
}

Test(json, string_gives_utf8_for_non_ascii)
{
    char out[16];
    size_t off, len;
    load("{\"k\": \"\\u00e9\"}");
    cr_assert_eq(idem__json_find(doc, "/k", &off, &len), IDEM__JSON_STRING);
    size_t n;
    cr_assert_eq(idem__json_string(doc, off, out, sizeof out, &n), IDEM_OK);
    cr_assert_eq(n, 2);
    cr_expect_eq(memcmp(out, "\xc3\xa9", 2), 0);
}
