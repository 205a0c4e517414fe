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
    """The first request is held at the upstream on a gate, not on a delay,
    so that a repeat meets it in flight however slow the machine is; a
    repeat is sent only when idemd has it (idem_in_flight), and the gate
    opens after that."""

    def held_first(self, d, up, **reply):
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate, **reply)
        return gate

    def test_repeat_is_held_then_replayed(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "30s"}})
        gate = self.held_first(d, up, status=201, headers=[("X-W", "1")])
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1)
        rep = h.Background(lambda: d.post(key=k, timeout=60))
        d.wait_in_flight(2)
        # Not answered while the first is in flight (a 409 would be by now
        # most of the time; the replay check below catches it every time).
        self.assertFalse(rep.done(), "the repeat was answered before the first")
        gate.set()
        first = bg.result()
        self.assertEqual(first.status, 201)
        self.assertReplayOf(rep.result(), first)
        self.assertEqual(up.count(), 1)

    def test_several_waiters_all_get_the_replay(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "30s"}})
        gate = self.held_first(d, up)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1)
        waiters = [h.Background(lambda: d.post(key=k, timeout=60)) for _ in range(5)]
        d.wait_in_flight(6)
        self.assertFalse(any(w.done() for w in waiters), "a waiter was answered early")
        gate.set()
        first = bg.result()
        for w in waiters:
            self.assertReplayOf(w.result(), first)
        self.assertEqual(up.count(), 1)

    def test_wait_timeout_runs_out_with_409(self):
        # The lease (30 s) and the client's timeout (60 s) are far beyond
        # wait_timeout (1 s): a repeat held past it is not mistaken for one
        # that gave up in time, even on a slow machine.
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "1s",
                                              "lease": "30s"}})
        gate = self.held_first(d, up)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1)
        t0 = time.monotonic()
        r = d.post(key=k, timeout=60)
        waited = time.monotonic() - t0
        self.assertProblem(r, 409, "in-flight")
        self.assertRetryAfter(r, 0)
        self.assertGreater(waited, 0.8, "gave up before wait_timeout")
        self.assertLess(waited, 15.0, "held past wait_timeout")
        gate.set()
        self.assertEqual(bg.result().status, 200)
        self.assertEqual(up.count(), 1)

    def test_waiting_repeat_with_another_body_is_not_held(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "30s"}})
        gate = self.held_first(d, up)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, body=b"one", timeout=60))
        up.wait_seen(1)
        t0 = time.monotonic()
        r = d.post(key=k, body=b"two", timeout=60)
        self.assertProblem(r, 422, "key-reused")
        # held, it would be answered when the gate opens (below) or after
        # wait_timeout, 30 s
        self.assertLess(time.monotonic() - t0, 15.0)
        gate.set()
        bg.result()

    def test_reject_is_the_default(self):
        up, d = self.setup_pair()
        gate = self.held_first(d, up)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1)
        t0 = time.monotonic()
        # held, it would be answered only when the gate opens (below)
        self.assertProblem(d.post(key=k, timeout=30), 409, "in-flight")
        self.assertLess(time.monotonic() - t0, 15.0)
        gate.set()
        bg.result()

    def test_waiter_of_a_failed_5xx_gets_the_same_5xx(self):
        up, d = self.setup_pair({"defaults": {"on_conflict": "wait", "wait_timeout": "30s"}})
        gate = self.held_first(d, up, status=500, body=b"broken")
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1)
        rep = h.Background(lambda: d.post(key=k, timeout=60))
        d.wait_in_flight(2)
        gate.set()
        first = bg.result()
        self.assertEqual(first.status, 500)
        self.assertReplayOf(rep.result(), first)
        self.assertEqual(up.count(), 1)


if __name__ == "__main__":
    unittest.main()
