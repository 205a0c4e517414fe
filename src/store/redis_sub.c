/* src/store/redis_sub.c - the Redis side of local_cache invalidations:
 * a subscriber session on a dedicated connection, and the channel's name.
 *
 * Every Redis form (redis://, redis+sentinel://, redis+cluster:// and their
 * TLS twins) uses plain PUBLISH and SUBSCRIBE on the channel "<prefix>invalidate"
 * ("idem:invalidate" by default).  Pub/sub channels are global to a server,
 * not per database, so the prefix is what keeps two deployments on one
 * server apart.  On a cluster a PUBLISH on any node reaches the subscribers
 * of every node (the cluster bus broadcasts it), so a subscriber connects
 * to any seed node that answers and a publisher uses any master; sharded
 * pub/sub (SSUBSCRIBE, Redis 7) would send each message to one shard only,
 * but would need a subscriber per shard and messages are rare (operator
 * deletes), so the broadcast is the simpler choice.  Behind sentinels the
 * subscriber follows the master the sentinels name; a replica also
 * delivers what its master publishes, so a failover loses nothing the
 * reconnect does not repair.
 *
 * A session (watch.c calls it in a loop): connect, AUTH, SUBSCRIBE, then
 * read messages as they come.  Every second without traffic it sends PING
 * (allowed while subscribed; the answer is ["pong", ""]); a PING with no
 * answer within the URL's timeout, an error, the server closing the
 * connection (CLIENT KILL TYPE pubsub) or a stop ends the session.  The
 * subscriber's connection is its own, never one of the pool's.
 *
 * THREADING: a session runs on watch.c's thread and touches only its own
 * connection and the (read-only) URL config.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "store/redis_impl.h"

#define PING_EVERY_MS 1000

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

size_t idem__redis_channel(const struct rcfg *cfg, char *buf)
{
    memcpy(buf, cfg->prefix, cfg->prefix_len);
    memcpy(buf + cfg->prefix_len, "invalidate", sizeof "invalidate");
    return cfg->prefix_len + sizeof "invalidate" - 1;
}

/* AUTH on c as the URL says; 0, or -1 (the session gives up). */
static int auth(const struct rcfg *cfg, idem__rconn_t *c)
{
    if (!cfg->has_pass)
        return 0;
    const char *argv[] = {"AUTH", cfg->user, cfg->pass};
    size_t len[] = {4, strlen(cfg->user), strlen(cfg->pass)};
    int argc = 3;
    if (cfg->user[0] == '\0') {
        argv[1] = cfg->pass;
        len[1] = len[2];
        argc = 2;
    }
    redisReply *r = NULL;
    if (idem__rconn_append(c, argc, argv, len) != 0 || idem__rconn_get_reply(c, &r) != 0)
        return -1;
    int ok = r->type != REDIS_REPLY_ERROR;
    freeReplyObject(r);
    return ok ? 0 : -1;
}

/* A connection for the subscriber, authenticated: the master (sentinel),
 * the first seed that answers from a rotating start (cluster), or the
 * server; NULL when none. */
static idem__rconn_t *sub_connect(const struct rcfg *cfg, idem_tls_ctx_t *tls)
{
    static _Atomic unsigned next_seed;
    char err[256];
    if (cfg->sentinel) {
        struct endpoint master;
        if (idem__redis_discover(cfg, tls, &master, err, sizeof err) != 0)
            return NULL;
        idem__rconn_t *c = idem__redis_connect(cfg, tls, &master, err, sizeof err);
        if (c != NULL && auth(cfg, c) != 0) {
            idem__rconn_free(c);
            c = NULL;
        }
        return c;
    }
    int n = cfg->cluster ? cfg->nep : 1;
    unsigned start = cfg->cluster ? next_seed++ : 0;
    for (int i = 0; i < n; i++) {
        const struct endpoint *ep = &cfg->ep[(start + (unsigned)i) % (unsigned)n];
        idem__rconn_t *c = idem__redis_connect(cfg, tls, ep, err, sizeof err);
        if (c == NULL)
            continue;
        if (auth(cfg, c) == 0)
            return c;
        idem__rconn_free(c);
    }
    return NULL;
}

/* Whether r is a push whose first element is the string kind. */
static int push_is(const redisReply *r, const char *kind, size_t min_elements)
{
    if (r == NULL || (r->type != REDIS_REPLY_ARRAY) || r->elements < min_elements ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return 0;
    return strcmp(r->element[0]->str, kind) == 0;
}

void idem__redis_watch_session(const struct rcfg *cfg, idem_tls_ctx_t *tls, int stop_fd,
                               idem__watch_sink_t *sink)
{
    idem__rconn_t *c = sub_connect(cfg, tls);
    if (c == NULL)
        return;
    char chan[IDEM_STORE_OPT_MAX + sizeof "invalidate"];
    size_t chan_len = idem__redis_channel(cfg, chan);
    const char *argv[] = {"SUBSCRIBE", chan};
    size_t len[] = {9, chan_len};
    redisReply *r = NULL;
    if (idem__rconn_append(c, 2, argv, len) != 0 || idem__rconn_get_reply(c, &r) != 0 ||
        !push_is(r, "subscribe", 3)) {
        freeReplyObject(r);
        idem__rconn_free(c);
        return;
    }
    freeReplyObject(r);
    idem__watch_up(sink);

    int64_t last_ping = mono_ms(), ping_out = 0; /* when the unanswered PING left; 0: none */
    for (;;) {
        int w = idem__rconn_wait(c, stop_fd, PING_EVERY_MS);
        if (w < 0 || w == 2)
            break;
        int64_t now = mono_ms();
        if (ping_out != 0 && now - ping_out > cfg->timeout_ms)
            break; /* the server stopped answering */
        if (w == 1) {
            if (idem__rconn_get_reply(c, &r) != 0)
                break;
            if (push_is(r, "message", 3)) {
                const redisReply *m = r->element[2];
                if (m->type == REDIS_REPLY_STRING)
                    idem__watch_message(sink, m->str, m->len);
                else
                    idem__watch_message(sink, NULL, 0); /* counted as malformed */
            } else if (push_is(r, "pong", 1)) {
                ping_out = 0;
            }
            freeReplyObject(r);
        }
        if (ping_out == 0 && now - last_ping >= PING_EVERY_MS) {
            if (idem__rconn_append(c, 1, (const char *[]){"PING"}, (const size_t[]){4}) != 0 ||
                idem__rconn_flush(c) != 0)
                break;
            last_ping = ping_out = now;
        }
    }
    idem__rconn_free(c);
}
