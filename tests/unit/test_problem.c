/* tests/unit/test_problem.c - idemd's problem+json responses (docs/protocol.md section 10).
 *
 * Each answer idemd makes itself must be a whole HTTP response whose body is
 * RFC 9457 JSON with the urn:idem:problem:<type> type, a title, the status
 * and the detail, and whose framing headers say exactly what follows.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "gateway/problem.h"

static const idem_http_reply_t KEEP = {.version_minor = 1, .keep_alive = true};
static const idem_http_reply_t CLOSE = {.version_minor = 1, .keep_alive = false};

/* Split a response into head and parsed body; checks Content-Length. */
static json_t *parse_problem(const idem_buf_t *b, idem_http_msg_t *msg)
{
    idem_http_head_state_t hs = {0};
    int rc = idem__http_parse_response(&hs, b->data, b->len, IDEM_HTTP_MAX_HEAD,
                                       (idem_slice_t){"POST", 4}, msg);
    cr_assert_gt(rc, 0, "not a whole response head: %d", rc);
    cr_assert_eq(msg->framing, IDEM_HTTP_BODY_LENGTH);
    cr_assert_eq(msg->content_length, b->len - (size_t)rc, "Content-Length does not match");
    json_error_t e;
    json_t *j = json_loadb(b->data + rc, b->len - (size_t)rc, 0, &e);
    cr_assert_not_null(j, "body is not JSON: %s", e.text);
    return j;
}

Test(problem, body_has_the_four_members)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 422, "key-reused", "used before", 0, NULL, KEEP), 0);
    idem_http_msg_t m;
    json_t *j = parse_problem(&b, &m);
    cr_expect_eq(m.status, 422);
    cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "urn:idem:problem:key-reused");
    cr_expect_str_eq(json_string_value(json_object_get(j, "title")),
                     idem__problem_title("key-reused"));
    cr_expect_eq(json_integer_value(json_object_get(j, "status")), 422);
    cr_expect_str_eq(json_string_value(json_object_get(j, "detail")), "used before");
    const idem_http_field_t *ct = idem__http_find(&m, "Content-Type");
    cr_assert_not_null(ct);
    cr_expect_eq(ct->value.len, strlen("application/problem+json"));
    cr_expect(memcmp(ct->value.ptr, "application/problem+json", ct->value.len) == 0);
    cr_expect_null(idem__http_find(&m, "Retry-After"));
    cr_expect(m.keep_alive, "a problem answer keeps the connection unless told to close");
    json_decref(j);
    idem__buf_cleanup(&b);
}

Test(problem, retry_after_in_whole_seconds)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 409, "in-flight", "busy", 7, NULL, KEEP), 0);
    idem_http_msg_t m;
    json_t *j = parse_problem(&b, &m);
    const idem_http_field_t *ra = idem__http_find(&m, "Retry-After");
    cr_assert_not_null(ra);
    cr_expect_eq(ra->value.len, 1);
    cr_expect_eq(ra->value.ptr[0], '7');
    json_decref(j);
    idem__buf_cleanup(&b);
}

Test(problem, close_says_connection_close)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 400, "bad-request", "x", 0, NULL, CLOSE), 0);
    idem_http_msg_t m;
    json_t *j = parse_problem(&b, &m);
    cr_expect_not(m.keep_alive);
    json_decref(j);
    idem__buf_cleanup(&b);
}

Test(problem, detail_with_quotes_stays_valid_json)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 400, "invalid-key", "bad \"key\" \\ here\n", 0, NULL,
                                       KEEP),
                 0);
    idem_http_msg_t m;
    json_t *j = parse_problem(&b, &m);
    cr_expect_str_eq(json_string_value(json_object_get(j, "detail")), "bad \"key\" \\ here\n");
    json_decref(j);
    idem__buf_cleanup(&b);
}

