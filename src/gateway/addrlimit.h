/* src/gateway/addrlimit.h - max_connections_per_address: how many client
 * connections each address holds, across every worker (addrlimit.c).
 *
 * For idemd facing clients directly rather than a balancer: one address
 * may not take the whole of max_connections.  A table of addresses and
 * their counts under one mutex; an address leaves the table when its last
 * connection closes, so the table never holds more entries than there are
 * connections.  IPv4 and IPv4-mapped IPv6 addresses are one address.
 * Nothing here knows a loop.
 *
 * THREADING: any thread.
 */
#ifndef IDEM_GATEWAY_ADDRLIMIT_H
#define IDEM_GATEWAY_ADDRLIMIT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct idem_addrlimit idem_addrlimit_t;

/** A table allowing max connections per address.  @return it, or NULL
 * when max is 0 (off) or memory ran out (*err set then). */
idem_addrlimit_t *idem__addrlimit_create(uint64_t max, bool *err);
void idem__addrlimit_destroy(idem_addrlimit_t *t); /* NULL does nothing */
/** Take a place for sa.  @return false when sa holds max already (or the
 * table cannot grow: refused rather than unbounded).  NULL t: true. */
bool idem__addrlimit_take(idem_addrlimit_t *t, const struct sockaddr *sa);
/** Give back a place taken for sa. */
void idem__addrlimit_give(idem_addrlimit_t *t, const struct sockaddr *sa);
/** How many places sa holds (for tests). */
uint64_t idem__addrlimit_count(idem_addrlimit_t *t, const struct sockaddr *sa);

#endif /* IDEM_GATEWAY_ADDRLIMIT_H */
