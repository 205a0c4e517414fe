/* src/core/record_splice.h - the one record decode that is the stores' own,
 * not libidem's API (record.c).
 *
 * Redis's completion script splices the stored fingerprint into a record
 * that C encoded with a zero one, so that a completion needs no read first;
 * the checksum of such a value was computed over the zero fingerprint.
 * Only src/store/redis.c (and the tests) read such values.
 */
#ifndef IDEM_CORE_RECORD_SPLICE_H
#define IDEM_CORE_RECORD_SPLICE_H

#include <stddef.h>
#include <stdint.h>

#include "idem/record.h"

/** idem_record_decode for a value whose fingerprint (bytes 10..41) was put
 * in after encoding.  The checksum is verified as if those bytes were zero;
 * the caller must check the fingerprint against its own copy of it.
 * @return IDEM_OK, IDEM_E_CORRUPT, IDEM_E_NOMEM; rec zeroed on failure. */
idem_err_t idem__record_decode_spliced(const uint8_t *buf, size_t len, idem_record_t *rec);

#endif /* IDEM_CORE_RECORD_SPLICE_H */
