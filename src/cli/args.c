/* src/cli/args.c - idemctl's command line, parsed without any I/O.
 *
 * The grammar follows curl where the two meet, so that a curl user's fingers
 * work: short flags take their value attached or as the next argument
 * ("-XPUT", "-X PUT"), long flags as the next argument or after '='
 * ("--key=K"), boolean short flags combine ("-iv"), options and the URL come
 * in any order, "--" ends the options, a repeated scalar flag takes its last
 * value, -H accumulates, and repeated -d values are joined with '&'.
 *
 * What curl accepts and idemctl refuses, because idemctl exists to send a
 * non-idempotent request exactly as meant: a -H that is not "Name: value"
 * (no header injection through CR or LF), an Idempotency-Key header (the
 * key is idemctl's: --key), Content-Length or Transfer-Encoding headers (the
 * body's framing is libcurl's), -d together with --data-file, and numbers
 * outside their range.  Limits: IDEM_CLI_MAX_* in args.h.
 *
 * THREADING: pure functions.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli/args.h"
#include "idem/units.h"

/* Which commands take an option: bits of 1 << idem_cli_cmd_t. */
#define ON(cmd) (1u << (cmd))
#define ON_REQ ON(IDEM_CLI_REQUEST)
#define ON_KEYS (ON(IDEM_CLI_KEYS_GET) | ON(IDEM_CLI_KEYS_DELETE) | ON(IDEM_CLI_KEYS_LIST))
#define ON_BULK (ON(IDEM_CLI_KEYS_DELETE) | ON(IDEM_CLI_KEYS_LIST))
#define ON_TOKEN ON(IDEM_CLI_TOKEN)
#define ON_CONF ON(IDEM_CLI_CONFORMANCE)

enum opt_id {
    OPT_HELP,
    OPT_METHOD,
    OPT_DATA,
    OPT_DATA_FILE,
    OPT_HEADER,
    OPT_KEY,
    OPT_RETRIES,
    OPT_MAX_TIME,
    OPT_INCLUDE,
    OPT_VERBOSE,
    OPT_SCOPE,
    OPT_SCOPE_OF,
    OPT_ADMIN,
    OPT_ADMIN_TOKEN_FILE,
    OPT_URL,
    OPT_PATH,
    OPT_CONF_METHOD,
    OPT_BODY,
    OPT_MARKER,
    OPT_TIMEOUT,
    OPT_JSON,
    OPT_STATE,
    OPT_PREFIX,
    OPT_OLDER_THAN,
    OPT_LIMIT,
};

typedef struct opt {
    const char *name; /* the long form, with its "--" */
    char letter;      /* the short form's letter, or 0 */
    bool takes_value;
    unsigned cmds;    /* ON(...) bits of the commands that accept it */
    enum opt_id id;
} opt_t;

