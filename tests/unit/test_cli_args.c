/* tests/unit/test_cli_args.c - idemctl's command line (src/cli/args.c).
 *
 * Every flag is read as the help text says, every way to get one wrong is
 * refused with a message naming the flag, the limits hold at their edges,
 * and the helpers build exactly the bytes idemd expects (key header forms,
 * percent-encoded admin paths, decimal seconds).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"

static idem_cli_args_t args;
static char err[IDEM_CLI_ERRLEN];

/* Parse a NULL-terminated list of arguments after "idemctl". */
static idem_err_t parse_v(const char *const *list)
{
    static char *argv[512];
    int argc = 0;
    argv[argc++] = (char *)"idemctl";
    for (; *list && argc < 511; list++)
        argv[argc++] = (char *)*list;
    argv[argc] = NULL;
    idem__cli_args_cleanup(&args);
    return idem__cli_args_parse(argc, argv, &args, err, sizeof err);
}

#define PARSE(...) parse_v((const char *const[]){__VA_ARGS__, NULL})

static void refused(idem_err_t got, const char *needle)
{
    cr_expect_neq(got, IDEM_OK, "accepted, wanted an error naming '%s'", needle);
    cr_expect(strstr(err, needle) != NULL, "error '%s' does not name '%s'", err, needle);
    cr_expect(strchr(err, '\n') == NULL, "error '%s' is not one line", err);
}

static void cleanup(void)
{
    idem__cli_args_cleanup(&args);
}

TestSuite(cli_args, .fini = cleanup);

Test(cli_args, test_cli_args__request_defaults)
{
    cr_assert_eq(PARSE("request", "http://h/pay"), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_REQUEST);
    cr_expect_str_eq(args.method, "POST");
    cr_expect_str_eq(args.url, "http://h/pay");
    cr_expect_eq(args.retries, 4);
    cr_expect_eq(args.max_time_ms, 60000);
    cr_expect_str_eq(args.key, "");
    cr_expect_eq(args.n_headers, 0);
    cr_expect(!args.has_data && args.data_file == NULL && !args.include && !args.verbose);
}

Test(cli_args, test_cli_args__request_every_flag)
{
    cr_assert_eq(PARSE("request", "-X", "PUT", "-H", "A: 1", "--header=B: 2", "-HC:3",
                       "--key", "k-1", "--retries", "7", "--max-time", "2.5", "-iv",
                       "-d", "x=1", "http://h/"),
                 IDEM_OK, "%s", err);
    cr_expect_str_eq(args.method, "PUT");
    cr_assert_eq(args.n_headers, 3);
    cr_expect_str_eq(args.headers[0], "A: 1");
    cr_expect_str_eq(args.headers[1], "B: 2");
    cr_expect_str_eq(args.headers[2], "C:3");
    cr_expect_str_eq(args.key, "k-1");
    cr_expect_eq(args.retries, 7);
    cr_expect_eq(args.max_time_ms, 2500);
    cr_expect(args.include && args.verbose);
    cr_expect(args.has_data);
    cr_expect_eq(args.data.len, 3);
    cr_expect_eq(memcmp(args.data.data, "x=1", 3), 0);
    cr_expect_str_eq(args.url, "http://h/");
}

Test(cli_args, test_cli_args__short_values_attached_and_long_with_equals)
{
    cr_assert_eq(PARSE("request", "-XPATCH", "--retries=0", "-m3", "--key=a", "u"), IDEM_OK,
                 "%s", err);
    cr_expect_str_eq(args.method, "PATCH");
    cr_expect_eq(args.retries, 0);
    cr_expect_eq(args.max_time_ms, 3000);
    cr_expect_str_eq(args.key, "a");
}

Test(cli_args, test_cli_args__repeated_data_joined_with_ampersand)
{
    cr_assert_eq(PARSE("request", "u", "-d", "a=1", "-d", "", "-d", "b=2"), IDEM_OK, "%s", err);
    cr_expect_eq(args.data.len, 8);
    cr_expect_eq(memcmp(args.data.data, "a=1&&b=2", 8), 0);
}

Test(cli_args, test_cli_args__empty_data_is_still_data)
{
    cr_assert_eq(PARSE("request", "u", "-d", ""), IDEM_OK, "%s", err);
    cr_expect(args.has_data);
    cr_expect_eq(args.data.len, 0);
}

