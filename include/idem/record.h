/* include/idem/record.h - what the store keeps under a (scope, key).
 *
 * A record is in_progress (claimed, its request forwarded, a lease held by
 * its owner) or completed (the upstream's response kept for replay).  The
 * fence grows by one with every claim of the key, so a stale owner's late
 * completion can be refused.  The binary layout is versioned and checked on
 * decode: a short, corrupt or foreign value is IDEM_E_CORRUPT, never a crash,
 * and (version 2) so is a value any bit of which was damaged after encoding.
 *
 * Layout (all integers little-endian):
 *   magic "IDR" | version u8 | flags u32 | state u8 | fp[32] | fence u64 |
 *   lease_until i64 | expires_at i64 | status u16 | n_headers u16 |
 *   { name_len u16 | value_len u32 | name | value } * n_headers |
 *   body_len u32 | body | crc32c u32
 * crc32c (version 2, which encode writes) is the CRC32C of every byte before
 * it.  Version 1, without it, is still decoded (records written before).
 */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/error.h"
#include "idem/extern.h"
#include "idem/fingerprint.h"

typedef enum idem_state {
    IDEM_STATE_IN_PROGRESS = 1,
    IDEM_STATE_COMPLETED = 2,
} idem_state_t;

/* Record flags. */
#define IDEM_REC_HELD 0x1u         /* in_progress with an unknown outcome, held for key_ttl */
#define IDEM_REC_NOT_RETAINED 0x2u /* completed, but the body was too large to keep */
#define IDEM_REC_TOKEN 0x4u        /* a prevention token: in_progress = unused, completed = used */

typedef struct idem_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} idem_header_t;

/** A response as stored for replay: hop-by-hop headers already removed. */
typedef struct idem_response {
    int status;
    const idem_header_t *headers;
    size_t n_headers;
    const uint8_t *body;
    size_t body_len;
} idem_response_t;

typedef struct idem_record {
    idem_state_t state;
    uint32_t flags;                  /* IDEM_REC_* */
    uint8_t fingerprint[IDEM_FP_LEN];
    uint64_t fence;                  /* 1 for the first claim, +1 per claim */
    int64_t lease_until_ms;          /* in_progress: the owner's lease ends */
    int64_t expires_at_ms;           /* the record is gone (absent) from then on */
    idem_response_t response;        /* completed: the stored response */
    void *owned;                     /* storage behind response; freed by cleanup */
} idem_record_t;

/** Serialise rec.  @param[out] out, out_len  a buffer owned by the caller
 * (idem_free); NULL/0 on failure.  @return IDEM_OK, IDEM_E_NOMEM,
 * IDEM_E_TOOBIG (a field does not fit its length prefix). */
IDEM_EXTERN idem_err_t idem_record_encode(const idem_record_t *rec, uint8_t **out,
                                          size_t *out_len);

/** Size in bytes idem_record_encode would produce for rec. */
IDEM_EXTERN size_t idem_record_encoded_size(const idem_record_t *rec);

/** Serialise rec into buf, which has idem_record_encoded_size(rec) bytes. */
IDEM_EXTERN void idem_record_encode_into(const idem_record_t *rec, uint8_t *buf);

/** Parse a stored value.  The record owns a copy of everything it points at
 * (buf may go away after the call); release it with idem_record_cleanup.
 * @param[out] rec  zeroed on failure.
 * @return IDEM_OK, IDEM_E_CORRUPT, IDEM_E_NOMEM. */
IDEM_EXTERN idem_err_t idem_record_decode(const uint8_t *buf, size_t len, idem_record_t *rec);

/** Parse only the fixed header (no headers/body, nothing allocated); for
 * decisions that need no response.  @return IDEM_OK or IDEM_E_CORRUPT. */
IDEM_EXTERN idem_err_t idem_record_decode_head(const uint8_t *buf, size_t len,
                                               idem_record_t *rec);

/** Deep-copy src into dst (dst owns its own storage). */
IDEM_EXTERN idem_err_t idem_record_copy(idem_record_t *dst, const idem_record_t *src);

/** Free what rec owns and zero it; a zeroed record is a no-op. */
IDEM_EXTERN void idem_record_cleanup(idem_record_t *rec);

#endif /* IDEM_RECORD_H */
