"""Upgrade without a failed request (SPEC section 19, docs/operations.md):
`idemd --takeover` takes the running idemd's listening sockets and serves at
once, SIGTERM drains the old one, and under steady load through that no
request fails and no key runs twice; a second idemd started without
--takeover still gets EADDRINUSE; sockets passed the systemd way
(LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES) are used, and checked.

Every wait is for an event (a log line, a count of answers, an exit), never
a fixed sleep."""

import os
import signal
import sys
import socket
import subprocess
import threading
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class SamePorts(h.Idemd):
    """An Idemd started on ports chosen by the test (another process's),
    so that start() does not pick new free ones."""

    def start_on(self, port, admin_port, wait_line=None, timeout=h.READY_TIMEOUT * 3):
        self.port, self.admin_port = port, admin_port
        self.starts += 1
        log = os.path.join(self.workdir, "%s.%d.stderr" % (self.name, self.starts))
        self.logs.append(log)
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                         stderr=err, cwd=self.cwd, env=self.env)
        h._LIVE.add(self.proc)
        if wait_line is not None:
            self.wait_log(wait_line, timeout)
        return self

    def wait_log(self, text, timeout=h.READY_TIMEOUT * 3):
        def seen():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited with %d:\n%s" % (
                    self.name, self.proc.returncode, self.log_text()[-3000:]))
            return text in self.log_text()
        h.wait_until(seen, timeout, what="%r in the log of %s" % (text, self.name))


