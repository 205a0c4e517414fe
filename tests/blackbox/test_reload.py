"""SPEC section 19: SIGHUP reads the configuration again.

Through the real idemd: the file it was started with is rewritten, idemd
gets SIGHUP, and what it does is decided by events (its log lines, the
answers that change), never by a fixed sleep.

  bad file        a file that does not load (YAML, unknown key, a check of
                  idem__config_validate) is one log line; the running
                  routes stay
  under load      a route added and a route's mode changed while threads
                  send keyed requests: every answer is 2xx, each key runs
                  once, and the new routes take effect
  in flight       a request that began before the SIGHUP finishes under the
                  configuration it began with (its key_ttl)
  TTL             a new key_ttl applies to keys stored after the SIGHUP; a
                  key stored before keeps its expiry
  restart keys    a changed `listen` (and `workers`) is logged as needing a
                  restart and ignored: idemd keeps serving where it was
"""

import os
import signal
import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

RELOADED = "SIGHUP: configuration read again"
KEPT = "the running configuration is kept"
GENEROUS = 60.0


class Reload(h.IdemTestCase):
    def rewrite(self, d, config):
        """Write config as d's file (with what argv() adds when everything
        comes from the file), atomically."""
        cfg = dict(config)
        if not d.use_flags:
            cfg.update({"listen": "%s:%d" % (h.HOST, d.port),
                        "admin": "%s:%d" % (h.HOST, d.admin_port),
                        "upstream": d.upstream, "store": d.store})
        self.write_raw(d, h.to_yaml(cfg) + "\n")

    def write_raw(self, d, text):
        tmp = d.config_path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, d.config_path)

    def sighup(self, d, marker, count):
        """SIGHUP, then wait for the count-th line holding marker."""
        d.send_signal(signal.SIGHUP)
        h.wait_until(lambda: d.log_text().count(marker) >= count or not d.running(), GENEROUS,
                     what="idemd to log %r" % marker)
        self.assertTrue(d.running(), "idemd died of SIGHUP")

    def lines(self, d, text):
        return [x for x in d.log_text().splitlines() if text in x]

    def expires_in(self, d, key):
        r = d.get_key(key)
        self.assertEqual(r.status, 200, r)
        return h.parse_time(r.json()["expires_at"]) - time.time()

    # ------------------------------------------------------------------

    def test_a_bad_file_is_one_line_and_keeps_the_running_routes(self):
        config = {"routes": [{"path": "/pay", "methods": ["POST"], "mode": "required"}]}
        up, d = self.setup_pair(config)
        self.assertProblem(d.post("/pay"), 400, "missing-key")
        self.assertEqual(d.post("/free").status, 200)  # no route: forwarded as is
        bad = [
            ("routes: [ {path: /free\n", "YAML syntax error"),
            ("routes:\n  - path: /free\n    colour: blue\n", "unknown key"),
            ("defaults:\n  lease: 3x\n", "not a duration"),
            ("defaults:\n  on_unknown_outcome: reconcile\n", "reconcile_url"),
        ]
        for n, (text, why) in enumerate(bad, 1):
            self.write_raw(d, text)
            self.sighup(d, KEPT, n)
            kept = self.lines(d, KEPT)
            self.assertEqual(len(kept), n, kept)
            self.assertIn(why, kept[-1])
            self.assertIn("error", kept[-1])
            self.assertNotIn(RELOADED, d.log_text())
            # the running routes: /pay still needs its key, /free has no route
            self.assertProblem(d.post("/pay"), 400, "missing-key")
            self.assertEqual(d.post("/free").status, 200)
        # a good file after them goes in
        self.rewrite(d, {"routes": [{"path": "/free", "methods": ["POST"],
                                     "mode": "required"}]})
        self.sighup(d, RELOADED, 1)
        self.assertProblem(d.post("/free"), 400, "missing-key")
        self.assertEqual(d.post("/pay").status, 200)
        self.assertEqual(d.stop(), 0)

    def test_a_route_change_under_load_fails_no_request(self):
        config = {"workers": 2,
                  "routes": [{"path": "/pay", "methods": ["POST"], "mode": "required"}]}
        up, d = self.setup_pair(config)
        stop = threading.Event()
        lock = threading.Lock()
        results, errors = [], []

        def load():
            while not stop.is_set():
                k = h.new_key("load")
                try:
                    r = h.request(d.port, "POST", "/pay", body=b'{"n": 1}', key=k, timeout=30)
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    with lock:
                        errors.append(repr(e))
                    continue
                with lock:
                    results.append((k, r))

        def n_results():
            with lock:
                return len(results)

        threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            h.wait_until(lambda: n_results() >= 20, GENEROUS, what="the load to be under way")
            # 1: a route added (/other now needs a key) and /pay made optional
            self.rewrite(d, {"workers": 2, "routes": [
                {"path": "/pay", "methods": ["POST"], "mode": "optional"},
                {"path": "/other", "methods": ["POST"], "mode": "required"}]})
            d.send_signal(signal.SIGHUP)
            h.wait_until(lambda: d.post("/other").status == 400, GENEROUS,
                         what="the added route to take effect")
            # /pay optional: without a key it is forwarded as is
            h.wait_until(lambda: d.post("/pay").status == 200, GENEROUS,
                         what="/pay to become optional")
            # 2: back to required, under the same load
            before = n_results()
            self.rewrite(d, config)
            d.send_signal(signal.SIGHUP)
            h.wait_until(lambda: d.post("/pay").status == 400, GENEROUS,
                         what="/pay to require its key again")
            h.wait_until(lambda: d.post("/other").status == 200, GENEROUS,
                         what="/other to have no route again")
            h.wait_until(lambda: n_results() >= before + 20, GENEROUS,
                         what="more requests after the reloads")
        finally:
            stop.set()
            for t in threads:
                t.join(GENEROUS)
        self.assertFalse(any(t.is_alive() for t in threads), "a load thread hangs")
        self.assertEqual(errors, [], "requests failed across the reload")
        for k, r in results:
            self.assertTrue(200 <= r.status < 300, "%s: %r" % (k, r))
            self.assertFalse(r.replayed, "%s: a new key replayed: %r" % (k, r))
        for k, _ in results:
            self.assertEqual(up.count(key=k), 1, "key %s ran %d times" % (k, up.count(key=k)))
        self.assertEqual(len(self.lines(d, RELOADED)), 2)
        self.assertEqual(self.lines(d, "needs a restart"), [])
        self.assertEqual(d.stop(), 0)

    def test_ttl_change_applies_to_new_keys_and_in_flight_requests_keep_theirs(self):
        config = {"defaults": {"key_ttl": "1h"}}
        up, d = self.setup_pair(config)
        before = h.new_key("before")
        self.assertEqual(d.post(key=before).status, 200)
        # a request in flight across the SIGHUP: held by the upstream
        release = threading.Event()
        self.addCleanup(release.set)
        slow = h.new_key("slow")
        up.behaviour = (lambda seen: h.Reply(wait=release, body=b"slow")
                        if seen.key == slow else h.Reply(body=b"ok"))
        bg = h.Background(lambda: d.post(key=slow, timeout=60))
        up.wait_seen(2, timeout=30)
        self.rewrite(d, {"defaults": {"key_ttl": "10m"}})
        self.sighup(d, RELOADED, 1)
        after = h.new_key("after")
        self.assertEqual(d.post(key=after).status, 200)
        release.set()
        r = bg.result(60)
        self.assertEqual((r.status, r.body), (200, b"slow"), r)
        # 1h for the keys whose requests began before, 10m for the new one
        self.assertGreater(self.expires_in(d, before), 50 * 60)
        self.assertGreater(self.expires_in(d, slow), 50 * 60)
        self.assertLess(self.expires_in(d, after), 11 * 60)
        self.assertGreater(self.expires_in(d, after), 8 * 60)
        # every key still replays
        self.assertTrue(d.post(key=before).replayed)
        self.assertTrue(d.post(key=slow).replayed)
        self.assertTrue(d.post(key=after).replayed)
        self.assertEqual(d.stop(), 0)

    def test_a_changed_listen_needs_a_restart_and_is_ignored(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {"workers": 1}, use_flags=False)
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 200)
        other = h.free_port()
        cfg = {"workers": 3, "defaults": {"key_ttl": "2h"}}
        self.rewrite(d, cfg)
        text = h.to_yaml(dict(cfg, listen="%s:%d" % (h.HOST, other),
                              admin="%s:%d" % (h.HOST, d.admin_port),
                              upstream=d.upstream, store=d.store))
        self.write_raw(d, text + "\n")
        self.sighup(d, RELOADED, 1)
        restart = self.lines(d, "needs a restart")
        self.assertEqual(len(restart), 1, restart)
        self.assertIn("listen", restart[0])
        self.assertIn("workers", restart[0])
        self.assertNotIn("key_ttl", restart[0])
        # still on the old address, nothing on the new one
        self.assertReplayOf(d.post(key=k), first)
        with self.assertRaises(OSError):
            h.request(other, "GET", "/", timeout=2)
        # the rest of the file went in: the new key_ttl
        k2 = h.new_key()
        self.assertEqual(d.post(key=k2).status, 200)
        self.assertGreater(self.expires_in(d, k2), 100 * 60)
        self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main()
