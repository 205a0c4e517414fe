/* src/gateway/cache.h - idemd's in-process cache of completed records (local_cache).
 *
 * A completed record never changes until it expires or an operator deletes
 * it, so a replay can be answered from memory without asking a network
 * store.  In-progress records are never cached: their state is the store's
 * to decide.  The cache is an LRU bounded by entries (local_cache) and by
 * bytes (IDEM_CACHE_MAX_BYTES), shared by every worker thread and the admin
 * thread under one mutex; an entry is never served past its record's
 * expires_at, and a DELETE through this idemd's admin listener removes it.
 */
#ifndef IDEM_GATEWAY_CACHE_H
#define IDEM_GATEWAY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "idem/key.h"
#include "idem/record.h"

/* The most bytes (encoded records) the cache keeps, whatever local_cache says. */
#define IDEM_CACHE_MAX_BYTES (256u * 1024 * 1024)

typedef struct idem_cache idem_cache_t;

/** A cache of at most max_entries records and max_bytes bytes of them.
 * @return NULL when out of memory, or when max_entries is 0 (no cache: every
 *         other function takes NULL as an empty cache). */
idem_cache_t *idem__cache_create(size_t max_entries, size_t max_bytes);
void idem__cache_destroy(idem_cache_t *c);

/** Copy the cached record of id into out (owned by the caller:
 * idem_record_cleanup) if there is one that has not expired at now_ms, and
 * mark it recently used.  An expired entry is dropped.
 * @return IDEM_OK, IDEM_E_NOTFOUND, or IDEM_E_NOMEM. */
idem_err_t idem__cache_get(idem_cache_t *c, const idem_key_id_t *id, int64_t now_ms,
                           idem_record_t *out);

/** Keep a copy of rec (which must be completed; anything else is ignored)
 * under id, replacing any older entry, and evict the least recently used
 * entries beyond the bounds.  A record larger than a quarter of max_bytes is
 * not cached.  Out of memory leaves the cache as it was. */
void idem__cache_put(idem_cache_t *c, const idem_key_id_t *id, const idem_record_t *rec);

/** Forget id. */
void idem__cache_remove(idem_cache_t *c, const idem_key_id_t *id);

/** Entries and bytes held now. */
size_t idem__cache_entries(idem_cache_t *c);
size_t idem__cache_bytes(idem_cache_t *c);

#endif /* IDEM_GATEWAY_CACHE_H */
