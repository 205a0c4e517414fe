"""Issue 12 (hardening): no spelling of a request escapes its route, no 101
is relayed, SIGHUP does not kill, and no two idemd share a port.

docs/protocol.md section 5: request targets are origin-form (/path?query)
or absolute-form (http://authority/path); any other form is 400.  Routes
match the normalised path: escapes of unreserved characters are decoded
first, and a path with "." or ".." segments or an encoded "/" (and the
other constructs section 5 lists) is 400 invalid-target.  The same
normalised target is what the fingerprint hashes and what the upstream is
sent, and /_idem/tokens is idemd's own in every spelling.  Section 7: an
upstream 101 (idemd never forwards Upgrade, so no one asked for it) is a
broken response, 502.  Section 14: a second idemd on an address another
process holds exits 2 (EADDRINUSE); SIGHUP (a reload, test_reload.py) is
logged, and the request in flight answered.  Section 5 again: a method that differs from a routed
one only in case ("post") is 400 invalid-method, never forwarded.
"""

import os
import signal
import subprocess
import threading
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


def raw_request(method, target, headers=(), body=b"", host="example"):
    lines = ["%s %s HTTP/1.1" % (method, target)]
    if host is not None:
        lines.append("Host: %s" % host)
    lines.extend(headers)
    lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# A required route, a token route, and a catch-all that is off: the shape in
# which a spelling that misses its route is forwarded without a key.
ROUTES = {"routes": [
    {"methods": ["POST"], "path": "/payments", "mode": "required"},
    {"methods": ["POST"], "path": "/tokenized", "mode": "token"},
    {"methods": ["POST", "PATCH"], "path": "/", "mode": "off"},
]}


