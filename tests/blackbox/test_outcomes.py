"""docs/protocol.md section 7: what the upstream's outcome does to the record.

  2xx-4xx (not in release_statuses) -> completed for key_ttl; client gets it
  5xx                               -> completed for failure_ttl, then runs again
  in release_statuses (429, 503)    -> removed; a retry runs again
  could not connect                 -> removed; 502 upstream-unreachable
  sent, no complete answer          -> in_progress until the lease ends (409);
                                       504 (timeout) / 502, upstream-outcome-unknown;
                                       on_unknown_outcome: hold keeps it for key_ttl
  larger than max_response_bytes    -> completed without body; the client gets
                                       all of it; a repeat gets 409
                                       response-not-retained
Also: the forwarded request carries Idempotency-Key as received and
Idempotency-Fence.
"""

import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Forwarding(h.IdemTestCase):
    def test_forwarded_request_is_the_clients_plus_a_fence(self):
        up, d = self.setup_pair()
        k = '"%s"' % h.new_key()
        r = d.request("POST", "/orders/7?x=1&y=%20", body=b"payload",
                      headers=[("X-Custom", "c1"), ("Content-Type", "text/plain")], key=k)
        self.assertEqual(r.status, 200)
        # This request's copy, whatever else reached the upstream's port.
        mine = [s for s in up.requests() if s.header_all("Idempotency-Key") == [k]]
        self.assertEqual(len(mine), 1, up.requests())
        s = mine[0]
        self.assertEqual(s.method, "POST")
        self.assertEqual(s.path, "/orders/7?x=1&y=%20")
        self.assertEqual(s.body, b"payload")
        self.assertEqual(s.header("X-Custom"), "c1")
        self.assertEqual(s.header("Content-Type"), "text/plain")
        self.assertEqual(s.header_all("Idempotency-Key"), [k])
        self.assertRegex(s.header("Idempotency-Fence"), r"^\d+$")

    def test_client_supplied_fence_header_is_not_trusted(self):
        up, d = self.setup_pair()
        r = d.post(key=h.new_key(), headers={"Idempotency-Fence": "999999"})
        self.assertEqual(r.status, 200)
        fences = up.requests()[0].header_all("Idempotency-Fence")
        self.assertEqual(len(fences), 1, fences)
        self.assertNotEqual(fences[0], "999999")


class CompletedStatuses(h.IdemTestCase):
    def check_completed(self, status, body=b"answer"):
        up, d = self.setup_pair()
        up.set_reply(status=status, headers=[("X-S", str(status))], body=body)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, status)
        self.assertEqual(first.body, body)
        again = d.post(key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(), 1, "status %d was run twice" % status)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], status)

    def test_200(self):
        self.check_completed(200)

    def test_201(self):
        self.check_completed(201)

    def test_302(self):
        self.check_completed(302)

    def test_400(self):
        self.check_completed(400)

    def test_404(self):
        self.check_completed(404)

    def test_409_from_the_upstream(self):
        self.check_completed(409)

    def test_422_from_the_upstream(self):
        self.check_completed(422)

    def test_success_is_kept_for_key_ttl_not_failure_ttl(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1h", "failure_ttl": "1s"}})
        k = h.new_key()
        first = d.post(key=k)
        time.sleep(1.5)
        self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), 1)
        exp = h.parse_time(d.get_key(k).json()["expires_at"])
        self.assertGreater(exp, time.time() + 3000)
        self.assertLess(exp, time.time() + 3600 + 60)

    def test_success_expires_after_key_ttl(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1s", "failure_ttl": "1h"}})
        k = h.new_key()
        d.post(key=k)
        time.sleep(1.6)
        r = d.post(key=k)
        self.assertNotReplay(r)
        self.assertEqual(up.count(), 2)


class RetentionByStatus(h.IdemTestCase):
    """Section 7: every completed answer below 500 is kept for key_ttl, a
    5xx for failure_ttl.  Each verdict is the record's own expires_at on the
    admin listener (key_ttl 1h against failure_ttl 2s: no overlap), then a
    replay once the 5xx's record has run out, a moment read from that
    record rather than slept for."""

    KEY_TTL = 3600.0
    FAILURE_TTL = 2.0
    KEPT = (200, 201, 302, 400, 404, 409, 422, 451, 499)
    FAILED = (500, 502, 599)

    def ttl_left(self, d, k):
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed", doc)
        return h.parse_time(doc["expires_at"]) - time.time()

    def test_4xx_is_kept_for_key_ttl_and_5xx_for_failure_ttl(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1h", "failure_ttl": "2s"}})
        firsts = {}
        for status in self.KEPT + self.FAILED:
            up.set_reply(status=status, headers=[("X-S", str(status))],
                         body=b"answer %d" % status)
            k = h.new_key("s%d" % status)
            firsts[status] = (k, d.post(key=k))
            self.assertEqual(firsts[status][1].status, status)
        last_failure_end = 0.0
        for status, (k, _) in firsts.items():
            left = self.ttl_left(d, k)
            if status in self.KEPT:
                self.assertGreater(left, self.KEY_TTL - 120,
                                   "%d kept %.1fs, not key_ttl" % (status, left))
                self.assertLess(left, self.KEY_TTL + 60)
            else:
                self.assertLess(left, self.FAILURE_TTL + 1,
                                "%d kept %.1fs, not failure_ttl" % (status, left))
                last_failure_end = max(last_failure_end, time.time() + left)
        # Once every 5xx record has run out (the records say when), the 5xx
        # keys run again and every other answer is still replayed.
        h.wait_until(lambda: time.time() > last_failure_end + 0.2, timeout=30,
                     what="the 5xx records' expires_at")
        n = up.count()
        up.set_reply(status=200, body=b"second run")
        for status in self.KEPT:
            k, first = firsts[status]
            self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), n, "an answer below 500 ran again after failure_ttl")
        for status in self.FAILED:
            k, _ = firsts[status]
            r = d.post(key=k)
            self.assertNotReplay(r)
            self.assertEqual(r.body, b"second run")
        self.assertEqual(up.count(), n + len(self.FAILED))


