/* src/store/postgres_sub.c - the PostgreSQL side of local_cache
 * invalidations: a LISTEN session on a dedicated connection.
 *
 * postgres.c publishes with SELECT pg_notify(channel, message) on a pooled
 * connection right after a delete commits; the channel is
 * "<table>_invalidate" (the table name cut to 52 bytes so that the channel
 * fits PostgreSQL's 63-byte identifiers: two tables that share those 52
 * bytes only evict each other's entries).  A session (watch.c calls it in a
 * loop): connect with the store's URL (application_name "idem listen"
 * unless the URL names one, so an operator can find the backend in
 * pg_stat_activity), LISTEN, then wait on the socket and hand over each
 * notification.  Every second without traffic it sends an empty query, so
 * that a server that stopped answering is noticed within the URL's
 * timeout; pg_terminate_backend, a server restart or an error ends the
 * session, and watch.c reports the watch down at once.
 *
 * THREADING: a session runs on watch.c's thread and touches only its own
 * connection.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "store/store_impl.h"

#define PING_EVERY_MS 1000

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Hand over every notification libpq has read. */
static void drain(PGconn *pq, idem__watch_sink_t *sink)
{
    PGnotify *n;
    while ((n = PQnotifies(pq)) != NULL) {
        idem__watch_message(sink, n->extra, n->extra ? strlen(n->extra) : 0);
        PQfreemem(n);
    }
}

/* Collect the results of the keepalive that have arrived; 1 when it is
 * answered, 0 not yet, -1 on an error. */
static int collect(PGconn *pq)
{
    while (!PQisBusy(pq)) {
        PGresult *r = PQgetResult(pq);
        if (r == NULL)
            return 1;
        ExecStatusType st = PQresultStatus(r);
        PQclear(r);
        if (st != PGRES_EMPTY_QUERY && st != PGRES_COMMAND_OK)
            return -1;
    }
    return 0;
}

void idem__pg_watch_session(const char *uri, const char *connect_timeout, const char *channel,
                            int64_t timeout_ms, int stop_fd, idem__watch_sink_t *sink)
{
    const char *keys[] = {"connect_timeout", "fallback_application_name", "dbname",
                          "client_encoding", NULL};
    const char *vals[] = {connect_timeout, "idem listen", uri, "UTF8", NULL};
    PGconn *pq = PQconnectdbParams(keys, vals, 1);
    if (pq == NULL)
        return;
    if (PQstatus(pq) != CONNECTION_OK) {
        PQfinish(pq);
        return;
    }
    char sql[128];
    snprintf(sql, sizeof sql, "LISTEN \"%s\"", channel);
    PGresult *r = PQexec(pq, sql);
    bool ok = r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok || PQsetnonblocking(pq, 1) != 0) {
        PQfinish(pq);
        return;
    }
    idem__watch_up(sink);
    drain(pq, sink);

    int64_t last_ping = mono_ms(), ping_out = 0; /* when the unanswered keepalive left */
    for (;;) {
        struct pollfd p[2] = {{.fd = PQsocket(pq), .events = POLLIN},
                              {.fd = stop_fd, .events = POLLIN}};
        if (p[0].fd < 0)
            break;
        int pr = poll(p, 2, PING_EVERY_MS);
        if (pr < 0 && errno != EINTR)
            break;
        if (pr > 0 && (p[1].revents & POLLIN))
            break;
        int64_t now = mono_ms();
        if (pr > 0 && p[0].revents != 0) {
            if (!PQconsumeInput(pq))
                break;
            drain(pq, sink);
            if (ping_out != 0) {
                int c = collect(pq);
                if (c < 0)
                    break;
                if (c > 0)
                    ping_out = 0;
            }
        }
        if (PQstatus(pq) != CONNECTION_OK)
            break;
        if (ping_out != 0 && now - ping_out > timeout_ms)
            break; /* the server stopped answering */
        if (ping_out == 0 && now - last_ping >= PING_EVERY_MS) {
            if (PQsendQuery(pq, "") != 1 || PQflush(pq) < 0)
                break;
            last_ping = ping_out = now;
        }
    }
    PQfinish(pq);
}
