/* src/cli/args.h - idemctl's command line, parsed without any I/O.
 *
 * The parser turns argv into an idem__cli_args_t and refuses, with a one-line
 * message, anything idemctl would not send as asked: an unknown flag, a
 * missing or malformed value, a number out of range, a header that is not
 * "Name: value", a key idemd would refuse.  Every size and count the command
 * line controls has a limit below, so a script cannot make idemctl allocate
 * without bound.  Nothing here touches the network, a file or the clock,
 * so the unit tests (tests/unit/test_cli_args.c) can run every case.
 *
 * Also here, for the same reason: the pure helpers idemctl's commands use to
 * build what they send (the Idempotency-Key header, the percent-encoded key
 * of an admin path, decimal seconds).
 *
 * THREADING: pure functions; an args struct belongs to its caller.
 */
#ifndef IDEM_CLI_ARGS_H
#define IDEM_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"
#include "idem/error.h"
#include "idem/key.h"

#define IDEM_CLI_MAX_HEADERS 100               /* -H flags */
#define IDEM_CLI_MAX_ARG (64 * 1024)           /* bytes in one argument, -d excepted */
#define IDEM_CLI_MAX_BODY ((size_t)64 << 20)   /* request body (-d, --data-file), response body */
#define IDEM_CLI_MAX_METHOD 64                 /* characters of -X */
#define IDEM_CLI_MAX_RETRIES 99                /* --retries; IDEM_RETRY_MAX_ATTEMPTS_LIMIT - 1 */
#define IDEM_CLI_MAX_TIME_MS (INT64_C(86400) * 1000) /* --max-time */
#define IDEM_CLI_DEFAULT_RETRIES 4             /* IDEM_RETRY_DEFAULT_MAX_ATTEMPTS - 1 */
#define IDEM_CLI_DEFAULT_MAX_TIME_MS 60000     /* request */
#define IDEM_CLI_DEFAULT_ADMIN_TIME_MS 10000   /* keys and token */
#define IDEM_CLI_DEFAULT_CONF_TIME_MS 10000    /* conformance: each exchange (--timeout) */
#define IDEM_CLI_DEFAULT_MARKER "X-Idempotent-Replay"
#define IDEM_CLI_DEFAULT_CONF_BODY "{\"amount\":100,\"currency\":\"EUR\"}"
#define IDEM_CLI_DEFAULT_ADMIN "http://127.0.0.1:8081"
#define IDEM_CLI_DEFAULT_URL "http://127.0.0.1:8080"
#define IDEM_CLI_ERRLEN 512                    /* room for a parse error message */

typedef enum idem_cli_cmd {
    IDEM_CLI_HELP = 0,    /* --help, -h, help, or a command's --help */
    IDEM_CLI_VERSION,     /* --version, -V */
    IDEM_CLI_REQUEST,     /* request */
    IDEM_CLI_KEYS_GET,    /* keys get */
    IDEM_CLI_KEYS_DELETE, /* keys delete */
    IDEM_CLI_TOKEN,       /* token */
    IDEM_CLI_CONFORMANCE, /* conformance */
    IDEM_CLI_KEYS_LIST,   /* keys list */
} idem_cli_cmd_t;

/** A parsed command line.  Strings are borrowed from argv (which outlives
 * it) except data, which the args own (idem__cli_args_cleanup). */
