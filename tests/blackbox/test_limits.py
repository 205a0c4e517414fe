"""docs/protocol.md section 11, what a client may hold, and section 13's
admin listener under the same rules.

- header_timeout: a request head must arrive within it of its first byte; a
  head trickled a line at a time is cut (408 request-timeout, closed), a new
  connection that sends nothing is closed; idle_timeout closes an idle
  keep-alive connection.
- body_timeout: a body may not pause longer; the request never reaches the
  store, so its key is free for the retry.
- max_connections: more are closed at once, the admin listener still answers;
  idemd raises its open-files limit to fit, or refuses to start.
- max_buffered_bytes: a body is charged for what has arrived (its buffer as
  it grows), never for the Content-Length its head declares; a body piece
  that does not fit gets 503 overloaded with Retry-After and the connection
  ends; a body that fits next to it is served; the budget comes back.
- Expect: 100-continue is answered only after the route and key checks (the
  budget is charged as the body arrives, so it is not one of them).
- The admin listener: the same timeouts, 64 connections of its own, of
  which the longest-idle is closed to admit a new one (so idle clients never
  make /healthz fail), and only Host names that mean itself (DNS rebinding
  gets 421).

Everything is decided by behaviour over raw sockets.  A deadline is only ever
an upper bound that is generous ("closed at all within 15 s"); the lower
bounds ("not before about header_timeout") can only fail by being late, which
a busy machine never makes them.
"""

import os
import resource
import socket
import struct
import subprocess
import time

try:
    from . import harness as h
except ImportError:
    import harness as h

GENEROUS = 15.0  # an upper bound no loaded machine reaches


