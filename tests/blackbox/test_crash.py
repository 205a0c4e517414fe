"""Crash recovery (docs/protocol.md sections 6 and 12): kill -9 idemd while it forwards.

The claim was durable before the request was forwarded, so after a restart
the key is still in_progress: repeats get 409 until the dead owner's lease
runs out, then the key runs once more with a higher Idempotency-Fence.
Completed records were durable before their answers were sent, so they are
replayed after the restart without running again.
"""

import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

# The lease outlives a kill and restart of idemd (ASan, a busy machine) by
# seconds; the dead owner renewed it every LEASE/3, so it ends between 2/3
# LEASE and LEASE after the kill.
LEASE = 6.0


class Crash(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        if not h.store_is_persistent():
            self.skipTest("the store does not survive a restart")
        self.up = self.start_upstream()
        self.d = self.make_idemd(self.up, {"defaults": {"lease": "%gs" % LEASE}})
        self.d.start()

    def test_in_flight_key_is_held_until_the_lease_ends_then_runs_with_a_higher_fence(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        self.up.script(h.Reply(wait=gate), then=h.Reply(body=b"after the crash"))
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k))
        first = self.up.wait_seen(1, key=k)[0]
        self.d.kill()
        t_kill = time.monotonic()
        with self.assertRaises(Exception):
            bg.result()  # the client lost its connection
        self.d.start()
        r = self.d.post(key=k)
        self.assertLess(time.monotonic() - t_kill, LEASE, "restart too slow for this test")
        self.assertProblem(r, 409, "in-flight")
        self.assertRetryAfter(r, 0, int(LEASE) + 1)
        doc = self.d.get_key(k).json()
        self.assertEqual(doc["state"], "in_progress")
        self.assertEqual(doc["fence"], first.fence)
        # poll until the dead owner's lease has run out
        while True:
            r = self.d.post(key=k)
            if r.status != 409:
                break
            self.assertLess(time.monotonic() - t_kill, LEASE + 20, "the lease never ran out")
            time.sleep(0.1)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, b"after the crash")
        seen = self.up.requests(key=k)
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1].fence, first.fence + 1)
        # from now on it is an ordinary completed key
        self.assertReplayOf(self.d.post(key=k), r)
        self.assertEqual(self.up.count(key=k), 2)

    def test_completed_keys_survive_a_crash(self):
        keys = [h.new_key() for _ in range(5)]
        firsts = [self.d.post(key=k) for k in keys]
        self.d.kill()
        self.d.start()
        for k, f in zip(keys, firsts):
            self.assertReplayOf(self.d.post(key=k), f)
        self.assertEqual(self.up.count(), 5)

    def test_completed_key_survives_a_crash_right_after_its_answer(self):
        # the answer was sent only after the record was durable
        k = h.new_key()
        first = self.d.post(key=k)
        self.d.kill()
        self.d.start()
        self.assertReplayOf(self.d.post(key=k), first)

    def test_5xx_record_survives_a_crash(self):
        self.up.set_reply(status=500, body=b"failed")
        k = h.new_key()
        first = self.d.post(key=k)
        self.d.kill()
        self.d.start()
        self.assertReplayOf(self.d.post(key=k), first)
        self.assertEqual(self.up.count(), 1)

    def test_crash_then_clean_restart_keeps_working(self):
        k = h.new_key()
        self.d.post(key=k)
        self.d.kill()
        self.d.start()
        self.assertEqual(self.d.stop(), 0)
        self.d.start()
        self.assertTrue(self.d.post(key=k).replayed)
        k2 = h.new_key()
        self.assertEqual(self.d.post(key=k2).status, 200)


if __name__ == "__main__":
    unittest.main()
