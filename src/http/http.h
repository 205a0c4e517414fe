/* src/http/http.h - HTTP/1.1 message parsing and writing, free of I/O.
 *
 * The parser works on whatever bytes have arrived so far: call it again with
 * the grown buffer and it answers INCOMPLETE until a whole head is there,
 * then fills an idem_http_msg_t whose slices point into the caller's buffer
 * (zero-copy: nothing is copied, the buffer must outlive the message).  Bodies
 * are decoded by idem_http_body_t, a small state machine fed with successive
 * pieces of input, which hands back slices of body data (chunked framing is
 * stripped without copying).
 *
 * It is strict where RFC 9112 asks a recipient to be, because a proxy that is
 * lenient where its upstream is strict (or the reverse) can be used to
 * smuggle requests: Content-Length with Transfer-Encoding, several or invalid
 * Content-Length values, a Transfer-Encoding other than a final "chunked",
 * obs-fold, white space before a colon, bad token characters in a method or
 * header name, control characters in values, bare CR, and a head larger than
 * the limit are all errors.  A bare LF line ending is accepted.
 *
 * THREADING: no shared state; every function is reentrant.
 */
#ifndef IDEM_HTTP_H
#define IDEM_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IDEM_HTTP_MAX_HEADERS 100           /* more is 431 */
#define IDEM_HTTP_MAX_HEAD (16 * 1024)      /* default head limit, bytes */

typedef struct idem_slice {
    const char *ptr;
    size_t len;
} idem_slice_t;

typedef struct idem_http_field {
    idem_slice_t name;  /* as received (compare case-insensitively) */
    idem_slice_t value; /* leading and trailing white space removed */
} idem_http_field_t;

typedef enum idem_http_framing {
    IDEM_HTTP_BODY_NONE = 0,    /* no body (no CL/TE on a request; HEAD/1xx/204/304 answer) */
    IDEM_HTTP_BODY_LENGTH = 1,  /* content_length bytes */
    IDEM_HTTP_BODY_CHUNKED = 2, /* chunked transfer coding */
    IDEM_HTTP_BODY_EOF = 3,     /* response read until the connection closes */
} idem_http_framing_t;

/* Results of the head parser.  Negative values are errors. */
#define IDEM_HTTP_OK 1                   /* (never returned by parse_*; see below) */
#define IDEM_HTTP_INCOMPLETE 0           /* need more bytes */
#define IDEM_HTTP_E_BAD (-1)             /* malformed: 400 and close */
#define IDEM_HTTP_E_HEAD_TOO_LARGE (-2)  /* head over the limit: 431 */
#define IDEM_HTTP_E_TOO_MANY_HEADERS (-3)/* over IDEM_HTTP_MAX_HEADERS: 431 */
#define IDEM_HTTP_E_VERSION (-4)         /* not HTTP/1.0 or 1.1: 505 */
#define IDEM_HTTP_E_SMUGGLE (-5)         /* ambiguous framing (CL+TE, bad CL, bad TE): 400 */
#define IDEM_HTTP_E_BODY (-6)            /* malformed body (chunk syntax): 400 */
#define IDEM_HTTP_E_BODY_TOO_LARGE (-7)  /* body over the caller's limit: 413 */

typedef struct idem_http_msg {
    /* request line (requests only) */
    idem_slice_t method;
    idem_slice_t target;
    /* status line (responses only) */
    int status;
    idem_slice_t reason;
    int version_minor;                 /* 0 for HTTP/1.0, 1 for HTTP/1.1 */
    idem_http_field_t fields[IDEM_HTTP_MAX_HEADERS];
    size_t n_fields;
    size_t head_len;                   /* bytes of the head, final blank line included */
    idem_http_framing_t framing;
    uint64_t content_length;           /* with IDEM_HTTP_BODY_LENGTH */
    bool keep_alive;                   /* per version and Connection */
    bool expect_continue;              /* request: Expect: 100-continue */
    bool upgrade;                      /* Connection: upgrade / Upgrade header present */
    /* Which fields the Connection header names (bit i: fields[i]), found once
     * by the parser in time linear in the head; conn_indexed says they were
     * (a message not made by the parser is read the slow way). */
    bool conn_indexed;
    uint64_t conn_named[(IDEM_HTTP_MAX_HEADERS + 63) / 64];
} idem_http_msg_t;

/** Incremental parsing state of one head: only remembers how far the blank
 * line was searched, so a head arriving byte by byte costs O(n) overall. */
typedef struct idem_http_head_state {
    size_t scanned;
} idem_http_head_state_t;

