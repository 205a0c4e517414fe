"""The TLS listener, `listen_tls` (SPEC section 16; `client_cert`, section 14),
through the real idemd, with Python's ssl module as the client and the
certificates tests/certs.py makes with the `openssl` command.

  replay          a keyed POST over TLS executes once and its repeat over
                  TLS replays; with the default scope (Authorization) the
                  plain listener shares the scope, so the same key replays
                  there too; with scope [client_cert] a plain request has no
                  certificate and falls back to a scope of its own
  refusals        a client that trusts another CA, an expired server
                  certificate, a certificate for another name: the client
                  refuses; a client certificate by another CA, or none, when
                  client_ca_file is set: idemd refuses.  The upstream sees
                  nothing in each case
  client_cert     two clients with different certificates are two scopes:
                  the same key executes for each, neither sees the other's
                  answer, each replays its own
  SIGHUP          the certificate and key swapped and SIGHUPed while threads
                  send keyed requests on new connections: none fails, new
                  connections get the new certificate, a keep-alive
                  connection opened before keeps working; a cert_file that
                  does not load is logged and the last good one kept
  hostile         1 KiB of garbage is closed at once; a partial, stalled or
                  trickled handshake is closed at header_timeout (not
                  before); a head that stops after the handshake is 408 over
                  TLS; 50 half handshakes held do not stop a normal client;
                  a TLS 1.1 client is refused with protocol_version;
                  renegotiation is refused (s_client); ALPN agrees on
                  http/1.1 and refuses a client that offers only h2
  max_connections half-handshake TLS connections count: 5 of them under
                  max_connections 5 make a 6th, plain or TLS, refused

Every verdict waits for an event (an answer, a close, a log line, a metric)
with a generous deadline; the only lower bound (a half handshake is not
closed before header_timeout) can only fail by being early, which a slow
machine never makes it.
"""

import hashlib
import http.client
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import warnings

try:
    from . import harness as h
except ImportError:
    import harness as h

# tests/certs.py sits one directory up from the black-box files.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from certs import make_certs  # noqa: E402

GENEROUS = 30.0  # an upper bound no loaded machine reaches
SHORT = 15.0     # "closed quickly": far below the 60 s header_timeout of those tests
RELOADED = "SIGHUP: listen_tls certificate and key read again"
KEPT = "the running certificate is kept"
CLIENT_REFUSED = (ssl.SSLError, ConnectionError, http.client.HTTPException)


def der(pem_path):
    with open(pem_path, encoding="ascii") as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def cert_scope(pem_path):
    """The scope of scope: [client_cert]: the SHA-256 of the lowercase hex
    SHA-256 of the certificate's DER (one source, section 14)."""
    value = hashlib.sha256(der(pem_path)).hexdigest()
    return hashlib.sha256(value.encode("ascii")).hexdigest()


