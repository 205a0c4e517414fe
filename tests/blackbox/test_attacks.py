"""Hostile clients and upstreams (issue 19, second round): each test is one
attack that worked on an earlier idemd, run through the real binary.

- Slow bodies: connections that declare a large Content-Length and send a
  byte now and then hold what arrived, not what they declared, so they
  cannot take max_buffered_bytes from everyone else (SPEC section 8).
- Pipelining without reading: answers queued to clients that do not read
  are bounded by max_queued_bytes over all connections (overhead included,
  idem_queued_answer_bytes); such a connection reads no further request,
  and one whose queue makes no progress is closed after body_timeout.
- max_connections_per_address: one address past it is closed at once with
  503 overloaded; another address is not affected.
- An upstream's own replay marker (the configured replay_header) is neither
  relayed on a first answer nor stored and replayed beside idemd's.
- Response mixing through a pooled upstream connection: bytes an upstream
  sends beyond a complete response are never taken as another client's
  answer, nor stored under that client's key.

Every verdict waits for an event (a connection closed, a byte read by
idemd, a gauge reached) under a generous deadline; lower bounds only ever
fail by being late.
"""

import select
import socket
import struct
import threading
import time
import unittest

try:
    from . import harness as h
    from .test_limits import GENEROUS, connect, head, read_response, server_has_read
except ImportError:
    import harness as h
    from test_limits import GENEROUS, connect, head, read_response, server_has_read


def _server_side_state(s):
    """The TCP state (hex, as /proc/net/tcp says: "01" established) of the
    other end of s, or None once it is gone."""
    mine, theirs = s.getsockname(), s.getpeername()

    def addr(field):
        ip, port = field.split(":")
        return socket.inet_ntoa(struct.pack("=I", int(ip, 16))), int(port, 16)
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if addr(parts[1]) == theirs and addr(parts[2]) == mine:
                return parts[3]
    return None


def hung_up(s, timeout):
    """Wait until the peer of s has closed its end, without reading what it
    sent us (reading would drain its queue: progress).  Its FIN waits behind
    the answers our full window refuses, so a close shows in its socket's
    state (/proc/net/tcp) first, or as a reset.  True if within timeout."""
    p = select.poll()
    p.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + timeout
    while True:
        if p.poll(0) or _server_side_state(s) != "01":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


def sanitized(pid):
    """Whether the process runs under AddressSanitizer (its quarantine keeps
    freed memory resident, so its RSS says nothing about what is held)."""
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


# --------------------------------------------------------------------------
# slow bodies


class SlowBodies(h.IdemTestCase):
    SLOW = 26

    def test_slow_bodies_that_declare_much_do_not_take_the_budget(self):
        # Before: each body was charged its whole Content-Length at its head;
        # 26 connections declaring the largest body and sending one byte
        # held the whole budget, and every other POST got 503 overloaded.
        up, d = self.setup_pair({"max_request_bytes": "1MiB", "max_buffered_bytes": "4MiB",
                                 "header_timeout": "60s", "body_timeout": "60s"})
        slow = []
        try:
            for _ in range(self.SLOW):
                s = connect(d.port)
                slow.append(s)
                s.sendall(head(key=h.new_key(), headers=["Content-Length: 1048576"]) + b"x")
            h.wait_until(lambda: server_has_read(slow), GENEROUS, 0.05,
                         "idemd to read the slow heads and their first byte")
            h.wait_until(lambda: d.in_flight() >= self.SLOW, GENEROUS, 0.05,
                         "the slow requests in flight")
            held = h.metric_sum(d.metrics(), "idem_buffered_body_bytes")
            self.assertLess(held, 1024 * 1024, "the slow bodies hold %d bytes" % held)
            # an ordinary POST, and one of the largest size, are served
            key = h.new_key()
            r = d.post(key=key)
            self.assertEqual(r.status, 200, r)
            big = h.new_key()
            r = d.post(key=big, body=b"b" * (1024 * 1024))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(up.count(key=key), 1)
            self.assertEqual(len(up.requests(key=big)[0].body), 1024 * 1024)
            # the slow ones were not refused either: one finishes and is served
            for s in slow:
                s.setblocking(False)
                try:
                    got = s.recv(65536)
                    self.fail("a slow body was answered or closed: %r" % got[:300])
                except BlockingIOError:
                    pass
                s.setblocking(True)
                s.settimeout(GENEROUS)
            slow[0].sendall(b"x" * (1024 * 1024 - 1))
            r = read_response(slow[0])
            self.assertIsNotNone(r, "a slow body that finished got no answer")
            self.assertEqual(r.status, 200, r)
        finally:
            for s in slow:
                s.close()
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_buffered_body_bytes") == 0,
                     GENEROUS, 0.05, "the budget to come back")


