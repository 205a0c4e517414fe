/* src/http/body.c - the body decoder: Content-Length, chunked and
 * read-until-close framing (RFC 9112 sections 6 and 7).
 *
 * idem_http_body_t is a state machine fed with successive pieces of input of
 * any size.  Each call consumes a prefix of its input and hands back at most
 * one slice of body data, pointing into that input: chunked framing is
 * stripped without copying, so a caller appends the slice where it wants and
 * calls again with the rest.  Chunked decoding walks the framing one byte at a
 * time and jumps over chunk data, so the cost is linear however the input is
 * split.
 *
 * Everything input controls is bounded: the decoded total (the caller's
 * limit: IDEM_HTTP_E_BODY_TOO_LARGE, checked at each chunk-size line before
 * the data arrives), a chunk-size line with its extensions (MAX_SIZE_LINE),
 * chunk sizes (overflow is an error) and the trailer section (MAX_TRAILER;
 * trailer fields are checked for syntax and discarded).  Chunk data must be
 * followed by exactly CRLF; a chunk-size or trailer line may end in a bare LF
 * like a head line.  White space after a chunk size is allowed only before an
 * extension (";"), as the grammar's BWS says.
 *
 * INVARIANTS: *consumed <= len; a data slice lies inside in[0..*consumed);
 * once the decoder returned DONE or an error it keeps returning it.
 * THREADING: no state outside the arguments.
 */
#include "http.h"

#include <string.h>

#define MAX_SIZE_LINE 4096         /* chunk-size line with extensions */
#define MAX_TRAILER (16 * 1024)    /* the whole trailer section */

enum {
    C_SIZE0,    /* first hex digit of a chunk size */
    C_SIZE,     /* further hex digits */
    C_SIZE_WS,  /* white space after the size: only ';' may follow */
    C_EXT,      /* chunk extensions, up to the end of the line */
    C_SIZE_LF,  /* CR ended the size line, LF expected */
    C_DATA,     /* remaining bytes of chunk data */
    C_DATA_CR,  /* CR expected after chunk data */
    C_DATA_LF,  /* LF expected after chunk data */
    C_TR_START, /* start of a trailer field line or of the final empty line */
    C_TR_NAME,  /* trailer field name */
    C_TR_VALUE, /* trailer field value */
    C_TR_LF,    /* CR ended a trailer field line, LF expected */
    C_END_LF,   /* CR of the final empty line seen, LF expected */
    S_DONE,     /* message complete */
    S_ERR_BODY, /* malformed: IDEM_HTTP_E_BODY from now on */
    S_ERR_SIZE, /* over the limit: IDEM_HTTP_E_BODY_TOO_LARGE from now on */
};