static const opt_t opts[] = {
    {.name = "--help", .letter = 'h', .cmds = ~0u, .id = OPT_HELP},
    {.name = "--request", .letter = 'X', .takes_value = true, .cmds = ON_REQ, .id = OPT_METHOD},
    {.name = "--data", .letter = 'd', .takes_value = true, .cmds = ON_REQ, .id = OPT_DATA},
    {.name = "--data-file", .takes_value = true, .cmds = ON_REQ, .id = OPT_DATA_FILE},
    {.name = "--header", .letter = 'H', .takes_value = true, .cmds = ON_REQ | ON_TOKEN | ON_CONF,
     .id = OPT_HEADER},
    {.name = "--key", .takes_value = true, .cmds = ON_REQ, .id = OPT_KEY},
    {.name = "--retries", .takes_value = true, .cmds = ON_REQ, .id = OPT_RETRIES},
    {.name = "--max-time", .letter = 'm', .takes_value = true, .cmds = ~0u & ~ON_CONF,
     .id = OPT_MAX_TIME},
    {.name = "--include", .letter = 'i', .cmds = ON_REQ, .id = OPT_INCLUDE},
    {.name = "--verbose", .letter = 'v', .cmds = ON_REQ, .id = OPT_VERBOSE},
    {.name = "--scope", .takes_value = true, .cmds = ON_KEYS, .id = OPT_SCOPE},
    {.name = "--scope-of", .takes_value = true, .cmds = ON_KEYS, .id = OPT_SCOPE_OF},
    {.name = "--admin", .takes_value = true, .cmds = ON_KEYS, .id = OPT_ADMIN},
    {.name = "--admin-token-file", .takes_value = true, .cmds = ON_KEYS,
     .id = OPT_ADMIN_TOKEN_FILE},
    {.name = "--url", .takes_value = true, .cmds = ON_TOKEN, .id = OPT_URL},
    {.name = "--path", .takes_value = true, .cmds = ON_CONF, .id = OPT_PATH},
    {.name = "--method", .takes_value = true, .cmds = ON_CONF, .id = OPT_CONF_METHOD},
    {.name = "--body", .takes_value = true, .cmds = ON_CONF, .id = OPT_BODY},
    {.name = "--marker", .takes_value = true, .cmds = ON_CONF, .id = OPT_MARKER},
    {.name = "--timeout", .takes_value = true, .cmds = ON_CONF, .id = OPT_TIMEOUT},
    {.name = "--json", .cmds = ON_CONF, .id = OPT_JSON},
    {.name = "--state", .takes_value = true, .cmds = ON_BULK, .id = OPT_STATE},
    {.name = "--prefix", .takes_value = true, .cmds = ON_BULK, .id = OPT_PREFIX},
    {.name = "--older-than", .takes_value = true, .cmds = ON_BULK, .id = OPT_OLDER_THAN},
    {.name = "--limit", .takes_value = true, .cmds = ON(IDEM_CLI_KEYS_LIST), .id = OPT_LIMIT},
};

/* The parse in progress: what a later check needs to know about earlier flags. */
typedef struct state {
    idem_cli_args_t *a;
    char *err;
    size_t errlen;
    const char *positional; /* URL (request) or KEY (keys) */
    bool scope_given, scope_of_given;
} state_t;

static const char *cmd_name(idem_cli_cmd_t c)
{
    switch (c) {
    case IDEM_CLI_REQUEST: return "request";
    case IDEM_CLI_KEYS_GET: return "keys get";
    case IDEM_CLI_KEYS_DELETE: return "keys delete";
    case IDEM_CLI_KEYS_LIST: return "keys list";
    case IDEM_CLI_TOKEN: return "token";
    case IDEM_CLI_CONFORMANCE: return "conformance";
    default: return "idemctl";
    }
}

static idem_err_t fail(state_t *st, idem_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static idem_err_t fail(state_t *st, idem_err_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, st->errlen, fmt, ap);
    va_end(ap);
    /* One line whatever the argument held. */
    for (char *p = st->err; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
            *p = '?';
    return err;
}

bool idem__cli_is_token(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
        if (!ok)
            return false;
    }
    return true;
}

idem_err_t idem__cli_header_check(const char *h, size_t *name_len)
{
    const char *colon = strchr(h, ':');
    if (name_len)
        *name_len = 0;
    if (colon == NULL || !idem__cli_is_token(h, (size_t)(colon - h)))
        return IDEM_E_INVAL;
    for (const unsigned char *p = (const unsigned char *)colon + 1; *p; p++)
        if ((*p < 0x20 && *p != '\t') || *p == 0x7f)
            return IDEM_E_INVAL;
    if (name_len)
        *name_len = (size_t)(colon - h);
    return IDEM_OK;
}

idem_err_t idem__cli_parse_seconds(const char *s, int64_t *ms)
{
    int64_t whole = 0, frac_ms = 0;
    size_t i = 0, int_digits = 0, frac_digits = 0;

    *ms = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++, int_digits++) {
        if (whole > IDEM_CLI_MAX_TIME_MS / 1000)
            return IDEM_E_INVAL; /* keeps the sum below from overflowing */
        whole = whole * 10 + (s[i] - '0');
    }
    if (s[i] == '.') {
        for (i++; s[i] >= '0' && s[i] <= '9'; i++, frac_digits++)
            if (frac_digits < 3)
                frac_ms = frac_ms * 10 + (s[i] - '0');
        if (frac_digits > 9)
            return IDEM_E_INVAL;
        for (size_t k = frac_digits; k < 3; k++)
            frac_ms *= 10;
    }
    if (s[i] != '\0' || int_digits + frac_digits == 0)
        return IDEM_E_INVAL;
    int64_t v = whole * 1000 + frac_ms;
    if (v < 1 || v > IDEM_CLI_MAX_TIME_MS)
        return IDEM_E_INVAL;
    *ms = v;
    return IDEM_OK;
}

