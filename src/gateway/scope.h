/* src/gateway/scope.h - who the caller is: the sources of its scope.
 *
 * A record's identity is (scope, key); the scope names the caller, so that
 * one caller can never see, replay or block another's keys (docs/protocol.md
 * section 3).  Where the scope comes from is configured by `scope:`, a list of
 * sources read from the request:
 *
 *   authorization   the Authorization header's value (the default)
 *   header:NAME     that header's value (set by an authenticating proxy)
 *   cookie:NAME     that cookie's value (callers with a session cookie)
 *   jwt:CLAIM       a verified JWT claim            (not supported yet)
 *   client_cert     the verified TLS client certificate: its SHA-256 in
 *                   lowercase hex, as the connection hands it in
 *
 * One source: the scope is the lowercase hex SHA-256 of its value, the same
 * value `scope_header` gives.  Several: the SHA-256 of their values, each
 * framed by its length (idem__gw_scope_compute says how).  When a source is
 * absent (or empty) the scope falls back to the default: the SHA-256 of
 * Authorization, or "anonymous" without it.  Without `scope:` the old
 * `scope_header` rule applies unchanged: the SHA-256 of that header, or
 * "anonymous".
 *
 * This file is pure: it reads a parsed request and the configuration, and
 * never touches a socket, a loop or the store.
 *
 * THREADING: no state; every function is reentrant.
 */
#ifndef IDEM_GATEWAY_SCOPE_H
#define IDEM_GATEWAY_SCOPE_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http.h"
#include "idem/key.h"

#define IDEM_SCOPE_MAX_SOURCES 8 /* entries of `scope:` */
#define IDEM_SCOPE_NAME_MAX 128  /* characters of a header or cookie name, or a claim */

/** The kinds of source.  The list only grows. */
typedef enum idem_scope_kind {
    IDEM_SCOPE_SRC_AUTHORIZATION = 0, /* the Authorization header */
    IDEM_SCOPE_SRC_HEADER = 1,        /* header:NAME */
    IDEM_SCOPE_SRC_COOKIE = 2,        /* cookie:NAME */
    IDEM_SCOPE_SRC_JWT = 3,           /* jwt:CLAIM, a claim of a verified Bearer JWT */
    IDEM_SCOPE_SRC_CLIENT_CERT = 4,   /* client_cert, the verified TLS client certificate */
} idem_scope_kind_t;

/** One entry of `scope:`. */
typedef struct idem_scope_source {
    idem_scope_kind_t kind;
    char name[IDEM_SCOPE_NAME_MAX + 1]; /* HEADER, COOKIE: the name; JWT: the claim
                                         * path ("sub", "org.id"); else "" */
} idem_scope_source_t;

/** What idem__gw_scope_compute found. */
typedef enum idem_scope_result {
    IDEM_SCOPE_FROM_SOURCES = 0,       /* every configured source was there */
    IDEM_SCOPE_FALLBACK_AUTHORIZATION, /* one was absent: the SHA-256 of Authorization */
    IDEM_SCOPE_FALLBACK_ANONYMOUS,     /* one was absent, and so was Authorization */
    IDEM_SCOPE_AMBIGUOUS,              /* a header it reads came twice: answer 400 */
    IDEM_SCOPE_NOMEM,                  /* nothing could be hashed: answer 500 */
} idem_scope_result_t;

/** Parse one entry of `scope:` ("authorization", "header:X-User",
 * "cookie:session", "jwt:org.id", "client_cert").  Source words are lower
 * case; NAME is an HTTP token (a claim: letters, digits, '_', '-' and '.'
 * between names) of at most IDEM_SCOPE_NAME_MAX characters.
 * "header:Authorization" (any case) is the same source as "authorization".
 * @param[out] out  filled on success, zeroed on failure.
 * @param[out] why  on failure a phrase naming the problem.
 * @return 0, or -1. */
int idem__gw_scope_parse_source(const char *text, idem_scope_source_t *out, char *why,
                                size_t whylen);

/** Whether this idemd can read a source of kind k; NULL when it can, else
 * why not (a phrase for the one-line config error: jwt: comes with the JWT
 * work).  client_cert is read, but only with listen_tls.client_ca_file
 * (idem__config_validate says so). */
const char *idem__gw_scope_unsupported(idem_scope_kind_t k);

/** The source as written in the config ("cookie:session"), into out. */
void idem__gw_scope_source_text(const idem_scope_source_t *s, char *out, size_t outlen);

/** The caller's scope.
 * @param[in]  sources, n   the `scope:` list; n == 0 means the old rule:
 *                          legacy_header's value, or "anonymous".
 * @param[in]  legacy_header  `scope_header` (used only when n == 0).
 * @param[in]  m            the request.
 * @param[in]  client_cert_hex  the lowercase hex SHA-256 of the client
 *                          certificate its TLS connection verified, the
 *                          value of a client_cert source; NULL: no verified
 *                          certificate (a plain listener, or none sent), and
 *                          client_cert is absent, falling back as other
 *                          absent sources do.
 * @param[out] out          IDEM_SCOPE_MAX + 1 bytes: 64 lowercase hex digits
 *                          or "anonymous"; "" unless the result is
 *                          FROM_SOURCES or a FALLBACK.
 * @param[out] dup          with AMBIGUOUS, the name of the header that came
 *                          twice (a static or config-owned string); may be NULL.
 *
 * Authorization, and every header a source names, must come at most once:
 * two would leave open which one names the caller.  The Cookie header may
 * come several times (RFC 6265 allows it after HTTP/2); they are read in
 * order as one list, and the first cookie of a name is the one used.
 *
 * Several sources are hashed as SHA-256 over, for each source in the order
 * listed, its value's length as 4 bytes big-endian followed by the value's
 * bytes.  The lengths always hold a NUL byte (a head is at most a few MiB),
 * and no header value can, so such a scope never equals the hash of a
 * single value, e.g. a fallback's Authorization. */
idem_scope_result_t idem__gw_scope_compute(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const char *client_cert_hex, char *out, const char **dup);

/** The value of the first cookie named name (case-sensitive, RFC 6265) in the
 * Cookie header value hdr[0..len): pairs separated by ';', white space around
 * names and values ignored, a pair without '=' skipped, the value as sent
 * (quotes included).  @return whether it was found; *out points into hdr. */
bool idem__gw_cookie_get(const char *hdr, size_t len, const char *name, idem_slice_t *out);

/** Whether the scope is read from a header called name (case-insensitive):
 * Authorization (the fallback), scope_header when n == 0, every header:NAME,
 * and Cookie when a cookie: source is listed.  Such a header is forwarded
 * even when the request's Connection header names it (docs/protocol.md section 2), so
 * idemd and the upstream see the same caller. */
bool idem__gw_scope_uses_header(const idem_scope_source_t *sources, size_t n,
                                const char *legacy_header, idem_slice_t name);

#endif /* IDEM_GATEWAY_SCOPE_H */
