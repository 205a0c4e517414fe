/* src/gateway/invalidate.c - local_cache across instances: the store's
 * watch applied to this idemd's cache (SPEC section 19).
 *
 * A delete through any idemd (the admin's DELETE /keys/..., a bulk delete)
 * is followed by idem_store_publish_delete; on a store several idemd share
 * over the network (redis, postgres) every idemd watches the store
 * (idem_store_watch, src/store/watch.c) and forgets the key within about a
 * second.  While the watch is down a delete may be missed, so the cache is
 * bypassed (cache.h, idem__cache_set_trusted) from the moment the watch
 * starts until it is first up, and again from each drop until it is back;
 * each time it comes up the cache is emptied before it serves, so a
 * reconnect after a missed message never replays a deleted record.
 * Embedded stores need nothing: memory: and rocksdb: are one process, and
 * several idemd sharing one lmdb: directory are documented in
 * docs/stores.md ("local_cache").
 *
 * THREADING: the callbacks run on the store's watch thread; the cache and
 * the metrics they touch are thread-safe.
 */
#include <stdio.h>

#include "gateway/gateway.h"
#include "gateway/log.h"

static void on_deleted(void *arg, const idem_key_id_t *id)
{
    idem_gw_t *gw = arg;
    if (id != NULL)
        idem__cache_remove(gw->cache, id);
    else
        idem__cache_clear(gw->cache);
    atomic_fetch_add_explicit(&gw->metrics.cache_inval_applied, 1, memory_order_relaxed);
}

static void on_state(void *arg, bool up)
{
    idem_gw_t *gw = arg;
    idem__cache_set_trusted(gw->cache, up);
    atomic_store(&gw->metrics.cache_watch, up ? 2u : 1u);
    if (up)
        idem__log(gw, "info",
                  "local_cache: subscribed to the store's invalidations; "
                  "cache emptied and in use");
    else
        idem__log(gw, "warn",
                  "local_cache: the store's invalidation channel is lost; "
                  "cache bypassed until it is back");
}

static void on_malformed(void *arg)
{
    idem_gw_t *gw = arg;
    atomic_fetch_add_explicit(&gw->metrics.cache_inval_malformed, 1, memory_order_relaxed);
}

int idem__inval_start(idem_gw_t *gw, char *err, size_t errlen)
{
    if (gw->cache == NULL)
        return 1;
    /* Untrusted before the watch exists: its first message may come at once. */
    idem__cache_set_trusted(gw->cache, false);
    atomic_store(&gw->metrics.cache_watch, 1u);
    idem_store_watch_cbs_t cbs =
        {.deleted = on_deleted, .state = on_state, .malformed = on_malformed, .arg = gw};
    idem_err_t e = idem_store_watch(gw->store, &cbs);
    if (e == IDEM_OK)
        return 0;
    idem__cache_set_trusted(gw->cache, true);
    atomic_store(&gw->metrics.cache_watch, 0u);
    if (e == IDEM_E_UNSUPPORTED)
        return 1;
    snprintf(err, errlen, "local_cache: cannot watch the store's invalidations: %s",
             idem_strerror(e));
    return -1;
}

void idem__inval_stop(idem_gw_t *gw)
{
    idem_store_unwatch(gw->store);
}
