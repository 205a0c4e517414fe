"""Robustness of idemd's connection handling against awkward peers.

Each test here stands for a way a client or an upstream can behave that is
legal or at least common, and that once broke idemd: an upstream that answers
before reading the request body, a client that pipelines without reading, a
client that resets mid-response, a slow reader at shutdown, an upstream that
stalls mid-body, a client that half-closes after pipelining, a client that
lists Idempotency-Key in Connection, and the admin listener's HEAD and '+'.
"""
import os
import socket
import struct
import threading
import time

from tests.blackbox import harness as h


class RawUpstream:
    """A tiny HTTP/1.1 upstream on a raw socket, for behaviours http.server
    cannot produce.  handler(conn) is run in a thread per connection."""

    def __init__(self, handler):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((h.HOST, 0))
        self.sock.listen(64)
        self.url = "http://%s:%d" % (h.HOST, self.sock.getsockname()[1])
        self.handler = handler
        self.stop = threading.Event()
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.conns.append(c)
            threading.Thread(target=self._run, args=(c,), daemon=True).start()

    def _run(self, c):
        try:
            self.handler(c, self.stop)
        except OSError:
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def read_head(c):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class UpstreamBehaviour(h.IdemTestCase):
    def test_an_early_answer_before_the_body_is_read_does_not_break_the_next_request(self):
        # The upstream answers as soon as it has the head, keep-alive, and
        # only then reads the 8 MiB body slowly: idemd's write is still in
        # progress when the answer is complete.  Reusing that connection for
        # the next request crashed idemd.
        def handler(c, stop):
            while not stop.is_set():
                head, rest = read_head(c)
                if head is None:
                    return
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                left = content_length(head) - len(rest)
                time.sleep(0.3)
                while left > 0:
                    chunk = c.recv(min(left, 65536))
                    if not chunk:
                        return
                    left -= len(chunk)
        up = RawUpstream(handler)
        self.addCleanup(up.close)
        d = self.start_idemd(up.url)
        big = d.post(key=h.new_key(), body=b"x" * (8 << 20), timeout=30)
        self.assertEqual(big.status, 200, big)
        for _ in range(5):
            r = d.post(key=h.new_key(), body=b"{}")
            self.assertEqual(r.status, 200, r)
        self.assertTrue(d.running(), "idemd died")

    def test_an_upstream_stalling_mid_body_is_cut_after_upstream_timeout(self):
        # A body larger than max_response_bytes is relayed as it comes; when
        # the upstream falls silent, upstream_timeout still ends it.
        def handler(c, stop):
            head, _ = read_head(c)
            if head is None:
                return
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n" + b"y" * (1536 << 10))
            stop.wait(30)
        up = RawUpstream(handler)
        self.addCleanup(up.close)
        d = self.start_idemd(up.url, {"upstream_timeout": "1s",
                                      "defaults": {"max_response_bytes": "1MiB"}})
        t0 = time.monotonic()
        data, closed = h.raw_exchange(
            d.port, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n", timeout=8)
        self.assertTrue(closed, "the client connection was never closed")
        self.assertLess(time.monotonic() - t0, 6)
        self.assertLess(len(data), 4194304, "a cut body must not look complete")


class ClientBehaviour(h.IdemTestCase):
    def test_pipelining_without_reading_does_not_queue_answers_without_bound(self):
        up, d = self.setup_pair({"defaults": {"max_response_bytes": "2MiB"}})
        up.set_reply(body=b"r" * (1 << 20))
        key = h.new_key()
        self.assertEqual(d.post(key=key, body=b"{}").status, 200)
        before = rss_kib(d.proc.pid)
        req = ("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
               "Content-Length: 2\r\n\r\n{}" % key).encode()
        s = socket.create_connection((h.HOST, d.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.sendall(req * 300)  # 300 replays of 1 MiB each, never read
            time.sleep(2.0)
            grown = rss_kib(d.proc.pid) - before
        finally:
            s.close()
        self.assertLess(grown, 100 * 1024, "idemd grew by %d KiB for one slow reader" % grown)
        self.assertEqual(d.post(key=key, body=b"{}").status, 200)

    def test_a_client_reset_mid_response_frees_its_request(self):
        up, d = self.setup_pair({"defaults": {"max_response_bytes": "1MiB"}})
        up.set_reply(body=b"z" * (3 << 20), delay=0.5)
        s = socket.create_connection((h.HOST, d.port))
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        up.wait_answered(1)
        d.wait_idle()
        # A request still held would hold the shutdown until stop()'s 20 s
        t0 = time.monotonic()
        self.assertEqual(d.stop(), 0)
        self.assertLess(time.monotonic() - t0, 15, "shutdown waited for a request already gone")

    def test_sigterm_lets_a_slow_reader_have_the_whole_answer(self):
        size = 24 << 20
        up, d = self.setup_pair({"defaults": {"max_response_bytes": "32MiB"}})
        up.set_reply(body=b"s" * size)
        s = socket.create_connection((h.HOST, d.port))
        s.sendall(("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
                   "Content-Length: 2\r\nConnection: close\r\n\r\n{}" % h.new_key()).encode())
        got = s.recv(65536)
        up.wait_answered(1)
        time.sleep(0.5)  # the answer is queued in idemd now
        d.send_signal(15)
        s.settimeout(10)
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        self.assertEqual(len(body), size, "the answer was cut at shutdown")
        self.assertEqual(d.stop(), 0)

    def test_pipelined_requests_before_a_half_close_are_all_answered(self):
        up, d = self.setup_pair()
        data, closed = h.raw_exchange(
            d.port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
            timeout=5, shut_write=True)
        self.assertEqual([r.status for r in h.parse_responses(data)], [200, 200])
        self.assertTrue(closed)

    def test_connection_cannot_strip_the_key_on_its_way_up(self):
        up, d = self.setup_pair()
        key = h.new_key()
        r = d.post(key=key, headers={"Connection": "Idempotency-Key"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.requests()[0].header("Idempotency-Key"), key)


class AdminFraming(h.IdemTestCase):
    def test_head_healthz_has_no_body(self):
        up, d = self.setup_pair()
        data, _ = h.raw_exchange(d.admin_port,
                                 b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        self.assertEqual(body, b"")

    def test_plus_in_a_key_is_a_plus(self):
        up, d = self.setup_pair()
        self.assertEqual(d.post(key="a+b").status, 200)
        r = d.admin("GET", "/keys/a+b")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["key"], "a+b")
