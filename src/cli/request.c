/* src/cli/request.c - idemctl request: send once, retry politely, same key every time.
 *
 * The request gets one Idempotency-Key before the first attempt (--key, or a
 * fresh UUIDv7) and keeps it on every attempt: that is what makes a retry
 * safe, because the server can tell a repeat from a new operation.  When to
 * retry and how long to wait is retry.h's decision (idem_retry_next): the
 * answers that say "try again", full-jitter backoff, Retry-After, the
 * --max-time deadline and the retry budget.  This file sends, sleeps and
 * reports.
 *
 * Time: the deadline runs from the start of the first attempt; every attempt
 * may use only the time left to it (libcurl's CURLOPT_TIMEOUT_MS), so
 * idemctl ends within --max-time plus the time to print, whatever the server
 * does.  The library sees wall-clock time (it parses HTTP-dates); the time
 * left is measured on the monotonic clock.
 *
 * What is printed: the last HTTP answer's body on stdout (with -i, its head
 * first), even when it is an error status.  When the last attempt got no
 * answer but an earlier one did, that earlier answer is printed and decides
 * the exit code (22); 7 means no attempt got any answer.
 *
 * THREADING: one thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/transfer.h"
#include "idem/clock.h"
#include "idem/key.h"
#include "idem/retry.h"

#define DESC_MAX 320 /* an attempt's description */

static int64_t elapsed_ms(uint64_t t0)
{
    return (int64_t)((idem_clock_mono_ns() - t0) / 1000000u);
}

/* Sleep ms milliseconds, all of them even when a signal interrupts. */
static void sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    struct timespec rem;
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR)
        ts = rem;
}

/* Read --data-file (or stdin for "-") into buf, which caps it. */
static int read_body(const char *path, idem_buf_t *buf)
{
    bool is_stdin = strcmp(path, "-") == 0;
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    char chunk[65536];
    int rc = 0;

    if (fd < 0) {
        fprintf(stderr, "idemctl: --data-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "idemctl: --data-file %s: %s\n", path, strerror(errno));
            rc = -1;
            break;
        }
        if (n == 0)
            break;
        if (idem__buf_append(buf, chunk, (size_t)n) != 0) {
            fprintf(stderr, "idemctl: --data-file %s: larger than the 64 MiB limit\n", path);
            rc = -1;
            break;
        }
    }
    if (!is_stdin)
        close(fd);
    return rc;
}

static bool has_body_by_default(const char *method)
{
    return strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
           strcmp(method, "PATCH") == 0;
}

static const char *give_up_reason(idem_retry_verdict_t v)
{
    switch (v) {
    case IDEM_RETRY_GIVE_UP_DEADLINE: return ", at the --max-time deadline";
    case IDEM_RETRY_GIVE_UP_BUDGET: return ", retry budget empty";
    default: return "";
    }
}

/* The request's headers: the user's, the key, and what idemctl leaves out. */
static struct curl_slist *build_headers(const idem_cli_args_t *a, const char *keyhdr)
{
    struct curl_slist *l = NULL;
    for (size_t i = 0; i < a->n_headers; i++)
        if (!idem__cli_header_add(&l, a->headers[i]))
            return NULL;
    if (!idem__cli_header_add(&l, keyhdr))
        return NULL;
    /* No Expect: 100-continue: it costs a round trip, or a second with a
     * server that ignores it. */
    if (!idem__cli_header_add(&l, "Expect:"))
        return NULL;
    /* libcurl labels every body form-urlencoded; like curl, only data the
     * user gave is labelled, not the empty body of a bare POST. */
    if (!a->has_data && a->data_file == NULL && !a->has_content_type &&
        !idem__cli_header_add(&l, "Content-Type:"))
        return NULL;
    return l;
}