typedef struct idem_cli_args {
    idem_cli_cmd_t cmd;
    const char *method;   /* request: -X; conformance: --method; "POST" by default; token: "POST" */
    const char *url;      /* request, conformance: URL; token: --url; keys: --admin (defaults filled in) */
    const char *headers[IDEM_CLI_MAX_HEADERS]; /* -H values as given, each checked */
    size_t n_headers;
    bool has_content_type; /* one of the headers is Content-Type */
    idem_buf_t data;      /* -d values joined by '&' as curl does; capped at IDEM_CLI_MAX_BODY */
    bool has_data;        /* at least one -d (data may still be empty) */
    const char *data_file; /* --data-file; "-" is stdin; NULL when absent */
    char key[IDEM_KEY_MAX + 1]; /* request: --key; keys: KEY; unescaped; "" when absent */
    unsigned retries;     /* --retries */
    int64_t max_time_ms;  /* --max-time */
    bool include;         /* -i: status line and headers before the body */
    bool verbose;         /* -v: one line per attempt on stderr */
    char scope[IDEM_SCOPE_MAX + 1]; /* keys: --scope, or --scope-of hashed; "" when neither */
    const char *path;     /* conformance: --path ("/..."), NULL: the URL's own path */
    const char *body;     /* conformance: --body, IDEM_CLI_DEFAULT_CONF_BODY by default */
    const char *marker;   /* conformance: --marker, IDEM_CLI_DEFAULT_MARKER by default */
    bool json;            /* conformance: --json, the report as one JSON document */
    const char *admin_token_file; /* keys: --admin-token-file; NULL: $IDEM_ADMIN_TOKEN_FILE
                                   * or none (admin_auth.c) */
    /* keys list, keys delete without KEY: the filters of GET/DELETE /keys,
     * NULL when absent (scope_given says whether scope is one) */
    const char *state;      /* --state: in_progress, completed, held */
    const char *prefix;     /* --prefix */
    const char *older_than; /* --older-than: a duration */
    unsigned limit;         /* keys list: --limit, the page size (0: the admin's 100) */
    bool bulk;              /* keys delete with filters and no KEY */
    bool scope_given;       /* --scope or --scope-of was given */
} idem_cli_args_t;

/** Parse idemctl's argv (argv[0] is the program name).
 * @param[out] a       filled in; call idem__cli_args_cleanup afterwards,
 *                     whatever this returns.
 * @param[out] errbuf  on failure, the problem as one line without the
 *                     "idemctl: " prefix and without a newline.
 * @return IDEM_OK; IDEM_E_INVAL for a usage error; IDEM_E_TOOBIG when a
 *         size or count limit was passed; IDEM_E_NOMEM. */
idem_err_t idem__cli_args_parse(int argc, char *const argv[], idem_cli_args_t *a, char *errbuf,
                                size_t errlen);

/** Free what the args own (the joined -d data). */
void idem__cli_args_cleanup(idem_cli_args_t *a);

/** Check one -H value: "Name: value" with a token name and a value free of
 * control characters other than HTAB.
 * @param[out] name_len  the length of the name (may be NULL).
 * @return IDEM_OK or IDEM_E_INVAL. */
idem_err_t idem__cli_header_check(const char *h, size_t *name_len);

/** Whether s[0..n) is an HTTP token (RFC 9110 tchar), non-empty. */
bool idem__cli_is_token(const char *s, size_t n);

/** Parse decimal seconds ("60", "2.5", ".5") into milliseconds, rounding
 * down below a millisecond.  No sign, no exponent, at most 9 decimals.
 * @return IDEM_OK, or IDEM_E_INVAL (syntax, or above IDEM_CLI_MAX_TIME_MS,
 *         or below 1 ms) with *ms set to 0. */
idem_err_t idem__cli_parse_seconds(const char *s, int64_t *ms);

/** The Idempotency-Key header line for a key (unescaped, as key.h gives
 * it): "Idempotency-Key: abc" when the key is a bare token, else the
 * Structured Field string form "Idempotency-Key: \"a b\"" with \" and \\.
 * @param[out] out  cap bytes, NUL-terminated.
 * @return IDEM_OK, or IDEM_E_TOOBIG when cap is too small (out is then ""). */
idem_err_t idem__cli_key_header(const char *key, char *out, size_t cap);

/** The room idem__cli_key_header needs for any valid key. */
#define IDEM_CLI_KEY_HEADER_MAX (sizeof "Idempotency-Key: " + 2 + 2 * IDEM_KEY_MAX)

/** Percent-encode every byte of s[0..n) outside RFC 3986 unreserved
 * (ALPHA DIGIT - . _ ~) as %XX with upper-case hex.
 * @param[out] out  cap bytes, NUL-terminated.
 * @return IDEM_OK, or IDEM_E_TOOBIG when it does not fit (out is then ""). */
idem_err_t idem__cli_pct_encode(const char *s, size_t n, char *out, size_t cap);

#endif /* IDEM_CLI_ARGS_H */
