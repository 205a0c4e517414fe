/* src/cli/idemctl.c - idemctl's main: parse the command line, run one command.
 *
 * idemctl is the command line of idem (docs/protocol.md section 15): a client that sends
 * a non-idempotent request with an Idempotency-Key and retries it safely
 * (request), an operator's view of stored keys over idemd's admin listener
 * (keys), a prevention token fetcher (token), and a checker of any API's
 * idempotency against the draft (conformance).  The help text below is
 * the user's manual; keep it true when a flag changes.
 *
 * The only process-wide state is what libcurl's global init sets up, and
 * SIGPIPE ignored so that a closed stdout is an error to report (exit 23),
 * not a silent death.
 *
 * THREADING: one thread.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "cli/cli.h"

/* In parts: ISO C promises string literals of 4095 characters only. */
static const char *const help[] = {
    "usage: idemctl request [-X METHOD] URL [-d DATA | --data-file F] [-H 'Name: v']...\n"
    "                       [--key K] [--retries N] [--max-time S] [-i] [-v]\n"
    "       idemctl keys get|delete KEY [--scope S | --scope-of VALUE] [--admin URL]\n"
    "                       [--admin-token-file F]\n"
    "       idemctl keys list [--scope S] [--state STATE] [--prefix P] [--older-than D]\n"
    "                         [--limit N] [--admin URL] [--admin-token-file F]\n"
    "       idemctl keys delete --state STATE | --older-than D | --scope S | --prefix P ...\n"
    "       idemctl token [--url URL] [-H 'Name: v']...\n"
    "       idemctl conformance URL [--path P] [--method M] [--body JSON] [--marker NAME]\n"
    "                           [--timeout S] [--json] [-H 'Name: v']...\n"
    "       idemctl --help | --version\n"
    "\n"
    "idemctl request sends one non-idempotent operation (a payment, an order) so that it\n"
    "takes effect once however often it has to be sent: it gives the request an\n"
    "Idempotency-Key and sends the same key on every retry, so the server can answer a\n"
    "repeat with the first answer instead of running it again.\n"
    "\n"
    "  -X, --request METHOD  the method (default POST: idemctl exists for operations that\n"
    "                        are not idempotent by themselves)\n"
    "  -d, --data DATA       send DATA as it is (no @file: use --data-file); repeated -d\n"
    "                        are joined with '&'\n"
    "      --data-file F     send the bytes of file F ('-' for stdin), at most 64 MiB;\n"
    "                        either is sent as application/x-www-form-urlencoded unless\n"
    "                        -H gives a Content-Type, as curl does\n"
    "  -H, --header 'Name: value'\n"
    "                        add a header (at most 100); not Idempotency-Key (use --key),\n"
    "                        Content-Length or Transfer-Encoding; 'Name:' removes one of\n"
    "                        libcurl's own headers, as in curl\n"
    "      --key K           the key, 1 to 255 visible ASCII characters (\"a b\" quoted to\n"
    "                        hold spaces); default a fresh UUIDv7.  Sent bare, or as a\n"
    "                        quoted string when it holds a space, '\"' or '\\'\n"
    "      --retries N       retries after the first attempt, 0 to 99 (default 4)\n"
    "  -m, --max-time S      give up S seconds after the first attempt started, decimals\n"
    "                        allowed, up to 86400 (default 60; keys and token: 10)\n"
    "  -i, --include         print the answer's status line and headers before its body\n"
    "  -v, --verbose         one line per attempt on stderr: its outcome and the delay\n"
    "\n"
    "  A request without -d or --data-file sends an empty body with POST, PUT and PATCH\n"
    "  and none with other methods.  A URL without a scheme is http://.  Redirects are\n"
    "  not followed.  Every attempt opens a new connection.  Proxies come from the\n"
    "  environment (http_proxy, https_proxy, no_proxy) as in curl.\n"
    "\n"
    "  Retried, with the same key: connection failures, timeouts, connections broken\n"
    "  mid-answer, 408, 409 (only idem's in-flight, or a 409 without a problem type),\n"
    "  425, 429, 500, 502, 503, 504.  Never another 4xx.  The wait is exponential backoff\n"
    "  with full jitter (0.2 s doubling, at most 10 s) or the answer's Retry-After, and\n"
    "  never runs past --max-time: when it would, idemctl stops at once.\n"
    "\n"
    "  Output: the body of the last HTTP answer on stdout, whatever its status (an\n"
    "  attempt that got no answer does not replace it).  When giving up, one line on\n"
    "  stderr says why and which key was used: send again with --key K to resume the\n"
    "  same operation.\n"
    "\n",
    "idemctl keys get|delete KEY reads or removes a stored key over idemd's admin listener\n"
    "(GET/DELETE {admin}/keys/{KEY}?scope=S); KEY is read as --key reads it.\n"
    "      --scope S         the caller's scope: \"anonymous\" (default) or the 64 hex digits\n"
    "                        of SHA-256 of its Authorization value\n"
    "      --scope-of VALUE  the scope of the Authorization value VALUE, hashed for you\n"
    "      --admin URL       the admin listener (default http://127.0.0.1:8081)\n"
    "      --admin-token-file F  the admin token (idemd's admin_token_file), sent as\n"
    "                        Authorization: Bearer; default $IDEM_ADMIN_TOKEN_FILE\n"
    "  get prints the record as JSON; delete prints nothing.  Not retried.\n"
    "\n"
    "idemctl token prints a fresh single-use prevention token (POST {url}/_idem/tokens).\n"
    "      --url URL         idemd's public listener (default http://127.0.0.1:8080)\n"
    "  -H, --header          e.g. -H 'Authorization: ...' to bind the token to your scope\n"
    "\n",
    "idemctl conformance URL checks an HTTP API's idempotency (idemd's, or a service's own)\n"
    "against the Idempotency-Key draft and against the policy it publishes, on one\n"
    "operation, and prints one line per check: PASS name, FAIL name: what was seen, or\n"
    "SKIP name: why.  Required: missing-key (no key: 400), concurrent (8 copies with one\n"
    "key at once: one answer, the rest 409 or that answer), replay (the same request\n"
    "again: the first answer, byte for byte), key-reuse (the key with another payload:\n"
    "422).  Recommended: replay-marker, problem-json, policy (GET /_idem/policy or the\n"
    "problem's Link), policy-claims, link (docs/conformance.md).  Its requests are real:\n"
    "on a conforming API the operation runs once.\n"
    "      --path P          the operation's path (default: the URL's own)\n"
    "      --method M        its method (default POST)\n"
    "      --body JSON       its body (default {\"amount\":100,\"currency\":\"EUR\"})\n"
    "      --marker NAME     the header that marks a replay (default X-Idempotent-Replay;\n"
    "                        Stripe's is Idempotent-Replayed)\n"
    "      --timeout S       each exchange's limit in seconds (default 10)\n"
    "      --json            the report as one JSON document\n"
    "  -H, --header          e.g. the Authorization the API wants\n"
    "  Exit 0 when no check failed, 1 when one did, 2 for a usage error or no answer.\n"
    "\n"
    "Exit status: 0 on success (request: a 2xx answer; keys get: 200; keys delete: 200 or\n"
    "204; token: 201; conformance: no check failed); 1 a conformance check failed; 2 usage\n"
    "error; 7 no answer at all (connection failures, timeouts);\n"
    "22 another HTTP status (for request, its body is still printed); 23 the output could\n"
    "not be written; 27 out of memory; 63 the answer was larger than 64 MiB (the transfer\n"
    "is stopped rather than kept in memory, as curl --max-filesize does).  The codes are\n"
    "curl's for the same conditions.\n",
};

