/* src/store/redis_cluster.c - the Redis store on a Redis Cluster
 * ("redis+cluster://", and over TLS "rediss+cluster://"); SPEC section 17.
 *
 *   redis+cluster://[user:pass@]host:port[,host:port...][?prefix=&pool=&timeout=]
 *   rediss+cluster://...[?...&ca=&cert=&key=&sni=&verify=]
 *
 * The hosts are seeds: any node of the cluster will do.  The records, the
 * scripts and the URL grammar are redis.c's (redis_impl.h): every op runs
 * the same Lua function on the same one-key layout (PREFIX SCOPE ":" KEY, a
 * hash), so each op is atomic on one slot.  A record has
 * one key, so its keys trivially share a slot; the slot is the key's as
 * Redis computes it (CRC16/XMODEM of the hash tag, the text between the
 * first '{' and the next '}' when that is not empty, else of the whole key,
 * mod 16384), so a client key "{tenant}42" keeps its tag's slot.  The
 * prefix may hold no brace (it would tag every key into one slot).
 *
 * The slot map is read with CLUSTER SLOTS from any node that answers (the
 * masters we know, then the seeds) at open and whenever a node says the map
 * moved (MOVED), a node cannot be reached, or a slot has no master; a
 * refresh after another thread's refresh is skipped (the map's epoch).
 * The open refuses a map with slots that no master serves, naming them
 * (idem__redis_uncovered: "slots 5461-10922 are served by no master");
 * a refresh at run time that finds such slots keeps them so, and their
 * ops fail closed (IDEM_E_STORE_DOWN once the timeout is spent).
 * Nodes are kept for the handle's life, each with a pool (pool.c) of at
 * most pool= connections that have loaded the scripts.
 *
 * exec: the ops are grouped by the master that holds their slot; every
 * master gets its ops as ONE EVALSHA of redis.c's batch script (one call per
 * batch and master, issue 20), all calls are written before any reply is
 * read, so the masters work at once.  The call's keys are of several slots
 * of that master: Redis 7.0 refuses declared keys of several slots
 * (CROSSSLOT, even for a "#!lua flags=allow-cross-slot-keys" script), and
 * lets a script without a "#!lua" line touch any key its node serves, so
 * the keys are framed in ARGV (numkeys 0) and the call is never redirected
 * as a whole.  Within one master the ops run in order, in one atomic call,
 * so two ops of one key in a batch still run in order; a batch is not one
 * transaction across masters (each op is atomic alone, and idemd's writer
 * batches independent requests).  An op whose key that node does not serve
 * (a stale map, or a migrating slot whose key has left) fails at its first
 * read inside the call, before it wrote anything, with "Script attempted to
 * access a non local key in a cluster node": that op alone (st.alone) goes
 * on by its op script (EVALSHA with its key declared, ASKING first after an
 * ASK), in the same pipeline after the node's batch call, and gets the
 * redirect.  Replies to the op script (or to the batch call as a whole,
 * standing for each of its ops):
 *   MOVED      the script did not run: the map is refreshed and the op sent
 *              again to the new master;
 *   ASK        did not run: sent again alone to the target after ASKING,
 *              the map left as it is (the slot is migrating);
 *   TRYAGAIN, CLUSTERDOWN, NOSCRIPT   did not run: again after a short
 *              pause (NOSCRIPT: after SCRIPT LOAD; CLUSTERDOWN: after the
 *              map is read again, the slot may have lost its master);
 * all within the URL's timeout and at most ROUNDS_MAX rounds, the second
 * retry on after a pause that doubles (10 ms to 250 ms): a slot whose move
 * is being announced node by node can bounce between two masters for a
 * moment.  What is left then fails with IDEM_E_STORE_DOWN.  MOVED names
 * the slot's new master, which the map takes at once.  A master that cannot be reached
 * before anything was sent to it is like MOVED (its ops were not sent:
 * safe to send elsewhere once the map names a new master), except that
 * while the map, read again, still names it, its ops fail at once
 * (fail_unreachable): a dead master must not hold up the other masters'
 * ops of the batch until the timeout.  A connection
 * that fails AFTER a pipeline was written leaves the outcome of the ops
 * not yet answered unknown: a claim may have run (so does an "ERR" answer
 * to a whole batch call: the script failed while running).  Such ops are NOT sent
 * again (a claim sent twice would find its own in_progress record and
 * answer in_flight), and exec returns IDEM_E_STORE_DOWN for the whole
 * batch, as redis.c does for a lost EXEC: a per-op error promises that the
 * op wrote nothing (store_impl.h), which cannot be said here, so the
 * answers of the other masters are given up too.  idemd answers 503, and
 * the lease covers a claim that did land.
 *
 * get follows MOVED and ASK the same way (a read is safe to repeat).
 * sweep walks every master: Redis expires records itself (redis.c), so a
 * sweep asks TIME of one master and does nothing while the caller's clock is
 * not ahead of it; otherwise it SCANs each master in turn from a cursor kept
 * per node and runs the sweep script on each key (one key per call: one
 * slot).  ping PINGs every master of the map and fails while a slot has no
 * master.
 *
 * THREADING: every op but open and close may be called from any number of
 * threads.  The map is under a read-write lock, held only to copy what a
 * call needs; refreshes are serialised by their own lock; the node table
 * only grows (under nodes_lock; readers use the published count); each
 * node's pool has its own lock; sweeps are serialised by sweep_lock.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idem/alloc.h"
#include "store/pool.h"
#include "store/redis_conn.h"
#include "store/redis_impl.h"
#include "store/store_impl.h"

#define SLOTS 16384
#define NODES_MAX 250        /* nodes a handle ever learns of */
#define NO_NODE 255          /* a slot with no master */
#define ROUNDS_MAX 64        /* sends of one batch, redirects and retries together */
#define PAUSE_MIN_MS 10      /* the first pause before TRYAGAIN/CLUSTERDOWN is retried */
#define PAUSE_MAX_MS 250
#define SWEEP_SCAN_COUNT "1000"
#define SWEEP_STEPS_MAX 16
#define SWEEP_NATIVE_SLACK_MS 1000 /* as redis.c */

_Static_assert(NODES_MAX < NO_NODE, "a node index fits a byte");

struct cluster_store;

struct node {
    struct endpoint ep;
    struct cluster_store *s;
    idem__pool_t pool;
    /* sweep position (sweep_lock) */
    unsigned long long sweep_cursor;
};

struct cconn {
    struct idem__pool_conn pc; /* first: the pool lends out a cconn as this */
    idem__rconn_t *c;
    idem__redis_shas_t sha;
};

struct cluster_store {
    struct idem_store base; /* first */
    struct rcfg cfg;
    idem_tls_ctx_t *tls;
    char where[IDEM__REDIS_HOST_MAX + 32]; /* "cluster host:port" (the first seed) */
    pthread_mutex_t nodes_lock;
    struct node *nodes[NODES_MAX];
    atomic_int nnodes;
    pthread_rwlock_t map_lock;
    uint8_t slot_node[SLOTS]; /* map_lock */
    unsigned long epoch;      /* map_lock: bumped by every refresh that read a map */
    pthread_mutex_t refresh_lock;
    pthread_mutex_t sweep_lock;
    int sweep_master;       /* the master index (into a map's master list) being swept */
    redisReply *sweep_keys; /* the last SCAN's answer, its keys visited up to sweep_next */
    size_t sweep_next;
    char match[2 * IDEM_STORE_OPT_MAX + 2];
};

/* ---- slots -------------------------------------------------------------- */

