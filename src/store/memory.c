/* src/store/memory.c - the in-process store ("memory:"), for tests and benchmarks.
 *
 * A chained hash table from the identity (scope '\0' key) to the record's
 * encoded value, exactly the bytes LMDB would keep, so both backends run
 * the same codec and the same idem__store_apply and cannot drift apart.  The
 * hash is SipHash-2-4 with a per-store random key: keys come from clients,
 * and a fixed hash would let them pile every key into one chain.  The table
 * doubles when it holds more entries than buckets.
 *
 * Nothing survives close, nothing is shared between processes, and there is
 * no size limit beyond memory itself: this is not a production store.
 *
 * The sweeper's position (bucket, entries to skip in its chain) stays in the
 * store between calls, so repeated sweeps visit the whole table in steps of
 * at most `max` records; a resize starts it over from the first bucket.
 *
 * INVARIANTS: every entry's value decodes (it was written by the codec);
 * count is the number of entries; nbuckets is a power of two.
 *
 * THREADING: one mutex guards everything; exec applies a whole batch under
 * it, which is what makes the batch atomic and claims exclusive.  A batch is
 * not rolled back when an allocation fails part-way: that op alone gets
 * IDEM_E_NOMEM and the others still apply.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "idem/alloc.h"
#include "store/store_impl.h"

#define INITIAL_BUCKETS 1024u

struct ent {
    struct ent *next;
    uint64_t hash;
    uint8_t *val; /* the encoded record */
    size_t vlen;  /* bytes used in val */
    size_t vcap;  /* bytes allocated for val */
    size_t klen;
    char key[]; /* scope '\0' key, klen bytes */
};

struct mem_store {
    struct idem_store base; /* first: a mem_store is an idem_store */
    pthread_mutex_t lock;
    struct ent **buckets;
    size_t nbuckets;
    size_t count;
    uint64_t k0, k1;    /* SipHash key */
    size_t sweep_bucket; /* where the next sweep starts */
    size_t sweep_skip;   /* entries of that bucket's chain already visited */
};

/* ---- SipHash-2-4 -------------------------------------------------------- */

static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND(v0, v1, v2, v3)                                                          \
    do {                                                                                  \
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);                          \
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;                                            \
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;                                            \
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);                          \
    } while (0)

static uint64_t siphash(uint64_t k0, uint64_t k1, const uint8_t *p, size_t len)
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
    size_t full = len & ~(size_t)7;

    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = 0;
        for (int j = 7; j >= 0; j--)
            m = (m << 8) | p[i + (size_t)j];
        v3 ^= m;
        SIPROUND(v0, v1, v2, v3);
        SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t j = 0; j < (len & 7); j++)
        b |= (uint64_t)p[full + j] << (8 * j);
    v3 ^= b;
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (int i = 0; i < 4; i++)
        SIPROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- the table ---------------------------------------------------------- */

/* The link that points at the entry for key, or at the NULL ending its chain. */
static struct ent **find(struct mem_store *m, uint64_t h, const char *key, size_t klen)
{
    struct ent **pp = &m->buckets[h & (m->nbuckets - 1)];
    for (; *pp != NULL; pp = &(*pp)->next) {
        struct ent *e = *pp;
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            break;
    }
    return pp;
}

