/* src/core/dedup_id.c - what both forms of message de-duplication share
 * (include/idem/dedup.h): the record identity of a message id and the
 * reading of idem_decide's answer as a de-duplication verdict.  The store
 * form (src/store/dedup.c) and the in-transaction form (src/tx/dedup_tx.c)
 * both call these, so an id means the same record, and a record the same
 * verdict, whichever form or store a consumer uses.
 *
 * Ids.  dedup.h allows 1 to IDEM_KEY_MAX bytes without NUL.  LMDB, memory:
 * and Redis keys take any such bytes, but PostgreSQL keeps keys in a text
 * column that takes only valid UTF-8, so every form refuses an id that is
 * not UTF-8: the ids a consumer may use do not depend on where they are
 * kept.  Binary ids (a Kafka key, a hash) go in hex or base64.
 */
#include <stdbool.h>
#include <string.h>

#include "idem/dedup.h"

#define SCOPE_PREFIX "dedup:"

_Static_assert(sizeof SCOPE_PREFIX - 1 + IDEM_DEDUP_NS_MAX <= IDEM_SCOPE_MAX,
               "dedup: + ns fits a scope");

/* Whether the len bytes at s are well-formed UTF-8 as PostgreSQL takes it:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_ok(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        unsigned lo = 0x80, hi = 0xbf;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else {
            return false;
        }
        if (len - i - 1 < n)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= n; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xbf)
                return false;
        i += n + 1;
    }
    return true;
}

static bool ns_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

idem_err_t idem_dedup_id(const char *ns, const char *msg_id, size_t id_len, idem_key_id_t *out)
{
    if (out == NULL)
        return IDEM_E_INVAL;
    memset(out, 0, sizeof *out);
    if (ns == NULL || msg_id == NULL || id_len == 0 || id_len > IDEM_KEY_MAX)
        return IDEM_E_INVAL;
    size_t nl = strnlen(ns, IDEM_DEDUP_NS_MAX + 1);
    if (nl == 0 || nl > IDEM_DEDUP_NS_MAX)
        return IDEM_E_INVAL;
    for (size_t i = 0; i < nl; i++)
        if (!ns_char(ns[i]))
            return IDEM_E_INVAL;
    if (memchr(msg_id, '\0', id_len) != NULL || !utf8_ok((const unsigned char *)msg_id, id_len))
        return IDEM_E_INVAL;
    memcpy(out->scope, SCOPE_PREFIX, sizeof SCOPE_PREFIX - 1);
    memcpy(out->scope + sizeof SCOPE_PREFIX - 1, ns, nl);
    memcpy(out->key, msg_id, id_len);
    return IDEM_OK;
}

idem_err_t idem_dedup_verdict(const idem_decision_t *d, idem_dedup_claim_t *out)
{
    memset(out, 0, sizeof *out);
    switch (d->kind) {
    case IDEM_DECIDE_CLAIM:
    case IDEM_DECIDE_TAKEOVER:
        out->verdict = IDEM_DEDUP_NEW;
        out->fence = d->fence;
        return IDEM_OK;
    case IDEM_DECIDE_REPLAY:
    case IDEM_DECIDE_NOT_RETAINED:
        out->verdict = IDEM_DEDUP_DUPLICATE;
        return IDEM_OK;
    case IDEM_DECIDE_IN_FLIGHT:
    case IDEM_DECIDE_IN_FLIGHT_UNKNOWN:
        out->verdict = IDEM_DEDUP_IN_PROGRESS;
        out->retry_after_ms = d->retry_after_s * 1000;
        return IDEM_OK;
    case IDEM_DECIDE_MISMATCH:
        break;
    }
    /* Only a record some other code wrote under a dedup identity has
     * another fingerprint. */
    return IDEM_E_CORRUPT;
}
