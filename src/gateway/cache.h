/* src/gateway/cache.h - idemd's in-process cache of completed records (local_cache).
 *
 * A completed record never changes until it expires or an operator deletes
 * it, so a replay can be answered from memory without asking a network
 * store.  In-progress records are never cached: their state is the store's
 * to decide.  The cache is an LRU bounded by entries (local_cache) and by
 * bytes (IDEM_CACHE_MAX_BYTES), shared by every worker thread and the admin
 * thread under one mutex; an entry is never served past its record's
 * expires_at, and a DELETE through this idemd's admin listener removes it.
 *
 * Across instances (SPEC section 19): a delete through any idemd reaches
 * this cache through the store's watch (invalidate.c), which calls
 * idem__cache_remove per deleted key and idem__cache_set_trusted: while the
 * watch is down a delete could be missed, so the cache is bypassed (gets
 * find nothing, puts keep nothing) and, once it is up again, emptied before
 * it serves.  A record read from the store just before a delete must not be
 * cached just after the delete's message was applied: every removal, clear
 * and change of trust bumps a generation, and a put is refused when the
 * generation moved since the caller began its read (idem__cache_gen, then
 * idem__cache_put_since).
 */
#ifndef IDEM_GATEWAY_CACHE_H
#define IDEM_GATEWAY_CACHE_H

#include <stdbool.h>
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

/** As idem__cache_put, unless the cache was invalidated (a remove, a
 * clear, a change of trust) since idem__cache_gen returned gen, or is
 * bypassed: the record may have been read before a delete. */
void idem__cache_put_since(idem_cache_t *c, uint64_t gen, const idem_key_id_t *id,
                           const idem_record_t *rec);

/** The generation now, for idem__cache_put_since; take it before reading
 * what will be put.  0 for no cache (never current). */
uint64_t idem__cache_gen(idem_cache_t *c);

/** Forget id. */
void idem__cache_remove(idem_cache_t *c, const idem_key_id_t *id);

/** Forget everything. */
void idem__cache_clear(idem_cache_t *c);

/** trusted false: forget everything and bypass the cache (nothing found,
 * nothing kept) until it is trusted again; true: forget everything (what a
 * missed delete would have left) and serve again.  A cache starts
 * trusted. */
void idem__cache_set_trusted(idem_cache_t *c, bool trusted);

/** Whether the cache is trusted now (false for NULL). */
bool idem__cache_trusted(idem_cache_t *c);

/** Entries and bytes held now. */
size_t idem__cache_entries(idem_cache_t *c);
size_t idem__cache_bytes(idem_cache_t *c);

#endif /* IDEM_GATEWAY_CACHE_H */
