/* src/core/url.h - the parts of a URL, and percent-decoding, inside libidem.
 *
 * The store URLs (redis://[user:password@]host[:port][/db][?...],
 * redis+sentinel://host:port,host:port/master[/db][?...], the query of
 * every store URL) are read with these functions, so the stores agree on
 * what a URL's parts are and on what an escape means.  Nothing here
 * allocates, and every function returns the first problem it finds as an
 * idem__url_status_t, with the slices a caller needs to say where: the
 * sentences are the caller's (each store names itself in its messages).
 * The grammar, the choices and the limits are described at the top of
 * src/core/url.c.  Not installed: internal to libidem.  (src/http has its
 * own decoder for request targets: http depends on nothing of ours.)
 *
 * THREADING: no state; reentrant.
 */
#ifndef IDEM_CORE_URL_H
#define IDEM_CORE_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest host name or IPv6 address (without brackets) taken: DNS
 * names are at most 253 bytes. */
#define IDEM__URL_HOST_MAX 255
/* Most digits of a number idem__url_number reads (no overflow below). */
#define IDEM__URL_DIGITS_MAX 18

typedef enum idem__url_status {
    IDEM__URL_OK = 0,
    IDEM__URL_E_SCHEME,        /* no "//", and no scheme ALPHA *(ALPHA DIGIT + - .) ':' "//" */
    IDEM__URL_E_NO_SLASHES,    /* a scheme, then no "//" */
    IDEM__URL_E_BRACKET,       /* a '[' without its ']' */
    IDEM__URL_E_AFTER_BRACKET, /* "[addr]" followed by something else than ":port" */
    IDEM__URL_E_IPV6,          /* "[addr]" with a character no IPv6 address has (bad) */
    IDEM__URL_E_HOST_CHAR,     /* a host with a character no host name has (bad) */
    IDEM__URL_E_NO_HOST,       /* an empty host */
    IDEM__URL_E_HOST_LONG,     /* a host longer than IDEM__URL_HOST_MAX */
    IDEM__URL_E_PORT,          /* a port that is not 1..65535 in at most 5 digits */
    IDEM__URL_E_ESCAPE,        /* a '%' without two hex digits after it */
    IDEM__URL_E_NUL,           /* "%00": decoded text is a C string */
    IDEM__URL_E_SPACE,         /* the decoded text does not fit the buffer */
} idem__url_status_t;

/* A URL cut into its parts: slices of the parsed text, nothing decoded,
 * nothing checked beyond the cutting (hosts: idem__url_host_port; user
 * and password: idem__url_decode; query: idem__url_next_param). */
typedef struct idem__url {
    const char *scheme; /* without its ':'; scheme_len 0 when the text starts with "//" */
    size_t scheme_len;
    bool has_userinfo; /* the authority has an '@' */
    const char *userinfo; /* up to the authority's LAST '@' */
    size_t userinfo_len;
    const char *user; /* userinfo up to its first ':' (all of it without one) */
    size_t user_len;
    bool has_password; /* the userinfo has a ':' */
    const char *password; /* userinfo after its first ':' */
    size_t password_len;
    const char *hosts; /* the authority after the userinfo: "host[:port]", or a
                        * comma-separated list of them, as written */
    size_t hosts_len;
    const char *path; /* from the first '/' after "//" up to the query; "" without one */
    size_t path_len;
    bool has_query; /* the text has a '?' */
    const char *query; /* after the first '?', without it */
    size_t query_len;
} idem__url_t;

/** Cut "[scheme:]//[userinfo@]hosts[/path][?query]" (len bytes at s) into *u.
 * Every pointer of *u points into s.
 * @return IDEM__URL_OK, IDEM__URL_E_SCHEME or IDEM__URL_E_NO_SLASHES (*u is
 *         then zeroed). */
idem__url_status_t idem__url_parse(const char *s, size_t len, idem__url_t *u);

/* One "host[:port]" or "[IPv6][:port]". */
typedef struct idem__url_host {
    const char *host; /* without the brackets; set as soon as it is known */
    size_t host_len;
    bool ipv6;          /* written in brackets */
    bool has_port;      /* a ':' after the host */
    const char *port_text; /* what follows that ':' */
    size_t port_len;
    int port;           /* 1..65535; 0 without a port */
    char bad;           /* E_HOST_CHAR, E_IPV6: the character refused */
} idem__url_host_t;

/** Read one "host[:port]" (a name of letters, digits, '.', '-' and '_', or
 * an IPv4 address) or "[addr][:port]" (hex digits, ':' and '.') in the len
 * bytes at s.  The checks run in this order: brackets, characters, empty,
 * length, port; the first that fails is the answer.
 * @return IDEM__URL_OK or one of E_BRACKET, E_AFTER_BRACKET, E_IPV6,
 *         E_HOST_CHAR, E_NO_HOST, E_HOST_LONG, E_PORT. */
idem__url_status_t idem__url_host_port(const char *s, size_t len, idem__url_host_t *h);

/** Percent-decode the len bytes at s into out (cap bytes, the NUL
 * included); *out_len (may be NULL) gets the decoded length.  '+' is a
 * plus sign.  Errors are found in reading order, so the first is reported.
 * @return IDEM__URL_OK, E_ESCAPE, E_NUL or E_SPACE (out is then ""
 *         when cap > 0). */
idem__url_status_t idem__url_decode(const char *s, size_t len, char *out, size_t cap,
                                    size_t *out_len);

/** The value of a hexadecimal digit, or -1. */
int idem__url_hexval(int c);

/** A decimal number of 1 to max_digits digits (at most
 * IDEM__URL_DIGITS_MAX) and nothing else: no sign, no space.
 * @return true with *out set, or false (*out untouched). */
bool idem__url_number(const char *s, size_t len, size_t max_digits, uint64_t *out);

/** A port: idem__url_number with 5 digits, 1..65535. */
bool idem__url_port(const char *s, size_t len, int *port);

/* One '&'-separated item of a query. */
typedef struct idem__url_param {
    const char *item; /* the whole item, as written */
    size_t item_len;
    const char *name; /* before its first '=' (all of it without one) */
    size_t name_len;
    bool has_value; /* the item has a '=' */
    const char *value; /* after that '=', not decoded */
    size_t value_len;
} idem__url_param_t;

/** Take the next item of a query and advance *cursor past it and its '&'.
 * The query ends at end, or at its NUL when end is NULL.  An empty item
 * ("a=1&&b=2") is returned as one (item_len 0); a '&' at the very end
 * makes none.
 * @return true with *p set, or false at the end of the query. */
bool idem__url_next_param(const char **cursor, const char *end, idem__url_param_t *p);

#endif /* IDEM_CORE_URL_H */
