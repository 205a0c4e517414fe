/* fuzz/fuzz_key.c - libFuzzer target for the Idempotency-Key parser
 * (idem_key_parse, src/core/key.c) and the Idempotency-Token parser built
 * on it (idem_token_parse, src/core/token.c).
 *
 * The whole input is one header value.  Properties checked:
 *   - on IDEM_OK the key is 1..IDEM_KEY_MAX characters of 0x20-0x7E (so no
 *     NUL inside it), NUL-terminated; on failure the output is "";
 *   - the key written back as an SF string ("...", with \" and \\) parses
 *     to the same key, and so does the value with extra white space around
 *     it; a key with no space and no comma that does not start with a
 *     quote also parses to itself as a bare token;
 *   - idem_token_parse accepts exactly the values whose key is 32 hex
 *     digits, and gives those digits lowercased.
 * The output buffers are heap blocks of exactly the documented size, so a
 * write past them is caught by AddressSanitizer.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "idem/key.h"
#include "idem/token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Parse value[0..len) (copied to its own block, so a read past it is
 * caught) into a fresh IDEM_KEY_MAX + 1 block; returns the block. */
static char *parse(const char *value, size_t len, idem_err_t *err)
{
    char *in = malloc(len ? len : 1), *out = malloc(IDEM_KEY_MAX + 1);
    CHECK(in != NULL && out != NULL);
    memcpy(in, value, len);
    *err = idem_key_parse(in, len, out);
    free(in);
    CHECK(*err == IDEM_OK || *err == IDEM_E_INVAL);
    if (*err != IDEM_OK)
        CHECK(out[0] == '\0');
    return out;
}

static void check_key(const char *key)
{
    size_t n = strnlen(key, IDEM_KEY_MAX + 1);
    CHECK(n >= 1 && n <= IDEM_KEY_MAX);
    for (size_t i = 0; i < n; i++)
        CHECK(key[i] >= 0x20 && key[i] <= 0x7E);
}

/* The same key parsed from another spelling must be key. */
static void same_key(const char *spelling, size_t len, const char *key)
{
    idem_err_t err;
    char *again = parse(spelling, len, &err);
    CHECK(err == IDEM_OK);
    CHECK(strcmp(again, key) == 0);
    free(again);
}

static void check_token(const char *value, size_t len, idem_err_t key_err, const char *key)
{
    char *in = malloc(len ? len : 1), *out = malloc(IDEM_TOKEN_LEN + 1);
    CHECK(in != NULL && out != NULL);
    memcpy(in, value, len);
    idem_err_t err = idem_token_parse(in, len, out);
    free(in);
    bool hex32 = key_err == IDEM_OK && strlen(key) == IDEM_TOKEN_LEN;
    for (size_t i = 0; hex32 && i < IDEM_TOKEN_LEN; i++)
        hex32 = strchr("0123456789abcdefABCDEF", key[i]) != NULL;
    CHECK((err == IDEM_OK) == hex32);
    if (err == IDEM_OK) {
        CHECK(strlen(out) == IDEM_TOKEN_LEN);
        for (size_t i = 0; i < IDEM_TOKEN_LEN; i++) {
            char c = key[i] >= 'A' && key[i] <= 'F' ? (char)(key[i] - 'A' + 'a') : key[i];
            CHECK(out[i] == c);
        }
    } else {
        CHECK(err == IDEM_E_INVAL && out[0] == '\0');
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *value = (const char *)data;
    idem_err_t err;
    char *key = parse(value, size, &err);
    check_token(value, size, err, key);
    if (err != IDEM_OK) {
        free(key);
        return 0;
    }
    check_key(key);
    size_t n = strlen(key);

    /* The SF string: at most 2 * 255 + 2 bytes. */
    char quoted[2 * IDEM_KEY_MAX + 2];
    size_t q = 0;
    quoted[q++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (key[i] == '"' || key[i] == '\\')
            quoted[q++] = '\\';
        quoted[q++] = key[i];
    }
    quoted[q++] = '"';
    same_key(quoted, q, key);

    /* White space around it changes nothing. */
    char padded[2 * IDEM_KEY_MAX + 6];
    memcpy(padded, " \t", 2);
    memcpy(padded + 2, quoted, q);
    memcpy(padded + 2 + q, "\t ", 2);
    same_key(padded, q + 4, key);

    /* A bare token is its own spelling (a comma only ever quoted: bare,
     * it is two fields joined). */
    if (key[0] != '"' && strchr(key, ' ') == NULL && strchr(key, ',') == NULL)
        same_key(key, n, key);
    free(key);
    return 0;
}
