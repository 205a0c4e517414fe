/* src/gateway/ratelimit.c - scope_rate_limit: a token bucket per caller.
 *
 * GCRA, the token bucket written as one number.  With N requests per
 * period P, each request costs T = P / N of time.  A bucket keeps tat, the
 * time at which it would be full again.  A request at now is allowed when
 * max(tat, now) - now <= (N - 1) * T, i.e. when at most N - 1 requests'
 * worth of time is still owed, and then tat = max(tat, now) + T.  A refused
 * request costs nothing.  So a fresh bucket lets exactly N requests through
 * at once, then one every T.  Times are nanoseconds of a monotonic clock;
 * T is rounded down to whole nanoseconds, which for the largest rate
 * (1000000/s, T = 1000 ns) is exact and is never off by more than 0.1%.
 *
 * The table: a chained hash over the scope string (FNV-1a with a seed from
 * the kernel, finalised as in cache.c) and a doubly linked list in order of
 * use, both under one mutex, as local_cache does it.  See ratelimit.h for
 * the bound and what is evicted.
 *
 * THREADING: every function but create/destroy takes the mutex.
 */
#include "gateway/ratelimit.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "idem/alloc.h"
#include "idem/key.h"
#include "idem/random.h"

#define IDLE_DROPS_PER_TAKE 2 /* full buckets dropped from the old end per call */

struct bucket {
    struct bucket *hnext;       /* next in the hash chain */
    struct bucket *prev, *next; /* use order: lru.next is the most recent */
    uint64_t h;
    uint64_t tat_ns;            /* when this bucket is full again */
    char scope[IDEM_SCOPE_MAX + 1];
};

struct idem_ratelimit {
    pthread_mutex_t mu;
    struct bucket **chains;
    size_t mask;
    struct bucket lru; /* sentinel */
    size_t n, max;
    uint64_t t_ns;     /* one request's share of the period */
    uint64_t tau_ns;   /* (N - 1) * T: the most time a bucket may owe */
    uint64_t seed;
};

int idem__rate_parse(const char *s, idem_rate_t *out)
{
    memset(out, 0, sizeof *out);
    if (s == NULL)
        return -1;
    if (strcmp(s, "off") == 0)
        return 0;
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > IDEM_RATE_MAX_COUNT)
            return -1;
    }
    if (v == 0 || *p != '/')
        return -1;
    p++;
    int64_t period;
    if (strcmp(p, "s") == 0)
        period = 1000;
    else if (strcmp(p, "m") == 0)
        period = 60 * 1000;
    else if (strcmp(p, "h") == 0)
        period = 3600 * 1000;
    else
        return -1;
    out->count = (uint32_t)v;
    out->period_ms = period;
    return 0;
}

