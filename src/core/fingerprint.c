/* src/core/fingerprint.c - what makes two requests "the same request".
 *
 * A fingerprint is SHA-256 over a byte stream of frames.  A frame is
 *
 *     tag (1 byte) | length (8 bytes, big-endian) | that many bytes
 *
 * and the stream is, in this order:
 *
 *     'V' "idem-fp-1"               the version of this encoding
 *     'M' method                    as received (methods are case-sensitive)
 *     'T' target                    path and query, as received
 *     per configured header, in the configured order:
 *       'N' name                    ASCII-lowercased, so Content-Type and
 *                                   content-type are one header
 *       'P' value                   when the request carries the header, or
 *       'A' (empty)                 when it does not: absent is not ""
 *     'J' canonical JSON            with body_json, when the body is JSON, or
 *     'B' body                      the raw bytes otherwise
 *
 * Every frame says how long it is and the tags say where in the grammar it
 * stands, so the stream can be cut back into its fields in exactly one way:
 * method "POST" with target "/a" and method "POS" with target "T/a" hash
 * different streams, and so do a header that is absent and one that is
 * empty.  A change to this encoding changes every fingerprint, and stored
 * records would then answer 422 to honest retries across an upgrade: bump
 * the version frame and say so in the release notes.
 *
 * Canonical JSON (idem_json_canonicalize): jansson parses the text (any
 * value at top level, RFC 8259), the members named by JSON pointers are
 * removed, and it is written back with object keys sorted by their UTF-8
 * bytes (memcmp order: "A" < "a" < "z" < "é") and no white space.  What
 * follows from jansson and is therefore part of the contract:
 *   - Numbers keep their kind: 1 and 1.0 are different (an integer and a
 *     real), while 1.0, 1.00, 1e0 and 100e-2 are all the real 1.0.  Reals
 *     are written with 17 significant digits, so they round-trip exactly.
 *     An integer beyond int64 or a real beyond double is not accepted.
 *   - Strings are written as UTF-8 with the shortest escapes, so "\u00e9"
 *     and "é", or "\/" and "/", are the same string.
 *   - An object with a duplicate key is treated as not JSON: which value
 *     would win is up to each parser, and a canonical form that silently
 *     dropped one could make two different payloads look the same.  So are
 *     \u0000 in a string and invalid UTF-8.
 *   - Nesting deeper than IDEM_JSON_MAX_DEPTH arrays/objects is not JSON
 *     either (jansson's own limit is 2048; recursion that deep on every
 *     request is not worth having).  Checked before parsing, without
 *     allocating.
 * In the fingerprint, "not JSON" means the body is hashed raw (frame 'B'),
 * as docs/protocol.md section 4 says.
 *
 * JSON pointers (RFC 6901): "/a/b" names member b of member a; "~1" stands
 * for "/" and "~0" for "~" inside a token; a token on an array is an index
 * ("0", "17", no leading zeros; "-" names nothing).  All pointers are looked
 * up in the document as received and then all the members they name are
 * removed, so their order does not matter: ["/a/0", "/a/1"] removes the
 * first two elements of a.  A pointer that names nothing, a malformed one
 * (not starting with "/", a "~" not followed by 0 or 1) and "" (the whole
 * document, which cannot be removed from itself) are skipped; a config
 * loader should reject the malformed ones with idem_json_pointer_valid().
 *
 * Memory: libidem sets jansson's allocator to idem_malloc/idem_free once, on
 * first use, so fault injection reaches jansson too.  jansson reports an
 * allocation failure during parsing as a syntax error; idem_alloc_failures()
 * is compared around the parse to tell the two apart, because answering
 * "not JSON" when memory ran short would hash the body raw, give a different
 * fingerprint for the same request and turn an honest retry into a 422.
 * Nothing else in the process may change jansson's allocator.
 * Known limit (found by fuzz/fuzz_json.c): jansson 2.14 does not always get
 * that far.  An allocation that fails while the lexer holds a token longer
 * than 16 bytes trips its assertion in lex_unget_unsave and aborts the
 * process (upstream akheron/jansson#362, open).  Only a failed malloc
 * reaches it, which Linux's overcommit makes rare; the fuzz target injects
 * failures only after the parse for that reason.
 *
 * THREADING: reentrant; the one-time allocator setup is guarded by
 * pthread_once.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"
#include "idem/fingerprint.h"

#define FP_VERSION "idem-fp-1"
#define LOAD_FLAGS (JSON_DECODE_ANY | JSON_REJECT_DUPLICATES)
#define DUMP_FLAGS (JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)

static const char hexdigits[] = "0123456789abcdef";

static void to_hex(const uint8_t *b, size_t n, char *out)
{
    size_t i;

    for (i = 0; i < n; i++) {
        out[2 * i] = hexdigits[b[i] >> 4];
        out[2 * i + 1] = hexdigits[b[i] & 0x0F];
    }
    out[2 * n] = '\0';
}

void idem_fp_hex(const uint8_t fp[IDEM_FP_LEN], char *out)
{
    to_hex(fp, IDEM_FP_LEN, out);
}

/* OpenSSL 3 looks the algorithm up in its provider tables on every
 * EVP_DigestInit with EVP_sha256(); fetching it once saves that lookup on
 * every request (it showed as half the cost of a fingerprint).  The fetched
 * object lives until exit, like OpenSSL's own tables. */