/* CRC16/XMODEM (polynomial 0x1021, initial 0, no reflection): the Redis
 * Cluster spec's key hash.  A byte at a time from a table of the 256
 * bytes' remainders, made once (bit by bit, as the definition goes): every
 * op of every batch hashes its key, and the bitwise loop was 1% of idemd's
 * CPU on the cluster bench row. */
static uint16_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (unsigned v = 0; v < 256; v++) {
        uint16_t crc = (uint16_t)(v << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
        crc_table[v] = crc;
    }
}

uint16_t idem__redis_crc16(const char *p, size_t n)
{
    pthread_once(&crc_once, crc_table_init);
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++)
        crc = (uint16_t)((crc << 8) ^ crc_table[((crc >> 8) ^ (unsigned char)p[i]) & 0xff]);
    return crc;
}

unsigned idem__redis_keyslot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close != NULL && close > open + 1)
            return idem__redis_crc16(open + 1, (size_t)(close - open - 1)) % SLOTS;
    }
    return idem__redis_crc16(key, len) % SLOTS;
}

/* ---- nodes and connections --------------------------------------------- */

static idem__rconn_t *connect_ep(const struct cluster_store *s, const struct endpoint *ep,
                                 char *err, size_t errlen)
{
    char who[IDEM__REDIS_HOST_MAX + 16];
    idem__redis_say(who, sizeof who, "%s:%d", ep->host, ep->port);
    idem__rconn_t *c = idem__redis_connect(&s->cfg, s->tls, ep, err, errlen);
    if (c == NULL)
        return NULL;
    /* AUTH, pipelined with nothing else: its answer is read here. */
    if (s->cfg.has_pass) {
        const char *argv[] = {"AUTH", s->cfg.user, s->cfg.pass};
        size_t len[] = {4, strlen(s->cfg.user), strlen(s->cfg.pass)};
        int argc = 3;
        if (s->cfg.user[0] == '\0') {
            argv[1] = s->cfg.pass;
            len[1] = len[2];
            argc = 2;
        }
        redisReply *r = NULL;
        if (idem__rconn_append(c, argc, argv, len) != 0 || idem__rconn_get_reply(c, &r) != 0) {
            idem__redis_errtext_io(err, errlen, who, c, s->cfg.timeout_ms);
            idem__rconn_free(c);
            return NULL;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            idem__redis_say(err, errlen, "%s: AUTH failed: %.150s", who, r->str);
            freeReplyObject(r);
            idem__rconn_free(c);
            return NULL;
        }
        freeReplyObject(r);
    }
    return c;
}

static idem_err_t pool_connect(void *ctx, struct idem__pool_conn **out, char *why, size_t whylen)
{
    struct node *n = ctx;
    *out = NULL;
    struct cconn *k = idem_calloc(1, sizeof *k);
    if (k == NULL) {
        idem__redis_say(why, whylen, "out of memory");
        return IDEM_E_NOMEM;
    }
    k->c = connect_ep(n->s, &n->ep, why, whylen);
    if (k->c == NULL) {
        idem_free(k);
        return IDEM_E_STORE_DOWN;
    }
    char err[256];
    if (idem__redis_load_scripts(k->c, k->sha, err, sizeof err, n->s->cfg.timeout_ms) != 0) {
        idem__redis_say(why, whylen, "%s:%d: %s", n->ep.host, n->ep.port, err);
        idem__rconn_free(k->c);
        idem_free(k);
        return IDEM_E_STORE_DOWN;
    }
    *out = &k->pc;
    return IDEM_OK;
}

static void pool_close(void *ctx, struct idem__pool_conn *c)
{
    (void)ctx;
    struct cconn *k = (struct cconn *)c;
    idem__rconn_free(k->c);
    idem_free(k);
}

static bool pool_healthy(void *ctx, struct idem__pool_conn *c)
{
    (void)ctx;
    return idem__rconn_idle_ok(((struct cconn *)c)->c);
}

static const struct idem__pool_ops pool_ops = {
    .connect = pool_connect,
    .close = pool_close,
    .healthy = pool_healthy,
};

/* The index of the node at host:port, added if new; -1 when the table is
 * full or out of memory. */
static int node_index(struct cluster_store *s, const char *host, size_t hlen, int port)
{
    if (hlen == 0 || hlen > IDEM__REDIS_HOST_MAX)
        return -1;
    int n = atomic_load_explicit(&s->nnodes, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (s->nodes[i]->ep.port == port && strlen(s->nodes[i]->ep.host) == hlen &&
            memcmp(s->nodes[i]->ep.host, host, hlen) == 0)
            return i;
    pthread_mutex_lock(&s->nodes_lock);
    n = atomic_load_explicit(&s->nnodes, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (s->nodes[i]->ep.port == port && strlen(s->nodes[i]->ep.host) == hlen &&
            memcmp(s->nodes[i]->ep.host, host, hlen) == 0) {
            pthread_mutex_unlock(&s->nodes_lock);
            return i;
        }
    }
    int idx = -1;
    struct node *nd = n < NODES_MAX ? idem_calloc(1, sizeof *nd) : NULL;
    if (nd != NULL) {
        memcpy(nd->ep.host, host, hlen);
        nd->ep.host[hlen] = '\0';
        nd->ep.port = port;
        nd->s = s;
        idem__pool_cfg_t pc = {.ops = &pool_ops, .ctx = nd, .max = s->cfg.pool,
                               .wait_ms = s->cfg.timeout_ms};
        if (idem__pool_init(&nd->pool, &pc) == IDEM_OK) {
            s->nodes[n] = nd;
            atomic_store_explicit(&s->nnodes, n + 1, memory_order_release);
            idx = n;
        } else {
            idem_free(nd);
        }
    }
    pthread_mutex_unlock(&s->nodes_lock);
    return idx;
}

/* "host:port" of a MOVED or ASK ("MOVED 3999 127.0.0.1:6381") into a node. */
static int redirect_node(struct cluster_store *s, const char *msg)
{
    const char *sp = strchr(msg, ' ');
    sp = sp ? strchr(sp + 1, ' ') : NULL;
    if (sp == NULL)
        return -1;
    const char *addr = sp + 1, *colon = strrchr(addr, ':');
    int port;
    if (colon == NULL || !idem__url_port(colon + 1, strlen(colon + 1), &port))
        return -1;
    return node_index(s, addr, (size_t)(colon - addr), port);
}

/* ---- the slot map --------------------------------------------------------- */

/* MOVED: the slot's master is the one the reply names; 0, or -1 when the
 * reply names none we can use (the whole map is read again then). */
static int moved(struct cluster_store *s, unsigned slot, const char *msg)
{
    int to = redirect_node(s, msg);
    if (to < 0)
        return -1;
    pthread_rwlock_wrlock(&s->map_lock);
    s->slot_node[slot] = (uint8_t)to;
    pthread_rwlock_unlock(&s->map_lock);
    return 0;
}

/* Read CLUSTER SLOTS from one node into map (NO_NODE where nobody serves). */
static int read_slots(struct cluster_store *s, const struct endpoint *ep, uint8_t *map,
                      char *err, size_t errlen)
{
    idem__rconn_t *c = connect_ep(s, ep, err, errlen);
    if (c == NULL)
        return -1;
    redisReply *r = NULL;
    if (idem__rconn_append(c, 2, (const char *[]){"CLUSTER", "SLOTS"}, (const size_t[]){7, 5}) !=
            0 ||
        idem__rconn_get_reply(c, &r) != 0) {
        char who[IDEM__REDIS_HOST_MAX + 16];
        idem__redis_say(who, sizeof who, "%s:%d", ep->host, ep->port);
        idem__redis_errtext_io(err, errlen, who, c, s->cfg.timeout_ms);
        idem__rconn_free(c);
        return -1;
    }
    idem__rconn_free(c);
    if (r->type != REDIS_REPLY_ARRAY) {
        idem__redis_say(err, errlen, "%s:%d: CLUSTER SLOTS: %.150s", ep->host, ep->port,
            r->type == REDIS_REPLY_ERROR ? r->str : "unexpected answer");
        freeReplyObject(r);
        return -1;
    }
    memset(map, NO_NODE, SLOTS);
    int covered = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
            continue;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const redisReply *m = e->element[2];
        if (lo < 0 || hi >= SLOTS || lo > hi || m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer < 1 ||
            m->element[1]->integer > 65535)
            continue;
        /* An empty address: the node we asked ("?" would be unknown). */
        const char *host = m->element[0]->str;
        size_t hlen = m->element[0]->len;
        if (hlen == 0) {
            host = ep->host;
            hlen = strlen(host);
        }
        if (hlen == 1 && host[0] == '?')
            continue;
        int idx = node_index(s, host, hlen, (int)m->element[1]->integer);
        if (idx < 0)
            continue;
        memset(map + lo, idx, (size_t)(hi - lo + 1));
        covered = 1;
    }
    freeReplyObject(r);
    if (!covered) {
        idem__redis_say(err, errlen, "%s:%d: CLUSTER SLOTS names no master (is it a cluster?)", ep->host,
            ep->port);
        return -1;
    }
    return 0;
}

