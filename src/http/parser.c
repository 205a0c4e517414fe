/* src/http/parser.c - the HTTP/1.1 head parser (RFC 9112), requests and
 * responses, incremental and zero-copy.
 *
 * A head is parsed in two steps.  While it is incomplete, each call only
 * searches the new bytes for the blank line that ends it (the state remembers
 * where the search left off), so a head that arrives one byte at a time costs
 * O(n) in total, and a head larger than the limit is refused as soon as the
 * limit is passed, without waiting for its end.  Once the end is there, the
 * whole head is parsed once: the start line, then every field line, then the
 * fields that decide framing (Content-Length, Transfer-Encoding), persistence
 * (Connection) and Expect/Upgrade; and the fields Connection names are
 * marked, in time linear in the head, so a hop-by-hop question about a
 * field is answered in constant time (see "hop-by-hop fields" below).
 *
 * The parser is a gatekeeper for a proxy, so wherever two HTTP
 * implementations could disagree on where a message ends it refuses the
 * message instead of picking one reading (request smuggling):
 *   - Content-Length and Transfer-Encoding together, Content-Length given
 *     twice or as a list (even with equal values), a Content-Length that is
 *     not plain digits or is over 2^53;
 *   - a Transfer-Encoding that is not exactly one field "chunked" (no coding
 *     lists, no second field), or any Transfer-Encoding in an HTTP/1.0
 *     message;
 *   - obs-fold, white space between a field name and its colon, characters
 *     outside the token set in a method or field name, control characters
 *     (HTAB aside) in a value, a bare CR anywhere, and a second Host field.
 * Lines may end in CRLF or a bare LF (RFC 9112 section 2.2).  Up to
 * MAX_EMPTY_LINES empty lines before the start line are skipped (section
 * 2.2 again; for responses too, which some servers send after a body); they
 * count in head_len.
 *
 * INVARIANTS: on success every slice in the message points inside
 * buf[0..head_len) and head_len <= max_head; nothing is allocated or copied.
 * THREADING: no state outside the arguments, but for a per-thread counter
 * of name comparisons that tests read (idem__http_hop_compares).
 */
#include "http.h"

#include <limits.h>
#include <string.h>

#define MAX_EMPTY_LINES 2                  /* skipped before a start line */
#define MAX_CONTENT_LENGTH ((uint64_t)1 << 53)

/* RFC 9110 section 5.6.2: tchar. */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static bool slices_eq_ci(idem_slice_t a, idem_slice_t b)
{
    if (a.len != b.len)
        return false;
    for (size_t i = 0; i < a.len; i++)
        if (lower((unsigned char)a.ptr[i]) != lower((unsigned char)b.ptr[i]))
            return false;
    return true;
}

bool idem__slice_eq_ci(idem_slice_t s, const char *str)
{
    return slices_eq_ci(s, (idem_slice_t){str, strlen(str)});
}

/* The next non-empty element of a comma-separated list (RFC 9110 section
 * 5.6.1), OWS trimmed.  *p walks through [*p, end). */
static bool next_elem(const char **p, const char *end, idem_slice_t *out)
{
    const char *s = *p;
    while (s < end) {
        while (s < end && (is_ows(*s) || *s == ','))
            s++;
        const char *e = s;
        while (e < end && *e != ',')
            e++;
        const char *t = e;
        while (t > s && is_ows(t[-1]))
            t--;
        *p = e;
        if (t > s) {
            out->ptr = s;
            out->len = (size_t)(t - s);
            return true;
        }
        s = e;
    }
    *p = end;
    return false;
}

static bool list_has(idem_slice_t value, const char *token)
{
    const char *p = value.ptr;
    idem_slice_t e;
    while (next_elem(&p, value.ptr + value.len, &e))
        if (idem__slice_eq_ci(e, token))
            return true;
    return false;
}

const idem_http_field_t *idem__http_find(const idem_http_msg_t *msg, const char *name)
{
    for (size_t i = 0; i < msg->n_fields; i++)
        if (idem__slice_eq_ci(msg->fields[i].name, name))
            return &msg->fields[i];
    return NULL;
}

size_t idem__http_count(const idem_http_msg_t *msg, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < msg->n_fields; i++)
        if (idem__slice_eq_ci(msg->fields[i].name, name))
            n++;
    return n;
}