static pthread_once_t md_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void fetch_sha256(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_md(void)
{
    pthread_once(&md_once, fetch_sha256);
    return sha256_fetched ? sha256_fetched : EVP_sha256();
}

void idem_sha256_hex(const void *data, size_t len, char *out)
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;

    if (data == NULL)
        data = "";
    if (!EVP_Digest(data, len, md, &md_len, sha256_md(), NULL) || md_len != 32) {
        out[0] = '\0';
        return;
    }
    to_hex(md, 32, out);
}

/* ---- JSON ---------------------------------------------------------------- */

static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;

static void use_our_allocator(void)
{
    json_set_alloc_funcs(idem_malloc, idem_free);
}

/* Whether text nests arrays/objects deeper than the limit.  Exact for valid
 * JSON; for invalid JSON any answer is fine, since jansson refuses it. */
static int too_deep(const char *text, size_t len)
{
    size_t i, depth = 0;
    int in_str = 0;

    for (i = 0; i < len; i++) {
        char c = text[i];

        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > IDEM_JSON_MAX_DEPTH)
                return 1;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

int idem_json_pointer_valid(const char *ptr)
{
    if (ptr == NULL)
        return 0;
    if (*ptr == '\0')
        return 1;
    if (*ptr != '/')
        return 0;
    for (; *ptr != '\0'; ptr++)
        if (*ptr == '~' && ptr[1] != '0' && ptr[1] != '1')
            return 0;
    return 1;
}

/* A member to remove: parent[key] when key is set, else parent[index]. */
struct target {
    json_t *parent; /* a reference of our own; NULL when the slot is unused */
    char *buf;      /* our copy of the pointer, unescaped in place; owns key */
    const char *key;
    size_t key_len;
    size_t index;
};

/* Unescape the token at tok (up to the next '/' or NUL) in place.  Returns
 * its new length and sets *next past it; SIZE_MAX when a '~' is malformed. */
static size_t unescape_token(char *tok, char **next)
{
    char *r = tok, *w = tok;

    for (; *r != '\0' && *r != '/'; r++) {
        if (*r != '~') {
            *w++ = *r;
            continue;
        }
        r++;
        if (*r == '0')
            *w++ = '~';
        else if (*r == '1')
            *w++ = '/';
        else
            return SIZE_MAX;
    }
    *next = r;
    return (size_t)(w - tok);
}

/* An array index token as RFC 6901 writes it: "0" or no leading zero. */
static int array_index(const char *tok, size_t len, size_t size, size_t *index)
{
    size_t i, v = 0;

    if (len == 0 || (len > 1 && tok[0] == '0'))
        return 0;
    for (i = 0; i < len; i++) {
        if (tok[i] < '0' || tok[i] > '9')
            return 0;
        v = v * 10 + (size_t)(tok[i] - '0');
        if (v >= size) /* also stops the number before it can overflow */
            return 0;
    }
    *index = v;
    return 1;
}

/* Look ptr up in root.  Fills t (parent referenced, buf owned) when it names
 * a member; leaves t empty when it names nothing.  IDEM_E_NOMEM only. */
static idem_err_t resolve(json_t *root, const char *ptr, struct target *t)
{
    json_t *cur = root;
    char *tok, *next;

    if (!idem_json_pointer_valid(ptr) || *ptr == '\0')
        return IDEM_OK;
    t->buf = idem_strdup(ptr);
    if (t->buf == NULL)
        return IDEM_E_NOMEM;
    for (tok = t->buf + 1;; tok = next + 1) {
        size_t len = unescape_token(tok, &next);
        size_t index = 0;
        json_t *child = NULL;
        int last = *next == '\0';

        if (len == SIZE_MAX)
            break;
        if (json_is_object(cur))
            child = json_object_getn(cur, tok, len);
        else if (json_is_array(cur) && array_index(tok, len, json_array_size(cur), &index))
            child = json_array_get(cur, index);
        if (child == NULL)
            break;
        if (last) {
            t->parent = json_incref(cur);
            if (json_is_object(cur)) {
                t->key = tok;
                t->key_len = len;
            }
            t->index = index;
            return IDEM_OK;
        }
        cur = child;
    }
    idem_free(t->buf);
    t->buf = NULL;
    return IDEM_OK;
}

/* Array removals, highest index first within each array, so that removing
 * one element does not move another that is still to be removed. */
static int by_parent_then_index_desc(const void *a, const void *b)
{
    const struct target *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->parent, py = (uintptr_t)y->parent;

    if (px != py)
        return px < py ? -1 : 1;
    if (x->index != y->index)
        return x->index > y->index ? -1 : 1;
    return 0;
}

static idem_err_t drop(json_t *root, const char *const *ignore, size_t n_ignore)
{
    struct target *ts;
    size_t i, n_arr = 0;
    idem_err_t err = IDEM_OK;

    if (n_ignore == 0)
        return IDEM_OK;
    ts = idem_calloc(n_ignore, sizeof *ts);
    if (ts == NULL)
        return IDEM_E_NOMEM;
    for (i = 0; i < n_ignore && !err; i++)
        err = resolve(root, ignore[i], &ts[i]);
    if (!err) {
        /* Object members first (this moves no index), then gather the
         * array elements at the front of ts for sorting. */
        for (i = 0; i < n_ignore; i++) {
            if (ts[i].parent == NULL)
                continue;
            if (ts[i].key != NULL) {
                (void)json_object_deln(ts[i].parent, ts[i].key, ts[i].key_len);
            } else {
                struct target tmp = ts[n_arr];
                ts[n_arr++] = ts[i];
                ts[i] = tmp;
            }
        }
        qsort(ts, n_arr, sizeof *ts, by_parent_then_index_desc);
        for (i = 0; i < n_arr; i++) {
            if (i > 0 && ts[i].parent == ts[i - 1].parent && ts[i].index == ts[i - 1].index)
                continue; /* the same element named twice */
            (void)json_array_remove(ts[i].parent, ts[i].index);
        }
    }
    for (i = 0; i < n_ignore; i++) {
        json_decref(ts[i].parent);
        idem_free(ts[i].buf);
    }
    idem_free(ts);
    return err;
}

idem_err_t idem_json_canonicalize(const char *text, size_t len, const char *const *ignore,
                                  size_t n_ignore, char **out, size_t *out_len)
{
    json_error_t jerr;
    json_t *root;
    unsigned long failures;
    size_t size;
    char *buf;
    idem_err_t err;

    if (out != NULL)
        *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (out == NULL || out_len == NULL || (text == NULL && len > 0) ||
        (ignore == NULL && n_ignore > 0))
        return IDEM_E_INVAL;
    if (text == NULL || too_deep(text, len))
        return IDEM_E_INVAL;
    (void)pthread_once(&alloc_once, use_our_allocator);

    failures = idem_alloc_failures();
    root = json_loadb(text, len, LOAD_FLAGS, &jerr);
    if (root == NULL) {
        if (idem_alloc_failures() != failures ||
            json_error_code(&jerr) == json_error_out_of_memory)
            return IDEM_E_NOMEM;
        return IDEM_E_INVAL;
    }
    err = drop(root, ignore, n_ignore);
    if (err) {
        json_decref(root);
        return err;
    }
    /* The shortest output is one byte, so 0 means jansson ran out of
     * memory (sorting keys allocates). */
    size = json_dumpb(root, NULL, 0, DUMP_FLAGS);
    buf = size > 0 && size < SIZE_MAX ? idem_malloc(size + 1) : NULL;
    if (buf == NULL || json_dumpb(root, buf, size, DUMP_FLAGS) != size) {
        idem_free(buf);
        json_decref(root);
        return IDEM_E_NOMEM;
    }
    json_decref(root);
    buf[size] = '\0';
    *out = buf;
    *out_len = size;
    return IDEM_OK;
}

/* ---- the fingerprint ------------------------------------------------------ */

static int frame_head(EVP_MD_CTX *ctx, char tag, size_t len)
{
    unsigned char h[9];
    uint64_t n = (uint64_t)len;
    int i;

    h[0] = (unsigned char)tag;
    for (i = 8; i >= 1; i--) {
        h[i] = (unsigned char)(n & 0xFF);
        n >>= 8;
    }
    return EVP_DigestUpdate(ctx, h, sizeof h);
}

static int frame(EVP_MD_CTX *ctx, char tag, const void *data, size_t len)
{
    if (!frame_head(ctx, tag, len))
        return 0;
    return len == 0 || EVP_DigestUpdate(ctx, data, len);
}

/* The 'N' frame: the name lowercased in pieces, so no copy is needed. */
static int frame_lower(EVP_MD_CTX *ctx, char tag, const char *s, size_t len)
{
    char chunk[64];
    size_t i, n;

    if (!frame_head(ctx, tag, len))
        return 0;
    while (len > 0) {
        n = len < sizeof chunk ? len : sizeof chunk;
        for (i = 0; i < n; i++)
            chunk[i] = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] - 'A' + 'a') : s[i];
        if (!EVP_DigestUpdate(ctx, chunk, n))
            return 0;
        s += n;
        len -= n;
    }
    return 1;
}