class DefaultRetention(h.IdemTestCase):
    """Defaults (docs/protocol.md section 14): key_ttl 24h, failure_ttl 5m, lease 30s."""

    def test_success_is_kept_24h_by_default(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        exp = h.parse_time(d.get_key(k).json()["expires_at"])
        self.assertAlmostEqual(exp, time.time() + 24 * 3600, delta=120)

    def test_failure_is_kept_5m_by_default(self):
        up, d = self.setup_pair()
        up.set_reply(status=500)
        k = h.new_key()
        d.post(key=k)
        exp = h.parse_time(d.get_key(k).json()["expires_at"])
        self.assertAlmostEqual(exp, time.time() + 300, delta=30)

    def test_lease_is_30s_by_default(self):
        up, d = self.setup_pair()
        gate = h.threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        up.wait_seen(1)
        lease = h.parse_time(d.get_key(k).json()["lease_expires_at"])
        self.assertAlmostEqual(lease, time.time() + 30, delta=5)
        gate.set()
        bg.result()


class ServerErrors(h.IdemTestCase):
    def test_5xx_is_replayed_within_failure_ttl(self):
        up, d = self.setup_pair({"defaults": {"failure_ttl": "30s"}})
        up.set_reply(status=500, body=b"boom")
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 500)
        self.assertEqual(first.body, b"boom")
        again = d.post(key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(), 1)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], 500)
        exp = h.parse_time(doc["expires_at"])
        self.assertLess(exp, time.time() + 30 + 5)
        self.assertGreater(exp, time.time() + 20)

    def test_5xx_runs_again_after_failure_ttl(self):
        up, d = self.setup_pair({"defaults": {"failure_ttl": "1s", "key_ttl": "1h"}})
        up.script(h.Reply(status=502, body=b"bad gateway"), then=h.Reply(status=200))
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 502)
        time.sleep(1.6)
        r = d.post(key=k)
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        self.assertEqual(up.count(), 2)

    def test_500_and_599_are_failures(self):
        # failure_ttl long enough for the replays expected before it ends (a
        # busy machine), and slept out once for both.
        up, d = self.setup_pair({"defaults": {"failure_ttl": "3s", "key_ttl": "1h"}})
        keys = {}
        for status in (500, 599):
            up.set_reply(status=status)
            k = keys[status] = h.new_key()
            self.assertEqual(d.post(key=k).status, status)
            self.assertTrue(d.post(key=k).replayed)
        time.sleep(3.5)
        for status, k in keys.items():
            self.assertFalse(d.post(key=k).replayed, "status %d kept too long" % status)