class TargetForms(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair(ROUTES)

    def refused(self, method, target, status=400, ptype="invalid-target", headers=()):
        raw = raw_request(method, target, headers=headers, body=b"{}")
        data, closed = h.raw_exchange(self.d.port, raw, timeout=5)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, "%s %s: %r" % (method, target, data[:300]))
        self.assertProblem(resps[0], status, ptype)
        self.assertTrue(closed, "%s %s: the connection stays open" % (method, target))
        self.assertEqual(self.up.count(), 0, "%s %s reached the upstream: %r"
                         % (method, target, self.up.requests()))
        return resps[0]

    def test_a_scheme_without_authority_is_400(self):
        # "http:/payments" and "payments:/payments" matched no route, so they
        # were off and reached the upstream with no key.
        for target in ("http:/payments", "payments:/payments", "http:payments",
                       "HTTP:/payments"):
            with self.subTest(target=target):
                self.refused("POST", target)

    def test_other_schemes_user_information_and_empty_authorities_are_400(self):
        for target in ("ftp://h/payments", "https+x://h/payments", "http:///payments",
                       "http://user@h/payments", "http://u:p@h/payments"):
            with self.subTest(target=target):
                self.refused("POST", target)

    def test_a_method_in_another_case_than_its_route_is_400_invalid_method(self):
        # Issue 19: "post" matched no POST route, so a required route was
        # forwarded with no key (and a token route with no token) to
        # upstreams that upper-case the method and run it as POST.
        for method in ("post", "Post"):
            for target, headers in (("/payments", ()), ("/payments", ("Idempotency-Key: k1",)),
                                    ("/tokenized", ()), ("/elsewhere", ())):
                with self.subTest(method=method, target=target, headers=headers):
                    r = self.refused(method, target, ptype="invalid-method", headers=headers)
                    self.assertIn(method, r.json()["detail"])
        # The exact spelling still meets its route.
        raw = raw_request("POST", "/payments", body=b"{}")
        resps = h.parse_responses(h.raw_exchange(self.d.port, raw, timeout=5)[0])
        self.assertProblem(resps[0], 400, "missing-key")
        self.assertEqual(self.up.count(), 0)

    def test_asterisk_form_is_400(self):
        self.refused("OPTIONS", "*")

    def test_authority_form_is_400_and_connect_is_501(self):
        self.refused("POST", "payments:443")
        self.refused("CONNECT", "example.com:443", status=501, ptype="not-implemented")
        self.refused("CONNECT", "/payments", status=501, ptype="not-implemented")

    def test_dot_segments_are_400_however_spelt(self):
        for target in ("/x/../payments", "/./payments", "/payments/.", "/x/..",
                       "/%2e%2e/payments", "/%2E/payments", "/.%2e/payments",
                       "http://h/x/../payments"):
            with self.subTest(target=target):
                self.refused("POST", target)

    def test_encoded_slash_backslash_and_nul_are_400(self):
        for target in ("/pay%2Fments", "/pay%2fments", "/x%2F..%2Fpayments", "/pay%5Cments",
                       "/pay%5cments", "/pay\\ments", "/payments%00", "/x%00/payments"):
            with self.subTest(target=target):
                self.refused("POST", target)

    def test_empty_segments_path_parameters_and_bad_escapes_are_400(self):
        for target in ("//payments", "/x//payments", "/;x/payments", "/payments;jsessionid=1",
                       "/%zzpayments", "/payments%", "/payments%2"):
            with self.subTest(target=target):
                self.refused("POST", target)

    def test_a_refused_target_is_refused_before_100_continue(self):
        raw = raw_request("POST", "/x/../payments", headers=["Expect: 100-continue"])
        # no body sent: the client waits for 100 Continue, which must not come
        raw = raw[:raw.index(b"\r\n\r\n") + 4].replace(b"Content-Length: 0", b"Content-Length: 5")
        data, closed = h.raw_exchange(self.d.port, raw, timeout=5)
        self.assertNotIn(b"100 Continue", data)
        resps = h.parse_responses(data)
        self.assertProblem(resps[-1], 400, "invalid-target")

    def test_an_escaped_spelling_matches_its_route(self):
        # "/%70ayments" fell to the catch-all (off) while the upstream read
        # "/payments".
        r = self.d.request("POST", "/%70ayments", body=b"{}")
        self.assertProblem(r, 400, "missing-key")
        r = self.d.request("POST", "/%70%61yments/7", body=b"{}")
        self.assertProblem(r, 400, "missing-key")
        self.assertEqual(self.up.count(), 0)

    def test_absolute_form_matches_its_route(self):
        r = self.d.request("POST", "http://api.example/payments", body=b"{}")
        self.assertProblem(r, 400, "missing-key")
        r = self.d.request("POST", "HTTP://api.example/%70ayments?x=1", body=b"{}")
        self.assertProblem(r, 400, "missing-key")
        self.assertEqual(self.up.count(), 0)

    def test_a_token_route_cannot_be_walked_around(self):
        for target in ("/%74okenized", "http://h/tokenized", "/tokeni%7Aed/1"):
            with self.subTest(target=target):
                r = self.d.request("POST", target, body=b"{}")
                self.assertProblem(r, 400, "missing-token")
        self.refused("POST", "http:/tokenized")
        self.assertEqual(self.up.count(), 0)

    def test_tokens_are_issued_in_absolute_form_and_escaped_spellings(self):
        for target in ("http://x/_idem/tokens", "/_idem/%74okens", "http://x/_idem/tokens?a=1"):
            with self.subTest(target=target):
                r = self.d.request("POST", target)
                self.assertEqual(r.status, 201, r)
                self.assertEqual(len(r.json()["token"]), 32)
        self.assertEqual(self.up.count(), 0)

    def test_the_upstream_is_sent_the_normalised_origin_form(self):
        k = h.new_key()
        raw = raw_request("POST", "http://api.example/%70ayments/%3a%c3%a9?q=%70&x=a/../b",
                          headers=["Idempotency-Key: " + k, "Connection: close"], body=b"{}",
                          host="client.example")
        data, _ = h.raw_exchange(self.d.port, raw, timeout=15)
        resps = h.parse_responses(data)
        self.assertEqual([r.status for r in resps], [200], data[:600])
        s = self.up.requests()[-1]
        self.assertEqual(s.path, "/payments/%3A%C3%A9?q=%70&x=a/../b")
        # absolute-form: the target's authority is the Host (RFC 9112 3.2.2)
        self.assertEqual(s.header_all("Host"), ["api.example"])
        # and origin-form keeps the client's Host
        self.d.request("POST", "/payments", body=b"{}", key=h.new_key())
        self.assertEqual(self.up.requests()[-1].header_all("Host"),
                         ["%s:%d" % (h.HOST, self.d.port)])

    def test_two_spellings_of_one_target_are_one_request(self):
        k = h.new_key()
        r1 = self.d.request("POST", "/payments/%7e1", body=b"{}", key=k)
        self.assertEqual(r1.status, 200, r1)
        for target in ("/payments/~1", "/%70ayments/%7E1", "http://h/payments/~1"):
            with self.subTest(target=target):
                r = self.d.request("POST", target, body=b"{}", key=k)
                self.assertReplayOf(r, r1)
        self.assertEqual(self.up.count(), 1)
        # but another path is another request
        r = self.d.request("POST", "/payments/~2", body=b"{}", key=k)
        self.assertProblem(r, 422, "key-reused")

    def test_off_routes_and_get_are_forwarded_normalised_too(self):
        r = self.d.request("GET", "/%61bc/%64?z")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.up.requests()[-1].path, "/abc/d?z")
        r = self.d.request("GET", "/a/../etc/passwd")
        self.assertProblem(r, 400, "invalid-target")
        self.assertEqual(self.up.count(), 1)

    def test_the_connection_goes_on_after_a_good_request(self):
        # only refused targets close the connection
        raw = raw_request("GET", "/%61") + raw_request("GET", "/b")
        data, _ = h.raw_exchange(self.d.port, raw + raw_request("GET", "//c"), timeout=5)
        resps = h.parse_responses(data)
        self.assertEqual([r.status for r in resps], [200, 200, 400], data[:600])
        self.assertEqual([s.path for s in self.up.requests()], ["/a", "/b"])