/* ---- hop-by-hop fields ------------------------------------------------------
 *
 * A field is hop-by-hop when its name is on the fixed list or the
 * Connection header names it.  Asking that of every field by walking the
 * Connection list each time costs fields x items: a 16 KiB head can hold
 * 100 fields and a list of 7,000 items.  So the parser indexes the list
 * once (index_connection): the field names are sorted, each item is looked
 * up by binary search, and the fields it names are marked in
 * msg->conn_named; afterwards a field's answer is one bit. */

static _Thread_local uint64_t hop_compares; /* idem__http_hop_compares */

uint64_t idem__http_hop_compares(void)
{
    return hop_compares;
}

/* Case-insensitive order of two names (counted): < 0, 0 or > 0. */
static int names_cmp(idem_slice_t a, idem_slice_t b)
{
    hop_compares++;
    size_t n = a.len < b.len ? a.len : b.len;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = lower((unsigned char)a.ptr[i]), y = lower((unsigned char)b.ptr[i]);
        if (x != y)
            return x < y ? -1 : 1;
    }
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

static bool fixed_hop_by_hop(idem_slice_t name)
{
    static const char *const fixed[] = {
        "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (idem__slice_eq_ci(name, fixed[i]))
            return true;
    return name.len >= 6 && idem__slice_eq_ci((idem_slice_t){name.ptr, 6}, "proxy-");
}

static bool conn_marked(const idem_http_msg_t *msg, size_t i)
{
    return (msg->conn_named[i / 64] >> (i % 64)) & 1u;
}

/* Whether a Connection header of msg lists name: a walk over the list. */
static bool connection_lists(const idem_http_msg_t *msg, idem_slice_t name)
{
    for (size_t i = 0; i < msg->n_fields; i++) {
        const idem_http_field_t *f = &msg->fields[i];
        if (!idem__slice_eq_ci(f->name, "connection"))
            continue;
        const char *p = f->value.ptr;
        idem_slice_t e;
        while (next_elem(&p, f->value.ptr + f->value.len, &e))
            if (names_cmp(e, name) == 0)
                return true;
    }
    return false;
}

/* Mark in msg->conn_named the fields its Connection headers name, in
 * O(head + fields log fields) name comparisons.  has_connection: msg has a
 * Connection field (else nothing is named). */
static void index_connection(idem_http_msg_t *msg, bool has_connection)
{
    size_t n = msg->n_fields;
    memset(msg->conn_named, 0, sizeof msg->conn_named);
    msg->conn_indexed = true;
    if (!has_connection || n == 0)
        return;
    /* order: the fields sorted by name (a bottom-up merge sort). */
    uint8_t order[IDEM_HTTP_MAX_HEADERS], tmp[IDEM_HTTP_MAX_HEADERS];
    for (size_t i = 0; i < n; i++)
        order[i] = (uint8_t)i;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = names_cmp(msg->fields[order[b]].name, msg->fields[order[a]].name) < 0
                               ? order[b++]
                               : order[a++];
            while (a < mid)
                tmp[o++] = order[a++];
            while (b < hi)
                tmp[o++] = order[b++];
        }
        memcpy(order, tmp, n);
    }
    /* run[k]: where the run of names equal to order[k]'s begins; named[k]:
     * an item named the run beginning at k. */
    uint8_t run[IDEM_HTTP_MAX_HEADERS];
    bool named[IDEM_HTTP_MAX_HEADERS] = {false};
    run[0] = 0;
    for (size_t k = 1; k < n; k++)
        run[k] = names_cmp(msg->fields[order[k - 1]].name, msg->fields[order[k]].name) == 0
                     ? run[k - 1]
                     : (uint8_t)k;
    for (size_t i = 0; i < n; i++) {
        const idem_http_field_t *f = &msg->fields[i];
        if (!idem__slice_eq_ci(f->name, "connection"))
            continue;
        const char *p = f->value.ptr;
        idem_slice_t e;
        while (next_elem(&p, f->value.ptr + f->value.len, &e)) {
            /* The first sorted name not below e: the start of e's run. */
            size_t lo = 0, hi = n;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (names_cmp(msg->fields[order[mid]].name, e) < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < n && names_cmp(msg->fields[order[lo]].name, e) == 0)
                named[lo] = true;
        }
    }
    for (size_t k = 0; k < n; k++)
        if (named[run[k]])
            msg->conn_named[order[k] / 64] |= (uint64_t)1 << (order[k] % 64);
}

