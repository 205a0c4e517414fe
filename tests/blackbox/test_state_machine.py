"""docs/protocol.md section 6: the state machine of a key, one test class per table row.

  nothing / past retention  -> claim (in_progress, fence, lease), forward once
  another fingerprint       -> 422 key-reused          (see test_fingerprint.py)
  in_progress, lease live   -> 409 in-flight + Retry-After (wait: test_wait.py)
  in_progress, lease gone   -> claim again with fence + 1 and forward
                               (also test_crash.py: the owner really died)
  completed                 -> replay exactly + X-Idempotent-Replay: true

Fenced completion needs two processes: test_multiprocess.py.  Lease renewal
under a slow upstream: test_concurrency.py.
"""

import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class NothingStored(h.IdemTestCase):
    def test_first_request_is_forwarded_once_with_a_fence(self):
        up, d = self.setup_pair()
        k = h.new_key()
        r = d.post(key=k, body=b'{"amount": 1}')
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        seen = up.requests()
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0].method, "POST")
        self.assertEqual(seen[0].path, "/pay")
        self.assertEqual(seen[0].body, b'{"amount": 1}')
        self.assertEqual(len(seen[0].header_all("Idempotency-Fence")), 1)
        self.assertIsInstance(seen[0].fence, int, "Idempotency-Fence %r" % seen[0].fence)
        self.assertGreaterEqual(seen[0].fence, 1)
        self.assertEqual(r.json()["exec"], 1)  # the upstream's own answer

    def test_client_gets_the_upstream_answer_unchanged(self):
        up, d = self.setup_pair()
        up.set_reply(status=201, headers=[("X-Order", "42"), ("Content-Type", "text/plain")],
                     body=b"created")
        r = d.post(key=h.new_key())
        self.assertEqual(r.status, 201)
        self.assertEqual(r.body, b"created")
        self.assertEqual(r.header("X-Order"), "42")
        self.assertEqual(r.header("Content-Type"), "text/plain")

    def test_record_is_in_progress_with_a_live_lease_while_forwarded(self):
        up, d = self.setup_pair({"defaults": {"lease": "5s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        seen = up.wait_seen(1)[0]
        rec = d.get_key(k)
        self.assertEqual(rec.status, 200, rec)
        doc = rec.json()
        self.assertEqual(doc["state"], "in_progress")
        self.assertEqual(doc["key"], k)
        self.assertEqual(doc["scope"], "anonymous")
        self.assertEqual(doc["fence"], seen.fence)
        lease = h.parse_time(doc["lease_expires_at"])
        self.assertGreater(lease, time.time())
        self.assertLess(lease, time.time() + 5 + 2)
        gate.set()
        self.assertEqual(bg.result().status, 200)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], 200)
        self.assertEqual(doc["fence"], seen.fence)

    def test_record_past_its_retention_is_claimed_again(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1s"}})
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 200)
        time.sleep(1.6)
        again = d.post(key=k)
        self.assertEqual(again.status, 200, again)
        self.assertNotReplay(again)
        self.assertEqual(up.count(key=k), 2)
        self.assertNotEqual(again.body, first.body)

    def test_record_past_its_retention_is_not_shown(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1s"}})
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 200)
        self.assertEqual(d.get_key(k).status, 200)
        time.sleep(1.6)
        self.assertEqual(d.get_key(k).status, 404)

    def test_retention_does_not_end_early(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "30s"}})
        k = h.new_key()
        first = d.post(key=k)
        time.sleep(1.2)
        self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), 1)

    def test_new_outcome_is_counted(self):
        up, d = self.setup_pair()
        before = d.outcome("new")
        d.post(key=h.new_key())
        self.assertEqual(d.outcome_reaches("new", before + 1), before + 1)


class InProgressLeaseLive(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"defaults": {"lease": "3s"}})
        self.gate = threading.Event()
        self.addCleanup(self.gate.set)
        self.up.set_reply(wait=self.gate)

    def test_repeat_gets_409_in_flight_with_retry_after(self):
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k))
        self.up.wait_seen(1)
        r = self.d.post(key=k)
        self.assertProblem(r, 409, "in-flight")
        self.assertRetryAfter(r, 0, 4)
        self.assertEqual(self.up.count(), 1)
        self.gate.set()
        self.assertEqual(bg.result().status, 200)

    def test_repeat_is_not_forwarded_and_later_replays(self):
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k))
        self.up.wait_seen(1)
        for _ in range(3):
            self.assertEqual(self.d.post(key=k).status, 409)
        self.gate.set()
        first = bg.result()
        self.assertEqual(first.status, 200)
        self.assertReplayOf(self.d.post(key=k), first)
        self.assertEqual(self.up.count(), 1)

    def test_in_flight_is_counted(self):
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k))
        self.up.wait_seen(1)
        before = self.d.outcome("in_flight")
        self.d.post(key=k)
        self.assertEqual(self.d.outcome_reaches("in_flight", before + 1), before + 1)
        self.gate.set()
        bg.result()

    def test_other_keys_are_not_blocked(self):
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k))
        self.up.wait_seen(1)
        self.up.set_reply(h.Reply())
        r = self.d.post(key=h.new_key())
        self.assertEqual(r.status, 200, r)
        self.gate.set()
        bg.result()


