/* fuzz/fuzz_json.c - libFuzzer target for the JSON canonicaliser behind
 * fingerprint_body: json (src/core/json.c, through idem_json_canonicalize
 * and idem_fingerprint).
 *
 * Input: the low two bits of the first byte say how many JSON pointers
 * (0-3) follow, each ended by '\n'; the rest of the input is the request
 * body, arbitrary bytes.  Properties checked:
 *   - the result is IDEM_OK or IDEM_E_INVAL; pointers never decide whether
 *     a body is JSON (with and without them the answer is the same);
 *   - canonical output is NUL-terminated, holds no NUL, no white space
 *     outside strings, no raw control character inside them and no nesting
 *     deeper than IDEM_JSON_MAX_DEPTH, and is as long as the parse said;
 *   - a fixed point: canonicalising the canonical output (without
 *     pointers) gives it back byte for byte;
 *   - one value, however spelled: the canonical output respelled (white
 *     space between tokens, every number written another way with the same
 *     value, such as 0.DDDe+k or DDD000e-k, characters of strings written
 *     as \u escapes and surrogate pairs) canonicalises to the same output;
 *   - different values stay apart: the canonical output with one
 *     significant digit of one number changed canonicalises to something
 *     else (a number is never merged with another, however many digits);
 *   - the fingerprint of the body with the pointers is the fingerprint of
 *     its canonical form without them; a body that is not JSON is hashed
 *     exactly as with fingerprint_body: raw;
 *   - out of memory at each allocation in turn (there are at most three)
 *     is IDEM_E_NOMEM or the same result as before, never "not JSON", and
 *     leaks nothing.
 * Deep nesting needs no special input: the seeds hold documents at and just
 * past the depth limit, and the mutator stacks brackets from there.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "fuzz_check.h"
#include "idem/alloc.h"
#include "idem/fingerprint.h"

#define MAX_POINTERS 3

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static idem_err_t canon(const uint8_t *body, size_t len, char *const *ptrs, size_t n,
                        char **out, size_t *out_len)
{
    idem_err_t err = idem_json_canonicalize((const char *)body, len, (const char *const *)ptrs,
                                            n, out, out_len);
    CHECK(err == IDEM_OK || err == IDEM_E_INVAL || err == IDEM_E_NOMEM);
    if (err != IDEM_OK)
        CHECK(*out == NULL && *out_len == 0);
    return err;
}

static void check_canonical(const char *c, size_t len)
{
    size_t depth = 0;
    bool in_str = false;
    CHECK(len > 0 && c[len] == '\0' && strlen(c) == len);
    for (size_t i = 0; i < len; i++) {
        char ch = c[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
            else
                CHECK((unsigned char)ch >= 0x20); /* control characters are escaped */
            continue;
        }
        CHECK(ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r');
        if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            CHECK(++depth <= IDEM_JSON_MAX_DEPTH);
        } else if (ch == ']' || ch == '}') {
            CHECK(depth > 0);
            depth--;
        }
    }
    CHECK(!in_str && depth == 0);
}

static idem_fp_input_t fp_input(const uint8_t *body, size_t len, int json, char *const *ptrs,
                                size_t n)
{
    static const idem_fp_header_t headers[] = {{"Content-Type", 12, "application/json", 16}};
    idem_fp_input_t in = {
        .method = "POST", .method_len = 4, .target = "/orders", .target_len = 7,
        .headers = headers, .n_headers = 1, .body = len ? body : NULL, .body_len = len,
        .body_json = json, .ignore = (const char *const *)ptrs, .n_ignore = n,
    };
    return in;
}

static void fingerprint(const uint8_t *body, size_t len, int json, char *const *ptrs, size_t n,
                        uint8_t out[IDEM_FP_LEN])
{
    idem_fp_input_t in = fp_input(body, len, json, ptrs, n);
    CHECK(idem_fingerprint(&in, out) == IDEM_OK);
}

/* ---- respelling canonical JSON ------------------------------------------- */

struct sink {
    char *p;
    size_t n, cap;
    unsigned long h; /* choices, from the input's hash */
};