def client_ctx(ca, cert=None, key=None, check_hostname=True, max_version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    ctx.check_hostname = check_hostname
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


class TLSConnection(http.client.HTTPConnection):
    """HTTP/1.1 over TLS to 127.0.0.1:port, checking the name server_hostname
    (so a test chooses the name apart from the address)."""

    def __init__(self, port, ctx, server_hostname="localhost", timeout=GENEROUS):
        super().__init__(h.HOST, port, timeout=timeout)
        self._ctx = ctx
        self._name = server_hostname

    def connect(self):
        super().connect()
        self.sock = self._ctx.wrap_socket(self.sock, server_hostname=self._name)

    def peer_der(self):
        return self.sock.getpeercert(binary_form=True)


def tls_request(port, ctx, method="POST", path="/pay", body=b'{"amount": 100}', key=None,
                headers=None, server_hostname="localhost", conn=None):
    """One request over TLS (on a new connection, or on conn): (Response, the
    server certificate's DER)."""
    own = conn is None
    if own:
        conn = TLSConnection(port, ctx, server_hostname)
    try:
        r = h.request(port, method, path, body=body, headers=headers, key=key, conn=conn,
                      timeout=GENEROUS)
        return r, conn.peer_der()
    finally:
        if own:
            conn.close()


def client_hello(ctx, server_hostname="localhost"):
    """The bytes of a ClientHello ctx would send (made in memory, sent nowhere)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def wait_closed(s, timeout):
    """Read (and drop) until the peer closes s: True, or False at timeout."""
    return h.read_until_closed(s, timeout)[1]


def connect(port):
    return h.connect(port, GENEROUS)


class TLSCase(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.certs = make_certs(os.path.join(self.tmp, "certs"))

    def start_tls(self, config=None, cert="server", client_ca=False, up=None):
        """An upstream (or up) and an idemd with listen_tls serving cert: a
        name of make_certs ("server", "expired", ...) or the path of a
        X.pem whose key is X.key beside it.  client_ca: ask for client
        certificates by the test CA.  self.tls_port is the TLS port."""
        if up is None:
            up = self.start_upstream()
        self.tls_port = h.free_port()
        lt = {"address": "%s:%d" % (h.HOST, self.tls_port),
              "cert_file": self.certs[cert] if cert in self.certs else cert,
              "key_file": self.certs[cert + "_key"] if cert in self.certs else cert[:-4] + ".key"}
        if client_ca:
            lt["client_ca_file"] = self.certs["ca"]
        cfg = dict(config or {})
        cfg["listen_tls"] = lt
        d = self.start_idemd(up, cfg)
        return up, d

    def ctx(self, client=None, **kw):
        """A client context trusting the test CA, with client's certificate."""
        if client is None:
            return client_ctx(self.certs["ca"], **kw)
        return client_ctx(self.certs["ca"], self.certs[client], self.certs[client + "_key"],
                          **kw)

    def handshake_refused(self, ctx):
        """A handshake with ctx on a new connection to the TLS port, which
        must fail: the text of its SSLError, lowercase."""
        s = connect(self.tls_port)
        try:
            with self.assertRaises(ssl.SSLError) as cm:
                ctx.wrap_socket(s, server_hostname="localhost")
        finally:
            s.close()
        return str(cm.exception).lower()

    def assertServed(self, d, ctx=None, path="/pay"):
        r, _ = tls_request(self.tls_port, ctx or self.ctx(), "GET", path, body=None)
        self.assertEqual(r.status, 200, "a normal TLS client: %r" % r)
        return r


# --------------------------------------------------------------------------
# a TLS client replays like a plain one


class Replay(TLSCase):
    def test_a_keyed_post_over_tls_executes_once_and_replays(self):
        up, d = self.start_tls()
        key = h.new_key()
        auth = {"Authorization": "Bearer tls-caller"}
        first, peer = tls_request(self.tls_port, self.ctx(), key=key, headers=auth)
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        self.assertEqual(peer, der(self.certs["server"]))
        again, _ = tls_request(self.tls_port, self.ctx(), key=key, headers=auth)
        self.assertReplayOf(again, first)
        # The default scope is Authorization: the plain listener is the same
        # caller, so the same key replays there too.
        plain = h.request(d.port, "POST", "/pay", body=b'{"amount": 100}', key=key, headers=auth)
        self.assertReplayOf(plain, first)
        self.assertEqual(up.count(key=key), 1)
        # and the other way round: a key executed on the plain listener
        # replays over TLS
        key2 = h.new_key()
        p1 = h.request(d.port, "POST", "/pay", body=b'{"amount": 100}', key=key2, headers=auth)
        self.assertEqual(p1.status, 200, p1)
        t2, _ = tls_request(self.tls_port, self.ctx(), key=key2, headers=auth)
        self.assertReplayOf(t2, p1)
        self.assertEqual(up.count(key=key2), 1)

    def test_tls_1_2_and_1_3_clients_are_both_served(self):
        up, d = self.start_tls()
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx = self.ctx()
            ctx.minimum_version = version
            ctx.maximum_version = version
            conn = TLSConnection(self.tls_port, ctx)
            try:
                r, _ = tls_request(self.tls_port, ctx, key=h.new_key(), conn=conn)
                self.assertEqual(r.status, 200, r)
                self.assertEqual(conn.sock.version(), version.name.replace("_", "."))
            finally:
                conn.close()

    def test_client_cert_scope_a_plain_request_falls_back(self):
        up, d = self.start_tls({"scope": ["client_cert"]}, client_ca=True)
        key = h.new_key()
        ctx = self.ctx("client_a")
        first, _ = tls_request(self.tls_port, ctx, key=key)
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        again, _ = tls_request(self.tls_port, ctx, key=key)
        self.assertReplayOf(again, first)
        # the record is under the certificate's scope, as section 14 says
        rec = d.get_key(key, cert_scope(self.certs["client_a"]))
        self.assertEqual(rec.status, 200, "no record under client_a's scope: %r" % rec)
        # the plain listener has no certificate: the scope falls back, the
        # key executes anew there and never returns client_a's answer
        plain = h.request(d.port, "POST", "/pay", body=b'{"amount": 100}', key=key)
        self.assertEqual(plain.status, 200, plain)
        self.assertNotReplay(plain)
        self.assertNotEqual(plain.body, first.body)
        self.assertEqual(up.count(key=key), 2)


# --------------------------------------------------------------------------
# certificates refused, on either side


class Refusals(TLSCase):
    def assertClientVerifyFails(self, ctx, words, server_hostname="localhost"):
        with self.assertRaises(ssl.SSLCertVerificationError) as cm:
            tls_request(self.tls_port, ctx, key=h.new_key(), server_hostname=server_hostname)
        text = "%s %s" % (cm.exception.verify_message, cm.exception)
        self.assertIn(words.lower(), text.lower())
        return cm.exception

    def test_a_client_that_trusts_another_ca_refuses_the_server(self):
        up, d = self.start_tls()
        self.assertClientVerifyFails(client_ctx(self.certs["other_ca"]),
                                     "certificate verify failed")
        self.assertServed(d)
        self.assertEqual(up.count(path="/pay"), 1)  # only assertServed's GET

    def test_an_expired_server_certificate_is_refused_by_the_client(self):
        up, d = self.start_tls(cert="expired")
        self.assertClientVerifyFails(self.ctx(), "expired")
        self.assertEqual(up.count(), 0)

    def test_a_certificate_for_another_name_is_refused_by_the_client(self):
        up, d = self.start_tls(cert="wrong_name")
        self.assertClientVerifyFails(self.ctx(), "hostname mismatch")
        self.assertEqual(up.count(), 0)
        # the certificate itself verifies: only the name was wrong
        r, _ = tls_request(self.tls_port, self.ctx(), "GET", "/named", body=None,
                           server_hostname="other.invalid")
        self.assertEqual(r.status, 200, r)

    def assertIdemdRefuses(self, ctx):
        """ctx's client sends a keyed POST; idemd refuses the handshake (an
        alert, or the connection closed) and never forwards it."""
        key = h.new_key()
        with self.assertRaises(CLIENT_REFUSED):
            tls_request(self.tls_port, ctx, key=key)
        return key

    def test_client_certificates_by_another_ca_or_none_are_refused(self):
        up, d = self.start_tls({"scope": ["client_cert"]}, client_ca=True)
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            with self.subTest(version=version.name):
                self.assertIdemdRefuses(self.ctx("client_other", max_version=version))
                self.assertIdemdRefuses(self.ctx(None, max_version=version))
        # TLS 1.2: the refusal is in the handshake itself, as an alert
        ctx = self.ctx("client_other", max_version=ssl.TLSVersion.TLSv1_2)
        self.assertIn("unknown ca", self.handshake_refused(ctx))
        self.assertEqual(up.count(), 0, "a refused client reached the upstream")
        # a client with a certificate by the CA is served
        r, _ = tls_request(self.tls_port, self.ctx("client_a"), key=h.new_key())
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(), 1)