bool idem__http_is_hop_by_hop(const idem_http_msg_t *msg, idem_slice_t name)
{
    if (fixed_hop_by_hop(name))
        return true;
    if (msg == NULL)
        return false;
    if (msg->conn_indexed) {
        /* One of msg's own fields (the usual question): its bit. */
        for (size_t i = 0; i < msg->n_fields; i++)
            if (msg->fields[i].name.ptr == name.ptr && msg->fields[i].name.len == name.len)
                return conn_marked(msg, i);
        for (size_t i = 0; i < msg->n_fields; i++)
            if (msg->fields[i].name.len == name.len && names_cmp(msg->fields[i].name, name) == 0)
                return conn_marked(msg, i);
    }
    return connection_lists(msg, name);
}

bool idem__http_field_is_hop_by_hop(const idem_http_msg_t *msg, size_t i)
{
    if (i >= msg->n_fields)
        return false;
    if (fixed_hop_by_hop(msg->fields[i].name))
        return true;
    return msg->conn_indexed ? conn_marked(msg, i) : connection_lists(msg, msg->fields[i].name);
}

/* Skip up to MAX_EMPTY_LINES empty lines at the start of buf.  Returns 1 with
 * *start set, INCOMPLETE, or E_BAD (a bare CR, or too many empty lines). */
static int skip_empty_lines(const char *buf, size_t len, size_t *start)
{
    size_t p = 0;
    for (int skipped = 0;; skipped++) {
        size_t next;
        if (p >= len)
            return IDEM_HTTP_INCOMPLETE;
        if (buf[p] == '\n') {
            next = p + 1;
        } else if (buf[p] == '\r') {
            if (p + 1 >= len)
                return IDEM_HTTP_INCOMPLETE;
            if (buf[p + 1] != '\n')
                return IDEM_HTTP_E_BAD;
            next = p + 2;
        } else {
            *start = p;
            return 1;
        }
        if (skipped == MAX_EMPTY_LINES)
            return IDEM_HTTP_E_BAD;
        p = next;
    }
}

/* Search buf[from..len) for the end of the head: an LF followed by LF or by
 * CRLF.  Returns true with *end just past it; otherwise false with *resume
 * where the next search must start (an LF whose successors have not all
 * arrived is looked at again). */
static bool find_end(const char *buf, size_t len, size_t from, size_t *end, size_t *resume)
{
    size_t p = from;
    while (p < len) {
        const char *lf = memchr(buf + p, '\n', len - p);
        if (lf == NULL)
            break;
        size_t i = (size_t)(lf - buf);
        if (i + 1 >= len) {
            *resume = i;
            return false;
        }
        if (buf[i + 1] == '\n') {
            *end = i + 2;
            return true;
        }
        if (buf[i + 1] == '\r') {
            if (i + 2 >= len) {
                *resume = i;
                return false;
            }
            if (buf[i + 2] == '\n') {
                *end = i + 3;
                return true;
            }
        }
        p = i + 1;
    }
    *resume = len;
    return false;
}

/* "HTTP/1.0" or "HTTP/1.1"; another well-formed version is E_VERSION. */
static int parse_version(const char *p, size_t n, int *minor)
{
    if (n == 8 && memcmp(p, "HTTP/1.", 7) == 0 && (p[7] == '0' || p[7] == '1')) {
        *minor = p[7] - '0';
        return 1;
    }
    if (n == 8 && memcmp(p, "HTTP/", 5) == 0 && p[5] >= '0' && p[5] <= '9' && p[6] == '.' &&
        p[7] >= '0' && p[7] <= '9')
        return IDEM_HTTP_E_VERSION;
    return IDEM_HTTP_E_BAD;
}

/* origin-form "/...", asterisk-form "*" (OPTIONS only), or absolute-form and
 * authority-form, which both begin with scheme-like characters and a colon. */
static bool target_ok(idem_slice_t method, idem_slice_t t)
{
    if (t.ptr[0] == '/')
        return true;
    if (t.len == 1 && t.ptr[0] == '*')
        return method.len == 7 && memcmp(method.ptr, "OPTIONS", 7) == 0;
    unsigned char c = (unsigned char)t.ptr[0];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
        return false;
    for (size_t i = 1; i < t.len; i++) {
        c = (unsigned char)t.ptr[i];
        if (c == ':')
            return true;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '-' || c == '.'))
            return false;
    }
    return false;
}

