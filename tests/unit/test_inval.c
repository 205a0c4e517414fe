/* tests/unit/test_inval.c - the invalidation messages of src/store/watch.c:
 * what a publisher sends, and what a watcher accepts from a channel anyone
 * with access to the server may write to. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "store/store_impl.h"

static idem_key_id_t id_of(const char *scope, const char *key)
{
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.scope, sizeof id.scope, "%s", scope);
    snprintf(id.key, sizeof id.key, "%s", key);
    return id;
}

static int decode(const char *msg, idem_key_id_t *id)
{
    return idem__inval_decode(msg, strlen(msg), id);
}

Test(inval, round_trip_of_a_delete_and_a_clear)
{
    char hex[65];
    memset(hex, 'a', 64);
    hex[64] = '\0';
    char key[IDEM_KEY_MAX + 1];
    memset(key, '~', IDEM_KEY_MAX);
    key[IDEM_KEY_MAX] = '\0';
    key[0] = ':'; /* the key is everything after the scope's ':' */
    idem_key_id_t in = id_of(hex, key), out;
    char buf[IDEM__INVAL_MSG_MAX];
    size_t n = idem__inval_encode(&in, buf);
    cr_assert_eq(n, IDEM__INVAL_MSG_MAX);
    cr_assert_eq(idem__inval_decode(buf, n, &out), 1);
    cr_expect_str_eq(out.scope, hex);
    cr_expect_str_eq(out.key, key);
    in = id_of("anonymous", "k 1");
    n = idem__inval_encode(&in, buf);
    cr_expect_eq(n, strlen("d:anonymous:k 1"));
    cr_expect(memcmp(buf, "d:anonymous:k 1", n) == 0);
    n = idem__inval_encode(NULL, buf);
    cr_expect_eq(idem__inval_decode(buf, n, &out), 2);
}

Test(inval, malformed_messages_are_refused)
{
    idem_key_id_t id;
    const char *bad[] = {"", "d", "x:anonymous:k", "c:", "d:anonymous:", "d::k",
                         "d:ANONYMOUS:k", "d:0123:k", "d:anonymous", "c:x", "d:anonymous:k\n",
                         "d:anonymous:\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(decode(bad[i], &id), bad[i][0] == 'c' && strlen(bad[i]) == 2 ? 2 : 0,
                     "%s", bad[i]);
    cr_expect_eq(idem__inval_decode(NULL, 0, &id), 0);
    cr_expect_eq(idem__inval_decode("d:anonymous:k\0x", 15, &id), 0); /* a NUL inside */
    char big[IDEM__INVAL_MSG_MAX + 2];
    memset(big, 'k', sizeof big);
    memcpy(big, "d:anonymous:", 12);
    cr_expect_eq(idem__inval_decode(big, sizeof big, &id), 0);
}

Test(inval, embedded_stores_publish_nothing_and_cannot_be_watched)
{
    idem_store_t *s = NULL;
    cr_assert_eq(idem_store_open("memory:", &s, NULL, 0), IDEM_OK);
    idem_key_id_t id = id_of("anonymous", "k");
    cr_expect_eq(idem_store_publish_delete(s, &id), IDEM_OK);
    cr_expect_eq(idem_store_publish_clear(s), IDEM_OK);
    idem_store_watch_cbs_t cbs = {0};
    cr_expect_eq(idem_store_watch(s, &cbs), IDEM_E_UNSUPPORTED);
    idem_store_unwatch(s);
    idem_store_close(s);
}