static void add(struct sink *s, const char *p, size_t n)
{
    CHECK(n <= s->cap - s->n);
    memcpy(s->p + s->n, p, n);
    s->n += n;
}

static unsigned pick(struct sink *s, unsigned n)
{
    s->h = s->h * 6364136223846793005u + 1442695040888963407u;
    return (unsigned)((s->h >> 33) % n);
}

static void add_u(struct sink *s, unsigned cp)
{
    char u[7];
    snprintf(u, sizeof u, pick(s, 2) ? "\\u%04x" : "\\u%04X", cp);
    add(s, u, 6);
}

/* A canonical string at c[i] ('"'), some characters escaped; returns the
 * offset past it. */
static size_t respell_string(struct sink *s, const char *c, size_t i)
{
    add(s, "\"", 1);
    for (i++; c[i] != '"';) {
        unsigned char b = (unsigned char)c[i];
        if (b == '\\') { /* a canonical escape: kept, or spelled \u00XX */
            size_t n = c[i + 1] == 'u' ? 6 : 2;
            const char *shorts = "bfnrt", *at = strchr(shorts, c[i + 1]);
            if (n == 2 && at != NULL && pick(s, 2) == 0)
                add_u(s, (unsigned)"\b\f\n\r\t"[at - shorts]);
            else
                add(s, c + i, n);
            i += n;
        } else if (b < 0x80) {
            if (b == '/' && pick(s, 3) == 0)
                add(s, "\\/", 2);
            else if (pick(s, 3) == 0)
                add_u(s, b);
            else
                add(s, c + i, 1);
            i++;
        } else {
            size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
            unsigned cp = n == 2 ? b & 0x1Fu : n == 3 ? b & 0x0Fu : b & 0x07u;
            for (size_t k = 1; k < n; k++)
                cp = cp << 6 | ((unsigned char)c[i + k] & 0x3Fu);
            if (pick(s, 2) == 0) {
                add(s, c + i, n);
            } else if (cp >= 0x10000) {
                add_u(s, 0xD800 + ((cp - 0x10000) >> 10));
                add_u(s, 0xDC00 + ((cp - 0x10000) & 0x3FF));
            } else {
                add_u(s, cp);
            }
            i += n;
        }
    }
    add(s, "\"", 1);
    return i + 1;
}

/* The canonical number c[start..end) changed in its last nonzero digit
 * (a zero becomes 1): another value. */
static void change_number(struct sink *s, const char *c, size_t start, size_t end)
{
    size_t last = SIZE_MAX;
    for (size_t j = start; j < end && c[j] != 'e'; j++)
        if (c[j] >= '1' && c[j] <= '9')
            last = j;
    if (last == SIZE_MAX) {
        add(s, "1", 1);
        return;
    }
    add(s, c + start, end - start);
    s->p[s->n - (end - last)] = c[last] == '9' ? '1' : (char)(c[last] + 1);
}

/* The canonical number c[start..end) written another way, same value. */
static void respell_number(struct sink *s, const char *c, size_t start, size_t end)
{
    static const char *const zeros[] = {"0", "-0", "0.0", "-0.000e+7", "0E-3"};
    char digits[4096], buf[64];
    size_t nd = 0, int_digits = 0, lead = 0, i = start;
    long long x = 0, k;
    bool neg = c[i] == '-', point = false;

    if (end - start > sizeof digits) {
        add(s, c + start, end - start);
        return;
    }
    if (neg)
        i++;
    for (; i < end && c[i] != 'e'; i++) {
        if (c[i] == '.') {
            point = true;
            continue;
        }
        digits[nd++] = c[i];
        if (!point)
            int_digits++;
    }
    if (i < end) { /* e+X or e-X */
        bool eneg = c[i + 1] == '-';
        for (i += 2; i < end; i++)
            x = x * 10 + (c[i] - '0');
        if (eneg)
            x = -x;
    }
    while (lead < nd && digits[lead] == '0')
        lead++;
    while (nd > lead && digits[nd - 1] == '0')
        nd--;
    if (lead == nd) {
        const char *z = zeros[pick(s, 5)];
        add(s, z, strlen(z));
        return;
    }
    if (neg)
        add(s, "-", 1);
    k = x + (long long)int_digits - (long long)lead; /* the value is 0.DDD x 10^k */
    switch (pick(s, 4)) {
    case 0: /* 0.DDD000e+k */
        add(s, "0.", 2);
        add(s, digits + lead, nd - lead);
        add(s, "000", pick(s, 4));
        snprintf(buf, sizeof buf, "e%s%lld", k >= 0 ? "+" : "", k);
        break;
    case 1: /* DDD E (k - n) */
        add(s, digits + lead, nd - lead);
        snprintf(buf, sizeof buf, "E%lld", k - (long long)(nd - lead));
        break;
    case 2: /* D.DDD0e(k - 1) */
        add(s, digits + lead, 1);
        add(s, ".", 1);
        add(s, digits + lead + 1, nd - lead - 1);
        add(s, "0", 1);
        snprintf(buf, sizeof buf, "e%lld", k - 1);
        break;
    default: /* DDD00e(k - n - 2) */
        add(s, digits + lead, nd - lead);
        add(s, "00", 2);
        snprintf(buf, sizeof buf, "e%lld", k - (long long)(nd - lead) - 2);
        break;
    }
    add(s, buf, strlen(buf));
}