def head(method="POST", path="/pay", headers=(), key=None, host="example"):
    lines = ["%s %s HTTP/1.1" % (method, path)]
    if host is not None:
        lines.append("Host: %s" % host)
    if key is not None:
        lines.append("Idempotency-Key: %s" % key)
    lines.extend(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def connect(port):
    return h.connect(port, GENEROUS)


def read_until_closed(s, timeout=GENEROUS):
    return h.read_until_closed(s, timeout)


def read_response(s, timeout=GENEROUS):
    """Read one whole response (Content-Length framed) from s: Response or None."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        rs = h.parse_responses(data)
        rs = [r for r in rs if r.status >= 200]
        if rs:
            cl = rs[0].header("Content-Length")
            if cl is None or len(rs[0].body) >= int(cl):
                return rs[0]
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            return None
        if not chunk:
            return None
        data += chunk


def _proc_tcp():
    """The IPv4 TCP sockets of this machine from /proc/net/tcp:
    {(local (ip, port), remote (ip, port)): (tx_queue, rx_queue)}."""
    def addr(field):
        ip, port = field.split(":")
        return socket.inet_ntoa(struct.pack("=I", int(ip, 16))), int(port, 16)
    out = {}
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            tx, rx = parts[4].split(":")
            out[(addr(parts[1]), addr(parts[2]))] = (int(tx, 16), int(rx, 16))
    return out


def server_has_read(socks):
    """Whether the process at the other end of each connected socket has
    read every byte sent on it: nothing waits in our send queue, nor in the
    receive queue of its end (which only the accepting process reads, after
    accepting it).  An event to wait for (h.wait_until), never a sleep."""
    table = _proc_tcp()
    for s in socks:
        mine, theirs = s.getsockname(), s.getpeername()
        if table.get((mine, theirs), (1, 0))[0] != 0:
            return False
        if table.get((theirs, mine), (0, 1))[1] != 0:
            return False
    return True


def trickle(port, first, line=b"X-Slow: 1\r\n", interval=0.2, limit=GENEROUS):
    """Send first, then line every interval until the server closes (or
    limit).  Returns (received, closed, seconds from the first byte)."""
    s = connect(port)
    received = b""
    try:
        t0 = time.monotonic()
        s.sendall(first)
        while time.monotonic() - t0 < limit:
            s.settimeout(interval)
            try:
                chunk = s.recv(65536)
                if not chunk:
                    return received, True, time.monotonic() - t0
                received += chunk
                continue
            except socket.timeout:
                pass
            except ConnectionResetError:
                return received, True, time.monotonic() - t0
            try:
                s.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                more, _ = read_until_closed(s, 1.0)
                return received + more, True, time.monotonic() - t0
        return received, False, time.monotonic() - t0
    finally:
        s.close()


class LimitsCase(h.IdemTestCase):
    def problem_of(self, data, status, ptype):
        rs = h.parse_responses(data)
        self.assertTrue(rs, "no response in %r" % data[:300])
        self.assertEqual([r.status for r in rs if r.status < 200], [],
                         "an interim response was sent: %r" % data[:300])
        doc = self.assertProblem(rs[0], status, ptype)
        return rs[0], doc


# --------------------------------------------------------------------------
# header_timeout and idle_timeout


class HeaderTimeout(LimitsCase):
    def test_a_head_trickled_a_line_at_a_time_is_cut_at_header_timeout(self):
        up, d = self.setup_pair({"header_timeout": "1s"})
        got, closed, took = trickle(d.port, b"POST /pay HTTP/1.1\r\nHost: x\r\n")
        self.assertTrue(closed, "a head trickled for %.1fs was never cut" % took)
        self.assertGreaterEqual(took, 0.8, "cut before header_timeout")
        r, _ = self.problem_of(got, 408, "request-timeout")
        self.assertEqual((r.header("Connection") or "").lower(), "close")
        self.assertEqual(up.count(), 0)

    def test_a_new_connection_that_sends_nothing_is_closed(self):
        up, d = self.setup_pair({"header_timeout": "1s"})
        s = connect(d.port)
        t0 = time.monotonic()
        try:
            data, closed = read_until_closed(s)
        finally:
            s.close()
        self.assertTrue(closed, "a silent connection was held for %ds" % GENEROUS)
        self.assertGreaterEqual(time.monotonic() - t0, 0.8)
        self.assertEqual(data, b"", "nothing is said to a connection that asked nothing")

    def test_idle_keep_alive_connection_is_closed_after_idle_timeout(self):
        up, d = self.setup_pair({"header_timeout": "30s", "idle_timeout": "1s"})
        s = connect(d.port)
        try:
            s.sendall(head("GET", "/thing"))
            r = read_response(s)
            self.assertIsNotNone(r)
            self.assertEqual(r.status, 200)
            t0 = time.monotonic()
            data, closed = read_until_closed(s)
        finally:
            s.close()
        self.assertTrue(closed, "an idle keep-alive connection was held for %ds" % GENEROUS)
        self.assertGreaterEqual(time.monotonic() - t0, 0.8)
        self.assertEqual(data, b"", "an idle connection is closed without a word")

    def test_time_idle_between_requests_is_not_counted_against_the_head(self):
        # header_timeout runs from a head's first byte, not from the last
        # answer: a keep-alive client that waits longer than it is served.
        up, d = self.setup_pair({"header_timeout": "1s", "idle_timeout": "30s"})
        s = connect(d.port)
        try:
            for i in range(2):
                if i:
                    time.sleep(1.5)  # idle, longer than header_timeout
                s.sendall(head("GET", "/thing/%d" % i))
                r = read_response(s)
                self.assertIsNotNone(r, "request %d got no answer" % i)
                self.assertEqual(r.status, 200)
        finally:
            s.close()
        self.assertEqual(up.count(), 2)


# --------------------------------------------------------------------------
# body_timeout


class BodyTimeout(LimitsCase):
    def test_a_body_that_pauses_is_cut_and_its_key_stays_free(self):
        up, d = self.setup_pair({"body_timeout": "1s", "header_timeout": "30s"})
        key = h.new_key()
        s = connect(d.port)
        try:
            s.sendall(head(key=key, headers=["Content-Length: 100"]) + b"x" * 10)
            t0 = time.monotonic()
            data, closed = read_until_closed(s)
        finally:
            s.close()
        self.assertTrue(closed, "a paused body was held for %ds" % GENEROUS)
        self.assertGreaterEqual(time.monotonic() - t0, 0.8)
        self.problem_of(data, 408, "request-timeout")
        self.assertEqual(up.count(), 0)
        self.assertEqual(d.get_key(key).status, 404, "a key was claimed for a body never read")
        r = d.post(key=key, body=b"y" * 100)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(key=key), 1)

    def test_a_body_sent_slowly_but_without_long_pauses_is_served(self):
        # body_timeout bounds each pause, not the whole body: 10 pieces over
        # about 5 s with body_timeout 3s.
        up, d = self.setup_pair({"body_timeout": "3s", "header_timeout": "2s"})
        key = h.new_key()
        s = connect(d.port)
        try:
            s.sendall(head(key=key, headers=["Content-Length: 100"]))
            for _ in range(10):
                time.sleep(0.5)
                s.sendall(b"z" * 10)
            r = read_response(s)
        finally:
            s.close()
        self.assertIsNotNone(r, "a steady body was cut")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.requests(key=key)[0].body, b"z" * 100)


# --------------------------------------------------------------------------
# max_connections and the open-files limit


class MaxConnections(LimitsCase):
    def test_connections_over_the_cap_are_closed_and_admin_still_answers(self):
        up, d = self.setup_pair({"max_connections": 2, "header_timeout": "60s",
                                 "idle_timeout": "60s"})
        held = [connect(d.port) for _ in range(2)]
        try:
            for i, s in enumerate(held):
                s.sendall(head("GET", "/held/%d" % i))
                r = read_response(s)
                self.assertIsNotNone(r)
                self.assertEqual(r.status, 200)
            data, closed = h.send_then_read_until_closed(connect(d.port), head("GET", "/third"),
                                                         GENEROUS)
            self.assertTrue(closed, "a connection over max_connections was kept open")
            if data:
                self.problem_of(data, 503, "overloaded")
            self.assertEqual(up.count(path="/third"), 0)
            # the admin listener has a budget of its own
            self.assertEqual(d.admin("GET", "/healthz").status, 200)
            m = d.metrics()
            self.assertGreaterEqual(h.metric_sum(m, "idem_connections_refused_total",
                                                 listener="public"), 1)
            self.assertEqual(h.metric_sum(m, "idem_connections"), 2)
            # the held connections still work
            held[0].sendall(head("GET", "/again"))
            r = read_response(held[0])
            self.assertIsNotNone(r)
            self.assertEqual(r.status, 200)
        finally:
            for s in held:
                s.close()

        # their places come back
        def served():
            try:
                return h.request(d.port, "GET", "/after", timeout=5).status == 200
            except OSError:
                return False
        h.wait_until(served, GENEROUS, 0.1, "a connection once others closed")

    ADMIN_CAP = 64  # the admin listener's own connections (docs/protocol.md section 13)

    def admin_healthz_on(self, s):
        """GET /healthz on an open admin connection: its Response or None."""
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        except OSError:
            return None
        return read_response(s)

    def test_idle_admin_connections_make_room_for_a_probe(self):
        # 64 keep-alive admin connections, each served and then idle, hold
        # every place; a probe still gets 200, the longest idle making room.
        up, d = self.setup_pair({"header_timeout": "60s", "idle_timeout": "60s"})
        held = []
        try:
            for i in range(self.ADMIN_CAP):
                s = connect(d.admin_port)
                held.append(s)
                r = self.admin_healthz_on(s)
                self.assertIsNotNone(r, "admin connection %d got no answer" % i)
                self.assertEqual(r.status, 200, "admin connection %d: %r" % (i, r))
            for i in range(5):
                r = d.admin("GET", "/healthz", timeout=GENEROUS)
                self.assertEqual(r.status, 200, "probe %d with 64 idle admin connections" % i)
            # the one idle longest went for them (a probe of the harness,
            # closed before, may have gone first: five probes, one of ours)
            data, closed = read_until_closed(held[0])
            self.assertTrue(closed, "the longest-idle admin connection was kept")
            self.assertEqual(data, b"", "an idle connection is closed without a word")
            self.assertEqual(h.metric_sum(d.metrics(), "idem_connections_refused_total",
                                          listener="admin"), 0)
            # the most recent ones still work
            r = self.admin_healthz_on(held[-1])
            self.assertIsNotNone(r, "a recently used admin connection was closed")
            self.assertEqual(r.status, 200)
        finally:
            for s in held:
                s.close()

    def test_busy_admin_connections_over_its_cap_refuse_the_next(self):
        # 64 admin connections each in the middle of a head are not idle:
        # none is closed for a 65th, which is refused at once.
        up, d = self.setup_pair({"header_timeout": "60s", "idle_timeout": "60s"})
        busy = []
        try:
            # One at a time: a connection accepted and not yet read from has
            # said nothing, so it is idle, and may make room for the next.
            for i in range(self.ADMIN_CAP):
                s = connect(d.admin_port)
                busy.append(s)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                h.wait_until(lambda: server_has_read([s]), GENEROUS, 0.02,
                             "idemd to read half head %d" % i)
            probe = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
            data, closed = h.send_then_read_until_closed(connect(d.admin_port), probe, GENEROUS)
            self.assertTrue(closed, "an admin connection over the cap was kept open")
            rs = h.parse_responses(data)
            if rs:
                self.assertProblem(rs[0], 503, "overloaded")
            # none of the busy ones was closed for it: each finishes its head
            for i, s in enumerate(busy):
                s.sendall(b"\r\n")
                r = read_response(s)
                self.assertIsNotNone(r, "busy admin connection %d was closed" % i)
                self.assertEqual(r.status, 200)
            # (idle now: the scrape takes the place of the longest idle)
            self.assertGreaterEqual(h.metric_sum(d.metrics(), "idem_connections_refused_total",
                                                 listener="admin"), 1)
            # the public listener is not affected
            self.assertEqual(h.request(d.port, "GET", "/x").status, 200)
        finally:
            for s in busy:
                s.close()


def nofile_limits(pid):
    """(soft, hard) RLIMIT_NOFILE of a running process, from /proc."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                parts = line.split()
                return int(parts[3]), int(parts[4])
    raise AssertionError("no open-files line in /proc/%d/limits" % pid)


class OpenFiles(LimitsCase):
    def run_idemd(self, config, soft, hard):
        """Start idemd with RLIMIT_NOFILE (soft, hard); return the process."""
        ports = h.free_ports(2)
        path = os.path.join(self.tmp, "idemd.yaml")
        with open(path, "w") as f:
            f.write(h.to_yaml(config) + "\n")
        log = open(os.path.join(self.tmp, "idemd.stderr"), "wb")
        self.addCleanup(log.close)

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        p = subprocess.Popen([h.IDEMD, "--config", path, "--listen", "127.0.0.1:%d" % ports[0],
                              "--admin", "127.0.0.1:%d" % ports[1], "--store", "memory:"],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             preexec_fn=limit)

        def stop():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.addCleanup(stop)
        return p, ports[1]

    def stderr(self):
        with open(os.path.join(self.tmp, "idemd.stderr"), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def ready(self, p, admin_port):
        def up():
            if p.poll() is not None:
                raise AssertionError("idemd exited %d: %s" % (p.returncode, self.stderr()))
            try:
                return h.request(admin_port, "GET", "/healthz", timeout=1).status == 200
            except OSError:
                return False
        h.wait_until(up, GENEROUS, 0.05, "idemd to be ready")

    def test_max_connections_that_cannot_fit_the_hard_limit_refuses_to_start(self):
        p, _ = self.run_idemd({"max_connections": 1000}, 256, 512)
        self.assertEqual(p.wait(GENEROUS), 2)
        lines = self.stderr().strip().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("max_connections", lines[0])
        self.assertIn("512", lines[0])

    def test_the_soft_limit_is_raised_to_fit_max_connections(self):
        # a hard limit this process may set (lowering is always allowed)
        cur = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        hard = 8192 if cur == resource.RLIM_INFINITY else min(8192, cur)
        mc = min(1000, (hard - 256) // 2)
        p, aport = self.run_idemd({"max_connections": mc}, 256, hard)
        self.ready(p, aport)
        soft, got_hard = nofile_limits(p.pid)
        self.assertGreaterEqual(soft, 2 * mc, "soft limit %d left too low" % soft)
        self.assertEqual(got_hard, hard)

    def test_the_default_max_connections_is_lowered_to_fit_with_a_warning(self):
        p, aport = self.run_idemd({}, 256, 1024)
        self.ready(p, aport)
        self.assertIn("max_connections lowered", self.stderr())
        soft, _ = nofile_limits(p.pid)
        self.assertGreater(soft, 256)


# --------------------------------------------------------------------------
# max_buffered_bytes


# A body's buffer doubles from 256 bytes and stops at max_request_bytes + 1,
# and is charged its size (less the spare byte): 60000 bytes arrived hold
# 65535, 30000 hold 32767.  So one body of 60000 fits beside one of 30000
# (98302 <= 102400), never beside another of 60000; a head that declares
# 60000 and sends a little holds a little.
BUDGET = {"max_request_bytes": "64KiB", "max_buffered_bytes": "100KiB",
          "header_timeout": "60s", "body_timeout": "60s"}
BODY = 60000


class BufferedBytes(LimitsCase):
    def buffered(self, d):
        return h.metric_sum(d.metrics(), "idem_buffered_body_bytes")

    def hold(self, d, sent, key=None, declared=BODY):
        """A connection whose request declared `declared` body bytes and
        sent `sent` of them, once idemd has read them all."""
        s = connect(d.port)
        self.addCleanup(s.close)
        s.sendall(head(key=key or h.new_key(), headers=["Content-Length: %d" % declared]) +
                  b"a" * sent)
        h.wait_until(lambda: server_has_read([s]), GENEROUS, 0.05, "idemd to read the body")
        return s

    def test_the_budget_counts_what_arrived_not_what_the_head_declared(self):
        up, d = self.setup_pair(BUDGET)
        ka, kb = h.new_key(), h.new_key()
        a = self.hold(d, 100, key=ka)
        held = self.buffered(d)
        self.assertGreaterEqual(held, 100, "the bytes that arrived are not counted")
        self.assertLess(held, 4096, "A's declared Content-Length was charged at its head")
        a.sendall(b"a" * 30000)
        h.wait_until(lambda: server_has_read([a]), GENEROUS, 0.05, "idemd to read A's bytes")
        held = self.buffered(d)
        self.assertGreaterEqual(held, 30100, "the budget does not grow with the body")
        self.assertLess(held, BODY, "A's declared Content-Length was charged")
        # B's whole body fits beside what A holds, though not beside what A declared
        r = d.post(key=kb, body=b"b" * BODY)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.requests(key=kb)[0].body, b"b" * BODY)
        # B's budget comes back; then A's rest fits too
        h.wait_until(lambda: self.buffered(d) == held, GENEROUS, 0.05, "B's budget back")
        a.sendall(b"a" * (BODY - 30100))
        ra = read_response(a)
        self.assertIsNotNone(ra, "the body in progress was cut")
        self.assertEqual(ra.status, 200, ra)
        self.assertEqual(up.requests(key=ka)[0].body, b"a" * BODY)
        h.wait_until(lambda: self.buffered(d) == 0, GENEROUS, 0.05, "the budget to be empty")

    def test_a_body_whose_bytes_pass_the_budget_gets_503_and_the_other_finishes(self):
        up, d = self.setup_pair(BUDGET)
        ka, kb = h.new_key(), h.new_key()
        a = self.hold(d, BODY - 1, key=ka)  # A holds 65535
        # B's head is admitted; its body is refused once it has grown past
        # what is left, part-way
        b = connect(d.port)
        try:
            b.sendall(head(key=kb, headers=["Content-Length: %d" % BODY]))
            try:
                b.sendall(b"b" * BODY)
            except OSError:
                pass  # refused and closed while it was still sending
            data, closed = read_until_closed(b)
        finally:
            b.close()
        r, _ = self.problem_of(data, 503, "overloaded")
        self.assertRetryAfter(r, 1)
        self.assertEqual((r.header("Connection") or "").lower(), "close")
        self.assertTrue(closed, "a refused body's connection was kept")
        self.assertEqual(d.get_key(kb).status, 404, "B claimed its key")
        # A is not starved: its last byte fits in what it holds
        a.sendall(b"a")
        ra = read_response(a)
        self.assertIsNotNone(ra, "the body in progress was starved")
        self.assertEqual(ra.status, 200, ra)
        self.assertEqual(up.count(key=ka), 1)
        self.assertEqual(up.count(key=kb), 0)
        self.assertGreaterEqual(d.outcome("overloaded"), 1)

        # the budget comes back: B's retry runs
        h.wait_until(lambda: self.buffered(d) == 0, GENEROUS, 0.05, "the budget to be empty")
        r = d.post(key=kb, body=b"b" * BODY)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(key=kb), 1)

    def test_an_abandoned_body_gives_its_budget_back(self):
        up, d = self.setup_pair(BUDGET)
        a = self.hold(d, 40000)  # holds 65535 of 60000 declared
        self.assertGreaterEqual(self.buffered(d), 40000)
        r = d.post(key=h.new_key(), body=b"b" * BODY)
        self.assertProblem(r, 503, "overloaded")
        a.close()
        h.wait_until(lambda: self.buffered(d) == 0, GENEROUS, 0.05, "A's budget back")
        r = d.post(key=h.new_key(), body=b"b" * BODY)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(), 1)

    def test_a_chunked_body_that_does_not_fit_gets_503(self):
        up, d = self.setup_pair(BUDGET)
        self.hold(d, 40000)
        chunk = b"c" * 50000
        data, closed = h.raw_exchange(
            d.port, head(key=h.new_key(), headers=["Transfer-Encoding: chunked"]) +
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk), timeout=GENEROUS)
        r, _ = self.problem_of(data, 503, "overloaded")
        self.assertRetryAfter(r, 1)
        self.assertTrue(closed)
        self.assertEqual(up.count(), 0)