int idem__cli_request(const idem_cli_args_t *a)
{
    int rc = IDEM_CLI_EXIT_USAGE;
    idem_buf_t file;
    idem_cli_answer_t ans[2];
    char *url = NULL;
    struct curl_slist *hdrs = NULL;
    CURL *h = NULL;
    char err[512];

    idem__buf_init(&file, IDEM_CLI_MAX_BODY);
    idem__cli_answer_init(&ans[0]);
    idem__cli_answer_init(&ans[1]);
    if (a->data_file != NULL && read_body(a->data_file, &file) != 0)
        goto out;
    if (idem__cli_url_check(a->url, false, &url, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: %s\n", err);
        goto out;
    }

    idem_retry_policy_t policy;
    idem_retry_policy_init(&policy);
    policy.max_attempts = a->retries + 1;
    policy.deadline_ms = a->max_time_ms;
    if (idem_retry_policy_check(&policy, err, sizeof err) != IDEM_OK) {
        fprintf(stderr, "idemctl: retry policy: %s\n", err);
        goto out;
    }
    /* One budget per process, as the library is meant to be used.  It guards
     * a fleet of requests against an outage; idemctl sends one, so the
     * bucket is made deep enough never to cut short the --retries the user
     * asked for (the default one holds 50 retries after connection failures,
     * fewer than --retries 99). */
    idem_retry_budget_t budget;
    int64_t depth = (int64_t)a->retries * IDEM_RETRY_BUDGET_DEFAULT_TIMEOUT_COST;
    if (depth < IDEM_RETRY_BUDGET_DEFAULT_CAPACITY)
        depth = IDEM_RETRY_BUDGET_DEFAULT_CAPACITY;
    idem_retry_budget_init_with(&budget, depth, IDEM_RETRY_BUDGET_DEFAULT_RETRY_COST,
                                IDEM_RETRY_BUDGET_DEFAULT_TIMEOUT_COST,
                                IDEM_RETRY_BUDGET_DEFAULT_SUCCESS_REFILL);

    char key[IDEM_KEY_MAX + 1], keyhdr[IDEM_CLI_KEY_HEADER_MAX];
    if (a->key[0] != '\0')
        memcpy(key, a->key, strlen(a->key) + 1);
    else
        idem_key_generate(idem_clock_now(NULL), NULL, key);
    if (idem__cli_key_header(key, keyhdr, sizeof keyhdr) != IDEM_OK ||
        (hdrs = build_headers(a, keyhdr)) == NULL || (h = curl_easy_init()) == NULL) {
        fprintf(stderr, "idemctl: out of memory\n");
        rc = IDEM_CLI_EXIT_NOMEM;
        goto out;
    }

    idem_cli_send_t send = {
        .method = a->method,
        .url = url,
        .headers = hdrs,
        .user_agent = IDEM_CLI_USER_AGENT,
    };
    if (a->has_data) {
        send.body = a->data.data;
        send.body_len = a->data.len;
        send.has_body = true;
    } else if (a->data_file != NULL) {
        send.body = file.data;
        send.body_len = file.len;
        send.has_body = true;
    } else {
        send.has_body = has_body_by_default(a->method);
    }

    uint64_t t0 = idem_clock_mono_ns();
    idem_retry_t retry;
    idem_retry_begin(&retry, &policy, &budget, idem_clock_now(NULL));
    idem_cli_answer_t *cur = &ans[0], *last = NULL; /* last: the last HTTP answer */
    idem_retry_verdict_t verdict = IDEM_RETRY_DONE;
    unsigned attempts = 0;
    bool final_answered = false; /* the last attempt got an HTTP answer */
    char desc[DESC_MAX] = "";
    for (;;) {
        int64_t left = a->max_time_ms - elapsed_ms(t0);
        if (attempts > 0 && left < 1) {
            verdict = IDEM_RETRY_GIVE_UP_DEADLINE;
            break;
        }
        attempts++;
        send.timeout_ms = left;
        idem__cli_exchange(h, &send, cur);
        if (cur->too_big) {
            fprintf(stderr, "idemctl: the answer is larger than the 64 MiB limit; stopped "
                            "(attempt %u, key %s)\n", attempts, key);
            rc = IDEM_CLI_EXIT_TOO_BIG;
            goto out;
        }
        idem_attempt_t at = idem__cli_attempt(cur);
        int64_t now = idem_clock_now(NULL), delay = 0, ra = 0;
        verdict = idem_retry_next(&retry, &at, now, NULL, &delay);
        bool by_server = at.retry_after != NULL &&
                         idem_retry_after_parse(at.retry_after, at.retry_after_len, now, &ra) ==
                             IDEM_OK;
        idem__cli_answer_describe(cur, desc, sizeof desc);
        if (cur->has_retry_after && cur->transport == IDEM_TRANSPORT_OK) {
            size_t n = strlen(desc);
            snprintf(desc + n, sizeof desc - n, " (Retry-After: %.*s)",
                     (int)(cur->retry_after_len < 64 ? cur->retry_after_len : 64),
                     cur->head.data + cur->retry_after_off);
            for (char *q = desc + n; *q; q++) /* the server's bytes, on one line */
                if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f)
                    *q = '?';
        }
        final_answered = cur->transport == IDEM_TRANSPORT_OK;
        if (final_answered) {
            last = cur;
            cur = cur == &ans[0] ? &ans[1] : &ans[0];
        }
        if (a->verbose) {
            char keynote[IDEM_KEY_MAX + 16] = "";
            if (attempts == 1)
                snprintf(keynote, sizeof keynote, " (key %s)", key);
            if (verdict == IDEM_RETRY_AGAIN)
                fprintf(stderr, "idemctl: attempt %u: %s%s; retrying in %lld.%03lld s%s\n",
                        attempts, desc, keynote, (long long)(delay / 1000),
                        (long long)(delay % 1000), by_server ? " (Retry-After)" : "");
            else if (verdict == IDEM_RETRY_DONE)
                fprintf(stderr, "idemctl: attempt %u: %s%s; done\n", attempts, desc, keynote);
            else
                fprintf(stderr, "idemctl: attempt %u: %s%s; giving up (%s)\n", attempts, desc,
                        keynote, idem_retry_verdict_name(verdict));
        }
        if (verdict != IDEM_RETRY_AGAIN)
            break;
        int64_t room = a->max_time_ms - elapsed_ms(t0);
        sleep_ms(delay < room ? delay : (room > 0 ? room : 0));
    }

    if (last == NULL) {
        fprintf(stderr, "idemctl: gave up after %u attempt%s%s: %s; no answer (key %s: send "
                        "again with --key to resume)\n", attempts, attempts == 1 ? "" : "s",
                give_up_reason(verdict), desc, key);
        rc = IDEM_CLI_EXIT_NO_ANSWER;
        goto out;
    }
    if ((a->include && idem__cli_write_out(last->head.data, last->head.len) != 0) ||
        idem__cli_write_out(last->body.data, last->body.len) != 0) {
        rc = IDEM_CLI_EXIT_WRITE;
        goto out;
    }
    if (final_answered && verdict == IDEM_RETRY_DONE) {
        if (last->status >= 200 && last->status <= 299) {
            rc = IDEM_CLI_EXIT_OK;
            goto out;
        }
        const char *t = last->problem_type;
        if (strncmp(t, "urn:idem:problem:", 17) == 0)
            t += 17;
        fprintf(stderr, "idemctl: %d %s%s%s%s, not retried%s%s\n", last->status,
                idem__http_reason(last->status), *t ? " (" : "", t, *t ? ")" : "",
                last->problem_detail[0] ? ": " : "", last->problem_detail);
        rc = IDEM_CLI_EXIT_HTTP;
        goto out;
    }
    if (final_answered)
        fprintf(stderr, "idemctl: gave up after %u attempt%s%s: %s (key %s)\n", attempts,
                attempts == 1 ? "" : "s", give_up_reason(verdict), desc, key);
    else
        fprintf(stderr, "idemctl: gave up after %u attempt%s%s: %s; printed the last answer, "
                        "%d (key %s)\n", attempts, attempts == 1 ? "" : "s",
                give_up_reason(verdict), desc, last->status, key);
    rc = IDEM_CLI_EXIT_HTTP;
out:
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(url);
    idem__cli_answer_cleanup(&ans[0]);
    idem__cli_answer_cleanup(&ans[1]);
    idem__buf_cleanup(&file);
    return rc;
}