/* The canonical text c respelled as the same value (change_at SIZE_MAX),
 * or as it is but for the number of index change_at, changed. */
static void respell(struct sink *s, const char *c, size_t len, size_t change_at)
{
    static const char *const ws[] = {"", "", " ", "\n", "\t ", "\r\n"};
    size_t i = 0, number = 0;

    while (i < len) {
        char ch = c[i];
        const char *w = ws[pick(s, 6)];
        size_t end = i + 1;
        if (change_at == SIZE_MAX)
            add(s, w, strlen(w));
        if (ch == '"' && change_at == SIZE_MAX) {
            end = respell_string(s, c, i);
        } else if (ch == '"') {
            for (; c[end] != '"'; end++)
                if (c[end] == '\\')
                    end++;
            end++;
            add(s, c + i, end - i);
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            while (end < len && c[end] != '\0' && strchr("0123456789.e+-", c[end]) != NULL)
                end++;
            if (change_at == SIZE_MAX)
                respell_number(s, c, i, end);
            else if (number == change_at)
                change_number(s, c, i, end);
            else
                add(s, c + i, end - i);
            number++;
        } else {
            if (ch == 't' || ch == 'n')
                end = i + 4;
            else if (ch == 'f')
                end = i + 5;
            add(s, c + i, end - i);
        }
        i = end;
    }
}

/* How many numbers the canonical text c holds. */
static size_t count_numbers(const char *c, size_t len)
{
    size_t n = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (in_str) {
            if (c[i] == '\\')
                i++;
            else if (c[i] == '"')
                in_str = false;
        } else if (c[i] == '"') {
            in_str = true;
        } else if ((c[i] == '-' || (c[i] >= '0' && c[i] <= '9')) &&
                   (i == 0 || strchr("[,:", c[i - 1]) != NULL)) {
            n++;
        }
    }
    return n;
}

static void check_spellings(const char *c0, size_t len, unsigned long h)
{
    struct sink s = {.cap = 40 * len + 64, .h = h};
    char *out = NULL;
    size_t out_len = 0, numbers = count_numbers(c0, len);

    s.p = malloc(s.cap);
    CHECK(s.p != NULL);
    respell(&s, c0, len, SIZE_MAX);
    CHECK(canon((const uint8_t *)s.p, s.n, NULL, 0, &out, &out_len) == IDEM_OK);
    CHECK(out_len == len && memcmp(out, c0, len) == 0);
    idem_free(out);
    if (numbers > 0) {
        s.n = 0;
        respell(&s, c0, len, h % numbers);
        CHECK(canon((const uint8_t *)s.p, s.n, NULL, 0, &out, &out_len) == IDEM_OK);
        CHECK(out_len != len || memcmp(out, c0, len) != 0);
        idem_free(out);
    }
    free(s.p);
}

