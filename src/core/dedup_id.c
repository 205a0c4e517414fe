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
 * not UTF-8 (src/core/utf8.c, the check PostgreSQL's own): the ids a
 * consumer may use do not depend on where they are kept.  Binary ids (a
 * Kafka key, a hash) go in hex or base64.
 */
#include <stdbool.h>
#include <string.h>

#include "core/utf8.h"
#include "idem/dedup.h"

#define SCOPE_PREFIX "dedup:"

_Static_assert(sizeof SCOPE_PREFIX - 1 + IDEM_DEDUP_NS_MAX <= IDEM_SCOPE_MAX,
               "dedup: + ns fits a scope");

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
    if (memchr(msg_id, '\0', id_len) != NULL || !idem__utf8_valid(msg_id, id_len))
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
    case IDEM_DECIDE_RECONCILE:
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