idem_err_t idem__cli_key_header(const char *key, char *out, size_t cap)
{
    static const char prefix[] = "Idempotency-Key: ";
    size_t o = 0, n = strlen(key);
    bool quote = false;

    for (size_t i = 0; i < n; i++)
        if (key[i] == ' ' || key[i] == '"' || key[i] == '\\')
            quote = true;
    if (cap < sizeof prefix)
        goto toobig;
    memcpy(out, prefix, sizeof prefix - 1);
    o = sizeof prefix - 1;
    if (quote) {
        if (o + 1 >= cap)
            goto toobig;
        out[o++] = '"';
    }
    for (size_t i = 0; i < n; i++) {
        bool esc = quote && (key[i] == '"' || key[i] == '\\');
        if (o + 1 + (esc ? 1 : 0) >= cap)
            goto toobig;
        if (esc)
            out[o++] = '\\';
        out[o++] = key[i];
    }
    if (quote) {
        if (o + 1 >= cap)
            goto toobig;
        out[o++] = '"';
    }
    out[o] = '\0';
    return IDEM_OK;
toobig:
    if (cap > 0)
        out[0] = '\0';
    return IDEM_E_TOOBIG;
}

idem_err_t idem__cli_pct_encode(const char *s, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool plain = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                     c == '-' || c == '.' || c == '_' || c == '~';
        if (o + (plain ? 1 : 3) >= cap) {
            if (cap > 0)
                out[0] = '\0';
            return IDEM_E_TOOBIG;
        }
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 0x0f];
        }
    }
    if (cap == 0)
        return IDEM_E_TOOBIG;
    out[o] = '\0';
    return IDEM_OK;
}

static bool name_is(const char *h, size_t n, const char *name)
{
    return strlen(name) == n && strncasecmp(h, name, n) == 0;
}

static idem_err_t add_header(state_t *st, const char *h)
{
    idem_cli_args_t *a = st->a;
    size_t n;

    if (idem__cli_header_check(h, &n) != IDEM_OK)
        return fail(st, IDEM_E_INVAL, "-H '%.40s': not 'Name: value' with a token name and no "
                    "control characters", h);
    if (a->cmd == IDEM_CLI_REQUEST && name_is(h, n, "Idempotency-Key"))
        return fail(st, IDEM_E_INVAL, "-H Idempotency-Key: idemctl sends the key itself; use --key");
    if (a->cmd == IDEM_CLI_CONFORMANCE && name_is(h, n, "Idempotency-Key"))
        return fail(st, IDEM_E_INVAL, "-H Idempotency-Key: the checks choose their own keys");
    if (name_is(h, n, "Content-Length") || name_is(h, n, "Transfer-Encoding"))
        return fail(st, IDEM_E_INVAL, "-H %.*s: idemctl frames the body itself", (int)n, h);
    if (a->n_headers == IDEM_CLI_MAX_HEADERS)
        return fail(st, IDEM_E_TOOBIG, "more than %d -H headers", IDEM_CLI_MAX_HEADERS);
    if (name_is(h, n, "Content-Type"))
        a->has_content_type = true;
    a->headers[a->n_headers++] = h;
    return IDEM_OK;
}

/* Whether s is printable ASCII with spaces (a key's characters). */
static bool is_key_chars(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return false;
    return true;
}

