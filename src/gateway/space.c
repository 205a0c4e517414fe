/* src/gateway/space.c - idemd watches the room its store has left.
 *
 * The sweeper thread calls idem__space_look once per wake-up; it asks the
 * store at most once per every_ns (a second in writer.c), so an operator
 * sees the room on /metrics within about a second and the store is not
 * asked on any request's path.
 *
 * The warning line is the larger of 1 GiB and a tenth of what the store
 * can reach (used + free).  The larger, not the smaller: the point is time
 * to act, and 1 GiB lasts about six minutes at 10,000 new keys a second of
 * 300-byte records, while a tenth of a large store's reach is hours.  A
 * small filesystem (under about 1.1 GiB for the store) is below the line
 * from the start: one line says so at start, which is right for a store
 * that will fill its disk.
 *
 * Lines are logged on a change of level only, and a store is OK again only
 * at 5/4 of the line, so a store at the line logs once, not every second.
 *
 * INVARIANTS: the gauges are written before store_space_known is set, so a
 * scrape never shows a known zero that was not measured.
 * THREADING: a watch on one thread; metrics are atomics.
 */
#include <stdio.h>

#include "gateway/space.h"

uint64_t idem__space_low_line(uint64_t used, uint64_t free_bytes)
{
    /* (used + free) / 10 without overflow */
    uint64_t reach = used / IDEM_SPACE_LOW_DIV + free_bytes / IDEM_SPACE_LOW_DIV;
    return reach > IDEM_SPACE_LOW_BYTES ? reach : IDEM_SPACE_LOW_BYTES;
}

idem_space_level_t idem__space_level(idem_space_level_t prev, uint64_t used, uint64_t free_bytes)
{
    if (free_bytes == 0)
        return IDEM_SPACE_FULL;
    uint64_t line = idem__space_low_line(used, free_bytes);
    if (prev == IDEM_SPACE_LOW || prev == IDEM_SPACE_FULL)
        line += line / 4;
    return free_bytes < line ? IDEM_SPACE_LOW : IDEM_SPACE_OK;
}

/* bytes as people read them: "17 B", "3.0 KiB", "1.2 GiB" */
static void human(uint64_t n, char *out, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) {
        snprintf(out, len, "%llu B", (unsigned long long)n);
        return;
    }
    double v = (double)n / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, len, "%.1f %s", v, units[u]);
}

static void describe(idem_space_level_t prev, idem_space_level_t now, uint64_t used,
                     uint64_t free_bytes, idem_space_note_t *note)
{
    char u[32], f[32], l[32];
    human(used, u, sizeof u);
    human(free_bytes, f, sizeof f);
    human(idem__space_low_line(used, free_bytes), l, sizeof l);
    switch (now) {
    case IDEM_SPACE_FULL:
        note->level = "error";
        snprintf(note->line, sizeof note->line,
                 "store: no room left for new records (%s used): keyed requests and token "
                 "issues get 503 until records expire, keys are deleted or the disk grows",
                 u);
        break;
    case IDEM_SPACE_LOW:
        note->level = "warn";
        snprintf(note->line, sizeof note->line,
                 "store: %s%s left for new records, below the warning line of %s (%s used); "
                 "at 0 it refuses new keys",
                 prev == IDEM_SPACE_FULL ? "room again, but only " : "only ", f, l, u);
        break;
    case IDEM_SPACE_OK:
        note->level = "info";
        snprintf(note->line, sizeof note->line,
                 "store: room again: %s left for new records (%s used)", f, u);
        break;
    case IDEM_SPACE_UNKNOWN:
        break;
    }
}

bool idem__space_look(idem_space_watch_t *w, idem_store_t *store, idem_metrics_t *m,
                      uint64_t now_ns, uint64_t every_ns, idem_space_note_t *note)
{
    note->level = NULL;
    note->line[0] = '\0';
    if (w->unsupported || (w->last_ns != 0 && now_ns - w->last_ns < every_ns))
        return false;
    w->last_ns = now_ns != 0 ? now_ns : 1;
    idem_store_space_t sp;
    idem_err_t err = idem_store_space(store, &sp);
    if (err == IDEM_E_UNSUPPORTED) {
        w->unsupported = true;
        return true;
    }
    if (err != IDEM_OK)
        return true; /* asked, but no answer this time: keep what we had */
    atomic_store(&m->store_used_bytes, sp.used_bytes);
    atomic_store(&m->store_free_bytes, sp.free_bytes);
    atomic_store(&m->store_space_known, true);
    idem_space_level_t prev = w->level;
    idem_space_level_t now = idem__space_level(prev, sp.used_bytes, sp.free_bytes);
    w->level = now;
    /* A store that starts with room says nothing; every other change does. */
    if (now != prev && !(prev == IDEM_SPACE_UNKNOWN && now == IDEM_SPACE_OK))
        describe(prev, now, sp.used_bytes, sp.free_bytes, note);
    return true;
}
