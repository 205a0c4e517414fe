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
 *   jwt:CLAIM       a claim of the Bearer JWT in Authorization, once
 *                   src/core/jwt.c has verified its signature, exp and nbf
 *   client_cert     the verified TLS client certificate: its SHA-256 in
 *                   lowercase hex, as the connection hands it in
 *
 * One source: the scope is the lowercase hex SHA-256 of its value, the same
 * value `scope_header` gives.  Several: the SHA-256 of their values, each
 * framed by its length (idem__gw_scope_compute says how).  When a source is
 * absent (or empty), or a JWT fails a check, the scope falls back to the
 * default, in a space of its own: the SHA-256 of IDEM_SCOPE_FALLBACK_TAG
 * followed by Authorization, or "anonymous" without it; with
 * `scope_missing: reject` the request is refused instead (400
 * missing-scope).  Without `scope:` the old `scope_header` rule applies: the
 * SHA-256 of that header, or "anonymous".
 *
 * Authorization is read normalised wherever it is read (the authorization
 * and jwt: sources, the fallback, scope_header: Authorization): when it is
 * a scheme (an HTTP token of at most 64 characters), white space and
 * credentials, the scheme is written as the IANA registry spells it
 * (Bearer, Basic, Digest, ...; other schemes in lower case) and the white
 * space as one space (RFC 9110 section 11: the scheme is case-insensitive).
 * So "Bearer K", "bearer K" and "Bearer \tK" are one caller, and the usual
 * "Bearer K" hashes as before.  A value without white space is left as it
 * is: it is an opaque key whose case may matter.
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
#include <stdint.h>

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
    IDEM_SCOPE_MISSING,                /* one was absent (or a JWT failed) and
                                        * scope_missing is reject: answer 400 */
    IDEM_SCOPE_AMBIGUOUS_COOKIE,       /* the named cookie came twice: answer 400 */
} idem_scope_result_t;

/* What a fallback hashes before Authorization.  It holds a NUL, which no
 * header value, cookie or accepted JWT claim can, and it starts with a byte
 * that is not 0, which every framed list of several values starts with, so
 * a fallback scope never equals a scope of the configured sources. */
#define IDEM_SCOPE_FALLBACK_TAG "idem-scope-fallback\0"
#define IDEM_SCOPE_FALLBACK_TAG_LEN (sizeof IDEM_SCOPE_FALLBACK_TAG - 1)

/* Why a scope fell back (or was refused as missing): ABSENT, or a JWT
 * check's status (src/core/jwt.h: IDEM__JWT_MALFORMED .. IDEM__JWT_CLAIM,
 * the same numbers).  The `reason` of idem_scope_fallback_total. */
#define IDEM_SCOPE_WHY_ABSENT 0u
#define IDEM_SCOPE_N_WHY 8u
const char *idem__gw_scope_why_name(unsigned why);

/* `scope_missing`. */
typedef enum idem_scope_missing {
    IDEM_SCOPE_MISSING_FALLBACK = 0, /* fall back to the default (the default) */
    IDEM_SCOPE_MISSING_REJECT = 1,   /* answer 400 missing-scope */
} idem_scope_missing_t;

struct idem__jwt_keys;

/** What the scope is computed with besides the request. */
typedef struct idem_scope_env {
    const char *client_cert_hex;          /* see idem__gw_scope_compute; NULL: none */
    const struct idem__jwt_keys *jwt;     /* jwt_keys/jwt_secret_file; NULL: every
                                           * jwt: source fails (IDEM__JWT_ALGORITHM) */
    int64_t now_s;                        /* seconds since the epoch, for exp and nbf */
    idem_scope_missing_t missing;
} idem_scope_env_t;

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
 * why not (a phrase for the one-line config error).  Every kind is read
 * now; client_cert only with listen_tls.client_ca_file and jwt: only with
 * jwt_keys or jwt_secret_file (idem__config_validate says so). */
const char *idem__gw_scope_unsupported(idem_scope_kind_t k);

/** The source as written in the config ("cookie:session"), into out. */
void idem__gw_scope_source_text(const idem_scope_source_t *s, char *out, size_t outlen);

/** The caller's scope, as idem__gw_scope_compute_env with an env of
 * client_cert_hex only (no JWT keys, fallback on a missing source). */
idem_scope_result_t idem__gw_scope_compute(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const char *client_cert_hex, char *out, const char **dup);

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
 * @param[in]  env          client_cert_hex, JWT keys, the time, scope_missing.
 * @param[out] dup          with AMBIGUOUS, the name of the header that came
 *                          twice; with AMBIGUOUS_COOKIE, the cookie's name (a
 *                          static or config-owned string); may be NULL.
 * @param[out] why          with a FALLBACK or MISSING, IDEM_SCOPE_WHY_ABSENT or
 *                          the failed JWT check; may be NULL.
 *
 * Authorization, and every header a source names, must come at most once:
 * two would leave open which one names the caller.  The Cookie header may
 * come several times (RFC 6265 allows it after HTTP/2); they are read in
 * order as one list, and a cookie a source names may come once in all of
 * them (even with an empty value): twice is AMBIGUOUS_COOKIE.  A cookie
 * value in double quotes is the value inside them.
 *
 * Several sources are hashed as SHA-256 over, for each source in the order
 * listed, its value's length as 4 bytes big-endian followed by the value's
 * bytes.  The lengths always hold a NUL byte (a head is at most a few MiB),
 * and no header value can, so such a scope never equals the hash of a
 * single value, e.g. a fallback's Authorization. */
idem_scope_result_t idem__gw_scope_compute_env(
    const idem_scope_source_t *sources, size_t n, const char *legacy_header,
    const idem_http_msg_t *m, const idem_scope_env_t *env, char *out, const char **dup,
    unsigned *why);

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
