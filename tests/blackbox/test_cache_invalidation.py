"""local_cache across instances (SPEC section 19; docs/stores.md, "local_cache").

Two idemd with local_cache on share one Redis (and again one PostgreSQL):
the shared test servers named by $IDEM_TEST_REDIS_URL and $IDEM_TEST_PG_URL,
each test on its own key prefix / table.  Instance B answers a key, then
replays it from its cache (idem_local_cache_hits_total moves).

  delete through A   the admin DELETE on A; B runs the key again (the
                     upstream sees it a second time, no replay header) once
                     the invalidation arrives.  Decided by polling B until
                     it runs the request fresh, with a deadline (5 s) to
                     fail; B counts the message as applied.
  missed message     the record is removed behind idemd's back (straight in
                     the store: a delete whose message B never hears), B
                     still replays it from its cache; then B's subscriber
                     connection is killed (CLIENT KILL TYPE pubsub;
                     pg_terminate_backend of the LISTEN backend): after it
                     reconnects B has emptied its cache and runs the key
                     fresh, and the connected gauge is 1 again.
  hostile message    a message on the channel that is not ours is counted
                     as malformed and changes nothing.

Without the invalidations B would replay the deleted key until its key_ttl
(10 minutes), so every test here fails when they break.
"""

import os
import shutil
import subprocess
import time
import unittest
import urllib.parse
import uuid

try:
    from . import harness as h
    from .test_shared_stores import (_with_option, pg_drop_table, redis_commands,
                                     redis_delete_prefix)
except ImportError:
    import harness as h
    from test_shared_stores import (_with_option, pg_drop_table, redis_commands,
                                    redis_delete_prefix)

DEADLINE = 5.0  # s for what should take about a second (a loaded 2-core box)
CONNECT_DEADLINE = 15.0  # s for a subscriber to (re)connect


def psql(url, sql):
    """Run sql on the server of a postgres:// URL; its output (tuples only)."""
    exe = shutil.which("psql") or os.path.join(h.pg_bin() or "", "psql")
    u = urllib.parse.urlsplit(url)
    conn = urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, "", ""))
    r = subprocess.run([exe, "-q", "-X", "-At", "-d", conn, "-c", sql],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                       check=True)
    return r.stdout