class ReleaseStatuses(h.IdemTestCase):
    def check_released(self, status, d, up):
        up.script(h.Reply(status=status, headers=[("Retry-After", "7")], body=b"later"),
                  then=h.Reply(status=200, body=b"done"))
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, status)
        self.assertEqual(first.body, b"later")
        self.assertEqual(first.header("Retry-After"), "7")
        self.assertNotReplay(first)
        self.assertEqual(d.get_key(k).status, 404, "a released record is still there")
        again = d.post(key=k)
        self.assertEqual(again.status, 200)
        self.assertEqual(again.body, b"done")
        self.assertNotReplay(again)
        self.assertEqual(up.count(key=k), 2)

    def test_429_is_released_by_default(self):
        up, d = self.setup_pair()
        self.check_released(429, d, up)

    def test_503_is_released_by_default(self):
        up, d = self.setup_pair()
        self.check_released(503, d, up)

    def test_release_statuses_are_configurable(self):
        up, d = self.setup_pair({"defaults": {"release_statuses": [409, 500]}})
        self.check_released(409, d, up)
        self.check_released(500, d, up)

    def test_statuses_left_out_of_release_statuses_are_kept(self):
        up, d = self.setup_pair({"defaults": {"release_statuses": [409]}})
        up.set_reply(status=429)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 429)
        self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), 1)

    def test_empty_release_statuses_keeps_503(self):
        up, d = self.setup_pair({"defaults": {"release_statuses": []}})
        up.set_reply(status=503)
        k = h.new_key()
        d.post(key=k)
        self.assertTrue(d.post(key=k).replayed)
        self.assertEqual(up.count(), 1)


class Unreachable(h.IdemTestCase):
    def test_connection_refused_is_502_and_removes_the_record(self):
        d = self.start_idemd(None)  # upstream: a port where nothing listens
        k = h.new_key()
        r = d.post(key=k)
        self.assertProblem(r, 502, "upstream-unreachable")
        self.assertEqual(d.get_key(k).status, 404)
        # removed, not left in_progress: a retry is not 409 but tries again
        r = d.post(key=k)
        self.assertProblem(r, 502, "upstream-unreachable")

    def test_retry_runs_once_the_upstream_is_back(self):
        port = h.dead_port()
        d = self.start_idemd("http://%s:%d" % (h.HOST, port))
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 502)
        # start an upstream on that very port (dead_port held it meanwhile)
        up = h.Upstream(port=port)
        self.addCleanup(up.close)
        r = d.post(key=k)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(key=k), 1)


class UnknownOutcome(h.IdemTestCase):
    """The request was sent but no complete answer came back."""

    # The lease is long enough for the repeat expected before it ends to come
    # in time on a busy machine (the upstream_timeout takes 1 s of it).
    config = {"defaults": {"lease": "3s"}, "upstream_timeout": "1s"}

    def check_unknown(self, reply, status):
        up, d = self.setup_pair(self.config)
        up.script(reply, then=h.Reply(status=200, body=b"second"))
        k = h.new_key()
        t0 = time.monotonic()
        r = d.post(key=k)
        self.assertProblem(r, status, "upstream-outcome-unknown")
        fence1 = up.requests(key=k)[0].fence
        # still in_progress: a repeat is 409 and not forwarded
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "in_progress")
        rep = d.post(key=k)
        self.assertProblem(rep, 409, "in-flight")
        self.assertEqual(up.count(key=k), 1)
        # when the lease runs out the key runs again, with the next fence
        r2 = h.wait_until(lambda: (lambda x: x if x.status != 409 else None)(d.post(key=k)),
                          timeout=30, interval=0.1, what="the lease to end")
        self.assertEqual(r2.status, 200, r2)
        self.assertEqual(r2.body, b"second")
        seen = up.requests(key=k)
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1].fence, fence1 + 1)
        return time.monotonic() - t0

    def test_timeout_is_504_and_holds_the_key_until_the_lease_ends(self):
        self.check_unknown(h.Reply(delay=4.0), 504)

    def test_connection_closed_before_answer_is_502(self):
        self.check_unknown(h.Reply(action="close"), 502)

    def test_answer_cut_short_is_502(self):
        self.check_unknown(h.Reply(action="partial", body=b"x" * 1000), 502)

    def test_timeout_is_not_forwarded_twice_within_the_lease(self):
        # Margins for a busy machine: the upstream would answer after 10 s,
        # the 504 must come well before; repeats for 2 s, all of them well
        # inside the 8 s lease.
        up, d = self.setup_pair({"defaults": {"lease": "8s"}, "upstream_timeout": "500ms"})
        up.script(h.Reply(delay=10.0), then=h.Reply())
        k = h.new_key()
        t0 = time.monotonic()
        self.assertEqual(d.post(key=k).status, 504)
        self.assertLess(time.monotonic() - t0, 5.0, "upstream_timeout was not applied")
        while time.monotonic() - t0 < 2.0:
            self.assertEqual(d.post(key=k).status, 409)
            time.sleep(0.2)
        self.assertEqual(up.count(key=k), 1)


