/* src/gateway/policy.h - the published idempotency policy (SPEC section 18):
 * what GET /_idem/policy answers on the public listener (policy.c).
 *
 * The IETF draft "The Idempotency-Key HTTP Header Field" asks a resource to
 * publish how it treats keys, how long it keeps them among it; idemd
 * publishes its route table as it runs, built from the configuration, so
 * the document cannot drift from what idemd does.  Loop-free.
 */
#ifndef IDEM_GATEWAY_POLICY_H
#define IDEM_GATEWAY_POLICY_H

#include "gateway/config.h"

/** The policy of cfg as compact JSON text:
 * {"routes":[{"methods":[...],"path":"/","mode":"required",
 *   "key_from":"header:Idempotency-Key","key_ttl":86400,"failure_ttl":300,
 *   "lease":30,"on_conflict":"reject","fingerprint_body":"raw",
 *   "max_response_bytes":1048576,"release_statuses":[429,503]}, ...]}
 * one object per route in matching order, durations in seconds (a whole
 * number, or a fraction when the configured duration is not whole seconds),
 * sizes in bytes.  Strings are escaped by jansson.
 * @return the text, NUL-terminated, to free() (jansson's allocator is
 *         malloc); NULL when out of memory. */
char *idem__policy_document(const idem_config_t *cfg);

#endif /* IDEM_GATEWAY_POLICY_H */
