"""Graceful shutdown (docs/protocol.md section 14): SIGTERM/SIGINT stop accepting,
finish the requests in flight (storing their results) and exit 0."""

import signal
import socket
import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Shutdown(h.IdemTestCase):
    def in_flight_then_signal(self, sig):
        up = self.start_upstream()
        d = self.start_idemd(up, {"defaults": {"lease": "10s"}})
        up.set_reply(delay=1.5, body=b"finished")
        keys = [h.new_key() for _ in range(3)]
        bgs = [h.Background(lambda k=k: d.post(key=k)) for k in keys]
        up.wait_seen(3)
        d.send_signal(sig)
        for b in bgs:
            r = b.result()
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body, b"finished")
        self.assertEqual(d.stop(timeout=20), 0)
        return up, d, keys

    def test_sigterm_finishes_in_flight_requests_and_exits_0(self):
        self.in_flight_then_signal(signal.SIGTERM)

    def test_sigint_finishes_in_flight_requests_and_exits_0(self):
        self.in_flight_then_signal(signal.SIGINT)

    def test_results_of_in_flight_requests_are_stored(self):
        if not h.store_is_persistent():
            self.skipTest("the store does not survive a restart")
        up, d, keys = self.in_flight_then_signal(signal.SIGTERM)
        up.set_reply(body=b"ran again")
        d.start()
        for k in keys:
            r = d.post(key=k)
            self.assertEqual(r.status, 200)
            self.assertEqual(r.body, b"finished")
            self.assertTrue(r.replayed)
        self.assertEqual(up.count(), 3)

    def test_stops_accepting_new_requests(self):
        up = self.start_upstream()
        d = self.start_idemd(up)
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        bg = h.Background(lambda: d.post(key=h.new_key()))
        up.wait_seen(1)
        d.send_signal(signal.SIGTERM)

        # idemd handles the signal when it gets to it: wait (not a fixed
        # 0.5 s, which a busy machine can outlast) until it stopped listening.
        def refused():
            try:
                socket.create_connection((h.HOST, d.port), timeout=1).close()
                return False
            except OSError:
                return True
        h.wait_until(refused, 15, what="the listener to close after SIGTERM")
        late = h.new_key()
        try:
            r = d.post(key=late, timeout=3)
            self.assertNotEqual(r.status, 200, "a request was taken after SIGTERM")
        except (OSError, h.http.client.HTTPException):
            pass  # refused or closed: not accepted
        gate.set()
        self.assertEqual(bg.result().status, 200)
        self.assertEqual(d.stop(), 0)
        self.assertEqual(up.count(key=late), 0)

    def test_idle_keep_alive_connections_do_not_delay_exit(self):
        up = self.start_upstream()
        d = self.start_idemd(up)
        conns = []
        for _ in range(3):
            c = h.http.client.HTTPConnection(h.HOST, d.port, timeout=10)
            self.addCleanup(c.close)
            h.request(d.port, "POST", "/pay", body=b"x", key=h.new_key(), conn=c)
            conns.append(c)
        t0 = time.monotonic()
        self.assertEqual(d.stop(timeout=15), 0)
        self.assertLess(time.monotonic() - t0, 5.0, "idle connections held the shutdown")

    def test_no_requests_exit_quickly(self):
        up, d = self.setup_pair()
        t0 = time.monotonic()
        self.assertEqual(d.stop(), 0)
        self.assertLess(time.monotonic() - t0, 5.0)

    def test_listener_is_closed_after_exit(self):
        up, d = self.setup_pair()
        port = d.port
        self.assertEqual(d.stop(), 0)
        with self.assertRaises(OSError):
            socket.create_connection((h.HOST, port), timeout=1).close()


if __name__ == "__main__":
    unittest.main()
