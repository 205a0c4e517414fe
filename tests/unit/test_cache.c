/* tests/unit/test_cache.c - local_cache: an LRU of completed records, bounded, expiring. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gateway/cache.h"

static idem_key_id_t id_of(const char *scope, const char *key)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "%s", scope);
    snprintf(id.key, sizeof id.key, "%s", key);
    return id;
}

static idem_record_t completed(int status, const char *body, int64_t expires)
{
    idem_record_t r;
    memset(&r, 0, sizeof r);
    r.state = IDEM_STATE_COMPLETED;
    r.fence = 3;
    memset(r.fingerprint, 0xab, IDEM_FP_LEN);
    r.expires_at_ms = expires;
    r.response.status = status;
    r.response.body = (const uint8_t *)body;
    r.response.body_len = strlen(body);
    return r;
}

Test(cache, zero_entries_is_no_cache_and_null_is_safe)
{
    cr_expect_null(idem__cache_create(0, 1024));
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t out, r = completed(200, "x", 100);
    idem__cache_put(NULL, &id, &r);
    cr_expect_eq(idem__cache_get(NULL, &id, 0, &out), IDEM_E_NOTFOUND);
    idem__cache_remove(NULL, &id);
    idem__cache_destroy(NULL);
    cr_expect_eq(idem__cache_entries(NULL), 0);
}

Test(cache, get_returns_an_exact_copy)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t r = completed(201, "hello", 1000), out;
    idem__cache_put(c, &id, &r);
    cr_assert_eq(idem__cache_get(c, &id, 999, &out), IDEM_OK);
    cr_expect_eq(out.response.status, 201);
    cr_expect_eq(out.fence, 3);
    cr_expect_eq(out.response.body_len, 5);
    cr_expect_eq(memcmp(out.response.body, "hello", 5), 0);
    cr_expect_eq(memcmp(out.fingerprint, r.fingerprint, IDEM_FP_LEN), 0);
    idem_record_cleanup(&out);
    idem__cache_destroy(c);
}

Test(cache, in_progress_records_are_never_cached)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t r = completed(200, "x", 1000), out;
    r.state = IDEM_STATE_IN_PROGRESS;
    idem__cache_put(c, &id, &r);
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_E_NOTFOUND);
    cr_expect_eq(idem__cache_entries(c), 0);
    idem__cache_destroy(c);
}

Test(cache, an_entry_is_not_served_from_its_expiry)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t r = completed(200, "x", 1000), out;
    idem__cache_put(c, &id, &r);
    cr_expect_eq(idem__cache_get(c, &id, 1000, &out), IDEM_E_NOTFOUND);
    cr_expect_eq(idem__cache_entries(c), 0, "an expired entry is dropped");
    idem__cache_destroy(c);
}

Test(cache, scopes_and_keys_are_distinct_and_remove_forgets)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t a = id_of("anonymous", "k"), b = id_of("aaaa", "k"), k2 = id_of("anonymous", "k2");
    idem_record_t r = completed(200, "x", 1000), out;
    idem__cache_put(c, &a, &r);
    cr_expect_eq(idem__cache_get(c, &b, 0, &out), IDEM_E_NOTFOUND);
    cr_expect_eq(idem__cache_get(c, &k2, 0, &out), IDEM_E_NOTFOUND);
    idem__cache_remove(c, &a);
    cr_expect_eq(idem__cache_get(c, &a, 0, &out), IDEM_E_NOTFOUND);
    idem__cache_destroy(c);
}

Test(cache, least_recently_used_goes_first)
{
    idem_cache_t *c = idem__cache_create(3, 1 << 20);
    idem_record_t r = completed(200, "x", 1000), out;
    char key[16];
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "k%d", i);
        idem_key_id_t id = id_of("anonymous", key);
        idem__cache_put(c, &id, &r);
    }
    idem_key_id_t k0 = id_of("anonymous", "k0"), k1 = id_of("anonymous", "k1"),
                  k3 = id_of("anonymous", "k3");
    cr_assert_eq(idem__cache_get(c, &k0, 0, &out), IDEM_OK); /* k0 is now the most recent */
    idem_record_cleanup(&out);
    idem__cache_put(c, &k3, &r);
    cr_expect_eq(idem__cache_entries(c), 3);
    cr_expect_eq(idem__cache_get(c, &k1, 0, &out), IDEM_E_NOTFOUND, "k1 was least recent");
    cr_expect_eq(idem__cache_get(c, &k0, 0, &out), IDEM_OK);
    idem_record_cleanup(&out);
    idem__cache_destroy(c);
}