/* ---- the target ------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *ptrs[MAX_POINTERS];
    size_t n_ptrs = 0, off = 1;
    if (size < 1)
        return 0;
    size_t want = data[0] & 3u;
    while (n_ptrs < want && n_ptrs < MAX_POINTERS) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        if (nl == NULL)
            break;
        size_t plen = (size_t)(nl - (data + off));
        ptrs[n_ptrs] = malloc(plen + 1);
        CHECK(ptrs[n_ptrs] != NULL);
        memcpy(ptrs[n_ptrs], data + off, plen);
        ptrs[n_ptrs][plen] = '\0'; /* a NUL inside only shortens it */
        n_ptrs++;
        off += plen + 1;
    }
    /* The body in its own block, so a read past its end is caught. */
    size_t len = size - off;
    uint8_t *body = malloc(len ? len : 1);
    CHECK(body != NULL);
    memcpy(body, data + off, len);
    unsigned long h = fuzz_hash(data, size);

    char *c1 = NULL, *c0 = NULL, *c2 = NULL;
    size_t c1_len, c0_len, c2_len;
    idem_err_t e1 = canon(body, len, ptrs, n_ptrs, &c1, &c1_len);
    idem_err_t e0 = canon(body, len, NULL, 0, &c0, &c0_len);
    CHECK(e1 != IDEM_E_NOMEM && e0 != IDEM_E_NOMEM);
    CHECK(e1 == e0);

    uint8_t fp_json[IDEM_FP_LEN], fp_other[IDEM_FP_LEN];
    fingerprint(body, len, 1, ptrs, n_ptrs, fp_json);
    if (e1 == IDEM_OK) {
        idem__json_t *doc = NULL;
        CHECK(idem__json_parse((const char *)body, len, (const char *const *)ptrs, n_ptrs,
                               &doc) == IDEM_OK);
        CHECK(idem__json_canonical_len(doc) == c1_len);
        idem__json_destroy(doc);
        check_canonical(c1, c1_len);
        check_canonical(c0, c0_len);
        CHECK(canon((const uint8_t *)c1, c1_len, NULL, 0, &c2, &c2_len) == IDEM_OK);
        CHECK(c2_len == c1_len && memcmp(c1, c2, c1_len) == 0);
        idem_free(c2);
        if (n_ptrs == 0)
            CHECK(c0_len == c1_len && memcmp(c0, c1, c1_len) == 0);
        check_spellings(c0, c0_len, h);
        fingerprint((const uint8_t *)c1, c1_len, 1, NULL, 0, fp_other);
    } else {
        fingerprint(body, len, 0, NULL, 0, fp_other);
    }
    CHECK(memcmp(fp_json, fp_other, IDEM_FP_LEN) == 0);

    /* Out of memory at each allocation in turn: the bitmap, the tables,
     * the output (and the fingerprint's digest context). */
    for (long n = 1;; n++) {
        uint8_t fp_oom[IDEM_FP_LEN];
        idem_fp_input_t in = fp_input(body, len, 1, ptrs, n_ptrs);
        idem_alloc_fail_after(n);
        idem_err_t e3 = canon(body, len, ptrs, n_ptrs, &c2, &c2_len);
        idem_alloc_fail_after(0);
        CHECK(e3 == e1 || e3 == IDEM_E_NOMEM);
        if (e3 == IDEM_OK)
            CHECK(c2_len == c1_len && memcmp(c1, c2, c1_len) == 0);
        idem_free(c2);
        c2 = NULL;
        idem_alloc_fail_after(n);
        idem_err_t e4 = idem_fingerprint(&in, fp_oom);
        idem_alloc_fail_after(0);
        CHECK(e4 == IDEM_OK || e4 == IDEM_E_NOMEM);
        if (e4 == IDEM_OK)
            CHECK(memcmp(fp_oom, fp_json, IDEM_FP_LEN) == 0);
        if (e3 != IDEM_E_NOMEM && e4 == IDEM_OK)
            break;
        CHECK(n < 8);
    }

    idem_free(c0);
    idem_free(c1);
    free(body);
    for (size_t i = 0; i < n_ptrs; i++)
        free(ptrs[i]);
    return 0;
}
