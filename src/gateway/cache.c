/* src/gateway/cache.c - the LRU of completed records behind local_cache.
 *
 * A chained hash table over (scope, key) for lookups and a doubly linked
 * list in order of use for eviction, both under one mutex.  Entries hold
 * the record encoded (idem_record_encode), which is compact and makes a get
 * a decode into the caller's own copy, so nothing the cache owns is ever
 * used outside the lock.  The table has a fixed number of buckets (a power
 * of two near twice the entry bound) and a hash seeded from the kernel at
 * creation, so a client that picks keys cannot choose which collide.
 *
 * Trust and generations (cache.h): `trusted` false makes get and put
 * no-ops; `gen` is bumped by every remove, clear and change of trust, under
 * the same mutex, so a put_since that sees the generation it was given
 * knows no invalidation came between its caller's read and now.
 *
 * THREADING: every function takes the mutex; any thread may call them.
 */
#include "gateway/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"
#include "idem/random.h"

struct ent {
    struct ent *hnext;       /* next in the bucket */
    struct ent *prev, *next; /* use order: head is most recent */
    uint64_t h;
    idem_key_id_t id;
    int64_t expires_at_ms;
    uint8_t *enc;
    size_t enc_len;
};

struct idem_cache {
    pthread_mutex_t mu;
    struct ent **buckets;
    size_t mask;
    struct ent lru; /* sentinel of the use-order list */
    size_t entries, bytes;
    size_t max_entries, max_bytes;
    uint64_t seed;
    uint64_t gen; /* starts at 1: a generation of 0 is never current */
    bool trusted;
};

