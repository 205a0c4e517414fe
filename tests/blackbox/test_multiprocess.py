"""Several idemd processes sharing one store (docs/protocol.md sections 6 and 12).

Claiming is atomic across processes: of concurrent requests with one key sent
to different processes, exactly one is forwarded.  Completion is fenced: an
owner whose lease was taken over (here: a process frozen with SIGSTOP) can
neither overwrite the new owner's result nor pass on its own upstream answer;
it answers as a repeat would (the stored response, or 409).
"""

import signal
import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


# A lease outlives a renewal that comes late on a busy machine (renewed
# every third of it, it lapses only after two missed renewals), and a frozen
# owner's lease surely ends within LEASE + 1.5 s.
LEASE = 3.0


class SharedStoreBase(h.IdemTestCase):
    """Two idemd processes, a and b, on one store, in front of one upstream."""

    def setUp(self):
        super().setUp()
        if not h.store_is_shared():
            self.skipTest("the store cannot be shared between processes")
        self.up = self.start_upstream()
        store = h.store_url_for(self.tmp)
        self.cfg = {"defaults": {"lease": "%gs" % LEASE}, "upstream_timeout": "30s"}
        self.a = self.start_idemd(self.up, self.cfg, store=store, name="idemd-a")
        self.b = self.start_idemd(self.up, self.cfg, store=store, name="idemd-b")


class SharedStore(SharedStoreBase):
    def test_completed_in_one_process_is_replayed_by_the_other(self):
        k = h.new_key()
        first = self.a.post(key=k)
        self.assertReplayOf(self.b.post(key=k), first)
        self.assertEqual(self.up.count(), 1)

    def test_in_flight_in_one_process_is_409_in_the_other(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        self.up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: self.a.post(key=k))
        self.up.wait_seen(1)
        self.assertProblem(self.b.post(key=k), 409, "in-flight")
        gate.set()
        first = bg.result()
        self.assertReplayOf(self.b.post(key=k), first)
        self.assertEqual(self.up.count(), 1)

    def test_concurrent_duplicates_across_processes_run_once(self):
        self.up.set_reply(delay=0.3)
        keys = [h.new_key() for _ in range(10)]
        fns = []
        for k in keys:
            for d in (self.a, self.b, self.a, self.b):
                fns.append(lambda d=d, k=k: d.post(key=k, timeout=30))
        results = h.in_threads(fns)
        for r in results:
            self.assertNotIsInstance(r, BaseException, r)
            self.assertIn(r.status, (200, 409), r)
        for k in keys:
            self.assertEqual(self.up.count(key=k), 1, "key %s ran more than once" % k)
        self.assertEqual(sum(1 for r in results if r.status == 200 and not r.replayed),
                         len(keys))

    def test_deleted_in_one_process_is_gone_in_the_other(self):
        k = h.new_key()
        self.a.post(key=k)
        self.assertEqual(self.b.delete_key(k).status, 204)
        self.assertEqual(self.a.get_key(k).status, 404)
        self.assertFalse(self.a.post(key=k).replayed)


class FencedCompletion(SharedStoreBase):
    """A is frozen while its request runs; its lease ends; B takes the key
    over (fence + 1).  When A wakes up with its own upstream answer, it must
    not store it nor pass it on."""

    def freeze_a_and_take_over(self, second_reply):
        gate_a = threading.Event()
        self.addCleanup(gate_a.set)
        self.up.script(h.Reply(wait=gate_a, body=b"answer of A"), then=second_reply)
        k = h.new_key()
        bg_a = h.Background(lambda: self.a.post(key=k, timeout=60))
        first = self.up.wait_seen(1, key=k)[0]
        self.a.send_signal(signal.SIGSTOP)
        self.addCleanup(self.a.send_signal, signal.SIGCONT)
        time.sleep(LEASE + 1.5)  # A's lease runs out: A cannot renew while stopped
        return k, first, gate_a, bg_a

    def test_old_owner_answers_with_the_new_owners_stored_result(self):
        k, first, gate_a, bg_a = self.freeze_a_and_take_over(h.Reply(body=b"answer of B"))
        rb = self.b.post(key=k)
        self.assertEqual(rb.status, 200, rb)
        self.assertEqual(rb.body, b"answer of B")
        seen = self.up.requests(key=k)
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1].fence, first.fence + 1)
        gate_a.set()  # A's upstream request now gets its answer
        self.a.send_signal(signal.SIGCONT)
        ra = bg_a.result(30)
        self.assertEqual(ra.status, 200, ra)
        self.assertEqual(ra.body, b"answer of B", "A passed on its own upstream answer")
        # the record still holds B's result
        again = self.a.post(key=k)
        self.assertEqual(again.body, b"answer of B")
        self.assertEqual(self.a.get_key(k).json()["fence"], first.fence + 1)

    def test_old_owner_answers_409_while_the_new_owner_runs(self):
        gate_b = threading.Event()
        self.addCleanup(gate_b.set)
        k, first, gate_a, bg_a = self.freeze_a_and_take_over(
            h.Reply(wait=gate_b, body=b"answer of B"))
        bg_b = h.Background(lambda: self.b.post(key=k, timeout=60))
        self.up.wait_seen(2, key=k)
        gate_a.set()
        self.a.send_signal(signal.SIGCONT)
        ra = bg_a.result(30)
        self.assertProblem(ra, 409, "in-flight")
        gate_b.set()
        rb = bg_b.result(30)
        self.assertEqual(rb.body, b"answer of B")
        self.assertEqual(self.b.post(key=k).body, b"answer of B")
        self.assertEqual(self.up.count(key=k), 2)


if __name__ == "__main__":
    unittest.main()