class HoldUnknownOutcome(h.IdemTestCase):
    config = {"defaults": {"lease": "1s", "on_unknown_outcome": "hold", "key_ttl": "1h"},
              "upstream_timeout": "1s"}

    def test_held_key_answers_409_outcome_unknown_after_the_lease(self):
        up, d = self.setup_pair(self.config)
        up.script(h.Reply(action="close"), then=h.Reply())
        k = h.new_key()
        self.assertProblem(d.post(key=k), 502, "upstream-outcome-unknown")
        time.sleep(2.0)  # well past the 1s lease
        r = d.post(key=k)
        self.assertProblem(r, 409, "upstream-outcome-unknown")
        self.assertEqual(up.count(key=k), 1)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "in_progress")
        self.assertGreater(h.parse_time(doc["expires_at"]), time.time() + 3000)

    def test_timeout_is_held_too(self):
        up, d = self.setup_pair(self.config)
        up.script(h.Reply(delay=3.0), then=h.Reply())
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        time.sleep(1.5)
        self.assertProblem(d.post(key=k), 409, "upstream-outcome-unknown")
        self.assertEqual(up.count(key=k), 1)

    def test_operator_removes_the_held_key_and_it_runs_again(self):
        up, d = self.setup_pair(self.config)
        up.script(h.Reply(action="close"), then=h.Reply(body=b"ran again"))
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 502)
        self.assertEqual(d.post(key=k).status, 409)
        self.assertEqual(d.delete_key(k).status, 204)
        r = d.post(key=k)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, b"ran again")
        self.assertEqual(up.count(key=k), 2)


class ResponseNotRetained(h.IdemTestCase):
    config = {"defaults": {"max_response_bytes": "1KiB"}}

    def test_large_answer_reaches_the_client_and_a_repeat_gets_409(self):
        up, d = self.setup_pair(self.config)
        body = bytes(i % 251 for i in range(5000))
        up.set_reply(status=201, headers=[("X-Big", "1")], body=body)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 201)
        self.assertEqual(first.body, body)
        self.assertEqual(first.header("X-Big"), "1")
        again = d.post(key=k)
        self.assertProblem(again, 409, "response-not-retained")
        self.assertEqual(up.count(), 1, "a repeat was executed again")
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], 201)

    def test_large_chunked_answer_reaches_the_client(self):
        up, d = self.setup_pair(self.config)
        body = b"abcdefghij" * 700
        up.set_reply(body=body, chunked=True)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.body, body)
        self.assertProblem(d.post(key=k), 409, "response-not-retained")
        self.assertEqual(up.count(), 1)

    def test_answer_of_exactly_max_response_bytes_is_retained(self):
        up, d = self.setup_pair(self.config)
        up.set_reply(body=b"m" * 1024)
        k = h.new_key()
        first = d.post(key=k)
        self.assertReplayOf(d.post(key=k), first)

    def test_answer_one_byte_over_is_not_retained(self):
        up, d = self.setup_pair(self.config)
        up.set_reply(body=b"m" * 1025)
        k = h.new_key()
        self.assertEqual(len(d.post(key=k).body), 1025)
        self.assertProblem(d.post(key=k), 409, "response-not-retained")

    def test_default_limit_is_1mib(self):
        up, d = self.setup_pair()
        up.set_reply(body=b"s" * (1024 * 1024))
        k = h.new_key()
        first = d.post(key=k)
        self.assertReplayOf(d.post(key=k), first)
        up.set_reply(body=b"s" * (1024 * 1024 + 1))
        k2 = h.new_key()
        self.assertEqual(len(d.post(key=k2).body), 1024 * 1024 + 1)
        self.assertProblem(d.post(key=k2), 409, "response-not-retained")


if __name__ == "__main__":
    unittest.main()