static uint64_t hash_id(const idem_cache_t *c, const idem_key_id_t *id)
{
    uint64_t h = c->seed ^ UINT64_C(0xcbf29ce484222325);
    for (const char *p = id->scope; *p; p++)
        h = (h ^ (unsigned char)*p) * UINT64_C(0x100000001b3);
    h = (h ^ 0xff) * UINT64_C(0x100000001b3);
    for (const char *p = id->key; *p; p++)
        h = (h ^ (unsigned char)*p) * UINT64_C(0x100000001b3);
    /* Finalise so that the low bits, which pick the bucket, depend on all. */
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

static int same_id(const idem_key_id_t *a, const idem_key_id_t *b)
{
    return strcmp(a->scope, b->scope) == 0 && strcmp(a->key, b->key) == 0;
}

idem_cache_t *idem__cache_create(size_t max_entries, size_t max_bytes)
{
    if (max_entries == 0)
        return NULL;
    idem_cache_t *c = idem_calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    size_t nb = 16;
    while (nb < 2 * max_entries && nb < (size_t)1 << 22)
        nb <<= 1;
    c->buckets = idem_calloc(nb, sizeof *c->buckets);
    if (c->buckets == NULL) {
        idem_free(c);
        return NULL;
    }
    c->mask = nb - 1;
    c->lru.prev = c->lru.next = &c->lru;
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    c->seed = idem_rng_u64(NULL);
    c->gen = 1;
    c->trusted = true;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void lru_unlink(struct ent *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_push_front(idem_cache_t *c, struct ent *e)
{
    e->next = c->lru.next;
    e->prev = &c->lru;
    c->lru.next->prev = e;
    c->lru.next = e;
}

/* The slot that points at id's entry, or at the NULL ending its bucket. */
static struct ent **find(idem_cache_t *c, uint64_t h, const idem_key_id_t *id)
{
    struct ent **pp = &c->buckets[h & c->mask];
    while (*pp != NULL && !((*pp)->h == h && same_id(&(*pp)->id, id)))
        pp = &(*pp)->hnext;
    return pp;
}

/* Unlink the entry *pp points at from both structures and free it. */
static void drop(idem_cache_t *c, struct ent **pp)
{
    struct ent *e = *pp;
    *pp = e->hnext;
    lru_unlink(e);
    c->entries--;
    c->bytes -= e->enc_len;
    idem_free(e->enc);
    idem_free(e);
}

static void drop_ent(idem_cache_t *c, struct ent *e)
{
    drop(c, find(c, e->h, &e->id));
}

void idem__cache_destroy(idem_cache_t *c)
{
    if (c == NULL)
        return;
    while (c->lru.next != &c->lru)
        drop_ent(c, c->lru.next);
    pthread_mutex_destroy(&c->mu);
    idem_free(c->buckets);
    idem_free(c);
}

idem_err_t idem__cache_get(idem_cache_t *c, const idem_key_id_t *id, int64_t now_ms,
                           idem_record_t *out)
{
    memset(out, 0, sizeof *out);
    if (c == NULL)
        return IDEM_E_NOTFOUND;
    uint64_t h = hash_id(c, id);
    idem_err_t err = IDEM_E_NOTFOUND;
    pthread_mutex_lock(&c->mu);
    struct ent **pp = find(c, h, id);
    if (*pp != NULL && c->trusted) {
        struct ent *e = *pp;
        if (now_ms >= e->expires_at_ms) {
            drop(c, pp);
        } else {
            err = idem_record_decode(e->enc, e->enc_len, out);
            if (err == IDEM_OK) {
                lru_unlink(e);
                lru_push_front(c, e);
            } else if (err == IDEM_E_CORRUPT) {
                drop(c, pp); /* cannot happen: we encoded it */
                err = IDEM_E_NOTFOUND;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return err;
}

/* Put unless gen is given (any_gen false) and no longer current. */
static void put(idem_cache_t *c, bool any_gen, uint64_t gen, const idem_key_id_t *id,
                const idem_record_t *rec)
{
    if (c == NULL || rec->state != IDEM_STATE_COMPLETED)
        return;
    size_t len = idem_record_encoded_size(rec);
    if (len == 0 || len > c->max_bytes / 4)
        return;
    struct ent *e = idem_malloc(sizeof *e);
    uint8_t *enc = idem_malloc(len);
    if (e == NULL || enc == NULL) {
        idem_free(e);
        idem_free(enc);
        return;
    }
    idem_record_encode_into(rec, enc);
    e->h = hash_id(c, id);
    e->id = *id;
    e->expires_at_ms = rec->expires_at_ms;
    e->enc = enc;
    e->enc_len = len;

    pthread_mutex_lock(&c->mu);
    if (!c->trusted || (!any_gen && gen != c->gen)) {
        pthread_mutex_unlock(&c->mu);
        idem_free(enc);
        idem_free(e);
        return;
    }
    struct ent **pp = find(c, e->h, id);
    if (*pp != NULL)
        drop(c, pp);
    pp = find(c, e->h, id); /* drop may have moved the bucket's end */
    e->hnext = NULL;
    *pp = e;
    lru_push_front(c, e);
    c->entries++;
    c->bytes += len;
    while (c->entries > c->max_entries || c->bytes > c->max_bytes)
        drop_ent(c, c->lru.prev);
    pthread_mutex_unlock(&c->mu);
}

void idem__cache_put(idem_cache_t *c, const idem_key_id_t *id, const idem_record_t *rec)
{
    put(c, true, 0, id, rec);
}

void idem__cache_put_since(idem_cache_t *c, uint64_t gen, const idem_key_id_t *id,
                           const idem_record_t *rec)
{
    put(c, false, gen, id, rec);
}

uint64_t idem__cache_gen(idem_cache_t *c)
{
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    uint64_t g = c->gen;
    pthread_mutex_unlock(&c->mu);
    return g;
}

void idem__cache_remove(idem_cache_t *c, const idem_key_id_t *id)
{
    if (c == NULL)
        return;
    uint64_t h = hash_id(c, id);
    pthread_mutex_lock(&c->mu);
    c->gen++;
    struct ent **pp = find(c, h, id);
    if (*pp != NULL)
        drop(c, pp);
    pthread_mutex_unlock(&c->mu);
}

/* Drop every entry; the caller holds the mutex. */
static void clear_locked(idem_cache_t *c)
{
    c->gen++;
    while (c->lru.next != &c->lru)
        drop_ent(c, c->lru.next);
}

void idem__cache_clear(idem_cache_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    clear_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void idem__cache_set_trusted(idem_cache_t *c, bool trusted)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    clear_locked(c);
    c->trusted = trusted;
    pthread_mutex_unlock(&c->mu);
}

bool idem__cache_trusted(idem_cache_t *c)
{
    if (c == NULL)
        return false;
    pthread_mutex_lock(&c->mu);
    bool t = c->trusted;
    pthread_mutex_unlock(&c->mu);
    return t;
}

size_t idem__cache_entries(idem_cache_t *c)
{
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->entries;
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t idem__cache_bytes(idem_cache_t *c)
{
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->bytes;
    pthread_mutex_unlock(&c->mu);
    return n;
}