static int input_ok(const idem_fp_input_t *in)
{
    size_t i;

    if ((in->method == NULL && in->method_len > 0) || (in->target == NULL && in->target_len > 0) ||
        (in->body == NULL && in->body_len > 0) || (in->headers == NULL && in->n_headers > 0) ||
        (in->ignore == NULL && in->n_ignore > 0))
        return 0;
    for (i = 0; i < in->n_headers; i++) {
        const idem_fp_header_t *h = &in->headers[i];
        if ((h->name == NULL && h->name_len > 0) || (h->value == NULL && h->value_len > 0))
            return 0;
    }
    return 1;
}

idem_err_t idem_fingerprint(const idem_fp_input_t *in, uint8_t out[IDEM_FP_LEN])
{
    EVP_MD_CTX *ctx;
    char *canon = NULL;
    size_t canon_len = 0, i;
    unsigned int md_len = 0;
    idem_err_t err = IDEM_OK;
    int ok;

    if (out != NULL)
        memset(out, 0, IDEM_FP_LEN);
    if (in == NULL || out == NULL || !input_ok(in))
        return IDEM_E_INVAL;
    if (in->body_json) {
        err = idem_json_canonicalize((const char *)in->body, in->body_len, in->ignore,
                                     in->n_ignore, &canon, &canon_len);
        if (err == IDEM_E_NOMEM)
            return err;
    }
    ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        idem_free(canon);
        return IDEM_E_NOMEM;
    }
    ok = EVP_DigestInit_ex(ctx, sha256_md(), NULL) &&
         frame(ctx, 'V', FP_VERSION, sizeof FP_VERSION - 1) &&
         frame(ctx, 'M', in->method, in->method_len) &&
         frame(ctx, 'T', in->target, in->target_len);
    for (i = 0; ok && i < in->n_headers; i++) {
        const idem_fp_header_t *h = &in->headers[i];
        ok = frame_lower(ctx, 'N', h->name, h->name_len) &&
             (h->value != NULL ? frame(ctx, 'P', h->value, h->value_len)
                               : frame(ctx, 'A', NULL, 0));
    }
    if (ok)
        ok = canon != NULL ? frame(ctx, 'J', canon, canon_len)
                           : frame(ctx, 'B', in->body, in->body_len);
    ok = ok && EVP_DigestFinal_ex(ctx, out, &md_len) && md_len == IDEM_FP_LEN;
    EVP_MD_CTX_free(ctx);
    idem_free(canon);
    if (!ok) {
        memset(out, 0, IDEM_FP_LEN);
        return IDEM_E_NOMEM; /* libcrypto fails only when memory is short */
    }
    return IDEM_OK;
}