/* The slots of map (SLOTS entries) whose entry is none, in words, into
 * buf: "slots 5461-10922 are served by no master", "slot 7 is ...", up to
 * four ranges and then how many more; their count (0: every slot is
 * served, buf empty).  The open refuses a map with a gap; at run time a gap
 * makes the ops of its slots fail closed (exec: "slot N has no master"). */
size_t idem__redis_uncovered(const uint8_t *map, uint8_t none, char *buf, size_t len)
{
    size_t count = 0, ranges = 0, at = 0;
    char list[160] = "";
    for (size_t i = 0; i < SLOTS;) {
        if (map[i] != none) {
            i++;
            continue;
        }
        size_t lo = i;
        while (i < SLOTS && map[i] == none)
            i++;
        count += i - lo;
        if (ranges++ < 4 && at < sizeof list) {
            int w = lo + 1 == i ? snprintf(list + at, sizeof list - at, "%s%zu",
                                           ranges > 1 ? ", " : "", lo)
                                : snprintf(list + at, sizeof list - at, "%s%zu-%zu",
                                           ranges > 1 ? ", " : "", lo, i - 1);
            at += w > 0 ? (size_t)w : 0;
        }
    }
    if (len == 0)
        return count;
    buf[0] = '\0';
    if (count == 0)
        return 0;
    if (ranges > 4)
        idem__redis_say(buf, len, "slots %s and %zu more ranges (%zu slots in all) are served by no master",
            list, ranges - 4, count);
    else
        idem__redis_say(buf, len, "%s %s %s served by no master", count == 1 ? "slot" : "slots", list,
            count == 1 ? "is" : "are");
    return count;
}

static unsigned long map_epoch(struct cluster_store *s)
{
    pthread_rwlock_rdlock(&s->map_lock);
    unsigned long e = s->epoch;
    pthread_rwlock_unlock(&s->map_lock);
    return e;
}

/* Read the map again unless another caller already did since seen (the
 * epoch the caller's failed attempt used).  0, or -1 with the reason set. */
static int refresh(struct cluster_store *s, unsigned long seen)
{
    pthread_mutex_lock(&s->refresh_lock);
    if (map_epoch(s) != seen) {
        pthread_mutex_unlock(&s->refresh_lock);
        return 0;
    }
    uint8_t *map = idem_malloc(SLOTS);
    char last[256] = "no node answered";
    int ok = -1;
    if (map != NULL) {
        /* The masters of the current map first, then every node ever
         * known (replicas that were promoted appear there), then the seeds. */
        int n = atomic_load_explicit(&s->nnodes, memory_order_acquire);
        for (int i = 0; i < n && ok != 0; i++)
            ok = read_slots(s, &s->nodes[i]->ep, map, last, sizeof last);
        for (int i = 0; i < s->cfg.nep && ok != 0; i++)
            ok = read_slots(s, &s->cfg.ep[i], map, last, sizeof last);
    } else {
        idem__redis_say(last, sizeof last, "out of memory");
    }
    if (ok == 0) {
        pthread_rwlock_wrlock(&s->map_lock);
        memcpy(s->slot_node, map, SLOTS);
        s->epoch++;
        pthread_rwlock_unlock(&s->map_lock);
    } else {
        idem__store_seterr(&s->base, "redis %s: cannot read the slot map (%s)", s->where, last);
    }
    idem_free(map);
    pthread_mutex_unlock(&s->refresh_lock);
    return ok;
}

static void pause_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- exec --------------------------------------------------------------------- */

enum { P_DONE = 0, P_SEND = 1 };

/* Per-op state of one exec. */
struct opst {
    uint16_t slot;
    uint8_t state;  /* P_DONE or P_SEND */
    uint8_t target; /* the node it goes to this round */
    uint8_t ask;    /* ASKING first (target from an ASK) */
    uint8_t asked;  /* target was set by ASK, kept for the next round */
    uint8_t ran;    /* its script ran (this round): wait=N covers it */
    uint8_t alone;  /* sent by its op script, not in its node's batch (redirected) */
    uint8_t inbatch; /* in its node's batch script call this round */
};

/* wait=N: after node t answered the ops sent to it this round, WAIT N
 * replicas (blocking on the server for 3/4 of the timeout, so its answer
 * comes before the socket's own deadline).  Too few: the ops that ran there
 * fail closed with IDEM_E_STORE_DOWN, as redis.c's batch does (a failover
 * could lose what they wrote).  Returns nonzero when the connection failed. */
static int wait_replicas(struct cluster_store *s, int t, struct cconn *k, idem_op_t *ops,
                         const struct opst *st, size_t n)
{
    int ran = 0;
    for (size_t i = 0; i < n; i++)
        if (st[i].state == P_DONE && st[i].target == t && st[i].ran)
            ran = 1;
    if (!ran)
        return 0;
    char nb[16], tb[16];
    int tw = s->cfg.timeout_ms * 3 / 4 > 0 ? s->cfg.timeout_ms * 3 / 4 : 1;
    const char *argv[] = {"WAIT", nb, tb};
    size_t len[] = {4, (size_t)snprintf(nb, sizeof nb, "%d", s->cfg.wait),
                    (size_t)snprintf(tb, sizeof tb, "%d", tw)};
    redisReply *r = NULL;
    int broken = idem__rconn_append(k->c, 3, argv, len) != 0 ||
                 idem__rconn_get_reply(k->c, &r) != 0;
    int ok = !broken && r->type == REDIS_REPLY_INTEGER && r->integer >= s->cfg.wait;
    if (!ok)
        idem__store_seterr(&s->base, "redis %s:%d: WAIT %d: %s", s->nodes[t]->ep.host,
                           s->nodes[t]->ep.port, s->cfg.wait,
                           broken                          ? "no answer"
                           : r->type == REDIS_REPLY_ERROR ? r->str
                                                          : "too few replicas acknowledged");
    freeReplyObject(r);
    if (ok)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i].state == P_DONE && st[i].target == t && st[i].ran) {
            if (ops[i].err == IDEM_OK && ops[i].kind == IDEM_OP_CLAIM &&
                ops[i].decision.kind == IDEM_DECIDE_REPLAY)
                idem_record_cleanup(&ops[i].record);
            ops[i].err = IDEM_E_STORE_DOWN;
        }
    }
    return broken;
}