# --------------------------------------------------------------------------
# two client certificates, two scopes


class ClientCertScopes(TLSCase):
    def test_two_client_certificates_are_two_scopes(self):
        up, d = self.start_tls({"scope": ["client_cert"]}, client_ca=True)
        a, b = self.ctx("client_a"), self.ctx("client_b")
        key = h.new_key()
        ra, _ = tls_request(self.tls_port, a, key=key)
        self.assertEqual(ra.status, 200, ra)
        self.assertNotReplay(ra)
        rb, _ = tls_request(self.tls_port, b, key=key)
        self.assertEqual(rb.status, 200, rb)
        self.assertNotReplay(rb)
        self.assertNotEqual(rb.body, ra.body, "B was given A's answer")
        self.assertEqual(up.count(key=key), 2, "the same key from B did not execute again")
        ra2, _ = tls_request(self.tls_port, a, key=key)
        self.assertReplayOf(ra2, ra)
        rb2, _ = tls_request(self.tls_port, b, key=key)
        self.assertReplayOf(rb2, rb)
        self.assertEqual(up.count(key=key), 2)
        self.assertEqual(d.get_key(key, cert_scope(self.certs["client_a"])).status, 200)
        self.assertEqual(d.get_key(key, cert_scope(self.certs["client_b"])).status, 200)


# --------------------------------------------------------------------------
# SIGHUP: the certificate replaced under load