class InProgressLeaseExpired(h.IdemTestCase):
    """The first owner sent the request but never got an answer (the upstream
    closed the connection), so the record stays in_progress until its lease
    ends; then the key is claimed again with fence + 1."""

    def test_expired_lease_is_claimed_again_with_the_next_fence(self):
        # A 3 s lease: the repeat right after the 502 comes well inside it on
        # a busy machine too.  The lease began after t_sent, so the key can
        # be claimed again no sooner than LEASE after it, whatever the speed.
        lease = 3.0
        up, d = self.setup_pair({"defaults": {"lease": "3s"}, "upstream_timeout": "5s"})
        up.script(h.Reply(action="close"), then=h.Reply())
        k = h.new_key()
        t_sent = time.monotonic()
        first = d.post(key=k)
        self.assertProblem(first, 502, "upstream-outcome-unknown")
        fence1 = up.requests()[0].fence
        r = d.post(key=k)
        self.assertProblem(r, 409, "in-flight")
        r = h.wait_until(lambda: (lambda x: x if x.status != 409 else None)(d.post(key=k)),
                         timeout=lease + 20, interval=0.1, what="the lease to run out")
        # 50 ms: idemd's wall clock against this monotonic one
        self.assertGreater(time.monotonic() - t_sent, lease - 0.05, "lease ended too early")
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        seen = up.requests(key=k)
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1].fence, fence1 + 1)
        doc = d.get_key(k).json()
        self.assertEqual(doc["fence"], fence1 + 1)
        self.assertEqual(doc["state"], "completed")


class Completed(h.IdemTestCase):
    def test_replay_repeats_status_headers_and_body_exactly(self):
        # Every field, Set-Cookie too: replay_drop_headers' default [Set-Cookie]
        # is emptied here (test_replay_headers.py tests the default).
        up, d = self.setup_pair({"defaults": {"replay_drop_headers": []}})
        body = bytes(range(256)) + b"\r\n\x00end"
        up.set_reply(status=201, headers=[
            ("Content-Type", "application/octet-stream"),
            ("X-Order-Id", "o-17"),
            ("Set-Cookie", "a=1; Path=/"),
            ("Set-Cookie", "b=2; Path=/"),
            ("Location", "/orders/17"),
            ("Cache-Control", "no-store"),
        ], body=body)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 201)
        self.assertEqual(first.body, body)
        self.assertNotReplay(first)
        again = d.post(key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(again.body, body)
        self.assertEqual(again.header_all("Set-Cookie"), ["a=1; Path=/", "b=2; Path=/"])
        self.assertEqual(again.header("X-Order-Id"), "o-17")
        self.assertEqual(again.header("Content-Length"), str(len(body)))
        self.assertEqual(up.count(), 1)

    def test_every_repeat_gets_the_same_answer(self):
        up, d = self.setup_pair()
        k = h.new_key()
        first = d.post(key=k)
        for _ in range(5):
            self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), 1)

    def test_replay_of_an_empty_body(self):
        up, d = self.setup_pair()
        up.set_reply(status=204, headers=[("X-A", "1")], body=b"")
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 204)
        again = d.post(key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(again.body, b"")

    def test_replay_of_a_chunked_upstream_answer(self):
        up, d = self.setup_pair()
        body = b"0123456789" * 100
        up.set_reply(status=200, headers=[("X-A", "1")], body=body, chunked=True)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.body, body)
        again = d.post(key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(again.body, body)

    def test_hop_by_hop_headers_are_not_stored(self):
        up, d = self.setup_pair()
        up.set_reply(headers=[("X-Kept", "yes"), ("Keep-Alive", "timeout=5, max=100"),
                              ("Proxy-Example", "p"), ("Connection", "keep-alive, X-Conn"),
                              ("X-Conn", "named-by-connection"), ("Trailer", "X-T"),
                              ("Upgrade", "foo/2")],
                     body=b"ok")
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 200)
        again = d.post(key=k)
        self.assertEqual(again.status, 200)
        self.assertEqual(again.header("X-Kept"), "yes")
        for name in ("Keep-Alive", "Proxy-Example", "Trailer", "Upgrade"):
            self.assertIsNone(again.header(name), "%s was stored: %r" % (name, again))
        conn = (again.header("Connection") or "").lower()
        self.assertNotIn("x-conn", conn)

    def test_replay_is_counted(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        before = d.outcome("replay")
        d.post(key=k)
        self.assertEqual(d.outcome_reaches("replay", before + 1), before + 1)

    def test_replay_header_name_is_configurable(self):
        up, d = self.setup_pair({"replay_header": "X-Replayed"})
        k = h.new_key()
        first = d.post(key=k)
        self.assertIsNone(first.header("X-Replayed"))
        again = d.post(key=k)
        self.assertReplayOf(again, first, header="X-Replayed")
        self.assertIsNone(again.header("X-Idempotent-Replay"))

    def test_replay_on_a_keep_alive_connection(self):
        up, d = self.setup_pair()
        k = h.new_key()
        conn = h.http.client.HTTPConnection(h.HOST, d.port, timeout=10)
        self.addCleanup(conn.close)
        first = h.request(d.port, "POST", "/pay", body=b"x", key=k, conn=conn)
        again = h.request(d.port, "POST", "/pay", body=b"x", key=k, conn=conn)
        third = h.request(d.port, "POST", "/pay", body=b"x", key=h.new_key(), conn=conn)
        self.assertReplayOf(again, first)
        self.assertEqual(third.status, 200)
        self.assertNotReplay(third)
        self.assertEqual(up.count(), 2)

    def test_completed_record_keeps_the_status(self):
        up, d = self.setup_pair()
        up.set_reply(status=202, body=b"accepted")
        k = h.new_key()
        d.post(key=k)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], 202)
        self.assertGreater(h.parse_time(doc["expires_at"]), time.time())


if __name__ == "__main__":
    unittest.main()
