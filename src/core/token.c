/* src/core/token.c - prevention tokens: making, reading and deciding them.
 *
 * See include/idem/token.h for the design.  What a use of a token finds:
 *
 *   no record, a record past expires_at, a record that is not a token -> INVALID
 *   a token record, completed (spent)                                  -> USED
 *   a token record, in_progress (issued, unspent)                      -> FIRST_USE
 *
 * A token of another caller is simply absent from this caller's scope, so
 * it is INVALID too: one caller cannot learn whether another's token exists.
 * The store applies the verdict atomically with the write that spends the
 * token (src/store/store.c), so of two concurrent uses exactly one is first.
 *
 * THREADING: pure functions, except that generation reads the kernel's pool.
 */
#include <string.h>

#include "idem/token.h"

static const char hexdig[] = "0123456789abcdef";

idem_err_t idem_token_generate(const idem_rng_t *rng, char *out)
{
    unsigned char b[IDEM_TOKEN_BYTES];

    if (rng == NULL) {
        if (idem_random_bytes(b, sizeof b) != IDEM_OK) {
            out[0] = '\0';
            return IDEM_E_IO;
        }
    } else {
        for (size_t i = 0; i < sizeof b; i += 8) {
            uint64_t v = idem_rng_u64(rng);
            for (size_t j = 0; j < 8; j++)
                b[i + j] = (unsigned char)(v >> (8 * j));
        }
    }
    for (size_t i = 0; i < sizeof b; i++) {
        out[2 * i] = hexdig[b[i] >> 4];
        out[2 * i + 1] = hexdig[b[i] & 0x0F];
    }
    out[IDEM_TOKEN_LEN] = '\0';
    return IDEM_OK;
}

idem_err_t idem_token_parse(const char *value, size_t len, char *out)
{
    char raw[IDEM_KEY_MAX + 1];

    out[0] = '\0';
    /* The key parser trims white space and unquotes an sf-string. */
    if (value == NULL || idem_key_parse(value, len, raw) != IDEM_OK ||
        strlen(raw) != IDEM_TOKEN_LEN)
        return IDEM_E_INVAL;
    for (size_t i = 0; i < IDEM_TOKEN_LEN; i++) {
        char c = raw[i];
        if (c >= 'A' && c <= 'F')
            c = (char)(c - 'A' + 'a');
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            out[0] = '\0';
            return IDEM_E_INVAL;
        }
        out[i] = c;
    }
    out[IDEM_TOKEN_LEN] = '\0';
    return IDEM_OK;
}

void idem_token_id(const char *scope, const char *token, idem_key_id_t *out)
{
    size_t pl = sizeof IDEM_TOKEN_PREFIX - 1;

    memset(out, 0, sizeof *out);
    memcpy(out->scope, scope, strnlen(scope, IDEM_SCOPE_MAX));
    memcpy(out->key, IDEM_TOKEN_PREFIX, pl);
    memcpy(out->key + pl, token, strnlen(token, IDEM_TOKEN_LEN));
}

idem_token_verdict_t idem_token_decide(const idem_record_t *rec, int64_t now_ms)
{
    if (rec == NULL || now_ms >= rec->expires_at_ms || (rec->flags & IDEM_REC_TOKEN) == 0)
        return IDEM_TOKEN_INVALID;
    return rec->state == IDEM_STATE_COMPLETED ? IDEM_TOKEN_USED : IDEM_TOKEN_FIRST_USE;
}

const char *idem_token_verdict_name(idem_token_verdict_t v)
{
    switch (v) {
    case IDEM_TOKEN_FIRST_USE: return "first_use";
    case IDEM_TOKEN_USED: return "used";
    case IDEM_TOKEN_INVALID: return "invalid";
    case IDEM_TOKEN_NONE: break;
    }
    return "none";
}
