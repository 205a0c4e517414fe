"""on_conflict: wait (docs/protocol.md section 6): a repeat of a key in flight is held
until the first request completes, then answered with the replay; when
wait_timeout runs out first it gets 409 in-flight."""

import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Wait(h.IdemTestCase):
    def test_repeat_is_held_then_replayed(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "10s"}})
        up.set_reply(delay=1.5, status=201, headers=[("X-W", "1")])
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        up.wait_seen(1)
        t0 = time.monotonic()
        r = d.post(key=k)
        waited = time.monotonic() - t0
        first = bg.result()
        self.assertEqual(first.status, 201)
        self.assertReplayOf(r, first)
        self.assertGreater(waited, 0.5, "the repeat was not held")
        self.assertEqual(up.count(), 1)

    def test_several_waiters_all_get_the_replay(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "10s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=30))
        up.wait_seen(1)
        waiters = [h.Background(lambda: d.post(key=k, timeout=30)) for _ in range(5)]
        time.sleep(0.5)
        self.assertFalse(any(w.done() for w in waiters), "a waiter was answered early")
        gate.set()
        first = bg.result()
        for w in waiters:
            self.assertReplayOf(w.result(), first)
        self.assertEqual(up.count(), 1)

    def test_wait_timeout_runs_out_with_409(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "1s",
                                              "lease": "10s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=30))
        up.wait_seen(1)
        t0 = time.monotonic()
        r = d.post(key=k)
        waited = time.monotonic() - t0
        self.assertProblem(r, 409, "in-flight")
        self.assertRetryAfter(r, 0)
        self.assertGreater(waited, 0.8, "gave up before wait_timeout")
        self.assertLess(waited, 4.0, "held past wait_timeout")
        gate.set()
        self.assertEqual(bg.result().status, 200)
        self.assertEqual(up.count(), 1)

    def test_waiting_repeat_with_another_body_is_not_held(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "10s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, body=b"one", timeout=30))
        up.wait_seen(1)
        t0 = time.monotonic()
        r = d.post(key=k, body=b"two")
        self.assertProblem(r, 422, "key-reused")
        self.assertLess(time.monotonic() - t0, 2.0)
        gate.set()
        bg.result()

    def test_reject_is_the_default(self):
        up, d = self.setup_pair()
        up.set_reply(delay=1.5)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        up.wait_seen(1)
        t0 = time.monotonic()
        self.assertProblem(d.post(key=k), 409, "in-flight")
        self.assertLess(time.monotonic() - t0, 1.0)
        bg.result()

    def test_waiter_of_a_failed_5xx_gets_the_same_5xx(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "10s"}})
        up.set_reply(delay=1.0, status=500, body=b"broken")
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        up.wait_seen(1)
        r = d.post(key=k)
        first = bg.result()
        self.assertReplayOf(r, first)
        self.assertEqual(up.count(), 1)


if __name__ == "__main__":
    unittest.main()
