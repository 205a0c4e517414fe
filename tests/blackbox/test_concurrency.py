"""Concurrency (docs/protocol.md section 6): atomic claims and lease renewal.

Of any number of concurrent requests with one key exactly one is forwarded;
the others get 409 in-flight or, once it completed, the replay.  While a
forwarded request runs its owner renews the lease every third of it, so a
slow upstream is never run twice.
"""

import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Duplicates(h.IdemTestCase):
    def check_duplicates(self, workers):
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "10s"}},
                             extra_args=["--workers", str(workers)])
        up.set_reply(delay=0.5)
        k = h.new_key()
        results = h.in_threads([lambda: d.post(key=k, timeout=30) for _ in range(50)])
        for r in results:
            self.assertNotIsInstance(r, BaseException, r)
        self.assertEqual(up.count(key=k), 1, "one key ran %d times" % up.count(key=k))
        firsts = [r for r in results if r.status == 200 and not r.replayed]
        self.assertEqual(len(firsts), 1, [r.status for r in results])
        for r in results:
            if r.status == 409:
                self.assertProblem(r, 409, "in-flight")
            else:
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.body, firsts[0].body)
        self.assertReplayOf(d.post(key=k), firsts[0])

    def test_50_concurrent_duplicates_run_once(self):
        self.check_duplicates(1)

    def test_50_concurrent_duplicates_run_once_with_4_workers(self):
        self.check_duplicates(4)

    def test_concurrent_distinct_keys_all_run(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {}, extra_args=["--workers", "2"])
        up.set_reply(delay=0.2)
        keys = [h.new_key() for _ in range(40)]
        results = h.in_threads([lambda k=k: d.post(key=k, timeout=30) for k in keys])
        for r in results:
            self.assertNotIsInstance(r, BaseException, r)
            self.assertEqual(r.status, 200, r)
            self.assertNotReplay(r)
        for k in keys:
            self.assertEqual(up.count(key=k), 1)

    def test_mixed_duplicates_and_mismatches(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "10s"}})
        up.set_reply(delay=0.3)
        k = h.new_key()
        fns = [lambda: d.post(key=k, body=b"A", timeout=30) for _ in range(10)] + \
              [lambda: d.post(key=k, body=b"B", timeout=30) for _ in range(10)]
        results = h.in_threads(fns)
        for r in results:
            self.assertNotIsInstance(r, BaseException, r)
        self.assertEqual(up.count(key=k), 1)
        winner = up.requests(key=k)[0].body
        for i, r in enumerate(results):
            body = b"A" if i < 10 else b"B"
            if body != winner:
                self.assertProblem(r, 422, "key-reused")
            else:
                self.assertIn(r.status, (200, 409), r)


class LeaseRenewal(h.IdemTestCase):
    def test_slow_upstream_keeps_its_lease(self):
        # lease 1 s, the upstream answers only when the test says so: without
        # renewal the lease would be gone at 1 s and a repeat at 2 s would run
        # the request again.  (Held on a gate, not a delay, so that the
        # repeats come while it runs however slow the machine is.)
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "1s"}, "upstream_timeout": "60s"})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate, body=b"slow answer")
        k = h.new_key()
        t0 = time.monotonic()
        bg = h.Background(lambda: d.post(key=k, timeout=90))
        up.wait_seen(1)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))  # at least 2 s: two leases
        r = d.post(key=k)
        self.assertProblem(r, 409, "in-flight")
        self.assertRetryAfter(r, 0, 2)
        time.sleep(0.7)
        self.assertProblem(d.post(key=k), 409, "in-flight")
        gate.set()
        first = bg.result()
        self.assertEqual(first.status, 200)
        self.assertEqual(first.body, b"slow answer")
        self.assertEqual(up.count(key=k), 1, "the slow request was run twice")
        self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(key=k), 1)

    def test_lease_expiry_moves_forward_while_running(self):
        # Renewed every third of the lease, the lease ends at least 2 s
        # after any moment (3 s less a third), so 3 s later it ends at least
        # 2 s later than before, and it is never in the past: a margin of a
        # second for a renewal that comes late on a busy machine.
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "3s"}, "upstream_timeout": "60s"})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=90))
        up.wait_seen(1)
        l1 = h.parse_time(d.get_key(k).json()["lease_expires_at"])
        time.sleep(3.0)
        l2 = h.parse_time(d.get_key(k).json()["lease_expires_at"])
        self.assertGreater(l2, l1 + 1.0, "the lease was not renewed")
        self.assertGreater(l2, time.time())
        gate.set()
        bg.result()

    def test_lease_is_renewed_every_third_of_a_lease(self):
        # Each renewal sets lease_expires_at to its own moment plus the
        # lease, so the steps between the values the admin record shows are
        # the intervals between renewals, whenever they are read: every
        # third of the lease (1 s), here allowed up to 1.75 s for a renewal
        # that comes late on a busy machine; one renewal per whole lease
        # makes steps of 3 s (issue 19: test_slow_upstream_keeps_its_lease
        # passed with it).  The upstream answers after 2.5 leases.
        lease = 3.0
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "3s"}, "upstream_timeout": "60s"})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=90))
        up.wait_seen(1)
        seen = [h.parse_time(d.get_key(k).json()["lease_expires_at"])]
        start = time.monotonic()
        while time.monotonic() - start < 2.5 * lease:
            doc = d.get_key(k).json()
            self.assertEqual(doc["state"], "in_progress", doc)
            v = h.parse_time(doc["lease_expires_at"])
            if v != seen[-1]:
                seen.append(v)
            time.sleep(0.05)  # a polling pace; the verdict is in the values
        gate.set()
        first = bg.result()
        self.assertEqual(first.status, 200)
        steps = [b - a for a, b in zip(seen, seen[1:])]
        self.assertGreaterEqual(len(steps), 2, "renewals seen: %r" % seen)
        self.assertLessEqual(max(steps), lease / 3 + 0.75,
                             "renewals %r s apart, not every third of the lease" % steps)
        self.assertEqual(up.count(key=k), 1, "the slow request was run twice")


if __name__ == "__main__":
    unittest.main()