static idem_err_t set_value(state_t *st, const opt_t *o, const char *v)
{
    idem_cli_args_t *a = st->a;

    if (o->id != OPT_DATA && strlen(v) > IDEM_CLI_MAX_ARG)
        return fail(st, IDEM_E_TOOBIG, "%s: longer than %d bytes", o->name, IDEM_CLI_MAX_ARG);
    switch (o->id) {
    case OPT_METHOD:
    case OPT_CONF_METHOD:
        if (strlen(v) > IDEM_CLI_MAX_METHOD || !idem__cli_is_token(v, strlen(v)))
            return fail(st, IDEM_E_INVAL, "%s '%.40s': not an HTTP method name",
                        o->id == OPT_METHOD ? "-X" : o->name, v);
        a->method = v;
        return IDEM_OK;
    case OPT_PATH:
        if (v[0] != '/')
            return fail(st, IDEM_E_INVAL, "--path '%.40s': not a path beginning with '/'", v);
        for (const unsigned char *p = (const unsigned char *)v; *p; p++)
            if (*p <= 0x20 || *p >= 0x7f || *p == '#')
                return fail(st, IDEM_E_INVAL, "--path '%.40s': only visible ASCII, no '#' "
                            "(percent-encode the rest)", v);
        a->path = v;
        return IDEM_OK;
    case OPT_BODY:
        a->body = v;
        return IDEM_OK;
    case OPT_MARKER:
        if (!idem__cli_is_token(v, strlen(v)) || strlen(v) > 256)
            return fail(st, IDEM_E_INVAL, "--marker '%.40s': not a header name", v);
        a->marker = v;
        return IDEM_OK;
    case OPT_TIMEOUT:
        if (idem__cli_parse_seconds(v, &a->max_time_ms) != IDEM_OK)
            return fail(st, IDEM_E_INVAL, "--timeout '%.40s': not a number of seconds from 0.001 "
                        "to 86400", v);
        return IDEM_OK;
    case OPT_DATA:
        if (a->data_file != NULL)
            return fail(st, IDEM_E_INVAL, "-d and --data-file: give one");
        if ((a->has_data && idem__buf_append(&a->data, "&", 1) != 0) ||
            idem__buf_append_str(&a->data, v) != 0)
            return fail(st, IDEM_E_TOOBIG, "-d: the data is larger than 64 MiB");
        a->has_data = true;
        return IDEM_OK;
    case OPT_DATA_FILE:
        if (a->has_data)
            return fail(st, IDEM_E_INVAL, "-d and --data-file: give one");
        if (*v == '\0')
            return fail(st, IDEM_E_INVAL, "--data-file: empty file name");
        a->data_file = v;
        return IDEM_OK;
    case OPT_HEADER:
        return add_header(st, v);
    case OPT_KEY:
        if (idem_key_parse(v, strlen(v), a->key) != IDEM_OK)
            return fail(st, IDEM_E_INVAL, "--key '%.60s': not a valid key (1 to 255 visible ASCII "
                        "characters; quote it, \"a b\", to include spaces)", v);
        return IDEM_OK;
    case OPT_RETRIES: {
        unsigned n = 0;
        size_t i = 0;
        for (; v[i] >= '0' && v[i] <= '9' && n <= IDEM_CLI_MAX_RETRIES; i++)
            n = n * 10 + (unsigned)(v[i] - '0');
        if (i == 0 || v[i] != '\0' || n > IDEM_CLI_MAX_RETRIES)
            return fail(st, IDEM_E_INVAL, "--retries '%.40s': not a number from 0 to %d", v,
                        IDEM_CLI_MAX_RETRIES);
        a->retries = n;
        return IDEM_OK;
    }
    case OPT_MAX_TIME:
        if (idem__cli_parse_seconds(v, &a->max_time_ms) != IDEM_OK)
            return fail(st, IDEM_E_INVAL, "--max-time '%.40s': not a number of seconds from 0.001 "
                        "to 86400", v);
        return IDEM_OK;
    case OPT_SCOPE:
        if (st->scope_of_given)
            return fail(st, IDEM_E_INVAL, "--scope and --scope-of: give one");
        if (!idem_scope_valid(v))
            return fail(st, IDEM_E_INVAL, "--scope '%.70s': not \"anonymous\" or 64 lowercase hex "
                        "digits (--scope-of hashes an Authorization value)", v);
        memcpy(a->scope, v, strlen(v) + 1);
        st->scope_given = true;
        return IDEM_OK;
    case OPT_SCOPE_OF:
        if (st->scope_given)
            return fail(st, IDEM_E_INVAL, "--scope and --scope-of: give one");
        idem_scope_from_header(v, strlen(v), a->scope);
        if (a->scope[0] == '\0')
            return fail(st, IDEM_E_NOMEM, "--scope-of: could not hash the value");
        st->scope_of_given = true;
        return IDEM_OK;
    case OPT_ADMIN_TOKEN_FILE:
        if (*v == '\0')
            return fail(st, IDEM_E_INVAL, "--admin-token-file: empty file name");
        a->admin_token_file = v;
        return IDEM_OK;
    case OPT_ADMIN:
    case OPT_URL:
        if (*v == '\0')
            return fail(st, IDEM_E_INVAL, "%s: empty URL", o->name);
        a->url = v;
        return IDEM_OK;
    case OPT_STATE:
        if (strcmp(v, "in_progress") != 0 && strcmp(v, "completed") != 0 && strcmp(v, "held") != 0)
            return fail(st, IDEM_E_INVAL, "--state '%.40s': not in_progress, completed or held", v);
        a->state = v;
        return IDEM_OK;
    case OPT_PREFIX:
        if (*v == '\0' || strlen(v) > IDEM_KEY_MAX || !is_key_chars(v))
            return fail(st, IDEM_E_INVAL, "--prefix '%.40s': 1 to 255 visible ASCII characters", v);
        a->prefix = v;
        return IDEM_OK;
    case OPT_OLDER_THAN: {
        int64_t ms;
        if (idem_parse_duration(v, &ms) != IDEM_OK)
            return fail(st, IDEM_E_INVAL, "--older-than '%.40s': not a duration (30s, 10m, 2h)", v);
        a->older_than = v;
        return IDEM_OK;
    }
    case OPT_LIMIT: {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (errno != 0 || *end != '\0' || *v < '0' || *v > '9' || n < 1 || n > 1000)
            return fail(st, IDEM_E_INVAL, "--limit '%.40s': not a number from 1 to 1000", v);
        a->limit = (unsigned)n;
        return IDEM_OK;
    }
    default:
        return IDEM_OK;
    }
}


