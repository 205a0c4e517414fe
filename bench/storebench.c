/* bench/storebench.c - idem-storebench: a store's commit rate, alone.
 *
 * The request path's new-key rows (bench/run.sh) mix the store with wrk,
 * nginx and idemd's loop on two cores; this tool asks only the store.
 * THREADS threads each call idem_store_exec with BATCH fresh claims (a
 * claim is what every new key writes first: an in_progress record with a
 * lease and an expiry) in a loop for SECONDS, and it prints claims per
 * second, commits per second and the mean time of one exec.  With
 * sync=always an exec waits for its fsync, so "claims per second at
 * THREADS x BATCH" is the most a gateway with that many requests waiting
 * could get from this disk; concurrent execs on an embedded store are
 * group-committed inside it (lmdb.c, rocksdb.c).  Measurements that rest
 * on it are in docs/stores.md.
 *
 * Usage: idem-storebench STORE_URL THREADS BATCH SECONDS
 *        THREADS 1..64, BATCH 1..1000, SECONDS 1..600   (exit 0; 1 store
 *        error; 2 usage)
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idem/store.h"

#define THREADS_MAX 64
#define BATCH_MAX 1000

static idem_store_t *store;
static int batch;
static atomic_bool stopping;
static atomic_uint_fast64_t claims, execs, exec_ns;
static atomic_int failed;

static int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void *claimer(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    idem_op_t *ops = calloc((size_t)batch, sizeof *ops);
    if (ops == NULL) {
        atomic_store(&failed, 1);
        return NULL;
    }
    for (uint64_t round = 0; !atomic_load(&stopping); round++) {
        int64_t now = wall_ms();
        for (int i = 0; i < batch; i++) {
            memset(&ops[i], 0, sizeof ops[i]);
            ops[i].kind = IDEM_OP_CLAIM;
            snprintf(ops[i].id.scope, sizeof ops[i].id.scope, "storebench");
            snprintf(ops[i].id.key, sizeof ops[i].id.key,
                     "%" PRIu64 "-%" PRIuPTR "-%" PRIu64 "-%d", (uint64_t)now, id, round, i);
            ops[i].now_ms = now;
            ops[i].lease_until_ms = now + 60000;
            ops[i].expires_at_ms = now + 3600000;
        }
        int64_t t0 = mono_ns();
        idem_err_t err = idem_store_exec(store, ops, (size_t)batch);
        atomic_fetch_add(&exec_ns, (uint64_t)(mono_ns() - t0));
        for (int i = 0; i < batch; i++)
            idem_record_cleanup(&ops[i].record);
        if (err != IDEM_OK) {
            fprintf(stderr, "idem-storebench: exec: %s: %s\n", idem_err_name(err),
                    idem_store_errstr(store));
            atomic_store(&failed, 1);
            break;
        }
        atomic_fetch_add(&claims, (uint64_t)batch);
        atomic_fetch_add(&execs, 1);
    }
    free(ops);
    return NULL;
}

static int number(const char *s, int lo, int hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s != '\0' && *end == '\0' && v >= lo && v <= hi ? (int)v : -1;
}

int main(int argc, char **argv)
{
    int threads = argc == 5 ? number(argv[2], 1, THREADS_MAX) : -1;
    batch = argc == 5 ? number(argv[3], 1, BATCH_MAX) : -1;
    int seconds = argc == 5 ? number(argv[4], 1, 600) : -1;
    if (threads < 0 || batch < 0 || seconds < 0) {
        fprintf(stderr, "usage: idem-storebench STORE_URL THREADS(1-64) BATCH(1-1000) "
                        "SECONDS(1-600)\n");
        return 2;
    }
    char errbuf[256];
    idem_err_t err = idem_store_open(argv[1], &store, errbuf, sizeof errbuf);
    if (err != IDEM_OK) {
        fprintf(stderr, "idem-storebench: %s\n", errbuf);
        return err == IDEM_E_INVAL ? 2 : 1;
    }
    pthread_t tids[THREADS_MAX];
    int started = 0;
    int64_t t0 = mono_ns();
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, claimer, (void *)(uintptr_t)started) != 0)
            break;
    struct timespec d = {seconds, 0};
    while (nanosleep(&d, &d) != 0)
        ;
    atomic_store(&stopping, true);
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    double secs = (double)(mono_ns() - t0) / 1e9;
    uint64_t n = atomic_load(&claims), e = atomic_load(&execs);
    printf("%s threads=%d batch=%d: %.0f claims/s, %.0f execs/s, exec %.3f ms mean\n", argv[1],
           threads, batch, (double)n / secs, (double)e / secs,
           e > 0 ? (double)atomic_load(&exec_ns) / (double)e / 1e6 : 0.0);
    idem_store_close(store);
    return atomic_load(&failed) || started < threads ? 1 : 0;
}
