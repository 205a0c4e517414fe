/* src/gateway/addrlimit.c - max_connections_per_address (addrlimit.h).
 *
 * A chained hash table of 16-byte addresses (IPv4 as IPv4-mapped IPv6)
 * with a count each, under one mutex: taking and giving a place are a few
 * dozen instructions beside an accept.  The bucket array grows by doubling
 * while entries outnumber buckets; an entry is freed when its count falls
 * to zero.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>

#include "gateway/addrlimit.h"
#include "idem/alloc.h"

typedef struct addr_entry {
    struct addr_entry *next;
    uint8_t addr[16];
    uint64_t count;
} addr_entry_t;

struct idem_addrlimit {
    pthread_mutex_t mu;
    uint64_t max;
    addr_entry_t **buckets;
    size_t n_buckets; /* a power of two */
    size_t n_entries;
};

idem_addrlimit_t *idem__addrlimit_create(uint64_t max, bool *err)
{
    *err = false;
    if (max == 0)
        return NULL;
    idem_addrlimit_t *t = idem_calloc(1, sizeof *t);
    if (t)
        t->buckets = idem_calloc(64, sizeof *t->buckets);
    if (!t || !t->buckets) {
        idem_free(t);
        *err = true;
        return NULL;
    }
    t->n_buckets = 64;
    t->max = max;
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void idem__addrlimit_destroy(idem_addrlimit_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_buckets; i++) {
        addr_entry_t *e = t->buckets[i];
        while (e) {
            addr_entry_t *next = e->next;
            idem_free(e);
            e = next;
        }
    }
    idem_free(t->buckets);
    pthread_mutex_destroy(&t->mu);
    idem_free(t);
}

/* sa as 16 bytes; false for a family that has no address (never counted). */
static bool addr_key(const struct sockaddr *sa, uint8_t out[16])
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &in->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

static size_t addr_hash(const uint8_t a[16], size_t n_buckets)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29)) & (n_buckets - 1);
}

static addr_entry_t **addr_find(idem_addrlimit_t *t, const uint8_t a[16])
{
    addr_entry_t **p = &t->buckets[addr_hash(a, t->n_buckets)];
    while (*p && memcmp((*p)->addr, a, 16) != 0)
        p = &(*p)->next;
    return p;
}

/* Double the buckets; on no memory the table stays as it is (longer chains). */
static void addr_grow(idem_addrlimit_t *t)
{
    size_t n = t->n_buckets * 2;
    addr_entry_t **b = idem_calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < t->n_buckets; i++) {
        addr_entry_t *e = t->buckets[i];
        while (e) {
            addr_entry_t *next = e->next;
            size_t h = addr_hash(e->addr, n);
            e->next = b[h];
            b[h] = e;
            e = next;
        }
    }
    idem_free(t->buckets);
    t->buckets = b;
    t->n_buckets = n;
}

bool idem__addrlimit_take(idem_addrlimit_t *t, const struct sockaddr *sa)
{
    uint8_t a[16];
    if (!t || !addr_key(sa, a))
        return true;
    bool ok = false;
    pthread_mutex_lock(&t->mu);
    addr_entry_t **p = addr_find(t, a);
    if (*p) {
        if ((*p)->count < t->max) {
            (*p)->count++;
            ok = true;
        }
    } else {
        addr_entry_t *e = idem_calloc(1, sizeof *e);
        if (e) {
            memcpy(e->addr, a, 16);
            e->count = 1;
            *p = e;
            ok = true;
            if (++t->n_entries > t->n_buckets)
                addr_grow(t);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void idem__addrlimit_give(idem_addrlimit_t *t, const struct sockaddr *sa)
{
    uint8_t a[16];
    if (!t || !addr_key(sa, a))
        return;
    pthread_mutex_lock(&t->mu);
    addr_entry_t **p = addr_find(t, a);
    if (*p && --(*p)->count == 0) {
        addr_entry_t *e = *p;
        *p = e->next;
        idem_free(e);
        t->n_entries--;
    }
    pthread_mutex_unlock(&t->mu);
}

uint64_t idem__addrlimit_count(idem_addrlimit_t *t, const struct sockaddr *sa)
{
    uint8_t a[16];
    if (!t || !addr_key(sa, a))
        return 0;
    pthread_mutex_lock(&t->mu);
    addr_entry_t **p = addr_find(t, a);
    uint64_t n = *p ? (*p)->count : 0;
    pthread_mutex_unlock(&t->mu);
    return n;
}