static int parse_request_line(const char *l, size_t n, idem_http_msg_t *msg)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    if (i == 0 || i >= n || l[i] != ' ')
        return IDEM_HTTP_E_BAD;
    msg->method = (idem_slice_t){l, i};
    size_t t = ++i;
    while (i < n && (unsigned char)l[i] > 0x20 && (unsigned char)l[i] < 0x7f)
        i++;
    if (i == t || i >= n || l[i] != ' ')
        return IDEM_HTTP_E_BAD;
    msg->target = (idem_slice_t){l + t, i - t};
    if (!target_ok(msg->method, msg->target))
        return IDEM_HTTP_E_BAD;
    i++;
    return parse_version(l + i, n - i, &msg->version_minor);
}

static int parse_status_line(const char *l, size_t n, idem_http_msg_t *msg)
{
    const char *sp = memchr(l, ' ', n);
    if (sp == NULL) {
        int rc = parse_version(l, n, &msg->version_minor);
        return rc < 0 ? rc : IDEM_HTTP_E_BAD;
    }
    int rc = parse_version(l, (size_t)(sp - l), &msg->version_minor);
    if (rc < 0)
        return rc;
    size_t i = (size_t)(sp - l) + 1;
    if (n - i < 3)
        return IDEM_HTTP_E_BAD;
    int status = 0;
    for (size_t k = 0; k < 3; k++) {
        if (l[i + k] < '0' || l[i + k] > '9')
            return IDEM_HTTP_E_BAD;
        status = status * 10 + (l[i + k] - '0');
    }
    if (status < 100 || status > 599)
        return IDEM_HTTP_E_BAD;
    msg->status = status;
    i += 3;
    /* RFC 9112 section 4: the SP before an empty reason is often left out. */
    if (i < n && l[i++] != ' ')
        return IDEM_HTTP_E_BAD;
    for (size_t k = i; k < n; k++) {
        unsigned char c = (unsigned char)l[k];
        if (c != '\t' && (c < 0x20 || c == 0x7f))
            return IDEM_HTTP_E_BAD;
    }
    msg->reason = (idem_slice_t){l + i, n - i};
    return 1;
}

static int parse_field_line(const char *l, size_t n, idem_http_msg_t *msg)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    /* Covers obs-fold (a line starting with SP/HTAB), white space before the
     * colon, a missing colon and an empty name. */
    if (i == 0 || i >= n || l[i] != ':')
        return IDEM_HTTP_E_BAD;
    for (size_t k = i + 1; k < n; k++) {
        unsigned char c = (unsigned char)l[k];
        if (c != '\t' && (c < 0x20 || c == 0x7f))
            return IDEM_HTTP_E_BAD;
    }
    size_t v = i + 1, e = n;
    while (v < e && is_ows(l[v]))
        v++;
    while (e > v && is_ows(l[e - 1]))
        e--;
    if (msg->n_fields == IDEM_HTTP_MAX_HEADERS)
        return IDEM_HTTP_E_TOO_MANY_HEADERS;
    idem_http_field_t *f = &msg->fields[msg->n_fields++];
    f->name = (idem_slice_t){l, i};
    f->value = (idem_slice_t){l + v, e - v};
    return 1;
}

/* 1*DIGIT, at most 2^53. */
static bool parse_length(idem_slice_t v, uint64_t *out)
{
    uint64_t n = 0;
    if (v.len == 0)
        return false;
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9')
            return false;
        n = n * 10 + (uint64_t)(v.ptr[i] - '0');
        if (n > MAX_CONTENT_LENGTH)
            return false;
    }
    *out = n;
    return true;
}

