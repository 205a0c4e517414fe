"""SPEC section 16: the Redis store over TLS (rediss://), through the real idemd.

Debian 12's hiredis (0.14) has no TLS, so src/store/redis_conn.c does the
store's I/O itself, with the TLS engine of src/core/tls.c between hiredis's
command formatter and reply reader and the socket.  The URL's parameters
are ca= (the CAs trusted; default the system's store), cert= and key= (a
client certificate), sni= (the name sent and verified; default the URL's
host) and verify= (true unless written false).  This file proves them
against real servers of its own.

The servers: one redis-server per certificate (from tests/certs.py), TLS
only (`--port 0 --tls-port P`), on free loopback ports, no persistence:

  good      the CA's certificate for localhost and 127.0.0.1
  wrong     the CA's certificate for other.invalid only
  expired   the CA's certificate for localhost and 127.0.0.1, valid in 2020
  mutual    as good, and `--tls-auth-clients yes`: a client must present a
            certificate of the CA
  sentinel  a Sentinel on TLS only, monitoring `good` as mymaster over TLS

What is checked, each through an idemd started on the URL:
  ca= the CA, by name and by address     a keyed POST runs once, is replayed
  ca= another CA                         idemd refuses to start: exit 2, one
                                         line on stderr naming the store and
                                         "TLS: certificate verify failed"
  a certificate for another name         the same, "hostname mismatch" (by
                                         name) or "IP address mismatch"
  an expired certificate                 the same, "certificate has expired"
  verify=false                           the wrong name and the expired
                                         certificate are accepted
  sni=other.invalid                      the wrong-name server verifies: sni=
                                         is the name checked
  client certificates required           cert=&key= of the CA work; none, or
                                         one of another CA, is refused at
                                         start with one line
  rediss+sentinel://                     the sentinel and the master it names
                                         over TLS; another CA refused at start
  a certificate that turns bad           after start (CONFIG SET tls-cert-file,
                                         CLIENT KILL): /readyz 503 naming it,
                                         keyed requests 503, and ready again
                                         once the good one is back
A store that cannot be reached at start is always exit 2 (the Redis store
connects once in its open, before idemd listens), as for plain redis://.
"""

import atexit
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

sys.path.insert(0, str(h.REPO / "tests"))
from certs import make_certs  # noqa: E402

START_TIMEOUT = 30.0  # s for a redis-server to listen (a busy machine)
EXIT_TIMEOUT = 30.0   # s for idemd to give up on a store it cannot open

REDIS = shutil.which("redis-server")

_SERVERS = []  # stopped at exit too, even after ^C


@atexit.register
def _stop_servers():
    for s in list(_SERVERS):
        s.stop()