class Reload(TLSCase):
    THREADS = 3
    MAX_PER_THREAD = 400  # a bound; the threads stop long before it

    def log_count(self, d, text):
        return d.log_text().count(text)

    def test_certificate_replaced_and_sighuped_under_load(self):
        live_cert = os.path.join(self.tmp, "live.pem")
        live_key = os.path.join(self.tmp, "live.key")
        shutil.copyfile(self.certs["server"], live_cert)
        shutil.copyfile(self.certs["server_key"], live_key)
        up, d = self.start_tls(cert=live_cert)
        old, new = der(self.certs["server"]), der(self.certs["server2"])
        self.assertNotEqual(old, new)

        # a keep-alive connection opened before the reload
        kept = TLSConnection(self.tls_port, self.ctx())
        self.addCleanup(kept.close)
        r, peer = tls_request(self.tls_port, None, key=h.new_key(), conn=kept)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(peer, old)

        lock = threading.Lock()
        results, errors = [], []
        stop = threading.Event()

        def load():
            ctx = self.ctx()
            for _ in range(self.MAX_PER_THREAD):
                if stop.is_set():
                    return
                key = h.new_key("load")
                try:
                    resp, peer_der = tls_request(self.tls_port, ctx, key=key)
                except Exception as e:  # noqa: B902 - every failure is a verdict
                    with lock:
                        errors.append("%s: %r" % (key, e))
                    continue
                with lock:
                    results.append((key, resp, peer_der))

        def n_results(pred=lambda x: True):
            with lock:
                return sum(1 for x in results if pred(x))

        threads = [threading.Thread(target=load, daemon=True) for _ in range(self.THREADS)]
        for t in threads:
            t.start()
        try:
            h.wait_until(lambda: n_results() >= 2 * self.THREADS, GENEROUS,
                         what="the load to be under way")
            # swap both files (each by an atomic rename), then SIGHUP
            for src, dst in ((self.certs["server2"], live_cert),
                             (self.certs["server2_key"], live_key)):
                shutil.copyfile(src, dst + ".new")
                os.replace(dst + ".new", dst)
            d.send_signal(signal.SIGHUP)
            h.wait_until(lambda: self.log_count(d, RELOADED) >= 1, GENEROUS,
                         what="idemd to log the reload")
            # the load's new connections get the new certificate
            h.wait_until(lambda: n_results(lambda x: x[2] == new) >= self.THREADS, GENEROUS,
                         what="the load's connections to see the new certificate")
            before = n_results()
            h.wait_until(lambda: n_results() >= before + self.THREADS, GENEROUS,
                         what="more requests after the reload")
        finally:
            stop.set()
            for t in threads:
                t.join(GENEROUS)
        self.assertFalse(any(t.is_alive() for t in threads), "a load thread hangs")
        self.assertEqual(errors, [], "requests failed across the reload")
        for key, resp, peer_der in results:
            self.assertEqual(resp.status, 200, "%s: %r" % (key, resp))
            self.assertNotReplay(resp)
            self.assertIn(peer_der, (old, new))
        self.assertEqual(up.count(), len(results) + 1, "an execution too many or too few")

        # a new connection sees the new certificate
        r, peer = tls_request(self.tls_port, self.ctx(), key=h.new_key())
        self.assertEqual(r.status, 200, r)
        self.assertEqual(peer, new)
        # the keep-alive connection made before still works, on the old one
        r, peer = tls_request(self.tls_port, None, key=h.new_key(), conn=kept)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(peer, old)

        # a cert_file that does not load: logged, the last good one kept
        with open(live_cert + ".new", "wb") as f:
            f.write(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
                    b"-----END CERTIFICATE-----\n" + os.urandom(200))
        os.replace(live_cert + ".new", live_cert)
        d.send_signal(signal.SIGHUP)
        h.wait_until(lambda: self.log_count(d, KEPT) >= 1, GENEROUS,
                     what="idemd to log the certificate it could not load")
        self.assertEqual(self.log_count(d, RELOADED), 1, "a bad file was reported as loaded")
        line = [x for x in d.log_text().splitlines() if KEPT in x][0]
        self.assertIn("error", line)
        self.assertIn(live_cert, line)
        r, peer = tls_request(self.tls_port, self.ctx(), key=h.new_key())
        self.assertEqual(r.status, 200, r)
        self.assertEqual(peer, new, "a bad file replaced the running certificate")
        r, peer = tls_request(self.tls_port, None, key=h.new_key(), conn=kept)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(d.running())


