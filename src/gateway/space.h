/* src/gateway/space.h - idemd watches the room its store has left (space.c).
 *
 * An embedded store (lmdb:, rocksdb:) refuses new records once its disk or
 * its map has no room left, and then every keyed request gets 503.  The
 * operator should hear of it before: the sweeper thread (writer.c) asks
 * the store about once a second (idem_store_space), puts the answer on
 * /metrics (idem_store_used_bytes, idem_store_free_bytes), and logs one
 * line when the room crosses the warning line, one when it runs out, and
 * one when it is back.  Stores whose room is a server's (Redis,
 * PostgreSQL) or memory's answer IDEM_E_UNSUPPORTED: they are asked once,
 * and the gauges are never shown.
 *
 * THREADING: a watch belongs to one thread (the sweeper); the metrics it
 * writes are atomics.
 */
#ifndef IDEM_GATEWAY_SPACE_H
#define IDEM_GATEWAY_SPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/metrics.h"
#include "idem/store.h"

/* The warning line: free below the larger of these. */
#define IDEM_SPACE_LOW_BYTES (1ull << 30) /* 1 GiB */
#define IDEM_SPACE_LOW_DIV 10             /* a tenth of what the store can reach (used + free) */

typedef enum idem_space_level {
    IDEM_SPACE_UNKNOWN = 0, /* not asked yet */
    IDEM_SPACE_OK,
    IDEM_SPACE_LOW,  /* free below the warning line */
    IDEM_SPACE_FULL, /* free 0: the store refuses new records */
} idem_space_level_t;

/** The warning line for a store with used and free bytes:
 * max(IDEM_SPACE_LOW_BYTES, (used + free) / IDEM_SPACE_LOW_DIV). */
uint64_t idem__space_low_line(uint64_t used, uint64_t free_bytes);

/** The level of (used, free) given the previous one.  FULL at free 0, LOW
 * below the warning line; a LOW or FULL store is OK again only at 5/4 of
 * the line, so one that hovers at the line does not log every second. */
idem_space_level_t idem__space_level(idem_space_level_t prev, uint64_t used, uint64_t free_bytes);

typedef struct idem_space_watch {
    idem_space_level_t level;
    bool unsupported; /* the store said IDEM_E_UNSUPPORTED: not asked again */
    uint64_t last_ns; /* idem_clock_mono_ns of the last ask; 0: never */
} idem_space_watch_t;

/** What one look found worth a log line. */
typedef struct idem_space_note {
    const char *level; /* "info", "warn" or "error"; NULL: nothing to log */
    char line[256];    /* the line, without a newline */
} idem_space_note_t;

/** Ask the store for its room unless it was asked less than every_ns ago
 * (the first call always asks), put the answer in m's gauges, and fill
 * note when the level changed.  A store that cannot be asked now
 * (IDEM_E_IO) leaves gauges and level as they were.
 * @return whether the store was asked. */
bool idem__space_look(idem_space_watch_t *w, idem_store_t *store, idem_metrics_t *m,
                      uint64_t now_ns, uint64_t every_ns, idem_space_note_t *note);

#endif /* IDEM_GATEWAY_SPACE_H */