/* What a reply's error says about where the op goes next. */
static int error_kind(const char *msg)
{
    if (strncmp(msg, "MOVED ", 6) == 0)
        return 1;
    if (strncmp(msg, "ASK ", 4) == 0)
        return 2;
    if (strncmp(msg, "TRYAGAIN", 8) == 0 || strncmp(msg, "CLUSTERDOWN", 11) == 0)
        return 3;
    if (strncmp(msg, "NOSCRIPT", 8) == 0)
        return 4;
    /* An op of a batch script on a key this node does not serve (the map
     * is stale, or its slot is migrating and the key is not here), or the
     * cluster down, raised at the op's first read: nothing written.  Only
     * the op script, its key declared, gets the MOVED or ASK. */
    if (strstr(msg, "Script attempted to ") != NULL) /* after "ERR ", once or twice */
        return 5;
    return 0;
}

/* What one exec has done so far, across its rounds. */
struct exstate {
    size_t todo, ran, failed;
    int unknown; /* an op was sent and its answer lost */
    idem_err_t first;
    char why[256];
    /* this round */
    int need_refresh, need_pause;
};

/* Op failed with err, done for this exec: it counts among the failures,
 * and the first failure's code is the exec's. */
static void take_failed(idem_op_t *op, struct opst *st, struct exstate *x, idem_err_t err)
{
    op->err = err;
    st->state = P_DONE;
    x->todo--;
    if (x->failed++ == 0)
        x->first = err;
}

/* An answer that is lost (the connection failed after op i was sent):
 * it may have run.  Never sent again. */
static void take_lost(struct cluster_store *s, int t, const struct cconn *k, idem_op_t *op,
                      struct opst *st, struct exstate *x)
{
    char w[200];
    idem__redis_errtext_io(w, sizeof w, s->nodes[t]->ep.host, k->c, s->cfg.timeout_ms);
    idem__store_seterr(&s->base, "redis %s:%d; the op's outcome is unknown (%s)",
                       s->nodes[t]->ep.host, s->nodes[t]->ep.port, w);
    op->err = IDEM_E_STORE_DOWN;
    st->state = P_DONE;
    x->todo--;
    x->unknown = 1;
    x->need_refresh = 1;
}

/* Op i's answer r from node t (its op script's, or its element of the
 * batch script's): done, or where it goes next.  *noscript and *drop are
 * the connection's (load the scripts again; drop it). */
static void take_answer(struct cluster_store *s, int t, idem_op_t *op, struct opst *st,
                        const redisReply *r, struct exstate *x, int *noscript, int *drop)
{
    st->state = P_DONE;
    st->ask = 0;
    st->asked = 0;
    if (r->type != REDIS_REPLY_ERROR) {
        idem__redis_take_result(&s->base, op, r);
        st->ran = 1;
        x->todo--;
        x->ran++;
        return;
    }
    int kind = error_kind(r->str);
    idem__redis_say(x->why, sizeof x->why, "%s:%d: %.150s", s->nodes[t]->ep.host, s->nodes[t]->ep.port,
        r->str);
    if (kind == 0) {
        int br = 0;
        idem_err_t err = idem__redis_map_error(r->str, &br);
        *drop |= br;
        idem__store_seterr(&s->base, "redis %s", x->why);
        take_failed(op, st, x, err);
        return;
    }
    st->state = P_SEND; /* did not run: again */
    if (kind == 1) {
        if (moved(s, st->slot, r->str) != 0)
            x->need_refresh = 1;
    } else if (kind == 2) {
        int to = redirect_node(s, r->str);
        if (to >= 0) {
            st->target = (uint8_t)to;
            st->ask = st->asked = 1;
        } else {
            x->need_refresh = 1;
        }
    } else if (kind == 3) {
        x->need_pause = 1;
        /* "CLUSTERDOWN Hash slot not served": the node's map may be newer
         * than ours. */
        if (r->str[0] == 'C')
            x->need_refresh = 1;
    } else if (kind == 4) {
        *noscript = 1;
    } else {
        st->alone = 1; /* its op script will be told where the key is */
        if (strstr(r->str, "down") != NULL)
            x->need_pause = 1;
    }
}

/* Why a master of this round got no pipeline (exec's dead[]). */
enum { DEAD_NO = 0, DEAD_BUSY, DEAD_UNREACHABLE };

/* The ops bound for a master that could not be reached this round (nothing
 * was sent to it: they wrote nothing) whose slot the map, read again, still
 * gives to that master, fail now with IDEM_E_STORE_DOWN instead of being
 * tried again until the timeout.  Until the cluster promotes a replica
 * (cluster-node-timeout and an election: seconds), the map names the dead
 * master and every try would fail the same way; meanwhile the writer
 * batch that holds these ops would hold the ops of every other master
 * too, renewals among them, so one master's failure could let leases on
 * the healthy masters run out (the chaos run's double execution of a key
 * whose master was never killed, docs/stores.md).  Once the map names
 * another master for the slot, the ops go there as before. */
static void fail_unreachable(struct cluster_store *s, idem_op_t *ops, struct opst *st, size_t n,
                             const uint8_t *dead, int hi, struct exstate *x)
{
    int failed = 0;
    pthread_rwlock_rdlock(&s->map_lock);
    for (size_t i = 0; i < n; i++) {
        if (st[i].state != P_SEND || st[i].target == NO_NODE || st[i].target >= hi ||
            dead[st[i].target] != DEAD_UNREACHABLE || s->slot_node[st[i].slot] != st[i].target)
            continue;
        take_failed(&ops[i], &st[i], x, IDEM_E_STORE_DOWN);
        failed = 1;
    }
    pthread_rwlock_unlock(&s->map_lock);
    if (failed)
        idem__store_seterr(&s->base, "redis %s: %s", s->where, x->why);
}

/* Ops of a batch whose state lives on exec's stack; a larger batch's is
 * allocated (the writer's batches are some tens of ops). */
#define EXEC_STACK_OPS 256