class RoutePrefixes(h.IdemTestCase):
    def test_a_route_prefix_is_matched_in_its_normal_spelling(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/v1/%70ay", "mode": "required"},
            {"methods": ["POST"], "path": "/v1/orders:cancel", "mode": "required"},
            {"methods": ["POST"], "path": "/", "mode": "off"},
        ]})
        for target in ("/v1/pay", "/v1/payments", "/v1/%70ay/x", "/v1/orders%3Acancel",
                       "/v1/orders%3acancel/7"):
            with self.subTest(target=target):
                self.assertProblem(d.request("POST", target, body=b"{}"), 400, "missing-key")
        self.assertEqual(up.count(), 0)

    def test_a_route_prefix_no_request_can_have_is_a_config_error(self):
        for path, why in (("/a/../b", "'.' or '..' segment"), ("//a", "empty segment"),
                          ("/a%2Fb", "encoded '/'"), ("/a;b", "';'")):
            with self.subTest(path=path):
                cfg = os.path.join(self.tmp, "bad.yaml")
                with open(cfg, "w") as f:
                    f.write(h.to_yaml({"routes": [{"path": path}]}) + "\n")
                p = subprocess.run([h.IDEMD, "--config", cfg, "-t"], capture_output=True,
                                   timeout=30)
                self.assertEqual(p.returncode, 2, p)
                err = p.stderr.decode()
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn("routes[0].path", err)
                self.assertIn(why, err)