Test(cli_args, test_cli_args__double_dash_ends_options)
{
    cr_assert_eq(PARSE("request", "--", "-weird-url"), IDEM_OK, "%s", err);
    cr_expect_str_eq(args.url, "-weird-url");
}

Test(cli_args, test_cli_args__last_scalar_wins)
{
    cr_assert_eq(PARSE("request", "u", "--retries", "1", "--retries", "2"), IDEM_OK);
    cr_expect_eq(args.retries, 2);
}

Test(cli_args, test_cli_args__data_value_may_start_with_a_dash)
{
    cr_assert_eq(PARSE("request", "u", "-d", "-x"), IDEM_OK, "%s", err);
    cr_expect_eq(memcmp(args.data.data, "-x", 2), 0);
}

Test(cli_args, test_cli_args__content_type_header_is_noticed)
{
    cr_assert_eq(PARSE("request", "u", "-H", "content-TYPE: text/plain"), IDEM_OK);
    cr_expect(args.has_content_type);
    cr_assert_eq(PARSE("request", "u", "-H", "Content-Typo: x"), IDEM_OK);
    cr_expect(!args.has_content_type);
}

Test(cli_args, test_cli_args__usage_errors_name_the_problem)
{
    refused(PARSE("frob"), "unknown command");
    refused(PARSE("request"), "needs a URL");
    refused(PARSE("request", ""), "needs a URL");
    refused(PARSE("request", "u", "v"), "unexpected argument 'v'");
    refused(PARSE("request", "u", "--nope"), "unknown option --nope");
    refused(PARSE("request", "u", "--nope=3"), "unknown option --nope");
    refused(PARSE("request", "u", "-Z"), "unknown option -Z");
    refused(PARSE("request", "u", "-iZ"), "unknown option -Z");
    refused(PARSE("request", "u", "-X"), "-X needs a value");
    refused(PARSE("request", "u", "--key"), "--key needs a value");
    refused(PARSE("request", "u", "--include=1"), "takes no value");
    refused(PARSE("request", "u", "--admin", "x"), "not an option of request");
    refused(PARSE("keys", "get", "k", "-d", "x"), "not an option of keys get");
    refused(PARSE("token", "--key", "x"), "not an option of token");
    refused(PARSE("token", "x"), "unexpected argument");
}

Test(cli_args, test_cli_args__no_command)
{
    static char *argv[] = {(char *)"idemctl", NULL};
    idem__cli_args_cleanup(&args);
    refused(idem__cli_args_parse(1, argv, &args, err, sizeof err), "no command");
}

Test(cli_args, test_cli_args__retries_range)
{
    cr_expect_eq(PARSE("request", "u", "--retries", "99"), IDEM_OK);
    cr_expect_eq(args.retries, 99);
    refused(PARSE("request", "u", "--retries", "100"), "--retries");
    refused(PARSE("request", "u", "--retries", "99999999999999999999"), "--retries");
    refused(PARSE("request", "u", "--retries", "-1"), "--retries");
    refused(PARSE("request", "u", "--retries", "1.5"), "--retries");
    refused(PARSE("request", "u", "--retries", ""), "--retries");
    refused(PARSE("request", "u", "--retries", " 1"), "--retries");
}

Test(cli_args, test_cli_args__seconds)
{
    int64_t ms;
    cr_expect_eq(idem__cli_parse_seconds("60", &ms), IDEM_OK);
    cr_expect_eq(ms, 60000);
    cr_expect_eq(idem__cli_parse_seconds("2.5", &ms), IDEM_OK);
    cr_expect_eq(ms, 2500);
    cr_expect_eq(idem__cli_parse_seconds(".5", &ms), IDEM_OK);
    cr_expect_eq(ms, 500);
    cr_expect_eq(idem__cli_parse_seconds("1.", &ms), IDEM_OK);
    cr_expect_eq(ms, 1000);
    cr_expect_eq(idem__cli_parse_seconds("0.001", &ms), IDEM_OK);
    cr_expect_eq(ms, 1);
    cr_expect_eq(idem__cli_parse_seconds("0.0019", &ms), IDEM_OK);
    cr_expect_eq(ms, 1, "rounds down below a millisecond");
    cr_expect_eq(idem__cli_parse_seconds("86400", &ms), IDEM_OK);
    cr_expect_eq(ms, 86400000);
    cr_expect_eq(idem__cli_parse_seconds("86400.000", &ms), IDEM_OK);
    const char *bad[] = {"0", "0.0", "0.0009", "86400.001", "86401", "", ".", "-1", "+1", "1e3",
                         "1,5", " 1", "1 ", "1.2.3", "0.0000000001", "999999999999999999999", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ms = 77;
        cr_expect_eq(idem__cli_parse_seconds(bad[i], &ms), IDEM_E_INVAL, "accepted '%s'", bad[i]);
        cr_expect_eq(ms, 0);
    }
}