/** Parse a request head from buf[0..len).  Besides the rules above, a second
 * Host field and a target that is none of origin-form ("/..."), absolute- or
 * authority-form ("scheme:..." / "host:port") or "*" (OPTIONS only) are
 * IDEM_HTTP_E_BAD.  Up to two empty lines before the request line are skipped
 * and counted in the head length.
 * @param st        zero it before the first call of each message.
 * @param max_head  the head limit in bytes (IDEM_HTTP_MAX_HEAD); a head still
 *                  unfinished when len reaches it is IDEM_HTTP_E_HEAD_TOO_LARGE
 *                  at once.
 * @param msg       filled on success; its slices point into buf.
 * @return head length (> 0) when complete, IDEM_HTTP_INCOMPLETE, or an
 *         IDEM_HTTP_E_* code. */
int idem__http_parse_request(idem_http_head_state_t *st, const char *buf, size_t len,
                             size_t max_head, idem_http_msg_t *msg);

/** Parse a response head.  request_method is the method of the request it
 * answers (HEAD responses have no body), so the framing is set correctly for
 * HEAD, 1xx, 204 and 304.  Returns as idem__http_parse_request. */
int idem__http_parse_response(idem_http_head_state_t *st, const char *buf, size_t len,
                              size_t max_head, idem_slice_t request_method, idem_http_msg_t *msg);

/** The first field named name (case-insensitive), or NULL. */
const idem_http_field_t *idem__http_find(const idem_http_msg_t *msg, const char *name);

/** How many fields are named name. */
size_t idem__http_count(const idem_http_msg_t *msg, const char *name);

/** Case-insensitive equality of a slice and a NUL-terminated string. */
bool idem__slice_eq_ci(idem_slice_t s, const char *str);

/** Whether name is a hop-by-hop header (Connection, Keep-Alive, Proxy-*,
 * TE, Trailer, Transfer-Encoding, Upgrade) or one listed in the message's
 * Connection header (msg may be NULL: then only the fixed list).
 * Cost: a name that is one of msg's own field names (the same pointer, as
 * when walking msg->fields) or that equals one of them is answered from the
 * parser's index, with no walk over the Connection list, so asking it of
 * every field of a message is linear in the head, however long its
 * Connection list; any other name walks the list once. */
bool idem__http_is_hop_by_hop(const idem_http_msg_t *msg, idem_slice_t name);

/** Whether msg->fields[i] is hop-by-hop, as idem__http_is_hop_by_hop says of
 * its name; constant time for a parsed message. */
bool idem__http_field_is_hop_by_hop(const idem_http_msg_t *msg, size_t i);

/** Test hook: how many name comparisons the parser's Connection index and
 * the hop-by-hop look-ups have made on this thread, so a test can show the
 * work is linear without timing it.  Only ever grows. */
uint64_t idem__http_hop_compares(void);

/* ---- bodies ------------------------------------------------------------ */

typedef struct idem_http_body {
    idem_http_framing_t framing;
    uint64_t remaining;   /* LENGTH: bytes left; CHUNKED: left in this chunk
                             (or the size being read on a chunk-size line) */
    int state;            /* chunked decoder state (private) */
    uint64_t limit;       /* maximum decoded body bytes; 0 = none */
    uint64_t total;       /* decoded bytes so far */
    size_t line_len;      /* bytes of the current chunk-size line (at most 4 KiB),
                             or of the trailer section so far (at most 16 KiB) */
} idem_http_body_t;

#define IDEM_HTTP_BODY_DATA 1  /* *data holds body bytes */
#define IDEM_HTTP_BODY_DONE 2  /* message complete; *consumed bytes used */
/* IDEM_HTTP_INCOMPLETE: all input consumed, need more. */

/** Start decoding the body of msg, refusing more than limit decoded bytes
 * (0: no limit). */
void idem__http_body_init(idem_http_body_t *b, const idem_http_msg_t *msg, uint64_t limit);

/** Feed input.  Consumes a prefix of in (*consumed bytes) and returns
 * IDEM_HTTP_BODY_DATA with *data pointing into in, IDEM_HTTP_BODY_DONE when
 * the body ended, IDEM_HTTP_INCOMPLETE when all input was consumed without
 * data or end, or IDEM_HTTP_E_BODY / IDEM_HTTP_E_BODY_TOO_LARGE.  Call again
 * with the rest of the input until it returns INCOMPLETE or DONE.  For EOF
 * framing call idem__http_body_eof when the connection closes. */