static void set_flag(idem_cli_args_t *a, const opt_t *o)
{
    if (o->id == OPT_HELP)
        a->cmd = IDEM_CLI_HELP;
    else if (o->id == OPT_INCLUDE)
        a->include = true;
    else if (o->id == OPT_VERBOSE)
        a->verbose = true;
    else if (o->id == OPT_JSON)
        a->json = true;
}

static const opt_t *find_long(const char *arg, size_t n)
{
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (strlen(opts[i].name) == n && memcmp(opts[i].name, arg, n) == 0)
            return &opts[i];
    return NULL;
}

static const opt_t *find_short(char c)
{
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (opts[i].letter == c)
            return &opts[i];
    return NULL;
}

/* The option must belong to the command being parsed. */
static idem_err_t check_cmd(state_t *st, const opt_t *o, const char *as_given)
{
    if (o->cmds & ON(st->a->cmd))
        return IDEM_OK;
    return fail(st, IDEM_E_INVAL, "%s: not an option of %s", as_given, cmd_name(st->a->cmd));
}

/* One "--name", "--name=value" or "--name value" at argv[*i]. */
static idem_err_t parse_long(state_t *st, int argc, char *const argv[], int *i)
{
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    const opt_t *o = find_long(arg, n);
    char shown[48];

    snprintf(shown, sizeof shown, "%.*s", (int)(n < 40 ? n : 40), arg);
    if (o == NULL)
        return fail(st, IDEM_E_INVAL, "unknown option %s (try idemctl --help)", shown);
    idem_err_t err = check_cmd(st, o, o->name);
    if (err)
        return err;
    if (!o->takes_value) {
        if (eq)
            return fail(st, IDEM_E_INVAL, "%s takes no value", o->name);
        set_flag(st->a, o);
        return IDEM_OK;
    }
    if (eq)
        return set_value(st, o, eq + 1);
    if (*i + 1 >= argc)
        return fail(st, IDEM_E_INVAL, "%s needs a value", o->name);
    return set_value(st, o, argv[++*i]);
}