def _listening(port):
    try:
        with socket.create_connection((h.HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


class TlsRedis:
    """A redis-server that speaks TLS only, with the certificate `cert` of
    certs; client certificates required when mutual."""

    def __init__(self, topdir, name, certs, cert, mutual=False):
        self.dir = os.path.join(topdir, name)
        os.makedirs(self.dir)
        self.port = h.free_port()
        self.log = os.path.join(self.dir, "redis.log")
        self.argv = [REDIS, "--bind", h.HOST, "--port", "0", "--tls-port", str(self.port),
                     "--tls-cert-file", certs[cert], "--tls-key-file", certs[cert + "_key"],
                     "--tls-ca-cert-file", certs["ca"],
                     "--tls-auth-clients", "yes" if mutual else "no",
                     "--dir", self.dir, "--save", "", "--appendonly", "no",
                     "--logfile", self.log]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _SERVERS.append(self)
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("redis-server on TLS port %d did not start (exit %r):\n%s"
                                     % (self.port, self.proc.poll(), self.log_text()))
            time.sleep(0.05)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in _SERVERS:
            _SERVERS.remove(self)

    def log_text(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")[-2000:]
        except OSError:
            return ""

    def url(self, host="localhost", **params):
        """A rediss:// URL of this server with params as its query."""
        q = "&".join("%s=%s" % (k, v) for k, v in params.items())
        return "rediss://%s:%d/0%s" % (host, self.port, "?" + q if q else "")


def redis_tls_command(port, *args):
    """Send one command to the TLS-only server on port (its certificate not
    checked: the tests change it) and return its reply's first line."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((h.HOST, port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as s:
            cmd = b"*%d\r\n" % len(args)
            for a in args:
                a = a.encode() if isinstance(a, str) else a
                cmd += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(cmd)
            buf = b""
            while b"\r\n" not in buf:
                got = s.recv(4096)
                if not got:
                    break
                buf += got
            return buf.split(b"\r\n", 1)[0].decode("utf-8", "replace")


class TlsSentinel(TlsRedis):
    """A Sentinel that speaks TLS only, to its clients and to the master it
    monitors (`good`, as mymaster)."""

    def __init__(self, topdir, certs, master):
        super().__init__(topdir, "sentinel", certs, "server")
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w", encoding="ascii") as f:
            f.write("bind %s\nport 0\ntls-port %d\ntls-cert-file %s\ntls-key-file %s\n"
                    "tls-ca-cert-file %s\ntls-replication yes\ntls-auth-clients no\n"
                    "dir %s\nlogfile %s\nsentinel monitor mymaster %s %d 1\n"
                    % (h.HOST, self.port, certs["server"], certs["server_key"], certs["ca"],
                       self.dir, self.log, h.HOST, master.port))
        self.argv = [REDIS, conf, "--sentinel"]

    def url(self, host="localhost", **params):
        q = "&".join("%s=%s" % (k, v) for k, v in params.items())
        return "rediss+sentinel://%s:%d/mymaster/0%s" % (host, self.port,
                                                          "?" + q if q else "")


@unittest.skipUnless(REDIS and shutil.which("openssl"), "needs redis-server and openssl")
class RedisOverTls(h.IdemTestCase):
    @classmethod
    def setUpClass(cls):
        cls.top = tempfile.mkdtemp(prefix="idem-bb-redistls-")
        cls.servers = []
        try:
            cls.certs = make_certs(os.path.join(cls.top, "certs"))
            cls.good = TlsRedis(cls.top, "good", cls.certs, "server")
            cls.wrong = TlsRedis(cls.top, "wrong", cls.certs, "wrong_name")
            cls.expired = TlsRedis(cls.top, "expired", cls.certs, "expired")
            cls.mutual = TlsRedis(cls.top, "mutual", cls.certs, "server", mutual=True)
            cls.sentinel = TlsSentinel(cls.top, cls.certs, cls.good)
            cls.servers = [cls.good, cls.wrong, cls.expired, cls.mutual, cls.sentinel]
            for s in cls.servers:
                s.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers:
            s.stop()
        if not h.KEEP:
            shutil.rmtree(cls.top, True)

    # helpers

    def refused_at_start(self, url):
        """Start idemd on url, which it must refuse: exit 2 with one line on
        stderr, which is returned."""
        up = self.start_upstream()
        d = self.make_idemd(up, store=url)
        d.port, d.admin_port = h.free_ports(2)
        log = os.path.join(self.tmp, "refused.%d.stderr" % len(d.logs))
        d.logs.append(log)
        with open(log, "wb") as err:
            d.proc = subprocess.Popen(d.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                      stderr=err, cwd=self.tmp)
        try:
            rc = d.proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
            self.fail("idemd on %s still runs after %.0fs:\n%s" % (url, EXIT_TIMEOUT,
                                                                  d.log_text()))
        text = d.log_text()
        self.assertEqual(rc, 2, "idemd on %s: exit %d, stderr:\n%s" % (url, rc, text))
        lines = text.splitlines()
        self.assertEqual(len(lines), 1, "not one line:\n%s" % text)
        self.assertTrue(lines[0].startswith("idemd: --store: redis "), lines[0])
        self.assertEqual(up.count(), 0)
        return lines[0]

    def runs_once_and_replays(self, url):
        up, d = self.setup_pair(store=url)
        key = h.new_key()
        first = d.post(key=key)
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        again = d.post(key=key)
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d.admin("GET", "/readyz").status, 200)

    # cases

    def test_the_ca_by_name_runs_once_and_replays(self):
        self.runs_once_and_replays(self.good.url(ca=self.certs["ca"]))

    def test_the_ca_by_address_runs_once_and_replays(self):
        # The certificate names 127.0.0.1 too (an iPAddress SAN).
        self.runs_once_and_replays(self.good.url(host=h.HOST, ca=self.certs["ca"]))

    def test_another_ca_is_refused_at_start(self):
        line = self.refused_at_start(self.good.url(ca=self.certs["other_ca"]))
        self.assertIn("TLS: certificate verify failed: ", line)
        self.assertIn(":%d" % self.good.port, line)

    def test_no_ca_trusts_the_system_store_which_refuses_the_test_ca(self):
        line = self.refused_at_start(self.good.url())
        self.assertIn("TLS: certificate verify failed: ", line)

    def test_a_certificate_for_another_name_is_refused_at_start(self):
        line = self.refused_at_start(self.wrong.url(ca=self.certs["ca"]))
        self.assertIn("TLS: certificate verify failed: hostname mismatch", line)

    def test_a_certificate_for_another_address_is_refused_at_start(self):
        line = self.refused_at_start(self.wrong.url(host=h.HOST, ca=self.certs["ca"]))
        self.assertIn("TLS: certificate verify failed: IP address mismatch", line)

    def test_an_expired_certificate_is_refused_at_start(self):
        line = self.refused_at_start(self.expired.url(ca=self.certs["ca"]))
        self.assertIn("TLS: certificate verify failed: certificate has expired", line)

    def test_sni_is_the_name_verified(self):
        # The wrong-name server's certificate is for other.invalid: with
        # sni=other.invalid it verifies, though the URL's host is localhost.
        self.runs_once_and_replays(self.wrong.url(ca=self.certs["ca"], sni="other.invalid"))

    def test_sni_of_another_name_is_refused(self):
        line = self.refused_at_start(self.good.url(ca=self.certs["ca"], sni="other.invalid"))
        self.assertIn("hostname mismatch", line)

    def test_verify_false_accepts_the_wrong_name(self):
        self.runs_once_and_replays(self.wrong.url(verify="false"))

    def test_verify_false_accepts_an_expired_certificate(self):
        self.runs_once_and_replays(self.expired.url(ca=self.certs["other_ca"], verify="false"))

    def test_client_certificate_of_the_ca_is_accepted(self):
        self.runs_once_and_replays(self.mutual.url(ca=self.certs["ca"],
                                                   cert=self.certs["client_a"],
                                                   key=self.certs["client_a_key"]))

    def test_no_client_certificate_is_refused_at_start(self):
        # TLS 1.3: the client's handshake is done before the server checks
        # it; its alert comes with the first answer, or ahead of the reset
        # that meets the first command.
        line = self.refused_at_start(self.mutual.url(ca=self.certs["ca"]))
        self.assertIn(":%d: " % self.mutual.port, line)
        self.assertIn("TLS: tlsv13 alert certificate required", line)

    def test_a_client_certificate_of_another_ca_is_refused_at_start(self):
        line = self.refused_at_start(self.mutual.url(ca=self.certs["ca"],
                                                     cert=self.certs["client_other"],
                                                     key=self.certs["client_other_key"]))
        self.assertIn(":%d: " % self.mutual.port, line)
        self.assertIn("TLS: tlsv1 alert unknown ca", line)

    def test_a_plain_url_to_a_tls_port_is_refused_at_start(self):
        # redis:// speaks no TLS: the server drops what it cannot read.
        line = self.refused_at_start("redis://%s:%d/0?timeout=2s" % (h.HOST, self.good.port))
        self.assertIn(":%d" % self.good.port, line)

    def test_sentinel_and_master_over_tls(self):
        # The sentinel answers with the master's address (127.0.0.1), which
        # the server's certificate names too.
        self.runs_once_and_replays(self.sentinel.url(ca=self.certs["ca"]))

    def test_sentinel_of_another_ca_is_refused_at_start(self):
        line = self.refused_at_start(self.sentinel.url(ca=self.certs["other_ca"]))
        self.assertIn("no sentinel gave the address of master mymaster", line)
        self.assertIn(":%d: TLS: certificate verify failed: " % self.sentinel.port, line)

    def test_a_certificate_that_turns_bad_after_start_is_an_outage_with_its_reason(self):
        srv = TlsRedis(self.tmp, "turns", self.certs, "server")
        self.addCleanup(srv.stop)
        srv.start()
        up, d = self.setup_pair(store=srv.url(ca=self.certs["ca"]))
        key = h.new_key()
        first = d.post(key=key)
        self.assertEqual(first.status, 200, first)
        # The server takes the expired certificate for new connections and
        # drops idemd's: every new connection fails verification.
        self.assertEqual(redis_tls_command(srv.port, "CONFIG", "SET",
                                           "tls-cert-file", self.certs["expired"],
                                           "tls-key-file", self.certs["expired_key"]), "+OK")
        self.assertTrue(redis_tls_command(srv.port, "CLIENT", "KILL", "TYPE", "normal")
                        .startswith(":"))
        seen = {}

        def says_expired():
            r = d.admin("GET", "/readyz")
            seen["last"] = r
            return r.status == 503 and "TLS: certificate verify failed: certificate has " \
                                       "expired" in r.text

        h.wait_until(says_expired, 30, what="/readyz naming the expired certificate")
        detail = seen["last"].json()["detail"]
        self.assertIn(":%d: TLS: certificate verify failed" % srv.port, detail)
        self.assertNotIn("\n", detail)
        # A keyed request fails closed meanwhile; nothing reaches the upstream.
        r = d.post(key=h.new_key())
        self.assertEqual(r.status, 503, r)
        self.assertEqual(up.count(), 1)
        # The good certificate back: the store recovers without a restart.
        self.assertEqual(redis_tls_command(srv.port, "CONFIG", "SET",
                                           "tls-cert-file", self.certs["server"],
                                           "tls-key-file", self.certs["server_key"]), "+OK")
        h.wait_until(lambda: d.admin("GET", "/readyz").status == 200, 30,
                     what="/readyz ready again")
        self.assertReplayOf(d.post(key=key), first)

    def test_a_missing_ca_file_names_the_parameter(self):
        path = os.path.join(self.tmp, "no-such-ca.pem")
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.good.url(ca=path))
        d.port, d.admin_port = h.free_ports(2)
        p = subprocess.run(d.argv(), stdin=subprocess.DEVNULL, capture_output=True,
                           cwd=self.tmp, timeout=EXIT_TIMEOUT)
        self.assertEqual(p.returncode, 2, p)
        lines = p.stderr.decode("utf-8", "replace").splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("redis store option ca=%s: No such file or directory" % path, lines[0])


if __name__ == "__main__":
    unittest.main()