static void grow(struct mem_store *m)
{
    size_t n = m->nbuckets * 2;
    struct ent **b = idem_calloc(n, sizeof *b);
    if (b == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct ent *e = m->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    idem_free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
    m->sweep_bucket = 0;
    m->sweep_skip = 0;
}

static void free_ent(struct ent *e)
{
    idem_free(e->val);
    idem_free(e);
}

/* Store next as the value of *pp's entry, creating it if *pp is NULL. */
static idem_err_t put(struct mem_store *m, struct ent **pp, uint64_t h, const char *key,
                      size_t klen, const idem_record_t *next)
{
    size_t size = idem_record_encoded_size(next);
    struct ent *e = *pp;

    if (size == 0)
        return IDEM_E_TOOBIG; /* store.c checked completions; cannot happen */
    if (e != NULL && e->vcap >= size) {
        idem_record_encode_into(next, e->val);
        e->vlen = size;
        return IDEM_OK;
    }
    uint8_t *val = idem_malloc(size);
    if (val == NULL)
        return IDEM_E_NOMEM;
    idem_record_encode_into(next, val);
    if (e != NULL) {
        idem_free(e->val);
    } else {
        e = idem_malloc(sizeof *e + klen);
        if (e == NULL) {
            idem_free(val);
            return IDEM_E_NOMEM;
        }
        e->next = NULL;
        e->hash = h;
        e->klen = klen;
        memcpy(e->key, key, klen);
        *pp = e;
        m->count++;
    }
    e->val = val;
    e->vlen = e->vcap = size;
    if (m->count > m->nbuckets)
        grow(m);
    return IDEM_OK;
}

/* ---- the ops ------------------------------------------------------------- */

static idem_err_t mem_exec(idem_store_t *s, idem_op_t *ops, size_t n)
{
    struct mem_store *m = (struct mem_store *)s;
    char key[IDEM_STORE_KEY_MAX];
    idem_record_t next;

    pthread_mutex_lock(&m->lock);
    if (idem__store_io_fault()) {
        /* Fault injection: a commit that failed before it wrote anything
         * (this store has no I/O; the point tests store.c's batch failure). */
        pthread_mutex_unlock(&m->lock);
        idem__store_seterr(s, "memory: injected commit failure");
        return IDEM_E_IO;
    }
    for (size_t i = 0; i < n; i++) {
        idem_op_t *op = &ops[i];
        if (op->err != IDEM_OK)
            continue;
        size_t klen = idem__store_key(&op->id, key);
        uint64_t h = siphash(m->k0, m->k1, (const uint8_t *)key, klen);
        struct ent **pp = find(m, h, key, klen), *e = *pp;

        switch (idem__store_apply(op, e ? e->val : NULL, e ? e->vlen : 0, &next)) {
        case IDEM__STORE_KEEP:
            break;
        case IDEM__STORE_PUT:
            op->err = put(m, pp, h, key, klen, &next);
            if (op->err != IDEM_OK)
                memset(&op->decision, 0, sizeof op->decision);
            break;
        case IDEM__STORE_DEL:
            *pp = e->next;
            free_ent(e);
            m->count--;
            break;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return IDEM_OK;
}

static idem_err_t mem_get(idem_store_t *s, const idem_key_id_t *id, int64_t now_ms,
                          idem_record_t *rec)
{
    struct mem_store *m = (struct mem_store *)s;
    char key[IDEM_STORE_KEY_MAX];
    size_t klen = idem__store_key(id, key);
    uint64_t h = siphash(m->k0, m->k1, (const uint8_t *)key, klen);
    idem_err_t err = IDEM_E_NOTFOUND;

    pthread_mutex_lock(&m->lock);
    struct ent *e = *find(m, h, key, klen);
    if (e != NULL) {
        err = idem_record_decode(e->val, e->vlen, rec);
        if (err == IDEM_OK && rec->expires_at_ms <= now_ms) {
            idem_record_cleanup(rec);
            err = IDEM_E_NOTFOUND;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return err;
}

static idem_err_t mem_sweep(idem_store_t *s, int64_t now_ms, size_t max, size_t *removed)
{
    struct mem_store *m = (struct mem_store *)s;
    size_t visited = 0;
    idem_record_t head;

    pthread_mutex_lock(&m->lock);
    while (visited < max) {
        if (m->sweep_bucket >= m->nbuckets) {
            m->sweep_bucket = 0; /* wrapped: the next call starts over */
            m->sweep_skip = 0;
            break;
        }
        struct ent **pp = &m->buckets[m->sweep_bucket];
        for (size_t i = 0; i < m->sweep_skip && *pp != NULL; i++)
            pp = &(*pp)->next;
        while (*pp != NULL && visited < max) {
            struct ent *e = *pp;
            visited++;
            if (idem_record_decode_head(e->val, e->vlen, &head) == IDEM_OK &&
                head.expires_at_ms <= now_ms) {
                *pp = e->next;
                free_ent(e);
                m->count--;
                (*removed)++;
            } else {
                pp = &e->next;
                m->sweep_skip++;
            }
        }
        if (*pp != NULL)
            break; /* stopped inside this chain; resume here */
        m->sweep_bucket++;
        m->sweep_skip = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return IDEM_OK;
}

static int ent_cmp(const void *pa, const void *pb)
{
    const struct ent *a = *(const struct ent *const *)pa, *b = *(const struct ent *const *)pb;
    int c = memcmp(a->key, b->key, a->klen < b->klen ? a->klen : b->klen);
    if (c != 0)
        return c;
    return a->klen < b->klen ? -1 : a->klen > b->klen;
}

/* A hash table has no order: gather the entries in the listing's range
 * under the lock, sort them, and offer them in (scope, key) order.  Each
 * page walks the whole table (this store lives in one process's memory). */
static idem_err_t mem_list(idem_store_t *s, idem__list_t *l)
{
    struct mem_store *m = (struct mem_store *)s;
    char start[IDEM_STORE_KEY_MAX];
    bool exclusive;
    if (l->raw[0] != '\0' && !l->has_after)
        return IDEM_E_INVAL; /* not an ordered cursor */
    size_t slen = idem__store_list_start(l, start, &exclusive);
    idem_err_t err = IDEM_OK;

    pthread_mutex_lock(&m->lock);
    struct ent **v = idem_calloc(m->count + 1, sizeof *v);
    if (v == NULL) {
        pthread_mutex_unlock(&m->lock);
        return IDEM_E_NOMEM;
    }
    size_t n = 0;
    for (size_t b = 0; b < m->nbuckets; b++) {
        for (struct ent *e = m->buckets[b]; e != NULL; e = e->next) {
            int c = memcmp(e->key, start, e->klen < slen ? e->klen : slen);
            if (c == 0)
                c = e->klen < slen ? -1 : e->klen > slen;
            if (c < 0 || (c == 0 && exclusive) || !idem__store_list_in_range(l, e->key, e->klen))
                continue;
            v[n++] = e;
        }
    }
    qsort(v, n, sizeof *v, ent_cmp);
    for (size_t i = 0; i < n; i++) {
        if (idem__store_list_offer(l, v[i]->key, v[i]->klen, v[i]->val, v[i]->vlen)) {
            if (i + 1 < n)
                idem__store_list_resume_after(l, v[i]->key, v[i]->klen);
            break;
        }
    }
    pthread_mutex_unlock(&m->lock);
    idem_free(v);
    return err;
}

static idem_err_t mem_ping(idem_store_t *s)
{
    return IDEM_OK;
}

static void mem_close(idem_store_t *s)
{
    struct mem_store *m = (struct mem_store *)s;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct ent *e = m->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            free_ent(e);
        }
    }
    idem_free(m->buckets);
    pthread_mutex_destroy(&m->lock);
    idem_free(m);
}

static idem_err_t mem_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    size_t path_len;
    const char *query;
    char name[IDEM_STORE_OPT_MAX + 1], value[IDEM_STORE_OPT_MAX + 1];

    idem__store_split(rest, &path_len, &query);
    if (path_len > 0) {
        idem__store_errbuf(errbuf, errlen, "store URL memory: takes no path (got \"%.64s\")",
                           rest);
        return IDEM_E_INVAL;
    }
    int r = idem__store_next_opt(&query, name, value, errbuf, errlen);
    if (r < 0)
        return IDEM_E_INVAL;
    if (r > 0) {
        idem__store_errbuf(errbuf, errlen, "unknown option \"%s\" for store memory:", name);
        return IDEM_E_INVAL;
    }
    if (out == NULL)
        return IDEM_OK; /* idem_store_check_url: the URL is good */

    struct mem_store *m = idem_calloc(1, sizeof *m);
    if (m == NULL)
        return IDEM_E_NOMEM;
    m->buckets = idem_calloc(INITIAL_BUCKETS, sizeof *m->buckets);
    if (m->buckets == NULL) {
        idem_free(m);
        return IDEM_E_NOMEM;
    }
    m->nbuckets = INITIAL_BUCKETS;
    m->base.ops = &idem__store_memory_ops;
    m->base.exec_is_cheap = true;
    m->base.reads_are_local = true;
    pthread_mutex_init(&m->lock, NULL);

    uint64_t k[2];
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        /* No entropy yet (early boot): a weaker but still varying key. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        k[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)m;
        k[1] = (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&k;
    }
    m->k0 = k[0];
    m->k1 = k[1];
    *out = &m->base;
    return IDEM_OK;
}

const struct idem_store_ops idem__store_memory_ops = {
    .name = "memory",
    .scheme = "memory",
    .open = mem_open,
    .close = mem_close,
    .exec = mem_exec,
    .get = mem_get,
    .sweep = mem_sweep,
    .ping = mem_ping,
    .list = mem_list,
};