/* One "-x", "-xVALUE", "-x VALUE" or a run of flags "-iv" at argv[*i]. */
static idem_err_t parse_short(state_t *st, int argc, char *const argv[], int *i)
{
    const char *arg = argv[*i];

    for (size_t k = 1; arg[k] != '\0'; k++) {
        const opt_t *o = find_short(arg[k]);
        char shown[3] = {'-', arg[k], '\0'};
        if (o == NULL || (unsigned char)arg[k] < 0x21 || (unsigned char)arg[k] > 0x7e)
            return fail(st, IDEM_E_INVAL, "unknown option %s (try idemctl --help)",
                        (unsigned char)arg[k] >= 0x21 && (unsigned char)arg[k] <= 0x7e ? shown
                                                                                       : "-?");
        idem_err_t err = check_cmd(st, o, shown);
        if (err)
            return err;
        if (!o->takes_value) {
            set_flag(st->a, o);
            continue;
        }
        if (arg[k + 1] != '\0')
            return set_value(st, o, arg + k + 1);
        if (*i + 1 >= argc)
            return fail(st, IDEM_E_INVAL, "%s needs a value", shown);
        return set_value(st, o, argv[++*i]);
    }
    return IDEM_OK;
}

static idem_err_t add_positional(state_t *st, const char *arg)
{
    idem_cli_args_t *a = st->a;

    if (a->cmd == IDEM_CLI_TOKEN || st->positional != NULL) {
        char shown[48];
        snprintf(shown, sizeof shown, "%.40s%s", arg, strlen(arg) > 40 ? "..." : "");
        return fail(st, IDEM_E_INVAL, "unexpected argument '%s' to %s", shown, cmd_name(a->cmd));
    }
    if (strlen(arg) > IDEM_CLI_MAX_ARG)
        return fail(st, IDEM_E_TOOBIG, "%s: argument longer than %d bytes", cmd_name(a->cmd),
                    IDEM_CLI_MAX_ARG);
    st->positional = arg;
    return IDEM_OK;
}

/* After every argument: the positional argument and the defaults. */
static idem_err_t finish(state_t *st)
{
    idem_cli_args_t *a = st->a;

    switch (a->cmd) {
    case IDEM_CLI_REQUEST:
    case IDEM_CLI_CONFORMANCE:
        if (st->positional == NULL || *st->positional == '\0')
            return fail(st, IDEM_E_INVAL, "%s needs a URL (try idemctl --help)", cmd_name(a->cmd));
        a->url = st->positional;
        return IDEM_OK;
    case IDEM_CLI_KEYS_LIST:
        if (st->positional != NULL)
            return fail(st, IDEM_E_INVAL, "keys list takes no KEY (use --prefix)");
        a->scope_given = st->scope_given || st->scope_of_given;
        if (a->url == NULL)
            a->url = IDEM_CLI_DEFAULT_ADMIN;
        return IDEM_OK;
    case IDEM_CLI_KEYS_GET:
    case IDEM_CLI_KEYS_DELETE:
        a->scope_given = st->scope_given || st->scope_of_given;
        if (a->cmd == IDEM_CLI_KEYS_DELETE && st->positional == NULL &&
            (a->scope_given || a->state || a->prefix || a->older_than)) {
            a->bulk = true; /* DELETE /keys with the filters */
            if (a->url == NULL)
                a->url = IDEM_CLI_DEFAULT_ADMIN;
            return IDEM_OK;
        }
        if (st->positional != NULL && (a->state || a->prefix || a->older_than))
            return fail(st, IDEM_E_INVAL, "%s: give a KEY or filters (--state, --prefix, "
                        "--older-than, --scope), not both", cmd_name(a->cmd));
        if (st->positional == NULL)
            return fail(st, IDEM_E_INVAL, "%s needs a KEY%s", cmd_name(a->cmd),
                        a->cmd == IDEM_CLI_KEYS_DELETE ? " or filters" : "");
        if (idem_key_parse(st->positional, strlen(st->positional), a->key) != IDEM_OK)
            return fail(st, IDEM_E_INVAL, "%s: '%.60s' is not a valid key (1 to 255 visible ASCII "
                        "characters; quote it, \"a b\", to include spaces)", cmd_name(a->cmd),
                        st->positional);
        if (a->url == NULL)
            a->url = IDEM_CLI_DEFAULT_ADMIN;
        if (a->scope[0] == '\0')
            memcpy(a->scope, "anonymous", sizeof "anonymous");
        return IDEM_OK;
    case IDEM_CLI_TOKEN:
        if (a->url == NULL)
            a->url = IDEM_CLI_DEFAULT_URL;
        return IDEM_OK;
    default:
        return IDEM_OK;
    }
}