int main(int argc, char **argv)
{
    idem_cli_args_t args;
    char err[IDEM_CLI_ERRLEN];
    int rc;

    idem_err_t perr = idem__cli_args_parse(argc, argv, &args, err, sizeof err);
    if (perr != IDEM_OK) {
        fprintf(stderr, "idemctl: %s\n", err);
        idem__cli_args_cleanup(&args);
        return perr == IDEM_E_NOMEM ? IDEM_CLI_EXIT_NOMEM : IDEM_CLI_EXIT_USAGE;
    }
    if (args.cmd == IDEM_CLI_HELP) {
        idem__cli_args_cleanup(&args);
        for (size_t i = 0; i < sizeof help / sizeof help[0]; i++)
            if (idem__cli_write_out(help[i], strlen(help[i])) != 0)
                return IDEM_CLI_EXIT_WRITE;
        return IDEM_CLI_EXIT_OK;
    }
    if (args.cmd == IDEM_CLI_VERSION) {
        char line[160];
        int n = snprintf(line, sizeof line, "idemctl %s (libcurl %s)\n", IDEM_VERSION_STRING,
                         curl_version_info(CURLVERSION_NOW)->version);
        idem__cli_args_cleanup(&args);
        return idem__cli_write_out(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) ==
                       0
                   ? IDEM_CLI_EXIT_OK
                   : IDEM_CLI_EXIT_WRITE;
    }

    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "idemctl: libcurl did not initialise\n");
        idem__cli_args_cleanup(&args);
        return IDEM_CLI_EXIT_NOMEM;
    }
    switch (args.cmd) {
    case IDEM_CLI_REQUEST:
        rc = idem__cli_request(&args);
        break;
    case IDEM_CLI_KEYS_GET:
    case IDEM_CLI_KEYS_DELETE:
    case IDEM_CLI_KEYS_LIST:
        rc = args.cmd == IDEM_CLI_KEYS_LIST || args.bulk ? idem__cli_keys_bulk(&args)
                                                         : idem__cli_keys(&args);
        break;
    case IDEM_CLI_CONFORMANCE:
        rc = idem__cli_conformance(&args);
        break;
    default:
        rc = idem__cli_token(&args);
        break;
    }
    curl_global_cleanup();
    idem__cli_args_cleanup(&args);
    return rc;
}