static idem_err_t cluster_exec(idem_store_t *base, idem_op_t *ops, size_t n)
{
    struct cluster_store *s = (struct cluster_store *)base;
    struct exstate x = {0};
    struct opst st_stack[EXEC_STACK_OPS];
    uint8_t pick_stack[(EXEC_STACK_OPS + 7) / 8];
    struct opst *st = st_stack;
    uint8_t *pick = pick_stack;
    if (n > EXEC_STACK_OPS) {
        st = idem_malloc(n * sizeof *st);
        pick = idem_malloc((n + 7) / 8);
        if (st == NULL || pick == NULL) {
            idem_free(st);
            idem_free(pick);
            return IDEM_E_NOMEM;
        }
    }
    memset(st, 0, n * sizeof *st);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].err != IDEM_OK)
            continue;
        if (!idem__redis_op_in_range(&ops[i])) {
            idem__store_seterr(base, "redis: times and fences must lie within +-2^53");
            ops[i].err = IDEM_E_INVAL;
            continue;
        }
        char key[IDEM__REDIS_KEYBUF];
        size_t kl = idem__redis_make_key(&s->cfg, &ops[i].id, key);
        st[i].slot = (uint16_t)idem__redis_keyslot(key, kl);
        st[i].state = P_SEND;
        x.todo++;
    }
    x.first = IDEM_OK;
    int64_t deadline = idem__pool_mono_ms() + s->cfg.timeout_ms;
    int pause = PAUSE_MIN_MS;

    for (int round = 0; x.todo > 0; round++) {
        /* Indexed by node, read only where want[] is set this round (the
         * nodes below hi): no table-wide clearing per round. */
        struct cconn *conn[NODES_MAX];
        uint8_t used[NODES_MAX], dead[NODES_MAX], want[NODES_MAX];
        size_t nbatch[NODES_MAX];
        int nused = 0, hi = 0;
        x.need_refresh = x.need_pause = 0;

        /* Where each op goes. */
        pthread_rwlock_rdlock(&s->map_lock);
        unsigned long epoch = s->epoch;
        for (size_t i = 0; i < n; i++) {
            st[i].ran = 0;
            st[i].inbatch = 0;
            if (st[i].state != P_SEND)
                continue;
            if (!st[i].asked)
                st[i].target = s->slot_node[st[i].slot];
        }
        pthread_rwlock_unlock(&s->map_lock);

        /* A connection per master, borrowed in the order of the nodes'
         * indices: two callers that need the same masters never hold one
         * each while waiting for the other's (the pools are bounded). */
        for (size_t i = 0; i < n; i++) {
            if (st[i].state != P_SEND)
                continue;
            if (st[i].target == NO_NODE) {
                idem__redis_say(x.why, sizeof x.why, "slot %u has no master", (unsigned)st[i].slot);
                x.need_refresh = 1;
                continue;
            }
            int t = st[i].target;
            for (; hi <= t; hi++)
                want[hi] = 0;
            want[t] = 1;
        }
        for (int t = 0; t < hi; t++) {
            dead[t] = 0;
            if (!want[t])
                continue;
            struct idem__pool_conn *pc;
            idem__pool_fail_t f;
            if (idem__pool_borrow(&s->nodes[t]->pool, &pc, NULL, &f) != IDEM_OK) {
                idem__redis_say(x.why, sizeof x.why, "%s:%d: %s", s->nodes[t]->ep.host,
                    s->nodes[t]->ep.port, f.why[0] ? f.why : "unreachable");
                if (f.kind != IDEM__POOL_BUSY)
                    x.need_refresh = 1;
                dead[t] = f.kind == IDEM__POOL_BUSY ? DEAD_BUSY : DEAD_UNREACHABLE;
                continue;
            }
            conn[t] = (struct cconn *)pc;
            used[nused++] = (uint8_t)t;
        }
        for (size_t i = 0; i < n; i++) {
            if (st[i].state == P_SEND && st[i].target != NO_NODE && dead[st[i].target])
                st[i].asked = st[i].ask = 0; /* not sent: where the map says, next round */
        }
        /* Each master's pipeline: ONE call of the batch script for its ops
         * (their keys framed in ARGV: Redis refuses declared keys of
         * several slots), then each redirected op alone by its op script
         * (ASKING first after an ASK), in the batch's order. */
        for (int u = 0; u < nused; u++) {
            int t = used[u];
            memset(pick, 0, (n + 7) / 8);
            for (size_t i = 0; i < n; i++)
                if (st[i].state == P_SEND && st[i].target == t && !st[i].ask && !st[i].alone)
                    pick[i / 8] |= (uint8_t)(1u << (i % 8));
            idem_err_t err = idem__redis_append_batch(&s->cfg, conn[t]->c, conn[t]->sha, ops, n,
                                                      pick, 1, &nbatch[t]);
            for (size_t i = 0; i < n; i++) {
                if (!(pick[i / 8] & (1u << (i % 8))))
                    continue;
                if (err != IDEM_OK) {
                    /* Only NOMEM: these ops alone, nothing was sent. */
                    take_failed(&ops[i], &st[i], &x, err);
                    continue;
                }
                st[i].state = P_SEND + 1; /* sent this round */
                st[i].inbatch = 1;
            }
            for (size_t i = 0; i < n; i++) {
                if (st[i].state != P_SEND || st[i].target != t)
                    continue;
                if (st[i].ask)
                    idem__rconn_append(conn[t]->c, 1, (const char *[]){"ASKING"},
                                       (const size_t[]){6});
                err = idem__redis_append_op(&s->cfg, conn[t]->c, conn[t]->sha, &ops[i]);
                if (err != IDEM_OK) {
                    /* Only NOMEM: this op alone. */
                    take_failed(&ops[i], &st[i], &x, err);
                    continue;
                }
                st[i].state = P_SEND + 1;
            }
        }
        /* Every pipeline out before any reply is read. */
        for (int u = 0; u < nused; u++)
            idem__rconn_flush(conn[used[u]]->c);

        for (int u = 0; u < nused; u++) {
            int t = used[u];
            struct cconn *k = conn[t];
            int broken = 0, noscript = 0, drop = 0; /* drop: READONLY and kin */
            redisReply *batch = NULL;
            size_t bj = 0;
            /* whole: the batch call's one answer stands for each of its ops */
            int whole = 0, batch_unknown = 0;
            if (nbatch[t] > 0) {
                if (idem__rconn_get_reply(k->c, &batch) != 0) {
                    broken = 1;
                } else if (batch->type == REDIS_REPLY_ERROR) {
                    whole = 1;
                    /* failed while running: some of its ops may have written */
                    batch_unknown = !idem__redis_refused(batch->str);
                    if (batch_unknown)
                        idem__store_seterr(base, "redis %s:%d: the batch script failed, its "
                                           "ops' outcome is unknown: %.150s",
                                           s->nodes[t]->ep.host, s->nodes[t]->ep.port,
                                           batch->str);
                } else if (batch->type != REDIS_REPLY_ARRAY || batch->elements != nbatch[t]) {
                    batch_unknown = 1; /* the conversation is lost */
                    broken = 1;
                }
            }
            for (size_t i = 0; i < n; i++) {
                if (st[i].state != P_SEND + 1 || st[i].target != t)
                    continue;
                if (st[i].inbatch) {
                    if (broken || batch_unknown) {
                        if (batch_unknown && !broken) {
                            ops[i].err = IDEM_E_STORE_DOWN;
                            st[i].state = P_DONE;
                            x.todo--;
                            x.unknown = 1;
                        } else {
                            take_lost(s, t, k, &ops[i], &st[i], &x);
                        }
                        continue;
                    }
                    take_answer(s, t, &ops[i], &st[i], whole ? batch : batch->element[bj++], &x,
                                &noscript, &drop);
                    continue;
                }
                redisReply *r = NULL;
                if (!broken && st[i].ask) {
                    if (idem__rconn_get_reply(k->c, &r) != 0)
                        broken = 1;
                    freeReplyObject(r);
                    r = NULL;
                }
                if (!broken && idem__rconn_get_reply(k->c, &r) != 0)
                    broken = 1;
                if (broken) {
                    take_lost(s, t, k, &ops[i], &st[i], &x);
                    continue;
                }
                take_answer(s, t, &ops[i], &st[i], r, &x, &noscript, &drop);
                freeReplyObject(r);
            }
            freeReplyObject(batch);
            if (s->cfg.wait > 0 && !broken)
                broken = wait_replicas(s, t, k, ops, st, n);
            if (noscript && !broken) {
                char e[256];
                if (idem__redis_load_scripts(k->c, k->sha, e, sizeof e, s->cfg.timeout_ms) != 0)
                    broken = 1;
            }
            idem__pool_give_back(&s->nodes[t]->pool, &k->pc, broken || drop);
            if (drop)
                x.need_refresh = 1;
        }
        if (x.todo == 0)
            break;
        if (round + 1 >= ROUNDS_MAX || idem__pool_mono_ms() >= deadline)
            break;
        if (x.need_refresh && refresh(s, epoch) != 0)
            x.need_pause = 1;
        fail_unreachable(s, ops, st, n, dead, hi, &x);
        if (x.todo == 0)
            break;
        if (x.need_pause || round >= 1) {
            int64_t left = deadline - idem__pool_mono_ms();
            pause_ms((int)(pause < left ? pause : left > 0 ? left : 0));
            pause = pause * 2 > PAUSE_MAX_MS ? PAUSE_MAX_MS : pause * 2;
        }
    }
    if (x.todo > 0) {
        idem__store_seterr(base, "redis %s: %s", s->where,
                           x.why[0] ? x.why : "no master answered");
        for (size_t i = 0; i < n; i++) {
            if (st[i].state != P_DONE) {
                ops[i].err = IDEM_E_STORE_DOWN;
                if (x.failed++ == 0)
                    x.first = IDEM_E_STORE_DOWN;
            }
        }
    }
    if (st != st_stack) {
        idem_free(pick);
        idem_free(st);
    }
    if (x.unknown)
        return IDEM_E_STORE_DOWN; /* an outcome is unknown: the batch's is (store_impl.h) */
    if (x.ran == 0 && x.failed > 0)
        return x.first; /* nothing ran: the batch failed as a whole */
    return IDEM_OK;
}