# --------------------------------------------------------------------------
# garbage, half handshakes, old versions, renegotiation


class Hostile(TLSCase):
    def test_garbage_is_closed_at_once(self):
        up, d = self.start_tls({"header_timeout": "60s"})
        # Random bytes, but not a TLS record header (content types 20-24)
        # nor an SSLv2-style hello (high bit): those would make OpenSSL wait
        # for the rest of a record, and only header_timeout would end it.
        garbage = bytes([0x42]) + os.urandom(1023)
        _, closed = h.send_then_read_until_closed(connect(self.tls_port), garbage, SHORT)
        self.assertTrue(closed, "1 KiB of garbage (%s...) kept the "
                        "connection open" % garbage[:16].hex())
        # plain HTTP on the TLS port is garbage too
        plain = b"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        _, closed = h.send_then_read_until_closed(connect(self.tls_port), plain, SHORT)
        self.assertTrue(closed, "plain HTTP on the TLS port kept open")
        self.assertServed(d)
        self.assertEqual(up.count(), 1)

    def assert_closed_at_header_timeout(self, data, what):
        """Send data on a new connection to the TLS port of an idemd with a
        header_timeout of 2 s: idemd must close it, and not before then."""
        t0 = time.monotonic()  # before the connect: idemd's timer starts later
        s = connect(self.tls_port)
        try:
            s.sendall(data)
            self.assertTrue(wait_closed(s, GENEROUS), "%s was never closed" % what)
            elapsed = time.monotonic() - t0
        finally:
            s.close()
        self.assertGreaterEqual(elapsed, 1.5, "closed before header_timeout")

    def test_a_partial_client_hello_is_closed_at_header_timeout(self):
        up, d = self.start_tls({"header_timeout": "2s"})
        hello = client_hello(self.ctx())
        self.assertGreater(len(hello), 40)
        self.assert_closed_at_header_timeout(hello[:len(hello) // 2], "a half ClientHello")
        # a whole ClientHello, the server's answer read, then nothing: the
        # handshake never ends, and header_timeout ends it too
        self.assert_closed_at_header_timeout(
            client_hello(self.ctx(max_version=ssl.TLSVersion.TLSv1_2)), "a stalled handshake")
        # a ClientHello trickled a byte at a time: header_timeout runs from
        # the accept and no byte restarts it (at this pace the hello would
        # take about 100 s, far beyond the bound)
        t0 = time.monotonic()
        s = connect(self.tls_port)
        closed = threading.Event()

        def trickle():
            for b in hello:
                if closed.wait(0.2):
                    return
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    return
        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            self.assertTrue(wait_closed(s, GENEROUS), "a trickled ClientHello was never closed")
            elapsed = time.monotonic() - t0
        finally:
            closed.set()
            sender.join(GENEROUS)
            s.close()
        self.assertGreaterEqual(elapsed, 1.5, "closed before header_timeout")
        self.assertServed(d)

    def test_a_head_that_stops_after_the_handshake_gets_408_over_tls(self):
        up, d = self.start_tls({"header_timeout": "2s"})
        t = self.ctx().wrap_socket(connect(self.tls_port), server_hostname="localhost")
        try:
            t.sendall(b"POST /pay HTTP/1.1\r\nHost: x\r\n")
            data = b""
            t.settimeout(GENEROUS)
            while True:
                try:
                    chunk = t.recv(65536)
                except (ssl.SSLError, ConnectionError):
                    break
                if not chunk:
                    break
                data += chunk
        finally:
            t.close()
        rs = h.parse_responses(data)
        self.assertEqual(len(rs), 1, "no answer over TLS: %r" % data)
        self.assertProblem(rs[0], 408, "request-timeout")
        self.assertEqual(up.count(), 0)

    def test_alpn_offers_http_1_1_only(self):
        up, d = self.start_tls()
        ctx = self.ctx()
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        conn = TLSConnection(self.tls_port, ctx)
        try:
            r, _ = tls_request(self.tls_port, ctx, "GET", "/alpn", body=None, conn=conn)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(conn.sock.selected_alpn_protocol(), "http/1.1")
        finally:
            conn.close()
        ctx = self.ctx()
        ctx.set_alpn_protocols(["h2"])
        self.assertIn("no application protocol", self.handshake_refused(ctx))
        self.assertEqual(up.count(), 1)

    def test_fifty_half_handshakes_do_not_stop_a_normal_client(self):
        up, d = self.start_tls({"header_timeout": "60s"})
        hello = client_hello(self.ctx())
        held = []
        self.addCleanup(lambda: [s.close() for s in held])
        for _ in range(50):
            s = connect(self.tls_port)
            s.sendall(hello[:len(hello) // 2])
            held.append(s)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_connections") >= 50, GENEROUS,
                     what="idemd to hold the 50 half handshakes")
        key = h.new_key()
        r, _ = tls_request(self.tls_port, self.ctx(), key=key)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(h.request(d.port, "GET", "/plain").status, 200)
        self.assertEqual(up.count(key=key), 1)
        # they are still held (header_timeout is 60 s): the client was
        # served beside them, not after them
        self.assertGreaterEqual(h.metric_sum(d.metrics(), "idem_connections"), 50)

    def test_a_tls_1_1_client_is_refused(self):
        up, d = self.start_tls()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx = self.ctx()
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        # OpenSSL 3's default security level would refuse TLS 1.1 in the
        # client itself, before anything is sent; level 0 lets it ask.
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        self.assertIn("protocol version", self.handshake_refused(ctx))
        self.assertServed(d)

    def test_renegotiation_is_refused(self):
        if shutil.which("openssl") is None:
            self.skipTest("no openssl command")
        up, d = self.start_tls()
        p = subprocess.Popen(["openssl", "s_client", "-connect", "%s:%d" % (h.HOST, self.tls_port),
                              "-tls1_2", "-CAfile", self.certs["ca"], "-servername", "localhost"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)

        def end():
            if p.poll() is None:
                p.kill()
            p.wait()
            try:
                p.stdin.close()
            except OSError:
                pass
            p.stdout.close()
        self.addCleanup(end)
        lines, got = [], threading.Event()

        def reader():
            for raw in p.stdout:
                lines.append(raw.decode("utf-8", "replace"))
                if "Verify return code:" in lines[-1]:
                    got.set()
            got.set()
        threading.Thread(target=reader, daemon=True).start()
        self.assertTrue(got.wait(GENEROUS), "s_client did not finish its handshake")
        self.assertIn("Verify return code: 0", "".join(lines))
        self.assertIsNone(p.poll(), "s_client ended after the handshake:\n" + "".join(lines))
        p.stdin.write(b"R\n")  # s_client: renegotiate
        p.stdin.flush()
        try:
            rc = p.wait(GENEROUS)
        except subprocess.TimeoutExpired:
            rc = None
        out = "".join(lines)
        self.assertIn("RENEGOTIATING", out)
        self.assertIsNotNone(rc, "a renegotiation attempt was neither refused nor closed:\n" + out)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("no renegotiation", out.lower())
        # no harm to anyone else
        self.assertTrue(d.running())
        self.assertServed(d)


# --------------------------------------------------------------------------
# max_connections counts TLS connections


class MaxConnections(TLSCase):
    def test_half_handshakes_count_in_max_connections(self):
        up, d = self.start_tls({"max_connections": 5, "header_timeout": "60s",
                                "idle_timeout": "60s"})
        hello = client_hello(self.ctx())
        held = []
        try:
            for _ in range(5):
                s = connect(self.tls_port)
                s.sendall(hello[:len(hello) // 2])
                held.append(s)
            h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_connections") >= 5, GENEROUS,
                         what="idemd to hold the 5 half handshakes")
            # a 6th plain connection is refused
            _, closed = h.send_then_read_until_closed(
                connect(d.port), b"GET /sixth HTTP/1.1\r\nHost: x\r\n\r\n", GENEROUS)
            self.assertTrue(closed, "a 6th plain connection was kept")
            # a 6th TLS connection is refused
            with self.assertRaises(CLIENT_REFUSED + (OSError,)):
                tls_request(self.tls_port, self.ctx(), "GET", "/sixth-tls", body=None)
            self.assertEqual(up.count(), 0)
            m = d.metrics()
            self.assertGreaterEqual(h.metric_sum(m, "idem_connections_refused_total",
                                                 listener="public"), 2)
        finally:
            for s in held:
                s.close()

        # their places come back
        def served():
            try:
                r, _ = tls_request(self.tls_port, self.ctx(), "GET", "/after", body=None)
                return r.status == 200
            except (OSError, ssl.SSLError, http.client.HTTPException):
                return False
        h.wait_until(served, GENEROUS, 0.1, "a TLS connection once the others closed")