static uint64_t hash_scope(const idem_ratelimit_t *rl, const char *s)
{
    uint64_t h = rl->seed ^ UINT64_C(0xcbf29ce484222325);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

idem_ratelimit_t *idem__ratelimit_create(idem_rate_t rate, size_t max_scopes)
{
    if (rate.count == 0 || rate.period_ms <= 0 || max_scopes == 0)
        return NULL;
    idem_ratelimit_t *rl = idem_calloc(1, sizeof *rl);
    if (rl == NULL)
        return NULL;
    size_t nc = 16;
    while (nc < max_scopes + max_scopes / 4 && nc < (size_t)1 << 22)
        nc <<= 1;
    rl->chains = idem_calloc(nc, sizeof *rl->chains);
    if (rl->chains == NULL) {
        idem_free(rl);
        return NULL;
    }
    rl->mask = nc - 1;
    rl->lru.prev = rl->lru.next = &rl->lru;
    rl->max = max_scopes;
    uint64_t period_ns = (uint64_t)rate.period_ms * 1000000u;
    rl->t_ns = period_ns / rate.count;
    if (rl->t_ns == 0)
        rl->t_ns = 1;
    rl->tau_ns = rl->t_ns * (rate.count - 1);
    rl->seed = idem_rng_u64(NULL);
    pthread_mutex_init(&rl->mu, NULL);
    return rl;
}

void idem__ratelimit_destroy(idem_ratelimit_t *rl)
{
    if (rl == NULL)
        return;
    struct bucket *b = rl->lru.next;
    while (b != &rl->lru) {
        struct bucket *next = b->next;
        idem_free(b);
        b = next;
    }
    idem_free(rl->chains);
    pthread_mutex_destroy(&rl->mu);
    idem_free(rl);
}

static void lru_unlink(struct bucket *b)
{
    b->prev->next = b->next;
    b->next->prev = b->prev;
}

static void lru_push_front(idem_ratelimit_t *rl, struct bucket *b)
{
    b->next = rl->lru.next;
    b->prev = &rl->lru;
    rl->lru.next->prev = b;
    rl->lru.next = b;
}

/* The slot pointing at scope's bucket, or at the NULL ending its chain. */
static struct bucket **find(idem_ratelimit_t *rl, uint64_t h, const char *scope)
{
    struct bucket **pp = &rl->chains[h & rl->mask];
    while (*pp != NULL && !((*pp)->h == h && strcmp((*pp)->scope, scope) == 0))
        pp = &(*pp)->hnext;
    return pp;
}

static void drop(idem_ratelimit_t *rl, struct bucket *b)
{
    struct bucket **pp = find(rl, b->h, b->scope);
    *pp = b->hnext;
    lru_unlink(b);
    rl->n--;
    idem_free(b);
}

/* Forget the least recently used buckets that are full again (they hold no
 * state); when at the bound, forget the least recently used one anyway. */
static void make_room(idem_ratelimit_t *rl, uint64_t now_ns)
{
    for (int i = 0; i < IDLE_DROPS_PER_TAKE && rl->n > 0; i++) {
        struct bucket *old = rl->lru.prev;
        if (old->tat_ns > now_ns)
            break;
        drop(rl, old);
    }
    if (rl->n >= rl->max)
        drop(rl, rl->lru.prev);
}

bool idem__ratelimit_take(idem_ratelimit_t *rl, const char *scope, uint64_t now_ns,
                          int64_t *retry_after_s)
{
    int64_t dummy;
    if (retry_after_s == NULL)
        retry_after_s = &dummy;
    *retry_after_s = 0;
    if (rl == NULL || scope == NULL)
        return true;
    size_t sl = strlen(scope);
    if (sl > IDEM_SCOPE_MAX)
        sl = IDEM_SCOPE_MAX;
    char key[IDEM_SCOPE_MAX + 1];
    memcpy(key, scope, sl);
    key[sl] = '\0';
    uint64_t h = hash_scope(rl, key);
    bool ok = true;

    pthread_mutex_lock(&rl->mu);
    struct bucket **pp = find(rl, h, key);
    struct bucket *b = *pp;
    if (b != NULL) {
        lru_unlink(b);
        lru_push_front(rl, b);
    } else {
        make_room(rl, now_ns);
        b = idem_malloc(sizeof *b);
        if (b == NULL) {
            pthread_mutex_unlock(&rl->mu);
            return true;
        }
        b->h = h;
        b->tat_ns = now_ns;
        memcpy(b->scope, key, sl + 1);
        /* make_room may have changed the chain: find the end again. */
        pp = find(rl, h, key);
        b->hnext = NULL;
        *pp = b;
        lru_push_front(rl, b);
        rl->n++;
    }
    uint64_t tat = b->tat_ns > now_ns ? b->tat_ns : now_ns;
    if (tat - now_ns <= rl->tau_ns) {
        b->tat_ns = tat + rl->t_ns;
    } else {
        ok = false;
        uint64_t wait_ns = tat - now_ns - rl->tau_ns;
        uint64_t s = (wait_ns + 999999999u) / 1000000000u;
        *retry_after_s = s < 1 ? 1 : (int64_t)s;
    }
    pthread_mutex_unlock(&rl->mu);
    return ok;
}

size_t idem__ratelimit_tracked(idem_ratelimit_t *rl)
{
    if (rl == NULL)
        return 0;
    pthread_mutex_lock(&rl->mu);
    size_t n = rl->n;
    pthread_mutex_unlock(&rl->mu);
    return n;
}
