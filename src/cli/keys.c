/* src/cli/keys.c - idemctl keys get|delete and idemctl token: one exchange each, no retries.
 *
 * keys talks to idemd's admin listener (docs/protocol.md section 13): GET or DELETE
 * {admin}/keys/{key}?scope=S, the key percent-encoded byte by byte outside
 * RFC 3986 unreserved (the admin reads '+' as a plus sign, so it is encoded
 * too).  token asks the public listener for a prevention token (docs/protocol.md
 * section 8): POST {url}/_idem/tokens, with the caller's -H headers so that
 * an Authorization header binds the token to the caller's scope.
 *
 * keys list and keys delete with filters (no KEY) use GET and DELETE
 * {admin}/keys?scope=&state=&prefix=&older_than= (list follows next_cursor
 * to the end and prints one record a line).
 *
 * These are an operator's lookups, not operations to make happen: they are
 * not retried, and they give up after --max-time (10 s by default).  An
 * error answer is reported on stderr as one line with the problem's detail;
 * stdout gets only the result (the record's JSON, the token).
 *
 * THREADING: one thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/transfer.h"
#include "idem/store.h"

int idem__cli_write_out(const void *p, size_t n)
{
    if ((n > 0 && fwrite(p, 1, n, stdout) != n) || fflush(stdout) != 0) {
        int e = errno;
        fprintf(stderr, "idemctl: writing the output: %s\n", e ? strerror(e) : "failed");
        return -1;
    }
    return 0;
}

/* The one-line report of an answer that is not the one wanted. */
static int report_status(const idem_cli_answer_t *ans, const char *what)
{
    const char *t = ans->problem_type;
    if (strncmp(t, "urn:idem:problem:", 17) == 0)
        t += 17;
    fprintf(stderr, "idemctl: %s: %d %s%s%s%s%s%s\n", what, ans->status,
            idem__http_reason(ans->status), *t ? " (" : "", t, *t ? ")" : "",
            ans->problem_detail[0] ? ": " : "", ans->problem_detail);
    return IDEM_CLI_EXIT_HTTP;
}

/* One exchange; the exit code when it did not produce an HTTP answer, else -1. */
static int exchange_once(const idem_cli_send_t *s, idem_cli_answer_t *ans, const char *what)
{
    CURL *h = curl_easy_init();
    if (h == NULL) {
        fprintf(stderr, "idemctl: out of memory\n");
        return IDEM_CLI_EXIT_NOMEM;
    }
    idem__cli_exchange(h, s, ans);
    curl_easy_cleanup(h);
    if (ans->too_big) {
        fprintf(stderr, "idemctl: %s: the answer is larger than the 64 MiB limit\n", what);
        return IDEM_CLI_EXIT_TOO_BIG;
    }
    if (ans->transport != IDEM_TRANSPORT_OK) {
        char desc[320];
        idem__cli_answer_describe(ans, desc, sizeof desc);
        fprintf(stderr, "idemctl: %s: no answer from %s: %s\n", what, s->url, desc);
        return IDEM_CLI_EXIT_NO_ANSWER;
    }
    return -1;
}