class Upgrade101(h.IdemTestCase):
    # What a confused or hostile upstream sends: a 101 nobody asked for,
    # then bytes that look like a second answer.
    SMUGGLED = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()
        self.up.set_reply(status=101, headers=[("Upgrade", "h2c"), ("Connection", "Upgrade")],
                          body=self.SMUGGLED)

    def test_an_unasked_101_is_502_and_nothing_is_stored(self):
        k = h.new_key()
        r = self.d.post(key=k)
        self.assertProblem(r, 502, "upstream-outcome-unknown")
        self.assertNotIn(b"smuggled", r.body)
        # the outcome is unknown: a repeat is not a replay of the bytes after it
        r2 = self.d.post(key=k)
        self.assertProblem(r2, 409, "in-flight")
        self.assertNotIn(b"smuggled", r2.body)
        self.assertEqual(self.up.count(), 1)
        rec = self.d.get_key(k)
        self.assertEqual(rec.status, 200, rec)
        self.assertEqual(rec.json()["state"], "in_progress")

    def test_an_unasked_101_on_an_off_route_is_502(self):
        r = self.d.request("GET", "/x")
        self.assertProblem(r, 502, "upstream-outcome-unknown")
        self.assertNotIn(b"smuggled", r.body)

    def test_a_client_asking_for_an_upgrade_gets_502_too(self):
        # idemd relays no upgrades: Upgrade and Connection stay here
        r = self.d.request("GET", "/ws", headers={"Upgrade": "websocket",
                                                  "Connection": "Upgrade"})
        self.assertProblem(r, 502, "upstream-outcome-unknown")
        s = self.up.requests()[-1]
        self.assertIsNone(s.header("Upgrade"))
        self.assertIsNone(s.header("Connection"))

    def test_other_interim_answers_are_still_skipped(self):
        self.up.set_reply(status=103, headers=[("Link", "</a>; rel=preload")],
                          body=b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        k = h.new_key()
        r = self.d.post(key=k)
        self.assertEqual((r.status, r.body), (201, b"ok"), r)


class Sighup(h.IdemTestCase):
    def test_sighup_is_ignored_and_the_request_in_flight_is_answered(self):
        up, d = self.setup_pair()
        release = threading.Event()
        self.addCleanup(release.set)
        up.set_reply(wait=release, body=b"first")
        k = h.new_key()
        bg = h.Background(lambda: d.post(key=k, timeout=60))
        up.wait_seen(1, timeout=30)
        d.send_signal(signal.SIGHUP)
        # Decided by what idemd does with the signal, not by a delay: it logs
        # it (still running), or it dies of it.
        h.wait_until(lambda: "SIGHUP" in d.log_text() or not d.running(), 30,
                     what="idemd to take the SIGHUP")
        self.assertTrue(d.running(), "idemd died of SIGHUP (status %r)" % d.proc.poll())
        self.assertIn("configuration read again", d.log_text())
        release.set()
        r = bg.result(60)
        self.assertEqual((r.status, r.body), (200, b"first"), r)
        # still serving: a repeat replays, a new key runs
        self.assertReplayOf(d.post(key=k), r)
        self.assertEqual(d.post(key=h.new_key()).status, 200)
        d.send_signal(signal.SIGHUP)
        h.wait_until(lambda: d.log_text().count("SIGHUP") >= 2 or not d.running(), 30,
                     what="the second SIGHUP")
        self.assertEqual(d.stop(), 0)


class Listeners(h.IdemTestCase):
    def start_second(self, first, same):
        """Start an idemd with its own store whose --listen or --admin
        (same) is the first one's; return (exit status, stderr), failing
        if it becomes ready instead of exiting."""
        d2 = self.make_idemd(first.upstream, {}, name="second",
                             store=h.store_url_for(self.tmp, "data2"))
        d2.port, d2.admin_port = h.free_ports(2)
        if same == "listen":
            d2.port = first.port
        else:
            d2.admin_port = first.admin_port
        log = os.path.join(self.tmp, "second.stderr")
        d2.logs.append(log)
        with open(log, "wb") as err:
            d2.proc = subprocess.Popen(d2.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                       stderr=err, cwd=self.tmp)
        h._LIVE.add(d2.proc)

        def settled():
            if d2.proc.poll() is not None:
                return True
            if same == "listen":
                try:
                    return h.request(d2.admin_port, "GET", "/healthz", timeout=1).status == 200
                except OSError:
                    return False
            return False
        h.wait_until(settled, 30, what="the second idemd to exit or start")
        rc = d2.proc.poll()
        self.assertIsNotNone(rc, "a second idemd started on %s:%d, an address in use"
                             % (h.HOST, first.port if same == "listen" else first.admin_port))
        d2.proc.wait()
        h._LIVE.discard(d2.proc)
        return rc, d2.log_text()

    def test_a_second_idemd_on_the_same_listen_address_exits_2(self):
        up, d1 = self.setup_pair()
        rc, err = self.start_second(d1, "listen")
        self.assertEqual(rc, 2, err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertIn("--listen", lines[0])
        self.assertIn("%s:%d" % (h.HOST, d1.port), lines[0])
        self.assertIn("address already in use", lines[0].lower())
        # the first one goes on serving every connection
        for _ in range(20):
            self.assertEqual(d1.post(key=h.new_key()).status, 200)
        self.assertEqual(up.count(), 20)

    def test_a_second_idemd_on_the_same_admin_address_exits_2(self):
        up, d1 = self.setup_pair()
        rc, err = self.start_second(d1, "admin")
        self.assertEqual(rc, 2, err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertIn("--admin", lines[0])
        self.assertIn("%s:%d" % (h.HOST, d1.admin_port), lines[0])
        self.assertIn("address already in use", lines[0].lower())

    def test_several_workers_share_one_listening_socket(self):
        up, d = self.setup_pair(extra_args=["--workers", "3"])
        fns = [lambda: d.post(key=h.new_key()) for _ in range(60)]
        results = h.in_threads(fns, timeout=120)
        for r in results:
            self.assertNotIsInstance(r, BaseException, r)
            self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(), 60)
        self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main()