# --------------------------------------------------------------------------
# Expect: 100-continue


class ExpectContinue(LimitsCase):
    def expect(self, d, hdr, then_body=None):
        """Send a head with Expect: 100-continue and no body; read what comes
        until the connection closes (sending then_body after a final answer)."""
        s = connect(d.port)
        try:
            s.sendall(hdr)
            r = read_response(s)
            if then_body is not None:
                try:
                    s.sendall(then_body)
                except OSError:
                    pass
            more, closed = read_until_closed(s)
        finally:
            s.close()
        return r, more, closed

    def test_a_missing_key_gets_400_and_no_100_continue(self):
        up, d = self.setup_pair()
        hdr = head(headers=["Content-Length: 10", "Expect: 100-continue"])
        data, closed = h.raw_exchange(d.port, hdr, timeout=GENEROUS)
        r, _ = self.problem_of(data, 400, "missing-key")
        self.assertEqual((r.header("Connection") or "").lower(), "close")
        self.assertTrue(closed, "the body may still come: the connection must end")
        self.assertEqual(up.count(), 0)

    def test_a_body_sent_anyway_after_the_early_answer_is_not_taken_as_a_request(self):
        up, d = self.setup_pair()
        hdr = head(headers=["Content-Length: 45", "Expect: 100-continue"])
        smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        r, more, closed = self.expect(d, hdr, then_body=smuggled.ljust(45, b" "))
        self.assertIsNotNone(r)
        self.assertProblem(r, 400, "missing-key")
        self.assertEqual(more, b"")
        self.assertTrue(closed)
        self.assertEqual(up.count(), 0)

    def test_an_invalid_key_gets_400_and_no_100_continue(self):
        up, d = self.setup_pair()
        for extra in (["Idempotency-Key: a", "Idempotency-Key: b"],
                      ["Idempotency-Key: \"unterminated"]):
            data, closed = h.raw_exchange(
                d.port, head(headers=extra + ["Content-Length: 10", "Expect: 100-continue"]),
                timeout=GENEROUS)
            self.problem_of(data, 400, "invalid-key")
            self.assertTrue(closed)
        self.assertEqual(up.count(), 0)

    def test_a_token_route_without_a_token_gets_400_and_no_100_continue(self):
        up, d = self.setup_pair({"routes": [{"methods": ["POST"], "path": "/", "mode": "token"}]})
        data, closed = h.raw_exchange(
            d.port, head(headers=["Content-Length: 10", "Expect: 100-continue"]),
            timeout=GENEROUS)
        self.problem_of(data, 400, "missing-token")
        self.assertTrue(closed)

    def test_a_body_over_the_budget_is_invited_then_refused_with_503(self):
        # The budget is charged as the body arrives, not at the head: with
        # the budget held by another body, a head that passes its checks is
        # still invited, and its body is refused once it does not fit.
        up, d = self.setup_pair(BUDGET)
        a = connect(d.port)
        self.addCleanup(a.close)
        a.sendall(head(key=h.new_key(), headers=["Content-Length: %d" % BODY]) +
                  b"a" * 40000)
        h.wait_until(lambda: server_has_read([a]), GENEROUS, 0.05, "idemd to read A's body")
        key = h.new_key()
        s = connect(d.port)
        try:
            s.sendall(head(key=key, headers=["Content-Length: %d" % BODY,
                                             "Expect: 100-continue"]))
            s.settimeout(GENEROUS)
            interim = s.recv(65536)
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim)
            try:
                s.sendall(b"b" * BODY)
            except OSError:
                pass
            data, closed = read_until_closed(s)
        finally:
            s.close()
        self.problem_of(interim[len(b"HTTP/1.1 100 Continue\r\n\r\n"):] + data,
                        503, "overloaded")
        self.assertTrue(closed)
        self.assertEqual(d.get_key(key).status, 404, "a refused body claimed its key")
        self.assertEqual(up.count(), 0)

    def test_a_request_that_passes_its_checks_is_invited_and_served(self):
        # the positive side, on the same binary: 100 first, then the answer
        up, d = self.setup_pair()
        key = h.new_key()
        s = connect(d.port)
        try:
            s.sendall(head(key=key, headers=["Content-Length: 5", "Expect: 100-continue"]))
            s.settimeout(GENEROUS)
            interim = s.recv(65536)
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim)
            s.sendall(b"hello")
            r = read_response(s)
        finally:
            s.close()
        self.assertIsNotNone(r)
        self.assertEqual(r.status, 200)
        self.assertEqual(up.count(key=key), 1)
        # and a refused one on the same daemon never is
        data, _ = h.raw_exchange(d.port, head(headers=["Content-Length: 5",
                                                       "Expect: 100-continue"]),
                                 timeout=GENEROUS)
        self.assertFalse(data.startswith(b"HTTP/1.1 100"), data)