int idem__http_body_feed(idem_http_body_t *b, const char *in, size_t len, size_t *consumed,
                         idem_slice_t *data);

/** The connection closed: IDEM_HTTP_BODY_DONE for EOF framing (and for a
 * body that was already complete), else IDEM_HTTP_E_BODY (the message was cut
 * short), or the error the decoder already returned. */
int idem__http_body_eof(idem_http_body_t *b);

/* ---- targets (target.c) -------------------------------------------------- */

/** The value of a hex digit, or -1. */
int idem__http_hexval(int c);

/** Percent-decode s[0..n) into out (cap bytes, NUL-terminated).  '+' stays '+'.
 * @return the decoded length, or -1 on a bad escape, a decoded NUL, or when
 * it does not fit. */
long idem__http_pct_decode(const char *s, size_t n, char *out, size_t cap);

/** The value of parameter name in the query q[0..n) (after '?'),
 * percent-decoded into out as idem__http_pct_decode does.
 * @return its length, -2 when absent, -1 when it does not decode. */
long idem__http_query_param(const char *q, size_t n, const char *name, char *out, size_t cap);

/* ---- normal targets (target.c; docs/protocol.md section 5) ---------------- */

/* Results of the target normaliser.  Negative values are errors, each a
 * reason to answer 400 (problem type invalid-target). */
#define IDEM_TARGET_OK 0
#define IDEM_TARGET_E_FORM (-1)     /* neither origin-form nor absolute-form http(s)://authority */
#define IDEM_TARGET_E_ESCAPE (-2)   /* a '%' not followed by two hex digits (in the path) */
#define IDEM_TARGET_E_DOT (-3)      /* a "." or ".." segment, however spelt (%2e is '.') */
#define IDEM_TARGET_E_SLASH (-4)    /* %2F or %5C (any case), or a literal '\' */
#define IDEM_TARGET_E_NUL (-5)      /* %00 */
#define IDEM_TARGET_E_EMPTY (-6)    /* an empty segment: "//" */
#define IDEM_TARGET_E_PARAM (-7)    /* a ';' in the path (path parameters) */
#define IDEM_TARGET_E_FRAGMENT (-8) /* a '#' anywhere */
#define IDEM_TARGET_E_SPACE (-9)    /* the output does not fit in cap */

/** A normalised request target: out[0..path_len) is the path, out[0..len)
 * the whole origin-form target (path, then "?query" when there was one). */
typedef struct idem_http_target {
    idem_slice_t authority; /* absolute-form: the authority as received (points into the
                               input); empty for origin-form */
    size_t path_len;
    size_t len;
} idem_http_target_t;

/** Bring the path in[0..n) (it starts with '/' and holds no '?') to its
 * normal spelling in out (cap bytes, NUL-terminated): escapes of unreserved
 * characters decoded, other escapes in upper case; the constructs listed
 * with IDEM_TARGET_E_* refused.
 * @param prefix  in is a route prefix: its last segment may be partial, so
 *                it is not checked for being "." or "..".
 * @return the length written, or an IDEM_TARGET_E_* code.  The output is
 *         never longer than the input, so cap = n + 1 always fits. */
long idem__http_path_normalize(const char *in, size_t n, bool prefix, char *out, size_t cap);

/** Normalise the request target in[0..n) into out (cap bytes,
 * NUL-terminated) as origin-form: the normalised path (from an
 * absolute-form target, the part after the authority, "/" when empty) and
 * the query as received.  Scheme and authority are checked, not copied.
 * @param t  filled on success; its authority points into in.
 * @return IDEM_TARGET_OK, or an IDEM_TARGET_E_* code.  cap = n + 2 always fits. */
int idem__http_target_normalize(const char *in, size_t n, char *out, size_t cap,
                                idem_http_target_t *t);

/** Whether the normalised path path[0..n) begins with the normalised prefix
 * prefix[0..plen), comparing the bytes they decode to (so "%3A" and ":"
 * are alike).  plen == 0 is true. */
bool idem__http_path_has_prefix(const char *path, size_t n, const char *prefix, size_t plen);

/** A sentence saying what an IDEM_TARGET_E_* code refused. */
const char *idem__http_target_strerror(int rc);

/* ---- writing ----------------------------------------------------------- */

/** A growable byte buffer with a hard cap (curl's dynbuf). */
typedef struct idem_buf {
    char *data;
    size_t len;
    size_t cap;   /* allocated */
    size_t max;   /* never grows past this; 0 = no cap */
} idem_buf_t;