Test(cli_args, test_cli_args__max_time_flag_limits)
{
    refused(PARSE("request", "u", "--max-time", "0"), "--max-time");
    refused(PARSE("request", "u", "--max-time", "86400.5"), "--max-time");
    refused(PARSE("keys", "get", "k", "-m", "abc"), "--max-time");
    cr_expect_eq(PARSE("keys", "get", "k"), IDEM_OK);
    cr_expect_eq(args.max_time_ms, 10000, "keys default to 10 s");
    cr_expect_eq(PARSE("token"), IDEM_OK);
    cr_expect_eq(args.max_time_ms, 10000, "token defaults to 10 s");
}

Test(cli_args, test_cli_args__method_must_be_a_token)
{
    refused(PARSE("request", "u", "-X", ""), "-X");
    refused(PARSE("request", "u", "-X", "PO ST"), "-X");
    refused(PARSE("request", "u", "-X", "GET\r\n"), "-X");
    char longm[IDEM_CLI_MAX_METHOD + 2];
    memset(longm, 'M', sizeof longm - 1);
    longm[sizeof longm - 1] = '\0';
    refused(PARSE("request", "u", "-X", longm), "-X");
    longm[IDEM_CLI_MAX_METHOD] = '\0';
    cr_expect_eq(PARSE("request", "u", "-X", longm), IDEM_OK);
}