/* ---- one command on one slot -------------------------------------------------- */

/* Send argv to the master of slot, following MOVED and ASK and retrying what
 * did not run, within the timeout: the reply (not an error of those), or
 * NULL with the reason set.  Only for commands that are safe to repeat. */
static redisReply *slot_command(struct cluster_store *s, unsigned slot, int use_sha, int argc,
                                const char **argv, const size_t *len)
{
    int64_t deadline = idem__pool_mono_ms() + s->cfg.timeout_ms;
    int pause = PAUSE_MIN_MS, ask = -1;
    char why[256] = "no master answered";

    for (int round = 0; round < ROUNDS_MAX; round++) {
        pthread_rwlock_rdlock(&s->map_lock);
        unsigned long epoch = s->epoch;
        int t = ask >= 0 ? ask : s->slot_node[slot];
        pthread_rwlock_unlock(&s->map_lock);
        int again = 1, need_refresh = 0;
        if (t == NO_NODE) {
            idem__redis_say(why, sizeof why, "slot %u has no master", slot);
            need_refresh = 1;
        } else {
            struct idem__pool_conn *pc;
            idem__pool_fail_t f;
            if (idem__pool_borrow(&s->nodes[t]->pool, &pc, NULL, &f) != IDEM_OK) {
                idem__redis_say(why, sizeof why, "%s:%d: %s", s->nodes[t]->ep.host, s->nodes[t]->ep.port,
                    f.why[0] ? f.why : "unreachable");
                need_refresh = 1;
                ask = -1;
            } else {
                struct cconn *k = (struct cconn *)pc;
                redisReply *r = NULL;
                if (ask >= 0)
                    idem__rconn_append(k->c, 1, (const char *[]){"ASKING"}, (const size_t[]){6});
                if (use_sha) /* argv[1] is the script's index as a SHA slot */
                    argv[1] = k->sha[S_SWEEP];
                idem__rconn_append(k->c, argc, argv, len);
                int broken = 0;
                if (ask >= 0) {
                    if (idem__rconn_get_reply(k->c, &r) != 0)
                        broken = 1;
                    freeReplyObject(r);
                    r = NULL;
                }
                if (!broken && idem__rconn_get_reply(k->c, &r) != 0)
                    broken = 1;
                ask = -1;
                if (broken) {
                    char w[200];
                    idem__redis_errtext_io(w, sizeof w, s->nodes[t]->ep.host, k->c,
                                           s->cfg.timeout_ms);
                    idem__redis_say(why, sizeof why, "%s:%d: %s", s->nodes[t]->ep.host, s->nodes[t]->ep.port,
                        w);
                    need_refresh = 1;
                } else if (r->type == REDIS_REPLY_ERROR && error_kind(r->str) != 0) {
                    int kind = error_kind(r->str);
                    idem__redis_say(why, sizeof why, "%s:%d: %.150s", s->nodes[t]->ep.host,
                        s->nodes[t]->ep.port, r->str);
                    if (kind == 1)
                        need_refresh = moved(s, slot, r->str) != 0;
                    else if (kind == 3)
                        need_refresh = r->str[0] == 'C'; /* CLUSTERDOWN, as in exec */
                    else if (kind == 2)
                        ask = redirect_node(s, r->str);
                    else if (kind == 4) {
                        char e[256];
                        if (idem__redis_load_scripts(k->c, k->sha, e, sizeof e,
                                                     s->cfg.timeout_ms) != 0)
                            broken = 1;
                    }
                    freeReplyObject(r);
                    r = NULL;
                } else {
                    again = 0;
                }
                idem__pool_give_back(&s->nodes[t]->pool, pc, broken != 0);
                if (!again)
                    return r;
            }
        }
        if (idem__pool_mono_ms() >= deadline)
            break;
        if (need_refresh)
            refresh(s, epoch);
        if (round == 0)
            continue;
        int64_t left = deadline - idem__pool_mono_ms();
        pause_ms((int)(pause < left ? pause : left > 0 ? left : 0));
        pause = pause * 2 > PAUSE_MAX_MS ? PAUSE_MAX_MS : pause * 2;
    }
    idem__store_seterr(&s->base, "redis %s: %s", s->where, why);
    return NULL;
}

static idem_err_t cluster_get(idem_store_t *base, const idem_key_id_t *id, int64_t now_ms,
                              idem_record_t *rec)
{
    struct cluster_store *s = (struct cluster_store *)base;
    char key[IDEM__REDIS_KEYBUF];
    size_t kl = idem__redis_make_key(&s->cfg, id, key);
    const char *argv[] = {"EVAL", idem__redis_read_script, "1", key};
    size_t len[] = {4, idem__redis_read_script_len, 1, kl};

    redisReply *r = slot_command(s, idem__redis_keyslot(key, kl), 0, 4, argv, len);
    if (r == NULL)
        return IDEM_E_STORE_DOWN;
    int broken = 0; /* a cluster's node connections are the slot map's to drop */
    idem_err_t err = idem__redis_get_answer(base, s->where, r, now_ms, rec, &broken);
    freeReplyObject(r);
    return err;
}

/* ---- every master: sweep, ping ------------------------------------------- */

/* The distinct masters of the map, in slot order; their count. */
static int masters(struct cluster_store *s, uint8_t *out, int *uncovered)
{
    uint8_t seen[NODES_MAX] = {0};
    int m = 0;
    *uncovered = 0;
    pthread_rwlock_rdlock(&s->map_lock);
    for (int i = 0; i < SLOTS; i++) {
        uint8_t t = s->slot_node[i];
        if (t == NO_NODE) {
            *uncovered = 1;
            continue;
        }
        if (!seen[t]) {
            seen[t] = 1;
            out[m++] = t;
        }
    }
    pthread_rwlock_unlock(&s->map_lock);
    return m;
}