static idem_err_t parse_command(state_t *st, int argc, char *const argv[], int *i)
{
    idem_cli_args_t *a = st->a;
    const char *c = argv[*i];

    if (strcmp(c, "request") == 0) {
        a->cmd = IDEM_CLI_REQUEST;
        a->method = "POST";
        a->max_time_ms = IDEM_CLI_DEFAULT_MAX_TIME_MS;
    } else if (strcmp(c, "keys") == 0) {
        if (*i + 1 >= argc)
            return fail(st, IDEM_E_INVAL, "keys needs get, delete or list");
        const char *sub = argv[++*i];
        if (strcmp(sub, "get") == 0) {
            a->cmd = IDEM_CLI_KEYS_GET;
            a->method = "GET";
        } else if (strcmp(sub, "delete") == 0) {
            a->cmd = IDEM_CLI_KEYS_DELETE;
            a->method = "DELETE";
        } else if (strcmp(sub, "list") == 0) {
            a->cmd = IDEM_CLI_KEYS_LIST;
            a->method = "GET";
        } else if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
            a->cmd = IDEM_CLI_HELP;
            return IDEM_OK;
        } else {
            return fail(st, IDEM_E_INVAL, "keys %.40s: not get, delete or list", sub);
        }
        a->max_time_ms = IDEM_CLI_DEFAULT_ADMIN_TIME_MS;
    } else if (strcmp(c, "token") == 0) {
        a->cmd = IDEM_CLI_TOKEN;
        a->method = "POST";
        a->max_time_ms = IDEM_CLI_DEFAULT_ADMIN_TIME_MS;
    } else if (strcmp(c, "conformance") == 0) {
        a->cmd = IDEM_CLI_CONFORMANCE;
        a->method = "POST";
        a->max_time_ms = IDEM_CLI_DEFAULT_CONF_TIME_MS;
        a->body = IDEM_CLI_DEFAULT_CONF_BODY;
        a->marker = IDEM_CLI_DEFAULT_MARKER;
    } else if (strcmp(c, "help") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0) {
        a->cmd = IDEM_CLI_HELP;
    } else if (strcmp(c, "--version") == 0 || strcmp(c, "-V") == 0) {
        a->cmd = IDEM_CLI_VERSION;
    } else {
        char shown[48];
        snprintf(shown, sizeof shown, "%.40s%s", c, strlen(c) > 40 ? "..." : "");
        return fail(st, IDEM_E_INVAL, "unknown command '%s' (try idemctl --help)", shown);
    }
    ++*i;
    return IDEM_OK;
}

idem_err_t idem__cli_args_parse(int argc, char *const argv[], idem_cli_args_t *a, char *errbuf,
                                size_t errlen)
{
    state_t st = {.a = a, .err = errbuf, .errlen = errlen};
    int i = 1;

    memset(a, 0, sizeof *a);
    idem__buf_init(&a->data, IDEM_CLI_MAX_BODY);
    a->retries = IDEM_CLI_DEFAULT_RETRIES;
    if (errlen > 0)
        errbuf[0] = '\0';
    if (argc < 2)
        return fail(&st, IDEM_E_INVAL, "no command (try idemctl --help)");
    idem_err_t err = parse_command(&st, argc, argv, &i);
    if (err || a->cmd == IDEM_CLI_HELP || a->cmd == IDEM_CLI_VERSION)
        return err;
    bool options_done = false;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0)
            options_done = true;
        else if (!options_done && arg[0] == '-' && arg[1] == '-')
            err = parse_long(&st, argc, argv, &i);
        else if (!options_done && arg[0] == '-' && arg[1] != '\0')
            err = parse_short(&st, argc, argv, &i);
        else
            err = add_positional(&st, arg);
        if (err)
            return err;
        if (a->cmd == IDEM_CLI_HELP)
            return IDEM_OK;
    }
    return finish(&st);
}

void idem__cli_args_cleanup(idem_cli_args_t *a)
{
    idem__buf_cleanup(&a->data);
}