Test(cli_args, test_cli_args__header_check)
{
    size_t n = 99;
    cr_expect_eq(idem__cli_header_check("X-A: b", &n), IDEM_OK);
    cr_expect_eq(n, 3);
    cr_expect_eq(idem__cli_header_check("X-A:", NULL), IDEM_OK, "curl's removal form");
    cr_expect_eq(idem__cli_header_check("X-A: tab\there", NULL), IDEM_OK);
    cr_expect_eq(idem__cli_header_check("X-A: caf\xc3\xa9", NULL), IDEM_OK, "obs-text");
    const char *bad[] = {"", ":v", "NoColon", "Bad Name: v", "X(: v", "X: a\r\nY: b", "X: a\nb",
                         "X: \x01", "X: \x7f", " X: v", "X : v"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(idem__cli_header_check(bad[i], &n), IDEM_E_INVAL, "accepted [%s]", bad[i]);
}

Test(cli_args, test_cli_args__headers_idemctl_owns_are_refused)
{
    refused(PARSE("request", "u", "-H", "Idempotency-Key: k"), "use --key");
    refused(PARSE("request", "u", "-H", "idempotency-key: k"), "use --key");
    refused(PARSE("request", "u", "-H", "Content-Length: 1"), "Content-Length");
    refused(PARSE("request", "u", "-H", "transfer-encoding: chunked"), "transfer-encoding");
    refused(PARSE("request", "u", "-H", "X: a\r\nEvil: 1"), "-H");
    refused(PARSE("token", "-H", "Content-Length: 1"), "Content-Length");
}

Test(cli_args, test_cli_args__at_most_100_headers)
{
    static char hv[IDEM_CLI_MAX_HEADERS + 1][32];
    static const char *list[2 * (IDEM_CLI_MAX_HEADERS + 1) + 3];
    size_t n = 0;
    list[n++] = "request";
    list[n++] = "u";
    for (int i = 0; i < IDEM_CLI_MAX_HEADERS; i++) {
        snprintf(hv[i], sizeof hv[i], "X-%d: %d", i, i);
        list[n++] = "-H";
        list[n++] = hv[i];
    }
    list[n] = NULL;
    cr_assert_eq(parse_v(list), IDEM_OK, "%s", err);
    cr_expect_eq(args.n_headers, IDEM_CLI_MAX_HEADERS);
    list[n++] = "-H";
    list[n++] = "X-Last: 1";
    list[n] = NULL;
    idem_err_t e = parse_v(list);
    refused(e, "100");
    cr_expect_eq(e, IDEM_E_TOOBIG);
}

Test(cli_args, test_cli_args__argument_length_limit)
{
    static char big[IDEM_CLI_MAX_ARG + 2];
    memset(big, 'a', sizeof big - 1);
    big[0] = 'X';
    big[1] = ':';
    big[sizeof big - 1] = '\0';
    cr_expect_eq(PARSE("request", "u", "-H", big), IDEM_E_TOOBIG);
    big[sizeof big - 2] = '\0';
    cr_expect_eq(PARSE("request", "u", "-H", big), IDEM_OK, "%s", err);
    memset(big, 'u', sizeof big - 1);
    cr_expect_eq(PARSE("request", big), IDEM_E_TOOBIG);
}

Test(cli_args, test_cli_args__data_and_data_file_exclude_each_other)
{
    refused(PARSE("request", "u", "-d", "a", "--data-file", "f"), "give one");
    refused(PARSE("request", "u", "--data-file", "f", "-d", "a"), "give one");
    refused(PARSE("request", "u", "--data-file", ""), "--data-file");
    cr_expect_eq(PARSE("request", "u", "--data-file", "-"), IDEM_OK);
    cr_expect_str_eq(args.data_file, "-");
}

Test(cli_args, test_cli_args__key_is_read_as_idemd_reads_it)
{
    cr_expect_eq(PARSE("request", "u", "--key", "\"a b\""), IDEM_OK);
    cr_expect_str_eq(args.key, "a b");
    cr_expect_eq(PARSE("request", "u", "--key", "  k  "), IDEM_OK);
    cr_expect_str_eq(args.key, "k");
    char k255[256];
    memset(k255, 'k', 255);
    k255[255] = '\0';
    cr_expect_eq(PARSE("request", "u", "--key", k255), IDEM_OK);
    cr_expect_str_eq(args.key, k255);
    char k256[257];
    memset(k256, 'k', 256);
    k256[256] = '\0';
    refused(PARSE("request", "u", "--key", k256), "--key");
    refused(PARSE("request", "u", "--key", ""), "--key");
    refused(PARSE("request", "u", "--key", "a b"), "quote it");
    refused(PARSE("request", "u", "--key", "\"a\\x\""), "--key");
    refused(PARSE("request", "u", "--key", "caf\xc3\xa9"), "--key");
}

Test(cli_args, test_cli_args__keys_commands)
{
    cr_assert_eq(PARSE("keys", "get", "order-1"), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_KEYS_GET);
    cr_expect_str_eq(args.key, "order-1");
    cr_expect_str_eq(args.scope, "anonymous");
    cr_expect_str_eq(args.url, "http://127.0.0.1:8081");
    cr_assert_eq(PARSE("keys", "delete", "--admin", "http://a:1", "\"x y\""), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_KEYS_DELETE);
    cr_expect_str_eq(args.key, "x y");
    cr_expect_str_eq(args.url, "http://a:1");
    refused(PARSE("keys"), "get, delete or list");
    refused(PARSE("keys", "put", "k"), "not get, delete or list");
    /* keys list and keys delete with filters (GET/DELETE /keys) */
    cr_assert_eq(PARSE("keys", "list", "--state", "held", "--limit", "10"), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_KEYS_LIST);
    cr_expect_str_eq(args.state, "held");
    cr_expect_eq(args.limit, 10u);
    cr_assert_eq(PARSE("keys", "delete", "--state", "completed", "--older-than", "1h"), IDEM_OK,
                 "%s", err);
    cr_expect(args.bulk);
    cr_expect_str_eq(args.older_than, "1h");
    refused(PARSE("keys", "delete"), "needs a KEY or filters");
    refused(PARSE("keys", "delete", "k", "--state", "held"), "not both");
    refused(PARSE("keys", "list", "--state", "done"), "--state");
    refused(PARSE("keys", "list", "--older-than", "soon"), "--older-than");
    refused(PARSE("keys", "list", "--limit", "1001"), "--limit");
    refused(PARSE("keys", "list", "k"), "takes no KEY");
    refused(PARSE("keys", "get", "k", "--state", "held"), "--state");
    refused(PARSE("keys", "get"), "needs a KEY");
    refused(PARSE("keys", "get", "a b"), "not a valid key");
    refused(PARSE("keys", "get", "k", "k2"), "unexpected argument");
    refused(PARSE("keys", "get", "k", "--admin", ""), "empty URL");
}

Test(cli_args, test_cli_args__scope_flags)
{
    const char *hex = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
    cr_assert_eq(PARSE("keys", "get", "k", "--scope", hex), IDEM_OK, "%s", err);
    cr_expect_str_eq(args.scope, hex);
    /* SHA-256("secret") */
    cr_assert_eq(PARSE("keys", "get", "k", "--scope-of", "secret"), IDEM_OK, "%s", err);
    cr_expect_str_eq(args.scope, hex);
    cr_assert_eq(PARSE("keys", "get", "k", "--scope", "anonymous"), IDEM_OK);
    cr_expect_str_eq(args.scope, "anonymous");
    refused(PARSE("keys", "get", "k", "--scope", "ANONYMOUS"), "--scope");
    refused(PARSE("keys", "get", "k", "--scope", "2BB80D537B1DA3E38BD30361AA855686BDE0EACD7162FEF6A25FE97BF527A25B"),
            "--scope");
    refused(PARSE("keys", "get", "k", "--scope", "abc"), "--scope");
    refused(PARSE("keys", "get", "k", "--scope", "anonymous", "--scope-of", "x"), "give one");
    refused(PARSE("keys", "get", "k", "--scope-of", "x", "--scope", "anonymous"), "give one");
}

Test(cli_args, test_cli_args__token_command)
{
    cr_assert_eq(PARSE("token"), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_TOKEN);
    cr_expect_str_eq(args.url, "http://127.0.0.1:8080");
    cr_assert_eq(PARSE("token", "--url", "http://x:9", "-H", "Authorization: Bearer t"), IDEM_OK);
    cr_expect_str_eq(args.url, "http://x:9");
    cr_expect_eq(args.n_headers, 1);
}

Test(cli_args, test_cli_args__help_and_version)
{
    cr_expect_eq(PARSE("--help"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_HELP);
    cr_expect_eq(PARSE("help"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_HELP);
    cr_expect_eq(PARSE("request", "--help"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_HELP, "a command's --help needs no URL");
    cr_expect_eq(PARSE("keys", "-h"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_HELP);
    cr_expect_eq(PARSE("--version"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_VERSION);
    cr_expect_eq(PARSE("-V"), IDEM_OK);
    cr_expect_eq(args.cmd, IDEM_CLI_VERSION);
}

Test(cli_args, test_cli_args__error_messages_are_one_line)
{
    refused(PARSE("request", "u", "-X", "A\nB"), "-X");
    refused(PARSE("bad\ncommand"), "unknown command");
    refused(PARSE("request", "u", "v\nw"), "unexpected argument");
}

Test(cli_args, test_cli_args__key_header_forms)
{
    char out[IDEM_CLI_KEY_HEADER_MAX];
    cr_expect_eq(idem__cli_key_header("abc-1", out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "Idempotency-Key: abc-1");
    cr_expect_eq(idem__cli_key_header("a b", out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "Idempotency-Key: \"a b\"");
    cr_expect_eq(idem__cli_key_header("a\"b\\c", out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "Idempotency-Key: \"a\\\"b\\\\c\"");
    cr_expect_eq(idem__cli_key_header("x,y;z=1", out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "Idempotency-Key: x,y;z=1");
    /* The worst case fits the advertised room: 255 characters all escaped. */
    char worst[IDEM_KEY_MAX + 1];
    memset(worst, '"', IDEM_KEY_MAX);
    worst[IDEM_KEY_MAX] = '\0';
    cr_expect_eq(idem__cli_key_header(worst, out, sizeof out), IDEM_OK);
    cr_expect_eq(strlen(out), strlen("Idempotency-Key: ") + 2 + 2 * IDEM_KEY_MAX);
    cr_expect_eq(idem__cli_key_header("abc", out, 10), IDEM_E_TOOBIG);
    cr_expect_str_eq(out, "");
    cr_expect_eq(idem__cli_key_header("abc", out, 21), IDEM_OK, "20 characters and the NUL");
    cr_expect_eq(idem__cli_key_header("abc", out, 20), IDEM_E_TOOBIG);
    cr_expect_eq(idem__cli_key_header("a b", out, 23), IDEM_OK);
    cr_expect_eq(idem__cli_key_header("a b", out, 22), IDEM_E_TOOBIG);
}

Test(cli_args, test_cli_args__key_header_round_trips_through_key_parse)
{
    const char *keys[] = {"abc", "a b", " lead", "trail ", "\"", "\\", "a\"b", "x\\\"y", "   ", "~!#"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char line[IDEM_CLI_KEY_HEADER_MAX], back[IDEM_KEY_MAX + 1];
        cr_assert_eq(idem__cli_key_header(keys[i], line, sizeof line), IDEM_OK);
        const char *v = line + strlen("Idempotency-Key: ");
        cr_expect_eq(idem_key_parse(v, strlen(v), back), IDEM_OK, "[%s] -> [%s]", keys[i], v);
        cr_expect_str_eq(back, keys[i]);
    }
}

Test(cli_args, test_cli_args__pct_encode)
{
    char out[64];
    cr_expect_eq(idem__cli_pct_encode("aZ09-._~", 8, out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "aZ09-._~");
    cr_expect_eq(idem__cli_pct_encode("a b/+%?#\"", 9, out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "a%20b%2F%2B%25%3F%23%22");
    cr_expect_eq(idem__cli_pct_encode("\xff", 1, out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "%FF");
    cr_expect_eq(idem__cli_pct_encode("", 0, out, sizeof out), IDEM_OK);
    cr_expect_str_eq(out, "");
    cr_expect_eq(idem__cli_pct_encode("ab", 2, out, 3), IDEM_OK);
    cr_expect_eq(idem__cli_pct_encode("abc", 3, out, 3), IDEM_E_TOOBIG);
    cr_expect_str_eq(out, "");
    cr_expect_eq(idem__cli_pct_encode(" ", 1, out, 3), IDEM_E_TOOBIG);
    cr_expect_eq(idem__cli_pct_encode(" ", 1, out, 4), IDEM_OK);
    cr_expect_eq(idem__cli_pct_encode("", 0, out, 0), IDEM_E_TOOBIG);
}

Test(cli_args, test_cli_args__is_token)
{
    cr_expect(idem__cli_is_token("GET", 3));
    cr_expect(idem__cli_is_token("!#$%&'*+-.^_`|~09azAZ", 21));
    cr_expect(!idem__cli_is_token("", 0));
    cr_expect(!idem__cli_is_token("a b", 3));
    cr_expect(!idem__cli_is_token("a:b", 3));
    cr_expect(!idem__cli_is_token("a\0b", 3));
    cr_expect(!idem__cli_is_token("\"a\"", 3));
}

Test(cli_args, test_cli_args__conformance_defaults)
{
    cr_assert_eq(PARSE("conformance", "http://h:8080"), IDEM_OK, "%s", err);
    cr_expect_eq(args.cmd, IDEM_CLI_CONFORMANCE);
    cr_expect_str_eq(args.url, "http://h:8080");
    cr_expect_str_eq(args.method, "POST");
    cr_expect_eq(args.path, NULL);
    cr_expect_str_eq(args.body, IDEM_CLI_DEFAULT_CONF_BODY);
    cr_expect_str_eq(args.marker, "X-Idempotent-Replay");
    cr_expect_eq(args.max_time_ms, IDEM_CLI_DEFAULT_CONF_TIME_MS);
    cr_expect(!args.json);
}

Test(cli_args, test_cli_args__conformance_every_flag)
{
    cr_assert_eq(PARSE("conformance", "--path", "/v1/charges?x=1", "--method=PATCH", "--body",
                       "{}", "--marker", "Idempotent-Replayed", "--timeout", "2.5", "--json",
                       "-H", "Authorization: Bearer t", "http://h"),
                 IDEM_OK, "%s", err);
    cr_expect_str_eq(args.path, "/v1/charges?x=1");
    cr_expect_str_eq(args.method, "PATCH");
    cr_expect_str_eq(args.body, "{}");
    cr_expect_str_eq(args.marker, "Idempotent-Replayed");
    cr_expect_eq(args.max_time_ms, 2500);
    cr_expect(args.json);
    cr_expect_eq(args.n_headers, 1);
}

Test(cli_args, test_cli_args__conformance_refuses)
{
    refused(PARSE("conformance"), "needs a URL");
    refused(PARSE("conformance", "http://h", "--path", "pay"), "--path");
    refused(PARSE("conformance", "http://h", "--path", "/a b"), "--path");
    refused(PARSE("conformance", "http://h", "--method", "PO ST"), "--method");
    refused(PARSE("conformance", "http://h", "--marker", "a:b"), "--marker");
    refused(PARSE("conformance", "http://h", "--timeout", "0"), "--timeout");
    refused(PARSE("conformance", "http://h", "--max-time", "1"), "not an option of conformance");
    refused(PARSE("conformance", "http://h", "-X", "PUT"), "not an option of conformance");
    refused(PARSE("conformance", "http://h", "-H", "Idempotency-Key: k"), "Idempotency-Key");
    refused(PARSE("request", "http://h", "--json"), "not an option of request");
}