Test(cache, bytes_are_bounded_and_a_huge_record_is_not_cached)
{
    static char big[3000];
    memset(big, 'b', sizeof big - 1);
    idem_cache_t *c = idem__cache_create(1000, 8192);
    idem_record_t huge = completed(200, big, 1000), small = completed(200, "0123456789", 1000), out;
    idem_key_id_t h = id_of("anonymous", "huge");
    idem__cache_put(c, &h, &huge);
    cr_expect_eq(idem__cache_get(c, &h, 0, &out), IDEM_E_NOTFOUND, "over a quarter of the bytes");
    char key[16];
    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof key, "s%d", i);
        idem_key_id_t id = id_of("anonymous", key);
        idem__cache_put(c, &id, &small);
        cr_assert_leq(idem__cache_bytes(c), 8192);
    }
    cr_expect_lt(idem__cache_entries(c), 500);
    idem__cache_destroy(c);
}

Test(cache, replacing_an_entry_keeps_one)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t a = completed(200, "a", 1000), b = completed(202, "bb", 1000), out;
    idem__cache_put(c, &id, &a);
    idem__cache_put(c, &id, &b);
    cr_expect_eq(idem__cache_entries(c), 1);
    cr_assert_eq(idem__cache_get(c, &id, 0, &out), IDEM_OK);
    cr_expect_eq(out.response.status, 202);
    idem_record_cleanup(&out);
    idem__cache_destroy(c);
}

static idem_cache_t *shared;

static void *hammer(void *arg)
{
    long t = (long)arg;
    idem_record_t r = completed(200, "x", 1000), out;
    char key[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof key, "k%ld-%d", t, i % 50);
        idem_key_id_t id = id_of("anonymous", key);
        idem__cache_put(shared, &id, &r);
        if (idem__cache_get(shared, &id, 0, &out) == IDEM_OK)
            idem_record_cleanup(&out);
        if (i % 7 == 0)
            idem__cache_remove(shared, &id);
    }
    return NULL;
}

Test(cache, threads_share_it_safely)
{
    shared = idem__cache_create(64, 1 << 20);
    pthread_t th[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, hammer, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_expect_leq(idem__cache_entries(shared), 64);
    idem__cache_destroy(shared);
}

/* Across instances (cache.h): an untrusted cache finds and keeps nothing,
 * and trusting it again starts it empty. */
Test(cache, untrusted_is_bypassed_and_trust_again_starts_empty)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k");
    idem_record_t out, r = completed(200, "x", 1000);
    idem__cache_put(c, &id, &r);
    cr_assert(idem__cache_trusted(c));
    idem__cache_set_trusted(c, false);
    cr_expect(!idem__cache_trusted(c));
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_E_NOTFOUND);
    idem__cache_put(c, &id, &r);
    cr_expect_eq(idem__cache_entries(c), 0);
    idem__cache_set_trusted(c, true);
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_E_NOTFOUND);
    idem__cache_put(c, &id, &r);
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_OK);
    idem_record_cleanup(&out);
    idem__cache_clear(c);
    cr_expect_eq(idem__cache_entries(c), 0);
    idem__cache_destroy(c);
}

/* A record read before an invalidation is not kept after it. */
Test(cache, put_since_is_refused_after_an_invalidation)
{
    idem_cache_t *c = idem__cache_create(10, 1 << 20);
    idem_key_id_t id = id_of("anonymous", "k"), other = id_of("anonymous", "o");
    idem_record_t out, r = completed(200, "x", 1000);
    cr_expect_eq(idem__cache_gen(NULL), 0);
    uint64_t g = idem__cache_gen(c);
    idem__cache_put_since(c, g, &id, &r);
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_OK);
    idem_record_cleanup(&out);
    g = idem__cache_gen(c);
    idem__cache_remove(c, &other); /* any invalidation, even of another key */
    idem__cache_remove(c, &id);
    idem__cache_put_since(c, g, &id, &r);
    cr_expect_eq(idem__cache_get(c, &id, 0, &out), IDEM_E_NOTFOUND);
    g = idem__cache_gen(c);
    idem__cache_set_trusted(c, false);
    idem__cache_set_trusted(c, true);
    idem__cache_put_since(c, g, &id, &r);
    cr_expect_eq(idem__cache_entries(c), 0);
    idem__cache_put_since(c, 0, &id, &r); /* 0 is never current */
    cr_expect_eq(idem__cache_entries(c), 0);
    idem__cache_destroy(c);
}