class Load:
    """Threads sending keyed POSTs continuously, each on a new connection;
    about one in four repeats a key this thread already had answered.
    Every answer and every failure is recorded."""

    def __init__(self, port, threads=4):
        self.port = port
        self.stop = threading.Event()
        self.lock = threading.Condition()
        self.done = 0
        self.failures = []
        self.first = {}     # key -> body of its first answer
        self.repeats = 0
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, i):
        mine = []
        n = 0
        while not self.stop.is_set():
            n += 1
            repeat = mine and n % 4 == 0
            key = mine[(n // 4) % len(mine)] if repeat else h.new_key("load%d" % i)
            try:
                r = h.request(self.port, "POST", "/pay", body=b'{"amount": 1}', key=key,
                              timeout=60)
                ok = 200 <= r.status < 300
            except (OSError, h.http.client.HTTPException) as e:
                r, ok = e, False
            with self.lock:
                if not ok:
                    self.failures.append((key, repr(r)))
                elif repeat:
                    self.repeats += 1
                    if r.body != self.first[key] or not r.replayed:
                        self.failures.append((key, "repeat not a replay: %r" % r))
                else:
                    self.first[key] = r.body
                self.done += 1
                self.lock.notify_all()
            if ok and not repeat:
                mine.append(key)

    def wait_more(self, n, timeout=60):
        """Wait until n more requests were answered than now."""
        with self.lock:
            want = self.done + n
            if not self.lock.wait_for(lambda: self.done >= want or self.failures, timeout):
                raise AssertionError("load: %d of %d answers within %ds"
                                     % (self.done, want, timeout))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(120)


class Takeover(h.IdemTestCase):
    def make_pair_member(self, up, name, extra_args=()):
        d = SamePorts(self.tmp, up.url, config={"workers": 2}, name=name,
                      extra_args=list(extra_args))
        self._daemons.append(d)
        self.addCleanup(self._check_sanitizers, d)
        self.addCleanup(self._collect, d)
        self.addCleanup(d.kill)
        return d

    def test_handover_under_load_fails_no_request_and_runs_no_key_twice(self):
        up = self.start_upstream()
        up.set_reply(delay=0.005)  # a little time in flight: requests straddle each step
        old = self.make_pair_member(up, "old")
        old.start()
        load = Load(old.port)
        self.addCleanup(load.finish)
        load.wait_more(50)

        new = self.make_pair_member(up, "new", ["--takeover"])
        new.start_on(old.port, old.admin_port,
                     wait_line="listening sockets inherited from idemd pid %d" % old.proc.pid)
        old.wait_log("took the listeners over")
        load.wait_more(50)  # both serve

        old.send_signal(signal.SIGTERM)
        self.assertEqual(old.wait_exit(60), 0, "the old idemd did not drain and exit 0")
        load.wait_more(50)  # the new one alone
        load.finish()

        self.assertEqual(load.failures, [], "requests failed through the handover")
        self.assertGreater(load.repeats, 0)
        keys = list(load.first)
        seen = {}
        for s in up.requests():
            seen[s.key] = seen.get(s.key, 0) + 1
        twice = {k: n for k, n in seen.items() if n != 1}
        self.assertEqual(twice, {}, "keys the upstream ran more than once")
        self.assertEqual(sorted(seen), sorted(keys))
        # The admin socket went over too: it answers, and it is the new one's.
        m = new.metrics()
        self.assertGreater(h.metric_sum(m, "idem_requests_total"), 0)
        self.assertTrue(new.running())
        self.assertEqual(new.stop(), 0)

    def test_a_second_start_without_takeover_gets_eaddrinuse(self):
        up = self.start_upstream()
        first = self.make_pair_member(up, "first")
        first.start()
        second = self.make_pair_member(up, "second")
        second.start_on(first.port, first.admin_port)
        self.assertEqual(second.wait_exit(30), 2)
        text = second.log_text()
        self.assertEqual(len(text.strip().splitlines()), 1, text)
        self.assertIn("address already in use", text)
        self.assertIn("--listen", text)
        # the first serves on, untouched
        self.assertEqual(first.post(key=h.new_key()).status, 200)

    def test_takeover_with_nothing_running_listens_afresh(self):
        up = self.start_upstream()
        d = self.make_pair_member(up, "alone", ["--takeover"])
        d.start()
        d.wait_log("no idemd answers at @idemd-takeover:127.0.0.1:%d" % d.port)
        self.assertEqual(d.post(key=h.new_key()).status, 200)

    def test_taken_over_process_can_be_taken_over_again(self):
        up = self.start_upstream()
        a = self.make_pair_member(up, "a")
        a.start()
        b = self.make_pair_member(up, "b", ["--takeover"])
        b.start_on(a.port, a.admin_port,
                   wait_line="listening sockets inherited from idemd pid %d" % a.proc.pid)
        self.assertEqual(a.stop(), 0)
        c = self.make_pair_member(up, "c", ["--takeover"])
        c.start_on(a.port, a.admin_port,
                   wait_line="listening sockets inherited from idemd pid %d" % b.proc.pid)
        self.assertEqual(b.stop(), 0)
        k = h.new_key()
        self.assertEqual(c.post(key=k).status, 200)
        self.assertEqual(up.count(key=k), 1)


class Drain(h.IdemTestCase):
    def test_a_connection_accepted_before_sigterm_has_its_request_answered(self):
        """The drain closes keep-alive connections between requests, but
        not one whose first request is still on its way: under a takeover
        the client sent it to a socket that another idemd serves too, and
        closing it would fail that request."""
        up, d = self.setup_pair()
        s = h.connect(d.port, 30)
        self.addCleanup(s.close)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_connections") >= 1, 15,
                     what="idemd to accept the connection")
        d.send_signal(signal.SIGTERM)

        def refused():
            try:
                socket.create_connection((h.HOST, d.port), timeout=1).close()
                return False
            except OSError:
                return True
        h.wait_until(refused, 15, what="the listener to close after SIGTERM")
        key = h.new_key()
        req = ("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
               "Content-Length: 2\r\n\r\n{}" % key).encode()
        data, closed = h.send_then_read_until_closed(s, req, 30)
        rs = h.parse_responses(data)
        self.assertEqual([r.status for r in rs], [200], data)
        self.assertEqual((rs[0].header("Connection") or "").lower(), "close")
        self.assertTrue(closed)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d.stop(), 0)


def listening_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((h.HOST, 0))
    s.listen(64)
    return s


# What systemd does between fork and exec: the sockets to 3, 4, ... and
# LISTEN_PID to the pid that execs idemd.  argv[1]: the descriptors to move.
WRAPPER = """
import os, sys
fds = [int(x) for x in sys.argv[1].split(",")]
for i, fd in enumerate(fds):
    os.dup2(fd, 3 + i, inheritable=True)
for fd in fds:
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execve(sys.argv[2], sys.argv[2:], os.environ)
"""