# --------------------------------------------------------------------------
# pipelining without reading


ANSWER = 128 * 1024  # the stored answer replayed
QUEUE_CAP = 1024 * 1024


class PipelinedUnread(h.IdemTestCase):
    CONNS = 40
    PIPELINED = 100

    def stored_answer(self, body_timeout="2s"):
        """idemd with max_queued_bytes 1MiB in front of an upstream that
        answers ANSWER bytes; a key completed with it.  (d, key, body)"""
        up, d = self.setup_pair({"max_queued_bytes": "1MiB", "body_timeout": body_timeout,
                                 "header_timeout": "60s", "idle_timeout": "60s"})
        up.set_reply(body=b"r" * ANSWER, headers=[("Content-Type", "application/octet-stream")])
        key, body = h.new_key(), b'{"amount": 1}'
        r = d.post(key=key, body=body)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(r.body), ANSWER)
        return up, d, key, body

    def pipeliner(self, d, key, body, n, rcvbuf=4096):
        """A connection with a small receive buffer that sends n replays of
        key at once and never reads."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(GENEROUS)
        s.connect((h.HOST, d.port))
        one = head(key=key, headers=["Content-Length: %d" % len(body)]) + body
        s.sendall(one * n)
        return s

    def test_answers_queued_to_clients_that_do_not_read_are_bounded(self):
        up, d, key, body = self.stored_answer()
        base = rss_kib(d.proc.pid)
        conns = [self.pipeliner(d, key, body, self.PIPELINED) for _ in range(self.CONNS)]
        # the queue fills past the cap: every client's answers wait
        most = [0.0]

        def queued():
            v = h.metric_sum(d.metrics(), "idem_queued_answer_bytes")
            most[0] = max(most[0], v)
            return v
        h.wait_until(lambda: queued() >= QUEUE_CAP, GENEROUS, 0.02,
                     "idem_queued_answer_bytes to reach max_queued_bytes")
        # another client is still answered meanwhile, a replay and a new key
        r = d.post(key=key, body=body)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.header("X-Idempotent-Replay"), "true")
        r = d.post(key=h.new_key())
        self.assertEqual(r.status, 200, r)
        # the pipelining clients make no progress: each is closed after
        # body_timeout (2s) without progress; until then the queue stays
        # under the cap plus one answer a connection (a connection with
        # nothing queued may always answer one more), each counted with its
        # write's overhead: the buffer it was framed in, up to twice its
        # size; and so does idemd's memory
        bound = QUEUE_CAP + self.CONNS * (2 * ANSWER + 16 * 1024)
        peak_rss = [0]
        for i, s in enumerate(conns):
            deadline = time.monotonic() + 60.0
            while not hung_up(s, 0.1):
                queued()
                peak_rss[0] = max(peak_rss[0], rss_kib(d.proc.pid))
                self.assertLess(time.monotonic(), deadline,
                                "pipelining connection %d was never closed" % i)
        self.assertGreaterEqual(most[0], QUEUE_CAP)
        self.assertLessEqual(most[0], bound,
                             "idem_queued_answer_bytes reached %d (bound %d)" % (most[0], bound))
        if not sanitized(d.proc.pid):
            grown = (peak_rss[0] - base) * 1024
            self.assertLess(grown, 64 * 1024 * 1024,
                            "idemd's RSS grew by %d bytes under %d unread pipelines"
                            % (grown, self.CONNS))
        # once they are gone, nothing stays queued
        h.wait_until(lambda: queued() == 0, GENEROUS, 0.05, "the queue to drain")
        self.assertEqual(d.post(key=key, body=body).status, 200)

    def test_a_connection_whose_queue_makes_no_progress_is_closed(self):
        up, d, key, body = self.stored_answer()
        t0 = time.monotonic()
        s = self.pipeliner(d, key, body, 200)
        self.assertTrue(hung_up(s, 60.0),
                        "a client that never reads was held for 60s (body_timeout 2s)")
        self.assertGreaterEqual(time.monotonic() - t0, 1.6, "closed before body_timeout")
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_queued_answer_bytes") == 0,
                     GENEROUS, 0.05, "its queue to be given back")

    def test_a_reading_client_behind_the_queue_is_not_closed(self):
        # A client that reads its pipelined answers, slower than they are
        # made, so that its requests wait for its queue (past the 1MiB cap)
        # again and again, gets every one of them.  (body_timeout is long
        # here: progress is a whole write taken, and how long a client slowed
        # by a loaded machine takes to read one is no verdict.)
        up, d, key, body = self.stored_answer(body_timeout="60s")
        n = 40
        s = self.pipeliner(d, key, body, n, rcvbuf=16384)
        got = b""
        s.settimeout(GENEROUS)
        while True:
            chunk = s.recv(32 * 1024)
            self.assertTrue(chunk, "closed after %d of %d answers"
                            % (len(h.parse_responses(got)), n))
            got += chunk
            if len(got) >= n * ANSWER:
                rs = h.parse_responses(got)
                if len(rs) == n and len(rs[-1].body) == ANSWER:
                    break
            time.sleep(0.002)
        for r in rs:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.body, b"r" * ANSWER)


class UnreadLastAnswer(h.IdemTestCase):
    """A client that sends one request and never reads its answer: the
    queue that does not drain is closed after body_timeout (SPEC section 8)
    whatever the answer is, not only when a next request waits behind it:
    a closing answer (the connection ends after it) and a streamed answer
    paused on the client's queue (the upstream's timer stops with the
    pause) included."""

    DEADLINE = 20.0  # ten times body_timeout

    def unread(self, config, answer, headers=()):
        up, d = self.setup_pair(dict({"body_timeout": "2s"}, **config))
        up.set_reply(body=answer)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(GENEROUS)
        s.connect((h.HOST, d.port))
        s.sendall(head(key=h.new_key(), headers=["Content-Length: 2"] + list(headers)) + b"{}")
        # the answer is on its way and waits for the client
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_queued_answer_bytes") > 0,
                     GENEROUS, 0.05, "the answer to be queued")
        self.assertTrue(hung_up(s, self.DEADLINE),
                        "a client that never reads its answer was held %.0fs (body_timeout 2s)"
                        % self.DEADLINE)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_queued_answer_bytes") == 0,
                     GENEROUS, 0.05, "its queue to be given back")

    def test_a_closing_answer_never_read_is_closed(self):
        # 8 MiB stored and answered whole, with Connection: close
        self.unread({"defaults": {"max_response_bytes": "16MiB"}}, b"c" * (8 * 1024 * 1024),
                    headers=["Connection: close"])

    def test_a_streamed_answer_never_read_is_closed(self):
        # 16 MiB, past max_response_bytes: relayed as it comes, paused on
        # the client's queue
        self.unread({"max_queued_bytes": "1MiB"}, b"s" * (16 * 1024 * 1024))


# --------------------------------------------------------------------------
# max_connections_per_address


def connect_from(src, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(GENEROUS)
    s.bind((src, 0))
    s.connect((h.HOST, port))
    return s


class PerAddress(h.IdemTestCase):
    def served_on(self, s, path):
        s.sendall(head("GET", path))
        return read_response(s)

    def test_one_address_past_its_share_is_closed_another_is_not(self):
        up, d = self.setup_pair({"max_connections_per_address": 3,
                                 "header_timeout": "60s", "idle_timeout": "60s"})
        held = [connect_from("127.0.0.1", d.port) for _ in range(3)]
        try:
            for i, s in enumerate(held):
                r = self.served_on(s, "/held/%d" % i)
                self.assertIsNotNone(r)
                self.assertEqual(r.status, 200)
            data, closed = h.send_then_read_until_closed(connect_from("127.0.0.1", d.port),
                                                         head("GET", "/fourth"), GENEROUS)
            self.assertTrue(closed, "a 4th connection from one address was kept")
            rs = h.parse_responses(data)
            self.assertTrue(rs, "the 4th connection was closed without a word")
            self.assertProblem(rs[0], 503, "overloaded")
            self.assertRetryAfter(rs[0], 1)
            self.assertEqual(up.count(path="/fourth"), 0)
            self.assertGreaterEqual(h.metric_sum(d.metrics(), "idem_connections_refused_total",
                                                 listener="public"), 1)
            # another loopback address has its own share
            other = connect_from("127.0.0.2", d.port)
            try:
                r = self.served_on(other, "/other")
                self.assertIsNotNone(r, "a connection from 127.0.0.2 was refused")
                self.assertEqual(r.status, 200)
            finally:
                other.close()
            # the held ones still work
            r = self.served_on(held[2], "/again")
            self.assertIsNotNone(r)
            self.assertEqual(r.status, 200)
            # one closes: its place comes back
            held.pop(0).close()

            def served():
                s = connect_from("127.0.0.1", d.port)
                try:
                    r = self.served_on(s, "/after")
                    return r is not None and r.status == 200
                except OSError:
                    return False
                finally:
                    s.close()
            h.wait_until(served, GENEROUS, 0.1, "a place once one connection closed")
        finally:
            for s in held:
                s.close()


# --------------------------------------------------------------------------
# the upstream's own replay marker


class UpstreamReplayMarker(h.IdemTestCase):
    def test_the_upstreams_replay_header_is_never_relayed_or_replayed(self):
        up, d = self.setup_pair()
        up.set_reply(headers=[("X-Idempotent-Replay", "true"), ("Idempotent-Replayed", "yes"),
                              ("X-Other", "kept")], body=b"paid")
        key = h.new_key()
        first = d.post(key=key)
        self.assertEqual(first.status, 200, first)
        self.assertEqual(first.header_all("X-Idempotent-Replay"), [],
                         "the upstream's marker was relayed on a first answer: %r" % first)
        self.assertEqual(first.header_all("Idempotent-Replayed"), ["yes"])
        self.assertEqual(first.header("X-Other"), "kept")
        replay = d.post(key=key)
        self.assertEqual(replay.header_all("X-Idempotent-Replay"), ["true"],
                         "a replay carries idemd's marker once: %r" % replay)
        self.assertEqual(replay.header_all("Idempotent-Replayed"), ["yes"])
        self.assertReplayOf(replay, first)
        self.assertEqual(up.count(key=key), 1)

    def test_the_configured_replay_header_is_the_one_dropped(self):
        up, d = self.setup_pair({"replay_header": "Idempotent-Replayed"})
        up.set_reply(headers=[("X-Idempotent-Replay", "true"), ("idempotent-replayed", "yes")],
                     body=b"paid")
        key = h.new_key()
        first = d.post(key=key)
        self.assertEqual(first.status, 200, first)
        self.assertEqual(first.header_all("Idempotent-Replayed"), [],
                         "the upstream's marker was relayed on a first answer: %r" % first)
        self.assertEqual(first.header_all("X-Idempotent-Replay"), ["true"],
                         "a header that is not idemd's marker is the upstream's own")
        replay = d.post(key=key)
        self.assertEqual(replay.header_all("Idempotent-Replayed"), ["true"], replay)
        self.assertEqual(replay.header_all("X-Idempotent-Replay"), ["true"], replay)
        self.assertEqual(replay.body, first.body)


# --------------------------------------------------------------------------
# response mixing through a pooled upstream connection


STOLEN = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTOLE"


class RawUpstream:
    """An HTTP/1.1 upstream on a raw socket, one thread a connection.  The
    first request it is ever sent is answered with first_answer (bytes
    beyond a complete response among them, perhaps); then, on that same
    connection, `extra` is sent `delay` seconds later (self.extra_sent is
    set then), and `on_next` is sent before the answer to any later request
    that comes on it (the worst moment: idemd has just reused it for
    someone else).  Every other request gets its own answer, 200
    "own:<key>"."""

    def __init__(self, first_answer, extra=b"", delay=0.0, on_next=b""):
        self.first_answer = first_answer
        self.extra = extra
        self.delay = delay
        self.on_next = on_next
        self.extra_sent = threading.Event()
        self.lock = threading.Lock()
        self.requests = []  # (connection number, key)
        self.conns = 0
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((h.HOST, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = "http://%s:%d" % (h.HOST, self.sock.getsockname()[1])
        self.threads = [threading.Thread(target=self.accept_loop, daemon=True)]
        self.threads[0].start()

    def close(self):
        self.stop.set()
        for t in list(self.threads):
            t.join(10)
        self.sock.close()

    def accept_loop(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.conns += 1
                n = self.conns
            t = threading.Thread(target=self.serve, args=(c, n), daemon=True)
            self.threads.append(t)
            t.start()

    def recv_more(self, c):
        """More bytes from c (b"" at its end or when stopping)."""
        while True:
            try:
                return c.recv(65536)
            except socket.timeout:
                if self.stop.is_set():
                    return b""
            except OSError:
                return b""

    def read_request(self, c, buf):
        """One request (head and Content-Length body) from c: (key, rest),
        or (None, b"") when the connection ended."""
        while b"\r\n\r\n" not in buf:
            chunk = self.recv_more(c)
            if not chunk:
                return None, b""
            buf += chunk
        end = buf.index(b"\r\n\r\n") + 4
        key, length = None, 0
        for line in buf[:end].decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "idempotency-key":
                key = value.strip()
            elif name.strip().lower() == "content-length":
                length = int(value)
        while len(buf) < end + length:
            chunk = self.recv_more(c)
            if not chunk:
                return None, b""
            buf += chunk
        return key or "", buf[end + length:]

    def serve(self, c, n):
        c.settimeout(0.2)
        buf = b""
        carried_first = False
        try:
            while not self.stop.is_set():
                key, buf = self.read_request(c, buf)
                if key is None:
                    return
                with self.lock:
                    first = not self.requests
                    self.requests.append((n, key))
                if first:
                    carried_first = True
                    c.sendall(self.first_answer)
                    if self.extra:
                        self.stop.wait(self.delay)
                        c.sendall(self.extra)
                    self.extra_sent.set()
                    continue
                if carried_first and self.on_next:
                    c.sendall(self.on_next)
                own = b"own:" + key.encode()
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(own), own))
        except OSError:
            pass
        finally:
            c.close()


class ResponseMixing(h.IdemTestCase):
    def mixing(self, first_answer, extra=b"", delay=0.0, on_next=b"", first_status=200):
        up = RawUpstream(first_answer, extra, delay, on_next)
        self.addCleanup(up.close)
        d = self.start_idemd(up.url)
        ka, kb = h.new_key(), h.new_key()
        ra = d.post(key=ka)
        self.assertEqual(ra.status, first_status, ra)
        # whatever the upstream sends beyond A's answer by itself has
        # reached idemd before B is sent, while the connection that carried
        # A waits in the pool (or was closed)
        self.assertTrue(up.extra_sent.wait(GENEROUS))
        rb = d.post(key=kb)
        self.assertEqual(rb.status, 200, rb)
        self.assertEqual(rb.body, b"own:" + kb.encode(),
                         "B was answered with bytes the upstream sent for A")
        replay = d.post(key=kb)
        self.assertEqual(replay.header("X-Idempotent-Replay"), "true", replay)
        self.assertEqual(replay.body, b"own:" + kb.encode(), "B's key stored another answer")
        self.assertEqual([k for _, k in up.requests], [ka, kb])
        replay = d.post(key=ka)
        self.assertEqual(replay.status, first_status)
        self.assertEqual(replay.body, ra.body)
        return up

    # Bytes beyond a well-framed response, there before the next request:
    # the pooled connection is never used for it.

    def test_a_body_longer_than_its_content_length_sent_later_is_never_an_answer(self):
        self.mixing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", extra=STOLEN,
                    delay=0.2)

    def test_a_body_longer_than_its_content_length_at_once_is_never_an_answer(self):
        self.mixing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst" + STOLEN)

    def test_a_body_after_a_204_is_never_an_answer(self):
        self.mixing(b"HTTP/1.1 204 No Content\r\n\r\n", extra=STOLEN, delay=0.2,
                    first_status=204)

    # Framing in doubt, and the bytes come only once the next request is on
    # the connection: the connection must never have been reused.

    def doubtful(self, first_answer, first_status):
        up = self.mixing(first_answer, on_next=STOLEN, first_status=first_status)
        conn_of = dict((k, n) for n, k in up.requests)
        self.assertNotEqual(len(set(conn_of.values())), 1,
                            "a connection whose framing was in doubt was reused")

    def test_a_204_with_a_content_length_is_never_reused(self):
        self.doubtful(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", 204)

    def test_an_interim_answer_with_a_content_length_is_never_reused(self):
        self.doubtful(b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n"
                      b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", 200)
