"""SPEC section 16: TLS to the upstream, through the real idemd.

The upstream is the harness's recording upstream with its listening socket
wrapped by Python's ssl module (certificates from tests/certs.py, made with
the `openssl` command once per class).  idemd is given `upstream:
https://127.0.0.1:PORT` and `upstream_tls:`.  What is checked: a keyed POST
over https:// runs once and is replayed; a certificate that does not verify
(another CA, another name, expired) or a client certificate the upstream
wants and does not get is `502 upstream-unreachable`, the upstream saw no
request, the key is released (the next attempt is not `409`) and the log
says why; `verify: false` takes a certificate for another name; mutual TLS
works when a client certificate is configured; a file that does not load
stops idemd at start with one line naming the option and the file.
"""

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

sys.path.insert(0, str(h.REPO / "tests"))
from certs import make_certs  # noqa: E402


class TlsUpstream(h.IdemTestCase):
    @classmethod
    def setUpClass(cls):
        cls.certdir = tempfile.mkdtemp(prefix="idem-bb-certs-")
        cls.certs = make_certs(cls.certdir)

    @classmethod
    def tearDownClass(cls):
        if not h.KEEP:
            shutil.rmtree(cls.certdir, True)

    def tls_upstream(self, cert="server", client_ca=None):
        """The recording upstream, speaking TLS with the certificate named
        cert; with client_ca, requiring a client certificate signed by it."""
        up = self.start_upstream()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.certs[cert], self.certs[cert + "_key"])
        if client_ca is not None:
            ctx.load_verify_locations(self.certs[client_ca])
            ctx.verify_mode = ssl.CERT_REQUIRED
        # The same descriptor, wrapped before any connection comes; the
        # handshake runs in each connection's own thread (first read), so a
        # refused one costs the accepting thread nothing.
        up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True,
                                           do_handshake_on_connect=False)
        up.url = "https://%s:%d" % (h.HOST, up.port)
        server = up.server
        plain_shutdown = server.shutdown_request

        def drain_then_close(request):
            # After a refused handshake, read on until idemd closes, so that
            # our close sends no reset that could overtake the alert: with
            # TLS 1.3 idemd has sent its request by the time it hears that
            # its certificate was refused, and only the alert tells it that
            # the upstream read none of it (a reset alone is an unknown
            # outcome, the safe side).
            try:
                raw = socket.socket(fileno=os.dup(request.fileno()))
            except OSError:
                raw = None
            if raw is not None:
                raw.settimeout(10.0)
                try:
                    while raw.recv(65536):
                        pass
                except OSError:
                    pass
                raw.close()
            plain_shutdown(request)
        server.shutdown_request = drain_then_close
        return up

    def idemd(self, up, **tls):
        cfg = {"upstream_tls": tls} if tls else None
        return self.start_idemd(up.url, cfg)

    def assert_refused_and_released(self, up, d, why):
        key = h.new_key()
        for _ in range(2):
            # The second attempt finds the key free again: 502, not 409.
            r = d.post(key=key)
            self.assertProblem(r, 502, "upstream-unreachable")
        self.assertEqual(up.count(), 0, "the upstream saw a request")
        h.wait_until(lambda: why in d.log_text(), 10.0, what="the reason in the log")
        lines = [ln for ln in d.log_text().splitlines() if why in ln]
        self.assertTrue(all("warn" in ln.lower() for ln in lines), lines)

    def test_keyed_post_over_https_runs_once_and_replays(self):
        up = self.tls_upstream()
        d = self.idemd(up, ca_file=self.certs["ca"])
        key = h.new_key()
        r1 = d.post(key=key)
        self.assertEqual(r1.status, 200, r1)
        self.assertFalse(r1.replayed)
        r2 = d.post(key=key)
        self.assertEqual(r2.status, 200, r2)
        self.assertTrue(r2.replayed)
        self.assertEqual(r2.body, r1.body)
        self.assertEqual(up.count(key=key), 1)
        # And a second key on the pooled connection, or a resumed new one.
        r3 = d.post(key=h.new_key())
        self.assertEqual(r3.status, 200, r3)

    def test_server_name_is_the_name_checked(self):
        up = self.tls_upstream()
        d = self.idemd(up, ca_file=self.certs["ca"], server_name="localhost")
        self.assertEqual(d.post(key=h.new_key()).status, 200)

    def test_wrong_ca_is_502_and_nothing_sent(self):
        up = self.tls_upstream()
        d = self.idemd(up, ca_file=self.certs["other_ca"])
        self.assert_refused_and_released(up, d, "certificate verify failed")

    def test_wrong_name_is_502_and_nothing_sent(self):
        up = self.tls_upstream(cert="wrong_name")
        d = self.idemd(up, ca_file=self.certs["ca"])
        self.assert_refused_and_released(up, d, "certificate verify failed")

    def test_expired_certificate_is_502_and_nothing_sent(self):
        up = self.tls_upstream(cert="expired")
        d = self.idemd(up, ca_file=self.certs["ca"])
        self.assert_refused_and_released(up, d, "expired")

    def test_verify_false_takes_a_wrong_name(self):
        up = self.tls_upstream(cert="wrong_name")
        d = self.idemd(up, verify=False)
        key = h.new_key()
        self.assertEqual(d.post(key=key).status, 200)
        self.assertEqual(up.count(key=key), 1)

    def test_mutual_tls(self):
        up = self.tls_upstream(client_ca="ca")
        d = self.idemd(up, ca_file=self.certs["ca"], cert_file=self.certs["client_a"],
                       key_file=self.certs["client_a_key"])
        key = h.new_key()
        self.assertEqual(d.post(key=key).status, 200)
        self.assertTrue(d.post(key=key).replayed)
        self.assertEqual(up.count(key=key), 1)

    def test_client_certificate_required_and_missing_is_502(self):
        up = self.tls_upstream(client_ca="ca")
        d = self.idemd(up, ca_file=self.certs["ca"])
        self.assert_refused_and_released(up, d, "alert")

    def test_a_file_that_does_not_load_stops_idemd(self):
        missing = os.path.join(self.tmp, "nope.pem")
        path = os.path.join(self.tmp, "c.yaml")
        with open(path, "w") as f:
            f.write(h.to_yaml({"upstream": "https://127.0.0.1:9",
                               "upstream_tls": {"ca_file": missing}}) + "\n")
        p = subprocess.run([h.IDEMD, "--config", path, "-t"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(p.returncode, 2, p)
        err = p.stderr.strip()
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("upstream_tls.ca_file", err)
        self.assertIn(missing, err)


if __name__ == "__main__":
    unittest.main()
