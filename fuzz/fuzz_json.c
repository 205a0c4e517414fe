/* fuzz/fuzz_json.c - libFuzzer target for the JSON canonicaliser behind
 * fingerprint_body: json (idem_json_canonicalize and idem_fingerprint,
 * src/core/fingerprint.c).
 *
 * Input: the low two bits of the first byte say how many JSON pointers
 * (0-3) follow, each ended by '\n'; the rest of the input is the request
 * body, arbitrary bytes.  Properties checked:
 *   - the result is IDEM_OK or IDEM_E_INVAL; pointers never decide whether
 *     a body is JSON (with and without them the answer is the same);
 *   - canonical output is NUL-terminated, holds no NUL, no white space
 *     outside strings and no nesting deeper than IDEM_JSON_MAX_DEPTH;
 *   - idempotence: canonicalising the canonical output (without pointers)
 *     gives it back byte for byte;
 *   - the fingerprint of the body with the pointers is the fingerprint of
 *     its canonical form without them; a body that is not JSON is hashed
 *     exactly as with fingerprint_body: raw;
 *   - out of memory at the Nth allocation after the parse (N from a hash
 *     of the input), in the removal of the pointers' members or in the
 *     dump, is IDEM_E_NOMEM or the same result as before, never "not
 *     JSON", and leaks nothing.
 * Out of memory during the parse itself is left out: jansson 2.14 ignores a
 * failed allocation while it lexes a token longer than 16 bytes and then
 * fails an assert(), aborting the process (akheron/jansson#362, unfixed in
 * 2.14); there is nothing in libidem to fuzz there.  The fuzzer counts the
 * allocations jansson makes for the parse with a counting allocator set for
 * that one call (this process has one thread) and fails only later ones.
 * Deep nesting needs no special input: the seeds hold documents at and just
 * past the depth limit, and the mutator stacks brackets from there.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fuzz_check.h"
#include "idem/alloc.h"
#include "idem/fingerprint.h"

#define MAX_POINTERS 3

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_malloc_t real_malloc;
static long parse_allocs;

static void *counting_malloc(size_t n)
{
    parse_allocs++;
    return real_malloc(n);
}

/* How many allocations jansson makes to parse text as fingerprint.c does
 * (its LOAD_FLAGS), through the allocator fingerprint.c gave it. */
static long count_parse_allocs(const uint8_t *text, size_t len)
{
    json_free_t real_free;
    json_error_t jerr;
    json_get_alloc_funcs(&real_malloc, &real_free);
    json_set_alloc_funcs(counting_malloc, real_free);
    parse_allocs = 0;
    json_t *root = json_loadb((const char *)text, len,
                              JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    json_decref(root);
    json_set_alloc_funcs(real_malloc, real_free);
    return parse_allocs;
}

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

static void fingerprint(const uint8_t *body, size_t len, int json, char *const *ptrs, size_t n,
                        uint8_t out[IDEM_FP_LEN])
{
    static const idem_fp_header_t headers[] = {{"Content-Type", 12, "application/json", 16}};
    idem_fp_input_t in = {
        .method = "POST", .method_len = 4, .target = "/orders", .target_len = 7,
        .headers = headers, .n_headers = 1, .body = len ? body : NULL, .body_len = len,
        .body_json = json, .ignore = (const char *const *)ptrs, .n_ignore = n,
    };
    CHECK(idem_fingerprint(&in, out) == IDEM_OK);
}

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

    char *c1 = NULL, *c0 = NULL, *c2 = NULL;
    size_t c1_len, c0_len, c2_len;
    idem_err_t e1 = canon(body, len, ptrs, n_ptrs, &c1, &c1_len);
    idem_err_t e0 = canon(body, len, NULL, 0, &c0, &c0_len);
    CHECK(e1 != IDEM_E_NOMEM && e0 != IDEM_E_NOMEM);
    CHECK(e1 == e0);

    uint8_t fp_json[IDEM_FP_LEN], fp_other[IDEM_FP_LEN];
    fingerprint(body, len, 1, ptrs, n_ptrs, fp_json);
    if (e1 == IDEM_OK) {
        check_canonical(c1, c1_len);
        check_canonical(c0, c0_len);
        CHECK(canon((const uint8_t *)c1, c1_len, NULL, 0, &c2, &c2_len) == IDEM_OK);
        CHECK(c2_len == c1_len && memcmp(c1, c2, c1_len) == 0);
        idem_free(c2);
        if (n_ptrs == 0)
            CHECK(c0_len == c1_len && memcmp(c0, c1, c1_len) == 0);
        fingerprint((const uint8_t *)c1, c1_len, 1, NULL, 0, fp_other);
    } else {
        fingerprint(body, len, 0, NULL, 0, fp_other);
    }
    CHECK(memcmp(fp_json, fp_other, IDEM_FP_LEN) == 0);

    /* Out of memory in the removal or the dump (see above for the parse). */
    long after = count_parse_allocs(body, len);
    idem_alloc_fail_after(after + (long)(fuzz_hash(data, size) % 24) + 1);
    idem_err_t e3 = canon(body, len, ptrs, n_ptrs, &c2, &c2_len);
    idem_alloc_fail_after(0);
    CHECK(e3 == e1 || e3 == IDEM_E_NOMEM);
    if (e3 == IDEM_OK)
        CHECK(c2_len == c1_len && memcmp(c1, c2, c1_len) == 0);
    idem_free(c2);

    idem_free(c0);
    idem_free(c1);
    free(body);
    for (size_t i = 0; i < n_ptrs; i++)
        free(ptrs[i]);
    return 0;
}
