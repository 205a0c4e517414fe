"""docs/protocol.md section 13: the admin listener.

  GET /healthz             200 while the process runs
  GET /readyz              200 when the store answers, else 503
  GET /metrics             Prometheus text: idem_requests_total{outcome=...},
                           upstream and store latency histograms, in-flight gauge
  GET /keys/{key}?scope=S  the record as JSON; 404 when none
  DELETE /keys/{key}?scope=S  removes it (204; 404 when none)
Unknown paths are 404 not-found and wrong methods 405 method-not-allowed,
both problem+json.  The admin API is not reachable on the public listener.
Its answers are framed as the public listener's are: HEAD gets the head
alone, an HTTP/1.0 client that keeps its connection is told so, 204 has no
framing field, and a client that waits for 100 Continue is invited.
"""

import socket
import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Health(h.IdemTestCase):
    def test_healthz(self):
        up, d = self.setup_pair()
        self.assertEqual(d.admin("GET", "/healthz").status, 200)

    def test_readyz(self):
        up, d = self.setup_pair()
        self.assertEqual(d.admin("GET", "/readyz").status, 200)

    def test_healthz_does_not_depend_on_the_upstream(self):
        d = self.start_idemd(None)  # nothing listens at the upstream
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        self.assertEqual(d.admin("GET", "/readyz").status, 200)

    def test_unknown_admin_path_is_404_problem(self):
        up, d = self.setup_pair()
        self.assertProblem(d.admin("GET", "/nope"), 404, "not-found")

    def test_wrong_method_is_405_problem(self):
        up, d = self.setup_pair()
        self.assertProblem(d.admin("POST", "/healthz"), 405, "method-not-allowed")
        self.assertProblem(d.admin("PUT", "/keys/abc"), 405, "method-not-allowed")

    def test_admin_is_not_served_on_the_public_listener(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        r = d.request("GET", "/keys/" + k)
        self.assertEqual(r.json().get("path"), "/keys/" + k)  # the upstream answered
        r = d.request("DELETE", "/keys/" + k)
        self.assertEqual(up.count(), 3)
        self.assertEqual(d.get_key(k).status, 200)  # still there


class Metrics(h.IdemTestCase):
    def test_metrics_is_prometheus_text(self):
        up, d = self.setup_pair()
        r = d.admin("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue((r.header("Content-Type") or "").startswith("text/plain"), r.headers)
        m = h.parse_metrics(r.text)
        self.assertEqual(m["types"].get("idem_requests_total"), "counter")

    def test_every_outcome_is_counted_once(self):
        up, d = self.setup_pair({"defaults": {"lease": "5s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        names = ["new", "replay", "in_flight", "mismatch", "missing_key", "invalid_key",
                 "passthrough"]
        m0 = d.metrics()
        before = {n: h.metric_sum(m0, "idem_requests_total", outcome=n) for n in names}
        k = h.new_key()
        d.post(key=k)                         # new
        d.post(key=k)                         # replay
        d.post(key=k, body=b"other")          # mismatch
        d.post()                              # missing_key
        d.post(key="")                        # invalid_key
        d.request("GET", "/x")                # passthrough
        up.set_reply(wait=gate)
        k2 = h.new_key()
        bg = h.Background(lambda: d.post(key=k2))   # new
        up.wait_seen(3)
        self.assertEqual(d.post(key=k2).status, 409)  # in_flight
        gate.set()
        bg.result()
        want = {"new": 2, "replay": 1, "in_flight": 1, "mismatch": 1, "missing_key": 1,
                "invalid_key": 1, "passthrough": 1}

        m1 = d.counted_metrics()  # every answer counted, none counted twice
        got = {n: h.metric_sum(m1, "idem_requests_total", outcome=n) - before[n] for n in names}
        self.assertEqual(got, want)

    def test_latency_histograms_exist_for_upstream_and_store(self):
        up, d = self.setup_pair()
        d.post(key=h.new_key())
        m = d.metrics()
        hists = [n for n, t in m["types"].items() if t == "histogram"]
        self.assertTrue([n for n in hists if "upstream" in n], "no upstream histogram: %r" % hists)
        self.assertTrue([n for n in hists if "store" in n], "no store histogram: %r" % hists)
        for name in hists:
            if "upstream" in name:
                self.assertGreaterEqual(h.metric_sum(m, name + "_count"), 1)
                buckets = [(l.get("le"), v) for n, l, v in m["samples"] if n == name + "_bucket"]
                self.assertIn("+Inf", [b for b, _ in buckets])

    def test_in_flight_gauge_follows_running_requests(self):
        up, d = self.setup_pair()
        gate = threading.Event()
        self.addCleanup(gate.set)
        m = d.metrics()
        gauges = [n for n, t in m["types"].items() if t == "gauge" and "flight" in n]
        self.assertTrue(gauges, "no in-flight gauge: %r" % m["types"])
        g = gauges[0]
        idle = h.metric_sum(m, g)
        up.set_reply(wait=gate)
        bgs = [h.Background(lambda: d.post(key=h.new_key())) for _ in range(2)]
        up.wait_seen(2)
        self.assertEqual(h.metric_sum(d.metrics(), g), idle + 2)
        gate.set()
        for b in bgs:
            b.result()
        h.wait_until(lambda: h.metric_sum(d.metrics(), g) == idle, h.COUNT_TIMEOUT,
                     what="gauge back to idle")


class Keys(h.IdemTestCase):
    def test_get_completed_record(self):
        up, d = self.setup_pair({"defaults": {"key_ttl": "1h"}})
        up.set_reply(status=201)
        k = h.new_key()
        d.post(key=k)
        r = d.get_key(k)
        self.assertEqual(r.status, 200, r)
        self.assertTrue((r.header("Content-Type") or "").startswith("application/json"))
        doc = r.json()
        for field in ("scope", "key", "state", "fence", "fingerprint", "lease_expires_at",
                      "expires_at", "status"):
            self.assertIn(field, doc)
        self.assertEqual(doc["scope"], "anonymous")
        self.assertEqual(doc["key"], k)
        self.assertEqual(doc["state"], "completed")
        self.assertEqual(doc["status"], 201)
        self.assertEqual(doc["fence"], up.requests()[0].fence)
        self.assertRegex(doc["fingerprint"], r"^[0-9a-f]{64}$")
        exp = h.parse_time(doc["expires_at"])
        self.assertGreater(exp, time.time() + 3500)
        self.assertLess(exp, time.time() + 3700)

    def test_get_in_progress_record_has_no_status(self):
        up, d = self.setup_pair({"defaults": {"lease": "4s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k))
        up.wait_seen(1)
        doc = d.get_key(k).json()
        self.assertEqual(doc["state"], "in_progress")
        self.assertIsNone(doc.get("status"))
        lease = h.parse_time(doc["lease_expires_at"])
        self.assertGreater(lease, time.time())
        self.assertLess(lease, time.time() + 6)
        gate.set()
        bg.result()

    def test_get_unknown_key_is_404(self):
        up, d = self.setup_pair()
        r = d.get_key(h.new_key())
        self.assertEqual(r.status, 404)

    def test_scope_parameter_selects_the_caller(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k, headers={"Authorization": "Bearer alice"})
        scope = h.scope_of("Bearer alice")
        self.assertEqual(d.get_key(k).status, 404)  # default scope: anonymous
        self.assertEqual(d.get_key(k, scope="anonymous").status, 404)
        r = d.get_key(k, scope=scope)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["scope"], scope)

    def test_key_is_percent_decoded(self):
        up, d = self.setup_pair()
        k = h.new_key() + "/a b?c=d&e%f#g"
        d.post(key='"%s"' % k)
        r = d.get_key(k)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["key"], k)

    def test_delete_removes_a_completed_record(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        r = d.delete_key(k)
        self.assertEqual(r.status, 204)
        self.assertEqual(r.body, b"")
        self.assertEqual(d.get_key(k).status, 404)
        again = d.post(key=k)
        self.assertNotReplay(again)
        self.assertEqual(up.count(key=k), 2)

    def test_delete_unknown_key_is_404(self):
        up, d = self.setup_pair()
        self.assertEqual(d.delete_key(h.new_key()).status, 404)

    def test_delete_twice(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        self.assertEqual(d.delete_key(k).status, 204)
        self.assertEqual(d.delete_key(k).status, 404)

    def test_delete_honours_the_scope(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        d.post(key=k, headers={"Authorization": "Bearer bob"})
        bob = h.scope_of("Bearer bob")
        self.assertEqual(d.delete_key(k, scope=bob).status, 204)
        self.assertEqual(d.get_key(k, scope=bob).status, 404)
        self.assertEqual(d.get_key(k).status, 200)  # anonymous one untouched

    def test_delete_of_a_stuck_in_progress_record(self):
        up, d = self.setup_pair({"defaults": {"lease": "30s"}, "upstream_timeout": "1s"})
        up.script(h.Reply(action="close"), then=h.Reply(body=b"second"))
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 502)
        self.assertEqual(d.post(key=k).status, 409)  # stuck for 30 s
        self.assertEqual(d.delete_key(k).status, 204)
        r = d.post(key=k)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"second")


class Framing(h.IdemTestCase):
    """The admin's answers are framed as the public listener's are: one
    writer makes every head (src/http/writer.c)."""

    def exchange(self, d, data):
        got, closed = h.raw_exchange(d.admin_port, data, timeout=10.0)
        self.assertTrue(closed, "the admin kept a connection its client asked to close")
        return got

    def test_head_is_the_get_head_without_its_body_and_the_connection_goes_on(self):
        up, d = self.setup_pair()
        get = d.admin("GET", "/healthz")
        got = self.exchange(d, b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
                               b"GET /nope HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        end = got.index(b"\r\n\r\n") + 4
        head = h.parse_responses(got[:end])[0]
        self.assertEqual(head.status, 200)
        self.assertEqual(head.header("Content-Length"), str(len(get.body)))
        self.assertEqual(head.header("Content-Type"), get.header("Content-Type"))
        rest = h.parse_responses(got[end:])
        self.assertEqual(len(rest), 1, "a HEAD answer carried a body: %r" % got)
        # the next request's problem is whole, body included
        self.assertProblem(rest[0], 404, "not-found")

    def test_an_http10_client_that_keeps_its_connection_is_told_so(self):
        up, d = self.setup_pair()
        got = self.exchange(d, b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                               b"GET /healthz HTTP/1.0\r\n\r\n")
        rs = h.parse_responses(got)
        self.assertEqual([r.status for r in rs], [200, 200])
        self.assertEqual((rs[0].header("Connection") or "").lower(), "keep-alive")
        self.assertEqual((rs[1].header("Connection") or "").lower(), "close")

    def test_a_refused_request_after_a_head_gets_its_whole_problem(self):
        up, d = self.setup_pair()
        got = self.exchange(d, b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
                               b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        end = got.index(b"\r\n\r\n") + 4
        rest = h.parse_responses(got[end:])
        self.assertEqual(len(rest), 1, got)
        self.assertProblem(rest[0], 413, "request-too-large")
        self.assertEqual((rest[0].header("Connection") or "").lower(), "close")

    def test_a_body_awaiting_100_continue_is_invited_then_answered(self):
        up, d = self.setup_pair()
        s = socket.create_connection((h.HOST, d.admin_port), timeout=10.0)
        try:
            s.sendall(b"DELETE /keys/nothing-here HTTP/1.1\r\nHost: localhost\r\n"
                      b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            interim = b""
            while not interim.endswith(b"\r\n\r\n"):
                chunk = s.recv(1)
                self.assertTrue(chunk, "closed before the invitation")
                interim += chunk
            self.assertEqual(interim, b"HTTP/1.1 100 Continue\r\n\r\n")
            s.sendall(b"hello")
            s.shutdown(socket.SHUT_WR)
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        finally:
            s.close()
        rs = h.parse_responses(got)
        self.assertEqual(len(rs), 1, got)
        self.assertProblem(rs[0], 404, "not-found")

    def test_delete_answers_204_without_framing(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k)
        got = self.exchange(d, ("DELETE %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                                % d.key_path(k)).encode())
        rs = h.parse_responses(got)
        self.assertEqual([r.status for r in rs], [204])
        self.assertIsNone(rs[0].header("Content-Length"))
        self.assertIsNone(rs[0].header("Transfer-Encoding"))
        self.assertEqual(rs[0].body, b"")


if __name__ == "__main__":
    unittest.main()