# --------------------------------------------------------------------------
# the admin listener


def admin_raw(d, req, timeout=GENEROUS):
    data, closed = h.raw_exchange(d.admin_port, req, timeout=timeout)
    return h.parse_responses(data), closed


class AdminHost(LimitsCase):
    def test_a_foreign_host_gets_421_and_cannot_delete_keys(self):
        up, d = self.setup_pair()
        key = h.new_key()
        self.assertEqual(d.post(key=key).status, 200)
        for host in ("evil.example", "evil.example:%d" % d.admin_port, "127.0.0.1.nip.io",
                     "localhost.evil.example", "[::2]"):
            rs, closed = admin_raw(d, ("DELETE %s HTTP/1.1\r\nHost: %s\r\n\r\n"
                                       % (d.key_path(key), host)).encode())
            self.assertTrue(rs, host)
            self.assertProblem(rs[0], 421, "misdirected-request")
            self.assertTrue(closed)
        self.assertEqual(d.get_key(key).status, 200, "a foreign Host removed a key")
        # loopback names and the admin address itself, any port, any case
        for host in ("localhost", "LocalHost:%d" % d.admin_port, "127.0.0.1",
                     "127.0.0.1:1", "[::1]:%d" % d.admin_port, "[::1]"):
            rs, _ = admin_raw(d, ("GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                                  % host).encode())
            self.assertEqual([r.status for r in rs], [200], host)

    def test_host_is_required_on_http_1_1_and_checked_once(self):
        up, d = self.setup_pair()
        rs, _ = admin_raw(d, b"GET /healthz HTTP/1.1\r\n\r\n")
        self.assertProblem(rs[0], 400, "bad-request")
        rs, _ = admin_raw(d, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n")
        self.assertProblem(rs[0], 400, "bad-request")
        # a script speaking HTTP/1.0 without Host is not a browser
        rs, _ = admin_raw(d, b"GET /healthz HTTP/1.0\r\n\r\n")
        self.assertEqual([r.status for r in rs], [200])

    def test_admin_hosts_adds_names(self):
        up, d = self.setup_pair({"admin_hosts": ["ops.internal", "[fd00::7]"]})
        for host, status in (("ops.internal", 200), ("OPS.internal:9", 200), ("[fd00::7]:1", 200),
                             ("ops.internal.evil", 421), ("other.internal", 421)):
            rs, _ = admin_raw(d, ("GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                                  % host).encode())
            self.assertEqual(rs[0].status, status, host)


class AdminTimeouts(LimitsCase):
    def test_an_admin_head_trickled_a_line_at_a_time_is_cut(self):
        up, d = self.setup_pair({"header_timeout": "1s"})
        got, closed, took = trickle(d.admin_port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        self.assertTrue(closed, "an admin head trickled for %.1fs was never cut" % took)
        self.assertGreaterEqual(took, 0.8)
        self.problem_of(got, 408, "request-timeout")

    def test_an_admin_body_that_pauses_is_cut(self):
        up, d = self.setup_pair({"header_timeout": "30s", "body_timeout": "1s"})
        s = connect(d.admin_port)
        try:
            s.sendall(b"DELETE /keys/k HTTP/1.1\r\nHost: localhost\r\nContent-Length: 50\r\n\r\nab")
            data, closed = read_until_closed(s)
        finally:
            s.close()
        self.assertTrue(closed)
        self.problem_of(data, 408, "request-timeout")

    def test_an_idle_or_silent_admin_connection_is_closed(self):
        up, d = self.setup_pair({"header_timeout": "1s", "idle_timeout": "1s"})
        silent = connect(d.admin_port)
        idle = connect(d.admin_port)
        try:
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            r = read_response(idle)
            self.assertIsNotNone(r)
            self.assertEqual(r.status, 200)
            for s in (silent, idle):
                data, closed = read_until_closed(s)
                self.assertTrue(closed)
                self.assertEqual(data, b"")
        finally:
            silent.close()
            idle.close()