/* Framing, persistence and the flags, from the fields. */
static int interpret(idem_http_msg_t *msg, bool is_request, idem_slice_t request_method)
{
    const idem_http_field_t *cl = NULL, *te = NULL;
    size_t n_cl = 0, n_te = 0, n_host = 0;
    bool close = false, keep = false, expect = false, upgrade = false, has_connection = false;

    for (size_t i = 0; i < msg->n_fields; i++) {
        const idem_http_field_t *f = &msg->fields[i];
        if (idem__slice_eq_ci(f->name, "content-length")) {
            cl = f;
            n_cl++;
        } else if (idem__slice_eq_ci(f->name, "transfer-encoding")) {
            te = f;
            n_te++;
        } else if (idem__slice_eq_ci(f->name, "connection")) {
            has_connection = true;
            close |= list_has(f->value, "close");
            keep |= list_has(f->value, "keep-alive");
        } else if (idem__slice_eq_ci(f->name, "expect")) {
            expect |= idem__slice_eq_ci(f->value, "100-continue");
        } else if (idem__slice_eq_ci(f->name, "upgrade")) {
            upgrade = true;
        } else if (idem__slice_eq_ci(f->name, "host")) {
            n_host++;
        }
    }
    if (is_request && n_host > 1)
        return IDEM_HTTP_E_BAD;

    uint64_t length = 0;
    idem_http_framing_t framing;
    if (n_te > 0) {
        if (n_cl > 0 || msg->version_minor == 0 || n_te > 1 ||
            !idem__slice_eq_ci(te->value, "chunked"))
            return IDEM_HTTP_E_SMUGGLE;
        framing = IDEM_HTTP_BODY_CHUNKED;
    } else if (n_cl > 0) {
        if (n_cl > 1 || !parse_length(cl->value, &length))
            return IDEM_HTTP_E_SMUGGLE;
        framing = IDEM_HTTP_BODY_LENGTH;
    } else {
        framing = is_request ? IDEM_HTTP_BODY_NONE : IDEM_HTTP_BODY_EOF;
    }
    if (!is_request && (msg->status < 200 || msg->status == 204 || msg->status == 304 ||
                        idem__slice_eq_ci(request_method, "HEAD")))
        framing = IDEM_HTTP_BODY_NONE;

    msg->framing = framing;
    msg->content_length = framing == IDEM_HTTP_BODY_LENGTH ? length : 0;
    msg->keep_alive = !close && (msg->version_minor == 1 || keep) &&
                      framing != IDEM_HTTP_BODY_EOF;
    msg->expect_continue = is_request && expect && msg->version_minor == 1;
    msg->upgrade = upgrade;
    index_connection(msg, has_connection);
    return 1;
}

/* Parse the complete head buf[start..end). */
static int parse_head(const char *buf, size_t start, size_t end, bool is_request,
                      idem_slice_t request_method, idem_http_msg_t *msg)
{
    memset(msg, 0, sizeof *msg);
    size_t p = start;
    for (bool first = true;; first = false) {
        const char *lf = memchr(buf + p, '\n', end - p);
        size_t n = (size_t)(lf - (buf + p)); /* an LF is always there: end follows one */
        size_t next = p + n + 1;
        if (n > 0 && buf[p + n - 1] == '\r')
            n--;
        /* A CR left inside the line is refused by each line's character
         * checks: CR is neither a tchar, nor VCHAR, nor allowed in a value. */
        int rc;
        if (first)
            rc = is_request ? parse_request_line(buf + p, n, msg)
                            : parse_status_line(buf + p, n, msg);
        else if (n == 0)
            break;
        else
            rc = parse_field_line(buf + p, n, msg);
        if (rc < 0)
            return rc;
        p = next;
    }
    msg->head_len = end;
    return interpret(msg, is_request, request_method);
}

static int parse(idem_http_head_state_t *st, const char *buf, size_t len, size_t max_head,
                 bool is_request, idem_slice_t request_method, idem_http_msg_t *msg)
{
    if (max_head > INT_MAX)
        max_head = INT_MAX;
    /* A head ends within max_head bytes or is too large, so the search never
     * looks further. */
    size_t scan = len < max_head ? len : max_head;
    size_t start = 0, end = 0;
    int rc = skip_empty_lines(buf, scan, &start);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        size_t from = st->scanned > start ? st->scanned : start;
        if (find_end(buf, scan, from, &end, &st->scanned)) {
            rc = parse_head(buf, start, end, is_request, request_method, msg);
            return rc < 0 ? rc : (int)end;
        }
    }
    if (scan == max_head)
        return IDEM_HTTP_E_HEAD_TOO_LARGE;
    return IDEM_HTTP_INCOMPLETE;
}

int idem__http_parse_request(idem_http_head_state_t *st, const char *buf, size_t len,
                             size_t max_head, idem_http_msg_t *msg)
{
    return parse(st, buf, len, max_head, true, (idem_slice_t){"", 0}, msg);
}

int idem__http_parse_response(idem_http_head_state_t *st, const char *buf, size_t len,
                              size_t max_head, idem_slice_t request_method, idem_http_msg_t *msg)
{
    return parse(st, buf, len, max_head, false, request_method, msg);
}
