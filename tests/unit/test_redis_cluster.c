/* tests/unit/test_redis_cluster.c - the parts of src/store/redis_cluster.c
 * that need no cluster: the key hash and slot of the Redis Cluster spec,
 * the URL (idem_store_check_url), and the open's coverage check of a slot
 * map (idem__redis_uncovered).  The cluster itself is tested on real
 * servers: tests/blackbox/test_redis_cluster.py, and the store suite with
 * IDEM_TEST_REDIS_URL set to a URL of tests/cluster.py. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "idem/store.h"
#include "store/redis_impl.h"

static unsigned slot_of(const char *key)
{
    return idem__redis_keyslot(key, strlen(key));
}

Test(redis_cluster, crc16_is_xmodem_as_the_spec_says)
{
    cr_expect_eq(idem__redis_crc16("123456789", 9), 0x31C3);
    cr_expect_eq(idem__redis_crc16("", 0), 0);
}

Test(redis_cluster, slots_match_redis)
{
    /* CLUSTER KEYSLOT of Redis 7 gives these. */
    cr_expect_eq(slot_of("foo"), 12182);
    cr_expect_eq(slot_of("bar"), 5061);
    cr_expect_eq(slot_of("123456789"), 0x31C3 % 16384);
}

Test(redis_cluster, hash_tags_follow_the_spec)
{
    cr_expect_eq(slot_of("{user1000}.following"), slot_of("user1000"));
    cr_expect_eq(slot_of("{user1000}.followers"), slot_of("user1000"));
    /* An empty tag: the whole key. */
    cr_expect_eq(slot_of("foo{}{bar}"),
                 idem__redis_crc16("foo{}{bar}", 10) % 16384);
    /* The first '{' and the next '}'. */
    cr_expect_eq(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    cr_expect_eq(slot_of("foo{bar}{zap}"), slot_of("bar"));
    /* No closing brace: the whole key. */
    cr_expect_eq(slot_of("foo{bar"), idem__redis_crc16("foo{bar", 7) % 16384);
}

static void refused(const char *url, const char *words)
{
    char err[512] = "";
    cr_expect_eq(idem_store_check_url(url, err, sizeof err), IDEM_E_INVAL, "%s", url);
    cr_expect(strstr(err, words) != NULL, "%s: \"%s\" lacks \"%s\"", url, err, words);
}

Test(redis_cluster, urls)
{
    char err[512] = "";
    cr_expect_eq(idem_store_check_url("redis+cluster://127.0.0.1:7000", err, sizeof err),
                 IDEM_OK, "%s", err);
    cr_expect_eq(idem_store_check_url("redis+cluster://a:7000,b:7001,[::1]:7002?prefix=x:&"
                                      "pool=2&timeout=500ms",
                                      err, sizeof err),
                 IDEM_OK, "%s", err);
    refused("redis+cluster://127.0.0.1:7000/0", "a cluster has no databases");
    refused("redis+cluster://127.0.0.1:7000?prefix={x}", "no '{' or '}' on a cluster");
    refused("redis+cluster://", "no host");
    refused("redis+cluster://127.0.0.1:7000?ca=/x.pem", "is for TLS");
    refused("redis+cluster://h:1,h:2,h:3,h:4,h:5,h:6,h:7,h:8,h:9,h:10,h:11,h:12,h:13,h:14,"
            "h:15,h:16,h:17",
            "more than 16 seed nodes");
    refused("rediss+cluster://127.0.0.1:7000?ca=/nonexistent/ca.pem", "ca=");
}

/* The open's coverage check: a slot map with gaps, in words. */
#define NONE 255

static size_t gaps(const uint8_t *map, char *buf, size_t len)
{
    return idem__redis_uncovered(map, NONE, buf, len);
}

Test(redis_cluster, a_full_map_has_no_gap)
{
    static uint8_t map[16384];
    memset(map, 0, 5461);
    memset(map + 5461, 1, 10923 - 5461);
    memset(map + 10923, 2, 16384 - 10923);
    char buf[256] = "x";
    cr_expect_eq(gaps(map, buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "");
}

Test(redis_cluster, gaps_are_named_as_ranges)
{
    static uint8_t map[16384];
    char buf[256];
    memset(map, 0, sizeof map);
    memset(map + 5461, NONE, 10923 - 5461);
    cr_expect_eq(gaps(map, buf, sizeof buf), 10923 - 5461);
    cr_expect_str_eq(buf, "slots 5461-10922 are served by no master");

    memset(map, 0, sizeof map);
    map[7] = NONE;
    cr_expect_eq(gaps(map, buf, sizeof buf), 1);
    cr_expect_str_eq(buf, "slot 7 is served by no master");

    /* The first and the last slot, and a lone one between. */
    memset(map, 1, sizeof map);
    memset(map, NONE, 100);
    map[9000] = NONE;
    memset(map + 16380, NONE, 4);
    cr_expect_eq(gaps(map, buf, sizeof buf), 105);
    cr_expect_str_eq(buf, "slots 0-99, 9000, 16380-16383 are served by no master");

    /* Every slot. */
    memset(map, NONE, sizeof map);
    cr_expect_eq(gaps(map, buf, sizeof buf), 16384);
    cr_expect_str_eq(buf, "slots 0-16383 are served by no master");
}

Test(redis_cluster, many_gaps_are_counted_not_listed)
{
    static uint8_t map[16384];
    memset(map, 0, sizeof map);
    for (int i = 0; i < 10; i++)
        map[i * 1000] = NONE; /* ten lone slots */
    char buf[256];
    cr_expect_eq(gaps(map, buf, sizeof buf), 10);
    cr_expect_str_eq(buf, "slots 0, 1000, 2000, 3000 and 6 more ranges (10 slots in all) are "
                          "served by no master");
    /* A short buffer is cut, never overrun; no buffer at all only counts. */
    char small[12];
    cr_expect_eq(gaps(map, small, sizeof small), 10);
    cr_expect_eq(strlen(small), sizeof small - 1);
    cr_expect_eq(gaps(map, NULL, 0), 10);
}
