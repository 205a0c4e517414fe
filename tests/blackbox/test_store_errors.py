"""docs/protocol.md section 9: when the store fails.

The failure made here is an LMDB map that is full (lmdb:PATH?map_size=small):
claims can no longer be written.
  on_store_error: closed (default) -> 503 store-unavailable + Retry-After,
                                      nothing forwarded
  on_store_error: open             -> forwarded without idempotency, the
                                      answer carries Idempotency-Bypassed:
                                      store-unavailable
Both count outcome="store_error".  /readyz is 200 while the store answers
and has room; a full store makes it 503, problem type store-full (section
13), until a write fits again (/readyz tries one while the store is
full, so it turns 200 as soon as room is made, traffic or not).

An embedded store also says how much room it has left (idem_store_space):
idem_store_used_bytes and idem_store_free_bytes on /metrics, one line in
the log when it runs out, and /readyz 503 store-full while free is 0, before
any request was refused.  That is made here with rocksdb:'s min_free set
above the disk.
"""

import http.client
import os
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

MAP_SIZE = "256KiB"
MAX_FILL = 20000
FULL_STREAK = 5


def small_store(tmp):
    return "lmdb:%s?map_size=%s" % (os.path.join(tmp, "data"), MAP_SIZE)


class StoreFull(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        if not h.store_is_lmdb():
            self.skipTest("map full needs the lmdb store")

    def fill(self, d, up, until):
        """Send fresh keys (responses of 1 KiB, so records are large) until
        until(resp, key) is true; return (resp, key).  Every answer on the way
        must be the upstream's 200 or a store-unavailable 503."""
        up.set_reply(body=b"r" * 1024)
        conn = http.client.HTTPConnection(h.HOST, d.port, timeout=15)
        self.addCleanup(conn.close)
        self.filled = []  # keys whose answer was stored
        for i in range(MAX_FILL):
            k = h.new_key("fill%d" % i)
            try:
                r = h.request(d.port, "POST", "/pay", body=b"{}", key=k, conn=conn)
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = http.client.HTTPConnection(h.HOST, d.port, timeout=15)
                r = h.request(d.port, "POST", "/pay", body=b"{}", key=k, conn=conn)
            if until(r, k):
                return r, k
            if r.status != 200:
                self.assertProblem(r, 503, "store-unavailable")
            else:
                self.filled.append(k)
        self.fail("the store did not fill up after %d keys" % MAX_FILL)

    def test_closed_answers_503_and_forwards_nothing(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        r, k = self.fill(d, up, lambda r, k: r.status == 503 and up.count(key=k) == 0)
        self.assertProblem(r, 503, "store-unavailable")
        self.assertRetryAfter(r, 0)
        self.assertEqual(up.count(key=k), 0)

    def test_store_error_is_counted(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        r, k = self.fill(d, up, lambda r, k: r.status == 503 and up.count(key=k) == 0)
        before = d.outcome("store_error")
        self.assertGreaterEqual(before, 1)
        r = d.post(key=k, body=b"{}")
        if r.status == 503:
            self.assertEqual(d.outcome_reaches("store_error", before + 1), before + 1)

    def test_completed_keys_are_still_replayed_when_full(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        k0 = h.new_key()
        up.set_reply(body=b"early")
        first = d.post(key=k0, body=b"{}")
        self.fill(d, up, lambda r, k: r.status == 503 and up.count(key=k) == 0)
        n = up.count()
        self.assertReplayOf(d.post(key=k0, body=b"{}"), first)
        self.assertEqual(up.count(), n)

    def test_process_keeps_serving_when_full(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        self.fill(d, up, lambda r, k: r.status == 503 and up.count(key=k) == 0)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        self.assertEqual(d.request("GET", "/passthrough").status, 200)  # off: no store

    def test_open_forwards_without_idempotency(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {"on_store_error": "open"}, store=small_store(self.tmp))
        r, k = self.fill(d, up, lambda r, k: r.header("Idempotency-Bypassed") is not None)
        self.assertEqual(r.header("Idempotency-Bypassed"), "store-unavailable")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"r" * 1024)  # the upstream's answer
        self.assertEqual(up.count(key=k), 1)
        self.assertNotReplay(r)
        before = d.outcome("store_error")
        self.assertGreaterEqual(before, 1)


    def fill_up(self, d, up):
        """Fill until the store refuses FULL_STREAK claims in a row: LMDB
        may find room for a few more records after its first refusal, so
        one refusal does not yet mean that nothing fits."""
        streak = [0]

        def full(r, k):
            streak[0] = streak[0] + 1 if r.status == 503 and up.count(key=k) == 0 else 0
            return streak[0] >= FULL_STREAK
        return self.fill(d, up, full)

    def test_readyz_is_503_while_the_store_is_full(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        self.assertEqual(d.admin("GET", "/readyz").status, 200)
        self.fill_up(d, up)
        r = d.admin("GET", "/readyz")
        self.assertProblem(r, 503, "store-full")
        # Asked again, with no traffic in between: still full, still 503.
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        self.assertEqual(h.metric_sum(d.metrics(), "idem_store_full"), 1)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)

    def test_readyz_is_200_again_once_room_is_made_without_traffic(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store=small_store(self.tmp))
        self.fill_up(d, up)
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        # An operator removes records; no client sends anything meanwhile.
        removed = 0
        while d.admin("GET", "/readyz").status != 200:
            self.assertLess(removed, len(self.filled),
                            "/readyz stayed 503 after every record was removed")
            self.assertIn(d.delete_key(self.filled[removed]).status, (204, 503))
            removed += 1
        # With the rest removed too, requests are served again.  (The room
        # one removal makes may go to completions idemd is still retrying,
        # which may then set the gauge again: it is read only once the store
        # has room for everything.)
        for k in self.filled[removed:]:
            d.delete_key(k)
        self.assertEqual(d.post(key=h.new_key(), body=b"{}").status, 200)
        self.assertEqual(d.admin("GET", "/readyz").status, 200)
        self.assertEqual(h.metric_sum(d.metrics(), "idem_store_full"), 0)


TOKENS = "/_idem/tokens"
TOKEN_MAP_SIZE = "2MiB"  # about 7,000 tokens
MAX_TOKENS = 50000


class TokenIssueFull(h.IdemTestCase):
    """A token issue the store refuses for want of room is noted as a
    keyed request's is: /readyz 503 store-full and idem_store_full 1 (issue
    19: both stayed ready, since the note asked for room for no response
    at all, which a store at its edge still finds)."""

    def setUp(self):
        super().setUp()
        if not h.store_is_lmdb():
            self.skipTest("map full needs the lmdb store")

    def test_refused_token_issue_makes_readyz_503(self):
        up = self.start_upstream()
        d = self.start_idemd(up, store="lmdb:%s?map_size=%s" % (
            os.path.join(self.tmp, "data"), TOKEN_MAP_SIZE))
        self.assertEqual(d.admin("GET", "/readyz").status, 200)
        conn = http.client.HTTPConnection(h.HOST, d.port, timeout=15)
        self.addCleanup(conn.close)
        issued = 0
        while True:
            self.assertLess(issued, MAX_TOKENS, "the store took every token")
            r = h.request(d.port, "POST", TOKENS, conn=conn)
            if r.status != 201:
                break
            issued += 1
        self.assertGreater(issued, 0)
        self.assertProblem(r, 503, "store-unavailable")
        self.assertIn("full", r.json()["detail"])
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        self.assertEqual(h.metric_sum(d.metrics(), "idem_store_full"), 1)
        # Asked again with no traffic in between: still full.
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        self.assertEqual(d.admin("GET", "/healthz").status, 200)


# The stores that report their room on disk (idem_store_space).
SPACE_STORES = ("rocksdb", "lmdb")
# A reserve larger than any disk (min_free): the store has no room
# from its start, as when the disk really has less left than the reserve,
# which a test cannot make.
MIN_FREE_ABOVE_ANY_DISK = "16384GiB"


def fs_avail(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class StoreSpace(h.IdemTestCase):
    """docs/admin.md: idem_store_used_bytes and idem_store_free_bytes, the
    warning in the log, and /readyz 503 store-full while free is 0."""

    def reports_space(self):
        return (h.store_is_rocksdb() and "rocksdb" in SPACE_STORES) or \
            (h.store_is_lmdb() and "lmdb" in SPACE_STORES)

    def start_or_skip(self, up, store):
        d = self.make_idemd(up, store=store)
        try:
            d.start()
        except AssertionError:
            if "left out" in d.log_text():
                self.skipTest("this build of idemd has no RocksDB")
            raise
        return d

    def gauges(self, d):
        """/metrics once it shows both gauges (the sweeper thread asks the
        store at its start, then once a second)."""
        def both():
            m = d.metrics()
            names = {n for n, _, _ in m["samples"]}
            ok = {"idem_store_used_bytes", "idem_store_free_bytes"} <= names
            return m if ok else None
        m = h.wait_until(both, h.COUNT_TIMEOUT, what="idem_store_free_bytes on /metrics")
        self.assertEqual(m["types"].get("idem_store_free_bytes"), "gauge")
        self.assertEqual(m["types"].get("idem_store_used_bytes"), "gauge")
        return m

    def test_metrics_show_the_room_of_an_embedded_store(self):
        if not self.reports_space():
            self.skipTest("the store does not report its room on disk")
        up = self.start_upstream()
        d = self.start_or_skip(up, None)
        self.assertEqual(d.post(key=h.new_key()).status, 200)
        m = self.gauges(d)
        self.assertGreater(h.metric_sum(m, "idem_store_used_bytes"), 0)
        if fs_avail(self.tmp) >= 2 << 30:
            self.assertGreater(h.metric_sum(m, "idem_store_free_bytes"), 0)
            self.assertEqual(d.admin("GET", "/readyz").status, 200)

    def test_readyz_is_503_store_full_while_the_disk_has_no_room(self):
        if not self.reports_space():
            self.skipTest("the store does not report its room on disk")
        if fs_avail(self.tmp) >= 16 << 40:
            self.skipTest("the test's filesystem has 16 TiB free")
        engine = "rocksdb" if h.store_is_rocksdb() else "lmdb"
        path = os.path.join(self.tmp, "data")
        up = self.start_upstream()
        d = self.start_or_skip(up, "%s:%s?min_free=%s" % (engine, path, MIN_FREE_ABOVE_ANY_DISK))
        # ready? no, before any request was refused
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        # a new key is refused before it reaches the upstream
        k = h.new_key()
        self.assertProblem(d.post(key=k), 503, "store-unavailable")
        self.assertEqual(up.count(key=k), 0)
        self.assertProblem(d.admin("GET", "/readyz"), 503, "store-full")
        m = self.gauges(d)
        self.assertEqual(h.metric_sum(m, "idem_store_free_bytes"), 0)
        self.assertGreater(h.metric_sum(m, "idem_store_used_bytes"), 0)
        # the log says so in one line (not one a second)
        h.wait_until(lambda: "no room left for new records" in d.log_text(), h.COUNT_TIMEOUT,
                     what="the store-full line in the log")
        self.assertEqual(d.stop(), 0)
        self.assertEqual(d.log_text().count("no room left for new records"), 1, d.log_text())

        # the same directory with the default reserve: ready, and new keys run
        d2 = self.start_or_skip(up, "%s:%s" % (engine, path))
        self.assertEqual(d2.admin("GET", "/readyz").status, 200)
        k = h.new_key()
        self.assertEqual(d2.post(key=k).status, 200)
        self.assertEqual(up.count(key=k), 1)
        if fs_avail(self.tmp) >= 2 << 30:
            m = self.gauges(d2)
            self.assertGreater(h.metric_sum(m, "idem_store_free_bytes"), 0)


class ReadyWhenHealthy(h.IdemTestCase):
    def test_readyz_is_200_while_the_store_answers(self):
        up, d = self.setup_pair()
        r = d.admin("GET", "/readyz")
        self.assertEqual(r.status, 200, r)


if __name__ == "__main__":
    unittest.main()
