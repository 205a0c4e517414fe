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
- max_buffered_bytes: a body that does not fit gets 503 overloaded with
  Retry-After; a body already admitted finishes; the budget comes back.
- Expect: 100-continue is answered only after the route and key checks.
- The admin listener: the same timeouts, a connection cap of its own, and
  only Host names that mean itself (DNS rebinding gets 421).

Everything is decided by behaviour over raw sockets.  A deadline is only ever
an upper bound that is generous ("closed at all within 15 s"); the lower
bounds ("not before about header_timeout") can only fail by being late, which
a busy machine never makes them.
"""

import os
import resource
import socket
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
    s = socket.create_connection((h.HOST, port), timeout=GENEROUS)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_closed(s, timeout=GENEROUS):
    """Read until the peer closes or timeout: (data, closed)."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, False
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk


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
            extra = connect(d.port)
            try:
                try:
                    extra.sendall(head("GET", "/third"))
                except OSError:
                    pass
                data, closed = read_until_closed(extra)
            finally:
                extra.close()
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

    def test_admin_connections_over_its_cap_are_closed_at_once(self):
        up, d = self.setup_pair({"header_timeout": "60s", "idle_timeout": "60s"})
        held, refused = [], None
        try:
            # Each connection is served before the next opens, until one is
            # refused: a readiness probe not yet closed may take a place.
            while refused is None and len(held) < 80:
                s = connect(d.admin_port)
                try:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                except OSError:
                    pass
                r = read_response(s)
                if r is not None and r.status == 200:
                    held.append(s)
                    continue
                data, closed = read_until_closed(s)
                s.close()
                refused = (r, data, closed)
            self.assertIsNotNone(refused, "80 admin connections were all kept")
            self.assertLessEqual(len(held), 64)
            self.assertGreaterEqual(len(held), 60)
            r, data, closed = refused
            self.assertTrue(closed, "an admin connection over the cap was kept open")
            if r is not None:
                self.assertProblem(r, 503, "overloaded")
            # the public listener is not affected
            self.assertEqual(h.request(d.port, "GET", "/x").status, 200)
        finally:
            for s in held:
                s.close()
        def served():
            try:
                return d.admin("GET", "/healthz", timeout=5).status == 200
            except OSError:
                return False
        h.wait_until(served, GENEROUS, 0.1, "the admin listener once its connections closed")


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


BUDGET = {"max_request_bytes": "64KiB", "max_buffered_bytes": "100KiB",
          "header_timeout": "60s", "body_timeout": "60s"}


class BufferedBytes(LimitsCase):
    def buffered(self, d):
        return h.metric_sum(d.metrics(), "idem_buffered_body_bytes")

    def test_a_body_over_the_budget_gets_503_and_the_one_in_progress_finishes(self):
        up, d = self.setup_pair(BUDGET)
        ka, kb = h.new_key(), h.new_key()
        a = connect(d.port)
        try:
            # A reserves 60000 bytes and sends half of them
            a.sendall(head(key=ka, headers=["Content-Length: 60000"]) + b"a" * 30000)
            h.wait_until(lambda: self.buffered(d) >= 60000, GENEROUS, 0.05, "A's reservation")
            # B does not fit next to it
            b = connect(d.port)
            try:
                b.sendall(head(key=kb, headers=["Content-Length: 60000"]) + b"b" * 60000)
                data, closed = read_until_closed(b)
            finally:
                b.close()
            r, _ = self.problem_of(data, 503, "overloaded")
            self.assertRetryAfter(r, 1)
            self.assertTrue(closed)
            self.assertEqual(d.get_key(kb).status, 404, "B claimed its key")
            # A is not starved
            a.sendall(b"a" * 30000)
            ra = read_response(a)
            self.assertIsNotNone(ra, "the body in progress was starved")
            self.assertEqual(ra.status, 200, ra)
        finally:
            a.close()
        self.assertEqual(up.count(key=ka), 1)
        self.assertEqual(up.count(key=kb), 0)

        # the budget comes back: B's retry runs
        def retry():
            r = d.post(key=kb, body=b"b" * 60000)
            return r if r.status == 200 else None
        h.wait_until(retry, GENEROUS, 0.1, "B's retry to fit")
        h.wait_until(lambda: self.buffered(d) == 0, GENEROUS, 0.05, "the budget to be empty")

    def test_an_abandoned_body_gives_its_budget_back(self):
        up, d = self.setup_pair(BUDGET)
        a = connect(d.port)
        a.sendall(head(key=h.new_key(), headers=["Content-Length: 60000"]) + b"a" * 100)
        h.wait_until(lambda: self.buffered(d) >= 60000, GENEROUS, 0.05, "A's reservation")
        r = d.post(key=h.new_key(), body=b"b" * 60000)
        self.assertProblem(r, 503, "overloaded")
        a.close()
        h.wait_until(lambda: self.buffered(d) == 0, GENEROUS, 0.05, "A's budget back")
        r = d.post(key=h.new_key(), body=b"b" * 60000)
        self.assertEqual(r.status, 200, r)

    def test_a_chunked_body_that_does_not_fit_gets_503(self):
        up, d = self.setup_pair(BUDGET)
        a = connect(d.port)
        try:
            a.sendall(head(key=h.new_key(), headers=["Content-Length: 60000"]) + b"a")
            h.wait_until(lambda: self.buffered(d) >= 60000, GENEROUS, 0.05, "A's reservation")
            chunk = b"c" * 50000
            data, closed = h.raw_exchange(
                d.port, head(key=h.new_key(), headers=["Transfer-Encoding: chunked"]) +
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk), timeout=GENEROUS)
            r, _ = self.problem_of(data, 503, "overloaded")
            self.assertRetryAfter(r, 1)
            self.assertTrue(closed)
        finally:
            a.close()
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

    def test_a_body_over_the_budget_gets_503_and_no_100_continue(self):
        up, d = self.setup_pair(BUDGET)
        a = connect(d.port)
        try:
            a.sendall(head(key=h.new_key(), headers=["Content-Length: 60000"]) + b"a")
            h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_buffered_body_bytes") >= 60000,
                         GENEROUS, 0.05, "A's reservation")
            data, closed = h.raw_exchange(
                d.port, head(key=h.new_key(), headers=["Content-Length: 60000",
                                                       "Expect: 100-continue"]),
                timeout=GENEROUS)
            self.problem_of(data, 503, "overloaded")
            self.assertTrue(closed)
        finally:
            a.close()

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
