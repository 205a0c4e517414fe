/* src/gateway/selfcheck.h - idemd proves its store at start (selfcheck.c).
 *
 * idemd's promise rests on two things its store must really do: decide a
 * claim and write it in one atomic step (of two claims of a key, one
 * forwards), and refuse a completion whose fence is not the record's.  A
 * store can answer every command and still not do them: a Redis read-only
 * replica refuses every write, a proxy in front of Redis may drop or
 * rewrite scripts, a Redis Cluster with slots uncovered refuses the keys
 * that hash to them.  So before idemd serves, it runs one short life of a
 * key of its own through the store API, under the reserved scope
 * IDEM_SELFCHECK_SCOPE (callers' scopes are 64 hex digits or "anonymous",
 * so no caller can have it): claim, claim again, read, complete with a
 * stale fence, complete, read, delete, read.  The first step that does not
 * come back as a working store answers it is named in one line, and idemd
 * exits 2 (docs/stores.md, "The start-up self-check").  A store that
 * refuses the check's writes for want of room is full, not broken: idemd
 * starts on it with a warning, as it did before the check existed.
 *
 * The key is "<pid>-<32 random hex digits>": the pid tells an operator who
 * left it (every idemd in a container may be pid 1, hence the random part),
 * and the record expires IDEM_SELFCHECK_TTL_MS after the check in any case,
 * so a check cut short (a crash, a store that took the claim and then
 * failed) leaves nothing that lasts.
 *
 * THREADING: one call at a time per store is not required (the key is
 * fresh), but idemd calls it once, from the main thread, before any other
 * thread uses the store.
 */
#ifndef IDEM_GATEWAY_SELFCHECK_H
#define IDEM_GATEWAY_SELFCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "idem/store.h"

/* The scope of the self-check's key; no caller's scope can be this. */
#define IDEM_SELFCHECK_SCOPE "idemd-selfcheck"
/* How long the self-check's record lives if the check cannot delete it. */
#define IDEM_SELFCHECK_TTL_MS 60000

/** Run the self-check on store at time now_ms (idem_clock_now).
 * @param[out] err, errlen  unless 0 is returned, one line (no newline,
 *             control characters replaced by spaces): "store self-check
 *             failed: <step>: expected <what>, got <what came back>[:
 *             <meaning>]" for -1, "store self-check not finished: <step>:
 *             the store has no room ...; starting without it" for 1.
 * @return 0 when the store did everything as a store must; -1 when it did
 *         not (idemd must not serve on it); 1 when a write was refused as
 *         IDEM_E_STORE_FULL, so the rest could not be checked: a full store
 *         is not a broken one, and idemd starts on it as before (a warning).
 *         The check's record is deleted either way, as far as the store
 *         lets it be. */
int idem__selfcheck_run(idem_store_t *store, int64_t now_ms, char *err, size_t errlen);

#endif /* IDEM_GATEWAY_SELFCHECK_H */