class InvalidationCases:
    """The body shared by the Redis and PostgreSQL classes below.  A
    subclass sets env and store_url, cleanup, remove_behind, kill_subscribers
    and publish_raw."""

    env = None

    def setUp(self):
        super().setUp()
        self.base_url = os.environ.get(self.env)
        if not self.base_url:
            self.skipTest("$%s is not set: no shared server to test on (scripts/services.sh "
                          "start DIR)" % self.env)
        self.tag = "bbci_%s" % uuid.uuid4().hex[:16]
        self.addCleanup(self.cleanup, self.base_url, self.tag)
        self.up = self.start_upstream()
        url = self.store_url(self.tag)
        cfg = {"local_cache": 1000, "defaults": {"key_ttl": "10m"}}
        self.a = self.start_idemd(self.up, cfg, store=url, name="idemd-a")
        self.b = self.start_idemd(self.up, cfg, store=url, name="idemd-b")
        for d in (self.a, self.b):
            self.wait_connected(d)

    def gauge(self, d):
        return h.metric_sum(d.metrics(), "idem_cache_invalidation_connected")

    def wait_connected(self, d):
        deadline = time.monotonic() + CONNECT_DEADLINE
        while self.gauge(d) != 1:
            if time.monotonic() >= deadline:
                self.fail("%s: idem_cache_invalidation_connected not 1 within %.0f s"
                          % (d.name, CONNECT_DEADLINE))
            time.sleep(0.02)

    def cached_on_b(self):
        """A key run once (through A), then replayed by B from the store and
        then from B's cache; the key and its first answer."""
        key = h.new_key("ci")
        first = self.a.post(key=key)
        self.assertEqual(first.status, 200, first)
        self.assertReplayOf(self.b.post(key=key), first)  # B reads the store, keeps it
        hits = h.metric_sum(self.b.metrics(), "idem_local_cache_hits_total")
        self.assertReplayOf(self.b.post(key=key), first)
        self.assertEqual(h.metric_sum(self.b.metrics(), "idem_local_cache_hits_total"),
                         hits + 1, "B's replay did not come from its cache")
        self.assertEqual(self.up.count(key=key), 1)
        return key, first

    def wait_fresh_on_b(self, key, what):
        """Poll B with the key until the upstream runs it a second time."""
        deadline = time.monotonic() + DEADLINE
        while True:
            r = self.b.post(key=key)
            if self.up.count(key=key) == 2:
                self.assertEqual(r.status, 200, r)
                self.assertNotReplay(r)
                return
            self.assertEqual(r.header("X-Idempotent-Replay"), "true", r)
            if time.monotonic() >= deadline:
                self.fail("B still replays the key %.0f s after %s" % (DEADLINE, what))
            time.sleep(0.01)

    def test_delete_through_a_reaches_b(self):
        key, _ = self.cached_on_b()
        before = h.metric_sum(self.b.metrics(), "idem_cache_invalidations_total",
                              result="applied")
        self.assertEqual(self.a.delete_key(key).status, 204)
        self.wait_fresh_on_b(key, "A's DELETE")
        self.assertGreaterEqual(h.metric_sum(self.b.metrics(), "idem_cache_invalidations_total",
                                             result="applied"), before + 1)

    def test_bulk_delete_through_a_reaches_b(self):
        # A few keys: each is published on its own.
        key, _ = self.cached_on_b()
        r = self.a.admin("DELETE", "/keys?prefix=" + urllib.parse.quote(key, safe=""))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 1})
        self.wait_fresh_on_b(key, "A's DELETE /keys?prefix=")

    def test_large_bulk_delete_empties_b_cache(self):
        # More than a page's worth of keys published one by one: B is told
        # to forget everything once.
        key, _ = self.cached_on_b()
        prefix = "bulk-%s-" % uuid.uuid4().hex[:8]
        for i in range(70):
            self.assertEqual(self.a.post(key="%s%03d" % (prefix, i)).status, 200)
        r = self.a.admin("DELETE", "/keys?prefix=" + prefix)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"deleted": 70})
        # The cached key was not among them, but B's cache is emptied: its
        # next answer comes from the store (a replay still, nothing deleted).
        hits = h.metric_sum(self.b.metrics(), "idem_local_cache_hits_total")
        deadline = time.monotonic() + DEADLINE
        while True:
            self.b.post(key=key)
            got = h.metric_sum(self.b.metrics(), "idem_local_cache_hits_total")
            if got == hits:
                break  # answered without the cache: it was emptied
            hits = got
            if time.monotonic() >= deadline:
                self.fail("B kept its cache %.0f s after a bulk delete of 70 keys" % DEADLINE)
            time.sleep(0.01)
        self.assertEqual(self.up.count(key=key), 1)

    def test_missed_message_empties_the_cache_on_reconnect(self):
        key, first = self.cached_on_b()
        self.remove_behind(key)  # a delete whose message B never gets
        self.assertReplayOf(self.b.post(key=key), first)  # still in B's cache
        self.assertEqual(self.up.count(key=key), 1)
        self.kill_subscribers()
        self.wait_fresh_on_b(key, "B's subscriber was killed")
        self.wait_connected(self.b)

    def test_malformed_message_is_counted_and_ignored(self):
        key, first = self.cached_on_b()
        before = h.metric_sum(self.b.metrics(), "idem_cache_invalidations_total",
                              result="malformed")
        for payload in ("garbage", "d:not-a-scope:" + key, "d:anonymous:", "c:x"):
            self.publish_raw(payload)
        deadline = time.monotonic() + DEADLINE
        while h.metric_sum(self.b.metrics(), "idem_cache_invalidations_total",
                           result="malformed") < before + 4:
            if time.monotonic() >= deadline:
                self.fail("B did not count 4 malformed messages within %.0f s" % DEADLINE)
            time.sleep(0.02)
        self.assertReplayOf(self.b.post(key=key), first)
        self.assertEqual(self.up.count(key=key), 1)


class RedisInvalidation(InvalidationCases, h.IdemTestCase):
    env = "IDEM_TEST_REDIS_URL"

    def store_url(self, tag):
        return _with_option(self.base_url, "prefix", tag + "-")

    @staticmethod
    def cleanup(base_url, tag):
        try:
            redis_delete_prefix(base_url, tag + "-")
        except OSError:
            pass

    def remove_behind(self, key):
        self.assertEqual(redis_commands(self.base_url,
                                        [["DEL", "%s-anonymous:%s" % (self.tag, key)]]), [1])

    def kill_subscribers(self):
        killed = redis_commands(self.base_url, [["CLIENT", "KILL", "TYPE", "pubsub"]])[0]
        self.assertGreaterEqual(killed, 2)

    def publish_raw(self, payload):
        redis_commands(self.base_url, [["PUBLISH", self.tag + "-invalidate", payload]])


class PostgresInvalidation(InvalidationCases, h.IdemTestCase):
    env = "IDEM_TEST_PG_URL"

    def store_url(self, tag):
        return _with_option(self.base_url, "table", tag)

    @staticmethod
    def cleanup(base_url, tag):
        try:
            pg_drop_table(base_url, tag)
        except (OSError, subprocess.SubprocessError):
            pass

    def remove_behind(self, key):
        out = psql(self.base_url, "DELETE FROM \"%s\" WHERE scope = 'anonymous' AND key = '%s' "
                   "RETURNING 1" % (self.tag, key))
        self.assertEqual(out.split(), ["1"])

    def kill_subscribers(self):
        # Every idemd's LISTEN backend on the server: another test's only
        # reconnects (and empties its cache).
        out = psql(self.base_url, "SELECT count(pg_terminate_backend(pid)) FROM "
                   "pg_stat_activity WHERE application_name = 'idem listen'")
        self.assertGreaterEqual(int(out.strip()), 2)

    def publish_raw(self, payload):
        psql(self.base_url, "SELECT pg_notify('%s_invalidate', '%s')" % (self.tag, payload))


if __name__ == "__main__":
    unittest.main()