Test(problem, every_spec_type_has_its_own_title)
{
    static const char *const types[] = {
        "invalid-key", "missing-key", "key-reused", "in-flight", "upstream-unreachable",
        "upstream-outcome-unknown", "response-not-retained", "store-unavailable",
        "request-too-large", "headers-too-large", "bad-request", "invalid-method",
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        cr_expect_str_neq(idem__problem_title(types[i]), "Error", "%s has no title", types[i]);
}

Test(problem, a_full_buffer_is_an_error_not_a_truncated_answer)
{
    idem_buf_t b;
    idem__buf_init(&b, 64);
    cr_expect_eq(idem__problem_respond(&b, 503, "store-unavailable", "down", 1, NULL, KEEP), -1);
    cr_expect_eq(b.len, 0, "nothing of a refused answer is left in the buffer");
    idem__buf_cleanup(&b);
}

/* Each cap short of the whole answer leaves what was queued before intact. */
Test(problem, refused_under_any_cap_leaves_the_buffer_as_it_was)
{
    idem_http_reply_t to = {.version_minor = 1, .keep_alive = true};
    idem_buf_t full;
    idem__buf_init(&full, 0);
    cr_assert_eq(idem__problem_respond(&full, 409, "in-flight", "busy", 3, NULL, to), 0);
    for (size_t cap = 5; cap < full.len + 5; cap++) {
        idem_buf_t b;
        idem__buf_init(&b, cap);
        cr_assert_eq(idem__buf_append(&b, "prior", 5), 0);
        cr_expect_eq(idem__problem_respond(&b, 409, "in-flight", "busy", 3, NULL, to), -1,
                     "cap %zu",
                     cap);
        cr_expect_eq(b.len, 5, "cap %zu", cap);
        cr_expect_eq(memcmp(b.data, "prior", 5), 0);
        idem__buf_cleanup(&b);
    }
    idem__buf_cleanup(&full);
}

Test(problem, answer_to_head_is_the_head_alone)
{
    idem_buf_t b, get;
    idem__buf_init(&b, 0);
    idem__buf_init(&get, 0);
    idem_http_reply_t head = {.version_minor = 1, .head = true, .keep_alive = true};
    idem_http_reply_t plain = {.version_minor = 1, .keep_alive = true};
    cr_assert_eq(idem__problem_respond(&b, 404, "not-found", "nothing here", 0, NULL, head), 0);
    cr_assert_eq(idem__problem_respond(&get, 404, "not-found", "nothing here", 0, NULL, plain), 0);
    idem_http_head_state_t hs = {0};
    idem_http_msg_t m;
    int rc = idem__http_parse_response(&hs, b.data, b.len, IDEM_HTTP_MAX_HEAD,
                                       (idem_slice_t){"HEAD", 4}, &m);
    cr_assert_eq((size_t)rc, b.len, "a HEAD answer is its head and nothing after");
    const idem_http_field_t *cl = idem__http_find(&m, "Content-Length");
    cr_assert_not_null(cl, "HEAD still says how long the body would be");
    cr_expect_eq(b.len, (size_t)rc);
    cr_expect_eq(memcmp(b.data, get.data, b.len), 0, "the same head as the GET answer's");
    idem_http_msg_t gm;
    json_t *j = parse_problem(&get, &gm);
    json_decref(j);
    idem__buf_cleanup(&b);
    idem__buf_cleanup(&get);
}

Test(problem, http10_kept_alive_is_told_so)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    idem_http_reply_t to = {.version_minor = 0, .keep_alive = true};
    cr_assert_eq(idem__problem_respond(&b, 400, "bad-request", "x", 0, NULL, to), 0);
    cr_expect_not_null(memmem(b.data, b.len, "\r\nConnection: keep-alive\r\n", 26));
    idem__buf_cleanup(&b);
}

Test(problem, link_names_the_policy_described_by)
{
    idem_buf_t b;
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 409, "in-flight", "busy", 2, "/_idem/policy", KEEP), 0);
    idem_http_msg_t m;
    json_t *j = parse_problem(&b, &m);
    const idem_http_field_t *l = idem__http_find(&m, "Link");
    cr_assert_not_null(l);
    static const char want[] = "</_idem/policy>; rel=\"describedby\"";
    cr_expect_eq(l->value.len, sizeof want - 1);
    cr_expect(memcmp(l->value.ptr, want, sizeof want - 1) == 0);
    cr_expect_not_null(idem__http_find(&m, "Retry-After"), "beside Retry-After");
    json_decref(j);
    idem__buf_cleanup(&b);
    /* None without a link (the admin listener's problems). */
    idem__buf_init(&b, 0);
    cr_assert_eq(idem__problem_respond(&b, 404, "not-found", "x", 0, NULL, KEEP), 0);
    j = parse_problem(&b, &m);
    cr_expect_null(idem__http_find(&m, "Link"));
    json_decref(j);
    idem__buf_cleanup(&b);
}

Test(problem, link_of_the_longest_length_fits_and_a_longer_one_is_refused)
{
    char link[IDEM_PROBLEM_LINK_MAX + 2];
    memset(link, 'a', sizeof link);
    link[IDEM_PROBLEM_LINK_MAX] = '\0';
    idem_problem_t p;
    cr_assert_eq(idem__problem_init(&p, 400, "invalid-key", "x", 0, link), 0);
    cr_expect_eq(p.resp.n_fields, 2);
    cr_expect_eq(p.fields[1].value.len, IDEM_PROBLEM_LINK_MAX + 21);
    idem__problem_cleanup(&p);
    link[IDEM_PROBLEM_LINK_MAX] = 'a';
    link[IDEM_PROBLEM_LINK_MAX + 1] = '\0';
    cr_expect_eq(idem__problem_init(&p, 400, "invalid-key", "x", 0, link), -1);
}