void idem__buf_init(idem_buf_t *b, size_t max);
void idem__buf_cleanup(idem_buf_t *b);
void idem__buf_reset(idem_buf_t *b); /* len = 0, keeps memory */
/** Append; returns 0, or -1 when it would pass max or memory ran out (the
 * buffer is left as it was). */
int idem__buf_append(idem_buf_t *b, const void *p, size_t n);
int idem__buf_append_str(idem_buf_t *b, const char *s);
int idem__buf_appendf(idem_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Remove the first n bytes. */
void idem__buf_consume(idem_buf_t *b, size_t n);

/** Append "HTTP/1.1 <status> <reason>\r\n"; -1 also for a status outside
 * 100..999. */
int idem__http_write_status(idem_buf_t *b, int status);
/** Append "Name: value\r\n"; -1 also when name is not a non-empty token or
 * value holds CR, LF or NUL (no header injection), buffer unchanged. */
int idem__http_write_field(idem_buf_t *b, const char *name, size_t name_len, const char *value,
                           size_t value_len);
/** Append one chunk of chunked coding (nothing for n == 0). */
int idem__http_write_chunk(idem_buf_t *b, const void *data, size_t n);
/** Append the last chunk "0\r\n\r\n". */
int idem__http_write_last_chunk(idem_buf_t *b);
/** The standard reason phrase of status ("OK"), or "Unknown". */
const char *idem__http_reason(int status);

/* ---- responses (writer.c) ------------------------------------------------ */

/** A response's head as idemd sends it: everything but the fields that frame
 * it, which idem__http_write_head derives from framing and the request. */
typedef struct idem_http_response {
    int status;                      /* 100..999 */
    idem_slice_t reason;             /* ptr NULL: idem__http_reason(status); else as given
                                        (a relayed upstream's; may be empty) */
    const idem_http_field_t *fields; /* the caller's fields, written in order; none may be
                                        Content-Length, Transfer-Encoding or Connection */
    size_t n_fields;
    idem_http_framing_t framing;     /* how the body that follows is delimited */
    uint64_t content_length;         /* with IDEM_HTTP_BODY_LENGTH */
} idem_http_response_t;

/** What the request being answered asks of its response's head.  All zero
 * is the safe default: HTTP/1.0, not HEAD, the connection closes after. */
typedef struct idem_http_reply {
    int version_minor; /* the request's: an HTTP/1.0 client is told keep-alive */
    bool head;         /* HEAD: the framing fields the body would have, and no body */
    bool keep_alive;   /* the connection stays open after this response */
} idem_http_reply_t;

/** Whether a response with status has no body whatever its request
 * (1xx, 204, 304: RFC 9110 sections 6.4.1, 15.3.5, 15.4.5). */
bool idem__http_status_bodiless(int status);

/** Append the whole head of a response, blank line included, to b:
 *
 *   HTTP/1.1 <status> <reason>
 *   <the caller's fields, in order>
 *   Content-Length: n          framing LENGTH
 *   Transfer-Encoding: chunked framing CHUNKED
 *                              (nothing for EOF and NONE)
 *   Connection: close          the connection ends after (always with EOF)
 *   Connection: keep-alive     an HTTP/1.0 client whose connection stays
 *
 * A 1xx, 204 or 304 response gets no framing field whatever framing says;
 * a 1xx (interim) response gets no Connection field either.  A HEAD request
 * gets the framing fields the body would have had; what follows the head is
 * the caller's business (idem__http_write_response sends no body then).
 *
 * All or nothing: on any error b is left exactly as it was (never a head
 * without its final blank line).
 * @return 0, or -1 when status is outside 100..999, the reason or a field
 *         value holds CR, LF or NUL, a field name is not a token or names a
 *         framing field (Content-Length, Transfer-Encoding, Connection),
 *         framing is CHUNKED for an HTTP/1.0 client or EOF with keep_alive,
 *         or b cannot hold it (its cap, out of memory). */
int idem__http_write_head(idem_buf_t *b, const idem_http_response_t *r, idem_http_reply_t to);

/** Append a whole response framed by its body's length: the head of r with
 * framing LENGTH and content_length n (r's own framing and content_length
 * are not read), then body[0..n) unless the response has none (a HEAD
 * request, 1xx, 204, 304).  All or nothing, as idem__http_write_head, whose
 * errors it returns. */
int idem__http_write_response(idem_buf_t *b, const idem_http_response_t *r, idem_http_reply_t to,
                              const void *body, size_t n);

#endif /* IDEM_HTTP_H */