int idem__cli_keys(const idem_cli_args_t *a)
{
    bool get = a->cmd == IDEM_CLI_KEYS_GET;
    const char *what = get ? "keys get" : "keys delete";
    char *base = NULL, *url = NULL;
    char err[512], enc[3 * IDEM_KEY_MAX + 1];
    int rc = IDEM_CLI_EXIT_USAGE;
    idem_cli_answer_t ans;

    idem__cli_answer_init(&ans);
    if (idem__cli_url_check(a->url, true, &base, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: --admin: %s\n", err);
        goto out;
    }
    if (idem__cli_pct_encode(a->key, strlen(a->key), enc, sizeof enc) != IDEM_OK)
        goto out; /* cannot happen: enc holds any key */
    size_t n = strlen(base) + strlen(enc) + strlen(a->scope) + 16;
    if ((url = malloc(n)) == NULL) {
        fprintf(stderr, "idemctl: out of memory\n");
        rc = IDEM_CLI_EXIT_NOMEM;
        goto out;
    }
    /* A scope is "anonymous" or hex digits: nothing to encode. */
    snprintf(url, n, "%s/keys/%s?scope=%s", base, enc, a->scope);

    struct curl_slist *hdrs = NULL;
    if ((rc = idem__cli_admin_auth(a, &hdrs)) != IDEM_CLI_EXIT_OK)
        goto out;
    idem_cli_send_t send = {
        .method = get ? "GET" : "DELETE",
        .url = url,
        .headers = hdrs,
        .user_agent = IDEM_CLI_USER_AGENT,
        .timeout_ms = a->max_time_ms,
    };
    rc = exchange_once(&send, &ans, what);
    curl_slist_free_all(hdrs);
    if (rc >= 0)
        goto out;
    if (get && ans.status == 200) {
        rc = IDEM_CLI_EXIT_OK;
        bool nl = ans.body.len > 0 && ans.body.data[ans.body.len - 1] == '\n';
        if (idem__cli_write_out(ans.body.data, ans.body.len) != 0 ||
            (!nl && idem__cli_write_out("\n", 1) != 0))
            rc = IDEM_CLI_EXIT_WRITE;
    } else if (!get && (ans.status == 204 || ans.status == 200)) {
        rc = IDEM_CLI_EXIT_OK;
    } else {
        rc = report_status(&ans, what);
    }
out:
    idem__cli_answer_cleanup(&ans);
    free(base);
    free(url);
    return rc;
}

/* Append "&name=value" (value percent-encoded) to buf when value is set. */
static int add_param(idem_buf_t *buf, const char *name, const char *value)
{
    char enc[3 * IDEM_STORE_CURSOR_MAX + 1];
    if (value == NULL)
        return 0;
    if (idem__cli_pct_encode(value, strlen(value), enc, sizeof enc) != IDEM_OK)
        return -1;
    return idem__buf_append_str(buf, "&") != 0 || idem__buf_append_str(buf, name) != 0 ||
                   idem__buf_append_str(buf, "=") != 0 || idem__buf_append_str(buf, enc) != 0
               ? -1
               : 0;
}

int idem__cli_keys_bulk(const idem_cli_args_t *a)
{
    bool list = a->cmd == IDEM_CLI_KEYS_LIST;
    const char *what = list ? "keys list" : "keys delete";
    char *base = NULL, *cursor = NULL;
    char err[512], limit[16];
    int rc = IDEM_CLI_EXIT_USAGE;
    idem_buf_t url;
    idem_cli_answer_t ans;
    struct curl_slist *hdrs = NULL;

    idem__buf_init(&url, 0);
    idem__cli_answer_init(&ans);
    if (idem__cli_url_check(a->url, true, &base, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: --admin: %s\n", err);
        goto out;
    }
    if ((rc = idem__cli_admin_auth(a, &hdrs)) != IDEM_CLI_EXIT_OK)
        goto out;
    snprintf(limit, sizeof limit, "%u", a->limit);
    for (;;) {
        idem__buf_reset(&url);
        if (idem__buf_append_str(&url, base) != 0 || idem__buf_append_str(&url, "/keys?") != 0 ||
            add_param(&url, "scope", a->scope_given ? a->scope : NULL) != 0 ||
            add_param(&url, "state", a->state) != 0 || add_param(&url, "prefix", a->prefix) != 0 ||
            add_param(&url, "older_than", a->older_than) != 0 ||
            add_param(&url, "limit", list && a->limit ? limit : NULL) != 0 ||
            add_param(&url, "cursor", cursor) != 0 || idem__buf_append(&url, "", 1) != 0) {
            fprintf(stderr, "idemctl: out of memory\n");
            rc = IDEM_CLI_EXIT_NOMEM;
            goto out;
        }
        idem_cli_send_t send = {
            .method = list ? "GET" : "DELETE",
            .url = (const char *)url.data,
            .headers = hdrs,
            .user_agent = IDEM_CLI_USER_AGENT,
            .timeout_ms = a->max_time_ms,
        };
        idem__cli_answer_cleanup(&ans);
        idem__cli_answer_init(&ans);
        rc = exchange_once(&send, &ans, what);
        if (rc >= 0)
            goto out;
        if (ans.status != 200) {
            rc = report_status(&ans, what);
            goto out;
        }
        if (!list) {
            rc = IDEM_CLI_EXIT_OK;
            bool nl = ans.body.len > 0 && ans.body.data[ans.body.len - 1] == '\n';
            if (idem__cli_write_out(ans.body.data, ans.body.len) != 0 ||
                (!nl && idem__cli_write_out("\n", 1) != 0))
                rc = IDEM_CLI_EXIT_WRITE;
            goto out;
        }
        json_error_t jerr;
        json_t *doc = json_loadb(ans.body.data ? ans.body.data : "", ans.body.len, 0, &jerr);
        json_t *keys = json_object_get(doc, "keys");
        json_t *next = json_object_get(doc, "next_cursor");
        if (!json_is_array(keys) || (next != NULL && !json_is_null(next) && !json_is_string(next))) {
            json_decref(doc);
            fprintf(stderr, "idemctl: keys list: the answer is not a page of keys\n");
            rc = IDEM_CLI_EXIT_HTTP;
            goto out;
        }
        size_t i;
        json_t *rec;
        rc = IDEM_CLI_EXIT_OK;
        json_array_foreach(keys, i, rec) {
            char *line = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (line == NULL || idem__cli_write_out(line, strlen(line)) != 0 ||
                idem__cli_write_out("\n", 1) != 0)
                rc = IDEM_CLI_EXIT_WRITE;
            free(line);
            if (rc != IDEM_CLI_EXIT_OK)
                break;
        }
        free(cursor);
        cursor = json_is_string(next) ? strdup(json_string_value(next)) : NULL;
        json_decref(doc);
        if (rc != IDEM_CLI_EXIT_OK || cursor == NULL)
            goto out;
    }
out:
    curl_slist_free_all(hdrs);
    idem__cli_answer_cleanup(&ans);
    idem__buf_cleanup(&url);
    free(base);
    free(cursor);
    return rc;
}

int idem__cli_token(const idem_cli_args_t *a)
{
    char *base = NULL, *url = NULL;
    char err[512];
    int rc = IDEM_CLI_EXIT_USAGE;
    struct curl_slist *hdrs = NULL;
    idem_cli_answer_t ans;

    idem__cli_answer_init(&ans);
    if (idem__cli_url_check(a->url, true, &base, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: --url: %s\n", err);
        goto out;
    }
    size_t n = strlen(base) + sizeof "/_idem/tokens";
    if ((url = malloc(n)) == NULL)
        goto nomem;
    snprintf(url, n, "%s/_idem/tokens", base);
    for (size_t i = 0; i < a->n_headers; i++)
        if (!idem__cli_header_add(&hdrs, a->headers[i]))
            goto nomem;
    if (!idem__cli_header_add(&hdrs, "Expect:"))
        goto nomem;
    if (!a->has_content_type && !idem__cli_header_add(&hdrs, "Content-Type:"))
        goto nomem;

    idem_cli_send_t send = {
        .method = "POST",
        .url = url,
        .headers = hdrs,
        .has_body = true,
        .user_agent = IDEM_CLI_USER_AGENT,
        .timeout_ms = a->max_time_ms,
    };
    rc = exchange_once(&send, &ans, "token");
    if (rc >= 0)
        goto out;
    if (ans.status != 201) {
        rc = report_status(&ans, "token");
        goto out;
    }
    json_error_t jerr;
    json_t *doc = json_loadb(ans.body.data ? ans.body.data : "", ans.body.len, 0, &jerr);
    const char *tok = json_string_value(json_object_get(doc, "token"));
    bool ok = tok != NULL && *tok != '\0';
    for (const char *p = tok; ok && *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            ok = false;
    if (!ok) {
        fprintf(stderr, "idemctl: token: 201 without a token in the body\n");
        rc = IDEM_CLI_EXIT_HTTP;
    } else {
        rc = IDEM_CLI_EXIT_OK;
        if (idem__cli_write_out(tok, strlen(tok)) != 0 || idem__cli_write_out("\n", 1) != 0)
            rc = IDEM_CLI_EXIT_WRITE;
    }
    json_decref(doc);
    goto out;
nomem:
    fprintf(stderr, "idemctl: out of memory\n");
    rc = IDEM_CLI_EXIT_NOMEM;
out:
    curl_slist_free_all(hdrs);
    idem__cli_answer_cleanup(&ans);
    free(base);
    free(url);
    return rc;
}
