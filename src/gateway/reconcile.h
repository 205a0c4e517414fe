/* src/gateway/reconcile.h - asking the upstream what became of a request
 * whose outcome is unknown (on_unknown_outcome: reconcile, SPEC section 18).
 *
 * A key whose request was sent but got no whole answer is held (HOLD, with
 * its owner's lease); this worker then asks `GET reconcile_url` after
 * reconcile_after, and again with backoff, until the answer settles it:
 * 404 releases the key (fenced), any other 2xx-4xx is stored as its
 * response (a fenced COMPLETE, as a normal completion), anything else is
 * asked again later, until the hold's retention (key_ttl) ends.  While it
 * tracks a key the worker renews the key's lease every lease / 3, so no
 * other process asks at the same time; a key whose owner is gone (its
 * lease ended) is taken by the next repeat's claim with fence + 1
 * (IDEM_DECIDE_RECONCILE) and asked about at once by that repeat's worker.
 * Every write is fenced, so the late answer of an asker whose lease was
 * taken over is refused by the store.
 *
 * Budgets: at most IDEM_RECONCILE_KEYS_MAX keys tracked and
 * IDEM_RECONCILE_ASKING_MAX questions in flight per worker; each question
 * is bounded by upstream_timeout (the worker's upstream client) and its
 * answer's body by the route's max_response_bytes (beyond it the answer is
 * stored without its body, as a normal completion would be).  A key over
 * the first budget is held all the same, and its lease left to run out: a
 * later repeat asks.
 *
 * THREADING: the worker's loop thread only.
 */
#ifndef IDEM_GATEWAY_RECONCILE_H
#define IDEM_GATEWAY_RECONCILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/config.h"
#include "gateway/list.h"
#include "idem/key.h"

#define IDEM_RECONCILE_KEYS_MAX 4096
#define IDEM_RECONCILE_ASKING_MAX 16
/* The backoff doubles from reconcile_after up to this (or reconcile_after
 * when that is longer). */
#define IDEM_RECONCILE_BACKOFF_MAX_MS (5 * 60 * 1000)

typedef struct idem_worker idem_worker_t;

/** One worker's questions. */
typedef struct idem_reconcile {
    idem_worker_t *w;
    idem_link_t keys;  /* tracked keys (struct recon_key), dropped ones until freed */
    size_t n_keys;     /* tracked and not dropped */
    idem_link_t ready; /* keys whose question is due, waiting for a slot */
    size_t asking;     /* questions in flight */
    bool stopping;
} idem_reconcile_t;

/** Set up r for worker w (its loop, upstream client, store jobs). */
void idem__reconcile_init(idem_reconcile_t *r, idem_worker_t *w);

/** Track id, held under fence by this worker with policy (a policy of cfg,
 * of which the key keeps a reference while tracked, so that a SIGHUP that
 * replaces the configuration leaves it valid), until expires_at_ms: renew
 * its lease, and ask at once (ask_now, a repeat took the key of a gone
 * owner) or after reconcile_after.  A key tracked already takes the new
 * fence. */
void idem__reconcile_track(idem_reconcile_t *r, const idem_config_t *cfg,
                           const idem_policy_t *policy,
                           const idem_key_id_t *id, uint64_t fence, int64_t expires_at_ms,
                           bool ask_now);

/** The worker stops: end the questions in flight (their keys keep their
 * hold; the lease runs out and a repeat asks again) and every timer. */
void idem__reconcile_stop(idem_reconcile_t *r);

/** Free what is left, after the worker's loop has ended and the writer
 * has stopped (no job of r is in flight any more). */
void idem__reconcile_cleanup(idem_reconcile_t *r);

/** Write the path of url for key into out (outlen bytes): url's path with
 * every "{key}" replaced by key percent-encoded (all but A-Z a-z 0-9 - . _
 * ~).  @return the length, or -1 when it does not fit. */
int idem__reconcile_path(const char *url, const char *key, char *out, size_t outlen);

#endif /* IDEM_GATEWAY_RECONCILE_H */