static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Field-value and extension bytes: HTAB, SP, VCHAR, obs-text. */
static bool is_text(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

void idem__http_body_init(idem_http_body_t *b, const idem_http_msg_t *msg, uint64_t limit)
{
    memset(b, 0, sizeof *b);
    b->framing = msg->framing;
    b->limit = limit;
    b->state = C_SIZE0;
    if (b->framing == IDEM_HTTP_BODY_LENGTH) {
        b->remaining = msg->content_length;
        if (limit != 0 && msg->content_length > limit)
            b->state = S_ERR_SIZE;
    }
}

static int fail(idem_http_body_t *b, int state)
{
    b->state = state;
    return state == S_ERR_SIZE ? IDEM_HTTP_E_BODY_TOO_LARGE : IDEM_HTTP_E_BODY;
}

/* The end of a chunk-size line: data follows, or the trailer section. */
static int size_line_done(idem_http_body_t *b)
{
    b->line_len = 0;
    if (b->remaining == 0)
        return C_TR_START;
    if (b->limit != 0 && b->remaining > b->limit - b->total)
        return S_ERR_SIZE;
    return C_DATA;
}

/* One framing byte.  Returns the next state. */
static int step(idem_http_body_t *b, unsigned char c)
{
    switch (b->state) {
    case C_SIZE0:
    case C_SIZE: {
        int v = idem__http_hexval(c);
        if (v >= 0) {
            if (b->remaining > (UINT64_MAX >> 4))
                return S_ERR_BODY;
            b->remaining = (b->remaining << 4) | (uint64_t)v;
            return C_SIZE;
        }
        if (b->state == C_SIZE0)
            return S_ERR_BODY;
        if (c == ' ' || c == '\t')
            return C_SIZE_WS;
        if (c == ';')
            return C_EXT;
        if (c == '\r')
            return C_SIZE_LF;
        if (c == '\n')
            return size_line_done(b);
        return S_ERR_BODY;
    }
    case C_SIZE_WS:
        if (c == ' ' || c == '\t')
            return C_SIZE_WS;
        return c == ';' ? C_EXT : S_ERR_BODY;
    case C_EXT:
        if (c == '\r')
            return C_SIZE_LF;
        if (c == '\n')
            return size_line_done(b);
        return is_text(c) ? C_EXT : S_ERR_BODY;
    case C_SIZE_LF:
        return c == '\n' ? size_line_done(b) : S_ERR_BODY;
    case C_DATA_CR:
        return c == '\r' ? C_DATA_LF : S_ERR_BODY;
    case C_DATA_LF:
        return c == '\n' ? C_SIZE0 : S_ERR_BODY;
    case C_TR_START:
        if (c == '\r')
            return C_END_LF;
        if (c == '\n')
            return S_DONE;
        return is_tchar(c) ? C_TR_NAME : S_ERR_BODY; /* also refuses obs-fold */
    case C_TR_NAME:
        if (c == ':')
            return C_TR_VALUE;
        return is_tchar(c) ? C_TR_NAME : S_ERR_BODY;
    case C_TR_VALUE:
        if (c == '\r')
            return C_TR_LF;
        if (c == '\n')
            return C_TR_START;
        return is_text(c) ? C_TR_VALUE : S_ERR_BODY;
    case C_TR_LF:
        return c == '\n' ? C_TR_START : S_ERR_BODY;
    case C_END_LF:
        return c == '\n' ? S_DONE : S_ERR_BODY;
    default:
        return S_ERR_BODY;
    }
}

static int feed_chunked(idem_http_body_t *b, const char *in, size_t len, size_t *consumed,
                        idem_slice_t *data)
{
    size_t i = 0;
    while (i < len) {
        if (b->state == C_DATA) {
            size_t n = len - i;
            if ((uint64_t)n > b->remaining)
                n = (size_t)b->remaining;
            b->remaining -= n;
            b->total += n;
            if (b->remaining == 0)
                b->state = C_DATA_CR;
            data->ptr = in + i;
            data->len = n;
            *consumed = i + n;
            return IDEM_HTTP_BODY_DATA;
        }
        int before = b->state;
        if (before <= C_SIZE_LF) {
            if (before == C_SIZE0)
                b->remaining = 0;
            if (++b->line_len > MAX_SIZE_LINE)
                return fail(b, S_ERR_BODY);
        } else if (before >= C_TR_START && before <= C_END_LF) {
            if (++b->line_len > MAX_TRAILER)
                return fail(b, S_ERR_BODY);
        }
        b->state = step(b, (unsigned char)in[i++]);
        if (b->state == S_DONE) {
            *consumed = i;
            return IDEM_HTTP_BODY_DONE;
        }
        if (b->state == S_ERR_BODY || b->state == S_ERR_SIZE) {
            *consumed = i;
            return fail(b, b->state);
        }
    }
    *consumed = len;
    return IDEM_HTTP_INCOMPLETE;
}

int idem__http_body_feed(idem_http_body_t *b, const char *in, size_t len, size_t *consumed,
                         idem_slice_t *data)
{
    *consumed = 0;
    data->ptr = NULL;
    data->len = 0;
    if (b->state == S_DONE)
        return IDEM_HTTP_BODY_DONE;
    if (b->state == S_ERR_BODY || b->state == S_ERR_SIZE)
        return fail(b, b->state);

    switch (b->framing) {
    case IDEM_HTTP_BODY_NONE:
        b->state = S_DONE;
        return IDEM_HTTP_BODY_DONE;
    case IDEM_HTTP_BODY_LENGTH: {
        if (b->remaining == 0) {
            b->state = S_DONE;
            return IDEM_HTTP_BODY_DONE;
        }
        if (len == 0)
            return IDEM_HTTP_INCOMPLETE;
        size_t n = len;
        if ((uint64_t)n > b->remaining)
            n = (size_t)b->remaining;
        if (b->limit != 0 && n > b->limit - b->total)
            return fail(b, S_ERR_SIZE);
        b->remaining -= n;
        b->total += n;
        data->ptr = in;
        data->len = n;
        *consumed = n;
        return IDEM_HTTP_BODY_DATA;
    }
    case IDEM_HTTP_BODY_EOF:
        if (len == 0)
            return IDEM_HTTP_INCOMPLETE;
        if (b->limit != 0 && len > b->limit - b->total)
            return fail(b, S_ERR_SIZE);
        b->total += len;
        data->ptr = in;
        data->len = len;
        *consumed = len;
        return IDEM_HTTP_BODY_DATA;
    case IDEM_HTTP_BODY_CHUNKED:
        return feed_chunked(b, in, len, consumed, data);
    }
    return fail(b, S_ERR_BODY);
}

int idem__http_body_eof(idem_http_body_t *b)
{
    if (b->state == S_ERR_BODY || b->state == S_ERR_SIZE)
        return fail(b, b->state);
    if (b->state == S_DONE || b->framing == IDEM_HTTP_BODY_NONE ||
        b->framing == IDEM_HTTP_BODY_EOF ||
        (b->framing == IDEM_HTTP_BODY_LENGTH && b->remaining == 0)) {
        b->state = S_DONE;
        return IDEM_HTTP_BODY_DONE;
    }
    return fail(b, S_ERR_BODY);
}