class SystemdSockets(h.IdemTestCase):
    """LISTEN_FDS as systemd sets it: the sockets at descriptors 3, 4, ...
    and LISTEN_PID the pid of the process that reads them, which a small
    wrapper (WRAPPER) sets to its own pid before it execs idemd."""

    def spawn_with(self, socks, names=None, port=None, admin_port=None):
        up = self.start_upstream()
        d = SamePorts(self.tmp, up.url, name="sd")
        self._daemons.append(d)
        self.addCleanup(self._check_sanitizers, d)
        self.addCleanup(self._collect, d)
        self.addCleanup(d.kill)
        # descriptors far from 3 and 4, so that moving them cannot clash
        high = [os.dup2(s.fileno(), 50 + i, inheritable=True) for i, s in enumerate(socks)]
        self.addCleanup(lambda: [os.close(fd) for fd in high])
        env = dict(os.environ, LISTEN_FDS=str(len(socks)))
        if names is not None:
            env["LISTEN_FDNAMES"] = names
        d.port = port or socks[0].getsockname()[1]
        d.admin_port = admin_port or socks[1].getsockname()[1]
        wrapper = [sys.executable, "-c", WRAPPER, ",".join(map(str, high))] + d.argv()
        log = os.path.join(self.tmp, "sd.stderr")
        d.logs.append(log)
        with open(log, "wb") as err:
            d.proc = subprocess.Popen(wrapper, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                      cwd=self.tmp, env=env, pass_fds=high)
        h._LIVE.add(d.proc)
        return up, d

    def test_listen_fds_are_used_and_connections_made_before_the_start_are_answered(self):
        pub, adm = listening_socket(), listening_socket()
        self.addCleanup(pub.close)
        self.addCleanup(adm.close)
        # A request sent before idemd runs waits in the socket's backlog.
        key = h.new_key()
        early = h.Background(lambda: h.request(pub.getsockname()[1], "POST", "/pay",
                                               body=b"{}", key=key, timeout=60))
        up, d = self.spawn_with([pub, adm], names="listen:admin")
        d.wait_log("listening sockets inherited from systemd")
        pub.close()
        adm.close()  # idemd holds them alone now
        r = early.result(60)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        self.assertEqual(d.stop(), 0)

    def test_unnamed_sockets_are_matched_by_address(self):
        pub, adm = listening_socket(), listening_socket()
        self.addCleanup(pub.close)
        self.addCleanup(adm.close)
        # admin first: the order does not matter, the address does
        up, d = self.spawn_with([adm, pub], port=pub.getsockname()[1],
                                admin_port=adm.getsockname()[1])
        d.wait_log("listening sockets inherited from systemd")
        self.assertEqual(d.post(key=h.new_key()).status, 200)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)

    def test_a_socket_of_another_address_is_refused(self):
        pub, other = listening_socket(), listening_socket()
        self.addCleanup(pub.close)
        self.addCleanup(other.close)
        up, d = self.spawn_with([pub, other], admin_port=h.free_port())
        self.assertEqual(d.wait_exit(30), 2)
        text = d.log_text()
        self.assertEqual(len(text.strip().splitlines()), 1, text)
        self.assertIn("LISTEN_FDS: a socket listens on 127.0.0.1:%d, which is none of"
                      % other.getsockname()[1], text)

    def test_a_name_that_disagrees_with_the_address_is_refused(self):
        pub, adm = listening_socket(), listening_socket()
        self.addCleanup(pub.close)
        self.addCleanup(adm.close)
        up, d = self.spawn_with([pub, adm], names="admin:listen")
        self.assertEqual(d.wait_exit(30), 2)
        text = d.log_text()
        self.assertEqual(len(text.strip().splitlines()), 1, text)
        self.assertIn("LISTEN_FDS: the admin socket listens on 127.0.0.1:%d"
                      % pub.getsockname()[1], text)

    def test_listen_pid_of_another_process_is_ignored(self):
        pub = listening_socket()
        self.addCleanup(pub.close)
        # LISTEN_PID names another process: idemd binds its own, and pub
        # holds the address, so it fails as any second start does
        up = self.start_upstream()
        d = SamePorts(self.tmp, up.url, name="sd",
                      env=dict(os.environ, LISTEN_FDS="1", LISTEN_PID="1"))
        self._daemons.append(d)
        self.addCleanup(d.kill)
        self.addCleanup(self._collect, d)
        d.start_on(pub.getsockname()[1], h.free_port())
        self.assertEqual(d.wait_exit(30), 2)
        self.assertIn("address already in use", d.log_text())


if __name__ == "__main__":
    unittest.main()