/* One command on node t; NULL with the reason set (the connection dropped). */
static redisReply *node_command(struct cluster_store *s, int t, int argc, const char **argv,
                                const size_t *len, struct cconn **keep)
{
    struct idem__pool_conn *pc;
    idem__pool_fail_t f;
    if (idem__pool_borrow(&s->nodes[t]->pool, &pc, NULL, &f) != IDEM_OK) {
        idem__store_seterr(&s->base, "redis %s:%d: %s", s->nodes[t]->ep.host,
                           s->nodes[t]->ep.port, f.why[0] ? f.why : "unreachable");
        return NULL;
    }
    struct cconn *k = (struct cconn *)pc;
    redisReply *r = NULL;
    if (idem__rconn_append(k->c, argc, argv, len) != 0 || idem__rconn_get_reply(k->c, &r) != 0) {
        char w[200];
        idem__redis_errtext_io(w, sizeof w, s->nodes[t]->ep.host, k->c, s->cfg.timeout_ms);
        idem__store_seterr(&s->base, "redis %s:%d: %s", s->nodes[t]->ep.host,
                           s->nodes[t]->ep.port, w);
        idem__pool_give_back(&s->nodes[t]->pool, pc, true);
        return NULL;
    }
    if (keep != NULL)
        *keep = k;
    else
        idem__pool_give_back(&s->nodes[t]->pool, pc, false);
    return r;
}

static idem_err_t cluster_ping(idem_store_t *base)
{
    struct cluster_store *s = (struct cluster_store *)base;
    uint8_t m[NODES_MAX];
    int uncovered, nm = masters(s, m, &uncovered);
    if (uncovered) {
        refresh(s, map_epoch(s));
        nm = masters(s, m, &uncovered);
        if (uncovered) {
            idem__store_seterr(base, "redis %s: some slots have no master", s->where);
            return IDEM_E_STORE_DOWN;
        }
    }
    for (int i = 0; i < nm; i++) {
        unsigned long epoch = map_epoch(s);
        redisReply *r = node_command(s, m[i], 1, (const char *[]){"PING"}, (const size_t[]){4},
                                     NULL);
        if (r == NULL) {
            refresh(s, epoch);
            return IDEM_E_STORE_DOWN;
        }
        int ok = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
        if (!ok)
            idem__store_seterr(base, "redis %s:%d: PING: %.150s", s->nodes[m[i]]->ep.host,
                               s->nodes[m[i]]->ep.port,
                               r->type == REDIS_REPLY_ERROR ? r->str : "unexpected answer");
        freeReplyObject(r);
        if (!ok)
            return IDEM_E_STORE_DOWN;
    }
    return IDEM_OK;
}

/* Redis's clock on node t (TIME), or -1. */
static int64_t node_time(struct cluster_store *s, int t)
{
    redisReply *r = node_command(s, t, 1, (const char *[]){"TIME"}, (const size_t[]){4}, NULL);
    int64_t ms = -1;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING) {
        long long sec = strtoll(r->element[0]->str, NULL, 10);
        long long usec = strtoll(r->element[1]->str, NULL, 10);
        if (sec > 0 && usec >= 0 && usec < 1000000)
            ms = (int64_t)sec * 1000 + usec / 1000;
    }
    freeReplyObject(r);
    return ms;
}

static idem_err_t cluster_sweep(idem_store_t *base, int64_t now_ms, size_t max, size_t *removed)
{
    struct cluster_store *s = (struct cluster_store *)base;
    uint8_t m[NODES_MAX];
    int uncovered, nm = masters(s, m, &uncovered);

    *removed = 0;
    if (!idem__redis_in_range(now_ms)) {
        idem__store_seterr(base, "redis: times must lie within +-2^53");
        return IDEM_E_INVAL;
    }
    if (nm == 0)
        return IDEM_E_STORE_DOWN;
    int64_t server = node_time(s, m[0]);
    if (server < 0)
        return IDEM_E_STORE_DOWN;
    if (now_ms <= server + SWEEP_NATIVE_SLACK_MS)
        return IDEM_OK; /* Redis expires records itself (redis.c) */

    char nowbuf[24];
    size_t nowlen = (size_t)snprintf(nowbuf, sizeof nowbuf, "%lld", (long long)now_ms);
    size_t visited = 0, total = 0;
    idem_err_t err = IDEM_OK;
    pthread_mutex_lock(&s->sweep_lock);
    for (int steps = 0; visited < max;) {
        const redisReply *pending = s->sweep_keys ? s->sweep_keys->element[1] : NULL;
        if (pending != NULL && s->sweep_next < pending->elements) {
            const redisReply *key = pending->element[s->sweep_next++];
            if (key->type != REDIS_REPLY_STRING)
                continue;
            /* One key per call: one slot.  A key that moved meanwhile is
             * followed; one that fails is left for Redis's own expiry. */
            const char *sargv[] = {"EVALSHA", NULL, "1", key->str, nowbuf};
            size_t slen[] = {7, 40, 1, key->len, nowlen};
            redisReply *g = slot_command(s, idem__redis_keyslot(key->str, key->len), 1, 5,
                                         sargv, slen);
            if (g != NULL && g->type == REDIS_REPLY_INTEGER && g->integer > 0)
                total += (size_t)g->integer;
            freeReplyObject(g);
            visited++;
            continue;
        }
        freeReplyObject(s->sweep_keys);
        s->sweep_keys = NULL;
        if (s->sweep_master >= nm) {
            s->sweep_master = 0; /* a whole pass over every master is done */
            break;
        }
        if (steps++ == SWEEP_STEPS_MAX)
            break;
        struct node *nd = s->nodes[m[s->sweep_master]];
        char cur[24];
        const char *argv[] = {"SCAN", cur, "MATCH", s->match, "COUNT", SWEEP_SCAN_COUNT};
        size_t len[] = {4, (size_t)snprintf(cur, sizeof cur, "%llu", nd->sweep_cursor), 5,
                        strlen(s->match), 5, sizeof SWEEP_SCAN_COUNT - 1};
        redisReply *r = node_command(s, m[s->sweep_master], 6, argv, len, NULL);
        if (r == NULL) {
            err = IDEM_E_STORE_DOWN;
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            idem__store_seterr(base, "redis %s:%d: SCAN: unexpected answer", nd->ep.host,
                               nd->ep.port);
            freeReplyObject(r);
            err = IDEM_E_IO;
            break;
        }
        nd->sweep_cursor = strtoull(r->element[0]->str, NULL, 10);
        if (nd->sweep_cursor == 0)
            s->sweep_master++; /* this master's pass ends with these keys */
        s->sweep_keys = r;
        s->sweep_next = 0;
    }
    pthread_mutex_unlock(&s->sweep_lock);
    *removed = total;
    return err;
}

/* ---- open, close ---------------------------------------------------------- */

static void cluster_close(idem_store_t *base)
{
    struct cluster_store *s = (struct cluster_store *)base;
    int n = atomic_load(&s->nnodes);
    for (int i = 0; i < n; i++) {
        idem__pool_cleanup(&s->nodes[i]->pool);
        idem_free(s->nodes[i]);
    }
    pthread_mutex_destroy(&s->nodes_lock);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->refresh_lock);
    pthread_mutex_destroy(&s->sweep_lock);
    freeReplyObject(s->sweep_keys);
    idem__tls_ctx_unref(s->tls);
    idem_free(s);
}

