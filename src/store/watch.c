/* src/store/watch.c - invalidation messages between the processes that share
 * a store: the message format, publishing, and the watch thread.
 *
 * idemd's local_cache keeps completed records in memory; a record deleted
 * through another idemd must leave this one's cache too (SPEC section 19).
 * A deleting process publishes "d:" scope ":" key (or "c:", forget
 * everything) through the backend's publish op (Redis PUBLISH, PostgreSQL
 * NOTIFY); every process watching the store runs one thread here that calls
 * the backend's watch_session over and over: a session connects, subscribes,
 * says when it is up (idem__watch_up) and hands over each message
 * (idem__watch_message) until its connection fails or it is stopped.  This
 * file turns that into the public callbacks of idem_store_watch: up and
 * down (so the caller can stop trusting its memory while messages may be
 * missed, and forget everything when they are seen again), a decoded id per
 * delete, and a count of what did not decode.  A message comes from a
 * server anyone with access to it may write to, so it is read as hostile:
 * bounded, the scope checked as the admin checks it, the key's bytes
 * printable ASCII.
 *
 * Between sessions the thread pauses 100 ms after a session that was up
 * (a dropped connection: reconnect at once) and, while sessions fail
 * before they are up, doubling up to 1 s.  The stop pipe wakes it at once.
 *
 * THREADING: the watch thread is the only caller of watch_session and of
 * the callbacks; idem_store_watch and idem__watch_stop run on the thread
 * that opens and closes the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "store/store_impl.h"

struct idem__watch {
    idem_store_t *store;
    idem_store_watch_cbs_t cbs;
    pthread_t thread;
    int stop_rd, stop_wr; /* the stop pipe */
};

struct idem__watch_sink {
    struct idem__watch *w;
    bool up;
};

size_t idem__inval_encode(const idem_key_id_t *id, char *buf)
{
    if (id == NULL) {
        memcpy(buf, "c:", 2);
        return 2;
    }
    size_t sl = strnlen(id->scope, IDEM_SCOPE_MAX), kl = strnlen(id->key, IDEM_KEY_MAX);
    memcpy(buf, "d:", 2);
    memcpy(buf + 2, id->scope, sl);
    buf[2 + sl] = ':';
    memcpy(buf + 3 + sl, id->key, kl);
    return 3 + sl + kl;
}

int idem__inval_decode(const char *msg, size_t len, idem_key_id_t *id)
{
    memset(id, 0, sizeof *id);
    if (msg == NULL || len < 2 || len > IDEM__INVAL_MSG_MAX || msg[1] != ':')
        return 0;
    if (msg[0] == 'c')
        return len == 2 ? 2 : 0;
    if (msg[0] != 'd')
        return 0;
    const char *p = msg + 2, *end = msg + len;
    const char *colon = memchr(p, ':', (size_t)(end - p));
    if (colon == NULL || colon == p || (size_t)(colon - p) > IDEM_SCOPE_MAX)
        return 0;
    size_t sl = (size_t)(colon - p), kl = (size_t)(end - colon - 1);
    if (kl == 0 || kl > IDEM_KEY_MAX)
        return 0;
    memcpy(id->scope, p, sl);
    if (!idem_scope_valid(id->scope))
        return 0;
    for (size_t i = 0; i < kl; i++)
        if ((unsigned char)colon[1 + i] < 0x20 || (unsigned char)colon[1 + i] > 0x7e)
            return 0;
    memcpy(id->key, colon + 1, kl);
    return 1;
}

void idem__watch_up(idem__watch_sink_t *sink)
{
    if (sink->up)
        return;
    sink->up = true;
    if (sink->w->cbs.state != NULL)
        sink->w->cbs.state(sink->w->cbs.arg, true);
}

void idem__watch_message(idem__watch_sink_t *sink, const char *msg, size_t len)
{
    const idem_store_watch_cbs_t *cbs = &sink->w->cbs;
    idem_key_id_t id;
    int kind = idem__inval_decode(msg, len, &id);
    if (kind == 0) {
        if (cbs->malformed != NULL)
            cbs->malformed(cbs->arg);
    } else if (cbs->deleted != NULL) {
        cbs->deleted(cbs->arg, kind == 1 ? &id : NULL);
    }
}

/* Whether the stop pipe says stop, waiting at most ms for it. */
static bool stop_within(const struct idem__watch *w, int ms)
{
    struct pollfd p = {.fd = w->stop_rd, .events = POLLIN};
    int r;
    do
        r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    return r > 0;
}

static void *watch_main(void *arg)
{
    struct idem__watch *w = arg;
    int pause_ms = 100;
    for (;;) {
        struct idem__watch_sink sink = {.w = w, .up = false};
        w->store->ops->watch_session(w->store, w->stop_rd, &sink);
        if (sink.up && w->cbs.state != NULL)
            w->cbs.state(w->cbs.arg, false);
        if (sink.up)
            pause_ms = 100;
        if (stop_within(w, pause_ms))
            break;
        if (!sink.up && pause_ms < 1000)
            pause_ms = pause_ms * 2 > 1000 ? 1000 : pause_ms * 2;
    }
    return NULL;
}

idem_err_t idem_store_watch(idem_store_t *store, const idem_store_watch_cbs_t *cbs)
{
    if (store == NULL || cbs == NULL)
        return IDEM_E_INVAL;
    if (store->ops->watch_session == NULL)
        return IDEM_E_UNSUPPORTED;
    if (store->watch != NULL)
        return IDEM_E_EXISTS;
    struct idem__watch *w = idem_calloc(1, sizeof *w);
    if (w == NULL)
        return IDEM_E_NOMEM;
    w->store = store;
    w->cbs = *cbs;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        idem_free(w);
        return IDEM_E_IO;
    }
    w->stop_rd = fds[0];
    w->stop_wr = fds[1];
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        close(fds[0]);
        close(fds[1]);
        idem_free(w);
        return IDEM_E_IO;
    }
    store->watch = w;
    return IDEM_OK;
}

void idem__watch_stop(struct idem__watch *w)
{
    if (w == NULL)
        return;
    ssize_t n;
    do
        n = write(w->stop_wr, "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(w->thread, NULL);
    close(w->stop_rd);
    close(w->stop_wr);
    idem_free(w);
}

void idem_store_unwatch(idem_store_t *store)
{
    if (store == NULL)
        return;
    idem__watch_stop(store->watch);
    store->watch = NULL;
}

static idem_err_t publish(idem_store_t *store, const idem_key_id_t *id)
{
    if (store == NULL)
        return IDEM_E_INVAL;
    if (store->ops->publish == NULL)
        return IDEM_OK;
    char msg[IDEM__INVAL_MSG_MAX];
    size_t len = idem__inval_encode(id, msg);
    return store->ops->publish(store, msg, len);
}

idem_err_t idem_store_publish_delete(idem_store_t *store, const idem_key_id_t *id)
{
    if (id == NULL || id->scope[0] == '\0' || id->key[0] == '\0')
        return IDEM_E_INVAL;
    return publish(store, id);
}

idem_err_t idem_store_publish_clear(idem_store_t *store)
{
    return publish(store, NULL);
}