static idem_err_t open_cluster(const char *rest, int tls, idem_store_t **out, char *errbuf,
                               size_t errlen)
{
    struct rcfg cfg;
    idem_tls_ctx_t *ctx;
    idem_err_t perr =
        idem__redis_prepare(rest, IDEM__REDIS_CLUSTER, tls, &cfg, &ctx, errbuf, errlen);
    if (perr != IDEM_OK)
        return perr;
    if (out == NULL) {
        idem__tls_ctx_unref(ctx);
        return IDEM_OK;
    }
    struct cluster_store *s = idem_calloc(1, sizeof *s);
    if (s == NULL) {
        idem__tls_ctx_unref(ctx);
        return IDEM_E_NOMEM;
    }
    s->tls = ctx;
    s->base.ops = tls ? &idem__store_rediss_cluster_ops : &idem__store_redis_cluster_ops;
    s->cfg = cfg;
    idem__redis_say(s->where, sizeof s->where, strchr(cfg.ep[0].host, ':') ? "cluster [%s]:%d" : "cluster %s:%d",
        cfg.ep[0].host, cfg.ep[0].port);
    size_t m = 0;
    for (size_t i = 0; i < cfg.prefix_len; i++) {
        if (strchr("*?[]\\", cfg.prefix[i]) != NULL)
            s->match[m++] = '\\';
        s->match[m++] = cfg.prefix[i];
    }
    s->match[m++] = '*';
    s->match[m] = '\0';
    memset(s->slot_node, NO_NODE, SLOTS);
    pthread_mutex_init(&s->nodes_lock, NULL);
    pthread_rwlock_init(&s->map_lock, NULL);
    pthread_mutex_init(&s->refresh_lock, NULL);
    pthread_mutex_init(&s->sweep_lock, NULL);

    /* The map now, and one connection to a master (AUTH, the scripts), so
     * a wrong address or password fails the open. */
    if (refresh(s, 0) != 0) {
        idem__store_errbuf(errbuf, errlen, "%s", idem_store_errstr(&s->base));
        cluster_close(&s->base);
        return IDEM_E_STORE_DOWN;
    }
    /* A slot no master serves would refuse its keys (CLUSTERDOWN, or no
     * node to send them to): idemd must not start on such a cluster. */
    char gaps[256];
    if (idem__redis_uncovered(s->slot_node, NO_NODE, gaps, sizeof gaps) > 0) {
        idem__store_errbuf(errbuf, errlen, "redis %s: %s", s->where, gaps);
        cluster_close(&s->base);
        return IDEM_E_STORE_DOWN;
    }
    uint8_t ms[NODES_MAX];
    int uncovered;
    if (masters(s, ms, &uncovered) > 0) {
        struct idem__pool_conn *pc;
        idem__pool_fail_t f;
        idem_err_t err = idem__pool_borrow(&s->nodes[ms[0]]->pool, &pc, NULL, &f);
        if (err != IDEM_OK) {
            idem__store_errbuf(errbuf, errlen, "redis %s: %s", s->where,
                               f.why[0] ? f.why : idem_strerror(err));
            cluster_close(&s->base);
            return err;
        }
        idem__pool_give_back(&s->nodes[ms[0]]->pool, pc, false);
    }
    *out = &s->base;
    return IDEM_OK;
}

static idem_err_t redis_cluster_open(const char *rest, idem_store_t **out, char *errbuf,
                                     size_t errlen)
{
    return open_cluster(rest, 0, out, errbuf, errlen);
}

static idem_err_t rediss_cluster_open(const char *rest, idem_store_t **out, char *errbuf,
                                      size_t errlen)
{
    return open_cluster(rest, 1, out, errbuf, errlen);
}

/* ---- invalidations (redis_sub.c) ------------------------------------------ */

/* PUBLISH msg on the invalidation channel through the first master that
 * takes it: the cluster bus broadcasts it to every node's subscribers. */
static idem_err_t cluster_publish(idem_store_t *base, const char *msg, size_t len)
{
    struct cluster_store *s = (struct cluster_store *)base;
    char chan[IDEM_STORE_OPT_MAX + sizeof "invalidate"];
    size_t cl = idem__redis_channel(&s->cfg, chan);
    uint8_t m[NODES_MAX];
    int uncovered, nm = masters(s, m, &uncovered);
    for (int i = 0; i < nm; i++) {
        redisReply *r = node_command(s, m[i], 3, (const char *[]){"PUBLISH", chan, msg},
                                     (const size_t[]){7, cl, len}, NULL);
        int ok = r != NULL && r->type == REDIS_REPLY_INTEGER;
        freeReplyObject(r);
        if (ok)
            return IDEM_OK;
    }
    return IDEM_E_STORE_DOWN;
}

static void cluster_watch_session(idem_store_t *base, int stop_fd, idem__watch_sink_t *sink)
{
    struct cluster_store *s = (struct cluster_store *)base;
    idem__redis_watch_session(&s->cfg, s->tls, stop_fd, sink);
}

/* ---- what redis_list.c needs (redis_impl.h) -------------------------------- */

static idem_err_t list_borrow(idem_store_t *base, int node, idem__rconn_t **c, void **hold)
{
    struct cluster_store *s = (struct cluster_store *)base;
    struct idem__pool_conn *pc;
    idem__pool_fail_t f;
    if (idem__pool_borrow(&s->nodes[node]->pool, &pc, NULL, &f) != IDEM_OK) {
        idem__store_seterr(base, "redis %s:%d: %s", s->nodes[node]->ep.host,
                           s->nodes[node]->ep.port, f.why[0] ? f.why : "unreachable");
        refresh(s, map_epoch(s));
        return IDEM_E_STORE_DOWN;
    }
    *c = ((struct cconn *)pc)->c;
    *hold = pc;
    return IDEM_OK;
}

static void list_give_back(idem_store_t *base, int node, void *hold, int broken)
{
    struct cluster_store *s = (struct cluster_store *)base;
    idem__pool_give_back(&s->nodes[node]->pool, hold, broken != 0);
}

static redisReply *list_slot_command(idem_store_t *base, unsigned slot, int argc,
                                     const char **argv, const size_t *len)
{
    return slot_command((struct cluster_store *)base, slot, 0, argc, argv, len);
}

idem_err_t idem__redis_cluster_nodes(idem_store_t *base, idem__redis_nodes_t *out)
{
    struct cluster_store *s = (struct cluster_store *)base;
    int uncovered;
    memset(out, 0, sizeof *out);
    out->n = masters(s, out->node, &uncovered);
    if (uncovered) {
        refresh(s, map_epoch(s));
        out->n = masters(s, out->node, &uncovered);
    }
    if (uncovered || out->n == 0) {
        idem__store_seterr(base, "redis %s: some slots have no master", s->where);
        return IDEM_E_STORE_DOWN;
    }
    out->cfg = &s->cfg;
    out->where = s->where;
    out->borrow = list_borrow;
    out->give_back = list_give_back;
    out->slot_command = list_slot_command;
    return IDEM_OK;
}

#define CLUSTER_OPS(scheme_, open_)                                                          \
    {                                                                                        \
        .name = "redis", .scheme = scheme_, .open = open_, .close = cluster_close,          \
        .exec = cluster_exec, .get = cluster_get, .sweep = cluster_sweep,                   \
        .ping = cluster_ping, .publish = cluster_publish,                                   \
        .watch_session = cluster_watch_session,                                              \
        .list = idem__redis_list, .delete_if = idem__redis_delete_if,                       \
    }

const struct idem_store_ops idem__store_redis_cluster_ops =
    CLUSTER_OPS("redis+cluster", redis_cluster_open);
const struct idem_store_ops idem__store_rediss_cluster_ops =
    CLUSTER_OPS("rediss+cluster", rediss_cluster_open);
